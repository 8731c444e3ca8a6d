#!/bin/sh
# make bench-quick: the speed table of issue 37 in under 10 minutes on 2
# cores, kvpin beside llama.cpp in the same run (llama-bench from
# BENCH_LLAMA_BENCH or the PATH; without it kvpin's columns alone):
#
#   1. pp512 and tg32 on the 1B shape (Llama-3.2-1B-shaped, 16 layers, 2048
#      wide, the 102,400-token DeepSeek vocabulary) in Q4_0, Q8_0, Q4_K, F16
#      and BF16: medians of BENCH_REPS rounds, the sides alternating per round
#      (bench/arch_bench.py), with kvpin's decode as GB/s and % of the read
#      bandwidth its probe measured;
#   2. a cold prompt of BENCH_COLD tokens (default 4096) on the 135M shape
#      (SmolLM2-135M, Q8_0), the same way, kvpin also with
#      --attn-precision bf16 (a row of its own; attention's share of the
#      time and its GFLOP/s against its instruction's peak on each);
#   3. 8 sequences decoding together on the 1B Q4_0 file against one
#      (kvpin bench -b 8: aggregate tokens/s and the ratio; kvpin only).
#
# The models are generated into build/bench/ on first use (about two
# minutes more the first time). Environment: BENCH_THREADS (2), BENCH_REPS
# (3), BENCH_COLD (4096), BENCH_QUICK_TYPES ("Q4_0 Q8_0 Q4_K F16 BF16").
set -e
cd "$(dirname "$0")/.."
THREADS=${BENCH_THREADS:-2}
REPS=${BENCH_REPS:-3}
COLD=${BENCH_COLD:-4096}
LB=${BENCH_LLAMA_BENCH:-$(command -v llama-bench || true)}
echo "bench-quick: expect about 8 minutes on 2 cores (plus about 2 minutes to generate the models the first time)"
mkdir -p build/bench
files=
for t in ${BENCH_QUICK_TYPES:-Q4_0 Q8_0 Q4_K F16 BF16}; do
    m=build/bench/llama-1b-$t.gguf
    if [ ! -f "$m" ]; then
        ./kvpin mkmodel --type "$t" --arch llama --layers 16 --embd 2048 --heads 32 --kv-heads 8 --head-dim 64 \
            --ff 8192 --tied --ctx-train 32768 --tokenizer tests/data/vocab/ggml-vocab-deepseek-llm.gguf \
            --name llama-1b-shape -o "$m" >/dev/null 2>&1 || { echo "bench-quick: cannot generate $m; skipped"; continue; }
    fi
    files="$files $m"
done
peer=--kvpin-only
[ -n "$LB" ] && peer=
[ -z "$LB" ] && echo "bench-quick: no llama-bench (BENCH_LLAMA_BENCH): kvpin's columns only"
echo "== the 1B shape: pp512, tg32 (machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
# shellcheck disable=SC2086
LLAMA_BENCH=$LB python3 bench/arch_bench.py $peer -r "$REPS" -p 512 -n 32 -t "$THREADS" $files
m=build/bench/smollm2-135m-Q8_0.gguf
[ -f "$m" ] || ./kvpin mkmodel --preset smollm2-135m --type Q8_0 --tokenizer tests/data/vocab/ggml-vocab-starcoder.gguf \
    -o "$m" >/dev/null 2>&1
echo "== a cold prompt of $COLD tokens on the 135M shape"
LLAMA_BENCH=$LB python3 bench/arch_bench.py $peer -r "$REPS" -p "$COLD" -n 0 -t "$THREADS" \
    --variant "bf16 attention=--attn-precision bf16" "$m"
if [ -f build/bench/llama-1b-Q4_0.gguf ]; then
    echo "== 8 sequences decoding together vs one (1B Q4_0; kvpin)"
    ./kvpin bench -m build/bench/llama-1b-Q4_0.gguf -p 0 -n 32 -r "$REPS" -t "$THREADS" -b 8 --no-probe
fi
