/*
 * quant_ref.c - the reference code of every element type: FP16/BF16
 * conversions, the reference quantizers, the dequantizers, and the pairing
 * of weight and activation types (quant.h; byte layouts in quant_blocks.h).
 * Portable ISO C, no target attributes; it calls no other file of
 * src/kernels/ (the kernel files call it, never the reverse).
 *
 * What it owns:
 *   - FP16/BF16 <-> FP32 conversions, bit-exact (round to nearest even),
 *     and their row forms that the portable table uses as quantize_act.
 *   - The reference quantizers. They reproduce llama.cpp's algorithms
 *     (quantize_row_*_ref) operation for operation (same order, same float
 *     rounding; built as ISO C, so no FMA contraction), which makes their
 *     output byte-identical to llama-quantize --pure (no importance matrix):
 *
 *       Q8_0  d = amax/127, q = roundf(x/d)
 *       Q4_0  d = -(signed value of largest |x|)/8, q = min(15, trunc(x/d + 8.5))
 *       Q4_1  per block of 32: d = (max - min)/15, m = min,
 *             q = min(15, trunc((x - min)/d + 0.5))
 *       Q5_0  d = -(signed value of the largest |x|)/16,
 *             q = min(31, trunc(x/d + 16.5))
 *       Q5_1  d = (max - min)/31, m = min, q = trunc((x - min)/d + 0.5)
 *       Q8_1  d = amax/127, q = roundf(x/d), s = d * sum(q)
 *       Q4_K  per 32-element sub-block: weighted least-squares fit of
 *       Q5_K  x ~ scale*q - min (q in 0..15 resp. 0..31, weights |x| + rms
 *             of the sub-block) over 21 resp. 16 candidate grids
 *             (llama.cpp's make_qkx2_quants); then 6-bit quantized
 *             scales/mins relative to the largest ones, and a final
 *             requantization of q with the stored (rounded) scales
 *       Q6_K  per 16-element sub-block: x^2-weighted fit of x ~ scale*q
 *             (q in -32..31) over 19 candidate grids; then 8-bit scales
 *             relative to the largest, and requantization
 *       Q8_K  d = max/-127 (signed value of largest |x|), q = round(x/d),
 *             bsums = sums of 16 consecutive q
 *       MXFP4 e = floor(log2(amax)) - 2 + 127 (0 for an all-zero block), so
 *             the largest |x| lands between 4 and 8 steps of 2^(e - 128)
 *             (the doubled values reach 12); each code the value nearest
 *             x / 2^(e - 128), the first of equal distances in code order.
 *             Below amax 2^-125, where llama.cpp converts a negative float
 *             to uint8_t (undefined in C; x86 wraps it to a huge scale),
 *             e is 0
 *
 *     "/d" is a multiplication by id = 1/d (0 when d is 0), as in llama.cpp.
 *   - The dequantizers, one loop per layout, and kp_q8_0_aux_row.
 *
 * Invariants: no mutable state; every function is reentrant. Float-to-int
 * casts are range-checked (to_int_in) so that NaN or inf inputs give
 * defined, memory-safe garbage rather than undefined behaviour; for finite
 * inputs the checks never change a result.
 *
 * Rounding helper: nearest_int() adds 1.5*2^23 so the FPU rounds to nearest
 * even, exactly as llama.cpp's helper of the same name; arguments outside
 * +-4194303 (possible only for garbage input such as NaN) are clamped first
 * instead of producing undefined results.
 */
#include "kernels/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"

/* ------------------------------------------------------------------------ */
/* FP16 / BF16                                                               */
/* ------------------------------------------------------------------------ */

float kp_fp16_to_fp32(uint16_t h) { return ref_fp16_to_fp32(h); }

uint16_t kp_fp32_to_fp16(float f) {
    const uint32_t u = ref_f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: quiet, top 9 payload bits kept */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 (halfway to 2^16), or inf: overflow */
        return (uint16_t)(sign | 0x7C00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        const uint32_t e = a >> 23;
        if (e < 102) return sign; /* < 2^-25: rounds to zero (2^-25 itself ties to 0) */
        const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126 - e; /* value = m * 2^(e-150); unit = 2^-24 */
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3FFu);
    const uint32_t rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* carry may reach the exponent */
    return (uint16_t)(sign | h);
}

float kp_bf16_to_fp32(uint16_t h) { return ref_bf16_to_fp32(h); }

uint16_t kp_fp32_to_bf16(float f) {
    const uint32_t u = ref_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void kp_quant_row_f16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp32_to_fp16(x[i]);
}

void kp_quant_row_bf16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp32_to_bf16(x[i]);
}

void kp_quant_row_f32(const float *x, void *dst, int64_t n) {
    if (n > 0) memcpy(dst, x, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------------ */
/* Helpers of the quantizers                                                 */
/* ------------------------------------------------------------------------ */

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

static inline int nearest_int(float fval) {
    if (!(fabsf(fval) <= 4194303.f)) fval = fval > 0 ? 4194303.f : fval < 0 ? -4194303.f : 0.f;
    const float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* (int)v truncated toward zero when lo <= v <= hi; 0 otherwise (NaN, inf).
 * Float-to-int casts of out-of-range values are undefined in C; for the
 * values the reference quantizers produce this is exactly their cast. */
static inline int to_int_in(float v, int lo, int hi) {
    return v >= (float)lo && v <= (float)hi ? (int)v : 0;
}

/* min and max of a block of 32 (starting from +-FLT_MAX, as llama.cpp). */
static void block_min_max(const float *x, float *min_out, float *max_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *min_out = min;
    *max_out = max;
}

/* The signed value of the first element with the largest |x| (0 if all 0). */
static float block_signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Packs 32 five-bit quants q[0..31] into qh (bit 4 of each) and qs. */
static void pack_q5(const uint8_t q[32], uint8_t qh[4], uint8_t qs[16]) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
        h |= (uint32_t)((q[j] & 0x10u) >> 4) << j;
        h |= (uint32_t)((q[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k)); /* little-endian */
}

/* ------------------------------------------------------------------------ */
/* Reference quantizers, one per type                                        */
/* ------------------------------------------------------------------------ */

void kp_quant_row_q8_0(const float *x, void *dst, int64_t n) {
    kp_block_q8_0 *y = dst;
    const int64_t nb = n / KP_QK8_0;
    for (int64_t i = 0; i < nb; i++, x += KP_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < KP_QK8_0; j++) {
            const float v = fabsf(x[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        for (int j = 0; j < KP_QK8_0; j++) y[i].qs[j] = (int8_t)to_int_in(roundf(x[j] * id), -128, 127);
    }
}

static void quant_row_q4_0(const float *x, void *dst, int64_t n) {
    kp_block_q4_0 *y = dst;
    const int64_t nb = n / KP_QK4_0;
    for (int64_t i = 0; i < nb; i++, x += KP_QK4_0) {
        const float d = block_signed_absmax(x) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        for (int j = 0; j < KP_QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[KP_QK4_0 / 2 + j] * id;
            const uint8_t q0 = (uint8_t)imin(15, to_int_in(x0 + 8.5f, 0, 127));
            const uint8_t q1 = (uint8_t)imin(15, to_int_in(x1 + 8.5f, 0, 127));
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void quant_row_q4_1(const float *x, kp_block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KP_QK4_1) {
        float min, max;
        block_min_max(x, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        y[i].m = kp_fp32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const int q0 = imin(15, (int8_t)to_int_in(x0 + 0.5f, -128, 127));
            const int q1 = imin(15, (int8_t)to_int_in(x1 + 0.5f, -128, 127));
            y[i].qs[j] = (uint8_t)((uint8_t)q0 | (uint8_t)q1 << 4);
        }
    }
}

static void quant_row_q5_0(const float *x, kp_block_q5_0 *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, x += KP_QK5_0) {
        const float d = block_signed_absmax(x) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        for (int j = 0; j < 32; j++)
            q[j] = (uint8_t)imin(31, (int8_t)to_int_in(x[j] * id + 16.5f, -128, 127));
        pack_q5(q, y[i].qh, y[i].qs);
    }
}

static void quant_row_q5_1(const float *x, kp_block_q5_1 *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, x += KP_QK5_1) {
        float min, max;
        block_min_max(x, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        y[i].m = kp_fp32_to_fp16(min);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)to_int_in((x[j] - min) * id + 0.5f, 0, 255);
        pack_q5(q, y[i].qh, y[i].qs);
    }
}

void kp_quant_row_q8_1(const float *x, void *dst, int64_t n) {
    kp_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / KP_QK8_1; i++, x += KP_QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < KP_QK8_1; j++) {
            const float v = fabsf(x[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < KP_QK8_1; j++) {
            y[i].qs[j] = (int8_t)to_int_in(roundf(x[j] * id), -128, 127);
            sum += y[i].qs[j];
        }
        y[i].s = kp_fp32_to_fp16((float)sum * d);
    }
}

/*
 * K-quant sub-block fit (llama.cpp's make_qkx2_quants, squared error; Q4_K
 * uses nmax = 15, rmin = -1, rdelta = 0.1, nstep = 20, Q5_K its own values).
 *
 * Finds scale >= 0 and min <= 0 with x[i] ~ scale*L[i] + min, L in 0..nmax,
 * minimizing sum w[i]*err^2: start from the min/max grid, then for each
 * candidate grid iscale = (nmax + rmin + rdelta*is)/(max - min) round x to
 * it and solve the 2x2 weighted least-squares problem for (scale, min);
 * keep the best. Note that `min`, once improved, also moves the later
 * grids (as in llama.cpp). Returns scale; *the_min = -min (>= 0).
 */
static float fit_scale_min(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                           float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        const float diff = scale * L[i] + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                const float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Q4_K/Q5_K: the 8 sub-block scales and mins as 6-bit integers relative
 * to max_scale / 63 and max_min / 63, packed into 12 bytes (layout table in
 * quant_blocks.h), and the two FP16 super-block scales. */
static void pack_k_scales(const float scales[8], const float mins[8], float max_scale,
                          float max_min, uint8_t packed[12], uint16_t *d, uint16_t *dmin) {
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < KP_QK_K / 32; j++) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = kp_fp32_to_fp16(max_scale / 63.f);
    *dmin = kp_fp32_to_fp16(max_min / 63.f);
}

/* The Q4_K/Q5_K quantizer part both types share (make_qkx2_quants per
 * sub-block and the 6-bit scale packing): fits the 8 sub-blocks of
 * x[0..256) (levels 0..nmax, llama.cpp's rmin and nstep for the type),
 * packs the scales and mins, and writes the levels L requantized with the
 * scales as stored. Q4_K: nmax 15, rmin -1, nstep 20; Q5_K: 31, -0.5, 15. */
static void k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t L[KP_QK_K],
                     uint8_t packed[12], uint16_t *d, uint16_t *dmin) {
    uint8_t Laux[32];
    float weights[32], mins[KP_QK_K / 32], scales[KP_QK_K / 32];
    float max_scale = 0, max_min = 0; /* the scales and mins are >= 0 */
    for (int j = 0; j < KP_QK_K / 32; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    pack_k_scales(scales, mins, max_scale, max_min, packed, d, dmin);
    /* requantize with the scales as stored */
    uint8_t sc[8], m[8];
    unpack_k_scales(packed, sc, m);
    const float d_all = kp_fp16_to_fp32(*d), dmin_all = kp_fp16_to_fp32(*dmin);
    for (int j = 0; j < KP_QK_K / 32; j++) {
        const float dj = d_all * sc[j];
        if (!dj) continue;
        const float dm = dmin_all * m[j];
        for (int ii = 0; ii < 32; ii++) {
            const int l = nearest_int((x[32 * j + ii] + dm) / dj);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void quant_row_q4_K(const float *x, void *dst, int64_t n) {
    kp_block_q4_K *y = dst;
    const int64_t nb = n / KP_QK_K;
    uint8_t L[KP_QK_K];

    for (int64_t i = 0; i < nb; i++, x += KP_QK_K) {
        k_scales(x, 15, -1.f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);

        uint8_t *q = y[i].qs;
        for (int j = 0; j < KP_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

static void quant_row_q5_K(const float *x, kp_block_q5_K *y, int64_t nb) {
    uint8_t L[KP_QK_K];

    for (int64_t i = 0; i < nb; i++, x += KP_QK_K) {
        /* sub-block fit, 6-bit scales packed as Q4_K's, requantized as stored */
        k_scales(x, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);

        memset(y[i].qh, 0, sizeof y[i].qh);
        uint8_t *ql = y[i].qs;
        for (int c = 0; c < 4; c++, ql += 32) {
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
                y[i].qh[l] |= (uint8_t)((l1 >> 4) << (2 * c) | (l2 >> 4) << (2 * c + 1));
                ql[l] = (uint8_t)((l1 & 0xF) | (l2 & 0xF) << 4);
            }
        }
    }
}

/*
 * Q6_K sub-block fit (llama.cpp's make_qx_quants with nmax = 32 and
 * weights x^2). Starting from iscale = -nmax/max (max = signed value of the
 * largest |x|), rounds x to the grid, computes the weighted least-squares
 * scale, and tries 18 neighbouring grids, keeping the one with the best
 * sumlx^2/suml2. Writes L = q + 32 (0..63); returns the scale.
 */
static float q6k_fit_scale(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void quant_row_q6_K(const float *x, void *dst, int64_t n) {
    kp_block_q6_K *y = dst;
    const int64_t nb = n / KP_QK_K;
    int8_t L[KP_QK_K];
    float scales[KP_QK_K / 16];

    for (int64_t i = 0; i < nb; i++, x += KP_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < KP_QK_K / 16; ib++) {
            const float scale = q6k_fit_scale(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }

        const float iscale = -128.f / max_scale;
        y[i].d = kp_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < KP_QK_K / 16; ib++)
            y[i].scales[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));

        const float d_all = kp_fp16_to_fp32(y[i].d);
        for (int j = 0; j < KP_QK_K / 16; j++) {
            const float d = d_all * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
            }
        }

        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < KP_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64],
                          q4 = L[j + l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
                ql[l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
                qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}

void kp_quant_row_q8_K(const float *x, void *dst, int64_t n) {
    kp_block_q8_K *y = dst;
    const int64_t nb = n / KP_QK_K;
    for (int64_t i = 0; i < nb; i++, x += KP_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < KP_QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < KP_QK_K; j++) y[i].qs[j] = (int8_t)imin(127, nearest_int(iscale * x[j]));
        for (int j = 0; j < KP_QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[16 * j + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* The code of the doubled E2M1 value nearest x at scale d (d x value),
 * ties to the lower code, as llama.cpp's best_index_mxfp4. */
static uint8_t mxfp4_nearest(float x, float d) {
    int best = 0;
    float best_err = fabsf(kp_mxfp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(kp_mxfp4_values[i] * d - x);
        if (err < best_err) best = i, best_err = err;
    }
    return (uint8_t)best;
}

static void quant_row_mxfp4(const float *x, kp_block_mxfp4 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KP_QK_MXFP4) {
        float amax = 0;
        for (int j = 0; j < KP_QK_MXFP4; j++) amax = amax < fabsf(x[j]) ? fabsf(x[j]) : amax;
        /* floor(log2) of a finite float is in -149 .. 127, so e fits a byte */
        const uint8_t e = amax > 0 && isfinite(amax) ? (uint8_t)to_int_in(floorf(log2f(amax)) - 2 + 127, 0, 255) : 0;
        const float d = kp_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < KP_QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(mxfp4_nearest(x[j], d) | mxfp4_nearest(x[KP_QK_MXFP4 / 2 + j], d) << 4);
    }
}

bool kp_quantize_row(kp_dtype t, const float *src, void *dst, int64_t n) {
    const kp_dtype_info *info = kp_dtype_get((uint32_t)t);
    if (!info || n < 0 || n % info->block_size != 0) return false;
    switch (t) {
    case KP_DTYPE_F32: kp_quant_row_f32(src, dst, n); return true;
    case KP_DTYPE_F16: kp_quant_row_f16(src, dst, n); return true;
    case KP_DTYPE_BF16: kp_quant_row_bf16(src, dst, n); return true;
    case KP_DTYPE_Q8_0: kp_quant_row_q8_0(src, dst, n); return true;
    case KP_DTYPE_Q4_0: quant_row_q4_0(src, dst, n); return true;
    case KP_DTYPE_Q4_K: quant_row_q4_K(src, dst, n); return true;
    case KP_DTYPE_Q6_K: quant_row_q6_K(src, dst, n); return true;
    case KP_DTYPE_Q8_K: kp_quant_row_q8_K(src, dst, n); return true;
    case KP_DTYPE_Q4_1: quant_row_q4_1(src, dst, n / KP_QK4_1); return true;
    case KP_DTYPE_Q5_0: quant_row_q5_0(src, dst, n / KP_QK5_0); return true;
    case KP_DTYPE_Q5_1: quant_row_q5_1(src, dst, n / KP_QK5_1); return true;
    case KP_DTYPE_Q5_K: quant_row_q5_K(src, dst, n / KP_QK_K); return true;
    case KP_DTYPE_Q8_1: kp_quant_row_q8_1(src, dst, n); return true;
    case KP_DTYPE_MXFP4: quant_row_mxfp4(src, dst, n / KP_QK_MXFP4); return true;
    default: return false;
    }
}

/* ------------------------------------------------------------------------ */
/* Dequantizers                                                              */
/* ------------------------------------------------------------------------ */

static void dequant_q8_0(const kp_block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KP_QK8_0) {
        const float d = kp_fp16_to_fp32(x[i].d);
        for (int j = 0; j < KP_QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

static void dequant_q4_0(const kp_block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KP_QK4_0) {
        const float d = kp_fp16_to_fp32(x[i].d);
        for (int j = 0; j < KP_QK4_0 / 2; j++) {
            y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
            y[j + KP_QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const kp_block_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KP_QK4_1) {
        const float d = kp_fp16_to_fp32(x[i].d), m = kp_fp16_to_fp32(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (x[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q5_0(const kp_block_q5_0 *x, float *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, y += KP_QK5_0) {
        const float d = kp_fp16_to_fp32(x[i].d);
        unpack_q5(x[i].qh, x[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = (q[j] - 16) * d;
    }
}

static void dequant_q5_1(const kp_block_q5_1 *x, float *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, y += KP_QK5_1) {
        const float d = kp_fp16_to_fp32(x[i].d), m = kp_fp16_to_fp32(x[i].m);
        unpack_q5(x[i].qh, x[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = q[j] * d + m;
    }
}

static void dequant_mxfp4(const kp_block_mxfp4 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KP_QK_MXFP4) {
        const float d = kp_e8m0_half(x[i].e);
        for (int j = 0; j < KP_QK_MXFP4 / 2; j++) {
            y[j] = kp_mxfp4_values[x[i].qs[j] & 0xF] * d;
            y[j + KP_QK_MXFP4 / 2] = kp_mxfp4_values[x[i].qs[j] >> 4] * d;
        }
    }
}

static void dequant_q8_1(const kp_block_q8_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KP_QK8_1) {
        const float d = kp_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = x[i].qs[j] * d;
    }
}

static void dequant_q4_K(const kp_block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kp_fp16_to_fp32(x[i].d), min = kp_fp16_to_fp32(x[i].dmin);
        uint8_t sc[8], m[8];
        unpack_k_scales(x[i].scales, sc, m);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 4; j++, q += 32) {
            const float d1 = d * sc[2 * j], m1 = min * m[2 * j];
            const float d2 = d * sc[2 * j + 1], m2 = min * m[2 * j + 1];
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const kp_block_q5_K *x, float *y, int64_t nb) {
    uint8_t q[KP_QK_K];
    for (int64_t i = 0; i < nb; i++, y += KP_QK_K) {
        const float d = kp_fp16_to_fp32(x[i].d), min = kp_fp16_to_fp32(x[i].dmin);
        uint8_t sc[8], m[8];
        unpack_k_scales(x[i].scales, sc, m);
        unpack_q5_K(&x[i], q);
        for (int j = 0; j < 8; j++) {
            const float d1 = d * sc[j], m1 = min * m[j];
            for (int l = 0; l < 32; l++) y[32 * j + l] = d1 * q[32 * j + l] - m1;
        }
    }
}

static void dequant_q6_K(const kp_block_q6_K *x, float *y, int64_t nb) {
    int8_t q[KP_QK_K];
    for (int64_t i = 0; i < nb; i++, y += KP_QK_K) {
        const float d = kp_fp16_to_fp32(x[i].d);
        unpack_q6_K(&x[i], q);
        for (int j = 0; j < KP_QK_K; j++) y[j] = d * x[i].scales[j / 16] * q[j];
    }
}

static void dequant_q8_K(const kp_block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KP_QK_K)
        for (int j = 0; j < KP_QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

bool kp_dequantize_row(kp_dtype t, const void *src, float *dst, int64_t n) {
    const kp_dtype_info *info = kp_dtype_get((uint32_t)t);
    if (!info || n < 0 || n % info->block_size != 0) return false;
    const int64_t nb = n / info->block_size;
    switch (t) {
    case KP_DTYPE_F32:
        if (n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    case KP_DTYPE_F16: { /* the same bits as the F16C row of kp_fp16_to_fp32_row */
        const uint16_t *x = src;
        for (int64_t i = 0; i < n; i++) dst[i] = kp_fp16_to_fp32(x[i]);
        return true;
    }
    case KP_DTYPE_BF16: {
        const uint16_t *x = src;
        for (int64_t i = 0; i < n; i++) dst[i] = kp_bf16_to_fp32(x[i]);
        return true;
    }
    case KP_DTYPE_Q8_0: dequant_q8_0(src, dst, nb); return true;
    case KP_DTYPE_Q4_0: dequant_q4_0(src, dst, nb); return true;
    case KP_DTYPE_Q4_K: dequant_q4_K(src, dst, nb); return true;
    case KP_DTYPE_Q6_K: dequant_q6_K(src, dst, nb); return true;
    case KP_DTYPE_Q8_K: dequant_q8_K(src, dst, nb); return true;
    case KP_DTYPE_Q4_1: dequant_q4_1(src, dst, nb); return true;
    case KP_DTYPE_Q5_0: dequant_q5_0(src, dst, nb); return true;
    case KP_DTYPE_Q5_1: dequant_q5_1(src, dst, nb); return true;
    case KP_DTYPE_Q8_1: dequant_q8_1(src, dst, nb); return true;
    case KP_DTYPE_Q5_K: dequant_q5_K(src, dst, nb); return true;
    case KP_DTYPE_MXFP4: dequant_mxfp4(src, dst, nb); return true;
    default: return false;
    }
}

kp_dtype kp_vec_dot_type(kp_dtype w) {
    switch (w) {
    case KP_DTYPE_F32: return KP_DTYPE_F32;
    case KP_DTYPE_F16: return KP_DTYPE_F16;
    case KP_DTYPE_BF16: return KP_DTYPE_BF16;
    case KP_DTYPE_Q8_0:
    case KP_DTYPE_Q4_0: return KP_DTYPE_Q8_0;
    case KP_DTYPE_Q4_K:
    case KP_DTYPE_Q6_K: return KP_DTYPE_Q8_K;
    case KP_DTYPE_Q5_0:
    case KP_DTYPE_MXFP4: return KP_DTYPE_Q8_0;
    case KP_DTYPE_Q4_1: case KP_DTYPE_Q5_1: return KP_DTYPE_Q8_1;
    case KP_DTYPE_Q5_K: return KP_DTYPE_Q8_K;
    default: return KP_DTYPE_COUNT_;
    }
}

void kp_q8_0_aux_row(const void *a, kp_q8_0_aux *aux, int64_t n) {
    const kp_block_q8_0 *y = a;
    for (int64_t i = 0; i < n / KP_QK8_0; i++) {
        int32_t sum = 0;
        for (int j = 0; j < KP_QK8_0; j++) sum += y[i].qs[j];
        aux[i].d = kp_fp16_to_fp32(y[i].d);
        aux[i].bias = -128 * sum;
    }
}
