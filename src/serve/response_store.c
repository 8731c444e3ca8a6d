/*
 * response_store.c - the store of Responses API responses (response_store.h).
 *
 * A doubly linked list, most recently used first, of entries {id,
 * response text, conversation text}, searched linearly (a few hundred at
 * most); texts are kept serialized so that its bytes are known and nothing
 * is shared with a request.
 */
#include "serve/response_store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rentry {
    char *id, *response, *conv;
    size_t bytes;
    struct rentry *prev, *next;
} rentry;

struct kp_response_store {
    pthread_mutex_t mu;
    rentry *head, *tail; /* most recently used first */
    uint32_t count, max_count;
    size_t bytes, max_bytes;
};

kp_status kp_response_store_new(kp_response_store **out, uint32_t max_count, size_t max_bytes, kp_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kp_fail(err, KP_ENOMEM, "out of memory for the response store");
    (*out)->max_count = max_count ? max_count : 1;
    (*out)->max_bytes = max_bytes ? max_bytes : 1;
    pthread_mutex_init(&(*out)->mu, NULL);
    return KP_OK;
}

static void unlink_entry(kp_response_store *s, rentry *x) {
    if (x->prev) x->prev->next = x->next;
    else s->head = x->next;
    if (x->next) x->next->prev = x->prev;
    else s->tail = x->prev;
    x->prev = x->next = NULL;
}

static void push_front(kp_response_store *s, rentry *x) {
    x->next = s->head;
    if (s->head) s->head->prev = x;
    s->head = x;
    if (!s->tail) s->tail = x;
}

static void drop(kp_response_store *s, rentry *x) {
    unlink_entry(s, x);
    s->count--;
    s->bytes -= x->bytes;
    free(x->id);
    free(x->response);
    free(x->conv);
    free(x);
}

void kp_response_store_free(kp_response_store *s) {
    if (!s) return;
    while (s->head) drop(s, s->head);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static rentry *find(kp_response_store *s, const char *id) {
    for (rentry *x = s->head; x; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

bool kp_response_store_put(kp_response_store *s, const char *id, const json_t *response, const json_t *conv) {
    rentry *x = calloc(1, sizeof *x);
    if (!x) return false;
    x->id = strdup(id);
    x->response = json_dumps(response, JSON_COMPACT | JSON_PRESERVE_ORDER);
    x->conv = json_dumps(conv, JSON_COMPACT);
    if (!x->id || !x->response || !x->conv) {
        free(x->id);
        free(x->response);
        free(x->conv);
        free(x);
        return false;
    }
    x->bytes = strlen(x->id) + strlen(x->response) + strlen(x->conv);
    pthread_mutex_lock(&s->mu);
    bool fits = x->bytes <= s->max_bytes;
    if (fits) {
        rentry *old = find(s, id);
        if (old) drop(s, old);
        while (s->tail && (s->count + 1 > s->max_count || s->bytes + x->bytes > s->max_bytes)) drop(s, s->tail);
        push_front(s, x);
        s->count++;
        s->bytes += x->bytes;
    }
    pthread_mutex_unlock(&s->mu);
    if (!fits) {
        free(x->id);
        free(x->response);
        free(x->conv);
        free(x);
    }
    return fits;
}

bool kp_response_store_get(kp_response_store *s, const char *id, json_t **response, json_t **conv) {
    if (response) *response = NULL;
    if (conv) *conv = NULL;
    pthread_mutex_lock(&s->mu);
    rentry *x = find(s, id);
    if (x) {
        unlink_entry(s, x);
        push_front(s, x);
        if (response) *response = json_loads(x->response, JSON_PRESERVE_ORDER | JSON_ALLOW_NUL, NULL);
        if (conv) *conv = json_loads(x->conv, JSON_ALLOW_NUL, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    return x != NULL;
}

bool kp_response_store_delete(kp_response_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    rentry *x = find(s, id);
    if (x) drop(s, x);
    pthread_mutex_unlock(&s->mu);
    return x != NULL;
}

void kp_response_store_stats(kp_response_store *s, uint32_t *count, size_t *bytes, uint32_t *max_count, size_t *max_bytes) {
    pthread_mutex_lock(&s->mu);
    *count = s->count;
    *bytes = s->bytes;
    *max_count = s->max_count;
    *max_bytes = s->max_bytes;
    pthread_mutex_unlock(&s->mu);
}
