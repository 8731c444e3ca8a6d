#!/bin/sh
# End-to-end tests of `kvpin serve`'s agent APIs: Anthropic's Messages API
# through the official `@anthropic-ai/sdk` npm client
# (tests/clients/anthropic.test.mjs), OpenAI's Responses API through the
# official `openai` client and the parity of the three chat APIs
# (tests/clients/responses.test.mjs), run with `node --test` from the
# repository root with the binary in $KVPIN (default ./kvpin).
#
# Two servers on free ports, both on the bundled model with F32 KV and the
# chatml template: one with an API key (the client sends it as x-api-key),
# one with a short --pin-ttl-scale so that a cache_control TTL expires
# within the test ("5m" is 6 s). A third, on a random-weight model with Phi-3's
# vocabulary and Phi-3.5's template, runs the agents' tool loops
# (tests/clients/toolloop.test.mjs). The clients are installed into tests/clients/node_modules
# on first use (needs Node 20 and the npm registry); without them this test
# fails, it never passes silently. After the client tests, each server must
# exit 0 on SIGTERM with nothing from the sanitizers in its stderr.
SUITE=e2e_agent_apis
SERVE_ARGS="--kv-type f32"
. tests/clients/node_lib.sh
KEY=sekret
CTX=2048
node_deps "Anthropic and OpenAI client"

start main --chat-template chatml --api-key "$KEY" --ctx $CTX || give_up "the chatml server did not start"
start ttl --chat-template chatml --ctx $CTX --pin-ttl-scale 0.02 || give_up "the short-TTL server did not start"
start think --chat-template qwen3 --ctx $CTX || give_up "the qwen3 server did not start"
start inline --chat-template qwen3 --ctx $CTX --reasoning-format none || give_up "the inline-reasoning server did not start"
"$KVPIN" mkmodel -o "$T/phi.gguf" --preset tiny --tokenizer tests/data/vocab/ggml-vocab-phi-3.gguf 2>"$T/mkmodel.err" ||
    { cat "$T/mkmodel.err"; give_up "mkmodel could not write the Phi-3-vocabulary model"; }
M_MAIN=$M
M=$T/phi.gguf
start loop --chat-template-file tests/data/chat/templates/microsoft-Phi-3.5-mini-instruct.jinja --ctx 4096 ||
    give_up "the tool-loop server did not start"
M=$M_MAIN

KVPIN_URL=$(cat "$T/main.url") KVPIN_API_KEY=$KEY KVPIN_TTL_URL=$(cat "$T/ttl.url")
KVPIN_THINK_URL=$(cat "$T/think.url") KVPIN_INLINE_URL=$(cat "$T/inline.url") KVPIN_LOOP_URL=$(cat "$T/loop.url")
export KVPIN_URL KVPIN_API_KEY KVPIN_TTL_URL KVPIN_THINK_URL KVPIN_INLINE_URL KVPIN_LOOP_URL
run_node 600 tests/clients/anthropic.test.mjs tests/clients/responses.test.mjs tests/clients/reasoning.test.mjs \
    tests/clients/toolloop.test.mjs

stop main
stop ttl
stop think
stop inline
stop loop
PIDS=""
finish
