#!/bin/sh
# End-to-end test of the disk tier of `kvpin serve`: restart after SIGKILL
# (>= 99% of the next turn from disk, the cold run's answer), another KV
# type or model on the same directory (nothing reused, the reason at
# start), corrupted records (truncated, flipped K/V byte, other tokens:
# each refused under its reason, the answer unchanged) and a budget below
# one record. The driver is tests/tiers_e2e.py; $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/tiers_e2e.py
