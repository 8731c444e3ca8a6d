/*
 * scheduler_crews.c - in-flight prefixes (the scheduler's "crews"): a
 * queued request that shares a long prompt prefix with a running sequence
 * waits for that sequence's rows instead of computing them again.
 *
 * Owns: the choice of the sequence to park on (kp_sched_crew_find), the
 * fork of the shared rows once computed (crew_attach, before a step:
 * kp_sched_crew_ready, which also gives the sequences others are parked on
 * the step's prefill budget first), and what becomes of the parked
 * requests when the one they wait on leaves (kp_sched_crew_leave). Engine
 * thread only, called from scheduler_thread.c, which parks a request
 * (crew_park: it must be able to end it) and counts a parked request's
 * blocks in the KV rule (kv_room); this file calls only scheduler.c (the
 * clock, the queue's front). The fields it uses are a request's crew,
 * crew_n, n_crew, crew_chunk, no_crew and crew_rep (scheduler_impl.h).
 *
 * Crews (in-flight prefixes). A request at the queue's head whose prompt
 * shares with the run of a running sequence L (L's prompt while it
 * prefills, its positions once it generates) more than the index holds,
 * and a block at least, parks on L (kp_sched_crew_find, tokens compared
 * one by one): it takes a slot but no step item and no prefill budget, and
 * holds no blocks. Before each step, a parked request whose crew_n shared
 * positions L has computed forks them (kp_eng_fork_prefix: L's whole
 * blocks shared, the block holding position crew_n - 1 copied when
 * partial, crew_n <= its prompt - 1) and prefills only its own tail, in
 * the same step; the sequences someone is parked on get the step's
 * prefill budget first, so the shared part is computed at L's full speed
 * and the tails of a crew are batched together after it. A model with
 * recurrent layers forks only where L holds a state (kp_eng_fork_ahead):
 * L's snapshot at the latest state point within the shared prefix (every
 * --state-every positions, its prompt's end), which L takes as it passes;
 * the follower computes the rest of the shared part itself:
 *
 *   arrive | L prefilling 4000 + 100 | F1..F7 parked (crew L, crew_n 4000)        |
 *   steps  | L: the budget first      | nothing                                    |
 *   then   | L decoding               | Fi = fork_prefix(L, 4000); the 7 tails of  |
 *          |                          | 100 share the budget of the next steps     |
 *
 * KV: a parked request counts its prompt less the whole blocks it will
 * share. L leaving (finished, cancelled, failed, preempted) first lets the
 * parked requests whose rows are computed fork them, then sends the others
 * to the queue's front in order (not counted as preemptions); L's rows are
 * indexed as it leaves, so the first of them reuses them through the index
 * and the others park on it. A request sharing nothing with a running
 * sequence is admitted exactly as before.
 *
 * Invariants: a parked request is in the running table with `crew` set,
 * no sequence, no step item, and crew_n <= its prompt - 1; its crew's
 * n_crew counts it, and the crew is running, neither a follower nor
 * parked itself. A fork that finds no block sends the request to the
 * queue's front with no_crew set: it is admitted the ordinary way.
 */
#include "serve/scheduler.h"
#include "serve/scheduler_impl.h"

#include <pthread.h>
#include <stdatomic.h>

/* The positions of running request r that another request may fork once
 * computed: its fill while prefilling (the rows come as it computes
 * them), what it holds once generating. */
static uint32_t crew_run(const kp_sreq *r) { return r->fed > r->n_fill ? r->fed : r->n_fill; }

/* The running sequence whose run shares the longest prefix with queued r's
 * fill, when that prefix is a block long at least and longer than what the
 * index holds for r (*rep: kp_eng_probe of the index now): r then parks on it and
 * forks *cap positions, at most n_fill - 1 (r computes its last prompt
 * position for its logits, as on a full hit). Tokens are compared one by
 * one. NULL: r is admitted the ordinary way (a first admission only; not
 * a choice of n). Engine thread, r the queue's head. */
kp_sreq *kp_sched_crew_find(kp_sched *s, kp_sreq *r, uint32_t *cap, kp_eng_report *rep) {
    *cap = 0;
    if (r->no_crew || r->admitted || r->n_fill < 2 || s->n_running == 0) return NULL;
    const int32_t *t = kp_gen_tokens(r->gen);
    kp_sreq *best = NULL;
    uint32_t most = 0;
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *q = s->running[i];
        if (!q || q->lead || q->crew) continue; /* a cancelled one too: its rows are indexed as it ends */
        uint32_t m = crew_run(q), k = 0;
        if (m > r->n_fill - 1) m = r->n_fill - 1;
        const int32_t *u = kp_gen_tokens(q->gen);
        while (k < m && t[k] == u[k]) k++;
        k = kp_eng_fork_ahead(s->e, &q->seq, k); /* a recurrent model: where q holds (or will hold) a state */
        if (k > most) {
            most = k;
            best = q;
        }
    }
    if (!best || most < kp_eng_block_size(s->e)) return NULL;
    kp_eng_probe(s->e, t, r->n_fill, rep);
    if (most <= rep->reused_tokens) return NULL;
    *cap = most;
    return best;
}

/* The parked request in slot i, whose crew has computed its crew_n
 * positions, forks them (kp_eng_fork_prefix) and becomes an ordinary
 * prefilling sequence from there: its report is the index's at parking
 * with the forked rows as reused, those beyond the index's as in-flight,
 * and the time it waited. A fork that finds no block sends it back to the
 * queue's front, to be admitted the ordinary way. Engine thread. */
static void crew_attach(kp_sched *s, uint32_t i) {
    kp_sreq *q = s->running[i], *lead = q->crew;
    lead->n_crew--;
    q->crew = NULL;
    kp_error err = {0};
    if (kp_eng_fork_prefix(s->e, &lead->seq, q->crew_n, &q->seq, &err) != KP_OK) {
        q->no_crew = true;
        s->running[i] = NULL;
        kp_sched_requeue(s, q);
        return;
    }
    s->dirty = true;
    q->fed = q->crew_n;
    q->admitted = true;
    const int32_t *tokens = kp_gen_tokens(q->gen);
    kp_eng_report rep = q->crew_rep;
    uint32_t idx = rep.reused_tokens;
    rep.reused_tokens = q->crew_n;
    rep.computed_tokens = q->n_fill - q->crew_n;
    rep.inflight_tokens = q->crew_n > idx ? q->crew_n - idx : 0;
    rep.inflight_wait_ms = (kp_sched_now() - q->t_admit) * 1e3;
    kp_doctor_report d; /* why the index alone left off where it did */
    bool has = kp_cachereport_explain(s->crep, tokens, q->n_prompt, q->text, q->text_len, &q->crew_rep,
                               KP_DOCTOR_ESCAPE_JSON, &d, &err) == KP_OK;
    pthread_mutex_lock(&q->mu);
    q->report = rep;
    if (has) q->doctor = d;
    q->has_doctor = has;
    q->queue_ms = (q->t_admit - q->t_submit) * 1e3;
    q->prog_admitted = true;
    q->prog_done = q->fed;
    if (atomic_load(&q->progress)) {
        q->prog_new = true;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_lock(&s->mu);
    s->st.requests_started++;
    s->st.prompt_tokens += q->n_prompt;
    s->st.cached_tokens += rep.reused_tokens;
    s->st.inflight_followers++;
    s->st.inflight_reused_tokens += rep.inflight_tokens;
    pthread_mutex_unlock(&s->mu);
}

/* r leaves the running table with requests parked on it: those whose rows
 * r has computed fork them now (r's sequence is still whole); the others go
 * back to the queue's front in their order (r's rows are indexed as it
 * leaves, so the first of them reuses them through the index and the rest
 * park on that one: nothing r computed is computed again). Not counted as
 * preemptions. Engine thread. */
void kp_sched_crew_leave(kp_sched *s, kp_sreq *r) {
    for (uint32_t i = s->n_running; r->n_crew > 0 && i-- > 0;) {
        kp_sreq *q = s->running[i];
        if (!q || q->crew != r) continue;
        if (r->fed >= q->crew_n) {
            crew_attach(s, i);
            continue;
        }
        r->n_crew--;
        q->crew = NULL;
        s->running[i] = NULL;
        kp_sched_requeue(s, q); /* from the youngest: the oldest ends up first */
    }
}

/* Before a step: parked requests whose crew has computed their rows fork
 * them, and the sequences others are parked on take the step's prefill
 * budget first (*budget: what is left for everyone else), so a crew's
 * shared prompt is computed at full speed. Engine thread. */
void kp_sched_crew_ready(kp_sched *s, uint32_t *budget) {
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *q = s->running[i];
        if (q) q->crew_chunk = 0;
        if (q && q->crew && !atomic_load(&q->cancel) && q->crew->fed >= q->crew_n) crew_attach(s, i);
    }
    for (uint32_t i = 0; i < s->n_running && *budget > 0; i++) {
        kp_sreq *q = s->running[i];
        if (!q || q->n_crew == 0 || q->lead || q->crew || q->fed >= q->n_fill || atomic_load(&q->cancel)) continue;
        q->crew_chunk = q->n_fill - q->fed < *budget ? q->n_fill - q->fed : *budget;
        *budget -= q->crew_chunk;
    }
}
