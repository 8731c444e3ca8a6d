/*
 * attn_avx2.c - the attention table "avx2" (attn.h): tiles, exp_row and
 * swiglu_row with AVX2 + FMA + F16C. Every function carries
 * __attribute__((target("avx2,fma,f16c"))) (AVX2, AVX2_INLINE of
 * attn_avx2_inl.h); dispatch.c hands the table out only when the CPU has
 * all three. Outside x86-64 the file is empty. No state; the table is
 * constant.
 *
 * It owns the 8-lane query-lane loops (scores of 4 keys x 3 row vectors,
 * weighted sums of 4 dims x 3 row vectors), the key-lane layout (decode:
 * K transposed once per step, 8 keys per vector), and the row layout's
 * 8-lane scores and 32-dim accumulation; the layouts, their workspaces and
 * the shared kernels are drawn in attn_avx2_inl.h. The avx512 table
 * (attn_avx512.c) calls this table's entries for the layouts it does not
 * redo on 16 lanes, and head sizes that are not a multiple of 8 go to the
 * scalar table (attn_scalar.c).
 */
#include "kernels/attn.h"

#if defined(__x86_64__)

#include "kernels/attn_avx2_inl.h"
#include "kernels/tables.h"

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

/* GeGLU (attn.h): F16 rounding by vcvtps2ph (to nearest even, as
 * kp_fp32_to_fp16, NaN included), the table read by a gather. */
AVX2 static void geglu_row_avx2(const float *table, float *gate, const float *up, int64_t n) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        const __m128i h = _mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 y = _mm256_mul_ps(_mm256_i32gather_ps(table, _mm256_cvtepu16_epi32(h), 4), u);
        y = _mm256_blendv_ps(y, _mm256_mul_ps(g, u), _mm256_cmp_ps(g, hi, _CMP_GE_OQ));
        y = _mm256_andnot_ps(_mm256_cmp_ps(g, lo, _CMP_LE_OQ), y);
        _mm256_storeu_ps(gate + i, y);
    }
    for (; i < n; i++) {
        const float g = gate[i];
        if (g <= -10.0f) gate[i] = 0.0f;
        else if (g >= 10.0f) gate[i] = g * up[i];
        else gate[i] = table[_cvtss_sh(g, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)] * up[i];
    }
}

/* ---- query-lane layout ---------------------------------------------------- */

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

/* ---- key-lane layout ------------------------------------------------------ */

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

AVX2_INLINE void rows_step(kp_attn_tile *t, const keys_ws *w, const void *k, const void *v, int n_keys,
                           int32_t key_pos, bool f16) {
    ROWS_STEP_BODY(rows_scores_3x4, rows_accum_3x4, 32)
}
#undef ROWS_STEP_BODY

/* ---- the tile entry points ------------------------------------------------- */

static void tile_begin_avx2(kp_attn_tile *t, const float *q, int64_t q_stride) {
    switch (layout_of(t)) {
    case LAYOUT_SCALAR: kp_attn_scalar_kernels.tile_begin(t, q, q_stride); break;
    case LAYOUT_LANES: lanes_begin(t, q, q_stride, GRAN_AVX2); break;
    default: keys_begin(t, q, q_stride); break;
    }
}

static void tile_end_avx2(const kp_attn_tile *t, float *out, int64_t out_stride) {
    switch (layout_of(t)) {
    case LAYOUT_SCALAR: kp_attn_scalar_kernels.tile_end(t, out, out_stride); break;
    case LAYOUT_LANES: lanes_end(t, out, out_stride, GRAN_AVX2); break;
    default: keys_end(t, out, out_stride); break;
    }
}

static void tile_partial_avx2(const kp_attn_tile *t, float *part) {
    switch (layout_of(t)) {
    case LAYOUT_SCALAR: kp_attn_scalar_kernels.tile_partial(t, part); break;
    case LAYOUT_LANES: lanes_partial(t, part, GRAN_AVX2); break;
    default: keys_partial(t, part); break;
    }
}

/* A step: convert the rows the layout needs, then its loops. LOAD converts
 * 8 elements of a row (F16: true for half rows); the query-lane score loop
 * takes 4 keys at a time (K is zero up to a multiple of 4). */
#define TILE_STEP_BODY(LOAD, F16, SCALAR_STEP)                                          \
    int hd = t->hd;                                                                     \
    switch (layout_of(t)) {                                                             \
    case LAYOUT_SCALAR:                                                                 \
        kp_attn_scalar_kernels.SCALAR_STEP(t, k, v, n_keys, key_pos);                   \
        break;                                                                          \
    case LAYOUT_LANES: {                                                                \
        kp_attn_prefetch_next(t, 0, 1);                                                 \
        lanes_ws w = lanes_layout(t, GRAN_AVX2);                                        \
        ROWS_TO_F32(LOAD, k, w.kf, n_keys, (n_keys + 3) / 4 * 4, hd);                   \
        ROWS_TO_F32(LOAD, v, w.vf, n_keys, n_keys, hd);                                 \
        lanes_step(t, &w, n_keys, key_pos);                                             \
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
        rows_step(t, &w, k, v, n_keys, key_pos, F16);                                   \
        break;                                                                          \
    }                                                                                   \
    }

AVX2 static void tile_step_f32_avx2(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos) {
    TILE_STEP_BODY(load8_f32, false, tile_step_f32)
}

AVX2 static void tile_step_f16_avx2(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                                    int32_t key_pos) {
    TILE_STEP_BODY(load8_f16, true, tile_step_f16)
}
#undef TILE_STEP_BODY

AVX2 static void kv_rows_avx2(kp_dtype t, const void *src, float *dst, int64_t n) { kv_to_f32_avx2(t, src, dst, n); }

AVX2 static void tile_step_kv_avx2(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt,
                                   int n_keys, int32_t key_pos) {
    tile_step_kv_with(t, k, kt, v, vt, n_keys, key_pos, kv_rows_avx2, tile_step_f32_avx2);
}

const kp_attn_kernels kp_attn_avx2_kernels = {
    .name = "avx2",
    .tile_begin = tile_begin_avx2,
    .tile_step_f32 = tile_step_f32_avx2,
    .tile_step_f16 = tile_step_f16_avx2,
    .tile_step_kv = tile_step_kv_avx2,
    .tile_end = tile_end_avx2,
    .tile_partial = tile_partial_avx2,
    .exp_row = exp_row_avx2,
    .swiglu_row = swiglu_row_avx2,
    .geglu_row = geglu_row_avx2,
};

#else /* not x86-64: no AVX2 table */

typedef int kp_attn_avx2_unused;

#endif
