/*
 * buf.c - the growable byte buffer (buf.h). Capacity doubles from 256 bytes;
 * the sizes are checked against overflow before they grow.
 */
#include "base/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(kp_buf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *nd = realloc(b->data, cap);
    if (!nd) {
        b->oom = true;
        return false;
    }
    b->data = nd;
    b->cap = cap;
    return true;
}

bool kp_buf_put(kp_buf *b, const void *s, size_t n) {
    if (!reserve(b, n)) return false;
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
    if (n < 0 || !reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
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
