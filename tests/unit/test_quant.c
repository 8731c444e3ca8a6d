/*
 * test_quant.c - conversions, quantizers, dequantizers and kernels of quant.h.
 *
 * References, none taken from kvpin's own output:
 *   - float64 decoders of FP16/BF16 (ldexp) and of every block layout,
 *     written here from the layout description (byte offsets and bit
 *     shifts, no shared code with src/kernels/);
 *   - float64 round-to-nearest-even searches for the FP16/BF16 rounding;
 *   - float64 dot products of the dequantized rows;
 *   - llama-quantize --pure outputs in ../shared/models/gen (Q8_0, Q4_0,
 *     Q4_K, Q6_K, F16, BF16 made from gen-llama-gqa-f32.gguf): our
 *     quantizers must reproduce those bytes.
 * Random inputs use a fresh seed each run (KP_TEST_SEED=<n> replays one);
 * the seed is printed when a check fails.
 */
#include "harness.h"

#include <stdint.h>
#include <time.h>

#include "gguf/dtype.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"

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

static double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1p-53; } /* [0, 1) */

static float rng_gauss(void) {
    const double u1 = rng_unit() + 0x1p-60, u2 = rng_unit();
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
}

static float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ------------------------------------------------------------------------ */
/* float64 references for FP16 / BF16                                        */
/* ------------------------------------------------------------------------ */

/* binary16 decoded from its definition; NaN for NaN encodings. */
static double ref_half(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp(m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double ref_bf16(uint16_t h) {
    const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 0) v = ldexp(m, -133);
    else if (e == 255) v = m ? NAN : INFINITY;
    else v = ldexp(128 + m, e - 134);
    return s ? -v : v;
}

/* The binary16 nearest to v (a non-NaN double), ties to the even encoding,
 * found by binary search over the positive encodings 0..0x7BFF (monotonic
 * in value), with values >= 65520 (halfway to 2^16) overflowing to inf. */
static uint16_t ref_round_half(double v) {
    const uint16_t sign = signbit(v) ? 0x8000 : 0;
    const double a = fabs(v);
    if (a >= 65520.0) return sign | 0x7C00;
    int lo = 0, hi = 0x7BFF; /* largest k with value(k) <= a */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (ref_half((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo == 0x7BFF) return sign | 0x7BFF;
    const double d0 = a - ref_half((uint16_t)lo), d1 = ref_half((uint16_t)(lo + 1)) - a;
    const int k = d0 < d1 ? lo : d1 < d0 ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
    return (uint16_t)(sign | k);
}

/* The bfloat16 nearest to finite float f, ties to even; beyond the largest
 * finite bf16 the next encoding (inf) counts as 2^128. */
static uint16_t ref_round_bf16(float f) {
    const uint32_t u = f32_to_bits(f);
    const uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
    const uint16_t t = (uint16_t)((u & 0x7FFFFFFF) >> 16); /* truncation */
    const double a = fabs((double)f);
    const double vt = ref_bf16(t);
    const double vn = (t + 1) == 0x7F80 ? ldexp(1, 128) : ref_bf16((uint16_t)(t + 1));
    const double d0 = a - vt, d1 = vn - a;
    const int k = d0 < d1 ? t : d1 < d0 ? t + 1 : (t % 2 == 0 ? t : t + 1);
    return (uint16_t)(sign | k);
}

static void test_fp16_exhaustive(void) {
    const kp_kernels *avx = kp_kernels_avx2();
    int bad_decode = 0, bad_trip = 0, bad_nan = 0, bad_avx = 0;
    static float all[65536];
    static uint16_t back[65536];
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kp_fp16_to_fp32((uint16_t)h);
        const double r = ref_half((uint16_t)h);
        all[h] = f;
        if (isnan(r)) {
            /* NaN: stays NaN with its sign and payload, made quiet (as F16C does) */
            const uint16_t b = kp_fp32_to_fp16(f);
            if (!isnan(f) || f32_to_bits(f) != ((h & 0x8000u) << 16 | 0x7F800000u | ((h & 0x3FFu) | 0x200u) << 13))
                bad_decode++;
            if (b != (h | 0x200)) bad_nan++;
        } else {
            if ((double)f != r || !signbit(f) != !signbit(r)) bad_decode++;
            if (kp_fp32_to_fp16(f) != h) bad_trip++;
        }
    }
    CHECK_EQ_INT(bad_decode, 0);
    CHECK_EQ_INT(bad_trip, 0);
    CHECK_EQ_INT(bad_nan, 0);
    /* the row forms agree with the scalar conversion on every half */
    kp_fp32_to_fp16_row(all, back, 65536);
    for (uint32_t h = 0; h < 65536; h++) bad_avx += back[h] != kp_fp32_to_fp16(all[h]);
    if (avx) {
        avx->quantize_act[KP_DTYPE_F16](all, back, 65536);
        for (uint32_t h = 0; h < 65536; h++) bad_avx += back[h] != kp_fp32_to_fp16(all[h]);
    }
    CHECK_EQ_INT(bad_avx, 0);
    static float dec[65536];
    static uint16_t hs[65536];
    for (uint32_t h = 0; h < 65536; h++) hs[h] = (uint16_t)h;
    kp_fp16_to_fp32_row(hs, dec, 65536);
    CHECK(memcmp(dec, all, sizeof dec) == 0);
}

/* Floats around every rounding boundary of binary16: the exact midpoints
 * between neighbouring halves (representable in float), one float ulp on
 * either side, plus random bit patterns over the whole float range. */
static int fp16_round_cases(float *out, int cap) {
    int n = 0;
    for (int k = 0; k < 0x7C00 && n + 4 <= cap; k += 1 + (int)(rng_u64() % 7)) {
        const double mid = (ref_half((uint16_t)k) + (k == 0x7BFF ? 65536.0 : ref_half((uint16_t)(k + 1)))) / 2;
        const float fm = (float)mid; /* exact: the midpoint needs 12 significant bits */
        out[n++] = fm;
        out[n++] = nextafterf(fm, 0);
        out[n++] = nextafterf(fm, INFINITY);
        out[n++] = -fm;
    }
    while (n < cap) {
        const float f = bits_to_f32((uint32_t)rng_u64());
        if (!isnan(f)) out[n++] = f;
    }
    return n;
}

static void test_fp16_rounding(void) {
    enum { N = 40000 };
    static float x[N];
    static uint16_t ya[N];
    const int n = fp16_round_cases(x, N);
    const kp_kernels *avx = kp_kernels_avx2();
    if (avx) avx->quantize_act[KP_DTYPE_F16](x, ya, n);
    int bad = 0, bad_avx = 0;
    for (int i = 0; i < n; i++) {
        const uint16_t want = ref_round_half((double)x[i]);
        if (kp_fp32_to_fp16(x[i]) != want) {
            if (bad++ < 5) fprintf(stderr, "fp16(%a): got %04x want %04x\n", (double)x[i], kp_fp32_to_fp16(x[i]), want);
        }
        if (avx && ya[i] != want) bad_avx++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_avx, 0);
    /* fixed cases: 65504 max, 65519 rounds down, 65520 overflows, 2^-25 ties to 0, 2^-24 */
    CHECK_EQ_INT(kp_fp32_to_fp16(65504.0f), 0x7BFF);
    CHECK_EQ_INT(kp_fp32_to_fp16(65519.0f), 0x7BFF);
    CHECK_EQ_INT(kp_fp32_to_fp16(65520.0f), 0x7C00);
    CHECK_EQ_INT(kp_fp32_to_fp16(-INFINITY), 0xFC00);
    CHECK_EQ_INT(kp_fp32_to_fp16(0x1p-25f), 0x0000);
    CHECK_EQ_INT(kp_fp32_to_fp16(0x1.000002p-25f), 0x0001);
    CHECK_EQ_INT(kp_fp32_to_fp16(0x1p-24f), 0x0001);
    CHECK_EQ_INT(kp_fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);  /* tie, even stays */
    CHECK_EQ_INT(kp_fp32_to_fp16(1.0f + 0x3p-11f), 0x3C02);  /* tie, odd rounds up */
    CHECK(isnan(kp_fp16_to_fp32(kp_fp32_to_fp16(NAN))));
}

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kp_bf16_to_fp32((uint16_t)h);
        const double r = ref_bf16((uint16_t)h);
        if (isnan(r)) {
            if (!isnan(f) || kp_fp32_to_bf16(f) != (h | 64)) bad++;
        } else if ((double)f != r || !signbit(f) != !signbit(r) || kp_fp32_to_bf16(f) != h) {
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);

    enum { N = 40000 };
    static float x[N];
    static uint16_t ya[N];
    int n = 0;
    while (n < N) {
        uint32_t u = (uint32_t)rng_u64();
        switch (n % 4) {
        case 0: u = (u & 0xFFFF0000u) | 0x8000u; break; /* exact tie */
        case 1: u = (u & 0xFFFF0000u) | 0x7FFFu; break; /* just below a tie */
        case 2: u = (u & 0xFFFF0000u) | 0x8001u; break; /* just above */
        default: break;
        }
        const float f = bits_to_f32(u);
        if (!isnan(f)) x[n++] = f;
    }
    const kp_kernels *avx = kp_kernels_avx2();
    if (avx) avx->quantize_act[KP_DTYPE_BF16](x, ya, n);
    int bad_r = 0, bad_avx = 0;
    for (int i = 0; i < n; i++) {
        const uint16_t want = ref_round_bf16(x[i]);
        bad_r += kp_fp32_to_bf16(x[i]) != want;
        if (avx) bad_avx += ya[i] != want;
    }
    CHECK_EQ_INT(bad_r, 0);
    CHECK_EQ_INT(bad_avx, 0);
    CHECK_EQ_INT(kp_fp32_to_bf16(bits_to_f32(0x3F808000u)), 0x3F80); /* tie to even */
    CHECK_EQ_INT(kp_fp32_to_bf16(bits_to_f32(0x3F818000u)), 0x3F82); /* tie, odd up */
    CHECK_EQ_INT(kp_fp32_to_bf16(bits_to_f32(0x00010000u)), 0x0001); /* subnormal kept */
    CHECK_EQ_INT(kp_fp32_to_bf16(bits_to_f32(0x7F800001u)), 0x7FC0); /* signalling NaN quieted */
    CHECK_EQ_INT(kp_fp32_to_bf16(bits_to_f32(0xFF800001u)), 0xFFC0);
    /* the AVX2 path on NaN and inf inputs */
    if (avx) {
        float sp[8] = {NAN, -NAN, INFINITY, -INFINITY, bits_to_f32(0x7F800001u), 0.0f, -0.0f, 3.0f};
        uint16_t o[8];
        avx->quantize_act[KP_DTYPE_BF16](sp, o, 8);
        int diff = 0;
        for (int i = 0; i < 8; i++) diff += o[i] != kp_fp32_to_bf16(sp[i]);
        CHECK_EQ_INT(diff, 0);
    }
}

/* ------------------------------------------------------------------------ */
/* float64 block decoders, from the layout tables                            */
/* ------------------------------------------------------------------------ */

static double le_half(const uint8_t *p) { return ref_half((uint16_t)(p[0] | p[1] << 8)); }

/* Decodes n elements of type t from raw bytes b into out (float64). */
static void ref_decode(kp_dtype t, const uint8_t *b, int64_t n, double *out) {
    switch (t) {
    case KP_DTYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, b + 4 * i, 4);
            out[i] = f;
        }
        break;
    case KP_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) out[i] = le_half(b + 2 * i);
        break;
    case KP_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = ref_bf16((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
        break;
    case KP_DTYPE_Q8_0: /* [half d][int8 q x32] */
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *blk = b + 34 * (i / 32);
            out[i] = le_half(blk) * (int8_t)blk[2 + i % 32];
        }
        break;
    case KP_DTYPE_Q4_0: /* [half d][16 bytes: low nibbles = 0..15, high = 16..31] */
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *blk = b + 18 * (i / 32);
            const int e = (int)(i % 32);
            const int byte = blk[2 + e % 16];
            const int q = e < 16 ? byte & 15 : byte >> 4;
            out[i] = le_half(blk) * (q - 8);
        }
        break;
    case KP_DTYPE_Q4_K: /* [half d][half dmin][12 scale bytes][128 quant bytes] */
    case KP_DTYPE_Q5_K: /* [half d][half dmin][12 scale bytes][32 qh bytes][128 quant bytes] */
        for (int64_t i = 0; i < n; i++) {
            const bool q5 = t == KP_DTYPE_Q5_K;
            const uint8_t *blk = b + (q5 ? 176 : 144) * (i / 256), *S = blk + 4, *H = blk + 16;
            const uint8_t *Q = blk + (q5 ? 48 : 16);
            const int e = (int)(i % 256), sub = e / 32;
            int sc, m;
            if (sub < 4) {
                sc = S[sub] & 63;
                m = S[sub + 4] & 63;
            } else {
                sc = (S[sub + 4] & 15) | (S[sub - 4] >> 6) << 4;
                m = (S[sub + 4] >> 4) | (S[sub] >> 6) << 4;
            }
            /* quant 64c + l: low nibble of qs[32c + l] (Q5_K: 5th bit = bit
             * 2c of qh[l]); quant 64c + 32 + l: high nibble (bit 2c + 1) */
            const int within = e % 64, l = within % 32, byte = Q[32 * (e / 64) + l];
            const int low = within < 32 ? byte & 15 : byte >> 4;
            const int high = q5 ? (H[l] >> (2 * (e / 64) + (within >= 32))) & 1 : 0;
            out[i] = le_half(blk) * sc * (low | high << 4) - le_half(blk + 2) * m;
        }
        break;
    case KP_DTYPE_Q6_K: /* [128 ql][64 qh][16 int8 scales][half d] */
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *blk = b + 210 * (i / 256), *QL = blk, *QH = blk + 128;
            const int e = (int)(i % 256), h = e / 128, g = (e % 128) / 32, l = e % 32;
            const int qlb = QL[64 * h + l + 32 * (g & 1)];
            const int low = g < 2 ? qlb & 15 : qlb >> 4;
            const int high = (QH[32 * h + l] >> (2 * g)) & 3;
            out[i] = le_half(blk + 208) * (int8_t)blk[192 + e / 16] * ((low | high << 4) - 32);
        }
        break;
    case KP_DTYPE_Q8_K: /* [float d][int8 q x256][int16 bsums x16] */
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *blk = b + 292 * (i / 256);
            float d;
            memcpy(&d, blk, 4);
            out[i] = (double)d * (int8_t)blk[4 + i % 256];
        }
        break;
    case KP_DTYPE_MXFP4: /* [e8m0 e][16 bytes: low nibbles = 0..15, high = 16..31], OCP MX v1.0:
                            E2M1 sign bit 3, magnitudes 0 0.5 1 1.5 2 3 4 6, scale 2^(e - 127) */
        for (int64_t i = 0; i < n; i++) {
            static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
            const uint8_t *blk = b + 17 * (i / 32);
            const int e = (int)(i % 32);
            const int code = e < 16 ? blk[1 + e] & 15 : blk[1 + e - 16] >> 4;
            out[i] = ldexp(code & 8 ? -mag[code & 7] : mag[code & 7], (int)blk[0] - 127);
        }
        break;
    default: CHECK(!"ref_decode: unexpected type"); break;
    }
}

static const kp_dtype weight_types[] = {KP_DTYPE_F32,  KP_DTYPE_F16,  KP_DTYPE_BF16, KP_DTYPE_Q8_0,
                                        KP_DTYPE_Q4_0, KP_DTYPE_Q4_K, KP_DTYPE_Q5_K, KP_DTYPE_Q6_K,
                                        KP_DTYPE_MXFP4};
#define N_WEIGHT_TYPES (int)(sizeof weight_types / sizeof weight_types[0])

static void put_half(uint8_t *p, float v) {
    const uint16_t h = kp_fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random bytes with finite scale fields, so every decoded value is finite. */
static void random_blocks(kp_dtype t, uint8_t *b, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)rng_u64();
    const kp_dtype_info *info = kp_dtype_get(t);
    for (size_t blk = 0; blk < bytes / info->type_size; blk++) {
        uint8_t *p = b + blk * info->type_size;
        const float s = (float)(rng_gauss() * 0.01);
        switch (t) {
        case KP_DTYPE_Q8_0:
        case KP_DTYPE_Q4_0: put_half(p, s); break;
        case KP_DTYPE_Q4_K: put_half(p, s); put_half(p + 2, (float)fabs(rng_gauss() * 0.01)); break;
        case KP_DTYPE_Q6_K: put_half(p + 208, s); break;
        case KP_DTYPE_F16:
        case KP_DTYPE_BF16:
            for (size_t i = 0; i < bytes / 2; i++) {
                const uint16_t h = t == KP_DTYPE_F16 ? kp_fp32_to_fp16(rng_gauss()) : kp_fp32_to_bf16(rng_gauss());
                b[2 * i] = (uint8_t)h;
                b[2 * i + 1] = (uint8_t)(h >> 8);
            }
            return;
        case KP_DTYPE_F32:
            for (size_t i = 0; i < bytes / 4; i++) {
                const float f = rng_gauss();
                memcpy(b + 4 * i, &f, 4);
            }
            return;
        default: break;
        }
    }
}

static void test_dequantize_random_blocks(void) {
    const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_F16, KP_DTYPE_BF16, KP_DTYPE_Q8_0,
                              KP_DTYPE_Q4_0, KP_DTYPE_Q4_K, KP_DTYPE_Q6_K};
    enum { N = 768 };
    static uint8_t raw[N * 4];
    static float got[N];
    static double want[N];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kp_dtype t = types[ti];
        for (int rep = 0; rep < 4; rep++) {
            const size_t bytes = kp_dtype_row_size(t, N);
            random_blocks(t, raw, bytes);
            CHECK(kp_dequantize_row(t, raw, got, N));
            ref_decode(t, raw, N, want);
            int bad = 0;
            for (int i = 0; i < N; i++) {
                const double tol = 2e-6 * fabs(want[i]) + 1e-9;
                if (!(fabs(got[i] - want[i]) <= tol)) {
                    if (bad++ < 3) fprintf(stderr, "%s[%d]: got %.9g want %.9g\n", kp_dtype_name(t), i, got[i], want[i]);
                }
            }
            CHECK_MSG(bad == 0, "%s: %d elements differ from the reference decoder", kp_dtype_name(t), bad);
        }
    }
    /* Q8_K is decoded too (activations) */
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)rng_u64();
    const float d = 0.0123f;
    memcpy(raw, &d, 4);
    CHECK(kp_dequantize_row(KP_DTYPE_Q8_K, raw, got, 256));
    ref_decode(KP_DTYPE_Q8_K, raw, 256, want);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += got[i] != (float)want[i];
    CHECK_EQ_INT(bad, 0);
}

/* Blocks built by hand, with the expected values worked out from the layout. */
static void test_dequantize_hand_blocks(void) {
    float y[256];

    /* Q4_0: d = 0.5, byte j = j | (15 - j) << 4: x[j] = (j - 8)/2, x[16 + j] = (7 - j)/2 */
    uint8_t q40[18];
    put_half(q40, 0.5f);
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK(kp_dequantize_row(KP_DTYPE_Q4_0, q40, y, 32));
    CHECK_NEAR(y[0], -4.0, 0);
    CHECK_NEAR(y[15], 3.5, 0);
    CHECK_NEAR(y[16], 3.5, 0);
    CHECK_NEAR(y[31], -4.0, 0);

    /* Q8_0: d = 0.25, q = -127, 0, 127 */
    uint8_t q80[34] = {0};
    put_half(q80, 0.25f);
    q80[2] = (uint8_t)-127;
    q80[4] = 127;
    CHECK(kp_dequantize_row(KP_DTYPE_Q8_0, q80, y, 32));
    CHECK_NEAR(y[0], -31.75, 0);
    CHECK_NEAR(y[1], 0.0, 0);
    CHECK_NEAR(y[2], 31.75, 0);

    /* Q4_K: d = 1, dmin = 0.5. Sub-block 1: scale byte 1 = 3 -> sc 3, byte 5 = 2 -> m 2.
     * Sub-block 5: scales[9] = 0x21 -> sc low 1, m low 2; scales[1] top bits 01 -> sc += 16;
     * scales[5] top bits 10 -> m += 32: sc 17, m 34. Element 32 (sub-block 1) sits in the
     * high nibble of qs[0]; element 160 (sub-block 5, chunk 2, offset 32) in the high nibble
     * of qs[64], whose low nibble is element 128 (sub-block 4). */
    uint8_t q4k[144] = {0};
    put_half(q4k, 1.0f);
    put_half(q4k + 2, 0.5f);
    q4k[4 + 1] = 3 | 1 << 6;
    q4k[4 + 5] = 2 | 2 << 6;
    q4k[4 + 9] = 0x21;
    q4k[16 + 0] = 0x70;  /* element 0: 0, element 32: 7 */
    q4k[16 + 64] = 0x95; /* element 128: 5, element 160: 9 */
    CHECK(kp_dequantize_row(KP_DTYPE_Q4_K, q4k, y, 256));
    CHECK_NEAR(y[32], 3 * 7 - 0.5 * 2, 0);    /* 20 */
    CHECK_NEAR(y[33], -0.5 * 2, 0);           /* q 0 */
    CHECK_NEAR(y[160], 17 * 9 - 0.5 * 34, 0); /* 136 */
    CHECK_NEAR(y[0], 0, 0);                   /* sub-block 0: sc 0, m 0 */
    CHECK_NEAR(y[128], 0, 0);                 /* sub-block 4: sc 0, m 0 (scales[8] = 0) */

    /* Q6_K: d = 1. ql[0] = 0x21 (element 0 low 1, element 64 low 2), qh[0] = 0b11100100
     * (element 0 high 0, 32 high 1, 64 high 2, 96 high 3), ql[32] = 0x54 (element 32 low 4,
     * element 96 low 5). Scales: sub-block 0 -> 1, 2 -> -2, 4 -> 3, 6 -> 4. */
    uint8_t q6k[210] = {0};
    q6k[0] = 0x21;
    q6k[32] = 0x54;
    q6k[128] = 0xE4;
    q6k[192 + 0] = 1;
    q6k[192 + 2] = (uint8_t)-2;
    q6k[192 + 4] = 3;
    q6k[192 + 6] = 4;
    put_half(q6k + 208, 1.0f);
    CHECK(kp_dequantize_row(KP_DTYPE_Q6_K, q6k, y, 256));
    CHECK_NEAR(y[0], 1 * (1 - 32), 0);                  /* -31 */
    CHECK_NEAR(y[32], -2 * ((4 | 1 << 4) - 32), 0);     /* 24 */
    CHECK_NEAR(y[64], 3 * ((2 | 2 << 4) - 32), 0);      /* 6 */
    CHECK_NEAR(y[96], 4 * ((5 | 3 << 4) - 32), 0);      /* 148 */
}

/* ------------------------------------------------------------------------ */
/* quantization round trips                                                  */
/* ------------------------------------------------------------------------ */

static void gauss_row(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * scale;
}

static double rel_rms_err(const float *x, const float *y, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += (double)x[i] * x[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

static void test_quant_roundtrip_bounds(void) {
    enum { N = 256 * 8 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (int rep = 0; rep < 4; rep++) {
        const float scale = (float)ldexp(1.0, (int)(rng_u64() % 20) - 10);
        gauss_row(x, N, scale);
        if (rep == 3) x[17] *= 40; /* an outlier */

        /* F16 / BF16: half an ulp */
        CHECK(kp_quantize_row(KP_DTYPE_F16, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_F16, q, y, N));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += !(fabs((double)x[i] - y[i]) <= ldexp(fabs(x[i]), -11) + 0x1p-25);
        CHECK_EQ_INT(bad, 0);
        CHECK(kp_quantize_row(KP_DTYPE_BF16, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_BF16, q, y, N));
        bad = 0;
        for (int i = 0; i < N; i++) bad += !(fabs((double)x[i] - y[i]) <= ldexp(fabs(x[i]), -8));
        CHECK_EQ_INT(bad, 0);

        /* Q8_0: |err| <= d/2 with d = amax/127, plus what rounding d to FP16 moves */
        CHECK(kp_quantize_row(KP_DTYPE_Q8_0, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q8_0, q, y, N));
        bad = 0;
        for (int b = 0; b < N / 32; b++) {
            double amax = 0;
            for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[32 * b + j]));
            const double d = amax / 127, d16 = le_half(q + 34 * b);
            const double bound = d / 2 * (1 + 1e-6) + 127 * fabs(d - d16);
            for (int j = 0; j < 32; j++) bad += !(fabs((double)x[32 * b + j] - y[32 * b + j]) <= bound);
        }
        CHECK_MSG(bad == 0, "Q8_0: %d elements beyond d/2", bad);

        /* Q4_0: d = max/-8; |err| <= |d|/2, one full step at the clamped end (q = 15) */
        CHECK(kp_quantize_row(KP_DTYPE_Q4_0, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q4_0, q, y, N));
        bad = 0;
        for (int b = 0; b < N / 32; b++) {
            double amax = 0, max = 0;
            for (int j = 0; j < 32; j++)
                if (fabs(x[32 * b + j]) > amax) {
                    amax = fabs(x[32 * b + j]);
                    max = x[32 * b + j];
                }
            const double d = max / -8, d16 = le_half(q + 18 * b);
            for (int j = 0; j < 32; j++) {
                const double v = x[32 * b + j], t = d ? v / d : 0;
                const double step = t > 7.5 ? fabs(d) * (t - 7) : fabs(d) / 2;
                bad += !(fabs(v - y[32 * b + j]) <= step * (1 + 1e-6) + 8 * fabs(d - d16));
            }
        }
        CHECK_MSG(bad == 0, "Q4_0: %d elements beyond the step bound", bad);

        /* Q8_K: d = max/-127 as float32, |err| <= |d|/2; bsums are sums of 16 quants */
        CHECK(kp_quantize_row(KP_DTYPE_Q8_K, x, q, N));
        CHECK(kp_dequantize_row(KP_DTYPE_Q8_K, q, y, N));
        bad = 0;
        int bad_sums = 0;
        for (int b = 0; b < N / 256; b++) {
            const uint8_t *blk = q + 292 * b;
            float d;
            memcpy(&d, blk, 4);
            for (int j = 0; j < 256; j++) bad += !(fabs((double)x[256 * b + j] - y[256 * b + j]) <= fabs(d) / 2 * (1 + 1e-5));
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int k = 0; k < 16; k++) s += (int8_t)blk[4 + 16 * j + k];
                int16_t bs;
                memcpy(&bs, blk + 260 + 2 * j, 2);
                bad_sums += bs != s;
            }
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(bad_sums, 0);
    }
}

/*
 * Q4_K / Q6_K quality on Gaussian rows: the RMS error relative to the row's
 * RMS, compared with fixed bounds and with a naive quantizer computed here
 * (per sub-block min/max grid for Q4_K, absmax grid for Q6_K, with exact
 * float64 scales). The searches must beat the naive grids although they
 * also pay for 6/8-bit scales, so a broken search fails.
 */
static double naive_q4k_err(const float *x, int64_t n) {
    double e = 0, s = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        double mn = 0, mx = -INFINITY;
        for (int j = 0; j < 32; j++) {
            mn = fmin(mn, x[32 * b + j]);
            mx = fmax(mx, x[32 * b + j]);
        }
        const double d = (mx - mn) / 15;
        for (int j = 0; j < 32; j++) {
            const double v = x[32 * b + j];
            const double r = d > 0 ? mn + d * fmin(15, fmax(0, round((v - mn) / d))) : v;
            e += (v - r) * (v - r);
            s += v * v;
        }
    }
    return sqrt(e / s);
}

static double naive_q6k_err(const float *x, int64_t n) {
    double e = 0, s = 0;
    for (int64_t b = 0; b < n / 16; b++) {
        double amax = 0;
        for (int j = 0; j < 16; j++) amax = fmax(amax, fabs(x[16 * b + j]));
        const double d = amax / 31.5;
        for (int j = 0; j < 16; j++) {
            const double v = x[16 * b + j];
            const double r = d > 0 ? d * fmin(31, fmax(-32, round(v / d))) : v;
            e += (v - r) * (v - r);
            s += v * v;
        }
    }
    return sqrt(e / s);
}

static void test_kquant_quality(void) {
    enum { N = 256 * 64 };
    static float x[N], y[N];
    static uint8_t q[N];
    gauss_row(x, N, 0.02f);
    CHECK(kp_quantize_row(KP_DTYPE_Q4_K, x, q, N));
    CHECK(kp_dequantize_row(KP_DTYPE_Q4_K, q, y, N));
    const double e4 = rel_rms_err(x, y, N), n4 = naive_q4k_err(x, N);
    CHECK(kp_quantize_row(KP_DTYPE_Q6_K, x, q, N));
    CHECK(kp_dequantize_row(KP_DTYPE_Q6_K, q, y, N));
    const double e6 = rel_rms_err(x, y, N), n6 = naive_q6k_err(x, N);
    printf("quant: Gaussian rows, relative RMS error: Q4_K %.4f (naive grid %.4f), Q6_K %.4f (naive grid %.4f)\n",
           e4, n4, e6, n6);
    CHECK_MSG(e4 > 0.03 && e4 < 0.09, "Q4_K rel RMS %.4f", e4);
    CHECK_MSG(e6 > 0.005 && e6 < 0.025, "Q6_K rel RMS %.4f", e6);
    CHECK_MSG(e4 < 0.97 * n4, "Q4_K %.4f vs naive %.4f", e4, n4);
    CHECK_MSG(e6 < 0.97 * n6, "Q6_K %.4f vs naive %.4f", e6, n6);

    /* degenerate rows: zeros, a constant, tiny values, one spike */
    static const float cases[] = {0.0f, 1.0f, -3.0f, 1e-30f};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < 512; i++) x[i] = cases[c];
        x[300] = cases[c] * 7 + 1e-3f;
        const kp_dtype kt[] = {KP_DTYPE_Q4_K, KP_DTYPE_Q6_K, KP_DTYPE_Q8_K, KP_DTYPE_Q8_0, KP_DTYPE_Q4_0};
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
    static uint8_t q0[N * 4], q1[N * 4];
    const kp_dtype types[] = {KP_DTYPE_F16, KP_DTYPE_BF16, KP_DTYPE_Q8_0, KP_DTYPE_Q4_0,
                              KP_DTYPE_Q4_K, KP_DTYPE_Q6_K, KP_DTYPE_Q8_K};
    gauss_row(x, N, 1.0f);
    memcpy(bad, x, sizeof bad);
    bad[3] = NAN;
    bad[5] = INFINITY;
    bad[7] = -INFINITY;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const kp_dtype t = types[k];
        const kp_dtype_info *info = kp_dtype_get(t);
        const size_t first = info->block_size == 1 ? 8 * info->type_size : info->type_size;
        const size_t bytes = kp_dtype_row_size(t, N);
        CHECK(kp_quantize_row(t, x, q0, N));
        CHECK(kp_quantize_row(t, bad, q1, N));
        CHECK_MSG(memcmp(q0 + first, q1 + first, bytes - first) == 0, "%s: NaN leaked past its block", kp_dtype_name(t));
    }
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
    for (int k = 0; k < 2; k++) {
        if (!tabs[k]) continue;
        for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
            const kp_dtype wt = weight_types[ti], at = kp_vec_dot_type(wt);
            const kp_dtype_info *info = kp_dtype_get(at);
            const size_t first = info->block_size == 1 ? 8 * info->type_size : info->type_size;
            tabs[k]->quantize_act[wt](x, q0, N);
            tabs[k]->quantize_act[wt](bad, q1, N);
            CHECK_MSG(memcmp(q0 + first, q1 + first, kp_dtype_row_size(at, N) - first) == 0,
                      "%s quantize_act[%s]: NaN leaked", tabs[k]->name, kp_dtype_name(wt));
        }
    }
}

/* ------------------------------------------------------------------------ */
/* llama-quantize --pure reproduction                                        */
/* ------------------------------------------------------------------------ */

static void test_matches_llama_quantize(void) {
    static const struct {
        const char *file;
        kp_dtype type;
    } files[] = {
        {"gen-llama-gqa-q8_0.gguf", KP_DTYPE_Q8_0}, {"gen-llama-gqa-q4_0.gguf", KP_DTYPE_Q4_0},
        {"gen-llama-gqa-q4_k.gguf", KP_DTYPE_Q4_K}, {"gen-llama-gqa-q6_k.gguf", KP_DTYPE_Q6_K},
        {"gen-llama-gqa-f16.gguf", KP_DTYPE_F16},   {"gen-llama-gqa-bf16.gguf", KP_DTYPE_BF16},
    };
    kp_error err = {0};
    kp_gguf *src = NULL;
    const char *dir = "tests/data/models/";
    char path[512];
    snprintf(path, sizeof path, "%sgen-llama-gqa-f32.gguf", dir);
    if (kp_gguf_open(&src, harness_path(path), &err) != KP_OK) {
        CHECK_MSG(0, "cannot open the F32 source model: %s", err.msg);
        return;
    }
    static uint8_t mine[768 * 4];
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        kp_gguf *dst = NULL;
        snprintf(path, sizeof path, "%s%s", dir, files[f].file);
        if (kp_gguf_open(&dst, harness_path(path), &err) != KP_OK) {
            CHECK_MSG(0, "cannot open %s: %s", files[f].file, err.msg);
            continue;
        }
        int64_t rows = 0, rows_bad = 0, tensors = 0;
        for (size_t ti = 0; ti < kp_gguf_n_tensors(src); ti++) {
            const kp_gguf_tensor *ts = kp_gguf_tensor_at(src, ti);
            if (ts->n_dims != 2 || ts->type != KP_DTYPE_F32) continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)ts->name.len, ts->name.data);
            const kp_gguf_tensor *td = kp_gguf_find_tensor(dst, name);
            CHECK_MSG(td && td->type == (uint32_t)files[f].type && td->ne[0] == ts->ne[0] && td->ne[1] == ts->ne[1],
                      "%s: tensor %s missing or of another type/shape", files[f].file, name);
            if (!td || td->type != (uint32_t)files[f].type || td->ne[0] != ts->ne[0]) continue;
            tensors++;
            const int64_t ncols = ts->ne[0];
            const size_t rs = kp_dtype_row_size(files[f].type, ncols);
            /* every 7th row (plus the last) keeps the sanitizer build fast */
            for (int64_t r = 0; r < ts->ne[1]; r += (r + 7 < ts->ne[1] || r == ts->ne[1] - 1) ? 7 : ts->ne[1] - 1 - r) {
                const float *x = (const float *)ts->data + r * ncols;
                CHECK(kp_quantize_row(files[f].type, x, mine, ncols));
                rows++;
                if (memcmp(mine, (const uint8_t *)td->data + (size_t)r * rs, rs) != 0) {
                    if (rows_bad++ < 3) fprintf(stderr, "%s: %s row %lld differs\n", files[f].file, name, (long long)r);
                }
                if (r == ts->ne[1] - 1) break;
            }
        }
        printf("quant: %s: %lld rows of %lld tensors requantized from F32, %lld differ from llama-quantize\n",
               files[f].file, (long long)rows, (long long)tensors, (long long)rows_bad);
        CHECK(tensors == 30);
        CHECK_EQ_INT(rows_bad, 0);
        kp_gguf_close(dst);
    }
    kp_gguf_close(src);
}

/* ------------------------------------------------------------------------ */
/* kernels                                                                   */
/* ------------------------------------------------------------------------ */

/* float64 dot of the dequantized rows and sum |w_i a_i| (the error scale). */
static double ref_dot(kp_dtype wt, const void *w, kp_dtype at, const void *a, int64_t n, double *mag) {
    static double dw[4096], da[4096];
    ref_decode(wt, w, n, dw);
    ref_decode(at, a, n, da);
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += dw[i] * da[i];
        m += fabs(dw[i] * da[i]);
    }
    *mag = m;
    return s;
}

static int64_t test_len(kp_dtype t, int which) {
    const int64_t bs = kp_dtype_get(t)->block_size;
    if (bs == 1) { /* odd lengths, with tails of every size below 8, 16 and 32 */
        static const int64_t lens[] = {1, 7, 67, 259, 1001};
        return lens[which];
    }
    static const int64_t blocks[] = {1, 3, 5, 7, 15}; /* odd block counts */
    return bs * blocks[which] * (bs == 32 ? 3 : 1);
}

static void test_vec_dot_and_tiles(void) {
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
    enum { MAXN = 256 * 15, PAD = 2 };
    static float wf[4][MAXN], af[4][MAXN];
    static uint8_t wq[4][MAXN * 4 + 512], aq[2][4][MAXN * 4 + 512];
    int n_tile_checks = 0;
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const kp_dtype wt = weight_types[ti], at = kp_vec_dot_type(wt);
        for (int li = 0; li < 5; li++) {
            const int64_t n = test_len(wt, li);
            const size_t wrs = kp_dtype_row_size(wt, n), ars = kp_dtype_row_size(at, n);
            /* strides with padding, kept a multiple of the block alignment */
            const size_t w_stride = wrs + PAD * kp_dtype_get(wt)->type_size * (wt == KP_DTYPE_F32 ? 1 : 2);
            const size_t a_stride = ars + PAD * kp_dtype_get(at)->type_size;
            for (int r = 0; r < 4; r++) {
                gauss_row(wf[r], n, 0.1f);
                gauss_row(af[r], n, 1.0f);
                CHECK(kp_quantize_row(wt, wf[r], (uint8_t *)wq + r * w_stride, n));
            }
            /* activations through each table's quantize_act: identical bytes */
            for (int k = 0; k < 2; k++) {
                if (!tabs[k]) continue;
                for (int c = 0; c < 4; c++) tabs[k]->quantize_act[wt](af[c], (uint8_t *)aq[k] + c * a_stride, n);
            }
            if (tabs[1]) {
                int same = 1;
                for (int c = 0; c < 4; c++)
                    same &= memcmp((uint8_t *)aq[0] + c * a_stride, (uint8_t *)aq[1] + c * a_stride, ars) == 0;
                CHECK_MSG(same, "%s n=%lld: quantize_act differs between tables", kp_dtype_name(wt), (long long)n);
            }
            double want[4][4], mag[4][4];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++)
                    want[r][c] = ref_dot(wt, (uint8_t *)wq + r * w_stride, at, (uint8_t *)aq[0] + c * a_stride, n, &mag[r][c]);

            for (int k = 0; k < 2; k++) {
                const kp_kernels *K = tabs[k];
                if (!K) continue;
                const double rel = 1e-5 + 4e-7 * sqrt((double)n);
                float s;
                K->vec_dot[wt](n, &s, (uint8_t *)wq, (uint8_t *)aq[k]);
                CHECK_MSG(fabs(s - want[0][0]) <= rel * mag[0][0], "%s %s vec_dot n=%lld: %.9g vs %.9g",
                          K->name, kp_dtype_name(wt), (long long)n, s, want[0][0]);
                for (int nr = 1; nr <= 4; nr++) {
                    for (int nc = 1; nc <= 4; nc++) {
                        float out[4 * 6];
                        const size_t os = 6;
                        for (int i = 0; i < 24; i++) out[i] = -12345.0f;
                        K->dot_tile[wt](n, nr, nc, wq, w_stride, aq[k], a_stride, out, os);
                        int bad = 0, clobbered = 0;
                        for (int c = 0; c < 4; c++)
                            for (int r = 0; r < 6; r++) {
                                const float v = out[c * os + r];
                                if (c < nc && r < nr) bad += !(fabs(v - want[r][c]) <= rel * mag[r][c]);
                                else clobbered += v != -12345.0f;
                            }
                        n_tile_checks++;
                        CHECK_MSG(bad == 0 && clobbered == 0, "%s %s dot_tile %dx%d n=%lld: %d wrong, %d clobbered",
                                  K->name, kp_dtype_name(wt), nr, nc, (long long)n, bad, clobbered);
                    }
                }
            }
            /* the two tables agree with each other */
            if (tabs[1]) {
                float s0, s1;
                tabs[0]->vec_dot[wt](n, &s0, wq, aq[0]);
                tabs[1]->vec_dot[wt](n, &s1, wq, aq[1]);
                CHECK_MSG(fabs(s0 - s1) <= 2e-5 * mag[0][0] + 1e-30, "%s scalar %.9g vs avx2 %.9g", kp_dtype_name(wt), s0, s1);
            }
        }
    }
    CHECK(n_tile_checks > 0);
}

/*
 * gemm over whole blocks of rows and columns, as the forward pass calls
 * it: shapes that cross the kernels' internal row chunks (16 rows), column
 * groups (4) and K chunks (4096 elements), partial groups at every edge,
 * row and column offsets, and an out_stride wider than nr; for Q8_0
 * activations both without aux and with kp_q8_0_aux rows. Every output is
 * compared with a float64 dot of the dequantized rows, and must equal bit
 * for bit what a 1 x 1 call (and dot_tile, and the other SIMD table)
 * computes for it: the forward pass needs results that do not depend on
 * how a batch is split. Outputs outside the nr x nc block must stay
 * untouched.
 */
static void test_tile_shapes(void) {
    enum { R = 19, C = 20, NMAX = 4352, OS = 23 };
    static const int shapes[][4] = {/* nr, nc, first row, first column */
                                    {1, 1, 0, 0},  {1, 5, 0, 0},   {4, 4, 0, 0},  {5, 1, 0, 0},  {3, 7, 2, 3},
                                    {16, 4, 0, 0}, {17, 9, 1, 2}, {19, 11, 0, 0}, {8, 2, 11, 9},
                                    {16, 1, 3, 0}, {19, 1, 0, 4}, /* 16-row decode tiles */
                                    {17, 18, 1, 2}}; /* past the packed decode tiles' 16 columns: panels */
    const kp_kernels *tabs[4] = {kp_kernels_scalar(), kp_kernels_avx2(), kp_kernels_avx512vnni(),
                                 kp_kernels_avx512bf16()};
    static float xf[NMAX];
    static kp_q8_0_aux aux[C][NMAX / 32];
    double *dw = malloc(sizeof(double) * R * NMAX), *da = malloc(sizeof(double) * C * NMAX);
    double *want = malloc(sizeof(double) * R * C), *mag = malloc(sizeof(double) * R * C);
    static float single[R * C], first[R * C]; /* 1 x 1 gemm results; those of the first SIMD table */
    float *out = malloc(sizeof(float) * C * OS);
    CHECK(dw && da && want && mag && out);
    if (!dw || !da || !want || !mag || !out) goto done;
    int n_checked = 0, n_packed = 0;
    /* 4352 = 17 * 256 crosses every K chunk; then an odd n for the float
     * types and an odd number of blocks for the others (37 blocks of 32, 5
     * super-blocks: the repacked layouts' blocks go in pairs) */
    for (int ti = 0; ti < 2 * N_WEIGHT_TYPES; ti++) {
        const kp_dtype wt = weight_types[ti % N_WEIGHT_TYPES], at = kp_vec_dot_type(wt);
        const int64_t bs = kp_dtype_get(wt)->block_size;
        const int64_t N = ti < N_WEIGHT_TYPES ? NMAX : bs == 1 ? 1001 : bs == 32 ? 32 * 37 : 256 * 5;
        if (N % kp_dtype_get(wt)->block_size != 0) continue;
        const size_t wrs = kp_dtype_row_size(wt, N), ars = kp_dtype_row_size(at, N);
        uint8_t *w = malloc(R * wrs), *a = malloc(C * ars);
        CHECK(w && a);
        if (!w || !a) {
            free(w);
            free(a);
            continue;
        }
        for (int r = 0; r < R; r++) {
            gauss_row(xf, N, 0.1f);
            CHECK(kp_quantize_row(wt, xf, w + r * wrs, N));
            ref_decode(wt, w + r * wrs, N, dw + (size_t)r * N);
        }
        for (int c = 0; c < C; c++) {
            gauss_row(xf, N, 1.0f);
            kp_kernels_scalar()->quantize_act[wt](xf, a + c * ars, N);
            ref_decode(at, a + c * ars, N, da + (size_t)c * N);
            if (at == KP_DTYPE_Q8_0) kp_q8_0_aux_row(a + c * ars, aux[c], N);
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                double s = 0, m = 0;
                for (int64_t i = 0; i < N; i++) {
                    s += dw[(size_t)r * N + i] * da[(size_t)c * N + i];
                    m += fabs(dw[(size_t)r * N + i] * da[(size_t)c * N + i]);
                }
                want[r * C + c] = s;
                mag[r * C + c] = m;
            }
        const double rel = 1e-5 + 4e-7 * sqrt((double)N);
        for (int k = 0; k < 4 * 2; k++) { /* each table, without and with aux */
            const kp_kernels *K = tabs[k / 2];
            const int with_aux = k % 2;
            /* (the scalar table has no Q5_K gemm: callers cover it with dot_tile) */
            if (!K || !K->gemm[wt] || (with_aux && at != KP_DTYPE_Q8_0)) continue;
            /* each output alone: every shape must reproduce it bit for bit */
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++)
                    K->gemm[wt](N, 1, 1, w + r * wrs, wrs, a + c * ars, ars, NULL, 0, &single[r * C + c], 1);
            int differ = 0;
            for (int r = 0; r + 4 <= R; r += 4) /* dot_tile too */
                for (int c = 0; c + 4 <= C; c += 4) {
                    float t[4 * 4];
                    K->dot_tile[wt](N, 4, 4, w + r * wrs, wrs, a + c * ars, ars, t, 4);
                    for (int i = 0; i < 16; i++)
                        differ += memcmp(&t[i], &single[(r + i % 4) * C + c + i / 4], sizeof(float)) != 0;
                }
            CHECK_MSG(differ == 0, "%s %s n=%lld: dot_tile differs from gemm 1 x 1 in %d outputs", K->name,
                      kp_dtype_name(wt), (long long)N, differ);
            if (k / 2 == 1) memcpy(first, single, sizeof single);
            /* for the integer types avx512vnni computes what avx2 computes (its
             * float tiles have 16 lanes, so a summation order of their own) */
            if (k / 2 >= 2 && tabs[1] && kp_dtype_get(wt)->block_size > 1)
                CHECK_MSG(memcmp(first, single, sizeof single) == 0, "%s %s n=%lld: avx2 and %s differ",
                          kp_dtype_name(wt), K->name, (long long)N, K->name);
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int nr = shapes[si][0], nc = shapes[si][1], r0 = shapes[si][2], c0 = shapes[si][3];
                for (int i = 0; i < C * OS; i++) out[i] = -12345.0f;
                K->gemm[wt](N, nr, nc, w + r0 * wrs, wrs, a + c0 * ars, ars, with_aux ? aux[c0] : NULL,
                            sizeof aux[0], out, OS);
                int bad = 0, clobbered = 0, not_same = 0;
                for (int c = 0; c < C; c++)
                    for (int r = 0; r < OS; r++) {
                        const float v = out[c * OS + r];
                        if (c < nc && r < nr) {
                            const int ix = (r0 + r) * C + (c0 + c);
                            bad += !(fabs(v - want[ix]) <= rel * mag[ix]);
                            not_same += memcmp(&v, &single[ix], sizeof v) != 0;
                        } else {
                            clobbered += v != -12345.0f;
                        }
                    }
                n_checked++;
                CHECK_MSG(bad == 0 && clobbered == 0, "%s %s gemm %dx%d at (%d,%d)%s: %d wrong, %d clobbered",
                          K->name, kp_dtype_name(wt), nr, nc, r0, c0, with_aux ? " with aux" : "", bad, clobbered);
                CHECK_MSG(not_same == 0, "%s %s n=%lld gemm %dx%d at (%d,%d)%s: %d outputs differ from 1 x 1 calls",
                          K->name, kp_dtype_name(wt), (long long)N, nr, nc, r0, c0, with_aux ? " with aux" : "",
                          not_same);
                /* the repacked layout: the same bits as the rows in place, padding never stored */
                if (K->pack_rows[wt] <= 0) continue;
                CHECK(K->pack_k[wt] > 0);
                if (K->pack_k[wt] <= 0 || N % K->pack_k[wt] != 0) continue;
                const size_t pb = kp_pack_bytes(wt, N, nr, K->pack_rows[wt]);
                uint8_t *pk = malloc(pb);
                CHECK(pk != NULL && pb >= (size_t)nr * wrs);
                if (!pk) continue;
                memset(pk, 0xA5, pb);
                K->pack[wt](N, nr, w + r0 * wrs, wrs, pk);
                for (int i = 0; i < C * OS; i++) out[i] = -12345.0f;
                K->gemm_packed[wt](N, nr, nc, pk, a + c0 * ars, ars, with_aux ? aux[c0] : NULL, sizeof aux[0], out, OS);
                free(pk);
                not_same = clobbered = 0;
                for (int c = 0; c < C; c++)
                    for (int r = 0; r < OS; r++) {
                        const float v = out[c * OS + r];
                        if (c < nc && r < nr) not_same += memcmp(&v, &single[(r0 + r) * C + (c0 + c)], sizeof v) != 0;
                        else clobbered += v != -12345.0f;
                    }
                n_packed++;
                CHECK_MSG(not_same == 0 && clobbered == 0,
                          "%s %s n=%lld packed gemm %dx%d at (%d,%d)%s: %d outputs differ from gemm, %d clobbered",
                          K->name, kp_dtype_name(wt), (long long)N, nr, nc, r0, c0, with_aux ? " with aux" : "",
                          not_same, clobbered);
            }
        }
        free(w);
        free(a);
    }
    CHECK(n_checked > 0);
    /* the avx512vnni table packs Q8_0, Q4_0 and MXFP4 (every shape x 2 aux
     * modes x 3 types), Q4_K, Q5_K and Q6_K (every shape; Q8_K activations
     * take no aux) at both lengths, F16 and BF16 at the length that is a
     * multiple of 16 */
    if (tabs[2])
        CHECK_EQ_INT(n_packed, (int)(sizeof shapes / sizeof shapes[0]) * ((3 * 2 + 3) * 2 + 2) * (tabs[3] ? 2 : 1));
    else SKIP("packed gemm (this CPU has no avx512vnni table)");
    if (!tabs[3]) SKIP("table avx512bf16 (this CPU lacks AVX512_BF16)");
done:
    free(dw);
    free(da);
    free(want);
    free(mag);
    free(out);
}

/* kp_q8_0_aux_row against its definition, on blocks with extreme sums. */
static void test_q8_0_aux(void) {
    enum { NB = 5 };
    uint8_t blocks[NB * 34];
    kp_q8_0_aux aux[NB];
    for (int b = 0; b < NB; b++) {
        uint8_t *blk = blocks + 34 * b;
        const uint16_t h = (uint16_t)(0x3C00 + 0x111 * b); /* 1.0 and up */
        blk[0] = (uint8_t)(h & 0xFF);
        blk[1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 32; j++)
            blk[2 + j] = (uint8_t)(b == 0 ? 0x80 : b == 1 ? 0x7F : (int8_t)(rng_u64() & 0xFF));
    }
    kp_q8_0_aux_row(blocks, aux, NB * 32);
    for (int b = 0; b < NB; b++) {
        const uint8_t *blk = blocks + 34 * b;
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)blk[2 + j];
        CHECK_EQ_INT(aux[b].bias, -128 * sum);
        CHECK(aux[b].d == (float)le_half(blk));
    }
    CHECK_EQ_INT(aux[0].bias, 128 * 128 * 32);
    CHECK_EQ_INT(aux[1].bias, -128 * 127 * 32);
}

static void test_attention_helpers(void) {
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
    static const int64_t lens[] = {0, 1, 7, 8, 33, 130};
    float x[130], y[130], y0[130], yf[130];
    uint16_t h[130];
    for (int k = 0; k < 2; k++) {
        const kp_kernels *K = tabs[k];
        if (!K) continue;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li];
            gauss_row(x, 130, 1.0f);
            gauss_row(y, 130, 1.0f);
            kp_fp32_to_fp16_row(y, h, 130);
            double d1 = 0, d2 = 0, m = 0;
            for (int64_t i = 0; i < n; i++) {
                d1 += (double)x[i] * y[i];
                d2 += (double)x[i] * ref_half(h[i]);
                m += fabs((double)x[i] * y[i]);
            }
            CHECK_NEAR(K->dot_f32(n, x, y), d1, 1e-6 * m + 1e-7);
            CHECK_NEAR(K->dot_f32_f16(n, x, h), d2, 1e-6 * m + 1e-7);
            const float a = rng_gauss();
            memcpy(y0, y, sizeof y0);
            memcpy(yf, y, sizeof yf);
            K->axpy_f32(n, a, x, y0);
            K->axpy_f16(n, a, h, yf);
            int bad = 0;
            for (int64_t i = 0; i < 130; i++) {
                const double e0 = i < n ? y[i] + (double)a * x[i] : y[i];
                const double e1 = i < n ? y[i] + (double)a * ref_half(h[i]) : y[i];
                bad += !(fabs(y0[i] - e0) <= 1e-6 * (fabs(e0) + fabs(a * x[i])) + 1e-7);
                bad += !(fabs(yf[i] - e1) <= 1e-6 * (fabs(e1) + fabs(a * ref_half(h[i]))) + 1e-7);
            }
            CHECK_MSG(bad == 0, "%s axpy n=%lld: %d wrong", K->name, (long long)n, bad);
        }
    }
}

static void test_api_edges(void) {
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_F32), KP_DTYPE_F32);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_F16), KP_DTYPE_F16);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_BF16), KP_DTYPE_BF16);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q8_0), KP_DTYPE_Q8_0);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q4_0), KP_DTYPE_Q8_0);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q4_K), KP_DTYPE_Q8_K);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q6_K), KP_DTYPE_Q8_K);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_Q3_K), KP_DTYPE_COUNT_);

    float x[64] = {0}, y[64];
    uint8_t q[256];
    CHECK(!kp_quantize_row(KP_DTYPE_Q2_K, x, q, 256));
    CHECK(!kp_quantize_row(KP_DTYPE_Q8_0, x, q, 33));
    CHECK(!kp_dequantize_row(KP_DTYPE_IQ4_NL, q, y, 32));
    CHECK(!kp_dequantize_row(KP_DTYPE_Q4_K, q, y, 32));
    CHECK(!kp_dequantize_row((kp_dtype)5, q, y, 32)); /* no such type id */
    CHECK(kp_quantize_row(KP_DTYPE_F16, x, q, 0));

    /* every weight type with kernels has all entries in both tables, others none
     * (Q8_K has kernels in dtype.h's sense, a dequantizer, but is no weight type) */
    const kp_kernels *tabs[4] = {kp_kernels_scalar(), kp_kernels_avx2(), kp_kernels_avx512vnni(),
                                 kp_kernels_avx512bf16()};
    for (int k = 0; k < 4; k++) {
        if (!tabs[k]) continue;
        for (uint32_t t = 0; t < KP_DTYPE_COUNT_; t++) {
            const kp_dtype_info *info = kp_dtype_get(t);
            const bool want = info && info->has_kernels && t != KP_DTYPE_Q8_K;
            CHECK_MSG((tabs[k]->vec_dot[t] != NULL) == want && (tabs[k]->dot_tile[t] != NULL) == want &&
                          (tabs[k]->quantize_act[t] != NULL) == want,
                      "%s table entries for %s", tabs[k]->name, kp_dtype_name(t));
            /* gemm is optional, but the types this module owns have one everywhere */
            const kp_dtype own[] = {KP_DTYPE_F32,  KP_DTYPE_F16,  KP_DTYPE_BF16, KP_DTYPE_Q8_0,
                                    KP_DTYPE_Q4_0, KP_DTYPE_Q4_K, KP_DTYPE_Q6_K};
            for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
                if (own[i] == (kp_dtype)t) CHECK_MSG(tabs[k]->gemm[t] != NULL, "%s gemm for %s", tabs[k]->name, kp_dtype_name(t));
            if (!want) CHECK_MSG(tabs[k]->gemm[t] == NULL, "%s gemm for %s", tabs[k]->name, kp_dtype_name(t));
        }
    }
    CHECK_EQ_STR(kp_kernels_scalar()->name, "scalar");
    if (kp_kernels_avx512bf16()) {
        CHECK(kp_kernels_avx512vnni() != NULL && kp_kernels_avx2() != NULL);
        CHECK(kp_kernels_best() == kp_kernels_avx512bf16());
        CHECK_EQ_STR(kp_kernels_avx512bf16()->name, "avx512bf16");
#if defined(__x86_64__)
        CHECK(__builtin_cpu_supports("avx512bf16"));
#endif
    } else if (kp_kernels_avx512vnni()) {
        CHECK(kp_kernels_avx2() != NULL);
        CHECK(kp_kernels_best() == kp_kernels_avx512vnni());
        CHECK_EQ_STR(kp_kernels_avx512vnni()->name, "avx512vnni");
    } else if (kp_kernels_avx2()) {
        CHECK(kp_kernels_best() == kp_kernels_avx2());
    } else {
        CHECK(kp_kernels_best() == kp_kernels_scalar());
    }
}

/* Q8_0 activations at the rounding's edges: blocks whose scaled values
 * land on every half (ties round away from zero, as roundf), all-zero
 * blocks (d = 0) among full groups of 8 blocks and in the tail, blocks
 * whose largest |x| is negative, and tiny scales: the avx2 table's bytes
 * equal the reference quantizer's (kp_quantize_row, ggml's rounding). */
static void test_act_q8_0_edges(void) {
    enum { NB = 19, N = NB * 32 };
    static float x[N];
    static uint8_t ref[NB * 34], got[NB * 34];
    for (int b = 0; b < NB; b++) {
        float *xb = x + 32 * b;
        const int kind = b % 5;
        for (int j = 0; j < 32; j++) {
            if (kind == 0) /* d = 1: t = x: halves, and the largest floats below 1/2 */
                xb[j] = j == 0 ? 127.0f : j == 2 ? 0.49999997f : j == 3 ? -0.49999997f : (float)(j * 4 - 64) + 0.5f;
            else if (kind == 1) xb[j] = 0.0f;
            else if (kind == 2) xb[j] = j == 5 ? -63.5f : (float)(j - 16) / 2 + 0.25f; /* d = 1/2: t = 2x */
            else if (kind == 3) xb[j] = (float)(j - 16) * 1e-30f;
            else xb[j] = (float)((int)(rng_u64() % 2001) - 1000) / 8.0f; /* eighths: many exact halves */
        }
    }
    const kp_kernels *avx = kp_kernels_avx2();
    CHECK(kp_quantize_row(KP_DTYPE_Q8_0, x, ref, N));
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), avx};
    for (int k = 0; k < 2; k++) {
        if (!tabs[k]) {
            printf("  test_act_q8_0_edges: no avx2 table on this CPU (AVX2, FMA, F16C): scalar only\n");
            continue;
        }
        for (int nb = 1; nb <= NB; nb += 6) { /* tails of 1, 7 and 5 blocks past groups of 8 */
            memset(got, 0xAA, sizeof got);
            tabs[k]->quantize_act[KP_DTYPE_Q8_0](x, got, nb * 32);
            CHECK_MSG(memcmp(got, ref, (size_t)nb * 34) == 0, "%s quantize_act[Q8_0] of %d blocks differs from the "
                      "reference", tabs[k]->name, nb);
        }
    }
    /* the ties themselves (block 0, d = 1): x[1] = -59.5 -> -60, x[31] = 60.5 -> 61, away from zero */
    CHECK_EQ_INT((int8_t)ref[2 + 1], -60);
    CHECK_EQ_INT((int8_t)ref[2 + 31], 61);
    CHECK_EQ_INT((int8_t)ref[2 + 0], 127);
    CHECK_EQ_INT((int8_t)ref[2 + 2], 0);
    CHECK_EQ_INT((int8_t)ref[2 + 3], 0);
}

int main(void) {
    const char *env = getenv("KP_TEST_SEED");
    const uint64_t seed = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock() << 32;
    rng_state = seed ? seed : 1;
    printf("quant: kernels in use: %s\n", kp_kernels_best()->name);

    RUN(test_fp16_exhaustive);
    RUN(test_fp16_rounding);
    RUN(test_bf16);
    RUN(test_dequantize_random_blocks);
    RUN(test_dequantize_hand_blocks);
    RUN(test_quant_roundtrip_bounds);
    RUN(test_kquant_quality);
    RUN(test_nonfinite_inputs);
    RUN(test_matches_llama_quantize);
    RUN(test_vec_dot_and_tiles);
    RUN(test_q8_0_aux);
    RUN(test_act_q8_0_edges);
    RUN(test_tile_shapes);
    RUN(test_attention_helpers);
    RUN(test_api_edges);
    if (harness_failed) fprintf(stderr, "quant: random seed was %llu (rerun with KP_TEST_SEED=%llu)\n",
                                (unsigned long long)seed, (unsigned long long)seed);
    return harness_finish("quant");
}
