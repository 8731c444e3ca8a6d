/*
 * pinid.c - the ids of pins as clients see them (pinid.h).
 */
#include "serve/pinid.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tag_of(const uint8_t key[KP_PINID_KEY_BYTES], uint64_t pin, char hex[17]) {
    uint8_t msg[8], h[crypto_shorthash_BYTES];
    for (int i = 0; i < 8; i++) msg[i] = (uint8_t)(pin >> (8 * i));
    crypto_shorthash(h, msg, sizeof msg, key);
    sodium_bin2hex(hex, 17, h, sizeof h);
}

void kp_pinid_format(const uint8_t key[KP_PINID_KEY_BYTES], uint64_t pin, char out[KP_PINID_MAX]) {
    char hex[17];
    tag_of(key, pin, hex);
    snprintf(out, KP_PINID_MAX, "pin-%llu-%s", (unsigned long long)pin, hex);
}

bool kp_pinid_parse(const uint8_t key[KP_PINID_KEY_BYTES], const char *id, uint64_t *pin) {
    if (strncmp(id, "pin-", 4) || id[4] < '1' || id[4] > '9') return false;
    char *end = NULL;
    unsigned long long n = strtoull(id + 4, &end, 10);
    if (!end || *end != '-' || strlen(end + 1) != 16) return false;
    char hex[17];
    tag_of(key, (uint64_t)n, hex);
    if (sodium_memcmp(hex, end + 1, 16) != 0) return false;
    *pin = (uint64_t)n;
    return true;
}
