#!/bin/sh
# End-to-end tests with hostile inputs: model files whose parts disagree,
# made from the bundled model by tests/shell/gguf_edit.py (tensor data untouched),
# and hostile requests to the server (tests/e2e/hostile_server.py).
# Every command that loads such a file must refuse it with exit code 1 and a
# message naming the file and both numbers; none may crash (the sanitizer
# build aborts on any overflow, so a crash shows as another exit code).
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_hostile: $*"; }
M=models/stories260K.gguf

# expect_refusal DESCRIPTION PATTERN COMMAND...: exit code 1, PATTERN on stderr
expect_refusal() {
    d=$1; pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err" </dev/null
    rc=$?
    if [ $rc -eq 1 ] && grep -q "$pat" "$T/err"; then ok; else bad "$d (exit $rc: $(head -c 300 "$T/err"))"; fi
}

# The vocabulary cut to 100 entries while the embedding and output keep 512
# rows (a heap overflow in the engine once), and the reverse: 1,000 entries.
VOCAB="tokenizer.ggml.tokens tokenizer.ggml.scores tokenizer.ggml.token_type"
for n in 100 1000; do
    args=""
    for k in $VOCAB; do args="$args --resize $k $n"; done
    # shellcheck disable=SC2086
    python3 tests/shell/gguf_edit.py $M "$T/v$n.gguf" $args || bad "gguf_edit.py $n"
    msg="v$n.gguf: the vocabulary has $n tokens (tokenizer.ggml.tokens) but token_embd.weight has 512 rows"
    expect_refusal "run, vocab $n" "$msg" "$KVPIN" run -m "$T/v$n.gguf" -p "Once" -n 4
    expect_refusal "logits, vocab $n" "$msg" "$KVPIN" logits -m "$T/v$n.gguf" -p "Once" -o "$T/l.f32"
    expect_refusal "inspect, vocab $n" "$msg" "$KVPIN" inspect -m "$T/v$n.gguf" -p "Once" -n 2
    expect_refusal "run --prompt-cache, vocab $n" "$msg" "$KVPIN" run -m "$T/v$n.gguf" -p "Once" -p "Once upon" -n 2
    expect_refusal "bench, vocab $n" "$msg" "$KVPIN" bench -m "$T/v$n.gguf" -p 8 -n 2 -r 1
    expect_refusal "info, vocab $n" "$msg" "$KVPIN" info -m "$T/v$n.gguf"
    expect_refusal "kv, vocab $n" "$msg" "$KVPIN" kv -m "$T/v$n.gguf"
    expect_refusal "tokenize, vocab $n" "$msg" sh -c "echo Once | '$KVPIN' tokenize -m '$T/v$n.gguf'"
    expect_refusal "detokenize, vocab $n" "$msg" "$KVPIN" detokenize -m "$T/v$n.gguf" 1 2
    expect_refusal "serve, vocab $n" "$msg" timeout 30 "$KVPIN" serve -m "$T/v$n.gguf" --port 0
done
# the unchanged sizes still load (the edit itself is faithful)
python3 tests/shell/gguf_edit.py $M "$T/same.gguf" --resize tokenizer.ggml.tokens 512
if cmp -s "$T/same.gguf" $M; then ok; else bad "gguf_edit.py round trip changes the file"; fi

# the server's hostile requests (tests/e2e/hostile_server.py)
if KVPIN="$KVPIN" python3 tests/e2e/hostile_server.py; then ok; else bad "tests/e2e/hostile_server.py"; fi

echo "e2e_hostile: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
