/*
 * quant_more.h - private to src/quant*.c: the weight types Q4_1, Q5_0, Q5_1
 * and Q5_K, and the activation type Q8_1 that Q4_1 and Q5_1 are multiplied
 * with. quant.c and quant_avx2.c only hook these functions into their
 * dispatch switches and kernel tables; nothing outside the quant module
 * includes this file (the public contract stays quant.h).
 *
 * Block layouts, exactly llama.cpp's (ggml-common.h). All multi-byte fields
 * are little-endian; `half` is IEEE binary16.
 *
 *   Q4_1  (32 elements, 20 bytes)     x[i] = d * q[i] + m, q in 0..15
 *   +0  half d
 *   +2  half m
 *   +4  uint8 qs[16]   q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4   (j < 16)
 *
 *   Q5_0  (32 elements, 22 bytes)     x[i] = d * (q[i] - 16), q in 0..31
 *   +0  half d
 *   +2  uint8 qh[4]    h = qh as a little-endian uint32; bit i of h is bit 4 of q[i]
 *   +6  uint8 qs[16]   low 4 bits as in Q4_1:
 *                      q[j] = (qs[j] & 15) | (h >> j & 1) << 4
 *                      q[j+16] = (qs[j] >> 4) | (h >> (j+16) & 1) << 4
 *
 *   Q5_1  (32 elements, 24 bytes)     x[i] = d * q[i] + m, q in 0..31
 *   +0  half d
 *   +2  half m
 *   +4  uint8 qh[4]    as in Q5_0
 *   +8  uint8 qs[16]   as in Q5_0
 *
 *   Q8_1  (32 elements, 36 bytes; activations only, as llama.cpp uses it)
 *   +0  half d                        x[i] = d * qs[i]
 *   +2  half s         d * (qs[0] + ... + qs[31]), rounded to half: the
 *                      block sum that the "+ m" term of Q4_1/Q5_1 needs
 *   +4  int8 qs[32]
 *
 *   Q5_K  (256 elements = 8 sub-blocks of 32, 176 bytes)
 *   +0  half d         super-block scale of the 6-bit sub-block scales
 *   +2  half dmin      super-block scale of the 6-bit sub-block mins
 *   +4  uint8 scales[12]  sc[8], m[8] packed exactly as Q4_K's (quant.h)
 *   +16 uint8 qh[32]   bit 4 of the quants: for chunk c < 4 (64 elements), l < 32:
 *   +48 uint8 qs[128]    q[64c + l]      = (qs[32c + l] & 15) | (qh[l] >> 2c     & 1) << 4
 *                        q[64c + 32 + l] = (qs[32c + l] >> 4) | (qh[l] >> (2c+1) & 1) << 4
 *       x[i] = d * sc[i/32] * q[i] - dmin * m[i/32],  q in 0..31
 *
 * Dot products pair each weight type with the activation type llama.cpp
 * uses for it (kp_vec_dot_type): Q5_0 . Q8_0, Q4_1 . Q8_1, Q5_1 . Q8_1,
 * Q5_K . Q8_K. With Q8_1 the dot product of one block is
 *   d_w * d_a * sum(q_w * q_a) + m_w * s_a
 * (the stored s, not the exact sum, as in llama.cpp).
 */
#ifndef KP_QUANT_MORE_H
#define KP_QUANT_MORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"

#define KP_QK4_1 32
#define KP_QK5_0 32
#define KP_QK5_1 32
#define KP_QK8_1 32

typedef struct {
    uint16_t d; /* half */
    uint16_t m; /* half */
    uint8_t qs[KP_QK4_1 / 2];
} kp_block_q4_1;

typedef struct {
    uint16_t d; /* half */
    uint8_t qh[4];
    uint8_t qs[KP_QK5_0 / 2];
} kp_block_q5_0;

typedef struct {
    uint16_t d; /* half */
    uint16_t m; /* half */
    uint8_t qh[4];
    uint8_t qs[KP_QK5_1 / 2];
} kp_block_q5_1;

typedef struct {
    uint16_t d; /* half */
    uint16_t s; /* half: d * sum(qs) */
    int8_t qs[KP_QK8_1];
} kp_block_q8_1;

typedef struct {
    uint16_t d;    /* half: scale of the 6-bit scales */
    uint16_t dmin; /* half: scale of the 6-bit mins */
    uint8_t scales[12];
    uint8_t qh[256 / 8];
    uint8_t qs[256 / 2];
} kp_block_q5_K;

_Static_assert(sizeof(kp_block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(kp_block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(kp_block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(kp_block_q8_1) == 36, "Q8_1 block is 36 bytes");
_Static_assert(sizeof(kp_block_q5_K) == 176, "Q5_K block is 176 bytes");

/* ---- conversions (quant_more.c) ---------------------------------------- */

/* Encodes n floats (a multiple of t's block size, checked by the caller) as
 * t in {Q4_1, Q5_0, Q5_1, Q5_K, Q8_1} with llama.cpp's reference algorithm
 * (quantize_row_*_ref), byte for byte. Returns false, writing nothing, for
 * any other type. */
bool kp_qmore_quantize_row(kp_dtype t, const float *x, void *dst, int64_t n);

/* Decodes n elements (a multiple of the block size) of t in {Q4_1, Q5_0,
 * Q5_1, Q5_K, Q8_1}; false, writing nothing, for any other type. */
bool kp_qmore_dequantize_row(kp_dtype t, const void *src, float *dst, int64_t n);

/* The Q8_1 reference quantizer (quantize_act of Q4_1 and Q5_1 in the scalar
 * table; the AVX2 version produces the same bytes). */
void kp_qmore_quant_row_q8_1(const float *x, void *dst, int64_t n);

/* ---- scalar kernels (quant_more.c), signatures of kp_kernels ----------- */

void kp_qmore_vec_dot_q4_1_scalar(int64_t n, float *s, const void *w, const void *a);
void kp_qmore_vec_dot_q5_0_scalar(int64_t n, float *s, const void *w, const void *a);
void kp_qmore_vec_dot_q5_1_scalar(int64_t n, float *s, const void *w, const void *a);
void kp_qmore_vec_dot_q5_K_scalar(int64_t n, float *s, const void *w, const void *a);

void kp_qmore_tile_q4_1_scalar(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                               const void *a, size_t a_stride, float *out, size_t out_stride);
void kp_qmore_tile_q5_0_scalar(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                               const void *a, size_t a_stride, float *out, size_t out_stride);
void kp_qmore_tile_q5_1_scalar(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                               const void *a, size_t a_stride, float *out, size_t out_stride);
void kp_qmore_tile_q5_K_scalar(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                               const void *a, size_t a_stride, float *out, size_t out_stride);

/* ---- AVX2 + FMA + F16C kernels (quant_more_avx2.c; x86-64 builds only) -
 * Call only through the AVX2 table, which kp_kernels_avx2() hands out when
 * the CPU has all three extensions. */
#if defined(__x86_64__)
void kp_qmore_avx2_act_q8_1(const float *x, void *dst, int64_t n);

void kp_qmore_avx2_vec_dot_q4_1(int64_t n, float *s, const void *w, const void *a);
void kp_qmore_avx2_vec_dot_q5_0(int64_t n, float *s, const void *w, const void *a);
void kp_qmore_avx2_vec_dot_q5_1(int64_t n, float *s, const void *w, const void *a);
void kp_qmore_avx2_vec_dot_q5_K(int64_t n, float *s, const void *w, const void *a);

void kp_qmore_avx2_tile_q4_1(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, float *out, size_t out_stride);
void kp_qmore_avx2_tile_q5_0(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, float *out, size_t out_stride);
void kp_qmore_avx2_tile_q5_1(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, float *out, size_t out_stride);
void kp_qmore_avx2_tile_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, float *out, size_t out_stride);

/* gemm of the avx2 table. aux: for Q5_0 (Q8_0 activations) NULL or the
 * activation rows' kp_q8_0_aux rows, as quant.h describes; ignored for the
 * others. Each output is bit for bit the same whatever the call's shape,
 * and equal to what dot_tile of the same type computes for it. */
void kp_qmore_avx2_gemm_q4_1(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
void kp_qmore_avx2_gemm_q5_0(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
void kp_qmore_avx2_gemm_q5_1(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
void kp_qmore_avx2_gemm_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);

/* gemm of the avx512vnni table (vpdpbusd on 256-bit vectors): the same
 * results as the avx2 gemm of the type, bit for bit. Call only through
 * that table, which kp_kernels_avx512vnni() hands out when the CPU has
 * AVX512 F/VL/BW and VNNI besides AVX2, FMA and F16C. */
void kp_qmore_vnni_gemm_q4_1(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
void kp_qmore_vnni_gemm_q5_0(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
void kp_qmore_vnni_gemm_q5_1(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
void kp_qmore_vnni_gemm_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride);
#endif

#endif
