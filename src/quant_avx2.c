/*
 * quant_avx2.c - the AVX2 + FMA + F16C kernel table (see quant.h).
 *
 * Compiled without -march flags: every function carries
 * __attribute__((target("avx2,fma,f16c"))), and kp_kernels_best() hands
 * the table out only when the CPU has all three. Outside x86-64 the file
 * compiles to a stub that returns NULL.
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
 * dot_tile: the weight row is the outer loop; each weight block is loaded
 * and decoded once (nibble unpacking, 6-bit scale unpacking, sign
 * splitting) and then multiplied with the same block of all nc activation
 * rows, which stay hot in L1 across the nr rows. What depends only on the
 * activations is prepared once per call on the stack: float types convert
 * a 256-element slice of the nc rows to F32, Q8_0/Q4_0 convert the FP16
 * block scales of the nc rows to float. The column count nc (1..4) is a
 * compile-time constant in each specialisation, so accumulators live in
 * registers.
 *
 * quantize_act is bit-identical to the reference quantizers in quant.c
 * (Q8_0 rounds half away from zero like roundf; Q8_K rounds to nearest
 * even like nearest_int; F16 uses vcvtps2ph with round-to-nearest-even).
 */
#include "quant_impl.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 8")

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

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

#define STAGE 256 /* elements of each activation row staged as F32 per pass */

/*
 * One weight row against NC staged activation slices of len elements.
 * Two accumulator sets (even/odd 8-element chunks) hide the FMA latency.
 */
AVX2_INLINE void float_row_slice(const void *wrow, int kind, int64_t off, int64_t len,
                                 const float (*stage)[STAGE], __m256 acc[4][2], const int NC) {
    __m256 e[4], o[4]; /* even / odd chunk accumulators, kept in registers */
    UNROLL for (int c = 0; c < NC; c++) {
        e[c] = acc[c][0];
        o[c] = acc[c][1];
    }
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        const __m256 w0 = load_x8(wrow, off + i, kind);
        const __m256 w1 = load_x8(wrow, off + i + 8, kind);
        UNROLL for (int c = 0; c < NC; c++) {
            e[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(&stage[c][i]), e[c]);
            o[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(&stage[c][i + 8]), o[c]);
        }
    }
    for (; i + 8 <= len; i += 8) {
        const __m256 w0 = load_x8(wrow, off + i, kind);
        UNROLL for (int c = 0; c < NC; c++)
            e[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(&stage[c][i]), e[c]);
    }
    UNROLL for (int c = 0; c < NC; c++) {
        acc[c][0] = e[c];
        acc[c][1] = o[c];
    }
}

AVX2_INLINE void tile_float(int64_t n, int nr, const void *w, size_t w_stride, const void *a,
                            size_t a_stride, float *out, size_t out_stride, int kind,
                            const int NC) {
    float stage[4][STAGE];
    __m256 acc[4][4][2]; /* [row][col][even/odd] */
    float tail[4][4] = {{0}};
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < NC; c++) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();

    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t off = 0; off < n8; off += STAGE) {
        const int64_t len = n8 - off < STAGE ? n8 - off : STAGE;
        for (int c = 0; c < NC; c++) {
            const void *arow = (const char *)a + (size_t)c * a_stride;
            for (int64_t i = 0; i < len; i += 8)
                _mm256_storeu_ps(&stage[c][i], load_x8(arow, off + i, kind));
        }
        for (int r = 0; r < nr; r++)
            float_row_slice((const char *)w + (size_t)r * w_stride, kind, off, len,
                            (const float(*)[STAGE])stage, acc[r], NC);
    }
    for (int64_t i = n8; i < n; i++)
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < NC; c++)
                tail[r][c] += load_x1((const char *)w + (size_t)r * w_stride, i, kind) *
                              load_x1((const char *)a + (size_t)c * a_stride, i, kind);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < NC; c++)
            out[(size_t)c * out_stride + (size_t)r] =
                hsum_ps(_mm256_add_ps(acc[r][c][0], acc[r][c][1])) + tail[r][c];
}

#define FLOAT_TILE(name, kind)                                                              \
    static AVX2 void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,       \
                          const void *a, size_t a_stride, float *out, size_t out_stride) { \
        switch (nc) {                                                                       \
        case 1: tile_float(n, nr, w, w_stride, a, a_stride, out, out_stride, kind, 1); break; \
        case 2: tile_float(n, nr, w, w_stride, a, a_stride, out, out_stride, kind, 2); break; \
        case 3: tile_float(n, nr, w, w_stride, a, a_stride, out, out_stride, kind, 3); break; \
        default: tile_float(n, nr, w, w_stride, a, a_stride, out, out_stride, kind, 4); break; \
        }                                                                                   \
    }
FLOAT_TILE(tile_f32, ELEM_F32)
FLOAT_TILE(tile_f16, ELEM_F16)
FLOAT_TILE(tile_bf16, ELEM_BF16)
#undef FLOAT_TILE

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
 * dot_tile for Q8_0/Q4_0. The activation scales are converted to float once
 * per call (LEGACY_STAGE blocks of each of the NC rows at a time, on the
 * stack) instead of once per weight row; a block pair then costs one
 * broadcast load and one multiply for its scale. The accumulators of all
 * nr x NC outputs persist across the stages.
 */
#define LEGACY_STAGE 128

AVX2_INLINE void legacy_stage_row(const void *wrow, int kind, int64_t ib0, int64_t len,
                                  const char *a, size_t a_stride,
                                  const float (*da)[LEGACY_STAGE], __m256 *acc, const int NC) {
    __m256 e[4];
    UNROLL for (int c = 0; c < NC; c++) e[c] = acc[c];
    for (int64_t b = 0; b < len; b++) {
        const int64_t ib = ib0 + b;
        const legacy_w w = legacy_weights(wrow, ib, kind);
        const __m256 dw = _mm256_broadcastss_ps(w.d);
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_0 *y = (const kp_block_q8_0 *)(a + (size_t)c * a_stride) + ib;
            const __m256i p = legacy_pair(w, _mm256_loadu_si256((const __m256i *)y->qs), kind);
            const __m256 d = _mm256_mul_ps(dw, _mm256_broadcast_ss(&da[c][b]));
            e[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), e[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) acc[c] = e[c];
}

AVX2_INLINE void tile_legacy(int64_t nb, int nr, const void *w, size_t w_stride, const char *a,
                             size_t a_stride, float *out, size_t out_stride, int kind,
                             const int NC) {
    float da[4][LEGACY_STAGE];
    __m256 acc[4][4];
    for (int r = 0; r < nr; r++)
        UNROLL for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t ib0 = 0; ib0 < nb; ib0 += LEGACY_STAGE) {
        const int64_t len = nb - ib0 < LEGACY_STAGE ? nb - ib0 : LEGACY_STAGE;
        UNROLL for (int c = 0; c < NC; c++) {
            const kp_block_q8_0 *y = (const kp_block_q8_0 *)(a + (size_t)c * a_stride) + ib0;
            for (int64_t b = 0; b < len; b++) da[c][b] = half_to_float(y[b].d);
        }
        for (int r = 0; r < nr; r++)
            legacy_stage_row((const char *)w + (size_t)r * w_stride, kind, ib0, len, a, a_stride,
                             (const float(*)[LEGACY_STAGE])da, acc[r], NC);
    }
    for (int r = 0; r < nr; r++)
        UNROLL for (int c = 0; c < NC; c++)
            out[(size_t)c * out_stride + (size_t)r] = hsum_ps(acc[r][c]);
}

#define LEGACY_TILE(name, kind)                                                                 \
    static AVX2 void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,           \
                          const void *a, size_t a_stride, float *out, size_t out_stride) {     \
        const int64_t nb = n / 32;                                                              \
        switch (nc) {                                                                           \
        case 1: tile_legacy(nb, nr, w, w_stride, a, a_stride, out, out_stride, kind, 1); break;  \
        case 2: tile_legacy(nb, nr, w, w_stride, a, a_stride, out, out_stride, kind, 2); break;  \
        case 3: tile_legacy(nb, nr, w, w_stride, a, a_stride, out, out_stride, kind, 3); break;  \
        default: tile_legacy(nb, nr, w, w_stride, a, a_stride, out, out_stride, kind, 4); break; \
        }                                                                                       \
    }
LEGACY_TILE(tile_q8_0, WQ8_0)
LEGACY_TILE(tile_q4_0, WQ4_0)
#undef LEGACY_TILE

/* dot_tile for the K-quants: rowfn(nb, weight row, activations, out) per row. */
#define KQUANT_TILE(name, rowfn)                                                              \
    static AVX2 void name(int64_t n, int nr, int nc, const void *w, size_t w_stride,         \
                          const void *a, size_t a_stride, float *out, size_t out_stride) {   \
        const int64_t nb = n / KP_QK_K;                                                       \
        for (int r = 0; r < nr; r++) {                                                        \
            const void *wr = (const char *)w + (size_t)r * w_stride;                          \
            switch (nc) {                                                                     \
            case 1: rowfn(nb, wr, a, a_stride, out + r, out_stride, 1); break;                \
            case 2: rowfn(nb, wr, a, a_stride, out + r, out_stride, 2); break;                \
            case 3: rowfn(nb, wr, a, a_stride, out + r, out_stride, 3); break;                \
            default: rowfn(nb, wr, a, a_stride, out + r, out_stride, 4); break;               \
            }                                                                                 \
        }                                                                                     \
    }

/* ------------------------------------------------------------------------ */
/* Q4_K weights . Q8_K activations                                           */
/* ------------------------------------------------------------------------ */

/*
 * Unpacks the 12 scale bytes with 32-bit word operations (x86 is
 * little-endian): bytes 0..7 of the result are sc[0..7], 8..15 are m[0..7].
 * Same mapping as kp_quant_q4k_unpack_scales.
 */
AVX2_INLINE __m128i q4k_scales_mins(const uint8_t packed[12]) {
    uint32_t u[3], r[4];
    memcpy(u, packed, sizeof u);
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    r[0] = u[0] & k6;                                          /* sc 0..3 */
    r[1] = (u[2] & k4) | ((u[0] >> 6) & k2) << 4;              /* sc 4..7 */
    r[2] = u[1] & k6;                                          /* m 0..3 */
    r[3] = ((u[2] >> 4) & k4) | ((u[1] >> 6) & k2) << 4;       /* m 4..7 */
    return _mm_loadu_si128((const __m128i *)r);
}

/* One Q4_K weight row against NC Q8_K activation rows. */
AVX2_INLINE void row_q4_K(int64_t nb, const void *wrow, const char *a, size_t a_stride, float *out,
                          size_t out_stride, const int NC) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();

    for (int64_t i = 0; i < nb; i++) {
        const kp_block_q4_K *x = (const kp_block_q4_K *)wrow + i;
        const __m128i scm = q4k_scales_mins(x->scales);
        /* 8 scales as int16, in both 128-bit lanes */
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
        /* mins duplicated per pair of bsums: m0 m0 m1 m1 ... m7 m7 as int16 */
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
            scm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
        const float dx = half_to_float(x->d), dminx = half_to_float(x->dmin);

        __m256i sumi[4];
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
            const __m256i pm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins16);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y->d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_set1_ps(dminx * y->d), _mm256_cvtepi32_ps(pm), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) out[(size_t)c * out_stride] = hsum_ps(acc[c]);
}

KQUANT_TILE(tile_q4_K, row_q4_K)

static AVX2 void vec_dot_q4_K(int64_t n, float *s, const void *w, const void *a) {
    row_q4_K(n / KP_QK_K, w, a, 0, s, 0, 1);
}

/* ------------------------------------------------------------------------ */
/* Q6_K weights . Q8_K activations                                           */
/* ------------------------------------------------------------------------ */

/* One Q6_K weight row against NC Q8_K activation rows. */
AVX2_INLINE void row_q6_K(int64_t nb, const void *wrow, const char *a, size_t a_stride, float *out,
                          size_t out_stride, const int NC) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    UNROLL for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();

    for (int64_t i = 0; i < nb; i++) {
        const kp_block_q6_K *x = (const kp_block_q6_K *)wrow + i;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
        const float dx = half_to_float(x->d);

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
            const __m256i tot = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(corr, 5));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y->d), _mm256_cvtepi32_ps(tot), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < NC; c++) out[(size_t)c * out_stride] = hsum_ps(acc[c]);
}

KQUANT_TILE(tile_q6_K, row_q6_K)

static AVX2 void vec_dot_q6_K(int64_t n, float *s, const void *w, const void *a) {
    row_q6_K(n / KP_QK_K, w, a, 0, s, 0, 1);
}

#undef KQUANT_TILE

/* ------------------------------------------------------------------------ */
/* activation conversion (bit-identical to the reference quantizers)         */
/* ------------------------------------------------------------------------ */

AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* roundf() on 8 lanes: round half away from zero. */
AVX2_INLINE __m256 round_half_away(__m256 t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, tr)); /* |t - trunc t|, exact */
    const __m256 ge_half = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(t, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(tr, _mm256_and_ps(ge_half, one));
}

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

static const kp_kernels kernels_avx2 = {
    .name = "avx2",
    .quantize_act =
        {
            [KP_DTYPE_F32] = act_f32,
            [KP_DTYPE_F16] = act_f16,
            [KP_DTYPE_BF16] = act_bf16,
            [KP_DTYPE_Q8_0] = act_q8_0,
            [KP_DTYPE_Q4_0] = act_q8_0,
            [KP_DTYPE_Q4_K] = act_q8_K,
            [KP_DTYPE_Q6_K] = act_q8_K,
        },
    .vec_dot =
        {
            [KP_DTYPE_F32] = vec_dot_f32,
            [KP_DTYPE_F16] = vec_dot_f16,
            [KP_DTYPE_BF16] = vec_dot_bf16,
            [KP_DTYPE_Q8_0] = vec_dot_q8_0,
            [KP_DTYPE_Q4_0] = vec_dot_q4_0,
            [KP_DTYPE_Q4_K] = vec_dot_q4_K,
            [KP_DTYPE_Q6_K] = vec_dot_q6_K,
        },
    .dot_tile =
        {
            [KP_DTYPE_F32] = tile_f32,
            [KP_DTYPE_F16] = tile_f16,
            [KP_DTYPE_BF16] = tile_bf16,
            [KP_DTYPE_Q8_0] = tile_q8_0,
            [KP_DTYPE_Q4_0] = tile_q4_0,
            [KP_DTYPE_Q4_K] = tile_q4_K,
            [KP_DTYPE_Q6_K] = tile_q6_K,
        },
    .dot_f32 = dot_f32,
    .dot_f32_f16 = dot_f32_f16,
    .axpy_f32 = axpy_f32,
    .axpy_f16 = axpy_f16,
};

const kp_kernels *kp_quant_avx2_table(void) { return &kernels_avx2; }

AVX2 void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16x8(x + i));
    for (; i < n; i++) y[i] = half_to_float(x[i]);
}

#else /* not x86-64: no AVX2 table */

const kp_kernels *kp_quant_avx2_table(void) { return NULL; }

void kp_quant_avx2_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kp_fp16_to_fp32(x[i]);
}

#endif
