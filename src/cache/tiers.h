/*
 * tiers.h - the cache tiers below RAM (floor 5): the disk tier
 * (disktier.h) and, for a fleet, Redis (redistier.h), under one model
 * fingerprint, as the engine sees them.
 *
 * The engine asks, after its RAM match ends at block j0 (the block that
 * holds position n_reuse):
 *
 *   nb = kp_tiers_probe(t, tokens, j0, j_end)  blocks j0.. present on a tier
 *   reserve blocks for them, then
 *   kp_tiers_fetch_run(t, tokens, j0, j1, ...)  read, verify, copy the rows
 *                                               (disk in parallel); the
 *                                               first refusal stops
 *   kp_tiers_publish(t, tokens, n, seq)         at the end of a sequence:
 *                                               every full block not yet
 *                                               stored is queued for writing
 *
 * A block's key is blockkey.h's chain over tokens[0 .. (j+1) B); the tiers
 * hold no token and no K/V between calls, only their own tables and queues.
 * One engine thread calls these; kp_tiers_get_stats may be called from any
 * thread.
 */
#ifndef KP_TIERS_H
#define KP_TIERS_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/blockrec.h"
#include "cache/disktier.h"
#include "cache/fingerprint.h"
#include "cache/redistier.h"
#include "kv/kvpool.h"
#include "model/model.h"
#include "base/status.h"

typedef struct kp_tiers kp_tiers;

typedef struct {
    const char *dir;              /* the disk tier's directory; NULL: no disk tier */
    uint64_t disk_budget_bytes;   /* 0: no limit */
    const char *redis;            /* "HOST:PORT"; NULL: no Redis tier */
    uint32_t redis_timeout_ms;    /* 0: 50 */
    void (*log)(void *ctx, const char *msg); /* the Redis tier's incidents; NULL: silent */
    void *log_ctx;
    const uint8_t *mac_key;       /* KP_BLOCKREC_KEY_BYTES: seal every record and accept only
                                   * records sealed with it (blockrec.h); NULL: no MAC */
    uint32_t queue_blocks;        /* each tier's write queue, in blocks; 0: 256. The engine
                                   * (kp_eng_open_tiers) raises it to a whole context's
                                   * blocks, so one finished sequence is never cut short */
} kp_tiers_config;

typedef enum { KP_TIER_RAM = 0, KP_TIER_DISK = 1, KP_TIER_REDIS = 2, KP_TIER_N = 3 } kp_tier_id;

/* "ram", "disk", "redis". */
const char *kp_tier_name(kp_tier_id t);

/* Restore latency histogram bounds in seconds (KP_TIERS_N_BUCKETS finite
 * ones; the last count is +Inf). */
#define KP_TIERS_N_BUCKETS 10
extern const double kp_tiers_bucket_le[KP_TIERS_N_BUCKETS];

typedef struct {
    bool on[KP_TIER_N];               /* which tiers exist (on[RAM] always) */
    kp_tier_stats tier[KP_TIER_N];    /* tier[DISK], tier[REDIS]; tier[RAM] unused */
    uint64_t restores;                /* prefills that restored at least one block */
    uint64_t restore_failed;          /* prefills whose restore stopped on a refusal */
    uint64_t restored_tokens[KP_TIER_N];
    uint64_t latency_count[KP_TIERS_N_BUCKETS + 1]; /* not cumulative */
    double latency_sum;
    char fingerprint[33];
} kp_tiers_stats;

/* Makes the tiers for model m with rows of pool p (borrowed; both must
 * outlive the tiers): computes the fingerprint (fingerprint.h; the weights
 * hash cached beside the model or in cfg->dir; attn_bf16: the engine's
 * prefill attention rounds to bfloat16) and opens each configured tier. KP_EIO / KP_ENOMEM / KP_EINVAL from a tier. */
kp_status kp_tiers_new(kp_tiers **out, const kp_tiers_config *cfg, const kp_model *m, const kp_kvpool *p,
                       bool attn_bf16, kp_error *err);
void kp_tiers_free(kp_tiers *t); /* writes what is queued; NULL is a no-op */

/* How many consecutive blocks from j0 (below j_end) some tier holds for
 * tokens (which must hold at least j_end * B tokens). */
uint32_t kp_tiers_probe(kp_tiers *t, const int32_t *tokens, uint32_t j0, uint32_t j_end);

/* Waits up to ms milliseconds for the Redis tier's first connection (true
 * at once without a Redis tier; kp_redis_wait_connected). */
bool kp_tiers_wait_ready(kp_tiers *t, uint32_t ms);

/* How the last kp_tiers_probe's blocks split between the tiers: blocks[DISK]
 * from j0 on disk, then blocks[REDIS] in Redis (blocks[RAM] is 0). */
void kp_tiers_last_probe(const kp_tiers *t, uint32_t j0, uint32_t blocks[KP_TIER_N]);

/* Loads blocks j0..j1-1 of tokens into pool blocks blocks[j0..j1) (indexed
 * by block number), in chain order, stopping at the first refusal; blocks
 * from in_place_from on hold no rows of their own and are read in place,
 * the disk's run of them on every thread of `threads` (NULL: the caller's
 * alone). from[j - j0] receives each loaded block's tier, and the refused
 * one's; *why the refusal (KP_BLOCKREC_OK when all were loaded). Returns the
 * number of blocks loaded. The disk may have read blocks past a refused
 * one (counted as its hits); they are not handed on. */
struct kp_threads;
uint32_t kp_tiers_fetch_run(kp_tiers *t, const int32_t *tokens, uint32_t j0, uint32_t j1, kp_kvpool *p,
                            const int32_t *blocks, uint32_t in_place_from, struct kp_threads *threads,
                            kp_tier_id *from, kp_blockrec_reason *why);

/* Queues every full block of tokens[0..n) (rows in seq's blocks) that no
 * tier holds yet. */
void kp_tiers_publish(kp_tiers *t, const int32_t *tokens, uint32_t n, const kp_kvseq *seq);

/* Records one restore: seconds it took, tokens it got per tier, whether a
 * refusal stopped it. */
void kp_tiers_note_restore(kp_tiers *t, double seconds, const uint32_t tokens[KP_TIER_N], bool failed);

/* Waits until every queued write is done (tests). */
void kp_tiers_flush(kp_tiers *t);

void kp_tiers_get_stats(kp_tiers *t, kp_tiers_stats *out);

/* What opening found (another fingerprint's blocks, and why), "" if
 * nothing. Borrowed. */
const char *kp_tiers_note(const kp_tiers *t);

/* The fingerprint the tiers store under. */
const kp_fingerprint *kp_tiers_fingerprint(const kp_tiers *t);

#endif
