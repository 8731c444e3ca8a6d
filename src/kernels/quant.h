/*
 * quant.h - element types in llama.cpp's exact byte layouts, and the
 * dot-product kernels that use weights in place (straight from the mmap).
 *
 * What this module is: conversions (FP16, BF16), reference quantizers that
 * produce the same bytes as llama-quantize --pure, dequantizers, and
 * tables of compute kernels (portable C, AVX2, AVX2 + AVX-512/VNNI) behind
 * one interface. What it is not: a matmul scheduler. Callers (the forward
 * pass) split a matrix product into blocks of rows and threads; a kernel
 * sees plain arrays only.
 *
 * Types with kernels (dtype.h `has_kernels`): F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 weights, and the activation types
 * Q8_K and Q8_1. Their block layouts, exactly llama.cpp's, are drawn in
 * quant_blocks.h next to their structs.
 *
 * Row pointers handed to the kernels must be aligned to the block's
 * natural alignment (1 byte for MXFP4, 2 bytes for F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K and
 * Q4_1/Q5_0/Q5_1/Q5_K/Q8_1, 4 bytes for F32 and Q8_K); GGUF tensor data
 * always is.
 */
#ifndef KP_QUANT_H
#define KP_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/dtype.h"

/* ---- scalar conversions ------------------------------------------------ */

/* IEEE binary16 -> float, exact for every number; a NaN keeps its sign and
 * payload and comes out quiet (as the F16C instruction converts it). */
float kp_fp16_to_fp32(uint16_t h);

/* float -> binary16, round to nearest even; overflow gives +-inf; a NaN
 * stays a NaN with the quiet bit set and its top payload bits kept (the
 * same bits the F16C instruction produces). */
uint16_t kp_fp32_to_fp16(float f);

/* bfloat16 -> float, exact. */
float kp_bf16_to_fp32(uint16_t h);

/* float -> bfloat16, round to nearest even, subnormals kept (not flushed);
 * a NaN is made quiet (bit 6 set) with its sign and top payload bits, as
 * ggml does. */
uint16_t kp_fp32_to_bf16(float f);

/* Row forms of the FP16 conversions: n elements, any n >= 0. */
void kp_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n);
void kp_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n);

/* ---- rows of any supported type ---------------------------------------- */

/* Decodes n elements of type t at src into floats at dst. t is a type with
 * kernels, Q8_K or Q8_1. Returns false, writing nothing, when t has no
 * dequantizer or n is not a multiple of t's block size (n >= 0). */
bool kp_dequantize_row(kp_dtype t, const void *src, float *dst, int64_t n);

/* Encodes n floats as type t, with llama.cpp's reference algorithm, so the
 * bytes equal what llama-quantize --pure (no importance matrix) writes:
 * F32 (copy), F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q5_K
 * (weighted min/scale searches), Q6_K (weighted scale search), MXFP4
 * (a power-of-two scale from the block's largest |x|, nearest codes), and the
 * activation types Q8_K and Q8_1. dst holds
 * kp_dtype_row_size(t, n) bytes. Returns false, writing nothing, for other
 * types or when n is not a multiple of the block size. */
bool kp_quantize_row(kp_dtype t, const float *src, void *dst, int64_t n);

/* The activation type a weight type's dot product consumes, as in llama.cpp:
 * F32->F32, F16->F16, BF16->BF16, Q8_0->Q8_0, Q4_0->Q8_0, Q5_0->Q8_0,
 * Q4_1->Q8_1, Q5_1->Q8_1, Q4_K->Q8_K, Q5_K->Q8_K, Q6_K->Q8_K, MXFP4->Q8_0. Any other
 * type: KP_DTYPE_COUNT_ (no kernel). */
kp_dtype kp_vec_dot_type(kp_dtype w);

/* ---- per-block summaries of Q8_0 activation rows -------------------------- */

/*
 * What gemm kernels need per block of a Q8_0 activation row besides the
 * quants, computed once per row instead of once per kernel call:
 *   d     the block's FP16 scale as float (exact)
 *   bias  -128 * (sum of the block's 32 quants), exact: the term that a
 *         dot product of weights stored with a +128 offset subtracts
 */
typedef struct {
    float d;
    int32_t bias;
} kp_q8_0_aux;

/* Fills aux[0 .. n/32) for the Q8_0 row a of n elements (n a multiple of
 * 32, n >= 0). Pure; the rows may be any Q8_0 data. */
void kp_q8_0_aux_row(const void *a, kp_q8_0_aux *aux, int64_t n);

/* ---- kernel tables ------------------------------------------------------ */

/*
 * One table per instruction set. Entries indexed by a weight type are NULL
 * for types without kernels. All functions are pure: they read their inputs,
 * write only their outputs, keep no state, and may run concurrently.
 * n is the row length in elements (a multiple of the block size of the
 * weight type; any n >= 1 for F32/F16/BF16). Weight rows are borrowed
 * pointers into the model mapping; nothing is copied or freed.
 *
 * Two tables give results equal within float rounding (summation order
 * differs); quantize_act is bit-identical in all for finite inputs, so a
 * model's quantized activations do not depend on the table in use. Within
 * one table, gemm (and dot_tile, for types that have a gemm) gives each
 * output bit for bit the same value whatever the shape of the call (nr, nc,
 * which rows and columns come along), so a batch split differently
 * computes the same numbers. NaN or inf inputs produce unspecified (but
 * memory-safe) outputs.
 */
typedef struct kp_kernels {
    const char *name; /* "scalar", "avx2", "avx512vnni" */

    /* Converts an activation row of n floats to kp_vec_dot_type(w) for the
     * weight type w used as index: F32 copy, F16/BF16 rounding, Q8_0/Q8_K
     * quantization (the reference quantizers). dst holds
     * kp_dtype_row_size(kp_vec_dot_type(w), n) bytes. */
    void (*quantize_act[KP_DTYPE_COUNT_])(const float *x, void *dst, int64_t n);

    /* *s = dot product of n elements: weight row w (type = index) with
     * activation row a (type kp_vec_dot_type(index)). */
    void (*vec_dot[KP_DTYPE_COUNT_])(int64_t n, float *s, const void *w, const void *a);

    /* Matrix-matrix micro-kernel for batched prefill. For r < nr, c < nc
     * (1 <= nr, nc <= 4):
     *   out[c*out_stride + r] = dot(weight row r at (char *)w + r*w_stride,
     *                               activation row c at (char *)a + c*a_stride)
     * Strides are in bytes, out_stride in floats. Each weight block is
     * loaded and decoded once and used for all nc activation rows. */
    void (*dot_tile[KP_DTYPE_COUNT_])(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                                      const void *a, size_t a_stride, float *out,
                                      size_t out_stride);

    /* Whole-block matrix product: the same result as dot_tile, for any
     * nr, nc >= 1 (out_stride >= nr; no other element of out is written).
     * The kernel picks its register tile, loop order and what it converts
     * up front (it may repack the nr weight rows), so a caller hands it a
     * thread's whole share at once: a few weight rows, kept in L1 while
     * all the tokens of the batch stream past them. Summation order may
     * differ with nr and nc; results agree within float rounding.
     * aux is NULL, or, for Q8_0 activations (weights Q8_0, Q4_0 and Q5_0), the
     * kp_q8_0_aux rows of the nc activation rows, row c at
     * (char *)aux + c*aux_stride; with it the kernel skips converting
     * scales and summing quants itself (same results). Ignored for other
     * types. NULL entry where a table has no gemm for the type: callers
     * then cover the block with dot_tile calls of at most 4 x 4. */
    void (*gemm[KP_DTYPE_COUNT_])(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                                  const void *a, size_t a_stride, const void *aux,
                                  size_t aux_stride, float *out, size_t out_stride);

    /*
     * Repacked weights, for the types a table has a layout of its own for
     * (pack_rows[t] > 0, else 0 and NULL entries). The caller copies a
     * weight matrix once (at load) into groups of pack_rows rows, each
     * group pack_rows x row_size bytes, the matrix padded with zero rows to
     * whole groups (kp_pack_bytes), and then calls gemm_packed instead of
     * gemm: it reads a group's blocks as one contiguous stream in the order
     * the kernel consumes them, which decode (one to a few activation rows,
     * bound by the weight read) needs. gemm_packed gives every output bit
     * for bit the value gemm gives on the rows in place, for every call
     * shape, so a model may use either.
     *
     * pack_k[t]: the layout takes rows whose length n is a multiple of it
     * (the block size, or 16 for F16/BF16); other rows stay in place.
     *
     * pack: nr >= 1 rows of n elements at w (w_stride bytes apart) into
     * dst, kp_pack_bytes(t, n, nr, pack_rows[t]) bytes (no alignment
     * needed; 64 bytes is best). gemm_packed: as gemm, for the nr rows
     * from the first row of the group at wp (wp = dst + g x group bytes);
     * rows of the padding are computed and never stored.
     */
    int pack_rows[KP_DTYPE_COUNT_];
    int pack_k[KP_DTYPE_COUNT_];
    void (*pack[KP_DTYPE_COUNT_])(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst);
    void (*gemm_packed[KP_DTYPE_COUNT_])(int64_t n, int nr, int nc, const void *wp, const void *a,
                                         size_t a_stride, const void *aux, size_t aux_stride, float *out,
                                         size_t out_stride);

    /* Attention helpers for KV rows stored as F32 or F16 (any n >= 0). */
    float (*dot_f32)(int64_t n, const float *x, const float *y);
    float (*dot_f32_f16)(int64_t n, const float *x, const uint16_t *y);
    void (*axpy_f32)(int64_t n, float a, const float *x, float *y);    /* y += a*x */
    void (*axpy_f16)(int64_t n, float a, const uint16_t *x, float *y); /* y += a*x */
} kp_kernels;

/* Bytes of nr rows of n elements of type t repacked in groups of
 * pack_rows rows (a kp_kernels pack layout): whole groups of pack_rows x
 * kp_dtype_row_size(t, n) bytes. 0 when pack_rows <= 0. */
size_t kp_pack_bytes(kp_dtype t, int64_t n, int64_t nr, int pack_rows);

/* The portable C table; always available. Static storage, never freed. */
const kp_kernels *kp_kernels_scalar(void);

/* The fastest table the running CPU supports (checked with
 * __builtin_cpu_supports on each call, cheap): avx512bf16, else avx512vnni, else avx2
 * (AVX2+FMA+F16C), else the scalar table. On non-x86-64 builds this is
 * always the scalar table. */
const kp_kernels *kp_kernels_best(void);

/* The AVX2 table if this build contains it and the CPU supports it, else
 * NULL. For tests and benchmarks that compare the tables. */
const kp_kernels *kp_kernels_avx2(void);

/* The avx2 table with gemm kernels that use AVX-512: vpdpbusd (VNNI) on
 * 256-bit vectors for the integer types, 512-bit FMA for F32/F16/BF16
 * (whose dot_tile it also replaces), if this build contains it and the CPU
 * has AVX2, FMA, F16C, AVX512 F/VL/BW and VNNI, else NULL. Same results as
 * the avx2 table for the integer types; within float rounding for the
 * float types. */
const kp_kernels *kp_kernels_avx512vnni(void);

/* The avx512vnni table whose BF16 weights multiply in bfloat16 dot
 * products (VDPBF16PS; quant_bf16.c) when the CPU has AVX512_BF16 besides,
 * else NULL. Its BF16 results are within float rounding of the avx512vnni
 * table's (the products are exact; only the order of the sums differs);
 * every other type is the same. kp_kernels_best prefers it. */
const kp_kernels *kp_kernels_avx512bf16(void);

#endif
