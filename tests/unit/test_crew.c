/*
 * test_crew.c - in-flight prefixes: a request that arrives while another
 * computes the prompt it shares reuses those rows and gets the output it
 * gets alone.
 *
 * Reference: each request run by itself on an engine without a prefix
 * cache (kp_eng_prefill + kp_eng_decode, greedy). Engine level:
 * kp_eng_fork_prefix of a sequence's first k positions (inside a block, on
 * a boundary, a follower shorter than the source) plus the follower's own
 * tail gives the logits of the follower's prompt prefilled alone (float
 * tolerance), and leaks no block. Scheduler level: a burst of requests
 * sharing a spec with a leader that is still prefilling park on it, each
 * reports the rows it took in flight (the longest common prefix with the
 * leader, capped at its prompt - 1) and computes only the rest, so the
 * prompt positions computed in all are those of the distinct prompt
 * tokens; one sharing nothing is admitted as before; a leader cancelled
 * mid-prefill leaves its rows to one follower (through the index) and the
 * others park on that one; randomized bursts (spec lengths, followers
 * shorter than the leader, diverging inside a block, unrelated ones,
 * cancelled leaders) under a budget that evicts give every surviving
 * request its greedy tokens alone, and no block leaks.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "serve/scheduler.h"

#define MAXP 160
#define MAXG 150

static uint64_t rs = 0x2545f4914f6cdd1dull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

typedef struct {
    kp_model *m;
    kp_gguf *g;
    kp_tok_vocab *v;
    kp_threads *pool;
} fixture;

static bool fixture_open_model(fixture *f, int threads, const char *rel) {
    kp_error err = {0};
    memset(f, 0, sizeof *f);
    bool ok = kp_model_load(&f->m, harness_path(rel), &err) == KP_OK &&
              kp_gguf_open(&f->g, harness_path(rel), &err) == KP_OK &&
              kp_tok_vocab_load(&f->v, f->g, &err) == KP_OK && kp_threads_new(&f->pool, threads, &err) == KP_OK;
    CHECK_MSG(ok, "%s: %s", rel, err.msg);
    return ok;
}

static bool fixture_open(fixture *f, int threads) { return fixture_open_model(f, threads, "models/stories260K.gguf"); }

static void fixture_close(fixture *f) {
    kp_threads_free(f->pool);
    kp_tok_vocab_free(f->v);
    kp_gguf_close(f->g);
    kp_model_free(f->m);
}

static uint64_t used_bytes(kp_engine *e) {
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    return st.used_bytes;
}

typedef struct {
    int32_t prompt[MAXP];
    uint32_t n, max_tokens;
    int32_t want[MAXG]; /* greedy tokens alone */
    kp_sreq *r;
    bool cancel;
} crew_case;

/* The request alone, greedy, ignoring end-of-generation. */
static void reference(kp_engine *ref, uint32_t nv, crew_case *c) {
    kp_error err = {0};
    kp_eng_seq s = {0};
    float *lg = malloc(nv * sizeof(float));
    CHECK_MSG(kp_eng_prefill(ref, c->prompt, c->n, &s, lg, NULL, &err) == KP_OK, "%s", err.msg);
    for (uint32_t g = 0; g < c->max_tokens; g++) {
        c->want[g] = kp_argmax(lg, (int32_t)nv);
        if (g + 1 < c->max_tokens) CHECK(kp_eng_decode(ref, &s, c->want[g], lg, &err) == KP_OK);
    }
    kp_eng_seq_abort(ref, &s);
    free(lg);
}

static void submit(kp_sched *s, crew_case *c) {
    kp_error err = {0};
    kp_sreq_params p = {c->prompt, c->n, c->max_tokens, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    p.sp.temp = 0;
    CHECK_MSG(kp_sched_submit(s, &p, &c->r, &err) == KP_OK, "%s", err.msg);
}

/* Waits for r's end; *last: the final update. */
static kp_finish wait_end(kp_sreq *r, kp_sreq_update *last) {
    for (;;) {
        kp_sreq_update u;
        kp_sreq_wait(r, 5000, &u);
        free(u.text);
        free(u.lp);
        if (u.finish != KP_FINISH_NONE) {
            *last = u;
            return u.finish;
        }
    }
}

/* c's request ended with its tokens alone; *u its last update. */
static void check_alone(crew_case *c, int i, kp_sreq_update *u) {
    kp_finish f = wait_end(c->r, u);
    CHECK_MSG(f == KP_FINISH_LENGTH, "request %d: finish %d (%s)", i, f, u->err.msg);
    CHECK_EQ_INT(u->completion_tokens, c->max_tokens);
    bool same = u->completion_tokens == c->max_tokens &&
                !memcmp(u->ids + c->n, c->want, c->max_tokens * sizeof(int32_t));
    CHECK_MSG(same, "request %d (%u prompt tokens, %u in flight): tokens differ from the request alone", i, c->n,
              u->report.inflight_tokens);
    CHECK_EQ_INT(u->report.reused_tokens + u->report.computed_tokens, c->n);
    CHECK(u->report.inflight_tokens <= u->report.reused_tokens && u->report.reused_tokens < c->n);
}

static uint32_t lcp(const crew_case *a, const crew_case *b) {
    uint32_t k = 0;
    while (k < a->n && k < b->n && a->prompt[k] == b->prompt[k]) k++;
    return k;
}

/* fork_prefix(k) + the tail == the follower's prompt prefilled alone. */
static void test_fork_prefix_logits(void) {
    fixture fx;
    if (!fixture_open(&fx, 1)) return;
    kp_error err = {0};
    uint32_t nv = fx.m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 256, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config cc = {KP_DTYPE_F32, 16, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 0};
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, fx.m, fx.pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, fx.m, fx.pool, NULL, &cc, &err) == KP_OK);
    int32_t a[70], b[90];
    for (int i = 0; i < 70; i++) a[i] = i ? (int32_t)(3 + rnd(nv - 3)) : 1;
    float *want = malloc(nv * sizeof(float)), *got = malloc(nv * sizeof(float));
    /* k: inside a block, on a boundary, 1, the whole source; b shorter than a (no tail of its own) */
    const uint32_t ks[] = {37, 32, 1, 70, 45, 16};
    const uint32_t nbs[] = {60, 50, 20, 85, 46, 17};
    for (int t = 0; t < 6; t++) {
        uint32_t k = ks[t], nb = nbs[t];
        for (uint32_t i = 0; i < nb; i++) b[i] = i < k ? a[i] : (int32_t)(3 + rnd(nv - 3));
        if (t == 4) memcpy(b, a, nb * sizeof *b), k = nb - 1; /* a prefix of a: its last position is computed */
        kp_eng_seq src = {0}, dst = {0}, alone = {0};
        CHECK(kp_eng_prefill(e, a, 70, &src, NULL, NULL, &err) == KP_OK);
        CHECK_MSG(kp_eng_fork_prefix(e, &src, k, &dst, &err) == KP_OK, "%s", err.msg);
        CHECK_EQ_INT(kp_eng_seq_len(&dst), k);
        CHECK(kp_eng_append(e, &dst, b + k, nb - k, 0, got, &err) == KP_OK);
        /* the source goes on writing past k in its own blocks: the fork is unaffected */
        int32_t more[8] = {5, 6, 7, 8, 9, 10, 11, 12};
        CHECK(kp_eng_append(e, &src, more, 8, 0, NULL, &err) == KP_OK);
        CHECK(kp_eng_prefill(ref, b, nb, &alone, want, NULL, &err) == KP_OK);
        float worst = 0;
        for (uint32_t j = 0; j < nv; j++) {
            float d = got[j] - want[j];
            if (d < 0) d = -d;
            if (d > worst) worst = d;
        }
        CHECK_MSG(worst < 1e-3f, "k %u: logits differ by %g", k, (double)worst);
        CHECK_EQ_INT(kp_argmax(got, (int32_t)nv), kp_argmax(want, (int32_t)nv));
        CHECK_EQ_INT(kp_eng_fork_prefix(e, &src, 79, &alone, &err), KP_EINVAL); /* not empty */
        kp_eng_seq past = {0};
        CHECK_EQ_INT(kp_eng_fork_prefix(e, &src, 200, &past, &err), KP_EINVAL);
        kp_eng_seq_abort(ref, &alone);
        kp_eng_seq_abort(e, &dst);
        kp_eng_seq_abort(e, &src);
        CHECK(kp_eng_check(e, &err) == KP_OK);
        CHECK_EQ_INT(used_bytes(e), 0);
    }
    free(want);
    free(got);
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

/* Stats counters the burst tests compare. */
static void stats(kp_sched *s, kp_sched_stats *st) { kp_sched_stats_get(s, st); }

/* A leader still prefilling (two tokens a step) and followers that share
 * its spec: each parks, takes exactly the common prefix in flight and
 * computes only the rest; one sharing nothing is untouched; a cancelled
 * leader's rows go to one follower and the others park on it. */
static void test_burst_exact(void) {
    fixture fx;
    if (!fixture_open(&fx, 1)) return;
    kp_error err = {0};
    uint32_t nv = fx.m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 256, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config cc = {KP_DTYPE_F32, 16, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 0};
    uint64_t bb = kp_model_kv_bytes_per_token(&fx.m->hp, KP_DTYPE_F32) * 16;
    cc.budget_bytes = bb * 8 * 16; /* room for all: no eviction here */
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, fx.m, fx.pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, fx.m, fx.pool, NULL, &cc, &err) == KP_OK);
    int32_t spec[64];
    for (int i = 0; i < 64; i++) spec[i] = i ? (int32_t)(3 + rnd(nv - 3)) : 1;
    static crew_case cs[6];
    memset(cs, 0, sizeof cs);
    /* 0 leader: spec + 10; 1: spec + 12; 2: the leader's first 40 (shorter, no tail);
     * 3: spec[0..37) + its own (diverges inside block 2); 4: spec + 9; 5: shares nothing */
    const uint32_t share[6] = {64, 64, 40, 37, 64, 0}, len[6] = {74, 76, 40, 55, 73, 50};
    for (int i = 0; i < 6; i++) {
        crew_case *c = &cs[i];
        c->n = len[i];
        c->max_tokens = i == 0 ? MAXG : 6; /* the leader runs long: the others arrive while it does */
        for (uint32_t k = 0; k < c->n; k++)
            c->prompt[k] = k < share[i] ? spec[k] : k ? (int32_t)(3 + (i * 31 + k * 7) % (nv - 3)) : 2;
        if (i == 2) memcpy(c->prompt, cs[0].prompt, 40 * sizeof(int32_t));
        reference(ref, nv, c);
    }
    kp_sched_config sc = {6, 16, 2};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, fx.v, &sc, &err) == KP_OK);
    for (int i = 0; i < 6; i++) submit(s, &cs[i]);
    uint32_t computed = 0, distinct = 0, inflight = 0;
    for (int i = 0; i < 6; i++) {
        kp_sreq_update u;
        check_alone(&cs[i], i, &u);
        uint32_t want = i == 0 || i == 5 ? 0 : lcp(&cs[i], &cs[0]);
        if (want >= cs[i].n) want = cs[i].n - 1;
        CHECK_MSG(u.report.inflight_tokens == want && u.report.reused_tokens == want,
                  "request %d: %u in flight, %u reused, want %u", i, u.report.inflight_tokens, u.report.reused_tokens,
                  want);
        CHECK(i == 0 || i == 5 || u.report.inflight_wait_ms > 0);
        computed += u.report.computed_tokens;
        inflight += u.report.inflight_tokens;
        kp_sreq_release(cs[i].r);
    }
    /* nothing computed twice: the distinct prompt positions (a trie over the prompts), plus
     * request 2's last position, which it computes for its logits */
    distinct = cs[0].n + cs[5].n + 1;
    for (int i = 1; i < 5; i++) distinct += cs[i].n - (lcp(&cs[i], &cs[0]) < cs[i].n ? lcp(&cs[i], &cs[0]) : cs[i].n);
    CHECK_EQ_INT(computed, distinct);
    kp_sched_stats st;
    stats(s, &st);
    CHECK_EQ_INT(st.inflight_followers, 4);
    CHECK_EQ_INT(st.inflight_reused_tokens, inflight);
    CHECK_EQ_INT(st.prompt_tokens - st.cached_tokens, distinct);

    /* the leader cancelled mid-prefill: followers spec + own tails */
    for (int i = 0; i < 5; i++) {
        crew_case *c = &cs[i];
        c->n = 64 + 8;
        c->max_tokens = i == 0 ? 40 : 5;
        for (uint32_t k = 0; k < c->n; k++)
            c->prompt[k] = k < 64 ? spec[(k + 5) % 64] : (int32_t)(3 + (i * 53 + k * 11) % (nv - 3));
        if (i > 0) reference(ref, nv, c);
    }
    kp_sreq_params p = {cs[0].prompt, cs[0].n, 40, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    p.sp.temp = 0;
    CHECK(kp_sched_submit(s, &p, &cs[0].r, &err) == KP_OK);
    kp_sreq_progress(cs[0].r);
    for (int i = 1; i < 5; i++) submit(s, &cs[i]);
    for (;;) {
        kp_sreq_update u;
        kp_sreq_wait(cs[0].r, 5000, &u);
        free(u.text);
        if (u.prefill_done >= 16 || u.finish != KP_FINISH_NONE) break;
    }
    kp_sreq_cancel(cs[0].r);
    kp_sreq_update u0;
    wait_end(cs[0].r, &u0);
    kp_sreq_release(cs[0].r);
    uint32_t took_over = 0;
    for (int i = 1; i < 5; i++) {
        kp_sreq_update u;
        check_alone(&cs[i], i, &u);
        /* one reuses the leader's rows through the index (>= the 16 seen done), the others take 64 */
        if (u.report.reused_tokens != 64 || u.report.inflight_tokens == 0) {
            took_over++;
            CHECK_MSG(u.report.reused_tokens >= 16 && u.report.inflight_tokens == 0,
                      "request %d: %u reused, %u in flight", i, u.report.reused_tokens, u.report.inflight_tokens);
        }
        kp_sreq_release(cs[i].r);
    }
    CHECK(took_over <= 1);
    kp_sched_free(s);
    CHECK(kp_eng_check(e, &err) == KP_OK);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

/* A model with recurrent layers (qwen35): followers fork the leader's
 * state snapshot at the latest state point within the shared prefix (every
 * 16 positions here), taken as the leader prefills past it, and compute
 * the rest themselves: reused and in flight = that point, the greedy
 * tokens those of each request alone (an engine without a prefix cache). */
static void test_recurrent_crew(void) {
    fixture fx;
    if (!fixture_open_model(&fx, 1, "tests/data/models/gen-qwen35-f32.gguf")) return;
    kp_error err = {0};
    uint32_t nv = fx.m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 256, true, NULL, KP_DTYPE_F32, true, 0, 16};
    kp_eng_config cc = {KP_DTYPE_F32, 16, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 16};
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, fx.m, fx.pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, fx.m, fx.pool, NULL, &cc, &err) == KP_OK);
    if (!ref || !e) goto done;
    CHECK(kp_eng_recurrent(e));
    int32_t spec[100];
    for (int i = 0; i < 100; i++) spec[i] = i ? (int32_t)(3 + rnd(nv - 3)) : 1;
    static crew_case cs[5];
    memset(cs, 0, sizeof cs);
    /* 0 leader: spec + 20; 1, 2: spec + their own (fork at 96); 3: spec[0..70) + its own (fork
     * at 64); 4: spec[0..12) + its own (no state point within: admitted alone) */
    const uint32_t share[5] = {100, 100, 100, 70, 12}, len[5] = {120, 110, 104, 90, 40};
    for (int i = 0; i < 5; i++) {
        crew_case *c = &cs[i];
        c->n = len[i];
        c->max_tokens = i == 0 ? 60 : 6;
        for (uint32_t k = 0; k < c->n; k++)
            c->prompt[k] = k < share[i] ? spec[k] : (int32_t)(3 + (i * 37 + k * 5) % (nv - 3));
        reference(ref, nv, c);
    }
    kp_sched_config sc = {5, 16, 2};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, fx.v, &sc, &err) == KP_OK);
    if (!s) goto done;
    for (int i = 0; i < 5; i++) submit(s, &cs[i]);
    const uint32_t fork_at[5] = {0, 96, 96, 64, 0};
    uint32_t followers = 0;
    for (int i = 0; i < 5; i++) {
        kp_sreq_update u;
        check_alone(&cs[i], i, &u);
        CHECK_MSG(u.report.inflight_tokens == fork_at[i] && u.report.reused_tokens == fork_at[i],
                  "request %d: %u in flight, %u reused, want %u", i, u.report.inflight_tokens,
                  u.report.reused_tokens, fork_at[i]);
        followers += fork_at[i] > 0;
        kp_sreq_release(cs[i].r);
    }
    kp_sched_stats st;
    stats(s, &st);
    CHECK_EQ_INT(st.inflight_followers, followers);

    /* followers that arrive after the leader passed 96 and 64: its pending snapshots there */
    for (int i = 0; i < 3; i++) {
        crew_case *c = &cs[i];
        c->n = i == 0 ? 160 : i == 1 ? 108 : 80;
        c->max_tokens = i == 0 ? 30 : 5;
        for (uint32_t k = 0; k < c->n; k++)
            c->prompt[k] = k < (i == 2 ? 70u : 100u) ? spec[(k + 7) % 100] : (int32_t)(3 + (i * 41 + k * 3) % (nv - 3));
        if (i > 0) reference(ref, nv, c);
    }
    kp_sreq_params p = {cs[0].prompt, cs[0].n, 30, kp_sampler_defaults(), NULL, 0, true, NULL, 0, true, NULL, false, {0, NULL, {0, 0}}, NULL, 0};
    p.sp.temp = 0;
    CHECK(kp_sched_submit(s, &p, &cs[0].r, &err) == KP_OK);
    kp_sreq_progress(cs[0].r);
    for (;;) {
        kp_sreq_update u;
        kp_sreq_wait(cs[0].r, 5000, &u);
        free(u.text);
        if (u.prefill_done >= 110 || u.finish != KP_FINISH_NONE) break;
    }
    for (int i = 1; i < 3; i++) submit(s, &cs[i]);
    for (int i = 1; i < 3; i++) {
        kp_sreq_update u;
        check_alone(&cs[i], i, &u);
        uint32_t want = i == 1 ? 96 : 64;
        CHECK_MSG(u.report.inflight_tokens == want && u.report.reused_tokens == want,
                  "late request %d: %u in flight, %u reused, want %u", i, u.report.inflight_tokens,
                  u.report.reused_tokens, want);
        kp_sreq_release(cs[i].r);
    }
    kp_sreq_update u0;
    wait_end(cs[0].r, &u0);
    kp_sreq_release(cs[0].r);
    kp_sched_free(s);
    CHECK(kp_eng_check(e, &err) == KP_OK);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
done:
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

/* Randomized bursts under a budget that evicts. */
static void test_random_bursts(void) {
    fixture fx;
    if (!fixture_open(&fx, 2)) return;
    kp_error err = {0};
    uint32_t nv = fx.m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 256, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config cc = {KP_DTYPE_F32, 16, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 0};
    uint64_t bb = kp_model_kv_bytes_per_token(&fx.m->hp, KP_DTYPE_F32) * 16;
    cc.budget_bytes = bb * 20; /* 320 positions for 4 sequences of up to 120 + 12 */
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, fx.m, fx.pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, fx.m, fx.pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {4, 32, 6};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, fx.v, &sc, &err) == KP_OK);
    enum { ROUNDS = 8, PER = 6 };
    static crew_case cs[PER];
    for (int round = 0; round < ROUNDS; round++) {
        int32_t spec[100];
        uint32_t ns = 20 + rnd(80);
        for (uint32_t i = 0; i < ns; i++) spec[i] = i ? (int32_t)(3 + rnd(nv - 3)) : 1;
        bool cancel = round % 2 == 1;
        for (int i = 0; i < PER; i++) {
            crew_case *c = &cs[i];
            memset(c, 0, sizeof *c);
            uint32_t kind = i == 0 ? 0 : rnd(4), sh = ns;
            if (kind == 2) sh = 1 + rnd(ns); /* diverges anywhere, usually inside a block */
            if (kind == 3) sh = 0;           /* shares nothing */
            c->n = sh + 1 + rnd(20);
            for (uint32_t k = 0; k < c->n; k++) c->prompt[k] = k < sh ? spec[k] : k ? (int32_t)(3 + rnd(nv - 3)) : 2;
            if (kind == 1) { /* shorter than the leader: a prefix of its prompt */
                c->n = 2 + rnd(cs[0].n - 1);
                memcpy(c->prompt, cs[0].prompt, c->n * sizeof(int32_t));
            }
            c->max_tokens = 1 + rnd(12);
            c->cancel = cancel && i == 0;
            if (c->cancel) c->max_tokens = 200;
            if (!c->cancel) reference(ref, nv, c);
        }
        for (int i = 0; i < PER; i++) {
            submit(s, &cs[i]);
            if (cs[i].cancel) kp_sreq_progress(cs[i].r);
        }
        if (cancel) {
            for (;;) {
                kp_sreq_update u;
                kp_sreq_wait(cs[0].r, 5000, &u);
                free(u.text);
                if (u.prefill_done > 0 || u.finish != KP_FINISH_NONE) break;
            }
            kp_sreq_cancel(cs[0].r);
        }
        for (int i = 0; i < PER; i++) {
            kp_sreq_update u;
            if (cs[i].cancel)
                wait_end(cs[i].r, &u);
            else
                check_alone(&cs[i], round * PER + i, &u);
            kp_sreq_release(cs[i].r);
        }
    }
    kp_sched_stats st;
    stats(s, &st);
    CHECK_MSG(st.inflight_followers > 0 && st.inflight_reused_tokens > 0, "no request reused an in-flight prefix");
    CHECK_MSG(st.kv.n_evictions > 0, "no eviction: the budget was not pressed");
    kp_sched_free(s);
    CHECK(kp_eng_check(e, &err) == KP_OK);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    kp_eng_free(ref);
    fixture_close(&fx);
}

int main(void) {
    RUN(test_fork_prefix_logits);
    RUN(test_burst_exact);
    RUN(test_random_bursts);
    RUN(test_recurrent_crew);
    return harness_finish("crew");
}
