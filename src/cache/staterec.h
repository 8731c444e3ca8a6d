/*
 * staterec.h - recurrent-state snapshot records (floor 5): one snapshot
 * of a hybrid model's recurrent state (prefix.h's kp_pfx_state, engine.c's
 * state checkpoints) as bytes a tier below RAM stores, verified as a KV
 * block record is (blockrec.h).
 *
 * A snapshot after position pos summarizes tokens[0..pos). The tiers hold
 * whole blocks only, and pos often ends inside one (a prompt's or an
 * answer's end), so the record also carries the K/V rows of that partial
 * block's first pos % B positions: whole block records [0, pos/B) plus
 * this record give a sequence everything it needs to resume at pos.
 *
 *   offset  size   meaning
 *   0       8      magic "KVPINSTA"
 *   8       4      version (KP_STATEREC_VERSION)
 *   12      4      n_layer of the pool (attention layers with K/V)
 *   16      16     model fingerprint id (fingerprint.h)
 *   32      16     the snapshot's key (blockkey.h's kp_bkey_state)
 *   48      16     key of block pos/B - 1 (zero when pos < B): the chain it ends
 *   64      4      pos
 *   68      4      flags: bit 0 sealed (a MAC follows; the same place as a
 *                  block record's, so blockrec.h's seal functions apply)
 *   72      8      state_bytes
 *   80      16     XXH3-128 (canonical) of everything after the tail tokens:
 *                  the tail rows, then the state
 *   96      4 t    the tail's tokens, t = pos % B (4 bytes LE each)
 *   ...            tail rows: per (layer, K|V, kv-head) in blockrec.h's run
 *                  order, the first t rows of that run
 *   ...     S      the state, state_bytes bytes (float32, the forward pass's
 *                  layout: kvpool.h's rstate)
 *   [+32           the MAC of all of the above, when sealed]
 *
 * kp_staterec_check verifies, in order: the length (truncated), magic and
 * version (format), the fingerprint (fingerprint), sizes against the
 * pool's layout and the state size (format), the key, the parent key, pos
 * and the tail tokens against what the caller expects (tokens), and the
 * checksum (checksum). Any failure is a miss with that reason: a snapshot
 * is never applied to another prefix or model, nor with damaged bytes.
 */
#ifndef KP_STATEREC_H
#define KP_STATEREC_H

#include <stddef.h>
#include <stdint.h>

#include "cache/blockkey.h"
#include "cache/blockrec.h"
#include "kv/kvpool.h"

#define KP_STATEREC_VERSION 1
#define KP_STATEREC_HEADER 96

/* Record size (without a MAC) of a snapshot at pos of state_bytes bytes
 * over pool p's layout. */
size_t kp_staterec_size(const kp_kvpool *p, uint32_t pos, uint64_t state_bytes);

/* Writes the record of the snapshot at pos into out[kp_staterec_size]:
 * the tail tokens tail[0..pos % B) and their rows, the first pos % B rows
 * of pool block tail_block (unused when pos % B == 0), and state. */
void kp_staterec_encode(uint8_t *out, const kp_kvpool *p, const kp_bkey *fp, const kp_bkey *key,
                        const kp_bkey *parent, uint32_t pos, const int32_t *tail, int32_t tail_block,
                        const float *state, uint64_t state_bytes);

/* Verifies rec[0..len) (without its MAC: kp_blockrec_unseal first) as the
 * record of key, at pos after the chain parent and the tail tokens
 * tail[0..pos % B), under fingerprint fp, with a state of state_bytes.
 * KP_BLOCKREC_OK or the reason. */
kp_blockrec_reason kp_staterec_check(const uint8_t *rec, size_t len, const kp_kvpool *p, const kp_bkey *fp,
                                     const kp_bkey *key, const kp_bkey *parent, uint32_t pos, const int32_t *tail,
                                     uint64_t state_bytes);

/* Copies a checked record's tail rows into the first pos % B rows of pool
 * block tail_block (not touched when pos % B == 0) and its state into
 * state[state_bytes / 4]. */
void kp_staterec_load(const uint8_t *rec, kp_kvpool *p, int32_t tail_block, float *state);

#endif
