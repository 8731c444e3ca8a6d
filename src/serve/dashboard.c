/*
 * dashboard.c - GET /v1/cache/events (dashboard.h).
 *
 * Owns nothing: reads the scheduler's snapshot (kp_sched_cache_get, a
 * short copy under its mutex) and the history (kp_history_json), detokenizes
 * the first tokens of each tree node on the calling HTTP thread, and
 * returns one JSON object; GET /v1/cache/node/{chain} asks the engine
 * thread for one node's whole path. The page itself lives in
 * web/dashboard.html.
 */
#include "serve/dashboard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static json_t *tree_json(const kp_sched_cache *snap, const kp_tok_vocab *v) {
    json_t *nodes = json_array();
    uint64_t newest = 0;
    for (uint32_t i = 0; i < snap->n_tree; i++)
        if (snap->tree[i].last_used > newest) newest = snap->tree[i].last_used;
    for (uint32_t i = 0; i < snap->n_tree; i++) {
        const kp_eng_node *n = &snap->tree[i];
        char *text = NULL;
        size_t len = 0;
        kp_error err = {0};
        kp_tok_detokenize(v, n->head, n->n_head, false, true, &text, &len, &err); /* <s> shows */
        /* a run may start or end inside a character: U+FFFD for those bytes,
         * so the label still reads (json_stringn refuses bytes that are not UTF-8) */
        json_t *t = text ? kp_oai_string_repaired(text, len) : NULL;
        free(text);
        json_array_append_new(
            nodes, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:b, s:I, s:I, s:I, s:I, s:I}", "id", (json_int_t)i,
                             "parent", (json_int_t)n->parent, "start", (json_int_t)n->start, "end",
                             (json_int_t)n->end, "tokens", (json_int_t)(n->end - n->start), "first",
                             (json_int_t)(n->n_head ? n->head[0] : -1), "text",
                             t ? t : json_string(""), "more", n->end - n->start > n->n_head, "holders",
                             (json_int_t)n->n_holders, "pins", (json_int_t)n->n_pins, "children",
                             (json_int_t)n->n_children, "hits", (json_int_t)n->hits, "age",
                             (json_int_t)(newest - n->last_used)));
    }
    return json_pack("{s:o, s:I, s:I}", "nodes", nodes, "shown", (json_int_t)snap->n_tree, "total",
                     (json_int_t)snap->kv.n_nodes);
}

json_t *kp_dash_events(kp_sched *sched, kp_history *h, const kp_tok_vocab *v, const kp_model *m, uint32_t n_ctx,
                       int64_t now) {
    kp_sched_cache *snap = malloc(sizeof *snap);
    if (!snap) return NULL;
    kp_sched_cache_get(sched, snap);
    const kp_hparams *hp = &m->hp;
    uint64_t per = snap->kv.bytes_per_token;
    /* bytes per stored value of each type: 2 for f16, 34/32 for q8_0 (a
     * 32-value block with its scale), 18/32 for q4_0 */
    double kb = (double)kp_dtype_row_size(snap->kv.kv_type, 32) / 32,
           vb = (double)kp_dtype_row_size(snap->kv.kv_type_v, 32) / 32;
    /* n_kv_layer: the layers that keep K/V (all but a hybrid model's
     * recurrent ones, n_rec_layer), the ones the bill's formula counts */
    json_t *model = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:f, s:f, s:I, s:I}", "arch", hp->arch_name,
                              "n_layer", (json_int_t)hp->n_layer, "n_kv_layer", (json_int_t)hp->n_kv_layer,
                              "n_rec_layer", (json_int_t)hp->n_rec_layers, "n_head_kv", (json_int_t)hp->n_head_kv, "head_dim",
                              (json_int_t)hp->head_dim, "kv_type_k", kp_dtype_name(snap->kv.kv_type), "kv_type_v",
                              kp_dtype_name(snap->kv.kv_type_v), "k_value_bytes", kb, "v_value_bytes", vb,
                              "bytes_per_token", (json_int_t)per, "n_ctx", (json_int_t)n_ctx);
    json_t *tree = tree_json(snap, v);
    free(snap);
    return json_pack("{s:s, s:I, s:o, s:o, s:o}", "object", "kvpin.cache.events", "time", (json_int_t)now, "model",
                     model, "tree", tree, "history", kp_history_json(h, now));
}

/* The text of path[0..start) and of path[start..end) as JSON strings,
 * U+FFFD for bytes that are not UTF-8 on their own. The run's text is the
 * whole path's text past the text before it, so that a tokenizer that
 * writes a token differently at the start of a text (SentencePiece's
 * leading space) shows it as it reads in the path. False when out of
 * memory or the tokens do not detokenize. */
static bool path_text(const kp_tok_vocab *v, const int32_t *path, uint32_t start, uint32_t end, json_t **before,
                      json_t **run) {
    char *b = NULL, *all = NULL;
    size_t nb = 0, na = 0;
    kp_error err = {0};
    *before = *run = NULL;
    if (kp_tok_detokenize(v, path, start, false, true, &b, &nb, &err) == KP_OK &&
        kp_tok_detokenize(v, path, end, false, true, &all, &na, &err) == KP_OK) {
        if (na >= nb && !memcmp(all, b, nb)) {
            *before = kp_oai_string_repaired(b, nb);
            *run = kp_oai_string_repaired(all + nb, na - nb);
        } else { /* the run's first token changed the text before it: show it alone */
            free(all);
            all = NULL;
            if (kp_tok_detokenize(v, path + start, end - start, false, true, &all, &na, &err) == KP_OK) {
                *before = kp_oai_string_repaired(b, nb);
                *run = kp_oai_string_repaired(all, na);
            }
        }
    }
    free(b);
    free(all);
    if (*before && *run) return true;
    json_decref(*before);
    json_decref(*run);
    *before = *run = NULL;
    return false;
}

json_t *kp_dash_node(kp_sched *sched, const kp_tok_vocab *v, const char *chain, kp_oai_error *e) {
    int32_t firsts[KP_ENG_PATH_DEPTH];
    uint32_t depth = 0;
    const char *p = chain;
    int n_vocab = kp_tok_n_vocab(v);
    while (*p) {
        char *end;
        errno = 0;
        long id = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (id < 0 || errno || id >= n_vocab || end == p || (*end && *end != '.') || depth == KP_ENG_PATH_DEPTH) {
            kp_oai_fail(e, 400, "invalid_request_error", NULL, NULL,
                        "a node is named by its first-token chain, 1 to %d token ids of this model (0..%d) "
                        "joined by '.', e.g. /v1/cache/node/1.2.3",
                        KP_ENG_PATH_DEPTH, n_vocab - 1);
            return NULL;
        }
        firsts[depth++] = (int32_t)id;
        p = *end ? end + 1 : end;
        if (*end && !*p) depth = KP_ENG_PATH_DEPTH + 1; /* a trailing '.' */
    }
    if (depth == 0 || depth > KP_ENG_PATH_DEPTH) {
        kp_oai_fail(e, 400, "invalid_request_error", NULL, NULL,
                    "a node is named by its first-token chain, 1 to %d token ids joined by '.'", KP_ENG_PATH_DEPTH);
        return NULL;
    }
    uint32_t max = kp_sched_max_pos(sched), start = 0, stop = 0;
    int32_t *path = malloc((size_t)max * sizeof *path);
    if (!path) {
        kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    kp_error err = {0};
    kp_status st = kp_sched_node_path(sched, firsts, depth, path, max, &start, &stop, &err);
    if (st != KP_OK) {
        free(path);
        if (st == KP_ENOTFOUND)
            kp_oai_fail(e, 404, "invalid_request_error", "node_not_found", NULL, "%s", err.msg);
        else if (st == KP_EFULL)
            kp_oai_fail(e, 503, "server_error", "shutting_down", NULL, "%s", err.msg);
        else
            kp_oai_fail(e, st == KP_EINVAL ? 400 : 500, st == KP_EINVAL ? "invalid_request_error" : "server_error",
                        NULL, NULL, "%s", err.msg);
        return NULL;
    }
    if (stop > max) stop = max; /* never: the index holds no path longer than a sequence */
    if (start > stop) start = stop;
    json_t *before, *text;
    bool done = path_text(v, path, start, stop, &before, &text);
    free(path);
    if (!done) {
        kp_oai_fail(e, 500, "server_error", NULL, NULL, "the node's tokens could not be turned into text");
        return NULL;
    }
    return json_pack("{s:s, s:I, s:I, s:I, s:o, s:o}", "object", "kvpin.cache.node", "start", (json_int_t)start,
                     "end", (json_int_t)stop, "tokens", (json_int_t)(stop - start), "before", before, "text", text);
}
