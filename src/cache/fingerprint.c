/*
 * fingerprint.c - the model fingerprint and the weights-hash cache
 * (fingerprint.h).
 *
 * Weights cache file, one line:
 *
 *   kvpin-weights 1 <size> <mtime sec> <mtime nsec> <32 hex> <path>\n
 *
 * It is written to a temporary name and renamed over the old one, so a
 * reader sees a whole line or the previous one. Owns nothing past a call.
 */
#include "cache/fingerprint.h"

#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

kp_bkey kp_fingerprint_weights_compute(const kp_model *m) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    size_t n = kp_gguf_n_tensors(m->file);
    for (size_t i = 0; i < n; i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(m->file, i);
        uint64_t hdr[4 + KP_GGUF_MAX_DIMS] = {t->name.len, t->type, t->n_dims, t->n_bytes};
        for (uint32_t d = 0; d < KP_GGUF_MAX_DIMS; d++) hdr[4 + d] = (uint64_t)t->ne[d];
        XXH3_128bits_update(&st, hdr, sizeof hdr);
        XXH3_128bits_update(&st, t->name.data, t->name.len);
        XXH3_128bits_update(&st, t->data, t->n_bytes);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    kp_bkey k;
    memcpy(k.b, c.digest, 16);
    return k;
}

/* The cache file's name for model path `path`: beside it, or under dir. */
static void cache_name(const char *path, const char *dir, char *out, size_t cap) {
    if (!dir) {
        snprintf(out, cap, "%s.kvpin-fp", path);
        return;
    }
    snprintf(out, cap, "%s/weights-%016llx.fp", dir, (unsigned long long)XXH3_64bits(path, strlen(path)));
}

/* True when file `name` holds a line for (path, st) and sets *out. */
static bool cache_read(const char *name, const char *path, const struct stat *st, kp_bkey *out) {
    /* a regular file only (a FIFO there would block the start) */
    int fd = open(name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat fsb;
    if (fd < 0) return false;
    FILE *f = fstat(fd, &fsb) == 0 && S_ISREG(fsb.st_mode) ? fdopen(fd, "r") : NULL;
    if (!f) {
        close(fd);
        return false;
    }
    char line[4352], hex[64];
    bool ok = false;
    if (fgets(line, sizeof line, f)) {
        unsigned long long size, sec, nsec;
        int used = 0;
        if (sscanf(line, "kvpin-weights 1 %llu %llu %llu %40s %n", &size, &sec, &nsec, hex, &used) == 4 && used > 0) {
            char *p = line + used;
            p[strcspn(p, "\n")] = 0;
            ok = size == (unsigned long long)st->st_size && sec == (unsigned long long)st->st_mtim.tv_sec &&
                 nsec == (unsigned long long)st->st_mtim.tv_nsec && !strcmp(p, path) && kp_bkey_parse(hex, out);
        }
    }
    fclose(f);
    return ok;
}

static bool cache_write(const char *name, const char *path, const struct stat *st, const kp_bkey *k) {
    char tmp[4200], hex[33];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", name, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return false;
    kp_bkey_hex(k, hex);
    int w = fprintf(f, "kvpin-weights 1 %llu %llu %llu %s %s\n", (unsigned long long)st->st_size,
                    (unsigned long long)st->st_mtim.tv_sec, (unsigned long long)st->st_mtim.tv_nsec, hex, path);
    bool ok = w > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, name) == 0) return true;
    unlink(tmp);
    return false;
}

kp_status kp_fingerprint_weights(const kp_model *m, const char *cache_dir, kp_bkey *out, bool *from_cache, kp_error *err) {
    if (from_cache) *from_cache = false;
    const char *path = kp_gguf_path(m->file);
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        *out = kp_fingerprint_weights_compute(m);
        if (path) return kp_fail(err, KP_EIO, "cannot stat the model %s: %s", path, strerror(errno));
        return KP_OK; /* a model from memory: nothing to cache it by */
    }
    char beside[4200], in_dir[4200];
    cache_name(path, NULL, beside, sizeof beside);
    if (cache_dir) cache_name(path, cache_dir, in_dir, sizeof in_dir);
    if (cache_read(beside, path, &st, out) || (cache_dir && cache_read(in_dir, path, &st, out))) {
        if (from_cache) *from_cache = true;
        return KP_OK;
    }
    *out = kp_fingerprint_weights_compute(m);
    if (!cache_write(beside, path, &st, out) && cache_dir) cache_write(in_dir, path, &st, out);
    return KP_OK;
}

/* The lines of the hyperparameters beyond the llama family's, appended
 * only when a model has one of them (the fingerprints of llama, qwen2 and
 * qwen3 files are unchanged by them). The layer kinds are one letter per
 * layer, f (FULL) or w (WINDOW), or their XXH3-64 past 256 layers. */
static void extra_lines(const kp_model *m, char *buf, size_t cap) {
    const kp_hparams *hp = &m->hp;
    buf[0] = 0;
    if (!hp->n_swa_layers && !hp->attn_scale_on_q && hp->embd_scale == 1.0f && hp->ffn_act == KP_FFN_SILU &&
        !hp->post_norms && !(hp->logit_softcap > 0))
        return;
    char kinds[257 + 24];
    uint32_t n = hp->n_layer;
    for (uint32_t l = 0; l < n && l < 256; l++) kinds[l] = m->layers[l].kind == KP_LAYER_WINDOW ? 'w' : 'f';
    kinds[n < 256 ? n : 256] = 0;
    if (n > 256) {
        char all[4096];
        uint32_t k = n < sizeof all ? n : (uint32_t)sizeof all;
        for (uint32_t l = 0; l < k; l++) all[l] = m->layers[l].kind == KP_LAYER_WINDOW ? 'w' : 'f';
        snprintf(kinds, sizeof kinds, "xxh64:%016llx", (unsigned long long)XXH3_64bits(all, k));
    }
    snprintf(buf, cap,
             "n_swa %u\nlayer_kinds %s\nrope_base_swa %a\nrope_freq_scale_swa %a\nattn_scale %a\n"
             "attn_scale_on_q %d\nembd_scale %a\nlogit_softcap %a\nffn_act %s\npost_norms %d\n",
             hp->n_swa, kinds, (double)hp->rope_base_swa, (double)hp->rope_freq_scale_swa, (double)hp->attn_scale,
             hp->attn_scale_on_q ? 1 : 0, (double)hp->embd_scale, (double)hp->logit_softcap,
             hp->ffn_act == KP_FFN_GELU_TANH ? "gelu_tanh" : "silu", hp->post_norms ? 1 : 0);
}

/* The experts' lines, only for a model with experts (other models'
 * fingerprints are unchanged): how many, how many a token is routed to,
 * and their width; for qwen35moe the shared expert's width; for gpt-oss's
 * kind (not qwen3moe's, whose lines stay as they were) also the gating and
 * the SwiGLU's clamp. The routing decides which weights a token's K/V of
 * the next layers come from. */
static void expert_lines(const kp_hparams *hp, char *buf, size_t cap) {
    buf[0] = 0;
    if (!hp->n_expert) return;
    int n = snprintf(buf, cap, "n_expert %u\nn_expert_used %u\nn_ff_exp %u\n", hp->n_expert, hp->n_expert_used,
                     hp->n_ff_exp);
    if (n > 0 && (size_t)n < cap && hp->n_ff_shexp)
        n += snprintf(buf + n, cap - (size_t)n, "n_ff_shexp %u\n", hp->n_ff_shexp);
    if (n > 0 && (size_t)n < cap && (hp->gate != KP_GATE_SOFTMAX || hp->swiglu_limit > 0))
        snprintf(buf + n, cap - (size_t)n, "gate %s\nswiglu_limit %a\nswiglu_alpha %a\n",
                 hp->gate == KP_GATE_SOFTMAX_TOPK ? "softmax_topk" : "softmax", (double)hp->swiglu_limit,
                 (double)hp->swiglu_alpha);
}

/* YaRN's lines, only when the rope is YaRN's (other fingerprints are
 * unchanged): what besides rope_base and rope_freq_scale sets a key's
 * rotation. */
static void yarn_lines(const kp_hparams *hp, char *buf, size_t cap) {
    buf[0] = 0;
    if (hp->rope_yarn)
        snprintf(buf, cap, "yarn_n_ctx_orig %u\nyarn_beta_fast %a\nyarn_beta_slow %a\nyarn_attn_factor %a\n",
                 hp->yarn_n_ctx_orig, (double)hp->yarn_beta_fast, (double)hp->yarn_beta_slow,
                 (double)hp->yarn_attn_factor);
}

/* The recurrent layers' lines, only for a model with such layers (qwen35;
 * other fingerprints are unchanged): the layout of the state a snapshot
 * record holds (staterec.h), float32, and the layer kinds (r/a per layer:
 * which layers the state belongs to). */
static void state_lines(const kp_model *m, char *buf, size_t cap) {
    const kp_hparams *hp = &m->hp;
    buf[0] = 0;
    if (!hp->n_rec_layers) return;
    char kinds[257];
    uint32_t n = hp->n_layer < 256 ? hp->n_layer : 256;
    for (uint32_t l = 0; l < n; l++) kinds[l] = m->layers[l].kind == KP_LAYER_RECURRENT ? 'r' : 'a';
    kinds[n] = 0;
    snprintf(buf, cap,
             "n_rec_layers %u\nrec_layer_kinds %s\nssm_d_conv %u\nssm_d_inner %u\nssm_d_state %u\n"
             "ssm_n_v_head %u\nssm_n_k_head %u\nstate f32 %llu\n",
             hp->n_rec_layers, kinds, hp->ssm_d_conv, hp->ssm_d_inner, hp->ssm_d_state, hp->ssm_n_v_head,
             hp->ssm_n_k_head, (unsigned long long)kp_model_rec_state_floats(hp));
}

void kp_fingerprint_make(kp_fingerprint *out, const kp_model *m, const kp_bkey *weights, kp_dtype kv_type,
                kp_dtype kv_type_v, uint32_t block_size, bool attn_bf16) {
    const kp_hparams *hp = &m->hp;
    char wh[33], extra[512], experts[192], yarn[160], state[512];
    kp_bkey_hex(weights, wh);
    extra_lines(m, extra, sizeof extra);
    expert_lines(hp, experts, sizeof experts);
    yarn_lines(hp, yarn, sizeof yarn);
    state_lines(m, state, sizeof state);
    out->weights = *weights;
    snprintf(out->text, sizeof out->text,
             "kvpin-kv-layout %d\nweights %s\narch %s\nn_layer %u\nn_embd %u\nn_head %u\nn_head_kv %u\n"
             "head_dim %u\nn_ff %u\nn_vocab %u\nn_rot %u\nrms_eps %a\nrope_base %a\nrope_freq_scale %a\n"
             "rope_type %s\ntied_output %d\n%s%s%s%skv_type %s\nkv_type_v %s\nblock_size %u\n%s",
             KP_FINGERPRINT_LAYOUT_VERSION, wh, hp->arch_name ? hp->arch_name : "?", hp->n_layer, hp->n_embd, hp->n_head,
             hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab, hp->n_rot, (double)hp->rms_eps,
             (double)hp->rope_base, (double)hp->rope_freq_scale, hp->rope_type == KP_ROPE_NEOX ? "neox" : "norm",
             hp->tied_output ? 1 : 0, extra, yarn, experts, state, kp_dtype_name(kv_type), kp_dtype_name(kv_type_v),
             block_size, attn_bf16 ? "attn bf16\n" : "");
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(out->text, strlen(out->text)));
    memcpy(out->id.b, c.digest, 16);
}

/* The value of line `name` in text t into v[cap] ("" when absent). */
static bool line_value(const char *t, const char *name, char *v, size_t cap) {
    size_t nl = strlen(name);
    for (const char *p = t; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, name, nl) && p[nl] == ' ') {
            size_t len = strcspn(p + nl + 1, "\n");
            if (len >= cap) len = cap - 1;
            memcpy(v, p + nl + 1, len);
            v[len] = 0;
            return true;
        }
    }
    v[0] = 0;
    return false;
}

void kp_fingerprint_diff(const char *ours, const char *other, char *buf, size_t cap) {
    size_t o = 0;
    bool any = false;
    buf[0] = 0;
    for (const char *p = ours; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
        char name[64], a[128], b[128];
        size_t nl = strcspn(p, " \n");
        if (nl == 0 || nl >= sizeof name) continue;
        memcpy(name, p, nl);
        name[nl] = 0;
        line_value(ours, name, a, sizeof a);
        if (!line_value(other, name, b, sizeof b)) continue;
        any = true;
        if (strcmp(a, b) && o + 1 < cap)
            o += (size_t)snprintf(buf + o, cap - o, "%s%s %s (here %s)", o ? ", " : "", name, b, a);
        if (o >= cap) o = cap - 1;
    }
    if (!any) snprintf(buf, cap, "unknown");
}
