/*
 * quant.c - conversions, reference quantizers, dequantizers and the portable
 * kernel table (see quant.h for the byte layouts of every type).
 *
 * What it owns:
 *   - FP16/BF16 <-> FP32 conversions, bit-exact (round to nearest even).
 *   - The reference quantizers. They reproduce llama.cpp's algorithms
 *     operation for operation (same order, same float rounding; this file
 *     is built as ISO C, so no FMA contraction), which makes their output
 *     byte-identical to llama-quantize --pure:
 *
 *       Q8_0  d = amax/127, q = roundf(x/d)
 *       Q4_0  d = -(signed value of largest |x|)/8, q = min(15, trunc(x/d + 8.5))
 *       Q4_K  per 32-element sub-block: weighted least-squares fit of
 *             x ~ scale*q - min (q in 0..15, weights |x| + rms of the sub-block)
 *             over 21 candidate grids; then 6-bit quantized scales/mins
 *             relative to the largest ones, and a final requantization of q
 *             with the stored (rounded) scales
 *       Q6_K  per 16-element sub-block: x^2-weighted fit of x ~ scale*q
 *             (q in -32..31) over 19 candidate grids; then 8-bit scales
 *             relative to the largest, and requantization
 *       Q8_K  d = max/-127 (signed value of largest |x|), q = round(x/d),
 *             bsums = sums of 16 consecutive q
 *
 *   - The scalar kernel table: straightforward loops, integer dot products
 *     inside a block, float accumulation across blocks (F32/F16/BF16 rows
 *     accumulate in double). dot_tile and gemm are nr*nc vec_dot calls.
 *   - kp_kernels_best: picks the AVX512-VNNI or the AVX2 table
 *     (quant_avx2.c) at run time.
 *
 * Invariants: no mutable state; every function is reentrant. The kernel
 * tables are `static const`.
 *
 * Rounding helper: nearest_int() adds 1.5*2^23 so the FPU rounds to nearest
 * even, exactly as llama.cpp's helper of the same name; arguments outside
 * +-4194303 (possible only for garbage input such as NaN) are clamped first
 * instead of producing undefined results.
 */
#include "kernels/quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/quant_impl.h"
#include "kernels/quant_more.h"

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ------------------------------------------------------------------------ */
/* FP16 / BF16                                                               */
/* ------------------------------------------------------------------------ */

/*
 *   binary16:  s eeeee mmmmmmmmmm        bias 15, subnormal = m * 2^-24
 *   binary32:  s eeeeeeee m(23)          bias 127
 *   bfloat16:  the top 16 bits of binary32
 */
float kp_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        const float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) /* inf; a NaN comes out quiet (payload kept), as with F16C */
        return f32_from_bits(sign | 0x7F800000u | (mant ? (mant | 0x200u) << 13 : 0));
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kp_fp32_to_fp16(float f) {
    const uint32_t u = f32_bits(f);
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

float kp_bf16_to_fp32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t kp_fp32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void fp32_to_fp16_row_scalar(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp32_to_fp16(x[i]);
}

static void fp32_to_bf16_row_scalar(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp32_to_bf16(x[i]);
}

static void fp32_copy_row(const float *x, void *dst, int64_t n) {
    if (n > 0) memcpy(dst, x, (size_t)n * sizeof(float));
}

void kp_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n) {
    kp_kernels_best()->quantize_act[KP_DTYPE_F16](x, y, n);
}

void kp_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    if (kp_kernels_avx2()) {
        kp_quant_avx2_fp16_to_fp32_row(x, y, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp16_to_fp32(x[i]);
}

/* ------------------------------------------------------------------------ */
/* Reference quantizers                                                      */
/* ------------------------------------------------------------------------ */

static inline int nearest_int(float fval) {
    if (!(fabsf(fval) <= 4194303.f)) fval = fval > 0 ? 4194303.f : fval < 0 ? -4194303.f : 0.f;
    const float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* (int)v truncated toward zero when lo <= v <= hi; 0 otherwise (NaN).
 * Float-to-int casts of out-of-range values are undefined in C; for the
 * values the reference quantizers produce this is exactly their cast. */
static inline int to_int_in(float v, int lo, int hi) {
    return v >= (float)lo && v <= (float)hi ? (int)v : 0;
}

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
        float amax = 0.0f, max = 0.0f; /* largest |x| and its signed value */
        for (int j = 0; j < KP_QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
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
static float kp_quant_fit_scale_min(int n, int nmax, const float *x, const float *weights, uint8_t *L,
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
 * quant.h), and the two FP16 super-block scales. */
static void kp_quant_k_pack_scales(const float scales[8], const float mins[8], float max_scale,
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

/* Q4_K: sc[j], m[j] from the 12 packed bytes (layout table in quant.h). */
void kp_quant_q4k_unpack_scales(const uint8_t q[12], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4);
        m[j] = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

void kp_quant_k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t L[KP_QK_K],
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
        scales[j] = kp_quant_fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    kp_quant_k_pack_scales(scales, mins, max_scale, max_min, packed, d, dmin);
    /* requantize with the scales as stored */
    uint8_t sc[8], m[8];
    kp_quant_q4k_unpack_scales(packed, sc, m);
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
        kp_quant_k_scales(x, 15, -1.f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);

        uint8_t *q = y[i].qs;
        for (int j = 0; j < KP_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
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

bool kp_quantize_row(kp_dtype t, const float *src, void *dst, int64_t n) {
    const kp_dtype_info *info = kp_dtype_get((uint32_t)t);
    if (!info || n < 0 || n % info->block_size != 0) return false;
    switch (t) {
    case KP_DTYPE_F32: fp32_copy_row(src, dst, n); return true;
    case KP_DTYPE_F16: fp32_to_fp16_row_scalar(src, dst, n); return true;
    case KP_DTYPE_BF16: fp32_to_bf16_row_scalar(src, dst, n); return true;
    case KP_DTYPE_Q8_0: kp_quant_row_q8_0(src, dst, n); return true;
    case KP_DTYPE_Q4_0: quant_row_q4_0(src, dst, n); return true;
    case KP_DTYPE_Q4_K: quant_row_q4_K(src, dst, n); return true;
    case KP_DTYPE_Q6_K: quant_row_q6_K(src, dst, n); return true;
    case KP_DTYPE_Q8_K: kp_quant_row_q8_K(src, dst, n); return true;
    case KP_DTYPE_Q4_1: case KP_DTYPE_Q5_0: case KP_DTYPE_Q5_1: case KP_DTYPE_Q5_K:
    case KP_DTYPE_Q8_1: return kp_qmore_quantize_row(t, src, dst, n); /* quant_more.c */
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

static void dequant_q4_K(const kp_block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kp_fp16_to_fp32(x[i].d), min = kp_fp16_to_fp32(x[i].dmin);
        uint8_t sc[8], m[8];
        kp_quant_q4k_unpack_scales(x[i].scales, sc, m);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 4; j++, q += 32) {
            const float d1 = d * sc[2 * j], m1 = min * m[2 * j];
            const float d2 = d * sc[2 * j + 1], m2 = min * m[2 * j + 1];
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* Q6_K: the 256 signed quants (q - 32) of one block. */
static void q6k_unpack(const kp_block_q6_K *x, int8_t q[KP_QK_K]) {
    const uint8_t *ql = x->ql, *qh = x->qh;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, q += 128) {
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

static void dequant_q6_K(const kp_block_q6_K *x, float *y, int64_t nb) {
    int8_t q[KP_QK_K];
    for (int64_t i = 0; i < nb; i++, y += KP_QK_K) {
        const float d = kp_fp16_to_fp32(x[i].d);
        q6k_unpack(&x[i], q);
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
    case KP_DTYPE_F16: kp_fp16_to_fp32_row(src, dst, n); return true;
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
    case KP_DTYPE_Q4_1: case KP_DTYPE_Q5_0: case KP_DTYPE_Q5_1: case KP_DTYPE_Q5_K:
    case KP_DTYPE_Q8_1: return kp_qmore_dequantize_row(t, src, dst, n); /* quant_more.c */
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
    case KP_DTYPE_Q5_0: return KP_DTYPE_Q8_0;
    case KP_DTYPE_Q4_1: case KP_DTYPE_Q5_1: return KP_DTYPE_Q8_1;
    case KP_DTYPE_Q5_K: return KP_DTYPE_Q8_K;
    default: return KP_DTYPE_COUNT_;
    }
}

/* ------------------------------------------------------------------------ */
/* Scalar kernels                                                            */
/* ------------------------------------------------------------------------ */

static void vec_dot_f32_scalar(int64_t n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * y[i];
    *s = (float)sum;
}

static void vec_dot_f16_scalar(int64_t n, float *s, const void *w, const void *a) {
    const uint16_t *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)kp_fp16_to_fp32(x[i]) * kp_fp16_to_fp32(y[i]);
    *s = (float)sum;
}

static void vec_dot_bf16_scalar(int64_t n, float *s, const void *w, const void *a) {
    const uint16_t *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)kp_bf16_to_fp32(x[i]) * kp_bf16_to_fp32(y[i]);
    *s = (float)sum;
}

static void vec_dot_q8_0_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q8_0 *x = w, *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < KP_QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += sumi * (kp_fp16_to_fp32(x[i].d) * kp_fp16_to_fp32(y[i].d));
    }
    *s = sumf;
}

static void vec_dot_q4_0_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q4_0 *x = w;
    const kp_block_q8_0 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < KP_QK4_0 / 2; j++) {
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + KP_QK4_0 / 2];
        }
        sumf += sumi * (kp_fp16_to_fp32(x[i].d) * kp_fp16_to_fp32(y[i].d));
    }
    *s = sumf;
}

static void vec_dot_q4_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q4_K *x = w;
    const kp_block_q8_K *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        uint8_t sc[8], m[8];
        kp_quant_q4k_unpack_scales(x[i].scales, sc, m);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int sumi = 0;
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            int s_lo = 0, s_hi = 0;
            for (int l = 0; l < 32; l++) {
                s_lo += (q4[l] & 0xF) * q8[l];
                s_hi += (q4[l] >> 4) * q8[l + 32];
            }
            sumi += sc[2 * j] * s_lo + sc[2 * j + 1] * s_hi;
        }
        int summ = 0;
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sumf += y[i].d * kp_fp16_to_fp32(x[i].d) * sumi - y[i].d * kp_fp16_to_fp32(x[i].dmin) * summ;
    }
    *s = sumf;
}

static void vec_dot_q6_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q6_K *x = w;
    const kp_block_q8_K *y = a;
    int8_t q[KP_QK_K];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        q6k_unpack(&x[i], q);
        int sumi = 0;
        for (int j = 0; j < KP_QK_K / 16; j++) {
            int sub = 0;
            for (int l = 0; l < 16; l++) sub += q[16 * j + l] * y[i].qs[16 * j + l];
            sumi += x[i].scales[j] * sub;
        }
        sumf += kp_fp16_to_fp32(x[i].d) * y[i].d * sumi;
    }
    *s = sumf;
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

typedef void (*vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);

static void dot_tile_generic(vec_dot_fn dot, int64_t n, int nr, int nc, const void *w,
                             size_t w_stride, const void *a, size_t a_stride, float *out,
                             size_t out_stride) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            dot(n, &out[(size_t)c * out_stride + (size_t)r], (const char *)w + (size_t)r * w_stride,
                (const char *)a + (size_t)c * a_stride);
}

#define SCALAR_TILE(name, dot)                                                             \
    static void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,           \
                     const void *a, size_t a_stride, float *out, size_t out_stride) {     \
        dot_tile_generic(dot, n, nr, nc, w, w_stride, a, a_stride, out, out_stride);       \
    }
SCALAR_TILE(tile_f32_scalar, vec_dot_f32_scalar)
SCALAR_TILE(tile_f16_scalar, vec_dot_f16_scalar)
SCALAR_TILE(tile_bf16_scalar, vec_dot_bf16_scalar)
SCALAR_TILE(tile_q8_0_scalar, vec_dot_q8_0_scalar)
SCALAR_TILE(tile_q4_0_scalar, vec_dot_q4_0_scalar)
SCALAR_TILE(tile_q4_K_scalar, vec_dot_q4_K_scalar)
SCALAR_TILE(tile_q6_K_scalar, vec_dot_q6_K_scalar)
#undef SCALAR_TILE

#define SCALAR_GEMM(name, dot)                                                                \
    static void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,              \
                     const void *a, size_t a_stride, const void *aux, size_t aux_stride,      \
                     float *out, size_t out_stride) {                                        \
        (void)aux;                                                                            \
        (void)aux_stride;                                                                     \
        dot_tile_generic(dot, n, nr, nc, w, w_stride, a, a_stride, out, out_stride);          \
    }
SCALAR_GEMM(gemm_f32_scalar, vec_dot_f32_scalar)
SCALAR_GEMM(gemm_f16_scalar, vec_dot_f16_scalar)
SCALAR_GEMM(gemm_bf16_scalar, vec_dot_bf16_scalar)
SCALAR_GEMM(gemm_q8_0_scalar, vec_dot_q8_0_scalar)
SCALAR_GEMM(gemm_q4_0_scalar, vec_dot_q4_0_scalar)
SCALAR_GEMM(gemm_q4_K_scalar, vec_dot_q4_K_scalar)
SCALAR_GEMM(gemm_q6_K_scalar, vec_dot_q6_K_scalar)
#undef SCALAR_GEMM

static float dot_f32_scalar(int64_t n, const float *x, const float *y) {
    float sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i] * y[i];
    return sum;
}

static float dot_f32_f16_scalar(int64_t n, const float *x, const uint16_t *y) {
    float sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i] * kp_fp16_to_fp32(y[i]);
    return sum;
}

static void axpy_f32_scalar(int64_t n, float a, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16_scalar(int64_t n, float a, const uint16_t *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] += a * kp_fp16_to_fp32(x[i]);
}

static const kp_kernels kernels_scalar = {
    .name = "scalar",
    .quantize_act =
        {
            [KP_DTYPE_F32] = fp32_copy_row,
            [KP_DTYPE_F16] = fp32_to_fp16_row_scalar,
            [KP_DTYPE_BF16] = fp32_to_bf16_row_scalar,
            [KP_DTYPE_Q8_0] = kp_quant_row_q8_0,
            [KP_DTYPE_Q4_0] = kp_quant_row_q8_0,
            [KP_DTYPE_Q4_K] = kp_quant_row_q8_K,
            [KP_DTYPE_Q6_K] = kp_quant_row_q8_K,
            [KP_DTYPE_Q4_1] = kp_qmore_quant_row_q8_1, /* quant_more.c */
            [KP_DTYPE_Q5_0] = kp_quant_row_q8_0,
            [KP_DTYPE_Q5_1] = kp_qmore_quant_row_q8_1,
            [KP_DTYPE_Q5_K] = kp_quant_row_q8_K,
        },
    .vec_dot =
        {
            [KP_DTYPE_F32] = vec_dot_f32_scalar,
            [KP_DTYPE_F16] = vec_dot_f16_scalar,
            [KP_DTYPE_BF16] = vec_dot_bf16_scalar,
            [KP_DTYPE_Q8_0] = vec_dot_q8_0_scalar,
            [KP_DTYPE_Q4_0] = vec_dot_q4_0_scalar,
            [KP_DTYPE_Q4_K] = vec_dot_q4_K_scalar,
            [KP_DTYPE_Q6_K] = vec_dot_q6_K_scalar,
            [KP_DTYPE_Q4_1] = kp_qmore_vec_dot_q4_1_scalar, /* quant_more.c */
            [KP_DTYPE_Q5_0] = kp_qmore_vec_dot_q5_0_scalar,
            [KP_DTYPE_Q5_1] = kp_qmore_vec_dot_q5_1_scalar,
            [KP_DTYPE_Q5_K] = kp_qmore_vec_dot_q5_K_scalar,
        },
    .dot_tile =
        {
            [KP_DTYPE_F32] = tile_f32_scalar,
            [KP_DTYPE_F16] = tile_f16_scalar,
            [KP_DTYPE_BF16] = tile_bf16_scalar,
            [KP_DTYPE_Q8_0] = tile_q8_0_scalar,
            [KP_DTYPE_Q4_0] = tile_q4_0_scalar,
            [KP_DTYPE_Q4_K] = tile_q4_K_scalar,
            [KP_DTYPE_Q6_K] = tile_q6_K_scalar,
            [KP_DTYPE_Q4_1] = kp_qmore_tile_q4_1_scalar, /* quant_more.c */
            [KP_DTYPE_Q5_0] = kp_qmore_tile_q5_0_scalar,
            [KP_DTYPE_Q5_1] = kp_qmore_tile_q5_1_scalar,
            [KP_DTYPE_Q5_K] = kp_qmore_tile_q5_K_scalar,
        },
    .gemm =
        {
            [KP_DTYPE_F32] = gemm_f32_scalar,
            [KP_DTYPE_F16] = gemm_f16_scalar,
            [KP_DTYPE_BF16] = gemm_bf16_scalar,
            [KP_DTYPE_Q8_0] = gemm_q8_0_scalar,
            [KP_DTYPE_Q4_0] = gemm_q4_0_scalar,
            [KP_DTYPE_Q4_K] = gemm_q4_K_scalar,
            [KP_DTYPE_Q6_K] = gemm_q6_K_scalar,
        },
    .dot_f32 = dot_f32_scalar,
    .dot_f32_f16 = dot_f32_f16_scalar,
    .axpy_f32 = axpy_f32_scalar,
    .axpy_f16 = axpy_f16_scalar,
};

const kp_kernels *kp_kernels_scalar(void) { return &kernels_scalar; }

const kp_kernels *kp_kernels_avx2(void) {
#if defined(__x86_64__)
    /* libgcc fills the CPU model in a constructor; no __builtin_cpu_init()
     * here, it would write shared state from every calling thread */
    bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if !defined(__clang__)
    ok = ok && __builtin_cpu_supports("f16c"); /* clang 14 has no "f16c" here; every
                                                 AVX2 CPU has F16C */
#endif
    if (ok) return kp_quant_avx2_table();
#endif
    return NULL;
}

const kp_kernels *kp_kernels_avx512vnni(void) {
#if defined(__x86_64__)
    if (kp_kernels_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        return kp_quant_avx512vnni_table();
#endif
    return NULL;
}

const kp_kernels *kp_kernels_best(void) {
    const kp_kernels *k = kp_kernels_avx512vnni();
    if (!k) k = kp_kernels_avx2();
    return k ? k : &kernels_scalar;
}
