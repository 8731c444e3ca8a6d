/*
 * quant_impl.h - private to src/quant*.c: the few functions the scalar and
 * AVX2 files share (block structs: quant_blocks.h).
 * Nothing outside the quant module includes this file.
 */
#ifndef KP_QUANT_IMPL_H
#define KP_QUANT_IMPL_H

#include <stdint.h>

#include "kernels/quant.h"

#include "kernels/quant_blocks.h"

/* Q4_K: unpacks the 12 packed bytes into sc[8] (scales) and m[8] (mins). */
void kp_quant_q4k_unpack_scales(const uint8_t packed[12], uint8_t sc[8], uint8_t m[8]);

/* The Q4_K/Q5_K quantizer part both types share (quant.c; llama.cpp's
 * make_qkx2_quants sub-block fit and 6-bit scale packing): fits the 8 sub-blocks of x[0..256)
 * (levels 0..nmax, llama.cpp's rmin and nstep for the type), packs the
 * scales and mins, and writes the levels L requantized with the scales as
 * stored. Q4_K: nmax 15, rmin -1, nstep 20; Q5_K: 31, -0.5, 15. */
void kp_quant_k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t L[256],
                       uint8_t packed[12], uint16_t *d, uint16_t *dmin);

/* Reference row quantizers (quant.c), used by both tables' quantize_act. */
void kp_quant_row_q8_0(const float *x, void *dst, int64_t n);
void kp_quant_row_q8_K(const float *x, void *dst, int64_t n);

/* The AVX2 table (quant_avx2.c), or NULL when not compiled for x86-64.
 * Does not check the CPU; kp_kernels_best/kp_kernels_avx2 do. */
const kp_kernels *kp_quant_avx2_table(void);

/* The AVX2 table with AVX512-VNNI gemm kernels (quant_avx2.c), or NULL when
 * not compiled for x86-64. Does not check the CPU; kp_kernels_avx512vnni
 * does. */
const kp_kernels *kp_quant_avx512vnni_table(void);

/* F16C form of kp_fp16_to_fp32_row; call only when kp_kernels_avx2() is
 * non-NULL (the stub outside x86-64 converts with the scalar function). */
void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n);

#endif
