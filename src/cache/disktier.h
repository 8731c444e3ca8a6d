/*
 * disktier.h - the disk tier of the KV cache (floor 5): verified block
 * records (blockrec.h) in a directory, written by a background thread,
 * found again after a restart.
 *
 * Layout of the cache directory:
 *
 *   DIR/<fingerprint hex>/FINGERPRINT         the fingerprint's canonical text
 *   DIR/<fingerprint hex>/<key hex>.kvb       one record per block
 *   DIR/<fingerprint hex>/<key hex>.kvs       one record per recurrent-state
 *                                             snapshot (staterec.h)
 *   DIR/<fingerprint hex>/.tmp-<key hex>      a record being written
 *   DIR/weights-*.fp                          weights hashes of read-only models
 *
 * Opening scans DIR/<ours>/ (names and sizes only, no K/V read): every
 * record's key is known from then on, ordered for LRU by its mtime (a
 * load touches it). Folders of other fingerprints are counted and named
 * in kp_disk_note (which line of the fingerprint differs), never read for
 * blocks and never deleted.
 *
 * Writes: kp_disk_put encodes the record on the caller's thread (the K/V
 * bytes are copied out of the pool then) and queues it; the writer thread
 * writes .tmp-KEY, fsyncs, renames it to KEY.kvb, so a crash leaves whole
 * records or none. The queue is bounded (a full queue drops the write,
 * counted); a record larger than the budget is refused (counted); past the
 * budget the least recently used records are deleted, snapshots and
 * blocks alike (one LRU order, one budget).
 *
 * Reads: kp_disk_get reads KEY.kvb, verifies it (blockrec.h) and copies
 * its rows into a pool block; every refusal is counted under its reason
 * and the key forgotten (a later put writes it anew).
 *
 * Thread safety: one engine thread calls put/get/has (in-place gets also
 * from the engine's worker threads while it waits); the writer thread is
 * internal; kp_disk_get_stats may be called from any thread. A mutex
 * guards the table and the counters.
 */
#ifndef KP_DISKTIER_H
#define KP_DISKTIER_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/blockkey.h"
#include "cache/blockrec.h"
#include "cache/fingerprint.h"
#include "kv/kvpool.h"
#include "base/status.h"

typedef struct kp_disktier kp_disktier;

typedef struct {
    const char *dir;       /* created when missing */
    uint64_t budget_bytes; /* 0: no limit */
    uint32_t queue_max;    /* queued writes; 0: 256 */
    const uint8_t *mac_key; /* copied; NULL: records unsealed (blockrec.h) */
} kp_disk_config;

/* Counters of one tier (the Redis tier fills the same shape). */
typedef struct {
    uint64_t blocks, bytes;       /* block records held now; the bytes of every record held
                                     (blocks and snapshots: what the budget bounds) */
    uint64_t states, state_bytes; /* recurrent-state snapshot records held now, and their
                                     part of bytes */
    uint64_t budget_bytes;
    uint64_t lookups, hits;       /* kp_disk_get calls, and those that loaded a block */
    uint64_t fail[KP_BLOCKREC_N_REASONS]; /* refusals by reason (fail[KP_BLOCKREC_MISSING]: no such record) */
    uint64_t writes, bytes_written, bytes_read;
    uint64_t dropped_queue;       /* writes dropped: the queue was full */
    uint64_t dropped_budget;      /* writes refused: one record is larger than the budget */
    uint64_t write_errors;        /* I/O errors of the writer */
    uint64_t evicted;             /* records deleted for the budget */
    uint64_t other_blocks;        /* records of other fingerprints found at open */
    uint64_t epochs_lost;         /* Redis: times it was found to have lost its data (a restart
                                     without persistence, FLUSHALL); what it lost is published again */
} kp_tier_stats;

/* Opens (creating) the tier for fingerprint fp over records of pool p's
 * layout (borrowed; it must outlive the tier), scans it and starts the
 * writer. KP_EIO when the directory cannot be made or read, KP_ENOMEM. */
kp_status kp_disk_open(kp_disktier **out, const kp_disk_config *cfg, const kp_fingerprint *fp, const kp_kvpool *p,
                       kp_error *err);

/* Writes what is queued, stops the writer, frees. NULL is a no-op. */
void kp_disk_close(kp_disktier *t);

/* True when a record of key is on disk (or queued). */
bool kp_disk_has(kp_disktier *t, const kp_bkey *key);

/* True when a record of key is on disk (written, not only queued): what a
 * kp_disk_get may load. */
bool kp_disk_ready(kp_disktier *t, const kp_bkey *key);

/* Queues the record of pool block `block` holding tokens[0..block_size)
 * under key (parent: the previous block's key, or the zero key). Returns
 * false when it was not queued (already known, queue full, over budget). */
bool kp_disk_put(kp_disktier *t, const kp_bkey *key, const kp_bkey *parent, const int32_t *tokens, int32_t block);

/* Queues the record of a recurrent-state snapshot at pos (staterec.h):
 * its key (kp_bkey_state), the chain key it ends (parent), the tail
 * tokens tail[0..pos % B) with their rows in pool block tail_block, and
 * state[0..state_bytes). The same refusals as kp_disk_put. */
bool kp_disk_put_state(kp_disktier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos, const int32_t *tail,
                       int32_t tail_block, const float *state, uint64_t state_bytes);

/* Loads the snapshot record of key when it is on disk, verified against
 * parent, pos, the tail tokens and state_bytes (kp_staterec_check): the
 * tail rows into pool block tail_block, the state into state. Read through
 * a buffer, so nothing is written on a refusal. The engine thread only. */
kp_blockrec_reason kp_disk_get_state(kp_disktier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos,
                                     const int32_t *tail, kp_kvpool *p, int32_t tail_block, float *state,
                                     uint64_t state_bytes);

/* Loads the record of key into pool block `block` when it is on disk and
 * verifies against tokens[0..block_size): KP_BLOCKREC_OK, or why not.
 * in_place reads the K/V rows straight into the block and verifies them
 * there (no copy of the record; blockrec.h): the block's rows are garbage
 * after a refusal, so only for a block that holds no rows of its own. An
 * in-place get may run on several threads at once (each on its own block);
 * the buffered one only on the engine thread. */
kp_blockrec_reason kp_disk_get(kp_disktier *t, const kp_bkey *key, const int32_t *tokens, kp_kvpool *p, int32_t block,
                           bool in_place);

/* Waits until the write queue is empty (tests, shutdown). */
void kp_disk_flush(kp_disktier *t);

void kp_disk_get_stats(kp_disktier *t, kp_tier_stats *out);

/* What the open found besides our records: "" or e.g. "ignored 12 blocks of
 * fingerprint 3f.. (kv_type F32 (here F16))". Borrowed from t. */
const char *kp_disk_note(const kp_disktier *t);

#endif
