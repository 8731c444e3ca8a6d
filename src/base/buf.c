/*
 * buf.c - the growable byte buffer and the grow helper (buf.h).
 *
 * Growth rule (kp_grow): a full array of c elements that must hold n > c
 * becomes max(n, 2c, 64 bytes' worth) elements, so appending one element at
 * a time costs O(1) amortized copies, a first large request is allocated
 * exactly, and tiny arrays do not start with a string of reallocations.
 * Every product and sum is checked before it is formed.
 */
#include "base/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GROW_MIN_BYTES 64

/* The capacity kp_grow moves to, at most max_count; 0 when need cannot be
 * met (need > max_count or need * elem overflows). */
static size_t grown_cap(size_t cap, size_t need, size_t elem, size_t max_count) {
    if (elem == 0 || need > max_count || need > SIZE_MAX / elem) return 0;
    if (max_count > SIZE_MAX / elem) max_count = SIZE_MAX / elem;
    size_t nc = cap <= max_count / 2 ? 2 * cap : max_count;
    size_t floor = (GROW_MIN_BYTES + elem - 1) / elem;
    if (nc < floor) nc = floor < max_count ? floor : max_count;
    return nc > need ? nc : need;
}

static bool grow_to(void **p, size_t new_cap, size_t elem) {
    if (new_cap == 0) return false;
    void *q = realloc(*p, new_cap * elem);
    if (!q) return false;
    *p = q;
    return true;
}

bool kp_grow(void **p, size_t *cap, size_t need, size_t elem_size) {
    if (need <= *cap) return true;
    size_t nc = grown_cap(*cap, need, elem_size, SIZE_MAX);
    if (!grow_to(p, nc, elem_size)) return false;
    *cap = nc;
    return true;
}

bool kp_grow_u32(void **p, uint32_t *cap, uint32_t need, size_t elem_size) {
    if (need <= *cap) return true;
    size_t nc = grown_cap(*cap, need, elem_size, UINT32_MAX);
    if (!grow_to(p, nc, elem_size)) return false;
    *cap = (uint32_t)nc;
    return true;
}

bool kp_buf_reserve(kp_buf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX - b->len - 1 || !kp_grow((void **)&b->data, &b->cap, b->len + extra + 1, 1)) {
        b->oom = true;
        return false;
    }
    return true;
}

bool kp_buf_put(kp_buf *b, const void *s, size_t n) {
    if (!kp_buf_reserve(b, n)) return false;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

bool kp_buf_putc(kp_buf *b, char c) { return kp_buf_put(b, &c, 1); }

bool kp_buf_puts(kp_buf *b, const char *s) { return kp_buf_put(b, s, strlen(s)); }

bool kp_buf_printf(kp_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !kp_buf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

bool kp_buf_fill(kp_buf *b, char c, size_t n) {
    if (!kp_buf_reserve(b, n)) return false;
    memset(b->data + b->len, c, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

void kp_buf_truncate(kp_buf *b, size_t len) {
    if (len < b->len) b->len = len;
    b->oom = false;
    if (b->data) b->data[b->len] = 0;
}

bool kp_buf_take(kp_buf *b, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!b->oom) kp_buf_put(b, "", 0); /* an empty result is still a string */
    if (b->oom) {
        kp_buf_free(b);
        return false;
    }
    *out = b->data;
    *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return true;
}

void kp_buf_clear(kp_buf *b) {
    b->len = 0;
    b->oom = false;
    if (b->data) b->data[0] = 0;
}

void kp_buf_free(kp_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}
