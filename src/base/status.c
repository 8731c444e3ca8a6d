/*
 * status.c - kp_fail and kp_status_str (see status.h for the convention).
 * Owns no state.
 */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>

kp_status kp_fail(kp_error *err, kp_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *kp_status_str(kp_status code) {
    switch (code) {
    case KP_OK: return "ok";
    case KP_ENOMEM: return "out of memory";
    case KP_EIO: return "i/o error";
    case KP_EFORMAT: return "bad format";
    case KP_EUNSUPPORTED: return "unsupported";
    case KP_EINVAL: return "invalid argument";
    case KP_ENOTFOUND: return "not found";
    case KP_ERANGE: return "out of range";
    case KP_EFULL: return "full";
    }
    return "unknown status";
}
