/*
 * tok.c - the tokenizer's public entry points: queries, text -> ids (with
 * the special-token split), ids -> text, and the streaming decoder.
 *
 * Owns no state beyond each call's scratch and each kp_tok_stream's buffers;
 * the vocabulary (tok_load.c) is only read.
 *
 * Encoding, as llama.cpp's llama_vocab::impl::tokenize:
 *
 *   "Hi<|im_end|>  there"          raw text
 *     | special-token split (longest special text first; control/unknown
 *     | tokens only with parse_special; user-defined tokens always)
 *     v
 *   [raw "Hi"] [token 151645] [raw "  there"]
 *     | SPM: each raw piece gets "▁" in front when it starts the text or
 *     |      follows a token (add_space_prefix), spaces -> "▁", then merge
 *     | BPE: each raw piece -> code points (bad bytes -> U+FFFD) ->
 *     |      regex words -> per word: bytes -> GPT-2 code points -> merges
 *     v
 *   ids (BOS / EOS around them when add_special and the vocab says so)
 *
 * Fragments of the split are (offset, length) views of the caller's text
 * or a token id:
 *
 *   frag { token = -1, off, len }   raw text
 *   frag { token = id }             a special token
 *
 * The split follows llama.cpp's tokenizer_st_partition exactly (the same
 * token order, the same leftmost non-overlapping matches, lstrip/rstrip),
 * but first runs one pass of a trie over the text to learn which special
 * texts occur at all, so vocabularies with thousands of user-defined
 * tokens do not pay one substring search per token per call.
 *
 * Streaming decoder: pending holds at most 3 bytes, always a valid but
 * incomplete UTF-8 prefix; each push decodes pending + piece with the
 * strict rules of kp_unicode_utf8_decode.
 */
#include <assert.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_impl.h"
#include "base/buf.h"
#include "base/unicode.h"

/* ---- queries ---- */

static bool valid_id(const kp_tok_vocab *v, int32_t id) { return v && id >= 0 && id < v->n_vocab; }

int32_t kp_tok_n_vocab(const kp_tok_vocab *v) { return v->n_vocab; }
kp_tok_model kp_tok_model_kind(const kp_tok_vocab *v) { return v->model; }
const char *kp_tok_model_name(const kp_tok_vocab *v) { return v->model_name; }
const char *kp_tok_pre_name(const kp_tok_vocab *v) { return v->pre_name; }
const char *kp_tok_pre_warning(const kp_tok_vocab *v) { return v->pre_warning; }
const char *kp_tok_warnings(const kp_tok_vocab *v) { return v->warnings.data; }
int32_t kp_tok_bos(const kp_tok_vocab *v) { return v->bos; }
int32_t kp_tok_eos(const kp_tok_vocab *v) { return v->eos; }
int32_t kp_tok_eot(const kp_tok_vocab *v) { return v->eot; }
int32_t kp_tok_unk(const kp_tok_vocab *v) { return v->unk; }
int32_t kp_tok_pad(const kp_tok_vocab *v) { return v->pad; }
int32_t kp_tok_nl(const kp_tok_vocab *v) { return v->nl; }
bool kp_tok_add_bos(const kp_tok_vocab *v) { return v->add_bos; }
bool kp_tok_add_eos(const kp_tok_vocab *v) { return v->add_eos; }
bool kp_tok_add_space_prefix(const kp_tok_vocab *v) { return v->add_space_prefix; }

bool kp_tok_is_eog(const kp_tok_vocab *v, int32_t id) { return valid_id(v, id) && v->eog[id]; }

bool kp_tok_is_control(const kp_tok_vocab *v, int32_t id) {
    return valid_id(v, id) && (v->attrs[id] & KP_TOK_ATTR_CONTROL);
}

uint32_t kp_tok_attr(const kp_tok_vocab *v, int32_t id) { return valid_id(v, id) ? v->attrs[id] : 0; }

float kp_tok_score(const kp_tok_vocab *v, int32_t id) { return valid_id(v, id) ? v->scores[id] : 0.0f; }

const char *kp_tok_text(const kp_tok_vocab *v, int32_t id, size_t *len) {
    if (!valid_id(v, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = v->text_len[id];
    return v->text_arena + v->text_off[id];
}

int32_t kp_tok_find(const kp_tok_vocab *v, const char *text, size_t len) {
    if (!v || (!text && len)) return -1;
    return kp_tok_lookup(v, text ? text : "", len);
}

/* ---- special-token split ---- */

typedef struct {
    int32_t token; /* -1 for raw text */
    size_t off, len;
} frag;

typedef struct {
    frag *v;
    size_t n, cap;
} frag_list;

static int frag_push(frag_list *l, int32_t token, size_t off, size_t len) {
    if (!kp_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) return -1;
    l->v[l->n].token = token;
    l->v[l->n].off = off;
    l->v[l->n].len = len;
    l->n++;
    return 0;
}

/* Marks present[i] for every special text that occurs somewhere in text. */
static void find_present(const kp_tok_vocab *v, const uint8_t *text, size_t len, uint8_t *present) {
    for (size_t i = 0; i < len; i++) {
        int32_t node = v->trie_root[text[i]];
        size_t j = i;
        while (node >= 0) {
            if (v->trie[node].special_index >= 0) present[v->trie[node].special_index] = 1;
            if (++j >= len) break;
            int32_t c = v->trie[node].first_child;
            while (c >= 0 && v->trie[c].byte != text[j]) c = v->trie[c].next_sibling;
            node = c;
        }
    }
}

static bool is_space(char c) { return isspace((unsigned char)c) != 0; }

/* The ranges of the text where control tokens are not parsed (sorted,
 * disjoint), or none. */
typedef struct {
    const kp_tok_range *v;
    size_t n;
} plain_ranges;

/* Whether [pos, pos + n) overlaps a plain range (binary search for the
 * last range starting before its end). */
static bool in_plain(const plain_ranges *p, size_t pos, size_t n) {
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->v[mid].start < pos + n) lo = mid + 1;
        else hi = mid;
    }
    return lo > 0 && p->v[lo - 1].start + p->v[lo - 1].len > pos;
}

/* Splits every raw fragment of `in` at the occurrences of token id, except
 * occurrences that overlap a plain range when the token is a control or
 * unknown one (those stay text). */
static int split_on_token(const kp_tok_vocab *v, const char *text, int32_t id, const frag_list *in,
                          const plain_ranges *plain, frag_list *out) {
    const char *t = v->text_arena + v->text_off[id];
    size_t tl = v->text_len[id];
    uint32_t attr = v->attrs[id];
    assert(tl > 0); /* empty texts were renamed at load */
    out->n = 0;
    for (size_t f = 0; f < in->n; f++) {
        frag fr = in->v[f];
        if (fr.token >= 0) {
            if (frag_push(out, fr.token, 0, 0)) return -1;
            continue;
        }
        size_t off = fr.off, len = fr.len, scan = fr.off;
        bool guarded = plain->n && (attr & (KP_TOK_ATTR_CONTROL | KP_TOK_ATTR_UNKNOWN));
        while (len > 0) {
            const char *m = memmem(text + scan, off + len - scan, t, tl);
            if (!m) {
                if (frag_push(out, -1, off, len)) return -1;
                break;
            }
            size_t mpos = (size_t)(m - text);
            if (guarded && in_plain(plain, mpos, tl)) { /* the client's text: not a token */
                scan = mpos + 1;
                continue;
            }
            size_t left = mpos - off;
            if (attr & KP_TOK_ATTR_LSTRIP)
                while (left > 0 && is_space(text[off + left - 1])) left--;
            if (left > 0 && frag_push(out, -1, off, left)) return -1;
            if (frag_push(out, id, 0, 0)) return -1;
            size_t r_off = mpos + tl, r_len = off + len - r_off;
            if (attr & KP_TOK_ATTR_RSTRIP)
                while (r_len > 0 && is_space(text[r_off])) {
                    r_off++;
                    r_len--;
                }
            off = scan = r_off;
            len = r_len;
        }
    }
    return 0;
}

static kp_status partition(const kp_tok_vocab *v, const char *text, size_t len, bool parse_special,
                           const plain_ranges *plain, frag_list *out, kp_error *err) {
    frag_list tmp = {0};
    uint8_t *present = NULL;
    if (len == 0) return KP_OK;
    if (frag_push(out, -1, 0, len)) goto nomem;
    if (v->n_special == 0 || (!parse_special && v->n_special_always == 0)) return KP_OK;
    present = calloc(v->n_special, 1);
    if (!present) goto nomem;
    find_present(v, (const uint8_t *)text, len, present);
    for (size_t i = 0; i < v->n_special; i++) {
        if (!present[i]) continue;
        int32_t id = v->special[i];
        if (!parse_special && (v->attrs[id] & (KP_TOK_ATTR_CONTROL | KP_TOK_ATTR_UNKNOWN))) continue;
        if (split_on_token(v, text, id, out, plain, &tmp)) goto nomem;
        frag_list swap = *out;
        *out = tmp;
        tmp = swap;
    }
    free(tmp.v);
    free(present);
    return KP_OK;
nomem:
    free(tmp.v);
    free(present);
    return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
}

/* ---- encoding ---- */

typedef struct {
    char *buf, *buf2;
    size_t cap, cap2;
} text_bufs;

static kp_status spm_fragment(const kp_tok_vocab *v, kp_tok_scratch *s, text_bufs *tb, const char *text,
                              size_t len, bool prefix_space, kp_tok_ids *out, kp_error *err) {
    if (!kp_grow((void **)&tb->buf, &tb->cap, 3 * (len + 1), 1))
        return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    size_t n = 0;
    if (prefix_space) {
        memcpy(tb->buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(tb->buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            tb->buf[n++] = text[i];
        }
    }
    return kp_tok_spm_tokenize(v, s, tb->buf, n, out, err);
}

static kp_status bpe_fragment(const kp_tok_vocab *v, kp_tok_scratch *s, text_bufs *tb, const char *text,
                              size_t len, kp_tok_ids *out, kp_error *err) {
    /* code points as llama.cpp reads them, written back as UTF-8 (norm);
     * surrogates, which PCRE2 cannot match, become U+E000 (same length and
     * category C) in the copy the regexes see */
    if (!kp_grow((void **)&tb->buf, &tb->cap, 3 * len + 4, 1))
        return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    size_t n = 0;
    bool surrogates = false;
    for (size_t i = 0; i < len;) {
        size_t used;
        uint32_t cpt = kp_unicode_decode_lenient((const uint8_t *)text + i, len - i, &used);
        i += used;
        if (cpt >= 0xD800 && cpt <= 0xDFFF) surrogates = true;
        n += kp_unicode_encode(cpt, (uint8_t *)tb->buf + n);
    }
    const char *match = tb->buf;
    if (surrogates) {
        if (!kp_grow((void **)&tb->buf2, &tb->cap2, n + 1, 1))
            return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
        memcpy(tb->buf2, tb->buf, n);
        for (size_t i = 0; i + 2 < n; i++) {
            uint8_t b0 = (uint8_t)tb->buf2[i], b1 = (uint8_t)tb->buf2[i + 1];
            if (b0 == 0xED && b1 >= 0xA0) {
                memcpy(tb->buf2 + i, "\xee\x80\x80", 3);
                i += 2;
            }
        }
        match = tb->buf2;
    }
    kp_tok_span *words = NULL;
    size_t n_words = 0;
    kp_status st = kp_tok_pretok_split(v->pretok, match, n, &words, &n_words, err);
    for (size_t w = 0; st == KP_OK && w < n_words; w++)
        st = kp_tok_bpe_word(v, s, (const uint8_t *)tb->buf + words[w].start, words[w].len, out, err);
    free(words);
    return st;
}

static kp_status encode(const kp_tok_vocab *v, const char *text, size_t len, bool add_special,
                        bool parse_special, const plain_ranges *plain, int32_t **ids, size_t *n_ids,
                        kp_error *err) {
    if (!v || !ids || !n_ids || (!text && len)) return kp_fail(err, KP_EINVAL, "kp_tok_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > KP_TOK_MAX_TEXT)
        return kp_fail(err, KP_ERANGE, "kp_tok_encode: text of %zu bytes is longer than the %zu allowed",
                       len, (size_t)KP_TOK_MAX_TEXT);
    frag_list frags = {0};
    kp_tok_ids out = {0};
    text_bufs tb = {0};
    kp_tok_scratch *s = kp_tok_scratch_new();
    kp_status st = s ? KP_OK : kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    if (st == KP_OK) st = partition(v, text, len, parse_special, plain, &frags, err);
    if (st == KP_OK && add_special && v->add_bos) st = kp_tok_ids_push(&out, v->bos, err);
    bool prev_special = true; /* SPM: the first raw piece gets a leading space */
    for (size_t i = 0; st == KP_OK && i < frags.n; i++) {
        const frag *f = &frags.v[i];
        if (f->token >= 0) {
            st = kp_tok_ids_push(&out, f->token, err);
            prev_special = true;
        } else if (v->model == KP_TOK_MODEL_SPM) {
            st = spm_fragment(v, s, &tb, text + f->off, f->len, v->add_space_prefix && prev_special,
                              &out, err);
            prev_special = false;
        } else {
            st = bpe_fragment(v, s, &tb, text + f->off, f->len, &out, err);
        }
    }
    if (st == KP_OK && add_special && v->add_eos) st = kp_tok_ids_push(&out, v->eos, err);
    kp_tok_scratch_free(s);
    free(frags.v);
    free(tb.buf);
    free(tb.buf2);
    if (st != KP_OK) {
        free(out.ids);
        return st;
    }
    *ids = out.ids;
    *n_ids = out.n;
    return KP_OK;
}

kp_status kp_tok_encode(const kp_tok_vocab *v, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t **ids, size_t *n_ids, kp_error *err) {
    plain_ranges none = {NULL, 0};
    return encode(v, text, len, add_special, parse_special, &none, ids, n_ids, err);
}

kp_status kp_tok_encode_plain(const kp_tok_vocab *v, const char *text, size_t len, bool add_special,
                              const kp_tok_range *plain, size_t n_plain, int32_t **ids, size_t *n_ids,
                              kp_error *err) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (n_plain && !plain) return kp_fail(err, KP_EINVAL, "kp_tok_encode_plain: NULL ranges");
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].start > len || plain[i].len > len - plain[i].start ||
            (i > 0 && plain[i].start < plain[i - 1].start + plain[i - 1].len))
            return kp_fail(err, KP_EINVAL, "kp_tok_encode_plain: range %zu (%zu+%zu) is out of order or past the "
                                           "text of %zu bytes", i, plain[i].start, plain[i].len, len);
    plain_ranges p = {plain, n_plain};
    return encode(v, text, len, add_special, true, &p, ids, n_ids, err);
}

/* ---- decoding ---- */

const char *kp_tok_piece_view(const kp_tok_vocab *v, int32_t id, bool special, size_t *len) {
    if (!valid_id(v, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (!special && (v->attrs[id] & (KP_TOK_ATTR_UNKNOWN | KP_TOK_ATTR_CONTROL))) {
        if (len) *len = 0;
        return v->piece_arena;
    }
    if (len) *len = v->piece_len[id];
    return v->piece_arena + v->piece_off[id];
}

kp_status kp_tok_piece(const kp_tok_vocab *v, int32_t id, bool special, char *buf, size_t cap,
                    size_t *len, kp_error *err) {
    size_t n;
    const char *p = kp_tok_piece_view(v, id, special, &n);
    if (!p) return kp_fail(err, KP_EINVAL, "token id %d is outside the vocabulary (%d tokens)", id,
                           v ? v->n_vocab : 0);
    if (len) *len = n;
    if (n > cap) return kp_fail(err, KP_ERANGE, "token %d: piece of %zu bytes, buffer of %zu", id, n, cap);
    if (n) memcpy(buf, p, n);
    return KP_OK;
}

/* llama.cpp's clean_up_tokenization_spaces passes, in place; returns the new length. */
static size_t clean_spaces(char *text, size_t total) {
    /* " ?", " !", " .", " ," -> drop the space */
    size_t t1 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t1; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            total--;
        text[total++] = x;
    }
    /* " ' " -> "'" */
    size_t t2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t2; i++) {
        char x = text[i];
        if (x == '\'' && i + 1 < t2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;
            text[++i] = '\0';
        }
        text[total++] = x;
    }
    /* " 's", " 'm", " 're", " 've" -> drop the space */
    size_t t3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t3; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < t3) {
                char x2 = text[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
            }
        }
        text[total++] = x;
    }
    return total;
}

/* The pieces of ids[0..n_ids) concatenated into a new string (see
 * kp_tok_detokenize), the clean-spaces pass when clean; end (may be NULL)
 * gets, for each id, the length of the text of ids[0..i] before any
 * clean-up (a dropped BOS / EOS ends where the text before it ends). */
static kp_status detokenize(const kp_tok_vocab *v, const int32_t *ids, size_t n_ids, bool remove_special,
                            bool unparse_special, bool clean, char **text, size_t *len, size_t *end,
                            kp_error *err) {
    if (!v || !text || !len || (!ids && n_ids)) return kp_fail(err, KP_EINVAL, "kp_tok_detokenize: NULL argument");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (!valid_id(v, ids[i]))
            return kp_fail(err, KP_EINVAL, "token id %d (position %zu) is outside the vocabulary (%d tokens)",
                           ids[i], i, v->n_vocab);
        total += v->piece_len[ids[i]];
    }
    size_t first = 0, last = n_ids; /* the ids whose pieces are written: [first, last) */
    bool remove_space = v->add_space_prefix;
    if (remove_special && v->add_bos && n_ids > 0 && ids[0] == v->bos) {
        remove_space = false;
        first = 1;
    }
    if (remove_special && v->add_eos && last > first && ids[last - 1] == v->eos) last--;
    char *out = malloc(total + 1);
    if (!out) return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (i >= first && i < last) {
            size_t n;
            const char *p = kp_tok_piece_view(v, ids[i], unparse_special, &n);
            if (remove_space && n > 0 && p[0] == ' ') {
                p++;
                n--;
            }
            remove_space = false;
            memcpy(out + o, p, n);
            o += n;
        }
        if (end) end[i] = o;
    }
    if (clean && v->clean_spaces) o = clean_spaces(out, o);
    out[o] = 0;
    *text = out;
    *len = o;
    return KP_OK;
}

kp_status kp_tok_detokenize(const kp_tok_vocab *v, const int32_t *ids, size_t n_ids, bool remove_special,
                            bool unparse_special, char **text, size_t *len, kp_error *err) {
    return detokenize(v, ids, n_ids, remove_special, unparse_special, true, text, len, NULL, err);
}

kp_status kp_tok_detokenize_raw(const kp_tok_vocab *v, const int32_t *ids, size_t n_ids, bool remove_special,
                                bool unparse_special, char **text, size_t *len, size_t *end, kp_error *err) {
    return detokenize(v, ids, n_ids, remove_special, unparse_special, false, text, len, end, err);
}

/* ---- streaming ---- */

struct kp_tok_stream {
    const kp_tok_vocab *v;
    bool special;
    uint8_t pending[4];
    size_t n_pending;
    char *out;
    size_t out_cap;
};

kp_status kp_tok_stream_new(kp_tok_stream **out, const kp_tok_vocab *v, bool special, kp_error *err) {
    if (!out || !v) return kp_fail(err, KP_EINVAL, "kp_tok_stream_new: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out) return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    (*out)->v = v;
    (*out)->special = special;
    return KP_OK;
}

void kp_tok_stream_free(kp_tok_stream *s) {
    if (!s) return;
    free(s->out);
    free(s);
}

void kp_tok_stream_reset(kp_tok_stream *s) {
    if (s) s->n_pending = 0;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

kp_status kp_tok_stream_push(kp_tok_stream *s, int32_t id, const char **bytes, size_t *n_bytes,
                          kp_error *err) {
    if (!s || !bytes || !n_bytes) return kp_fail(err, KP_EINVAL, "kp_tok_stream_push: NULL argument");
    *bytes = NULL;
    *n_bytes = 0;
    size_t plen;
    const char *piece = kp_tok_piece_view(s->v, id, s->special, &plen);
    if (!piece)
        return kp_fail(err, KP_EINVAL, "token id %d is outside the vocabulary (%d tokens)", id, s->v->n_vocab);
    size_t n = s->n_pending + plen;
    /* room for the input itself and, worst case, 3 output bytes per input byte */
    if (!kp_grow((void **)&s->out, &s->out_cap, n + 3 * n + 1, 1))
        return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    uint8_t *in = (uint8_t *)s->out + 3 * n + 1; /* input copy behind the output area */
    memcpy(in, s->pending, s->n_pending);
    memcpy(in + s->n_pending, piece, plen);
    size_t o = 0, i = 0;
    s->n_pending = 0;
    while (i < n) {
        int r = kp_unicode_utf8_decode(in + i, n - i, NULL);
        if (r > 0) {
            memmove(s->out + o, in + i, (size_t)r);
            o += (size_t)r;
            i += (size_t)r;
        } else if (r < 0) {
            memcpy(s->out + o, REPLACEMENT, 3);
            o += 3;
            i += (size_t)-r;
        } else {
            s->n_pending = n - i; /* <= 3 bytes: a valid, incomplete character */
            memcpy(s->pending, in + i, s->n_pending);
            break;
        }
    }
    *bytes = s->out;
    *n_bytes = o;
    return KP_OK;
}

void kp_tok_stream_flush(kp_tok_stream *s, const char **bytes, size_t *n_bytes) {
    *bytes = NULL;
    *n_bytes = 0;
    if (!s) return;
    if (s->n_pending) {
        s->n_pending = 0;
        if (kp_grow((void **)&s->out, &s->out_cap, 3, 1)) {
            memcpy(s->out, REPLACEMENT, 3);
            *bytes = s->out;
            *n_bytes = 3;
        }
    }
}
