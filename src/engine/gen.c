/*
 * gen.c - one sequence's generation state (gen.h).
 *
 * Owns: the sampler, the textout (stop strings and held-back text), the
 * token array and a buffer for the text of a final step. Borrows the
 * vocabulary.
 *
 *   tok  | prompt | generated ...            |            (cap entries, never moved)
 *          0        n_prompt                 n_tok        cap = min(n_prompt + max_tokens, max_pos + 1)
 *
 * n_tok <= cap always holds: a step runs only while n_generated <
 * max_tokens and n_tok <= max_pos, and each appends one token. A step's
 * text is the textout's own buffer, except when the step ends generation:
 * then the pushed text and what kp_textout_finish releases are joined in
 * `last`, because both come back in the textout's one buffer.
 *
 * Constrained (m != NULL): `masked` (n_vocab floats) receives each step's
 * logits with the mask applied, and the sampler reads that copy; `mask` is
 * the allowed-token bitset (kp_gvocab_mask_words words). The matcher has
 * accepted exactly the generated tokens (an end-of-generation token
 * included, which finishes it).
 */
#include "engine/gen.h"

#include "base/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kp_gen {
    const kp_tok_vocab *v;
    kp_sampler *smp;
    kp_textout *to;
    int32_t *tok;
    uint32_t n_prompt, n_tok, cap, max_tokens, max_pos;
    bool ignore_eos;
    bool logprobs;
    uint32_t top_logprobs;
    kp_token_logprobs lp; /* the last step's, with logprobs */
    kp_finish finish;
    kp_gen_cause cause;
    kp_buf last; /* the text of the step that ended generation */
    int32_t n_vocab;
    kp_gmatch *m; /* the constraint, or NULL */
    uint32_t *mask;
    size_t mask_words;
    float *masked;
};

kp_status kp_gen_new(kp_gen **out, const kp_tok_vocab *v, const int32_t *prompt, uint32_t n_prompt,
                     const kp_gen_params *p, kp_error *err) {
    *out = NULL;
    int32_t nv = p->n_vocab > 0 ? p->n_vocab : kp_tok_n_vocab(v);
    if (!prompt || n_prompt == 0) return kp_fail(err, KP_EINVAL, "the prompt is empty");
    if (n_prompt > p->max_pos)
        return kp_fail(err, KP_ERANGE, "the prompt has %u tokens, more than the context of %u tokens", n_prompt,
                       p->max_pos);
    for (uint32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= nv)
            return kp_fail(err, KP_EINVAL, "prompt token %u is %d, outside the vocabulary of %d", i, prompt[i], nv);
    kp_status st = kp_sampler_check(&p->sp, err);
    if (st != KP_OK) return st;
    kp_gen *g = calloc(1, sizeof *g);
    if (!g) return kp_fail(err, KP_ENOMEM, "out of memory for a generation");
    g->v = v;
    g->n_prompt = g->n_tok = n_prompt;
    g->max_tokens = p->max_tokens;
    g->max_pos = p->max_pos;
    g->ignore_eos = p->ignore_eos;
    g->n_vocab = nv;
    uint64_t cap = (uint64_t)n_prompt + p->max_tokens;
    if (cap > (uint64_t)p->max_pos + 1) cap = (uint64_t)p->max_pos + 1;
    g->cap = (uint32_t)cap;
    g->tok = malloc((size_t)g->cap * sizeof *g->tok);
    if (!g->tok) {
        kp_gen_free(g);
        return kp_fail(err, KP_ENOMEM, "out of memory for a generation of %llu tokens", (unsigned long long)cap);
    }
    memcpy(g->tok, prompt, (size_t)n_prompt * sizeof *g->tok);
    /* the SPM space prefix in front of the first word when generation starts right after BOS */
    bool strip = n_prompt == 1 && prompt[0] == kp_tok_bos(v) && kp_tok_add_space_prefix(v);
    if ((st = kp_sampler_new(&g->smp, &p->sp, nv, err)) != KP_OK ||
        (st = kp_textout_new(&g->to, v, p->stops, p->n_stops, p->special, strip, err)) != KP_OK) {
        kp_gen_free(g);
        return st;
    }
    for (uint32_t i = 0; i < n_prompt; i++) kp_sampler_accept(g->smp, prompt[i]);
    *out = g;
    return KP_OK;
}

void kp_gen_set_logprobs(kp_gen *g, int32_t top_n) {
    g->logprobs = top_n >= 0;
    g->top_logprobs = top_n < 0 ? 0 : top_n > KP_LOGPROBS_MAX ? KP_LOGPROBS_MAX : (uint32_t)top_n;
}

void kp_gen_free(kp_gen *g) {
    if (!g) return;
    kp_sampler_free(g->smp);
    kp_textout_free(g->to);
    kp_buf_free(&g->last);
    kp_gmatch_free(g->m);
    free(g->mask);
    free(g->masked);
    free(g->tok);
    free(g);
}

/* A matcher's KP_EFULL (its bounds: more parse stacks than it follows)
 * as KP_EUNSUPPORTED: this grammar cannot be followed here, whatever the
 * server's load (KP_EFULL would be answered "overloaded, retry"). */
static kp_status beyond_bounds(kp_status st, kp_error *err) {
    if (st != KP_EFULL) return st;
    char why[KP_ERROR_MSG_MAX];
    snprintf(why, sizeof why, "%s", err ? err->msg : "");
    return kp_fail(err, KP_EUNSUPPORTED, "the grammar cannot be followed here: %s", why);
}

kp_status kp_gen_constrain(kp_gen *g, kp_gmatch *m, kp_error *err) {
    if (!m) return kp_fail(err, KP_EINVAL, "kp_gen_constrain: no matcher");
    const kp_gvocab *gv = kp_gmatch_vocab(m);
    kp_status st = KP_OK;
    if (g->m || g->n_tok != g->n_prompt || g->finish != KP_FINISH_NONE)
        st = kp_fail(err, KP_EINVAL, "a generation is constrained once, before its first step");
    else if (kp_gvocab_n_vocab(gv) > g->n_vocab)
        st = kp_fail(err, KP_EINVAL, "the grammar's vocabulary has %d tokens, more than the %d logits", kp_gvocab_n_vocab(gv),
                     g->n_vocab);
    if (st != KP_OK) {
        kp_gmatch_free(m);
        return st;
    }
    g->mask_words = kp_gvocab_mask_words(gv);
    g->mask = malloc(g->mask_words * sizeof *g->mask);
    g->masked = malloc((size_t)g->n_vocab * sizeof *g->masked);
    if (!g->mask || !g->masked) {
        free(g->mask);
        free(g->masked);
        g->mask = NULL;
        g->masked = NULL;
        kp_gmatch_free(m);
        return kp_fail(err, KP_ENOMEM, "out of memory for a constrained generation");
    }
    g->m = m;
    return KP_OK;
}

const kp_gmatch *kp_gen_matcher(const kp_gen *g) { return g->m; }

kp_gmatch *kp_gen_release_matcher(kp_gen *g) {
    if (g->finish == KP_FINISH_NONE) return NULL; /* still running: it needs its matcher */
    kp_gmatch *m = g->m;
    g->m = NULL;
    return m;
}

/* Ends generation: out gets text (the step's own, may be empty) followed
 * by what the textout held back. */
static void end(kp_gen *g, kp_finish why, kp_gen_cause cause, const char *text, size_t len, kp_gen_out *out) {
    g->finish = why;
    g->cause = cause;
    kp_buf_clear(&g->last);
    kp_buf_put(&g->last, text, len); /* the textout's buffer: copied before kp_textout_finish reuses it */
    const char *rest;
    size_t n_rest;
    kp_textout_finish(g->to, &rest, &n_rest);
    kp_buf_put(&g->last, rest, n_rest);
    if (g->last.oom) { /* out of memory: the text is lost, generation still ends */
        kp_buf_clear(&g->last);
        g->last.oom = false;
    }
    out->text = g->last.len ? g->last.data : "";
    out->len = g->last.len;
    out->finish = why;
    out->cause = cause;
}

kp_status kp_gen_step(kp_gen *g, const float *logits, kp_gen_out *out, kp_error *err) {
    out->token = -1;
    out->text = "";
    out->len = 0;
    out->finish = g->finish;
    out->cause = g->cause;
    out->lp = NULL;
    if (g->finish != KP_FINISH_NONE) return KP_OK;
    if (g->max_tokens == 0) {
        end(g, KP_FINISH_LENGTH, KP_GEN_MAX_TOKENS, NULL, 0, out);
        return KP_OK;
    }
    /* dist: the logits the sampler draws from (after the constraint's mask) */
    const float *dist = logits;
    if (g->m) {
        size_t n_allowed = 0;
        kp_status st = kp_gmatch_mask(g->m, g->mask, &n_allowed, err);
        if (st != KP_OK) return beyond_bounds(st, err);
        if (n_allowed == 0) {
            if (!kp_gmatch_complete(g->m) && !kp_gmatch_finished(g->m))
                return kp_fail(err, KP_EUNSUPPORTED, "the grammar allows no token of the vocabulary here");
            end(g, KP_FINISH_STOP, KP_GEN_GRAMMAR, NULL, 0, out);
            return KP_OK;
        }
        memcpy(g->masked, logits, (size_t)g->n_vocab * sizeof *g->masked);
        kp_gmask_apply(g->mask, g->mask_words, g->masked, (size_t)g->n_vocab);
        dist = g->masked;
    }
    int32_t tok = g->logprobs ? kp_sampler_sample_lp(g->smp, dist, (int32_t)g->top_logprobs, &g->lp)
                              : kp_sampler_sample(g->smp, dist);
    if (g->logprobs) out->lp = &g->lp;
    kp_sampler_accept(g->smp, tok);
    g->tok[g->n_tok++] = tok;
    out->token = tok;
    if (g->m) {
        kp_status st = kp_gmatch_accept_token(g->m, tok, err);
        if (st != KP_OK) return beyond_bounds(st, err);
    }
    if (kp_tok_is_eog(g->v, tok) && !g->ignore_eos) {
        end(g, KP_FINISH_STOP, KP_GEN_EOG, NULL, 0, out);
        return KP_OK;
    }
    const char *text;
    size_t n;
    bool stopped = false;
    kp_status st = kp_textout_push(g->to, tok, &text, &n, &stopped, err);
    if (st != KP_OK) return st;
    if (stopped) {
        end(g, KP_FINISH_STOP, KP_GEN_STOP_STRING, text, n, out);
        return KP_OK;
    }
    if (g->m && !kp_gmatch_can_continue(g->m)) {
        end(g, KP_FINISH_STOP, KP_GEN_GRAMMAR, text, n, out);
        return KP_OK;
    }
    if (g->n_tok - g->n_prompt >= g->max_tokens) {
        end(g, KP_FINISH_LENGTH, KP_GEN_MAX_TOKENS, text, n, out);
        return KP_OK;
    }
    if (g->n_tok > g->max_pos) {
        end(g, KP_FINISH_LENGTH, KP_GEN_CONTEXT, text, n, out);
        return KP_OK;
    }
    out->text = text;
    out->len = n;
    return KP_OK;
}

void kp_gen_stop(kp_gen *g, kp_finish why, kp_gen_out *out) {
    out->token = -1;
    out->text = "";
    out->len = 0;
    out->finish = g->finish;
    out->cause = g->cause;
    out->lp = NULL;
    if (g->finish != KP_FINISH_NONE) return;
    if (why == KP_FINISH_LENGTH || why == KP_FINISH_STOP) {
        end(g, why, KP_GEN_STOPPED, NULL, 0, out);
        return;
    }
    g->finish = out->finish = why;
    g->cause = out->cause = KP_GEN_STOPPED;
}

const int32_t *kp_gen_tokens(const kp_gen *g) { return g->tok; }
uint32_t kp_gen_n_tokens(const kp_gen *g) { return g->n_tok; }
uint32_t kp_gen_n_prompt(const kp_gen *g) { return g->n_prompt; }
uint32_t kp_gen_n_generated(const kp_gen *g) { return g->n_tok - g->n_prompt; }
kp_finish kp_gen_finish(const kp_gen *g) { return g->finish; }
kp_gen_cause kp_gen_cause_of(const kp_gen *g) { return g->cause; }

const char *kp_gen_cause_name(kp_gen_cause c) {
    switch (c) {
    case KP_GEN_MAX_TOKENS: return "length";
    case KP_GEN_CONTEXT: return "context full";
    case KP_GEN_EOG: return "end of generation token";
    case KP_GEN_STOP_STRING: return "stop string";
    case KP_GEN_STOPPED: return "stopped";
    case KP_GEN_GRAMMAR: return "grammar complete";
    default: return "running";
    }
}
