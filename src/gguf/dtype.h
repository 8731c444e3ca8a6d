/*
 * dtype.h - tensor element types, numbered exactly as ggml/GGUF numbers them.
 *
 * Every type a GGUF file may name is listed with its block geometry, so the
 * GGUF reader can size and bounds-check any tensor, even one whose kernels
 * kvpin lacks (`kvpin info` still describes such a file). `has_kernels` says
 * whether quant.h can compute with the type.
 *
 * A row of n elements of a block type occupies (n / block_size) * type_size
 * bytes; n must be a multiple of block_size.
 */
#ifndef KP_DTYPE_H
#define KP_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KP_DTYPE_F32 = 0,
    KP_DTYPE_F16 = 1,
    KP_DTYPE_Q4_0 = 2,
    KP_DTYPE_Q4_1 = 3,
    KP_DTYPE_Q5_0 = 6,
    KP_DTYPE_Q5_1 = 7,
    KP_DTYPE_Q8_0 = 8,
    KP_DTYPE_Q8_1 = 9,
    KP_DTYPE_Q2_K = 10,
    KP_DTYPE_Q3_K = 11,
    KP_DTYPE_Q4_K = 12,
    KP_DTYPE_Q5_K = 13,
    KP_DTYPE_Q6_K = 14,
    KP_DTYPE_Q8_K = 15,
    KP_DTYPE_IQ2_XXS = 16,
    KP_DTYPE_IQ2_XS = 17,
    KP_DTYPE_IQ3_XXS = 18,
    KP_DTYPE_IQ1_S = 19,
    KP_DTYPE_IQ4_NL = 20,
    KP_DTYPE_IQ3_S = 21,
    KP_DTYPE_IQ2_S = 22,
    KP_DTYPE_IQ4_XS = 23,
    KP_DTYPE_I8 = 24,
    KP_DTYPE_I16 = 25,
    KP_DTYPE_I32 = 26,
    KP_DTYPE_I64 = 27,
    KP_DTYPE_F64 = 28,
    KP_DTYPE_IQ1_M = 29,
    KP_DTYPE_BF16 = 30,
    KP_DTYPE_TQ1_0 = 34,
    KP_DTYPE_TQ2_0 = 35,
    KP_DTYPE_MXFP4 = 39,
    KP_DTYPE_COUNT_ = 40 /* one past the largest id; not a type */
} kp_dtype;

typedef struct {
    const char *name;   /* "Q4_K" */
    uint32_t block_size; /* elements per block (1 for plain types) */
    uint32_t type_size;  /* bytes per block */
    bool has_kernels;    /* quant.h implements dequantize + dot product */
} kp_dtype_info;

/* Traits of type id `id`, or NULL when GGUF/ggml define no such type. */
const kp_dtype_info *kp_dtype_get(uint32_t id);

/* Name of a type id, "?" for an unknown one. */
const char *kp_dtype_name(uint32_t id);

/* Bytes of a row of n elements; 0 when id is unknown or n is not a multiple
 * of the block size. */
size_t kp_dtype_row_size(uint32_t id, int64_t n);

/* Parses a case-insensitive type name ("q8_0", "F16"); returns false if unknown. */
bool kp_dtype_parse(const char *name, kp_dtype *out);

#endif
