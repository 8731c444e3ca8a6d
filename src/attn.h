/*
 * attn.h - the inner loops of attention over cached K/V rows (floor 1:
 * kernels; pure functions on plain arrays).
 *
 * One call handles a run of consecutive cached positions of one kv-head for
 * the G query heads that share it (grouped-query attention), so each K or V
 * row is loaded and converted from F16 once for all G heads:
 *
 *   scores:  out[g*out_stride + i] = scale * dot(q[g*hd .. +hd], K[i*hd .. +hd])
 *   accum:   acc[g*hd + j] += sum_i w[g*w_stride + i] * V[i*hd + j]
 *
 * for g < G, i < n_rows, j < hd. K and V rows are F32 or F16 (IEEE half).
 */
#ifndef KP_ATTN_H
#define KP_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;
    void (*scores_f32)(int hd, int G, const float *q, const float *k, int64_t n_rows, float scale,
                       float *out, int64_t out_stride);
    void (*scores_f16)(int hd, int G, const float *q, const uint16_t *k, int64_t n_rows, float scale,
                       float *out, int64_t out_stride);
    void (*accum_f32)(int hd, int G, const float *w, int64_t w_stride, const float *v,
                      int64_t n_rows, float *acc);
    void (*accum_f16)(int hd, int G, const float *w, int64_t w_stride, const uint16_t *v,
                      int64_t n_rows, float *acc);
} kp_attn_kernels;

/* Portable C; always available. */
const kp_attn_kernels *kp_attn_scalar(void);
/* AVX2+FMA+F16C when the CPU has them and hd is a multiple of 8 is handled
 * inside (other hd fall back per call), else the scalar table. */
const kp_attn_kernels *kp_attn_best(void);

#endif
