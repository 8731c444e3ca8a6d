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
    free(gv->nbyte);
    free(gv->ndepth);
    free(gv->nend);
    free(gv->nrank);
    free(gv->nhere);
    free(gv->kind);
    free(gv->id_rank);
    free(gv->eog);
    free(gv);
}

kp_status kp_gvocab_new_raw(kp_gvocab **out, int32_t n_vocab, const char *const *pieces, const size_t *lens,
                            const uint8_t *eog, kp_error *err) {
    if (!out || n_vocab < 0 || (n_vocab > 0 && (!pieces || !lens)))
        return kp_fail(err, KP_EINVAL, "kp_gvocab_new_raw: bad arguments");
    *out = NULL;
    kp_gvocab *gv = calloc(1, sizeof *gv);
    tokref *t = malloc(((size_t)n_vocab + 1) * sizeof *t);
    uint32_t *path = NULL;
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
    gv->nbyte = malloc(total + 1);
    gv->ndepth = malloc((total + 1) * sizeof *gv->ndepth);
    gv->nend = malloc((total + 1) * sizeof *gv->nend);
    gv->nrank = malloc((total + 2) * sizeof *gv->nrank);
    gv->nhere = calloc(total + 1, sizeof *gv->nhere);
    path = malloc((KP_GV_MAX_PIECE + 2) * sizeof *path);
    if (!gv->rank_id || !gv->rank_off || !gv->rank_len || !gv->bytes || !gv->nbyte || !gv->ndepth || !gv->nend ||
        !gv->nrank || !gv->nhere || !path)
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
        while (depth > lcp) gv->nend[path[depth--]] = nn;
        for (uint32_t d = lcp + 1; d <= t[r].len; d++) {
            gv->nbyte[nn] = t[r].p[d - 1];
            gv->ndepth[nn] = (uint16_t)d;
            gv->nrank[nn] = r;
            path[d] = nn++;
        }
        depth = t[r].len;
        gv->nhere[path[depth]]++;
    }
    while (depth > 0) gv->nend[path[depth--]] = nn;
    gv->n_nodes = nn;
    gv->nrank[nn] = n;
    free(t);
    free(path);
    *out = gv;
    return KP_OK;
oom:
    free(t);
    free(path);
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
