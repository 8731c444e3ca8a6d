#!/bin/sh
# End-to-end test of in-flight prefixes on `kvpin serve`: a burst of requests
# sharing a spec, sent at once, computes it once; each follower reports the
# rows it took in flight, /metrics and the dashboard's request list count
# them, answers equal those of a server without a prefix cache, no leak.
# The driver is tests/crew_e2e.py; $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/crew_e2e.py
