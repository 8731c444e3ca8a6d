/*
 * scheduler.c - the engine thread and its requests (scheduler.h).
 *
 * Owns: the thread, the queue (FIFO of kp_sreq under `mu`), the queue of
 * cache operations (under `mu`), the running table (engine thread only),
 * the report history (kp_crep, engine thread only), the cache snapshot
 * (under `snap_mu`) and the stats. Borrows the engine and the vocabulary;
 * only the engine thread calls the engine.
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
 *   (cache/gen.h) samples, applies stop strings, end-of-generation,
 *   max_tokens and the context end, and releases the text.
 *
 * One iteration of the engine thread:
 *
 *   take the queued operations, unlink cancelled queued requests (mu)
 *   serve the operations: probe (kp_eng_probe + kp_crep_explain), pin,
 *     unpin; publish the snapshot if one changed the cache; callers go on
 *   admit from the queue's head while a slot is free and the KV rule
 *     below holds (kp_eng_begin, cache report); expire pins (every second)
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
 *            use every unpinned block. Strictly FIFO: nothing behind a head
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

#include "base/buf.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kp_sreq {
    /* set at submit, then owned by the engine thread */
    int32_t *all;
    kp_gen *gen;  /* prompt + generated tokens, sampler, text, limits */
    uint32_t n_prompt, n_fill, fed;
    bool admitted;       /* admitted once: the report and usage are those of that prefill */
    double t_kv;         /* when it began waiting at the queue's head for KV blocks; 0: not */
    char *text; /* the prompt text, for the report; NULL: none */
    size_t text_len;
    kp_eng_seq seq;
    float *logits;
    double t_submit, t_admit, t_last;
    kp_sreq *next;       /* the queue, then the list of requests that ended this iteration */
    kp_finish why;       /* how it ended, told to the owner once the snapshot is out */
    kp_status why_status;
    kp_error why_err;
    /* shared */
    atomic_bool cancel;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* output, under mu */
    kp_buf out;
    uint32_t new_tokens, completion_tokens;
    bool started, started_seen, finish_seen;
    kp_finish finish;
    kp_status status;
    kp_error err;
    kp_eng_report report;
    kp_doctor_report doctor;
    bool has_doctor;
    double queue_ms, ttft_ms;
    uint32_t preemptions;
};

typedef enum { OP_PROBE, OP_PIN, OP_UNPIN } op_kind;

/* A cache operation: on the caller's stack, queued under mu, served by the
 * engine thread, which sets done (under mu) last and never touches it
 * after that. */
typedef struct sched_op {
    op_kind kind;
    const int32_t *tokens;
    uint32_t n;
    const char *text;
    size_t text_len;
    int64_t ttl, now;
    uint64_t id;            /* unpin: in; pin: out */
    kp_eng_report *rep;     /* probe */
    kp_doctor_report *doc;
    bool has_doc;
    kp_eng_stats *after;    /* pin, may be NULL */
    kp_status st;
    kp_error err;
    bool done;
    struct sched_op *next;
} sched_op;

struct kp_sched {
    kp_engine *e;
    const kp_tok_vocab *v;
    kp_sched_config cfg;
    uint32_t n_vocab, max_pos;
    pthread_t thread;
    bool started_thread;
    pthread_mutex_t mu;      /* queue, operations, counters, stats */
    pthread_mutex_t snap_mu; /* snap */
    pthread_cond_t work;     /* the engine thread waits for requests or operations */
    pthread_cond_t op_done;  /* callers wait for their operation */
    bool stop;
    kp_sreq *qhead, *qtail;
    sched_op *ops, *ops_tail;
    uint32_t n_queued, n_running;
    kp_sreq **running;    /* [parallel], engine thread */
    kp_eng_item *items;   /* [parallel] */
    kp_sreq **item_req;
    kp_sreq *ended;       /* requests that ended this iteration, engine thread */
    kp_sreq **full;       /* [parallel]: step items that found no KV block, engine thread */
    uint32_t kv_positions; /* the budget's blocks x block size */
    uint64_t kv_budget, kv_per_token;
    kp_crep *crep;        /* engine thread */
    kp_sched_stats st;    /* under mu */
    kp_sched_cache snap;  /* under snap_mu */
    bool dirty;           /* the engine changed since the last snapshot (engine thread) */
    double last_expire, last_publish;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const double TTFT_LE[KP_SCHED_HIST_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double TPOT_LE[KP_SCHED_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
                                                      0.08,  0.15,   0.3,   0.6,  1.2,  2.5};

static void observe(double v, const double *le, uint64_t *count, uint64_t *n, double *sum) {
    for (int i = 0; i < KP_SCHED_HIST_BUCKETS; i++)
        if (v <= le[i]) count[i]++;
    (*n)++;
    *sum += v;
}

/* ---- requests ---------------------------------------------------------- */

static void sreq_free(kp_sreq *r) {
    kp_gen_free(r->gen);
    free(r->text);
    free(r->logits);
    kp_buf_free(&r->out);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static void sreq_unref(kp_sreq *r) {
    if (atomic_fetch_sub(&r->refs, 1) == 1) sreq_free(r);
}

void kp_sreq_cancel(kp_sreq *r) {
    if (r) atomic_store(&r->cancel, true);
}

void kp_sreq_release(kp_sreq *r) {
    if (!r) return;
    kp_sreq_cancel(r);
    sreq_unref(r);
}

bool kp_sreq_wait(kp_sreq *r, int timeout_ms, kp_sreq_update *u) {
    memset(u, 0, sizeof *u);
    pthread_mutex_lock(&r->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    }
    for (;;) {
        bool news = r->out.len > 0 || r->new_tokens > 0 || (r->started && !r->started_seen) ||
                    (r->finish != KP_FINISH_NONE && !r->finish_seen);
        if (news || timeout_ms == 0) break;
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0)
            break;
    }
    bool changed = r->out.len > 0 || r->new_tokens > 0 || (r->started && !r->started_seen) ||
                   (r->finish != KP_FINISH_NONE && !r->finish_seen);
    if (r->out.len > 0) {
        u->text = r->out.data; /* ownership moves to the caller */
        u->len = r->out.len;
        memset(&r->out, 0, sizeof r->out);
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

/* Appends released text (engine thread). */
static void emit(kp_sreq *r, const char *text, size_t n, bool token) {
    pthread_mutex_lock(&r->mu);
    if (n > 0 && !kp_buf_put(&r->out, text, n)) r->out.oom = false; /* out of memory: this text is lost */
    if (token) r->new_tokens++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
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

kp_status kp_sched_submit(kp_sched *s, const kp_sreq_params *p, kp_sreq **out, kp_error *err) {
    *out = NULL;
    uint32_t max_tokens = p->max_tokens;
    if (p->n_prompt <= s->max_pos) { /* longer: kp_gen_new says so */
        kp_status st = kp_sched_fit(s, p->n_prompt, p->max_tokens, p->max_tokens_set, &max_tokens, err);
        if (st != KP_OK) return st;
    }
    kp_sreq *r = calloc(1, sizeof *r);
    if (!r) return kp_fail(err, KP_ENOMEM, "out of memory for a request");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancel, false);
    atomic_init(&r->refs, 2);
    /* checks the prompt (empty, longer than the context, ids) and the sampling parameters */
    kp_gen_params gp = {p->sp, max_tokens, s->max_pos, (int32_t)s->n_vocab, p->ignore_eos, p->stops, p->n_stops,
                        false};
    kp_status st = kp_gen_new(&r->gen, s->v, p->prompt, p->n_prompt, &gp, err);
    if (st != KP_OK) {
        sreq_free(r);
        return st;
    }
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
    r->n_prompt = r->n_fill = p->n_prompt;
    r->t_submit = now_s();
    pthread_mutex_lock(&s->mu);
    if (s->stop || s->n_queued >= s->cfg.queue_max) {
        bool stopping = s->stop;
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
        return stopping ? kp_fail(err, KP_EFULL, "the server is shutting down")
                        : kp_fail(err, KP_EFULL, "%u requests are already waiting; try again shortly",
                                  s->cfg.queue_max);
    }
    if (s->qtail)
        s->qtail->next = r;
    else
        s->qhead = r;
    s->qtail = r;
    s->n_queued++;
    s->st.queued = s->n_queued;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return KP_OK;
}

/* ---- the engine thread --------------------------------------------------- */

/* Publishes what the cache holds for kp_sched_cache_get and the metrics:
 * the memory bill, the top prefixes and the first nodes of the tree,
 * O(pool blocks + index nodes),
 * computed without a lock and copied under the snapshot mutex. Only when
 * the engine changed: always when `now_` (a request ended, a pin changed,
 * the engine goes idle), else at most every 50 ms. */
static void publish(kp_sched *s, bool now_) {
    double t = now_s();
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

/* Ends a request on the engine side: indexes what it computed, releases
 * its sequence, counts it; the owner hears of it in deliver(), after the
 * snapshot shows the cache it left. Engine thread. */
static void finish(kp_sched *s, kp_sreq *r, kp_finish why, kp_status status, const kp_error *err) {
    kp_gen_out o; /* ended from here (not by the gen): LENGTH releases held-back text */
    kp_gen_stop(r->gen, why, &o);
    if (o.len) emit(r, o.text, o.len, false);
    uint32_t len = kp_eng_seq_len(&r->seq), n_all = kp_gen_n_tokens(r->gen);
    if (len > 0) {
        kp_error e2;
        uint32_t n = len < n_all ? len : n_all;
        kp_eng_finish(s->e, &r->seq, kp_gen_tokens(r->gen), n, NULL, &e2);
        kp_crep_add(s->crep, kp_gen_tokens(r->gen), n, &e2);
    } else {
        kp_eng_seq_abort(s->e, &r->seq);
    }
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
        sreq_unref(r);
    }
}

/* Ends r with finish LENGTH and a note: the KV budget has no room for it
 * even alone, because pinned prefixes hold the rest. Engine thread. */
static void finish_no_room(kp_sched *s, kp_sreq *r) {
    kp_eng_stats k;
    kp_eng_get_stats(s->e, &k);
    kp_error note = {0};
    kp_fail(&note, KP_EFULL,
            "the KV budget has no room for this sequence at %u positions even with nothing else running: pinned "
            "prefixes hold %llu of its %llu bytes (unpin some, or raise the KV budget)",
            kp_gen_n_tokens(r->gen), (unsigned long long)k.pinned_bytes, (unsigned long long)k.budget_bytes);
    note.code = KP_OK;
    finish(s, r, KP_FINISH_LENGTH, KP_OK, &note);
}

/* Whether the queue's head r may be admitted now: the KV rule of the top
 * comment. Engine thread. */
static bool kv_room(kp_sched *s, kp_sreq *r) {
    uint64_t pending = s->n_running; /* a block per running sequence */
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *q = s->running[i];
        if (q->fed < q->n_fill) pending += kp_eng_seq_blocks_missing(s->e, &q->seq, q->n_fill);
    }
    kp_eng_room room;
    kp_error err;
    if (kp_eng_room_for(s->e, kp_gen_tokens(r->gen), r->n_fill, s->n_running > 0, &room, &err) != KP_OK)
        return true; /* out of memory for the count: admit; a step that finds no block preempts */
    return room.need_blocks + pending <= (uint64_t)room.free_blocks + room.evictable_blocks;
}

/* Takes a request off the queue into the running table (false: it ended
 * instead: cancelled, no room even alone, or an error). no_room: it does
 * not fit even with nothing running. */
static bool admit(kp_sched *s, kp_sreq *r, bool no_room) {
    r->t_admit = now_s();
    if (r->t_kv > 0) {
        pthread_mutex_lock(&s->mu);
        observe(r->t_admit - r->t_kv, s->st.kvwait_le, s->st.kvwait_count, &s->st.kvwait_n, &s->st.kvwait_sum);
        pthread_mutex_unlock(&s->mu);
        r->t_kv = 0;
    }
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
    kp_status st = kp_eng_begin(s->e, tokens, r->n_fill, &r->seq, &rep, &err);
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
    bool has = kp_crep_explain(s->crep, tokens, r->n_prompt, r->text, r->text_len, &rep, KP_DOCTOR_ESCAPE_JSON, &d, &err) == KP_OK;
    pthread_mutex_lock(&r->mu);
    r->report = rep;
    if (has) r->doctor = d;
    r->has_doctor = has;
    r->queue_ms = (r->t_admit - r->t_submit) * 1e3;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    s->st.requests_started++;
    s->st.prompt_tokens += r->n_prompt;
    s->st.cached_tokens += rep.reused_tokens;
    pthread_mutex_unlock(&s->mu);
    return true;
}

/* Admits from the queue's head while a sequence slot is free and the KV
 * rule holds (FIFO: a head that must wait holds back everything behind
 * it). Engine thread. */
static void admit_queued(kp_sched *s) {
    bool waiting = false;
    while (s->n_running < s->cfg.parallel) {
        pthread_mutex_lock(&s->mu);
        kp_sreq *r = s->qhead; /* only this thread unlinks the head: it stays ours */
        pthread_mutex_unlock(&s->mu);
        if (!r) break;
        bool no_room = false;
        if (!atomic_load(&r->cancel) && !kv_room(s, r)) {
            if (s->n_running > 0) { /* room comes back as running sequences grow no more, end or step aside */
                if (r->t_kv == 0) r->t_kv = now_s();
                waiting = true;
                break;
            }
            no_room = true; /* nothing runs and it does not fit: pins keep it out */
        }
        pthread_mutex_lock(&s->mu);
        s->qhead = r->next;
        if (!s->qhead) s->qtail = NULL;
        s->n_queued--;
        s->st.queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        r->next = NULL;
        if (admit(s, r, no_room)) {
            pthread_mutex_lock(&s->mu);
            s->running[s->n_running++] = r; /* only this thread grows it */
            s->st.running = s->n_running;
            pthread_mutex_unlock(&s->mu);
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
    uint32_t len = kp_eng_seq_len(&r->seq), n_all = kp_gen_n_tokens(r->gen);
    kp_error err;
    kp_eng_finish(s->e, &r->seq, kp_gen_tokens(r->gen), len < n_all ? len : n_all, NULL, &err);
    r->fed = 0;
    r->n_fill = n_all; /* the prompt of the resume: everything so far */
    s->dirty = true;
    pthread_mutex_lock(&r->mu);
    r->preemptions++;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    r->next = s->qhead;
    s->qhead = r;
    if (!s->qtail) s->qtail = r;
    s->n_queued++;
    s->st.queued = s->n_queued;
    s->st.preemptions++;
    pthread_mutex_unlock(&s->mu);
}

/* The prompt is computed and r->logits holds the next token's logits: the
 * gen samples, releases text and says whether the request ended. Returns
 * true when it did (r then waits in s->ended). */
static bool on_logits(kp_sched *s, kp_sreq *r) {
    double t = now_s();
    bool first = r->completion_tokens == 0;
    if (first) {
        pthread_mutex_lock(&r->mu);
        r->started = true;
        r->ttft_ms = (t - r->t_submit) * 1e3;
        pthread_mutex_unlock(&r->mu);
    }
    kp_gen_out o;
    kp_error err = {0};
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
    if (o.len || o.token >= 0) emit(r, o.text, o.len, o.token >= 0);
    if (o.finish != KP_FINISH_NONE) {
        finish(s, r, o.finish, KP_OK, NULL);
        return true;
    }
    return false;
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
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *r = s->running[i];
        if (atomic_load(&r->cancel)) {
            finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
            s->running[i] = NULL;
            continue;
        }
        n_live++;
        kp_eng_item *it = &s->items[ni];
        memset(it, 0, sizeof *it);
        it->seq = &r->seq;
        if (r->fed < r->n_fill) {
            if (budget == 0) continue;
            uint32_t c = r->n_fill - r->fed < budget ? r->n_fill - r->fed : budget;
            budget -= c;
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
            o->has_doc = kp_crep_explain(s->crep, o->tokens, o->n, o->text, o->text_len, o->rep,
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
        double t = now_s();
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
    for (uint32_t i = 0; i < s->n_running; i++) finish(s, s->running[i], KP_FINISH_CANCELLED, KP_OK, NULL);
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
    s->kv_positions = kv_pos > UINT32_MAX ? UINT32_MAX : (uint32_t)kv_pos;
    s->kv_budget = k.budget_bytes;
    s->kv_per_token = k.bytes_per_token;
    s->running = calloc(cfg->parallel, sizeof *s->running);
    s->full = calloc(cfg->parallel, sizeof *s->full);
    s->items = calloc(cfg->parallel, sizeof *s->items);
    s->item_req = calloc(cfg->parallel, sizeof *s->item_req);
    kp_status st = KP_ENOMEM;
    if (!s->running || !s->items || !s->item_req || !s->full) {
        kp_fail(err, KP_ENOMEM, "out of memory for the scheduler");
        goto fail;
    }
    if ((st = kp_crep_new(&s->crep, v, 256, 4u << 20, err)) != KP_OK) goto fail;
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
    kp_crep_free(s->crep);
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

uint32_t kp_sched_max_pos(const kp_sched *s) { return s->max_pos; }

void kp_sched_stats_get(kp_sched *s, kp_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_queued;
    out->running = s->n_running;
    pthread_mutex_unlock(&s->mu);
}
