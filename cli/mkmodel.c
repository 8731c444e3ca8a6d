/*
 * mkmodel.c - `kvpin mkmodel`: write a GGUF model with seeded random weights
 * (src/mkmodel.h does the work).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/mkmodel.h"

enum {
    O_OUTPUT = CLI_OWN, O_PRESET, O_TOKENIZER, O_TYPE, O_ARCH, O_LAYERS, O_EMBD, O_HEADS, O_KV_HEADS, O_HEAD_DIM,
    O_FF, O_CTX_TRAIN, O_ROPE_BASE, O_EPS, O_TIED, O_UNTIED, O_NAME, O_SLIDING_WINDOW, O_SWA_PATTERN,
    O_EXPERTS, O_EXPERTS_USED, O_EXPERT_FF, O_SHARED_FF, O_ROPE_DIMS, O_ROPE_SCALING, O_ROPE_FREQS
};

static const cli_opt mk_tab[] = {
    {"output", "o", NULL, "FILE", "write the model to FILE", O_OUTPUT},
    {"preset", NULL, NULL, "NAME",
     "the shape to start from: smollm2-135m, tiny, qwen2-tiny, qwen3-tiny, gemma3-1b, gemma3-tiny, "
     "qwen3moe-30b-a3b, qwen3moe-tiny, gpt-oss-20b, gpt-oss-tiny, qwen35-0.8b, qwen35-4b, qwen35-tiny, qwen35moe-35b-a3b, "
     "qwen35moe-tiny", O_PRESET},
    {"tokenizer", NULL, NULL, "FILE", "copy every tokenizer.* key from this GGUF file", O_TOKENIZER},
    {"type", NULL, NULL, "T",
     "weight type: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K, or MXFP4 (experts MXFP4, other "
     "matrices Q8_0, as llama-quantize MXFP4_MOE)", O_TYPE},
    {"arch", NULL, NULL, "ARCH",
     "llama, qwen2, qwen3, gemma3, qwen3moe, gpt-oss, qwen35 or qwen35moe (all but llama, qwen2 and qwen3 "
     "alone start from their -tiny preset)", O_ARCH},
    {"layers", NULL, NULL, "N", "layers", O_LAYERS},
    {"embd", NULL, NULL, "N", "embedding width", O_EMBD},
    {"heads", NULL, NULL, "N", "query heads", O_HEADS},
    {"kv-heads", NULL, NULL, "N", "key/value heads", O_KV_HEADS},
    {"head-dim", NULL, NULL, "N", "width of a head", O_HEAD_DIM},
    {"ff", NULL, NULL, "N", "feed-forward width", O_FF},
    {"ctx-train", NULL, "ctx", "N", "the training context the model declares", O_CTX_TRAIN},
    {"rope-base", NULL, NULL, "F", "RoPE frequency base", O_ROPE_BASE},
    {"eps", NULL, NULL, "F", "RMS norm epsilon", O_EPS},
    {"rope-dims", NULL, NULL, "N", "rotate only the first N dims of a head (rope.dimension_count; even)",
     O_ROPE_DIMS},
    {"rope-scaling", NULL, NULL, "linear:F|yarn:F:CTX", "linear rope scaling by F, or YaRN by F from an original\n"
                                                       "context of CTX (rope.scaling.type, .factor, and\n"
                                                       "original_context_length)", O_ROPE_SCALING},
    {"rope-freqs", NULL, NULL, "llama3:F", "a rope_freqs.weight tensor as Llama 3.1's converter writes it for\n"
                                           "factor F (low 1, high 4, original context 8192)", O_ROPE_FREQS},
    {"sliding-window", NULL, NULL, "N", "gemma3, gpt-oss: window layers see the last N positions (0: none)",
     O_SLIDING_WINDOW},
    {"swa-pattern", NULL, NULL, "N",
     "gemma3, gpt-oss: every N-th layer attends to everything (0: llama.cpp's 6, resp. 2)",
     O_SWA_PATTERN},
    {"experts", NULL, NULL, "N", "qwen3moe, gpt-oss, qwen35moe: experts per layer", O_EXPERTS},
    {"experts-used", NULL, NULL, "K", "qwen3moe, gpt-oss, qwen35moe: experts each token is routed to",
     O_EXPERTS_USED},
    {"expert-ff", NULL, NULL, "N", "qwen3moe, gpt-oss, qwen35moe: an expert's feed-forward width", O_EXPERT_FF},
    {"shared-ff", NULL, NULL, "N", "qwen35moe: the shared expert's feed-forward width (0: --ff)", O_SHARED_FF},
    {"tied", NULL, NULL, NULL, "the output matrix is the token embedding", O_TIED},
    {"untied", NULL, NULL, NULL, "a separate output matrix", O_UNTIED},
    CLI_USE(CLI_SEED),
    {"name", NULL, NULL, "NAME", "general.name of the model", O_NAME},
    {0},
};

static void mk_usage(FILE *out) {
    fprintf(out,
            "usage: kvpin mkmodel -o OUT.gguf [options]\n"
            "Writes a GGUF model with seeded random weights. Every 2-D weight gets --type, as\n"
            "llama-quantize --pure writes it, with the same fallback for rows whose length is not a\n"
            "multiple of the type's block size: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (e.g. the\n"
            "576-wide rows of smollm2-135m), and F16 when even 32 does not divide the row. Those\n"
            "tensors are listed on stderr; general.file_type stays the one of --type (Q4_K: Q4_K_M).\n");
    cli_print_options(out, mk_tab);
    fprintf(out, "Defaults: --preset tiny (gemma3-tiny with --arch gemma3, qwen3moe-tiny with --arch qwen3moe,\n"
                 "gpt-oss-tiny with --arch gpt-oss, qwen35-tiny with --arch qwen35, qwen35moe-tiny with --arch\n"
                 "qwen35moe), --type F32, the preset's shape and seed, --tokenizer the bundled model. Options\n"
                 "after the preset override it, in any order.\n");
}

int cmd_mkmodel(int argc, char **argv) {
    const char *out = NULL, *tokenizer = NULL, *preset = NULL, *arch = NULL;
    kp_error err = {0};
    kp_mkmodel_spec spec;
    cli_args a;
    /* the preset first (a quiet scan), so the other options override it */
    cli_args_init(&a, "mkmodel", mk_tab, mk_usage, argc, argv);
    a.quiet = true;
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == O_PRESET) preset = a.val;
        if (k == O_ARCH) arch = a.val;
    }
    if (!preset)
        preset = !arch                      ? "tiny"
                 : !strcmp(arch, "gemma3")   ? "gemma3-tiny"
                 : !strcmp(arch, "qwen3moe") ? "qwen3moe-tiny"
                 : !strcmp(arch, "gpt-oss")  ? "gpt-oss-tiny"
                 : !strcmp(arch, "qwen35")   ? "qwen35-tiny"
                 : !strcmp(arch, "qwen35moe") ? "qwen35moe-tiny"
                                             : "tiny";
    if (kp_mkmodel_spec_preset(preset, &spec, &err) != KP_OK) {
        fprintf(stderr, "kvpin mkmodel: %s\n", err.msg);
        return 2;
    }
    cli_args_init(&a, "mkmodel", mk_tab, mk_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        const char *v = a.val, *opt = a.opt;
        int64_t n;
        uint32_t *field = NULL;
        switch (k) {
        case CLI_STOP: return a.rc;
        case O_TIED: spec.tied = true; break;
        case O_UNTIED: spec.tied = false; break;
        case O_OUTPUT: out = v; break;
        case O_PRESET: break;
        case O_TOKENIZER: tokenizer = v; break;
        case O_ARCH: spec.arch = v; break;
        case O_NAME: spec.name = v; break;
        case O_TYPE:
            if (!kp_dtype_parse(v, &spec.wtype)) {
                fprintf(stderr, "kvpin mkmodel: unknown type '%s'\n", v);
                return 2;
            }
            break;
        case CLI_SEED:
            if (!cli_parse_u64(opt, v, &spec.seed)) return 2;
            break;
        case O_ROPE_BASE:
            if (!cli_parse_f32(opt, v, &spec.rope_base)) return 2;
            break;
        case O_EPS:
            if (!cli_parse_f32(opt, v, &spec.rms_eps)) return 2;
            break;
        case O_ROPE_DIMS: field = &spec.n_rot; break;
        case O_ROPE_SCALING:
            if (!strncmp(v, "yarn:", 5)) { /* yarn:FACTOR:ORIGINAL_CONTEXT */
                char *colon = strchr(v + 5, ':');
                char fac[32];
                int64_t orig = 0;
                if (!colon || (size_t)(colon - v - 5) >= sizeof fac) {
                    fprintf(stderr, "kvpin mkmodel: %s takes yarn:FACTOR:ORIGINAL_CONTEXT, not '%s'\n", opt, v);
                    return 2;
                }
                memcpy(fac, v + 5, (size_t)(colon - v - 5));
                fac[colon - v - 5] = 0;
                if (!cli_parse_f32(opt, fac, &spec.yarn_factor) || !cli_parse_i64(opt, colon + 1, 1, 1 << 24, &orig))
                    return 2;
                spec.yarn_orig_ctx = (uint32_t)orig;
                break;
            }
            /* fall through: linear:FACTOR */
            __attribute__((fallthrough));
        case O_ROPE_FREQS: {
            const char *want = k == O_ROPE_SCALING ? "linear:" : "llama3:";
            if (strncmp(v, want, strlen(want)) ||
                !cli_parse_f32(opt, v + strlen(want), k == O_ROPE_SCALING ? &spec.rope_scale_linear
                                                                           : &spec.rope_freqs_llama3)) {
                if (strncmp(v, want, strlen(want)))
                    fprintf(stderr, "kvpin mkmodel: %s takes %sFACTOR%s, not '%s'\n", opt, want,
                            k == O_ROPE_SCALING ? " or yarn:FACTOR:ORIGINAL_CONTEXT" : "", v);
                return 2;
            }
            break;
        }
        case O_LAYERS: field = &spec.n_layer; break;
        case O_EMBD: field = &spec.n_embd; break;
        case O_HEADS: field = &spec.n_head; break;
        case O_KV_HEADS: field = &spec.n_head_kv; break;
        case O_HEAD_DIM: field = &spec.head_dim; break;
        case O_FF: field = &spec.n_ff; break;
        case O_CTX_TRAIN: field = &spec.n_ctx; break;
        case O_SLIDING_WINDOW: field = &spec.n_swa; break;
        case O_SWA_PATTERN: field = &spec.swa_pattern; break;
        case O_EXPERTS: field = &spec.n_expert; break;
        case O_EXPERTS_USED: field = &spec.n_expert_used; break;
        case O_EXPERT_FF: field = &spec.n_ff_exp; break;
        case O_SHARED_FF: field = &spec.n_ff_shexp; break;
        }
        if (field) {
            if (!cli_parse_i64(opt, v, 0, 1 << 24, &n)) return 2;
            *field = (uint32_t)n;
        }
    }
    if (!cli_args_no_operands(&a)) return 2;
    if (!out) {
        mk_usage(stderr);
        return 2;
    }
    if (!tokenizer) tokenizer = cli_default_model();
    kp_mkmodel_report rep;
    if (kp_mkmodel_write(&spec, tokenizer, out, &rep, &err) != KP_OK) {
        fprintf(stderr, "kvpin mkmodel: %s\n", err.msg);
        return 1;
    }
    const kp_dtype_info *wt = kp_dtype_get(spec.wtype);
    for (size_t i = 0; i < rep.n_fallback; i++) {
        const kp_mkmodel_fallback *f = &rep.fallback[i];
        fprintf(stderr, "%-28s rows of %lld not a multiple of %u (%s) -> %s\n", f->tensor,
                (long long)f->row_len, wt->block_size, wt->name, kp_dtype_name(f->type));
    }
    if (rep.n_fallback)
        fprintf(stderr, "%zu of %zu weights fell back to another type, as llama-quantize does\n",
                rep.n_fallback, rep.n_weights);
    fprintf(stderr, "wrote %s (%s, %u layers, n_embd %u, %s, seed %llu)\n", out, spec.arch,
            spec.n_layer, spec.n_embd, kp_dtype_name(spec.wtype), (unsigned long long)spec.seed);
    kp_mkmodel_report_clear(&rep);
    return 0;
}
