#!/bin/sh
# End-to-end test of the Redis tier: redis-server on a free loopback port
# (never the system one) and two `kvpin serve` replicas sharing blocks;
# Redis killed and restarted mid-run; a value cut short; a server that
# accepts and never answers. The driver is tests/fleet_e2e.py; $KVPIN names
# the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/fleet_e2e.py
