/*
 * info.c - `kvpin info` and `kvpin kv`: what a model file holds and what its
 * KV cache costs.
 *
 * info reads the metadata directly (so vocab-only files and models kvpin
 * cannot run are still described), then tries to load the model for
 * compute and says whether that works and, if not, why.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"
#include "model/model.h"

static void print_str(kp_gguf_str s, size_t max) {
    size_t n = s.len < max ? (size_t)s.len : max;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c < 32) printf("\\x%02x", c);
        else putchar(c);
    }
    if (s.len > max) fputs("...", stdout);
}

static void print_token(const kp_gguf *g, const char *key, const char *label) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    const kp_gguf_value *toks = NULL;
    kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, NULL);
    if (!kv) return;
    int64_t id = kv->value.type == KP_GGUF_TYPE_INT32 || kv->value.type == KP_GGUF_TYPE_INT64
                     ? kv->value.v.i64 : (int64_t)kv->value.v.u64;
    if (kv->value.type == KP_GGUF_TYPE_UINT32 && kv->value.v.u64 == UINT32_MAX) id = -1; /* "none" */
    printf("  %-8s %lld", label, (long long)id);
    if (toks && id >= 0 && (uint64_t)id < toks->v.arr.n) {
        fputs(" '", stdout);
        print_str(toks->v.arr.strs[id], 40);
        putchar('\'');
    } else if (toks) {
        fputs(" (none)", stdout);
    }
    putchar('\n');
}

static void print_kv_bill(const kp_hparams *hp, uint32_t n_ctx) {
    char b1[32];
    /* the block types (a block of 32 values: Q8_0 34 bytes, Q4_0 18) only
     * where head_dim is a multiple of 32 */
    static const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_F16, KP_DTYPE_Q8_0, KP_DTYPE_Q4_0};
    static const char *bytes[] = {"4", "2", "34/32", "18/32"};
    for (int i = 0; i < 4; i++) {
        kp_dtype t = types[i];
        if (i >= 2 && hp->head_dim % 32) continue;
        uint64_t per = kp_model_kv_bytes_per_token(hp, t);
        printf("  %s: 2 x %u layers x %u kv-heads x %u head_dim x %s bytes = %llu bytes/token;"
               " %u tokens: %s\n",
               kp_dtype_name(t), hp->n_kv_layer, hp->n_head_kv, hp->head_dim, bytes[i], (unsigned long long)per, n_ctx,
               cli_bytes(per * n_ctx, b1, sizeof b1));
    }
}

/* What a token costs in the FULL and in the WINDOW layers (F16 K/V): every
 * layer keeps every position, so the window layers' share is the bill of
 * keeping the prefix cache exact at any divergence point; a cache that
 * kept only the window would pay it for the last n_swa positions alone. */
static void print_kind_bill(const kp_model *m) {
    const kp_hparams *hp = &m->hp;
    if (!hp->n_swa_layers) return;
    uint64_t full = kp_model_kv_bytes_per_token_kind(m, KP_LAYER_FULL, KP_DTYPE_F16, KP_DTYPE_F16);
    uint64_t win = kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, KP_DTYPE_F16, KP_DTYPE_F16);
    printf("  by layer kind (f16): %u full layers %llu bytes/token, %u window layers %llu bytes/token\n"
           "  (every layer keeps every position, so a prompt reuses the cache exactly at any point;\n"
           "  the window layers' rows older than %u positions are kept for that reuse only,\n"
           "  unless --window-budget caps them)\n",
           hp->n_layer - hp->n_swa_layers, (unsigned long long)full, hp->n_swa_layers, (unsigned long long)win,
           hp->n_swa);
}

/* `kvpin kv`'s bill per layer kind, for a model with WINDOW layers: what a
 * sequence of n_ctx positions needs (full x n, window x min(n, W)) and
 * what the prefix cache keeps of n_ctx cached positions by default
 * (every layer's rows of every position, so reuse is exact anywhere). */
static void print_kv_kinds(const kp_model *m, uint32_t n_ctx, kp_dtype kt, kp_dtype vt) {
    const kp_hparams *hp = &m->hp;
    if (!hp->n_swa_layers) return;
    uint64_t full = kp_model_kv_bytes_per_token_kind(m, KP_LAYER_FULL, kt, vt);
    uint64_t win = kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, kt, vt);
    uint32_t in_window = n_ctx < hp->n_swa ? n_ctx : hp->n_swa;
    char b1[32], b2[32], b3[32];
    printf("by kind:    %u full layers:   %llu bytes/token x %u tokens = %s\n", hp->n_layer - hp->n_swa_layers,
           (unsigned long long)full, n_ctx, cli_bytes(full * n_ctx, b1, sizeof b1));
    printf("            %u window layers: %llu bytes/token x min(%u, window %u) = %u tokens = %s\n",
           hp->n_swa_layers, (unsigned long long)win, n_ctx, hp->n_swa, in_window,
           cli_bytes(win * in_window, b2, sizeof b2));
    printf("sequence:   %u tokens need %s (full x seq + window x min(seq, %u))\n", n_ctx,
           cli_bytes(full * n_ctx + win * in_window, b3, sizeof b3), hp->n_swa);
    printf("cached:     the prefix cache keeps the window layers' rows of every cached position\n"
           "            (%s for %u tokens) so that reuse resumes exactly anywhere; --window-budget\n"
           "            caps them, keeping them near the cached prefixes' ends\n",
           cli_bytes(win * n_ctx, b1, sizeof b1), n_ctx);
}

static const cli_opt info_tab[] = {CLI_USE(CLI_MODEL), {0}};
static const cli_opt kv_tab[] = {CLI_USE(CLI_MODEL), CLI_USE(CLI_CTX_SIZE), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V), {0}};

static void info_usage(FILE *f) {
    fprintf(f, "usage: kvpin info [options]\n"
               "Describes a model file: architecture, hyperparameters, tensor types, tokenizer,\n"
               "special tokens and the KV cache bill; vocabulary-only files too.\n");
    cli_print_options(f, info_tab);
}
static void kv_usage(FILE *f) {
    fprintf(f, "usage: kvpin kv [options]\n"
               "The KV cache memory bill of a model: bytes per token by the formula\n"
               "2 x layers x kv-heads x head_dim x element size, and for -c positions.\n");
    cli_print_options(f, kv_tab);
    fprintf(f, "Defaults: -c the training context, --kv-type f16.\n");
}

/* What kvpin computes with a loaded model: hyperparameters, rope, layer
 * kinds, norms, weights and the KV bill. */
static void print_compute(const kp_model *m) {
    char b1[32];
    const kp_hparams *hp = &m->hp;
    printf("hyperparams:   %u layers, n_embd %u, %u heads, %u kv-heads (GQA %u:1), head_dim %u,"
           " n_ff %u, vocab %u\n",
           hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_head / hp->n_head_kv,
           hp->head_dim, hp->n_ff, hp->n_vocab);
    if (hp->n_layer_nextn)
        printf("               and %u multi-token-prediction layer%s after them (a draft head), not run\n",
               hp->n_layer_nextn, hp->n_layer_nextn == 1 ? "" : "s");
    printf("context:       %u tokens (training)\n", hp->n_ctx_train);
    printf("rope:          %s, base %g, %u rotated dims, freq scale %g%s\n",
           hp->rope_type == KP_ROPE_NORM ? "NORM (adjacent pairs)" : "NEOX (halves)",
           (double)hp->rope_base, hp->n_rot, (double)hp->rope_freq_scale,
           m->rope_freqs ? ", frequency factors" : "");
    if (hp->rope_yarn)
        printf("               YaRN over an original context of %u (beta fast %g, slow %g; cos and sin x %g)\n",
               hp->yarn_n_ctx_orig, (double)hp->yarn_beta_fast, (double)hp->yarn_beta_slow,
               (double)(hp->yarn_attn_factor * (1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale))));
    if (m->layers[0].attn_sinks) printf("attention:     a learned sink logit per head in every softmax\n");
    if (hp->n_swa_layers)
        printf("attention:     %u full layers, %u sliding-window layers of %u positions (rope base %g,"
               " freq scale %g)\n",
               hp->n_layer - hp->n_swa_layers, hp->n_swa_layers, hp->n_swa, (double)hp->rope_base_swa,
               (double)hp->rope_freq_scale_swa);
    if (hp->n_expert) {
        uint64_t all = 0;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const kp_layer *L = &m->layers[l];
            all += (uint64_t)hp->n_expert * (L->e_gate.mat_bytes + L->e_up.mat_bytes + L->e_down.mat_bytes);
        }
        char b2[32];
        printf("experts:       %u per layer of width %u, %u routed per token (%s); a token reads\n"
               "               %s of the experts' %s%s\n",
               hp->n_expert, hp->n_ff_exp, hp->n_expert_used,
               hp->gate == KP_GATE_SOFTMAX_TOPK ? "top k of the logits, weights their softmax"
                                                : "softmax, top k, weights normalized",
               cli_bytes(all / hp->n_expert * hp->n_expert_used, b1, sizeof b1), cli_bytes(all, b2, sizeof b2),
               hp->swiglu_limit > 0 ? "; SwiGLU clamped" : "");
        if (hp->n_ff_shexp)
            printf("               and a shared expert of width %u that every token goes through, gated per token\n",
                   hp->n_ff_shexp);
    }
    printf("norm:          RMSNorm eps %g%s; output %s\n", (double)hp->rms_eps,
           hp->post_norms ? ", post-attention and post-FFN norms" : "",
           hp->tied_output ? "tied to token_embd" : "separate matrix");
    printf("weights:       %s (used in place from the mapping)\n",
           cli_bytes(m->weight_bytes, b1, sizeof b1));
    printf("KV cache bill:\n");
    print_kv_bill(hp, hp->n_ctx_train);
    print_kind_bill(m);
    if (hp->n_rec_layers) { /* model.h, Hybrid: K/V in the attention layers only, a state per sequence */
        char b2[32], b3[32];
        uint64_t sb = kp_model_rec_state_floats(hp) * sizeof(float);
        uint64_t bb = kp_model_kv_bytes_per_token(hp, KP_DTYPE_F16) * 16, nb = bb ? (sb + bb - 1) / bb : 0;
        printf("  hybrid: %u attention layers keep K/V; %u gated delta-net layers keep a recurrent state of\n"
               "  %s per sequence (F32: %u x %u matrices of %u x %u and a convolution tail of %u inputs),\n"
               "  outside the KV budget; it cannot be cut back, so the prefix cache keeps snapshots of it\n"
               "  (every --state-every positions, prompt and answer ends, pins) in KV blocks: %s a snapshot\n"
               "  (%llu blocks of 16 F16 positions, as much as %llu positions of K/V)\n",
               hp->n_kv_layer, hp->n_rec_layers, cli_bytes(sb, b2, sizeof b2), hp->n_rec_layers, hp->ssm_n_v_head,
               hp->ssm_d_state, hp->ssm_d_state, hp->ssm_d_conv - 1, cli_bytes(nb * bb, b3, sizeof b3),
               (unsigned long long)nb, (unsigned long long)nb * 16);
    }
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    cli_args a;
    cli_args_init(&a, "info", info_tab, info_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == CLI_STOP) return a.rc;
        if (k == CLI_MODEL) path = a.val;
    }
    if (!cli_args_no_operands(&a)) return 2;
    if (!path) path = cli_default_model();
    kp_gguf *g;
    kp_error err = {0};
    if (kp_gguf_open(&g, path, &err) != KP_OK) {
        fprintf(stderr, "kvpin info: %s\n", err.msg);
        return 1;
    }
    char b1[32];
    printf("file:          %s\n", path);
    printf("format:        GGUF v%u, %s, %zu metadata keys, %zu tensors, alignment %u\n",
           kp_gguf_version(g), cli_bytes(kp_gguf_file_size(g), b1, sizeof b1), kp_gguf_n_kv(g),
           kp_gguf_n_tensors(g), kp_gguf_alignment(g));
    kp_gguf_str s;
    if (kp_gguf_get_str(g, "general.name", &s, NULL) == KP_OK && s.data) {
        printf("name:          ");
        print_str(s, 80);
        putchar('\n');
    }
    kp_gguf_str arch = {0};
    kp_gguf_get_str(g, "general.architecture", &arch, NULL);
    printf("architecture:  ");
    if (arch.data) print_str(arch, 40);
    else fputs("(none: vocabulary-only file)", stdout);
    putchar('\n');

    /* tensor types */
    uint64_t count[KP_DTYPE_COUNT_] = {0}, bytes[KP_DTYPE_COUNT_] = {0};
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        count[t->type]++;
        bytes[t->type] += t->n_bytes;
    }
    if (kp_gguf_n_tensors(g)) {
        printf("tensor types: ");
        for (int t = 0; t < KP_DTYPE_COUNT_; t++)
            if (count[t])
                printf(" %s x%llu (%s)", kp_dtype_name((uint32_t)t), (unsigned long long)count[t],
                       cli_bytes(bytes[t], b1, sizeof b1));
        putchar('\n');
    }

    /* tokenizer */
    kp_gguf_str tm = {0}, pre = {0};
    const kp_gguf_value *toks = NULL, *merges = NULL;
    kp_gguf_get_str(g, "tokenizer.ggml.model", &tm, NULL);
    kp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
    kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, NULL);
    kp_gguf_get_arr(g, "tokenizer.ggml.merges", KP_GGUF_TYPE_STRING, &merges, NULL);
    if (tm.data) {
        printf("tokenizer:     ");
        print_str(tm, 32);
        printf(", pre-tokenizer ");
        if (pre.data) print_str(pre, 32);
        else fputs("(default)", stdout);
        printf(", %llu tokens, %llu merges\n", toks ? (unsigned long long)toks->v.arr.n : 0ull,
               merges ? (unsigned long long)merges->v.arr.n : 0ull);
        printf("special tokens:\n");
        print_token(g, "tokenizer.ggml.bos_token_id", "bos");
        print_token(g, "tokenizer.ggml.eos_token_id", "eos");
        print_token(g, "tokenizer.ggml.eot_token_id", "eot");
        print_token(g, "tokenizer.ggml.unknown_token_id", "unk");
        print_token(g, "tokenizer.ggml.padding_token_id", "pad");
        bool add_bos = kp_gguf_str_eq(tm, "llama"), add_eos = false;
        bool has_bos = kp_gguf_find(g, "tokenizer.ggml.add_bos_token") != NULL;
        kp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", add_bos, &add_bos, NULL);
        kp_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", add_eos, &add_eos, NULL);
        printf("  add_bos  %s%s, add_eos %s\n", add_bos ? "true" : "false",
               has_bos ? "" : " (default)", add_eos ? "true" : "false");
        kp_gguf_str tmpl = {0};
        kp_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL);
        if (tmpl.data) printf("chat template: %llu bytes\n", (unsigned long long)tmpl.len);
    }

    if (!arch.data || kp_gguf_n_tensors(g) == 0) {
        kp_gguf_close(g);
        return 0;
    }
    kp_model *m;
    int rc = 0;
    if (kp_model_from_gguf(&m, g, &err) != KP_OK) { /* takes g */
        printf("compute:       not runnable by kvpin: %s\n", err.msg);
        fflush(stdout);
        fprintf(stderr, "kvpin info: %s\n", err.msg);
        return 1;
    }
    print_compute(m);
    kp_model_free(m);
    return rc;
}

int cmd_kv(int argc, char **argv) {
    const char *path = NULL;
    int64_t ctx = -1;
    kp_dtype kv_type = KP_DTYPE_F16, kv_type_v = KP_DTYPE_F16;
    cli_args a;
    cli_args_init(&a, "kv", kv_tab, kv_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == CLI_STOP) return a.rc;
        if (k == CLI_MODEL) path = a.val;
        else if (k == CLI_CTX_SIZE && !cli_parse_i64(a.opt, a.val, 1, 1 << 30, &ctx)) return 2;
        else if ((k == CLI_KV_TYPE || k == CLI_KV_TYPE_K || k == CLI_KV_TYPE_V) &&
                 !cli_parse_kv_opt(k, a.val, &kv_type, &kv_type_v))
            return 2;
    }
    if (!cli_args_no_operands(&a)) return 2;
    if (!path) path = cli_default_model();
    kp_model *m;
    kp_error err = {0};
    if (kp_model_load(&m, path, &err) != KP_OK) {
        fprintf(stderr, "kvpin kv: %s\n", err.msg);
        return 1;
    }
    const kp_hparams *hp = &m->hp;
    uint32_t n_ctx = ctx > 0 ? (uint32_t)ctx : hp->n_ctx_train;
    uint64_t per = kp_model_kv_bytes_per_token_kv(hp, kv_type, kv_type_v);
    char b1[32], b2[32], kvf[96], kvn[24];
    printf("model:      %s (%s, %u layers, %u kv-heads, head_dim %u)\n", path, hp->arch_name,
           hp->n_layer, hp->n_head_kv, hp->head_dim);
    if (kv_type == kv_type_v && (kv_type == KP_DTYPE_F16 || kv_type == KP_DTYPE_F32))
        printf("formula:    2 x %u layers x %u kv-heads x %u head_dim x %zu bytes (%s)\n", hp->n_kv_layer,
               hp->n_head_kv, hp->head_dim, kp_dtype_row_size(kv_type, 1), kp_dtype_name(kv_type));
    else
        printf("formula:    %s bytes (%s)\n", cli_kv_formula(hp, kv_type, kv_type_v, kvf, sizeof kvf),
               cli_kv_name(kv_type, kv_type_v, kvn, sizeof kvn));
    printf("per token:  %llu bytes\n", (unsigned long long)per);
    printf("context:    %u tokens -> %s (%llu bytes)\n", n_ctx, cli_bytes(per * n_ctx, b1, sizeof b1),
           (unsigned long long)(per * n_ctx));
    print_kv_kinds(m, n_ctx, kv_type, kv_type_v);
    printf("weights:    %s; grouped-query attention: %u query heads share each kv-head"
           " (full multi-head KV would need %s)\n",
           cli_bytes(m->weight_bytes, b2, sizeof b2), hp->n_head / hp->n_head_kv,
           cli_bytes(per * n_ctx * (hp->n_head / hp->n_head_kv), b1, sizeof b1));
    kp_model_free(m);
    return 0;
}
