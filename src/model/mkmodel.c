/*
 * mkmodel.c - random-weight GGUF models (API and weight scales in mkmodel.h).
 *
 * What it owns: the plan of a model (tensor names, shapes, types, how each
 * is initialised), the random stream, and the row buffers used while
 * streaming. The file format itself is gguf_write.c's; the tokenizer is read
 * with gguf.c; rows are encoded by quant.c.
 *
 * Metadata, in this order (the order llama.cpp's gguf-py writer uses for the
 * shipped reference models, so an F32 file with the same spec and tokenizer
 * has a byte-identical header):
 *
 *   general.architecture                   str   arch
 *   general.name                           str   spec.name or arch
 *   general.alignment                      u32   only when spec.alignment != 32
 *   {arch}.block_count                     u32   n_layer
 *   {arch}.context_length                  u32   n_ctx
 *   {arch}.embedding_length                u32   n_embd
 *   {arch}.feed_forward_length             u32   n_ff
 *   {arch}.expert_feed_forward_length      u32   n_ff_exp        } qwen3moe, gpt-oss,
 *   {arch}.expert_count                    u32   n_expert        } qwen35moe
 *   {arch}.expert_used_count               u32   n_expert_used   }
 *   {arch}.expert_shared_feed_forward_length u32 n_ff_shexp, or n_ff when 0 (qwen35moe)
 *   {arch}.attention.head_count            u32   n_head
 *   {arch}.attention.head_count_kv         u32   n_head_kv
 *   {arch}.attention.key_length            u32   head_dim  } when head_dim != n_embd/n_head,
 *   {arch}.attention.value_length          u32   head_dim  } and always for qwen3, gemma3, qwen3moe
 *   {arch}.attention.sliding_window        u32   n_swa, when not 0 (gemma3)
 *   {arch}.attention.sliding_window_pattern u32  swa_pattern, when not 0 (gemma3)
 *   {arch}.rope.dimension_count            u32   head_dim
 *   qwen35, qwen35moe: {arch}.rope.dimension_sections i32[4], {arch}.ssm.conv_kernel,
 *     .ssm.state_size, .ssm.group_count, .ssm.time_step_rank, .ssm.inner_size,
 *     .full_attention_interval (u32)
 *   {arch}.vocab_size                      u32   n_vocab
 *   {arch}.rope.freq_base                  f32   rope_base
 *   {arch}.attention.layer_norm_rms_epsilon f32  rms_eps
 *   general.file_type                      u32   kp_mkmodel_file_type(wtype), also when
 *                                                some weights fell back (as llama-quantize)
 *   general.quantization_version           u32   2, when wtype is not F32 (as
 *                                                llama-quantize writes it)
 *   tokenizer.*                            (verbatim, in the source file's order)
 *
 * Tensors, in file order (also the order their values are drawn); W =
 * kp_mkmodel_weight_type(wtype, row length), hd = head_dim, ne in ggml order
 * [row length, rows]:
 *
 *   token_embd.weight              W    [n_embd, n_vocab]   N(0,1) untied, N(0,1/n_embd) tied
 *   for each layer N:
 *     blk.N.attn_norm.weight       F32  [n_embd]            1 + 0.1 N(0,1)
 *     blk.N.attn_q.weight          W    [n_embd, n_head*hd]     N(0, 1/n_embd)
 *     blk.N.attn_k.weight          W    [n_embd, n_head_kv*hd]  N(0, 1/n_embd)
 *     blk.N.attn_v.weight          W    [n_embd, n_head_kv*hd]  N(0, 1/n_embd)
 *     blk.N.attn_{q,k,v}.bias      F32  [n_head*hd], [n_head_kv*hd] x2   qwen2: 0.5 N(0,1)
 *     blk.N.attn_{q,k}_norm.weight F32  [hd]                qwen3, gemma3, qwen3moe: 1 + 0.1 N(0,1)
 *     blk.N.attn_output.weight     W    [n_head*hd, n_embd]     N(0, 1/(n_head*hd))
 *     blk.N.post_attention_norm.weight F32 [n_embd]         gemma3: 1 + 0.1 N(0,1)
 *     blk.N.ffn_norm.weight        F32  [n_embd]            1 + 0.1 N(0,1)
 *     blk.N.ffn_gate.weight        W    [n_embd, n_ff]      N(0, 1/n_embd)   } not qwen3moe
 *     blk.N.ffn_up.weight          W    [n_embd, n_ff]      N(0, 1/n_embd)   }
 *     blk.N.ffn_down.weight        W    [n_ff, n_embd]      N(0, 1/n_ff)     }
 *     blk.N.ffn_gate_inp.weight    F32  [n_embd, n_expert]            N(0, 1/n_embd)    } qwen3moe,
 *     blk.N.ffn_gate_exps.weight   W    [n_embd, n_ff_exp, n_expert]  N(0, 1/n_embd)    } instead
 *     blk.N.ffn_up_exps.weight     W    [n_embd, n_ff_exp, n_expert]  N(0, 1/n_embd)    }
 *     blk.N.ffn_down_exps.weight   W    [n_ff_exp, n_embd, n_expert]  N(0, 1/n_ff_exp)  }
 *     qwen35moe, after the experts (S = n_ff_shexp, or n_ff when 0):
 *     blk.N.ffn_gate_inp_shexp.weight F32 [n_embd]          N(0, 1/n_embd)
 *     blk.N.ffn_gate_shexp.weight  W    [n_embd, S]         N(0, 1/n_embd)
 *     blk.N.ffn_up_shexp.weight    W    [n_embd, S]         N(0, 1/n_embd)
 *     blk.N.ffn_down_shexp.weight  W    [S, n_embd]         N(0, 1/S)
 *     (qwen35 and qwen35moe: the layers of plan_qwen35_layer, their FFN as above)
 *     blk.N.post_ffw_norm.weight   F32  [n_embd]            gemma3: 1 + 0.1 N(0,1)
 *   output_norm.weight             F32  [n_embd]            1 + 0.1 N(0,1)
 *   output.weight                  W    [n_embd, n_vocab]   N(0, 1/n_embd)   (untied only)
 *
 * Random stream: xoshiro256** seeded through splitmix64, uniforms of 53
 * bits, normals by Marsaglia's polar method with a logarithm computed here
 * from + - * / and frexp only (no libm transcendentals, whose last bit may
 * differ between C libraries), and IEEE sqrt. FP contraction is switched off
 * below (a fused multiply-add rounds once instead of twice, so FMA and
 * non-FMA machines would disagree); every value is then the same on every
 * IEEE-754 machine, so same spec + seed + tokenizer file -> the same bytes,
 * provided quant.c's encoders are also built without contraction (gcc's
 * default under the Makefile's -std=c11; the K-quant encoders give other
 * bytes under -std=gnu11 with FMA). Each value is drawn in double, scaled,
 * rounded to float, then encoded to the tensor's type one row at a time.
 */
#include "model/mkmodel.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "kernels/quant.h"

/* ---- random numbers ---- */

typedef struct {
    kp_rng r;
    bool has_spare;
    double spare;
} mk_rng;

static void rng_seed(mk_rng *r, uint64_t seed) {
    kp_rng_seed(&r->r, seed);
    r->has_spare = false;
    r->spare = 0;
}

/* Uniform in [0, 1), 53 random bits. */
static double rng_uniform(mk_rng *r) { return kp_rng_unit(&r->r); }

/* Natural logarithm of x > 0, from exactly rounded operations only:
 * x = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
 * s = (m-1)/(m+1), |s| <= 0.1716, summed to s^19 (error below 1e-15). */
static double det_log(double x) {
    int e;
    double m = frexp(x, &e); /* exact: m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double p = 1.0 / 19.0;
    p = 1.0 / 17.0 + z * p;
    p = 1.0 / 15.0 + z * p;
    p = 1.0 / 13.0 + z * p;
    p = 1.0 / 11.0 + z * p;
    p = 1.0 / 9.0 + z * p;
    p = 1.0 / 7.0 + z * p;
    p = 1.0 / 5.0 + z * p;
    p = 1.0 / 3.0 + z * p;
    p = 1.0 + z * p;
    return (double)e * 0.69314718055994530942 + 2.0 * s * p;
}

/* Standard normal N(0,1): Marsaglia's polar method (two values per accepted pair). */
static double rng_normal(mk_rng *r) {
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    for (;;) {
        double u = 2.0 * rng_uniform(r) - 1.0;
        double v = 2.0 * rng_uniform(r) - 1.0;
        double q = u * u + v * v;
        if (q >= 1.0 || q == 0.0) continue;
        double f = sqrt(-2.0 * det_log(q) / q);
        r->spare = v * f;
        r->has_spare = true;
        return u * f;
    }
}

/* ---- presets and validation ---- */

typedef struct {
    const char *name;
    kp_mkmodel_spec spec;
} mk_preset;

static const mk_preset presets[] = {
    {"smollm2-135m",
     {"llama", 30, 576, 9, 3, 0, 1536, 8192, 100000.0f, 1e-5f, true, KP_DTYPE_F32, 1,
      "smollm2-135m", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"tiny",
     {"llama", 2, 256, 4, 2, 0, 512, 2048, 10000.0f, 1e-5f, false, KP_DTYPE_F32, 1, "tiny", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"qwen2-tiny",
     {"qwen2", 2, 256, 4, 2, 0, 768, 32768, 1000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "qwen2-tiny", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"qwen3-tiny",
     {"qwen3", 2, 256, 4, 2, 128, 768, 32768, 1000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "qwen3-tiny", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"gemma3-1b",
     {"gemma3", 26, 1152, 4, 1, 256, 6912, 32768, 1000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "gemma3-1b", 0, 512, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"gemma3-tiny",
     {"gemma3", 6, 64, 2, 1, 32, 128, 2048, 1000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "gemma3-tiny", 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"qwen3moe-30b-a3b",
     {"qwen3moe", 8, 2048, 32, 4, 128, 6144, 40960, 1000000.0f, 1e-6f, false, KP_DTYPE_F32, 1,
      "qwen3moe-30b-a3b", 0, 0, 0, 128, 8, 768, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"qwen3moe-tiny",
     {"qwen3moe", 2, 128, 4, 2, 32, 192, 32768, 1000000.0f, 1e-6f, false, KP_DTYPE_F32, 1,
      "qwen3moe-tiny", 0, 0, 0, 8, 3, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"gpt-oss-20b",
     {"gpt-oss", 8, 2880, 64, 8, 64, 2880, 131072, 150000.0f, 1e-5f, false, KP_DTYPE_F32, 1,
      "gpt-oss-20b", 0, 128, 0, 32, 4, 2880, 32.0f, 4096, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"gpt-oss-tiny",
     {"gpt-oss", 4, 64, 4, 2, 64, 64, 131072, 150000.0f, 1e-5f, false, KP_DTYPE_F32, 1,
      "gpt-oss-tiny", 0, 16, 0, 8, 4, 64, 32.0f, 4096, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"qwen35-0.8b",
     {"qwen35", 8, 1024, 8, 2, 256, 3584, 262144, 10000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "qwen35-0.8b", 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 4, 128, 16, 16, 4, 0}},
    /* Qwen3.5-4B (hidden 2560, 16 heads / 4 kv-heads of 256 with rope on a
     * quarter, FFN 9216, rope base 1e7; 8 of its 32 layers), delta-net 16
     * q/k and 32 value heads of 128 as Qwen3.5's larger models */
    {"qwen35-4b",
     {"qwen35", 8, 2560, 16, 4, 256, 9216, 262144, 10000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "qwen35-4b", 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 4, 128, 16, 32, 4, 0}},
    {"qwen35-tiny",
     {"qwen35", 8, 64, 4, 2, 32, 128, 32768, 10000000.0f, 1e-6f, true, KP_DTYPE_F32, 1,
      "qwen35-tiny", 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 4, 16, 2, 4, 4, 0}},
    {"qwen35moe-35b-a3b",
     {"qwen35moe", 8, 2048, 16, 2, 256, 512, 262144, 10000000.0f, 1e-6f, false, KP_DTYPE_F32, 1,
      "qwen35moe-35b-a3b", 0, 0, 0, 256, 8, 512, 0, 0, 64, 0, 0, 4, 128, 16, 32, 4, 512}},
    {"qwen35moe-tiny",
     {"qwen35moe", 8, 64, 4, 2, 32, 32, 32768, 10000000.0f, 1e-6f, false, KP_DTYPE_F32, 1,
      "qwen35moe-tiny", 0, 0, 0, 8, 3, 32, 0, 0, 8, 0, 0, 4, 16, 2, 4, 4, 32}},
};

kp_status kp_mkmodel_spec_preset(const char *name, kp_mkmodel_spec *out, kp_error *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].spec;
            return KP_OK;
        }
    }
    return kp_fail(err, KP_ENOTFOUND,
                   "mkmodel: unknown preset '%s' (smollm2-135m, tiny, qwen2-tiny, qwen3-tiny, gemma3-1b, "
                   "gemma3-tiny, qwen3moe-30b-a3b, qwen3moe-tiny, gpt-oss-20b, gpt-oss-tiny, qwen35-0.8b, qwen35-4b, qwen35-tiny, "
                   "qwen35moe-35b-a3b, qwen35moe-tiny)",
                   name);
}

typedef enum {
    ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA3, ARCH_QWEN3MOE, ARCH_GPTOSS, ARCH_QWEN35, ARCH_QWEN35MOE,
    ARCH_UNKNOWN
} mk_arch;

static mk_arch arch_of(const char *arch) {
    if (!arch) return ARCH_UNKNOWN;
    if (strcmp(arch, "llama") == 0) return ARCH_LLAMA;
    if (strcmp(arch, "qwen2") == 0) return ARCH_QWEN2;
    if (strcmp(arch, "qwen3") == 0) return ARCH_QWEN3;
    if (strcmp(arch, "gemma3") == 0) return ARCH_GEMMA3;
    if (strcmp(arch, "qwen3moe") == 0) return ARCH_QWEN3MOE;
    if (strcmp(arch, "gpt-oss") == 0) return ARCH_GPTOSS;
    if (strcmp(arch, "qwen35") == 0) return ARCH_QWEN35;
    if (strcmp(arch, "qwen35moe") == 0) return ARCH_QWEN35MOE;
    return ARCH_UNKNOWN;
}

int kp_mkmodel_file_type(kp_dtype wtype) {
    switch (wtype) { /* llama_ftype */
    case KP_DTYPE_F32: return 0;
    case KP_DTYPE_F16: return 1;
    case KP_DTYPE_Q4_0: return 2;
    case KP_DTYPE_Q4_1: return 3;
    case KP_DTYPE_Q8_0: return 7;
    case KP_DTYPE_Q5_0: return 8;
    case KP_DTYPE_Q5_1: return 9;
    case KP_DTYPE_Q4_K: return 15; /* MOSTLY_Q4_K_M */
    case KP_DTYPE_Q5_K: return 17; /* MOSTLY_Q5_K_M */
    case KP_DTYPE_Q6_K: return 18;
    case KP_DTYPE_BF16: return 32;
    case KP_DTYPE_MXFP4: return 38; /* MOSTLY_MXFP4_MOE */
    default: return -1;
    }
}

/*
 * llama-quantize's shape fallback (tensor_type_fallback in llama.cpp's
 * src/llama-quant.cpp): a K-quant goes to the 32-element type of similar
 * size, a 32-element type has nothing smaller and stays, and what still
 * does not divide the row is written as F16.
 */
kp_dtype kp_mkmodel_weight_type(kp_dtype wtype, int64_t row_len) {
    if (kp_mkmodel_file_type(wtype) < 0) return KP_DTYPE_COUNT_;
    const uint32_t bs = kp_dtype_get(wtype)->block_size;
    if (row_len % bs == 0) return wtype;
    kp_dtype t = wtype;
    switch (wtype) {
    case KP_DTYPE_Q4_K: t = KP_DTYPE_Q5_0; break;
    case KP_DTYPE_Q5_K: t = KP_DTYPE_Q5_1; break;
    case KP_DTYPE_Q6_K: t = KP_DTYPE_Q8_0; break;
    default: break; /* Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 MXFP4: 32-element blocks already */
    }
    return row_len % kp_dtype_get(t)->block_size == 0 ? t : KP_DTYPE_F16;
}

void kp_mkmodel_report_clear(kp_mkmodel_report *r) {
    if (!r) return;
    free(r->fallback);
    memset(r, 0, sizeof *r);
}

static uint32_t head_dim_of(const kp_mkmodel_spec *s) {
    return s->head_dim ? s->head_dim : (s->n_head ? s->n_embd / s->n_head : 0);
}

kp_status kp_mkmodel_validate(const kp_mkmodel_spec *s, uint64_t n_vocab, kp_error *err) {
    if (arch_of(s->arch) == ARCH_UNKNOWN)
        return kp_fail(err, KP_EUNSUPPORTED,
                       "mkmodel: architecture '%s' (mkmodel writes llama, qwen2, qwen3, gemma3, qwen3moe, "
                       "gpt-oss, qwen35, qwen35moe)",
                       s->arch ? s->arch : "(null)");
    if (kp_mkmodel_file_type(s->wtype) < 0)
        return kp_fail(err, KP_EUNSUPPORTED,
                       "mkmodel: weight type %s (mkmodel writes F32 F16 BF16 Q8_0 Q4_0 Q4_1 "
                       "Q5_0 Q5_1 Q4_K Q5_K Q6_K, and MXFP4 for experts)",
                       kp_dtype_name(s->wtype));
    if (s->n_layer == 0 || s->n_embd == 0 || s->n_head == 0 || s->n_head_kv == 0 ||
        s->n_ff == 0 || s->n_ctx == 0)
        return kp_fail(err, KP_EINVAL,
                       "mkmodel: n_layer, n_embd, n_head, n_head_kv, n_ff and n_ctx must be >= 1");
    if (s->n_layer > 100000)
        return kp_fail(err, KP_EINVAL, "mkmodel: %u layers is too many", s->n_layer);
    if (s->n_head % s->n_head_kv != 0)
        return kp_fail(err, KP_EINVAL, "mkmodel: n_head %u is not a multiple of n_head_kv %u",
                       s->n_head, s->n_head_kv);
    uint32_t hd = head_dim_of(s);
    if (s->head_dim == 0 && s->n_embd % s->n_head != 0)
        return kp_fail(err, KP_EINVAL,
                       "mkmodel: n_embd %u is not a multiple of n_head %u; set head_dim",
                       s->n_embd, s->n_head);
    if (hd == 0 || hd % 2 != 0)
        return kp_fail(err, KP_EINVAL, "mkmodel: head_dim %u must be even and >= 2 (rope pairs)",
                       hd);
    if ((uint64_t)s->n_head * hd > INT32_MAX)
        return kp_fail(err, KP_EINVAL, "mkmodel: n_head * head_dim is too large");
    if (!(s->rope_base > 0.0f) || !isfinite(s->rope_base))
        return kp_fail(err, KP_EINVAL, "mkmodel: rope_base %g must be positive", s->rope_base);
    if (s->n_rot && (s->n_rot % 2 || s->n_rot > head_dim_of(s)))
        return kp_fail(err, KP_EINVAL, "mkmodel: rope dims %u must be even and at most head_dim %lld", s->n_rot,
                       (long long)head_dim_of(s));
    if (s->rope_scale_linear < 0 || !isfinite(s->rope_scale_linear) || s->rope_freqs_llama3 < 0 ||
        !isfinite(s->rope_freqs_llama3) || (s->rope_freqs_llama3 > 0 && s->rope_freqs_llama3 < 1))
        return kp_fail(err, KP_EINVAL, "mkmodel: a rope scaling factor must be positive (llama3: at least 1)");
    if (!(s->rms_eps > 0.0f) || !isfinite(s->rms_eps))
        return kp_fail(err, KP_EINVAL, "mkmodel: rms_eps %g must be positive", s->rms_eps);
    if (s->alignment != 0 && (s->alignment & (s->alignment - 1)) != 0)
        return kp_fail(err, KP_EINVAL, "mkmodel: alignment %u is not a power of two",
                       s->alignment);
    mk_arch arch = arch_of(s->arch);
    if ((s->n_swa || s->swa_pattern) && arch != ARCH_GEMMA3 && arch != ARCH_GPTOSS)
        return kp_fail(err, KP_EINVAL, "mkmodel: a sliding window (n_swa %u, pattern %u) needs arch gemma3 or gpt-oss",
                       s->n_swa, s->swa_pattern);
    if (arch == ARCH_GPTOSS && s->n_swa == 0)
        return kp_fail(err, KP_EINVAL, "mkmodel: gpt-oss needs a sliding window (n_swa >= 1)");
    const bool hybrid = arch == ARCH_QWEN35 || arch == ARCH_QWEN35MOE;
    if (arch == ARCH_QWEN3MOE || arch == ARCH_GPTOSS || arch == ARCH_QWEN35MOE) {
        if (s->n_expert == 0 || s->n_expert > 1024 || s->n_expert_used == 0 || s->n_expert_used > s->n_expert ||
            s->n_ff_exp == 0)
            return kp_fail(err, KP_EINVAL,
                           "mkmodel: %s needs 1 <= experts used (%u) <= experts (%u) <= 1024 and an "
                           "expert FFN width >= 1 (%u)",
                           s->arch, s->n_expert_used, s->n_expert, s->n_ff_exp);
    } else if (s->n_expert || s->n_expert_used || s->n_ff_exp) {
        return kp_fail(err, KP_EINVAL,
                       "mkmodel: experts (%u, %u used, width %u) need arch qwen3moe, gpt-oss or qwen35moe",
                       s->n_expert, s->n_expert_used, s->n_ff_exp);
    } else if (s->wtype == KP_DTYPE_MXFP4) {
        return kp_fail(err, KP_EINVAL, "mkmodel: MXFP4 is for experts (arch qwen3moe, gpt-oss or qwen35moe)");
    }
    if (s->n_ff_shexp && arch != ARCH_QWEN35MOE)
        return kp_fail(err, KP_EINVAL, "mkmodel: a shared expert (width %u) needs arch qwen35moe", s->n_ff_shexp);
    if ((s->yarn_factor != 0 || s->yarn_orig_ctx != 0) &&
        (!(s->yarn_factor >= 1.0f) || !isfinite(s->yarn_factor) || s->yarn_orig_ctx == 0))
        return kp_fail(err, KP_EINVAL,
                       "mkmodel: YaRN (factor %g, original context %u) needs a factor >= 1 and an original context >= 1",
                       s->yarn_factor, s->yarn_orig_ctx);
    if (s->yarn_factor != 0 && s->rope_scale_linear != 0)
        return kp_fail(err, KP_EINVAL, "mkmodel: one rope scaling, linear or YaRN, not both");
    bool ssm = s->ssm_d_conv || s->ssm_d_state || s->ssm_n_group || s->ssm_dt_rank || s->full_attn_interval;
    if (hybrid) {
        if (!s->ssm_d_conv || s->ssm_d_conv > 64 || !s->ssm_d_state || !s->ssm_n_group || !s->ssm_dt_rank ||
            s->ssm_dt_rank % s->ssm_n_group || !s->full_attn_interval || s->full_attn_interval > s->n_layer)
            return kp_fail(err, KP_EINVAL,
                           "mkmodel: %s needs a conv kernel of 1 to 64 (%u), a state size (%u), q/k heads (%u) "
                           "dividing value heads (%u), and a full-attention interval (%u) of at most the %u layers",
                           s->arch, s->ssm_d_conv, s->ssm_d_state, s->ssm_n_group, s->ssm_dt_rank, s->full_attn_interval,
                           s->n_layer);
        if ((s->n_rot ? s->n_rot : hd) < 2)
            return kp_fail(err, KP_EINVAL, "mkmodel: %s needs at least one rotated pair", s->arch);
    } else if (ssm) {
        return kp_fail(err, KP_EINVAL, "mkmodel: delta-net sizes need arch qwen35 or qwen35moe");
    }
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return kp_fail(err, KP_EINVAL, "mkmodel: vocabulary of %llu tokens",
                       (unsigned long long)n_vocab);
    return KP_OK;
}

/* ---- the plan ---- */

typedef enum { INIT_GAUSS, INIT_NORM, INIT_ROPE_FREQS, INIT_SSM_A } mk_init;

typedef struct {
    char name[KP_GGUF_W_MAX_TENSOR_NAME];
    uint32_t n_dims;
    int64_t ne[3];      /* unused dims 1 */
    kp_dtype type;
    bool fixed_type;    /* a matrix kept in its own type (the router, MXFP4's Q8_0), not the spec's */
    bool bias;          /* a 2-D bias (gpt-oss's experts'): F32, not a weight */
    mk_init init;
    double scale; /* INIT_GAUSS: standard deviation; INIT_ROPE_FREQS: the llama3 factor */
    double base;  /* INIT_ROPE_FREQS: the rope base */
} mk_tensor;

typedef struct {
    mk_tensor *t;
    size_t n, cap;
} mk_plan;

static void plan_add(mk_plan *p, const char *name, int64_t ne0, int64_t ne1, kp_dtype type,
                     mk_init init, double scale) {
    assert(p->n < p->cap); /* plan_build computes the capacity exactly */
    if (p->n >= p->cap) return;
    mk_tensor *t = &p->t[p->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->ne[2] = 1;
    /* 2-D weights: the spec's type, or llama-quantize's fallback for this row length */
    t->type = ne1 > 0 ? kp_mkmodel_weight_type(type, ne0) : type;
    t->init = init;
    t->scale = scale;
}

static double inv_sqrt(uint64_t n) { return 1.0 / sqrt((double)n); }

/* A 3-D tensor of n_mat matrices [ne0, ne1] (experts), N(0, 1/ne0). */
static void plan_add_experts(mk_plan *p, const char *name, int64_t ne0, int64_t ne1, uint32_t n_mat, kp_dtype type) {
    plan_add(p, name, ne0, ne1, type, INIT_GAUSS, inv_sqrt((uint64_t)ne0));
    if (p->n == 0) return;
    p->t[p->n - 1].n_dims = 3;
    p->t[p->n - 1].ne[2] = n_mat;
}

/* A 1-D or 2-D F32 bias, N(0, scale^2). */
static void plan_add_bias(mk_plan *p, const char *name, int64_t ne0, int64_t ne1, double scale) {
    plan_add(p, name, ne0, ne1, KP_DTYPE_F32, INIT_GAUSS, scale);
    if (p->n) p->t[p->n - 1].bias = p->t[p->n - 1].fixed_type = true;
}

/* The last planned tensor keeps its type whatever the spec's (Q8_0 under MXFP4). */
static void plan_fix_type(mk_plan *p, bool fixed) {
    if (p->n && fixed) p->t[p->n - 1].fixed_type = true;
}

/* Layer l's FFN, after its norm: the dense FFN, or the router (F32, as
 * llama-quantize leaves ffn_gate_inp) and the experts, with gpt-oss's
 * biases or qwen35moe's shared expert. W: the other matrices' type (Q8_0
 * under MXFP4, then kept as such: mxfp4). */
static void plan_ffn(mk_plan *p, const kp_mkmodel_spec *s, uint32_t l, kp_dtype W, bool mxfp4) {
    char nm[KP_GGUF_W_MAX_TENSOR_NAME];
    const bool gptoss = arch_of(s->arch) == ARCH_GPTOSS;
    int64_t E = s->n_embd, F = s->n_ff, X = s->n_ff_exp, N = s->n_expert;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, l), nm)
    if (!s->n_expert) {
        plan_add(p, BLK("ffn_gate.weight"), E, F, W, INIT_GAUSS, inv_sqrt(E));
        plan_add(p, BLK("ffn_up.weight"), E, F, W, INIT_GAUSS, inv_sqrt(E));
        plan_add(p, BLK("ffn_down.weight"), F, E, W, INIT_GAUSS, inv_sqrt(F));
        return;
    }
    double gu = gptoss ? 3.0 : 1.0; /* gpt-oss: reach the SwiGLU's clamp now and then */
    plan_add(p, BLK("ffn_gate_inp.weight"), E, N, KP_DTYPE_F32, INIT_GAUSS, inv_sqrt(E));
    p->t[p->n - 1].fixed_type = true;
    if (gptoss) plan_add_bias(p, BLK("ffn_gate_inp.bias"), N, 0, 0.5);
    plan_add_experts(p, BLK("ffn_gate_exps.weight"), E, X, s->n_expert, s->wtype);
    p->t[p->n - 1].scale *= gu;
    if (gptoss) plan_add_bias(p, BLK("ffn_gate_exps.bias"), X, N, 0.1);
    plan_add_experts(p, BLK("ffn_up_exps.weight"), E, X, s->n_expert, s->wtype);
    p->t[p->n - 1].scale *= gu;
    if (gptoss) plan_add_bias(p, BLK("ffn_up_exps.bias"), X, N, 0.1);
    plan_add_experts(p, BLK("ffn_down_exps.weight"), X, E, s->n_expert, s->wtype);
    p->t[p->n - 1].scale /= gu * gu; /* and back to outputs of the residual's size */
    if (gptoss) plan_add_bias(p, BLK("ffn_down_exps.bias"), E, N, 0.1);
    if (arch_of(s->arch) == ARCH_QWEN35MOE) { /* the shared expert: its 1-D gate F32, as llama-quantize leaves it */
        int64_t S = s->n_ff_shexp ? s->n_ff_shexp : F;
        plan_add_bias(p, BLK("ffn_gate_inp_shexp.weight"), E, 0, inv_sqrt(E));
        plan_add(p, BLK("ffn_gate_shexp.weight"), E, S, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("ffn_up_shexp.weight"), E, S, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("ffn_down_shexp.weight"), S, E, W, INIT_GAUSS, inv_sqrt(S));
        plan_fix_type(p, mxfp4);
    }
#undef BLK
}

/* One qwen35 or qwen35moe layer (mkmodel.h's table): a RECURRENT gated
 * delta-net layer, or every full_attn_interval-th a gated attention layer
 * (q projection twice as wide: a query and a gate per head), then the FFN
 * (plan_ffn). */
static void plan_qwen35_layer(mk_plan *p, const kp_mkmodel_spec *s, uint32_t l, kp_dtype W, bool mxfp4) {
    char nm[KP_GGUF_W_MAX_TENSOR_NAME];
    int64_t E = s->n_embd, hd = head_dim_of(s);
    int64_t nq = (int64_t)s->n_head * hd, nkv = (int64_t)s->n_head_kv * hd;
    int64_t H = s->ssm_dt_rank, Dv = (int64_t)s->ssm_d_state * H;
    int64_t C = 2 * (int64_t)s->ssm_d_state * s->ssm_n_group + Dv;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, l), nm)
    plan_add(p, BLK("attn_norm.weight"), E, 0, KP_DTYPE_F32, INIT_NORM, 0);
    if ((l + 1) % s->full_attn_interval != 0) {
        plan_add(p, BLK("attn_qkv.weight"), E, C, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("attn_gate.weight"), E, Dv, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("ssm_conv1d.weight"), s->ssm_d_conv, C, KP_DTYPE_F32, INIT_GAUSS, inv_sqrt(s->ssm_d_conv));
        plan_fix_type(p, true);
        plan_add_bias(p, BLK("ssm_dt.bias"), H, 0, 0.5);
        plan_add(p, BLK("ssm_a"), H, 0, KP_DTYPE_F32, INIT_SSM_A, 0);
        plan_add(p, BLK("ssm_beta.weight"), E, H, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("ssm_alpha.weight"), E, H, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("ssm_norm.weight"), s->ssm_d_state, 0, KP_DTYPE_F32, INIT_NORM, 0);
        plan_add(p, BLK("ssm_out.weight"), Dv, E, W, INIT_GAUSS, inv_sqrt(Dv));
        plan_fix_type(p, mxfp4);
    } else {
        plan_add(p, BLK("attn_q.weight"), E, 2 * nq, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("attn_k.weight"), E, nkv, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("attn_v.weight"), E, nkv, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("attn_q_norm.weight"), hd, 0, KP_DTYPE_F32, INIT_NORM, 0);
        plan_add(p, BLK("attn_k_norm.weight"), hd, 0, KP_DTYPE_F32, INIT_NORM, 0);
        plan_add(p, BLK("attn_output.weight"), nq, E, W, INIT_GAUSS, inv_sqrt(nq));
        plan_fix_type(p, mxfp4);
    }
    plan_add(p, BLK("post_attention_norm.weight"), E, 0, KP_DTYPE_F32, INIT_NORM, 0);
#undef BLK
    plan_ffn(p, s, l, W, mxfp4);
}

static kp_status plan_build(const kp_mkmodel_spec *s, uint64_t n_vocab, mk_plan *p, kp_error *err) {
    mk_arch arch = arch_of(s->arch);
    int64_t hd = head_dim_of(s);
    int64_t nq = (int64_t)s->n_head * hd, nkv = (int64_t)s->n_head_kv * hd;
    int64_t E = s->n_embd, V = (int64_t)n_vocab;
    /* MXFP4 as llama-quantize's MXFP4_MOE: the experts MXFP4, every other matrix Q8_0 */
    const bool mxfp4 = s->wtype == KP_DTYPE_MXFP4;
    kp_dtype W = mxfp4 ? KP_DTYPE_Q8_0 : s->wtype;
    const bool gptoss = arch == ARCH_GPTOSS;
    bool qk_norm = arch == ARCH_QWEN3 || arch == ARCH_GEMMA3 || arch == ARCH_QWEN3MOE;
    bool post_norms = arch == ARCH_GEMMA3, experts = arch == ARCH_QWEN3MOE || gptoss;
    size_t per_layer = 9 + (arch == ARCH_QWEN2 || gptoss ? 3 : 0) + (qk_norm ? 2 : 0) + (post_norms ? 2 : 0) +
                       (experts ? 1 : 0) + (gptoss ? 6 : 0);
    p->cap = 2 + (s->tied ? 0 : 1) + (s->rope_freqs_llama3 > 0 ? 1 : 0) + per_layer * s->n_layer;
    if (arch == ARCH_QWEN35 || arch == ARCH_QWEN35MOE) {
        /* recurrent layers: 11 tensors, attention layers 8, then the FFN: 3 dense, or 8 (the router, the
         * experts, the shared expert and its gate) */
        uint32_t n_full = s->n_layer / s->full_attn_interval;
        size_t ffn = arch == ARCH_QWEN35MOE ? 8 : 3;
        p->cap = 2 + (s->tied ? 0 : 1) + (11 + ffn) * (size_t)(s->n_layer - n_full) + (8 + ffn) * (size_t)n_full;
    }
    p->n = 0;
    p->t = calloc(p->cap, sizeof *p->t);
    if (!p->t) return kp_fail(err, KP_ENOMEM, "mkmodel: out of memory planning tensors");
    plan_add(p, "token_embd.weight", E, V, W, INIT_GAUSS, s->tied ? inv_sqrt(E) : 1.0);
    plan_fix_type(p, mxfp4);
    for (uint32_t l = 0; l < s->n_layer; l++) {
        char nm[KP_GGUF_W_MAX_TENSOR_NAME];
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, l), nm)
        if (arch == ARCH_QWEN35 || arch == ARCH_QWEN35MOE) {
            plan_qwen35_layer(p, s, l, W, mxfp4);
            continue;
        }
        plan_add(p, BLK("attn_norm.weight"), E, 0, KP_DTYPE_F32, INIT_NORM, 0);
        plan_add(p, BLK("attn_q.weight"), E, nq, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("attn_k.weight"), E, nkv, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        plan_add(p, BLK("attn_v.weight"), E, nkv, W, INIT_GAUSS, inv_sqrt(E));
        plan_fix_type(p, mxfp4);
        if (arch == ARCH_QWEN2 || gptoss) {
            plan_add_bias(p, BLK("attn_q.bias"), nq, 0, 0.5);
            plan_add_bias(p, BLK("attn_k.bias"), nkv, 0, 0.5);
            plan_add_bias(p, BLK("attn_v.bias"), nkv, 0, 0.5);
        }
        if (qk_norm) {
            plan_add(p, BLK("attn_q_norm.weight"), hd, 0, KP_DTYPE_F32, INIT_NORM, 0);
            plan_add(p, BLK("attn_k_norm.weight"), hd, 0, KP_DTYPE_F32, INIT_NORM, 0);
        }
        plan_add(p, BLK("attn_output.weight"), nq, E, W, INIT_GAUSS, inv_sqrt(nq));
        plan_fix_type(p, mxfp4);
        if (gptoss) {
            plan_add_bias(p, BLK("attn_output.bias"), E, 0, 0.1);
            plan_add_bias(p, BLK("attn_sinks.weight"), s->n_head, 0, 1.0);
        }
        /* gpt-oss's FFN norm is its post_attention_norm */
        if (post_norms || gptoss) plan_add(p, BLK("post_attention_norm.weight"), E, 0, KP_DTYPE_F32, INIT_NORM, 0);
        if (!gptoss) plan_add(p, BLK("ffn_norm.weight"), E, 0, KP_DTYPE_F32, INIT_NORM, 0);
        plan_ffn(p, s, l, W, mxfp4);
        if (post_norms) plan_add(p, BLK("post_ffw_norm.weight"), E, 0, KP_DTYPE_F32, INIT_NORM, 0);
#undef BLK
    }
    plan_add(p, "output_norm.weight", E, 0, KP_DTYPE_F32, INIT_NORM, 0);
    if (!s->tied) plan_add(p, "output.weight", E, V, W, INIT_GAUSS, inv_sqrt(E));
    if (!s->tied) plan_fix_type(p, mxfp4);
    if (s->rope_freqs_llama3 > 0) {
        plan_add(p, "rope_freqs.weight", (s->n_rot ? s->n_rot : hd) / 2, 0, KP_DTYPE_F32, INIT_ROPE_FREQS,
                 s->rope_freqs_llama3);
        p->t[p->n - 1].base = s->rope_base;
    }
    return p->n == p->cap ? KP_OK
                          : kp_fail(err, KP_EINVAL, "mkmodel: internal error planning tensors");
}

/* ---- metadata ---- */

static kp_status add_metadata(kp_gguf_w *w, const kp_mkmodel_spec *s, uint64_t n_vocab,
                              const kp_gguf *tok, kp_error *err) {
    mk_arch arch = arch_of(s->arch);
    uint32_t hd = head_dim_of(s);
    char key[128];
    kp_status st = KP_OK;
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
#define TRY(call)                                                                             \
    do {                                                                                      \
        if ((st = (call)) != KP_OK) return st;                                                \
    } while (0)
    TRY(kp_gguf_w_add_str(w, "general.architecture", s->arch, err));
    TRY(kp_gguf_w_add_str(w, "general.name", s->name ? s->name : s->arch, err));
    if (s->alignment != 0 && s->alignment != KP_GGUF_DEFAULT_ALIGNMENT)
        TRY(kp_gguf_w_add_u32(w, "general.alignment", s->alignment, err));
    TRY(kp_gguf_w_add_u32(w, KEY("block_count"), s->n_layer, err));
    TRY(kp_gguf_w_add_u32(w, KEY("context_length"), s->n_ctx, err));
    TRY(kp_gguf_w_add_u32(w, KEY("embedding_length"), s->n_embd, err));
    TRY(kp_gguf_w_add_u32(w, KEY("feed_forward_length"), s->n_ff, err));
    if (s->n_expert) {
        TRY(kp_gguf_w_add_u32(w, KEY("expert_feed_forward_length"), s->n_ff_exp, err));
        TRY(kp_gguf_w_add_u32(w, KEY("expert_count"), s->n_expert, err));
        TRY(kp_gguf_w_add_u32(w, KEY("expert_used_count"), s->n_expert_used, err));
    }
    if (arch == ARCH_QWEN35MOE)
        TRY(kp_gguf_w_add_u32(w, KEY("expert_shared_feed_forward_length"), s->n_ff_shexp ? s->n_ff_shexp : s->n_ff,
                              err));
    TRY(kp_gguf_w_add_u32(w, KEY("attention.head_count"), s->n_head, err));
    TRY(kp_gguf_w_add_u32(w, KEY("attention.head_count_kv"), s->n_head_kv, err));
    if ((uint64_t)hd * s->n_head != s->n_embd || arch == ARCH_QWEN3 || arch == ARCH_GEMMA3 || arch == ARCH_QWEN3MOE ||
        arch == ARCH_GPTOSS || arch == ARCH_QWEN35 || arch == ARCH_QWEN35MOE) {
        TRY(kp_gguf_w_add_u32(w, KEY("attention.key_length"), hd, err));
        TRY(kp_gguf_w_add_u32(w, KEY("attention.value_length"), hd, err));
    }
    if (s->n_swa) TRY(kp_gguf_w_add_u32(w, KEY("attention.sliding_window"), s->n_swa, err));
    if (s->swa_pattern) TRY(kp_gguf_w_add_u32(w, KEY("attention.sliding_window_pattern"), s->swa_pattern, err));
    TRY(kp_gguf_w_add_u32(w, KEY("rope.dimension_count"), s->n_rot ? s->n_rot : hd, err));
    if (arch == ARCH_QWEN35 || arch == ARCH_QWEN35MOE) { /* Qwen3.5's split of the rotated pairs, [11, 11, 10, 0] for 32 */
        int32_t P = (int32_t)(s->n_rot ? s->n_rot : hd) / 2, sec[4];
        sec[0] = (P + 2) / 3;
        sec[1] = (P - sec[0] + 1) / 2;
        sec[2] = P - sec[0] - sec[1];
        sec[3] = 0;
        TRY(kp_gguf_w_add_arr(w, KEY("rope.dimension_sections"), KP_GGUF_TYPE_INT32, sec, 4, err));
        TRY(kp_gguf_w_add_u32(w, KEY("ssm.conv_kernel"), s->ssm_d_conv, err));
        TRY(kp_gguf_w_add_u32(w, KEY("ssm.state_size"), s->ssm_d_state, err));
        TRY(kp_gguf_w_add_u32(w, KEY("ssm.group_count"), s->ssm_n_group, err));
        TRY(kp_gguf_w_add_u32(w, KEY("ssm.time_step_rank"), s->ssm_dt_rank, err));
        TRY(kp_gguf_w_add_u32(w, KEY("ssm.inner_size"), s->ssm_d_state * s->ssm_dt_rank, err));
        TRY(kp_gguf_w_add_u32(w, KEY("full_attention_interval"), s->full_attn_interval, err));
    }
    if (s->rope_scale_linear > 0) {
        TRY(kp_gguf_w_add_str(w, KEY("rope.scaling.type"), "linear", err));
        TRY(kp_gguf_w_add_f32(w, KEY("rope.scaling.factor"), s->rope_scale_linear, err));
    }
    TRY(kp_gguf_w_add_u32(w, KEY("vocab_size"), (uint32_t)n_vocab, err));
    TRY(kp_gguf_w_add_f32(w, KEY("rope.freq_base"), s->rope_base, err));
    if (s->yarn_factor != 0) {
        TRY(kp_gguf_w_add_str(w, KEY("rope.scaling.type"), "yarn", err));
        TRY(kp_gguf_w_add_f32(w, KEY("rope.scaling.factor"), s->yarn_factor, err));
        TRY(kp_gguf_w_add_u32(w, KEY("rope.scaling.original_context_length"), s->yarn_orig_ctx, err));
    }
    TRY(kp_gguf_w_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->rms_eps, err));
    TRY(kp_gguf_w_add_u32(w, "general.file_type", (uint32_t)kp_mkmodel_file_type(s->wtype), err));
    if (s->wtype != KP_DTYPE_F32)
        TRY(kp_gguf_w_add_u32(w, "general.quantization_version", 2, err));
    static const char prefix[] = "tokenizer.";
    for (size_t i = 0; i < kp_gguf_n_kv(tok); i++) {
        const kp_gguf_kv *kv = kp_gguf_kv_at(tok, i);
        if (kv->key.len >= sizeof prefix - 1 &&
            memcmp(kv->key.data, prefix, sizeof prefix - 1) == 0)
            TRY(kp_gguf_w_copy_kv(w, kv, err));
    }
#undef TRY
#undef KEY
    return st;
}

/* ---- data ---- */

/* Draws, encodes and writes one tensor, a row at a time. */
static kp_status write_tensor(kp_gguf_w *w, const mk_tensor *t, mk_rng *rng, float *row,
                              void *encoded, const char *out_path, kp_error *err) {
    size_t row_bytes = kp_dtype_row_size(t->type, t->ne[0]);
    for (int64_t r = 0; r < t->ne[1] * t->ne[2]; r++) {
        if (t->init == INIT_GAUSS) {
            for (int64_t i = 0; i < t->ne[0]; i++) row[i] = (float)(t->scale * rng_normal(rng));
        } else if (t->init == INIT_ROPE_FREQS) {
            /* Llama 3.1's: 1 for short wavelengths, the factor for long ones, smoothed between */
            const double low = 1, high = 4, old_ctx = 8192, factor = t->scale, pi = 3.14159265358979323846;
            for (int64_t i = 0; i < t->ne[0]; i++) {
                double freq = pow(t->base, -2.0 * (double)i / (double)(2 * t->ne[0]));
                double wavelen = 2 * pi / freq;
                if (wavelen < old_ctx / high) row[i] = 1.0f;
                else if (wavelen > old_ctx / low) row[i] = (float)factor;
                else {
                    double smooth = (old_ctx / wavelen - low) / (high - low);
                    row[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
                }
            }
        } else if (t->init == INIT_SSM_A) {
            for (int64_t i = 0; i < t->ne[0]; i++) row[i] = (float)-(0.05 + 0.5 * rng_uniform(rng));
        } else {
            for (int64_t i = 0; i < t->ne[0]; i++) row[i] = (float)(1.0 + 0.1 * rng_normal(rng));
        }
        if (!kp_quantize_row(t->type, row, encoded, t->ne[0]))
            return kp_fail(err, KP_EUNSUPPORTED, "mkmodel: '%s': cannot encode %s as %s",
                           out_path, t->name, kp_dtype_name(t->type));
        kp_status st = kp_gguf_w_write_data(w, encoded, row_bytes, err);
        if (st != KP_OK) return st;
    }
    return KP_OK;
}

/* Sets *r to the plan's 2-D weights and those not of the spec's type. */
static kp_status fill_report(const mk_plan *plan, kp_dtype wtype, kp_mkmodel_report *r,
                             kp_error *err) {
    memset(r, 0, sizeof *r);
    size_t n_fb = 0;
    for (size_t i = 0; i < plan->n; i++) {
        r->n_weights += plan->t[i].n_dims >= 2 && !plan->t[i].bias;
        n_fb += plan->t[i].n_dims >= 2 && !plan->t[i].fixed_type && plan->t[i].type != wtype;
    }
    if (n_fb == 0) return KP_OK;
    r->fallback = calloc(n_fb, sizeof *r->fallback);
    if (!r->fallback) return kp_fail(err, KP_ENOMEM, "mkmodel: out of memory for the report");
    for (size_t i = 0; i < plan->n; i++) {
        const mk_tensor *t = &plan->t[i];
        if (t->n_dims < 2 || t->fixed_type || t->type == wtype) continue;
        kp_mkmodel_fallback *f = &r->fallback[r->n_fallback++];
        snprintf(f->tensor, sizeof f->tensor, "%s", t->name);
        f->row_len = t->ne[0];
        f->type = t->type;
    }
    return KP_OK;
}

kp_status kp_mkmodel_write(const kp_mkmodel_spec *spec, const char *tokenizer_gguf_path,
                        const char *out_path, kp_mkmodel_report *report, kp_error *err) {
    kp_gguf *tok = NULL;
    kp_gguf_w *w = NULL;
    mk_plan plan = {0};
    float *row = NULL;
    void *encoded = NULL;
    if (report) memset(report, 0, sizeof *report);

    /* Everything that can be refused is refused before the output is created. */
    kp_status st = kp_gguf_open(&tok, tokenizer_gguf_path, err);
    if (st != KP_OK) goto done;
    const kp_gguf_value *tokens = NULL;
    st = kp_gguf_get_arr(tok, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &tokens, err);
    if (st != KP_OK) goto done;
    if (!tokens || tokens->v.arr.n == 0) {
        st = kp_fail(err, KP_EFORMAT, "mkmodel: '%s' has no tokenizer.ggml.tokens list",
                     tokenizer_gguf_path);
        goto done;
    }
    uint64_t n_vocab = tokens->v.arr.n;
    if ((st = kp_mkmodel_validate(spec, n_vocab, err)) != KP_OK) goto done;
    if ((st = plan_build(spec, n_vocab, &plan, err)) != KP_OK) goto done;
    if (report && (st = fill_report(&plan, spec->wtype, report, err)) != KP_OK) goto done;
    if ((st = kp_gguf_w_new(&w, err)) != KP_OK) goto done;
    if ((st = add_metadata(w, spec, n_vocab, tok, err)) != KP_OK) goto done;
    kp_gguf_close(tok); /* its metadata was copied into the writer */
    tok = NULL;

    int64_t max_row = 0;
    size_t max_bytes = 0;
    for (size_t i = 0; i < plan.n; i++) {
        const mk_tensor *t = &plan.t[i];
        if ((st = kp_gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err)) != KP_OK)
            goto done;
        if (t->ne[0] > max_row) max_row = t->ne[0];
        size_t b = kp_dtype_row_size(t->type, t->ne[0]);
        if (b > max_bytes) max_bytes = b;
    }
    row = malloc((size_t)max_row * sizeof *row);
    encoded = malloc(max_bytes);
    if (!row || !encoded) {
        st = kp_fail(err, KP_ENOMEM, "mkmodel: out of memory for row buffers");
        goto done;
    }

    if ((st = kp_gguf_w_begin(w, out_path, err)) != KP_OK) goto done;
    mk_rng rng;
    rng_seed(&rng, spec->seed);
    for (size_t i = 0; i < plan.n && st == KP_OK; i++)
        st = write_tensor(w, &plan.t[i], &rng, row, encoded, out_path, err);
    if (st == KP_OK) st = kp_gguf_w_finish(w, err);

done:
    if (st != KP_OK) kp_mkmodel_report_clear(report);
    kp_gguf_close(tok);
    kp_gguf_w_free(w); /* removes the partial file unless finish succeeded */
    free(plan.t);
    free(row);
    free(encoded);
    return st;
}
