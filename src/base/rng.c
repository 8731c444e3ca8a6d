/*
 * rng.c - SplitMix64 and xoshiro256** (rng.h), as published by their
 * authors (prng.di.unimi.it): the constants and the order of the steps are
 * theirs, so streams are the reference streams for the same seed.
 */
#include "base/rng.h"

uint64_t kp_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t kp_splitmix64(uint64_t *state) { return kp_mix64(*state += 0x9E3779B97F4A7C15ull); }

void kp_rng_seed(kp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = kp_splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kp_rng_next(kp_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kp_rng_unit(kp_rng *r) { return (double)(kp_rng_next(r) >> 11) * 0x1.0p-53; }
