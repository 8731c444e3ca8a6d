/*
 * engine.h - the KV pool, the prefix index and the forward pass wired
 * together (floor 4). Not thread-safe: one thread drives an engine.
 *
 * A request's life:
 *
 *   kp_eng_seq s = {0};
 *   kp_eng_prefill(e, prompt, n, &s, logits, &report)  -> reuse the cached prefix,
 *                                                      compute the rest in batches
 *   loop: token = sample(logits); kp_eng_decode(e, &s, token, logits)
 *   kp_eng_finish(e, &s, prompt_and_answer, n_all)     -> index the whole sequence,
 *                                                      release it
 *
 * The engine owns the KV pool (sized by a byte budget) and the prefix index
 * (none with no_prefix_cache); it borrows the model, the thread pool and the
 * kernels. When the pool is full it evicts least-recently-used cached
 * prefixes that no running sequence holds, then retries. Outputs with and
 * without the prefix cache are the same: a reused row is the row the same
 * tokens at the same positions would produce again.
 */
#ifndef KP_ENGINE_H
#define KP_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/forward.h"
#include "kv/kvpool.h"
#include "model/model.h"
#include "cache/prefix.h"
#include "kernels/quant.h"
#include "base/status.h"
#include "base/threadpool.h"

typedef struct kp_engine kp_engine;

typedef struct {
    kp_dtype kv_type;         /* KP_DTYPE_F32 or KP_DTYPE_F16 */
    uint32_t block_size;      /* positions per KV block; 0: 16 */
    uint64_t budget_bytes;    /* KV pool budget; 0: room for max_pos positions */
    uint32_t max_pos;         /* longest sequence; 0: min(training context, 4096) */
    bool no_prefix_cache;     /* true: no index, every prompt is computed whole */
    const kp_pfx_config *pfx;    /* NULL: prefix.h's defaults */
} kp_eng_config;

/* A running sequence, owned by the caller and opaque to it. Start from
 * {0}; after kp_eng_finish or kp_eng_seq_abort it is {0} again. */
typedef struct {
    kp_kvseq kv;
    kp_pfx_lease lease;
} kp_eng_seq;

/* What one prefill did, and the inputs of a cache report. */
typedef struct {
    uint32_t prompt_tokens;     /* n */
    uint32_t reused_tokens;     /* K/V rows taken from the cache (match.n_reuse) */
    uint32_t computed_tokens;   /* positions the forward pass computed: n - reused */
    uint32_t diverged_at_token; /* first prompt token the cache does not hold
                                   (match.n_match; n when every token is cached) */
    int32_t cached_next;        /* the cache's token at diverged_at_token when one
                                   cached run continues there, else -1 */
    uint32_t n_continuations;   /* cached runs continuing from diverged_at_token */
    bool cold;                  /* the index was empty (or there is none) */
    bool evicted;               /* the continuation was cached once and evicted */
    uint32_t evicted_len;       /* ... the path length the evicted node had */
    uint32_t evictions;         /* kp_pfx_evict calls this prefill needed */
    uint64_t evicted_bytes;     /* bytes they returned to the pool */
} kp_eng_report;

/* Makes an engine over the borrowed model, thread pool and kernels (NULL:
 * the best table for this CPU); they must outlive it. cfg NULL: F16 KV,
 * blocks of 16, room for min(training context, 4096) positions, prefix
 * cache on. KP_EINVAL for a budget smaller than one block, KP_ENOMEM. */
kp_status kp_eng_new(kp_engine **out, const kp_model *m, kp_pool *threads, const kp_kernels *kernels,
                  const kp_eng_config *cfg, kp_error *err);

/* Frees the index, the forward pass and the pool. Sequences still running
 * must have been finished or aborted. kp_eng_free(NULL) is a no-op. */
void kp_eng_free(kp_engine *e);

/* Prefills tokens[0..n) (n >= 1) into the empty sequence *seq: matches the
 * prefix index, takes the reusable rows (the whole match, or n - 1 on a
 * full hit so the last position yields its logits), and runs the forward
 * pass for positions >= reused only, in batches, evicting cached prefixes
 * when the pool is full. logits_out (n_vocab floats, may be NULL) receives
 * the logits of the last prompt token; report (may be NULL) what happened.
 * On error *seq is released and empty again. Errors: KP_EINVAL (n 0, seq
 * not empty, bad token ids), KP_ERANGE (n > max_pos), KP_EFULL (the budget
 * cannot hold the sequence even with every unheld prefix evicted),
 * KP_ENOMEM. */
kp_status kp_eng_prefill(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq,
                      float *logits_out, kp_eng_report *report, kp_error *err);

/* The first half of kp_eng_prefill, for a scheduler that computes the prompt
 * in chunks alongside other sequences: checks the tokens, matches the index
 * and takes the reusable rows into the empty *seq (seq's length becomes
 * report->reused_tokens, always < n). The caller then feeds
 * tokens[reused_tokens..n) through kp_eng_step. Errors as kp_eng_prefill; on
 * error *seq is empty. */
kp_status kp_eng_begin(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq, kp_eng_report *report,
                    kp_error *err);

/* What kp_eng_begin would reuse for tokens[0..n), without taking anything:
 * the report of a prefill that finds the pool as it is (read-only: no LRU
 * touch, no statistics). Without a prefix cache everything is computed. */
void kp_eng_probe(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_report *r);

/* One sequence's share of a step. */
typedef struct {
    kp_eng_seq *seq;          /* borrowed; at most once per step */
    const int32_t *tokens; /* n >= 1 tokens appended at seq's current length */
    uint32_t n;
    float *logits;         /* NULL, or n_vocab floats: the logits of the last token */
    kp_status status;      /* out: KP_OK when the item ran */
    kp_error err;          /* out: why it did not */
} kp_eng_item;

/* Runs all items in one forward pass (each weight is read once for the
 * whole step): prefill chunks and decode tokens of several sequences
 * together. Blocks are reserved per item first, evicting unheld cached
 * prefixes when the pool is full; an item that is invalid (bad token id,
 * n 0, a sequence given twice), too long (KP_ERANGE past max_pos) or
 * cannot get blocks (KP_EFULL) gets that status and is left out while the
 * others run; its sequence is unchanged. The return value reports failures
 * of the whole step (KP_ENOMEM, a forward error), after which the items'
 * sequences may have grown blocks but no positions. */
kp_status kp_eng_step(kp_engine *e, kp_eng_item *items, uint32_t n_items, kp_error *err);

/* Appends one token at position seq's length and writes its logits
 * (n_vocab floats, may be NULL). KP_ERANGE past max_pos, KP_EFULL, KP_EINVAL
 * for a bad token id; the sequence is unchanged on error. */
kp_status kp_eng_decode(kp_engine *e, kp_eng_seq *seq, int32_t token, float *logits_out, kp_error *err);

/* Positions the sequence holds (prompt + decoded tokens). */
uint32_t kp_eng_seq_len(const kp_eng_seq *seq);

/* Indexes tokens[0..min(n, kp_eng_seq_len)) - the tokens fed to the sequence,
 * prompt then generated, in order; a sampled token never decoded has no
 * K/V and is left out - and releases the sequence (*seq becomes {0}).
 * *n_added (may be NULL) receives the newly indexed positions. KP_ENOMEM
 * when the index could not grow (the sequence is released anyway). */
kp_status kp_eng_finish(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n,
                     uint32_t *n_added, kp_error *err);

/* Releases a sequence without indexing it (cancelled request). */
void kp_eng_seq_abort(kp_engine *e, kp_eng_seq *seq);

/* Drops every cached prefix: the index is freed and made anew (its
 * statistics restart). Sequences still running keep their own blocks. With
 * no running sequence, every block of the pool is free afterwards. KP_OK
 * (no-op) without an index; KP_ENOMEM leaves the engine without a cache. */
kp_status kp_eng_clear(kp_engine *e, kp_error *err);

/* The memory bill (kp_pfx_get_stats; without an index only the pool fields
 * budget/used/free/block_bytes are set). */
void kp_eng_stats(kp_engine *e, kp_pfx_stats *out);

/* Borrowed internals, for reports and tests (NULL index with
 * no_prefix_cache). */
kp_pfx_index *kp_eng_index(kp_engine *e);
kp_kvpool *kp_eng_kvpool(kp_engine *e);
uint32_t kp_eng_max_pos(const kp_engine *e);

#endif
