#!/bin/sh
# make_gptoss.sh - the gen-gpt-oss test models and their llama.cpp goldens.
#
# Run from the repository root after `make` (it needs ./kvpin) with a
# llama.cpp tree built with CMake in $LLAMA (default /work/peer/llama.cpp,
# commit de3ff815ea7d):
#
#   sh tests/data/golden/make_gptoss.sh
#
# 1. kvpin mkmodel writes gen-gpt-oss (preset gpt-oss-tiny: 4 layers, the
#    even ones a sliding window of 16, n_embd 64, 4 / 2 heads, head_dim 64,
#    8 experts of width 64 with 4 used per token, q/k/v and output biases,
#    sinks, YaRN factor 32 over an original context of 4096, untied; seed
#    7008; stories260K's vocabulary) in F32 and MXFP4 (the experts MXFP4,
#    the other matrices Q8_0, as llama-quantize's MXFP4_MOE) into
#    tests/data/models/. The same seed gives the same bytes on any machine
#    (mkmodel.h).
# 2. tools/llamacpp_logits.c (libllama only) writes each case's NAME.json and
#    NAME.logits.f32 here, with the settings of README.md. The prompts are
#    the texts of the existing cases (the "prompt" field of
#    gen-llama-gqa-f32.ID.json).
set -e
LLAMA=${LLAMA:-/work/peer/llama.cpp}
KVPIN=${KVPIN:-./kvpin}
OUT=${OUT:-tests/data/golden}
MODELS=${MODELS:-tests/data/models}
mkdir -p build/gptoss-golden
cc -std=c11 -O1 -o build/gptoss-golden/llamacpp_logits tools/llamacpp_logits.c \
   -I"$LLAMA/include" -I"$LLAMA/ggml/include" -L"$LLAMA/build/bin" -lllama -lggml -lggml-base \
   -Wl,-rpath,"$LLAMA/build/bin" -lm
for t in f32 mxfp4; do
  "$KVPIN" mkmodel --preset gpt-oss-tiny --type "$t" --seed 7008 --name gen-gpt-oss \
    --tokenizer models/stories260K.gguf -o "$MODELS/gen-gpt-oss-$t.gguf"
done
for id in lily json story300; do
  python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompt"])' \
    "tests/data/golden/gen-llama-gqa-f32.$id.json" >build/gptoss-golden/$id.txt
done
for t in f32 mxfp4; do
  for id in lily json story300; do
    build/gptoss-golden/llamacpp_logits "$MODELS/gen-gpt-oss-$t.gguf" build/gptoss-golden/$id.txt "$OUT" $id
  done
done
