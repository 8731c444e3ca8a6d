#!/bin/sh
# End-to-end tests of the kvpin command line: the binary ($KVPIN, default
# ./kvpin) is run the way a user runs it, from the repository root.
# Expected values come from references: llama2.c's greedy output for
# stories260K, llama.cpp's token ids and logits (tests/data/golden), the KV
# formula computed here from the model's hyperparameters.
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_cli: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}
M=models/stories260K.gguf

# greedy from BOS, 256 steps: exactly llama2.c's text (F16 and F32 KV, 1 and 2 threads)
for kv in f32 f16; do for t in 1 2; do
    "$KVPIN" run -m $M --temp 0 -n 256 --kv-type $kv -t $t >"$T/out.txt" 2>"$T/err.txt"
    check "run greedy kv=$kv t=$t equals llama2.c" cmp -s "$T/out.txt" tests/data/stories260K.llama2c-greedy.txt
done; done
# the bundled model is the default
"$KVPIN" run --temp 0 -n 256 >"$T/out.txt" 2>"$T/err.txt"
check "run without -m uses the bundled model" cmp -s "$T/out.txt" tests/data/stories260K.llama2c-greedy.txt
check "summary on stderr" grep -q "prefill .* tok/s" "$T/err.txt"
check "summary reports the KV formula" grep -q "KV cache: 256 positions x 640 bytes (2 x 5 layers x 4 kv-heads x 8 head_dim x 2)" "$T/err.txt"

# --print-tokens: llama.cpp's greedy ids for "Once upon a time" (golden stories260K.once)
"$KVPIN" run -p "Once upon a time" --temp 0 -n 10 --kv-type f32 --print-tokens >"$T/out.txt" 2>"$T/err.txt"
check "greedy ids equal llama.cpp's" grep -q "^tokens: 432 383 286 261 376 298 315 421 395 317$" "$T/err.txt"
check "continuation text is llama.cpp's greedy text" python3 -c "
import json, sys
ref = json.load(open('tests/data/golden/stories260K.once.json'))['greedy_text']
out = open(sys.argv[1]).read().rstrip('\\n')
assert len(out) > 20 and ref.startswith(out), (out, ref)" "$T/out.txt"

# seeded sampling is reproducible; another seed differs
"$KVPIN" run -p "Once" -n 40 --temp 1 --seed 7 >"$T/a.txt" 2>/dev/null
"$KVPIN" run -p "Once" -n 40 --temp 1 --seed 7 >"$T/b.txt" 2>/dev/null
"$KVPIN" run -p "Once" -n 40 --temp 1 --seed 8 >"$T/c.txt" 2>/dev/null
check "same seed, same text" cmp -s "$T/a.txt" "$T/b.txt"
check "other seed, other text" sh -c "! cmp -s '$T/a.txt' '$T/c.txt'"

# stop strings end generation before the stop text
"$KVPIN" run --temp 0 -n 256 --stop "Lily." >"$T/out.txt" 2>"$T/err.txt"
check "stop string" sh -c "[ \"\$(cat '$T/out.txt')\" = 'Once upon a time, there was a little girl named ' ]"
check "stop reason reported" grep -q "stopped by stop string" "$T/err.txt"

# tokenize: llama.cpp's ids (golden stories260K.lily), no trailing newline added
printf 'Lily and Tom went to the park. They saw a big dog and' | "$KVPIN" tokenize -m $M >"$T/ids.txt"
check "tokenize equals llama.cpp" grep -q "^1 $(python3 -c "import json;print(' '.join(map(str,json.load(open('tests/data/golden/stories260K.lily.json'))['tokens'][1:])))")\$" "$T/ids.txt"
printf 'Once upon a time' | "$KVPIN" tokenize -m $M --no-bos >"$T/ids.txt"
check "tokenize --no-bos" grep -q "^403 407 261 378$" "$T/ids.txt"
"$KVPIN" detokenize -m $M 403 407 261 378 >"$T/txt.txt"
check "detokenize" sh -c "[ \"\$(cat '$T/txt.txt')\" = 'Once upon a time' ]"

# logits of every position equal llama.cpp's within the F32 tolerance
"$KVPIN" logits -m $M -p "Once upon a time" -o "$T/l.f32" >"$T/ids.txt" 2>"$T/err.txt"
check "logits prints ids" grep -q "^1 403 407 261 378$" "$T/ids.txt"
check "logits match the golden" python3 - "$T/l.f32" tests/data/golden/stories260K.once.logits.f32 <<'PY'
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
assert len(a) == len(b) == 5 * 512 * 4, (len(a), len(b))
x = struct.unpack('%df' % (len(a) // 4), a); y = struct.unpack('%df' % (len(b) // 4), b)
assert max(abs(p - q) for p, q in zip(x, y)) < 1e-3
PY
"$KVPIN" logits -m tests/data/models/gen-qwen2-f32.gguf --tokens "0 5 9" -o "$T/q.f32" >/dev/null 2>&1
check "logits --tokens writes [3][2048]" sh -c "[ \$(stat -c %s '$T/q.f32') -eq $((3 * 2048 * 4)) ]"

# info and kv: the bill by the formula 2 x n_layer x n_head_kv x head_dim x bytes
"$KVPIN" info -m tests/data/models/gen-qwen3-f16.gguf >"$T/info.txt" 2>&1
check "info architecture" grep -q "^architecture:  qwen3" "$T/info.txt"
check "info tokenizer" grep -q "tokenizer:     gpt2, pre-tokenizer qwen2, 2048 tokens" "$T/info.txt"
check "info KV bill F16" grep -q "F16: 2 x 2 layers x 2 kv-heads x 64 head_dim x 2 bytes = 1024 bytes/token" "$T/info.txt"
"$KVPIN" kv -m tests/data/models/gen-llama-gqa-q8_0.gguf --ctx 1000 >"$T/kv.txt"
check "kv per token" grep -q "^per token:  1024 bytes" "$T/kv.txt"
check "kv total" grep -q "1000 tokens -> .*(1024000 bytes)" "$T/kv.txt"
# the quantized KV types: blocks of 32 values, q8_0 34 bytes, q4_0 18 (2 x 2 x 2 x 64 = 512 values a token)
check "info KV bill Q8_0" grep -q "Q8_0: 2 x 2 layers x 2 kv-heads x 64 head_dim x 34/32 bytes = $((512 / 32 * 34)) bytes/token" "$T/info.txt"
check "info KV bill Q4_0" grep -q "Q4_0: 2 x 2 layers x 2 kv-heads x 64 head_dim x 18/32 bytes = $((512 / 32 * 18)) bytes/token" "$T/info.txt"
"$KVPIN" kv -m tests/data/models/gen-qwen3-f16.gguf --ctx 1000 --kv-type-k q8_0 --kv-type-v q4_0 >"$T/kv.txt"
check "kv per token, K q8_0 and V q4_0" grep -q "^per token:  $((256 / 32 * 34 + 256 / 32 * 18)) bytes" "$T/kv.txt"
# per layer kind (gen-gemma3: 1 full and 5 window layers of 16, 1 kv-head of 32, F16): a sequence
# needs full x seq + window x min(seq, 16)
"$KVPIN" kv -m tests/data/models/gen-gemma3-f16.gguf --ctx 1000 >"$T/kv.txt"
check "kv full layers" grep -q "1 full layers:   $((2 * 1 * 32 * 2)) bytes/token x 1000 tokens" "$T/kv.txt"
check "kv window layers" grep -q "5 window layers: $((2 * 5 * 32 * 2)) bytes/token x min(1000, window 16) = 16 tokens" "$T/kv.txt"
check "kv a sequence" grep -q "1000 tokens need $(((128 * 1000 + 640 * 16) / 1024)).00 KiB" "$T/kv.txt"
"$KVPIN" kv -m tests/data/models/gen-llama-gqa-q8_0.gguf --ctx 1000 >"$T/kv.txt"
check "kv no kinds without window layers" sh -c "! grep -q 'window' '$T/kv.txt'"
"$KVPIN" run -m tests/data/models/gen-qwen3-f16.gguf -p "Once upon a time" --temp 0 -n 4 --kv-type q8_0 -t 1 \
    >"$T/out.txt" 2>"$T/err.txt"
check "run --kv-type q8_0 bills 34/32 bytes a value" grep -q "positions x $((512 / 32 * 34)) bytes (2 x 2 x 2 x 64 x 34/32)" "$T/err.txt"
"$KVPIN" run -m $M -p "Once" -n 2 --kv-type q4_0 >"$T/out.txt" 2>"$T/err.txt"
check "q4_0 KV on head_dim 8: exit 1" [ $? -eq 1 ]
check "q4_0 KV on head_dim 8: the message says why" grep -q "head_dim is 8 (not a multiple of 32)" "$T/err.txt"
"$KVPIN" run -m $M -p "Once" -n 2 --kv-type q5_0 >"$T/out.txt" 2>"$T/err.txt"
check "an unknown KV type: exit 2" [ $? -eq 2 ]
"$KVPIN" info -m tests/data/vocab/ggml-vocab-gpt-2.gguf >"$T/info.txt" 2>&1
check "info on a vocabulary-only file" grep -q "tokenizer:     gpt2, pre-tokenizer gpt-2, 50257 tokens, 50000 merges" "$T/info.txt"

# llama.cpp's spellings (llama-cli, llama-server): mapped (-ctk/-ctv are --kv-type-k/v),
# noted (-ngl, -fa with or without its word, -cb, --jinja, -b, -ub, --mlock, --no-mmap,
# --metrics), refused with what to do (-hf); an unknown option is named whole
"$KVPIN" run -m tests/data/models/gen-qwen3-f16.gguf -ngl 99 -fa -cb --jinja -b 2048 -ub 512 --mlock --no-mmap \
    -ctk q8_0 -ctv f32 -fa off -p "Once upon a time" --temp 0 -n 2 -t 1 >"$T/out.txt" 2>"$T/err.txt"
check "llama-cli's options: exit 0" [ $? -eq 0 ]
check "-ctk q8_0 -ctv f32: the KV bill of K q8_0 and V f32" \
    grep -q "positions x $((256 / 32 * 34 + 256 * 4)) bytes" "$T/err.txt"
check "-ngl noted" grep -q "note: -ngl 99 ignored: kvpin runs on the CPU" "$T/err.txt"
check "-fa with and without its word noted" sh -c "grep -q 'note: -fa ignored' '$T/err.txt' && grep -q 'note: -fa off ignored' '$T/err.txt'"
check "-cb, --jinja, -b, -ub, --mlock, --no-mmap noted" sh -c "for o in '-cb' '--jinja' '-b 2048' '-ub 512' '--mlock' '--no-mmap'; do grep -q \"note: \$o ignored\" '$T/err.txt' || exit 1; done"
"$KVPIN" serve -m $M -hf org/model-GGUF >"$T/out.txt" 2>"$T/err.txt"
check "serve -hf: exit 2" [ $? -eq 2 ]
check "serve -hf: says to download the file" grep -q "does not download models.*-m FILE" "$T/err.txt"
"$KVPIN" serve -m $M -xyz 9 >"$T/out.txt" 2>"$T/err.txt"
check "an unknown option named whole" grep -q "unknown option '-xyz'" "$T/err.txt"

# the memory line says where the weights are: repacked copies at load where the
# matrix kernels are AVX-512's (they repack Q8_0), else used in place from the mapping
"$KVPIN" run -m tests/data/models/gen-llama-gqa-q8_0.gguf -p "Once" -n 2 -t 1 >"$T/out.txt" 2>"$T/err.txt"
"$KVPIN" run -m tests/data/models/gen-llama-gqa-q8_0.gguf -p "Once" -n 2 -t 1 --no-repack >"$T/out2.txt" 2>"$T/err2.txt"
check "--no-repack: the weights used in place" grep -q "weights .* (mapped, used in place)" "$T/err2.txt"
if "$KVPIN" --version | grep -q "^kernels: *avx512"; then
    check "AVX-512 kernels: the repacked copies in the memory line" grep -q "(mapped) + .* repacked at load" "$T/err.txt"
else
    check "no AVX-512 kernels: the weights used in place" grep -q "(mapped, used in place)" "$T/err.txt"
fi

# the README quotes the server's startup line as it is (the URL aside)
timeout 3 "$KVPIN" serve -m $M --port 0 >/dev/null 2>"$T/serve.err"
check "the README's startup line is the server's" python3 - "$T/serve.err" <<'PY'
import re, sys
got = [l for l in open(sys.argv[1]).read().splitlines() if "listening on" in l]
readme = re.findall(r"`(kvpin serve: listening on [^`]*)`", open("README.md").read())
norm = lambda l: re.sub(r"http://\S+", "URL", l.strip())
assert got and readme and all(norm(r) == norm(got[0]) for r in readme), (got, readme)
PY

# inspect shows prefill writing and decode appending
"$KVPIN" inspect -p "Once upon a time" -n 3 >"$T/ins.txt" 2>/dev/null
check "inspect prefill" grep -q "^prefill: 5 prompt tokens in one batch -> K/V written for positions 0..4; cache length 5" "$T/ins.txt"
check "inspect decode appends" grep -q "cache length 7$" "$T/ins.txt"

# mkmodel writes a model kvpin loads
"$KVPIN" mkmodel -o "$T/m.gguf" --preset qwen3-tiny --type Q8_0 --tokenizer tests/data/models/gen-qwen2-q8_0.gguf 2>/dev/null
check "mkmodel output runs" "$KVPIN" run -m "$T/m.gguf" -p hello -n 4 -t 1 >/dev/null 2>&1

# errors: clear message, exit code, no crash
printf 'GGUF\003\000\000\000' >"$T/trunc.gguf"
"$KVPIN" run -m "$T/trunc.gguf" >/dev/null 2>"$T/err.txt"; rc=$?
check "truncated model: exit 1" [ $rc -eq 1 ]
check "truncated model: message names the file" grep -q "trunc.gguf: truncated file" "$T/err.txt"
"$KVPIN" run -m /nonexistent.gguf >/dev/null 2>"$T/err.txt"; rc=$?
check "missing model file" sh -c "[ $rc -eq 1 ] && grep -q 'cannot open' '$T/err.txt'"
"$KVPIN" info -m tests/data/vocab/ggml-vocab-bert-bge.gguf >/dev/null 2>&1; rc=$?
check "info survives an unsupported vocabulary" [ $rc -eq 0 ]
"$KVPIN" run -n abc >/dev/null 2>"$T/err.txt"; rc=$?
check "bad number: exit 2" sh -c "[ $rc -eq 2 ] && grep -q -- '-n expects an integer' '$T/err.txt'"
"$KVPIN" run --temp nan >/dev/null 2>&1; rc=$?
check "nan temperature refused" [ $rc -eq 2 ]
"$KVPIN" run --bogus 1 >/dev/null 2>&1; rc=$?
check "unknown option: exit 2" [ $rc -eq 2 ]
"$KVPIN" frobnicate >/dev/null 2>&1; rc=$?
check "unknown command: exit 2" [ $rc -eq 2 ]
"$KVPIN" run -p "$(python3 -c "print('Once upon a time ' * 300)")" --ctx 64 -n 1 >/dev/null 2>"$T/err.txt"; rc=$?
check "prompt longer than the context" sh -c "[ $rc -eq 1 ] && grep -q 'more than the context of 64' '$T/err.txt'"
"$KVPIN" detokenize -m $M 99999 >/dev/null 2>"$T/err.txt"; rc=$?
check "detokenize bad id" sh -c "[ $rc -eq 1 ] && grep -q 'not a token id' '$T/err.txt'"

# ---- options: getopt_long spellings, the same in every command
# --opt=value and the long names give what the short ones give (the golden ids above)
"$KVPIN" run --model=$M --prompt="Once upon a time" --temp=0 --n-predict=10 --kv-type=f32 --print-tokens \
    >/dev/null 2>"$T/err.txt"
check "--opt=value: greedy ids equal llama.cpp's" grep -q "^tokens: 432 383 286 261 376 298 315 421 395 317$" "$T/err.txt"
"$KVPIN" run -m$M -p"Once upon a time" --temp 0 -n10 --kv-type f32 --print-tokens >/dev/null 2>"$T/err.txt"
check "-mFILE -pTEXT -n10: the same ids" grep -q "^tokens: 432 383 286 261 376 298 315 421 395 317$" "$T/err.txt"
for spell in "--ctx-size=64" "-c 64" "--ctx 64" "--ctx=64"; do
    # shellcheck disable=SC2086 # $spell is one option and its value
    "$KVPIN" run -p "$(python3 -c "print('Once upon a time ' * 300)")" $spell -n 1 >/dev/null 2>"$T/err.txt"; rc=$?
    check "context option '$spell' is the context" sh -c "[ $rc -eq 1 ] && grep -q 'more than the context of 64' '$T/err.txt'"
done
"$KVPIN" kv -m tests/data/models/gen-llama-gqa-q8_0.gguf --ctx-size=1000 >"$T/kv.txt"
check "kv --ctx-size=1000" grep -q "1000 tokens -> .*(1024000 bytes)" "$T/kv.txt"
# -np is --parallel (the two-letter short option), also as -np=N; elsewhere it is unknown
"$KVPIN" serve -np 0 >/dev/null 2>"$T/err.txt"; rc=$?
check "serve -np 0 is --parallel 0" sh -c "[ $rc -eq 2 ] && grep -q -- '--parallel must be between 1 and 256, got 0' '$T/err.txt'"
"$KVPIN" serve -np=300 >/dev/null 2>"$T/err.txt"; rc=$?
check "serve -np=300 is --parallel=300" sh -c "[ $rc -eq 2 ] && grep -q -- '--parallel must be between 1 and 256, got 300' '$T/err.txt'"
"$KVPIN" run -np 2 >/dev/null 2>"$T/err.txt"; rc=$?
check "run -np: unknown, named" sh -c "[ $rc -eq 2 ] && grep -q \"unknown option '-np'\" '$T/err.txt'"
# a value that looks like an option is a value
"$KVPIN" run -m $M -p "-np" -n 2 --temp 0 >/dev/null 2>&1; rc=$?
check "-p -np: '-np' is the prompt" [ $rc -eq 0 ]
# several -p / --prompt / --prompt= switch run to its prompt-cache mode: turn 2 reuses n - 1 tokens
n=$(printf 'Once upon a time' | "$KVPIN" tokenize -m $M | wc -w)
"$KVPIN" run -m $M --prompt "Once upon a time" --prompt="Once upon a time" -n 2 -t 1 >/dev/null 2>"$T/err.txt"
check "--prompt twice is the prompt cache" grep -q "^turn 2: $n prompt tokens, $((n - 1)) reused, 1 computed" "$T/err.txt"
printf 'Once upon a time' >"$T/p.txt"
"$KVPIN" run -m $M --file="$T/p.txt" -f"$T/p.txt" -n 2 -t 1 >/dev/null 2>"$T/err.txt"
check "--file= and -fFILE are the prompt cache" grep -q "^turn 2: $n prompt tokens, $((n - 1)) reused, 1 computed" "$T/err.txt"
"$KVPIN" run -m $M -p "Once upon a time" --no-prefix-cache -n 2 -t 1 >/dev/null 2>"$T/err.txt"
check "--no-prefix-cache is the prompt-cache mode" grep -q "^turn 1: $n prompt tokens, 0 reused" "$T/err.txt"
"$KVPIN" run -m $M -p a -p b --kv-budget 0 >/dev/null 2>"$T/err.txt"; rc=$?
check "run --kv-budget 0: exit 2, says what to pass" sh -c "[ $rc -eq 2 ] && grep -q 'kv-budget out for the default' '$T/err.txt'"
"$KVPIN" serve --kv-budget=0 >/dev/null 2>"$T/err.txt"; rc=$?
check "serve --kv-budget 0: exit 2, says what to pass" sh -c "[ $rc -eq 2 ] && grep -q 'kv-budget out for the default' '$T/err.txt'"

# every command: an unknown option, a missing value and an operand where none is taken are one
# line naming the option and `kvpin CMD --help`, exit 2; --help exits 0
CMDS="serve run logits inspect kv info tokenize detokenize doctor canon bench mkmodel"
for c in $CMDS; do
    "$KVPIN" $c --no-such-option </dev/null >/dev/null 2>"$T/err.txt"; rc=$?
    check "$c --no-such-option: exit 2 ($rc), one line naming it" sh -c "[ $rc -eq 2 ] &&
        [ \$(wc -l <'$T/err.txt') -eq 1 ] && grep -q \"'--no-such-option' (see kvpin $c --help)\" '$T/err.txt'"
    "$KVPIN" $c -Z </dev/null >/dev/null 2>"$T/err.txt"; rc=$?
    check "$c -Z: exit 2" sh -c "[ $rc -eq 2 ] && grep -q \"unknown option '-Z'\" '$T/err.txt'"
    "$KVPIN" $c --help >"$T/help-$c.txt" 2>&1; rc=$?
    check "$c --help: exit 0" sh -c "[ $rc -eq 0 ] && grep -q '^usage: kvpin $c' '$T/help-$c.txt'"
done
for c in serve run logits inspect kv info tokenize detokenize doctor bench; do
    "$KVPIN" $c -m </dev/null >/dev/null 2>"$T/err.txt"; rc=$?
    check "$c -m without a value: exit 2" sh -c "[ $rc -eq 2 ] && grep -q \"option '-m' needs a value (see kvpin $c --help)\" '$T/err.txt'"
    "$KVPIN" $c --model </dev/null >/dev/null 2>"$T/err.txt"; rc=$?
    check "$c --model without a value: exit 2" sh -c "[ $rc -eq 2 ] && grep -q \"option '--model' needs a value\" '$T/err.txt'"
done
"$KVPIN" run --no-bos=yes >/dev/null 2>"$T/err.txt"; rc=$?
check "a value given to a flag: exit 2" sh -c "[ $rc -eq 2 ] && grep -q \"option '--no-bos' takes no value\" '$T/err.txt'"
"$KVPIN" run -m $M stray >/dev/null 2>"$T/err.txt"; rc=$?
check "an operand run does not take: exit 2" sh -c "[ $rc -eq 2 ] && grep -q \"unexpected argument 'stray'\" '$T/err.txt'"
"$KVPIN" run --prompt-cache --help >"$T/help-cache.txt" 2>&1
# a shared option's help line (and its continuation lines) reads the same in every command that has
# it, and every command's descriptions start in one column
check "shared options read the same in every --help" python3 - "$T" $CMDS cache <<'PY'
import re, sys
d, cmds = sys.argv[1], sys.argv[2:]
shared = ["model", "threads", "ctx-size", "n-predict", "prompt", "file", "seed", "temp", "top-k", "top-p",
          "min-p", "repeat-penalty", "repeat-last-n", "presence-penalty", "frequency-penalty", "host", "port",
          "parallel", "kv-type", "kv-budget", "kv-block", "no-prefix-cache", "no-bos", "special", "print-tokens",
          "scalar", "json", "help", "version"]
# an option too long for the column has its description on the next line (not a layout to check)
opt_line = re.compile(r"^ {2,7}(-[a-z]+, )?--([a-z0-9-]+)( \S+)? {2,}\S")
lines, cols = {}, set()
for c in cmds:
    text = open("%s/help-%s.txt" % (d, c)).read().split("\n")
    for i, l in enumerate(text):
        m = opt_line.match(l)
        if not m:
            continue
        cols.add(len(l) - len(l[m.end(3) if m.group(3) else m.end(2):].lstrip(" ")))
        block = [l]
        for k in text[i + 1:]:
            if not k.startswith(" " * 20) or opt_line.match(k):
                break
            block.append(k)
        lines.setdefault(m.group(2), {})[c] = "\n".join(block)
assert len(cols) == 1, "descriptions start in columns %s" % sorted(cols)
for name in shared:
    seen = lines.get(name, {})
    if name in ("prompt", "n-predict"):  # bench's -p/-n are --n-prompt/--n-gen (llama-bench's)
        assert "bench" not in seen
    assert seen, "--%s in no --help" % name
    assert len(set(seen.values())) == 1, "--%s differs:\n%s" % (name, "\n".join("%s: %s" % kv for kv in seen.items()))
assert set(lines["model"]) == set(cmds) - {"canon", "mkmodel"}, sorted(lines["model"])
assert set(lines["help"]) == set(lines["version"]) == set(cmds)
PY
# README's ## Commands block lists every option each --help shows
check "README lists every option of every command" python3 - "$T" $CMDS <<'PY'
import re, sys
d, cmds = sys.argv[1], sys.argv[2:]
readme = open("README.md").read()
block = readme.split("## Commands", 1)[1].split("\n\n", 2)[1]
syn, cur = {}, None
for l in block.split("\n"):
    m = re.match(r"\s+kvpin (run --prompt-cache|\S+)", l)
    if m:
        cur = "cache" if m.group(1) == "run --prompt-cache" else m.group(1)
    syn[cur] = syn.get(cur, "") + " " + l
for c in cmds + ["cache"]:  # an option counts as listed by its long or its short spelling
    opts = re.findall(r"^ {2,7}(?:-([a-z]+), )?--([a-z0-9-]+)", open("%s/help-%s.txt" % (d, c)).read(), re.M)
    missing = [l for sh, l in opts if l not in ("help", "version") and
               not re.search(r"(?<![\w-])(--%s|%s)(?![\w-])" % (re.escape(l), "-" + sh if sh else "--%s" % l),
                             syn.get(c, ""))]
    assert not missing, "README's synopsis of %s lacks %s" % (c, missing)
PY

# ---- --version: the version, the commit of this checkout, the compiler, the flags, the kernels
"$KVPIN" --version >"$T/v1.txt" 2>&1; rc=$?
"$KVPIN" version >"$T/v2.txt" 2>&1
"$KVPIN" serve --version >"$T/v3.txt" 2>&1
"$KVPIN" bench --version >"$T/v4.txt" 2>&1
check "--version exits 0" [ $rc -eq 0 ]
check "kvpin version, kvpin CMD --version: the same" sh -c "cmp -s '$T/v1.txt' '$T/v2.txt' && cmp -s '$T/v1.txt' '$T/v3.txt' && cmp -s '$T/v1.txt' '$T/v4.txt'"
check "--version: the version" grep -q "^kvpin [0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*$" "$T/v1.txt"
check "--version: compiler and flags" sh -c "grep -q '^compiler: *\(gcc\|clang\) [0-9]' '$T/v1.txt' && grep -q '^flags: .*-std=c11' '$T/v1.txt'"
if head=$(git rev-parse --short HEAD 2>/dev/null) && [ "$(git rev-parse --show-toplevel)" = "$(pwd)" ]; then
    dirty=""; [ -n "$(git status --porcelain)" ] && dirty="-dirty"
    check "--version: the commit is git's ($head$dirty)" grep -q "^commit: *$head$dirty$" "$T/v1.txt"
else
    check "--version: commit unknown outside a checkout" grep -q "^commit: *unknown$" "$T/v1.txt"
fi
if [ "$(uname -m)" = x86_64 ]; then # the tables this CPU must get, from the kernel's list of its flags
    check "--version: the kernels this CPU gets" python3 - "$T/v1.txt" <<'PY'
import re, sys
flags = set(re.search(r"^flags\s*:(.*)$", open("/proc/cpuinfo").read(), re.M).group(1).split())
avx2 = {"avx2", "fma", "f16c"} <= flags
vnni = avx2 and {"avx512f", "avx512vl", "avx512bw", "avx512_vnni"} <= flags
matrix = ("avx512bf16" if "avx512_bf16" in flags else "avx512vnni") if vnni else "avx2" if avx2 else "scalar"
attn = "avx512" if avx2 and "avx512f" in flags else "avx2" if avx2 else "scalar"
want = "kernels:   %s (matrix), %s (attention)" % (matrix, attn)
got = [l for l in open(sys.argv[1]).read().split("\n") if l.startswith("kernels:")]
assert got == [want], (got, want)
PY
fi

echo "e2e_cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
