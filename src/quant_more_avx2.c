/*
 * quant_more_avx2.c - AVX2 + FMA + F16C kernels for Q4_1, Q5_0, Q5_1 and
 * Q5_K weights, and the Q8_1 activation quantizer (layouts in
 * quant_more.h; quant_avx2.c puts these functions into its table).
 *
 * Compiled without -march flags: every function carries
 * __attribute__((target("avx2,fma,f16c"))) and is reached only through the
 * AVX2 table, which kp_kernels_avx2() hands out when the CPU has all three.
 * Outside x86-64 the file is empty.
 *
 * One 32-element block of a legacy type becomes 32 bytes in element order
 * (bytes 0..15 from the low nibbles, 16..31 from the high nibbles); Q5_0 and
 * Q5_1 OR in bit 4 from qh, expanded one bit per byte:
 *
 *   qh (uint32) --broadcast, vpshufb--> byte j holds qh byte j/8
 *               --AND 1 << (j%8), compare--> 0xFF where bit j is set
 *               --AND 0x10--> bit 4 of quant j
 *
 * Products with vpmaddubsw (unsigned x signed bytes -> int16 pair sums):
 *
 *   Q4_1 . Q8_1   q in 0..15 unsigned; pair sums <= 2*15*128
 *   Q5_1 . Q8_1   q in 0..31 unsigned; pair sums <= 2*31*128 < 32767
 *   Q5_0 . Q8_0   w = q - 16 in -16..15: |w| x sign(a, w)
 *   Q5_K . Q8_K   q in 0..31 unsigned; per 32-element sub-block the int16
 *                 pair sums are multiplied by the 6-bit scale in vpmaddwd
 *                 (<= 63*2*7874 per int32 lane), the mins term is
 *                 m[j] * (bsums[2j] + bsums[2j+1]) in one vpmaddwd
 *
 * The "+ m" of Q4_1/Q5_1 costs one scalar m_w * s_a per block pair (s_a is
 * the Q8_1 block's stored d*sum). dot_tile (any nr, nc >= 1) works on
 * register tiles of 4 weight rows x up to 4 activation rows: each weight
 * block is decoded once per tile and multiplied with the same block of
 * every activation row in it (the tile width is a compile-time constant in
 * each specialisation, so the accumulators stay in registers); Q5_K tiles
 * are 1 weight row x up to 4 activation rows. The weight rows of a tile
 * stay in L1 while the activation rows stream past them.
 *
 * kp_qmore_avx2_act_q8_1 is bit-identical to kp_qmore_quant_row_q8_1 for
 * finite inputs (roundf = round half away from zero, the same 1/d).
 */
#include "quant_more.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "quant_impl.h"

#include "quant_avx2_inl.h"
#define UNROLL _Pragma("GCC unroll 8")

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

AVX2_INLINE float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

/* 16 packed nibble bytes -> 32 bytes in element order (low nibbles, then high). */
AVX2_INLINE __m256i unpack_nibbles(const uint8_t qs[16]) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}

/* 0x10 in byte j where bit j of the little-endian uint32 at qh is set. */
AVX2_INLINE __m256i fifth_bits(const uint8_t qh[4]) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                         3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* ------------------------------------------------------------------------ */
/* Q4_1, Q5_0, Q5_1                                                          */
/* ------------------------------------------------------------------------ */

enum { WQ4_1, WQ5_0, WQ5_1 };

/* A decoded weight block: the unsigned operand of vpmaddubsw, the signed
 * quants (Q5_0 only), scale d and offset m (0 for Q5_0). */
typedef struct {
    __m256i u, q;
    float d, m;
} wblock;

AVX2_INLINE wblock decode(const void *wrow, int64_t ib, int kind) {
    wblock r;
    if (kind == WQ4_1) {
        const kp_block_q4_1 *x = (const kp_block_q4_1 *)wrow + ib;
        r.u = r.q = unpack_nibbles(x->qs);
        r.d = half_to_float(x->d);
        r.m = half_to_float(x->m);
    } else if (kind == WQ5_1) {
        const kp_block_q5_1 *x = (const kp_block_q5_1 *)wrow + ib;
        r.u = r.q = _mm256_or_si256(unpack_nibbles(x->qs), fifth_bits(x->qh));
        r.d = half_to_float(x->d);
        r.m = half_to_float(x->m);
    } else {
        const kp_block_q5_0 *x = (const kp_block_q5_0 *)wrow + ib;
        const __m256i q = _mm256_or_si256(unpack_nibbles(x->qs), fifth_bits(x->qh));
        r.q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        r.u = _mm256_sign_epi8(r.q, r.q);
        r.d = half_to_float(x->d);
        r.m = 0.0f;
    }
    return r;
}

/* Integer dot product of one weight block with 32 activation quants, as 8 int32. */
AVX2_INLINE __m256i block_dot(wblock w, const int8_t *aq, int kind) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)aq);
    const __m256i p16 = kind == WQ5_0 ? _mm256_maddubs_epi16(w.u, _mm256_sign_epi8(a, w.q))
                                      : _mm256_maddubs_epi16(w.u, a);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* One weight row (nb blocks) against NC activation rows (Q8_0 for Q5_0,
 * Q8_1 otherwise); out[c*out_stride] for c < NC. */
AVX2_INLINE void row_legacy(int64_t nb, const void *wrow, const char *a, size_t a_stride,
                            float *out, size_t out_stride, int kind, const int NC) {
    __m256 acc[4];
    float macc[4];
    UNROLL for (int c = 0; c < NC; c++) {
        acc[c] = _mm256_setzero_ps();
        macc[c] = 0.0f;
    }
    for (int64_t ib = 0; ib < nb; ib++) {
        const wblock w = decode(wrow, ib, kind);
        UNROLL for (int c = 0; c < NC; c++) {
            const char *arow = a + (size_t)c * a_stride;
            if (kind == WQ5_0) {
                const kp_block_q8_0 *y = (const kp_block_q8_0 *)arow + ib;
                const __m256i p = block_dot(w, y->qs, kind);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * half_to_float(y->d)),
                                         _mm256_cvtepi32_ps(p), acc[c]);
            } else {
                const kp_block_q8_1 *y = (const kp_block_q8_1 *)arow + ib;
                const __m256i p = block_dot(w, y->qs, kind);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * half_to_float(y->d)),
                                         _mm256_cvtepi32_ps(p), acc[c]);
                macc[c] += w.m * half_to_float(y->s);
            }
        }
    }
    UNROLL for (int c = 0; c < NC; c++) out[(size_t)c * out_stride] = hsum_ps(acc[c]) + macc[c];
}

/*
 * dot_tile's register tile: 4 weight rows x NC (1..4) activation rows. For
 * one block and one activation row, the four rows' int32 partial sums are
 * folded by three vphaddd into one vector whose lanes are rows
 *
 *   hadd(hadd(p0, p1), hadd(p2, p3)) = [s0 s1 s2 s3 | s0' s1' s2' s3']
 *
 * so a block costs one conversion and one FMA per activation row (scaled by
 * [d_w0..d_w3] * d_a); out[c][r] = lane r + lane r+4 (+ the "+ m" terms,
 * m_w[r] * s_a, kept in a 4-lane accumulator). wr[4] may repeat a row when
 * nr < 4; only rows r < nr are stored.
 */
AVX2_INLINE void tile4_legacy(int64_t nb, const char *const *wr, int nr, const char *a,
                              size_t a_stride, float *out, size_t out_stride, int kind,
                              const int NC) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    __m128 accm[4];
    UNROLL for (int c = 0; c < NC; c++) {
        acc[c] = _mm256_setzero_ps();
        accm[c] = _mm_setzero_ps();
    }
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i q[4], u[4];
        float dw[4], mw[4];
        UNROLL for (int r = 0; r < 4; r++) {
            const wblock w = decode(wr[r], ib, kind);
            q[r] = w.q;
            u[r] = w.u;
            dw[r] = w.d;
            mw[r] = w.m;
        }
        const __m128 d4 = _mm_loadu_ps(dw), m4 = _mm_loadu_ps(mw);
        const __m256 d8 = _mm256_set_m128(d4, d4);
        UNROLL for (int c = 0; c < NC; c++) {
            const char *arow = a + (size_t)c * a_stride;
            const int8_t *aq;
            float da;
            if (kind == WQ5_0) {
                const kp_block_q8_0 *y = (const kp_block_q8_0 *)arow + ib;
                aq = y->qs;
                da = half_to_float(y->d);
            } else {
                const kp_block_q8_1 *y = (const kp_block_q8_1 *)arow + ib;
                aq = y->qs;
                da = half_to_float(y->d);
                accm[c] = _mm_fmadd_ps(m4, _mm_set1_ps(half_to_float(y->s)), accm[c]);
            }
            const __m256i av = _mm256_loadu_si256((const __m256i *)aq);
            __m256i p[4];
            UNROLL for (int r = 0; r < 4; r++) {
                const __m256i sa = kind == WQ5_0 ? _mm256_sign_epi8(av, q[r]) : av;
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[r], sa), ones);
            }
            const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d8, _mm256_set1_ps(da)), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) {
        const __m128 v = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(acc[c]), _mm256_extractf128_ps(acc[c], 1)),
                                    accm[c]);
        float tmp[4];
        _mm_storeu_ps(tmp, v);
        for (int r = 0; r < nr; r++) out[(size_t)c * out_stride + (size_t)r] = tmp[r];
    }
}

/* Loop order: groups of 4 weight rows (they stay in L1), then groups of up
 * to 4 activation rows streaming past them. */
AVX2_INLINE void tile_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, float *out, size_t out_stride,
                             int kind) {
    const int64_t nb = n / 32;
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const int nrr = nr - r0 < 4 ? nr - r0 : 4;
        const char *wr[4];
        for (int r = 0; r < 4; r++) wr[r] = (const char *)w + (size_t)(r0 + (r < nrr ? r : nrr - 1)) * w_stride;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const char *ac = (const char *)a + (size_t)c0 * a_stride;
            float *o = out + (size_t)c0 * out_stride + (size_t)r0;
            switch (nc - c0) {
            case 1: tile4_legacy(nb, wr, nrr, ac, a_stride, o, out_stride, kind, 1); break;
            case 2: tile4_legacy(nb, wr, nrr, ac, a_stride, o, out_stride, kind, 2); break;
            case 3: tile4_legacy(nb, wr, nrr, ac, a_stride, o, out_stride, kind, 3); break;
            default: tile4_legacy(nb, wr, nrr, ac, a_stride, o, out_stride, kind, 4); break;
            }
        }
    }
}

#define LEGACY(type, kind)                                                                   \
    AVX2 void kp_qmore_avx2_vec_dot_##type(int64_t n, float *s, const void *w, const void *a) { \
        row_legacy(n / 32, w, a, 0, s, 0, kind, 1);                                          \
    }                                                                                        \
    AVX2 void kp_qmore_avx2_tile_##type(int64_t n, int nr, int nc, const void *w,            \
                                        size_t w_stride, const void *a, size_t a_stride,     \
                                        float *out, size_t out_stride) {                     \
        tile_legacy(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind);             \
    }
LEGACY(q4_1, WQ4_1)
LEGACY(q5_0, WQ5_0)
LEGACY(q5_1, WQ5_1)
#undef LEGACY

/* ------------------------------------------------------------------------ */
/* Q5_K                                                                      */
/* ------------------------------------------------------------------------ */

/* sc[0..7] and m[0..7] of the 12 packed scale bytes (Q4_K's packing, see
 * quant.h), with 32-bit word operations (x86 is little-endian). */
AVX2_INLINE void q5k_scales(const uint8_t packed[12], uint8_t out[16]) {
    uint32_t u[3], r[4];
    memcpy(u, packed, sizeof u);
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    r[0] = u[0] & k6;                                    /* sc 0..3 */
    r[1] = (u[2] & k4) | ((u[0] >> 6) & k2) << 4;        /* sc 4..7 */
    r[2] = u[1] & k6;                                    /* m 0..3 */
    r[3] = ((u[2] >> 4) & k4) | ((u[1] >> 6) & k2) << 4; /* m 4..7 */
    memcpy(out, r, sizeof r);
}

/* One Q5_K weight row against NC Q8_K activation rows. */
AVX2_INLINE void row_q5_K(int64_t nb, const void *wrow, const char *a, size_t a_stride,
                          float *out, size_t out_stride, const int NC) {
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();

    for (int64_t i = 0; i < nb; i++) {
        const kp_block_q5_K *x = (const kp_block_q5_K *)wrow + i;
        uint8_t scm[16]; /* sc[8] then m[8] */
        q5k_scales(x->scales, scm);
        /* mins duplicated per pair of bsums: m0 m0 m1 m1 ... m7 m7 as int16 */
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
            _mm_loadu_si128((const __m128i *)scm),
            _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
        const float dx = half_to_float(x->d), dminx = half_to_float(x->dmin);
        const __m256i hb = _mm256_loadu_si256((const __m256i *)x->qh);

        __m256i sumi[4];
        UNROLL for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
            const __m256i h_lo = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one);
            const __m256i h_hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one);
            const __m256i q_lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(h_lo, 4));
            const __m256i q_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                                                 _mm256_slli_epi16(h_hi, 4));
            const __m256i s_lo = _mm256_set1_epi16(scm[2 * j]), s_hi = _mm256_set1_epi16(scm[2 * j + 1]);
            UNROLL for (int c = 0; c < NC; c++) {
                const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
                const __m256i p_lo = _mm256_maddubs_epi16(q_lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j)));
                const __m256i p_hi = _mm256_maddubs_epi16(q_hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(p_lo, s_lo),
                                                                     _mm256_madd_epi16(p_hi, s_hi)));
            }
        }
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
            const __m256i pm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins16);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y->d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_set1_ps(dminx * y->d), _mm256_cvtepi32_ps(pm), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) out[(size_t)c * out_stride] = hsum_ps(acc[c]);
}

AVX2 void kp_qmore_avx2_vec_dot_q5_K(int64_t n, float *s, const void *w, const void *a) {
    row_q5_K(n / KP_QK_K, w, a, 0, s, 0, 1);
}

AVX2 void kp_qmore_avx2_tile_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                                  const void *a, size_t a_stride, float *out, size_t out_stride) {
    const int64_t nb = n / KP_QK_K;
    for (int r = 0; r < nr; r++) {
        const void *wr = (const char *)w + (size_t)r * w_stride;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const char *ac = (const char *)a + (size_t)c0 * a_stride;
            float *o = out + (size_t)c0 * out_stride + (size_t)r;
            switch (nc - c0) {
            case 1: row_q5_K(nb, wr, ac, a_stride, o, out_stride, 1); break;
            case 2: row_q5_K(nb, wr, ac, a_stride, o, out_stride, 2); break;
            case 3: row_q5_K(nb, wr, ac, a_stride, o, out_stride, 3); break;
            default: row_q5_K(nb, wr, ac, a_stride, o, out_stride, 4); break;
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Q8_1 activations                                                          */
/* ------------------------------------------------------------------------ */


AVX2 void kp_qmore_avx2_act_q8_1(const float *x, void *dst, int64_t n) {
    kp_block_q8_1 *y = dst;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t i = 0; i < n / KP_QK8_1; i++, x += KP_QK8_1) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                       _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
        const float d = hmax_ps(m) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        const __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[k], idv)));
        const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        /* 4 x 8 int32 -> 32 int8 in element order */
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[i].qs,
                            _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        y[i].d = kp_fp32_to_fp16(d);
        y[i].s = kp_fp32_to_fp16((float)sum * d);
    }
}

#else /* not x86-64: the AVX2 table does not exist */

typedef int kp_quant_more_avx2_unused;

#endif
