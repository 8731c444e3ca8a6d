/*
 * prefix.h - the prefix index: which token prefixes have their K/V rows in
 * the KV pool, so a new request reuses them up to its first differing token.
 *
 * A radix tree over token ids (edges are token runs, not whole blocks);
 * every node holds references to the kp_kvpool blocks that store the K/V of
 * its positions. Hits are verified by comparing tokens. The index borrows
 * the pool (the pool must outlive it) and belongs to one loaded model: its
 * rows are valid only for that model's weights, RoPE settings and KV type.
 * One thread owns it (no locks). See prefix.c for the tree and block layout.
 *
 * A request's life with the index:
 *
 *   kp_pfx_match(tokens)                    -> how much is cached, where it diverged
 *   kp_pfx_acquire(tokens, m.n_reuse, &seq, &lease)
 *                                        -> seq holds the cached rows; forward runs
 *                                           from position seq.n_pos
 *   (KP_EFULL from the pool: kp_pfx_evict(bytes, now), then retry)
 *   kp_pfx_insert(tokens, n, &seq, &lease)  -> after prefill / each step / at the end
 *   kp_pfx_release(&lease); kp_kvseq_release(&seq, pool)
 *
 * Contract for sequences: a sequence writes only positions >= its n_pos at
 * the time of kp_pfx_acquire or kp_pfx_insert (it appends, it never rewinds over
 * rows it reused or indexed). kp_pfx_acquire hands out a private copy of a
 * shared partial block, so appending never touches a row someone else reads.
 *
 * Recurrent-state snapshots (a model with recurrent layers, model.h's
 * Hybrid; kp_pfx_set_state). A sequence's recurrent state summarizes all
 * its positions and cannot be cut back, so K/V rows alone cannot resume
 * it. The index then also keeps snapshots: a copy of a sequence's whole
 * state (every recurrent layer's matrices and convolution tail) after
 * position pos, stored in pool blocks (kp_pfx_state_blocks of them, as
 * plain bytes: kvpool.h's kp_kvpool_put), so they are in the KV budget and
 * the memory bill, and hung off the node whose run holds pos (d0 < pos <=
 * d1, sorted). A resume point r > 0 is then a position with a snapshot on
 * the query's path (kp_pfx_resume; kp_pfx_match cuts n_reuse to the latest
 * one, state_cut_from), and kp_pfx_acquire hands the sequence a copy of it
 * (kvpool.h's rstate, rstate_pos = n_reuse) with the K/V rows:
 *
 *   path   [0 ............ 64) --+-- [64 ....... 90)   leaf
 *   snaps        @32        @64  |         @90          (every 32, ends)
 *   query diverges at 75 -> resumes at 64 (rows 0..63, state @64), computes 64..
 *
 * Who takes them is the engine's choice (engine.c: every N positions, a
 * prompt's end, a sequence's end, a pin); the engine saves one while its
 * sequence runs (kp_pfx_state_save: the sequence owns it, pending) and
 * hands it over once its path is indexed (kp_pfx_add_state). Snapshots are
 * evicted by the LRU policy of the leaves: kp_pfx_evict takes the least
 * recently used of (an unheld, unpinned leaf, with its snapshots; a lone
 * snapshot), a snapshot's clock being its creation or last resume, so the
 * unused snapshots along a path go before its end's; the snapshot at a
 * pinned node's end stays. A node may lose its snapshots and keep its
 * blocks: reuse then resumes at an earlier snapshot (or at 0).
 */
#ifndef KP_PREFIX_H
#define KP_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/kvpool.h"
#include "base/status.h"

typedef struct kp_pfx_index kp_pfx_index;
typedef struct kp_pfx_node kp_pfx_node;

typedef struct {
    uint64_t pinned_cap_bytes;    /* pinned prefixes may hold at most this many bytes; 0: no pins */
    uint32_t evicted_record_size; /* how many evicted runs are remembered (0: none) */
} kp_pfx_config;

/* A running sequence's hold on an indexed path: while held, no node of the
 * path is evicted. {0} (node NULL) is the empty lease. Opaque: only the
 * functions below read or write it. */
typedef struct {
    kp_pfx_node *node;
} kp_pfx_lease;

/* Makes an empty index over `pool` (borrowed; it must outlive the index).
 * cfg NULL: pinned cap = half the pool (half of each arena under a window
 * budget: kvpool.h), 256 evicted runs remembered.
 * KP_ENOMEM on allocation failure (*out NULL). */
kp_status kp_pfx_new(kp_pfx_index **out, kp_kvpool *pool, const kp_pfx_config *cfg, kp_error *err);

/* Drops every block reference the index holds and frees it. Outstanding
 * leases become invalid (their sequences keep their own block references).
 * kp_pfx_free(NULL) is a no-op. */
void kp_pfx_free(kp_pfx_index *p);

/* A 64-bit hash of a token run (not cryptographic; only for records and
 * reports; hits are always verified on the tokens themselves). */
uint64_t kp_pfx_hash(const int32_t *tokens, uint32_t n);

typedef struct {
    uint32_t n_match;         /* leading query tokens found in the index, token-exact */
    uint32_t n_reuse;         /* positions to take with kp_pfx_acquire: n_match, except on
                                 a full hit (n_match == n > 0) where it is n - 1: the
                                 last position is recomputed to get its logits */
    uint32_t edge_start;      /* the edge the query ended on or left the cache from: */
    uint32_t edge_end;        /*   its path depths [start, end); 0, 0 at the root */
    int32_t cached_next;      /* the token the cache has at position n_match when
                                 exactly one cached run continues there, else -1 */
    uint32_t n_continuations; /* at a boundary: how many cached runs continue from
                                 n_match (0: the cached path ends there) */
    bool evicted;             /* n_match < n and the query's continuation at n_match
                                 (tokens[0..n_match]) was cached once and evicted */
    uint32_t evicted_len;     /* when evicted: the path length the evicted node had */
    uint32_t window_cut_from; /* > 0: the reuse the tokens allow, which n_reuse was cut
                                 from to the latest resume point whose window rows
                                 are held (kp_pfx_window_resume); 0: not cut */
    uint32_t state_cut_from;  /* > 0 (an index with states): the reuse the rows allowed
                                 (after any window cut), which n_reuse was cut from to
                                 the latest state snapshot at or before it; 0: not cut */
} kp_pfx_match_result;

/* Longest cached prefix of tokens[0..n). Read-only: no LRU touch, no stats,
 * so a report (kvpin doctor, cache report) does not disturb the cache. */
void kp_pfx_match(const kp_pfx_index *p, const int32_t *tokens, uint32_t n, kp_pfx_match_result *out);

/* Sets up the empty sequence *seq (all zero) to reuse the cached rows of
 * tokens[0..n_reuse): its block table references the index's blocks, except
 * that a partial last block (n_reuse % block_size != 0) is replaced by a
 * private copy, because the next position will be written into it. Then
 * seq->n_pos == n_reuse and the engine runs forward from position n_reuse.
 * *lease (may be NULL: no hold) receives a hold on the path. The copy may
 * need a free block: acquire then evicts unheld, unpinned LRU leaves (its own
 * path is held first); KP_EFULL if none is found, with nothing held or
 * referenced and *seq as it came. n_reuse 0: empty sequence, empty lease,
 * KP_OK.
 * KP_EINVAL: seq not empty, or tokens[0..n_reuse) not (or no longer) cached.
 * On success counts a lookup (a hit when n_reuse > 0) and touches the path
 * (LRU). With snapshots (kp_pfx_set_state) and n_reuse > 0 the path must
 * hold a snapshot at n_reuse (KP_EINVAL otherwise): seq->rstate receives a
 * copy of it (allocated here) and seq->rstate_pos = n_reuse. */
kp_status kp_pfx_acquire(kp_pfx_index *p, const int32_t *tokens, uint32_t n_reuse, kp_kvseq *seq,
                      kp_pfx_lease *lease, kp_error *err);

/* Indexes tokens[0..n) whose K/V rows are in seq's blocks (seq->n_pos >= n):
 * the part already cached is kept as it is (stored once), new positions get
 * references to seq's blocks, splitting an edge where the tokens diverge
 * mid-run. Inserting tokens already cached adds nothing. *n_added (may be
 * NULL) receives the number of newly indexed positions. When lease is not
 * NULL, it is moved to the inserted path (the sequence keeps running and
 * holds what it indexed); pass NULL for a finished sequence. The sequence is
 * borrowed and keeps its own references. KP_EINVAL if seq lacks positions or
 * blocks; KP_ENOMEM with the index unchanged. */
kp_status kp_pfx_insert(kp_pfx_index *p, const int32_t *tokens, uint32_t n, const kp_kvseq *seq,
                     kp_pfx_lease *lease, uint32_t *n_added, kp_error *err);

/* ---- recurrent-state snapshots (the top of this file) ---------------------- */

/* A snapshot of a sequence's recurrent state after position pos (it
 * summarizes tokens [0, pos)), in n_blocks pool blocks, one reference
 * each. A pending one (kp_pfx_state_save) is owned by its caller; {0}
 * (blocks NULL) is empty. */
typedef struct {
    uint32_t pos;
    uint32_t n_blocks;
    int32_t *blocks;
    uint64_t last_used; /* the index's clock at its creation or last resume */
} kp_pfx_state;

/* Turns snapshots on for a model whose recurrent state is state_bytes
 * bytes (0: off, the default). Only on an empty index: KP_EINVAL
 * otherwise. */
kp_status kp_pfx_set_state(kp_pfx_index *p, uint64_t state_bytes, kp_error *err);

/* Bytes of one state (0: no snapshots) and the pool blocks one takes. */
uint64_t kp_pfx_state_bytes(const kp_pfx_index *p);
uint32_t kp_pfx_state_blocks(const kp_pfx_index *p);

/* Copies state (kp_pfx_state_bytes bytes) after position pos into blocks
 * of its own: *out, pending, owned by the caller. When the pool is full it
 * evicts (kp_pfx_evict's order) and then gives up: KP_EFULL, *out empty;
 * KP_ENOMEM. KP_EINVAL without snapshots. */
kp_status kp_pfx_state_save(kp_pfx_index *p, const float *state, uint32_t pos, kp_pfx_state *out, kp_error *err);

/* Reads snapshot *s (pending or indexed, not empty) into state
 * (kp_pfx_state_bytes bytes): the state after position s->pos. */
void kp_pfx_state_load(const kp_pfx_index *p, const kp_pfx_state *s, float *state);

/* Drops a pending snapshot's blocks; *s becomes empty. No-op on an empty one. */
void kp_pfx_state_drop(kp_pfx_index *p, kp_pfx_state *s);

/* Hangs the pending snapshot *s on the path tokens[0..s->pos), which must
 * be cached (KP_ENOTFOUND otherwise, *s left to the caller); the index
 * takes its blocks and *s becomes empty. When the path holds a snapshot at
 * that position already, *s is dropped instead (stored once). KP_ENOMEM
 * leaves *s to the caller. */
kp_status kp_pfx_add_state(kp_pfx_index *p, const int32_t *tokens, kp_pfx_state *s, kp_error *err);

/* Reads the state of the snapshot the index holds at pos on the cached
 * path tokens[0..pos) into dst (kp_pfx_state_bytes bytes): false when it
 * holds none there (nothing written). Read-only: no LRU touch. */
bool kp_pfx_state_read(const kp_pfx_index *p, const int32_t *tokens, uint32_t pos, float *dst);

/* The latest resume point r' <= r for tokens[0..r) (cached): r itself
 * without snapshots, else the latest position with a snapshot on the path
 * (0 when none), combined with kp_pfx_window_resume. kp_pfx_match applies
 * it. */
uint32_t kp_pfx_resume(const kp_pfx_index *p, const int32_t *tokens, uint32_t r);

/* Pool blocks of the snapshots eviction may take (all but those at a
 * pinned node's end): for admission (engine.h's kp_eng_room_for). */
uint32_t kp_pfx_state_evictable_blocks(const kp_pfx_index *p);

/* Drops the hold of *lease and empties it. No-op on an empty lease. */
void kp_pfx_release(kp_pfx_index *p, kp_pfx_lease *lease);

/* Frees at least bytes_needed of pool memory if it can: first expires pins
 * whose ttl has passed at `now`, then evicts least-recently-used leaves that
 * no lease holds and no pin covers (a parent becomes a leaf when its last
 * child goes). Returns the bytes actually returned to the pool (blocks still
 * used by a sequence are not freed by evicting them). Each evicted run is
 * remembered for kp_pfx_match. Call it when kp_kvpool_alloc answers KP_EFULL. */
uint64_t kp_pfx_evict(kp_pfx_index *p, uint64_t bytes_needed, int64_t now);

/* Window rows (kvpool.h's window arena, with a window budget only; W =
 * the pool's window). A reuse of r positions resumes computing at r, and
 * the WINDOW layers' query at r reads positions r - W < p <= r: it needs
 * the window rows of [r - W + 1, r) in the blocks kp_pfx_acquire takes.
 * kp_pfx_window_resume answers the latest r' <= r (tokens[0..r) cached)
 * whose rows are held: when block j of that run lacks them, every r' in
 * (j * B, r] reads a row of it, so the next candidate is j * B (0 always
 * qualifies). Without a budget: r. kp_pfx_match applies it. */
uint32_t kp_pfx_window_resume(const kp_pfx_index *p, const int32_t *tokens, uint32_t r);

/* Drops the window rows of up to n_needed blocks that no running
 * sequence reads (every reference the index's or marked done: kvpool.h's
 * window readers), least recently used nodes first (of a path touched at
 * once, the shallowest first), sparing every block that reaches into the
 * W positions before an end: a leaf's depth, a pinned node's, a marked
 * one's (kp_pfx_mark) or a branch's, where prompts parted (a resume point
 * there, or one before it on a full hit, stays whole); when that is not
 * enough, a second pass gives up the windows before marked ends too (not
 * before leaves, pins, branches). Returns how many were dropped (their
 * slots are free). 0 without a window budget. */
uint32_t kp_pfx_drop_windows(kp_pfx_index *p, uint32_t n_needed);

/* out[b] (one byte per pool block) = 1 for each block whose window rows
 * kp_pfx_drop_windows could drop now (no running sequence reads them, not
 * before a leaf's, pin's or branch's end), else 0: for admission
 * (engine.h's kp_eng_room_for). All 0 without a budget. */
void kp_pfx_window_spare(kp_pfx_index *p, uint8_t *out);

/* Marks position n of the cached path tokens[0..n) as a resume point (a
 * message's start, a prompt's end: where a later prompt is likely to
 * leave this one): the run is split there if needed, and the node ending
 * at n is never merged into its child nor grown in place, so n stays an
 * end, and kp_pfx_drop_windows keeps the window rows before it while it
 * can (after the other ends' it gives them up first, oldest first) and
 * while the node lives (eviction takes it as any other).
 * Idempotent; n 0 is a no-op. KP_ENOTFOUND when tokens[0..n) is not
 * cached; KP_ENOMEM (nothing changed). */
kp_status kp_pfx_mark(kp_pfx_index *p, const int32_t *tokens, uint32_t n, kp_error *err);

/* Pins the cached prefix tokens[0..n) until kp_pfx_unpin(*id), or until
 * now + ttl_seconds (ttl 0: no expiry). A pinned path is never evicted.
 * KP_ENOTFOUND if the n tokens are not all cached; KP_EFULL if the pinned
 * bytes (kp_pfx_stats.pinned_bytes: what the pinned blocks hold, window
 * rows where kept) would exceed the configured cap; KP_EINVAL for n 0 or
 * ttl < 0. */
kp_status kp_pfx_pin(kp_pfx_index *p, const int32_t *tokens, uint32_t n, int64_t ttl_seconds, int64_t now,
                  uint64_t *id, kp_error *err);

/* Removes pin id. KP_ENOTFOUND if there is no such pin (expired or never made). */
kp_status kp_pfx_unpin(kp_pfx_index *p, uint64_t id, kp_error *err);

/* Removes every pin whose expiry time is <= now; returns how many. */
uint32_t kp_pfx_expire(kp_pfx_index *p, int64_t now);

/* The memory bill. Every byte count is in whole KV blocks; a block several
 * nodes or sequences share counts once. */
typedef struct {
    uint64_t budget_bytes;      /* the pool: n_blocks * block_bytes */
    uint64_t used_bytes;        /* blocks in use by the index or any sequence */
    uint64_t free_bytes;        /* budget - used */
    uint64_t block_bytes;
    uint64_t index_bytes;       /* blocks the index references */
    uint64_t pinned_bytes;      /* what pinned paths hold: their blocks' rows, window rows
                                   only of the blocks that have them (kvpool.h) */
    uint64_t pinned_cap_bytes;
    uint64_t shared_bytes;      /* index blocks that running sequences also use */
    uint64_t saved_bytes;       /* what those sequences would need more without sharing */
    uint32_t n_nodes;           /* tree nodes, root excluded */
    uint32_t n_leaves;          /* cached prefixes that end a path */
    uint32_t n_pins;
    uint32_t n_leases;
    uint64_t cached_tokens;     /* distinct indexed positions (sum of edge lengths) */
    uint64_t n_evictions;       /* nodes evicted since kp_pfx_new */
    uint64_t evicted_bytes;     /* bytes eviction returned to the pool */
    uint64_t n_lookups;         /* successful kp_pfx_acquire calls */
    uint64_t n_hits;            /* ... with n_reuse > 0 */
    uint64_t reused_tokens;     /* sum of n_reuse */
    uint32_t index_window_blocks; /* index blocks that hold their window rows */
    uint64_t window_drops;      /* blocks whose window rows kp_pfx_drop_windows dropped */
    uint32_t n_states;          /* recurrent-state snapshots the index holds */
    uint64_t state_bytes;       /* ... their blocks' bytes (part of index_bytes) */
    uint64_t state_evictions;   /* snapshots evicted alone (not with their leaf) */
} kp_pfx_stats;

void kp_pfx_get_stats(kp_pfx_index *p, kp_pfx_stats *out);

/* One node as kp_pfx_walk shows it. Pointers are borrowed for the callback only. */
typedef struct {
    const int32_t *path;        /* tokens[0..end) of the path to this node's end */
    uint32_t start, end;        /* this node's run is path[start..end) */
    const int32_t *blocks;      /* its block references, for block indexes */
    uint32_t first_block;       /*   first_block .. first_block + n_blocks - 1 */
    uint32_t n_blocks;
    uint32_t n_children;
    uint32_t n_holders;         /* leases on this node or below */
    uint32_t n_pins;            /* pins on this node or below */
    uint64_t last_used;         /* logical clock of the last touch */
    uint64_t hits;              /* acquires that reused part of this node */
} kp_pfx_node_info;

/* Returns nonzero to stop the walk. */
typedef int (*kp_pfx_walk_fn)(const kp_pfx_node_info *node, void *ctx);

/* Visits every node (root excluded) in preorder, children in token order.
 * KP_ENOMEM if the path buffer cannot grow. */
kp_status kp_pfx_walk(kp_pfx_index *p, kp_pfx_walk_fn fn, void *ctx, kp_error *err);

/* Leading tokens a cache listing shows of each prefix (its first words). */
#define KP_PFX_HEAD_TOKENS 24

/* A cached prefix (a leaf: a path that ends) for cache listings. */
typedef struct {
    uint64_t hash;       /* kp_pfx_hash of its tokens */
    uint32_t n_tokens;
    int32_t head[KP_PFX_HEAD_TOKENS]; /* its first n_head = min(n_tokens, KP_PFX_HEAD_TOKENS) tokens */
    uint32_t n_head;
    uint64_t bytes;      /* K/V bytes of all its positions (shared ancestors included) */
    uint64_t own_bytes;  /* bytes the index holds for this prefix alone */
    uint32_t n_holders;
    bool pinned;
    uint64_t last_used;
    uint64_t hits;
} kp_pfx_prefix_info;

/* Fills out[0..*n_out) with the largest cached prefixes (most tokens first;
 * equally long ones most recently used first), at most max. O(nodes).
 * KP_ENOMEM if the path buffer cannot grow. */
kp_status kp_pfx_top(kp_pfx_index *p, kp_pfx_prefix_info *out, uint32_t max, uint32_t *n_out, kp_error *err);

/* Verifies the index's invariants (tree links and depths, block counts, the
 * index's block references against the pool's refcounts, hold and pin
 * counts, the LRU list, the pinned cap). KP_OK, or KP_EFORMAT naming the
 * first broken invariant. For tests and debug builds: O(nodes + blocks). */
kp_status kp_pfx_check(kp_pfx_index *p, kp_error *err);

#endif
