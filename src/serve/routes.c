/*
 * routes.c - the server assembled: its resources, and the route table that
 * sends each request to its handler (server.h).
 *
 * Owns the kp_server (http.h) from kp_server_new to kp_server_free: the
 * request-policy tables (prompt_cache_key table, grammar cache, breakpoint
 * pins, response store, dashboard history), then the HTTP floor started
 * on it (kp_http_start) with route() as what runs a request that arrived
 * whole. This is the one file that includes the API dialects (openai.h,
 * anthropic.h, responses.h; `make check` holds it): everything below the
 * table knows a dialect only through answer.h's interface.
 *
 *   route(): the entries whose path matches -> the API key (401 before
 *   anything else is said) -> 413 body too large -> the handler of the
 *   first entry whose method matches, else 405 naming the methods, or 404
 *
 * Errors take the shape of the API the path belongs to (every path under
 * /v1/messages speaks Anthropic's, the rest OpenAI's).
 */
#include "serve/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/entropy.h"

#include "serve/answers.h"
#include "serve/anthropic.h"
#include "serve/embed.h"
#include "serve/endpoints.h"
#include "serve/http.h"
#include "serve/llama.h"
#include "serve/openai.h"
#include "serve/origin.h"
#include "serve/promptlog.h"
#include "serve/response_store.h"
#include "serve/responses.h"
#include "serve/volatile.h"

#define GRAMMARS_KEPT 16 /* compiled response_format / grammar constraints the server keeps (LRU) */

/* The paths whose errors take another API's shape than OpenAI's: the
 * prefix itself, or followed by "/". */
static const struct {
    const char *prefix;
    kp_error_shape errors;
} FAMILIES[] = {
    {"/v1/messages", kp_anth_error_shape},
};

static kp_error_shape errors_of(const char *url) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++) {
        size_t n = strlen(FAMILIES[i].prefix);
        if (!strncmp(url, FAMILIES[i].prefix, n) && (!url[n] || url[n] == '/')) return FAMILIES[i].errors;
    }
    return NULL;
}

/* k is the server's key, compared in time independent of where they differ. */
static bool key_matches(const char *k, const char *want) {
    size_t lk = strlen(k), lw = strlen(want);
    unsigned diff = lk != lw;
    for (size_t i = 0; i < lw; i++) diff |= (unsigned)(want[i] ^ (i < lk ? k[i] : 0));
    return diff == 0;
}

/* "Authorization: Bearer KEY" with the server's key; the scheme is
 * case-insensitive and followed by one or more spaces (RFC 7235). Or
 * "x-api-key: KEY", the header of Anthropic's clients. */
static bool authorized(kp_server *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return true;
    const char *xk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (xk && key_matches(xk, s->cfg.api_key)) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer", 6) || h[6] != ' ') return false;
    const char *k = h + 6;
    while (*k == ' ') k++;
    return key_matches(k, s->cfg.api_key);
}

/* Every endpoint, once. A request whose path matches no entry is a 404;
 * one whose path matches but whose method does not is a 405 naming the
 * methods of the entries that match it. "GET" entries answer HEAD too.
 * A prefix entry matches its path followed by a non-empty id. `key`: the
 * entry needs the API key (when the server has one); a path that no entry
 * without `key` matches, an unknown one included, needs it before anything
 * else is said about it. */
typedef struct {
    const char *method;
    const char *path;
    bool prefix;
    bool key;
    kp_handler_fn fn;
} route_entry;

static const route_entry ROUTES[] = {
    {"GET", "/health", false, false, kp_ep_health},
    {"GET", "/v1/health", false, false, kp_ep_health},
    {"GET", "/v1/models", false, true, kp_ep_models},
    {"GET", "/v1/models/", true, true, kp_ep_models},
    {"GET", "/metrics", false, true, kp_ep_metrics},
    {"POST", "/v1/completions", false, true, kp_openai_completions},
    {"POST", "/completion", false, true, kp_llama_completion},
    {"POST", "/v1/embeddings", false, true, kp_embeddings},
    {"POST", "/embeddings", false, true, kp_embeddings},
    {"GET", "/props", false, true, kp_llama_props},
    {"GET", "/slots", false, true, kp_llama_slots},
    {"POST", "/completions", false, true, kp_openai_completions},
    {"POST", "/v1/chat/completions", false, true, kp_openai_chat},
    {"POST", "/chat/completions", false, true, kp_openai_chat},
    {"POST", "/v1/messages", false, true, kp_anth_messages},
    {"POST", "/v1/messages/count_tokens", false, true, kp_anth_count_tokens},
    {"POST", "/v1/responses", false, true, kp_resp_create},
    {"GET", "/v1/responses/", true, true, kp_resp_get},
    {"DELETE", "/v1/responses/", true, true, kp_resp_delete},
    {"POST", "/tokenize", false, true, kp_ep_tokenize},
    {"POST", "/detokenize", false, true, kp_ep_detokenize},
    {"GET", "/v1/cache", false, true, kp_ep_cache},
    {"POST", "/v1/cache/probe", false, true, kp_ep_cache_probe},
    {"POST", "/v1/cache/pin", false, true, kp_ep_cache_pin},
    {"DELETE", "/v1/cache/pin/", true, true, kp_ep_cache_unpin},
    {"GET", "/", false, false, kp_ep_dashboard},
    {"GET", "/dashboard", false, false, kp_ep_dashboard},
    {"GET", "/v1/cache/events", false, true, kp_ep_cache_events},
    {"GET", "/v1/cache/node/", true, true, kp_ep_cache_node},
};

/* Does url fall under e? *id: what follows a prefix, NULL for an exact path. */
static bool route_path_matches(const route_entry *e, const char *url, const char **id) {
    size_t n = strlen(e->path);
    if (strncmp(url, e->path, n)) return false;
    *id = e->prefix ? url + n : NULL;
    return e->prefix ? url[n] != 0 : url[n] == 0;
}

static bool route_method_matches(const route_entry *e, const char *method) {
    return !strcmp(method, e->method) || (!strcmp(e->method, "GET") && !strcmp(method, "HEAD"));
}

static enum MHD_Result route(kp_server *s, struct MHD_Connection *c, const char *url, const char *method, kp_conn *cn) {
    const route_entry *hit = NULL; /* the first entry matching path and method */
    const char *id = NULL;
    bool open = false;   /* an entry of this path answers without the key */
    char allow[64] = ""; /* the methods of the other entries of this path */
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        const route_entry *e = &ROUTES[i];
        const char *rest;
        if (!route_path_matches(e, url, &rest)) continue;
        open = open || !e->key;
        if (route_method_matches(e, method)) {
            if (!hit) hit = e, id = rest;
        } else {
            size_t used = strlen(allow);
            snprintf(allow + used, sizeof allow - used, "%s%s", used ? ", " : "", e->method);
        }
    }
    cn->errors = errors_of(url);
    /* a page in a browser: a Host a rebinding would name, its origin, a
     * body it could send without asking (origin.h) */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!kp_origin_host_allowed(host, s->cfg.host, s->hostname, s->cfg.allowed_hosts, s->cfg.n_allowed_hosts))
        return kp_http_fail(s, c, 421, "invalid_request_error", "misdirected_request", NULL,
                            "Host \"%.100s\" is not a name this server answers for (an IP address, localhost, "
                            "the name it listens on or the machine's): start it with --allowed-hosts %.*s to "
                            "answer it",
                            host, host[0] == '[' ? 100 : (int)strcspn(host, ":"), host);
    cn->cors = kp_origin_cors(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"), s->cfg.cors_origins,
                              s->cfg.n_cors_origins);
    if (!strcmp(method, "OPTIONS") && cn->cors) return kp_http_preflight(s, c);
    /* the key before anything else: without it a client learns nothing of routes or limits */
    if (!open && !authorized(s, c))
        return kp_http_fail(s, c, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "missing or wrong API key: send the header \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"");
    if (cn->too_big)
        return kp_http_fail(s, c, 413, "invalid_request_error", "body_too_large", NULL,
                    "the request body is larger than the limit of %zu bytes", s->cfg.max_body);
    if (hit && !strcmp(method, "POST")) { /* every POST takes JSON */
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!kp_origin_is_json(ct))
            return kp_http_fail(s, c, 415, "invalid_request_error", "unsupported_media_type", NULL,
                                "Content-Type must be application/json, not \"%.100s\"", ct ? ct : "(none)");
    }
    if (hit) return hit->fn(s, c, cn, id);
    if (!allow[0])
        return kp_http_fail(s, c, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %.200s", method, url);
    kp_oai_error e;
    kp_oai_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s %s is not allowed; use %s", method,
                url, allow);
    int http;
    json_t *j = kp_http_error_body(cn, &e, &http);
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    cn->log.code = e.code;
    enum MHD_Result r = kp_http_reply(s, c, 405, "application/json", t ? t : "{}", t ? strlen(t) : 2, "Allow", allow);
    free(t);
    return r;
}


/* ---- the server ------------------------------------------------------------------ */

static void server_free_tables(kp_server *s) {
    kp_cachekeys_free(s->ckeys);
    kp_gcache_free(s->gc);
    kp_breakpoints_free(s->breakpoints);
    kp_response_store_free(s->responses);
    kp_history_free(s->hist);
    kp_volatile_free(s->vol);
    kp_answers_free(s->answers);
    s->answers = NULL;
    kp_promptlog_close(s->promptlog);
    s->promptlog = NULL;
    free(s);
}

kp_status kp_server_new(kp_server **out, const kp_server_config *cfg, kp_sched *sched, const kp_tok_vocab *v,
                        const kp_model *m, kp_error *err) {
    *out = NULL;
    kp_server *s = calloc(1, sizeof *s);
    if (!s) return kp_fail(err, KP_ENOMEM, "out of memory for the server");
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.model_name) s->cfg.model_name = "kvpin";
    if (!s->cfg.max_body) s->cfg.max_body = 8u << 20;
    if (!s->cfg.timeout_s) s->cfg.timeout_s = 60;
    if (!s->cfg.max_connections) s->cfg.max_connections = 1024;
    if (!s->cfg.max_per_address) s->cfg.max_per_address = 64;
    if (!s->cfg.request_timeout_s) s->cfg.request_timeout_s = 30;
    s->sched = sched;
    s->v = v;
    s->m = m;
    s->started = time(NULL);
    if (kp_entropy(s->pin_key, sizeof s->pin_key, err) != KP_OK) {
        free(s);
        return KP_EIO;
    }
    if (gethostname(s->hostname, sizeof s->hostname) != 0) s->hostname[0] = 0;
    s->hostname[sizeof s->hostname - 1] = 0;
    s->ctx = kp_sched_max_pos(sched);
    /* 256 keys, 64 keyless retention pins: a key table that serves many
     * agents, bounded; breakpoints of many conversations; 256 responses,
     * 16 MiB */
    kp_status st = kp_history_new(&s->hist, err);
    if (st == KP_OK) st = kp_cachekeys_new(&s->ckeys, 256, 64, err);
    if (st == KP_OK) st = kp_gcache_new(&s->gc, GRAMMARS_KEPT, err);
    if (st == KP_OK) st = kp_breakpoints_new(&s->breakpoints, 256, err);
    if (st == KP_OK) st = kp_response_store_new(&s->responses, 256, 16u << 20, err);
    if (st == KP_OK)
        st = kp_volatile_new(&s->vol, !s->cfg.keep_volatile, s->cfg.volatile_prefixes, s->cfg.n_volatile, err);
    if (st == KP_OK && s->cfg.answer_memory) st = kp_answers_new(&s->answers, s->cfg.answer_memory, err);
    if (st == KP_OK && s->cfg.log_prompts) st = kp_promptlog_open(&s->promptlog, s->cfg.log_prompts, err);
    if (st == KP_OK) st = kp_http_start(s, route, err);
    if (st != KP_OK) {
        kp_http_stop(s);
        server_free_tables(s);
        return st;
    }
    *out = s;
    return KP_OK;
}

uint16_t kp_server_port(const kp_server *s) { return s->port; }

const char *kp_server_url(const kp_server *s) { return s->url; }

void kp_server_free(kp_server *s) {
    if (!s) return;
    kp_http_stop(s); /* no handler runs after this */
    server_free_tables(s);
}
