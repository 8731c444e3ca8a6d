#!/bin/sh
# Runs every test program given (build dir first), then the end-to-end
# scripts tests/e2e_*.sh, and prints one closing line "N passed, N failed"
# where N counts test programs and scripts.
dir=$1; shift
passed=0; failed=0
for t in "$@"; do
    if "$dir/$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $t"; fi
done
for s in tests/e2e_*.sh; do
    [ -f "$s" ] || continue
    if KVPIN="$dir/kvpin" sh "$s"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $s"; fi
done
echo "all: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
