/*
 * quant_avx2.h - private to src/kernels/: the AVX2 + FMA + F16C kernels of
 * quant_avx2.c that the avx512vnni table (quant_avx512.c) shares with the
 * avx2 table, and the list of those shared entries. Nothing outside
 * src/kernels/ includes this file.
 *
 * Each function has the signature and contract of its kp_kernels entry
 * (quant.h); the suffix names the weight type the entry is indexed by
 * (act_*: the activation type produced). They exist only in x86-64 builds
 * and may run only on a CPU with AVX2, FMA and F16C.
 */
#ifndef KP_QUANT_AVX2_H
#define KP_QUANT_AVX2_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"

#if defined(__x86_64__)

/* quantize_act: bit-identical to quant_ref.c's for finite inputs */
void kp_avx2_act_f32(const float *x, void *dst, int64_t n);
void kp_avx2_act_f16(const float *x, void *dst, int64_t n);
void kp_avx2_act_bf16(const float *x, void *dst, int64_t n);
void kp_avx2_act_q8_0(const float *x, void *dst, int64_t n);
void kp_avx2_act_q8_1(const float *x, void *dst, int64_t n);
void kp_avx2_act_q8_K(const float *x, void *dst, int64_t n);

#define KP_AVX2_VEC_DOT(t) void kp_avx2_vec_dot_##t(int64_t n, float *s, const void *w, const void *a);
#define KP_AVX2_DOT_TILE(t)                                                                                      \
    void kp_avx2_dot_tile_##t(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,         \
                              size_t a_stride, float *out, size_t out_stride);
KP_AVX2_VEC_DOT(f32)
KP_AVX2_VEC_DOT(f16)
KP_AVX2_VEC_DOT(bf16)
KP_AVX2_VEC_DOT(q8_0)
KP_AVX2_VEC_DOT(q4_0)
KP_AVX2_VEC_DOT(q4_1)
KP_AVX2_VEC_DOT(q5_0)
KP_AVX2_VEC_DOT(q5_1)
KP_AVX2_VEC_DOT(q4_K)
KP_AVX2_VEC_DOT(q5_K)
KP_AVX2_VEC_DOT(q6_K)
KP_AVX2_VEC_DOT(mxfp4)
KP_AVX2_DOT_TILE(q8_0)
KP_AVX2_DOT_TILE(q4_0)
KP_AVX2_DOT_TILE(q4_1)
KP_AVX2_DOT_TILE(q5_0)
KP_AVX2_DOT_TILE(q5_1)
KP_AVX2_DOT_TILE(q4_K)
KP_AVX2_DOT_TILE(q5_K)
KP_AVX2_DOT_TILE(q6_K)
KP_AVX2_DOT_TILE(mxfp4)
#undef KP_AVX2_VEC_DOT
#undef KP_AVX2_DOT_TILE

/* attention helpers */
float kp_avx2_dot_f32(int64_t n, const float *x, const float *y);
float kp_avx2_dot_f32_f16(int64_t n, const float *x, const uint16_t *y);
void kp_avx2_axpy_f32(int64_t n, float a, const float *x, float *y);
void kp_avx2_axpy_f16(int64_t n, float a, const uint16_t *x, float *y);

/* The entries the avx2 and avx512vnni tables share: everything but gemm
 * and the F32/F16/BF16 dot_tile, which each table has its own of (so that
 * dot_tile and gemm of one table sum in the same order). */
#define KP_AVX2_SHARED_ENTRIES                                                     \
    .quantize_act =                                                                \
        {                                                                          \
            [KP_DTYPE_F32] = kp_avx2_act_f32,                                      \
            [KP_DTYPE_F16] = kp_avx2_act_f16,                                      \
            [KP_DTYPE_BF16] = kp_avx2_act_bf16,                                    \
            [KP_DTYPE_Q8_0] = kp_avx2_act_q8_0,                                    \
            [KP_DTYPE_Q4_0] = kp_avx2_act_q8_0,                                    \
            [KP_DTYPE_Q4_1] = kp_avx2_act_q8_1,                                    \
            [KP_DTYPE_Q5_0] = kp_avx2_act_q8_0,                                    \
            [KP_DTYPE_Q5_1] = kp_avx2_act_q8_1,                                    \
            [KP_DTYPE_Q4_K] = kp_avx2_act_q8_K,                                    \
            [KP_DTYPE_Q5_K] = kp_avx2_act_q8_K,                                    \
            [KP_DTYPE_Q6_K] = kp_avx2_act_q8_K,                                    \
            [KP_DTYPE_MXFP4] = kp_avx2_act_q8_0,                                   \
        },                                                                         \
    .vec_dot =                                                                     \
        {                                                                          \
            [KP_DTYPE_F32] = kp_avx2_vec_dot_f32,                                  \
            [KP_DTYPE_F16] = kp_avx2_vec_dot_f16,                                  \
            [KP_DTYPE_BF16] = kp_avx2_vec_dot_bf16,                                \
            [KP_DTYPE_Q8_0] = kp_avx2_vec_dot_q8_0,                                \
            [KP_DTYPE_Q4_0] = kp_avx2_vec_dot_q4_0,                                \
            [KP_DTYPE_Q4_1] = kp_avx2_vec_dot_q4_1,                                \
            [KP_DTYPE_Q5_0] = kp_avx2_vec_dot_q5_0,                                \
            [KP_DTYPE_Q5_1] = kp_avx2_vec_dot_q5_1,                                \
            [KP_DTYPE_Q4_K] = kp_avx2_vec_dot_q4_K,                                \
            [KP_DTYPE_Q5_K] = kp_avx2_vec_dot_q5_K,                                \
            [KP_DTYPE_Q6_K] = kp_avx2_vec_dot_q6_K,                                \
            [KP_DTYPE_MXFP4] = kp_avx2_vec_dot_mxfp4,                              \
        },                                                                         \
    .dot_tile[KP_DTYPE_Q8_0] = kp_avx2_dot_tile_q8_0,                              \
    .dot_tile[KP_DTYPE_Q4_0] = kp_avx2_dot_tile_q4_0,                              \
    .dot_tile[KP_DTYPE_Q4_1] = kp_avx2_dot_tile_q4_1,                              \
    .dot_tile[KP_DTYPE_Q5_0] = kp_avx2_dot_tile_q5_0,                              \
    .dot_tile[KP_DTYPE_Q5_1] = kp_avx2_dot_tile_q5_1,                              \
    .dot_tile[KP_DTYPE_Q4_K] = kp_avx2_dot_tile_q4_K,                              \
    .dot_tile[KP_DTYPE_Q5_K] = kp_avx2_dot_tile_q5_K,                              \
    .dot_tile[KP_DTYPE_Q6_K] = kp_avx2_dot_tile_q6_K,                              \
    .dot_tile[KP_DTYPE_MXFP4] = kp_avx2_dot_tile_mxfp4,                            \
    .dot_f32 = kp_avx2_dot_f32,                                                    \
    .dot_f32_f16 = kp_avx2_dot_f32_f16,                                            \
    .axpy_f32 = kp_avx2_axpy_f32,                                                  \
    .axpy_f16 = kp_avx2_axpy_f16

#endif

#endif
