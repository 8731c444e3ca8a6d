/*
 * gen.h - one sequence's generation state (floor 6): the sampler, the text
 * of the generated tokens (stop strings, held-back text, the SPM leading
 * space after BOS), the token array (prompt + generated), the limits
 * (max_tokens, end-of-generation, the context end) and how it finished.
 * Every generation loop of kvpin (the scheduler's batched steps,
 * kp_eng_generate for the command line) asks it what to do next.
 *
 * The caller runs the model; the gen decides:
 *
 *   kp_gen_new(&g, vocab, prompt, n_prompt, &params)
 *   compute the prompt                    -> logits of its last position
 *   loop: kp_gen_step(g, logits, &out)    -> out.token: sampled, appended
 *                                            out.text:  released text
 *                                            out.finish: NONE or why it ended
 *         out.finish != NONE: done (out.token is not decoded)
 *         else decode out.token           -> logits of the new position
 *
 *   tokens | prompt 0 .. n_prompt-1 | generated 0 .. n_generated-1 |
 *   allocated once for min(n_prompt + max_tokens, max_pos + 1) tokens: the
 *   array never moves while the gen lives, and entries below
 *   kp_gen_n_tokens never change, so another thread may read them.
 *
 * A step samples one token (penalties see the prompt and every generated
 * token), then ends generation by the first rule that holds:
 *
 *   end-of-generation token (unless ignore_eos)  STOP    its text not shown
 *   a stop string completed                      STOP    nothing from it on shown
 *   the grammar is complete and nothing can      STOP    (constrained only)
 *     follow but end-of-generation
 *   max_tokens generated                         LENGTH
 *   n_tokens > max_pos (the newest token has no  LENGTH
 *     position left to be decoded at)
 *
 * When a step ends generation with STOP or LENGTH, the text held back (a
 * possible stop string's beginning, an incomplete UTF-8 character) is
 * released with that step's text. max_tokens 0: the first step samples
 * nothing and ends (LENGTH). One thread uses a gen; no file-level state.
 *
 * Constrained decoding (kp_gen_constrain): each step first computes the
 * grammar's allowed tokens and sets every other logit to -inf, then the
 * sampler chain (penalties, temperature, top-k/p, min-p) draws from what is
 * left, so the probabilities it sees are those after the mask. The sampled
 * token advances the matcher. A step whose mask allows nothing ends
 * generation with STOP (KP_GEN_GRAMMAR) when the document is complete
 * (token -1), else fails with KP_EUNSUPPORTED: the grammar cannot be
 * followed here (the matcher's bounds, KP_GRAMMAR_MAX_STACKS, or no token
 * of the vocabulary spells what it needs). A property of the request's
 * grammar, not of the server's load: not KP_EFULL, which a server answers
 * with "try again".
 */
#ifndef KP_GEN_H
#define KP_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "grammar/grammar.h"
#include "model/sampler.h"
#include "tok/textout.h"
#include "tok/tok.h"

/* How a generation ended (the OpenAI finish reasons, and two of the
 * caller's). */
typedef enum {
    KP_FINISH_NONE = 0,  /* still running */
    KP_FINISH_LENGTH,    /* max_tokens or the context end */
    KP_FINISH_STOP,      /* end-of-generation token or a stop string */
    KP_FINISH_CANCELLED, /* the caller gave up (a client left, a shutdown) */
    KP_FINISH_ERROR      /* the caller's step failed */
} kp_finish;

/* The rule that ended it (finer than kp_finish). */
typedef enum {
    KP_GEN_RUNNING = 0,
    KP_GEN_MAX_TOKENS,  /* LENGTH */
    KP_GEN_CONTEXT,     /* LENGTH: n_tokens > max_pos */
    KP_GEN_EOG,         /* STOP: an end-of-generation token */
    KP_GEN_STOP_STRING, /* STOP */
    KP_GEN_STOPPED,     /* kp_gen_stop: ended by the caller */
    KP_GEN_GRAMMAR      /* STOP: the constraint's document is complete and cannot grow */
} kp_gen_cause;

typedef struct {
    kp_sampler_params sp;
    uint32_t max_tokens;      /* tokens to generate at most (0: none) */
    uint32_t max_pos;         /* the context: positions a sequence may hold */
    int32_t n_vocab;          /* entries of a logits row; 0: the vocabulary's size */
    bool ignore_eos;          /* end-of-generation tokens are ordinary tokens */
    const char *const *stops; /* copied; at most KP_TEXTOUT_MAX_STOPS non-empty */
    int n_stops;
    bool special;             /* render control tokens as their text */
} kp_gen_params;

typedef struct kp_gen kp_gen;

/* Makes the state for prompt[0..n_prompt) (copied; every id must be below
 * n_vocab); the sampler has seen the prompt. The leading space of the first
 * text is dropped when the prompt is BOS alone and the vocabulary adds a
 * space prefix (SPM). v is borrowed and must outlive the gen. KP_EINVAL
 * (empty prompt, bad id, bad sampler parameters, too many or empty stop
 * strings), KP_ERANGE (n_prompt > max_pos), KP_ENOMEM. */
kp_status kp_gen_new(kp_gen **out, const kp_tok_vocab *v, const int32_t *prompt, uint32_t n_prompt,
                     const kp_gen_params *p, kp_error *err);
void kp_gen_free(kp_gen *g); /* NULL is a no-op */

/* From the next step on, each step reports its token's log-probabilities
 * and those of the top_n (at most KP_LOGPROBS_MAX) most likely tokens in
 * kp_gen_out.lp (top_n < 0: off, the default). */
void kp_gen_set_logprobs(kp_gen *g, int32_t top_n);

/* Constrains the generation to m's grammar from the next step on (the
 * rules in the top comment). The gen takes m over: it frees it with
 * itself, and right away when this fails. m must be at the state the
 * generated text starts from (a fresh matcher, or a kp_gmatch_clone of
 * one at the start), for a vocabulary index of the gen's vocabulary; its
 * mask cache may be shared with other clones, which are then used from
 * the gen's thread only. Call before the first step, at most once.
 * KP_EINVAL (NULL m, already stepped or constrained, the index's
 * vocabulary larger than the logits row), KP_ENOMEM. */
kp_status kp_gen_constrain(kp_gen *g, kp_gmatch *m, kp_error *err);

/* The constraint's matcher (NULL: none), for reading (complete, finished). */
const kp_gmatch *kp_gen_matcher(const kp_gen *g);

/* Hands the constraint's matcher back to the caller (NULL: none), who then
 * owns it (to reset and reuse it for another generation of the same
 * grammar). Only for a gen that has ended: it steps no more. */
kp_gmatch *kp_gen_release_matcher(kp_gen *g);

/* What one step did. */
typedef struct {
    int32_t token;      /* the sampled token, appended to the tokens; -1: none */
    const char *text;   /* text released by this step (valid until the next call on the gen) */
    size_t len;
    kp_finish finish;   /* KP_FINISH_NONE: decode token and step again */
    kp_gen_cause cause;
    const kp_token_logprobs *lp; /* with logprobs and a sampled token: its log-probabilities in the
                                    distribution the sampler drew from (kp_sampler_sample_lp: after
                                    whatever was done to the logits, penalties, truncation and
                                    temperature); valid until the next call; else NULL */
} kp_gen_out;

/* Samples the next token from logits (n_vocab floats: the newest
 * position's), decides whether generation ends (the rules above) and
 * releases text. After the end it samples nothing: token -1, no text, the
 * same finish. KP_ENOMEM (text), KP_EINVAL (a sampled id the vocabulary
 * cannot render); the token is appended even then. */
kp_status kp_gen_step(kp_gen *g, const float *logits, kp_gen_out *out, kp_error *err);

/* Ends generation from outside (why: CANCELLED, ERROR, or LENGTH when the
 * caller's context ran out first). With LENGTH or STOP the held-back text
 * is released into out->text. out->token is -1, out->cause KP_GEN_STOPPED.
 * A gen that already ended keeps its finish (out gets it, no text). */
void kp_gen_stop(kp_gen *g, kp_finish why, kp_gen_out *out);

/* The tokens: prompt, then the generated ones (an end-of-generation token
 * included), kp_gen_n_tokens of them; the pointer is stable for the gen's
 * life. */
const int32_t *kp_gen_tokens(const kp_gen *g);
uint32_t kp_gen_n_tokens(const kp_gen *g);
uint32_t kp_gen_n_prompt(const kp_gen *g);
uint32_t kp_gen_n_generated(const kp_gen *g);

/* KP_FINISH_NONE while running. */
kp_finish kp_gen_finish(const kp_gen *g);
kp_gen_cause kp_gen_cause_of(const kp_gen *g);

/* "length", "context full", "end of generation token", "stop string",
 * "stopped", "grammar complete" (running: "running"). */
const char *kp_gen_cause_name(kp_gen_cause c);

#endif
