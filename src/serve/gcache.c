/*
 * gcache.c - the LRU of compiled request grammars (gcache.h).
 *
 * Owns: the entry array (cap slots, a key and a grammar reference each, a
 * use stamp for the LRU) under `mu`. A lookup is a linear scan: cap is
 * small (the server uses 16), and the scan is nothing next to a request.
 *
 *   slot i: key[0..klen) = kind byte + canonical schema bytes, NUL, every
 *                          member name in document order (NUL after each)
 *                          / kind byte + GBNF text
 *           g            = one reference; NULL: free slot
 *           used         = the clock when last returned
 *
 * Compiles run on the caller's thread (a connection's), outside the lock,
 * and poll the caller's stop (the client left, the server stops); their
 * cost is linear in the schema or grammar (src/grammar/ganalyse.c), well
 * under a second for a body at the server's size limit.
 */
#include "serve/gcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/canon.h"

typedef struct {
    char *key;
    size_t klen;
    kp_grammar *g;
    uint64_t used;
} slot;

struct kp_gcache {
    pthread_mutex_t mu;
    slot *e;
    size_t cap;
    uint64_t clock, hits, compiles;
};

kp_status kp_gcache_new(kp_gcache **out, size_t cap, kp_error *err) {
    *out = NULL;
    if (cap == 0) return kp_fail(err, KP_EINVAL, "a grammar cache holds at least one grammar");
    kp_gcache *c = calloc(1, sizeof *c);
    if (!c || !(c->e = calloc(cap, sizeof *c->e))) {
        free(c);
        return kp_fail(err, KP_ENOMEM, "out of memory for the grammar cache");
    }
    c->cap = cap;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return KP_OK;
}

void kp_gcache_free(kp_gcache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++) {
        free(c->e[i].key);
        kp_grammar_free(c->e[i].g);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Appends every object member name of v in document order, each followed
 * by a NUL: the canonical bytes sort members, but the output's property
 * order follows the schema's. */
static void key_order(const json_t *v, kp_buf *b, int depth) {
    if (depth > KP_CANON_MAX_DEPTH) return;
    const char *k;
    const json_t *x;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, x) {
            kp_buf_put(b, k, strlen(k) + 1);
            key_order(x, b, depth + 1);
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x) key_order(x, b, depth + 1);
    }
}

/* The key: kind, then the canonical schema (and its member order) or the
 * text. */
static kp_status make_key(kp_gc_kind kind, const json_t *schema, const char *text, size_t len,
                          const kp_gc_frame *fr, char **key, size_t *klen, kp_error *err) {
    char *body = NULL;
    size_t n = 0;
    if (kind == KP_GC_SCHEMA || kind == KP_GC_FRAMED) {
        kp_status st = kp_canon_dump(schema, &body, &n, err);
        if (st != KP_OK) return st;
    } else if (kind == KP_GC_GBNF) {
        body = (char *)text;
        n = len;
    }
    kp_buf b = {0};
    char kc = (char)kind;
    kp_buf_put(&b, &kc, 1);
    if (kind == KP_GC_FRAMED) { /* the lengths first: the key stays unambiguous */
        uint64_t lens[2] = {fr->prefix_len, fr->suffix_len};
        kp_buf_put(&b, lens, sizeof lens);
        kp_buf_put(&b, fr->prefix, fr->prefix_len);
        kp_buf_put(&b, fr->suffix, fr->suffix_len);
    }
    if (n) kp_buf_put(&b, body, n);
    if (kind == KP_GC_SCHEMA || kind == KP_GC_FRAMED) {
        free(body);
        kp_buf_put(&b, "", 1);
        key_order(schema, &b, 0);
    }
    if (b.oom) {
        kp_buf_free(&b);
        return kp_fail(err, KP_ENOMEM, "out of memory for the grammar cache");
    }
    *key = b.data;
    *klen = b.len;
    return KP_OK;
}

/* Under mu: the slot holding key, or NULL. */
static slot *find(kp_gcache *c, const char *key, size_t klen) {
    for (size_t i = 0; i < c->cap; i++)
        if (c->e[i].g && c->e[i].klen == klen && !memcmp(c->e[i].key, key, klen)) return &c->e[i];
    return NULL;
}

static kp_status get(kp_gcache *c, kp_gc_kind kind, const json_t *schema, const char *text, size_t len,
                     const kp_gc_frame *fr, const kp_grammar_stop *stop, kp_grammar **out, kp_error *err) {
    *out = NULL;
    char *key = NULL;
    size_t klen = 0;
    kp_status st = make_key(kind, schema, text, len, fr, &key, &klen, err);
    if (st != KP_OK) return st;
    pthread_mutex_lock(&c->mu);
    slot *s = find(c, key, klen);
    if (s) {
        s->used = ++c->clock;
        c->hits++;
        *out = kp_grammar_ref(s->g);
    }
    pthread_mutex_unlock(&c->mu);
    if (*out) {
        free(key);
        return KP_OK;
    }
    kp_schema_opts o = kp_schema_opts_default();
    o.ws_max = fr ? 0 : KP_GCACHE_WS; /* a forced call: compact, as its template writes it back */
    o.no_outer_ws = true;
    o.stop = stop;
    if (fr) {
        o.prefix = fr->prefix;
        o.prefix_len = fr->prefix_len;
        o.suffix = fr->suffix;
        o.suffix_len = fr->suffix_len;
    }
    kp_grammar *g = NULL;
    st = kind == KP_GC_JSON_OBJECT                       ? kp_grammar_json_object(&o, &g, err)
         : kind == KP_GC_SCHEMA || kind == KP_GC_FRAMED ? kp_grammar_compile_schema(schema, &o, &g, err)
                                                         : kp_grammar_compile_gbnf_stop(text, len, stop, &g, err);
    if (st != KP_OK) {
        free(key);
        return st;
    }
    pthread_mutex_lock(&c->mu);
    c->compiles++;
    if (!find(c, key, klen)) {
        slot *v = &c->e[0];
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->e[i].g) {
                v = &c->e[i];
                break;
            }
            if (c->e[i].used < v->used) v = &c->e[i];
        }
        free(v->key);
        kp_grammar_free(v->g);
        v->key = key;
        v->klen = klen;
        v->g = kp_grammar_ref(g);
        v->used = ++c->clock;
        key = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(key);
    *out = g;
    return KP_OK;
}

kp_status kp_gcache_get(kp_gcache *c, kp_gc_kind kind, const json_t *schema, const char *text, size_t len,
                        const kp_grammar_stop *stop, kp_grammar **out, kp_error *err) {
    if (kind == KP_GC_FRAMED) {
        *out = NULL;
        return kp_fail(err, KP_EINVAL, "a framed schema needs kp_gcache_get_framed");
    }
    return get(c, kind, schema, text, len, NULL, stop, out, err);
}

kp_status kp_gcache_get_framed(kp_gcache *c, const json_t *schema, const kp_gc_frame *fr, const kp_grammar_stop *stop,
                               kp_grammar **out, kp_error *err) {
    return get(c, KP_GC_FRAMED, schema, NULL, 0, fr, stop, out, err);
}

void kp_gcache_counts(kp_gcache *c, uint64_t *hits, uint64_t *compiles) {
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *compiles = c->compiles;
    pthread_mutex_unlock(&c->mu);
}
