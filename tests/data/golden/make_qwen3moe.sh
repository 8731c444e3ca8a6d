#!/bin/sh
# make_qwen3moe.sh - the gen-qwen3moe test models and their llama.cpp goldens.
#
# Run from the repository root after `make` (it needs ./kvpin) with a
# llama.cpp tree built with CMake in $LLAMA (default /work/peer/llama.cpp,
# commit de3ff815ea7d):
#
#   sh tests/data/golden/make_qwen3moe.sh
#
# 1. kvpin mkmodel writes gen-qwen3moe (preset qwen3moe-tiny: 2 layers,
#    n_embd 128, 4 / 2 heads, head_dim 32, 8 experts of width 64 with 3
#    used per token, untied; seed 6006; stories260K's vocabulary) in F32,
#    F16 and Q8_0 into tests/data/models/. The same seed gives the same
#    bytes on any machine (mkmodel.h).
# 2. tools/llamacpp_logits.c (libllama only) writes each case's NAME.json and
#    NAME.logits.f32 here, with the settings of README.md. The prompts are
#    the texts of the existing cases (the "prompt" field of
#    gen-llama-gqa-f32.ID.json).
set -e
LLAMA=${LLAMA:-/work/peer/llama.cpp}
KVPIN=${KVPIN:-./kvpin}
OUT=${OUT:-tests/data/golden}
MODELS=${MODELS:-tests/data/models}
mkdir -p build/qwen3moe-golden
cc -std=c11 -O1 -o build/qwen3moe-golden/llamacpp_logits tools/llamacpp_logits.c \
   -I"$LLAMA/include" -I"$LLAMA/ggml/include" -L"$LLAMA/build/bin" -lllama -lggml -lggml-base \
   -Wl,-rpath,"$LLAMA/build/bin" -lm
for t in f32 f16 q8_0; do
  "$KVPIN" mkmodel --preset qwen3moe-tiny --type "$t" --seed 6006 --name gen-qwen3moe \
    --tokenizer models/stories260K.gguf -o "$MODELS/gen-qwen3moe-$t.gguf"
done
for id in lily json story300; do
  python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompt"])' \
    "tests/data/golden/gen-llama-gqa-f32.$id.json" >build/qwen3moe-golden/$id.txt
done
for t in f32 q8_0; do
  for id in lily json story300; do
    build/qwen3moe-golden/llamacpp_logits "$MODELS/gen-qwen3moe-$t.gguf" build/qwen3moe-golden/$id.txt "$OUT" $id
  done
done
for id in lily json; do
  build/qwen3moe-golden/llamacpp_logits "$MODELS/gen-qwen3moe-f16.gguf" build/qwen3moe-golden/$id.txt "$OUT" $id
done
