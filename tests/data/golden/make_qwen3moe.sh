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
# 2. tools/llamacpp_logits.c (libllama only, mkmodel_goldens.sh) writes each case's NAME.json and
#    NAME.logits.f32 here, with the settings of README.md. The prompts are
#    the texts of the existing cases (the "prompt" field of
#    gen-llama-gqa-f32.ID.json).
set -e
. tests/data/golden/mkmodel_goldens.sh
mkmodel_goldens qwen3moe-tiny 6006 gen-qwen3moe "f32 q8_0" "lily json story300" "f16" "lily json"
