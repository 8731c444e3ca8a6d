/*
 * harmony.c - OpenAI's harmony format read back from a reply (harmony.h).
 *
 * Owns nothing: every function reads the text it is given. A reply is
 * read as a chain of messages, each starting where the last one's closing
 * marker ended (the first at 0):
 *
 *   [ws] [<|start|>ROLE] HEADER <|message|> BODY (<|end|> | <|call|> | <|return|> | end of text)
 *        ^ the first message may leave out <|start|>ROLE (the prompt wrote it)
 *
 * A header is made of "<|channel|>WORD", "to=WORD", "<|constrain|>WORD"
 * and bare WORDs (a content type, "json"), in any order, with spaces
 * between; at most HEADER_MAX bytes. A first message without
 * "<|start|>" must begin with "<|channel|>" or "to=", so that a reply in
 * plain text is never taken for a header. A body ends at the first
 * closing marker, or at a "<|start|>" (a message the model opened without
 * closing the last). JSON bodies are not looked into for markers: a
 * marker's text inside an argument string ends the message as it would
 * end the model's turn.
 *
 * The calls of a reply are its trailing run of messages to
 * "functions.NAME" with a JSON object body; what comes before them is
 * content (the reasoning split, reasoning.c's harmony mode, finds the
 * reasoning and the content's own message in it).
 */
#include "serve/harmony.h"

#include <stdlib.h>
#include <string.h>

#include "base/canon.h"
#include "serve/chat_impl.h"

#define HEADER_MAX 256 /* bytes between a message's start and its <|message|> */

static const char M_START[] = "<|start|>", M_CHANNEL[] = "<|channel|>", M_MESSAGE[] = "<|message|>",
                  M_CONSTRAIN[] = "<|constrain|>", M_END[] = "<|end|>", M_RETURN[] = "<|return|>",
                  M_CALL[] = "<|call|>";

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == '/' || c == ':';
}

static size_t skip_ws(const char *t, size_t len, size_t i) {
    while (i < len && is_ws(t[i])) i++;
    return i;
}

static size_t rtrim(const char *t, size_t from, size_t n) {
    while (n > from && is_ws(t[n - 1])) n--;
    return n;
}

/* 1: t[i..len) starts with lit; -1: the text ends inside a prefix of it; 0. */
static int lit_at(const char *t, size_t len, size_t i, const char *lit) {
    size_t n = strlen(lit), have = len - i;
    if (have >= n) return memcmp(t + i, lit, n) == 0;
    return memcmp(t + i, lit, have) == 0 ? -1 : 0;
}

static size_t word_end(const char *t, size_t len, size_t i) {
    while (i < len && is_word(t[i])) i++;
    return i;
}

/* The closing marker at t[i], or NULL; *consumed: it belongs to the message
 * ("<|start|>" is the next one's). */
static const char *closing_at(const char *t, size_t len, size_t i, bool *consumed) {
    static const char *const closers[] = {M_END, M_CALL, M_RETURN, M_START};
    for (size_t k = 0; k < sizeof closers / sizeof closers[0]; k++)
        if (lit_at(t, len, i, closers[k]) == 1) {
            *consumed = closers[k] != M_START;
            return closers[k];
        }
    return NULL;
}

kp_harmony_read_result kp_harmony_read(const char *t, size_t len, size_t at, bool first, kp_harmony_msg *m) {
    memset(m, 0, sizeof *m);
    size_t i = skip_ws(t, len, at);
    if (i == len) return KP_HARMONY_PARTIAL;
    size_t head = i;
    int r = lit_at(t, len, i, M_START);
    if (r < 0) return KP_HARMONY_PARTIAL;
    if (r == 1) {
        i = word_end(t, len, i + strlen(M_START)); /* the role */
        if (i == len) return KP_HARMONY_PARTIAL;
    } else if (!first) {
        return KP_HARMONY_NONE;
    } else { /* the prompt opened the message: its header must start here */
        int c = lit_at(t, len, i, M_CHANNEL), to = lit_at(t, len, i, "to=");
        if (c == 0 && to == 0) return KP_HARMONY_NONE;
        if (c < 0 || to < 0) return KP_HARMONY_PARTIAL;
    }
    for (;;) {
        while (i < len && t[i] == ' ') i++;
        if (i - head > HEADER_MAX) return KP_HARMONY_NONE;
        if (i == len) return KP_HARMONY_PARTIAL;
        size_t *from = NULL, *to = NULL, skip = 0;
        if (t[i] == '<') {
            int rc = lit_at(t, len, i, M_CHANNEL), rk = lit_at(t, len, i, M_CONSTRAIN),
                rm = lit_at(t, len, i, M_MESSAGE);
            if (rm == 1) {
                m->body_from = i + strlen(M_MESSAGE);
                break;
            }
            if (rc == 1) from = &m->chan_from, to = &m->chan_to, skip = strlen(M_CHANNEL);
            else if (rk == 1) skip = strlen(M_CONSTRAIN);
            else if (rc < 0 || rk < 0 || rm < 0) return KP_HARMONY_PARTIAL;
            else return KP_HARMONY_NONE;
        } else {
            int rt = lit_at(t, len, i, "to=");
            if (rt < 0) return KP_HARMONY_PARTIAL;
            if (rt == 1) from = &m->to_from, to = &m->to_to, skip = 3;
            else if (!is_word(t[i])) return KP_HARMONY_NONE;
        }
        size_t ws = i + skip, we = word_end(t, len, ws);
        if (we == len) return KP_HARMONY_PARTIAL; /* the word may go on */
        if (from && we == ws) return KP_HARMONY_NONE;
        if (from) *from = ws, *to = we;
        i = we;
    }
    /* the body: up to the first closing marker */
    size_t k = m->body_from;
    for (;;) {
        const char *lt = k < len ? memchr(t + k, '<', len - k) : NULL;
        if (!lt) break;
        k = (size_t)(lt - t);
        bool consumed = false;
        const char *c = closing_at(t, len, k, &consumed);
        if (c) {
            m->body_to = k;
            m->end = consumed ? k + strlen(c) : k;
            m->closed = true;
            return KP_HARMONY_MSG;
        }
        k++;
    }
    m->body_to = m->end = len;
    return KP_HARMONY_MSG;
}

bool kp_harmony_channel_is(const kp_harmony_msg *m, const char *t, const char *channel) {
    size_t n = strlen(channel);
    return m->chan_to - m->chan_from == n && !memcmp(t + m->chan_from, channel, n);
}

const char *kp_harmony_call_name(const kp_harmony_msg *m, const char *t, size_t *n) {
    static const char ns[] = "functions.";
    size_t nl = sizeof ns - 1, rl = m->to_to - m->to_from;
    if (rl <= nl || memcmp(t + m->to_from, ns, nl)) return NULL;
    *n = rl - nl;
    return t + m->to_from + nl;
}

size_t kp_harmony_safe_end(const char *t, size_t from, size_t len) {
    static const char *const markers[] = {M_END, M_CALL, M_RETURN, M_START};
    size_t lo = len - from > 10 ? len - 10 : from;
    for (size_t k = lo; k < len; k++) {
        if (t[k] != '<') continue;
        for (size_t j = 0; j < sizeof markers / sizeof markers[0]; j++)
            if (lit_at(t, len, k, markers[j]) < 0) return k;
    }
    return len;
}

/* The messages of text, in order, as long as they chain; *to_end: the
 * chain reaches the end of the text (whitespace aside). */
typedef struct {
    kp_harmony_msg *m;
    size_t n, cap;
    bool oom;
} chain;

static void read_chain(const char *t, size_t len, chain *c, bool *to_end) {
    size_t i = 0;
    *to_end = false;
    for (;;) {
        kp_harmony_msg m;
        kp_harmony_read_result r = kp_harmony_read(t, len, i, c->n == 0, &m);
        if (r != KP_HARMONY_MSG) {
            *to_end = c->n > 0 && skip_ws(t, len, i) == len;
            return;
        }
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 8;
            kp_harmony_msg *v = realloc(c->m, cap * sizeof *v);
            if (!v) {
                c->oom = true;
                return;
            }
            c->m = v, c->cap = cap;
        }
        c->m[c->n++] = m;
        if (!m.closed) {
            *to_end = true;
            return;
        }
        i = m.end;
    }
}

/* The canonical JSON of m's body when it is one JSON object (whitespace
 * around it aside), else NULL. */
static char *call_args(const kp_harmony_msg *m, const char *t, size_t *alen, bool *oom) {
    size_t s = skip_ws(t, m->body_to, m->body_from), e = rtrim(t, s, m->body_to), je = 0;
    if (s >= e || t[s] != '{' || kp_chat_json_extent(t, e, s, &je) != 2 || je != e) return NULL;
    json_t *v = json_loadb(t + s, e - s, JSON_DECODE_INT_AS_REAL, NULL);
    char *canon = NULL;
    if (json_is_object(v)) {
        kp_status st = kp_canon_dump(v, &canon, alen, NULL);
        if (st == KP_ENOMEM) *oom = true;
        if (st != KP_OK) canon = NULL;
    }
    json_decref(v);
    return canon;
}

kp_status kp_harmony_parse(const char *text, size_t len, uint64_t id_seed, json_t **calls, size_t *content_len,
                           kp_error *err) {
    *calls = NULL;
    *content_len = rtrim(text, 0, len);
    chain c = {0};
    bool to_end = false;
    read_chain(text, len, &c, &to_end);
    size_t k0 = c.n;
    while (to_end && k0 > 0) {
        size_t nl;
        if (!kp_harmony_call_name(&c.m[k0 - 1], text, &nl)) break;
        k0--;
    }
    json_t *arr = NULL;
    bool oom = c.oom;
    if (!oom && k0 < c.n && (arr = json_array()) == NULL) oom = true;
    for (size_t k = k0; arr && !oom && k < c.n; k++) {
        size_t nl = 0, al = 0;
        const char *name = kp_harmony_call_name(&c.m[k], text, &nl);
        char *args = call_args(&c.m[k], text, &al, &oom);
        if (!args) { /* not a call after all: the whole run is content */
            json_decref(arr);
            arr = NULL;
            break;
        }
        json_t *call = kp_chat_call_object(name, nl, args, al, id_seed, k - k0);
        free(args);
        if (!call || json_array_append_new(arr, call)) oom = true;
    }
    if (arr && !oom) {
        *calls = arr;
        *content_len = k0 ? rtrim(text, 0, c.m[k0 - 1].end) : 0;
    }
    free(c.m);
    if (oom) {
        json_decref(arr);
        *calls = NULL;
        return kp_fail(err, KP_ENOMEM, "out of memory reading tool calls");
    }
    return KP_OK;
}

size_t kp_harmony_holdback(const char *text, size_t len) {
    size_t i = 0, hold = SIZE_MAX;
    for (bool first = true;; first = false) {
        kp_harmony_msg m;
        kp_harmony_read_result r = kp_harmony_read(text, len, i, first, &m);
        if (r == KP_HARMONY_PARTIAL) return hold != SIZE_MAX ? hold : i;
        if (r == KP_HARMONY_NONE) return rtrim(text, i, len); /* not harmony from here on: no calls */
        size_t nl;
        if (kp_harmony_call_name(&m, text, &nl)) {
            if (hold == SIZE_MAX) hold = i;
            if (!m.closed) return hold;
        } else {
            hold = SIZE_MAX;
            if (!m.closed) return rtrim(text, m.body_from, kp_harmony_safe_end(text, m.body_from, len));
        }
        i = m.end;
    }
}

/* Renders body (NULL on refusal); *oom when memory ran out. */
static char *render_probe(kp_toolsyn_render_fn render, void *ctx, json_t *body, size_t *n, bool *oom) {
    char *out = NULL;
    if (!body) {
        *oom = true;
        return NULL;
    }
    kp_status st = render(ctx, body, &out, n);
    json_decref(body);
    if (st == KP_ENOMEM) *oom = true;
    if (st != KP_OK) {
        free(out);
        return NULL;
    }
    return out;
}

bool kp_harmony_detect(kp_toolsyn_render_fn render, void *ctx, bool *oom) {
    static const char answer[] = "<|start|>assistant<|channel|>final<|message|>KPHARMONY";
    static const char gen_end[] = "<|start|>assistant";
    *oom = false;
    size_t n1 = 0, n2 = 0;
    char *hist = render_probe(render, ctx,
                              json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:b}", "messages", "role", "user",
                                        "content", "kpu", "role", "assistant", "content", "KPHARMONY", "role", "user",
                                        "content", "kpu2", "add_generation_prompt", 1),
                              &n1, oom);
    bool yes = hist && kp_chat_find(hist, n1, answer) != NULL;
    if (yes) {
        char *gen = render_probe(render, ctx,
                                 json_pack("{s:[{s:s, s:s}], s:b}", "messages", "role", "user", "content", "kpu",
                                           "add_generation_prompt", 1),
                                 &n2, oom);
        size_t gl = sizeof gen_end - 1, e = gen ? rtrim(gen, 0, n2) : 0;
        yes = gen && e >= gl && !memcmp(gen + e - gl, gen_end, gl);
        free(gen);
    }
    free(hist);
    return yes;
}
