/*
 * test_scheduler.c - continuous batching gives every request the output it
 * gets alone.
 *
 * Reference: each request run by itself on an engine without the prefix
 * cache (kp_eng_prefill + kp_eng_decode, greedy, kp_textout for stop strings).
 * The scheduler runs them all at once (parallel 4, a small prefill chunk
 * so prompts are split across steps that also decode), with prompts that
 * share heads, repeat, and extend earlier ones; text, finish reason and
 * token counts must match the reference, and cached_tokens must be what the
 * prefix index held. Also: cancellation, a full queue, prefill-only
 * requests, prompts longer than the context, and no block leaked. Cache
 * operations (probe, pin, unpin) from another thread while four sequences
 * decode are each answered before the engine completes two more steps
 * (kp_sched_stats' step counter), with what kp_eng_* answer (a full hit, the
 * pin in the snapshot at once, gone after unpin). Choices
 * (kp_sched_submit_n): choice i equals the request with seed + i alone
 * (text, tokens, logprobs), the prompt is computed once (the stats), n
 * above parallel is refused, cancelling every choice ends them, no leak.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "serve/scheduler.h"

#define NREQ 12
#define MAXGEN 24

typedef struct {
    int32_t prompt[80];
    uint32_t n, max_tokens;
    const char *stop;
    char want[1024];
    size_t want_len;
    kp_finish want_finish;
    uint32_t want_tokens;
} req_case;

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

/* KV bytes in use (0: every block of the pool is free). */
static uint64_t used_bytes(kp_engine *e) {
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    return st.used_bytes;
}

/* A model, its vocabulary and a thread pool. */
typedef struct {
    kp_model *m;
    kp_gguf *g;
    kp_tok_vocab *v;
    kp_threads *pool;
} fixture;

static bool fixture_open(fixture *f, const char *rel, int threads) {
    kp_error err = {0};
    memset(f, 0, sizeof *f);
    bool ok = kp_model_load(&f->m, harness_path(rel), &err) == KP_OK &&
              kp_gguf_open(&f->g, harness_path(rel), &err) == KP_OK &&
              kp_tok_vocab_load(&f->v, f->g, &err) == KP_OK && kp_threads_new(&f->pool, threads, &err) == KP_OK;
    CHECK_MSG(ok, "%s: %s", rel, err.msg);
    return ok;
}

static void fixture_close(fixture *f) {
    kp_threads_free(f->pool);
    kp_tok_vocab_free(f->v);
    kp_gguf_close(f->g);
    kp_model_free(f->m);
}

/* The request alone: greedy, text through kp_textout. */
static void reference(kp_engine *ref, const kp_tok_vocab *v, uint32_t nv, req_case *c) {
    kp_error err = {0};
    kp_eng_seq s = {0};
    float *lg = malloc(nv * sizeof(float));
    kp_textout *to = NULL;
    const char *stops[1] = {c->stop};
    CHECK(kp_textout_new(&to, v, stops, c->stop ? 1 : 0, false, false, &err) == KP_OK);
    CHECK(kp_eng_prefill(ref, c->prompt, c->n, &s, lg, NULL, &err) == KP_OK);
    c->want_len = 0;
    c->want_finish = KP_FINISH_LENGTH;
    c->want_tokens = 0;
    for (uint32_t g = 0; g < c->max_tokens; g++) {
        int32_t t = kp_argmax(lg, (int32_t)nv);
        c->want_tokens++;
        if (kp_tok_is_eog(v, t)) {
            c->want_finish = KP_FINISH_STOP;
            break;
        }
        const char *txt;
        size_t n;
        bool stopped;
        CHECK(kp_textout_push(to, t, &txt, &n, &stopped, &err) == KP_OK);
        memcpy(c->want + c->want_len, txt, n);
        c->want_len += n;
        if (stopped) {
            c->want_finish = KP_FINISH_STOP;
            break;
        }
        if (g + 1 < c->max_tokens) CHECK(kp_eng_decode(ref, &s, t, lg, &err) == KP_OK);
    }
    if (c->want_finish == KP_FINISH_LENGTH || c->want_finish == KP_FINISH_STOP) {
        const char *txt;
        size_t n;
        kp_textout_finish(to, &txt, &n);
        memcpy(c->want + c->want_len, txt, n);
        c->want_len += n;
    }
    kp_eng_seq_abort(ref, &s);
    kp_textout_free(to);
    free(lg);
}

/* Waits for the end, collecting text. */
static kp_finish collect(kp_sreq *r, char *buf, size_t cap, size_t *len, kp_sreq_update *last) {
    *len = 0;
    for (;;) {
        kp_sreq_update u;
        kp_sreq_wait(r, 5000, &u);
        if (u.text) {
            if (*len + u.len <= cap) memcpy(buf + *len, u.text, u.len);
            *len += u.len;
            free(u.text);
        }
        if (u.finish != KP_FINISH_NONE) {
            *last = u;
            return u.finish;
        }
    }
}

static void test_concurrent_equals_alone(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "models/stories260K.gguf", 2)) return;
    kp_model *m = fx.m;
    kp_threads *pool = fx.pool;
    kp_tok_vocab *v = fx.v;
    uint32_t nv = m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 160, true, NULL, KP_DTYPE_F32, true, 0, 0};
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    kp_eng_config cc = {KP_DTYPE_F32, 16, bb * 4 * 10, 160, false, NULL, KP_DTYPE_F32, false, 0, 0}; /* parallel x context */
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, m, pool, NULL, &cc, &err) == KP_OK);
    static req_case cs[NREQ];
    int32_t *enc = NULL;
    size_t ne = 0;
    const char *head = "Once upon a time, there was a little girl named Lily. She";
    CHECK(kp_tok_encode(v, head, strlen(head), true, false, &enc, &ne, &err) == KP_OK);
    for (int i = 0; i < NREQ; i++) {
        req_case *c = &cs[i];
        memset(c, 0, sizeof *c);
        uint32_t shared = i % 3 == 2 ? 0 : (uint32_t)ne - (uint32_t)rnd(4);
        c->n = shared + 1 + rnd(30);
        for (uint32_t k = 0; k < c->n; k++) c->prompt[k] = k < shared ? enc[k] : k ? (int32_t)(3 + rnd(nv - 3)) : 1;
        c->max_tokens = 1 + rnd(MAXGEN);
        c->stop = i % 4 == 1 ? "the" : NULL;
        reference(ref, v, nv, c);
    }
    free(enc);
    kp_sched_config sc = {4, 64, 24};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    kp_sreq *r[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) {
        kp_sreq_params p = {cs[i].prompt, cs[i].n, cs[i].max_tokens, kp_sampler_defaults(), NULL, 0, false, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
        p.sp.temp = 0;
        const char *stops[1] = {cs[i].stop};
        p.stops = stops;
        p.n_stops = cs[i].stop ? 1 : 0;
        CHECK_MSG(kp_sched_submit(s, &p, &r[i], &err) == KP_OK, "%s", err.msg);
    }
    uint32_t cached_total = 0;
    for (int i = 0; i < NREQ; i++) {
        char buf[1024];
        size_t len;
        kp_sreq_update u;
        kp_finish f = collect(r[i], buf, sizeof buf, &len, &u);
        CHECK_MSG(f == cs[i].want_finish, "request %d: finish %d, alone %d (%s)", i, f, cs[i].want_finish, u.err.msg);
        CHECK_MSG(len == cs[i].want_len && !memcmp(buf, cs[i].want, len), "request %d: '%.*s' vs alone '%.*s'", i,
                  (int)len, buf, (int)cs[i].want_len, cs[i].want);
        CHECK_EQ_INT(u.completion_tokens, cs[i].want_tokens);
        CHECK_EQ_INT(u.prompt_tokens, cs[i].n);
        CHECK(u.started && u.cached_tokens < cs[i].n && u.has_doctor);
        cached_total += u.cached_tokens;
        kp_sreq_release(r[i]);
    }
    CHECK_MSG(cached_total > 0, "no request reused a cached prefix");
    /* the same prompt again: everything but the last token comes from the cache */
    kp_sreq_params p = {cs[0].prompt, cs[0].n, 0, kp_sampler_defaults(), NULL, 0, false, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *one = NULL;
    CHECK(kp_sched_submit(s, &p, &one, &err) == KP_OK);
    char buf[64];
    size_t len;
    kp_sreq_update u;
    CHECK_EQ_INT(collect(one, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    CHECK_EQ_INT(u.cached_tokens, cs[0].n - 1);
    CHECK_EQ_INT(u.completion_tokens, 0);
    CHECK(u.has_doctor && u.doctor.finding.cause == KP_DOCTOR_CAUSE_HIT);
    kp_sreq_release(one);
    /* too long for the context */
    static int32_t longp[200];
    for (int i = 0; i < 200; i++) longp[i] = 5;
    p.prompt = longp;
    p.n_prompt = 200;
    CHECK_EQ_INT(kp_sched_submit(s, &p, &one, &err), KP_ERANGE);
    CHECK(strstr(err.msg, "200") && strstr(err.msg, "160"));
    /* cancel while generating: ends soon, what it computed stays cached */
    p.prompt = cs[1].prompt;
    p.n_prompt = cs[1].n;
    p.max_tokens = 100000;
    p.ignore_eos = true;
    CHECK(kp_sched_submit(s, &p, &one, &err) == KP_OK);
    while (kp_sreq_wait(one, 5000, &u), free(u.text), u.completion_tokens == 0 && u.finish == KP_FINISH_NONE) {
    }
    kp_sreq_cancel(one);
    kp_finish f = collect(one, buf, sizeof buf, &len, &u);
    CHECK(f == KP_FINISH_CANCELLED || f == KP_FINISH_LENGTH);
    kp_sreq_release(one);
    kp_sched_stats st;
    for (int i = 0; i < 200; i++) { /* the table is compacted right after the step */
        kp_sched_stats_get(s, &st);
        if (st.running == 0) break;
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    CHECK_EQ_INT(st.running, 0);
    CHECK(st.requests_finished == NREQ + 2 && st.requests_cancelled >= 1);
    CHECK(st.ttft_n == NREQ + 1 && /* + the cancelled one; prefill-only has no first token */
          st.generated_tokens > 0 && st.cached_tokens >= cached_total);
    kp_sched_free(s);
    /* every block back once the cache is dropped */
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

/* A full queue answers KP_EFULL; releasing queued requests frees them. */
static void test_queue_full_and_shutdown(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "models/stories260K.gguf", 1)) return;
    kp_model *m = fx.m;
    kp_threads *pool = fx.pool;
    kp_tok_vocab *v = fx.v;
    kp_engine *e = NULL;
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 512, false, NULL, KP_DTYPE_F16, false, 0, 0};
    CHECK(kp_eng_new(&e, m, pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {1, 3, 64};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    int32_t prompt[2] = {1, 400};
    kp_sreq_params p = {prompt, 2, 400, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *r[8] = {0};
    int ok = 0, full = 0;
    for (int i = 0; i < 8; i++) {
        kp_status st = kp_sched_submit(s, &p, &r[i], &err);
        ok += st == KP_OK;
        full += st == KP_EFULL;
    }
    CHECK(ok >= 3 && ok <= 4 && full == 8 - ok); /* 1 running + 3 queued */
    kp_sched_free(s); /* cancels everything */
    for (int i = 0; i < 8; i++) {
        if (!r[i]) continue;
        char buf[4096];
        size_t len;
        kp_sreq_update u;
        CHECK_EQ_INT(collect(r[i], buf, sizeof buf, &len, &u), KP_FINISH_CANCELLED);
        kp_sreq_release(r[i]);
    }
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    fixture_close(&fx);
}

/* --queue 0: no request waits for a sequence, but one that a free slot
 * takes is served (it used to be refused, as if the queue were full). */
static void test_queue_zero(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "models/stories260K.gguf", 1)) return;
    kp_engine *e = NULL;
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 512, false, NULL, KP_DTYPE_F16, false, 0, 0};
    CHECK(kp_eng_new(&e, fx.m, fx.pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {1, 0, 64};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, fx.v, &sc, &err) == KP_OK);
    int32_t prompt[2] = {1, 400};
    kp_sreq_params p = {prompt, 2, 4, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *r = NULL;
    CHECK(kp_sched_submit(s, &p, &r, &err) == KP_OK); /* the free slot takes it */
    char buf[4096];
    size_t len;
    kp_sreq_update u;
    if (r) CHECK_EQ_INT(collect(r, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    kp_sreq_release(r);
    /* one that runs for long holds the only slot: the next has no slot and no queue */
    kp_sreq_params lp = {prompt, 2, 400, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *a = NULL, *b = NULL;
    CHECK(kp_sched_submit(s, &lp, &a, &err) == KP_OK);
    for (int i = 0; i < 2000; i++) { /* until the engine has admitted it */
        kp_sched_stats st;
        kp_sched_stats_get(s, &st);
        if (st.running == 1) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(kp_sched_submit(s, &p, &b, &err) == KP_EFULL);
    kp_sreq_release(b);
    kp_sreq_release(a);
    kp_sched_free(s);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    fixture_close(&fx);
}

/* The cache operations while requests decode. */
typedef struct {
    kp_sched *s;
    const int32_t *p;
    uint32_t n;
    uint64_t max_steps, ops, steps_during;
    int failures;
} ops_ctx;

static uint64_t steps_now(kp_sched *s) {
    kp_sched_stats st;
    kp_sched_stats_get(s, &st);
    return st.steps;
}

/* 50 probes, pins and unpins, each timed in engine steps: it is served
 * before the step after the one in flight, so at most 2 steps complete
 * between reading the counter and the answer (1 in flight, 1 more if a step
 * ended between the read and the queueing). */
static void *cache_ops(void *arg) {
    ops_ctx *c = arg;
    uint64_t first = steps_now(c->s), id = 0;
    for (int i = 0; i < 50; i++) {
        kp_error err = {0};
        kp_eng_report r;
        kp_doctor_report d;
        bool has = false;
        kp_sched_cache snap;
        uint64_t s0 = steps_now(c->s);
        kp_status st;
        if (i % 3 == 0) {
            st = kp_sched_probe(c->s, c->p, c->n, NULL, 0, &r, &d, &has, &err);
            if (st != KP_OK || r.reused_tokens != c->n - 1 || !has || d.finding.cause != KP_DOCTOR_CAUSE_HIT)
                c->failures++;
        } else if (i % 3 == 1) {
            kp_eng_stats after;
            st = kp_sched_pin(c->s, c->p, c->n, 0, (int64_t)time(NULL), &id, &after, &err);
            kp_sched_cache_get(c->s, &snap); /* the snapshot holds the pin already */
            if (st != KP_OK || id == 0 || after.n_pins != 1 || snap.kv.n_pins != 1 || !snap.n_top) c->failures++;
        } else {
            st = kp_sched_unpin(c->s, id, &err);
            kp_sched_cache_get(c->s, &snap);
            if (st != KP_OK || snap.kv.n_pins != 0) c->failures++;
        }
        uint64_t d_steps = steps_now(c->s) - s0;
        if (d_steps > c->max_steps) c->max_steps = d_steps;
        c->ops++;
        if (i % 3 == 2 && kp_sched_unpin(c->s, id, &err) != KP_ENOTFOUND) c->failures++; /* gone */
    }
    c->steps_during = steps_now(c->s) - first;
    return NULL;
}

static void test_cache_ops_between_steps(void) {
    kp_error err = {0};
    /* a model whose decode step takes milliseconds (13 MB of F32 weights read
     * per step), one engine thread: the caller's wake-up is short next to a step */
    fixture fx;
    if (!fixture_open(&fx, "tests/data/models/gen-llama-gqa-f32.gguf", 1)) return;
    kp_model *m = fx.m;
    kp_threads *pool = fx.pool;
    kp_tok_vocab *v = fx.v;
    kp_eng_config cc = {KP_DTYPE_F32, 16, 0, 1024, false, NULL, KP_DTYPE_F32, false, 0, 0};
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    cc.budget_bytes = bb * (1024 / 16) * 6;
    kp_engine *e = NULL;
    CHECK(kp_eng_new(&e, m, pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {4, 16, 64};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    /* a prefix in the cache to probe and pin */
    int32_t p[24];
    for (int i = 0; i < 24; i++) p[i] = i ? 20 + 3 * i : 1;
    kp_sreq_params pp = {p, 24, 0, kp_sampler_defaults(), NULL, 0, false, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *r0 = NULL;
    CHECK(kp_sched_submit(s, &pp, &r0, &err) == KP_OK);
    char buf[64];
    size_t len;
    kp_sreq_update u;
    CHECK_EQ_INT(collect(r0, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    kp_sreq_release(r0);
    kp_sched_cache snap;
    kp_sched_cache_get(s, &snap); /* published before the owner heard of the end */
    CHECK(snap.kv.prefix_cache && snap.n_top == 1 && snap.top[0].n_tokens == 24 && snap.kv.cached_tokens == 24);
    /* four sequences decoding for as long as the test needs */
    kp_sreq *run[4];
    for (int k = 0; k < 4; k++) {
        int32_t q[3] = {1, 100 + k, 200 + k};
        kp_sreq_params rp = {q, 3, 100000, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
        rp.sp.temp = 0;
        CHECK(kp_sched_submit(s, &rp, &run[k], &err) == KP_OK);
    }
    for (int k = 0; k < 4; k++)
        while (kp_sreq_wait(run[k], 5000, &u), free(u.text), u.completion_tokens == 0 && u.finish == KP_FINISH_NONE) {
        }
    ops_ctx c = {s, p, 24, 0, 0, 0, 0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, cache_ops, &c) == 0);
    pthread_join(th, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
    printf("scheduler: 50 cache operations in %.1f ms while 4 sequences ran %llu steps (%.2f ms a step); the "
           "slowest waited %llu steps\n", ms, (unsigned long long)c.steps_during,
           c.steps_during ? ms / (double)c.steps_during : 0.0, (unsigned long long)c.max_steps);
    CHECK_EQ_INT(c.ops, 50);
    CHECK_EQ_INT(c.failures, 0);
    CHECK_MSG(c.max_steps <= 2, "an operation waited %llu engine steps", (unsigned long long)c.max_steps);
    CHECK_MSG(c.steps_during >= 25, "only %llu steps ran during the operations: the sequences did not decode",
              (unsigned long long)c.steps_during);
    kp_sched_stats st;
    kp_sched_stats_get(s, &st);
    CHECK_EQ_INT(st.running, 4); /* still decoding */
    for (int k = 0; k < 4; k++) {
        kp_sreq_cancel(run[k]);
        char b2[1];
        CHECK_EQ_INT(collect(run[k], b2, 0, &len, &u), KP_FINISH_CANCELLED);
        kp_sreq_release(run[k]);
    }
    kp_sched_free(s);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    fixture_close(&fx);
}

/* ---- KV pressure ----------------------------------------------------------- */

#define NP 12

typedef struct {
    int32_t prompt[40];
    uint32_t n, max_tokens;
    kp_sampler_params sp;
    bool ignore_eos;
    int32_t want[96]; /* generated tokens alone */
    uint32_t n_want;
    char text[2048];
    size_t text_len;
    kp_finish finish;
} kv_case;

typedef struct {
    char *buf;
    size_t len;
} text_sink;

static void sink_step(void *ctx, const kp_gen_out *o) {
    text_sink *t = ctx;
    memcpy(t->buf + t->len, o->text, o->len);
    t->len += o->len;
}

/* The request alone, through the same generation loop on an engine with
 * room for everything and no prefix cache. */
static void kv_reference(kp_engine *ref, const kp_tok_vocab *v, uint32_t max_pos, kv_case *c) {
    kp_error err = {0};
    kp_gen_params gp = {c->sp, c->max_tokens, max_pos, 0, c->ignore_eos, NULL, 0, false};
    kp_gen *g = NULL;
    CHECK(kp_gen_new(&g, v, c->prompt, c->n, &gp, &err) == KP_OK);
    text_sink t = {c->text, 0};
    kp_eng_gen_opts o = {.ctx = &t, .on_step = sink_step};
    kp_eng_seq s = {0};
    CHECK_MSG(kp_eng_generate(ref, &s, g, &o, NULL, &err) == KP_OK, "%s", err.msg);
    c->text_len = t.len;
    c->n_want = kp_gen_n_generated(g);
    memcpy(c->want, kp_gen_tokens(g) + c->n, c->n_want * sizeof(int32_t));
    c->finish = kp_gen_finish(g);
    kp_eng_seq_abort(ref, &s);
    kp_gen_free(g);
}

/* A budget of six blocks (96 positions) and twelve requests of up to 60
 * positions each, four at a time, greedy and seeded sampling: every one
 * completes with the tokens and text it gets alone, some of them after
 * being preempted (the stats must say so, or the test pressed nothing),
 * and no block is left behind. Contexts stay under 128 positions, where
 * decode equals prefill bit for bit (test_forward), so a resumed sequence
 * recomputed by prefill goes on exactly as it would have. */
static void test_kv_pressure_equals_alone(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "models/stories260K.gguf", 2)) return;
    kp_model *m = fx.m;
    kp_tok_vocab *v = fx.v;
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 128, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config cc = {KP_DTYPE_F32, 16, bb * 6, 128, false, NULL, KP_DTYPE_F32, false, 0, 0};
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, m, fx.pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, m, fx.pool, NULL, &cc, &err) == KP_OK);
    static kv_case cs[NP];
    int32_t head[16];
    for (int i = 0; i < 16; i++) head[i] = i ? (int32_t)(3 + rnd(nv - 3)) : 1;
    for (int i = 0; i < NP; i++) {
        kv_case *c = &cs[i];
        memset(c, 0, sizeof *c);
        uint32_t shared = i % 3 == 0 ? 16 : i % 3 == 1 ? 5 : 0; /* some share a head (cache hits) */
        c->n = shared + 4 + rnd(20);
        for (uint32_t k = 0; k < c->n; k++) c->prompt[k] = k < shared ? head[k] : k ? (int32_t)(3 + rnd(nv - 3)) : 1;
        c->max_tokens = 60 - c->n + 1; /* n + max_tokens - 1 = 60 positions at most */
        c->ignore_eos = i % 2 == 0;
        c->sp = kp_sampler_defaults();
        if (i % 4 < 2) {
            c->sp.temp = 0;
        } else {
            c->sp.temp = 0.9f;
            c->sp.seed = 1000 + (uint64_t)i;
        }
        kv_reference(ref, v, 128, c);
    }
    kp_sched_config sc = {4, 64, 16};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    CHECK_EQ_INT(kp_sched_kv_positions(s), 96);
    kp_sreq *r[NP] = {0};
    for (int i = 0; i < NP; i++) {
        kp_sreq_params p = {cs[i].prompt, cs[i].n, cs[i].max_tokens, cs[i].sp, NULL, 0, cs[i].ignore_eos, NULL, 0,
                            true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
        CHECK_MSG(kp_sched_submit(s, &p, &r[i], &err) == KP_OK, "%s", err.msg);
    }
    uint32_t preempted = 0, preempted_seeded = 0;
    for (int i = 0; i < NP; i++) {
        static char buf[4096];
        size_t len;
        kp_sreq_update u;
        kp_finish f = collect(r[i], buf, sizeof buf, &len, &u);
        CHECK_MSG(f == cs[i].finish, "request %d: finish %d, alone %d (%s)", i, f, cs[i].finish, u.err.msg);
        CHECK_MSG(u.err.msg[0] == 0, "request %d: %s", i, u.err.msg);
        CHECK_EQ_INT(u.completion_tokens, cs[i].n_want);
        CHECK_EQ_INT(u.prompt_tokens, cs[i].n);
        CHECK_MSG(u.completion_tokens == cs[i].n_want &&
                      !memcmp(u.ids + cs[i].n, cs[i].want, cs[i].n_want * sizeof(int32_t)),
                  "request %d (%s, preempted %u times): tokens differ from alone", i,
                  cs[i].sp.temp == 0 ? "greedy" : "seeded", u.preemptions);
        CHECK_MSG(len == cs[i].text_len && !memcmp(buf, cs[i].text, len), "request %d: '%.*s' vs alone '%.*s'", i,
                  (int)len, buf, (int)cs[i].text_len, cs[i].text);
        preempted += u.preemptions;
        if (cs[i].sp.temp > 0) preempted_seeded += u.preemptions;
        kp_sreq_release(r[i]);
    }
    kp_sched_stats st;
    kp_sched_stats_get(s, &st);
    printf("scheduler: %d requests over 6 KV blocks: %llu preemptions (%u of seeded ones), %llu waits for KV, %llu "
           "positions recomputed on resume\n", NP, (unsigned long long)st.preemptions, preempted_seeded,
           (unsigned long long)st.kvwait_n, (unsigned long long)st.resumed_computed);
    CHECK_MSG(st.preemptions > 0, "no preemption: the budget was not pressed");
    CHECK_EQ_INT(st.preemptions, preempted);
    CHECK_MSG(preempted_seeded > 0, "no seeded request was preempted: its sampler state was not put to the test");
    CHECK(st.requests_failed == 0 && st.requests_started == NP && st.kvwait_n > 0);
    kp_sched_free(s);
    CHECK(kp_eng_check(e, &err) == KP_OK);
    kp_eng_stats k;
    kp_eng_get_stats(e, &k);
    CHECK_EQ_INT(k.used_bytes, k.index_bytes); /* nothing but the cache holds blocks */
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

/* Window slots in admission (gemma3: a window of W = 16 on 5 of 6
 * layers, blocks of 16): a KV budget with room for every block but the
 * tightest window budget (20 blocks' window rows), eight sequences at a
 * time, twelve greedy requests of up to 40 prompt tokens and 40 generated.
 * A request is admitted only when the window arena can serve it beside
 * the running ones (each may hold its window, a chunk and the window
 * before its prompt's end), counting what the index can give up: every
 * one completes with the tokens it gets alone, none is preempted or
 * fails for window rows midway, and some waited for them; the same again
 * with message starts every 8 positions (the windows before them handed
 * to the index as each sequence passes them). With pins
 * holding the windows before their ends (a cap that lets them), a request
 * the arena cannot serve even alone ends at once, finish LENGTH, with a
 * note naming the window budget. */
static void test_window_admission(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "tests/data/models/gen-gemma3-f32.gguf", 2)) return;
    kp_model *m = fx.m;
    kp_tok_vocab *v = fx.v;
    uint32_t nv = m->hp.n_vocab;
    uint64_t wpt = kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, KP_DTYPE_F32, KP_DTYPE_F32);
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    uint32_t slots = (256 + 2 * m->hp.n_swa + 15) / 16 + 2;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 128, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config cc = {KP_DTYPE_F32, 16, bb * 64, 128, false, NULL, KP_DTYPE_F32, true, slots * 16 * wpt, 0};
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, m, fx.pool, NULL, &cr, &err) == KP_OK);
    CHECK_MSG(kp_eng_new(&e, m, fx.pool, NULL, &cc, &err) == KP_OK, "%s", err.msg);
    if (!ref || !e) {
        kp_eng_free(ref);
        kp_eng_free(e);
        fixture_close(&fx);
        return;
    }
    static kv_case cs[NP];
    for (int i = 0; i < NP; i++) {
        kv_case *c = &cs[i];
        memset(c, 0, sizeof *c);
        c->n = 24 + rnd(17);
        for (uint32_t k = 0; k < c->n; k++) c->prompt[k] = k ? (int32_t)(3 + rnd(nv - 3)) : 1;
        c->max_tokens = 40;
        c->ignore_eos = true;
        c->sp = kp_sampler_defaults();
        c->sp.temp = 0;
        kv_reference(ref, v, 128, c);
    }
    kp_sched_config sc = {8, 64, 64};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    kp_sched_stats st;
    /* then the same with message starts every 8 positions: each running sequence hands the
     * windows before them to the index, which may drop them once it has gone past */
    static const uint32_t starts[4] = {8, 16, 24, 32};
    for (int with_starts = 0; with_starts < 2; with_starts++) {
        kp_sreq *r[NP] = {0};
        for (int i = 0; i < NP; i++) {
            kp_sreq_params p = {cs[i].prompt, cs[i].n, cs[i].max_tokens, cs[i].sp, NULL, 0, cs[i].ignore_eos, NULL, 0,
                                true, NULL, false, {0, NULL, {0, 0}}, with_starts ? starts : NULL,
                                with_starts ? 4 : 0};
            CHECK_MSG(kp_sched_submit(s, &p, &r[i], &err) == KP_OK, "%s", err.msg);
        }
        for (int i = 0; i < NP; i++) {
            static char buf[4096];
            size_t len;
            kp_sreq_update u;
            kp_finish f = collect(r[i], buf, sizeof buf, &len, &u);
            CHECK_MSG(f == cs[i].finish, "request %d: finish %d, alone %d (%s)", i, f, cs[i].finish, u.err.msg);
            CHECK_MSG(u.err.msg[0] == 0, "request %d: %s", i, u.err.msg);
            CHECK_MSG(u.completion_tokens == cs[i].n_want &&
                          !memcmp(u.ids + cs[i].n, cs[i].want, cs[i].n_want * sizeof(int32_t)),
                      "request %d (preempted %u times): tokens differ from alone", i, u.preemptions);
            kp_sreq_release(r[i]);
        }
        kp_sched_stats_get(s, &st);
        printf("scheduler: %d requests under a window budget of %u blocks%s: %llu preemptions, %llu waits for KV\n",
               NP, slots, with_starts ? ", message starts" : "", (unsigned long long)st.preemptions,
               (unsigned long long)st.kvwait_n);
        CHECK_EQ_INT(st.preemptions, 0);
        CHECK(st.requests_failed == 0 && st.requests_started == (uint64_t)NP * (with_starts + 1));
        CHECK_MSG(st.kvwait_n > 0, "no request waited: the window arena was not pressed");
        CHECK(kp_eng_check(e, &err) == KP_OK);
    }
    kp_sched_free(s);
    kp_eng_free(e);
    /* pins (under a cap that lets them) holding the windows before their ends leave too few slots
     * for a request even alone: it ends at once, finish LENGTH, with a note naming the window budget */
    kp_pfx_config pc = {UINT64_MAX, 16};
    cc.pfx = &pc;
    CHECK_MSG(kp_eng_new(&e, m, fx.pool, NULL, &cc, &err) == KP_OK, "%s", err.msg);
    for (int i = 0; e && i < 9; i++) {
        kp_eng_seq q = {0};
        uint64_t id;
        CHECK(kp_eng_prefill(e, cs[i].prompt, cs[i].n, &q, NULL, NULL, &err) == KP_OK &&
              kp_eng_finish(e, &q, cs[i].prompt, cs[i].n, NULL, &err) == KP_OK);
        CHECK_MSG(kp_eng_pin(e, cs[i].prompt, cs[i].n, 0, 0, &id, &err) == KP_OK, "%s", err.msg);
    }
    CHECK(e && kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    if (s) {
        kp_sreq_params p = {cs[9].prompt, cs[9].n, 10, cs[9].sp, NULL, 0, true, NULL, 0, true, NULL, false,
                            {0, NULL, {0, 0}}, NULL, 0};
        kp_sreq *q = NULL;
        static char buf[4096];
        size_t len;
        kp_sreq_update u;
        CHECK(kp_sched_submit(s, &p, &q, &err) == KP_OK);
        CHECK_EQ_INT(collect(q, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
        CHECK_MSG(u.completion_tokens == 0 && strstr(u.err.msg, "window budget"), "%u tokens: %s", u.completion_tokens,
                  u.err.msg);
        kp_sreq_release(q);
        kp_sched_stats_get(s, &st);
        CHECK_EQ_INT(st.preemptions, 0);
        kp_sched_free(s);
    }
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

/* What can never fit is refused with the numbers; a default max_tokens is
 * cut to the budget; pins that leave too little room end a request with
 * finish LENGTH and a note instead of a wait that never ends. */
static void test_kv_budget_and_pins(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "models/stories260K.gguf", 1)) return;
    kp_model *m = fx.m;
    kp_tok_vocab *v = fx.v;
    uint64_t per = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32), bb = per * 16;
    kp_eng_config cc = {KP_DTYPE_F32, 16, bb * 6, 256, false, NULL, KP_DTYPE_F32, false, 0, 0}; /* 96 positions; pins up to 3 blocks */
    kp_engine *e = NULL;
    CHECK(kp_eng_new(&e, m, fx.pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {2, 8, 32};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    uint32_t mt = 0;
    char num[64];
    CHECK_EQ_INT(kp_sched_fit(s, 90, 7, true, &mt, &err), KP_OK);
    CHECK_EQ_INT(mt, 7); /* 96 positions: fits exactly */
    CHECK_EQ_INT(kp_sched_fit(s, 90, 8, true, &mt, &err), KP_ERANGE);
    snprintf(num, sizeof num, "%llu", (unsigned long long)(bb * 6));
    CHECK_MSG(strstr(err.msg, "90") && strstr(err.msg, " 8 ") && strstr(err.msg, "97") && strstr(err.msg, "96") &&
                  strstr(err.msg, num),
              "%s", err.msg);
    CHECK_EQ_INT(kp_sched_fit(s, 90, 100, false, &mt, &err), KP_OK);
    CHECK_EQ_INT(mt, 7);
    CHECK_EQ_INT(kp_sched_fit(s, 97, 0, true, &mt, &err), KP_ERANGE);
    CHECK(strstr(err.msg, "97") && strstr(err.msg, "96"));
    static int32_t t[100];
    for (int i = 0; i < 100; i++) t[i] = i ? 3 + (i * 37) % 400 : 1;
    kp_sreq *r = NULL;
    kp_sreq_params p = {t, 97, 0, kp_sampler_defaults(), NULL, 0, true, NULL, 0, false, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    CHECK_EQ_INT(kp_sched_submit(s, &p, &r, &err), KP_ERANGE);
    CHECK(r == NULL);
    /* a default max_tokens runs to the budget's end */
    p.n_prompt = 10;
    p.max_tokens = 1000;
    p.sp.temp = 0;
    CHECK(kp_sched_submit(s, &p, &r, &err) == KP_OK);
    static char buf[8192];
    size_t len;
    kp_sreq_update u;
    CHECK_EQ_INT(collect(r, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    CHECK_EQ_INT(u.completion_tokens, 96 - 10 + 1);
    kp_sreq_release(r);
    /* a pinned prefix of 48 positions (3 blocks) leaves 48 */
    int32_t pin[48];
    for (int i = 0; i < 48; i++) pin[i] = 5 + i;
    kp_sreq_params pp = {pin, 48, 0, kp_sampler_defaults(), NULL, 0, false, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    CHECK(kp_sched_submit(s, &pp, &r, &err) == KP_OK);
    CHECK_EQ_INT(collect(r, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    kp_sreq_release(r);
    uint64_t id = 0;
    CHECK_MSG(kp_sched_pin(s, pin, 48, 0, (int64_t)time(NULL), &id, NULL, &err) == KP_OK, "%s", err.msg);
    /* 10 + 80 - 1 positions fit the budget, not the room the pin leaves:
     * it grows to 48 positions alone, then ends with a note */
    kp_sreq_params q = {t, 10, 80, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    q.sp.temp = 0;
    CHECK(kp_sched_submit(s, &q, &r, &err) == KP_OK);
    CHECK_EQ_INT(collect(r, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    CHECK_EQ_INT(u.completion_tokens, 48 - 10 + 1);
    CHECK_MSG(u.status == KP_OK && strstr(u.err.msg, "pinned"), "%d %s", u.status, u.err.msg);
    kp_sreq_release(r);
    /* a prompt of 4 blocks cannot start beside 3 pinned ones: it ends at once */
    q.n_prompt = 60;
    q.max_tokens = 5;
    CHECK(kp_sched_submit(s, &q, &r, &err) == KP_OK);
    CHECK_EQ_INT(collect(r, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    CHECK(u.completion_tokens == 0 && strstr(u.err.msg, "pinned"));
    kp_sreq_release(r);
    /* unpinned, the same request runs */
    CHECK(kp_sched_unpin(s, id, &err) == KP_OK);
    CHECK(kp_sched_submit(s, &q, &r, &err) == KP_OK);
    CHECK_EQ_INT(collect(r, buf, sizeof buf, &len, &u), KP_FINISH_LENGTH);
    CHECK(u.completion_tokens == 5 && u.err.msg[0] == 0);
    kp_sreq_release(r);
    kp_sched_stats st;
    kp_sched_stats_get(s, &st);
    CHECK_EQ_INT(st.requests_failed, 0);
    kp_sched_free(s);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    fixture_close(&fx);
}

/* Waits for the end of r, collecting text, ids and logprob entries. */
static kp_finish collect_lp(kp_sreq *r, char *buf, size_t cap, size_t *len, int32_t *lp_tok, uint32_t *n_lp,
                            kp_sreq_update *last) {
    *len = 0;
    *n_lp = 0;
    for (;;) {
        kp_sreq_update u;
        kp_sreq_wait(r, 5000, &u);
        if (u.text) {
            if (*len + u.len <= cap) memcpy(buf + *len, u.text, u.len);
            *len += u.len;
            free(u.text);
        }
        for (uint32_t k = 0; k < u.n_lp; k++) {
            if (*n_lp < 64) lp_tok[*n_lp] = u.lp[k].token;
            (*n_lp)++;
        }
        free(u.lp);
        if (u.finish != KP_FINISH_NONE) {
            *last = u;
            return u.finish;
        }
    }
}

static void test_choices(void) {
    kp_error err = {0};
    fixture fx;
    if (!fixture_open(&fx, "models/stories260K.gguf", 1)) return;
    kp_engine *e = NULL;
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 512, false, NULL, KP_DTYPE_F16, false, 0, 0};
    CHECK(kp_eng_new(&e, fx.m, fx.pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {3, 8, 16};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, fx.v, &sc, &err) == KP_OK);
    int32_t prompt[41];
    for (int i = 0; i < 41; i++) prompt[i] = i == 0 ? 1 : 30 + 7 * i;
    kp_sampler_params sp = kp_sampler_defaults();
    sp.temp = 1;
    sp.seed = 77;
    kp_sreq_params p = {prompt, 41, 12, sp, NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    kp_sreq *r[3] = {0};
    kp_sched_stats a, b;
    kp_sched_stats_get(s, &a);
    CHECK(kp_sched_submit_n(s, &p, 3, 2, r, &err) == KP_OK);
    char got[3][1024];
    size_t len[3];
    int32_t ids[3][64], lpt[3][64];
    uint32_t nlp[3];
    for (int i = 0; i < 3; i++) {
        kp_sreq_update u;
        CHECK_EQ_INT(collect_lp(r[i], got[i], sizeof got[i], &len[i], lpt[i], &nlp[i], &u), KP_FINISH_LENGTH);
        CHECK_EQ_INT(u.completion_tokens, 12);
        CHECK_EQ_INT(nlp[i], 12);
        memcpy(ids[i], u.ids + 41, 12 * sizeof(int32_t));
        CHECK(!memcmp(lpt[i], ids[i], 12 * sizeof(int32_t))); /* an entry per token, in order */
        CHECK_EQ_INT(u.report.computed_tokens, i == 0 ? 41 : 0);
        kp_sreq_release(r[i]);
    }
    kp_sched_stats_get(s, &b);
    CHECK_EQ_INT((b.prompt_tokens - b.cached_tokens) - (a.prompt_tokens - a.cached_tokens), 41); /* once */
    CHECK_EQ_INT(b.prompt_tokens - a.prompt_tokens, 3 * 41);
    CHECK(memcmp(ids[0], ids[1], sizeof ids[0]) || memcmp(ids[1], ids[2], sizeof ids[0]));
    /* choice i is the request with seed 77 + i alone (the prompt now comes from the cache) */
    for (int i = 0; i < 3; i++) {
        kp_sreq_params q = p;
        q.sp.seed = 77 + (uint64_t)i;
        kp_sreq *one = NULL;
        CHECK(kp_sched_submit(s, &q, &one, &err) == KP_OK);
        char t[1024];
        size_t n;
        kp_sreq_update u;
        CHECK_EQ_INT(collect(one, t, sizeof t, &n, &u), KP_FINISH_LENGTH);
        CHECK_MSG(n == len[i] && !memcmp(t, got[i], n) && !memcmp(u.ids + 41, ids[i], 12 * sizeof(int32_t)),
                  "choice %d differs from seed %d alone", i, 77 + i);
        kp_sreq_release(one);
    }
    /* more choices than parallel sequences: refused, nothing queued */
    kp_sreq *four[4];
    CHECK(kp_sched_submit_n(s, &p, 4, -1, four, &err) == KP_EINVAL && four[0] == NULL);
    /* the KV fit counts the prompt once and max_tokens per choice: 41 + 3 x 199 > 512 positions */
    p.max_tokens = 200;
    CHECK(kp_sched_submit_n(s, &p, 3, -1, r, &err) == KP_ERANGE && r[0] == NULL);
    CHECK(kp_sched_submit_n(s, &p, 2, -1, r, &err) == KP_OK); /* 41 + 2 x 199 fits */
    for (int i = 0; i < 2; i++) kp_sreq_release(r[i]);
    /* cancelling every choice ends them all */
    p.max_tokens = 100;
    prompt[3] = 5;
    CHECK(kp_sched_submit_n(s, &p, 3, -1, r, &err) == KP_OK);
    for (int i = 0; i < 3; i++) kp_sreq_cancel(r[i]);
    for (int i = 0; i < 3; i++) {
        kp_sreq_update u;
        CHECK_EQ_INT(collect(r[i], got[0], sizeof got[0], &len[0], &u), KP_FINISH_CANCELLED);
        kp_sreq_release(r[i]);
    }
    kp_sched_free(s);
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    CHECK(st.used_bytes == st.index_bytes && st.n_leases == 0);
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    fixture_close(&fx);
}

int main(void) {
    RUN(test_choices);
    RUN(test_concurrent_equals_alone);
    RUN(test_queue_full_and_shutdown);
    RUN(test_queue_zero);
    RUN(test_cache_ops_between_steps);
    RUN(test_kv_pressure_equals_alone);
    RUN(test_kv_budget_and_pins);
    RUN(test_window_admission);
    return harness_finish("scheduler");
}
