/*
 * quant_avx2_inl.h - private to src/quant*_avx2.c: the target macros (AVX2,
 * VNNI) and the small AVX2 helpers both kernel files use (horizontal sums,
 * FP16 loads, 8x8 transposes, panel stores, the Q4_K/Q5_K panel and its
 * VNNI step). Include only on x86-64,
 * after <immintrin.h>.
 */
#ifndef KP_QUANT_AVX2_INL_H
#define KP_QUANT_AVX2_INL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant_impl.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define VNNI_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define UNROLL _Pragma("GCC unroll 8")

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

/* a * b + c, rounded once (as one lane of vfmadd). */
AVX2_INLINE float fma_ss(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

AVX2_INLINE int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 8 FP16 values at byte offset off in rows wr[0..7]. */
AVX2_INLINE __m256 half8_at(const char *const *wr, size_t off) {
    __m128i h = _mm_cvtsi32_si128(*(const uint16_t *)(wr[0] + off));
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[1] + off), 1);
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[2] + off), 2);
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[3] + off), 3);
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[4] + off), 4);
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[5] + off), 5);
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[6] + off), 6);
    h = _mm_insert_epi16(h, *(const uint16_t *)(wr[7] + off), 7);
    return _mm256_cvtph_ps(h);
}

/* 8 x 8 transpose of int32, stored: *dst[g] = lane g of every row v[0..7],
 * in row order. Each result goes from its register to its place (a copy
 * through an array let the compiler join two 256-bit stores into one
 * 512-bit reload, which cannot be forwarded and stalled the panel packs). */
AVX2_INLINE void transpose8_epi32_store(const __m256i v[8], __m256i *const dst[8]) {
    __m256i t[8], u[8];
    UNROLL for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    UNROLL for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    UNROLL for (int i = 0; i < 4; i++) {
        _mm256_store_si256(dst[i], _mm256_permute2x128_si256(u[i], u[4 + i], 0x20));
        _mm256_store_si256(dst[4 + i], _mm256_permute2x128_si256(u[i], u[4 + i], 0x31));
    }
}

/* The 8 exact sums of 8 int32 vectors, lane r = sum of v[r]. */
AVX2_INLINE __m256i fold8_epi32(const __m256i v[8]) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* Sums 8 rows' results of one activation row into out[0..nr). */
AVX2_INLINE void panel_store(__m256 acc, float *o, int nr, int add) {
    if (nr == 8) {
        _mm256_storeu_ps(o, add ? _mm256_add_ps(acc, _mm256_loadu_ps(o)) : acc);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, acc);
        for (int r = 0; r < nr; r++) o[r] = add ? o[r] + tmp[r] : tmp[r];
    }
}

/* out[c*os + r] = 0 for r < nr, c < nc: the result of an empty dot product. */
AVX2_INLINE void zero_out(int nr, int nc, float *out, size_t os) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) out[(size_t)c * os + (size_t)r] = 0.0f;
}

/* Weight repacking reads 8 rows at once, straight from DRAM in batched
 * decode: each pack step asks for the row's data PACK_PREFETCH_BLOCKS
 * blocks ahead (8 concurrent Q8_0 decode streams on the 135M shape: 312 ->
 * ~370 tok/s). A hint only: addresses past the row are never loaded. */
#define PACK_PREFETCH_BLOCKS 4
AVX2_INLINE void pack_prefetch(const char *row, size_t at, size_t blk) {
    _mm_prefetch(row + at + PACK_PREFETCH_BLOCKS * blk, _MM_HINT_T0);
}

/* Decode (few activation rows) waits on the latency of weight reads more
 * than on arithmetic: the row tiles of legacy and float weights read 4 or 8
 * short rows side by side, which the hardware prefetcher does not run far
 * enough ahead of. So while a tile computes rows r..r+7 at column k, it asks
 * for rows r+P.. at column k, P the multiple of 8 rows nearest above
 * DECODE_PREFETCH_BYTES (one thread's next stretch of rows, as the pool
 * hands out runs of tasks). 135M shape, 2 threads: Q8_0 decode ~110 -> ~170
 * tok/s, Q4_0 ~165 -> ~245. decode_pf gives the byte distance, 0 (off)
 * from PANEL_MIN_COLS activation rows on (the panel path, compute-bound). */
#define DECODE_PREFETCH_BYTES 6144
AVX2_INLINE size_t decode_pf(size_t w_stride, int nc, int panel_min_cols) {
    if (nc >= panel_min_cols || w_stride == 0) return 0;
    size_t rows = (DECODE_PREFETCH_BYTES + w_stride - 1) / w_stride;
    return ((rows + 7) & ~(size_t)7) * w_stride;
}

/* Below this many activation rows a panel pack (gemm with a few decode
 * sequences) prefetches the rows decode_pf bytes ahead, as the tiles do;
 * from it on the panels are compute-bound and PACK_PREFETCH_BLOCKS serves. */
#define PANEL_PF_COLS 16

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


/* The 8 6-bit scales (bytes 0..7) and 8 6-bit mins (bytes 8..15) of the 12
 * packed scale bytes of a Q4_K or Q5_K super-block (quant.h's packing), in
 * vector registers: with u0..u2 the three little-endian words,
 *   sc 0..3 = u0 & 0x3f..           sc 4..7 = (u2 & 0x0f..) | (u0 >> 2 & 0x30..)
 *   m  0..3 = u1 & 0x3f..           m  4..7 = (u2 >> 4 & 0x0f..) | (u1 >> 2 & 0x30..)
 * (built in general registers and reloaded as a vector, the four words
 * could not be store-forwarded). Reads 16 bytes from packed: the scales are
 * followed by the block's quants in both layouts. */
AVX2_INLINE __m128i kq_scales_mins(const uint8_t *packed) {
    const __m128i u = _mm_loadu_si128((const __m128i *)packed);
    const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i b = _mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)), 2);
    const __m128i m1 = _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f);
    const __m128i m2 = _mm_setr_epi32(0, 0x30303030, 0, 0x30303030);
    return _mm_or_si128(_mm_and_si128(a, m1), _mm_and_si128(b, m2));
}

/* A panel of 8 weight rows over one super-block of a K-quant with 8
 * sub-blocks of 32, a scale and a min each (Q4_K, Q5_K): quants repacked so
 * a 32-byte step holds 4 consecutive quants of every row, per-row scales
 * and mins in int32 lanes, the super-block scales as floats. */
typedef struct {
    __m256i q[8][8];       /* [sub-block][step]: 8 rows x 4 unsigned quants */
    __m256i sc[8], mn[8];  /* per row: scale j (AVX2 int16 pair, VNNI int32); min j as an int16 pair */
    float d[8], dmin[8];   /* per row: the super-block's scale and min scale */
} kmin_panel;

/* 4 activation quants at qs[off] of super-block i of activation row c, in every lane. */
#define KQ_A4(ar, c, i, off) _mm256_set1_epi32(load_i32(((const kp_block_q8_K *)(ar)[c] + (i))->qs + (off)))

/* acc[c] += one kmin_panel x NC activation rows (super-block i), VNNI:
 * vpdpbusd over each sub-block, vpmulld by its scale, the mins against the
 * activation bsums by vpdpwssd. */
VNNI_INLINE void kmin_panel_step_vnni(const kmin_panel *p, const char *const *ar, int64_t i, __m256 *acc,
                                      const int NC) {
    __m256i isum[4], s[4];
    UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_setzero_si256();
        UNROLL for (int g = 0; g < 8; g++) {
            const __m256i w = _mm256_load_si256(&p->q[j][g]);
            UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_dpbusd_epi32(s[c], w, KQ_A4(ar, c, i, 32 * j + 4 * g));
        }
        const __m256i sc = _mm256_load_si256(&p->sc[j]);
        UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s[c], sc));
    }
    const __m256 d8 = _mm256_load_ps(p->d), m8 = _mm256_load_ps(p->dmin);
    UNROLL for (int c = 0; c < NC; c++) {
        const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
        __m256i im = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 8; j++)
            im = _mm256_dpwssd_epi32(im, _mm256_load_si256(&p->mn[j]), _mm256_set1_epi32(load_i32(&y->bsums[2 * j])));
        const __m256 da = _mm256_set1_ps(y->d);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d8, da), acc[c]);
        acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(m8, da), acc[c]);
    }
}

#endif
