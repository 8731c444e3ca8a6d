/*
 * engine.h - the KV pool, the prefix index and the forward pass wired
 * together (floor 6). Not thread-safe: one thread drives an engine.
 *
 * A request's life:
 *
 *   kp_eng_seq s = {0};
 *   kp_eng_prefill(e, prompt, n, &s, logits, &report)  -> reuse the cached prefix,
 *                                                      compute the rest in batches
 *   loop: token = kp_gen_step(gen, logits); kp_eng_decode(e, &s, token, logits)
 *   kp_eng_finish(e, &s, prompt_and_answer, n_all)     -> index the whole sequence,
 *                                                      release it
 *
 * kp_eng_generate is that loop for one sequence (the command line: run,
 * run --prompt-cache, bench); a scheduler runs many sequences per forward
 * call with kp_eng_begin + kp_eng_step and steps each one's kp_gen itself.
 * Either way the kp_gen (engine/gen.h) decides sampling, text, stop strings
 * and the end; the engine only computes.
 *
 * The engine owns the KV pool (sized by a byte budget) and the prefix index
 * (none with no_prefix_cache); it borrows the model, the thread pool and the
 * kernels. When the pool is full it evicts least-recently-used cached
 * prefixes that no running sequence holds, then retries. Outputs with and
 * without the prefix cache are the same: a reused row is the row the same
 * tokens at the same positions would produce again.
 *
 * The engine is the only way to the pool and the index: cache listings,
 * pins and the memory bill are engine operations (kp_eng_top, kp_eng_pin,
 * kp_eng_unpin, kp_eng_expire, kp_eng_probe, kp_eng_get_stats), so callers
 * above this floor never include prefix.h or kvpool.h themselves. This
 * header includes them for the layout of kp_eng_seq (a block table and a
 * lease, held by value in the caller) and kp_eng_config.pfx.
 */
#ifndef KP_ENGINE_H
#define KP_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/forward.h"
#include "kv/kvpool.h"
#include "model/model.h"
#include "engine/gen.h"
#include "cache/prefix.h"
#include "cache/tiers.h"
#include "kernels/quant.h"
#include "base/status.h"
#include "base/threadpool.h"

typedef struct kp_engine kp_engine;

typedef struct {
    kp_dtype kv_type;         /* K rows: F32, F16, Q8_0 or Q4_0 */
    uint32_t block_size;      /* positions per KV block; 0: 16 */
    uint64_t budget_bytes;    /* KV pool budget; 0: room for max_pos positions */
    uint32_t max_pos;         /* longest sequence; 0: min(training context, 4096) */
    bool no_prefix_cache;     /* true: no index, every prompt is computed whole */
    const kp_pfx_config *pfx;    /* NULL: prefix.h's defaults */
    kp_dtype kv_type_v;       /* V rows: F32, F16, Q8_0 or Q4_0; the last two (for K
                                 too) need head_dim % 32 == 0, else KP_EINVAL */
    bool no_repack;           /* true: the kernels read every weight in the mapping
                                 (kp_forward_pack_weights not called) */
    uint64_t window_budget_bytes; /* a model with WINDOW layers: their rows get this
                                 share of budget_bytes (kvpool.h's window arena) and
                                 cached blocks keep them only where a resume point
                                 needs them (engine.c); 0: every block keeps them */
    uint32_t state_every;     /* a model with recurrent layers: a running sequence's
                                 state is snapshotted every this many positions (and
                                 at its prompt's end, its end and pins; engine.c);
                                 0: 256 rounded up to a multiple of block_size */
} kp_eng_config;

/* A running sequence, owned by the caller and opaque to it. Start from
 * {0}; after kp_eng_finish or kp_eng_seq_abort it is {0} again. */
typedef struct {
    kp_kvseq kv;
    kp_pfx_lease lease;
    uint32_t prompt_end; /* kp_eng_begin's n: a resume point (the next turn of a
                            conversation diverges there when the answer is not
                            sent back as it was) whose window rows the sequence
                            keeps under a window budget (engine.c) */
    uint32_t reused;     /* kp_eng_begin's reuse: the previous turn's end, in a
                            block the sequence copied when it is mid-block; that
                            block keeps its window rows too */
    kp_pfx_state *snaps; /* a recurrent model: the state snapshots taken while it
                            ran (pool blocks of its own), in position order, handed
                            to the index by kp_eng_finish */
    uint32_t n_snaps, cap_snaps;
    /* Under a window budget (engine.c), the engine's own: */
    int32_t *toks;       /* the tokens of positions [0, n_toks): the prompt from
                            kp_eng_begin on, then every token fed (NULL: not kept) */
    uint32_t n_toks, cap_toks;
    uint32_t *starts;    /* kp_eng_begin_msgs' message starts, ascending, in
                            (0, prompt_end): resume points like prompt_end */
    uint32_t n_starts;
    uint32_t handed;     /* the latest resume point handed to the index (0: none) */
    uint32_t tier_done;  /* its blocks below this one were queued to the tiers below RAM */
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
    /* where reused_tokens came from: RAM (the index), then whole blocks
       restored from the tiers below it: reused_from[KP_TIER_DISK] and
       [KP_TIER_REDIS]; [KP_TIER_RAM] is left 0: the rest of reused_tokens) */
    uint32_t reused_from[KP_TIER_N];
    kp_blockrec_reason restore_failed; /* KP_BLOCKREC_OK, or why a tier's block was refused
                                      (the rest of the prompt was computed) */
    kp_tier_id restore_failed_tier;
    /* rows taken from another running sequence's prefill rather than from
     * the index (a scheduler's in-flight prefix, kp_eng_fork_prefix; part
     * of reused_tokens), and how long the request waited for them; 0 for
     * kp_eng_begin / kp_eng_prefill */
    uint32_t inflight_tokens;
    double inflight_wait_ms;
    bool recurrent;             /* the model has recurrent layers (model.h, Hybrid): reuse
                                   resumes from the index's state snapshots (engine.c) */
    uint32_t state_cut_from;    /* > 0 (recurrent): the reuse the cached rows allowed, which
                                   reused_tokens was cut from to the latest state snapshot
                                   at or before it (the cache report's cause
                                   state_checkpoint); 0: not cut */
    uint32_t state_recomputed_tokens; /* state_cut_from - reused_tokens (0 when not cut):
                                   cached positions computed again because the state
                                   was snapshotted only before them */
    uint32_t window_cut_from;   /* > 0: the tokens matched this far (the reuse the
                                   cache's full layers allowed), but the WINDOW
                                   layers' rows before it were dropped (a window
                                   budget): reuse resumed at the latest position
                                   whose window is held (window_evicted) */
} kp_eng_report;

/* Bytes the state snapshots of one sequence of max_pos positions take in
 * the pool (engine.c: one every state_every positions, 0: the default, and
 * two more for its prompt's and its own end), in whole blocks of
 * block_size positions (0: 16) of K/V types k and v; 0 for a model without
 * recurrent layers. Callers that size a budget add it per sequence. */
uint64_t kp_eng_state_room(const kp_model *m, kp_dtype k, kp_dtype v, uint32_t block_size, uint32_t max_pos,
                           uint32_t state_every);

/* Makes an engine over the borrowed model, thread pool and kernels (NULL:
 * the best table for this CPU); they must outlive it. cfg NULL: F16 KV,
 * blocks of 16, room for min(training context, 4096) positions, prefix
 * cache on. KP_EINVAL for a budget smaller than one block, KP_ENOMEM. */
kp_status kp_eng_new(kp_engine **out, const kp_model *m, kp_threads *threads, const kp_kernels *kernels,
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

/* kp_eng_begin for a prompt rendered from messages: starts[0..n_starts)
 * are the positions where its messages start (a chat template's turns;
 * any order, those outside (0, n) ignored). Under a window budget each is
 * a resume point, like the prompt's end: as the sequence passes one it
 * hands the path up to it to the index and marks it (kp_pfx_mark), so
 * the window rows before it stay cached and a later prompt that edits or
 * drops that message resumes at its start. Without a budget they change
 * nothing (every cached position is a resume point already). Copied. */
kp_status kp_eng_begin_msgs(kp_engine *e, const int32_t *tokens, uint32_t n, const uint32_t *starts,
                            uint32_t n_starts, kp_eng_seq *seq, kp_eng_report *report, kp_error *err);

/* What kp_eng_begin would reuse for tokens[0..n), without taking anything:
 * the report of a prefill that finds the pool as it is (read-only: no LRU
 * touch, no statistics). Without a prefix cache everything is computed. */
void kp_eng_probe(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_report *r);

/* One sequence's share of a step. */
typedef struct {
    kp_eng_seq *seq;          /* borrowed; at most once per step */
    const int32_t *tokens; /* n >= 1 tokens appended at seq's current length */
    uint32_t n;
    float *logits;         /* NULL, or n_vocab floats: the logits of the last token
                              (n x n_vocab with all_logits) */
    kp_status status;      /* out: KP_OK when the item ran */
    kp_error err;          /* out: why it did not */
    bool all_logits;       /* logits of every token of the item, in order (kvpin logits) */
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

/* Appends tokens[0..n) (n >= 1) at seq's length, in forward calls of at
 * most `batch` tokens (0: 256), reserving blocks (evicting unheld cached
 * prefixes when the pool is full); logits_out (n_vocab floats, may be NULL)
 * receives the last token's logits. For a caller that feeds a sequence
 * itself (kvpin bench). Errors as kp_eng_decode; on error the sequence may
 * hold some of the tokens (whole forward calls). */
kp_status kp_eng_append(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n, uint32_t batch,
                        float *logits_out, kp_error *err);

/* Forgets positions >= n_pos of seq (whole blocks past it are dropped), so
 * the next tokens overwrite them (kvpin bench reruns a test from one
 * depth). Only without a prefix cache, whose blocks a sequence may share:
 * KP_EUNSUPPORTED otherwise; and for a model with recurrent layers only to
 * 0 (a restart: its state cannot be cut back), KP_EUNSUPPORTED otherwise. */
kp_status kp_eng_seq_truncate(kp_engine *e, kp_eng_seq *seq, uint32_t n_pos, kp_error *err);

/* Makes the empty sequence *dst a fork of src: the same positions, the
 * same K/V, with no row computed again. Every whole block of src is
 * shared (its reference count grows: the rows are stored once); a
 * partially filled last block is copied into a block of dst's own
 * (copy-on-write: both append into that block, each into its own), taken
 * from the pool, evicting an unheld cached prefix when the pool is full.
 * dst holds no lease on the index (its block references keep its rows
 * alive; src's lease keeps the path cached). For n choices of one prompt:
 * the prompt is prefilled once, then forked n - 1 times. KP_EINVAL (dst
 * not empty), KP_EFULL (no block for the copy even after eviction; dst
 * stays empty), KP_ENOMEM. */
kp_status kp_eng_fork(kp_engine *e, const kp_eng_seq *src, kp_eng_seq *dst, kp_error *err);

/* Blocks kp_eng_fork of a sequence of n_pos positions takes from the pool
 * (1 when the last block is partial, else 0). */
uint32_t kp_eng_fork_blocks(const kp_engine *e, uint32_t n_pos);

/* kp_eng_fork of src's first n positions only (n <= src's length): the
 * empty *dst gets src's whole blocks below n (shared, reference counted)
 * and a private copy of the block holding position n - 1 when n is not a
 * multiple of the block size, so dst appends from position n into blocks
 * of its own while src goes on writing past n in its own. For a request
 * that reuses the prompt another running sequence is computing (or has
 * computed but not yet indexed): the rows below n are final, src never
 * writes them again. n 0: dst stays empty, KP_OK. A model with recurrent
 * layers: n must be src's length or the position of one of src's pending
 * state snapshots (the state exists there only; copied to dst:
 * kp_eng_fork_point), else KP_EUNSUPPORTED. Errors as kp_eng_fork,
 * KP_EINVAL also for n past src's length, KP_EFULL also when src, under a
 * window budget, has dropped the window rows position n reads (it has
 * gone on more than a window past n). */
kp_status kp_eng_fork_prefix(kp_engine *e, const kp_eng_seq *src, uint32_t n, kp_eng_seq *dst, kp_error *err);

/* True when the model has recurrent layers (model.h, Hybrid): the prefix
 * index then keeps state snapshots (engine.c), kp_eng_fork_prefix forks a
 * sequence at its whole length or at its pending snapshots only
 * (KP_EUNSUPPORTED otherwise), copying its recurrent state, and the tiers
 * store the snapshots beside the blocks. */
bool kp_eng_recurrent(const kp_engine *e);

/* The longest prefix of at most n positions that kp_eng_fork_prefix can
 * fork from src now: min(n, src's length) without recurrent layers; with
 * them src's length when n reaches it, else the latest of src's pending
 * snapshots at or before n (0: none). kp_eng_fork_ahead: the same once src
 * has computed n positions, counting the state points (every
 * state_every positions, its prompt's end) it has still to pass, where it
 * will snapshot if the pool has room (a scheduler's in-flight prefix
 * waits for it). */
uint32_t kp_eng_fork_point(const kp_engine *e, const kp_eng_seq *src, uint32_t n);
uint32_t kp_eng_fork_ahead(const kp_engine *e, const kp_eng_seq *src, uint32_t n);

/* How many of the next n tokens (n >= 1) of seq a prefill chunk should
 * take so that its forward call ends at seq's next state snapshot
 * position (a recurrent model's state exists only where a call ends): n,
 * or less for a recurrent model with a prefix cache. A scheduler cuts its
 * chunks with it; kp_eng_prefill / kp_eng_append cut their own. */
uint32_t kp_eng_chunk(const kp_engine *e, const kp_eng_seq *seq, uint32_t n);

/* Positions per KV block (kp_eng_config.block_size), fixed at kp_eng_new. */
uint32_t kp_eng_block_size(const kp_engine *e);

/* Positions the sequence holds (prompt + decoded tokens). */
uint32_t kp_eng_seq_len(const kp_eng_seq *seq);

/* Blocks seq still has to take from the pool to hold n_pos positions: 0
 * when its block table covers them already. */
uint32_t kp_eng_seq_blocks_missing(const kp_engine *e, const kp_eng_seq *seq, uint32_t n_pos);

/* Under a window budget (engine.c): the window slots seq holds alone, its
 * blocks with window rows that nothing else references (the index's share
 * of a block it handed over is the index's). 0 without a budget. */
uint32_t kp_eng_seq_window_slots(const kp_engine *e, const kp_eng_seq *seq);

/* Under a window budget: the window slots a sequence fed `chunk`
 * positions per step (a decode step: 1) holds at once that nothing else
 * can give up while it runs: its window, the chunk, the block the window
 * starts in, its copy of the block it resumed in, and the window before
 * its prompt's end (handed to the index, a leaf's end while it runs; the
 * windows before its messages' starts are marked ends the index may give
 * up). kp_eng_seq_window_need: what seq may still take beyond what it
 * holds now. 0 without a budget. For admission (scheduler.c's KV rule). */
uint32_t kp_eng_window_need(const kp_engine *e, uint32_t chunk);
/* The same for a window of W positions and blocks of B, without an
 * engine (kvpin serve checks --window-budget holds one sequence alone). */
uint32_t kp_eng_window_peak_blocks(uint32_t W, uint32_t B, uint32_t chunk);
uint32_t kp_eng_seq_window_need(const kp_engine *e, const kp_eng_seq *seq, uint32_t chunk);

/* ---- admission: what a prefill takes, what the pool can give ------------ */

/* The room for a prefill of tokens[0..n), in KV blocks (a scheduler
 * admits it when need_blocks plus what its running sequences still need
 * is at most free_blocks + evictable_blocks). */
typedef struct {
    uint32_t reused_tokens;    /* what kp_eng_begin would reuse now (kp_eng_probe) */
    uint32_t need_blocks;      /* blocks the prefill takes from the pool: ceil(n / B) less
                                  the whole blocks it shares with the cache (reused_tokens / B);
                                  the private copy of a shared partial block counts */
    uint32_t free_blocks;      /* free in the pool now */
    uint32_t evictable_blocks; /* blocks that evicting every cached prefix no running sequence
                                  holds and no pin covers would return to the pool, less those
                                  the prefill itself would share */
    /* under a window budget (0 without one): window slots, counted alike */
    uint32_t free_slots;       /* free in the window arena now */
    uint32_t spare_slots;      /* the index's window rows that kp_pfx_drop_windows or eviction
                                  could give up (kp_pfx_window_spare, evictable blocks), less
                                  those of the blocks the prefill would share */
} kp_eng_room;

/* Fills *out for a prefill of tokens[0..n) as the pool is now, without
 * changing anything (read-only, like kp_eng_probe). hold_path: count the
 * cached path the prefill would hold (its lease, kp_eng_begin) as held,
 * as the sequences running beside it will find it; false: as a sequence
 * running alone finds the pool (kp_eng_step then drops a sequence's own
 * hold when nothing else can be evicted, so only the rows it shares stay).
 * With free + evictable >= need, kp_eng_begin and the steps that feed
 * tokens[reused..n) get their blocks, as long as nothing else takes blocks
 * in between. Without a prefix cache nothing is reused or evictable.
 * O(pool blocks + index nodes + the path's tokens). KP_ENOMEM (scratch). */
kp_status kp_eng_room_for(kp_engine *e, const int32_t *tokens, uint32_t n, bool hold_path, kp_eng_room *out,
                          kp_error *err);

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

/* The memory bill of the KV pool and the prefix index. Every byte count is
 * in whole KV blocks; a block several nodes or sequences share counts once.
 * Under a window budget budget_, used_, free_ and index_bytes count the
 * main arena's blocks and the window arena's slots apart (a block without
 * window rows costs its full layers' rows only); the other byte counts
 * stay block_bytes a block.
 * Without a prefix cache the index fields are 0. */
typedef struct {
    bool prefix_cache;          /* the engine has a prefix index */
    kp_dtype kv_type;           /* K rows' type: F16, F32, Q8_0 or Q4_0 */
    uint32_t block_size;        /* positions per KV block */
    uint64_t bytes_per_token;   /* K and V of one position over all layers */
    uint64_t block_bytes;       /* block_size * bytes_per_token */
    uint64_t budget_bytes;      /* the pool: n_blocks * block_bytes */
    uint64_t used_bytes;        /* blocks in use by the index or any sequence */
    uint64_t free_bytes;        /* budget - used */
    uint64_t index_bytes;       /* blocks the index references */
    uint64_t pinned_bytes;      /* what pinned paths hold (window rows where kept) */
    uint64_t pinned_cap_bytes;  /* the cap of pinned_bytes */
    uint64_t shared_bytes;      /* index blocks that running sequences also use */
    uint64_t saved_bytes;       /* what those sequences would need more without sharing */
    uint32_t n_nodes;           /* index tree nodes */
    uint32_t n_leaves;          /* cached prefixes that end a path */
    uint32_t n_pins;
    uint32_t n_leases;          /* running sequences holding a cached path */
    uint64_t cached_tokens;     /* distinct indexed positions */
    uint64_t n_evictions;       /* nodes evicted since the index was made */
    uint64_t evicted_bytes;     /* bytes eviction returned to the pool */
    uint64_t n_lookups;         /* prefills that consulted the index */
    uint64_t n_hits;            /* ... and reused at least one position */
    uint64_t reused_tokens;     /* positions those prefills reused */
    kp_dtype kv_type_v;         /* V rows' type */
    uint64_t packed_weight_bytes; /* weights repacked at load into the engine's memory (0: all
                                     used in place from the mapping) */
    /* The bill per layer kind (model.h). A token costs full_bytes_per_token
     * for as long as any sequence or the cache keeps it, and
     * window_bytes_per_token only while it is within `window` positions of a
     * query that still reads it; the cache keeps window rows of older
     * positions only so that reuse can resume there (engine.c). */
    uint32_t n_full_layers;          /* FULL layers */
    uint32_t n_window_layers;        /* WINDOW layers; 0: every layer is FULL (the
                                        window fields below are then 0) */
    uint32_t window;                 /* positions a WINDOW layer reads (hp.n_swa) */
    uint64_t full_bytes_per_token;   /* K and V of one position in the FULL layers */
    uint64_t window_bytes_per_token; /* ... in the WINDOW layers (the sum of the two
                                        is bytes_per_token) */
    uint64_t index_full_bytes;       /* the cache's blocks: their FULL layers' rows */
    uint64_t index_window_bytes;     /* ... their WINDOW layers' rows, where held */
    uint64_t window_budget_bytes;    /* the window arena under a window budget (0: none,
                                        every block keeps its window rows) */
    uint64_t window_used_bytes;      /* ... its slots in use (cache and sequences) */
    uint64_t window_drops;           /* cached blocks whose window rows were dropped to
                                        make room */
    /* A model with recurrent layers: the state snapshots (engine.c) */
    uint32_t state_every;            /* positions between a sequence's snapshots (0: none) */
    uint64_t state_bytes;            /* one recurrent state: every recurrent layer's
                                        matrices and convolution tail, float32 */
    uint64_t state_block_bytes;      /* ... the pool bytes one snapshot holds (whole blocks) */
    uint32_t n_states;               /* snapshots the index holds */
    uint64_t index_state_bytes;      /* ... their bytes (part of index_bytes) */
    uint64_t state_evictions;        /* snapshots evicted alone (their blocks kept) */
} kp_eng_stats;

/* Fills *out: O(pool blocks + index nodes), so a caller polling it should
 * not do so every step. */
void kp_eng_get_stats(kp_engine *e, kp_eng_stats *out);

/* A cached prefix as cache listings show it (prefix.h's kp_pfx_prefix_info:
 * hash, n_tokens, its first tokens in head[0..n_head), bytes, holders,
 * pinned, hits). */
typedef kp_pfx_prefix_info kp_eng_prefix;

/* Opens the tiers below RAM that cfg names (tiers.h: the disk tier, a
 * Redis tier) for this engine's model and KV layout; from then on a
 * prefill continues its RAM match from them (whole blocks, verified) and a
 * finished sequence's full blocks are written to them in the background,
 * and so are a pinned prefix's at pin time (kp_eng_pin). Call once,
 * normally before the first prefill (what was cached before reaches the
 * tiers only when it is pinned or indexed again). KP_EUNSUPPORTED without a prefix
 * cache or for a model with recurrent layers (the tiers do not store state
 * snapshots), KP_EINVAL when tiers are open already, else kp_tiers_new's errors
 * (the engine is unchanged then). */
kp_status kp_eng_open_tiers(kp_engine *e, const kp_tiers_config *cfg, kp_error *err);

/* The precision of prefill attention (kp_forward_set_attn: KP_ATTN_BF16
 * where the CPU has AVX512_BF16, else it stays F32); the default is F32.
 * Call before the first batch and before kp_eng_open_tiers (the tiers'
 * fingerprint covers it: KP_EINVAL after). kp_eng_attn_name: the
 * attention table in use ("avx512bf16", "avx512", ...). */
kp_status kp_eng_set_attn(kp_engine *e, kp_attn_precision p, kp_error *err);
const char *kp_eng_attn_name(const kp_engine *e);
/* kp_forward_attn_work of the engine's pass: attention's FLOP and seconds so far. */
void kp_eng_attn_work(const kp_engine *e, double *flops, double *seconds);

/* The tiers' counters (tiers.h) into *out; false (and *out zeroed) when
 * the engine has no tier below RAM. Any thread. */
bool kp_eng_tier_stats(kp_engine *e, kp_tiers_stats *out);

/* What opening the tiers found ("ignored N blocks of fingerprint ..."), ""
 * when nothing or no tiers. Borrowed from e. */
const char *kp_eng_tier_note(const kp_engine *e);

/* Which whole blocks of tokens[0..n), from the start, the tiers below RAM
 * hold without reading them (the lookup order of a restore: disk, then
 * Redis from the first block the disk lacks), as positions per tier into
 * tokens_on[KP_TIER_N] (tokens_on[RAM] is 0; all 0 without tiers). A
 * record is verified only when read, so a probe may count one a restore
 * would refuse. Engine thread. */
void kp_eng_tier_probe(kp_engine *e, const int32_t *tokens, uint32_t n, uint32_t tokens_on[KP_TIER_N]);

/* A model with recurrent layers (state checkpoints): the position a
 * prefill of tokens[0..n) would resume at from the tiers alone (RAM not
 * counted): the latest state snapshot (at most n - 1) some tier holds
 * whose whole blocks before it some tier holds too, read and verified as
 * a restore reads it; a refused one is skipped for the next earlier
 * (*refused_at: the first refused position, *why its reason; 0 and
 * KP_BLOCKREC_OK when none was). *from: the resuming snapshot's tier. 0
 * without tiers, for another model, or when no snapshot is usable.
 * Engine thread. */
uint32_t kp_eng_tier_probe_state(kp_engine *e, const int32_t *tokens, uint32_t n, kp_tier_id *from,
                                 uint32_t *refused_at, kp_blockrec_reason *why);

/* Waits up to ms milliseconds for the Redis tier's connection (true at
 * once without one): for a tool that probes once (kp_tiers_wait_ready). */
bool kp_eng_tier_wait_ready(kp_engine *e, uint32_t ms);

/* Waits until the tiers' queued writes are done (tests; no-op without). */
void kp_eng_tier_flush(kp_engine *e);

/* The largest cached prefixes, most tokens first (ties: most recently used
 * first), at most max, into out[0..*n_out); O(index nodes). None without a
 * prefix cache. KP_ENOMEM. */
kp_status kp_eng_top(kp_engine *e, kp_eng_prefix *out, uint32_t max, uint32_t *n_out, kp_error *err);

/* Leading tokens of a node's own run that kp_eng_tree keeps. */
#define KP_ENG_NODE_HEAD 8

/* One node of the prefix index as a drawing of the tree shows it. */
typedef struct {
    int32_t parent;          /* index of its parent in the same array; -1: a child of the root */
    uint32_t start, end;     /* its run is path positions [start, end) */
    int32_t head[KP_ENG_NODE_HEAD]; /* the first n_head = min(end - start, KP_ENG_NODE_HEAD) tokens of its run */
    uint32_t n_head;
    uint32_t n_children;
    uint32_t n_holders;      /* leases on this node or below */
    uint32_t n_pins;         /* pins on this node or below */
    uint64_t last_used;      /* the index's logical clock at its last touch */
    uint64_t hits;           /* acquires that reused part of it */
} kp_eng_node;

/* The first max nodes of the prefix index in preorder (children in token
 * order), into out[0..*n_out): a parent always comes before its children,
 * so a cut list is still a tree (its deepest, rightmost parts left out).
 * None without a prefix cache. O(nodes written + their depth). KP_ENOMEM. */
kp_status kp_eng_tree(kp_engine *e, kp_eng_node *out, uint32_t max, uint32_t *n_out, kp_error *err);

/* The longest chain of first tokens kp_eng_node_path takes (deeper nodes
 * are not addressable; the dashboard draws far fewer levels). */
#define KP_ENG_PATH_DEPTH 256

/* Finds the index node addressed by firsts[0..depth): the child of the root
 * whose run starts with firsts[0], its child whose run starts with
 * firsts[1], and so on (a radix tree's children differ in their first
 * token, so the chain names one node; unlike a kp_eng_tree position it
 * stays valid while the tree changes elsewhere). Copies the tokens of its
 * whole path, positions [0, end), into out[0..min(end, max)), sets *end and
 * *start (its own run is [start, end)). KP_ENOTFOUND when no node has that
 * chain (evicted since, or never there, or no prefix cache); KP_EINVAL for
 * depth 0 or > KP_ENG_PATH_DEPTH; KP_ENOMEM. O(index nodes x depth). */
kp_status kp_eng_node_path(kp_engine *e, const int32_t *firsts, uint32_t depth, int32_t *out, uint32_t max,
                           uint32_t *start, uint32_t *end, kp_error *err);

/* Pins the cached prefix tokens[0..n) until kp_eng_unpin(*id), or until
 * now + ttl_seconds (ttl 0: no expiry; `now` in seconds of the caller's
 * clock, which kp_eng_expire must use too). A pinned prefix is never
 * evicted; the pinned bytes are capped (kp_eng_config.pfx). *id receives
 * the pin's id (> 0). KP_ENOTFOUND if the n tokens are not all cached;
 * KP_EFULL over the pinned-bytes cap; KP_EINVAL for n 0 or ttl < 0;
 * KP_EUNSUPPORTED without a prefix cache; KP_ENOMEM. */
kp_status kp_eng_pin(kp_engine *e, const int32_t *tokens, uint32_t n, int64_t ttl_seconds, int64_t now,
                     uint64_t *id, kp_error *err);

/* Removes pin id. KP_ENOTFOUND if there is no such pin (never made,
 * removed, expired) or no prefix cache. */
kp_status kp_eng_unpin(kp_engine *e, uint64_t id, kp_error *err);

/* Removes every pin whose expiry time is <= now; returns how many (0
 * without a prefix cache). */
uint32_t kp_eng_expire(kp_engine *e, int64_t now);

/* Verifies the invariants of the prefix index against the pool (prefix.h's
 * kp_pfx_check): KP_OK, or KP_EFORMAT naming the first broken one. For
 * tests and debugging: O(nodes + blocks). KP_OK without a prefix cache. */
kp_status kp_eng_check(kp_engine *e, kp_error *err);

/* The longest sequence the engine runs (kp_eng_config.max_pos). */
uint32_t kp_eng_max_pos(const kp_engine *e);

/* The attention probe of the forward pass (kvpin inspect; forward.h's
 * kp_forward_set_probe / kp_forward_probe): after every forward call, the
 * softmax weights of its last token for (layer, query head) over positions
 * 0..pos are kept; kp_eng_attn_probe returns them (borrowed until the next
 * call; NULL when off) and their count. layer < 0 turns the probe off. */
void kp_eng_set_attn_probe(kp_engine *e, int layer, int head);
const float *kp_eng_attn_probe(const kp_engine *e, int32_t *n_pos);

/* ---- one sequence, start to end ------------------------------------------ */

/* Hooks and options of kp_eng_generate; every hook may be NULL. */
typedef struct {
    void *ctx;
    /* the prompt is computed (r: what the prefill reused) */
    void (*on_prefill)(void *ctx, const kp_eng_report *r);
    /* after every kp_gen_step: the token, the released text, the finish */
    void (*on_step)(void *ctx, const kp_gen_out *o);
    /* a generated token's K/V was appended; seq_len: positions now held */
    void (*on_decode)(void *ctx, int32_t token, uint32_t seq_len);
    uint32_t batch;   /* prompt tokens per forward call; 0: 256 */
    bool decode_last; /* decode also the token that ended generation by max_tokens or a
                         stop string (when a position is left), so the sequence holds the
                         whole answer for kp_eng_finish to index */
} kp_eng_gen_opts;

/* Runs generation g (engine/gen.h) on seq to its end, synchronously:
 *
 *   seq empty   -> kp_eng_prefill of g's prompt through the prefix cache
 *   seq holds the prompt's first k < n_prompt tokens (the caller's own
 *               sequence, e.g. a benchmark's depth) -> the rest appended
 *   loop: kp_gen_step(logits) -> on_step; finished: stop; else decode the
 *         token -> on_decode
 *
 * *report (may be NULL) receives what the prefill reused. The sequence is
 * left as generation leaves it (the prompt and the decoded tokens): the
 * caller then indexes it (kp_eng_finish with kp_gen_tokens), releases it
 * (kp_eng_seq_abort) or keeps it. o NULL: no hooks, defaults. Errors: the
 * prefill's (then seq is empty), kp_eng_decode's and kp_gen_step's (then
 * seq holds what was computed); KP_EINVAL when g already ran or seq holds
 * the whole prompt; KP_ENOMEM. */
kp_status kp_eng_generate(kp_engine *e, kp_eng_seq *seq, kp_gen *g, const kp_eng_gen_opts *o,
                          kp_eng_report *report, kp_error *err);

#endif
