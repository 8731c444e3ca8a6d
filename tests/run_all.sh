#!/bin/sh
# Runs every test of `make test`, one kind after the other, from the
# repository root (tests/README.md has the layout):
#   1. the unit test programs given: the build dir first, then their names
#      (tests/unit/test_NAME.c is built as DIR/test_NAME);
#   2. the Python end-to-end tests, tests/e2e/*_e2e.py (the other .py files
#      there are their shared helper, kvpin_test.py, or driven by a shell
#      test);
#   3. the shell end-to-end tests, tests/shell/e2e_*.sh;
#   4. the client suites, tests/clients/e2e_*.sh (the Node.js clients).
# The end-to-end tests get KVPIN=DIR/kvpin. A failing test prints
# "FAILED: NAME"; the closing line "all: N passed, M failed" counts tests
# (and names the suites that skipped parts this CPU cannot run: SKIP lines),
# and the exit status is 0 only when every one passed.
dir=$1; shift
passed=0; failed=0; skipped=""
result() { # result NAME STATUS
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $1"; fi
}
out=$(mktemp)
for t in "$@"; do
    "$dir/$t" >"$out"; st=$?
    cat "$out"
    # parts a suite could not run on this CPU (harness.h SKIP): named in the closing line
    grep -q '^SKIP: ' "$out" && skipped="$skipped $t"
    result "$t" $st
done
rm -f "$out"
KVPIN="$dir/kvpin"; export KVPIN
for t in tests/e2e/*_e2e.py; do
    [ -f "$t" ] || continue
    python3 "$t"; result "$t" $?
done
for t in tests/shell/e2e_*.sh tests/clients/e2e_*.sh; do
    [ -f "$t" ] || continue
    sh "$t"; result "$t" $?
done
if [ -n "$skipped" ]; then
    echo "all: $passed passed, $failed failed; parts skipped on this CPU (SKIP lines above) in:$skipped"
else
    echo "all: $passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
