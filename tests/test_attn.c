/*
 * test_attn.c - attention inner loops (src/attn.h) against a float64
 * computation, for both tables, F32 and F16 rows, every G up to 8, head
 * sizes with and without the vector path, and row counts around the 4-row
 * unrolling.
 */
#include <stdint.h>
#include <time.h>

#include "attn.h"
#include "harness.h"
#include "quant.h"

static uint64_t rng;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void check_table(const kp_attn_kernels *a) {
    static const int hds[] = {8, 16, 24, 32, 40, 64, 96, 128, 256};
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++) {
        int hd = hds[hi];
        for (int G = 1; G <= 8; G++) {
            int64_t n = 1 + (int64_t)(rng >> 40) % 37;
            int64_t stride = n + 3;
            float *q = malloc(sizeof(float) * G * hd), *k = malloc(sizeof(float) * n * hd);
            uint16_t *kh = malloc(2 * n * hd);
            float *w = malloc(sizeof(float) * G * stride), *out = malloc(sizeof(float) * G * stride);
            float *acc = malloc(sizeof(float) * G * hd), *acc_h = malloc(sizeof(float) * G * hd);
            for (int i = 0; i < G * hd; i++) q[i] = frand();
            for (int64_t i = 0; i < n * hd; i++) {
                kh[i] = kp_fp32_to_fp16(frand());
                k[i] = kp_fp16_to_fp32(kh[i]); /* the same values in both forms */
            }
            for (int64_t i = 0; i < G * stride; i++) w[i] = frand();
            for (int f16 = 0; f16 < 2; f16++) {
                for (int64_t i = 0; i < G * stride; i++) out[i] = 12345.0f;
                if (f16) a->scores_f16(hd, G, q, kh, n, 0.5f, out, stride);
                else a->scores_f32(hd, G, q, k, n, 0.5f, out, stride);
                double worst = 0;
                for (int g = 0; g < G; g++) {
                    for (int64_t i = 0; i < n; i++) {
                        double s = 0;
                        for (int j = 0; j < hd; j++) s += (double)q[g * hd + j] * k[i * hd + j];
                        double d = fabs(s * 0.5 - out[g * stride + i]);
                        worst = d > worst ? d : worst;
                    }
                    CHECK(out[g * stride + n] == 12345.0f); /* nothing past the rows */
                }
                CHECK_MSG(worst < 1e-4 * hd, "%s scores f16=%d hd=%d G=%d n=%lld: %g", a->name, f16, hd, G,
                          (long long)n, worst);
                for (int i = 0; i < G * hd; i++) acc[i] = acc_h[i] = frand();
                if (f16) a->accum_f16(hd, G, w, stride, kh, n, acc);
                else a->accum_f32(hd, G, w, stride, k, n, acc);
                worst = 0;
                for (int g = 0; g < G; g++)
                    for (int j = 0; j < hd; j++) {
                        double s = acc_h[g * hd + j];
                        for (int64_t i = 0; i < n; i++) s += (double)w[g * stride + i] * k[i * hd + j];
                        double d = fabs(s - acc[g * hd + j]);
                        worst = d > worst ? d : worst;
                    }
                CHECK_MSG(worst < 1e-4 * n, "%s accum f16=%d hd=%d G=%d n=%lld: %g", a->name, f16, hd, G,
                          (long long)n, worst);
            }
            free(q); free(k); free(kh); free(w); free(out); free(acc); free(acc_h);
        }
    }
}

static void test_scalar(void) { check_table(kp_attn_scalar()); }
static void test_best(void) { check_table(kp_attn_best()); }

int main(void) {
    rng = (uint64_t)time(NULL);
    printf("test_attn seed %llu, best table %s\n", (unsigned long long)rng, kp_attn_best()->name);
    RUN(test_scalar);
    RUN(test_best);
    return harness_finish("attn");
}
