/*
 * cachereport.c - cache reports from the engine's counts and doctor
 * (cachereport.h).
 *
 * Owns a ring of copied token sequences (newest at the end of `v`):
 *
 *   v[0] oldest ... v[n-1] newest     total = sum of lengths <= max_tokens
 *
 * Invariants: no entry is a prefix of another (adding a longer sequence
 * drops the entries it extends, a shorter one already covered is not
 * added), so the history holds distinct conversations, not each turn of
 * one; the best match for a request is the entry with the longest common
 * token prefix, ties to the newest.
 */
#include "engine/cachereport.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    int32_t *t;
    uint32_t n;
} entry;

struct kp_cachereport {
    const kp_tok_vocab *v;
    entry *e;
    uint32_t n, max_entries;
    uint64_t total, max_tokens;
};

kp_status kp_cachereport_new(kp_cachereport **out, const kp_tok_vocab *v, uint32_t max_entries, uint64_t max_tokens,
                      kp_error *err) {
    *out = NULL;
    if (max_entries == 0) return kp_fail(err, KP_EINVAL, "a history of 0 entries");
    kp_cachereport *c = calloc(1, sizeof *c);
    if (c) c->e = calloc(max_entries, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return kp_fail(err, KP_ENOMEM, "out of memory for the cache report history");
    }
    c->v = v;
    c->max_entries = max_entries;
    c->max_tokens = max_tokens;
    *out = c;
    return KP_OK;
}

void kp_cachereport_clear(kp_cachereport *c) {
    for (uint32_t i = 0; i < c->n; i++) free(c->e[i].t);
    c->n = 0;
    c->total = 0;
}

void kp_cachereport_free(kp_cachereport *c) {
    if (!c) return;
    kp_cachereport_clear(c);
    free(c->e);
    free(c);
}

static uint32_t lcp(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    uint32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static void drop(kp_cachereport *c, uint32_t i) {
    c->total -= c->e[i].n;
    free(c->e[i].t);
    memmove(c->e + i, c->e + i + 1, (c->n - i - 1) * sizeof *c->e);
    c->n--;
}

kp_status kp_cachereport_add(kp_cachereport *c, const int32_t *tokens, uint32_t n, kp_error *err) {
    if (n == 0) return KP_OK;
    for (uint32_t i = 0; i < c->n; i++)
        if (lcp(tokens, n, c->e[i].t, c->e[i].n) == n) return KP_OK; /* covered */
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return kp_fail(err, KP_ENOMEM, "out of memory for the cache report history");
    memcpy(copy, tokens, (size_t)n * sizeof *copy);
    for (uint32_t i = c->n; i-- > 0;)
        if (lcp(tokens, n, c->e[i].t, c->e[i].n) == c->e[i].n) drop(c, i); /* extended */
    while (c->n > 0 && (c->n == c->max_entries || c->total + n > c->max_tokens)) drop(c, 0);
    c->e[c->n].t = copy;
    c->e[c->n].n = n;
    c->n++;
    c->total += n;
    return KP_OK;
}

kp_status kp_cachereport_finish(kp_cachereport *c, kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n,
                         uint32_t *n_added, kp_error *err) {
    if (n_added) *n_added = 0;
    uint32_t len = kp_eng_seq_len(seq);
    if (len == 0) {
        kp_eng_seq_abort(e, seq);
        return KP_OK;
    }
    if (n > len) n = len;
    kp_status st = kp_eng_finish(e, seq, tokens, n, n_added, err);
    if (c) {
        kp_error history_err;
        kp_status hs = kp_cachereport_add(c, tokens, n, st == KP_OK ? err : &history_err);
        if (st == KP_OK) st = hs;
    }
    return st;
}

/* The byte span [*start, *end) in text of token k of ids[0..n) (see
 * kp_cachereport_token_byte); *end = *start when k >= n or on failure. */
static void token_span(const kp_tok_vocab *v, const int32_t *ids, size_t n, size_t k, const char *text, size_t len,
                       bool special, size_t *start, size_t *stop) {
    *start = *stop = len;
    if (k >= n) return;
    kp_error err;
    char *full = NULL;
    size_t fl = 0;
    size_t *end = malloc(n * sizeof *end);
    *start = *stop = 0;
    /* the pieces as they tokenize (no clean-up of spaces), so that the
     * bytes before token k are the text's own */
    if (end && kp_tok_detokenize_raw(v, ids, n, true, special, &full, &fl, end, &err) == KP_OK) {
        size_t lead = fl >= len && !memcmp(full + (fl - len), text, len) ? fl - len : 0;
        size_t pl = k ? end[k - 1] : 0;
        *start = pl > lead ? pl - lead : 0;
        *stop = end[k] > lead ? end[k] - lead : 0;
    }
    free(full);
    free(end);
    if (*start > len) *start = len;
    if (*stop > len) *stop = len;
}

size_t kp_cachereport_token_byte(const kp_tok_vocab *v, const int32_t *ids, size_t n, size_t k, const char *text,
                          size_t len, bool special, size_t limit) {
    size_t start, stop;
    token_span(v, ids, n, k, text, len, special, &start, &stop);
    return start < limit ? start : limit;
}

kp_doctor_tokens kp_cachereport_tokens(const kp_tok_vocab *v, const int32_t *ids, size_t n, size_t k, const char *text,
                                       size_t len, bool special, size_t text_div, const int32_t *cached_ids,
                                       size_t cached_n) {
    size_t start, stop;
    token_span(v, ids, n, k, text, len, special, &start, &stop);
    kp_doctor_tokens dt;
    memset(&dt, 0, sizeof dt);
    dt.token_index = k;
    dt.token_byte = start < text_div ? start : text_div;
    dt.n_tokens = n;
    /* the tokens part where the texts still agree: name both spellings */
    if (!cached_ids || k >= cached_n || k >= n || ids[k] == cached_ids[k] || !(start < stop && stop <= text_div))
        return dt;
    dt.token_end = stop;
    kp_error err;
    char *full = NULL;
    size_t fl = 0;
    size_t *end = malloc((k + 1) * sizeof *end);
    if (end && kp_tok_detokenize_raw(v, cached_ids, k + 1, true, special, &full, &fl, end, &err) == KP_OK) {
        size_t a = k ? end[k - 1] : 0, pl = end[k] - a;
        if (pl > sizeof dt.cached_piece) { /* cut on a character boundary */
            pl = sizeof dt.cached_piece;
            while (pl > 0 && ((unsigned char)full[a + pl] & 0xC0) == 0x80) pl--;
        }
        memcpy(dt.cached_piece, full + a, pl);
        dt.cached_piece_len = pl;
    }
    free(full);
    free(end);
    return dt;
}

/* The reuse stopped before where the tokens matched because the window
 * layers' rows there were dropped (engine.h, window_cut_from): the cause
 * is window_evicted whatever the text says, and the detail says where the
 * tokens matched and where the reuse resumed. */
static void window_cause(const kp_eng_report *r, kp_doctor_report *out) {
    out->finding.cause = KP_DOCTOR_CAUSE_WINDOW_EVICTED;
    snprintf(out->finding.detail, sizeof out->finding.detail,
             "window_evicted: the cache matched %u of %u tokens, but the sliding-window layers' K/V before that "
             "was dropped (window budget): reuse resumed at token %u, the latest position whose window is held",
             r->window_cut_from, r->prompt_tokens, r->reused_tokens);
}

/* A model with recurrent layers resumed at a state snapshot before where
 * the cache matched (engine.h, state_cut_from): the cause is
 * state_checkpoint whatever the text says, and the detail says where the
 * tokens matched, where the reuse resumed and how many were recomputed. */
static void state_cause(const kp_eng_report *r, kp_doctor_report *out) {
    out->finding.cause = KP_DOCTOR_CAUSE_STATE_CHECKPOINT;
    snprintf(out->finding.detail, sizeof out->finding.detail,
             "state_checkpoint: the cache matched %u of %u tokens, but this model's recurrent state was snapshotted "
             "last at token %u: reuse resumed there and %u matched tokens were computed again",
             r->state_cut_from, r->prompt_tokens, r->reused_tokens, r->state_recomputed_tokens);
}

kp_status kp_cachereport_explain(kp_cachereport *c, const int32_t *tokens, uint32_t n, const char *text, size_t text_len,
                          const kp_eng_report *r, kp_doctor_escape mode, kp_doctor_report *out, kp_error *err) {
    return kp_cachereport_explain_hinted(c, tokens, n, text, text_len, r, NULL, mode, out, err);
}

kp_status kp_cachereport_explain_hinted(kp_cachereport *c, const int32_t *tokens, uint32_t n, const char *text,
                                        size_t text_len, const kp_eng_report *r, const kp_doctor_hints *hints,
                                        kp_doctor_escape mode, kp_doctor_report *out, kp_error *err) {
    const entry *best = NULL;
    uint32_t common = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        uint32_t l = lcp(tokens, n, c->e[i].t, c->e[i].n);
        if (!best || l >= common) {
            best = &c->e[i];
            common = l;
        }
    }
    kp_doctor_cache_state state = r->evicted ? KP_DOCTOR_CACHE_EVICTED
                               : !best || r->cold ? KP_DOCTOR_CACHE_NOTHING
                                                  : KP_DOCTOR_CACHE_TEXT;
    if (state == KP_DOCTOR_CACHE_EVICTED && !best) state = KP_DOCTOR_CACHE_NOTHING;
    char *req = NULL, *cached = NULL;
    size_t rl = 0, cl = 0;
    /* both texts as their tokens spell them, without the clean-up of spaces
     * some vocabularies apply when they show text (" ." -> "."): equal
     * tokens are then equal bytes, and the request's raw text ends with the
     * request's own text, so the divergence is found in the request's bytes */
    kp_status st = kp_tok_detokenize_raw(c->v, tokens, n, true, true, &req, &rl, NULL, err);
    if (st == KP_OK && state != KP_DOCTOR_CACHE_NOTHING)
        st = kp_tok_detokenize_raw(c->v, best->t, best->n, true, true, &cached, &cl, NULL, err);
    if (st == KP_OK) {
        /* what detokenizing adds in front of the request's own text */
        size_t lead = 0;
        if (text && rl >= text_len && !memcmp(req + (rl - text_len), text, text_len)) lead = rl - text_len;
        const char *rt = text ? text : req;
        size_t rlen = text ? text_len : rl;
        const char *ct = cached ? cached : "";
        if (lead && cl >= lead && !memcmp(ct, req, lead)) {
            ct += lead;
            cl -= lead;
        }
        size_t i = 0;
        while (i < cl && i < rlen && ct[i] == rt[i]) i++;
        for (int k = 0; k < 3 && i > 0 && i < rlen && ((unsigned char)rt[i] & 0xC0) == 0x80; k++) i--;
        size_t tk = r->diverged_at_token <= n ? r->diverged_at_token : n;
        bool text_cached = state == KP_DOCTOR_CACHE_TEXT;
        kp_doctor_tokens dt = kp_cachereport_tokens(c->v, tokens, n, tk, rt, rlen, true, i, text_cached ? best->t : NULL,
                                                    text_cached ? best->n : 0);
        if (hints) dt.hints = *hints;
        st = kp_doctor_explain(ct, state == KP_DOCTOR_CACHE_NOTHING ? 0 : cl, rt, rlen, &dt, state, mode, out, err);
        if (st == KP_OK && r->window_cut_from > r->reused_tokens) window_cause(r, out);
        if (st == KP_OK && r->state_cut_from > r->reused_tokens) state_cause(r, out);
    }
    free(req);
    free(cached);
    return st;
}
