/*
 * breakpoints.h - the pins of cache_control breakpoints, by prefix (floor 7).
 *
 * A Messages request with cache_control pins the prompt prefix that ends
 * at each breakpoint for the breakpoint's TTL; a later request whose
 * breakpoint ends the same prefix hits it, and its pin is made again with
 * a fresh TTL (the TTL is refreshed on every hit, as Anthropic documents).
 * This table remembers, per prefix (a 64-bit hash of its token ids), the
 * pin that holds it and when it expires, so that the server can tell a
 * hit from a creation and unpin the pin a refresh replaces.
 *
 *   kp_breakpoints
 *   +-------------------------------------------+
 *   | e[max]   hash, pin id, tokens, expires_at, |  least recently set goes
 *   |          last set                          |  when a new prefix needs room
 *   | mu                                         |
 *   +-------------------------------------------+
 *
 * Bounded: at most max prefixes; what a set replaces or pushes out is
 * returned for the caller to unpin. Every function is thread-safe (one
 * mutex, held only to look and copy).
 */
#ifndef KP_BREAKPOINTS_H
#define KP_BREAKPOINTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kp_breakpoints kp_breakpoints;

/* A table of at most max (>= 1) prefixes. KP_ENOMEM. kp_breakpoints_free(NULL)
 * is a no-op (the pins themselves are the engine's: unpin them first). */
kp_status kp_breakpoints_new(kp_breakpoints **out, uint32_t max, kp_error *err);
void kp_breakpoints_free(kp_breakpoints *b);

/* The hash that names the prefix ids[0..n). */
uint64_t kp_breakpoints_hash(const int32_t *ids, size_t n);

/* Whether prefix h has a pin whose expiry is after now (seconds). */
bool kp_breakpoints_live(kp_breakpoints *b, uint64_t h, int64_t now);

/* Records pin (holding `tokens` tokens, expiring at expires) for prefix
 * h at time now. Returns the pin it replaces (h's previous one) and, in
 * *evicted, the pin of the entry pushed out to make room (the least
 * recently set one); 0 for none. The caller unpins both. */
uint64_t kp_breakpoints_set(kp_breakpoints *b, uint64_t h, uint64_t pin, uint32_t tokens, int64_t expires, int64_t now,
                      uint64_t *evicted);

/* How many prefixes hold a pin that has not expired at now, and their
 * tokens (may be NULL). */
uint32_t kp_breakpoints_count(kp_breakpoints *b, int64_t now, uint64_t *tokens);

#endif
