/*
 * server.c - HTTP routing, OpenAI endpoints, streaming, cache endpoints and
 * metrics over libmicrohttpd (server.h).
 *
 * Owns: the MHD daemon, per-connection state (conn: the body being
 * received), per-stream state (stream: the scheduler request and the SSE
 * bytes not yet sent), the request counters. Borrows the scheduler, the
 * vocabulary and the model.
 *
 * One request through the server:
 *
 *   MHD thread of the connection
 *   access_cb #1   headers: make conn, check Content-Length <= max_body
 *   access_cb #2.. body pieces appended (413 once over the limit)
 *   access_cb last route(method, url):
 *     completions/chat: parse (oai.c) -> text -> tokens -> kp_sched_fit (400
 *       kv_budget_exceeded when the KV budget can never hold it) -> kp_sched_submit
 *       wait until the prompt is computed or the request failed, watching
 *       the socket (a client that leaves cancels the request)
 *       stream:  200 + text/event-stream; reader callback blocks in
 *                kp_sreq_wait and writes `data: {chunk}\n\n` ... `[DONE]`
 *       else:    wait for the end, one JSON body
 *     free callback / connection end: kp_sreq_release (cancels if running)
 *     messages / responses: the body translated into a chat-completions
 *       body (anthropic.c, responses.c) and run by generate_as as chat is,
 *       with a gen_api that says whose shape the answer, the stream's
 *       events (stream.api) and, for messages, the errors (conn.api) take;
 *       messages' cache_control breakpoints are located in the prompt
 *       before the submit (anth_breaks) and pinned after the end
 *       (anth_after); a stored response goes to the response store
 *     cache endpoints: GET /v1/cache reads the scheduler's snapshot
 *       (kp_sched_cache_get: memory bill, top prefixes); probe, pin and
 *       unpin are kp_sched_probe / kp_sched_pin / kp_sched_unpin, served by
 *       the engine thread between two steps. No HTTP thread touches the
 *       engine, its pool or its index.
 *
 * Invariants: every response goes through reply()/reply_json() or the
 * stream reader, which count it by status for /metrics; a scheduler
 * request is released exactly once, by whoever holds it last (the handler
 * when it answers with a plain body, else the stream's free callback).
 *
 * The request log: each request's conn carries a reqlog (its id, client,
 * method, path, then the status and error code of the answer, the tokens
 * and times of a generation). reply() finds the conn of the request being
 * answered through the connection's socket context (sock: the conn of the
 * request in progress; one at a time, as MHD runs a connection's requests
 * one after another on its thread), adds the x-request-id header and notes
 * the status. The line is written when the request ends: by completed_cb,
 * or for a stream by its free callback, which holds a copy of the reqlog.
 * A request that got no answer (its client left, or the server stopped
 * first) is logged with status 499.
 */
#include "serve/server.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/unicode.h"
#include "cache/doctor.h"
#include "serve/anthropic.h"
#include "serve/bpins.h"
#include "serve/cachekeys.h"
#include "serve/dashboard.h"
#include "serve/history.h"
#include "serve/oai.h"
#include "serve/responses.h"

#define N_STATUS 12
#define GRAMMARS_KEPT 16 /* compiled response_format / grammar constraints the server keeps (LRU) */
static const int STATUS_CODES[N_STATUS] = {200, 400, 401, 404, 405, 413, 429, 431, 500, 503, 504, 0};

struct kp_server {
    kp_server_config cfg;
    kp_sched *sched;
    const kp_tok_vocab *v;
    const kp_model *m;
    struct MHD_Daemon *d;
    uint16_t port;
    uint32_t ctx; /* the engine's maximum sequence length */
    time_t started;
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t next_req; /* request ids */
    char url[96];                  /* http://ADDRESS:PORT of the listening socket */
    atomic_bool stopping; /* kp_server_free has begun: waits end, streams close */
    atomic_uint_fast64_t by_status[N_STATUS]; /* last: other */
    /* the request deadline: every open connection, and the thread that
     * cuts those whose request head and body did not arrive in time */
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    struct sock *socks; /* doubly linked, under guard_mu */
    pthread_t guard;
    bool guard_started, guard_stop;
    atomic_uint_fast64_t cut_slow; /* connections cut at the deadline */
    kp_ckeys *ckeys;               /* requests by prompt_cache_key, retention pins */
    kp_gcache *gc; /* compiled grammars of response_format / grammar / json_schema */
    kp_hist *hist; /* finished generations, for the dashboard (history.h) */
    kp_bpins *bpins; /* the pins of cache_control breakpoints (bpins.h) */
    kp_rstore *rstore; /* stored Responses API responses (responses.h) */
};

/* What the log line of a request says (log_line). */
typedef struct {
    char id[72];          /* x-request-id: the client's when sane, else one of ours */
    char client[72];      /* ADDRESS:PORT, [v6]:PORT */
    char method[16];
    char path[208];       /* percent-escaped, cut at 200 bytes */
    double t0;            /* arrival (now_s) */
    unsigned status;      /* of the answer queued; 0: none yet */
    const char *code;     /* the error code of an error answer (static), or NULL */
    bool gen;             /* a generation that reached the scheduler: the fields below hold */
    uint32_t prompt, cached, computed, completion;
    uint32_t preempted;   /* times the generation stepped aside for KV memory and resumed */
    const char *cause;    /* the cache report's cause (static), or NULL */
    const char *finish;   /* stop, length, tool_calls, cancelled, error, client_left (static), or NULL */
    double ttft_ms;
    char ignored[208];    /* the request's ignored fields (x-kvpin-ignored-fields), "" when none */
    kp_hist *hist;        /* where note_gen records the generation (the server's) */
} reqlog;

/* The API a request speaks: the shape of its errors, and of a
 * generation's answer and stream (OpenAI's unless the path says another). */
enum { API_OPENAI = 0, API_ANTHROPIC, API_RESPONSES };

typedef struct {
    kp_buf body; /* the request body received so far */
    int api;     /* API_*, from the path (route) */
    bool too_big;
    double t0;
    reqlog log;
    bool streamed; /* a stream answers it and writes its log line */
} conn;

/* A connection's socket context: the request it is serving, and its
 * deadline. Between the connection's start (or the end of its previous
 * request) and the last byte of a request's body, the request must arrive
 * by `deadline`, however slowly its bytes come (an idle timeout alone lets
 * a client that sends a byte every few seconds hold a connection forever);
 * the guard thread shuts the socket down when it does not. fd, deadline,
 * receiving, cut and the links are under the server's guard_mu: the
 * registration ends (connection_cb, MHD_CONNECTION_NOTIFY_CLOSED) before
 * libmicrohttpd closes the descriptor, so the guard never touches a reused
 * one. */
typedef struct sock {
    conn *cur;
    int fd;
    double deadline;
    bool receiving; /* a request head or body is still arriving */
    bool cut;
    struct sock *prev, *next;
} sock;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void count_status(kp_server *s, unsigned status) {
    int i = 0;
    while (i < N_STATUS - 1 && STATUS_CODES[i] != (int)status) i++;
    atomic_fetch_add(&s->by_status[i], 1);
}

/* The request the connection is answering, or NULL. */
static conn *current(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sock *k = ci ? ci->socket_context : NULL;
    return k ? k->cur : NULL;
}

/* ---- the request log ------------------------------------------------------ */

/* The generation's numbers, from the scheduler's last update. */
static void note_gen(reqlog *l, const kp_sreq_update *u, const char *finish) {
    l->gen = true;
    l->prompt = u->prompt_tokens;
    l->cached = u->cached_tokens;
    l->computed = u->report.computed_tokens;
    l->completion = u->completion_tokens;
    l->preempted = u->preemptions;
    l->cause = u->has_doctor ? kp_oai_cache_cause(&u->report, &u->doctor) : NULL; /* as kvpin_cache says */
    l->finish = finish;
    l->ttft_ms = u->ttft_ms;
    kp_hist_add(l->hist, u, finish, (now_s() - l->t0) * 1e3, (int64_t)time(NULL));
}

/* One line on stderr, one fputs (whole even when threads log at once):
 *   TIME id= client= method= path= status= error= prompt= cached= computed=
 *   cause= completion= finish= preempted= ttft_ms= total_ms= ignored=
 * "-" where a field does not apply (see README.md). */
static void log_line(const kp_server *s, const reqlog *l) {
    if (s->cfg.quiet) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40], num[5][16], ttft[24];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    const uint32_t v[5] = {l->prompt, l->cached, l->computed, l->completion, l->preempted};
    for (int i = 0; i < 5; i++) {
        if (l->gen) snprintf(num[i], sizeof num[i], "%u", v[i]);
        else snprintf(num[i], sizeof num[i], "-");
    }
    if (l->gen && l->completion) snprintf(ttft, sizeof ttft, "%.1f", l->ttft_ms);
    else snprintf(ttft, sizeof ttft, "-");
    char line[1024];
    snprintf(line, sizeof line,
             "%s.%03dZ id=%s client=%s method=%s path=%s status=%u error=%s prompt=%s cached=%s computed=%s "
             "cause=%s completion=%s finish=%s preempted=%s ttft_ms=%s total_ms=%.1f ignored=%s\n",
             when, (int)(ts.tv_nsec / 1000000), l->id, l->client, l->method, l->path, l->status ? l->status : 499,
             l->code ? l->code : l->status ? "-" : "client_left", num[0], num[1], num[2], l->cause ? l->cause : "-",
             num[3], l->finish ? l->finish : "-", num[4], ttft, (now_s() - l->t0) * 1e3,
             l->ignored[0] ? l->ignored : "-");
    fputs(line, stderr);
}

/* A client's x-request-id is used when sane: 1 to 64 visible ASCII
 * characters (no spaces, so the log stays key=value). */
static bool sane_request_id(const char *h) {
    size_t n = h ? strlen(h) : 0;
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (h[i] < 0x21 || h[i] > 0x7e) return false;
    return true;
}

/* Fills l for a request that just arrived. */
static void log_begin(kp_server *s, struct MHD_Connection *c, const char *method, const char *url, reqlog *l) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    if (sane_request_id(h))
        snprintf(l->id, sizeof l->id, "%s", h);
    else
        snprintf(l->id, sizeof l->id, "%llx-%x-%llu", (unsigned long long)s->started, (unsigned)getpid() & 0xffff,
                 (unsigned long long)atomic_fetch_add(&s->next_req, 1) + 1);
    snprintf(l->client, sizeof l->client, "-");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        char host[64], port[8];
        socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        if (getnameinfo(sa, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
            snprintf(l->client, sizeof l->client, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
    }
    snprintf(l->method, sizeof l->method, "%.15s", method);
    for (char *m = l->method; *m; m++)
        if (*m < 0x21 || *m > 0x7e) *m = '?';
    /* the path as MHD decoded it, re-escaped: no spaces or control bytes in the line */
    size_t k = 0;
    for (const unsigned char *u = (const unsigned char *)url; *u && k + 4 < sizeof l->path; u++) {
        if (k >= 200) {
            memcpy(l->path + k, "...", 3);
            k += 3;
            break;
        }
        if (*u < 0x21 || *u > 0x7e || *u == '%') k += (size_t)snprintf(l->path + k, 4, "%%%02X", *u);
        else l->path[k++] = (char)*u;
    }
    l->path[k] = 0;
}

/* ---- plain responses ------------------------------------------------------ */

static enum MHD_Result reply(kp_server *s, struct MHD_Connection *c, unsigned status, const char *type,
                             const char *body, size_t len, const char *extra_header, const char *extra_value) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (extra_header) MHD_add_response_header(r, extra_header, extra_value);
    conn *cn = current(c);
    if (cn) {
        MHD_add_response_header(r, "x-request-id", cn->log.id);
        cn->log.status = status;
    }
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return ok;
}

/* Sends j (consumed). */
static enum MHD_Result reply_json(kp_server *s, struct MHD_Connection *c, unsigned status, json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) return reply(s, c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\","
                                                            "\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                            84, NULL, NULL);
    enum MHD_Result ok = reply(s, c, status, "application/json", text, strlen(text), NULL, NULL);
    free(text);
    return ok;
}

/* reply_json with one more header (name NULL: none). */
static enum MHD_Result reply_json_h(kp_server *s, struct MHD_Connection *c, unsigned status, json_t *j,
                                    const char *name, const char *value) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) return reply_json(s, c, status, NULL);
    enum MHD_Result ok = reply(s, c, status, "application/json", text, strlen(text), name, value);
    free(text);
    return ok;
}

/* The error body in the shape of the API the request speaks (cn NULL:
 * OpenAI's); *http gets the status that API gives it. */
static json_t *error_body(const conn *cn, const kp_oai_error *e, int *http) {
    *http = e->http;
    if (cn && cn->api == API_ANTHROPIC) {
        const char *type;
        *http = kp_anth_error_status(e->http, &type);
        return kp_anth_error_json(e);
    }
    return kp_oai_error_json(e);
}

static enum MHD_Result reply_error(kp_server *s, struct MHD_Connection *c, const kp_oai_error *e) {
    conn *cn = current(c);
    int http;
    json_t *j = error_body(cn, e, &http);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *h = NULL, *hv = NULL;
    if (cn) cn->log.code = e->code;
    if (e->http == 503) h = "Retry-After", hv = "1";
    if (e->http == 401) h = "WWW-Authenticate", hv = "Bearer";
    enum MHD_Result ok = reply(s, c, (unsigned)http, "application/json", text ? text : "{}",
                               text ? strlen(text) : 2, h, hv);
    free(text);
    return ok;
}

static enum MHD_Result fail(kp_server *s, struct MHD_Connection *c, int http, const char *type, const char *code,
                            const char *param, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result fail(kp_server *s, struct MHD_Connection *c, int http, const char *type, const char *code,
                            const char *param, const char *fmt, ...) {
    kp_oai_error e;
    kp_oai_fail(&e, http, type, code, param, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return reply_error(s, c, &e);
}

/* Maps a library status to an HTTP error for the client. */
static void status_error(kp_status st, const kp_error *err, const char *param, kp_oai_error *e) {
    switch (st) {
    case KP_EFULL:
        kp_oai_fail(e, 503, "server_error", "overloaded", param, "%s", err->msg);
        break;
    case KP_ERANGE:
        kp_oai_fail(e, 400, "invalid_request_error", "context_length_exceeded", param, "%s", err->msg);
        break;
    case KP_EINVAL:
    case KP_EFORMAT:
    case KP_EUNSUPPORTED:
    case KP_ENOTFOUND:
        kp_oai_fail(e, 400, "invalid_request_error", NULL, param, "%s", err->msg);
        break;
    default:
        kp_oai_fail(e, 500, "server_error", NULL, param, "%s", err->msg[0] ? err->msg : "internal error");
    }
}

/* A generation's kvpin_cache object: the report of its prompt's prefill,
 * the times it was preempted, and a note when the KV budget cut it short. */
static json_t *gen_cache_json(const kp_sreq_update *u) {
    json_t *j = kp_oai_cache_json(&u->report, u->has_doctor ? &u->doctor : NULL);
    if (!j) return NULL;
    json_object_set_new(j, "preemptions", json_integer((json_int_t)u->preemptions));
    if (u->finish == KP_FINISH_LENGTH && u->err.msg[0]) json_object_set_new(j, "note", json_string(u->err.msg));
    return j;
}

/* 400 kv_budget_exceeded (into *e, false) when a request of n prompt tokens
 * and max_tokens can never fit the KV budget (kp_sched_fit). */
static bool fits_budget(kp_server *s, uint32_t n, uint32_t max_tokens, bool max_tokens_set, const char *prompt_param,
                        kp_oai_error *e) {
    uint32_t eff;
    kp_error err = {0};
    if (kp_sched_fit(s->sched, n, max_tokens, max_tokens_set, &eff, &err) == KP_OK) return true;
    return kp_oai_fail(e, 400, "invalid_request_error", "kv_budget_exceeded",
                       n > kp_sched_kv_positions(s->sched) ? prompt_param : "max_tokens", "%s", err.msg);
}

/* ---- prompts ---------------------------------------------------------------- */

/* Text -> tokens the way the model expects a prompt: special tokens in the
 * text are parsed, BOS added when the vocabulary wants one and the text
 * does not start with it already. */
static bool tokenize_prompt(kp_server *s, const char *text, size_t len, const kp_tok_range *plain, size_t n_plain,
                            int32_t **ids, size_t *n, kp_oai_error *e) {
    kp_error err = {0};
    int32_t *t = NULL;
    size_t nt = 0;
    if (kp_tok_encode_plain(s->v, text, len, false, plain, n_plain, &t, &nt, &err) != KP_OK) {
        status_error(KP_EINVAL, &err, "prompt", e);
        return false;
    }
    int32_t bos = kp_tok_bos(s->v);
    if (kp_tok_add_bos(s->v) && bos >= 0 && (nt == 0 || t[0] != bos)) {
        int32_t *t2 = malloc((nt + 1) * sizeof *t2);
        if (!t2) {
            free(t);
            return kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        t2[0] = bos;
        if (nt) memcpy(t2 + 1, t, nt * sizeof *t);
        free(t);
        t = t2;
        nt++;
    }
    if (nt == 0) {
        free(t);
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "prompt",
                           "the prompt is empty and the model has no BOS token to start from");
    }
    *ids = t;
    *n = nt;
    return true;
}

/* How a chat prompt is rendered (kp_chat_opts beyond the tokens' texts). */
typedef struct {
    bool add_generation_prompt; /* chat: end with the assistant opener */
    bool disable_thinking;      /* qwen3's enable_thinking false */
} prompt_opts;

/* The prompt of a request body: "prompt" (text or token ids) or "messages"
 * (+ "tools") through the chat template, rendered as po says (NULL: the
 * generation prompt on, thinking on). Only the template's markup may
 * produce control tokens: the client's text in a rendering is tokenized as
 * plain text (kp_chat_render_plain's ranges), and so is a completions
 * prompt unless parse_special asks otherwise. */
static bool request_tokens(kp_server *s, const json_t *prompt, const json_t *messages, const json_t *tools,
                           bool parse_special, const prompt_opts *po, int32_t **ids, size_t *n, char **text_out,
                           size_t *text_len, kp_oai_error *e) {
    *ids = NULL;
    *n = 0;
    *text_out = NULL;
    *text_len = 0;
    if (messages) {
        if (s->cfg.chat == KP_CHAT_UNKNOWN)
            return kp_oai_fail(e, 400, "invalid_request_error", "no_chat_template", "messages",
                               "the model has no chat template kvpin can render; start the server with "
                               "--chat-template NAME or use /v1/completions");
        kp_chat_opts o = {s->cfg.chat_bos, s->cfg.chat_eos, po ? po->add_generation_prompt : true, NULL,
                          po ? po->disable_thinking : false};
        char *text = NULL;
        size_t len = 0;
        kp_error err = {0};
        kp_tok_range *plain = NULL;
        size_t n_plain = 0;
        kp_status st = kp_chat_render_plain(s->cfg.chat, messages, tools, &o, &text, &len, &plain, &n_plain, &err);
        if (st != KP_OK) { /* the renderer's messages start with the field at fault */
            const char *field = !strncmp(err.msg, "tools", 5) ? "tools" : "messages";
            if (st == KP_ERANGE) /* nesting too deep: a bad request, not a long prompt */
                return kp_oai_fail(e, 400, "invalid_request_error", NULL, field, "%s", err.msg);
            status_error(st, &err, field, e);
            return false;
        }
        bool ok = tokenize_prompt(s, text, len, plain, n_plain, ids, n, e);
        free(plain);
        if (ok) {
            *text_out = text;
            *text_len = len;
        } else {
            free(text);
        }
        return ok;
    }
    const json_t *p = json_is_string(prompt) ? prompt
                      : json_is_array(prompt) && json_array_size(prompt) == 1 &&
                              json_is_string(json_array_get(prompt, 0))
                          ? json_array_get(prompt, 0)
                          : NULL;
    if (p) {
        kp_tok_range all = {0, json_string_length(p)};
        if (!tokenize_prompt(s, json_string_value(p), json_string_length(p), &all, parse_special ? 0 : 1, ids, n, e))
            return false;
        *text_out = strdup(json_string_value(p)); /* NULL (no text in the report) when out of memory */
        *text_len = *text_out ? json_string_length(p) : 0;
        return true;
    }
    if (json_is_array(prompt) && json_array_size(prompt) > 0) {
        size_t k = json_array_size(prompt);
        int32_t *t = malloc(k * sizeof *t);
        if (!t) return kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        for (size_t i = 0; i < k; i++) {
            const json_t *x = json_array_get(prompt, i);
            json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
            if (id < 0 || id >= kp_tok_n_vocab(s->v)) {
                free(t);
                return kp_oai_fail(e, 400, "invalid_request_error", NULL, "prompt",
                                   "prompt[%zu] is not a token id of this model (0..%d)", i, kp_tok_n_vocab(s->v) - 1);
            }
            t[i] = (int32_t)id;
        }
        *ids = t;
        *n = k;
        return true;
    }
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, messages ? "messages" : "prompt",
                       "prompt must be a string, an array of one string or a non-empty array of token ids");
}

/* ---- slow clients: the request deadline ----------------------------------------- */

/* The request of c has arrived whole: no deadline while it is answered. */
static void guard_received(kp_server *s, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sock *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&s->guard_mu);
    k->receiving = false;
    pthread_mutex_unlock(&s->guard_mu);
}

/* An answer is done: the next request on the connection has its own deadline. */
static void guard_rearm(kp_server *s, sock *k) {
    pthread_mutex_lock(&s->guard_mu);
    k->receiving = true;
    k->deadline = now_s() + s->cfg.request_timeout_s;
    pthread_mutex_unlock(&s->guard_mu);
}

/* The guard thread: four times a second, shuts down the sockets whose
 * request is late (libmicrohttpd's thread of the connection then sees the
 * end of its input and closes it). */
static void *guard_main(void *arg) {
    kp_server *s = arg;
    pthread_mutex_lock(&s->guard_mu);
    while (!s->guard_stop) {
        double t = now_s();
        for (sock *k = s->socks; k; k = k->next)
            if (k->receiving && !k->cut && t > k->deadline) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = true;
                atomic_fetch_add(&s->cut_slow, 1);
            }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->guard_cv, &s->guard_mu, &until);
    }
    pthread_mutex_unlock(&s->guard_mu);
    return NULL;
}

/* ---- the client may leave while we wait -------------------------------------- */

/* Whether the client can no longer receive the answer: the connection was
 * reset, or failed. A client that only shut down its sending side (or
 * closed the socket: TCP cannot tell the two apart until something is
 * written) has sent its whole request and may still read the answer, so it
 * is not gone; a closed client is found out at the first write. */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {ci->connect_fd, 0, 0}; /* POLLERR and POLLHUP are always reported */
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLHUP | POLLERR)) != 0;
}

/* ---- generation ----------------------------------------------------------------- */

/* The cache_control breakpoints of a Messages request: the tokens of the
 * prefix each ends, its TTL, and how many were held by a live pin when
 * the request came. */
typedef struct {
    uint32_t pos[KP_ANTH_MAX_BREAKS];
    int64_t ttl[KP_ANTH_MAX_BREAKS]; /* seconds, --pin-ttl-scale applied */
    uint64_t hash[KP_ANTH_MAX_BREAKS]; /* kp_bpins_hash of the prefix */
    bool hit[KP_ANTH_MAX_BREAKS];    /* a live pin held it when the request came */
    int n, live;
} anth_bps;

typedef struct {
    kp_server *s;
    kp_sreq *r;
    bool chat, include_usage, sent_role, done, return_ids;
    char id[48];
    time_t created;
    kp_buf out; /* SSE bytes not yet sent: out.data[off..out.len) */
    size_t off;
    double t0;
    kp_sreq_update last;
    /* chat with tools: the whole text so far; full.data[0..released) was sent
     * as content, the rest may still turn out to be a tool call */
    bool tools;
    kp_buf full;
    size_t released;
    uint64_t id_seed;
    reqlog log;          /* the request's log line, written by stream_free */
    const char *finish;  /* the finish reason sent, once done */
    /* return_progress: prompt_progress chunks until the prompt is computed */
    bool progress, prog_any, prog_over;
    uint32_t prog_sent;
    /* prompt_cache_key ("" none) and prompt_cache_retention (NULL none) */
    char key[KP_CKEYS_KEY_MAX + 1];
    const char *retention;
    /* API_ANTHROPIC: Anthropic's events instead of OpenAI's chunks */
    int api;
    bool text_open;    /* a text content block is open */
    uint32_t n_blocks; /* content blocks started */
    size_t n_text;     /* bytes of text generated */
    json_t *stops;     /* the request's stop strings (for stop_sequence), or NULL */
    anth_bps bps;      /* its cache_control breakpoints */
    /* API_RESPONSES: the request (owned), the text and calls sent, the items */
    kp_resp_request *resp;
    kp_buf rtext;
    json_t *rcalls;
    uint32_t seq;      /* sequence_number of the next event */
    uint64_t item_seed;
} stream;

static void sb_add(stream *st, const char *b, size_t n) { kp_buf_put(&st->out, b, n); }

/* Appends `data: <j>\n\n` (j consumed). */
static void sb_event(stream *st, json_t *j) {
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!t) return;
    sb_add(st, "data: ", 6);
    sb_add(st, t, strlen(t));
    sb_add(st, "\n\n", 2);
    free(t);
}

static json_t *chunk_base(const stream *st) {
    json_t *j = json_pack("{s:s, s:s, s:I, s:s}", "id", st->id, "object",
                          st->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)st->created,
                          "model", st->s->cfg.model_name);
    if (j && st->include_usage) json_object_set_new(j, "usage", json_null()); /* as OpenAI: null until the last */
    return j;
}

/* return_token_ids: the prompt's and the completion's ids on a choice. */
static void add_token_ids(json_t *choice, const kp_sreq_update *u) {
    json_t *p = json_array(), *g = json_array();
    for (uint32_t i = 0; u->ids && i < u->prompt_tokens + u->completion_tokens; i++)
        json_array_append_new(i < u->prompt_tokens ? p : g, json_integer(u->ids[i]));
    json_object_set_new(choice, "prompt_token_ids", p);
    json_object_set_new(choice, "token_ids", g);
}

/* One chunk carrying text and/or the finish reason; ids (the last chunk of
 * a return_token_ids stream) adds the token ids, all of them at once. */
static void anth_text(stream *st, const char *text, size_t len);
static void anth_calls(stream *st, json_t *calls);
static void resp_text(stream *st, const char *text, size_t len);
static void resp_calls(stream *st, json_t *calls);

static void sb_chunk(stream *st, const char *text, size_t len, const char *finish, const kp_sreq_update *ids) {
    if (st->api == API_ANTHROPIC) {
        anth_text(st, text, text ? len : 0);
        return;
    }
    if (st->api == API_RESPONSES) {
        resp_text(st, text, text ? len : 0);
        return;
    }
    json_t *j = chunk_base(st);
    json_t *choice;
    if (st->chat) {
        json_t *delta = json_object();
        if (!st->sent_role) {
            json_object_set_new(delta, "role", json_string("assistant"));
            st->sent_role = true;
        }
        if (text) json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", delta, "logprobs", "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:s%, s:n, s:s?}", "index", 0, "text", text ? text : "", text ? len : 0,
                           "logprobs", "finish_reason", finish);
    }
    if (ids && choice) add_token_ids(choice, ids);
    json_object_set_new(j, "choices", json_pack("[o]", choice));
    sb_event(st, j);
}

/* One chunk whose delta is {"tool_calls": [call]} (call consumed). */
static void sb_tool_call_delta(stream *st, json_t *call) {
    json_t *j = chunk_base(st);
    json_t *delta = json_pack("{s:[o]}", "tool_calls", call);
    if (delta && !st->sent_role) {
        json_object_set_new(delta, "role", json_string("assistant"));
        st->sent_role = true;
    }
    json_object_set_new(j, "choices", json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0, "delta", delta, "logprobs",
                                                "finish_reason"));
    sb_event(st, j);
}

/* The tool calls as OpenAI streams them (calls consumed): per call, a chunk
 * with its index, id, type and name and empty arguments, then a chunk with
 * its index and the arguments. */
static void sb_tool_calls(stream *st, json_t *calls) {
    if (st->api == API_ANTHROPIC) {
        anth_calls(st, calls);
        return;
    }
    if (st->api == API_RESPONSES) {
        resp_calls(st, calls);
        return;
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        sb_tool_call_delta(st, json_pack("{s:I, s:O, s:s, s:{s:O, s:s}}", "index", (json_int_t)i, "id",
                                         json_object_get(c, "id"), "type", "function", "function", "name",
                                         json_object_get(fn, "name"), "arguments", ""));
        sb_tool_call_delta(st, json_pack("{s:I, s:{s:O}}", "index", (json_int_t)i, "function", "arguments",
                                         json_object_get(fn, "arguments")));
    }
    json_decref(calls);
}

/* With tools: sends the text that can no longer become a tool call; at the
 * end (final) parses the calls, sends the rest of the content and the
 * calls. Returns the finish reason to report ("tool_calls" when calls were
 * found). */
static const char *stream_tools(stream *st, const char *text, size_t len, bool final, const char *finish) {
    kp_buf_put(&st->full, text, len);
    kp_chat_family f = st->s->cfg.chat;
    if (!final) {
        size_t hold = kp_chat_tool_holdback(f, st->full.data ? st->full.data : "", st->full.len);
        if (hold > st->released) {
            sb_chunk(st, st->full.data + st->released, hold - st->released, NULL, NULL);
            st->released = hold;
        }
        return finish;
    }
    json_t *calls = NULL;
    size_t content = st->full.len;
    kp_error err;
    kp_chat_parse_tool_calls(f, st->full.data ? st->full.data : "", st->full.len, st->id_seed, &calls, &content, &err);
    if (!calls) content = st->full.len; /* all of it, trailing whitespace too, as unstreamed */
    if (content > st->released) sb_chunk(st, st->full.data + st->released, content - st->released, NULL, NULL);
    st->released = content > st->released ? content : st->released;
    if (!calls) return finish;
    sb_tool_calls(st, calls);
    return "tool_calls";
}

/* return_progress: a chunk with no choices and llama.cpp's prompt_progress
 * object (total prompt tokens, those from the cache, those computed so far
 * counting the cached ones, milliseconds since the prefill began). The
 * first one is the state at admission (processed = cache), the last one
 * processed = total; slices that passed between two waits are reported
 * once, by the later. */
static void sb_progress(stream *st, const kp_sreq_update *u) {
    if (!st->prog_any && u->prefill_done > u->report.reused_tokens) { /* the state at admission comes first */
        kp_sreq_update at = *u;
        at.prefill_done = u->report.reused_tokens;
        at.prefill_ms = 0;
        sb_progress(st, &at);
    }
    json_t *j = chunk_base(st);
    json_object_set_new(j, "choices", json_array());
    json_object_set_new(j, "prompt_progress",
                        json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)u->prompt_tokens, "cache",
                                  (json_int_t)u->report.reused_tokens, "processed", (json_int_t)u->prefill_done,
                                  "time_ms", (json_int_t)(u->prefill_ms + 0.5)));
    sb_event(st, j);
    st->prog_any = true;
    st->prog_sent = u->prefill_done;
    st->prog_over = u->prefill_done >= u->prompt_tokens;
}

/* prompt_cache_retention "24h": pins the prompt of a generation that
 * ended (its tokens are cached by now) for 24 hours; the key's previous
 * retention pin (or the oldest keyless one past the table's bound) is
 * removed. rj (the report) gets the pin or why there is none. */
static void retain_prompt(kp_server *s, const char *key, const kp_sreq_update *u, json_t *rj) {
    kp_error err = {0}, err2 = {0};
    uint64_t id = 0;
    kp_eng_stats k;
    int64_t now = (int64_t)time(NULL), ttl = 24 * 3600;
    kp_status st = u->ids && u->prompt_tokens
                       ? kp_sched_pin(s->sched, u->ids, u->prompt_tokens, ttl, now, &id, &k, &err)
                       : kp_fail(&err, KP_EINVAL, "no prompt to pin");
    if (st == KP_OK) {
        uint64_t old = kp_ckeys_retain(s->ckeys, key, id, now + ttl, now);
        if (old && old != id) kp_sched_unpin(s->sched, old, &err2); /* gone already (expired, unpinned): fine */
        char sid[32];
        snprintf(sid, sizeof sid, "pin-%llu", (unsigned long long)id);
        json_object_set_new(rj, "pinned", json_true());
        json_object_set_new(rj, "pin", json_string(sid));
        json_object_set_new(rj, "tokens", json_integer((json_int_t)u->prompt_tokens));
        json_object_set_new(rj, "expires_at", json_integer((json_int_t)(now + ttl)));
    } else {
        json_object_set_new(rj, "pinned", json_false());
        json_object_set_new(rj, "code", json_string(st == KP_EFULL ? "pinned_cap" : "not_pinned"));
        json_object_set_new(rj, "error", json_string(err.msg));
    }
    kp_sched_cache snap;
    kp_sched_cache_get(s->sched, &snap); /* published before the pin and unpin returned */
    json_object_set_new(rj, "pinned_bytes", json_integer((json_int_t)snap.kv.pinned_bytes));
    json_object_set_new(rj, "pinned_cap_bytes", json_integer((json_int_t)snap.kv.pinned_cap_bytes));
}

/* At the end of a generation: counts it under its prompt_cache_key ("":
 * none) and makes its retention pin (retention NULL: none); cj (the
 * kvpin_cache object, may be NULL) gets "prompt_cache_key" and
 * "retention". */
static void cache_fields(kp_server *s, const char *key, const char *retention, const kp_sreq_update *u, json_t *cj) {
    if (key[0]) {
        kp_ckeys_note(s->ckeys, key, u->prompt_tokens, u->cached_tokens, (int64_t)time(NULL));
        if (cj) json_object_set_new(cj, "prompt_cache_key", json_string(key));
    }
    if (!retention) return;
    json_t *rj = json_pack("{s:s}", "policy", retention);
    if (rj && !strcmp(retention, "24h")) retain_prompt(s, key[0] ? key : NULL, u, rj);
    if (cj) json_object_set_new(cj, "retention", rj);
    else json_decref(rj);
}

/* A stream's successful end: records the cache key and retention (u: the
 * last update of the request, or of its first choice), the usage chunk
 * with kvpin_cache when asked (usage and cj, both consumed; NULL when not
 * asked), then [DONE]. */
static void stream_end(stream *st, const kp_sreq_update *u, json_t *cj, json_t *usage) {
    cache_fields(st->s, st->key, st->retention, u, cj);
    if (usage) {
        json_t *j = chunk_base(st);
        json_object_set_new(j, "choices", json_array());
        json_object_set_new(j, "usage", usage);
        json_object_set_new(j, "kvpin_cache", cj);
        sb_event(st, j);
    } else {
        json_decref(cj);
    }
    sb_add(st, "data: [DONE]\n\n", 14);
    st->done = true;
}

/* ---- the Messages API's answer ------------------------------------------------- */

/* The stop_reason of an Anthropic answer that ended (kp_anth_stop_reason):
 * whether the last token generated ends the generation, and for a stop
 * string which one, from the detokenized completion. *which points into
 * stops (a JSON array, may be NULL). */
static const char *anth_stop(kp_server *s, const kp_sreq_update *u, bool calls, size_t text_len,
                             const json_t *stops, const char **which) {
    const char *arr[KP_OAI_MAX_STOPS];
    int n = 0;
    size_t i;
    const json_t *x;
    json_array_foreach(stops, i, x) if (n < KP_OAI_MAX_STOPS) arr[n++] = json_string_value(x);
    uint32_t last = u->prompt_tokens + u->completion_tokens;
    bool eog = u->ids && u->completion_tokens && kp_tok_is_eog(s->v, u->ids[last - 1]);
    char *full = NULL;
    size_t flen = 0;
    if (!calls && !eog && n && u->ids && u->finish == KP_FINISH_STOP) {
        kp_error err = {0};
        kp_tok_detokenize(s->v, u->ids + u->prompt_tokens, u->completion_tokens, false, true, &full, &flen, &err);
    }
    const char *r = kp_anth_stop_reason(calls, u->finish == KP_FINISH_LENGTH, eog, arr, n, full, flen, text_len, which);
    free(full);
    return r;
}

/* The usage of an Anthropic answer, with the input split by the cache
 * (kp_anth_cache_usage over its breakpoints). */
static json_t *anth_usage(const anth_bps *b, const kp_sreq_update *u) {
    uint32_t in, cr, rd;
    kp_anth_cache_usage(u->prompt_tokens, u->cached_tokens, b->pos, b->n, b->live, &in, &cr, &rd);
    return kp_anth_usage_json(in, cr, rd, u->completion_tokens);
}

/* At the end of a Messages generation (its prompt is cached by now): each
 * breakpoint's prefix pinned for its TTL, the pin it replaces (a refresh)
 * removed. A pin refused (the pinned-bytes cap) is reported, never an
 * error. cj (may be NULL) gets "cache_control": one object per breakpoint
 * {tokens, ttl, hit, pinned, pin, expires_at | code, error}. */
static void anth_after(kp_server *s, const anth_bps *b, const kp_sreq_update *u, json_t *cj) {
    if (b->n == 0) return;
    json_t *list = json_array();
    int64_t now = (int64_t)time(NULL);
    for (int i = 0; i < b->n; i++) {
        json_t *o = json_pack("{s:I, s:I, s:b}", "tokens", (json_int_t)b->pos[i], "ttl", (json_int_t)b->ttl[i], "hit",
                              b->hit[i]);
        kp_error err = {0}, err2 = {0};
        uint64_t id = 0;
        kp_status st = u->ids && b->pos[i] <= u->prompt_tokens
                           ? kp_sched_pin(s->sched, u->ids, b->pos[i], b->ttl[i], now, &id, NULL, &err)
                           : kp_fail(&err, KP_EINVAL, "no prompt to pin");
        if (st == KP_OK) {
            uint64_t evicted = 0;
            uint64_t old = kp_bpins_set(s->bpins, b->hash[i], id, b->pos[i], now + b->ttl[i], now, &evicted);
            if (old) kp_sched_unpin(s->sched, old, &err2); /* expired and gone already: fine */
            if (evicted) kp_sched_unpin(s->sched, evicted, &err2);
            char sid[32];
            snprintf(sid, sizeof sid, "pin-%llu", (unsigned long long)id);
            json_object_set_new(o, "pinned", json_true());
            json_object_set_new(o, "pin", json_string(sid));
            json_object_set_new(o, "expires_at", json_integer((json_int_t)(now + b->ttl[i])));
        } else {
            json_object_set_new(o, "pinned", json_false());
            json_object_set_new(o, "code", json_string(st == KP_EFULL ? "pinned_cap" : "not_pinned"));
            json_object_set_new(o, "error", json_string(err.msg));
        }
        json_array_append_new(list, o);
    }
    if (cj) json_object_set_new(cj, "cache_control", list);
    else json_decref(list);
}

static void anth_text(stream *st, const char *text, size_t len) {
    if (!len) return;
    if (!st->text_open) {
        kp_anth_event(&st->out, "content_block_start",
                      json_pack("{s:I, s:{s:s, s:s}}", "index", (json_int_t)st->n_blocks, "content_block", "type",
                                "text", "text", ""));
        st->text_open = true;
        st->n_blocks++;
    }
    kp_anth_event(&st->out, "content_block_delta",
                  json_pack("{s:I, s:{s:s, s:s%}}", "index", (json_int_t)st->n_blocks - 1, "delta", "type",
                            "text_delta", "text", text, len));
}

static void anth_close_text(stream *st) {
    if (!st->text_open) return;
    kp_anth_event(&st->out, "content_block_stop", json_pack("{s:I}", "index", (json_int_t)st->n_blocks - 1));
    st->text_open = false;
}

/* The tool calls (consumed) as tool_use blocks: each started with an
 * empty input, its input as one input_json_delta, stopped. */
static void anth_calls(stream *st, json_t *calls) {
    anth_close_text(st);
    json_t *blocks = kp_anth_content_json(NULL, 0, calls);
    json_decref(calls);
    size_t i;
    json_t *b;
    json_array_foreach(blocks, i, b) {
        char *args = json_dumps(json_object_get(b, "input"), JSON_COMPACT);
        json_object_set_new(b, "input", json_object());
        json_t *idx = json_integer((json_int_t)st->n_blocks);
        kp_anth_event(&st->out, "content_block_start", json_pack("{s:O, s:O}", "index", idx, "content_block", b));
        kp_anth_event(&st->out, "content_block_delta",
                      json_pack("{s:O, s:{s:s, s:s}}", "index", idx, "delta", "type", "input_json_delta",
                                "partial_json", args ? args : "{}"));
        kp_anth_event(&st->out, "content_block_stop", json_pack("{s:O}", "index", idx));
        json_decref(idx);
        free(args);
        st->n_blocks++;
    }
    json_decref(blocks);
}

/* The end of a Messages stream: the open block closed (an empty text
 * block when there was none), message_delta with the stop reason and the
 * usage, message_stop. */
static void anth_end(stream *st, const kp_sreq_update *u, const char *finish) {
    anth_close_text(st);
    if (st->n_blocks == 0) {
        kp_anth_event(&st->out, "content_block_start",
                      json_pack("{s:i, s:{s:s, s:s}}", "index", 0, "content_block", "type", "text", "text", ""));
        kp_anth_event(&st->out, "content_block_stop", json_pack("{s:i}", "index", 0));
    }
    const char *which;
    const char *reason = anth_stop(st->s, u, !strcmp(finish, "tool_calls"), st->n_text, st->stops, &which);
    json_t *cj = gen_cache_json(u);
    anth_after(st->s, &st->bps, u, cj);
    kp_anth_event(&st->out, "message_delta",
                  json_pack("{s:{s:s, s:s?}, s:o, s:o}", "delta", "stop_reason", reason, "stop_sequence", which,
                            "usage", anth_usage(&st->bps, u), "kvpin_cache", cj ? cj : json_null()));
    kp_anth_event(&st->out, "message_stop", json_object());
    st->done = true;
}

/* ---- the Responses API's answer ------------------------------------------------ */

/* The response object of a Responses request that ended, stored when the
 * request asks (store, the default): its conversation with the answer is
 * what previous_response_id continues. output consumed. */
static json_t *resp_final(kp_server *s, const kp_resp_request *r, const char *id, const kp_sreq_update *u,
                          json_t *output, const char *text, size_t tlen, const json_t *calls) {
    const char *status = u->finish == KP_FINISH_LENGTH && !calls ? "incomplete" : "completed";
    json_t *o = kp_resp_object_json(id, s->cfg.model_name, (int64_t)time(NULL), status, r, output,
                                    kp_resp_usage_json(u->prompt_tokens, u->cached_tokens, u->completion_tokens));
    json_t *cj = gen_cache_json(u);
    if (r->store) {
        json_t *conv = kp_resp_conv_after(r, text, tlen, calls);
        bool kept = conv && kp_rstore_put(s->rstore, id, o, conv);
        json_decref(conv);
        if (cj) json_object_set_new(cj, "stored", json_boolean(kept));
    }
    json_object_set_new(o, "kvpin_cache", cj);
    return o;
}

static json_t *resp_msg_item(stream *st, const char *status) {
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", st->item_seed, 0);
    json_t *content = json_array();
    if (!strcmp(status, "completed"))
        json_array_append_new(content, json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text",
                                                 st->rtext.data ? st->rtext.data : "", st->rtext.len, "annotations"));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", status, "role", "assistant",
                     "content", content);
}

/* The message item and its output_text part begin. */
static void resp_open_text(stream *st) {
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", st->item_seed, 0);
    kp_resp_event(&st->out, "response.output_item.added",
                  json_pack("{s:I, s:o}", "output_index", (json_int_t)st->n_blocks, "item",
                            resp_msg_item(st, "in_progress")), &st->seq);
    kp_resp_event(&st->out, "response.content_part.added",
                  json_pack("{s:s, s:I, s:i, s:{s:s, s:s, s:[]}}", "item_id", id, "output_index",
                            (json_int_t)st->n_blocks, "content_index", 0, "part", "type", "output_text", "text", "",
                            "annotations"), &st->seq);
    st->text_open = true;
}

static void resp_text(stream *st, const char *text, size_t len) {
    if (!len) return;
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", st->item_seed, 0);
    if (!st->text_open) resp_open_text(st);
    kp_buf_put(&st->rtext, text, len);
    kp_resp_event(&st->out, "response.output_text.delta",
                  json_pack("{s:s, s:I, s:i, s:s%}", "item_id", id, "output_index", (json_int_t)st->n_blocks,
                            "content_index", 0, "delta", text, len), &st->seq);
}

/* The message item ends (an empty one when forced, with nothing sent). */
static void resp_close_text(stream *st, bool force) {
    if (!st->text_open && !force) return;
    if (!st->text_open) resp_open_text(st);
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", st->item_seed, 0);
    const char *t = st->rtext.data ? st->rtext.data : "";
    kp_resp_event(&st->out, "response.output_text.done",
                  json_pack("{s:s, s:I, s:i, s:s%}", "item_id", id, "output_index", (json_int_t)st->n_blocks,
                            "content_index", 0, "text", t, st->rtext.len), &st->seq);
    kp_resp_event(&st->out, "response.content_part.done",
                  json_pack("{s:s, s:I, s:i, s:{s:s, s:s%, s:[]}}", "item_id", id, "output_index",
                            (json_int_t)st->n_blocks, "content_index", 0, "part", "type", "output_text", "text", t,
                            st->rtext.len, "annotations"), &st->seq);
    kp_resp_event(&st->out, "response.output_item.done",
                  json_pack("{s:I, s:o}", "output_index", (json_int_t)st->n_blocks, "item",
                            resp_msg_item(st, "completed")), &st->seq);
    st->text_open = false;
    st->n_blocks++;
}

/* The calls (consumed) as function_call items: added with empty
 * arguments, the arguments as one delta, done. */
static void resp_calls(stream *st, json_t *calls) {
    resp_close_text(st, false);
    json_t *items = kp_resp_output_json(NULL, 0, calls, st->item_seed);
    st->rcalls = calls;
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        json_t *idx = json_integer((json_int_t)st->n_blocks);
        json_t *added = json_deep_copy(it);
        json_object_set_new(added, "arguments", json_string(""));
        json_object_set_new(added, "status", json_string("in_progress"));
        kp_resp_event(&st->out, "response.output_item.added", json_pack("{s:O, s:o}", "output_index", idx, "item", added),
                      &st->seq);
        kp_resp_event(&st->out, "response.function_call_arguments.delta",
                      json_pack("{s:O, s:O, s:O}", "item_id", json_object_get(it, "id"), "output_index", idx, "delta",
                                json_object_get(it, "arguments")), &st->seq);
        kp_resp_event(&st->out, "response.function_call_arguments.done",
                      json_pack("{s:O, s:O, s:O}", "item_id", json_object_get(it, "id"), "output_index", idx,
                                "arguments", json_object_get(it, "arguments")), &st->seq);
        kp_resp_event(&st->out, "response.output_item.done", json_pack("{s:O, s:O}", "output_index", idx, "item", it),
                      &st->seq);
        json_decref(idx);
        st->n_blocks++;
    }
    json_decref(items);
}

static void resp_end(stream *st, const kp_sreq_update *u, const char *finish) {
    (void)finish;
    if (!st->resp) { /* out of memory when the stream began */
        st->done = true;
        return;
    }
    resp_close_text(st, st->n_blocks == 0);
    const char *t = st->rtext.data ? st->rtext.data : "";
    json_t *output = kp_resp_output_json(t, st->rtext.len, st->rcalls, st->item_seed);
    json_t *o = resp_final(st->s, st->resp, st->id, u, output, t, st->rtext.len, st->rcalls);
    bool incomplete = !strcmp(json_string_value(json_object_get(o, "status")) ? json_string_value(json_object_get(o, "status")) : "", "incomplete");
    kp_resp_event(&st->out, incomplete ? "response.incomplete" : "response.completed", json_pack("{s:o}", "response", o),
                  &st->seq);
    st->done = true;
}

/* Turns a scheduler update into SSE events. */
static void stream_update(stream *st, kp_sreq_update *u) {
    const char *finish = kp_oai_finish_name(u->finish);
    st->n_text += u->len;
    bool over = u->finish == KP_FINISH_LENGTH || u->finish == KP_FINISH_STOP;
    if (st->progress && u->admitted && !st->prog_over && (!st->prog_any || u->prefill_done != st->prog_sent))
        sb_progress(st, u);
    if (st->tools)
        finish = stream_tools(st, u->text ? u->text : "", u->len, over, finish);
    else if (u->len > 0)
        sb_chunk(st, u->text, u->len, NULL, NULL);
    free(u->text);
    u->text = NULL;
    st->last = *u; /* usage so far, for the log line */
    if (u->finish == KP_FINISH_NONE) return;
    if (u->finish == KP_FINISH_ERROR || u->finish == KP_FINISH_CANCELLED) {
        kp_oai_error e;
        status_error(u->finish == KP_FINISH_ERROR ? u->status : KP_EIO, &u->err, NULL, &e);
        if (u->finish == KP_FINISH_CANCELLED) snprintf(e.message, sizeof e.message, "the request was cancelled");
        if (st->api == API_ANTHROPIC) {
            kp_anth_event(&st->out, "error", kp_anth_error_json(&e));
            st->done = true;
            return;
        }
        if (st->api == API_RESPONSES) {
            kp_resp_event(&st->out, "error", json_pack("{s:s, s:s?, s:s}", "message", e.message, "code", e.code,
                                                       "param", e.param), &st->seq);
            st->done = true;
            return;
        }
        sb_event(st, kp_oai_error_json(&e));
    } else if (st->api == API_ANTHROPIC) {
        st->finish = finish;
        anth_end(st, u, finish);
        return;
    } else if (st->api == API_RESPONSES) {
        st->finish = finish;
        resp_end(st, u, finish);
        return;
    } else {
        st->finish = finish;
        sb_chunk(st, NULL, 0, finish, st->return_ids ? u : NULL);
        stream_end(st, u, st->include_usage ? gen_cache_json(u) : NULL,
                   st->include_usage ? kp_oai_usage_json(u->prompt_tokens, u->cached_tokens, u->completion_tokens)
                                     : NULL);
        return;
    }
    sb_add(st, "data: [DONE]\n\n", 14);
    st->done = true;
}

/* The SSE bytes of a stream for libmicrohttpd: what is buffered, else the
 * events pump adds from the next update (pump waits up to timeout_ms and
 * returns false when none came); a keep-alive comment every 5 s without
 * news (it keeps proxies open and finds clients that left). At shutdown
 * cancel(cls) and the stream ends with an error. */
static ssize_t sse_read(stream *st, bool (*pump)(void *cls, int timeout_ms), void (*cancel)(void *cls), void *cls,
                        char *out, size_t max) {
    double waited = 0;
    while (st->off == st->out.len) {
        st->off = 0;
        kp_buf_clear(&st->out);
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&st->s->stopping)) {
            cancel(cls);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!pump(cls, 250)) {
            waited += 0.25;
            if (waited >= 5) {
                sb_add(st, ": keep-alive\n\n", 14);
                waited = 0;
            }
        }
    }
    if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = st->out.len - st->off < max ? st->out.len - st->off : max;
    memcpy(out, st->out.data + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static bool stream_pump(void *cls, int timeout_ms) {
    stream *st = cls;
    kp_sreq_update u;
    if (!kp_sreq_wait(st->r, timeout_ms, &u)) {
        free(u.text);
        return false;
    }
    stream_update(st, &u);
    return true;
}

static void stream_cancel(void *cls) { kp_sreq_cancel(((stream *)cls)->r); }

static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    return sse_read(cls, stream_pump, stream_cancel, cls, out, max);
}

/* The log's word for how a generation ended (not done: the client left). */
static const char *finish_word(const kp_sreq_update *u, bool done) {
    if (!done) return "client_left";
    switch (u->finish) {
    case KP_FINISH_LENGTH: return "length";
    case KP_FINISH_STOP: return "stop";
    case KP_FINISH_CANCELLED: return "cancelled";
    case KP_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (!st->done) kp_sreq_cancel(st->r);
    note_gen(&st->log, &st->last, st->done && st->finish ? st->finish : finish_word(&st->last, st->done));
    log_line(st->s, &st->log);
    kp_sreq_release(st->r);
    kp_buf_free(&st->out);
    kp_buf_free(&st->full);
    json_decref(st->stops);
    kp_resp_request_free(st->resp);
    free(st->resp);
    kp_buf_free(&st->rtext);
    json_decref(st->rcalls);
    free(st);
}

/* Answers 200 with the event stream that reader produces from cls (free_cb
 * releases cls when the response ends; st is its stream, for the log line
 * of a response that could not be made). */
static enum MHD_Result sse_response(kp_server *s, struct MHD_Connection *c, conn *cn, MHD_ContentReaderCallback reader,
                                    void *cls, MHD_ContentReaderFreeCallback free_cb, stream *st,
                                    const char *hname, const char *hvalue) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, cls, free_cb);
    if (!resp) {
        st->log.status = 500;
        st->log.code = "out_of_memory";
        free_cb(cls);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "x-request-id", cn->log.id);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    if (hname) MHD_add_response_header(resp, hname, hvalue);
    enum MHD_Result res = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    count_status(s, 200);
    return res;
}

/* ---- n choices and logprobs ------------------------------------------------ *
 *
 * A request with n > 1 or logprobs goes through kp_sched_submit_n: n
 * scheduler requests (choice i samples with seed + i), waited on together
 * with kp_sreq_wait_any. The choices' text, logprobs and finish are kept
 * per choice; usage counts the prompt once (choice 0's prompt and cached
 * tokens) and sums the completions. Streaming: every chunk names its
 * choice (`index`) and carries the logprobs of the tokens it brings; each
 * choice gets its own finish chunk; usage (when asked) comes once, after
 * the last choice ended. With tools, a streamed choice's text is held
 * until it ends, then sent as content or tool calls. A failed choice
 * fails the request; a client that leaves cancels every choice. */

typedef struct {
    kp_buf text;         /* the text so far (non-streaming, or streaming with tools) */
    json_t *lp;          /* the logprobs object being built (non-streaming); NULL: none asked */
    size_t lp_off;       /* text offset of the next token's logprob entry */
    kp_sreq_update last; /* the last update (usage, report, ids, finish); no text or lp */
} choice;

typedef struct {
    stream base; /* id, flags, the SSE bytes not yet sent, the log line; base.r is NULL */
    kp_sreq *rs[KP_OAI_MAX_N];
    choice ch[KP_OAI_MAX_N];
    uint32_t n, which, n_over;
    bool logprobs;
} mstream;

static void mstream_free_all(mstream *m) {
    for (uint32_t i = 0; i < m->n; i++) {
        kp_sreq_release(m->rs[i]);
        kp_buf_free(&m->ch[i].text);
        json_decref(m->ch[i].lp);
    }
    kp_buf_free(&m->base.out);
    kp_buf_free(&m->base.full);
    free(m);
}

static void cancel_all(mstream *m) {
    for (uint32_t i = 0; i < m->n; i++) kp_sreq_cancel(m->rs[i]);
}

/* The usage of the whole request: the prompt once, the completions summed;
 * *computed: the positions every choice's prefill computed together. */
static json_t *choices_usage(const mstream *m, uint32_t *completion, uint32_t *computed) {
    uint32_t done = 0, comp = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        done += m->ch[i].last.completion_tokens;
        comp += m->ch[i].last.report.computed_tokens;
    }
    if (completion) *completion = done;
    if (computed) *computed = comp;
    return kp_oai_usage_json(m->ch[0].last.prompt_tokens, m->ch[0].last.cached_tokens, done);
}

static json_t *choices_cache_json(const mstream *m) {
    uint32_t computed;
    json_decref(choices_usage(m, NULL, &computed));
    json_t *j = gen_cache_json(&m->ch[0].last);
    if (j) {
        json_object_set_new(j, "choices", json_integer((json_int_t)m->n));
        json_object_set_new(j, "choices_computed_tokens", json_integer((json_int_t)computed));
    }
    return j;
}

/* Moves update u of choice c in: text (when keep_text), logprobs into c->lp
 * (when built here) or into *lp_out (a new object, streaming), the rest
 * into c->last. */
static void choice_take(const mstream *m, choice *c, kp_sreq_update *u, bool keep_text, json_t **lp_out) {
    const kp_server *s = m->base.s;
    if (lp_out) *lp_out = NULL;
    if (m->logprobs && u->n_lp > 0) {
        json_t *o = lp_out ? kp_oai_logprobs_new(m->base.chat) : c->lp;
        kp_oai_logprobs_append(s->v, m->base.chat, u->lp, u->n_lp, o, &c->lp_off);
        if (lp_out) *lp_out = o;
    }
    if (keep_text && u->len) kp_buf_put(&c->text, u->text, u->len);
    free(u->lp);
    u->lp = NULL;
    u->n_lp = 0;
    free(u->text);
    u->text = NULL;
    u->len = 0;
    c->last = *u;
}

/* A streamed chunk of choice i: text (may be NULL), its logprobs (lp, consumed,
 * may be NULL), the finish reason (NULL: none yet), token ids (the last chunk
 * with return_token_ids). */
static void mchunk(mstream *m, uint32_t i, const char *text, size_t len, json_t *lp, const char *finish,
                   const kp_sreq_update *ids) {
    stream *st = &m->base;
    json_t *j = chunk_base(st), *choice;
    if (st->chat) {
        json_t *delta = json_object();
        if (text) json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", (int)i, "delta", delta, "logprobs",
                           lp ? lp : json_null(), "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:s?}", "index", (int)i, "text", text ? text : "", text ? len : 0,
                           "logprobs", lp ? lp : json_null(), "finish_reason", finish);
    }
    if (ids && choice) add_token_ids(choice, ids);
    json_object_set_new(j, "choices", json_pack("[o]", choice));
    sb_event(st, j);
}

/* With tools, at a choice's end: its calls parsed out of the text, the rest
 * sent as content; returns the finish reason to report. */
static const char *mchunk_tools(mstream *m, uint32_t i, const char *finish) {
    stream *st = &m->base;
    choice *c = &m->ch[i];
    json_t *calls = NULL;
    size_t content = c->text.len;
    kp_error err;
    kp_chat_parse_tool_calls(st->s->cfg.chat, c->text.data ? c->text.data : "", c->text.len, st->id_seed + i, &calls,
                             &content, &err);
    if (content) mchunk(m, i, c->text.data, content, NULL, NULL, NULL);
    if (!calls) return finish;
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) json_object_set_new(call, "index", json_integer((json_int_t)k));
    json_t *j = chunk_base(st);
    json_object_set_new(j, "choices", json_pack("[{s:i, s:{s:o}, s:n, s:n}]", "index", (int)i, "delta", "tool_calls",
                                                calls, "logprobs", "finish_reason"));
    sb_event(st, j);
    return "tool_calls";
}

/* Turns an update of choice i into SSE events. */
static void mstream_update(mstream *m, uint32_t i, kp_sreq_update *u) {
    stream *st = &m->base;
    choice *c = &m->ch[i];
    json_t *lp;
    const char *text = u->text;
    size_t len = u->len;
    u->text = NULL; /* choice_take frees the rest; the text is kept below */
    u->len = 0;
    choice_take(m, c, u, false, &lp);
    if (st->tools) {
        if (len) kp_buf_put(&c->text, text, len);
        if (lp) mchunk(m, i, NULL, 0, lp, NULL, NULL);
    } else if (len || lp) {
        mchunk(m, i, text ? text : "", len, lp, NULL, NULL);
    }
    free((char *)text);
    st->last = c->last;
    if (u->finish == KP_FINISH_NONE) return;
    if (u->finish == KP_FINISH_ERROR || u->finish == KP_FINISH_CANCELLED) {
        kp_oai_error e;
        status_error(u->finish == KP_FINISH_ERROR ? u->status : KP_EIO, &u->err, NULL, &e);
        if (u->finish == KP_FINISH_CANCELLED) snprintf(e.message, sizeof e.message, "the request was cancelled");
        sb_event(st, kp_oai_error_json(&e));
        cancel_all(m);
    } else {
        const char *finish = kp_oai_finish_name(u->finish);
        if (st->tools) finish = mchunk_tools(m, i, finish);
        mchunk(m, i, NULL, 0, NULL, finish, st->return_ids ? &c->last : NULL);
        st->finish = finish;
        if (++m->n_over < m->n) return;
        stream_end(st, &m->ch[0].last, st->include_usage ? choices_cache_json(m) : NULL,
                   st->include_usage ? choices_usage(m, NULL, NULL) : NULL);
        return;
    }
    sb_add(st, "data: [DONE]\n\n", 14);
    st->done = true;
}

static bool mstream_pump(void *cls, int timeout_ms) {
    mstream *m = cls;
    kp_sreq_update u;
    if (!kp_sreq_wait_any(m->rs, m->n, timeout_ms, &m->which, &u)) return false;
    mstream_update(m, m->which, &u);
    return true;
}

static void mstream_cancel(void *cls) { cancel_all(cls); }

static ssize_t mstream_reader(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    mstream *m = cls;
    return sse_read(&m->base, mstream_pump, mstream_cancel, m, out, max);
}

static void mstream_free(void *cls) {
    mstream *m = cls;
    stream *st = &m->base;
    if (!st->done) cancel_all(m);
    uint32_t completion;
    json_decref(choices_usage(m, &completion, NULL));
    st->last.completion_tokens = completion;
    note_gen(&st->log, &st->last, st->done && st->finish ? st->finish : finish_word(&st->last, st->done));
    log_line(st->s, &st->log);
    mstream_free_all(m);
}

/* The final choice object of choice i (non-streaming). */
static json_t *choice_json(mstream *m, uint32_t i, const char **finish_out) {
    stream *st = &m->base;
    choice *c = &m->ch[i];
    const char *text = c->text.data ? c->text.data : "";
    size_t tlen = c->text.len;
    const char *finish = kp_oai_finish_name(c->last.finish);
    json_t *calls = NULL, *ch;
    size_t content = tlen;
    if (st->tools && (c->last.finish == KP_FINISH_LENGTH || c->last.finish == KP_FINISH_STOP)) {
        kp_error err;
        kp_chat_parse_tool_calls(st->s->cfg.chat, text, tlen, st->id_seed + i, &calls, &content, &err);
    }
    json_t *lp = c->lp ? c->lp : json_null();
    c->lp = NULL;
    if (st->chat && calls) {
        json_t *msg = json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                                content ? json_stringn(text, content) : json_null(), "tool_calls", calls);
        finish = "tool_calls";
        ch = json_pack("{s:i, s:o, s:o, s:s}", "index", (int)i, "message", msg, "logprobs", lp, "finish_reason",
                       finish);
    } else if (st->chat) {
        ch = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s?}", "index", (int)i, "message", "role", "assistant", "content",
                       text, tlen, "logprobs", lp, "finish_reason", finish);
    } else {
        ch = json_pack("{s:i, s:s%, s:o, s:s?}", "index", (int)i, "text", text, tlen, "logprobs", lp,
                       "finish_reason", finish);
    }
    if (st->return_ids && ch) add_token_ids(ch, &c->last);
    if (finish_out && finish) *finish_out = finish;
    return ch;
}

/* generate() for n > 1 or logprobs: submits the choices, waits, answers
 * (one JSON body, or the stream). p's strings are copied by the submit. */
static enum MHD_Result generate_choices(kp_server *s, struct MHD_Connection *c, conn *cn, const kp_oai_request *q,
                                        const kp_sreq_params *p, bool tools, const char *key,
                                        const char *retention, const char *ign_h, const char *ignored) {
    bool chat = q->chat;
    kp_oai_error e;
    mstream *m = calloc(1, sizeof *m);
    if (!m) return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    m->n = q->n;
    m->which = m->n - 1;
    m->logprobs = q->logprobs;
    kp_error err = {0};
    kp_status st = kp_sched_submit_n(s->sched, p, m->n, q->logprobs ? (int32_t)q->top_logprobs : -1, m->rs, &err);
    if (st != KP_OK) {
        const char *param = st == KP_ERANGE ? (chat ? "messages" : "prompt") : st == KP_EINVAL ? "n" : NULL;
        free(m);
        status_error(st, &err, param, &e);
        return reply_error(s, c, &e);
    }
    stream *sm = &m->base;
    sm->s = s;
    sm->chat = chat;
    sm->include_usage = q->include_usage;
    sm->return_ids = q->return_token_ids;
    sm->tools = tools;
    sm->created = time(NULL);
    sm->t0 = cn->t0;
    sm->id_seed = p->sp.seed ^ (uint64_t)sm->created;
    snprintf(sm->key, sizeof sm->key, "%s", key);
    sm->retention = retention;
    snprintf(sm->id, sizeof sm->id, "%s-%016llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)s->started));
    for (uint32_t i = 0; i < m->n; i++)
        if (m->logprobs && !(m->ch[i].lp = kp_oai_logprobs_new(chat))) {
            mstream_free_all(m);
            return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
        }
    if (q->stream && chat) /* the role first, for every choice, as OpenAI does */
        for (uint32_t i = 0; i < m->n; i++) {
            json_t *j = chunk_base(sm);
            json_object_set_new(j, "choices", json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", (int)i, "delta",
                                                        "role", "assistant", "content", "", "logprobs",
                                                        "finish_reason"));
            sb_event(sm, j);
        }
    /* non-streaming: until every choice ended; streaming: until choice 0's
     * prompt is computed (what came by then is in the stream's first bytes) */
    bool started = false, failed = false;
    kp_sreq_update bad = {0};
    while (q->stream ? !started && !sm->done : m->n_over < m->n) {
        kp_sreq_update u;
        bool news = kp_sreq_wait_any(m->rs, m->n, 100, &m->which, &u);
        if (client_gone(c) || atomic_load(&s->stopping)) {
            if (news) {
                free(u.text);
                free(u.lp);
            }
            cancel_all(m);
            bool stopping = atomic_load(&s->stopping);
            note_gen(&cn->log, &m->ch[0].last, stopping ? "cancelled" : "client_left");
            if (stopping) cn->log.code = "server_stopping";
            mstream_free_all(m);
            return MHD_NO;
        }
        if (!news) continue;
        uint32_t i = m->which;
        if (u.finish == KP_FINISH_ERROR || (u.finish == KP_FINISH_CANCELLED && !u.started)) {
            free(u.text);
            free(u.lp);
            bad = u;
            failed = true;
            break;
        }
        if (q->stream) {
            mstream_update(m, i, &u);
        } else {
            choice_take(m, &m->ch[i], &u, true, NULL);
            if (u.finish != KP_FINISH_NONE) m->n_over++;
        }
        if (m->ch[0].last.started) started = true;
    }
    if (failed) {
        cancel_all(m);
        status_error(bad.finish == KP_FINISH_ERROR ? bad.status : KP_EIO, &bad.err, NULL, &e);
        if (bad.finish == KP_FINISH_CANCELLED) kp_oai_fail(&e, 503, "server_error", NULL, NULL, "the server is stopping");
        note_gen(&cn->log, &bad, finish_word(&bad, true));
        mstream_free_all(m);
        return reply_error(s, c, &e);
    }
    if (!q->stream) {
        json_t *arr = json_array();
        const char *finish = NULL;
        for (uint32_t i = 0; i < m->n; i++) json_array_append_new(arr, choice_json(m, i, &finish));
        uint32_t completion;
        json_t *usage = choices_usage(m, &completion, NULL);
        json_t *cj = choices_cache_json(m);
        cache_fields(s, key, retention, &m->ch[0].last, cj);
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", sm->id, "object",
                              chat ? "chat.completion" : "text_completion", "created", (json_int_t)time(NULL), "model",
                              s->cfg.model_name, "choices", arr, "usage", usage, "kvpin_cache", cj);
        kp_sreq_update l = m->ch[0].last;
        l.completion_tokens = completion;
        note_gen(&cn->log, &l, finish ? finish : finish_word(&l, true));
        mstream_free_all(m);
        return reply_json_h(s, c, 200, j, ign_h, ignored);
    }
    sm->log = cn->log;
    sm->log.status = 200;
    cn->streamed = true;
    return sse_response(s, c, cn, mstream_reader, m, mstream_free, sm, ign_h, ignored);
}

/* The compiled grammar of q's constraint (NULL when it has none) as a new
 * reference, from the server's cache. false with *e set: a schema or
 * grammar kvpin cannot compile is the client's 400, naming the field. */
static bool request_grammar(kp_server *s, const kp_oai_request *q, kp_grammar **g, kp_oai_error *e) {
    *g = NULL;
    if (!q->constraint) return true;
    kp_error err = {0};
    kp_status st = kp_gcache_get(s->gc, (kp_gc_kind)q->constraint, q->schema, q->grammar, q->grammar_len, g, &err);
    if (st == KP_OK) return true;
    if (st == KP_ENOMEM) return kp_oai_fail(e, 500, "server_error", NULL, q->constraint_param, "%s", err.msg);
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, q->constraint_param, "%s", err.msg);
}

/* The grammar of a forced tool call (tool_choice "required" or a named
 * function): the template's call markup around a JSON document of the
 * call schema built from the tools (chat.h kp_chat_call_form_build; one
 * call unless parallel_tool_calls is true: the output ends after it, where
 * a small model would otherwise go on calling), compiled once per tool list
 * through the grammar cache. false with *e: an unknown function name or a
 * parameters schema outside the subset is the client's 400. */
static bool tool_grammar(kp_server *s, const kp_oai_request *q, kp_grammar **g, kp_oai_error *e) {
    *g = NULL;
    bool parallel = json_is_true(json_object_get(q->root, "parallel_tool_calls")); /* one call unless asked */
    kp_chat_call_form form;
    kp_error err = {0};
    kp_status st = kp_chat_call_form_build(s->cfg.chat, q->tools, q->tool_force_name, parallel, &form, &err);
    if (st == KP_OK) {
        kp_gc_frame fr = {form.prefix, form.suffix, form.prefix_len, form.suffix_len};
        st = kp_gcache_get_framed(s->gc, form.schema, &fr, g, &err);
        kp_chat_call_form_free(&form);
        if (st == KP_OK) return true;
        if (st == KP_ENOMEM) return kp_oai_fail(e, 500, "server_error", NULL, "tools", "%s", err.msg);
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "tools", "a forced tool call: %s", err.msg);
    }
    if (st == KP_ENOMEM) return kp_oai_fail(e, 500, "server_error", NULL, "tool_choice", "%s", err.msg);
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, "tool_choice", "%s", err.msg);
}

/* What another API adds to a generation it sends as a chat-completions
 * body: its API (the shape of the answer), the fields of its own body kvpin
 * did not act on, and for the Messages API the request (stops, breakpoints). */
typedef struct {
    int api;
    const char *ignored; /* "" when none */
    const kp_anth_request *anth;
    anth_bps bps; /* filled by generate_as */
    kp_resp_request *resp; /* API_RESPONSES: a stream takes it over (then zeroed) */
} gen_api;

static void anth_breaks(kp_server *s, gen_api *x, const int32_t *ids, size_t n);
static enum MHD_Result anth_reply(kp_server *s, struct MHD_Connection *c, conn *cn, gen_api *x,
                                  const kp_sreq_update *u, const char *text, size_t tlen, const char *ign_h,
                                  const char *ignored);
static enum MHD_Result resp_reply(kp_server *s, struct MHD_Connection *c, conn *cn, gen_api *x,
                                  const kp_sreq_update *u, const char *id, const char *text, size_t tlen,
                                  const char *ign_h, const char *ignored);

/* A completions (chat false) or chat-completions request of body[0..len),
 * answered in the shape of x's API (x NULL: OpenAI's). */
static enum MHD_Result generate_as(kp_server *s, struct MHD_Connection *c, conn *cn, bool chat, const char *body,
                                   size_t blen, gen_api *x) {
    kp_oai_request q;
    kp_oai_error e;
    if (!kp_oai_parse_opts(body, blen, chat, s->cfg.strict_api, &q, &e)) return reply_error(s, c, &e);
    /* the request policy's leftovers: what the template cannot do, the names for the header and the log */
    if (q.enable_thinking_set && s->cfg.chat != KP_CHAT_QWEN3)
        kp_oai_note_ignored(&q.ignored, "chat_template_kwargs.enable_thinking");
    char ignored[1100];
    snprintf(ignored, sizeof ignored, "%s%s%s", x ? x->ignored : "", x && x->ignored[0] && q.ignored.data ? "," : "",
             q.ignored.data ? q.ignored.data : "");
    snprintf(cn->log.ignored, sizeof cn->log.ignored, "%.200s", ignored);
    const char *ign_h = ignored[0] ? "x-kvpin-ignored-fields" : NULL;
    char key[KP_CKEYS_KEY_MAX + 1];
    snprintf(key, sizeof key, "%s", q.prompt_cache_key ? q.prompt_cache_key : "");
    const char *retention = !q.retention ? NULL : q.retain_24h ? "24h" : "in_memory";
    prompt_opts po = {q.add_generation_prompt, q.enable_thinking_set && !q.enable_thinking};
    int32_t *ids = NULL;
    size_t n = 0, tlen0 = 0;
    char *ptext = NULL;
    bool ok = q.prompt_tokens ? true
                              : request_tokens(s, chat ? NULL : json_object_get(q.root, "prompt"), q.messages,
                                               q.tools, q.parse_special, &po, &ids, &n, &ptext, &tlen0, &e);
    if (q.prompt_tokens) {
        for (uint32_t i = 0; i < q.n_prompt_tokens && ok; i++)
            if (q.prompt_tokens[i] >= kp_tok_n_vocab(s->v))
                ok = kp_oai_fail(&e, 400, "invalid_request_error", NULL, "prompt",
                                 "prompt[%u] is not a token id of this model (0..%d)", i, kp_tok_n_vocab(s->v) - 1);
        ids = q.prompt_tokens;
        n = q.n_prompt_tokens;
        q.prompt_tokens = NULL;
    }
    if (!ok) {
        free(ids);
        free(ptext);
        kp_oai_request_free(&q);
        return reply_error(s, c, &e);
    }
    if (x && x->api == API_ANTHROPIC) anth_breaks(s, x, ids, n);
    uint32_t ctx = s->ctx;
    if (n > ctx) {
        kp_oai_request_free(&q);
        free(ids);
        free(ptext);
        return fail(s, c, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                    "the prompt has %zu tokens, more than the context of %u tokens", n, ctx);
    }
    uint32_t max_tokens = q.max_tokens_set ? q.max_tokens
                          : chat           ? ctx - (uint32_t)n
                                           : (s->cfg.completion_max_tokens ? s->cfg.completion_max_tokens : 16);
    if (!fits_budget(s, (uint32_t)n, max_tokens, q.max_tokens_set, chat ? "messages" : "prompt", &e)) {
        kp_oai_request_free(&q);
        free(ids);
        free(ptext);
        return reply_error(s, c, &e);
    }
    kp_grammar *grammar = NULL;
    if (!(q.tool_force ? tool_grammar(s, &q, &grammar, &e) : request_grammar(s, &q, &grammar, &e))) {
        kp_oai_request_free(&q);
        free(ids);
        free(ptext);
        return reply_error(s, c, &e);
    }
    if (!q.seed_set) q.sp.seed = (uint64_t)time(NULL) ^ (atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull);
    kp_sreq_params p = {ids,   (uint32_t)n, max_tokens, q.sp, q.stops, q.n_stops, q.ignore_eos,
                        ptext, tlen0,       q.max_tokens_set, grammar};
    if (!x && (q.n > 1 || q.logprobs)) {
        enum MHD_Result res = generate_choices(s, c, cn, &q, &p, chat && q.tools, key, retention, ign_h, ignored);
        kp_grammar_free(grammar); /* the choices hold their own references */
        free(ids);
        free(ptext);
        kp_oai_request_free(&q);
        return res;
    }
    kp_sreq *r = NULL;
    kp_error err = {0};
    kp_status st = kp_sched_submit(s->sched, &p, &r, &err);
    kp_grammar_free(grammar); /* the request holds its own reference */
    free(ids);
    free(ptext);
    bool stream_it = q.stream, usage = q.include_usage, return_ids = q.return_token_ids;
    bool progress = q.return_progress && q.stream;
    bool tools = chat && q.tools; /* the template's tool syntax, or the generic format (chat.h) */
    kp_oai_request_free(&q);
    if (st != KP_OK) {
        status_error(st, &err, st == KP_ERANGE ? (chat ? "messages" : "prompt") : NULL, &e);
        return reply_error(s, c, &e);
    }
    if (progress) kp_sreq_progress(r);
    /* wait until the prompt is computed (or the request failed) */
    kp_sreq_update u = {0};
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    for (;;) {
        kp_sreq_update v;
        kp_sreq_wait(r, 100, &v);
        if (v.text) {
            if (tlen + v.len + 1 > tcap) {
                size_t nc = tcap ? tcap : 1024;
                while (nc < tlen + v.len + 1) nc *= 2;
                char *nb = realloc(text, nc);
                if (nb) text = nb, tcap = nc;
            }
            if (tlen + v.len + 1 <= tcap) {
                memcpy(text + tlen, v.text, v.len);
                tlen += v.len;
                text[tlen] = 0;
            }
            free(v.text);
            v.text = NULL;
        }
        u = v;
        if (u.finish != KP_FINISH_NONE || (stream_it && (u.started || (progress && u.admitted)))) break;
        if (client_gone(c) || atomic_load(&s->stopping)) {
            kp_sreq_cancel(r);
            bool stopping = atomic_load(&s->stopping);
            note_gen(&cn->log, &u, stopping ? "cancelled" : "client_left");
            if (stopping) cn->log.code = "server_stopping";
            kp_sreq_release(r);
            free(text);
            return MHD_NO;
        }
    }
    if (u.finish == KP_FINISH_ERROR || (u.finish == KP_FINISH_CANCELLED && !u.started)) {
        status_error(u.finish == KP_FINISH_ERROR ? u.status : KP_EIO, &u.err, NULL, &e);
        if (u.finish == KP_FINISH_CANCELLED) kp_oai_fail(&e, 503, "server_error", NULL, NULL, "the server is stopping");
        note_gen(&cn->log, &u, finish_word(&u, true));
        kp_sreq_release(r);
        free(text);
        return reply_error(s, c, &e);
    }
    char id[48];
    snprintf(id, sizeof id, "%s%016llx",
             x && x->api == API_ANTHROPIC ? "msg_" : x && x->api == API_RESPONSES ? "resp_" : chat ? "chatcmpl-" : "cmpl-",
             (unsigned long long)(atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)s->started));
    if (stream_it) {
        stream *sm = calloc(1, sizeof *sm);
        if (!sm) {
            kp_sreq_release(r);
            free(text);
            return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
        }
        sm->s = s;
        sm->r = r;
        sm->chat = chat;
        sm->include_usage = usage;
        sm->return_ids = return_ids;
        sm->created = time(NULL);
        sm->t0 = cn->t0;
        sm->log = cn->log;
        sm->log.status = 200;
        cn->streamed = true;
        memcpy(sm->id, id, sizeof id);
        sm->tools = tools;
        sm->id_seed = p.sp.seed ^ (uint64_t)sm->created;
        sm->progress = progress;
        memcpy(sm->key, key, sizeof key);
        sm->retention = retention;
        if (x && x->api == API_ANTHROPIC) {
            sm->api = API_ANTHROPIC;
            sm->bps = x->bps;
            sm->stops = json_incref(json_object_get(x->anth->chat, "stop"));
            json_t *usage = anth_usage(&sm->bps, &u);
            json_object_set_new(usage, "output_tokens", json_integer(0));
            kp_anth_event(&sm->out, "message_start",
                          json_pack("{s:o}", "message",
                                    kp_anth_message_json(sm->id, s->cfg.model_name, json_array(), NULL, NULL, usage)));
            kp_anth_event(&sm->out, "ping", json_object());
        } else if (x && x->api == API_RESPONSES) {
            sm->api = API_RESPONSES;
            sm->resp = malloc(sizeof *sm->resp);
            if (sm->resp) { /* the stream owns the request from here */
                *sm->resp = *x->resp;
                memset(x->resp, 0, sizeof *x->resp);
            }
            sm->item_seed = p.sp.seed ^ (uint64_t)sm->created;
            json_t *o = sm->resp ? kp_resp_object_json(sm->id, s->cfg.model_name, (int64_t)sm->created, "in_progress",
                                                       sm->resp, NULL, NULL)
                                 : NULL;
            kp_resp_event(&sm->out, "response.created", json_pack("{s:O}", "response", o), &sm->seq);
            kp_resp_event(&sm->out, "response.in_progress", json_pack("{s:o}", "response", o), &sm->seq);
        } else if (chat) {
            sb_chunk(sm, "", 0, NULL, NULL); /* the role first, as OpenAI does */
        }
        u.text = text;
        u.len = tlen;
        stream_update(sm, &u); /* frees text */
        return sse_response(s, c, cn, stream_reader, sm, stream_free, sm, ign_h, ignored);
    }
    if (x && x->api == API_RESPONSES) {
        enum MHD_Result res = resp_reply(s, c, cn, x, &u, id, text, tlen, ign_h, ignored);
        free(text);
        kp_sreq_release(r);
        return res;
    }
    if (x && x->api == API_ANTHROPIC) {
        enum MHD_Result res = anth_reply(s, c, cn, x, &u, text, tlen, ign_h, ignored);
        free(text);
        kp_sreq_release(r);
        return res;
    }
    json_t *choice;
    const char *finish = kp_oai_finish_name(u.finish);
    json_t *calls = NULL;
    size_t content = tlen;
    if (tools && (u.finish == KP_FINISH_LENGTH || u.finish == KP_FINISH_STOP)) {
        kp_error err2;
        kp_chat_parse_tool_calls(s->cfg.chat, text ? text : "", tlen, p.sp.seed ^ (uint64_t)time(NULL), &calls,
                                 &content, &err2);
    }
    if (chat && calls) {
        json_t *msg = json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                                content ? json_stringn(text, content) : json_null(), "tool_calls", calls);
        choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "message", msg, "logprobs", "finish_reason",
                           "tool_calls");
        finish = "tool_calls";
    } else if (chat)
        choice = json_pack("{s:i, s:{s:s, s:s%}, s:n, s:s?}", "index", 0, "message", "role", "assistant", "content",
                           text ? text : "", tlen, "logprobs", "finish_reason", finish);
    else
        choice = json_pack("{s:i, s:s%, s:n, s:s?}", "index", 0, "text", text ? text : "", tlen, "logprobs",
                           "finish_reason", finish);
    if (return_ids && choice) add_token_ids(choice, &u);
    json_t *cj = gen_cache_json(&u);
    cache_fields(s, key, retention, &u, cj);
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o, s:o}", "id", id, "object",
                          chat ? "chat.completion" : "text_completion", "created", (json_int_t)time(NULL), "model",
                          s->cfg.model_name, "choices", choice, "usage",
                          kp_oai_usage_json(u.prompt_tokens, u.cached_tokens, u.completion_tokens), "kvpin_cache", cj);
    note_gen(&cn->log, &u, finish ? finish : finish_word(&u, true));
    free(text);
    kp_sreq_release(r);
    return reply_json_h(s, c, 200, j, ign_h, ignored);
}

static enum MHD_Result generate(kp_server *s, struct MHD_Connection *c, conn *cn, bool chat) {
    return generate_as(s, c, cn, chat, cn->body.data, cn->body.len, NULL);
}

/* The breakpoints' positions in the prompt ids[0..n): each breakpoint's
 * conversation rendered without the generation prompt, and the tokens it
 * has in common with the prompt (the renderings are byte-stable and
 * append-only, so that is the prefix up to the breakpoint's block). A
 * breakpoint that does not render is left out. */
static void anth_breaks(kp_server *s, gen_api *x, const int32_t *ids, size_t n) {
    anth_bps *b = &x->bps;
    memset(b, 0, sizeof *b);
    int64_t now = (int64_t)time(NULL);
    for (int i = 0; i < x->anth->n_br; i++) {
        const kp_anth_break *br = &x->anth->br[i];
        prompt_opts po = {false, false};
        int32_t *t = NULL;
        size_t k = 0, tl = 0;
        char *text = NULL;
        kp_oai_error e;
        if (!request_tokens(s, NULL, br->messages, br->tools, false, &po, &t, &k, &text, &tl, &e)) continue;
        size_t m = 0;
        while (m < k && m < n && t[m] == ids[m]) m++;
        free(t);
        free(text);
        if (m == 0) continue;
        double scaled = (double)br->ttl_s * (s->cfg.pin_ttl_scale > 0 ? s->cfg.pin_ttl_scale : 1);
        b->pos[b->n] = (uint32_t)m;
        b->ttl[b->n] = scaled < 1 ? 1 : (int64_t)(scaled + 0.5);
        b->hash[b->n] = kp_bpins_hash(ids, m);
        b->hit[b->n] = kp_bpins_live(s->bpins, b->hash[b->n], now);
        b->live += b->hit[b->n];
        b->n++;
    }
}

/* The tools a translated chat body renders: none with tool_choice "none"
 * (kp_oai_parse_opts drops them so too). */
static const json_t *anth_tools(const json_t *chat) {
    const json_t *tc = json_object_get(chat, "tool_choice"), *tools = json_object_get(chat, "tools");
    if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) return NULL;
    return json_array_size(tools) ? tools : NULL;
}

/* The answer of a Messages request that ended (u: its last update, text
 * the whole text). */
static enum MHD_Result anth_reply(kp_server *s, struct MHD_Connection *c, conn *cn, gen_api *x,
                                  const kp_sreq_update *u, const char *text, size_t tlen, const char *ign_h,
                                  const char *ignored) {
    json_t *calls = NULL;
    size_t content = tlen;
    if (anth_tools(x->anth->chat) && (u->finish == KP_FINISH_LENGTH || u->finish == KP_FINISH_STOP)) {
        kp_error err;
        kp_chat_parse_tool_calls(s->cfg.chat, text ? text : "", tlen, u->ids ? (uint64_t)u->ids[0] ^ (uint64_t)time(NULL) : 0,
                                 &calls, &content, &err);
    }
    const char *which;
    const char *reason = anth_stop(s, u, calls != NULL, tlen, json_object_get(x->anth->chat, "stop"), &which);
    json_t *cj = gen_cache_json(u);
    anth_after(s, &x->bps, u, cj);
    char id[48];
    snprintf(id, sizeof id, "msg_%016llx",
             (unsigned long long)(atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)s->started));
    json_t *j = kp_anth_message_json(id, s->cfg.model_name, kp_anth_content_json(text, calls ? content : tlen, calls),
                                     reason, which, anth_usage(&x->bps, u));
    json_object_set_new(j, "kvpin_cache", cj);
    note_gen(&cn->log, u, calls ? "tool_calls" : kp_oai_finish_name(u->finish)); /* the log's words */
    json_decref(calls);
    return reply_json_h(s, c, 200, j, ign_h, ignored);
}

/* POST /v1/messages (count false) and /v1/messages/count_tokens: the body
 * translated (anthropic.h) and served as the chat-completions request it
 * means, answered in Anthropic's shape. */
static enum MHD_Result messages(kp_server *s, struct MHD_Connection *c, conn *cn, bool count) {
    kp_anth_request a;
    kp_oai_error e;
    if (!kp_anth_translate(cn->body.data, cn->body.len, count, s->cfg.strict_api, &a, &e)) return reply_error(s, c, &e);
    if (count) {
        int32_t *ids = NULL;
        size_t n = 0, tl = 0;
        char *text = NULL;
        prompt_opts po = {true, false};
        bool ok = request_tokens(s, NULL, json_object_get(a.chat, "messages"), anth_tools(a.chat), false, &po, &ids, &n, &text,
                                 &tl, &e);
        kp_anth_request_free(&a);
        free(ids);
        free(text);
        if (!ok) return reply_error(s, c, &e);
        return reply_json(s, c, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
    }
    json_int_t mt = json_integer_value(json_object_get(a.chat, "max_tokens"));
    if (mt > (json_int_t)s->ctx) { /* Anthropic refuses more than the model can give, where OpenAI's cuts */
        kp_anth_request_free(&a);
        return fail(s, c, 400, "invalid_request_error", NULL, "max_tokens",
                    "max_tokens: %lld > %u, which is the maximum allowed number of output tokens for this model (its "
                    "context)",
                    (long long)mt, s->ctx);
    }
    char *body = json_dumps(a.chat, JSON_COMPACT);
    if (!body) {
        kp_anth_request_free(&a);
        return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    gen_api x = {API_ANTHROPIC, a.ignored.data ? a.ignored.data : "", &a, {{0}, {0}, {0}, {0}, 0, 0}, NULL};
    enum MHD_Result r = generate_as(s, c, cn, true, body, strlen(body), &x);
    free(body);
    kp_anth_request_free(&a);
    return r;
}

/* The answer of a Responses request that ended (non-streaming). */
static enum MHD_Result resp_reply(kp_server *s, struct MHD_Connection *c, conn *cn, gen_api *x,
                                  const kp_sreq_update *u, const char *id, const char *text, size_t tlen,
                                  const char *ign_h, const char *ignored) {
    json_t *calls = NULL;
    size_t content = tlen;
    const json_t *tc = json_object_get(x->resp->chat, "tool_choice");
    bool tools = json_array_size(json_object_get(x->resp->chat, "tools")) &&
                 !(json_is_string(tc) && !strcmp(json_string_value(tc), "none"));
    if (tools && (u->finish == KP_FINISH_LENGTH || u->finish == KP_FINISH_STOP)) {
        kp_error err;
        kp_chat_parse_tool_calls(s->cfg.chat, text ? text : "", tlen, (uint64_t)time(NULL) ^ (uint64_t)u->prompt_tokens,
                                 &calls, &content, &err);
    }
    if (!calls) content = tlen;
    uint64_t seed = (uint64_t)time(NULL) ^ (atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull);
    json_t *out = kp_resp_output_json(text, content, calls, seed);
    json_t *o = resp_final(s, x->resp, id, u, out, text, content, calls);
    note_gen(&cn->log, u, calls ? "tool_calls" : kp_oai_finish_name(u->finish));
    json_decref(calls);
    return reply_json_h(s, c, 200, o, ign_h, ignored);
}

/* POST /v1/responses: the body translated (responses.h), with the stored
 * conversation of previous_response_id in front, and served as the chat
 * request it means. */
static enum MHD_Result responses(kp_server *s, struct MHD_Connection *c, conn *cn) {
    kp_oai_error e;
    char prev_id[128];
    json_t *prev = NULL;
    if (kp_resp_previous(cn->body.data, cn->body.len, prev_id, sizeof prev_id) &&
        !kp_rstore_get(s->rstore, prev_id, NULL, &prev))
        return fail(s, c, 404, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                    "Previous response with id '%.100s' not found (never stored, deleted, or dropped from the "
                    "store)", prev_id);
    kp_resp_request r;
    bool ok = kp_resp_translate(cn->body.data, cn->body.len, prev, s->cfg.strict_api, &r, &e);
    json_decref(prev);
    if (!ok) return reply_error(s, c, &e);
    char *body = json_dumps(r.chat, JSON_COMPACT);
    if (!body) {
        kp_resp_request_free(&r);
        return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    gen_api x = {API_RESPONSES, r.ignored.data ? r.ignored.data : "", NULL, {{0}, {0}, {0}, {0}, 0, 0}, &r};
    enum MHD_Result res = generate_as(s, c, cn, true, body, strlen(body), &x);
    free(body);
    kp_resp_request_free(&r);
    return res;
}

/* GET and DELETE /v1/responses/{id}. */
static enum MHD_Result response_get(kp_server *s, struct MHD_Connection *c, const char *id, bool del) {
    json_t *o = NULL;
    bool found = del ? kp_rstore_delete(s->rstore, id) : kp_rstore_get(s->rstore, id, &o, NULL);
    if (!found)
        return fail(s, c, 404, "invalid_request_error", "not_found", "id", "No response with id '%.100s' found", id);
    if (del) return reply_json(s, c, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
    return reply_json(s, c, 200, o);
}

/* ---- small endpoints ---------------------------------------------------------- */

static enum MHD_Result tokenize(kp_server *s, struct MHD_Connection *c, conn *cn) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return reply_error(s, c, &e);
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
        return reply_error(s, c, &e);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kp_error err = {0};
    kp_status st = kp_tok_encode(s->v, json_string_value(content), json_string_length(content), as && json_is_true(as),
                              !ps || json_is_true(ps), &ids, &n, &err);
    if (st != KP_OK) {
        json_decref(o);
        status_error(st, &err, "content", &e);
        return reply_error(s, c, &e);
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
    return reply_json(s, c, 200, json_pack("{s:o}", "tokens", arr));
}

static enum MHD_Result detokenize(kp_server *s, struct MHD_Connection *c, conn *cn) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return reply_error(s, c, &e);
    static const char *const allowed[] = {"tokens", NULL};
    const json_t *t = json_object_get(o, "tokens");
    if (!kp_oai_only_fields(o, allowed, &e) ||
        (!json_is_array(t) &&
         !kp_oai_fail(&e, 400, "invalid_request_error", NULL, "tokens", "tokens must be an array of token ids"))) {
        json_decref(o);
        return reply_error(s, c, &e);
    }
    size_t n = json_array_size(t);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
        const json_t *x = json_array_get(t, i);
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || id >= kp_tok_n_vocab(s->v)) {
            free(ids);
            json_decref(o);
            return fail(s, c, 400, "invalid_request_error", NULL, "tokens",
                        "tokens[%zu] is not a token id of this model (0..%d)", i, kp_tok_n_vocab(s->v) - 1);
        }
        ids[i] = (int32_t)id;
    }
    json_decref(o);
    if (!ids) return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    char *text = NULL;
    size_t len = 0;
    kp_error err = {0};
    kp_status st = kp_tok_detokenize(s->v, ids, n, false, true, &text, &len, &err);
    free(ids);
    if (st != KP_OK) {
        status_error(st, &err, "tokens", &e);
        return reply_error(s, c, &e);
    }
    /* bytes that are not valid UTF-8 (a split character, a stray byte
     * token) become U+FFFD, one per maximal invalid subpart */
    json_t *content = kp_oai_string_repaired(text, len);
    free(text);
    if (!content) return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    return reply_json(s, c, 200, json_pack("{s:o}", "content", content ? content : json_string("")));
}

/* GET /v1/models (id NULL) or /v1/models/{id}. */
static enum MHD_Result models(kp_server *s, struct MHD_Connection *c, const char *id) {
    if (id && strcmp(id, s->cfg.model_name))
        return fail(s, c, 404, "invalid_request_error", "model_not_found", "model",
                    "the model \"%.200s\" does not exist; this server has \"%s\"", id, s->cfg.model_name);
    const kp_hparams *hp = &s->m->hp;
    json_t *meta = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "arch", hp->arch_name, "n_vocab",
                             (json_int_t)hp->n_vocab, "n_ctx_train", (json_int_t)hp->n_ctx_train, "n_ctx",
                             (json_int_t)s->ctx, "n_layer", (json_int_t)hp->n_layer, "weight_bytes",
                             (json_int_t)s->m->weight_bytes);
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", s->cfg.model_name, "object", "model", "created",
                          (json_int_t)s->started, "owned_by", "kvpin", "meta", meta);
    if (id) return reply_json(s, c, 200, m);
    return reply_json(s, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

/* ---- cache endpoints ------------------------------------------------------------ */

static json_t *kv_json(const kp_eng_stats *k) {
    uint64_t bb = k->block_bytes ? k->block_bytes : 1;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "budget_bytes",
                     (json_int_t)k->budget_bytes, "used_bytes", (json_int_t)k->used_bytes, "free_bytes",
                     (json_int_t)k->free_bytes, "pinned_bytes", (json_int_t)k->pinned_bytes, "pinned_cap_bytes",
                     (json_int_t)k->pinned_cap_bytes, "index_bytes", (json_int_t)k->index_bytes, "shared_bytes",
                     (json_int_t)k->shared_bytes, "saved_bytes", (json_int_t)k->saved_bytes, "block_bytes",
                     (json_int_t)k->block_bytes, "bytes_per_token", (json_int_t)k->bytes_per_token, "blocks_total",
                     (json_int_t)(k->budget_bytes / bb), "blocks_used", (json_int_t)(k->used_bytes / bb),
                     "blocks_free", (json_int_t)(k->free_bytes / bb));
}

/* /v1/cache "tiers": each tier below RAM (disk, redis) with its bytes,
 * blocks, hit ratio and failures by reason; null without tiers. */
static json_t *tiers_json(kp_server *s) {
    kp_tiers_stats ts;
    if (!s->cfg.tiers_of || !kp_eng_tier_stats(s->cfg.tiers_of, &ts)) return json_null();
    json_t *o = json_pack("{s:s, s:I, s:I, s:s}", "fingerprint", ts.fingerprint, "restores", (json_int_t)ts.restores,
                          "restore_failed", (json_int_t)ts.restore_failed, "note", kp_eng_tier_note(s->cfg.tiers_of));
    for (int i = KP_TIER_DISK; i < KP_TIER_N; i++) {
        if (!ts.on[i]) continue;
        const kp_tier_stats *t = &ts.tier[i];
        json_t *fail = json_object();
        uint64_t failures = 0;
        for (int r = KP_BREC_TRUNCATED; r < KP_BREC_N_REASONS; r++) {
            json_object_set_new(fail, kp_brec_reason_name((kp_brec_reason)r), json_integer((json_int_t)t->fail[r]));
            failures += t->fail[r];
        }
        json_object_set_new(fail, "missing", json_integer((json_int_t)t->fail[KP_BREC_MISSING]));
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
        json_object_set_new(o, kp_tier_name((kp_tier_id)i), j);
    }
    return o;
}

static enum MHD_Result cache_get(kp_server *s, struct MHD_Connection *c) {
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
    json_t *keys = kp_ckeys_json(s->ckeys);
    uint64_t bp_tokens = 0;
    uint32_t bp_n = kp_bpins_count(s->bpins, (int64_t)time(NULL), &bp_tokens);
    uint32_t rs_n, rs_max;
    size_t rs_bytes, rs_max_bytes;
    kp_rstore_stats(s->rstore, &rs_n, &rs_bytes, &rs_max, &rs_max_bytes);
    return reply_json(s, c, 200,
                      json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}",
                                "object", "kvpin.cache", "prefix_cache", k.prefix_cache, "kv", kv_json(&k), "counts",
                                counts, "prefixes", list, "prompt_cache_keys", keys ? keys : json_array(), "tiers",
                                tiers_json(s), "cache_control", "live_pins", (json_int_t)bp_n, "tokens",
                                (json_int_t)bp_tokens, "responses", "count", (json_int_t)rs_n, "bytes",
                                (json_int_t)rs_bytes, "max_count", (json_int_t)rs_max, "max_bytes",
                                (json_int_t)rs_max_bytes));
}

/* The tokens of a probe or pin body: {"prompt": ...} or {"messages": [...], "tools": [...]}. */
static bool body_tokens(kp_server *s, json_t *o, const char *const *allowed, bool add_gen, int32_t **ids,
                        size_t *n, char **text, size_t *text_len, kp_oai_error *e) {
    if (!kp_oai_only_fields(o, allowed, e)) return false;
    const json_t *ag = json_object_get(o, "add_generation_prompt");
    if (ag && !json_is_boolean(ag) && !json_is_null(ag))
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "add_generation_prompt",
                           "add_generation_prompt must be true or false");
    prompt_opts po = {json_is_boolean(ag) ? json_is_true(ag) : add_gen, false};
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
    return request_tokens(s, prompt, messages, tools, json_is_true(ps), &po, ids, n, text, text_len, e);
}

static enum MHD_Result cache_probe(kp_server *s, struct MHD_Connection *c, conn *cn) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return reply_error(s, c, &e);
    static const char *const allowed[] = {"prompt", "messages", "tools", "model", "parse_special",
                                          "add_generation_prompt", NULL};
    int32_t *ids = NULL;
    size_t n = 0, tl = 0;
    char *text = NULL;
    bool ok = body_tokens(s, o, allowed, true, &ids, &n, &text, &tl, &e); /* what a chat request would send */
    json_decref(o);
    if (!ok) return reply_error(s, c, &e);
    kp_eng_report r;
    kp_doctor_report d;
    bool has = false;
    kp_error err = {0};
    kp_status st = kp_sched_probe(s->sched, ids, (uint32_t)n, text, tl, &r, &d, &has, &err);
    if (st != KP_OK) {
        free(ids);
        free(text);
        status_error(st, &err, "prompt", &e);
        return reply_error(s, c, &e);
    }
    free(ids);
    free(text);
    json_t *j = kp_oai_cache_json(&r, has ? &d : NULL);
    json_object_set_new(j, "object", json_string("kvpin.cache.probe"));
    return reply_json(s, c, 200, j);
}

static enum MHD_Result cache_pin(kp_server *s, struct MHD_Connection *c, conn *cn) {
    kp_oai_error e;
    json_t *o = kp_oai_parse_object(cn->body.data, cn->body.len, &e);
    if (!o) return reply_error(s, c, &e);
    static const char *const allowed[] = {"prompt",        "messages", "tools", "model", "ttl", "parse_special",
                                          "add_generation_prompt", NULL};
    const json_t *ttl_j = json_object_get(o, "ttl");
    int64_t ttl = 0;
    if (ttl_j && !json_is_null(ttl_j)) {
        if (!json_is_integer(ttl_j) || json_integer_value(ttl_j) < 0 || json_integer_value(ttl_j) > (1ll << 40)) {
            json_decref(o);
            return fail(s, c, 400, "invalid_request_error", NULL, "ttl",
                        "ttl must be a whole number of seconds >= 0 (0: until unpinned)");
        }
        ttl = json_integer_value(ttl_j);
    }
    int32_t *ids = NULL;
    size_t n = 0, tl = 0;
    char *text = NULL;
    /* a pinned conversation ends where the next turn's messages go on: no assistant opener */
    bool ok = body_tokens(s, o, allowed, false, &ids, &n, &text, &tl, &e);
    json_decref(o);
    free(text);
    if (!ok) return reply_error(s, c, &e);
    kp_sched_cache snap;
    kp_sched_cache_get(s->sched, &snap);
    if (!snap.kv.prefix_cache) {
        free(ids);
        return fail(s, c, 400, "invalid_request_error", "prefix_cache_off", NULL,
                    "the prefix cache is off (--no-prefix-cache): nothing can be pinned");
    }
    /* compute the prefix (prefill only), then pin it */
    if (!fits_budget(s, (uint32_t)n, 0, true, "prompt", &e)) {
        free(ids);
        return reply_error(s, c, &e);
    }
    kp_sreq_params p = {ids, (uint32_t)n, 0, kp_sampler_defaults(), NULL, 0, false, NULL, 0, true, NULL};
    kp_sreq *r = NULL;
    kp_error err = {0};
    kp_status st = kp_sched_submit(s->sched, &p, &r, &err);
    kp_sreq_update u = {0};
    while (st == KP_OK) {
        kp_sreq_wait(r, 200, &u);
        free(u.text);
        if (u.finish != KP_FINISH_NONE) break;
        if (client_gone(c) || atomic_load(&s->stopping)) {
            kp_sreq_release(r);
            free(ids);
            return MHD_NO;
        }
    }
    kp_sreq_release(r);
    if (st != KP_OK || u.finish == KP_FINISH_ERROR) {
        status_error(st != KP_OK ? st : u.status, st != KP_OK ? &err : &u.err, "prompt", &e);
        free(ids);
        return reply_error(s, c, &e);
    }
    uint64_t id = 0;
    kp_eng_stats k;
    st = kp_sched_pin(s->sched, ids, (uint32_t)n, ttl, (int64_t)time(NULL), &id, &k, &err);
    free(ids);
    if (st != KP_OK) {
        if (st == KP_EFULL) return fail(s, c, 400, "invalid_request_error", "pinned_cap", NULL, "%s", err.msg);
        status_error(st, &err, "prompt", &e);
        return reply_error(s, c, &e);
    }
    uint64_t per = k.bytes_per_token, bb = k.block_bytes ? k.block_bytes : 1;
    char sid[32];
    snprintf(sid, sizeof sid, "pin-%llu", (unsigned long long)id);
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "object", "kvpin.cache.pin", "id", sid, "tokens",
                          (json_int_t)n, "bytes", (json_int_t)((n * per + bb - 1) / bb * bb), "ttl", (json_int_t)ttl,
                          "pinned_bytes", (json_int_t)k.pinned_bytes, "pinned_cap_bytes",
                          (json_int_t)k.pinned_cap_bytes);
    json_object_set_new(j, "expires_at", ttl ? json_integer((json_int_t)(time(NULL) + ttl)) : json_null());
    return reply_json(s, c, 200, j);
}

static enum MHD_Result cache_unpin(kp_server *s, struct MHD_Connection *c, const char *sid) {
    const char *num = !strncmp(sid, "pin-", 4) ? sid + 4 : sid;
    char *end = NULL;
    unsigned long long id = *num >= '0' && *num <= '9' ? strtoull(num, &end, 10) : 0;
    if (!end || *end)
        return fail(s, c, 404, "invalid_request_error", "pin_not_found", "id", "no pin \"%.64s\"", sid);
    kp_error err = {0};
    kp_status st = kp_sched_unpin(s->sched, id, &err);
    if (st == KP_EFULL) {
        kp_oai_error e;
        status_error(st, &err, NULL, &e);
        return reply_error(s, c, &e);
    }
    if (st != KP_OK)
        return fail(s, c, 404, "invalid_request_error", "pin_not_found", "id",
                    "no pin \"%.64s\" (never made, removed or expired)", sid);
    return reply_json(s, c, 200, json_pack("{s:s, s:s, s:b}", "object", "kvpin.cache.pin", "id", sid, "deleted", 1));
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
        for (int r = KP_BREC_MISSING; ts.on[i] && r < KP_BREC_N_REASONS; r++)
            tp(t, "kvpin_tier_failures_total{tier=\"%s\",reason=\"%s\"} %llu\n", kp_tier_name((kp_tier_id)i),
               kp_brec_reason_name((kp_brec_reason)r), (unsigned long long)ts.tier[i].fail[r]);
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

static enum MHD_Result metrics(kp_server *s, struct MHD_Connection *c) {
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
    for (int i = 0; i < N_STATUS; i++) {
        uint64_t v = atomic_load(&s->by_status[i]);
        if (STATUS_CODES[i])
            tp(&t, "kvpin_requests_total{status=\"%d\"} %llu\n", STATUS_CODES[i], (unsigned long long)v);
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
        return fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    enum MHD_Result r = reply(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", t.data, t.len, NULL, NULL);
    kp_buf_free(&t);
    return r;
}

/* ---- routing ---------------------------------------------------------------------------- */

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

/* The route table's view of a handler: id is the rest of the path after a
 * prefix entry's path (never empty), NULL for an exact entry. ROUTE_FN
 * defines one of these over a handler. */
typedef enum MHD_Result (*route_fn)(kp_server *s, struct MHD_Connection *c, conn *cn, const char *id);
#define ROUTE_FN(name)                                                                                   \
    static enum MHD_Result name(kp_server *s, struct MHD_Connection *c, conn *cn __attribute__((unused)), \
                                const char *id __attribute__((unused)))

ROUTE_FN(on_health) {
    kp_sched_stats st;
    kp_sched_stats_get(s->sched, &st);
    return reply_json(s, c, 200,
                      json_pack("{s:s, s:I, s:I}", "status", "ok", "running", (json_int_t)st.running, "queued",
                                (json_int_t)st.queued));
}
ROUTE_FN(on_models) { return models(s, c, id); }
ROUTE_FN(on_metrics) { return metrics(s, c); }
ROUTE_FN(on_completions) { return generate(s, c, cn, false); }
ROUTE_FN(on_chat) { return generate(s, c, cn, true); }
ROUTE_FN(on_messages) { return messages(s, c, cn, false); }
ROUTE_FN(on_count_tokens) { return messages(s, c, cn, true); }
ROUTE_FN(on_responses) { return responses(s, c, cn); }
ROUTE_FN(on_response_get) { return response_get(s, c, id, false); }
ROUTE_FN(on_response_delete) { return response_get(s, c, id, true); }
ROUTE_FN(on_tokenize) { return tokenize(s, c, cn); }
ROUTE_FN(on_detokenize) { return detokenize(s, c, cn); }
ROUTE_FN(on_cache) { return cache_get(s, c); }
ROUTE_FN(on_probe) { return cache_probe(s, c, cn); }
ROUTE_FN(on_pin) { return cache_pin(s, c, cn); }
ROUTE_FN(on_unpin) { return cache_unpin(s, c, id); }
ROUTE_FN(on_dashboard) {
    if (s->cfg.no_dashboard)
        return fail(s, c, 404, "invalid_request_error", "not_found", NULL, "the dashboard is off (--no-dashboard)");
    return reply(s, c, 200, "text/html; charset=utf-8", (const char *)kp_dash_page_bytes, kp_dash_page_size,
                 "Cache-Control", "no-store");
}
ROUTE_FN(on_events) {
    return reply_json(s, c, 200, kp_dash_events(s->sched, s->hist, s->v, s->m, s->ctx, (int64_t)time(NULL)));
}
ROUTE_FN(on_node) {
    kp_oai_error e;
    json_t *j = kp_dash_node(s->sched, s->v, id, &e);
    return j ? reply_json(s, c, 200, j) : reply_error(s, c, &e);
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
    route_fn fn;
} route_entry;

static const route_entry ROUTES[] = {
    {"GET", "/health", false, false, on_health},
    {"GET", "/v1/health", false, false, on_health},
    {"GET", "/v1/models", false, true, on_models},
    {"GET", "/v1/models/", true, true, on_models},
    {"GET", "/metrics", false, true, on_metrics},
    {"POST", "/v1/completions", false, true, on_completions},
    {"POST", "/completions", false, true, on_completions},
    {"POST", "/v1/chat/completions", false, true, on_chat},
    {"POST", "/chat/completions", false, true, on_chat},
    {"POST", "/v1/messages", false, true, on_messages},
    {"POST", "/v1/messages/count_tokens", false, true, on_count_tokens},
    {"POST", "/v1/responses", false, true, on_responses},
    {"GET", "/v1/responses/", true, true, on_response_get},
    {"DELETE", "/v1/responses/", true, true, on_response_delete},
    {"POST", "/tokenize", false, true, on_tokenize},
    {"POST", "/detokenize", false, true, on_detokenize},
    {"GET", "/v1/cache", false, true, on_cache},
    {"POST", "/v1/cache/probe", false, true, on_probe},
    {"POST", "/v1/cache/pin", false, true, on_pin},
    {"DELETE", "/v1/cache/pin/", true, true, on_unpin},
    {"GET", "/", false, false, on_dashboard},
    {"GET", "/dashboard", false, false, on_dashboard},
    {"GET", "/v1/cache/events", false, true, on_events},
    {"GET", "/v1/cache/node/", true, true, on_node},
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

static enum MHD_Result route(kp_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
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
    /* the key before anything else: without it a client learns nothing of routes or limits */
    if (!strncmp(url, "/v1/messages", 12) && (!url[12] || url[12] == '/')) cn->api = API_ANTHROPIC;
    if (!open && !authorized(s, c))
        return fail(s, c, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "missing or wrong API key: send the header \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"");
    if (cn->too_big)
        return fail(s, c, 413, "invalid_request_error", "body_too_large", NULL,
                    "the request body is larger than the limit of %zu bytes", s->cfg.max_body);
    if (hit) return hit->fn(s, c, cn, id);
    if (!allow[0])
        return fail(s, c, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %.200s", method, url);
    kp_oai_error e;
    kp_oai_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s %s is not allowed; use %s", method,
                url, allow);
    int http;
    json_t *j = error_body(cn, &e, &http);
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    cn->log.code = e.code;
    enum MHD_Result r = reply(s, c, 405, "application/json", t ? t : "{}", t ? strlen(t) : 2, "Allow", allow);
    free(t);
    return r;
}

/* The framing headers of a request: every Content-Length and
 * Transfer-Encoding line (libmicrohttpd keeps repeated headers apart). */
typedef struct {
    const char *cl[4], *te[4];
    int n_cl, n_te;
} framing;

static enum MHD_Result framing_cb(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (f->n_cl < 4) f->cl[f->n_cl] = value;
        f->n_cl++;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        if (f->n_te < 4) f->te[f->n_te] = value;
        f->n_te++;
    }
    return MHD_YES;
}

/* Refuses, before any of the body is read, a request whose length is not
 * told one way only (RFC 9112 6.3; a proxy in front that reads it another
 * way would let a second request hide in the body): two Content-Length
 * values that differ, a Content-Length that is not digits, Content-Length
 * together with Transfer-Encoding (400), and a transfer coding other than
 * chunked (501). Returns true when it answered (*r holds the result). */
static bool bad_framing(kp_server *s, struct MHD_Connection *c, enum MHD_Result *r) {
    framing f = {{0}, {0}, 0, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_cb, &f);
    for (int i = 0; i < f.n_cl && i < 4; i++) {
        const char *v = f.cl[i] ? f.cl[i] : "";
        size_t n = strspn(v, "0123456789");
        if (n == 0 || v[n] || n > 19) {
            *r = fail(s, c, 400, "invalid_request_error", "bad_framing", NULL,
                      "Content-Length \"%.40s\" is not a number of bytes", v);
            return true;
        }
        if (i > 0 && strtoull(v, NULL, 10) != strtoull(f.cl[0], NULL, 10)) {
            *r = fail(s, c, 400, "invalid_request_error", "bad_framing", NULL,
                      "two different Content-Length headers (%.20s and %.20s)", f.cl[0], v);
            return true;
        }
    }
    if (f.n_cl > 4) {
        *r = fail(s, c, 400, "invalid_request_error", "bad_framing", NULL, "%d Content-Length headers", f.n_cl);
        return true;
    }
    if (f.n_te > 0 && f.n_cl > 0) {
        *r = fail(s, c, 400, "invalid_request_error", "bad_framing", NULL,
                  "Content-Length together with Transfer-Encoding: send one of them");
        return true;
    }
    if (f.n_te > 1 || (f.n_te == 1 && strcasecmp(f.te[0] ? f.te[0] : "", "chunked"))) {
        *r = fail(s, c, 501, "invalid_request_error", "unsupported_transfer_encoding", NULL,
                  "Transfer-Encoding \"%.40s\" is not supported (only chunked)", f.te[0] ? f.te[0] : "");
        return true;
    }
    return false;
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    kp_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->t0 = now_s();
        *con_cls = cn;
        cn->log.t0 = cn->t0;
        cn->log.hist = s->hist;
        log_begin(s, c, method, url, &cn->log);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        if (ci && ci->socket_context) ((sock *)ci->socket_context)->cur = cn;
        enum MHD_Result r;
        if (bad_framing(s, c, &r)) return r; /* answered before the body; MHD then closes the connection */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (*end || v > s->cfg.max_body) cn->too_big = true;
        }
        if (cn->too_big) /* answer before reading the body; MHD then closes the connection */
            return route(s, c, url, method, cn);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big && cn->body.len + *upload_size > s->cfg.max_body) {
            cn->too_big = true;
            kp_buf_free(&cn->body);
        }
        if (!cn->too_big && !kp_buf_put(&cn->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    guard_received(s, c);
    return route(s, c, url, method, cn);
}

static void completed_cb(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)why;
    kp_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context && ((sock *)ci->socket_context)->cur == cn) ((sock *)ci->socket_context)->cur = NULL;
    if (ci && ci->socket_context) guard_rearm(s, ci->socket_context);
    if (!cn->streamed) log_line(s, &cn->log);
    kp_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

/* Gives each connection its sock (NULL when out of memory: then its
 * answers carry no x-request-id and log no status). */
static void connection_cb(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    kp_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        sock *k = calloc(1, sizeof(sock));
        *socket_context = k;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!k || !ci) return; /* out of memory: this connection has no deadline (the idle timeout stays) */
        k->fd = ci->connect_fd;
        pthread_mutex_lock(&s->guard_mu);
        k->deadline = now_s() + s->cfg.request_timeout_s;
        k->receiving = true;
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->guard_mu);
    } else {
        sock *k = *socket_context;
        if (k && k->fd) { /* registered */
            pthread_mutex_lock(&s->guard_mu);
            if (k->prev) k->prev->next = k->next;
            else s->socks = k->next;
            if (k->next) k->next->prev = k->prev;
            pthread_mutex_unlock(&s->guard_mu);
        }
        free(k);
        *socket_context = NULL;
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    kp_server *s = cls;
    if (s->cfg.quiet) return;
    fprintf(stderr, "kvpin serve: http: ");
    vfprintf(stderr, fmt, ap);
}

kp_status kp_server_new(kp_server **out, const kp_server_config *cfg, kp_sched *sched, const kp_tok_vocab *v,
                        const kp_model *m, kp_error *err) {
    *out = NULL;
    kp_server *s = calloc(1, sizeof *s);
    if (!s) return kp_fail(err, KP_ENOMEM, "out of memory for the server");
    s->cfg = *cfg;
    if (kp_hist_new(&s->hist, err) != KP_OK) {
        free(s);
        return KP_ENOMEM;
    }
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.model_name) s->cfg.model_name = "kvpin";
    if (!s->cfg.max_body) s->cfg.max_body = 8u << 20;
    if (!s->cfg.timeout_s) s->cfg.timeout_s = 60;
    if (!s->cfg.max_connections) s->cfg.max_connections = 1024;
    if (!s->cfg.max_per_address) s->cfg.max_per_address = 64;
    if (!s->cfg.request_timeout_s) s->cfg.request_timeout_s = 30;
    /* 256 keys, 64 keyless retention pins: a key table that serves many agents, bounded */
    kp_status cst = kp_ckeys_new(&s->ckeys, 256, 64, err);
    if (cst != KP_OK) {
        kp_hist_free(s->hist);
        free(s);
        return cst;
    }
    kp_status gst = kp_gcache_new(&s->gc, GRAMMARS_KEPT, err);
    if (gst != KP_OK) {
        kp_ckeys_free(s->ckeys);
        kp_hist_free(s->hist);
        free(s);
        return gst;
    }
    kp_status bst = kp_bpins_new(&s->bpins, 256, err); /* breakpoints of many conversations, bounded */
    if (bst == KP_OK) bst = kp_rstore_new(&s->rstore, 256, 16u << 20, err); /* 256 responses, 16 MiB */
    if (bst != KP_OK) {
        kp_bpins_free(s->bpins);
        kp_gcache_free(s->gc);
        kp_ckeys_free(s->ckeys);
        kp_hist_free(s->hist);
        free(s);
        return bst;
    }
    pthread_mutex_init(&s->guard_mu, NULL);
    pthread_cond_init(&s->guard_cv, NULL);
    s->sched = sched;
    s->v = v;
    s->m = m;
    s->started = time(NULL);
    s->ctx = kp_sched_max_pos(sched);
    /* the address: an IPv4 or IPv6 literal ("[::1]" too) or a name; the
     * first of getaddrinfo's answers that can be bound */
    char host[256];
    size_t hl = strlen(s->cfg.host);
    if (hl >= 2 && s->cfg.host[0] == '[' && s->cfg.host[hl - 1] == ']')
        snprintf(host, sizeof host, "%.*s", (int)(hl - 2), s->cfg.host + 1);
    else
        snprintf(host, sizeof host, "%s", s->cfg.host);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, NULL, &hints, &ai);
    if (gai != 0 || !ai) {
        pthread_mutex_destroy(&s->guard_mu);
        pthread_cond_destroy(&s->guard_cv);
        kp_ckeys_free(s->ckeys);
        kp_gcache_free(s->gc);
        kp_bpins_free(s->bpins);
        kp_rstore_free(s->rstore);
        kp_hist_free(s->hist);
        free(s);
        return kp_fail(err, KP_EIO, "cannot resolve --host %s: %s", cfg->host, gai_strerror(gai));
    }
    bool v6_seen = false;
    for (const struct addrinfo *a = ai; a && !s->d; a = a->ai_next) {
        struct sockaddr_storage addr;
        unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
        if (a->ai_family == AF_INET) {
            memcpy(&addr, a->ai_addr, sizeof(struct sockaddr_in));
            ((struct sockaddr_in *)&addr)->sin_port = htons(s->cfg.port);
        } else if (a->ai_family == AF_INET6) {
            v6_seen = true;
            if (MHD_is_feature_supported(MHD_FEATURE_IPv6) != MHD_YES) continue;
            struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
            memcpy(a6, a->ai_addr, sizeof *a6);
            a6->sin6_port = htons(s->cfg.port);
            /* "::" takes IPv4 clients too, as 0.0.0.0 plus :: would */
            flags |= IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr) ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
        } else {
            continue;
        }
        s->d = MHD_start_daemon(flags, s->cfg.port, NULL, NULL, access_cb, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED,
                                completed_cb, s, MHD_OPTION_NOTIFY_CONNECTION, connection_cb, s,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.timeout_s,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
                                MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_per_address,
                                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_END);
        if (!s->d) continue;
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
        s->port = di ? di->port : s->cfg.port;
        /* the URL of what was bound: numeric, IPv6 in brackets, a zone's % as %25 */
        char num[INET6_ADDRSTRLEN + 32] = "?";
        getnameinfo(a->ai_addr, a->ai_addrlen, num, sizeof num, NULL, 0, NI_NUMERICHOST);
        char *pct = strchr(num, '%');
        if (a->ai_family == AF_INET6 && pct)
            snprintf(s->url, sizeof s->url, "http://[%.*s%%25%s]:%u", (int)(pct - num), num, pct + 1,
                     (unsigned)s->port);
        else
            snprintf(s->url, sizeof s->url, a->ai_family == AF_INET6 ? "http://[%s]:%u" : "http://%s:%u", num,
                     (unsigned)s->port);
    }
    freeaddrinfo(ai);
    if (s->d && pthread_create(&s->guard, NULL, guard_main, s) == 0) s->guard_started = true;
    if (s->d && !s->guard_started) {
        MHD_stop_daemon(s->d);
        pthread_mutex_destroy(&s->guard_mu);
        pthread_cond_destroy(&s->guard_cv);
        kp_ckeys_free(s->ckeys);
        kp_gcache_free(s->gc);
        kp_bpins_free(s->bpins);
        kp_rstore_free(s->rstore);
        kp_hist_free(s->hist);
        free(s);
        return kp_fail(err, KP_EIO, "cannot start the request-deadline thread");
    }
    if (!s->d) {
        pthread_mutex_destroy(&s->guard_mu);
        pthread_cond_destroy(&s->guard_cv);
        kp_ckeys_free(s->ckeys);
        kp_gcache_free(s->gc);
        kp_bpins_free(s->bpins);
        kp_rstore_free(s->rstore);
        kp_hist_free(s->hist);
        free(s);
        if (v6_seen && MHD_is_feature_supported(MHD_FEATURE_IPv6) != MHD_YES)
            return kp_fail(err, KP_EIO, "cannot listen on %s: this libmicrohttpd has no IPv6", cfg->host);
        return kp_fail(err, KP_EIO, "cannot listen on %s port %u (in use, or not an address of this machine)",
                       cfg->host ? cfg->host : "127.0.0.1", (unsigned)cfg->port);
    }
    *out = s;
    return KP_OK;
}

uint16_t kp_server_port(const kp_server *s) { return s->port; }

const char *kp_server_url(const kp_server *s) { return s->url; }

void kp_server_free(kp_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true); /* every wait below returns within 250 ms */
    MHD_stop_daemon(s->d);                /* every connection is closed and unregistered */
    if (s->guard_started) {
        pthread_mutex_lock(&s->guard_mu);
        s->guard_stop = true;
        pthread_cond_signal(&s->guard_cv);
        pthread_mutex_unlock(&s->guard_mu);
        pthread_join(s->guard, NULL);
    }
    pthread_mutex_destroy(&s->guard_mu);
    pthread_cond_destroy(&s->guard_cv);
    kp_ckeys_free(s->ckeys);
    kp_gcache_free(s->gc);
    kp_bpins_free(s->bpins);
    kp_rstore_free(s->rstore);
    kp_hist_free(s->hist);
    free(s);
}
