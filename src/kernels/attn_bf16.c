/*
 * attn_bf16.c - the attention table "avx512bf16" (attn.h): the avx512
 * table whose query-lane tiles (prefill: M = n_tok * G >= 8 rows, head
 * sizes a multiple of 32) take their two products, Q.K^T and P.V, in
 * bfloat16 dot products (VDPBF16PS: 32 products per instruction, twice
 * the F32 fused multiply-adds of the same register width), with the
 * online softmax in F32 between them. Every other tile (decode's few
 * rows, other head sizes) is the avx512 table's, in F32. Every function
 * here carries the target avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma,
 * f16c; dispatch.c hands the table out only when the CPU has AVX512_BF16
 * besides what the avx512 table needs, and only to a forward pass asked
 * for bfloat16 attention (kp_attn_precision). Outside x86-64 the file is
 * empty. No state; the table is constant.
 *
 * The arithmetic (the contract of the "bf16" precision, which the scalar
 * reference kp_attn_scalar_bf16 in attn_scalar.c computes the same way):
 *
 *   q, k, v     rounded to bfloat16 (nearest, ties to even) as they enter
 *   score       s = scale * sum over the pairs i = 0, 1, .. of dims
 *               (2i, 2i+1), in order, each pair added into an F32 sum as
 *               q[2i+1] k[2i+1] and then q[2i] k[2i] (the products are exact
 *               in F32; VDPBF16PS's order)
 *   softmax     F32, as the avx512 table (attn.h), except that every
 *               weight p_j = exp(s_j - m) is computed by exp_w (below:
 *               range reduction by ln 2 and a degree-4 Taylor polynomial,
 *               relative error under 5e-5, a fortieth of a bfloat16
 *               rounding) and rounded to bfloat16 before it is summed
 *               into l, so that l is the sum of the weights used
 *   o           o * a, then for the pairs of keys (2i, 2i+1) of the step,
 *               in order: + p_{2i+1} v_{2i+1}, then + p_{2i} v_{2i}
 *
 * Rounding q, k, v and p to 8 significant bits costs about 2^-9 of each
 * product: the logits of a model stay within the BF16 weights' tolerances
 * of llama.cpp (README), and a token's result depends on whether it was
 * computed in a prefill tile or alone (decode stays F32), within those
 * bounds rather than bit for bit. K and V of any KV type are read with
 * ld16 (F32, F16, Q8_0, Q4_0 as F32, exact) and rounded from there.
 *
 * Workspace: the query-lane layout of attn_avx2_inl.h (lanes_ws, rows in
 * 48s), with its F32 arrays reused for pairs of bfloat16 packed in 32 bits
 * (the lower half the even element):
 *
 *   qt   [hd/2][Mp]     q pairs, transposed (row r in lane r)
 *        then [STEP/2][Mp] p pairs of the step (keys 2i, 2i+1)
 *   s    [STEP][Mp]     F32 scores (the weights go straight into their
 *                       pairs: softmax_pairs)
 *   kf   [STEP][hd]     the step's K rows in bfloat16 (0 up to 8 keys)
 *   vf   [STEP/2][hd]   V pairs: element d of keys 2i and 2i+1
 *   ot, m, l, al, tok   as the F32 layout (so tile_end and tile_partial
 *                       are the avx512 table's)
 */
#include "kernels/attn.h"

#if defined(__x86_64__)

#include "kernels/attn_avx512_inl.h"
#include "kernels/tables.h"

#define BF16 __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma,f16c")))
#define BF16_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma,f16c")))

#define BH(x) ((__m512bh)(x))

/* Whether a tile takes the bfloat16 loops (else the avx512 table's). */
static inline bool bf16_tile(const kp_attn_tile *t) { return t->hd % 32 == 0 && t->n_tok * t->G >= 8; }

/* The pairs (even, odd) of 16 lanes, each rounded to bfloat16: even in the
 * lower half of lane r, odd in the upper (one conversion of both, then
 * one permutation of the 32 halves). */
BF16_INLINE __m512i bf16_pair(__m512 even, __m512 odd) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

#define C3_DECL(a) __m512 c##a##0 = _mm512_setzero_ps(), c##a##1 = c##a##0, c##a##2 = c##a##0
#define C3_DP(a, x32)                                                                   \
    do {                                                                                \
        __m512i x_ = _mm512_set1_epi32((int)(x32));                                     \
        c##a##0 = _mm512_dpbf16_ps(c##a##0, BH(x_), BH(y0));                            \
        c##a##1 = _mm512_dpbf16_ps(c##a##1, BH(x_), BH(y1));                            \
        c##a##2 = _mm512_dpbf16_ps(c##a##2, BH(x_), BH(y2));                            \
    } while (0)
#define C3_LOAD(a, p)                                                                   \
    __m512 c##a##0 = _mm512_loadu_ps(p), c##a##1 = _mm512_loadu_ps((p) + 16),            \
           c##a##2 = _mm512_loadu_ps((p) + 32)
#define C3_STORE(a, p, f)                                                               \
    do {                                                                                \
        _mm512_storeu_ps((p), f(c##a##0));                                              \
        _mm512_storeu_ps((p) + 16, f(c##a##1));                                         \
        _mm512_storeu_ps((p) + 32, f(c##a##2));                                         \
    } while (0)
#define C3_SCALE(a)                                                                     \
    do {                                                                                \
        c##a##0 = _mm512_mul_ps(c##a##0, a0);                                           \
        c##a##1 = _mm512_mul_ps(c##a##1, a1);                                           \
        c##a##2 = _mm512_mul_ps(c##a##2, a2);                                           \
    } while (0)
#define C_ID(x) (x)
#define C_SCALED(x) _mm512_mul_ps((x), scale)

/* Scores of 8 keys (bfloat16 rows kb, hd apart) against 48 rows of q
 * pairs qt (Mp apart): 24 accumulators, hd / 2 pair steps. */
BF16_INLINE void scores_8x3(int hd, int Mp, const uint32_t *qt, const uint16_t *kb, float *s, __m512 scale) {
    C3_DECL(0); C3_DECL(1); C3_DECL(2); C3_DECL(3);
    C3_DECL(4); C3_DECL(5); C3_DECL(6); C3_DECL(7);
    const uint32_t *k32 = (const uint32_t *)kb; /* pair i of key j: k32[j * hd / 2 + i] */
    const int h2 = hd / 2;
    for (int i = 0; i < h2; i++) {
        const uint32_t *qd = qt + (size_t)i * Mp, *kd = k32 + i;
        __m512i y0 = _mm512_loadu_si512(qd), y1 = _mm512_loadu_si512(qd + 16), y2 = _mm512_loadu_si512(qd + 32);
        C3_DP(0, kd[0]);
        C3_DP(1, kd[h2]);
        C3_DP(2, kd[2 * h2]);
        C3_DP(3, kd[3 * h2]);
        C3_DP(4, kd[4 * h2]);
        C3_DP(5, kd[5 * h2]);
        C3_DP(6, kd[6 * h2]);
        C3_DP(7, kd[7 * h2]);
    }
    C3_STORE(0, s, C_SCALED);
    C3_STORE(1, s + Mp, C_SCALED);
    C3_STORE(2, s + 2 * Mp, C_SCALED);
    C3_STORE(3, s + 3 * Mp, C_SCALED);
    C3_STORE(4, s + 4 * Mp, C_SCALED);
    C3_STORE(5, s + 5 * Mp, C_SCALED);
    C3_STORE(6, s + 6 * Mp, C_SCALED);
    C3_STORE(7, s + 7 * Mp, C_SCALED);
}

/* ot[d0..d0+7][48 rows] = ot * al + sum over the n_pairs key pairs of
 * V pairs (vp[i * hd + d]) times p pairs (pt[i * Mp + r]). */
BF16_INLINE void accum_8x3(int hd, int Mp, int n_pairs, const uint32_t *pt, const uint32_t *vp, float *ot,
                           const float *al, bool rescale) {
    C3_LOAD(0, ot); C3_LOAD(1, ot + Mp); C3_LOAD(2, ot + 2 * Mp); C3_LOAD(3, ot + 3 * Mp);
    C3_LOAD(4, ot + 4 * Mp); C3_LOAD(5, ot + 5 * Mp); C3_LOAD(6, ot + 6 * Mp); C3_LOAD(7, ot + 7 * Mp);
    if (rescale) {
        __m512 a0 = _mm512_loadu_ps(al), a1 = _mm512_loadu_ps(al + 16), a2 = _mm512_loadu_ps(al + 32);
        C3_SCALE(0); C3_SCALE(1); C3_SCALE(2); C3_SCALE(3);
        C3_SCALE(4); C3_SCALE(5); C3_SCALE(6); C3_SCALE(7);
    }
    for (int i = 0; i < n_pairs; i++) {
        const uint32_t *pi = pt + (size_t)i * Mp, *vi = vp + (size_t)i * hd;
        __m512i y0 = _mm512_loadu_si512(pi), y1 = _mm512_loadu_si512(pi + 16), y2 = _mm512_loadu_si512(pi + 32);
        C3_DP(0, vi[0]);
        C3_DP(1, vi[1]);
        C3_DP(2, vi[2]);
        C3_DP(3, vi[3]);
        C3_DP(4, vi[4]);
        C3_DP(5, vi[5]);
        C3_DP(6, vi[6]);
        C3_DP(7, vi[7]);
    }
    C3_STORE(0, ot, C_ID);
    C3_STORE(1, ot + Mp, C_ID);
    C3_STORE(2, ot + 2 * Mp, C_ID);
    C3_STORE(3, ot + 3 * Mp, C_ID);
    C3_STORE(4, ot + 4 * Mp, C_ID);
    C3_STORE(5, ot + 5 * Mp, C_ID);
    C3_STORE(6, ot + 6 * Mp, C_ID);
    C3_STORE(7, ot + 7 * Mp, C_ID);
}

/* exp(x) for a weight (x = score - running max <= 0, or NaN where no key
 * is visible yet), as the bfloat16 precision defines it (the top of this
 * file; attn_scalar.c's exp_w takes the same steps): x clamped at -104
 * (exp underflows to 0 there: -inf scores give 0), n = x log2(e) rounded
 * to the nearest integer (ties to even), r = x - n ln2 in one fused
 * step, exp(r) by Horner on 1 + r + r^2/2 + r^3/6 + r^4/24 in fused
 * steps, times 2^n by VSCALEFPS. 9 instructions where exp512 takes 20:
 * the weights are rounded to 8 significant bits right after, so exp512's
 * 24 bits bought nothing. */
BF16_INLINE __m512 exp_w(__m512 x) {
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147182f), xc);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 24), r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The softmax update of the step (lanes512_softmax's, attn_avx512_inl.h,
 * with every weight rounded to bfloat16) fused with the pairing of the
 * weights: keys (2i, 2i+1) of row r go to pt[i * Mp + r], and l sums the
 * rounded weights in key order. The step's scores are read, not
 * rewritten. True when some row's max moved. */
BF16_INLINE bool softmax_pairs(const kp_attn_tile *t, const lanes_ws *w, int n_keys, int32_t key_pos, uint32_t *pt) {
    const int Mp = w->Mp, nz = Mp / 16, n_pairs = (n_keys + 1) / 2;
    const int32_t delta = key_pos - t->pos0;
    const bool all_visible = delta + n_keys - 1 <= 0;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    bool rescale = false;
    for (int v = 0; v < nz; v++) {
        const __m512 tok = _mm512_loadu_ps(w->tok + 16 * v);
        const __m512 mold = _mm512_loadu_ps(w->m + 16 * v);
        __m512 mx = mold;
        for (int j = 0; j < n_keys; j++) {
            __m512 x = _mm512_loadu_ps(w->s + (size_t)j * Mp + 16 * v);
            if (!all_visible)
                x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ), ninf, x);
            mx = _mm512_max_ps(mx, x);
        }
        const __mmask16 same = _mm512_cmp_ps_mask(mx, mold, _CMP_EQ_OQ);
        const __m512 a = _mm512_mask_blend_ps(same, exp512(_mm512_sub_ps(mold, mx)), one);
        rescale = rescale || same != 0xffff;
        __m512 psum = _mm512_setzero_ps();
        for (int i = 0; i < n_pairs; i++) {
            const int j = 2 * i;
            __m512 pe = exp_w(_mm512_sub_ps(_mm512_loadu_ps(w->s + (size_t)j * Mp + 16 * v), mx)), po;
            if (!all_visible)
                pe = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ), pe);
            if (j + 1 < n_keys) {
                po = exp_w(_mm512_sub_ps(_mm512_loadu_ps(w->s + (size_t)(j + 1) * Mp + 16 * v), mx));
                if (!all_visible)
                    po = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + 1 + delta)), tok, _CMP_LE_OQ),
                                             po);
            } else {
                po = _mm512_setzero_ps();
            }
            const __m512i pair = bf16_pair(pe, po);
            _mm512_storeu_si512(pt + (size_t)i * Mp + 16 * v, pair);
            psum = _mm512_add_ps(psum, _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)));
            if (j + 1 < n_keys) psum = _mm512_add_ps(psum, _mm512_castsi512_ps(_mm512_and_si512(pair, hi)));
        }
        _mm512_storeu_ps(w->m + 16 * v, mx);
        _mm512_storeu_ps(w->l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(w->l + 16 * v), a, psum));
        _mm512_storeu_ps(w->al + 16 * v, a);
    }
    return rescale;
}

/* One query-lane step on K rows of type kt and V rows of type vt (the row
 * sizes of those types apart): the rows into bfloat16, the scores, the
 * softmax (lanes512_softmax with the weights rounded), the weights into
 * pairs, the weighted sums. */
BF16_INLINE void lanes_bf16_step(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt,
                                 int n_keys, int32_t key_pos) {
    kp_attn_prefetch_next(t, 0, 1);
    lanes_ws w = lanes_layout(t, GRAN_AVX512);
    const int hd = t->hd, Mp = w.Mp, nz = Mp / 16, n_pairs = (n_keys + 1) / 2;
    const size_t kb = kp_dtype_row_size(kt, hd), vb = kp_dtype_row_size(vt, hd);
    uint16_t *kr = (uint16_t *)w.kf;
    uint32_t *vp = (uint32_t *)w.vf, *qt = (uint32_t *)w.qt, *pt = qt + (size_t)(hd / 2) * Mp;
    for (int j = 0; j < (n_keys + 7) / 8 * 8; j++)
        for (int d = 0; d < hd; d += 16) {
            __m256i x = j < n_keys ? (__m256i)_mm512_cvtneps_pbh(ld16((const uint8_t *)k + (size_t)j * kb, d, kt))
                                   : _mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(kr + (size_t)j * hd + d), x);
        }
    for (int i = 0; i < n_pairs; i++) {
        const uint8_t *ve = (const uint8_t *)v + (size_t)(2 * i) * vb, *vo = ve + vb;
        const bool has_odd = 2 * i + 1 < n_keys;
        for (int d = 0; d < hd; d += 16)
            _mm512_storeu_si512(vp + (size_t)i * hd + d,
                                bf16_pair(ld16(ve, d, vt), has_odd ? ld16(vo, d, vt) : _mm512_setzero_ps()));
    }
    const __m512 scale = _mm512_set1_ps(t->scale);
    for (int j0 = 0; j0 < n_keys; j0 += 8)
        for (int r = 0; r < nz; r += 3)
            scores_8x3(hd, Mp, qt + 16 * r, kr + (size_t)j0 * hd, w.s + (size_t)j0 * Mp + 16 * r, scale);
    const bool rescale = softmax_pairs(t, &w, n_keys, key_pos, pt);
    for (int d0 = 0; d0 < hd; d0 += 8) {
        float *ot = w.ot + (size_t)d0 * Mp;
        for (int r = 0; r < nz; r += 3)
            accum_8x3(hd, Mp, n_pairs, pt + 16 * r, vp + d0, ot + 16 * r, w.al + 16 * r, rescale);
    }
}

/* ---- the tile entry points ------------------------------------------------- */

BF16 static void tile_begin_bf16(kp_attn_tile *t, const float *q, int64_t q_stride) {
    if (!bf16_tile(t)) {
        kp_attn_avx512_kernels.tile_begin(t, q, q_stride);
        return;
    }
    lanes_ws w = lanes_layout(t, GRAN_AVX512);
    const int hd = t->hd, G = t->G, Mp = w.Mp;
    uint32_t *qt = (uint32_t *)w.qt;
    memset(w.ot, 0, (size_t)hd * (size_t)Mp * sizeof(float));
    for (int r = 0; r < Mp; r++) {
        if (r < w.M) {
            const float *src = q + (r / G) * q_stride + (r % G) * hd;
            uint32_t pairs[16];
            for (int d = 0; d < hd; d += 32) {
                _mm512_storeu_si512(pairs, (__m512i)(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + d + 16),
                                                                                   _mm512_loadu_ps(src + d))));
                for (int i = 0; i < 16; i++) qt[(size_t)(d / 2 + i) * Mp + r] = pairs[i];
            }
        } else {
            for (int i = 0; i < hd / 2; i++) qt[(size_t)i * Mp + r] = 0;
        }
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
        w.tok[r] = (float)((r < w.M ? r : w.M - 1) / G);
    }
}

BF16 static void tile_step_f32_bf16(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos) {
    if (bf16_tile(t)) lanes_bf16_step(t, k, KP_DTYPE_F32, v, KP_DTYPE_F32, n_keys, key_pos);
    else kp_attn_avx512_kernels.tile_step_f32(t, k, v, n_keys, key_pos);
}

BF16 static void tile_step_f16_bf16(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                                    int32_t key_pos) {
    if (bf16_tile(t)) lanes_bf16_step(t, k, KP_DTYPE_F16, v, KP_DTYPE_F16, n_keys, key_pos);
    else kp_attn_avx512_kernels.tile_step_f16(t, k, v, n_keys, key_pos);
}

BF16 static void tile_step_kv_bf16(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt,
                                   int n_keys, int32_t key_pos) {
    if (bf16_tile(t)) lanes_bf16_step(t, k, kt, v, vt, n_keys, key_pos);
    else kp_attn_avx512_kernels.tile_step_kv(t, k, kt, v, vt, n_keys, key_pos);
}

/* The layouts of the end are the avx512 table's; so are exp and SwiGLU. */
static void tile_end_bf16(const kp_attn_tile *t, float *out, int64_t out_stride) {
    kp_attn_avx512_kernels.tile_end(t, out, out_stride);
}

static void tile_partial_bf16(const kp_attn_tile *t, float *part) { kp_attn_avx512_kernels.tile_partial(t, part); }

static void exp_row_bf16(const float *x, float *y, int64_t n) { kp_attn_avx512_kernels.exp_row(x, y, n); }

static void swiglu_row_bf16(float *gate, const float *up, int64_t n) {
    kp_attn_avx512_kernels.swiglu_row(gate, up, n);
}

static void geglu_row_bf16(const float *table, float *gate, const float *up, int64_t n) {
    kp_attn_avx512_kernels.geglu_row(table, gate, up, n);
}

const kp_attn_kernels kp_attn_avx512bf16_kernels = {
    .name = "avx512bf16",
    .tile_begin = tile_begin_bf16,
    .tile_step_f32 = tile_step_f32_bf16,
    .tile_step_f16 = tile_step_f16_bf16,
    .tile_step_kv = tile_step_kv_bf16,
    .tile_end = tile_end_bf16,
    .tile_partial = tile_partial_bf16,
    .exp_row = exp_row_bf16,
    .swiglu_row = swiglu_row_bf16,
    .geglu_row = geglu_row_bf16,
};

#else /* not x86-64: no bfloat16 table */

typedef int kp_attn_bf16_unused;

#endif
