#!/bin/sh
# make bench: kvpin and llama.cpp side by side on the same files, threads and
# machine, in the same run.
#
# Generates SmolLM2-135M-shaped models (30 layers, 576 wide, 9 heads / 3 kv
# heads, ff 1536, tied, the 49152-token StarCoder vocabulary) with seeded
# random weights into build/bench/, then for each weight type runs
# `kvpin bench --json` and, when bench/node_modules exists (cd bench && npm ci),
# bench/llamacpp_bench.mjs with the same settings, and prints the medians and
# the ratios kvpin / llama.cpp; then the grammar engine's token masks
# (build/rel/bench_grammar) against a decode step of the Q8_0 model. Each
# weight type's latency picture goes to build/bench/latency-TYPE.svg
# (kvpin bench --plot, llama.cpp's points beside when the peer ran); the
# dashboard's overhead under 16 streams is measured last
# (bench/dashboard_bench.py).
#
# Environment: BENCH_TYPES (default "F16 Q8_0 Q4_0 Q4_K"), BENCH_DEPTHS
# (default "0,2048,8192"), BENCH_REPS (3), BENCH_THREADS (2), BENCH_PP
# (prompt lengths, default "128,512"),
# BENCH_TG (128), BENCH_FA (llama.cpp flash attention modes, default "auto,off"),
# BENCH_LLAMA_SERVER (a llama-server binary for bench/crew_bench.py and
# bench/agent_first_bench.py; unset: kvpin only), BENCH_AGENT=0 (skip Claude
# Code's first request), BENCH_AGENT_REPS (1),
# BENCH_1B_TYPES (the 1B-shaped models' types, default "Q4_0 Q8_0"; "" skips them),
# BENCH_ARCH=1 (the other architectures: gemma3, qwen3moe and gpt-oss shapes,
# prefill and decode beside llama-bench (BENCH_LLAMA_BENCH) and the agent loop
# on gemma3 beside llama-server; generating the MoE shapes takes ~20 minutes).
set -e
cd "$(dirname "$0")/.."
echo "make bench: expect an hour or more on 2 cores with the defaults (the prefix, n-choices, crew and agent" \
    "benchmarks take several minutes each; BENCH_AGENT=0 and BENCH_PREFIX_ARGS=--quick shorten it;" \
    "make bench-quick prints the speed table in under 10 minutes)"
TYPES=${BENCH_TYPES:-"F16 Q8_0 Q4_0 Q4_K"}
DEPTHS=${BENCH_DEPTHS:-0,2048,8192}
REPS=${BENCH_REPS:-3}
THREADS=${BENCH_THREADS:-2}
PP=${BENCH_PP:-128,512}
TG=${BENCH_TG:-128}
FA=${BENCH_FA:-auto,off}
VOCAB=tests/data/vocab/ggml-vocab-starcoder.gguf
mkdir -p build/bench
echo "== tokenizer throughput (1 MB of English text, best of 3)"
build/rel/bench_tok
echo "== kernel throughput"
build/rel/bench_quant
echo "== chat template rendering (the Jinja interpreter, a 200-message agent conversation)"
build/rel/bench_jinja
out=build/bench/results.jsonl
: >"$out"
for t in $TYPES; do
    m=build/bench/smollm2-135m-$t.gguf
    if [ ! -f "$m" ]; then
        ./kvpin mkmodel --preset smollm2-135m --type "$t" --tokenizer "$VOCAB" -o "$m" || {
            echo "bench: cannot generate a $t model of this shape; skipped"; continue; }
    fi
    echo "== $m" >&2
    peer=build/bench/peer-$t.jsonl
    : >"$peer"
    if [ -d bench/node_modules ]; then
        for p in $(echo "$PP" | tr , ' '); do
            tg=$TG; [ "$p" = "${PP##*,}" ] || tg=0 # tg once, with the last prompt length
            node bench/llamacpp_bench.mjs -m "$m" -p "$p" -n "$tg" -d "$DEPTHS" -r "$REPS" -t "$THREADS" \
                --fa "$FA" --json | tee -a "$peer"
        done
    fi
    ./kvpin bench -m "$m" -p "$PP" -n "$TG" -d "$DEPTHS" -r "$REPS" -t "$THREADS" --json \
        --plot build/bench/latency-$t.svg --peer "$peer" | tee -a "$out"
    cat "$peer" >>"$out"
    echo "latency picture: build/bench/latency-$t.svg" >&2
done
./kvpin bench -m build/bench/smollm2-135m-Q8_0.gguf -p 0 -n 1 -r 1 2>/dev/null | grep '^machine:' || true
python3 bench/report.py "$out"
# The 1B shape (issue #14; Llama-3.2-1B-shaped, 102,400-token vocabulary):
# weights far larger than the last-level cache, so tg is a DRAM figure;
# kvpin's table (with 8 sequences decoding together) and llama.cpp's, side
# by side. BENCH_1B_TYPES="" skips it (generating a model takes ~30 s).
for t in ${BENCH_1B_TYPES-Q4_0 Q8_0}; do
    m=build/bench/llama-1b-$t.gguf
    if [ ! -f "$m" ]; then
        ./kvpin mkmodel --type "$t" --arch llama --layers 16 --embd 2048 --heads 32 --kv-heads 8 --head-dim 64 \
            --ff 8192 --tied --ctx-train 32768 --tokenizer tests/data/vocab/ggml-vocab-deepseek-llm.gguf \
            --name llama-1b-shape -o "$m" || { echo "bench: cannot generate $m; skipped"; continue; }
    fi
    echo "== $m (kvpin, then llama.cpp)"
    ./kvpin bench -m "$m" -p 512 -n 32 -r "$REPS" -t "$THREADS" -b 8
    if [ -d bench/node_modules ]; then
        node bench/llamacpp_bench.mjs -m "$m" -p 512 -n 32 -r "$REPS" -t "$THREADS" --fa auto
    fi
done
# Constrained decoding (src/grammar/): the per-token mask cost on the 49,152-
# and a 151,936-token vocabulary during generation-like walks of realistic
# schemas, against a decode step of the Q8_0 model (without it, no ratios).
echo "== grammar masks (bench/bench_grammar.c)"
build/rel/bench_grammar -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" -r "$REPS"
# Prefix-cache goals (issue #4) on the Q8_0 model: the issue's sizes take about
# ten minutes on 2 cores (15,200 decoded answer tokens in the agent loop and a
# cold 20,000-token prefill), the server's agent loop as long; BENCH_PREFIX_ARGS=--quick
# runs everything at a tenth of the size in under a minute.
if [ -f build/bench/smollm2-135m-Q8_0.gguf ]; then
    echo "== prefix cache (build/bench/smollm2-135m-Q8_0.gguf)"
    build/rel/bench_prefix -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" ${BENCH_PREFIX_ARGS:-} |
        tee build/bench/prefix.txt
    # The server (issue #5): 8 streams vs 1, overhead per streamed token, and
    # the same agent loop through HTTP against bench_prefix's in-process one.
    echo "== kvpin serve (build/bench/smollm2-135m-Q8_0.gguf)"
    case " ${BENCH_PREFIX_ARGS:-} " in *" --quick "*) q=--quick ;; *) q= ;; esac
    python3 bench/server_bench.py --kvpin ./kvpin -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" \
        --reps "$REPS" --tokens "$TG" --prefix build/bench/prefix.txt $q
    # n choices (issue #11): n 8 on a 2,000-token prompt as one request (one
    # prefill, forked) against 8 separate requests: prompt positions
    # computed, KV bytes held, wall time (about 9 minutes on 2 shared cores).
    echo "== n 8 from one prefill (build/bench/smollm2-135m-Q8_0.gguf)"
    python3 bench/choices_bench.py --kvpin ./kvpin -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" \
        --reps "$REPS" -n 8 --prompt 2000 --tokens 16
    # In-flight prefixes (issue #18): 8 requests of a 4,000-token spec + 100-token
    # tails sent at once (--parallel 8), and 32 of them; llama.cpp's server
    # beside when BENCH_LLAMA_SERVER names its llama-server binary.
    echo "== a crew arriving together (build/bench/smollm2-135m-Q8_0.gguf)"
    python3 bench/crew_bench.py --kvpin ./kvpin -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" \
        --reps "$REPS" ${BENCH_LLAMA_SERVER:+--llama-server "$BENCH_LLAMA_SERVER"}
fi
# The agent loop through /v1/messages against /v1/chat/completions (issue
# #12): 10 turns, a 2,000-token system block with cache_control, a tool, 300
# new tokens a turn; warm turns' time to first token and cache reads.
if [ -f build/bench/smollm2-135m-Q8_0.gguf ]; then
    echo "== agent loop, /v1/messages vs /v1/chat/completions (build/bench/smollm2-135m-Q8_0.gguf)"
    python3 bench/messages_bench.py --kvpin ./kvpin -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" \
        --reps "$REPS" | tee build/bench/messages.txt
fi
# The dashboard's cost (issue #15): 16 streams decoding with the page's
# endpoints polled vs not.
echo "== dashboard overhead"
m=build/bench/smollm2-135m-Q8_0.gguf
[ -f "$m" ] || m=models/stories260K.gguf
python3 bench/dashboard_bench.py --kvpin ./kvpin -m "$m" -t "$THREADS" --reps "${BENCH_DASH_REPS:-5}" --tokens "$TG" |
    tee build/bench/dashboard.txt
# The tiers below RAM (issue #13): time to first token of a 20,000-token prompt
# restored from disk (page cache dropped when permitted) and from Redis vs
# computed, then prefill and decode with both tiers writing vs none, round by
# round. BENCH_TIERS_TOKENS shortens the prompt (computing 20,000 tokens twice
# takes minutes on 2 cores).
if [ -f build/bench/smollm2-135m-Q8_0.gguf ] && command -v redis-server >/dev/null 2>&1; then
    echo "== tiers: restore vs compute (build/bench/smollm2-135m-Q8_0.gguf)"
    python3 bench/tiers_bench.py build/bench/smollm2-135m-Q8_0.gguf "${BENCH_TIERS_TOKENS:-20000}" 2 -t "$THREADS"
    echo "== tiers: steady state, on vs off (build/bench/smollm2-135m-Q8_0.gguf)"
    python3 bench/tiers_steady_bench.py --kvpin ./kvpin -m build/bench/smollm2-135m-Q8_0.gguf -t "$THREADS" \
        --rounds "${BENCH_TIERS_ROUNDS:-8}"
fi
# Claude Code's first request (issue #34): recorded from the pinned Claude
# Code (tests/clients, npm ci) against a stand-in on loopback, then time to
# first byte and first token cold, warm and in a new session, kvpin and
# llama.cpp's server (BENCH_LLAMA_SERVER) on the 135M and 1B shapes, each
# with a 32k training context. A cold 12k-token prompt takes about a minute
# on the 135M shape and several on the 1B one, per server: BENCH_AGENT=0
# skips it.
if [ "${BENCH_AGENT:-1}" != 0 ] && { [ -x tests/clients/node_modules/.bin/claude ] ||
    [ -f build/bench/claude-first-request.json ]; }; then
    m=build/bench/smollm2-135m-32k-Q8_0.gguf
    [ -f "$m" ] || ./kvpin mkmodel --preset smollm2-135m --type Q8_0 --ctx-train 32768 --tokenizer "$VOCAB" -o "$m"
    for m in "$m" build/bench/llama-1b-Q4_0.gguf; do
        [ -f "$m" ] || continue
        echo "== Claude Code's first request ($m)"
        python3 bench/agent_first_bench.py --kvpin ./kvpin -m "$m" -t "$THREADS" --ctx 32768 \
            --reps "${BENCH_AGENT_REPS:-1}" ${BENCH_LLAMA_SERVER:+--llama-server "$BENCH_LLAMA_SERVER"} |
            tee -a build/bench/agent.txt
    done
fi
# The other architectures (issue 36), BENCH_ARCH=1: gemma-3-1b-shaped files
# in Q4_0 and Q8_0, a Qwen3-30B-A3B shape with 8 of its 48 layers in Q4_K and
# a gpt-oss-20b shape with 8 of its 24 layers in MXFP4: prefill and decode
# beside llama-bench (BENCH_LLAMA_BENCH, a native build), then the agent loop
# on gemma3 (20 turns of 1,000 new tokens, an edit 2,000 tokens back at turn
# 10) beside llama-server (BENCH_LLAMA_SERVER), its default and --swa-full.
if [ "${BENCH_ARCH:-0}" = 1 ]; then
    set -- "gemma3-1b Q4_0 gemma3-1b-q4_0 24" "gemma3-1b Q8_0 gemma3-1b-q8_0 24" \
        "qwen3moe-30b-a3b Q4_K qwen3moe-a3b-8l-q4_k 8" "gpt-oss-20b MXFP4 gpt-oss-20b-8l-mxfp4 8"
    files=
    for spec in "$@"; do
        # shellcheck disable=SC2086
        set -- $spec
        m=build/bench/$3.gguf
        layers=; [ "$4" = 8 ] && layers="--layers 8"
        # shellcheck disable=SC2086
        [ -f "$m" ] || ./kvpin mkmodel --preset "$1" --type "$2" $layers -o "$m" || continue
        files="$files $m"
    done
    echo "== architectures: prefill and decode (kvpin, llama.cpp)"
    # shellcheck disable=SC2086
    LLAMA_BENCH=${BENCH_LLAMA_BENCH:-} python3 bench/arch_bench.py -r "$REPS" -t "$THREADS" $files ||
        echo "bench: arch_bench needs BENCH_LLAMA_BENCH (llama.cpp's llama-bench)"
    echo "== the agent loop on gemma3 (build/bench/gemma3-1b-q4_0.gguf)"
    python3 bench/swa_agent_bench.py -m build/bench/gemma3-1b-q4_0.gguf -t "$THREADS" \
        ${BENCH_LLAMA_SERVER:+--llama-server "$BENCH_LLAMA_SERVER"}
    # the agent loops on a hybrid model (qwen35: state snapshots) beside llama-server
    m=build/bench/qwen35-4b-4l-q8_0.gguf
    [ -f "$m" ] || ./kvpin mkmodel --preset qwen35-4b --layers 4 --type Q8_0 -o "$m" >/dev/null 2>&1
    echo "== the agent loops on qwen35 ($m)"
    [ -f "$m" ] && python3 bench/hybrid_agent_bench.py -m "$m" -t "$THREADS" \
        ${BENCH_LLAMA_SERVER:+--llama-server "$BENCH_LLAMA_SERVER"}
fi
