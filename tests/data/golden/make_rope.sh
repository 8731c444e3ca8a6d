#!/bin/sh
# make_rope.sh - test models with the rope variants of real files, and their
# llama.cpp goldens (test_forward's test_goldens_rope).
#
# Run from the repository root after `make` (it needs ./kvpin) with a
# llama.cpp tree built with CMake in $LLAMA (default /work/peer/llama.cpp,
# commit de3ff815ea7d):
#
#   sh tests/data/golden/make_rope.sh
#
# 1. kvpin mkmodel writes three small llama files (2 layers, n_embd 64,
#    2 / 1 heads, head_dim 32, n_ff 128, untied: a separate output matrix
#    of the tied one's shape; F32; stories260K's vocabulary), seed 7007:
#      gen-rope-llama3   rope base 500000 and rope_freqs.weight as Llama
#                        3.1's converter writes it for factor 8
#      gen-rope-linear   rope.scaling linear, factor 4
#      gen-rope-yarn     rope.scaling yarn, factor 4 over an original
#                        context of 512
#      gen-rope-partial  rope.dimension_count 16 of head_dim 32, as qwen2
#                        (NEOX pairs, biases, tied: llama.cpp refuses a partial
#                        rotary for the llama architecture)
# 2. tools/llamacpp_logits.c (libllama only) writes each case's NAME.json and
#    NAME.logits.f32 here, with the settings of README.md, on the prompts of
#    the existing cases (the "prompt" of gen-llama-gqa-f32.ID.json), for the
#    llama3, linear and yarn files. llama.cpp refuses a partial rotary for the
#    llama, qwen2 and qwen3 graphs (n_rot must be head_dim there), so the
#    partial file is checked against test_forward's float64 reference.
set -e
LLAMA=${LLAMA:-/work/peer/llama.cpp}
KVPIN=${KVPIN:-./kvpin}
OUT=${OUT:-tests/data/golden}
MODELS=${MODELS:-tests/data/models}
mkdir -p build/rope-golden
cc -std=c11 -O1 -o build/rope-golden/llamacpp_logits tools/llamacpp_logits.c \
   -I"$LLAMA/include" -I"$LLAMA/ggml/include" -L"$LLAMA/build/bin" -lllama -lggml -lggml-base \
   -Wl,-rpath,"$LLAMA/build/bin" -lm
SHAPE="--preset tiny --layers 2 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --untied --seed 7007 \
  --tokenizer models/stories260K.gguf"
# shellcheck disable=SC2086 # SHAPE: words
"$KVPIN" mkmodel $SHAPE --rope-base 500000 --rope-freqs llama3:8 --name gen-rope-llama3 -o "$MODELS/gen-rope-llama3.gguf"
# shellcheck disable=SC2086
"$KVPIN" mkmodel $SHAPE --rope-scaling linear:4 --name gen-rope-linear -o "$MODELS/gen-rope-linear.gguf"
# shellcheck disable=SC2086
"$KVPIN" mkmodel $SHAPE --rope-scaling yarn:4:512 --name gen-rope-yarn -o "$MODELS/gen-rope-yarn.gguf"
"$KVPIN" mkmodel --preset qwen2-tiny --layers 2 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --seed 7007 \
  --tokenizer models/stories260K.gguf --rope-dims 16 --name gen-rope-partial -o "$MODELS/gen-rope-partial.gguf"
for id in lily story300; do
  python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompt"])' \
    "tests/data/golden/gen-llama-gqa-f32.$id.json" >build/rope-golden/$id.txt
done
# llama3's factors move the long wavelengths: a prompt of 283 positions turns them far enough to tell
build/rope-golden/llamacpp_logits "$MODELS/gen-rope-llama3.gguf" build/rope-golden/story300.txt "$OUT" story300
build/rope-golden/llamacpp_logits "$MODELS/gen-rope-linear.gguf" build/rope-golden/lily.txt "$OUT" lily
build/rope-golden/llamacpp_logits "$MODELS/gen-rope-yarn.gguf" build/rope-golden/lily.txt "$OUT" lily
