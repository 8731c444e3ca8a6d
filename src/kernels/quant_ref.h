/*
 * quant_ref.h - private to src/kernels/: what the reference file
 * (quant_ref.c) shares with the kernel tables. Nothing outside
 * src/kernels/ includes this file; the public contract is quant.h.
 *
 *   - The reference activation quantizers, which the portable table uses
 *     as its quantize_act entries (the SIMD tables have their own, with
 *     the same bytes for finite inputs): F32 copy, F16 and BF16 rounding,
 *     Q8_0, Q8_1 and Q8_K.
 *   - The FP16 and BF16 decoders inline (the bodies of kp_fp16_to_fp32
 *     and kp_bf16_to_fp32), so that portable kernels decode block scales
 *     and half rows without a call.
 *
 * Rows are n floats in, kp_dtype_row_size(type, n) bytes out, n a
 * multiple of the type's block size (checked by the callers).
 */
#ifndef KP_QUANT_REF_H
#define KP_QUANT_REF_H

#include <stdint.h>
#include <string.h>

void kp_quant_row_f32(const float *x, void *dst, int64_t n);  /* copy */
void kp_quant_row_f16(const float *x, void *dst, int64_t n);  /* kp_fp32_to_fp16 per element */
void kp_quant_row_bf16(const float *x, void *dst, int64_t n); /* kp_fp32_to_bf16 per element */
void kp_quant_row_q8_0(const float *x, void *dst, int64_t n);
void kp_quant_row_q8_1(const float *x, void *dst, int64_t n);
void kp_quant_row_q8_K(const float *x, void *dst, int64_t n);

static inline uint32_t ref_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ref_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 *   binary16:  s eeeee mmmmmmmmmm        bias 15, subnormal = m * 2^-24
 *   binary32:  s eeeeeeee m(23)          bias 127
 *   bfloat16:  the top 16 bits of binary32
 */
static inline float ref_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        const float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) /* inf; a NaN comes out quiet (payload kept), as with F16C */
        return ref_f32_from_bits(sign | 0x7F800000u | (mant ? (mant | 0x200u) << 13 : 0));
    return ref_f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline float ref_bf16_to_fp32(uint16_t h) { return ref_f32_from_bits((uint32_t)h << 16); }

#endif
