/*
 * scheduler.h - continuous batching: many requests, one engine thread (floor 7).
 *
 * The scheduler owns one thread that owns the engine: every step it admits
 * queued requests (up to `parallel` running sequences, and only while the
 * KV pool has room for their prompts), then runs ONE kp_eng_step holding a
 * decode token of every generating sequence and a slice of at most
 * `prefill_chunk` prompt tokens of the sequences still prefilling, so
 * running streams keep flowing while a long prompt is computed. Each
 * request's kp_gen (engine/gen.h) samples, applies stop strings,
 * end-of-generation and the limits; the text goes to the request's owner.
 * A finished (or cancelled) sequence is indexed whole in the prefix cache
 * and released.
 *
 *   submitter thread                      engine thread
 *   ----------------                      -------------
 *   kp_sched_submit --> queue (bounded) --> admit: kp_eng_begin, cache report
 *   kp_sreq_wait   <--  text, done      <-- step: kp_eng_step, kp_gen_step
 *   kp_sreq_cancel  --> flag            --> finish: kp_cachereport_finish (index, history)
 *                                           preempt: kp_eng_finish, back to
 *                                             the queue's front
 *
 * KV memory is never a request's error. A request that can never fit the
 * budget is refused at submit (KP_ERANGE, kp_sched_fit); one that fits
 * waits in the queue until its prompt's blocks can be had, and a running
 * sequence that cannot grow makes the most recently admitted one step
 * aside (preemption): that one's tokens are cached, it is released and
 * queued again at the front with its generation intact, and on its turn it
 * is prefilled again through the prefix cache and goes on where it was.
 * Its owner sees the same tokens, later. scheduler.c's top comment has the
 * rules and why they always make progress.
 *
 * Constrained requests (kp_sreq_params.grammar): the engine thread builds
 * the vocabulary's index (kp_gvocab) on the first one and keeps, for the
 * last few grammars seen, a matcher at the start whose mask cache warms up
 * over requests; each request's gen gets a clone of it, or the reset
 * matcher of a finished request of the same grammar (all of them used on
 * the engine thread only). A server that hands the same kp_grammar to
 * requests with the same schema (serve/gcache.h) gets warm masks.
 *
 * Other threads never touch the engine: cache reads come from a snapshot
 * the engine thread publishes (kp_sched_cache_get), cache operations
 * (probe, pin, unpin) are queued to the engine thread, which serves them
 * between two steps while the caller waits (kp_sched_probe, kp_sched_pin,
 * kp_sched_unpin). Counters for metrics are copied out with
 * kp_sched_stats_get without waiting for a step.
 */
#ifndef KP_SCHED_H
#define KP_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/cachereport.h"
#include "cache/doctor.h"
#include "engine/engine.h"
#include "engine/gen.h"
#include "grammar/grammar.h"
#include "model/sampler.h"
#include "base/status.h"
#include "tok/textout.h"
#include "tok/tok.h"

typedef struct kp_sched kp_sched;

typedef struct {
    uint32_t parallel;      /* running sequences at most (>= 1) */
    uint32_t queue_max;     /* requests waiting for a sequence at most, beyond those a free sequence
                               slot takes (0: only those); more: KP_EFULL (preempted ones return even
                               past it) */
    uint32_t prefill_chunk; /* prompt tokens per step, over all prefilling sequences */
} kp_sched_config;

/* The engine and the vocabulary are borrowed (they must outlive the
 * scheduler); the scheduler's thread is the only user of the engine until
 * kp_sched_free. */
kp_status kp_sched_new(kp_sched **out, kp_engine *e, const kp_tok_vocab *v, const kp_sched_config *cfg,
                       kp_error *err);

/* Stops the thread: running and queued requests finish with
 * KP_FINISH_CANCELLED (their owners may still wait and release them).
 * NULL is a no-op. */
void kp_sched_free(kp_sched *s);

/* kp_finish (how a request ended) is engine/gen.h's. */

typedef struct {
    const int32_t *prompt;   /* copied */
    uint32_t n_prompt;       /* >= 1 */
    uint32_t max_tokens;     /* 0: prefill only (the prompt is cached) */
    kp_sampler_params sp;
    const char *const *stops; /* copied; at most KP_TEXTOUT_MAX_STOPS */
    int n_stops;
    bool ignore_eos;         /* keep going past end-of-generation tokens */
    const char *text;        /* the prompt's text for the cache report (copied; NULL: none) */
    size_t text_len;
    bool max_tokens_set;     /* the caller asked for max_tokens: refused (KP_ERANGE) when the KV
                                budget cannot hold them; false: max_tokens is a default, cut to
                                what the budget holds (kp_sched_fit) */
    kp_grammar *grammar;     /* NULL: unconstrained; else the output is constrained to its
                                documents (engine/gen.h, kp_gen_constrain): the request takes a
                                reference (kp_grammar_ref) and drops it when released */
    bool progress;           /* as kp_sreq_progress from the start: the owner is woken at
                                admission (which may come before kp_sched_submit returns) */
    kp_doctor_hints hints;   /* the chat layer's, for the cache report (zeroed: none;
                                reasoning_open must be static) */
    const uint32_t *msg_starts; /* positions where the prompt's messages start (copied; NULL:
                                   none): resume points under a window budget (engine.h's
                                   kp_eng_begin_msgs) */
    uint32_t n_msg_starts;
} kp_sreq_params;

typedef struct kp_sreq kp_sreq;

/* Whether a request of n_prompt tokens and max_tokens could ever fit the
 * KV budget, whatever else runs. A request needs
 *
 *   positions = min(n_prompt + max_tokens - 1, context)   (n_prompt when max_tokens is 0)
 *
 * (the last token generated is never fed back), and the budget holds
 * kp_sched_kv_positions of them. KP_OK with *max_tokens_out the max_tokens
 * it runs with: max_tokens, or, when !max_tokens_set and it would need
 * more, cut so that positions is exactly what the budget holds.
 * KP_ERANGE when the prompt alone, or the prompt and an explicit
 * max_tokens, need more: the message says the numbers (prompt tokens,
 * max_tokens, positions the budget holds, bytes per token, the budget).
 * Pinned prefixes are not taken into account (they come and go). Prompts
 * longer than the context are kp_sched_submit's KP_ERANGE, not this one's. */
kp_status kp_sched_fit(const kp_sched *s, uint32_t n_prompt, uint32_t max_tokens, bool max_tokens_set,
                       uint32_t *max_tokens_out, kp_error *err);

/* Positions the whole KV budget holds (its blocks x positions per block),
 * fixed at kp_sched_new. */
uint32_t kp_sched_kv_positions(const kp_sched *s);

/* Queues a request (with max_tokens as kp_sched_fit says). *out holds the
 * caller's reference (kp_sreq_release). KP_EFULL: the queue is full (try
 * later); KP_ERANGE: the prompt does not fit the context (the message says
 * how long each is) or the request can never fit the KV budget
 * (kp_sched_fit); KP_EINVAL: bad parameters; KP_ENOMEM. A queued request
 * never fails for lack of KV memory: it waits for room, and a running one
 * may be preempted and resumed (kp_sreq_update.preemptions). */
kp_status kp_sched_submit(kp_sched *s, const kp_sreq_params *p, kp_sreq **out, kp_error *err);

/* n choices of one prompt (1 <= n <= parallel, KP_EINVAL otherwise),
 * logprobs >= 0: each update's lp carries the generated tokens'
 * log-probabilities with the logprobs (<= KP_LOGPROBS_MAX, KP_EINVAL
 * otherwise) most likely tokens each; < 0: none.
 * queues n requests at once into out[0..n), choice i sampling with seed
 * p->sp.seed + i (so choice i is the request with that seed alone), each
 * the caller's to wait on and release like kp_sched_submit's. They are
 * admitted together, when n sequence slots are free and the KV pool has
 * room for the prompt once plus a block per choice; choice 0 prefills
 * the prompt and the others wait for it, then fork from it (kp_eng_fork:
 * the prompt's whole blocks are shared, the partial last one copied), so
 * the prompt is computed and stored once. A choice's update then reports
 * the whole prompt as cached (its report: reused = prompt_tokens). KV
 * fit (kp_sched_fit) counts the prompt once and max_tokens per choice.
 * If choice 0 leaves before its prefill ends (preempted, failed), the
 * waiting choices go back to the queue and are prefilled on their own,
 * through the prefix cache. Errors as kp_sched_submit; on error nothing
 * is queued and out[] is NULL. */
kp_status kp_sched_submit_n(kp_sched *s, const kp_sreq_params *p, uint32_t n, int32_t logprobs, kp_sreq **out,
                            kp_error *err);

/* What happened since the last kp_sreq_wait. */
typedef struct {
    char *text;              /* new released text (malloc'd, caller frees; NULL if none) */
    size_t len;
    uint32_t new_tokens;     /* tokens generated since the last wait */
    bool started;            /* the prompt is computed: report and cached_tokens are final */
    kp_finish finish;        /* != NONE: the request is over, nothing more comes */
    kp_status status;        /* KP_FINISH_ERROR: why */
    kp_error err;            /* KP_FINISH_ERROR: why; KP_FINISH_LENGTH with status KP_OK and a
                                message: a note (pinned prefixes left the sequence no room) */
    /* usage, valid once started: those of the prompt's first admission (a
     * resumed request's later prefills are not counted again) */
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t preemptions;       /* times the request was preempted and resumed so far */
    kp_eng_report report;       /* the engine's report of the (first) prefill */
    kp_doctor_report doctor;    /* divergence, snippets and cause (JSON-escaped snippets) */
    bool has_doctor;
    double queue_ms, ttft_ms; /* waiting time; submit to first token */
    /* the prompt's first prefill: admitted, its positions computed so far
     * (the cached ones included; n_prompt once started) and the time since
     * admission. After kp_sreq_progress, each slice wakes the owner. */
    bool admitted;
    uint32_t prefill_done;
    double prefill_ms;
    /* the token ids: prompt_tokens of the prompt, then completion_tokens
     * generated ones (an end-of-generation token included); owned by the
     * request, valid until kp_sreq_release */
    const int32_t *ids;
    /* with logprobs: an entry per token generated since the last wait, in
     * order (malloc'd, caller frees; NULL if none); an end-of-generation
     * token that ended the request has none (its text is not shown) */
    kp_token_logprobs *lp;
    uint32_t n_lp;
} kp_sreq_update;

/* Waits up to timeout_ms (< 0: forever) for new text or the end, then
 * moves what is new into *u (text ownership passes to the caller) and
 * fills the rest. Returns true when anything changed (text, started,
 * finish), false on timeout. */
bool kp_sreq_wait(kp_sreq *r, int timeout_ms, kp_sreq_update *u);

/* kp_sreq_wait over the n choices rs[0..n) of one kp_sched_submit_n:
 * waits up to timeout_ms (< 0: forever) until one of them has news, moves
 * it into *u as kp_sreq_wait does and sets *which to its index. The
 * search starts after the *which given (pass n - 1 to start at 0), so no
 * choice starves the others. Returns false on timeout. */
bool kp_sreq_wait_any(kp_sreq *const *rs, uint32_t n, int timeout_ms, uint32_t *which, kp_sreq_update *u);

/* From now on, kp_sreq_wait also wakes after every slice of the prompt's
 * first prefill (kp_sreq_update.prefill_done), for a client that shows
 * progress. The admission may already have passed when it is called:
 * to be woken by it, set kp_sreq_params.progress instead. */
void kp_sreq_progress(kp_sreq *r);

/* Asks the scheduler to stop the request (a client went away). The tokens
 * it computed stay cached. Safe to call more than once, and after the end. */
void kp_sreq_cancel(kp_sreq *r);

/* Drops the caller's reference: cancels the request if it is still running.
 * NULL is a no-op. */
void kp_sreq_release(kp_sreq *r);

/* ---- cache operations ------------------------------------------------------
 *
 * The engine thread owns the engine, its pool and index, and the report
 * history; other threads never touch them. They read a snapshot the engine
 * thread publishes, or queue an operation that the engine thread serves
 * between two steps (before the next one starts, waking it when idle)
 * while the caller waits: so every call returns within about one step. */

#define KP_SCHED_TOP 10
#define KP_SCHED_TREE 128 /* index nodes a snapshot draws at most (kp_eng_tree) */

/* What the cache holds, as of the last publication: after every change the
 * engine made, at most every 50 ms while sequences run, at once after a
 * request ends (before its owner hears of it), after a pin or unpin (before
 * the call returns) and when the engine goes idle. */
typedef struct {
    kp_eng_stats kv;                  /* the memory bill */
    kp_eng_prefix top[KP_SCHED_TOP];  /* the largest cached prefixes, most tokens first */
    uint32_t n_top;
    kp_eng_node tree[KP_SCHED_TREE];  /* the first nodes of the index in preorder (kv.n_nodes in all) */
    uint32_t n_tree;
} kp_sched_cache;

/* Copies the last published snapshot (a short mutex, no engine wait). */
void kp_sched_cache_get(kp_sched *s, kp_sched_cache *out);

/* What a prefill of tokens[0..n) would reuse now (kp_eng_probe) and, when
 * *has_doctor comes back true, why it leaves the cache where it does
 * (kp_cachereport_explain against the report history, snippets JSON-escaped;
 * text, may be NULL, is the prompt's text). Served by the engine thread.
 * KP_EFULL when the scheduler is shutting down. */
kp_status kp_sched_probe(kp_sched *s, const int32_t *tokens, uint32_t n, const char *text, size_t text_len,
                         kp_eng_report *r, kp_doctor_report *d, bool *has_doctor, kp_error *err);

/* kp_eng_pin on the engine thread: pins the cached tokens[0..n) for ttl
 * seconds from now (0: until unpinned), *id its id, *after (may be NULL)
 * the memory bill right after it. Errors as kp_eng_pin, KP_EFULL also when
 * shutting down. The next snapshot already holds the pin. */
kp_status kp_sched_pin(kp_sched *s, const int32_t *tokens, uint32_t n, int64_t ttl_seconds, int64_t now,
                       uint64_t *id, kp_eng_stats *after, kp_error *err);

/* kp_eng_unpin on the engine thread. KP_ENOTFOUND (no such pin), KP_EFULL
 * when shutting down. */
kp_status kp_sched_unpin(kp_sched *s, uint64_t id, kp_error *err);

/* kp_eng_node_path on the engine thread: the tokens of the path to the
 * node the first-token chain firsts[0..depth) names, into out[0..min(end,
 * max)), its run [*start, *end). Errors as kp_eng_node_path, KP_EFULL also
 * when shutting down. */
kp_status kp_sched_node_path(kp_sched *s, const int32_t *firsts, uint32_t depth, int32_t *out, uint32_t max,
                            uint32_t *start, uint32_t *end, kp_error *err);

/* The engine's longest sequence (kp_eng_max_pos), fixed at kp_sched_new. */
uint32_t kp_sched_max_pos(const kp_sched *s);

/* Running sequences at most (kp_sched_config.parallel). */
uint32_t kp_sched_parallel(const kp_sched *s);

#define KP_SCHED_HIST_BUCKETS 12

typedef struct {
    uint64_t requests_started, requests_finished, requests_cancelled, requests_failed;
    uint64_t prompt_tokens, cached_tokens, generated_tokens, steps;
    uint64_t preemptions;       /* running sequences sent back to the queue to make room */
    uint64_t resumed_computed;  /* positions resumed requests had to compute again */
    uint64_t inflight_followers;      /* requests that reused a running sequence's prompt rows */
    uint64_t inflight_reused_tokens;  /* ... rows they took from it beyond what the index held */
    uint32_t queued, running;
    uint32_t waiting_for_kv;    /* queued requests a free sequence slot would take now but for the
                                   KV blocks the queue's head waits for (the queue is FIFO) */
    kp_eng_stats kv;            /* the memory bill of the last snapshot (kp_sched_cache) */
    /* histograms: cumulative counts of observations <= le[i] seconds */
    double ttft_le[KP_SCHED_HIST_BUCKETS], tpot_le[KP_SCHED_HIST_BUCKETS], kvwait_le[KP_SCHED_HIST_BUCKETS];
    uint64_t ttft_count[KP_SCHED_HIST_BUCKETS], tpot_count[KP_SCHED_HIST_BUCKETS],
        kvwait_count[KP_SCHED_HIST_BUCKETS];
    uint64_t ttft_n, tpot_n, kvwait_n;
    double ttft_sum, tpot_sum, kvwait_sum;
    /* kvwait: per admission that had to wait, the time the request spent at
     * the head of the queue, a sequence slot free, waiting for KV blocks */
} kp_sched_stats;

void kp_sched_stats_get(kp_sched *s, kp_sched_stats *out);

#endif
