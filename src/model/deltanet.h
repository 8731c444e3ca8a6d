/*
 * deltanet.h - the gated delta-net mixer of qwen35's RECURRENT layers
 * (model.h, Hybrid), as llama.cpp computes it on the CPU (its
 * build_layer_attn_linear and the fused GATED_DELTA_NET op).
 *
 * The forward pass (forward.c) does the input projections and the output
 * projection; this module does what lies between, for a batch of tokens of
 * one or more sequences, each sequence's tokens in position order. With
 * Dk = ssm_d_state x ssm_n_k_head, Dv = ssm_d_inner, C = 2 Dk + Dv,
 * H = ssm_n_v_head value heads of S = ssm_d_state, K = ssm_d_conv:
 *
 *   qkv   = xn @ attn_qkv                  [C] per token: q (Dk) | k (Dk) | v (Dv)
 *   qkv   = silu(causal conv(qkv))         channel c: sum_k w[c][k] x_(t-K+1+k)[c], the
 *                                          K - 1 inputs before the batch from the state
 *   q, k  = l2norm per q/k head (x / sqrt(sum x^2 + eps), as ggml's rms_norm with eps/S
 *           then a scale by 1/sqrt(S))
 *   beta  = sigmoid(xn @ ssm_beta)         [H]
 *   g     = softplus(xn @ ssm_alpha + ssm_dt) * ssm_a          [H] (ssm_a < 0: a decay)
 *   per value head h, with q/k head h % ssm_n_k_head (llama.cpp repeats the q/k heads
 *   as tiles), state M (S x S, M[j][i] = llama.cpp's S[i][j]), token by token:
 *     M *= exp(g);  d[j] = (v[j] - M[j] . k) * beta;  M[j] += d[j] k;
 *     o[j] = (M[j] . q) / sqrt(S)
 *   out   = rmsnorm(o per head) * ssm_norm * silu(z),  z = xn @ attn_gate      [Dv]
 *
 * then forward.c multiplies out by ssm_out. Prefill and decode are the same
 * code: the recurrence runs token after token inside the batch (llama.cpp's
 * CPU op does the same; its chunked form is for other backends), so a
 * prompt computed in any split gives the same state and outputs.
 *
 * A sequence's state for one layer (kp_model_rec_layer_floats floats): the
 * convolution's last K - 1 inputs, oldest first ([K - 1][C]), then the H
 * matrices ([H][S][S], M[j] contiguous). All zeros is the state before
 * position 0.
 */
#ifndef KP_DELTANET_H
#define KP_DELTANET_H

#include <stdint.h>

#include "base/threadpool.h"
#include "kernels/attn.h"
#include "model/model.h"

typedef struct {
    const kp_hparams *hp;
    const kp_layer *L;           /* a RECURRENT layer */
    const kp_attn_kernels *ak;   /* swiglu_row: ggml's vector SiLU */
    float (*dot)(int64_t n, const float *x, const float *y); /* the kernel table's dot_f32 */
    kp_threads *threads;
    int32_t n;                   /* tokens */
    const int32_t *seq;          /* [n] each token's sequence; a sequence's tokens in position order */
    int32_t n_seqs;
    float **state;               /* [n_seqs] each sequence's state for this layer */
    float *qkv;                  /* [n][C] the attn_qkv projections, consumed */
    float *z;                    /* [n][Dv] the attn_gate projections, consumed */
    float *beta, *alpha;         /* [n][H] the ssm_beta, ssm_alpha projections, consumed */
    float *out;                  /* [n][Dv] out: what ssm_out multiplies */
    const float *ones;           /* [max(C, S)] 1.0f each (a SiLU through swiglu_row) */
    float *scratch;              /* [C] */
} kp_dn_batch;

/* Runs the mixer over the batch, updating each sequence's state. */
void kp_dn_run(const kp_dn_batch *b);

#endif
