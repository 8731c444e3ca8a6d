#!/bin/sh
# End-to-end tests of `kvpin serve` through the agent frameworks: the Vercel
# AI SDK (ai + @ai-sdk/openai-compatible) and LangChain JS (@langchain/openai)
# with zod schemas, every structured output validated by ajv against the
# JSON Schema the framework sent (tests/clients/frameworks.test.mjs, run with
# `node --test`), from the repository root with the binary in $KVPIN
# (default ./kvpin).
#
# One server on a free port: the bundled model as a new user starts it
# (its default chat template, chatml), with an API key. The packages are
# installed into tests/clients/node_modules from tests/clients/package-lock.json
# on first use, or when what is installed differs from the lock (needs
# Node 20 and the npm registry); without them this test fails, it never
# passes silently. After the tests, the server must exit 0 on SIGTERM with
# nothing from the sanitizers in its stderr.
SUITE=e2e_frameworks
SERVE_ARGS=""
. tests/clients/node_lib.sh
KEY=sekret
CTX=2048
node_deps "agent framework"

start main --api-key "$KEY" --ctx $CTX || give_up "the server did not start"

KVPIN_URL=$(cat "$T/main.url") KVPIN_API_KEY=$KEY KVPIN_MODEL_ID=$(basename $M) AI_SDK_LOG_WARNINGS=false
export KVPIN_URL KVPIN_API_KEY KVPIN_MODEL_ID AI_SDK_LOG_WARNINGS
run_node 300 tests/clients/frameworks.test.mjs

stop main
PIDS=""
finish
