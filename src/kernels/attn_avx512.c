/*
 * attn_avx512.c - the attention table "avx512" (attn.h): the avx2 table
 * (attn_avx2.c) with the query-lane tile loops (prefill), the row layout's
 * scores and weighted sums (free-order tiles, head sizes a multiple of 16),
 * exp_row and swiglu_row on 16-lane AVX-512F vectors. Every function here
 * carries __attribute__((target("avx512f,avx2,fma,f16c"))) (AVX512,
 * AVX512_INLINE); dispatch.c hands the table out only when the CPU has
 * AVX-512F besides AVX2, FMA and F16C. Outside x86-64 the file is empty.
 * No state; the table is constant.
 *
 * The other layouts (key lanes, scalar head sizes, rows with head sizes
 * that are not a multiple of 16) are the avx2 table's entries, called
 * through it. The 16-lane query-lane loops keep 8 keys x 3 row vectors of
 * 16 (48 rows, GRAN_AVX512) in registers and do, lane for lane, the
 * operations of the 8-lane ones (exp512 is exp_ps on 16 lanes), so the
 * results equal the avx2 table's bit for bit except in free-order tiles,
 * which promise no summation order (attn.h). Layouts and workspaces:
 * attn_avx2_inl.h.
 */
#include "kernels/attn.h"

#if defined(__x86_64__)

#include "kernels/attn_avx2_inl.h"
#include "kernels/tables.h"

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

/* ---- exp ------------------------------------------------------------------ */

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

/* ---- query-lane layout on 16 lanes ---------------------------------------- */

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

/* ---- row layout on 16 lanes (head sizes a multiple of 16) ---------------- */

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

/* The row layout's step (ROWS_STEP_BODY, attn_avx2_inl.h) with 16-lane
 * scores and 64-dim accumulation; hd a multiple of 16. */
AVX512_INLINE void rows512_step(kp_attn_tile *t, const keys_ws *w, const void *k, const void *v, int n_keys,
                                int32_t key_pos, bool f16) {
    ROWS_STEP_BODY(rows512_scores_3x4, rows512_accum_3x4, 64)
}
#undef ROWS_STEP_BODY

/* ---- the tile entry points ------------------------------------------------- */

/* A step: the query-lane layout (K zero up to a multiple of 8 keys, the
 * score loop's block) and the row layout of head sizes that are a multiple
 * of 16 on 16 lanes; every other step is the avx2 table's. */
#define TILE_STEP_BODY(LOAD, F16, AVX2_STEP)                                            \
    int hd = t->hd;                                                                     \
    const int layout = layout_of(t);                                                    \
    if (layout == LAYOUT_LANES) {                                                       \
        kp_attn_prefetch_next(t, 0, 1);                                                 \
        lanes_ws w = lanes_layout(t, GRAN_AVX512);                                      \
        ROWS_TO_F32(LOAD, k, w.kf, n_keys, (n_keys + 7) / 8 * 8, hd);                   \
        ROWS_TO_F32(LOAD, v, w.vf, n_keys, n_keys, hd);                                 \
        lanes512_step(t, &w, n_keys, key_pos);                                          \
    } else if (layout == LAYOUT_ROWS && hd % 16 == 0) {                                 \
        keys_ws w = keys_layout(t);                                                     \
        rows512_step(t, &w, k, v, n_keys, key_pos, F16);                                \
    } else {                                                                            \
        kp_attn_avx2_kernels.AVX2_STEP(t, k, v, n_keys, key_pos);                       \
    }

AVX512 static void tile_step_f32_avx512(kp_attn_tile *t, const float *k, const float *v, int n_keys,
                                        int32_t key_pos) {
    TILE_STEP_BODY(load8_f32, false, tile_step_f32)
}

AVX512 static void tile_step_f16_avx512(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                                        int32_t key_pos) {
    TILE_STEP_BODY(load8_f16, true, tile_step_f16)
}
#undef TILE_STEP_BODY

/* Rows of any KV type to F32: the avx2 table's decoders (8 lanes; the
 * decode is a small part of a step), then this table's F32 step. */
AVX512 static void kv_rows_avx512(kp_dtype t, const void *src, float *dst, int64_t n) { kv_to_f32_avx2(t, src, dst, n); }

AVX512 static void tile_step_kv_avx512(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt,
                                       int n_keys, int32_t key_pos) {
    tile_step_kv_with(t, k, kt, v, vt, n_keys, key_pos, kv_rows_avx512, tile_step_f32_avx512);
}

static void tile_begin_avx512(kp_attn_tile *t, const float *q, int64_t q_stride) {
    if (layout_of(t) == LAYOUT_LANES) lanes_begin(t, q, q_stride, GRAN_AVX512);
    else kp_attn_avx2_kernels.tile_begin(t, q, q_stride);
}

static void tile_end_avx512(const kp_attn_tile *t, float *out, int64_t out_stride) {
    if (layout_of(t) == LAYOUT_LANES) lanes_end(t, out, out_stride, GRAN_AVX512);
    else kp_attn_avx2_kernels.tile_end(t, out, out_stride);
}

static void tile_partial_avx512(const kp_attn_tile *t, float *part) {
    if (layout_of(t) == LAYOUT_LANES) lanes_partial(t, part, GRAN_AVX512);
    else kp_attn_avx2_kernels.tile_partial(t, part);
}

const kp_attn_kernels kp_attn_avx512_kernels = {
    .name = "avx512",
    .tile_begin = tile_begin_avx512,
    .tile_step_f32 = tile_step_f32_avx512,
    .tile_step_f16 = tile_step_f16_avx512,
    .tile_step_kv = tile_step_kv_avx512,
    .tile_end = tile_end_avx512,
    .tile_partial = tile_partial_avx512,
    .exp_row = exp_row_avx512,
    .swiglu_row = swiglu_row_avx512,
};

#else /* not x86-64: no AVX-512 table */

typedef int kp_attn_avx512_unused;

#endif
