/*
 * tables.h - private to src/kernels/: the kernel tables, one per file and
 * instruction set, for the quant kernels (kp_kernels) and for attention
 * (kp_attn_kernels). dispatch.c alone chooses among them and hands them out
 * (kp_kernels_* in quant.h, kp_attn_* in attn.h), with the F16C row
 * conversion below; a SIMD file may name the table it falls back to.
 * Nothing outside src/kernels/ includes this file.
 *
 * Each table is a constant object defined by its file; the SIMD ones exist
 * only in x86-64 builds, and using one is correct only on a CPU with the
 * extensions named (dispatch.c checks).
 */
#ifndef KP_KERNELS_TABLES_H
#define KP_KERNELS_TABLES_H

#include <stdint.h>

#include "kernels/attn.h"
#include "kernels/quant.h"

/* quant_scalar.c: portable C, every type. */
extern const kp_kernels kp_quant_scalar_kernels;

#if defined(__x86_64__)
/* quant_avx2.c: AVX2 + FMA + F16C. */
extern const kp_kernels kp_quant_avx2_kernels;

/* quant_avx512.c: the avx2 table with AVX512 F/VL/BW + VNNI gemm kernels. */
extern const kp_kernels kp_quant_avx512vnni_kernels;

/* quant_avx512.c: the avx512vnni table with the BF16 kernels of
 * quant_bf16.c (AVX512_BF16 dot products), declared here for it. */
extern const kp_kernels kp_quant_avx512bf16_kernels;
void kp_bf16dp_tile(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                    float *out, size_t out_stride);
void kp_bf16dp_gemm(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                    const void *aux, size_t aux_stride, float *out, size_t out_stride);
void kp_bf16dp_pack(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst);
void kp_bf16dp_gemm_packed(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,
                           const void *aux, size_t aux_stride, float *out, size_t out_stride);

/* quant_avx2.c: kp_fp16_to_fp32_row with F16C (AVX2 CPUs only). */
void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n);
#endif

/* attn_scalar.c: portable C; also the fallback of the SIMD tables for head
 * sizes that are not a multiple of 8. */
extern const kp_attn_kernels kp_attn_scalar_kernels;

/* attn_scalar.c: the bfloat16 precision's reference (attn_bf16.c). */
extern const kp_attn_kernels kp_attn_scalar_bf16_kernels;

/* attn_scalar.c: where a tile_step_kv step of tile t decodes its K rows
 * (STEP * hd floats) and then its V rows (as many): inside t->ws, past
 * what any table's layout of the tile uses. */
float *kp_attn_kv_scratch(const kp_attn_tile *t);

#if defined(__x86_64__)
/* attn_avx2.c: AVX2 + FMA + F16C; also what the avx512 table does not redo. */
extern const kp_attn_kernels kp_attn_avx2_kernels;

/* attn_avx512.c: the avx2 table with 16-lane AVX-512F loops. */
extern const kp_attn_kernels kp_attn_avx512_kernels;

/* attn_bf16.c: the avx512 table with prefill tiles in bfloat16 dot
 * products (AVX512_BF16, BW, VL besides). */
extern const kp_attn_kernels kp_attn_avx512bf16_kernels;
#endif

#endif
