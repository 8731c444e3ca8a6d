/*
 * attn_avx2_inl.h - private to attn_avx2.c and attn_avx512.c: the tile
 * layouts of the SIMD attention tables (see attn.h for the math and the
 * determinism contract), "avx2" (AVX2+FMA+F16C) and "avx512", and the
 * AVX2 code both use: the vector exp, horizontal sums, loading a step's
 * rows as F32, the workspace layouts with their begin/end/partial, and the
 * row layout's softmax and tail kernels. Include only on x86-64; nothing
 * else includes this file. Every function here is static inline; the
 * vector ones AVX2_INLINE (always inlined, target avx2,fma,f16c), so they
 * are compiled with the target of the kernel that uses them. Head sizes
 * that are not a multiple of 8 use the scalar table (all of a tile's calls,
 * so its workspace keeps one layout).
 *
 * A tile picks a layout from M = n_tok * G and free_order at every call
 * (they never change during a tile):
 *
 * Query lanes (M >= 8, prefill): each vector holds 8 (16) query rows, so
 * the scores of a step are a small matrix product with no horizontal sums:
 * S[j][r] = sum_d K[j][d] * Qt[d][r], with K[j][d] broadcast and 4 keys x 3
 * row vectors (avx512: 8 keys x 3) in registers; the softmax update runs
 * down the key axis, one vector of rows at a time; and o is kept
 * transposed, Ot[d][r] += V[j][d] * P[j][r], 4 (8) dims x 3 row vectors in
 * registers. Workspace (Mp = M rounded up to GRAN = 24, avx512 48; each
 * part starts on 16 floats):
 *
 *   qt   [hd][Mp]    queries, transposed (padding rows 0)
 *   ot   [hd][Mp]    running weighted sums, transposed
 *   m    [Mp]        running max           l   [Mp]  running sum
 *   al   [Mp]        this step's rescale   tok [Mp]  token index r / G
 *   s    [STEP][Mp]  the step's scores, then weights
 *   kf   [STEP][hd]  the step's K rows as F32 (0 past n_keys, to the key block)
 *   vf   [STEP][hd]  the step's V rows as F32
 *
 * Key lanes (M < 8, decode): each vector holds 8 keys of one row, so a
 * row's scores for a step are two vectors, S[r][j] = sum_d Q[r][d] *
 * Kt[d][j], Q[r][d] broadcast, K transposed once per step (8x8 blocks).
 * Rows (M < 8 with free_order, chunked decode): scores as dot products over
 * d in 8 lanes, 3 rows x 4 keys, reduced by horizontal adds; K and V are
 * read (and converted) where they lie, once per block of 3 rows. Both use:
 *
 *   q    [9][hd]     queries, row by row (rows past M: 0)
 *   o    [9][hd]     running weighted sums
 *   m, l, al [9]     running max, sum, this step's rescale
 *   p    [9][STEP]   scores, then weights of the step
 *   kt   [hd][STEP]  key lanes: the step's K rows transposed as F32 (padding 0)
 *   vf   [STEP][hd]  key lanes: the step's V rows as F32
 *
 * Query lanes and key lanes do, for every element, the same IEEE
 * operations in the same order (scores: one fused multiply-add chain over d
 * from 0; weights: exp of the same differences with the same vector exp,
 * which has the same operations on 8 and 16 lanes; the sum of a step's
 * weights in key order, then l = fma(l, a, sum); o: one fused chain over
 * keys), so a row gives the same bits in either, and in either table. A
 * row's masked keys get weight 0 and add exactly nothing. Every fused
 * multiply-add is written out, and no multiply feeds an add that a compiler
 * allowed to contract (-ffp-contract=fast) could fuse in one layout only.
 *
 * exp: e^x = 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 (ln 2
 * split in two parts, |r| <= ln 2 / 2); e^r = 1 + r + r^2 P(r) with the
 * degree-5 polynomial P of the Cephes library's expf; 2^n is built in the
 * exponent bits. Within 1 ulp on [-87.3, 88]; inputs below -87.3365
 * (e^x < FLT_MIN) give 0, so -inf gives 0.
 */
#ifndef KP_ATTN_AVX2_INL_H
#define KP_ATTN_AVX2_INL_H

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attn.h"
#include "kernels/tables.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#define STEP KP_ATTN_STEP
#define PART(n) (((size_t)(n) + 15) & ~(size_t)15)
#define GRAN_AVX2 24   /* query rows per register block: 3 vectors of 8 */
#define GRAN_AVX512 48 /* 3 vectors of 16 */

/* ---- exp ------------------------------------------------------------------ */

AVX2_INLINE __m256 exp_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.336548f); /* about ln(FLT_MIN) */
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
}

/* e^x of one float through the vector code (the same bits as a lane). */
AVX2_INLINE float exp_1(float x) { return _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(x))); }

AVX2_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 4 dot products reduced at once: lane sums of a0..a3 -> one __m128. */
AVX2_INLINE __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    __m256 s = _mm256_hadd_ps(s01, s23); /* lanes: 0 1 2 3 | 0 1 2 3 (two halves) */
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* Largest of the 8 lanes (exact in any order). */
AVX2_INLINE float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* ---- loading a step's rows as F32 --------------------------------------- */

AVX2_INLINE __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
AVX2_INLINE __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* dst[j*hd ..] = row j as F32 for j < n, 0 for n <= j < n_zero. */
#define ROWS_TO_F32(LOAD, src, dst, n, n_zero, hd)                                      \
    do {                                                                                \
        for (int j_ = 0; j_ < (n); j_++)                                                \
            for (int d_ = 0; d_ < (hd); d_ += 8)                                        \
                _mm256_storeu_ps((dst) + (size_t)j_ * (hd) + d_, LOAD((src) + (size_t)j_ * (hd) + d_)); \
        for (int j_ = (n); j_ < (n_zero); j_++)                                         \
            for (int d_ = 0; d_ < (hd); d_ += 8)                                        \
                _mm256_storeu_ps((dst) + (size_t)j_ * (hd) + d_, _mm256_setzero_ps());  \
    } while (0)

/* ---- rows of any KV type as F32 (tile_step_kv) ---------------------------- */

/* dst[0 .. n) = the n values of a Q8_0 row (n a multiple of 32): d * q in
 * F32, one rounding-free multiply per value (d has 11 significant bits, q
 * 8), the same numbers as kp_dequantize_row. */
AVX2_INLINE void dq_q8_0_avx2(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
        uint16_t dh;
        memcpy(&dh, src, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
        for (int i = 0; i < 4; i++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(src + 2 + 8 * i));
            _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

/* The same for Q4_0: value j < 16 is the low nibble of byte j, value 16 + j
 * its high nibble; x = d * (q - 8). */
AVX2_INLINE void dq_q4_0_avx2(const uint8_t *src, float *dst, int64_t n) {
    const __m128i lo4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
        uint16_t dh;
        memcpy(&dh, src, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
        __m128i qs = _mm_loadu_si128((const __m128i *)(src + 2));
        __m128i lo = _mm_sub_epi8(_mm_and_si128(qs, lo4), eight);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), lo4), eight);
        _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
        _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
        _mm256_storeu_ps(dst + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
        _mm256_storeu_ps(dst + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
    }
}

/* n values of a row of type t (F16, Q8_0 or Q4_0) into dst as F32. */
AVX2_INLINE void kv_to_f32_avx2(kp_dtype t, const void *src, float *dst, int64_t n) {
    if (t == KP_DTYPE_Q8_0) dq_q8_0_avx2(src, dst, n);
    else if (t == KP_DTYPE_Q4_0) dq_q4_0_avx2(src, dst, n);
    else {
        const uint16_t *h = src;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_f16(h + i));
        for (; i < n; i++) dst[i] = _cvtsh_ss(h[i]);
    }
}

/* A table's tile_step_kv: F32 rows as they are, the others decoded by
 * to_f32 into the tile's kv scratch (kp_attn_kv_scratch), then the table's
 * F32 step. Inlined, so both calls go straight to the table's functions. */
typedef void (*kv_to_f32_fn)(kp_dtype t, const void *src, float *dst, int64_t n);
typedef void (*kv_step_f32_fn)(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos);

static inline __attribute__((always_inline)) void tile_step_kv_with(kp_attn_tile *t, const void *k, kp_dtype kt,
                                                                  const void *v, kp_dtype vt, int n_keys,
                                                                  int32_t key_pos, kv_to_f32_fn to_f32,
                                                                  kv_step_f32_fn step_f32) {
    float *kf = kp_attn_kv_scratch(t), *vf = kf + (size_t)KP_ATTN_STEP * t->hd;
    int64_t n = (int64_t)n_keys * t->hd;
    if (kt != KP_DTYPE_F32) to_f32(kt, k, kf, n);
    if (vt != KP_DTYPE_F32) to_f32(vt, v, vf, n);
    step_f32(t, kt == KP_DTYPE_F32 ? (const float *)k : kf, vt == KP_DTYPE_F32 ? (const float *)v : vf, n_keys,
             key_pos);
}

/* ---- query-lane layout ---------------------------------------------------- */

typedef struct {
    int M, Mp, nv; /* rows, padded rows, row vectors */
    float *qt, *ot, *m, *l, *al, *tok, *s, *kf, *vf;
} lanes_ws;

/* gran: rows per register block (24 for AVX2, 48 for AVX-512); the rows
 * are padded to a multiple of it. */
static inline lanes_ws lanes_layout(const kp_attn_tile *t, int gran) {
    lanes_ws w;
    size_t hd = (size_t)t->hd;
    w.M = t->n_tok * t->G;
    w.Mp = (w.M + gran - 1) / gran * gran;
    w.nv = w.Mp / 8;
    size_t Mp = (size_t)w.Mp;
    w.qt = t->ws;
    w.ot = w.qt + PART(hd * Mp);
    w.m = w.ot + PART(hd * Mp);
    w.l = w.m + PART(Mp);
    w.al = w.l + PART(Mp);
    w.tok = w.al + PART(Mp);
    w.s = w.tok + PART(Mp);
    w.kf = w.s + PART(STEP * Mp);
    w.vf = w.kf + PART(STEP * hd);
    return w;
}

static inline void lanes_begin(kp_attn_tile *t, const float *q, int64_t q_stride, int gran) {
    lanes_ws w = lanes_layout(t, gran);
    int hd = t->hd, G = t->G;
    size_t Mp = (size_t)w.Mp;
    memset(w.ot, 0, (size_t)hd * Mp * sizeof(float));
    for (int r = 0; r < w.Mp; r++) {
        if (r < w.M) {
            const float *src = q + (r / G) * q_stride + (r % G) * hd;
            for (int d = 0; d < hd; d++) w.qt[(size_t)d * Mp + r] = src[d];
        } else {
            for (int d = 0; d < hd; d++) w.qt[(size_t)d * Mp + r] = 0.0f;
        }
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
        w.tok[r] = (float)((r < w.M ? r : w.M - 1) / G);
    }
}

static inline void lanes_end(const kp_attn_tile *t, float *out, int64_t out_stride, int gran) {
    lanes_ws w = lanes_layout(t, gran);
    int hd = t->hd, G = t->G;
    for (int r = 0; r < w.M; r++) {
        float inv = 1.0f / w.l[r];
        float *dst = out + (r / G) * out_stride + (r % G) * hd;
        for (int d = 0; d < hd; d++) dst[d] = w.ot[(size_t)d * w.Mp + r] * inv;
    }
}

static inline void lanes_partial(const kp_attn_tile *t, float *part, int gran) {
    lanes_ws w = lanes_layout(t, gran);
    int hd = t->hd;
    for (int r = 0; r < w.M; r++) {
        float *p = part + (size_t)r * (hd + 2);
        p[0] = w.m[r];
        p[1] = w.l[r];
        for (int d = 0; d < hd; d++) p[2 + d] = w.ot[(size_t)d * w.Mp + r];
    }
}

/* ---- key-lane layout ------------------------------------------------------ */

#define FEW_ROWS 9 /* rows of the few-row layouts' buffers: M < 8, padded to 3 */

typedef struct {
    int M;
    float *q, *o, *m, *l, *al, *p, *kt, *vf; /* kt: K transposed (key lanes) or K rows (rows) */
} keys_ws;

static inline keys_ws keys_layout(const kp_attn_tile *t) {
    keys_ws w;
    size_t hd = (size_t)t->hd;
    w.M = t->n_tok * t->G;
    w.q = t->ws;
    w.o = w.q + PART(FEW_ROWS * hd);
    w.m = w.o + PART(FEW_ROWS * hd);
    w.l = w.m + PART(FEW_ROWS);
    w.al = w.l + PART(FEW_ROWS);
    w.p = w.al + PART(FEW_ROWS);
    w.kt = w.p + PART(FEW_ROWS * STEP);
    w.vf = w.kt + PART(STEP * hd);
    return w;
}

/* ---- row layout (few rows, free order): what both tables use ------------- */

/* 8 elements from K/V rows of either type, from element i; f16 is a
 * constant at every call, so the branch folds away. */
AVX2_INLINE __m256 load8_kv(const void *p, size_t i, bool f16) {
    return f16 ? load8_f16((const uint16_t *)p + i) : load8_f32((const float *)p + i);
}

/* p advanced by i elements. */
AVX2_INLINE const void *kv_at(const void *p, size_t i, bool f16) {
    return f16 ? (const void *)((const uint16_t *)p + i) : (const void *)((const float *)p + i);
}

/* Scores of 3 rows x 1 key (the keys past the last multiple of 4). */
AVX2_INLINE void rows_scores_3x1(int hd, const float *q, const void *k, float *s, float scale, bool f16) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0;
    for (int d = 0; d < hd; d += 8) {
        __m256 kd = load8_kv(k, (size_t)d, f16);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kd, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + hd + d), kd, c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 2 * hd + d), kd, c2);
    }
    s[0] = hsum(c0) * scale;
    s[STEP] = hsum(c1) * scale;
    s[2 * STEP] = hsum(c2) * scale;
}

/* o[3 rows][32 dims] = o * al + sum_j p[j] * V[j] (12 accumulators, each
 * V vector converted once). */
AVX2_INLINE void rows_accum_3x4(int hd, int n_keys, const float *p, const void *v, float *o, const float *al,
                                bool f16) {
    float *o1 = o + hd, *o2 = o + 2 * hd;
    __m256 a = _mm256_broadcast_ss(al);
    __m256 c00 = _mm256_mul_ps(_mm256_loadu_ps(o), a), c01 = _mm256_mul_ps(_mm256_loadu_ps(o + 8), a);
    __m256 c02 = _mm256_mul_ps(_mm256_loadu_ps(o + 16), a), c03 = _mm256_mul_ps(_mm256_loadu_ps(o + 24), a);
    a = _mm256_broadcast_ss(al + 1);
    __m256 c10 = _mm256_mul_ps(_mm256_loadu_ps(o1), a), c11 = _mm256_mul_ps(_mm256_loadu_ps(o1 + 8), a);
    __m256 c12 = _mm256_mul_ps(_mm256_loadu_ps(o1 + 16), a), c13 = _mm256_mul_ps(_mm256_loadu_ps(o1 + 24), a);
    a = _mm256_broadcast_ss(al + 2);
    __m256 c20 = _mm256_mul_ps(_mm256_loadu_ps(o2), a), c21 = _mm256_mul_ps(_mm256_loadu_ps(o2 + 8), a);
    __m256 c22 = _mm256_mul_ps(_mm256_loadu_ps(o2 + 16), a), c23 = _mm256_mul_ps(_mm256_loadu_ps(o2 + 24), a);
    for (int j = 0; j < n_keys; j++) {
        size_t vj = (size_t)j * hd;
        __m256 v0 = load8_kv(v, vj, f16), v1 = load8_kv(v, vj + 8, f16);
        __m256 v2 = load8_kv(v, vj + 16, f16), v3 = load8_kv(v, vj + 24, f16);
        __m256 x = _mm256_broadcast_ss(p + j);
        c00 = _mm256_fmadd_ps(x, v0, c00), c01 = _mm256_fmadd_ps(x, v1, c01);
        c02 = _mm256_fmadd_ps(x, v2, c02), c03 = _mm256_fmadd_ps(x, v3, c03);
        x = _mm256_broadcast_ss(p + STEP + j);
        c10 = _mm256_fmadd_ps(x, v0, c10), c11 = _mm256_fmadd_ps(x, v1, c11);
        c12 = _mm256_fmadd_ps(x, v2, c12), c13 = _mm256_fmadd_ps(x, v3, c13);
        x = _mm256_broadcast_ss(p + 2 * STEP + j);
        c20 = _mm256_fmadd_ps(x, v0, c20), c21 = _mm256_fmadd_ps(x, v1, c21);
        c22 = _mm256_fmadd_ps(x, v2, c22), c23 = _mm256_fmadd_ps(x, v3, c23);
    }
    _mm256_storeu_ps(o, c00), _mm256_storeu_ps(o + 8, c01), _mm256_storeu_ps(o + 16, c02), _mm256_storeu_ps(o + 24, c03);
    _mm256_storeu_ps(o1, c10), _mm256_storeu_ps(o1 + 8, c11), _mm256_storeu_ps(o1 + 16, c12), _mm256_storeu_ps(o1 + 24, c13);
    _mm256_storeu_ps(o2, c20), _mm256_storeu_ps(o2 + 8, c21), _mm256_storeu_ps(o2 + 16, c22), _mm256_storeu_ps(o2 + 24, c23);
}

/* The same for 8 dims (head sizes that are not a multiple of 32). */
AVX2_INLINE void rows_accum_3x1(int hd, int n_keys, const float *p, const void *v, float *o, const float *al,
                                bool f16) {
    __m256 c0 = _mm256_mul_ps(_mm256_loadu_ps(o), _mm256_broadcast_ss(al));
    __m256 c1 = _mm256_mul_ps(_mm256_loadu_ps(o + hd), _mm256_broadcast_ss(al + 1));
    __m256 c2 = _mm256_mul_ps(_mm256_loadu_ps(o + 2 * hd), _mm256_broadcast_ss(al + 2));
    for (int j = 0; j < n_keys; j++) {
        __m256 vj = load8_kv(v, (size_t)j * hd, f16);
        c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), vj, c0);
        c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + STEP + j), vj, c1);
        c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + 2 * STEP + j), vj, c2);
    }
    _mm256_storeu_ps(o, c0), _mm256_storeu_ps(o + hd, c1), _mm256_storeu_ps(o + 2 * hd, c2);
}

/* The step's online softmax over the scores in w.p (3-row blocks, M3 rows):
 * weights in place, running max and sum, each row's rescale in w.al. */
AVX2_INLINE void rows_softmax(kp_attn_tile *t, const keys_ws *w, int M3, int n_keys, int32_t key_pos) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    const __m256 idx0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), idx1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    for (int r = 0; r < M3; r++) {
        float *p = w->p + (size_t)r * STEP;
        int64_t lim = (int64_t)t->pos0 + r / t->G - key_pos + 1;
        int nvis = r >= w->M || lim < 0 ? 0 : lim > n_keys ? n_keys : (int)lim;
        w->al[r] = 1.0f;
        if (nvis == 0) {
            _mm256_storeu_ps(p, zero);
            _mm256_storeu_ps(p + 8, zero);
            continue;
        }
        __m256 nv = _mm256_set1_ps((float)nvis);
        __m256 vis0 = _mm256_cmp_ps(idx0, nv, _CMP_LT_OQ), vis1 = _mm256_cmp_ps(idx1, nv, _CMP_LT_OQ);
        __m256 s0 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(p), vis0);
        __m256 s1 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(p + 8), vis1);
        float mold = w->m[r], mx = hmax(_mm256_max_ps(s0, s1));
        mx = mx > mold ? mx : mold;
        float a = mx == mold ? 1.0f : exp_1(mold - mx);
        __m256 mxv = _mm256_set1_ps(mx);
        __m256 p0 = _mm256_and_ps(exp_ps(_mm256_sub_ps(s0, mxv)), vis0);
        __m256 p1 = _mm256_and_ps(exp_ps(_mm256_sub_ps(s1, mxv)), vis1);
        _mm256_storeu_ps(p, p0);
        _mm256_storeu_ps(p + 8, p1);
        w->l[r] = w->l[r] * a + hsum(_mm256_add_ps(p0, p1));
        w->m[r] = mx;
        w->al[r] = a;
    }
}

/* The step, reading K and V rows where they are (each element is converted
 * once per block of 3 rows). Rows go 3 at a time; padding rows have q = 0
 * and weights 0. Uses w.q, w.o, w.m, w.l, w.al, w.p. The body is shared by
 * the 8- and 16-lane tables: SCORES_3X4 scores 3 rows x 4 keys, ACCUM_WIDE
 * accumulates WIDTH dims of 3 rows (then 32- and 8-dim passes finish the
 * head). While the first row block scores its keys, the next step's rows are
 * prefetched, a slice per 4 keys (kp_attn_prefetch_next). */
#define ROWS_STEP_BODY(SCORES_3X4, ACCUM_WIDE, WIDTH)                                                         \
    int hd = t->hd, M3 = (w->M + 2) / 3 * 3, n4 = n_keys / 4 * 4;                                             \
    __m128 scale = _mm_set1_ps(t->scale);                                                                      \
    for (int r0 = 0; r0 < M3; r0 += 3) {                                                                       \
        const float *q = w->q + (size_t)r0 * hd;                                                               \
        float *s = w->p + (size_t)r0 * STEP;                                                                   \
        for (int j = 0; j < n4; j += 4) {                                                                      \
            if (r0 == 0) kp_attn_prefetch_next(t, j / 4, STEP / 4);                                            \
            SCORES_3X4(hd, q, kv_at(k, (size_t)j * hd, f16), s + j, scale, f16);                               \
        }                                                                                                      \
        for (int j = n4; j < n_keys; j++) rows_scores_3x1(hd, q, kv_at(k, (size_t)j * hd, f16), s + j, t->scale, f16); \
    }                                                                                                          \
    for (int i = n4 / 4; i < STEP / 4; i++) kp_attn_prefetch_next(t, i, STEP / 4); /* short steps */         \
    rows_softmax(t, w, M3, n_keys, key_pos);                                                                   \
    for (int r0 = 0; r0 < M3; r0 += 3) {                                                                       \
        float *o = w->o + (size_t)r0 * hd;                                                                     \
        const float *p = w->p + (size_t)r0 * STEP, *al = w->al + r0;                                           \
        int d0 = 0;                                                                                            \
        for (; d0 + (WIDTH) <= hd; d0 += (WIDTH)) ACCUM_WIDE(hd, n_keys, p, kv_at(v, (size_t)d0, f16), o + d0, al, f16); \
        for (; d0 + 32 <= hd; d0 += 32) rows_accum_3x4(hd, n_keys, p, kv_at(v, (size_t)d0, f16), o + d0, al, f16); \
        for (; d0 < hd; d0 += 8) rows_accum_3x1(hd, n_keys, p, kv_at(v, (size_t)d0, f16), o + d0, al, f16);    \
    }

/* ---- which layout a tile uses ------------------------------------------- */

enum { LAYOUT_SCALAR, LAYOUT_LANES, LAYOUT_KEYS, LAYOUT_ROWS };

static inline int layout_of(const kp_attn_tile *t) {
    if (t->hd % 8) return LAYOUT_SCALAR;
    if (t->n_tok * t->G >= 8) return LAYOUT_LANES;
    return t->free_order ? LAYOUT_ROWS : LAYOUT_KEYS;
}

#endif
