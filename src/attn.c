/*
 * attn.c - attention inner loops, scalar and AVX2 (see attn.h).
 *
 * The AVX2 versions keep one K row (converted from F16 with F16C) in
 * registers while computing the G dot products, and one V row while
 * updating the G accumulators. Head sizes that are not a multiple of 8
 * use the scalar code. No state; the tables are constant.
 */
#include "attn.h"

#include "quant.h"

static void scores_f32_c(int hd, int G, const float *q, const float *k, int64_t n_rows, float scale,
                         float *out, int64_t out_stride) {
    for (int64_t i = 0; i < n_rows; i++)
        for (int g = 0; g < G; g++) {
            float s = 0;
            for (int j = 0; j < hd; j++) s += q[g * hd + j] * k[i * hd + j];
            out[g * out_stride + i] = s * scale;
        }
}

static void scores_f16_c(int hd, int G, const float *q, const uint16_t *k, int64_t n_rows, float scale,
                         float *out, int64_t out_stride) {
    for (int64_t i = 0; i < n_rows; i++)
        for (int g = 0; g < G; g++) {
            float s = 0;
            for (int j = 0; j < hd; j++) s += q[g * hd + j] * kp_fp16_to_fp32(k[i * hd + j]);
            out[g * out_stride + i] = s * scale;
        }
}

static void accum_f32_c(int hd, int G, const float *w, int64_t w_stride, const float *v, int64_t n_rows,
                        float *acc) {
    for (int64_t i = 0; i < n_rows; i++)
        for (int g = 0; g < G; g++) {
            float wi = w[g * w_stride + i];
            for (int j = 0; j < hd; j++) acc[g * hd + j] += wi * v[i * hd + j];
        }
}

static void accum_f16_c(int hd, int G, const float *w, int64_t w_stride, const uint16_t *v,
                        int64_t n_rows, float *acc) {
    for (int64_t i = 0; i < n_rows; i++)
        for (int g = 0; g < G; g++) {
            float wi = w[g * w_stride + i];
            for (int j = 0; j < hd; j++) acc[g * hd + j] += wi * kp_fp16_to_fp32(v[i * hd + j]);
        }
}

static const kp_attn_kernels attn_scalar = {"scalar", scores_f32_c, scores_f16_c, accum_f32_c,
                                            accum_f16_c};

const kp_attn_kernels *kp_attn_scalar(void) { return &attn_scalar; }

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define MAX_HD_VEC 32 /* head_dim up to 256 in registers-by-loop */

AVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline __m256 load_row(const float *p) { return _mm256_loadu_ps(p); }
AVX2 static inline __m256 load_row_h(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* 4 dot products reduced at once: lane sums of a0..a3 -> one __m128. */
AVX2 static inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    __m256 s = _mm256_hadd_ps(s01, s23); /* lanes: 0 1 2 3 | 0 1 2 3 (two halves) */
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* Scores, 4 rows at a time: each q vector load serves 4 rows and the four
 * sums are reduced together. LOAD converts 8 elements of a row. */
#define SCORES_BODY(LOAD)                                                                 \
    if (hd % 8 || hd / 8 > MAX_HD_VEC) {                                                  \
        SCALAR(hd, G, q, k, n_rows, scale, out, out_stride);                              \
        return;                                                                           \
    }                                                                                     \
    int nv = hd / 8;                                                                      \
    __m128 vscale = _mm_set1_ps(scale);                                                   \
    int64_t i = 0;                                                                        \
    for (; i + 4 <= n_rows; i += 4) {                                                     \
        for (int g = 0; g < G; g++) {                                                     \
            const float *qg = q + g * hd;                                                 \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                   \
            for (int j = 0; j < nv; j++) {                                                \
                __m256 qj = _mm256_loadu_ps(qg + 8 * j);                                  \
                a0 = _mm256_fmadd_ps(LOAD(k + (i + 0) * hd + 8 * j), qj, a0);             \
                a1 = _mm256_fmadd_ps(LOAD(k + (i + 1) * hd + 8 * j), qj, a1);             \
                a2 = _mm256_fmadd_ps(LOAD(k + (i + 2) * hd + 8 * j), qj, a2);             \
                a3 = _mm256_fmadd_ps(LOAD(k + (i + 3) * hd + 8 * j), qj, a3);             \
            }                                                                             \
            _mm_storeu_ps(out + g * out_stride + i, _mm_mul_ps(hsum4(a0, a1, a2, a3), vscale)); \
        }                                                                                 \
    }                                                                                     \
    for (; i < n_rows; i++)                                                               \
        for (int g = 0; g < G; g++) {                                                     \
            const float *qg = q + g * hd;                                                 \
            __m256 a0 = _mm256_setzero_ps();                                              \
            for (int j = 0; j < nv; j++)                                                  \
                a0 = _mm256_fmadd_ps(LOAD(k + i * hd + 8 * j), _mm256_loadu_ps(qg + 8 * j), a0); \
            out[g * out_stride + i] = hsum(a0) * scale;                                   \
        }

#define SCALAR scores_f32_c
AVX2 static void scores_f32_avx2(int hd, int G, const float *q, const float *k, int64_t n_rows,
                                 float scale, float *out, int64_t out_stride) {
    SCORES_BODY(load_row)
}
#undef SCALAR
#define SCALAR scores_f16_c
AVX2 static void scores_f16_avx2(int hd, int G, const float *q, const uint16_t *k, int64_t n_rows,
                                 float scale, float *out, int64_t out_stride) {
    SCORES_BODY(load_row_h)
}
#undef SCALAR

/* Accumulation with the accumulators in registers: 4 vectors (32 dims) of
 * up to 3 heads at a time (12 registers), rows streaming through. */
#define ACCUM_BODY(LOAD)                                                                  \
    if (hd % 32) {                                                                        \
        SCALAR(hd, G, w, w_stride, v, n_rows, acc);                                       \
        return;                                                                           \
    }                                                                                     \
    for (int g0 = 0; g0 < G; g0 += 3) {                                                   \
        int gn = G - g0 < 3 ? G - g0 : 3;                                                 \
        for (int j0 = 0; j0 < hd; j0 += 32) {                                             \
            __m256 c[3][4];                                                               \
            for (int g = 0; g < gn; g++)                                                  \
                for (int u = 0; u < 4; u++)                                               \
                    c[g][u] = _mm256_loadu_ps(acc + (g0 + g) * hd + j0 + 8 * u);          \
            for (int64_t i = 0; i < n_rows; i++) {                                        \
                __m256 r0 = LOAD(v + i * hd + j0), r1 = LOAD(v + i * hd + j0 + 8);         \
                __m256 r2 = LOAD(v + i * hd + j0 + 16), r3 = LOAD(v + i * hd + j0 + 24);   \
                for (int g = 0; g < gn; g++) {                                            \
                    __m256 wi = _mm256_broadcast_ss(w + (g0 + g) * w_stride + i);         \
                    c[g][0] = _mm256_fmadd_ps(wi, r0, c[g][0]);                           \
                    c[g][1] = _mm256_fmadd_ps(wi, r1, c[g][1]);                           \
                    c[g][2] = _mm256_fmadd_ps(wi, r2, c[g][2]);                           \
                    c[g][3] = _mm256_fmadd_ps(wi, r3, c[g][3]);                           \
                }                                                                         \
            }                                                                             \
            for (int g = 0; g < gn; g++)                                                  \
                for (int u = 0; u < 4; u++)                                               \
                    _mm256_storeu_ps(acc + (g0 + g) * hd + j0 + 8 * u, c[g][u]);          \
        }                                                                                 \
    }

#define SCALAR accum_f32_c
AVX2 static void accum_f32_avx2(int hd, int G, const float *w, int64_t w_stride, const float *v,
                                int64_t n_rows, float *acc) {
    ACCUM_BODY(load_row)
}
#undef SCALAR
#define SCALAR accum_f16_c
AVX2 static void accum_f16_avx2(int hd, int G, const float *w, int64_t w_stride, const uint16_t *v,
                                int64_t n_rows, float *acc) {
    ACCUM_BODY(load_row_h)
}
#undef SCALAR

static const kp_attn_kernels attn_avx2 = {"avx2", scores_f32_avx2, scores_f16_avx2, accum_f32_avx2,
                                          accum_f16_avx2};

const kp_attn_kernels *kp_attn_best(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &attn_avx2;
    return &attn_scalar;
}
#else
const kp_attn_kernels *kp_attn_best(void) { return &attn_scalar; }
#endif
