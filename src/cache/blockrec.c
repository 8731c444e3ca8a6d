/*
 * blockrec.c - KV block records (blockrec.h). Stateless; the caller owns
 * every buffer.
 *
 * The K/V part follows the pool's accessors (kp_kvpool_k / kp_kvpool_v),
 * one run of block_size * head_dim elements per (layer, kv-head, K|V), so
 * a record is independent of where the block sat in its pool.
 */
#include "cache/blockrec.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>

#include <string.h>
#include <sys/uio.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

static const char magic[8] = {'K', 'V', 'P', 'I', 'N', 'B', 'L', 'K'};

const char *kp_blockrec_reason_name(kp_blockrec_reason r) {
    static const char *const names[KP_BLOCKREC_N_REASONS] = {"ok",          "missing",  "truncated", "format",
                                                         "fingerprint", "tokens",   "checksum",  "io",
                                                         "timeout",     "mac"};
    return (unsigned)r < KP_BLOCKREC_N_REASONS ? names[r] : "?";
}


/* One (layer, kv-head, K|V) run: the pool's block bytes over its runs. */
/* One (layer, kv-head) run of K (isv false) or V: block_size rows of its
 * type (K and V may be of different types, so of different sizes). */
static size_t run_bytes(const kp_kvpool *p, bool isv) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    return (isv ? kp_kvpool_v_row_bytes(p) : kp_kvpool_k_row_bytes(p)) * c->block_size;
}

size_t kp_blockrec_kv_bytes(const kp_kvpool *p) { return (size_t)kp_kvpool_block_bytes(p); }

size_t kp_blockrec_size(const kp_kvpool *p) {
    return KP_BLOCKREC_HEADER + 4 * (size_t)kp_kvpool_config_of(p)->block_size + kp_blockrec_kv_bytes(p);
}

/* Calls fn for each run of the block in record order. */
#define FOR_RUNS(c, l, h, kv)                                   \
    for (uint32_t l = 0; l < (c)->n_layer; l++)                 \
        for (int kv = 0; kv < 2; kv++)                          \
            for (uint32_t h = 0; h < (c)->n_head_kv; h++)

void kp_blockrec_encode(uint8_t *out, const kp_kvpool *p, int32_t block, const kp_bkey *fp, const kp_bkey *key,
                    const kp_bkey *parent, const int32_t *tokens) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    size_t kvb = kp_blockrec_kv_bytes(p);
    memset(out, 0, KP_BLOCKREC_HEADER);
    memcpy(out, magic, 8);
    kp_rec_put32(out + 8, KP_BLOCKREC_VERSION);
    kp_rec_put32(out + 12, c->n_layer);
    memcpy(out + 16, fp->b, 16);
    memcpy(out + 32, key->b, 16);
    memcpy(out + 48, parent->b, 16);
    kp_rec_put32(out + 64, c->block_size);
    kp_rec_put64(out + 72, kvb);
    uint8_t *t = out + KP_BLOCKREC_HEADER;
    for (uint32_t i = 0; i < c->block_size; i++) kp_rec_put32(t + 4 * i, (uint32_t)tokens[i]);
    uint8_t *kv = t + 4 * (size_t)c->block_size, *q = kv;
    FOR_RUNS(c, l, h, isv) {
        memcpy(q, isv ? kp_kvpool_v(p, block, l, h) : kp_kvpool_k(p, block, l, h), run_bytes(p, isv));
        q += run_bytes(p, isv);
    }
    XXH128_canonical_t cs;
    XXH128_canonicalFromHash(&cs, XXH3_128bits(kv, kvb));
    memcpy(out + 80, cs.digest, 16);
}

kp_blockrec_reason kp_blockrec_check_head(const uint8_t *head, size_t file_len, const kp_kvpool *p, const kp_bkey *fp,
                                  const kp_bkey *key, const int32_t *tokens) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    if (file_len < KP_BLOCKREC_HEADER) return KP_BLOCKREC_TRUNCATED;
    if (memcmp(head, magic, 8) || kp_rec_get32(head + 8) != KP_BLOCKREC_VERSION) return KP_BLOCKREC_FORMAT;
    if (memcmp(head + 16, fp->b, 16)) return KP_BLOCKREC_FINGERPRINT;
    uint32_t n = kp_rec_get32(head + 64);
    uint64_t kvb = kp_rec_get64(head + 72);
    if (n != c->block_size || kp_rec_get32(head + 12) != c->n_layer || kvb != kp_blockrec_kv_bytes(p)) return KP_BLOCKREC_FORMAT;
    if (file_len != KP_BLOCKREC_HEADER + 4 * (size_t)n + kvb) return KP_BLOCKREC_TRUNCATED;
    if (memcmp(head + 32, key->b, 16)) return KP_BLOCKREC_TOKENS;
    const uint8_t *t = head + KP_BLOCKREC_HEADER;
    for (uint32_t i = 0; i < n; i++)
        if ((int32_t)kp_rec_get32(t + 4 * i) != tokens[i]) return KP_BLOCKREC_TOKENS;
    return KP_BLOCKREC_OK;
}

kp_blockrec_reason kp_blockrec_check(const uint8_t *rec, size_t len, const kp_kvpool *p, const kp_bkey *fp,
                             const kp_bkey *key, const int32_t *tokens) {
    kp_blockrec_reason r = kp_blockrec_check_head(rec, len, p, fp, key, tokens);
    if (r != KP_BLOCKREC_OK) return r;
    XXH128_canonical_t cs;
    XXH128_canonicalFromHash(&cs, XXH3_128bits(rec + kp_blockrec_head_size(p), kp_blockrec_kv_bytes(p)));
    return memcmp(rec + 80, cs.digest, 16) ? KP_BLOCKREC_CHECKSUM : KP_BLOCKREC_OK;
}

size_t kp_blockrec_head_size(const kp_kvpool *p) {
    return KP_BLOCKREC_HEADER + 4 * (size_t)kp_kvpool_config_of(p)->block_size;
}

int kp_blockrec_n_runs(const kp_kvpool *p) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    return (int)(2 * c->n_layer * c->n_head_kv);
}

void kp_blockrec_iov(const kp_kvpool *p, int32_t block, struct iovec *iov) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    int i = 0;
    FOR_RUNS(c, l, h, isv) {
        iov[i].iov_base = isv ? kp_kvpool_v(p, block, l, h) : kp_kvpool_k(p, block, l, h);
        iov[i++].iov_len = run_bytes(p, isv);
    }
}

bool kp_blockrec_sum_ok(const uint8_t *head, const kp_kvpool *p, int32_t block) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    FOR_RUNS(c, l, h, isv) {
        XXH3_128bits_update(&st, isv ? kp_kvpool_v(p, block, l, h) : kp_kvpool_k(p, block, l, h), run_bytes(p, isv));
    }
    XXH128_canonical_t cs;
    XXH128_canonicalFromHash(&cs, XXH3_128bits_digest(&st));
    return memcmp(head + 80, cs.digest, 16) == 0;
}

void kp_blockrec_load(const uint8_t *rec, kp_kvpool *p, int32_t block) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    const uint8_t *q = rec + KP_BLOCKREC_HEADER + 4 * (size_t)c->block_size;
    FOR_RUNS(c, l, h, isv) {
        memcpy(isv ? kp_kvpool_v(p, block, l, h) : kp_kvpool_k(p, block, l, h), q, run_bytes(p, isv));
        q += run_bytes(p, isv);
    }
}

/* ---- sealed records ---- */

kp_status kp_blockrec_key_load(const char *path, uint8_t key[KP_BLOCKREC_KEY_BYTES], kp_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kp_fail(err, KP_EIO, "cannot read the cache key file %s: %s", path, strerror(errno));
    uint8_t buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (n == KP_BLOCKREC_KEY_BYTES) {
        memcpy(key, buf, n);
        sodium_memzero(buf, sizeof buf);
        return KP_OK;
    }
    size_t a = 0, b = n;
    while (a < b && isspace(buf[a])) a++;
    while (b > a && isspace(buf[b - 1])) b--;
    size_t used = 0;
    bool ok = b - a == 2 * KP_BLOCKREC_KEY_BYTES &&
              sodium_hex2bin(key, KP_BLOCKREC_KEY_BYTES, (const char *)buf + a, b - a, NULL, &used, NULL) == 0 &&
              used == KP_BLOCKREC_KEY_BYTES;
    sodium_memzero(buf, sizeof buf);
    if (!ok)
        return kp_fail(err, KP_EINVAL,
                       "the cache key file %s must hold 32 bytes, or 64 hex digits (openssl rand -hex 32)", path);
    return KP_OK;
}

bool kp_blockrec_sealed(const uint8_t *head) { return (kp_rec_get32(head + 68) & KP_BLOCKREC_SEALED) != 0; }

void kp_blockrec_seal(uint8_t *rec, size_t len, const uint8_t key[KP_BLOCKREC_KEY_BYTES]) {
    kp_rec_put32(rec + 68, kp_rec_get32(rec + 68) | KP_BLOCKREC_SEALED);
    crypto_auth(rec + len, rec, len, key);
}

kp_blockrec_reason kp_blockrec_unseal(const uint8_t *rec, size_t len, const uint8_t *key, size_t *body_len) {
    *body_len = len;
    bool sealed = len >= KP_BLOCKREC_HEADER + KP_BLOCKREC_MAC_BYTES && kp_blockrec_sealed(rec);
    if (sealed) *body_len = len - KP_BLOCKREC_MAC_BYTES;
    if (!key) return KP_BLOCKREC_OK;
    if (!sealed || crypto_auth_verify(rec + *body_len, rec, *body_len, key) != 0) return KP_BLOCKREC_MAC;
    return KP_BLOCKREC_OK;
}

bool kp_blockrec_mac_ok_iov(const uint8_t *head, size_t head_len, const struct iovec *iov, int n,
                            const uint8_t tag[KP_BLOCKREC_MAC_BYTES], const uint8_t key[KP_BLOCKREC_KEY_BYTES]) {
    crypto_auth_hmacsha512256_state st;
    uint8_t mac[KP_BLOCKREC_MAC_BYTES];
    crypto_auth_hmacsha512256_init(&st, key, KP_BLOCKREC_KEY_BYTES);
    crypto_auth_hmacsha512256_update(&st, head, head_len);
    for (int i = 0; i < n; i++) crypto_auth_hmacsha512256_update(&st, iov[i].iov_base, iov[i].iov_len);
    crypto_auth_hmacsha512256_final(&st, mac);
    return sodium_memcmp(mac, tag, KP_BLOCKREC_MAC_BYTES) == 0;
}
