/*
 * taint.c - which bytes of a rendering came from client text.
 *
 * A server tokenizes a chat template's own markup with special tokens
 * parsed and the client's text as plain text, so that "<|im_start|>" typed
 * in a message stays text. The interpreter therefore carries, on every
 * string, the origin of each of its bytes:
 *
 *   jstr.taint   NULL                every byte is the template's (markup)
 *                uint8_t[len]        1 where the byte came from client text
 *
 * Client text enters when the context's client members (kp_jinja_render_
 * client's list: messages, tools) are read from JSON: every string and
 * every key in them is wholly client text. From there the rule is, for
 * each operation that builds a string:
 *
 *   exact    `~` and `+` (concatenation), `*` (repetition), output
 *            statements, macro results and set / filter blocks (the
 *            output's taint is kept byte for byte, tout); pieces of a
 *            string (kp_jv_substr: slices with step 1, indexing, iterating,
 *            strip / trim, split, splitlines, removeprefix / removesuffix)
 *            share the parent's array from their offset
 *   whole    every filter, method, global and `%` (kp_jt_derived): a
 *            string the operation made (born after it started) with no
 *            taint of its own becomes wholly client text when any operand
 *            holds client text. So `tools|tojson`, `'%s' % x`,
 *            `x.replace(a, b)`, `x|upper`, `parts|join` are client text
 *            whole, literal bytes included. Values an
 *            operation returns as they were (`messages|last`, `ns.x`,
 *            `d.get(k, '<|x|>')`'s default) keep the taint they had.
 *   str(v)   of a list or dict (output, `~`, `|string`): client text whole
 *            when v holds any client byte.
 *
 * So a byte that client text helped form is client text: a control token
 * can never be assembled from a client's bytes. replace stays whole on
 * purpose: the bytes it inserts are the template's, but the client's text
 * chooses where they go, and content.replace('x', '<|im_end|>') must not
 * let a client place control tokens. The price is that a
 * template that formats its markup with `%` or `.format()` around client
 * text gets that markup as plain text too.
 *
 * Cost: with no client list, tout is NULL and no string has a taint: every
 * check is one NULL test. Arrays are in the render's arena.
 */
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

/* Nesting deeper than this is taken as client text (no stack to spend). */
#define TAINT_DEPTH 64

static bool str_tainted(const jstr *s) { return s->taint && memchr(s->taint, 1, s->len) != NULL; }

static bool deep(jv v, int depth) {
    if (depth > TAINT_DEPTH) return true;
    switch (v.t) {
    case JT_STR: return str_tainted(v.u.s);
    case JT_LIST:
        for (size_t i = 0; i < v.u.l->n; i++)
            if (deep(v.u.l->items[i], depth + 1)) return true;
        return false;
    case JT_DICT: case JT_NS:
        for (size_t i = 0; i < v.u.d->n; i++)
            if (deep(v.u.d->keys[i], depth + 1) || deep(v.u.d->vals[i], depth + 1)) return true;
        return false;
    case JT_FUNC: return v.u.fn->kind == JFN_METHOD && deep(v.u.fn->self, depth + 1);
    case JT_LOOP: return deep(v.u.loop->items, depth + 1);
    default: return false;
    }
}

bool kp_jt_deep(jv v) { return deep(v, 0); }

static bool fresh(jv v, uint64_t born_from) {
    return v.t == JT_STR && !v.u.s->taint && v.u.s->born >= born_from && v.u.s->len;
}

/* v holds a fresh string, itself or in its lists (filters nest lists: map, batch). */
static bool has_fresh(jv v, uint64_t born_from, int depth) {
    if (fresh(v, born_from)) return true;
    if (v.t != JT_LIST || depth > TAINT_DEPTH) return false;
    for (size_t i = 0; i < v.u.l->n; i++)
        if (has_fresh(v.u.l->items[i], born_from, depth + 1)) return true;
    return false;
}

static bool operands_tainted(jv in, const jargs *a) {
    if (kp_jt_deep(in)) return true;
    for (size_t i = 0; a && i < a->nargs; i++)
        if (kp_jt_deep(a->args[i])) return true;
    for (size_t i = 0; a && i < a->nkw; i++)
        if (kp_jt_deep(a->kwvals[i])) return true;
    return false;
}

/* v with its fresh strings made client text whole: copies, since v and
 * its lists may be shared (a list is copied only when it holds one). */
static jv whole(jctx *c, jv v, uint64_t born_from, int depth) {
    if (v.t == JT_STR) {
        if (!fresh(v, born_from)) return v;
        jv r = kp_jv_str_client(c, v.u.s->s, v.u.s->len);
        r.markup = v.markup;
        return r;
    }
    if (!has_fresh(v, born_from, depth)) return v;
    jv l = kp_jv_list(c, v.u.l->n);
    for (size_t i = 0; !c->failed && i < v.u.l->n; i++) l.u.l->items[i] = whole(c, v.u.l->items[i], born_from, depth + 1);
    if (c->failed) return jv_undef();
    l.tuple = v.tuple;
    l.gen = v.gen;
    return l;
}

jv kp_jt_derived(jctx *c, jv r, uint64_t born_from, jv in, const jargs *a) {
    if (!c->tout || c->failed || !has_fresh(r, born_from, 0) || !operands_tainted(in, a)) return r;
    return whole(c, r, born_from, 0);
}

/* Writes n bytes of s's taint (zeros when it has none) at t. */
static void copy_taint(uint8_t *t, const jstr *s) {
    if (s->taint) memcpy(t, s->taint, s->len);
    else memset(t, 0, s->len);
}

jv kp_jt_concat(jctx *c, jv a, jv b) {
    size_t na = a.u.s->len, nb = b.u.s->len;
    jv r = kp_jv_str(c, NULL, na + nb);
    if (c->failed) return r;
    memcpy(r.u.s->s, a.u.s->s, na);
    memcpy(r.u.s->s + na, b.u.s->s, nb);
    if ((a.u.s->taint || b.u.s->taint) && na + nb) {
        uint8_t *t = kp_ja_alloc(&c->arena, na + nb);
        if (!t) return kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
        copy_taint(t, a.u.s);
        copy_taint(t + na, b.u.s);
        r.u.s->taint = t;
    }
    return r;
}

jv kp_jt_repeat(jctx *c, jv r, jv seq) {
    if (c->failed || r.t != JT_STR || seq.t != JT_STR || !seq.u.s->taint || !seq.u.s->len) return r;
    uint8_t *t = kp_ja_alloc(&c->arena, r.u.s->len ? r.u.s->len : 1);
    if (!t) return kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
    for (size_t i = 0; i < r.u.s->len; i += seq.u.s->len) memcpy(t + i, seq.u.s->taint, seq.u.s->len);
    r.u.s->taint = t;
    return r;
}

bool kp_jt_put(jctx *c, kp_buf *tb, jv v, size_t n) {
    if (!tb) return true;
    bool ok = v.t == JT_STR && v.u.s->len == n && v.u.s->taint ? kp_buf_put(tb, v.u.s->taint, n)
                                                                : kp_buf_fill(tb, kp_jt_deep(v) ? 1 : 0, n);
    if (!ok) kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
    return ok;
}

jv kp_jt_str_bufs(jctx *c, kp_buf *b, kp_buf *tb) {
    jv r = kp_jv_str_buf(c, b);
    if (tb && !c->failed && tb->len == r.u.s->len && tb->len && memchr(tb->data, 1, tb->len)) {
        uint8_t *t = kp_ja_alloc(&c->arena, tb->len);
        if (!t) r = kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
        else {
            memcpy(t, tb->data, tb->len);
            r.u.s->taint = t;
        }
    }
    if (tb) kp_buf_free(tb);
    return r;
}

kp_status kp_jt_ranges(const kp_buf *tb, size_t base, kp_jinja_range **ranges, size_t *n) {
    *ranges = NULL;
    *n = 0;
    const uint8_t *t = (const uint8_t *)tb->data;
    size_t cap = 0;
    for (size_t i = 0; i < tb->len;) {
        if (!t[i]) { i++; continue; }
        size_t j = i;
        while (j < tb->len && t[j]) j++;
        if (!kp_grow((void **)ranges, &cap, *n + 1, sizeof **ranges)) {
            free(*ranges);
            *ranges = NULL;
            *n = 0;
            return KP_ENOMEM;
        }
        (*ranges)[(*n)++] = (kp_jinja_range){base + i, j - i};
        i = j;
    }
    return KP_OK;
}
