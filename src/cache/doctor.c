/*
 * doctor.c - divergence, cause, snippets and advice for a prefix-cache miss
 * (see doctor.h for the contract).
 *
 * Owns no state: every function works on the borrowed texts and writes into
 * caller-provided fixed-size buffers. The only allocations are jansson's,
 * while the JSON enclosing a divergence is parsed and compared.
 *
 * Vocabulary used throughout:
 *
 *   c[0..clen)  cached text        r[0..rlen)  request text
 *   d           the divergence: c[0..d) == r[0..d), and d is the start of
 *               the first character that differs (never inside a UTF-8
 *               sequence)
 *   d0          the start of d's line (d0 <= d, same in both texts)
 *
 *   A head rewrite, where the old text resumes at e in c and at q in r:
 *
 *             d0         d
 *             v          v
 *   c:  ...\n Summary: X. and Y.\n User: q1\n ... | User: q5\n ... (end)
 *   r:  ...\n Summary: X., Z.\n | User: q5\n ...     User: q9\n
 *             |---------|       ^q                ^e
 *             [d0,e) old head, [d0,q) new head, c[e..clen) == r[q..)
 *
 * Classification looks only around d (the cache reuses nothing after it):
 *
 *   1. JSON: walk back from d over '{' and '[' (nearest first); the first
 *      one whose string-aware bracket match encloses d in both texts and
 *      whose regions parse in both decides: equal values with an object's
 *      keys in another order -> reordered_json; anything else -> not JSON.
 *   2. whitespace: skipping every whitespace byte, the texts agree from d
 *      for 32 bytes (or until one ends), and one of them has whitespace
 *      at d.
 *   3. pure insertion: c[d0..clen) occurs in r after d0: r[d0..q) was put in
 *      front of cached text that follows intact; or, mid-line inside JSON,
 *      c[d..clen) occurs in r at least 32 bytes after d (a whole element
 *      inserted; words inserted into prose are an edit).
 *   4. fields: a datetime, an identifier or a number that spans d in both
 *      texts, starting at the same byte a <= d (found by trying every word
 *      start in the 64 bytes before d; the earliest start wins).
 *   5. head rewrite: for line starts e > d0 in c (nearest first), c[e..clen)
 *      (>= 32 bytes) occurs in r at q >= d0; if [d0,e) spans two lines or
 *      more, the head was rewritten (or cut) and the old text follows; one
 *      line replaced (by any number of lines) is an ordinary edit.
 *   6. new prefix: 0 < d <= 256, the word d falls in starts after a line
 *      end or markup ('>' or ']', then spaces), and no tail of c past d
 *      resumes in r (see check_new_prefix):
 *
 *      c:  <|im_start|>user\n What is the capital of France?<|im_end|>...
 *      r:  <|im_start|>user\n Write a haiku about autumn leaves.<|im_end|>...
 *          |--- shared ----|^d  nothing of c[d..) follows in r
 *
 *   7. other, or cold when d == 0.
 *
 * Characters: a "character" is a valid UTF-8 sequence (RFC 3629, checked
 * strictly) or, failing that, one byte. Snippets and excerpts are built
 * from whole characters and escaped, so they are always valid UTF-8.
 */
#include "cache/doctor.h"

#include "base/unicode.h"

#include <assert.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Cause names                                                         */

static const char *const cause_names[KP_DOCTOR_CAUSE_COUNT] = {
    [KP_DOCTOR_CAUSE_HIT] = "hit",
    [KP_DOCTOR_CAUSE_COLD] = "cold",
    [KP_DOCTOR_CAUSE_EVICTED] = "evicted",
    [KP_DOCTOR_CAUSE_TIMESTAMP] = "timestamp",
    [KP_DOCTOR_CAUSE_COUNTER] = "counter",
    [KP_DOCTOR_CAUSE_IDENTIFIER] = "identifier",
    [KP_DOCTOR_CAUSE_REORDERED_JSON] = "reordered_json",
    [KP_DOCTOR_CAUSE_WHITESPACE] = "whitespace",
    [KP_DOCTOR_CAUSE_INSERTED_AT_FRONT] = "inserted_at_front",
    [KP_DOCTOR_CAUSE_OTHER] = "other",
    [KP_DOCTOR_CAUSE_RETOKENIZED] = "retokenized",
    [KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY] = "template_rewrites_history",
    [KP_DOCTOR_CAUSE_NEW_PREFIX] = "new_prefix",
    [KP_DOCTOR_CAUSE_WINDOW_EVICTED] = "window_evicted",
    [KP_DOCTOR_CAUSE_RECURRENT_STATE] = "recurrent_state",
    [KP_DOCTOR_CAUSE_STATE_CHECKPOINT] = "state_checkpoint",
};

const char *kp_doctor_cause_name(kp_doctor_cause cause) {
    if ((unsigned)cause >= KP_DOCTOR_CAUSE_COUNT) return "invalid";
    return cause_names[cause];
}

kp_status kp_doctor_cause_parse(const char *name, kp_doctor_cause *out, kp_error *err) {
    if (!name || !out) return kp_fail(err, KP_EINVAL, "kp_doctor_cause_parse: NULL argument");
    for (int i = 0; i < KP_DOCTOR_CAUSE_COUNT; i++) {
        if (strcmp(name, cause_names[i]) == 0) {
            *out = (kp_doctor_cause)i;
            return KP_OK;
        }
    }
    return kp_fail(err, KP_ENOTFOUND, "unknown prefix-miss cause '%.64s'", name);
}

/* ------------------------------------------------------------------ */
/* Bytes and characters                                                */

static bool is_digit(unsigned char ch) { return ch >= '0' && ch <= '9'; }
static bool is_alpha(unsigned char ch) { return (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z'; }
static bool is_upper(unsigned char ch) { return ch >= 'A' && ch <= 'Z'; }
static bool is_lower(unsigned char ch) { return ch >= 'a' && ch <= 'z'; }
static bool is_alnum(unsigned char ch) { return is_digit(ch) || is_alpha(ch); }
static bool is_hex(unsigned char ch) {
    return is_digit(ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
}
static bool is_ws(unsigned char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}
static bool is_cont(unsigned char ch) { return (ch & 0xC0) == 0x80; }
/* Bytes that may continue a word: a field never starts right after one. */
static bool is_word(unsigned char ch) { return is_alnum(ch) || ch == '_'; }

static unsigned char at(const char *s, size_t n, size_t i) {
    return i < n ? (unsigned char)s[i] : 0;
}

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), or 0 when none
 * starts there, invalid or cut short by the end (the first byte then counts
 * as a character alone); *cp (when not NULL) its code point. */
static size_t utf8_len(const unsigned char *s, size_t n, uint32_t *cp) {
    int k = kp_unicode_utf8_decode(s, n, cp);
    return k > 0 ? (size_t)k : 0;
}

/* Bytes of the character at s[i] (1 for an invalid byte); i < n. */
static size_t char_len(const char *s, size_t n, size_t i) {
    size_t len = utf8_len((const unsigned char *)s + i, n - i, NULL);
    return len ? len : 1;
}

/* Moves i back to the start of the character that contains it: the start p
 * (at most 3 bytes back) of a valid sequence that covers i. */
static size_t char_start(const char *s, size_t n, size_t i) {
    if (i >= n || !is_cont((unsigned char)s[i])) return i;
    for (size_t back = 1; back <= 3 && back <= i; back++) {
        size_t p = i - back;
        size_t len = utf8_len((const unsigned char *)s + p, n - p, NULL);
        if (len > back) return p;
        if (!is_cont((unsigned char)s[p])) break;
    }
    return i;
}

/* Start of the character that ends right at i (i > 0). */
static size_t char_before(const char *s, size_t n, size_t i) {
    for (size_t back = 2; back <= 4 && back <= i; back++) {
        size_t p = i - back;
        if (utf8_len((const unsigned char *)s + p, n - p, NULL) == back) return p;
    }
    return i - 1;
}

/* Where two texts equal on [0, i) diverge as characters: i moved back over
 * the continuation bytes either text has at i (at most 3). */
static size_t snap_divergence(const char *c, size_t clen, const char *r, size_t rlen,
                              size_t i) {
    for (int k = 0; k < 3 && i > 0; k++) {
        bool cont = (i < clen && is_cont((unsigned char)c[i])) ||
                    (i < rlen && is_cont((unsigned char)r[i]));
        if (!cont) break;
        i--;
    }
    return i;
}

/* ------------------------------------------------------------------ */
/* Escaping and a bounded string builder                               */

/* Escapes the character at s[i] into out (>= 7 bytes); returns the escaped
 * length and sets *used to the bytes of s consumed. */
static size_t escape_char(const char *s, size_t n, size_t i, kp_doctor_escape mode, char *out,
                          size_t *used) {
    const unsigned char *u = (const unsigned char *)s + i;
    uint32_t cp = 0;
    size_t len = utf8_len(u, n - i, &cp);
    bool json = mode == KP_DOCTOR_ESCAPE_JSON;
    if (len == 0) { /* not UTF-8 */
        *used = 1;
        if (json) return (size_t)sprintf(out, "\\ufffd");
        return (size_t)sprintf(out, "\\x%02X", u[0]);
    }
    *used = len;
    if (len == 1) {
        unsigned char ch = u[0];
        switch (ch) {
        case '\n': return (size_t)sprintf(out, "\\n");
        case '\t': return (size_t)sprintf(out, "\\t");
        case '\r': return (size_t)sprintf(out, "\\r");
        case '\\': return (size_t)sprintf(out, "\\\\");
        case '"':
            if (json) return (size_t)sprintf(out, "\\\"");
            break;
        case '\b':
            if (json) return (size_t)sprintf(out, "\\b");
            break;
        case '\f':
            if (json) return (size_t)sprintf(out, "\\f");
            break;
        default: break;
        }
        if (ch < 0x20 || ch == 0x7F)
            return (size_t)sprintf(out, json ? "\\u%04x" : "\\x%02X", ch);
        out[0] = (char)ch;
        return 1;
    }
    if ((cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029)
        return (size_t)sprintf(out, "\\u%04x", (unsigned)cp);
    memcpy(out, u, len);
    return len;
}

/* Appends into buf[0..cap) keeping a NUL terminator; text that does not fit
 * is dropped whole-character-wise. `need` counts what the full text would
 * take (snprintf semantics for kp_doctor_advice). */
typedef struct {
    char *buf;
    size_t cap;
    size_t len;
    size_t need;
} sbuf;

static void sb_init(sbuf *b, char *buf, size_t cap) {
    b->buf = buf;
    b->cap = cap;
    b->len = 0;
    b->need = 0;
    if (cap) buf[0] = 0;
}

static void sb_putn(sbuf *b, const char *s, size_t n) {
    b->need += n;
    if (b->cap == 0 || b->len + 1 >= b->cap) return;
    if (b->len != b->need - n) return; /* already truncated: stay cut */
    size_t room = b->cap - 1 - b->len;
    size_t k = n;
    if (k > room) {
        k = room;
        while (k > 0 && is_cont((unsigned char)s[k])) k--;
    }
    memcpy(b->buf + b->len, s, k);
    b->len += k;
    b->buf[b->len] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t k = (size_t)n;
    if (k >= sizeof tmp) { /* cut by vsnprintf: end on a character boundary */
        k = sizeof tmp - 1;
        while (k > 0 && is_cont((unsigned char)tmp[k])) k--;
    }
    sb_putn(b, tmp, k);
}

/* Appends s[start..end) escaped for people, at most max_chars characters,
 * then "..." when cut. */
static void sb_escaped(sbuf *b, const char *s, size_t n, size_t start, size_t end,
                       size_t max_chars) {
    char esc[8];
    size_t i = start, chars = 0;
    if (end > n) end = n;
    while (i < end && chars < max_chars) {
        size_t used;
        size_t k = escape_char(s, n, i, KP_DOCTOR_ESCAPE_HUMAN, esc, &used);
        sb_putn(b, esc, k);
        i += used;
        chars++;
    }
    if (i < end) sb_putn(b, "...", 3);
}

/* The same between single quotes. */
static void sb_excerpt(sbuf *b, const char *s, size_t n, size_t start, size_t end,
                       size_t max_chars) {
    sb_putn(b, "'", 1);
    sb_escaped(b, s, n, start, end, max_chars);
    sb_putn(b, "'", 1);
}

/* Cuts b back to len bytes (undoing appends). */
static void sb_rewind(sbuf *b, size_t len) {
    if (len < b->len) b->len = len;
    b->need = b->len;
    if (b->cap) b->buf[b->len] = 0;
}

/* ------------------------------------------------------------------ */
/* Snippets                                                            */

void kp_doctor_snippet_span(const char *text, size_t len, size_t at_byte, size_t before,
                         size_t after, size_t *start, size_t *end, size_t *at_out) {
    if (!text) len = 0;
    if (at_byte > len) at_byte = len;
    size_t a = char_start(text, len, at_byte);
    size_t s = a;
    for (size_t k = 0; k < before && s > 0; k++) s = char_before(text, len, s);
    size_t e = a;
    for (size_t k = 0; k < after && e < len; k++) e += char_len(text, len, e);
    if (start) *start = s;
    if (end) *end = e;
    if (at_out) *at_out = a;
}

size_t kp_doctor_snippet(const char *text, size_t len, size_t at_byte, size_t before, size_t after,
                      kp_doctor_escape mode, char *out, size_t cap, size_t *marker) {
    size_t s, e, a;
    kp_doctor_snippet_span(text, len, at_byte, before, after, &s, &e, &a);
    size_t w = 0;
    bool marked = false;
    if (cap) out[0] = 0;
    for (size_t i = s; i < e;) {
        if (i == a) {
            if (marker) *marker = w;
            marked = true;
        }
        char esc[8];
        size_t used;
        size_t k = escape_char(text, len, i, mode, esc, &used);
        if (cap == 0 || w + k + 1 > cap) break;
        memcpy(out + w, esc, k);
        w += k;
        out[w] = 0;
        i += used;
    }
    if (!marked && marker) *marker = w;
    return w;
}

/* ------------------------------------------------------------------ */
/* Divergence                                                          */

static size_t common_prefix(const char *c, size_t clen, const char *r, size_t rlen, size_t from) {
    size_t n = clen < rlen ? clen : rlen;
    size_t i = from;
    while (i < n && c[i] == r[i]) i++;
    return i;
}

kp_status kp_doctor_diverge(const char *cached, size_t cached_len, const char *request,
                         size_t request_len, const kp_doctor_tokens *tokens,
                         kp_doctor_divergence *out, kp_error *err) {
    if (!out || (!cached && cached_len) || (!request && request_len))
        return kp_fail(err, KP_EINVAL, "kp_doctor_diverge: NULL text or output");
    size_t n = cached_len < request_len ? cached_len : request_len;
    size_t raw = common_prefix(cached, cached_len, request, request_len, 0);
    kp_doctor_divergence dv = {0};
    dv.full_match = raw == n;
    dv.byte = snap_divergence(cached, cached_len, request, request_len, raw);
    dv.token_index = KP_DOCTOR_NO_TOKEN;
    dv.token_byte = dv.byte;
    dv.reused_bytes = dv.byte;
    if (tokens) {
        if (tokens->token_byte > request_len)
            return kp_fail(err, KP_EINVAL, "token byte %zu is past the end of the request (%zu bytes)",
                           tokens->token_byte, request_len);
        if (tokens->token_byte > raw)
            return kp_fail(err, KP_EINVAL,
                           "token byte %zu lies after the first differing byte %zu: equal tokens "
                           "cannot run past a text difference",
                           tokens->token_byte, raw);
        if (tokens->n_tokens && tokens->token_index > tokens->n_tokens)
            return kp_fail(err, KP_EINVAL, "token index %zu exceeds the request's %zu tokens",
                           tokens->token_index, tokens->n_tokens);
        dv.token_index = tokens->token_index;
        dv.token_byte = tokens->token_byte;
        dv.reused_bytes = tokens->token_byte;
    }
    if (tokens && tokens->n_tokens)
        dv.percent_recomputed = 100.0 * (double)(tokens->n_tokens - tokens->token_index) /
                                (double)tokens->n_tokens;
    else if (request_len)
        dv.percent_recomputed =
            100.0 * (double)(request_len - dv.reused_bytes) / (double)request_len;
    *out = dv;
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* JSON around the divergence                                          */

#define JSON_MAX_DEPTH 256
#define JSON_SCAN_BUDGET ((size_t)16 << 20) /* bytes scanned looking for brackets */

/* s[p] is '{' or '['; returns the end (exclusive) of its bracket match,
 * skipping JSON strings, or 0 when it is unbalanced, mismatched, or deeper
 * than JSON_MAX_DEPTH. *scanned grows by the bytes looked at. */
static size_t bracket_end(const char *s, size_t n, size_t p, size_t *scanned) {
    char expect[JSON_MAX_DEPTH];
    size_t top = 0;
    bool in_str = false;
    for (size_t i = p; i < n; i++) {
        char ch = s[i];
        (*scanned)++;
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = false;
            continue;
        }
        if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            if (top == JSON_MAX_DEPTH) return 0;
            expect[top++] = ch == '{' ? '}' : ']';
        } else if (ch == '}' || ch == ']') {
            if (top == 0 || expect[top - 1] != ch) return 0;
            if (--top == 0) return i + 1;
        }
    }
    return 0;
}

static json_t *parse_region(const char *s, size_t start, size_t end) {
    json_error_t jerr;
    return json_loadb(s + start, end - start, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
}

/* Does request[d] lie inside a bracketed region that parses as JSON? */
static bool inside_json(const char *r, size_t rlen, size_t d) {
    size_t scanned = 0;
    for (size_t p = d; p-- > 0;) {
        if (r[p] != '{' && r[p] != '[') continue;
        if (scanned > JSON_SCAN_BUDGET) break;
        size_t end = bracket_end(r, rlen, p, &scanned);
        if (end <= d) continue;
        json_t *v = parse_region(r, p, end);
        if (v) {
            json_decref(v);
            return true;
        }
    }
    return false;
}

/* Two object key sequences in insertion order: equal? */
static bool same_key_order(json_t *a, json_t *b) {
    void *ia = json_object_iter(a), *ib = json_object_iter(b);
    while (ia && ib) {
        size_t la = json_object_iter_key_len(ia), lb = json_object_iter_key_len(ib);
        if (la != lb || memcmp(json_object_iter_key(ia), json_object_iter_key(ib), la) != 0)
            return false;
        ia = json_object_iter_next(a, ia);
        ib = json_object_iter_next(b, ib);
    }
    return !ia && !ib;
}

static void sb_keys(sbuf *b, json_t *obj) {
    size_t k = 0;
    for (void *it = json_object_iter(obj); it; it = json_object_iter_next(obj, it), k++) {
        if (k == 4) {
            sb_puts(b, ", ...");
            break;
        }
        if (k) sb_puts(b, ", ");
        const char *key = json_object_iter_key(it);
        size_t len = json_object_iter_key_len(it);
        sb_excerpt(b, key, len, 0, len, 24);
    }
}

/* Given json_equal(a, b), finds the first object (depth-first, in a's key
 * order) whose keys come in another order; appends its path below "$" to
 * path (".key", "[i]") and returns the two objects through *oa, *ob. */
static bool find_reordered(json_t *a, json_t *b, sbuf *path, json_t **oa, json_t **ob) {
    size_t mark = path->len;
    if (json_is_object(a) && json_is_object(b)) {
        if (!same_key_order(a, b)) {
            *oa = a;
            *ob = b;
            return true;
        }
        for (void *it = json_object_iter(a); it; it = json_object_iter_next(a, it)) {
            const char *key = json_object_iter_key(it);
            size_t klen = json_object_iter_key_len(it);
            json_t *vb = json_object_getn(b, key, klen);
            if (!vb) continue;
            sb_puts(path, ".");
            sb_escaped(path, key, klen, 0, klen, 24);
            if (find_reordered(json_object_iter_value(it), vb, path, oa, ob)) return true;
            sb_rewind(path, mark);
        }
    } else if (json_is_array(a) && json_is_array(b)) {
        for (size_t i = 0; i < json_array_size(a) && i < json_array_size(b); i++) {
            sb_printf(path, "[%zu]", i);
            if (find_reordered(json_array_get(a, i), json_array_get(b, i), path, oa, ob))
                return true;
            sb_rewind(path, mark);
        }
    }
    return false;
}

/* Step 1: the innermost bracketed region enclosing d in both texts that
 * parses in both decides. Writes the detail body on success. */
static bool check_reordered_json(const char *c, size_t clen, const char *r, size_t rlen, size_t d,
                                 sbuf *detail) {
    size_t scanned = 0;
    for (size_t p = d; p-- > 0;) {
        if (c[p] != '{' && c[p] != '[') continue;
        if (scanned > JSON_SCAN_BUDGET) break;
        size_t ec = bracket_end(c, clen, p, &scanned);
        if (ec <= d) continue;
        size_t er = bracket_end(r, rlen, p, &scanned);
        if (er <= d) continue;
        json_t *vc = parse_region(c, p, ec);
        json_t *vr = vc ? parse_region(r, p, er) : NULL;
        if (!vc || !vr) {
            json_decref(vc);
            json_decref(vr);
            continue;
        }
        bool found = false;
        if (json_equal(vc, vr)) {
            char path_buf[128];
            sbuf path;
            sb_init(&path, path_buf, sizeof path_buf);
            sb_puts(&path, "$");
            json_t *oc = NULL, *orq = NULL;
            if (find_reordered(vc, vr, &path, &oc, &orq)) {
                found = true;
                sb_puts(detail, "keys ");
                sb_keys(detail, oc);
                sb_puts(detail, " -> ");
                sb_keys(detail, orq);
                if (path.len > 1) sb_printf(detail, " in %s", path_buf);
            }
        }
        json_decref(vc);
        json_decref(vr);
        return found;
    }
    return false;
}

/* ------------------------------------------------------------------ */
/* Whitespace                                                          */

#define WS_AGREE_BYTES 32

static bool check_whitespace(const char *c, size_t clen, const char *r, size_t rlen, size_t d,
                             sbuf *detail) {
    /* (the loop below would fail too; this says what is looked for) */
    if (!is_ws(at(c, clen, d)) && !is_ws(at(r, rlen, d))) return false;
    size_t i = d, j = d, agreed = 0;
    for (;;) {
        while (i < clen && is_ws((unsigned char)c[i])) i++;
        while (j < rlen && is_ws((unsigned char)r[j])) j++;
        if (i == clen || j == rlen || agreed == WS_AGREE_BYTES) break;
        if (c[i] != r[j]) return false;
        i++, j++, agreed++;
    }
    /* The whitespace runs at d, including their shared beginning. */
    size_t s = d;
    while (s > 0 && is_ws((unsigned char)c[s - 1])) s--;
    size_t ec = d, er = d;
    while (ec < clen && is_ws((unsigned char)c[ec])) ec++;
    while (er < rlen && is_ws((unsigned char)r[er])) er++;
    bool crc = memchr(c + s, '\r', ec - s) != NULL, crr = memchr(r + s, '\r', er - s) != NULL;
    if (crc != crr) sb_puts(detail, "CRLF vs LF, ");
    sb_excerpt(detail, c, clen, s, ec, 16);
    sb_puts(detail, " -> ");
    sb_excerpt(detail, r, rlen, s, er, 16);
    return true;
}

/* ------------------------------------------------------------------ */
/* Insertions and rewrites                                             */

#define INSERT_MIN_TAIL 8      /* bytes of cached text that must follow an insertion */
#define INSERT_MID_LINE_MIN 32 /* bytes a mid-line insertion must have */
#define REWRITE_MIN_TAIL 32  /* bytes of cached text that must follow a rewrite */
#define REWRITE_MAX_LINES 512
#define REWRITE_SCAN_BUDGET ((size_t)64 << 20) /* request bytes searched, in all */

static size_t count_lines(const char *s, size_t start, size_t end) {
    size_t k = 0;
    for (size_t i = start; i < end; i++) k += s[i] == '\n';
    return k;
}

static size_t line_start(const char *s, size_t d) {
    while (d > 0 && s[d - 1] != '\n') d--;
    return d;
}

/* Step 3: text put in front of cached text that follows intact, either at
 * the start of d's line, or mid-line when the insertion is a whole element
 * (>= INSERT_MID_LINE_MIN bytes; a few inserted words are an edit). A
 * mid-line insertion is slid left over the bytes it repeats, so that
 * `[{"name":"` + `search",...},{"name":"` reads as `{"name":"search",...},`. */
static bool check_insertion(const char *c, size_t clen, const char *r, size_t rlen, size_t d,
                            sbuf *detail) {
    size_t d0 = line_start(r, d);
    size_t from = 0, q = 0;
    if (clen - d0 >= INSERT_MIN_TAIL && rlen > d0 + 1) {
        const char *hit = memmem(r + d0 + 1, rlen - d0 - 1, c + d0, clen - d0);
        if (hit) {
            from = d0;
            q = (size_t)(hit - r);
        }
    }
    /* mid-line: only a whole element of JSON (words inserted into prose, however
     * many, are an edit of that line) */
    if (!q && d > d0 && clen - d >= INSERT_MIN_TAIL && rlen > d + INSERT_MID_LINE_MIN &&
        inside_json(r, rlen, d)) {
        const char *hit = memmem(r + d + INSERT_MID_LINE_MIN, rlen - d - INSERT_MID_LINE_MIN,
                                 c + d, clen - d);
        if (hit) {
            from = d;
            q = (size_t)(hit - r);
            while (from > d0 && r[from - 1] == r[q - 1]) from--, q--;
        }
    }
    if (!q) return false;
    sb_printf(detail, "%zu bytes (", q - from);
    sb_excerpt(detail, r, rlen, from, q, 40);
    sb_puts(detail, ") inserted before cached text that follows intact");
    return true;
}

/* Step 5. */
static bool check_rewrite(const char *c, size_t clen, const char *r, size_t rlen, size_t d,
                          size_t line, sbuf *detail) {
    size_t d0 = line_start(r, d);
    size_t tried = 0, searched = 0;
    for (size_t e = d0; e < clen && tried < REWRITE_MAX_LINES; e++) {
        if (c[e] != '\n') continue;
        size_t start = e + 1;
        tried++;
        if (clen - start < REWRITE_MIN_TAIL || searched > REWRITE_SCAN_BUDGET) return false;
        searched += rlen - d0;
        const char *hit = memmem(r + d0, rlen - d0, c + start, clen - start);
        if (!hit) continue;
        size_t q = (size_t)(hit - r);
        size_t lines_old = count_lines(c, d0, start);
        if (lines_old < 2) return false; /* one line rewritten, into however many: an edit */
        size_t last_old = line + lines_old - 1;
        sb_printf(detail, "lines %zu-%zu (%zu bytes) ", line, last_old, start - d0);
        if (q == d0) {
            sb_puts(detail, "removed");
        } else {
            sb_printf(detail, "replaced by %zu bytes (", q - d0);
            sb_excerpt(detail, r, rlen, d0, q, 40);
            sb_puts(detail, ")");
        }
        sb_printf(detail, " before cached text from line %zu that follows intact", last_old + 1);
        return true;
    }
    return false;
}

/* ------------------------------------------------------------------ */
/* A new conversation after a shared opening                           */

#define NEW_PREFIX_MAX 256 /* bytes a "short start" may have */
#define RESUME_MIN 16      /* bytes of cached text that must resume for an edit */

/* Step 6: the texts share a short start that ends where a line or a
 * template's markup ends ("<|im_start|>user\n", "[INST] "), and nothing of
 * the cached text past d resumes in the request: the request is another
 * text after a shared opening, not an edit of the cached one. The tails
 * c[x..clen) found in r[d..) get shorter as x grows, so the longest is found
 * by bisection; it must be >= RESUME_MIN bytes and at least as long as the
 * cached text it skips, c[d..x) (the template's closing markup alone, such
 * as "<|im_start|>assistant\n", does not make an edit). */
static bool check_new_prefix(const char *c, size_t clen, const char *r, size_t rlen, size_t d, sbuf *detail) {
    if (d == 0 || d > NEW_PREFIX_MAX) return false;
    size_t w = d; /* the start of the word d is in ("What" and "Write" share a 'W') */
    while (w > 0 && d - w < 24 && is_word((unsigned char)r[w - 1])) w--;
    size_t b = w;
    while (b > 0 && r[b - 1] == ' ') b--;
    /* (w == 0: the texts share part of their first word only, an edit of it) */
    if (w == 0 || !(r[w - 1] == '\n' || (b > 0 && (r[b - 1] == '>' || r[b - 1] == ']')))) return false;
    if (clen - d >= RESUME_MIN && rlen > d) {
        size_t lo = d, hi = clen - RESUME_MIN + 1; /* the first x whose tail is found, or hi */
        while (lo < hi) {
            size_t x = lo + (hi - lo) / 2;
            if (memmem(r + d, rlen - d, c + x, clen - x)) hi = x;
            else lo = x + 1;
        }
        if (lo <= clen - RESUME_MIN && clen - lo >= lo - d) return false; /* the cached text resumes */
    }
    sb_puts(detail, "only the opening ");
    sb_excerpt(detail, r, rlen, 0, w, 40);
    sb_printf(detail, " (%zu bytes) is shared, then ", w);
    sb_excerpt(detail, r, rlen, w, rlen, 40);
    sb_puts(detail, " instead of ");
    sb_excerpt(detail, c, clen, w, clen, 40);
    return true;
}

/* ------------------------------------------------------------------ */
/* Dates and times                                                     */
/*
 * Each matcher takes the text and a start index and returns the end index
 * (exclusive) of the longest form it recognises there, or 0.
 *
 *   iso      2026-11-28, 2026/11/28, + [T ]09:14[:05[.123]] + [Z|+01:00|...]
 *   numeric  28/11/2026, 11/28/26, 28.11.2026 [+ time]
 *   clock    10:02, 10:02:33, 9:14 am, 10:02 PM UTC, 10:02:33+0100
 *   words    Monday; Monday, November 29; Nov 29, 2026; 29th of November;
 *            Sat, 28 Nov 2026 09:14:00 +0000 (RFC 2822); November 2026
 *   unix     10 or 13 digits starting with 1 (2001..2033), [.fraction]
 *   cjk      2026年11月28日 [time]
 */

/* Reads min..max digits at i (and fails when more digits follow); returns
 * the count (0: no match) and the value in *v. */
static size_t read_digits(const char *s, size_t n, size_t i, size_t min, size_t max,
                          uint64_t *v) {
    size_t k = 0;
    uint64_t val = 0;
    while (i + k < n && k < max && is_digit((unsigned char)s[i + k])) {
        val = val * 10 + (uint64_t)(s[i + k] - '0');
        k++;
    }
    if (k < min || is_digit(at(s, n, i + k))) return 0;
    if (v) *v = val;
    return k;
}

static size_t m_clock(const char *s, size_t n, size_t i) {
    uint64_t h, m, sec;
    size_t k = read_digits(s, n, i, 1, 2, &h);
    if (!k || h > 24 || at(s, n, i + k) != ':') return 0;
    size_t j = i + k + 1;
    if (read_digits(s, n, j, 2, 2, &m) != 2 || m > 59) return 0;
    j += 2;
    if (at(s, n, j) == ':' && read_digits(s, n, j + 1, 2, 2, &sec) == 2 && sec <= 60) {
        j += 3;
        if (at(s, n, j) == '.' && is_digit(at(s, n, j + 1))) {
            j++;
            while (is_digit(at(s, n, j))) j++;
        }
    }
    return j;
}

static bool starts(const char *s, size_t n, size_t i, const char *lit) {
    size_t len = strlen(lit);
    return i <= n && n - i >= len && memcmp(s + i, lit, len) == 0;
}

/* After a clock ending at j: an optional " am"/"PM"/"a.m.", then an optional
 * zone: "Z", " UTC"/" GMT" (+ offset), " PST"/" CEST" (capitals ending in
 * T), " +0000", "+01:00". */
static size_t m_ampm_zone(const char *s, size_t n, size_t j) {
    size_t k = j + (at(s, n, j) == ' ');
    unsigned char a = at(s, n, k) | 0x20;
    if (a == 'a' || a == 'p') {
        if ((at(s, n, k + 1) | 0x20) == 'm' && !is_alpha(at(s, n, k + 2))) j = k + 2;
        else if (at(s, n, k + 1) == '.' && (at(s, n, k + 2) | 0x20) == 'm' && at(s, n, k + 3) == '.')
            j = k + 4;
    }
    if (at(s, n, j) == 'Z' && !is_alnum(at(s, n, j + 1))) return j + 1;
    k = j + (at(s, n, j) == ' ');
    if ((starts(s, n, k, "UTC") || starts(s, n, k, "GMT")) && !is_alpha(at(s, n, k + 3))) {
        j = k + 3;
        k = j;
    } else if (k > j) {
        size_t caps = 0;
        while (caps < 4 && is_upper(at(s, n, k + caps))) caps++;
        if (caps >= 3 && at(s, n, k + caps - 1) == 'T' && !is_alpha(at(s, n, k + caps)))
            return k + caps;
    }
    unsigned char sign = at(s, n, k);
    if (sign == '+' || sign == '-') {
        size_t hk = read_digits(s, n, k + 1, 2, 4, NULL);
        if (hk == 2) {
            size_t e = k + 3;
            if (at(s, n, e) == ':' && read_digits(s, n, e + 1, 2, 2, NULL) == 2) e += 3;
            return e;
        }
        if (hk == 4) return k + 5;
    }
    return j;
}

static size_t m_time(const char *s, size_t n, size_t i) {
    size_t e = m_clock(s, n, i);
    return e ? m_ampm_zone(s, n, e) : 0;
}

/* ", " / " " / "T" / ", at " and a time after a date ending at e; e if none. */
static size_t m_time_after(const char *s, size_t n, size_t e, bool allow_t) {
    size_t t = e;
    if (allow_t && at(s, n, t) == 'T') {
        size_t te = m_time(s, n, t + 1);
        return te ? te : e;
    }
    if (at(s, n, t) == ',') t++;
    if (at(s, n, t) != ' ') return e;
    t++;
    if (starts(s, n, t, "at ")) t += 3;
    size_t te = m_time(s, n, t);
    return te ? te : e;
}

static size_t m_iso(const char *s, size_t n, size_t i) {
    uint64_t y, mo, da;
    if (read_digits(s, n, i, 4, 4, &y) != 4) return 0;
    unsigned char sep = at(s, n, i + 4);
    if (sep != '-' && sep != '/') return 0;
    if (read_digits(s, n, i + 5, 2, 2, &mo) != 2 || mo < 1 || mo > 12) return 0;
    if (at(s, n, i + 7) != sep) return 0;
    if (read_digits(s, n, i + 8, 2, 2, &da) != 2 || da < 1 || da > 31) return 0;
    (void)y;
    return m_time_after(s, n, i + 10, true);
}

static size_t m_numeric_date(const char *s, size_t n, size_t i) {
    uint64_t a, b, y;
    size_t ka = read_digits(s, n, i, 1, 2, &a);
    if (!ka) return 0;
    unsigned char sep = at(s, n, i + ka);
    if (sep != '/' && sep != '.') return 0;
    size_t kb = read_digits(s, n, i + ka + 1, 1, 2, &b);
    if (!kb || at(s, n, i + ka + 1 + kb) != sep) return 0;
    size_t yi = i + ka + 1 + kb + 1;
    size_t ky = read_digits(s, n, yi, 2, 4, &y);
    if (ky != 4 && !(ky == 2 && sep == '/')) return 0;
    if (a < 1 || b < 1 || a > 31 || b > 31 || (a > 12 && b > 12)) return 0;
    return m_time_after(s, n, yi + ky, false);
}

static const char *const weekday_names[] = {"monday", "tuesday", "wednesday", "thursday",
                                            "friday", "saturday", "sunday"};
static const char *const weekday_abbrevs[] = {"Thurs", "Tues", "Thur", "Mon", "Tue", "Wed",
                                              "Thu",   "Fri",  "Sat",  "Sun"};
static const char *const month_names[] = {"january", "february", "march",     "april",
                                          "may",     "june",     "july",      "august",
                                          "september", "october", "november", "december"};
static const char *const month_abbrevs[] = {"Sept", "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul",  "Aug", "Sep", "Oct", "Nov", "Dec"};

/* Length of the first name of `names` at s[i] followed by a non-letter: case
 * folded when fold (full names), else as written or in capitals. */
static size_t name_at(const char *s, size_t n, size_t i, const char *const *names, size_t count,
                      bool fold) {
    for (size_t k = 0; k < count; k++) {
        size_t len = strlen(names[k]);
        if (i + len > n || is_alpha(at(s, n, i + len))) continue;
        bool same = true, upper = true;
        for (size_t m = 0; m < len && (same || upper); m++) {
            unsigned char ch = (unsigned char)s[i + m], want = (unsigned char)names[k][m];
            if (fold) ch |= 0x20;
            if (ch != want) same = false;
            if ((unsigned char)s[i + m] != (is_lower(want) ? want - 32 : want)) upper = false;
        }
        if (same || (!fold && upper)) return len;
    }
    return 0;
}

static size_t month_at(const char *s, size_t n, size_t i) {
    size_t k = name_at(s, n, i, month_names, 12, true);
    if (k) return k;
    k = name_at(s, n, i, month_abbrevs, 13, false);
    if (k && at(s, n, i + k) == '.') k++;
    return k;
}

static size_t skip_ordinal(const char *s, size_t n, size_t e) {
    static const char *const suffixes[] = {"st", "nd", "rd", "th"};
    for (int k = 0; k < 4; k++)
        if ((at(s, n, e) | 0x20) == suffixes[k][0] && (at(s, n, e + 1) | 0x20) == suffixes[k][1] &&
            !is_alpha(at(s, n, e + 2)))
            return e + 2;
    return e;
}

/* [","] " " YYYY after e, or e. */
static size_t m_year_after(const char *s, size_t n, size_t e) {
    size_t y = e + (at(s, n, e) == ',');
    if (at(s, n, y) != ' ') return e;
    return read_digits(s, n, y + 1, 4, 4, NULL) ? y + 5 : e;
}

/* "November 29[th][, 2026]", "Nov. 2026", "29[th] [of ]November[ 2026]". */
static size_t m_date_words(const char *s, size_t n, size_t j) {
    uint64_t v;
    size_t k = month_at(s, n, j);
    if (k) {
        size_t m = j + k;
        if (at(s, n, m) != ' ') return 0;
        size_t dk = read_digits(s, n, m + 1, 1, 4, &v);
        if (dk == 4) return m + 5;
        if (!dk || dk > 2 || v < 1 || v > 31) return 0;
        return m_year_after(s, n, skip_ordinal(s, n, m + 1 + dk));
    }
    size_t dk = read_digits(s, n, j, 1, 2, &v);
    if (!dk || v < 1 || v > 31) return 0;
    size_t e = skip_ordinal(s, n, j + dk);
    if (at(s, n, e) != ' ') return 0;
    e++;
    if (starts(s, n, e, "of ")) e += 3;
    k = month_at(s, n, e);
    return k ? m_year_after(s, n, e + k) : 0;
}

static size_t m_words(const char *s, size_t n, size_t i) {
    size_t j = i, k;
    bool weekday = false, abbrev = false;
    if ((k = name_at(s, n, j, weekday_names, 7, true))) {
        weekday = true;
    } else if ((k = name_at(s, n, j, weekday_abbrevs, 10, false))) {
        weekday = abbrev = true;
        if (at(s, n, j + k) == '.') k++;
    }
    j += k;
    size_t weekday_end = j;
    if (weekday) {
        if (at(s, n, j) == ',') j++;
        if (at(s, n, j) == ' ') j++;
    }
    size_t e = m_date_words(s, n, j);
    if (!e) return weekday && !abbrev ? m_time_after(s, n, weekday_end, false) : 0;
    return m_time_after(s, n, e, false);
}

static size_t m_unix(const char *s, size_t n, size_t i) {
    size_t k = 0;
    while (is_digit(at(s, n, i + k))) k++;
    if ((k != 10 && k != 13) || s[i] != '1') return 0;
    size_t e = i + k;
    if (at(s, n, e) == '.' && is_digit(at(s, n, e + 1))) {
        e++;
        while (is_digit(at(s, n, e))) e++;
    }
    return is_word(at(s, n, e)) ? 0 : e;
}

/* 2026年11月28日 [time]. */
static size_t m_cjk(const char *s, size_t n, size_t i) {
    static const char year[] = "\xE5\xB9\xB4", month[] = "\xE6\x9C\x88", day[] = "\xE6\x97\xA5";
    uint64_t mo, da;
    if (read_digits(s, n, i, 4, 4, NULL) != 4 || !starts(s, n, i + 4, year)) return 0;
    size_t j = i + 7, k = read_digits(s, n, j, 1, 2, &mo);
    if (!k || mo < 1 || mo > 12 || !starts(s, n, j + k, month)) return 0;
    j += k + 3;
    k = read_digits(s, n, j, 1, 2, &da);
    if (!k || da < 1 || da > 31 || !starts(s, n, j + k, day)) return 0;
    j += k + 3;
    size_t t = m_time(s, n, j + (at(s, n, j) == ' '));
    return t ? t : j;
}

/* End of the longest datetime starting at i, or 0. */
static size_t match_datetime(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t (*const matchers[])(const char *, size_t, size_t) = {m_iso, m_numeric_date, m_time,
                                                                m_words, m_unix, m_cjk};
    size_t best = 0;
    for (size_t k = 0; k < sizeof matchers / sizeof matchers[0]; k++) {
        size_t e = matchers[k](s, n, i);
        if (e > best) best = e;
    }
    return best;
}

/* ------------------------------------------------------------------ */
/* Fields spanning the divergence                                      */

#define FIELD_LOOKBACK 64

typedef size_t (*field_matcher)(const char *s, size_t n, size_t start);

/* Finds the earliest word start a in [d - FIELD_LOOKBACK, d] where `match`
 * recognises a field in both texts that reaches d in both and passes it in
 * at least one. Sets a and the two ends. */
static bool field_at(const char *c, size_t clen, const char *r, size_t rlen, size_t d,
                     field_matcher match, size_t *a_out, size_t *ec_out, size_t *er_out) {
    size_t lo = d > FIELD_LOOKBACK ? d - FIELD_LOOKBACK : 0;
    for (size_t a = lo; a <= d; a++) {
        if (a > 0 && is_word((unsigned char)c[a - 1])) continue;
        size_t ec = match(c, clen, a), er = match(r, rlen, a);
        if (!ec || !er || ec < d || er < d || (ec == d && er == d)) continue;
        *a_out = a;
        *ec_out = ec;
        *er_out = er;
        return true;
    }
    return false;
}

/* A UUID (8-4-4-4-12 hex) anywhere in t[0..n). */
static bool has_uuid(const char *t, size_t n) {
    static const int groups[] = {8, 4, 4, 4, 12};
    for (size_t s = 0; s + 36 <= n; s++) {
        size_t i = s;
        bool ok = true;
        for (int g = 0; g < 5 && ok; g++) {
            for (int k = 0; k < groups[g]; k++, i++)
                if (!is_hex((unsigned char)t[i])) ok = false;
            if (g < 4 && ok && t[i++] != '-') ok = false;
        }
        if (ok) return true;
    }
    return false;
}

/* UUIDs, hex ids, prefixed ids (req_AbC123), base64-like tokens. */
static bool looks_like_id(const char *t, size_t n) {
    size_t digits = 0, upper = 0, lower = 0, hex = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        digits += is_digit(ch);
        upper += is_upper(ch);
        lower += is_lower(ch);
        hex += is_hex(ch);
    }
    if (n >= 36 && has_uuid(t, n)) return true;
    if (n >= 8 && hex == n && digits < n) return true;
    /* prefix_rest: 2-16 letters, '_' or '-', then >= 6 id characters with a
     * digit or mixed case */
    size_t p = 0;
    while (p < n && p <= 16 && is_alpha((unsigned char)t[p])) p++;
    if (p >= 2 && p <= 16 && p < n && (t[p] == '_' || t[p] == '-') && n - p - 1 >= 6) {
        size_t rd = 0, ru = 0, rl = 0;
        for (size_t i = p + 1; i < n; i++) {
            rd += is_digit((unsigned char)t[i]);
            ru += is_upper((unsigned char)t[i]);
            rl += is_lower((unsigned char)t[i]);
        }
        if (rd || (ru && rl)) return true;
    }
    if (n >= 12 && digits && upper && lower) return true;
    if (n >= 16 && digits && (upper || lower)) return true;
    return false;
}

static bool is_id_char(unsigned char ch) { return is_alnum(ch) || ch == '_' || ch == '-'; }
static bool is_b64_char(unsigned char ch) { return is_id_char(ch) || ch == '+' || ch == '/'; }

/* End of a token from i: characters of the alphabet, then (base64 only) '='
 * padding. */
static size_t token_end(const char *s, size_t n, size_t i, bool b64) {
    bool (*in)(unsigned char) = b64 ? is_b64_char : is_id_char;
    while (i < n && in((unsigned char)s[i])) i++;
    if (b64)
        while (i < n && s[i] == '=') i++;
    return i;
}

/* The identifier spanning d: the token through d, cut the same way in both
 * texts, must look like an id in both. Tried with the narrow alphabet
 * (letters, digits, '_', '-') and then with base64's ('+', '/', '='
 * padding). */
static bool id_span(const char *c, size_t clen, const char *r, size_t rlen, size_t d, bool b64,
                    size_t *a_out, size_t *ec_out, size_t *er_out) {
    bool (*in)(unsigned char) = b64 ? is_b64_char : is_id_char;
    size_t a = d;
    while (a > 0 && in((unsigned char)c[a - 1])) a--;
    size_t ec = token_end(c, clen, d, b64), er = token_end(r, rlen, d, b64);
    if (a < d && b64) { /* '=' padding ends a token: the token cannot run through it */
        for (size_t i = a; i < d; i++)
            if (c[i] == '=') return false;
    }
    if ((ec == d && er == d) || ec == a || er == a) return false;
    if (!looks_like_id(c + a, ec - a) || !looks_like_id(r + a, er - a)) return false;
    *a_out = a;
    *ec_out = ec;
    *er_out = er;
    return true;
}

/* A number through d: digits, with '.' or ',' between digits. */
static size_t number_end(const char *s, size_t n, size_t i) {
    size_t e = i;
    while (e < n) {
        unsigned char ch = (unsigned char)s[e];
        if (is_digit(ch)) e++;
        else if ((ch == '.' || ch == ',') && e > i && is_digit(at(s, n, e + 1))) e++;
        else break;
    }
    return e;
}

static bool number_span(const char *c, size_t clen, const char *r, size_t rlen, size_t d,
                        size_t *a_out, size_t *ec_out, size_t *er_out) {
    size_t a = d;
    while (a > 0) {
        if (is_digit((unsigned char)c[a - 1])) {
            a--;
        } else if (a >= 2 && (c[a - 1] == '.' || c[a - 1] == ',') &&
                   is_digit((unsigned char)c[a - 2]) && is_digit(at(c, clen, a)) &&
                   (a < d || is_digit(at(r, rlen, a)))) {
            a--;
        } else {
            break;
        }
    }
    size_t ec = number_end(c, clen, a), er = number_end(r, rlen, a);
    if (!is_digit(at(c, clen, a)) || !is_digit(at(r, rlen, a))) return false;
    if (ec < d || er < d || (ec == d && er == d)) return false;
    *a_out = a;
    *ec_out = ec;
    *er_out = er;
    return true;
}

static void sb_change(sbuf *b, const char *c, size_t clen, const char *r, size_t rlen, size_t a,
                      size_t ec, size_t er) {
    sb_excerpt(b, c, clen, a, ec, 40);
    sb_puts(b, " -> ");
    sb_excerpt(b, r, rlen, a, er, 40);
}

/* ------------------------------------------------------------------ */
/* Classification                                                      */

/* Clients known to put a value that changes per session into their
 * prompt: a marker of the line it is on, what a finding calls it (added
 * to the detail), and the fix the advice names instead of the cause's. */
static const struct {
    const char *marker, *label, *fix;
} KNOWN_CLIENTS[] = {
    {"x-anthropic-billing-header:", "Claude Code's per-session billing header",
     "start kvpin without --keep-volatile (it then leaves this header out), or set "
     "CLAUDE_CODE_ATTRIBUTION_HEADER=0 in Claude Code's environment"},
};

/* The known client whose marker is on the line of r holding byte d, or -1. */
static int known_client(const char *r, size_t rlen, size_t d) {
    size_t a = line_start(r, d), e = d;
    while (e < rlen && r[e] != '\n') e++;
    for (size_t k = 0; k < sizeof KNOWN_CLIENTS / sizeof *KNOWN_CLIENTS; k++) {
        size_t ml = strlen(KNOWN_CLIENTS[k].marker);
        for (size_t i = a; i + ml <= e; i++)
            if (!memcmp(r + i, KNOWN_CLIENTS[k].marker, ml)) return (int)k;
    }
    return -1;
}

kp_status kp_doctor_classify(const char *cached, size_t cached_len, const char *request,
                          size_t request_len, size_t diverge_byte, kp_doctor_cache_state state,
                          kp_doctor_finding *out, kp_error *err) {
    if (!out || (!cached && cached_len) || (!request && request_len))
        return kp_fail(err, KP_EINVAL, "kp_doctor_classify: NULL text or output");
    if (state != KP_DOCTOR_CACHE_TEXT && state != KP_DOCTOR_CACHE_NOTHING &&
        state != KP_DOCTOR_CACHE_EVICTED)
        return kp_fail(err, KP_EINVAL, "kp_doctor_classify: bad cache state %d", (int)state);
    const char *c = cached, *r = request;
    size_t clen = cached_len, rlen = request_len;
    if (state == KP_DOCTOR_CACHE_NOTHING) clen = 0;
    size_t n = clen < rlen ? clen : rlen;
    if (state != KP_DOCTOR_CACHE_NOTHING) {
        size_t both = cached_len < rlen ? cached_len : rlen;
        if (diverge_byte > both)
            return kp_fail(err, KP_EINVAL,
                           "divergence byte %zu is past the end of a text (cached %zu, request %zu bytes)",
                           diverge_byte, cached_len, rlen);
        if (diverge_byte && memcmp(c, r, diverge_byte) != 0)
            return kp_fail(err, KP_EINVAL, "the texts already differ before byte %zu", diverge_byte);
    } else if (diverge_byte > 0) {
        return kp_fail(err, KP_EINVAL, "divergence byte %zu with nothing cached", diverge_byte);
    }
    size_t raw = common_prefix(c, clen, r, rlen, diverge_byte);
    bool full = raw == n;
    size_t d = snap_divergence(c, clen, r, rlen, raw);

    kp_doctor_finding f;
    memset(&f, 0, sizeof f);
    f.byte = d;
    f.line = 1 + count_lines(r, 0, d);
    size_t ls = line_start(r, d);
    f.column = 1;
    for (size_t i = ls; i < d; i++) f.column += !is_cont((unsigned char)r[i]);
    f.in_json = inside_json(r, rlen, d);

    sbuf body;
    char body_buf[KP_DOCTOR_DETAIL_MAX];
    sb_init(&body, body_buf, sizeof body_buf);

    kp_doctor_cause cause;
    size_t a, ec, er;
    if (state == KP_DOCTOR_CACHE_NOTHING || clen == 0) {
        cause = KP_DOCTOR_CAUSE_COLD;
        sb_puts(&body, "nothing was cached");
    } else if (state == KP_DOCTOR_CACHE_EVICTED) {
        cause = KP_DOCTOR_CAUSE_EVICTED;
        sb_printf(&body, "the matching prefix of %zu bytes was cached and then evicted", d);
    } else if (full) {
        cause = KP_DOCTOR_CAUSE_HIT;
        if (clen == rlen) sb_printf(&body, "the request equals the cached text (%zu bytes)", clen);
        else if (clen < rlen)
            sb_printf(&body, "the request starts with the whole cached text (%zu bytes)", clen);
        else sb_printf(&body, "the cached text covers the whole request (%zu bytes)", rlen);
    } else if (check_reordered_json(c, clen, r, rlen, d, &body)) {
        cause = KP_DOCTOR_CAUSE_REORDERED_JSON;
    } else if (check_whitespace(c, clen, r, rlen, d, &body)) {
        cause = KP_DOCTOR_CAUSE_WHITESPACE;
    } else if (check_insertion(c, clen, r, rlen, d, &body)) {
        cause = KP_DOCTOR_CAUSE_INSERTED_AT_FRONT;
    } else if (field_at(c, clen, r, rlen, d, match_datetime, &a, &ec, &er)) {
        cause = KP_DOCTOR_CAUSE_TIMESTAMP;
        sb_change(&body, c, clen, r, rlen, a, ec, er);
    } else if (id_span(c, clen, r, rlen, d, false, &a, &ec, &er) ||
               id_span(c, clen, r, rlen, d, true, &a, &ec, &er)) {
        cause = KP_DOCTOR_CAUSE_IDENTIFIER;
        sb_change(&body, c, clen, r, rlen, a, ec, er);
    } else if (number_span(c, clen, r, rlen, d, &a, &ec, &er)) {
        cause = KP_DOCTOR_CAUSE_COUNTER;
        sb_change(&body, c, clen, r, rlen, a, ec, er);
    } else if (check_rewrite(c, clen, r, rlen, d, f.line, &body)) {
        cause = KP_DOCTOR_CAUSE_INSERTED_AT_FRONT;
    } else if (check_new_prefix(c, clen, r, rlen, d, &body)) {
        cause = KP_DOCTOR_CAUSE_NEW_PREFIX;
    } else {
        /* Show the changed word from its start to the end of its line. */
        size_t w = d;
        while (w > 0 && d - w < 24 && is_word((unsigned char)c[w - 1])) w--;
        const char *nlc = memchr(c + d, '\n', clen - d), *nlr = memchr(r + d, '\n', rlen - d);
        cause = d == 0 ? KP_DOCTOR_CAUSE_COLD : KP_DOCTOR_CAUSE_OTHER;
        if (d == 0) sb_puts(&body, "the cached text and the request differ from the first byte (");
        sb_change(&body, c, clen, r, rlen, w, nlc ? (size_t)(nlc - c) : clen,
                  nlr ? (size_t)(nlr - r) : rlen);
        if (d == 0) sb_puts(&body, ")");
    }
    int client = cause == KP_DOCTOR_CAUSE_HIT || cause == KP_DOCTOR_CAUSE_COLD || cause == KP_DOCTOR_CAUSE_EVICTED
                     ? -1
                     : known_client(r, rlen, d);
    if (client >= 0) sb_printf(&body, "; %s", KNOWN_CLIENTS[client].label);
    f.cause = cause;
    sbuf detail;
    sb_init(&detail, f.detail, sizeof f.detail);
    sb_puts(&detail, kp_doctor_cause_name(cause));
    sb_puts(&detail, ": ");
    sb_puts(&detail, body_buf);
    sb_printf(&detail, " on line %zu", f.line);
    *out = f;
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* Advice                                                              */

/* The part of a detail between "<name>: " and " on line N" (when present). */
static void detail_middle(const char *detail, kp_doctor_cause cause, const char **mid, size_t *len) {
    const char *s = detail;
    size_t n = strlen(s);
    const char *name = kp_doctor_cause_name(cause);
    size_t nl = strlen(name);
    if (n > nl + 2 && memcmp(s, name, nl) == 0 && s[nl] == ':' && s[nl + 1] == ' ') {
        s += nl + 2;
        n -= nl + 2;
    }
    size_t e = n;
    while (e > 0 && is_digit((unsigned char)s[e - 1])) e--;
    if (e < n && e >= 9 && memcmp(s + e - 9, " on line ", 9) == 0) n = e - 9;
    *mid = s;
    *len = n;
}

size_t kp_doctor_advice(kp_doctor_cause cause, const char *detail, size_t line,
                     double percent_recomputed, const char *subject, char *out, size_t cap) {
    sbuf b;
    sb_init(&b, out, cap);
    /* Whole percent; never "0%" for a little and never "100%" for almost all. */
    double p = percent_recomputed;
    int pct = !(p > 0) ? 0 : p >= 100 ? 100 : (int)(p + 0.5);
    if (p > 0 && pct == 0) pct = 1;
    if (p < 100 && pct == 100) pct = 99;
    sb_puts(&b, subject ? subject : "the request");
    sb_printf(&b, " re-prefills %d%% of its prompt: ", pct);

    /* "line 3" / "the prompt", and "at line 3" / "in the prompt" */
    char noun[40], prep[48];
    if (line) {
        snprintf(noun, sizeof noun, "line %zu", line);
        snprintf(prep, sizeof prep, "at line %zu", line);
    } else {
        snprintf(noun, sizeof noun, "the prompt");
        snprintf(prep, sizeof prep, "in the prompt");
    }
    const char *fix = NULL;
    switch (cause) {
    case KP_DOCTOR_CAUSE_HIT:
        sb_puts(&b, "it reuses the whole cached prefix and computes only new text");
        fix = "nothing to fix";
        break;
    case KP_DOCTOR_CAUSE_COLD:
        sb_puts(&b, "nothing cached shares its start");
        fix = "send the stable part of the prompt first and keep it byte-identical across "
              "requests so later ones reuse it";
        break;
    case KP_DOCTOR_CAUSE_EVICTED:
        sb_puts(&b, "its prefix");
        if (line) sb_printf(&b, " up to line %zu", line);
        sb_puts(&b, " was cached but has been evicted");
        fix = "raise the KV budget or pin that prefix";
        break;
    case KP_DOCTOR_CAUSE_TIMESTAMP:
        sb_printf(&b, "%s holds a timestamp that changes every turn", noun);
        fix = "move it to the end of the prompt or round it to the day";
        break;
    case KP_DOCTOR_CAUSE_COUNTER:
        sb_printf(&b, "%s holds a number that changes every turn", noun);
        fix = "move it to the end of the prompt or leave it out";
        break;
    case KP_DOCTOR_CAUSE_IDENTIFIER:
        sb_printf(&b, "%s holds an identifier that changes every request", noun);
        fix = "keep ids out of the start of the prompt or move them to the end";
        break;
    case KP_DOCTOR_CAUSE_REORDERED_JSON:
        sb_printf(&b, "the JSON %s has the same keys in another order", prep);
        fix = "serialize JSON with a fixed key order (kvpin canon prints canonical JSON)";
        break;
    case KP_DOCTOR_CAUSE_WHITESPACE:
        sb_printf(&b, "%s differs only in whitespace", noun);
        fix = "normalize line endings, indentation and trailing spaces before sending";
        break;
    case KP_DOCTOR_CAUSE_INSERTED_AT_FRONT:
        sb_printf(&b, "the text in front of cached text changed %s", prep);
        fix = "add new content after the cached prefix, and rewrite or drop old turns rarely "
              "and in large steps";
        break;
    case KP_DOCTOR_CAUSE_RETOKENIZED:
        sb_printf(&b, "the text %s is what was cached, but it was split into other tokens", prep);
        fix = "the cache matches token ids, and a model's answer sent back as text can tokenize "
              "differently from how the model wrote it; where that costs much, send the prompt as "
              "token ids to /v1/completions (return_token_ids gives the answer's own ids)";
        break;
    case KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY:
        sb_printf(&b, "the chat template rewrites an earlier turn %s once a new one follows", prep);
        fix = "each turn then recomputes the previous answer; Qwen 3's template leaves out the "
              "reasoning of earlier answers, so turning thinking off (chat_template_kwargs "
              "enable_thinking false) or a template that keeps earlier turns as written avoids it";
        break;
    case KP_DOCTOR_CAUSE_NEW_PREFIX:
        sb_printf(&b, "it shares only a short start with the cache and is a different conversation from %s on",
                  noun);
        fix = "nothing to fix for a new conversation; requests that should reuse more must start with the same "
              "text (system prompt and tools, byte for byte)";
        break;
    case KP_DOCTOR_CAUSE_WINDOW_EVICTED:
        sb_puts(&b, "its prefix was cached, but the sliding-window layers' K/V of the positions before where it "
                    "matched had been dropped, so reuse resumed earlier");
        fix = "raise --window-budget (without it every cached position keeps that K/V), or pin the prefix";
        break;
    case KP_DOCTOR_CAUSE_RECURRENT_STATE:
        sb_puts(&b, "the model's recurrent layers keep a state that cannot be cut back to a shared prefix, so the "
                    "whole prompt was computed");
        fix = "nothing to fix in the prompt: prefix reuse is off for models with recurrent layers (qwen35)";
        break;
    case KP_DOCTOR_CAUSE_STATE_CHECKPOINT:
        sb_puts(&b, "its prefix was cached, but the model's recurrent state was snapshotted last before where it "
                    "matched, so reuse resumed at that snapshot and the matched tokens after it were computed again");
        fix = "lower --state-every (snapshots closer together), or pin the stable prefix (a pin keeps a snapshot at "
              "its end)";
        break;
    case KP_DOCTOR_CAUSE_OTHER:
        sb_printf(&b, "%s was edited", noun);
        fix = "keep the stable part of the prompt first and put text that changes at the end";
        break;
    default:
        sb_puts(&b, "the cause is unknown");
        return b.need;
    }
    if (detail && *detail) {
        const char *mid;
        size_t mid_len;
        detail_middle(detail, cause, &mid, &mid_len);
        if (mid_len) {
            sb_puts(&b, " (");
            sb_putn(&b, mid, mid_len);
            sb_puts(&b, ")");
        }
    }
    for (size_t k = 0; detail && k < sizeof KNOWN_CLIENTS / sizeof *KNOWN_CLIENTS; k++)
        if (strstr(detail, KNOWN_CLIENTS[k].label)) fix = KNOWN_CLIENTS[k].fix; /* the client's own switch */
    sb_puts(&b, "; ");
    sb_puts(&b, fix);
    return b.need;
}

/* ------------------------------------------------------------------ */
/* Everything at once                                                  */

/* A finding of cause at byte d of the request r (its line, column and
 * JSON context); the detail is the caller's. */
static void finding_at(kp_doctor_finding *f, const char *r, size_t rlen, size_t d, kp_doctor_cause cause) {
    memset(f, 0, sizeof *f);
    f->cause = cause;
    f->byte = d;
    f->line = 1 + count_lines(r, 0, d);
    f->column = 1;
    for (size_t i = line_start(r, d); i < d; i++) f->column += !is_cont((unsigned char)r[i]);
    f->in_json = inside_json(r, rlen, d);
}

/* Whether the tokens part inside text both share (kp_doctor_tokens.token_end),
 * and then the finding at the token's byte. */
static bool retokenized(const char *r, size_t rlen, const kp_doctor_tokens *t, const kp_doctor_divergence *dv,
                        kp_doctor_cache_state state, kp_doctor_finding *f) {
    if (!t || state != KP_DOCTOR_CACHE_TEXT || t->token_end <= t->token_byte || t->token_end > dv->byte ||
        (t->n_tokens && t->token_index >= t->n_tokens))
        return false;
    size_t d = t->token_byte;
    finding_at(f, r, rlen, d, KP_DOCTOR_CAUSE_RETOKENIZED);
    sbuf b;
    sb_init(&b, f->detail, sizeof f->detail);
    sb_printf(&b, "retokenized: token %zu is ", t->token_index);
    sb_excerpt(&b, r, rlen, d, t->token_end, 40);
    if (t->cached_piece_len) {
        sb_puts(&b, " here and ");
        size_t pl = t->cached_piece_len < sizeof t->cached_piece ? t->cached_piece_len : sizeof t->cached_piece;
        sb_excerpt(&b, t->cached_piece, pl, 0, pl, 40);
        sb_puts(&b, " in the cache");
    }
    sb_printf(&b, ", the same text split differently on line %zu", f->line);
    return true;
}

/* Whether the chat layer's hints explain the divergence as the template
 * rewriting an earlier turn, and then the finding at the divergence. */
static bool rewritten(const char *c, size_t clen, const char *r, size_t rlen, const kp_doctor_tokens *t,
                      const kp_doctor_divergence *dv, kp_doctor_cache_state state, kp_doctor_finding *f) {
    if (!t || state != KP_DOCTOR_CACHE_TEXT || dv->full_match) return false;
    size_t d = dv->byte, rb = t->hints.rewrite_byte;
    bool at_rewrite = rb > 0 && d <= rb && rb - d <= 64;
    const char *mark = t->hints.reasoning_open;
    bool lost_reasoning = false;
    if (mark && *mark) { /* the cached answer opens its reasoning here, the request does not */
        size_t ml = strlen(mark), i = d, j = d;
        while (i < clen && (c[i] == ' ' || c[i] == '\n')) i++;
        while (j < rlen && (r[j] == ' ' || r[j] == '\n')) j++;
        lost_reasoning = clen - i >= ml && !memcmp(c + i, mark, ml) && !(rlen - j >= ml && !memcmp(r + j, mark, ml));
    }
    if (!at_rewrite && !lost_reasoning) return false;
    finding_at(f, r, rlen, d, KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY);
    sbuf b;
    sb_init(&b, f->detail, sizeof f->detail);
    sb_puts(&b, "template_rewrites_history: ");
    if (lost_reasoning) {
        sb_puts(&b, "the cached answer's reasoning (");
        sb_excerpt(&b, c, clen, d, clen, 24);
        sb_puts(&b, ") is not in this prompt, which has ");
    } else {
        sb_puts(&b, "the chat template renders an earlier turn otherwise once another follows: ");
        sb_excerpt(&b, c, clen, d, clen, 24);
        sb_puts(&b, " became ");
    }
    sb_excerpt(&b, r, rlen, d, rlen, 24);
    sb_printf(&b, " on line %zu", f->line);
    const int *tl = t->hints.rewrite_line;
    if (at_rewrite && tl[0] > 0 && tl[1] > 0 && tl[0] != tl[1])
        sb_printf(&b, " (template line %d; line %d while that answer was the last turn)", tl[0], tl[1]);
    else if (at_rewrite && tl[0] > 0)
        sb_printf(&b, " (template line %d)", tl[0]);
    return true;
}

kp_status kp_doctor_explain(const char *cached, size_t cached_len, const char *request,
                         size_t request_len, const kp_doctor_tokens *tokens,
                         kp_doctor_cache_state state, kp_doctor_escape mode, kp_doctor_report *out,
                         kp_error *err) {
    if (!out) return kp_fail(err, KP_EINVAL, "kp_doctor_explain: NULL report");
    kp_doctor_report rep;
    memset(&rep, 0, sizeof rep);
    const char *c = state == KP_DOCTOR_CACHE_NOTHING ? "" : cached;
    size_t clen = state == KP_DOCTOR_CACHE_NOTHING ? 0 : cached_len;
    if (!c && clen) return kp_fail(err, KP_EINVAL, "kp_doctor_explain: NULL cached text");
    kp_status st = kp_doctor_diverge(c, clen, request, request_len, tokens, &rep.div, err);
    if (st != KP_OK) return st;
    if (!retokenized(request, request_len, tokens, &rep.div, state, &rep.finding) &&
        !rewritten(c, clen, request, request_len, tokens, &rep.div, state, &rep.finding)) {
        st = kp_doctor_classify(c, clen, request, request_len, rep.div.byte, state, &rep.finding, err);
        if (st != KP_OK) return st;
        assert(rep.finding.byte == rep.div.byte);
    }
    size_t at = rep.finding.byte;
    kp_doctor_snippet(c, clen, at, KP_DOCTOR_SNIPPET_BEFORE, KP_DOCTOR_SNIPPET_AFTER, mode,
                   rep.cached_snippet, sizeof rep.cached_snippet, &rep.cached_marker);
    kp_doctor_snippet(request, request_len, at, KP_DOCTOR_SNIPPET_BEFORE,
                   KP_DOCTOR_SNIPPET_AFTER, mode, rep.request_snippet, sizeof rep.request_snippet,
                   &rep.request_marker);
    *out = rep;
    return KP_OK;
}
