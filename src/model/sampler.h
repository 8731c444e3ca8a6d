/*
 * sampler.h - turns a row of logits into the next token.
 *
 * The chain, in llama.cpp's order: repetition / presence / frequency
 * penalties over the last repeat_last_n accepted tokens, top-k, top-p
 * (nucleus), min-p, temperature, then a draw from the seeded generator.
 * temp <= 0 means greedy: the argmax (ties go to the lowest id), with the
 * penalties still applied. The same seed and the same logits give the same
 * tokens on every machine. kp_sampler_sample_lp also reports the
 * log-probabilities of the final distribution (after every step of the
 * chain), so whatever a caller does to the logits first (a mask) is in
 * them.
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

#define KP_LOGPROBS_MAX 20

/* The log-probabilities of one sampled token and of the most likely ones,
 * in the distribution the token was drawn from (kp_sampler_sample_lp). */
typedef struct {
    int32_t token;                     /* the sampled token */
    float logprob;                     /* its natural-log probability */
    uint32_t n_top;                    /* entries of top_* (<= KP_LOGPROBS_MAX) */
    int32_t top_token[KP_LOGPROBS_MAX]; /* most likely first (ties: lowest id first) */
    float top_logprob[KP_LOGPROBS_MAX];
} kp_token_logprobs;

/* kp_sampler_sample (the same token, the same generator draws), and the
 * log-probabilities of the distribution it drew from: the softmax, at the
 * temperature, of the logits after the penalties, over the tokens top-k,
 * top-p and min-p keep (0 for the others). Logits of -inf (a token a
 * caller masked out) have probability 0. Greedy (temp <= 0) draws
 * nothing: the numbers are then those of temperature 1 after the same
 * penalties and truncation, and the token is their most likely one.
 * lp->top_* receive the min(n_top, KP_LOGPROBS_MAX) most likely tokens
 * of nonzero probability. Computed in double from the float logits. */
int32_t kp_sampler_sample_lp(kp_sampler *s, const float *logits, int32_t n_top, kp_token_logprobs *lp);

/* Argmax, ties to the lowest id. */
int32_t kp_argmax(const float *logits, int32_t n);

#endif
