/*
 * quant_bf16.c - the BF16 weight kernels of the "avx512bf16" table
 * (tables.h): that table is the avx512vnni table (quant_avx512.c, which
 * builds both from one list) with its BF16 dot_tile, gemm, pack and
 * gemm_packed replaced by these, which multiply in bfloat16 dot products
 * (VDPBF16PS on 256-bit vectors: 16 products of pairs added into 8 F32
 * lanes per instruction, twice the multiply-adds of an F32 FMA of that
 * width) instead of widening both operands to F32. 256-bit vectors: on
 * Zen 4, which splits 512-bit operations in two, they give the same
 * products per cycle as 512-bit ones, and they keep decode's weight stream
 * in 512-byte steps (with 1 KiB steps of 512-bit rows the stream read 21
 * GB/s on one thread against 27 for the F32 tile; with these, as much as
 * it). A BF16 weight's activations are BF16 already (kp_vec_dot_type, as
 * llama.cpp rounds them), and a product of two bfloat16 numbers is exact
 * in F32, so only the order of the sums differs from the avx512vnni
 * table's.
 *
 * Canonical order (every call shape of this table, so gemm_packed equals
 * gemm and dot_tile bit for bit): lane i of one 8-lane F32 vector sums the
 * pairs of elements (16j + 2i, 16j + 2i + 1) for j = 0, 1, ... in order
 * over the whole row (one VDPBF16PS each; the last 16 elements padded with
 * zeros), then one fixed horizontal sum. The register tiles: 4 weight rows
 * x 6 activation rows for many of them, 16 x 1, 8 x 2, 4 x 3..5 for few.
 *
 * Packed layout (pack, pack_k 16): a 16-row group of n elements as n / 16
 * steps of 512 bytes: step s = row 0's elements 16s..16s+15 | row 1 | ...
 * | row 15 (32 bytes each; the avx512vnni table's F16/BF16 layout), so a
 * decode tile reads the group as one stream.
 *
 * Every function carries the target of VNNI plus avx512bf16 (BF16,
 * BF16_INLINE); dispatch.c hands the table out only when the CPU has
 * AVX512_BF16 besides what avx512vnni needs. Outside x86-64 the file is
 * empty. No state.
 */
#include "kernels/quant_avx2.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/quant_avx2_inl.h"
#include "kernels/tables.h"

#define BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16")))
#define BF16_INLINE                                                                                            \
    static inline __attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16")))

#define NC 6        /* activation rows of the widest tile */
#define ROWS 16     /* rows of a packed group */
#define STEP_BYTES (ROWS * 32) /* 16 elements of the 16 rows */
#define UNROLL16 _Pragma("GCC unroll 16")

/* 16 bfloat16 of a row from element i, zeros past element n. */
BF16_INLINE __m256bh ld16(const void *row, int64_t i, int64_t n) {
    const uint16_t *p = (const uint16_t *)row + i;
    if (i + 16 <= n) return (__m256bh)_mm256_loadu_si256((const __m256i *)p);
    const __mmask16 m = i >= n ? 0 : (__mmask16)((1u << (n - i)) - 1);
    return (__m256bh)_mm256_maskz_loadu_epi16(m, p);
}

/* Weight rows wr[0..R) x activation rows ar[0..C) of n elements over the
 * whole row: step j (elements 16j..16j+15) of row r at wr[r] + j*adv (in
 * place 32 bytes on, repacked one group step on), of row c at ar[c] + 16j
 * elements; the last partial step (rows in place only) loads under a mask.
 * nr of the R rows are stored. pf > 0 (decode on rows in place): each
 * weight row asks for the line pf bytes ahead once a line. */
BF16_INLINE void tile_rows(const char *const *wr, size_t adv, const char *const *ar, int64_t n, int nr, float *out,
                           size_t os, size_t pf, const int R, const int C) {
    __m256 acc[16][NC];
    UNROLL16 for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const int64_t nf = n & ~(int64_t)15;
    size_t off = 0;
    for (int64_t k = 0; k < nf; k += 16, off += adv) {
        if (pf && (size_t)k * 2 % 64 == 0) /* once per cache line */
            UNROLL16 for (int r = 0; r < R; r++) _mm_prefetch(wr[r] + pf + off, _MM_HINT_T0);
        __m256bh av[NC];
        UNROLL for (int c = 0; c < C; c++) av[c] = (__m256bh)_mm256_loadu_si256((const __m256i *)((const uint16_t *)ar[c] + k));
        UNROLL16 for (int r = 0; r < R; r++) {
            const __m256bh wv = (__m256bh)_mm256_loadu_si256((const __m256i *)(wr[r] + off));
            UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_dpbf16_ps(acc[r][c], wv, av[c]);
        }
    }
    if (nf < n) /* rows in place: the last n - nf elements */
        UNROLL16 for (int r = 0; r < R; r++) {
            const __m256bh wv = ld16(wr[r], nf, n);
            UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_dpbf16_ps(acc[r][c], wv, ld16(ar[c], nf, n));
        }
    UNROLL for (int c = 0; c < C; c++)
        UNROLL16 for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            out[(size_t)c * os + (size_t)r] = hsum_ps(acc[r][c]);
        }
}

/* nr weight rows x nc activation rows: rows in place (group 0: row r at w +
 * r*w_stride) or repacked (group > 0: the bytes of a 16-row group; row r at
 * w + (r/16)*group + 32*(r%16)). Columns in tiles of 6 (4 rows x 6: 24
 * accumulators, 10 loads per 24 dot products), the rest in one narrower
 * tile (16 x 1, 8 x 2, 4 x 3..5); each column tile runs over every row
 * tile, so its activations stay in L1 while the weight rows stream past. */
BF16_INLINE void gemm_rows(int64_t n, int nr, int nc, const void *w, size_t w_stride, size_t group, const void *a,
                           size_t a_stride, float *out, size_t out_stride) {
    const size_t adv = group ? STEP_BYTES : 32;
    const size_t pf = group ? 0 : decode_pf(w_stride, nc, 5);
    if (n <= 0) {
        zero_out(nr, nc, out, out_stride);
        return;
    }
    const int n_tiles = float_tile_count(nr, nc, NC);
    const size_t ahead = group && nc >= NC ? (size_t)((nr + ROWS - 1) / ROWS) * group : 0;
    int tile = 0;
    for (int c0 = 0; c0 < nc;) {
        const int C = nc - c0 >= NC ? NC : nc - c0;
        const int R = float_tile_rows(C);
        const char *ar[NC];
        for (int c = 0; c < NC; c++) ar[c] = (const char *)a + (size_t)(c0 + (c < C ? c : C - 1)) * a_stride;
        for (int r0 = 0; r0 < nr; r0 += R) {
            const int nrr = nr - r0 < R ? nr - r0 : R;
            const char *wr[16];
            for (int r = 0; r < R; r++) {
                const int row = r0 + (r < nrr ? r : nrr - 1);
                wr[r] = group ? (const char *)w + (size_t)(row / ROWS) * group + 32 * (size_t)(row % ROWS)
                              : (const char *)w + (size_t)row * w_stride;
            }
            float *o = out + (size_t)c0 * out_stride + (size_t)r0;
            stream_prefetch((const char *)w + ahead, ahead, tile++, 1, n_tiles); /* the next task's groups */
            switch (C) {
            case 1: tile_rows(wr, adv, ar, n, nrr, o, out_stride, pf, 16, 1); break;
            case 2: tile_rows(wr, adv, ar, n, nrr, o, out_stride, pf, 8, 2); break;
            case 3: tile_rows(wr, adv, ar, n, nrr, o, out_stride, pf, 4, 3); break;
            case 4: tile_rows(wr, adv, ar, n, nrr, o, out_stride, pf, 4, 4); break;
            case 5: tile_rows(wr, adv, ar, n, nrr, o, out_stride, pf, 4, 5); break;
            default: tile_rows(wr, adv, ar, n, nrr, o, out_stride, pf, 4, 6); break;
            }
        }
        c0 += C;
    }
}

/* Rows in place times one activation row (decode on weights not
 * repacked): a row at a time (float_rows_in_place, quant_avx2_inl.h). */
static BF16 void rows1(int64_t n, int nr, const void *w, size_t w_stride, const void *a, float *out) {
    const char *ar[NC] = {(const char *)a};
    for (int r = 0; r < nr; r++) {
        const char *w1 = (const char *)w + (size_t)r * w_stride;
        tile_rows(&w1, 32, ar, n, 1, out + r, 1, 0, 1, 1);
    }
}

BF16 void kp_bf16dp_tile(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                         float *out, size_t out_stride) {
    if (nc == 1) rows1(n, nr, w, w_stride, a, out);
    else gemm_rows(n, nr, nc, w, w_stride, 0, a, a_stride, out, out_stride);
}

BF16 void kp_bf16dp_gemm(int64_t n, int nr, int nc, const void *w, size_t w_stride, const void *a, size_t a_stride,
                         const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    (void)aux;
    (void)aux_stride;
    if (nc == 1) rows1(n, nr, w, w_stride, a, out);
    else gemm_rows(n, nr, nc, w, w_stride, 0, a, a_stride, out, out_stride);
}

/* ---- packed ------------------------------------------------------------------ */

void kp_bf16dp_pack(int64_t n, int64_t nr, const void *w, size_t w_stride, void *dst) {
    const int64_t ns = n / 16;
    for (int64_t g0 = 0; g0 < nr; g0 += ROWS) {
        uint8_t *gd = (uint8_t *)dst + (size_t)(g0 / ROWS) * (size_t)ns * STEP_BYTES;
        for (int r = 0; r < ROWS; r++) {
            const char *row = g0 + r < nr ? (const char *)w + (size_t)(g0 + r) * w_stride : NULL;
            for (int64_t s = 0; s < ns; s++) { /* padding rows: zeros */
                if (row) memcpy(gd + (size_t)s * STEP_BYTES + 32 * (size_t)r, row + (size_t)s * 32, 32);
                else memset(gd + (size_t)s * STEP_BYTES + 32 * (size_t)r, 0, 32);
            }
        }
    }
}

BF16 void kp_bf16dp_gemm_packed(int64_t n, int nr, int nc, const void *wp, const void *a, size_t a_stride,
                                const void *aux, size_t aux_stride, float *out, size_t out_stride) {
    (void)aux;
    (void)aux_stride;
    gemm_rows(n, nr, nc, wp, 0, (size_t)(n / 16) * STEP_BYTES, a, a_stride, out, out_stride);
}

#else /* not x86-64 */

typedef int kp_quant_bf16_unused;

#endif
