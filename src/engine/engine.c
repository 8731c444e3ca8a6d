/*
 * engine.c - the engine (engine.h): KV pool + prefix index + forward pass,
 * one sequence at a time (kp_eng_prefill / kp_eng_decode / kp_eng_append,
 * and kp_eng_generate, the synchronous generation loop over a kp_gen) or
 * many sequences per forward call (kp_eng_begin + kp_eng_step, for a
 * scheduler), and the cache operations on the index it owns (top, pin,
 * unpin, expire, probe, the memory bill).
 *
 * Owns: the kp_kvpool (budget_bytes / block_bytes blocks), the kp_pfx_index
 * over it (or none), the kp_forward scratch, batch and step scratch.
 * Borrows: model, threads, kernels. The caller owns each kp_eng_seq (its
 * block table and lease) and each kp_gen.
 *
 * Prefill of tokens[0..n) against the index:
 *
 *   tokens   | 0 ........ n_reuse-1 | n_reuse ............ n-1 |
 *   source   | cached rows (acquire)| forward pass, batches of  |
 *            | shared blocks, a     | ENG_BATCH tokens (or the  |
 *            | private copy of the  | caller's batch), logits   |
 *            | partial last block   | of the last token only    |
 *
 *   n_reuse = match.n_reuse: the whole match, or n - 1 on a full hit (the
 *   last position is computed again to get its logits).
 *
 *   Sliding-window layers (model.h, layer kinds). By default (no window
 *   budget) a block holds the K/V of every layer for its positions, WINDOW
 *   layers included (kvpool.h: a window slot per block), so the rows any
 *   suffix's window reads are in the cached blocks, whatever n_reuse is:
 *   reuse is exact at any divergence point, at the price of keeping the
 *   WINDOW layers' rows of positions older than the window.
 *
 *   With a window budget (kp_eng_config.window_budget_bytes) the WINDOW
 *   layers' rows live in a window arena of that many bytes, apart from the
 *   blocks (kvpool.h), and are kept only where a resume point needs them:
 *
 *     positions   0 ....... 16 ....... 32 ....... 48 ....... 64 ... 80 (leaf end)
 *     full rows   [ blk 0  ][ blk 1  ][ blk 2  ][ blk 3  ][ blk 4  ]  always
 *     window rows    --        --        --        --    [ slot 7 ]  W = 16
 *
 *   - a sequence attaches window slots to the blocks a forward call writes
 *     (window_rows) and, after it, drops those of its own blocks (no one
 *     else references them) that lie wholly W or more positions before its
 *     length (window_trim): a query at q >= n reads q - W < p <= q only.
 *     Once past its prompt's end (seq->prompt_end: the next turn diverges
 *     there when the answer is not sent back as it was) it hands the
 *     prompt's path to the index (hand_resume_points: kp_pfx_insert with
 *     its lease, which a running sequence may call), so the window before
 *     it, and its copy of the block it resumed in (seq->reused: a prompt
 *     diverging just past the previous turn's end reads it), are the
 *     index's, kept as before a leaf's end. So a running sequence holds
 *     at most W positions (plus the block they start in and the batch it
 *     computes) of window rows beyond what the index keeps
 *     (kp_eng_seq_window_slots counts them), not a second window for its
 *     prompt's end while it generates a long answer; until it is past
 *     that end it keeps those blocks itself (near_resume_point). To hand
 *     it over it keeps its tokens (seq->toks) under a budget;
 *   - a prompt rendered from messages has more resume points: where each
 *     message starts (kp_eng_begin_msgs; the chat endpoints find them,
 *     serve/prompt.c), where a later prompt that edits or drops that
 *     message leaves this one. The sequence keeps the window before each
 *     until it passes it, then hands the path up to it to the index and
 *     marks it (kp_pfx_mark: the node stays an end, and
 *     kp_pfx_drop_windows spares the window before it, giving those up
 *     first, oldest first, when the arena is short), so an edit of an
 *     earlier message resumes at that message's start, or later, instead
 *     of at the prompt's end before it; the prompt's end is marked too;
 *   - when the window arena is full, window_rows asks the index to drop
 *     the window rows of cached blocks no running sequence reads (a
 *     sequence marks its references to the blocks behind its window
 *     done: kvpool.h's window readers, kp_kvseq.win_done) and no resume
 *     point needs (kp_pfx_drop_windows: a block is needed when it reaches
 *     into the W positions before a leaf's end, a pin's end or a branch,
 *     where a conversation's next turn left the previous answer, and,
 *     until nothing else is left, before a marked one), least recently
 *     used first, then evicts, then lets go of its lease. Where a
 *     sequence resumed is marked at once (a branch once it hands its
 *     prompt over), so the window before it stays while the arena can;
 *   - the match (kp_pfx_match, kp_pfx_window_resume) reuses up to the
 *     latest position p <= d (d the divergence, n - 1 on a full hit) such
 *     that the rows of [p - W + 1, p) are held; report.window_cut_from
 *     says where the tokens matched, and the cache report's cause is
 *     window_evicted. Outputs stay those of a recomputation: no query ever
 *     reads a dropped row (kvpool.h asserts it).
 *
 *   Tiers: a record holds a whole block, window rows included, so a
 *   sequence queues a block to the tiers before it drops its window rows
 *   (window_trim: its rows are final by then), and a finished sequence (a
 *   pinned path) publishes the blocks that still hold them: the tiers get
 *   every block, as without a budget; a restored block gets a slot first.
 *   Admission (below) counts window slots too (free_slots, spare_slots,
 *   kp_eng_window_need), so a scheduler admits only what the window arena
 *   can serve; a step item that still finds no window slot gets KP_EFULL
 *   as one that finds no block does. A fork of a prefix whose window rows
 *   the source dropped is refused (KP_EFULL).
 *
 * A step (kp_eng_step) packs the items' tokens into one kp_batch, items in
 * order, each item's tokens at consecutive positions from its sequence's
 * length; items that cannot get blocks or are invalid are left out with
 * their own status, the others still run:
 *
 *   batch  | seq A: 1 decode token | seq B: 1 decode token | seq C: prefill chunk of 200 |
 *   logits |        yes            |        yes            | last token only, if asked   |
 *
 * Logit rows come back in batch order; an item with all_logits asks for a
 * row per token. When one item asks, the forward pass writes its rows in
 * place; with several they go through step_logits and are copied out.
 *
 * Admission (kp_eng_room_for): what a prefill would take and what the pool
 * could give it, counted the way reserve() and kp_pfx_acquire take blocks:
 *
 *   need      = ceil(n / B) - reused / B   (the partial block's copy counts)
 *   free      = the pool's free list
 *   evictable = blocks every reference of which is held by an index node
 *               that no lease holds and no pin covers (refcount == those
 *               references: eviction would return it), less the blocks the
 *               prefill itself shares; with hold_path, the nodes on its
 *               own path count as held
 *
 * kp_pfx_evict takes exactly such nodes (leaves first, a parent when its
 * last child went), so free + evictable is what a reserve can reach.
 * Under a window budget, window slots alike: free_slots, and spare_slots,
 * the blocks with window rows that window_rows can get back: those
 * kp_pfx_drop_windows may drop (the index's alone, not before a leaf's,
 * pin's or branch's end: kp_pfx_window_spare) or eviction frees (the
 * evictable blocks above), less the blocks the prefill shares. What a
 * sequence takes at most is kp_eng_window_need (its window, a chunk, the
 * block the window starts in, its resume copy, and the window before its
 * prompt's end, which the index keeps for it while it runs; those before
 * its messages' starts are marked ends the index gives up first, the
 * sequence's own references to them not counting once it handed them
 * over: window_rows).
 *
 * Forks (kp_eng_fork, n choices of one prompt): the new sequence takes a
 * reference to every whole block of the source and a private copy of its
 * partial last block, so both append into blocks of their own and (V) of
 * prefix.h holds; it has no lease (its references keep its rows).
 *
 *   source | blk 0 | blk 1 | blk 2 (rows 0..4 of 16) |
 *   fork   | blk 0 | blk 1 | copy of blk 2           |   blocks 0, 1: refcount + 1
 *
 * kp_eng_fork_prefix does the same for the first n positions of the
 * source only (a request reusing the prompt another running sequence is
 * computing): the blocks below n / B shared, the one holding n - 1 copied
 * when n % B != 0; the source goes on writing past n in its own blocks.
 *
 * Tiers below RAM (kp_eng_open_tiers; tiers.h), three calls:
 *
 *   kp_eng_begin   after the RAM match: tier_restore takes the prompt's next
 *                  whole blocks from disk / Redis, verified, into blocks of
 *                  the sequence's own (never past position n - 1); for a
 *                  recurrent model tier_restore_state, up to the latest
 *                  snapshot the tiers hold (below)
 *   kp_eng_finish  kp_tiers_publish queues every full block the tiers lack,
 *                  then tier_publish_states the snapshots handed to the index
 *   kp_eng_pin     tier_pin_publish does the same for the pinned path (and
 *                  the snapshot at its end)
 *
 * Eviction itself is unchanged: an evicted block was written when its
 * sequence finished.
 *
 * kp_eng_generate: prefill (through the index) or append the rest of the
 * prompt, then kp_gen_step on the newest logits and kp_eng_decode of the
 * token it sampled, until the gen says it ended; the sequence stays with
 * the caller (finish, abort or keep).
 *
 * Recurrent layers (a hybrid model, model.h's Hybrid: qwen35): state
 * checkpoints. A sequence's recurrent state (kvpool.h's kp_kvseq.rstate)
 * summarizes every position before it and cannot be cut back, so cached
 * K/V rows alone cannot resume it: the prefix index also keeps snapshots
 * of whole states (prefix.h's top: in pool blocks, on the node whose run
 * holds their position), and a reuse resumes only where one is:
 *
 *   cached path   0 ... 256 ...... 512 ... 600 (prompt end) ... 700 (answer end)
 *   snapshots           @256       @512    @600                 @700
 *   next prompt   shares 0..640, then differs
 *   -> match 640, resume at 600: rows 0..599 + the state @600,
 *      computed 600..: reused_tokens 600, state_recomputed_tokens 40
 *
 * Where a sequence snapshots its state (take_state, after a forward call,
 * into blocks of its own: pending, kp_eng_seq.snaps): every state_every
 * positions (kp_eng_config.state_every, --state-every), at its prompt's end
 * (where the next turn resumes when the answer it is sent back differs)
 * and at its end (kp_eng_finish: where the next turn resumes when it
 * extends prompt + answer). A state exists only where a forward call ends,
 * so run_tokens cuts its calls at those positions and a scheduler cuts its
 * prefill chunks with kp_eng_chunk (a decode step ends everywhere).
 * kp_eng_finish indexes the tokens, then hands the pending snapshots to the
 * index (kp_pfx_add_state; one already there at a position wins). A pin
 * needs one at its end: kp_eng_pin computes it when missing, from the
 * latest snapshot before it (pin_state).
 *
 * Memory: a snapshot takes kp_pfx_state_blocks pool blocks, so it is in
 * the budget and the bill (kp_eng_stats.n_states, index_state_bytes); the
 * default budget has room for one max_pos sequence's snapshots too. A
 * pending snapshot that finds no room (after eviction) is skipped, and a
 * sequence short of blocks for its rows drops its own pending snapshots
 * before it gives up (reserve): snapshots only ever save work. Eviction
 * takes snapshots by the blocks' LRU policy (prefix.c's evict_lru), so a
 * node can keep its rows and lose its snapshot: reuse then resumes at an
 * earlier one. Admission (kp_eng_room_for) counts the index's snapshots
 * as evictable and a prefill's own pending ones not at all (optional).
 *
 * Below RAM (kp_eng_open_tiers) the snapshots go where the blocks go
 * (tiers.h, staterec.h: a snapshot's record carries the rows of the
 * partial block it ends in): written at kp_eng_finish and at a pin, and a
 * prefill resumes at the latest one a tier holds past its RAM match, the
 * whole blocks before it restored too (tier_restore_state draws it).
 *
 * A fork of a shorter prefix of a running sequence (the scheduler's
 * in-flight prefixes) takes the state where the source holds one: its
 * own at its length, or a pending snapshot it took as it passed a state
 * point (kp_eng_fork_point; the scheduler parks a request on the latest
 * state point within the shared prefix, kp_eng_fork_ahead, and the
 * follower computes the rest of the shared part). The forward pass itself
 * refuses a batch that does not continue a sequence's state, so no path
 * can pair K/V rows with the wrong state; a resume hands the sequence a
 * snapshot's copy with rstate_pos = the reuse (kp_pfx_acquire).
 *
 * Invariants:
 *   - a sequence only ever writes positions >= its n_pos at acquire time
 *     (prefix.h's contract): prefill appends from n_reuse, decode appends at
 *     n_pos, nothing rewinds (kp_eng_seq_truncate exists only without an
 *     index, where no block is shared);
 *   - blocks are reserved before every forward call; when the pool answers
 *     KP_EFULL the engine asks kp_pfx_evict for exactly the missing blocks and
 *     retries; when nothing unheld is left it drops the sequence's own lease
 *     (a lease holds whole nodes, also cached rows past the ones the
 *     sequence uses) and tries once more, and gives up (KP_EFULL) only then.
 *     Eviction never takes rows a sequence reads: the sequence holds its own
 *     reference to every block in its table;
 *   - kp_eng_finish indexes only positions that have K/V (min(n, n_pos)), then
 *     drops the lease and every block reference of the sequence: once all
 *     sequences are finished and the index is freed, every block is free.
 */
#include "engine/engine.h"

#include "base/buf.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENG_BATCH 256 /* prompt tokens per forward call */

struct kp_engine {
    const kp_model *m;
    kp_kvpool *kv;
    kp_pfx_index *idx; /* NULL: prefix cache off */
    kp_tiers *tiers;   /* NULL: RAM only (kp_eng_open_tiers) */
    kp_forward *fw;
    kp_threads *threads;  /* borrowed: the forward pass's, also the disk tier's parallel restore */
    uint32_t max_pos;
    bool recurrent;        /* the model has recurrent layers: state snapshots (the top of this file) */
    uint32_t state_every;  /* ... every this many positions */
    kp_pfx_config pfx_cfg; /* kept for kp_eng_clear */
    bool has_pfx_cfg;
    /* kp_eng_step and run_tokens scratch, grown on demand */
    uint32_t step_cap, step_seq_cap;
    int32_t *step_tok, *step_pos, *step_seq;
    uint8_t *step_want;
    kp_kvseq **step_seqs;
    uint32_t step_logit_cap;
    float *step_logits; /* [step_logit_cap][n_vocab] */
    /* kp_eng_room_for scratch, one entry per pool block */
    uint64_t packed_bytes; /* repacked weight copies (kp_forward_pack_weights) */
    const kp_attn_kernels *attn; /* the forward pass's attention table */
    bool attn_bf16;        /* ... of the BF16 precision */
    uint32_t *room_refs;  /* references from nodes eviction could take */
    uint8_t *room_spare;  /* window rows the index could drop (kp_pfx_window_spare) */
    int32_t *room_shared; /* the blocks the prefill would share, by block index */
};

uint64_t kp_eng_state_room(const kp_model *m, kp_dtype k, kp_dtype v, uint32_t block_size, uint32_t max_pos,
                           uint32_t state_every) {
    uint64_t state_bytes = kp_model_rec_state_floats(&m->hp) * sizeof(float);
    if (!state_bytes) return 0;
    if (!block_size) block_size = 16;
    if (!state_every) state_every = (256 + block_size - 1) / block_size * block_size;
    uint64_t bb = kp_model_kv_bytes_per_token_kv(&m->hp, k, v) * block_size;
    if (!bb) return 0;
    return ((uint64_t)max_pos / state_every + 2) * ((state_bytes + bb - 1) / bb) * bb;
}

kp_status kp_eng_new(kp_engine **out, const kp_model *m, kp_threads *threads, const kp_kernels *kernels,
                  const kp_eng_config *cfg, kp_error *err) {
    *out = NULL;
    kp_eng_config c = {KP_DTYPE_F16, 16, 0, 0, false, NULL, KP_DTYPE_F16, false, 0, 0};
    if (cfg) c = *cfg;
    if (!c.block_size) c.block_size = 16;
    if (!c.state_every) c.state_every = (256 + c.block_size - 1) / c.block_size * c.block_size;
    if (c.no_prefix_cache) c.window_budget_bytes = 0; /* window rows are kept for the cache only */
    if (!c.max_pos) c.max_pos = m->hp.n_ctx_train && m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    kp_dtype vt = c.kv_type_v;
    kp_status cst = kp_kvpool_check_type(c.kv_type, m->hp.head_dim, "K", err);
    if (cst == KP_OK) cst = kp_kvpool_check_type(vt, m->hp.head_dim, "V", err);
    if (cst != KP_OK) return cst;
    uint64_t per_tok = kp_model_kv_bytes_per_token_kv(&m->hp, c.kv_type, vt);
    uint64_t block_bytes = per_tok * c.block_size;
    uint64_t state_bytes = kp_model_rec_state_floats(&m->hp) * sizeof(float);
    if (!c.budget_bytes) { /* room for max_pos positions, and the window arena apart */
        c.budget_bytes = ((uint64_t)c.max_pos + c.block_size - 1) / c.block_size * block_bytes +
                         (m->hp.n_swa_layers ? c.window_budget_bytes : 0);
        if (!c.no_prefix_cache) /* and the snapshots of one such sequence */
            c.budget_bytes += kp_eng_state_room(m, c.kv_type, vt, c.block_size, c.max_pos, c.state_every);
    }
    if (c.budget_bytes < block_bytes)
        return kp_fail(err, KP_EINVAL, "KV budget of %llu bytes is smaller than one block (%llu bytes)",
                       (unsigned long long)c.budget_bytes, (unsigned long long)block_bytes);
    kp_engine *e = calloc(1, sizeof *e);
    if (!e) return kp_fail(err, KP_ENOMEM, "out of memory for the engine");
    e->m = m;
    e->max_pos = c.max_pos;
    e->recurrent = m->hp.n_rec_layers > 0;
    e->state_every = c.state_every;
    if (c.pfx) {
        e->pfx_cfg = *c.pfx;
        e->has_pfx_cfg = true;
    }
    kp_status st = KP_ENOMEM;
    uint8_t *window_layers = calloc(m->hp.n_kv_layer, 1);
    if (!window_layers) {
        st = kp_fail(err, KP_ENOMEM, "out of memory for the engine");
        goto fail;
    }
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        if (m->layers[l].kind != KP_LAYER_RECURRENT) window_layers[m->layers[l].kv_layer] = m->layers[l].kind == KP_LAYER_WINDOW;
    kp_kvpool_config kc = {m->hp.n_kv_layer, m->hp.n_head_kv, m->hp.head_dim, c.kv_type, c.block_size,
                           c.budget_bytes, vt, window_layers, m->hp.n_swa, c.window_budget_bytes};
    st = kp_kvpool_new(&e->kv, &kc, err);
    free(window_layers);
    if (st != KP_OK) goto fail;
    if (kp_kvpool_window_budgeted(e->kv)) {
        /* a forward call writes the window rows of a whole batch and reads the window before
         * it, while the cache keeps the window before the end it resumed from */
        uint32_t B = c.block_size, min_slots = (ENG_BATCH + 2 * m->hp.n_swa + B - 1) / B + 2;
        if (kp_kvpool_n_slots(e->kv) < min_slots) {
            st = kp_fail(err, KP_EINVAL,
                         "a window budget of %llu bytes holds the window rows of %u blocks; a batch of %u "
                         "positions and twice the window of %u before it need %u (%llu bytes)",
                         (unsigned long long)c.window_budget_bytes, kp_kvpool_n_slots(e->kv), ENG_BATCH,
                         m->hp.n_swa, min_slots, (unsigned long long)min_slots * kp_kvpool_window_bytes(e->kv));
            goto fail;
        }
    }
    if (!c.no_prefix_cache && (st = kp_pfx_new(&e->idx, e->kv, c.pfx, err)) != KP_OK) goto fail;
    if (e->idx && (st = kp_pfx_set_state(e->idx, state_bytes, err)) != KP_OK) goto fail;
    e->threads = threads;
    if ((st = kp_forward_new(&e->fw, m, e->kv, threads, kernels, err)) != KP_OK) goto fail;
    e->attn = kp_forward_set_attn(e->fw, KP_ATTN_F32);
    if (!c.no_repack && (st = kp_forward_pack_weights(e->fw, &e->packed_bytes, err)) != KP_OK) goto fail;
    *out = e;
    return KP_OK;
fail:
    kp_eng_free(e);
    return st;
}

void kp_eng_free(kp_engine *e) {
    if (!e) return;
    kp_tiers_free(e->tiers);
    kp_forward_free(e->fw);
    kp_pfx_free(e->idx);
    kp_kvpool_free(e->kv);
    free(e->step_tok);
    free(e->step_pos);
    free(e->step_seq);
    free(e->step_want);
    free(e->step_seqs);
    free(e->step_logits);
    free(e->room_refs);
    free(e->room_shared);
    free(e->room_spare);
    free(e);
}

uint32_t kp_eng_max_pos(const kp_engine *e) { return e->max_pos; }

/* True when seq snapshots its state at position pos (the top of this file). */
static bool state_point(const kp_engine *e, const kp_eng_seq *seq, uint32_t pos) {
    return pos > 0 && (pos % e->state_every == 0 || pos == seq->prompt_end);
}

uint32_t kp_eng_chunk(const kp_engine *e, const kp_eng_seq *seq, uint32_t n) {
    if (!e->recurrent || !e->idx || n <= 1) return n;
    uint32_t p = seq->kv.n_pos, k = 1;
    while (k < n && !state_point(e, seq, p + k)) k++;
    return k;
}

/* Drops a pending snapshot (pool references of the sequence's own). */
static void state_drop(kp_engine *e, kp_pfx_state *sn) {
    for (uint32_t i = 0; i < sn->n_blocks; i++) kp_kvpool_unref(e->kv, sn->blocks[i]);
    free(sn->blocks);
    memset(sn, 0, sizeof *sn);
}

static void states_drop(kp_engine *e, kp_eng_seq *seq) {
    for (uint32_t i = 0; i < seq->n_snaps; i++) state_drop(e, &seq->snaps[i]);
    free(seq->snaps);
    seq->snaps = NULL;
    seq->n_snaps = seq->cap_snaps = 0;
}

/* After a forward call: snapshots seq's state when it stands at a state
 * point (or anywhere with force), as a pending snapshot of its own. Not
 * where it resumed (the index has that one), nor twice. No room (after
 * eviction) or no memory: skipped, a snapshot only saves work. */
static void take_state(kp_engine *e, kp_eng_seq *seq, bool force) {
    uint32_t pos = seq->kv.n_pos;
    if (!e->recurrent || !e->idx || !seq->kv.rstate || seq->kv.rstate_pos != pos || pos == 0) return;
    if (!force && !state_point(e, seq, pos)) return;
    if (pos == seq->reused || (seq->n_snaps && seq->snaps[seq->n_snaps - 1].pos >= pos)) return;
    if (!kp_grow_u32((void **)&seq->snaps, &seq->cap_snaps, seq->n_snaps + 1, sizeof *seq->snaps)) return;
    if (kp_pfx_state_save(e->idx, seq->kv.rstate, pos, &seq->snaps[seq->n_snaps], NULL) == KP_OK) seq->n_snaps++;
}

/* Hands seq's pending snapshots at positions <= n to the index (the path
 * tokens[0..n) is indexed); drops the rest and those it refuses. */
static void hand_states(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n) {
    for (uint32_t i = 0; i < seq->n_snaps; i++) {
        kp_pfx_state *sn = &seq->snaps[i];
        if (sn->pos > n || !e->idx || kp_pfx_add_state(e->idx, tokens, sn, NULL) != KP_OK) state_drop(e, sn);
    }
    seq->n_snaps = 0;
}
bool kp_eng_recurrent(const kp_engine *e) { return e->recurrent; }

uint32_t kp_eng_fork_point(const kp_engine *e, const kp_eng_seq *src, uint32_t n) {
    if (n > src->kv.n_pos) n = src->kv.n_pos;
    if (!e->recurrent) return n;
    uint32_t best = 0;
    if (src->kv.rstate && src->kv.rstate_pos == n) return n;
    for (uint32_t i = 0; i < src->n_snaps; i++)
        if (src->snaps[i].pos <= n && src->snaps[i].pos > best) best = src->snaps[i].pos;
    return best;
}

uint32_t kp_eng_fork_ahead(const kp_engine *e, const kp_eng_seq *src, uint32_t n) {
    if (!e->recurrent) return n;
    uint32_t at = kp_eng_fork_point(e, src, n);
    if (!e->idx || n <= src->kv.n_pos) return at;
    /* the state points src has still to reach: it snapshots there as it passes */
    uint32_t p = n / e->state_every * e->state_every;
    if (src->prompt_end <= n && src->prompt_end > p) p = src->prompt_end;
    return p > src->kv.n_pos && p > at ? p : at;
}
uint32_t kp_eng_seq_len(const kp_eng_seq *seq) { return seq->kv.n_pos; }

uint32_t kp_eng_seq_blocks_missing(const kp_engine *e, const kp_eng_seq *seq, uint32_t n_pos) {
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
    uint32_t nb = (uint32_t)(((uint64_t)n_pos + B - 1) / B);
    return nb > seq->kv.n_blocks ? nb - seq->kv.n_blocks : 0;
}

uint32_t kp_eng_seq_window_slots(const kp_engine *e, const kp_eng_seq *seq) {
    if (!kp_kvpool_window_budgeted(e->kv)) return 0;
    uint32_t n = 0;
    for (uint32_t j = 0; j < seq->kv.n_blocks; j++)
        n += kp_kvpool_refcount(e->kv, seq->kv.blocks[j]) == 1 && kp_kvpool_has_window(e->kv, seq->kv.blocks[j]);
    return n;
}

/* The blocks the window before a position reaches into, at most. */
static uint32_t window_blocks(const kp_engine *e) {
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, W = kp_kvpool_config_of(e->kv)->window;
    return (W + B - 1) / B + 1;
}

uint32_t kp_eng_window_peak_blocks(uint32_t W, uint32_t B, uint32_t chunk) {
    return (W + chunk + B - 1) / B + 2 + (W + B - 1) / B + 1;
}

uint32_t kp_eng_window_need(const kp_engine *e, uint32_t chunk) {
    if (!kp_kvpool_window_budgeted(e->kv)) return 0;
    const kp_kvpool_config *kc = kp_kvpool_config_of(e->kv);
    return kp_eng_window_peak_blocks(kc->window, kc->block_size, chunk);
}

uint32_t kp_eng_seq_window_need(const kp_engine *e, const kp_eng_seq *seq, uint32_t chunk) {
    if (!kp_kvpool_window_budgeted(e->kv)) return 0;
    /* once its prompt's end is handed over, the window before it is the index's (held) */
    uint32_t need = kp_eng_window_need(e, chunk), held = kp_eng_seq_window_slots(e, seq);
    if (seq->prompt_end && seq->handed >= seq->prompt_end) held += window_blocks(e);
    return need > held ? need - held : 0;
}

/* Makes sure positions [0, n_pos) of s have blocks, evicting unheld cached
 * prefixes when the pool is full. */
static kp_status reserve(kp_engine *e, kp_eng_seq *seq, uint32_t n_pos, kp_eng_report *r, kp_error *err) {
    kp_kvseq *s = &seq->kv;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
    for (;;) {
        kp_status st = kp_kvseq_reserve(s, e->kv, n_pos, err);
        if (st != KP_EFULL) return st;
        uint32_t need = (uint32_t)(((uint64_t)n_pos + B - 1) / B) - s->n_blocks;
        uint64_t got = e->idx ? kp_pfx_evict(e->idx, (uint64_t)need * kp_kvpool_block_bytes(e->kv),
                                          (int64_t)time(NULL))
                              : 0;
        if (r) {
            r->evictions++;
            r->evicted_bytes += got;
        }
        if (got == 0 && seq->lease.node) {
            /* Everything evictable is on our own held path (a lease holds a
             * whole node, also the part past the rows we use). Our rows stay
             * valid without it: the sequence holds its own block references. */
            kp_pfx_release(e->idx, &seq->lease);
            continue;
        }
        if (got == 0 && seq->n_snaps) { /* our own pending snapshots: rows come first */
            states_drop(e, seq);
            continue;
        }
        if (got == 0)
            return kp_fail(err, KP_EFULL,
                           "KV budget full: %u positions need %u more blocks of %u and nothing cached "
                           "can be evicted (raise --kv-budget)",
                           n_pos, need, B);
    }
}

static void window_trim(kp_engine *e, kp_eng_seq *seq);

/* With a window budget (kvpool.h): gives the blocks of positions
 * [p0, p1) of seq window slots before a forward call writes them. When the
 * window arena is full: the window rows the index can spare
 * (kp_pfx_drop_windows), then eviction, then the sequence's own lease, as
 * reserve() does for blocks. */
static kp_status window_rows(kp_engine *e, kp_eng_seq *seq, uint32_t p0, uint32_t p1, kp_error *err) {
    if (!kp_kvpool_window_budgeted(e->kv) || p1 <= p0) return KP_OK;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
    /* what it will not read again is given up first: a sequence that just
     * took a long prefix from the index holds it all as a reader until then,
     * and would otherwise push the index to evict (and forget the resume
     * points of) the very path it came from */
    window_trim(e, seq);
    for (uint32_t j = p0 / B; j <= (p1 - 1) / B; j++) {
        for (;;) {
            kp_status st = kp_kvpool_attach_window(e->kv, seq->kv.blocks[j], err);
            if (st != KP_EFULL) {
                if (st != KP_OK) return st;
                break;
            }
            uint32_t need = (p1 - 1) / B - j + 1;
            if (e->idx && kp_pfx_drop_windows(e->idx, need)) continue;
            if (e->idx && kp_pfx_evict(e->idx, kp_kvpool_block_bytes(e->kv), (int64_t)time(NULL))) continue;
            if (e->idx && seq->lease.node) {
                kp_pfx_release(e->idx, &seq->lease);
                continue;
            }
            return kp_fail(err, KP_EFULL,
                           "window budget full: positions %u..%u need window rows and nothing cached can spare "
                           "them (raise --window-budget)",
                           p0, p1 - 1);
        }
    }
    return KP_OK;
}

/* The i-th resume point of seq (i <= n_starts): its messages' starts,
 * then its prompt's end (0 when it has none). */
static uint32_t resume_point(const kp_eng_seq *seq, uint32_t i) {
    return i < seq->n_starts ? seq->starts[i] : seq->prompt_end;
}

/* True when block j of seq reaches into the W positions before one of its
 * resume points, or is its copy of the block it resumed in (a prompt
 * diverging just past the previous turn's end reads it). */
static bool near_resume_point(const kp_eng_seq *seq, uint32_t j, uint32_t B, uint32_t W) {
    if (seq->reused % B && j == seq->reused / B) return true;
    for (uint32_t i = 0; i <= seq->n_starts; i++) {
        uint32_t r = resume_point(seq, i);
        if (r && j * B < r && (j + 1) * B + W > r) return true;
    }
    return false;
}

/* With a window budget: drops the window rows of seq's own blocks (no one
 * else references them) that no query of it will read again: a query at
 * q >= n_pos reads positions > q - W, so block j is done once
 * (j + 1) * B <= n_pos - W (the W positions before n_pos stay, so a
 * resume point at its end, or one before, stays whole once indexed), but
 * those near a resume point (near_resume_point; once the sequence passed
 * it, hand_resume_points gives them to the index). With tiers below RAM
 * every block that falls behind the window is queued to them once
 * (seq->tier_done; whole, window rows included: its rows are final), its
 * own and those it handed to the index alike, before its window rows can
 * go, so what RAM drops is on disk. */
static void window_trim(kp_engine *e, kp_eng_seq *seq) {
    if (!kp_kvpool_window_budgeted(e->kv)) return;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, W = kp_kvpool_config_of(e->kv)->window;
    uint32_t n = seq->kv.n_pos;
    if (n < W + B) return;
    uint32_t behind = (n - W) / B; /* the blocks wholly W or more positions behind n */
    if (behind > seq->kv.n_blocks) behind = seq->kv.n_blocks;
    /* to the tiers first, each block once, shared ones too: the index may drop the window
     * rows of a block this sequence handed it (kp_pfx_drop_windows) before anyone publishes it */
    if (e->tiers && behind > seq->tier_done && seq->n_toks >= behind * B) {
        kp_tiers_publish_range(e->tiers, seq->toks, seq->tier_done, behind, &seq->kv);
        seq->tier_done = behind;
    }
    for (uint32_t j = 0; j < behind; j++) {
        int32_t b = seq->kv.blocks[j];
        if (kp_kvpool_refcount(e->kv, b) == 1 && !near_resume_point(seq, j, B, W)) kp_kvpool_drop_window(e->kv, b);
    }
    /* it reads their window rows no more: the index may drop those of the ones it shares */
    for (; seq->kv.win_done < behind; seq->kv.win_done++)
        kp_kvpool_window_done(e->kv, seq->kv.blocks[seq->kv.win_done]);
}

/* With a window budget, after a forward call: hands the path up to every
 * resume point seq went past (its messages' starts, its prompt's end) to the
 * index, with its lease (kp_pfx_insert, which a running sequence may
 * call: it appends only past them), and marks it (kp_pfx_mark), so the
 * window rows before it are the index's, kept as before an end, and the
 * sequence holds no more than its own window beyond them. Best effort: a
 * failure leaves the rows to the sequence (near_resume_point). */
static void hand_resume_points(kp_engine *e, kp_eng_seq *seq) {
    if (!e->idx || !seq->toks) return;
    for (uint32_t i = 0; i <= seq->n_starts; i++) {
        uint32_t r = resume_point(seq, i);
        if (r <= seq->handed) continue;
        if (r >= seq->kv.n_pos || r > seq->n_toks) break; /* not passed yet (a prompt computed and
                                                             * aborted leaves nothing indexed) */
        if (kp_pfx_insert(e->idx, seq->toks, r, &seq->kv, &seq->lease, NULL, NULL) == KP_OK)
            kp_pfx_mark(e->idx, seq->toks, r, NULL);
        seq->handed = r;
    }
}

/* After a forward call fed tokens[0..m) at positions [p, p + m): a
 * sequence that keeps its tokens (a window budget) remembers those past
 * the ones it knew. Out of memory: it stops remembering (nothing past is
 * handed to the index or the tiers early). */
static void seq_fed(kp_eng_seq *seq, uint32_t p, const int32_t *tokens, uint32_t m) {
    if (!seq->toks || p > seq->n_toks || p + m <= seq->n_toks) return;
    uint32_t k = seq->n_toks - p;
    if (!kp_grow_u32((void **)&seq->toks, &seq->cap_toks, p + m, sizeof *seq->toks)) return;
    memcpy(seq->toks + seq->n_toks, tokens + k, (size_t)(m - k) * sizeof *seq->toks);
    seq->n_toks = p + m;
}

/* What a sequence does after each forward call under a window budget. */
static void window_after(kp_engine *e, kp_eng_seq *seq, uint32_t p, const int32_t *tokens, uint32_t m) {
    if (!kp_kvpool_window_budgeted(e->kv)) return;
    seq_fed(seq, p, tokens, m);
    window_trim(e, seq);
    hand_resume_points(e, seq);
}

uint32_t kp_eng_fork_blocks(const kp_engine *e, uint32_t n_pos) {
    return n_pos % kp_kvpool_config_of(e->kv)->block_size ? 1 : 0;
}

kp_status kp_eng_fork(kp_engine *e, const kp_eng_seq *src, kp_eng_seq *dst, kp_error *err) {
    return kp_eng_fork_prefix(e, src, src->kv.n_pos, dst, err);
}

uint32_t kp_eng_block_size(const kp_engine *e) { return kp_kvpool_config_of(e->kv)->block_size; }

kp_status kp_eng_fork_prefix(kp_engine *e, const kp_eng_seq *src, uint32_t n, kp_eng_seq *dst, kp_error *err) {
    if (dst->kv.n_pos || dst->kv.n_blocks || dst->lease.node)
        return kp_fail(err, KP_EINVAL, "fork into a sequence that is not empty");
    if (n > src->kv.n_pos)
        return kp_fail(err, KP_EINVAL, "fork of %u positions from a sequence of %u", n, src->kv.n_pos);
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, W = kp_kvpool_config_of(e->kv)->window;
    uint32_t nb = (uint32_t)(((uint64_t)n + B - 1) / B);
    if (nb == 0) return KP_OK;
    /* under a window budget the source may have dropped the window rows that position n reads */
    for (uint32_t j = n + 1 > W ? (n + 1 - W) / B : 0; W > 1 && j < nb; j++)
        if (!kp_kvpool_has_window(e->kv, src->kv.blocks[j]))
            return kp_fail(err, KP_EFULL, "the window rows before position %u were dropped (window budget)", n);
    float *state = NULL; /* a recurrent state goes with the rows: the source's own at its length, or the
                          * pending snapshot it took at n (a state point it passed) */
    if (e->recurrent) {
        const kp_pfx_state *sn = NULL;
        for (uint32_t i = 0; i < src->n_snaps && e->idx; i++)
            if (src->snaps[i].pos == n) sn = &src->snaps[i];
        if ((!src->kv.rstate || src->kv.rstate_pos != n) && !sn)
            return kp_fail(err, KP_EUNSUPPORTED,
                           "fork of %u positions: this model's recurrent state is held at position %u and at the "
                           "sequence's snapshots only",
                           n, src->kv.rstate ? src->kv.rstate_pos : 0);
        size_t bytes = (size_t)kp_model_rec_state_floats(&e->m->hp) * sizeof(float);
        if (!(state = malloc(bytes))) return kp_fail(err, KP_ENOMEM, "out of memory copying a recurrent state");
        if (src->kv.rstate && src->kv.rstate_pos == n) memcpy(state, src->kv.rstate, bytes);
        else kp_pfx_state_load(e->idx, sn, state);
    }
    if (!kp_grow_u32((void **)&dst->kv.blocks, &dst->kv.cap_blocks, nb, sizeof(int32_t))) {
        free(state);
        return kp_fail(err, KP_ENOMEM, "out of memory growing a block table");
    }
    int32_t copy = -1;
    if (n % B) { /* the partial block: a private copy (src's blocks are held: eviction cannot take them) */
        kp_status st;
        while ((st = kp_kvpool_alloc(e->kv, &copy, err)) == KP_EFULL) {
            uint64_t got = e->idx ? kp_pfx_evict(e->idx, kp_kvpool_block_bytes(e->kv), (int64_t)time(NULL)) : 0;
            if (got == 0) {
                free(state);
                return kp_fail(err, KP_EFULL, "KV budget full: no block for the copy of a forked sequence's "
                                              "last block (raise --kv-budget)");
            }
        }
        if (st != KP_OK) {
            free(state);
            return st;
        }
        if ((st = kp_kvpool_copy(e->kv, copy, src->kv.blocks[nb - 1], err)) != KP_OK) {
            kp_kvpool_unref(e->kv, copy);
            free(state);
            return st;
        }
    }
    for (uint32_t i = 0; i < nb; i++) {
        if (i == nb - 1 && copy >= 0) {
            dst->kv.blocks[i] = copy;
        } else {
            dst->kv.blocks[i] = src->kv.blocks[i];
            kp_kvpool_ref(e->kv, src->kv.blocks[i]);
        }
    }
    dst->kv.n_blocks = nb;
    dst->kv.n_pos = n;
    dst->kv.rstate = state;
    dst->kv.rstate_pos = state ? n : 0;
    /* under a window budget the fork knows the tokens of its rows too (window_trim publishes
     * its blocks; the whole ones it shares are the source's to publish, and so are the resume
     * points it shares with the source to hand) */
    dst->tier_done = n / B;
    uint32_t nt = src->n_toks < n ? src->n_toks : n;
    if (src->toks && kp_grow_u32((void **)&dst->toks, &dst->cap_toks, nt ? nt : 1, sizeof *dst->toks)) {
        memcpy(dst->toks, src->toks, (size_t)nt * sizeof *dst->toks);
        dst->n_toks = nt;
    }
    return KP_OK;
}

void kp_eng_seq_abort(kp_engine *e, kp_eng_seq *seq) {
    states_drop(e, seq);
    free(seq->toks);
    free(seq->starts);
    if (e->idx) kp_pfx_release(e->idx, &seq->lease);
    kp_kvseq_release(&seq->kv, e->kv);
    memset(seq, 0, sizeof *seq);
}

/* Grows the step scratch to hold n tokens, n_items sequences and n_rows
 * rows of logits. */
static kp_status step_scratch(kp_engine *e, uint32_t n, uint32_t n_items, uint32_t n_rows, kp_error *err) {
    if (n > e->step_cap) { /* the four token arrays share step_cap: each grows to the first one's */
        uint32_t cap = e->step_cap, cap_pos = cap, cap_seq = cap, cap_want = cap;
        if (!kp_grow_u32((void **)&e->step_tok, &cap, n, sizeof *e->step_tok) ||
            !kp_grow_u32((void **)&e->step_pos, &cap_pos, cap, sizeof *e->step_pos) ||
            !kp_grow_u32((void **)&e->step_seq, &cap_seq, cap, sizeof *e->step_seq) ||
            !kp_grow_u32((void **)&e->step_want, &cap_want, cap, sizeof *e->step_want))
            return kp_fail(err, KP_ENOMEM, "out of memory for a batch of %u tokens", n);
        e->step_cap = cap;
    }
    if (!kp_grow_u32((void **)&e->step_seqs, &e->step_seq_cap, n_items, sizeof *e->step_seqs))
        return kp_fail(err, KP_ENOMEM, "out of memory for a batch of %u sequences", n_items);
    /* an element of step_logits is a row of n_vocab logits */
    if (!kp_grow_u32((void **)&e->step_logits, &e->step_logit_cap, n_rows,
                     (size_t)e->m->hp.n_vocab * sizeof *e->step_logits))
        return kp_fail(err, KP_ENOMEM, "out of memory for %u rows of logits", n_rows);
    return KP_OK;
}

/* Runs tokens[0..n) at positions seq length.. (blocks reserved), in forward
 * calls of at most `batch` tokens (0: ENG_BATCH); logits of the last one. */
static kp_status run_tokens(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n, uint32_t batch,
                            float *logits, kp_error *err) {
    if (!batch) batch = ENG_BATCH;
    kp_status st = step_scratch(e, n < batch ? n : batch, 1, 0, err);
    if (st != KP_OK) return st;
    kp_kvseq *seqs[1] = {&seq->kv};
    for (uint32_t i = 0, m; i < n; i += m) {
        m = kp_eng_chunk(e, seq, n - i < batch ? n - i : batch);
        bool last = i + m == n;
        for (uint32_t j = 0; j < m; j++) {
            e->step_pos[j] = (int32_t)(seq->kv.n_pos + j);
            e->step_seq[j] = 0;
            e->step_want[j] = last && j == m - 1 && logits;
        }
        kp_batch b = {(int32_t)m, tokens + i, e->step_pos, e->step_seq, e->step_want, seqs, 1};
        uint32_t p = seq->kv.n_pos;
        kp_status st = window_rows(e, seq, p, p + m, err);
        if (st == KP_OK) st = kp_forward_run(e->fw, &b, last ? logits : NULL, err);
        if (st != KP_OK) return st;
        window_after(e, seq, p, tokens + i, m);
        take_state(e, seq, false);
    }
    return KP_OK;
}

/* After the RAM match (seq holds tokens[0..p)): the whole blocks that follow
 * from the tiers below RAM, as far as they hold the prompt's chain, leaving
 * at least the last position to compute. The first block may be the
 * private copy of a partial RAM block: its rows are overwritten with the
 * same tokens' rows. A refused block ends the restore (its reason goes to
 * the report); blocks reserved past what was restored are given back. */
static void tier_restore(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq, kp_eng_report *r) {
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, p = seq->kv.n_pos;
    uint32_t j0 = p / B, j_end = (n - 1) / B;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint32_t nb = kp_tiers_probe(e->tiers, tokens, j0, j_end);
    if (nb == 0 || reserve(e, seq, (j0 + nb) * B, NULL, NULL) != KP_OK) return;
    if (window_rows(e, seq, p, (j0 + nb) * B, NULL) != KP_OK) { /* computed instead */
        kp_kvseq_truncate(&seq->kv, e->kv, p);
        return;
    }
    uint32_t got[KP_TIER_N] = {0}, j = j0;
    kp_tier_id *from = malloc((size_t)nb * sizeof *from);
    if (!from) return; /* computed instead */
    kp_blockrec_reason why;
    /* a partial first block holds RAM rows of its own: it is read through a buffer */
    uint32_t n_ok = kp_tiers_fetch_run(e->tiers, tokens, j0, j0 + nb, e->kv, seq->kv.blocks, p % B ? j0 + 1 : j0,
                                       e->threads, from, &why);
    for (; j < j0 + n_ok; j++) got[from[j - j0]] += (j + 1) * B - (j == j0 ? p : j * B);
    if (why != KP_BLOCKREC_OK) {
        r->restore_failed = why;
        r->restore_failed_tier = from[n_ok];
    }
    free(from);
    if (j > j0) seq->kv.n_pos = j * B;
    kp_kvseq_truncate(&seq->kv, e->kv, seq->kv.n_pos);
    for (int t = 1; t < KP_TIER_N; t++) r->reused_from[t] = got[t];
    r->reused_tokens = seq->kv.n_pos;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kp_tiers_note_restore(e->tiers, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), got,
                          r->restore_failed != KP_BLOCKREC_OK);
}

/* The tokens tier_restore_state took from each tier: the whole blocks
 * [j0, j1) (from[j - j0] their tiers) and the tail [(s/B)B, s) of the
 * snapshot at s (its tier), less what RAM gave (positions below p). */
static void state_restore_got(uint32_t B, uint32_t p, uint32_t j0, uint32_t j1, const kp_tier_id *from, uint32_t s,
                              kp_tier_id sfrom, uint32_t got[KP_TIER_N]) {
    for (uint32_t j = j0; j < j1; j++) got[from[j - j0]] += (j + 1) * B - (j * B > p ? j * B : p);
    uint32_t t0 = s / B * B > p ? s / B * B : p;
    if (s > t0) got[sfrom] += s - t0;
}

/* tier_restore for a model with recurrent layers: the sequence (rows
 * [0, p) and the state at p from RAM, or nothing) resumes at the latest
 * snapshot s in (p, hi] some tier holds, hi the end of the whole blocks
 * the tiers hold for the prompt plus what a snapshot's tail rows can add
 * (at most n - 1: the last position is computed):
 *
 *   prompt     0 .... p ........................... rows_end .... hi   n
 *   from       RAM    | whole blocks (tiers) ...... |   tail rows |
 *   snapshots                @s1           @s2            @s3
 *   -> the latest s whose snapshot is read and verified, and whose whole
 *      blocks [p/B, s/B) are, wins; a refusal tries the next one below
 *
 * The state replaces the sequence's, rows past s are given back, and the
 * snapshot becomes a pending one of the sequence (so kp_eng_finish
 * indexes it in RAM). state_cut_from says how far the tiers' rows reached
 * when that is past s. Nothing found: the sequence stays as RAM left it. */
static void tier_restore_state(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq, kp_eng_report *r) {
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, p = seq->kv.n_pos;
    uint32_t j0 = p / B, j_end = (n - 1) / B;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint32_t nb = kp_tiers_probe(e->tiers, tokens, j0, j_end);
    uint32_t rows_end = (j0 + nb) * B, hi = rows_end + B - 1 < n - 1 ? rows_end + B - 1 : n - 1, s = 0;
    float *state = NULL; /* made once a snapshot is found */
    kp_tier_id *from = NULL, sfrom = KP_TIER_DISK;
    uint32_t got[KP_TIER_N] = {0};
    bool restored = false;
    while (kp_tiers_find_state(e->tiers, tokens, p, hi, &s)) {
        if ((!state && !(state = malloc((size_t)kp_tiers_state_bytes(e->tiers)))) ||
            (!from && !(from = malloc((size_t)(nb + 1) * sizeof *from))))
            break; /* computed instead */
        if (reserve(e, seq, s, NULL, NULL) != KP_OK || window_rows(e, seq, p, s, NULL) != KP_OK) break;
        kp_blockrec_reason why =
            kp_tiers_fetch_state(e->tiers, tokens, s, e->kv, s % B ? seq->kv.blocks[s / B] : -1, state, &sfrom);
        if (why != KP_BLOCKREC_OK) { /* a damaged or foreign snapshot: an earlier one, or none */
            kp_tiers_note_state(e->tiers, false);
            r->restore_failed = why;
            r->restore_failed_tier = sfrom;
            hi = s - 1;
            continue;
        }
        /* a partial first block holds RAM rows of its own: it is read through a buffer */
        uint32_t j1 = s / B, n_ok = kp_tiers_fetch_run(e->tiers, tokens, j0, j1, e->kv, seq->kv.blocks,
                                                       p % B ? j0 + 1 : j0, e->threads, from, &why);
        if (n_ok < j1 - j0) { /* block j0 + n_ok refused: a snapshot with no whole block past it */
            r->restore_failed = why;
            r->restore_failed_tier = from[n_ok];
            uint32_t below = (j0 + n_ok) * B + B - 1;
            hi = below < s - 1 ? below : s - 1;
            continue;
        }
        state_restore_got(B, p, j0, j1, from, s, sfrom, got);
        restored = true;
        break;
    }
    if (restored) {
        seq->kv.n_pos = s;
        free(seq->kv.rstate);
        seq->kv.rstate = state;
        seq->kv.rstate_pos = s;
        state = NULL;
        kp_tiers_note_state(e->tiers, true);
        /* indexed in RAM with the rows at kp_eng_finish, as the sequence's own (take_state
         * skips where a sequence resumed) */
        if (kp_grow_u32((void **)&seq->snaps, &seq->cap_snaps, seq->n_snaps + 1, sizeof *seq->snaps) &&
            kp_pfx_state_save(e->idx, seq->kv.rstate, s, &seq->snaps[seq->n_snaps], NULL) == KP_OK)
            seq->n_snaps++;
    }
    kp_kvseq_truncate(&seq->kv, e->kv, seq->kv.n_pos); /* blocks reserved past what was restored */
    free(state);
    free(from);
    uint32_t known = r->state_cut_from > rows_end ? r->state_cut_from : rows_end;
    r->state_cut_from = known > seq->kv.n_pos ? known : 0;
    for (int t = 1; t < KP_TIER_N; t++) r->reused_from[t] = got[t];
    r->reused_tokens = seq->kv.n_pos;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (restored || r->restore_failed != KP_BLOCKREC_OK)
        kp_tiers_note_restore(e->tiers,
                              (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), got,
                              r->restore_failed != KP_BLOCKREC_OK);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Under a window budget: seq keeps its prompt's tokens and message starts
 * (those in (0, n), ascending, once each) for hand_resume_points and
 * window_trim. Out of memory: neither (the sequence keeps the window
 * before its prompt's end itself, near_resume_point). */
static void keep_prompt(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n, const uint32_t *starts,
                        uint32_t n_starts) {
    if (!kp_kvpool_window_budgeted(e->kv) || !e->idx) return;
    if (!kp_grow_u32((void **)&seq->toks, &seq->cap_toks, n, sizeof *seq->toks)) return;
    memcpy(seq->toks, tokens, (size_t)n * sizeof *tokens);
    seq->n_toks = n;
    if (!n_starts || !(seq->starts = malloc((size_t)n_starts * sizeof *seq->starts))) return;
    for (uint32_t i = 0; i < n_starts; i++)
        if (starts[i] > 0 && starts[i] < n) seq->starts[seq->n_starts++] = starts[i];
    qsort(seq->starts, seq->n_starts, sizeof *seq->starts, cmp_u32);
    uint32_t k = 0;
    for (uint32_t i = 0; i < seq->n_starts; i++)
        if (k == 0 || seq->starts[i] != seq->starts[k - 1]) seq->starts[k++] = seq->starts[i];
    seq->n_starts = k;
}

kp_status kp_eng_begin(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq, kp_eng_report *report,
                       kp_error *err) {
    return kp_eng_begin_msgs(e, tokens, n, NULL, 0, seq, report, err);
}

kp_status kp_eng_begin_msgs(kp_engine *e, const int32_t *tokens, uint32_t n, const uint32_t *starts,
                            uint32_t n_starts, kp_eng_seq *seq, kp_eng_report *report, kp_error *err) {
    kp_eng_report r;
    memset(&r, 0, sizeof r);
    r.cached_next = -1;
    r.prompt_tokens = n;
    r.recurrent = e->recurrent;
    if (report) *report = r;
    if (n == 0 || !tokens) return kp_fail(err, KP_EINVAL, "empty prompt");
    if (seq->kv.n_pos || seq->kv.n_blocks || seq->lease.node)
        return kp_fail(err, KP_EINVAL, "prefill into a sequence that is not empty");
    seq->prompt_end = n;
    if (n > e->max_pos)
        return kp_fail(err, KP_ERANGE, "the prompt has %u tokens, more than the maximum of %u", n, e->max_pos);
    int32_t nv = (int32_t)e->m->hp.n_vocab;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= nv)
            return kp_fail(err, KP_EINVAL, "token %d at %u is outside the vocabulary of %d", tokens[i], i, nv);
    if (e->idx) {
        kp_pfx_match_result mr;
        kp_pfx_match(e->idx, tokens, n, &mr);
        kp_pfx_stats ps;
        kp_pfx_get_stats(e->idx, &ps);
        r.cold = ps.n_nodes == 0;
        r.diverged_at_token = mr.n_match;
        r.cached_next = mr.cached_next;
        r.n_continuations = mr.n_continuations;
        r.evicted = mr.evicted;
        r.evicted_len = mr.evicted_len;
        r.window_cut_from = mr.window_cut_from;
        r.state_cut_from = mr.state_cut_from;
        kp_status st = kp_pfx_acquire(e->idx, tokens, mr.n_reuse, &seq->kv, &seq->lease, err);
        if (st == KP_EFULL) { /* the partial-block copy found no free block: compute instead */
            uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
            st = kp_pfx_acquire(e->idx, tokens, kp_pfx_resume(e->idx, tokens, mr.n_reuse / B * B), &seq->kv,
                                &seq->lease, err);
        }
        if (st != KP_OK) {
            if (report) *report = r;
            kp_eng_seq_abort(e, seq);
            return st;
        }
        r.reused_tokens = seq->kv.n_pos;
        assert(r.reused_tokens <= mr.n_reuse && r.reused_tokens < n);
        if (e->tiers && e->recurrent) tier_restore_state(e, tokens, n, seq, &r);
        else if (e->tiers) tier_restore(e, tokens, n, seq, &r);
    } else {
        r.cold = true;
    }
    r.computed_tokens = n - r.reused_tokens;
    if (r.state_cut_from > r.reused_tokens) r.state_recomputed_tokens = r.state_cut_from - r.reused_tokens;
    seq->reused = r.reused_tokens;
    keep_prompt(e, seq, tokens, n, starts, n_starts);
    /* where it resumed is a resume point too (a branch once it hands its prompt over): marked,
     * the index keeps the window before it while it can */
    if (seq->toks && seq->reused) kp_pfx_mark(e->idx, tokens, seq->reused, NULL);
    seq->tier_done = seq->reused / kp_kvpool_config_of(e->kv)->block_size; /* the index's: published already */
    hand_resume_points(e, seq); /* the message starts within the reuse: marked at once */
    if (report) *report = r;
    return KP_OK;
}

void kp_eng_probe(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_report *r) {
    memset(r, 0, sizeof *r);
    r->cached_next = -1;
    r->prompt_tokens = n;
    r->computed_tokens = n;
    r->cold = true;
    r->recurrent = e->recurrent;
    if (!e->idx || n == 0) return;
    kp_pfx_match_result mr;
    kp_pfx_match(e->idx, tokens, n, &mr);
    kp_pfx_stats ps;
    kp_pfx_get_stats(e->idx, &ps);
    r->cold = ps.n_nodes == 0;
    r->diverged_at_token = mr.n_match;
    r->cached_next = mr.cached_next;
    r->n_continuations = mr.n_continuations;
    r->evicted = mr.evicted;
    r->evicted_len = mr.evicted_len;
    r->window_cut_from = mr.window_cut_from;
    r->state_cut_from = mr.state_cut_from;
    r->reused_tokens = mr.n_reuse;
    r->computed_tokens = n - mr.n_reuse;
    if (mr.state_cut_from > mr.n_reuse) r->state_recomputed_tokens = mr.state_cut_from - mr.n_reuse;
}

/* kp_eng_room_for's walk over the index. */
typedef struct {
    const int32_t *tokens;
    uint32_t reuse, shared; /* shared = reuse / B: the whole blocks the prefill shares */
    bool hold_path;
    uint32_t *refs;
    int32_t *shared_ids;
} room_walk;

/* A node is on the prefill's path when its run starts below `reuse` and its
 * path agrees with the tokens up to min(end, reuse): the nodes the lease
 * would hold (the chain down to the one holding position reuse - 1). */
static int room_visit(const kp_pfx_node_info *nd, void *ctx) {
    room_walk *w = ctx;
    bool on_path = false;
    if (nd->start < w->reuse && nd->path[nd->start] == w->tokens[nd->start]) {
        uint32_t m = nd->end < w->reuse ? nd->end : w->reuse;
        on_path = !memcmp(nd->path, w->tokens, (size_t)m * sizeof *w->tokens);
    }
    if (on_path) /* preorder: a deeper node's block of an index wins, as in kp_pfx_acquire */
        for (uint32_t i = 0; i < nd->n_blocks; i++)
            if (nd->first_block + i < w->shared) w->shared_ids[nd->first_block + i] = nd->blocks[i];
    if (nd->n_holders == 0 && nd->n_pins == 0 && !(on_path && w->hold_path))
        for (uint32_t i = 0; i < nd->n_blocks; i++) w->refs[nd->blocks[i]]++;
    return 0;
}

kp_status kp_eng_room_for(kp_engine *e, const int32_t *tokens, uint32_t n, bool hold_path, kp_eng_room *out,
                          kp_error *err) {
    memset(out, 0, sizeof *out);
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, nb = kp_kvpool_n_blocks(e->kv);
    out->free_blocks = kp_kvpool_n_free(e->kv);
    if (n == 0 || !tokens) return KP_OK;
    uint32_t reuse = 0;
    if (e->idx) {
        kp_pfx_match_result mr;
        kp_pfx_match(e->idx, tokens, n, &mr);
        reuse = mr.n_reuse;
    }
    out->reused_tokens = reuse;
    out->need_blocks = (uint32_t)(((uint64_t)n + B - 1) / B) - reuse / B;
    if (!e->idx) return KP_OK;
    if (!e->room_refs) {
        e->room_refs = malloc((size_t)nb * sizeof *e->room_refs);
        e->room_shared = malloc((size_t)nb * sizeof *e->room_shared);
        if (!e->room_refs || !e->room_shared) {
            free(e->room_refs);
            free(e->room_shared);
            e->room_refs = NULL;
            e->room_shared = NULL;
            return kp_fail(err, KP_ENOMEM, "out of memory for the admission check of %u blocks", nb);
        }
    }
    memset(e->room_refs, 0, (size_t)nb * sizeof *e->room_refs);
    room_walk w = {tokens, reuse, reuse / B, hold_path, e->room_refs, e->room_shared};
    for (uint32_t i = 0; i < w.shared; i++) e->room_shared[i] = -1;
    kp_status st = kp_pfx_walk(e->idx, room_visit, &w, err);
    if (st != KP_OK) return st;
    /* a shared block stays referenced by the prefill: evicting its nodes frees nothing */
    for (uint32_t i = 0; i < w.shared; i++)
        if (e->room_shared[i] >= 0) e->room_refs[e->room_shared[i]] = UINT32_MAX;
    /* a block comes back only when every reference to it is one eviction can take */
    for (uint32_t b = 0; b < nb; b++)
        if (e->room_refs[b] && e->room_refs[b] != UINT32_MAX && e->room_refs[b] == kp_kvpool_refcount(e->kv, (int32_t)b))
            out->evictable_blocks++;
    out->evictable_blocks += kp_pfx_state_evictable_blocks(e->idx); /* snapshots: the index's blocks alone */
    if (kp_kvpool_window_budgeted(e->kv)) {
        /* window slots: free, and the index's that dropping or evicting gives back, but those
         * of blocks the prefill shares (it reads their window rows, or keeps them) */
        out->free_slots = kp_kvpool_n_free_slots(e->kv);
        if (!e->room_spare && !(e->room_spare = malloc(nb)))
            return kp_fail(err, KP_ENOMEM, "out of memory for the admission check of %u blocks", nb);
        kp_pfx_window_spare(e->idx, e->room_spare);
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t refs = e->room_refs[b];
            bool evictable = refs && refs != UINT32_MAX && refs == kp_kvpool_refcount(e->kv, (int32_t)b);
            if (refs != UINT32_MAX && (e->room_spare[b] || evictable) && kp_kvpool_has_window(e->kv, (int32_t)b))
                out->spare_slots++;
        }
    }
    return KP_OK;
}

/* kp_eng_prefill in forward calls of `batch` tokens. */
static kp_status prefill(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq, float *logits_out,
                         kp_eng_report *report, uint32_t batch, kp_error *err) {
    kp_eng_report r;
    kp_status st = kp_eng_begin(e, tokens, n, seq, &r, err);
    if (report) *report = r;
    if (st != KP_OK) return st;
    if ((st = reserve(e, seq, n, &r, err)) != KP_OK) goto fail;
    if ((st = run_tokens(e, seq, tokens + r.reused_tokens, r.computed_tokens, batch, logits_out, err)) != KP_OK)
        goto fail;
    assert(seq->kv.n_pos == n);
    if (report) *report = r;
    return KP_OK;
fail:
    if (report) *report = r;
    kp_eng_seq_abort(e, seq);
    return st;
}

kp_status kp_eng_prefill(kp_engine *e, const int32_t *tokens, uint32_t n, kp_eng_seq *seq, float *logits_out,
                         kp_eng_report *report, kp_error *err) {
    return prefill(e, tokens, n, seq, logits_out, report, 0, err);
}

/* KP_EINVAL for a bad token id, KP_ERANGE when seq would pass max_pos. */
static kp_status check_tokens(const kp_engine *e, const kp_eng_seq *seq, const int32_t *tokens, uint32_t n,
                              kp_error *err) {
    uint32_t p = seq->kv.n_pos;
    if (n > e->max_pos || p > e->max_pos - n)
        return kp_fail(err, KP_ERANGE, "the sequence would reach %u positions, more than the maximum of %u",
                       p + n, e->max_pos);
    for (uint32_t j = 0; j < n; j++)
        if (tokens[j] < 0 || tokens[j] >= (int32_t)e->m->hp.n_vocab)
            return kp_fail(err, KP_EINVAL, "token %d is outside the vocabulary of %u", tokens[j], e->m->hp.n_vocab);
    return KP_OK;
}

kp_status kp_eng_append(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n, uint32_t batch,
                        float *logits_out, kp_error *err) {
    if (n == 0 || !tokens) return kp_fail(err, KP_EINVAL, "nothing to append");
    kp_status st = check_tokens(e, seq, tokens, n, err);
    if (st == KP_OK) st = reserve(e, seq, seq->kv.n_pos + n, NULL, err);
    if (st == KP_OK) st = run_tokens(e, seq, tokens, n, batch, logits_out, err);
    return st;
}

kp_status kp_eng_seq_truncate(kp_engine *e, kp_eng_seq *seq, uint32_t n_pos, kp_error *err) {
    if (e->idx)
        return kp_fail(err, KP_EUNSUPPORTED, "a sequence cannot be cut back in an engine with a prefix cache "
                                             "(its blocks may be shared)");
    if (e->recurrent && n_pos != 0 && n_pos < seq->kv.n_pos)
        return kp_fail(err, KP_EUNSUPPORTED,
                       "a sequence of this model cannot be cut back to position %u: its recurrent state "
                       "summarizes all %u positions (only a restart from 0 is possible)",
                       n_pos, seq->kv.n_pos);
    if (n_pos < seq->kv.n_pos) kp_kvseq_truncate(&seq->kv, e->kv, n_pos);
    return KP_OK;
}

kp_status kp_eng_step(kp_engine *e, kp_eng_item *items, uint32_t n_items, kp_error *err) {
    uint32_t total = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        kp_eng_item *it = &items[i];
        it->status = KP_OK;
        it->err.msg[0] = 0;
        uint32_t p = it->seq->kv.n_pos;
        if (it->n == 0 || !it->tokens) {
            it->status = kp_fail(&it->err, KP_EINVAL, "a step item without tokens");
            continue;
        }
        if ((it->status = check_tokens(e, it->seq, it->tokens, it->n, &it->err)) != KP_OK) continue;
        for (uint32_t k = 0; k < i; k++)
            if (items[k].seq == it->seq && items[k].status == KP_OK) {
                it->status = kp_fail(&it->err, KP_EINVAL, "a sequence appears twice in one step");
                break;
            }
        if (it->status != KP_OK) continue;
        it->status = reserve(e, it->seq, p + it->n, NULL, &it->err);
        if (it->status == KP_OK) it->status = window_rows(e, it->seq, p, p + it->n, &it->err);
        if (it->status == KP_OK) total += it->n;
    }
    if (total == 0) return KP_OK;
    /* logit rows: one per item asking, or one per token with all_logits; a
     * single item asking gets them written in place */
    uint32_t n_rows = 0, n_asking = 0;
    kp_eng_item *asking = NULL;
    for (uint32_t i = 0; i < n_items; i++)
        if (items[i].status == KP_OK && items[i].logits) {
            n_rows += items[i].all_logits ? items[i].n : 1;
            n_asking++;
            asking = &items[i];
        }
    kp_status st = step_scratch(e, total, n_items, n_asking > 1 ? n_rows : 0, err);
    if (st != KP_OK) return st;
    uint32_t t = 0, ns = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        kp_eng_item *it = &items[i];
        if (it->status != KP_OK) continue;
        e->step_seqs[ns] = &it->seq->kv;
        for (uint32_t j = 0; j < it->n; j++, t++) {
            e->step_tok[t] = it->tokens[j];
            e->step_pos[t] = (int32_t)(it->seq->kv.n_pos + j);
            e->step_seq[t] = (int32_t)ns;
            e->step_want[t] = it->logits && (it->all_logits || j == it->n - 1);
        }
        ns++;
    }
    kp_batch b = {(int32_t)total, e->step_tok, e->step_pos, e->step_seq, e->step_want, e->step_seqs, (int32_t)ns};
    float *out = n_asking == 1 ? asking->logits : n_asking ? e->step_logits : NULL;
    if ((st = kp_forward_run(e->fw, &b, out, err)) != KP_OK) return st;
    for (uint32_t i = 0; i < n_items; i++)
        if (items[i].status == KP_OK) {
            window_after(e, items[i].seq, items[i].seq->kv.n_pos - items[i].n, items[i].tokens, items[i].n);
            take_state(e, items[i].seq, false);
        }
    if (n_asking < 2) return KP_OK;
    size_t nv = e->m->hp.n_vocab;
    uint32_t l = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        kp_eng_item *it = &items[i];
        if (it->status != KP_OK || !it->logits) continue;
        uint32_t rows = it->all_logits ? it->n : 1;
        memcpy(it->logits, e->step_logits + (size_t)l * nv, rows * nv * sizeof(float));
        l += rows;
    }
    return KP_OK;
}

kp_status kp_eng_decode(kp_engine *e, kp_eng_seq *seq, int32_t token, float *logits_out, kp_error *err) {
    uint32_t p = seq->kv.n_pos;
    if (p >= e->max_pos)
        return kp_fail(err, KP_ERANGE, "the sequence reached the maximum of %u positions", e->max_pos);
    if (token < 0 || token >= (int32_t)e->m->hp.n_vocab)
        return kp_fail(err, KP_EINVAL, "token %d is outside the vocabulary of %u", token, e->m->hp.n_vocab);
    kp_status st = reserve(e, seq, p + 1, NULL, err);
    if (st == KP_OK) st = run_tokens(e, seq, &token, 1, 0, logits_out, err);
    assert(st != KP_OK || seq->kv.n_pos == p + 1);
    return st;
}

/* Writes the snapshots the index holds at pos[0..n_pos) on the path tokens
 * (rows in seq's blocks: a snapshot's tail rows come from its block pos /
 * B) to the tiers that lack them. */
static void tier_publish_states(kp_engine *e, const int32_t *tokens, const uint32_t *pos, uint32_t n_pos,
                                const kp_kvseq *seq) {
    float *state = NULL;
    for (uint32_t i = 0; i < n_pos; i++) {
        if (!kp_tiers_state_wanted(e->tiers, tokens, pos[i])) continue;
        if (!state && !(state = malloc((size_t)kp_tiers_state_bytes(e->tiers)))) return;
        if (kp_pfx_state_read(e->idx, tokens, pos[i], state)) kp_tiers_publish_state(e->tiers, tokens, pos[i], seq, state);
    }
    free(state);
}

kp_status kp_eng_finish(kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n, uint32_t *n_added,
                     kp_error *err) {
    kp_status st = KP_OK;
    if (n_added) *n_added = 0;
    if (n > seq->kv.n_pos) n = seq->kv.n_pos;
    if (n == seq->kv.n_pos && tokens) take_state(e, seq, true); /* the end: where the next turn resumes */
    if (e->idx && n > 0 && tokens) st = kp_pfx_insert(e->idx, tokens, n, &seq->kv, NULL, n_added, err);
    /* the positions of the snapshots the index is handed: the tiers get them once indexed */
    uint32_t *snap_pos = e->tiers && seq->n_snaps ? malloc((size_t)seq->n_snaps * sizeof *snap_pos) : NULL;
    uint32_t n_snap_pos = 0;
    for (uint32_t i = 0; snap_pos && i < seq->n_snaps; i++)
        if (seq->snaps[i].pos <= n) snap_pos[n_snap_pos++] = seq->snaps[i].pos;
    if (e->idx && st == KP_OK && tokens) hand_states(e, seq, tokens, n);
    if (e->tiers && tokens) {
        /* the blocks that still hold their window rows (those that dropped them were queued
         * before they did, window_trim), and the snapshots whose tail block holds them */
        uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
        kp_tiers_publish(e->tiers, tokens, n, &seq->kv);
        uint32_t w = 0;
        for (uint32_t i = 0; i < n_snap_pos; i++)
            if (snap_pos[i] % B == 0 || kp_kvpool_has_window(e->kv, seq->kv.blocks[snap_pos[i] / B]))
                snap_pos[w++] = snap_pos[i];
        if (st == KP_OK) tier_publish_states(e, tokens, snap_pos, w, &seq->kv);
    }
    free(snap_pos);
    kp_eng_seq_abort(e, seq);
    return st;
}

kp_status kp_eng_clear(kp_engine *e, kp_error *err) {
    if (!e->idx) return KP_OK;
    uint64_t state_bytes = kp_pfx_state_bytes(e->idx);
    kp_pfx_free(e->idx);
    e->idx = NULL;
    kp_status st = kp_pfx_new(&e->idx, e->kv, e->has_pfx_cfg ? &e->pfx_cfg : NULL, err);
    if (st == KP_OK) st = kp_pfx_set_state(e->idx, state_bytes, err);
    return st;
}

/* The per-kind fields of the bill (kp_eng_stats); index_* from index_bytes
 * and the index's blocks that hold window rows, so call it again once
 * those are known. */
static void kind_bill(const kp_engine *e, kp_eng_stats *out, uint64_t index_window_blocks) {
    const kp_kvpool_config *kc = kp_kvpool_config_of(e->kv);
    const kp_hparams *hp = &e->m->hp;
    out->full_bytes_per_token = kp_model_kv_bytes_per_token_kind(e->m, KP_LAYER_FULL, kc->kv_type, kc->kv_type_v);
    out->n_window_layers = hp->n_swa_layers;
    out->n_full_layers = hp->n_kv_layer - hp->n_swa_layers;
    if (hp->n_swa_layers) {
        out->window = hp->n_swa;
        out->window_bytes_per_token =
            kp_model_kv_bytes_per_token_kind(e->m, KP_LAYER_WINDOW, kc->kv_type, kc->kv_type_v);
    }
    /* the index's K/V blocks: its blocks less those of the state snapshots (a hybrid model's) */
    uint64_t kv_bytes = out->index_bytes - (out->index_state_bytes < out->index_bytes ? out->index_state_bytes : out->index_bytes);
    uint64_t index_blocks = out->block_bytes ? kv_bytes / out->block_bytes : 0;
    out->index_full_bytes = index_blocks * kc->block_size * out->full_bytes_per_token;
    out->index_window_bytes = index_window_blocks * kc->block_size * out->window_bytes_per_token;
    if (kp_kvpool_window_budgeted(e->kv)) {
        uint64_t wb = kp_kvpool_window_bytes(e->kv);
        out->window_budget_bytes = (uint64_t)kp_kvpool_n_slots(e->kv) * wb;
        out->window_used_bytes = (uint64_t)(kp_kvpool_n_slots(e->kv) - kp_kvpool_n_free_slots(e->kv)) * wb;
    }
}

void kp_eng_get_stats(kp_engine *e, kp_eng_stats *out) {
    memset(out, 0, sizeof *out);
    const kp_kvpool_config *kc = kp_kvpool_config_of(e->kv);
    uint64_t bb = kp_kvpool_block_bytes(e->kv);
    out->prefix_cache = e->idx != NULL;
    out->packed_weight_bytes = e->packed_bytes;
    out->kv_type = kc->kv_type;
    out->kv_type_v = kc->kv_type_v;
    out->block_size = kc->block_size;
    out->bytes_per_token = kp_model_kv_bytes_per_token_kv(&e->m->hp, kc->kv_type, kc->kv_type_v);
    out->block_bytes = bb;
    if (e->recurrent) {
        out->state_bytes = kp_model_rec_state_floats(&e->m->hp) * sizeof(float);
        if (e->idx) {
            out->state_every = e->state_every;
            out->state_block_bytes = (uint64_t)kp_pfx_state_blocks(e->idx) * bb;
        }
    }
    kind_bill(e, out, 0);
    if (!e->idx) {
        uint32_t nb = kp_kvpool_n_blocks(e->kv);
        out->budget_bytes = (uint64_t)nb * bb;
        out->used_bytes = (uint64_t)(nb - kp_kvpool_n_free(e->kv)) * bb;
        out->free_bytes = out->budget_bytes - out->used_bytes;
        return;
    }
    kp_pfx_stats ps;
    kp_pfx_get_stats(e->idx, &ps);
    out->budget_bytes = ps.budget_bytes;
    out->used_bytes = ps.used_bytes;
    out->free_bytes = ps.free_bytes;
    out->index_bytes = ps.index_bytes;
    out->pinned_bytes = ps.pinned_bytes;
    out->pinned_cap_bytes = ps.pinned_cap_bytes;
    out->shared_bytes = ps.shared_bytes;
    out->saved_bytes = ps.saved_bytes;
    out->n_nodes = ps.n_nodes;
    out->n_leaves = ps.n_leaves;
    out->n_pins = ps.n_pins;
    out->n_leases = ps.n_leases;
    out->cached_tokens = ps.cached_tokens;
    out->n_evictions = ps.n_evictions;
    out->evicted_bytes = ps.evicted_bytes;
    out->n_lookups = ps.n_lookups;
    out->n_hits = ps.n_hits;
    out->reused_tokens = ps.reused_tokens;
    out->window_drops = ps.window_drops;
    out->n_states = ps.n_states;
    out->index_state_bytes = ps.state_bytes;
    out->state_evictions = ps.state_evictions;
    kind_bill(e, out, ps.index_window_blocks);
    if (kp_kvpool_window_budgeted(e->kv)) { /* the two arenas apart: bytes held, not blocks x block_bytes */
        uint64_t fb = kp_kvpool_full_bytes(e->kv), nb = kp_kvpool_n_blocks(e->kv);
        out->budget_bytes = nb * fb + out->window_budget_bytes;
        out->used_bytes = (nb - kp_kvpool_n_free(e->kv)) * fb + out->window_used_bytes;
        out->free_bytes = out->budget_bytes - out->used_bytes;
        out->index_bytes = out->index_full_bytes + out->index_window_bytes;
    }
}

kp_status kp_eng_set_attn(kp_engine *e, kp_attn_precision p, kp_error *err) {
    if (e->tiers) return kp_fail(err, KP_EINVAL, "the attention precision is set before the cache tiers open");
    e->attn = kp_forward_set_attn(e->fw, p);
    e->attn_bf16 = e->attn == kp_attn_scalar_bf16() || e->attn == kp_attn_avx512bf16_table();
    return KP_OK;
}

const char *kp_eng_attn_name(const kp_engine *e) { return e->attn->name; }

void kp_eng_attn_work(const kp_engine *e, double *flops, double *seconds) { kp_forward_attn_work(e->fw, flops, seconds); }

kp_status kp_eng_open_tiers(kp_engine *e, const kp_tiers_config *cfg, kp_error *err) {
    if (!e->idx) return kp_fail(err, KP_EUNSUPPORTED, "the cache tiers need the prefix cache (it is off)");
    if (e->tiers) return kp_fail(err, KP_EINVAL, "the cache tiers are open already");
    /* kp_eng_finish queues a sequence's every block at once: a queue shorter
     * than a whole context would drop the tail of every long prompt (the
     * queued records are copies, at most one context's K/V per tier) */
    kp_tiers_config c = *cfg;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, ctx_blocks = (e->max_pos + B - 1) / B;
    if (c.queue_blocks < ctx_blocks) c.queue_blocks = ctx_blocks;
    if (c.queue_blocks < 256) c.queue_blocks = 256;
    return kp_tiers_new(&e->tiers, &c, e->m, e->kv, e->attn_bf16, err);
}

bool kp_eng_tier_stats(kp_engine *e, kp_tiers_stats *out) {
    memset(out, 0, sizeof *out);
    if (!e->tiers) return false;
    kp_tiers_get_stats(e->tiers, out);
    return true;
}

const char *kp_eng_tier_note(const kp_engine *e) { return e->tiers ? kp_tiers_note(e->tiers) : ""; }

void kp_eng_tier_probe(kp_engine *e, const int32_t *tokens, uint32_t n, uint32_t tokens_on[KP_TIER_N]) {
    memset(tokens_on, 0, KP_TIER_N * sizeof *tokens_on);
    if (!e->tiers) return;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, blocks[KP_TIER_N];
    if (kp_tiers_probe(e->tiers, tokens, 0, n / B) == 0) return;
    kp_tiers_last_probe(e->tiers, 0, blocks);
    for (int t = 0; t < KP_TIER_N; t++) tokens_on[t] = blocks[t] * B;
}

uint32_t kp_eng_tier_probe_state(kp_engine *e, const int32_t *tokens, uint32_t n, kp_tier_id *from,
                                 uint32_t *refused_at, kp_blockrec_reason *why) {
    *from = KP_TIER_DISK;
    *refused_at = 0;
    *why = KP_BLOCKREC_OK;
    if (!e->tiers || !e->recurrent || n < 2) return 0;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size, s = 0;
    uint32_t nb = kp_tiers_probe(e->tiers, tokens, 0, (n - 1) / B);
    uint32_t hi = nb * B + B - 1 < n - 1 ? nb * B + B - 1 : n - 1;
    float *state = malloc((size_t)kp_tiers_state_bytes(e->tiers));
    int32_t tail = -1; /* a block for the tail rows of the snapshots read */
    if (state && kp_kvpool_alloc(e->kv, &tail, NULL) != KP_OK &&
        (!kp_pfx_evict(e->idx, kp_kvpool_block_bytes(e->kv), (int64_t)time(NULL)) ||
         kp_kvpool_alloc(e->kv, &tail, NULL) != KP_OK))
        tail = -1;
    while (tail >= 0 && kp_tiers_find_state(e->tiers, tokens, 0, hi, &s)) {
        kp_blockrec_reason r = kp_tiers_fetch_state(e->tiers, tokens, s, e->kv, s % B ? tail : -1, state, from);
        if (r == KP_BLOCKREC_OK) break;
        if (!*refused_at) {
            *refused_at = s;
            *why = r;
        }
        hi = s - 1;
        s = 0;
    }
    if (tail >= 0) kp_kvpool_unref(e->kv, tail);
    free(state);
    return tail >= 0 ? s : 0;
}

bool kp_eng_tier_wait_ready(kp_engine *e, uint32_t ms) { return !e->tiers || kp_tiers_wait_ready(e->tiers, ms); }

void kp_eng_tier_flush(kp_engine *e) {
    if (e->tiers) kp_tiers_flush(e->tiers);
}

kp_status kp_eng_top(kp_engine *e, kp_eng_prefix *out, uint32_t max, uint32_t *n_out, kp_error *err) {
    *n_out = 0;
    return e->idx ? kp_pfx_top(e->idx, out, max, n_out, err) : KP_OK;
}

/* kp_eng_tree's walk: the nodes so far, and where they go. */
typedef struct {
    kp_eng_node *out;
    uint32_t max, n;
} tree_walk;

static int tree_visit(const kp_pfx_node_info *ni, void *ctx) {
    tree_walk *w = ctx;
    if (w->n == w->max) return 1;
    /* preorder: the parent is the last node written or one of its ancestors,
     * the one whose run ends where this one starts */
    int32_t parent = (int32_t)w->n - 1;
    while (parent >= 0 && w->out[parent].end != ni->start) parent = w->out[parent].parent;
    kp_eng_node *o = &w->out[w->n++];
    o->parent = parent;
    o->start = ni->start;
    o->end = ni->end;
    o->n_head = ni->end - ni->start < KP_ENG_NODE_HEAD ? ni->end - ni->start : KP_ENG_NODE_HEAD;
    memcpy(o->head, ni->path + ni->start, (size_t)o->n_head * sizeof *o->head);
    o->n_children = ni->n_children;
    o->n_holders = ni->n_holders;
    o->n_pins = ni->n_pins;
    o->last_used = ni->last_used;
    o->hits = ni->hits;
    return 0;
}

kp_status kp_eng_tree(kp_engine *e, kp_eng_node *out, uint32_t max, uint32_t *n_out, kp_error *err) {
    *n_out = 0;
    if (!e->idx || !max) return KP_OK;
    tree_walk w = {out, max, 0};
    kp_status st = kp_pfx_walk(e->idx, tree_visit, &w, err);
    *n_out = w.n;
    return st;
}

/* kp_eng_node_path's walk: the starts of the current node's ancestors (and
 * its own), innermost last, and what it looks for. */
typedef struct {
    const int32_t *firsts;
    uint32_t depth;
    uint32_t stack_start[KP_ENG_PATH_DEPTH], stack_end[KP_ENG_PATH_DEPTH];
    uint32_t n_stack;
    int32_t *out;
    uint32_t max, start, end;
    bool found;
} path_walk;

static int path_visit(const kp_pfx_node_info *ni, void *ctx) {
    path_walk *w = ctx;
    /* preorder: pop the nodes this one does not continue */
    while (w->n_stack > 0 && w->stack_end[w->n_stack - 1] != ni->start) w->n_stack--;
    if (w->n_stack == KP_ENG_PATH_DEPTH) return 0; /* too deep to address: skip it */
    w->stack_start[w->n_stack] = ni->start;
    w->stack_end[w->n_stack] = ni->end;
    w->n_stack++;
    if (w->n_stack != w->depth) return 0;
    for (uint32_t i = 0; i < w->depth; i++)
        if (ni->path[w->stack_start[i]] != w->firsts[i]) return 0;
    w->found = true;
    w->start = ni->start;
    w->end = ni->end;
    memcpy(w->out, ni->path, (size_t)(ni->end < w->max ? ni->end : w->max) * sizeof *w->out);
    return 1;
}

kp_status kp_eng_node_path(kp_engine *e, const int32_t *firsts, uint32_t depth, int32_t *out, uint32_t max,
                           uint32_t *start, uint32_t *end, kp_error *err) {
    *start = *end = 0;
    if (depth == 0 || depth > KP_ENG_PATH_DEPTH)
        return kp_fail(err, KP_EINVAL, "a node path names 1 to %d first tokens, not %u", KP_ENG_PATH_DEPTH, depth);
    if (!e->idx) return kp_fail(err, KP_ENOTFOUND, "the prefix cache is off: there are no nodes");
    path_walk *w = calloc(1, sizeof *w);
    if (!w) return kp_fail(err, KP_ENOMEM, "out of memory walking the prefix index");
    w->firsts = firsts;
    w->depth = depth;
    w->out = out;
    w->max = max;
    kp_status st = kp_pfx_walk(e->idx, path_visit, w, err);
    if (st == KP_OK && !w->found) st = kp_fail(err, KP_ENOTFOUND, "no cached node has that path (evicted?)");
    if (st == KP_OK) {
        *start = w->start;
        *end = w->end;
    }
    free(w);
    return st;
}

/* tier_pin_publish's walk: the block of each whole-block index of the
 * pinned path, the deepest node's (as kp_pfx_acquire takes them). */
typedef struct {
    const int32_t *tokens;
    uint32_t n, nb;
    int32_t *blocks;
} pin_walk;

static int pin_visit(const kp_pfx_node_info *nd, void *ctx) {
    pin_walk *w = ctx;
    if (nd->start >= w->n || nd->path[nd->start] != w->tokens[nd->start]) return 0;
    uint32_t m = nd->end < w->n ? nd->end : w->n;
    if (memcmp(nd->path, w->tokens, (size_t)m * sizeof *w->tokens)) return 0;
    for (uint32_t i = 0; i < nd->n_blocks; i++)
        if (nd->first_block + i < w->nb) w->blocks[nd->first_block + i] = nd->blocks[i];
    return 0;
}

/* Writes the whole blocks of the just pinned tokens[0..n) to the tiers
 * (those they lack): a pinned prefix is on disk from its pin on. */
static void tier_pin_publish(kp_engine *e, const int32_t *tokens, uint32_t n) {
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
    pin_walk w = {tokens, n, (n + B - 1) / B, NULL}; /* the partial last block too: a snapshot's tail */
    if (!w.nb || !(w.blocks = malloc((size_t)w.nb * sizeof *w.blocks))) return;
    for (uint32_t i = 0; i < w.nb; i++) w.blocks[i] = -1;
    uint32_t have = 0;
    if (kp_pfx_walk(e->idx, pin_visit, &w, NULL) == KP_OK)
        while (have < w.nb && w.blocks[have] >= 0) have++;
    uint32_t whole = have < n / B ? have : n / B;
    kp_kvseq view = {w.blocks, have, have, have * B < n ? have * B : n, NULL, 0, 0};
    /* those with their window rows (the others were queued before they dropped them) */
    if (whole) kp_tiers_publish(e->tiers, tokens, whole * B, &view);
    if (e->recurrent && have == w.nb && (n % B == 0 || kp_kvpool_has_window(e->kv, w.blocks[n / B])))
        tier_publish_states(e, tokens, &n, 1, &view); /* where the pin resumes */
    free(w.blocks);
}

/* A recurrent model's pin resumes from a snapshot at its end: when the
 * cached tokens[0..n) have none there, computes positions s..n again from
 * the latest one before (s, maybe 0) in a sequence of its own and hands
 * the state at n (and those at state points on the way) to the index. */
static kp_status pin_state(kp_engine *e, const int32_t *tokens, uint32_t n, kp_error *err) {
    kp_pfx_match_result mr;
    kp_pfx_match(e->idx, tokens, n, &mr);
    if (!e->recurrent || mr.n_match < n || n == 0) return KP_OK; /* kp_pfx_pin says what is missing */
    uint32_t s = kp_pfx_resume(e->idx, tokens, n);
    if (s == n) return KP_OK;
    kp_eng_seq q = {0};
    kp_status st = kp_pfx_acquire(e->idx, tokens, s, &q.kv, &q.lease, err);
    q.reused = s;
    q.prompt_end = n;
    if (st == KP_OK) st = reserve(e, &q, n, NULL, err);
    if (st == KP_OK) st = run_tokens(e, &q, tokens + s, n - s, 0, NULL, err);
    if (st == KP_OK) hand_states(e, &q, tokens, n);
    kp_eng_seq_abort(e, &q);
    return st;
}

kp_status kp_eng_pin(kp_engine *e, const int32_t *tokens, uint32_t n, int64_t ttl_seconds, int64_t now,
                     uint64_t *id, kp_error *err) {
    *id = 0;
    if (!e->idx) return kp_fail(err, KP_EUNSUPPORTED, "the prefix cache is off: nothing can be pinned");
    kp_status st = pin_state(e, tokens, n, err);
    if (st != KP_OK) return st;
    st = kp_pfx_pin(e->idx, tokens, n, ttl_seconds, now, id, err);
    if (st == KP_OK && e->tiers) tier_pin_publish(e, tokens, n);
    return st;
}

kp_status kp_eng_unpin(kp_engine *e, uint64_t id, kp_error *err) {
    if (!e->idx) return kp_fail(err, KP_ENOTFOUND, "no pin with id %llu (the prefix cache is off)",
                                (unsigned long long)id);
    return kp_pfx_unpin(e->idx, id, err);
}

uint32_t kp_eng_expire(kp_engine *e, int64_t now) { return e->idx ? kp_pfx_expire(e->idx, now) : 0; }

kp_status kp_eng_check(kp_engine *e, kp_error *err) { return e->idx ? kp_pfx_check(e->idx, err) : KP_OK; }

void kp_eng_set_attn_probe(kp_engine *e, int layer, int head) { kp_forward_set_probe(e->fw, layer, head); }

const float *kp_eng_attn_probe(const kp_engine *e, int32_t *n_pos) { return kp_forward_probe(e->fw, n_pos); }

/* ---- the synchronous generation loop ------------------------------------- */

kp_status kp_eng_generate(kp_engine *e, kp_eng_seq *seq, kp_gen *g, const kp_eng_gen_opts *o,
                          kp_eng_report *report, kp_error *err) {
    static const kp_eng_gen_opts none = {0};
    if (!o) o = &none;
    const int32_t *tok = kp_gen_tokens(g);
    uint32_t n_prompt = kp_gen_n_prompt(g), have = seq->kv.n_pos;
    kp_eng_report r;
    memset(&r, 0, sizeof r);
    r.cached_next = -1;
    r.prompt_tokens = n_prompt;
    if (report) *report = r;
    if (kp_gen_n_tokens(g) != n_prompt || kp_gen_finish(g) != KP_FINISH_NONE)
        return kp_fail(err, KP_EINVAL, "the generation has already run");
    bool empty = have == 0 && seq->kv.n_blocks == 0 && !seq->lease.node;
    if (!empty && have >= n_prompt)
        return kp_fail(err, KP_EINVAL, "the sequence holds %u positions, the prompt only %u", have, n_prompt);
    float *logits = malloc((size_t)e->m->hp.n_vocab * sizeof *logits);
    if (!logits) return kp_fail(err, KP_ENOMEM, "out of memory for a row of logits");
    kp_status st;
    if (empty) { /* through the prefix cache */
        st = prefill(e, tok, n_prompt, seq, logits, &r, o->batch, err);
    } else { /* the caller's sequence holds tok[0..have) already */
        r.reused_tokens = r.diverged_at_token = have;
        r.computed_tokens = n_prompt - have;
        st = kp_eng_append(e, seq, tok + have, n_prompt - have, o->batch, logits, err);
    }
    if (report) *report = r;
    if (st == KP_OK && o->on_prefill) o->on_prefill(o->ctx, &r);
    while (st == KP_OK) {
        kp_gen_out out;
        if ((st = kp_gen_step(g, logits, &out, err)) != KP_OK) break;
        if (o->on_step) o->on_step(o->ctx, &out);
        bool last = out.finish != KP_FINISH_NONE;
        if (last && !(o->decode_last && out.token >= 0 && seq->kv.n_pos < e->max_pos &&
                      (out.cause == KP_GEN_MAX_TOKENS || out.cause == KP_GEN_STOP_STRING)))
            break;
        if ((st = kp_eng_decode(e, seq, out.token, last ? NULL : logits, err)) != KP_OK) break;
        if (o->on_decode) o->on_decode(o->ctx, out.token, seq->kv.n_pos);
        if (last) break;
    }
    free(logits);
    return st;
}
