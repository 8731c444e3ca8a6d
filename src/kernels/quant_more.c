/*
 * quant_more.c - Q4_1, Q5_0, Q5_1, Q5_K weights and Q8_1 activations:
 * reference quantizers, dequantizers and the portable kernels (block
 * layouts in quant_more.h; the public contract is quant.h's).
 *
 * What it owns:
 *   - The reference quantizers. They repeat llama.cpp's quantize_row_*_ref
 *     operation for operation (same order, same float rounding; built as
 *     ISO C, so no FMA contraction), so the bytes equal llama-quantize
 *     --pure's, which encodes these types with exactly those functions when
 *     no importance matrix is given:
 *
 *       Q4_1  per block of 32: d = (max - min)/15, m = min,
 *             q = min(15, trunc((x - min)/d + 0.5))
 *       Q5_0  d = -(signed value of the largest |x|)/16,
 *             q = min(31, trunc(x/d + 16.5))
 *       Q5_1  d = (max - min)/31, m = min, q = trunc((x - min)/d + 0.5)
 *       Q8_1  d = amax/127, q = roundf(x/d), s = d * sum(q)
 *       Q5_K  per 32-element sub-block: weighted least-squares fit of
 *             x ~ scale*q - min (q in 0..31, weights |x| + rms of the
 *             sub-block) over 16 candidate grids (llama.cpp's
 *             make_qkx2_quants with rmin -0.5, rdelta 0.1, nstep 15);
 *             6-bit scales and mins relative to the largest ones, then the
 *             quants are recomputed with the stored (rounded) scales.
 *
 *     "/d" is a multiplication by id = 1/d (0 when d is 0), as in llama.cpp.
 *   - Dequantizers, one loop per layout.
 *   - Scalar kernels: integer dot products inside a block, float
 *     accumulation across blocks; dot_tile is nr*nc vec_dot calls.
 *
 * Invariants: no mutable state, every function reentrant. Float-to-int
 * casts are range-checked (to_int_in) so that NaN or inf inputs give
 * defined, memory-safe garbage rather than undefined behaviour; for finite
 * inputs the checks never change a result.
 */
#include "kernels/quant_more.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/quant_impl.h"

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Round to nearest, ties to even, through the 1.5*2^23 trick (llama.cpp's
 * nearest_int); out-of-range arguments (NaN, huge) are clamped first. */
static inline int nearest_int(float fval) {
    if (!(fabsf(fval) <= 4194303.f)) fval = fval > 0 ? 4194303.f : fval < 0 ? -4194303.f : 0.f;
    const float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* (int)v truncated toward zero when lo <= v <= hi; 0 otherwise (NaN, inf). */
static inline int to_int_in(float v, int lo, int hi) {
    return v >= (float)lo && v <= (float)hi ? (int)v : 0;
}

static inline float half(uint16_t h) { return kp_fp16_to_fp32(h); }

/* ------------------------------------------------------------------------ */
/* reference quantizers                                                      */
/* ------------------------------------------------------------------------ */

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

void kp_qmore_quant_row_q8_1(const float *x, void *dst, int64_t n) {
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

static void quant_row_q5_K(const float *x, kp_block_q5_K *y, int64_t nb) {
    uint8_t L[KP_QK_K];

    for (int64_t i = 0; i < nb; i++, x += KP_QK_K) {
        /* sub-block fit, 6-bit scales packed as Q4_K's, requantized as stored */
        kp_quant_k_scales(x, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);

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

bool kp_qmore_quantize_row(kp_dtype t, const float *x, void *dst, int64_t n) {
    switch (t) {
    case KP_DTYPE_Q4_1: quant_row_q4_1(x, dst, n / KP_QK4_1); return true;
    case KP_DTYPE_Q5_0: quant_row_q5_0(x, dst, n / KP_QK5_0); return true;
    case KP_DTYPE_Q5_1: quant_row_q5_1(x, dst, n / KP_QK5_1); return true;
    case KP_DTYPE_Q5_K: quant_row_q5_K(x, dst, n / KP_QK_K); return true;
    case KP_DTYPE_Q8_1: kp_qmore_quant_row_q8_1(x, dst, n); return true;
    default: return false;
    }
}

/* ------------------------------------------------------------------------ */
/* dequantizers                                                              */
/* ------------------------------------------------------------------------ */

/* The 32 quants (0..31) of a Q5_0/Q5_1 block. */
static void unpack_q5(const uint8_t qh[4], const uint8_t qs[16], uint8_t q[32]) {
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                       (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 0xF) | ((h >> j) & 1) << 4);
        q[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
}

/* The 256 quants (0..31) of a Q5_K block. */
static void unpack_q5_K(const kp_block_q5_K *x, uint8_t q[KP_QK_K]) {
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t b = x->qs[32 * c + l], h = x->qh[l];
            q[64 * c + l] = (uint8_t)((b & 0xF) | ((h >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (uint8_t)((b >> 4) | ((h >> (2 * c + 1)) & 1) << 4);
        }
    }
}

bool kp_qmore_dequantize_row(kp_dtype t, const void *src, float *y, int64_t n) {
    uint8_t q[KP_QK_K];
    switch (t) {
    case KP_DTYPE_Q4_1: {
        const kp_block_q4_1 *x = src;
        for (int64_t i = 0; i < n / KP_QK4_1; i++, y += KP_QK4_1) {
            const float d = half(x[i].d), m = half(x[i].m);
            for (int j = 0; j < 16; j++) {
                y[j] = (x[i].qs[j] & 0xF) * d + m;
                y[j + 16] = (x[i].qs[j] >> 4) * d + m;
            }
        }
        return true;
    }
    case KP_DTYPE_Q5_0: {
        const kp_block_q5_0 *x = src;
        for (int64_t i = 0; i < n / KP_QK5_0; i++, y += KP_QK5_0) {
            const float d = half(x[i].d);
            unpack_q5(x[i].qh, x[i].qs, q);
            for (int j = 0; j < 32; j++) y[j] = (q[j] - 16) * d;
        }
        return true;
    }
    case KP_DTYPE_Q5_1: {
        const kp_block_q5_1 *x = src;
        for (int64_t i = 0; i < n / KP_QK5_1; i++, y += KP_QK5_1) {
            const float d = half(x[i].d), m = half(x[i].m);
            unpack_q5(x[i].qh, x[i].qs, q);
            for (int j = 0; j < 32; j++) y[j] = q[j] * d + m;
        }
        return true;
    }
    case KP_DTYPE_Q8_1: {
        const kp_block_q8_1 *x = src;
        for (int64_t i = 0; i < n / KP_QK8_1; i++, y += KP_QK8_1) {
            const float d = half(x[i].d);
            for (int j = 0; j < 32; j++) y[j] = x[i].qs[j] * d;
        }
        return true;
    }
    case KP_DTYPE_Q5_K: {
        const kp_block_q5_K *x = src;
        for (int64_t i = 0; i < n / KP_QK_K; i++, y += KP_QK_K) {
            const float d = half(x[i].d), min = half(x[i].dmin);
            uint8_t sc[8], m[8];
            kp_quant_q4k_unpack_scales(x[i].scales, sc, m);
            unpack_q5_K(&x[i], q);
            for (int j = 0; j < 8; j++) {
                const float d1 = d * sc[j], m1 = min * m[j];
                for (int l = 0; l < 32; l++) y[32 * j + l] = d1 * q[32 * j + l] - m1;
            }
        }
        return true;
    }
    default: return false;
    }
}

/* ------------------------------------------------------------------------ */
/* scalar kernels                                                            */
/* ------------------------------------------------------------------------ */

void kp_qmore_vec_dot_q4_1_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q4_1 *x = w;
    const kp_block_q8_1 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (x[i].qs[j] & 0xF) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        }
        sumf += half(x[i].d) * half(y[i].d) * sumi + half(x[i].m) * half(y[i].s);
    }
    *s = sumf;
}

void kp_qmore_vec_dot_q5_0_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_0 *x = w;
    const kp_block_q8_0 *y = a;
    uint8_t q[32];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK5_0; i++) {
        unpack_q5(x[i].qh, x[i].qs, q);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += (q[j] - 16) * y[i].qs[j];
        sumf += sumi * (half(x[i].d) * half(y[i].d));
    }
    *s = sumf;
}

void kp_qmore_vec_dot_q5_1_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_1 *x = w;
    const kp_block_q8_1 *y = a;
    uint8_t q[32];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK5_1; i++) {
        unpack_q5(x[i].qh, x[i].qs, q);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += q[j] * y[i].qs[j];
        sumf += half(x[i].d) * half(y[i].d) * sumi + half(x[i].m) * half(y[i].s);
    }
    *s = sumf;
}

void kp_qmore_vec_dot_q5_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_K *x = w;
    const kp_block_q8_K *y = a;
    uint8_t q[KP_QK_K];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        uint8_t sc[8], m[8];
        kp_quant_q4k_unpack_scales(x[i].scales, sc, m);
        unpack_q5_K(&x[i], q);
        int sumi = 0;
        for (int j = 0; j < 8; j++) {
            int sub = 0;
            for (int l = 0; l < 32; l++) sub += q[32 * j + l] * y[i].qs[32 * j + l];
            sumi += sc[j] * sub;
        }
        int summ = 0;
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sumf += y[i].d * half(x[i].d) * sumi - y[i].d * half(x[i].dmin) * summ;
    }
    *s = sumf;
}

typedef void (*vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);

static void tile_by_vec_dot(vec_dot_fn dot, int64_t n, int nr, int nc, const void *w,
                            size_t w_stride, const void *a, size_t a_stride, float *out,
                            size_t out_stride) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            dot(n, &out[(size_t)c * out_stride + (size_t)r], (const char *)w + (size_t)r * w_stride,
                (const char *)a + (size_t)c * a_stride);
}

#define SCALAR_TILE(type)                                                                     \
    void kp_qmore_tile_##type##_scalar(int64_t n, int nr, int nc, const void *w,             \
                                       size_t w_stride, const void *a, size_t a_stride,      \
                                       float *out, size_t out_stride) {                      \
        tile_by_vec_dot(kp_qmore_vec_dot_##type##_scalar, n, nr, nc, w, w_stride, a, a_stride, \
                        out, out_stride);                                                    \
    }
SCALAR_TILE(q4_1)
SCALAR_TILE(q5_0)
SCALAR_TILE(q5_1)
SCALAR_TILE(q5_K)
#undef SCALAR_TILE
