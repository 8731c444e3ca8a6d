/*
 * dashboard.c - GET /v1/cache/events (dashboard.h).
 *
 * Owns nothing: reads the scheduler's snapshot (kp_sched_cache_get, a
 * short copy under its mutex) and the history (kp_hist_json), detokenizes
 * the first tokens of each tree node on the calling HTTP thread, and
 * returns one JSON object. The page itself lives in web/dashboard.html.
 */
#include "serve/dashboard.h"

#include <stdlib.h>

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
        json_t *t = text ? json_stringn(text, len) : NULL;
        free(text);
        json_array_append_new(
            nodes, json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:b, s:I, s:I, s:I, s:I, s:I}", "id", (json_int_t)i,
                             "parent", (json_int_t)n->parent, "start", (json_int_t)n->start, "end",
                             (json_int_t)n->end, "tokens", (json_int_t)(n->end - n->start), "text",
                             t ? t : json_string(""), "more", n->end - n->start > n->n_head, "holders",
                             (json_int_t)n->n_holders, "pins", (json_int_t)n->n_pins, "children",
                             (json_int_t)n->n_children, "hits", (json_int_t)n->hits, "age",
                             (json_int_t)(newest - n->last_used)));
    }
    return json_pack("{s:o, s:I, s:I}", "nodes", nodes, "shown", (json_int_t)snap->n_tree, "total",
                     (json_int_t)snap->kv.n_nodes);
}

json_t *kp_dash_events(kp_sched *sched, kp_hist *h, const kp_tok_vocab *v, const kp_model *m, uint32_t n_ctx,
                       int64_t now) {
    kp_sched_cache *snap = malloc(sizeof *snap);
    if (!snap) return NULL;
    kp_sched_cache_get(sched, snap);
    const kp_hparams *hp = &m->hp;
    uint64_t per = snap->kv.bytes_per_token, cells = 2ull * hp->n_layer * hp->n_head_kv * hp->head_dim;
    json_t *model = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "arch", hp->arch_name, "n_layer",
                              (json_int_t)hp->n_layer, "n_head_kv", (json_int_t)hp->n_head_kv, "head_dim",
                              (json_int_t)hp->head_dim, "kv_element_bytes", (json_int_t)(cells ? per / cells : 0),
                              "bytes_per_token", (json_int_t)per, "n_ctx", (json_int_t)n_ctx);
    json_t *tree = tree_json(snap, v);
    free(snap);
    return json_pack("{s:s, s:I, s:o, s:o, s:o}", "object", "kvpin.cache.events", "time", (json_int_t)now, "model",
                     model, "tree", tree, "history", kp_hist_json(h, now));
}
