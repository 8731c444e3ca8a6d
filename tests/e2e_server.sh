#!/bin/sh
# End-to-end tests of `kvpin serve` (a real server on 127.0.0.1, random free
# ports): hostile requests, an agent loop's cached_tokens, a timestamp miss,
# 16 concurrent streams, pins, auth and API keys, the request log, IPv6 on
# ::1, -np, a full queue, leaks, response_format json_schema from eight
# clients at once. The driver is
# tests/server_e2e.py (Python standard library, and python3-jsonschema for the
# structured-output answers); $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/server_e2e.py
