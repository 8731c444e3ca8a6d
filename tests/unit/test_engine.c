/*
 * test_engine.c - the engine with the prefix cache gives the outputs of the
 * engine without it.
 *
 * Three engines run the same randomized stream of requests on one model:
 *   ref   --no-prefix-cache: every prompt computed whole;
 *   big   prefix cache, budget large enough that nothing is evicted;
 *   tiny  prefix cache, a budget of a few sequences: eviction happens.
 * Requests share prefixes (extend an earlier prompt+answer), edit an earlier
 * request at a random position, repeat one exactly (full hit), take a
 * prefix of one, or are fresh. For every request the prompt logits and the
 * greedy continuation (tokens and logits of every step) must agree with ref
 * within 1e-5 relative. The reuse of `big` must equal the longest common
 * token prefix with any earlier finished sequence, computed here by brute
 * force (n - 1 on a full hit). At the end every block must be free once the
 * index is dropped. A fork (kp_eng_fork) holds the prompt's whole blocks
 * once and a private copy of its partial block: decoding the same tokens
 * in the source and the forks gives the logits of a fresh prefill of the
 * whole sequence, and the forks' writes never reach the source. Both with
 * F32 K/V and with Q8_0 / Q4_0 K/V (the quantized pool's blocks are copied
 * and shared like any other), and the memory bill of every KV type.
 * gemma3 (gen-gemma3: a sliding window of 16 positions on 5 of 6 layers,
 * prompts up to 96 tokens, edits anywhere) runs the same stream, batches
 * and forks: a cached block keeps every layer's K/V, so a prompt that
 * diverges in the middle of a cached one still finds its whole window.
 * qwen3moe (gen-qwen3moe: 8 experts, 3 routed per token) runs them too:
 * a batch's rows group by expert differently with every mix of requests,
 * and a token's result must not depend on it. qwen35 and qwen35moe (gated
 * delta-net layers: a recurrent state resumed from snapshots; qwen35moe
 * with experts and a shared expert) run the stream, the forks and the
 * state checkpoint cases.
 * gpt-oss (gen-gpt-oss in F32 and MXFP4: sinks, biases, a window of 16 on
 * even layers, 4 of 8 experts) runs the cache-on/off, batching and fork
 * checks too.
 * On both, a fourth engine under the tightest window budget (engine.c)
 * runs the stream too: the outputs of the reference, never more reuse
 * than `big`, and some reuse cut by the window rule. Its exact resume
 * points are checked against the rule itself (every divergence of one
 * cached sequence, tried position by position), with forks of prefixes
 * whose window rows were dropped, and in an agent-like loop.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/gen.h"
#include "cache/prefix.h"
#include "kv/kvpool.h"
#include "harness.h"
#include "model/sampler.h"

#define MAX_REQ 40
#define MAX_LEN 96
#define N_GEN 3

typedef struct {
    int32_t t[MAX_LEN + N_GEN];
    uint32_t n;
} tokseq;

static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static uint32_t lcp(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    uint32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* max |a-b| / max(1, max |b|) */
static double rel_diff(const float *a, const float *b, uint32_t n) {
    double md = 0, mb = 1;
    for (uint32_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return md / mb;
}

/* KV bytes in use (0: every block of the pool is free). */
static uint64_t used_bytes(kp_engine *e) {
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    return st.used_bytes;
}

typedef struct {
    kp_engine *e;
    kp_eng_seq s;
    float *logits;
    kp_eng_report rep;
} runner;

/* positions between a recurrent model's state snapshots on the cache-on
 * engines (kp_eng_config.state_every; 0: the default) */
static uint32_t g_state_every;

static bool open_engine_len(runner *r, const kp_model *m, kp_threads *pool, bool cache, uint64_t budget, kp_dtype kv,
                            uint64_t window_budget, uint32_t max_len) {
    kp_error err = {0};
    memset(r, 0, sizeof *r);
    kp_eng_config c = {kv, 16, budget, max_len, !cache, NULL, kv, !cache, window_budget, g_state_every};
    kp_status st = kp_eng_new(&r->e, m, pool, NULL, &c, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    r->logits = malloc(m->hp.n_vocab * sizeof(float));
    return st == KP_OK && r->logits;
}

static bool open_engine_win(runner *r, const kp_model *m, kp_threads *pool, bool cache, uint64_t budget, kp_dtype kv,
                            uint64_t window_budget) {
    return open_engine_len(r, m, pool, cache, budget, kv, window_budget, MAX_LEN + N_GEN + 8);
}

static bool open_engine(runner *r, const kp_model *m, kp_threads *pool, bool cache, uint64_t budget, kp_dtype kv) {
    return open_engine_win(r, m, pool, cache, budget, kv, 0);
}

/* The smallest window budget kp_eng_new takes: a batch of 256 positions
 * and twice the window, in blocks of 16, and two blocks of slack. */
static uint64_t tight_window_budget(const kp_model *m, kp_dtype kv) {
    uint32_t slots = (256 + 2 * m->hp.n_swa + 15) / 16 + 2;
    return (uint64_t)slots * 16 * kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, kv, kv);
}

/* The gemma3 test model (W = 16) and a pool of one thread for the window
 * tests; false (checked) when either fails. */
static bool open_gemma3(kp_model **m, kp_threads **pool) {
    kp_error err = {0};
    *m = NULL;
    *pool = NULL;
    if (kp_model_load(m, harness_path("tests/data/models/gen-gemma3-f32.gguf"), &err) != KP_OK ||
        kp_threads_new(pool, 1, &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        kp_model_free(*m);
        *m = NULL;
        return false;
    }
    return true;
}

static void close_engine(runner *r) {
    kp_error err = {0};
    kp_eng_stats st;
    kp_eng_get_stats(r->e, &st);
    CHECK_MSG(kp_eng_check(r->e, &err) == KP_OK, "%s", err.msg);
    if (st.prefix_cache) {
        CHECK(st.used_bytes == st.index_bytes); /* no sequence holds anything */
    } else {
        CHECK(st.used_bytes == 0);
    }
    CHECK(kp_eng_clear(r->e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(r->e), 0);
    kp_eng_free(r->e);
    free(r->logits);
}

static void run_model_kv(const char *rel, uint64_t seed, kp_dtype kv) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (kp_model_load(&m, harness_path(rel), &err) != KP_OK) {
        CHECK_MSG(false, "%s: %s", rel, err.msg);
        return;
    }
    CHECK(kp_threads_new(&pool, 2, &err) == KP_OK);
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, kv) * 16;
    uint32_t seq_blocks = (MAX_LEN + N_GEN + 15) / 16;
    runner ref, big, tiny, win;
    bool ok = open_engine(&ref, m, pool, false, 0, kv);
    ok = open_engine(&big, m, pool, true, bb * 4096, kv) && ok;
    ok = open_engine(&tiny, m, pool, true, bb * (seq_blocks + 3), kv) && ok;
    /* a model with WINDOW layers: a fourth engine under the tightest window budget */
    int n_run = 3;
    if (m->hp.n_swa_layers) {
        ok = open_engine_win(&win, m, pool, true, bb * 4096, kv, tight_window_budget(m, kv)) && ok;
        n_run = 4;
    }
    runner *rs[4] = {&ref, &big, &tiny, &win};
    uint32_t window_cuts = 0;
    static tokseq done[MAX_REQ]; /* finished sequences: prompt + generated */
    uint32_t n_done = 0;
    uint32_t full_hits = 0, extensions = 0, reused_total = 0, evictions = 0, state_cuts = 0, tiny_reused = 0;
    bool rec = m->hp.n_rec_layers > 0;
    rng_state = seed;
    int32_t bos = 1;
    for (uint32_t q = 0; ok && q < MAX_REQ; q++) {
        tokseq req;
        uint32_t kind = n_done ? rnd(5) : 0;
        const tokseq *base = n_done ? &done[rnd(n_done)] : NULL;
        if (kind == 0) { /* fresh */
            req.n = 2 + rnd(40);
            req.t[0] = bos;
            for (uint32_t i = 1; i < req.n; i++) req.t[i] = (int32_t)rnd(nv);
        } else if (kind == 1) { /* extend an earlier prompt + answer */
            req = *base;
            uint32_t add = 1 + rnd(20);
            if (req.n + add > MAX_LEN) add = req.n < MAX_LEN ? MAX_LEN - req.n : 0;
            if (req.n > MAX_LEN) req.n = MAX_LEN;
            for (uint32_t i = 0; i < add; i++) req.t[req.n++] = (int32_t)rnd(nv);
            extensions++;
        } else if (kind == 2) { /* edit at a random position */
            req = *base;
            if (req.n > MAX_LEN) req.n = MAX_LEN;
            uint32_t at = 1 + rnd(req.n > 1 ? req.n - 1 : 1);
            if (at >= req.n) at = req.n - 1;
            req.t[at] = (req.t[at] + 1 + (int32_t)rnd(nv - 1)) % (int32_t)nv;
        } else if (kind == 3) { /* exactly an earlier prompt + answer: full hit */
            req = *base;
            if (req.n > MAX_LEN) req.n = MAX_LEN;
        } else { /* a prefix of an earlier one */
            req = *base;
            req.n = 1 + rnd(req.n < MAX_LEN ? req.n : MAX_LEN);
        }
        /* expected reuse for `big`: the longest common prefix with anything finished */
        uint32_t best = 0;
        for (uint32_t d = 0; d < n_done; d++) {
            uint32_t l = lcp(req.t, req.n, done[d].t, done[d].n);
            if (l > best) best = l;
        }
        uint32_t expect_reuse = best == req.n ? req.n - 1 : best;
        for (int k = 0; k < n_run; k++) {
            kp_status st = kp_eng_prefill(rs[k]->e, req.t, req.n, &rs[k]->s, rs[k]->logits, &rs[k]->rep, &err);
            CHECK_MSG(st == KP_OK, "engine %d request %u: %s", k, q, err.msg);
            if (st != KP_OK) ok = false;
        }
        if (!ok) break;
        CHECK_EQ_INT(ref.rep.reused_tokens, 0);
        CHECK_EQ_INT(ref.rep.computed_tokens, req.n);
        if (rec) { /* resumed at the latest snapshot: the rest of the match computed again */
            CHECK_MSG(big.rep.reused_tokens + big.rep.state_recomputed_tokens == expect_reuse,
                      "request %u (kind %u, n %u): reused %u + recomputed %u, expected %u", q, kind, req.n,
                      big.rep.reused_tokens, big.rep.state_recomputed_tokens, expect_reuse);
            CHECK(big.rep.state_cut_from == (big.rep.state_recomputed_tokens ? expect_reuse : 0));
            /* snapshots every g_state_every positions and at every end: never further back */
            CHECK(!g_state_every || big.rep.state_recomputed_tokens < g_state_every);
            state_cuts += big.rep.state_recomputed_tokens > 0;
            tiny_reused += tiny.rep.reused_tokens;
        } else {
            CHECK_MSG(big.rep.reused_tokens == expect_reuse, "request %u (kind %u, n %u): reused %u, expected %u", q,
                      kind, req.n, big.rep.reused_tokens, expect_reuse);
        }
        CHECK_EQ_INT(big.rep.diverged_at_token, best);
        CHECK_EQ_INT(big.rep.reused_tokens + big.rep.computed_tokens, req.n);
        CHECK(tiny.rep.reused_tokens <= expect_reuse);
        if (n_run == 4) {
            CHECK(win.rep.reused_tokens <= expect_reuse);
            CHECK_EQ_INT(win.rep.reused_tokens + win.rep.computed_tokens, req.n);
            CHECK(win.rep.window_cut_from == 0 || win.rep.window_cut_from > win.rep.reused_tokens);
            window_cuts += win.rep.window_cut_from > 0;
        }
        if (kind == 3) full_hits++;
        reused_total += big.rep.reused_tokens;
        evictions += tiny.rep.evictions;
        for (int k = 1; k < n_run; k++) {
            double d = rel_diff(rs[k]->logits, ref.logits, nv);
            CHECK_MSG(d <= 1e-5, "request %u engine %d: prompt logits differ by %g relative", q, k, d);
        }
        /* greedy continuation, every token decoded (the sequence holds prompt + answer) */
        tokseq fin = req;
        for (int g = 0; g < N_GEN; g++) {
            int32_t tok = kp_argmax(ref.logits, (int32_t)nv);
            for (int k = 1; k < n_run; k++)
                CHECK_MSG(kp_argmax(rs[k]->logits, (int32_t)nv) == tok, "request %u step %d engine %d: greedy differs",
                          q, g, k);
            fin.t[fin.n++] = tok;
            for (int k = 0; k < n_run; k++)
                CHECK_MSG(kp_eng_decode(rs[k]->e, &rs[k]->s, tok, rs[k]->logits, &err) == KP_OK, "%s", err.msg);
            for (int k = 1; k < n_run; k++) {
                double d = rel_diff(rs[k]->logits, ref.logits, nv);
                CHECK_MSG(d <= 1e-5, "request %u step %d engine %d: logits differ by %g", q, g, k, d);
            }
        }
        for (int k = 0; k < n_run; k++) {
            CHECK_EQ_INT(kp_eng_seq_len(&rs[k]->s), fin.n);
            CHECK(kp_eng_finish(rs[k]->e, &rs[k]->s, fin.t, fin.n, NULL, &err) == KP_OK);
            CHECK(rs[k]->s.kv.n_blocks == 0 && rs[k]->s.lease.node == NULL);
            CHECK_MSG(kp_eng_check(rs[k]->e, &err) == KP_OK, "%s", err.msg);
        }
        done[n_done++] = fin;
    }
    CHECK(full_hits > 0 && extensions > 0 && reused_total > 0);
    CHECK_MSG(evictions > 0, "the tiny budget never evicted");
    kp_eng_stats st;
    kp_eng_get_stats(big.e, &st);
    CHECK(st.n_hits > 0 && st.reused_tokens == reused_total);
    CHECK(st.n_evictions == 0 && st.state_evictions == 0);
    if (rec) {
        CHECK_MSG(state_cuts > 0, "no reuse was cut back to a snapshot");
        CHECK_MSG(tiny_reused > 0, "the tiny budget never resumed from a snapshot");
        CHECK(st.n_states > 0 && st.index_state_bytes == st.n_states * st.state_block_bytes);
        kp_eng_get_stats(tiny.e, &st);
        CHECK_MSG(st.n_evictions + st.state_evictions > 0, "the tiny budget never evicted");
    }
    if (n_run == 4) {
        CHECK_MSG(window_cuts > 0, "the window budget never cut a reuse");
        kp_eng_get_stats(win.e, &st);
        CHECK(st.index_window_bytes < st.index_full_bytes / st.full_bytes_per_token * st.window_bytes_per_token);
    }
    for (int k = 0; k < n_run; k++) close_engine(rs[k]);
    kp_threads_free(pool);
    kp_model_free(m);
}

static void run_model(const char *rel, uint64_t seed) { run_model_kv(rel, seed, KP_DTYPE_F32); }

/* qwen35 (gated delta-net layers: a recurrent state): cache on equals cache
 * off with state snapshots every 16 positions (every block boundary) and
 * every 40 (inside blocks: resumes further back), F32 and Q8_0 K/V; the
 * tiny budget evicts snapshots and leaves, and resumes further back. */
static void test_equal_qwen35(void) {
    g_state_every = 16;
    run_model_kv("tests/data/models/gen-qwen35-f32.gguf", 0x35aa35bb35cc35ddull, KP_DTYPE_F32);
    g_state_every = 40;
    run_model_kv("tests/data/models/gen-qwen35-f32.gguf", 0x1357924680abcdefull, KP_DTYPE_F32);
    g_state_every = 16;
    run_model_kv("tests/data/models/gen-qwen35-q8_0.gguf", 0x2468ace013579bdfull, KP_DTYPE_Q8_0);
    g_state_every = 0;
}

/* qwen35moe (qwen35's recurrent layers, routed experts and a shared expert
 * in every layer): the same stream, the same snapshot spacings; a batch's
 * rows group by expert differently with every mix of requests, and a
 * resumed state must not depend on it. */
static void test_equal_qwen35moe(void) {
    g_state_every = 16;
    run_model_kv("tests/data/models/gen-qwen35moe-f32.gguf", 0x35e035e135e235e3ull, KP_DTYPE_F32);
    g_state_every = 40;
    run_model_kv("tests/data/models/gen-qwen35moe-f32.gguf", 0x9a7c35e09a7c35e1ull, KP_DTYPE_F32);
    g_state_every = 16;
    run_model_kv("tests/data/models/gen-qwen35moe-q8_0.gguf", 0x35e0a8b835e0a8b9ull, KP_DTYPE_Q8_0);
    g_state_every = 0;
}

static void test_equal_stories(void) { run_model("models/stories260K.gguf", 0x9e3779b97f4a7c15ull); }
/* the same with K and V cached as Q8_0 (Q4_0): cached rows are the bytes a
 * recomputation writes, so cache-on equals cache-off as with F32 */
static void test_equal_qwen3_kv_q8_0(void) {
    run_model_kv("tests/data/models/gen-qwen3-f16.gguf", 0x5bd1e9955bd1e995ull, KP_DTYPE_Q8_0);
}
static void test_equal_llama_kv_q4_0(void) {
    run_model_kv("tests/data/models/gen-llama-gqa-f32.gguf", 0x2545f4914f6cdd1dull, KP_DTYPE_Q4_0);
}
static void test_equal_qwen2_q8(void) { run_model("tests/data/models/gen-qwen2-q8_0.gguf", 0x1234567887654321ull); }
/* K-quant weights: the cache-on engines compute from the repacked Q4_K
 * (Q6_K) copies where the CPU has a layout for them, the cache-off
 * reference from the mapping */
static void test_equal_llama_q4_k(void) { run_model("tests/data/models/gen-llama-gqa-q4_k.gguf", 0x0ddba11cafef00dull); }
static void test_equal_llama_q6_k(void) { run_model("tests/data/models/gen-llama-gqa-q6_k.gguf", 0x5eedfaceb00c1e55ull); }
/* sliding windows: cache on equals cache off with F32 and Q8_0 K/V */
static void test_equal_gemma3(void) {
    run_model("tests/data/models/gen-gemma3-f32.gguf", 0x6e3a3f1b2c4d5e6full);
    run_model_kv("tests/data/models/gen-gemma3-q8_0.gguf", 0x7f4b4a2c3d5e6f70ull, KP_DTYPE_Q8_0);
}

/* experts: cache on equals cache off with F32 and Q8_0 K/V */
static void test_equal_qwen3moe(void) {
    run_model("tests/data/models/gen-qwen3moe-f32.gguf", 0x3a0e5eed0c0ffee1ull);
    run_model_kv("tests/data/models/gen-qwen3moe-q8_0.gguf", 0x3a0e5eed0c0ffee2ull, KP_DTYPE_Q8_0);
}

/* gpt-oss (sinks, windows on even layers, experts with biases): cache on
 * equals cache off, F32 experts with F32 K/V and MXFP4 experts with Q8_0 */
static void test_equal_gptoss(void) {
    run_model("tests/data/models/gen-gpt-oss-f32.gguf", 0x6a7055eed0c0ffeeull);
    run_model_kv("tests/data/models/gen-gpt-oss-mxfp4.gguf", 0x6a7055eed0c0ffefull, KP_DTYPE_Q8_0);
}

/* A window budget, exactly: gemma3 (a window of W = 16 on 5 of 6 layers,
 * blocks of B = 16). Sequence A of 80 tokens is prefilled and indexed
 * under the tightest window budget; as it ran it dropped the window rows
 * of its blocks that lie wholly W or more positions before its end (block
 * j when (j + 1) * B <= 80 - W), so blocks 0..3 lack them and block 4
 * holds them. A prompt that diverges from A at d then reuses, by the rule
 * (a query at p reads window rows p - W < q <= p), the latest p <= d (or
 * 79 on a full hit) such that every position of [p - W + 1, p) lies in a
 * held block: found here by trying every p, not by kvpin's jump. Its
 * logits equal a recomputation's (cache off), and the report says where
 * the tokens matched (window_cut_from) when the rule cut the reuse. */
static void test_window_resume(void) {
    enum { N = 80, W = 16, BS = 16 };
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    CHECK_EQ_INT(m->hp.n_swa, W);
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * BS;
    runner ref, win;
    bool ok = open_engine(&ref, m, pool, false, 0, KP_DTYPE_F32) &&
              open_engine_win(&win, m, pool, true, bb * 64, KP_DTYPE_F32, tight_window_budget(m, KP_DTYPE_F32));
    int32_t a[N], b[N];
    rng_state = 0x77696e646f77ull;
    a[0] = 1;
    for (uint32_t i = 1; i < N; i++) a[i] = (int32_t)rnd(nv);
    ok = ok && kp_eng_prefill(win.e, a, N, &win.s, win.logits, &win.rep, &err) == KP_OK &&
         kp_eng_finish(win.e, &win.s, a, N, NULL, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    bool held[N / BS];
    for (uint32_t j = 0; j < N / BS; j++) held[j] = (j + 1) * BS > N - W;
    uint32_t cuts = 0;
    for (uint32_t d = 1; ok && d <= N; d++) {
        memcpy(b, a, sizeof a);
        if (d < N) b[d] = (b[d] + 1) % (int32_t)nv;
        uint32_t match = d < N ? d : N - 1, expect = 0;
        for (uint32_t p = match; p > 0 && !expect; p--) {
            bool whole = true;
            for (uint32_t q = p + 1 > W ? p + 1 - W : 0; q < p; q++) whole = whole && held[q / BS];
            if (whole) expect = p;
        }
        ok = kp_eng_prefill(win.e, b, N, &win.s, win.logits, &win.rep, &err) == KP_OK &&
             kp_eng_prefill(ref.e, b, N, &ref.s, ref.logits, &ref.rep, &err) == KP_OK;
        CHECK_MSG(ok, "%s", err.msg);
        if (!ok) break;
        CHECK_MSG(win.rep.reused_tokens == expect, "diverging at %u: reused %u, the rule says %u", d,
                  win.rep.reused_tokens, expect);
        CHECK_EQ_INT(win.rep.reused_tokens + win.rep.computed_tokens, N);
        CHECK_EQ_INT(win.rep.window_cut_from, expect < match ? match : 0);
        cuts += expect < match;
        double dl = rel_diff(win.logits, ref.logits, nv);
        CHECK_MSG(dl <= 1e-5, "diverging at %u: logits differ by %g", d, dl);
        kp_eng_seq_abort(win.e, &win.s);
        kp_eng_seq_abort(ref.e, &ref.s);
    }
    CHECK(cuts > 0);
    /* the bill: the cache holds A's full rows of every block, window rows of block 4 only */
    kp_eng_stats st;
    kp_eng_get_stats(win.e, &st);
    CHECK_EQ_INT(st.index_full_bytes, (uint64_t)N * st.full_bytes_per_token);
    CHECK_EQ_INT(st.index_window_bytes, (uint64_t)BS * st.window_bytes_per_token);
    if (ok) {
        close_engine(&ref);
        close_engine(&win);
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* An agent-like loop under the tightest window budget (gemma3, W = 16,
 * B = 16): turn k's prompt is turn k - 1's plus 20 tokens, without the 3
 * tokens it answered, so it leaves the cache at the previous prompt's end:
 * the resume point a sequence keeps the window of (its prompt's end), so
 * every turn reuses the whole previous prompt. Then an edit 2 tokens past
 * turn 3's end: its window [47, 62) lies in turn 3's copy of the block it
 * resumed in (32..47) and turn 4's (48..63), both kept: it reuses 62.
 * Logits are a recomputation's throughout. */
static void test_window_turns(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    runner ref, win;
    bool ok = open_engine(&ref, m, pool, false, 0, KP_DTYPE_F32) &&
              open_engine_win(&win, m, pool, true, bb * 64, KP_DTYPE_F32, tight_window_budget(m, KP_DTYPE_F32));
    int32_t t[100];
    rng_state = 0x7475726e73ull;
    t[0] = 1;
    for (uint32_t i = 1; i < 100; i++) t[i] = (int32_t)rnd(nv);
    for (uint32_t k = 1; ok && k <= 5; k++) {
        uint32_t n = k < 5 ? 20 * k : 80; /* the fifth: turn 4's prompt edited at 62 */
        int32_t q[100];
        memcpy(q, t, sizeof q);
        if (k == 5) q[62] = (q[62] + 1) % (int32_t)nv;
        uint32_t expect = k == 1 ? 0 : k < 5 ? 20 * (k - 1) : 62;
        runner *rs[2] = {&ref, &win};
        for (int r = 0; r < 2 && ok; r++)
            ok = kp_eng_prefill(rs[r]->e, q, n, &rs[r]->s, rs[r]->logits, &rs[r]->rep, &err) == KP_OK;
        CHECK_MSG(ok, "%s", err.msg);
        if (!ok) break;
        CHECK_MSG(win.rep.reused_tokens == expect, "turn %u: reused %u, expected %u", k, win.rep.reused_tokens, expect);
        CHECK_EQ_INT(win.rep.window_cut_from, 0);
        int32_t ans[N_GEN + 100];
        memcpy(ans, q, n * sizeof *q);
        for (int g = 0; g < N_GEN; g++) {
            CHECK_MSG(rel_diff(win.logits, ref.logits, nv) <= 1e-5, "turn %u step %d", k, g);
            ans[n + g] = kp_argmax(ref.logits, (int32_t)nv);
            for (int r = 0; r < 2; r++) CHECK(kp_eng_decode(rs[r]->e, &rs[r]->s, ans[n + g], rs[r]->logits, &err) == KP_OK);
        }
        for (int r = 0; r < 2; r++) CHECK(kp_eng_finish(rs[r]->e, &rs[r]->s, ans, n + N_GEN, NULL, &err) == KP_OK);
    }
    if (ok) {
        close_engine(&ref);
        close_engine(&win);
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* Long turns under the tightest window budget (gemma3, W = 16, B = 16; the
 * budget is the batch's 256 positions and twice the window, 20 blocks of
 * window rows): turn k's prompt is turn k - 1's plus 150 tokens, 7 turns
 * (no answers: no answer leaves whose private blocks an eviction could
 * free), so the windows before the older prompts' ends must give way to
 * each new turn's. A turn takes its prefix from the
 * index and is a reader of every block of it until it gives up the ones it
 * will not read again; it must do so before it asks for room, or the index
 * finds nothing to drop, evicts the path the turn came from and forgets
 * its resume points. The KV budget holds all 7 turns, so nothing is ever
 * evicted. Each turn reuses the whole previous prompt; an edit
 * just past turn 6's end then reuses turn 6's prompt whole (the newest
 * resume points are kept, the oldest went first), with a recomputation's
 * logits. */
static void test_window_long_turns(void) {
    enum { STEP = 150, TURNS = 7, N = STEP * TURNS };
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    runner ref, win;
    bool ok = open_engine_len(&win, m, pool, true, bb * 256, KP_DTYPE_F32, tight_window_budget(m, KP_DTYPE_F32), N + 64) &&
              open_engine_len(&ref, m, pool, false, 0, KP_DTYPE_F32, 0, N + 64);
    static int32_t t[N + 16], q[N + 16];
    rng_state = 0x6c6f6e67ull;
    t[0] = 1;
    for (uint32_t i = 1; i < N + 16; i++) t[i] = (int32_t)rnd(nv);
    for (uint32_t k = 1; ok && k <= TURNS + 1; k++) {
        /* turn TURNS + 1: turn 6's prompt and 16 tokens of its own */
        uint32_t n = k <= TURNS ? STEP * k : STEP * 6 + 16;
        memcpy(q, t, sizeof q);
        if (k > TURNS) q[STEP * 6] = (q[STEP * 6] + 1) % (int32_t)nv;
        uint32_t expect = k <= TURNS ? STEP * (k - 1) : STEP * 6;
        ok = kp_eng_prefill(win.e, q, n, &win.s, win.logits, &win.rep, &err) == KP_OK &&
             kp_eng_prefill(ref.e, q, n, &ref.s, ref.logits, NULL, &err) == KP_OK;
        CHECK_MSG(ok, "%s", err.msg);
        if (!ok) break;
        CHECK_MSG(win.rep.reused_tokens == expect, "turn %u: reused %u, expected %u (window cut from %u)", k,
                  win.rep.reused_tokens, expect, win.rep.window_cut_from);
        double d = rel_diff(win.logits, ref.logits, nv);
        CHECK_MSG(d <= 1e-5, "turn %u: logits differ by %g", k, d);
        /* the KV budget holds every turn: room for window rows comes from the
         * oldest resume points' windows, never from evicting the path */
        kp_eng_stats st;
        kp_eng_get_stats(win.e, &st);
        CHECK_MSG(st.n_evictions == 0, "turn %u: %llu nodes evicted", k, (unsigned long long)st.n_evictions);
        for (int r = 0; r < 2 && ok; r++) {
            runner *x = r ? &ref : &win;
            ok = kp_eng_finish(x->e, &x->s, q, n, NULL, &err) == KP_OK;
        }
        CHECK_MSG(ok, "%s", err.msg);
    }
    if (ok) {
        close_engine(&ref);
        close_engine(&win);
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* Under the tightest window budget a sequence of 80 positions on gemma3
 * (W = 16, B = 16) has dropped the window rows of blocks 0..3: a fork of
 * its first n positions reads [n - 15, n), so n = 40 or 72 is refused
 * (KP_EFULL: the scheduler then admits the request the ordinary way), n =
 * 80 forks, and the fork's next logits are a recomputation's. */
static void test_window_fork(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    runner ref, win;
    bool ok = open_engine(&ref, m, pool, false, 0, KP_DTYPE_F32) &&
              open_engine_win(&win, m, pool, true, bb * 64, KP_DTYPE_F32, tight_window_budget(m, KP_DTYPE_F32));
    int32_t a[81];
    rng_state = 0x666f726bull;
    a[0] = 1;
    for (uint32_t i = 1; i < 81; i++) a[i] = (int32_t)rnd(nv);
    ok = ok && kp_eng_prefill(win.e, a, 80, &win.s, win.logits, NULL, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    if (ok) {
        kp_eng_seq f = {0};
        CHECK_EQ_INT(kp_eng_fork_prefix(win.e, &win.s, 40, &f, &err), KP_EFULL);
        CHECK_EQ_INT(kp_eng_fork_prefix(win.e, &win.s, 72, &f, &err), KP_EFULL);
        CHECK(f.kv.n_blocks == 0);
        CHECK(kp_eng_fork_prefix(win.e, &win.s, 80, &f, &err) == KP_OK);
        CHECK(kp_eng_decode(win.e, &f, a[80], win.logits, &err) == KP_OK);
        CHECK(kp_eng_prefill(ref.e, a, 81, &ref.s, ref.logits, NULL, &err) == KP_OK);
        double d = rel_diff(win.logits, ref.logits, nv);
        CHECK_MSG(d <= 1e-5, "the fork's logits differ by %g", d);
        kp_eng_seq_abort(win.e, &f);
        kp_eng_seq_abort(win.e, &win.s);
        kp_eng_seq_abort(ref.e, &ref.s);
        close_engine(&ref);
        close_engine(&win);
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A long answer under the tightest window budget (gemma3, W = 16, B =
 * 16): a prompt of 40, then 60 greedy tokens. Once past its prompt's end
 * the sequence hands the prompt's path to the index (with its lease), so
 * the window before position 40 (blocks 1 and 2) is the index's, and the
 * sequence alone holds no more than its own window: after every token at
 * most ceil(W / B) + 1 = 2 blocks of window rows that nothing else
 * references, and the slots in use are the index's plus those exactly.
 * The logits are a recomputation's at every step, and a next turn that
 * sends the prompt back without the answer reuses all 40 positions. */
static void test_window_answer(void) {
    enum { P = 40, G = 60, W = 16, BS = 16 };
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * BS;
    runner ref, win;
    bool ok = open_engine(&ref, m, pool, false, 0, KP_DTYPE_F32) &&
              open_engine_win(&win, m, pool, true, bb * 64, KP_DTYPE_F32, tight_window_budget(m, KP_DTYPE_F32));
    int32_t t[P + G + 1];
    rng_state = 0x616e73776572ull;
    t[0] = 1;
    for (uint32_t i = 1; i < P; i++) t[i] = (int32_t)rnd(nv);
    runner *rs[2] = {&ref, &win};
    for (int r = 0; r < 2 && ok; r++)
        ok = kp_eng_prefill(rs[r]->e, t, P, &rs[r]->s, rs[r]->logits, NULL, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    uint32_t most = 0;
    for (uint32_t g = 0; ok && g < G; g++) {
        CHECK_MSG(rel_diff(win.logits, ref.logits, nv) <= 1e-5, "step %u", g);
        t[P + g] = kp_argmax(ref.logits, (int32_t)nv);
        for (int r = 0; r < 2; r++) ok = ok && kp_eng_decode(rs[r]->e, &rs[r]->s, t[P + g], rs[r]->logits, &err) == KP_OK;
        CHECK_MSG(ok, "%s", err.msg);
        uint32_t own = kp_eng_seq_window_slots(win.e, &win.s);
        if (own > most) most = own;
        kp_eng_stats st;
        kp_eng_get_stats(win.e, &st);
        uint64_t wb = (uint64_t)BS * st.window_bytes_per_token;
        CHECK_MSG(own <= (W + BS - 1) / BS + 1, "at %u positions the sequence holds %u blocks of window rows alone",
                  P + g + 1, own);
        CHECK_EQ_INT(st.window_used_bytes, st.index_window_bytes + own * wb);
        if (g + 1 == G) /* the index keeps the window before the prompt's end: blocks 1 and 2 */
            CHECK_EQ_INT(st.index_window_bytes, 2 * wb);
    }
    CHECK_EQ_INT(most, 2);
    for (int r = 0; r < 2 && ok; r++) ok = kp_eng_finish(rs[r]->e, &rs[r]->s, t, P + G, NULL, &err) == KP_OK;
    /* the next turn: the prompt again and something else than the answer */
    t[P] = (t[P] + 1) % (int32_t)nv;
    for (int r = 0; r < 2 && ok; r++)
        ok = kp_eng_prefill(rs[r]->e, t, P + 1, &rs[r]->s, rs[r]->logits, &rs[r]->rep, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    CHECK_EQ_INT(win.rep.reused_tokens, P);
    CHECK_EQ_INT(win.rep.window_cut_from, 0);
    CHECK(rel_diff(win.logits, ref.logits, nv) <= 1e-5);
    if (ok) {
        kp_eng_seq_abort(win.e, &win.s);
        kp_eng_seq_abort(ref.e, &ref.s);
        close_engine(&ref);
        close_engine(&win);
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* Message boundaries under the tightest window budget (gemma3, W = 16,
 * B = 16): a conversation of three messages starting at 0, 40 and 70 (96
 * tokens), answered with 3 tokens. Given the messages' starts
 * (kp_eng_begin_msgs), the sequence hands the path up to each start to the
 * index as it passes it, marked, so the window before 40 (blocks 1, 2) and
 * before 70 (blocks 3, 4) stay with the prompt's end's (block 5) and the
 * answer's (block 6); without them only blocks 5 and 6 keep their window
 * rows. While the sequence still runs, the windows before the starts are
 * behind its own and no one reads them: another prompt's admission counts
 * them as spare (kp_eng_room.spare_slots: blocks 1..4; the window before
 * its prompt's end, its leaf, is not). Then an edit inside the third
 * message (token 75) resumes at 75 with the starts and at 0 without them,
 * and dropping the second message (the prompt leaves the cache at 40)
 * resumes at 40 with them and at 0 without (window_cut_from 40: the
 * tokens matched that far). Logits are a recomputation's in every case. */
static void test_window_messages(void) {
    enum { N = 96, G = 3 };
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    int32_t t[N + G], edit[N], dropped[N - 30];
    rng_state = 0x6d736773ull;
    t[0] = 1;
    for (uint32_t i = 1; i < N; i++) t[i] = (int32_t)rnd(nv);
    memcpy(edit, t, sizeof edit);
    edit[75] = (edit[75] + 1) % (int32_t)nv;
    memcpy(dropped, t, 40 * sizeof *t); /* the second message (40..69) left out */
    memcpy(dropped + 40, t + 70, (N - 70) * sizeof *t);
    const uint32_t starts[2] = {70, 40}; /* any order */
    for (int marked = 0; marked < 2; marked++) {
        runner ref, win;
        bool ok = open_engine(&ref, m, pool, false, 0, KP_DTYPE_F32) &&
                  open_engine_win(&win, m, pool, true, bb * 64, KP_DTYPE_F32, tight_window_budget(m, KP_DTYPE_F32));
        ok = ok && kp_eng_begin_msgs(win.e, t, N, starts, marked ? 2 : 0, &win.s, &win.rep, &err) == KP_OK &&
             kp_eng_append(win.e, &win.s, t, N, 0, win.logits, &err) == KP_OK;
        ok = ok && kp_eng_prefill(ref.e, t, N, &ref.s, ref.logits, NULL, &err) == KP_OK;
        CHECK_MSG(ok, "%s", err.msg);
        runner *rs[2] = {&ref, &win};
        for (int g = 0; ok && g < G; g++) {
            CHECK(rel_diff(win.logits, ref.logits, nv) <= 1e-5);
            t[N + g] = kp_argmax(ref.logits, (int32_t)nv);
            for (int r = 0; r < 2; r++) ok = ok && kp_eng_decode(rs[r]->e, &rs[r]->s, t[N + g], rs[r]->logits, &err) == KP_OK;
        }
        /* while it still runs: the windows it handed over before 40 and 70 (blocks 1..4) are
         * behind its own, so no one reads them and another prompt's admission counts them as
         * spare (a second-pass drop); the window before its prompt's end (its leaf) is not */
        const int32_t other[3] = {1, 7, 7};
        kp_eng_room room;
        CHECK(ok && kp_eng_room_for(win.e, other, 3, true, &room, &err) == KP_OK);
        CHECK_EQ_INT(room.spare_slots, marked ? 4 : 0);
        for (int r = 0; r < 2 && ok; r++) ok = kp_eng_finish(rs[r]->e, &rs[r]->s, t, N + G, NULL, &err) == KP_OK;
        CHECK_MSG(ok, "%s", err.msg);
        kp_eng_stats st;
        kp_eng_get_stats(win.e, &st);
        CHECK_EQ_INT(st.index_window_bytes, (marked ? 6u : 2u) * 16 * st.window_bytes_per_token);
        const int32_t *q[2] = {edit, dropped};
        uint32_t nq[2] = {N, N - 30}, expect[2] = {marked ? 75u : 0u, marked ? 40u : 0u}, cut[2] = {75, 40};
        for (int k = 0; ok && k < 2; k++) {
            for (int r = 0; r < 2 && ok; r++)
                ok = kp_eng_prefill(rs[r]->e, q[k], nq[k], &rs[r]->s, rs[r]->logits, &rs[r]->rep, &err) == KP_OK;
            CHECK_MSG(ok, "%s", err.msg);
            CHECK_MSG(win.rep.reused_tokens == expect[k], "%s, query %d: reused %u, expected %u",
                      marked ? "with the starts" : "without", k, win.rep.reused_tokens, expect[k]);
            CHECK_EQ_INT(win.rep.window_cut_from, marked ? 0 : cut[k]);
            CHECK(rel_diff(win.logits, ref.logits, nv) <= 1e-5);
            for (int r = 0; r < 2; r++) kp_eng_seq_abort(rs[r]->e, &rs[r]->s);
        }
        if (ok) {
            close_engine(&ref);
            close_engine(&win);
        }
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* The pin cap under a window budget counts what a pin holds: sequence A
 * of 80 positions on gemma3 (W = 16, B = 16) under the tightest window
 * budget keeps the window rows of its last block only, so a pin of A
 * holds 5 blocks' full rows and 1 block's window rows (the bill's
 * pinned_bytes), and a cap of exactly that takes the pin, one byte less
 * refuses it (KP_EFULL). Counted as whole blocks (full + window rows
 * each) the pin would claim 5 blocks' window rows it does not hold. */
static void test_window_pin_cap(void) {
    enum { N = 80, BS = 16 };
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!open_gemma3(&m, &pool)) return;
    uint32_t nv = m->hp.n_vocab;
    uint64_t fb = BS * kp_model_kv_bytes_per_token_kind(m, KP_LAYER_FULL, KP_DTYPE_F32, KP_DTYPE_F32);
    uint64_t wb = BS * kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, KP_DTYPE_F32, KP_DTYPE_F32);
    uint64_t holds = 5 * fb + wb;
    int32_t a[N];
    rng_state = 0x70696e636170ull;
    a[0] = 1;
    for (uint32_t i = 1; i < N; i++) a[i] = (int32_t)rnd(nv);
    for (int k = 0; k < 2; k++) {
        kp_pfx_config pc = {holds - (uint64_t)k, 16};
        kp_eng_config c = {KP_DTYPE_F32, BS, (fb + wb) * 64, MAX_LEN + N_GEN + 8, false, &pc, KP_DTYPE_F32, true,
                           tight_window_budget(m, KP_DTYPE_F32), 0};
        kp_engine *e = NULL;
        kp_eng_seq s = {0};
        uint64_t id = 0;
        CHECK_MSG(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK, "%s", err.msg);
        if (!e) break;
        CHECK(kp_eng_prefill(e, a, N, &s, NULL, NULL, &err) == KP_OK && kp_eng_finish(e, &s, a, N, NULL, &err) == KP_OK);
        kp_status st = kp_eng_pin(e, a, N, 0, 0, &id, &err);
        kp_eng_stats es;
        kp_eng_get_stats(e, &es);
        if (k == 0) {
            CHECK_MSG(st == KP_OK, "%s", err.msg);
            CHECK_EQ_INT(es.pinned_bytes, holds);
        } else {
            CHECK_EQ_INT(st, KP_EFULL);
            CHECK_EQ_INT(es.pinned_bytes, 0);
        }
        CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
        kp_eng_free(e);
    }
    kp_threads_free(pool);
    kp_model_free(m);
}

/* The bundled model and a pool of one thread. */
static bool load_stories(kp_model **m, kp_threads **pool) {
    kp_error err = {0};
    *m = NULL;
    *pool = NULL;
    bool ok = kp_model_load(m, harness_path("models/stories260K.gguf"), &err) == KP_OK &&
              kp_threads_new(pool, 1, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    if (!ok) {
        kp_model_free(*m);
        *m = NULL;
    }
    return ok;
}

/* The plain cases by hand: an identical prompt reuses n - 1, an extension
 * reuses the whole earlier sequence, an edit at position k reuses k. */
static void test_reuse_counts(void) {
    kp_error err = {0};
    kp_model *m;
    kp_threads *pool;
    if (!load_stories(&m, &pool)) return;
    kp_engine *e = NULL;
    CHECK(kp_eng_new(&e, m, pool, NULL, NULL, &err) == KP_OK);
    int32_t a[40];
    for (int i = 0; i < 40; i++) a[i] = i == 0 ? 1 : 100 + i;
    kp_eng_seq s = {0};
    kp_eng_report r;
    CHECK(kp_eng_prefill(e, a, 20, &s, NULL, &r, &err) == KP_OK);
    CHECK(r.cold && r.reused_tokens == 0 && r.computed_tokens == 20);
    CHECK(kp_eng_finish(e, &s, a, 20, NULL, &err) == KP_OK);
    CHECK(kp_eng_prefill(e, a, 20, &s, NULL, &r, &err) == KP_OK);
    CHECK(!r.cold && r.reused_tokens == 19 && r.computed_tokens == 1 && r.diverged_at_token == 20);
    CHECK(kp_eng_finish(e, &s, a, 20, NULL, &err) == KP_OK);
    CHECK(kp_eng_prefill(e, a, 40, &s, NULL, &r, &err) == KP_OK);
    CHECK(r.reused_tokens == 20 && r.computed_tokens == 20);
    CHECK(kp_eng_finish(e, &s, a, 40, NULL, &err) == KP_OK);
    a[25] = 7;
    CHECK(kp_eng_prefill(e, a, 40, &s, NULL, &r, &err) == KP_OK);
    CHECK(r.reused_tokens == 25 && r.diverged_at_token == 25 && r.cached_next == 125);
    kp_eng_seq_abort(e, &s); /* cancelled: nothing indexed, nothing held */
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    CHECK(st.used_bytes == st.index_bytes && st.cached_tokens == 40 && st.n_leases == 0);
    /* errors are values and leave the sequence empty */
    int32_t badt[2] = {1, 100000};
    CHECK(kp_eng_prefill(e, badt, 2, &s, NULL, &r, &err) == KP_EINVAL);
    CHECK(kp_eng_prefill(e, a, 0, &s, NULL, &r, &err) == KP_EINVAL);
    CHECK(s.kv.n_blocks == 0);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    kp_eng_free(NULL);
    /* a budget below one block is refused */
    kp_eng_config c = {KP_DTYPE_F32, 16, 10, 0, false, NULL, KP_DTYPE_F32, false, 0, 0};
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_EINVAL && e == NULL);
    /* a budget of one sequence without a cache: a longer prompt is KP_EFULL */
    kp_eng_config c2 = {KP_DTYPE_F32, 16, kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16, 0, true, NULL, KP_DTYPE_F32, true, 0, 0};
    CHECK(kp_eng_new(&e, m, pool, NULL, &c2, &err) == KP_OK);
    CHECK(kp_eng_prefill(e, a, 17, &s, NULL, &r, &err) == KP_EFULL && s.kv.n_blocks == 0);
    CHECK_EQ_INT(used_bytes(e), 0);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* kp_eng_node_path finds every node kp_eng_tree draws by its chain of
 * first tokens, and its path is a prefix of a sequence that was indexed
 * (the tokens the test itself inserted). */
static void test_node_path(void) {
    kp_error err = {0};
    kp_model *m;
    kp_threads *pool;
    if (!load_stories(&m, &pool)) return;
    kp_engine *e = NULL;
    CHECK(kp_eng_new(&e, m, pool, NULL, NULL, &err) == KP_OK);
    enum { N = 48, K = 5 };
    int32_t seqs[K][N];
    uint32_t lens[K];
    rng_state = 0x51ed270b27a1c0ffull;
    for (int k = 0; k < K; k++) {
        lens[k] = 8 + rnd(N - 8);
        for (uint32_t i = 0; i < lens[k]; i++) seqs[k][i] = i == 0 ? 1 : 100 + (int32_t)i;
        /* each later sequence leaves the earlier ones somewhere */
        if (k > 0) seqs[k][1 + rnd(lens[k] - 1)] = 200 + k;
        kp_eng_seq s = {0};
        kp_eng_report r;
        CHECK(kp_eng_prefill(e, seqs[k], lens[k], &s, NULL, &r, &err) == KP_OK);
        CHECK(kp_eng_finish(e, &s, seqs[k], lens[k], NULL, &err) == KP_OK);
    }
    kp_eng_node nodes[64];
    uint32_t n = 0;
    CHECK(kp_eng_tree(e, nodes, 64, &n, &err) == KP_OK && n >= 2);
    for (uint32_t i = 0; i < n; i++) {
        int32_t chain[64], path[N];
        uint32_t depth = 0;
        for (int32_t j = (int32_t)i; j >= 0; j = nodes[j].parent) depth++;
        uint32_t d = depth;
        for (int32_t j = (int32_t)i; j >= 0; j = nodes[j].parent) chain[--d] = nodes[j].head[0];
        uint32_t start = 99, end = 99;
        CHECK(kp_eng_node_path(e, chain, depth, path, N, &start, &end, &err) == KP_OK);
        CHECK(start == nodes[i].start && end == nodes[i].end);
        bool prefix_of_one = false;
        for (int k = 0; k < K && !prefix_of_one; k++)
            prefix_of_one = end <= lens[k] && !memcmp(path, seqs[k], end * sizeof *path);
        CHECK_MSG(prefix_of_one, "node %u's path is no indexed sequence's prefix", i);
        CHECK(!memcmp(path + start, nodes[i].head, nodes[i].n_head * sizeof *path));
        /* a short buffer gets the path's start, the lengths stay true */
        int32_t few[3] = {-1, -1, -1};
        CHECK(kp_eng_node_path(e, chain, depth, few, 2, &start, &end, &err) == KP_OK);
        CHECK(end == nodes[i].end && few[0] == path[0] && few[2] == -1);
    }
    int32_t none[2] = {1, 31999}, path[N];
    uint32_t start, end;
    CHECK(kp_eng_node_path(e, none, 2, path, N, &start, &end, &err) == KP_ENOTFOUND && end == 0);
    CHECK(kp_eng_node_path(e, none, 0, path, N, &start, &end, &err) == KP_EINVAL);
    kp_eng_free(e);
    kp_eng_config c = {KP_DTYPE_F32, 16, 0, 0, true, NULL, KP_DTYPE_F32, true, 0, 0};
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    CHECK(kp_eng_node_path(e, none, 1, path, N, &start, &end, &err) == KP_ENOTFOUND);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A budget of about one sequence: the second prompt shares 20 tokens with a
 * cached 96-token sequence, whose single node its lease holds; the engine
 * must drop its own hold to evict the node's tail, and still compute what
 * the engine without a cache computes. */
static void budget_case(uint32_t blocks, uint32_t expect_reuse) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (kp_model_load(&m, harness_path("models/stories260K.gguf"), &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    CHECK(kp_threads_new(&pool, 1, &err) == KP_OK);
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    kp_eng_config c = {KP_DTYPE_F32, 16, bb * blocks, 96, false, NULL, KP_DTYPE_F32, false, 0, 0}, cref = c;
    cref.no_prefix_cache = true;
    kp_engine *e = NULL, *ref = NULL;
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cref, &err) == KP_OK);
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
    int32_t a[96], b[96];
    for (int i = 0; i < 96; i++) {
        a[i] = i == 0 ? 1 : (i * 7) % 500 + 3;
        b[i] = i < 20 ? a[i] : (i * 11) % 500 + 5;
    }
    kp_eng_seq s = {0}, sr = {0};
    kp_eng_report r;
    CHECK(kp_eng_prefill(e, a, 96, &s, NULL, &r, &err) == KP_OK);
    CHECK(kp_eng_finish(e, &s, a, 96, NULL, &err) == KP_OK);
    kp_status st = kp_eng_prefill(e, b, 90, &s, la, &r, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    CHECK_MSG(r.reused_tokens == expect_reuse && r.evictions > 0, "%u blocks: reused %u, expected %u", blocks,
              r.reused_tokens, expect_reuse);
    CHECK(kp_eng_prefill(ref, b, 90, &sr, lb, NULL, &err) == KP_OK);
    for (int g = 0; g < 6 && st == KP_OK; g++) {
        CHECK(rel_diff(la, lb, nv) <= 1e-5);
        int32_t tok = kp_argmax(lb, (int32_t)nv);
        CHECK_EQ_INT(kp_argmax(la, (int32_t)nv), tok);
        CHECK(kp_eng_decode(e, &s, tok, la, &err) == KP_OK);
        CHECK(kp_eng_decode(ref, &sr, tok, lb, &err) == KP_OK);
    }
    CHECK(kp_eng_finish(e, &s, b, 90, NULL, &err) == KP_OK);
    kp_eng_seq_abort(ref, &sr);
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    free(la);
    free(lb);
    kp_eng_free(e);
    kp_eng_free(ref);
    kp_threads_free(pool);
    kp_model_free(m);
}

static void test_budget_of_one_sequence(void) {
    budget_case(7, 20); /* one free block: the partial block 16..19 is copied */
    budget_case(6, 16); /* no free block for the copy: whole blocks only */
}

/* Continuous batching: N_CB requests start at different steps, their prompts
 * (several sharing a head) are computed in random-size chunks inside steps
 * that also decode the other running sequences, under a budget that forces
 * eviction; every sequence's prompt logits and greedy continuation must
 * equal the same request run alone with kp_eng_prefill / kp_eng_decode on an
 * engine without the cache. */
#define N_CB 8
#define CB_GEN 6
typedef struct {
    int32_t t[64 + CB_GEN];
    uint32_t n, fed, gen, start;
    kp_eng_seq s;
    float *logits;
    int32_t next;
    bool done;
    int32_t want[CB_GEN];
} cb_req;

static void batched_case(const char *rel, uint64_t seed, uint64_t budget_blocks) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (kp_model_load(&m, harness_path(rel), &err) != KP_OK) {
        CHECK_MSG(false, "%s: %s", rel, err.msg);
        return;
    }
    CHECK(kp_threads_new(&pool, 2, &err) == KP_OK);
    uint32_t nv = m->hp.n_vocab;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 128, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config cc = {KP_DTYPE_F32, 16, bb * budget_blocks, 128, false, NULL, KP_DTYPE_F32, false, 0, 0};
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, m, pool, NULL, &cc, &err) == KP_OK);
    static cb_req rq[N_CB];
    float *lr = malloc(nv * sizeof(float));
    rng_state = seed;
    int32_t head[24];
    for (int i = 0; i < 24; i++) head[i] = i ? (int32_t)rnd(nv) : 1;
    /* the reference, one request at a time */
    for (int q = 0; q < N_CB; q++) {
        cb_req *r = &rq[q];
        memset(r, 0, sizeof *r);
        r->n = 8 + rnd(50);
        uint32_t shared = q % 2 ? 0 : (q % 4 ? 24 : 12);
        for (uint32_t i = 0; i < r->n; i++) r->t[i] = i < shared ? head[i] : i ? (int32_t)rnd(nv) : 1;
        r->start = rnd(6);
        r->logits = malloc(nv * sizeof(float));
        kp_eng_seq s = {0};
        CHECK(kp_eng_prefill(ref, r->t, r->n, &s, lr, NULL, &err) == KP_OK);
        for (int g = 0; g < CB_GEN; g++) {
            r->want[g] = kp_argmax(lr, (int32_t)nv);
            if (g + 1 < CB_GEN) CHECK(kp_eng_decode(ref, &s, r->want[g], lr, &err) == KP_OK);
        }
        kp_eng_seq_abort(ref, &s);
    }
    /* batched: every step decodes the running sequences and feeds prompt chunks */
    kp_eng_item items[N_CB];
    uint32_t n_done = 0, mixed_steps = 0;
    for (uint32_t step = 0; n_done < N_CB && step < 400; step++) {
        uint32_t ni = 0;
        bool has_prefill = false, has_decode = false;
        for (int q = 0; q < N_CB; q++) {
            cb_req *r = &rq[q];
            if (r->done || step < r->start) continue;
            if (r->fed == 0 && r->s.kv.n_pos == 0 && r->s.lease.node == NULL) {
                kp_eng_report rep;
                CHECK_MSG(kp_eng_begin(e, r->t, r->n, &r->s, &rep, &err) == KP_OK, "%s", err.msg);
                r->fed = rep.reused_tokens;
            }
            kp_eng_item *it = &items[ni++];
            memset(it, 0, sizeof *it);
            it->seq = &r->s;
            if (r->fed < r->n) {
                uint32_t c = 1 + rnd(20);
                if (c > r->n - r->fed) c = r->n - r->fed;
                it->tokens = r->t + r->fed;
                it->n = c;
                it->logits = r->fed + c == r->n ? r->logits : NULL;
                has_prefill = true;
            } else {
                it->tokens = &r->next;
                it->n = 1;
                it->logits = r->logits;
                has_decode = true;
            }
        }
        if (!ni) continue;
        mixed_steps += has_prefill && has_decode;
        CHECK_MSG(kp_eng_step(e, items, ni, &err) == KP_OK, "%s", err.msg);
        for (uint32_t i = 0; i < ni; i++) {
            CHECK_MSG(items[i].status == KP_OK, "step %u item %u: %s", step, i, items[i].err.msg);
            cb_req *r = NULL;
            for (int q = 0; q < N_CB; q++)
                if (&rq[q].s == items[i].seq) r = &rq[q];
            if (r->fed < r->n) {
                r->fed += items[i].n;
                if (r->fed < r->n) continue;
            }
            int32_t tok = kp_argmax(r->logits, (int32_t)nv);
            CHECK_MSG(tok == r->want[r->gen], "request %ld token %u: %d, alone %d", (long)(r - rq), r->gen, tok,
                      r->want[r->gen]);
            r->t[r->n + r->gen] = tok;
            r->next = tok;
            if (++r->gen == CB_GEN) {
                CHECK(kp_eng_finish(e, &r->s, r->t, r->n + r->gen, NULL, &err) == KP_OK);
                r->done = true;
                n_done++;
            }
        }
        CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    }
    CHECK_EQ_INT(n_done, N_CB);
    CHECK(mixed_steps > 0);
    kp_eng_stats ps;
    kp_eng_get_stats(e, &ps);
    if (budget_blocks < 64) CHECK_MSG(ps.n_evictions > 0, "budget of %llu blocks: no eviction",
                                      (unsigned long long)budget_blocks);
    /* a bad item is left out, the others run */
    kp_eng_seq s1 = {0}, s2 = {0};
    int32_t good[2] = {1, 2}, bad[1] = {(int32_t)nv};
    CHECK(kp_eng_clear(e, &err) == KP_OK); /* nothing cached: s1 starts empty */
    CHECK(kp_eng_begin(e, good, 2, &s1, NULL, &err) == KP_OK);
    CHECK_EQ_INT(kp_eng_seq_len(&s1), 0);
    kp_eng_item two[3] = {{&s1, good, 2, lr, KP_OK, {0}, false}, {&s2, bad, 1, NULL, KP_OK, {0}, false}, {&s1, good, 1, NULL, KP_OK, {0}, false}};
    CHECK(kp_eng_step(e, two, 3, &err) == KP_OK);
    CHECK(two[0].status == KP_OK && two[1].status == KP_EINVAL && two[2].status == KP_EINVAL);
    CHECK_EQ_INT(kp_eng_seq_len(&s1), 2);
    CHECK_EQ_INT(kp_eng_seq_len(&s2), 0);
    kp_eng_seq_abort(e, &s1);
    kp_eng_seq_abort(e, &s2);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    CHECK_EQ_INT(used_bytes(e), 0);
    for (int q = 0; q < N_CB; q++) free(rq[q].logits);
    free(lr);
    kp_eng_free(e);
    kp_eng_free(ref);
    kp_threads_free(pool);
    kp_model_free(m);
}

static void test_batched_equals_alone(void) {
    batched_case("models/stories260K.gguf", 0x5eed0001ull, 4096);
    batched_case("tests/data/models/gen-qwen2-q8_0.gguf", 0x5eed0002ull, 4096);
    batched_case("models/stories260K.gguf", 0x5eed0003ull, 20); /* evictions */
    batched_case("tests/data/models/gen-gemma3-f32.gguf", 0x5eed0004ull, 4096);
    batched_case("tests/data/models/gen-gemma3-f16.gguf", 0x5eed0003ull, 20); /* the stories case's requests */
    batched_case("tests/data/models/gen-qwen3moe-f16.gguf", 0x5eed0005ull, 4096);
    batched_case("tests/data/models/gen-qwen3moe-q8_0.gguf", 0x5eed0003ull, 20); /* evictions */
    batched_case("tests/data/models/gen-gpt-oss-mxfp4.gguf", 0x5eed0006ull, 4096);
    batched_case("tests/data/models/gen-gpt-oss-f32.gguf", 0x5eed0003ull, 20); /* evictions */
}

/* A prefix index fed by hand the way the engine feeds its own: match,
 * acquire the reusable rows, blocks for the rest (no K/V is computed: the
 * index only counts blocks), insert the whole sequence, release. */
typedef struct {
    kp_kvpool *pool;
    kp_pfx_index *idx;
} mirror;

static void mirror_add(mirror *x, const int32_t *t, uint32_t n) {
    kp_kvseq seq = {0};
    kp_pfx_lease lease = {0};
    kp_pfx_match_result mr;
    kp_pfx_match(x->idx, t, n, &mr);
    CHECK(kp_pfx_acquire(x->idx, t, mr.n_reuse, &seq, &lease, NULL) == KP_OK);
    CHECK(kp_kvseq_reserve(&seq, x->pool, n, NULL) == KP_OK);
    seq.n_pos = n;
    CHECK(kp_pfx_insert(x->idx, t, n, &seq, NULL, NULL, NULL) == KP_OK);
    kp_pfx_release(x->idx, &lease);
    kp_kvseq_release(&seq, x->pool);
}

static void same_top(kp_engine *e, mirror *x, const char *when) {
    kp_eng_prefix a[8];
    kp_pfx_prefix_info b[8];
    uint32_t na = 99, nb = 98;
    CHECK(kp_eng_top(e, a, 8, &na, NULL) == KP_OK);
    CHECK(kp_pfx_top(x->idx, b, 8, &nb, NULL) == KP_OK);
    CHECK_MSG(na == nb, "%s: %u prefixes vs %u", when, na, nb);
    for (uint32_t i = 0; i < na && i < nb; i++)
        CHECK_MSG(a[i].hash == b[i].hash && a[i].n_tokens == b[i].n_tokens && a[i].n_head == b[i].n_head &&
                      !memcmp(a[i].head, b[i].head, b[i].n_head * sizeof(int32_t)) && a[i].bytes == b[i].bytes &&
                      a[i].own_bytes == b[i].own_bytes && a[i].n_holders == b[i].n_holders &&
                      a[i].pinned == b[i].pinned && a[i].last_used == b[i].last_used && a[i].hits == b[i].hits,
                  "%s: prefix %u differs", when, i);
    kp_eng_stats es;
    kp_pfx_stats ps;
    kp_eng_get_stats(e, &es);
    kp_pfx_get_stats(x->idx, &ps);
    CHECK_MSG(es.prefix_cache && es.budget_bytes == ps.budget_bytes && es.used_bytes == ps.used_bytes &&
                  es.free_bytes == ps.free_bytes && es.block_bytes == ps.block_bytes &&
                  es.index_bytes == ps.index_bytes && es.pinned_bytes == ps.pinned_bytes &&
                  es.pinned_cap_bytes == ps.pinned_cap_bytes && es.shared_bytes == ps.shared_bytes &&
                  es.saved_bytes == ps.saved_bytes && es.n_nodes == ps.n_nodes && es.n_leaves == ps.n_leaves &&
                  es.n_pins == ps.n_pins && es.n_leases == ps.n_leases && es.cached_tokens == ps.cached_tokens &&
                  es.n_evictions == ps.n_evictions && es.n_lookups == ps.n_lookups && es.n_hits == ps.n_hits &&
                  es.reused_tokens == ps.reused_tokens,
              "%s: the memory bills differ", when);
}

/* kp_eng_top / kp_eng_pin / kp_eng_unpin / kp_eng_expire / kp_eng_get_stats
 * answer what kp_pfx_* answer for an index that saw the same sequences. */
/* kp_eng_room_for counts what a prefill can really get: with need equal to
 * free + evictable the prefill succeeds, with one block more it fails
 * (KP_EFULL); blocks a running sequence's lease holds, pinned blocks and
 * the blocks the prefill itself shares are not counted; alone, the cached
 * rows of its own path past what it shares are (the engine drops its own
 * hold when nothing else can be evicted). */
static void room_fill(int32_t *t, uint32_t n, int32_t first) {
    for (uint32_t i = 0; i < n; i++) t[i] = i ? 3 + (int32_t)rnd(500) : first;
}

/* The prefill of t[0..n) gets its blocks (then it is released, uncached). */
static kp_status room_try(kp_engine *e, const int32_t *t, uint32_t n) {
    kp_eng_seq s = {0};
    kp_error err;
    kp_status st = kp_eng_prefill(e, t, n, &s, NULL, NULL, &err);
    kp_eng_seq_abort(e, &s);
    return st;
}

static void test_room_for(void) {
    kp_error err = {0};
    kp_model *m;
    kp_threads *pool;
    if (!load_stories(&m, &pool)) return;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 16;
    kp_eng_config c = {KP_DTYPE_F32, 16, bb * 8, 256, false, NULL, KP_DTYPE_F32, false, 0, 0}; /* 8 blocks, pins up to 4 */
    kp_engine *e = NULL;
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    rng_state = 0x5eed;
    static int32_t a[40], b[50], cc[129], d[129];
    room_fill(a, 40, 1);
    kp_eng_seq s = {0};
    CHECK(kp_eng_prefill(e, a, 40, &s, NULL, NULL, &err) == KP_OK); /* cached: blocks of 0..15, 16..31, 32..39 */
    CHECK(kp_eng_finish(e, &s, a, 40, NULL, &err) == KP_OK);
    memcpy(b, a, sizeof a);
    room_fill(b + 40, 10, 7);
    kp_eng_room r;
    CHECK(kp_eng_room_for(e, b, 50, true, &r, &err) == KP_OK);
    CHECK(r.reused_tokens == 40 && r.need_blocks == 2 && r.free_blocks == 5 && r.evictable_blocks == 0);
    CHECK(kp_eng_room_for(e, b, 50, false, &r, &err) == KP_OK); /* alone: the partial block 32..39 could go */
    CHECK(r.reused_tokens == 40 && r.need_blocks == 2 && r.free_blocks == 5 && r.evictable_blocks == 1);
    room_fill(cc, 129, 2);
    CHECK(kp_eng_room_for(e, cc, 64, true, &r, &err) == KP_OK);
    CHECK(r.reused_tokens == 0 && r.need_blocks == 4 && r.free_blocks == 5 && r.evictable_blocks == 3);
    /* a sequence holding the cached path (it took 0..39, copying the partial block) */
    kp_eng_report rep;
    CHECK(kp_eng_begin(e, b, 50, &s, &rep, &err) == KP_OK && rep.reused_tokens == 40);
    CHECK(kp_eng_room_for(e, cc, 64, true, &r, &err) == KP_OK);
    CHECK_MSG(r.free_blocks == 4 && r.evictable_blocks == 0, "free %u evictable %u", r.free_blocks, r.evictable_blocks);
    CHECK(room_try(e, cc, 64) == KP_OK);     /* 4 blocks: what the count says */
    CHECK(room_try(e, cc, 65) == KP_EFULL);  /* one more: no */
    kp_eng_seq_abort(e, &s);
    /* pinned rows are not evictable */
    uint64_t id = 0;
    CHECK(kp_eng_pin(e, a, 40, 0, 1000, &id, &err) == KP_OK);
    CHECK(kp_eng_room_for(e, cc, 80, false, &r, &err) == KP_OK);
    CHECK(r.need_blocks == 5 && r.free_blocks == 5 && r.evictable_blocks == 0);
    CHECK(room_try(e, cc, 80) == KP_OK);
    CHECK(room_try(e, cc, 81) == KP_EFULL);
    CHECK(kp_eng_unpin(e, id, &err) == KP_OK);
    /* alone, sharing 20 positions of the cached 40: block 0 stays shared,
     * the blocks of 16..39 could go once its own hold is dropped */
    memcpy(d, a, 20 * sizeof *d);
    room_fill(d + 20, 109, 9);
    CHECK(kp_eng_room_for(e, d, 128, false, &r, &err) == KP_OK);
    CHECK_MSG(r.reused_tokens == 20 && r.need_blocks == 7 && r.free_blocks == 5 && r.evictable_blocks == 2,
              "reused %u need %u free %u evictable %u", r.reused_tokens, r.need_blocks, r.free_blocks,
              r.evictable_blocks);
    CHECK(kp_eng_room_for(e, d, 128, true, &r, &err) == KP_OK); /* beside others, its path would be held */
    CHECK(r.need_blocks == 7 && r.evictable_blocks == 0);
    CHECK(room_try(e, d, 128) == KP_OK); /* (it evicted the cached 40 on the way) */
    CHECK(kp_eng_prefill(e, a, 40, &s, NULL, NULL, &err) == KP_OK);
    CHECK(kp_eng_finish(e, &s, a, 40, NULL, &err) == KP_OK);
    CHECK(kp_eng_room_for(e, d, 129, false, &r, &err) == KP_OK && r.need_blocks == 8 && r.evictable_blocks == 2);
    CHECK(room_try(e, d, 129) == KP_EFULL);
    CHECK(kp_eng_check(e, &err) == KP_OK);
    /* without a prefix cache: nothing reused or evictable */
    kp_engine *n = NULL;
    kp_eng_config cn = {KP_DTYPE_F32, 16, bb * 8, 256, true, NULL, KP_DTYPE_F32, true, 0, 0};
    CHECK(kp_eng_new(&n, m, pool, NULL, &cn, &err) == KP_OK);
    CHECK(kp_eng_room_for(n, d, 33, false, &r, &err) == KP_OK);
    CHECK(r.reused_tokens == 0 && r.need_blocks == 3 && r.free_blocks == 8 && r.evictable_blocks == 0);
    CHECK(kp_eng_begin(n, d, 40, &s, &rep, &err) == KP_OK);
    CHECK_EQ_INT(kp_eng_seq_blocks_missing(n, &s, 40), 3);
    CHECK_EQ_INT(kp_eng_seq_blocks_missing(n, &s, 0), 0);
    kp_eng_seq_abort(n, &s);
    kp_eng_free(n);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_model_free(m);
}

static void test_cache_operations(void) {
    kp_error err = {0};
    kp_model *m;
    kp_threads *pool;
    if (!load_stories(&m, &pool)) return;
    const kp_hparams *hp = &m->hp;
    uint64_t bb = kp_model_kv_bytes_per_token(hp, KP_DTYPE_F32) * 16;
    kp_pfx_config pc = {bb * 5, 16}; /* pins may hold 5 blocks */
    kp_eng_config c = {KP_DTYPE_F32, 16, bb * 64, 256, false, &pc, KP_DTYPE_F32, false, 0, 0};
    kp_engine *e = NULL;
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    mirror x = {0};
    kp_kvpool_config kc = {hp->n_layer, hp->n_head_kv, hp->head_dim, KP_DTYPE_F32, 16, bb * 64, KP_DTYPE_F32, NULL, 0, 0};
    CHECK(kp_kvpool_new(&x.pool, &kc, &err) == KP_OK);
    CHECK(kp_pfx_new(&x.idx, x.pool, &pc, &err) == KP_OK);
    /* sequences sharing heads, one of more than KP_PFX_HEAD_TOKENS tokens, a
     * full repeat, and eleven leaves of equal length (ties in the listing) */
    static int32_t t[20][80];
    uint32_t len[20];
    for (int k = 0; k < 20; k++) {
        len[k] = k < 3 ? 30 + 20 * (uint32_t)k : 10;
        for (uint32_t i = 0; i < len[k]; i++) t[k][i] = i == 0 ? 1 : k < 3 ? 100 + (int32_t)i : 200 + k * 7 + (int32_t)i;
    }
    memcpy(t[19], t[0], sizeof t[0]);
    len[19] = len[0];
    kp_eng_seq s = {0};
    for (int k = 0; k < 20; k++) {
        CHECK(kp_eng_prefill(e, t[k], len[k], &s, NULL, NULL, &err) == KP_OK);
        CHECK(kp_eng_finish(e, &s, t[k], len[k], NULL, &err) == KP_OK);
        mirror_add(&x, t[k], len[k]);
    }
    same_top(e, &x, "after the sequences");
    kp_eng_prefix one[1];
    uint32_t n1 = 0;
    CHECK(kp_eng_top(e, one, 1, &n1, &err) == KP_OK && n1 == 1 && one[0].n_tokens == 70 &&
          one[0].n_head == KP_PFX_HEAD_TOKENS && !memcmp(one[0].head, t[2], sizeof one[0].head));
    /* pins: the same ids, caps and errors */
    uint64_t ia = 0, ib = 0;
    kp_status sa = kp_eng_pin(e, t[0], 20, 10, 1000, &ia, &err);
    kp_status sb = kp_pfx_pin(x.idx, t[0], 20, 10, 1000, &ib, NULL);
    CHECK(sa == KP_OK && sb == KP_OK && ia == ib && ia > 0);
    uint64_t ja = 0, jb = 0;
    CHECK(kp_eng_pin(e, t[5], 10, 0, 1000, &ja, &err) == KP_OK && kp_pfx_pin(x.idx, t[5], 10, 0, 1000, &jb, NULL) == KP_OK &&
          ja == jb);
    same_top(e, &x, "after two pins");
    uint64_t ka = 0, kb = 0; /* 70 tokens (5 blocks) and the 10-token pin: 6 blocks, over the cap */
    sa = kp_eng_pin(e, t[2], 70, 0, 1000, &ka, &err);
    sb = kp_pfx_pin(x.idx, t[2], 70, 0, 1000, &kb, NULL);
    CHECK_MSG(sa == KP_EFULL && sb == KP_EFULL && ka == 0, "%d %d %s", sa, sb, err.msg);
    int32_t other[3] = {1, 2, 3};
    CHECK(kp_eng_pin(e, other, 3, 0, 1000, &ka, &err) == KP_ENOTFOUND && kp_pfx_pin(x.idx, other, 3, 0, 1000, &kb, NULL) == KP_ENOTFOUND);
    CHECK(kp_eng_pin(e, t[0], 0, 0, 1000, &ka, &err) == KP_EINVAL);
    CHECK(kp_eng_pin(e, t[0], 5, -1, 1000, &ka, &err) == KP_EINVAL);
    same_top(e, &x, "after refused pins");
    /* expiry: the 10 s pin ends at 1010 */
    CHECK_EQ_INT(kp_eng_expire(e, 1009), kp_pfx_expire(x.idx, 1009));
    uint32_t ea = kp_eng_expire(e, 1010), eb = kp_pfx_expire(x.idx, 1010);
    CHECK(ea == 1 && eb == 1);
    CHECK(kp_eng_unpin(e, ia, &err) == KP_ENOTFOUND && kp_pfx_unpin(x.idx, ib, NULL) == KP_ENOTFOUND);
    same_top(e, &x, "after expiry");
    CHECK(kp_eng_unpin(e, ja, &err) == KP_OK && kp_pfx_unpin(x.idx, jb, NULL) == KP_OK);
    CHECK(kp_eng_unpin(e, ja, &err) == KP_ENOTFOUND);
    same_top(e, &x, "after unpin");
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    kp_pfx_free(x.idx);
    kp_kvpool_free(x.pool);
    kp_eng_free(e);
    /* without a prefix cache: nothing listed, nothing to pin */
    kp_eng_config off = {KP_DTYPE_F32, 16, bb * 8, 128, true, NULL, KP_DTYPE_F32, true, 0, 0};
    CHECK(kp_eng_new(&e, m, pool, NULL, &off, &err) == KP_OK);
    CHECK(kp_eng_top(e, one, 1, &n1, &err) == KP_OK && n1 == 0);
    CHECK(kp_eng_pin(e, t[0], 5, 0, 0, &ka, &err) == KP_EUNSUPPORTED && ka == 0);
    CHECK(kp_eng_unpin(e, 1, &err) == KP_ENOTFOUND);
    CHECK_EQ_INT(kp_eng_expire(e, 1 << 30), 0);
    kp_eng_stats es;
    kp_eng_get_stats(e, &es);
    CHECK(!es.prefix_cache && es.kv_type == KP_DTYPE_F32 && es.block_size == 16 &&
          es.bytes_per_token == kp_model_kv_bytes_per_token(hp, KP_DTYPE_F32) && es.block_bytes == bb &&
          es.budget_bytes == bb * 8 && es.used_bytes == 0 && es.free_bytes == bb * 8);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* What kp_eng_generate's hooks saw. */
typedef struct {
    int prefills, steps, decodes;
    uint32_t reused, last_len;
    int32_t tokens[64];
    bool ordered;
} hooks_seen;

static void seen_prefill(void *c, const kp_eng_report *r) {
    hooks_seen *h = c;
    h->prefills++;
    h->reused = r->reused_tokens;
}

static void seen_step(void *c, const kp_gen_out *o) {
    hooks_seen *h = c;
    if (o->token >= 0 && h->steps < 64) h->tokens[h->steps++] = o->token;
}

static void seen_decode(void *c, int32_t tok, uint32_t seq_len) {
    hooks_seen *h = c;
    h->ordered &= h->last_len == 0 || seq_len == h->last_len + 1;
    h->ordered &= h->decodes < h->steps && tok == h->tokens[h->decodes];
    h->last_len = seq_len;
    h->decodes++;
}

/* kp_eng_generate gives the greedy tokens of prefill + decode by hand, its
 * hooks see every step, decode_last leaves the whole answer in the
 * sequence, and a rerun of the indexed prompt reuses it; all_logits,
 * kp_eng_append, kp_eng_seq_truncate and the attention probe. */
static void test_generate_and_feeding(void) {
    kp_error err = {0};
    kp_model *m;
    kp_threads *pool;
    kp_tok_vocab *v = NULL;
    if (!load_stories(&m, &pool)) return;
    CHECK(kp_tok_vocab_load(&v, m->file, &err) == KP_OK);
    uint32_t nv = m->hp.n_vocab;
    kp_eng_config cr = {KP_DTYPE_F32, 16, 0, 256, true, NULL, KP_DTYPE_F32, true, 0, 0}, cc = {KP_DTYPE_F32, 16, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 0};
    cc.budget_bytes = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * 256 * 4;
    kp_engine *ref = NULL, *e = NULL;
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, m, pool, NULL, &cc, &err) == KP_OK);
    int32_t p[20];
    for (int i = 0; i < 20; i++) p[i] = i ? 30 + 7 * i : 1;
    /* by hand: greedy on the reference */
    float *lg = malloc(nv * sizeof *lg), *all = malloc(20 * nv * sizeof *all), *one = malloc(nv * sizeof *one);
    int32_t want[12];
    kp_eng_seq sr = {0};
    CHECK(kp_eng_prefill(ref, p, 20, &sr, lg, NULL, &err) == KP_OK);
    for (int k = 0; k < 12; k++) {
        want[k] = kp_argmax(lg, (int32_t)nv);
        if (k < 11) CHECK(kp_eng_decode(ref, &sr, want[k], lg, &err) == KP_OK);
    }
    kp_eng_seq_abort(ref, &sr);
    kp_gen_params gp = {kp_sampler_defaults(), 12, 256, 0, true, NULL, 0, false};
    gp.sp.temp = 0;
    for (int decode_last = 0; decode_last < 2; decode_last++) {
        for (int run = 0; run < 2; run++) { /* the second run finds the first one indexed */
            kp_gen *gen = NULL;
            CHECK(kp_gen_new(&gen, v, p, 20, &gp, &err) == KP_OK);
            hooks_seen h = {.ordered = true};
            kp_eng_gen_opts o = {&h, seen_prefill, seen_step, seen_decode, 0, decode_last};
            kp_eng_seq s = {0};
            kp_eng_report r;
            CHECK_MSG(kp_eng_generate(e, &s, gen, &o, &r, &err) == KP_OK, "%s", err.msg);
            CHECK(!memcmp(kp_gen_tokens(gen) + 20, want, sizeof want) && kp_gen_n_generated(gen) == 12);
            CHECK(h.prefills == 1 && h.steps == 12 && !memcmp(h.tokens, want, sizeof want) && h.ordered);
            CHECK_EQ_INT(h.decodes, decode_last ? 12 : 11);
            CHECK_EQ_INT(kp_eng_seq_len(&s), 20 + (decode_last ? 12 : 11));
            CHECK_EQ_INT(r.reused_tokens, h.reused);
            CHECK_EQ_INT(r.reused_tokens, run == 0 && decode_last == 0 ? 0 : 19); /* a full hit: n - 1 */
            CHECK(kp_eng_generate(e, &s, gen, &o, NULL, &err) == KP_EINVAL); /* it ran already */
            CHECK(kp_eng_finish(e, &s, kp_gen_tokens(gen), kp_gen_n_tokens(gen), NULL, &err) == KP_OK);
            kp_gen_free(gen);
        }
    }
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    CHECK_EQ_INT(st.cached_tokens, 32); /* the whole answer of the decode_last runs */
    /* all_logits: every position's logits, as decoding one by one gives them */
    kp_eng_seq s = {0};
    kp_eng_item it = {&s, p, 20, all, KP_OK, {0}, true};
    CHECK(kp_eng_step(ref, &it, 1, &err) == KP_OK && it.status == KP_OK && kp_eng_seq_len(&s) == 20);
    kp_eng_seq_abort(ref, &s);
    for (int k = 0; k < 20; k++) {
        CHECK(kp_eng_decode(ref, &s, p[k], one, &err) == KP_OK);
        CHECK_MSG(rel_diff(all + (size_t)k * nv, one, nv) <= 1e-5, "position %d", k);
    }
    kp_eng_seq_abort(ref, &s);
    /* two items asking: the rows go to each */
    kp_eng_seq s2 = {0};
    float *all2 = malloc(20 * nv * sizeof *all2);
    kp_eng_item two[2] = {{&s, p, 20, all2, KP_OK, {0}, true}, {&s2, p, 7, one, KP_OK, {0}, false}};
    CHECK(kp_eng_step(ref, two, 2, &err) == KP_OK && two[0].status == KP_OK && two[1].status == KP_OK);
    CHECK(rel_diff(all2, all, 20 * nv) <= 1e-5 && rel_diff(one, all + 6 * (size_t)nv, nv) <= 1e-5);
    kp_eng_seq_abort(ref, &s);
    kp_eng_seq_abort(ref, &s2);
    /* append in batches, truncate, append again: the same logits */
    CHECK(kp_eng_append(ref, &s, p, 20, 3, lg, &err) == KP_OK && kp_eng_seq_len(&s) == 20);
    CHECK(rel_diff(lg, all + 19 * (size_t)nv, nv) <= 1e-5);
    CHECK(kp_eng_seq_truncate(ref, &s, 8, &err) == KP_OK && kp_eng_seq_len(&s) == 8);
    CHECK(kp_eng_append(ref, &s, p + 8, 12, 0, one, &err) == KP_OK && kp_eng_seq_len(&s) == 20);
    CHECK(rel_diff(one, all + 19 * (size_t)nv, nv) <= 1e-5);
    int32_t badt[1] = {(int32_t)nv};
    CHECK(kp_eng_append(ref, &s, badt, 1, 0, NULL, &err) == KP_EINVAL && kp_eng_seq_len(&s) == 20);
    /* generate onto a sequence that holds the prompt's head: the same tokens */
    CHECK(kp_eng_seq_truncate(ref, &s, 13, &err) == KP_OK);
    kp_gen *gen = NULL;
    CHECK(kp_gen_new(&gen, v, p, 20, &gp, &err) == KP_OK);
    kp_eng_report r;
    CHECK(kp_eng_generate(ref, &s, gen, NULL, &r, &err) == KP_OK);
    CHECK(r.reused_tokens == 13 && r.computed_tokens == 7 && !memcmp(kp_gen_tokens(gen) + 20, want, sizeof want));
    kp_gen_free(gen);
    CHECK(kp_gen_new(&gen, v, p, 20, &gp, &err) == KP_OK);
    CHECK(kp_eng_generate(ref, &s, gen, NULL, NULL, &err) == KP_EINVAL); /* holds more than the prompt */
    kp_gen_free(gen);
    kp_eng_seq_abort(ref, &s);
    CHECK(kp_eng_seq_truncate(e, &s, 0, &err) == KP_EUNSUPPORTED); /* blocks may be shared with the index */
    /* the attention probe: weights of the last token over every position */
    kp_eng_set_attn_probe(ref, 0, 1);
    CHECK(kp_eng_append(ref, &s, p, 20, 0, NULL, &err) == KP_OK);
    int32_t np = 0;
    const float *w = kp_eng_attn_probe(ref, &np);
    double sum = 0;
    for (int32_t k = 0; w && k < np; k++) sum += w[k];
    CHECK(w && np == 20 && fabs(sum - 1) < 1e-4);
    kp_eng_set_attn_probe(ref, -1, 0);
    CHECK(kp_eng_decode(ref, &s, 5, NULL, &err) == KP_OK && kp_eng_attn_probe(ref, &np) == NULL);
    kp_eng_seq_abort(ref, &s);
    CHECK_EQ_INT(used_bytes(ref), 0);
    free(lg);
    free(all);
    free(all2);
    free(one);
    kp_eng_free(e);
    kp_eng_free(ref);
    kp_threads_free(pool);
    kp_tok_vocab_free(v);
    kp_model_free(m);
}

/* Forks of a 37-token prompt (2 whole blocks of 16 and a partial one). */
static void fork_for(kp_model *m, kp_threads *pool, kp_dtype kv) {
    kp_error err = {0};
    for (int cache = 0; cache < 2; cache++) {
        kp_engine *e = NULL;
        kp_eng_config c = {kv, 16, 0, 256, !cache, NULL, kv, !cache, 0, 0};
        CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
        uint32_t nv = m->hp.n_vocab;
        float *l0 = malloc(nv * sizeof *l0), *l1 = malloc(nv * sizeof *l1), *l2 = malloc(nv * sizeof *l2),
              *ref = malloc(nv * sizeof *ref);
        int32_t t[40];
        for (int i = 0; i < 40; i++) t[i] = i == 0 ? 1 : 50 + 3 * i;
        kp_eng_seq a = {0}, b = {0}, d = {0}, r = {0};
        CHECK(kp_eng_prefill(e, t, 37, &a, l0, NULL, &err) == KP_OK);
        uint64_t before = used_bytes(e);
        CHECK_EQ_INT(kp_eng_fork_blocks(e, 37), 1);
        CHECK_EQ_INT(kp_eng_fork_blocks(e, 32), 0);
        CHECK(kp_eng_fork(e, &a, &b, &err) == KP_OK);
        CHECK(kp_eng_fork(e, &a, &d, &err) == KP_OK);
        kp_eng_stats st;
        kp_eng_get_stats(e, &st);
        CHECK_EQ_INT(st.used_bytes, before + 2 * st.block_bytes); /* only the two partial copies are new */
        CHECK_EQ_INT(kp_eng_seq_len(&b), 37);
        CHECK(kp_eng_fork(e, &a, &b, &err) == KP_EINVAL); /* b is not empty */
        /* different tokens into a and b at position 37 (the copied block), the same into d */
        CHECK(kp_eng_decode(e, &a, t[37], l0, &err) == KP_OK);
        CHECK(kp_eng_decode(e, &b, 9, l1, &err) == KP_OK);
        CHECK(kp_eng_decode(e, &d, t[37], l2, &err) == KP_OK);
        CHECK(kp_eng_prefill(e, t, 38, &r, ref, NULL, &err) == KP_OK);
        CHECK_MSG(rel_diff(l0, ref, nv) < 1e-5 && rel_diff(l2, ref, nv) < 1e-5, "fork: %g %g", rel_diff(l0, ref, nv),
                  rel_diff(l2, ref, nv));
        CHECK(rel_diff(l1, ref, nv) > 1e-3); /* another token, other logits: b wrote its own block */
        kp_eng_seq_abort(e, &r);
        CHECK(kp_eng_decode(e, &a, t[38], l0, &err) == KP_OK); /* a still sees its own token at 37 */
        CHECK(kp_eng_prefill(e, t, 39, &r, ref, NULL, &err) == KP_OK);
        CHECK(rel_diff(l0, ref, nv) < 1e-5);
        kp_eng_seq_abort(e, &r);
        CHECK(kp_eng_finish(e, &a, t, 39, NULL, &err) == KP_OK);
        kp_eng_seq_abort(e, &b);
        kp_eng_seq_abort(e, &d);
        CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
        CHECK(kp_eng_clear(e, &err) == KP_OK);
        CHECK_EQ_INT(used_bytes(e), 0);
        kp_eng_free(e);
        free(l0);
        free(l1);
        free(l2);
        free(ref);
    }
}

static void test_fork(void) {
    kp_error err = {0};
    kp_model *m;
    kp_threads *pool;
    if (!load_stories(&m, &pool)) return;
    fork_for(m, pool, KP_DTYPE_F32);
    kp_model_free(m);
    /* CoW of a partial block of Q8_0 and of Q4_0 rows (head_dim 32) */
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-llama-gqa-f32.gguf"), &err) == KP_OK);
    if (m) {
        fork_for(m, pool, KP_DTYPE_Q8_0);
        fork_for(m, pool, KP_DTYPE_Q4_0);
    }
    kp_model_free(m);
    /* forks of a sequence longer than the window */
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-gemma3-f32.gguf"), &err) == KP_OK);
    if (m) fork_for(m, pool, KP_DTYPE_F32);
    kp_model_free(m);
    /* forks on experts */
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-qwen3moe-f32.gguf"), &err) == KP_OK);
    if (m) fork_for(m, pool, KP_DTYPE_F32);
    kp_model_free(m);
    /* forks on gpt-oss (sinks, windows, MXFP4 experts) */
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-gpt-oss-mxfp4.gguf"), &err) == KP_OK);
    if (m) fork_for(m, pool, KP_DTYPE_F32);
    kp_model_free(m);
    /* forks on qwen35: the recurrent state is copied with the rows */
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-qwen35-f32.gguf"), &err) == KP_OK);
    if (m) fork_for(m, pool, KP_DTYPE_F32);
    kp_model_free(m);
    /* ... and on qwen35moe, with experts */
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-qwen35moe-f32.gguf"), &err) == KP_OK);
    if (m) fork_for(m, pool, KP_DTYPE_F32);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* Prefill of t[0..n) on e and on the cache-off engine cold: the logits
 * within 1e-5 relative and the same greedy token; *r gets e's report. The
 * sequence of e stays in *s (prompt only). */
static void same_as_cold(kp_engine *e, kp_engine *cold, const int32_t *t, uint32_t n, kp_eng_seq *s, kp_eng_report *r,
                         float *l0, float *l1, uint32_t nv, const char *what) {
    kp_error err = {0};
    kp_eng_seq c = {0};
    CHECK_MSG(kp_eng_prefill(e, t, n, s, l0, r, &err) == KP_OK, "%s: %s", what, err.msg);
    CHECK_MSG(kp_eng_prefill(cold, t, n, &c, l1, NULL, &err) == KP_OK, "%s: %s", what, err.msg);
    double d = rel_diff(l0, l1, nv);
    CHECK_MSG(d <= 1e-5, "%s: logits differ by %g relative", what, d);
    CHECK_MSG(kp_argmax(l0, (int32_t)nv) == kp_argmax(l1, (int32_t)nv), "%s: greedy differs", what);
    kp_eng_seq_abort(cold, &c);
}

/* Greedy answer of k tokens on s (e), then kp_eng_finish of prompt + answer
 * (t[0..n) grows by k: t must have room). */
static uint32_t answer_and_finish(kp_engine *e, kp_eng_seq *s, int32_t *t, uint32_t n, uint32_t k, float *l, uint32_t nv) {
    kp_error err = {0};
    for (uint32_t i = 0; i < k; i++) {
        t[n] = kp_argmax(l, (int32_t)nv);
        CHECK_MSG(kp_eng_decode(e, s, t[n], l, &err) == KP_OK, "%s", err.msg);
        n++;
    }
    CHECK_MSG(kp_eng_finish(e, s, t, n, NULL, &err) == KP_OK, "%s", err.msg);
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    return n;
}

/* State checkpoints on a model with gated delta-net layers, case by case,
 * each against a cache-off engine (logits within 1e-5, the same greedy token):
 * a continued conversation resumes at the previous turn's end; an edit
 * inside a block resumes at the snapshot before it (state_recomputed_tokens
 * the rest of the match, the cache report's state_cut_from); a divergence
 * exactly at a snapshot recomputes nothing; n > 1 forks each resume at
 * their own end; a pin gets a snapshot at its end (computed at pin time)
 * and keeps it under pressure while the others are evicted; a fork inside
 * the run only at a snapshot, and a cut back, are refused. (Snapshots in
 * the tiers below RAM: test_tiers.c's test_recurrent_disk and
 * test_recurrent_redis.) */
static void recurrent_engine_on(const char *rel) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (kp_model_load(&m, harness_path(rel), &err) != KP_OK ||
        kp_threads_new(&pool, 2, &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        kp_model_free(m);
        return;
    }
    kp_engine *e = NULL, *cold = NULL;
    kp_eng_config c = {KP_DTYPE_F16, 16, 0, 256, false, NULL, KP_DTYPE_F16, false, 0, 32};
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    c.no_prefix_cache = true;
    CHECK(kp_eng_new(&cold, m, pool, NULL, &c, &err) == KP_OK);
    if (!e || !cold) goto done;
    CHECK(kp_eng_recurrent(e));
    uint32_t nv = m->hp.n_vocab;
    float *l0 = malloc(nv * sizeof *l0), *l1 = malloc(nv * sizeof *l1);
    int32_t t[200], u[200];
    for (int i = 0; i < 200; i++) t[i] = i == 0 ? 1 : 40 + 7 * i % 400;
    kp_eng_seq a = {0}, b = {0}, f = {0};
    kp_eng_report r;
    kp_eng_stats st;
    /* turn 1: 40 tokens (snapshots at 32 and 40, the prompt's end), 5 answered (45, the end) */
    same_as_cold(e, cold, t, 40, &a, &r, l0, l1, nv, "turn 1");
    CHECK(r.recurrent && r.reused_tokens == 0 && r.computed_tokens == 40);
    /* a fork inside the run: at a's snapshot (32, pending) or its end (40) only; the fork at 32
     * plus the 8 tokens after it gives the cold logits of all 40 */
    CHECK(kp_eng_fork_prefix(e, &a, 37, &f, &err) == KP_EUNSUPPORTED && strstr(err.msg, "recurrent"));
    CHECK_EQ_INT(kp_eng_fork_point(e, &a, 37), 32);
    CHECK_EQ_INT(kp_eng_fork_point(e, &a, 40), 40);
    CHECK_EQ_INT(kp_eng_fork_point(e, &a, 31), 0);
    CHECK_MSG(kp_eng_fork_prefix(e, &a, 32, &f, &err) == KP_OK, "%s", err.msg);
    {
        float *lf = malloc(nv * sizeof *lf);
        CHECK(lf && kp_eng_append(e, &f, t + 32, 8, 0, lf, &err) == KP_OK);
        CHECK_MSG(lf && rel_diff(lf, l1, nv) <= 1e-5, "fork at 32 + 8: logits differ by %g", lf ? rel_diff(lf, l1, nv) : 1.0);
        free(lf);
        kp_eng_seq_abort(e, &f);
    }
    uint32_t n1 = answer_and_finish(e, &a, t, 40, 5, l0, nv);
    kp_eng_get_stats(e, &st);
    CHECK_EQ_INT(st.n_states, 3);
    CHECK(st.state_every == 32 && st.state_bytes == kp_model_rec_state_floats(&m->hp) * 4);
    CHECK(st.state_block_bytes >= st.state_bytes && st.index_state_bytes == 3 * st.state_block_bytes);
    /* turn 2 extends prompt + answer: resumes at 45, nothing recomputed */
    for (uint32_t i = n1; i < n1 + 20; i++) t[i] = 50 + 3 * (int32_t)i % 300;
    same_as_cold(e, cold, t, n1 + 20, &b, &r, l0, l1, nv, "turn 2");
    CHECK_EQ_INT(r.reused_tokens, n1);
    CHECK_EQ_INT(r.state_recomputed_tokens, 0);
    answer_and_finish(e, &b, t, n1 + 20, 4, l0, nv);
    /* an edit at 37 (inside a block, between the snapshots at 32 and 40): resumes at 32 */
    memcpy(u, t, sizeof u);
    u[37] = 7;
    same_as_cold(e, cold, u, 50, &b, &r, l0, l1, nv, "edit at 37");
    CHECK(r.reused_tokens == 32 && r.state_recomputed_tokens == 5 && r.state_cut_from == 37);
    CHECK(r.diverged_at_token == 37 && r.computed_tokens == 18);
    kp_eng_probe(e, u, 50, &r); /* the probe says the same */
    CHECK(r.reused_tokens == 32 && r.state_recomputed_tokens == 5);
    answer_and_finish(e, &b, u, 50, 2, l0, nv);
    /* a divergence exactly at a snapshot (64, a multiple of 32 on turn 2's path) */
    memcpy(u, t, sizeof u);
    u[64] = 9;
    same_as_cold(e, cold, u, 70, &b, &r, l0, l1, nv, "divergence at 64");
    CHECK(r.reused_tokens == 64 && r.state_recomputed_tokens == 0 && r.state_cut_from == 0);
    kp_eng_seq_abort(e, &b);
    /* a divergence at 20: no snapshot before it, everything computed */
    memcpy(u, t, sizeof u);
    u[20] = 11;
    same_as_cold(e, cold, u, 30, &b, &r, l0, l1, nv, "divergence at 20");
    CHECK(r.reused_tokens == 0 && r.state_recomputed_tokens == 20 && r.state_cut_from == 20);
    kp_eng_seq_abort(e, &b);
    /* forks (n = 2): each choice answers apart, each next turn resumes at its own end */
    memcpy(u, t, sizeof u);
    u[90] = 13;
    same_as_cold(e, cold, u, 100, &a, &r, l0, l1, nv, "fork prompt");
    CHECK(kp_eng_fork(e, &a, &f, &err) == KP_OK);
    int32_t v[200];
    memcpy(v, u, sizeof v);
    u[100] = 21;
    v[100] = 22;
    CHECK(kp_eng_decode(e, &a, u[100], l0, &err) == KP_OK && kp_eng_decode(e, &f, v[100], l1, &err) == KP_OK);
    CHECK(kp_eng_finish(e, &a, u, 101, NULL, &err) == KP_OK && kp_eng_finish(e, &f, v, 101, NULL, &err) == KP_OK);
    u[101] = v[101] = 30;
    same_as_cold(e, cold, u, 110, &a, &r, l0, l1, nv, "fork 0, next turn");
    CHECK(r.reused_tokens == 101 && r.state_recomputed_tokens == 0);
    kp_eng_seq_abort(e, &a);
    same_as_cold(e, cold, v, 110, &a, &r, l0, l1, nv, "fork 1, next turn");
    CHECK(r.reused_tokens == 101 && r.state_recomputed_tokens == 0);
    kp_eng_seq_abort(e, &a);
    /* a pin at 50 (no snapshot there: computed at pin time from the one at 32) */
    uint64_t id = 0;
    CHECK_MSG(kp_eng_pin(e, t, 50, 0, 0, &id, &err) == KP_OK, "%s", err.msg);
    memcpy(u, t, sizeof u);
    u[50] = 17;
    same_as_cold(e, cold, u, 60, &a, &r, l0, l1, nv, "after the pin");
    CHECK(r.reused_tokens == 50 && r.state_recomputed_tokens == 0);
    kp_eng_seq_abort(e, &a);
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    /* pressure: a long prompt of other tokens takes the pool; the pin's snapshot stays */
    kp_eng_get_stats(e, &st);
    uint32_t long_n = 250;
    int32_t w[256];
    for (uint32_t i = 0; i < long_n; i++) w[i] = i == 0 ? 1 : 300 + (int32_t)i % 200;
    for (int k = 0; k < 3; k++) {
        w[1] = 300 + k;
        CHECK(kp_eng_prefill(e, w, long_n, &a, l0, &r, &err) == KP_OK);
        CHECK(kp_eng_finish(e, &a, w, long_n, NULL, &err) == KP_OK);
    }
    kp_eng_get_stats(e, &st);
    CHECK_MSG(st.state_evictions + st.n_evictions > 0, "no eviction under pressure");
    same_as_cold(e, cold, u, 60, &a, &r, l0, l1, nv, "the pin under pressure");
    CHECK(r.reused_tokens == 50);
    kp_eng_seq_abort(e, &a);
    CHECK(kp_eng_unpin(e, id, &err) == KP_OK);
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
    /* cut back (kvpin bench at a depth): refused but to 0, a restart */
    CHECK(kp_eng_prefill(cold, t, 55, &f, l0, NULL, &err) == KP_OK);
    CHECK(kp_eng_seq_truncate(cold, &f, 20, &err) == KP_EUNSUPPORTED && strstr(err.msg, "recurrent state"));
    CHECK(kp_eng_seq_len(&f) == 55);
    CHECK(kp_eng_seq_truncate(cold, &f, 0, &err) == KP_OK && kp_eng_seq_len(&f) == 0);
    CHECK(kp_eng_append(cold, &f, t, 55, 16, l1, &err) == KP_OK); /* in batches of 16: the same logits */
    CHECK(memcmp(l0, l1, nv * sizeof *l0) == 0 || rel_diff(l0, l1, nv) < 1e-5);
    kp_eng_seq_abort(cold, &f);
    CHECK(kp_eng_clear(e, &err) == KP_OK);
    kp_eng_get_stats(e, &st);
    CHECK(st.prefix_cache && st.used_bytes == 0 && st.n_states == 0);
    free(l0);
    free(l1);
done:
    kp_eng_free(e);
    kp_eng_free(cold);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* ... on qwen35, and on qwen35moe (experts and a shared expert in every layer) */
static void test_recurrent_engine(void) {
    recurrent_engine_on("tests/data/models/gen-qwen35-f32.gguf");
    recurrent_engine_on("tests/data/models/gen-qwen35moe-f32.gguf");
}

/* The memory bill with quantized K/V: bytes per token by the formula
 * n_layer x n_head_kv x (K row + V row), a row of head_dim values being
 * head_dim / 32 blocks of 34 (Q8_0) or 18 (Q4_0) bytes, 2 or 4 per value
 * for F16/F32; blocks, budget and the pool's block size follow; the same
 * budget holds 64/34 times the F16 positions with Q8_0. */
static void test_bill_kv_types(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (kp_model_load(&m, harness_path("tests/data/models/gen-llama-gqa-f32.gguf"), &err) != KP_OK ||
        kp_threads_new(&pool, 1, &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        kp_model_free(m);
        return;
    }
    const kp_hparams *hp = &m->hp;
    static const kp_dtype kv[][2] = {{KP_DTYPE_Q8_0, KP_DTYPE_Q8_0}, {KP_DTYPE_Q4_0, KP_DTYPE_Q4_0},
                                     {KP_DTYPE_Q8_0, KP_DTYPE_F16}, {KP_DTYPE_F32, KP_DTYPE_Q4_0},
                                     {KP_DTYPE_F16, KP_DTYPE_F16}};
    uint64_t budget = 1 << 20, f16_blocks = 0, q8_blocks = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t row[2];
        for (int h = 0; h < 2; h++) {
            kp_dtype t = kv[i][h];
            row[h] = t == KP_DTYPE_Q8_0 ? hp->head_dim / 32 * 34 : t == KP_DTYPE_Q4_0 ? hp->head_dim / 32 * 18
                     : t == KP_DTYPE_F16 ? 2 * hp->head_dim : 4 * hp->head_dim;
        }
        uint64_t per = (uint64_t)hp->n_layer * hp->n_head_kv * (row[0] + row[1]);
        CHECK_EQ_INT(kp_model_kv_bytes_per_token_kv(hp, kv[i][0], kv[i][1]), per);
        kp_eng_config c = {kv[i][0], 16, budget, 256, false, NULL, kv[i][1], false, 0, 0};
        kp_engine *e = NULL;
        CHECK_MSG(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK, "%s", err.msg);
        if (!e) continue;
        kp_eng_stats st;
        kp_eng_get_stats(e, &st);
        CHECK(st.kv_type == kv[i][0] && st.kv_type_v == kv[i][1]);
        CHECK_EQ_INT(st.bytes_per_token, per);
        CHECK_EQ_INT(st.block_bytes, 16 * per);
        CHECK_EQ_INT(st.budget_bytes, budget / (16 * per) * 16 * per);
        CHECK_EQ_INT(st.used_bytes, 0);
        if (i == 0) q8_blocks = st.budget_bytes / st.block_bytes;
        if (i == 4) f16_blocks = st.budget_bytes / st.block_bytes;
        /* a prompt takes whole blocks of the new size */
        int32_t t[40];
        for (int k = 0; k < 40; k++) t[k] = k == 0 ? 1 : 7 + k;
        kp_eng_seq s = {0};
        float *l = malloc(hp->n_vocab * sizeof(float));
        CHECK(kp_eng_prefill(e, t, 40, &s, l, NULL, &err) == KP_OK);
        kp_eng_get_stats(e, &st);
        CHECK_EQ_INT(st.used_bytes, 3 * 16 * per);
        kp_eng_seq_abort(e, &s);
        free(l);
        kp_eng_free(e);
    }
    CHECK_MSG(q8_blocks * 34 >= f16_blocks * 64 - 64 * 34, "q8_0 %llu blocks, f16 %llu", (unsigned long long)q8_blocks,
              (unsigned long long)f16_blocks);
    kp_threads_free(pool);
    kp_model_free(m);
}

int main(void) {
    RUN(test_fork);
    RUN(test_batched_equals_alone);
    RUN(test_budget_of_one_sequence);
    RUN(test_reuse_counts);
    RUN(test_node_path);
    RUN(test_cache_operations);
    RUN(test_room_for);
    RUN(test_generate_and_feeding);
    RUN(test_equal_stories);
    RUN(test_equal_qwen2_q8);
    RUN(test_equal_llama_q4_k);
    RUN(test_equal_llama_q6_k);
    RUN(test_equal_qwen3_kv_q8_0);
    RUN(test_equal_llama_kv_q4_0);
    RUN(test_equal_gemma3);
    RUN(test_window_resume);
    RUN(test_window_fork);
    RUN(test_window_turns);
    RUN(test_window_long_turns);
    RUN(test_window_pin_cap);
    RUN(test_window_answer);
    RUN(test_window_messages);
    RUN(test_equal_qwen3moe);
    RUN(test_equal_gptoss);
    RUN(test_bill_kv_types);
    RUN(test_recurrent_engine);
    RUN(test_equal_qwen35);
    RUN(test_equal_qwen35moe);
    return harness_finish("engine");
}
