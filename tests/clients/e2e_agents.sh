#!/bin/sh
# End-to-end tests of the real coding agents against `kvpin serve`: Claude
# Code (@anthropic-ai/claude-code), Codex (@openai/codex) and opencode
# (opencode-ai), pinned in
# tests/clients/package-lock.json and installed with it on first use (needs
# Node 20 and the npm registry; without them this test fails, it never
# passes silently). tests/clients/agents.py makes the model, runs each
# agent's sessions through a timing relay and checks the answers, the first
# bytes and the reuse; $KVPIN names the binary.
SUITE=e2e_agents
. tests/clients/node_lib.sh
node_deps "coding agent"
KVPIN="$KVPIN" python3 tests/clients/agents.py
