/*
 * blockrec.h - one KV block as bytes, for the disk and Redis tiers
 * (floor 5): the record format, its encoder and its verifying decoder.
 *
 * Record layout (all integers little-endian; keys and hashes 16 canonical
 * XXH128 bytes):
 *
 *   offset        size        field
 *   0             8           magic "KVPINBLK"
 *   8             4           version (KP_BLOCKREC_VERSION, 1)
 *   12            4           n_layer
 *   16            16          model fingerprint (fingerprint.h)
 *   32            16          key of this block (blockkey.h)
 *   48            16          key of the parent block (zeros for block 0)
 *   64            4           n_tokens (= the block size)
 *   68            4           flags: KP_BLOCKREC_SEALED (a MAC follows), else 0
 *   72            8           kv_bytes: K/V bytes that follow the tokens
 *   80            16          XXH3-128 of the kv_bytes K/V bytes
 *   96            4*n_tokens  token ids, int32
 *   96+4n         kv_bytes    per layer l = 0..n_layer-1: the K rows of
 *                             kv-head 0..H-1 (n_tokens x head_dim elements
 *                             each), then the V rows of kv-head 0..H-1
 *   total = 96 + 4 * n_tokens + kv_bytes
 *   [total        32          sealed records: HMAC-SHA-512-256 (libsodium's
 *                             crypto_auth) of bytes 0..total under the tiers'
 *                             key (--cache-key-file)]
 *
 * Without a MAC the store must be trusted: XXH3 finds corruption, not an
 * attacker who recomputes it. With a key, a tier seals every record it
 * writes and refuses (reason "mac") every record that is not sealed with
 * that key, so whoever can write to the directory or the Redis database
 * cannot steer a replica's answers. A reader without a key ignores a seal.
 *
 * kp_blockrec_check verifies, in order: the length (truncated), the magic and
 * version (format), the fingerprint (fingerprint), the key and the tokens
 * against what the caller expects (tokens), kv_bytes against the layout
 * (format), and the checksum of the K/V bytes (checksum). Any failure is a
 * miss with that reason, never rows handed on.
 */
#ifndef KP_BLOCKREC_H
#define KP_BLOCKREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/blockkey.h"
#include "kv/kvpool.h"

#define KP_BLOCKREC_VERSION 1
#define KP_BLOCKREC_HEADER 96
#define KP_BLOCKREC_SEALED 1u     /* header flag: a MAC follows the record */
#define KP_BLOCKREC_MAC_BYTES 32  /* crypto_auth_BYTES */
#define KP_BLOCKREC_KEY_BYTES 32  /* crypto_auth_KEYBYTES */

/* Why a record was refused (or KP_BLOCKREC_OK). */
typedef enum {
    KP_BLOCKREC_OK = 0,
    KP_BLOCKREC_MISSING,     /* no record under that key */
    KP_BLOCKREC_TRUNCATED,   /* shorter (or longer) than its header says */
    KP_BLOCKREC_FORMAT,      /* bad magic, version or sizes */
    KP_BLOCKREC_FINGERPRINT, /* made under another model fingerprint */
    KP_BLOCKREC_TOKENS,      /* another key or other tokens than the prompt's */
    KP_BLOCKREC_CHECKSUM,    /* K/V bytes differ from their checksum */
    KP_BLOCKREC_IO,          /* read error */
    KP_BLOCKREC_TIMEOUT,     /* the tier did not answer in time */
    KP_BLOCKREC_MAC,         /* not sealed, or sealed under another key, where a key is set */
    KP_BLOCKREC_N_REASONS
} kp_blockrec_reason;

/* "missing", "truncated", "format", "fingerprint", "tokens", "checksum",
 * "io", "timeout", "mac" ("ok" for KP_BLOCKREC_OK). */
const char *kp_blockrec_reason_name(kp_blockrec_reason r);

/* K/V bytes of one block of pool p: the pool's block_bytes. */
size_t kp_blockrec_kv_bytes(const kp_kvpool *p);

/* Record size for a block of pool p. */
size_t kp_blockrec_size(const kp_kvpool *p);

/* Writes the record of block `block` of pool p into out[kp_blockrec_size(p)]:
 * its tokens[0..block_size), keys and fingerprint as given. */
void kp_blockrec_encode(uint8_t *out, const kp_kvpool *p, int32_t block, const kp_bkey *fp, const kp_bkey *key,
                    const kp_bkey *parent, const int32_t *tokens);

/* Verifies rec[0..len) as the record of key `key` holding tokens[0..block_size)
 * under fingerprint fp for pool p's layout. KP_BLOCKREC_OK or the reason. */
kp_blockrec_reason kp_blockrec_check(const uint8_t *rec, size_t len, const kp_kvpool *p, const kp_bkey *fp,
                             const kp_bkey *key, const int32_t *tokens);

/* Copies the K/V rows of a checked record into block `block` of pool p. */
void kp_blockrec_load(const uint8_t *rec, kp_kvpool *p, int32_t block);

/* Reading a record in place (the disk tier): the head (header and tokens,
 * kp_blockrec_head_size bytes) into a buffer, the K/V runs straight into the
 * pool's block (kp_blockrec_iov), then kp_blockrec_check_head and kp_blockrec_sum_ok,
 * which together verify what kp_blockrec_check does, without a copy of the
 * record. On a refusal the block holds garbage: only a block that held no
 * rows of its own may be read in place. */
size_t kp_blockrec_head_size(const kp_kvpool *p);

/* The record-order K/V runs of block `block` of pool p as iov[0..n) (n =
 * 2 x n_layer x n_head_kv), the record's K/V part byte for byte. */
struct iovec;
int kp_blockrec_n_runs(const kp_kvpool *p);
void kp_blockrec_iov(const kp_kvpool *p, int32_t block, struct iovec *iov);

/* kp_blockrec_check's checks but the checksum, on a head of kp_blockrec_head_size
 * bytes from a record of file_len bytes. */
kp_blockrec_reason kp_blockrec_check_head(const uint8_t *head, size_t file_len, const kp_kvpool *p, const kp_bkey *fp,
                                  const kp_bkey *key, const int32_t *tokens);

/* True when the K/V rows of block `block` of pool p hash to the checksum
 * in head (XXH3-128 over the runs in record order, as kp_blockrec_encode). */
bool kp_blockrec_sum_ok(const uint8_t *head, const kp_kvpool *p, int32_t block);

/* ---- sealed records (a keyed MAC) ---- */

/* The tiers' MAC key from file path: 32 raw bytes, or 64 hex digits (then
 * whitespace allowed around them). KP_EIO (unreadable), KP_EINVAL (any
 * other content), with the reason. */
kp_status kp_blockrec_key_load(const char *path, uint8_t key[KP_BLOCKREC_KEY_BYTES], kp_error *err);

/* Seals the encoded record rec[0..len): sets the flag, then writes the MAC
 * of rec[0..len) at rec[len..len + KP_BLOCKREC_MAC_BYTES) (the buffer must
 * hold that). */
void kp_blockrec_seal(uint8_t *rec, size_t len, const uint8_t key[KP_BLOCKREC_KEY_BYTES]);

/* The reader's side, before kp_blockrec_check: *body_len gets the length of
 * the record without its MAC. With key: KP_BLOCKREC_MAC unless the record
 * is sealed and its MAC is right. Without key (NULL): a seal is skipped. */
kp_blockrec_reason kp_blockrec_unseal(const uint8_t *rec, size_t len, const uint8_t *key, size_t *body_len);

/* The same for a record read in place (kp_blockrec_iov): its head, its K/V
 * runs where they were read to, and the tag read from after them. */
bool kp_blockrec_mac_ok_iov(const uint8_t *head, size_t head_len, const struct iovec *iov, int n,
                            const uint8_t tag[KP_BLOCKREC_MAC_BYTES], const uint8_t key[KP_BLOCKREC_KEY_BYTES]);

/* Whether a record's head says it is sealed. */
bool kp_blockrec_sealed(const uint8_t *head);

/* The records' little-endian fields (blockrec.c, staterec.c). */
static inline void kp_rec_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kp_rec_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t kp_rec_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kp_rec_get64(const uint8_t *p) {
    return (uint64_t)kp_rec_get32(p) | (uint64_t)kp_rec_get32(p + 4) << 32;
}

#endif
