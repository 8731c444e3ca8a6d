/*
 * quant_avx512.c - the "avx512vnni" kernel table (quant.h): the avx2 table
 * (quant_avx2.c) with every gemm, and the F32/F16/BF16 dot_tile, replaced
 * by kernels that use AVX-512: vpdpbusd (AVX512-VNNI with AVX512-VL) on
 * 256-bit vectors, and 512-bit vectors where they pay, for the integer
 * types; 512-bit FMA for the float types. Every type with kernels: F32,
 * F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4 (whose
 * gemm on rows in place is the avx2 tile of quant_avx2_inl.h with vpdpbusd
 * for the pairs).
 *
 * Compiled without -march flags: every function here carries
 * __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,
 * avx512vnni"))) (VNNI, VNNI_INLINE of quant_avx2_inl.h), and dispatch.c
 * hands the table out only when the CPU has all of them. Outside x86-64
 * the file is empty. quantize_act, vec_dot, the integer dot_tile and the
 * attention helpers are the avx2 table's (quant_avx2.h); the gemm loops,
 * the weight decoding and the panel packs are quant_avx2_inl.h's, given
 * the VNNI tiles below. The few-row paths of the K-quant gemms are the
 * avx2 dot_tile kernels.
 *
 * vpdpbusd adds 4 products of unsigned and signed bytes into an int32 lane
 * in one instruction, without vpmaddubsw's int16 saturation, so Q8_0
 * weights can be stored with a +128 offset (u = w + 128) and corrected
 * once per block by the activation's aux bias (-128 sum(a)); Q4_0 stores
 * 16q (16q - 128 = 16(q - 8)) with its scale / 16, Q5_0 stores 8q with its
 * scale / 8 (powers of two scale exactly: the same float products). The
 * integer sums are exact however they are formed, and every path follows
 * the canonical order of quant_avx2_inl.h, so the integer types give the
 * avx2 table's results bit for bit. The float types have their own
 * canonical order on 16 lanes (below), the same for dot_tile and gemm.
 *
 * Decode with one activation row takes 16 weight rows at once (two to a
 * 512-bit vector; hex_tile_vnni for Q8_0, leg_hex_tile_vnni), so that the
 * fold to one sum per row, the conversion and the scaling run once per 16
 * rows; Q4_0 keeps the 8-row tile, which is faster for it. F16, BF16,
 * Q8_0, Q4_0, Q4_K, Q5_K, Q6_K and MXFP4 also have a repacked layout (pack,
 * gemm_packed: 16 rows as one stream in the order a tile reads it; for the
 * integer types one int32 lane per row) that the forward pass copies them
 * into at load; the tiles on rows in place serve callers without the copy.
 *
 * Stack use: as the avx2 table (quant_avx2.c); 16 KiB for float types.
 */
#include "kernels/quant_avx2.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/quant_avx2_inl.h"
#include "kernels/tables.h"

/* ------------------------------------------------------------------------ */
/* F32, F16 and BF16 on 512-bit vectors                                      */
/* ------------------------------------------------------------------------ */

/*
 * The avx512vnni table's F32/F16/BF16 kernels, on rows in place (dot_tile,
 * gemm) and repacked (gemm_packed, below): register tiles of R weight rows
 * x C activation rows on 512-bit vectors (16 lanes) that run over the whole
 * row, converting both operands as they load them (vcvtph2ps for F16, a
 * shift for BF16): 4 x 6 (24 accumulators, 10 loads per 24 multiply-adds)
 * for many activation rows, 16 x 1, 8 x 2 and 4 x 3..5 for fewer. Canonical
 * order, the same for every call shape: lane i sums the products of the
 * elements k = i mod 16 in order over the whole row (the last 16 padded with
 * zeros), then one fixed horizontal sum. (Summing a row in chunks, with a
 * horizontal sum per chunk, cost F16 prefill a fifth of its time in
 * shuffles.)
 */
#define F5_NC 6 /* activation rows of the widest tile */
#define X16_ROWS 16 /* rows of a repacked group (every packed layout of this table) */
#define FX16_STEP (X16_ROWS * 32) /* bytes of 16 elements of a repacked 16-row group */
#define UNROLL16 _Pragma("GCC unroll 16") /* R up to 16: fully, so acc stays in registers */

VNNI_INLINE __m512 load_x16(const void *row, int64_t i, int kind) {
    if (kind == ELEM_F32) return _mm512_loadu_ps((const float *)row + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (kind == ELEM_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The elements i.. of a row where mask m has bits (zeros elsewhere). */
VNNI_INLINE __m512 load_x16_mask(const void *row, int64_t i, __mmask16 m, int kind) {
    if (kind == ELEM_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    if (kind == ELEM_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

VNNI_INLINE float hsum512(__m512 v) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum_ps(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* Weight rows wr[0..R) x activation rows ar[0..C) of n elements: step j
 * (elements 16j..16j+15) of row r at wr[r] + j*adv (in place 16 elements
 * on, repacked one group step on), of row c at ar[c] + 16j elements. The
 * last partial step (rows in place only) loads under a mask. nr of the R
 * rows are stored; pf > 0 (decode on rows in place): each weight row asks
 * for the line pf bytes ahead once a line. */
VNNI_INLINE void float_tile512(const char *const *wr, size_t adv, const char *const *ar, int kind, int64_t n,
                               int nr, float *out, size_t os, size_t pf, const int R, const int C) {
    const size_t es = kind == ELEM_F32 ? 4 : 2;
    __m512 acc[16][F5_NC];
    UNROLL16 for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    const int64_t nf = n & ~(int64_t)15;
    size_t off = 0;
    for (int64_t k = 0; k < nf; k += 16, off += adv) {
        if (pf && (size_t)k * es % 64 < 16 * es) /* once per cache line */
            UNROLL16 for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + off, _MM_HINT_T0);
        __m512 av[F5_NC];
        UNROLL for (int c = 0; c < C; c++) av[c] = load_x16(ar[c], k, kind);
        UNROLL16 for (int r = 0; r < R; r++) {
            const __m512 wv = load_x16(wr[r] + off, 0, kind);
            UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(wv, av[c], acc[r][c]);
        }
    }
    if (nf < n) { /* rows in place: the last n - nf elements */
        const __mmask16 m = (__mmask16)((1u << (n - nf)) - 1);
        UNROLL16 for (int r = 0; r < R; r++) {
            const __m512 wv = load_x16_mask(wr[r] + off, 0, m, kind);
            UNROLL for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_fmadd_ps(wv, load_x16_mask(ar[c], nf, m, kind), acc[r][c]);
        }
    }
    UNROLL for (int c = 0; c < C; c++)
        UNROLL16 for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            out[(size_t)c * os + (size_t)r] = hsum512(acc[r][c]);
        }
}

/* nr weight rows x nc activation rows: rows in place (group 0: row r at w +
 * r*w_stride) or repacked (group > 0: the bytes of a 16-row group; row r at
 * w + (r/16)*group + 32*(r%16)). Columns in tiles of 6, the rest in one
 * narrower tile; each column tile runs over every row tile, so its
 * activations stay in L1 while the weight rows stream past. */
VNNI_INLINE void float_gemm512(int64_t n, int nr, int nc, const void *w, size_t w_stride, size_t group,
                               const void *a, size_t a_stride, float *out, size_t out_stride, int kind) {
    const size_t es = kind == ELEM_F32 ? 4 : 2;
    const size_t adv = group ? FX16_STEP : 16 * es;
    const size_t pf = group ? 0 : decode_pf(w_stride, nc, 5);
    if (n <= 0) {
        zero_out(nr, nc, out, out_stride);
        return;
    }
    const int n_tiles = float_tile_count(nr, nc, F5_NC);
    const size_t ahead = group && nc >= F5_NC ? (size_t)((nr + X16_ROWS - 1) / X16_ROWS) * group : 0;
    int tile = 0;
    for (int c0 = 0; c0 < nc;) {
        const int C = nc - c0 >= F5_NC ? F5_NC : nc - c0;
        const int R = float_tile_rows(C);
        const char *ar[F5_NC];
        for (int c = 0; c < F5_NC; c++) ar[c] = (const char *)a + (size_t)(c0 + (c < C ? c : C - 1)) * a_stride;
        for (int r0 = 0; r0 < nr; r0 += R) {
            const int nrr = nr - r0 < R ? nr - r0 : R;
            const char *wr[16];
            for (int r = 0; r < R; r++) {
                const int row = r0 + (r < nrr ? r : nrr - 1);
                wr[r] = group ? (const char *)w + (size_t)(row / X16_ROWS) * group + 32 * (size_t)(row % X16_ROWS)
                              : (const char *)w + (size_t)row * w_stride;
            }
            float *o = out + (size_t)c0 * out_stride + (size_t)r0;
            stream_prefetch((const char *)w + ahead, ahead, tile++, 1, n_tiles); /* the next task's groups */
            switch (C) {
            case 1: float_tile512(wr, adv, ar, kind, n, nrr, o, out_stride, pf, 16, 1); break;
            case 2: float_tile512(wr, adv, ar, kind, n, nrr, o, out_stride, pf, 8, 2); break;
            case 3: float_tile512(wr, adv, ar, kind, n, nrr, o, out_stride, pf, 4, 3); break;
            case 4: float_tile512(wr, adv, ar, kind, n, nrr, o, out_stride, pf, 4, 4); break;
            case 5: float_tile512(wr, adv, ar, kind, n, nrr, o, out_stride, pf, 4, 5); break;
            default: float_tile512(wr, adv, ar, kind, n, nrr, o, out_stride, pf, 4, 6); break;
            }
        }
        c0 += C;
    }
}

/* Rows in place times one activation row (decode on weights not
 * repacked): a row at a time (float_rows_in_place, quant_avx2_inl.h). */
static VNNI void float_rows1_512(int64_t n, int nr, const void *w, size_t w_stride, const void *a, float *out,
                                 int kind) {
    const char *ar[F5_NC] = {(const char *)a};
    const size_t adv = 16 * (kind == ELEM_F32 ? 4 : 2);
    for (int r = 0; r < nr; r++) {
        const char *w1 = (const char *)w + (size_t)r * w_stride;
        float_tile512(&w1, adv, ar, kind, n, 1, out + r, 1, 0, 1, 1);
    }
}

#define FLOAT_TILE512(name, gname, kind)                                                        \
    static VNNI void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,           \
                          const void *a, size_t a_stride, float *out, size_t out_stride) {     \
        if (nc == 1) float_rows1_512(n, nr, w, w_stride, a, out, kind);                        \
        else float_gemm512(n, nr, nc, w, w_stride, 0, a, a_stride, out, out_stride, kind);     \
    }                                                                                           \
    static VNNI void gname(int64_t n, int nr, int nc, const void *w, size_t w_stride,          \
                           const void *a, size_t a_stride, const void *aux, size_t aux_stride,  \
                           float *out, size_t out_stride) {                                    \
        (void)aux;                                                                              \
        (void)aux_stride;                                                                       \
        if (nc == 1) float_rows1_512(n, nr, w, w_stride, a, out, kind);                        \
        else float_gemm512(n, nr, nc, w, w_stride, 0, a, a_stride, out, out_stride, kind);     \
    }
FLOAT_TILE512(tile_f32_512, gemm_f32_512, ELEM_F32)
FLOAT_TILE512(tile_f16_512, gemm_f16_512, ELEM_F16)
FLOAT_TILE512(tile_bf16_512, gemm_bf16_512, ELEM_BF16)
#undef FLOAT_TILE512

/* ------------------------------------------------------------------------ */
/* Q8_0 and Q4_0 weights . Q8_0 activations                                  */
/* ------------------------------------------------------------------------ */

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

#define Q4_DOT_VNNI(lo, hi, alo, ahi) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, alo), hi, ahi)

/* q4_tile (quant_avx2.c) with vpdpbusd: the same exact sums. */
VNNI_INLINE void q4_tile_vnni_nc(int64_t ib0, int64_t len, const char *const *wr, const char *const *ar,
                                 const kp_q8_0_aux *const *ax, int nr, float *out, size_t os, int add, size_t pf,
                                 const int NC) {
    Q4_TILE_BODY(Q4_DOT_VNNI)
}
#undef Q4_DOT_VNNI
#undef Q4_TILE_BODY

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

/* The avx512vnni table's tile of tile_legacy (legacy_rows_fn): with one
 * activation row and Q8_0, 16 weight rows at once while 16 remain; else
 * Q4_0 row pairs when more than 4 rows remain, else oct_tile_vnni. */
VNNI_INLINE int legacy_rows_vnni(int64_t ib0, int64_t len, const char *const *wr, size_t w_stride, int rows_left,
                                 const char *const *ar, const kp_q8_0_aux *const *ax, int kind, float *o, size_t os,
                                 int add, int ncc, size_t pf) {
    const int nrr = rows_left < 8 ? rows_left : 8;
    if (ncc == 1 && rows_left >= 16 && kind == WQ8_0) {
        /* decode_pf's distance is whole 8-row tiles; the hex tile reads 16
         * rows, so half of an 8-row lead lands on rows this tile loads
         * itself: lead by whole 16-row tiles (1B shape, 2 threads, tg32,
         * medians of 5 interleaved runs: 17.1 -> 20.0 tok/s). Q4_0 decode
         * takes the 8-row q4_tile_vnni: a 16-row tile for it (16 unaligned
         * 16-byte loads and inserts and a gather of the scales per block)
         * ran at 23.7 tok/s against 28.4 (Zen 4) */
        const size_t pf16 = pf ? ((pf / w_stride + 15) & ~(size_t)15) * w_stride : 0;
        hex_tile_vnni(ib0, len, wr[0], w_stride, ar[0], ax[0], kind, o, add, pf16);
        return 16;
    }
    if (kind == WQ4_0 && nrr > 4) q4_tile_vnni(ib0, len, wr, ar, ax, nrr, o, os, add, ncc, pf);
    else oct_tile_vnni(ib0, len, wr, ar, ax, kind, nrr, o, os, add, ncc, pf);
    return 8;
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

/* The avx512vnni table's products of a K chunk in gemm_panel
 * (legacy_panels_fn): both panels of the chunk at once, 4 activation rows
 * at a time. */
VNNI_INLINE void legacy_panels_vnni(const panel_stage *st, int rc0, int rc, int n_panels, const void *a,
                                    size_t a_stride, const kp_q8_0_aux *const *axc, int cc0, int ccn, int64_t ib0,
                                    int64_t len, int kind, float *out, size_t out_stride) {
    (void)kind;
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
}

#define LEGACY_GEMM(name, kind)                                                                                  \
    static VNNI void name(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,              \
                          size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) { \
        gemm_legacy(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, PACK_VNNI,     \
                    legacy_rows_vnni, legacy_panels_vnni);                                                       \
    }
LEGACY_GEMM(gemm_q8_0, WQ8_0)
LEGACY_GEMM(gemm_q4_0, WQ4_0)
#undef LEGACY_GEMM

/* ---- Q8_0 and Q4_0 repacked for decode (quant.h pack, gemm_packed) -------- */

/*
 * Rows in place make a decode tile read 8 or 16 short rows side by side
 * (18 or 34 bytes per row and block) and fold each row's partial sums
 * across lanes. The repacked layout stores 16 rows as one stream in the
 * order the tile consumes it, with one int32 lane per row, as the prefill
 * panels do, but keeping Q4_0's nibbles packed (the same bytes as in
 * place). A group of 16 rows, nb blocks per row, in the order a tile reads
 * it (one forward stream), blocks in pairs (x16_q_at, x16_sc_at):
 *
 *   scales  2 x 32 bytes: blocks b's and b + 1's 16 FP16 row scales, row
 *           order
 *   quants  block b, then b + 1, QB bytes each: 64-byte steps j, each =
 *           row 0 qs[4j..4j+3] | row 1 qs[4j..4j+3] | ... | row 15
 *           Q8_0: 8 steps (QB = 512), stored + 128 (unsigned, as the VNNI
 *           tiles use them); Q4_0: 4 steps (QB = 256) of nibble pairs, low
 *           nibbles = quants 4j..4j+3, high = 16+4j..16+4j+3
 *
 * and an odd last block as its 32 bytes of scales and its quants. 16 x
 * row_size bytes per group, the in-place size; every pair starts 64-byte
 * aligned (2 x (QB + 32) is a multiple of 64). A block then costs
 * 4 (Q4_0) or 8 (Q8_0) 512-bit loads and vpdpbusd against the activation's
 * 4-quant words broadcast, one conversion and one FMA for 16 rows: no
 * horizontal sums. Padding rows (past nr) have zero quants and scales.
 * The integer sums are exact, and the float steps per row are those of the
 * in-place path of the same call shape (the few-row tiles: acc = fma(S,
 * d * da, acc); the panels for many activation rows: the VNNI pack's 16q
 * and d / 16), so gemm_packed equals gemm bit for bit.
 */
/* Up to this many activation rows (batched decode) the packed gemms take
 * the decode tiles, 8 rows a pass (Q4_K/Q5_K/Q6_K: 4) over a group held in
 * L1/L2; past it the prefill panels, which cost a pack per K chunk and win
 * only over many rows (1B Q4_0, 16 sequences: 128-138 tok/s on the panels,
 * 159-164 on the tiles; Q4_K 107-119 -> 132-162) */
#define X16_TILE_COLS 16
/* With X16_PF_MIN or more activation rows a tile prefetches X16_PF bytes
 * ahead in its stream: the hardware prefetcher alone keeps one row's
 * stream at the read bandwidth, but with 8 rows a block the compute
 * between loads left the DRAM latency exposed (1B Q4_0, 8 sequences:
 * 100-112 -> 136-151 tok/s, Q8_0 62-67 -> 84-86); with 4 or fewer it
 * did not help (Q8_0 x4: 66 -> 55) */
#define X16_PF 2048
/* The decode tiles of the types whose unpacking leaves few cache lines in
 * flight (Q5_K, MXFP4: many instructions per line, so the out-of-order
 * window holds only ~2 KB of loads) prefetch their stream this far ahead
 * into L2, on 1 or 2 activation rows. One thread, rows from DRAM in huge
 * pages: Q5_K 16.8 -> 40.5 GB/s, MXFP4 15 -> 31.7 (2 KB: 18; into L1: 18).
 * Q4_K and Q6_K, whose tiles keep more lines in flight, lost 5-20% with
 * it and go without. */
#define X16_FAR_PF 32768
#define X16_PF_MIN 5

static inline size_t x16_qbytes(int kind) { return kind == WQ8_0 ? 512 : 256; }

/* Offsets in a group of nb blocks of block b's quants and of its scales. */
static inline size_t x16_q_at(int64_t nb, int64_t b, size_t qb) {
    return (size_t)(b & ~(int64_t)1) * (qb + 32) + ((b | 1) < nb ? 64 : 32) + (size_t)(b & 1) * qb;
}
static inline size_t x16_sc_at(int64_t b, size_t qb) {
    return (size_t)(b & ~(int64_t)1) * (qb + 32) + 32 * (size_t)(b & 1);
}

static void pack_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst, int kind) {
    const int64_t nb = n / 32;
    const size_t blk = kind == WQ8_0 ? sizeof(kp_block_q8_0) : sizeof(kp_block_q4_0);
    const size_t qb = x16_qbytes(kind), steps = qb / 64;
    const size_t qs_at = kind == WQ8_0 ? offsetof(kp_block_q8_0, qs) : offsetof(kp_block_q4_0, qs);
    const uint32_t flip = kind == WQ8_0 ? 0x80808080u : 0; /* Q8_0: + 128 per byte */
    const size_t group = (size_t)nb * (qb + 32);
    for (int64_t g0 = 0; g0 < nr; g0 += X16_ROWS) {
        uint8_t *gd = (uint8_t *)dst + (size_t)(g0 / X16_ROWS) * group;
        for (int r = 0; r < X16_ROWS; r++) {
            const char *row = g0 + r < nr ? (const char *)w + (size_t)(g0 + r) * w_stride : NULL;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *qd = gd + x16_q_at(nb, b, qb) + 4 * (size_t)r;
                uint16_t d = 0;
                uint32_t v = flip; /* padding rows: quants 0, scale 0 */
                const char *x = row ? row + (size_t)b * blk : NULL;
                if (x) memcpy(&d, x, sizeof d); /* both block types start with the FP16 d */
                memcpy(gd + x16_sc_at(b, qb) + 2 * (size_t)r, &d, sizeof d);
                for (size_t j = 0; j < steps; j++) {
                    if (x) {
                        memcpy(&v, x + qs_at + 4 * j, sizeof v);
                        v ^= flip;
                    }
                    memcpy(qd + 64 * j, &v, sizeof v);
                }
            }
        }
    }
}

static void pack_q8_0_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    pack_x16(n, nr, w, w_stride, dst, WQ8_0);
}
static void pack_q4_0_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    pack_x16(n, nr, w, w_stride, dst, WQ4_0);
}

/* vpdpbusd acc, u, [p]{1to16}: the activation's 4-quant word at p
 * broadcast by the load itself. GCC keeps _mm512_set1_epi32 of a loaded
 * word as a vpbroadcastd of its own (a 512-bit load: Zen 4 issues one a
 * cycle), and the 64 a block of an 8-row tile takes left it bound by the
 * loads (1B Q4_0 rows in L2, one thread, 8 rows: 164 -> 176 GMAC/s; one
 * row 99 -> 110). The same instruction and sums as the intrinsic. */
typedef int32_t kp_i32_alias __attribute__((may_alias, aligned(1)));
VNNI_INLINE __m512i dpbusd_bcast(__m512i acc, __m512i u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const kp_i32_alias *)p));
    return acc;
}

/* The same on 256-bit vectors: vpdpbusd acc, u, [p]{1to8}. */
VNNI_INLINE __m256i dpbusd256_bcast(__m256i acc, __m256i u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const kp_i32_alias *)p));
    return acc;
}

/* The first nr of a 16-row tile's row sums acc[c] to out + c * os (add:
 * added to what is there), c < NC. */
VNNI_INLINE void x16_store(const __m512 *acc, float *out, size_t os, int nr, int add, const int NC) {
    const __mmask16 keep = (__mmask16)(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
    UNROLL for (int c = 0; c < NC; c++) {
        float *o = out + (size_t)c * os;
        const __m512 v = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(keep, o), acc[c]) : acc[c];
        _mm512_mask_storeu_ps(o, keep, v);
    }
}

/* Block b's unsigned quant steps (the +128 of Q8_0 already stored, Q4_0 as
 * 0..15): u[j] meets activation quants 4j..4j+3. */
VNNI_INLINE void x16_quants(const uint8_t *qb, int kind, __m512i u[8]) {
    if (kind == WQ8_0) {
        UNROLL for (int j = 0; j < 8; j++) u[j] = _mm512_loadu_si512((const void *)(qb + 64 * j));
        return;
    }
    const __m512i m = _mm512_set1_epi8(0xF);
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * j));
        u[j] = _mm512_and_si512(v, m);
        u[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
    }
}

/* 16 rows x NC (<= 8) activation rows over blocks [ib0, ib0 + len) of the
 * group at g (nb blocks per row); nr rows stored to out (add: added). The
 * NC sums of a block advance together, step j of every row before step
 * j + 1, so NC independent vpdpbusd chains are in flight (row after row:
 * 1B Q4_0 4 rows in L2, 4.9 -> 4.3 ns per 16 rows x 32 quants). */
VNNI_INLINE void x16_tile_nc(const uint8_t *g, int64_t nb, int64_t ib0, int64_t len, int kind,
                             const char *const *ar, const kp_q8_0_aux *const *ax, int nr, float *out, size_t os,
                             int add, const int NC) {
    const size_t qb = x16_qbytes(kind);
    __m512 acc[8];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        __m512i u[8];
        if (X16_PF && NC >= X16_PF_MIN) {
            const uint8_t *p = g + x16_sc_at(ib0 + b, qb) + X16_PF;
            for (size_t o = 0; o < qb + 32; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
        }
        x16_quants(g + x16_q_at(nb, ib0 + b, qb), kind, u);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + x16_sc_at(ib0 + b, qb))));
        const int8_t *aq[8];
        __m512i s[8];
        UNROLL for (int c = 0; c < NC; c++) {
            aq[c] = ((const kp_block_q8_0 *)ar[c] + ib0 + b)->qs;
            s[c] = _mm512_set1_epi32(kind == WQ8_0 ? ax[c][b].bias : ax[c][b].bias / 16);
        }
        UNROLL for (int j = 0; j < 8; j++)
            UNROLL for (int c = 0; c < NC; c++)
                s[c] = dpbusd_bcast(s[c], u[j], aq[c] + 4 * j);
        UNROLL for (int c = 0; c < NC; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[c]), _mm512_mul_ps(dw, _mm512_set1_ps(ax[c][b].d)), acc[c]);
    }
    x16_store(acc, out, os, nr, add, NC);
}

static VNNI void x16_tile(const uint8_t *g, int64_t nb, int64_t ib0, int64_t len, int kind, const char *const *ar,
                          const kp_q8_0_aux *const *ax, int nr, float *out, size_t os, int add, int nc) {
    switch (nc) {
    case 1: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 1); break;
    case 2: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 2); break;
    case 3: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 3); break;
    case 4: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 4); break;
    case 5: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 5); break;
    case 6: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 6); break;
    case 7: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 7); break;
    default: x16_tile_nc(g, nb, ib0, len, kind, ar, ax, nr, out, os, add, 8); break;
    }
}

/* The prefill panels of blocks [ib0, ib0 + len) of a group, in the VNNI
 * pack's form (panel_pack): 8 rows a panel, Q8_0 as stored, Q4_0 as 16q
 * with d / 16. */
VNNI_INLINE void x16_panels(const uint8_t *g, int64_t nb, int64_t ib0, int64_t len, int kind, int n_panels,
                            panel_stage *st) {
    const size_t qb = x16_qbytes(kind);
    const __m256 dscale = _mm256_set1_ps(kind == WQ4_0 ? 1.0f / 16 : 1.0f);
    const __m256i lo = _mm256_set1_epi8(0x0F), hi = _mm256_set1_epi8((char)0xF0);
    for (int64_t b = 0; b < len; b++) {
        const uint8_t *qs = g + x16_q_at(nb, ib0 + b, qb);
        const uint16_t *sc = (const uint16_t *)(g + x16_sc_at(ib0 + b, qb));
        for (int p = 0; p < n_panels; p++) {
            __m256i *dst = st->q[p][b];
            if (kind == WQ8_0) {
                UNROLL for (int j = 0; j < 8; j++) dst[j] = _mm256_loadu_si256((const __m256i *)(qs + 64 * j + 32 * p));
            } else {
                UNROLL for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * j + 32 * p));
                    dst[j] = _mm256_slli_epi16(_mm256_and_si256(v, lo), 4);
                    dst[j + 4] = _mm256_and_si256(v, hi);
                }
            }
            const __m128i h = _mm_loadu_si128((const __m128i *)(sc + 8 * p));
            _mm256_storeu_ps(st->dw[p][b], _mm256_mul_ps(_mm256_cvtph_ps(h), dscale));
        }
    }
}

VNNI_INLINE void gemm_x16(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,
                          const void *aux, size_t aux_stride, float *out, size_t out_stride, int kind) {
    const int64_t nb = n / 32;
    const size_t group = (size_t)nb * (x16_qbytes(kind) + 32);
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    if (nc > X16_TILE_COLS) {
        panel_stage st __attribute__((aligned(32)));
        for (int rc0 = 0; rc0 < nr; rc0 += X16_ROWS) {
            const uint8_t *g = (const uint8_t *)wp + (size_t)(rc0 / X16_ROWS) * group;
            const int rc = nr - rc0 < X16_ROWS ? nr - rc0 : X16_ROWS;
            const int n_panels = (rc + 7) / 8;
            for (int64_t ib0 = 0; ib0 < nb; ib0 += PANEL_KC) {
                const int64_t len = nb - ib0 < PANEL_KC ? nb - ib0 : PANEL_KC;
                x16_panels(g, nb, ib0, len, kind, n_panels, &st);
                const size_t cb = (size_t)len * (x16_qbytes(kind) + 32); /* the chunk's bytes */
                for (int cc0 = 0; cc0 < nc; cc0 += PANEL_CC) {
                    const int ccn = nc - cc0 < PANEL_CC ? nc - cc0 : PANEL_CC;
                    stream_prefetch(g + x16_sc_at(ib0, x16_qbytes(kind)) + cb, cb, cc0, ccn, nc);
                    const kp_q8_0_aux *axc[PANEL_CC];
                    for (int c = 0; c < ccn; c++)
                        axc[c] = legacy_aux(a, a_stride, aux, aux_stride, cc0 + c, ib0, len, st.ax[c]);
                    legacy_panels_vnni(&st, rc0, rc, n_panels, a, a_stride, axc, cc0, ccn, ib0, len, kind, out,
                                       out_stride);
                }
            }
        }
        return;
    }
    kp_q8_0_aux own[8][PANEL_KC];
    for (int64_t ib0 = 0; ib0 < nb; ib0 += PANEL_KC) {
        const int64_t len = nb - ib0 < PANEL_KC ? nb - ib0 : PANEL_KC;
        for (int c0 = 0; c0 < nc; c0 += 8) {
            const int ncc = nc - c0 < 8 ? nc - c0 : 8;
            const char *ar[8];
            const kp_q8_0_aux *ax[8];
            act_group4(a, a_stride, aux, aux_stride, c0, ncc < 4 ? ncc : 4, ib0, len, ar, ax, own);
            if (ncc > 4) act_group4(a, a_stride, aux, aux_stride, c0 + 4, ncc - 4, ib0, len, ar + 4, ax + 4, own + 4);
            for (int r0 = 0; r0 < nr; r0 += X16_ROWS) {
                const uint8_t *g = (const uint8_t *)wp + (size_t)(r0 / X16_ROWS) * group;
                x16_tile(g, nb, ib0, len, kind, ar, ax, nr - r0, out + (size_t)c0 * out_stride + (size_t)r0,
                         out_stride, ib0 > 0, ncc);
            }
        }
    }
}

static VNNI void gemm_packed_q8_0(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,
                                  const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    gemm_x16(n, nr, nc, wp, a, a_stride, aux, aux_stride, out, out_stride, WQ8_0);
}
static VNNI void gemm_packed_q4_0(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,
                                  const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    gemm_x16(n, nr, nc, wp, a, a_stride, aux, aux_stride, out, out_stride, WQ4_0);
}

/* ------------------------------------------------------------------------ */
/* Q4_1, Q5_0, Q5_1 weights . Q8_1 or Q8_0 activations                       */
/* ------------------------------------------------------------------------ */

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
 * leg_oct_tile, so the same results.
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
    const size_t blk = leg_size(kind);
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
        const int8_t *aq = leg_act_quants(ar, ib, kind);
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
/* The avx512vnni table's tile of leg_tile (leg_rows_fn): with one
 * activation row, 16 weight rows at once while 16 remain, else the AVX2
 * tile both tables have. */
VNNI_INLINE int leg_rows_vnni(int64_t ib0, int64_t len, const char *const *wr, size_t w_stride, int rows_left,
                              const char *const *ar, const kp_q8_0_aux *const *ax, const q8_1_ds *const *ds, int kind,
                              float *o, size_t os, int add, int ncc, size_t pf) {
    if (ncc == 1 && rows_left >= 16) {
        leg_hex_tile_vnni(ib0, len, wr[0], w_stride, ar[0], ax[0], ds[0], kind, o, add, pf);
        return 16;
    }
    return leg_oct_rows(ib0, len, wr, w_stride, rows_left, ar, ax, ds, kind, o, os, add, ncc, pf);
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
            aq[c] = leg_act_quants(ar[c], ib0 + b, kind);
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

/* The avx512vnni table's products of a K chunk in gemm_leg_panel
 * (leg_panels_fn): both panels of the chunk at once, 4 activation rows at
 * a time. */
VNNI_INLINE void leg_panels_vnni(const leg_stage *st, int rc0, int rc, int n_panels, const void *a, size_t a_stride,
                                 const kp_q8_0_aux *const *axc, const q8_1_ds *const *dsc, int cc0, int ccn,
                                 int64_t ib0, int64_t len, int kind, float *out, size_t out_stride) {
    const __m256i(*q[2])[8] = {(const __m256i(*)[8])st->q[0], (const __m256i(*)[8])st->q[1]};
    const float(*dw[2])[8] = {(const float(*)[8])st->dw[0], (const float(*)[8])st->dw[1]};
    const float(*mw[2])[8] = {(const float(*)[8])st->mw[0], (const float(*)[8])st->mw[1]};
    const int npr[2] = {rc < 8 ? rc : 8, rc - 8};
    for (int c0 = 0; c0 < ccn; c0 += 4) {
        const int ncc = ccn - c0 < 4 ? ccn - c0 : 4;
        const char *ar[4];
        for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(cc0 + c0 + c) * a_stride;
        float *o = out + (size_t)(cc0 + c0) * out_stride + (size_t)rc0;
        leg_panel_tile_vnni(q, dw, mw, ar, axc + c0, dsc + c0, ib0, len, npr, o, out_stride, ib0 > 0, ncc, n_panels,
                            kind);
    }
}

#define LEG_GEMM(name, kind)                                                                                     \
    static VNNI void name(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,              \
                          size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) { \
        leg_gemm(n, nr, nc, w, w_stride, a, a_stride, aux, aux_stride, out, out_stride, kind, PACK_VNNI,        \
                 leg_rows_vnni, leg_panels_vnni);                                                                \
    }
LEG_GEMM(gemm_q4_1, WQ4_1)
LEG_GEMM(gemm_q5_0, WQ5_0)
LEG_GEMM(gemm_q5_1, WQ5_1)
#undef LEG_GEMM

/* ------------------------------------------------------------------------ */
/* Q4_K, Q5_K and Q6_K weights . Q8_K activations                            */
/* ------------------------------------------------------------------------ */

/* isum[q][c] = the NP panels' (rows 8q..8q+7) sums over super-block i of
 * activation row c, each sub-block's sum times its scale: J sub-blocks of G
 * 32-byte steps (4 quants of each row), q[q][j*G + g] and sc[q][j] the
 * panel's quants and int32 scales (vpdpbusd, vpmulld). With two panels each
 * activation broadcast feeds both (6 loads per 8 vpdpbusd instead of 10:
 * one panel at a time the loads bounded the tile). */
VNNI_INLINE void kq_scaled_sums(const __m256i *const *q, const __m256i *const *sc, const char *const *ar, int64_t i,
                                __m256i (*isum)[4], const int J, const int G, const int NP, const int NC) {
    __m256i s[2][4];
    UNROLL for (int k = 0; k < NP; k++) UNROLL for (int c = 0; c < NC; c++) isum[k][c] = _mm256_setzero_si256();
    for (int j = 0; j < J; j++) {
        UNROLL for (int k = 0; k < NP; k++) UNROLL for (int c = 0; c < NC; c++) s[k][c] = _mm256_setzero_si256();
        UNROLL for (int g = 0; g < G; g++) {
            __m256i w[2];
            UNROLL for (int k = 0; k < NP; k++) w[k] = _mm256_load_si256(&q[k][j * G + g]);
            UNROLL for (int c = 0; c < NC; c++) {
                const int8_t *y = ((const kp_block_q8_K *)ar[c] + i)->qs + 4 * (G * j + g);
                if (NP == 1) {
                    s[0][c] = dpbusd256_bcast(s[0][c], w[0], y);
                } else {
                    const __m256i bc = _mm256_set1_epi32(load_i32(y));
                    UNROLL for (int k = 0; k < NP; k++) s[k][c] = _mm256_dpbusd_epi32(s[k][c], w[k], bc);
                }
            }
        }
        UNROLL for (int k = 0; k < NP; k++) {
            const __m256i scj = _mm256_load_si256(&sc[k][j]);
            UNROLL for (int c = 0; c < NC; c++) isum[k][c] = _mm256_add_epi32(isum[k][c], _mm256_mullo_epi32(s[k][c], scj));
        }
    }
}

/* acc[q][c] += the NP kmin_panels p[q] x NC activation rows (super-block
 * i): the scaled sums, the mins against the activation bsums by vpdpwssd. */
VNNI_INLINE void kmin_step_vnni(const kmin_panel *const *p, const char *const *ar, int64_t i, __m256 (*acc)[4],
                                const int NP, const int NC) {
    const __m256i *q[2] = {&p[0]->q[0][0], &p[NP - 1]->q[0][0]}, *sc[2] = {p[0]->sc, p[NP - 1]->sc};
    __m256i isum[2][4];
    kq_scaled_sums(q, sc, ar, i, isum, 8, 8, NP, NC);
    UNROLL for (int c = 0; c < NC; c++) {
        const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
        __m256i im[2];
        UNROLL for (int k = 0; k < NP; k++) im[k] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 8; j++) {
            const __m256i bs = _mm256_set1_epi32(load_i32(&y->bsums[2 * j]));
            UNROLL for (int k = 0; k < NP; k++) im[k] = _mm256_dpwssd_epi32(im[k], _mm256_load_si256(&p[k]->mn[j]), bs);
        }
        const __m256 da = _mm256_set1_ps(y->d);
        UNROLL for (int k = 0; k < NP; k++) {
            const __m256 d8 = _mm256_load_ps(p[k]->d), m8 = _mm256_load_ps(p[k]->dmin);
            acc[k][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k][c]), _mm256_mul_ps(d8, da), acc[k][c]);
            acc[k][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im[k]), _mm256_mul_ps(m8, da), acc[k][c]);
        }
    }
}

/* The same for NP q6k_panels: 16 sub-blocks of 16, the -32 offset of the
 * quants taken off through the bsums. */
VNNI_INLINE void q6k_step_vnni(const q6k_panel *const *p, const char *const *ar, int64_t i, __m256 (*acc)[4],
                               const int NP, const int NC) {
    const __m256i *q[2] = {&p[0]->q[0][0], &p[NP - 1]->q[0][0]}, *sc[2] = {p[0]->sc, p[NP - 1]->sc};
    __m256i isum[2][4];
    kq_scaled_sums(q, sc, ar, i, isum, 16, 4, NP, NC);
    UNROLL for (int c = 0; c < NC; c++) {
        const kp_block_q8_K *y = (const kp_block_q8_K *)ar[c] + i;
        __m256i corr[2];
        UNROLL for (int k = 0; k < NP; k++) corr[k] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 8; j++) {
            const __m256i bs = _mm256_set1_epi32(load_i32(&y->bsums[2 * j]));
            UNROLL for (int k = 0; k < NP; k++) corr[k] = _mm256_dpwssd_epi32(corr[k], _mm256_load_si256(&p[k]->sp[j]), bs);
        }
        const __m256 da = _mm256_set1_ps(y->d);
        UNROLL for (int k = 0; k < NP; k++) {
            const __m256i t = _mm256_sub_epi32(isum[k][c], _mm256_slli_epi32(corr[k], 5));
            acc[k][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(_mm256_load_ps(p[k]->d), da), acc[k][c]);
        }
    }
}

/* The panel tiles of gemm_kq_panel (kq_panels_fn) with vpdpbusd for the
 * sub-block sums and vpmulld for the scales: both panels of a chunk
 * together (NP 2) when it has two. */
VNNI_INLINE void kq_tile_vnni_nc(const kq_stage *st, int rc, const char *const *ar, int64_t i0, int64_t len,
                                 int kind, float *out, size_t os, int add, const int NP, const int NC) {
    __m256 acc[2][4];
    UNROLL for (int q = 0; q < NP; q++) UNROLL for (int c = 0; c < NC; c++) acc[q][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        if (kind != KQ6) {
            const kmin_panel *p[2] = {&st->p.kmin[0][b], &st->p.kmin[NP - 1][b]};
            kmin_step_vnni(p, ar, i0 + b, acc, NP, NC);
        } else {
            const q6k_panel *p[2] = {&st->p.q6k[0][b], &st->p.q6k[NP - 1][b]};
            q6k_step_vnni(p, ar, i0 + b, acc, NP, NC);
        }
    }
    UNROLL for (int q = 0; q < NP; q++) {
        const int npr = rc - 8 * q < 8 ? rc - 8 * q : 8;
        UNROLL for (int c = 0; c < NC; c++) panel_store(acc[q][c], out + (size_t)c * os + 8 * (size_t)q, npr, add);
    }
}

static VNNI void kq_tile_vnni_cols(const kq_stage *st, int n_panels, int rc, const char *const *ar, int64_t i0,
                                   int64_t len, int kind, float *out, size_t os, int add, int nc) {
    if (n_panels == 2) {
        switch (nc) {
        case 1: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 2, 1); break;
        case 2: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 2, 2); break;
        case 3: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 2, 3); break;
        default: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 2, 4); break;
        }
        return;
    }
    switch (nc) {
    case 1: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 1, 1); break;
    case 2: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 1, 2); break;
    case 3: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 1, 3); break;
    default: kq_tile_vnni_nc(st, rc, ar, i0, len, kind, out, os, add, 1, 4); break;
    }
}

/* The VNNI panel tiles of gemm_kq_panel (kq_panels_fn): the activation
 * rows 4 by 4, each against both panels at once. */
static VNNI void kq_tile_vnni(const kq_stage *st, int n_panels, int rc, const void *a, size_t a_stride, int nc,
                              int64_t i0, int64_t len, int kind, float *out, size_t os, int add) {
    for (int c0 = 0; c0 < nc; c0 += 4) {
        const int ncc = nc - c0 < 4 ? nc - c0 : 4;
        const char *ar[4];
        for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
        kq_tile_vnni_cols(st, n_panels, rc, ar, i0, len, kind, out + (size_t)c0 * os, os, add, ncc);
    }
}

#define KQUANT_GEMM(name, tile, kind)                                                                            \
    static VNNI void name(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,              \
                          size_t a_stride, const void *aux, size_t aux_stride, float *out, size_t out_stride) { \
        (void)aux;                                                                                               \
        (void)aux_stride;                                                                                        \
        gemm_kquant(n, nr, nc, w, w_stride, a, a_stride, out, out_stride, kind, PACK_VNNI, tile, kq_tile_vnni);  \
    }
KQUANT_GEMM(gemm_q4_K, kp_avx2_dot_tile_q4_K, KQ4)
KQUANT_GEMM(gemm_q5_K, kp_avx2_dot_tile_q5_K, KQ5)
KQUANT_GEMM(gemm_q6_K, kp_avx2_dot_tile_q6_K, KQ6)
#undef KQUANT_GEMM

/* ---- Q4_K repacked for decode (quant.h pack, gemm_packed) ----------------- */

/*
 * The idea of the Q8_0/Q4_0 groups above for Q4_K, laid out super-block by
 * super-block in the order a tile reads them, so that a group is one
 * forward stream. A group of 16 rows, nb super-blocks per row; super-block
 * b takes 16 x 144 bytes (the in-place size) at b x K16_SB:
 *
 *   scales   3 x 64 bytes: the packed scale word k (scales[4k..4k+3]) of
 *            rows 0..15
 *   quants   32 64-byte steps s = 8c + g (c 0..3, g 0..7), each = row 0
 *            qs[4s..4s+3] | row 1 qs[4s..4s+3] | ... | row 15: the bytes
 *            in place, low nibbles = quants 64c+4g.. (sub-block 2c, its
 *            quants 4g..4g+3), high nibbles = quants 64c+32+4g..
 *            (sub-block 2c+1)
 *   d, dmin  16 FP16 row values each (32 + 32 bytes)
 *
 * A decode tile unpacks the 6-bit scales and mins of the 16 rows in a few
 * vector operations (kq_scales_mins, lane for lane), sums each sub-block
 * exactly with vpdpbusd (one int32 lane per row, no horizontal sums),
 * scales it with vpmulld and takes the mins term with vpdpwssd against the
 * activation's bsums summed per sub-block. Then the float steps of the
 * canonical order: per K chunk of KQ_KC super-blocks acc = fma(isum, d *
 * da, acc), acc = fma(-imin, dmin * da, acc), lane for lane what the tiles
 * on rows in place and the panels do; past X16_TILE_COLS activation rows
 * the group gives the prefill panels (kmin_panel) with no transpose. So
 * gemm_packed equals gemm bit for bit.
 */
#define K16_SB (X16_ROWS * sizeof(kp_block_q4_K)) /* bytes of one super-block of a group */
#define K16_SC 0                                  /* offset of the scale words */
#define K16_Q (3 * 64)                            /* offset of the quant steps */
#define K16_D (K16_Q + 2048)                      /* offset of the 16 d, then the 16 dmin */
_Static_assert(K16_D + 2 * 32 == X16_ROWS * sizeof(kp_block_q4_K), "a Q4_K group keeps the in-place size");

/* ---- Q5_K repacked for decode (quant.h pack, gemm_packed) ----------------- */

/*
 * Q5_K the way of Q4_K: the same scale words, quant steps, d and dmin, and
 * the rows' qh bytes as 8 steps of their own, read with the first chunk's
 * quant steps and so stored before them (one forward stream). A group of
 * 16 rows, nb super-blocks per row; super-block b takes 16 x 176 bytes (the
 * in-place size) at b x K5_SB:
 *
 *   scales   3 x 64 bytes, as Q4_K
 *   qh       8 64-byte steps g (0..7), each = row 0 qh[4g..4g+3] | row 1
 *            qh[4g..4g+3] | ... | row 15: bit 2c of qh[l] is the 5th bit
 *            of quant 64c + l (sub-block 2c), bit 2c + 1 that of quant
 *            64c + 32 + l (sub-block 2c + 1)
 *   quants   32 64-byte steps s = 8c + g, as Q4_K: the low 4 bits
 *   d, dmin  16 FP16 row values each (32 + 32 bytes)
 *
 * The tile's step s = 8c + g rebuilds the quants 0..31 of sub-blocks 2c and
 * 2c + 1 from quant step s and qh step g (each nibble or'ed with its qh bit
 * moved to bit 4: a shift, an and and an or per vector) and goes on as the
 * Q4_K tile (k16_tile_nc with kind KQ5): vpdpbusd per sub-block, vpmulld
 * by the scales, vpdpwssd of the mins against the bsums, and the float
 * steps of the canonical order of Q4_K and Q5_K, lane for lane what the
 * tiles on rows in place and the panels do. Past X16_TILE_COLS activation
 * rows the group gives the kmin_panel that kmin_pack makes of the rows in
 * place. So gemm_packed equals gemm bit for bit here too.
 */
#define K5_SB (X16_ROWS * sizeof(kp_block_q5_K)) /* bytes of one super-block of a group */
#define K5_QH (3 * 64)                           /* offset of the qh steps (the scale words at K16_SC) */
#define K5_Q (K5_QH + 512)                       /* offset of the quant steps */
#define K5_D (K5_Q + 2048)                       /* offset of the 16 d, then the 16 dmin */
_Static_assert(K5_D + 2 * 32 == X16_ROWS * sizeof(kp_block_q5_K), "a Q5_K group keeps the in-place size");
_Static_assert(K5_SB % 64 == 0 && K5_Q % 64 == 0, "Q5_K steps stay 64-byte aligned");

/* The 6-bit scales and mins of the rows of 4 words u0..u2 (lanes of 32
 * bits, one per row): sc[0] bytes = scales 0..3, sc[1] = 4..7, mn[0] =
 * mins 0..3, mn[1] = 4..7 (the mapping of kq_scales_mins). */
#define K16_UNPACK(T, and, or, srli, set1, u0, u1, u2, sc, mn)                                           \
    do {                                                                                                 \
        const T m3f_ = set1(0x3f3f3f3f), m0f_ = set1(0x0f0f0f0f), m30_ = set1(0x30303030);               \
        (sc)[0] = and(u0, m3f_);                                                                         \
        (sc)[1] = or(and(u2, m0f_), and(srli(u0, 2), m30_));                                             \
        (mn)[0] = and(u1, m3f_);                                                                         \
        (mn)[1] = or(and(srli(u2, 4), m0f_), and(srli(u1, 2), m30_));                                    \
    } while (0)

/* Byte k (0..3) of every 32-bit lane of v, zero-extended. */
VNNI_INLINE __m512i k16_byte(__m512i v, int k) {
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * k), _mm512_set1_epi32(0xFF));
}

/* Bit k (0..7) of every byte of h at bit 4, the other bits 0 (16-bit
 * shifts: the bits that cross from the neighbouring byte are masked off). */
VNNI_INLINE __m512i k5_bit4(__m512i h, int k) {
    const __m512i v = k <= 4 ? _mm512_slli_epi16(h, 4 - k) : _mm512_srli_epi16(h, k - 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

/* Where a Q4_K (kind KQ4) or Q5_K (KQ5) group keeps its super-blocks, the
 * quant steps and the d values of one. */
static inline size_t k16_sb_bytes(int kind) { return kind == KQ4 ? K16_SB : K5_SB; }
static inline size_t k16_q_at(int kind) { return kind == KQ4 ? K16_Q : K5_Q; }
static inline size_t k16_d_at(int kind) { return kind == KQ4 ? K16_D : K5_D; }

/* Rows in place (kp_block_q4_K or kp_block_q5_K: d, dmin, scales[12], then
 * Q5_K's qh[32], then qs[128]) into the groups of kind's layout. Padding
 * rows: quants, scales, d and dmin 0. */
static void pack_k16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst, int kind) {
    const int64_t nb = n / KP_QK_K;
    const size_t bsz = kind == KQ4 ? sizeof(kp_block_q4_K) : sizeof(kp_block_q5_K);
    const size_t sbytes = k16_sb_bytes(kind), q_at = k16_q_at(kind), d_at = k16_d_at(kind);
    const size_t qs_in = kind == KQ4 ? offsetof(kp_block_q4_K, qs) : offsetof(kp_block_q5_K, qs);
    const size_t sc_in = offsetof(kp_block_q4_K, scales);
    _Static_assert(offsetof(kp_block_q4_K, scales) == offsetof(kp_block_q5_K, scales) &&
                       offsetof(kp_block_q4_K, dmin) == offsetof(kp_block_q5_K, dmin),
                   "Q4_K and Q5_K share d, dmin and the scale bytes");
    for (int64_t g0 = 0; g0 < nr; g0 += X16_ROWS) {
        uint8_t *gd = (uint8_t *)dst + (size_t)(g0 / X16_ROWS) * (size_t)nb * sbytes;
        for (int r = 0; r < X16_ROWS; r++) {
            const char *row = g0 + r < nr ? (const char *)w + (size_t)(g0 + r) * w_stride : NULL;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *sb = gd + (size_t)b * sbytes, x[sizeof(kp_block_q5_K)];
                if (row) memcpy(x, row + (size_t)b * bsz, bsz);
                else memset(x, 0, bsz);
                for (int k = 0; k < 3; k++) memcpy(sb + K16_SC + 64 * k + 4 * r, x + sc_in + 4 * k, 4);
                if (kind == KQ5)
                    for (int gi = 0; gi < 8; gi++)
                        memcpy(sb + K5_QH + 64 * gi + 4 * r, x + offsetof(kp_block_q5_K, qh) + 4 * gi, 4);
                for (int st = 0; st < 32; st++) memcpy(sb + q_at + 64 * st + 4 * r, x + qs_in + 4 * st, 4);
                memcpy(sb + d_at + 2 * r, x + offsetof(kp_block_q4_K, d), 2);
                memcpy(sb + d_at + 32 + 2 * r, x + offsetof(kp_block_q4_K, dmin), 2);
            }
        }
    }
}

static void pack_q4_K_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    pack_k16(n, nr, w, w_stride, dst, KQ4);
}
static void pack_q5_K_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    pack_k16(n, nr, w, w_stride, dst, KQ5);
}

/* 16 rows x NC activation rows over super-blocks [i0, i0 + len) of the
 * Q4_K (kind KQ4) or Q5_K (KQ5) group at g; nr rows stored to out (add:
 * added). */
VNNI_INLINE void k16_tile_nc(const uint8_t *g, int64_t i0, int64_t len, const char *const *ar, int nr, float *out,
                             size_t os, int add, const int kind, const int NC) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const size_t sbytes = k16_sb_bytes(kind), q_at = k16_q_at(kind), d_at = k16_d_at(kind);
    /* per 32-bit lane: bytes 0 and 1 (2 and 3) as an int16 pair */
    const __m512i pair_lo = _mm512_set4_epi32((int)0x800D800C, (int)0x80098008, (int)0x80058004, (int)0x80018000);
    const __m512i pair_hi = _mm512_set4_epi32((int)0x800F800E, (int)0x800B800A, (int)0x80078006, (int)0x80038002);
    __m512 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        const uint8_t *sb = g + (size_t)i * sbytes;
        if (kind == KQ5 && NC <= 2)
            for (size_t o = 0; o < sbytes; o += 64) _mm_prefetch((const char *)sb + X16_FAR_PF + o, _MM_HINT_T1);
        const kp_block_q8_K *y[4];
        UNROLL for (int c = 0; c < NC; c++) y[c] = (const kp_block_q8_K *)ar[c] + i;
        __m512i sc[2], mn[2];
        {
            const __m512i u0 = _mm512_loadu_si512((const void *)(sb + K16_SC));
            const __m512i u1 = _mm512_loadu_si512((const void *)(sb + K16_SC + 64));
            const __m512i u2 = _mm512_loadu_si512((const void *)(sb + K16_SC + 128));
            K16_UNPACK(__m512i, _mm512_and_si512, _mm512_or_si512, _mm512_srli_epi32, _mm512_set1_epi32, u0, u1,
                       u2, sc, mn);
        }
        __m512i isum[4];
        UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
        UNROLL for (int q = 0; q < 4; q++) { /* sub-blocks 2q (low nibbles) and 2q + 1 (high) */
            __m512i slo[4], shi[4];
            UNROLL for (int c = 0; c < NC; c++) slo[c] = shi[c] = _mm512_setzero_si512();
            UNROLL for (int s = 0; s < 8; s++) {
                const __m512i v = _mm512_loadu_si512((const void *)(sb + q_at + 64 * (8 * q + s)));
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (kind == KQ5) { /* the 5th bits: qh step s, bits 2q and 2q + 1 */
                    const __m512i h = _mm512_loadu_si512((const void *)(sb + K5_QH + 64 * s));
                    lo = _mm512_or_si512(lo, k5_bit4(h, 2 * q));
                    hi = _mm512_or_si512(hi, k5_bit4(h, 2 * q + 1));
                }
                UNROLL for (int c = 0; c < NC; c++) {
                    slo[c] = dpbusd_bcast(slo[c], lo, y[c]->qs + 64 * q + 4 * s);
                    shi[c] = dpbusd_bcast(shi[c], hi, y[c]->qs + 64 * q + 32 + 4 * s);
                }
            }
            const __m512i s_lo = k16_byte(sc[q / 2], 2 * (q % 2)), s_hi = k16_byte(sc[q / 2], 2 * (q % 2) + 1);
            UNROLL for (int c = 0; c < NC; c++)
                isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(slo[c], s_lo),
                                                                     _mm512_mullo_epi32(shi[c], s_hi)));
        }
        /* mins: int16 pairs (m_2p, m_2p+1) per row against (bsum_2p, bsum_2p+1) */
        const __m512i mp[4] = {_mm512_shuffle_epi8(mn[0], pair_lo), _mm512_shuffle_epi8(mn[0], pair_hi),
                               _mm512_shuffle_epi8(mn[1], pair_lo), _mm512_shuffle_epi8(mn[1], pair_hi)};
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + d_at)));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + d_at + 32)));
        UNROLL for (int c = 0; c < NC; c++) {
            const int16_t *bs = y[c]->bsums;
            __m512i im = _mm512_setzero_si512();
            UNROLL for (int p = 0; p < 4; p++) {
                const uint32_t lo = (uint16_t)(bs[4 * p] + bs[4 * p + 1]), hi = (uint16_t)(bs[4 * p + 2] + bs[4 * p + 3]);
                im = _mm512_dpwssd_epi32(im, mp[p], _mm512_set1_epi32((int)(lo | hi << 16)));
            }
            const __m512 da = _mm512_set1_ps(y[c]->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, da), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dm, da), acc[c]);
        }
    }
    x16_store(acc, out, os, nr, add, NC);
}

#define K16_NC(kind, NC) k16_tile_nc(g, i0, len, ar, nr, out, os, add, kind, NC)
static VNNI void k16_tile(const uint8_t *g, int64_t i0, int64_t len, const char *const *ar, int nr, float *out,
                          size_t os, int add, int nc) {
    switch (nc) {
    case 1: K16_NC(KQ4, 1); break;
    case 2: K16_NC(KQ4, 2); break;
    case 3: K16_NC(KQ4, 3); break;
    default: K16_NC(KQ4, 4); break;
    }
}

static VNNI void k5_tile(const uint8_t *g, int64_t i0, int64_t len, const char *const *ar, int nr, float *out,
                         size_t os, int add, int nc) {
    switch (nc) {
    case 1: K16_NC(KQ5, 1); break;
    case 2: K16_NC(KQ5, 2); break;
    case 3: K16_NC(KQ5, 3); break;
    default: K16_NC(KQ5, 4); break;
    }
}
#undef K16_NC

/* The prefill panel p (rows 8p..8p+7) of super-block sb of a Q4_K (kind
 * KQ4) or Q5_K (KQ5) group: what kmin_pack makes of the rows in place, for
 * PACK_VNNI. */
VNNI_INLINE void k16_panel(const uint8_t *sb, int p, int kind, kmin_panel *P) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const size_t q_at = k16_q_at(kind), d_at = k16_d_at(kind);
    UNROLL for (int q = 0; q < 4; q++)
        UNROLL for (int s = 0; s < 8; s++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(sb + q_at + 64 * (8 * q + s) + 32 * p));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (kind == KQ5) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)(sb + K5_QH + 64 * s + 32 * p));
                lo = _mm256_or_si256(lo, bit_to_4(h, 2 * q));
                hi = _mm256_or_si256(hi, bit_to_4(h, 2 * q + 1));
            }
            _mm256_store_si256(&P->q[2 * q][s], lo);
            _mm256_store_si256(&P->q[2 * q + 1][s], hi);
        }
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)(sb + K16_SC + 32 * p));
    const __m256i u1 = _mm256_loadu_si256((const __m256i *)(sb + K16_SC + 64 + 32 * p));
    const __m256i u2 = _mm256_loadu_si256((const __m256i *)(sb + K16_SC + 128 + 32 * p));
    __m256i sc[2], mn[2];
    K16_UNPACK(__m256i, _mm256_and_si256, _mm256_or_si256, _mm256_srli_epi32, _mm256_set1_epi32, u0, u1, u2, sc, mn);
    const __m256i ff = _mm256_set1_epi32(0xFF);
    UNROLL for (int j = 0; j < 8; j++) {
        const __m256i s = _mm256_and_si256(_mm256_srli_epi32(sc[j / 4], 8 * (j % 4)), ff);
        const __m256i m = _mm256_and_si256(_mm256_srli_epi32(mn[j / 4], 8 * (j % 4)), ff);
        _mm256_store_si256(&P->sc[j], s);                                    /* VNNI: int32 */
        _mm256_store_si256(&P->mn[j], _mm256_or_si256(m, _mm256_slli_epi32(m, 16))); /* (m, m) */
    }
    _mm256_store_ps(P->d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + d_at + 16 * p))));
    _mm256_store_ps(P->dmin, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + d_at + 32 + 16 * p))));
}


/* ---- Q6_K repacked for decode (quant.h pack, gemm_packed) ----------------- */

/*
 * Q6_K the same way (it is the output projection and half the ffn_down and
 * attn_v matrices of a Q4_K_M file). A 16-row group holds nb super-blocks
 * of Q6_SB bytes, then the rows' d of each super-block (16 FP16 values, 32
 * bytes per super-block): 16 x 210 bytes per super-block, the bytes in
 * place regrouped in the order a tile reads them (one forward stream; the
 * d values apart keep every super-block 64-byte aligned):
 *
 *   scales  4 x 64 bytes: scales[4w..4w+3] of rows 0..15 (signed)
 *   steps   16 of 192 bytes, u = 8h + g (h 0..1, g 0..7), each three 64-byte
 *           parts of row 0 | row 1 | ... | row 15 words:
 *           qh[4u..4u+3]: bit pairs 0-1, 2-3, 4-5, 6-7 are bits 4-5 of
 *             quants 128h + 32k + 4g.. (k 0..3)
 *           ql[64h + 4g..]: low nibbles quants 128h + 4g.. (k 0), high
 *             nibbles 128h + 64 + 4g.. (k 2)
 *           ql[64h + 32 + 4g..]: the same for k 1 and k 3
 *
 * A tile rebuilds q + 32 (0..63) for 16 rows with a few vector operations
 * per step, sums each sub-block of 16 exactly with vpdpbusd, scales it with
 * vpmulld, removes the +32 with vpdpwssd over the scales and the
 * activation's bsums (isum - 32 sum_j sc_j bsums_j, exact) and then takes
 * acc = fma(tot, d * da, acc) per KQ_KC super-blocks: the canonical order,
 * lane for lane the tiles' on rows in place. 8+ activation rows get the
 * prefill panels (q6k_panel) from the group.
 */
#define Q6_SB (X16_ROWS * sizeof(kp_block_q6_K) - 32) /* bytes of one super-block of a group, d apart */
#define Q6_STEP(u) (4 * 64 + 192 * (u))               /* offset of step u: qh, then the two ql words */
_Static_assert(Q6_STEP(16) == Q6_SB && Q6_SB % 64 == 0, "a Q6_K group keeps the in-place size");

static void pack_q6_K_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    const int64_t nb = n / KP_QK_K;
    const size_t group = (size_t)nb * Q6_SB;
    for (int64_t g0 = 0; g0 < nr; g0 += X16_ROWS) {
        uint8_t *gd = (uint8_t *)dst + (size_t)(g0 / X16_ROWS) * (group + (size_t)nb * 32);
        for (int r = 0; r < X16_ROWS; r++) {
            const char *row = g0 + r < nr ? (const char *)w + (size_t)(g0 + r) * w_stride : NULL;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *sb = gd + (size_t)b * Q6_SB;
                kp_block_q6_K x; /* padding rows: all 0 (d 0) */
                if (row) memcpy(&x, row + (size_t)b * sizeof x, sizeof x);
                else memset(&x, 0, sizeof x);
                for (int k = 0; k < 4; k++) memcpy(sb + 64 * k + 4 * r, x.scales + 4 * k, 4);
                for (int u = 0; u < 16; u++) {
                    const int h = u / 8, gi = u % 8;
                    memcpy(sb + Q6_STEP(u) + 4 * r, x.qh + 4 * u, 4);
                    memcpy(sb + Q6_STEP(u) + 64 + 4 * r, x.ql + 64 * h + 4 * gi, 4);
                    memcpy(sb + Q6_STEP(u) + 128 + 4 * r, x.ql + 64 * h + 32 + 4 * gi, 4);
                }
                memcpy(gd + group + (size_t)b * 32 + 2 * r, &x.d, 2);
            }
        }
    }
}

/* q + 32 (0..63) of quants 128h + 32k + 4g.. (k 0..3) of the rows, from
 * the ql words l0, l1 and the qh word hb of step (h, g). */
#define Q6_QUANTS(T, and, or, slli, srli, set1, l0, l1, hb, q)                                          \
    do {                                                                                                 \
        const T m4_ = set1(0x0F0F0F0F), m30_ = set1(0x30303030);                                         \
        (q)[0] = or(and(l0, m4_), and(slli(hb, 4), m30_));                                               \
        (q)[1] = or(and(l1, m4_), and(slli(hb, 2), m30_));                                               \
        (q)[2] = or(and(srli(l0, 4), m4_), and(hb, m30_));                                               \
        (q)[3] = or(and(srli(l1, 4), m4_), and(srli(hb, 2), m30_));                                      \
    } while (0)

/* Byte k (0..3) of every 32-bit lane of v, sign-extended. */
VNNI_INLINE __m512i q6_scale(__m512i v, int k) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * k), 24); }

/* 16 rows x NC activation rows over super-blocks [i0, i0 + len) of the
 * group at g (nb super-blocks); nr rows stored to out (add: added). */
VNNI_INLINE void q6_tile_nc(const uint8_t *g, int64_t nb, int64_t i0, int64_t len, const char *const *ar, int nr,
                            float *out, size_t os, int add, const int NC) {
    __m512 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < len; b++) {
        const int64_t i = i0 + b;
        const uint8_t *sb = g + (size_t)i * Q6_SB;
        const kp_block_q8_K *y[4];
        UNROLL for (int c = 0; c < NC; c++) y[c] = (const kp_block_q8_K *)ar[c] + i;
        __m512i W[4];
        UNROLL for (int k = 0; k < 4; k++) W[k] = _mm512_loadu_si512((const void *)(sb + 64 * k));
        __m512i isum[4];
        UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
        UNROLL for (int h = 0; h < 2; h++)
            UNROLL for (int half = 0; half < 2; half++) { /* g 4 half .. 4 half + 3: sub-blocks 8h + 2k + half */
                __m512i s[4][4];
                UNROLL for (int k = 0; k < 4; k++) UNROLL for (int c = 0; c < NC; c++) s[k][c] = _mm512_setzero_si512();
                UNROLL for (int gg = 0; gg < 4; gg++) {
                    const int gi = 4 * half + gg;
                    const uint8_t *st = sb + Q6_STEP(8 * h + gi);
                    const __m512i hb = _mm512_loadu_si512((const void *)st);
                    const __m512i l0 = _mm512_loadu_si512((const void *)(st + 64));
                    const __m512i l1 = _mm512_loadu_si512((const void *)(st + 128));
                    __m512i q[4];
                    Q6_QUANTS(__m512i, _mm512_and_si512, _mm512_or_si512, _mm512_slli_epi16, _mm512_srli_epi16,
                              _mm512_set1_epi32, l0, l1, hb, q);
                    UNROLL for (int k = 0; k < 4; k++) UNROLL for (int c = 0; c < NC; c++)
                        s[k][c] = dpbusd_bcast(s[k][c], q[k], y[c]->qs + 128 * h + 32 * k + 4 * gi);
                }
                UNROLL for (int k = 0; k < 4; k++) {
                    const int j = 8 * h + 2 * k + half;
                    const __m512i sc = q6_scale(W[j / 4], j % 4);
                    UNROLL for (int c = 0; c < NC; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s[k][c], sc));
                }
            }
        /* int16 pairs (sc_4w, sc_4w+2) and (sc_4w+1, sc_4w+3) per row */
        __m512i pe[4], po[4];
        UNROLL for (int k = 0; k < 4; k++) {
            pe[k] = _mm512_srai_epi16(_mm512_slli_epi16(W[k], 8), 8);
            po[k] = _mm512_srai_epi16(W[k], 8);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + (size_t)nb * Q6_SB + (size_t)i * 32)));
        UNROLL for (int c = 0; c < NC; c++) {
            const int16_t *bs = y[c]->bsums;
            __m512i corr = _mm512_setzero_si512();
            UNROLL for (int k = 0; k < 4; k++) {
                const uint32_t e = (uint16_t)bs[4 * k] | (uint32_t)(uint16_t)bs[4 * k + 2] << 16;
                const uint32_t o = (uint16_t)bs[4 * k + 1] | (uint32_t)(uint16_t)bs[4 * k + 3] << 16;
                corr = _mm512_dpwssd_epi32(corr, pe[k], _mm512_set1_epi32((int)e));
                corr = _mm512_dpwssd_epi32(corr, po[k], _mm512_set1_epi32((int)o));
            }
            const __m512i tot = _mm512_sub_epi32(isum[c], _mm512_slli_epi32(corr, 5));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(dw, _mm512_set1_ps(y[c]->d)), acc[c]);
        }
    }
    x16_store(acc, out, os, nr, add, NC);
}

static VNNI void q6_tile(const uint8_t *g, int64_t nb, int64_t i0, int64_t len, const char *const *ar, int nr,
                         float *out, size_t os, int add, int nc) {
    switch (nc) {
    case 1: q6_tile_nc(g, nb, i0, len, ar, nr, out, os, add, 1); break;
    case 2: q6_tile_nc(g, nb, i0, len, ar, nr, out, os, add, 2); break;
    case 3: q6_tile_nc(g, nb, i0, len, ar, nr, out, os, add, 3); break;
    default: q6_tile_nc(g, nb, i0, len, ar, nr, out, os, add, 4); break;
    }
}

/* The prefill panel p (rows 8p..8p+7) of super-block sb of a group, its d
 * values at dp: what q6k_pack makes of the rows in place, for PACK_VNNI. */
VNNI_INLINE void q6_panel(const uint8_t *sb, const uint8_t *dp, int p, q6k_panel *P) {
    UNROLL for (int h = 0; h < 2; h++)
        UNROLL for (int gi = 0; gi < 8; gi++) {
            const uint8_t *st = sb + Q6_STEP(8 * h + gi) + 32 * p;
            const __m256i hb = _mm256_loadu_si256((const __m256i *)st);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(st + 64));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(st + 128));
            __m256i q[4];
            Q6_QUANTS(__m256i, _mm256_and_si256, _mm256_or_si256, _mm256_slli_epi16, _mm256_srli_epi16,
                      _mm256_set1_epi32, l0, l1, hb, q);
            UNROLL for (int k = 0; k < 4; k++) _mm256_store_si256(&P->q[8 * h + 2 * k + gi / 4][gi % 4], q[k]);
        }
    UNROLL for (int k = 0; k < 4; k++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(sb + 64 * k + 32 * p));
        UNROLL for (int b = 0; b < 4; b++) /* VNNI: int32 */
            _mm256_store_si256(&P->sc[4 * k + b], _mm256_srai_epi32(_mm256_slli_epi32(w, 24 - 8 * b), 24));
        const __m256i e = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 8), o = _mm256_srai_epi16(w, 8);
        /* (sc_4k, sc_4k+1) and (sc_4k+2, sc_4k+3) as int16 pairs */
        _mm256_store_si256(&P->sp[2 * k], _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xAA));
        _mm256_store_si256(&P->sp[2 * k + 1], _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA));
    }
    _mm256_store_ps(P->d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dp + 16 * p))));
}

/* gemm_packed for Q4_K (kind KQ4), Q5_K (KQ5) and Q6_K (KQ6) groups:
 * decode tiles on the group's stream up to X16_TILE_COLS activation rows,
 * past it the prefill panels built from it (the VNNI panel tiles). */
VNNI_INLINE void gemm_kx16(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride, float *out,
                           size_t out_stride, int kind) {
    const int64_t nb = n / KP_QK_K;
    const size_t sbytes = kind == KQ6 ? Q6_SB : k16_sb_bytes(kind);
    const size_t group = (size_t)nb * (kind == KQ6 ? Q6_SB + 32 : k16_sb_bytes(kind));
    if (nb <= 0) zero_out(nr, nc, out, out_stride);
    if (nc > X16_TILE_COLS) {
        kq_stage st __attribute__((aligned(32)));
        for (int rc0 = 0; rc0 < nr; rc0 += X16_ROWS) {
            const uint8_t *g = (const uint8_t *)wp + (size_t)(rc0 / X16_ROWS) * group;
            const int rc = nr - rc0 < X16_ROWS ? nr - rc0 : X16_ROWS;
            const int n_panels = (rc + 7) / 8;
            for (int64_t i0 = 0; i0 < nb; i0 += KQ_KC) {
                const int64_t len = nb - i0 < KQ_KC ? nb - i0 : KQ_KC;
                for (int p = 0; p < n_panels; p++)
                    for (int64_t b = 0; b < len; b++) {
                        const uint8_t *sb = g + (size_t)(i0 + b) * sbytes;
                        if (kind != KQ6) k16_panel(sb, p, kind, &st.p.kmin[p][b]);
                        else q6_panel(sb, g + (size_t)nb * Q6_SB + (size_t)(i0 + b) * 32, p, &st.p.q6k[p][b]);
                    }
                for (int c0 = 0; c0 < nc; c0 += PANEL_CC) { /* PANEL_CC a slice: a multiple of the tiles' 4 */
                    const int cn = nc - c0 < PANEL_CC ? nc - c0 : PANEL_CC;
                    stream_prefetch(g + (size_t)(i0 + len) * sbytes, (size_t)len * sbytes, c0, cn, nc);
                    kq_tile_vnni(&st, n_panels, rc, (const char *)a + (size_t)c0 * a_stride, a_stride, cn, i0, len, kind,
                                 out + (size_t)c0 * out_stride + (size_t)rc0, out_stride, i0 > 0);
                }
            }
        }
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += X16_ROWS) { /* a group's stream once, all activation rows against it */
        const uint8_t *g = (const uint8_t *)wp + (size_t)(r0 / X16_ROWS) * group;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
            const char *ar[4];
            for (int c = 0; c < ncc; c++) ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
            float *o = out + (size_t)c0 * out_stride + (size_t)r0;
            for (int64_t i0 = 0; i0 < nb; i0 += KQ_KC) {
                const int64_t len = nb - i0 < KQ_KC ? nb - i0 : KQ_KC;
                if (kind == KQ4) k16_tile(g, i0, len, ar, nr - r0, o, out_stride, i0 > 0, ncc);
                else if (kind == KQ5) k5_tile(g, i0, len, ar, nr - r0, o, out_stride, i0 > 0, ncc);
                else q6_tile(g, nb, i0, len, ar, nr - r0, o, out_stride, i0 > 0, ncc);
            }
        }
    }
}

#define KX16_GEMM(name, kind)                                                                                   \
    static VNNI void name(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,            \
                          const void *aux, size_t aux_stride, float *out, size_t out_stride) {                  \
        (void)aux; /* Q8_K activations carry their own sums */                                                  \
        (void)aux_stride;                                                                                       \
        gemm_kx16(n, nr, nc, wp, a, a_stride, out, out_stride, kind);                                           \
    }
KX16_GEMM(gemm_packed_q4_K, KQ4)
KX16_GEMM(gemm_packed_q5_K, KQ5)
KX16_GEMM(gemm_packed_q6_K, KQ6)
#undef KX16_GEMM

/* ---- F16 and BF16 repacked for decode (quant.h pack, gemm_packed) --------- */

/*
 * A 16-row group of n elements (n a multiple of 16, pack_k) as n / 16
 * steps of 512 bytes: step s = row 0 elements 16s..16s+15 | row 1 ... |
 * row 15 (32 bytes each, as in place). A decode tile reads the group as one
 * forward stream. gemm_packed is float_gemm512 (above) on the group's
 * addresses, with its tiles and canonical order, so it equals gemm bit for
 * bit.
 */

static void pack_half_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    const int64_t ns = n / 16;
    for (int64_t g0 = 0; g0 < nr; g0 += X16_ROWS) {
        uint8_t *gd = (uint8_t *)dst + (size_t)(g0 / X16_ROWS) * (size_t)ns * FX16_STEP;
        for (int r = 0; r < X16_ROWS; r++) {
            const char *row = g0 + r < nr ? (const char *)w + (size_t)(g0 + r) * w_stride : NULL;
            for (int64_t s = 0; s < ns; s++) { /* padding rows: zeros */
                if (row) memcpy(gd + (size_t)s * FX16_STEP + 32 * (size_t)r, row + (size_t)s * 32, 32);
                else memset(gd + (size_t)s * FX16_STEP + 32 * (size_t)r, 0, 32);
            }
        }
    }
}

#define FX16_GEMM(name, kind)                                                                                   \
    static VNNI void name(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,            \
                          const void *aux, size_t aux_stride, float *out, size_t out_stride) {                  \
        (void)aux;                                                                                              \
        (void)aux_stride;                                                                                       \
        float_gemm512(n, nr, nc, wp, 0, (size_t)(n / 16) * FX16_STEP, a, a_stride, out, out_stride, kind);     \
    }
FX16_GEMM(gemm_packed_f16, ELEM_F16)
FX16_GEMM(gemm_packed_bf16, ELEM_BF16)
#undef FX16_GEMM
#undef UNROLL16

/* ---- MXFP4 ------------------------------------------------------------------ */

/* Any rows x any activation rows on the rows in place: quant_avx2_inl.h's
 * tile with vpdpbusd (the avx2 table's integers, its float steps). */
static VNNI void mxfp4_tile_vnni(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                 size_t a_stride, float *out, size_t out_stride) {
    MXFP4_TILE_BODY(mxfp4_pairs_vnni)
}

static VNNI void gemm_mxfp4_vnni(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a,
                                 size_t a_stride, const void *aux, size_t aux_stride, float *out,
                                 size_t out_stride) {
    (void)aux;
    (void)aux_stride;
    mxfp4_tile_vnni(n, nr, nc, w, w_stride, a, a_stride, out, out_stride);
}

/*
 * MXFP4 repacked (quant.h pack, gemm_packed): a group of 16 rows holds the
 * code bytes of its nb blocks, 256 bytes a block, then the 16 rows' scale
 * bytes of each block (16 bytes a block):
 *
 *   block b at b x 256: 4 steps s of 64 bytes, row 0 qs[4s..4s+3] | row 1
 *            qs[4s..4s+3] | ... | row 15: low nibbles elements 4s..4s+3,
 *            high nibbles elements 16 + 4s..
 *   scales   at nb x 256 + 16 b: e of rows 0..15
 *
 * A tile looks the nibbles up (vpshufb) as u = 2 e2m1 + 12 (0..24,
 * unsigned), so vpdpbusd sums u . a per row lane without the sign trick;
 * the block's integer sum is then u . a - 12 sum(a), the accumulator
 * starting at -12 sum(a) (3/32 of the Q8_0 aux row's bias, or summed here
 * without aux). The 16 rows' scales 2^(e - 128) come from the scale bytes
 * in a few vector operations, and acc = fma(float(isum), scale x d_a, acc)
 * block by block: quant_avx2_inl.h's chain, lane for lane, so gemm_packed
 * gives gemm's bits. Prefill takes the same tile on 4 activation rows at a
 * time; the group (16 x 17 bytes a block) stays in cache between them.
 */
#define MX16_SB 256 /* code bytes of one block of a group */

static void pack_mxfp4_x16(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    const int64_t nb = n / KP_QK_MXFP4;
    const size_t group = (size_t)nb * X16_ROWS * sizeof(kp_block_mxfp4);
    for (int64_t g0 = 0; g0 < nr; g0 += X16_ROWS) {
        uint8_t *gd = (uint8_t *)dst + (size_t)(g0 / X16_ROWS) * group;
        for (int r = 0; r < X16_ROWS; r++) {
            const kp_block_mxfp4 *row =
                g0 + r < nr ? (const kp_block_mxfp4 *)((const uint8_t *)w + (size_t)(g0 + r) * w_stride) : NULL;
            for (int64_t b = 0; b < nb; b++) { /* padding rows: codes 0, e 0 */
                for (int s = 0; s < 4; s++) {
                    uint8_t *d = gd + (size_t)b * MX16_SB + 64 * s + 4 * r;
                    if (row) memcpy(d, row[b].qs + 4 * s, 4);
                    else memset(d, 0, 4);
                }
                gd[(size_t)nb * MX16_SB + (size_t)b * 16 + r] = row ? row[b].e : 0;
            }
        }
    }
}

/* 2^(e - 128) for 16 scale bytes (kp_e8m0_half, lane for lane). */
VNNI_INLINE __m512 mx16_scales(const uint8_t *e) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)e));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), v); /* e 0, 1 */
    const __mmask16 small = _mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
}

/* -12 x the sum of a Q8_0 block's quants. */
VNNI_INLINE int32_t mx16_bias(const kp_block_q8_0 *y) {
    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)y->qs), _mm256_set1_epi8((char)0x80));
    const __m256i s = _mm256_sad_epu8(q, _mm256_setzero_si256()); /* 4 sums of q + 128 */
    const __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const int32_t sum = (int32_t)(_mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1)) - 32 * 128;
    return -12 * sum;
}

/* 16 rows x NC activation rows over all nb blocks of the group at g (ax:
 * the activation rows' aux rows, or NULL); nr rows stored to out. */
VNNI_INLINE void mx16_tile_nc(const uint8_t *g, int64_t nb, const char *const *ar, const kp_q8_0_aux *const *ax,
                              int nr, float *out, size_t os, const int NC) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = g + (size_t)b * MX16_SB;
        if (NC <= 2) UNROLL for (int o = 0; o < MX16_SB; o += 64) _mm_prefetch((const char *)q + X16_FAR_PF + o, _MM_HINT_T1);
        const kp_block_q8_0 *y[4];
        __m512i is[4], ih[4]; /* two chains: low and high nibbles */
        UNROLL for (int c = 0; c < NC; c++) {
            ih[c] = _mm512_setzero_si512();
            y[c] = (const kp_block_q8_0 *)ar[c] + b;
            is[c] = _mm512_set1_epi32(ax ? (ax[c][b].bias >> 5) * 3 : mx16_bias(y[c]));
        }
        UNROLL for (int s = 0; s < 4; s++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * s));
            const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
            const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            UNROLL for (int c = 0; c < NC; c++) {
                is[c] = dpbusd_bcast(is[c], lo, y[c]->qs + 4 * s);
                ih[c] = dpbusd_bcast(ih[c], hi, y[c]->qs + 16 + 4 * s);
            }
        }
        UNROLL for (int c = 0; c < NC; c++) is[c] = _mm512_add_epi32(is[c], ih[c]);
        const __m512 dw = mx16_scales(g + (size_t)nb * MX16_SB + (size_t)b * 16);
        UNROLL for (int c = 0; c < NC; c++) {
            const float da = ax ? ax[c][b].d : half_to_float(y[c]->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[c]), _mm512_mul_ps(dw, _mm512_set1_ps(da)), acc[c]);
        }
    }
    x16_store(acc, out, os, nr, 0, NC);
}

static VNNI void gemm_packed_mxfp4(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,
                                   const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    const int64_t nb = n / KP_QK_MXFP4;
    const size_t group = (size_t)nb * X16_ROWS * sizeof(kp_block_mxfp4);
    if (nb <= 0) {
        zero_out(nr, nc, out, out_stride);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += X16_ROWS) {
        const uint8_t *g = (const uint8_t *)wp + (size_t)(r0 / X16_ROWS) * group;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
            const char *ar[4];
            const kp_q8_0_aux *ax[4];
            for (int c = 0; c < ncc; c++) {
                ar[c] = (const char *)a + (size_t)(c0 + c) * a_stride;
                ax[c] = aux ? (const kp_q8_0_aux *)((const char *)aux + (size_t)(c0 + c) * aux_stride) : NULL;
            }
            float *o = out + (size_t)c0 * out_stride + (size_t)r0;
            const kp_q8_0_aux *const *axp = aux ? ax : NULL;
            switch (ncc) {
            case 1: mx16_tile_nc(g, nb, ar, axp, nr - r0, o, out_stride, 1); break;
            case 2: mx16_tile_nc(g, nb, ar, axp, nr - r0, o, out_stride, 2); break;
            case 3: mx16_tile_nc(g, nb, ar, axp, nr - r0, o, out_stride, 3); break;
            default: mx16_tile_nc(g, nb, ar, axp, nr - r0, o, out_stride, 4); break;
            }
        }
    }
}

/* The table, given its name and its BF16 kernels: the avx512vnni table's
 * own (F32 multiply-adds), or quant_bf16.c's bfloat16 dot products (the
 * avx512bf16 table, for CPUs with AVX512_BF16). */
#define AVX512VNNI_TABLE(NAME, BF16_TILE, BF16_GEMM, BF16_PACK_K, BF16_PACK, BF16_PACKED) \
    {                                                                                     \
    .name = NAME, \
    KP_AVX2_SHARED_ENTRIES, \
    .dot_tile[KP_DTYPE_F32] = tile_f32_512, \
    .dot_tile[KP_DTYPE_F16] = tile_f16_512, \
    .dot_tile[KP_DTYPE_BF16] = BF16_TILE, \
    .gemm = \
        { \
            [KP_DTYPE_F32] = gemm_f32_512, \
            [KP_DTYPE_F16] = gemm_f16_512, \
            [KP_DTYPE_BF16] = BF16_GEMM, \
            [KP_DTYPE_Q8_0] = gemm_q8_0, \
            [KP_DTYPE_Q4_0] = gemm_q4_0, \
            [KP_DTYPE_Q4_1] = gemm_q4_1, \
            [KP_DTYPE_Q5_0] = gemm_q5_0, \
            [KP_DTYPE_Q5_1] = gemm_q5_1, \
            [KP_DTYPE_Q4_K] = gemm_q4_K, \
            [KP_DTYPE_Q5_K] = gemm_q5_K, \
            [KP_DTYPE_Q6_K] = gemm_q6_K, \
            [KP_DTYPE_MXFP4] = gemm_mxfp4_vnni, \
        }, \
    .pack_rows = {[KP_DTYPE_F16] = X16_ROWS, [KP_DTYPE_BF16] = X16_ROWS, [KP_DTYPE_Q8_0] = X16_ROWS, \
                  [KP_DTYPE_Q4_0] = X16_ROWS, [KP_DTYPE_Q4_K] = X16_ROWS, [KP_DTYPE_Q5_K] = X16_ROWS, \
                  [KP_DTYPE_Q6_K] = X16_ROWS, [KP_DTYPE_MXFP4] = X16_ROWS}, \
    .pack_k = {[KP_DTYPE_F16] = 16, [KP_DTYPE_BF16] = BF16_PACK_K, [KP_DTYPE_Q8_0] = 32, [KP_DTYPE_Q4_0] = 32, \
               [KP_DTYPE_Q4_K] = KP_QK_K, [KP_DTYPE_Q5_K] = KP_QK_K, [KP_DTYPE_Q6_K] = KP_QK_K, \
               [KP_DTYPE_MXFP4] = KP_QK_MXFP4}, \
    .pack = {[KP_DTYPE_F16] = pack_half_x16, [KP_DTYPE_BF16] = BF16_PACK, [KP_DTYPE_Q8_0] = pack_q8_0_x16, \
             [KP_DTYPE_Q4_0] = pack_q4_0_x16, [KP_DTYPE_Q4_K] = pack_q4_K_x16, [KP_DTYPE_Q5_K] = pack_q5_K_x16, \
             [KP_DTYPE_Q6_K] = pack_q6_K_x16, [KP_DTYPE_MXFP4] = pack_mxfp4_x16}, \
    .gemm_packed = {[KP_DTYPE_F16] = gemm_packed_f16, [KP_DTYPE_BF16] = BF16_PACKED, \
                    [KP_DTYPE_Q8_0] = gemm_packed_q8_0, [KP_DTYPE_Q4_0] = gemm_packed_q4_0, \
                    [KP_DTYPE_Q4_K] = gemm_packed_q4_K, [KP_DTYPE_Q5_K] = gemm_packed_q5_K, \
                    [KP_DTYPE_Q6_K] = gemm_packed_q6_K, [KP_DTYPE_MXFP4] = gemm_packed_mxfp4}, \
    }

const kp_kernels kp_quant_avx512vnni_kernels =
    AVX512VNNI_TABLE("avx512vnni", tile_bf16_512, gemm_bf16_512, 16, pack_half_x16, gemm_packed_bf16);
const kp_kernels kp_quant_avx512bf16_kernels = AVX512VNNI_TABLE("avx512bf16", kp_bf16dp_tile, kp_bf16dp_gemm, 16,
                                                                kp_bf16dp_pack, kp_bf16dp_gemm_packed);
#undef AVX512VNNI_TABLE

#else /* not x86-64: no AVX-512 table */

typedef int kp_quant_avx512_unused;

#endif
