/*
 * endpoints.c - the plain endpoints: tokenize, detokenize, models,
 * health, the cache endpoints, metrics and the dashboard (endpoints.h).
 *
 * Owns nothing: each handler reads its body, asks the scheduler (whose
 * engine thread serves the cache's probe, pin and unpin between two
 * steps; no HTTP thread touches the engine) or the vocabulary, and answers
 * one JSON body (metrics: Prometheus text; the dashboard: its page).
 */
#include "serve/endpoints.h"

#include "serve/answers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/doctor.h"
#include "serve/dashboard.h"
#include "serve/prompt.h"
#include "serve/response_store.h"
#include "serve/pinid.h"

/* ---- tokens and the model ------------------------------------------------------ */

KP_HANDLER(kp_ep_tokenize) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return kp_http_error(s, c, &e);
    static const char *const allowed[] = {"content", "add_special", "parse_special", "with_pieces", NULL};
    const json_t *content = json_object_get(o, "content");
    const json_t *as = json_object_get(o, "add_special"), *ps = json_object_get(o, "parse_special");
    const json_t *wp = json_object_get(o, "with_pieces");
    if (!kp_oai_only_fields(o, allowed, &e) ||
        (!json_is_string(content) &&
         !kp_oai_fail(&e, 400, "invalid_request_error", NULL, "content", "content must be a string")) ||
        (as && !json_is_boolean(as) &&
         !kp_oai_fail(&e, 400, "invalid_request_error", NULL, "add_special", "add_special must be true or false")) ||
        (ps && !json_is_boolean(ps) &&
         !kp_oai_fail(&e, 400, "invalid_request_error", NULL, "parse_special", "parse_special must be true or false")) ||
        (wp && !json_is_boolean(wp) &&
         !kp_oai_fail(&e, 400, "invalid_request_error", NULL, "with_pieces", "with_pieces must be true or false"))) {
        json_decref(o);
        return kp_http_error(s, c, &e);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kp_error err = {0};
    kp_status st = kp_tok_encode(s->v, json_string_value(content), json_string_length(content), as && json_is_true(as),
                              !ps || json_is_true(ps), &ids, &n, &err);
    if (st != KP_OK) {
        json_decref(o);
        kp_oai_from_status(st, &err, "content", &e);
        return kp_http_error(s, c, &e);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        if (wp && json_is_true(wp)) {
            size_t pl;
            const char *pc = kp_tok_piece_view(s->v, ids[i], true, &pl);
            json_t *piece = json_stringn(pc ? pc : "", pc ? pl : 0);
            if (!piece) { /* a piece that is not valid UTF-8 alone: its bytes */
                piece = json_array();
                for (size_t k = 0; k < pl; k++) json_array_append_new(piece, json_integer((unsigned char)pc[k]));
            }
            json_array_append_new(arr, json_pack("{s:i, s:o}", "id", ids[i], "piece", piece));
        } else {
            json_array_append_new(arr, json_integer(ids[i]));
        }
    }
    free(ids);
    json_decref(o);
    return kp_http_json(s, c, 200, json_pack("{s:o}", "tokens", arr));
}

KP_HANDLER(kp_ep_detokenize) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return kp_http_error(s, c, &e);
    static const char *const allowed[] = {"tokens", NULL};
    const json_t *t = json_object_get(o, "tokens");
    if (!kp_oai_only_fields(o, allowed, &e) ||
        (!json_is_array(t) &&
         !kp_oai_fail(&e, 400, "invalid_request_error", NULL, "tokens", "tokens must be an array of token ids"))) {
        json_decref(o);
        return kp_http_error(s, c, &e);
    }
    size_t n = json_array_size(t);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
        const json_t *x = json_array_get(t, i);
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || id >= kp_tok_n_vocab(s->v)) {
            free(ids);
            json_decref(o);
            return kp_http_fail(s, c, 400, "invalid_request_error", NULL, "tokens",
                        "tokens[%zu] is not a token id of this model (0..%d)", i, kp_tok_n_vocab(s->v) - 1);
        }
        ids[i] = (int32_t)id;
    }
    json_decref(o);
    if (!ids) return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    char *text = NULL;
    size_t len = 0;
    kp_error err = {0};
    kp_status st = kp_tok_detokenize(s->v, ids, n, false, true, &text, &len, &err);
    free(ids);
    if (st != KP_OK) {
        kp_oai_from_status(st, &err, "tokens", &e);
        return kp_http_error(s, c, &e);
    }
    /* bytes that are not valid UTF-8 (a split character, a stray byte
     * token) become U+FFFD, one per maximal invalid subpart */
    json_t *content = kp_oai_string_repaired(text, len);
    free(text);
    if (!content) return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    return kp_http_json(s, c, 200, json_pack("{s:o}", "content", content ? content : json_string("")));
}

/* GET /v1/models (id NULL) or /v1/models/{id}. */
KP_HANDLER(kp_ep_models) {
    if (id && strcmp(id, s->cfg.model_name))
        return kp_http_fail(s, c, 404, "invalid_request_error", "model_not_found", "model",
                    "the model \"%.200s\" does not exist; this server has \"%s\"", id, s->cfg.model_name);
    const kp_hparams *hp = &s->m->hp;
    json_t *meta = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "arch", hp->arch_name, "n_vocab",
                             (json_int_t)hp->n_vocab, "n_ctx_train", (json_int_t)hp->n_ctx_train, "n_ctx",
                             (json_int_t)s->ctx, "n_layer", (json_int_t)hp->n_layer, "weight_bytes",
                             (json_int_t)s->m->weight_bytes);
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", s->cfg.model_name, "object", "model", "created",
                          (json_int_t)s->started, "owned_by", "kvpin", "meta", meta);
    if (id) return kp_http_json(s, c, 200, m);
    return kp_http_json(s, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

/* ---- cache endpoints ------------------------------------------------------------ */

/* /v1/cache "kv.by_kind": per layer kind, what a token costs and what the
 * cache holds of it; "window" only for a model with WINDOW layers. A
 * sequence of n positions needs full x n and window x min(n, window). */
static json_t *kind_json(const kp_eng_stats *k) {
    json_t *o = json_object();
    json_object_set_new(o, "full",
                        json_pack("{s:I, s:I, s:I}", "layers", (json_int_t)k->n_full_layers, "bytes_per_token",
                                  (json_int_t)k->full_bytes_per_token, "index_bytes",
                                  (json_int_t)k->index_full_bytes));
    if (k->n_window_layers)
        json_object_set_new(o, "window",
                            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "layers", (json_int_t)k->n_window_layers,
                                      "window", (json_int_t)k->window, "bytes_per_token",
                                      (json_int_t)k->window_bytes_per_token, "index_bytes",
                                      (json_int_t)k->index_window_bytes, "budget_bytes",
                                      (json_int_t)k->window_budget_bytes, "used_bytes",
                                      (json_int_t)k->window_used_bytes, "drops", (json_int_t)k->window_drops));
    if (k->state_bytes) /* a model with recurrent layers: its state snapshots (engine.h) */
        json_object_set_new(o, "recurrent",
                            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "state_bytes", (json_int_t)k->state_bytes,
                                      "snapshot_bytes", (json_int_t)k->state_block_bytes, "state_every",
                                      (json_int_t)k->state_every, "snapshots", (json_int_t)k->n_states,
                                      "index_bytes", (json_int_t)k->index_state_bytes, "evictions",
                                      (json_int_t)k->state_evictions));
    return o;
}

static json_t *kv_json(const kp_eng_stats *k) {
    uint64_t bb = k->block_bytes ? k->block_bytes : 1;
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "budget_bytes",
                     (json_int_t)k->budget_bytes, "used_bytes", (json_int_t)k->used_bytes, "free_bytes",
                     (json_int_t)k->free_bytes, "pinned_bytes", (json_int_t)k->pinned_bytes, "pinned_cap_bytes",
                     (json_int_t)k->pinned_cap_bytes, "index_bytes", (json_int_t)k->index_bytes, "shared_bytes",
                     (json_int_t)k->shared_bytes, "saved_bytes", (json_int_t)k->saved_bytes, "block_bytes",
                     (json_int_t)k->block_bytes, "bytes_per_token", (json_int_t)k->bytes_per_token, "blocks_total",
                     (json_int_t)(k->budget_bytes / bb), "blocks_used", (json_int_t)(k->used_bytes / bb),
                     "blocks_free", (json_int_t)(k->free_bytes / bb));
    if (o) json_object_set_new(o, "by_kind", kind_json(k));
    if (o && k->state_bytes) { /* the snapshots' count and bytes, also in by_kind.recurrent */
        json_object_set_new(o, "state_snapshots", json_integer((json_int_t)k->n_states));
        json_object_set_new(o, "state_snapshot_bytes", json_integer((json_int_t)k->state_block_bytes));
    }
    return o;
}

/* /v1/cache "tiers": each tier below RAM (disk, redis) with its bytes,
 * blocks (the disk's recurrent-state snapshots apart), hit ratio and
 * failures by reason, and the restores (state_restores: prefills resumed
 * at a tier's snapshot); null without tiers. */
static json_t *tiers_json(kp_server *s) {
    kp_tiers_stats ts;
    if (!s->cfg.tiers_of || !kp_eng_tier_stats(s->cfg.tiers_of, &ts)) return json_null();
    json_t *o = json_pack("{s:s, s:I, s:I, s:s}", "fingerprint", ts.fingerprint, "restores", (json_int_t)ts.restores,
                          "restore_failed", (json_int_t)ts.restore_failed, "note", kp_eng_tier_note(s->cfg.tiers_of));
    json_object_set_new(o, "state_restores", json_integer((json_int_t)ts.state_restores));
    json_object_set_new(o, "state_restore_failed", json_integer((json_int_t)ts.state_failed));
    for (int i = KP_TIER_DISK; i < KP_TIER_N; i++) {
        if (!ts.on[i]) continue;
        const kp_tier_stats *t = &ts.tier[i];
        json_t *fail = json_object();
        uint64_t failures = 0;
        for (int r = KP_BLOCKREC_TRUNCATED; r < KP_BLOCKREC_N_REASONS; r++) {
            json_object_set_new(fail, kp_blockrec_reason_name((kp_blockrec_reason)r), json_integer((json_int_t)t->fail[r]));
            failures += t->fail[r];
        }
        json_object_set_new(fail, "missing", json_integer((json_int_t)t->fail[KP_BLOCKREC_MISSING]));
        json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                              "bytes", (json_int_t)t->bytes, "blocks", (json_int_t)t->blocks, "budget_bytes",
                              (json_int_t)t->budget_bytes, "lookups", (json_int_t)t->lookups, "hits",
                              (json_int_t)t->hits, "hit_ratio", t->lookups ? (double)t->hits / (double)t->lookups : 0.0,
                              "failures", (json_int_t)failures, "failures_by_reason", fail, "writes",
                              (json_int_t)t->writes, "bytes_written", (json_int_t)t->bytes_written, "bytes_read",
                              (json_int_t)t->bytes_read, "dropped_queue_full", (json_int_t)t->dropped_queue,
                              "dropped_over_budget", (json_int_t)t->dropped_budget, "write_errors",
                              (json_int_t)t->write_errors, "evicted", (json_int_t)t->evicted, "restored_tokens",
                              (json_int_t)ts.restored_tokens[i], "other_fingerprint_blocks",
                              (json_int_t)t->other_blocks);
        if (i == KP_TIER_REDIS) json_object_set_new(j, "epochs_lost", json_integer((json_int_t)t->epochs_lost));
        if (i == KP_TIER_DISK) { /* recurrent-state snapshot records: part of bytes, apart from blocks */
            json_object_set_new(j, "state_snapshots", json_integer((json_int_t)t->states));
            json_object_set_new(j, "state_snapshot_bytes", json_integer((json_int_t)t->state_bytes));
        }
        json_object_set_new(o, kp_tier_name((kp_tier_id)i), j);
    }
    return o;
}

KP_HANDLER(kp_ep_cache) {
    kp_error err = {0};
    /* the counters first: the snapshot is published before the running
     * table shrinks, so "running": 0 comes with the cache the requests left */
    kp_sched_stats ss;
    kp_sched_stats_get(s->sched, &ss);
    kp_sched_cache snap;
    kp_sched_cache_get(s->sched, &snap);
    const kp_eng_stats k = snap.kv;
    json_t *list = json_array();
    for (uint32_t i = 0; i < snap.n_top; i++) {
        const kp_eng_prefix *p = &snap.top[i];
        char *text = NULL;
        size_t len = 0;
        kp_tok_detokenize(s->v, p->head, p->n_head, true, true, &text, &len, &err);
        json_t *words = text ? json_stringn(text, len) : NULL;
        free(text);
        json_array_append_new(
            list, json_pack("{s:I, s:I, s:b, s:I, s:I, s:o}", "tokens", (json_int_t)p->n_tokens, "bytes",
                            (json_int_t)p->bytes, "pinned", p->pinned, "holders", (json_int_t)p->n_holders, "hits",
                            (json_int_t)p->hits, "first_words",
                            words ? words : json_string("")));
    }
    json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "nodes",
                               (json_int_t)k.n_nodes, "prefixes", (json_int_t)k.n_leaves, "pins", (json_int_t)k.n_pins,
                               "leases", (json_int_t)k.n_leases, "cached_tokens", (json_int_t)k.cached_tokens,
                               "evictions", (json_int_t)k.n_evictions, "evicted_bytes", (json_int_t)k.evicted_bytes,
                               "lookups", (json_int_t)k.n_lookups, "hits", (json_int_t)k.n_hits, "reused_tokens",
                               (json_int_t)k.reused_tokens, "running", (json_int_t)ss.running, "queued",
                               (json_int_t)ss.queued);
    json_t *keys = kp_cachekeys_json(s->ckeys, s->pin_key);
    uint64_t bp_tokens = 0;
    uint32_t bp_n = kp_breakpoints_count(s->breakpoints, (int64_t)time(NULL), &bp_tokens);
    uint32_t rs_n, rs_max;
    size_t rs_bytes, rs_max_bytes;
    kp_response_store_stats(s->responses, &rs_n, &rs_bytes, &rs_max, &rs_max_bytes);
    return kp_http_json(s, c, 200,
                      json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}",
                                "object", "kvpin.cache", "prefix_cache", k.prefix_cache, "kv", kv_json(&k), "counts",
                                counts, "prefixes", list, "prompt_cache_keys", keys ? keys : json_array(), "tiers",
                                tiers_json(s), "cache_control", "live_pins", (json_int_t)bp_n, "tokens",
                                (json_int_t)bp_tokens, "responses", "count", (json_int_t)rs_n, "bytes",
                                (json_int_t)rs_bytes, "max_count", (json_int_t)rs_max, "max_bytes",
                                (json_int_t)rs_max_bytes));
}

/* The tokens of a probe or pin body: {"prompt": ...} or {"messages": [...], "tools": [...]}. */
static bool body_tokens(kp_server *s, json_t *o, const char *const *allowed, bool add_gen, kp_prompt *out,
                        kp_oai_error *e) {
    memset(out, 0, sizeof *out);
    if (!kp_oai_only_fields(o, allowed, e)) return false;
    const json_t *ag = json_object_get(o, "add_generation_prompt");
    if (ag && !json_is_boolean(ag) && !json_is_null(ag))
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "add_generation_prompt",
                           "add_generation_prompt must be true or false");
    kp_prompt_opts po = {json_is_boolean(ag) ? json_is_true(ag) : add_gen, false, NULL, false};
    const json_t *prompt = json_object_get(o, "prompt"), *messages = json_object_get(o, "messages");
    const json_t *tools = json_object_get(o, "tools");
    if (!prompt == !messages)
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "prompt", "give either prompt or messages");
    if (messages && (!json_is_array(messages) || json_array_size(messages) == 0))
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "messages",
                           "messages must be a non-empty array of message objects");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "tools", "tools must be an array of tool objects");
    if (json_is_null(tools) || (tools && json_array_size(tools) == 0)) tools = NULL;
    const json_t *ps = json_object_get(o, "parse_special");
    if (ps && !json_is_boolean(ps) && !json_is_null(ps))
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "parse_special", "parse_special must be true or false");
    return kp_prompt_tokens(s, prompt, messages, tools, json_is_true(ps), &po, out, e);
}

KP_HANDLER(kp_ep_cache_probe) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return kp_http_error(s, c, &e);
    static const char *const allowed[] = {"prompt", "messages", "tools", "model", "parse_special",
                                          "add_generation_prompt", NULL};
    kp_prompt pr;
    bool ok = body_tokens(s, o, allowed, true, &pr, &e); /* what a chat request would send */
    json_decref(o);
    if (!ok) return kp_http_error(s, c, &e);
    int32_t *ids = pr.ids;
    size_t n = pr.n, tl = pr.text_len;
    char *text = pr.text;
    kp_eng_report r;
    kp_doctor_report d;
    bool has = false;
    kp_error err = {0};
    kp_status st = kp_sched_probe(s->sched, ids, (uint32_t)n, text, tl, &r, &d, &has, &err);
    if (st != KP_OK) {
        free(ids);
        free(text);
        kp_oai_from_status(st, &err, "prompt", &e);
        return kp_http_error(s, c, &e);
    }
    free(ids);
    free(text);
    json_t *j = kp_oai_cache_json(&r, has ? &d : NULL);
    json_object_set_new(j, "object", json_string("kvpin.cache.probe"));
    return kp_http_json(s, c, 200, j);
}

KP_HANDLER(kp_ep_cache_pin) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return kp_http_error(s, c, &e);
    static const char *const allowed[] = {"prompt",        "messages", "tools", "model", "ttl", "parse_special",
                                          "add_generation_prompt", NULL};
    const json_t *ttl_j = json_object_get(o, "ttl");
    int64_t ttl = 0;
    if (ttl_j && !json_is_null(ttl_j)) {
        if (!json_is_integer(ttl_j) || json_integer_value(ttl_j) < 0 || json_integer_value(ttl_j) > (1ll << 40)) {
            json_decref(o);
            return kp_http_fail(s, c, 400, "invalid_request_error", NULL, "ttl",
                        "ttl must be a whole number of seconds >= 0 (0: until unpinned)");
        }
        ttl = json_integer_value(ttl_j);
    }
    kp_prompt pr;
    /* a pinned conversation ends where the next turn's messages go on: no assistant opener */
    bool ok = body_tokens(s, o, allowed, false, &pr, &e);
    json_decref(o);
    free(pr.text);
    if (!ok) return kp_http_error(s, c, &e);
    int32_t *ids = pr.ids;
    size_t n = pr.n;
    kp_sched_cache snap;
    kp_sched_cache_get(s->sched, &snap);
    if (!snap.kv.prefix_cache) {
        free(ids);
        return kp_http_fail(s, c, 400, "invalid_request_error", "prefix_cache_off", NULL,
                    "the prefix cache is off (--no-prefix-cache): nothing can be pinned");
    }
    /* compute the prefix (prefill only), then pin it */
    if (!kp_prompt_fits_budget(s, (uint32_t)n, 0, true, "prompt", &e)) {
        free(ids);
        return kp_http_error(s, c, &e);
    }
    kp_sreq_params p = {ids, (uint32_t)n, 0, kp_sampler_defaults(), NULL, 0, false, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *r = NULL;
    kp_error err = {0};
    kp_status st = kp_sched_submit(s->sched, &p, &r, &err);
    kp_sreq_update u = {0};
    while (st == KP_OK) {
        kp_sreq_wait(r, 200, &u);
        free(u.text);
        if (u.finish != KP_FINISH_NONE) break;
        if (kp_http_client_gone(c) || atomic_load(&s->stopping)) {
            kp_sreq_release(r);
            free(ids);
            kp_http_quiet_close();
            return MHD_NO;
        }
    }
    kp_sreq_release(r);
    if (st != KP_OK || u.finish == KP_FINISH_ERROR) {
        kp_oai_from_status(st != KP_OK ? st : u.status, st != KP_OK ? &err : &u.err, "prompt", &e);
        free(ids);
        return kp_http_error(s, c, &e);
    }
    uint64_t pin = 0;
    kp_eng_stats k;
    st = kp_sched_pin(s->sched, ids, (uint32_t)n, ttl, (int64_t)time(NULL), &pin, &k, &err);
    free(ids);
    if (st != KP_OK) {
        if (st == KP_EFULL) return kp_http_fail(s, c, 400, "invalid_request_error", "pinned_cap", NULL, "%s", err.msg);
        kp_oai_from_status(st, &err, "prompt", &e);
        return kp_http_error(s, c, &e);
    }
    uint64_t per = k.bytes_per_token, bb = k.block_bytes ? k.block_bytes : 1;
    char sid[KP_PINID_MAX];
    kp_pinid_format(s->pin_key, pin, sid);
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "object", "kvpin.cache.pin", "id", sid, "tokens",
                          (json_int_t)n, "bytes", (json_int_t)((n * per + bb - 1) / bb * bb), "ttl", (json_int_t)ttl,
                          "pinned_bytes", (json_int_t)k.pinned_bytes, "pinned_cap_bytes",
                          (json_int_t)k.pinned_cap_bytes);
    json_object_set_new(j, "expires_at", ttl ? json_integer((json_int_t)(time(NULL) + ttl)) : json_null());
    return kp_http_json(s, c, 200, j);
}

KP_HANDLER(kp_ep_cache_unpin) {
    const char *sid = id;
    uint64_t pin = 0;
    if (!kp_pinid_parse(s->pin_key, sid, &pin)) /* not an id this server gave */
        return kp_http_fail(s, c, 404, "invalid_request_error", "pin_not_found", "id", "no pin \"%.64s\"", sid);
    kp_error err = {0};
    kp_status st = kp_sched_unpin(s->sched, pin, &err);
    if (st == KP_EFULL) {
        kp_oai_error e;
        kp_oai_from_status(st, &err, NULL, &e);
        return kp_http_error(s, c, &e);
    }
    if (st != KP_OK)
        return kp_http_fail(s, c, 404, "invalid_request_error", "pin_not_found", "id",
                    "no pin \"%.64s\" (never made, removed or expired)", sid);
    return kp_http_json(s, c, 200, json_pack("{s:s, s:s, s:b}", "object", "kvpin.cache.pin", "id", sid, "deleted", 1));
}

/* ---- metrics ------------------------------------------------------------------------ */

typedef kp_buf text;
#define tp kp_buf_printf

static void metric(text *t, const char *name, const char *type, const char *help, double v) {
    tp(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void histogram(text *t, const char *name, const char *help, const double *le, const uint64_t *count,
                      uint64_t n, double sum) {
    tp(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < KP_SCHED_HIST_BUCKETS; i++) tp(t, "%s_bucket{le=\"%g\"} %llu\n", name, le[i], (unsigned long long)count[i]);
    tp(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, (unsigned long long)n, name, sum, name,
       (unsigned long long)n);
}

/* The cache tiers' counters (nothing without tiers): hits, bytes read and
 * written, failures by reason per tier, and the restore latency. */
static void tier_metrics(kp_server *s, text *t) {
    kp_tiers_stats ts;
    if (!s->cfg.tiers_of || !kp_eng_tier_stats(s->cfg.tiers_of, &ts)) return;
    static const char *const fam[][3] = {
        {"kvpin_tier_hits_total", "counter", "Blocks a tier below RAM gave back, verified."},
        {"kvpin_tier_lookups_total", "counter", "Block loads asked of a tier below RAM."},
        {"kvpin_tier_bytes_read_total", "counter", "Record bytes read from a tier below RAM."},
        {"kvpin_tier_bytes_written_total", "counter", "Record bytes written to a tier below RAM."},
        {"kvpin_tier_bytes", "gauge", "Record bytes a tier below RAM holds."},
        {"kvpin_tier_blocks", "gauge", "Blocks a tier below RAM holds."},
        {"kvpin_tier_writes_dropped_total", "counter", "Writes dropped (queue full or larger than the budget)."},
        {"kvpin_tier_restored_tokens_total", "counter", "Prompt tokens restored from a tier below RAM."},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        tp(t, "# HELP %s %s\n# TYPE %s %s\n", fam[f][0], fam[f][2], fam[f][0], fam[f][1]);
        for (int i = KP_TIER_DISK; i < KP_TIER_N; i++) {
            if (!ts.on[i]) continue;
            const kp_tier_stats *x = &ts.tier[i];
            uint64_t v[] = {x->hits, x->lookups, x->bytes_read, x->bytes_written, x->bytes, x->blocks,
                            x->dropped_queue + x->dropped_budget, ts.restored_tokens[i]};
            tp(t, "%s{tier=\"%s\"} %llu\n", fam[f][0], kp_tier_name((kp_tier_id)i), (unsigned long long)v[f]);
        }
    }
    tp(t, "# HELP kvpin_tier_failures_total Blocks a tier below RAM refused, by reason.\n"
          "# TYPE kvpin_tier_failures_total counter\n");
    for (int i = KP_TIER_DISK; i < KP_TIER_N; i++)
        for (int r = KP_BLOCKREC_MISSING; ts.on[i] && r < KP_BLOCKREC_N_REASONS; r++)
            tp(t, "kvpin_tier_failures_total{tier=\"%s\",reason=\"%s\"} %llu\n", kp_tier_name((kp_tier_id)i),
               kp_blockrec_reason_name((kp_blockrec_reason)r), (unsigned long long)ts.tier[i].fail[r]);
    const char *h = "kvpin_tier_restore_seconds";
    tp(t, "# HELP %s Time to look up, read and verify the blocks of one prefill's restore.\n# TYPE %s histogram\n", h,
       h);
    uint64_t cum = 0;
    for (int b = 0; b < KP_TIERS_N_BUCKETS; b++) {
        cum += ts.latency_count[b];
        tp(t, "%s_bucket{le=\"%g\"} %llu\n", h, kp_tiers_bucket_le[b], (unsigned long long)cum);
    }
    cum += ts.latency_count[KP_TIERS_N_BUCKETS];
    tp(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", h, (unsigned long long)cum, h,
       ts.latency_sum, h, (unsigned long long)cum);
}

KP_HANDLER(kp_ep_metrics) {
    kp_sched_stats st;
    kp_sched_stats_get(s->sched, &st);
    text t = {0};
    metric(&t, "kvpin_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", (double)st.prompt_tokens);
    metric(&t, "kvpin_prompt_tokens_cached_total", "counter", "Prompt tokens whose K/V came from the prefix cache.",
           (double)st.cached_tokens);
    metric(&t, "kvpin_inflight_reused_tokens_total", "counter",
           "Prompt tokens taken from another request's prefill in flight (beyond what the prefix cache held).",
           (double)st.inflight_reused_tokens);
    metric(&t, "kvpin_inflight_followers_total", "counter",
           "Requests that reused the prompt of a request computing it at the same time.",
           (double)st.inflight_followers);
    metric(&t, "kvpin_generated_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens);
    metric(&t, "kvpin_prefix_hit_ratio", "gauge", "Cached share of all prompt tokens so far.",
           st.prompt_tokens ? (double)st.cached_tokens / (double)st.prompt_tokens : 0.0);
    tp(&t, "# HELP kvpin_requests_total HTTP responses by status code.\n# TYPE kvpin_requests_total counter\n");
    for (int i = 0; i < KP_HTTP_N_STATUS; i++) {
        uint64_t v = atomic_load(&s->by_status[i]);
        if (kp_http_status_codes[i])
            tp(&t, "kvpin_requests_total{status=\"%d\"} %llu\n", kp_http_status_codes[i], (unsigned long long)v);
        else
            tp(&t, "kvpin_requests_total{status=\"other\"} %llu\n", (unsigned long long)v);
    }
    metric(&t, "kvpin_generations_finished_total", "counter", "Generation requests that ended (any reason).",
           (double)st.requests_finished);
    metric(&t, "kvpin_generations_cancelled_total", "counter", "Generation requests cancelled (client left).",
           (double)st.requests_cancelled);
    metric(&t, "kvpin_generations_failed_total", "counter", "Generation requests that failed.",
           (double)st.requests_failed);
    metric(&t, "kvpin_http_requests_cut_total", "counter",
           "Connections shut down because a request's head and body did not arrive within --request-timeout.",
           (double)atomic_load(&s->cut_slow));
    if (s->answers) {
        size_t entries, bytes;
        uint64_t matches, stored;
        kp_answers_counts(s->answers, &entries, &bytes, &matches, &stored);
        metric(&t, "kvpin_answer_memory_entries", "gauge", "Answers remembered as the tokens the model wrote.",
               (double)entries);
        metric(&t, "kvpin_answer_memory_bytes", "gauge", "Bytes the remembered answers hold (--answer-memory).",
               (double)bytes);
        metric(&t, "kvpin_answer_memory_stored_total", "counter", "Answers remembered so far.", (double)stored);
        metric(&t, "kvpin_answer_memory_matches_total", "counter",
               "Prompts that started with a remembered answer and took its tokens.", (double)matches);
    }
    metric(&t, "kvpin_volatile_blocks_dropped_total", "counter",
           "System texts of generation requests whose volatile start (a client's per-session header, "
           "--volatile-prefix) was left out of the prompt.",
           (double)atomic_load(&s->volatile_dropped));
    metric(&t, "kvpin_queue_length", "gauge", "Requests waiting to be admitted (for a sequence slot or KV blocks).",
           st.queued);
    metric(&t, "kvpin_requests_waiting_for_kv", "gauge",
           "Queued requests a free sequence slot would take now but for the KV blocks the queue's head waits for.",
           st.waiting_for_kv);
    metric(&t, "kvpin_preemptions_total", "counter",
           "Running sequences sent back to the queue (cached, released, resumed later) so others could grow.",
           (double)st.preemptions);
    metric(&t, "kvpin_preemption_recomputed_tokens_total", "counter",
           "Positions resumed requests computed again (not found in the prefix cache).", (double)st.resumed_computed);
    metric(&t, "kvpin_running_sequences", "gauge", "Sequences prefilling or decoding.", st.running);
    metric(&t, "kvpin_engine_steps_total", "counter", "Forward steps run by the engine.", (double)st.steps);
    uint64_t bb = st.kv.block_bytes ? st.kv.block_bytes : 1;
    metric(&t, "kvpin_kv_bytes_used", "gauge", "KV cache bytes in use (index and sequences, shared once).",
           (double)st.kv.used_bytes);
    metric(&t, "kvpin_kv_bytes_budget", "gauge", "KV cache byte budget.", (double)st.kv.budget_bytes);
    metric(&t, "kvpin_kv_bytes_pinned", "gauge", "KV bytes on pinned prefixes.", (double)st.kv.pinned_bytes);
    metric(&t, "kvpin_kv_bytes_shared", "gauge", "Cached KV bytes that running sequences also use.",
           (double)st.kv.shared_bytes);
    metric(&t, "kvpin_kv_blocks_used", "gauge", "KV blocks in use.", (double)(st.kv.used_bytes / bb));
    metric(&t, "kvpin_kv_blocks_free", "gauge", "KV blocks free.", (double)(st.kv.free_bytes / bb));
    metric(&t, "kvpin_kv_evictions_total", "counter", "Cached prefix nodes evicted.", (double)st.kv.n_evictions);
    metric(&t, "kvpin_kv_cached_tokens", "gauge", "Distinct positions held by the prefix index.",
           (double)st.kv.cached_tokens);
    histogram(&t, "kvpin_time_to_first_token_seconds", "From request arrival to its first generated token.",
              st.ttft_le, st.ttft_count, st.ttft_n, st.ttft_sum);
    histogram(&t, "kvpin_time_per_output_token_seconds", "Time between consecutive generated tokens of a request.",
              st.tpot_le, st.tpot_count, st.tpot_n, st.tpot_sum);
    histogram(&t, "kvpin_kv_wait_seconds",
              "Time a request waited at the queue's head, a sequence slot free, for KV blocks (per admission "
              "that waited).",
              st.kvwait_le, st.kvwait_count, st.kvwait_n, st.kvwait_sum);
    tier_metrics(s, &t);
    if (t.oom) {
        kp_buf_free(&t);
        return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    enum MHD_Result r = kp_http_reply(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", t.data, t.len, NULL, NULL);
    kp_buf_free(&t);
    return r;
}

/* ---- health and the dashboard ----------------------------------------------------- */

KP_HANDLER(kp_ep_health) {
    kp_sched_stats st;
    kp_sched_stats_get(s->sched, &st);
    return kp_http_json(s, c, 200,
                        json_pack("{s:s, s:I, s:I}", "status", "ok", "running", (json_int_t)st.running, "queued",
                                  (json_int_t)st.queued));
}

KP_HANDLER(kp_ep_dashboard) {
    if (s->cfg.no_dashboard)
        return kp_http_fail(s, c, 404, "invalid_request_error", "not_found", NULL,
                            "the dashboard is off (--no-dashboard)");
    return kp_http_reply(s, c, 200, "text/html; charset=utf-8", (const char *)kp_dash_page_bytes, kp_dash_page_size,
                         "Cache-Control", "no-store");
}

KP_HANDLER(kp_ep_cache_events) {
    return kp_http_json(s, c, 200, kp_dash_events(s->sched, s->hist, s->v, s->m, s->ctx, (int64_t)time(NULL)));
}

KP_HANDLER(kp_ep_cache_node) {
    kp_oai_error e;
    json_t *j = kp_dash_node(s->sched, s->v, id, &e);
    return j ? kp_http_json(s, c, 200, j) : kp_http_error(s, c, &e);
}
