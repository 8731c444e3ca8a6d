/*
 * quant_avx2_inl.h - private to src/quant*_avx2.c: the target macros and
 * the small AVX2 helpers both kernel files use. Include only on x86-64,
 * after <immintrin.h>.
 */
#ifndef KP_QUANT_AVX2_INL_H
#define KP_QUANT_AVX2_INL_H

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Largest of the 8 lanes. */
AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* roundf() on 8 lanes: round half away from zero (|t| < 2^23). */
AVX2_INLINE __m256 round_half_away(__m256 t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, tr)); /* |t - trunc t|, exact */
    const __m256 ge_half = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(t, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(tr, _mm256_and_ps(ge_half, one));
}

#endif
