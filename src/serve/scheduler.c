/*
 * scheduler.c - the engine thread and its requests (scheduler.h).
 *
 * Owns: the thread, the queue (FIFO of kp_sreq under `mu`), the running
 * table (engine thread only), the report history (kp_crep) and the stats.
 * Borrows the engine and the vocabulary.
 *
 * A request's life and who may touch what:
 *
 *   submit --queued--> admitted --prefilling--> generating --> finished
 *   (caller)  (mu)     (engine thread only: seq, all[], fed, sampler)
 *
 *   all[]  | prompt 0..n_prompt-1 | generated tokens ...      | n_all
 *   fed    = positions the sequence holds (K/V computed)
 *   prefilling while fed < n_prompt; generating: fed == n_all - 1, the
 *   newest sampled token all[n_all-1] is the next decode input.
 *
 * Output fields of a request (text, usage, report, finish) are written by
 * the engine thread and read by the owner, both under the request's own
 * mutex; `cancel` is an atomic flag. A request has two references (owner,
 * scheduler); the last release frees it.
 *
 * Locks: `mu` (queue, counters, stats) and `eng_mu` (the engine: held by the
 * thread for a whole admit+step, or by kp_sched_lock). A request's `mu` is
 * taken last and never held while taking another lock.
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
    uint32_t n_prompt, n_all, cap, max_tokens, fed;
    bool ignore_eos;
    char *text; /* the prompt text, for the report; NULL: none */
    size_t text_len;
    kp_sampler *smp;
    kp_textout *to;
    kp_eng_seq seq;
    float *logits;
    double t_submit, t_admit, t_last;
    kp_sreq *next;
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
};

struct kp_sched {
    kp_engine *e;
    const kp_tok_vocab *v;
    kp_sched_config cfg;
    uint32_t n_vocab, max_pos;
    pthread_t thread;
    bool started_thread;
    pthread_mutex_t mu, eng_mu;
    pthread_cond_t work;
    bool stop;
    kp_sreq *qhead, *qtail;
    uint32_t n_queued, n_running;
    kp_sreq **running; /* [parallel], engine thread */
    kp_eng_item *items;   /* [parallel] */
    kp_sreq **item_req;
    kp_crep *crep;
    kp_sched_stats st; /* under mu */
    double last_expire, last_stats;
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
    kp_sampler_free(r->smp);
    kp_textout_free(r->to);
    free(r->all);
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
    u->ids = r->all; /* entries below n_prompt + completion_tokens are final */
    u->report = r->report;
    u->doctor = r->doctor;
    u->has_doctor = r->has_doctor;
    u->queue_ms = r->queue_ms;
    u->ttft_ms = r->ttft_ms;
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

kp_status kp_sched_submit(kp_sched *s, const kp_sreq_params *p, kp_sreq **out, kp_error *err) {
    *out = NULL;
    if (!p->prompt || p->n_prompt == 0) return kp_fail(err, KP_EINVAL, "the prompt is empty");
    if (p->n_prompt > s->max_pos)
        return kp_fail(err, KP_ERANGE, "the prompt has %u tokens, more than the context of %u tokens", p->n_prompt,
                       s->max_pos);
    for (uint32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= s->n_vocab)
            return kp_fail(err, KP_EINVAL, "prompt token %u is %d, outside the vocabulary of %u", i, p->prompt[i],
                           s->n_vocab);
    kp_status st = kp_sampler_check(&p->sp, err);
    if (st != KP_OK) return st;
    kp_sreq *r = calloc(1, sizeof *r);
    if (!r) return kp_fail(err, KP_ENOMEM, "out of memory for a request");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancel, false);
    atomic_init(&r->refs, 2);
    uint64_t want = (uint64_t)p->n_prompt + p->max_tokens + 1;
    r->cap = want < s->max_pos + 1ull ? (uint32_t)want : s->max_pos + 1;
    r->all = malloc((size_t)r->cap * sizeof *r->all);
    r->logits = malloc((size_t)s->n_vocab * sizeof *r->logits);
    if (!r->all || !r->logits) {
        sreq_free(r);
        return kp_fail(err, KP_ENOMEM, "out of memory for a request of %u tokens", r->cap);
    }
    memcpy(r->all, p->prompt, (size_t)p->n_prompt * sizeof *r->all);
    if (p->text) {
        if (!(r->text = malloc(p->text_len + 1))) {
            sreq_free(r);
            return kp_fail(err, KP_ENOMEM, "out of memory for a request");
        }
        memcpy(r->text, p->text, p->text_len);
        r->text[p->text_len] = 0;
        r->text_len = p->text_len;
    }
    r->n_prompt = r->n_all = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    bool strip = p->n_prompt == 1 && p->prompt[0] == kp_tok_bos(s->v) && kp_tok_add_space_prefix(s->v);
    if ((st = kp_sampler_new(&r->smp, &p->sp, (int32_t)s->n_vocab, err)) != KP_OK ||
        (st = kp_textout_new(&r->to, s->v, p->stops, p->n_stops, false, strip, err)) != KP_OK) {
        sreq_free(r);
        return st;
    }
    for (uint32_t i = 0; i < p->n_prompt; i++) kp_sampler_accept(r->smp, p->prompt[i]);
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

/* Ends a request: indexes what it computed, releases its sequence, tells
 * the owner. Engine thread, under eng_mu. */
static void finish(kp_sched *s, kp_sreq *r, kp_finish why, kp_status status, const kp_error *err) {
    if (why == KP_FINISH_LENGTH || why == KP_FINISH_STOP) { /* release held-back text (none after a stop string) */
        const char *t;
        size_t n;
        kp_textout_finish(r->to, &t, &n);
        if (n) emit(r, t, n, false);
    }
    uint32_t len = kp_eng_seq_len(&r->seq);
    if (len > 0) {
        kp_error e2;
        uint32_t n = len < r->n_all ? len : r->n_all;
        kp_eng_finish(s->e, &r->seq, r->all, n, NULL, &e2);
        kp_crep_add(s->crep, r->all, n, &e2);
    } else {
        kp_eng_seq_abort(s->e, &r->seq);
    }
    pthread_mutex_lock(&s->mu);
    s->st.requests_finished++;
    if (why == KP_FINISH_CANCELLED) s->st.requests_cancelled++;
    if (why == KP_FINISH_ERROR) s->st.requests_failed++;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&r->mu);
    r->finish = why;
    r->status = status;
    if (err) r->err = *err;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    sreq_unref(r);
}

/* Takes a queued request into the running table. */
static bool admit(kp_sched *s, kp_sreq *r) {
    r->t_admit = now_s();
    if (atomic_load(&r->cancel)) {
        finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
        return false;
    }
    kp_error err = {0};
    kp_eng_report rep;
    kp_status st = kp_eng_begin(s->e, r->all, r->n_prompt, &r->seq, &rep, &err);
    if (st != KP_OK) {
        finish(s, r, KP_FINISH_ERROR, st, &err);
        return false;
    }
    r->fed = rep.reused_tokens;
    kp_doctor_report d;
    bool has = kp_crep_explain(s->crep, r->all, r->n_prompt, r->text, r->text_len, &rep, KP_DOCTOR_ESCAPE_JSON, &d, &err) == KP_OK;
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

/* The prompt is computed and r->logits holds the next token's logits.
 * Returns true when the request finished (r may be freed then). */
static bool on_logits(kp_sched *s, kp_sreq *r) {
    double t = now_s();
    bool first = r->completion_tokens == 0;
    if (first) {
        pthread_mutex_lock(&r->mu);
        r->started = true;
        r->ttft_ms = (t - r->t_submit) * 1e3;
        pthread_mutex_unlock(&r->mu);
    }
    if (r->max_tokens == 0) {
        finish(s, r, KP_FINISH_LENGTH, KP_OK, NULL);
        return true;
    }
    int32_t tok = kp_sampler_sample(r->smp, r->logits);
    kp_sampler_accept(r->smp, tok);
    r->all[r->n_all++] = tok;
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
    if (kp_tok_is_eog(s->v, tok) && !r->ignore_eos) {
        emit(r, NULL, 0, true);
        finish(s, r, KP_FINISH_STOP, KP_OK, NULL);
        return true;
    }
    const char *text;
    size_t n;
    bool stopped = false;
    kp_error err = {0};
    if (kp_textout_push(r->to, tok, &text, &n, &stopped, &err) != KP_OK) {
        finish(s, r, KP_FINISH_ERROR, KP_ENOMEM, &err);
        return true;
    }
    emit(r, text, n, true);
    if (stopped) {
        finish(s, r, KP_FINISH_STOP, KP_OK, NULL);
        return true;
    }
    if (r->completion_tokens >= r->max_tokens || r->n_all > s->max_pos || r->n_all >= r->cap) {
        finish(s, r, KP_FINISH_LENGTH, KP_OK, NULL);
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

static void step(kp_sched *s) {
    uint32_t ni = 0, budget = s->cfg.prefill_chunk;
    for (uint32_t i = 0; i < s->n_running; i++) {
        kp_sreq *r = s->running[i];
        if (atomic_load(&r->cancel)) {
            finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
            s->running[i] = NULL;
            continue;
        }
        kp_eng_item *it = &s->items[ni];
        memset(it, 0, sizeof *it);
        it->seq = &r->seq;
        if (r->fed < r->n_prompt) {
            if (budget == 0) continue;
            uint32_t c = r->n_prompt - r->fed < budget ? r->n_prompt - r->fed : budget;
            budget -= c;
            it->tokens = r->all + r->fed;
            it->n = c;
            it->logits = r->fed + c == r->n_prompt ? r->logits : NULL;
        } else {
            it->tokens = &r->all[r->n_all - 1];
            it->n = 1;
            it->logits = r->logits;
        }
        s->item_req[ni++] = r;
    }
    if (ni > 0) {
        kp_error err = {0};
        kp_status st = kp_eng_step(s->e, s->items, ni, &err);
        pthread_mutex_lock(&s->mu);
        s->st.steps++;
        pthread_mutex_unlock(&s->mu);
        for (uint32_t k = 0; k < ni; k++) {
            kp_sreq *r = s->item_req[k];
            kp_eng_item *it = &s->items[k];
            uint32_t slot = 0;
            while (s->running[slot] != r) slot++;
            if (st != KP_OK || it->status != KP_OK) {
                kp_status why = st != KP_OK ? st : it->status;
                if (why == KP_ERANGE && r->fed >= r->n_prompt)
                    finish(s, r, KP_FINISH_LENGTH, KP_OK, NULL);
                else
                    finish(s, r, KP_FINISH_ERROR, why, st != KP_OK ? &err : &it->err);
                s->running[slot] = NULL;
                continue;
            }
            r->fed += it->n;
            if (it->logits && on_logits(s, r)) s->running[slot] = NULL;
        }
    }
    compact(s);
}

static void *loop(void *arg) {
    kp_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->n_running == 0 && !s->qhead) pthread_cond_wait(&s->work, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        kp_sreq *adm = NULL, **tail = &adm;
        uint32_t n_adm = 0;
        while (s->n_running + n_adm < s->cfg.parallel && s->qhead) {
            kp_sreq *r = s->qhead;
            s->qhead = r->next;
            if (!s->qhead) s->qtail = NULL;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
            n_adm++;
            s->n_queued--;
        }
        s->st.queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->eng_mu);
        while (adm) {
            kp_sreq *r = adm;
            adm = r->next;
            r->next = NULL;
            if (admit(s, r)) s->running[s->n_running++] = r; /* only this thread grows it */
        }
        double t = now_s();
        if (t - s->last_expire > 1.0) {
            kp_eng_expire(s->e, (int64_t)time(NULL));
            s->last_expire = t;
        }
        step(s);
        /* the memory bill for metrics: O(blocks + nodes), so at most every 100 ms
         * and when the engine goes idle, not after every step */
        bool idle = s->n_running == 0;
        if (idle || now_s() - s->last_stats >= 0.1) {
            kp_eng_stats kv;
            kp_eng_get_stats(s->e, &kv);
            s->last_stats = now_s();
            pthread_mutex_unlock(&s->eng_mu);
            pthread_mutex_lock(&s->mu);
            s->st.kv = kv;
            pthread_mutex_unlock(&s->mu);
        } else {
            pthread_mutex_unlock(&s->eng_mu);
        }
    }
    /* shutting down: everything still here is cancelled */
    pthread_mutex_lock(&s->eng_mu);
    for (uint32_t i = 0; i < s->n_running; i++) finish(s, s->running[i], KP_FINISH_CANCELLED, KP_OK, NULL);
    s->n_running = 0;
    pthread_mutex_lock(&s->mu);
    kp_sreq *q = s->qhead;
    s->qhead = s->qtail = NULL;
    s->n_queued = 0;
    pthread_mutex_unlock(&s->mu);
    while (q) {
        kp_sreq *r = q;
        q = r->next;
        finish(s, r, KP_FINISH_CANCELLED, KP_OK, NULL);
    }
    pthread_mutex_unlock(&s->eng_mu);
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
    pthread_mutex_init(&s->eng_mu, NULL);
    pthread_cond_init(&s->work, NULL);
    memcpy(s->st.ttft_le, TTFT_LE, sizeof TTFT_LE);
    memcpy(s->st.tpot_le, TPOT_LE, sizeof TPOT_LE);
    s->running = calloc(cfg->parallel, sizeof *s->running);
    s->items = calloc(cfg->parallel, sizeof *s->items);
    s->item_req = calloc(cfg->parallel, sizeof *s->item_req);
    kp_status st = KP_ENOMEM;
    if (!s->running || !s->items || !s->item_req) {
        kp_fail(err, KP_ENOMEM, "out of memory for the scheduler");
        goto fail;
    }
    if ((st = kp_crep_new(&s->crep, v, 256, 4u << 20, err)) != KP_OK) goto fail;
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
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->eng_mu);
    pthread_cond_destroy(&s->work);
    free(s);
}

kp_engine *kp_sched_lock(kp_sched *s, kp_crep **crep) {
    pthread_mutex_lock(&s->eng_mu);
    if (crep) *crep = s->crep;
    return s->e;
}

void kp_sched_unlock(kp_sched *s) { pthread_mutex_unlock(&s->eng_mu); }

void kp_sched_stats_get(kp_sched *s, kp_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_queued;
    out->running = s->n_running;
    pthread_mutex_unlock(&s->mu);
}
