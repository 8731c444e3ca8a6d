#!/bin/sh
# End-to-end test of the cache dashboard (GET /): a real `kvpin serve` on
# 127.0.0.1, an agent loop with a timestamp miss, headless Chromium reading
# the page's DOM against /v1/cache and the responses; API keys;
# --no-dashboard. Screenshots under build/test/. The driver is
# tests/dashboard_e2e.py; $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/dashboard_e2e.py
