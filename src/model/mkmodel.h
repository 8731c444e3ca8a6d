/*
 * mkmodel.h - writes GGUF models with seeded random weights.
 *
 * For tests and benchmarks that need a model of a given shape and weight
 * type without shipping one: llama, qwen2 (q/k/v biases), qwen3 (per-head
 * q/k RMS norms), gemma3 (q/k norms, post-attention and post-FFN norms,
 * sliding-window layers), qwen3moe (qwen3's attention, a router and 3-D
 * expert tensors instead of the FFN) and gpt-oss (q/k/v and output biases,
 * attention sinks, YaRN rope, alternating window layers, experts with
 * biases), qwen35 (gated delta-net layers, gated attention every 4th
 * layer) and qwen35moe (qwen35's layers, qwen3moe's experts and a gated
 * shared expert instead of the FFN) layouts, in F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K or Q6_K, or MXFP4 for a model with experts (as llama-quantize's
 * MXFP4_MOE: the experts MXFP4, every other 2-D weight Q8_0, the router
 * F32), with the tokenizer taken from any GGUF file (every
 * `tokenizer.*` key, copied verbatim). Tensor names, shapes and metadata
 * keys are the ones llama.cpp loads. The file is the one llama-quantize
 * --pure would make from the same weights in F32 (same types, same bytes,
 * same general.file_type), including its fallback for row lengths that the
 * type cannot encode (kp_mkmodel_weight_type).
 *
 * Weights (fan_in = a matrix's row length, ggml ne[0]):
 *   2-D matrices            N(0, 1/fan_in)
 *   token_embd, untied      N(0, 1)         (its input is one-hot)
 *   token_embd, tied        N(0, 1/n_embd)  (it is also the output projection)
 *   norm weights            1 + 0.1 N(0,1)
 *   qwen2 q/k/v biases      0.5 N(0,1)
 *   qwen3moe experts        N(0, 1/fan_in) per matrix; the router F32
 *   gpt-oss                 q/k/v biases 0.5 N(0,1), output bias 0.1 N(0,1),
 *                           sinks N(0,1), router bias 0.5 N(0,1), experts'
 *                           gate and up N(0, 9/fan_in) (so that some of the
 *                           SwiGLU's inputs pass its clamp at 7), their
 *                           biases 0.1 N(0,1); the router F32
 *   qwen35                  ssm_conv1d N(0, 1/conv_kernel), F32 whatever the
 *                           type (llama-quantize leaves it); ssm_dt.bias
 *                           0.5 N(0,1); ssm_a -(0.05 + 0.5 U(0,1)) (a decay
 *                           per token between exp(-0.55 softplus) and 1)
 *   qwen35moe               qwen35's and qwen3moe's; the shared expert's
 *                           matrices N(0, 1/fan_in), its gate
 *                           ffn_gate_inp_shexp (1-D, F32) N(0, 1/n_embd)
 * (gemma3's norm weights are stored as llama.cpp's converter stores them,
 * Gemma's +1 already added, so they too are 1 + 0.1 N(0,1).)
 * Norms and biases are F32; every 2-D weight (token_embd and output too) has
 * kp_mkmodel_weight_type(spec's type, its row length): the spec's type unless
 * the row length is not a multiple of its block size. The values are drawn
 * in F32 from one stream in file
 * order and then converted, so files that differ only in `wtype` hold the
 * same weights up to quantization error. The same spec, seed and tokenizer
 * file give a byte-identical output on any machine.
 */
#ifndef KP_MKMODEL_H
#define KP_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/dtype.h"
#include "base/status.h"

typedef struct {
    const char *arch;    /* "llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "gpt-oss", "qwen35" or "qwen35moe"
                            (borrowed) */
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;  /* divides n_head */
    uint32_t head_dim;   /* 0 = n_embd / n_head */
    uint32_t n_ff;
    uint32_t n_ctx;      /* {arch}.context_length */
    float rope_base;     /* {arch}.rope.freq_base */
    float rms_eps;       /* {arch}.attention.layer_norm_rms_epsilon */
    bool tied;           /* no output.weight: token_embd is the output projection */
    kp_dtype wtype;      /* type of every 2-D weight */
    uint64_t seed;
    const char *name;    /* general.name (borrowed); NULL = the arch name */
    uint32_t alignment;  /* 0 = 32 (no general.alignment key); else a power of two */
    uint32_t n_swa;      /* gemma3, gpt-oss: {arch}.attention.sliding_window (0: not written, no
                            window; gpt-oss requires one) */
    uint32_t swa_pattern; /* gemma3, gpt-oss: {arch}.attention.sliding_window_pattern, every
                             swa_pattern-th layer FULL (0: not written, llama.cpp's default:
                             6 for gemma3, 2 for gpt-oss) */
    uint32_t n_expert;      /* qwen3moe, gpt-oss, qwen35moe: {arch}.expert_count (0 for other archs) */
    uint32_t n_expert_used; /* qwen3moe, gpt-oss, qwen35moe: {arch}.expert_used_count, <= n_expert */
    uint32_t n_ff_exp;      /* qwen3moe, gpt-oss, qwen35moe: {arch}.expert_feed_forward_length, an expert's width */
    float yarn_factor;      /* gpt-oss: rope.scaling.type yarn with this factor (0: no rope scaling) */
    uint32_t yarn_orig_ctx; /* gpt-oss: rope.scaling.original_context_length, with yarn_factor */
    /* rope variants of real files (0: not written) */
    uint32_t n_rot;           /* {arch}.rope.dimension_count below head_dim (partial rotary), even */
    float rope_scale_linear;  /* {arch}.rope.scaling.type "linear", .factor this */
    float rope_freqs_llama3;  /* rope_freqs.weight [n_rot/2] as Llama 3.1's converter writes it for this
                                 factor (low 1, high 4, original context 8192) */
    /* qwen35's and qwen35moe's gated delta-net layers (0 for other archs); rope.dimension_sections are
       written for the n_rot / 2 rotated pairs P as Qwen3.5's: [ceil(P/3), ceil((P - that)/2),
       the rest, 0] ([11, 11, 10, 0] for P = 32) */
    uint32_t ssm_d_conv;         /* ssm.conv_kernel */
    uint32_t ssm_d_state;        /* ssm.state_size: a head's key / value width */
    uint32_t ssm_n_group;        /* ssm.group_count: q/k heads */
    uint32_t ssm_dt_rank;        /* ssm.time_step_rank: value heads, a multiple of ssm_n_group
                                    (ssm.inner_size = ssm_d_state x this) */
    uint32_t full_attn_interval; /* full_attention_interval: layer l attends iff (l + 1) % this == 0 */
    uint32_t n_ff_shexp;         /* qwen35moe: expert_shared_feed_forward_length, the shared expert's
                                    width (0: n_ff, llama.cpp's default; 0 for other archs) */
} kp_mkmodel_spec;

/* Fills *out with a named shape (wtype F32, seed 1, alignment 0):
 *   "smollm2-135m"  llama, 30 layers, n_embd 576, 9 heads / 3 kv heads
 *                   (head_dim 64), n_ff 1536, tied, rope base 100000,
 *                   eps 1e-5, ctx 8192 (576 is not a multiple of 256: as
 *                   K-quants, every weight but ffn_down falls back)
 *   "tiny"          llama, 2 layers, n_embd 256, 4 / 2 heads (head_dim 64),
 *                   n_ff 512, untied, rope base 10000, eps 1e-5, ctx 2048
 *   "qwen2-tiny"    qwen2, 2 layers, n_embd 256, 4 / 2 heads (head_dim 64),
 *                   n_ff 768, tied, rope base 1e6, eps 1e-6, ctx 32768
 *   "qwen3-tiny"    qwen3, 2 layers, n_embd 256, 4 / 2 heads, head_dim 128
 *                   (!= n_embd / n_head, as in real Qwen3), n_ff 768, tied,
 *                   rope base 1e6, eps 1e-6, ctx 32768
 *   "gemma3-1b"     gemma3 (Gemma 3 1B's shape), 26 layers, n_embd 1152,
 *                   4 / 1 heads, head_dim 256, n_ff 6912, tied, rope base
 *                   1e6 (WINDOW layers 10000), eps 1e-6, ctx 32768,
 *                   sliding window 512, every 6th layer FULL
 *   "gemma3-tiny"   gemma3, 6 layers (5 WINDOW, the last FULL), n_embd 64,
 *                   2 / 1 heads, head_dim 32, n_ff 128, tied, rope base 1e6,
 *                   eps 1e-6, ctx 2048, sliding window 16
 *   "qwen3moe-30b-a3b" qwen3moe, Qwen3-30B-A3B's shape with 8 of its 48
 *                   layers: n_embd 2048, 32 / 4 heads, head_dim 128, n_ff
 *                   6144, 128 experts of width 768, 8 used, untied, rope
 *                   base 1e6, eps 1e-6, ctx 40960
 *   "qwen3moe-tiny" qwen3moe, 2 layers, n_embd 128, 4 / 2 heads, head_dim
 *                   32, n_ff 192, 8 experts of width 64, 3 used, untied,
 *                   rope base 1e6, eps 1e-6, ctx 32768
 *   "gpt-oss-20b"   gpt-oss, gpt-oss-20b's shape with 8 of its 24 layers:
 *                   n_embd 2880, 64 / 8 heads, head_dim 64, n_ff 2880, 32
 *                   experts of width 2880, 4 used, untied, rope base 150000
 *                   with YaRN (factor 32, original context 4096), eps 1e-5,
 *                   ctx 131072, sliding window 128 on even layers
 *   "gpt-oss-tiny"  gpt-oss, 4 layers (2 WINDOW, 2 FULL), n_embd 64, 4 / 2
 *                   heads, head_dim 64, n_ff 64, 8 experts of width 64, 4
 *                   used, untied, rope and YaRN as gpt-oss-20b, eps 1e-5,
 *                   ctx 131072, sliding window 16
 *   "qwen35-0.8b"   qwen35, Qwen3.5-0.8B's shape with 8 of its 24 layers (2
 *                   FULL, every 4th): n_embd 1024, 8 / 2 heads, head_dim 256,
 *                   rope on 64 dims (sections 11, 11, 10), n_ff 3584, tied,
 *                   rope base 1e7, eps 1e-6, ctx 262144; delta-net: conv 4,
 *                   16 q/k heads and 16 value heads of 128
 *   "qwen35-tiny"   qwen35, 8 layers (6 RECURRENT, layers 3 and 7 FULL),
 *                   n_embd 64, 4 / 2 heads, head_dim 32, rope on 8 dims
 *                   (sections 2, 1, 1), n_ff 128, tied, rope base 1e7, eps
 *                   1e-6, ctx 32768; delta-net: conv 4, 2 q/k heads and 4
 *                   value heads of 16
 *   "qwen35moe-35b-a3b" qwen35moe, Qwen3.5-35B-A3B's shape with 8 of its 40
 *                   layers (2 FULL, every 4th): n_embd 2048, 16 / 2 heads,
 *                   head_dim 256, rope on 64 dims (sections 11, 11, 10),
 *                   256 experts of width 512, 8 used, a shared expert of
 *                   width 512 (n_ff 512), untied, rope base 1e7, eps 1e-6,
 *                   ctx 262144; delta-net: conv 4, 16 q/k heads and 32
 *                   value heads of 128
 *   "qwen35moe-tiny" qwen35moe, qwen35-tiny's layers and attention (8
 *                   layers, layers 3 and 7 FULL, n_embd 64, 4 / 2 heads,
 *                   head_dim 32, rope on 8 dims, the same delta-net), 8
 *                   experts of width 32 with 3 used, a shared expert of
 *                   width 32 (n_ff 32), untied, rope base 1e7, eps 1e-6,
 *                   ctx 32768
 * The strings in *out are static. KP_ENOTFOUND for an unknown name. */
kp_status kp_mkmodel_spec_preset(const char *name, kp_mkmodel_spec *out, kp_error *err);

/* Checks a spec against a vocabulary size: a known arch, nonzero sizes,
 * n_head a multiple of n_head_kv, an even head_dim, a weight type mkmodel
 * writes, positive rope base and eps, a power-of-two alignment, and
 * n_vocab >= 1, n_swa / swa_pattern only for gemma3 and gpt-oss (which
 * needs n_swa >= 1), experts only and always for qwen3moe, gpt-oss and
 * qwen35moe (1 <= n_expert_used <= n_expert <= 1024, n_ff_exp >= 1), a
 * shared expert's width only for qwen35moe, YaRN only for
 * gpt-oss (factor >= 1 and an original context >= 1, or neither), MXFP4
 * only with experts, the delta-net sizes only and always for qwen35 and qwen35moe (each
 * >= 1, ssm_dt_rank a multiple of ssm_n_group, conv_kernel <= 64, and at
 * least one FULL layer) (KP_EINVAL naming what is wrong). A weight type mkmodel does
 * not write is KP_EUNSUPPORTED. Row lengths are never refused: every type
 * mkmodel writes has a fallback (kp_mkmodel_weight_type). */
kp_status kp_mkmodel_validate(const kp_mkmodel_spec *spec, uint64_t n_vocab, kp_error *err);

/* The llama.cpp `general.file_type` (llama_ftype) written for a weight type,
 * as llama-quantize labels it: F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8,
 * Q5_1 9, Q4_K 15 (MOSTLY_Q4_K_M), Q5_K 17 (MOSTLY_Q5_K_M), Q6_K 18, BF16 32,
 * MXFP4 38 (MOSTLY_MXFP4_MOE);
 * -1 for the types mkmodel does not write. */
int kp_mkmodel_file_type(kp_dtype wtype);

/*
 * The type in which a 2-D weight with rows of row_len (>= 1) elements is
 * written when the spec asks for wtype: llama-quantize's rule for
 * incompatible shapes (llama.cpp src/llama-quant.cpp, tensor_type_fallback):
 *
 *   row_len a multiple of wtype's block size     -> wtype
 *   otherwise Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and a type with
 *     32-element blocks (Q8_0 Q4_0 Q4_1 Q5_0 Q5_1) stays itself;
 *   and if row_len is not a multiple of that type's block size either -> F16
 *
 * F32, F16 and BF16 never fall back. KP_DTYPE_COUNT_ for a wtype that
 * mkmodel does not write.
 */
kp_dtype kp_mkmodel_weight_type(kp_dtype wtype, int64_t row_len);

/* A 2-D weight written in another type than the spec's (see above). */
typedef struct {
    char tensor[64];   /* "blk.0.attn_q.weight" */
    int64_t row_len;   /* its row length, ggml ne[0] */
    kp_dtype type;     /* the type written */
} kp_mkmodel_fallback;

/* What kp_mkmodel_write did. The call overwrites the whole struct (it frees
 * nothing that was in it); the caller owns `fallback` afterwards and
 * releases it with kp_mkmodel_report_clear. */
typedef struct {
    size_t n_weights;            /* matrices (2-D and 3-D tensors) written, the router included */
    size_t n_fallback;           /* of those, written in a fallback type */
    kp_mkmodel_fallback *fallback;  /* [n_fallback] in file order, or NULL */
} kp_mkmodel_report;

/* Frees r->fallback and zeroes *r; r == NULL is a no-op. */
void kp_mkmodel_report_clear(kp_mkmodel_report *r);

/* Writes the model described by `spec` to `out_path`, with every
 * `tokenizer.*` key of the GGUF file `tokenizer_gguf_path` (which must have
 * a non-empty string array tokenizer.ggml.tokens: its length is n_vocab).
 * Streams tensor by tensor, row by row: memory use is a few rows. When
 * `report` is not NULL it receives the weight count and the list of
 * weights written in a fallback type (all zero after a failure). Errors: KP_EINVAL / KP_EUNSUPPORTED for a bad spec
 * (nothing is written), the reader's errors for the tokenizer file, KP_EIO
 * when the output cannot be created or written (a partial output file is
 * removed), KP_ENOMEM. */
kp_status kp_mkmodel_write(const kp_mkmodel_spec *spec, const char *tokenizer_gguf_path,
                        const char *out_path, kp_mkmodel_report *report, kp_error *err);

#endif
