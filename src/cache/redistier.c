/*
 * redistier.c - the Redis tier (redistier.h).
 *
 * Owns: two hiredis connections (look: the engine thread's lookups; pub:
 * the background thread's publishes), the publish queue, the set of keys
 * published or seen, the fetch window and the counters (under mu).
 *
 *   handoff      a lookup connection the background thread made, taken by
 *                the engine thread at its next call (want_look asks for it)
 *   seen[cap]    open addressing over kp_bkey_h64 (0 empty): keys this
 *                process published (SET answered OK) or found present, so
 *                a block dropped while Redis was down is offered again by
 *                the next sequence that holds it; never grows past
 *                KP_REDIS_SEEN_MAX entries (then it is emptied). What Redis
 *                loses leaves it: a lookup that finds a seen key missing
 *                (evicted) removes it, and so that a restart without
 *                persistence or a FLUSHALL is noticed, the background
 *                thread reads the epoch key kvpin:FP:epoch every
 *                EPOCH_CHECK_S seconds (the first replica to find it
 *                absent writes a random value, SET NX): when it is absent
 *                or changed, Redis lost its data and seen is emptied, so
 *                every block a replica holds is published again at its
 *                next use
 *                (recurrent-state snapshots, staterec.h, are records like
 *                blocks: published through the same queue, under their own
 *                keys, kvpin:FP:<state key hex>, so they share all this)
 *   win[0..n_win) replies of the last pipelined GET, for win_key[...]
 *   sent_key[0..n_sent) the window after it: its GETs are sent before the
 *                replies of win are read, so Redis sends the next window
 *                while the engine verifies and copies this one
 *
 * The engine thread never connects: a lookup with no connection answers
 * "not here" (0 / KP_BLOCKREC_MISSING) at once. A failed round trip frees the
 * connection and asks the background thread for a new one, which it tries
 * once a second.
 */
#include "cache/redistier.h"

#include "base/entropy.h"
#include "cache/staterec.h"

#include <errno.h>
#include <hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define SEEN_MAX (1u << 20)
#define EPOCH_CHECK_S 2

typedef struct {
    kp_bkey key;
    uint8_t *rec;
    size_t size;
} rjob;

struct kp_redistier {
    bool keyed;                               /* records are sealed with mac_key */
    uint8_t mac_key[KP_BLOCKREC_KEY_BYTES];
    char host[256];
    int port;
    struct timeval tv;
    char addr[300];
    char fphex[33];
    const kp_fingerprint *fp;
    const kp_kvpool *pool;
    void (*log)(void *, const char *);
    void *log_ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv, cv_idle;
    pthread_t bg;
    bool started, stop, want_look, incident, publishing;
    redisContext *look, *handoff, *pub;
    rjob *queue;
    uint32_t qmax, qhead, qlen;
    uint64_t *seen;
    uint32_t seen_cap, seen_n;
    char epoch[33]; /* the epoch key's value when last read ("" none yet) */
    redisReply *win[KP_REDIS_WINDOW];
    kp_bkey win_key[KP_REDIS_WINDOW];
    uint32_t n_win;
    kp_bkey sent_key[KP_REDIS_WINDOW]; /* the next window: GETs sent, replies not read yet */
    uint32_t n_sent;
    kp_tier_stats st;
};

static void key_name(const kp_redistier *t, const kp_bkey *k, char out[80]) {
    char hex[33];
    kp_bkey_hex(k, hex);
    snprintf(out, 80, "kvpin:%s:%s", t->fphex, hex);
}

static void say(kp_redistier *t, const char *fmt, const char *what) {
    if (!t->log) return;
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, t->addr, what);
    t->log(t->log_ctx, msg);
}

/* ---- the seen set (caller holds mu) ---- */

static bool seen_has(const kp_redistier *t, uint64_t h) {
    if (!t->seen_cap) return false;
    h = h ? h : 1;
    for (uint32_t i = (uint32_t)h & (t->seen_cap - 1);; i = (i + 1) & (t->seen_cap - 1)) {
        if (!t->seen[i]) return false;
        if (t->seen[i] == h) return true;
    }
}

/* Removes h (backward-shift deletion keeps every probe run whole). */
static void seen_remove(kp_redistier *t, uint64_t h) {
    if (!t->seen_cap) return;
    if (!h) h = 1;
    uint32_t m = t->seen_cap - 1, i = (uint32_t)h & m;
    while (t->seen[i] && t->seen[i] != h) i = (i + 1) & m;
    if (!t->seen[i]) return;
    t->seen[i] = 0;
    t->seen_n--;
    for (uint32_t j = (i + 1) & m; t->seen[j]; j = (j + 1) & m) {
        uint32_t home = (uint32_t)t->seen[j] & m;
        /* move j back to the hole when its home is not in (i, j] (cyclically) */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            t->seen[i] = t->seen[j];
            t->seen[j] = 0;
            i = j;
        }
    }
}

static void seen_add(kp_redistier *t, uint64_t h) {
    h = h ? h : 1;
    if (seen_has(t, h)) return;
    if (2 * (t->seen_n + 1) > t->seen_cap) {
        uint32_t cap = t->seen_cap ? 2 * t->seen_cap : 1024;
        if (t->seen_n >= SEEN_MAX) cap = t->seen_cap; /* full: start over */
        uint64_t *s = calloc(cap, sizeof *s);
        if (!s) return;
        uint64_t *old = t->seen;
        uint32_t oc = t->seen_cap;
        t->seen = s;
        t->seen_cap = cap;
        uint32_t n = t->seen_n;
        t->seen_n = 0;
        for (uint32_t i = 0; old && n < SEEN_MAX && i < oc; i++)
            if (old[i]) seen_add(t, old[i]);
        free(old);
    }
    uint32_t i = (uint32_t)h & (t->seen_cap - 1);
    while (t->seen[i]) i = (i + 1) & (t->seen_cap - 1);
    t->seen[i] = h;
    t->seen_n++;
}

/* ---- connections ---- */

/* A connection that answered PING within the timeout, or NULL with why
 * and the failure counted (timeout, io, or format for a wrong answer).
 * Caller does not hold mu. */
static redisContext *connect_checked(kp_redistier *t, char *why, size_t cap) {
    redisContext *c = redisConnectWithTimeout(t->host, t->port, t->tv);
    kp_blockrec_reason r = KP_BLOCKREC_OK;
    if (!c || c->err) {
        snprintf(why, cap, "%s", c ? c->errstr : "out of memory");
        r = c && c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EINPROGRESS) ? KP_BLOCKREC_TIMEOUT : KP_BLOCKREC_IO;
    } else {
        redisSetTimeout(c, t->tv);
        redisReply *rep = redisCommand(c, "PING");
        if (!rep || rep->type != REDIS_REPLY_STATUS) {
            bool timeout = c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
            snprintf(why, cap, "%s%s", timeout ? "timed out: " : "",
                     c->err ? c->errstr : "PING was not answered with a status");
            r = c->err ? (timeout ? KP_BLOCKREC_TIMEOUT : KP_BLOCKREC_IO) : KP_BLOCKREC_FORMAT;
        }
        if (rep) freeReplyObject(rep);
    }
    if (r == KP_BLOCKREC_OK) return c;
    if (c) redisFree(c);
    pthread_mutex_lock(&t->mu);
    t->st.fail[r]++;
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void drop_window(kp_redistier *t) {
    for (uint32_t i = 0; i < t->n_win; i++)
        if (t->win[i]) freeReplyObject(t->win[i]);
    t->n_win = 0;
}

/* Appends GETs of keys[0..n) (sent with the next read); they become sent_key. */
static void send_window(kp_redistier *t, redisContext *c, const kp_bkey *keys, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        char name[80];
        key_name(t, &keys[i], name);
        redisAppendCommand(c, "GET %s", name);
        t->sent_key[i] = keys[i];
    }
    t->n_sent = n;
}

/* Reads n replies in flight into win, for keys[0..n). False on a failed
 * read (the caller counts it). */
static bool read_window(kp_redistier *t, redisContext *c, const kp_bkey *keys, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) return false;
        t->win[i] = r;
        t->win_key[i] = keys[i];
        t->n_win = i + 1;
    }
    return true;
}

/* Forgets the window and the replies in flight (read and freed, so the
 * connection's next reply is the next command's). False on a failed read. */
static bool drop_all(kp_redistier *t) {
    drop_window(t);
    if (!t->n_sent) return true;
    if (!t->look) {
        t->n_sent = 0;
        return true;
    }
    uint32_t n = t->n_sent;
    t->n_sent = 0;
    bool ok = read_window(t, t->look, t->sent_key, n);
    drop_window(t);
    return ok;
}

/* The engine thread's connection: its own, or one the background made. */
static redisContext *lookup_ctx(kp_redistier *t) {
    if (t->look) return t->look;
    pthread_mutex_lock(&t->mu);
    t->look = t->handoff;
    t->handoff = NULL;
    pthread_mutex_unlock(&t->mu);
    return t->look;
}

/* A lookup round trip failed: the connection goes, the background is asked
 * for another, the failure counted (and logged once per incident). */
static kp_blockrec_reason lookup_failed(kp_redistier *t, kp_blockrec_reason r) {
    const char *what = t->look && t->look->err ? t->look->errstr : "bad reply";
    bool timeout = t->look && t->look->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (r == KP_BLOCKREC_IO && timeout) r = KP_BLOCKREC_TIMEOUT;
    char msg[256];
    snprintf(msg, sizeof msg, "%s%s", r == KP_BLOCKREC_TIMEOUT ? "timed out: " : "", what);
    drop_window(t);
    t->n_sent = 0;
    if (t->look) redisFree(t->look);
    t->look = NULL;
    pthread_mutex_lock(&t->mu);
    t->st.fail[r]++;
    t->want_look = true;
    bool first = !t->incident;
    t->incident = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (first) say(t, "redis %s: %s; computing without the Redis tier, reconnecting in the background", msg);
    return r;
}

/* The epoch key (see the top of this file), on the publish connection;
 * called without mu. false when the connection failed. */
static bool check_epoch(kp_redistier *t) {
    char name[80], now[33] = "";
    snprintf(name, sizeof name, "kvpin:%s:epoch", t->fphex);
    redisReply *r = redisCommand(t->pub, "GET %s", name);
    if (!r) return false;
    bool absent = r->type == REDIS_REPLY_NIL;
    if (r->type == REDIS_REPLY_STRING && r->len < (long long)sizeof now) memcpy(now, r->str, (size_t)r->len);
    freeReplyObject(r);
    if (absent) { /* the first to notice writes one; every replica reads the winner's */
        char mine[33];
        if (kp_entropy_hex(mine, sizeof mine, 16, NULL) != KP_OK) return true;
        if ((r = redisCommand(t->pub, "SET %s %s NX", name, mine))) freeReplyObject(r);
        if (!(r = redisCommand(t->pub, "GET %s", name))) return false;
        if (r->type == REDIS_REPLY_STRING && r->len < (long long)sizeof now) memcpy(now, r->str, (size_t)r->len);
        freeReplyObject(r);
    }
    pthread_mutex_lock(&t->mu);
    if (absent || (t->epoch[0] && strcmp(now, t->epoch))) { /* Redis lost what it held */
        if (t->seen) memset(t->seen, 0, (size_t)t->seen_cap * sizeof *t->seen);
        t->seen_n = 0;
        t->st.epochs_lost += t->epoch[0] != 0;
    }
    snprintf(t->epoch, sizeof t->epoch, "%s", now);
    pthread_mutex_unlock(&t->mu);
    return true;
}

static void *bg_main(void *arg) {
    kp_redistier *t = arg;
    time_t last_look = 0, last_pub = 0, last_epoch = 0;
    char why[256];
    pthread_setname_np(pthread_self(), "kvpin-redis"); /* ps -L, /proc/PID/task/TID/comm */
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        time_t now = time(NULL);
        if (t->want_look && !t->handoff && now != last_look) {
            last_look = now;
            pthread_mutex_unlock(&t->mu);
            redisContext *c = connect_checked(t, why, sizeof why);
            pthread_mutex_lock(&t->mu);
            if (c) {
                t->handoff = c;
                t->want_look = false;
                if (t->incident) {
                    t->incident = false;
                    pthread_mutex_unlock(&t->mu);
                    say(t, "redis %s: %s", "connected again, sharing resumes");
                    pthread_mutex_lock(&t->mu);
                }
            } else if (!t->incident) {
                t->incident = true;
                pthread_mutex_unlock(&t->mu);
                say(t, "redis %s: %s; computing without the Redis tier, reconnecting in the background", why);
                pthread_mutex_lock(&t->mu);
            }
            continue;
        }
        if (t->qlen && !t->pub && now != last_pub) {
            last_pub = now;
            pthread_mutex_unlock(&t->mu);
            redisContext *c = connect_checked(t, why, sizeof why);
            pthread_mutex_lock(&t->mu);
            t->pub = c;
            if (!c) { /* Redis is down: what waits is dropped, not kept for later */
                while (t->qlen) {
                    free(t->queue[t->qhead].rec);
                    t->qhead = (t->qhead + 1) % t->qmax;
                    t->qlen--;
                    t->st.write_errors++;
                }
                pthread_cond_broadcast(&t->cv_idle);
            }
            continue;
        }
        if (t->pub && now - last_epoch >= EPOCH_CHECK_S) {
            last_epoch = now;
            pthread_mutex_unlock(&t->mu);
            bool up = check_epoch(t);
            pthread_mutex_lock(&t->mu);
            if (!up) {
                redisFree(t->pub);
                t->pub = NULL;
            }
            continue;
        }
        if (t->qlen && t->pub) {
            rjob j = t->queue[t->qhead];
            t->qhead = (t->qhead + 1) % t->qmax;
            t->qlen--;
            t->publishing = true;
            pthread_mutex_unlock(&t->mu);
            char name[80];
            key_name(t, &j.key, name);
            const char *argv[3] = {"SET", name, (const char *)j.rec};
            size_t lens[3] = {3, strlen(name), j.size};
            redisReply *r = redisCommandArgv(t->pub, 3, argv, lens);
            bool ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            free(j.rec);
            pthread_mutex_lock(&t->mu);
            t->publishing = false;
            if (ok) {
                seen_add(t, kp_bkey_h64(&j.key));
                t->st.writes++;
                t->st.bytes_written += j.size;
            } else {
                t->st.write_errors++;
                redisFree(t->pub);
                t->pub = NULL;
            }
            if (!t->qlen) pthread_cond_broadcast(&t->cv_idle);
            continue;
        }
        if (!t->qlen) pthread_cond_broadcast(&t->cv_idle);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&t->cv, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

kp_status kp_redis_open(kp_redistier **out, const kp_redis_config *cfg, const kp_fingerprint *fp, const kp_kvpool *p,
                        kp_error *err) {
    *out = NULL;
    const char *colon = cfg->addr ? strrchr(cfg->addr, ':') : NULL;
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == cfg->addr || (size_t)(colon - cfg->addr) >= 256 || !end || *end || port < 1 || port > 65535)
        return kp_fail(err, KP_EINVAL, "the Redis address \"%s\" is not HOST:PORT", cfg->addr ? cfg->addr : "");
    kp_redistier *t = calloc(1, sizeof *t);
    if (!t) return kp_fail(err, KP_ENOMEM, "out of memory for the Redis tier");
    memcpy(t->host, cfg->addr, (size_t)(colon - cfg->addr));
    t->port = (int)port;
    snprintf(t->addr, sizeof t->addr, "%s", cfg->addr);
    uint32_t ms = cfg->timeout_ms ? cfg->timeout_ms : 50;
    t->tv.tv_sec = ms / 1000;
    t->tv.tv_usec = (ms % 1000) * 1000;
    t->fp = fp;
    if (cfg->mac_key) {
        t->keyed = true;
        memcpy(t->mac_key, cfg->mac_key, KP_BLOCKREC_KEY_BYTES);
    }
    kp_bkey_hex(&fp->id, t->fphex);
    t->pool = p;
    t->log = cfg->log;
    t->log_ctx = cfg->log_ctx;
    t->qmax = cfg->queue_max ? cfg->queue_max : 256;
    t->want_look = true;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_cond_init(&t->cv_idle, NULL);
    t->queue = calloc(t->qmax, sizeof *t->queue);
    if (!t->queue || pthread_create(&t->bg, NULL, bg_main, t) != 0) {
        kp_redis_close(t);
        return kp_fail(err, KP_ENOMEM, "cannot start the Redis tier");
    }
    t->started = true;
    *out = t;
    return KP_OK;
}

void kp_redis_close(kp_redistier *t) {
    if (!t) return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->bg, NULL);
    }
    drop_window(t);
    for (uint32_t i = 0; i < t->qlen; i++) free(t->queue[(t->qhead + i) % t->qmax].rec);
    if (t->look) redisFree(t->look);
    if (t->handoff) redisFree(t->handoff);
    if (t->pub) redisFree(t->pub);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_cond_destroy(&t->cv_idle);
    free(t->queue);
    free(t->seen);
    free(t);
}

bool kp_redis_wait_connected(kp_redistier *t, uint32_t ms) {
    for (uint32_t waited = 0;; waited += 10) {
        if (lookup_ctx(t)) return true;
        if (waited >= ms) return false;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
}

uint32_t kp_redis_probe(kp_redistier *t, const kp_bkey *keys, uint32_t n) {
    if (!drop_all(t)) {
        lookup_failed(t, KP_BLOCKREC_IO);
        return 0;
    }
    redisContext *c = lookup_ctx(t);
    if (!c || !n) return 0;
    if (n > KP_REDIS_PROBE_MAX) { /* one round trip per KP_REDIS_PROBE_MAX keys, while all are present */
        uint32_t got = 0, k;
        do {
            k = kp_redis_probe(t, keys + got, n - got < KP_REDIS_PROBE_MAX ? n - got : KP_REDIS_PROBE_MAX);
            got += k;
        } while (k == KP_REDIS_PROBE_MAX && got < n);
        return got;
    }
    for (uint32_t i = 0; i < n; i++) {
        char name[80];
        key_name(t, &keys[i], name);
        redisAppendCommand(c, "EXISTS %s", name);
    }
    uint32_t present = 0;
    bool run = true;
    for (uint32_t i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            lookup_failed(t, KP_BLOCKREC_IO);
            return 0;
        }
        bool garbage = r->type != REDIS_REPLY_INTEGER;
        if (run && !garbage && r->integer == 1) present++;
        else run = false;
        freeReplyObject(r);
        if (garbage) {
            lookup_failed(t, KP_BLOCKREC_FORMAT);
            return 0;
        }
    }
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < present; i++) seen_add(t, kp_bkey_h64(&keys[i]));
    pthread_mutex_unlock(&t->mu);
    return present;
}

bool kp_redis_known(kp_redistier *t, const kp_bkey *key) {
    pthread_mutex_lock(&t->mu);
    bool known = seen_has(t, kp_bkey_h64(key));
    pthread_mutex_unlock(&t->mu);
    return known;
}

kp_blockrec_reason kp_redis_get(kp_redistier *t, const kp_bkey *keys, uint32_t n_ahead, const int32_t *tokens,
                            kp_kvpool *p, int32_t block) {
    pthread_mutex_lock(&t->mu);
    t->st.lookups++;
    pthread_mutex_unlock(&t->mu);
    uint32_t w = 0;
    while (w < t->n_win && !kp_bkey_eq(&t->win_key[w], &keys[0])) w++;
    if (w == t->n_win) { /* not fetched yet: the next window, asked for already or now */
        uint32_t n = n_ahead < 1 ? 1 : n_ahead > KP_REDIS_WINDOW ? KP_REDIS_WINDOW : n_ahead;
        bool asked = t->n_sent && kp_bkey_eq(&t->sent_key[0], &keys[0]) && t->n_sent <= n;
        drop_window(t);
        if (!asked && !drop_all(t)) return lookup_failed(t, KP_BLOCKREC_IO);
        redisContext *c = lookup_ctx(t);
        if (!c) return KP_BLOCKREC_MISSING;
        if (!asked) send_window(t, c, keys, n);
        n = t->n_sent;
        /* the window after this one is appended now and goes out with this read */
        uint32_t m = n_ahead > n ? n_ahead - n : 0;
        t->n_sent = 0;
        if (m) send_window(t, c, keys + n, m > KP_REDIS_WINDOW ? KP_REDIS_WINDOW : m);
        if (!read_window(t, c, keys, n)) return lookup_failed(t, KP_BLOCKREC_IO);
        w = 0;
    }
    redisReply *r = t->win[w];
    kp_blockrec_reason why;
    if (r->type == REDIS_REPLY_NIL) why = KP_BLOCKREC_MISSING;
    else if (r->type != REDIS_REPLY_STRING) why = KP_BLOCKREC_FORMAT;
    else {
        size_t body = (size_t)r->len;
        why = kp_blockrec_unseal((const uint8_t *)r->str, (size_t)r->len, t->keyed ? t->mac_key : NULL, &body);
        if (why == KP_BLOCKREC_OK) why = kp_blockrec_check((const uint8_t *)r->str, body, p, &t->fp->id, &keys[0], tokens);
    }
    if (why == KP_BLOCKREC_OK) kp_blockrec_load((const uint8_t *)r->str, p, block);
    pthread_mutex_lock(&t->mu);
    if (why == KP_BLOCKREC_OK) {
        t->st.hits++;
        t->st.bytes_read += (uint64_t)r->len;
    } else {
        t->st.fail[why]++;
        seen_remove(t, kp_bkey_h64(&keys[0])); /* evicted (or bad): publish it again when held */
    }
    pthread_mutex_unlock(&t->mu);
    return why;
}

/* Whether a record of key is to be published (not published or seen by
 * this process, room in the queue; a full queue is counted). */
static bool admit(kp_redistier *t, const kp_bkey *key) {
    pthread_mutex_lock(&t->mu);
    bool skip = seen_has(t, kp_bkey_h64(key)), full = t->qlen == t->qmax;
    if (!skip && full) t->st.dropped_queue++;
    pthread_mutex_unlock(&t->mu);
    return !(skip || full);
}

/* Seals rec[0..body) when keyed and queues it (the queue takes rec, else
 * it is freed). True when queued. */
static bool enqueue(kp_redistier *t, const kp_bkey *key, uint8_t *rec, size_t body, size_t size) {
    if (t->keyed) kp_blockrec_seal(rec, body, t->mac_key);
    pthread_mutex_lock(&t->mu);
    bool queued = t->qlen < t->qmax;
    if (queued) {
        t->queue[(t->qhead + t->qlen) % t->qmax] = (rjob){*key, rec, size};
        t->qlen++;
        pthread_cond_signal(&t->cv);
    } else {
        t->st.dropped_queue++;
    }
    pthread_mutex_unlock(&t->mu);
    if (!queued) free(rec);
    return queued;
}

bool kp_redis_put(kp_redistier *t, const kp_bkey *key, const kp_bkey *parent, const int32_t *tokens, int32_t block) {
    if (!admit(t, key)) return false;
    size_t body = kp_blockrec_size(t->pool), size = body + (t->keyed ? KP_BLOCKREC_MAC_BYTES : 0);
    uint8_t *rec = malloc(size);
    if (!rec) return false;
    kp_blockrec_encode(rec, t->pool, block, &t->fp->id, key, parent, tokens);
    return enqueue(t, key, rec, body, size);
}

bool kp_redis_put_state(kp_redistier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos, const int32_t *tail,
                        int32_t tail_block, const float *state, uint64_t state_bytes) {
    if (!admit(t, key)) return false;
    size_t body = kp_staterec_size(t->pool, pos, state_bytes), size = body + (t->keyed ? KP_BLOCKREC_MAC_BYTES : 0);
    uint8_t *rec = malloc(size);
    if (!rec) return false;
    kp_staterec_encode(rec, t->pool, &t->fp->id, key, parent, pos, tail, tail_block, state, state_bytes);
    return enqueue(t, key, rec, body, size);
}

uint32_t kp_redis_exists(kp_redistier *t, const kp_bkey *keys, uint32_t n, bool *present) {
    memset(present, 0, (size_t)n * sizeof *present);
    if (!drop_all(t)) {
        lookup_failed(t, KP_BLOCKREC_IO);
        return 0;
    }
    uint32_t found = 0;
    for (uint32_t i0 = 0; i0 < n; i0 += KP_REDIS_PROBE_MAX) { /* one round trip per KP_REDIS_PROBE_MAX keys */
        redisContext *c = lookup_ctx(t);
        if (!c) return found;
        uint32_t m = n - i0 < KP_REDIS_PROBE_MAX ? n - i0 : KP_REDIS_PROBE_MAX;
        for (uint32_t i = 0; i < m; i++) {
            char name[80];
            key_name(t, &keys[i0 + i], name);
            redisAppendCommand(c, "EXISTS %s", name);
        }
        for (uint32_t i = 0; i < m; i++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                lookup_failed(t, KP_BLOCKREC_IO);
                memset(present, 0, (size_t)n * sizeof *present);
                return 0;
            }
            bool garbage = r->type != REDIS_REPLY_INTEGER;
            present[i0 + i] = !garbage && r->integer == 1;
            found += present[i0 + i];
            if (present[i0 + i]) {
                pthread_mutex_lock(&t->mu);
                seen_add(t, kp_bkey_h64(&keys[i0 + i]));
                pthread_mutex_unlock(&t->mu);
            }
            freeReplyObject(r);
            if (garbage) {
                lookup_failed(t, KP_BLOCKREC_FORMAT);
                memset(present, 0, (size_t)n * sizeof *present);
                return 0;
            }
        }
    }
    return found;
}

kp_blockrec_reason kp_redis_get_state(kp_redistier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos,
                                      const int32_t *tail, kp_kvpool *p, int32_t tail_block, float *state,
                                      uint64_t state_bytes) {
    pthread_mutex_lock(&t->mu);
    t->st.lookups++;
    pthread_mutex_unlock(&t->mu);
    if (!drop_all(t)) return lookup_failed(t, KP_BLOCKREC_IO);
    redisContext *c = lookup_ctx(t);
    if (!c) return KP_BLOCKREC_MISSING;
    char name[80];
    key_name(t, key, name);
    redisReply *r = redisCommand(c, "GET %s", name);
    if (!r) return lookup_failed(t, KP_BLOCKREC_IO);
    kp_blockrec_reason why;
    if (r->type == REDIS_REPLY_NIL) why = KP_BLOCKREC_MISSING;
    else if (r->type != REDIS_REPLY_STRING) why = KP_BLOCKREC_FORMAT;
    else {
        size_t body = (size_t)r->len;
        why = kp_blockrec_unseal((const uint8_t *)r->str, (size_t)r->len, t->keyed ? t->mac_key : NULL, &body);
        if (why == KP_BLOCKREC_OK)
            why = kp_staterec_check((const uint8_t *)r->str, body, p, &t->fp->id, key, parent, pos, tail, state_bytes);
    }
    if (why == KP_BLOCKREC_OK) kp_staterec_load((const uint8_t *)r->str, p, tail_block, state);
    pthread_mutex_lock(&t->mu);
    if (why == KP_BLOCKREC_OK) {
        t->st.hits++;
        t->st.bytes_read += (uint64_t)r->len;
    } else {
        t->st.fail[why]++;
        seen_remove(t, kp_bkey_h64(key)); /* evicted (or bad): publish it again when held */
    }
    pthread_mutex_unlock(&t->mu);
    freeReplyObject(r);
    return why;
}

void kp_redis_flush(kp_redistier *t) {
    pthread_mutex_lock(&t->mu);
    while (t->qlen || t->publishing) pthread_cond_wait(&t->cv_idle, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void kp_redis_get_stats(kp_redistier *t, kp_tier_stats *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}
