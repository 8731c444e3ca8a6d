/*
 * quant_more.h - private to src/quant*.c: the weight types Q4_1, Q5_0, Q5_1
 * and Q5_K, and the activation type Q8_1 that Q4_1 and Q5_1 are multiplied
 * with. quant.c and quant_avx2.c only hook these functions into their
 * dispatch switches and kernel tables; nothing outside the quant module
 * includes this file (the public contract stays quant.h).
 *
 * Block layouts and structs: quant_blocks.h.
 */
#ifndef KP_QUANT_MORE_H
#define KP_QUANT_MORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"

#include "kernels/quant_blocks.h"

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
