/*
 * tok_load.c - building a kp_tok_vocab from GGUF metadata, the way llama.cpp's
 * llama_vocab::impl::load does, and its token-text hash (kp_tok_hash and
 * kp_tok_lookup, inline in tok_impl.h since every tokenizer file uses them).
 *
 * Owns every table of the vocabulary (tok_impl.h): all of it is copied out
 * of the GGUF, so the file may be closed after loading. Load order:
 *
 *   1. tokenizer.ggml.model        "llama" -> SPM, "gpt2" -> BPE, else refused
 *   2. tokenizer.ggml.tokens       texts -> arena + hash (duplicates refused,
 *                                  empty texts renamed "[EMPTY_<id>]")
 *      .scores, .token_type        optional; shorter than tokens -> refused
 *   3. tokenizer.ggml.merges       BPE: "a b" -> (id a, id b) -> (rank, id ab)
 *   4. defaults + tokenizer.ggml.pre (BPE: regex family and its flags)
 *   5. byte tables, SPM word-cut check, pre-tokenizer regexes, the newline
 *      token (found before any special token is known, as llama.cpp does)
 *   6. special ids (bos/eos/eot/eom/unk/sep/pad/mask/fim_*), add_bos/add_eos
 *   7. llama.cpp's text-based fix-ups: eot/eom/fim tokens found by their
 *      text become CONTROL, "...unused..." control tokens UNUSED, the
 *      end-of-generation set
 *   8. the special-token list (CONTROL | USER_DEFINED | UNKNOWN, longest
 *      first) and its trie; the piece of every token (special = true)
 *   9. per-model lstrip/rstrip attributes llama.cpp sets by name (phi-3, ...)
 *
 * Text hash: open addressing, capacity a power of two >= 2 * n_vocab,
 *
 *   slots[h(text) & mask] -> id, linear probing, -1 = empty
 *   arena: "!\0\"\0#\0...<|endoftext|>\0"   text_off[id] / text_len[id]
 *
 * Deliberate departures from llama.cpp (which would warn or abort):
 *   - a bos/eos/eot/eom/unk id outside the vocabulary is KP_EFORMAT (an id
 *     of -1 / 0xFFFFFFFF means "unset" and keeps the default); other ids
 *     outside it are ignored with a warning;
 *   - merges naming a piece that is not a token, or without a space, are
 *     KP_EFORMAT;
 *   - an unknown tokenizer.ggml.pre uses the default regexes with a warning;
 *   - when several tokens carry an eot/eom/fim text, the lowest id wins
 *     (llama.cpp takes whichever its hash map yields first).
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_impl.h"
#include "base/buf.h"
#include "base/unicode.h"

/* GGUF token types (tokenizer.ggml.token_type) */
enum { TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4,
       TT_UNUSED = 5, TT_BYTE = 6 };

static const char *text_of(const kp_tok_vocab *v, int32_t id) { return v->text_arena + v->text_off[id]; }

static bool text_is(const kp_tok_vocab *v, int32_t id, const char *s) {
    size_t n = strlen(s);
    return v->text_len[id] == n && memcmp(text_of(v, id), s, n) == 0;
}

static int32_t find_cstr(const kp_tok_vocab *v, const char *s) { return kp_tok_lookup(v, s, strlen(s)); }

/* ---- helpers ---- */

static const char *gname(const kp_gguf *g) {
    const char *p = kp_gguf_path(g);
    return p ? p : "gguf";
}

static kp_status oom(kp_error *err) { return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory"); }

/* Appends one line to v->warnings. */
static kp_status warn(kp_tok_vocab *v, kp_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static kp_status warn(kp_tok_vocab *v, kp_error *err, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (v->warnings.len) kp_buf_putc(&v->warnings, '\n');
    return kp_buf_puts(&v->warnings, line) ? KP_OK : oom(err);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* Numeric element types accepted for scores / token types. */
static bool is_numeric(kp_gguf_type t, bool allow_float) {
    switch (t) {
    case KP_GGUF_TYPE_UINT8: case KP_GGUF_TYPE_INT8: case KP_GGUF_TYPE_UINT16: case KP_GGUF_TYPE_INT16:
    case KP_GGUF_TYPE_UINT32: case KP_GGUF_TYPE_INT32: case KP_GGUF_TYPE_UINT64: case KP_GGUF_TYPE_INT64:
        return true;
    case KP_GGUF_TYPE_FLOAT32: case KP_GGUF_TYPE_FLOAT64:
        return allow_float;
    default:
        return false;
    }
}

/* An optional numeric array of at least n elements; *out = NULL if absent. */
static kp_status get_num_arr(const kp_gguf *g, const char *key, bool allow_float, uint64_t n,
                             const kp_gguf_value **out, kp_error *err) {
    *out = NULL;
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    if (!kv) return KP_OK;
    if (kv->value.type != KP_GGUF_TYPE_ARRAY || !is_numeric(kv->value.v.arr.elem_type, allow_float))
        return kp_fail(err, KP_EFORMAT, "%s: %s should be an array of %s", gname(g), key,
                       allow_float ? "numbers" : "integers");
    if (kv->value.v.arr.n < n)
        return kp_fail(err, KP_EFORMAT, "%s: %s has %llu entries for %llu tokens", gname(g), key,
                       (unsigned long long)kv->value.v.arr.n, (unsigned long long)n);
    *out = &kv->value;
    return KP_OK;
}

/* ---- steps ---- */

static kp_status load_model_kind(kp_tok_vocab *v, const kp_gguf *g, kp_error *err) {
    kp_gguf_str m;
    kp_status st = kp_gguf_get_str(g, "tokenizer.ggml.model", &m, err);
    if (st != KP_OK) return st;
    if (!m.data) return kp_fail(err, KP_EFORMAT, "%s: missing tokenizer.ggml.model", gname(g));
    if (kp_gguf_str_eq(m, "llama")) {
        v->model = KP_TOK_MODEL_SPM;
        v->model_name = "llama";
    } else if (kp_gguf_str_eq(m, "gpt2")) {
        v->model = KP_TOK_MODEL_BPE;
        v->model_name = "gpt2";
    } else {
        return kp_fail(err, KP_EUNSUPPORTED, "unsupported tokenizer model '%.*s'",
                       (int)(m.len > 64 ? 64 : m.len), m.data);
    }
    return KP_OK;
}

static kp_status load_tokens(kp_tok_vocab *v, const kp_gguf *g, kp_error *err) {
    const kp_gguf_value *toks, *scores, *types;
    kp_status st = kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, err);
    if (st != KP_OK) return st;
    if (!toks) return kp_fail(err, KP_EFORMAT, "%s: missing tokenizer.ggml.tokens", gname(g));
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > (uint64_t)INT32_MAX - 1)
        return kp_fail(err, KP_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries", gname(g),
                       (unsigned long long)n);
    if ((st = get_num_arr(g, "tokenizer.ggml.scores", true, n, &scores, err)) != KP_OK) return st;
    if ((st = get_num_arr(g, "tokenizer.ggml.token_type", false, n, &types, err)) != KP_OK) return st;

    /* A model file's embedding has one row per token (a vocabulary-only
     * file has no tensors): refuse a token list that disagrees with it. */
    const kp_gguf_tensor *te = kp_gguf_find_tensor(g, "token_embd.weight");
    if (te && te->n_dims == 2 && (uint64_t)te->ne[1] != n)
        return kp_fail(err, KP_EFORMAT,
                       "%s: the vocabulary has %llu tokens (tokenizer.ggml.tokens) but token_embd.weight has "
                       "%llu rows; the two must match",
                       gname(g), (unsigned long long)n, (unsigned long long)te->ne[1]);

    v->n_vocab = (int32_t)n;
    size_t arena = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = toks->v.arr.strs[i].len;
        if (len > UINT32_MAX / 2)
            return kp_fail(err, KP_EFORMAT, "%s: token %llu is %llu bytes long", gname(g),
                           (unsigned long long)i, (unsigned long long)len);
        arena += (len ? len : 24) + 1;
    }
    v->text_arena = malloc(arena);
    v->text_off = malloc(n * sizeof *v->text_off);
    v->text_len = malloc(n * sizeof *v->text_len);
    v->scores = malloc(n * sizeof *v->scores);
    v->attrs = malloc(n * sizeof *v->attrs);
    v->eog = calloc(n, 1);
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    v->slots = malloc(cap * sizeof *v->slots);
    if (!v->text_arena || !v->text_off || !v->text_len || !v->scores || !v->attrs || !v->eog ||
        !v->slots)
        return oom(err);
    v->slot_mask = cap - 1;
    for (size_t i = 0; i < cap; i++) v->slots[i] = -1;

    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        kp_gguf_str s = toks->v.arr.strs[i];
        char *dst = v->text_arena + off;
        size_t len = s.len;
        if (len == 0) /* llama.cpp renames empty tokens */
            len = (size_t)snprintf(dst, 25, "[EMPTY_%llu]", (unsigned long long)i);
        else
            memcpy(dst, s.data, len);
        dst[len] = 0;
        v->text_off[i] = off;
        v->text_len[i] = (uint32_t)len;
        off += len + 1;
        if (len > v->max_token_len) v->max_token_len = (uint32_t)len;

        uint64_t h = kp_tok_hash(dst, len) & v->slot_mask;
        for (;; h = (h + 1) & v->slot_mask) {
            int32_t other = v->slots[h];
            if (other < 0) break;
            if (v->text_len[other] == len && memcmp(text_of(v, other), dst, len) == 0)
                return kp_fail(err, KP_EFORMAT,
                               "%s: duplicate token in vocabulary: '%.*s' has ids %d and %llu",
                               gname(g), (int)(len > 64 ? 64 : len), dst, other,
                               (unsigned long long)i);
        }
        v->slots[h] = (int32_t)i;

        float score = scores ? (float)kp_gguf_arr_f64(scores, i) : 0.0f;
        v->scores[i] = score == 0.0f ? 0.0f : score; /* -0 sorts like +0 */

        uint32_t attr = KP_TOK_ATTR_NORMAL;
        if (types) {
            switch (kp_gguf_arr_i64(types, i)) {
            case TT_NORMAL: attr = KP_TOK_ATTR_NORMAL; break;
            case TT_UNKNOWN: attr = KP_TOK_ATTR_UNKNOWN; break;
            case TT_CONTROL: attr = KP_TOK_ATTR_CONTROL; break;
            case TT_USER_DEFINED: attr = KP_TOK_ATTR_USER_DEFINED; break;
            case TT_UNUSED: attr = KP_TOK_ATTR_UNUSED; break;
            case TT_BYTE: attr = KP_TOK_ATTR_BYTE; break;
            default: attr = KP_TOK_ATTR_UNDEFINED; break;
            }
        }
        v->attrs[i] = attr;
    }
    return KP_OK;
}

static kp_status load_merges(kp_tok_vocab *v, const kp_gguf *g, kp_error *err) {
    const kp_gguf_value *arr;
    kp_status st = kp_gguf_get_arr(g, "tokenizer.ggml.merges", KP_GGUF_TYPE_STRING, &arr, err);
    if (st != KP_OK) return st;
    if (!arr) return kp_fail(err, KP_EFORMAT, "%s: missing tokenizer.ggml.merges", gname(g));
    uint64_t n = arr->v.arr.n;
    if (n > (uint64_t)INT32_MAX)
        return kp_fail(err, KP_EFORMAT, "%s: %llu merges", gname(g), (unsigned long long)n);
    if ((st = kp_tok_merges_init(&v->merges, (size_t)n, err)) != KP_OK) return st;
    char *joined = malloc((size_t)v->max_token_len + 1);
    if (!joined) return oom(err);
    for (uint64_t i = 0; i < n; i++) {
        kp_gguf_str m = arr->v.arr.strs[i];
        const char *sp = m.len > 1 ? memchr(m.data + 1, ' ', m.len - 1) : NULL;
        int show = (int)(m.len > 64 ? 64 : m.len);
        if (!sp) {
            free(joined);
            return kp_fail(err, KP_EFORMAT, "%s: merge %llu ('%.*s') is not two pieces separated by a space",
                           gname(g), (unsigned long long)i, show, m.data);
        }
        size_t la = (size_t)(sp - m.data), lb = m.len - la - 1;
        int32_t a = kp_tok_lookup(v, m.data, la), b = kp_tok_lookup(v, sp + 1, lb);
        if (a < 0 || b < 0) {
            free(joined);
            return kp_fail(err, KP_EFORMAT, "%s: merge %llu ('%.*s') names a piece that is not a token",
                           gname(g), (unsigned long long)i, show, m.data);
        }
        int32_t ab = -1;
        if (la + lb <= v->max_token_len) {
            memcpy(joined, m.data, la);
            memcpy(joined + la, sp + 1, lb);
            ab = kp_tok_lookup(v, joined, la + lb);
        }
        kp_tok_merges_add(&v->merges, a, b, (int32_t)i, ab);
    }
    free(joined);
    return KP_OK;
}

/* Defaults per model, then tokenizer.ggml.pre (BPE) and add_space_prefix. */
static kp_status load_flags(kp_tok_vocab *v, const kp_gguf *g, kp_error *err) {
    v->eot = v->eom = v->sep = v->pad = v->mask = v->nl = -1;
    v->fim_pre = v->fim_suf = v->fim_mid = v->fim_pad = v->fim_rep = v->fim_sep = -1;
    kp_gguf_str pre;
    kp_status st = kp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (st != KP_OK) return st;
    if (v->model == KP_TOK_MODEL_SPM) {
        v->bos = 1;
        v->eos = 2;
        v->unk = 0;
        v->add_space_prefix = true;
        v->clean_spaces = false;
        v->add_bos = true;
        v->add_eos = false;
        v->pre_kind = KP_TOK_PRE_DEFAULT;
        v->pre_name = dup_n("default", 7);
    } else {
        v->bos = 11;
        v->eos = 11;
        v->unk = -1;
        v->add_space_prefix = false;
        v->clean_spaces = true;
        v->add_bos = false;
        v->add_eos = false;
        v->pre_kind = KP_TOK_PRE_DEFAULT;
        const kp_tok_pre_info *info = pre.data && pre.len ? kp_tok_pre_find(pre.data, pre.len) : NULL;
        if (info) {
            v->pre_kind = info->kind;
            v->pre_name = dup_n(info->name, strlen(info->name));
            if (info->flags & KP_TOK_PRE_F_IGNORE_MERGES) v->ignore_merges = true;
            if (info->flags & KP_TOK_PRE_F_ADD_BOS) v->add_bos = true;
            if (info->flags & KP_TOK_PRE_F_NO_CLEAN) v->clean_spaces = false;
            if (info->flags & KP_TOK_PRE_F_NO_BOS) v->bos = -1;
        } else {
            char msg[256];
            if (!pre.data || pre.len == 0)
                snprintf(msg, sizeof msg,
                         "missing tokenizer.ggml.pre: using the 'default' pre-tokenizer "
                         "(tokenization may differ from the model's own)");
            else
                snprintf(msg, sizeof msg,
                         "unknown pre-tokenizer '%.*s': using the 'default' pre-tokenizer "
                         "(tokenization may differ from the model's own)",
                         (int)(pre.len > 64 ? 64 : pre.len), pre.data);
            v->pre_warning = dup_n(msg, strlen(msg));
            v->pre_name = dup_n("default", 7);
            if (!v->pre_warning) return oom(err);
            if ((st = warn(v, err, "%s", msg)) != KP_OK) return st;
        }
    }
    if (!v->pre_name) return oom(err);
    return kp_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", v->add_space_prefix,
                         &v->add_space_prefix, err);
}

/* True when every "▁" inside a token (not at its start) follows another
 * "▁": then no token spans a word start (see tok_merge.c). */
static bool spm_words_separable(const kp_tok_vocab *v) {
    for (int32_t id = 0; id < v->n_vocab; id++) {
        const char *t = text_of(v, id);
        size_t len = v->text_len[id];
        for (size_t i = 1; i + 3 <= len; i++)
            if (memcmp(t + i, "\xe2\x96\x81", 3) == 0 && (i < 3 || memcmp(t + i - 3, "\xe2\x96\x81", 3) != 0))
                return false;
    }
    return true;
}

static void build_byte_tables(kp_tok_vocab *v) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        v->byte_fallback[b][0] = v->byte_fallback[b][1] = -1;
        if (v->model == KP_TOK_MODEL_SPM) {
            char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
            int32_t id = kp_tok_lookup(v, buf, 6);
            if (id < 0) {
                char c = (char)b;
                id = kp_tok_lookup(v, &c, 1);
            }
            v->byte_tok[b] = id;
        } else {
            uint8_t u[4];
            size_t n = kp_unicode_encode(kp_unicode_byte_to_cpt((uint8_t)b), u);
            v->byte_tok[b] = kp_tok_lookup(v, (const char *)u, n);
            for (size_t k = 0; k < n && k < 2; k++) v->byte_fallback[b][k] = kp_tok_lookup(v, (const char *)&u[k], 1);
        }
    }
}

/* Reads one special-id key into *dst (see the top comment for the rules). */
static kp_status read_id(kp_tok_vocab *v, const kp_gguf *g, const char *key, int32_t *dst, bool strict,
                         kp_error *err) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    if (!kv) return KP_OK;
    int64_t val;
    switch (kv->value.type) {
    case KP_GGUF_TYPE_UINT8: case KP_GGUF_TYPE_UINT16: case KP_GGUF_TYPE_UINT32: case KP_GGUF_TYPE_UINT64:
        val = kv->value.v.u64 > (uint64_t)INT64_MAX ? -1 : (int64_t)kv->value.v.u64;
        if (kv->value.v.u64 == UINT32_MAX || kv->value.v.u64 == UINT64_MAX) val = -1;
        break;
    case KP_GGUF_TYPE_INT8: case KP_GGUF_TYPE_INT16: case KP_GGUF_TYPE_INT32: case KP_GGUF_TYPE_INT64:
        val = kv->value.v.i64;
        break;
    default:
        return kp_fail(err, KP_EFORMAT, "%s: %s should be an integer, found %s", gname(g), key,
                       kp_gguf_type_name(kv->value.type));
    }
    if (val == -1) return KP_OK; /* "unset": keep the default */
    if (val < 0 || val >= v->n_vocab) {
        if (strict)
            return kp_fail(err, KP_EFORMAT, "%s: %s = %lld is outside the vocabulary (%d tokens)",
                           gname(g), key, (long long)val, v->n_vocab);
        return warn(v, err, "%s = %lld is outside the vocabulary (%d tokens); ignored", key,
                    (long long)val, v->n_vocab);
    }
    *dst = (int32_t)val;
    return KP_OK;
}

static kp_status load_special_ids(kp_tok_vocab *v, const kp_gguf *g, kp_error *err) {
    const struct {
        const char *key;
        int32_t *dst;
        bool strict;
    } keys[] = {
        {"tokenizer.ggml.bos_token_id", &v->bos, true},
        {"tokenizer.ggml.eos_token_id", &v->eos, true},
        {"tokenizer.ggml.eot_token_id", &v->eot, true},
        {"tokenizer.ggml.eom_token_id", &v->eom, true},
        {"tokenizer.ggml.unknown_token_id", &v->unk, true},
        {"tokenizer.ggml.seperator_token_id", &v->sep, false},
        {"tokenizer.ggml.padding_token_id", &v->pad, false},
        {"tokenizer.ggml.mask_token_id", &v->mask, false},
        {"tokenizer.ggml.fim_pre_token_id", &v->fim_pre, false},
        {"tokenizer.ggml.fim_suf_token_id", &v->fim_suf, false},
        {"tokenizer.ggml.fim_mid_token_id", &v->fim_mid, false},
        {"tokenizer.ggml.fim_pad_token_id", &v->fim_pad, false},
        {"tokenizer.ggml.fim_rep_token_id", &v->fim_rep, false},
        {"tokenizer.ggml.fim_sep_token_id", &v->fim_sep, false},
        {"tokenizer.ggml.prefix_token_id", &v->fim_pre, false}, /* deprecated names */
        {"tokenizer.ggml.suffix_token_id", &v->fim_suf, false},
        {"tokenizer.ggml.middle_token_id", &v->fim_mid, false},
    };
    kp_status st;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (*keys[i].dst >= v->n_vocab) *keys[i].dst = -1; /* default out of range: none */
        if ((st = read_id(v, g, keys[i].key, keys[i].dst, keys[i].strict, err)) != KP_OK) return st;
    }
    if ((st = kp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", v->add_bos, &v->add_bos, err)) != KP_OK)
        return st;
    if ((st = kp_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", v->add_eos, &v->add_eos, err)) != KP_OK)
        return st;
    if ((st = kp_gguf_get_bool(g, "tokenizer.ggml.add_sep_token", v->add_sep, &v->add_sep, err)) != KP_OK)
        return st;
    if (v->add_bos && v->bos < 0)
        return kp_fail(err, KP_EFORMAT,
                       "%s: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set",
                       gname(g));
    if (v->add_eos && v->eos < 0)
        return kp_fail(err, KP_EFORMAT,
                       "%s: tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set",
                       gname(g));
    return KP_OK;
}

static bool text_in(const kp_tok_vocab *v, int32_t id, const char *const *list) {
    for (; *list; list++)
        if (text_is(v, id, *list)) return true;
    return false;
}

/* If *slot is unset, the first token (by id) whose text is in `list` fills
 * it and becomes CONTROL. */
static void detect(kp_tok_vocab *v, int32_t *slot, const char *const *list) {
    if (*slot >= 0) return;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        if (text_in(v, id, list)) {
            *slot = id;
            v->attrs[id] |= KP_TOK_ATTR_CONTROL;
            return;
        }
    }
}

/* llama.cpp's text-based fix-ups and the end-of-generation set. */
static void fix_special_tokens(kp_tok_vocab *v) {
    static const char *const eot_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
        "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
        "<end_of_utterance>", NULL};
    static const char *const eom_texts[] = {"<|eom_id|>", NULL};
    static const char *const fim_pre_texts[] = {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
        "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
    static const char *const fim_suf_texts[] = {
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
        "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
    static const char *const fim_mid_texts[] = {
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
        "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
    static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
    static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                                "<reponame>", NULL};
    static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[", NULL};
    static const char *const always_rendered[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                  "<|constrain|>", NULL};

    detect(v, &v->eot, eot_texts);
    detect(v, &v->eom, eom_texts);
    detect(v, &v->fim_pre, fim_pre_texts);
    detect(v, &v->fim_suf, fim_suf_texts);
    detect(v, &v->fim_mid, fim_mid_texts);
    detect(v, &v->fim_pad, fim_pad_texts);
    detect(v, &v->fim_rep, fim_rep_texts);
    detect(v, &v->fim_sep, fim_sep_texts);

    /* control tokens named "...unused..." are unused */
    for (int32_t id = 0; id < v->n_vocab; id++)
        if ((v->attrs[id] & KP_TOK_ATTR_CONTROL) && strstr(text_of(v, id), "unused"))
            v->attrs[id] |= KP_TOK_ATTR_UNUSED;

    if (v->fim_pad >= 0) v->eog[v->fim_pad] = 1;
    if (v->fim_rep >= 0) v->eog[v->fim_rep] = 1;
    if (v->fim_sep >= 0) v->eog[v->fim_sep] = 1;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        if (text_in(v, id, eog_texts)) {
            v->eog[id] = 1;
            v->attrs[id] |= KP_TOK_ATTR_CONTROL;
        }
    }
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (text_in(v, id, always_rendered)) v->attrs[id] = KP_TOK_ATTR_USER_DEFINED;
    if (v->eos >= 0) v->eog[v->eos] = 1;
    if (v->eot >= 0) v->eog[v->eot] = 1;
    if (v->eom >= 0) v->eog[v->eom] = 1;

    /* o200k_harmony / solar-open: "<|end|>" ends a message, not generation */
    int32_t ret = find_cstr(v, "<|return|>"), call = find_cstr(v, "<|call|>");
    int32_t calls = find_cstr(v, "<|calls|>"), flush = find_cstr(v, "<|flush|>");
    int32_t end = find_cstr(v, "<|end|>");
    bool has_ret = ret >= 0 && v->eog[ret];
    bool has_call = (call >= 0 && v->eog[call]) || (calls >= 0 && v->eog[calls]);
    bool has_flush = flush >= 0 && v->eog[flush];
    if (end >= 0 && v->eog[end] && ((has_ret && has_call) || (has_call && has_flush))) {
        v->eog[end] = 0;
        v->attrs[end] = KP_TOK_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not an end of generation there */
    int32_t tool = find_cstr(v, "<|tool_response>"), s_end = find_cstr(v, "</s>");
    if (tool >= 0 && v->eog[tool] && s_end >= 0 && v->eog[s_end]) {
        v->eog[s_end] = 0;
        v->attrs[s_end] = KP_TOK_ATTR_NORMAL;
    }
}

typedef struct {
    uint32_t len;
    int32_t id;
} len_id;

static int by_len_desc(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static kp_status build_special_list(kp_tok_vocab *v, kp_error *err) {
    size_t n = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->attrs[id] & (KP_TOK_ATTR_CONTROL | KP_TOK_ATTR_USER_DEFINED | KP_TOK_ATTR_UNKNOWN)) n++;
    for (int b = 0; b < 256; b++) v->trie_root[b] = -1;
    if (n == 0) return KP_OK;
    len_id *tmp = malloc(n * sizeof *tmp);
    v->special = malloc(n * sizeof *v->special);
    if (!tmp || !v->special) {
        free(tmp);
        return oom(err);
    }
    size_t k = 0, total = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->attrs[id] & (KP_TOK_ATTR_CONTROL | KP_TOK_ATTR_USER_DEFINED | KP_TOK_ATTR_UNKNOWN)) {
            tmp[k].len = v->text_len[id];
            tmp[k].id = id;
            total += v->text_len[id];
            k++;
        }
    qsort(tmp, n, sizeof *tmp, by_len_desc);
    for (size_t i = 0; i < n; i++) {
        v->special[i] = tmp[i].id;
        if (!(v->attrs[tmp[i].id] & (KP_TOK_ATTR_CONTROL | KP_TOK_ATTR_UNKNOWN))) v->n_special_always++;
    }
    v->n_special = n;
    free(tmp);

    /* trie over the texts (at most one node per text byte) */
    v->trie = malloc((total + 1) * sizeof *v->trie);
    if (!v->trie) return oom(err);
    v->n_trie = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *t = (const uint8_t *)text_of(v, v->special[i]);
        uint32_t len = v->text_len[v->special[i]];
        int32_t *link = &v->trie_root[t[0]];
        int32_t node = -1;
        for (uint32_t j = 0; j < len; j++) {
            if (j > 0) link = &v->trie[node].first_child;
            int32_t c = *link;
            while (c >= 0 && v->trie[c].byte != t[j]) c = v->trie[c].next_sibling;
            if (c < 0) {
                c = (int32_t)v->n_trie++;
                v->trie[c].byte = t[j];
                v->trie[c].first_child = -1;
                v->trie[c].special_index = -1;
                v->trie[c].next_sibling = j > 0 ? *link : -1;
                *link = c;
            }
            node = c;
        }
        v->trie[node].special_index = (int32_t)i;
    }
    return KP_OK;
}

/* Writes the GPT-2-decoded form of a BPE token text (llama_decode_text) to
 * out, or only measures it when out is NULL; returns its length. A code
 * point outside the byte map becomes llama.cpp's marker
 * "[UNK_BYTE_0x<its UTF-8 in hex><the whole token text>]". */
static size_t bpe_decode_text(const char *text, size_t len, char *out) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t used;
        uint32_t cpt = kp_unicode_decode_lenient((const uint8_t *)text + i, len - i, &used);
        i += used;
        int b = kp_unicode_cpt_to_byte(cpt);
        if (b >= 0) {
            if (out) out[o] = (char)b;
            o++;
            continue;
        }
        uint8_t u[4];
        size_t n = kp_unicode_encode(cpt, u);
        if (out) {
            memcpy(out + o, "[UNK_BYTE_0x", 12);
            for (size_t k = 0; k < n; k++) {
                out[o + 12 + 2 * k] = hex[u[k] >> 4];
                out[o + 13 + 2 * k] = hex[u[k] & 15];
            }
            memcpy(out + o + 12 + 2 * n, text, len);
            out[o + 12 + 2 * n + len] = ']';
        }
        o += 12 + 2 * n + len + 1;
    }
    return o;
}

static uint8_t byte_of(const kp_tok_vocab *v, int32_t id) {
    const char *t = text_of(v, id);
    uint32_t len = v->text_len[id], val = 0;
    for (uint32_t i = 3; i < 5 && i < len && isxdigit((unsigned char)t[i]); i++)
        val = val * 16 + (uint32_t)(isdigit((unsigned char)t[i]) ? t[i] - '0' : (tolower((unsigned char)t[i]) - 'a' + 10));
    return (uint8_t)val;
}

static kp_status build_pieces(kp_tok_vocab *v, kp_error *err) {
    size_t cap = 0;
    char *arena = NULL;
    v->piece_off = malloc((size_t)v->n_vocab * sizeof *v->piece_off);
    v->piece_len = malloc((size_t)v->n_vocab * sizeof *v->piece_len);
    if (!v->piece_off || !v->piece_len) return oom(err);
    size_t off = 0;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        const char *t = text_of(v, id);
        size_t len = v->text_len[id], n = 0;
        uint32_t attr = v->attrs[id];
        size_t need = off + 1 + (v->model == KP_TOK_MODEL_BPE && (attr & KP_TOK_ATTR_NORMAL) ? bpe_decode_text(t, len, NULL) : len);
        if (!kp_grow((void **)&arena, &cap, need, 1)) {
            free(arena);
            return oom(err);
        }
        char *dst = arena + off;
        if (attr & (KP_TOK_ATTR_UNKNOWN | KP_TOK_ATTR_CONTROL | KP_TOK_ATTR_USER_DEFINED)) {
            memcpy(dst, t, len);
            n = len;
        } else if (attr & KP_TOK_ATTR_NORMAL) {
            if (v->model == KP_TOK_MODEL_SPM) {
                for (size_t i = 0; i < len; i++) {
                    if (i + 2 < len && memcmp(t + i, "\xe2\x96\x81", 3) == 0) {
                        dst[n++] = ' ';
                        i += 2;
                    } else {
                        dst[n++] = t[i];
                    }
                }
            } else {
                n = bpe_decode_text(t, len, dst);
            }
        } else if (attr & KP_TOK_ATTR_BYTE) {
            dst[0] = (char)byte_of(v, id);
            n = 1;
        }
        v->piece_off[id] = off;
        v->piece_len[id] = (uint32_t)n;
        off += n;
    }
    char *fit = realloc(arena, off ? off : 1); /* shrink; keep the old block if that fails */
    v->piece_arena = fit ? fit : arena;
    return KP_OK;
}

static void lowercase_copy(kp_gguf_str s, char *out, size_t cap) {
    size_t n = s.data ? (s.len < cap - 1 ? s.len : cap - 1) : 0;
    for (size_t i = 0; i < n; i++) out[i] = (char)tolower((unsigned char)s.data[i]);
    out[n] = 0;
}

/* Per-model token attributes llama.cpp sets by name (lstrip / rstrip). */
static kp_gguf_str str_or_empty(const kp_gguf *g, const char *key) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    kp_gguf_str none = {NULL, 0};
    return kv && kv->value.type == KP_GGUF_TYPE_STRING ? kv->value.v.str : none;
}

static void model_quirks(kp_tok_vocab *v, const kp_gguf *g) {
    kp_gguf_str name = str_or_empty(g, "general.name"), pre = str_or_empty(g, "tokenizer.ggml.pre");
    kp_gguf_str arch = str_or_empty(g, "general.architecture");
    char lname[256], spre[256], sarch[256];
    lowercase_copy(name, lname, sizeof lname);
    snprintf(spre, sizeof spre, "%.*s", pre.data ? (int)(pre.len > 255 ? 255 : pre.len) : 0,
             pre.data ? pre.data : "");
    snprintf(sarch, sizeof sarch, "%.*s", arch.data ? (int)(arch.len > 255 ? 255 : arch.len) : 0,
             arch.data ? arch.data : "");
    if (strstr(spre, "jina-v2-de") || strstr(spre, "jina-v2-es") || strstr(spre, "jina-v2-code") ||
        strstr(sarch, "nomic-bert-moe") || strstr(sarch, "jina-bert-v3")) {
        int32_t id = find_cstr(v, "<mask>");
        if (id >= 0) v->attrs[id] |= KP_TOK_ATTR_LSTRIP;
    } else if (strstr(lname, "phi-3") || strstr(lname, "phi3")) {
        for (size_t i = 0; i < v->n_special; i++) v->attrs[v->special[i]] |= KP_TOK_ATTR_RSTRIP;
        int32_t id = find_cstr(v, "</s>");
        if (id >= 0) v->attrs[id] |= KP_TOK_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t k = 0; k < 3; k++)
            if ((id = find_cstr(v, keep[k])) >= 0) v->attrs[id] &= ~(uint32_t)KP_TOK_ATTR_RSTRIP;
    } else if (strstr(lname, "modern-bert")) {
        int32_t id = find_cstr(v, "[MASK]");
        if (id >= 0) v->attrs[id] |= KP_TOK_ATTR_LSTRIP;
    }
}

/* The newline token: SPM's byte token for '\n', BPE's first id of "\n". */
static kp_status find_newline(kp_tok_vocab *v, kp_error *err) {
    if (v->model == KP_TOK_MODEL_SPM) {
        v->nl = v->byte_tok['\n'] >= 0 ? v->byte_tok['\n'] : v->pad;
        return KP_OK;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kp_status st = kp_tok_encode(v, "\n", 1, false, false, &ids, &n, err);
    if (st != KP_OK) return st;
    v->nl = n > 0 ? ids[0] : v->pad;
    free(ids);
    return KP_OK;
}

void kp_tok_vocab_free(kp_tok_vocab *v) {
    if (!v) return;
    free(v->pre_name);
    free(v->pre_warning);
    kp_buf_free(&v->warnings);
    free(v->text_arena);
    free(v->text_off);
    free(v->text_len);
    free(v->scores);
    free(v->attrs);
    free(v->eog);
    free(v->slots);
    free(v->special);
    free(v->trie);
    kp_tok_merges_free(&v->merges);
    kp_tok_pretok_free(v->pretok);
    free(v->piece_arena);
    free(v->piece_off);
    free(v->piece_len);
    free(v);
}

kp_status kp_tok_vocab_load(kp_tok_vocab **out, const kp_gguf *g, kp_error *err) {
    if (!out || !g) return kp_fail(err, KP_EINVAL, "kp_tok_vocab_load: NULL argument");
    *out = NULL;
    kp_tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return oom(err);
    for (int b = 0; b < 256; b++) v->trie_root[b] = -1;
    kp_status st;
    if ((st = load_model_kind(v, g, err)) != KP_OK) goto fail;
    if ((st = load_tokens(v, g, err)) != KP_OK) goto fail;
    if (v->model == KP_TOK_MODEL_BPE && (st = load_merges(v, g, err)) != KP_OK) goto fail;
    if ((st = load_flags(v, g, err)) != KP_OK) goto fail;
    build_byte_tables(v);
    if (v->model == KP_TOK_MODEL_SPM) v->spm_word_cuts = spm_words_separable(v);
    if (v->model == KP_TOK_MODEL_BPE && (st = kp_tok_pretok_new(&v->pretok, v->pre_kind, err)) != KP_OK)
        goto fail;
    /* computed before the special-token list exists, as llama.cpp does */
    if ((st = find_newline(v, err)) != KP_OK) goto fail;
    if ((st = load_special_ids(v, g, err)) != KP_OK) goto fail;
    fix_special_tokens(v);
    if ((st = build_special_list(v, err)) != KP_OK) goto fail;
    if ((st = build_pieces(v, err)) != KP_OK) goto fail;
    model_quirks(v, g);
    *out = v;
    return KP_OK;
fail:
    kp_tok_vocab_free(v);
    return st;
}
