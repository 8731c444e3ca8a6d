/*
 * buf.h - a growable byte buffer (floor 1), the one every module that builds
 * text uses (canonical JSON, chat renderings, SSE events, metrics).
 *
 *   data: | len bytes written | NUL | spare ... |   cap bytes allocated
 *
 * Writes keep data NUL-terminated. A failed allocation sets oom and drops
 * that write and every later one, so a caller checks once at the end.
 */
#ifndef KP_BUF_H
#define KP_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *data; /* NULL until the first write */
    size_t len, cap;
    bool oom;
} kp_buf;

/* Appends s[0..n); false when out of memory (then oom stays set). */
bool kp_buf_put(kp_buf *b, const void *s, size_t n);
bool kp_buf_putc(kp_buf *b, char c);
bool kp_buf_puts(kp_buf *b, const char *s);
bool kp_buf_printf(kp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Forgets the content, keeps the memory (oom is cleared). */
void kp_buf_clear(kp_buf *b);

/* Frees the memory; the buffer is empty again. */
void kp_buf_free(kp_buf *b);

#endif
