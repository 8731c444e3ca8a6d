/*
 * model.h - a loaded model: hyperparameters and views of the weights.
 *
 * The model never copies its weights: every kp_weight points into the GGUF
 * mapping and is used in place by the kernels of its type (a forward pass
 * may keep repacked copies of some, kp_forward_pack_weights). Only the small 1-D tensors
 * (norm weights, biases, RoPE frequency factors) are decoded into owned F32
 * arrays, whatever type the file stores them in.
 *
 * Supported architectures: llama (Llama 2/3, Mistral, SmolLM: NORM rope,
 * optional rope_freqs.weight, linear rope scaling), qwen2 (q/k/v biases, NEOX
 * rope), qwen3 (per-head q_norm/k_norm, NEOX rope), gemma3 (sliding-window
 * layers, two rope bases, q/k norms, post-attention and post-FFN norms,
 * GELU-tanh FFN, embeddings scaled by sqrt(n_embd), Q scaled before the
 * product, optional final logit soft-cap), qwen3moe (qwen3's attention, and
 * in every layer a mixture of experts instead of the FFN, see Experts
 * below), gpt-oss (llama.cpp's openai-moe: q/k/v and output biases,
 * per-head attention sinks, YaRN rope, alternating WINDOW and FULL layers,
 * experts with biases and a clamped SwiGLU, see Experts and Sinks below),
 * qwen35 (Qwen3.5: RECURRENT gated delta-net layers and gated FULL
 * attention layers, see Hybrid below), qwen35moe (Qwen3.5 MoE: qwen35's
 * layers with qwen3moe's experts and a gated shared expert instead of the
 * FFN, see Shared expert below).
 * Anything else, or a missing or
 * mis-shaped tensor or key, is refused at load time with a message that
 * names it.
 *
 * Layer kinds. What differs between the layers of one model is a kind per
 * layer (kp_layer.kind), not a branch on the architecture: a FULL layer
 * attends to every earlier position with rope (rope_base, rope_freq_scale);
 * a WINDOW layer attends to the last n_swa positions only (the query's own
 * included: key p is seen from query q iff q - n_swa < p <= q, llama.cpp's
 * LLAMA_SWA_TYPE_STANDARD) with rope (rope_base_swa, rope_freq_scale_swa).
 * gemma3's pattern (llama.cpp set_swa_pattern, dense_first false): with
 * period P (attention.sliding_window_pattern, default 6) layer l is a
 * WINDOW layer iff l % P < P - 1, so every P-th layer is FULL; P = 0 makes
 * every layer a WINDOW layer; an array of bools gives each layer's kind.
 * gpt-oss: the same rule with period 2 by default, so even layers are
 * WINDOW layers, odd ones FULL.
 * No sliding_window key (or 0): every layer is FULL. Every layer, of either
 * kind, keeps the K/V of every position in the pool (see forward.c): the
 * window only limits what a query reads (a window budget, engine.c, drops
 * the WINDOW layers' rows where no resume point of the cache needs them).
 *
 * Experts (qwen3moe, llama.cpp's build_moe_ffn with softmax gating and
 * norm_w): a layer's FFN is n_expert SwiGLU FFNs of width n_ff_exp and a
 * router (ffn_gate_inp, n_embd -> n_expert). Per token: p = softmax(router
 * logits), the n_expert_used experts of highest p (ties to the lower id),
 * their weights p_e / max(sum of the chosen p, 2^-14), and the FFN output
 * is the weighted sum of the chosen experts' outputs. The experts are 3-D
 * tensors: n_expert matrices one after the other, each as a 2-D weight
 * (kp_expert_matrix), so the kernels of every 2-D type serve them and read
 * the chosen experts' rows only.
 *
 * gpt-oss's experts (llama.cpp's SOFTMAX_WEIGHT gating, LLM_FFN_SWIGLU_OAI_MOE):
 * router logits + b_router; the n_expert_used experts of highest logit;
 * their weights the softmax of those k logits. Each expert adds its bias
 * after each product (gate, up, down), and the activation is
 *   x = min(gate, limit), y = clamp(up, -limit, limit),
 *   act = x / (1 + exp(-alpha x)) * (y + 1)          (alpha 1.702, limit 7).
 *
 * Hybrid (qwen35 and qwen35moe, llama.cpp's llama_model_qwen35 and
 * llama_model_qwen35moe). Three of every four
 * layers (full_attention_interval, or the recurrent_layers array) are
 * RECURRENT: a gated delta-net (deltanet.h) whose state per sequence is a
 * matrix per value head and the last ssm_d_conv - 1 inputs of a causal
 * convolution; they keep no K/V. The others are FULL attention layers whose
 * q projection yields, per head, the query then an output gate (the
 * attention's output is multiplied by sigmoid(gate) before wo), with q/k
 * norms and rotary embedding on the first n_rot dims of a head only. Both
 * kinds have attn_norm before the mixer and post_attention_norm before the
 * FFN (in ffn_norm here). The pool holds K/V for the FULL layers only:
 * kp_layer.kv_layer is a layer's index among the pool's n_kv_layer layers.
 * The rope is llama.cpp's IMROPE: pair i of the rotated dims is in sector
 * i % (sum of rope_sections), and a sector none of the first three
 * sections claims (interleaved: sector s belongs to section s % 3 when s <
 * 3 x that section's size) takes the fourth position, which is 0 for text:
 * that pair is not rotated. Every other pair rotates by the token's position.
 *
 * Shared expert (qwen35moe, llama.cpp's llama_model_qwen35moe::build_layer_ffn).
 * Every layer's FFN is qwen3moe's routed experts (softmax, top k, weights
 * renormalized as above) plus one dense SwiGLU FFN of width n_ff_shexp that
 * every token goes through, scaled per token by sigmoid(xn . gate_inp_shexp):
 *   ffn = sum_j w_j expert_j(xn) + sigmoid(xn . g) x shexp(xn)
 * (the routed sum first, in rank order, then the gated shared output added,
 * as llama.cpp's graph adds them).
 *
 * Sinks (gpt-oss): head h's softmax has one more logit, attn_sinks[h], in
 * its denominator and nothing in its numerator: weights
 * exp(s_j) / (sum_i exp(s_i) + exp(sink_h)) (the sink is not scaled), so a
 * head may attend to nothing.
 */
#ifndef KP_MODEL_H
#define KP_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/dtype.h"
#include "gguf/gguf.h"
#include "base/status.h"

typedef enum {
    KP_ARCH_LLAMA, KP_ARCH_QWEN2, KP_ARCH_QWEN3, KP_ARCH_GEMMA3, KP_ARCH_QWEN3MOE, KP_ARCH_GPTOSS, KP_ARCH_QWEN35,
    KP_ARCH_QWEN35MOE
} kp_arch;
typedef enum { KP_ROPE_NORM, KP_ROPE_NEOX } kp_rope_type;
/* What a layer's attention sees (see the top of this file); a RECURRENT
 * layer has no attention and no K/V (Hybrid above). */
typedef enum { KP_LAYER_FULL, KP_LAYER_WINDOW, KP_LAYER_RECURRENT } kp_layer_kind;
/* The gate's activation of the feed-forward block: silu(gate) * up
 * (SwiGLU), or gelu_tanh(gate) * up (GeGLU, as ggml's geglu: the GELU of
 * gate rounded to F16, looked up in an F16 table, for |gate| < 10). */
typedef enum { KP_FFN_SILU, KP_FFN_GELU_TANH } kp_ffn_act;
/* How the router picks and weighs a token's experts (see Experts above). */
typedef enum {
    KP_GATE_SOFTMAX,        /* softmax over all experts, top-k, weights renormalized (qwen3moe) */
    KP_GATE_SOFTMAX_TOPK,   /* top-k of the logits, softmax over the k chosen (gpt-oss) */
} kp_gate;

/* A 2-D weight in ggml order: n_out rows of n_in elements, each row
 * row_bytes long, rows contiguous. Borrowed from the mapping. A forward
 * pass may hold copies whose data is repacked for its kernel table
 * (packed: the kp_kernels pack layout of type, kp_forward_pack_weights);
 * the model's own weights never are. */
typedef struct {
    kp_dtype type;
    int64_t n_in;   /* ne[0]: the row length (input size) */
    int64_t n_out;  /* ne[1]: rows (output size) */
    size_t row_bytes;
    const void *data;
    bool packed;
} kp_weight;

/* A 3-D weight of n_expert matrices (ggml ne[2] = n_expert), each n_out
 * rows of n_in elements, matrix e at data + e x mat_bytes. Borrowed from
 * the mapping; the forward pass may hold a copy whose matrices are each
 * repacked (packed, as kp_weight, mat_bytes then the packed matrix's
 * size rounded up to 64 bytes). */
typedef struct {
    kp_dtype type;
    int64_t n_in, n_out;
    uint32_t n_expert;
    size_t row_bytes;
    size_t mat_bytes;   /* n_out x row_bytes (packed: the packed matrix's stride) */
    const void *data;
    bool packed;
} kp_experts;

typedef struct {
    kp_arch arch;
    const char *arch_name;
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    uint32_t n_layer_nextn;  /* blocks past n_layer in the file: multi-token-prediction layers, not run */
    uint32_t n_rot;          /* rotated dims per head (rope.dimension_count) */
    float rms_eps;
    float rope_base;
    float rope_freq_scale;   /* 1 / linear scaling factor */
    kp_rope_type rope_type;
    bool tied_output;        /* output projection is token_embd */
    /* sliding windows (0 / unused when every layer is FULL) */
    uint32_t n_swa;          /* WINDOW layers see this many positions, their own included */
    uint32_t n_swa_layers;   /* how many layers are WINDOW layers */
    float rope_base_swa;     /* rope of WINDOW layers */
    float rope_freq_scale_swa;
    /* attention, embeddings, output */
    float attn_scale;        /* scores = (q . k) * attn_scale; 1/sqrt(head_dim) unless the arch says */
    bool attn_scale_on_q;    /* q is multiplied by attn_scale before the product (gemma3, as llama.cpp) */
    float embd_scale;        /* token embeddings are multiplied by this (gemma3: sqrtf(n_embd)); 1: none */
    float logit_softcap;     /* logits = softcap * tanh(logits / softcap); 0: none */
    kp_ffn_act ffn_act;
    bool post_norms;         /* post_attention_norm and post_ffw_norm on each block's output (gemma3) */
    /* experts (0 when the FFN is dense) */
    uint32_t n_expert;       /* experts per layer */
    uint32_t n_expert_used;  /* experts a token is routed to */
    uint32_t n_ff_exp;       /* an expert's FFN width */
    kp_gate gate;
    uint32_t n_ff_shexp;     /* the shared expert's FFN width (qwen35moe); 0: no shared expert */
    float swiglu_limit;      /* > 0: the experts' clamped SwiGLU (gpt-oss: 7, with alpha 1.702) */
    float swiglu_alpha;
    /* YaRN rope scaling (rope.scaling.type yarn; rope_yarn false otherwise) */
    bool rope_yarn;
    uint32_t yarn_n_ctx_orig;   /* rope.scaling.original_context_length */
    float yarn_beta_fast, yarn_beta_slow;
    float yarn_attn_factor;  /* llama.cpp's cparams.yarn_attn_factor; rope scales cos, sin by it
                                x (1 + 0.1 ln(1 / freq_scale)) */
    /* layers with K/V in the pool: n_layer less the RECURRENT ones */
    uint32_t n_kv_layer;
    /* hybrid (qwen35, qwen35moe; 0 otherwise, see Hybrid above) */
    uint32_t n_rec_layers;   /* RECURRENT layers */
    uint32_t ssm_d_conv;     /* ssm.conv_kernel: taps of the causal convolution */
    uint32_t ssm_d_inner;    /* ssm.inner_size: ssm_d_state x ssm_n_v_head */
    uint32_t ssm_d_state;    /* ssm.state_size: a head's key and value width */
    uint32_t ssm_n_v_head;   /* ssm.time_step_rank: value heads (one state matrix each) */
    uint32_t ssm_n_k_head;   /* ssm.group_count: q/k heads; value head h reads q/k head h % this */
    bool attn_gated;         /* q projection = per head [query | output gate] (qwen35) */
    bool rope_imrope;        /* pairs rotate as IMROPE with rope_sections (qwen35) */
    int32_t rope_sections[4];
} kp_hparams;

typedef struct {
    float *attn_norm;               /* [n_embd] */
    kp_weight wq;                   /* n_embd -> n_head*head_dim */
    kp_weight wk, wv;               /* n_embd -> n_head_kv*head_dim */
    kp_weight wo;                   /* n_head*head_dim -> n_embd */
    float *bq, *bk, *bv;            /* qwen2 and gpt-oss biases, NULL otherwise */
    float *bo;                      /* [n_embd] attn_output.bias (gpt-oss), or NULL */
    float *attn_sinks;              /* [n_head] per-head sink logits (gpt-oss), or NULL */
    float *q_norm, *k_norm;         /* qwen3/gemma3 per-head norms [head_dim], NULL otherwise */
    float *attn_post_norm;          /* [n_embd] post_attention_norm, on the attention output (gemma3), or NULL */
    float *ffn_post_norm;           /* [n_embd] post_ffw_norm, on the FFN output (gemma3), or NULL */
    kp_layer_kind kind;             /* FULL or WINDOW (hp.n_swa positions) */
    float *ffn_norm;                /* [n_embd] */
    kp_weight w_gate, w_up;         /* n_embd -> n_ff */
    kp_weight w_down;               /* n_ff -> n_embd */
    /* experts (hp.n_expert > 0; then w_gate/w_up/w_down are empty) */
    kp_weight w_router;             /* ffn_gate_inp: n_embd -> n_expert */
    kp_experts e_gate, e_up;        /* n_expert x (n_embd -> n_ff_exp) */
    kp_experts e_down;              /* n_expert x (n_ff_exp -> n_embd) */
    float *b_router;                /* [n_expert] router bias (gpt-oss), or NULL */
    float *b_gate_exps, *b_up_exps; /* [n_expert][n_ff_exp] expert biases (gpt-oss), or NULL */
    float *b_down_exps;             /* [n_expert][n_embd] */
    /* the shared expert (hp.n_ff_shexp > 0, qwen35moe) */
    kp_weight w_gate_shexp, w_up_shexp; /* n_embd -> n_ff_shexp */
    kp_weight w_down_shexp;         /* n_ff_shexp -> n_embd */
    float *gate_inp_shexp;          /* [n_embd] its per-token gate: sigmoid(xn . this) */
    uint32_t kv_layer;              /* FULL / WINDOW: the layer's index in the KV pool */
    /* RECURRENT (gated delta-net) layers; Dk = ssm_d_state x ssm_n_k_head,
     * Dv = ssm_d_inner, C = 2 Dk + Dv (the convolution's channels) */
    kp_weight w_qkv;                /* attn_qkv: n_embd -> C, per token [q | k | v] */
    kp_weight w_z;                  /* attn_gate: n_embd -> Dv, the output norm's gate */
    kp_weight w_beta, w_alpha;      /* ssm_beta, ssm_alpha: n_embd -> ssm_n_v_head */
    kp_weight w_ssm_out;            /* ssm_out: Dv -> n_embd */
    float *ssm_conv;                /* [C][ssm_d_conv] ssm_conv1d.weight, oldest tap first */
    float *ssm_dt;                  /* [ssm_n_v_head] ssm_dt.bias */
    float *ssm_a;                   /* [ssm_n_v_head] ssm_a (-exp(A_log), as converted) */
    float *ssm_norm;                /* [ssm_d_state] gated RMS norm weight */
} kp_layer;

typedef struct kp_model {
    kp_gguf *file;                     /* owned */
    kp_hparams hp;
    kp_weight tok_embd;             /* n_embd x n_vocab (one row per token) */
    float *output_norm;             /* [n_embd] */
    kp_weight output;               /* n_embd -> n_vocab (== tok_embd when tied) */
    float *rope_freqs;              /* [n_rot/2] divisors of theta, or NULL */
    kp_layer *layers;               /* [n_layer] */
    uint64_t weight_bytes;          /* bytes of all tensors in the file */
} kp_model;

/* Opens and validates a model file. On success *out owns the mapping;
 * free with kp_model_free. */
kp_status kp_model_load(kp_model **out, const char *path, kp_error *err);

/* Builds a model over an already opened GGUF, taking ownership of g (also on
 * failure). */
kp_status kp_model_from_gguf(kp_model **out, kp_gguf *g, kp_error *err);

void kp_model_free(kp_model *m);

/* KV bytes per token: 2 x n_kv_layer x n_head_kv x head_dim x bytes(kv_type),
 * where a block type's bytes per value are its block size over 32 (Q8_0:
 * 34/32, Q4_0: 18/32); 0 when head_dim is not a multiple of the block. */
uint64_t kp_model_kv_bytes_per_token(const kp_hparams *hp, kp_dtype kv_type);
/* The same with K and V of their own types: n_kv_layer x n_head_kv x
 * (row bytes of head_dim K values + row bytes of head_dim V values). */
uint64_t kp_model_kv_bytes_per_token_kv(const kp_hparams *hp, kp_dtype k_type, kp_dtype v_type);

const char *kp_arch_name(kp_arch a);

/* Expert e's matrix of x (e < x->n_expert) as a 2-D weight view. */
kp_weight kp_expert_matrix(const kp_experts *x, uint32_t e);

/* KV bytes a token costs in the layers of one kind (the sum of FULL and
 * WINDOW is kp_model_kv_bytes_per_token_kv; RECURRENT layers cost 0): every layer keeps every position's
 * K/V, so this is the per-token bill, not a window's worth. */
uint64_t kp_model_kv_bytes_per_token_kind(const kp_model *m, kp_layer_kind kind, kp_dtype k_type, kp_dtype v_type);

/* Floats of one sequence's recurrent state: for each RECURRENT layer, the
 * last ssm_d_conv - 1 inputs of its convolution (C each) and a
 * ssm_d_state x ssm_d_state matrix per value head; 0 without such layers. */
uint64_t kp_model_rec_state_floats(const kp_hparams *hp);
/* ... of one RECURRENT layer's share, and where its matrices start in it. */
uint64_t kp_model_rec_layer_floats(const kp_hparams *hp);
uint64_t kp_model_rec_conv_floats(const kp_hparams *hp);

#endif
