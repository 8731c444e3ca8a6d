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
 *   pool (n_blocks blocks; a run = B * head_dim * esize bytes)
 *   +--------------------------------------------------------------------+
 *   | layer 0, head 0, K | run of block 0 | run of block 1 | ... | n-1   |
 *   | layer 0, head 0, V | run of block 0 | run of block 1 | ...         |
 *   | layer 0, head 1, K | ...                                           |
 *   | ...                                                                |
 *   | layer L-1, head H-1, V | ...                                       |
 *   +--------------------------------------------------------------------+
 *
 *   a run: K (or V) [pos 0..B-1][head_dim], the block's positions in order
 *   block_bytes = n_layer * n_head_kv * 2 * B * head_dim * esize
 *
 * Position p of a sequence lives in block table[p / B], row p % B.
 * Blocks are reference-counted so several sequences (and the prefix index)
 * can share them; a block returns to the free list when its count drops to
 * zero. A pool with no free block answers KP_EFULL: an expected state, not a
 * crash. Element type F32 or F16.
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
    kp_dtype kv_type;      /* KP_DTYPE_F32 or KP_DTYPE_F16 */
    uint32_t block_size;   /* positions per block, >= 1 */
    uint64_t budget_bytes; /* the pool holds floor(budget / block_bytes) blocks */
} kp_kvpool_config;

kp_status kp_kvpool_new(kp_kvpool **out, const kp_kvpool_config *cfg, kp_error *err);
void kp_kvpool_free(kp_kvpool *p);

const kp_kvpool_config *kp_kvpool_config_of(const kp_kvpool *p);
uint32_t kp_kvpool_n_blocks(const kp_kvpool *p);
uint32_t kp_kvpool_n_free(const kp_kvpool *p);
uint64_t kp_kvpool_block_bytes(const kp_kvpool *p);

/* Takes a free block (refcount 1) into *id, or KP_EFULL. */
kp_status kp_kvpool_alloc(kp_kvpool *p, int32_t *id, kp_error *err);
void kp_kvpool_ref(kp_kvpool *p, int32_t id);
void kp_kvpool_unref(kp_kvpool *p, int32_t id);
uint32_t kp_kvpool_refcount(const kp_kvpool *p, int32_t id);
/* Copies every row of block src into block dst (copy-on-write). */
void kp_kvpool_copy(kp_kvpool *p, int32_t dst, int32_t src);

/* Base of the K (or V) rows of (block, layer, kv_head): block_size rows of
 * head_dim elements of kv_type. */
void *kp_kvpool_k(const kp_kvpool *p, int32_t block, uint32_t layer, uint32_t head);
void *kp_kvpool_v(const kp_kvpool *p, int32_t block, uint32_t layer, uint32_t head);

/* A sequence's view of the pool: the blocks that hold its positions. */
typedef struct {
    int32_t *blocks;     /* owned array; each entry holds one reference */
    uint32_t n_blocks;
    uint32_t cap_blocks;
    uint32_t n_pos;      /* positions written so far (the cache length) */
} kp_kvseq;

/* Makes sure positions [0, n_pos) have blocks, allocating new ones; on
 * KP_EFULL nothing the sequence already had is lost. */
kp_status kp_kvseq_reserve(kp_kvseq *s, kp_kvpool *p, uint32_t n_pos, kp_error *err);
/* Drops every block reference and empties the sequence. */
void kp_kvseq_release(kp_kvseq *s, kp_kvpool *p);
/* Forgets positions >= n_pos (drops whole blocks past it). */
void kp_kvseq_truncate(kp_kvseq *s, kp_kvpool *p, uint32_t n_pos);

#endif
