#!/bin/sh
# End-to-end tests of `kvpin run --prompt-cache` and `kvpin doctor`, run
# from the repository root with the binary in $KVPIN (default ./kvpin).
# Expected values are computed here independently: token counts and common
# prefixes from `kvpin tokenize` and the answers of each turn run alone;
# byte offsets from the prompt texts themselves.
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_cache: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}
M=models/stories260K.gguf
N=12
RUN="$KVPIN run -m $M --temp 0 -n $N --kv-type f32 -t 1"

# ---- a 4-turn agent loop: turns 2 and 3 extend the previous prompt + answer,
# turn 4 is turn 1 with the date of the system prompt changed.
printf 'System: today is 2026-11-28.\nYou tell short stories.\nUser: Once upon a time, there was a little girl' >"$T/p1.txt"
for k in 1 2 3 4; do
    if [ $k = 4 ]; then sed 's/2026-11-28/2026-11-29/' "$T/p1.txt" >"$T/p4.txt"; fi
    $RUN -f "$T/p$k.txt" --print-tokens >"$T/a$k.txt" 2>"$T/e$k.txt" || bad "turn $k alone failed"
    sed -n 's/^tokens: //p' "$T/e$k.txt" >"$T/g$k.txt"            # generated ids
    "$KVPIN" tokenize -m $M <"$T/p$k.txt" >"$T/t$k.txt"            # prompt ids
    if [ $k -lt 3 ]; then # the next turn: this prompt + its answer + a user line
        { cat "$T/p$k.txt"; head -c -1 "$T/a$k.txt"; printf '\nUser: and then? '; } >"$T/p$((k + 1)).txt"
    fi
done
python3 - "$T" <<'EOF' || bad "writing the turns file"
import json, sys
t = sys.argv[1]
with open(t + "/turns.jsonl", "w") as f:
    for k in range(1, 5):
        f.write(json.dumps({"prompt": open("%s/p%d.txt" % (t, k)).read()}) + "\n")
EOF
$RUN --turns "$T/turns.jsonl" --prompt-cache >"$T/out.txt" 2>"$T/err.txt"
check "run --prompt-cache succeeds" test $? -eq 0
cat "$T/a1.txt" "$T/a2.txt" "$T/a3.txt" "$T/a4.txt" >"$T/alone.txt"
check "each turn's text equals the turn run alone (greedy)" cmp -s "$T/out.txt" "$T/alone.txt"

# expected reuse: the longest common token prefix with any earlier turn's
# prompt + generated tokens (every generated token is decoded and indexed);
# on a full match the last prompt position is recomputed (n - 1)
python3 - "$T" <<'EOF' >"$T/expect.txt" || bad "computing the expected reuse"
import sys
t = sys.argv[1]
ids = lambda p: [int(x) for x in open(p).read().split()]
cached = []
for k in range(1, 5):
    p = ids("%s/t%d.txt" % (t, k))
    best = 0
    for c in cached:
        l = 0
        while l < len(p) and l < len(c) and p[l] == c[l]:
            l += 1
        best = max(best, l)
    reuse = len(p) - 1 if best == len(p) else best
    print(k, len(p), reuse, len(p) - reuse, best)
    cached.append(p + ids("%s/g%d.txt" % (t, k)))
EOF
while read -r k n reuse comp div; do
    check "turn $k: $n prompt tokens, $reuse reused, $comp computed" \
        grep -q "^turn $k: $n prompt tokens, $reuse reused, $comp computed, time to first token" "$T/err.txt"
    check "turn $k: diverged at token $div" grep -q "diverged at token $div of $n" "$T/err.txt"
    if [ "$k" = 2 ] || [ "$k" = 3 ]; then check "turn $k reuses the previous turn" test "$reuse" -gt 0; fi
done <"$T/expect.txt"
check "four turn lines" test "$(grep -c '^turn [1-4]: ' "$T/err.txt")" -eq 4
# turn 4: the date changed; the byte is where 2026-11-28 and 2026-11-29 first differ
byte=$(python3 -c "
import os, sys
a, b = open(sys.argv[1]).read(), open(sys.argv[2]).read()
d = a.index('2026-11-28')
print(len(os.path.commonprefix([a, b])), d)" "$T/p1.txt" "$T/p4.txt")
set -- $byte
check "turn 4 diverges inside the date" test "$1" -ge "$2" -a "$1" -lt $(($2 + 10))
check "turn 4: cause timestamp at byte $1" grep -q "^  cache: diverged at token [0-9]* of [0-9]*, byte $1 (line 1): timestamp: '2026-11-28' -> '2026-11-29'" "$T/err.txt"
check "turn 4: snippets shown" grep -q "^    cached : .*2026-11-28" "$T/err.txt"
check "turn 4: advice" grep -q "^    advice : turn 4 re-prefills .*timestamp" "$T/err.txt"
check "turn 1: cold" grep -q "byte 0 (line 1): cold" "$T/err.txt"
check "memory bill" grep -q "^prefix cache: .* tokens cached in .* budget" "$T/err.txt"

# the same turns without the cache: same text, nothing reused
$RUN --turns "$T/turns.jsonl" --no-prefix-cache >"$T/out2.txt" 2>"$T/err2.txt"
check "--no-prefix-cache: same text" cmp -s "$T/out2.txt" "$T/alone.txt"
check "--no-prefix-cache: nothing reused" test "$(grep -c ' 0 reused,' "$T/err2.txt")" -eq 4
# -f several times is the same as --turns. A tiny budget forces eviction:
# the blocks of the longest turn alone (F32 KV: 1280 bytes per position,
# blocks of 16) run every turn, evicting, with the same text; one block less
# cannot hold that turn and fails with a clear message.
nmax=$(cat "$T/t1.txt" "$T/t2.txt" "$T/t3.txt" "$T/t4.txt" | awk '{ if (NF > m) m = NF } END { print m }')
blocks=$(( (nmax + N + 15) / 16 ))
$RUN -f "$T/p1.txt" -f "$T/p2.txt" -f "$T/p3.txt" -f "$T/p4.txt" --kv-budget $((blocks * 16 * 1280)) \
    --kv-block 16 >"$T/out3.txt" 2>"$T/err3.txt"
check "a budget of $blocks blocks runs every turn" test $? -eq 0
check "-f x4 with a tiny budget: same text" cmp -s "$T/out3.txt" "$T/alone.txt"
check "tiny budget evicts" grep -q "evicted cached prefixes" "$T/err3.txt"
$RUN -f "$T/p1.txt" -f "$T/p2.txt" -f "$T/p3.txt" -f "$T/p4.txt" --kv-budget $(((blocks - 1) * 16 * 1280)) \
    >/dev/null 2>"$T/err3.txt"
check "one block less: exit 1" test $? -eq 1
check "one block less: a clear message" grep -q "KV budget full: .*raise --kv-budget" "$T/err3.txt"
$RUN --prompt-cache -p "Once upon a time" -p "Once upon a time" >/dev/null 2>"$T/err4.txt"
n=$(printf 'Once upon a time' | "$KVPIN" tokenize -m $M | wc -w)
check "identical prompt reuses n - 1" grep -q "^turn 2: $n prompt tokens, $((n - 1)) reused, 1 computed" "$T/err4.txt"

# --stop: each turn's answer ends where the same turn run alone with --stop ends
$RUN --prompt-cache -n 60 -p "Once upon a time" -p "The cat" --stop "Lily." --stop "park" >"$T/out5.txt" 2>"$T/err5.txt"
check "--prompt-cache --stop succeeds" test $? -eq 0
$RUN -n 60 -p "Once upon a time" --stop "Lily." --stop "park" >"$T/s1.txt" 2>/dev/null
$RUN -n 60 -p "The cat" --stop "Lily." --stop "park" >"$T/s2.txt" 2>/dev/null
cat "$T/s1.txt" "$T/s2.txt" >"$T/s12.txt"
check "--prompt-cache --stop: each turn as run alone" cmp -s "$T/out5.txt" "$T/s12.txt"
check "--prompt-cache --stop: no stop text shown" sh -c "! grep -q -e 'Lily\.' -e park '$T/out5.txt'"
check "--prompt-cache --stop: stop reason" grep -q "^turn 1: .*(stopped by stop string)" "$T/err5.txt"

# ---- kvpin doctor --json: field names and values
"$KVPIN" doctor -m $M "$T/turns.jsonl" --json >"$T/doc.json" 2>"$T/doc.err"
check "doctor --json succeeds" test $? -eq 0
check "doctor --json fields and values" python3 - "$T" <<'EOF'
import json, os, sys
t = sys.argv[1]
ids = lambda p: [int(x) for x in open(p).read().split()]
rows = [json.loads(l) for l in open(t + "/doc.json")]
assert len(rows) == 4, rows
names = ["turn", "prompt_tokens", "reusable_tokens", "diverged_at_token", "diverged_at_byte",
         "cause", "cached_snippet", "request_snippet", "advice"]
prompts = [ids("%s/t%d.txt" % (t, k)) for k in range(1, 5)]
texts = [open("%s/p%d.txt" % (t, k)).read() for k in range(1, 5)]
for k, r in enumerate(rows):
    assert sorted(r) == sorted(names), r
    assert r["turn"] == k + 1
    p = prompts[k]
    assert r["prompt_tokens"] == len(p), (r, len(p))
    best = 0
    for q in prompts[:k]:
        l = 0
        while l < len(p) and l < len(q) and p[l] == q[l]:
            l += 1
        best = max(best, l)
    assert r["reusable_tokens"] == best and r["diverged_at_token"] == best, (r, best)
    assert isinstance(r["advice"], str) and r["advice"].startswith("turn %d " % (k + 1)), r
assert rows[0]["cause"] == "cold" and rows[0]["diverged_at_byte"] == 0
assert rows[1]["cause"] == "hit" and rows[2]["cause"] == "hit", rows
# turns 2 and 3 extend the earlier prompt: the text divergence is its end
assert rows[1]["diverged_at_byte"] == len(texts[0].encode()), rows[1]
d = len(os.path.commonprefix([texts[0], texts[3]]))
assert rows[3]["cause"] == "timestamp" and rows[3]["diverged_at_byte"] == d, rows[3]
assert "2026-11-28" in rows[3]["cached_snippet"] and "2026-11-29" in rows[3]["request_snippet"], rows[3]
assert "\n" in rows[3]["cached_snippet"] or len(rows[3]["cached_snippet"]) < 60
assert "timestamp" in rows[3]["advice"] and "line 1" in rows[3]["advice"], rows[3]
EOF
"$KVPIN" doctor tests/data/turns/timestamp.jsonl >"$T/doc.txt" 2>&1
check "doctor (bundled vocabulary) succeeds" test $? -eq 0
check "doctor: summary with the timestamp advice" \
    grep -q "^summary: 3 turns, .*worst: turn 3: turn 3 re-prefills .*timestamp" "$T/doc.txt"
check "doctor: timestamp at byte 26" grep -q "^turn 3: .* byte 26 (line 1): timestamp: '2026-11-28 09:14' -> '2026-11-29 10:02'" "$T/doc.txt"

# ---- malformed input: exit code 1, the file and line named
"$KVPIN" doctor tests/data/turns/bad_json.jsonl >/dev/null 2>"$T/e.txt"
check "bad JSON: exit 1" test $? -eq 1
check "bad JSON: line 2 named" grep -q "bad_json.jsonl:2: invalid JSON" "$T/e.txt"
"$KVPIN" doctor tests/data/turns/no_prompt.jsonl >/dev/null 2>"$T/e.txt"
check "missing prompt: exit 1" test $? -eq 1
check "missing prompt: line 3 named" grep -q 'no_prompt.jsonl:3: missing "prompt" string' "$T/e.txt"
"$KVPIN" doctor tests/data/turns/not_object.jsonl >/dev/null 2>"$T/e.txt"
check "not an object: exit 1" test $? -eq 1
check "not an object: line 2 named" grep -q "not_object.jsonl:2: expected a JSON object" "$T/e.txt"
$RUN --turns tests/data/turns/bad_json.jsonl >/dev/null 2>"$T/e.txt"
check "run --turns with bad JSON: exit 1 and line" sh -c "[ $? -eq 1 ] && grep -q 'bad_json.jsonl:2: invalid JSON' '$T/e.txt'"
"$KVPIN" doctor >/dev/null 2>&1
check "doctor without FILE: usage error 2" test $? -eq 2
"$KVPIN" doctor "$T/missing.jsonl" >/dev/null 2>&1
check "doctor on a missing file: exit 1" test $? -eq 1

echo "e2e_cache: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
