/*
 * server.h - kvpin's HTTP API: the server's public face (floor 7).
 *
 * libmicrohttpd serves HTTP/1.1 with one thread per connection (a blocked
 * stream never stalls another client); jansson reads and writes JSON. The
 * server turns requests into token ids (tokenizer, chat template) and hands
 * them to the scheduler (scheduler.h), which owns the engine; it streams
 * text back as server-sent events and reports, in every response, how much
 * of the prompt came from the prefix cache and why the rest did not.
 *
 *   POST /v1/completions          POST /v1/chat/completions
 *   GET  /v1/models  /health  /metrics (Prometheus text)
 *   POST /tokenize  /detokenize
 *   GET  /v1/cache                POST /v1/cache/probe
 *   POST /v1/cache/pin            DELETE /v1/cache/pin/{id}
 *   GET  / and /dashboard (the cache dashboard page)   GET /v1/cache/events
 *   POST /v1/messages  /v1/messages/count_tokens       (Anthropic, anthropic.h)
 *   POST /v1/responses  GET and DELETE /v1/responses/{id}   (responses.h)
 *
 * The Messages and Responses APIs are translated into the chat-completions
 * request they mean and served by the same generation path; their answers,
 * streams and (for Messages) errors take their own API's shape. The API
 * key may come as "x-api-key" too.
 *
 * Where it lives: routes.c makes the server and holds the route table;
 * http.c is libmicrohttpd (connections, deadline, request log, answers);
 * answer.c serves a generation in an API's dialect (answer.h), one file
 * per dialect (openai.c, anthropic.c, responses.c); endpoints.c has the
 * rest; prompt.c turns prompts and messages into token ids.
 *
 * Errors are OpenAI-style JSON bodies with the right status: 400 (bad JSON,
 * wrong types, unknown fields, prompt longer than the context), 401 (API
 * key), 404, 405, 413 (body too large), 503 (queue full, with Retry-After).
 * With an API key every path but /health and /v1/health needs it, and 401
 * comes before any other answer (404, 405, 413).
 *
 * Completions and chat responses (streams too) carry x-kvpin-ignored-fields
 * when the request had fields kvpin accepted without acting on them, or
 * unknown ones ("user,messages[0].foo"; with strict_api unknown fields are
 * a 400 instead); the log line has them as ignored=.
 *
 * Every response carries an x-request-id header: the client's own when it
 * sent a sane one (1 to 64 visible ASCII characters), else one the server
 * makes. Unless quiet, each request ends with one line on stderr (see
 * README.md): time, id, client, method, path, status, error code, prompt /
 * cached / computed tokens, cache cause, completion tokens, finish, time to
 * first token, total time.
 */
#ifndef KP_SERVER_H
#define KP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "serve/chat.h"
#include "serve/chat_tmpl.h"
#include "model/model.h"
#include "serve/scheduler.h"
#include "base/status.h"
#include "tok/tok.h"

typedef struct {
    const char *host;          /* bind address: IPv4 or IPv6 literal ("::1", "[::1]", "::" for
                                * every IPv6 and IPv4 address) or a name; NULL: 127.0.0.1 */
    uint16_t port;             /* 0: any free port (see kp_server_port) */
    const char *api_key;       /* NULL: no authentication */
    const char *const *allowed_hosts; /* --allowed-hosts: Host names answered beyond the
                                         defaults (origin.h); borrowed */
    size_t n_allowed_hosts;
    const char *const *cors_origins;  /* --cors-origin: origins allowed to read answers; borrowed */
    size_t n_cors_origins;
    const char *model_name;    /* the id /v1/models reports */
    size_t max_body;           /* request body limit in bytes; 0: 8 MiB */
    unsigned timeout_s;        /* idle connection timeout; 0: 60 s */
    unsigned request_timeout_s; /* a request's head and body must arrive within this many seconds
                                 * of the connection's start or its previous answer; 0: 30 s */
    unsigned max_connections;  /* open connections at most; 0: 1024 */
    unsigned max_per_address;  /* open connections from one client address at most; 0: 64 */
    const kp_chat_tmpl *chat_jinja; /* the chat template (the model's, a file's or a built-in one),
                                       borrowed; NULL: chat answers 400 */
    bool reasoning_inline;     /* --reasoning-format none: a reply's reasoning stays in its content */
    uint32_t completion_max_tokens; /* default max_tokens of /v1/completions; 0: 16 */
    uint32_t max_tokens_cap;   /* every generation's max_tokens at most this (any API); 0: no cap */
    const char *build_info;    /* GET /props' build_info ("kvpin 0.9.0"); NULL: "kvpin" */
    bool pooling_last;         /* --pooling last: /v1/embeddings pools the last position (default: the mean) */
    uint32_t embd_threads;     /* threads of an embeddings request; 0: 2 */
    const char *log_prompts;   /* --log-prompts FILE: each prompt computed, one JSON line (promptlog.h); NULL: none */
    size_t answer_memory;      /* bytes of answers remembered as the tokens the model wrote, so that
                                  a conversation sent back reuses them (answers.h); 0: off */
    bool quiet;                /* no request log on stderr */
    bool strict_api;           /* unknown request fields are a 400 instead of being ignored and named
                                  in x-kvpin-ignored-fields (oai.h, kp_oai_parse_opts) */
    bool no_dashboard;         /* GET / and /dashboard answer 404 (dashboard.h) */
    kp_engine *tiers_of;       /* the scheduler's engine, read for its cache tiers' counters
                                  (/v1/cache "tiers", /metrics kvpin_tier_*); NULL: none shown */
    float pin_ttl_scale;       /* cache_control TTLs are multiplied by this (at least 1 s); 0: 1 */
    bool keep_volatile;        /* no built-in volatile patterns (volatile.h: Claude Code's billing header) */
    const char *const *volatile_prefixes; /* more volatile patterns (PCRE2, matched at the start of each
                                             system text), n_volatile of them */
    size_t n_volatile;
    bool message_starts;       /* --window-budget: a chat prompt carries the token positions where
                                  its messages start (prompt.h), resume points for the engine */
} kp_server_config;

typedef struct kp_server kp_server;

/* Starts listening. Everything is borrowed and must outlive the server.
 * KP_EIO when the address cannot be bound, KP_EINVAL when a volatile
 * pattern does not compile (the message says why). */
kp_status kp_server_new(kp_server **out, const kp_server_config *cfg, kp_sched *sched, const kp_tok_vocab *v,
                        const kp_model *m, kp_error *err);

/* The port actually bound. */
uint16_t kp_server_port(const kp_server *s);

/* The address bound, as a URL: "http://127.0.0.1:8080", "http://[::1]:8080"
 * (numeric, whatever name --host gave). Owned by the server. */
const char *kp_server_url(const kp_server *s);

/* Stops accepting, ends every connection, frees. NULL is a no-op. The
 * scheduler is not freed. */
void kp_server_free(kp_server *s);

#endif
