/*
 * pda.c - the matching engine (see pda.h for the picture): interned stack
 * nodes, interned configurations, the closure after each byte, and the
 * (cfg, byte) -> cfg memo.
 *
 * Tables: nodes[] with chained hash buckets (nbucket, chains through
 * kp_gnode.hnext, 0 ends a chain since node 0 is never hashed); cfgs[]
 * likewise (cbucket); the leaf pool holds every cfg's sorted leaves; the
 * memo is open addressing over (cfg << 8 | byte) + 1. Nothing is ever
 * removed: the owner throws the whole engine away to compact.
 *
 * The closure of a set of nodes: a work stack; each node is expanded once
 * per step (stamp[node] == epoch). A node on a TERM is a leaf; on REF r it
 * pushes r's alternatives with the return point after the REF; on REP it
 * may exit (need == 0) and may iterate (rem > 0) with the counters
 * decremented in the return node; NIL sets COMPLETE, SENTINEL sets ESC.
 * Because left recursion is refused at compile time, every chain of
 * expansions without reading a byte is finite, and the stamps make the
 * closure linear in the nodes it touches.
 */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "grammar/gvocab.h" /* the UTF-8 decoder states */
#include "grammar/pda.h"

#define MEMO_MAX_SLOTS (1u << 21)

static uint32_t hash_node(uint32_t pos, uint32_t parent, uint32_t need, uint32_t rem) {
    uint64_t h = (uint64_t)pos * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)parent + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
    h ^= ((uint64_t)(need << 16 | rem) + 1) * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    return (uint32_t)(h ^ (h >> 32));
}

static uint32_t hash_cfg(const uint32_t *v, uint32_t n, uint32_t flags) {
    uint64_t h = 0x84222325CBF29CE4ull ^ flags;
    for (uint32_t i = 0; i < n; i++) {
        h ^= v[i];
        h *= 0x100000001B3ull;
        h ^= h >> 31;
    }
    return (uint32_t)(h ^ (h >> 32));
}

kp_status kp_parser_init(kp_parser *p, const kp_grammar *g, uint32_t max_nodes, kp_error *err) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->max_nodes = max_nodes < 16 ? 16 : max_nodes;
    p->nbucket_mask = 63;
    p->cbucket_mask = 63;
    p->memo_mask = 63;
    p->nbucket = calloc(64, sizeof *p->nbucket);
    p->cbucket = calloc(64, sizeof *p->cbucket);
    p->memo_key = calloc(64, sizeof *p->memo_key);
    p->memo_val = malloc(64 * sizeof *p->memo_val);
    if (!p->nbucket || !p->cbucket || !p->memo_key || !p->memo_val ||
        !kp_grow_u32((void **)&p->nodes, &p->cap_nodes, 2, sizeof *p->nodes) ||
        !kp_grow_u32((void **)&p->cfgs, &p->cap_cfgs, 1, sizeof *p->cfgs)) {
        kp_parser_fini(p);
        return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    }
    memset(p->nodes, 0, 2 * sizeof *p->nodes);
    p->n_nodes = 2; /* NIL, SENTINEL */
    memset(p->cfgs, 0, sizeof *p->cfgs);
    p->cfgs[0].row = UINT32_MAX;
    p->n_cfgs = 1; /* DEAD */
    return KP_OK;
}

void kp_parser_fini(kp_parser *p) {
    free(p->nodes);
    free(p->nbucket);
    free(p->cfgs);
    free(p->cbucket);
    free(p->leaves);
    free(p->rows);
    free(p->memo_key);
    free(p->memo_val);
    free(p->stamp);
    free(p->work);
    free(p->out);
    free(p->first);
    free(p->first_ok);
    free(p->loop);
    free(p->loop_ok);
    free(p->u8);
    free(p->relax);
    free(p->relax_rem);
    memset(p, 0, sizeof *p);
}

size_t kp_parser_bytes(const kp_parser *p) {
    return (size_t)p->cap_nodes * sizeof(kp_gnode) + ((size_t)p->nbucket_mask + 1) * 4 +
           (size_t)p->cap_cfgs * sizeof(kp_gcfg) + ((size_t)p->cbucket_mask + 1) * 4 + (size_t)p->cap_leaves * 4 +
           ((size_t)p->memo_mask + 1) * 12 + (size_t)p->cap_stamp * 4 + (size_t)p->cap_rows * 4;
}

uint32_t kp_parser_n_nodes(const kp_parser *p) { return p->n_nodes; }

static bool rehash_nodes(kp_parser *p) {
    uint32_t nb = (p->nbucket_mask + 1) * 2;
    uint32_t *b = calloc(nb, sizeof *b);
    if (!b) return false;
    for (uint32_t i = 2; i < p->n_nodes; i++) {
        kp_gnode *n = &p->nodes[i];
        uint32_t h = hash_node(n->pos, n->parent, n->need, n->rem) & (nb - 1);
        n->hnext = b[h];
        b[h] = i;
    }
    free(p->nbucket);
    p->nbucket = b;
    p->nbucket_mask = nb - 1;
    return true;
}

/* UINT32_MAX: the cap (fail_full) or memory. */
static uint32_t node_get(kp_parser *p, uint32_t pos, uint32_t parent, uint32_t need, uint32_t rem) {
    uint32_t h = hash_node(pos, parent, need, rem);
    for (uint32_t i = p->nbucket[h & p->nbucket_mask]; i; i = p->nodes[i].hnext) {
        const kp_gnode *n = &p->nodes[i];
        if (n->pos == pos && n->parent == parent && n->need == need && n->rem == rem) return i;
    }
    if (p->n_nodes >= p->max_nodes) return UINT32_MAX;
    if (!kp_grow_u32((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes)) return UINT32_MAX;
    uint32_t id = p->n_nodes++;
    kp_gnode *n = &p->nodes[id];
    n->pos = pos;
    n->parent = parent;
    n->need = (uint16_t)need;
    n->rem = (uint16_t)rem;
    n->hnext = p->nbucket[h & p->nbucket_mask];
    p->nbucket[h & p->nbucket_mask] = id;
    if (p->n_nodes > p->nbucket_mask + 1 && !rehash_nodes(p)) return UINT32_MAX;
    return id;
}

uint32_t kp_parser_node(kp_parser *p, uint32_t pos, uint32_t parent, uint32_t need, uint32_t rem) {
    return node_get(p, pos, parent, need, rem);
}

/* The node for "continue at position q, then pop to parent". */
static uint32_t mk(kp_parser *p, uint32_t q, uint32_t parent) {
    uint32_t e = p->g->elems[q];
    switch (KP_GE_TYPE(e)) {
    case KP_GE_END: return parent;
    case KP_GE_REP: {
        const kp_grep *r = &p->g->reps[KP_GE_ARG(e)];
        return node_get(p, q, parent, r->min, r->max);
    }
    default: return node_get(p, q, parent, 0, 0);
    }
}

static kp_status full(kp_parser *p, kp_error *err) {
    if (p->n_nodes >= p->max_nodes)
        return kp_fail(err, KP_EFULL, "grammar matcher: more than %u stack frames (nesting too deep)", p->max_nodes);
    return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
}

static bool push(kp_parser *p, uint32_t n) {
    if (n == UINT32_MAX || !kp_grow_u32((void **)&p->work, &p->cap_work, p->n_work + 1, sizeof *p->work)) return false;
    p->work[p->n_work++] = n;
    return true;
}

static bool stamp_ok(kp_parser *p, uint32_t n) {
    if (n >= p->cap_stamp) {
        uint32_t old = p->cap_stamp;
        if (!kp_grow_u32((void **)&p->stamp, &p->cap_stamp, n + 1, sizeof *p->stamp)) return false;
        memset(p->stamp + old, 0, (size_t)(p->cap_stamp - old) * sizeof *p->stamp);
    }
    return true;
}

static void new_epoch(kp_parser *p) {
    if (++p->epoch == 0) {
        if (p->stamp) memset(p->stamp, 0, (size_t)p->cap_stamp * sizeof *p->stamp);
        p->epoch = 1;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void sort_u32(uint32_t *v, uint32_t n) {
    if (n > 16) {
        qsort(v, n, sizeof *v, cmp_u32);
        return;
    }
    for (uint32_t i = 1; i < n; i++) {
        uint32_t x = v[i], j = i;
        while (j > 0 && v[j - 1] > x) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static bool rehash_cfgs(kp_parser *p) {
    uint32_t nb = (p->cbucket_mask + 1) * 2;
    uint32_t *b = calloc(nb, sizeof *b);
    if (!b) return false;
    for (uint32_t i = 1; i < p->n_cfgs; i++) {
        kp_gcfg *c = &p->cfgs[i];
        uint32_t h = hash_cfg(p->leaves + c->off, c->n, c->flags) & (nb - 1);
        c->hnext = b[h];
        b[h] = i;
    }
    free(p->cbucket);
    p->cbucket = b;
    p->cbucket_mask = nb - 1;
    return true;
}

/* The cfg of the sorted leaves v[0..n) with flags; UINT32_MAX on OOM. */
static uint32_t cfg_get(kp_parser *p, const uint32_t *v, uint32_t n, uint32_t flags) {
    if (n == 0 && flags == 0) return KP_PARSER_DEAD;
    uint32_t h = hash_cfg(v, n, flags);
    for (uint32_t i = p->cbucket[h & p->cbucket_mask]; i; i = p->cfgs[i].hnext) {
        const kp_gcfg *c = &p->cfgs[i];
        if (c->n == n && c->flags == flags && (n == 0 || memcmp(p->leaves + c->off, v, (size_t)n * 4) == 0)) return i;
    }
    if (p->n_leaves > UINT32_MAX - n || !kp_grow_u32((void **)&p->leaves, &p->cap_leaves, p->n_leaves + n, 4) ||
        !kp_grow_u32((void **)&p->cfgs, &p->cap_cfgs, p->n_cfgs + 1, sizeof *p->cfgs))
        return UINT32_MAX;
    if (n) memcpy(p->leaves + p->n_leaves, v, (size_t)n * 4);
    uint32_t id = p->n_cfgs++;
    kp_gcfg *c = &p->cfgs[id];
    c->off = p->n_leaves;
    c->n = n;
    c->flags = flags;
    c->row = UINT32_MAX;
    c->puts = 0;
    c->hnext = p->cbucket[h & p->cbucket_mask];
    p->cbucket[h & p->cbucket_mask] = id;
    p->n_leaves += n;
    if (p->n_cfgs > p->cbucket_mask + 1 && !rehash_cfgs(p)) return UINT32_MAX;
    return id;
}

/* Expands the work stack into p->out (leaves) and *flags. */
static kp_status closure(kp_parser *p, uint32_t *flags, kp_error *err) {
    const kp_grammar *g = p->g;
    while (p->n_work) {
        uint32_t n = p->work[--p->n_work];
        if (n == KP_PARSER_NIL) {
            *flags |= KP_GCFG_COMPLETE;
            continue;
        }
        if (n == KP_PARSER_SENTINEL) {
            *flags |= KP_GCFG_ESC;
            continue;
        }
        if (!stamp_ok(p, n)) return full(p, err);
        if (p->stamp[n] == p->epoch) continue;
        p->stamp[n] = p->epoch;
        kp_gnode nd = p->nodes[n];
        uint32_t e = g->elems[nd.pos];
        switch (KP_GE_TYPE(e)) {
        case KP_GE_TERM:
            if (p->n_out >= KP_GRAMMAR_MAX_STACKS)
                return kp_fail(err, KP_EFULL, "grammar matcher: more than %u parse stacks alive (the grammar is too ambiguous)",
                               KP_GRAMMAR_MAX_STACKS);
            if (!kp_grow_u32((void **)&p->out, &p->cap_out, p->n_out + 1, sizeof *p->out)) return full(p, err);
            p->out[p->n_out++] = n;
            break;
        case KP_GE_REF: {
            uint32_t r = KP_GE_ARG(e);
            uint32_t cont = mk(p, nd.pos + 1, nd.parent);
            if (cont == UINT32_MAX) return full(p, err);
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
                if (!push(p, mk(p, g->alt_pos[a], cont))) return full(p, err);
            break;
        }
        case KP_GE_REP: {
            const kp_grep *rp = &g->reps[KP_GE_ARG(e)];
            if (nd.need == 0 && !push(p, mk(p, nd.pos + 1, nd.parent))) return full(p, err);
            if (nd.rem != 0) {
                /* need KP_GREP_INF (only in the mask cache's stand-in stacks): never satisfied */
                uint32_t need = nd.need == KP_GREP_INF ? KP_GREP_INF : nd.need ? nd.need - 1u : 0u;
                uint32_t rem = nd.rem == KP_GREP_INF ? KP_GREP_INF : nd.rem - 1u;
                uint32_t cont = node_get(p, nd.pos, nd.parent, need, rem);
                if (cont == UINT32_MAX) return full(p, err);
                for (uint32_t a = g->rule_alt[rp->rule]; a < g->rule_alt[rp->rule + 1]; a++)
                    if (!push(p, mk(p, g->alt_pos[a], cont))) return full(p, err);
            }
            break;
        }
        default: break; /* END never sits in a node */
        }
    }
    return KP_OK;
}

static kp_status finish_cfg(kp_parser *p, uint32_t flags, uint32_t *out, kp_error *err) {
    sort_u32(p->out, p->n_out);
    uint32_t c = cfg_get(p, p->out, p->n_out, flags);
    if (c == UINT32_MAX) return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    *out = c;
    return KP_OK;
}

kp_status kp_parser_start(kp_parser *p, uint32_t *cfg, kp_error *err) {
    new_epoch(p);
    p->n_work = p->n_out = 0;
    if (!push(p, mk(p, 0, KP_PARSER_NIL))) return full(p, err);
    uint32_t flags = 0;
    kp_status st = closure(p, &flags, err);
    if (st != KP_OK) return st;
    return finish_cfg(p, flags, cfg, err);
}

kp_status kp_parser_single(kp_parser *p, uint32_t leaf, uint32_t *cfg, kp_error *err) {
    uint32_t c = cfg_get(p, &leaf, 1, 0);
    if (c == UINT32_MAX) return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    *cfg = c;
    return KP_OK;
}

static uint32_t memo_get(const kp_parser *p, uint64_t key) {
    uint32_t h = (uint32_t)(key * 0x9E3779B97F4A7C15ull >> 32) & p->memo_mask;
    for (; p->memo_key[h]; h = (h + 1) & p->memo_mask)
        if (p->memo_key[h] == key) return p->memo_val[h];
    return UINT32_MAX;
}

static void memo_put(kp_parser *p, uint32_t cfg, uint8_t b, uint32_t val) {
    kp_gcfg *c = &p->cfgs[cfg];
    if (c->row == UINT32_MAX && ++c->puts >= KP_PARSER_ROW_AFTER && p->n_rows < KP_PARSER_MAX_ROWS &&
        kp_grow_u32((void **)&p->rows, &p->cap_rows, (p->n_rows + 1) * 256, sizeof *p->rows)) {
        /* hot: a dense row, filled from the hash */
        c->row = p->n_rows++;
        uint32_t *row = p->rows + (size_t)c->row * 256;
        for (int x = 0; x < 256; x++) row[x] = memo_get(p, ((uint64_t)cfg << 8 | (uint64_t)x) + 1);
    }
    if (c->row != UINT32_MAX) {
        p->rows[(size_t)c->row * 256 + b] = val;
        return;
    }
    uint64_t key = ((uint64_t)cfg << 8 | b) + 1;
    if ((p->memo_n + 1) * 2 > p->memo_mask + 1) {
        uint32_t ns = (p->memo_mask + 1) * 2;
        if (ns > MEMO_MAX_SLOTS) return; /* full: stop memoizing */
        uint64_t *k = calloc(ns, sizeof *k);
        uint32_t *v = malloc((size_t)ns * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return;
        }
        for (uint32_t i = 0; i <= p->memo_mask; i++) {
            if (!p->memo_key[i]) continue;
            uint32_t h = (uint32_t)(p->memo_key[i] * 0x9E3779B97F4A7C15ull >> 32) & (ns - 1);
            while (k[h]) h = (h + 1) & (ns - 1);
            k[h] = p->memo_key[i];
            v[h] = p->memo_val[i];
        }
        free(p->memo_key);
        free(p->memo_val);
        p->memo_key = k;
        p->memo_val = v;
        p->memo_mask = ns - 1;
    }
    uint32_t h = (uint32_t)(key * 0x9E3779B97F4A7C15ull >> 32) & p->memo_mask;
    while (p->memo_key[h]) h = (h + 1) & p->memo_mask;
    p->memo_key[h] = key;
    p->memo_val[h] = val;
    p->memo_n++;
}

kp_status kp_parser_step(kp_parser *p, uint32_t cfg, uint8_t b, uint32_t *out, kp_error *err) {
    if (cfg == KP_PARSER_DEAD) {
        *out = KP_PARSER_DEAD;
        return KP_OK;
    }
    uint32_t known = kp_parser_peek(p, cfg, b);
    if (known != UINT32_MAX) {
        *out = known;
        return KP_OK;
    }
    if (p->cfgs[cfg].row == UINT32_MAX && (known = memo_get(p, ((uint64_t)cfg << 8 | b) + 1)) != UINT32_MAX) {
        *out = known;
        return KP_OK;
    }
    const kp_grammar *g = p->g;
    new_epoch(p);
    p->n_work = p->n_out = 0;
    kp_gcfg c = p->cfgs[cfg];
    for (uint32_t i = 0; i < c.n; i++) {
        uint32_t l = p->leaves[c.off + i];
        kp_gnode nd = p->nodes[l];
        if (kp_gset_has(&g->sets[KP_GE_ARG(g->elems[nd.pos])], b) && !push(p, mk(p, nd.pos + 1, nd.parent)))
            return full(p, err);
    }
    uint32_t flags = 0;
    kp_status st = closure(p, &flags, err);
    if (st != KP_OK) return st;
    st = finish_cfg(p, flags, out, err);
    if (st == KP_OK) memo_put(p, cfg, b, *out);
    return st;
}

/* Grows a per-cfg set cache to hold cfg. */
static bool set_cache(kp_gset **sets, uint8_t **ok, uint32_t *cap, uint32_t cfg) {
    if (cfg < *cap) return true;
    uint32_t old = *cap, nc = old, c2 = old;
    if (!kp_grow_u32((void **)sets, &nc, cfg + 1, sizeof **sets)) return false;
    if (!kp_grow_u32((void **)ok, &c2, nc, 1)) return false;
    memset(*ok + old, 0, nc - old);
    *cap = nc;
    return true;
}

const kp_gset *kp_parser_first(kp_parser *p, uint32_t cfg) {
    if (!set_cache(&p->first, &p->first_ok, &p->cap_first, cfg)) return NULL;
    kp_gset *f = &p->first[cfg];
    if (!p->first_ok[cfg]) {
        memset(f, 0, sizeof *f);
        const kp_gcfg *c = &p->cfgs[cfg];
        for (uint32_t i = 0; i < c->n; i++) {
            const kp_gset *s = &p->g->sets[KP_GE_ARG(p->g->elems[p->nodes[p->leaves[c->off + i]].pos])];
            for (int w = 0; w < 4; w++) f->w[w] |= s->w[w];
        }
        p->first_ok[cfg] = 1;
    }
    return f;
}

/* a and b hold the same leaves (flags aside: they do not change what the
 * next byte does) */
static bool same_leaves(const kp_parser *p, uint32_t a, uint32_t b) {
    const kp_gcfg *x = &p->cfgs[a], *y = &p->cfgs[b];
    return a == b || (x->n == y->n && x->n && memcmp(p->leaves + x->off, p->leaves + y->off, (size_t)x->n * 4) == 0);
}

kp_status kp_parser_loop(kp_parser *p, uint32_t cfg, const kp_gset **out, kp_error *err) {
    const kp_gset *f = kp_parser_first(p, cfg);
    if (!f || !set_cache(&p->loop, &p->loop_ok, &p->cap_loop, cfg))
        return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
    if (!p->loop_ok[cfg]) {
        kp_gset fs = *f, l = {{0}};
        for (int w = 0; w < 4; w++)
            for (uint64_t x = fs.w[w]; x; x &= x - 1) {
                uint8_t b = (uint8_t)(w * 64 + __builtin_ctzll(x));
                uint32_t nc = kp_parser_peek(p, cfg, b);
                if (nc == UINT32_MAX) {
                    kp_status st = kp_parser_step(p, cfg, b, &nc, err);
                    if (st != KP_OK) return st;
                }
                if (same_leaves(p, nc, cfg)) kp_gset_add(&l, b);
            }
        p->loop[cfg] = l;
        p->loop_ok[cfg] = 1;
    }
    *out = &p->loop[cfg];
    return KP_OK;
}

kp_status kp_parser_u8loop(kp_parser *p, uint32_t cfg, bool *out, kp_error *err) {
    if (cfg >= p->cap_u8) {
        uint32_t old = p->cap_u8;
        if (!kp_grow_u32((void **)&p->u8, &p->cap_u8, cfg + 1, 1))
            return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
        memset(p->u8 + old, 0, p->cap_u8 - old);
    }
    if (p->u8[cfg]) {
        *out = p->u8[cfg] == 1;
        return KP_OK;
    }
    /* a DFS over (cfg, decoder state) pairs below the lead bytes */
    enum { MAXP = 64 };
    uint32_t pc[MAXP];
    uint8_t pq[MAXP];
    uint32_t n = 0, top = 0;
    pc[n] = cfg;
    pq[n++] = KP_GV_U8_START;
    bool ok = true;
    while (top < n && ok) {
        uint32_t c = pc[top];
        int q = pq[top++];
        for (int b = 0x80; b <= 0xF4 && ok; b++) {
            int nq = kp_gv_u8_next(q, (uint8_t)b);
            if (nq < 0) continue;
            uint32_t nc = kp_parser_peek(p, c, (uint8_t)b);
            if (nc == UINT32_MAX) {
                kp_status st = kp_parser_step(p, c, (uint8_t)b, &nc, err);
                if (st != KP_OK) return st;
            }
            if (nq == KP_GV_U8_START) {
                ok = same_leaves(p, nc, cfg);
                continue;
            }
            if (p->cfgs[nc].n == 0) {
                ok = false;
                break;
            }
            uint32_t i = 0;
            while (i < n && !(pc[i] == nc && pq[i] == nq)) i++;
            if (i == n) {
                if (n == MAXP) {
                    ok = false; /* not a simple character loop */
                    break;
                }
                pc[n] = nc;
                pq[n++] = (uint8_t)nq;
            }
        }
    }
    p->u8[cfg] = ok ? 1 : 2;
    *out = ok;
    return KP_OK;
}

kp_status kp_parser_relax(kp_parser *p, uint32_t cfg, uint32_t *relaxed, uint32_t *min_rem, kp_error *err) {
    if (cfg >= p->cap_relax) {
        /* both arrays grown before the capacity they share says so: when the
         * second cannot grow, the first's new room is simply unused */
        uint32_t old = p->cap_relax, c1 = old, c2 = old;
        if (!kp_grow_u32((void **)&p->relax, &c1, cfg + 1, sizeof *p->relax) ||
            !kp_grow_u32((void **)&p->relax_rem, &c2, c1, sizeof *p->relax_rem))
            return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
        memset(p->relax + old, 0xFF, (size_t)(c1 - old) * sizeof *p->relax);
        p->cap_relax = c1;
    }
    if (p->relax[cfg] != UINT32_MAX) {
        *relaxed = p->relax[cfg];
        *min_rem = p->relax_rem[cfg];
        return KP_OK;
    }
    const kp_gcfg c = p->cfgs[cfg];
    uint32_t mn = KP_GREP_INF, chain[512];
    new_epoch(p); /* p->out holds the relaxed leaves */
    p->n_out = 0;
    for (uint32_t i = 0; i < c.n; i++) {
        uint32_t n_chain = 0, n = p->leaves[c.off + i];
        for (; n > KP_PARSER_SENTINEL && n_chain < 512; n = p->nodes[n].parent) chain[n_chain++] = n;
        if (n > KP_PARSER_SENTINEL) { /* deeper than the walk's stand-in stacks go: leave it */
            *relaxed = cfg;
            *min_rem = 0;
            return KP_OK;
        }
        uint32_t parent = n;
        for (uint32_t k = n_chain; k-- > 0;) {
            kp_gnode nd = p->nodes[chain[k]];
            if (KP_GE_TYPE(p->g->elems[nd.pos]) == KP_GE_REP) {
                if (nd.rem != KP_GREP_INF && nd.rem < mn) mn = nd.rem;
                /* a repetition that may end still may (its exit is among the
                 * leaves); one that may not never will */
                if (nd.need) nd.need = KP_GREP_INF;
                nd.rem = KP_GREP_INF;
            }
            parent = node_get(p, nd.pos, parent, nd.need, nd.rem);
            if (parent == UINT32_MAX) return full(p, err);
        }
        if (!kp_grow_u32((void **)&p->out, &p->cap_out, p->n_out + 1, sizeof *p->out)) return full(p, err);
        p->out[p->n_out++] = parent;
    }
    uint32_t r;
    kp_status st = finish_cfg(p, mn == KP_GREP_INF ? c.flags : 0, &r, err);
    if (st != KP_OK) return st;
    p->relax[cfg] = r;
    p->relax_rem[cfg] = mn;
    *relaxed = r;
    *min_rem = mn;
    return KP_OK;
}

kp_status kp_parser_import(kp_parser *dst, const kp_parser *src, uint32_t cfg, uint32_t *out, kp_error *err) {
    const kp_gcfg *c = &src->cfgs[cfg];
    uint32_t *chain = NULL, n_chain = 0, cap_chain = 0;
    dst->n_out = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        n_chain = 0;
        for (uint32_t n = src->leaves[c->off + i]; n > KP_PARSER_SENTINEL; n = src->nodes[n].parent) {
            if (!kp_grow_u32((void **)&chain, &cap_chain, n_chain + 1, sizeof *chain)) goto oom;
            chain[n_chain++] = n;
        }
        uint32_t parent = n_chain ? src->nodes[chain[n_chain - 1]].parent : src->leaves[c->off + i];
        for (uint32_t k = n_chain; k-- > 0;) {
            const kp_gnode *s = &src->nodes[chain[k]];
            parent = node_get(dst, s->pos, parent, s->need, s->rem);
            if (parent == UINT32_MAX) {
                free(chain);
                return full(dst, err);
            }
        }
        if (!kp_grow_u32((void **)&dst->out, &dst->cap_out, dst->n_out + 1, sizeof *dst->out)) goto oom;
        dst->out[dst->n_out++] = parent;
    }
    free(chain);
    return finish_cfg(dst, c->flags, out, err);
oom:
    free(chain);
    return kp_fail(err, KP_ENOMEM, "grammar matcher: out of memory");
}
