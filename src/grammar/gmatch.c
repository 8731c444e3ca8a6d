/*
 * gmatch.c - the public matcher: a pda engine (pda.h) holding the current
 * configuration, token acceptance, shortest completions, and token masks
 * with the per-position mask cache.
 *
 * Masks. The allowed set of a configuration is the union over its leaves
 * (stacks) of the tokens each leaf's stack survives. For a leaf, only the
 * top KEY_K frames of its stack are looked at first: the key
 *
 *     (pos, need', rem') of frames 1..K, and whether the stack ends there
 *
 * REP counters are clamped to CLAMP (unbounded stays unbounded): a token
 * of fewer than CLAMP bytes cannot tell larger counts apart, since every
 * iteration of a repetition reads a byte. The walk of a clamped key uses
 * unbounded counters, stops at depth CLAMP and calls every longer token
 * uncertain (they are few: whitespace runs, long identifiers), so
 * x{0,1000} costs one key instead of a thousand.
 *
 * With the stack below the key replaced by SENTINEL, one walk over the
 * vocabulary trie sorts every token into
 *
 *   accepted   some parse survives all its bytes inside the key's frames
 *              (or pops into SENTINEL exactly at its end: the real stack
 *              below always continues): allowed whatever lies below;
 *   uncertain  no parse survives inside, but one popped into SENTINEL
 *              before the end and the next byte is in FOLLOW of the key's
 *              bottom rule: depends on the real stack below;
 *   rejected   the rest: never allowed under this key.
 *
 * The entry (accepted ids as a list or bitset, uncertain ranks) is cached
 * per key for the life of the cache (XGrammar's adaptive token mask cache,
 * keyed on the top frames instead of a single rule). Per mask call the
 * work is then: OR the accepted sets of the leaves' entries, and walk just
 * the uncertain tokens from the leaf's real stack, in rank order so that
 * shared prefixes are stepped once:
 *
 *   cfg --leaves--> key --cache--> entry{acc, unc}
 *                                    |      `--> walk unc from the real leaf
 *                                    `--> mask |= acc
 *
 * Inside a JSON string the key is (char position, the string's REP
 * counter): every token free of '"' and bad bytes is accepted there once
 * and for all, tokens with a quote are uncertain (what follows the string
 * decides), so a string in any context costs one OR and a few hundred
 * token walks.
 *
 * The walk (visit, an explicit DFS over the trie) skips what it can:
 *
 *   - a node whose state takes only a few bytes (first set, plus FOLLOW
 *     after an escape) visits just those children, through the node's
 *     child table (structure: after '{' only '"', '}' and whitespace);
 *   - a node whose state loops back to itself on every byte below it, or
 *     on the ASCII bytes below and on every whole UTF-8 character while
 *     the bytes below are well-formed UTF-8 (gvocab.h), accepts its whole
 *     subtree as a rank range without visiting it (string content); a
 *     state inside bounded repetitions is tried with its counters made
 *     unbounded (kp_parser_relax) when no token below is longer than the
 *     smallest counter left;
 *   - a dead state skips its subtree; under a pending escape the subtree
 *     is uncertain as a whole.
 *
 * Memory: the engine is compacted (the live configurations copied into a
 * fresh engine) at the start of a call once it exceeds COMPACT_NODES nodes
 * or COMPACT_BYTES; the cache is emptied when it exceeds CACHE_MAX_BYTES.
 * A matcher and its clones share one cache (reference counted).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "grammar/gvocab.h"
#include "grammar/pda.h"

#define KEY_K 2
#define CLAMP 24 /* REP counters at or above this are one key; see make_key */
#define COMPACT_NODES (KP_GRAMMAR_MAX_NODES / 4)
#define COMPACT_BYTES ((size_t)96 << 20)
#define CACHE_MAX_BYTES ((size_t)256 << 20)

typedef struct {
    uint32_t pos[KEY_K];
    uint16_t need[KEY_K], rem[KEY_K];
    uint32_t n;    /* frames in the key (1..KEY_K) */
    uint32_t tail; /* KP_PARSER_NIL: the stack ends after them; else SENTINEL */
    uint32_t clamped;
} gkey;

typedef struct {
    gkey key;
    uint32_t hnext;
    uint32_t n_acc, n_unc;
    bool acc_bits;    /* acc is a bitset of mask_words words, else n_acc ids */
    uint32_t *acc;
    uint32_t *unc;    /* ranks, ascending */
    uint64_t stamp;   /* the mask call (gcache.calls) that last ORed it */
} gentry;

/* One open trie node of an entry walk: its children are being visited,
 * either in order (next, up to end) or only those whose byte is in
 * `bytes` (table: the node's child table). */
typedef struct {
    uint32_t cfg, next, end;
    const uint32_t *table;
    kp_gset bytes;
    uint16_t bi;
    uint8_t u;
} wframe;

typedef struct {
    int refs;
    gentry *e;
    uint32_t n, cap;
    uint32_t *bucket, mask;
    size_t bytes;
    uint64_t flushes;
    uint64_t calls; /* mask calls by any matcher sharing the cache (entry stamps) */
} gcache;

struct kp_gmatch {
    const kp_grammar *g;
    const kp_gvocab *v;
    kp_parser pda;
    uint32_t cfg, start;
    bool finished;
    gcache *cache;
    /* walk scratch, max_len + 2 deep */
    uint32_t *st_cfg;
    uint8_t *st_unc;
    void *wst; /* entry walks: one frame per depth */
    uint32_t *list, n_list, cap_list; /* accepted ids of an entry being built */
    uint32_t *ulist, n_ulist, cap_ulist;
    uint32_t *todo, n_todo, cap_todo; /* uncertain ranks to check */
    kp_gmatch_stats stats;
};

/* ---- the cache ---- */

static void cache_clear(gcache *c) {
    for (uint32_t i = 0; i < c->n; i++) {
        free(c->e[i].acc);
        free(c->e[i].unc);
    }
    c->n = 0;
    c->bytes = 0;
    if (c->bucket) memset(c->bucket, 0xFF, ((size_t)c->mask + 1) * sizeof *c->bucket);
}

static void cache_unref(gcache *c) {
    if (!c || --c->refs > 0) return;
    cache_clear(c);
    free(c->e);
    free(c->bucket);
    free(c);
}

static uint32_t key_hash(const gkey *k) {
    uint64_t h = 0x9E3779B97F4A7C15ull * (k->n * 2 + (k->tail != KP_PARSER_NIL));
    for (uint32_t i = 0; i < k->n; i++) {
        h ^= k->pos[i] + ((uint64_t)k->need[i] << 32) + ((uint64_t)k->rem[i] << 48);
        h *= 0xC2B2AE3D27D4EB4Full;
        h ^= h >> 31;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static bool key_eq(const gkey *a, const gkey *b) {
    if (a->n != b->n || a->tail != b->tail || a->clamped != b->clamped) return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->pos[i] != b->pos[i] || a->need[i] != b->need[i] || a->rem[i] != b->rem[i]) return false;
    return true;
}

static gentry *cache_find(gcache *c, const gkey *k) {
    if (!c->bucket) return NULL;
    for (uint32_t i = c->bucket[key_hash(k) & c->mask]; i != UINT32_MAX; i = c->e[i].hnext)
        if (key_eq(&c->e[i].key, k)) return &c->e[i];
    return NULL;
}

/* Takes acc/unc (malloc'd). NULL on OOM (they are freed). */
static gentry *cache_add(gcache *c, const gkey *k, uint32_t *acc, uint32_t n_acc, bool bits, size_t acc_bytes,
                         uint32_t *unc, uint32_t n_unc) {
    size_t bytes = acc_bytes + (size_t)n_unc * 4 + sizeof(gentry);
    if (c->bytes + bytes > CACHE_MAX_BYTES) {
        cache_clear(c);
        c->flushes++;
    }
    if (!kp_grow_u32((void **)&c->e, &c->cap, c->n + 1, sizeof *c->e)) goto oom;
    if (c->n + 1 > (c->mask + 1) / 2 || !c->bucket) {
        uint32_t nb = c->bucket ? (c->mask + 1) * 2 : 1024;
        uint32_t *b = malloc((size_t)nb * sizeof *b);
        if (!b) goto oom;
        memset(b, 0xFF, (size_t)nb * sizeof *b);
        for (uint32_t i = 0; i < c->n; i++) {
            uint32_t h = key_hash(&c->e[i].key) & (nb - 1);
            c->e[i].hnext = b[h];
            b[h] = i;
        }
        free(c->bucket);
        c->bucket = b;
        c->mask = nb - 1;
    }
    gentry *e = &c->e[c->n];
    memset(e, 0, sizeof *e);
    e->key = *k;
    e->acc = acc;
    e->n_acc = n_acc;
    e->acc_bits = bits;
    e->unc = unc;
    e->n_unc = n_unc;
    uint32_t h = key_hash(k) & c->mask;
    e->hnext = c->bucket[h];
    c->bucket[h] = c->n++;
    c->bytes += bytes;
    return e;
oom:
    free(acc);
    free(unc);
    return NULL;
}

/* ---- matcher lifecycle ---- */

static kp_status alloc_scratch(kp_gmatch *m, kp_error *err) {
    size_t d = (size_t)m->v->max_len + 2;
    m->st_cfg = malloc(d * sizeof *m->st_cfg);
    m->st_unc = malloc(d);
    m->wst = malloc((d + 1) * sizeof(wframe));
    if (!m->st_cfg || !m->st_unc || !m->wst) return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    return KP_OK;
}

kp_status kp_gmatch_new(kp_gmatch **out, const kp_grammar *g, const kp_gvocab *gv, kp_error *err) {
    if (!out || !g || !gv) return kp_fail(err, KP_EINVAL, "kp_gmatch_new: NULL argument");
    *out = NULL;
    kp_gmatch *m = calloc(1, sizeof *m);
    if (!m) return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    m->g = g;
    m->v = gv;
    kp_status st = kp_parser_init(&m->pda, g, KP_GRAMMAR_MAX_NODES, err);
    if (st != KP_OK) {
        free(m);
        return st;
    }
    m->cache = calloc(1, sizeof *m->cache);
    if (!m->cache) {
        kp_gmatch_free(m);
        return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    }
    m->cache->refs = 1;
    if ((st = alloc_scratch(m, err)) != KP_OK || (st = kp_parser_start(&m->pda, &m->start, err)) != KP_OK) {
        kp_gmatch_free(m);
        return st;
    }
    m->cfg = m->start;
    *out = m;
    return KP_OK;
}

void kp_gmatch_free(kp_gmatch *m) {
    if (!m) return;
    kp_parser_fini(&m->pda);
    cache_unref(m->cache);
    free(m->st_cfg);
    free(m->st_unc);
    free(m->wst);
    free(m->list);
    free(m->ulist);
    free(m->todo);
    free(m);
}

/* A fresh engine holding m's current and start configurations. */
static kp_status rebuild(kp_gmatch *m, const kp_gmatch *from, kp_error *err) {
    kp_parser np;
    kp_status st = kp_parser_init(&np, m->g, KP_GRAMMAR_MAX_NODES, err);
    if (st != KP_OK) return st;
    uint32_t cfg, start;
    if ((st = kp_parser_import(&np, &from->pda, from->cfg, &cfg, err)) != KP_OK ||
        (st = kp_parser_import(&np, &from->pda, from->start, &start, err)) != KP_OK) {
        kp_parser_fini(&np);
        return st;
    }
    if (m == from) kp_parser_fini(&m->pda);
    m->pda = np;
    m->cfg = cfg;
    m->start = start;
    return KP_OK;
}

kp_status kp_gmatch_clone(kp_gmatch **out, const kp_gmatch *m, kp_error *err) {
    if (!out || !m) return kp_fail(err, KP_EINVAL, "kp_gmatch_clone: NULL argument");
    *out = NULL;
    kp_gmatch *c = calloc(1, sizeof *c);
    if (!c) return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    c->g = m->g;
    c->v = m->v;
    c->finished = m->finished;
    kp_status st = alloc_scratch(c, err);
    if (st == KP_OK) st = rebuild(c, m, err);
    if (st != KP_OK) {
        free(c->st_cfg);
        free(c->st_unc);
        free(c->wst);
        free(c);
        return st;
    }
    c->cache = m->cache;
    c->cache->refs++;
    *out = c;
    return KP_OK;
}

const kp_gvocab *kp_gmatch_vocab(const kp_gmatch *m) { return m->v; }
const kp_grammar *kp_gmatch_grammar(const kp_gmatch *m) { return m->g; }

void kp_gmatch_reset(kp_gmatch *m) {
    m->cfg = m->start;
    m->finished = false;
}

static kp_status maybe_compact(kp_gmatch *m, kp_error *err) {
    if (kp_parser_n_nodes(&m->pda) < COMPACT_NODES && kp_parser_bytes(&m->pda) < COMPACT_BYTES) return KP_OK;
    m->stats.flushes++;
    return rebuild(m, m, err);
}

bool kp_gmatch_complete(const kp_gmatch *m) {
    return !m->finished && (kp_parser_cfg(&m->pda, m->cfg)->flags & KP_GCFG_COMPLETE);
}
bool kp_gmatch_can_continue(const kp_gmatch *m) { return !m->finished && kp_parser_cfg(&m->pda, m->cfg)->n > 0; }
bool kp_gmatch_finished(const kp_gmatch *m) { return m->finished; }

/* ---- accepting ---- */

static kp_status feed(kp_gmatch *m, const uint8_t *p, size_t n, uint32_t *cfg, kp_error *err) {
    uint32_t c = m->cfg;
    for (size_t i = 0; i < n; i++) {
        uint32_t nc;
        kp_status st = kp_parser_step(&m->pda, c, p[i], &nc, err);
        if (st != KP_OK) return st;
        if (!kp_parser_alive(&m->pda, nc))
            return kp_fail(err, KP_EINVAL, "grammar: byte 0x%02x at offset %zu is not allowed", p[i], i);
        c = nc;
    }
    *cfg = c;
    return KP_OK;
}

kp_status kp_gmatch_accept_bytes(kp_gmatch *m, const void *bytes, size_t n, kp_error *err) {
    if (!m || (n && !bytes)) return kp_fail(err, KP_EINVAL, "kp_gmatch_accept_bytes: NULL argument");
    if (m->finished) return kp_fail(err, KP_EINVAL, "grammar: the document has ended");
    kp_status st = maybe_compact(m, err);
    if (st != KP_OK) return st;
    uint32_t c;
    if ((st = feed(m, bytes, n, &c, err)) == KP_OK) m->cfg = c;
    return st;
}

kp_status kp_gmatch_accept_token(kp_gmatch *m, int32_t id, kp_error *err) {
    if (!m) return kp_fail(err, KP_EINVAL, "kp_gmatch_accept_token: NULL argument");
    const kp_gvocab *v = m->v;
    if (id < 0 || id >= v->n_vocab) return kp_fail(err, KP_EINVAL, "grammar: token %d out of range", id);
    if (m->finished) return kp_fail(err, KP_EINVAL, "grammar: the document has ended");
    if (v->kind[id] == KP_GV_EOG) {
        if (!kp_gmatch_complete(m))
            return kp_fail(err, KP_EINVAL, "grammar: end-of-generation token %d before the document is complete", id);
        m->finished = true;
        return KP_OK;
    }
    if (v->kind[id] != KP_GV_TRIE) return kp_fail(err, KP_EINVAL, "grammar: token %d has no text", id);
    uint32_t r = v->id_rank[id];
    kp_status st = maybe_compact(m, err);
    if (st != KP_OK) return st;
    uint32_t c;
    st = feed(m, v->bytes + v->rank_off[r], v->rank_len[r], &c, err);
    if (st == KP_OK)
        m->cfg = c;
    else if (st == KP_EINVAL) {
        char why[KP_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        st = kp_fail(err, KP_EINVAL, "grammar: token %d is not allowed here (%s)", id, why);
    }
    return st;
}

/* ---- masks ---- */

static inline void set_bit(uint32_t *mask, uint32_t id) { mask[id >> 5] |= 1u << (id & 31); }
static inline bool get_bit(const uint32_t *mask, uint32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

static gkey make_key(const kp_gmatch *m, uint32_t leaf) {
    gkey k;
    memset(&k, 0, sizeof k);
    uint32_t n = leaf;
    k.n = 0;
    while (k.n < KEY_K && n > KP_PARSER_SENTINEL) {
        const kp_gnode *nd = &m->pda.nodes[n];
        k.pos[k.n] = nd->pos;
        k.need[k.n] = nd->need;
        k.rem[k.n] = nd->rem;
        if (nd->need >= CLAMP) {
            k.need[k.n] = CLAMP;
            k.clamped = 1;
        }
        if (nd->rem >= CLAMP && nd->rem != KP_GREP_INF) {
            k.rem[k.n] = CLAMP;
            k.clamped = 1;
        }
        k.n++;
        n = nd->parent;
    }
    k.tail = n == KP_PARSER_NIL ? KP_PARSER_NIL : KP_PARSER_SENTINEL;
    return k;
}

static bool list_push(uint32_t **v, uint32_t *n, uint32_t *cap, uint32_t x) {
    if (!kp_grow_u32((void **)v, cap, *n + 1, sizeof **v)) return false;
    (*v)[(*n)++] = x;
    return true;
}


typedef struct {
    kp_gmatch *m;
    const kp_gset *follow;
    uint32_t cut;
    wframe *st;
    uint32_t sp;
    uint64_t steps;
} walker;

static bool push_range(kp_gmatch *m, uint32_t **v, uint32_t *n, uint32_t *cap, uint32_t r0, uint32_t r1, bool ids) {
    if (r1 <= r0) return true;
    if (!kp_grow_u32((void **)v, cap, *n + (r1 - r0), sizeof **v)) return false;
    for (uint32_t r = r0; r < r1; r++) (*v)[(*n)++] = ids ? (uint32_t)m->v->rank_id[r] : r;
    return true;
}

static bool set_subset(const kp_gset *a, const uint64_t *b) {
    for (int w = 0; w < 4; w++)
        if (b[w] & ~a->w[w]) return false;
    return true;
}

/* Opens node's children for visiting (frame on the walker's stack). */
static kp_status open_node(walker *w, uint32_t cfg, uint8_t u, uint32_t first_child, uint32_t end,
                           const uint32_t *table, kp_error *err) {
    kp_parser *p = &w->m->pda;
    wframe *f = &w->st[w->sp++];
    f->cfg = cfg;
    f->u = u;
    f->next = first_child;
    f->end = end;
    f->table = NULL;
    f->bi = 0;
    if (table && !u) {
        /* only the bytes a leaf takes, or the FOLLOW bytes after an escape, lead anywhere */
        const kp_gset *fs = kp_parser_first(p, cfg);
        if (!fs) return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
        f->bytes = *fs;
        if (p->cfgs[cfg].flags & KP_GCFG_ESC)
            for (int i = 0; i < 4; i++) f->bytes.w[i] |= w->follow->w[i];
        int n = 0;
        for (int i = 0; i < 4; i++) n += __builtin_popcountll(f->bytes.w[i]);
        if (n <= 48) f->table = table;
    }
    return KP_OK;
}

/* Visits trie node t from its parent's state (pc, pu). */
static kp_status visit(walker *w, uint32_t t, uint32_t pc, uint8_t pu, kp_error *err) {
    kp_gmatch *m = w->m;
    kp_parser *p = &m->pda;
    const kp_gvocab *v = m->v;
    const kp_gvnode *nd = &v->nodes[t];
    uint32_t d = nd->depth;
    uint8_t b = nd->byte;
    uint32_t r0 = nd->rank, rh = r0 + nd->here, r1 = nd->rank_end;
    if (d >= w->cut) /* a clamped counter might run out: the real stack decides */
        return push_range(m, &m->ulist, &m->n_ulist, &m->cap_ulist, r0, r1, false) ? KP_OK : KP_ENOMEM;
    uint8_t u = pu || ((p->cfgs[pc].flags & KP_GCFG_ESC) && kp_gset_has(w->follow, b));
    uint32_t c = kp_parser_peek(p, pc, b);
    w->steps++;
    if (c == UINT32_MAX) {
        kp_status st = kp_parser_step(p, pc, b, &c, err);
        if (st == KP_EFULL) {
            m->stats.bound_skips++;
            c = KP_PARSER_DEAD;
        } else if (st != KP_OK) {
            return st;
        }
    }
    const kp_gcfg *cc = &p->cfgs[c];
    bool ok = true;
    if (cc->n || cc->flags)
        ok = push_range(m, &m->list, &m->n_list, &m->cap_list, r0, rh, true);
    else if (u)
        ok = push_range(m, &m->ulist, &m->n_ulist, &m->cap_ulist, r0, rh, false);
    if (!ok) return KP_ENOMEM;
    if (rh == r1) return KP_OK; /* no longer tokens */
    if (cc->n == 0 && !(cc->flags & KP_GCFG_ESC))
        return !u || push_range(m, &m->ulist, &m->n_ulist, &m->cap_ulist, rh, r1, false) ? KP_OK : KP_ENOMEM;
    if (cc->n && nd->sub != UINT32_MAX && nd->max_depth < w->cut) {
        /* c loops to itself on every byte below, or on the ASCII bytes below
         * and on every whole UTF-8 character (and the bytes below are
         * well-formed UTF-8): the whole subtree is accepted */
        const uint64_t *below = v->subs + (size_t)nd->sub * 4;
        bool loops = false, u8 = (nd->utf8 & (1u << KP_GV_U8_START)) && (below[2] | below[3]);
        uint64_t ascii[4] = {below[0], below[1], 0, 0};
        /* bounded repetitions: the same with the counters made unbounded,
         * when no token below is long enough to exhaust one */
        uint32_t lc, min_rem;
        kp_status st = kp_parser_relax(p, c, &lc, &min_rem, err);
        if (st != KP_OK) return st;
        const kp_gset *fs = kp_parser_first(p, lc), *loop;
        if (!fs) return KP_ENOMEM;
        if ((uint32_t)(nd->max_depth - d) <= min_rem && set_subset(fs, u8 ? ascii : below) &&
            (st = kp_parser_loop(p, lc, &loop, err)) == KP_OK) {
            loops = set_subset(loop, below);
            if (!loops && u8 && set_subset(loop, ascii)) st = kp_parser_u8loop(p, lc, &loops, err);
        }
        if (st != KP_OK) return st;
        if (loops) return push_range(m, &m->list, &m->n_list, &m->cap_list, rh, r1, true) ? KP_OK : KP_ENOMEM;
    }
    const uint32_t *tab = nd->tab == UINT32_MAX ? NULL : v->ctab + (size_t)nd->tab * 256;
    return open_node(w, c, u, t + 1, nd->end, tab, err);
}

/* Walks the vocabulary trie from the key's pseudo stack: builds and
 * caches its entry. */
static kp_status build_entry(kp_gmatch *m, const gkey *k, gentry **out, kp_error *err) {
    kp_parser *p = &m->pda;
    const kp_gvocab *v = m->v;
    const kp_grammar *g = m->g;
    uint32_t n = k->tail;
    for (uint32_t i = k->n; i-- > 0;) {
        /* a clamped counter cannot run out (need: be met) within the walk's
         * depth: unbounded stand-ins keep the stand-in stack looping */
        uint32_t need = k->need[i] == CLAMP ? KP_GREP_INF : k->need[i];
        uint32_t rem = k->rem[i] == CLAMP ? KP_GREP_INF : k->rem[i];
        n = kp_parser_node(p, k->pos[i], n, need, rem);
        if (n == UINT32_MAX) return kp_fail(err, KP_EFULL, "grammar matcher: more than %u stack frames", p->max_nodes);
    }
    uint32_t c0;
    kp_status st = kp_parser_single(p, n, &c0, err);
    if (st != KP_OK) return st;
    walker w = {.m = m, .follow = &g->follow[g->elem_rule[k->pos[k->n - 1]]], .cut = k->clamped ? CLAMP : UINT32_MAX,
                .st = m->wst};
    m->n_list = m->n_ulist = 0;
    if ((st = open_node(&w, c0, 0, 0, v->n_nodes, v->root_tab, err)) != KP_OK) return st;
    while (w.sp) {
        wframe *f = &w.st[w.sp - 1];
        uint32_t child = UINT32_MAX;
        if (f->table) {
            while (f->bi < 256 && child == UINT32_MAX) {
                uint16_t bb = f->bi++;
                if (kp_gset_has(&f->bytes, (uint8_t)bb)) child = f->table[bb];
            }
        } else if (f->next < f->end) {
            child = f->next;
            f->next = v->nodes[child].end;
        }
        if (child == UINT32_MAX) {
            w.sp--;
            continue;
        }
        if ((st = visit(&w, child, f->cfg, f->u, err)) != KP_OK)
            return st == KP_ENOMEM ? kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory") : st;
    }
    uint64_t steps = w.steps;
    /* accepted ids: a list when that is smaller than a bitset */
    size_t words = kp_gvocab_mask_words(v);
    uint32_t *acc, *unc = NULL;
    bool bits = (size_t)m->n_list > words;
    size_t acc_bytes;
    if (bits) {
        acc_bytes = words * 4;
        acc = calloc(words, 4);
        if (acc)
            for (uint32_t i = 0; i < m->n_list; i++) set_bit(acc, m->list[i]);
    } else {
        acc_bytes = (size_t)m->n_list * 4;
        acc = malloc(acc_bytes + 4);
        if (acc && acc_bytes) memcpy(acc, m->list, acc_bytes);
    }
    if (m->n_ulist) {
        unc = malloc((size_t)m->n_ulist * 4);
        if (unc) memcpy(unc, m->ulist, (size_t)m->n_ulist * 4);
    }
    if (!acc || (m->n_ulist && !unc)) {
        free(acc);
        free(unc);
        goto oom;
    }
    uint64_t flushes = m->cache->flushes;
    *out = cache_add(m->cache, k, acc, m->n_list, bits, acc_bytes, unc, m->n_ulist);
    if (!*out) goto oom;
    if (m->cache->flushes != flushes) m->stats.flushes++;
    m->stats.entries_built++;
    m->stats.walk_steps += steps;
    return KP_OK;
oom:
    return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
}

/* Checks the ranks todo[0..n) (ascending) from cfg0, stepping shared
 * prefixes once; sets the bits of those that survive. */
static kp_status walk_ranks(kp_gmatch *m, uint32_t cfg0, uint32_t *mask, kp_error *err) {
    kp_parser *p = &m->pda;
    const kp_gvocab *v = m->v;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0, valid = 0, dead_len = UINT32_MAX;
    m->st_cfg[0] = cfg0;
    for (uint32_t i = 0; i < m->n_todo; i++) {
        uint32_t r = m->todo[i];
        const uint8_t *t = v->bytes + v->rank_off[r];
        uint32_t len = v->rank_len[r], lcp = 0;
        if (prev) {
            uint32_t mn = len < prev_len ? len : prev_len;
            while (lcp < mn && t[lcp] == prev[lcp]) lcp++;
        }
        if (dead_len <= lcp) continue; /* shares the prefix that killed prev */
        uint32_t d = lcp < valid ? lcp : valid;
        bool alive = true;
        for (uint32_t j = d; j < len; j++) {
            uint32_t c = kp_parser_peek(p, m->st_cfg[j], t[j]);
            m->stats.walk_steps++;
            if (c == UINT32_MAX) {
                kp_status st = kp_parser_step(p, m->st_cfg[j], t[j], &c, err);
                if (st == KP_EFULL) {
                    m->stats.bound_skips++;
                    c = KP_PARSER_DEAD;
                } else if (st != KP_OK) {
                    return st;
                }
            }
            if (!kp_parser_alive(p, c)) {
                valid = j;
                dead_len = j + 1;
                alive = false;
                break;
            }
            m->st_cfg[j + 1] = c;
        }
        prev = t;
        prev_len = len;
        if (alive) {
            valid = len;
            dead_len = UINT32_MAX;
            set_bit(mask, (uint32_t)v->rank_id[r]);
        }
    }
    return KP_OK;
}

kp_status kp_gmatch_mask(kp_gmatch *m, uint32_t *mask, size_t *n_allowed, kp_error *err) {
    if (!m || !mask) return kp_fail(err, KP_EINVAL, "kp_gmatch_mask: NULL argument");
    const kp_gvocab *v = m->v;
    size_t words = kp_gvocab_mask_words(v);
    memset(mask, 0, words * 4);
    if (n_allowed) *n_allowed = 0;
    if (m->finished) return KP_OK;
    kp_status st = maybe_compact(m, err);
    if (st != KP_OK) return st;
    m->stats.masks++;
    uint64_t stamp = ++m->cache->calls; /* the cache's clock: unique over m and its clones */
    uint64_t skips0 = m->stats.bound_skips;
    uint32_t cfg = m->cfg;
    uint32_t n_leaves = kp_parser_cfg(&m->pda, cfg)->n;
    for (uint32_t i = 0; i < n_leaves; i++) {
        uint32_t leaf = kp_parser_leaves(&m->pda, cfg)[i];
        gkey k = make_key(m, leaf);
        gentry *e = cache_find(m->cache, &k);
        if (e) {
            m->stats.entry_hits++;
        } else if ((st = build_entry(m, &k, &e, err)) != KP_OK) {
            return st;
        }
        if (e->stamp != stamp) {
            e->stamp = stamp;
            if (e->acc_bits)
                for (size_t w = 0; w < words; w++) mask[w] |= e->acc[w];
            else
                for (uint32_t j = 0; j < e->n_acc; j++) set_bit(mask, e->acc[j]);
        }
        m->n_todo = 0;
        for (uint32_t j = 0; j < e->n_unc; j++) {
            uint32_t r = e->unc[j];
            if (!get_bit(mask, (uint32_t)v->rank_id[r]) && !list_push(&m->todo, &m->n_todo, &m->cap_todo, r))
                return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
        }
        if (m->n_todo) {
            m->stats.unc_checked += m->n_todo;
            uint32_t c1;
            if ((st = kp_parser_single(&m->pda, leaf, &c1, err)) != KP_OK ||
                (st = walk_ranks(m, c1, mask, err)) != KP_OK)
                return st;
        }
    }
    if (kp_parser_cfg(&m->pda, cfg)->flags & KP_GCFG_COMPLETE)
        for (uint32_t j = 0; j < v->n_eog; j++) set_bit(mask, (uint32_t)v->eog[j]);
    size_t cnt = 0;
    for (size_t w = 0; w < words; w++) cnt += (size_t)__builtin_popcount(mask[w]);
    if (n_allowed) *n_allowed = cnt;
    if (cnt == 0 && m->stats.bound_skips != skips0)
        return kp_fail(err, KP_EFULL, "grammar matcher: every candidate token exceeded the matcher's bounds");
    return KP_OK;
}

void kp_gmask_apply(const uint32_t *mask, size_t mask_words, float *logits, size_t n_logits) {
    for (size_t i = 0; i < n_logits; i++)
        if (i / 32 >= mask_words || !((mask[i / 32] >> (i % 32)) & 1)) logits[i] = -__builtin_inff();
}

void kp_gmatch_get_stats(const kp_gmatch *m, kp_gmatch_stats *st) {
    *st = m->stats;
    st->cache_bytes = m->cache->bytes;
}

/* ---- shortest completion ---- */

#define LEN_INF 0x7FFFFFFFu

static uint32_t add_sat(uint32_t a, uint32_t b) { return a >= LEN_INF - b ? LEN_INF : a + b; }

/* Bytes of the shortest expansion of element e (a REP counted as `need`
 * iterations). */
static uint32_t elem_len(const kp_grammar *g, uint32_t e, uint32_t need) {
    switch (KP_GE_TYPE(e)) {
    case KP_GE_TERM: return 1;
    case KP_GE_REF: return g->min_len[KP_GE_ARG(e)];
    case KP_GE_REP: {
        uint32_t l = g->min_len[g->reps[KP_GE_ARG(e)].rule];
        if (need == 0 || l == 0) return 0;
        return l > LEN_INF / need ? LEN_INF : l * need;
    }
    }
    return 0;
}

/* Shortest completion of the stack whose top is node n. */
static uint32_t stack_len(const kp_gmatch *m, uint32_t n) {
    const kp_grammar *g = m->g;
    uint32_t len = 0;
    for (; n > KP_PARSER_SENTINEL; n = m->pda.nodes[n].parent) {
        const kp_gnode *nd = &m->pda.nodes[n];
        len = add_sat(len, elem_len(g, g->elems[nd->pos], nd->need));
        for (uint32_t q = nd->pos + 1; KP_GE_TYPE(g->elems[q]) != KP_GE_END; q++) {
            uint32_t e = g->elems[q];
            len = add_sat(len, elem_len(g, e, KP_GE_TYPE(e) == KP_GE_REP ? g->reps[KP_GE_ARG(e)].min : 0));
        }
    }
    return len;
}

typedef struct {
    uint32_t pos;  /* emitting the sequence at pos; UINT32_MAX: a repetition */
    uint32_t rule; /* repetition: rule and iterations left */
    uint32_t left;
} emit_item;

static bool emit_push(emit_item **s, uint32_t *n, uint32_t *cap, emit_item it) {
    if (!kp_grow_u32((void **)s, cap, *n + 1, sizeof **s)) return false;
    (*s)[(*n)++] = it;
    return true;
}

static uint8_t low_byte(const kp_gset *s) {
    for (int c = 0; c < 256; c++)
        if (kp_gset_has(s, (uint8_t)c)) return (uint8_t)c;
    return 0;
}

/* Emits element e (a REP as `need` iterations) and everything after it
 * in its alternative. */
static bool emit_from(const kp_grammar *g, uint32_t q, uint32_t need, kp_buf *out, emit_item **s, uint32_t *cap) {
    uint32_t n = 0;
    /* the rest of the alternative first (bottom of the stack), then e itself */
    if (!emit_push(s, &n, cap, (emit_item){q + 1, 0, 0})) return false;
    uint32_t e = g->elems[q];
    if (KP_GE_TYPE(e) == KP_GE_TERM)
        kp_buf_putc(out, (char)low_byte(&g->sets[KP_GE_ARG(e)]));
    else if (KP_GE_TYPE(e) == KP_GE_REF) {
        if (!emit_push(s, &n, cap, (emit_item){g->alt_pos[g->best_alt[KP_GE_ARG(e)]], 0, 0})) return false;
    } else if (!emit_push(s, &n, cap, (emit_item){UINT32_MAX, g->reps[KP_GE_ARG(e)].rule, need}))
        return false;
    while (n) {
        emit_item *it = &(*s)[n - 1];
        if (it->pos == UINT32_MAX) {
            if (it->left == 0) {
                n--;
                continue;
            }
            it->left--;
            if (!emit_push(s, &n, cap, (emit_item){g->alt_pos[g->best_alt[it->rule]], 0, 0})) return false;
            continue;
        }
        uint32_t x = g->elems[it->pos];
        if (KP_GE_TYPE(x) == KP_GE_END) {
            n--;
            continue;
        }
        it->pos++;
        if (KP_GE_TYPE(x) == KP_GE_TERM)
            kp_buf_putc(out, (char)low_byte(&g->sets[KP_GE_ARG(x)]));
        else if (KP_GE_TYPE(x) == KP_GE_REF) {
            if (!emit_push(s, &n, cap, (emit_item){g->alt_pos[g->best_alt[KP_GE_ARG(x)]], 0, 0})) return false;
        } else {
            const kp_grep *rp = &g->reps[KP_GE_ARG(x)];
            if (!emit_push(s, &n, cap, (emit_item){UINT32_MAX, rp->rule, rp->min})) return false;
        }
    }
    return !out->oom;
}

kp_status kp_gmatch_completion(const kp_gmatch *m, size_t max_len, kp_buf *out, kp_error *err) {
    if (!m || !out) return kp_fail(err, KP_EINVAL, "kp_gmatch_completion: NULL argument");
    if (m->finished) return kp_fail(err, KP_EINVAL, "grammar: the document has ended");
    const kp_gcfg *c = kp_parser_cfg(&m->pda, m->cfg);
    if (c->flags & KP_GCFG_COMPLETE) return KP_OK;
    uint32_t best = UINT32_MAX, best_len = LEN_INF;
    for (uint32_t i = 0; i < c->n; i++) {
        uint32_t leaf = kp_parser_leaves(&m->pda, m->cfg)[i];
        uint32_t l = stack_len(m, leaf);
        if (l < best_len || best == UINT32_MAX) {
            best_len = l;
            best = leaf;
        }
    }
    if (best == UINT32_MAX) return kp_fail(err, KP_EINVAL, "grammar: no completion (the input was rejected)");
    if (best_len > max_len)
        return kp_fail(err, KP_ERANGE, "grammar: the shortest completion is longer than %zu bytes", max_len);
    emit_item *s = NULL;
    uint32_t cap = 0;
    bool ok = true;
    for (uint32_t n = best; n > KP_PARSER_SENTINEL && ok; n = m->pda.nodes[n].parent)
        ok = emit_from(m->g, m->pda.nodes[n].pos, m->pda.nodes[n].need, out, &s, &cap);
    free(s);
    return ok ? KP_OK : kp_fail(err, KP_ENOMEM, "grammar: out of memory");
}
