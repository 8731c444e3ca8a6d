/*
 * mkmodel.c - `kvpin mkmodel`: write a GGUF model with seeded random weights
 * (src/mkmodel.h does the work).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/mkmodel.h"

static void mk_usage(FILE *out) {
    fprintf(out,
            "usage: kvpin mkmodel -o OUT.gguf [--preset NAME] [--tokenizer FILE.gguf] [--type T]\n"
            "                     [--arch llama|qwen2|qwen3] [--layers N] [--embd N] [--heads N]\n"
            "                     [--kv-heads N] [--head-dim N] [--ff N] [--ctx N] [--rope-base F]\n"
            "                     [--eps F] [--tied | --untied] [--seed S] [--name NAME]\n"
            "presets: smollm2-135m, tiny, qwen2-tiny, qwen3-tiny (default tiny)\n"
            "types: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K (default F32)\n"
            "Every 2-D weight gets --type, as llama-quantize --pure writes it, with the same\n"
            "fallback for rows whose length is not a multiple of the type's block size:\n"
            "Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (e.g. the 576-wide rows of\n"
            "smollm2-135m), and F16 when even 32 does not divide the row. Those tensors are\n"
            "listed on stderr; general.file_type stays the one of --type (Q4_K: Q4_K_M).\n"
            "The tokenizer (every tokenizer.* key) is copied from --tokenizer (default: the\n"
            "bundled model).\n");
}

int cmd_mkmodel(int argc, char **argv) {
    const char *out = NULL, *tokenizer = NULL, *preset = "tiny";
    kp_error err = {0};
    kp_mkmodel_spec spec;
    /* the preset first, so later options override it */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
    if (kp_mkmodel_spec_preset(preset, &spec, &err) != KP_OK) {
        fprintf(stderr, "kvpin mkmodel: %s\n", err.msg);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            mk_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tied")) {
            spec.tied = true;
        } else if (!strcmp(a, "--untied")) {
            spec.tied = false;
        } else if (!v) {
            fprintf(stderr, "kvpin mkmodel: unknown argument or missing value: '%s'\n", a);
            return 2;
        } else {
            i++;
            if (!strcmp(a, "-o")) out = v;
            else if (!strcmp(a, "--preset")) continue;
            else if (!strcmp(a, "--tokenizer")) tokenizer = v;
            else if (!strcmp(a, "--arch")) spec.arch = v;
            else if (!strcmp(a, "--name")) spec.name = v;
            else if (!strcmp(a, "--type")) {
                if (!kp_dtype_parse(v, &spec.wtype)) {
                    fprintf(stderr, "kvpin mkmodel: unknown type '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(a, "--seed")) {
                if (!cli_parse_u64(a, v, &spec.seed)) return 2;
            } else if (!strcmp(a, "--rope-base")) {
                if (!cli_parse_f32(a, v, &spec.rope_base)) return 2;
            } else if (!strcmp(a, "--eps")) {
                if (!cli_parse_f32(a, v, &spec.rms_eps)) return 2;
            } else {
                uint32_t *field = !strcmp(a, "--layers") ? &spec.n_layer
                                  : !strcmp(a, "--embd") ? &spec.n_embd
                                  : !strcmp(a, "--heads") ? &spec.n_head
                                  : !strcmp(a, "--kv-heads") ? &spec.n_head_kv
                                  : !strcmp(a, "--head-dim") ? &spec.head_dim
                                  : !strcmp(a, "--ff") ? &spec.n_ff
                                  : !strcmp(a, "--ctx") ? &spec.n_ctx : NULL;
                if (!field) {
                    fprintf(stderr, "kvpin mkmodel: unknown argument '%s'\n", a);
                    return 2;
                }
                if (!cli_parse_i64(a, v, 0, 1 << 24, &n)) return 2;
                *field = (uint32_t)n;
            }
        }
    }
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
