/*
 * quant.c - the choice of kernel table (see quant.h): kp_kernels_best picks
 * the AVX512-VNNI or the AVX2 table (quant_avx2.c) at run time, else the
 * portable one (quant_scalar.c); and the row conversions that use the best.
 *
 * Invariants: no mutable state; every function is reentrant.
 */
#include "kernels/quant.h"

#include "kernels/tables.h"

void kp_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n) {
    kp_kernels_best()->quantize_act[KP_DTYPE_F16](x, y, n);
}

void kp_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
#if defined(__x86_64__)
    if (kp_kernels_avx2()) {
        kp_quant_avx2_fp16_to_fp32_row(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp16_to_fp32(x[i]);
}

const kp_kernels *kp_kernels_scalar(void) { return &kp_quant_scalar_kernels; }

const kp_kernels *kp_kernels_avx2(void) {
#if defined(__x86_64__)
    /* libgcc fills the CPU model in a constructor; no __builtin_cpu_init()
     * here, it would write shared state from every calling thread */
    bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if !defined(__clang__)
    ok = ok && __builtin_cpu_supports("f16c"); /* clang 14 has no "f16c" here; every
                                                 AVX2 CPU has F16C */
#endif
    if (ok) return &kp_quant_avx2_kernels;
#endif
    return NULL;
}

const kp_kernels *kp_kernels_avx512vnni(void) {
#if defined(__x86_64__)
    if (kp_kernels_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        return &kp_quant_avx512vnni_kernels;
#endif
    return NULL;
}

const kp_kernels *kp_kernels_best(void) {
    const kp_kernels *k = kp_kernels_avx512vnni();
    if (!k) k = kp_kernels_avx2();
    return k ? k : &kp_quant_scalar_kernels;
}
