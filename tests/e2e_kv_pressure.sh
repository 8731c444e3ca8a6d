#!/bin/sh
# End-to-end test of `kvpin serve` under KV pressure: a 40-block budget, 8
# clients, 300 distinct requests, each fitting alone; every one completes
# with the answer a big-budget server gives (admission waits for KV,
# preemption instead of failure), no block leaks, and what can never fit
# the budget is a 400 with the numbers. The driver is tests/kv_pressure.py;
# $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/kv_pressure.py
