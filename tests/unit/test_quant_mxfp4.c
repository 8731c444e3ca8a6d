/*
 * test_quant_mxfp4.c - the MXFP4 weight type (src/kernels/quant_*.c,
 * reached through quant.h): dequantizer, reference quantizer, and the dot
 * products of every kernel table.
 *
 * References, none taken from kvpin's own output:
 *   - llama.cpp's quantize_row_mxfp4_ref on 64 chosen blocks
 *     (tests/data/quant_more/mxfp4_ref.bin, tools/llamacpp_mxfp4_ref.c):
 *     the same bytes;
 *   - a float64 decoder written here from the OCP Microscaling Formats
 *     spec v1.0 (E8M0 scale 2^(e - 127); E2M1 element: sign bit 3,
 *     exponent bits 2..1 with bias 1, mantissa bit 0, exponent 0 being
 *     subnormal 0.5 x m) and ggml's block layout (byte 0 the scale, byte
 *     1 + j elements j (low nibble) and 16 + j (high nibble));
 *   - hand blocks whose codes follow from that definition, and the
 *     quantizer's rule as llama.cpp states it (quantize_row_mxfp4_ref):
 *     e = floor(log2(amax)) - 2 + 127, each element the nearest value on
 *     that scale, ties to the lower code; checked here with frexp and a
 *     search over the 16 decoded values;
 *   - float64 dot products of the decoded weights and the Q8_0 activations,
 *     which every table must match within float rounding (a bound of one
 *     rounding per block and step, the block sums being exact integers);
 *   - quant.h's contract: within a table gemm and dot_tile give each output
 *     bit for bit the same value for every call shape, and the scalar, avx2
 *     and avx512vnni tables (integer block sums, one fused multiply-add per
 *     block) agree bit for bit.
 * Random inputs use a fresh seed each run (KP_TEST_SEED=<n> replays one).
 */
#include "harness.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "base/rng.h"
#include "gguf/dtype.h"
#include "kernels/quant.h"

static kp_rng rng;

/* A standard normal (Box-Muller on kvpin's reproducible uniforms). */
static float rng_gauss(void) {
    const double u1 = kp_rng_unit(&rng) + 0x1p-60, u2 = kp_rng_unit(&rng);
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

/* E2M1 from its bits, as the spec defines it. */
static double spec_e2m1(unsigned code) {
    const int s = (code >> 3) & 1, ex = (code >> 1) & 3, m = code & 1;
    const double v = ex == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, ex - 1);
    return s ? -v : v;
}

/* Element i of an MXFP4 row (17-byte blocks) as the spec decodes it. */
static double spec_elem(const uint8_t *row, int64_t i) {
    const uint8_t *b = row + (i / 32) * 17;
    const int j = (int)(i % 32);
    const unsigned code = j < 16 ? b[1 + j] & 15 : b[1 + j - 16] >> 4;
    return ldexp(spec_e2m1(code), (int)b[0] - 127);
}

static void test_type(void) {
    const kp_dtype_info *t = kp_dtype_get(KP_DTYPE_MXFP4);
    CHECK(t && t->has_kernels);
    CHECK_EQ_INT(t->block_size, 32);
    CHECK_EQ_INT(t->type_size, 17);
    CHECK_EQ_INT(kp_dtype_row_size(KP_DTYPE_MXFP4, 96), 51);
    CHECK_EQ_INT(kp_vec_dot_type(KP_DTYPE_MXFP4), KP_DTYPE_Q8_0);
}

/* Every code at several scales, the subnormal scales included. */
static void test_dequantize(void) {
    static const uint8_t scales[] = {0, 1, 2, 100, 127, 128, 200, 250}; /* 254 x 6 overflows a float */
    uint8_t row[8 * 17];
    float y[8 * 32];
    for (int b = 0; b < 8; b++) {
        row[b * 17] = scales[b];
        for (int j = 0; j < 16; j++) row[b * 17 + 1 + j] = (uint8_t)(j | (15 - j) << 4);
    }
    CHECK(kp_dequantize_row(KP_DTYPE_MXFP4, row, y, 8 * 32));
    int bad = 0;
    for (int64_t i = 0; i < 8 * 32; i++) bad += (double)y[i] != spec_elem(row, i);
    CHECK_MSG(bad == 0, "%d elements differ from the spec's decoding", bad);
    /* 6 x 2^0 and -6 x 2^0 in the block of scale 127: codes 7 and 15 (elements 7, 16) */
    CHECK(y[4 * 32 + 7] == 6.0f && y[4 * 32 + 16] == -6.0f);
    CHECK(!kp_dequantize_row(KP_DTYPE_MXFP4, row, y, 33));
}

/* Hand block: amax 6 gives e = 2 - 2 + 127, so the step is 0.5 x 2^0 in
 * doubled values; 0.25 lies halfway between codes 0 (0) and 1 (0.5): the
 * lower code wins; 1.75 halfway between 1.5 (3) and 2 (4): code 3. */
static void test_quantize_hand(void) {
    float x[32] = {6, 3, -1.5f, 0.25f, 1.75f, -6, 0.74f, 100.0f / 16};
    uint8_t q[17];
    CHECK(kp_quantize_row(KP_DTYPE_MXFP4, x, q, 32));
    CHECK_EQ_INT(q[0], 127);
    CHECK_EQ_INT(q[1] & 15, 7);   /* 6 -> 6: scale 2^(127-127) x E2M1 6 */
    CHECK_EQ_INT(q[2] & 15, 5);   /* 3 */
    CHECK_EQ_INT(q[3] & 15, 11);  /* -1.5: sign | 3 */
    CHECK_EQ_INT(q[4] & 15, 0);   /* 0.25: tie to the lower code */
    CHECK_EQ_INT(q[5] & 15, 3);   /* 1.75: tie to the lower code (1.5) */
    CHECK_EQ_INT(q[6] & 15, 15);  /* -6 */
    CHECK_EQ_INT(q[7] & 15, 1);   /* 0.74 -> 0.5 */
    CHECK_EQ_INT(q[8] & 15, 7);   /* 6.25 -> 6 */
    float z[32] = {0};
    CHECK(kp_quantize_row(KP_DTYPE_MXFP4, z, q, 32));
    CHECK_EQ_INT(q[0], 0);
}

/* llama.cpp's own encodings (tests/data/quant_more/mxfp4_ref.bin, made by
 * tools/llamacpp_mxfp4_ref.c with quantize_row_mxfp4_ref): the same bytes. */
static void test_matches_llama_cpp(void) {
    size_t len = 0;
    uint8_t *f = (uint8_t *)harness_read_file(harness_path("tests/data/quant_more/mxfp4_ref.bin"), &len);
    CHECK_MSG(f && len >= 8 && memcmp(f, "KPMX", 4) == 0, "mxfp4_ref.bin missing or not KPMX");
    if (!f || len < 8) {
        free(f);
        return;
    }
    uint32_t nb;
    memcpy(&nb, f + 4, 4);
    CHECK_EQ_INT(len, 8 + (size_t)nb * 32 * 4 + (size_t)nb * 17);
    if (len == 8 + (size_t)nb * 32 * 4 + (size_t)nb * 17) {
        float *x = malloc((size_t)nb * 32 * sizeof(float));
        uint8_t *q = malloc((size_t)nb * 17);
        memcpy(x, f + 8, (size_t)nb * 32 * 4);
        CHECK(kp_quantize_row(KP_DTYPE_MXFP4, x, q, (int64_t)nb * 32));
        int bad = 0;
        for (uint32_t b = 0; b < nb; b++) {
            bool same = memcmp(q + b * 17, f + 8 + (size_t)nb * 32 * 4 + b * 17, 17) == 0;
            if (!same) fprintf(stderr, "  block %u differs (scale %u vs %u)\n", b, q[b * 17],
                               f[8 + (size_t)nb * 32 * 4 + b * 17]);
            bad += !same;
        }
        CHECK_MSG(bad == 0, "%d of %u blocks differ from llama.cpp's quantize_row_mxfp4_ref", bad, nb);
        printf("test_quant_mxfp4: %u blocks, %d differ from llama.cpp's quantize_row_mxfp4_ref\n", nb, bad);
        free(x);
        free(q);
    }
    free(f);
}

/* Random rows: the scale is the rule's, and each element the nearest of
 * the 16 values on it (ties to the lower code). */
static void test_quantize_rule(void) {
    enum { N = 32 * 64 };
    static float x[N];
    static uint8_t q[N / 32 * 17];
    int bad_e = 0, bad_q = 0;
    for (int64_t i = 0; i < N; i++) x[i] = rng_gauss() * (float)ldexp(1.0, (int)(i / 32 % 40) - 20);
    CHECK(kp_quantize_row(KP_DTYPE_MXFP4, x, q, N));
    for (int64_t b = 0; b < N / 32; b++) {
        double amax = 0;
        for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[b * 32 + j]));
        int ex;
        frexp(amax, &ex); /* amax = f x 2^ex, f in [0.5, 1): floor(log2) = ex - 1 */
        bad_e += q[b * 17] != ex - 1 - 2 + 127;
        for (int j = 0; j < 32; j++) {
            const double v = x[b * 32 + j], got = spec_elem(q, b * 32 + j);
            for (unsigned c = 0; c < 16; c++) {
                const double alt = ldexp(spec_e2m1(c), (int)q[b * 17] - 127);
                if (fabs(alt - v) < fabs(got - v)) {
                    bad_q++;
                    break;
                }
            }
        }
    }
    CHECK_MSG(bad_e == 0, "%d block scales off the rule", bad_e);
    CHECK_MSG(bad_q == 0, "%d elements not on their nearest value", bad_q);
}

/* Dot products of every table against float64, and the contract's bitwise
 * equalities. */
static void test_dots(void) {
    const kp_kernels *tabs[3] = {kp_kernels_scalar(), kp_kernels_avx2(), kp_kernels_avx512vnni()};
    enum { MAXN = 32 * 40, R = 7, C = 9 };
    static float wf[MAXN], af[MAXN];
    static uint8_t w[R][MAXN / 32 * 17 + 5], a[C][MAXN / 32 * 34];
    static float out[3][C][R], tile[C * R], s;
    static const int blocks[] = {1, 2, 5, 40};
    for (int li = 0; li < 4; li++) {
        const int64_t n = 32 * blocks[li];
        for (int r = 0; r < R; r++) {
            for (int64_t i = 0; i < n; i++) wf[i] = rng_gauss() * 0.02f;
            CHECK(kp_quantize_row(KP_DTYPE_MXFP4, wf, w[r], n));
        }
        for (int c = 0; c < C; c++) {
            for (int64_t i = 0; i < n; i++) af[i] = rng_gauss();
            CHECK(kp_quantize_row(KP_DTYPE_Q8_0, af, a[c], n));
        }
        float ad[MAXN];
        for (int k = 0; k < 3; k++) {
            const kp_kernels *kt = tabs[k];
            if (!kt) continue;
            CHECK(kt->vec_dot[KP_DTYPE_MXFP4] && kt->dot_tile[KP_DTYPE_MXFP4] && kt->gemm[KP_DTYPE_MXFP4]);
            kt->gemm[KP_DTYPE_MXFP4](n, R, C, w, sizeof w[0], a, sizeof a[0], NULL, 0, &out[k][0][0], R);
            int off_ref = 0, off_shape = 0;
            for (int c = 0; c < C; c++) {
                kp_dequantize_row(KP_DTYPE_Q8_0, a[c], ad, n);
                for (int r = 0; r < R; r++) {
                    double ref = 0, mag = 0;
                    for (int64_t i = 0; i < n; i++) {
                        ref += spec_elem(w[r], i) * ad[i];
                        mag += fabs(spec_elem(w[r], i) * ad[i]);
                    }
                    /* exact integer block sums: one rounding per block and step */
                    off_ref += fabs(out[k][c][r] - ref) > (double)(n / 32 + 2) * 0x1p-23 * mag;
                    kt->vec_dot[KP_DTYPE_MXFP4](n, &s, w[r], a[c]);
                    off_shape += s != out[k][c][r];
                }
            }
            for (int nr = 1; nr <= 4; nr++)
                for (int nc = 1; nc <= 4; nc++) {
                    kt->dot_tile[KP_DTYPE_MXFP4](n, nr, nc, w[2], sizeof w[0], a[3], sizeof a[0], tile, nr);
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < nr; r++) off_shape += tile[c * nr + r] != out[k][3 + c][2 + r];
                }
            kt->gemm[KP_DTYPE_MXFP4](n, 3, 5, w[1], sizeof w[0], a[2], sizeof a[0], NULL, 0, tile, 3);
            for (int c = 0; c < 5; c++)
                for (int r = 0; r < 3; r++) off_shape += tile[c * 3 + r] != out[k][2 + c][1 + r];
            /* one activation row (a decode step: rows in groups, then the rest) */
            for (int nr = 1; nr <= R; nr++) {
                kt->gemm[KP_DTYPE_MXFP4](n, nr, 1, w[R - nr], sizeof w[0], a[4], sizeof a[0], NULL, 0, tile, 1);
                for (int r = 0; r < nr; r++) off_shape += tile[r] != out[k][4][R - nr + r];
            }
            CHECK_MSG(off_ref == 0, "%s: %d dots off the float64 reference (n %lld)", kt->name, off_ref,
                      (long long)n);
            CHECK_MSG(off_shape == 0, "%s: %d outputs depend on the call's shape (n %lld)", kt->name, off_shape,
                      (long long)n);
        }
        if (tabs[1] && tabs[2])
            CHECK_MSG(memcmp(out[1], out[2], sizeof out[1]) == 0, "avx2 and avx512vnni differ (n %lld)",
                      (long long)n);
        if (tabs[1]) /* one fused multiply-add per block in every table */
            CHECK_MSG(memcmp(out[0], out[1], sizeof out[0]) == 0, "scalar and avx2 differ (n %lld)", (long long)n);
    }
}

int main(void) {
    const char *seed = getenv("KP_TEST_SEED");
    const uint64_t seed0 = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    kp_rng_seed(&rng, seed0);
    RUN(test_type);
    RUN(test_dequantize);
    RUN(test_quantize_hand);
    RUN(test_matches_llama_cpp);
    RUN(test_quantize_rule);
    RUN(test_dots);
    if (harness_failed) fprintf(stderr, "KP_TEST_SEED=%llu\n", (unsigned long long)seed0);
    return harness_finish("test_quant_mxfp4");
}
