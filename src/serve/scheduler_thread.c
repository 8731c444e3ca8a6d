/*
 * scheduler_thread.c - the scheduler's engine thread (scheduler.h):
 * admission, steps, preemption, the loop.
 *
 * Owns: the thread (kp_sched_new starts it, kp_sched_free stops and joins
 * it), the running table and the step items, the requests that ended this
 * iteration, the warm grammar matchers, the report history, and the cache
 * snapshot it publishes. Everything here runs on the engine thread, but
 * kp_sched_new (before the thread starts) and kp_sched_free (after it is
 * joined); only this thread calls the engine. It takes requests off the
 * queue that scheduler.c fills at the tail, puts preempted ones back at
 * the front (kp_sched_requeue), writes their output under each request's
 * mutex, and drops the scheduler's reference of one that ended
 * (kp_sched_unref). In-flight prefixes are scheduler_crews.c's: this file
 * asks it where a request parks (kp_sched_crew_find), parks it
 * (crew_park), and calls it before a step (kp_sched_crew_ready) and when a
 * sequence with parked requests leaves (kp_sched_crew_leave). The rules it
 * keeps (KV admission, preemption, why they always make progress, choices)
 * and the locks are in scheduler.c's top comment; the types in
 * scheduler_impl.h.
 *
 * One iteration of the engine thread:
 *
 *   take the queued operations, unlink cancelled queued requests (mu)
 *   serve the operations: probe (kp_eng_probe + kp_cachereport_explain), pin,
 *     unpin; publish the snapshot if one changed the cache; callers go on
 *   admit from the queue's head while a slot is free and the KV rule
 *     (scheduler.c's top comment) holds (kp_eng_begin, cache report);
 *     expire pins (every second)
 *   step: one kp_eng_step for every running sequence, sample, text;
 *     preempt for the items that found no KV block
 *   publish the snapshot (at once when a request ended or the engine is
 *     idle, else at most every 50 ms), compact the running table, tell the
 *     owners of ended requests
 *
 * so an operation waits for at most the step in flight, and whoever learns
 * that a request ended (its owner, or "running" in the counters) finds the
 * cache it left in the snapshot.
 *
 * Invariants: the running table is in admission order (the oldest
 * sequence reserves its blocks first in a step; the youngest steps aside);
 * a NULL slot is a request that left in this iteration, compacted away
 * before the owners hear of it; an owner hears that its request ended
 * (deliver) only after the snapshot shows the cache it left (publish).
 */
#include "serve/scheduler.h"
#include "serve/scheduler_impl.h"

#include "base/buf.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double TTFT_LE[KP_SCHED_HIST_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double TPOT_LE[KP_SCHED_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
                                                      0.08,  0.15,   0.3,   0.6,  1.2,  2.5};

static void observe(double v, const double *le, uint64_t *count, uint64_t *n, double *sum) {
    for (int i = 0; i < KP_SCHED_HIST_BUCKETS; i++)
        if (v <= le[i]) count[i]++;
    (*n)++;
    *sum += v;
}

/* Wakes kp_sreq_wait_any on r's choices: their group's tick advances. */
static void group_poke(kp_sreq *r) {
    if (!r->grp) return;
    pthread_mutex_lock(&r->grp->mu);
    r->grp->ticks++;
    pthread_cond_broadcast(&r->grp->cv);
    pthread_mutex_unlock(&r->grp->mu);
}

/* Appends released text and a token's log-probabilities (lp may be NULL)
 * (engine thread). */
static void emit_lp(kp_sreq *r, const char *text, size_t n, bool token, const kp_token_logprobs *lp) {
    pthread_mutex_lock(&r->mu);
    if (n > 0 && !kp_buf_put(&r->out, text, n)) r->out.oom = false; /* out of memory: this text is lost */
    if (lp && !kp_buf_put(&r->lp, lp, sizeof *lp)) r->lp.oom = false; /* ... these logprobs */
    if (token) r->new_tokens++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    group_poke(r);
}

static void emit(kp_sreq *r, const char *text, size_t n, bool token) { emit_lp(r, text, n, token, NULL); }

/* ---- the engine thread --------------------------------------------------- */

/* Publishes what the cache holds for kp_sched_cache_get and the metrics:
 * the memory bill, the top prefixes and the first nodes of the tree,
 * O(pool blocks + index nodes),
 * computed without a lock and copied under the snapshot mutex. Only when
 * the engine changed: always when `now_` (a request ended, a pin changed,
 * the engine goes idle), else at most every 50 ms. */
static void publish(kp_sched *s, bool now_) {
    double t = kp_sched_now();
    if (!s->dirty || (!now_ && t - s->last_publish < 0.05)) return;
    kp_sched_cache c;
    kp_eng_get_stats(s->e, &c.kv);
    kp_error err;
    if (kp_eng_top(s->e, c.top, KP_SCHED_TOP, &c.n_top, &err) != KP_OK) { /* out of memory: keep the old list */
        pthread_mutex_lock(&s->snap_mu);
        c.n_top = s->snap.n_top;
        memcpy(c.top, s->snap.top, sizeof c.top);
        pthread_mutex_unlock(&s->snap_mu);
    }
    if (kp_eng_tree(s->e, c.tree, KP_SCHED_TREE, &c.n_tree, &err) != KP_OK) c.n_tree = 0;
    pthread_mutex_lock(&s->snap_mu);
    s->snap = c;
    pthread_mutex_unlock(&s->snap_mu);
    pthread_mutex_lock(&s->mu);
    s->st.kv = c.kv;
    pthread_mutex_unlock(&s->mu);
    s->dirty = false;
    s->last_publish = t;
}

static void preempt(kp_sched *s, kp_sreq *r);
static bool on_logits(kp_sched *s, kp_sreq *r);

/* r leaves the running table: if it waited for a leader's prefill, the
 * leader no longer counts it; if followers waited for r's prefill, they
 * go back to the queue (to be prefilled on their own). Engine thread. */
static void leave_group(kp_sched *s, kp_sreq *r) {
    if (r->lead) {
        r->lead->n_wait--;
        r->lead = NULL;
    }
    if (r->crew) {
        r->crew->n_crew--;
        r->crew = NULL;
    }
    if (r->n_crew > 0) kp_sched_crew_leave(s, r);
    for (uint32_t i = 0; r->n_wait > 0 && i < s->n_running; i++) {
        kp_sreq *q = s->running[i];
        if (!q || q->lead != r) continue;
        s->running[i] = NULL;
        preempt(s, q); /* drops q->lead, r->n_wait */
    }
}

/* Ends a request on the engine side: indexes what it computed, releases
 * its sequence, counts it; the owner hears of it in deliver(), after the
 * snapshot shows the cache it left. Engine thread. */
/* Engine thread, r ended: its constraint's matcher goes back, reset, to the
 * spares of its grammar's warm slot (freed when the grammar is not kept
 * or the slot has enough). */
static void recycle(kp_sched *s, kp_sreq *r) {
    kp_gmatch *m = kp_gen_release_matcher(r->gen);
    if (!m) return;
    for (int i = 0; i < SCHED_WARM; i++)
        if (s->warm[i].g && s->warm[i].g == kp_gmatch_grammar(m) && s->warm[i].n_spare < SCHED_SPARES) {
            kp_gmatch_reset(m);
            s->warm[i].spare[s->warm[i].n_spare++] = m;
            return;
        }
    kp_gmatch_free(m);
}

static void finish(kp_sched *s, kp_sreq *r, kp_finish why, kp_status status, const kp_error *err) {
    leave_group(s, r);
    kp_gen_out o; /* ended from here (not by the gen): LENGTH releases held-back text */
    kp_gen_stop(r->gen, why, &o);
    if (o.len) emit(r, o.text, o.len, false);
    recycle(s, r);
    kp_error e2; /* best effort: a request that ended is not failed for its caching */
    kp_cachereport_finish(s->crep, s->e, &r->seq, kp_gen_tokens(r->gen), kp_gen_n_tokens(r->gen), NULL, &e2);
    s->dirty = true;
    pthread_mutex_lock(&s->mu);
    s->st.requests_finished++;
    if (why == KP_FINISH_CANCELLED) s->st.requests_cancelled++;
    if (why == KP_FINISH_ERROR) s->st.requests_failed++;
    pthread_mutex_unlock(&s->mu);
    r->why = why;
    r->why_status = status;
    if (err) r->why_err = *err;
    r->next = s->ended;
    s->ended = r;
}

/* Tells the owners of the requests that ended how they ended, and drops the
 * scheduler's references. Engine thread, after publish(). */
static void deliver(kp_sched *s) {
    while (s->ended) {
        kp_sreq *r = s->ended;
        s->ended = r->next;
        r->next = NULL;
        pthread_mutex_lock(&r->mu);
        r->finish = r->why;
        r->status = r->why_status;
        r->err = r->why_err;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        group_poke(r);
        kp_sched_unref(r);
    }
}

/* Ends r with finish LENGTH and a note: the KV budget (or its window
 * budget, r->no_slots) has no room for it even alone, because pinned
 * prefixes hold the rest. Engine thread. */
static void finish_no_room(kp_sched *s, kp_sreq *r) {
    kp_eng_stats k;
    kp_eng_get_stats(s->e, &k);
    kp_error note = {0};
    if (r->no_slots)
        kp_fail(&note, KP_EFULL,
                "the window budget has no room for this sequence's sliding-window rows even with nothing else "
                "running: pinned prefixes hold the window rows before their ends (%llu of %llu window bytes in use; "
                "unpin some, or raise --window-budget)",
                (unsigned long long)k.window_used_bytes, (unsigned long long)k.window_budget_bytes);
    else
        kp_fail(&note, KP_EFULL,
                "the KV budget has no room for this sequence at %u positions even with nothing else running: pinned "
                "prefixes hold %llu of its %llu bytes (unpin some, or raise the KV budget)",
                kp_gen_n_tokens(r->gen), (unsigned long long)k.pinned_bytes, (unsigned long long)k.budget_bytes);
    note.code = KP_OK;
    finish(s, r, KP_FINISH_LENGTH, KP_OK, &note);
}

/* Blocks a prefill of n_fill positions takes from the pool when it shares
 * the whole blocks of its first `shared` positions (the copy of a partial
 * one counts, as in kp_eng_room_for). */
static uint32_t crew_need(const kp_sched *s, uint32_t n_fill, uint32_t shared) {
    uint32_t B = kp_eng_block_size(s->e);
    return (n_fill + B - 1) / B - shared / B;
}

/* Whether the queue's head r, and `followers` choices of it that fork
 * from its prefill, may be admitted now: the KV rule of scheduler.c's top comment,
 * for blocks and, under a window budget, for window slots (*no_slots:
 * those are what is short). crew_n > 0: r parks to fork crew_n positions
 * of a running sequence (kp_sched_crew_find), so its need is its prompt
 * less those whole blocks. Engine thread. */
static bool kv_room(kp_sched *s, kp_sreq *r, uint32_t followers, uint32_t crew_n, bool *no_slots) {
    uint64_t pending = s->n_running; /* a block per running sequence */
    uint64_t slots = 0; /* window slots, under a window budget (0 without one) */
    uint32_t chunk = s->cfg.prefill_chunk;
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *q = s->running[i];
        if (q->lead) { /* a follower takes a copy of the leader's partial block, then decodes */
            pending += kp_eng_fork_blocks(s->e, q->lead->n_fill);
            slots += kp_eng_window_need(s->e, 1);
        } else if (q->crew) { /* parked: its prompt less the whole blocks it will share */
            pending += crew_need(s, q->n_fill, q->crew_n);
            slots += kp_eng_window_need(s->e, chunk);
        } else if (q->fed < q->n_fill) {
            pending += kp_eng_seq_blocks_missing(s->e, &q->seq, q->n_fill);
            slots += kp_eng_seq_window_need(s->e, &q->seq, q->n_fill - q->fed < chunk ? q->n_fill - q->fed : chunk);
        } else {
            slots += kp_eng_seq_window_need(s->e, &q->seq, 1);
        }
    }
    pending += (uint64_t)followers * kp_eng_fork_blocks(s->e, r->n_fill);
    slots += (uint64_t)followers * kp_eng_window_need(s->e, 1);
    kp_eng_room room;
    kp_error err;
    *no_slots = false;
    if (kp_eng_room_for(s->e, kp_gen_tokens(r->gen), r->n_fill, s->n_running > 0, &room, &err) != KP_OK)
        return true; /* out of memory for the count: admit; a step that finds no block preempts */
    if (crew_n > 0) room.need_blocks = crew_need(s, r->n_fill, crew_n);
    uint32_t rest = r->n_fill - (crew_n > room.reused_tokens ? crew_n : room.reused_tokens);
    slots += kp_eng_window_need(s->e, rest < chunk ? rest : chunk); /* its own, its prompt end's */
    *no_slots = slots > (uint64_t)room.free_slots + room.spare_slots;
    return room.need_blocks + pending <= (uint64_t)room.free_blocks + room.evictable_blocks && !*no_slots;
}

/* r leaves the queue now (t_admit): the time it waited at the head for KV
 * blocks, if it did, goes to the kvwait histogram. Engine thread. */
static void kv_waited(kp_sched *s, kp_sreq *r) {
    r->t_admit = kp_sched_now();
    if (r->t_kv > 0) {
        pthread_mutex_lock(&s->mu);
        observe(r->t_admit - r->t_kv, s->st.kvwait_le, s->st.kvwait_count, &s->st.kvwait_n, &s->st.kvwait_sum);
        pthread_mutex_unlock(&s->mu);
        r->t_kv = 0;
    }
}

/* Takes a request off the queue into the running table (false: it ended
 * instead: cancelled, no room even alone, or an error). no_room: it does
 * not fit even with nothing running. */
static bool admit(kp_sched *s, kp_sreq *r, bool no_room) {
    kv_waited(s, r);
    if (atomic_load(&r->cancel)) {
        finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
        return false;
    }
    if (no_room) {
        finish_no_room(s, r);
        return false;
    }
    kp_error err = {0};
    kp_eng_report rep;
    const int32_t *tokens = kp_gen_tokens(r->gen);
    kp_status st = kp_eng_begin_msgs(s->e, tokens, r->n_fill, r->msg_starts, r->n_msg_starts, &r->seq, &rep, &err);
    if (st != KP_OK) {
        finish(s, r, KP_FINISH_ERROR, st, &err);
        return false;
    }
    s->dirty = true;
    r->fed = rep.reused_tokens;
    if (r->admitted) { /* a resume: the report and usage stay those of the first prefill */
        pthread_mutex_lock(&s->mu);
        s->st.resumed_computed += rep.computed_tokens;
        pthread_mutex_unlock(&s->mu);
        return true;
    }
    r->admitted = true;
    kp_doctor_report d;
    bool has = kp_cachereport_explain_hinted(s->crep, tokens, r->n_prompt, r->text, r->text_len, &rep, &r->hints,
                                             KP_DOCTOR_ESCAPE_JSON, &d, &err) == KP_OK;
    pthread_mutex_lock(&r->mu);
    r->report = rep;
    if (has) r->doctor = d;
    r->has_doctor = has;
    r->queue_ms = (r->t_admit - r->t_submit) * 1e3;
    r->prog_admitted = true;
    r->prog_done = rep.reused_tokens;
    if (atomic_load(&r->progress)) {
        r->prog_new = true;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    s->st.requests_started++;
    s->st.prompt_tokens += r->n_prompt;
    s->st.cached_tokens += rep.reused_tokens;
    pthread_mutex_unlock(&s->mu);
    return true;
}

/* Takes follower f (a choice of lead's, nothing generated yet) into the
 * running table beside lead: it waits for lead's prefill, then forks from
 * it (fork_followers). false: it was cancelled instead. Engine thread. */
static bool admit_follower(kp_sched *s, kp_sreq *f, kp_sreq *lead) {
    f->t_admit = kp_sched_now();
    f->t_kv = 0;
    if (atomic_load(&f->cancel)) {
        finish(s, f, KP_FINISH_CANCELLED, KP_OK, NULL);
        return false;
    }
    f->fed = 0;
    f->lead = lead;
    lead->n_wait++;
    return true;
}

/* Takes queued r into the running table parked on lead: no sequence, no
 * step item, until lead has computed cap positions (kp_sched_crew_ready). false:
 * cancelled instead. Engine thread. */
static bool crew_park(kp_sched *s, kp_sreq *r, kp_sreq *lead, uint32_t cap, const kp_eng_report *rep) {
    kv_waited(s, r);
    if (atomic_load(&r->cancel)) {
        finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
        return false;
    }
    r->fed = 0;
    r->crew = lead;
    r->crew_n = cap;
    r->crew_rep = *rep;
    lead->n_crew++;
    return true;
}

/* The followers of r that directly follow it in the queue and may fork
 * from its prefill (choices of the same group, nothing generated by any
 * of them). Engine thread, the queue's head r. */
static uint32_t queued_followers(kp_sched *s, kp_sreq *r) {
    uint32_t k = 0;
    if (!r->group || r->follower || kp_gen_n_generated(r->gen) > 0) return 0;
    pthread_mutex_lock(&s->mu);
    for (kp_sreq *f = r->next; f && f->group == r->group && f->follower && kp_gen_n_generated(f->gen) == 0;
         f = f->next)
        k++;
    pthread_mutex_unlock(&s->mu);
    return k;
}

/* Gives the followers waiting on r, whose prompt r just computed (r->logits
 * holds its last position's), their sequences: a fork of r's
 * (kp_eng_fork) and a copy of the logits; each then samples its first
 * token. A follower whose fork finds no block goes back to the queue.
 * Engine thread, in the step that ended r's prefill, before r samples. */
static void fork_followers(kp_sched *s, kp_sreq *r) {
    for (uint32_t i = 0; r->n_wait > 0 && i < s->n_running; i++) {
        kp_sreq *q = s->running[i];
        if (!q || q->lead != r) continue;
        q->lead = NULL;
        r->n_wait--;
        kp_error err = {0};
        if (kp_eng_fork(s->e, &r->seq, &q->seq, &err) != KP_OK) {
            s->running[i] = NULL;
            preempt(s, q);
            continue;
        }
        s->dirty = true;
        memcpy(q->logits, r->logits, (size_t)s->n_vocab * sizeof *q->logits);
        q->fed = q->n_fill;
        q->admitted = true;
        kp_eng_report rep = r->report; /* the engine thread wrote it: no lock to read */
        rep.reused_tokens = q->n_fill;
        rep.computed_tokens = 0;
        rep.evictions = 0;
        rep.evicted_bytes = 0;
        pthread_mutex_lock(&q->mu);
        q->report = rep;
        q->has_doctor = false;
        q->queue_ms = (q->t_admit - q->t_submit) * 1e3;
        pthread_mutex_unlock(&q->mu);
        pthread_mutex_lock(&s->mu);
        s->st.requests_started++;
        s->st.prompt_tokens += q->n_prompt;
        s->st.cached_tokens += q->n_prompt;
        pthread_mutex_unlock(&s->mu);
        if (on_logits(s, q)) s->running[i] = NULL;
    }
}

/* Admits from the queue's head while a sequence slot is free and the KV
 * rule holds (FIFO: a head that must wait holds back everything behind
 * it). The choices of one kp_sched_submit_n come in together: the first
 * with the followers right behind it, when there are slots for all.
 * Engine thread. */
static void admit_queued(kp_sched *s) {
    bool waiting = false;
    while (s->n_running < s->cfg.parallel) {
        pthread_mutex_lock(&s->mu);
        kp_sreq *r = s->qhead; /* only this thread unlinks the head: it stays ours */
        pthread_mutex_unlock(&s->mu);
        if (!r) break;
        uint32_t k = queued_followers(s, r);
        if (s->n_running + 1 + k > s->cfg.parallel) {
            if (s->n_running > 0) break; /* the choices wait for slots for all of them */
            k = s->cfg.parallel - 1;
        }
        uint32_t cap = 0;
        kp_eng_report crep;
        kp_sreq *lead = k == 0 && !atomic_load(&r->cancel) ? kp_sched_crew_find(s, r, &cap, &crep) : NULL;
        bool no_room = false, no_slots = false;
        if (!atomic_load(&r->cancel) && !kv_room(s, r, k, cap, &no_slots)) {
            if (s->n_running > 0) { /* room comes back as running sequences grow no more, end or step aside */
                if (r->t_kv == 0) r->t_kv = kp_sched_now();
                waiting = true;
                break;
            }
            no_room = true; /* nothing runs and it does not fit: pins keep it out */
        }
        r->no_slots = no_slots;
        pthread_mutex_lock(&s->mu);
        s->qhead = r->next;
        if (!s->qhead) s->qtail = NULL;
        s->n_queued--;
        s->n_taking++;
        s->st.queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        r->next = NULL;
        bool admitted = lead ? crew_park(s, r, lead, cap, &crep) : admit(s, r, no_room);
        pthread_mutex_lock(&s->mu);
        s->n_taking--;
        if (admitted) {
            s->running[s->n_running++] = r; /* only this thread grows it */
            s->st.running = s->n_running;
        }
        pthread_mutex_unlock(&s->mu);
        if (admitted) {
            for (uint32_t j = 0; j < k; j++) {
                pthread_mutex_lock(&s->mu);
                kp_sreq *f = s->qhead;
                bool ours = f && f->group == r->group && f->follower;
                if (ours) {
                    s->qhead = f->next;
                    if (!s->qhead) s->qtail = NULL;
                    s->n_queued--;
                    s->n_taking++;
                    s->st.queued = s->n_queued;
                }
                pthread_mutex_unlock(&s->mu);
                if (!ours) break;
                f->next = NULL;
                bool taken = admit_follower(s, f, r);
                pthread_mutex_lock(&s->mu);
                s->n_taking--;
                if (taken) {
                    s->running[s->n_running++] = f;
                    s->st.running = s->n_running;
                }
                pthread_mutex_unlock(&s->mu);
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    uint32_t slots = s->cfg.parallel - s->n_running;
    s->st.waiting_for_kv = waiting ? (s->n_queued < slots ? s->n_queued : slots) : 0;
    pthread_mutex_unlock(&s->mu);
}

/* Sends running request r back to the queue's front to free its blocks:
 * what it computed is indexed (a resume reuses whatever is still cached),
 * its sequence released; its gen stays as it is. Engine thread. */
static void preempt(kp_sched *s, kp_sreq *r) {
    leave_group(s, r);
    uint32_t len = kp_eng_seq_len(&r->seq), n_all = kp_gen_n_tokens(r->gen);
    kp_error err;
    kp_eng_finish(s->e, &r->seq, kp_gen_tokens(r->gen), len < n_all ? len : n_all, NULL, &err);
    r->fed = 0;
    r->n_fill = n_all; /* the prompt of the resume: everything so far */
    s->dirty = true;
    pthread_mutex_lock(&r->mu);
    r->preemptions++;
    pthread_mutex_unlock(&r->mu);
    kp_sched_requeue(s, r);
    pthread_mutex_lock(&s->mu);
    s->st.preemptions++;
    pthread_mutex_unlock(&s->mu);
}

/* Engine thread: constrains r's gen to r->grammar with a spare matcher of
 * that grammar's warm slot (a finished request's, reset) or else a clone
 * of the slot's matcher (the slot made, evicting the least recently used
 * one, when the grammar is not among the kept ones), and drops r's
 * reference. */
static kp_status constrain(kp_sched *s, kp_sreq *r, kp_error *err) {
    kp_status st;
    if (!s->gv && (st = kp_gvocab_new(&s->gv, s->v, err)) != KP_OK) return st;
    int k = -1, lru = 0;
    for (int i = 0; i < SCHED_WARM; i++) {
        if (s->warm[i].g == r->grammar) k = i;
        if (s->warm[i].used < s->warm[lru].used) lru = i;
    }
    if (k < 0) {
        k = lru;
        kp_gmatch_free(s->warm[k].m);
        while (s->warm[k].n_spare > 0) kp_gmatch_free(s->warm[k].spare[--s->warm[k].n_spare]);
        kp_grammar_free(s->warm[k].g);
        s->warm[k].g = NULL;
        if ((st = kp_gmatch_new(&s->warm[k].m, r->grammar, s->gv, err)) != KP_OK) {
            s->warm[k].m = NULL;
            s->warm[k].used = 0;
            if (st == KP_EFULL) { /* the grammar's start is beyond the matcher's bounds: no 503 to retry */
                char why[KP_ERROR_MSG_MAX];
                snprintf(why, sizeof why, "%s", err ? err->msg : "");
                st = kp_fail(err, KP_EUNSUPPORTED, "the grammar cannot be followed from its start: %s", why);
            }
            return st;
        }
        s->warm[k].g = kp_grammar_ref(r->grammar);
    }
    s->warm[k].used = ++s->warm_clock;
    kp_gmatch *m = NULL;
    if (s->warm[k].n_spare > 0)
        m = s->warm[k].spare[--s->warm[k].n_spare]; /* reset when it came back */
    else if ((st = kp_gmatch_clone(&m, s->warm[k].m, err)) != KP_OK)
        return st;
    if ((st = kp_gen_constrain(r->gen, m, err)) != KP_OK) return st;
    kp_grammar_free(r->grammar);
    r->grammar = NULL;
    return KP_OK;
}

/* The prompt is computed and r->logits holds the next token's logits: the
 * gen samples, releases text and says whether the request ended. Returns
 * true when it did (r then waits in s->ended). */
static bool on_logits(kp_sched *s, kp_sreq *r) {
    double t = kp_sched_now();
    bool first = r->completion_tokens == 0;
    if (first) {
        pthread_mutex_lock(&r->mu);
        r->started = true;
        r->ttft_ms = (t - r->t_submit) * 1e3;
        pthread_mutex_unlock(&r->mu);
    }
    kp_gen_out o;
    kp_error err = {0};
    if (r->grammar) {
        kp_status cst = constrain(s, r, &err);
        if (cst != KP_OK) {
            finish(s, r, KP_FINISH_ERROR, cst, &err);
            return true;
        }
    }
    kp_status st = kp_gen_step(r->gen, r->logits, &o, &err);
    if (o.token >= 0) {
        pthread_mutex_lock(&s->mu);
        s->st.generated_tokens++;
        if (first)
            observe(t - r->t_submit, TTFT_LE, s->st.ttft_count, &s->st.ttft_n, &s->st.ttft_sum);
        else
            observe(t - r->t_last, TPOT_LE, s->st.tpot_count, &s->st.tpot_n, &s->st.tpot_sum);
        pthread_mutex_unlock(&s->mu);
        r->t_last = t;
        pthread_mutex_lock(&r->mu);
        r->completion_tokens++;
        pthread_mutex_unlock(&r->mu);
    }
    if (st != KP_OK) {
        finish(s, r, KP_FINISH_ERROR, st, &err);
        return true;
    }
    const kp_token_logprobs *lp = o.token >= 0 && o.cause != KP_GEN_EOG ? o.lp : NULL; /* EOG: not shown */
    if (o.len || o.token >= 0) emit_lp(r, o.text, o.len, o.token >= 0, lp);
    if (o.finish != KP_FINISH_NONE) {
        finish(s, r, o.finish, KP_OK, NULL);
        return true;
    }
    return false;
}

/* The first prefill of r (which asked for progress) advanced: its owner
 * is woken with the positions computed so far. Engine thread. */
static void prefill_progress(kp_sreq *r) {
    pthread_mutex_lock(&r->mu);
    r->prog_done = r->fed;
    r->prog_ms = (kp_sched_now() - r->t_admit) * 1e3;
    r->prog_new = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Removes finished requests (NULL slots) from the running table. */
static void compact(kp_sched *s) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running[i]) s->running[k++] = s->running[i];
    pthread_mutex_lock(&s->mu);
    s->n_running = k;
    s->st.running = k;
    pthread_mutex_unlock(&s->mu);
}

/* The items that found no KV block: the youngest running sequence steps
 * aside for each (preempt); one that ran alone in the step ends instead
 * (pins hold the room it needs). One whose companions all ended in the step
 * just tries again: their blocks are cache now. n_live: the sequences that
 * ran the step. Engine thread, after the step's results. */
static void make_room(kp_sched *s, uint32_t n_full, uint32_t n_live) {
    for (uint32_t k = 0; k < n_full; k++) {
        kp_sreq *r = s->full[k];
        uint32_t slot = UINT32_MAX, live = 0, young = 0;
        for (uint32_t i = 0; i < s->n_running; i++) {
            if (!s->running[i]) continue;
            live++;
            young = i;
            if (s->running[i] == r) slot = i;
        }
        if (slot == UINT32_MAX) continue; /* stepped aside for an earlier item already */
        if (live == 1) {
            if (n_live == 1) {
                finish_no_room(s, r);
                s->running[slot] = NULL;
            }
            continue;
        }
        preempt(s, s->running[young]);
        s->running[young] = NULL;
    }
}

static void step(kp_sched *s) {
    uint32_t ni = 0, budget = s->cfg.prefill_chunk, n_live = 0;
    kp_sched_crew_ready(s, &budget);
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *r = s->running[i];
        if (!r) continue; /* a follower sent back when its leader left */
        if (atomic_load(&r->cancel)) {
            finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
            s->running[i] = NULL;
            continue;
        }
        if (r->lead || r->crew) continue; /* waits for its leader's prefill, or for its crew's rows */
        n_live++;
        kp_eng_item *it = &s->items[ni];
        memset(it, 0, sizeof *it);
        it->seq = &r->seq;
        if (r->fed < r->n_fill) {
            uint32_t c = r->crew_chunk; /* given first (kp_sched_crew_ready) */
            if (c == 0) {
                if (budget == 0) continue;
                c = r->n_fill - r->fed < budget ? r->n_fill - r->fed : budget;
                c = kp_eng_chunk(s->e, &r->seq, c); /* ends at a state snapshot point (engine.h) */
                budget -= c;
            }
            it->tokens = kp_gen_tokens(r->gen) + r->fed;
            it->n = c;
            it->logits = r->fed + c == r->n_fill ? r->logits : NULL;
        } else {
            it->tokens = kp_gen_tokens(r->gen) + kp_gen_n_tokens(r->gen) - 1;
            it->n = 1;
            it->logits = r->logits;
        }
        s->item_req[ni++] = r;
    }
    if (ni == 0) return;
    kp_error err = {0};
    kp_status st = kp_eng_step(s->e, s->items, ni, &err);
    s->dirty = true;
    pthread_mutex_lock(&s->mu);
    s->st.steps++;
    pthread_mutex_unlock(&s->mu);
    uint32_t n_full = 0;
    for (uint32_t k = 0; k < ni; k++) {
        kp_sreq *r = s->item_req[k];
        kp_eng_item *it = &s->items[k];
        uint32_t slot = 0;
        while (s->running[slot] != r) slot++;
        if (st == KP_OK && it->status == KP_EFULL) { /* no block: someone steps aside, r tries again */
            s->full[n_full++] = r;
            continue;
        }
        if (st != KP_OK || it->status != KP_OK) {
            kp_status why = st != KP_OK ? st : it->status;
            if (why == KP_ERANGE && r->fed >= r->n_fill)
                finish(s, r, KP_FINISH_LENGTH, KP_OK, NULL);
            else
                finish(s, r, KP_FINISH_ERROR, why, st != KP_OK ? &err : &it->err);
            s->running[slot] = NULL;
            continue;
        }
        r->fed += it->n;
        if (atomic_load(&r->progress) && r->completion_tokens == 0 && !r->started && r->fed <= r->n_prompt)
            prefill_progress(r);
        if (it->logits && r->n_wait > 0 && r->fed == r->n_fill) fork_followers(s, r);
        if (it->logits && on_logits(s, r)) s->running[slot] = NULL;
    }
    make_room(s, n_full, n_live);
}

/* Serves the operations taken off the queue, publishes the snapshot when
 * one changed the cache, then tells their callers. Engine thread. */
static void serve_ops(kp_sched *s, sched_op *ops) {
    bool wrote = false;
    for (sched_op *o = ops; o; o = o->next) {
        o->err.msg[0] = 0;
        switch (o->kind) {
        case OP_PROBE:
            kp_eng_probe(s->e, o->tokens, o->n, o->rep);
            o->has_doc = kp_cachereport_explain(s->crep, o->tokens, o->n, o->text, o->text_len, o->rep,
                                         KP_DOCTOR_ESCAPE_JSON, o->doc, &o->err) == KP_OK;
            o->st = KP_OK;
            break;
        case OP_PIN:
            o->st = kp_eng_pin(s->e, o->tokens, o->n, o->ttl, o->now, &o->id, &o->err);
            if (o->after) kp_eng_get_stats(s->e, o->after);
            wrote |= o->st == KP_OK;
            break;
        case OP_UNPIN:
            o->st = kp_eng_unpin(s->e, o->id, &o->err);
            wrote |= o->st == KP_OK;
            break;
        case OP_PATH:
            o->st = kp_eng_node_path(s->e, o->tokens, o->n, o->path, o->path_max, &o->path_start, &o->path_end,
                                     &o->err);
            break;
        }
    }
    if (wrote) {
        s->dirty = true;
        publish(s, true);
    }
    pthread_mutex_lock(&s->mu);
    while (ops) {
        sched_op *o = ops;
        ops = o->next;
        o->done = true; /* the caller may return (and its op vanish) from here on */
    }
    pthread_cond_broadcast(&s->op_done);
    pthread_mutex_unlock(&s->mu);
}

static void *loop(void *arg) {
    kp_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->n_running == 0 && !s->qhead && !s->ops) pthread_cond_wait(&s->work, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        sched_op *ops = s->ops;
        s->ops = s->ops_tail = NULL;
        /* cancelled requests leave the queue at once, wherever they wait */
        kp_sreq *gone = NULL, **pp = &s->qhead;
        s->qtail = NULL;
        while (*pp) {
            kp_sreq *r = *pp;
            if (atomic_load(&r->cancel)) {
                *pp = r->next;
                r->next = gone;
                gone = r;
                s->n_queued--;
            } else {
                s->qtail = r;
                pp = &r->next;
            }
        }
        s->st.queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        if (ops) serve_ops(s, ops);
        while (gone) {
            kp_sreq *r = gone;
            gone = r->next;
            r->next = NULL;
            finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
        }
        admit_queued(s);
        double t = kp_sched_now();
        if (t - s->last_expire > 1.0) {
            if (kp_eng_expire(s->e, (int64_t)time(NULL)) > 0) s->dirty = true;
            s->last_expire = t;
        }
        step(s);
        /* the snapshot first, then the table and the owners: whoever sees a
         * request end or the engine idle finds the cache it left */
        bool idle = true;
        for (uint32_t i = 0; i < s->n_running; i++) idle &= s->running[i] == NULL;
        publish(s, s->ended != NULL || idle);
        compact(s);
        deliver(s);
    }
    /* shutting down: everything still here is cancelled, waiting operations fail */
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running[i]) finish(s, s->running[i], KP_FINISH_CANCELLED, KP_OK, NULL);
    s->n_running = 0;
    pthread_mutex_lock(&s->mu);
    kp_sreq *q = s->qhead;
    s->qhead = s->qtail = NULL;
    s->n_queued = 0;
    s->st.running = 0;
    s->st.queued = 0;
    sched_op *ops = s->ops;
    s->ops = s->ops_tail = NULL;
    for (sched_op *o = ops; o; o = o->next) {
        o->st = kp_fail(&o->err, KP_EFULL, "the server is shutting down");
    }
    while (ops) {
        sched_op *o = ops;
        ops = o->next;
        o->done = true;
    }
    pthread_cond_broadcast(&s->op_done);
    pthread_mutex_unlock(&s->mu);
    while (q) {
        kp_sreq *r = q;
        q = r->next;
        finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
    }
    publish(s, true);
    deliver(s);
    return NULL;
}

kp_status kp_sched_new(kp_sched **out, kp_engine *e, const kp_tok_vocab *v, const kp_sched_config *cfg,
                       kp_error *err) {
    *out = NULL;
    if (!cfg || cfg->parallel == 0 || cfg->prefill_chunk == 0)
        return kp_fail(err, KP_EINVAL, "the scheduler needs parallel >= 1 and prefill_chunk >= 1");
    kp_sched *s = calloc(1, sizeof *s);
    if (!s) return kp_fail(err, KP_ENOMEM, "out of memory for the scheduler");
    s->e = e;
    s->v = v;
    s->cfg = *cfg;
    s->n_vocab = (uint32_t)kp_tok_n_vocab(v);
    s->max_pos = kp_eng_max_pos(e);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->snap_mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->op_done, NULL);
    memcpy(s->st.ttft_le, TTFT_LE, sizeof TTFT_LE);
    memcpy(s->st.tpot_le, TPOT_LE, sizeof TPOT_LE);
    memcpy(s->st.kvwait_le, TTFT_LE, sizeof TTFT_LE);
    kp_eng_stats k;
    kp_eng_get_stats(e, &k);
    uint64_t kv_pos = k.budget_bytes / k.block_bytes * k.block_size;
    s->kv_budget = k.budget_bytes;
    s->kv_per_token = k.bytes_per_token;
    if (k.window_budget_bytes) { /* the blocks hold the full layers' rows; the window's are apart */
        s->kv_budget = k.budget_bytes - k.window_budget_bytes;
        s->kv_per_token = k.full_bytes_per_token;
        kv_pos = s->kv_budget / (k.full_bytes_per_token * k.block_size) * k.block_size;
    }
    s->kv_positions = kv_pos > UINT32_MAX ? UINT32_MAX : (uint32_t)kv_pos;
    s->running = calloc(cfg->parallel, sizeof *s->running);
    s->full = calloc(cfg->parallel, sizeof *s->full);
    s->items = calloc(cfg->parallel, sizeof *s->items);
    s->item_req = calloc(cfg->parallel, sizeof *s->item_req);
    kp_status st = KP_ENOMEM;
    if (!s->running || !s->items || !s->item_req || !s->full) {
        kp_fail(err, KP_ENOMEM, "out of memory for the scheduler");
        goto fail;
    }
    if ((st = kp_cachereport_new(&s->crep, v, 256, 4u << 20, err)) != KP_OK) goto fail;
    s->dirty = true;
    publish(s, true); /* the first snapshot, before the thread owns the engine */
    if (pthread_create(&s->thread, NULL, loop, s) != 0) {
        st = kp_fail(err, KP_EIO, "cannot start the engine thread");
        goto fail;
    }
    s->started_thread = true;
    *out = s;
    return KP_OK;
fail:
    kp_sched_free(s);
    return st;
}

void kp_sched_free(kp_sched *s) {
    if (!s) return;
    if (s->started_thread) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    kp_cachereport_free(s->crep);
    for (int i = 0; i < SCHED_WARM; i++) {
        kp_gmatch_free(s->warm[i].m);
        while (s->warm[i].n_spare > 0) kp_gmatch_free(s->warm[i].spare[--s->warm[i].n_spare]);
        kp_grammar_free(s->warm[i].g);
    }
    kp_gvocab_free(s->gv);
    free(s->running);
    free(s->items);
    free(s->item_req);
    free(s->full);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->snap_mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->op_done);
    free(s);
}
