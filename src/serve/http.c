/*
 * http.c - libmicrohttpd under the server: connections, the request
 * deadline, the request log, and every answer's way out (http.h).
 *
 * Owns: the MHD daemon, per-connection state (kp_conn: the body being
 * received, its log line; kp_sock: the connection's deadline), the
 * request counters, the deadline thread. Knows no endpoint: a request
 * that arrived whole goes to s->route (routes.c).
 *
 * Invariants: every response goes through kp_http_reply or kp_http_sse,
 * which count it by status for /metrics.
 *
 * The request log: each request's kp_conn carries a kp_reqlog (its id,
 * client, method, path, then the status and error code of the answer, the
 * tokens and times of a generation). kp_http_reply finds the kp_conn of
 * the request being answered through the connection's socket context
 * (kp_sock: the request in progress; one at a time, as MHD runs a
 * connection's requests one after another on its thread), adds the
 * x-request-id header and notes the status. The line is written when the
 * request ends: by completed_cb, or for a stream by its free callback,
 * which holds a copy of the kp_reqlog. A request that got no answer (its
 * client left, or the server stopped first) is logged with status 499.
 */
#include "serve/http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/entropy.h"
#include "serve/origin.h"

const int kp_http_status_codes[KP_HTTP_N_STATUS] = {200, 400, 401, 404, 405, 413, 415, 421, 429, 431, 500, 503, 504, 0};

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
typedef struct kp_sock {
    kp_conn *cur;
    int fd;
    double deadline;
    bool receiving; /* a request head or body is still arriving */
    bool cut;
    struct kp_sock *prev, *next;
} kp_sock;

double kp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void count_status(kp_server *s, unsigned status) {
    int i = 0;
    while (i < KP_HTTP_N_STATUS - 1 && kp_http_status_codes[i] != (int)status) i++;
    atomic_fetch_add(&s->by_status[i], 1);
}

/* The request the connection is answering, or NULL. */
static kp_conn *current(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    kp_sock *k = ci ? ci->socket_context : NULL;
    return k ? k->cur : NULL;
}

/* ---- the request log ------------------------------------------------------ */

/* The generation's numbers, from the scheduler's last update. */
void kp_reqlog_gen(kp_reqlog *l, const kp_sreq_update *u, const char *finish) {
    l->gen = true;
    l->prompt = u->prompt_tokens;
    l->cached = u->cached_tokens;
    l->computed = u->report.computed_tokens;
    l->completion = u->completion_tokens;
    l->preempted = u->preemptions;
    l->cause = u->has_doctor ? kp_oai_cache_cause(&u->report, &u->doctor) : NULL; /* as kvpin_cache says */
    l->finish = finish;
    l->ttft_ms = u->ttft_ms;
    kp_history_add(l->hist, u, l->cache_key, finish, (kp_now_s() - l->t0) * 1e3, (int64_t)time(NULL));
}

/* One line on stderr, one fputs (whole even when threads log at once):
 *   TIME id= client= method= path= status= error= prompt= cached= computed=
 *   cause= completion= finish= preempted= ttft_ms= total_ms= ignored=
 * "-" where a field does not apply (see README.md). */
void kp_reqlog_write(const kp_server *s, const kp_reqlog *l) {
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
             num[3], l->finish ? l->finish : "-", num[4], ttft, (kp_now_s() - l->t0) * 1e3,
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
static void log_begin(kp_server *s, struct MHD_Connection *c, const char *method, const char *url, kp_reqlog *l) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    if (sane_request_id(h))
        snprintf(l->id, sizeof l->id, "%s", h);
    else if (kp_entropy_hex(l->id, sizeof l->id, 8, NULL) != KP_OK) /* random: it tells nothing */
        snprintf(l->id, sizeof l->id, "%llu", (unsigned long long)atomic_fetch_add(&s->next_req, 1) + 1);
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

/* ---- answers ---------------------------------------------------------------- */

enum MHD_Result kp_http_preflight(kp_server *s, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    kp_conn *cn = current(c);
    if (cn) {
        MHD_add_response_header(r, "x-request-id", cn->log.id);
        cn->log.status = 204;
        if (cn->cors) MHD_add_response_header(r, "Access-Control-Allow-Origin", cn->cors);
    }
    MHD_add_response_header(r, "Vary", "Origin");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", KP_ORIGIN_ALLOW_METHODS);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", KP_ORIGIN_ALLOW_HEADERS);
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ok = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    count_status(s, 204);
    return ok;
}

enum MHD_Result kp_http_reply(kp_server *s, struct MHD_Connection *c, unsigned status, const char *type,
                             const char *body, size_t len, const char *extra_header, const char *extra_value) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (extra_header) MHD_add_response_header(r, extra_header, extra_value);
    kp_conn *cn = current(c);
    if (cn) {
        MHD_add_response_header(r, "x-request-id", cn->log.id);
        cn->log.status = status;
        if (cn->cors) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", cn->cors);
            MHD_add_response_header(r, "Vary", "Origin");
        }
    }
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return ok;
}

/* Sends j (consumed). */
enum MHD_Result kp_http_json(kp_server *s, struct MHD_Connection *c, unsigned status, json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) return kp_http_reply(s, c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\","
                                                            "\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                            84, NULL, NULL);
    enum MHD_Result ok = kp_http_reply(s, c, status, "application/json", text, strlen(text), NULL, NULL);
    free(text);
    return ok;
}

/* reply_json with one more header (name NULL: none). */
enum MHD_Result kp_http_json_h(kp_server *s, struct MHD_Connection *c, unsigned status, json_t *j,
                                    const char *name, const char *value) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) return kp_http_json(s, c, status, NULL);
    enum MHD_Result ok = kp_http_reply(s, c, status, "application/json", text, strlen(text), name, value);
    free(text);
    return ok;
}

/* The error body in the shape of the API the request speaks (cn NULL:
 * OpenAI's); *http gets the status that API gives it. */
json_t *kp_http_error_body(const kp_conn *cn, const kp_oai_error *e, int *http) {
    *http = e->http;
    if (cn && cn->errors) return cn->errors(e, http);
    return kp_oai_error_json(e);
}

enum MHD_Result kp_http_error(kp_server *s, struct MHD_Connection *c, const kp_oai_error *e) {
    kp_conn *cn = current(c);
    int http;
    json_t *j = kp_http_error_body(cn, e, &http);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *h = NULL, *hv = NULL;
    if (cn) cn->log.code = e->code;
    if (e->http == 503) h = "Retry-After", hv = "1";
    if (e->http == 401) h = "WWW-Authenticate", hv = "Bearer";
    enum MHD_Result ok = kp_http_reply(s, c, (unsigned)http, "application/json", text ? text : "{}",
                               text ? strlen(text) : 2, h, hv);
    free(text);
    return ok;
}

enum MHD_Result kp_http_fail(kp_server *s, struct MHD_Connection *c, int http, const char *type, const char *code,
                             const char *param, const char *fmt, ...) {
    kp_oai_error e;
    kp_oai_fail(&e, http, type, code, param, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return kp_http_error(s, c, &e);
}

/* Answers 200 with the event stream that reader produces from cls (free_cb
 * releases cls when the response ends; st is its stream, for the log line
 * of a response that could not be made). */
enum MHD_Result kp_http_sse(kp_server *s, struct MHD_Connection *c, const kp_conn *cn,
                            MHD_ContentReaderCallback reader, void *cls, MHD_ContentReaderFreeCallback free_cb,
                            kp_reqlog *log, const char *hname, const char *hvalue) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, cls, free_cb);
    if (!resp) {
        log->status = 500;
        log->code = "out_of_memory";
        free_cb(cls);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "x-request-id", cn->log.id);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    if (cn->cors) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", cn->cors);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (hname) MHD_add_response_header(resp, hname, hvalue);
    enum MHD_Result res = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    count_status(s, 200);
    return res;
}

/* ---- slow clients: the request deadline ----------------------------------------- */

/* The request of c has arrived whole: no deadline while it is answered. */
static void guard_received(kp_server *s, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    kp_sock *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&s->guard_mu);
    k->receiving = false;
    pthread_mutex_unlock(&s->guard_mu);
}

/* An answer is done: the next request on the connection has its own deadline. */
static void guard_rearm(kp_server *s, kp_sock *k) {
    pthread_mutex_lock(&s->guard_mu);
    k->receiving = true;
    k->deadline = kp_now_s() + s->cfg.request_timeout_s;
    pthread_mutex_unlock(&s->guard_mu);
}

/* The guard thread: four times a second, shuts down the sockets whose
 * request is late (libmicrohttpd's thread of the connection then sees the
 * end of its input and closes it). */
static void *guard_main(void *arg) {
    kp_server *s = arg;
    pthread_mutex_lock(&s->guard_mu);
    while (!s->guard_stop) {
        double t = kp_now_s();
        for (kp_sock *k = s->socks; k; k = k->next)
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
bool kp_http_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {ci->connect_fd, 0, 0}; /* POLLERR and POLLHUP are always reported */
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLHUP | POLLERR)) != 0;
}

/* ---- requests arriving ------------------------------------------------------------ */

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
            *r = kp_http_fail(s, c, 400, "invalid_request_error", "bad_framing", NULL,
                      "Content-Length \"%.40s\" is not a number of bytes", v);
            return true;
        }
        if (i > 0 && strtoull(v, NULL, 10) != strtoull(f.cl[0], NULL, 10)) {
            *r = kp_http_fail(s, c, 400, "invalid_request_error", "bad_framing", NULL,
                      "two different Content-Length headers (%.20s and %.20s)", f.cl[0], v);
            return true;
        }
    }
    if (f.n_cl > 4) {
        *r = kp_http_fail(s, c, 400, "invalid_request_error", "bad_framing", NULL, "%d Content-Length headers", f.n_cl);
        return true;
    }
    if (f.n_te > 0 && f.n_cl > 0) {
        *r = kp_http_fail(s, c, 400, "invalid_request_error", "bad_framing", NULL,
                  "Content-Length together with Transfer-Encoding: send one of them");
        return true;
    }
    if (f.n_te > 1 || (f.n_te == 1 && strcasecmp(f.te[0] ? f.te[0] : "", "chunked"))) {
        *r = kp_http_fail(s, c, 501, "invalid_request_error", "unsupported_transfer_encoding", NULL,
                  "Transfer-Encoding \"%.40s\" is not supported (only chunked)", f.te[0] ? f.te[0] : "");
        return true;
    }
    return false;
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    kp_server *s = cls;
    kp_conn *cn = *con_cls;
    if (!cn) {
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->t0 = kp_now_s();
        *con_cls = cn;
        cn->log.t0 = cn->t0;
        cn->log.hist = s->hist;
        log_begin(s, c, method, url, &cn->log);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        if (ci && ci->socket_context) ((kp_sock *)ci->socket_context)->cur = cn;
        enum MHD_Result r;
        if (bad_framing(s, c, &r)) return r; /* answered before the body; MHD then closes the connection */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (*end || v > s->cfg.max_body) cn->too_big = true;
        }
        if (cn->too_big) /* answer before reading the body; MHD then closes the connection */
            return s->route(s, c, url, method, cn);
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
    return s->route(s, c, url, method, cn);
}

static void completed_cb(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)why;
    kp_server *s = cls;
    kp_conn *cn = *con_cls;
    if (!cn) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context && ((kp_sock *)ci->socket_context)->cur == cn) ((kp_sock *)ci->socket_context)->cur = NULL;
    if (ci && ci->socket_context) guard_rearm(s, ci->socket_context);
    if (!cn->streamed) kp_reqlog_write(s, &cn->log);
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
        kp_sock *k = calloc(1, sizeof(kp_sock));
        *socket_context = k;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!k || !ci) return; /* out of memory: this connection has no deadline (the idle timeout stays) */
        k->fd = ci->connect_fd;
        pthread_mutex_lock(&s->guard_mu);
        k->deadline = kp_now_s() + s->cfg.request_timeout_s;
        k->receiving = true;
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->guard_mu);
    } else {
        kp_sock *k = *socket_context;
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

/* Set on a connection's thread by kp_http_quiet_close: the handler or the
 * stream reader is about to end the connection on purpose (its client
 * left, or the server stops), which libmicrohttpd reports as an
 * application error; mhd_log leaves that report out (the request's own
 * log line says client_left or server_stopping). Per thread, as
 * libmicrohttpd runs each connection on one thread and logs there. */
static _Thread_local bool closing_on_purpose;

void kp_http_quiet_close(void) { closing_on_purpose = true; }

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    kp_server *s = cls;
    if (closing_on_purpose) { /* libmicrohttpd passes its messages as arguments of "%s\n" */
        char msg[96];
        va_list cp;
        va_copy(cp, ap);
        vsnprintf(msg, sizeof msg, fmt, cp);
        va_end(cp);
        if (!strncmp(msg, "Application reported internal error", 35) ||
            !strncmp(msg, "Closing connection (application reported error", 47)) {
            closing_on_purpose = false;
            return;
        }
    }
    if (s->cfg.quiet) return;
    fprintf(stderr, "kvpin serve: http: ");
    vfprintf(stderr, fmt, ap);
}


/* ---- the daemon ------------------------------------------------------------------ */

/* Binds the first of getaddrinfo's answers for host that can be bound
 * (IPv4 or IPv6 literal, "[::1]" too, or a name) and fills s->d, s->port
 * and s->url. */
static kp_status listen_on(kp_server *s, kp_error *err) {
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
    if (gai != 0 || !ai) return kp_fail(err, KP_EIO, "cannot resolve --host %s: %s", s->cfg.host, gai_strerror(gai));
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
    if (s->d) return KP_OK;
    if (v6_seen && MHD_is_feature_supported(MHD_FEATURE_IPv6) != MHD_YES)
        return kp_fail(err, KP_EIO, "cannot listen on %s: this libmicrohttpd has no IPv6", s->cfg.host);
    return kp_fail(err, KP_EIO, "cannot listen on %s port %u (in use, or not an address of this machine)", s->cfg.host,
                   (unsigned)s->cfg.port);
}

kp_status kp_http_start(kp_server *s, kp_route_fn route, kp_error *err) {
    s->route = route;
    pthread_mutex_init(&s->guard_mu, NULL);
    pthread_cond_init(&s->guard_cv, NULL);
    s->guard_inited = true;
    kp_status st = listen_on(s, err);
    if (st != KP_OK) return st;
    if (pthread_create(&s->guard, NULL, guard_main, s) != 0) {
        MHD_stop_daemon(s->d);
        s->d = NULL;
        return kp_fail(err, KP_EIO, "cannot start the request-deadline thread");
    }
    s->guard_started = true;
    return KP_OK;
}

void kp_http_stop(kp_server *s) {
    if (!s->guard_inited) return;
    atomic_store(&s->stopping, true); /* every wait of a handler returns within 250 ms */
    if (s->d) MHD_stop_daemon(s->d);  /* every connection is closed and unregistered */
    s->d = NULL;
    if (s->guard_started) {
        pthread_mutex_lock(&s->guard_mu);
        s->guard_stop = true;
        pthread_cond_signal(&s->guard_cv);
        pthread_mutex_unlock(&s->guard_mu);
        pthread_join(s->guard, NULL);
        s->guard_started = false;
    }
    pthread_mutex_destroy(&s->guard_mu);
    pthread_cond_destroy(&s->guard_cv);
    s->guard_inited = false;
}
