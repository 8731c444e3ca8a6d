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
 *   kp_tiers_publish_range(t, tokens, j0, j1, seq)   blocks j0..j1-1 only:
 *                                               under a window budget, as a
 *                                               running sequence is about to
 *                                               drop their window rows
 *
 * A block's key is blockkey.h's chain over tokens[0 .. (j+1) B); the tiers
 * hold no token and no K/V between calls, only their own tables and queues.
 *
 * A model with recurrent layers (engine.c's state checkpoints) resumes
 * only where a snapshot of its state is, so the tiers also store
 * snapshots (staterec.h: the state and the rows of the partial block
 * before it, keyed by kp_bkey_state of the prefix it summarizes):
 *
 *   kp_tiers_publish_state(t, tokens, pos, seq, state)   at the end of a
 *                                    sequence, each snapshot it took
 *   kp_tiers_find_state(t, tokens, lo, hi, &pos)   the latest snapshot in
 *                                    (lo, hi] on some tier
 *   kp_tiers_fetch_state(t, tokens, pos, ...)   read, verify, copy the
 *                                    state and its tail rows
 *
 * and the engine restores the whole blocks before pos (kp_tiers_fetch_run).
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
    uint64_t state_restores;          /* prefills that resumed at a snapshot from a tier */
    uint64_t state_failed;            /* snapshots found on a tier and refused when read */
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
 * tier holds yet and that holds its window rows (kvpool.h: a record is a
 * whole block; under a window budget the engine queues a block before it
 * drops them). The record is encoded now: the rows may change after. */
void kp_tiers_publish(kp_tiers *t, const int32_t *tokens, uint32_t n, const kp_kvseq *seq);
/* The same for blocks j0..j1-1 only (tokens holds j1 * B tokens). */
void kp_tiers_publish_range(kp_tiers *t, const int32_t *tokens, uint32_t j0, uint32_t j1, const kp_kvseq *seq);

/* ---- recurrent-state snapshots (the top of this file) ---- */

/* One state's bytes (0: the model has no recurrent layers). */
uint64_t kp_tiers_state_bytes(const kp_tiers *t);

/* Whether publishing the snapshot at pos of tokens could add it anywhere
 * (the disk lacks it, or Redis was not seen holding it): the engine reads
 * the snapshot out of its pool blocks only then. */
bool kp_tiers_state_wanted(kp_tiers *t, const int32_t *tokens, uint32_t pos);

/* Queues the snapshot of the state after tokens[0..pos) (state: one
 * state's bytes; seq: the rows of tokens[0..pos), whose block pos / B
 * gives the tail rows when pos % B != 0) on every tier that lacks it. */
void kp_tiers_publish_state(kp_tiers *t, const int32_t *tokens, uint32_t pos, const kp_kvseq *seq,
                            const float *state);

/* The latest position in (lo, hi] at which some tier holds a snapshot of
 * tokens (which must hold hi tokens) into *pos; false when none. Records
 * are not read (kp_tiers_fetch_state verifies). */
bool kp_tiers_find_state(kp_tiers *t, const int32_t *tokens, uint32_t lo, uint32_t hi, uint32_t *pos);

/* Reads and verifies the snapshot at pos of tokens (from disk, a disk
 * refusal or absence retried in Redis): on KP_BLOCKREC_OK the state is in
 * state (kp_tiers_state_bytes) and the tail rows (positions (pos/B)B ..
 * pos - 1) in pool block tail_block; nothing is written otherwise. *from:
 * the tier that answered (or refused). */
kp_blockrec_reason kp_tiers_fetch_state(kp_tiers *t, const int32_t *tokens, uint32_t pos, kp_kvpool *p,
                                        int32_t tail_block, float *state, kp_tier_id *from);

/* Counts a snapshot restore (restored true) or a refused one. */
void kp_tiers_note_state(kp_tiers *t, bool restored);

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
