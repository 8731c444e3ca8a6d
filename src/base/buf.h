/*
 * buf.h - the growable byte buffer (floor 0), the one every module that
 * builds bytes uses (canonical JSON, chat renderings, SSE events, metrics,
 * GGUF headers, request bodies), and the grow helper for arrays.
 *
 *   data: | len bytes written | NUL | spare ... |   cap bytes allocated
 *
 * Writes keep data NUL-terminated (binary content is fine: len counts the
 * bytes, the NUL is one past them). A failed allocation sets oom and drops
 * that write and every later one, so a caller checks once at the end.
 *
 * kp_grow is the one "make room for n elements" step for arrays: capacities
 * grow geometrically (at least doubling), every size is checked against
 * overflow, and a failure leaves the array as it was. kp_buf grows with it.
 */
#ifndef KP_BUF_H
#define KP_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* Appends n copies of the byte c; false when out of memory. */
bool kp_buf_fill(kp_buf *b, char c, size_t n);

/* Makes room for `extra` more bytes (and the NUL), so that the next writes
 * of that many bytes cannot fail; false when out of memory or when the size
 * overflows (then oom is set). */
bool kp_buf_reserve(kp_buf *b, size_t extra);

/* Drops the bytes from len on (len <= b->len) and clears oom: undoes the
 * writes made since b->len was len, a length read while oom was false. */
void kp_buf_truncate(kp_buf *b, size_t len);

/* Hands the content over: *out receives data (NUL-terminated, owned by the
 * caller, an allocated "" when nothing was written) and *len its length;
 * the buffer is empty again. When a write was dropped (oom), or "" cannot
 * be allocated, the memory is freed, *out is NULL and it returns false. */
bool kp_buf_take(kp_buf *b, char **out, size_t *len);

/* Forgets the content, keeps the memory (oom is cleared). */
void kp_buf_clear(kp_buf *b);

/* Frees the memory; the buffer is empty again. */
void kp_buf_free(kp_buf *b);

/* Makes the array *p (room for *cap elements of elem_size bytes; NULL when
 * *cap is 0) hold at least `need` elements. need <= *cap: nothing happens.
 * Otherwise *p is reallocated to max(need, 2 * *cap, 64 bytes' worth)
 * elements and *cap set to that; the elements already there keep their
 * values, the new ones are uninitialized. Returns false, leaving *p and
 * *cap unchanged, when the allocation fails or need * elem_size overflows.
 * kp_grow_u32 is the same for a uint32_t capacity (which it never lets
 * pass UINT32_MAX). */
bool kp_grow(void **p, size_t *cap, size_t need, size_t elem_size);
bool kp_grow_u32(void **p, uint32_t *cap, uint32_t need, size_t elem_size);

#endif
