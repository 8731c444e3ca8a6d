#!/bin/sh
# Hostile inputs for the agent APIs (/v1/messages, /v1/messages/count_tokens,
# /v1/responses and /v1/responses/{id}): the right status and message in
# each API's error shape, the server healthy afterwards with no sequence or
# block leaked, breakpoint pins refreshed rather than piled up, a pin the
# pinned-bytes cap refuses reported, the response store within its bounds.
# The driver is tests/agent_hostile.py; $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/agent_hostile.py
