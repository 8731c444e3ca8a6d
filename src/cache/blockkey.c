/*
 * blockkey.c - chained XXH3-128 block keys (blockkey.h).
 *
 * The hashed message of one block is built in a stack buffer when it fits
 * (16 + 4 * n bytes), else streamed through an XXH3 state: both give the
 * one-shot value of the same bytes. No state outlives a call.
 */
#include "cache/blockkey.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

static void put_le32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

kp_bkey kp_bkey_next(const kp_bkey *parent, const int32_t *tokens, uint32_t n) {
    static const kp_bkey root = {{0}};
    if (!parent) parent = &root;
    XXH128_hash_t h;
    uint8_t buf[16 + 4 * 64];
    if (n <= 64) {
        memcpy(buf, parent->b, 16);
        for (uint32_t i = 0; i < n; i++) put_le32(buf + 16 + 4 * i, tokens[i]);
        h = XXH3_128bits(buf, 16 + 4 * (size_t)n);
    } else {
        XXH3_state_t st;
        XXH3_128bits_reset(&st);
        XXH3_128bits_update(&st, parent->b, 16);
        for (uint32_t i = 0; i < n; i += 64) {
            uint32_t m = n - i < 64 ? n - i : 64;
            for (uint32_t j = 0; j < m; j++) put_le32(buf + 4 * j, tokens[i + j]);
            XXH3_128bits_update(&st, buf, 4 * (size_t)m);
        }
        h = XXH3_128bits_digest(&st);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    kp_bkey k;
    memcpy(k.b, c.digest, 16);
    return k;
}

uint32_t kp_bkey_chain(const int32_t *tokens, uint32_t n, uint32_t B, kp_bkey *out) {
    uint32_t nb = B ? n / B : 0;
    for (uint32_t j = 0; j < nb; j++) out[j] = kp_bkey_next(j ? &out[j - 1] : NULL, tokens + (size_t)j * B, B);
    return nb;
}

kp_bkey kp_bkey_state(const kp_bkey *parent, const int32_t *tail, uint32_t n_tail, uint32_t pos) {
    static const kp_bkey root = {{0}};
    static const char tag[12] = "kvpin-state"; /* with its NUL */
    if (!parent) parent = &root;
    uint8_t buf[4 * 64];
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, tag, sizeof tag);
    put_le32(buf, (int32_t)pos);
    XXH3_128bits_update(&st, buf, 4);
    XXH3_128bits_update(&st, parent->b, 16);
    for (uint32_t i = 0; i < n_tail; i += 64) {
        uint32_t m = n_tail - i < 64 ? n_tail - i : 64;
        for (uint32_t j = 0; j < m; j++) put_le32(buf + 4 * j, tail[i + j]);
        XXH3_128bits_update(&st, buf, 4 * (size_t)m);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    kp_bkey k;
    memcpy(k.b, c.digest, 16);
    return k;
}

bool kp_bkey_eq(const kp_bkey *a, const kp_bkey *b) { return !memcmp(a->b, b->b, 16); }

void kp_bkey_hex(const kp_bkey *k, char hex[33]) {
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        hex[2 * i] = d[k->b[i] >> 4];
        hex[2 * i + 1] = d[k->b[i] & 15];
    }
    hex[32] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool kp_bkey_parse(const char *hex, kp_bkey *out) {
    for (int i = 0; i < 16; i++) {
        int hi = hexval(hex[2 * i]), lo = hi < 0 ? -1 : hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out->b[i] = (uint8_t)(hi << 4 | lo);
    }
    return hex[32] == 0;
}

uint64_t kp_bkey_h64(const kp_bkey *k) {
    uint64_t h;
    memcpy(&h, k->b, 8);
    return h;
}
