/*
 * attn_avx512_inl.h - private to attn_avx512.c and attn_bf16.c: the
 * 16-lane pieces both tables share: exp512 (exp_ps of attn_avx2_inl.h on
 * 16 lanes, the same operations lane for lane), ld16 (16 elements of a K
 * or V row of any KV type as F32, converted in registers), and the avx512
 * table's softmax update of a query-lane step (lanes512_softmax). Include only on x86-64;
 * everything here is static inline and always inlined, compiled with the
 * target of the kernel that uses it (a superset of AVX512).
 */
#ifndef KP_ATTN_AVX512_INL_H
#define KP_ATTN_AVX512_INL_H

#include "kernels/attn_avx2_inl.h"

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

/* exp_ps on 16 lanes: the same operations, lane for lane. */
AVX512_INLINE __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.336548f);
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);
}

/* 16 elements of a K or V row of type t (F32, F16, Q8_0, Q4_0; a constant
 * at every call) from element i (a multiple of 16), as F32: the values
 * kp_dequantize_row gives, since d * q is exact in F32 (d has 11
 * significant bits, q at most 8). */
AVX512_INLINE __m512 ld16(const uint8_t *row, int i, kp_dtype t) {
    if (t == KP_DTYPE_F32) return _mm512_loadu_ps((const float *)row + i);
    if (t == KP_DTYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)i)));
    const uint8_t *b = row + (size_t)(i / 32) * (t == KP_DTYPE_Q8_0 ? 34 : 18);
    uint16_t dh;
    memcpy(&dh, b, 2);
    __m512i q;
    if (t == KP_DTYPE_Q8_0) {
        q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + i % 32)));
    } else { /* Q4_0: element e < 16 is the low nibble of byte e, e >= 16 the high one of byte e - 16 */
        __m128i x = _mm_loadu_si128((const __m128i *)(b + 2));
        if (i % 32) x = _mm_srli_epi16(x, 4);
        x = _mm_and_si128(x, _mm_set1_epi8(0x0f));
        q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(x), _mm512_set1_epi32(8));
    }
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(_cvtsh_ss(dh)));
}

/* The softmax update of a query-lane step whose scores w.s[j][r] (j <
 * n_keys) are computed: masks the keys a row does not see (causal), moves
 * each row's running max, writes the step's weights p = e^(s - m') over
 * the scores (0 where masked), the rescale a of every row to w.al and
 * l = fma(l, a, sum of the step's p in key order). True when some row's
 * max moved (its o needs the rescale). attn_bf16.c has its own, fused with
 * the pairing of the weights (softmax_pairs). */
AVX512_INLINE bool lanes512_softmax(kp_attn_tile *t, const lanes_ws *w, int n_keys, int32_t key_pos) {
    int Mp = w->Mp, nz = Mp / 16;
    int32_t delta = key_pos - t->pos0;
    bool all_visible = delta + n_keys - 1 <= 0;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    bool rescale = false;
    for (int v = 0; v < nz; v++) {
        __m512 tok = _mm512_loadu_ps(w->tok + 16 * v);
        __m512 mold = _mm512_loadu_ps(w->m + 16 * v), mx = mold;
        for (int j = 0; j < n_keys; j++) {
            float *sj = w->s + (size_t)j * Mp + 16 * v;
            __m512 x = _mm512_loadu_ps(sj);
            if (!all_visible) {
                __mmask16 vis = _mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ);
                x = _mm512_mask_blend_ps(vis, ninf, x);
                _mm512_storeu_ps(sj, x);
            }
            mx = _mm512_max_ps(mx, x);
        }
        __mmask16 same = _mm512_cmp_ps_mask(mx, mold, _CMP_EQ_OQ);
        __m512 a = _mm512_mask_blend_ps(same, exp512(_mm512_sub_ps(mold, mx)), one);
        rescale = rescale || same != 0xffff;
        __m512 psum = _mm512_setzero_ps();
        for (int j = 0; j < n_keys; j++) {
            float *sj = w->s + (size_t)j * Mp + 16 * v;
            __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(sj), mx));
            if (!all_visible)
                p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_set1_ps((float)(j + delta)), tok, _CMP_LE_OQ), p);
            _mm512_storeu_ps(sj, p);
            psum = _mm512_add_ps(psum, p);
        }
        _mm512_storeu_ps(w->m + 16 * v, mx);
        _mm512_storeu_ps(w->l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(w->l + 16 * v), a, psum));
        _mm512_storeu_ps(w->al + 16 * v, a);
    }
    return rescale;
}

#endif
