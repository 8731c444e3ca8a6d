/*
 * breakpoints.c - the pins of cache_control breakpoints, by prefix (breakpoints.h).
 *
 * A flat array searched linearly: a server holds a few hundred
 * breakpoints at most, and a request looks up four.
 */
#include "serve/breakpoints.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    uint64_t hash, pin;
    uint32_t tokens;
    int64_t expires, set_at;
    uint64_t order; /* when set, for the least recently set */
} entry;

struct kp_breakpoints {
    pthread_mutex_t mu;
    entry *e;
    uint32_t n, max;
    uint64_t clock;
};

kp_status kp_breakpoints_new(kp_breakpoints **out, uint32_t max, kp_error *err) {
    *out = NULL;
    kp_breakpoints *b = calloc(1, sizeof *b);
    if (b) b->e = calloc(max ? max : 1, sizeof *b->e);
    if (!b || !b->e) {
        free(b);
        return kp_fail(err, KP_ENOMEM, "out of memory for the breakpoint table");
    }
    b->max = max ? max : 1;
    pthread_mutex_init(&b->mu, NULL);
    *out = b;
    return KP_OK;
}

void kp_breakpoints_free(kp_breakpoints *b) {
    if (!b) return;
    pthread_mutex_destroy(&b->mu);
    free(b->e);
    free(b);
}

uint64_t kp_breakpoints_hash(const int32_t *ids, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the ids' bytes, and the length */
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int k = 0; k < 4; k++) {
            h ^= (v >> (8 * k)) & 0xff;
            h *= 1099511628211ull;
        }
    }
    return h ^ (uint64_t)n;
}

static entry *find(kp_breakpoints *b, uint64_t h) {
    for (uint32_t i = 0; i < b->n; i++)
        if (b->e[i].hash == h) return &b->e[i];
    return NULL;
}

bool kp_breakpoints_live(kp_breakpoints *b, uint64_t h, int64_t now) {
    pthread_mutex_lock(&b->mu);
    entry *x = find(b, h);
    bool live = x && x->expires > now;
    pthread_mutex_unlock(&b->mu);
    return live;
}

uint64_t kp_breakpoints_set(kp_breakpoints *b, uint64_t h, uint64_t pin, uint32_t tokens, int64_t expires, int64_t now,
                      uint64_t *evicted) {
    *evicted = 0;
    uint64_t old = 0;
    pthread_mutex_lock(&b->mu);
    entry *x = find(b, h);
    if (x) {
        old = x->pin;
    } else if (b->n < b->max) {
        x = &b->e[b->n++];
    } else {
        x = &b->e[0];
        for (uint32_t i = 1; i < b->n; i++)
            if (b->e[i].order < x->order) x = &b->e[i];
        *evicted = x->pin;
    }
    *x = (entry){h, pin, tokens, expires, now, ++b->clock};
    pthread_mutex_unlock(&b->mu);
    return old == pin ? 0 : old;
}

uint32_t kp_breakpoints_count(kp_breakpoints *b, int64_t now, uint64_t *tokens) {
    uint32_t n = 0;
    uint64_t t = 0;
    pthread_mutex_lock(&b->mu);
    for (uint32_t i = 0; i < b->n; i++)
        if (b->e[i].expires > now) n++, t += b->e[i].tokens;
    pthread_mutex_unlock(&b->mu);
    if (tokens) *tokens = t;
    return n;
}
