/*
 * attn_scalar.c - the attention table "scalar" (attn.h) in portable C, the
 * workspace size of a tile for every table, and the end/partial helpers of
 * row-by-row workspaces that the SIMD tables share. Plain ISO C, no target
 * attributes; it calls no SIMD code (F16 K/V rows are converted with
 * kp_fp16_to_fp32, the same bits as F16C). No state; the table is constant
 * (tables.h; dispatch.c hands it out as kp_attn_scalar()).
 *
 * Scalar tile workspace (M = n_tok * G rows, hd = head size), in floats:
 *
 *   offset                 size      what
 *   0                      M * hd    q, row by row (a copy of the queries)
 *   M*hd                   M * hd    o, running weighted sums of V
 *   2*M*hd                 M         m, running max
 *   2*M*hd + M             M         l, running sum of exp
 *   2*M*hd + 2M            STEP      s: one row's scores, then weights
 *   ... + STEP             STEP*hd   K rows of the step as F32 (F16 steps)
 *   ... + STEP*hd          STEP*hd   V rows of the step as F32 (F16 steps)
 *
 * kp_attn_tile_floats returns the largest size any table needs (the SIMD
 * layouts are drawn in attn_avx2_inl.h), plus, after it (from
 * kp_attn_kv_scratch, every table):
 *
 *   core(hd, M)            STEP*hd   K rows of a tile_step_kv step as F32
 *   ... + STEP*hd          STEP*hd   V rows of that step as F32
 *
 * core(hd, M) grows with M, so a workspace sized for more rows than a tile
 * has still holds the tile's layout and scratch.
 */
#include "kernels/attn.h"

#include <math.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/tables.h"

/* ---- tiles --------------------------------------------------------------- */

/* What the layouts of every table take for n_rows rows. */
static size_t tile_core_floats(int hd, int n_rows) {
    /* the AVX-512 query-lane layout is the largest: rows padded to a
     * multiple of 48 (at least 48), [hd][Mp] queries and sums, 4 per-row
     * vectors, [STEP][Mp] scores, [STEP][hd] K and V, each part rounded up
     * to 16 floats */
    size_t Mp = ((size_t)(n_rows < 8 ? 8 : n_rows) + 47) / 48 * 48;
    size_t h = (size_t)hd;
    return 2 * h * Mp + 4 * Mp + KP_ATTN_STEP * Mp + 2 * KP_ATTN_STEP * h + 16 * 12;
}

size_t kp_attn_tile_floats(int hd, int n_rows) {
    return tile_core_floats(hd, n_rows) + 2 * KP_ATTN_STEP * (size_t)hd;
}

float *kp_attn_kv_scratch(const kp_attn_tile *t) { return t->ws + tile_core_floats(t->hd, t->n_tok * t->G); }

typedef struct {
    int M;
    float *q, *o, *m, *l, *s, *kf, *vf;
} scalar_ws;

static scalar_ws scalar_layout(const kp_attn_tile *t) {
    scalar_ws w;
    size_t M = (size_t)t->n_tok * t->G, hd = (size_t)t->hd;
    w.M = (int)M;
    w.q = t->ws;
    w.o = w.q + M * hd;
    w.m = w.o + M * hd;
    w.l = w.m + M;
    w.s = w.l + M;
    w.kf = w.s + KP_ATTN_STEP;
    w.vf = w.kf + KP_ATTN_STEP * hd;
    return w;
}

static void tile_begin_c(kp_attn_tile *t, const float *q, int64_t q_stride) {
    scalar_ws w = scalar_layout(t);
    int hd = t->hd;
    for (int r = 0; r < w.M; r++) {
        memcpy(w.q + (size_t)r * hd, q + (r / t->G) * q_stride + (r % t->G) * hd, (size_t)hd * sizeof(float));
        memset(w.o + (size_t)r * hd, 0, (size_t)hd * sizeof(float));
        w.m[r] = -INFINITY;
        w.l[r] = 0;
    }
}

static void tile_step_f32_c(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos) {
    kp_attn_prefetch_next(t, 0, 1);
    scalar_ws w = scalar_layout(t);
    int hd = t->hd;
    for (int r = 0; r < w.M; r++) {
        int64_t lim = (int64_t)t->pos0 + r / t->G - key_pos + 1; /* keys this row sees */
        int nvis = lim < 0 ? 0 : lim > n_keys ? n_keys : (int)lim;
        if (nvis == 0) continue;
        const float *qr = w.q + (size_t)r * hd;
        float *o = w.o + (size_t)r * hd;
        float mold = w.m[r], mx = mold;
        for (int j = 0; j < nvis; j++) {
            float s = 0;
            for (int d = 0; d < hd; d++) s += qr[d] * k[(size_t)j * hd + d];
            w.s[j] = s * t->scale;
            mx = w.s[j] > mx ? w.s[j] : mx;
        }
        float a = mx == mold ? 1.0f : expf(mold - mx), sum = 0;
        for (int j = 0; j < nvis; j++) {
            w.s[j] = expf(w.s[j] - mx);
            sum += w.s[j];
        }
        float l = w.l[r] * a + sum;
        if (a != 1.0f)
            for (int d = 0; d < hd; d++) o[d] *= a;
        for (int j = 0; j < nvis; j++)
            for (int d = 0; d < hd; d++) o[d] += w.s[j] * v[(size_t)j * hd + d];
        w.m[r] = mx;
        w.l[r] = l;
    }
}

static void tile_step_f16_c(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                            int32_t key_pos) {
    scalar_ws w = scalar_layout(t);
    for (int64_t i = 0; i < (int64_t)n_keys * t->hd; i++) {
        w.kf[i] = kp_fp16_to_fp32(k[i]);
        w.vf[i] = kp_fp16_to_fp32(v[i]);
    }
    tile_step_f32_c(t, w.kf, w.vf, n_keys, key_pos);
}

/* K and V of a step of any KV type, as F32 (scalar table: kp_dequantize_row). */
static void tile_step_kv_c(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt, int n_keys,
                           int32_t key_pos) {
    float *kf = kp_attn_kv_scratch(t), *vf = kf + (size_t)KP_ATTN_STEP * t->hd;
    int64_t n = (int64_t)n_keys * t->hd;
    if (kt != KP_DTYPE_F32) kp_dequantize_row(kt, k, kf, n);
    if (vt != KP_DTYPE_F32) kp_dequantize_row(vt, v, vf, n);
    tile_step_f32_c(t, kt == KP_DTYPE_F32 ? k : kf, vt == KP_DTYPE_F32 ? v : vf, n_keys, key_pos);
}

void kp_attn_rows_end(const float *o, const float *l, int M, int G, int hd, float *out, int64_t out_stride) {
    for (int r = 0; r < M; r++) {
        float inv = 1.0f / l[r];
        float *dst = out + (r / G) * out_stride + (r % G) * hd;
        for (int d = 0; d < hd; d++) dst[d] = o[(size_t)r * hd + d] * inv;
    }
}

void kp_attn_rows_partial(const float *o, const float *m, const float *l, int M, int hd, float *part) {
    for (int r = 0; r < M; r++) {
        float *p = part + (size_t)r * (hd + 2);
        p[0] = m[r];
        p[1] = l[r];
        memcpy(p + 2, o + (size_t)r * hd, (size_t)hd * sizeof(float));
    }
}

static void tile_end_c(const kp_attn_tile *t, float *out, int64_t out_stride) {
    scalar_ws w = scalar_layout(t);
    kp_attn_rows_end(w.o, w.l, w.M, t->G, t->hd, out, out_stride);
}

static void tile_partial_c(const kp_attn_tile *t, float *part) {
    scalar_ws w = scalar_layout(t);
    kp_attn_rows_partial(w.o, w.m, w.l, w.M, t->hd, part);
}

static void exp_row_c(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

static void swiglu_row_c(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) gate[i] = gate[i] * up[i] / (1.0f + expf(-gate[i]));
}

static void geglu_row_c(const float *table, float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        if (g <= -10.0f) gate[i] = 0.0f;
        else if (g >= 10.0f) gate[i] = g * up[i];
        else gate[i] = table[kp_fp32_to_fp16(g)] * up[i];
    }
}

const kp_attn_kernels kp_attn_scalar_kernels = {
    .name = "scalar",
    .tile_begin = tile_begin_c,
    .tile_step_f32 = tile_step_f32_c,
    .tile_step_f16 = tile_step_f16_c,
    .tile_step_kv = tile_step_kv_c,
    .tile_end = tile_end_c,
    .tile_partial = tile_partial_c,
    .exp_row = exp_row_c,
    .swiglu_row = swiglu_row_c,
    .geglu_row = geglu_row_c,
};

/* ---- the bfloat16 precision (reference) ----------------------------------- */

/* The "bf16" precision of attn_bf16.c's head comment, in portable C: a
 * tile of at least 8 rows with a head size that is a multiple of 32 takes
 * q, k, v rounded to bfloat16, the pairs of dims (and of keys) in the
 * order VDPBF16PS sums them (odd element first), and the weights rounded
 * before they are summed; other tiles are the F32 table's. */

/* x rounded to the nearest bfloat16 (ties to even), as F32; NaN stays NaN. */
static float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* The weights' exp of the bfloat16 precision: attn_bf16.c's exp_w, step
 * for step (the same roundings, so the same weights). */
static float exp_w(float x) {
    float xc = x > -104.0f ? x : -104.0f; /* NaN too, as VMAXPS(x, -104) */
    float n = nearbyintf(xc * 1.44269504f);
    float r = fmaf(-n, 0.693147182f, xc);
    float p = fmaf(fmaf(fmaf(fmaf(1.0f / 24, r, 1.0f / 6), r, 0.5f), r, 1.0f), r, 1.0f);
    return ldexpf(p, (int)n);
}

static bool bf16_tile_c(const kp_attn_tile *t) { return t->hd % 32 == 0 && t->n_tok * t->G >= 8; }

static void tile_begin_cb(kp_attn_tile *t, const float *q, int64_t q_stride) {
    tile_begin_c(t, q, q_stride);
    if (!bf16_tile_c(t)) return;
    scalar_ws w = scalar_layout(t);
    for (size_t i = 0; i < (size_t)w.M * (size_t)t->hd; i++) w.q[i] = round_bf16(w.q[i]);
}

/* GCC 12 (Debian 12's 12.2) miscompiles the pair loop below when it
 * vectorizes it (-O2 and up): a float sum fed "s += a[d + 1] * b[d + 1];
 * s += a[d] * b[d];" per step comes out wrong (integer-valued inputs, 64
 * of them: -4 for -6), not merely rounded differently; the order d, d + 1
 * is compiled right. So the step is not loop-vectorized; it is the
 * portable reference, not a fast path. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_LOOP_VECTORIZE __attribute__((optimize("no-tree-loop-vectorize")))
#else
#define NO_LOOP_VECTORIZE
#endif

/* A bfloat16 step on K and V rows already in F32 (kf, vf: n_keys x hd,
 * rounded here in place). */
NO_LOOP_VECTORIZE static void bf16_step_c(kp_attn_tile *t, float *kf, float *vf, int n_keys, int32_t key_pos) {
    scalar_ws w = scalar_layout(t);
    int hd = t->hd;
    for (size_t i = 0; i < (size_t)n_keys * (size_t)hd; i++) {
        kf[i] = round_bf16(kf[i]);
        vf[i] = round_bf16(vf[i]);
    }
    for (int r = 0; r < w.M; r++) {
        int64_t lim = (int64_t)t->pos0 + r / t->G - key_pos + 1;
        int nvis = lim < 0 ? 0 : lim > n_keys ? n_keys : (int)lim;
        if (nvis == 0) continue;
        const float *qr = w.q + (size_t)r * hd;
        float *o = w.o + (size_t)r * hd;
        float mold = w.m[r], mx = mold;
        for (int j = 0; j < nvis; j++) {
            const float *kj = kf + (size_t)j * hd;
            float s = 0;
            for (int d = 0; d < hd; d += 2) {
                s += qr[d + 1] * kj[d + 1]; /* exact products: no contraction changes a bit */
                s += qr[d] * kj[d];
            }
            w.s[j] = s * t->scale;
            mx = w.s[j] > mx ? w.s[j] : mx;
        }
        float a = mx == mold ? 1.0f : expf(mold - mx), sum = 0;
        for (int j = 0; j < nvis; j++) {
            w.s[j] = round_bf16(exp_w(w.s[j] - mx));
            sum += w.s[j];
        }
        float l = w.l[r] * a + sum;
        if (a != 1.0f)
            for (int d = 0; d < hd; d++) o[d] *= a;
        for (int j = 0; j < nvis; j += 2) {
            const float *ve = vf + (size_t)j * hd, *vo = ve + hd;
            for (int d = 0; d < hd; d++) {
                if (j + 1 < nvis) o[d] += w.s[j + 1] * vo[d];
                o[d] += w.s[j] * ve[d];
            }
        }
        w.m[r] = mx;
        w.l[r] = l;
    }
}

static void tile_step_kv_cb(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt, int n_keys,
                            int32_t key_pos) {
    if (!bf16_tile_c(t)) {
        tile_step_kv_c(t, k, kt, v, vt, n_keys, key_pos);
        return;
    }
    float *kf = kp_attn_kv_scratch(t), *vf = kf + (size_t)KP_ATTN_STEP * t->hd;
    int64_t n = (int64_t)n_keys * t->hd;
    kp_dequantize_row(kt, k, kf, n); /* F32 rows are copied: the step rounds in place */
    kp_dequantize_row(vt, v, vf, n);
    bf16_step_c(t, kf, vf, n_keys, key_pos);
}

static void tile_step_f32_cb(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos) {
    tile_step_kv_cb(t, k, KP_DTYPE_F32, v, KP_DTYPE_F32, n_keys, key_pos);
}

static void tile_step_f16_cb(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                             int32_t key_pos) {
    tile_step_kv_cb(t, k, KP_DTYPE_F16, v, KP_DTYPE_F16, n_keys, key_pos);
}

const kp_attn_kernels kp_attn_scalar_bf16_kernels = {
    .name = "scalar-bf16",
    .tile_begin = tile_begin_cb,
    .tile_step_f32 = tile_step_f32_cb,
    .tile_step_f16 = tile_step_f16_cb,
    .tile_step_kv = tile_step_kv_cb,
    .tile_end = tile_end_c,
    .tile_partial = tile_partial_c,
    .exp_row = exp_row_c,
    .swiglu_row = swiglu_row_c,
    .geglu_row = geglu_row_c,
};
