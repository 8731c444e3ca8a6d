/*
 * quant_avx2_inl.h - private to quant_avx2.c and quant_avx512.c: the
 * AVX2-level code both x86 kernel tables ("avx2" and "avx512vnni") use.
 * Include only on x86-64; nothing else includes this file.
 *
 * What it owns (one copy of each):
 *   - the target macros: AVX2 = avx2,fma,f16c; VNNI adds avx512f, avx512vl,
 *     avx512bw and avx512vnni. Every function here is AVX2_INLINE (always
 *     inlined), so it is compiled with the target of the kernel that uses it;
 *   - small helpers: horizontal sums, FP16 loads, the 8x8 transpose, panel
 *     stores, the prefetch distances;
 *   - the canonical summation order every path follows (below);
 *   - per weight family, what both tables share: decoding a block's quants
 *     (Q8_0/Q4_0: legacy_*, Q4_1/Q5_0/Q5_1: leg_*, Q4_K/Q5_K/Q6_K: kq_*),
 *     staging the activation block terms, repacking weight rows into the
 *     panels of the gemm kernels (panel_pack, leg_pack, kmin_pack for
 *     Q4_K/Q5_K, q6k_pack), the few-row tile of Q4_1/Q5_0/Q5_1 (both tables
 *     use it), and the loops of dot_tile and gemm.
 *
 * The loops (tile_legacy, gemm_panel, gemm_legacy; leg_tile,
 * gemm_leg_panel, leg_gemm; gemm_kq_panel, gemm_kquant) take the table's
 * kernel for one tile as a function argument: an AVX2_INLINE/VNNI_INLINE function (or a
 * static kernel) of the including file, always a constant at the call, so
 * that from -O1 on the call is direct and inlined, as if the loop were
 * written out in each file.
 */
#ifndef KP_QUANT_AVX2_INL_H
#define KP_QUANT_AVX2_INL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_blocks.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define VNNI_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define UNROLL _Pragma("GCC unroll 8")

/* ---- small helpers ------------------------------------------------------- */

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

AVX2_INLINE int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
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

/* Prefill reads each 16-row group of a repacked matrix from DRAM once,
 * where the products wait on it unless its lines were asked for earlier:
 * the float tiles read a group in their first column tile's pass (1B BF16
 * shape, one thread, 256-row matmul calls of 64 activation rows: 92% of
 * the bfloat16 peak with the weights in L3, 73% from DRAM); the integer
 * panels stage a K chunk of it before its products (1B Q4_0 pp512: staging
 * waited on DRAM for 5% of the time). So while part `at` of n_parts of a
 * call's products runs (a float tile, or a slice of activation rows of a
 * chunk), it asks for that share of the lines of the bytes that follow in
 * the stream (from next: the group's next chunk, or the next group, which
 * the thread's next matmul task usually reads: the pool hands out runs of
 * tasks) into L2. BF16 pp512 177 -> 184.5 t/s, Q4_0 263 -> 266. A hint
 * only: nothing is loaded (past a matrix's end it asks for lines no task
 * reads). */
AVX2_INLINE void stream_prefetch(const void *next, size_t bytes, int at, int count, int n_parts) {
    const size_t lines = bytes / 64;
    for (size_t l = lines * (size_t)at / (size_t)n_parts; l < lines * (size_t)(at + count) / (size_t)n_parts; l++)
        _mm_prefetch((const char *)next + 64 * l, _MM_HINT_T1);
}

/* The float tiles' rows for C activation rows (16 x 1, 8 x 2, 4 x C), and
 * how many tiles a call of nr x nc runs in column tiles of up to max_c.
 * float_rows_in_place: on rows in place the avx512 tables take one
 * activation row (decode without repacking) a weight row at a time, in
 * order, with no prefetch: 16 rows side by side are 16 streams a row size
 * apart (4 KiB for 2048 F16 elements, one L1 set), which one thread read
 * from DRAM at 14.5 GB/s, against 26-29 a row at a time (1B shape, F16,
 * Zen 4; prefetching 8 rows ahead: 21-23). Each row's sum is the same
 * either way. */
AVX2_INLINE int float_tile_rows(int c) { return c == 1 ? 16 : c == 2 ? 8 : 4; }
AVX2_INLINE int float_tile_count(int nr, int nc, int max_c) {
    const int rest = nc % max_c;
    int n = nc / max_c * ((nr + float_tile_rows(max_c) - 1) / float_tile_rows(max_c));
    if (rest) n += (nr + float_tile_rows(rest) - 1) / float_tile_rows(rest);
    return n;
}

/* Below this many activation rows a panel pack (gemm with a few decode
 * sequences) prefetches the rows decode_pf bytes ahead, as the tiles do;
 * from it on the panels are compute-bound and PACK_PREFETCH_BLOCKS serves. */
#define PANEL_PF_COLS 16

/* Row pointers of weight rows r0 .. r0+7, rows past nr repeating row nr-1
 * (computed, never stored). */
AVX2_INLINE void rows8(const void *w, size_t w_stride, int r0, int nr, const char *wr[8]) {
    for (int r = 0; r < 8; r++) {
        const int row = r0 + r < nr ? r0 + r : nr - 1;
        wr[r] = (const char *)w + (size_t)row * w_stride;
    }
}

/* ---- the canonical order, shared constants -------------------------------- */

/*
 * gemm and dot_tile results do not depend on the shape of the call: out[c][r]
 * is bit-identical whether row r comes with 1 or 15 other rows and column c
 * with 0 or 500 other columns, in the avx2 and in the avx512vnni table (and
 * for the integer types the two tables agree bit for bit). The forward pass
 * relies on it (a prompt computed as one batch, in chunks or token by
 * token gives the same logits, so cached KV rows equal recomputed ones).
 * Every path therefore computes each output in one canonical order:
 *
 *   Q8_0, Q4_0   per K chunk of PANEL_KC blocks: acc = 0, then for each block
 *                acc = fma(float(S), dw * da, acc), S the exact integer dot
 *                product of the block; out = chunk 0, out += chunk 1, ...
 *   Q4_1, Q5_1   the same, then per block acc = fma(mw, sa, acc) (mw the
 *                weight min, sa the activation's stored block sum)
 *   Q5_0         as Q4_0
 *   Q4_K, Q5_K,  the same per chunk of KQ_KC super-blocks, with the exact
 *   Q6_K         integer sums of a super-block (Q4_K/Q5_K: acc =
 *                fma(float(isum), d * da, acc), then acc = fma(-float(imin),
 *                dmin * da, acc))
 *   F32/F16/BF16 avx2: per chunk of FP_KC elements (padded with zeros to a
 *                multiple of 8): 8 lanes, lane i = fma(w[k], a[k], lane i)
 *                for k = i mod 8 in order, then hsum_ps; avx512vnni the
 *                same on 16 lanes (quant_avx512.c)
 *
 * For the integer types that is what one vector lane does when the lanes
 * are weight rows: the panels below for many activation rows, and the tiles
 * for few activation rows (decode), which fold the partial sums per block so
 * that lanes are rows too. Integer sums are exact however they are formed
 * (sign trick, +128 offset, VNNI), so the integer kernels may differ per
 * table. The float types use plain register tiles in every case.
 */
enum { PACK_AVX2, PACK_VNNI }; /* which integer kernels: avx2 or avx512vnni table */

#define PANEL_KC 64      /* Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 blocks per K chunk: 2048 elements */
#define KQ_KC 6          /* Q4_K/Q5_K/Q6_K super-blocks per K chunk: 1536 elements */
#define PANEL_MIN_COLS 8 /* activation rows from which gemm repacks weights into panels */
#define PANEL_RC 16      /* weight rows repacked per chunk: 2 panels */
_Static_assert(PANEL_RC == 16, "the VNNI tiles take the two panels of a chunk together");
#define PANEL_CC 16      /* activation rows with staged block terms at a time */

/* A dot_tile kernel (quant.h), the few-row path of the K-quant gemms. */
typedef void tile_fn(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                     float *out, size_t out_stride);

/* ---- F32/F16/BF16 rows -------------------------------------------------- */

enum { ELEM_F32, ELEM_F16, ELEM_BF16 };

AVX2_INLINE float load_x1(const void *row, int64_t i, int kind) {
    if (kind == ELEM_F32) return ((const float *)row)[i];
    const uint16_t h = ((const uint16_t *)row)[i];
    if (kind == ELEM_F16) return half_to_float(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- Q8_0 and Q4_0 weights . Q8_0 activations ---------------------------- */

enum { WQ8_0, WQ4_0 };

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

/*
 * The loops of dot_tile, and of gemm with few activation rows, for Q8_0 and
 * Q4_0: K chunks of PANEL_KC blocks; groups of up to 4 activation rows,
 * their aux entries from the caller or computed once per chunk; groups of
 * 8 weight rows (rows past nr repeat the last, computed and not stored).
 * rows() is the table's tile for the weight rows from r0 (wr[0..7],
 * rows_left = nr - r0 of them remain, w_stride apart) x ncc activation rows
 * over blocks [ib0, ib0 + len), written (add = 0) or added (add = 1) to o;
 * it returns the rows it did: 8, or 16 where the table has a wider tile.
 */
typedef int legacy_rows_fn(int64_t ib0, int64_t len, const char *const *wr, size_t w_stride, int rows_left,
                           const char *const *ar, const kp_q8_0_aux *const *ax, int kind, float *o, size_t os,
                           int add, int ncc, size_t pf);

/* The row pointers and aux entries (from block ib0) of activation rows
 * c0 .. c0 + ncc - 1 (ncc <= 4), for the few-row loops. */
AVX2_INLINE void act_group4(const void *a, size_t a_stride, const void *aux, size_t aux_stride, int c0, int ncc,
                            int64_t ib0, int64_t len, const char *ar[4], const kp_q8_0_aux *ax[4],
                            kp_q8_0_aux (*own)[PANEL_KC]) {
    for (int c = 0; c < ncc; c++) {
        ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
        ax[c] = legacy_aux(a, a_stride, aux, aux_stride, c0 + c, ib0, len, own[c]);
    }
}

AVX2_INLINE void tile_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride,
                             const void *a, size_t a_stride, const void *aux, size_t aux_stride,
                             float *out, size_t out_stride, int kind, legacy_rows_fn *rows) {
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
            act_group4(a, a_stride, aux, aux_stride, c0, ncc, ib0, len, ar, ax, own);
            for (int r0 = 0; r0 < nr;) {
                const char *wr[8];
                rows8(w, w_stride, r0, nr, wr);
                float *o = out + (size_t)c0 * out_stride + (size_t)r0;
                r0 += rows(ib0, len, wr, w_stride, nr - r0, ar, ax, kind, o, out_stride, ib0 > 0, ncc, pf);
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

/* The table's products of one K chunk in gemm_panel: the n_panels panels
 * of st (weight rows rc0 .. rc0 + rc - 1) x the ccn activation rows from
 * cc0 (axc[c]: their aux entries from block ib0) over blocks
 * [ib0, ib0 + len), written to out (chunk 0) or added (later chunks). */
typedef void legacy_panels_fn(const panel_stage *st, int rc0, int rc, int n_panels, const void *a,
                              size_t a_stride, const kp_q8_0_aux *const *axc, int cc0, int ccn, int64_t ib0,
                              int64_t len, int kind, float *out, size_t out_stride);

AVX2_INLINE void gemm_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                            size_t a_stride, const void *aux, size_t aux_stride, float *out,
                            size_t out_stride, int kind, int pack, legacy_panels_fn *panels,
                            panel_stage *st) {
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
                rows8(w, w_stride, rc0 + 8 * p, nr, wr);
                panel_pack(wr, ib0, len, kind, pack, st->q[p], st->dw[p], pf);
            }
            for (int cc0 = 0; cc0 < nc; cc0 += PANEL_CC) {
                const int ccn = nc - cc0 < PANEL_CC ? nc - cc0 : PANEL_CC;
                const kp_q8_0_aux *axc[PANEL_CC];
                for (int c = 0; c < ccn; c++)
                    axc[c] = legacy_aux(a, a_stride, aux, aux_stride, cc0 + c, ib0, len, st->ax[c]);
                panels(st, rc0, rc, n_panels, a, a_stride, axc, cc0, ccn, ib0, len, kind, out, out_stride);
            }
        }
    }
}

/* gemm for Q8_0/Q4_0: the panel path for many activation rows, else the
 * few-row loops. */
AVX2_INLINE void gemm_legacy(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, const void *aux, size_t aux_stride, float *out,
                             size_t out_stride, int kind, int pack, legacy_rows_fn *rows,
                             legacy_panels_fn *panels) {
    if (nc >= PANEL_MIN_COLS) {
        panel_stage st __attribute__((aligned(32)));
        gemm_panel(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, pack, panels, &st);
    } else {
        tile_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, rows);
    }
}

/* ---- Q4_1, Q5_0, Q5_1 weights . Q8_1 (Q4_1, Q5_1) or Q8_0 (Q5_0) activations */

/*
 * Decoding. One 32-element block becomes 32 bytes in element order (bytes
 * 0..15 from the low nibbles, 16..31 from the high nibbles), unsigned: q in
 * 0..15 (Q4_1) or 0..31 (Q5_0 and Q5_1, which OR in bit 4 from qh,
 * expanded one bit per byte):
 *
 *   qh (uint32) --broadcast, vpshufb--> byte j holds qh byte j/8
 *               --AND 1 << (j%8), compare--> 0xFF where bit j is set
 *               --AND 0x10--> bit 4 of quant j
 */
enum { WQ4_1, WQ5_0, WQ5_1 };

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

/* Bytes per block; every layout has d at offset 0, Q4_1/Q5_1 m at 2. */
AVX2_INLINE size_t leg_size(int kind) {
    return kind == WQ4_1 ? sizeof(kp_block_q4_1) : kind == WQ5_0 ? sizeof(kp_block_q5_0) : sizeof(kp_block_q5_1);
}

/* The 32 quants of weight block ib, unsigned (0..15 or 0..31), in element order. */
AVX2_INLINE __m256i leg_quants(const char *wrow, int64_t ib, int kind) {
    if (kind == WQ4_1) return unpack_nibbles(((const kp_block_q4_1 *)wrow + ib)->qs);
    if (kind == WQ5_0) {
        const kp_block_q5_0 *x = (const kp_block_q5_0 *)wrow + ib;
        return _mm256_or_si256(unpack_nibbles(x->qs), fifth_bits(x->qh));
    }
    const kp_block_q5_1 *x = (const kp_block_q5_1 *)wrow + ib;
    return _mm256_or_si256(unpack_nibbles(x->qs), fifth_bits(x->qh));
}

/* The 32 quants of activation block ib (Q8_0 for Q5_0, else Q8_1). */
AVX2_INLINE const int8_t *leg_act_quants(const char *arow, int64_t ib, int kind) {
    if (kind == WQ5_0) return ((const kp_block_q8_0 *)arow + ib)->qs;
    return ((const kp_block_q8_1 *)arow + ib)->qs;
}

/* A Q8_1 activation block's d and s as floats (exact). */
typedef struct {
    float d, s;
} q8_1_ds;

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
        kp_q8_0_aux ax[N][PANEL_KC];       \
        q8_1_ds ds[N][PANEL_KC];           \
    }

/* The few-row tile, AVX2 (both tables use it): 8 weight rows x NC
 * activation rows over blocks [ib0, ib0 + len), wr[8] weight rows (R = 4:
 * only rows 0..3 are computed), ar[NC] activation rows, ax[c] (Q5_0) or
 * ds[c] (Q8_1) their block terms from ib0. Each row's block gives a vector
 * of 8 partial sums; vphaddd folds the 8 rows' vectors into one vector of
 * exact sums, one lane per row:
 *
 *   p_r = vpmaddwd(vpmaddubsw(q_r, a_c), 1)              r = 0..7
 *   hadd(hadd(p0, p1), hadd(p2, p3)) = [s0 s1 s2 s3 | s0' s1' s2' s3']
 *   (likewise rows 4..7), then [s0+s0' .. s3+s3' | s4+s4' .. s7+s7'] */
AVX2_INLINE void leg_oct_tile(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                              const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds, int kind, int nr,
                              float *out, size_t os, int add, size_t pf, const int NC, const int R) {
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t blk = leg_size(kind);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        __m256i q[8];
        if (pf) UNROLL for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + (size_t)ib * blk, _MM_HINT_T0);
        UNROLL for (int r = 0; r < R; r++) q[r] = leg_quants(wr[r], ib, kind);
        const __m256 dw8 = half8_at(wr, (size_t)ib * blk);
        const __m256 mw8 = kind == WQ5_0 ? _mm256_setzero_ps() : half8_at(wr, (size_t)ib * blk + 2);
        UNROLL for (int c = 0; c < NC; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)leg_act_quants(ar[c], ib, kind));
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
 * The loops of dot_tile, and of gemm with few activation rows, for Q4_1,
 * Q5_0 and Q5_1: K chunks of PANEL_KC blocks; groups of up to 4 activation
 * rows, their block terms staged once per chunk; groups of 8 weight rows.
 * rows() is the table's tile for the weight rows from r0, as in
 * tile_legacy (legacy_rows_fn), with ax (Q5_0) or ds (Q4_1, Q5_1) the
 * activation rows' block terms; leg_oct_rows is the one both tables have.
 */
typedef int leg_rows_fn(int64_t ib0, int64_t len, const char *const *wr, size_t w_stride, int rows_left,
                        const char *const *ar, const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds, int kind,
                        float *o, size_t os, int add, int ncc, size_t pf);

AVX2_INLINE int leg_oct_rows(int64_t ib0, int64_t len, const char *const *wr, size_t w_stride, int rows_left,
                             const char *const *ar, const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds, int kind,
                             float *o, size_t os, int add, int ncc, size_t pf) {
    (void)w_stride;
    const int nrr = rows_left < 8 ? rows_left : 8;
    switch (ncc + 4 * (nrr > 4)) { /* 4 rows or fewer: compute 4 */
    case 1: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 1, 4); break;
    case 2: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 2, 4); break;
    case 3: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 3, 4); break;
    case 4: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 4, 4); break;
    case 5: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 1, 8); break;
    case 6: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 2, 8); break;
    case 7: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 3, 8); break;
    default: leg_oct_tile(ib0, len, wr, ar, ax, ds, kind, nrr, o, os, add, pf, 4, 8); break;
    }
    return 8;
}

AVX2_INLINE void leg_tile(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                          size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride,
                          int kind, leg_rows_fn *rows) {
    const int64_t nb = n / 32;
    ACT_TERMS(4) own;
    const size_t pf = decode_pf(w_stride, nc, PANEL_MIN_COLS);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int64_t ib0 = 0; ib0 < nb; ib0 += PANEL_KC) {
        const int64_t len = nb - ib0 < PANEL_KC ? nb - ib0 : PANEL_KC;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
            const char *ar[4];
            const kp_q8_0_aux *ax[4] = {NULL, NULL, NULL, NULL};
            const q8_1_ds *ds[4] = {NULL, NULL, NULL, NULL};
            for (int c = 0; c < ncc; c++) {
                ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
                if (kind == WQ5_0) ax[c] = legacy_aux(a, a_stride, aux, aux_stride, c0 + c, ib0, len, own.ax[c]);
                else ds[c] = q8_1_terms(a, a_stride, c0 + c, ib0, len, own.ds[c]);
            }
            for (int r0 = 0; r0 < nr;) {
                const char *wr[8];
                rows8(w, w_stride, r0, nr, wr);
                float *o = out + (size_t)c0 * out_stride + (size_t)r0;
                r0 += rows(ib0, len, wr, w_stride, nr - r0, ar, ax, ds, kind, o, out_stride, ib0 > 0, ncc, pf);
            }
        }
    }
}

/*
 * Many activation rows (gemm in prefill): the call's weight rows are
 * repacked per K chunk, on the stack, into panels of 8 rows whose 32-byte
 * steps hold the same 4 quants of every row, one int32 lane per row; 4
 * activation quants are broadcast to all lanes, so there are no horizontal
 * sums at all:
 *
 *   panel step (b, g), 32 bytes:  row0 q[4g..4g+3] | row1 q[4g..] | ... | row7
 *   steps of one block b:         g = 0..7 (32 quants)
 *
 * Repacking costs about one activation row's products and is reused by all
 * of them, hence the threshold PANEL_MIN_COLS. Activation block terms
 * (Q5_0: aux d and bias, from the caller or computed; Q8_1: d and s as
 * floats) are staged once per call for PANEL_CC activation rows at a time.
 * The VNNI table stores Q5_0 quants as 8q and its scales dw / 8.
 */

/* gemm's staging area for many activation rows: two panels of 8 weight
 * rows over one K chunk, their scales (Q5_0 in the VNNI table: dw / 8) and
 * offsets, and the block terms of PANEL_CC activation rows. */
typedef struct {
    __m256i q[PANEL_RC / 8][PANEL_KC][8]; /* [panel][block][step]: 8 rows x 4 quants */
    float dw[PANEL_RC / 8][PANEL_KC][8];  /* [panel][block][row] */
    float mw[PANEL_RC / 8][PANEL_KC][8];  /* Q4_1/Q5_1 */
    ACT_TERMS(PANEL_CC) act;
} leg_stage;

/* Repacks len blocks (from block ib0) of the 8 rows wr[] into one panel. */
AVX2_INLINE void leg_pack(const char *const *wr, int64_t ib0, int64_t len, int kind, int pack, __m256i (*q)[8],
                          float (*dw)[8], float (*mw)[8], size_t pf) {
    const size_t blk = leg_size(kind);
    const __m256 dscale = _mm256_set1_ps(pack == PACK_VNNI && kind == WQ5_0 ? 0.125f : 1.0f);
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        __m256i v[8];
        UNROLL for (int r = 0; r < 8; r++) {
            if (pf) _mm_prefetch(wr[r] + pf + (size_t)ib * blk, _MM_HINT_T0);
            else pack_prefetch(wr[r], (size_t)ib * blk, blk);
            v[r] = leg_quants(wr[r], ib, kind);
            if (pack == PACK_VNNI && kind == WQ5_0) v[r] = _mm256_slli_epi16(v[r], 3); /* 8q <= 248: no carry */
        }
        _mm256_store_ps(dw[b], _mm256_mul_ps(half8_at(wr, (size_t)ib * blk), dscale));
        if (kind != WQ5_0) _mm256_store_ps(mw[b], half8_at(wr, (size_t)ib * blk + 2));
        __m256i *const dst[8] = {&q[b][0], &q[b][1], &q[b][2], &q[b][3], &q[b][4], &q[b][5], &q[b][6], &q[b][7]};
        transpose8_epi32_store(v, dst);
    }
}

/* The table's products of one K chunk in gemm_leg_panel, as in gemm_panel
 * (legacy_panels_fn), with axc (Q5_0) or dsc (Q4_1, Q5_1) the staged block
 * terms of the ccn activation rows from cc0. */
typedef void leg_panels_fn(const leg_stage *st, int rc0, int rc, int n_panels, const void *a, size_t a_stride,
                           const kp_q8_0_aux *const *axc, const q8_1_ds *const *dsc, int cc0, int ccn, int64_t ib0,
                           int64_t len, int kind, float *out, size_t out_stride);

AVX2_INLINE void gemm_leg_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride,
                                int kind, int pack, leg_panels_fn *panels, leg_stage *st) {
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
                rows8(w, w_stride, rc0 + 8 * p, nr, wr);
                leg_pack(wr, ib0, len, kind, pack, st->q[p], st->dw[p], st->mw[p], pf);
            }
            for (int cc0 = 0; cc0 < nc; cc0 += PANEL_CC) {
                const int ccn = nc - cc0 < PANEL_CC ? nc - cc0 : PANEL_CC;
                const kp_q8_0_aux *axc[PANEL_CC] = {NULL};
                const q8_1_ds *dsc[PANEL_CC] = {NULL};
                for (int c = 0; c < ccn; c++) {
                    if (kind == WQ5_0) axc[c] = legacy_aux(a, a_stride, aux, aux_stride, cc0 + c, ib0, len, st->act.ax[c]);
                    else dsc[c] = q8_1_terms(a, a_stride, cc0 + c, ib0, len, st->act.ds[c]);
                }
                panels(st, rc0, rc, n_panels, a, a_stride, axc, dsc, cc0, ccn, ib0, len, kind, out, out_stride);
            }
        }
    }
}

/* gemm for Q4_1/Q5_0/Q5_1: the panel path for many activation rows, else
 * the few-row loops. */
AVX2_INLINE void leg_gemm(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                          const void *aux, size_t aux_stride, float *out, size_t out_stride, int kind, int pack,
                          leg_rows_fn *rows, leg_panels_fn *panels) {
    if (nc >= PANEL_MIN_COLS) {
        leg_stage st __attribute__((aligned(32)));
        gemm_leg_panel(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, pack, panels, &st);
    } else {
        leg_tile(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, rows);
    }
}

/* ---- Q4_K, Q5_K, Q6_K weights . Q8_K activations ------------------------- */

enum { KQ4, KQ5, KQ6 };

/* The 8 6-bit scales (bytes 0..7) and 8 6-bit mins (bytes 8..15) of the 12
 * packed scale bytes of a Q4_K or Q5_K super-block (quant_blocks.h), in
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

/*
 * Many activation rows: repacked panels. The layout idea of the Q8_0 panels
 * (8 weight rows per vector, one int32 lane per row, 4 quants per lane,
 * activations broadcast), per super-block:
 *
 *   Q4_K  q[j][g]   sub-block j (32 quants), step g: 8 rows x 4 quants 0..15
 *   Q5_K            (0..31)
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
 * 8 steps, at most 8 * 2*15*128 = 30720; Q5_K two stages of 4 steps, each
 * at most 4 * 2*31*128 = 31744; Q6_K 2 steps, 2 * 2*63*128 = 32256), then
 * vpmaddwd with the scale pair both widens and scales. VNNI: vpdpbusd over
 * the sub-block, then vpmulld by the int32 scale. The bsums terms take
 * vpmaddwd (VNNI: vpdpwssd) with a broadcast pair of activation bsums.
 * Totals stay far inside int32 (Q4_K < 2^25, Q5_K < 2^26, Q6_K < 2^29).
 */
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

typedef struct {
    __m256i q[16][4];
    __m256i sc[16], sp[8];
    float d[8];
} q6k_panel;

typedef struct {
    union {
        kmin_panel kmin[PANEL_RC / 8][KQ_KC]; /* Q4_K, Q5_K */
        q6k_panel q6k[PANEL_RC / 8][KQ_KC];
    } p;
} kq_stage;

/* v in both int16 halves of an int32 lane (the AVX2 scale and min pairs). */
AVX2_INLINE uint32_t pair16(int v) { return (uint32_t)(uint16_t)v | (uint32_t)(uint16_t)v << 16; }

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

/* Repacks super-block i of the 8 rows wr[] of a Q4_K (kind KQ4) or Q5_K
 * (KQ5) matrix into one panel; the two layouts differ only in the quants. */
AVX2_INLINE void kmin_pack(const char *const *wr, int64_t i, int kind, int pack, kmin_panel *p) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256i v[8][8]; /* [sub-block][row] */
    uint32_t sc[8][8], mn[8][8];
    for (int r = 0; r < 8; r++) {
        const int k4 = kind == KQ4;
        const char *blk = wr[r] + (size_t)i * (k4 ? sizeof(kp_block_q4_K) : sizeof(kp_block_q5_K));
        const kp_block_q4_K *x4 = (const kp_block_q4_K *)blk; /* read only if k4 */
        const kp_block_q5_K *x5 = (const kp_block_q5_K *)blk; /* read only if !k4 */
        uint8_t sm[16];
        _mm_storeu_si128((__m128i *)sm, kq_scales_mins(k4 ? x4->scales : x5->scales));
        for (int j = 0; j < 8; j++) {
            sc[j][r] = pack == PACK_VNNI ? sm[j] : pair16(sm[j]);
            mn[j][r] = pair16(sm[8 + j]);
        }
        p->d[r] = half_to_float(k4 ? x4->d : x5->d);
        p->dmin[r] = half_to_float(k4 ? x4->dmin : x5->dmin);
        if (k4) {
            for (int c = 0; c < 4; c++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(x4->qs + 32 * c));
                v[2 * c][r] = _mm256_and_si256(b, m4);
                v[2 * c + 1][r] = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            }
        } else {
            const __m256i hb = _mm256_loadu_si256((const __m256i *)x5->qh);
            for (int c = 0; c < 4; c++) q5k_quants(x5, hb, c, &v[2 * c][r], &v[2 * c + 1][r]);
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

/* The table's products of the n_panels (1 or 2) panels of a chunk in st
 * (kmin for Q4_K/Q5_K, q6k for Q6_K; len super-blocks from i0), rc rows in
 * all (panel p holds rows 8p..8p+7), x the nc activation rows at a
 * (a_stride bytes apart), written to out (chunk 0) or added; the table
 * picks the order (panels outer or columns outer). */
typedef void kq_panels_fn(const kq_stage *st, int n_panels, int rc, const void *a, size_t a_stride, int nc,
                          int64_t i0, int64_t len, int kind, float *out, size_t os, int add);

AVX2_INLINE void gemm_kq_panel(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                               size_t a_stride, float *out, size_t out_stride, int kind, int pack,
                               kq_panels_fn *tile, kq_stage *st) {
    const int64_t nb = n / KP_QK_K;
    const size_t pf = decode_pf(w_stride, nc, PANEL_PF_COLS);
    const size_t bsz = kind == KQ4 ? sizeof(kp_block_q4_K) : kind == KQ5 ? sizeof(kp_block_q5_K) : sizeof(kp_block_q6_K);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    for (int rc0 = 0; rc0 < nr; rc0 += PANEL_RC) {
        const int rc = nr - rc0 < PANEL_RC ? nr - rc0 : PANEL_RC;
        const int n_panels = (rc + 7) / 8;
        for (int64_t i0 = 0; i0 < nb; i0 += KQ_KC) {
            const int64_t len = nb - i0 < KQ_KC ? nb - i0 : KQ_KC;
            for (int p = 0; p < n_panels; p++) {
                const char *wr[8];
                rows8(w, w_stride, rc0 + 8 * p, nr, wr);
                for (int64_t b = 0; b < len; b++) {
                    if (pf) /* few activation rows: stream the rows ahead, as the tiles do */
                        for (int r = 0; r < 8; r++)
                            for (size_t off = 0; off < bsz; off += 64)
                                _mm_prefetch(wr[r] + pf + (size_t)(i0 + b) * bsz + off, _MM_HINT_T0);
                    if (kind == KQ6) q6k_pack(wr, i0 + b, pack, &st->p.q6k[p][b]);
                    else kmin_pack(wr, i0 + b, kind, pack, &st->p.kmin[p][b]);
                }
            }
            tile(st, n_panels, rc, a, a_stride, nc, i0, len, kind, out + (size_t)rc0, out_stride, i0 > 0);
        }
    }
}

/* gemm for Q4_K/Q5_K/Q6_K: panels for many activation rows, else the
 * table's dot_tile (decode). */
AVX2_INLINE void gemm_kquant(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, float *out, size_t out_stride, int kind, int pack, tile_fn *few,
                             kq_panels_fn *tile) {
    if (nc < PANEL_MIN_COLS) {
        few(n, nr, nc, w, w_stride, a, a_stride, out, out_stride);
        return;
    }
    kq_stage st __attribute__((aligned(32)));
    gemm_kq_panel(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind, pack, tile, &st);
}

/* ---- MXFP4 weights . Q8_0 activations ------------------------------------ */

/*
 * A block is decoded once per weight row and chunk of up to 4 activation
 * rows: the 16 code bytes split into nibbles, each nibble looked up in the
 * doubled E2M1 values (kp_mxfp4_values, |v| <= 12) with one vpshufb, the
 * 32 int8 values in element order. Each activation block gives the block's
 * dot product as an exact integer (pairs: the AVX2 table's vpmaddubsw +
 * vpmaddwd with the sign trick, |w| <= 12 so no int16 saturates; the
 * avx512vnni table's vpdpbusd: the same integers; the 8 lanes are then
 * summed for 4 rows at once, mxfp4_hsum4), and every output is
 *
 *   acc = fma(float(isum_b), 2^(e_b - 128) x d_a,b, acc)   block by block
 *   out = acc
 *
 * one float chain per output, the same steps in every table (the scalar
 * table's fmaf, the avx512vnni table's 16-row repacked layout, whose lanes
 * are rows) and for every call shape, so they all agree bit for bit.
 */
AVX2_INLINE __m256i mxfp4_block_values(const kp_block_mxfp4 *x) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)kp_mxfp4_values);
    const __m128i q = _mm_loadu_si128((const __m128i *)x->qs), m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m));
    return _mm256_set_m128i(hi, lo);
}

AVX2_INLINE __m256i mxfp4_pairs_avx2(__m256i w, __m256i a) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

VNNI_INLINE __m256i mxfp4_pairs_vnni(__m256i w, __m256i a) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

/* Lane i = the sum of the 8 lanes of v_i (exact: integers). */
AVX2_INLINE __m128i mxfp4_hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* 2^(e_i - 128) of the rows' block scales (lanes past rn: 0). */
AVX2_INLINE __m128 mxfp4_scales4(const kp_block_mxfp4 *const *x, int64_t ib, int rn) {
    float s[4] = {0, 0, 0, 0};
    for (int r = 0; r < rn; r++) s[r] = kp_e8m0_half(x[r][ib].e);
    return _mm_loadu_ps(s);
}

/* out[c * out_stride + r] for r < nr, c < nc (any nr, nc >= 1): weight row r
 * of w (MXFP4, n elements) . activation row c of a (Q8_0), the lanes of
 * each block by pairs (mxfp4_pairs_avx2 or mxfp4_pairs_vnni). Rows go in
 * groups of 4 (a __m128 of outputs per activation row: each block's 4
 * integer sums meet their 4 scales in one fma, lane for lane the chain
 * above), activation rows in chunks of 4, each activation block loaded
 * once per group. */
#define MXFP4_TILE_BODY(pairs)                                                                                   \
    const int64_t nb = n / KP_QK_MXFP4;                                                                        \
    for (int r0 = 0; r0 < nr; r0 += 4) {                                                                       \
        const int rn = nr - r0 < 4 ? nr - r0 : 4;                                                              \
        const kp_block_mxfp4 *x[4];                                                                            \
        for (int r = 0; r < 4; r++)                                                                            \
            x[r] = (const kp_block_mxfp4 *)((const uint8_t *)w + (size_t)(r0 + (r < rn ? r : 0)) * w_stride);  \
        for (int c0 = 0; c0 < nc; c0 += 4) {                                                                   \
            const int cn = nc - c0 < 4 ? nc - c0 : 4;                                                          \
            const kp_block_q8_0 *y[4];                                                                         \
            __m128 acc[4];                                                                                     \
            for (int c = 0; c < 4; c++) {                                                                      \
                y[c] = (const kp_block_q8_0 *)((const uint8_t *)a + (size_t)(c0 + (c < cn ? c : 0)) * a_stride); \
                acc[c] = _mm_setzero_ps();                                                                     \
            }                                                                                                  \
            for (int64_t ib = 0; ib < nb; ib++) {                                                              \
                __m256i wv[4];                                                                                 \
                for (int r = 0; r < 4; r++) wv[r] = r < rn ? mxfp4_block_values(x[r] + ib) : _mm256_setzero_si256(); \
                const __m128 dw = mxfp4_scales4(x, ib, rn);                                                    \
                for (int c = 0; c < cn; c++) {                                                                 \
                    const __m256i av = _mm256_loadu_si256((const __m256i *)y[c][ib].qs);                       \
                    const __m128i is = mxfp4_hsum4(pairs(wv[0], av), pairs(wv[1], av), pairs(wv[2], av),       \
                                                   pairs(wv[3], av));                                          \
                    acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(is), _mm_mul_ps(dw, _mm_set1_ps(half_to_float(y[c][ib].d))), \
                                          acc[c]);                                                             \
                }                                                                                              \
            }                                                                                                  \
            for (int c = 0; c < cn; c++) {                                                                     \
                float o[4];                                                                                    \
                _mm_storeu_ps(o, acc[c]);                                                                      \
                for (int r = 0; r < rn; r++) out[(size_t)(c0 + c) * out_stride + r0 + r] = o[r];               \
            }                                                                                                  \
        }                                                                                                      \
    }

#endif
