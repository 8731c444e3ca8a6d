/*
 * entropy.c - unpredictable bytes from the kernel (entropy.h).
 *
 * getrandom(2) without flags: it blocks only until the kernel's pool is
 * first initialized (early boot), then never; a read may return fewer
 * bytes than asked (large requests, signals), so it loops.
 */
#include "base/entropy.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

kp_status kp_entropy(void *buf, size_t n, kp_error *err) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return kp_fail(err, KP_EIO, "getrandom: %s", strerror(errno));
        }
        p += got;
        n -= (size_t)got;
    }
    return KP_OK;
}

kp_status kp_entropy_hex(char *out, size_t cap, size_t n_bytes, kp_error *err) {
    unsigned char b[32];
    if (n_bytes > sizeof b || cap < 2 * n_bytes + 1)
        return kp_fail(err, KP_EINVAL, "kp_entropy_hex: %zu bytes into %zu", n_bytes, cap);
    kp_status st = kp_entropy(b, n_bytes, err);
    if (st != KP_OK) return st;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n_bytes; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * n_bytes] = 0;
    return KP_OK;
}
