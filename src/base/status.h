/*
 * status.h - the error convention every kvpin library module follows.
 *
 * Library code never exits or aborts on bad input or exhausted resources.
 * A fallible function returns a kp_status and, when the caller passes a
 * kp_error, fills it with a one-line human-readable message that names the
 * thing that failed (a file, a key, a tensor, a token id...). Only main()
 * turns errors into exit codes; the server turns them into HTTP errors.
 *
 *   kp_error err = {0};
 *   if (kp_gguf_open(&g, path, &err) != KP_OK) { fprintf(stderr, "%s\n", err.msg); ... }
 *
 * A NULL kp_error pointer is allowed everywhere: the code is still returned.
 */
#ifndef KP_STATUS_H
#define KP_STATUS_H

#include <stddef.h>

typedef enum {
    KP_OK = 0,
    KP_ENOMEM,       /* allocation failed */
    KP_EIO,          /* open/read/mmap failed */
    KP_EFORMAT,      /* malformed input file or data */
    KP_EUNSUPPORTED, /* well-formed, but a feature kvpin does not implement */
    KP_EINVAL,       /* bad argument from the caller (bad token id, bad option) */
    KP_ENOTFOUND,    /* a looked-up key / tensor does not exist */
    KP_ERANGE,       /* a value is out of its allowed range (too long, overflow) */
    KP_EFULL         /* a bounded resource (KV pool, queue) is full */
} kp_status;

#define KP_ERROR_MSG_MAX 512

typedef struct {
    kp_status code;
    char msg[KP_ERROR_MSG_MAX];
} kp_error;

/* Sets err (when non-NULL) to code and a printf-style message; returns code,
 * so library code can write `return kp_fail(err, KP_EFORMAT, "...", ...);`. */
kp_status kp_fail(kp_error *err, kp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A short constant name for a status ("out of memory", "bad format", ...). */
const char *kp_status_str(kp_status code);

#endif
