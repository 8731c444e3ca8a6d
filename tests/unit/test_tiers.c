/*
 * test_tiers.c - the disk tier under the engine (cache/tiers.h,
 * cache/disktier.h).
 *
 * Equivalence: an engine whose RAM budget holds about one sequence, with a
 * disk tier, runs a randomized stream of requests (fresh, extensions of an
 * earlier prompt + answer, exact repeats, prefixes); an engine without a
 * prefix cache runs the same. Prompt logits and greedy continuations must
 * agree within 1e-5 relative, and the tiered engine must reuse at least
 * every whole block of the longest common prefix with a finished
 * sequence (leaving the last position), since every finished block is on
 * disk: with the tiny RAM, most of it comes from disk. The same stream
 * again with Redis as the only tier below RAM (a redis-server of the
 * test's own on a free loopback port): most of it comes from Redis.
 *
 * The tier alone: records written are found again by a new tier on the
 * same directory (no K/V read at open), another fingerprint's folder is
 * ignored and named, a budget below one record refuses writes (counted),
 * a budget of two records keeps the two most recent, and with a queue of
 * one every put is either written or counted as dropped.
 *
 * Under a window budget a block is written before its window rows are
 * dropped, so what reaches disk is what an engine without a budget
 * writes, record for record, and a restore fills in what RAM dropped;
 * through Redis alone the same: every block published, another replica
 * restoring them, a prompt that left RAM's windows resumed from Redis.
 *
 * Recurrent-state snapshots (gen-qwen35: 6 gated delta-net layers of 8),
 * test_recurrent_disk and test_recurrent_redis: what one engine wrote, a
 * new engine (a restart; another replica through Redis) resumes from, at
 * the latest snapshot the tiers hold, with the logits and greedy tokens of
 * a cache-off engine; a damaged snapshot is refused and an earlier one
 * used, or none.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "cache/blockrec.h"
#include "cache/disktier.h"
#include "engine/engine.h"
#include "cache/fingerprint.h"
#include "cache/staterec.h"
#include "harness.h"
#include "kv/kvpool.h"
#include "model/sampler.h"

#define N_REQ 30
#define MAX_LEN 120
#define N_GEN 3

static char tmpdir[256];
static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static double rel_diff(const float *a, const float *b, uint32_t n) {
    double md = 0, mb = 1e-30;
    for (uint32_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return md / mb;
}

typedef struct {
    int32_t t[MAX_LEN + N_GEN];
    uint32_t n;
} tokseq;

/* The bundled model and a pool of n threads; false (a failed check) when
 * either cannot be had. */
static bool load_model(const char *path, kp_model **m, kp_threads **pool, int n) {
    kp_error err = {0};
    if (kp_model_load(m, harness_path(path), &err) != KP_OK || kp_threads_new(pool, n, &err) != KP_OK) {
        CHECK_MSG(false, "%s: %s", path, err.msg);
        kp_model_free(*m);
        *m = NULL;
        return false;
    }
    return true;
}

/* A redis-server of our own on a free loopback port (never the system
 * one): its port, or 0 when it cannot be started. */
static int start_redis(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) return 0;
    int port = ntohs(a.sin_port);
    close(fd);
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no --dir '%s' --daemonize yes "
             "--pidfile '%s/redis.pid' >/dev/null && for i in $(seq 100); do redis-cli -p %d ping 2>/dev/null | "
             "grep -q PONG && exit 0; sleep 0.05; done; exit 1",
             port, tmpdir, tmpdir, port);
    return system(cmd) == 0 ? port : 0;
}

static void stop_redis(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "kill $(cat '%s/redis.pid') 2>/dev/null; sleep 0.2", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not stop redis-server\n");
}

/* The RAM budget holds about one sequence; the blocks come back from the
 * disk tier (redis_port 0) or from Redis alone (no disk tier). */
static void equal_through(int redis_port) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("models/stories260K.gguf", &m, &pool, 2)) return;
    uint32_t nv = m->hp.n_vocab, B = 16;
    uint64_t bb = kp_model_kv_bytes_per_token(&m->hp, KP_DTYPE_F32) * B;
    kp_engine *ref = NULL, *e = NULL;
    kp_eng_config cr = {KP_DTYPE_F32, B, 0, MAX_LEN + N_GEN + 8, true, NULL, KP_DTYPE_F32, true, 0, 0};
    kp_eng_config ct = {KP_DTYPE_F32, B, bb * ((MAX_LEN + N_GEN + B - 1) / B + 1), MAX_LEN + N_GEN + 8, false, NULL, KP_DTYPE_F32, false, 0, 0};
    char dir[300], addr[64];
    snprintf(dir, sizeof dir, "%s/eq", tmpdir);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", redis_port);
    kp_tiers_config tc = {redis_port ? NULL : dir, 0, redis_port ? addr : NULL, 200, NULL, NULL, NULL, 0};
    kp_tier_id tier = redis_port ? KP_TIER_REDIS : KP_TIER_DISK;
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cr, &err) == KP_OK);
    CHECK(kp_eng_new(&e, m, pool, NULL, &ct, &err) == KP_OK);
    CHECK_MSG(e && kp_eng_open_tiers(e, &tc, &err) == KP_OK, "%s", err.msg);
    if (redis_port) usleep(1200 * 1000); /* the lookup connection is made in the background */
    kp_eng_config cn = cr;
    kp_engine *nocache = NULL;
    CHECK(kp_eng_new(&nocache, m, pool, NULL, &cn, &err) == KP_OK);
    CHECK(nocache && kp_eng_open_tiers(nocache, &tc, &err) == KP_EUNSUPPORTED);
    kp_eng_free(nocache);
    float *lr = malloc(nv * sizeof *lr), *lt = malloc(nv * sizeof *lt);
    static tokseq done[N_REQ];
    uint32_t n_done = 0, from_disk = 0;
    for (uint32_t q = 0; ref && e && q < N_REQ; q++) {
        tokseq req;
        uint32_t kind = n_done ? rnd(4) : 0;
        const tokseq *base = n_done ? &done[rnd(n_done)] : NULL;
        if (kind == 0) {
            req.n = 20 + rnd(60);
            req.t[0] = 1;
            for (uint32_t i = 1; i < req.n; i++) req.t[i] = (int32_t)rnd(nv);
        } else {
            req = *base;
            if (req.n > MAX_LEN) req.n = MAX_LEN;
            if (kind == 1)
                for (uint32_t add = 1 + rnd(20); add && req.n < MAX_LEN; add--) req.t[req.n++] = (int32_t)rnd(nv);
            else if (kind == 3)
                req.n = 1 + rnd(req.n);
        }
        uint32_t best = 0;
        for (uint32_t d = 0; d < n_done; d++) {
            uint32_t l = 0;
            while (l < req.n && l < done[d].n && req.t[l] == done[d].t[l]) l++;
            if (l > best) best = l;
        }
        uint32_t floor_blocks = best / B * B, last = (req.n - 1) / B * B;
        uint32_t want_min = floor_blocks < last ? floor_blocks : last;
        kp_eng_seq sr = {0}, st = {0};
        kp_eng_report rr, rt;
        CHECK(kp_eng_prefill(ref, req.t, req.n, &sr, lr, &rr, &err) == KP_OK);
        CHECK_MSG(kp_eng_prefill(e, req.t, req.n, &st, lt, &rt, &err) == KP_OK, "%s", err.msg);
        CHECK_MSG(rt.reused_tokens >= want_min, "request %u (kind %u, n %u, lcp %u): reused %u, at least %u", q, kind,
                  req.n, best, rt.reused_tokens, want_min);
        CHECK(rt.reused_tokens < req.n && rt.restore_failed == KP_BLOCKREC_OK);
        from_disk += rt.reused_from[tier];
        double d = rel_diff(lt, lr, nv);
        CHECK_MSG(d <= 1e-5, "request %u: prompt logits differ by %g", q, d);
        tokseq fin = req;
        for (int g = 0; g < N_GEN; g++) {
            int32_t tok = kp_argmax(lr, (int32_t)nv);
            CHECK_MSG(kp_argmax(lt, (int32_t)nv) == tok, "request %u step %d: greedy differs", q, g);
            fin.t[fin.n++] = tok;
            CHECK(kp_eng_decode(ref, &sr, tok, lr, &err) == KP_OK);
            CHECK(kp_eng_decode(e, &st, tok, lt, &err) == KP_OK);
            d = rel_diff(lt, lr, nv);
            CHECK_MSG(d <= 1e-5, "request %u step %d: logits differ by %g", q, g, d);
        }
        CHECK(kp_eng_finish(ref, &sr, fin.t, fin.n, NULL, &err) == KP_OK);
        CHECK(kp_eng_finish(e, &st, fin.t, fin.n, NULL, &err) == KP_OK);
        CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s", err.msg);
        kp_eng_tier_flush(e);
        done[n_done++] = fin;
    }
    kp_tiers_stats ts;
    CHECK(e && kp_eng_tier_stats(e, &ts));
    CHECK_MSG(from_disk > 100, "only %u tokens came from %s", from_disk, kp_tier_name(tier));
    CHECK(ts.tier[tier].hits > 0 && ts.restores > 0 && ts.restore_failed == 0);
    CHECK_EQ_INT(ts.restored_tokens[tier], from_disk);
    kp_eng_free(ref);
    kp_eng_free(e);
    free(lr);
    free(lt);
    kp_threads_free(pool);
    kp_model_free(m);
}

static void test_equal_through_disk(void) { equal_through(0); }

/* ---- recurrent-state snapshots ---------------------------------------- */

/* Prefill of t[0..n) on e and on the cache-off engine cold, then k greedy
 * steps on both: every row of logits within 1e-5 relative, the same greedy
 * tokens. *r gets e's prefill report; e's sequence is finished with prompt
 * + answer (t grows by k: it must have room), cold's dropped. Returns
 * n + k. */
static uint32_t same_as_cold(kp_engine *e, kp_engine *cold, int32_t *t, uint32_t n, uint32_t k, uint32_t nv,
                             kp_eng_report *r, const char *what) {
    kp_error err = {0};
    float *l0 = malloc(nv * sizeof *l0), *l1 = malloc(nv * sizeof *l1);
    kp_eng_seq s = {0}, c = {0};
    bool ok = kp_eng_prefill(e, t, n, &s, l0, r, &err) == KP_OK;
    CHECK_MSG(ok, "%s: %s", what, err.msg);
    ok = ok && kp_eng_prefill(cold, t, n, &c, l1, NULL, &err) == KP_OK;
    for (uint32_t i = 0; ok; i++) {
        double d = rel_diff(l0, l1, nv);
        int32_t tok = kp_argmax(l1, (int32_t)nv);
        CHECK_MSG(d <= 1e-5, "%s, step %u: logits differ by %g relative", what, i, d);
        CHECK_MSG(kp_argmax(l0, (int32_t)nv) == tok, "%s, step %u: greedy differs", what, i);
        if (i == k) break;
        t[n++] = tok;
        ok = kp_eng_decode(e, &s, tok, l0, &err) == KP_OK && kp_eng_decode(cold, &c, tok, l1, &err) == KP_OK;
        CHECK_MSG(ok, "%s: %s", what, err.msg);
    }
    CHECK_MSG(kp_eng_finish(e, &s, t, n, NULL, &err) == KP_OK, "%s: %s", what, err.msg);
    CHECK_MSG(kp_eng_check(e, &err) == KP_OK, "%s: %s", what, err.msg);
    kp_eng_seq_abort(cold, &c);
    free(l0);
    free(l1);
    return n;
}

/* A new engine on tiers tc (a restart; another replica), its writes done
 * before it returns; NULL on failure (checked). */
static kp_engine *recurrent_engine(const kp_model *m, kp_threads *pool, const kp_tiers_config *tc) {
    kp_error err = {0};
    kp_engine *e = NULL;
    kp_eng_config c = {KP_DTYPE_F16, 16, 0, 256, false, NULL, KP_DTYPE_F16, false, 0, 32};
    CHECK_MSG(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK, "%s", err.msg);
    if (e && tc) {
        CHECK_MSG(kp_eng_open_tiers(e, tc, &err) == KP_OK, "%s", err.msg);
        CHECK(!tc->redis || kp_eng_tier_wait_ready(e, 3000));
    }
    return e;
}

/* Overwrites 64 bytes of the snapshot record of t[0..pos) in directory
 * dir (under fingerprint fphex), from n_from_end bytes before its end
 * (inside the state), with 0x40 (floats near 3: a state that changes the
 * logits if it were used). False when the file is not there. */
static bool damage_snapshot(const char *dir, const char *fphex, const int32_t *t, uint32_t pos, long n_from_end) {
    enum { B = 16 };
    kp_bkey k = {{0}};
    for (uint32_t j = 0; j < pos / B; j++) k = kp_bkey_next(j ? &k : NULL, t + j * B, B);
    kp_bkey sk = kp_bkey_state(pos >= B ? &k : NULL, t + pos / B * B, pos % B, pos);
    char hex[33], path[700];
    kp_bkey_hex(&sk, hex);
    snprintf(path, sizeof path, "%s/%s/%s.kvs", dir, fphex, hex);
    FILE *f = fopen(path, "r+b");
    if (!f) return false;
    fseek(f, -n_from_end, SEEK_END);
    for (int i = 0; i < 64; i++) fputc(0x40, f);
    fclose(f);
    return true;
}

/* Snapshots through the tiers tc (the disk, or Redis alone), on gen-qwen35
 * with blocks of 16 and a snapshot every 32 positions; each request is
 * checked against a cache-off engine (logits of the prompt and of 4
 * greedy steps within 1e-5, the same tokens):
 *
 *   engine 1  turn 1: 40 tokens + 5 answered: snapshots @32, @40, @45,
 *             whole blocks 0-1 written
 *   engine 2  (a restart) turn 2 = turn 1 + 20 new tokens: resumes at 45
 *             from the tiers (blocks 0-1, the snapshot @45 and its 13 tail
 *             rows), nothing computed again; writes blocks 0-3, @64, @65, @69
 *   engine 3  turn 2 edited at 50: the tiers' blocks match to 48, the
 *             latest snapshot at or before it is @45: reused 45, 3
 *             computed again (state_cut_from 48)
 *   engine 4  (disk only) the snapshot @45 damaged: refused (checksum),
 *             the restore resumes at @40 instead, the output unchanged */
static void recurrent_through(const kp_tiers_config *tc) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("tests/data/models/gen-qwen35-f32.gguf", &m, &pool, 2)) return;
    kp_tier_id tier = tc->dir ? KP_TIER_DISK : KP_TIER_REDIS;
    uint32_t nv = m->hp.n_vocab;
    int32_t t[200], u[200];
    for (int i = 0; i < 200; i++) t[i] = i == 0 ? 1 : 40 + 7 * i % 400;
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 256, true, NULL, KP_DTYPE_F16, false, 0, 32};
    kp_engine *cold = NULL, *e = recurrent_engine(m, pool, tc);
    CHECK(kp_eng_new(&cold, m, pool, NULL, &cc, &err) == KP_OK);
    kp_eng_report r;
    kp_tiers_stats ts;
    char fphex[33] = "";
    if (!e || !cold) goto done;
    /* engine 1: turn 1 */
    uint32_t n1 = same_as_cold(e, cold, t, 40, 5, nv, &r, "turn 1");
    CHECK(r.reused_tokens == 0 && n1 == 45);
    kp_eng_tier_flush(e);
    CHECK(kp_eng_tier_stats(e, &ts));
    if (tier == KP_TIER_DISK) { /* the disk's bill counts them */
        CHECK_EQ_INT(ts.tier[tier].states, 3);
        CHECK_EQ_INT(ts.tier[tier].blocks, 2);
        CHECK(ts.tier[tier].state_bytes > 3 * kp_model_rec_state_floats(&m->hp) * 4);
        CHECK(ts.tier[tier].bytes > ts.tier[tier].state_bytes);
    } else { /* Redis: 2 blocks and 3 snapshots published */
        CHECK_EQ_INT(ts.tier[tier].writes, 5);
    }
    snprintf(fphex, sizeof fphex, "%s", ts.fingerprint);
    kp_eng_free(e);
    /* engine 2: a restart, turn 2 extends turn 1 */
    e = recurrent_engine(m, pool, tc);
    if (!e) goto done;
    for (uint32_t i = n1; i < n1 + 20; i++) t[i] = 50 + 3 * (int32_t)i % 300;
    uint32_t n2 = same_as_cold(e, cold, t, n1 + 20, 4, nv, &r, "turn 2 after a restart");
    CHECK_EQ_INT(r.reused_tokens, 45);
    CHECK_EQ_INT(r.reused_from[tier], 45);
    CHECK(r.state_recomputed_tokens == 0 && r.computed_tokens == 20 && r.restore_failed == KP_BLOCKREC_OK);
    kp_eng_tier_flush(e);
    CHECK(kp_eng_tier_stats(e, &ts));
    CHECK(ts.state_restores == 1 && ts.state_failed == 0 && ts.restored_tokens[tier] == 45);
    kp_eng_free(e);
    /* engine 3: turn 2 edited at 50 */
    e = recurrent_engine(m, pool, tc);
    if (!e) goto done;
    memcpy(u, t, sizeof u);
    u[50] = 7;
    same_as_cold(e, cold, u, 60, 2, nv, &r, "an edit at 50 after a restart");
    CHECK_EQ_INT(r.reused_tokens, 45);
    CHECK(r.state_recomputed_tokens == 3 && r.state_cut_from == 48 && r.computed_tokens == 15);
    kp_eng_free(e);
    e = NULL;
    (void)n2;
    if (tier != KP_TIER_DISK) goto done;
    /* engine 4: the snapshot @45 damaged on disk */
    CHECK_MSG(damage_snapshot(tc->dir, fphex, t, 45, 4096), "the snapshot @45 on disk");
    e = recurrent_engine(m, pool, tc);
    if (!e) goto done;
    memcpy(u, t, sizeof u);
    u[47] = 8; /* leaves block 2: the tiers' blocks end at 32, @45 is the latest snapshot */
    same_as_cold(e, cold, u, 60, 2, nv, &r, "a damaged snapshot");
    CHECK_EQ_INT(r.reused_tokens, 40);
    CHECK(r.restore_failed == KP_BLOCKREC_CHECKSUM && r.restore_failed_tier == KP_TIER_DISK);
    CHECK(kp_eng_tier_stats(e, &ts));
    CHECK(ts.tier[KP_TIER_DISK].fail[KP_BLOCKREC_CHECKSUM] == 1 && ts.state_failed == 1 && ts.state_restores == 1);
done:
    kp_eng_free(e);
    kp_eng_free(cold);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A disk budget of two states: turn 1's records (blocks 0-1, then the
 * snapshots @32, @40, @45) are evicted least recently used first, the
 * snapshots too: one snapshot is left, the bytes within the budget; a
 * restart resumes from no snapshot whose blocks are gone (it computes,
 * with the cold logits). */
static void recurrent_disk_budget(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("tests/data/models/gen-qwen35-f32.gguf", &m, &pool, 2)) return;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/qwen35-budget", tmpdir);
    uint64_t budget = 2 * kp_model_rec_state_floats(&m->hp) * sizeof(float);
    kp_tiers_config tc = {dir, budget, NULL, 0, NULL, NULL, NULL, 0};
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 256, true, NULL, KP_DTYPE_F16, false, 0, 32};
    kp_engine *cold = NULL, *e = recurrent_engine(m, pool, &tc);
    CHECK(kp_eng_new(&cold, m, pool, NULL, &cc, &err) == KP_OK);
    int32_t t[200];
    for (int i = 0; i < 200; i++) t[i] = i == 0 ? 1 : 40 + 7 * i % 400;
    kp_eng_report r;
    kp_tiers_stats ts;
    if (e && cold) {
        uint32_t n1 = same_as_cold(e, cold, t, 40, 5, m->hp.n_vocab, &r, "turn 1 under a disk budget");
        kp_eng_tier_flush(e);
        CHECK(kp_eng_tier_stats(e, &ts));
        const kp_tier_stats *d = &ts.tier[KP_TIER_DISK];
        CHECK_MSG(d->states == 1 && d->evicted >= 2 && d->bytes <= budget && d->state_bytes <= d->bytes,
                  "states %llu evicted %llu bytes %llu of %llu", (unsigned long long)d->states,
                  (unsigned long long)d->evicted, (unsigned long long)d->bytes, (unsigned long long)budget);
        kp_eng_free(e);
        e = recurrent_engine(m, pool, &tc);
        for (uint32_t i = n1; i < n1 + 20; i++) t[i] = 50 + 3 * (int32_t)i % 300;
        if (e) same_as_cold(e, cold, t, n1 + 20, 2, m->hp.n_vocab, &r, "turn 2 after the budget's evictions");
        CHECK(r.reused_tokens == 0 && r.restore_failed == KP_BLOCKREC_OK);
    }
    kp_eng_free(e);
    kp_eng_free(cold);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A pin writes the snapshot at its end: tiers opened after a 50-token
 * sequence was cached (so its finish wrote nothing) get, from a pin of
 * its first 45 tokens, blocks 0-1 and the snapshot @45 (computed at pin
 * time from @32, its tail rows 32..44 from the cached block 2); a new
 * engine resumes a 50-token prompt there, all 45 from disk, with the cold
 * logits. */
static void recurrent_pin(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("tests/data/models/gen-qwen35-f32.gguf", &m, &pool, 2)) return;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/qwen35-pin", tmpdir);
    kp_tiers_config tc = {dir, 0, NULL, 0, NULL, NULL, NULL, 0};
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 256, true, NULL, KP_DTYPE_F16, false, 0, 32};
    kp_engine *cold = NULL, *e = recurrent_engine(m, pool, NULL);
    CHECK(kp_eng_new(&cold, m, pool, NULL, &cc, &err) == KP_OK);
    int32_t t[60];
    for (int i = 0; i < 60; i++) t[i] = i == 0 ? 1 : 30 + 11 * i % 300;
    kp_eng_seq s = {0};
    kp_eng_report r;
    kp_tiers_stats ts;
    uint64_t id;
    if (e && cold) {
        CHECK(kp_eng_prefill(e, t, 50, &s, NULL, &r, &err) == KP_OK && kp_eng_finish(e, &s, t, 50, NULL, &err) == KP_OK);
        CHECK_MSG(kp_eng_open_tiers(e, &tc, &err) == KP_OK, "%s", err.msg);
        CHECK_MSG(kp_eng_pin(e, t, 45, 0, 0, &id, &err) == KP_OK, "%s", err.msg);
        kp_eng_tier_flush(e);
        CHECK(kp_eng_tier_stats(e, &ts));
        CHECK(ts.tier[KP_TIER_DISK].blocks == 2 && ts.tier[KP_TIER_DISK].states == 1);
        kp_eng_free(e);
        e = recurrent_engine(m, pool, &tc);
        if (e) same_as_cold(e, cold, t, 50, 2, m->hp.n_vocab, &r, "a pinned prefix after a restart");
        CHECK(r.reused_tokens == 45 && r.reused_from[KP_TIER_DISK] == 45 && r.state_recomputed_tokens == 0);
    }
    kp_eng_free(e);
    kp_eng_free(cold);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* Both tiers: a snapshot the disk refuses is read from Redis. An engine
 * writes turn 1 (40 tokens + 5) to the disk and Redis; its snapshot @45 on
 * disk is damaged; a new engine on both resumes turn 2 at 45 all the same,
 * blocks 0-1 from disk and the snapshot (13 tail positions) from Redis,
 * the disk's checksum refusal counted, the logits the cold ones. */
static void recurrent_disk_to_redis(int port) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("tests/data/models/gen-qwen35-f32.gguf", &m, &pool, 2)) return;
    char dir[300], addr[64], fphex[33];
    snprintf(dir, sizeof dir, "%s/qwen35-both", tmpdir);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    kp_tiers_config tc = {dir, 0, addr, 200, NULL, NULL, NULL, 0};
    kp_eng_config cc = {KP_DTYPE_F16, 16, 0, 256, true, NULL, KP_DTYPE_F16, false, 0, 32};
    kp_engine *cold = NULL, *e = recurrent_engine(m, pool, &tc);
    CHECK(kp_eng_new(&cold, m, pool, NULL, &cc, &err) == KP_OK);
    int32_t t[200];
    for (int i = 0; i < 200; i++) t[i] = i == 0 ? 1 : 60 + 13 * i % 350; /* not the other tests' keys */
    kp_eng_report r;
    kp_tiers_stats ts;
    if (e && cold) {
        uint32_t n1 = same_as_cold(e, cold, t, 40, 5, m->hp.n_vocab, &r, "turn 1 on both tiers");
        kp_eng_tier_flush(e);
        CHECK(kp_eng_tier_stats(e, &ts));
        snprintf(fphex, sizeof fphex, "%s", ts.fingerprint);
        kp_eng_free(e);
        CHECK_MSG(damage_snapshot(dir, fphex, t, 45, 4096), "the snapshot @45 on disk");
        e = recurrent_engine(m, pool, &tc);
        for (uint32_t i = n1; i < n1 + 20; i++) t[i] = 50 + 3 * (int32_t)i % 300;
        if (e) same_as_cold(e, cold, t, n1 + 20, 2, m->hp.n_vocab, &r, "turn 2, the disk's snapshot damaged");
        CHECK(r.reused_tokens == 45 && r.reused_from[KP_TIER_DISK] == 32 && r.reused_from[KP_TIER_REDIS] == 13);
        CHECK(r.restore_failed == KP_BLOCKREC_OK);
        CHECK(e && kp_eng_tier_stats(e, &ts));
        CHECK(ts.tier[KP_TIER_DISK].fail[KP_BLOCKREC_CHECKSUM] == 1 && ts.tier[KP_TIER_REDIS].hits == 1);
    }
    kp_eng_free(e);
    kp_eng_free(cold);
    kp_threads_free(pool);
    kp_model_free(m);
}

static void test_recurrent_disk(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/qwen35", tmpdir);
    kp_tiers_config tc = {dir, 0, NULL, 0, NULL, NULL, NULL, 0};
    recurrent_through(&tc);
    recurrent_disk_budget();
    recurrent_pin();
}


static void disk_refusal_falls_to_redis(int redis_port);
static void window_budget_through_redis(int port);
static void recurrent_through(const kp_tiers_config *tc);
static void recurrent_disk_to_redis(int port);

static void test_equal_through_redis(void) {
    int port = start_redis();
    CHECK_MSG(port > 0, "redis-server (Debian package redis-server) is needed");
    if (port) equal_through(port);
    if (port) disk_refusal_falls_to_redis(port);
    if (port) { /* snapshots through Redis alone: engine 2 and 3 are other replicas */
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
        kp_tiers_config tc = {NULL, 0, addr, 200, NULL, NULL, NULL, 0};
        recurrent_through(&tc);
        recurrent_disk_to_redis(port);
        window_budget_through_redis(port);
    }
    stop_redis();
}

/* A record the disk refuses when read is taken from Redis, with the blocks
 * after it: an engine with both tiers computes a prompt of 100 tokens; the
 * disk record of block 2 gets a flipped K/V byte; a new engine on the same
 * directory and Redis restores blocks 0-1 from disk and 2-5 from Redis
 * (the last position is always computed), counts the checksum refusal, and
 * its logits equal an engine's without a prefix cache. */
static void disk_refusal_falls_to_redis(int redis_port) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("models/stories260K.gguf", &m, &pool, 2)) return;
    enum { N = 100, B = 16 };
    uint32_t nv = m->hp.n_vocab;
    char dir[300], addr[64], path[700], fphex[33], keyhex[33];
    snprintf(dir, sizeof dir, "%s/fallback", tmpdir);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", redis_port);
    kp_tiers_config tc = {dir, 0, addr, 200, NULL, NULL, NULL, 0};
    kp_eng_config c = {KP_DTYPE_F32, B, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 0}, cn = c;
    cn.no_prefix_cache = true;
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = i ? (i * 53) % 400 + 5 : 1;
    kp_engine *e = NULL, *e2 = NULL, *ref = NULL;
    kp_eng_seq s = {0}, s2 = {0}, sr = {0};
    kp_eng_report rep;
    kp_tiers_stats ts;
    float *lt = malloc(nv * sizeof *lt), *lr = malloc(nv * sizeof *lr);
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    CHECK_MSG(e && kp_eng_open_tiers(e, &tc, &err) == KP_OK, "%s", err.msg);
    CHECK(e && kp_eng_tier_wait_ready(e, 3000));
    CHECK(e && kp_eng_prefill(e, t, N, &s, NULL, &rep, &err) == KP_OK);
    CHECK(e && kp_eng_finish(e, &s, t, N, NULL, &err) == KP_OK);
    if (e) kp_eng_tier_flush(e);
    CHECK(e && kp_eng_tier_stats(e, &ts));
    snprintf(fphex, sizeof fphex, "%s", ts.fingerprint);
    kp_eng_free(e);
    kp_bkey k = kp_bkey_next(NULL, t, B);
    for (int j = 1; j <= 2; j++) k = kp_bkey_next(&k, t + j * B, B);
    kp_bkey_hex(&k, keyhex);
    snprintf(path, sizeof path, "%s/%s/%s.kvb", dir, fphex, keyhex);
    FILE *f = fopen(path, "r+b");
    CHECK_MSG(f != NULL, "block 2's record %s", path);
    if (f) {
        fseek(f, -50, SEEK_END);
        int ch = fgetc(f);
        fseek(f, -50, SEEK_END);
        fputc(ch ^ 0x10, f);
        fclose(f);
    }
    CHECK(kp_eng_new(&e2, m, pool, NULL, &c, &err) == KP_OK);
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cn, &err) == KP_OK);
    CHECK_MSG(e2 && kp_eng_open_tiers(e2, &tc, &err) == KP_OK, "%s", err.msg);
    CHECK(e2 && kp_eng_tier_wait_ready(e2, 3000));
    CHECK(e2 && kp_eng_prefill(e2, t, N, &s2, lt, &rep, &err) == KP_OK);
    CHECK(ref && kp_eng_prefill(ref, t, N, &sr, lr, NULL, &err) == KP_OK);
    CHECK_EQ_INT(rep.reused_from[KP_TIER_DISK], 2 * B);
    CHECK_EQ_INT(rep.reused_from[KP_TIER_REDIS], 4 * B);
    CHECK(rep.restore_failed == KP_BLOCKREC_OK);
    CHECK_MSG(rel_diff(lt, lr, nv) <= 1e-5, "logits differ by %g", rel_diff(lt, lr, nv));
    CHECK(e2 && kp_eng_tier_stats(e2, &ts));
    CHECK_EQ_INT(ts.tier[KP_TIER_DISK].fail[KP_BLOCKREC_CHECKSUM], 1);
    CHECK(e2 && kp_eng_finish(e2, &s2, t, N, NULL, &err) == KP_OK);
    CHECK(ref && kp_eng_finish(ref, &sr, t, N, NULL, &err) == KP_OK);
    kp_eng_free(e2);
    kp_eng_free(ref);
    free(lt);
    free(lr);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A pinned prefix is written through at pin time: tiers opened after the
 * sequence was cached get its whole blocks from the pin alone, and a new
 * engine on the directory restores them. */
static void test_pin_writes_through(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("models/stories260K.gguf", &m, &pool, 1)) return;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/pin", tmpdir);
    kp_tiers_config tc = {dir, 0, NULL, 0, NULL, NULL, NULL, 0};
    kp_eng_config c = {KP_DTYPE_F16, 16, 0, 256, false, NULL, KP_DTYPE_F16, false, 0, 0};
    int32_t t[50];
    for (int i = 0; i < 50; i++) t[i] = i ? (i * 37) % 500 + 3 : 1;
    kp_engine *e = NULL, *e2 = NULL;
    kp_eng_seq s = {0};
    kp_eng_report rep;
    uint64_t id;
    kp_tiers_stats ts;
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    CHECK(e && kp_eng_prefill(e, t, 50, &s, NULL, &rep, &err) == KP_OK);
    CHECK(e && kp_eng_finish(e, &s, t, 50, NULL, &err) == KP_OK);
    CHECK(e && kp_eng_open_tiers(e, &tc, &err) == KP_OK);
    kp_eng_tier_flush(e);
    CHECK(kp_eng_tier_stats(e, &ts) && ts.tier[KP_TIER_DISK].blocks == 0);
    CHECK(kp_eng_pin(e, t, 48, 0, 0, &id, &err) == KP_OK);
    kp_eng_tier_flush(e);
    CHECK(kp_eng_tier_stats(e, &ts));
    CHECK_EQ_INT(ts.tier[KP_TIER_DISK].blocks, 3);
    kp_eng_free(e);
    CHECK(kp_eng_new(&e2, m, pool, NULL, &c, &err) == KP_OK);
    CHECK(e2 && kp_eng_open_tiers(e2, &tc, &err) == KP_OK);
    CHECK(e2 && kp_eng_prefill(e2, t, 50, &s, NULL, &rep, &err) == KP_OK);
    CHECK_EQ_INT(rep.reused_from[KP_TIER_DISK], 48);
    CHECK(e2 && kp_eng_finish(e2, &s, t, 50, NULL, &err) == KP_OK);
    kp_eng_free(e2);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* The .kvb records under DIR/<fingerprint>: how many, and whether each
 * has a byte-identical twin under DIR2/<fingerprint>. */
static uint32_t records_in(const char *dir, const char *dir2, const char *fp, bool *same) {
    char path[700], path2[700];
    snprintf(path, sizeof path, "%s/%s", dir, fp);
    DIR *d = opendir(path);
    uint32_t n = 0;
    *same = d != NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 4, ".kvb")) continue;
        n++;
        snprintf(path, sizeof path, "%s/%s/%s", dir, fp, de->d_name);
        snprintf(path2, sizeof path2, "%s/%s/%s", dir2, fp, de->d_name);
        FILE *a = fopen(path, "rb"), *b = fopen(path2, "rb");
        int ca = 0, cb = 0;
        while (a && b && (ca = fgetc(a)) == (cb = fgetc(b)) && ca != EOF) {}
        if (!a || !b || ca != cb) *same = false;
        if (a) fclose(a);
        if (b) fclose(b);
    }
    if (d) closedir(d);
    return n;
}

/* The two engine configurations of the window-budget tier tests on
 * gen-gemma3 (blocks of 16, 256 positions): *cw under the tightest window
 * budget (a batch of 256 positions and twice the window, two blocks of
 * slack), *cr with the prefix cache off (the recomputation). */
static void window_configs(const kp_model *m, kp_eng_config *cw, kp_eng_config *cr) {
    uint64_t wb = 16 * kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, KP_DTYPE_F32, KP_DTYPE_F32);
    uint32_t slots = (256 + 2 * m->hp.n_swa + 15) / 16 + 2;
    kp_eng_config c = {KP_DTYPE_F32, 16, 0, 256, false, NULL, KP_DTYPE_F32, false, 0, 0};
    *cw = *cr = c;
    cw->window_budget_bytes = slots * wb;
    cr->no_prefix_cache = true;
}

/* Engine w computes A (n tokens) prefilled at once, or (fed) a prompt of 40
 * and then a token at a time, as an answer is generated; finishes it and
 * waits for its tiers' writes. */
static void write_a(kp_engine *w, const int32_t *a, int n, bool fed) {
    kp_error err = {0};
    kp_eng_seq s = {0};
    kp_eng_report rep;
    if (fed) {
        CHECK(kp_eng_prefill(w, a, 40, &s, NULL, &rep, &err) == KP_OK);
        for (int i = 40; i < n; i++) CHECK(kp_eng_decode(w, &s, a[i], NULL, &err) == KP_OK);
    } else {
        CHECK(kp_eng_prefill(w, a, n, &s, NULL, &rep, &err) == KP_OK);
    }
    CHECK(kp_eng_finish(w, &s, a, n, NULL, &err) == KP_OK);
    kp_eng_tier_flush(w);
}

/* A new engine under cw on the tiers tc, its tiers ready (checked; NULL
 * when it could not be made). */
static kp_engine *tier_engine(kp_model *m, kp_threads *pool, const kp_eng_config *cw, const kp_tiers_config *tc) {
    kp_error err = {0};
    kp_engine *w = NULL;
    CHECK_MSG(kp_eng_new(&w, m, pool, NULL, cw, &err) == KP_OK && kp_eng_open_tiers(w, tc, &err) == KP_OK, "%s",
              err.msg);
    CHECK(w && kp_eng_tier_wait_ready(w, 10000));
    return w;
}

/* A new engine under cw on the tiers tc restores A's whole blocks before
 * its last position from tier, with the logits of ref (cache off). */
static void restore_a(kp_model *m, kp_threads *pool, const kp_eng_config *cw, const kp_tiers_config *tc,
                      kp_tier_id tier, kp_engine *ref, const int32_t *a, int n) {
    kp_error err = {0};
    kp_eng_seq s = {0};
    kp_eng_report rep;
    uint32_t nv = m->hp.n_vocab;
    float *lw = malloc(nv * sizeof *lw), *lr = malloc(nv * sizeof *lr);
    kp_engine *w = tier_engine(m, pool, cw, tc);
    if (w && lw && lr) {
        CHECK(kp_eng_prefill(w, a, n, &s, lw, &rep, &err) == KP_OK);
        CHECK_EQ_INT(rep.reused_from[tier], (n - 1) / 16 * 16);
        kp_eng_seq_abort(w, &s);
        CHECK(kp_eng_prefill(ref, a, n, &s, lr, &rep, &err) == KP_OK);
        kp_eng_seq_abort(ref, &s);
        CHECK_MSG(rel_diff(lw, lr, nv) <= 1e-5, "restored from %s: logits differ by %g", kp_tier_name(tier),
                  rel_diff(lw, lr, nv));
    }
    kp_eng_free(w);
    free(lw);
    free(lr);
}

/* One engine under the window budget cw on the tiers tc computes A (its
 * RAM keeps A's window rows in the last block only), then B, which leaves A
 * at token 50: RAM resumes at 0 (no window held before 50), and the tier
 * gives the 3 whole blocks B shares with A, window rows and all: 48
 * reused, from that tier, with the logits of ref (cache off). */
static void budget_divergence(kp_model *m, kp_threads *pool, const kp_eng_config *cw, kp_engine *ref,
                              const kp_tiers_config *tc, kp_tier_id tier, const int32_t *a, const int32_t *b, int n) {
    kp_error err = {0};
    kp_eng_seq s = {0};
    kp_eng_report rep;
    uint32_t nv = m->hp.n_vocab;
    float *lw = malloc(nv * sizeof *lw), *lr = malloc(nv * sizeof *lr);
    kp_engine *w = tier_engine(m, pool, cw, tc);
    CHECK(w && kp_eng_prefill(w, a, n, &s, NULL, &rep, &err) == KP_OK && kp_eng_finish(w, &s, a, n, NULL, &err) == KP_OK);
    CHECK(w && kp_eng_prefill(w, b, n, &s, lw, &rep, &err) == KP_OK);
    CHECK_EQ_INT(rep.window_cut_from, 50);
    CHECK_EQ_INT(rep.reused_tokens, 48);
    CHECK_EQ_INT(rep.reused_from[tier], 48);
    CHECK(w && kp_eng_finish(w, &s, b, n, NULL, &err) == KP_OK);
    CHECK(kp_eng_prefill(ref, b, n, &s, lr, &rep, &err) == KP_OK);
    CHECK(kp_eng_finish(ref, &s, b, n, NULL, &err) == KP_OK);
    CHECK_MSG(rel_diff(lw, lr, nv) <= 1e-5, "B through %s: logits differ by %g", kp_tier_name(tier),
              rel_diff(lw, lr, nv));
    kp_eng_free(w);
    free(lw);
    free(lr);
}

/* A window budget and the disk tier (gen-gemma3: a window of 16 on 5 of
 * 6 layers, blocks of 16). Blocks are written whole, window rows
 * included, so the record is the same in both modes: an engine without a
 * budget writes A's 6 blocks; an engine under the tightest budget, whose
 * sequence drops the window rows of its blocks as it goes (its RAM keeps
 * them in the last block only), writes each block before it drops them:
 * the same 6 records, byte for byte, whether A is prefilled at once or
 * fed a token at a time after a prompt of 40; a new engine on that
 * directory restores A's 5 whole blocks before its last position, with
 * the logits of a recomputation. A prompt that leaves A at token 50
 * matches 50 tokens in RAM but resumes at 0 there (no window held before
 * 50), then restores the 3 whole blocks of A that the prompt shares from
 * disk, window rows and all: 48 reused, the logits those of a
 * recomputation. */
static void test_window_budget_and_disk(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("tests/data/models/gen-gemma3-f32.gguf", &m, &pool, 1)) return;
    enum { N = 96 };
    char dir[300], dir2[300];
    snprintf(dir, sizeof dir, "%s/window", tmpdir);
    snprintf(dir2, sizeof dir2, "%s/window-only", tmpdir);
    kp_tiers_config tc = {dir, 0, NULL, 0, NULL, NULL, NULL, 0}, tc2 = {dir2, 0, NULL, 0, NULL, NULL, NULL, 0};
    kp_eng_config cw, cr, cd;
    window_configs(m, &cw, &cr);
    cd = cw;
    cd.window_budget_bytes = 0;
    int32_t a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = i ? (i * 37) % 500 + 3 : 1;
    memcpy(b, a, sizeof a);
    b[50] = 2;
    kp_engine *w2 = NULL, *ref = NULL;
    kp_tiers_stats ts;
    kp_engine *d = tier_engine(m, pool, &cd, &tc);
    if (d) write_a(d, a, N, false);
    CHECK(d && kp_eng_tier_stats(d, &ts) && ts.tier[KP_TIER_DISK].blocks == N / 16);
    kp_eng_free(d);
    /* under the budget, alone on its directory: every block reaches disk, as the default writes it */
    char fp[33];
    memcpy(fp, ts.fingerprint, sizeof fp);
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cr, &err) == KP_OK);
    for (int fed = 0; fed < 2 && ref; fed++) {
        snprintf(dir2, sizeof dir2, "%s/window-only-%d", tmpdir, fed);
        w2 = tier_engine(m, pool, &cw, &tc2);
        if (!w2) break;
        write_a(w2, a, N, fed);
        CHECK(kp_eng_tier_stats(w2, &ts));
        CHECK_EQ_INT(ts.tier[KP_TIER_DISK].blocks, N / 16);
        CHECK_EQ_INT(ts.tier[KP_TIER_DISK].dropped_queue, 0);
        bool same;
        CHECK_EQ_INT(records_in(dir2, dir, fp, &same), N / 16);
        CHECK_MSG(same, "the records under a window budget differ from the default's");
        kp_eng_free(w2);
        w2 = NULL;
        /* a new engine restores them: every whole block before the last position */
        restore_a(m, pool, &cw, &tc2, KP_TIER_DISK, ref, a, N);
    }
    /* under the budget, on the first directory: the disk fills in what RAM dropped */
    if (ref) budget_divergence(m, pool, &cw, ref, &tc, KP_TIER_DISK, a, b, N);
    kp_eng_free(ref);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* The same through Redis alone (the publishing path the disk uses, with
 * Redis's writer and lookups): an engine under the tightest window budget
 * publishes every block of A, window rows included, whether A is
 * prefilled at once or fed a token at a time (each a fresh Redis
 * database's worth: FLUSHALL between); a new engine on that Redis restores
 * A's whole blocks before its last position with the logits of a
 * recomputation; and the prompt that leaves A at token 50 resumes at 0 in
 * RAM, then takes A's 3 shared blocks from Redis: 48 reused, the logits of
 * a recomputation. */
static void window_budget_through_redis(int port) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("tests/data/models/gen-gemma3-f32.gguf", &m, &pool, 1)) return;
    enum { N = 96 };
    char addr[64], cmd[160];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    snprintf(cmd, sizeof cmd, "redis-cli -p %d flushall >/dev/null", port);
    kp_tiers_config tc = {NULL, 0, addr, 200, NULL, NULL, NULL, 0};
    kp_eng_config cw, cr;
    window_configs(m, &cw, &cr);
    int32_t a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = i ? (i * 37) % 500 + 3 : 1;
    memcpy(b, a, sizeof a);
    b[50] = 2;
    kp_engine *w = NULL, *ref = NULL;
    kp_tiers_stats ts;
    CHECK(kp_eng_new(&ref, m, pool, NULL, &cr, &err) == KP_OK);
    for (int fed = 0; fed < 2 && ref; fed++) {
        CHECK(system(cmd) == 0);
        CHECK_MSG(kp_eng_new(&w, m, pool, NULL, &cw, &err) == KP_OK && kp_eng_open_tiers(w, &tc, &err) == KP_OK,
                  "%s", err.msg);
        if (!w) break;
        CHECK(kp_eng_tier_wait_ready(w, 10000));
        write_a(w, a, N, fed);
        CHECK(kp_eng_tier_stats(w, &ts));
        CHECK_EQ_INT(ts.tier[KP_TIER_REDIS].writes, N / 16);
        CHECK_EQ_INT(ts.tier[KP_TIER_REDIS].dropped_queue, 0);
        kp_eng_free(w);
        w = NULL;
        /* another replica restores them: every whole block before the last position */
        restore_a(m, pool, &cw, &tc, KP_TIER_REDIS, ref, a, N);
    }
    if (ref) budget_divergence(m, pool, &cw, ref, &tc, KP_TIER_REDIS, a, b, N);
    kp_eng_free(ref);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A sequence of more blocks than the tiers' default queue (256) is written
 * whole: kp_eng_finish queues every block at once, and the engine sizes the
 * queue to a context. */
static void test_long_sequence_written_whole(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    if (!load_model("models/stories260K.gguf", &m, &pool, 2)) return;
    enum { B = 4, N = 1300, CTX = 1400 };
    char dir[300];
    snprintf(dir, sizeof dir, "%s/long", tmpdir);
    kp_tiers_config tc = {dir, 0, NULL, 0, NULL, NULL, NULL, 0};
    kp_eng_config c = {KP_DTYPE_F16, B, 0, CTX, false, NULL, KP_DTYPE_F16, false, 0, 0};
    static int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = i ? (int32_t)((i * 131u + 7) % (m->hp.n_vocab - 3)) + 3 : 1;
    kp_engine *e = NULL;
    kp_eng_seq s = {0};
    kp_eng_report rep;
    kp_tiers_stats ts;
    CHECK(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK);
    CHECK_MSG(e && kp_eng_open_tiers(e, &tc, &err) == KP_OK, "%s", err.msg);
    CHECK(e && kp_eng_prefill(e, t, N, &s, NULL, &rep, &err) == KP_OK);
    CHECK(e && kp_eng_finish(e, &s, t, N, NULL, &err) == KP_OK);
    kp_eng_tier_flush(e);
    CHECK(e && kp_eng_tier_stats(e, &ts));
    CHECK_EQ_INT(ts.tier[KP_TIER_DISK].writes, N / B);
    CHECK_EQ_INT(ts.tier[KP_TIER_DISK].dropped_queue, 0);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_model_free(m);
}

/* A pool of 4 blocks of 4 positions, block b filled with bytes b + 1. */
static kp_kvpool *small_pool(void) {
    kp_kvpool *p = NULL;
    kp_kvpool_config kc = {2, 1, 4, KP_DTYPE_F16, 4, 4 * 2 * 2 * 4 * 4 * 2, KP_DTYPE_F16, NULL, 0, 0};
    if (kp_kvpool_new(&p, &kc, NULL) != KP_OK) return NULL;
    for (int32_t b = 0; b < 4; b++) {
        int32_t id;
        kp_kvpool_alloc(p, &id, NULL);
        for (uint32_t l = 0; l < 2; l++) {
            memset(kp_kvpool_k(p, id, l, 0), id + 1, 4 * 4 * 2);
            memset(kp_kvpool_v(p, id, l, 0), id + 1, 4 * 4 * 2);
        }
    }
    return p;
}

static void test_tier_alone(void) {
    kp_kvpool *p = small_pool();
    CHECK(p != NULL);
    if (!p) return;
    kp_fingerprint fp = {0}, other = {0};
    snprintf(fp.text, sizeof fp.text, "kvpin-kv-layout 1\nkv_type F16\nblock_size 4\n");
    snprintf(other.text, sizeof other.text, "kvpin-kv-layout 1\nkv_type F32\nblock_size 4\n");
    fp.id = kp_bkey_next(NULL, (const int32_t[]){1}, 1);
    other.id = kp_bkey_next(NULL, (const int32_t[]){2}, 1);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/alone", tmpdir);
    int32_t tok[4][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}, {13, 14, 15, 16}};
    kp_bkey key[4];
    for (int j = 0; j < 4; j++) key[j] = kp_bkey_next(j ? &key[j - 1] : NULL, tok[j], 4);
    kp_bkey zero = {{0}};
    kp_error err = {0};
    kp_disk_config dc = {dir, 0, 0, NULL};
    kp_disktier *t = NULL;
    /* another fingerprint writes first */
    CHECK(kp_disk_open(&t, &dc, &other, p, &err) == KP_OK);
    CHECK(t && kp_disk_put(t, &key[0], &zero, tok[0], 0));
    kp_disk_close(t);
    CHECK(kp_disk_open(&t, &dc, &fp, p, &err) == KP_OK);
    if (!t) return;
    CHECK_MSG(strstr(kp_disk_note(t), "ignored 1 blocks") && strstr(kp_disk_note(t), "kv_type F32 (here F16)"), "%s",
              kp_disk_note(t));
    CHECK(!kp_disk_has(t, &key[0]));
    for (int j = 0; j < 3; j++) CHECK(kp_disk_put(t, &key[j], j ? &key[j - 1] : &zero, tok[j], j));
    CHECK(!kp_disk_put(t, &key[0], &zero, tok[0], 0)); /* known: not written twice */
    kp_disk_flush(t);
    kp_tier_stats st;
    kp_disk_get_stats(t, &st);
    CHECK_EQ_INT(st.blocks, 3);
    CHECK_EQ_INT(st.writes, 3);
    CHECK_EQ_INT(st.other_blocks, 1);
    kp_disk_close(t);
    /* a new process: the scan knows the three, loads verify */
    CHECK(kp_disk_open(&t, &dc, &fp, p, &err) == KP_OK);
    if (!t) return;
    for (int j = 0; j < 3; j++) CHECK(kp_disk_has(t, &key[j]));
    CHECK(!kp_disk_has(t, &key[3]));
    CHECK_EQ_INT(kp_disk_get(t, &key[1], tok[1], p, 3, false), KP_BLOCKREC_OK);
    CHECK(((uint8_t *)kp_kvpool_k(p, 3, 1, 0))[5] == 2); /* block 1's bytes */
    /* in place: block 0's record straight into pool block 2, every run of it */
    CHECK_EQ_INT(kp_disk_get(t, &key[0], tok[0], p, 2, true), KP_BLOCKREC_OK);
    uint8_t ones[4 * 4 * 2];
    memset(ones, 1, sizeof ones);
    for (uint32_t l = 0; l < 2; l++)
        CHECK(!memcmp(kp_kvpool_k(p, 2, l, 0), ones, sizeof ones) && !memcmp(kp_kvpool_v(p, 2, l, 0), ones, sizeof ones));
    CHECK_EQ_INT(kp_disk_get(t, &key[2], tok[1], p, 3, true), KP_BLOCKREC_TOKENS);
    CHECK(!kp_disk_has(t, &key[2])); /* refused: forgotten */
    kp_disk_get_stats(t, &st);
    CHECK_EQ_INT(st.hits, 2);
    CHECK_EQ_INT(st.fail[KP_BLOCKREC_TOKENS], 1);
    kp_disk_close(t);
    /* a budget below one record: every write refused */
    size_t rs = kp_blockrec_size(p);
    kp_disk_config small = {dir, rs - 1, 0, NULL};
    CHECK(kp_disk_open(&t, &small, &other, p, &err) == KP_OK);
    if (!t) return;
    CHECK(!kp_disk_put(t, &key[3], &key[2], tok[3], 3));
    kp_disk_get_stats(t, &st);
    CHECK_EQ_INT(st.dropped_budget, 1);
    CHECK_EQ_INT(st.blocks, 0); /* the one record there went over the budget at open */
    kp_disk_close(t);
    /* a budget of two records: the least recently used goes */
    kp_disk_config two = {dir, 2 * rs, 0, NULL};
    CHECK(kp_disk_open(&t, &two, &fp, p, &err) == KP_OK);
    if (!t) return;
    kp_disk_get_stats(t, &st);
    CHECK_EQ_INT(st.blocks, 2);
    CHECK(kp_disk_put(t, &key[3], &key[2], tok[3], 3));
    kp_disk_flush(t);
    kp_disk_get_stats(t, &st);
    CHECK_EQ_INT(st.blocks, 2);
    CHECK(kp_disk_has(t, &key[3]));
    CHECK(st.evicted >= 1);
    kp_disk_close(t);
    /* a queue of one: every put is either written or dropped and counted */
    kp_disk_config q1 = {dir, 0, 1, NULL};
    char sub[320];
    snprintf(sub, sizeof sub, "%s/q", dir);
    q1.dir = sub;
    CHECK(kp_disk_open(&t, &q1, &fp, p, &err) == KP_OK);
    if (!t) return;
    uint32_t queued = 0;
    kp_bkey k = zero;
    for (int i = 0; i < 40; i++) {
        int32_t tk[4] = {i, i + 1, i + 2, i + 3};
        kp_bkey next = kp_bkey_next(&k, tk, 4);
        queued += kp_disk_put(t, &next, &k, tk, i % 4);
        k = next;
    }
    kp_disk_flush(t);
    kp_disk_get_stats(t, &st);
    CHECK_EQ_INT(st.writes, queued);
    CHECK_EQ_INT(st.writes + st.dropped_queue, 40);
    CHECK_EQ_INT(st.blocks, queued);
    kp_disk_close(t);
    kp_kvpool_free(p);
}

/* The MAC key file: 32 raw bytes or 64 hex digits; anything else refused.
 * A sealed record verifies under its key only (libsodium's HMAC-SHA-512-256:
 * any flipped byte, or another key, fails), and unsealing without a key
 * only skips the seal. */
/* A snapshot record (staterec.h) on the small pool (blocks of 4, two
 * layers of one head of 4): encoded at pos 6 (2 tail rows of block 1),
 * it is accepted for its own key, chain, pos and tail tokens only, under
 * its fingerprint and state size; a changed row or state byte is a
 * checksum refusal, a short record a truncated one; loading puts the tail
 * rows into another block's first 2 rows (the others untouched) and the
 * state back. The state key is not a block key of the same tokens and
 * depends on pos and on every tail token. */
static void test_state_record(void) {
    kp_kvpool *p = small_pool();
    CHECK(p != NULL);
    if (!p) return;
    int32_t tok[8] = {1, 5, 9, 13, 17, 21, 25, 29};
    float state[10], back[10];
    for (int i = 0; i < 10; i++) state[i] = 0.5f * (float)i - 1.0f;
    kp_bkey fp = kp_bkey_next(NULL, tok, 2), fp2 = kp_bkey_next(NULL, tok, 3);
    kp_bkey parent = kp_bkey_next(NULL, tok, 4), other = kp_bkey_next(NULL, tok + 1, 4);
    kp_bkey key = kp_bkey_state(&parent, tok + 4, 2, 6);
    CHECK(!kp_bkey_eq(&key, &other) && !kp_bkey_eq(&key, &parent));
    kp_bkey k5 = kp_bkey_state(&parent, tok + 4, 1, 5), k6b = kp_bkey_state(&parent, tok + 3, 2, 6);
    kp_bkey block = kp_bkey_next(&parent, tok + 4, 4), k8 = kp_bkey_state(&block, tok + 8, 0, 8);
    CHECK(!kp_bkey_eq(&key, &k5) && !kp_bkey_eq(&key, &k6b) && !kp_bkey_eq(&block, &k8));
    size_t n = kp_staterec_size(p, 6, sizeof state);
    CHECK_EQ_INT(n, KP_STATEREC_HEADER + 2 * 4 + 2 * 2 * 2 * 4 * 2 + sizeof state);
    uint8_t *rec = malloc(n);
    kp_staterec_encode(rec, p, &fp, &key, &parent, 6, tok + 4, 1, state, sizeof state);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &key, &parent, 6, tok + 4, sizeof state), KP_BLOCKREC_OK);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp2, &key, &parent, 6, tok + 4, sizeof state), KP_BLOCKREC_FINGERPRINT);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &k5, &parent, 6, tok + 4, sizeof state), KP_BLOCKREC_TOKENS);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &key, &other, 6, tok + 4, sizeof state), KP_BLOCKREC_TOKENS);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &key, &parent, 5, tok + 4, sizeof state), KP_BLOCKREC_TOKENS);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &key, &parent, 6, tok + 3, sizeof state), KP_BLOCKREC_TOKENS);
    CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &key, &parent, 6, tok + 4, 8 * sizeof(float)), KP_BLOCKREC_FORMAT);
    CHECK_EQ_INT(kp_staterec_check(rec, n - 1, p, &fp, &key, &parent, 6, tok + 4, sizeof state),
                 KP_BLOCKREC_TRUNCATED);
    for (size_t at = KP_STATEREC_HEADER + 8; at < n; at += 13) { /* a tail row or state byte */
        rec[at] ^= 0x01;
        CHECK_EQ_INT(kp_staterec_check(rec, n, p, &fp, &key, &parent, 6, tok + 4, sizeof state), KP_BLOCKREC_CHECKSUM);
        rec[at] ^= 0x01;
    }
    kp_staterec_load(rec, p, 3, back);
    CHECK(memcmp(back, state, sizeof state) == 0);
    for (uint32_t l = 0; l < 2; l++) {
        const uint8_t *k = kp_kvpool_k(p, 3, l, 0), *v = kp_kvpool_v(p, 3, l, 0);
        for (int i = 0; i < 4 * 4 * 2; i++) { /* rows 0-1 from block 1 (2s), rows 2-3 block 3's own (4s) */
            CHECK_EQ_INT(k[i], i < 2 * 4 * 2 ? 2 : 4);
            CHECK_EQ_INT(v[i], i < 2 * 4 * 2 ? 2 : 4);
        }
    }
    free(rec);
    kp_kvpool_free(p);
}

static void test_mac_key_and_seal(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/key", tmpdir);
    uint8_t key[KP_BLOCKREC_KEY_BYTES], k2[KP_BLOCKREC_KEY_BYTES];
    kp_error err = {0};
    FILE *f = fopen(path, "w");
    fputs("  00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff\n", f);
    fclose(f);
    CHECK_EQ_INT(kp_blockrec_key_load(path, key, &err), KP_OK);
    CHECK(key[0] == 0x00 && key[1] == 0x11 && key[15] == 0xff && key[31] == 0xff);
    f = fopen(path, "wb");
    for (int i = 0; i < 32; i++) fputc(31 - i, f);
    fclose(f);
    CHECK_EQ_INT(kp_blockrec_key_load(path, k2, &err), KP_OK);
    CHECK(k2[0] == 31 && k2[31] == 0);
    f = fopen(path, "w");
    fputs("0011223344", f);
    fclose(f);
    CHECK_EQ_INT(kp_blockrec_key_load(path, k2, &err), KP_EINVAL);
    CHECK(strstr(err.msg, "64 hex digits") != NULL);
    snprintf(path, sizeof path, "%s/no-such-key", tmpdir);
    CHECK_EQ_INT(kp_blockrec_key_load(path, k2, &err), KP_EIO);
    /* a record of 200 bytes, sealed */
    uint8_t rec[200 + KP_BLOCKREC_MAC_BYTES];
    for (int i = 0; i < 200; i++) rec[i] = (uint8_t)(i * 7);
    memset(rec + 68, 0, 4);
    kp_blockrec_seal(rec, 200, key);
    CHECK(kp_blockrec_sealed(rec));
    size_t body = 0;
    CHECK_EQ_INT(kp_blockrec_unseal(rec, sizeof rec, key, &body), KP_BLOCKREC_OK);
    CHECK_EQ_INT(body, 200);
    CHECK_EQ_INT(kp_blockrec_unseal(rec, sizeof rec, NULL, &body), KP_BLOCKREC_OK);
    CHECK_EQ_INT(body, 200);
    CHECK_EQ_INT(kp_blockrec_unseal(rec, sizeof rec, k2, &body), KP_BLOCKREC_MAC);
    rec[150] ^= 1;
    CHECK_EQ_INT(kp_blockrec_unseal(rec, sizeof rec, key, &body), KP_BLOCKREC_MAC);
    rec[150] ^= 1;
    memset(rec + 68, 0, 4); /* the flag cleared: not sealed, refused under a key */
    CHECK_EQ_INT(kp_blockrec_unseal(rec, sizeof rec, key, &body), KP_BLOCKREC_MAC);
    CHECK_EQ_INT(kp_blockrec_unseal(rec, sizeof rec, NULL, &body), KP_BLOCKREC_OK);
    CHECK_EQ_INT(body, sizeof rec);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvpin-tiers-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_mac_key_and_seal);
    RUN(test_state_record);
    RUN(test_tier_alone);
    RUN(test_equal_through_disk);
    RUN(test_recurrent_disk);
    RUN(test_equal_through_redis);
    RUN(test_pin_writes_through);
    RUN(test_long_sequence_written_whole);
    RUN(test_window_budget_and_disk);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) return 1;
    return harness_finish("tiers");
}
