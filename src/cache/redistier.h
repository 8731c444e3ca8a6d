/*
 * redistier.h - the Redis tier of the KV cache (floor 5): verified block
 * records (blockrec.h) shared by every kvpin with the same model
 * fingerprint through one Redis.
 *
 *   value of  kvpin:<fingerprint hex>:<key hex>  = the block's record
 *   value of  kvpin:<fingerprint hex>:<state key hex>  = a recurrent-state
 *             snapshot's record (staterec.h; kp_bkey_state's key)
 *
 * Lookups run on the engine's thread over a connection of their own with
 * a timeout (default 50 ms): kp_redis_probe asks EXISTS for the next block
 * keys in one pipelined round trip and counts the present chain;
 * kp_redis_get fetches (GET, pipelined in windows of KP_REDIS_WINDOW
 * blocks, the next window asked for before this one's replies are read)
 * and verifies. Publishing is asynchronous: kp_redis_put encodes
 * the record and queues it; a background thread SETs it over a second
 * connection. Keys are never scanned; Redis's own maxmemory policy is the
 * fleet's eviction.
 *
 * When Redis is down, slow or answers garbage, the lookup connection is
 * dropped, the failure counted (timeout / io / format / truncated), the
 * log callback told once per incident, and every call answers "not here"
 * at once until the background thread has connected again (it tries once
 * a second). A request never waits on Redis longer than one timeout per
 * round trip.
 */
#ifndef KP_REDISTIER_H
#define KP_REDISTIER_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/blockkey.h"
#include "cache/blockrec.h"
#include "cache/disktier.h"
#include "cache/fingerprint.h"
#include "kv/kvpool.h"
#include "base/status.h"

#define KP_REDIS_WINDOW 16

typedef struct kp_redistier kp_redistier;

typedef struct {
    const char *addr;        /* "HOST:PORT" */
    uint32_t timeout_ms;     /* 0: 50 */
    uint32_t queue_max;      /* queued publishes; 0: 256 */
    void (*log)(void *ctx, const char *msg); /* incidents and recoveries; NULL: silent */
    void *log_ctx;
    const uint8_t *mac_key; /* copied; NULL: records unsealed (blockrec.h) */
} kp_redis_config;

/* Starts the tier (the first connection is made in the background, so a
 * Redis that is down at start is not an error). KP_EINVAL for an address
 * that is not HOST:PORT, KP_ENOMEM. fp and p are borrowed. */
kp_status kp_redis_open(kp_redistier **out, const kp_redis_config *cfg, const kp_fingerprint *fp, const kp_kvpool *p,
                        kp_error *err);
void kp_redis_close(kp_redistier *t); /* NULL is a no-op; queued publishes are dropped */

/* Waits up to ms milliseconds for the background thread's first lookup
 * connection (a tool that asks once, such as kvpin doctor, would otherwise
 * find none yet). True when one is there. Not for the engine thread of a
 * server, which never waits on Redis. */
bool kp_redis_wait_connected(kp_redistier *t, uint32_t ms);

/* How many of keys[0..n) are present, counted from the first (one
 * pipelined round trip of EXISTS per KP_REDIS_PROBE_MAX keys, the next only
 * while every key of the last was present; 0 when Redis is not reachable). */
#define KP_REDIS_PROBE_MAX 1024u
uint32_t kp_redis_probe(kp_redistier *t, const kp_bkey *keys, uint32_t n);

/* Fetches and verifies the record of keys[0] (keys[1..n_ahead) are fetched
 * in the same round trip for the calls that follow) into pool block
 * `block`: KP_BLOCKREC_OK or why not. */
kp_blockrec_reason kp_redis_get(kp_redistier *t, const kp_bkey *keys, uint32_t n_ahead, const int32_t *tokens,
                            kp_kvpool *p, int32_t block);

/* Queues the record of pool block `block` (tokens[0..block_size), its key
 * and parent) for publishing unless this process published or saw it
 * already. False when not queued. */
bool kp_redis_put(kp_redistier *t, const kp_bkey *key, const kp_bkey *parent, const int32_t *tokens, int32_t block);

/* Queues a recurrent-state snapshot's record (staterec.h; the arguments
 * of disktier.h's kp_disk_put_state) as kp_redis_put does a block's. */
bool kp_redis_put_state(kp_redistier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos, const int32_t *tail,
                        int32_t tail_block, const float *state, uint64_t state_bytes);

/* Which of keys[0..n) are present: present[i] (all false when Redis is
 * not reachable), in one pipelined round trip of EXISTS per
 * KP_REDIS_PROBE_MAX keys (the present ones count as seen). Returns how
 * many are. */
uint32_t kp_redis_exists(kp_redistier *t, const kp_bkey *keys, uint32_t n, bool *present);

/* True when this process published key or saw it present (kp_redis_put
 * would skip it). */
bool kp_redis_known(kp_redistier *t, const kp_bkey *key);

/* Fetches (one GET) and verifies the snapshot record of key
 * (kp_staterec_check against parent, pos, the tail tokens, state_bytes);
 * on KP_BLOCKREC_OK its tail rows are in pool block tail_block and its
 * state in state. */
kp_blockrec_reason kp_redis_get_state(kp_redistier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos,
                                      const int32_t *tail, kp_kvpool *p, int32_t tail_block, float *state,
                                      uint64_t state_bytes);

/* Waits until the publish queue is empty or Redis is down (tests). */
void kp_redis_flush(kp_redistier *t);

void kp_redis_get_stats(kp_redistier *t, kp_tier_stats *out);

#endif
