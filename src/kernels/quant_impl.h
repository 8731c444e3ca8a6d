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
