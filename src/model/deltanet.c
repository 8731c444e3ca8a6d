/*
 * deltanet.c - the gated delta-net mixer (see deltanet.h for the math and
 * the state layout).
 *
 * Order of work for a batch: the gates of every token; per sequence, the
 * convolution over its tokens in order (cheap: K multiply-adds a channel),
 * the q/k L2 norms; then the recurrence, one task per (sequence, value
 * head) across the thread pool (each task owns one S x S matrix, so no two
 * tasks write the same memory); then the gated norm per token. Rounding
 * follows ggml's CPU ops where it matters: the convolution sums its taps
 * in order from 0, norms sum squares in double, SiLU is the kernel table's
 * (ggml's vector SiLU), sigmoid and softplus use expf and logf.
 */
#include "model/deltanet.h"

#include <math.h>
#include <string.h>

/* x / sqrt(sum x^2 + eps) over n values, as ggml_rms_norm(x, eps / n)
 * then ggml_scale(1 / sqrt(n)) (llama.cpp's build_gdn_l2_norm). */
static void l2norm(float *x, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    const float mean = (float)(ss / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps / (float)n), post = 1.0f / sqrtf((float)n);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * scale * post;
}

/* The convolution, SiLU and L2 norms over sequence s's tokens, in order. */
static void conv_seq(const kp_dn_batch *b, int32_t s) {
    const kp_hparams *hp = b->hp;
    const int64_t S = hp->ssm_d_state, Dk = S * hp->ssm_n_k_head, C = 2 * Dk + hp->ssm_d_inner;
    const int64_t K = hp->ssm_d_conv;
    float *tail = b->state[s], *y = b->scratch; /* tail: [K - 1][C], oldest first */
    const float *w = b->L->ssm_conv;           /* [C][K] */
    for (int32_t t = 0; t < b->n; t++) {
        if (b->seq[t] != s) continue;
        float *x = b->qkv + (size_t)t * C;
        for (int64_t c = 0; c < C; c++) {
            const float *wc = w + c * K;
            float sum = 0.0f;
            for (int64_t k = 0; k < K - 1; k++) sum += tail[k * C + c] * wc[k];
            sum += x[c] * wc[K - 1];
            y[c] = sum;
        }
        if (K > 1) { /* the tail keeps this token's raw input */
            memmove(tail, tail + C, (size_t)(K - 2) * C * sizeof *tail);
            memcpy(tail + (K - 2) * C, x, (size_t)C * sizeof *x);
        }
        memcpy(x, y, (size_t)C * sizeof *x);
        b->ak->swiglu_row(x, b->ones, C); /* silu(x) * 1 */
        for (int64_t h = 0; h < 2 * (int64_t)hp->ssm_n_k_head; h++) l2norm(x + h * S, S, hp->rms_eps);
    }
}

typedef struct {
    const kp_dn_batch *b;
    int32_t n_seqs;
} rec_ctx;

/* Task (sequence, value head): the delta rule over the sequence's tokens. */
static void rec_task(void *vctx, int task, int thread) {
    (void)thread;
    const rec_ctx *c = vctx;
    const kp_dn_batch *b = c->b;
    const kp_hparams *hp = b->hp;
    const int64_t S = hp->ssm_d_state, H = hp->ssm_n_v_head, Dk = S * hp->ssm_n_k_head;
    const int64_t C = 2 * Dk + hp->ssm_d_inner, Dv = hp->ssm_d_inner;
    const int32_t s = task / (int32_t)H;
    const int64_t h = task % H, hk = h % hp->ssm_n_k_head;
    const float scale = 1.0f / sqrtf((float)S);
    if (!b->state[s]) return; /* the sequence has no token in the batch */
    float *M = b->state[s] + (hp->ssm_d_conv - 1) * C + h * S * S;
    for (int32_t t = 0; t < b->n; t++) {
        if (b->seq[t] != s) continue;
        const float *x = b->qkv + (size_t)t * C;
        const float *q = x + hk * S, *k = x + Dk + hk * S, *v = x + 2 * Dk + h * S;
        const float decay = expf(b->alpha[(size_t)t * H + h]), beta = b->beta[(size_t)t * H + h];
        float *o = b->out + (size_t)t * Dv + h * S;
        for (int64_t i = 0; i < S * S; i++) M[i] *= decay;
        /* llama.cpp takes every d[j] before it updates a row; row j's d and update read row j only */
        for (int64_t j = 0; j < S; j++) {
            float *m = M + j * S;
            const float dj = (v[j] - b->dot(S, m, k)) * beta;
            for (int64_t i = 0; i < S; i++) m[i] += k[i] * dj;
        }
        for (int64_t j = 0; j < S; j++) o[j] = b->dot(S, M + j * S, q) * scale;
    }
}

void kp_dn_run(const kp_dn_batch *b) {
    const kp_hparams *hp = b->hp;
    const kp_layer *L = b->L;
    const int64_t S = hp->ssm_d_state, H = hp->ssm_n_v_head, Dv = hp->ssm_d_inner;
    /* gates: beta = sigmoid(.), alpha -> g = softplus(. + dt) * a */
    for (int32_t t = 0; t < b->n; t++) {
        float *bt = b->beta + (size_t)t * H, *at = b->alpha + (size_t)t * H;
        for (int64_t h = 0; h < H; h++) {
            bt[h] = 1.0f / (1.0f + expf(-bt[h]));
            const float x = at[h] + L->ssm_dt[h];
            const float sp = x > 20.0f ? x : logf(1.0f + expf(x));
            at[h] = sp * L->ssm_a[h];
        }
    }
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->state[s]) conv_seq(b, s);
    rec_ctx c = {b, b->n_seqs};
    /* a sequence without tokens in the batch has no state pointer: its tasks find no token */
    kp_threads_run(b->threads, rec_task, &c, b->n_seqs * (int)H);
    /* out = rmsnorm(o) * ssm_norm * silu(z), per head */
    for (int32_t t = 0; t < b->n; t++) {
        for (int64_t h = 0; h < H; h++) {
            float *o = b->out + (size_t)t * Dv + h * S, *z = b->z + (size_t)t * Dv + h * S;
            double ss = 0;
            for (int64_t i = 0; i < S; i++) ss += (double)(o[i] * o[i]);
            const float mean = (float)(ss / (double)S), scale = 1.0f / sqrtf(mean + hp->rms_eps);
            for (int64_t i = 0; i < S; i++) o[i] = o[i] * scale * L->ssm_norm[i];
            b->ak->swiglu_row(z, o, S); /* z = silu(z) * o */
            memcpy(o, z, (size_t)S * sizeof *o);
        }
    }
}
