/*
 * entropy.h - unpredictable bytes from the kernel (floor 0), for the ids
 * kvpin hands to clients: response, message, tool-call and item ids and
 * request ids. One client must not guess another's, so they come from
 * getrandom(2) (the kernel's CSPRNG), never from a clock or a counter.
 * rng.h's generators stay for what must be reproducible (sampling,
 * random models).
 */
#ifndef KP_ENTROPY_H
#define KP_ENTROPY_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Fills buf[0..n) with bytes from getrandom(2) (retried on EINTR and short
 * reads). KP_EIO with the reason when the kernel gives none. */
kp_status kp_entropy(void *buf, size_t n, kp_error *err);

/* Writes 2 * n_bytes lowercase hex digits of fresh entropy and a NUL to
 * out (cap >= 2 * n_bytes + 1; n_bytes <= 32). KP_EINVAL, or as kp_entropy. */
kp_status kp_entropy_hex(char *out, size_t cap, size_t n_bytes, kp_error *err);

#endif
