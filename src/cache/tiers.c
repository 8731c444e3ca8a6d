/*
 * tiers.c - the tiers below RAM as the engine sees them (tiers.h).
 *
 * Owns: the disk tier (or none), the Redis tier (or none), the fingerprint,
 * a scratch array of block keys and the restore counters (under mu).
 *
 *   keys[0..n_keys)   the chain of the last probe's tokens (keys_of:
 *                     the tokens pointer it was made from); fetch of block j
 *                     uses keys[j], so a restore hashes its prompt once
 *
 * Lookup order: disk, then Redis from the first block the disk lacks (one
 * pipelined EXISTS round trip). A block found on neither ends the probe. A
 * block the disk refuses when read (checksum, truncated, ...) is looked up
 * in Redis, with what follows it, before the restore gives up.
 * Publishing: every full block goes to the disk tier when it lacks it, and
 * to Redis unless this process published or saw it there.
 *
 * Recurrent-state snapshots (a hybrid model; staterec.h) go the same ways
 * under their own keys (kp_bkey_state of the prefix they summarize). A
 * restore looks for the latest one in a range of positions: every
 * position's key is computed (a hash of at most B tokens over the chain
 * the probe made) and looked up in the disk's table, then the positions
 * above the disk's best are asked of Redis in one pipelined EXISTS round
 * trip:
 *
 *   positions    lo ........................................ hi
 *   disk table        @64                @192                      best on disk: 192
 *   Redis EXISTS                              (192, hi]  @230      -> 230, from Redis
 */
#include "cache/tiers.h"

#include <sodium.h>

#include "base/buf.h"
#include "base/threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const double kp_tiers_bucket_le[KP_TIERS_N_BUCKETS] = {0.001, 0.002, 0.005, 0.01, 0.02,
                                                       0.05,  0.1,   0.2,   0.5,  1.0};

struct kp_tiers {
    kp_fingerprint fp;
    const kp_kvpool *pool;
    kp_disktier *disk;
    kp_redistier *redis;
    uint32_t disk_end, probe_end; /* the last probe: blocks [j0, disk_end) on disk, then Redis to probe_end */
    uint32_t probe_j_end;         /* the last probe's j_end */
    kp_bkey *keys;
    uint32_t n_keys, cap_keys;
    const int32_t *keys_of;
    uint64_t state_bytes; /* one recurrent state's bytes (0: the model has none) */
    pthread_mutex_t mu;
    kp_tiers_stats st; /* restore counters; the tiers' own counters are read from them */
};

const char *kp_tier_name(kp_tier_id t) {
    return t == KP_TIER_DISK ? "disk" : t == KP_TIER_REDIS ? "redis" : "ram";
}

kp_status kp_tiers_new(kp_tiers **out, const kp_tiers_config *cfg, const kp_model *m, const kp_kvpool *p,
                       bool attn_bf16, kp_error *err) {
    *out = NULL;
    kp_tiers *t = calloc(1, sizeof *t);
    if (!t) return kp_fail(err, KP_ENOMEM, "out of memory for the cache tiers");
    pthread_mutex_init(&t->mu, NULL);
    t->pool = p;
    t->state_bytes = kp_model_rec_state_floats(&m->hp) * sizeof(float);
    const kp_kvpool_config *kc = kp_kvpool_config_of(p);
    kp_bkey w;
    kp_status st = cfg->mac_key && sodium_init() < 0
                       ? kp_fail(err, KP_EIO, "libsodium cannot start, so cache records cannot be sealed")
                       : kp_fingerprint_weights(m, cfg->dir, &w, NULL, err);
    if (st != KP_OK) goto fail;
    kp_fingerprint_make(&t->fp, m, &w, kc->kv_type, kc->kv_type_v, kc->block_size, attn_bf16);
    kp_bkey_hex(&t->fp.id, t->st.fingerprint);
    t->st.on[KP_TIER_RAM] = true;
    if (cfg->dir) {
        kp_disk_config dc = {cfg->dir, cfg->disk_budget_bytes, cfg->queue_blocks, cfg->mac_key};
        if ((st = kp_disk_open(&t->disk, &dc, &t->fp, p, err)) != KP_OK) goto fail;
        t->st.on[KP_TIER_DISK] = true;
    }
    if (cfg->redis) {
        kp_redis_config rc = {cfg->redis, cfg->redis_timeout_ms, cfg->queue_blocks, cfg->log, cfg->log_ctx,
                              cfg->mac_key};
        if ((st = kp_redis_open(&t->redis, &rc, &t->fp, p, err)) != KP_OK) goto fail;
        t->st.on[KP_TIER_REDIS] = true;
    }
    *out = t;
    return KP_OK;
fail:
    kp_tiers_free(t);
    return st;
}

void kp_tiers_free(kp_tiers *t) {
    if (!t) return;
    kp_disk_close(t->disk);
    kp_redis_close(t->redis);
    pthread_mutex_destroy(&t->mu);
    free(t->keys);
    free(t);
}

/* keys[0..j_end) of tokens (reusing the last chain when it is the same
 * tokens). False when the scratch cannot grow. */
static bool chain(kp_tiers *t, const int32_t *tokens, uint32_t j_end) {
    uint32_t B = kp_kvpool_config_of(t->pool)->block_size;
    if (t->keys_of != tokens) t->n_keys = 0;
    if (!kp_grow_u32((void **)&t->keys, &t->cap_keys, j_end, sizeof *t->keys)) return false;
    for (uint32_t j = t->n_keys; j < j_end; j++)
        t->keys[j] = kp_bkey_next(j ? &t->keys[j - 1] : NULL, tokens + (size_t)j * B, B);
    if (j_end > t->n_keys) t->n_keys = j_end;
    t->keys_of = tokens;
    return true;
}

uint32_t kp_tiers_probe(kp_tiers *t, const int32_t *tokens, uint32_t j0, uint32_t j_end) {
    t->keys_of = NULL; /* a new prompt: the pointer may be reused for other tokens */
    if (j0 >= j_end || !chain(t, tokens, j_end)) return 0;
    uint32_t j = j0;
    while (j < j_end && t->disk && kp_disk_ready(t->disk, &t->keys[j])) j++;
    t->disk_end = t->probe_end = j;
    t->probe_j_end = j_end;
    if (j < j_end && t->redis) t->probe_end = j + kp_redis_probe(t->redis, t->keys + j, j_end - j);
    return t->probe_end - j0;
}

bool kp_tiers_wait_ready(kp_tiers *t, uint32_t ms) { return !t->redis || kp_redis_wait_connected(t->redis, ms); }

void kp_tiers_last_probe(const kp_tiers *t, uint32_t j0, uint32_t blocks[KP_TIER_N]) {
    blocks[KP_TIER_RAM] = 0;
    blocks[KP_TIER_DISK] = t->disk_end > j0 ? t->disk_end - j0 : 0;
    blocks[KP_TIER_REDIS] = t->probe_end - (t->disk_end > j0 ? t->disk_end : j0);
}

/* A block the disk refused at j (counted there): Redis is asked for j and
 * what follows, to the last probe's end. True when Redis holds j. */
static bool fall_to_redis(kp_tiers *t, uint32_t j) {
    if (!t->redis) return false;
    t->disk_end = j;
    t->probe_end = j + kp_redis_probe(t->redis, t->keys + j, t->probe_j_end - j);
    return j < t->probe_end;
}

/* Block j of tokens from the tier that holds it (a disk refusal retried in
 * Redis), verified, into pool block `block`; *from: that tier. */
static kp_blockrec_reason fetch_one(kp_tiers *t, const int32_t *tokens, uint32_t j, kp_kvpool *p, int32_t block,
                                bool in_place, kp_tier_id *from) {
    *from = KP_TIER_DISK;
    if (!chain(t, tokens, j + 1)) return KP_BLOCKREC_IO;
    uint32_t B = kp_kvpool_config_of(t->pool)->block_size;
    const int32_t *bt = tokens + (size_t)j * B;
    if (t->disk && j < t->disk_end) {
        kp_blockrec_reason r = kp_disk_get(t->disk, &t->keys[j], bt, p, block, in_place);
        if (r == KP_BLOCKREC_OK || !fall_to_redis(t, j)) return r;
    }
    *from = KP_TIER_REDIS;
    if (!t->redis || j >= t->probe_end) return KP_BLOCKREC_MISSING;
    return kp_redis_get(t->redis, t->keys + j, t->probe_end - j, bt, p, block);
}

/* The parallel part of kp_tiers_fetch_run: block j0 + task from disk, in
 * place, on any thread of the pool. */
typedef struct {
    kp_tiers *t;
    const int32_t *tokens;
    uint32_t j0;
    kp_kvpool *p;
    const int32_t *blocks;
    kp_blockrec_reason *why;
} disk_run;

static void disk_task(void *vc, int task, int thread) {
    (void)thread;
    disk_run *c = vc;
    uint32_t j = c->j0 + (uint32_t)task, B = kp_kvpool_config_of(c->t->pool)->block_size;
    c->why[task] = kp_disk_get(c->t->disk, &c->t->keys[j], c->tokens + (size_t)j * B, c->p, c->blocks[j], true);
}

uint32_t kp_tiers_fetch_run(kp_tiers *t, const int32_t *tokens, uint32_t j0, uint32_t j1, kp_kvpool *p,
                            const int32_t *blocks, uint32_t in_place_from, kp_threads *threads, kp_tier_id *from,
                            kp_blockrec_reason *why) {
    *why = KP_BLOCKREC_OK;
    if (j0 >= j1) return 0;
    if (!chain(t, tokens, j1)) {
        *why = KP_BLOCKREC_IO;
        from[0] = KP_TIER_DISK;
        return 0;
    }
    uint32_t j = j0;
    while (j < j1) {
        uint32_t end = !t->disk ? j : t->disk_end < j1 ? t->disk_end : j1; /* the disk's run: [j, end) */
        if (j >= in_place_from && end > j + 1 && threads) { /* the disk's run, on every thread */
            kp_blockrec_reason *r = malloc((size_t)(end - j) * sizeof *r);
            if (r) {
                disk_run c = {t, tokens, j, p, blocks, r};
                kp_threads_run(threads, disk_task, &c, (int)(end - j));
                uint32_t k = j;
                while (k < end && r[k - j] == KP_BLOCKREC_OK) from[k++ - j0] = KP_TIER_DISK;
                kp_blockrec_reason bad = k < end ? r[k - j] : KP_BLOCKREC_OK;
                free(r);
                j = k;
                if (k == end) continue;
                if (!fall_to_redis(t, k)) { /* refused on disk, and Redis lacks it */
                    from[k - j0] = KP_TIER_DISK;
                    *why = bad;
                    return k - j0;
                }
            }
        }
        kp_blockrec_reason r = fetch_one(t, tokens, j, p, blocks[j], j >= in_place_from, &from[j - j0]);
        if (r != KP_BLOCKREC_OK) {
            *why = r;
            return j - j0;
        }
        j++;
    }
    return j - j0;
}

void kp_tiers_publish(kp_tiers *t, const int32_t *tokens, uint32_t n, const kp_kvseq *seq) {
    kp_tiers_publish_range(t, tokens, 0, n / kp_kvpool_config_of(t->pool)->block_size, seq);
}

void kp_tiers_publish_range(kp_tiers *t, const int32_t *tokens, uint32_t j0, uint32_t j1, const kp_kvseq *seq) {
    uint32_t B = kp_kvpool_config_of(t->pool)->block_size, nb = j1;
    if (nb > seq->n_blocks) nb = seq->n_blocks;
    t->keys_of = NULL;
    if (j0 >= nb || !chain(t, tokens, nb)) return;
    static const kp_bkey zero = {{0}};
    for (uint32_t j = j0; j < nb; j++) {
        /* a record holds the whole block: one whose window rows were dropped cannot be written */
        if (!kp_kvpool_has_window(t->pool, seq->blocks[j])) continue;
        const kp_bkey *parent = j ? &t->keys[j - 1] : &zero;
        if (t->disk && !kp_disk_has(t->disk, &t->keys[j]))
            kp_disk_put(t->disk, &t->keys[j], parent, tokens + (size_t)j * B, seq->blocks[j]);
        if (t->redis) kp_redis_put(t->redis, &t->keys[j], parent, tokens + (size_t)j * B, seq->blocks[j]);
    }
    t->keys_of = NULL;
}

void kp_tiers_note_restore(kp_tiers *t, double seconds, const uint32_t tokens[KP_TIER_N], bool failed) {
    pthread_mutex_lock(&t->mu);
    uint32_t any = 0;
    for (int i = 1; i < KP_TIER_N; i++) {
        t->st.restored_tokens[i] += tokens[i];
        any += tokens[i];
    }
    if (any) t->st.restores++;
    if (failed) t->st.restore_failed++;
    int b = 0;
    while (b < KP_TIERS_N_BUCKETS && seconds > kp_tiers_bucket_le[b]) b++;
    t->st.latency_count[b]++;
    t->st.latency_sum += seconds;
    pthread_mutex_unlock(&t->mu);
}

void kp_tiers_flush(kp_tiers *t) {
    if (t->disk) kp_disk_flush(t->disk);
    if (t->redis) kp_redis_flush(t->redis);
}

void kp_tiers_get_stats(kp_tiers *t, kp_tiers_stats *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
    if (t->disk) kp_disk_get_stats(t->disk, &out->tier[KP_TIER_DISK]);
    if (t->redis) kp_redis_get_stats(t->redis, &out->tier[KP_TIER_REDIS]);
}

const char *kp_tiers_note(const kp_tiers *t) { return t->disk ? kp_disk_note(t->disk) : ""; }

const kp_fingerprint *kp_tiers_fingerprint(const kp_tiers *t) { return &t->fp; }

/* ---- recurrent-state snapshots ---------------------------------------- */

/* The key of the snapshot at pos of tokens and the chain key it ends
 * (zero below B); false when the key scratch cannot grow. */
static bool state_key(kp_tiers *t, const int32_t *tokens, uint32_t pos, kp_bkey *key, kp_bkey *parent) {
    static const kp_bkey zero = {{0}};
    uint32_t B = kp_kvpool_config_of(t->pool)->block_size, j = pos / B;
    if (!chain(t, tokens, j)) return false;
    *parent = j ? t->keys[j - 1] : zero;
    *key = kp_bkey_state(j ? parent : NULL, tokens + (size_t)j * B, pos % B, pos);
    return true;
}

uint64_t kp_tiers_state_bytes(const kp_tiers *t) { return t->state_bytes; }

bool kp_tiers_state_wanted(kp_tiers *t, const int32_t *tokens, uint32_t pos) {
    kp_bkey key, parent;
    t->keys_of = NULL;
    if (!t->state_bytes || !pos || !state_key(t, tokens, pos, &key, &parent)) return false;
    return (t->disk && !kp_disk_has(t->disk, &key)) || (t->redis && !kp_redis_known(t->redis, &key));
}

void kp_tiers_publish_state(kp_tiers *t, const int32_t *tokens, uint32_t pos, const kp_kvseq *seq,
                            const float *state) {
    uint32_t B = kp_kvpool_config_of(t->pool)->block_size;
    kp_bkey key, parent;
    t->keys_of = NULL;
    if (!t->state_bytes || !pos || (pos % B && pos / B >= seq->n_blocks) || !state_key(t, tokens, pos, &key, &parent))
        return;
    const int32_t *tail = tokens + (size_t)pos / B * B;
    int32_t tail_block = pos % B ? seq->blocks[pos / B] : -1;
    if (t->disk && !kp_disk_has(t->disk, &key))
        kp_disk_put_state(t->disk, &key, &parent, pos, tail, tail_block, state, t->state_bytes);
    if (t->redis) kp_redis_put_state(t->redis, &key, &parent, pos, tail, tail_block, state, t->state_bytes);
}

bool kp_tiers_find_state(kp_tiers *t, const int32_t *tokens, uint32_t lo, uint32_t hi, uint32_t *pos) {
    *pos = 0;
    if (!t->state_bytes || hi <= lo) return false;
    kp_bkey key, parent;
    t->keys_of = NULL; /* the chain of these tokens, made anew */
    for (uint32_t s = hi; s > lo && t->disk; s--) {
        if (!state_key(t, tokens, s, &key, &parent)) return false;
        if (kp_disk_ready(t->disk, &key)) {
            *pos = s;
            break;
        }
    }
    if (t->redis && hi > (*pos > lo ? *pos : lo)) { /* the positions above the disk's best */
        uint32_t from = *pos > lo ? *pos : lo, n = hi - from;
        kp_bkey *keys = malloc((size_t)n * sizeof *keys);
        bool *present = malloc((size_t)n * sizeof *present);
        bool ok = keys && present;
        for (uint32_t i = 0; ok && i < n; i++) ok = state_key(t, tokens, from + 1 + i, &keys[i], &parent);
        if (ok && kp_redis_exists(t->redis, keys, n, present))
            for (uint32_t i = n; i-- > 0;)
                if (present[i]) {
                    *pos = from + 1 + i;
                    break;
                }
        free(keys);
        free(present);
    }
    return *pos > lo;
}

kp_blockrec_reason kp_tiers_fetch_state(kp_tiers *t, const int32_t *tokens, uint32_t pos, kp_kvpool *p,
                                        int32_t tail_block, float *state, kp_tier_id *from) {
    uint32_t B = kp_kvpool_config_of(t->pool)->block_size;
    kp_bkey key, parent;
    *from = t->disk ? KP_TIER_DISK : KP_TIER_REDIS;
    if (!t->state_bytes || !state_key(t, tokens, pos, &key, &parent)) return KP_BLOCKREC_IO;
    const int32_t *tail = tokens + (size_t)pos / B * B;
    kp_blockrec_reason r = KP_BLOCKREC_MISSING;
    if (t->disk && kp_disk_ready(t->disk, &key)) {
        r = kp_disk_get_state(t->disk, &key, &parent, pos, tail, p, tail_block, state, t->state_bytes);
        if (r == KP_BLOCKREC_OK || !t->redis) return r;
    }
    if (!t->redis) return r;
    kp_blockrec_reason rr = kp_redis_get_state(t->redis, &key, &parent, pos, tail, p, tail_block, state, t->state_bytes);
    if (rr == KP_BLOCKREC_OK || r == KP_BLOCKREC_MISSING) { /* a disk refusal is the one reported */
        *from = KP_TIER_REDIS;
        r = rr;
    }
    return r;
}

void kp_tiers_note_state(kp_tiers *t, bool restored) {
    pthread_mutex_lock(&t->mu);
    if (restored) t->st.state_restores++;
    else t->st.state_failed++;
    pthread_mutex_unlock(&t->mu);
}
