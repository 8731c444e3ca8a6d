/*
 * sampler.h - turns a row of logits into the next token.
 *
 * The chain, in llama.cpp's order: repetition / presence / frequency
 * penalties over the last repeat_last_n accepted tokens, top-k, top-p
 * (nucleus), min-p, temperature, then a draw from the seeded generator.
 * temp <= 0 means greedy: the argmax (ties go to the lowest id), with the
 * penalties still applied. The same seed and the same logits give the same
 * tokens on every machine.
 */
#ifndef KP_SAMPLER_H
#define KP_SAMPLER_H

#include <stdint.h>

#include "base/status.h"

typedef struct {
    float temp;              /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    int32_t repeat_last_n;   /* window of the penalties; 0: off, -1: whole history */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    uint64_t seed;
} kp_sampler_params;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, last_n 64, seed 0. */
kp_sampler_params kp_sampler_defaults(void);

/* Checks ranges (temp finite, top_p in [0,1], ...); KP_EINVAL names the field. */
kp_status kp_sampler_check(const kp_sampler_params *p, kp_error *err);

typedef struct kp_sampler kp_sampler;

kp_status kp_sampler_new(kp_sampler **out, const kp_sampler_params *p, int32_t n_vocab,
                         kp_error *err);
void kp_sampler_free(kp_sampler *s);

/* Records a token of the context (prompt or generated) for the penalties. */
void kp_sampler_accept(kp_sampler *s, int32_t token);

/* Picks the next token from n_vocab logits (not modified). */
int32_t kp_sampler_sample(kp_sampler *s, const float *logits);

/* Argmax, ties to the lowest id. */
int32_t kp_argmax(const float *logits, int32_t n);

#endif
