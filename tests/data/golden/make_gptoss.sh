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
# 2. tools/llamacpp_logits.c (libllama only, mkmodel_goldens.sh) writes each case's NAME.json and
#    NAME.logits.f32 here, with the settings of README.md. The prompts are
#    the texts of the existing cases (the "prompt" field of
#    gen-llama-gqa-f32.ID.json).
set -e
. tests/data/golden/mkmodel_goldens.sh
mkmodel_goldens gpt-oss-tiny 7008 gen-gpt-oss "f32 mxfp4" "lily json story300"
