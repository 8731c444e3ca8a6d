/*
 * attn_avx512.c - the attention table "avx512" (attn.h): the avx2 table
 * (attn_avx2.c) with the query-lane tile loops (prefill), the few-row
 * steps of decode (the key-lane and row layouts, head sizes a multiple of
 * 16), exp_row and swiglu_row on 16-lane AVX-512F vectors. Every function
 * here carries __attribute__((target("avx512f,avx2,fma,f16c"))) (AVX512,
 * AVX512_INLINE); dispatch.c hands the table out only when the CPU has
 * AVX-512F besides AVX2, FMA and F16C. Outside x86-64 the file is empty.
 * No state; the table is constant.
 *
 * The few-row steps read K and V of every type (F32, F16, Q8_0, Q4_0)
 * where they lie in the cache and convert them in registers (ld16), one
 * compiled copy per pair of types: a decode step copies nothing but the
 * transposed K of the key-lane layout (16 x hd floats, in L1). The other
 * layouts (scalar head sizes, few rows with head sizes that are not a
 * multiple of 16) are the avx2 table's entries, called through it. The
 * 16-lane query-lane loops keep 8 keys x 3 row vectors of 16 (48 rows,
 * GRAN_AVX512) in registers and do, lane for lane, the operations of the
 * 8-lane ones (exp512 is exp_ps on 16 lanes), as the key-lane step does
 * those of the avx2 keys_step, so the results equal the avx2 table's bit
 * for bit except in free-order tiles, which promise no summation order
 * (attn.h). Layouts and workspaces: attn_avx2_inl.h.
 */
#include "kernels/attn.h"

#if defined(__x86_64__)

#include "kernels/attn_avx512_inl.h"
#include "kernels/tables.h"

/* ---- exp ------------------------------------------------------------------ */

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

/* GeGLU (attn.h): F16 rounding by vcvtps2ph (to nearest even, as
 * kp_fp32_to_fp16, NaN included), the table read by a gather; the tail
 * under a mask. */
AVX512 static void geglu_row_avx512(const float *table, float *gate, const float *up, int64_t n) {
    const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m256i h = _mm512_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 t = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_cvtepu16_epi32(h), table, 4);
        __m512 y = _mm512_mul_ps(t, u);
        y = _mm512_mask_mul_ps(y, _mm512_cmp_ps_mask(g, hi, _CMP_GE_OQ), g, u);
        y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(g, lo, _CMP_LE_OQ), _mm512_setzero_ps());
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
    bool rescale = lanes512_softmax(t, w, n_keys, key_pos);
    for (int d0 = 0; d0 < hd; d0 += 8) {
        float *ot = w->ot + (size_t)d0 * Mp;
        const float *vf = w->vf + d0;
        for (int v = 0; v < nz; v += 3)
            lanes512_accum_8x3(hd, Mp, n_keys, w->s + 16 * v, vf, ot + 16 * v, w->al + 16 * v, rescale);
    }
}

/* ---- row layout on 16 lanes, K and V read in place ------------------------ */

/* The row layout (decode, free order) on 16 lanes, head sizes a multiple of
 * 16: query rows go 4 at a time (4 rows x 4 keys of scores, or 4 rows x 64
 * dims of weighted V, fit the 32 registers), and K and V elements are read
 * from the cache rows where they are, whatever their type, and converted
 * in registers; no step copies its rows. */

/* z[4r + j] = the sum of the 16 lanes of c[r][j]: for each key, the rows'
 * halves and quarters are folded together (quarter r of v[j] holds row r's
 * partial sums), then the 4 lanes of every quarter across the keys. */
AVX512_INLINE __m512 reduce_4x4(__m512 c[4][4]) {
    __m512 v[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(c[0][j], c[1][j], 0x44), _mm512_shuffle_f32x4(c[0][j], c[1][j], 0xee));
        __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(c[2][j], c[3][j], 0x44), _mm512_shuffle_f32x4(c[2][j], c[3][j], 0xee));
        v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t, u, 0x88), _mm512_shuffle_f32x4(t, u, 0xdd));
    }
    __m512 y01 = _mm512_add_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
    __m512 y23 = _mm512_add_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(y01, y23, 0x44), _mm512_shuffle_ps(y01, y23, 0xee));
}

/* Scores of the R (3 or 4) rows from q (row stride hd) against the K rows
 * k[0..3]: s[r * STEP + j] = scale * dot(q_r, k_j). */
AVX512_INLINE void rows4_scores(int hd, const float *q, const uint8_t *const k[4], kp_dtype kt, float *s,
                                __m512 scale, const int R) {
    __m512 c[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) c[r][j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
        __m512 x[4], kk[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) x[r] = _mm512_loadu_ps(q + (size_t)r * hd + d);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) kk[j] = ld16(k[j], d, kt);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) c[r][j] = _mm512_fmadd_ps(x[r], kk[j], c[r][j]);
    }
    __m512 z = _mm512_mul_ps(reduce_4x4(c), scale);
    _mm_storeu_ps(s, _mm512_castps512_ps128(z));
    _mm_storeu_ps(s + STEP, _mm512_extractf32x4_ps(z, 1));
    _mm_storeu_ps(s + 2 * STEP, _mm512_extractf32x4_ps(z, 2));
    if (R == 4) _mm_storeu_ps(s + 3 * STEP, _mm512_extractf32x4_ps(z, 3));
}

/* o[r][d0 .. d0 + 16 NV) of the R rows (row stride hd) = o * al[r] +
 * sum_j p[r * STEP + j] * V_j, for the n_keys V rows from v (vb bytes
 * apart); each V vector is converted once for the R rows. */
AVX512_INLINE void rows4_accum(int hd, int d0, int n_keys, const float *p, const uint8_t *v, size_t vb,
                               kp_dtype vt, float *o, const float *al, int NV, const int R) {
    __m512 c[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const __m512 a = _mm512_set1_ps(al[r]);
        _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++)
            c[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)r * hd + d0 + 16 * i), a);
    }
    for (int j = 0; j < n_keys; j++) {
        __m512 vv[4];
        const uint8_t *vr = v + (size_t)j * vb;
        _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++) vv[i] = ld16(vr, d0 + 16 * i, vt);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(p[r * STEP + j]);
            _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++) c[r][i] = _mm512_fmadd_ps(x, vv[i], c[r][i]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++)
            _mm512_storeu_ps(o + (size_t)r * hd + d0 + 16 * i, c[r][i]);
}

/* One step of the row layout on K rows of type kt and V rows of type vt
 * (constants at every call). Rows go R (3 or 4, a constant) at a time,
 * whichever pads the tile's rows less (3 heads per kv-head: 3); padding
 * rows (q = 0)
 * see no key (rows_softmax gives them weight 0). The keys past the last
 * multiple of 4 are scored in a block of 4 whose extra keys repeat the
 * last one and are never seen. While the first row block scores its keys,
 * the next step's rows are prefetched, a slice per 4 keys. */
AVX512_INLINE void rows4_step(kp_attn_tile *t, const keys_ws *w, const void *k, kp_dtype kt, const void *v,
                              kp_dtype vt, int n_keys, int32_t key_pos, const int R) {
    const int hd = t->hd, M4 = (w->M + R - 1) / R * R;
    const size_t kb = kp_dtype_row_size(kt, hd), vb = kp_dtype_row_size(vt, hd);
    const uint8_t *k0 = k, *v0 = v;
    const __m512 scale = _mm512_set1_ps(t->scale);
    for (int r0 = 0; r0 < M4; r0 += R)
        for (int j = 0; j < n_keys; j += 4) {
            if (r0 == 0) kp_attn_prefetch_next(t, j / 4, STEP / 4);
            const uint8_t *kr[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                kr[i] = k0 + (size_t)(j + i < n_keys ? j + i : n_keys - 1) * kb;
            rows4_scores(hd, w->q + (size_t)r0 * hd, kr, kt, w->p + (size_t)r0 * STEP + j, scale, R);
        }
    for (int i = (n_keys + 3) / 4; i < STEP / 4; i++) kp_attn_prefetch_next(t, i, STEP / 4); /* short steps */
    rows_softmax(t, w, M4, n_keys, key_pos);
    for (int r0 = 0; r0 < M4; r0 += R) {
        float *o = w->o + (size_t)r0 * hd;
        const float *p = w->p + (size_t)r0 * STEP, *al = w->al + r0;
        int d0 = 0;
        for (; d0 + 64 <= hd; d0 += 64) rows4_accum(hd, d0, n_keys, p, v0, vb, vt, o, al, 4, R);
        if (d0 + 32 <= hd) rows4_accum(hd, d0, n_keys, p, v0, vb, vt, o, al, 2, R), d0 += 32;
        if (d0 < hd) rows4_accum(hd, d0, n_keys, p, v0, vb, vt, o, al, 1, R);
    }
}

/* rows4_step in row blocks of 3 or of 4, whichever pads M rows less. */
AVX512_INLINE void rows_r_step(kp_attn_tile *t, const keys_ws *w, const void *k, kp_dtype kt, const void *v,
                               kp_dtype vt, int n_keys, int32_t key_pos) {
    if ((w->M + 2) / 3 * 3 < (w->M + 3) / 4 * 4) rows4_step(t, w, k, kt, v, vt, n_keys, key_pos, 3);
    else rows4_step(t, w, k, kt, v, vt, n_keys, key_pos, 4);
}

/* ---- key-lane layout on 16 lanes, K and V read in place ------------------ */

/* The key-lane layout (few rows in tile order: a decode token whose result
 * must equal its row in any larger tile) on 16 lanes, head sizes a
 * multiple of 16. It does, lane for lane, what the avx2 table's keys_step
 * does (attn_avx2.c), so the bits are the same: each row's scores are one
 * fused chain over d from 0 with the 16 keys of the step in the lanes (K
 * transposed: the rows are converted in registers, 16 x 16 at a time,
 * and transposed into w.kt), the softmax update of keys_row, and the V
 * sums o = o * a, then o += p_j * V_j for the visible keys in order, here
 * for 4 rows at a time with each V vector converted once, read in place. */

/* r[i] <- column i of the 16 x 16 matrix whose rows are r[0..15]. */
AVX512_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) { /* u[4i + k], lane L: rows 4i..4i+3, column 4L + k */
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        __m512 x = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), y = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        __m512 x2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), y2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_f32x4(x, x2, 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(x, x2, 0xdd);
        r[4 + k] = _mm512_shuffle_f32x4(y, y2, 0x88);
        r[12 + k] = _mm512_shuffle_f32x4(y, y2, 0xdd);
    }
}

/* o[r][d0 .. d0 + 16 NV) of 4 rows (row stride hd) = o * a[r], then
 * += p[r * STEP + j] * V_j for j < nvis[r] in order; a row with nvis 0 is
 * left as it is. */
AVX512_INLINE void keys4_accum(int hd, int d0, const int nvis[4], int n_max, const float *p, const uint8_t *v,
                               size_t vb, kp_dtype vt, float *o, const float a[4], int NV) {
    __m512 c[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
        const __m512 av = _mm512_set1_ps(a[r]);
        _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++) {
            c[r][i] = _mm512_loadu_ps(o + (size_t)r * hd + d0 + 16 * i);
            if (nvis[r] > 0 && a[r] != 1.0f) c[r][i] = _mm512_mul_ps(c[r][i], av);
        }
    }
    for (int j = 0; j < n_max; j++) {
        __m512 vv[4];
        const uint8_t *vr = v + (size_t)j * vb;
        _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++) vv[i] = ld16(vr, d0 + 16 * i, vt);
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
            const __mmask16 on = j < nvis[r] ? (__mmask16)0xffff : 0;
            const __m512 x = _mm512_set1_ps(p[r * STEP + j]);
            _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++)
                c[r][i] = _mm512_mask3_fmadd_ps(x, vv[i], c[r][i], on);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)
        _Pragma("GCC unroll 4") for (int i = 0; i < NV; i++)
            _mm512_storeu_ps(o + (size_t)r * hd + d0 + 16 * i, c[r][i]);
}

AVX512_INLINE void keys4_step(kp_attn_tile *t, const keys_ws *w, const void *k, kp_dtype kt, const void *v,
                              kp_dtype vt, int n_keys, int32_t key_pos) {
    const int hd = t->hd;
    const size_t kb = kp_dtype_row_size(kt, hd), vb = kp_dtype_row_size(vt, hd);
    const uint8_t *k0 = k, *v0 = v;
    kp_attn_prefetch_next(t, 0, 1);
    for (int d0 = 0; d0 < hd; d0 += 16) { /* w.kt[d][j] = element d of K row j (0 past n_keys) */
        __m512 r[16];
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
            r[j] = j < n_keys ? ld16(k0 + (size_t)j * kb, d0, kt) : _mm512_setzero_ps();
        transpose16(r);
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) _mm512_storeu_ps(w->kt + (size_t)(d0 + i) * STEP, r[i]);
    }
    const __m512 scale = _mm512_set1_ps(t->scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int r0 = 0; r0 < w->M; r0 += 4) {
        const float *q = w->q + (size_t)r0 * hd;
        __m512 c[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int d = 0; d < hd; d++) {
            const __m512 kd = _mm512_loadu_ps(w->kt + (size_t)d * STEP);
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)
                c[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)r * hd + d]), kd, c[r]);
        }
        int nvis[4], n_max = 0;
        float a[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) { /* keys_row's softmax update */
            int row = r0 + r;
            int64_t lim = (int64_t)t->pos0 + row / t->G - key_pos + 1;
            nvis[r] = row >= w->M || lim < 0 ? 0 : lim > n_keys ? n_keys : (int)lim;
            a[r] = 1.0f;
            if (nvis[r] == 0) continue;
            n_max = nvis[r] > n_max ? nvis[r] : n_max;
            const __mmask16 vis = (__mmask16)((1u << nvis[r]) - 1);
            __m512 s = _mm512_mask_blend_ps(vis, ninf, _mm512_mul_ps(c[r], scale));
            float mold = w->m[row], mx = _mm512_reduce_max_ps(s);
            mx = mx > mold ? mx : mold;
            a[r] = mx == mold ? 1.0f : exp_1(mold - mx);
            float *p = w->p + (size_t)row * STEP;
            _mm512_storeu_ps(p, _mm512_maskz_mov_ps(vis, exp512(_mm512_sub_ps(s, _mm512_set1_ps(mx)))));
            w->m[row] = mx;
        }
        float psum[4] = {0, 0, 0, 0}; /* in key order, the 4 rows side by side */
        for (int j = 0; j < n_max; j++)
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) if (j < nvis[r]) psum[r] += w->p[(size_t)(r0 + r) * STEP + j];
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) if (nvis[r] > 0) {
            float *l = w->l + r0 + r;
            *l = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(*l), _mm_set_ss(a[r]), _mm_set_ss(psum[r])));
        }
        if (n_max == 0) continue;
        float *o = w->o + (size_t)r0 * hd;
        const float *p = w->p + (size_t)r0 * STEP;
        int d0 = 0;
        for (; d0 + 64 <= hd; d0 += 64) keys4_accum(hd, d0, nvis, n_max, p, v0, vb, vt, o, a, 4);
        if (d0 + 32 <= hd) keys4_accum(hd, d0, nvis, n_max, p, v0, vb, vt, o, a, 2), d0 += 32;
        if (d0 < hd) keys4_accum(hd, d0, nvis, n_max, p, v0, vb, vt, o, a, 1);
    }
}

/* The few-row steps with the types as constants: one copy per pair. */
#define FEW_V(STEP_FN, KT)                                                                               \
    switch (vt) {                                                                                        \
    case KP_DTYPE_F32: STEP_FN(t, w, k, KT, v, KP_DTYPE_F32, n_keys, key_pos); return true;             \
    case KP_DTYPE_F16: STEP_FN(t, w, k, KT, v, KP_DTYPE_F16, n_keys, key_pos); return true;             \
    case KP_DTYPE_Q8_0: STEP_FN(t, w, k, KT, v, KP_DTYPE_Q8_0, n_keys, key_pos); return true;           \
    case KP_DTYPE_Q4_0: STEP_FN(t, w, k, KT, v, KP_DTYPE_Q4_0, n_keys, key_pos); return true;           \
    default: return false;                                                                               \
    }
#define FEW_KV(STEP_FN)                                                                                  \
    switch (kt) {                                                                                        \
    case KP_DTYPE_F32: FEW_V(STEP_FN, KP_DTYPE_F32)                                                      \
    case KP_DTYPE_F16: FEW_V(STEP_FN, KP_DTYPE_F16)                                                      \
    case KP_DTYPE_Q8_0: FEW_V(STEP_FN, KP_DTYPE_Q8_0)                                                    \
    case KP_DTYPE_Q4_0: FEW_V(STEP_FN, KP_DTYPE_Q4_0)                                                    \
    default: return false;                                                                               \
    }

AVX512 static bool rows4_kv(kp_attn_tile *t, const keys_ws *w, const void *k, kp_dtype kt, const void *v,
                            kp_dtype vt, int n_keys, int32_t key_pos) {
    FEW_KV(rows_r_step)
}

AVX512 static bool keys4_kv(kp_attn_tile *t, const keys_ws *w, const void *k, kp_dtype kt, const void *v,
                            kp_dtype vt, int n_keys, int32_t key_pos) {
    FEW_KV(keys4_step)
}
#undef FEW_KV
#undef FEW_V

/* The step of a few-row tile (the row or key-lane layout) for any pair of
 * KV types, when the head size suits it (a multiple of 16; of 32 for the
 * quantized types, as the pool requires); false: the caller takes another
 * path. */
AVX512 static bool few_rows_any(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt,
                                int n_keys, int32_t key_pos) {
    int layout = layout_of(t);
    if ((layout != LAYOUT_ROWS && layout != LAYOUT_KEYS) || t->hd % 16) return false;
    keys_ws w = keys_layout(t);
    return layout == LAYOUT_ROWS ? rows4_kv(t, &w, k, kt, v, vt, n_keys, key_pos)
                                 : keys4_kv(t, &w, k, kt, v, vt, n_keys, key_pos);
}
#undef ROWS_STEP_BODY

/* ---- the tile entry points ------------------------------------------------- */

/* A step: the few-row layouts (few_rows_any), else the query-lane layout (K zero
 * up to a multiple of 8 keys, the score loop's block), else the avx2
 * table's. */
#define TILE_STEP_BODY(LOAD, TYPE, AVX2_STEP)                                           \
    int hd = t->hd;                                                                     \
    if (few_rows_any(t, k, TYPE, v, TYPE, n_keys, key_pos)) return;                        \
    if (layout_of(t) == LAYOUT_LANES) {                                                 \
        kp_attn_prefetch_next(t, 0, 1);                                                 \
        lanes_ws w = lanes_layout(t, GRAN_AVX512);                                      \
        ROWS_TO_F32(LOAD, k, w.kf, n_keys, (n_keys + 7) / 8 * 8, hd);                   \
        ROWS_TO_F32(LOAD, v, w.vf, n_keys, n_keys, hd);                                 \
        lanes512_step(t, &w, n_keys, key_pos);                                          \
    } else {                                                                            \
        kp_attn_avx2_kernels.AVX2_STEP(t, k, v, n_keys, key_pos);                       \
    }

AVX512 static void tile_step_f32_avx512(kp_attn_tile *t, const float *k, const float *v, int n_keys,
                                        int32_t key_pos) {
    TILE_STEP_BODY(load8_f32, KP_DTYPE_F32, tile_step_f32)
}

AVX512 static void tile_step_f16_avx512(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                                        int32_t key_pos) {
    TILE_STEP_BODY(load8_f16, KP_DTYPE_F16, tile_step_f16)
}
#undef TILE_STEP_BODY

/* Rows of any KV type: the row layout reads them in place; the others
 * decode them to F32 with the avx2 table's decoders (8 lanes; the decode
 * is a small part of a many-row step), then take this table's F32 step. */
AVX512 static void kv_rows_avx512(kp_dtype t, const void *src, float *dst, int64_t n) { kv_to_f32_avx2(t, src, dst, n); }

AVX512 static void tile_step_kv_avx512(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt,
                                       int n_keys, int32_t key_pos) {
    if (few_rows_any(t, k, kt, v, vt, n_keys, key_pos)) return;
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
    .geglu_row = geglu_row_avx512,
};

#else /* not x86-64: no AVX-512 table */

typedef int kp_attn_avx512_unused;

#endif
