/*
 * attn_avx2.c - the SIMD attention tables (see attn.h for the math and the
 * determinism contract): "avx2" (AVX2+FMA+F16C) and "avx512", which is the
 * same but runs the many-row tile loops, and the row layout's scores and
 * weighted sums (head sizes a multiple of 16), on 16-lane AVX-512F vectors. Head
 * sizes that are not a multiple of 8 use the scalar functions (all of a
 * tile's calls, so its workspace keeps one layout). No state; the tables
 * are constant.
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
#include "kernels/attn.h"

#include <math.h>
#include <string.h>

#include "kernels/tables.h"

#if defined(__x86_64__)
#include <immintrin.h>

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

AVX2 static void exp_row_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_ps(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float buf[8] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(buf, exp_ps(_mm256_loadu_ps(buf)));
        memcpy(y + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

AVX2 static void swiglu_row_avx2(float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp_ps(_mm256_xor_ps(g, sign));
        _mm256_storeu_ps(gate + i, _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + i)), _mm256_add_ps(one, e)));
    }
    for (; i < n; i++) gate[i] = gate[i] * up[i] / (1.0f + exp_1(-gate[i]));
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

/* ---- query-lane layout ---------------------------------------------------- */

typedef struct {
    int M, Mp, nv; /* rows, padded rows, row vectors */
    float *qt, *ot, *m, *l, *al, *tok, *s, *kf, *vf;
} lanes_ws;

/* gran: rows per register block (24 for AVX2, 48 for AVX-512); the rows
 * are padded to a multiple of it. */
static lanes_ws lanes_layout(const kp_attn_tile *t, int gran) {
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

static void lanes_begin(kp_attn_tile *t, const float *q, int64_t q_stride, int gran) {
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

/* Scores of 4 keys (kf rows) against 3 row vectors (24 rows) from qt:
 * 12 accumulators, each a fused chain over d. */
AVX2_INLINE void lanes_scores_4x3(int hd, int Mp, const float *qt, const float *kf, float *s, __m256 scale) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    const float *k0 = kf, *k1 = kf + hd, *k2 = kf + 2 * hd, *k3 = kf + 3 * hd;
    for (int d = 0; d < hd; d++) {
        const float *qd = qt + (size_t)d * Mp;
        __m256 q0 = _mm256_loadu_ps(qd), q1 = _mm256_loadu_ps(qd + 8), q2 = _mm256_loadu_ps(qd + 16);
        __m256 k = _mm256_broadcast_ss(k0 + d);
        c00 = _mm256_fmadd_ps(k, q0, c00);
        c01 = _mm256_fmadd_ps(k, q1, c01);
        c02 = _mm256_fmadd_ps(k, q2, c02);
        k = _mm256_broadcast_ss(k1 + d);
        c10 = _mm256_fmadd_ps(k, q0, c10);
        c11 = _mm256_fmadd_ps(k, q1, c11);
        c12 = _mm256_fmadd_ps(k, q2, c12);
        k = _mm256_broadcast_ss(k2 + d);
        c20 = _mm256_fmadd_ps(k, q0, c20);
        c21 = _mm256_fmadd_ps(k, q1, c21);
        c22 = _mm256_fmadd_ps(k, q2, c22);
        k = _mm256_broadcast_ss(k3 + d);
        c30 = _mm256_fmadd_ps(k, q0, c30);
        c31 = _mm256_fmadd_ps(k, q1, c31);
        c32 = _mm256_fmadd_ps(k, q2, c32);
    }
    _mm256_storeu_ps(s, _mm256_mul_ps(c00, scale));
    _mm256_storeu_ps(s + 8, _mm256_mul_ps(c01, scale));
    _mm256_storeu_ps(s + 16, _mm256_mul_ps(c02, scale));
    s += Mp;
    _mm256_storeu_ps(s, _mm256_mul_ps(c10, scale));
    _mm256_storeu_ps(s + 8, _mm256_mul_ps(c11, scale));
    _mm256_storeu_ps(s + 16, _mm256_mul_ps(c12, scale));
    s += Mp;
    _mm256_storeu_ps(s, _mm256_mul_ps(c20, scale));
    _mm256_storeu_ps(s + 8, _mm256_mul_ps(c21, scale));
    _mm256_storeu_ps(s + 16, _mm256_mul_ps(c22, scale));
    s += Mp;
    _mm256_storeu_ps(s, _mm256_mul_ps(c30, scale));
    _mm256_storeu_ps(s + 8, _mm256_mul_ps(c31, scale));
    _mm256_storeu_ps(s + 16, _mm256_mul_ps(c32, scale));
}

/* ot[d0..d0+3][24 rows] = ot * al + sum_j vf[j][d] * s[j], a fused chain
 * over the keys for each element. */
AVX2_INLINE void lanes_accum_4x3(int hd, int Mp, int n_keys, const float *s, const float *vf, float *ot,
                                 const float *al, bool rescale) {
    float *o0 = ot, *o1 = ot + Mp, *o2 = ot + 2 * Mp, *o3 = ot + 3 * Mp;
    __m256 c00 = _mm256_loadu_ps(o0), c01 = _mm256_loadu_ps(o0 + 8), c02 = _mm256_loadu_ps(o0 + 16);
    __m256 c10 = _mm256_loadu_ps(o1), c11 = _mm256_loadu_ps(o1 + 8), c12 = _mm256_loadu_ps(o1 + 16);
    __m256 c20 = _mm256_loadu_ps(o2), c21 = _mm256_loadu_ps(o2 + 8), c22 = _mm256_loadu_ps(o2 + 16);
    __m256 c30 = _mm256_loadu_ps(o3), c31 = _mm256_loadu_ps(o3 + 8), c32 = _mm256_loadu_ps(o3 + 16);
    if (rescale) {
        __m256 a0 = _mm256_loadu_ps(al), a1 = _mm256_loadu_ps(al + 8), a2 = _mm256_loadu_ps(al + 16);
        c00 = _mm256_mul_ps(c00, a0), c01 = _mm256_mul_ps(c01, a1), c02 = _mm256_mul_ps(c02, a2);
        c10 = _mm256_mul_ps(c10, a0), c11 = _mm256_mul_ps(c11, a1), c12 = _mm256_mul_ps(c12, a2);
        c20 = _mm256_mul_ps(c20, a0), c21 = _mm256_mul_ps(c21, a1), c22 = _mm256_mul_ps(c22, a2);
        c30 = _mm256_mul_ps(c30, a0), c31 = _mm256_mul_ps(c31, a1), c32 = _mm256_mul_ps(c32, a2);
    }
    for (int j = 0; j < n_keys; j++) {
        const float *sj = s + (size_t)j * Mp, *vj = vf + (size_t)j * hd;
        __m256 p0 = _mm256_loadu_ps(sj), p1 = _mm256_loadu_ps(sj + 8), p2 = _mm256_loadu_ps(sj + 16);
        __m256 v = _mm256_broadcast_ss(vj);
        c00 = _mm256_fmadd_ps(v, p0, c00);
        c01 = _mm256_fmadd_ps(v, p1, c01);
        c02 = _mm256_fmadd_ps(v, p2, c02);
        v = _mm256_broadcast_ss(vj + 1);
        c10 = _mm256_fmadd_ps(v, p0, c10);
        c11 = _mm256_fmadd_ps(v, p1, c11);
        c12 = _mm256_fmadd_ps(v, p2, c12);
        v = _mm256_broadcast_ss(vj + 2);
        c20 = _mm256_fmadd_ps(v, p0, c20);
        c21 = _mm256_fmadd_ps(v, p1, c21);
        c22 = _mm256_fmadd_ps(v, p2, c22);
        v = _mm256_broadcast_ss(vj + 3);
        c30 = _mm256_fmadd_ps(v, p0, c30);
        c31 = _mm256_fmadd_ps(v, p1, c31);
        c32 = _mm256_fmadd_ps(v, p2, c32);
    }
    _mm256_storeu_ps(o0, c00), _mm256_storeu_ps(o0 + 8, c01), _mm256_storeu_ps(o0 + 16, c02);
    _mm256_storeu_ps(o1, c10), _mm256_storeu_ps(o1 + 8, c11), _mm256_storeu_ps(o1 + 16, c12);
    _mm256_storeu_ps(o2, c20), _mm256_storeu_ps(o2 + 8, c21), _mm256_storeu_ps(o2 + 16, c22);
    _mm256_storeu_ps(o3, c30), _mm256_storeu_ps(o3 + 8, c31), _mm256_storeu_ps(o3 + 16, c32);
}

/* The step on K/V rows already in w.kf / w.vf (kf zero from n_keys up to
 * the next multiple of 4). */
AVX2_INLINE void lanes_step(kp_attn_tile *t, const lanes_ws *w, int n_keys, int32_t key_pos) {
    int hd = t->hd, Mp = w->Mp, nv = w->nv;
    __m256 scale = _mm256_set1_ps(t->scale);
    for (int j0 = 0; j0 < n_keys; j0 += 4) {
        const float *kf = w->kf + (size_t)j0 * hd;
        float *s = w->s + (size_t)j0 * Mp;
        for (int v = 0; v < nv; v += 3) lanes_scores_4x3(hd, Mp, w->qt + 8 * v, kf, s + 8 * v, scale);
    }
    /* softmax update, one vector of rows at a time, down the keys */
    int32_t delta = key_pos - t->pos0; /* key j is visible to token i iff j + delta <= i */
    bool all_visible = delta + n_keys - 1 <= 0;
    const __m256 ninf = _mm256_set1_ps(-INFINITY), one = _mm256_set1_ps(1.0f);
    bool rescale = false;
    for (int v = 0; v < nv; v++) {
        __m256 tok = _mm256_loadu_ps(w->tok + 8 * v);
        __m256 mold = _mm256_loadu_ps(w->m + 8 * v), mx = mold;
        for (int j = 0; j < n_keys; j++) {
            float *sj = w->s + (size_t)j * Mp + 8 * v;
            __m256 x = _mm256_loadu_ps(sj);
            if (!all_visible) {
                __m256 vis = _mm256_cmp_ps(_mm256_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ);
                x = _mm256_blendv_ps(ninf, x, vis);
                _mm256_storeu_ps(sj, x);
            }
            mx = _mm256_max_ps(mx, x);
        }
        __m256 same = _mm256_cmp_ps(mx, mold, _CMP_EQ_OQ);
        __m256 a = _mm256_blendv_ps(exp_ps(_mm256_sub_ps(mold, mx)), one, same);
        rescale = rescale || _mm256_movemask_ps(same) != 0xff;
        __m256 psum = _mm256_setzero_ps();
        for (int j = 0; j < n_keys; j++) {
            float *sj = w->s + (size_t)j * Mp + 8 * v;
            __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sj), mx));
            if (!all_visible)
                p = _mm256_and_ps(p, _mm256_cmp_ps(_mm256_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ));
            _mm256_storeu_ps(sj, p);
            psum = _mm256_add_ps(psum, p);
        }
        _mm256_storeu_ps(w->m + 8 * v, mx);
        _mm256_storeu_ps(w->l + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(w->l + 8 * v), a, psum));
        _mm256_storeu_ps(w->al + 8 * v, a);
    }
    /* ot = ot * al + V^T P */
    for (int d0 = 0; d0 < hd; d0 += 4) {
        float *ot = w->ot + (size_t)d0 * Mp;
        const float *vf = w->vf + d0;
        for (int v = 0; v < nv; v += 3)
            lanes_accum_4x3(hd, Mp, n_keys, w->s + 8 * v, vf, ot + 8 * v, w->al + 8 * v, rescale);
    }
}

static void lanes_end(const kp_attn_tile *t, float *out, int64_t out_stride, int gran) {
    lanes_ws w = lanes_layout(t, gran);
    int hd = t->hd, G = t->G;
    for (int r = 0; r < w.M; r++) {
        float inv = 1.0f / w.l[r];
        float *dst = out + (r / G) * out_stride + (r % G) * hd;
        for (int d = 0; d < hd; d++) dst[d] = w.ot[(size_t)d * w.Mp + r] * inv;
    }
}

static void lanes_partial(const kp_attn_tile *t, float *part, int gran) {
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

static keys_ws keys_layout(const kp_attn_tile *t) {
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

static void keys_begin(kp_attn_tile *t, const float *q, int64_t q_stride) {
    keys_ws w = keys_layout(t);
    int hd = t->hd, G = t->G;
    memset(w.q, 0, FEW_ROWS * (size_t)hd * sizeof(float));
    memset(w.o, 0, FEW_ROWS * (size_t)hd * sizeof(float));
    for (int r = 0; r < FEW_ROWS; r++) {
        if (r < w.M)
            memcpy(w.q + (size_t)r * hd, q + (r / G) * q_stride + (r % G) * hd, (size_t)hd * sizeof(float));
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
    }
}

AVX2_INLINE void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* kt[d][j] = row j of K (LOAD converts 8 elements) for j < n_keys, 0 for
 * n_keys <= j < STEP. */
#define KEYS_TRANSPOSE(LOAD, k, kt, n_keys, hd)                                         \
    do {                                                                                \
        for (int d0_ = 0; d0_ < (hd); d0_ += 8)                                         \
            for (int h_ = 0; h_ < 2; h_++) {                                            \
                __m256 r_[8];                                                           \
                for (int i_ = 0; i_ < 8; i_++) {                                        \
                    int j_ = 8 * h_ + i_;                                               \
                    r_[i_] = j_ < (n_keys) ? LOAD((k) + (size_t)j_ * (hd) + d0_) : _mm256_setzero_ps(); \
                }                                                                       \
                transpose8(r_);                                                         \
                for (int i_ = 0; i_ < 8; i_++)                                          \
                    _mm256_storeu_ps((kt) + (size_t)(d0_ + i_) * STEP + 8 * h_, r_[i_]); \
            }                                                                           \
    } while (0)

/* Scores of 4 rows (from q) against the step's 16 keys (two vectors):
 * 8 accumulators, each a fused chain over d. */
AVX2_INLINE void keys_scores_4(int hd, const float *q, const float *kt, __m256 scale, __m256 out[4][2]) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00;
    __m256 c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    const float *q0 = q, *q1 = q + hd, *q2 = q + 2 * hd, *q3 = q + 3 * hd;
    for (int d = 0; d < hd; d++) {
        __m256 k0 = _mm256_loadu_ps(kt + (size_t)d * STEP), k1 = _mm256_loadu_ps(kt + (size_t)d * STEP + 8);
        __m256 qb = _mm256_broadcast_ss(q0 + d);
        c00 = _mm256_fmadd_ps(qb, k0, c00);
        c01 = _mm256_fmadd_ps(qb, k1, c01);
        qb = _mm256_broadcast_ss(q1 + d);
        c10 = _mm256_fmadd_ps(qb, k0, c10);
        c11 = _mm256_fmadd_ps(qb, k1, c11);
        qb = _mm256_broadcast_ss(q2 + d);
        c20 = _mm256_fmadd_ps(qb, k0, c20);
        c21 = _mm256_fmadd_ps(qb, k1, c21);
        qb = _mm256_broadcast_ss(q3 + d);
        c30 = _mm256_fmadd_ps(qb, k0, c30);
        c31 = _mm256_fmadd_ps(qb, k1, c31);
    }
    out[0][0] = _mm256_mul_ps(c00, scale), out[0][1] = _mm256_mul_ps(c01, scale);
    out[1][0] = _mm256_mul_ps(c10, scale), out[1][1] = _mm256_mul_ps(c11, scale);
    out[2][0] = _mm256_mul_ps(c20, scale), out[2][1] = _mm256_mul_ps(c21, scale);
    out[3][0] = _mm256_mul_ps(c30, scale), out[3][1] = _mm256_mul_ps(c31, scale);
}

/* One row's softmax update and V accumulation from its scores s[0..1]. */
AVX2_INLINE void keys_row(const kp_attn_tile *t, const keys_ws *w, int r, const __m256 s[2], int n_keys,
                          int32_t key_pos) {
    int hd = t->hd;
    int64_t lim = (int64_t)t->pos0 + r / t->G - key_pos + 1;
    int nvis = lim < 0 ? 0 : lim > n_keys ? n_keys : (int)lim;
    if (nvis == 0) return;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256 idx0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), idx1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    __m256 nv = _mm256_set1_ps((float)nvis);
    __m256 vis0 = _mm256_cmp_ps(idx0, nv, _CMP_LT_OQ), vis1 = _mm256_cmp_ps(idx1, nv, _CMP_LT_OQ);
    __m256 s0 = _mm256_blendv_ps(ninf, s[0], vis0), s1 = _mm256_blendv_ps(ninf, s[1], vis1);
    float mold = w->m[r], mx = hmax(_mm256_max_ps(s0, s1));
    mx = mx > mold ? mx : mold;
    float a = mx == mold ? 1.0f : exp_1(mold - mx);
    __m256 mxv = _mm256_set1_ps(mx);
    float *p = w->p + (size_t)r * STEP;
    _mm256_storeu_ps(p, _mm256_and_ps(exp_ps(_mm256_sub_ps(s0, mxv)), vis0));
    _mm256_storeu_ps(p + 8, _mm256_and_ps(exp_ps(_mm256_sub_ps(s1, mxv)), vis1));
    __m128 psum = _mm_setzero_ps();
    for (int j = 0; j < nvis; j++) psum = _mm_add_ss(psum, _mm_set_ss(p[j]));
    w->l[r] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(w->l[r]), _mm_set_ss(a), psum));
    w->m[r] = mx;
    float *o = w->o + (size_t)r * hd;
    __m256 av = _mm256_set1_ps(a);
    int d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32) {
        __m256 c0 = _mm256_loadu_ps(o + d0), c1 = _mm256_loadu_ps(o + d0 + 8);
        __m256 c2 = _mm256_loadu_ps(o + d0 + 16), c3 = _mm256_loadu_ps(o + d0 + 24);
        if (a != 1.0f) {
            c0 = _mm256_mul_ps(c0, av), c1 = _mm256_mul_ps(c1, av);
            c2 = _mm256_mul_ps(c2, av), c3 = _mm256_mul_ps(c3, av);
        }
        for (int j = 0; j < nvis; j++) {
            __m256 pj = _mm256_broadcast_ss(p + j);
            const float *vr = w->vf + (size_t)j * hd + d0;
            c0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr), c0);
            c1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8), c1);
            c2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 16), c2);
            c3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 24), c3);
        }
        _mm256_storeu_ps(o + d0, c0), _mm256_storeu_ps(o + d0 + 8, c1);
        _mm256_storeu_ps(o + d0 + 16, c2), _mm256_storeu_ps(o + d0 + 24, c3);
    }
    for (; d0 < hd; d0 += 8) { /* hd is a multiple of 8 */
        __m256 c0 = _mm256_loadu_ps(o + d0);
        if (a != 1.0f) c0 = _mm256_mul_ps(c0, av);
        for (int j = 0; j < nvis; j++)
            c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(w->vf + (size_t)j * hd + d0), c0);
        _mm256_storeu_ps(o + d0, c0);
    }
}

/* The step on K already transposed into w.kt and V rows in w.vf. Rows
 * past M in w.q are zero, so rows go 4 at a time. */
AVX2_INLINE void keys_step(kp_attn_tile *t, const keys_ws *w, int n_keys, int32_t key_pos) {
    int hd = t->hd;
    __m256 scale = _mm256_set1_ps(t->scale);
    for (int r0 = 0; r0 < w->M; r0 += 4) {
        __m256 s[4][2];
        keys_scores_4(hd, w->q + (size_t)r0 * hd, w->kt, scale, s);
        for (int a = 0; a < 4 && r0 + a < w->M; a++) keys_row(t, w, r0 + a, s[a], n_keys, key_pos);
    }
}

static void keys_end(const kp_attn_tile *t, float *out, int64_t out_stride) {
    keys_ws w = keys_layout(t);
    kp_attn_rows_end(w.o, w.l, w.M, t->G, t->hd, out, out_stride);
}

static void keys_partial(const kp_attn_tile *t, float *part) {
    keys_ws w = keys_layout(t);
    kp_attn_rows_partial(w.o, w.m, w.l, w.M, t->hd, part);
}

/* ---- row layout (few rows, free order) ----------------------------------- */

/* 8 elements from K/V rows of either type, from element i; f16 is a
 * constant at every call, so the branch folds away. */
AVX2_INLINE __m256 load8_kv(const void *p, size_t i, bool f16) {
    return f16 ? load8_f16((const uint16_t *)p + i) : load8_f32((const float *)p + i);
}

/* p advanced by i elements. */
AVX2_INLINE const void *kv_at(const void *p, size_t i, bool f16) {
    return f16 ? (const void *)((const uint16_t *)p + i) : (const void *)((const float *)p + i);
}

/* Scores of 3 rows x 4 keys as dot products over d in 8 lanes (12
 * accumulators, each K vector converted once), reduced by hsum4. */
AVX2_INLINE void rows_scores_3x4(int hd, const float *q, const void *k, float *s, __m128 scale, bool f16) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00;
    __m256 c12 = c00, c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    const float *q1 = q + hd, *q2 = q + 2 * hd;
    size_t h = (size_t)hd;
    for (int d = 0; d < hd; d += 8) {
        __m256 x0 = _mm256_loadu_ps(q + d), x1 = _mm256_loadu_ps(q1 + d), x2 = _mm256_loadu_ps(q2 + d);
        __m256 k0 = load8_kv(k, (size_t)d, f16), k1 = load8_kv(k, h + d, f16);
        __m256 k2 = load8_kv(k, 2 * h + d, f16), k3 = load8_kv(k, 3 * h + d, f16);
        c00 = _mm256_fmadd_ps(x0, k0, c00), c10 = _mm256_fmadd_ps(x1, k0, c10), c20 = _mm256_fmadd_ps(x2, k0, c20);
        c01 = _mm256_fmadd_ps(x0, k1, c01), c11 = _mm256_fmadd_ps(x1, k1, c11), c21 = _mm256_fmadd_ps(x2, k1, c21);
        c02 = _mm256_fmadd_ps(x0, k2, c02), c12 = _mm256_fmadd_ps(x1, k2, c12), c22 = _mm256_fmadd_ps(x2, k2, c22);
        c03 = _mm256_fmadd_ps(x0, k3, c03), c13 = _mm256_fmadd_ps(x1, k3, c13), c23 = _mm256_fmadd_ps(x2, k3, c23);
    }
    _mm_storeu_ps(s, _mm_mul_ps(hsum4(c00, c01, c02, c03), scale));
    _mm_storeu_ps(s + STEP, _mm_mul_ps(hsum4(c10, c11, c12, c13), scale));
    _mm_storeu_ps(s + 2 * STEP, _mm_mul_ps(hsum4(c20, c21, c22, c23), scale));
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

AVX2_INLINE void rows_step(kp_attn_tile *t, const keys_ws *w, const void *k, const void *v, int n_keys,
                           int32_t key_pos, bool f16) {
    ROWS_STEP_BODY(rows_scores_3x4, rows_accum_3x4, 32)
}

/* ---- the tile entry points (both tables) ---------------------------------- */

enum { LAYOUT_SCALAR, LAYOUT_LANES, LAYOUT_KEYS, LAYOUT_ROWS };

static int layout_of(const kp_attn_tile *t) {
    if (t->hd % 8) return LAYOUT_SCALAR;
    if (t->n_tok * t->G >= 8) return LAYOUT_LANES;
    return t->free_order ? LAYOUT_ROWS : LAYOUT_KEYS;
}

static void tile_begin_gran(kp_attn_tile *t, const float *q, int64_t q_stride, int gran) {
    switch (layout_of(t)) {
    case LAYOUT_SCALAR: kp_attn_scalar_kernels.tile_begin(t, q, q_stride); break;
    case LAYOUT_LANES: lanes_begin(t, q, q_stride, gran); break;
    default: keys_begin(t, q, q_stride); break;
    }
}

static void tile_end_gran(const kp_attn_tile *t, float *out, int64_t out_stride, int gran) {
    switch (layout_of(t)) {
    case LAYOUT_SCALAR: kp_attn_scalar_kernels.tile_end(t, out, out_stride); break;
    case LAYOUT_LANES: lanes_end(t, out, out_stride, gran); break;
    default: keys_end(t, out, out_stride); break;
    }
}

static void tile_partial_gran(const kp_attn_tile *t, float *part, int gran) {
    switch (layout_of(t)) {
    case LAYOUT_SCALAR: kp_attn_scalar_kernels.tile_partial(t, part); break;
    case LAYOUT_LANES: lanes_partial(t, part, gran); break;
    default: keys_partial(t, part); break;
    }
}

/* A step: convert the rows the layout needs, then its loops. LOAD converts
 * 8 elements of a row (F16: true for half rows); LANES_STEP is the
 * query-lane step of the table, GRAN its row block, KEY_BLOCK the keys its
 * score loop takes at a time (K is zero up to a multiple of it). */
#define TILE_STEP_BODY(LOAD, F16, SCALAR_STEP, GRAN, KEY_BLOCK, LANES_STEP, ROWS_STEP)  \
    int hd = t->hd;                                                                     \
    switch (layout_of(t)) {                                                             \
    case LAYOUT_SCALAR:                                                                 \
        kp_attn_scalar_kernels.SCALAR_STEP(t, k, v, n_keys, key_pos);                        \
        break;                                                                          \
    case LAYOUT_LANES: {                                                                \
        kp_attn_prefetch_next(t, 0, 1);                                                 \
        lanes_ws w = lanes_layout(t, GRAN);                                             \
        ROWS_TO_F32(LOAD, k, w.kf, n_keys, (n_keys + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK, hd); \
        ROWS_TO_F32(LOAD, v, w.vf, n_keys, n_keys, hd);                                 \
        LANES_STEP(t, &w, n_keys, key_pos);                                             \
        break;                                                                          \
    }                                                                                   \
    case LAYOUT_KEYS: {                                                                 \
        kp_attn_prefetch_next(t, 0, 1);                                                 \
        keys_ws w = keys_layout(t);                                                     \
        KEYS_TRANSPOSE(LOAD, k, w.kt, n_keys, hd);                                      \
        ROWS_TO_F32(LOAD, v, w.vf, n_keys, n_keys, hd);                                 \
        keys_step(t, &w, n_keys, key_pos);                                              \
        break;                                                                          \
    }                                                                                   \
    default: {                                                                          \
        keys_ws w = keys_layout(t);                                                     \
        ROWS_STEP(t, &w, k, v, n_keys, key_pos, F16);                                   \
        break;                                                                          \
    }                                                                                   \
    }

AVX2 static void tile_step_f32_avx2(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos) {
    TILE_STEP_BODY(load8_f32, false, tile_step_f32, GRAN_AVX2, 4, lanes_step, rows_step)
}

AVX2 static void tile_step_f16_avx2(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                                    int32_t key_pos) {
    TILE_STEP_BODY(load8_f16, true, tile_step_f16, GRAN_AVX2, 4, lanes_step, rows_step)
}

static void tile_begin_avx2(kp_attn_tile *t, const float *q, int64_t q_stride) {
    tile_begin_gran(t, q, q_stride, GRAN_AVX2);
}
static void tile_end_avx2(const kp_attn_tile *t, float *out, int64_t out_stride) {
    tile_end_gran(t, out, out_stride, GRAN_AVX2);
}
static void tile_partial_avx2(const kp_attn_tile *t, float *part) { tile_partial_gran(t, part, GRAN_AVX2); }

/* ---- AVX-512: the query-lane layout on 16-lane vectors -------------------- */

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

/* exp_ps on 16 lanes: the same operations, lane for lane. */
AVX512_INLINE __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.336548f);
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);
}

AVX512 static void exp_row_avx512(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp512(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

AVX512 static void swiglu_row_avx512(float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 y = _mm512_div_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, up + i)), _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(gate + i, m, y);
    }
}

#define Z3_DECL(a) __m512 c##a##0 = _mm512_setzero_ps(), c##a##1 = c##a##0, c##a##2 = c##a##0
#define Z3_FMA(a, x)                                                                    \
    do {                                                                                \
        __m512 x_ = _mm512_set1_ps(x);                                                  \
        c##a##0 = _mm512_fmadd_ps(x_, y0, c##a##0);                                     \
        c##a##1 = _mm512_fmadd_ps(x_, y1, c##a##1);                                     \
        c##a##2 = _mm512_fmadd_ps(x_, y2, c##a##2);                                     \
    } while (0)
#define Z3_LOAD(a, p)                                                                   \
    __m512 c##a##0 = _mm512_loadu_ps(p), c##a##1 = _mm512_loadu_ps((p) + 16),            \
           c##a##2 = _mm512_loadu_ps((p) + 32)
#define Z3_STORE(a, p, f)                                                               \
    do {                                                                                \
        _mm512_storeu_ps((p), f(c##a##0));                                              \
        _mm512_storeu_ps((p) + 16, f(c##a##1));                                         \
        _mm512_storeu_ps((p) + 32, f(c##a##2));                                         \
    } while (0)
#define Z3_SCALE(a)                                                                     \
    do {                                                                                \
        c##a##0 = _mm512_mul_ps(c##a##0, a0);                                           \
        c##a##1 = _mm512_mul_ps(c##a##1, a1);                                           \
        c##a##2 = _mm512_mul_ps(c##a##2, a2);                                           \
    } while (0)
#define Z_ID(x) (x)
#define Z_SCALED(x) _mm512_mul_ps((x), scale)

/* Scores of 8 keys (kf rows) against 48 rows from qt: 24 accumulators. */
AVX512_INLINE void lanes512_scores_8x3(int hd, int Mp, const float *qt, const float *kf, float *s,
                                       __m512 scale) {
    Z3_DECL(0); Z3_DECL(1); Z3_DECL(2); Z3_DECL(3);
    Z3_DECL(4); Z3_DECL(5); Z3_DECL(6); Z3_DECL(7);
    for (int d = 0; d < hd; d++) {
        const float *qd = qt + (size_t)d * Mp, *kd = kf + d;
        __m512 y0 = _mm512_loadu_ps(qd), y1 = _mm512_loadu_ps(qd + 16), y2 = _mm512_loadu_ps(qd + 32);
        Z3_FMA(0, kd[0]);
        Z3_FMA(1, kd[hd]);
        Z3_FMA(2, kd[2 * hd]);
        Z3_FMA(3, kd[3 * hd]);
        Z3_FMA(4, kd[4 * hd]);
        Z3_FMA(5, kd[5 * hd]);
        Z3_FMA(6, kd[6 * hd]);
        Z3_FMA(7, kd[7 * hd]);
    }
    Z3_STORE(0, s, Z_SCALED);
    Z3_STORE(1, s + Mp, Z_SCALED);
    Z3_STORE(2, s + 2 * Mp, Z_SCALED);
    Z3_STORE(3, s + 3 * Mp, Z_SCALED);
    Z3_STORE(4, s + 4 * Mp, Z_SCALED);
    Z3_STORE(5, s + 5 * Mp, Z_SCALED);
    Z3_STORE(6, s + 6 * Mp, Z_SCALED);
    Z3_STORE(7, s + 7 * Mp, Z_SCALED);
}

/* ot[d0..d0+7][48 rows] = ot * al + sum_j vf[j][d] * s[j]. */
AVX512_INLINE void lanes512_accum_8x3(int hd, int Mp, int n_keys, const float *s, const float *vf, float *ot,
                                      const float *al, bool rescale) {
    Z3_LOAD(0, ot); Z3_LOAD(1, ot + Mp); Z3_LOAD(2, ot + 2 * Mp); Z3_LOAD(3, ot + 3 * Mp);
    Z3_LOAD(4, ot + 4 * Mp); Z3_LOAD(5, ot + 5 * Mp); Z3_LOAD(6, ot + 6 * Mp); Z3_LOAD(7, ot + 7 * Mp);
    if (rescale) {
        __m512 a0 = _mm512_loadu_ps(al), a1 = _mm512_loadu_ps(al + 16), a2 = _mm512_loadu_ps(al + 32);
        Z3_SCALE(0); Z3_SCALE(1); Z3_SCALE(2); Z3_SCALE(3);
        Z3_SCALE(4); Z3_SCALE(5); Z3_SCALE(6); Z3_SCALE(7);
    }
    for (int j = 0; j < n_keys; j++) {
        const float *sj = s + (size_t)j * Mp, *vj = vf + (size_t)j * hd;
        __m512 y0 = _mm512_loadu_ps(sj), y1 = _mm512_loadu_ps(sj + 16), y2 = _mm512_loadu_ps(sj + 32);
        Z3_FMA(0, vj[0]);
        Z3_FMA(1, vj[1]);
        Z3_FMA(2, vj[2]);
        Z3_FMA(3, vj[3]);
        Z3_FMA(4, vj[4]);
        Z3_FMA(5, vj[5]);
        Z3_FMA(6, vj[6]);
        Z3_FMA(7, vj[7]);
    }
    Z3_STORE(0, ot, Z_ID);
    Z3_STORE(1, ot + Mp, Z_ID);
    Z3_STORE(2, ot + 2 * Mp, Z_ID);
    Z3_STORE(3, ot + 3 * Mp, Z_ID);
    Z3_STORE(4, ot + 4 * Mp, Z_ID);
    Z3_STORE(5, ot + 5 * Mp, Z_ID);
    Z3_STORE(6, ot + 6 * Mp, Z_ID);
    Z3_STORE(7, ot + 7 * Mp, Z_ID);
}

/* lanes_step on 16-lane vectors (kf zero from n_keys up to the next
 * multiple of 8). */
AVX512_INLINE void lanes512_step(kp_attn_tile *t, const lanes_ws *w, int n_keys, int32_t key_pos) {
    int hd = t->hd, Mp = w->Mp, nz = Mp / 16;
    __m512 scale = _mm512_set1_ps(t->scale);
    for (int j0 = 0; j0 < n_keys; j0 += 8) {
        const float *kf = w->kf + (size_t)j0 * hd;
        float *s = w->s + (size_t)j0 * Mp;
        for (int v = 0; v < nz; v += 3) lanes512_scores_8x3(hd, Mp, w->qt + 16 * v, kf, s + 16 * v, scale);
    }
    int32_t delta = key_pos - t->pos0;
    bool all_visible = delta + n_keys - 1 <= 0;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    bool rescale = false;
    for (int v = 0; v < nz; v++) {
        __m512 tok = _mm512_loadu_ps(w->tok + 16 * v);
        __m512 mold = _mm512_loadu_ps(w->m + 16 * v), mx = mold;
        for (int j = 0; j < n_keys; j++) {
            float *sj = w->s + (size_t)j * Mp + 16 * v;
            __m512 x = _mm512_loadu_ps(sj);
            if (!all_visible) {
                __mmask16 vis = _mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ);
                x = _mm512_mask_blend_ps(vis, ninf, x);
                _mm512_storeu_ps(sj, x);
            }
            mx = _mm512_max_ps(mx, x);
        }
        __mmask16 same = _mm512_cmp_ps_mask(mx, mold, _CMP_EQ_OQ);
        __m512 a = _mm512_mask_blend_ps(same, exp512(_mm512_sub_ps(mold, mx)), one);
        rescale = rescale || same != 0xffff;
        __m512 psum = _mm512_setzero_ps();
        for (int j = 0; j < n_keys; j++) {
            float *sj = w->s + (size_t)j * Mp + 16 * v;
            __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(sj), mx));
            if (!all_visible)
                p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ), p);
            _mm512_storeu_ps(sj, p);
            psum = _mm512_add_ps(psum, p);
        }
        _mm512_storeu_ps(w->m + 16 * v, mx);
        _mm512_storeu_ps(w->l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(w->l + 16 * v), a, psum));
        _mm512_storeu_ps(w->al + 16 * v, a);
    }
    for (int d0 = 0; d0 < hd; d0 += 8) {
        float *ot = w->ot + (size_t)d0 * Mp;
        const float *vf = w->vf + d0;
        for (int v = 0; v < nz; v += 3)
            lanes512_accum_8x3(hd, Mp, n_keys, w->s + 16 * v, vf, ot + 16 * v, w->al + 16 * v, rescale);
    }
}

/* The row layout (chunked decode, free order) on 16 lanes: scores of 3 rows
 * x 4 keys over d in 16 lanes, each 512-bit sum folded to 8 lanes, then
 * hsum4 as on 8 lanes; weighted V sums of 3 rows x 64 dims per pass. */
AVX512_INLINE __m512 load16_kv(const void *p, size_t i, bool f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
               : _mm512_loadu_ps((const float *)p + i);
}

AVX512_INLINE __m256 fold512(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

AVX512_INLINE void rows512_scores_3x4(int hd, const float *q, const void *k, float *s, __m128 scale, bool f16) {
    __m512 c[3][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) c[r][j] = _mm512_setzero_ps();
    size_t h = (size_t)hd;
    for (int d = 0; d < hd; d += 16) {
        __m512 x[3], kk[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++) x[r] = _mm512_loadu_ps(q + r * h + d);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) kk[j] = load16_kv(k, j * h + d, f16);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++) c[r][j] = _mm512_fmadd_ps(x[r], kk[j], c[r][j]);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++)
        _mm_storeu_ps(s + r * STEP, _mm_mul_ps(hsum4(fold512(c[r][0]), fold512(c[r][1]), fold512(c[r][2]),
                                                     fold512(c[r][3])), scale));
}

AVX512_INLINE void rows512_accum_3x4(int hd, int n_keys, const float *p, const void *v, float *o, const float *al,
                                     bool f16) {
    __m512 c[3][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++) {
        const __m512 a = _mm512_set1_ps(al[r]);
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) c[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)r * hd + 16 * i), a);
    }
    for (int j = 0; j < n_keys; j++) {
        __m512 vv[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) vv[i] = load16_kv(v, (size_t)j * hd + 16 * i, f16);
        _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++) {
            const __m512 x = _mm512_set1_ps(p[r * STEP + j]);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) c[r][i] = _mm512_fmadd_ps(x, vv[i], c[r][i]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < 3; r++)
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm512_storeu_ps(o + (size_t)r * hd + 16 * i, c[r][i]);
}

AVX512_INLINE void rows512_step(kp_attn_tile *t, const keys_ws *w, const void *k, const void *v, int n_keys,
                                int32_t key_pos, bool f16) {
    if (t->hd % 16) {
        rows_step(t, w, k, v, n_keys, key_pos, f16);
        return;
    }
    ROWS_STEP_BODY(rows512_scores_3x4, rows512_accum_3x4, 64)
}
#undef ROWS_STEP_BODY

AVX512 static void tile_step_f32_avx512(kp_attn_tile *t, const float *k, const float *v, int n_keys,
                                        int32_t key_pos) {
    TILE_STEP_BODY(load8_f32, false, tile_step_f32, GRAN_AVX512, 8, lanes512_step, rows512_step)
}

AVX512 static void tile_step_f16_avx512(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                                        int32_t key_pos) {
    TILE_STEP_BODY(load8_f16, true, tile_step_f16, GRAN_AVX512, 8, lanes512_step, rows512_step)
}

static void tile_begin_avx512(kp_attn_tile *t, const float *q, int64_t q_stride) {
    tile_begin_gran(t, q, q_stride, GRAN_AVX512);
}
static void tile_end_avx512(const kp_attn_tile *t, float *out, int64_t out_stride) {
    tile_end_gran(t, out, out_stride, GRAN_AVX512);
}
static void tile_partial_avx512(const kp_attn_tile *t, float *part) { tile_partial_gran(t, part, GRAN_AVX512); }

/* ---- row kernels ---------------------------------------------------------- */

#define MAX_HD_VEC 32 /* head_dim up to 256 in registers-by-loop */

const kp_attn_kernels kp_attn_avx2_kernels = {
    .name = "avx2",
    .tile_begin = tile_begin_avx2,
    .tile_step_f32 = tile_step_f32_avx2,
    .tile_step_f16 = tile_step_f16_avx2,
    .tile_end = tile_end_avx2,
    .tile_partial = tile_partial_avx2,
    .exp_row = exp_row_avx2,
    .swiglu_row = swiglu_row_avx2,
};

const kp_attn_kernels kp_attn_avx512_kernels = {
    .name = "avx512",
    .tile_begin = tile_begin_avx512,
    .tile_step_f32 = tile_step_f32_avx512,
    .tile_step_f16 = tile_step_f16_avx512,
    .tile_end = tile_end_avx512,
    .tile_partial = tile_partial_avx512,
    .exp_row = exp_row_avx512,
    .swiglu_row = swiglu_row_avx512,
};

#else /* not x86-64: no SIMD tables */

typedef int kp_attn_avx2_unused;

#endif
