/*
 * staterec.c - recurrent-state snapshot records (staterec.h). Stateless;
 * the caller owns every buffer.
 *
 * The tail rows follow the pool's accessors (kp_kvpool_k / kp_kvpool_v)
 * in blockrec.c's run order, the first pos % B rows of each run, so a
 * record is independent of where the block sat in its pool.
 */
#include "cache/staterec.h"

#include <string.h>
#include <xxhash.h>

static const char magic[8] = {'K', 'V', 'P', 'I', 'N', 'S', 'T', 'A'};


#define FOR_RUNS(c, l, h, isv)                                  \
    for (uint32_t l = 0; l < (c)->n_layer; l++)                 \
        for (int isv = 0; isv < 2; isv++)                       \
            for (uint32_t h = 0; h < (c)->n_head_kv; h++)

/* Bytes of the first t rows of every run. */
static size_t tail_bytes(const kp_kvpool *p, uint32_t t) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    return (kp_kvpool_k_row_bytes(p) + kp_kvpool_v_row_bytes(p)) * t * c->n_layer * c->n_head_kv;
}

static size_t row_bytes(const kp_kvpool *p, int isv) {
    return isv ? kp_kvpool_v_row_bytes(p) : kp_kvpool_k_row_bytes(p);
}

/* Where the checksummed part (tail rows, state) starts. */
static size_t body_at(const kp_kvpool *p, uint32_t pos) {
    return KP_STATEREC_HEADER + 4 * (size_t)(pos % kp_kvpool_config_of(p)->block_size);
}

size_t kp_staterec_size(const kp_kvpool *p, uint32_t pos, uint64_t state_bytes) {
    uint32_t t = pos % kp_kvpool_config_of(p)->block_size;
    return body_at(p, pos) + tail_bytes(p, t) + (size_t)state_bytes;
}

void kp_staterec_encode(uint8_t *out, const kp_kvpool *p, const kp_bkey *fp, const kp_bkey *key,
                        const kp_bkey *parent, uint32_t pos, const int32_t *tail, int32_t tail_block,
                        const float *state, uint64_t state_bytes) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    uint32_t t = pos % c->block_size;
    memset(out, 0, KP_STATEREC_HEADER);
    memcpy(out, magic, 8);
    kp_rec_put32(out + 8, KP_STATEREC_VERSION);
    kp_rec_put32(out + 12, c->n_layer);
    memcpy(out + 16, fp->b, 16);
    memcpy(out + 32, key->b, 16);
    memcpy(out + 48, parent->b, 16);
    kp_rec_put32(out + 64, pos);
    kp_rec_put64(out + 72, state_bytes);
    for (uint32_t i = 0; i < t; i++) kp_rec_put32(out + KP_STATEREC_HEADER + 4 * i, (uint32_t)tail[i]);
    uint8_t *body = out + body_at(p, pos), *q = body;
    if (t) FOR_RUNS(c, l, h, isv) {
            const void *run = isv ? kp_kvpool_v(p, tail_block, l, h) : kp_kvpool_k(p, tail_block, l, h);
            memcpy(q, run, row_bytes(p, isv) * t);
            q += row_bytes(p, isv) * t;
        }
    memcpy(q, state, (size_t)state_bytes);
    q += state_bytes;
    XXH128_canonical_t cs;
    XXH128_canonicalFromHash(&cs, XXH3_128bits(body, (size_t)(q - body)));
    memcpy(out + 80, cs.digest, 16);
}

kp_blockrec_reason kp_staterec_check(const uint8_t *rec, size_t len, const kp_kvpool *p, const kp_bkey *fp,
                                     const kp_bkey *key, const kp_bkey *parent, uint32_t pos, const int32_t *tail,
                                     uint64_t state_bytes) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    if (len < KP_STATEREC_HEADER) return KP_BLOCKREC_TRUNCATED;
    if (memcmp(rec, magic, 8) || kp_rec_get32(rec + 8) != KP_STATEREC_VERSION) return KP_BLOCKREC_FORMAT;
    if (memcmp(rec + 16, fp->b, 16)) return KP_BLOCKREC_FINGERPRINT;
    uint32_t rpos = kp_rec_get32(rec + 64);
    if (kp_rec_get32(rec + 12) != c->n_layer || kp_rec_get64(rec + 72) != state_bytes) return KP_BLOCKREC_FORMAT;
    if (len != kp_staterec_size(p, rpos, state_bytes)) return KP_BLOCKREC_TRUNCATED;
    if (memcmp(rec + 32, key->b, 16) || memcmp(rec + 48, parent->b, 16) || rpos != pos) return KP_BLOCKREC_TOKENS;
    for (uint32_t i = 0; i < pos % c->block_size; i++)
        if ((int32_t)kp_rec_get32(rec + KP_STATEREC_HEADER + 4 * i) != tail[i]) return KP_BLOCKREC_TOKENS;
    size_t at = body_at(p, pos);
    XXH128_canonical_t cs;
    XXH128_canonicalFromHash(&cs, XXH3_128bits(rec + at, len - at));
    return memcmp(rec + 80, cs.digest, 16) ? KP_BLOCKREC_CHECKSUM : KP_BLOCKREC_OK;
}

void kp_staterec_load(const uint8_t *rec, kp_kvpool *p, int32_t tail_block, float *state) {
    const kp_kvpool_config *c = kp_kvpool_config_of(p);
    uint32_t pos = kp_rec_get32(rec + 64), t = pos % c->block_size;
    const uint8_t *q = rec + body_at(p, pos);
    if (t) FOR_RUNS(c, l, h, isv) {
            void *run = isv ? kp_kvpool_v(p, tail_block, l, h) : kp_kvpool_k(p, tail_block, l, h);
            memcpy(run, q, row_bytes(p, isv) * t);
            q += row_bytes(p, isv) * t;
        }
    memcpy(state, q, (size_t)kp_rec_get64(rec + 72));
}
