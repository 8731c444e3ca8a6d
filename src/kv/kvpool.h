/*
 * kvpool.h - the KV cache storage: fixed-size blocks of positions from one
 * pool sized by a byte budget, and per-sequence block tables.
 *
 * One block id covers every layer. The pool is laid out run by run: for
 * each layer and kv-head, the keys of block 0, block 1, ... side by side,
 * then the values, so a sequence whose blocks have consecutive ids (the
 * free list hands out low ids first) is one long stream per layer and head,
 * which the hardware prefetcher follows in decode:
 *
 *   pool (n_blocks blocks; a K run = B * k_row bytes, a V run = B * v_row)
 *   +--------------------------------------------------------------------+
 *   | layer 0, head 0, K | run of block 0 | run of block 1 | ... | n-1   |
 *   | layer 0, head 0, V | run of block 0 | run of block 1 | ...         |
 *   | layer 0, head 1, K | ...                                           |
 *   | ...                                                                |
 *   | layer L-1, head H-1, V | ...                                       |
 *   +--------------------------------------------------------------------+
 *
 *   a run: K (or V) [pos 0..B-1][row], the block's positions in order
 *   row: head_dim elements of the K (V) type: kp_dtype_row_size(type,
 *        head_dim) bytes: 4 x head_dim (F32), 2 x head_dim (F16), or
 *        head_dim / 32 ggml blocks (Q8_0: fp16 scale + 32 int8 = 34 bytes;
 *        Q4_0: fp16 scale + 16 bytes of nibbles = 18 bytes), so a row is
 *        exactly what ggml's quantize_row_q8_0 / q4_0 write for it
 *   block_bytes = n_layer * n_head_kv * B * (k_row + v_row)
 *
 * Window arena. A model with sliding-window layers (model.h's WINDOW
 * layers, which read the last `window` positions only) passes the layer
 * kinds (window_layers); their rows then live in a second arena of window
 * slots, laid out as the main one, and a block's window rows are the slot
 * win_slot[block] (-1: none). The main arena holds the FULL layers only:
 *
 *   main arena   (n_blocks runs)  | full layer 0, head 0, K | blk 0 | blk 1 | ... |
 *                                 | ... every FULL layer and head, K and V      |
 *   window arena (n_slots runs)   | window layer 0, head 0, K | slot 0 | slot 1 |..|
 *                                 | ... every WINDOW layer and head, K and V    |
 *
 *   win_slot: block 0 -> slot 0, block 1 -> -1 (dropped), block 2 -> slot 1 ...
 *
 * Without a window budget (window_budget_bytes 0, the default) there is a
 * slot for every block and win_slot[b] == b, always: a block holds every
 * layer's rows, as before, and both arenas are one stream per layer and
 * head over consecutive block ids. With a budget the window arena has
 * window_budget_bytes / (a block's window rows) slots, taken from
 * budget_bytes; the main arena gets the rest. A block is allocated without
 * window rows; its user attaches a slot (kp_kvpool_attach_window, low ids
 * first, so a sequence's slots are mostly consecutive too) before writing
 * it, and may drop them (kp_kvpool_drop_window) once no query will read
 * them: a WINDOW layer's query at q reads positions q - window < p <= q
 * only. A holder whose window went past a block marks its reference done
 * (kp_kvpool_window_done), so kp_kvpool_window_readers tells a shared
 * block's holders that still read its window rows from the others. Freeing
 * a block frees its slot. Reading the window rows of a block without a
 * slot is a bug (asserted).
 *
 * Position p of a sequence lives in block table[p / B], row p % B.
 * Blocks are reference-counted so several sequences (and the prefix index)
 * can share them; a block returns to the free list when its count drops to
 * zero. A pool with no free block answers KP_EFULL: an expected state, not a
 * crash. Element types F32, F16, Q8_0 or Q4_0, for K and V separately; the
 * block types need head_dim a multiple of 32 (a clear KP_EINVAL otherwise).
 */
#ifndef KP_KVPOOL_H
#define KP_KVPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/dtype.h"
#include "base/status.h"

typedef struct kp_kvpool kp_kvpool;

typedef struct {
    uint32_t n_layer, n_head_kv, head_dim;
    kp_dtype kv_type;      /* K rows: F32, F16, Q8_0 or Q4_0 */
    uint32_t block_size;   /* positions per block, >= 1 */
    uint64_t budget_bytes; /* the pool holds floor(budget / block_bytes) blocks */
    kp_dtype kv_type_v;    /* V rows: F32, F16, Q8_0 or Q4_0 */
    const uint8_t *window_layers; /* [n_layer]: nonzero for a WINDOW layer (copied);
                                     NULL: every layer in the main arena */
    uint32_t window;       /* positions a WINDOW layer reads (model.h n_swa) */
    uint64_t window_budget_bytes; /* with WINDOW layers: the window arena's share of
                                     budget_bytes; 0: a window slot per block */
} kp_kvpool_config;
/* KP_OK when t can hold K or V rows of head_dim elements; else KP_EINVAL
 * with a message naming which (what "K" or "V") and why. */
kp_status kp_kvpool_check_type(kp_dtype t, uint32_t head_dim, const char *what, kp_error *err);

kp_status kp_kvpool_new(kp_kvpool **out, const kp_kvpool_config *cfg, kp_error *err);
void kp_kvpool_free(kp_kvpool *p);

const kp_kvpool_config *kp_kvpool_config_of(const kp_kvpool *p);
/* Bytes of one cached K (V) row of head_dim elements. */
size_t kp_kvpool_k_row_bytes(const kp_kvpool *p);
size_t kp_kvpool_v_row_bytes(const kp_kvpool *p);
uint32_t kp_kvpool_n_blocks(const kp_kvpool *p);
uint32_t kp_kvpool_n_free(const kp_kvpool *p);
/* A block's rows, window rows included: full_bytes + window_bytes. */
uint64_t kp_kvpool_block_bytes(const kp_kvpool *p);
uint64_t kp_kvpool_full_bytes(const kp_kvpool *p);   /* a block's rows in the main arena */
uint64_t kp_kvpool_window_bytes(const kp_kvpool *p); /* ... in the window arena (0: none) */
/* True when the window arena has a budget (slots apart from blocks). */
bool kp_kvpool_window_budgeted(const kp_kvpool *p);
uint32_t kp_kvpool_n_slots(const kp_kvpool *p);      /* 0 without WINDOW layers */
uint32_t kp_kvpool_n_free_slots(const kp_kvpool *p); /* 0 without a window budget */
bool kp_kvpool_is_window_layer(const kp_kvpool *p, uint32_t layer);
/* True when block holds its WINDOW layers' rows (always without a budget). */
bool kp_kvpool_has_window(const kp_kvpool *p, int32_t block);
/* Gives a block in use a window slot if it has none; KP_EFULL when every
 * slot is taken (the block keeps none). The slot's rows are undefined. */
kp_status kp_kvpool_attach_window(kp_kvpool *p, int32_t block, kp_error *err);
/* Drops the block's window rows (its slot goes back); no-op without a
 * budget or without a slot. The caller knows no one will read them. */
void kp_kvpool_drop_window(kp_kvpool *p, int32_t block);
/* Window readers. A reference whose holder will read the block's window
 * rows no more (a sequence whose window went past it: kp_kvseq.win_done)
 * is marked done (kp_kvpool_window_done; undone before it is dropped,
 * kp_kvpool_window_undone: kp_kvseq_truncate does it);
 * kp_kvpool_window_readers answers the references not marked, so whoever
 * drops window rows of shared blocks (prefix.h's kp_pfx_drop_windows)
 * knows whether a running sequence still reads them. */
void kp_kvpool_window_done(kp_kvpool *p, int32_t block);
void kp_kvpool_window_undone(kp_kvpool *p, int32_t block);
uint32_t kp_kvpool_window_readers(const kp_kvpool *p, int32_t block);

/* Takes a free block (refcount 1) into *id, or KP_EFULL. */
kp_status kp_kvpool_alloc(kp_kvpool *p, int32_t *id, kp_error *err);
void kp_kvpool_ref(kp_kvpool *p, int32_t id);
void kp_kvpool_unref(kp_kvpool *p, int32_t id);
uint32_t kp_kvpool_refcount(const kp_kvpool *p, int32_t id);
/* Copies every row of block src into block dst (copy-on-write), window
 * rows when src has them (dst gets a slot first: KP_EFULL, nothing
 * copied, when none is free). */
kp_status kp_kvpool_copy(kp_kvpool *p, int32_t dst, int32_t src, kp_error *err);

/* Base of the K (or V) rows of (block, layer, kv_head): block_size rows of
 * kp_kvpool_k_row_bytes (v_row_bytes) bytes each, row i at base + i * that.
 * Quantized rows are byte arrays of ggml blocks (no alignment beyond 1). */
void *kp_kvpool_k(const kp_kvpool *p, int32_t block, uint32_t layer, uint32_t head);
void *kp_kvpool_v(const kp_kvpool *p, int32_t block, uint32_t layer, uint32_t head);

/* A block as plain storage (the prefix index keeps recurrent-state
 * snapshots in blocks, prefix.h): kp_kvpool_put writes src[0..n) over the
 * block's main-arena runs in layout order (every FULL layer and head, its
 * K run then its V run), kp_kvpool_get reads them back; n is at most
 * kp_kvpool_full_bytes. The block must be in use. */
void kp_kvpool_put(kp_kvpool *p, int32_t block, const void *src, uint64_t n);
void kp_kvpool_get(const kp_kvpool *p, int32_t block, void *dst, uint64_t n);

/* A sequence's view of the pool: the blocks that hold its positions. */
typedef struct {
    int32_t *blocks;     /* owned array; each entry holds one reference */
    uint32_t n_blocks;
    uint32_t cap_blocks;
    uint32_t n_pos;      /* positions written so far (the cache length) */
    /* A model with recurrent layers (model.h, Hybrid): the sequence's
     * recurrent state (kp_model_rec_state_floats floats, owned, made by the
     * forward pass at the sequence's first batch) and the position it
     * summarizes: every position before rstate_pos. Unlike K/V rows it
     * cannot be cut back, so the pass only ever extends a sequence from
     * rstate_pos, or restarts it from position 0 (a zero state). Its memory
     * is outside the pool's budget. NULL / 0 for other models. */
    float *rstate;
    uint32_t rstate_pos;
    uint32_t win_done;   /* its references to blocks [0, win_done) are marked done: it reads
                            their window rows no more (kp_kvpool_window_done) */
} kp_kvseq;

/* Makes sure positions [0, n_pos) have blocks, allocating new ones; on
 * KP_EFULL nothing the sequence already had is lost. */
kp_status kp_kvseq_reserve(kp_kvseq *s, kp_kvpool *p, uint32_t n_pos, kp_error *err);
/* Drops every block reference, frees the recurrent state and empties the
 * sequence. */
void kp_kvseq_release(kp_kvseq *s, kp_kvpool *p);
/* Forgets positions >= n_pos (drops whole blocks past it, undoing their
 * window-done marks). */
void kp_kvseq_truncate(kp_kvseq *s, kp_kvpool *p, uint32_t n_pos);

#endif
