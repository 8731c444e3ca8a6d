/*
 * bench_quant.c - throughput of the quant.h kernels, per weight type and
 * kernel table (scalar, avx2).
 *
 * For each type it builds a weight matrix of rows x K (default K = 4096,
 * about 1 MiB of weights, so the numbers measure the kernels rather than
 * DRAM; -m MiB changes the size) and reports GB/s of weight bytes:
 *
 *   vec_dot      one activation row; every row of the matrix once
 *   tile 4x4     dot_tile over 4 rows x 4 activation rows; weights are read
 *                once for 4 columns. "x4 eq" is weight bytes x 4 / time, the
 *                rate a vec_dot would need to match it column for column.
 *
 * Build:  gcc -std=c11 -O2 -march=native -D_GNU_SOURCE -Isrc -o bench_quant \
 *             tools/bench_quant.c src/quant.c src/quant_avx2.c src/dtype.c -lm
 * Run:    ./bench_quant [-k K] [-m MiB]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "quant.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * 0x1p-24 - 0.5);
}

typedef struct {
    const kp_kernels *k;
    kp_dtype t;
    int64_t K, rows;
    const uint8_t *w;
    size_t wrs;
    const uint8_t *a;
    size_t ars;
    float *out;
} bench_ctx;

static void run_vec_dot(const bench_ctx *c) {
    for (int64_t r = 0; r < c->rows; r++) c->k->vec_dot[c->t](c->K, &c->out[r], c->w + r * c->wrs, c->a);
}

static void run_tile(const bench_ctx *c) {
    for (int64_t r = 0; r + 4 <= c->rows; r += 4)
        c->k->dot_tile[c->t](c->K, 4, 4, c->w + r * c->wrs, c->wrs, c->a, c->ars, &c->out[r * 4], 4);
}

/* Best seconds per call of fn over 15 timed batches of >= 20 ms each (the
 * best, not the mean, so other load on the machine matters less). */
static double time_it(void (*fn)(const bench_ctx *), const bench_ctx *c) {
    int reps = 1;
    double best = 1e30;
    fn(c); /* warm up */
    for (int trial = 0; trial < 15; trial++) {
        double t0 = now_s(), dt;
        for (int i = 0; i < reps; i++) fn(c);
        dt = now_s() - t0;
        if (dt < 0.02) {
            reps *= 2;
            trial--;
            continue;
        }
        if (dt / reps < best) best = dt / reps;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t K = 4096;
    double mib = 1.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-k")) K = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-m")) mib = atof(argv[i + 1]);
    }
    if (K <= 0 || K % 256 != 0 || mib <= 0) {
        fprintf(stderr, "usage: %s [-k K (multiple of 256)] [-m MiB of weights]\n", argv[0]);
        return 2;
    }
    const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_F16, KP_DTYPE_BF16, KP_DTYPE_Q8_0,
                              KP_DTYPE_Q4_0, KP_DTYPE_Q4_K, KP_DTYPE_Q6_K};
    const kp_kernels *tabs[2] = {kp_kernels_scalar(), kp_kernels_avx2()};
    float *xf = malloc((size_t)K * sizeof(float));
    if (!xf) return 1;

    printf("K = %lld, ~%.1f MiB of weights per type; GB/s of weight bytes\n", (long long)K, mib);
    printf("%-6s %-7s %10s %12s %12s %8s\n", "type", "kernels", "vec_dot", "tile 4x4", "x4 eq", "tile/vd");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kp_dtype t = types[ti], at = kp_vec_dot_type(t);
        const size_t wrs = kp_dtype_row_size(t, K), ars = kp_dtype_row_size(at, K);
        int64_t rows = (int64_t)(mib * 1048576.0 / (double)wrs);
        rows = rows < 4 ? 4 : rows & ~(int64_t)3;
        uint8_t *w = malloc((size_t)rows * wrs), *a = malloc(4 * ars);
        float *out = malloc((size_t)rows * 4 * sizeof(float));
        if (!w || !a || !out) return 1;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < K; i++) xf[i] = frand();
            kp_quantize_row(t, xf, w + r * wrs, K);
        }
        for (int c = 0; c < 4; c++) {
            for (int64_t i = 0; i < K; i++) xf[i] = frand();
            kp_kernels_scalar()->quantize_act[t](xf, a + c * ars, K);
        }
        for (int k = 0; k < 2; k++) {
            if (!tabs[k]) continue;
            bench_ctx c = {tabs[k], t, K, rows, w, wrs, a, ars, out};
            const double bytes = (double)rows * (double)wrs;
            const double tv = time_it(run_vec_dot, &c), tt = time_it(run_tile, &c);
            printf("%-6s %-7s %10.2f %12.2f %12.2f %7.2fx\n", kp_dtype_name(t), tabs[k]->name, bytes / tv * 1e-9,
                   bytes / tt * 1e-9, 4 * bytes / tt * 1e-9, 4 * tv / tt);
        }
        free(w);
        free(a);
        free(out);
    }
    free(xf);
    return 0;
}
