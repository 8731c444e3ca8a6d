/*
 * blockkey.h - the identity of a full KV block of a cached sequence
 * (floor 5): a chained 128-bit key, the same in every process and on every
 * machine.
 *
 *   key(block 0) = XXH3-128( 16 zero bytes       || t[0..B)    )
 *   key(block j) = XXH3-128( key(block j - 1)    || t[jB..jB+B) )
 *
 * where a key enters the hash as its 16 canonical bytes (XXH128's
 * big-endian form: high 64 bits first) and every token id as 4 bytes
 * little-endian. No seed, no process state: `xxhsum -H2` over the same
 * bytes prints the same value (tests/unit/test_blockkey.c checks that). A key
 * names a position in a token chain, not a model: the model fingerprint
 * (fingerprint.h) is the namespace keys live under.
 *
 * A recurrent-state snapshot after position pos (staterec.h) summarizes
 * tokens[0..pos), which may end inside a block: its key chains from the
 * key of the last whole block before pos, a tag that no block message
 * begins with in practice and pos itself (so it never equals a block key
 * of the same tokens):
 *
 *   key(state @pos) = XXH3-128( "kvpin-state\0" || pos (4 bytes LE)
 *                               || key(block pos/B - 1), or 16 zero bytes
 *                               || t[(pos/B)B .. pos) )
 */
#ifndef KP_BLOCKKEY_H
#define KP_BLOCKKEY_H

#include <stdbool.h>
#include <stdint.h>

/* 16 bytes, canonical (big-endian) XXH128 order. {0} is the root's key. */
typedef struct {
    uint8_t b[16];
} kp_bkey;

/* The key of the block holding tokens[0..n) whose parent block has key
 * *parent (NULL: the first block of a sequence). */
kp_bkey kp_bkey_next(const kp_bkey *parent, const int32_t *tokens, uint32_t n);

/* The keys of the whole blocks of tokens[0..n) in blocks of B: out[j] for
 * j < n / B (out holds at least n / B keys). Returns n / B. */
uint32_t kp_bkey_chain(const int32_t *tokens, uint32_t n, uint32_t B, kp_bkey *out);

/* The key of the state snapshot after position pos = parent's block
 * chain end + tail[0..n_tail) (n_tail = pos % B; parent: the key of block
 * pos / B - 1, NULL when pos < B). */
kp_bkey kp_bkey_state(const kp_bkey *parent, const int32_t *tail, uint32_t n_tail, uint32_t pos);

bool kp_bkey_eq(const kp_bkey *a, const kp_bkey *b);

/* 32 lowercase hex digits and a NUL into hex[33]. */
void kp_bkey_hex(const kp_bkey *k, char hex[33]);

/* Parses 32 hex digits (no more, no less); false on anything else. */
bool kp_bkey_parse(const char *hex, kp_bkey *out);

/* A 64-bit digest of the key for hash tables (its first 8 bytes). */
uint64_t kp_bkey_h64(const kp_bkey *k);

#endif
