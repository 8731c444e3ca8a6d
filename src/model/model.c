/*
 * model.c - hyperparameters and weight views from a GGUF file (see model.h).
 *
 * Metadata keys read (ARCH = general.architecture):
 *
 *   key                                   default            meaning
 *   ARCH.block_count                      required           n_layer, with the MTP layers below
 *   ARCH.nextn_predict_layers             0                  the last this many blocks are
 *                                                            multi-token-prediction layers (a
 *                                                            draft head): not loaded, not run,
 *                                                            n_layer = block_count - this
 *   ARCH.embedding_length                 required           n_embd
 *   ARCH.attention.head_count             required           n_head
 *   ARCH.attention.head_count_kv          n_head             n_head_kv (GQA)
 *   ARCH.attention.key_length             n_embd/n_head      head_dim (must equal value_length)
 *   ARCH.feed_forward_length              required           n_ff
 *   ARCH.context_length                   2048               n_ctx_train
 *   ARCH.attention.layer_norm_rms_epsilon 1e-5               rms eps
 *   ARCH.rope.freq_base                   10000              theta base
 *   ARCH.rope.dimension_count             head_dim           n_rot
 *   ARCH.rope.scaling.type                none               "linear" or "yarn"
 *   ARCH.rope.scaling.factor / ARCH.rope.scale_linear        the factor (rope_freq_scale = 1/factor)
 *   yarn only: ARCH.rope.scaling.original_context_length  n_ctx_train; ARCH.rope.scaling.attn_factor
 *   1; beta_fast 32 and beta_slow 1 fixed (llama.cpp reads no key for them)
 *
 * gemma3 only (llama.cpp's llama_model_gemma3::load_arch_hparams):
 *   ARCH.attention.layer_norm_rms_epsilon required
 *   ARCH.attention.sliding_window          0 (no WINDOW layer)  n_swa
 *   ARCH.attention.sliding_window_pattern  6                  u32 period, or bool[n_layer]
 *   ARCH.rope.freq_base_swa                10000              rope base of WINDOW layers
 *                                                             (their freq scale is 1)
 *   ARCH.final_logit_softcapping           0                  logit soft-cap
 *   attention scale 1/sqrt(head_dim), or 1/sqrt(n_embd/n_head) with 62
 *   layers (Gemma 3 27B's query_pre_attn_scalar), applied to Q before the
 *   product; embeddings times sqrtf(n_embd); GELU-tanh FFN. The norm weights
 *   are used as stored: llama.cpp's converter already added Gemma's +1.
 *
 * qwen3moe only (llama.cpp's llama_model_qwen3moe::load_arch_hparams):
 *   ARCH.attention.layer_norm_rms_epsilon required
 *   ARCH.expert_count                      required           n_expert (<= 1024)
 *   ARCH.expert_used_count                 required           n_expert_used (<= n_expert)
 *   ARCH.expert_feed_forward_length        n_ff / used        n_ff_exp
 *   ARCH.feed_forward_length               0 (not required)   n_ff (no dense FFN reads it)
 *
 * gpt-oss only (llama.cpp's llama_model_openai_moe::load_arch_hparams):
 *   the qwen3moe keys above, expert_feed_forward_length required, and
 *   ARCH.attention.sliding_window          required           n_swa
 *   ARCH.attention.sliding_window_pattern  2                  (even layers WINDOW)
 *   ARCH.rope.freq_base_swa                rope.freq_base     rope base of WINDOW layers
 *   attention scale 1/sqrt(n_rot); router gating and SwiGLU as model.h's Experts
 *
 * qwen35 only (llama.cpp's llama_model_qwen35::load_arch_hparams):
 *   ARCH.attention.layer_norm_rms_epsilon required
 *   ARCH.rope.dimension_sections           required           i32/u32[<= 4] IMROPE sections
 *   ARCH.ssm.conv_kernel                   required           ssm_d_conv (1 .. 64)
 *   ARCH.ssm.inner_size                    required           ssm_d_inner (= state_size x time_step_rank)
 *   ARCH.ssm.state_size                    required           ssm_d_state
 *   ARCH.ssm.time_step_rank                required           ssm_n_v_head
 *   ARCH.ssm.group_count                   required           ssm_n_k_head (divides time_step_rank)
 *   ARCH.attention.recurrent_layers        -                  bool[n_layer]: RECURRENT layers, else
 *   ARCH.full_attention_interval           4                  layer l is FULL iff (l + 1) % interval == 0
 *
 * qwen35moe only (llama.cpp's llama_model_qwen35moe::load_arch_hparams): the
 * qwen35 keys and the qwen3moe keys above, and
 *   ARCH.expert_shared_feed_forward_length n_ff               n_ff_shexp (the shared expert's width)
 *
 * Tensors (ggml order [ne0, ne1]); N = layer:
 *   token_embd.weight [n_embd, n_vocab]    output.weight [n_embd, n_vocab] (absent: tied)
 *   output_norm.weight [n_embd]            rope_freqs.weight [n_rot/2] (optional)
 *   blk.N.attn_norm.weight [n_embd]        blk.N.ffn_norm.weight [n_embd]
 *   blk.N.attn_q.weight [n_embd, n_head*hd]  blk.N.attn_k/v.weight [n_embd, n_head_kv*hd]
 *   blk.N.attn_output.weight [n_head*hd, n_embd]
 *   blk.N.ffn_gate/up.weight [n_embd, n_ff]  blk.N.ffn_down.weight [n_ff, n_embd]
 *   qwen2: blk.N.attn_q/k/v.bias            qwen3: blk.N.attn_q_norm/k_norm.weight [hd]
 *   gemma3: blk.N.attn_q_norm/k_norm.weight [hd], blk.N.post_attention_norm.weight [n_embd],
 *           blk.N.post_ffw_norm.weight [n_embd]
 *   qwen3moe: blk.N.attn_q_norm/k_norm.weight [hd], and instead of ffn_gate/up/down:
 *           blk.N.ffn_gate_inp.weight [n_embd, n_expert] (the router, any 2-D type)
 *           blk.N.ffn_gate_exps/up_exps.weight [n_embd, n_ff_exp, n_expert]
 *           blk.N.ffn_down_exps.weight [n_ff_exp, n_embd, n_expert]
 *   gpt-oss: output.weight required; blk.N.post_attention_norm.weight [n_embd] is the FFN norm
 *           (no ffn_norm); blk.N.attn_q/k/v.bias (optional, all or none); blk.N.attn_output.bias
 *           [n_embd]; blk.N.attn_sinks.weight [n_head]; the experts as qwen3moe's (no q/k norms) and
 *           blk.N.ffn_gate_inp.bias [n_expert], blk.N.ffn_gate_exps/up_exps.bias [n_ff_exp, n_expert],
 *           blk.N.ffn_down_exps.bias [n_embd, n_expert]
 *   qwen35: blk.N.post_attention_norm.weight [n_embd] is the FFN norm (no ffn_norm). FULL layers:
 *           blk.N.attn_q.weight [n_embd, 2*n_head*hd] (per head: query, then gate), attn_k/v, attn_output,
 *           attn_q_norm/k_norm [hd]. RECURRENT layers (Dk = state_size x group_count, Dv = inner_size,
 *           C = 2 Dk + Dv, H = time_step_rank), instead of attn_q/k/v/output:
 *           blk.N.attn_qkv.weight [n_embd, C]   blk.N.attn_gate.weight [n_embd, Dv]
 *           blk.N.ssm_conv1d.weight [conv_kernel, C] (any float type, decoded to F32)
 *           blk.N.ssm_dt.bias [H]  blk.N.ssm_a [H]  blk.N.ssm_beta/ssm_alpha.weight [n_embd, H]
 *           blk.N.ssm_norm.weight [state_size]  blk.N.ssm_out.weight [Dv, n_embd]
 *   qwen35moe: qwen35's, with qwen3moe's router and experts instead of ffn_gate/up/down in every
 *           layer, and the shared expert: blk.N.ffn_gate_inp_shexp.weight [n_embd] (its gate, decoded
 *           to F32), blk.N.ffn_gate/up_shexp.weight [n_embd, n_ff_shexp],
 *           blk.N.ffn_down_shexp.weight [n_ff_shexp, n_embd]. A file whose experts' gate and up are
 *           fused (ffn_gate_up_exps, convert_hf_to_gguf --fuse-gate-up-exps) is refused.
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"

const char *kp_arch_name(kp_arch a) {
    switch (a) {
    case KP_ARCH_LLAMA: return "llama";
    case KP_ARCH_QWEN2: return "qwen2";
    case KP_ARCH_QWEN3: return "qwen3";
    case KP_ARCH_GEMMA3: return "gemma3";
    case KP_ARCH_QWEN3MOE: return "qwen3moe";
    case KP_ARCH_GPTOSS: return "gpt-oss";
    case KP_ARCH_QWEN35: return "qwen35";
    case KP_ARCH_QWEN35MOE: return "qwen35moe";
    }
    return "?";
}

kp_weight kp_expert_matrix(const kp_experts *x, uint32_t e) {
    kp_weight w = {x->type, x->n_in, x->n_out, x->row_bytes, (const uint8_t *)x->data + (size_t)e * x->mat_bytes,
                   x->packed};
    return w;
}

uint64_t kp_model_kv_bytes_per_token(const kp_hparams *hp, kp_dtype kv_type) {
    return kp_model_kv_bytes_per_token_kv(hp, kv_type, kv_type);
}

uint64_t kp_model_kv_bytes_per_token_kv(const kp_hparams *hp, kp_dtype k_type, kp_dtype v_type) {
    return (uint64_t)hp->n_kv_layer * hp->n_head_kv *
           (kp_dtype_row_size(k_type, hp->head_dim) + kp_dtype_row_size(v_type, hp->head_dim));
}

uint64_t kp_model_rec_conv_floats(const kp_hparams *hp) {
    if (!hp->n_rec_layers) return 0;
    uint64_t C = 2 * (uint64_t)hp->ssm_d_state * hp->ssm_n_k_head + hp->ssm_d_inner;
    return (uint64_t)(hp->ssm_d_conv - 1) * C;
}

uint64_t kp_model_rec_layer_floats(const kp_hparams *hp) {
    if (!hp->n_rec_layers) return 0;
    return kp_model_rec_conv_floats(hp) + (uint64_t)hp->ssm_n_v_head * hp->ssm_d_state * hp->ssm_d_state;
}

uint64_t kp_model_rec_state_floats(const kp_hparams *hp) {
    return (uint64_t)hp->n_rec_layers * kp_model_rec_layer_floats(hp);
}

uint64_t kp_model_kv_bytes_per_token_kind(const kp_model *m, kp_layer_kind kind, kp_dtype k_type, kp_dtype v_type) {
    uint64_t n = 0;
    if (kind == KP_LAYER_RECURRENT) return 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) n += m->layers[l].kind == kind;
    return n * m->hp.n_head_kv *
           (kp_dtype_row_size(k_type, m->hp.head_dim) + kp_dtype_row_size(v_type, m->hp.head_dim));
}

/* A matrix's element type must have dot-product kernels. */
static kp_status check_matrix_type(const kp_model *m, const kp_gguf_tensor *t, const char *name, kp_error *err) {
    const kp_dtype_info *ti = kp_dtype_get(t->type);
    if (!ti->has_kernels || t->type == KP_DTYPE_Q8_K)
        return kp_fail(err, KP_EUNSUPPORTED, "%s: tensor '%s' has type %s, which kvpin cannot compute with yet",
                       kp_gguf_path(m->file), name, ti->name);
    return KP_OK;
}

static kp_status get_weight(const kp_model *m, const char *name, int64_t n_in, int64_t n_out,
                            bool optional, kp_weight *w, kp_error *err) {
    const kp_gguf_tensor *t = kp_gguf_find_tensor(m->file, name);
    kp_status st;
    memset(w, 0, sizeof *w);
    if (!t) {
        if (optional) return KP_OK;
        return kp_fail(err, KP_EFORMAT, "%s: missing tensor '%s'", kp_gguf_path(m->file), name);
    }
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return kp_fail(err, KP_EFORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld]",
                       kp_gguf_path(m->file), name, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)n_in, (long long)n_out);
    if ((st = check_matrix_type(m, t, name, err)) != KP_OK) return st;
    w->type = (kp_dtype)t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = kp_dtype_row_size(t->type, n_in);
    w->data = t->data;
    return KP_OK;
}

/* A required 3-D tensor of n_expert matrices [n_in, n_out]. */
static kp_status get_experts(const kp_model *m, const char *name, int64_t n_in, int64_t n_out, kp_experts *x,
                             kp_error *err) {
    const kp_gguf_tensor *t = kp_gguf_find_tensor(m->file, name);
    uint32_t ne = m->hp.n_expert;
    kp_status st;
    memset(x, 0, sizeof *x);
    if (!t) return kp_fail(err, KP_EFORMAT, "%s: missing tensor '%s'", kp_gguf_path(m->file), name);
    if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != ne)
        return kp_fail(err, KP_EFORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %u]",
                       kp_gguf_path(m->file), name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)n_in, (long long)n_out, ne);
    if ((st = check_matrix_type(m, t, name, err)) != KP_OK) return st;
    x->type = (kp_dtype)t->type;
    x->n_in = n_in;
    x->n_out = n_out;
    x->n_expert = ne;
    x->row_bytes = kp_dtype_row_size(t->type, n_in);
    x->mat_bytes = x->row_bytes * (size_t)n_out;
    x->data = t->data;
    return KP_OK;
}

/* Decodes the n elements of tensor t (named name; NULL: missing) into an
 * owned F32 array. */
static kp_status get_vector_of(const kp_model *m, const char *name, const kp_gguf_tensor *t, int64_t n, float **out,
                               kp_error *err) {
    *out = NULL;
    if (!t) return kp_fail(err, KP_EFORMAT, "%s: missing tensor '%s'", kp_gguf_path(m->file), name);
    const kp_dtype_info *ti = kp_dtype_get(t->type);
    if (!ti->has_kernels)
        return kp_fail(err, KP_EUNSUPPORTED, "%s: tensor '%s' has unsupported type %s",
                       kp_gguf_path(m->file), name, ti->name);
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) return kp_fail(err, KP_ENOMEM, "out of memory loading '%s'", name);
    kp_dequantize_row((kp_dtype)t->type, t->data, v, n);
    *out = v;
    return KP_OK;
}

/* Decodes a 1-D tensor of n elements into an owned F32 array. */
static kp_status get_vector(const kp_model *m, const char *name, int64_t n, bool optional,
                            float **out, kp_error *err) {
    const kp_gguf_tensor *t = kp_gguf_find_tensor(m->file, name);
    *out = NULL;
    if (!t && optional) return KP_OK;
    if (t && (t->n_elements != (uint64_t)n || t->ne[0] != n))
        return kp_fail(err, KP_EFORMAT, "%s: tensor '%s' has %llu elements, expected %lld",
                       kp_gguf_path(m->file), name, (unsigned long long)t->n_elements, (long long)n);
    return get_vector_of(m, name, t, n, out, err);
}

/* Decodes a 2-D tensor [ne0, ne1] (ne1 rows of ne0) into an owned F32
 * array, row after row: the experts' biases. */
static kp_status get_matrix_f32(const kp_model *m, const char *name, int64_t ne0, int64_t ne1, float **out,
                                kp_error *err) {
    const kp_gguf_tensor *t = kp_gguf_find_tensor(m->file, name);
    *out = NULL;
    if (t && (t->n_dims != 2 || t->ne[0] != ne0 || t->ne[1] != ne1))
        return kp_fail(err, KP_EFORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                       kp_gguf_path(m->file), name, (long long)t->ne[0], (long long)t->ne[1], (long long)ne0,
                       (long long)ne1);
    float *v = NULL;
    kp_status st = get_vector_of(m, name, t, ne0 * ne1, &v, err);
    *out = v;
    return st;
}

/* ARCH.attention.layer_norm_rms_epsilon must be in the file (gemma3 and
 * qwen3moe read it without a default in llama.cpp). */
static kp_status require_rms_eps(kp_gguf *g, const char *arch, kp_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if (!kp_gguf_find(g, key)) return kp_fail(err, KP_EFORMAT, "%s: missing %s (%s requires it)", kp_gguf_path(g), key, arch);
    return KP_OK;
}

/* gemma3's keys and fixed choices (the table at the top), after the common
 * ones. The layer kinds are set later (layer_kinds), once layers exist. */
static kp_status read_gemma3(kp_model *m, kp_error *err) {
    kp_gguf *g = m->file;
    kp_hparams *hp = &m->hp;
    kp_status st;
    char key[128];
    if ((st = require_rms_eps(g, "gemma3", err))) return st;
#define KEY(suffix) (snprintf(key, sizeof key, "gemma3.%s", suffix), key)
    if ((st = kp_gguf_get_u32(g, KEY("attention.sliding_window"), 0, &hp->n_swa, err))) return st;
    if ((st = kp_gguf_get_f32(g, KEY("rope.freq_base_swa"), 10000.0f, &hp->rope_base_swa, err))) return st;
    if ((st = kp_gguf_get_f32(g, KEY("final_logit_softcapping"), 0.0f, &hp->logit_softcap, err))) return st;
#undef KEY
    if (!(hp->rope_base_swa > 0) || !(hp->logit_softcap >= 0) || !isfinite(hp->logit_softcap))
        return kp_fail(err, KP_EFORMAT, "%s: gemma3.rope.freq_base_swa must be positive and the logit "
                       "soft-cap finite and not negative", kp_gguf_path(g));
    hp->rope_freq_scale_swa = 1.0f;
    /* llama.cpp: 1/sqrt(n_embd/n_head) for the 62-layer 27B, else 1/sqrt(head_dim) */
    hp->attn_scale = hp->n_layer == 62 ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head))
                                       : 1.0f / sqrtf((float)hp->head_dim);
    hp->attn_scale_on_q = true;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_act = KP_FFN_GELU_TANH;
    hp->post_norms = true;
    return KP_OK;
}

/* The expert keys of qwen3moe, gpt-oss and qwen35moe (the table at the
 * top), after the common ones; gpt-oss requires the expert width, the
 * others default it to n_ff / used; qwen35moe has a shared expert too. */
static kp_status read_experts(kp_model *m, kp_error *err) {
    kp_gguf *g = m->file;
    kp_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    kp_status st;
    char key[128];
    if ((st = require_rms_eps(g, a, err))) return st;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    if ((st = kp_gguf_get_u32(g, KEY("expert_count"), 0, &hp->n_expert, err))) return st;
    if ((st = kp_gguf_get_u32(g, KEY("expert_used_count"), 0, &hp->n_expert_used, err))) return st;
    if (hp->n_expert == 0 || hp->n_expert > 1024 || hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert)
        return kp_fail(err, KP_EFORMAT, "%s: %s needs 1 <= expert_used_count (%u) <= expert_count (%u) <= 1024",
                       kp_gguf_path(g), a, hp->n_expert_used, hp->n_expert);
    uint32_t def = hp->arch == KP_ARCH_GPTOSS ? 0 : hp->n_ff / hp->n_expert_used;
    if ((st = kp_gguf_get_u32(g, KEY("expert_feed_forward_length"), def, &hp->n_ff_exp, err))) return st;
    if (hp->n_ff_exp == 0)
        return kp_fail(err, KP_EFORMAT, "%s: missing or zero %s", kp_gguf_path(g), KEY("expert_feed_forward_length"));
    if (hp->arch == KP_ARCH_QWEN35MOE) {
        if ((st = kp_gguf_get_u32(g, KEY("expert_shared_feed_forward_length"), hp->n_ff, &hp->n_ff_shexp, err)))
            return st;
        if (hp->n_ff_shexp == 0)
            return kp_fail(err, KP_EFORMAT, "%s: missing or zero %s (and no feed_forward_length)", kp_gguf_path(g),
                           key);
    }
    if (hp->arch != KP_ARCH_GPTOSS) return KP_OK;
    /* gpt-oss (llama.cpp's llama_model_openai_moe::load_arch_hparams) */
    if ((st = kp_gguf_get_u32(g, KEY("attention.sliding_window"), 0, &hp->n_swa, err))) return st;
    if (hp->n_swa == 0) return kp_fail(err, KP_EFORMAT, "%s: missing or zero %s", kp_gguf_path(g), key);
    if ((st = kp_gguf_get_f32(g, KEY("rope.freq_base_swa"), hp->rope_base, &hp->rope_base_swa, err))) return st;
#undef KEY
    if (!(hp->rope_base_swa > 0))
        return kp_fail(err, KP_EFORMAT, "%s: gpt-oss.rope.freq_base_swa must be positive", kp_gguf_path(g));
    hp->gate = KP_GATE_SOFTMAX_TOPK;
    hp->swiglu_alpha = 1.702f;
    hp->swiglu_limit = 7.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->n_rot);
    return KP_OK;
}

/* qwen35's keys (the table at the top), after the common ones; qwen35moe
 * has them too, under its own name. The layer kinds are set later
 * (layer_kinds). */
static kp_status read_qwen35(kp_model *m, kp_error *err) {
    kp_gguf *g = m->file;
    kp_hparams *hp = &m->hp;
    kp_status st;
    char key[128];
    const char *a = hp->arch_name;
    if ((st = require_rms_eps(g, a, err))) return st;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    struct {
        const char *k;
        uint32_t *v;
    } req[] = {{"ssm.conv_kernel", &hp->ssm_d_conv},     {"ssm.inner_size", &hp->ssm_d_inner},
               {"ssm.state_size", &hp->ssm_d_state},     {"ssm.time_step_rank", &hp->ssm_n_v_head},
               {"ssm.group_count", &hp->ssm_n_k_head}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        if ((st = kp_gguf_get_u32(g, KEY(req[i].k), 0, req[i].v, err))) return st;
        if (*req[i].v == 0) return kp_fail(err, KP_EFORMAT, "%s: missing or zero %s", kp_gguf_path(g), key);
    }
    if (hp->ssm_d_conv > 64 || hp->ssm_d_state > 4096 || hp->ssm_n_v_head > 4096 ||
        hp->ssm_n_v_head % hp->ssm_n_k_head != 0 || (uint64_t)hp->ssm_d_state * hp->ssm_n_v_head != hp->ssm_d_inner)
        return kp_fail(err, KP_EFORMAT,
                       "%s: %s needs conv_kernel <= 64 (%u), state_size <= 4096 (%u), group_count (%u) "
                       "dividing time_step_rank (%u) <= 4096, and inner_size (%u) = state_size x time_step_rank",
                       kp_gguf_path(g), a, hp->ssm_d_conv, hp->ssm_d_state, hp->ssm_n_k_head, hp->ssm_n_v_head,
                       hp->ssm_d_inner);
    const kp_gguf_kv *kv = kp_gguf_find(g, KEY("rope.dimension_sections"));
    if (!kv || kv->value.type != KP_GGUF_TYPE_ARRAY || kv->value.v.arr.n == 0 || kv->value.v.arr.n > 4 ||
        kv->value.v.arr.elem_type == KP_GGUF_TYPE_STRING || kv->value.v.arr.elem_type == KP_GGUF_TYPE_ARRAY)
        return kp_fail(err, KP_EFORMAT, "%s: %s must be an array of 1 to 4 integers", kp_gguf_path(g), key);
    int64_t sum = 0;
    for (uint64_t i = 0; i < kv->value.v.arr.n; i++) {
        int64_t v = kp_gguf_arr_i64(&kv->value, i);
        if (v < 0 || v > 4096)
            return kp_fail(err, KP_EFORMAT, "%s: %s[%llu] = %lld", kp_gguf_path(g), key, (unsigned long long)i,
                           (long long)v);
        hp->rope_sections[i] = (int32_t)v;
        sum += v;
    }
    /* ggml asserts the sections fit a head and that one of the first three is used */
    if (sum > hp->head_dim || (hp->rope_sections[0] | hp->rope_sections[1] | hp->rope_sections[2]) == 0)
        return kp_fail(err, KP_EFORMAT, "%s: %s sums to %lld (head_dim %u) or has none of the first three sections",
                       kp_gguf_path(g), key, (long long)sum, hp->head_dim);
#undef KEY
    hp->rope_imrope = true;
    hp->attn_gated = true;
    return KP_OK;
}

/* YaRN's keys (llama.cpp's llama_model_base::load_hparams and
 * llama_context's yarn_attn_factor) for a file whose rope.scaling.type is
 * yarn, factor already read into rope_freq_scale. */
static kp_status read_yarn(kp_model *m, kp_error *err) {
    kp_gguf *g = m->file;
    kp_hparams *hp = &m->hp;
    kp_status st;
    char key[128];
    float attn = 1.0f;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", hp->arch_name, suffix), key)
    if ((st = kp_gguf_get_u32(g, KEY("rope.scaling.original_context_length"), hp->n_ctx_train,
                              &hp->yarn_n_ctx_orig, err)))
        return st;
    if ((st = kp_gguf_get_f32(g, KEY("rope.scaling.attn_factor"), 1.0f, &attn, err))) return st;
#undef KEY
    if (hp->yarn_n_ctx_orig == 0 || !(attn > 0) || !isfinite(attn))
        return kp_fail(err, KP_EFORMAT, "%s: YaRN needs an original context length and a positive attn_factor",
                       kp_gguf_path(g));
    hp->rope_yarn = true;
    hp->yarn_beta_fast = 32.0f; /* llama.cpp's defaults; it reads no key for them */
    hp->yarn_beta_slow = 1.0f;
    /* llama_context: get_mscale(factor) / (1 + 0.1 ln factor) x attn_factor */
    const float factor = 1.0f / hp->rope_freq_scale;
    float a = factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
    a *= 1.0f / (1.0f + 0.1f * logf(factor));
    hp->yarn_attn_factor = a * attn;
    return KP_OK;
}

/* Each layer's kind from the sliding-window keys (the top of model.h). */
static kp_status layer_kinds(kp_model *m, kp_error *err) {
    kp_hparams *hp = &m->hp;
    kp_gguf *g = m->file;
    kp_status st;
    char key[128];
    for (uint32_t l = 0; l < hp->n_layer; l++) m->layers[l].kind = KP_LAYER_FULL;
    if (hp->arch == KP_ARCH_QWEN35 || hp->arch == KP_ARCH_QWEN35MOE) {
        snprintf(key, sizeof key, "%s.attention.recurrent_layers", hp->arch_name);
        const kp_gguf_kv *kv = kp_gguf_find(g, key);
        if (kv) {
            uint64_t n = kv->value.type == KP_GGUF_TYPE_ARRAY ? kv->value.v.arr.n : 0;
            if (kv->value.type != KP_GGUF_TYPE_ARRAY || (n != hp->n_layer && n != hp->n_layer + hp->n_layer_nextn) ||
                kv->value.v.arr.elem_type == KP_GGUF_TYPE_STRING || kv->value.v.arr.elem_type == KP_GGUF_TYPE_ARRAY)
                return kp_fail(err, KP_EFORMAT, "%s: %s must be an array of %u bools", kp_gguf_path(g), key,
                               hp->n_layer + hp->n_layer_nextn);
            for (uint32_t l = 0; l < hp->n_layer; l++)
                if (kp_gguf_arr_i64(&kv->value, l)) m->layers[l].kind = KP_LAYER_RECURRENT;
        } else {
            uint32_t interval;
            snprintf(key, sizeof key, "%s.full_attention_interval", hp->arch_name);
            if ((st = kp_gguf_get_u32(g, key, 4, &interval, err))) return st;
            if (interval == 0) return kp_fail(err, KP_EFORMAT, "%s: %s is 0", kp_gguf_path(g), key);
            for (uint32_t l = 0; l < hp->n_layer; l++)
                if ((l + 1) % interval != 0) m->layers[l].kind = KP_LAYER_RECURRENT;
        }
        return KP_OK;
    }
    if (hp->n_swa == 0) return KP_OK;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch_name);
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    if (kv && kv->value.type == KP_GGUF_TYPE_ARRAY) {
        const kp_gguf_value *arr = NULL;
        if ((st = kp_gguf_get_arr(g, key, KP_GGUF_TYPE_BOOL, &arr, err))) return st;
        if (arr->v.arr.n != hp->n_layer)
            return kp_fail(err, KP_EFORMAT, "%s: %s has %llu entries for %u layers", kp_gguf_path(g), key,
                           (unsigned long long)arr->v.arr.n, hp->n_layer);
        for (uint32_t l = 0; l < hp->n_layer; l++)
            m->layers[l].kind = kp_gguf_arr_i64(arr, l) ? KP_LAYER_WINDOW : KP_LAYER_FULL;
    } else {
        uint32_t period;
        if ((st = kp_gguf_get_u32(g, key, hp->arch == KP_ARCH_GPTOSS ? 2 : 6, &period, err))) return st;
        for (uint32_t l = 0; l < hp->n_layer; l++)
            m->layers[l].kind = period == 0 || l % period < period - 1 ? KP_LAYER_WINDOW : KP_LAYER_FULL;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) hp->n_swa_layers += m->layers[l].kind == KP_LAYER_WINDOW;
    return KP_OK;
}

static kp_status read_hparams(kp_model *m, kp_error *err) {
    kp_gguf *g = m->file;
    kp_hparams *hp = &m->hp;
    kp_gguf_str arch;
    kp_status st;
    char key[128];
    if ((st = kp_gguf_get_str(g, "general.architecture", &arch, err)) != KP_OK) return st;
    if (!arch.data)
        return kp_fail(err, KP_EFORMAT, "%s: no general.architecture key (is this a vocab-only file?)",
                       kp_gguf_path(g));
    if (kp_gguf_str_eq(arch, "llama")) hp->arch = KP_ARCH_LLAMA;
    else if (kp_gguf_str_eq(arch, "qwen2")) hp->arch = KP_ARCH_QWEN2;
    else if (kp_gguf_str_eq(arch, "qwen3")) hp->arch = KP_ARCH_QWEN3;
    else if (kp_gguf_str_eq(arch, "gemma3")) hp->arch = KP_ARCH_GEMMA3;
    else if (kp_gguf_str_eq(arch, "qwen3moe")) hp->arch = KP_ARCH_QWEN3MOE;
    else if (kp_gguf_str_eq(arch, "gpt-oss")) hp->arch = KP_ARCH_GPTOSS;
    else if (kp_gguf_str_eq(arch, "qwen35")) hp->arch = KP_ARCH_QWEN35;
    else if (kp_gguf_str_eq(arch, "qwen35moe")) hp->arch = KP_ARCH_QWEN35MOE;
    else
        return kp_fail(err, KP_EUNSUPPORTED,
                       "%s: unsupported architecture '%.*s' (kvpin runs llama, qwen2, qwen3, gemma3, qwen3moe, "
                       "gpt-oss, qwen35, qwen35moe)",
                       kp_gguf_path(g), (int)(arch.len > 64 ? 64 : arch.len), arch.data);
    hp->arch_name = kp_arch_name(hp->arch);
    const char *a = hp->arch_name;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
#define REQ_U32(suffix, field)                                                          \
    do {                                                                                \
        if ((st = kp_gguf_get_u32(g, KEY(suffix), 0, &hp->field, err)) != KP_OK) return st; \
        if (hp->field == 0)                                                             \
            return kp_fail(err, KP_EFORMAT, "%s: missing or zero %s", kp_gguf_path(g), key); \
    } while (0)
    REQ_U32("block_count", n_layer);
    /* llama.cpp's n_layer(): the trailing multi-token-prediction blocks (Qwen3.5's converter writes
     * them by default) are loaded only for drafting, never run by the main graph; kvpin skips them */
    if ((st = kp_gguf_get_u32(g, KEY("nextn_predict_layers"), 0, &hp->n_layer_nextn, err)) != KP_OK) return st;
    if (hp->n_layer_nextn >= hp->n_layer)
        return kp_fail(err, KP_EFORMAT, "%s: %s (%u) leaves no layer of the %u to run", kp_gguf_path(g), key,
                       hp->n_layer_nextn, hp->n_layer);
    hp->n_layer -= hp->n_layer_nextn;
    REQ_U32("embedding_length", n_embd);
    REQ_U32("attention.head_count", n_head);
    const bool moe = hp->arch == KP_ARCH_QWEN3MOE || hp->arch == KP_ARCH_GPTOSS || hp->arch == KP_ARCH_QWEN35MOE;
    if (moe) { /* llama.cpp does not require it; the experts have their own width */
        if ((st = kp_gguf_get_u32(g, KEY("feed_forward_length"), 0, &hp->n_ff, err))) return st;
    } else {
        REQ_U32("feed_forward_length", n_ff);
    }
    if ((st = kp_gguf_get_u32(g, KEY("attention.head_count_kv"), hp->n_head, &hp->n_head_kv, err))) return st;
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return kp_fail(err, KP_EFORMAT, "%s: head_count %u is not a multiple of head_count_kv %u",
                       kp_gguf_path(g), hp->n_head, hp->n_head_kv);
    uint32_t def_hd = hp->n_embd / hp->n_head, vlen;
    if ((st = kp_gguf_get_u32(g, KEY("attention.key_length"), def_hd, &hp->head_dim, err))) return st;
    if ((st = kp_gguf_get_u32(g, KEY("attention.value_length"), hp->head_dim, &vlen, err))) return st;
    if (hp->head_dim == 0 || vlen != hp->head_dim || hp->head_dim % 2 != 0)
        return kp_fail(err, KP_EUNSUPPORTED, "%s: head dims key %u / value %u not supported",
                       kp_gguf_path(g), hp->head_dim, vlen);
    if ((st = kp_gguf_get_u32(g, KEY("context_length"), 2048, &hp->n_ctx_train, err))) return st;
    if ((st = kp_gguf_get_f32(g, KEY("attention.layer_norm_rms_epsilon"), 1e-5f, &hp->rms_eps, err))) return st;
    if ((st = kp_gguf_get_f32(g, KEY("rope.freq_base"), 10000.0f, &hp->rope_base, err))) return st;
    if ((st = kp_gguf_get_u32(g, KEY("rope.dimension_count"), hp->head_dim, &hp->n_rot, err))) return st;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return kp_fail(err, KP_EFORMAT, "%s: rope.dimension_count %u invalid for head_dim %u",
                       kp_gguf_path(g), hp->n_rot, hp->head_dim);
    if (!(hp->rms_eps > 0) || !(hp->rope_base > 0))
        return kp_fail(err, KP_EFORMAT, "%s: rms epsilon and rope base must be positive", kp_gguf_path(g));
    float factor = 0;
    kp_gguf_str stype;
    if ((st = kp_gguf_get_str(g, KEY("rope.scaling.type"), &stype, err))) return st;
    if ((st = kp_gguf_get_f32(g, KEY("rope.scaling.factor"), 0.0f, &factor, err))) return st;
    if (factor == 0 && (st = kp_gguf_get_f32(g, KEY("rope.scale_linear"), 0.0f, &factor, err))) return st;
    bool yarn = stype.data && kp_gguf_str_eq(stype, "yarn");
    if (stype.data && !kp_gguf_str_eq(stype, "linear") && !kp_gguf_str_eq(stype, "none") && !yarn)
        return kp_fail(err, KP_EUNSUPPORTED, "%s: rope scaling '%.*s' is not supported (linear and yarn are)",
                       kp_gguf_path(g), (int)(stype.len > 32 ? 32 : stype.len), stype.data);
    if (stype.data && kp_gguf_str_eq(stype, "none")) factor = 0;
    hp->rope_freq_scale = factor > 0 ? 1.0f / factor : 1.0f;
    hp->rope_type = hp->arch == KP_ARCH_LLAMA ? KP_ROPE_NORM : KP_ROPE_NEOX;
    hp->rope_base_swa = hp->rope_base;
    hp->rope_freq_scale_swa = hp->rope_freq_scale;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    hp->ffn_act = KP_FFN_SILU;
#undef REQ_U32
#undef KEY
    if (yarn && (st = read_yarn(m, err))) return st;
    if (hp->arch == KP_ARCH_GEMMA3) return read_gemma3(m, err);
    if ((hp->arch == KP_ARCH_QWEN35 || hp->arch == KP_ARCH_QWEN35MOE) && (st = read_qwen35(m, err))) return st;
    return moe ? read_experts(m, err) : KP_OK;
}

/* A RECURRENT layer's mixer tensors (the table at the top). */
static kp_status load_recurrent(kp_model *m, uint32_t l, kp_error *err) {
    const kp_hparams *hp = &m->hp;
    kp_layer *L = &m->layers[l];
    int64_t E = hp->n_embd, H = hp->ssm_n_v_head, Dv = hp->ssm_d_inner;
    int64_t C = 2 * (int64_t)hp->ssm_d_state * hp->ssm_n_k_head + Dv;
    char name[96];
    kp_status st;
#define NAME(s) (snprintf(name, sizeof name, "blk.%u.%s", l, s), name)
    if ((st = get_weight(m, NAME("attn_qkv.weight"), E, C, false, &L->w_qkv, err))) return st;
    if ((st = get_weight(m, NAME("attn_gate.weight"), E, Dv, false, &L->w_z, err))) return st;
    if ((st = get_weight(m, NAME("ssm_beta.weight"), E, H, false, &L->w_beta, err))) return st;
    if ((st = get_weight(m, NAME("ssm_alpha.weight"), E, H, false, &L->w_alpha, err))) return st;
    if ((st = get_weight(m, NAME("ssm_out.weight"), Dv, E, false, &L->w_ssm_out, err))) return st;
    if ((st = get_matrix_f32(m, NAME("ssm_conv1d.weight"), hp->ssm_d_conv, C, &L->ssm_conv, err))) return st;
    if ((st = get_vector(m, NAME("ssm_dt.bias"), H, false, &L->ssm_dt, err))) return st;
    if ((st = get_vector(m, NAME("ssm_a"), H, false, &L->ssm_a, err))) return st;
    if ((st = get_vector(m, NAME("ssm_norm.weight"), hp->ssm_d_state, false, &L->ssm_norm, err))) return st;
#undef NAME
    return KP_OK;
}

/* Layer l's FFN tensors, whatever its mixer: the dense FFN, or the router
 * and the experts (with gpt-oss's biases, qwen35moe's shared expert). */
static kp_status load_ffn(kp_model *m, uint32_t l, kp_error *err) {
    const kp_hparams *hp = &m->hp;
    kp_layer *L = &m->layers[l];
    int64_t E = hp->n_embd, F = hp->n_ff, X = hp->n_ff_exp, N = hp->n_expert, S = hp->n_ff_shexp;
    char name[96];
    kp_status st;
#define NAME(s) (snprintf(name, sizeof name, "blk.%u.%s", l, s), name)
    if (!hp->n_expert) {
        if ((st = get_weight(m, NAME("ffn_gate.weight"), E, F, false, &L->w_gate, err))) return st;
        if ((st = get_weight(m, NAME("ffn_up.weight"), E, F, false, &L->w_up, err))) return st;
        return get_weight(m, NAME("ffn_down.weight"), F, E, false, &L->w_down, err);
    }
    if (kp_gguf_find_tensor(m->file, NAME("ffn_gate_up_exps.weight")))
        return kp_fail(err, KP_EUNSUPPORTED,
                       "%s: '%s' (the experts' gate and up fused) is not supported; convert without "
                       "--fuse-gate-up-exps",
                       kp_gguf_path(m->file), name);
    if ((st = get_weight(m, NAME("ffn_gate_inp.weight"), E, N, false, &L->w_router, err))) return st;
    if ((st = get_experts(m, NAME("ffn_gate_exps.weight"), E, X, &L->e_gate, err))) return st;
    if ((st = get_experts(m, NAME("ffn_up_exps.weight"), E, X, &L->e_up, err))) return st;
    if ((st = get_experts(m, NAME("ffn_down_exps.weight"), X, E, &L->e_down, err))) return st;
    if (hp->arch == KP_ARCH_GPTOSS) {
        if ((st = get_vector(m, NAME("ffn_gate_inp.bias"), N, false, &L->b_router, err))) return st;
        if ((st = get_matrix_f32(m, NAME("ffn_gate_exps.bias"), X, N, &L->b_gate_exps, err))) return st;
        if ((st = get_matrix_f32(m, NAME("ffn_up_exps.bias"), X, N, &L->b_up_exps, err))) return st;
        if ((st = get_matrix_f32(m, NAME("ffn_down_exps.bias"), E, N, &L->b_down_exps, err))) return st;
    }
    if (S) {
        if ((st = get_vector(m, NAME("ffn_gate_inp_shexp.weight"), E, false, &L->gate_inp_shexp, err))) return st;
        if ((st = get_weight(m, NAME("ffn_gate_shexp.weight"), E, S, false, &L->w_gate_shexp, err))) return st;
        if ((st = get_weight(m, NAME("ffn_up_shexp.weight"), E, S, false, &L->w_up_shexp, err))) return st;
        if ((st = get_weight(m, NAME("ffn_down_shexp.weight"), S, E, false, &L->w_down_shexp, err))) return st;
    }
#undef NAME
    return KP_OK;
}

kp_status kp_model_from_gguf(kp_model **out, kp_gguf *g, kp_error *err) {
    kp_model *m = calloc(1, sizeof *m);
    kp_status st;
    char name[96];
    *out = NULL;
    if (!m) {
        kp_gguf_close(g);
        return kp_fail(err, KP_ENOMEM, "out of memory loading a model");
    }
    m->file = g;
    if ((st = read_hparams(m, err)) != KP_OK) goto fail;
    kp_hparams *hp = &m->hp;
    const kp_gguf_tensor *te = kp_gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2) {
        st = kp_fail(err, KP_EFORMAT, "%s: missing 2-D tensor 'token_embd.weight'", kp_gguf_path(g));
        goto fail;
    }
    hp->n_vocab = (uint32_t)te->ne[1];
    /* The vocabulary sizes every logits and sampler buffer; a file whose
     * token list disagrees with the embedding's rows would have the output
     * matrix write past them (or sample rows no token names). */
    const kp_gguf_value *toks = NULL;
    if ((st = kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, err)) != KP_OK) goto fail;
    if (toks && toks->v.arr.n != hp->n_vocab) {
        st = kp_fail(err, KP_EFORMAT,
                     "%s: the vocabulary has %llu tokens (tokenizer.ggml.tokens) but token_embd.weight has %u "
                     "rows; the two must match",
                     kp_gguf_path(g), (unsigned long long)toks->v.arr.n, hp->n_vocab);
        goto fail;
    }
    int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim;
    int64_t KV = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool hybrid = hp->arch == KP_ARCH_QWEN35 || hp->arch == KP_ARCH_QWEN35MOE;
    if ((st = get_weight(m, "token_embd.weight", E, hp->n_vocab, false, &m->tok_embd, err))) goto fail;
    if ((st = get_weight(m, "output.weight", E, hp->n_vocab, hp->arch != KP_ARCH_GPTOSS, &m->output, err))) goto fail;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    if ((st = get_vector(m, "output_norm.weight", E, false, &m->output_norm, err))) goto fail;
    if ((st = get_vector(m, "rope_freqs.weight", hp->n_rot / 2, true, &m->rope_freqs, err))) goto fail;
    m->layers = calloc(hp->n_layer, sizeof(kp_layer));
    if (!m->layers) {
        st = kp_fail(err, KP_ENOMEM, "out of memory loading %u layers", hp->n_layer);
        goto fail;
    }
    if ((st = layer_kinds(m, err)) != KP_OK) goto fail;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].kind == KP_LAYER_RECURRENT) {
            hp->n_rec_layers++;
        } else {
            m->layers[l].kv_layer = hp->n_kv_layer++;
        }
    }
    if (hp->n_kv_layer == 0) {
        st = kp_fail(err, KP_EUNSUPPORTED, "%s: every layer is recurrent; kvpin needs at least one attention layer",
                     kp_gguf_path(g));
        goto fail;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        kp_layer *L = &m->layers[l];
#define NAME(s) (snprintf(name, sizeof name, "blk.%u.%s", l, s), name)
        if ((st = get_vector(m, NAME("attn_norm.weight"), E, false, &L->attn_norm, err))) goto fail;
        /* gpt-oss's and qwen35's FFN norm is named post_attention_norm (llama.cpp's attn_post_norm) */
        const char *ffn_norm = hp->arch == KP_ARCH_GPTOSS || hybrid ? "post_attention_norm.weight" : "ffn_norm.weight";
        if ((st = get_vector(m, NAME(ffn_norm), E, false, &L->ffn_norm, err))) goto fail;
        if (L->kind == KP_LAYER_RECURRENT) {
            if ((st = load_recurrent(m, l, err)) || (st = load_ffn(m, l, err))) goto fail;
            continue;
        }
        if ((st = get_weight(m, NAME("attn_q.weight"), E, hp->attn_gated ? 2 * Q : Q, false, &L->wq, err))) goto fail;
        if ((st = get_weight(m, NAME("attn_k.weight"), E, KV, false, &L->wk, err))) goto fail;
        if ((st = get_weight(m, NAME("attn_v.weight"), E, KV, false, &L->wv, err))) goto fail;
        if ((st = get_weight(m, NAME("attn_output.weight"), Q, E, false, &L->wo, err))) goto fail;
        if ((st = load_ffn(m, l, err))) goto fail;
        bool biases = hp->arch == KP_ARCH_QWEN2, gptoss = hp->arch == KP_ARCH_GPTOSS;
        if ((st = get_vector(m, NAME("attn_q.bias"), Q, !biases, &L->bq, err))) goto fail;
        if ((st = get_vector(m, NAME("attn_k.bias"), KV, !biases, &L->bk, err))) goto fail;
        if ((st = get_vector(m, NAME("attn_v.bias"), KV, !biases, &L->bv, err))) goto fail;
        if (!L->bq != !L->bk || !L->bq != !L->bv) {
            st = kp_fail(err, KP_EFORMAT, "%s: layer %u has some of the q/k/v biases but not all", kp_gguf_path(g), l);
            goto fail;
        }
        if ((st = get_vector(m, NAME("attn_output.bias"), E, !gptoss, &L->bo, err))) goto fail;
        if ((st = get_vector(m, NAME("attn_sinks.weight"), hp->n_head, !gptoss, &L->attn_sinks, err))) goto fail;
        bool qk_norm = hp->arch == KP_ARCH_QWEN3 || hp->arch == KP_ARCH_GEMMA3 || hp->arch == KP_ARCH_QWEN3MOE || hybrid;
        if ((st = get_vector(m, NAME("attn_q_norm.weight"), hp->head_dim, !qk_norm, &L->q_norm, err))) goto fail;
        if ((st = get_vector(m, NAME("attn_k_norm.weight"), hp->head_dim, !qk_norm, &L->k_norm, err))) goto fail;
        if (hp->post_norms) {
            if ((st = get_vector(m, NAME("post_attention_norm.weight"), E, false, &L->attn_post_norm, err))) goto fail;
            if ((st = get_vector(m, NAME("post_ffw_norm.weight"), E, false, &L->ffn_post_norm, err))) goto fail;
        }
#undef NAME
    }
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) m->weight_bytes += kp_gguf_tensor_at(g, i)->n_bytes;
    *out = m;
    return KP_OK;
fail:
    kp_model_free(m);
    return st;
}

kp_status kp_model_load(kp_model **out, const char *path, kp_error *err) {
    kp_gguf *g;
    *out = NULL;
    kp_status st = kp_gguf_open(&g, path, err);
    if (st != KP_OK) return st;
    return kp_model_from_gguf(out, g, err);
}

void kp_model_free(kp_model *m) {
    if (!m) return;
    if (m->layers) {
        for (uint32_t l = 0; l < m->hp.n_layer; l++) {
            kp_layer *L = &m->layers[l];
            free(L->attn_norm); free(L->ffn_norm);
            free(L->bq); free(L->bk); free(L->bv);
            free(L->q_norm); free(L->k_norm);
            free(L->attn_post_norm); free(L->ffn_post_norm);
            free(L->bo); free(L->attn_sinks);
            free(L->b_router); free(L->b_gate_exps); free(L->b_up_exps); free(L->b_down_exps);
            free(L->gate_inp_shexp);
            free(L->ssm_conv); free(L->ssm_dt); free(L->ssm_a); free(L->ssm_norm);
        }
        free(m->layers);
    }
    free(m->output_norm);
    free(m->rope_freqs);
    kp_gguf_close(m->file);
    free(m);
}
