/*
 * quant_more_avx2.c - AVX2 + FMA + F16C kernels for Q4_1, Q5_0, Q5_1 and
 * Q5_K weights (vec_dot, dot_tile, and the gemm of the avx2 and avx512vnni
 * tables), and the Q8_1 activation quantizer. Layouts in quant_more.h;
 * quant_avx2.c puts these functions into its tables.
 *
 * Compiled without -march flags: every function carries a target attribute
 * (avx2,fma,f16c; the kp_qmore_vnni_* gemm kernels add avx512f/vl/bw/vnni)
 * and is reached only through a table that kp_kernels_best() hands out
 * when the CPU has what it uses. Outside x86-64 the file is empty.
 *
 * Decoding. One 32-element block of a legacy type becomes 32 bytes in
 * element order (bytes 0..15 from the low nibbles, 16..31 from the high
 * nibbles), unsigned: q in 0..15 (Q4_1) or 0..31 (Q5_0 and Q5_1, which OR
 * in bit 4 from qh, expanded one bit per byte):
 *
 *   qh (uint32) --broadcast, vpshufb--> byte j holds qh byte j/8
 *               --AND 1 << (j%8), compare--> 0xFF where bit j is set
 *               --AND 0x10--> bit 4 of quant j
 *
 * A Q5_K super-block is 4 chunks of 64 elements: 32 bytes of qs each (low
 * nibbles: sub-block 2c, high nibbles: sub-block 2c+1) and bits 2c, 2c+1
 * of the 32 qh bytes, moved to bit 4 with one shift and one AND.
 *
 * Products: vpmaddubsw multiplies unsigned quants by signed activation
 * bytes into int16 pair sums (at most 2*31*128 = 7936 in magnitude, so no
 * saturation), vpmaddwd widens them to int32:
 *
 *   Q4_1 . Q8_1   S = q.a                        block: dw*da*S + mw*sa
 *   Q5_1 . Q8_1   S = q.a                        (sa: the stored block sum)
 *   Q5_0 . Q8_0   S = (q - 16).a = q.a + bias/8  block: dw*da*S
 *                 (bias = -128 sum(a), kp_q8_0_aux's, exact)
 *   Q5_K . Q8_K   isum = sum_j sc_j (q.a)_j (vpmaddwd by the 6-bit scale),
 *                 imin = sum_j m_j (bsums[2j] + bsums[2j+1]) (one vpmaddwd)
 *                 super-block: d*da*isum - dmin*da*imin
 *
 * Canonical order. dot_tile and gemm give each output bit for bit the same
 * value whatever the shape of the call (quant.h's contract), and the
 * avx512vnni table's gemm the same value as the avx2 table's: every path
 * computes an output in the order of one vector lane whose lanes are
 * weight rows,
 *
 *   Q4_1, Q5_0, Q5_1  per K chunk of LEG_KC blocks: acc = 0, then per block
 *                       acc = fma(float(S), dw * da, acc)
 *                       acc = fma(mw, sa, acc)             (Q4_1, Q5_1)
 *                     out = chunk 0, out += chunk 1, ...
 *   Q5_K              the same per chunk of K5_KC super-blocks, with
 *                       acc = fma(float(isum), d * da, acc)
 *                       acc = fma(-float(imin), dmin * da, acc)
 *
 * and integer sums are exact however they are formed:
 *
 *   few activation rows (dot_tile; gemm with fewer than PANEL_MIN_COLS,
 *   i.e. decode): 8 weight rows x NC (1..4) activation rows. Each row's
 *   block gives a vector of 8 partial sums; vphaddd folds the 8 rows'
 *   vectors into one vector of exact sums, one lane per row:
 *
 *     p_r = vpmaddwd(vpmaddubsw(q_r, a_c), 1)              r = 0..7
 *     hadd(hadd(p0, p1), hadd(p2, p3)) = [s0 s1 s2 s3 | s0' s1' s2' s3']
 *     (likewise rows 4..7), then [s0+s0' .. s3+s3' | s4+s4' .. s7+s7']
 *
 *   and with one activation row in the avx512vnni table, 16 weight rows,
 *   four to a 512-bit vector, their nibbles against the activation halves
 *   by vpdpbusd and folded by unpacks (leg_hex_tile_vnni)
 *
 *   many activation rows (gemm in prefill): the call's weight rows are
 *   repacked per K chunk, on the stack, into panels of 8 rows whose 32-byte
 *   steps hold the same 4 quants of every row, one int32 lane per row; 4
 *   activation quants are broadcast to all lanes, so there are no
 *   horizontal sums at all:
 *
 *     panel step (b, g), 32 bytes:  row0 q[4g..4g+3] | row1 q[4g..] | ... | row7
 *     steps of one block b:         g = 0..7 (32 quants); Q5_K: per sub-block
 *
 *     AVX2   s16 += vpmaddubsw(q, a4) over 4 steps (<= 4*7936 = 31744 <
 *            2^15; Q4_1, whose pair sums stay <= 2*15*128, over all 8),
 *            then vpmaddwd by 1 (Q5_K: by the scale pair) into int32
 *     VNNI   s = vpdpbusd(s, u, a4), 4 products into int32 per step. Q5_0
 *            stores u = 8q (<= 248) and starts from s = bias, so
 *            s = 8q.a - 128 sum(a) = 8S, with dw stored / 8 (powers of two
 *            scale exactly: the same float products). Q5_K multiplies each
 *            sub-block sum by its int32 scale (vpmulld).
 *
 *   Repacking costs about one activation row's products and is reused by
 *   all of them, hence the threshold. Activation block terms (Q5_0: aux d
 *   and bias, from the caller or computed; Q8_1: d and s as floats) are
 *   staged once per call for PANEL_CC activation rows at a time.
 *
 * Stack use of a gemm call: at most about 48 KiB (leg_stage; q5k_stage
 * 31 KiB).
 *
 * kp_qmore_avx2_act_q8_1 is bit-identical to kp_qmore_quant_row_q8_1 for
 * finite inputs (roundf = round half away from zero, the same 1/d).
 */
#include "kernels/quant_more.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/quant_impl.h"

#include "kernels/quant_avx2_inl.h"

enum { PACK_AVX2, PACK_VNNI }; /* which panel kernels: avx2 or avx512vnni table */

#define PANEL_MIN_COLS 8 /* activation rows from which gemm repacks weights */
#define PANEL_RC 16      /* weight rows repacked per chunk: 2 panels */
#define PANEL_CC 16      /* activation rows with staged block terms at a time */
#define LEG_KC 64        /* Q4_1/Q5_0/Q5_1 blocks per K chunk: 2048 elements */
#define K5_KC 6          /* Q5_K super-blocks per K chunk: 1536 elements */

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

AVX2_INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* 16 packed nibble bytes -> 32 bytes in element order (low nibbles, then high). */
AVX2_INLINE __m256i unpack_nibbles(const uint8_t qs[16]) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}

/* 0x10 in byte j where bit j of the little-endian uint32 at qh is set. */
AVX2_INLINE __m256i fifth_bits(const uint8_t qh[4]) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(load_i32(qh)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                         3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* Row pointers of weight rows r0 .. r0+7, rows past nr repeating row nr-1
 * (computed, never stored). */
AVX2_INLINE void rows8(const void *w, size_t w_stride, int r0, int nr, const char *wr[8]) {
    for (int r = 0; r < 8; r++) {
        const int row = r0 + r < nr ? r0 + r : nr - 1;
        wr[r] = (const char *)w + (size_t)row * w_stride;
    }
}

/* ------------------------------------------------------------------------ */
/* Q4_1, Q5_0, Q5_1                                                          */
/* ------------------------------------------------------------------------ */

enum { WQ4_1, WQ5_0, WQ5_1 };

/* Bytes per block; every layout has d at offset 0, Q4_1/Q5_1 m at 2. */
AVX2_INLINE size_t legacy_size(int kind) {
    return kind == WQ4_1 ? sizeof(kp_block_q4_1) : kind == WQ5_0 ? sizeof(kp_block_q5_0) : sizeof(kp_block_q5_1);
}

/* The 32 quants of weight block ib, unsigned (0..15 or 0..31), in element order. */
AVX2_INLINE __m256i legacy_quants(const char *wrow, int64_t ib, int kind) {
    if (kind == WQ4_1) return unpack_nibbles(((const kp_block_q4_1 *)wrow + ib)->qs);
    if (kind == WQ5_0) {
        const kp_block_q5_0 *x = (const kp_block_q5_0 *)wrow + ib;
        return _mm256_or_si256(unpack_nibbles(x->qs), fifth_bits(x->qh));
    }
    const kp_block_q5_1 *x = (const kp_block_q5_1 *)wrow + ib;
    return _mm256_or_si256(unpack_nibbles(x->qs), fifth_bits(x->qh));
}

/* The 32 quants of activation block ib (Q8_0 for Q5_0, else Q8_1). */
AVX2_INLINE const int8_t *act_quants(const char *arow, int64_t ib, int kind) {
    if (kind == WQ5_0) return ((const kp_block_q8_0 *)arow + ib)->qs;
    return ((const kp_block_q8_1 *)arow + ib)->qs;
}

/* vec_dot: one weight row, one activation row. Q5_0: (q - 16).a as
 * vpmaddubsw(q, a) - vpmaddubsw(16, a), pair sums within +-12032. */
AVX2_INLINE float dot_legacy(int64_t nb, const char *wrow, const char *arow, int kind) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    float macc = 0.0f;
    for (int64_t ib = 0; ib < nb; ib++) {
        const __m256i q = legacy_quants(wrow, ib, kind);
        const __m256i a = _mm256_loadu_si256((const __m256i *)act_quants(arow, ib, kind));
        const float dw = half_to_float(*(const uint16_t *)(wrow + (size_t)ib * legacy_size(kind)));
        if (kind == WQ5_0) {
            const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(_mm256_set1_epi8(16), a));
            const __m256i p = _mm256_madd_epi16(p16, ones);
            const float da = half_to_float(((const kp_block_q8_0 *)arow + ib)->d);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), acc);
        } else {
            const kp_block_q8_1 *y = (const kp_block_q8_1 *)arow + ib;
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * half_to_float(y->d)), _mm256_cvtepi32_ps(p), acc);
            const float mw = half_to_float(*(const uint16_t *)(wrow + (size_t)ib * legacy_size(kind) + 2));
            macc += mw * half_to_float(y->s);
        }
    }
    return hsum_ps(acc) + macc;
}

/* A Q8_1 activation block's d and s as floats (exact). */
typedef struct {
    float d, s;
} q8_1_ds;

/* Block terms of activation row c from block ib0 on, len blocks. Q5_0: the
 * caller's kp_q8_0_aux entries, or kp_q8_0_aux_row's values computed into
 * own (vectorized). */
AVX2_INLINE const kp_q8_0_aux *q8_0_terms(const char *a, size_t a_stride, const void *aux, size_t aux_stride,
                                          int c, int64_t ib0, int64_t len, kp_q8_0_aux *own) {
    if (aux) return (const kp_q8_0_aux *)((const char *)aux + (size_t)c * aux_stride) + ib0;
    const kp_block_q8_0 *y = (const kp_block_q8_0 *)(a + (size_t)c * a_stride) + ib0;
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < len; b++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[b].qs);
        own[b].d = half_to_float(y[b].d);
        own[b].bias = -128 * hsum_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(one8, v), one16));
    }
    return own;
}

/* Q8_1: d and s of each block, converted into own. */
AVX2_INLINE const q8_1_ds *q8_1_terms(const char *a, size_t a_stride, int c, int64_t ib0, int64_t len,
                                      q8_1_ds *own) {
    const kp_block_q8_1 *y = (const kp_block_q8_1 *)(a + (size_t)c * a_stride) + ib0;
    for (int64_t b = 0; b < len; b++) {
        own[b].d = half_to_float(y[b].d);
        own[b].s = half_to_float(y[b].s);
    }
    return own;
}

/* Staged block terms of up to N activation rows for one K chunk. */
#define ACT_TERMS(N)                     \
    union {                              \
        kp_q8_0_aux ax[N][LEG_KC];       \
        q8_1_ds ds[N][LEG_KC];           \
    }

/* One 8 x NC tile over blocks [ib0, ib0 + len): wr[8] weight rows (R = 4:
 * only rows 0..3 are computed), ar[NC] activation rows, ax[c] (Q5_0) or
 * ds[c] (Q8_1) their block terms from ib0. */
AVX2_INLINE void oct_tile(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                          const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds, int kind, int nr,
                          float *out, size_t os, int add, size_t pf, const int NC, const int R) {
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t blk = legacy_size(kind);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        __m256i q[8];
        if (pf) UNROLL for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + (size_t)ib * blk, _MM_HINT_T0);
        UNROLL for (int r = 0; r < R; r++) q[r] = legacy_quants(wr[r], ib, kind);
        const __m256 dw8 = half8_at(wr, (size_t)ib * blk);
        const __m256 mw8 = kind == WQ5_0 ? _mm256_setzero_ps() : half8_at(wr, (size_t)ib * blk + 2);
        UNROLL for (int c = 0; c < NC; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)act_quants(ar[c], ib, kind));
            __m256i p[8];
            UNROLL for (int r = 0; r < R; r++) p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], av), ones);
            UNROLL for (int r = R; r < 8; r++) p[r] = p[r - R];
            __m256i t = fold8_epi32(p);
            if (kind == WQ5_0) {
                t = _mm256_add_epi32(t, _mm256_set1_epi32(ax[c][b].bias / 8));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw8, _mm256_set1_ps(ax[c][b].d)), acc[c]);
            } else {
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw8, _mm256_set1_ps(ds[c][b].d)), acc[c]);
                acc[c] = _mm256_fmadd_ps(mw8, _mm256_set1_ps(ds[c][b].s), acc[c]);
            }
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

/*
 * One activation row with VNNI, 16 weight rows (decode): four rows per
 * 512-bit vector, x_k = [qs(row k) | qs(row k+4) | qs(row k+8) | qs(row
 * k+12)], 128-bit inserts from memory; the low and high nibbles meet the
 * activation's first and second 16 quants, broadcast to all four lanes, in
 * two vpdpbusd. Q5_0/Q5_1 add bit 4 by a masked byte add: one gather brings
 * the 16 rows' qh words (lane j: row j), so 128-bit lane i holds rows 4i..
 * 4i+3 and a vpshufb spreads row 4i+k's qh bytes over the bytes of x_k's
 * lane i, where vptestmb against 1 << (j mod 8) gives the mask. Two
 * unpack-and-add steps fold the four vectors to the 16 row sums in row
 * order. The same exact integer sums and the same float steps per row as
 * oct_tile, so the same results.
 */
VNNI_INLINE __m512i leg_hex_fold(const __m512i p[4]) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

/* The 4 bytes at w0 + at of rows w0 + j * ws (offs: j * ws), lane j = row j. */
VNNI_INLINE __m512i leg_hex_gather(const char *w0, __m512i offs, size_t at) {
    return _mm512_i32gather_epi32(offs, (const void *)(w0 + at), 1);
}

static VNNI void leg_hex_tile_vnni(int64_t ib0, int64_t len, const char *w0, size_t ws, const char *ar,
                                   const kp_q8_0_aux *ax, const q8_1_ds *ds, int kind, float *out, int add,
                                   size_t pf) {
    const size_t blk = legacy_size(kind);
    const size_t qs_at = kind == WQ4_1 ? offsetof(kp_block_q4_1, qs)
                         : kind == WQ5_0 ? offsetof(kp_block_q5_0, qs) : offsetof(kp_block_q5_1, qs);
    const size_t qh_at = kind == WQ5_0 ? offsetof(kp_block_q5_0, qh) : offsetof(kp_block_q5_1, qh);
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)ws));
    const __m512i m = _mm512_set1_epi8(0xF), five = _mm512_set1_epi8(0x10);
    const __m512i bit = _mm512_set1_epi64(0x8040201008040201ll);
    const __m512i spread = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        const char *wb = w0 + (size_t)ib * blk;
        /* one prefetch per row every 2 blocks (44 bytes) still touches every line */
        if (pf && !(b & 1)) UNROLL for (int r = 0; r < 16; r++) _mm_prefetch(wb + (size_t)r * ws + pf, _MM_HINT_T0);
        const int8_t *aq = act_quants(ar, ib, kind);
        const __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)aq));
        const __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(aq + 16)));
        const __m512i dm = leg_hex_gather(wb, offs, 0); /* d | m << 16 (Q4_1/Q5_1) */
        const __m512i qh = kind == WQ4_1 ? _mm512_setzero_si512() : leg_hex_gather(wb, offs, qh_at);
        __m512i p[4];
        UNROLL for (int k = 0; k < 4; k++) {
            const char *q0 = wb + qs_at + (size_t)k * ws;
            __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)q0));
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(q0 + 4 * ws)), 1);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(q0 + 8 * ws)), 2);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(q0 + 12 * ws)), 3);
            __m512i lo = _mm512_and_si512(x, m), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
            if (kind != WQ4_1) {
                const __m512i blo = _mm512_shuffle_epi8(qh, _mm512_add_epi8(spread, _mm512_set1_epi8((char)(4 * k))));
                const __m512i bhi = _mm512_shuffle_epi8(qh, _mm512_add_epi8(spread, _mm512_set1_epi8((char)(4 * k + 2))));
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(blo, bit), lo, five);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(bhi, bit), hi, five);
            }
            p[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo), hi, ahi);
        }
        __m512i t = leg_hex_fold(p);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        if (kind == WQ5_0) {
            t = _mm512_add_epi32(t, _mm512_set1_epi32(ax[b].bias / 8));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, _mm512_set1_ps(ax[b].d)), acc);
        } else {
            const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, _mm512_set1_ps(ds[b].d)), acc);
            acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(ds[b].s), acc);
        }
    }
    _mm512_storeu_ps(out, add ? _mm512_add_ps(acc, _mm512_loadu_ps(out)) : acc);
}

/* Few activation rows: K chunks, then groups of 4 activation rows (their
 * block terms staged once), then groups of 8 weight rows. */
AVX2_INLINE void tile_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride,
                             int kind, int pack) {
    const int64_t nb = n / 32;
    ACT_TERMS(4) own;
    const size_t pf = decode_pf(w_stride, nc, PANEL_MIN_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int64_t ib0 = 0; ib0 < nb; ib0 += LEG_KC) {
        const int64_t len = nb - ib0 < LEG_KC ? nb - ib0 : LEG_KC;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
            const char *ar[4];
            const kp_q8_0_aux *ax[4] = {NULL, NULL, NULL, NULL};
            const q8_1_ds *ds[4] = {NULL, NULL, NULL, NULL};
            for (int c = 0; c < ncc; c++) {
                ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
                if (kind == WQ5_0) ax[c] = q8_0_terms(a, a_stride, aux, aux_stride, c0 + c, ib0, len, own.ax[c]);
                else ds[c] = q8_1_terms(a, a_stride, c0 + c, ib0, len, own.ds[c]);
            }
            for (int r0 = 0; r0 < nr; r0 += 8) {
                const int nrr = nr - r0 < 8 ? nr - r0 : 8;
                const char *wr[8];
                rows8(w, w_stride, r0, nr, wr);
                float *o = out + (size_t)c0 * out_stride + (size_t)r0;
                const int add = ib0 > 0;
                if (pack == PACK_VNNI && ncc == 1 && nr - r0 >= 16) {
                    leg_hex_tile_vnni(ib0, len, wr[0], w_stride, ar[0], ax[0], ds[0], kind, o, add, pf);
                    r0 += 8; /* 16 rows done */
                    continue;
                }
                switch (ncc + 4 * (nrr > 4)) { /* 4 rows or fewer: compute 4 */
                case 1: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 1, 4); break;
                case 2: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 2, 4); break;
                case 3: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 3, 4); break;
                case 4: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 4, 4); break;
                case 5: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 1, 8); break;
                case 6: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 2, 8); break;
                case 7: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 3, 8); break;
                default: oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, out_stride, add, pf, 4, 8); break;
                }
            }
        }
    }
}

/* gemm's staging area for many activation rows: two panels of 8 weight
 * rows over one K chunk, their scales (Q5_0 in the VNNI table: dw / 8) and
 * offsets, and the block terms of PANEL_CC activation rows. */
typedef struct {
    __m256i q[PANEL_RC / 8][LEG_KC][8]; /* [panel][block][step]: 8 rows x 4 quants */
    float dw[PANEL_RC / 8][LEG_KC][8];  /* [panel][block][row] */
    float mw[PANEL_RC / 8][LEG_KC][8];  /* Q4_1/Q5_1 */
    ACT_TERMS(PANEL_CC) act;
} leg_stage;

/* Repacks len blocks (from block ib0) of the 8 rows wr[] into one panel. */
AVX2_INLINE void leg_pack(const char *const *wr, int64_t ib0, int64_t len, int kind, int pack, __m256i (*q)[8],
                          float (*dw)[8], float (*mw)[8], size_t pf) {
    const size_t blk = legacy_size(kind);
    const __m256 dscale = _mm256_set1_ps(pack == PACK_VNNI && kind == WQ5_0 ? 0.125f : 1.0f);
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        __m256i v[8];
        UNROLL for (int r = 0; r < 8; r++) {
            if (pf) _mm_prefetch(wr[r] + pf + (size_t)ib * blk, _MM_HINT_T0);
            else pack_prefetch(wr[r], (size_t)ib * blk, blk);
            v[r] = legacy_quants(wr[r], ib, kind);
            if (pack == PACK_VNNI && kind == WQ5_0) v[r] = _mm256_slli_epi16(v[r], 3); /* 8q <= 248: no carry */
        }
        _mm256_store_ps(dw[b], _mm256_mul_ps(half8_at(wr, (size_t)ib * blk), dscale));
        if (kind != WQ5_0) _mm256_store_ps(mw[b], half8_at(wr, (size_t)ib * blk + 2));
        __m256i *const dst[8] = {&q[b][0], &q[b][1], &q[b][2], &q[b][3], &q[b][4], &q[b][5], &q[b][6], &q[b][7]};
        transpose8_epi32_store(v, dst);
    }
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
            aq[c] = act_quants(ar[c], ib0 + b, kind);
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

/* P (1 or 2) panels x NC activation rows with vpdpbusd: each broadcast
 * activation load feeds P instructions. HAS_M: Q4_1/Q5_1 (sums from 0, the
 * "+ m" term), else Q5_0 (sums from the bias). Panel p's rows go to
 * out + 8p (nr[p] of them). */
VNNI_INLINE void leg_panel_tile_vnni_nc(const __m256i (*const *q)[8], const float (*const *dw)[8],
                                        const float (*const *mw)[8], const char *const *ar,
                                        const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds, int64_t ib0,
                                        int64_t len, const int *nr, float *out, size_t os, int add, const int NC,
                                        const int P, const int HAS_M) {
    const int kind = HAS_M ? WQ4_1 : WQ5_0; /* the activation layout: Q8_1 or Q8_0 */
    __m256 acc[2][4];
    UNROLL for (int p = 0; p < P; p++) UNROLL for (int c = 0; c < NC; c++) acc[p][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int8_t *aq[4];
        __m256i s[2][4];
        UNROLL for (int c = 0; c < NC; c++) {
            aq[c] = act_quants(ar[c], ib0 + b, kind);
            const __m256i s0 = HAS_M ? _mm256_setzero_si256() : _mm256_set1_epi32(ax[c][b].bias);
            UNROLL for (int p = 0; p < P; p++) s[p][c] = s0;
        }
        UNROLL for (int g = 0; g < 8; g++) {
            __m256i u[2];
            UNROLL for (int p = 0; p < P; p++) u[p] = _mm256_load_si256(&q[p][b][g]);
            UNROLL for (int c = 0; c < NC; c++) {
                const __m256i a4 = _mm256_set1_epi32(load_i32(aq[c] + 4 * g));
                UNROLL for (int p = 0; p < P; p++) s[p][c] = _mm256_dpbusd_epi32(s[p][c], u[p], a4);
            }
        }
        UNROLL for (int p = 0; p < P; p++) {
            const __m256 d8 = _mm256_load_ps(dw[p][b]);
            if (HAS_M) {
                const __m256 m8 = _mm256_load_ps(mw[p][b]);
                UNROLL for (int c = 0; c < NC; c++) {
                    acc[p][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[p][c]), _mm256_mul_ps(d8, _mm256_set1_ps(ds[c][b].d)),
                                                acc[p][c]);
                    acc[p][c] = _mm256_fmadd_ps(m8, _mm256_set1_ps(ds[c][b].s), acc[p][c]);
                }
            } else {
                UNROLL for (int c = 0; c < NC; c++)
                    acc[p][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[p][c]), _mm256_mul_ps(d8, _mm256_set1_ps(ax[c][b].d)),
                                                acc[p][c]);
            }
        }
    }
    UNROLL for (int p = 0; p < P; p++)
        UNROLL for (int c = 0; c < NC; c++) panel_store(acc[p][c], out + (size_t)c * os + 8 * p, nr[p], add);
}

/* The VNNI panel tile; a function of its own, since AVX2 code cannot
 * inline VNNI instructions. */
static VNNI void leg_panel_tile_vnni(const __m256i (*const *q)[8], const float (*const *dw)[8],
                                     const float (*const *mw)[8], const char *const *ar, const kp_q8_0_aux *const *ax,
                                     const q8_1_ds *const *ds, int64_t ib0, int64_t len, const int *nr, float *out,
                                     size_t os, int add, int nc, int n_panels, int kind) {
#define LEG_VNNI(NC, P, M) leg_panel_tile_vnni_nc(q, dw, mw, ar, ax, ds, ib0, len, nr, out, os, add, NC, P, M)
    switch (nc + 4 * (n_panels - 1) + 8 * (kind != WQ5_0)) {
    case 1: LEG_VNNI(1, 1, 0); break;
    case 2: LEG_VNNI(2, 1, 0); break;
    case 3: LEG_VNNI(3, 1, 0); break;
    case 4: LEG_VNNI(4, 1, 0); break;
    case 5: LEG_VNNI(1, 2, 0); break;
    case 6: LEG_VNNI(2, 2, 0); break;
    case 7: LEG_VNNI(3, 2, 0); break;
    case 8: LEG_VNNI(4, 2, 0); break;
    case 9: LEG_VNNI(1, 1, 1); break;
    case 10: LEG_VNNI(2, 1, 1); break;
    case 11: LEG_VNNI(3, 1, 1); break;
    case 12: LEG_VNNI(4, 1, 1); break;
    case 13: LEG_VNNI(1, 2, 1); break;
    case 14: LEG_VNNI(2, 2, 1); break;
    case 15: LEG_VNNI(3, 2, 1); break;
    default: LEG_VNNI(4, 2, 1); break;
    }
#undef LEG_VNNI
}

/* Many activation rows: chunks of PANEL_RC weight rows, K chunks of LEG_KC
 * blocks (repacked once), PANEL_CC activation rows with staged terms, then
 * tiles of up to 4 activation rows. */
AVX2_INLINE void gemm_leg_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride,
                                int kind, int pack, leg_stage *st) {
    const int64_t nb = n / 32;
    const size_t pf = decode_pf(w_stride, nc, PANEL_PF_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int rc0 = 0; rc0 < nr; rc0 += PANEL_RC) {
        const int rc = nr - rc0 < PANEL_RC ? nr - rc0 : PANEL_RC;
        const int n_panels = (rc + 7) / 8;
        for (int64_t ib0 = 0; ib0 < nb; ib0 += LEG_KC) {
            const int64_t len = nb - ib0 < LEG_KC ? nb - ib0 : LEG_KC;
            for (int p = 0; p < n_panels; p++) {
                const char *wr[8];
                rows8(w, w_stride, rc0 + 8 * p, nr, wr);
                leg_pack(wr, ib0, len, kind, pack, st->q[p], st->dw[p], st->mw[p], pf);
            }
            const int add = ib0 > 0;
            for (int cc0 = 0; cc0 < nc; cc0 += PANEL_CC) {
                const int ccn = nc - cc0 < PANEL_CC ? nc - cc0 : PANEL_CC;
                const kp_q8_0_aux *axc[PANEL_CC] = {NULL};
                const q8_1_ds *dsc[PANEL_CC] = {NULL};
                for (int c = 0; c < ccn; c++) {
                    if (kind == WQ5_0) axc[c] = q8_0_terms(a, a_stride, aux, aux_stride, cc0 + c, ib0, len, st->act.ax[c]);
                    else dsc[c] = q8_1_terms(a, a_stride, cc0 + c, ib0, len, st->act.ds[c]);
                }
                if (pack == PACK_VNNI) { /* all panels of the chunk at once */
                    const __m256i(*q[2])[8] = {(const __m256i(*)[8])st->q[0], (const __m256i(*)[8])st->q[1]};
                    const float(*dw[2])[8] = {(const float(*)[8])st->dw[0], (const float(*)[8])st->dw[1]};
                    const float(*mw[2])[8] = {(const float(*)[8])st->mw[0], (const float(*)[8])st->mw[1]};
                    const int npr[2] = {rc < 8 ? rc : 8, rc - 8};
                    for (int c0 = 0; c0 < ccn; c0 += 4) {
                        const int ncc = ccn - c0 < 4 ? ccn - c0 : 4;
                        const char *ar[4];
                        for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(cc0 + c0 + c) * a_stride;
                        float *o = out + (size_t)(cc0 + c0) * out_stride + (size_t)rc0;
                        leg_panel_tile_vnni(q, dw, mw, ar, axc + c0, dsc + c0, ib0, len, npr, o, out_stride, add, ncc,
                                            n_panels, kind);
                    }
                    continue;
                }
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
        }
    }
}

AVX2_INLINE void gemm_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride,
                             int kind, int pack) {
    if (nc >= PANEL_MIN_COLS) {
        leg_stage st __attribute__((aligned(32)));
        gemm_leg_panel(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, pack, &st);
    } else {
        tile_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, pack);
    }
}

#define LEGACY(type, kind)                                                                                    \
    AVX2 void kp_qmore_avx2_vec_dot_##type(int64_t n, float *s, const void *w, const void *a) {               \
        *s = dot_legacy(n / 32, w, a, kind);                                                                  \
    }                                                                                                         \
    AVX2 void kp_qmore_avx2_tile_##type(int64_t n, int nr, int nc, const void *w, size_t w_stride,            \
                                        const void *a, size_t a_stride, float *out, size_t out_stride) {      \
        tile_legacy(n, nr, nc, w, w_stride, a, a_stride, NULL, 0, out, out_stride, kind, PACK_AVX2);                     \
    }                                                                                                         \
    AVX2 void kp_qmore_avx2_gemm_##type(int64_t n, int nr, int nc, const void *w, size_t w_stride,            \
                                        const void *a, size_t a_stride, const void *aux, size_t aux_stride,   \
                                        float *out, size_t out_stride) {                                      \
        gemm_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, PACK_AVX2);  \
    }                                                                                                         \
    VNNI void kp_qmore_vnni_gemm_##type(int64_t n, int nr, int nc, const void *w, size_t w_stride,            \
                                        const void *a, size_t a_stride, const void *aux, size_t aux_stride,   \
                                        float *out, size_t out_stride) {                                      \
        gemm_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, PACK_VNNI);  \
    }
LEGACY(q4_1, WQ4_1)
LEGACY(q5_0, WQ5_0)
LEGACY(q5_1, WQ5_1)
#undef LEGACY

/* ------------------------------------------------------------------------ */
/* Q5_K                                                                      */
/* ------------------------------------------------------------------------ */


/* Bit k (0..7) of every byte of hb, moved to bit 4 (16-bit shifts: the
 * bits that cross into the neighbouring byte are masked off). */
AVX2_INLINE __m256i bit_to_4(__m256i hb, int k) {
    const __m256i v = k <= 4 ? _mm256_slli_epi16(hb, 4 - k) : _mm256_srli_epi16(hb, k - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The quants (0..31) of chunk c (sub-blocks 2c and 2c+1) of a super-block;
 * hb = its 32 qh bytes. */
AVX2_INLINE void q5k_quants(const kp_block_q5_K *x, __m256i hb, int c, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
    *lo = _mm256_or_si256(_mm256_and_si256(bits, m4), bit_to_4(hb, 2 * c));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), bit_to_4(hb, 2 * c + 1));
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

/* vec_dot: one row, one activation row, in the canonical order. */
AVX2 void kp_qmore_avx2_vec_dot_q5_K(int64_t n, float *s, const void *w, const void *a) {
    const int64_t nb = n / KP_QK_K;
    float acc = 0.0f, out = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const kp_block_q5_K *x = (const kp_block_q5_K *)w + i;
        const float da = ((const kp_block_q8_K *)a + i)->d;
        __m256i sumi, pm;
        q5k_sb(x, a, 0, i, &sumi, &pm, 1);
        acc = fma_ss((float)hsum_epi32(sumi), half_to_float(x->d) * da, acc);
        acc = fma_ss(-(float)hsum_epi32(pm), half_to_float(x->dmin) * da, acc);
        if ((i + 1) % K5_KC == 0 || i + 1 == nb) { /* end of a K chunk */
            out = i < K5_KC ? acc : out + acc;
            acc = 0.0f;
        }
    }
    *s = out;
}

/* Few activation rows: 8 weight rows x NC activation rows over super-blocks
 * [i0, i0 + len); each row's partial sums (q5k_sb) are folded into one
 * vector of exact sums, one lane per row. */
AVX2_INLINE void q5k_rows_tile(const char *const *wr, const char *ar, size_t a_stride, int64_t i0, int64_t len,
                               int nr, float *out, size_t os, int add, size_t pf, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    const int rows = nr <= 4 ? 4 : 8; /* the rest repeat rows 0..3 */
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        __m256i S[4][8], M[4][8];
        for (int r = 0; r < rows; r++) {
            /* 8 rows in step defeat the hardware prefetcher in decode: ask
             * for the rows pf bytes on (decode_pf), else 2 super-blocks on */
            const char *next = wr[r] + (pf ? pf + (size_t)i * sizeof(kp_block_q5_K) : (size_t)(i + 2) * sizeof(kp_block_q5_K));
            for (size_t off = 0; off < sizeof(kp_block_q5_K); off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
            __m256i s4[4], m4[4];
            q5k_sb((const kp_block_q5_K *)wr[r] + i, ar, a_stride, i, s4, m4, NC);
            UNROLL for (int c = 0; c < NC; c++) {
                S[c][r] = s4[c];
                M[c][r] = m4[c];
            }
        }
        for (int r = rows; r < 8; r++)
            UNROLL for (int c = 0; c < NC; c++) {
                S[c][r] = S[c][r - 4];
                M[c][r] = M[c][r - 4];
            }
        const size_t blk = (size_t)i * sizeof(kp_block_q5_K);
        const __m256 d8 = half8_at(wr, blk + offsetof(kp_block_q5_K, d));
        const __m256 m8 = half8_at(wr, blk + offsetof(kp_block_q5_K, dmin));
        UNROLL for (int c = 0; c < NC; c++) {
            const __m256 da = _mm256_set1_ps(((const kp_block_q8_K *)(ar + (size_t)c * a_stride) + i)->d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold8_epi32(S[c])), _mm256_mul_ps(d8, da), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(fold8_epi32(M[c])), _mm256_mul_ps(m8, da), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

AVX2 void kp_qmore_avx2_tile_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                  size_t a_stride, float *out, size_t out_stride) {
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
            for (int64_t i0 = 0; i0 < nb; i0 += K5_KC) {
                const int64_t len = nb - i0 < K5_KC ? nb - i0 : K5_KC;
                const int add = i0 > 0;
                switch (ncc) {
                case 1: q5k_rows_tile(wr, ac, a_stride, i0, len, nrr, o, out_stride, add, pf, 1); break;
                case 2: q5k_rows_tile(wr, ac, a_stride, i0, len, nrr, o, out_stride, add, pf, 2); break;
                case 3: q5k_rows_tile(wr, ac, a_stride, i0, len, nrr, o, out_stride, add, pf, 3); break;
                default: q5k_rows_tile(wr, ac, a_stride, i0, len, nrr, o, out_stride, add, pf, 4); break;
                }
            }
        }
    }
}

/*
 * Many activation rows: panels of 8 rows per super-block,
 *
 *   q[j][g]   sub-block j (32 quants), step g: 8 rows x 4 quants 0..31
 *   sc[j]     per row: scale j (AVX2: as an int16 pair, VNNI: int32)
 *   mn[j]     per row: min j as an int16 pair (m, m)
 *   per row:  isum = sum_j sc_j * (q.a)_j,  imin = sum_j m_j * bsum_j
 *
 * AVX2 forms (q.a)_j as two int16 stages of 4 steps, each widened and
 * scaled by vpmaddwd with the scale pair; VNNI as one vpdpbusd chain,
 * then vpmulld. imin: vpmaddwd (VNNI: vpdpwssd) of mn[j] with a broadcast
 * pair of bsums. Totals stay far inside int32 (|isum| < 2^26).
 */
typedef kmin_panel q5k_panel; /* quant_avx2_inl.h, shared with Q4_K */

typedef struct {
    q5k_panel p[PANEL_RC / 8][K5_KC];
} q5k_stage;

AVX2_INLINE uint32_t pair16(int v) { return (uint32_t)(uint16_t)v | (uint32_t)(uint16_t)v << 16; }

AVX2_INLINE void q5k_pack(const char *const *wr, int64_t i, int pack, q5k_panel *p) {
    __m256i v[8][8]; /* [sub-block][row] */
    uint32_t sc[8][8], mn[8][8];
    for (int r = 0; r < 8; r++) {
        const kp_block_q5_K *x = (const kp_block_q5_K *)wr[r] + i;
        uint8_t sm[16];
        _mm_storeu_si128((__m128i *)sm, kq_scales_mins(x->scales));
        for (int j = 0; j < 8; j++) {
            sc[j][r] = pack == PACK_VNNI ? sm[j] : pair16(sm[j]);
            mn[j][r] = pair16(sm[8 + j]);
        }
        p->d[r] = half_to_float(x->d);
        p->dmin[r] = half_to_float(x->dmin);
        const __m256i hb = _mm256_loadu_si256((const __m256i *)x->qh);
        for (int c = 0; c < 4; c++) q5k_quants(x, hb, c, &v[2 * c][r], &v[2 * c + 1][r]);
    }
    for (int j = 0; j < 8; j++) {
        __m256i *const dst[8] = {&p->q[j][0], &p->q[j][1], &p->q[j][2], &p->q[j][3],
                                 &p->q[j][4], &p->q[j][5], &p->q[j][6], &p->q[j][7]};
        transpose8_epi32_store(v[j], dst);
        _mm256_store_si256(&p->sc[j], _mm256_loadu_si256((const __m256i *)sc[j]));
        _mm256_store_si256(&p->mn[j], _mm256_loadu_si256((const __m256i *)mn[j]));
    }
}

/* The activation quants at byte offset off of super-block i of row c,
 * 4 of them broadcast to every lane. */

/* imin of NC activation rows: m_j * (bsums[2j] + bsums[2j+1]) per row. */
AVX2_INLINE __m256i q5k_imin(const q5k_panel *p, const kp_block_q8_K *y) {
    __m256i im = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 8; j++)
        im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_load_si256(&p->mn[j]), _mm256_set1_epi32(load_i32(&y->bsums[2 * j]))));
    return im;
}

/* One AVX2 panel x NC activation rows over super-blocks [i0, i0 + len). */
AVX2_INLINE void q5k_panel_tile(const q5k_panel *panels, const char *const *ar, int64_t i0, int64_t len, int nr,
                                float *out, size_t os, int add, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        const q5k_panel *p = panels + b;
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

/* The same with vpdpbusd for the sub-block sums and vpmulld for the scales. */
VNNI_INLINE void q5k_panel_tile_vnni_nc(const q5k_panel *panels, const char *const *ar, int64_t i0, int64_t len,
                                        int nr, float *out, size_t os, int add, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) kmin_panel_step_vnni(panels + b, ar, i0 + b, acc, NC);
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

static VNNI void q5k_panel_tile_vnni(const q5k_panel *panels, const char *const *ar, int64_t i0, int64_t len, int nr,
                                     float *out, size_t os, int add, int nc) {
    switch (nc) {
    case 1: q5k_panel_tile_vnni_nc(panels, ar, i0, len, nr, out, os, add, 1); break;
    case 2: q5k_panel_tile_vnni_nc(panels, ar, i0, len, nr, out, os, add, 2); break;
    case 3: q5k_panel_tile_vnni_nc(panels, ar, i0, len, nr, out, os, add, 3); break;
    default: q5k_panel_tile_vnni_nc(panels, ar, i0, len, nr, out, os, add, 4); break;
    }
}

AVX2_INLINE void gemm_q5k_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, float *out, size_t out_stride, int pack, q5k_stage *st) {
    const int64_t nb = n / KP_QK_K;
    const size_t pf = decode_pf(w_stride, nc, PANEL_PF_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int rc0 = 0; rc0 < nr; rc0 += PANEL_RC) {
        const int rc = nr - rc0 < PANEL_RC ? nr - rc0 : PANEL_RC;
        const int n_panels = (rc + 7) / 8;
        for (int64_t i0 = 0; i0 < nb; i0 += K5_KC) {
            const int64_t len = nb - i0 < K5_KC ? nb - i0 : K5_KC;
            for (int p = 0; p < n_panels; p++) {
                const char *wr[8];
                rows8(w, w_stride, rc0 + 8 * p, nr, wr);
                for (int64_t b = 0; b < len; b++) {
                    if (pf) /* few activation rows: stream the rows ahead, as the tiles do */
                        for (int r = 0; r < 8; r++)
                            for (size_t off = 0; off < sizeof(kp_block_q5_K); off += 64)
                                _mm_prefetch(wr[r] + pf + (size_t)(i0 + b) * sizeof(kp_block_q5_K) + off, _MM_HINT_T0);
                    q5k_pack(wr, i0 + b, pack, &st->p[p][b]);
                }
            }
            const int add = i0 > 0;
            for (int p = 0; p < n_panels; p++) {
                const int npr = rc - 8 * p < 8 ? rc - 8 * p : 8;
                for (int c0 = 0; c0 < nc; c0 += 4) {
                    const int ncc = nc - c0 < 4 ? nc - c0 : 4;
                    const char *ar[4];
                    for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
                    float *o = out + (size_t)c0 * out_stride + (size_t)(rc0 + 8 * p);
                    if (pack == PACK_VNNI) {
                        q5k_panel_tile_vnni(st->p[p], ar, i0, len, npr, o, out_stride, add, ncc);
                        continue;
                    }
                    switch (ncc) {
                    case 1: q5k_panel_tile(st->p[p], ar, i0, len, npr, o, out_stride, add, 1); break;
                    case 2: q5k_panel_tile(st->p[p], ar, i0, len, npr, o, out_stride, add, 2); break;
                    case 3: q5k_panel_tile(st->p[p], ar, i0, len, npr, o, out_stride, add, 3); break;
                    default: q5k_panel_tile(st->p[p], ar, i0, len, npr, o, out_stride, add, 4); break;
                    }
                }
            }
        }
    }
}

/* gemm for Q5_K: panels for many activation rows, else dot_tile's kernel. */
AVX2_INLINE void gemm_q5k(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                          float *out, size_t out_stride, int pack) {
    if (nc < PANEL_MIN_COLS) {
        kp_qmore_avx2_tile_q5_K(n, nr, nc, w, w_stride, a, a_stride, out, out_stride);
        return;
    }
    q5k_stage st __attribute__((aligned(32)));
    gemm_q5k_panel(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, pack, &st);
}

AVX2 void kp_qmore_avx2_gemm_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                  size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    (void)aux;
    (void)aux_stride;
    gemm_q5k(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, PACK_AVX2);
}

VNNI void kp_qmore_vnni_gemm_q5_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                  size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    (void)aux;
    (void)aux_stride;
    gemm_q5k(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, PACK_VNNI);
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
