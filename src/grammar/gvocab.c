/*
 * gvocab.c - builds the vocabulary index (layout in gvocab.h): collect the
 * pieces, sort them by bytes, lay the trie out in preorder in one pass over
 * the sorted list (each token adds the nodes below its longest common
 * prefix with the previous one).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/gvocab.h"

typedef struct {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
} tokref;

static int cmp_tok(const void *a, const void *b) {
    const tokref *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void kp_gvocab_free(kp_gvocab *gv) {
    if (!gv) return;
    free(gv->rank_id);
    free(gv->rank_off);
    free(gv->rank_len);
    free(gv->bytes);
    free(gv->nodes);
    free(gv->kind);
    free(gv->id_rank);
    free(gv->eog);
    free(gv->ctab);
    free(gv->subs);
    free(gv);
}

/* The trie as the build lays it out (separate arrays), packed into nodes[]
 * with the shortcuts at the end. */
typedef struct {
    uint8_t *nbyte;
    uint16_t *ndepth;
    uint32_t *nend, *nrank, *nhere;
} trie;

static void trie_free(trie *t) {
    free(t->nbyte);
    free(t->ndepth);
    free(t->nend);
    free(t->nrank);
    free(t->nhere);
}

/* nodes[] with the child tables and the subtree byte sets (see gvocab.h). */
static bool pack(kp_gvocab *gv, const trie *tr) {
    uint32_t n = gv->n_nodes;
    uint64_t *all = calloc((size_t)n + 1, 32); /* every node's set, for the bottom-up pass */
    uint32_t *kids = calloc((size_t)n + 1, sizeof *kids);
    gv->nodes = calloc((size_t)n + 1, sizeof *gv->nodes);
    if (!all || !kids || !gv->nodes) {
        free(all);
        free(kids);
        return false;
    }
    memset(gv->root_tab, 0xFF, sizeof gv->root_tab);
    for (uint32_t k = 0; k < n; k = tr->nend[k]) gv->root_tab[tr->nbyte[k]] = k;
    uint32_t n_tabs = 0, n_subs = 0;
    for (uint32_t k = 0; k < n; k++) {
        for (uint32_t c = k + 1; c < tr->nend[k]; c = tr->nend[c]) kids[k]++;
        if (kids[k] >= KP_GV_TABLE_KIDS) n_tabs++;
        if (tr->nend[k] - k - 1 >= KP_GV_SUB_NODES) n_subs++;
    }
    /* bottom-up: a node's set is its children's bytes and their sets */
    for (uint32_t k = n; k-- > 0;) {
        gv->nodes[k].max_depth = tr->ndepth[k];
        uint8_t u8 = 0xFF; /* no bytes below: well-formed from every state */
        for (uint32_t c = k + 1; c < tr->nend[k]; c = tr->nend[c]) {
            uint8_t ok = 0;
            for (int q = 0; q < KP_GV_U8_N; q++) {
                int nq = kp_gv_u8_next(q, tr->nbyte[c]);
                if (nq >= 0 && (gv->nodes[c].utf8 >> nq & 1)) ok |= (uint8_t)(1u << q);
            }
            u8 &= ok;
            uint64_t *d = all + (size_t)k * 4, *s = all + (size_t)c * 4;
            for (int w = 0; w < 4; w++) d[w] |= s[w];
            d[tr->nbyte[c] >> 6] |= 1ull << (tr->nbyte[c] & 63);
            if (gv->nodes[c].max_depth > gv->nodes[k].max_depth) gv->nodes[k].max_depth = gv->nodes[c].max_depth;
        }
        gv->nodes[k].utf8 = u8;
    }
    gv->ctab = malloc(((size_t)n_tabs + 1) * 256 * sizeof *gv->ctab);
    gv->subs = malloc(((size_t)n_subs + 1) * 32);
    bool ok = gv->ctab && gv->subs;
    for (uint32_t k = 0; ok && k < n; k++) {
        kp_gvnode *nd = &gv->nodes[k];
        nd->end = tr->nend[k];
        nd->rank = tr->nrank[k];
        nd->rank_end = tr->nrank[tr->nend[k]];
        nd->here = tr->nhere[k];
        nd->depth = tr->ndepth[k];
        nd->byte = tr->nbyte[k];
        nd->tab = nd->sub = UINT32_MAX;
        if (kids[k] >= KP_GV_TABLE_KIDS) {
            uint32_t *t = gv->ctab + (size_t)gv->n_tabs * 256;
            memset(t, 0xFF, 256 * sizeof *t);
            for (uint32_t c = k + 1; c < tr->nend[k]; c = tr->nend[c]) t[tr->nbyte[c]] = c;
            nd->tab = gv->n_tabs++;
        }
        if (tr->nend[k] - k - 1 >= KP_GV_SUB_NODES) {
            memcpy(gv->subs + (size_t)gv->n_subs * 4, all + (size_t)k * 4, 32);
            nd->sub = gv->n_subs++;
        }
    }
    free(all);
    free(kids);
    return ok;
}

kp_status kp_gvocab_new_raw(kp_gvocab **out, int32_t n_vocab, const char *const *pieces, const size_t *lens,
                            const uint8_t *eog, kp_error *err) {
    if (!out || n_vocab < 0 || (n_vocab > 0 && (!pieces || !lens)))
        return kp_fail(err, KP_EINVAL, "kp_gvocab_new_raw: bad arguments");
    *out = NULL;
    kp_gvocab *gv = calloc(1, sizeof *gv);
    tokref *t = malloc(((size_t)n_vocab + 1) * sizeof *t);
    uint32_t *path = NULL;
    trie tr = {0};
    if (!gv || !t) goto oom;
    gv->n_vocab = n_vocab;
    gv->kind = calloc((size_t)n_vocab + 1, 1);
    gv->id_rank = malloc(((size_t)n_vocab + 1) * sizeof *gv->id_rank);
    gv->eog = malloc(((size_t)n_vocab + 1) * sizeof *gv->eog);
    if (!gv->kind || !gv->id_rank || !gv->eog) goto oom;
    size_t total = 0;
    uint32_t n = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        gv->id_rank[id] = UINT32_MAX;
        if (eog && eog[id]) {
            gv->kind[id] = KP_GV_EOG;
            gv->eog[gv->n_eog++] = id;
            continue;
        }
        if (lens[id] == 0 || lens[id] > KP_GV_MAX_PIECE || !pieces[id]) continue;
        gv->kind[id] = KP_GV_TRIE;
        t[n++] = (tokref){(const uint8_t *)pieces[id], (uint32_t)lens[id], id};
        total += lens[id];
    }
    qsort(t, n, sizeof *t, cmp_tok);
    gv->n_rank = n;
    gv->rank_id = malloc(((size_t)n + 1) * sizeof *gv->rank_id);
    gv->rank_off = malloc(((size_t)n + 1) * sizeof *gv->rank_off);
    gv->rank_len = malloc(((size_t)n + 1) * sizeof *gv->rank_len);
    gv->bytes = malloc(total + 1);
    /* nodes: at most total (one per byte) */
    tr.nbyte = malloc(total + 1);
    tr.ndepth = malloc((total + 1) * sizeof *tr.ndepth);
    tr.nend = malloc((total + 1) * sizeof *tr.nend);
    tr.nrank = malloc((total + 2) * sizeof *tr.nrank);
    tr.nhere = calloc(total + 1, sizeof *tr.nhere);
    path = malloc((KP_GV_MAX_PIECE + 2) * sizeof *path);
    if (!gv->rank_id || !gv->rank_off || !gv->rank_len || !gv->bytes || !tr.nbyte || !tr.ndepth || !tr.nend ||
        !tr.nrank || !tr.nhere || !path)
        goto oom;
    size_t off = 0;
    uint32_t nn = 0, depth = 0;
    for (uint32_t r = 0; r < n; r++) {
        gv->rank_id[r] = t[r].id;
        gv->id_rank[t[r].id] = r;
        gv->rank_off[r] = (uint32_t)off;
        gv->rank_len[r] = t[r].len;
        memcpy(gv->bytes + off, t[r].p, t[r].len);
        if (t[r].len > gv->max_len) gv->max_len = t[r].len;
        uint32_t lcp = 0;
        if (r > 0) {
            uint32_t m = t[r].len < t[r - 1].len ? t[r].len : t[r - 1].len;
            while (lcp < m && t[r].p[lcp] == t[r - 1].p[lcp]) lcp++;
        }
        off += t[r].len;
        /* close the previous token's nodes below the common prefix */
        while (depth > lcp) tr.nend[path[depth--]] = nn;
        for (uint32_t d = lcp + 1; d <= t[r].len; d++) {
            tr.nbyte[nn] = t[r].p[d - 1];
            tr.ndepth[nn] = (uint16_t)d;
            tr.nrank[nn] = r;
            path[d] = nn++;
        }
        depth = t[r].len;
        tr.nhere[path[depth]]++;
    }
    while (depth > 0) tr.nend[path[depth--]] = nn;
    gv->n_nodes = nn;
    tr.nrank[nn] = n;
    free(t);
    t = NULL;
    free(path);
    path = NULL;
    if (!pack(gv, &tr)) goto oom;
    trie_free(&tr);
    *out = gv;
    return KP_OK;
oom:
    free(t);
    free(path);
    trie_free(&tr);
    kp_gvocab_free(gv);
    return kp_fail(err, KP_ENOMEM, "grammar vocabulary index: out of memory");
}

kp_status kp_gvocab_new(kp_gvocab **out, const kp_tok_vocab *v, kp_error *err) {
    if (!out || !v) return kp_fail(err, KP_EINVAL, "kp_gvocab_new: NULL argument");
    int32_t n = kp_tok_n_vocab(v);
    const char **pieces = malloc(((size_t)n + 1) * sizeof *pieces);
    size_t *lens = malloc(((size_t)n + 1) * sizeof *lens);
    uint8_t *eog = malloc((size_t)n + 1);
    kp_status st;
    if (!pieces || !lens || !eog) {
        st = kp_fail(err, KP_ENOMEM, "grammar vocabulary index: out of memory");
    } else {
        for (int32_t id = 0; id < n; id++) {
            pieces[id] = kp_tok_piece_view(v, id, false, &lens[id]);
            if (!pieces[id]) lens[id] = 0;
            eog[id] = kp_tok_is_eog(v, id);
        }
        st = kp_gvocab_new_raw(out, n, pieces, lens, eog, err);
    }
    free(pieces);
    free(lens);
    free(eog);
    return st;
}

int32_t kp_gvocab_n_vocab(const kp_gvocab *gv) { return gv->n_vocab; }
size_t kp_gvocab_mask_words(const kp_gvocab *gv) { return ((size_t)gv->n_vocab + 31) / 32; }
size_t kp_gvocab_n_nodes(const kp_gvocab *gv) { return gv->n_nodes; }
size_t kp_gvocab_max_len(const kp_gvocab *gv) { return gv->max_len; }
