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
 * requests, prompts longer than the context, and no block leaked.
 */
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
    kp_model *m = NULL;
    kp_pool *pool = NULL;
    gguf *g = NULL;
    kp_tok_vocab *v = NULL;
    CHECK(kp_model_load(&m, harness_path("models/stories260K.gguf"), &err) == KP_OK);
    CHECK(kp_gguf_open(&g, harness_path("models/stories260K.gguf"), &err) == KP_OK);
    CHECK(kp_tok_vocab_load(&v, g, &err) == KP_OK);
    CHECK(kp_pool_new(&pool, 2, &err) == KP_OK);
    uint32_t nv = m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 160, true, NULL};
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    kp_eng_config cc = {KP_DTYPE_F32, 16, bb * 4 * 10, 160, false, NULL}; /* parallel x context */
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
        kp_sreq_params p = {cs[i].prompt, cs[i].n, cs[i].max_tokens, kp_sampler_defaults(), NULL, 0, false, NULL, 0};
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
    kp_sreq_params p = {cs[0].prompt, cs[0].n, 0, kp_sampler_defaults(), NULL, 0, false, NULL, 0};
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
    kp_pool_free(pool);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    kp_model_free(m);
}

/* A full queue answers KP_EFULL; releasing queued requests frees them. */
static void test_queue_full_and_shutdown(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_pool *pool = NULL;
    gguf *g = NULL;
    kp_tok_vocab *v = NULL;
    CHECK(kp_model_load(&m, harness_path("models/stories260K.gguf"), &err) == KP_OK);
    CHECK(kp_gguf_open(&g, harness_path("models/stories260K.gguf"), &err) == KP_OK);
    CHECK(kp_tok_vocab_load(&v, g, &err) == KP_OK);
    CHECK(kp_pool_new(&pool, 1, &err) == KP_OK);
    kp_engine *e = NULL;
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 512, false, NULL};
    CHECK(kp_eng_new(&e, m, pool, NULL, &cc, &err) == KP_OK);
    kp_sched_config sc = {1, 3, 64};
    kp_sched *s = NULL;
    CHECK(kp_sched_new(&s, e, v, &sc, &err) == KP_OK);
    int32_t prompt[2] = {1, 400};
    kp_sreq_params p = {prompt, 2, 400, kp_sampler_defaults(), NULL, 0, true, NULL, 0};
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
    kp_pool_free(pool);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    kp_model_free(m);
}

int main(void) {
    RUN(test_concurrent_equals_alone);
    RUN(test_queue_full_and_shutdown);
    return harness_finish("scheduler");
}
