#!/bin/sh
# End-to-end tests of kvpin's request policy (every OpenAI field accepted,
# the ones kvpin does not act on named in x-kvpin-ignored-fields,
# --strict-api), the developer role and text parts, prompt_cache_key and
# prompt_cache_retention, return_progress, and the --queue 0, /metrics and
# pinned-conversation bugs, against a real server on loopback. The driver
# is tests/policy_e2e.py; $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/policy_e2e.py
