/*
 * history.c - the dashboard's bounded history (history.h).
 *
 * Owns three rings under one mutex, each a fixed array written round:
 *
 *   recent[KP_HISTORY_RECENT]   the last requests: numbers, prompt_cache_key,
 *                            the engine's report and the doctor report
 *                            (copied), seq numbers increasing;
 *                            slot = seq % KP_HISTORY_RECENT
 *   points[KP_HISTORY_POINTS]   latency points: prompt, reused, ttft, tpot, depth
 *   minutes[KP_HISTORY_MINUTES] one-minute buckets (requests, warm ones, tokens
 *                            reused, tokens computed and requests per cause);
 *                            slot = minute % KP_HISTORY_MINUTES,
 *                            a bucket whose `minute` is not the one asked for
 *                            is stale (older than the window) and reads as empty
 *
 * Invariants: n_recent <= KP_HISTORY_RECENT, n_points <= KP_HISTORY_POINTS; the
 * mutex is held only to copy in or out, the JSON is built from a copy.
 */
#include "serve/history.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/doctor.h"
#include "serve/cachekeys.h"
#include "serve/oai.h"

typedef struct {
    uint64_t seq;
    int64_t time;
    uint32_t prompt, reused, computed, completion;
    double ttft_ms, tpot_ms; /* tpot < 0: fewer than two tokens */
    const char *finish;
    char key[KP_CACHEKEYS_KEY_MAX + 1]; /* prompt_cache_key, "" none */
    bool warm;
    kp_doctor_cause cause;
    kp_eng_report report;
    kp_doctor_report doctor;
    bool has_doctor;
} entry;

typedef struct {
    uint32_t prompt, reused;
    float ttft_ms, tpot_ms, depth;
    bool warm;
} point;

typedef struct {
    int64_t minute; /* unix minute number (time / 60); 0: never written */
    uint32_t requests, hits;
    uint64_t reused;
    uint64_t computed[KP_DOCTOR_CAUSE_COUNT];
    uint32_t by_cause[KP_DOCTOR_CAUSE_COUNT]; /* requests */
} bucket;

struct kp_history {
    pthread_mutex_t mu;
    entry recent[KP_HISTORY_RECENT];
    uint64_t n_seq; /* requests recorded so far */
    point points[KP_HISTORY_POINTS];
    uint64_t n_point_seq;
    bucket minutes[KP_HISTORY_MINUTES];
};

kp_status kp_history_new(kp_history **out, kp_error *err) {
    *out = NULL;
    kp_history *h = calloc(1, sizeof *h);
    if (!h) return kp_fail(err, KP_ENOMEM, "out of memory for the request history");
    pthread_mutex_init(&h->mu, NULL);
    *out = h;
    return KP_OK;
}

void kp_history_free(kp_history *h) {
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* The cause a request is counted under: the doctor's, else cold when the
 * index was empty, else hit when everything but the last position was
 * reused, else other. */
static kp_doctor_cause cause_of(const kp_sreq_update *u) {
    if (u->has_doctor) return u->doctor.finding.cause;
    if (u->report.cold) return KP_DOCTOR_CAUSE_COLD;
    if (u->report.evicted) return KP_DOCTOR_CAUSE_EVICTED;
    return u->report.diverged_at_token >= u->report.prompt_tokens ? KP_DOCTOR_CAUSE_HIT : KP_DOCTOR_CAUSE_OTHER;
}

/* At least KP_HISTORY_WARM_PERCENT% of the prompt reused. */
static bool is_warm(uint32_t prompt, uint32_t reused) {
    return prompt > 0 && (uint64_t)reused * 100 >= (uint64_t)prompt * KP_HISTORY_WARM_PERCENT;
}

void kp_history_add(kp_history *h, const kp_sreq_update *u, const char *key, const char *finish, double total_ms,
                    int64_t now) {
    if (!h || !u->started) return;
    entry e;
    memset(&e, 0, sizeof e);
    e.time = now;
    e.prompt = u->prompt_tokens;
    e.reused = u->cached_tokens;
    e.computed = u->report.computed_tokens;
    e.completion = u->completion_tokens;
    e.ttft_ms = u->ttft_ms;
    e.tpot_ms = u->completion_tokens >= 2 && total_ms > u->ttft_ms
                    ? (total_ms - u->ttft_ms) / (double)(u->completion_tokens - 1)
                    : -1;
    e.finish = finish;
    snprintf(e.key, sizeof e.key, "%s", key ? key : "");
    e.cause = cause_of(u);
    e.report = u->report;
    e.has_doctor = u->has_doctor;
    if (u->has_doctor) e.doctor = u->doctor;
    bool warm = e.warm = is_warm(e.prompt, e.reused);
    point p = {e.prompt, e.reused, (float)e.ttft_ms, (float)e.tpot_ms,
               (float)e.prompt + (float)e.completion / 2.0f, warm};
    int64_t minute = now / 60;
    pthread_mutex_lock(&h->mu);
    e.seq = h->n_seq + 1;
    h->recent[h->n_seq % KP_HISTORY_RECENT] = e;
    h->n_seq++;
    h->points[h->n_point_seq++ % KP_HISTORY_POINTS] = p;
    bucket *b = &h->minutes[minute % KP_HISTORY_MINUTES];
    if (b->minute != minute) {
        memset(b, 0, sizeof *b);
        b->minute = minute;
    }
    b->requests++;
    b->hits += warm;
    b->reused += e.reused;
    if ((unsigned)e.cause < KP_DOCTOR_CAUSE_COUNT) {
        b->computed[e.cause] += e.computed;
        b->by_cause[e.cause]++;
    }
    pthread_mutex_unlock(&h->mu);
}

/* Characters (UTF-8 sequences) of the JSON-escaped snippet's first `marker`
 * bytes once decoded: where the divergence falls in the decoded text. */
static json_int_t marker_chars(const char *escaped, size_t marker) {
    size_t n = strlen(escaped);
    if (marker > n) marker = n;
    char *q = malloc(marker + 3);
    if (!q) return 0;
    q[0] = '"';
    memcpy(q + 1, escaped, marker);
    q[marker + 1] = '"';
    q[marker + 2] = 0;
    json_t *s = json_loads(q, JSON_DECODE_ANY, NULL);
    free(q);
    json_int_t chars = 0;
    if (s && json_is_string(s)) {
        const unsigned char *t = (const unsigned char *)json_string_value(s);
        for (size_t i = 0, len = json_string_length(s); i < len; i++) chars += (t[i] & 0xC0) != 0x80;
    }
    json_decref(s);
    return chars;
}

static json_t *entry_json(const entry *e) {
    json_t *cache = kp_oai_cache_json(&e->report, e->has_doctor ? &e->doctor : NULL);
    if (cache && e->has_doctor) {
        json_object_set_new(cache, "cached_marker",
                            json_integer(marker_chars(e->doctor.cached_snippet, e->doctor.cached_marker)));
        json_object_set_new(cache, "request_marker",
                            json_integer(marker_chars(e->doctor.request_snippet, e->doctor.request_marker)));
    }
    return json_pack("{s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:f, s:o, s:s?, s:b, s:s, s:o?}", "seq", (json_int_t)e->seq,
                     "time", (json_int_t)e->time, "prompt_cache_key", e->key[0] ? json_string(e->key) : json_null(),
                     "prompt_tokens", (json_int_t)e->prompt, "reused_tokens", (json_int_t)e->reused,
                     "computed_tokens", (json_int_t)e->computed, "completion_tokens", (json_int_t)e->completion,
                     "ttft_ms", e->ttft_ms, "tpot_ms", e->tpot_ms >= 0 ? json_real(e->tpot_ms) : json_null(),
                     "finish", e->finish, "warm", e->warm, "cause", kp_doctor_cause_name(e->cause), "cache", cache);
}

json_t *kp_history_json(kp_history *h, int64_t now) {
    kp_history *c = malloc(sizeof *c); /* a copy, built into JSON without the lock */
    if (!c) return NULL;
    pthread_mutex_lock(&h->mu);
    memcpy(c->recent, h->recent, sizeof c->recent);
    memcpy(c->points, h->points, sizeof c->points);
    memcpy(c->minutes, h->minutes, sizeof c->minutes);
    c->n_seq = h->n_seq;
    c->n_point_seq = h->n_point_seq;
    pthread_mutex_unlock(&h->mu);
    json_t *reqs = json_array(), *lat = json_array(), *mins = json_array(), *causes = json_array();
    uint64_t nr = c->n_seq < KP_HISTORY_RECENT ? c->n_seq : KP_HISTORY_RECENT;
    for (uint64_t i = 0; i < nr; i++)
        json_array_append_new(reqs, entry_json(&c->recent[(c->n_seq - 1 - i) % KP_HISTORY_RECENT]));
    uint64_t np = c->n_point_seq < KP_HISTORY_POINTS ? c->n_point_seq : KP_HISTORY_POINTS;
    for (uint64_t i = np; i > 0; i--) {
        const point *p = &c->points[(c->n_point_seq - i) % KP_HISTORY_POINTS];
        json_array_append_new(lat, json_pack("{s:I, s:I, s:f, s:b, s:f, s:o}", "prompt_tokens",
                                             (json_int_t)p->prompt, "reused_tokens", (json_int_t)p->reused,
                                             "ttft_ms", (double)p->ttft_ms, "warm", p->warm, "depth",
                                             (double)p->depth, "tpot_ms",
                                             p->tpot_ms >= 0 ? json_real(p->tpot_ms) : json_null()));
    }
    for (int k = 0; k < KP_DOCTOR_CAUSE_COUNT; k++)
        json_array_append_new(causes, json_string(kp_doctor_cause_name((kp_doctor_cause)k)));
    int64_t last = now / 60;
    for (int64_t m = last - KP_HISTORY_MINUTES + 1; m <= last; m++) {
        const bucket *b = &c->minutes[((m % KP_HISTORY_MINUTES) + KP_HISTORY_MINUTES) % KP_HISTORY_MINUTES];
        bool live = b->minute == m;
        json_t *comp = json_object(), *by = json_object();
        for (int k = 0; k < KP_DOCTOR_CAUSE_COUNT; k++) { /* the causes with tokens (requests) only */
            const char *name = kp_doctor_cause_name((kp_doctor_cause)k);
            if (live && b->computed[k]) json_object_set_new(comp, name, json_integer((json_int_t)b->computed[k]));
            if (live && b->by_cause[k]) json_object_set_new(by, name, json_integer((json_int_t)b->by_cause[k]));
        }
        json_array_append_new(mins, json_pack("{s:I, s:I, s:I, s:I, s:o, s:o}", "minute", (json_int_t)(m * 60),
                                              "requests", (json_int_t)(live ? b->requests : 0), "hits",
                                              (json_int_t)(live ? b->hits : 0), "reused",
                                              (json_int_t)(live ? b->reused : 0), "computed", comp,
                                              "requests_by_cause", by));
    }
    free(c);
    return json_pack("{s:o, s:o, s:o, s:o, s:i}", "requests", reqs, "latency", lat, "minutes", mins, "causes", causes,
                     "warm_percent", KP_HISTORY_WARM_PERCENT);
}
