/*
 * pinid.h - the ids of pins as clients see them (floor 7).
 *
 * The scheduler numbers pins 1, 2, 3, ...; a client that could name pin 7
 * could delete another client's pin (DELETE /v1/cache/pin/pin-7). So the
 * id a client is given carries a tag: "pin-N-TAG", TAG the 16 hex digits of
 * SipHash-2-4 of N (libsodium's crypto_shorthash, a keyed PRF) under a key
 * the server draws from the kernel's CSPRNG at start. An id whose tag does
 * not verify names no pin. Ids do not survive a restart, as pins do not.
 */
#ifndef KP_PINID_H
#define KP_PINID_H

#include <stdbool.h>
#include <stdint.h>

#define KP_PINID_KEY_BYTES 16 /* crypto_shorthash_KEYBYTES */
#define KP_PINID_MAX 48       /* "pin-" + 20 digits + "-" + 16 hex + NUL */

/* Writes pin's id to out. */
void kp_pinid_format(const uint8_t key[KP_PINID_KEY_BYTES], uint64_t pin, char out[KP_PINID_MAX]);

/* The pin an id names, when its tag verifies under key (compared in
 * constant time); false for anything else. */
bool kp_pinid_parse(const uint8_t key[KP_PINID_KEY_BYTES], const char *id, uint64_t *pin);

#endif
