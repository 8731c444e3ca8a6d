#!/bin/sh
# make_qwen35moe.sh - the gen-qwen35moe test models and their llama.cpp goldens.
#
# Run from the repository root after `make` (it needs ./kvpin) with a
# llama.cpp tree built with CMake in $LLAMA (default /work/peer/llama.cpp,
# commit de3ff815ea7d):
#
#   sh tests/data/golden/make_qwen35moe.sh
#
# 1. kvpin mkmodel writes gen-qwen35moe (preset qwen35moe-tiny: qwen35-tiny's
#    8 layers, 6 gated delta-net layers and the gated attention layers 3
#    and 7, n_embd 64, 4 / 2 heads, head_dim 32 with rope on 8 dims;
#    delta-net conv 4, 2 q/k heads and 4 value heads of 16; in every layer
#    8 experts of width 32 with 3 used per token and a gated shared expert
#    of width 32; untied; seed 3575; stories260K's vocabulary) in F32 and
#    Q8_0 into tests/data/models/. The same seed gives the same bytes on
#    any machine (mkmodel.h).
# 2. tools/llamacpp_logits.c (libllama only, mkmodel_goldens.sh) writes each
#    case's NAME.json and NAME.logits.f32 here, with the settings of
#    README.md. The prompts are the texts of the existing cases (the
#    "prompt" field of gen-llama-gqa-f32.ID.json); story300 is longer than
#    one of kvpin's prefill batches.
set -e
. tests/data/golden/mkmodel_goldens.sh
mkmodel_goldens qwen35moe-tiny 3575 gen-qwen35moe "f32 q8_0" "lily json story300"
