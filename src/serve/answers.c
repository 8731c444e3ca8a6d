/*
 * answers.c - kvpin's own answers as the tokens the model wrote
 * (answers.h).
 *
 * Owns the entries: a doubly linked list, most recently used first,
 * under one mutex. bytes counts each entry's text and ids; a put that
 * would pass max_bytes drops entries from the tail first. A lookup walks
 * the list once: an entry can match only when it is no longer than the
 * prompt and longer than the best so far; its last 32 bytes are compared
 * before the whole text.
 */
#include "serve/answers.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    struct entry *prev, *next;
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    bool open;
} entry;

struct kp_answers {
    pthread_mutex_t mu;
    entry *head, *tail;
    size_t count, bytes, max_bytes;
    uint64_t matches, stored;
};

static size_t entry_bytes(const entry *e) { return e->len + e->n * sizeof *e->ids + sizeof *e; }

kp_status kp_answers_new(kp_answers **out, size_t max_bytes, kp_error *err) {
    *out = NULL;
    if (!max_bytes) return kp_fail(err, KP_EINVAL, "the answer memory needs a size");
    kp_answers *a = calloc(1, sizeof *a);
    if (!a || pthread_mutex_init(&a->mu, NULL)) {
        free(a);
        return kp_fail(err, KP_ENOMEM, "out of memory");
    }
    a->max_bytes = max_bytes;
    *out = a;
    return KP_OK;
}

static void entry_free(entry *e) {
    free(e->text);
    free(e->ids);
    free(e);
}

void kp_answers_free(kp_answers *a) {
    if (!a) return;
    for (entry *e = a->head, *next; e; e = next) {
        next = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static void unlink_entry(kp_answers *a, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else a->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else a->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(kp_answers *a, entry *e) {
    e->prev = NULL;
    e->next = a->head;
    if (a->head) a->head->prev = e;
    a->head = e;
    if (!a->tail) a->tail = e;
}

void kp_answers_put(kp_answers *a, const char *text, size_t len, const int32_t *ids, size_t n, bool open) {
    if (!a || !len || !n) return;
    entry *e = calloc(1, sizeof *e);
    if (!e) return;
    e->text = malloc(len);
    e->ids = malloc(n * sizeof *ids);
    if (!e->text || !e->ids) {
        entry_free(e);
        return;
    }
    memcpy(e->text, text, len);
    memcpy(e->ids, ids, n * sizeof *ids);
    e->len = len;
    e->n = n;
    e->open = open;
    size_t need = entry_bytes(e);
    pthread_mutex_lock(&a->mu);
    for (entry *x = a->head; x; x = x->next) /* the same text: refreshed */
        if (x->len == len && !memcmp(x->text, text, len)) {
            unlink_entry(a, x);
            a->bytes -= entry_bytes(x);
            a->count--;
            entry_free(x);
            break;
        }
    if (need > a->max_bytes) {
        pthread_mutex_unlock(&a->mu);
        entry_free(e);
        return;
    }
    while (a->tail && a->bytes + need > a->max_bytes) {
        entry *old = a->tail;
        unlink_entry(a, old);
        a->bytes -= entry_bytes(old);
        a->count--;
        entry_free(old);
    }
    push_front(a, e);
    a->bytes += need;
    a->count++;
    a->stored++;
    pthread_mutex_unlock(&a->mu);
}

size_t kp_answers_match(kp_answers *a, const char *text, size_t len, int32_t **ids, size_t *n, bool *open) {
    *ids = NULL;
    *n = 0;
    *open = false;
    if (!a || !len) return 0;
    pthread_mutex_lock(&a->mu);
    entry *best = NULL;
    for (entry *e = a->head; e; e = e->next) {
        if (e->len > len || (best && e->len <= best->len)) continue;
        size_t tail = e->len < 32 ? e->len : 32;
        if (memcmp(e->text + e->len - tail, text + e->len - tail, tail) || memcmp(e->text, text, e->len)) continue;
        best = e;
    }
    size_t m = 0;
    if (best && (*ids = malloc(best->n * sizeof **ids))) {
        memcpy(*ids, best->ids, best->n * sizeof **ids);
        *n = best->n;
        *open = best->open;
        m = best->len;
        unlink_entry(a, best);
        push_front(a, best);
        a->matches++;
    }
    pthread_mutex_unlock(&a->mu);
    return m;
}

void kp_answers_counts(kp_answers *a, size_t *entries, size_t *bytes, uint64_t *matches, uint64_t *stored) {
    pthread_mutex_lock(&a->mu);
    *entries = a->count;
    *bytes = a->bytes;
    *matches = a->matches;
    *stored = a->stored;
    pthread_mutex_unlock(&a->mu);
}
