#!/bin/sh
# Rebuilds the llama.cpp reference data in this folder (see README.md).
# Needs ./kvpin (make) and bench/node_modules (cd bench && npm ci). Run from the
# repository root: sh tests/data/quant_more/make.sh
set -eu
LIB=bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
OUT=tests/data/quant_more
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cc -O1 -o "$TMP/ref" tools/llamacpp_quant_ref.c -ldl -lm

"$TMP/ref" vectors "$LIB" "$OUT/ref_vectors.bin"

# name | kvpin mkmodel arguments (F32) | llama_ftype values to quantize to
#   smollm2-1l: SmolLM2-135M's shape with one layer (576-wide rows, ffn_down 1536)
#   odd-80:     rows of 80 (not a multiple of 32) next to ffn_down rows of 256
: > "$TMP/table.txt"
run_case() {
    name=$1 args=$2 ftypes=$3
    ./kvpin mkmodel -o "$TMP/$name-f32.gguf" --tokenizer models/stories260K.gguf $args 2>/dev/null
    echo "model $name ftype 0" >> "$TMP/table.txt"
    "$TMP/ref" table "$LIB" "$TMP/$name-f32.gguf" >> "$TMP/table.txt"
    for ft in $ftypes; do
        "$TMP/ref" quantize "$LIB" "$TMP/$name-f32.gguf" "$TMP/$name-$ft.gguf" "$ft" > "$TMP/log.txt" 2>&1 ||
            { cat "$TMP/log.txt"; exit 1; }
        echo "model $name ftype $ft" >> "$TMP/table.txt"
        "$TMP/ref" table "$LIB" "$TMP/$name-$ft.gguf" >> "$TMP/table.txt"
    done
}
run_case smollm2-1l "--preset smollm2-135m --layers 1 --seed 11" "3 8 9 15 17 18"
run_case odd-80 "--preset tiny --layers 1 --embd 80 --heads 2 --kv-heads 1 --ff 256 --seed 12" "2 15"
cp "$TMP/table.txt" "$OUT/llama-quantize.txt"
