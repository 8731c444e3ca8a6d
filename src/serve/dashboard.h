/*
 * dashboard.h - the cache dashboard: the page kvpin serve answers GET /
 * with, and the JSON it polls, GET /v1/cache/events (floor 7).
 *
 * The page (web/dashboard.html: HTML, CSS and JavaScript in one file, no
 * network but its own server) is compiled into the library: the Makefile
 * turns it into a C array (tools/embed.py -> build/gen/dashboard_page.c).
 * It polls GET /v1/cache (the memory bill and counts) and GET
 * /v1/cache/events (what the bill does not say: the model's numbers for
 * the bytes-per-token formula, the first nodes of the prefix tree, and the
 * request history of history.h). Both read the scheduler's published
 * snapshot and the history; neither waits for the engine thread.
 */
#ifndef KP_DASHBOARD_H
#define KP_DASHBOARD_H

#include <jansson.h>
#include <stddef.h>

#include "model/model.h"
#include "serve/history.h"
#include "serve/scheduler.h"
#include "serve/oai.h"
#include "tok/tok.h"

/* The page's bytes (static, UTF-8 HTML, not NUL-terminated in general) and
 * their length; build/gen/dashboard_page.c defines them. */
extern const unsigned char kp_dash_page_bytes[];
extern const size_t kp_dash_page_size;

/* GET /v1/cache/events as JSON (a new reference; NULL when out of memory):
 *
 *   {"object": "kvpin.cache.events", "time": unix seconds,
 *    "model": {"arch", "n_layer", "n_head_kv", "head_dim", "kv_type_k", "kv_type_v"
 *              (type names), "k_value_bytes", "v_value_bytes" (bytes per stored value:
 *              2 for F16, 1.0625 for Q8_0's 34-byte blocks of 32, ...),
 *              "bytes_per_token", "n_ctx"},
 *    "tree": {"nodes": [preorder: {"id", "parent" (-1: the root), "start", "end",
 *              "tokens", "first" (its run's first token id), "text" (its first tokens'
 *              text), "more" (the run is longer),
 *              "holders", "pins", "children", "hits", "age" (index clock ticks since
 *              its last use, 0 the most recent)}], "shown", "total"},
 *    "history": kp_history_json}
 *
 * Everything is borrowed; now is wall-clock seconds. */
json_t *kp_dash_events(kp_sched *sched, kp_history *h, const kp_tok_vocab *v, const kp_model *m, uint32_t n_ctx,
                       int64_t now);

/* GET /v1/cache/node/{chain}: the whole text of one node of the tree,
 * which the page shows when a node is clicked. chain is the node's
 * first-token chain (kp_eng_node_path), the "first" ids of its ancestors
 * and itself joined by '.', e.g. "128000.9906.1917". Answers
 *
 *   {"object": "kvpin.cache.node", "start", "end", "tokens" (end - start),
 *    "before": the text of path positions [0, start), "text": its own run's}
 *
 * (bytes that are not UTF-8 on their own, a character split at start,
 * become U+FFFD), or NULL with *e set: 400 for a malformed chain, 404 when
 * no cached node has it (evicted since the page drew it), 503 when the
 * server is shutting down. Served by the engine thread between two steps. */
json_t *kp_dash_node(kp_sched *sched, const kp_tok_vocab *v, const char *chain, kp_oai_error *e);

#endif
