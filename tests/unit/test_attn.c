/*
 * test_attn.c - attention inner loops (src/kernels/attn.h) against a float64
 * computation, for every table this CPU can run (scalar, avx2, avx512):
 *
 * - exp_row against exp() in double: 2 ulp, 0 below the normal range;
 *   swiglu_row against float64; geglu_row bit for bit against ggml's rule
 *   (F16 rounding worked out in double);
 * - tiles: random head sizes (also ones that are not a multiple of 8, which
 *   fall back to scalar code), G, tile sizes (few-row and many-row
 *   layouts, padding rows), positions, block sizes (partial steps), F32
 *   and F16 K/V, both summation orders, normalized and partial results,
 *   each step's rows in a buffer of their exact size (ASan sees over-reads);
 * - determinism: a tile's rows equal, bit for bit, the same rows computed
 *   in smaller tiles or one token at a time, and the avx2 and avx512
 *   tables agree bit for bit;
 * - Q8_0/Q4_0 K/V (tile_step_kv, mixed with F16/F32 too): kp_quantize_row
 *   writes the bytes of ggml's reference quantizers (written out here), and
 *   every table's output is within float rounding of float64 attention over
 *   those rows' exact values (the query is not quantized: see attn.h), equal
 *   to its F32 step on the same values, and deterministic as above. A
 *   table this CPU lacks is reported as skipped by name;
 * - the BF16 precision (scalar-bf16, and avx512bf16 where the CPU has
 *   AVX512_BF16): prefill tiles within bfloat16 rounding of float64
 *   attention over q, K and V rounded to bfloat16 (rounded here with
 *   frexp/rint, not the kernels' code), measurably apart from the F32
 *   tables (the rounding happens), the SIMD table within float rounding of
 *   the scalar one on all but a few elements (where the exp's last bits
 *   move a weight across a bfloat16 rounding edge), and few-row tiles (and
 *   head sizes not a multiple of 32) bit for bit the F32 tables'.
 */
#include <stdint.h>
#include <time.h>

#include "kernels/attn.h"
#include "harness.h"
#include "kernels/quant.h"

static uint64_t rng;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* The tables this CPU can run, scalar first. */
static int tables(const kp_attn_kernels *out[3]) {
    int n = 0;
    out[n++] = kp_attn_scalar();
#if defined(__x86_64__)
    if (kp_kernels_avx2() && kp_attn_avx2_table()) {
        out[n++] = kp_attn_avx2_table();
        if (__builtin_cpu_supports("avx512f") && kp_attn_avx512_table()) out[n++] = kp_attn_avx512_table();
    }
#endif
    return n;
}

static uint32_t urand(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}

/* ---- exp ------------------------------------------------------------------ */

static void check_exp(const kp_attn_kernels *a) {
    enum { N = 4099 }; /* not a multiple of the vector width */
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)(-90.0 + 95.0 * (frand() + 1.0) / 2.0);
    static const float special[] = {0.0f, -0.0f, -1e-30f, 1e-30f, -0.34657359f, 0.34657359f, -87.3f,
                                    -87.33f, -87.34f, -87.5f, -100.0f, -1e30f, 1.0f, 20.0f};
    size_t ns = sizeof special / sizeof *special;
    for (size_t i = 0; i < ns; i++) x[i] = special[i];
    x[ns] = -INFINITY;
    a->exp_row(x, y, N);
    double worst_ulp = 0;
    for (int i = 0; i < N; i++) {
        double e = exp((double)x[i]);
        if (x[i] >= -87.3f) {
            double ulp = (double)nextafterf((float)e, INFINITY) - (float)e;
            double d = fabs(y[i] - e) / ulp;
            worst_ulp = d > worst_ulp ? d : worst_ulp;
            CHECK_MSG(d <= 2.0, "%s exp(%.9g) = %.9g, want %.9g (%.2f ulp)", a->name, x[i], y[i], e, d);
        } else if (x[i] < -87.34f) {
            CHECK_MSG(y[i] >= 0 && y[i] < 1.2e-38f, "%s exp(%.9g) = %.9g", a->name, x[i], y[i]);
        }
    }
    CHECK(y[0] == 1.0f && y[1] == 1.0f);
    CHECK(y[ns] == 0.0f); /* -inf */
    /* in place */
    memcpy(y, x, N * sizeof(float));
    a->exp_row(y, y, 7);
    float z[7];
    a->exp_row(x, z, 7);
    CHECK(memcmp(y, z, sizeof z) == 0);
    printf("  %s exp: worst %.2f ulp\n", a->name, worst_ulp);
    free(x);
    free(y);
}

/* swiglu_row against float64: a few roundings of the result (the
 * product, the exp, the sum and the quotient), or 1e-35 absolute where
 * gate < -88 (e^-gate saturates, e^88, or overflows to inf: the result is
 * below 2e-36 either way). */
static void check_swiglu(const kp_attn_kernels *a) {
    enum { N = 1031 };
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        g[i] = (float)(i % 5 == 0 ? 100.0 * frand() : 8.0 * frand());
        u[i] = 3.0f * frand();
    }
    g[0] = 0.0f, g[1] = -100.0f, g[2] = 100.0f, g[3] = -88.5f;
    memcpy(y, g, N * sizeof(float));
    a->swiglu_row(y, u, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double ref = (double)g[i] * u[i] / (1.0 + exp(-(double)g[i]));
        double d = fabs(y[i] - ref) / (fabs(ref) + 1e-30);
        if (g[i] > -80) worst = d > worst ? d : worst;
        CHECK_MSG(fabs(y[i] - ref) <= 6e-7 * fabs(ref) + 1e-35, "%s swiglu(%.9g, %.9g) = %.9g, want %.9g", a->name,
                  g[i], u[i], y[i], ref);
    }
    printf("  %s swiglu: worst rel %.3g\n", a->name, worst);
    free(g);
    free(u);
    free(y);
}

/* The F16 bits of g rounded to nearest even, worked out in double here
 * (IEEE 754 binary16: 10 fraction bits, exponent bias 15, subnormals in
 * steps of 2^-24); a NaN keeps its sign and top 9 payload bits, quieted,
 * as vcvtps2ph does. g finite and below 65504 in magnitude, or NaN. */
static uint16_t ref_f16_bits(float g) {
    uint32_t u;
    memcpy(&u, &g, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(g)) return (uint16_t)(sign | 0x7E00u | ((u >> 13) & 0x3FFu));
    const double a = fabs((double)g);
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)nearbyint(a / ldexp(1.0, -24)));
    int e;
    frexp(a, &e); /* a = f x 2^e, f in [0.5, 1): the leading bit is 2^(e - 1) */
    const double q = nearbyint(a / ldexp(1.0, e - 11)); /* 1024 .. 2048 */
    return (uint16_t)(sign | (uint16_t)(((e - 1 + 15) << 10) + ((int)q - 1024)));
}

/* geglu_row: ggml's rule (attn.h) bit for bit, the table filled with
 * values that tell every entry apart; inputs at the cut-offs, F16
 * rounding ties, subnormals, signed zeros and NaN. */
static void check_geglu(const kp_attn_kernels *a) {
    enum { N = 1031 };
    float *table = malloc(65536 * sizeof(float));
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int h = 0; h < 65536; h++) table[h] = (float)(h % 977) - 400.0f + (float)h * 0x1p-17f;
    for (int i = 0; i < N; i++) {
        g[i] = (float)(12.0 * frand());
        u[i] = (float)(3.0 * frand());
    }
    const float special[] = {-10.0f, 10.0f, nextafterf(-10.0f, 0), nextafterf(10.0f, 0), nextafterf(-10.0f, -11),
                             0.0f, -0.0f, 1.0f + 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-23f, 1.0f + 3 * 0x1p-11f,
                             0x1p-25f, 0x1.8p-25f, 0x1p-24f, 3 * 0x1p-25f, -0x1p-20f, 0x1.ffcp-15f, 9.99f, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) g[3 * i + 1] = special[i];
    memcpy(y, g, N * sizeof(float));
    a->geglu_row(table, y, u, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const float want = g[i] <= -10.0f ? 0.0f : g[i] >= 10.0f ? g[i] * u[i] : table[ref_f16_bits(g[i])] * u[i];
        bad += memcmp(&want, &y[i], sizeof want) != 0;
    }
    CHECK_MSG(bad == 0, "%s geglu_row: %d of %d outputs differ from the rule", a->name, bad, N);
    free(table);
    free(g);
    free(u);
    free(y);
}

static void test_exp(void) {
    const kp_attn_kernels *ts[3];
    int n = tables(ts);
    for (int i = 0; i < n; i++) {
        check_exp(ts[i]);
        check_swiglu(ts[i]);
        check_geglu(ts[i]);
    }
}

/* ---- tiles ------------------------------------------------------------------ */

typedef struct {
    int hd, G, n_tok, B, f16, free_order;
    int32_t pos0;
    int n_pos;              /* cached positions 0..n_pos-1, n_pos = pos0 + n_tok */
    float *q;               /* [n_tok][G * hd] */
    float *k, *v;           /* [n_pos][hd], values exactly representable in F16 */
    uint16_t *kh, *vh;
} tile_case;

static void case_new(tile_case *c, int hd, int G, int n_tok, int32_t pos0, int B, int f16, int free_order) {
    c->hd = hd, c->G = G, c->n_tok = n_tok, c->pos0 = pos0, c->B = B, c->f16 = f16, c->free_order = free_order;
    c->n_pos = pos0 + n_tok;
    size_t nq = (size_t)n_tok * G * hd, nkv = (size_t)c->n_pos * hd;
    c->q = malloc(nq * sizeof(float));
    c->k = malloc(nkv * sizeof(float));
    c->v = malloc(nkv * sizeof(float));
    c->kh = malloc(nkv * sizeof(uint16_t));
    c->vh = malloc(nkv * sizeof(uint16_t));
    /* larger queries give peaked softmaxes, so the running max moves */
    float qs = 1.0f + (float)urand(8);
    for (size_t i = 0; i < nq; i++) c->q[i] = qs * frand();
    for (size_t i = 0; i < nkv; i++) {
        c->kh[i] = kp_fp32_to_fp16(frand());
        c->vh[i] = kp_fp32_to_fp16(frand());
        c->k[i] = kp_fp16_to_fp32(c->kh[i]);
        c->v[i] = kp_fp16_to_fp32(c->vh[i]);
    }
}

static void case_free(tile_case *c) {
    free(c->q); free(c->k); free(c->v); free(c->kh); free(c->vh);
}

/* Runs tokens [t0, t0 + T) of the case as one tile, streaming positions
 * 0..pos of its last token the way the forward pass does (a step ends at a
 * block end or every KP_ATTN_STEP rows inside a block), each step's rows
 * copied into buffers of exactly their size. out: [T][G * hd]; part (may
 * be NULL): [T * G][hd + 2]. */
static void run_tile(const kp_attn_kernels *a, const tile_case *c, int t0, int T, float *out, float *part) {
    int hd = c->hd;
    size_t ws_n = kp_attn_tile_floats(hd, T * c->G);
    kp_attn_tile t = {.hd = hd, .G = c->G, .n_tok = T, .pos0 = c->pos0 + t0, .scale = 1.0f / sqrtf((float)hd),
                      .free_order = c->free_order != 0, .ws = malloc(ws_n * sizeof(float))};
    a->tile_begin(&t, c->q + (size_t)t0 * c->G * hd, (int64_t)c->G * hd);
    int64_t p1 = (int64_t)c->pos0 + t0 + T;
    for (int64_t p = 0; p < p1;) {
        int64_t r = p % c->B, rn = KP_ATTN_STEP - r % KP_ATTN_STEP;
        if (rn > c->B - r) rn = c->B - r;
        if (rn > p1 - p) rn = p1 - p;
        size_t n = (size_t)rn * hd;
        if (c->f16) {
            uint16_t *kb = malloc(n * 2), *vb = malloc(n * 2);
            memcpy(kb, c->kh + (size_t)p * hd, n * 2);
            memcpy(vb, c->vh + (size_t)p * hd, n * 2);
            a->tile_step_f16(&t, kb, vb, (int)rn, (int32_t)p);
            free(kb);
            free(vb);
        } else {
            float *kb = malloc(n * 4), *vb = malloc(n * 4);
            memcpy(kb, c->k + (size_t)p * hd, n * 4);
            memcpy(vb, c->v + (size_t)p * hd, n * 4);
            a->tile_step_f32(&t, kb, vb, (int)rn, (int32_t)p);
            free(kb);
            free(vb);
        }
        p += rn;
    }
    a->tile_end(&t, out, (int64_t)c->G * hd);
    if (part) a->tile_partial(&t, part);
    free(t.ws);
}

/* float64 attention of row (token i, head g): out[hd], and the partial
 * state (max score, sum of exp, unnormalized sum). */
static void ref_row(const tile_case *c, int i, int g, double *out, double *m, double *l) {
    int hd = c->hd, n = c->pos0 + i + 1;
    double scale = 1.0 / sqrt((double)hd), mx = -INFINITY, sum = 0;
    double *s = malloc((size_t)n * sizeof(double));
    const float *q = c->q + ((size_t)i * c->G + g) * hd;
    for (int p = 0; p < n; p++) {
        double d = 0;
        for (int j = 0; j < hd; j++) d += (double)q[j] * c->k[(size_t)p * hd + j];
        s[p] = d * (double)(float)scale;
        mx = s[p] > mx ? s[p] : mx;
    }
    for (int j = 0; j < hd; j++) out[j] = 0;
    for (int p = 0; p < n; p++) {
        double w = exp(s[p] - mx);
        sum += w;
        for (int j = 0; j < hd; j++) out[j] += w * c->v[(size_t)p * hd + j];
    }
    *m = mx;
    *l = sum;
    free(s);
}

static void check_tiles(const kp_attn_kernels *a) {
    static const int hds[] = {8, 16, 24, 32, 40, 64, 72, 128, 256, 4, 12, 20, 36};
    static const int blocks[] = {1, 3, 5, 8, 16, 32};
    double worst = 0;
    for (int trial = 0; trial < 160; trial++) {
        int hd = hds[urand(sizeof hds / sizeof *hds)];
        int G = 1 + (int)urand(8);
        int n_tok = trial % 4 == 0 ? 1 : 1 + (int)urand(20);
        int32_t pos0 = (int32_t)urand(70);
        tile_case c;
        case_new(&c, hd, G, n_tok, pos0, blocks[urand(6)], (int)urand(2), (int)urand(2));
        size_t W = (size_t)G * hd;
        float *out = malloc((size_t)n_tok * W * sizeof(float));
        float *part = malloc((size_t)n_tok * G * (hd + 2) * sizeof(float));
        run_tile(a, &c, 0, n_tok, out, part);
        double *ref = malloc((size_t)hd * sizeof(double)), case_worst = 0;
        for (int i = 0; i < n_tok; i++)
            for (int g = 0; g < G; g++) {
                double m, l;
                ref_row(&c, i, g, ref, &m, &l);
                const float *o = out + (size_t)i * W + (size_t)g * hd;
                const float *pp = part + ((size_t)i * G + g) * (hd + 2);
                /* the partial state is relative to the kernel's own max */
                double rescale = exp(m - pp[0]);
                CHECK_MSG(fabs(pp[0] - m) <= 1e-5 * (1 + fabs(m)), "%s partial max %g vs %g", a->name, pp[0], m);
                CHECK_MSG(fabs(pp[1] - l * rescale) <= 1e-5 * l * rescale, "%s partial sum %g vs %g", a->name,
                          pp[1], l * rescale);
                for (int j = 0; j < hd; j++) {
                    double d = fabs(o[j] - ref[j] / l);
                    case_worst = d > case_worst ? d : case_worst;
                    double dp = fabs(pp[2 + j] - ref[j] * rescale);
                    if (dp > 1e-5 * l * rescale) {
                        CHECK_MSG(false, "%s partial o[%d] %g vs %g", a->name, j, pp[2 + j], ref[j] * rescale);
                        break;
                    }
                }
            }
        CHECK_MSG(case_worst < 1e-5, "%s tile hd=%d G=%d n_tok=%d pos0=%d B=%d f16=%d free=%d: %g", a->name, hd, G,
                  n_tok, pos0, c.B, c.f16, c.free_order, case_worst);
        worst = case_worst > worst ? case_worst : worst;
        free(ref);
        free(out);
        free(part);
        case_free(&c);
    }
    printf("  %s tiles: worst |out - float64| %.3g\n", a->name, worst);
}

static void test_tiles(void) {
    const kp_attn_kernels *ts[3];
    int n = tables(ts);
    for (int i = 0; i < n; i++) check_tiles(ts[i]);
}

/* A tile's rows are bitwise the rows of smaller tiles (down to one token,
 * the decode case): both layouts, every table, F32 and F16. */
static void check_same_bits(const kp_attn_kernels *a, const kp_attn_kernels *other) {
    static const int shapes[][2] = {{64, 3}, {32, 2}, {24, 1}, {128, 4}, {16, 8}, {12, 3}, {40, 5}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int f16 = 0; f16 < 2; f16++) {
            int hd = shapes[si][0], G = shapes[si][1], T = 2 + (int)urand(19);
            tile_case c;
            case_new(&c, hd, G, T, (int32_t)urand(80), (int)(urand(2) ? 16 : 1 + urand(32)), f16, 0);
            size_t W = (size_t)G * hd;
            float *whole = malloc((size_t)T * W * sizeof(float)), *split = malloc((size_t)T * W * sizeof(float));
            run_tile(a, &c, 0, T, whole, NULL);
            for (int t0 = 0; t0 < T;) { /* random consecutive pieces, often single tokens */
                int n = urand(3) == 0 ? 1 + (int)urand((uint32_t)(T - t0)) : 1;
                run_tile(a, &c, t0, n, split + (size_t)t0 * W, NULL);
                t0 += n;
            }
            CHECK_MSG(memcmp(whole, split, (size_t)T * W * sizeof(float)) == 0,
                      "%s: tile of %d tokens (hd %d, G %d, f16 %d) differs from smaller tiles", a->name, T, hd, G, f16);
            if (other) {
                run_tile(other, &c, 0, T, split, NULL);
                CHECK_MSG(memcmp(whole, split, (size_t)T * W * sizeof(float)) == 0,
                          "%s and %s differ (hd %d, G %d, f16 %d)", a->name, other->name, hd, G, f16);
            }
            free(whole);
            free(split);
            case_free(&c);
        }
}

static void test_same_bits(void) {
    const kp_attn_kernels *ts[3];
    int n = tables(ts);
    for (int i = 0; i < n; i++) check_same_bits(ts[i], i == 2 ? ts[1] : NULL);
    if (n < 3) SKIP("avx2 vs avx512 tables not compared (this CPU lacks AVX-512F)");
}

/* ---- quantized K/V (tile_step_kv) ------------------------------------------ */

/* ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref),
 * written out here in float as ggml does: q8_0 d = amax / 127, q =
 * round(x / d) (roundf: ties away from zero); q4_0 d = -(the value of
 * largest magnitude) / 8, q = min(15, (int)(x / d + 8.5)). One row of n
 * values (n a multiple of 32) into dst. */
static void ref_quant_q8_0(const float *x, uint8_t *dst, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, dst += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kp_fp32_to_fp16(d);
        memcpy(dst, &dh, 2);
        for (int j = 0; j < 32; j++) dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

static void ref_quant_q4_0(const float *x, uint8_t *dst, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, dst += 18) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        float d = max / -8, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kp_fp32_to_fp16(d);
        memcpy(dst, &dh, 2);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[16 + j] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0, q1 = q1 > 15 ? 15 : q1;
            dst[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

/* The value at index j of a quantized row, in double (exact: d * q). */
static double ref_dequant(kp_dtype t, const uint8_t *row, int j) {
    size_t bs = t == KP_DTYPE_Q8_0 ? 34 : 18;
    const uint8_t *b = row + (size_t)(j / 32) * bs;
    uint16_t dh;
    memcpy(&dh, b, 2);
    double d = kp_fp16_to_fp32(dh);
    int i = j % 32;
    if (t == KP_DTYPE_Q8_0) return d * (int8_t)b[2 + i];
    int q = i < 16 ? (b[2 + i] & 0xF) : (b[2 + i - 16] >> 4);
    return d * (q - 8);
}

/* A case with K of type kt and V of type vt (F32, F16, Q8_0 or Q4_0): the
 * float K/V, their stored rows, and the stored rows' values in double. */
typedef struct {
    int hd, G, n_tok, B, free_order;
    int32_t pos0;
    int n_pos;
    kp_dtype kt, vt;
    float *q;            /* [n_tok][G * hd] */
    uint8_t *ks, *vs;    /* stored rows, [n_pos][row bytes] */
    double *kd, *vd;     /* their values, [n_pos][hd] */
    float *kf, *vf;      /* the same as F32 (exact) */
} qcase;

static size_t row_bytes(kp_dtype t, int hd) { return kp_dtype_row_size(t, hd); }

static void store_ref(kp_dtype t, const float *x, uint8_t *dst, double *val, int hd) {
    if (t == KP_DTYPE_Q8_0) ref_quant_q8_0(x, dst, hd);
    else if (t == KP_DTYPE_Q4_0) ref_quant_q4_0(x, dst, hd);
    else if (t == KP_DTYPE_F16)
        for (int j = 0; j < hd; j++) {
            uint16_t h = kp_fp32_to_fp16(x[j]);
            memcpy(dst + 2 * j, &h, 2);
        }
    else memcpy(dst, x, (size_t)hd * 4);
    for (int j = 0; j < hd; j++) {
        if (t == KP_DTYPE_Q8_0 || t == KP_DTYPE_Q4_0) val[j] = ref_dequant(t, dst, j);
        else if (t == KP_DTYPE_F16) {
            uint16_t h;
            memcpy(&h, dst + 2 * j, 2);
            val[j] = kp_fp16_to_fp32(h);
        } else val[j] = x[j];
    }
}

static void qcase_new(qcase *c, int hd, int G, int n_tok, int32_t pos0, int B, kp_dtype kt, kp_dtype vt,
                      int free_order) {
    c->hd = hd, c->G = G, c->n_tok = n_tok, c->pos0 = pos0, c->B = B, c->kt = kt, c->vt = vt;
    c->free_order = free_order;
    c->n_pos = pos0 + n_tok;
    size_t nq = (size_t)n_tok * G * hd, nkv = (size_t)c->n_pos * hd;
    c->q = malloc(nq * sizeof(float));
    c->ks = malloc((size_t)c->n_pos * row_bytes(kt, hd));
    c->vs = malloc((size_t)c->n_pos * row_bytes(vt, hd));
    c->kd = malloc(nkv * sizeof(double));
    c->vd = malloc(nkv * sizeof(double));
    c->kf = malloc(nkv * sizeof(float));
    c->vf = malloc(nkv * sizeof(float));
    float qs = 1.0f + (float)urand(8);
    for (size_t i = 0; i < nq; i++) c->q[i] = qs * frand();
    float *x = malloc((size_t)hd * sizeof(float));
    for (int p = 0; p < c->n_pos; p++) {
        float sc = 0.1f + 0.5f * (frand() + 1.0f); /* rows of different magnitudes, up to 1.1 */
        for (int j = 0; j < hd; j++) x[j] = sc * frand();
        if (urand(4) == 0) x[urand((uint32_t)hd)] = 0.0f;
        if (urand(16) == 0) memset(x, 0, (size_t)hd * sizeof(float)); /* an all-zero row: d = 0 */
        store_ref(kt, x, c->ks + (size_t)p * row_bytes(kt, hd), c->kd + (size_t)p * hd, hd);
        for (int j = 0; j < hd; j++) x[j] = sc * frand();
        store_ref(vt, x, c->vs + (size_t)p * row_bytes(vt, hd), c->vd + (size_t)p * hd, hd);
    }
    for (size_t i = 0; i < nkv; i++) c->kf[i] = (float)c->kd[i], c->vf[i] = (float)c->vd[i];
    free(x);
}

static void qcase_free(qcase *c) {
    free(c->q); free(c->ks); free(c->vs); free(c->kd); free(c->vd); free(c->kf); free(c->vf);
}

/* run_tile for a qcase: tile_step_kv on the stored rows (quantized = 1),
 * or tile_step_f32 on their F32 values (quantized = 0), each step's rows in
 * buffers of exactly their size. */
static void run_qtile(const kp_attn_kernels *a, const qcase *c, int t0, int T, int quantized, float *out) {
    int hd = c->hd;
    size_t kb_row = row_bytes(c->kt, hd), vb_row = row_bytes(c->vt, hd);
    kp_attn_tile t = {.hd = hd, .G = c->G, .n_tok = T, .pos0 = c->pos0 + t0, .scale = 1.0f / sqrtf((float)hd),
                      .free_order = c->free_order != 0,
                      .ws = malloc(kp_attn_tile_floats(hd, T * c->G) * sizeof(float))};
    a->tile_begin(&t, c->q + (size_t)t0 * c->G * hd, (int64_t)c->G * hd);
    int64_t p1 = (int64_t)c->pos0 + t0 + T;
    for (int64_t p = 0; p < p1;) {
        int64_t r = p % c->B, rn = KP_ATTN_STEP - r % KP_ATTN_STEP;
        if (rn > c->B - r) rn = c->B - r;
        if (rn > p1 - p) rn = p1 - p;
        if (quantized) {
            uint8_t *kb = malloc((size_t)rn * kb_row), *vb = malloc((size_t)rn * vb_row);
            memcpy(kb, c->ks + (size_t)p * kb_row, (size_t)rn * kb_row);
            memcpy(vb, c->vs + (size_t)p * vb_row, (size_t)rn * vb_row);
            a->tile_step_kv(&t, kb, c->kt, vb, c->vt, (int)rn, (int32_t)p);
            free(kb);
            free(vb);
        } else {
            a->tile_step_f32(&t, c->kf + (size_t)p * hd, c->vf + (size_t)p * hd, (int)rn, (int32_t)p);
        }
        p += rn;
    }
    a->tile_end(&t, out, (int64_t)c->G * hd);
    free(t.ws);
}

/* float64 attention of (token i, head g) over the stored rows' values. */
static void ref_qrow(const qcase *c, int i, int g, double *out) {
    int hd = c->hd, n = c->pos0 + i + 1;
    double scale = (double)(1.0f / sqrtf((float)hd)), mx = -INFINITY, sum = 0;
    double *s = malloc((size_t)n * sizeof(double));
    const float *q = c->q + ((size_t)i * c->G + g) * hd;
    for (int p = 0; p < n; p++) {
        double d = 0;
        for (int j = 0; j < hd; j++) d += (double)q[j] * c->kd[(size_t)p * hd + j];
        s[p] = d * scale;
        mx = s[p] > mx ? s[p] : mx;
    }
    for (int j = 0; j < hd; j++) out[j] = 0;
    for (int p = 0; p < n; p++) {
        double w = exp(s[p] - mx);
        sum += w;
        for (int j = 0; j < hd; j++) out[j] += w * c->vd[(size_t)p * hd + j];
    }
    for (int j = 0; j < hd; j++) out[j] /= sum;
    free(s);
}

/* kvpin's quantizer writes the bytes of ggml's reference algorithm (the
 * forward pass stores K/V rows with kp_quantize_row). */
static void test_kv_quantizer(void) {
    enum { N = 32 * 64 };
    float *x = malloc(N * sizeof(float));
    uint8_t *a = malloc(N / 32 * 34), *b = malloc(N / 32 * 34);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) x[i] = (float)(round + 1) * frand();
        for (int i = 0; i < N; i += 97) x[i] = 0.0f;
        memset(x + 64, 0, 32 * sizeof(float)); /* a zero block */
        ref_quant_q8_0(x, a, N);
        CHECK(kp_quantize_row(KP_DTYPE_Q8_0, x, b, N));
        CHECK(memcmp(a, b, (size_t)N / 32 * 34) == 0);
        ref_quant_q4_0(x, a, N);
        CHECK(kp_quantize_row(KP_DTYPE_Q4_0, x, b, N));
        CHECK(memcmp(a, b, (size_t)N / 32 * 18) == 0);
    }
    free(x);
    free(a);
    free(b);
}

/* Every table's tile_step_kv against float64 attention over the stored
 * rows' values (so the reference quantizes K/V exactly as kvpin does and
 * computes the rest exactly): within float rounding; bitwise equal to the
 * table's tile_step_f32 on the same values; a tile's rows bitwise those of
 * smaller tiles (decode); and the avx2 and avx512 tables equal. */
static void check_kv_quant(const kp_attn_kernels *a, const kp_attn_kernels *other) {
    static const int hds[] = {32, 64, 96, 128, 256};
    static const int blocks[] = {1, 3, 8, 16, 32};
    static const kp_dtype types[] = {KP_DTYPE_Q8_0, KP_DTYPE_Q4_0, KP_DTYPE_F16, KP_DTYPE_F32};
    double worst = 0;
    for (int trial = 0; trial < 60; trial++) {
        int hd = hds[urand(5)], G = 1 + (int)urand(6);
        int n_tok = trial % 3 == 0 ? 1 : 1 + (int)urand(20);
        kp_dtype kt = types[urand(4)], vt = types[urand(4)];
        if (trial % 2 == 0) kt = vt = types[trial / 2 % 2]; /* half the trials: both Q8_0 or both Q4_0 */
        if (kt != KP_DTYPE_Q8_0 && kt != KP_DTYPE_Q4_0 && vt != KP_DTYPE_Q8_0 && vt != KP_DTYPE_Q4_0)
            kt = KP_DTYPE_Q8_0;
        qcase c;
        qcase_new(&c, hd, G, n_tok, (int32_t)urand(60), blocks[urand(5)], kt, vt, (int)urand(2));
        size_t W = (size_t)G * hd, bytes = (size_t)n_tok * W * sizeof(float);
        float *out = malloc(bytes), *f32 = malloc(bytes), *split = malloc(bytes);
        run_qtile(a, &c, 0, n_tok, 1, out);
        run_qtile(a, &c, 0, n_tok, 0, f32);
        CHECK_MSG(memcmp(out, f32, bytes) == 0, "%s: kv step (K %s, V %s, hd %d) differs from the F32 step",
                  a->name, kp_dtype_name(kt), kp_dtype_name(vt), hd);
        double *ref = malloc((size_t)hd * sizeof(double)), case_worst = 0;
        for (int i = 0; i < n_tok; i++)
            for (int g = 0; g < G; g++) {
                ref_qrow(&c, i, g, ref);
                const float *o = out + (size_t)i * W + (size_t)g * hd;
                double scale = 0;
                for (int j = 0; j < hd; j++) scale = fabs(ref[j]) > scale ? fabs(ref[j]) : scale;
                for (int j = 0; j < hd; j++) {
                    double d = fabs(o[j] - ref[j]) / (scale > 1 ? scale : 1);
                    case_worst = d > case_worst ? d : case_worst;
                }
            }
        CHECK_MSG(case_worst < 1e-5, "%s kv K %s V %s hd=%d G=%d n_tok=%d B=%d free=%d: %g", a->name,
                  kp_dtype_name(kt), kp_dtype_name(vt), hd, G, n_tok, c.B, c.free_order, case_worst);
        worst = case_worst > worst ? case_worst : worst;
        if (!c.free_order) {
            for (int t0 = 0; t0 < n_tok;) {
                int n = urand(3) == 0 ? 1 + (int)urand((uint32_t)(n_tok - t0)) : 1;
                run_qtile(a, &c, t0, n, 1, split + (size_t)t0 * W);
                t0 += n;
            }
            CHECK_MSG(memcmp(out, split, bytes) == 0, "%s: kv tile of %d tokens differs from smaller tiles",
                      a->name, n_tok);
            if (other) {
                run_qtile(other, &c, 0, n_tok, 1, split);
                CHECK_MSG(memcmp(out, split, bytes) == 0, "%s and %s differ on kv K %s V %s", a->name,
                          other->name, kp_dtype_name(kt), kp_dtype_name(vt));
            }
        }
        free(ref);
        free(out);
        free(f32);
        free(split);
        qcase_free(&c);
    }
    printf("  %s kv q8_0/q4_0 tiles: worst |out - float64| / max(1, |out|) %.3g\n", a->name, worst);
}

static void test_kv_quant(void) {
    const kp_attn_kernels *ts[3];
    int n = tables(ts);
    for (int i = 0; i < n; i++) check_kv_quant(ts[i], i == 2 ? ts[1] : NULL);
    if (n < 2) SKIP("table avx2 (this CPU lacks AVX2/FMA/F16C)");
    if (n < 3) SKIP("table avx512 (this CPU lacks AVX-512F)");
}

/* ---- the BF16 precision ----------------------------------------------------- */

/* x rounded to 8 significant bits, ties to even (the current rounding mode
 * of rint): bfloat16's rounding of a finite float. */
static double round8(double x) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    double m = frexp(x, &e); /* 0.5 <= |m| < 1 */
    return ldexp(rint(m * 256.0), e - 8);
}

/* ref_qrow over q, K and V rounded to bfloat16. */
static void ref_qrow_bf16(const qcase *c, int i, int g, double *out) {
    int hd = c->hd, n = c->pos0 + i + 1;
    double scale = (double)(1.0f / sqrtf((float)hd)), mx = -INFINITY, sum = 0;
    double *s = malloc((size_t)n * sizeof(double));
    const float *q = c->q + ((size_t)i * c->G + g) * hd;
    for (int p = 0; p < n; p++) {
        double d = 0;
        for (int j = 0; j < hd; j++) d += round8(q[j]) * round8(c->kd[(size_t)p * hd + j]);
        s[p] = d * scale;
        mx = s[p] > mx ? s[p] : mx;
    }
    for (int j = 0; j < hd; j++) out[j] = 0;
    for (int p = 0; p < n; p++) {
        double w = exp(s[p] - mx);
        sum += w;
        for (int j = 0; j < hd; j++) out[j] += w * round8(c->vd[(size_t)p * hd + j]);
    }
    for (int j = 0; j < hd; j++) out[j] /= sum;
    free(s);
}

/* One table of the BF16 precision (a), with f32, the F32 table of the same
 * instruction set (its few-row tiles must be the same bits), and scalar,
 * the BF16 reference (NULL when a is the reference). */
static void check_bf16(const kp_attn_kernels *a, const kp_attn_kernels *f32, const kp_attn_kernels *scalar) {
    static const int hds[] = {32, 64, 128, 256, 64, 96, 40, 24};
    static const int blocks[] = {1, 3, 8, 16, 32};
    static const kp_dtype types[] = {KP_DTYPE_F16, KP_DTYPE_F32, KP_DTYPE_Q8_0, KP_DTYPE_Q4_0};
    double worst = 0, worst_apart = 1e9, worst_vs_scalar = 0;
    long n_el = 0, n_off = 0;
    for (int trial = 0; trial < 60; trial++) {
        int hd = hds[urand(8)], G = 1 + (int)urand(6);
        int n_tok = trial % 4 == 0 ? 1 + (int)urand(2) : 2 + (int)urand(30);
        kp_dtype kt = types[urand(4)], vt = trial % 3 ? kt : types[urand(4)];
        if (hd % 32) kt = vt = KP_DTYPE_F16;
        qcase c;
        qcase_new(&c, hd, G, n_tok, (int32_t)urand(90), blocks[urand(5)], kt, vt, 0);
        bool bf16 = hd % 32 == 0 && n_tok * G >= 8;
        size_t W = (size_t)G * hd, bytes = (size_t)n_tok * W * sizeof(float);
        float *out = malloc(bytes), *base = malloc(bytes), *ref_out = malloc(bytes);
        run_qtile(a, &c, 0, n_tok, 1, out);
        run_qtile(f32, &c, 0, n_tok, 1, base);
        if (!bf16) {
            CHECK_MSG(memcmp(out, base, bytes) == 0, "%s: a tile of %d rows (hd %d) is not the %s table's", a->name,
                      n_tok * G, hd, f32->name);
        } else {
            double *ref = malloc((size_t)hd * sizeof(double)), case_worst = 0, apart = 0;
            for (int i = 0; i < n_tok; i++)
                for (int g = 0; g < G; g++) {
                    ref_qrow_bf16(&c, i, g, ref);
                    const float *o = out + (size_t)i * W + (size_t)g * hd, *b = base + (size_t)i * W + (size_t)g * hd;
                    for (int j = 0; j < hd; j++) {
                        double d = fabs(o[j] - ref[j]);
                        case_worst = d > case_worst ? d : case_worst;
                        apart = fabs(o[j] - b[j]) > apart ? fabs(o[j] - b[j]) : apart;
                    }
                }
            /* each weight and product within 2^-9: the output within about 2^-8 of the values (up to 1.1) */
            CHECK_MSG(case_worst < 3e-3, "%s bf16 K %s V %s hd=%d G=%d n_tok=%d B=%d: %g from float64", a->name,
                      kp_dtype_name(kt), kp_dtype_name(vt), hd, G, n_tok, c.B, case_worst);
            CHECK_MSG(apart > 1e-5, "%s bf16 hd=%d G=%d n_tok=%d: only %g from the F32 table (not rounded?)", a->name,
                      hd, G, n_tok, apart);
            worst = case_worst > worst ? case_worst : worst;
            worst_apart = apart < worst_apart ? apart : worst_apart;
            free(ref);
            if (scalar) {
                run_qtile(scalar, &c, 0, n_tok, 1, ref_out);
                for (size_t e = 0; e < bytes / sizeof(float); e++) {
                    double d = fabs(out[e] - ref_out[e]);
                    worst_vs_scalar = d > worst_vs_scalar ? d : worst_vs_scalar;
                    n_el++;
                    if (d > 2e-5) n_off++;
                    CHECK_MSG(d < 6e-3, "%s vs %s: %g at element %zu (hd %d)", a->name, scalar->name, d, e, hd);
                }
            }
        }
        free(out);
        free(base);
        free(ref_out);
        qcase_free(&c);
    }
    if (scalar)
        CHECK_MSG(n_off * 100 <= n_el, "%s vs %s: %ld of %ld elements more than 2e-5 apart", a->name, scalar->name,
                  n_off, n_el);
    printf("  %s: worst |out - float64 on bf16 inputs| %.3g, least distance from %s %.3g", a->name, worst, f32->name,
           worst_apart);
    if (scalar) printf(", vs %s: worst %.3g, %ld of %ld elements > 2e-5", scalar->name, worst_vs_scalar, n_off, n_el);
    printf("\n");
}

static void test_bf16(void) {
    check_bf16(kp_attn_scalar_bf16(), kp_attn_scalar(), NULL);
    if (kp_attn_bf16_best()) check_bf16(kp_attn_bf16_best(), kp_attn_avx512_table(), kp_attn_scalar_bf16());
    else SKIP("table avx512bf16 (this CPU lacks AVX512_BF16)");
}

int main(void) {
    rng = (uint64_t)time(NULL);
    printf("test_attn seed %llu, best table %s\n", (unsigned long long)rng, kp_attn_best()->name);
    RUN(test_exp);
    RUN(test_tiles);
    RUN(test_same_bits);
    RUN(test_kv_quantizer);
    RUN(test_kv_quant);
    RUN(test_bf16);
    return harness_finish("attn");
}
