/*
 * dispatch.c - the choice of kernel table: CPU detection, and the getters
 * of quant.h (kp_kernels_*) and attn.h (kp_attn_*) that hand the tables of
 * tables.h out; the row conversions of quant.h that run on the best table.
 * The only file of src/kernels/ that knows every table; the kernel files
 * know at most the table they fall back to.
 *
 *   quant tables        needs (besides x86-64)
 *   scalar              -                              quant_scalar.c
 *   avx2                AVX2, FMA, F16C                 quant_avx2.c
 *   avx512vnni          the above, AVX512 F/VL/BW, VNNI quant_avx512.c
 *   avx512bf16          the above, AVX512_BF16         quant_avx512.c + quant_bf16.c
 *
 *   attention tables
 *   scalar              -                              attn_scalar.c
 *   avx2                AVX2, FMA, F16C                 attn_avx2.c
 *   avx512              the above, AVX512F              attn_avx512.c
 *   avx512bf16          the above, AVX512 BW/VL/BF16    attn_bf16.c
 *   scalar-bf16         -                              attn_scalar.c
 *   (the last two: the BF16 precision, only when asked for)
 *
 * CPU detection is __builtin_cpu_supports, which reads the CPU model libgcc
 * (compiler-rt with clang) fills in a constructor from cpuid, with the
 * AVX and AVX-512 features counted only when the OS saves their registers
 * (xgetbv: XCR0), so no check of its own is needed here. Nothing calls
 * __builtin_cpu_init(): it would write that shared state from every calling
 * thread. The checks are cheap and run on every call; nothing is cached.
 *
 * Invariants: no mutable state; every function is reentrant. Built for
 * another architecture, every getter of a SIMD table returns NULL and the
 * best table is the scalar one.
 */
#include <stdbool.h>

#include "kernels/attn.h"
#include "kernels/quant.h"
#include "kernels/tables.h"

#if defined(__x86_64__)
/* AVX2, FMA and F16C: what the avx2 tables use. */
static bool cpu_avx2(void) {
    bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if !defined(__clang__)
    ok = ok && __builtin_cpu_supports("f16c"); /* clang 14 has no "f16c" here; every
                                                 AVX2 CPU has F16C */
#endif
    return ok;
}

/* What the avx512vnni quant table adds. */
static bool cpu_avx512vnni(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}
#endif

/* ---- quant tables -------------------------------------------------------- */

const kp_kernels *kp_kernels_scalar(void) { return &kp_quant_scalar_kernels; }

const kp_kernels *kp_kernels_avx2(void) {
#if defined(__x86_64__)
    if (cpu_avx2()) return &kp_quant_avx2_kernels;
#endif
    return NULL;
}

const kp_kernels *kp_kernels_avx512vnni(void) {
#if defined(__x86_64__)
    if (cpu_avx2() && cpu_avx512vnni()) return &kp_quant_avx512vnni_kernels;
#endif
    return NULL;
}

const kp_kernels *kp_kernels_avx512bf16(void) {
#if defined(__x86_64__)
    if (cpu_avx2() && cpu_avx512vnni() && __builtin_cpu_supports("avx512bf16")) return &kp_quant_avx512bf16_kernels;
#endif
    return NULL;
}

const kp_kernels *kp_kernels_best(void) {
    const kp_kernels *k = kp_kernels_avx512bf16();
    if (!k) k = kp_kernels_avx512vnni();
    if (!k) k = kp_kernels_avx2();
    return k ? k : &kp_quant_scalar_kernels;
}

size_t kp_pack_bytes(kp_dtype t, int64_t n, int64_t nr, int pack_rows) {
    if (pack_rows <= 0 || nr <= 0) return 0;
    const size_t groups = (size_t)((nr + pack_rows - 1) / pack_rows);
    return groups * (size_t)pack_rows * kp_dtype_row_size(t, n);
}

void kp_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n) {
    kp_kernels_best()->quantize_act[KP_DTYPE_F16](x, y, n);
}

void kp_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
#if defined(__x86_64__)
    if (cpu_avx2()) {
        kp_quant_avx2_fp16_to_fp32_row(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp16_to_fp32(x[i]);
}

/* ---- attention tables ---------------------------------------------------- */

const kp_attn_kernels *kp_attn_scalar(void) { return &kp_attn_scalar_kernels; }

const kp_attn_kernels *kp_attn_avx2_table(void) {
#if defined(__x86_64__)
    return &kp_attn_avx2_kernels;
#else
    return NULL;
#endif
}

const kp_attn_kernels *kp_attn_avx512_table(void) {
#if defined(__x86_64__)
    return &kp_attn_avx512_kernels;
#else
    return NULL;
#endif
}

const kp_attn_kernels *kp_attn_best(void) {
#if defined(__x86_64__)
    if (cpu_avx2()) return __builtin_cpu_supports("avx512f") ? &kp_attn_avx512_kernels : &kp_attn_avx2_kernels;
#endif
    return &kp_attn_scalar_kernels;
}

const kp_attn_kernels *kp_attn_scalar_bf16(void) { return &kp_attn_scalar_bf16_kernels; }

const kp_attn_kernels *kp_attn_avx512bf16_table(void) {
#if defined(__x86_64__)
    return &kp_attn_avx512bf16_kernels;
#else
    return NULL;
#endif
}

const kp_attn_kernels *kp_attn_bf16_best(void) {
#if defined(__x86_64__)
    if (cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16"))
        return &kp_attn_avx512bf16_kernels;
#endif
    return NULL;
}
