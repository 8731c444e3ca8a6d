/*
 * rng.h - the reproducible pseudo-random numbers of kvpin (floor 0): the
 * sampler's draws, mkmodel's random weights, tool-call ids, hash mixing.
 *
 * Pure integer arithmetic, so a seed gives the same numbers on every
 * machine and build; no state outside the caller's kp_rng.
 *
 *   kp_mix64       splitmix64's finalizer: a bijective 64-bit mixer
 *   kp_splitmix64  Steele, Lea & Flood's SplitMix64: the state steps by
 *                  the golden gamma 0x9E3779B97F4A7C15, the output is the
 *                  mix of the new state
 *   kp_rng         Blackman & Vigna's xoshiro256** (state: 4 x 64 bits),
 *                  seeded with four successive splitmix64 outputs of the
 *                  seed, as its authors recommend
 */
#ifndef KP_RNG_H
#define KP_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} kp_rng;

/* splitmix64's output function of x. */
uint64_t kp_mix64(uint64_t x);

/* Advances *state by the golden gamma and returns the mix of it. */
uint64_t kp_splitmix64(uint64_t *state);

/* Seeds r from seed (any value, 0 included). */
void kp_rng_seed(kp_rng *r, uint64_t seed);

/* The next 64 random bits of r. */
uint64_t kp_rng_next(kp_rng *r);

/* Uniform in [0, 1): the top 53 bits of kp_rng_next times 2^-53. */
double kp_rng_unit(kp_rng *r);

#endif
