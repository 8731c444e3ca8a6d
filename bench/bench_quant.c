/*
 * bench_quant.c - throughput of the quant.h kernels, per weight type and
 * kernel table (scalar, avx2, avx512vnni).
 *
 * For each type it builds a weight matrix of rows x K (default K = 4096,
 * about 1 MiB of weights, so the numbers measure the kernels rather than
 * DRAM; -m MiB changes the size) and reports GB/s of weight bytes:
 *
 *   vec_dot      one activation row; every row of the matrix once
 *   tile 4x4     dot_tile over 4 rows x 4 activation rows; weights are read
 *                once for 4 columns. "x4 eq" is weight bytes x 4 / time, the
 *                rate a vec_dot would need to match it column for column.
 *                (The forward pass calls gemm; dot_tile is its fallback.)
 *   decode       one activation row, in the forward pass's call shape: gemm
 *                over 16 rows x 1 column (dot_tile 4 x 1 where a table has
 *                no gemm for the type); with -m larger than the caches this
 *                is the rate decode streams weights at
 *
 * and, for the shape the forward pass uses in prefill, GMAC/s (multiply-adds
 * per second):
 *
 *   prefill      gemm over 16 weight rows x N activation rows (-n N,
 *                default 512), once per 16 rows of a matrix of 64 rows
 *                (so the weights stay in cache, as in one thread's share
 *                of a product), activations converted beforehand (with
 *                kp_q8_0_aux rows for Q8_0 activations, as the forward pass
 *                passes them). SIMD tables only (the scalar column shows 0).
 *   packed       the same on the table's repacked layout (gemm_packed),
 *                which the forward pass uses where the table has one (0:
 *                none); with the share of a core's peak for the table's
 *                instruction, in multiply-adds a cycle at the clock the
 *                int8 pipes line below measures (its vpdpbusd rate alone /
 *                2): 64 for int8 dot products (two 256-bit vpdpbusd), 32
 *                for bfloat16 ones (two vdpbf16ps), 16 for F32 FMA (F32,
 *                F16, and BF16 outside the avx512bf16 table)
 *
 * and, on CPUs with AVX512_VNNI, the ceiling the integer prefill panels'
 * instruction mix allows (one thread): 256-bit vpdpbusd alone, then with
 * the float scaling of a Q8_0/Q4_0 block (a vmulps and a vfmadd231ps per 8
 * vpdpbusd: one 32-quant block of 8 rows x 1 activation row) and with a
 * K-quant sub-block's scale and mins (a vpmulld and a vpdpwssd per 8),
 * which issue on the same two pipes as vpdpbusd where the CPU shares them
 * (Zen 4: 80% of vpdpbusd alone for both).
 *
 * Build:  make build/rel/bench_quant, or alone (dispatch.c, which picks the
 *         tables, knows the attention tables too):
 *         gcc -std=c11 -O2 -march=native -D_GNU_SOURCE -Isrc -o bench_quant bench/bench_quant.c \
 *             src/kernels/dispatch.c src/kernels/quant_ref.c src/kernels/quant_scalar.c \
 *             src/kernels/quant_avx2.c src/kernels/quant_avx512.c src/kernels/attn_scalar.c \
 *             src/kernels/attn_avx2.c src/kernels/attn_avx512.c src/gguf/dtype.c -lm
 * Run:    ./bench_quant [-k K] [-m MiB] [-n N] [-t TYPE]
 *         (-k 576 or 1536 for SmolLM2-135M's shapes; K a multiple of 32,
 *         types whose block size does not divide K are skipped)
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "gguf/dtype.h"
#include "kernels/quant.h"

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
    int64_t n_cols;          /* prefill: activation rows */
    const kp_q8_0_aux *aux;  /* Q8_0 activations: their aux rows, as the forward pass has them */
    size_t aux_stride;
    const uint8_t *pk;       /* the first PF_ROWS rows repacked (gemm_packed), or NULL */
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
enum { PF_ROWS = 64, PF_TASK = 16 };

static void run_prefill(const bench_ctx *c) {
    for (int64_t r = 0; r < PF_ROWS; r += PF_TASK)
        c->k->gemm[c->t](c->K, PF_TASK, (int)c->n_cols, c->w + r * c->wrs, c->wrs, c->a, c->ars, c->aux,
                         c->aux_stride, &c->out[r], PF_ROWS);
}

static void run_packed(const bench_ctx *c) {
    for (int64_t r = 0; r < PF_ROWS; r += PF_TASK)
        c->k->gemm_packed[c->t](c->K, PF_TASK, (int)c->n_cols, c->pk + r * c->wrs, c->a, c->ars, c->aux,
                                c->aux_stride, &c->out[r], PF_ROWS);
}

static void run_decode(const bench_ctx *c) {
    for (int64_t r = 0; r + PF_TASK <= c->rows; r += PF_TASK) {
        if (c->k->gemm[c->t]) {
            c->k->gemm[c->t](c->K, PF_TASK, 1, c->w + r * c->wrs, c->wrs, c->a, c->ars, c->aux, c->aux_stride,
                             &c->out[r], PF_TASK);
        } else {
            for (int64_t q = r; q < r + PF_TASK; q += 4)
                c->k->dot_tile[c->t](c->K, 4, 1, c->w + q * c->wrs, c->wrs, c->a, c->ars, &c->out[q], 4);
        }
    }
}

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

#if defined(__x86_64__)
/* 12 independent vpdpbusd chains (4-cycle latency, 2 a cycle: 8 needed)
 * per pass, then `extra` (0: none, 1: vmulps + vfmadd231ps x 1.5, 2:
 * vpmulld + vpdpwssd x 1.5): 12 : 3, the 8 : 2 of the panels' blocks.
 * Returns vpdpbusd a second. */
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni"))) static double dpbusd_rate_vnni(int extra) {
    const long n = 50000000;
    const double t0 = now_s();
    for (long i = 0; i < n / 12; i++) {
        __asm__ volatile("vpdpbusd %%ymm14, %%ymm15, %%ymm0\n\tvpdpbusd %%ymm14, %%ymm15, %%ymm1\n\t"
                         "vpdpbusd %%ymm14, %%ymm15, %%ymm2\n\tvpdpbusd %%ymm14, %%ymm15, %%ymm3\n\t"
                         "vpdpbusd %%ymm14, %%ymm15, %%ymm4\n\tvpdpbusd %%ymm14, %%ymm15, %%ymm5\n\t"
                         "vpdpbusd %%ymm14, %%ymm15, %%ymm6\n\tvpdpbusd %%ymm14, %%ymm15, %%ymm7\n\t"
                         "vpdpbusd %%ymm14, %%ymm15, %%ymm8\n\tvpdpbusd %%ymm14, %%ymm15, %%ymm9\n\t"
                         "vpdpbusd %%ymm14, %%ymm15, %%ymm10\n\tvpdpbusd %%ymm14, %%ymm15, %%ymm11\n\t" ::
                             : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                               "xmm10", "xmm11");
        if (extra == 1)
            __asm__ volatile("vmulps %%ymm14, %%ymm15, %%ymm16\n\tvfmadd231ps %%ymm14, %%ymm15, %%ymm17\n\t"
                             "vfmadd231ps %%ymm14, %%ymm15, %%ymm18\n\t" ::
                                 : "xmm16", "xmm17", "xmm18");
        else if (extra == 2)
            __asm__ volatile("vpmulld %%ymm14, %%ymm15, %%ymm16\n\tvpdpwssd %%ymm14, %%ymm15, %%ymm17\n\t"
                             "vpmulld %%ymm14, %%ymm15, %%ymm18\n\t" ::
                                 : "xmm16", "xmm17", "xmm18");
    }
    return (double)(n / 12 * 12) / (now_s() - t0);
}

static bool have_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}

/* vpdpbusd a second with that mix, the best of 3; 0 without AVX512_VNNI. */
static double int8_pipe_rate(int extra) {
    double best = 0;
    for (int k = 0; have_vnni() && k < 3; k++) {
        const double x = dpbusd_rate_vnni(extra);
        if (x > best) best = x;
    }
    return best;
}

static void print_int8_ceiling(void) {
    if (!have_vnni()) {
        printf("int8 pipes: skipped (no AVX512_VNNI on this CPU)\n");
        return;
    }
    double r[3];
    for (int e = 0; e < 3; e++) r[e] = int8_pipe_rate(e);
    printf("int8 pipes, one thread, 256-bit vpdpbusd (32 MACs): alone %.1f GMAC/s; with a Q8_0/Q4_0 block's "
           "scaling %.1f (%.0f%%); with a K-quant sub-block's scale and mins %.1f (%.0f%%)\n",
           r[0] * 32e-9, r[1] * 32e-9, 100 * r[1] / r[0], r[2] * 32e-9, 100 * r[2] / r[0]);
}
#else
static double int8_pipe_rate(int extra) {
    (void)extra;
    return 0;
}
static void print_int8_ceiling(void) {}
#endif

int main(int argc, char **argv) {
    int64_t K = 4096, N = 512;
    double mib = 1.0;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-k")) K = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-m")) mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) N = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) only = argv[i + 1];
    }
    if (K <= 0 || K % 32 != 0 || mib <= 0 || N <= 0) {
        fprintf(stderr, "usage: %s [-k K (multiple of 32)] [-m MiB of weights] [-n N] [-t TYPE]\n", argv[0]);
        return 2;
    }
    const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_F16, KP_DTYPE_BF16, KP_DTYPE_Q8_0,
                              KP_DTYPE_Q4_0, KP_DTYPE_Q4_1, KP_DTYPE_Q5_0, KP_DTYPE_Q5_1,
                              KP_DTYPE_Q4_K, KP_DTYPE_Q5_K, KP_DTYPE_Q6_K};
    enum { N_TABS = 4 };
    const kp_kernels *tabs[N_TABS] = {kp_kernels_scalar(), kp_kernels_avx2(), kp_kernels_avx512vnni(),
                                      kp_kernels_avx512bf16()};
    float *xf = malloc((size_t)K * sizeof(float));
    if (!xf) return 1;

    printf("K = %lld, ~%.1f MiB of weights per type; GB/s of weight bytes; prefill: 16 rows x %lld\n",
           (long long)K, mib, (long long)N);
    const double ghz = int8_pipe_rate(0) / 2e9; /* 2 vpdpbusd a cycle where the CPU has them (else 0) */
    printf("%-6s %-10s %10s %12s %12s %8s %10s %14s %14s\n", "type", "kernels", "vec_dot", "tile 4x4", "x4 eq",
           "tile/vd", "decode", "prefill GMAC/s", "packed GMAC/s");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kp_dtype t = types[ti], at = kp_vec_dot_type(t);
        if (only && strcasecmp(only, kp_dtype_name(t)) != 0) continue;
        if (K % kp_dtype_get(t)->block_size != 0) continue; /* K-quants need K % 256 == 0 */
        const size_t wrs = kp_dtype_row_size(t, K), ars = kp_dtype_row_size(at, K);
        int64_t rows = (int64_t)(mib * 1048576.0 / (double)wrs);
        rows = rows < PF_ROWS ? PF_ROWS : rows & ~(int64_t)3;
        const int64_t n_act = N > 4 ? N : 4;
        uint8_t *w = malloc((size_t)rows * wrs), *a = malloc((size_t)n_act * ars);
        const size_t n_out = (size_t)rows * 4 > (size_t)(PF_ROWS * n_act) ? (size_t)rows * 4 : (size_t)(PF_ROWS * n_act);
        float *out = malloc(n_out * sizeof(float));
        if (!w || !a || !out) return 1;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < K; i++) xf[i] = frand();
            kp_quantize_row(t, xf, w + r * wrs, K);
        }
        for (int64_t c = 0; c < n_act; c++) {
            for (int64_t i = 0; i < K; i++) xf[i] = frand();
            kp_kernels_scalar()->quantize_act[t](xf, a + c * ars, K);
        }
        kp_q8_0_aux *aux = NULL;
        const size_t aux_stride = (size_t)(K / 32) * sizeof(kp_q8_0_aux);
        if (at == KP_DTYPE_Q8_0) {
            aux = malloc((size_t)n_act * aux_stride);
            if (!aux) return 1;
            for (int64_t c = 0; c < n_act; c++) kp_q8_0_aux_row(a + c * ars, aux + c * (K / 32), K);
        }
        for (int k = 0; k < N_TABS; k++) {
            if (!tabs[k]) continue;
            uint8_t *pk = NULL;
            if (k > 0 && tabs[k]->pack[t] && K % tabs[k]->pack_k[t] == 0) {
                /* 64-byte aligned, as the forward pass's copies (its 32-byte loads then never split a line) */
                pk = aligned_alloc(64, (kp_pack_bytes(t, K, PF_ROWS, tabs[k]->pack_rows[t]) + 63) & ~(size_t)63);
                if (!pk) return 1;
                tabs[k]->pack[t](K, PF_ROWS, w, wrs, pk);
            }
            bench_ctx c = {tabs[k], t, K, rows, w, wrs, a, ars, out, N, aux, aux_stride, pk};
            const double bytes = (double)rows * (double)wrs;
            const double tv = time_it(run_vec_dot, &c), tt = time_it(run_tile, &c);
            const double td = time_it(run_decode, &c);
            /* the scalar table is too slow for a whole batch; prefill is for the SIMD tables */
            const double tp = k == 0 ? 0 : time_it(run_prefill, &c);
            const double tk = pk ? time_it(run_packed, &c) : 0;
            const double gk = tk > 0 ? (double)PF_ROWS * (double)N * (double)K / tk * 1e-9 : 0.0;
            /* a core's multiply-adds a cycle for the instruction the packed kernel uses */
            const int macs = at == KP_DTYPE_Q8_0 || at == KP_DTYPE_Q8_K || at == KP_DTYPE_Q8_1 ? 64
                             : at == KP_DTYPE_BF16 && !strcmp(tabs[k]->name, "avx512bf16") ? 32 : 16;
            char share[16] = "";
            if (gk > 0 && ghz > 0) snprintf(share, sizeof share, " (%.0f%%)", 100 * gk / (ghz * macs));
            printf("%-6s %-10s %10.2f %12.2f %12.2f %7.2fx %10.2f %14.2f %8.2f%-6s\n", kp_dtype_name(t),
                   tabs[k]->name, bytes / tv * 1e-9, bytes / tt * 1e-9, 4 * bytes / tt * 1e-9, 4 * tv / tt,
                   bytes / td * 1e-9, tp > 0 ? (double)PF_ROWS * (double)N * (double)K / tp * 1e-9 : 0.0, gk, share);
            free(pk);
        }
        free(w);
        free(a);
        free(aux);
        free(out);
    }
    free(xf);
    print_int8_ceiling();
    return 0;
}
