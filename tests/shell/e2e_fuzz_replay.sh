#!/bin/sh
# Replays every fuzz target's seeds and saved crashes (fuzz/seeds-NAME,
# fuzz/regress-NAME; the GGUF reader's also tests/data/gguf_regress)
# through the sanitizer build of the target without libFuzzer
# (build/asan/fuzz_NAME, fuzz/standalone.c): a crash that was fixed stays
# fixed, and every seed still runs clean.
dir=$(dirname "${KVPIN:-build/asan/kvpin}")
pass=0; fail=0
for src in fuzz/fuzz_*.c; do
    t=$(basename "$src" .c); t=${t#fuzz_}
    bin="$dir/fuzz_$t"
    if [ ! -x "$bin" ]; then fail=$((fail + 1)); echo "FAIL e2e_fuzz_replay: $bin not built"; continue; fi
    set -- "fuzz/seeds-$t"
    [ -d "fuzz/regress-$t" ] && set -- "$@" "fuzz/regress-$t"
    [ "$t" = gguf ] && set -- "$@" tests/data/gguf_regress
    if out=$("$bin" "$@" 2>&1); then
        pass=$((pass + 1))
    else
        fail=$((fail + 1)); echo "FAIL e2e_fuzz_replay: fuzz_$t"; echo "$out" | tail -20
    fi
done
echo "e2e_fuzz_replay: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
