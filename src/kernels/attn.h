/*
 * attn.h - the inner loops of attention over cached K/V rows (floor 2:
 * kernels; pure functions on plain arrays). The tables live in
 * attn_scalar.c, attn_avx2.c and attn_avx512.c; dispatch.c hands them out.
 *
 * Tiles (what the forward pass uses). A tile is n_tok consecutive tokens of
 * one sequence and the G query heads that share one kv-head (grouped-query
 * attention): M = n_tok * G query rows, row r = (token r / G, head r % G).
 * Token i sits at position pos0 + i and sees the cached positions
 * <= pos0 + i (causal). The caller streams the cached K/V rows of that
 * kv-head through the tile in steps of at most KP_ATTN_STEP consecutive
 * positions; each K and V row is loaded (and converted from F16) once per
 * step for all M rows. Every row keeps a running max m, a running sum l
 * and a running weighted sum o of V rows (online softmax), so no row of
 * scores over the whole context is ever stored:
 *
 *   begin:  m = -inf, l = 0, o = 0
 *   step:   for the visible keys j of the step, in order:
 *             s_j = dot(q, k_j) * scale        (dot: fused multiply-adds over
 *                                               d = 0..hd-1 in order, from 0)
 *           m' = max(m, max_j s_j)
 *           a  = m' == m ? 1 : exp(m - m')
 *           p_j = exp(s_j - m');  l = l*a + (p_0 + p_1 + ...)  (sum in key
 *                                                             order, one fma)
 *           o = o*a, then o += p_j * v_j for j in order (fused)
 *           m = m'
 *   end:    out = o * (1 / l)
 *
 * Determinism: a row's result depends only on its query, its position, the
 * cached rows and where the steps start and end, never on the other rows
 * of the tile or how many there are. Within one table, a token computed
 * alone (decode) and the same token inside a tile of 16 (prefill) give
 * bitwise the same output; the forward pass relies on it so that a
 * sequence's logits do not depend on how it was fed. The avx2 and avx512
 * tables give the same bits; the scalar table is deterministic in the same
 * sense but rounds differently. A tile with free_order set may compute
 * few-row tiles in another summation order (dot products in 8 partial
 * sums, faster for single-token decode): still within float rounding of
 * the above, but no longer bitwise equal to a larger tile.
 *
 * exp is computed by the table's exp_row (the scalar table: expf). K and V rows are F32 or F16 (IEEE half),
 * or ggml's Q8_0 / Q4_0 blocks (tile_step_kv): every element is used as
 * the F32 number d * q (exact; the same numbers kp_dequantize_row gives)
 * and the step is the table's F32 step on those numbers. Tiles of many
 * rows decode the step's rows once into F32 rows first; the avx512
 * table's few-row tiles (decode) convert them in registers where they lie
 * in the cache. Either way the query stays F32 (it is not quantized to
 * Q8_0 as llama.cpp's CPU flash attention does: that would add a rounding
 * of its own) and a quantized step is bitwise the F32 step on the
 * dequantized rows, with every determinism property above.
 */
#ifndef KP_ATTN_H
#define KP_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/dtype.h"

/* Most cached positions one tile step takes. */
#define KP_ATTN_STEP 16

/* One tile in flight. The caller fills every field before tile_begin and
 * leaves them alone until it has the results (tile_end, tile_partial; both
 * may be called); ws is the kernel's workspace (query
 * copy, running state, converted K/V of one step): at least
 * kp_attn_tile_floats(hd, n_tok * G) floats, borrowed, 64-byte alignment
 * recommended. */
typedef struct {
    int hd;          /* head size, >= 1 */
    int G;           /* query heads per kv-head, >= 1 */
    int n_tok;       /* tokens in the tile, >= 1 */
    int32_t pos0;    /* position of the tile's first token */
    float scale;     /* score scale, usually 1/sqrt(hd) */
    bool free_order; /* true: a tile of few rows may sum in another order
                        (faster, see above); for tiles whose results are
                        merged with others anyway */
    /* The K and V rows of the step that will follow this one (next_bytes
     * bytes each from next_k and next_v), or next_bytes 0: a hint that a
     * step may use to prefetch them while it computes. Set before each
     * step; never read through. */
    const void *next_k, *next_v;
    size_t next_bytes;
    float *ws;
} kp_attn_tile;

/* Prefetches slice i of n (whole cache lines, i < n) of the next step's K
 * and V rows that t->next_* name; nothing when there are none. Steps of
 * many rows call it once with (0, 1) before they compute; steps of few rows
 * (decode) spread the slices over their work, which keeps the loads in
 * flight while they compute instead of queueing them all at once. */
static inline __attribute__((always_inline)) void kp_attn_prefetch_next(const kp_attn_tile *t, int i, int n) {
    size_t lines = (t->next_bytes + 63) / 64, per = (lines + (size_t)n - 1) / (size_t)n;
    const char *k = (const char *)t->next_k, *v = (const char *)t->next_v;
    for (size_t l = (size_t)i * per; l < lines && l < (size_t)(i + 1) * per; l++) {
        __builtin_prefetch(k + 64 * l);
        __builtin_prefetch(v + 64 * l);
    }
}

/* Workspace floats a tile of n_rows query rows needs, for every table
 * (with room for the F32 copies of a tile_step_kv step). */
size_t kp_attn_tile_floats(int hd, int n_rows);

typedef struct {
    const char *name;
    /* ---- tiles (see the top of this file) ---- */
    /* Starts a tile: row r's query is q[(r / G) * q_stride + (r % G) * hd
     * .. + hd] (the G heads of a token are contiguous). q is copied. */
    void (*tile_begin)(kp_attn_tile *t, const float *q, int64_t q_stride);
    /* One step: n_keys (1..KP_ATTN_STEP) consecutive cached positions
     * key_pos .. key_pos + n_keys - 1, their K rows k[j*hd .. +hd] and V rows
     * v[j*hd .. +hd]. Only these rows are read. A row that sees none of
     * the positions is left unchanged. */
    void (*tile_step_f32)(kp_attn_tile *t, const float *k, const float *v, int n_keys, int32_t key_pos);
    void (*tile_step_f16)(kp_attn_tile *t, const uint16_t *k, const uint16_t *v, int n_keys,
                          int32_t key_pos);
    /* The same for rows of any KV type kt (K) and vt (V): F32, F16, Q8_0
     * or Q4_0 (hd a multiple of 32 for the last two). Row j of K starts at
     * (const char *)k + j * kp_dtype_row_size(kt, hd), likewise V. The
     * rows are decoded to F32 and go through tile_step_f32: the same bits
     * as tile_step_f32 on kp_dequantize_row's output. */
    void (*tile_step_kv)(kp_attn_tile *t, const void *k, kp_dtype kt, const void *v, kp_dtype vt, int n_keys,
                         int32_t key_pos);
    /* Writes row r's attention output, normalized, to out[(r / G) *
     * out_stride + (r % G) * hd .. + hd]. Every row must have seen at least
     * one position. */
    void (*tile_end)(const kp_attn_tile *t, float *out, int64_t out_stride);
    /* Writes row r's unnormalized state to part[r * (hd + 2) ..]: m, l, then
     * o[hd] (for merging tiles that cover different positions of the same
     * rows). A row that saw nothing has m = -inf, l = 0, o = 0. */
    void (*tile_partial)(const kp_attn_tile *t, float *part);
    /* y[i] = e^x[i] for i < n (x may equal y). SIMD tables: at most 2 ulp
     * from e^x for x in [-87.3, 88]; 0 below about -87.34 (no subnormal
     * results), and for -inf. */
    void (*exp_row)(const float *x, float *y, int64_t n);
    /* gate[i] = silu(gate[i]) * up[i] = gate[i] * up[i] / (1 + e^-gate[i])
     * for i < n, e^ as exp_row (the SwiGLU of the feed-forward block, the
     * other exp-heavy loop of a layer). */
    void (*swiglu_row)(float *gate, const float *up, int64_t n);
    /* gate[i] = gelu_tanh(gate[i]) * up[i] for i < n as ggml's GeGLU on the
     * CPU: gate <= -10 gives 0, gate >= 10 gives gate * up, anything else
     * is rounded to F16 (to nearest even) and looked up: table[h] * up,
     * table holding 65536 floats indexed by the F16 bits. The same bits in
     * every table. */
    void (*geglu_row)(const float *table, float *gate, const float *up, int64_t n);
} kp_attn_kernels;

/* Portable C; always available. */
const kp_attn_kernels *kp_attn_scalar(void);

/* For the tables' tile_end and tile_partial of workspaces that keep each
 * row's running sum o[M][hd], max m[M] and sum l[M] row by row: writes
 * o / l to the tile's output rows (row r -> token r / G, head r % G), or
 * the partial state [m, l, o[hd]] of every row. */
void kp_attn_rows_end(const float *o, const float *l, int M, int G, int hd, float *out, int64_t out_stride);
void kp_attn_rows_partial(const float *o, const float *m, const float *l, int M, int hd, float *part);
/* The AVX2+FMA+F16C table, without checking the CPU; NULL when kvpin is not
 * built for x86-64. Head sizes that are not a multiple of 8 fall back to the
 * scalar code inside it. */
const kp_attn_kernels *kp_attn_avx2_table(void);
/* The same with the prefill (many-row) tile loops, and the scores and
 * weighted sums of free-order tiles (chunked decode), on 16-lane AVX-512F
 * vectors; its results equal the AVX2 table's bit for bit except in
 * free-order tiles, which promise no summation order. NULL when not
 * built for x86-64; the CPU is not checked. */
const kp_attn_kernels *kp_attn_avx512_table(void);
/* The AVX-512 table when the CPU has AVX-512F, AVX2, FMA and F16C, else the
 * AVX2 table when it has the last three, else the scalar one. */
const kp_attn_kernels *kp_attn_best(void);

/* Precision of attention's two products in prefill tiles (attn_bf16.c's
 * head comment has the arithmetic of BF16). */
typedef enum {
    KP_ATTN_F32 = 0, /* F32 fused multiply-adds (the tables above; the default) */
    KP_ATTN_BF16 = 1 /* q, k, v and the weights rounded to bfloat16, F32 sums */
} kp_attn_precision;

/* The scalar table of the BF16 precision: the reference of its SIMD table
 * (tiles of fewer than 8 rows, or head sizes not a multiple of 32, are the
 * scalar table's). */
const kp_attn_kernels *kp_attn_scalar_bf16(void);
/* The avx512bf16 table (attn_bf16.c) without checking the CPU; NULL when
 * kvpin is not built for x86-64. */
const kp_attn_kernels *kp_attn_avx512bf16_table(void);
/* The avx512bf16 table when the CPU has AVX512_BF16, BW and VL besides
 * what the avx512 table needs; else NULL (a caller asked for BF16 falls
 * back to kp_attn_best and says so). */
const kp_attn_kernels *kp_attn_bf16_best(void);

#endif
