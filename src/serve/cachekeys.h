/*
 * cachekeys.h - requests grouped by prompt_cache_key, and the pins of
 * prompt_cache_retention "24h" (floor 7).
 *
 * OpenAI's prompt_cache_key names the family of requests that share a
 * prefix (one agent, one conversation). The server counts, per key, the
 * requests, their prompt tokens and the tokens the prefix cache gave them,
 * so GET /v1/cache can show the hit ratio of each key; and it remembers
 * the pin each "24h" request made, so that a key keeps one retention pin
 * (its latest prompt) rather than one per turn.
 *
 *   kp_cachekeys
 *   +--------------------------------------+
 *   | keys[max_keys]  key text (<= 256 B),  |  least recently used goes
 *   |                 requests, prompt,     |  when a new key needs room
 *   |                 cached, last use,     |
 *   |                 retention pin + expiry|
 *   | pins[max_pins]  keyless retention     |  oldest goes first
 *   |                 pins, oldest first    |
 *   | mu                                    |
 *   +--------------------------------------+
 *
 * Bounded: at most max_keys keys and max_pins keyless pins; what falls out
 * of a table is returned to the caller to unpin (kp_cachekeys_retain). Every
 * function is thread-safe (one mutex, held only to copy).
 */
#ifndef KP_CACHEKEYS_H
#define KP_CACHEKEYS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#define KP_CACHEKEYS_KEY_MAX 256

typedef struct kp_cachekeys kp_cachekeys;

/* A table of at most max_keys keys (>= 1) and max_pins keyless retention
 * pins (>= 1). KP_ENOMEM. kp_cachekeys_free(NULL) is a no-op. */
kp_status kp_cachekeys_new(kp_cachekeys **out, uint32_t max_keys, uint32_t max_pins, kp_error *err);
void kp_cachekeys_free(kp_cachekeys *k);

/* Counts one request of key (at most KP_CACHEKEYS_KEY_MAX bytes; longer keys
 * are cut) with prompt tokens of which cached came from the cache, at
 * time now (seconds). */
void kp_cachekeys_note(kp_cachekeys *k, const char *key, uint32_t prompt, uint32_t cached, int64_t now);

/* Records retention pin `pin` (expiring at `expires`) of a request of key
 * (NULL: a request without one). Returns the pin that it replaces and the
 * caller should unpin: the key's previous retention pin, or, without a
 * key and with max_pins keyless pins already held, the oldest of them; 0
 * when none. */
uint64_t kp_cachekeys_retain(kp_cachekeys *k, const char *key, uint64_t pin, int64_t expires, int64_t now);

/* The keys, most recently used first: a new JSON array (the caller owns
 * it) of {"key", "requests", "prompt_tokens", "cached_tokens",
 * "hit_ratio" (cached / prompt, 0 when no prompt tokens), "last_used"
 * (seconds), "retention_pin" ("pin-N" or null), "retention_expires_at"
 * (seconds or null)}; NULL when out of memory. */
json_t *kp_cachekeys_json(kp_cachekeys *k, const uint8_t *pin_key); /* pin ids: pinid.h */

#endif
