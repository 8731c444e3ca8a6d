/*
 * test_quant_more.c - the weight types Q4_1, Q5_0, Q5_1, Q5_K and the
 * activation type Q8_1 (src/kernels/quant_*.c, reached through quant.h).
 *
 * References, none taken from kvpin's own output:
 *   - llama.cpp's quantize_row_*_ref outputs on 48 chosen rows
 *     (tests/data/quant_more/ref_vectors.bin, made by llama.cpp's library):
 *     our quantizers, and both tables' Q8_1 activation quantizers, must
 *     give the same bytes;
 *   - float64 decoders of every block layout, written here from the layout
 *     tables (byte offsets and bit positions, no code shared with src/);
 *   - float64 dot products defined by the formats (for Q8_1 activations:
 *     d_w*d_a*sum(q_w*q_a) + m_w*s_a with the stored s);
 *   - error bounds that follow from each quantizer's definition, and a
 *     naive quantizer computed here that Q5_K's search must beat;
 *   - invariants of quant.h's contract: gemm gives each output bit for
 *     bit the same value for every shape of call, the same as dot_tile,
 *     the same in the avx2 and avx512vnni tables, and the same on a
 *     table's repacked layout (gemm_packed; Q5_K in avx512vnni);
 *   - end to end: models written by mkmodel in each type must give logits
 *     close to the same-seed F32 model's, within what the type's weight
 *     error implies, measured against Q8_0 and Q4_0 on the same model,
 *     the same logits fed token by token as in one batch, and bit for bit
 *     the same on repacked weights.
 * Random inputs use a fresh seed each run (KP_TEST_SEED=<n> replays one);
 * the seed is printed when a check fails.
 */
#include "harness.h"

#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "gguf/dtype.h"
#include "model/forward.h"
#include "gguf/gguf.h"
#include "model/mkmodel.h"
#include "kernels/quant.h"

#define STORIES "models/stories260K.gguf"
#define REF_VECTORS "tests/data/quant_more/ref_vectors.bin"

static const kp_dtype new_types[] = {KP_DTYPE_Q4_1, KP_DTYPE_Q5_0, KP_DTYPE_Q5_1, KP_DTYPE_Q5_K};
#define N_NEW (int)(sizeof new_types / sizeof new_types[0])

/* ------------------------------------------------------------------------ */
/* random numbers                                                            */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1p-53; }

static float rng_gauss(void) {
    const double u1 = rng_unit() + 0x1p-60, u2 = rng_unit();
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
}

static void gauss_row(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * scale;
}

/* ------------------------------------------------------------------------ */
/* float64 decoders, from the layout tables                                  */
/* ------------------------------------------------------------------------ */

/* binary16 from its definition. */
static double ref_half(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp(m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double le_half(const uint8_t *p) { return ref_half((uint16_t)(p[0] | p[1] << 8)); }

static uint32_t le_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A block's quants and scale fields, decoded from the bytes. For the
 * 32-element types: q[32], d, m (Q4_1/Q5_1 offset; Q5_0: 0 with q already
 * minus 16; Q8_1: m = s, the stored block sum). For Q5_K: q[256], d, m =
 * dmin, sc[8], mn[8]. */
typedef struct {
    int q[256];
    double d, m;
    int sc[8], mn[8];
} ref_block;

/* Q4_K/Q5_K 6-bit scale j (sc) and min (mn) from the 12 packed bytes. */
static void ref_scale_min(const uint8_t *S, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = S[j] & 63;
        *mn = S[j + 4] & 63;
    } else {
        *sc = (S[j + 4] & 15) | (S[j - 4] >> 6) << 4;
        *mn = (S[j + 4] >> 4) | (S[j] >> 6) << 4;
    }
}

static void ref_block_decode(kp_dtype t, const uint8_t *blk, ref_block *r) {
    memset(r, 0, sizeof *r);
    switch (t) {
    case KP_DTYPE_Q4_1: /* [half d][half m][16 nibble bytes] */
        r->d = le_half(blk);
        r->m = le_half(blk + 2);
        for (int e = 0; e < 32; e++) r->q[e] = e < 16 ? blk[4 + e] & 15 : blk[4 + e - 16] >> 4;
        break;
    case KP_DTYPE_Q5_0: { /* [half d][u32 qh][16 nibble bytes] */
        r->d = le_half(blk);
        const uint32_t h = le_u32(blk + 2);
        for (int e = 0; e < 32; e++) {
            const int low = e < 16 ? blk[6 + e] & 15 : blk[6 + e - 16] >> 4;
            r->q[e] = (low | (int)((h >> e) & 1) << 4) - 16;
        }
        break;
    }
    case KP_DTYPE_Q5_1: { /* [half d][half m][u32 qh][16 nibble bytes] */
        r->d = le_half(blk);
        r->m = le_half(blk + 2);
        const uint32_t h = le_u32(blk + 4);
        for (int e = 0; e < 32; e++) {
            const int low = e < 16 ? blk[8 + e] & 15 : blk[8 + e - 16] >> 4;
            r->q[e] = low | (int)((h >> e) & 1) << 4;
        }
        break;
    }
    case KP_DTYPE_Q8_1: /* [half d][half s][int8 x32] */
        r->d = le_half(blk);
        r->m = le_half(blk + 2);
        for (int e = 0; e < 32; e++) r->q[e] = (int8_t)blk[4 + e];
        break;
    case KP_DTYPE_Q8_0: /* [half d][int8 x32] */
        r->d = le_half(blk);
        for (int e = 0; e < 32; e++) r->q[e] = (int8_t)blk[2 + e];
        break;
    case KP_DTYPE_Q5_K: { /* [half d][half dmin][12 scales][32 qh][128 qs] */
        r->d = le_half(blk);
        r->m = le_half(blk + 2);
        for (int j = 0; j < 8; j++) ref_scale_min(blk + 4, j, &r->sc[j], &r->mn[j]);
        const uint8_t *QH = blk + 16, *QS = blk + 48;
        for (int e = 0; e < 256; e++) {
            const int c = e / 64, l = e % 32, upper = (e % 64) >= 32;
            const int byte = QS[32 * c + l];
            const int low = upper ? byte >> 4 : byte & 15;
            r->q[e] = low | ((QH[l] >> (2 * c + upper)) & 1) << 4;
        }
        break;
    }
    case KP_DTYPE_Q8_K: { /* [float d][int8 x256][int16 bsums x16] */
        float d;
        memcpy(&d, blk, 4);
        r->d = d;
        for (int e = 0; e < 256; e++) r->q[e] = (int8_t)blk[4 + e];
        break;
    }
    default: CHECK(!"ref_block_decode: unexpected type"); break;
    }
}

static int block_elems(kp_dtype t) { return (int)kp_dtype_get(t)->block_size; }
static size_t block_bytes(kp_dtype t) { return kp_dtype_get(t)->type_size; }

/* Element values of n elements of type t (float64). */
static void ref_decode(kp_dtype t, const uint8_t *b, int64_t n, double *out) {
    ref_block r;
    const int be = block_elems(t);
    for (int64_t ib = 0; ib < n / be; ib++) {
        ref_block_decode(t, b + ib * block_bytes(t), &r);
        for (int e = 0; e < be; e++) {
            double v;
            switch (t) {
            case KP_DTYPE_Q4_1:
            case KP_DTYPE_Q5_1: v = r.d * r.q[e] + r.m; break;
            case KP_DTYPE_Q5_K: v = r.d * r.sc[e / 32] * r.q[e] - r.m * r.mn[e / 32]; break;
            default: v = r.d * r.q[e]; break; /* Q5_0 (q - 16 stored), Q8_1, Q8_0, Q8_K */
            }
            out[ib * be + e] = v;
        }
    }
}

/*
 * The dot product a weight row w (type wt) and an activation row a (type
 * kp_vec_dot_type(wt)) define, in float64: the plain sum of products of
 * the decoded elements, except that with Q8_1 activations the "+ m" term
 * uses the stored block sum s (m_w * s_a), as the format intends. *mag is
 * the sum of the absolute terms (the scale of rounding errors).
 */
static double ref_dot(kp_dtype wt, const uint8_t *w, const uint8_t *a, int64_t n, double *mag) {
    const kp_dtype at = kp_vec_dot_type(wt);
    static double dw[8192], da[8192];
    double s = 0, m = 0;
    if (at != KP_DTYPE_Q8_1) {
        ref_decode(wt, w, n, dw);
        ref_decode(at, a, n, da);
        for (int64_t i = 0; i < n; i++) {
            s += dw[i] * da[i];
            m += fabs(dw[i] * da[i]);
        }
    } else {
        ref_block rw, ra;
        for (int64_t ib = 0; ib < n / 32; ib++) {
            ref_block_decode(wt, w + ib * block_bytes(wt), &rw);
            ref_block_decode(at, a + ib * 36, &ra);
            double sq = 0, sa = 0;
            for (int e = 0; e < 32; e++) {
                sq += (double)rw.q[e] * ra.q[e];
                sa += fabs((double)rw.q[e] * ra.q[e]);
            }
            s += rw.d * ra.d * sq + rw.m * ra.m;
            m += fabs(rw.d * ra.d) * sa + fabs(rw.m * ra.m);
        }
    }
    *mag = m;
    return s;
}

/* ------------------------------------------------------------------------ */
/* llama.cpp's bytes                                                         */
/* ------------------------------------------------------------------------ */

static void test_matches_llama_cpp(void) {
    size_t len = 0;
    uint8_t *file = (uint8_t *)harness_read_file(harness_path(REF_VECTORS), &len);
    CHECK_MSG(file != NULL, "cannot read %s", REF_VECTORS);
    if (!file) return;
    CHECK(len >= 16 && memcmp(file, "KPQR", 4) == 0 && le_u32(file + 4) == 1);
    const uint32_t n_rows = le_u32(file + 8), row_len = le_u32(file + 12);
    CHECK(n_rows == 48 && row_len == 256);
    size_t off = 16 + (size_t)n_rows * row_len * 4;
    if (n_rows != 48 || row_len != 256 || len < off) {
        free(file);
        return;
    }
    static float x[48 * 256];
    memcpy(x, file + 16, sizeof x);
    static uint8_t mine[1024];
    static float y[256];
    static double want[256];
    int types_seen = 0;
    while (off + 8 <= len) {
        const kp_dtype t = (kp_dtype)le_u32(file + off);
        const uint32_t nbytes = le_u32(file + off + 4);
        off += 8;
        const size_t rs = kp_dtype_row_size(t, row_len);
        CHECK_MSG(rs > 0 && nbytes == rs * n_rows && off + nbytes <= len, "type %u section", (unsigned)t);
        if (rs == 0 || nbytes != rs * n_rows || off + nbytes > len) break;
        types_seen++;
        const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
        int bad = 0, bad_act[2] = {0, 0}, bad_dec = 0;
        for (uint32_t r = 0; r < n_rows; r++) {
            const float *xr = x + (size_t)r * row_len;
            const uint8_t *ref = file + off + (size_t)r * rs;
            CHECK(kp_quantize_row(t, xr, mine, row_len));
            if (memcmp(mine, ref, rs) != 0 && bad++ < 3)
                fprintf(stderr, "%s row %u differs from llama.cpp\n", kp_dtype_name(t), (unsigned)r);
            if (t == KP_DTYPE_Q8_1) { /* both tables' activation quantizers */
                for (int k = 0; k < 2; k++) {
                    if (!tabs[k]) continue;
                    tabs[k]->quantize_act[KP_DTYPE_Q4_1](xr, mine, row_len);
                    bad_act[k] += memcmp(mine, ref, rs) != 0;
                    tabs[k]->quantize_act[KP_DTYPE_Q5_1](xr, mine, row_len);
                    bad_act[k] += memcmp(mine, ref, rs) != 0;
                }
            }
            /* our dequantizer on llama.cpp's bytes, against the float64 decoder */
            CHECK(kp_dequantize_row(t, ref, y, row_len));
            ref_decode(t, ref, row_len, want);
            for (uint32_t i = 0; i < row_len; i++) bad_dec += !(fabs(y[i] - want[i]) <= 2e-6 * fabs(want[i]) + 1e-30);
        }
        printf("quant_more: %s: %u rows, %d differ from llama.cpp's quantize_row_%s_ref\n", kp_dtype_name(t),
               (unsigned)n_rows, bad, kp_dtype_name(t));
        CHECK_MSG(bad == 0, "%s: %d rows differ from llama.cpp", kp_dtype_name(t), bad);
        CHECK_MSG(bad_act[0] == 0 && bad_act[1] == 0, "Q8_1 quantize_act: scalar %d, avx2 %d rows differ",
                  bad_act[0], bad_act[1]);
        CHECK_MSG(bad_dec == 0, "%s: %d decoded elements differ", kp_dtype_name(t), bad_dec);
        off += nbytes;
    }
    CHECK_EQ_INT(types_seen, 5);
    free(file);
}

/* ------------------------------------------------------------------------ */
/* dequantization                                                            */
/* ------------------------------------------------------------------------ */

static void put_half(uint8_t *p, float v) {
    const uint16_t h = kp_fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random bytes with finite scale fields, so every decoded value is finite. */
static void random_blocks(kp_dtype t, uint8_t *b, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)rng_u64();
    for (size_t blk = 0; blk < bytes / block_bytes(t); blk++) {
        uint8_t *p = b + blk * block_bytes(t);
        put_half(p, rng_gauss() * 0.01f);
        if (t != KP_DTYPE_Q5_0) put_half(p + 2, rng_gauss() * 0.1f); /* m, s or dmin */
    }
}

static void test_dequantize_random_blocks(void) {
    const kp_dtype types[] = {KP_DTYPE_Q4_1, KP_DTYPE_Q5_0, KP_DTYPE_Q5_1, KP_DTYPE_Q5_K, KP_DTYPE_Q8_1};
    enum { N = 768 };
    static uint8_t raw[N * 2];
    static float got[N];
    static double want[N];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kp_dtype t = types[ti];
        for (int rep = 0; rep < 4; rep++) {
            random_blocks(t, raw, kp_dtype_row_size(t, N));
            for (int i = 0; i < N; i++) got[i] = NAN;
            CHECK(kp_dequantize_row(t, raw, got, N));
            ref_decode(t, raw, N, want);
            int bad = 0;
            for (int i = 0; i < N; i++) {
                if (!(fabs(got[i] - want[i]) <= 2e-6 * fabs(want[i]) + 1e-9) && bad++ < 3)
                    fprintf(stderr, "%s[%d]: got %.9g want %.9g\n", kp_dtype_name(t), i, got[i], want[i]);
            }
            CHECK_MSG(bad == 0, "%s: %d elements differ from the float64 decoder", kp_dtype_name(t), bad);
        }
        CHECK(!kp_dequantize_row(t, raw, got, block_elems(t) + 1)); /* not whole blocks */
    }
}

/* Blocks built by hand, with the expected values worked out from the layouts. */
static void test_dequantize_hand_blocks(void) {
    float y[256];

    /* Q4_1: d = 0.5, m = -2, byte j = j | (15 - j) << 4: x[j] = j/2 - 2, x[16+j] = (15-j)/2 - 2 */
    uint8_t q41[20];
    put_half(q41, 0.5f);
    put_half(q41 + 2, -2.0f);
    for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK(kp_dequantize_row(KP_DTYPE_Q4_1, q41, y, 32));
    CHECK_NEAR(y[0], -2.0, 0);
    CHECK_NEAR(y[15], 5.5, 0);
    CHECK_NEAR(y[16], 5.5, 0);
    CHECK_NEAR(y[31], -2.0, 0);

    /* Q5_0: d = 0.25; qh = 0x80000001 (bit 0: element 0, bit 31: element 31);
     * qs[0] = 0x3F (element 0 low 15, element 16 low 3), qs[15] = 0xA0 (element 15
     * low 0, element 31 low 10). x[0] = (31-16)/4, x[16] = (3-16)/4, x[15] = -4,
     * x[31] = (26-16)/4. */
    uint8_t q50[22] = {0};
    put_half(q50, 0.25f);
    q50[2] = 0x01;
    q50[5] = 0x80;
    q50[6 + 0] = 0x3F;
    q50[6 + 15] = 0xA0;
    CHECK(kp_dequantize_row(KP_DTYPE_Q5_0, q50, y, 32));
    CHECK_NEAR(y[0], 3.75, 0);
    CHECK_NEAR(y[16], -3.25, 0);
    CHECK_NEAR(y[15], -4.0, 0);
    CHECK_NEAR(y[31], 2.5, 0);
    CHECK_NEAR(y[1], -4.0, 0);

    /* Q5_1: d = 1, m = 0.5; qh byte 2 = 0x04 -> bit 18 -> element 18 gets +16;
     * qs[2] = 0x71 (element 2 low 1, element 18 low 7): x[2] = 1.5, x[18] = 23.5 */
    uint8_t q51[24] = {0};
    put_half(q51, 1.0f);
    put_half(q51 + 2, 0.5f);
    q51[4 + 2] = 0x04;
    q51[8 + 2] = 0x71;
    CHECK(kp_dequantize_row(KP_DTYPE_Q5_1, q51, y, 32));
    CHECK_NEAR(y[2], 1.5, 0);
    CHECK_NEAR(y[18], 23.5, 0);
    CHECK_NEAR(y[3], 0.5, 0);

    /* Q8_1: d = 0.5, s is not part of the values: x = d*q */
    uint8_t q81[36] = {0};
    put_half(q81, 0.5f);
    put_half(q81 + 2, 1000.0f);
    q81[4] = (uint8_t)-128;
    q81[35] = 127;
    CHECK(kp_dequantize_row(KP_DTYPE_Q8_1, q81, y, 32));
    CHECK_NEAR(y[0], -64.0, 0);
    CHECK_NEAR(y[31], 63.5, 0);
    CHECK_NEAR(y[1], 0.0, 0);

    /* Q5_K: d = 1, dmin = 0.5; sub-block 1: scales[1] = 3 | 1 << 6 (sc 3, and sc[5]
     * += 16), scales[5] = 2 | 2 << 6 (m 2, and m[5] += 32); scales[9] = 0x21 (sc[5] low
     * 1, m[5] low 2): sub-block 5 has sc 17, m 34. Element 32 (chunk 0, upper half,
     * l = 0): qs[0] high nibble 7, qh[0] bit 1 set -> q = 23. Element 160 (chunk 2,
     * upper, l = 0): qs[64] high nibble 9, qh[0] bit 5 clear -> q = 9. Element 128
     * (chunk 2, lower): qs[64] low nibble 5, qh[0] bit 4 set -> q = 21, sub-block 4
     * has sc 0, m 0. Element 255 (chunk 3, upper, l = 31): qs[127] high 15, qh[31]
     * bit 7 -> q = 31 in sub-block 7 (sc 0, m 0). */
    uint8_t q5k[176] = {0};
    put_half(q5k, 1.0f);
    put_half(q5k + 2, 0.5f);
    q5k[4 + 1] = 3 | 1 << 6;
    q5k[4 + 5] = 2 | 2 << 6;
    q5k[4 + 9] = 0x21;
    q5k[16 + 0] = 0x02 | 0x10;
    q5k[16 + 31] = 0x80;
    q5k[48 + 0] = 0x70;
    q5k[48 + 64] = 0x95;
    q5k[48 + 127] = 0xF0;
    CHECK(kp_dequantize_row(KP_DTYPE_Q5_K, q5k, y, 256));
    CHECK_NEAR(y[32], 3 * 23 - 0.5 * 2, 0);   /* 68 */
    CHECK_NEAR(y[33], -0.5 * 2, 0);           /* q 0 */
    CHECK_NEAR(y[160], 17 * 9 - 0.5 * 34, 0); /* 136 */
    CHECK_NEAR(y[128], 0, 0);
    CHECK_NEAR(y[255], 0, 0);
    q5k[4 + 3] = 2;  /* sc[3] = 2: element 255 is in sub-block 7, unchanged */
    q5k[4 + 11] = 1; /* sc[7] low 1, m[7] 0 */
    CHECK(kp_dequantize_row(KP_DTYPE_Q5_K, q5k, y, 256));
    CHECK_NEAR(y[255], 31, 0);
}

/* ------------------------------------------------------------------------ */
/* quantization error                                                        */
/* ------------------------------------------------------------------------ */

static double rel_rms_err(const float *x, const float *y, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += (double)x[i] * x[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

/* Q4_1/Q5_1 (nmax 15/31): x = min + q*d with d = (max-min)/nmax rounds to
 * the nearest grid point, so |err| <= d/2, plus what storing d and min as
 * halves moves (nmax*|d - d16| + |min - m16|). */
static int check_affine_bound(kp_dtype t, int nmax, const float *x, const uint8_t *q, const float *y,
                              int n) {
    int bad = 0;
    for (int b = 0; b < n / 32; b++) {
        double mn = INFINITY, mx = -INFINITY;
        for (int j = 0; j < 32; j++) {
            mn = fmin(mn, x[32 * b + j]);
            mx = fmax(mx, x[32 * b + j]);
        }
        const uint8_t *blk = q + block_bytes(t) * b;
        const double d = (mx - mn) / nmax, d16 = le_half(blk), m16 = le_half(blk + 2);
        const double bound = d / 2 * (1 + 1e-5) + nmax * fabs(d - d16) + fabs(mn - m16) + 1e-30;
        for (int j = 0; j < 32; j++) bad += !(fabs((double)x[32 * b + j] - y[32 * b + j]) <= bound);
    }
    return bad;
}

static void test_quant_error_bounds(void) {
    enum { N = 256 * 8 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    for (int rep = 0; rep < 6; rep++) {
        const float scale = (float)ldexp(1.0, (int)(rng_u64() % 20) - 10);
        gauss_row(x, N, scale);
        if (rep == 3) x[17] *= 40; /* an outlier */
        if (rep == 4)
            for (int i = 0; i < N; i++) x[i] = fabsf(x[i]); /* all positive: min > 0 */

        CHECK(kp_quantize_row(KP_DTYPE_Q4_1, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q4_1, q, y, N));
        int bad = check_affine_bound(KP_DTYPE_Q4_1, 15, x, q, y, N);
        CHECK_MSG(bad == 0, "Q4_1: %d elements beyond d/2", bad);

        CHECK(kp_quantize_row(KP_DTYPE_Q5_1, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q5_1, q, y, N));
        bad = check_affine_bound(KP_DTYPE_Q5_1, 31, x, q, y, N);
        CHECK_MSG(bad == 0, "Q5_1: %d elements beyond d/2", bad);

        /* Q5_0: d = max/-16 (max = signed value of the largest |x|); |err| <= |d|/2,
         * except at the clamped end q = 31 (x/d > 15.5), one step short */
        CHECK(kp_quantize_row(KP_DTYPE_Q5_0, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q5_0, q, y, N));
        bad = 0;
        for (int b = 0; b < N / 32; b++) {
            double amax = 0, max = 0;
            for (int j = 0; j < 32; j++)
                if (fabs(x[32 * b + j]) > amax) {
                    amax = fabs(x[32 * b + j]);
                    max = x[32 * b + j];
                }
            const double d = max / -16, d16 = le_half(q + 22 * b);
            for (int j = 0; j < 32; j++) {
                const double v = x[32 * b + j], t = d ? v / d : 0;
                const double step = t > 15.5 ? fabs(d) * (t - 15) : fabs(d) / 2;
                bad += !(fabs(v - y[32 * b + j]) <= step * (1 + 1e-5) + 16 * fabs(d - d16));
            }
        }
        CHECK_MSG(bad == 0, "Q5_0: %d elements beyond the step bound", bad);

        /* Q8_1: |err| <= d/2 (d = amax/127), and s = d*sum(q) rounded to a half */
        CHECK(kp_quantize_row(KP_DTYPE_Q8_1, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q8_1, q, y, N));
        bad = 0;
        int bad_s = 0;
        for (int b = 0; b < N / 32; b++) {
            const uint8_t *blk = q + 36 * b;
            double amax = 0;
            long sum = 0;
            for (int j = 0; j < 32; j++) {
                amax = fmax(amax, fabs(x[32 * b + j]));
                sum += (int8_t)blk[4 + j];
            }
            const double d = amax / 127, d16 = le_half(blk);
            for (int j = 0; j < 32; j++)
                bad += !(fabs((double)x[32 * b + j] - y[32 * b + j]) <= d / 2 * (1 + 1e-5) + 127 * fabs(d - d16));
            /* s is d*sum rounded to a half, d being the float scale before its own rounding
             * to half: within half an FP16 ulp (plus the float product's rounding) */
            const double s = (double)(float)d * (double)sum;
            if (fabs(s) >= 65520) /* past FP16's largest finite value: rounds to infinity, as ggml's does */
                bad_s += !(isinf(le_half(blk + 2)) && (le_half(blk + 2) > 0) == (s > 0));
            else
                bad_s += !(fabs(le_half(blk + 2) - s) <= fmax(ldexp(fabs(s), -11), 0x1p-25) * (1 + 1e-5));
        }
        CHECK_MSG(bad == 0, "Q8_1: %d elements beyond d/2", bad);
        CHECK_MSG(bad_s == 0, "Q8_1: %d block sums wrong", bad_s);
    }
}

/* Relative RMS errors on N(0, 1) rows: each type's expected value from its
 * step (uniform rounding error: step/sqrt(12), step = range/levels, the
 * range of 32 Gaussian values ~4.1 sd, their absmax ~2.05 sd), windows of
 * a factor ~2 around it; and Q5_K's search must beat a naive grid. */
static double naive_q5k_err(const float *x, int64_t n) {
    double e = 0, s = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        double mn = 0, mx = -INFINITY; /* as Q5_K: the grid includes 0 */
        for (int j = 0; j < 32; j++) {
            mn = fmin(mn, x[32 * b + j]);
            mx = fmax(mx, x[32 * b + j]);
        }
        const double d = (mx - mn) / 31;
        for (int j = 0; j < 32; j++) {
            const double v = x[32 * b + j];
            const double r = d > 0 ? mn + d * fmin(31, fmax(0, round((v - mn) / d))) : v;
            e += (v - r) * (v - r);
            s += v * v;
        }
    }
    return sqrt(e / s);
}

/* The same per sub-block min/max grids, stored as Q5_K stores them (6-bit
 * scales and mins relative to the largest, float64 super-block scales), and
 * the values requantized to them: Q5_K without its search. */
static double naive_q5k_format_err(const float *x, int64_t n) {
    double e = 0, s = 0;
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const float *xs = x + 256 * sb;
        double sc[8], mn[8], max_sc = 0, max_mn = 0;
        for (int j = 0; j < 8; j++) {
            double lo = 0, hi = -INFINITY;
            for (int k = 0; k < 32; k++) {
                lo = fmin(lo, xs[32 * j + k]);
                hi = fmax(hi, xs[32 * j + k]);
            }
            sc[j] = (hi - lo) / 31;
            mn[j] = -lo;
            max_sc = fmax(max_sc, sc[j]);
            max_mn = fmax(max_mn, mn[j]);
        }
        const double d = max_sc / 63, dmin = max_mn / 63;
        for (int j = 0; j < 8; j++) {
            const double step = d > 0 ? d * fmin(63, round(sc[j] / d)) : 0;
            const double off = dmin > 0 ? dmin * fmin(63, round(mn[j] / dmin)) : 0;
            for (int k = 0; k < 32; k++) {
                const double v = xs[32 * j + k];
                const double r = step > 0 ? step * fmin(31, fmax(0, round((v + off) / step))) - off : -off;
                e += (v - r) * (v - r);
                s += v * v;
            }
        }
    }
    return sqrt(e / s);
}

static void test_quant_quality(void) {
    enum { N = 256 * 64 };
    static float x[N], y[N];
    static uint8_t q[N];
    gauss_row(x, N, 0.02f);
    static const struct { kp_dtype t; double lo, hi; } win[] = {
        /* Q4_1 step 4.1/15 sd -> 0.079; Q5_1 4.1/31 -> 0.038; Q5_0 2.05/16 -> 0.037;
         * Q5_K fitted sub-block grids, about half of Q4_K's 0.07 */
        {KP_DTYPE_Q4_1, 0.04, 0.16}, {KP_DTYPE_Q5_1, 0.019, 0.076},
        {KP_DTYPE_Q5_0, 0.018, 0.074}, {KP_DTYPE_Q5_K, 0.015, 0.06},
    };
    double err[4];
    for (int k = 0; k < 4; k++) {
        CHECK(kp_quantize_row(win[k].t, x, q, N));
        CHECK(kp_dequantize_row(win[k].t, q, y, N));
        err[k] = rel_rms_err(x, y, N);
        CHECK_MSG(err[k] > win[k].lo && err[k] < win[k].hi, "%s rel RMS %.4f not in [%g, %g]",
                  kp_dtype_name(win[k].t), err[k], win[k].lo, win[k].hi);
    }
    const double n5 = naive_q5k_err(x, N), n5f = naive_q5k_format_err(x, N);
    printf("quant_more: Gaussian rows, relative RMS error: Q4_1 %.4f, Q5_1 %.4f, Q5_0 %.4f, Q5_K %.4f "
           "(naive min/max grids: %.4f with exact scales, %.4f stored as Q5_K)\n", err[0], err[1], err[2],
           err[3], n5, n5f);
    /* the search beats the naive grids although it pays for 6-bit scales: over
     * seeds, Q5_K/naive is 0.947-0.960 with exact scales and 0.935-0.955 in
     * Q5_K's format, which is what Q5_K without the search would give */
    CHECK_MSG(err[3] < 0.985 * n5, "Q5_K %.4f vs naive %.4f", err[3], n5);
    CHECK_MSG(err[3] < 0.975 * n5f, "Q5_K %.4f vs naive in Q5_K's format %.4f", err[3], n5f);

    /* degenerate rows: zeros, a constant, tiny values, one spike */
    static const float cases[] = {0.0f, 1.0f, -3.0f, 1e-30f};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < 512; i++) x[i] = cases[c];
        x[300] = cases[c] * 7 + 1e-3f;
        const kp_dtype kt[] = {KP_DTYPE_Q4_1, KP_DTYPE_Q5_0, KP_DTYPE_Q5_1, KP_DTYPE_Q5_K, KP_DTYPE_Q8_1};
        for (size_t k = 0; k < sizeof kt / sizeof kt[0]; k++) {
            CHECK(kp_quantize_row(kt[k], x, q, 512));
            CHECK(kp_dequantize_row(kt[k], q, y, 512));
            int finite = 1;
            double maxerr = 0, amax = 0;
            for (int i = 0; i < 512; i++) {
                finite &= isfinite(y[i]) != 0;
                maxerr = fmax(maxerr, fabs((double)y[i] - x[i]));
                amax = fmax(amax, fabs(x[i]));
            }
            CHECK_MSG(finite && maxerr <= 0.1 * amax + 1e-6, "%s on constant %g: max err %g",
                      kp_dtype_name(kt[k]), (double)cases[c], maxerr);
        }
    }
}

/* NaN and inf in one block: no crash or sanitizer report, and every other
 * block's bytes are unchanged (blocks are encoded independently). */
static void test_nonfinite_inputs(void) {
    enum { N = 512 };
    static float x[N], bad[N];
    static uint8_t q0[N * 2], q1[N * 2];
    gauss_row(x, N, 1.0f);
    memcpy(bad, x, sizeof bad);
    bad[3] = NAN;
    bad[5] = INFINITY;
    bad[7] = -INFINITY;
    const kp_dtype types[] = {KP_DTYPE_Q4_1, KP_DTYPE_Q5_0, KP_DTYPE_Q5_1, KP_DTYPE_Q5_K, KP_DTYPE_Q8_1};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const kp_dtype t = types[k];
        const size_t first = block_bytes(t), bytes = kp_dtype_row_size(t, N);
        CHECK(kp_quantize_row(t, x, q0, N));
        CHECK(kp_quantize_row(t, bad, q1, N));
        CHECK_MSG(memcmp(q0 + first, q1 + first, bytes - first) == 0, "%s: NaN leaked past its block",
                  kp_dtype_name(t));
    }
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
    for (int k = 0; k < 2; k++) {
        if (!tabs[k]) continue;
        for (int ti = 0; ti < N_NEW; ti++) {
            const kp_dtype wt = new_types[ti], at = kp_vec_dot_type(wt);
            const size_t first = block_bytes(at);
            tabs[k]->quantize_act[wt](x, q0, N);
            tabs[k]->quantize_act[wt](bad, q1, N);
            CHECK_MSG(memcmp(q0 + first, q1 + first, kp_dtype_row_size(at, N) - first) == 0,
                      "%s quantize_act[%s]: NaN leaked", tabs[k]->name, kp_dtype_name(wt));
        }
    }
}

/* ------------------------------------------------------------------------ */
/* kernels                                                                   */
/* ------------------------------------------------------------------------ */

static void test_vec_dot_and_tiles(void) {
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
    enum { MAXN = 256 * 15, MAXR = 7, MAXC = 9 };
    static float wf[MAXR][MAXN], af[MAXC][MAXN];
    static uint8_t wq[MAXR * MAXN], aq[2][MAXC * MAXN * 2];
    static const int blocks[] = {1, 3, 5, 7, 15};
    int n_tile_checks = 0;
    for (int ti = 0; ti < N_NEW; ti++) {
        const kp_dtype wt = new_types[ti], at = kp_vec_dot_type(wt);
        for (int li = 0; li < 5; li++) {
            const int64_t n = (int64_t)block_elems(wt) * blocks[li] * (block_elems(wt) == 32 ? 3 : 1);
            const size_t w_stride = kp_dtype_row_size(wt, n) + 6; /* odd strides, 2-byte aligned */
            const size_t ars = kp_dtype_row_size(at, n), a_stride = ars + (at == KP_DTYPE_Q8_K ? 4 : 2);
            for (int r = 0; r < MAXR; r++) {
                gauss_row(wf[r], n, 0.05f);
                if (r == 2)
                    for (int64_t i = 0; i < n; i++) wf[r][i] = fabsf(wf[r][i]) + 0.02f; /* large "+ m" */
                CHECK(kp_quantize_row(wt, wf[r], wq + r * w_stride, n));
            }
            for (int c = 0; c < MAXC; c++) {
                gauss_row(af[c], n, 1.0f);
                if (c == 1)
                    for (int64_t i = 0; i < n; i++) af[c][i] += 0.7f; /* nonzero block sums */
            }
            /* activations through each table's quantize_act: identical bytes */
            for (int k = 0; k < 2; k++) {
                if (!tabs[k]) continue;
                for (int c = 0; c < MAXC; c++) tabs[k]->quantize_act[wt](af[c], aq[k] + c * a_stride, n);
            }
            if (tabs[1]) {
                int same = 1;
                for (int c = 0; c < MAXC; c++) same &= memcmp(aq[0] + c * a_stride, aq[1] + c * a_stride, ars) == 0;
                CHECK_MSG(same, "%s n=%lld: quantize_act differs between tables", kp_dtype_name(wt), (long long)n);
            }
            double want[MAXR][MAXC], mag[MAXR][MAXC];
            for (int r = 0; r < MAXR; r++)
                for (int c = 0; c < MAXC; c++)
                    want[r][c] = ref_dot(wt, wq + r * w_stride, aq[0] + c * a_stride, n, &mag[r][c]);

            const double rel = 1e-5 + 4e-7 * sqrt((double)n);
            for (int k = 0; k < 2; k++) {
                const kp_kernels *K = tabs[k];
                if (!K) continue;
                for (int r = 0; r < 3; r++) {
                    float s = NAN;
                    K->vec_dot[wt](n, &s, wq + r * w_stride, aq[k] + r * a_stride);
                    CHECK_MSG(fabs(s - want[r][r]) <= rel * mag[r][r], "%s %s vec_dot n=%lld: %.9g vs %.9g",
                              K->name, kp_dtype_name(wt), (long long)n, s, want[r][r]);
                }
                /* every nr, nc in 1..4, and one larger tile (dot_tile takes any size) */
                for (int shape = 0; shape < 17; shape++) {
                    const int nr = shape < 16 ? 1 + shape / 4 : MAXR, nc = shape < 16 ? 1 + shape % 4 : MAXC;
                    enum { OS = MAXR + 2 };
                    float out[MAXC * OS];
                    for (int i = 0; i < MAXC * OS; i++) out[i] = -12345.0f;
                    K->dot_tile[wt](n, nr, nc, wq, w_stride, aq[k], a_stride, out, OS);
                    int bad = 0, clobbered = 0;
                    for (int c = 0; c < MAXC; c++)
                        for (int r = 0; r < OS; r++) {
                            const float v = out[c * OS + r];
                            if (c < nc && r < nr) bad += !(fabs(v - want[r][c]) <= rel * mag[r][c]);
                            else clobbered += v != -12345.0f;
                        }
                    n_tile_checks++;
                    CHECK_MSG(bad == 0 && clobbered == 0, "%s %s dot_tile %dx%d n=%lld: %d wrong, %d clobbered",
                              K->name, kp_dtype_name(wt), nr, nc, (long long)n, bad, clobbered);
                }
            }
            /* the two tables agree with each other */
            if (tabs[1]) {
                for (int r = 0; r < MAXR; r++) {
                    float s0, s1;
                    tabs[0]->vec_dot[wt](n, &s0, wq + r * w_stride, aq[0] + 1 * a_stride);
                    tabs[1]->vec_dot[wt](n, &s1, wq + r * w_stride, aq[1] + 1 * a_stride);
                    CHECK_MSG(fabs(s0 - s1) <= 2e-5 * mag[r][1] + 1e-30, "%s n=%lld: scalar %.9g vs avx2 %.9g",
                              kp_dtype_name(wt), (long long)n, s0, s1);
                }
            }
        }
    }
    printf("quant_more: %d dot_tile shapes checked against float64 dots (%s)\n", n_tile_checks,
           tabs[1] ? "scalar and avx2" : "scalar only: no AVX2 on this CPU");
    CHECK(n_tile_checks > 0);
}

/*
 * gemm of the SIMD tables, as the forward pass calls it (quant.h's
 * contract): for every shape of call each output must be, bit for bit,
 * what a 1 x 1 call computes for it, and what dot_tile computes; the
 * avx512vnni table must compute what the avx2 table computes; with and
 * without kp_q8_0_aux rows (Q5_0) the same; gemm_packed on the table's
 * repacked layout, where it has one, the same; and every output must agree
 * with the float64 dot of the decoded rows, and with the scalar table's
 * vec_dot, within float rounding. Outputs outside the nr x nc block stay
 * untouched.
 *
 * Lengths: a short one with every nr in 1..19 and nc in 1..21 (across the
 * kernels' groups of 4 and 8 rows, 2-panel chunks of 16 rows, the switch
 * to repacked panels at 8 activation rows and the staging of 16), and
 * 4352 elements (across the K chunks of 2048 and 1536 elements) with a
 * list of shapes at various offsets. Besides Gaussian rows the inputs hold
 * rows at the integer extremes: weights with every quant at its largest
 * or smallest value, activations with every quant at -128 or 127, where
 * int16 intermediate sums come closest to overflowing.
 */

/* Weight row r of type wt: rows 0 and 1 have every quant at its largest
 * and its smallest value (Q5_K: every scale and min 63), row 2 positive
 * values (a large "+ m"); the others quantized Gaussian values. */
static void gemm_weight_row(kp_dtype wt, int r, uint8_t *dst, int64_t n, float *xf) {
    if (r >= 2) {
        gauss_row(xf, n, 0.05f);
        if (r == 2)
            for (int64_t i = 0; i < n; i++) xf[i] = fabsf(xf[i]) + 0.02f;
        CHECK(kp_quantize_row(wt, xf, dst, n));
        return;
    }
    for (int64_t ib = 0; ib < n / block_elems(wt); ib++) {
        uint8_t *p = dst + ib * block_bytes(wt);
        memset(p, r == 0 ? 0xFF : 0x00, block_bytes(wt));
        if (wt == KP_DTYPE_Q5_K) memset(p + 4, 0xFF, 12);
        put_half(p, rng_gauss() * 0.01f);
        if (wt != KP_DTYPE_Q5_0) put_half(p + 2, rng_gauss() * 0.01f); /* m or dmin */
    }
}

/* Activation row c for weight type wt: rows 0 and 1 have every quant at
 * -128 and at 127, row 2 each quant at either, at random (with consistent
 * block sums: Q8_1's s, Q8_K's bsums); row 3 Gaussian values plus an
 * offset (large block sums); the others Gaussian values, all through the
 * scalar table's quantize_act. */
static void gemm_act_row(kp_dtype wt, int c, uint8_t *dst, int64_t n, float *xf) {
    const kp_dtype at = kp_vec_dot_type(wt);
    if (c >= 3) {
        gauss_row(xf, n, 1.0f);
        if (c == 3)
            for (int64_t i = 0; i < n; i++) xf[i] += 0.7f;
        kp_kernels_scalar()->quantize_act[wt](xf, dst, n);
        return;
    }
    const int be = block_elems(at);
    for (int64_t ib = 0; ib < n / be; ib++) {
        uint8_t *p = dst + ib * block_bytes(at);
        int8_t q[256];
        int sum = 0;
        for (int e = 0; e < be; e++) {
            q[e] = (int8_t)(c == 0 ? -128 : c == 1 ? 127 : (rng_u64() >> 20 & 1) ? 127 : -128);
            sum += q[e];
        }
        const float d = kp_fp16_to_fp32(kp_fp32_to_fp16(0.01f + 0.01f * (float)rng_unit()));
        if (at == KP_DTYPE_Q8_K) { /* [float d][int8 x256][int16 bsums x16], little-endian */
            memcpy(p, &d, 4);
            memcpy(p + 4, q, 256);
            for (int j = 0; j < 16; j++) {
                int bs = 0;
                for (int e = 0; e < 16; e++) bs += q[16 * j + e];
                p[260 + 2 * j] = (uint8_t)(bs & 0xFF);
                p[261 + 2 * j] = (uint8_t)((bs >> 8) & 0xFF);
            }
        } else if (at == KP_DTYPE_Q8_1) { /* [half d][half s][int8 x32] */
            put_half(p, d);
            put_half(p + 2, d * (float)sum);
            memcpy(p + 4, q, 32);
        } else { /* Q8_0: [half d][int8 x32] */
            put_half(p, d);
            memcpy(p + 2, q, 32);
        }
    }
}

static void test_gemm(void) {
    enum { R = 19, C = 21, OS = 23, NBIG = 4352 };
    static const int shapes[][4] = {/* nr, nc, first row, first column */
                                    {1, 1, 0, 0},  {1, 21, 0, 0}, {4, 4, 0, 0},   {5, 1, 3, 7},   {3, 7, 2, 3},
                                    {16, 8, 0, 0}, {17, 9, 1, 2}, {19, 21, 0, 0}, {8, 16, 11, 5}, {7, 8, 0, 13},
                                    {19, 17, 0, 4}, {2, 20, 17, 1}, {9, 13, 10, 8}};
    const kp_kernels *tabs[2] = {kp_kernels_avx2(), kp_kernels_avx512vnni()};
    if (!tabs[0]) {
        SKIP("gemm of the avx2 table (this CPU lacks AVX2)");
        return;
    }
    static float xf[NBIG], single[2][R * C], plain[R * C], out[C * OS];
    static kp_q8_0_aux aux[C][NBIG / 32];
    static double want[R * C], mag[R * C];
    int n_shapes = 0, n_packed = 0;
    for (int ti = 0; ti < N_NEW; ti++) {
        const kp_dtype wt = new_types[ti], at = kp_vec_dot_type(wt);
        for (int li = 0; li < 2; li++) {
            const int64_t n = li == 0 ? (block_elems(wt) == 32 ? 96 : 256) : NBIG;
            /* row strides padded, kept a multiple of the blocks' alignment */
            const size_t wrs = kp_dtype_row_size(wt, n) + 6, ars = kp_dtype_row_size(at, n) + 4;
            uint8_t *w = malloc(R * wrs), *a = malloc(C * ars);
            CHECK(w && a);
            if (!w || !a) {
                free(w);
                free(a);
                return;
            }
            for (int r = 0; r < R; r++) gemm_weight_row(wt, r, w + r * wrs, n, xf);
            for (int c = 0; c < C; c++) {
                gemm_act_row(wt, c, a + c * ars, n, xf);
                if (at == KP_DTYPE_Q8_0) kp_q8_0_aux_row(a + c * ars, aux[c], n);
            }
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) want[r * C + c] = ref_dot(wt, w + r * wrs, a + c * ars, n, &mag[r * C + c]);
            const double rel = 1e-5 + 4e-7 * sqrt((double)n);

            for (int k = 0; k < 2; k++) {
                const kp_kernels *K = tabs[k];
                if (!K) continue;
                CHECK_MSG(K->gemm[wt] != NULL, "%s has no gemm for %s", K->name, kp_dtype_name(wt));
                if (!K->gemm[wt]) continue;
                for (int with_aux = 0; with_aux <= (at == KP_DTYPE_Q8_0); with_aux++) {
                    const void *ax = with_aux ? (const void *)aux : NULL;
                    const size_t axs = with_aux ? sizeof aux[0] : 0;
                    /* each output alone */
                    float *one = with_aux ? plain : single[k];
                    int bad = 0;
                    for (int r = 0; r < R; r++)
                        for (int c = 0; c < C; c++) {
                            const int ix = r * C + c;
                            K->gemm[wt](n, 1, 1, w + r * wrs, wrs, a + c * ars, ars,
                                        ax ? (const char *)ax + c * axs : NULL, axs, &one[ix], 1);
                            bad += !(fabs(one[ix] - want[ix]) <= rel * mag[ix]);
                        }
                    CHECK_MSG(bad == 0, "%s %s n=%lld gemm 1 x 1%s: %d of %d wrong", K->name, kp_dtype_name(wt),
                              (long long)n, with_aux ? " with aux" : "", bad, R * C);
                    if (with_aux)
                        CHECK_MSG(memcmp(plain, single[k], sizeof plain) == 0, "%s %s n=%lld: gemm with aux differs",
                                  K->name, kp_dtype_name(wt), (long long)n);
                    /* every shape of call reproduces them */
                    const int n_sweep = li == 0 ? R * C : (int)(sizeof shapes / sizeof shapes[0]);
                    for (int si = 0; si < n_sweep; si++) {
                        int nr, nc, r0, c0;
                        if (li == 0) { /* every nr, nc, at offsets that vary with them */
                            nr = 1 + si / C;
                            nc = 1 + si % C;
                            r0 = (7 * nr) % (R - nr + 1);
                            c0 = (5 * nc) % (C - nc + 1);
                        } else {
                            nr = shapes[si][0];
                            nc = shapes[si][1];
                            r0 = shapes[si][2];
                            c0 = shapes[si][3];
                        }
                        for (int i = 0; i < C * OS; i++) out[i] = -12345.0f;
                        K->gemm[wt](n, nr, nc, w + r0 * wrs, wrs, a + c0 * ars, ars,
                                    ax ? (const char *)ax + c0 * axs : NULL, axs, out, OS);
                        int not_same = 0, clobbered = 0;
                        for (int c = 0; c < C; c++)
                            for (int r = 0; r < OS; r++) {
                                const float v = out[c * OS + r];
                                if (c < nc && r < nr) not_same += memcmp(&v, &single[k][(r0 + r) * C + c0 + c], sizeof v) != 0;
                                else clobbered += v != -12345.0f;
                            }
                        n_shapes++;
                        CHECK_MSG(not_same == 0 && clobbered == 0,
                                  "%s %s n=%lld gemm %dx%d at (%d,%d)%s: %d outputs differ from 1 x 1 calls, %d clobbered",
                                  K->name, kp_dtype_name(wt), (long long)n, nr, nc, r0, c0, with_aux ? " with aux" : "",
                                  not_same, clobbered);
                        /* the table's repacked layout, if it has one: the same bits */
                        if (K->pack_rows[wt] <= 0 || K->pack_k[wt] <= 0 || n % K->pack_k[wt] != 0) continue;
                        const size_t pb = kp_pack_bytes(wt, n, nr, K->pack_rows[wt]);
                        uint8_t *pk = malloc(pb);
                        CHECK(pk != NULL);
                        if (!pk) continue;
                        memset(pk, 0xA5, pb);
                        K->pack[wt](n, nr, w + r0 * wrs, wrs, pk);
                        for (int i = 0; i < C * OS; i++) out[i] = -12345.0f;
                        K->gemm_packed[wt](n, nr, nc, pk, a + c0 * ars, ars, ax ? (const char *)ax + c0 * axs : NULL,
                                           axs, out, OS);
                        free(pk);
                        not_same = clobbered = 0;
                        for (int c = 0; c < C; c++)
                            for (int r = 0; r < OS; r++) {
                                const float v = out[c * OS + r];
                                if (c < nc && r < nr) not_same += memcmp(&v, &single[k][(r0 + r) * C + c0 + c], sizeof v) != 0;
                                else clobbered += v != -12345.0f;
                            }
                        n_packed++;
                        CHECK_MSG(not_same == 0 && clobbered == 0,
                                  "%s %s n=%lld packed gemm %dx%d at (%d,%d)%s: %d outputs differ from gemm, %d clobbered",
                                  K->name, kp_dtype_name(wt), (long long)n, nr, nc, r0, c0, with_aux ? " with aux" : "",
                                  not_same, clobbered);
                    }
                }
                /* dot_tile (shared by both tables): every 1..4 x 1..4 and one call over everything */
                for (int si = 0; si < 17; si++) {
                    const int nr = si < 16 ? 1 + si / 4 : R, nc = si < 16 ? 1 + si % 4 : C;
                    const int r0 = si < 16 ? (3 * si) % (R - nr + 1) : 0, c0 = si < 16 ? (5 * si) % (C - nc + 1) : 0;
                    for (int i = 0; i < C * OS; i++) out[i] = -12345.0f;
                    K->dot_tile[wt](n, nr, nc, w + r0 * wrs, wrs, a + c0 * ars, ars, out, OS);
                    int not_same = 0, clobbered = 0;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < OS; r++) {
                            const float v = out[c * OS + r];
                            if (c < nc && r < nr) not_same += memcmp(&v, &single[k][(r0 + r) * C + c0 + c], sizeof v) != 0;
                            else clobbered += v != -12345.0f;
                        }
                    CHECK_MSG(not_same == 0 && clobbered == 0,
                              "%s %s n=%lld dot_tile %dx%d at (%d,%d): %d outputs differ from gemm, %d clobbered",
                              K->name, kp_dtype_name(wt), (long long)n, nr, nc, r0, c0, not_same, clobbered);
                }
            }
            if (tabs[1] && tabs[1]->gemm[wt])
                CHECK_MSG(memcmp(single[0], single[1], sizeof single[0]) == 0, "%s n=%lld: avx2 and %s gemm differ",
                          kp_dtype_name(wt), (long long)n, tabs[1]->name);
            /* and the scalar table, within float rounding */
            int bad = 0;
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) {
                    float s0;
                    kp_kernels_scalar()->vec_dot[wt](n, &s0, w + r * wrs, a + c * ars);
                    bad += !(fabs(s0 - single[0][r * C + c]) <= 2 * rel * mag[r * C + c]);
                }
            CHECK_MSG(bad == 0, "%s n=%lld: %d gemm outputs differ from the scalar vec_dot", kp_dtype_name(wt),
                      (long long)n, bad);
            free(w);
            free(a);
        }
    }
    printf("quant_more: %d gemm calls checked bit for bit against 1 x 1 calls (%s), %d on repacked weights\n",
           n_shapes, tabs[1] ? "avx2 and avx512vnni" : "avx2", n_packed);
    CHECK(n_shapes > 0);
    /* the avx512vnni table repacks Q5_K: every shape of both lengths */
    if (tabs[1]) CHECK_EQ_INT(n_packed, R * C + (int)(sizeof shapes / sizeof shapes[0]));
}

static void test_api(void) {
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q5_0), KP_DTYPE_Q8_0);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q4_1), KP_DTYPE_Q8_1);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q5_1), KP_DTYPE_Q8_1);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q5_K), KP_DTYPE_Q8_K);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q8_1), KP_DTYPE_COUNT_); /* no weight type */
    for (int ti = 0; ti < N_NEW; ti++) CHECK(kp_dtype_get(new_types[ti])->has_kernels);
    CHECK(!kp_dtype_get(KP_DTYPE_Q8_1)->has_kernels);
    const kp_kernels *tabs[3] = {kp_kernels_scalar(), kp_kernels_avx2(), kp_kernels_avx512vnni()};
    for (int k = 0; k < 3; k++) {
        if (!tabs[k]) continue;
        for (int ti = 0; ti < N_NEW; ti++) {
            const kp_dtype t = new_types[ti];
            CHECK_MSG(tabs[k]->quantize_act[t] && tabs[k]->vec_dot[t] && tabs[k]->dot_tile[t], "%s: %s entries",
                      tabs[k]->name, kp_dtype_name(t));
            /* whole-block kernels in the SIMD tables (the scalar one covers them with dot_tile) */
            if (k > 0) CHECK_MSG(tabs[k]->gemm[t] != NULL, "%s: %s gemm", tabs[k]->name, kp_dtype_name(t));
        }
        CHECK(!tabs[k]->vec_dot[KP_DTYPE_Q8_1]);
    }
    float x[64] = {0};
    uint8_t q[512];
    CHECK(!kp_quantize_row(KP_DTYPE_Q5_K, x, q, 32)); /* not a whole block */
    CHECK(!kp_quantize_row(KP_DTYPE_Q5_0, x, q, 48));
    CHECK(kp_quantize_row(KP_DTYPE_Q5_1, x, q, 0));
}

/* ------------------------------------------------------------------------ */
/* end to end: logits of models in each type                                 */
/* ------------------------------------------------------------------------ */

typedef struct {
    kp_model *m;
    kp_threads *pool;
    kp_kvpool *kv;
    kp_forward *fw;
} rig;

static bool rig_open(rig *r, const char *path, uint32_t n_pos) {
    kp_error err = {0};
    memset(r, 0, sizeof *r);
    if (kp_model_load(&r->m, path, &err) != KP_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return false;
    }
    kp_kvpool_config kc = {r->m->hp.n_layer, r->m->hp.n_head_kv, r->m->hp.head_dim, KP_DTYPE_F32, 16, 0, KP_DTYPE_F32, NULL, 0, 0};
    kc.budget_bytes = (uint64_t)((n_pos + 15) / 16 + 1) * 16 * kp_model_kv_bytes_per_token(&r->m->hp, KP_DTYPE_F32);
    if (kp_threads_new(&r->pool, 1, &err) != KP_OK || kp_kvpool_new(&r->kv, &kc, &err) != KP_OK ||
        kp_forward_new(&r->fw, r->m, r->kv, r->pool, NULL, &err) != KP_OK) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return false;
    }
    return true;
}

static void rig_close(rig *r) {
    kp_forward_free(r->fw);
    kp_kvpool_free(r->kv);
    kp_threads_free(r->pool);
    kp_model_free(r->m);
}

enum { E2E_TOKENS = 24 };

/* Logits of every position of a fixed token sequence, fed as one batch or
 * (by_token) one token per forward call; malloc'd, NULL on failure.
 * packed not NULL: the pass computes from repacked copies of the weights
 * its kernel table has a layout for (kp_forward_pack_weights), *packed =
 * their bytes. */
static float *model_logits(const char *path, int *n_vocab, bool by_token, uint64_t *packed) {
    rig r;
    kp_error perr = {0};
    if (!rig_open(&r, path, E2E_TOKENS) || (packed && kp_forward_pack_weights(r.fw, packed, &perr) != KP_OK)) {
        if (perr.msg[0]) fprintf(stderr, "pack %s: %s\n", path, perr.msg);
        rig_close(&r);
        return NULL;
    }
    *n_vocab = (int)r.m->hp.n_vocab;
    int32_t toks[E2E_TOKENS], pos[E2E_TOKENS], sq[E2E_TOKENS];
    uint8_t want[E2E_TOKENS];
    for (int i = 0; i < E2E_TOKENS; i++) {
        toks[i] = i == 0 ? 1 : (int32_t)((i * 37 + 11) % *n_vocab);
        pos[i] = i;
        sq[i] = 0;
        want[i] = 1;
    }
    kp_kvseq seq = {0};
    kp_kvseq *seqs[1] = {&seq};
    float *out = malloc((size_t)E2E_TOKENS * *n_vocab * sizeof(float));
    kp_error err = {0};
    for (int i = 0; out && i < (by_token ? E2E_TOKENS : 1); i++) {
        const int at = by_token ? i : 0;
        kp_batch b = {by_token ? 1 : E2E_TOKENS, toks + at, pos + at, sq + at, want + at, seqs, 1};
        if (kp_forward_run(r.fw, &b, out + (size_t)at * *n_vocab, &err) != KP_OK) {
            fprintf(stderr, "forward %s: %s\n", path, err.msg);
            free(out);
            out = NULL;
        }
    }
    kp_kvseq_release(&seq, r.kv);
    rig_close(&r);
    return out;
}

/* Relative RMS error of all 2-D weights of file q against the F32 file f. */
static double weights_rel_err(const char *f32_path, const char *q_path) {
    kp_gguf *f = NULL, *g = NULL;
    double e = 0, s = 0;
    if (kp_gguf_open(&f, f32_path, NULL) != KP_OK || kp_gguf_open(&g, q_path, NULL) != KP_OK) {
        kp_gguf_close(f);
        return NAN;
    }
    static float a[1 << 12], b[1 << 12];
    for (size_t i = 0; i < kp_gguf_n_tensors(f); i++) {
        const kp_gguf_tensor *tf = kp_gguf_tensor_at(f, i);
        if (tf->n_dims != 2) continue;
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)tf->name.len, tf->name.data);
        const kp_gguf_tensor *tq = kp_gguf_find_tensor(g, name);
        if (!tq || tf->ne[0] > (int64_t)(sizeof a / sizeof a[0])) return NAN;
        const size_t rs_f = kp_dtype_row_size(tf->type, tf->ne[0]), rs_q = kp_dtype_row_size(tq->type, tq->ne[0]);
        for (int64_t r = 0; r < tf->ne[1]; r++) {
            kp_dequantize_row((kp_dtype)tf->type, (const uint8_t *)tf->data + r * rs_f, a, tf->ne[0]);
            kp_dequantize_row((kp_dtype)tq->type, (const uint8_t *)tq->data + r * rs_q, b, tq->ne[0]);
            for (int64_t k = 0; k < tf->ne[0]; k++) {
                e += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
                s += (double)a[k] * a[k];
            }
        }
    }
    kp_gguf_close(f);
    kp_gguf_close(g);
    return sqrt(e / s);
}

static void tmp_path(char buf[64]) {
    snprintf(buf, 64, "/tmp/kvpin-test-quant-more-XXXXXX");
    int fd = mkstemp(buf);
    if (fd >= 0) close(fd);
}

/*
 * The "tiny" preset (llama, 2 layers, n_embd 256, n_ff 512: every type fits)
 * in F32 and in each type, same seed: the relative L2 distance of all
 * logits to the F32 model's, divided by the weights' relative RMS error,
 * is the model's error amplification. Q8_0 and Q4_0 (types checked
 * against llama.cpp's goldens elsewhere) measure it; each new type must
 * land inside the range they span, widened by 2x each way. A kernel that
 * mishandles a type (wrong scale, lost "+ m", wrong bit) multiplies the
 * error far beyond that; a model that silently stayed F32 falls below.
 */
static void test_model_logits(void) {
    kp_mkmodel_spec s;
    kp_error err = {0};
    CHECK(kp_mkmodel_spec_preset("tiny", &s, &err) == KP_OK);
    s.seed = 2024;
    static const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_Q8_0, KP_DTYPE_Q4_0, KP_DTYPE_Q4_1,
                                     KP_DTYPE_Q5_0, KP_DTYPE_Q5_1, KP_DTYPE_Q5_K};
    enum { NT = sizeof types / sizeof types[0] };
    char paths[NT][64];
    float *logits[NT] = {0};
    double werr[NT] = {0}, lerr[NT] = {0};
    int n_vocab = 0, n_packed_models = 0;
    for (int k = 0; k < NT; k++) {
        s.wtype = types[k];
        tmp_path(paths[k]);
        kp_status st = kp_mkmodel_write(&s, harness_path(STORIES), paths[k], NULL, &err);
        CHECK_MSG(st == KP_OK, "mkmodel %s: %s", kp_dtype_name(types[k]), err.msg);
        if (st != KP_OK) continue;
        int nv = 0;
        logits[k] = model_logits(paths[k], &nv, false, NULL);
        CHECK_MSG(logits[k] != NULL, "%s model does not run", kp_dtype_name(types[k]));
        /* decode (gemm with one activation row) computes what the batch computed */
        float *one = model_logits(paths[k], &nv, true, NULL);
        CHECK_MSG(one != NULL, "%s model does not run token by token", kp_dtype_name(types[k]));
        if (one && logits[k]) {
            double worst = 0;
            for (int i = 0; i < E2E_TOKENS; i++) {
                double e = 0, ss = 0;
                for (int v = 0; v < nv; v++) {
                    const double x = one[(size_t)i * nv + v], y = logits[k][(size_t)i * nv + v];
                    e += (x - y) * (x - y);
                    ss += y * y;
                }
                worst = fmax(worst, sqrt(e / ss));
            }
            CHECK_MSG(worst <= 1e-5, "%s: token by token vs one batch: logits rel L2 %.3g", kp_dtype_name(types[k]),
                      worst);
        }
        /* the weights repacked where the kernel table has a layout for the
         * type: the same logits bit for bit, in one batch and token by token */
        if (kp_kernels_best()->pack_rows[types[k]] > 0)
            for (int by_token = 0; by_token <= 1; by_token++) {
                const float *mapped = by_token ? one : logits[k];
                uint64_t pb = 0;
                float *pl = model_logits(paths[k], &nv, by_token, &pb);
                CHECK_MSG(pl != NULL && pb > 0, "%s model on repacked weights (%llu bytes)", kp_dtype_name(types[k]),
                          (unsigned long long)pb);
                if (pl && mapped)
                    CHECK_MSG(memcmp(pl, mapped, (size_t)E2E_TOKENS * nv * sizeof(float)) == 0,
                              "%s: logits on repacked weights (%s) differ from the mapped weights'",
                              kp_dtype_name(types[k]), by_token ? "token by token" : "one batch");
                n_packed_models += pl != NULL;
                free(pl);
            }
        free(one);
        if (k == 0) n_vocab = nv;
        if (k > 0) werr[k] = weights_rel_err(paths[0], paths[k]);
    }
    const size_t n = (size_t)E2E_TOKENS * n_vocab;
    for (int k = 1; k < NT && logits[0]; k++) {
        if (!logits[k]) continue;
        double e = 0, ss = 0;
        int finite = 1;
        for (size_t i = 0; i < n; i++) {
            finite &= isfinite(logits[k][i]) != 0;
            e += ((double)logits[k][i] - logits[0][i]) * ((double)logits[k][i] - logits[0][i]);
            ss += (double)logits[0][i] * logits[0][i];
        }
        lerr[k] = sqrt(e / ss);
        CHECK_MSG(finite, "%s: non-finite logits", kp_dtype_name(types[k]));
    }
    /* the avx512vnni table repacks Q5_K: its model ran on the copies too */
    if (kp_kernels_avx512vnni()) CHECK(kp_kernels_best()->pack_rows[KP_DTYPE_Q5_K] > 0);
    printf("quant_more: %d model runs on repacked weights checked bit for bit against the mapped weights'\n",
           n_packed_models);
    const double amp_q8 = lerr[1] / werr[1], amp_q4 = lerr[2] / werr[2];
    const double lo = 0.5 * fmin(amp_q8, amp_q4), hi = 2.0 * fmax(amp_q8, amp_q4);
    printf("quant_more: tiny llama (2 layers, 256 wide), %d positions: logits rel L2 vs F32 "
           "(weights rel RMS, ratio):\n", E2E_TOKENS);
    for (int k = 1; k < NT; k++)
        printf("quant_more:   %-5s %.5f (%.5f, %.2f)%s\n", kp_dtype_name(types[k]), lerr[k], werr[k],
               lerr[k] / werr[k], k <= 2 ? "  yardstick" : "");
    CHECK(amp_q8 > 0.1 && amp_q4 > 0.1 && isfinite(amp_q8) && isfinite(amp_q4));
    for (int k = 3; k < NT; k++) {
        const double ratio = lerr[k] / werr[k];
        CHECK_MSG(ratio >= lo && ratio <= hi, "%s: logits rel L2 %.5f for weights rel RMS %.5f: ratio %.2f "
                  "outside [%.2f, %.2f] (Q8_0 %.2f, Q4_0 %.2f)", kp_dtype_name(types[k]), lerr[k], werr[k],
                  ratio, lo, hi, amp_q8, amp_q4);
        /* and the weights really are of that type's precision: between Q8_0's and Q4_0's */
        CHECK_MSG(werr[k] > werr[1] && werr[k] < 1.2 * werr[2], "%s weights rel RMS %.5f", kp_dtype_name(types[k]),
                  werr[k]);
    }
    for (int k = 0; k < NT; k++) {
        free(logits[k]);
        unlink(paths[k]);
    }
}

int main(void) {
    const char *env = getenv("KP_TEST_SEED");
    const uint64_t seed = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock() << 32;
    rng_state = seed ? seed : 1;

    RUN(test_api);
    RUN(test_matches_llama_cpp);
    RUN(test_dequantize_random_blocks);
    RUN(test_dequantize_hand_blocks);
    RUN(test_quant_error_bounds);
    RUN(test_quant_quality);
    RUN(test_nonfinite_inputs);
    RUN(test_vec_dot_and_tiles);
    RUN(test_gemm);
    RUN(test_model_logits);
    if (harness_failed) fprintf(stderr, "quant_more: random seed was %llu (rerun with KP_TEST_SEED=%llu)\n",
                                (unsigned long long)seed, (unsigned long long)seed);
    return harness_finish("quant_more");
}
