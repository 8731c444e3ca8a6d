/*
 * quant_more.c - Q4_1, Q5_0, Q5_1 and Q5_K weights: the portable kernels
 * (block layouts in quant_blocks.h; the reference code in quant_ref.c).
 *
 *   - Scalar kernels: integer dot products inside a block, float
 *     accumulation across blocks; dot_tile is nr*nc vec_dot calls.
 *
 * Invariants: no mutable state, every function reentrant.
 */
#include "kernels/quant_more.h"

#include <string.h>

#include "kernels/quant_impl.h"

static inline float half(uint16_t h) { return kp_fp16_to_fp32(h); }

/* ------------------------------------------------------------------------ */
/* scalar kernels                                                            */
/* ------------------------------------------------------------------------ */

void kp_qmore_vec_dot_q4_1_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q4_1 *x = w;
    const kp_block_q8_1 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (x[i].qs[j] & 0xF) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        }
        sumf += half(x[i].d) * half(y[i].d) * sumi + half(x[i].m) * half(y[i].s);
    }
    *s = sumf;
}

void kp_qmore_vec_dot_q5_0_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_0 *x = w;
    const kp_block_q8_0 *y = a;
    uint8_t q[32];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK5_0; i++) {
        unpack_q5(x[i].qh, x[i].qs, q);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += (q[j] - 16) * y[i].qs[j];
        sumf += sumi * (half(x[i].d) * half(y[i].d));
    }
    *s = sumf;
}

void kp_qmore_vec_dot_q5_1_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_1 *x = w;
    const kp_block_q8_1 *y = a;
    uint8_t q[32];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK5_1; i++) {
        unpack_q5(x[i].qh, x[i].qs, q);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += q[j] * y[i].qs[j];
        sumf += half(x[i].d) * half(y[i].d) * sumi + half(x[i].m) * half(y[i].s);
    }
    *s = sumf;
}

void kp_qmore_vec_dot_q5_K_scalar(int64_t n, float *s, const void *w, const void *a) {
    const kp_block_q5_K *x = w;
    const kp_block_q8_K *y = a;
    uint8_t q[KP_QK_K];
    float sumf = 0;
    for (int64_t i = 0; i < n / KP_QK_K; i++) {
        uint8_t sc[8], m[8];
        unpack_k_scales(x[i].scales, sc, m);
        unpack_q5_K(&x[i], q);
        int sumi = 0;
        for (int j = 0; j < 8; j++) {
            int sub = 0;
            for (int l = 0; l < 32; l++) sub += q[32 * j + l] * y[i].qs[32 * j + l];
            sumi += sc[j] * sub;
        }
        int summ = 0;
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sumf += y[i].d * half(x[i].d) * sumi - y[i].d * half(x[i].dmin) * summ;
    }
    *s = sumf;
}

typedef void (*vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);

static void tile_by_vec_dot(vec_dot_fn dot, int64_t n, int nr, int nc, const void *w,
                            size_t w_stride, const void *a, size_t a_stride, float *out,
                            size_t out_stride) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            dot(n, &out[(size_t)c * out_stride + (size_t)r], (const char *)w + (size_t)r * w_stride,
                (const char *)a + (size_t)c * a_stride);
}

#define SCALAR_TILE(type)                                                                     \
    void kp_qmore_tile_##type##_scalar(int64_t n, int nr, int nc, const void *w,             \
                                       size_t w_stride, const void *a, size_t a_stride,      \
                                       float *out, size_t out_stride) {                      \
        tile_by_vec_dot(kp_qmore_vec_dot_##type##_scalar, n, nr, nc, w, w_stride, a, a_stride, \
                        out, out_stride);                                                    \
    }
SCALAR_TILE(q4_1)
SCALAR_TILE(q5_0)
SCALAR_TILE(q5_1)
SCALAR_TILE(q5_K)
#undef SCALAR_TILE
