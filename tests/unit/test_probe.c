/*
 * test_probe.c - the machine probes (kernels/probe.c): each returns a
 * positive, finite figure on the engine's thread pool and in the calling
 * thread, refuses what cannot be done with a status (an impossible buffer
 * size is KP_ENOMEM, not a crash), and the int8 loop of every instruction
 * set runs where the CPU has it; one the CPU lacks is KP_EUNSUPPORTED and
 * reported as skipped by name. No timing thresholds: a shared machine may
 * be slow, but never zero, infinite or NaN.
 */
#include <stdint.h>

#include "base/threadpool.h"
#include "harness.h"
#include "kernels/probe.h"

static kp_threads *pool2;

static bool good(double x) { return isfinite(x) && x > 0; }

static void test_llc_and_default_size(void) {
    size_t llc = kp_probe_llc_bytes();
    CHECK(llc > 0);
    size_t d = kp_probe_default_bytes();
    CHECK(d >= (size_t)256 << 20);
    CHECK(d >= 4 * llc);
    CHECK(d == 4 * llc || d == (size_t)256 << 20);
}

static void test_read_bw(void) {
    kp_error err = {0};
    double bw = -1;
    /* 32 MiB: large enough to stream, small enough for a sanitizer build */
    kp_status st = kp_probe_read_bw(pool2, (size_t)32 << 20, 2, false, &bw, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    CHECK_MSG(good(bw), "%g", bw);
    st = kp_probe_read_bw(pool2, (size_t)8 << 20, 1, true, &bw, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    CHECK_MSG(good(bw), "scalar %g", bw);
    st = kp_probe_read_bw(NULL, (size_t)8 << 20, 1, false, &bw, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    CHECK_MSG(good(bw), "no pool %g", bw);
    /* a size that is not a multiple of anything still works (the tail is not read) */
    st = kp_probe_read_bw(pool2, ((size_t)1 << 20) + 12345, 1, false, &bw, &err);
    CHECK_MSG(st == KP_OK && good(bw), "odd size: %s %g", err.msg, bw);
}

static void test_read_bw_refusals(void) {
    kp_error err = {0};
    double bw = -1;
    CHECK_EQ_INT(kp_probe_read_bw(pool2, SIZE_MAX, 1, false, &bw, &err), KP_ENOMEM);
    CHECK(err.code == KP_ENOMEM && strstr(err.msg, "cannot map") != NULL);
    CHECK(bw == 0);
    bw = -1;
    CHECK_EQ_INT(kp_probe_read_bw(pool2, SIZE_MAX / 2, 1, false, &bw, &err), KP_ENOMEM);
    CHECK(bw == 0);
    CHECK_EQ_INT(kp_probe_read_bw(pool2, 100, 1, false, &bw, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw(pool2, (size_t)1 << 20, 0, false, &bw, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw(pool2, (size_t)1 << 20, 1, false, NULL, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw(pool2, SIZE_MAX, 1, false, &bw, NULL), KP_ENOMEM); /* NULL err allowed */
}

/* Whether this CPU has what a loop needs, asked here independently of probe.c. */
static bool cpu_has(const char *isa) {
    if (!strcmp(isa, "scalar")) return true;
#if defined(__x86_64__)
    if (!strcmp(isa, "avx2")) return __builtin_cpu_supports("avx2");
    if (!strcmp(isa, "avx512vnni"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
#endif
    return false;
}

static void test_int8_each_isa(void) {
    static const char *const isas[] = {"avx512vnni", "avx2", "scalar"};
    for (int i = 0; i < 3; i++) {
        kp_error err = {0};
        double ops = -1;
        kp_status st = kp_probe_int8_peak_isa(pool2, isas[i], &ops, &err);
        if (!cpu_has(isas[i])) {
            CHECK_MSG(st == KP_EUNSUPPORTED, "%s: %d %s", isas[i], (int)st, err.msg);
            CHECK(ops == 0);
            SKIP("int8 loop %s (this CPU lacks it)", isas[i]);
            continue;
        }
        CHECK_MSG(st == KP_OK, "%s: %s", isas[i], err.msg);
        CHECK_MSG(good(ops), "%s: %g", isas[i], ops);
        st = kp_probe_int8_peak_isa(NULL, isas[i], &ops, &err);
        CHECK_MSG(st == KP_OK && good(ops), "%s without a pool: %s %g", isas[i], err.msg, ops);
    }
    kp_error err = {0};
    double ops = -1;
    CHECK_EQ_INT(kp_probe_int8_peak_isa(pool2, "amx", &ops, &err), KP_EINVAL);
    CHECK(strstr(err.msg, "'amx'") != NULL);
    CHECK_EQ_INT(kp_probe_int8_peak_isa(pool2, NULL, &ops, &err), KP_EINVAL);
}

static void test_int8_best_and_scalar(void) {
    kp_error err = {0};
    const char *isa = NULL;
    double ops = -1;
    CHECK_MSG(kp_probe_int8_peak(pool2, false, &isa, &ops, &err) == KP_OK, "%s", err.msg);
    CHECK(good(ops));
    /* the best loop is the first of the list the CPU has */
    const char *want = cpu_has("avx512vnni") ? "avx512vnni" : cpu_has("avx2") ? "avx2" : "scalar";
    CHECK_EQ_STR(isa, want);
    isa = NULL;
    CHECK_MSG(kp_probe_int8_peak(pool2, true, &isa, &ops, &err) == KP_OK, "%s", err.msg);
    CHECK_EQ_STR(isa, "scalar");
    CHECK(good(ops));
    CHECK_EQ_INT(kp_probe_int8_peak(pool2, false, NULL, NULL, &err), KP_EINVAL);
}

/* The float peaks: the loop the CPU's widest instructions allow (asked here
 * independently of probe.c), a finite positive rate, and for the scalar
 * loop a rate far below the vector loops' (the loops do run the work they
 * count). */
static void test_float_peaks(void) {
    kp_error err = {0};
    const char *isa = NULL;
    double fma = -1, bf = -1, sc = -1;
    CHECK_MSG(kp_probe_float_peak(pool2, false, false, &isa, &fma, &err) == KP_OK, "%s", err.msg);
    CHECK(good(fma));
#if defined(__x86_64__)
    bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
    bool has_bf16 = avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl");
#else
    bool avx512 = false, avx2 = false, has_bf16 = false;
#endif
    CHECK_EQ_STR(isa, avx512 ? "avx512 fma" : avx2 ? "avx2 fma" : "scalar fma");
    CHECK_MSG(kp_probe_float_peak(pool2, true, false, &isa, &bf, &err) == KP_OK, "%s", err.msg);
    CHECK(good(bf));
    CHECK_EQ_STR(isa, has_bf16 ? "avx512bf16 dot" : avx512 ? "avx512 fma" : avx2 ? "avx2 fma" : "scalar fma");
    if (!has_bf16) SKIP("bfloat16 dot peak (this CPU lacks AVX512_BF16)");
    CHECK_MSG(kp_probe_float_peak(pool2, true, true, &isa, &sc, &err) == KP_OK, "%s", err.msg);
    CHECK_EQ_STR(isa, "scalar fma");
    CHECK(good(sc));
    if (avx2) CHECK_MSG(sc * 2 < fma, "scalar %g FLOP/s not below the vector loop's %g", sc, fma);
    printf("  float peaks: %s %.0f GFLOP/s, with bf16 %.0f, scalar %.0f\n", avx512 ? "avx512 fma" : "fma", fma / 1e9,
           bf / 1e9, sc / 1e9);
    CHECK_EQ_INT(kp_probe_float_peak(pool2, false, false, NULL, NULL, &err), KP_EINVAL);
}

/* The stable probe: its passes within the bounds, the order of its
 * figures, and what "stable" promises (the best three within 5%, which
 * needs three passes at least). */
static void test_read_bw_stable(void) {
    kp_probe_bw b;
    kp_error err = {0};
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, (size_t)16 << 20, 4, 12, false, &b, &err), KP_OK);
    CHECK(b.passes >= 4 && b.passes <= 12);
    CHECK(b.min > 0 && b.min <= b.median && b.median <= b.best);
    CHECK(b.stable || b.passes == 12);
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, (size_t)16 << 20, 1, 1, false, &b, &err), KP_OK);
    CHECK(b.passes == 1 && !b.stable && b.min == b.best && b.median == b.best);
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, (size_t)16 << 20, 0, 4, false, &b, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, (size_t)16 << 20, 5, 4, false, &b, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, (size_t)16 << 20, 1, 65, false, &b, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, 100, 1, 4, false, &b, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_probe_read_bw_stable(pool2, (size_t)16 << 20, 1, 4, false, NULL, &err), KP_EINVAL);
}

int main(void) {
    kp_error err = {0};
    if (kp_threads_new(&pool2, 2, &err) != KP_OK) {
        fprintf(stderr, "pool: %s\n", err.msg);
        return 1;
    }
    RUN(test_llc_and_default_size);
    RUN(test_read_bw);
    RUN(test_read_bw_refusals);
    RUN(test_read_bw_stable);
    RUN(test_int8_each_isa);
    RUN(test_int8_best_and_scalar);
    RUN(test_float_peaks);
    kp_threads_free(pool2);
    return harness_finish("probe");
}
