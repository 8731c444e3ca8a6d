/*
 * quant_avx2.c - the "avx2" kernel table (quant.h): AVX2 + FMA + F16C
 * kernels for every type with kernels (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4; byte layouts in quant_blocks.h).
 *
 * Compiled without -march flags: every function carries
 * __attribute__((target("avx2,fma,f16c"))) (AVX2, AVX2_INLINE of
 * quant_avx2_inl.h), and dispatch.c hands the table out only when the CPU
 * has all three. Outside x86-64 the file is empty. The avx512vnni table
 * (quant_avx512.c) shares this table's quantize_act, vec_dot, integer
 * dot_tile and attention helpers: they are the kp_avx2_* functions of
 * quant_avx2.h. The loops of dot_tile and gemm, the weight decoding and the
 * panel packs that both tables use are in quant_avx2_inl.h; this file
 * gives them the AVX2 tiles.
 *
 * Integer dot products use vpmaddubsw, which multiplies unsigned by signed
 * bytes and adds adjacent pairs into int16 with saturation, then vpmaddwd
 * to widen to int32:
 *
 *   Q8_0 . Q8_0   |w| (unsigned) x sign(a, w)  - the "sign trick"; |w|, |a| <= 127
 *                 keeps each pair sum <= 2*127*127 < 32767
 *   Q4_0 . Q8_0   q in 0..15 is unsigned: maddubs(q, a) - maddubs(8, a)
 *   MXFP4 . Q8_0  the codes looked up as int8 (|w| <= 12), then the sign
 *                 trick; one tile for every call shape (quant_avx2_inl.h)
 *   Q4_1 . Q8_1   S = q.a                        block: dw*da*S + mw*sa
 *   Q5_1 . Q8_1   S = q.a                        (sa: the stored block sum)
 *   Q5_0 . Q8_0   S = (q - 16).a = q.a + bias/8  block: dw*da*S
 *                 (bias = -128 sum(a), kp_q8_0_aux's, exact; the 5-bit
 *                 pair sums stay within 2*31*128 = 7936)
 *   Q4_K . Q8_K   q in 0..15 is already unsigned; vpmaddwd with the 6-bit
 *   Q5_K . Q8_K   sub-block scale broadcast to all lanes; the mins term is
 *                 m[j] * (bsums[2j] + bsums[2j+1]) in one vpmaddwd
 *   Q6_K . Q8_K   q + 32 in 0..63 is unsigned (pair sums <= 2*63*127); the
 *                 "- 32" is applied once per block as 32 * sum_j sc[j]*bsums[j]
 *
 * Per K-quant super-block everything stays in int32 and is converted to
 * float once (sub-block scales are integers). The lane layout of one
 * 256-bit Q6_K step (32 quants = 2 sub-blocks of 16):
 *
 *   bytes   0..15 | 16..31          quants (elements 32k .. 32k+31)
 *   int16   0..7  | 8..15           vpmaddubsw pair sums
 *   scale   sc[2k]| sc[2k+1]        each broadcast over its 128-bit lane
 *
 * A Q5_K super-block is 4 chunks of 64 elements: 32 bytes of qs each (low
 * nibbles: sub-block 2c, high nibbles: sub-block 2c+1) and bits 2c, 2c+1
 * of the 32 qh bytes, moved to bit 4 with one shift and one AND.
 *
 * dot_tile (and gemm with few activation rows, i.e. decode): the weight row
 * is the outer loop; each weight block is loaded and decoded once (nibble
 * unpacking, 6-bit scale unpacking, sign splitting) and then multiplied with
 * the same block of all nc activation rows, which stay hot in L1 across the
 * rows. Tiles take 8 weight rows at a time and fold their partial sums with
 * vphaddd, so that lanes are rows. The column count (1..4) is a
 * compile-time constant in each specialisation, so accumulators live in
 * registers.
 *
 * gemm with many activation rows (prefill), integer types: the panels of
 * quant_avx2_inl.h (8 weight rows per vector, one int32 lane per row, 4
 * activation quants broadcast), multiplied with vpmaddubsw. Float types use
 * register tiles of 2 rows x 6 activation rows (4 x C in decode).
 *
 * Every output follows the canonical order of quant_avx2_inl.h, so dot_tile
 * and gemm give each output the same bits whatever the call's shape, and
 * the integer types the same bits as the avx512vnni table.
 *
 * Stack use: a gemm call keeps its panels and staged scales on the stack,
 * at most about 48 KiB (panel_stage 44 KiB, leg_stage 48 KiB, kq_stage 34
 * KiB; 24 KiB for float types).
 *
 * quantize_act is bit-identical to the reference quantizers of quant_ref.c
 * for finite inputs (Q8_0 and Q8_1 round half away from zero like roundf,
 * with the same 1/d; Q8_K rounds to nearest even like nearest_int; F16
 * uses vcvtps2ph with round-to-nearest-even).
 */
#include "kernels/quant_avx2.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/quant_avx2_inl.h"
#include "kernels/tables.h"

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

AVX2_INLINE __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2_INLINE __m256 load_bf16x8(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* 8 consecutive elements of a float-type row, as floats. */
AVX2_INLINE __m256 load_x8(const void *row, int64_t i, int kind) {
    if (kind == ELEM_F32) return _mm256_loadu_ps((const float *)row + i);
    if (kind == ELEM_F16) return load_f16x8((const uint16_t *)row + i);
    return load_bf16x8((const uint16_t *)row + i);
}

/* Largest of the 8 lanes. */
AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* (int)roundf(t) on 8 lanes (round half away from zero), |t| < 2^23:
 * t + copysign(0.49999997, t), truncated. The largest float below 1/2
 * added in float rounds up to the next integer exactly when roundf does
 * (checked against roundf for every float of magnitude below 2^23, both
 * signs); 4 instructions where comparing the fraction took 8. */
AVX2_INLINE __m256i round_half_away_epi32(__m256 t) {
    const __m256 h = _mm256_or_ps(_mm256_and_ps(t, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0.49999997f));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, h));
}

/* ------------------------------------------------------------------------ */
/* F32, F16 and BF16                                                         */
/* ------------------------------------------------------------------------ */

AVX2_INLINE float dot_float_rows(int64_t n, const void *x, int kx, const void *y, int ky) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_x8(x, i, kx), load_x8(y, i, ky), a0);
        a1 = _mm256_fmadd_ps(load_x8(x, i + 8, kx), load_x8(y, i + 8, ky), a1);
        a2 = _mm256_fmadd_ps(load_x8(x, i + 16, kx), load_x8(y, i + 16, ky), a2);
        a3 = _mm256_fmadd_ps(load_x8(x, i + 24, kx), load_x8(y, i + 24, ky), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load_x8(x, i, kx), load_x8(y, i, ky), a0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += load_x1(x, i, kx) * load_x1(y, i, ky);
    return s;
}

AVX2 void kp_avx2_vec_dot_f32(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_float_rows(n, w, ELEM_F32, a, ELEM_F32);
}
AVX2 void kp_avx2_vec_dot_f16(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_float_rows(n, w, ELEM_F16, a, ELEM_F16);
}
AVX2 void kp_avx2_vec_dot_bf16(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_float_rows(n, w, ELEM_BF16, a, ELEM_BF16);
}

/*
 * F32/F16/BF16 (dot_tile and gemm): a register tile of R weight rows x C
 * activation rows (R*C <= 12 accumulators), the activation rows staged as
 * F32 per K chunk of FP_KC elements, the weight rows converted as they are
 * loaded. Per step of 8 elements: R weight loads, C activation loads and
 * R*C FMAs, one 8-lane accumulator per output:
 *
 *   acc[r][c] = fma(w_r[k..k+7], a_c[k..k+7], acc[r][c])
 *
 * Elements past n count as zero (the last step of a row is loaded through
 * a zero-padded copy). At the end of a chunk each accumulator is summed in
 * one fixed order (hsum_ps) and written to out, or added for later chunks.
 * Many activation rows take 2 x 6 tiles (FMA-bound); few take 4 x C, whose
 * 4 independent rows keep the FMA units busy in decode.
 */
#define FP_KC 1024 /* elements per K chunk */
#define FP_NC 6   /* activation rows per tile (at most) */

AVX2_INLINE __m256 float_w8(const char *row, int64_t k, int64_t n, int kind) {
    if (k + 8 <= n) return load_x8(row, k, kind);
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = k + i < n ? load_x1(row, k + i, kind) : 0.0f;
    return _mm256_loadu_ps(t);
}

AVX2_INLINE void float_tile(const char *const *wr, int kind, int64_t k0, int64_t len8, int64_t n,
                            const float (*sa)[FP_KC], int nr, float *out, size_t os, int add, size_t pf,
                            const int R, const int C) {
    const size_t es = kind == ELEM_F32 ? 4 : 2;
    __m256 acc[4][FP_NC];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t k = 0; k < len8; k += 8) {
        __m256 w[4];
        if (pf && (size_t)(k0 + k) * es % 64 < 8 * es) /* once per cache line */
            UNROLL for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + (size_t)(k0 + k) * es, _MM_HINT_T0);
        UNROLL for (int r = 0; r < R; r++) w[r] = float_w8(wr[r], k0 + k, n, kind);
        UNROLL for (int c = 0; c < C; c++) {
            const __m256 av = _mm256_load_ps(&sa[c][k]);
            UNROLL for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(w[r], av, acc[r][c]);
        }
    }
    UNROLL for (int c = 0; c < C; c++)
        UNROLL for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            float *o = out + (size_t)c * os + (size_t)r;
            const float v = hsum_ps(acc[r][c]);
            *o = add ? *o + v : v;
        }
}

AVX2_INLINE void tile_float(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                            size_t a_stride, float *out, size_t out_stride, int kind) {
    float sa[FP_NC][FP_KC] __attribute__((aligned(32)));
    const size_t pf = decode_pf(w_stride, nc, FP_NC + 1);
    if (n <= 0) zero_out(nr, nc, out, out_stride);
    for (int64_t k0 = 0; k0 < n; k0 += FP_KC) {
        const int64_t len = n - k0 < FP_KC ? n - k0 : FP_KC;
        const int64_t len8 = (len + 7) & ~(int64_t)7;
        for (int c0 = 0; c0 < nc; c0 += FP_NC) {
            const int ncc = nc - c0 < FP_NC ? nc - c0 : FP_NC;
            for (int c = 0; c < ncc; c++) {
                const char *arow = (const char *)a + (size_t)(c0 + c) * a_stride;
                int64_t k = 0;
                for (; k + 8 <= len; k += 8) _mm256_store_ps(&sa[c][k], load_x8(arow, k0 + k, kind));
                for (; k < len8; k++) sa[c][k] = k < len ? load_x1(arow, k0 + k, kind) : 0.0f;
            }
            const int R = ncc <= 3 ? 4 : 2;
            for (int r0 = 0; r0 < nr; r0 += R) {
                const int nrr = nr - r0 < R ? nr - r0 : R;
                const char *wr[4];
                for (int r = 0; r < R; r++) wr[r] = (const char *)w + (size_t)(r0 + (r < nrr ? r : nrr - 1)) * w_stride;
                float *o = out + (size_t)c0 * out_stride + (size_t)r0;
                const float(*sp)[FP_KC] = (const float(*)[FP_KC])sa;
                const int add = k0 > 0;
                switch (ncc) {
                case 1: float_tile(wr, kind, k0, len8, n, sp, nrr, o, out_stride, add, pf, 4, 1); break;
                case 2: float_tile(wr, kind, k0, len8, n, sp, nrr, o, out_stride, add, pf, 4, 2); break;
                case 3: float_tile(wr, kind, k0, len8, n, sp, nrr, o, out_stride, add, pf, 4, 3); break;
                case 4: float_tile(wr, kind, k0, len8, n, sp, nrr, o, out_stride, add, pf, 2, 4); break;
                case 5: float_tile(wr, kind, k0, len8, n, sp, nrr, o, out_stride, add, pf, 2, 5); break;
                default: float_tile(wr, kind, k0, len8, n, sp, nrr, o, out_stride, add, pf, 2, 6); break;
                }
            }
        }
    }
}

#define FLOAT_TILE(name, gname, kind)                                                           \
    static AVX2 void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,           \
                          const void *a, size_t a_stride, float *out, size_t out_stride) {     \
        tile_float(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind);                 \
    }                                                                                           \
    static AVX2 void gname(int64_t n, int nr, int nc, const void *w, size_t w_stride,          \
                           const void *a, size_t a_stride, const void *aux, size_t aux_stride,  \
                           float *out, size_t out_stride) {                                    \
        (void)aux;                                                                              \
        (void)aux_stride;                                                                       \
        tile_float(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind);                 \
    }
FLOAT_TILE(tile_f32, gemm_f32, ELEM_F32)
FLOAT_TILE(tile_f16, gemm_f16, ELEM_F16)
FLOAT_TILE(tile_bf16, gemm_bf16, ELEM_BF16)
#undef FLOAT_TILE

/* ------------------------------------------------------------------------ */
/* Q8_0 and Q4_0 weights . Q8_0 activations                                  */
/* ------------------------------------------------------------------------ */

/*
 * Four halves at p as floats (lane 0 = the half at p). Used for block
 * scales: the 8-byte load stays inside a Q8_0/Q4_0 block (d + quants), and
 * the memory form of vcvtph2ps keeps the shuffle port free, which bounds
 * these loops otherwise.
 */
AVX2_INLINE __m128 half4_at(const void *p) {
    return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));
}

/* A decoded Q8_0/Q4_0 weight block: the quants in element order (signed
 * for Q8_0, unsigned 0..15 for Q4_0), what vpmaddubsw takes as its unsigned
 * operand (|q| for Q8_0, q for Q4_0), and the scale in lane 0 of d. */
typedef struct {
    __m256i q, u;
    __m128 d;
} legacy_w;

AVX2_INLINE legacy_w legacy_weights(const void *wrow, int64_t ib, int kind) {
    legacy_w r;
    if (kind == WQ8_0) {
        const kp_block_q8_0 *x = (const kp_block_q8_0 *)wrow + ib;
        r.q = _mm256_loadu_si256((const __m256i *)x->qs);
        r.u = _mm256_sign_epi8(r.q, r.q);
        r.d = half4_at(&x->d);
    } else {
        const kp_block_q4_0 *x = (const kp_block_q4_0 *)wrow + ib;
        const __m128i b = _mm_loadu_si128((const __m128i *)x->qs);
        const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b); /* 16..31 | 0..15 */
        r.q = r.u = _mm256_and_si256(both, _mm256_set1_epi8(0xF));
        r.d = half4_at(&x->d);
    }
    return r;
}

/* The 32 products weight x activation of one block pair, summed to 8 int32.
 * Q8_0: |w| x sign(a, w). Q4_0: (q - 8).a = maddubs(q, a) - maddubs(8, a),
 * each pair sum within +-3810. */
AVX2_INLINE __m256i legacy_pair(legacy_w w, __m256i act, int kind) {
    __m256i p16;
    if (kind == WQ8_0)
        p16 = _mm256_maddubs_epi16(w.u, _mm256_sign_epi8(act, w.q));
    else
        p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(w.u, act),
                               _mm256_maddubs_epi16(_mm256_set1_epi8(8), act));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* acc += (scale product) * (integer dot) for block ib of one row pair. */
AVX2_INLINE __m256 legacy_dot_block(const void *wrow, const kp_block_q8_0 *y, int64_t ib, int kind,
                                    __m256 acc) {
    const legacy_w w = legacy_weights(wrow, ib, kind);
    const __m256i p = legacy_pair(w, _mm256_loadu_si256((const __m256i *)y[ib].qs), kind);
    const __m256 d = _mm256_broadcastss_ps(_mm_mul_ss(w.d, half4_at(&y[ib].d)));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
}

/* vec_dot: two accumulators (even/odd blocks) keep consecutive FMAs apart. */
AVX2_INLINE float dot_legacy(int64_t nb, const void *wrow, const kp_block_q8_0 *y, int kind) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        acc0 = legacy_dot_block(wrow, y, ib, kind, acc0);
        acc1 = legacy_dot_block(wrow, y, ib + 1, kind, acc1);
    }
    if (ib < nb) acc0 = legacy_dot_block(wrow, y, ib, kind, acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}
AVX2 void kp_avx2_vec_dot_q8_0(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_legacy(n / KP_QK8_0, w, a, WQ8_0);
}
AVX2 void kp_avx2_vec_dot_q4_0(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_legacy(n / KP_QK4_0, w, a, WQ4_0);
}

/*
 * Q8_0/Q4_0 with few activation rows (decode, dot_tile): a tile of 8 weight
 * rows x NC (1..4) activation rows. For one block and one activation row c,
 * each weight row gives an int32 vector of 8 partial sums; vphaddd and one
 * cross-lane add fold the 8 vectors into the 8 exact block sums, one lane
 * per row, and one conversion and one FMA finish the block for 8 rows:
 *
 *   p_r = vpmaddwd(vpmaddubsw(|w_r|, sign(a_c, w_r)), 1)     r = 0..7
 *   h = hadd(hadd(p0, p1), hadd(p2, p3)) = [s0 s1 s2 s3 | s0' s1' s2' s3']
 *   (likewise rows 4..7), then [s0+s0' .. s3+s3' | s4+s4' .. s7+s7']
 *   acc_c = fma(float(that), dw[8 rows] * da_c, acc_c)
 *
 * Q4_0 quants q are unsigned already: vpmaddubsw(q, a) gives q.a in int16
 * pairs (<= 2*15*128), and (q - 8).a = q.a - 8 sum(a) = q.a + bias/16. The
 * 8 weight scales are converted in the loop; rows missing from a partial
 * group repeat the last row (computed, never stored).
 */

/* One 8 x NC tile over blocks [ib0, ib0 + len); wr[8] row pointers (repeats
 * allowed), ar[NC] activation rows, ax[c] their aux entries from ib0. */
AVX2_INLINE void oct_tile(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                          const kp_q8_0_aux *const *ax, int kind, int nr, float *out, size_t os,
                          int add, size_t pf, const int NC, const int R) {
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t blk = kind == WQ8_0 ? sizeof(kp_block_q8_0) : sizeof(kp_block_q4_0);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        __m256i q[8], u[8];
        if (pf) UNROLL for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + (size_t)ib * blk, _MM_HINT_T0);
        UNROLL for (int r = 0; r < R; r++) {
            q[r] = legacy_quants(wr[r], ib, kind);
            u[r] = kind == WQ8_0 ? _mm256_sign_epi8(q[r], q[r]) : q[r];
        }
        const __m256 dw8 = half8_at(wr, (size_t)ib * blk);
        UNROLL for (int c = 0; c < NC; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)((const kp_block_q8_0 *)ar[c] + ib)->qs);
            __m256i p[8];
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i s = kind == WQ8_0 ? _mm256_sign_epi8(av, q[r]) : av;
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[r], s), ones);
            }
            UNROLL for (int r = R; r < 8; r++) p[r] = p[r - R]; /* R = 4: rows 4..7 unused */
            __m256i t = fold8_epi32(p);
            if (kind == WQ4_0) t = _mm256_add_epi32(t, _mm256_set1_epi32(ax[c][b].bias / 16));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw8, _mm256_set1_ps(ax[c][b].d)), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

#define Q4_DOT_AVX2(lo, hi, alo, ahi)                                                                          \
    _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi)),          \
                      _mm256_set1_epi16(1))

AVX2_INLINE void q4_tile(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                         const kp_q8_0_aux *const *ax, int nr, float *out, size_t os, int add, size_t pf,
                         const int NC) {
    Q4_TILE_BODY(Q4_DOT_AVX2)
}
#undef Q4_DOT_AVX2

/* The avx2 table's tile of tile_legacy (legacy_rows_fn): Q4_0 takes row
 * pairs (q4_tile) when more than 4 rows remain, else both types oct_tile
 * (4 rows or fewer: compute 4). */
AVX2_INLINE int legacy_rows_avx2(int64_t ib0, int64_t len, const char *const *wr, size_t w_stride, int rows_left,
                                 const char *const *ar, const kp_q8_0_aux *const *ax, int kind, float *o, size_t os,
                                 int add, int ncc, size_t pf) {
    (void)w_stride;
    const int nrr = rows_left < 8 ? rows_left : 8;
    if (kind == WQ4_0 && nrr > 4) {
        switch (ncc) {
        case 1: q4_tile(ib0, len, wr, ar, ax, nrr, o, os, add, pf, 1); break;
        case 2: q4_tile(ib0, len, wr, ar, ax, nrr, o, os, add, pf, 2); break;
        case 3: q4_tile(ib0, len, wr, ar, ax, nrr, o, os, add, pf, 3); break;
        default: q4_tile(ib0, len, wr, ar, ax, nrr, o, os, add, pf, 4); break;
        }
        return 8;
    }
    switch (ncc + 4 * (nrr > 4)) {
    case 1: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 1, 4); break;
    case 2: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 2, 4); break;
    case 3: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 3, 4); break;
    case 4: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 4, 4); break;
    case 5: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 1, 8); break;
    case 6: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 2, 8); break;
    case 7: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 3, 8); break;
    default: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, os, add, pf, 4, 8); break;
    }
    return 8;
}

/* One AVX2 panel (8 rows) x NC activation rows ar[] over len blocks from
 * ib0; ax[c] are the rows' aux entries from block ib0. */
AVX2_INLINE void panel_tile(const __m256i (*q)[8], const float (*dw)[8], const char *const *ar,
                            const kp_q8_0_aux *const *ax, int64_t ib0, int64_t len, int kind,
                            int nr, float *out, size_t os, int add, const int NC) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int8_t *aq[4];
        UNROLL for (int c = 0; c < NC; c++) aq[c] = ((const kp_block_q8_0 *)ar[c] + ib0 + b)->qs;
        __m256i s[4];
        UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_setzero_si256();
        UNROLL for (int g = 0; g < 8; g++) {
            const __m256i w = _mm256_load_si256(&q[b][g]);
            if (kind == WQ8_0) {
                const __m256i u = _mm256_sign_epi8(w, w);
                UNROLL for (int c = 0; c < NC; c++) {
                    const __m256i a4 = _mm256_set1_epi32(load_i32(aq[c] + 4 * g));
                    const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(a4, w));
                    s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(p, ones));
                }
            } else {
                UNROLL for (int c = 0; c < NC; c++) {
                    const __m256i a4 = _mm256_set1_epi32(load_i32(aq[c] + 4 * g));
                    s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(w, a4));
                }
            }
        }
        const __m256 d8 = _mm256_load_ps(dw[b]);
        UNROLL for (int c = 0; c < NC; c++) {
            __m256i t = s[c];
            if (kind == WQ4_0) /* + bias/16 = -8 sum(a) */
                t = _mm256_add_epi32(_mm256_madd_epi16(t, ones), _mm256_srai_epi32(_mm256_set1_epi32(ax[c][b].bias), 4));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d8, _mm256_set1_ps(ax[c][b].d)), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

/* The avx2 table's products of a K chunk in gemm_panel (legacy_panels_fn):
 * panel by panel, 4 activation rows at a time. */
AVX2_INLINE void legacy_panels_avx2(const panel_stage *st, int rc0, int rc, int n_panels, const void *a,
                                    size_t a_stride, const kp_q8_0_aux *const *axc, int cc0, int ccn, int64_t ib0,
                                    int64_t len, int kind, float *out, size_t out_stride) {
    for (int p = 0; p < n_panels; p++) {
        const int npr = rc - 8 * p < 8 ? rc - 8 * p : 8;
        const __m256i(*q)[8] = (const __m256i(*)[8])st->q[p];
        const float(*dw)[8] = (const float(*)[8])st->dw[p];
        for (int c0 = 0; c0 < ccn; c0 += 4) {
            const int ncc = ccn - c0 < 4 ? ccn - c0 : 4;
            const char *ar[4];
            for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(cc0 + c0 + c) * a_stride;
            float *o = out + (size_t)(cc0 + c0) * out_stride + (size_t)(rc0 + 8 * p);
            const kp_q8_0_aux *const *ax = axc + c0;
            const int add = ib0 > 0;
            switch (ncc) {
            case 1: panel_tile(q, dw, ar, ax, ib0, len, kind, npr, o, out_stride, add, 1); break;
            case 2: panel_tile(q, dw, ar, ax, ib0, len, kind, npr, o, out_stride, add, 2); break;
            case 3: panel_tile(q, dw, ar, ax, ib0, len, kind, npr, o, out_stride, add, 3); break;
            default: panel_tile(q, dw, ar, ax, ib0, len, kind, npr, o, out_stride, add, 4); break;
            }
        }
    }
}

AVX2 void kp_avx2_dot_tile_q8_0(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, float *out, size_t out_stride) {
    tile_legacy(n, nr, nc, w, w_stride, a, a_stride, NULL, 0, out, out_stride, WQ8_0, legacy_rows_avx2);
}
AVX2 void kp_avx2_dot_tile_q4_0(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, float *out, size_t out_stride) {
    tile_legacy(n, nr, nc, w, w_stride, a, a_stride, NULL, 0, out, out_stride, WQ4_0, legacy_rows_avx2);
}

#define LEGACY_GEMM(name, kind)                                                                                  \
    static AVX2 void name(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,              \
                          size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) { \
        gemm_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, PACK_AVX2,     \
                    legacy_rows_avx2, legacy_panels_avx2);                                                       \
    }
LEGACY_GEMM(gemm_q8_0, WQ8_0)
LEGACY_GEMM(gemm_q4_0, WQ4_0)
#undef LEGACY_GEMM

/* ------------------------------------------------------------------------ */
/* Q4_1, Q5_0, Q5_1 weights . Q8_1 or Q8_0 activations                       */
/* ------------------------------------------------------------------------ */

/* vec_dot: one weight row, one activation row. Q5_0: (q - 16).a as
 * vpmaddubsw(q, a) - vpmaddubsw(16, a), pair sums within +-12032. */
AVX2_INLINE float leg_dot(int64_t nb, const char *wrow, const char *arow, int kind) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    float macc = 0.0f;
    for (int64_t ib = 0; ib < nb; ib++) {
        const __m256i q = leg_quants(wrow, ib, kind);
        const __m256i a = _mm256_loadu_si256((const __m256i *)leg_act_quants(arow, ib, kind));
        const float dw = half_to_float(*(const uint16_t *)(wrow + (size_t)ib * leg_size(kind)));
        if (kind == WQ5_0) {
            const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(_mm256_set1_epi8(16), a));
            const __m256i p = _mm256_madd_epi16(p16, ones);
            const float da = half_to_float(((const kp_block_q8_0 *)arow + ib)->d);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), acc);
        } else {
            const kp_block_q8_1 *y = (const kp_block_q8_1 *)arow + ib;
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * half_to_float(y->d)), _mm256_cvtepi32_ps(p), acc);
            const float mw = half_to_float(*(const uint16_t *)(wrow + (size_t)ib * leg_size(kind) + 2));
            macc += mw * half_to_float(y->s);
        }
    }
    return hsum_ps(acc) + macc;
}

/* One AVX2 panel (8 rows) x NC activation rows ar[] over len blocks from ib0. */
AVX2_INLINE void leg_panel_tile(const __m256i (*q)[8], const float (*dw)[8], const float (*mw)[8],
                                const char *const *ar, const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds,
                                int64_t ib0, int64_t len, int kind, int nr, float *out, size_t os, int add,
                                const int NC) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int one_stage = kind == WQ4_1; /* Q4_1: one int16 stage of 8 steps, else two of 4 */
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int8_t *aq[4];
        __m256i t[4], s[4];
        UNROLL for (int c = 0; c < NC; c++) {
            aq[c] = leg_act_quants(ar[c], ib0 + b, kind);
            t[c] = _mm256_setzero_si256();
        }
        UNROLL for (int h = 0; h < 2; h++) {
            if (h == 0 || !one_stage) UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_setzero_si256();
            UNROLL for (int g = 4 * h; g < 4 * h + 4; g++) {
                const __m256i w = _mm256_load_si256(&q[b][g]);
                UNROLL for (int c = 0; c < NC; c++)
                    s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(w, _mm256_set1_epi32(load_i32(aq[c] + 4 * g))));
            }
            if (h == 1 || !one_stage)
                UNROLL for (int c = 0; c < NC; c++) t[c] = _mm256_add_epi32(t[c], _mm256_madd_epi16(s[c], ones));
        }
        const __m256 d8 = _mm256_load_ps(dw[b]);
        if (kind == WQ5_0) {
            UNROLL for (int c = 0; c < NC; c++) {
                const __m256i u = _mm256_add_epi32(t[c], _mm256_set1_epi32(ax[c][b].bias / 8));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_mul_ps(d8, _mm256_set1_ps(ax[c][b].d)), acc[c]);
            }
        } else {
            const __m256 m8 = _mm256_load_ps(mw[b]);
            UNROLL for (int c = 0; c < NC; c++) {
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[c]), _mm256_mul_ps(d8, _mm256_set1_ps(ds[c][b].d)), acc[c]);
                acc[c] = _mm256_fmadd_ps(m8, _mm256_set1_ps(ds[c][b].s), acc[c]);
            }
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

/* The avx2 table's products of a K chunk in gemm_leg_panel (leg_panels_fn):
 * panel by panel, 4 activation rows at a time. */
AVX2_INLINE void leg_panels_avx2(const leg_stage *st, int rc0, int rc, int n_panels, const void *a, size_t a_stride,
                                 const kp_q8_0_aux *const *axc, const q8_1_ds *const *dsc, int cc0, int ccn,
                                 int64_t ib0, int64_t len, int kind, float *out, size_t out_stride) {
    const int add = ib0 > 0;
    for (int p = 0; p < n_panels; p++) {
        const int npr = rc - 8 * p < 8 ? rc - 8 * p : 8;
        const __m256i(*q)[8] = (const __m256i(*)[8])st->q[p];
        const float(*dw)[8] = (const float(*)[8])st->dw[p];
        const float(*mw)[8] = (const float(*)[8])st->mw[p];
        for (int c0 = 0; c0 < ccn; c0 += 4) {
            const int ncc = ccn - c0 < 4 ? ccn - c0 : 4;
            const char *ar[4];
            for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(cc0 + c0 + c) * a_stride;
            float *o = out + (size_t)(cc0 + c0) * out_stride + (size_t)(rc0 + 8 * p);
            const kp_q8_0_aux *const *ax = axc + c0;
            const q8_1_ds *const *ds = dsc + c0;
            switch (ncc) {
            case 1: leg_panel_tile(q, dw, mw, ar, ax, ds, ib0, len, kind, npr, o, out_stride, add, 1); break;
            case 2: leg_panel_tile(q, dw, mw, ar, ax, ds, ib0, len, kind, npr, o, out_stride, add, 2); break;
            case 3: leg_panel_tile(q, dw, mw, ar, ax, ds, ib0, len, kind, npr, o, out_stride, add, 3); break;
            default: leg_panel_tile(q, dw, mw, ar, ax, ds, ib0, len, kind, npr, o, out_stride, add, 4); break;
            }
        }
    }
}

#define LEG(type, kind)                                                                                          \
    AVX2 void kp_avx2_vec_dot_##type(int64_t n, float *s, const void *w, const void *a) {                       \
        *s = leg_dot(n / 32, w, a, kind);                                                                        \
    }                                                                                                            \
    AVX2 void kp_avx2_dot_tile_##type(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, \
                                      size_t a_stride, float *out, size_t out_stride) {                         \
        leg_tile(n, nr, nc, w, w_stride, a, a_stride, NULL, 0, out, out_stride, kind, leg_oct_rows);             \
    }                                                                                                            \
    static AVX2 void gemm_##type(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,      \
                                 size_t a_stride, const void *aux, size_t aux_stride, float *out,               \
                                 size_t out_stride) {                                                            \
        leg_gemm(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, PACK_AVX2,         \
                 leg_oct_rows, leg_panels_avx2);                                                                 \
    }
LEG(q4_1, WQ4_1)
LEG(q5_0, WQ5_0)
LEG(q5_1, WQ5_1)
#undef LEG

/* ------------------------------------------------------------------------ */
/* Q4_K, Q5_K and Q6_K weights . Q8_K activations                            */
/* ------------------------------------------------------------------------ */

/* (scales and mins: kq_scales_mins, quant_avx2_inl.h; the mapping of
 * unpack_k_scales in quant_blocks.h) */

/* One Q4_K super-block x against super-block i of NC Q8_K activation rows:
 * sumi[c] and pm[c] are 8 partial sums of sum_j sc_j (q.a)_j and of
 * sum_j m_j bsum_j (exact integers once summed). */
AVX2_INLINE void q4k_sb(const kp_block_q4_K *x, const char *a, size_t a_stride, int64_t i, __m256i *sumi,
                        __m256i *pm, const int NC) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128i scm = kq_scales_mins(x->scales);
    /* 8 scales as int16, in both 128-bit lanes */
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
    /* mins duplicated per pair of bsums: m0 m0 m1 m1 ... m7 m7 as int16 */
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        scm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    UNROLL for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        /* broadcast word 2j (low nibbles) and 2j+1 (high nibbles) */
        const __m256i s_lo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * j + 1) << 8 | 4 * j)));
        const __m256i s_hi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * j + 3) << 8 | (4 * j + 2))));
        const __m256i q_lo = _mm256_and_si256(bits, m4);
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
            const __m256i p = _mm256_maddubs_epi16(q_lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j)));
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, s_lo));
        }
        const __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
            const __m256i p = _mm256_maddubs_epi16(q_hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32)));
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, s_hi));
        }
    }
    UNROLL for (int c = 0; c < NC; c++) {
        const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
        pm[c] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins16);
    }
}

/* One Q5_K super-block x against super-block i of NC Q8_K activation rows:
 * sumi[c] and pm[c] are 8 partial sums of sum_j sc_j (q.a)_j and of
 * sum_j m_j bsum_j (exact integers once summed). */
AVX2_INLINE void q5k_sb(const kp_block_q5_K *x, const char *a, size_t a_stride, int64_t i, __m256i *sumi,
                        __m256i *pm, const int NC) {
    const __m128i scm = kq_scales_mins(x->scales);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm)); /* 8 scales, both lanes */
    /* mins duplicated per pair of bsums: m0 m0 m1 m1 ... m7 m7 as int16 */
    const __m256i mins16 = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(scm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)x->qh);
    UNROLL for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 4; j++) {
        __m256i q_lo, q_hi;
        q5k_quants(x, hb, j, &q_lo, &q_hi);
        /* broadcast word 2j (sub-block 2j) and 2j+1 */
        const __m256i s_lo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * j + 1) << 8 | 4 * j)));
        const __m256i s_hi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * j + 3) << 8 | (4 * j + 2))));
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
            const __m256i p_lo = _mm256_maddubs_epi16(q_lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j)));
            const __m256i p_hi = _mm256_maddubs_epi16(q_hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32)));
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(p_lo, s_lo), _mm256_madd_epi16(p_hi, s_hi)));
        }
    }
    UNROLL for (int c = 0; c < NC; c++) {
        const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
        pm[c] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins16);
    }
}

/* One Q6_K super-block x against super-block i of NC Q8_K activation rows:
 * tot[c] holds 8 partial sums of sum_j sc_j (q_j - 32).a_j (an exact
 * integer once summed). */
AVX2_INLINE void q6k_sb(const kp_block_q6_K *x, const char *a, size_t a_stride, int64_t i, __m256i *tot,
                        const int NC) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    __m256i sumi[4];
    UNROLL for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256();
    UNROLL for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        UNROLL for (int k = 0; k < 4; k++) {
            __m256i lo, hi;
            switch (k) {
            case 0:
                lo = _mm256_and_si256(l0, m4);
                hi = _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30);
                break;
            case 1:
                lo = _mm256_and_si256(l1, m4);
                hi = _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30);
                break;
            case 2:
                lo = _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4);
                hi = _mm256_and_si256(hb, m30);
                break;
            default:
                lo = _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4);
                hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30);
                break;
            }
            const __m256i q = _mm256_or_si256(lo, hi); /* q + 32, in 0..63 */
            /* [sc[s] x8 | sc[s+1] x8] as int16, s = 8h + 2k */
            const int s = 8 * h + 2 * k;
            const __m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                sc8, _mm_setr_epi8((char)s, (char)s, (char)s, (char)s, (char)s, (char)s,
                                   (char)s, (char)s, (char)(s + 1), (char)(s + 1),
                                   (char)(s + 1), (char)(s + 1), (char)(s + 1),
                                   (char)(s + 1), (char)(s + 1), (char)(s + 1))));
            UNROLL for (int c = 0; c < NC; c++) {
                const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
                const __m256i p = _mm256_maddubs_epi16(
                    q, _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * k)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, scv));
            }
        }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    UNROLL for (int c = 0; c < NC; c++) {
        const kp_block_q8_K *y = (const kp_block_q8_K *)(a + (size_t)c * a_stride) + i;
        /* remove the +32 offset: 32 * sum_j sc[j] * bsums[j] */
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), sc16);
        tot[c] = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(corr, 5));
    }
}

/* vec_dot: one row, one activation row, in the canonical order. */
AVX2 void kp_avx2_vec_dot_q4_K(int64_t n, float *s, const void *w, const void *a) {
    float acc = 0.0f, out = 0.0f;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        const kp_block_q4_K *x = (const kp_block_q4_K *)w + i;
        const kp_block_q8_K *y = (const kp_block_q8_K *)a + i;
        __m256i sumi, pm;
        q4k_sb(x, a, 0, i, &sumi, &pm, 1);
        acc = fma_ss((float)hsum_epi32(sumi), half_to_float(x->d) * y->d, acc);
        acc = fma_ss(-(float)hsum_epi32(pm), half_to_float(x->dmin) * y->d, acc);
        if ((i + 1) % KQ_KC == 0 || i + 1 == n / KP_QK_K) { /* end of a K chunk */
            out = i < KQ_KC ? acc : out + acc;
            acc = 0.0f;
        }
    }
    *s = out;
}

/* vec_dot: one row, one activation row, in the canonical order. */
AVX2 void kp_avx2_vec_dot_q5_K(int64_t n, float *s, const void *w, const void *a) {
    const int64_t nb = n / KP_QK_K;
    float acc = 0.0f, out = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const kp_block_q5_K *x = (const kp_block_q5_K *)w + i;
        const float da = ((const kp_block_q8_K *)a + i)->d;
        __m256i sumi, pm;
        q5k_sb(x, a, 0, i, &sumi, &pm, 1);
        acc = fma_ss((float)hsum_epi32(sumi), half_to_float(x->d) * da, acc);
        acc = fma_ss(-(float)hsum_epi32(pm), half_to_float(x->dmin) * da, acc);
        if ((i + 1) % KQ_KC == 0 || i + 1 == nb) { /* end of a K chunk */
            out = i < KQ_KC ? acc : out + acc;
            acc = 0.0f;
        }
    }
    *s = out;
}

/* vec_dot: one row, one activation row, in the canonical order. */
AVX2 void kp_avx2_vec_dot_q6_K(int64_t n, float *s, const void *w, const void *a) {
    float acc = 0.0f, out = 0.0f;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        const kp_block_q6_K *x = (const kp_block_q6_K *)w + i;
        __m256i tot;
        q6k_sb(x, a, 0, i, &tot, 1);
        acc = fma_ss((float)hsum_epi32(tot), half_to_float(x->d) * ((const kp_block_q8_K *)a + i)->d, acc);
        if ((i + 1) % KQ_KC == 0 || i + 1 == n / KP_QK_K) { /* end of a K chunk */
            out = i < KQ_KC ? acc : out + acc;
            acc = 0.0f;
        }
    }
    *s = out;
}

/*
 * 8 weight rows x NC (1..4) activation rows over super-blocks [i0, i0+len):
 * each row's super-block gives vectors of partial integer sums (q4k_sb,
 * q5k_sb, q6k_sb); fold8_epi32 turns the 8 rows' vectors into one vector of exact
 * sums, one lane per row, so the float work is the panel's, lane for lane.
 */
AVX2_INLINE void kq_rows_tile(const char *const *wr, const char *ar, size_t a_stride, int64_t i0, int64_t len,
                              int kind, int nr, float *out, size_t os, int add, size_t pf, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    const size_t bsz = kind == KQ4 ? sizeof(kp_block_q4_K) : kind == KQ5 ? sizeof(kp_block_q5_K) : sizeof(kp_block_q6_K);
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        __m256i S[4][8], M[4][8];
        const int rows = nr <= 4 ? 4 : 8; /* the rest repeat rows 0..3 */
        for (int r = 0; r < rows; r++) {
            /* 8 rows in step defeat the hardware prefetcher in decode: ask
             * for the rows pf bytes on (decode_pf), else 2 super-blocks on */
            const char *next = pf ? wr[r] + pf + (size_t)i * bsz : wr[r] + (size_t)(i + 2) * bsz;
            for (size_t off = 0; off < bsz; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
            __m256i s4[4], m4[4];
            if (kind == KQ4) q4k_sb((const kp_block_q4_K *)wr[r] + i, ar, a_stride, i, s4, m4, NC);
            else if (kind == KQ5) q5k_sb((const kp_block_q5_K *)wr[r] + i, ar, a_stride, i, s4, m4, NC);
            else q6k_sb((const kp_block_q6_K *)wr[r] + i, ar, a_stride, i, s4, NC);
            UNROLL for (int c = 0; c < NC; c++) {
                S[c][r] = s4[c];
                if (kind != KQ6) M[c][r] = m4[c];
            }
        }
        for (int r = rows; r < 8; r++)
            UNROLL for (int c = 0; c < NC; c++) {
                S[c][r] = S[c][r - 4];
                if (kind != KQ6) M[c][r] = M[c][r - 4];
            }
        if (kind != KQ6) { /* Q4_K and Q5_K: d and dmin at the same offsets */
            _Static_assert(offsetof(kp_block_q5_K, d) == offsetof(kp_block_q4_K, d) &&
                               offsetof(kp_block_q5_K, dmin) == offsetof(kp_block_q4_K, dmin),
                           "Q4_K and Q5_K start alike");
            const size_t blk = (size_t)i * bsz;
            const __m256 d8 = half8_at(wr, blk + offsetof(kp_block_q4_K, d));
            const __m256 m8 = half8_at(wr, blk + offsetof(kp_block_q4_K, dmin));
            UNROLL for (int c = 0; c < NC; c++) {
                const __m256 da = _mm256_set1_ps(((const kp_block_q8_K *)(ar + (size_t)c * a_stride) + i)->d);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold8_epi32(S[c])), _mm256_mul_ps(d8, da), acc[c]);
                acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(fold8_epi32(M[c])), _mm256_mul_ps(m8, da), acc[c]);
            }
        } else {
            const __m256 d8 = half8_at(wr, (size_t)i * sizeof(kp_block_q6_K) + offsetof(kp_block_q6_K, d));
            UNROLL for (int c = 0; c < NC; c++) {
                const __m256 da = _mm256_set1_ps(((const kp_block_q8_K *)(ar + (size_t)c * a_stride) + i)->d);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold8_epi32(S[c])), _mm256_mul_ps(d8, da), acc[c]);
            }
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

AVX2_INLINE void tile_kquant(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, float *out, size_t out_stride, int kind) {
    const int64_t nb = n / KP_QK_K;
    const size_t pf = decode_pf(w_stride, nc, PANEL_MIN_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int c0 = 0; c0 < nc; c0 += 4) {
        const int ncc = nc - c0 < 4 ? nc - c0 : 4;
        const char *ac = (const char *)a + (size_t)c0 * a_stride;
        for (int r0 = 0; r0 < nr; r0 += 8) {
            const int nrr = nr - r0 < 8 ? nr - r0 : 8;
            const char *wr[8];
            rows8(w, w_stride, r0, nr, wr);
            float *o = out + (size_t)c0 * out_stride + (size_t)r0;
            for (int64_t i0 = 0; i0 < nb; i0 += KQ_KC) {
                const int64_t len = nb - i0 < KQ_KC ? nb - i0 : KQ_KC;
                const int add = i0 > 0;
                switch (ncc) {
                case 1: kq_rows_tile(wr, ac, a_stride, i0, len, kind, nrr, o, out_stride, add, pf, 1); break;
                case 2: kq_rows_tile(wr, ac, a_stride, i0, len, kind, nrr, o, out_stride, add, pf, 2); break;
                case 3: kq_rows_tile(wr, ac, a_stride, i0, len, kind, nrr, o, out_stride, add, pf, 3); break;
                default: kq_rows_tile(wr, ac, a_stride, i0, len, kind, nrr, o, out_stride, add, pf, 4); break;
                }
            }
        }
    }
}
AVX2 void kp_avx2_dot_tile_q4_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, float *out, size_t out_stride) {
    tile_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, KQ4);
}
AVX2 void kp_avx2_dot_tile_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, float *out, size_t out_stride) {
    tile_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, KQ5);
}
AVX2 void kp_avx2_dot_tile_q6_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, float *out, size_t out_stride) {
    tile_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, KQ6);
}

/* One panel x NC activation rows over super-blocks [i0, i0 + len). */
AVX2_INLINE void kq_tile(const void *panels, const char *const *ar, int64_t i0, int64_t len, int kind,
                         int nr, float *out, size_t os, int add, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        __m256i isum[4], s[4];
        UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        if (kind == KQ4) {
            const kmin_panel *p = (const kmin_panel *)panels + b;
            for (int j = 0; j < 8; j++) {
                UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_setzero_si256();
                UNROLL for (int g = 0; g < 8; g++) {
                    const __m256i w = _mm256_load_si256(&p->q[j][g]);
                    UNROLL for (int c = 0; c < NC; c++)
                        s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(w, KQ_A4(ar, c, i, 32 * j + 4 * g)));
                }
                const __m256i sc = _mm256_load_si256(&p->sc[j]);
                UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(s[c], sc));
            }
            const __m256 d8 = _mm256_load_ps(p->d), m8 = _mm256_load_ps(p->dmin);
            UNROLL for (int c = 0; c < NC; c++) {
                const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
                __m256i im = _mm256_setzero_si256();
                UNROLL for (int j = 0; j < 8; j++)
                    im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_load_si256(&p->mn[j]),
                                                                _mm256_set1_epi32(load_i32(&y->bsums[2 * j]))));
                const __m256 da = _mm256_set1_ps(y->d);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d8, da), acc[c]);
                acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(m8, da), acc[c]);
            }
        } else {
            const q6k_panel *p = (const q6k_panel *)panels + b;
            for (int j = 0; j < 16; j++) {
                const __m256i w0 = _mm256_load_si256(&p->q[j][0]), w1 = _mm256_load_si256(&p->q[j][1]);
                const __m256i w2 = _mm256_load_si256(&p->q[j][2]), w3 = _mm256_load_si256(&p->q[j][3]);
                const __m256i sc = _mm256_load_si256(&p->sc[j]);
                UNROLL for (int c = 0; c < NC; c++) {
                    const int off = 16 * j;
                    const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, KQ_A4(ar, c, i, off)),
                                                         _mm256_maddubs_epi16(w1, KQ_A4(ar, c, i, off + 4)));
                    const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(w2, KQ_A4(ar, c, i, off + 8)),
                                                         _mm256_maddubs_epi16(w3, KQ_A4(ar, c, i, off + 12)));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(_mm256_madd_epi16(s01, sc), _mm256_madd_epi16(s23, sc)));
                }
            }
            const __m256 d8 = _mm256_load_ps(p->d);
            UNROLL for (int c = 0; c < NC; c++) {
                const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
                __m256i corr = _mm256_setzero_si256();
                UNROLL for (int q = 0; q < 8; q++)
                    corr = _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_load_si256(&p->sp[q]),
                                                                    _mm256_set1_epi32(load_i32(&y->bsums[2 * q]))));
                const __m256i t = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(corr, 5));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d8, _mm256_set1_ps(y->d)), acc[c]);
            }
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

/* imin of NC activation rows: m_j * (bsums[2j] + bsums[2j+1]) per row. */
AVX2_INLINE __m256i q5k_imin(const kmin_panel *p, const kp_block_q8_K *y) {
    __m256i im = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 8; j++)
        im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_load_si256(&p->mn[j]), _mm256_set1_epi32(load_i32(&y->bsums[2 * j]))));
    return im;
}

/* One AVX2 panel x NC activation rows over super-blocks [i0, i0 + len). */
AVX2_INLINE void q5k_panel_tile(const kmin_panel *panels, const char *const *ar, int64_t i0, int64_t len, int nr,
                                float *out, size_t os, int add, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        const kmin_panel *p = panels + b;
        __m256i isum[4], s[4];
        UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i sc = _mm256_load_si256(&p->sc[j]);
            UNROLL for (int h = 0; h < 2; h++) {
                UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_setzero_si256();
                UNROLL for (int g = 4 * h; g < 4 * h + 4; g++) {
                    const __m256i w = _mm256_load_si256(&p->q[j][g]);
                    UNROLL for (int c = 0; c < NC; c++)
                        s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(w, KQ_A4(ar, c, i, 32 * j + 4 * g)));
                }
                UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(s[c], sc));
            }
        }
        const __m256 d8 = _mm256_load_ps(p->d), m8 = _mm256_load_ps(p->dmin);
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
            const __m256 da = _mm256_set1_ps(y->d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d8, da), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(q5k_imin(p, y)), _mm256_mul_ps(m8, da), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

/* One panel's products for kq_panels_avx2. */
AVX2_INLINE void kq_panel_avx2(const void *panels, const char *const *ar, int64_t i0, int64_t len, int kind, int nr,
                               float *out, size_t os, int add, int nc) {
    if (kind == KQ5) {
        switch (nc) {
        case 1: q5k_panel_tile(panels, ar, i0, len, nr, out, os, add, 1); break;
        case 2: q5k_panel_tile(panels, ar, i0, len, nr, out, os, add, 2); break;
        case 3: q5k_panel_tile(panels, ar, i0, len, nr, out, os, add, 3); break;
        default: q5k_panel_tile(panels, ar, i0, len, nr, out, os, add, 4); break;
        }
        return;
    }
    switch (nc) {
    case 1: kq_tile(panels, ar, i0, len, kind, nr, out, os, add, 1); break;
    case 2: kq_tile(panels, ar, i0, len, kind, nr, out, os, add, 2); break;
    case 3: kq_tile(panels, ar, i0, len, kind, nr, out, os, add, 3); break;
    default: kq_tile(panels, ar, i0, len, kind, nr, out, os, add, 4); break;
    }
}

/* The avx2 table's panel tiles of gemm_kq_panel (kq_panels_fn): one panel
 * at a time, every activation row past it 4 by 4 while it sits in L1. */
AVX2_INLINE void kq_panels_avx2(const kq_stage *st, int n_panels, int rc, const void *a, size_t a_stride, int nc,
                                int64_t i0, int64_t len, int kind, float *out, size_t os, int add) {
    for (int p = 0; p < n_panels; p++) {
        const void *panels = kind == KQ6 ? (const void *)st->p.q6k[p] : (const void *)st->p.kmin[p];
        const int npr = rc - 8 * p < 8 ? rc - 8 * p : 8;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
            const char *ar[4];
            for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
            kq_panel_avx2(panels, ar, i0, len, kind, npr, out + (size_t)c0 * os + 8 * p, os, add, ncc);
        }
    }
}

#define KQUANT_GEMM(name, tile, kind)                                                                            \
    static AVX2 void name(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,              \
                          size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) { \
        (void)aux;                                                                                               \
        (void)aux_stride;                                                                                        \
        gemm_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind, PACK_AVX2, tile, kq_panels_avx2); \
    }
KQUANT_GEMM(gemm_q4_K, kp_avx2_dot_tile_q4_K, KQ4)
KQUANT_GEMM(gemm_q5_K, kp_avx2_dot_tile_q5_K, KQ5)
KQUANT_GEMM(gemm_q6_K, kp_avx2_dot_tile_q6_K, KQ6)
#undef KQUANT_GEMM

/* ------------------------------------------------------------------------ */
/* activation conversion (bit-identical to the reference quantizers)         */
/* ------------------------------------------------------------------------ */

/* 4 x 8 int32 (each in -128..127) -> 32 int8 in order. */
AVX2_INLINE __m256i pack_i32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i p01 = _mm256_packs_epi32(i0, i1); /* lanes interleave; fixed below */
    const __m256i p23 = _mm256_packs_epi32(i2, i3);
    const __m256i b = _mm256_packs_epi16(p01, p23);
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The largest |x| of 32 floats, as 8 lanes to be folded. */
AVX2_INLINE __m256 absmax32(const float *x) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_and_ps(_mm256_loadu_ps(x + 8 * k), abs_mask);
    return _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
}

/* Lane b = the largest lane of m[b]: the 8 folds at once, as transposing
 * sums (max is exact, so the order does not matter). */
AVX2_INLINE __m256 hmax8_ps(const __m256 m[8]) {
    __m256 a[4], b[2];
    for (int k = 0; k < 4; k++)
        a[k] = _mm256_max_ps(_mm256_unpacklo_ps(m[2 * k], m[2 * k + 1]), _mm256_unpackhi_ps(m[2 * k], m[2 * k + 1]));
    for (int k = 0; k < 2; k++)
        b[k] = _mm256_max_ps(_mm256_shuffle_ps(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_max_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

/* 32 floats times id, rounded half away from zero, into qs. */
AVX2_INLINE void quant32(const float *x, __m256 idv, int8_t *qs) {
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = round_half_away_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), idv));
    _mm256_storeu_si256((__m256i *)qs, pack_i32_to_i8(q[0], q[1], q[2], q[3]));
}

/* Eight blocks at a time: their scales d = amax / 127 and 1 / d (0 for an
 * all-zero block) in one vector each and one conversion to FP16 (round to
 * nearest even, as kp_fp32_to_fp16 for the finite d), instead of a fold,
 * two scalar divisions and a call per block; the same numbers. */
AVX2 void kp_avx2_act_q8_0(const float *x, void *dst, int64_t n) {
    kp_block_q8_0 *y = dst;
    const int64_t nb = n / KP_QK8_0;
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, x += 8 * KP_QK8_0) {
        __m256 m[8];
        for (int b = 0; b < 8; b++) m[b] = absmax32(x + b * KP_QK8_0);
        const __m256 d = _mm256_div_ps(hmax8_ps(m), _mm256_set1_ps(127.0f));
        const __m256 nz = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
        const __m256 id = _mm256_and_ps(nz, _mm256_div_ps(_mm256_set1_ps(1.0f), d));
        uint16_t dh[8];
        _mm_storeu_si128((__m128i *)dh, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        float ids[8];
        _mm256_storeu_ps(ids, id);
        for (int b = 0; b < 8; b++) {
            y[i + b].d = dh[b];
            quant32(x + b * KP_QK8_0, _mm256_set1_ps(ids[b]), y[i + b].qs);
        }
    }
    for (; i < nb; i++, x += KP_QK8_0) {
        const float d = hmax_ps(absmax32(x)) / 127;
        y[i].d = kp_fp32_to_fp16(d);
        quant32(x, _mm256_set1_ps(d ? 1.0f / d : 0.0f), y[i].qs);
    }
}

AVX2 void kp_avx2_act_q8_K(const float *x, void *dst, int64_t n) {
    kp_block_q8_K *y = dst;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t i = 0; i < n / KP_QK_K; i++, x += KP_QK_K) {
        __m256 m[8];
        for (int k = 0; k < KP_QK_K; k += 32) m[k / 32] = absmax32(x + k);
        const float amax = hmax_ps(_mm256_max_ps(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])),
                                                 _mm256_max_ps(_mm256_max_ps(m[4], m[5]), _mm256_max_ps(m[6], m[7]))));
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0; /* signed value of the first element with |x| == amax, 8 compared at a time */
        const __m256 amv = _mm256_set1_ps(amax);
        for (int k = 0; k < KP_QK_K; k += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask), amv, _CMP_EQ_OQ));
            if (hit) {
                max = x[k + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 isv = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        const __m256i ones8 = _mm256_set1_epi8(1);
        const __m256i ones16 = _mm256_set1_epi16(1);
        for (int k = 0; k < KP_QK_K; k += 32) {
            __m256i q[4];
            for (int g = 0; g < 4; g++)
                q[g] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * g), isv)), lim);
            const __m256i b = pack_i32_to_i8(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + k), b);
            /* two bsums: bytes 0..15 and 16..31 of b */
            const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, b), ones16);
            __m256i s = _mm256_hadd_epi32(s32, s32);
            s = _mm256_hadd_epi32(s, s);
            y[i].bsums[k / 16] = (int16_t)_mm256_extract_epi32(s, 0);
            y[i].bsums[k / 16 + 1] = (int16_t)_mm256_extract_epi32(s, 4);
        }
        y[i].d = 1 / iscale;
    }
}

AVX2 void kp_avx2_act_q8_1(const float *x, void *dst, int64_t n) {
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
        for (int k = 0; k < 4; k++) q[k] = round_half_away_epi32(_mm256_mul_ps(v[k], idv));
        const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        /* 4 x 8 int32 -> 32 int8 in element order */
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[i].qs,
                            _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        y[i].d = kp_fp32_to_fp16(d);
        y[i].s = kp_fp32_to_fp16((float)sum * d);
    }
}

AVX2 void kp_avx2_act_f16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = kp_fp32_to_fp16(x[i]);
}

AVX2 void kp_avx2_act_bf16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i inf = _mm256_set1_epi32(0x7F800000);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i bias = _mm256_set1_epi32(0x7FFF);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(x + i));
        const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(64));
        const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
        const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(y + i), packed);
    }
    for (; i < n; i++) y[i] = kp_fp32_to_bf16(x[i]);
}

AVX2 void kp_avx2_act_f32(const float *x, void *dst, int64_t n) {
    if (n > 0) memcpy(dst, x, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------------ */
/* attention helpers                                                         */
/* ------------------------------------------------------------------------ */

AVX2 float kp_avx2_dot_f32(int64_t n, const float *x, const float *y) {
    return dot_float_rows(n, x, ELEM_F32, y, ELEM_F32);
}

AVX2 float kp_avx2_dot_f32_f16(int64_t n, const float *x, const uint16_t *y) {
    return dot_float_rows(n, x, ELEM_F32, y, ELEM_F16);
}

AVX2 void kp_avx2_axpy_f32(int64_t n, float a, const float *x, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

AVX2 void kp_avx2_axpy_f16(int64_t n, float a, const uint16_t *x, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * half_to_float(x[i]);
}

/* ---- MXFP4 (quant_avx2_inl.h's MXFP4_TILE_BODY) ------------------------------ */

AVX2 void kp_avx2_dot_tile_mxfp4(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                 size_t a_stride, float *out, size_t out_stride) {
    MXFP4_TILE_BODY(mxfp4_pairs_avx2)
}

AVX2 void kp_avx2_vec_dot_mxfp4(int64_t n, float *s, const void *w, const void *a) {
    kp_avx2_dot_tile_mxfp4(n, 1, 1, w, 0, a, 0, s, 1);
}

static AVX2 void gemm_mxfp4(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                            size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    (void)aux;
    (void)aux_stride;
    kp_avx2_dot_tile_mxfp4(n, nr, nc, w, w_stride, a, a_stride, out, out_stride);
}

AVX2 void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16x8(x + i));
    for (; i < n; i++) y[i] = half_to_float(x[i]);
}

const kp_kernels kp_quant_avx2_kernels = {
    .name = "avx2",
    KP_AVX2_SHARED_ENTRIES,
    .dot_tile[KP_DTYPE_F32] = tile_f32,
    .dot_tile[KP_DTYPE_F16] = tile_f16,
    .dot_tile[KP_DTYPE_BF16] = tile_bf16,
    .gemm =
        {
            [KP_DTYPE_F32] = gemm_f32,
            [KP_DTYPE_F16] = gemm_f16,
            [KP_DTYPE_BF16] = gemm_bf16,
            [KP_DTYPE_Q8_0] = gemm_q8_0,
            [KP_DTYPE_Q4_0] = gemm_q4_0,
            [KP_DTYPE_Q4_1] = gemm_q4_1,
            [KP_DTYPE_Q5_0] = gemm_q5_0,
            [KP_DTYPE_Q5_1] = gemm_q5_1,
            [KP_DTYPE_Q4_K] = gemm_q4_K,
            [KP_DTYPE_Q5_K] = gemm_q5_K,
            [KP_DTYPE_Q6_K] = gemm_q6_K,
            [KP_DTYPE_MXFP4] = gemm_mxfp4,
        },
};

#else /* not x86-64: no AVX2 table */

typedef int kp_quant_avx2_unused;

#endif
