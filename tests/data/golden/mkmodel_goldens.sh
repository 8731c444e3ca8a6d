#!/bin/sh
# mkmodel_goldens.sh - what make_qwen3moe.sh and make_gptoss.sh share: kvpin
# mkmodel writes a preset in some weight types, then tools/llamacpp_logits.c
# (libllama only) writes each case's NAME.json and NAME.logits.f32 with the
# settings of README.md, on the texts of the existing cases (the "prompt"
# field of gen-llama-gqa-f32.ID.json).
#
#   mkmodel_goldens PRESET SEED NAME "TYPES" "PROMPT_IDS" ["TYPES2" "PROMPT_IDS2"]
#
# writes $MODELS/NAME-T.gguf for every T of TYPES and TYPES2 (lower case),
# then the goldens of TYPES x PROMPT_IDS and of TYPES2 x PROMPT_IDS2 into
# $OUT. Run from the repository root after `make`; $LLAMA is a llama.cpp
# tree built with CMake (default /work/peer/llama.cpp, commit de3ff815ea7d).
mkmodel_goldens() {
  LLAMA=${LLAMA:-/work/peer/llama.cpp}
  KVPIN=${KVPIN:-./kvpin}
  OUT=${OUT:-tests/data/golden}
  MODELS=${MODELS:-tests/data/models}
  tmp=build/$3-golden
  mkdir -p "$tmp"
  cc -std=c11 -O1 -o "$tmp/llamacpp_logits" tools/llamacpp_logits.c \
     -I"$LLAMA/include" -I"$LLAMA/ggml/include" -L"$LLAMA/build/bin" -lllama -lggml -lggml-base \
     -Wl,-rpath,"$LLAMA/build/bin" -lm
  for t in $4 $6; do
    "$KVPIN" mkmodel --preset "$1" --type "$t" --seed "$2" --name "$3" \
      --tokenizer models/stories260K.gguf -o "$MODELS/$3-$t.gguf"
  done
  for id in $5 $7; do
    python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompt"])' \
      "tests/data/golden/gen-llama-gqa-f32.$id.json" >"$tmp/$id.txt"
  done
  for t in $4; do
    for id in $5; do "$tmp/llamacpp_logits" "$MODELS/$3-$t.gguf" "$tmp/$id.txt" "$OUT" "$id"; done
  done
  for t in $6; do
    for id in $7; do "$tmp/llamacpp_logits" "$MODELS/$3-$t.gguf" "$tmp/$id.txt" "$OUT" "$id"; done
  done
}
