/*
 * probe.c - the machine's ceilings (probe.h): streaming read bandwidth,
 * int8 multiply-add peak and float multiply-add peaks, on the engine's
 * thread pool.
 *
 * Read bandwidth. The buffer is an anonymous mapping (so an impossible
 * size is a clean KP_ENOMEM from mmap rather than an allocator's abort),
 * written once with memset so every page exists before the clock starts.
 * A pass splits it into 8 slices per thread (the pool hands tasks out by
 * an atomic counter, so a thread that starts late takes fewer slices and
 * no thread idles at the end); each task sums its slice as 64-bit words
 * with four independent accumulators, 256 bytes per step, and stores the
 * sum in the pass's array, which the compiler must assume is read later,
 * so no load can be dropped. The figure is the bytes summed over the
 * pass's wall time, best of the passes. The scalar loop is plain C, which
 * the compiler may vectorize with the build's -march; a stream from memory
 * runs at about the same speed either way.
 *
 * Int8 peak. Each loop keeps its operands and accumulators in registers
 * and runs independent chains, so the figure is the throughput of the
 * multiply-add instructions, not their latency:
 *
 *   loop        chains  per chain and step            ops a step
 *   avx512vnni  12      vpdpbusd zmm: 64 u8 x s8 MACs  12 x 64 x 2 = 1536
 *   avx2        8       vpmaddubsw ymm (32 MACs), then  8 x 32 x 2 =  512
 *                       vpmaddwd by ones, vpaddd
 *   scalar      8       one int32 multiply-add           8 x  1 x 2 =   16
 *
 * Float peaks (kp_probe_float_peak), the same way, in FLOP:
 *
 *   avx512bf16 dot  12  vdpbf16ps zmm: 32 bf16 MACs    12 x 32 x 2 =  768
 *   avx512 fma      12  vfmadd zmm: 16 F32 MACs        12 x 16 x 2 =  384
 *   avx2 fma        12  vfmadd ymm: 8 F32 MACs         12 x  8 x 2 =  192
 *   scalar fma       8  fmaf                            8 x  1 x 2 =   16
 *
 * An empty asm statement per step tells the compiler an operand may have
 * changed, so the products cannot be hoisted out of the loop (the avx2
 * chain's products do not depend on the accumulator); the chains start
 * from different values, so no two are the same computation. The loop
 * length is calibrated in the calling thread (doubled until a run takes
 * 2 ms), then set for about 30 ms per thread, as 4 tasks per thread;
 * best of 3 runs of the whole pool.
 *
 * CPU detection is __builtin_cpu_supports, as in dispatch.c (which knows
 * the quant tables; this file knows only its own loops); every SIMD
 * function carries its target attribute, so the file needs no -m flags.
 * No mutable state outside a call.
 */
#include "kernels/probe.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MIB ((size_t)1 << 20)
#define READ_STEP 256         /* bytes a read loop consumes per step */
#define READ_TASKS_PER_THREAD 8
#define MAC_TASKS_PER_THREAD 4
#define MAC_TARGET_S 0.030    /* per thread */
#define MAC_CALIB_S 0.002
#define MAC_REPS 3

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* fn over [0, n) on the pool, or in this thread without one. */
static void run(kp_threads *pool, kp_task_fn fn, void *ctx, int n) {
    if (pool) {
        kp_threads_run(pool, fn, ctx, n);
        return;
    }
    for (int i = 0; i < n; i++) fn(ctx, i, 0);
}

/* ---- CPU features -------------------------------------------------------- */

#if defined(__x86_64__)
static bool cpu_avx2(void) { return __builtin_cpu_supports("avx2"); }
static bool cpu_avx512f(void) { return __builtin_cpu_supports("avx512f"); }
static bool cpu_avx512vnni(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}
#endif

/* ---- the last-level cache ------------------------------------------------ */

/* "32768K", "32M", "1024" -> bytes; 0 when unreadable. */
static size_t read_cache_size(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    char unit = 0;
    int n = fscanf(f, "%llu%c", &v, &unit);
    fclose(f);
    if (n < 1) return 0;
    if (n == 2 && (unit == 'K' || unit == 'k')) v <<= 10;
    if (n == 2 && (unit == 'M' || unit == 'm')) v <<= 20;
    return (size_t)v;
}

size_t kp_probe_llc_bytes(void) {
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        size_t level = read_cache_size(path);
        if (level == 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        size_t size = read_cache_size(path);
        if (size > 0 && (int)level >= best_level) {
            best_level = (int)level;
            best = size;
        }
    }
    if (best) return best;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v > 0) return (size_t)v;
#endif
    return 32 * MIB;
}

size_t kp_probe_default_bytes(void) {
    size_t llc = kp_probe_llc_bytes();
    size_t n = llc <= SIZE_MAX / 4 ? 4 * llc : SIZE_MAX;
    return n > 256 * MIB ? n : 256 * MIB;
}

/* ---- read bandwidth ------------------------------------------------------ */

typedef enum { RD_SCALAR, RD_AVX2, RD_AVX512 } read_kind;

/* Sums n bytes (a multiple of READ_STEP) of p as 64-bit words. */
static uint64_t sum_scalar(const unsigned char *p, size_t n) {
    const uint64_t *w = (const uint64_t *)(const void *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        s0 += w[i];
        s1 += w[i + 1];
        s2 += w[i + 2];
        s3 += w[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t sum_avx2(const unsigned char *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += READ_STEP) {
        const __m256i *v = (const __m256i *)(const void *)(p + i);
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(v + 0));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(v + 1));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(v + 2));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(v + 3));
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(v + 4));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(v + 5));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(v + 6));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(v + 7));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)(void *)lanes,
                        _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

__attribute__((target("avx512f"))) static uint64_t sum_avx512(const unsigned char *p, size_t n) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += READ_STEP) {
        const unsigned char *q = p + i;
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512((const void *)q));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512((const void *)(q + 64)));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512((const void *)(q + 128)));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512((const void *)(q + 192)));
    }
    uint64_t lanes[8];
    _mm512_storeu_si512((void *)lanes, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    uint64_t s = 0;
    for (int i = 0; i < 8; i++) s += lanes[i];
    return s;
}
#endif

typedef struct {
    const unsigned char *buf;
    size_t chunk; /* bytes per task, a multiple of READ_STEP */
    read_kind kind;
    uint64_t *sums; /* [task] */
} read_ctx;

static void read_task(void *vctx, int task, int thread) {
    (void)thread;
    read_ctx *c = vctx;
    const unsigned char *p = c->buf + (size_t)task * c->chunk;
    uint64_t s;
#if defined(__x86_64__)
    if (c->kind == RD_AVX512)
        s = sum_avx512(p, c->chunk);
    else if (c->kind == RD_AVX2)
        s = sum_avx2(p, c->chunk);
    else
#endif
        s = sum_scalar(p, c->chunk);
    c->sums[task] = s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Passes until the best three agree within 5% (or max_reps): the
 * measurements in bw[] (descending afterwards), their count. */
static kp_status read_passes(kp_threads *pool, size_t bytes, int min_reps, int max_reps, bool scalar, double *bw,
                             int *n_out, bool *stable, kp_error *err) {
    int n_threads = pool ? kp_threads_size(pool) : 1;
    int n_tasks = READ_TASKS_PER_THREAD * n_threads;
    size_t chunk = bytes / (size_t)n_tasks / READ_STEP * READ_STEP;
    if (chunk == 0)
        return kp_fail(err, KP_EINVAL, "read probe: %zu bytes is too little for %d threads", bytes, n_threads);
    read_ctx c = {NULL, chunk, RD_SCALAR, NULL};
#if defined(__x86_64__)
    if (!scalar) c.kind = cpu_avx512f() ? RD_AVX512 : cpu_avx2() ? RD_AVX2 : RD_SCALAR;
#else
    (void)scalar;
#endif
    c.sums = calloc((size_t)n_tasks, sizeof *c.sums);
    if (!c.sums) return kp_fail(err, KP_ENOMEM, "read probe: out of memory");
    void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        int e = errno;
        free(c.sums);
        return kp_fail(err, KP_ENOMEM, "read probe: cannot map %zu bytes: %s", bytes, strerror(e));
    }
#if defined(MADV_HUGEPAGE)
    (void)madvise(buf, bytes, MADV_HUGEPAGE); /* fewer TLB misses where allowed; a hint only */
#endif
    memset(buf, 1, bytes);
    c.buf = buf;
    int n = 0;
    *stable = false;
    while (n < max_reps) {
        double t0 = now_s();
        run(pool, read_task, &c, n_tasks);
        double dt = now_s() - t0;
        bw[n++] = dt > 0 ? (double)chunk * n_tasks / dt : 0;
        if (n < min_reps || n < 3) continue;
        double top[3] = {0, 0, 0};
        for (int i = 0; i < n; i++) { /* the three largest */
            double x = bw[i];
            if (x > top[0]) top[2] = top[1], top[1] = top[0], top[0] = x;
            else if (x > top[1]) top[2] = top[1], top[1] = x;
            else if (x > top[2]) top[2] = x;
        }
        if (top[2] >= 0.95 * top[0]) {
            *stable = true;
            break;
        }
    }
    munmap(buf, bytes);
    free(c.sums);
    qsort(bw, (size_t)n, sizeof *bw, cmp_double);
    *n_out = n;
    return KP_OK;
}

kp_status kp_probe_read_bw(kp_threads *pool, size_t bytes, int reps, bool scalar, double *bytes_per_s,
                           kp_error *err) {
    if (bytes_per_s) *bytes_per_s = 0;
    if (!bytes_per_s) return kp_fail(err, KP_EINVAL, "read probe: no place for the result");
    if (bytes < 64 * 1024) return kp_fail(err, KP_EINVAL, "read probe: %zu bytes is less than 64 KiB", bytes);
    if (reps < 1) return kp_fail(err, KP_EINVAL, "read probe: %d repetitions (at least 1)", reps);
    double *bw = malloc((size_t)reps * sizeof *bw);
    if (!bw) return kp_fail(err, KP_ENOMEM, "read probe: out of memory");
    int n = 0;
    bool stable;
    /* exactly reps passes: min = max = reps (the early stop never fires before min) */
    kp_status st = read_passes(pool, bytes, reps, reps, scalar, bw, &n, &stable, err);
    if (st == KP_OK) *bytes_per_s = bw[n - 1];
    free(bw);
    return st;
}

kp_status kp_probe_read_bw_stable(kp_threads *pool, size_t bytes, int min_reps, int max_reps, bool scalar,
                                  kp_probe_bw *out, kp_error *err) {
    if (out) memset(out, 0, sizeof *out);
    if (!out) return kp_fail(err, KP_EINVAL, "read probe: no place for the result");
    if (bytes < 64 * 1024) return kp_fail(err, KP_EINVAL, "read probe: %zu bytes is less than 64 KiB", bytes);
    if (min_reps < 1 || max_reps < min_reps || max_reps > 64)
        return kp_fail(err, KP_EINVAL, "read probe: %d to %d passes (1 <= min <= max <= 64)", min_reps, max_reps);
    double bw[64];
    int n = 0;
    bool stable = false;
    kp_status st = read_passes(pool, bytes, min_reps, max_reps, scalar, bw, &n, &stable, err);
    if (st != KP_OK) return st;
    out->best = bw[n - 1];
    out->min = bw[0];
    out->median = n % 2 ? bw[n / 2] : (bw[n / 2 - 1] + bw[n / 2]) / 2;
    out->passes = n;
    out->stable = stable;
    return KP_OK;
}

/* ---- int8 multiply-add peak ---------------------------------------------- */

typedef uint64_t (*mac_loop)(uint64_t steps);

/* The sum of a vector's int32 lanes, with wrap-around (an accumulator may
 * wrap over a long run; only the instructions matter). */
static uint64_t fold_u32(const uint32_t *v, int n) {
    uint32_t s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

static uint64_t mac_scalar(uint64_t steps) {
    int32_t a0 = 1, a1 = 2, a2 = 3, a3 = 4, a4 = 5, a5 = 6, a6 = 7, a7 = 8;
    const int32_t b = -3;
    uint32_t c0 = 0, c1 = 1, c2 = 2, c3 = 3, c4 = 4, c5 = 5, c6 = 6, c7 = 7;
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+r"(a0), "+r"(a1), "+r"(a2), "+r"(a3), "+r"(a4), "+r"(a5), "+r"(a6), "+r"(a7));
        c0 += (uint32_t)(a0 * b);
        c1 += (uint32_t)(a1 * b);
        c2 += (uint32_t)(a2 * b);
        c3 += (uint32_t)(a3 * b);
        c4 += (uint32_t)(a4 * b);
        c5 += (uint32_t)(a5 * b);
        c6 += (uint32_t)(a6 * b);
        c7 += (uint32_t)(a7 * b);
    }
    uint32_t c[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
    return fold_u32(c, 8);
}

#if defined(__x86_64__)
#define T_AVX2 __attribute__((target("avx2")))
#define T_VNNI __attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512vnni")))

T_AVX2 static uint64_t mac_avx2(uint64_t steps) {
    enum { CHAINS = 8 };
    const __m256i one = _mm256_set1_epi16(1);
    __m256i a = _mm256_set1_epi8(1);
    /* distinct weights per chain (-1, 2, -3, 4, ...): no two chains compute the same products */
    __m256i w[CHAINS], c[CHAINS];
    _Pragma("GCC unroll 8") for (int k = 0; k < CHAINS; k++) {
        w[k] = _mm256_set1_epi8((char)(k % 2 ? k + 1 : -(k + 1)));
        c[k] = _mm256_set1_epi32(k);
    }
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+x"(a));
        _Pragma("GCC unroll 8") for (int k = 0; k < CHAINS; k++)
            c[k] = _mm256_add_epi32(c[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w[k]), one));
    }
    __m256i s = c[0];
    _Pragma("GCC unroll 8") for (int k = 1; k < CHAINS; k++) s = _mm256_add_epi32(s, c[k]);
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)(void *)lanes, s);
    return fold_u32(lanes, 8);
}

T_VNNI static uint64_t mac_avx512vnni(uint64_t steps) {
    enum { CHAINS = 12 }; /* independent accumulators: enough to hide the latency */
    __m512i a = _mm512_set1_epi8(1);
    const __m512i b = _mm512_set1_epi8(-2);
    __m512i c[CHAINS];
    _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm512_set1_epi32(k);
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+v"(a));
        _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm512_dpbusd_epi32(c[k], a, b);
    }
    __m512i s = c[0];
    _Pragma("GCC unroll 12") for (int k = 1; k < CHAINS; k++) s = _mm512_add_epi32(s, c[k]);
    uint32_t lanes[16];
    _mm512_storeu_si512((void *)lanes, s);
    return fold_u32(lanes, 16);
}
#endif

/* Float multiply-add loops for the float peaks (kp_probe_float_peak): the
 * same shape, chains of fused multiply-adds on F32 lanes, or bfloat16 dot
 * products (2 multiply-adds per F32 lane). The values stay finite: each
 * chain adds a tiny product to itself. */
static uint64_t float_bits(const float *v, int n) {
    uint32_t u[16];
    for (int i = 0; i < n && i < 16; i++) memcpy(&u[i], &v[i], 4);
    return fold_u32(u, n < 16 ? n : 16);
}

static uint64_t fma_scalar(uint64_t steps) {
    float c[8] = {0, 1, 2, 3, 4, 5, 6, 7}, a = 1e-7f, b = 1e-7f;
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+r"(a));
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) c[k] = fmaf(a, b, c[k]);
    }
    return float_bits(c, 8);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static uint64_t fma_avx2(uint64_t steps) {
    enum { CHAINS = 12 };
    __m256 a = _mm256_set1_ps(1e-7f), c[CHAINS];
    const __m256 b = _mm256_set1_ps(1e-7f);
    _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm256_set1_ps((float)k);
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+x"(a));
        _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm256_fmadd_ps(a, b, c[k]);
    }
    for (int k = 1; k < CHAINS; k++) c[0] = _mm256_add_ps(c[0], c[k]);
    float v[8];
    _mm256_storeu_ps(v, c[0]);
    return float_bits(v, 8);
}

__attribute__((target("avx512f"))) static uint64_t fma_avx512(uint64_t steps) {
    enum { CHAINS = 12 };
    __m512 a = _mm512_set1_ps(1e-7f), c[CHAINS];
    const __m512 b = _mm512_set1_ps(1e-7f);
    _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm512_set1_ps((float)k);
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+v"(a));
        _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm512_fmadd_ps(a, b, c[k]);
    }
    for (int k = 1; k < CHAINS; k++) c[0] = _mm512_add_ps(c[0], c[k]);
    float v[16];
    _mm512_storeu_ps(v, c[0]);
    return float_bits(v, 16);
}

__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static uint64_t dp_avx512bf16(uint64_t steps) {
    enum { CHAINS = 12 };
    __m512i a = _mm512_set1_epi16(0x3400); /* bfloat16 1.2e-7 (2^-23) */
    const __m512i b = _mm512_set1_epi16(0x3400);
    __m512 c[CHAINS];
    _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++) c[k] = _mm512_set1_ps((float)k);
    for (uint64_t i = 0; i < steps; i++) {
        __asm__("" : "+v"(a));
        _Pragma("GCC unroll 12") for (int k = 0; k < CHAINS; k++)
            c[k] = _mm512_dpbf16_ps(c[k], (__m512bh)a, (__m512bh)b);
    }
    for (int k = 1; k < CHAINS; k++) c[0] = _mm512_add_ps(c[0], c[k]);
    float v[16];
    _mm512_storeu_ps(v, c[0]);
    return float_bits(v, 16);
}
#endif

typedef struct {
    const char *name;
    mac_loop loop;
    double ops_per_step; /* 2 x int8 multiply-adds of one step */
} mac_kind;

static const mac_kind MAC_SCALAR = {"scalar", mac_scalar, 8 * 1 * 2};
static const mac_kind FMA_SCALAR = {"scalar fma", fma_scalar, 8 * 2};
#if defined(__x86_64__)
static const mac_kind FMA_AVX2 = {"avx2 fma", fma_avx2, 12 * 8 * 2};
static const mac_kind FMA_AVX512 = {"avx512 fma", fma_avx512, 12 * 16 * 2};
static const mac_kind DP_AVX512BF16 = {"avx512bf16 dot", dp_avx512bf16, 12 * 32 * 2};
static const mac_kind MAC_AVX2 = {"avx2", mac_avx2, 8 * 32 * 2};
static const mac_kind MAC_AVX512VNNI = {"avx512vnni", mac_avx512vnni, 12 * 64 * 2};
#endif

typedef struct {
    mac_loop loop;
    uint64_t steps;  /* per task */
    uint64_t *sinks; /* [task] */
} mac_ctx;

static void mac_task(void *vctx, int task, int thread) {
    (void)thread;
    mac_ctx *c = vctx;
    c->sinks[task] = c->loop(c->steps);
}

static kp_status run_mac(kp_threads *pool, const mac_kind *k, double *ops_per_s, kp_error *err) {
    if (ops_per_s) *ops_per_s = 0;
    if (!ops_per_s) return kp_fail(err, KP_EINVAL, "peak probe: no place for the result");
    int n_threads = pool ? kp_threads_size(pool) : 1;
    int n_tasks = MAC_TASKS_PER_THREAD * n_threads;
    mac_ctx c = {k->loop, 1024, calloc((size_t)n_tasks, sizeof(uint64_t))};
    if (!c.sinks) return kp_fail(err, KP_ENOMEM, "peak probe: out of memory");
    /* calibrate in this thread: steps doubled until one run takes MAC_CALIB_S */
    double dt = 0;
    for (;;) {
        double t0 = now_s();
        c.sinks[0] = k->loop(c.steps);
        dt = now_s() - t0;
        if (dt >= MAC_CALIB_S || c.steps >= ((uint64_t)1 << 40)) break;
        c.steps *= 2;
    }
    double per_task = MAC_TARGET_S / MAC_TASKS_PER_THREAD;
    double steps = dt > 0 ? (double)c.steps * per_task / dt : (double)c.steps;
    c.steps = steps < 1 ? 1 : (uint64_t)steps;
    double best = 0;
    for (int r = 0; r < MAC_REPS; r++) {
        double t0 = now_s();
        run(pool, mac_task, &c, n_tasks);
        double t = now_s() - t0;
        double ops = t > 0 ? (double)n_tasks * (double)c.steps * k->ops_per_step / t : 0;
        if (ops > best) best = ops;
    }
    free(c.sinks);
    *ops_per_s = best;
    return KP_OK;
}

kp_status kp_probe_int8_peak_isa(kp_threads *pool, const char *isa, double *ops_per_s, kp_error *err) {
    if (ops_per_s) *ops_per_s = 0;
    if (!isa) return kp_fail(err, KP_EINVAL, "int8 probe: no instruction set named");
    if (!strcmp(isa, "scalar")) return run_mac(pool, &MAC_SCALAR, ops_per_s, err);
    if (!strcmp(isa, "avx2")) {
#if defined(__x86_64__)
        if (cpu_avx2()) return run_mac(pool, &MAC_AVX2, ops_per_s, err);
#endif
        return kp_fail(err, KP_EUNSUPPORTED, "int8 probe: this CPU lacks AVX2");
    }
    if (!strcmp(isa, "avx512vnni")) {
#if defined(__x86_64__)
        if (cpu_avx2() && cpu_avx512vnni()) return run_mac(pool, &MAC_AVX512VNNI, ops_per_s, err);
#endif
        return kp_fail(err, KP_EUNSUPPORTED, "int8 probe: this CPU lacks AVX512 F/VL/BW and VNNI");
    }
    return kp_fail(err, KP_EINVAL, "int8 probe: unknown instruction set '%s' (avx512vnni, avx2, scalar)", isa);
}

kp_status kp_probe_int8_peak(kp_threads *pool, bool scalar, const char **isa, double *ops_per_s, kp_error *err) {
    const mac_kind *k = &MAC_SCALAR;
#if defined(__x86_64__)
    if (!scalar && cpu_avx2()) k = cpu_avx512vnni() ? &MAC_AVX512VNNI : &MAC_AVX2;
#else
    (void)scalar;
#endif
    if (isa) *isa = k->name;
    return run_mac(pool, k, ops_per_s, err);
}

kp_status kp_probe_float_peak(kp_threads *pool, bool bf16, bool scalar, const char **isa, double *flops,
                              kp_error *err) {
    const mac_kind *k = &FMA_SCALAR;
#if defined(__x86_64__)
    if (!scalar && cpu_avx2() && __builtin_cpu_supports("fma")) {
        k = cpu_avx512f() ? &FMA_AVX512 : &FMA_AVX2;
        if (bf16 && cpu_avx512f() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bf16"))
            k = &DP_AVX512BF16;
    }
#else
    (void)scalar;
    (void)bf16;
#endif
    if (isa) *isa = k->name;
    return run_mac(pool, k, flops, err);
}
