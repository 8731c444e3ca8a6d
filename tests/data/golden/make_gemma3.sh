#!/bin/sh
# make_gemma3.sh - the gen-gemma3 test models and their llama.cpp goldens.
#
# Run from the repository root after `make` (it needs ./kvpin) with a
# llama.cpp tree built with CMake in $LLAMA (default /work/peer/llama.cpp,
# commit de3ff815ea7d):
#
#   sh tests/data/golden/make_gemma3.sh
#
# 1. kvpin mkmodel writes gen-gemma3 (preset gemma3-tiny: 6 layers, the
#    first 5 with a sliding window of 16 positions, n_embd 64, 2 / 1 heads,
#    head_dim 32, n_ff 128, tied; seed 5005; stories260K's vocabulary) in
#    F32, F16, Q8_0 and Q4_0 into tests/data/models/. The same seed gives
#    the same bytes on any machine (mkmodel.h).
# 2. tools/llamacpp_logits.c (libllama only) writes each case's NAME.json and
#    NAME.logits.f32 here, with the settings of README.md. The prompts are
#    the texts of the existing cases (the "prompt" field of
#    gen-llama-gqa-f32.ID.json).
set -e
LLAMA=${LLAMA:-/work/peer/llama.cpp}
KVPIN=${KVPIN:-./kvpin}
OUT=tests/data/golden
mkdir -p build/gemma3-golden
cc -std=c11 -O1 -o build/gemma3-golden/llamacpp_logits tools/llamacpp_logits.c \
   -I"$LLAMA/include" -I"$LLAMA/ggml/include" -L"$LLAMA/build/bin" -lllama -lggml -lggml-base \
   -Wl,-rpath,"$LLAMA/build/bin" -lm
for t in f32 f16 q8_0 q4_0; do
  "$KVPIN" mkmodel --preset gemma3-tiny --type "$t" --seed 5005 --name gen-gemma3 \
    --tokenizer models/stories260K.gguf -o tests/data/models/gen-gemma3-$t.gguf
done
for id in lily json story300; do
  python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompt"])' \
    "$OUT/gen-llama-gqa-f32.$id.json" >build/gemma3-golden/$id.txt
done
for t in f32 f16 q8_0; do
  for id in lily json story300; do
    build/gemma3-golden/llamacpp_logits tests/data/models/gen-gemma3-$t.gguf build/gemma3-golden/$id.txt "$OUT" $id
  done
done
build/gemma3-golden/llamacpp_logits tests/data/models/gen-gemma3-q4_0.gguf build/gemma3-golden/json.txt "$OUT" json
