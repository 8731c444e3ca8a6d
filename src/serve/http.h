/*
 * http.h - the HTTP layer of the server: what every endpoint handler gets
 * from it (internal to serve/; the public face is server.h).
 *
 * http.c owns libmicrohttpd: the daemon, one thread per connection, the
 * request being received (kp_conn: its body, its log line), the deadline
 * that cuts slow senders, the request log, and the one way out for every
 * answer (kp_http_reply and the helpers over it, or kp_http_sse for a
 * stream), which counts it by status for /metrics and stamps it with the
 * request's x-request-id. It knows nothing of the endpoints: when a
 * request has arrived whole it calls the server's route function
 * (routes.c), which picks the handler.
 *
 *   libmicrohttpd thread of a connection
 *     access_cb #1 (headers)   kp_conn made, framing checked, Content-Length <= max_body
 *     access_cb #2..           body pieces appended (413 once over the limit)
 *     access_cb last           s->route(s, c, url, method, cn) -> a handler
 *                                 -> kp_http_json / kp_http_error / kp_http_sse
 *     completed_cb             the log line (a stream writes its own when it ends)
 *
 * struct kp_server is defined here so that the handlers of every file of
 * serve/ read the same fields; routes.c makes and frees it.
 */
#ifndef KP_HTTP_H
#define KP_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "base/buf.h"
#include "serve/breakpoints.h"
#include "serve/cachekeys.h"
#include "serve/gcache.h"
#include "serve/history.h"
#include "serve/oai.h"
#include "serve/response_store.h"
#include "serve/server.h"
#include "serve/volatile.h"

#define KP_HTTP_N_STATUS 14 /* the statuses /metrics counts one by one, the last: every other */

/* The HTTP statuses counted one by one (0 ends the list: "other"). */
extern const int kp_http_status_codes[KP_HTTP_N_STATUS];

/* What the log line of a request says (kp_reqlog_write). */
typedef struct {
    char id[72];          /* x-request-id: the client's when sane, else one of ours */
    char client[72];      /* ADDRESS:PORT, [v6]:PORT */
    char method[16];
    char path[208];       /* percent-escaped, cut at 200 bytes */
    double t0;            /* arrival (kp_now_s) */
    unsigned status;      /* of the answer queued; 0: none yet */
    const char *code;     /* the error code of an error answer (static), or NULL */
    bool gen;             /* a generation that reached the scheduler: the fields below hold */
    uint32_t prompt, cached, computed, completion;
    uint32_t preempted;   /* times the generation stepped aside for KV memory and resumed */
    const char *cause;    /* the cache report's cause (static), or NULL */
    const char *finish;   /* stop, length, tool_calls, cancelled, error, client_left (static), or NULL */
    double ttft_ms;
    char ignored[208];    /* the request's ignored fields (x-kvpin-ignored-fields), "" when none */
    kp_history *hist;        /* where kp_reqlog_gen records the generation (the server's) */
    char cache_key[KP_CACHEKEYS_KEY_MAX + 1]; /* the request's prompt_cache_key, "" none (for the history) */
} kp_reqlog;

/* An error body in one API's shape (e consumed into JSON); *http gets the
 * status that API gives the error (Anthropic's overloaded is 529). */
typedef json_t *(*kp_error_shape)(const kp_oai_error *e, int *http);

/* The request a connection is receiving or answering. */
typedef struct {
    kp_buf body;           /* the request body received so far */
    kp_error_shape errors; /* the shape of its errors (the route's API; NULL: OpenAI's) */
    bool too_big;
    double t0;
    kp_reqlog log;
    bool streamed; /* a stream answers it and writes its log line */
    const char *cors; /* Access-Control-Allow-Origin of its answer (origin.h), or NULL */
} kp_conn;

/* An endpoint's handler (routes.c's table): id is the rest of the path
 * after a prefix route's path (never empty), NULL for an exact route.
 * KP_HANDLER(name) declares or defines one. */
typedef enum MHD_Result (*kp_handler_fn)(kp_server *s, struct MHD_Connection *c, kp_conn *cn, const char *id);
#define KP_HANDLER(name)                                                                                     \
    enum MHD_Result name(kp_server *s, struct MHD_Connection *c, kp_conn *cn __attribute__((unused)), \
                         const char *id __attribute__((unused)))

/* What the daemon calls for a request that arrived whole (routes.c). */
typedef enum MHD_Result (*kp_route_fn)(kp_server *s, struct MHD_Connection *c, const char *url,
                                       const char *method, kp_conn *cn);

struct kp_server {
    kp_server_config cfg;
    kp_sched *sched;
    const kp_tok_vocab *v;
    const kp_model *m;
    uint32_t ctx; /* the engine's maximum sequence length */
    time_t started;
    char hostname[256];            /* the machine's (gethostname), a Host always answered */
    uint8_t pin_key[16];           /* the key of the pins' ids (pinid.h), drawn at start */
    atomic_uint_fast64_t next_id;  /* seeds: ids and unseeded sampling */
    atomic_uint_fast64_t next_req; /* request ids */
    atomic_bool stopping;          /* kp_server_free has begun: waits end, streams close */
    atomic_uint_fast64_t by_status[KP_HTTP_N_STATUS]; /* last: other */
    kp_cachekeys *ckeys;   /* requests by prompt_cache_key, retention pins */
    kp_gcache *gc;     /* compiled grammars of response_format / grammar / json_schema */
    kp_history *hist;     /* finished generations, for the dashboard (history.h) */
    kp_breakpoints *breakpoints;/* the pins of cache_control breakpoints (breakpoints.h) */
    kp_response_store *responses; /* stored Responses API responses (response_store.h) */
    kp_volatile *vol;  /* the volatile system-text patterns (volatile.h), NULL: none */
    struct kp_answers *answers; /* kvpin's own answers as the tokens the model wrote (answers.h), NULL: off */
    struct kp_promptlog *promptlog; /* --log-prompts (promptlog.h), NULL: off */
    atomic_uint_fast64_t volatile_dropped; /* system texts shortened or dropped by them */
    /* http.c's: the daemon, the URL bound, the route function, and the
     * request deadline: every open connection, and the thread that cuts
     * those whose request head and body did not arrive in time */
    struct MHD_Daemon *d;
    uint16_t port;
    char url[96]; /* http://ADDRESS:PORT of the listening socket */
    kp_route_fn route;
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    struct kp_sock *socks; /* doubly linked, under guard_mu */
    pthread_t guard;
    bool guard_inited, guard_started, guard_stop;
    atomic_uint_fast64_t cut_slow; /* connections cut at the deadline */
};

/* Seconds on the monotonic clock. */
double kp_now_s(void);

/* Starts listening on s->cfg's address with route as the handler of every
 * request that arrived whole. KP_EIO when the address cannot be bound or
 * the deadline thread cannot start (the message says why). */
kp_status kp_http_start(kp_server *s, kp_route_fn route, kp_error *err);

/* Ends every connection and the deadline thread (after which no handler
 * runs). Safe on a server kp_http_start failed on, or was never called
 * on (s zeroed), and twice. */
void kp_http_stop(kp_server *s);

/* Answers status with body[0..len) of the given Content-Type (copied) and
 * one more header (extra_header NULL: none). */
/* 204 to a CORS preflight (OPTIONS) from an origin --cors-origin allows
 * (cn->cors): the methods and headers the APIs use (origin.h). */
enum MHD_Result kp_http_preflight(kp_server *s, struct MHD_Connection *c);

enum MHD_Result kp_http_reply(kp_server *s, struct MHD_Connection *c, unsigned status, const char *type,
                              const char *body, size_t len, const char *extra_header, const char *extra_value);

/* Answers status with j (consumed; NULL: a 500 "out of memory"). */
enum MHD_Result kp_http_json(kp_server *s, struct MHD_Connection *c, unsigned status, json_t *j);

/* kp_http_json with one more header (name NULL: none). */
enum MHD_Result kp_http_json_h(kp_server *s, struct MHD_Connection *c, unsigned status, json_t *j,
                               const char *name, const char *value);

/* The error body in the shape of the API the request speaks (cn NULL or
 * without a shape: OpenAI's); *http gets the status that API gives it. */
json_t *kp_http_error_body(const kp_conn *cn, const kp_oai_error *e, int *http);

/* Answers the error e in the request's API's shape (Retry-After on a 503,
 * WWW-Authenticate on a 401). */
enum MHD_Result kp_http_error(kp_server *s, struct MHD_Connection *c, const kp_oai_error *e);

/* kp_http_error of an error made from its parts. */
enum MHD_Result kp_http_fail(kp_server *s, struct MHD_Connection *c, int http, const char *type, const char *code,
                             const char *param, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* Answers 200 with the event stream reader produces from cls (free_cb
 * releases cls when the response ends, or at once when the response
 * cannot be made; log is the stream's log line, told the 500 then). One
 * more header (hname NULL: none). */
enum MHD_Result kp_http_sse(kp_server *s, struct MHD_Connection *c, const kp_conn *cn,
                            MHD_ContentReaderCallback reader, void *cls, MHD_ContentReaderFreeCallback free_cb,
                            kp_reqlog *log, const char *hname, const char *hvalue);

/* Whether the client can no longer receive the answer (reset or failed;
 * one that only closed its sending side may still read). */
bool kp_http_client_gone(struct MHD_Connection *c);

/* The connection is about to be ended on purpose (its client left, or the
 * server stops): the handler returns MHD_NO, or a stream reader
 * MHD_CONTENT_READER_END_WITH_ERROR, right after, on the same thread, and
 * libmicrohttpd's report of it as an application error is left out of
 * the log. */
void kp_http_quiet_close(void);

/* The request log: a generation's numbers from the scheduler's last
 * update (and the dashboard's history), and the line written at the end
 * (nothing when quiet). */
void kp_reqlog_gen(kp_reqlog *l, const kp_sreq_update *u, const char *finish);
void kp_reqlog_write(const kp_server *s, const kp_reqlog *l);

#endif
