/*
 * cachekeys.c - per-key request counters and retention pins (cachekeys.h).
 *
 * Owns two fixed arrays made at kp_cachekeys_new and a mutex. keys[0..n_keys)
 * is unordered; a lookup is a linear scan (a few hundred entries at most,
 * once per request). pins[0..n_pins) is a FIFO of keyless retention pins,
 * oldest at 0. Invariant: every entry's key is NUL-terminated and unique
 * within keys.
 */
#include "serve/cachekeys.h"

#include "serve/pinid.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char key[KP_CACHEKEYS_KEY_MAX + 1];
    uint64_t requests, prompt, cached;
    int64_t last_used;
    uint64_t pin; /* 0: none */
    int64_t pin_expires;
} ckey;

struct kp_cachekeys {
    pthread_mutex_t mu;
    ckey *keys;
    uint32_t n_keys, max_keys;
    uint64_t *pins;
    uint32_t n_pins, max_pins;
};

kp_status kp_cachekeys_new(kp_cachekeys **out, uint32_t max_keys, uint32_t max_pins, kp_error *err) {
    *out = NULL;
    if (max_keys == 0 || max_pins == 0) return kp_fail(err, KP_EINVAL, "the key table needs room for one at least");
    kp_cachekeys *k = calloc(1, sizeof *k);
    if (k) {
        k->keys = calloc(max_keys, sizeof *k->keys);
        k->pins = calloc(max_pins, sizeof *k->pins);
    }
    if (!k || !k->keys || !k->pins) {
        if (k) free(k->keys), free(k->pins);
        free(k);
        return kp_fail(err, KP_ENOMEM, "out of memory for the prompt_cache_key table");
    }
    k->max_keys = max_keys;
    k->max_pins = max_pins;
    pthread_mutex_init(&k->mu, NULL);
    *out = k;
    return KP_OK;
}

void kp_cachekeys_free(kp_cachekeys *k) {
    if (!k) return;
    pthread_mutex_destroy(&k->mu);
    free(k->keys);
    free(k->pins);
    free(k);
}

/* The entry of key, made (taking the least recently used one's place when
 * the table is full) when absent. *evicted_pin: the retention pin of an
 * entry that lost its place (0: none). Under mu. */
static ckey *entry(kp_cachekeys *k, const char *key, int64_t now, uint64_t *evicted_pin) {
    *evicted_pin = 0;
    char cut[KP_CACHEKEYS_KEY_MAX + 1];
    snprintf(cut, sizeof cut, "%s", key);
    uint32_t lru = 0;
    for (uint32_t i = 0; i < k->n_keys; i++) {
        if (!strcmp(k->keys[i].key, cut)) return &k->keys[i];
        if (k->keys[i].last_used < k->keys[lru].last_used) lru = i;
    }
    ckey *c;
    if (k->n_keys < k->max_keys) {
        c = &k->keys[k->n_keys++];
    } else {
        c = &k->keys[lru];
        *evicted_pin = c->pin;
    }
    memset(c, 0, sizeof *c);
    memcpy(c->key, cut, sizeof cut);
    c->last_used = now;
    return c;
}

void kp_cachekeys_note(kp_cachekeys *k, const char *key, uint32_t prompt, uint32_t cached, int64_t now) {
    uint64_t lost;
    pthread_mutex_lock(&k->mu);
    ckey *c = entry(k, key, now, &lost);
    c->requests++;
    c->prompt += prompt;
    c->cached += cached;
    c->last_used = now;
    pthread_mutex_unlock(&k->mu);
    (void)lost; /* a key that lost its place to another's count keeps its pin until it expires */
}

uint64_t kp_cachekeys_retain(kp_cachekeys *k, const char *key, uint64_t pin, int64_t expires, int64_t now) {
    uint64_t old = 0;
    pthread_mutex_lock(&k->mu);
    if (key) {
        uint64_t lost;
        ckey *c = entry(k, key, now, &lost);
        old = c->pin ? c->pin : lost;
        c->pin = pin;
        c->pin_expires = expires;
        c->last_used = now;
    } else {
        if (k->n_pins == k->max_pins) {
            old = k->pins[0];
            memmove(k->pins, k->pins + 1, (k->n_pins - 1) * sizeof *k->pins);
            k->n_pins--;
        }
        k->pins[k->n_pins++] = pin;
    }
    pthread_mutex_unlock(&k->mu);
    return old;
}

static int by_last_used(const void *a, const void *b) {
    const ckey *x = a, *y = b;
    return x->last_used < y->last_used ? 1 : x->last_used > y->last_used ? -1 : strcmp(x->key, y->key);
}

json_t *kp_cachekeys_json(kp_cachekeys *k, const uint8_t *pin_key) {
    pthread_mutex_lock(&k->mu);
    uint32_t n = k->n_keys;
    ckey *copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy) memcpy(copy, k->keys, n * sizeof *copy);
    pthread_mutex_unlock(&k->mu);
    if (!copy) return NULL;
    qsort(copy, n, sizeof *copy, by_last_used);
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < n; i++) {
        const ckey *c = &copy[i];
        char pin[KP_PINID_MAX];
        kp_pinid_format(pin_key, c->pin, pin);
        json_t *key = json_string(c->key);
        if (!key) key = json_string(""); /* a key cut inside a UTF-8 sequence */
        json_array_append_new(
            list, json_pack("{s:o, s:I, s:I, s:I, s:f, s:I, s:o, s:o}", "key", key, "requests",
                            (json_int_t)c->requests, "prompt_tokens", (json_int_t)c->prompt, "cached_tokens",
                            (json_int_t)c->cached, "hit_ratio", c->prompt ? (double)c->cached / (double)c->prompt : 0.0,
                            "last_used", (json_int_t)c->last_used, "retention_pin",
                            c->pin ? json_string(pin) : json_null(), "retention_expires_at",
                            c->pin ? json_integer((json_int_t)c->pin_expires) : json_null()));
    }
    free(copy);
    return list;
}
