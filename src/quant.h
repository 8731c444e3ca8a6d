/*
 * quant.h - element types in llama.cpp's exact byte layouts, and the
 * dot-product kernels that use weights in place (straight from the mmap).
 *
 * What this module is: conversions (FP16, BF16), reference quantizers that
 * produce the same bytes as llama-quantize --pure, dequantizers, and two
 * tables of compute kernels (portable C and AVX2) behind one interface.
 * What it is not: a matmul scheduler. Callers (the forward pass) split a
 * matrix product into tiles and threads; a kernel sees plain arrays only.
 *
 * Types with kernels (dtype.h `has_kernels`) and their block layouts.
 * All multi-byte fields are little-endian; `half` is IEEE binary16.
 *
 *   F32, F16, BF16: one element per "block" (4, 2, 2 bytes).
 *
 *   Q8_0  (32 elements, 34 bytes)     x[i] = d * qs[i]
 *   +0  half d
 *   +2  int8 qs[32]
 *
 *   Q4_0  (32 elements, 18 bytes)     x[i] = d * (q[i] - 8), q in 0..15
 *   +0  half d
 *   +2  uint8 qs[16]   q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4   (j < 16)
 *
 *   Q4_K  (256 elements = 8 sub-blocks of 32, 144 bytes)
 *   +0  half d         super-block scale of the 6-bit sub-block scales
 *   +2  half dmin      super-block scale of the 6-bit sub-block mins
 *   +4  uint8 scales[12]  8 scales sc[j] and 8 mins m[j], 6 bits each:
 *         j < 4:  sc[j] = scales[j] & 63          m[j] = scales[j+4] & 63
 *         j >= 4: sc[j] = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4
 *                 m[j]  = (scales[j+4] >> 4) | (scales[j]   >> 6) << 4
 *   +16 uint8 qs[128]  4-bit quants; for chunk c < 4 (64 elements) and l < 32:
 *         q[64c + l] = qs[32c + l] & 15,  q[64c + 32 + l] = qs[32c + l] >> 4
 *       x[i] = d * sc[i/32] * q[i] - dmin * m[i/32]
 *
 *   Q6_K  (256 elements = 16 sub-blocks of 16, 210 bytes)
 *   +0   uint8 ql[128]  low 4 bits      for half h < 2, l < 32 (base = 128h):
 *   +128 uint8 qh[64]   high 2 bits       q[base+l]    = ql[64h+l] & 15    | (qh[32h+l] >> 0 & 3) << 4
 *   +192 int8 scales[16]                  q[base+l+32] = ql[64h+l+32] & 15 | (qh[32h+l] >> 2 & 3) << 4
 *   +208 half d                           q[base+l+64] = ql[64h+l] >> 4    | (qh[32h+l] >> 4 & 3) << 4
 *                                         q[base+l+96] = ql[64h+l+32] >> 4 | (qh[32h+l] >> 6 & 3) << 4
 *       x[i] = d * scales[i/16] * (q[i] - 32)
 *
 *   Q8_K  (256 elements, 292 bytes; activations only, never in files)
 *   +0   float d
 *   +4   int8 qs[256]      x[i] = d * qs[i]
 *   +260 int16 bsums[16]   bsums[j] = sum of qs[16j .. 16j+15]
 *
 * Row pointers handed to the kernels must be aligned to the block's
 * natural alignment (2 bytes for F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K, 4 bytes for
 * F32 and Q8_K); GGUF tensor data always is.
 */
#ifndef KP_QUANT_H
#define KP_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

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
 * kernels, or Q8_K. Returns false, writing nothing, when t has no
 * dequantizer or n is not a multiple of t's block size (n >= 0). */
bool kp_dequantize_row(kp_dtype t, const void *src, float *dst, int64_t n);

/* Encodes n floats as type t, with llama.cpp's reference algorithm, so the
 * bytes equal what llama-quantize --pure (no importance matrix) writes:
 * F32 (copy), F16, BF16, Q8_0, Q4_0, Q4_K (weighted min/scale search),
 * Q6_K (weighted scale search) and Q8_K. dst holds
 * kp_dtype_row_size(t, n) bytes. Returns false, writing nothing, for other
 * types or when n is not a multiple of the block size. */
bool kp_quantize_row(kp_dtype t, const float *src, void *dst, int64_t n);

/* The activation type a weight type's dot product consumes, as in llama.cpp:
 * F32->F32, F16->F16, BF16->BF16, Q8_0->Q8_0, Q4_0->Q8_0, Q4_K->Q8_K,
 * Q6_K->Q8_K. Any other type: KP_DTYPE_COUNT_ (no kernel). */
kp_dtype kp_vec_dot_type(kp_dtype w);

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
 * differs); quantize_act is bit-identical in both for finite inputs, so a
 * model's quantized activations do not depend on the table in use. NaN or
 * inf inputs produce unspecified (but memory-safe) outputs.
 */
typedef struct kp_kernels {
    const char *name; /* "scalar", "avx2" */

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

    /* Attention helpers for KV rows stored as F32 or F16 (any n >= 0). */
    float (*dot_f32)(int64_t n, const float *x, const float *y);
    float (*dot_f32_f16)(int64_t n, const float *x, const uint16_t *y);
    void (*axpy_f32)(int64_t n, float a, const float *x, float *y);    /* y += a*x */
    void (*axpy_f16)(int64_t n, float a, const uint16_t *x, float *y); /* y += a*x */
} kp_kernels;

/* The portable C table; always available. Static storage, never freed. */
const kp_kernels *kp_kernels_scalar(void);

/* The AVX2+FMA+F16C table when the running CPU has all three (checked with
 * __builtin_cpu_supports on each call, cheap), else the scalar table. On
 * non-x86-64 builds this is always the scalar table. */
const kp_kernels *kp_kernels_best(void);

/* The AVX2 table if this build contains it and the CPU supports it, else
 * NULL. For tests and benchmarks that compare the two tables. */
const kp_kernels *kp_kernels_avx2(void);

#endif
