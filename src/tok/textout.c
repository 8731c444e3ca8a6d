/*
 * textout.c - token ids to releasable text with stop strings (textout.h).
 *
 * Owns a kp_tok_stream, copies of the stop strings and two buffers:
 *
 *   pending: | released already (dropped) | held back: may begin a stop |
 *   out    : the bytes returned by the last call
 *
 * After each push, `safe` = the length of pending up to the earliest stop
 * string occurrence, or, with none, up to the start of the longest suffix
 * that is a proper prefix of some stop string. pending[0..safe) moves to out.
 * Invariant: pending never contains a whole stop string once stopped is
 * false (it would have been found), and nothing is released after stopped.
 */
#include "tok/textout.h"

#include "base/buf.h"

#include <stdlib.h>
#include <string.h>

struct kp_textout {
    kp_tok_stream *ts;
    char *stops[KP_TEXTOUT_MAX_STOPS];
    size_t stop_len[KP_TEXTOUT_MAX_STOPS];
    int n_stops;
    bool strip_space, stopped;
    kp_buf pend, out; /* pending text; the bytes the last call released */
    size_t released;
};

kp_status kp_textout_new(kp_textout **out, const kp_tok_vocab *v, const char *const *stops, int n_stops,
                         bool special, bool strip_space, kp_error *err) {
    *out = NULL;
    if (n_stops < 0 || n_stops > KP_TEXTOUT_MAX_STOPS)
        return kp_fail(err, KP_EINVAL, "at most %d stop strings", KP_TEXTOUT_MAX_STOPS);
    for (int i = 0; i < n_stops; i++)
        if (!stops[i] || !stops[i][0]) return kp_fail(err, KP_EINVAL, "stop string %d is empty", i);
    kp_textout *t = calloc(1, sizeof *t);
    if (!t) return kp_fail(err, KP_ENOMEM, "out of memory");
    kp_status st = kp_tok_stream_new(&t->ts, v, special, err);
    if (st != KP_OK) {
        free(t);
        return st;
    }
    t->strip_space = strip_space;
    for (int i = 0; i < n_stops; i++) {
        t->stop_len[i] = strlen(stops[i]);
        t->stops[i] = malloc(t->stop_len[i] + 1);
        if (!t->stops[i]) {
            kp_textout_free(t);
            return kp_fail(err, KP_ENOMEM, "out of memory");
        }
        memcpy(t->stops[i], stops[i], t->stop_len[i] + 1);
        t->n_stops++;
    }
    *out = t;
    return KP_OK;
}

void kp_textout_free(kp_textout *t) {
    if (!t) return;
    kp_tok_stream_free(t->ts);
    for (int i = 0; i < t->n_stops; i++) free(t->stops[i]);
    kp_buf_free(&t->pend);
    kp_buf_free(&t->out);
    free(t);
}

/* Bytes of pending safe to release; sets stopped on a whole stop string. */
static size_t scan(kp_textout *t) {
    size_t safe = t->pend.len;
    for (int i = 0; i < t->n_stops; i++) {
        const char *s = t->stops[i];
        size_t sl = t->stop_len[i];
        const char *found = t->pend.len ? memmem(t->pend.data, t->pend.len, s, sl) : NULL;
        if (found) {
            t->stopped = true;
            if ((size_t)(found - t->pend.data) < safe) safe = (size_t)(found - t->pend.data);
            continue;
        }
        for (size_t k = sl - 1; k > 0; k--) /* longest suffix of pending that begins s */
            if (k <= t->pend.len && !memcmp(t->pend.data + t->pend.len - k, s, k)) {
                if (t->pend.len - k < safe) safe = t->pend.len - k;
                break;
            }
    }
    return safe;
}

/* Moves pending[0..n) to out. */
static void release(kp_textout *t, size_t n, const char **text, size_t *len) {
    if (n == 0) return;
    kp_buf_clear(&t->out);
    if (!kp_buf_put(&t->out, t->pend.data, n)) return; /* out of memory: held back for now */
    memmove(t->pend.data, t->pend.data + n, t->pend.len - n);
    t->pend.len -= n;
    t->released += n;
    *text = t->out.data;
    *len = n;
}

static kp_status append(kp_textout *t, const char *b, size_t n, kp_error *err) {
    if (t->strip_space && n > 0) {
        if (b[0] == ' ') b++, n--;
        t->strip_space = false;
    }
    if (!kp_buf_put(&t->pend, b, n)) {
        t->pend.oom = false;
        return kp_fail(err, KP_ENOMEM, "out of memory for generated text");
    }
    return KP_OK;
}

kp_status kp_textout_push(kp_textout *t, int32_t id, const char **text, size_t *n, bool *stopped,
                          kp_error *err) {
    *text = "";
    *n = 0;
    *stopped = t->stopped;
    if (t->stopped) return KP_OK;
    const char *b;
    size_t nb;
    kp_status st = kp_tok_stream_push(t->ts, id, &b, &nb, err);
    if (st != KP_OK) return st;
    if ((st = append(t, b, nb, err)) != KP_OK) return st;
    size_t safe = scan(t);
    release(t, safe, text, n);
    *stopped = t->stopped;
    return KP_OK;
}

void kp_textout_finish(kp_textout *t, const char **text, size_t *n) {
    *text = "";
    *n = 0;
    if (t->stopped) return;
    const char *b;
    size_t nb;
    kp_tok_stream_flush(t->ts, &b, &nb);
    kp_error err;
    if (append(t, b, nb, &err) != KP_OK) nb = 0; /* out of memory: release what is held */
    release(t, t->pend.len, text, n);
}

size_t kp_textout_released(const kp_textout *t) { return t->released; }
