/*
 * quant_avx2.c - the AVX2 + FMA + F16C kernel table (see quant.h).
 *
 * Compiled without -march flags: every function carries
 * __attribute__((target("avx2,fma,f16c"))) (the VNNI kernels add
 * avx512f/vl/bw/vnni), and kp_kernels_best() hands a table out only when
 * the CPU has what it uses. Outside x86-64 the file compiles to stubs that
 * return NULL.
 *
 * Integer dot products (Q8_0, Q4_0, Q4_K, Q6_K against Q8_0/Q8_K
 * activations) use vpmaddubsw, which multiplies unsigned by signed bytes
 * and adds adjacent pairs into int16 with saturation, then vpmaddwd to
 * widen to int32:
 *
 *   Q8_0 . Q8_0   |w| (unsigned) x sign(a, w)  - the "sign trick"; |w|, |a| <= 127
 *                 keeps each pair sum <= 2*127*127 < 32767
 *   Q4_0 . Q8_0   q in 0..15 is unsigned: maddubs(q, a) - maddubs(8, a)
 *   Q4_K . Q8_K   q in 0..15 is already unsigned; vpmaddwd with the 6-bit
 *                 sub-block scale broadcast to all lanes; the mins term is
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
 * dot_tile (and gemm with few activation rows, i.e. decode): the weight row
 * is the outer loop; each weight block is loaded and decoded once (nibble
 * unpacking, 6-bit scale unpacking, sign splitting) and then multiplied with
 * the same block of all nc activation rows, which stay hot in L1 across the
 * nr rows. Q8_0/Q4_0 take 4 rows at a time and fold their partial sums with
 * vphaddd. The column count (1..4) is a compile-time constant in each
 * specialisation, so accumulators live in registers.
 *
 * gemm with many activation rows (prefill), integer types: the call's
 * weight rows are repacked once, on the stack, into panels of 8 rows whose
 * vectors hold the same 4 quants of every row, one int32 lane per row; 4
 * activation quants are broadcast to all lanes, so each instruction does
 * the work of 8 row dot products and no horizontal sums remain. Sections
 * below draw each panel. The repacking costs about one activation row's
 * worth of work and is reused by all of them. Float types use register
 * tiles of 2 rows x 6 activation rows (4 x C in decode).
 *
 * Two tables come out of this file: "avx2", and "avx512vnni", the same but
 * for the integer gemm panels, which use vpdpbusd on 256-bit vectors
 * (AVX512-VNNI with AVX512-VL): 4 products into an int32 lane in one
 * instruction, without vpmaddubsw's int16 saturation, so Q8_0 weights can
 * be stored with a +128 offset and corrected once per block.
 *
 * Stack use: a gemm call keeps its panels and staged scales on the stack,
 * at most about 45 KiB (panel_stage, kq_stage; 12 KiB for float types).
 *
 * quantize_act is bit-identical to the reference quantizers in quant.c
 * (Q8_0 rounds half away from zero like roundf; Q8_K rounds to nearest
 * even like nearest_int; F16 uses vcvtps2ph with round-to-nearest-even).
 */
#include "kernels/quant_impl.h"
#include "kernels/quant_more.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/quant_avx2_inl.h"

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

AVX2_INLINE int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

AVX2_INLINE __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2_INLINE __m256 load_bf16x8(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

enum { ELEM_F32, ELEM_F16, ELEM_BF16 };

/* 8 consecutive elements of a float-type row, as floats. */
AVX2_INLINE __m256 load_x8(const void *row, int64_t i, int kind) {
    if (kind == ELEM_F32) return _mm256_loadu_ps((const float *)row + i);
    if (kind == ELEM_F16) return load_f16x8((const uint16_t *)row + i);
    return load_bf16x8((const uint16_t *)row + i);
}

AVX2_INLINE float load_x1(const void *row, int64_t i, int kind) {
    if (kind == ELEM_F32) return ((const float *)row)[i];
    const uint16_t h = ((const uint16_t *)row)[i];
    if (kind == ELEM_F16) return half_to_float(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ------------------------------------------------------------------------ */
/* float-type rows: F32, F16, BF16                                           */
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

static AVX2 void vec_dot_f32(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_float_rows(n, w, ELEM_F32, a, ELEM_F32);
}
static AVX2 void vec_dot_f16(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_float_rows(n, w, ELEM_F16, a, ELEM_F16);
}
static AVX2 void vec_dot_bf16(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_float_rows(n, w, ELEM_BF16, a, ELEM_BF16);
}



/* ------------------------------------------------------------------------ */
/* Q8_0 and Q4_0 weights . Q8_0 activations                                  */
/* ------------------------------------------------------------------------ */

enum { WQ8_0, WQ4_0 };

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

static AVX2 void vec_dot_q8_0(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_legacy(n / KP_QK8_0, w, a, WQ8_0);
}
static AVX2 void vec_dot_q4_0(int64_t n, float *s, const void *w, const void *a) {
    *s = dot_legacy(n / KP_QK4_0, w, a, WQ4_0);
}

/*
 * gemm and dot_tile results do not depend on the shape of the call: out[c][r]
 * is bit-identical whether row r comes with 1 or 15 other rows and column c
 * with 0 or 500 other columns, in this table and in avx512vnni. The forward
 * pass relies on it (a prompt computed as one batch, in chunks or token by
 * token gives the same logits, so cached KV rows equal recomputed ones).
 * Every path therefore computes each output in one canonical order:
 *
 *   Q8_0, Q4_0   per K chunk of PANEL_KC blocks: acc = 0, then for each block
 *                acc = fma(float(S), dw * da, acc), S the exact integer dot
 *                product of the block; out = chunk 0, out += chunk 1, ...
 *   Q4_K, Q6_K   the same per chunk of KQ_KC super-blocks, with the exact
 *                integer sums of a super-block (Q4_K: acc = fma(float(isum),
 *                d * da, acc), then acc = fma(-float(imin), dmin * da, acc))
 *   F32/F16/BF16 per chunk of FP_KC elements (padded with zeros to a
 *                multiple of 8): 8 lanes, lane i = fma(w[k], a[k], lane i)
 *                for k = i mod 8 in order, then hsum_ps
 *
 * For the integer types that is what one vector lane does when the lanes
 * are weight rows: the panels below for many activation rows, and the tiles
 * for few activation rows (decode), which fold the partial sums per block so
 * that lanes are rows too. Integer sums are exact however they are formed
 * (sign trick, +128 offset, VNNI), so the integer kernels may differ per
 * table. The float types use plain register tiles in every case.
 */
enum { PACK_AVX2, PACK_VNNI }; /* which integer kernels: avx2 or avx512vnni table */

#define PANEL_KC 64 /* Q8_0/Q4_0 blocks per K chunk: 2048 elements */
#define KQ_KC 6     /* Q4_K/Q6_K super-blocks per K chunk: 1536 elements */
#define PANEL_MIN_COLS 8

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

/* Quants of weight block ib of a row: element order, signed (Q8_0) or
 * unsigned 0..15 (Q4_0). */
AVX2_INLINE __m256i legacy_quants(const char *wrow, int64_t ib, int kind) {
    if (kind == WQ8_0) return _mm256_loadu_si256((const __m256i *)((const kp_block_q8_0 *)wrow + ib)->qs);
    const __m128i b = _mm_loadu_si128((const __m128i *)((const kp_block_q4_0 *)wrow + ib)->qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0xF));
}

/* Where the aux entries of activation row c start (block ib0): the caller's
 * aux, or this call's own, computed into own[0..len). */
AVX2_INLINE const kp_q8_0_aux *legacy_aux(const char *a, size_t a_stride, const void *aux,
                                          size_t aux_stride, int c, int64_t ib0, int64_t len,
                                          kp_q8_0_aux *own) {
    if (aux) return (const kp_q8_0_aux *)((const char *)aux + (size_t)c * aux_stride) + ib0;
    /* kp_q8_0_aux_row, vectorized */
    const kp_block_q8_0 *y = (const kp_block_q8_0 *)(a + (size_t)c * a_stride) + ib0;
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < len; b++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, v), one16);
        own[b].d = half_to_float(y[b].d);
        own[b].bias = -128 * hsum_epi32(s8);
    }
    return own;
}

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

/* oct_tile with vpdpbusd: Q8_0 quants offset to w + 128 (unsigned), each
 * row's sum then corrected by the aux bias; Q4_0 as in oct_tile. The same
 * exact integers, so the same results. */
VNNI_INLINE void oct_tile_vnni_nc(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                                  const kp_q8_0_aux *const *ax, int kind, int nr, float *out, size_t os,
                                  int add, size_t pf, const int NC, const int R) {
    const size_t blk = kind == WQ8_0 ? sizeof(kp_block_q8_0) : sizeof(kp_block_q4_0);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        __m256i u[8];
        if (pf) UNROLL for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + (size_t)ib * blk, _MM_HINT_T0);
        UNROLL for (int r = 0; r < R; r++) {
            u[r] = legacy_quants(wr[r], ib, kind);
            if (kind == WQ8_0) u[r] = _mm256_xor_si256(u[r], _mm256_set1_epi8((char)0x80));
        }
        const __m256 dw8 = half8_at(wr, (size_t)ib * blk);
        UNROLL for (int c = 0; c < NC; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)((const kp_block_q8_0 *)ar[c] + ib)->qs);
            __m256i p[8];
            UNROLL for (int r = 0; r < R; r++) p[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[r], av);
            UNROLL for (int r = R; r < 8; r++) p[r] = p[r - R];
            const int32_t bias = kind == WQ8_0 ? ax[c][b].bias : ax[c][b].bias / 16;
            const __m256i t = _mm256_add_epi32(fold8_epi32(p), _mm256_set1_epi32(bias));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw8, _mm256_set1_ps(ax[c][b].d)), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

static VNNI void oct_tile_vnni(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                               const kp_q8_0_aux *const *ax, int kind, int nr, float *out, size_t os,
                               int add, int nc, size_t pf) {
    switch (nc + 4 * (nr > 4)) {
    case 1: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 1, 4); break;
    case 2: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 2, 4); break;
    case 3: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 3, 4); break;
    case 4: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 4, 4); break;
    case 5: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 1, 8); break;
    case 6: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 2, 8); break;
    case 7: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 3, 8); break;
    default: oct_tile_vnni_nc(ib0, len, wr, ar, ax, kind, nr, out, os, add, pf, 4, 8); break;
    }
}

/*
 * Q4_0 with few activation rows: a row pair per vector. The 16 quant bytes
 * of rows r and r + 4 fill the two 128-bit halves of one vector (a load and
 * a vinserti128 from memory, no shuffle), the low and high nibbles come out
 * with a mask and a shift, and they meet the activation's first and second
 * 16 quants, each broadcast to both halves:
 *
 *   x_k = [qs(row k) | qs(row k+4)]                         k = 0..3
 *   p_k = vpmaddwd(vpmaddubsw(x_k & 15, a_lo) + vpmaddubsw(x_k >> 4 & 15, a_hi), 1)
 *         (VNNI: vpdpbusd twice)  = [4 partial sums of row k | of row k+4]
 *
 * (int16 pair sums at most 2 * 15 * 128 each, 7680 for the two.) Four such
 * vectors fold in two unpack-and-add steps to the 8 row sums in row order:
 *
 *   s01 = lo32(p0, p1) + hi32(p0, p1),  s23 likewise,  t = lo64(s01, s23) + hi64(s01, s23)
 *
 * so a block of 8 rows costs 9 in-lane shuffles and adds where oct_tile's
 * hadd tree took 14 shuffle-port operations. The integer sums are oct_tile's exact ones and the float steps
 * the same, so the results are too.
 */

/* Low and high nibbles of block ib of rows ra and rb, as [ra | rb]. */
AVX2_INLINE void q4_pair(const char *ra, const char *rb, int64_t ib, __m256i *lo, __m256i *hi) {
    const __m128i xa = _mm_loadu_si128((const __m128i *)((const kp_block_q4_0 *)ra + ib)->qs);
    const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(xa),
                                              _mm_loadu_si128((const __m128i *)((const kp_block_q4_0 *)rb + ib)->qs), 1);
    const __m256i m = _mm256_set1_epi8(0xF);
    *lo = _mm256_and_si256(x, m);
    *hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m);
}

/* [row k | row k+4] partial sums, k = 0..3 -> the 8 row sums in row order. */
AVX2_INLINE __m256i fold_pairs(const __m256i p[4]) {
    const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
    const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
}

/* One 8 x NC Q4_0 tile over blocks [ib0, ib0 + len), as oct_tile (rows past
 * nr repeat, computed and not stored); DOT(lo, hi, a_lo, a_hi) is one row
 * pair's vector of partial sums (vpmaddubsw or vpdpbusd: the same exact
 * sums). */
#define Q4_TILE_BODY(DOT)                                                                                      \
    __m256 acc[4];                                                                                             \
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();                                          \
    for (int64_t b = 0; b < len; b++) {                                                                        \
        const int64_t ib = ib0 + b;                                                                            \
        __m256i lo[4], hi[4];                                                                                  \
        if (pf)                                                                                                \
            UNROLL for (int r = 0; r < 8; r++) _mm_prefetch(wr[r] + pf + (size_t)ib * sizeof(kp_block_q4_0), _MM_HINT_T0); \
        UNROLL for (int k = 0; k < 4; k++) q4_pair(wr[k], wr[k + 4], ib, &lo[k], &hi[k]);                      \
        const __m256 dw8 = half8_at(wr, (size_t)ib * sizeof(kp_block_q4_0));                                  \
        UNROLL for (int c = 0; c < NC; c++) {                                                                  \
            const kp_block_q8_0 *y = (const kp_block_q8_0 *)ar[c] + ib;                                        \
            const __m256i alo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)y->qs));          \
            const __m256i ahi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y->qs + 16)));   \
            __m256i p[4];                                                                                      \
            UNROLL for (int k = 0; k < 4; k++) p[k] = DOT(lo[k], hi[k], alo, ahi);                             \
            const __m256i t = _mm256_add_epi32(fold_pairs(p), _mm256_set1_epi32(ax[c][b].bias / 16));          \
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw8, _mm256_set1_ps(ax[c][b].d)), acc[c]); \
        }                                                                                                      \
    }                                                                                                          \
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);

#define Q4_DOT_AVX2(lo, hi, alo, ahi)                                                                          \
    _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi)),          \
                      _mm256_set1_epi16(1))
#define Q4_DOT_VNNI(lo, hi, alo, ahi) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, alo), hi, ahi)

AVX2_INLINE void q4_tile(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                         const kp_q8_0_aux *const *ax, int nr, float *out, size_t os, int add, size_t pf,
                         const int NC) {
    Q4_TILE_BODY(Q4_DOT_AVX2)
}

VNNI_INLINE void q4_tile_vnni_nc(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                                 const kp_q8_0_aux *const *ax, int nr, float *out, size_t os, int add, size_t pf,
                                 const int NC) {
    Q4_TILE_BODY(Q4_DOT_VNNI)
}
#undef Q4_TILE_BODY
#undef Q4_DOT_AVX2
#undef Q4_DOT_VNNI

/* Q4_0 decode (one activation row) with VNNI, 16 weight rows: as
 * q4_tile_vnni_nc with four rows per 512-bit vector (rows k, k+4, k+8,
 * k+12), so the fold gives the 16 row sums in row order, and one gather
 * brings the 16 row scales. The same integers and float steps per row. */
static VNNI void q4_hex_tile_vnni(int64_t ib0, int64_t len, const char *w0, size_t ws, const char *ar,
                                  const kp_q8_0_aux *ax, float *out, int add, size_t pf) {
    const size_t blk = sizeof(kp_block_q4_0);
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)ws));
    const __m512i m = _mm512_set1_epi8(0xF);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        const char *wb = w0 + (size_t)ib * blk + 2; /* qs of block ib, row 0 */
        /* one prefetch per row every 3 blocks (54 bytes) still touches every line */
        if (pf && b % 3 == 0) UNROLL for (int r = 0; r < 16; r++) _mm_prefetch(wb + (size_t)r * ws + pf, _MM_HINT_T0);
        const kp_block_q8_0 *y = (const kp_block_q8_0 *)ar + ib;
        const __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)y->qs));
        const __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y->qs + 16)));
        __m512i p[4];
        UNROLL for (int k = 0; k < 4; k++) {
            __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wb + (size_t)k * ws)));
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(wb + (size_t)(k + 4) * ws)), 1);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(wb + (size_t)(k + 8) * ws)), 2);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(wb + (size_t)(k + 12) * ws)), 3);
            const __m512i lo = _mm512_and_si512(x, m), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
            p[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo), hi, ahi);
        }
        const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
        const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
        __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
        t = _mm512_add_epi32(t, _mm512_set1_epi32(ax[b].bias / 16));
        const __m512i g = _mm512_i32gather_epi32(offs, (const void *)(wb - 2), 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, _mm512_set1_ps(ax[b].d)), acc);
    }
    _mm512_storeu_ps(out, add ? _mm512_add_ps(acc, _mm512_loadu_ps(out)) : acc);
}

static VNNI void q4_tile_vnni(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                              const kp_q8_0_aux *const *ax, int nr, float *out, size_t os, int add, int nc, size_t pf) {
    switch (nc) {
    case 1: q4_tile_vnni_nc(ib0, len, wr, ar, ax, nr, out, os, add, pf, 1); break;
    case 2: q4_tile_vnni_nc(ib0, len, wr, ar, ax, nr, out, os, add, pf, 2); break;
    case 3: q4_tile_vnni_nc(ib0, len, wr, ar, ax, nr, out, os, add, pf, 3); break;
    default: q4_tile_vnni_nc(ib0, len, wr, ar, ax, nr, out, os, add, pf, 4); break;
    }
}

/* Q8_0 decode (one activation row) with VNNI, 16 weight rows at once: rows r
 * and r + 8 share a 512-bit vector, so the fold to one sum per row, the
 * conversion and the scaling run once per 16 rows; the row scales come in
 * with one gather. The lanes hold rows 0-3, 8-11, 4-7, 12-15 until the
 * end. The same integers and the same float operations per row as
 * oct_tile_vnni_nc, so the same results. */
static VNNI void hex_tile_vnni(int64_t ib0, int64_t len, const char *w0, size_t ws, const char *ar,
                               const kp_q8_0_aux *ax, int kind, float *out, int add, size_t pf) {
    const size_t blk = kind == WQ8_0 ? sizeof(kp_block_q8_0) : sizeof(kp_block_q4_0);
    const __m512i lane_row = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
    const __m512i offs = _mm512_mullo_epi32(lane_row, _mm512_set1_epi32((int)ws));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        const __m256i av = _mm256_loadu_si256((const __m256i *)((const kp_block_q8_0 *)ar + ib)->qs);
        const __m512i av2 = _mm512_inserti64x4(_mm512_castsi256_si512(av), av, 1);
        __m512i p[8];
        UNROLL for (int r = 0; r < 8; r++) {
            const char *ra = w0 + (size_t)r * ws, *rb = ra + 8 * ws;
            if (pf) {
                _mm_prefetch(ra + pf + (size_t)ib * blk, _MM_HINT_T0);
                _mm_prefetch(rb + pf + (size_t)ib * blk, _MM_HINT_T0);
            }
            __m256i ua = legacy_quants(ra, ib, kind), ub = legacy_quants(rb, ib, kind);
            if (kind == WQ8_0) {
                ua = _mm256_xor_si256(ua, _mm256_set1_epi8((char)0x80));
                ub = _mm256_xor_si256(ub, _mm256_set1_epi8((char)0x80));
            }
            p[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_inserti64x4(_mm512_castsi256_si512(ua), ub, 1),
                                       av2);
        }
        __m512i s2[4];
        UNROLL for (int i = 0; i < 4; i++)
            s2[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]),
                                     _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
        const __m512i q0 = _mm512_add_epi32(_mm512_unpacklo_epi64(s2[0], s2[1]), _mm512_unpackhi_epi64(s2[0], s2[1]));
        const __m512i q1 = _mm512_add_epi32(_mm512_unpacklo_epi64(s2[2], s2[3]), _mm512_unpackhi_epi64(s2[2], s2[3]));
        __m512i t = _mm512_add_epi32(_mm512_shuffle_i32x4(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i32x4(q0, q1, _MM_SHUFFLE(3, 1, 3, 1)));
        t = _mm512_add_epi32(t, _mm512_set1_epi32(kind == WQ8_0 ? ax[b].bias : ax[b].bias / 16));
        const __m512i g = _mm512_i32gather_epi32(offs, (const void *)(w0 + (size_t)ib * blk), 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, _mm512_set1_ps(ax[b].d)), acc);
    }
    acc = _mm512_permutexvar_ps(lane_row, acc); /* lane_row is its own inverse */
    _mm512_storeu_ps(out, add ? _mm512_add_ps(acc, _mm512_loadu_ps(out)) : acc);
}

AVX2_INLINE void tile_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride, int kind, int pack) {
    const int64_t nb = n / 32;
    kp_q8_0_aux own[4][PANEL_KC];
    const size_t pf = decode_pf(w_stride, nc, PANEL_MIN_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int64_t ib0 = 0; ib0 < nb; ib0 += PANEL_KC) {
        const int64_t len = nb - ib0 < PANEL_KC ? nb - ib0 : PANEL_KC;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
            const char *ar[4];
            const kp_q8_0_aux *ax[4];
            for (int c = 0; c < ncc; c++) {
                ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
                ax[c] = legacy_aux(a, a_stride, aux, aux_stride, c0 + c, ib0, len, own[c]);
            }
            for (int r0 = 0; r0 < nr; r0 += 8) {
                const int nrr = nr - r0 < 8 ? nr - r0 : 8;
                const char *wr[8];
                for (int r = 0; r < 8; r++) wr[r] = (const char *)w + (size_t)(r0 + (r < nrr ? r : nrr - 1)) * w_stride;
                float *o = out + (size_t)c0 * out_stride + (size_t)r0;
                const int add = ib0 > 0;
                if (pack == PACK_VNNI && kind == WQ8_0 && ncc == 1 && nr - r0 >= 16) { /* Q4_0: no gain measured */
                    hex_tile_vnni(ib0, len, wr[0], w_stride, ar[0], ax[0], kind, o, add, pf);
                    r0 += 8; /* 16 rows done */
                    continue;
                }
                if (kind == WQ4_0 && pack == PACK_VNNI && ncc == 1 && nr - r0 >= 16) {
                    q4_hex_tile_vnni(ib0, len, wr[0], w_stride, ar[0], ax[0], o, add, pf);
                    r0 += 8; /* 16 rows done */
                    continue;
                }
                if (kind == WQ4_0 && nrr > 4 && pack == PACK_VNNI) {
                    q4_tile_vnni(ib0, len, wr, ar, ax, nrr, o, out_stride, add, ncc, pf);
                    continue;
                }
                if (kind == WQ4_0 && nrr > 4) {
                    switch (ncc) {
                    case 1: q4_tile(ib0, len, wr, ar, ax, nrr, o, out_stride, add, pf, 1); break;
                    case 2: q4_tile(ib0, len, wr, ar, ax, nrr, o, out_stride, add, pf, 2); break;
                    case 3: q4_tile(ib0, len, wr, ar, ax, nrr, o, out_stride, add, pf, 3); break;
                    default: q4_tile(ib0, len, wr, ar, ax, nrr, o, out_stride, add, pf, 4); break;
                    }
                    continue;
                }
                if (pack == PACK_VNNI) {
                    oct_tile_vnni(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, ncc, pf);
                    continue;
                }
                switch (ncc + 4 * (nrr > 4)) { /* 4 rows or fewer: compute 4 */
                case 1: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 1, 4); break;
                case 2: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 2, 4); break;
                case 3: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 3, 4); break;
                case 4: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 4, 4); break;
                case 5: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 1, 8); break;
                case 6: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 2, 8); break;
                case 7: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 3, 8); break;
                default: oct_tile(ib0, len, wr, ar, ax, kind, nrr, o, out_stride, add, pf, 4, 8); break;
                }
            }
        }
    }
}

/*
 * Q8_0/Q4_0 with many activation rows (gemm in prefill). The weight rows are
 * first repacked, per K chunk, into panels of 8 rows in which each 32-byte
 * step holds 4 consecutive quants of every row:
 *
 *   panel step (b, g), 32 bytes:  row0 q[4g..4g+3] | row1 q[4g..4g+3] | ... | row7
 *   steps of one block b:         g = 0..7 (32 quants), then block b+1
 *
 * so that one int32 lane belongs to one weight row. An activation's 4
 * quants at 4g..4g+3 are broadcast to all lanes (a plain load-broadcast),
 * and each step adds 4 products into every row's lane: no horizontal sums
 * at all, and a block ends with one conversion and one FMA for 8 rows x 1
 * activation row:
 *
 *   AVX2 Q8_0   s += vpmaddwd(vpmaddubsw(|w|, sign(a, w)), 1)      int32
 *   AVX2 Q4_0   s16 += vpmaddubsw(q, a), q = 0..15 unsigned         int16
 *               (8 steps add at most 8 * 2*15*128 = 30720 < 2^15, so a
 *               block stays in int16 until one vpmaddwd; then - 8 sum(a))
 *   VNNI        s = vpdpbusd(s, u, a) from s = -128 sum(a) (the aux bias),
 *               u = w + 128 (Q8_0) or 16q (Q4_0, whose dw is stored / 16):
 *               16q - 128 = 16(q - 8), so both offsets are 128, and
 *               vpdpbusd sums 4 products into int32 without saturating
 *   acc += float(s) * dw[8 rows] * da
 *
 * Repacking costs about as much as one activation row's products and is
 * done once per call, so this path is taken when a call has many
 * activation rows (PANEL_MIN_COLS). Activation scales and sums come from
 * the caller's aux, or are computed per call for PANEL_CC activation rows
 * at a time and reused by every panel of the call.
 */
#define PANEL_RC 16 /* weight rows repacked per chunk: 2 panels (16 KiB each) */
_Static_assert(PANEL_RC == 16, "the VNNI tile takes the two panels of a chunk together");
#define PANEL_CC 16 /* activation rows with computed aux at a time */

typedef struct {
    __m256i q[PANEL_RC / 8][PANEL_KC][8]; /* [panel][block][step]: 8 rows x 4 quants */
    float dw[PANEL_RC / 8][PANEL_KC][8];  /* weight scales [panel][block][row] */
    kp_q8_0_aux ax[PANEL_CC][PANEL_KC];   /* computed aux, when the caller has none */
} panel_stage;


/* Repacks len blocks (from block ib0) of the 8 rows wr[] into one panel. */
AVX2_INLINE void panel_pack(const char *const *wr, int64_t ib0, int64_t len, int kind, int pack,
                            __m256i (*q)[8], float (*dw)[8], size_t pf) {
    const size_t blk = kind == WQ8_0 ? sizeof(kp_block_q8_0) : sizeof(kp_block_q4_0);
    const float dscale = pack == PACK_VNNI && kind == WQ4_0 ? 1.0f / 16 : 1.0f;
    for (int64_t b = 0; b < len; b++) {
        __m256i v[8];
        UNROLL for (int r = 0; r < 8; r++) {
            if (pf) _mm_prefetch(wr[r] + pf + (size_t)(ib0 + b) * blk, _MM_HINT_T0);
            else pack_prefetch(wr[r], (size_t)(ib0 + b) * blk, blk);
            v[r] = legacy_quants(wr[r], ib0 + b, kind);
            if (pack == PACK_VNNI)
                v[r] = kind == WQ8_0 ? _mm256_xor_si256(v[r], _mm256_set1_epi8((char)0x80))
                                     : _mm256_slli_epi16(v[r], 4); /* nibbles: no carry */
        }
        _mm256_storeu_ps(dw[b], _mm256_mul_ps(half8_at(wr, (size_t)(ib0 + b) * blk), _mm256_set1_ps(dscale)));
        __m256i *const dst[8] = {&q[b][0], &q[b][1], &q[b][2], &q[b][3], &q[b][4], &q[b][5], &q[b][6], &q[b][7]};
        transpose8_epi32_store(v, dst);
    }
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


/* P (1 or 2) panels of 8 rows x NC activation rows: with two panels each
 * broadcast activation load feeds two vpdpbusd, which keeps the loads from
 * limiting the loop. Panel p's rows go to out + 8p (nr[p] of them). */
VNNI_INLINE void panel_tile_vnni_nc(const __m256i (*const *q)[8], const float (*const *dw)[8],
                                    const char *const *ar, const kp_q8_0_aux *const *ax, int64_t ib0,
                                    int64_t len, const int *nr, float *out, size_t os, int add, const int NC,
                                    const int P) {
    __m256 acc[2][4];
    UNROLL for (int p = 0; p < P; p++) UNROLL for (int c = 0; c < NC; c++) acc[p][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int8_t *aq[4];
        __m256i s[2][4];
        UNROLL for (int c = 0; c < NC; c++) {
            aq[c] = ((const kp_block_q8_0 *)ar[c] + ib0 + b)->qs;
            UNROLL for (int p = 0; p < P; p++) s[p][c] = _mm256_set1_epi32(ax[c][b].bias);
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
            UNROLL for (int c = 0; c < NC; c++)
                acc[p][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[p][c]), _mm256_mul_ps(d8, _mm256_set1_ps(ax[c][b].d)),
                                            acc[p][c]);
        }
    }
    UNROLL for (int p = 0; p < P; p++)
        UNROLL for (int c = 0; c < NC; c++) panel_store(acc[p][c], out + (size_t)c * os + 8 * p, nr[p], add);
}

/* The VNNI panel tile; a function of its own, since AVX2 code cannot
 * inline VNNI instructions. n_panels (1 or 2) panels, nc activation rows. */
static VNNI void panel_tile_vnni(const __m256i (*const *q)[8], const float (*const *dw)[8], const char *const *ar,
                                 const kp_q8_0_aux *const *ax, int64_t ib0, int64_t len, const int *nr,
                                 float *out, size_t os, int add, int nc, int n_panels) {
    switch (nc + 4 * (n_panels - 1)) {
    case 1: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 1, 1); break;
    case 2: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 2, 1); break;
    case 3: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 3, 1); break;
    case 4: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 4, 1); break;
    case 5: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 1, 2); break;
    case 6: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 2, 2); break;
    case 7: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 3, 2); break;
    default: panel_tile_vnni_nc(q, dw, ar, ax, ib0, len, nr, out, os, add, 4, 2); break;
    }
}

AVX2_INLINE void gemm_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                            size_t a_stride, const void *aux, size_t aux_stride, float *out,
                            size_t out_stride, int kind, int pack, panel_stage *st) {
    const int64_t nb = n / 32;
    const size_t pf = decode_pf(w_stride, nc, PANEL_PF_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int rc0 = 0; rc0 < nr; rc0 += PANEL_RC) {
        const int rc = nr - rc0 < PANEL_RC ? nr - rc0 : PANEL_RC;
        const int n_panels = (rc + 7) / 8;
        for (int64_t ib0 = 0; ib0 < nb; ib0 += PANEL_KC) {
            const int64_t len = nb - ib0 < PANEL_KC ? nb - ib0 : PANEL_KC;
            for (int p = 0; p < n_panels; p++) {
                const char *wr[8];
                for (int r = 0; r < 8; r++) {
                    const int row = rc0 + 8 * p + r < nr ? rc0 + 8 * p + r : nr - 1;
                    wr[r] = (const char *)w + (size_t)row * w_stride;
                }
                panel_pack(wr, ib0, len, kind, pack, st->q[p], st->dw[p], pf);
            }
            for (int cc0 = 0; cc0 < nc; cc0 += PANEL_CC) {
                const int ccn = nc - cc0 < PANEL_CC ? nc - cc0 : PANEL_CC;
                const kp_q8_0_aux *axc[PANEL_CC];
                for (int c = 0; c < ccn; c++)
                    axc[c] = legacy_aux(a, a_stride, aux, aux_stride, cc0 + c, ib0, len, st->ax[c]);
                if (pack == PACK_VNNI) { /* all panels of the chunk at once */
                    const __m256i(*q[2])[8] = {(const __m256i(*)[8])st->q[0], (const __m256i(*)[8])st->q[1]};
                    const float(*dw[2])[8] = {(const float(*)[8])st->dw[0], (const float(*)[8])st->dw[1]};
                    const int npr[2] = {rc < 8 ? rc : 8, rc - 8};
                    for (int c0 = 0; c0 < ccn; c0 += 4) {
                        const int ncc = ccn - c0 < 4 ? ccn - c0 : 4;
                        const char *ar[4];
                        for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(cc0 + c0 + c) * a_stride;
                        float *o = out + (size_t)(cc0 + c0) * out_stride + (size_t)rc0;
                        panel_tile_vnni(q, dw, ar, axc + c0, ib0, len, npr, o, out_stride, ib0 > 0, ncc, n_panels);
                    }
                    continue;
                }
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
        }
    }
}

/* gemm for Q8_0/Q4_0: the panel path for many activation rows, else the
 * 8 x NC tile. */
AVX2_INLINE void gemm_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, const void *aux, size_t aux_stride, float *out,
                             size_t out_stride, int kind, int pack) {
    if (nc >= PANEL_MIN_COLS) {
        panel_stage st __attribute__((aligned(32)));
        gemm_panel(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, pack, &st);
    } else {
        tile_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, pack);
    }
}

static AVX2 void tile_q8_0(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                           const void *a, size_t a_stride, float *out, size_t out_stride) {
    tile_legacy(n, nr, nc, w, w_stride, a, a_stride, NULL, 0, out, out_stride, WQ8_0, PACK_AVX2);
}
static AVX2 void tile_q4_0(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                           const void *a, size_t a_stride, float *out, size_t out_stride) {
    tile_legacy(n, nr, nc, w, w_stride, a, a_stride, NULL, 0, out, out_stride, WQ4_0, PACK_AVX2);
}

#define LEGACY_GEMM(name, attr, kind, pack)                                                       \
    static attr void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,             \
                          const void *a, size_t a_stride, const void *aux, size_t aux_stride,     \
                          float *out, size_t out_stride) {                                       \
        gemm_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, \
                    pack);                                                                        \
    }
LEGACY_GEMM(gemm_q8_0, AVX2, WQ8_0, PACK_AVX2)
LEGACY_GEMM(gemm_q4_0, AVX2, WQ4_0, PACK_AVX2)
LEGACY_GEMM(gemm_q8_0_vnni, VNNI, WQ8_0, PACK_VNNI)
LEGACY_GEMM(gemm_q4_0_vnni, VNNI, WQ4_0, PACK_VNNI)
#undef LEGACY_GEMM

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

/*
 * The avx512vnni table's F32/F16/BF16 kernels: the same register tiles on
 * 512-bit vectors (16 lanes; 2 x 8 tiles for many activation rows, 4 x C in
 * decode), chunks of F5_KC elements padded with zeros to a multiple of 16,
 * lane i summing k = i mod 16, then one fixed horizontal sum. Its own
 * canonical order (16 lanes), shared by every call shape of that table.
 */
#define F5_KC 512 /* elements per K chunk */
#define F5_NC 8   /* activation rows per tile (at most) */

VNNI_INLINE __m512 load_x16(const void *row, int64_t i, int kind) {
    if (kind == ELEM_F32) return _mm512_loadu_ps((const float *)row + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (kind == ELEM_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

VNNI_INLINE __m512 float_w16(const char *row, int64_t k, int64_t n, int kind) {
    if (k + 16 <= n) return load_x16(row, k, kind);
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = k + i < n ? load_x1(row, k + i, kind) : 0.0f;
    return _mm512_loadu_ps(t);
}

VNNI_INLINE float hsum512(__m512 v) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum_ps(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

VNNI_INLINE void float_tile512(const char *const *wr, int kind, int64_t k0, int64_t len16, int64_t n,
                               const float (*sa)[F5_KC], int nr, float *out, size_t os, int add, size_t pf,
                               const int R, const int C) {
    const size_t es = kind == ELEM_F32 ? 4 : 2;
    __m512 acc[4][F5_NC];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < len16; k += 16) {
        __m512 w[4];
        if (pf && (size_t)(k0 + k) * es % 64 < 16 * es) /* once per cache line */
            UNROLL for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + (size_t)(k0 + k) * es, _MM_HINT_T0);
        UNROLL for (int r = 0; r < R; r++) w[r] = float_w16(wr[r], k0 + k, n, kind);
        UNROLL for (int c = 0; c < C; c++) {
            const __m512 av = _mm512_load_ps(&sa[c][k]);
            UNROLL for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(w[r], av, acc[r][c]);
        }
    }
    UNROLL for (int c = 0; c < C; c++)
        UNROLL for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            float *o = out + (size_t)c * os + (size_t)r;
            const float v = hsum512(acc[r][c]);
            *o = add ? *o + v : v;
        }
}

VNNI_INLINE void tile_float512(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                               size_t a_stride, float *out, size_t out_stride, int kind) {
    float sa[F5_NC][F5_KC] __attribute__((aligned(64)));
    const size_t pf = decode_pf(w_stride, nc, 5);
    if (n <= 0) zero_out(nr, nc, out, out_stride);
    for (int64_t k0 = 0; k0 < n; k0 += F5_KC) {
        const int64_t len = n - k0 < F5_KC ? n - k0 : F5_KC;
        const int64_t len16 = (len + 15) & ~(int64_t)15;
        for (int c0 = 0; c0 < nc; c0 += F5_NC) {
            const int ncc = nc - c0 < F5_NC ? nc - c0 : F5_NC;
            for (int c = 0; c < ncc; c++) {
                const char *arow = (const char *)a + (size_t)(c0 + c) * a_stride;
                int64_t k = 0;
                for (; k + 16 <= len; k += 16) _mm512_store_ps(&sa[c][k], load_x16(arow, k0 + k, kind));
                for (; k < len16; k++) sa[c][k] = k < len ? load_x1(arow, k0 + k, kind) : 0.0f;
            }
            const int R = ncc <= 4 ? 4 : 2;
            for (int r0 = 0; r0 < nr; r0 += R) {
                const int nrr = nr - r0 < R ? nr - r0 : R;
                const char *wr[4];
                for (int r = 0; r < R; r++) wr[r] = (const char *)w + (size_t)(r0 + (r < nrr ? r : nrr - 1)) * w_stride;
                float *o = out + (size_t)c0 * out_stride + (size_t)r0;
                const float(*sp)[F5_KC] = (const float(*)[F5_KC])sa;
                const int add = k0 > 0;
                switch (ncc) {
                case 1: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 4, 1); break;
                case 2: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 4, 2); break;
                case 3: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 4, 3); break;
                case 4: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 4, 4); break;
                case 5: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 2, 5); break;
                case 6: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 2, 6); break;
                case 7: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 2, 7); break;
                default: float_tile512(wr, kind, k0, len16, n, sp, nrr, o, out_stride, add, pf, 2, 8); break;
                }
            }
        }
    }
}

#define FLOAT_TILE512(name, gname, kind)                                                        \
    static VNNI void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,           \
                          const void *a, size_t a_stride, float *out, size_t out_stride) {     \
        tile_float512(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind);              \
    }                                                                                           \
    static VNNI void gname(int64_t n, int nr, int nc, const void *w, size_t w_stride,          \
                           const void *a, size_t a_stride, const void *aux, size_t aux_stride,  \
                           float *out, size_t out_stride) {                                    \
        (void)aux;                                                                              \
        (void)aux_stride;                                                                       \
        tile_float512(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind);              \
    }
FLOAT_TILE512(tile_f32_512, gemm_f32_512, ELEM_F32)
FLOAT_TILE512(tile_f16_512, gemm_f16_512, ELEM_F16)
FLOAT_TILE512(tile_bf16_512, gemm_bf16_512, ELEM_BF16)
#undef FLOAT_TILE512

/* ------------------------------------------------------------------------ */
/* Q4_K weights . Q8_K activations                                           */
/* ------------------------------------------------------------------------ */

/* (scales and mins: kq_scales_mins, quant_avx2_inl.h; the mapping of kp_quant_q4k_unpack_scales) */

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

/* vec_dot: one row, one activation row, in the canonical order. */
static AVX2 void vec_dot_q4_K(int64_t n, float *s, const void *w, const void *a) {
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



/* ------------------------------------------------------------------------ */
/* Q6_K weights . Q8_K activations                                           */
/* ------------------------------------------------------------------------ */

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
static AVX2 void vec_dot_q6_K(int64_t n, float *s, const void *w, const void *a) {
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



#undef KQUANT_TILE

/* ------------------------------------------------------------------------ */
/* Q4_K and Q6_K with few activation rows (decode, dot_tile)                 */
/* ------------------------------------------------------------------------ */

enum { KQ4, KQ6 };


/*
 * 8 weight rows x NC (1..4) activation rows over super-blocks [i0, i0+len):
 * each row's super-block gives vectors of partial integer sums (q4k_sb,
 * q6k_sb); fold8_epi32 turns the 8 rows' vectors into one vector of exact
 * sums, one lane per row, so the float work is the panel's, lane for lane.
 */
AVX2_INLINE void kq_rows_tile(const char *const *wr, const char *ar, size_t a_stride, int64_t i0, int64_t len,
                              int kind, int nr, float *out, size_t os, int add, size_t pf, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        __m256i S[4][8], M[4][8];
        const int rows = nr <= 4 ? 4 : 8; /* the rest repeat rows 0..3 */
        for (int r = 0; r < rows; r++) {
            /* 8 rows in step defeat the hardware prefetcher in decode: ask
             * for the rows pf bytes on (decode_pf), else 2 super-blocks on */
            const size_t bsz = kind == KQ4 ? sizeof(kp_block_q4_K) : sizeof(kp_block_q6_K);
            const char *next = pf ? wr[r] + pf + (size_t)i * bsz : wr[r] + (size_t)(i + 2) * bsz;
            for (size_t off = 0; off < bsz; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
            __m256i s4[4], m4[4];
            if (kind == KQ4) q4k_sb((const kp_block_q4_K *)wr[r] + i, ar, a_stride, i, s4, m4, NC);
            else q6k_sb((const kp_block_q6_K *)wr[r] + i, ar, a_stride, i, s4, NC);
            UNROLL for (int c = 0; c < NC; c++) {
                S[c][r] = s4[c];
                if (kind == KQ4) M[c][r] = m4[c];
            }
        }
        for (int r = rows; r < 8; r++)
            UNROLL for (int c = 0; c < NC; c++) {
                S[c][r] = S[c][r - 4];
                if (kind == KQ4) M[c][r] = M[c][r - 4];
            }
        if (kind == KQ4) {
            const size_t blk = (size_t)i * sizeof(kp_block_q4_K);
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
            for (int r = 0; r < 8; r++) wr[r] = (const char *)w + (size_t)(r0 + (r < nrr ? r : nrr - 1)) * w_stride;
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

static AVX2 void tile_q4_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                           size_t a_stride, float *out, size_t out_stride) {
    tile_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, KQ4);
}
static AVX2 void tile_q6_K(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                           size_t a_stride, float *out, size_t out_stride) {
    tile_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, KQ6);
}

/* ------------------------------------------------------------------------ */
/* Q4_K and Q6_K with many activation rows: repacked panels                 */
/* ------------------------------------------------------------------------ */

/*
 * The layout idea of the Q8_0 panels (8 weight rows per vector, one int32
 * lane per row, 4 quants per lane, activations broadcast), per super-block:
 *
 *   Q4_K  q[j][g]   sub-block j (32 quants), step g: 8 rows x 4 quants 0..15
 *         sc[j]     per row: scale j (AVX2: as an int16 pair, VNNI: int32)
 *         mn[j]     per row: min j as an int16 pair (m, m)
 *         per row:  isum = sum_j sc_j * (q.a)_j,   imin = sum_j m_j * bsum_j
 *                   acc += float(isum) * d*da - float(imin) * dmin*da
 *   Q6_K  q[j][g]   sub-block j (16 quants), step g (4 of them): q + 32, 0..63
 *         sc[j]     per row: scale j (signed; AVX2 int16 pair, VNNI int32)
 *         sp[p]     per row: the pair (sc_2p, sc_2p+1)
 *         per row:  isum = sum_j sc_j * (q.a)_j - 32 sum_j sc_j * bsums_j
 *
 * (q.a)_j: AVX2 adds vpmaddubsw pair sums in int16 over one sub-block (Q4_K
 * 8 steps, at most 8 * 2*15*128 = 30720; Q6_K 2 steps, 2 * 2*63*128 =
 * 32256), then vpmaddwd with the scale pair both widens and scales. VNNI:
 * vpdpbusd over the sub-block, then vpmulld by the int32 scale. The
 * bsums terms take vpmaddwd with a broadcast pair of activation bsums.
 * Totals stay far inside int32 (Q4_K < 2^25, Q6_K < 2^29).
 */

typedef kmin_panel q4k_panel; /* quant_avx2_inl.h, shared with Q5_K */

typedef struct {
    __m256i q[16][4];
    __m256i sc[16], sp[8];
    float d[8];
} q6k_panel;

typedef struct {
    union {
        q4k_panel q4k[PANEL_RC / 8][KQ_KC];
        q6k_panel q6k[PANEL_RC / 8][KQ_KC];
    } p;
} kq_stage;


AVX2_INLINE uint32_t pair16(int v) { return (uint32_t)(uint16_t)v | (uint32_t)(uint16_t)v << 16; }

AVX2_INLINE void q4k_pack(const char *const *wr, int64_t i, int pack, q4k_panel *p) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256i v[8][8]; /* [sub-block][row] */
    uint32_t sc[8][8], mn[8][8];
    for (int r = 0; r < 8; r++) {
        const kp_block_q4_K *x = (const kp_block_q4_K *)wr[r] + i;
        uint8_t sm[16];
        _mm_storeu_si128((__m128i *)sm, kq_scales_mins(x->scales));
        for (int j = 0; j < 8; j++) {
            sc[j][r] = pack == PACK_VNNI ? sm[j] : pair16(sm[j]);
            mn[j][r] = pair16(sm[8 + j]);
        }
        p->d[r] = half_to_float(x->d);
        p->dmin[r] = half_to_float(x->dmin);
        for (int c = 0; c < 4; c++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
            v[2 * c][r] = _mm256_and_si256(b, m4);
            v[2 * c + 1][r] = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        }
    }
    for (int j = 0; j < 8; j++) {
        __m256i *const dst[8] = {&p->q[j][0], &p->q[j][1], &p->q[j][2], &p->q[j][3],
                                 &p->q[j][4], &p->q[j][5], &p->q[j][6], &p->q[j][7]};
        transpose8_epi32_store(v[j], dst);
        _mm256_store_si256(&p->sc[j], _mm256_loadu_si256((const __m256i *)sc[j]));
        _mm256_store_si256(&p->mn[j], _mm256_loadu_si256((const __m256i *)mn[j]));
    }
}

AVX2_INLINE void q6k_pack(const char *const *wr, int64_t i, int pack, q6k_panel *p) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    __m256i v[8][8]; /* [group of 32 quants][row] */
    uint32_t sc[16][8], sp[8][8];
    for (int r = 0; r < 8; r++) {
        const kp_block_q6_K *x = (const kp_block_q6_K *)wr[r] + i;
        for (int j = 0; j < 16; j++) sc[j][r] = pack == PACK_VNNI ? (uint32_t)(int32_t)x->scales[j] : pair16(x->scales[j]);
        for (int q = 0; q < 8; q++)
            sp[q][r] = (uint32_t)(uint16_t)x->scales[2 * q] | (uint32_t)(uint16_t)x->scales[2 * q + 1] << 16;
        p->d[r] = half_to_float(x->d);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
            v[4 * h + 0][r] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
            v[4 * h + 1][r] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
            v[4 * h + 2][r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
            v[4 * h + 3][r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        }
    }
    for (int t = 0; t < 8; t++) { /* quants 32t..32t+31 = sub-blocks 2t, 2t+1 */
        __m256i *const dst[8] = {&p->q[2 * t][0],     &p->q[2 * t][1],     &p->q[2 * t][2],     &p->q[2 * t][3],
                                 &p->q[2 * t + 1][0], &p->q[2 * t + 1][1], &p->q[2 * t + 1][2], &p->q[2 * t + 1][3]};
        transpose8_epi32_store(v[t], dst);
    }
    for (int j = 0; j < 16; j++) _mm256_store_si256(&p->sc[j], _mm256_loadu_si256((const __m256i *)sc[j]));
    for (int q = 0; q < 8; q++) _mm256_store_si256(&p->sp[q], _mm256_loadu_si256((const __m256i *)sp[q]));
}

/* The activation quants at byte offset off of super-block i of row c,
 * 4 of them broadcast to every lane. */

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
            const q4k_panel *p = (const q4k_panel *)panels + b;
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

/* The same with vpdpbusd for the sub-block sums and vpmulld for the scales. */
VNNI_INLINE void kq_tile_vnni_nc(const void *panels, const char *const *ar, int64_t i0, int64_t len, int kind,
                                 int nr, float *out, size_t os, int add, const int NC) {
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        if (kind == KQ4) {
            kmin_panel_step_vnni((const q4k_panel *)panels + b, ar, i, acc, NC);
        } else {
            const q6k_panel *p = (const q6k_panel *)panels + b;
            __m256i isum[4], s[4];
            UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
            for (int j = 0; j < 16; j++) {
                const __m256i sc = _mm256_load_si256(&p->sc[j]);
                UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_setzero_si256();
                UNROLL for (int g = 0; g < 4; g++) {
                    const __m256i w = _mm256_load_si256(&p->q[j][g]);
                    UNROLL for (int c = 0; c < NC; c++) s[c] = _mm256_dpbusd_epi32(s[c], w, KQ_A4(ar, c, i, 16 * j + 4 * g));
                }
                UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s[c], sc));
            }
            const __m256 d8 = _mm256_load_ps(p->d);
            UNROLL for (int c = 0; c < NC; c++) {
                const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
                __m256i corr = _mm256_setzero_si256();
                UNROLL for (int q = 0; q < 8; q++)
                    corr = _mm256_dpwssd_epi32(corr, _mm256_load_si256(&p->sp[q]), _mm256_set1_epi32(load_i32(&y->bsums[2 * q])));
                const __m256i t = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(corr, 5));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d8, _mm256_set1_ps(y->d)), acc[c]);
            }
        }
    }
    UNROLL for (int c = 0; c < NC; c++) panel_store(acc[c], out + (size_t)c * os, nr, add);
}

static VNNI void kq_tile_vnni(const void *panels, const char *const *ar, int64_t i0, int64_t len, int kind,
                              int nr, float *out, size_t os, int add, int nc) {
    switch (nc) {
    case 1: kq_tile_vnni_nc(panels, ar, i0, len, kind, nr, out, os, add, 1); break;
    case 2: kq_tile_vnni_nc(panels, ar, i0, len, kind, nr, out, os, add, 2); break;
    case 3: kq_tile_vnni_nc(panels, ar, i0, len, kind, nr, out, os, add, 3); break;
    default: kq_tile_vnni_nc(panels, ar, i0, len, kind, nr, out, os, add, 4); break;
    }
}

AVX2_INLINE void gemm_kq_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                               size_t a_stride, float *out, size_t out_stride, int kind, int pack,
                               kq_stage *st) {
    const int64_t nb = n / KP_QK_K;
    const size_t pf = decode_pf(w_stride, nc, PANEL_PF_COLS);
    const size_t bsz = kind == KQ4 ? sizeof(kp_block_q4_K) : sizeof(kp_block_q6_K);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int rc0 = 0; rc0 < nr; rc0 += PANEL_RC) {
        const int rc = nr - rc0 < PANEL_RC ? nr - rc0 : PANEL_RC;
        const int n_panels = (rc + 7) / 8;
        for (int64_t i0 = 0; i0 < nb; i0 += KQ_KC) {
            const int64_t len = nb - i0 < KQ_KC ? nb - i0 : KQ_KC;
            for (int p = 0; p < n_panels; p++) {
                const char *wr[8];
                for (int r = 0; r < 8; r++) {
                    const int row = rc0 + 8 * p + r < nr ? rc0 + 8 * p + r : nr - 1;
                    wr[r] = (const char *)w + (size_t)row * w_stride;
                }
                for (int64_t b = 0; b < len; b++) {
                    if (pf) /* few activation rows: stream the rows ahead, as the tiles do */
                        for (int r = 0; r < 8; r++)
                            for (size_t off = 0; off < bsz; off += 64)
                                _mm_prefetch(wr[r] + pf + (size_t)(i0 + b) * bsz + off, _MM_HINT_T0);
                    if (kind == KQ4) q4k_pack(wr, i0 + b, pack, &st->p.q4k[p][b]);
                    else q6k_pack(wr, i0 + b, pack, &st->p.q6k[p][b]);
                }
            }
            for (int p = 0; p < n_panels; p++) {
                const int npr = rc - 8 * p < 8 ? rc - 8 * p : 8;
                const void *panels = kind == KQ4 ? (const void *)st->p.q4k[p] : (const void *)st->p.q6k[p];
                for (int c0 = 0; c0 < nc; c0 += 4) {
                    const int ncc = nc - c0 < 4 ? nc - c0 : 4;
                    const char *ar[4];
                    for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
                    float *o = out + (size_t)c0 * out_stride + (size_t)(rc0 + 8 * p);
                    const int add = i0 > 0;
                    if (pack == PACK_VNNI) {
                        kq_tile_vnni(panels, ar, i0, len, kind, npr, o, out_stride, add, ncc);
                        continue;
                    }
                    switch (ncc) {
                    case 1: kq_tile(panels, ar, i0, len, kind, npr, o, out_stride, add, 1); break;
                    case 2: kq_tile(panels, ar, i0, len, kind, npr, o, out_stride, add, 2); break;
                    case 3: kq_tile(panels, ar, i0, len, kind, npr, o, out_stride, add, 3); break;
                    default: kq_tile(panels, ar, i0, len, kind, npr, o, out_stride, add, 4); break;
                    }
                }
            }
        }
    }
}

/* gemm for Q4_K/Q6_K: panels for many activation rows, else dot_tile's
 * row-by-row kernel (decode). */
#define KQUANT_GEMM(name, attr, tile, kind, pack)                                               \
    static attr void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,           \
                          const void *a, size_t a_stride, const void *aux, size_t aux_stride,   \
                          float *out, size_t out_stride) {                                     \
        (void)aux;                                                                              \
        (void)aux_stride;                                                                       \
        if (nc < PANEL_MIN_COLS) {                                                              \
            tile(n, nr, nc, w, w_stride, a, a_stride, out, out_stride);                         \
            return;                                                                             \
        }                                                                                       \
        kq_stage st __attribute__((aligned(32)));                                               \
        gemm_kq_panel(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind, pack, &st);   \
    }
KQUANT_GEMM(gemm_q4_K, AVX2, tile_q4_K, KQ4, PACK_AVX2)
KQUANT_GEMM(gemm_q6_K, AVX2, tile_q6_K, KQ6, PACK_AVX2)
KQUANT_GEMM(gemm_q4_K_vnni, VNNI, tile_q4_K, KQ4, PACK_VNNI)
KQUANT_GEMM(gemm_q6_K_vnni, VNNI, tile_q6_K, KQ6, PACK_VNNI)
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

static AVX2 void act_q8_0(const float *x, void *dst, int64_t n) {
    kp_block_q8_0 *y = dst;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t i = 0; i < n / KP_QK8_0; i++, x += KP_QK8_0) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                       _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
        const float amax = hmax_ps(m);
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kp_fp32_to_fp16(d);
        const __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[k], idv)));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

static AVX2 void act_q8_K(const float *x, void *dst, int64_t n) {
    kp_block_q8_K *y = dst;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t i = 0; i < n / KP_QK_K; i++, x += KP_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < KP_QK_K; k += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask));
        const float amax = hmax_ps(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0; /* signed value of the first element with |x| == amax */
        for (int j = 0; j < KP_QK_K; j++) {
            if (x[j] == amax || x[j] == -amax) {
                max = x[j];
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

static AVX2 void act_f16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = kp_fp32_to_fp16(x[i]);
}

static AVX2 void act_bf16(const float *x, void *dst, int64_t n) {
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

static AVX2 void act_f32(const float *x, void *dst, int64_t n) {
    if (n > 0) memcpy(dst, x, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------------ */
/* attention helpers                                                         */
/* ------------------------------------------------------------------------ */

static AVX2 float dot_f32(int64_t n, const float *x, const float *y) {
    return dot_float_rows(n, x, ELEM_F32, y, ELEM_F32);
}

static AVX2 float dot_f32_f16(int64_t n, const float *x, const uint16_t *y) {
    return dot_float_rows(n, x, ELEM_F32, y, ELEM_F16);
}

static AVX2 void axpy_f32(int64_t n, float a, const float *x, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static AVX2 void axpy_f16(int64_t n, float a, const uint16_t *x, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * half_to_float(x[i]);
}

/*
 * Two tables: "avx2" (AVX2 + FMA + F16C) and "avx512vnni", which is the same
 * table but for the gemm of every type (integer panels with vpdpbusd on
 * 256-bit vectors, float tiles on 512-bit vectors) and the float dot_tile.
 * Everything else is shared through AVX2_SHARED_ENTRIES.
 */
#define AVX2_SHARED_ENTRIES                                                        \
    .quantize_act =                                                                \
        {                                                                          \
            [KP_DTYPE_F32] = act_f32,                                              \
            [KP_DTYPE_F16] = act_f16,                                              \
            [KP_DTYPE_BF16] = act_bf16,                                            \
            [KP_DTYPE_Q8_0] = act_q8_0,                                            \
            [KP_DTYPE_Q4_0] = act_q8_0,                                            \
            [KP_DTYPE_Q4_K] = act_q8_K,                                            \
            [KP_DTYPE_Q6_K] = act_q8_K,                                            \
            [KP_DTYPE_Q4_1] = kp_qmore_avx2_act_q8_1, /* quant_more_avx2.c */      \
            [KP_DTYPE_Q5_0] = act_q8_0,                                            \
            [KP_DTYPE_Q5_1] = kp_qmore_avx2_act_q8_1,                              \
            [KP_DTYPE_Q5_K] = act_q8_K,                                            \
        },                                                                         \
    .vec_dot =                                                                     \
        {                                                                          \
            [KP_DTYPE_F32] = vec_dot_f32,                                          \
            [KP_DTYPE_F16] = vec_dot_f16,                                          \
            [KP_DTYPE_BF16] = vec_dot_bf16,                                        \
            [KP_DTYPE_Q8_0] = vec_dot_q8_0,                                        \
            [KP_DTYPE_Q4_0] = vec_dot_q4_0,                                        \
            [KP_DTYPE_Q4_K] = vec_dot_q4_K,                                        \
            [KP_DTYPE_Q6_K] = vec_dot_q6_K,                                        \
            [KP_DTYPE_Q4_1] = kp_qmore_avx2_vec_dot_q4_1, /* quant_more_avx2.c */  \
            [KP_DTYPE_Q5_0] = kp_qmore_avx2_vec_dot_q5_0,                          \
            [KP_DTYPE_Q5_1] = kp_qmore_avx2_vec_dot_q5_1,                          \
            [KP_DTYPE_Q5_K] = kp_qmore_avx2_vec_dot_q5_K,                          \
        },                                                                         \
    .dot_tile =                                                                    \
        {                                                                          \
            [KP_DTYPE_F32] = tile_f32,                                             \
            [KP_DTYPE_F16] = tile_f16,                                             \
            [KP_DTYPE_BF16] = tile_bf16,                                           \
            [KP_DTYPE_Q8_0] = tile_q8_0,                                           \
            [KP_DTYPE_Q4_0] = tile_q4_0,                                           \
            [KP_DTYPE_Q4_K] = tile_q4_K,                                           \
            [KP_DTYPE_Q6_K] = tile_q6_K,                                           \
            [KP_DTYPE_Q4_1] = kp_qmore_avx2_tile_q4_1, /* quant_more_avx2.c */     \
            [KP_DTYPE_Q5_0] = kp_qmore_avx2_tile_q5_0,                             \
            [KP_DTYPE_Q5_1] = kp_qmore_avx2_tile_q5_1,                             \
            [KP_DTYPE_Q5_K] = kp_qmore_avx2_tile_q5_K,                             \
        },                                                                         \
    .dot_f32 = dot_f32,                                                            \
    .dot_f32_f16 = dot_f32_f16,                                                    \
    .axpy_f32 = axpy_f32,                                                          \
    .axpy_f16 = axpy_f16

static const kp_kernels kernels_avx2 = {
    .name = "avx2",
    AVX2_SHARED_ENTRIES,
    .gemm =
        {
            [KP_DTYPE_F32] = gemm_f32,
            [KP_DTYPE_F16] = gemm_f16,
            [KP_DTYPE_BF16] = gemm_bf16,
            [KP_DTYPE_Q8_0] = gemm_q8_0,
            [KP_DTYPE_Q4_0] = gemm_q4_0,
            [KP_DTYPE_Q4_K] = gemm_q4_K,
            [KP_DTYPE_Q6_K] = gemm_q6_K,
            [KP_DTYPE_Q4_1] = kp_qmore_avx2_gemm_q4_1, /* quant_more_avx2.c */
            [KP_DTYPE_Q5_0] = kp_qmore_avx2_gemm_q5_0,
            [KP_DTYPE_Q5_1] = kp_qmore_avx2_gemm_q5_1,
            [KP_DTYPE_Q5_K] = kp_qmore_avx2_gemm_q5_K,
        },
};

/* The float dot_tile entries below override those of AVX2_SHARED_ENTRIES
 * (a later designator wins, C11 6.7.9), so that dot_tile and gemm of one
 * table compute in the same order. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
static const kp_kernels kernels_avx512vnni = {
    .name = "avx512vnni",
    AVX2_SHARED_ENTRIES,
    .dot_tile[KP_DTYPE_F32] = tile_f32_512,
    .dot_tile[KP_DTYPE_F16] = tile_f16_512,
    .dot_tile[KP_DTYPE_BF16] = tile_bf16_512,
    .gemm =
        {
            [KP_DTYPE_F32] = gemm_f32_512,
            [KP_DTYPE_F16] = gemm_f16_512,
            [KP_DTYPE_BF16] = gemm_bf16_512,
            [KP_DTYPE_Q8_0] = gemm_q8_0_vnni,
            [KP_DTYPE_Q4_0] = gemm_q4_0_vnni,
            [KP_DTYPE_Q4_K] = gemm_q4_K_vnni,
            [KP_DTYPE_Q6_K] = gemm_q6_K_vnni,
            [KP_DTYPE_Q4_1] = kp_qmore_vnni_gemm_q4_1, /* quant_more_avx2.c */
            [KP_DTYPE_Q5_0] = kp_qmore_vnni_gemm_q5_0,
            [KP_DTYPE_Q5_1] = kp_qmore_vnni_gemm_q5_1,
            [KP_DTYPE_Q5_K] = kp_qmore_vnni_gemm_q5_K,
        },
};
#pragma GCC diagnostic pop
#undef AVX2_SHARED_ENTRIES

const kp_kernels *kp_quant_avx512vnni_table(void) { return &kernels_avx512vnni; }

const kp_kernels *kp_quant_avx2_table(void) { return &kernels_avx2; }

AVX2 void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16x8(x + i));
    for (; i < n; i++) y[i] = half_to_float(x[i]);
}

#else /* not x86-64: no AVX2 table */

const kp_kernels *kp_quant_avx2_table(void) { return NULL; }

const kp_kernels *kp_quant_avx512vnni_table(void) { return NULL; }

void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp16_to_fp32(x[i]);
}

#endif
