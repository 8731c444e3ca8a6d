#!/bin/sh
# End-to-end tests of `kvpin serve` through the official `openai` npm client
# (tests/clients/openai.test.mjs, run with `node --test`), from the repository
# root with the binary in $KVPIN (default ./kvpin).
#
# Two servers on free ports, both on the bundled model with F32 KV (the
# settings of the llama.cpp and llama2.c reference texts the tests compare
# against): one with the chatml template and an API key, one with the
# qwen2.5 template for tools; a third on a random-weight model with the
# 49,152-token byte-level BPE vocabulary (made with `kvpin mkmodel` from
# tests/data/vocab/ggml-vocab-starcoder.gguf) for the structured-output
# tests (tests/clients/structured.test.mjs, validated with ajv). The client is installed into
# tests/clients/node_modules on first use (needs Node 20 and the npm registry);
# without them this test fails, it never passes silently. After the client
# tests, each server must exit 0 on SIGTERM with nothing from the sanitizers
# in its stderr.
SUITE=e2e_openai
SERVE_ARGS="--kv-type f32"
. tests/clients/node_lib.sh
KEY=sekret
CTX=2048
node_deps "OpenAI client"

start main --chat-template chatml --api-key "$KEY" --ctx $CTX || give_up "the chatml server did not start"
start tools --chat-template qwen2.5 || give_up "the qwen2.5 server did not start"
"$KVPIN" mkmodel -o "$T/bpe49k.gguf" --preset tiny --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --tied \
    --type F16 --tokenizer tests/data/vocab/ggml-vocab-starcoder.gguf 2>"$T/mkmodel.err" ||
    { cat "$T/mkmodel.err"; give_up "mkmodel could not write the 49k-vocabulary model"; }
M_MAIN=$M
M=$T/bpe49k.gguf
start bpe --ctx $CTX || give_up "the 49k BPE server did not start"
M=$M_MAIN

KVPIN_URL=$(cat "$T/main.url") KVPIN_API_KEY=$KEY KVPIN_TOOLS_URL=$(cat "$T/tools.url")
KVPIN_BPE_URL=$(cat "$T/bpe.url") KVPIN_MODEL_ID=$(basename $M) KVPIN_CTX=$CTX
export KVPIN_URL KVPIN_API_KEY KVPIN_TOOLS_URL KVPIN_BPE_URL KVPIN_MODEL_ID KVPIN_CTX
run_node 600 tests/clients/openai.test.mjs tests/clients/structured.test.mjs

stop main
stop tools
stop bpe
PIDS=""
finish
