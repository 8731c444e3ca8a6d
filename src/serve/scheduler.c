/*
 * scheduler.c - the scheduler's requests and queue (scheduler.h), and the
 * rules its engine thread keeps.
 *
 * The scheduler is these files over one internal header:
 *
 *   scheduler.c          requests: submit (the queue's tail), wait, cancel,
 *                        release; the queue's front (kp_sched_requeue); the
 *                        entry points of the cache operations (probe, pin,
 *                        unpin, node path: queued to the engine thread); the
 *                        snapshot and the stats as callers read them. This
 *                        comment: a request's life, the KV rules and why they
 *                        always make progress, choices, locks
 *   scheduler_thread.c   the engine thread: start and stop, the loop,
 *                        admission, steps and sampling, preemption, the
 *                        snapshot published, the cache operations served
 *   scheduler_crews.c    in-flight prefixes: a queued request parked on a
 *                        running sequence forks the rows they share
 *   scheduler_impl.h     the types they share (internal to these files)
 *
 * Calls between them go one way: scheduler_thread.c calls
 * scheduler_crews.c (kp_sched_crew_find, _leave, _ready) and scheduler.c
 * (kp_sched_now, kp_sched_unref, kp_sched_requeue); scheduler_crews.c calls
 * scheduler.c; scheduler.c calls neither.
 *
 * Owns (the files together): the thread, the queue (FIFO of kp_sreq under
 * `mu`), the queue of cache operations (under `mu`), the running table
 * (engine thread only), the report history (kp_cachereport, engine thread
 * only), the cache snapshot (under `snap_mu`) and the stats. Borrows the
 * engine and the vocabulary; only the engine thread calls the engine, and
 * what it does in one iteration is in scheduler_thread.c's top comment.
 *
 * A request's life and who may touch what:
 *
 *   submit --queued--> admitted --prefilling--> generating --> ended --> told
 *   (caller)  (mu)  ^  (engine thread only: seq, gen, fed)  |           (r->mu)
 *                   +------------- preempted ---------------+
 *
 *   gen tokens | prompt 0..n_prompt-1 | generated tokens ...  | n_all
 *   fill       = the tokens this admission prefills: n_prompt the first
 *                time, n_all (prompt + generated so far) on a resume
 *   fed        = positions the sequence holds (K/V computed)
 *   prefilling while fed < n_fill; generating: fed == n_all - 1, the
 *   newest sampled token (n_all - 1) is the next decode input. The gen
 *   (engine/gen.h) samples, applies stop strings, end-of-generation,
 *   max_tokens and the context end, and releases the text.
 *
 * KV memory. Blocks are counted as kp_eng_room_for counts them (free, plus
 * what evicting every unheld, unpinned cached prefix returns). The rules:
 *
 *   submit   kp_sched_fit: a request whose positions (prompt + max_tokens
 *            - 1, at most the context) exceed the budget's is refused; an
 *            implicit max_tokens is cut to fit. So any request fits the
 *            pool alone, pins aside.
 *   admit    the queue's head X is admitted when
 *              need(X) + pending + running  <=  free + evictable
 *            need(X): blocks of X's prompt beyond the whole blocks it
 *            shares with the cache (the copy of a partial one counts);
 *            pending: blocks the running sequences still have to take for
 *            the rest of their prompts; running: one block per running
 *            sequence, the most a decode step takes, so admitting X never
 *            makes the next step fail. With others running, the evictable
 *            blocks exclude the path X will hold; with none, X alone may
 *            use every unpinned block. Under a window budget the same rule
 *            holds for window slots: X's peak (its window, a chunk, the
 *            block the window starts in, its resume copy, and the window
 *            before its prompt's end, kp_eng_window_need) plus what the
 *            running ones may still take (kp_eng_seq_window_need; a
 *            follower its decode's) must fit
 *            the free slots and those the index can give up
 *            (kp_eng_room.spare_slots: window rows it may drop, blocks it
 *            may evict), so a step never finds the window arena short
 *            and preempts for it. Strictly FIFO: nothing behind a head
 *            that waits for KV is admitted, so no request is overtaken
 *            (a big prompt may hold small ones back until running
 *            sequences end; it is never starved). A request that does not
 *            fit even with nothing running can only be kept out by pins:
 *            it ends at once, finish LENGTH with a note.
 *   preempt  a step item that gets KP_EFULL (its sequence could not grow,
 *            the engine having evicted every unheld prefix) makes the
 *            youngest running sequence V (the last admitted; possibly the
 *            item's own) step aside: V's tokens are indexed (so a resume
 *            reuses what is still cached), V is released (its rows become
 *            evictable cache) and goes back to the queue's FRONT with its
 *            kp_gen intact (sampler, tokens, text). Resumed, it is admitted
 *            like any request with fill = n_all and continues: its owner
 *            sees the same tokens, only later. A sequence that ran the
 *            step alone and still could not grow is kept out by pins: it
 *            ends with finish LENGTH and a note instead of waiting forever
 *            (one whose companions all ended in that step retries: their
 *            blocks are cache now).
 *
 * Why this always makes progress. The running table is in admission
 * order and each step's items follow it, so the oldest running sequence O
 * reserves its blocks first. O is never a victim while another sequence
 * runs (the victim is the youngest). Right after an admission the pool
 * holds, beyond the newcomer's prompt, a block per running sequence and
 * every pending prompt block, so the next step's items all get theirs;
 * hence O's item fails only in a step with no admission since its last
 * success, and each such failure removes one other running sequence. After
 * at most parallel - 1 failures O runs alone, and alone it can always grow
 * to its limit (kp_sched_fit; the engine drops O's own hold on cached
 * rows when nothing else can be evicted) unless pins take the room, in
 * which case it ends. So O finishes in a bounded number of steps, then the
 * next oldest is O, and the queue's head is admitted at the latest when
 * nothing runs (it fits alone, or ends for pins). Preempted requests keep
 * their place at the queue's front, so they resume before anything that
 * arrived after them.
 *
 * Choices (kp_sched_submit_n). The n requests of one call share a group
 * id and sit side by side in the queue. When the first (the leader) is at
 * the head, it is admitted with the followers right behind it only when
 * there are slots for all and the KV rule holds with one block per
 * follower for its copy of the leader's partial last prompt block. The
 * followers wait in the running table (no step item, `lead` set) until
 * the step in which the leader's prefill ends; then each gets
 * kp_eng_fork of the leader's sequence (whole blocks shared, the partial
 * one copied) and a copy of its logits, and samples with its own seed:
 *
 *   running | L prefilling | F1 waiting | F2 waiting |   --step-->
 *           | L sampling   | F1 = fork(L), sampling | F2 = fork(L), sampling |
 *
 * A leader that leaves before its prefill ends (finished, failed,
 * preempted) sends its waiting followers back to the queue, counted as
 * preemptions; a follower that reaches the queue's head on its own is an
 * ordinary request (prefilled through the prefix cache). Followers count
 * their prompt tokens as cached in the stats, so prompt minus cached is
 * what was computed.
 *
 * Crews (in-flight prefixes). A request at the queue's head whose prompt
 * shares more with a running sequence than the index holds, a block at
 * least, parks on it and forks those rows once they are computed, then
 * prefills only its own tail: scheduler_crews.c has the rules.
 *
 * Output fields of a request (text, usage, report, finish) are written by
 * the engine thread and read by the owner, both under the request's own
 * mutex; `cancel` is an atomic flag. A request has two references (owner,
 * scheduler); the last release frees it. A cache operation lives on its
 * caller's stack: queued under `mu`, served on the engine thread, `done`
 * set under `mu` as the engine thread's last touch.
 *
 * Locks: `mu` (queue, operations, counters, stats) and `snap_mu` (the
 * snapshot), each held only to copy; neither is held across an engine
 * call, and a request's `mu` is taken last and never held while taking
 * another lock. Only the engine thread takes requests off the queue, so
 * it may look at the head, unlock, decide, and then unlink it.
 */
#include "serve/scheduler.h"
#include "serve/scheduler_impl.h"

#include "base/buf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double kp_sched_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- requests ---------------------------------------------------------- */

static void sreq_free(kp_sreq *r) {
    kp_gen_free(r->gen);
    kp_grammar_free(r->grammar);
    free(r->text);
    free(r->msg_starts);
    free(r->logits);
    kp_buf_free(&r->out);
    kp_buf_free(&r->lp);
    if (r->grp && atomic_fetch_sub(&r->grp->refs, 1) == 1) {
        pthread_mutex_destroy(&r->grp->mu);
        pthread_cond_destroy(&r->grp->cv);
        free(r->grp);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void kp_sched_unref(kp_sreq *r) {
    if (atomic_fetch_sub(&r->refs, 1) == 1) sreq_free(r);
}

void kp_sreq_cancel(kp_sreq *r) {
    if (r) atomic_store(&r->cancel, true);
}

void kp_sreq_progress(kp_sreq *r) {
    if (r) atomic_store(&r->progress, true);
}

void kp_sreq_release(kp_sreq *r) {
    if (!r) return;
    kp_sreq_cancel(r);
    kp_sched_unref(r);
}

/* The CLOCK_REALTIME time timeout_ms (> 0) from now, for a timed wait. */
static struct timespec deadline(int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    }
    return until;
}

bool kp_sreq_wait(kp_sreq *r, int timeout_ms, kp_sreq_update *u) {
    memset(u, 0, sizeof *u);
    pthread_mutex_lock(&r->mu);
    struct timespec until = deadline(timeout_ms);
    for (;;) {
        bool news = r->out.len > 0 || r->lp.len > 0 || r->new_tokens > 0 || (r->started && !r->started_seen) ||
                    (r->finish != KP_FINISH_NONE && !r->finish_seen) || r->prog_new;
        if (news || timeout_ms == 0) break;
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0)
            break;
    }
    bool changed = r->out.len > 0 || r->lp.len > 0 || r->new_tokens > 0 || (r->started && !r->started_seen) ||
                   (r->finish != KP_FINISH_NONE && !r->finish_seen) || r->prog_new;
    r->prog_new = false;
    u->admitted = r->prog_admitted;
    u->prefill_done = r->started ? r->n_prompt : r->prog_done;
    u->prefill_ms = r->prog_ms;
    if (r->out.len > 0) {
        u->text = r->out.data; /* ownership moves to the caller */
        u->len = r->out.len;
        memset(&r->out, 0, sizeof r->out);
    }
    if (r->lp.len > 0) {
        u->lp = (kp_token_logprobs *)(void *)r->lp.data; /* ownership moves to the caller */
        u->n_lp = (uint32_t)(r->lp.len / sizeof *u->lp);
        memset(&r->lp, 0, sizeof r->lp);
    }
    u->new_tokens = r->new_tokens;
    r->new_tokens = 0;
    u->started = r->started;
    r->started_seen = r->started;
    u->finish = r->finish;
    r->finish_seen = r->finish != KP_FINISH_NONE;
    u->status = r->status;
    u->err = r->err;
    u->prompt_tokens = r->n_prompt;
    u->cached_tokens = r->report.reused_tokens;
    u->completion_tokens = r->completion_tokens;
    u->ids = kp_gen_tokens(r->gen); /* entries below n_prompt + completion_tokens are final */
    u->report = r->report;
    u->doctor = r->doctor;
    u->has_doctor = r->has_doctor;
    u->queue_ms = r->queue_ms;
    u->ttft_ms = r->ttft_ms;
    u->preemptions = r->preemptions;
    pthread_mutex_unlock(&r->mu);
    return changed;
}

bool kp_sreq_wait_any(kp_sreq *const *rs, uint32_t n, int timeout_ms, uint32_t *which, kp_sreq_update *u) {
    sgroup *g = n > 1 ? rs[0]->grp : NULL;
    if (!g) {
        *which = 0;
        return kp_sreq_wait(rs[0], timeout_ms, u);
    }
    struct timespec until = deadline(timeout_ms);
    for (;;) {
        pthread_mutex_lock(&g->mu);
        uint64_t t0 = g->ticks;
        pthread_mutex_unlock(&g->mu);
        for (uint32_t k = 1; k <= n; k++) {
            uint32_t j = (*which + k) % n;
            if (kp_sreq_wait(rs[j], 0, u)) {
                *which = j;
                return true;
            }
        }
        if (timeout_ms == 0) return false;
        pthread_mutex_lock(&g->mu);
        bool timed_out = false;
        while (g->ticks == t0 && !timed_out) {
            if (timeout_ms < 0)
                pthread_cond_wait(&g->cv, &g->mu);
            else
                timed_out = pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0;
        }
        pthread_mutex_unlock(&g->mu);
        if (timed_out) return false;
    }
}

kp_status kp_sched_fit(const kp_sched *s, uint32_t n_prompt, uint32_t max_tokens, bool max_tokens_set,
                       uint32_t *max_tokens_out, kp_error *err) {
    *max_tokens_out = max_tokens;
    uint32_t q = s->kv_positions;
    if (n_prompt > q)
        return kp_fail(err, KP_ERANGE,
                       "the prompt has %u tokens, more than the %u positions the KV budget holds (%llu bytes at "
                       "%llu bytes per token)",
                       n_prompt, q, (unsigned long long)s->kv_budget, (unsigned long long)s->kv_per_token);
    uint64_t need = (uint64_t)n_prompt + (max_tokens ? max_tokens - 1 : 0);
    if (need > s->max_pos) need = s->max_pos; /* the gen stops at the context's end */
    if (need <= q) return KP_OK;
    if (max_tokens_set)
        return kp_fail(err, KP_ERANGE,
                       "the prompt's %u tokens and max_tokens %u need %llu positions of KV cache, more than the %u "
                       "positions the KV budget holds (%llu bytes at %llu bytes per token); lower max_tokens or "
                       "raise the KV budget",
                       n_prompt, max_tokens, (unsigned long long)need, q, (unsigned long long)s->kv_budget,
                       (unsigned long long)s->kv_per_token);
    *max_tokens_out = q - n_prompt + 1; /* n_prompt + max - 1 == q */
    return KP_OK;
}

uint32_t kp_sched_kv_positions(const kp_sched *s) { return s->kv_positions; }

/* A request of p's with max_tokens and seed, not queued yet (one reference
 * for the owner, one for the scheduler). */
static kp_status sreq_make(kp_sched *s, const kp_sreq_params *p, uint32_t max_tokens, uint64_t seed,
                           int32_t logprobs, kp_sreq **out, kp_error *err) {
    *out = NULL;
    kp_sreq *r = calloc(1, sizeof *r);
    if (!r) return kp_fail(err, KP_ENOMEM, "out of memory for a request");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancel, false);
    atomic_init(&r->refs, 2);
    /* checks the prompt (empty, longer than the context, ids) and the sampling parameters */
    kp_gen_params gp = {p->sp, max_tokens, s->max_pos, (int32_t)s->n_vocab, p->ignore_eos, p->stops, p->n_stops,
                        false};
    gp.sp.seed = seed;
    kp_status st = kp_gen_new(&r->gen, s->v, p->prompt, p->n_prompt, &gp, err);
    if (st != KP_OK) {
        sreq_free(r);
        return st;
    }
    kp_gen_set_logprobs(r->gen, logprobs);
    r->logits = malloc((size_t)s->n_vocab * sizeof *r->logits);
    if (!r->logits) {
        sreq_free(r);
        return kp_fail(err, KP_ENOMEM, "out of memory for a request");
    }
    if (p->text) {
        if (!(r->text = malloc(p->text_len + 1))) {
            sreq_free(r);
            return kp_fail(err, KP_ENOMEM, "out of memory for a request");
        }
        memcpy(r->text, p->text, p->text_len);
        r->text[p->text_len] = 0;
        r->text_len = p->text_len;
    }
    if (p->n_msg_starts) {
        if (!(r->msg_starts = malloc((size_t)p->n_msg_starts * sizeof *r->msg_starts))) {
            sreq_free(r);
            return kp_fail(err, KP_ENOMEM, "out of memory for a request");
        }
        memcpy(r->msg_starts, p->msg_starts, (size_t)p->n_msg_starts * sizeof *r->msg_starts);
        r->n_msg_starts = p->n_msg_starts;
    }
    r->grammar = kp_grammar_ref(p->grammar);
    r->n_prompt = r->n_fill = p->n_prompt;
    atomic_init(&r->progress, p->progress);
    r->hints = p->hints;
    r->t_submit = kp_sched_now();
    *out = r;
    return KP_OK;
}

kp_status kp_sched_submit(kp_sched *s, const kp_sreq_params *p, kp_sreq **out, kp_error *err) {
    return kp_sched_submit_n(s, p, 1, -1, out, err);
}

kp_status kp_sched_submit_n(kp_sched *s, const kp_sreq_params *p, uint32_t n, int32_t logprobs, kp_sreq **out,
                            kp_error *err) {
    for (uint32_t i = 0; i < n; i++) out[i] = NULL;
    if (n == 0 || n > s->cfg.parallel)
        return kp_fail(err, KP_EINVAL, "n is %u: a request has 1 to %u choices (the server's parallel sequences)", n,
                       s->cfg.parallel);
    if (logprobs > KP_LOGPROBS_MAX)
        return kp_fail(err, KP_EINVAL, "top_logprobs is %d, more than %d", logprobs, KP_LOGPROBS_MAX);
    uint32_t max_tokens = p->max_tokens;
    if (p->n_prompt <= s->max_pos) { /* longer: kp_gen_new says so */
        kp_status st = kp_sched_fit(s, p->n_prompt, p->max_tokens, p->max_tokens_set, &max_tokens, err);
        if (st != KP_OK) return st;
        /* n choices: the prompt once, the generated positions of each */
        uint64_t gen = max_tokens ? max_tokens - 1 : 0;
        if (p->n_prompt + gen > s->max_pos) gen = s->max_pos - p->n_prompt;
        uint64_t q = s->kv_positions, need = p->n_prompt + gen * n;
        if (n > 1 && need > q) {
            if (p->max_tokens_set)
                return kp_fail(err, KP_ERANGE,
                               "the prompt's %u tokens and %u choices of max_tokens %u need %llu positions of KV "
                               "cache, more than the %llu positions the KV budget holds; lower n or max_tokens",
                               p->n_prompt, n, max_tokens, (unsigned long long)need, (unsigned long long)q);
            max_tokens = (uint32_t)((q - p->n_prompt) / n + 1); /* n_prompt + n (max - 1) <= q */
        }
    }
    kp_status st = KP_OK;
    sgroup *g = NULL;
    if (n > 1) {
        if (!(g = calloc(1, sizeof *g))) return kp_fail(err, KP_ENOMEM, "out of memory for a request");
        pthread_mutex_init(&g->mu, NULL);
        pthread_cond_init(&g->cv, NULL);
        atomic_init(&g->refs, 0);
    }
    for (uint32_t i = 0; i < n && st == KP_OK; i++) {
        st = sreq_make(s, p, max_tokens, p->sp.seed + i, logprobs, &out[i], err);
        if (st == KP_OK && g) {
            out[i]->grp = g;
            atomic_fetch_add(&g->refs, 1);
            out[i]->follower = i > 0;
        }
    }
    if (st != KP_OK) {
        bool shared = g && atomic_load(&g->refs) > 0; /* then the last sreq_free frees g */
        for (uint32_t i = 0; i < n; i++) {
            if (out[i]) sreq_free(out[i]);
            out[i] = NULL;
        }
        if (g && !shared) {
            pthread_mutex_destroy(&g->mu);
            pthread_cond_destroy(&g->cv);
            free(g);
        }
        return st;
    }
    pthread_mutex_lock(&s->mu);
    /* queued requests that a free sequence slot takes at the engine's next
     * iteration are not waiting: queue_max bounds the others (queue 0: a
     * request is taken only when a slot is free for it) */
    uint32_t busy = s->n_running + s->n_taking;
    uint32_t free_slots = s->cfg.parallel > busy ? s->cfg.parallel - busy : 0;
    if (s->stop || s->n_queued >= s->cfg.queue_max + free_slots) {
        bool stopping = s->stop;
        pthread_mutex_unlock(&s->mu);
        for (uint32_t i = 0; i < n; i++) {
            sreq_free(out[i]);
            out[i] = NULL;
        }
        return stopping ? kp_fail(err, KP_EFULL, "the server is shutting down")
                        : kp_fail(err, KP_EFULL, "%u requests are already waiting; try again shortly",
                                  s->cfg.queue_max);
    }
    uint64_t group = n > 1 ? ++s->next_group : 0;
    for (uint32_t i = 0; i < n; i++) { /* the choices side by side in the queue */
        kp_sreq *r = out[i];
        r->group = group;
        if (s->qtail)
            s->qtail->next = r;
        else
            s->qhead = r;
        s->qtail = r;
        s->n_queued++;
    }
    s->st.queued = s->n_queued;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return KP_OK;
}

/* Puts r at the queue's front (a preempted request, or a parked one whose
 * crew left). Engine thread. */
void kp_sched_requeue(kp_sched *s, kp_sreq *r) {
    pthread_mutex_lock(&s->mu);
    r->next = s->qhead;
    s->qhead = r;
    if (!s->qtail) s->qtail = r;
    s->n_queued++;
    s->st.queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
}

/* ---- cache operations and reads -------------------------------------- */

/* Queues *o to the engine thread and waits until it is served. */
static kp_status run_op(kp_sched *s, sched_op *o, kp_error *err) {
    o->done = false;
    o->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return kp_fail(err, KP_EFULL, "the server is shutting down");
    }
    if (s->ops_tail)
        s->ops_tail->next = o;
    else
        s->ops = o;
    s->ops_tail = o;
    pthread_cond_signal(&s->work);
    while (!o->done) pthread_cond_wait(&s->op_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (o->st != KP_OK && err) *err = o->err;
    return o->st;
}

void kp_sched_cache_get(kp_sched *s, kp_sched_cache *out) {
    pthread_mutex_lock(&s->snap_mu);
    *out = s->snap;
    pthread_mutex_unlock(&s->snap_mu);
}

kp_status kp_sched_probe(kp_sched *s, const int32_t *tokens, uint32_t n, const char *text, size_t text_len,
                         kp_eng_report *r, kp_doctor_report *d, bool *has_doctor, kp_error *err) {
    sched_op o = {.kind = OP_PROBE, .tokens = tokens, .n = n, .text = text, .text_len = text_len, .rep = r, .doc = d};
    *has_doctor = false;
    kp_status st = run_op(s, &o, err);
    *has_doctor = st == KP_OK && o.has_doc;
    return st;
}

kp_status kp_sched_pin(kp_sched *s, const int32_t *tokens, uint32_t n, int64_t ttl_seconds, int64_t now,
                       uint64_t *id, kp_eng_stats *after, kp_error *err) {
    sched_op o = {.kind = OP_PIN, .tokens = tokens, .n = n, .ttl = ttl_seconds, .now = now, .after = after};
    kp_status st = run_op(s, &o, err);
    *id = st == KP_OK ? o.id : 0;
    return st;
}

kp_status kp_sched_unpin(kp_sched *s, uint64_t id, kp_error *err) {
    sched_op o = {.kind = OP_UNPIN, .id = id};
    return run_op(s, &o, err);
}

kp_status kp_sched_node_path(kp_sched *s, const int32_t *firsts, uint32_t depth, int32_t *out, uint32_t max,
                            uint32_t *start, uint32_t *end, kp_error *err) {
    sched_op o = {.kind = OP_PATH, .tokens = firsts, .n = depth, .path = out, .path_max = max};
    kp_status st = run_op(s, &o, err);
    *start = st == KP_OK ? o.path_start : 0;
    *end = st == KP_OK ? o.path_end : 0;
    return st;
}

uint32_t kp_sched_max_pos(const kp_sched *s) { return s->max_pos; }

void kp_sched_stats_get(kp_sched *s, kp_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_queued;
    out->running = s->n_running;
    pthread_mutex_unlock(&s->mu);
}

uint32_t kp_sched_parallel(const kp_sched *s) { return s->cfg.parallel; }
