/*
 * quant_scalar.c - the portable kernel table "scalar" (quant.h), every type
 * with kernels: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K and MXFP4 (byte layouts in quant_blocks.h). Plain ISO C, no target
 * attributes; always available.
 *
 * What it owns: straightforward loops, integer dot products inside a
 * block, float accumulation across blocks (F32/F16/BF16 rows accumulate in
 * double). dot_tile and gemm are nr*nc vec_dot calls; the table has gemm
 * entries for F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K and MXFP4 (callers cover the
 * others with dot_tile). quantize_act is the reference quantizers of
 * quant_ref.c, and the attention helpers accumulate in float in element
 * order. Half and bfloat16 fields are decoded with quant_ref.h's inline
 * decoders (the bodies of kp_fp16_to_fp32 and kp_bf16_to_fp32).
 *
 * Invariants: no mutable state; every function is reentrant. The table is
 * constant (tables.h; dispatch.c hands it out as kp_kernels_scalar()).
 */
#include "kernels/quant.h"

#include <math.h>

#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"
#include "kernels/tables.h"

static inline float half(uint16_t h) { return ref_fp16_to_fp32(h); }

static void vec_dot_f32_scalar(int64_t n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * y[i];
    *s = (float)sum;
}

static void vec_dot_f16_scalar(int64_t n, float *s, const void *w, const void *a) {
    const uint16_t *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)half(x[i]) * half(y[i]);
    *s = (float)sum;
}

static void vec_dot_bf16_scalar(int64_t n, float *s, const void *w, const void *a) {
    const uint16_t *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)ref_bf16_to_fp32(x[i]) * ref_bf16_to_fp32(y[i]);
    *s = (float)sum;
}

static void vec_dot_q8_0_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q8_0 *x = w, *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < KP_QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += sumi * (half(x[i].d) * half(y[i].d));
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
        sumf += sumi * (half(x[i].d) * half(y[i].d));
    }
    *s = sumf;
}

/* MXFP4 . Q8_0: the doubled E2M1 values times the quants, in int per
 * block, scaled by 2^(e - 128) x d_a (an exact product: a power of two)
 * and added with one fused multiply-add per block: the SIMD tables' steps
 * (quant_avx2_inl.h), so every table gives the same bits. */
static void vec_dot_mxfp4_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_mxfp4 *x = w;
    const kp_block_q8_0 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_MXFP4; i++) {
        int sumi = 0;
        for (int j = 0; j < KP_QK_MXFP4 / 2; j++) {
            sumi += kp_mxfp4_values[x[i].qs[j] & 0xF] * y[i].qs[j];
            sumi += kp_mxfp4_values[x[i].qs[j] >> 4] * y[i].qs[j + KP_QK_MXFP4 / 2];
        }
        sumf = fmaf((float)sumi, kp_e8m0_half(x[i].e) * half(y[i].d), sumf);
    }
    *s = sumf;
}

static void vec_dot_q4_1_scalar(int64_t n, float *s, const void *w, const void *a) {
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

static void vec_dot_q5_0_scalar(int64_t n, float *s, const void *w, const void *a) {
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

static void vec_dot_q5_1_scalar(int64_t n, float *s, const void *w, const void *a) {
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

static void vec_dot_q4_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q4_K *x = w;
    const kp_block_q8_K *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        uint8_t sc[8], m[8];
        unpack_k_scales(x[i].scales, sc, m);
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
        sumf += y[i].d * half(x[i].d) * sumi - y[i].d * half(x[i].dmin) * summ;
    }
    *s = sumf;
}

static void vec_dot_q5_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_K *x = w;
    const kp_block_q8_K *y = a;
    uint8_t q[KP_QK_K];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        uint8_t sc[8], m[8];
        unpack_k_scales(x[i].scales, sc, m);
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

static void vec_dot_q6_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q6_K *x = w;
    const kp_block_q8_K *y = a;
    int8_t q[KP_QK_K];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        unpack_q6_K(&x[i], q);
        int sumi = 0;
        for (int j = 0; j < KP_QK_K / 16; j++) {
            int sub = 0;
            for (int l = 0; l < 16; l++) sub += q[16 * j + l] * y[i].qs[16 * j + l];
            sumi += x[i].scales[j] * sub;
        }
        sumf += half(x[i].d) * y[i].d * sumi;
    }
    *s = sumf;
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
SCALAR_TILE(tile_q4_1_scalar, vec_dot_q4_1_scalar)
SCALAR_TILE(tile_q5_0_scalar, vec_dot_q5_0_scalar)
SCALAR_TILE(tile_q5_1_scalar, vec_dot_q5_1_scalar)
SCALAR_TILE(tile_q4_K_scalar, vec_dot_q4_K_scalar)
SCALAR_TILE(tile_q5_K_scalar, vec_dot_q5_K_scalar)
SCALAR_TILE(tile_q6_K_scalar, vec_dot_q6_K_scalar)
SCALAR_TILE(tile_mxfp4_scalar, vec_dot_mxfp4_scalar)
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
SCALAR_GEMM(gemm_mxfp4_scalar, vec_dot_mxfp4_scalar)
#undef SCALAR_GEMM

static float dot_f32_scalar(int64_t n, const float *x, const float *y) {
    float sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i] * y[i];
    return sum;
}

static float dot_f32_f16_scalar(int64_t n, const float *x, const uint16_t *y) {
    float sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i] * half(y[i]);
    return sum;
}

static void axpy_f32_scalar(int64_t n, float a, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16_scalar(int64_t n, float a, const uint16_t *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] += a * half(x[i]);
}

const kp_kernels kp_quant_scalar_kernels = {
    .name = "scalar",
    .quantize_act =
        {
            [KP_DTYPE_F32] = kp_quant_row_f32,
            [KP_DTYPE_F16] = kp_quant_row_f16,
            [KP_DTYPE_BF16] = kp_quant_row_bf16,
            [KP_DTYPE_Q8_0] = kp_quant_row_q8_0,
            [KP_DTYPE_Q4_0] = kp_quant_row_q8_0,
            [KP_DTYPE_Q4_K] = kp_quant_row_q8_K,
            [KP_DTYPE_Q6_K] = kp_quant_row_q8_K,
            [KP_DTYPE_Q4_1] = kp_quant_row_q8_1,
            [KP_DTYPE_Q5_0] = kp_quant_row_q8_0,
            [KP_DTYPE_Q5_1] = kp_quant_row_q8_1,
            [KP_DTYPE_Q5_K] = kp_quant_row_q8_K,
            [KP_DTYPE_MXFP4] = kp_quant_row_q8_0,
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
            [KP_DTYPE_Q4_1] = vec_dot_q4_1_scalar,
            [KP_DTYPE_Q5_0] = vec_dot_q5_0_scalar,
            [KP_DTYPE_Q5_1] = vec_dot_q5_1_scalar,
            [KP_DTYPE_Q5_K] = vec_dot_q5_K_scalar,
            [KP_DTYPE_MXFP4] = vec_dot_mxfp4_scalar,
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
            [KP_DTYPE_Q4_1] = tile_q4_1_scalar,
            [KP_DTYPE_Q5_0] = tile_q5_0_scalar,
            [KP_DTYPE_Q5_1] = tile_q5_1_scalar,
            [KP_DTYPE_Q5_K] = tile_q5_K_scalar,
            [KP_DTYPE_MXFP4] = tile_mxfp4_scalar,
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
            [KP_DTYPE_MXFP4] = gemm_mxfp4_scalar,
        },
    .dot_f32 = dot_f32_scalar,
    .dot_f32_f16 = dot_f32_f16_scalar,
    .axpy_f32 = axpy_f32_scalar,
    .axpy_f16 = axpy_f16_scalar,
};
