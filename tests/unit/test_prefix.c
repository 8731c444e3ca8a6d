/*
 * test_prefix.c - the prefix index (src/prefix.h) over a tiny KV pool.
 *
 * K/V rows are not computed by a model here: a "computed" position p of a
 * token sequence gets, in every layer, a K row holding fp(tokens[0..p]) (a
 * fingerprint of the prefix, from a hash local to this file) and a V row
 * holding its complement. So "the rows a sequence reuses are the right
 * ones" is checked exactly: a reused or indexed row must carry the
 * fingerprint of the very prefix that reaches it.
 *
 * Unit tests: edge splits, token-exact matches not aligned to blocks,
 * copy-on-write of a shared partial block, full hits, pins (ttl, cap),
 * eviction order (LRU, leaves first, held nodes skipped), the evicted
 * record, the memory bill, leases moving with inserts, errors, window rows
 * under a window budget (which blocks kp_pfx_drop_windows spares, and the
 * resume point of a match at every divergence, from the rule). Then a
 * property test: thousands of random operations against a model, checking
 * the invariants after every step.
 */
#include <stdint.h>

#include "harness.h"
#include "kv/kvpool.h"
#include "cache/prefix.h"

enum { N_LAYER = 2, HEAD_DIM = 2 }; /* HEAD_DIM f32 = 8 bytes = one fingerprint */

/* ---- fingerprints --------------------------------------------------------- */

/* FNV-1a over the prefix's token bytes, then a finalizer. */
static uint64_t fp(const int32_t *tokens, uint32_t p) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i <= p; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    h ^= h >> 29;
    return h * 0x94d049bb133111ebull + p;
}

static void put_row(kp_kvpool *pool, int32_t blk, uint32_t row, uint64_t f) {
    for (uint32_t l = 0; l < N_LAYER; l++) {
        uint64_t k = f + l, v = ~(f + l);
        memcpy((float *)kp_kvpool_k(pool, blk, l, 0) + (size_t)row * HEAD_DIM, &k, sizeof k);
        memcpy((float *)kp_kvpool_v(pool, blk, l, 0) + (size_t)row * HEAD_DIM, &v, sizeof v);
    }
}

static bool row_is(const kp_kvpool *pool, int32_t blk, uint32_t row, uint64_t f) {
    for (uint32_t l = 0; l < N_LAYER; l++) {
        uint64_t k, v;
        memcpy(&k, (const float *)kp_kvpool_k(pool, blk, l, 0) + (size_t)row * HEAD_DIM, sizeof k);
        memcpy(&v, (const float *)kp_kvpool_v(pool, blk, l, 0) + (size_t)row * HEAD_DIM, sizeof v);
        if (k != f + l || v != ~(f + l)) return false;
    }
    return true;
}

/* Positions [0, n) of a block table carry the fingerprints of tokens. */
static bool table_ok(const kp_kvpool *pool, const int32_t *blocks, const int32_t *tokens, uint32_t n, uint32_t B) {
    for (uint32_t p = 0; p < n; p++)
        if (!row_is(pool, blocks[p / B], p % B, fp(tokens, p))) return false;
    return true;
}

/* ---- a small test bench ---------------------------------------------------- */

typedef struct {
    kp_kvpool *pool;
    kp_pfx_index *idx;
    uint32_t B;
    int64_t now;
} bench;

static void bench_init(bench *t, uint32_t B, uint32_t n_blocks, uint32_t pinned_cap_blocks, uint32_t record) {
    memset(t, 0, sizeof *t);
    t->B = B;
    t->now = 1000;
    kp_kvpool_config kc = {N_LAYER, 1, HEAD_DIM, KP_DTYPE_F32, B, 0, KP_DTYPE_F32, NULL, 0, 0};
    kc.budget_bytes = (uint64_t)n_blocks * N_LAYER * 2 * B * HEAD_DIM * sizeof(float);
    kp_error err = {0};
    if (kp_kvpool_new(&t->pool, &kc, &err) != KP_OK) {
        fprintf(stderr, "pool: %s\n", err.msg);
        exit(1);
    }
    kp_pfx_config pc = {(uint64_t)pinned_cap_blocks * kp_kvpool_block_bytes(t->pool), record};
    if (kp_pfx_new(&t->idx, t->pool, &pc, &err) != KP_OK) {
        fprintf(stderr, "index: %s\n", err.msg);
        exit(1);
    }
}

static void bench_done(bench *t) {
    kp_pfx_free(t->idx);
    /* with every sequence released, the index held every used block */
    CHECK_EQ_INT(kp_kvpool_n_free(t->pool), kp_kvpool_n_blocks(t->pool));
    kp_kvpool_free(t->pool);
}

/* "Computes" positions seq->n_pos..n-1: reserves blocks (evicting on
 * KP_EFULL) and writes the fingerprints. */
static kp_status compute(bench *t, kp_kvseq *s, const int32_t *tokens, uint32_t n) {
    kp_status st = kp_kvseq_reserve(s, t->pool, n, NULL);
    if (st == KP_EFULL) {
        uint32_t need = (n + t->B - 1) / t->B - s->n_blocks;
        kp_pfx_evict(t->idx, (uint64_t)need * kp_kvpool_block_bytes(t->pool), t->now);
        st = kp_kvseq_reserve(s, t->pool, n, NULL);
    }
    if (st != KP_OK) return st;
    for (uint32_t p = s->n_pos; p < n; p++) put_row(t->pool, s->blocks[p / t->B], p % t->B, fp(tokens, p));
    if (n > s->n_pos) s->n_pos = n;
    return KP_OK;
}

/* A request: reuse what is cached (if reuse), compute the rest. */
static void prompt(bench *t, const int32_t *tokens, uint32_t n, bool reuse, kp_kvseq *s, kp_pfx_lease *lease) {
    memset(s, 0, sizeof *s);
    kp_pfx_match_result m;
    kp_pfx_match(t->idx, tokens, n, &m);
    kp_error err = {0};
    if (reuse) CHECK_MSG(kp_pfx_acquire(t->idx, tokens, m.n_reuse, s, lease, &err) == KP_OK, "%s", err.msg);
    CHECK(compute(t, s, tokens, n) == KP_OK);
}

/* Computes tokens from scratch (or reusing the cache) and indexes them. */
static void add(bench *t, const int32_t *tokens, uint32_t n, bool reuse) {
    kp_kvseq s;
    kp_pfx_lease lease = {0};
    prompt(t, tokens, n, reuse, &s, &lease);
    CHECK(kp_pfx_insert(t->idx, tokens, n, &s, NULL, NULL, NULL) == KP_OK);
    kp_pfx_release(t->idx, &lease);
    kp_kvseq_release(&s, t->pool);
}

/* kp_pfx_walk collectors */
typedef struct {
    uint32_t n;
    uint32_t start[64], end[64], n_blocks[64], first_block[64], holders[64];
    int32_t run[64][32];
    int32_t blocks[64][8];
} nodes_seen;

static int collect(const kp_pfx_node_info *ni, void *ctx) {
    nodes_seen *s = ctx;
    if (s->n < 64) {
        s->start[s->n] = ni->start;
        s->end[s->n] = ni->end;
        s->n_blocks[s->n] = ni->n_blocks;
        s->first_block[s->n] = ni->first_block;
        s->holders[s->n] = ni->n_holders;
        for (uint32_t i = 0; i < ni->n_blocks && i < 8; i++) s->blocks[s->n][i] = ni->blocks[i];
        for (uint32_t i = ni->start; i < ni->end && i - ni->start < 32; i++) s->run[s->n][i - ni->start] = ni->path[i];
    }
    s->n++;
    return 0;
}

typedef struct {
    const kp_kvpool *pool;
    uint32_t B;
    uint32_t bad; /* rows that do not carry their path's fingerprint */
} rows_ctx;

/* (V): every row a node relies on carries the fingerprint of its path. */
static int check_node_rows(const kp_pfx_node_info *ni, void *ctx) {
    rows_ctx *c = ctx;
    for (uint32_t j = 0; j < ni->n_blocks; j++) {
        uint32_t i = ni->first_block + j, lo = i * c->B, hi = (i + 1) * c->B;
        if (hi > ni->end) hi = ni->end;
        for (uint32_t p = lo; p < hi; p++)
            if (!row_is(c->pool, ni->blocks[j], p % c->B, fp(ni->path, p))) c->bad++;
    }
    return 0;
}

static uint32_t bad_rows(bench *t) {
    rows_ctx c = {t->pool, t->B, 0};
    CHECK(kp_pfx_walk(t->idx, check_node_rows, &c, NULL) == KP_OK);
    return c.bad;
}

static void check_ok(bench *t) {
    kp_error err = {0};
    CHECK_MSG(kp_pfx_check(t->idx, &err) == KP_OK, "%s", err.msg);
    CHECK_EQ_INT(bad_rows(t), 0);
}

static uint64_t blocks_bytes(bench *t, uint32_t n) { return (uint64_t)n * kp_kvpool_block_bytes(t->pool); }

/* ---- unit tests ------------------------------------------------------------ */

static void test_split(void) {
    bench t;
    bench_init(&t, 4, 32, 8, 8);
    const int32_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 9};
    add(&t, a, 4, true);
    nodes_seen s = {0};
    kp_pfx_walk(t.idx, collect, &s, NULL);
    CHECK_EQ_INT(s.n, 1);
    add(&t, b, 3, true);
    memset(&s, 0, sizeof s);
    kp_pfx_walk(t.idx, collect, &s, NULL);
    /* preorder, children in token order: [1 2], [3 4], [9] */
    CHECK_EQ_INT(s.n, 3);
    CHECK(s.start[0] == 0 && s.end[0] == 2 && s.run[0][0] == 1 && s.run[0][1] == 2);
    CHECK(s.start[1] == 2 && s.end[1] == 4 && s.run[1][0] == 3 && s.run[1][1] == 4);
    CHECK(s.start[2] == 2 && s.end[2] == 3 && s.run[2][0] == 9);
    /* all three runs live in block index 0 */
    CHECK(s.first_block[0] == 0 && s.first_block[1] == 0 && s.first_block[2] == 0);
    CHECK(s.n_blocks[0] == 1 && s.n_blocks[1] == 1 && s.n_blocks[2] == 1);
    check_ok(&t);
    /* [1 2] and [3 4] share block X (two index refs); [9] has the copy X' */
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.index_bytes, blocks_bytes(&t, 2));
    CHECK_EQ_INT(st.used_bytes, blocks_bytes(&t, 2));
    CHECK_EQ_INT(st.n_nodes, 3);
    CHECK_EQ_INT(st.n_leaves, 2);
    CHECK_EQ_INT(st.cached_tokens, 5);

    kp_pfx_match_result m;
    kp_pfx_match(t.idx, a, 4, &m);
    CHECK(m.n_match == 4 && m.n_reuse == 3); /* full hit: recompute the last position */
    const int32_t q1[] = {1, 2, 9, 9};
    kp_pfx_match(t.idx, q1, 4, &m);
    CHECK(m.n_match == 3 && m.n_reuse == 3 && m.edge_start == 2 && m.edge_end == 3);
    CHECK(m.n_continuations == 0 && m.cached_next == -1 && !m.evicted);
    const int32_t q2[] = {1, 5};
    kp_pfx_match(t.idx, q2, 2, &m);
    CHECK(m.n_match == 1 && m.edge_start == 0 && m.edge_end == 2 && m.cached_next == 2);
    const int32_t q3[] = {1, 2, 7};
    kp_pfx_match(t.idx, q3, 3, &m);
    CHECK(m.n_match == 2 && m.n_continuations == 2 && m.cached_next == -1);
    const int32_t q4[] = {7};
    kp_pfx_match(t.idx, q4, 1, &m);
    CHECK(m.n_match == 0 && m.n_reuse == 0 && m.edge_end == 0 && m.n_continuations == 1 && m.cached_next == 1);

    /* the same tokens again (or a prefix of them) add nothing */
    kp_kvseq sq;
    prompt(&t, a, 4, false, &sq, NULL);
    uint32_t added = 99;
    CHECK(kp_pfx_insert(t.idx, a, 4, &sq, NULL, &added, NULL) == KP_OK && added == 0);
    CHECK(kp_pfx_insert(t.idx, a, 2, &sq, NULL, &added, NULL) == KP_OK && added == 0);
    CHECK(kp_pfx_insert(t.idx, a, 3, &sq, NULL, &added, NULL) == KP_OK && added == 0);
    kp_kvseq_release(&sq, t.pool);
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_nodes, 3);
    CHECK_EQ_INT(st.index_bytes, blocks_bytes(&t, 2));
    check_ok(&t);
    bench_done(&t);
}

/* Reuse stops at the first differing token, whatever the block size. */
static void test_unaligned_reuse_and_cow(void) {
    bench t;
    bench_init(&t, 4, 32, 8, 8);
    const int32_t a[] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    const int32_t b[] = {5, 6, 7, 8, 9, 10, 11, 40, 41};
    add(&t, a, 10, false);
    nodes_seen s = {0};
    kp_pfx_walk(t.idx, collect, &s, NULL);
    CHECK(s.n == 1 && s.n_blocks[0] == 3);

    kp_pfx_match_result m;
    kp_pfx_match(t.idx, b, 9, &m);
    CHECK_EQ_INT(m.n_match, 7);
    CHECK_EQ_INT(m.cached_next, 12);
    nodes_seen before = {0};
    kp_pfx_walk(t.idx, collect, &before, NULL); /* the index's own blocks of a */
    kp_kvseq seq = {0};
    kp_pfx_lease lease = {0};
    kp_error err = {0};
    CHECK_MSG(kp_pfx_acquire(t.idx, b, m.n_reuse, &seq, &lease, &err) == KP_OK, "%s", err.msg);
    CHECK_EQ_INT(seq.n_pos, 7);
    CHECK_EQ_INT(seq.n_blocks, 2);
    /* block 0 is shared (whole, never written); block 1 is a private copy */
    CHECK_EQ_INT(seq.blocks[0], before.blocks[0][0]);
    CHECK(seq.blocks[1] != before.blocks[0][1]);
    CHECK_EQ_INT(kp_kvpool_refcount(t.pool, seq.blocks[0]), 2);
    CHECK_EQ_INT(kp_kvpool_refcount(t.pool, seq.blocks[1]), 1);
    CHECK_EQ_INT(kp_kvpool_refcount(t.pool, before.blocks[0][1]), 1); /* the index's only */
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.shared_bytes, blocks_bytes(&t, 1));
    CHECK_EQ_INT(st.saved_bytes, blocks_bytes(&t, 1));
    CHECK_EQ_INT(st.used_bytes, blocks_bytes(&t, 4));
    CHECK(table_ok(t.pool, seq.blocks, b, 7, 4)); /* the copy carries rows 4..6 */
    /* writing b's positions 7, 8 touches only the copy: a's rows 7..9 survive */
    CHECK(compute(&t, &seq, b, 9) == KP_OK);
    CHECK(table_ok(t.pool, seq.blocks, b, 9, 4));
    check_ok(&t);
    uint32_t added = 0;
    CHECK(kp_pfx_insert(t.idx, b, 9, &seq, &lease, &added, NULL) == KP_OK);
    CHECK_EQ_INT(added, 2);
    memset(&s, 0, sizeof s);
    kp_pfx_walk(t.idx, collect, &s, NULL);
    CHECK_EQ_INT(s.n, 3); /* [5..11] 0..7, [12 13 14] 7..10, [40 41] 7..9 */
    CHECK(s.end[0] == 7 && s.start[1] == 7 && s.end[1] == 10 && s.start[2] == 7 && s.end[2] == 9);
    CHECK(s.holders[0] == 1 && s.holders[1] == 0 && s.holders[2] == 1); /* the lease moved to b's leaf */
    check_ok(&t);
    kp_pfx_release(t.idx, &lease);
    kp_kvseq_release(&seq, t.pool);

    /* a reuse that ends on a block boundary copies nothing */
    kp_pfx_acquire(t.idx, a, 8, &seq, NULL, NULL);
    CHECK(seq.n_pos == 8 && seq.n_blocks == 2);
    CHECK(kp_kvpool_refcount(t.pool, seq.blocks[0]) >= 2 && kp_kvpool_refcount(t.pool, seq.blocks[1]) >= 2);
    CHECK(table_ok(t.pool, seq.blocks, a, 8, 4));
    kp_kvseq_release(&seq, t.pool);

    /* a full hit: n_reuse = n - 1, the last position lands in a private copy */
    kp_pfx_match(t.idx, a, 10, &m);
    CHECK(m.n_match == 10 && m.n_reuse == 9);
    kp_pfx_acquire(t.idx, a, m.n_reuse, &seq, NULL, NULL);
    CHECK(seq.n_pos == 9 && seq.n_blocks == 3 && kp_kvpool_refcount(t.pool, seq.blocks[2]) == 1);
    put_row(t.pool, seq.blocks[2], 1, 0xdeadull); /* recompute position 9 into the copy */
    check_ok(&t); /* the index's row 9 is untouched */
    kp_kvseq_release(&seq, t.pool);
    bench_done(&t);
}

/* With block size 1 every block is whole: nothing is ever copied. */
static void test_block_size_one(void) {
    bench t;
    bench_init(&t, 1, 64, 8, 8);
    const int32_t a[] = {1, 2, 3, 4, 5}, b[] = {1, 2, 3, 9, 9, 9};
    add(&t, a, 5, true);
    kp_kvseq seq;
    kp_pfx_lease lease = {0};
    prompt(&t, b, 6, true, &seq, &lease);
    CHECK(seq.n_pos == 6);
    for (uint32_t i = 0; i < 3; i++) CHECK_EQ_INT(kp_kvpool_refcount(t.pool, seq.blocks[i]), 2);
    CHECK(kp_pfx_insert(t.idx, b, 6, &seq, NULL, NULL, NULL) == KP_OK);
    kp_pfx_release(t.idx, &lease);
    kp_kvseq_release(&seq, t.pool);
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.index_bytes, blocks_bytes(&t, 8)); /* 3 shared + 2 + 3 */
    check_ok(&t);
    bench_done(&t);
}

/* A running sequence indexes itself step by step: one node that grows. */
static void test_lease_and_extend(void) {
    bench t;
    bench_init(&t, 4, 32, 8, 8);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = 100 + i;
    kp_kvseq seq;
    kp_pfx_lease lease = {0};
    prompt(&t, tok, 5, true, &seq, &lease);
    uint32_t added = 0;
    CHECK(kp_pfx_insert(t.idx, tok, 5, &seq, &lease, &added, NULL) == KP_OK && added == 5);
    for (uint32_t n = 6; n <= 16; n++) {
        CHECK(compute(&t, &seq, tok, n) == KP_OK);
        CHECK(kp_pfx_insert(t.idx, tok, n, &seq, &lease, &added, NULL) == KP_OK && added == 1);
    }
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_nodes, 1);
    CHECK_EQ_INT(st.n_leases, 1);
    CHECK_EQ_INT(st.index_bytes, blocks_bytes(&t, 4));
    CHECK_EQ_INT(st.shared_bytes, blocks_bytes(&t, 4));
    check_ok(&t);
    /* held: nothing to evict */
    CHECK_EQ_INT(kp_pfx_evict(t.idx, blocks_bytes(&t, 100), t.now), 0);
    kp_pfx_release(t.idx, &lease);
    CHECK_EQ_INT(kp_pfx_evict(t.idx, blocks_bytes(&t, 100), t.now), 0); /* the sequence still uses them */
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_nodes, 0);
    CHECK_EQ_INT(st.n_evictions, 1);
    kp_kvseq_release(&seq, t.pool);
    CHECK_EQ_INT(kp_kvpool_n_free(t.pool), kp_kvpool_n_blocks(t.pool));
    bench_done(&t);
}

static void test_pins(void) {
    bench t;
    bench_init(&t, 4, 32, 2, 8);
    const int32_t a[] = {1, 1, 1, 1, 2, 2, 2, 2}, b[] = {3, 3, 3, 3, 3, 3, 3, 3};
    add(&t, a, 8, false);
    add(&t, b, 8, false);
    kp_error err = {0};
    uint64_t id1 = 0, id2 = 0, id3 = 0;
    CHECK_MSG(kp_pfx_pin(t.idx, a, 8, 10, t.now, &id1, &err) == KP_OK, "%s", err.msg);
    CHECK(id1 != 0);
    /* a third block would pass the cap of two */
    CHECK(kp_pfx_pin(t.idx, b, 4, 0, t.now, &id2, &err) == KP_EFULL);
    CHECK(id2 == 0);
    check_ok(&t);
    /* pinning inside a pinned path costs nothing more; it splits the run at 5 */
    CHECK(kp_pfx_pin(t.idx, a, 5, 0, t.now, &id3, &err) == KP_OK);
    nodes_seen s = {0};
    kp_pfx_walk(t.idx, collect, &s, NULL);
    CHECK(s.n == 3 && s.end[0] == 5 && s.start[1] == 5 && s.end[1] == 8);
    const int32_t c[] = {1, 1, 7};
    CHECK(kp_pfx_pin(t.idx, c, 3, 0, t.now, &id2, &err) == KP_ENOTFOUND);
    CHECK(kp_pfx_pin(t.idx, a, 0, 0, t.now, &id2, &err) == KP_EINVAL);
    CHECK(kp_pfx_pin(t.idx, a, 2, -1, t.now, &id2, &err) == KP_EINVAL);
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.pinned_bytes, blocks_bytes(&t, 2));
    CHECK_EQ_INT(st.n_pins, 2);
    check_ok(&t);

    /* evict everything possible: b goes, a stays */
    kp_pfx_evict(t.idx, blocks_bytes(&t, 100), t.now + 5);
    kp_pfx_match_result m;
    kp_pfx_match(t.idx, a, 8, &m);
    CHECK_EQ_INT(m.n_match, 8);
    kp_pfx_match(t.idx, b, 8, &m);
    CHECK_EQ_INT(m.n_match, 0);
    /* at now + 10 the ttl pin expires; the 5-token pin has no ttl */
    CHECK_EQ_INT(kp_pfx_expire(t.idx, t.now + 9), 0);
    kp_pfx_evict(t.idx, blocks_bytes(&t, 100), t.now + 10);
    kp_pfx_match(t.idx, a, 8, &m);
    CHECK_EQ_INT(m.n_match, 5);
    CHECK(kp_pfx_unpin(t.idx, id1, &err) == KP_ENOTFOUND); /* expired */
    CHECK(kp_pfx_unpin(t.idx, id3, &err) == KP_OK);
    CHECK(kp_pfx_unpin(t.idx, id3, &err) == KP_ENOTFOUND);
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.pinned_bytes, 0);
    check_ok(&t);
    kp_pfx_evict(t.idx, blocks_bytes(&t, 100), t.now + 10);
    kp_pfx_match(t.idx, a, 8, &m);
    CHECK_EQ_INT(m.n_match, 0);
    /* a cap of zero refuses every pin */
    kp_pfx_free(t.idx);
    kp_pfx_config zero = {0, 0};
    CHECK(kp_pfx_new(&t.idx, t.pool, &zero, NULL) == KP_OK);
    add(&t, a, 8, false);
    CHECK(kp_pfx_pin(t.idx, a, 1, 0, t.now, &id2, &err) == KP_EFULL);
    check_ok(&t);
    bench_done(&t);
}

static void test_eviction_order(void) {
    bench t;
    bench_init(&t, 4, 32, 8, 8);
    const int32_t p1[] = {1, 0, 0, 0, 0}, p2[] = {2, 0, 0, 0, 0}, p3[] = {3, 0, 0, 0, 0};
    add(&t, p1, 5, false);
    add(&t, p2, 5, false);
    add(&t, p3, 5, false);
    /* a running sequence holds p1 (and makes it the most recent) */
    kp_kvseq seq = {0};
    kp_pfx_lease lease = {0};
    CHECK(kp_pfx_acquire(t.idx, p1, 4, &seq, &lease, NULL) == KP_OK);
    uint32_t free0 = kp_kvpool_n_free(t.pool);
    /* the least recently used unheld leaf is p2 */
    CHECK_EQ_INT(kp_pfx_evict(t.idx, 1, t.now), blocks_bytes(&t, 2));
    CHECK_EQ_INT(kp_kvpool_n_free(t.pool), free0 + 2);
    kp_pfx_match_result m;
    kp_pfx_match(t.idx, p2, 5, &m);
    CHECK(m.n_match == 0 && m.evicted && m.evicted_len == 5);
    kp_pfx_match(t.idx, p3, 5, &m);
    CHECK_EQ_INT(m.n_match, 5);
    CHECK_EQ_INT(kp_pfx_evict(t.idx, 1, t.now), blocks_bytes(&t, 2));
    kp_pfx_match(t.idx, p3, 5, &m);
    CHECK(m.n_match == 0 && m.evicted);
    /* only the held p1 is left */
    CHECK_EQ_INT(kp_pfx_evict(t.idx, 1, t.now), 0);
    kp_pfx_match(t.idx, p1, 5, &m);
    CHECK_EQ_INT(m.n_match, 5);
    check_ok(&t);
    kp_pfx_release(t.idx, &lease);
    /* p1's first block is still used by the sequence: only the second is freed */
    CHECK_EQ_INT(kp_pfx_evict(t.idx, 1, t.now), blocks_bytes(&t, 1));
    kp_kvseq_release(&seq, t.pool);

    /* leaves first: a shared parent goes only after its children */
    const int32_t a[] = {7, 7, 7, 7, 7, 7, 1, 1}, b[] = {7, 7, 7, 7, 7, 7, 2, 2}, c[] = {7, 7, 7, 7, 7, 7, 3, 3};
    add(&t, a, 8, true);
    add(&t, b, 8, true);
    add(&t, c, 8, true);
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_nodes, 4);
    /* touch a: b becomes the least recently used leaf */
    CHECK(kp_pfx_acquire(t.idx, a, 7, &seq, NULL, NULL) == KP_OK);
    kp_kvseq_release(&seq, t.pool);
    kp_pfx_evict(t.idx, 1, t.now);
    kp_pfx_match(t.idx, b, 8, &m);
    CHECK(m.n_match == 6 && m.evicted && m.evicted_len == 8);
    kp_pfx_match(t.idx, a, 8, &m);
    CHECK_EQ_INT(m.n_match, 8);
    kp_pfx_match(t.idx, c, 8, &m);
    CHECK_EQ_INT(m.n_match, 8);
    kp_pfx_evict(t.idx, 1, t.now); /* c next; then the parent merges with a */
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_nodes, 1);
    kp_pfx_match(t.idx, c, 8, &m);
    CHECK(m.n_match == 6 && m.evicted && m.edge_start == 0 && m.edge_end == 8 && m.cached_next == 1);
    check_ok(&t);
    kp_pfx_evict(t.idx, 1, t.now);
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_nodes, 0);
    CHECK_EQ_INT(st.index_bytes, 0);
    CHECK_EQ_INT(st.n_evictions, 6); /* p2 p3 p1, b c, then the merged 7 7 7 7 7 7 1 1 */
    bench_done(&t);
}

static void test_evicted_record(void) {
    bench t;
    bench_init(&t, 4, 32, 8, 2);
    const int32_t a[] = {5, 6, 7, 8, 9, 10}, b[] = {1, 2}, c[] = {3, 4}, d[] = {4, 4};
    kp_pfx_match_result m;
    kp_pfx_match(t.idx, a, 6, &m);
    CHECK(m.n_match == 0 && !m.evicted); /* never seen */
    add(&t, a, 5, false);
    kp_pfx_match(t.idx, a, 6, &m);
    CHECK(m.n_match == 5 && !m.evicted); /* 10 was never cached after 5..9 */
    kp_pfx_evict(t.idx, 1, t.now);
    kp_pfx_match(t.idx, a, 6, &m);
    CHECK(m.n_match == 0 && m.evicted && m.evicted_len == 5);
    const int32_t other[] = {5, 1};
    kp_pfx_match(t.idx, other, 2, &m); /* "5" continued the cache once: evicted */
    CHECK(m.n_match == 0 && m.evicted);
    const int32_t never[] = {6, 5};
    kp_pfx_match(t.idx, never, 2, &m);
    CHECK(!m.evicted);
    /* the record keeps only the last two evictions */
    add(&t, b, 2, false);
    add(&t, c, 2, false);
    add(&t, d, 2, false);
    kp_pfx_evict(t.idx, blocks_bytes(&t, 3), t.now);
    kp_pfx_match(t.idx, a, 6, &m);
    CHECK(!m.evicted);
    kp_pfx_match(t.idx, b, 2, &m);
    CHECK(!m.evicted);
    kp_pfx_match(t.idx, c, 2, &m);
    CHECK(m.evicted);
    kp_pfx_match(t.idx, d, 2, &m);
    CHECK(m.evicted);
    bench_done(&t);
}

/* A prefix held by eight sequences is billed once. */
static void test_memory_bill(void) {
    bench t;
    bench_init(&t, 4, 32, 8, 8);
    int32_t tok[9];
    for (int i = 0; i < 9; i++) tok[i] = i;
    add(&t, tok, 9, false);
    kp_kvseq seqs[8];
    kp_pfx_lease leases[8];
    memset(seqs, 0, sizeof seqs);
    memset(leases, 0, sizeof leases);
    for (int i = 0; i < 8; i++) CHECK(kp_pfx_acquire(t.idx, tok, 8, &seqs[i], &leases[i], NULL) == KP_OK);
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.budget_bytes, blocks_bytes(&t, 32));
    CHECK_EQ_INT(st.index_bytes, blocks_bytes(&t, 3));
    CHECK_EQ_INT(st.used_bytes, blocks_bytes(&t, 3));
    CHECK_EQ_INT(st.free_bytes, blocks_bytes(&t, 29));
    CHECK_EQ_INT(st.shared_bytes, blocks_bytes(&t, 2));
    CHECK_EQ_INT(st.saved_bytes, blocks_bytes(&t, 16));
    CHECK_EQ_INT(st.n_leases, 8);
    CHECK_EQ_INT(st.n_lookups, 8);
    CHECK_EQ_INT(st.n_hits, 8);
    CHECK_EQ_INT(st.reused_tokens, 64);
    kp_pfx_prefix_info top[4];
    uint32_t n_top = 0;
    CHECK(kp_pfx_top(t.idx, top, 4, &n_top, NULL) == KP_OK);
    CHECK_EQ_INT(n_top, 1);
    CHECK(top[0].n_tokens == 9 && top[0].bytes == blocks_bytes(&t, 3) && top[0].own_bytes == blocks_bytes(&t, 3));
    CHECK(top[0].n_holders == 8 && !top[0].pinned && top[0].hash == kp_pfx_hash(tok, 9) && top[0].hits == 8);
    /* a branch at 6 splits the run there: [0..5] keeps block index 1, which
     * [6 7 8] shares (the same block), while the branch has its own copy */
    const int32_t br[] = {0, 1, 2, 3, 4, 5, 50, 51, 52, 53, 54, 55};
    add(&t, br, 12, true);
    CHECK(kp_pfx_top(t.idx, top, 4, &n_top, NULL) == KP_OK);
    CHECK_EQ_INT(n_top, 2);
    CHECK(top[0].n_tokens == 12 && top[0].bytes == blocks_bytes(&t, 3) && top[0].own_bytes == blocks_bytes(&t, 2));
    CHECK(top[1].n_tokens == 9 && top[1].bytes == blocks_bytes(&t, 3) && top[1].own_bytes == blocks_bytes(&t, 1));
    CHECK(kp_pfx_top(t.idx, top, 1, &n_top, NULL) == KP_OK && n_top == 1 && top[0].n_tokens == 12);
    for (int i = 0; i < 8; i++) {
        kp_pfx_release(t.idx, &leases[i]);
        kp_kvseq_release(&seqs[i], t.pool);
    }
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.shared_bytes, 0);
    CHECK_EQ_INT(st.n_leases, 0);
    check_ok(&t);
    bench_done(&t);
}

static void test_errors(void) {
    bench t;
    bench_init(&t, 4, 3, 8, 8);
    kp_pfx_free(NULL);
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    kp_kvseq seq = {0};
    kp_pfx_lease lease = {0};
    kp_error err = {0};
    CHECK(kp_pfx_acquire(t.idx, a, 3, &seq, &lease, &err) == KP_EINVAL); /* nothing cached */
    CHECK(kp_pfx_acquire(t.idx, a, 0, &seq, &lease, &err) == KP_OK && seq.n_pos == 0 && !lease.node);
    CHECK(compute(&t, &seq, a, 10) == KP_OK); /* all 3 blocks */
    CHECK(kp_pfx_insert(t.idx, a, 11, &seq, NULL, NULL, &err) == KP_EINVAL);
    CHECK(kp_pfx_insert(t.idx, a, 10, &seq, NULL, NULL, &err) == KP_OK);
    kp_kvseq other = {0};
    CHECK(kp_pfx_acquire(t.idx, a, 4, &seq, NULL, &err) == KP_EINVAL); /* seq not empty */
    /* the pool is full and the sequence uses every block: no copy possible */
    CHECK(kp_pfx_acquire(t.idx, a, 5, &other, &lease, &err) == KP_EFULL);
    CHECK(other.n_blocks == 0 && other.n_pos == 0 && !lease.node);
    kp_pfx_stats st;
    kp_pfx_get_stats(t.idx, &st);
    CHECK_EQ_INT(st.n_leases, 0);
    check_ok(&t);
    kp_kvseq_release(&seq, t.pool);
    /* now the acquire's eviction cannot free its own (held) path either */
    CHECK(kp_pfx_acquire(t.idx, a, 5, &other, &lease, &err) == KP_EFULL);
    /* reuse on a block boundary needs no new block */
    CHECK(kp_pfx_acquire(t.idx, a, 4, &other, &lease, &err) == KP_OK);
    CHECK(kp_pfx_acquire(t.idx, a, 4, &seq, &lease, &err) == KP_EINVAL); /* lease in use */
    kp_pfx_release(t.idx, &lease);
    kp_pfx_release(t.idx, &lease); /* no-op */
    kp_kvseq_release(&other, t.pool);
    check_ok(&t);
    bench_done(&t);
}

/* ---- property test ----------------------------------------------------------- */

enum { MAXLEN = 20, N_LIVE = 4, N_HIST = 16, N_PINS = 32 };

typedef struct {
    bool live;
    kp_kvseq seq;
    kp_pfx_lease lease;
    uint32_t held; /* tokens[0..held) are held by the lease */
    int32_t tokens[MAXLEN];
    uint32_t n;
} sim_seq;

typedef struct {
    uint64_t id;
    int32_t tokens[MAXLEN];
    uint32_t n;
    int64_t expires;
} sim_pin;

typedef struct {
    bench t;
    uint64_t rng;
    uint32_t vocab;
    sim_seq live[N_LIVE];
    int32_t hist[N_HIST][MAXLEN];
    uint32_t hist_n[N_HIST];
    sim_pin pins[N_PINS];
    uint32_t n_pins;
    uint32_t *refs; /* scratch: expected refcount per block */
    uint64_t n_ops[16];
    uint32_t failures;
} sim;

static uint32_t rnd(sim *s, uint32_t n) {
    s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((s->rng >> 33) % n);
}

/* longest common prefix of q with any indexed path (the reference match) */
typedef struct {
    const int32_t *q;
    uint32_t n, best;
} lcp_ctx;

static int lcp_node(const kp_pfx_node_info *ni, void *ctx) {
    lcp_ctx *c = ctx;
    uint32_t l = 0;
    while (l < c->n && l < ni->end && ni->path[l] == c->q[l]) l++;
    if (l > c->best) c->best = l;
    return 0;
}

static uint32_t ref_match(sim *s, const int32_t *q, uint32_t n) {
    lcp_ctx c = {q, n, 0};
    kp_pfx_walk(s->t.idx, lcp_node, &c, NULL);
    return c.best;
}

typedef struct {
    uint32_t *refs;
} refs_ctx;

static int count_refs(const kp_pfx_node_info *ni, void *ctx) {
    refs_ctx *c = ctx;
    for (uint32_t i = 0; i < ni->n_blocks; i++) c->refs[ni->blocks[i]]++;
    return 0;
}

static void make_tokens(sim *s, int32_t *out, uint32_t *n_out) {
    uint32_t n = 1 + rnd(s, MAXLEN), keep = 0;
    uint32_t src = rnd(s, N_HIST + N_LIVE);
    const int32_t *from = NULL;
    uint32_t from_n = 0;
    if (src < N_HIST && s->hist_n[src]) {
        from = s->hist[src];
        from_n = s->hist_n[src];
    } else if (src >= N_HIST && s->live[src - N_HIST].live) {
        from = s->live[src - N_HIST].tokens;
        from_n = s->live[src - N_HIST].n;
    }
    if (from && rnd(s, 4)) keep = rnd(s, (from_n < n ? from_n : n) + 1);
    for (uint32_t i = 0; i < n; i++) out[i] = i < keep ? from[i] : (int32_t)rnd(s, s->vocab);
    *n_out = n;
}

static void sim_drop(sim *s, sim_seq *q, bool index_it) {
    if (index_it && q->seq.n_pos) {
        kp_error err = {0};
        uint32_t n = q->seq.n_pos < q->n ? q->seq.n_pos : q->n;
        CHECK_MSG(kp_pfx_insert(s->t.idx, q->tokens, n, &q->seq, NULL, NULL, &err) == KP_OK, "%s", err.msg);
        uint32_t h = rnd(s, N_HIST);
        memcpy(s->hist[h], q->tokens, n * sizeof(int32_t));
        s->hist_n[h] = n;
    }
    kp_pfx_release(s->t.idx, &q->lease);
    kp_kvseq_release(&q->seq, s->t.pool);
    q->live = false;
    q->held = 0;
}

/* Indexes a live sequence's computed tokens and moves its lease there. */
static void sim_insert_running(sim *s, sim_seq *q) {
    kp_pfx_match_result m;
    kp_pfx_match(s->t.idx, q->tokens, q->n, &m);
    uint32_t added = 0;
    kp_error err = {0};
    CHECK_MSG(kp_pfx_insert(s->t.idx, q->tokens, q->n, &q->seq, &q->lease, &added, &err) == KP_OK, "%s", err.msg);
    CHECK_EQ_INT(added, q->n - m.n_match);
    q->held = q->n;
}

static void sim_start(sim *s) {
    sim_seq *q = NULL;
    for (int i = 0; i < N_LIVE; i++)
        if (!s->live[i].live) q = &s->live[i];
    if (!q) return;
    memset(q, 0, sizeof *q);
    make_tokens(s, q->tokens, &q->n);
    kp_pfx_match_result m;
    kp_pfx_match(s->t.idx, q->tokens, q->n, &m);
    CHECK_EQ_INT(m.n_match, ref_match(s, q->tokens, q->n));
    CHECK(m.n_reuse == (m.n_match == q->n ? q->n - 1 : m.n_match));
    q->live = true;
    if (rnd(s, 5)) {
        kp_error err = {0};
        kp_status st = kp_pfx_acquire(s->t.idx, q->tokens, m.n_reuse, &q->seq, &q->lease, &err);
        if (st == KP_EFULL) {
            CHECK(q->seq.n_blocks == 0 && !q->lease.node);
            q->live = false;
            return;
        }
        CHECK_MSG(st == KP_OK, "%s", err.msg);
        CHECK_EQ_INT(q->seq.n_pos, m.n_reuse);
        CHECK(table_ok(s->t.pool, q->seq.blocks, q->tokens, m.n_reuse, s->t.B));
        if (m.n_reuse % s->t.B) CHECK_EQ_INT(kp_kvpool_refcount(s->t.pool, q->seq.blocks[q->seq.n_blocks - 1]), 1);
        q->held = m.n_reuse;
    }
    if (compute(&s->t, &q->seq, q->tokens, q->n) != KP_OK) {
        sim_drop(s, q, false);
        return;
    }
    if (rnd(s, 2)) sim_insert_running(s, q);
}

static void sim_decode(sim *s, sim_seq *q) {
    uint32_t k = 1 + rnd(s, 4);
    if (q->n + k > MAXLEN) {
        sim_drop(s, q, true);
        return;
    }
    for (uint32_t i = 0; i < k; i++) q->tokens[q->n + i] = (int32_t)rnd(s, s->vocab);
    if (compute(&s->t, &q->seq, q->tokens, q->n + k) != KP_OK) {
        sim_drop(s, q, true);
        return;
    }
    q->n += k;
    if (rnd(s, 2)) sim_insert_running(s, q);
}

/* Drops the model's pins whose ttl has passed; returns how many. */
static uint32_t sim_model_expire(sim *s, int64_t now) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_pins;) {
        if (s->pins[i].expires && s->pins[i].expires <= now) {
            s->pins[i] = s->pins[--s->n_pins];
            n++;
        } else {
            i++;
        }
    }
    return n;
}

static void sim_pin_op(sim *s) {
    int32_t tok[MAXLEN];
    uint32_t n;
    make_tokens(s, tok, &n);
    n = 1 + rnd(s, n);
    int64_t ttl = rnd(s, 2) ? 0 : 1 + rnd(s, 20);
    kp_pfx_match_result m;
    kp_pfx_match(s->t.idx, tok, n, &m);
    uint64_t id = 0;
    kp_error err = {0};
    kp_status st = kp_pfx_pin(s->t.idx, tok, n, ttl, s->t.now, &id, &err);
    if (m.n_match < n) {
        CHECK(st == KP_ENOTFOUND);
    } else if (st == KP_OK) {
        if (s->n_pins < N_PINS) {
            sim_pin *p = &s->pins[s->n_pins++];
            p->id = id;
            memcpy(p->tokens, tok, n * sizeof(int32_t));
            p->n = n;
            p->expires = ttl ? s->t.now + ttl : 0;
        } else {
            CHECK(kp_pfx_unpin(s->t.idx, id, NULL) == KP_OK);
        }
    } else {
        CHECK_MSG(st == KP_EFULL, "%s", err.msg);
    }
}

static void sim_check(sim *s, uint32_t step) {
    bench *t = &s->t;
    kp_error err = {0};
    if (kp_pfx_check(t->idx, &err) != KP_OK) {
        CHECK_MSG(0, "step %u: %s", step, err.msg);
        s->failures++;
        return;
    }
    uint32_t nb = kp_kvpool_n_blocks(t->pool);
    memset(s->refs, 0, nb * sizeof(uint32_t));
    refs_ctx rc = {s->refs};
    kp_pfx_walk(t->idx, count_refs, &rc, NULL);
    for (int i = 0; i < N_LIVE; i++) {
        sim_seq *q = &s->live[i];
        if (!q->live) continue;
        for (uint32_t b = 0; b < q->seq.n_blocks; b++) s->refs[q->seq.blocks[b]]++;
        /* nobody overwrote a live sequence's rows */
        if (!table_ok(t->pool, q->seq.blocks, q->tokens, q->seq.n_pos, t->B)) {
            CHECK_MSG(0, "step %u: live sequence %d has foreign rows", step, i);
            s->failures++;
        }
        /* what a lease holds is still indexed */
        if (q->held && ref_match(s, q->tokens, q->held) < q->held) {
            CHECK_MSG(0, "step %u: a held prefix was evicted", step);
            s->failures++;
        }
    }
    /* refcounts: every reference belongs to the index or a live sequence,
     * and nothing else holds a block (no leak) */
    uint32_t used = 0;
    for (uint32_t b = 0; b < nb; b++) {
        uint32_t rcount = kp_kvpool_refcount(t->pool, (int32_t)b);
        if (rcount) used++;
        if (rcount != s->refs[b]) {
            CHECK_MSG(0, "step %u: block %u refcount %u, %u references known", step, b, rcount, s->refs[b]);
            s->failures++;
            break;
        }
    }
    if (used + kp_kvpool_n_free(t->pool) != nb) {
        CHECK_MSG(0, "step %u: %u used + %u free != %u blocks", step, used, kp_kvpool_n_free(t->pool), nb);
        s->failures++;
    }
    kp_pfx_stats st;
    kp_pfx_get_stats(t->idx, &st);
    if (st.used_bytes > st.budget_bytes || st.index_bytes > st.used_bytes || st.pinned_bytes > st.pinned_cap_bytes ||
        st.pinned_bytes > st.index_bytes || st.used_bytes != (uint64_t)used * st.block_bytes) {
        CHECK_MSG(0, "step %u: bill used %llu budget %llu index %llu pinned %llu cap %llu", step,
                  (unsigned long long)st.used_bytes, (unsigned long long)st.budget_bytes,
                  (unsigned long long)st.index_bytes, (unsigned long long)st.pinned_bytes,
                  (unsigned long long)st.pinned_cap_bytes);
        s->failures++;
    }
    /* pinned prefixes are all still there */
    for (uint32_t i = 0; i < s->n_pins; i++) {
        kp_pfx_match_result m;
        kp_pfx_match(t->idx, s->pins[i].tokens, s->pins[i].n, &m);
        if (m.n_match != s->pins[i].n) {
            CHECK_MSG(0, "step %u: pinned prefix of %u tokens evicted (%u left)", step, s->pins[i].n, m.n_match);
            s->failures++;
        }
    }
    if (st.n_pins != s->n_pins) {
        CHECK_MSG(0, "step %u: %u pins, model has %u", step, st.n_pins, s->n_pins);
        s->failures++;
    }
    /* every indexed row carries its path's fingerprint */
    uint32_t bad = bad_rows(t);
    if (bad) {
        CHECK_MSG(0, "step %u: %u indexed rows with the wrong K/V", step, bad);
        s->failures++;
    }
}

static void run_property(uint64_t seed, uint32_t B, uint32_t n_blocks, uint32_t vocab, uint32_t steps) {
    sim s;
    memset(&s, 0, sizeof s);
    s.rng = seed;
    s.vocab = vocab;
    bench_init(&s.t, B, n_blocks, n_blocks / 3, 8);
    s.refs = calloc(n_blocks, sizeof(uint32_t));
    for (uint32_t step = 0; step < steps && s.failures < 5; step++) {
        uint32_t op = rnd(&s, 100);
        sim_seq *q = &s.live[rnd(&s, N_LIVE)];
        if (op < 25) {
            sim_start(&s);
            s.n_ops[0]++;
        } else if (op < 45) {
            if (q->live) sim_decode(&s, q);
            s.n_ops[1]++;
        } else if (op < 55) {
            if (q->live) sim_drop(&s, q, true);
            s.n_ops[2]++;
        } else if (op < 58) {
            if (q->live) sim_drop(&s, q, false);
            s.n_ops[3]++;
        } else if (op < 66) {
            uint64_t want = (uint64_t)rnd(&s, 4) * kp_kvpool_block_bytes(s.t.pool);
            sim_model_expire(&s, s.t.now);
            uint32_t free0 = kp_kvpool_n_free(s.t.pool);
            uint64_t got = kp_pfx_evict(s.t.idx, want, s.t.now);
            CHECK_EQ_INT(got, (uint64_t)(kp_kvpool_n_free(s.t.pool) - free0) * kp_kvpool_block_bytes(s.t.pool));
            s.n_ops[4]++;
        } else if (op < 76) {
            sim_pin_op(&s);
            s.n_ops[5]++;
        } else if (op < 80) {
            if (s.n_pins) {
                uint32_t i = rnd(&s, s.n_pins);
                CHECK(kp_pfx_unpin(s.t.idx, s.pins[i].id, NULL) == KP_OK);
                s.pins[i] = s.pins[--s.n_pins];
            }
            CHECK(kp_pfx_unpin(s.t.idx, 1000000 + rnd(&s, 1000), NULL) == KP_ENOTFOUND);
            s.n_ops[6]++;
        } else if (op < 86) {
            s.t.now += rnd(&s, 6);
            uint32_t expired = sim_model_expire(&s, s.t.now);
            CHECK_EQ_INT(kp_pfx_expire(s.t.idx, s.t.now), expired);
            s.n_ops[7]++;
        } else {
            int32_t tok[MAXLEN];
            uint32_t n;
            make_tokens(&s, tok, &n);
            kp_pfx_match_result m;
            kp_pfx_match(s.t.idx, tok, n, &m);
            CHECK_EQ_INT(m.n_match, ref_match(&s, tok, n));
            s.n_ops[8]++;
        }
        sim_check(&s, step);
    }
    kp_pfx_stats st;
    kp_pfx_get_stats(s.t.idx, &st);
    if (getenv("PFX_VERBOSE")) /* how much each run exercised */
        fprintf(stderr,
                "seed %llu B %u: hits %llu/%llu evictions %llu nodes %u pins %u"
                " ops %llu %llu %llu %llu %llu %llu %llu %llu %llu\n",
                (unsigned long long)seed, B, (unsigned long long)st.n_hits, (unsigned long long)st.n_lookups,
                (unsigned long long)st.n_evictions, st.n_nodes, st.n_pins, (unsigned long long)s.n_ops[0],
                (unsigned long long)s.n_ops[1], (unsigned long long)s.n_ops[2], (unsigned long long)s.n_ops[3],
                (unsigned long long)s.n_ops[4], (unsigned long long)s.n_ops[5], (unsigned long long)s.n_ops[6],
                (unsigned long long)s.n_ops[7], (unsigned long long)s.n_ops[8]);
    /* the run exercised what it claims to */
    CHECK(st.n_hits > steps / 20);
    CHECK(st.n_evictions > steps / 50);
    for (int i = 0; i < N_LIVE; i++)
        if (s.live[i].live) sim_drop(&s, &s.live[i], true);
    sim_check(&s, steps);
    free(s.refs);
    bench_done(&s.t);
}

static void test_property(void) {
    run_property(1, 4, 16, 3, 5000);
    run_property(2, 3, 20, 2, 5000);
    run_property(3, 1, 40, 3, 4000);
    run_property(4, 8, 9, 4, 4000);
}

/* Window rows under a window budget (kvpool.h's window arena): layer 1 is
 * a WINDOW layer of W = 4, blocks of B = 4. A = 12 tokens, then A
 * extended to 20 (its leaf grows in place: 12 is no end any more), and C
 * = 8 other tokens, pinned. Every block was written with its window rows.
 * kp_pfx_drop_windows spares the blocks reaching into [e - W, e) of an
 * end e (leaf 20: block 4; pin 8: block 1) and drops the other five. A
 * prompt diverging from A at d then reuses, by the rule (a query at p
 * reads window rows of p - W < q <= p), the latest p <= d (19 on a full
 * hit) whose [p - W + 1, p) lies in held blocks, found here by trying
 * every p; the full-layer rows of what it reuses carry the right
 * fingerprints. */
static void test_window_drops(void) {
    enum { B = 4, W = 4 };
    const uint8_t kinds[N_LAYER] = {0, 1};
    kp_kvpool_config kc = {N_LAYER, 1, HEAD_DIM, KP_DTYPE_F32, B, 0, KP_DTYPE_F32, kinds, W, 0};
    uint64_t layer_block = 2 * B * HEAD_DIM * sizeof(float); /* one layer's K and V of a block */
    kc.window_budget_bytes = 8 * layer_block;
    kc.budget_bytes = kc.window_budget_bytes + 16 * layer_block;
    kp_kvpool *pool = NULL;
    kp_pfx_index *idx = NULL;
    kp_error err = {0};
    CHECK_MSG(kp_kvpool_new(&pool, &kc, &err) == KP_OK, "%s", err.msg);
    if (!pool) return;
    CHECK(kp_kvpool_window_budgeted(pool) && kp_kvpool_n_slots(pool) == 8 && kp_kvpool_n_blocks(pool) == 16);
    CHECK(kp_pfx_new(&idx, pool, NULL, &err) == KP_OK);
    int32_t a[20], c[8];
    for (int i = 0; i < 20; i++) a[i] = 1 + i;
    for (int i = 0; i < 8; i++) c[i] = 100 + i;
    const int32_t *seqs[3] = {a, a, c};
    uint32_t lens[3] = {12, 20, 8};
    for (int k = 0; k < 3; k++) {
        kp_kvseq s = {0};
        kp_pfx_lease lease = {0};
        kp_pfx_match_result m;
        kp_pfx_match(idx, seqs[k], lens[k], &m);
        CHECK(kp_pfx_acquire(idx, seqs[k], m.n_reuse, &s, &lease, &err) == KP_OK);
        CHECK(kp_kvseq_reserve(&s, pool, lens[k], &err) == KP_OK);
        for (uint32_t p = s.n_pos; p < lens[k]; p++) {
            CHECK(kp_kvpool_attach_window(pool, s.blocks[p / B], &err) == KP_OK);
            put_row(pool, s.blocks[p / B], p % B, fp(seqs[k], p));
        }
        s.n_pos = lens[k];
        CHECK(kp_pfx_insert(idx, seqs[k], lens[k], &s, NULL, NULL, &err) == KP_OK);
        kp_pfx_release(idx, &lease);
        kp_kvseq_release(&s, pool);
    }
    uint64_t pin;
    CHECK(kp_pfx_pin(idx, c, 8, 0, 0, &pin, &err) == KP_OK);
    kp_pfx_stats ps;
    kp_pfx_get_stats(idx, &ps);
    CHECK_EQ_INT(ps.index_window_blocks, 7);
    CHECK_EQ_INT(kp_kvpool_n_free_slots(pool), 1);
    /* two asked for: A's oldest positions go first (C, pinned last, is the most recently used) */
    CHECK_EQ_INT(kp_pfx_drop_windows(idx, 2), 2);
    {
        kp_pfx_match_result m;
        kp_pfx_match(idx, a, 20, &m);
        kp_kvseq s = {0};
        CHECK(kp_pfx_acquire(idx, a, 16, &s, NULL, &err) == KP_OK);
        CHECK(!kp_kvpool_has_window(pool, s.blocks[0]) && !kp_kvpool_has_window(pool, s.blocks[1]) &&
              kp_kvpool_has_window(pool, s.blocks[2]) && kp_kvpool_has_window(pool, s.blocks[3]));
        kp_kvseq_release(&s, pool);
    }
    CHECK_EQ_INT(kp_pfx_drop_windows(idx, 100), 3);
    CHECK_EQ_INT(kp_kvpool_n_free_slots(pool), 6);
    kp_pfx_get_stats(idx, &ps);
    CHECK_EQ_INT(ps.index_window_blocks, 2);
    CHECK_EQ_INT(ps.window_drops, 5);
    bool held[5] = {false, false, false, false, true};
    for (uint32_t d = 1; d <= 20; d++) {
        int32_t q[20];
        memcpy(q, a, sizeof q);
        if (d < 20) q[d] = 999;
        uint32_t match = d < 20 ? d : 19, expect = 0;
        for (uint32_t p = match; p > 0 && !expect; p--) {
            bool whole = true;
            for (uint32_t x = p + 1 > W ? p + 1 - W : 0; x < p; x++) whole = whole && held[x / B];
            if (whole) expect = p;
        }
        kp_pfx_match_result m;
        kp_pfx_match(idx, q, 20, &m);
        CHECK_MSG(m.n_reuse == expect, "diverging at %u: reuse %u, the rule says %u", d, m.n_reuse, expect);
        CHECK_EQ_INT(m.n_match, d < 20 ? d : 20);
        CHECK_EQ_INT(m.window_cut_from, expect < match ? match : 0);
        kp_kvseq s = {0};
        CHECK(kp_pfx_acquire(idx, q, m.n_reuse, &s, NULL, &err) == KP_OK);
        for (uint32_t p = 0; p < m.n_reuse; p++) {
            uint64_t k;
            memcpy(&k, (const float *)kp_kvpool_k(pool, s.blocks[p / B], 0, 0) + (size_t)(p % B) * HEAD_DIM, sizeof k);
            CHECK(k == fp(a, p));
        }
        kp_kvseq_release(&s, pool);
    }
    /* the pinned C on a full hit: block 1 holds [4, 7) */
    kp_pfx_match_result m;
    kp_pfx_match(idx, c, 8, &m);
    CHECK_EQ_INT(m.n_reuse, 7);
    CHECK_EQ_INT(m.window_cut_from, 0);
    kp_pfx_free(idx);
    CHECK_EQ_INT(kp_kvpool_n_free(pool), 16);
    CHECK_EQ_INT(kp_kvpool_n_free_slots(pool), 8);
    kp_kvpool_free(pool);
}

/* A marked resume point (kp_pfx_mark: a message's start) as
 * test_window_drops sets it up (W = 4, B = 4), with A marked at 12 before
 * it is extended to 20: the leaf gets a child instead of growing in place
 * (3 nodes, not 2), so 12 stays an end. kp_pfx_drop_windows then spares
 * block 2 (it reaches into [8, 12)) while other rows can go: asked for 4
 * it drops A's blocks 0, 1, 3 and C's block 0, and a prompt leaving A at
 * 13 still resumes at 12; asked for one more it gives up the window
 * before the mark (a second pass; leaves and pins are still spared), and
 * that prompt resumes at 0. */
static void test_window_marks(void) {
    enum { B = 4, W = 4 };
    const uint8_t kinds[N_LAYER] = {0, 1};
    kp_kvpool_config kc = {N_LAYER, 1, HEAD_DIM, KP_DTYPE_F32, B, 0, KP_DTYPE_F32, kinds, W, 0};
    uint64_t layer_block = 2 * B * HEAD_DIM * sizeof(float);
    kc.window_budget_bytes = 8 * layer_block;
    kc.budget_bytes = kc.window_budget_bytes + 16 * layer_block;
    kp_kvpool *pool = NULL;
    kp_pfx_index *idx = NULL;
    kp_error err = {0};
    CHECK_MSG(kp_kvpool_new(&pool, &kc, &err) == KP_OK, "%s", err.msg);
    if (!pool) return;
    CHECK(kp_pfx_new(&idx, pool, NULL, &err) == KP_OK);
    int32_t a[20], c[8], q[20];
    for (int i = 0; i < 20; i++) a[i] = 1 + i;
    for (int i = 0; i < 8; i++) c[i] = 100 + i;
    const int32_t *seqs[3] = {a, a, c};
    uint32_t lens[3] = {12, 20, 8};
    for (int k = 0; k < 3; k++) {
        kp_kvseq s = {0};
        kp_pfx_match_result m;
        kp_pfx_match(idx, seqs[k], lens[k], &m);
        CHECK(kp_pfx_acquire(idx, seqs[k], m.n_reuse, &s, NULL, &err) == KP_OK);
        CHECK(kp_kvseq_reserve(&s, pool, lens[k], &err) == KP_OK);
        for (uint32_t p = s.n_pos; p < lens[k]; p++) {
            CHECK(kp_kvpool_attach_window(pool, s.blocks[p / B], &err) == KP_OK);
            put_row(pool, s.blocks[p / B], p % B, fp(seqs[k], p));
        }
        s.n_pos = lens[k];
        CHECK(kp_pfx_insert(idx, seqs[k], lens[k], &s, NULL, NULL, &err) == KP_OK);
        if (k == 0) CHECK(kp_pfx_mark(idx, a, 12, &err) == KP_OK);
        kp_kvseq_release(&s, pool);
    }
    for (int i = 0; i < 20; i++) q[i] = 500 + i;
    CHECK_EQ_INT(kp_pfx_mark(idx, c, 8, &err), KP_OK);      /* idempotent on an end */
    CHECK_EQ_INT(kp_pfx_mark(idx, q, 3, &err), KP_ENOTFOUND); /* q is not cached */
    uint64_t pin;
    CHECK(kp_pfx_pin(idx, c, 8, 0, 0, &pin, &err) == KP_OK);
    kp_pfx_stats ps;
    kp_pfx_get_stats(idx, &ps);
    CHECK_EQ_INT(ps.n_nodes, 3);
    memcpy(q, a, sizeof q);
    q[13] = 999;
    kp_pfx_match_result m;
    CHECK_EQ_INT(kp_pfx_drop_windows(idx, 4), 4);
    kp_pfx_match(idx, q, 20, &m);
    CHECK_EQ_INT(m.n_reuse, 12);
    CHECK_EQ_INT(m.window_cut_from, 13);
    CHECK_EQ_INT(kp_pfx_drop_windows(idx, 1), 1);
    kp_pfx_match(idx, q, 20, &m);
    CHECK_EQ_INT(m.n_reuse, 0);
    CHECK_EQ_INT(kp_pfx_drop_windows(idx, 100), 0); /* the leaf's and the pin's stay */
    kp_pfx_match(idx, c, 8, &m);
    CHECK_EQ_INT(m.n_reuse, 7);
    CHECK(kp_pfx_check(idx, &err) == KP_OK);
    kp_pfx_free(idx);
    CHECK_EQ_INT(kp_kvpool_n_free_slots(pool), 8);
    kp_kvpool_free(pool);
}

/* A branch is a resume point too: A = 16 tokens, D = A's first 8 and 8
 * others (the index splits A at 8: [0..8) with two children). Every block
 * written with its window rows (W = 4, B = 4), kp_pfx_drop_windows keeps
 * block 1 (the W positions before the branch at 8) and the blocks before
 * the two leaves' ends at 16 (block index 3 of each), and drops the other
 * three: a third prompt that leaves both at 8 still reuses 8. */
static void test_window_branch(void) {
    enum { B = 4, W = 4 };
    const uint8_t kinds[N_LAYER] = {0, 1};
    kp_kvpool_config kc = {N_LAYER, 1, HEAD_DIM, KP_DTYPE_F32, B, 0, KP_DTYPE_F32, kinds, W, 0};
    uint64_t layer_block = 2 * B * HEAD_DIM * sizeof(float);
    kc.window_budget_bytes = 8 * layer_block;
    kc.budget_bytes = kc.window_budget_bytes + 16 * layer_block;
    kp_kvpool *pool = NULL;
    kp_pfx_index *idx = NULL;
    kp_error err = {0};
    CHECK_MSG(kp_kvpool_new(&pool, &kc, &err) == KP_OK, "%s", err.msg);
    if (!pool) return;
    CHECK(kp_pfx_new(&idx, pool, NULL, &err) == KP_OK);
    int32_t a[16], d[16], q[16];
    for (int i = 0; i < 16; i++) {
        a[i] = 1 + i;
        d[i] = i < 8 ? a[i] : 50 + i;
        q[i] = i < 8 ? a[i] : 90 + i;
    }
    const int32_t *seqs[2] = {a, d};
    for (int k = 0; k < 2; k++) {
        kp_kvseq s = {0};
        kp_pfx_match_result m;
        kp_pfx_match(idx, seqs[k], 16, &m);
        CHECK(kp_pfx_acquire(idx, seqs[k], m.n_reuse, &s, NULL, &err) == KP_OK);
        CHECK(kp_kvseq_reserve(&s, pool, 16, &err) == KP_OK);
        for (uint32_t p = s.n_pos; p < 16; p++) {
            CHECK(kp_kvpool_attach_window(pool, s.blocks[p / B], &err) == KP_OK);
            put_row(pool, s.blocks[p / B], p % B, fp(seqs[k], p));
        }
        s.n_pos = 16;
        CHECK(kp_pfx_insert(idx, seqs[k], 16, &s, NULL, NULL, &err) == KP_OK);
        kp_kvseq_release(&s, pool);
    }
    CHECK_EQ_INT(kp_kvpool_n_free_slots(pool), 2);
    CHECK_EQ_INT(kp_pfx_drop_windows(idx, 100), 3);
    kp_pfx_match_result m;
    kp_pfx_match(idx, q, 16, &m);
    CHECK_EQ_INT(m.n_match, 8);
    CHECK_EQ_INT(m.n_reuse, 8);
    CHECK_EQ_INT(m.window_cut_from, 0);
    kp_pfx_match(idx, a, 16, &m); /* a full hit of A: 15, whose window [12, 15) is block 3's */
    CHECK_EQ_INT(m.n_reuse, 15);
    kp_pfx_free(idx);
    CHECK_EQ_INT(kp_kvpool_n_free_slots(pool), 8);
    kp_kvpool_free(pool);
}

/* Recurrent-state snapshots (prefix.h's top): saved by a sequence, handed
 * to the index on its path, found by kp_pfx_match as the latest resume
 * point at or before the match (state_cut_from), copied into the sequence
 * by kp_pfx_acquire; a split moves them with their positions, a duplicate
 * is stored once, eviction takes the least recently used one alone, the
 * one at a pinned end stays, and every block comes back. */
static void fill_state(float *x, uint32_t n, uint32_t pos) {
    for (uint32_t i = 0; i < n; i++) x[i] = (float)pos + 0.001f * (float)i;
}

static void test_state_snapshots(void) {
    bench t;
    bench_init(&t, 4, 64, 32, 8);
    kp_error err = {0};
    uint64_t fb = kp_kvpool_full_bytes(t.pool), sb = fb + fb / 2; /* two blocks a snapshot */
    uint32_t nf = (uint32_t)(sb / sizeof(float));
    CHECK(kp_pfx_set_state(t.idx, sb, &err) == KP_OK);
    CHECK_EQ_INT(kp_pfx_state_blocks(t.idx), 2);
    float *st = malloc(sb), *want = malloc(sb);
    int32_t a[24], b[24];
    for (int i = 0; i < 24; i++) a[i] = b[i] = 100 + i;
    b[14] = 7;
    /* sequence a: 20 positions, snapshots at 8 and 20 */
    kp_kvseq s = {0};
    CHECK(compute(&t, &s, a, 20) == KP_OK);
    kp_pfx_state s8, s20;
    fill_state(st, nf, 8);
    CHECK(kp_pfx_state_save(t.idx, st, 8, &s8, &err) == KP_OK);
    fill_state(st, nf, 20);
    CHECK(kp_pfx_state_save(t.idx, st, 20, &s20, &err) == KP_OK);
    CHECK(kp_pfx_add_state(t.idx, a, &s8, &err) == KP_ENOTFOUND); /* not indexed yet */
    CHECK(kp_pfx_insert(t.idx, a, 20, &s, NULL, NULL, &err) == KP_OK);
    CHECK(kp_pfx_add_state(t.idx, a, &s8, &err) == KP_OK && s8.blocks == NULL);
    CHECK(kp_pfx_add_state(t.idx, a, &s20, &err) == KP_OK && s20.blocks == NULL);
    kp_kvseq_release(&s, t.pool);
    CHECK_MSG(kp_pfx_check(t.idx, &err) == KP_OK, "%s", err.msg);
    kp_pfx_stats ps;
    kp_pfx_get_stats(t.idx, &ps);
    CHECK(ps.n_states == 2 && ps.state_bytes == 4 * kp_kvpool_block_bytes(t.pool));
    /* a extended: resumes at 20 with the state of 20 */
    kp_pfx_match_result m;
    kp_pfx_match(t.idx, a, 24, &m);
    CHECK(m.n_match == 20 && m.n_reuse == 20 && m.state_cut_from == 0);
    CHECK(kp_pfx_acquire(t.idx, a, 20, &s, NULL, &err) == KP_OK);
    fill_state(want, nf, 20);
    CHECK(s.rstate && s.rstate_pos == 20 && memcmp(s.rstate, want, sb) == 0);
    kp_kvseq_release(&s, t.pool);
    /* b leaves a at 14: resumes at 8; acquiring 14 is refused (no snapshot there) */
    kp_pfx_match(t.idx, b, 24, &m);
    CHECK(m.n_match == 14 && m.n_reuse == 8 && m.state_cut_from == 14);
    CHECK(kp_pfx_acquire(t.idx, b, 14, &s, NULL, &err) == KP_EINVAL);
    CHECK(kp_pfx_acquire(t.idx, b, 8, &s, NULL, &err) == KP_OK);
    fill_state(want, nf, 8);
    CHECK(s.rstate_pos == 8 && memcmp(s.rstate, want, sb) == 0);
    /* b computed and indexed: a's run splits at 14, the snapshot at 8 goes to the head */
    CHECK(compute(&t, &s, b, 24) == KP_OK);
    CHECK(kp_pfx_insert(t.idx, b, 24, &s, NULL, NULL, &err) == KP_OK);
    fill_state(st, nf, 8);
    kp_pfx_state dup;
    CHECK(kp_pfx_state_save(t.idx, st, 8, &dup, &err) == KP_OK);
    uint32_t free_before = kp_kvpool_n_free(t.pool);
    CHECK(kp_pfx_add_state(t.idx, b, &dup, &err) == KP_OK && dup.blocks == NULL); /* stored once: dropped */
    CHECK_EQ_INT(kp_kvpool_n_free(t.pool), free_before + 2);
    kp_kvseq_release(&s, t.pool);
    CHECK_MSG(kp_pfx_check(t.idx, &err) == KP_OK, "%s", err.msg);
    kp_pfx_match(t.idx, a, 24, &m);
    CHECK(m.n_reuse == 20);
    kp_pfx_match(t.idx, b, 24, &m);
    CHECK(m.n_match == 24 && m.n_reuse == 8 && m.state_cut_from == 23);
    CHECK_EQ_INT(kp_pfx_resume(t.idx, b, 23), 8);
    CHECK_EQ_INT(kp_pfx_state_evictable_blocks(t.idx), 4);
    /* a pin at 20 keeps its snapshot; eviction takes the other one, then the leaves */
    uint64_t id;
    CHECK(kp_pfx_pin(t.idx, a, 20, 0, t.now, &id, &err) == KP_OK);
    CHECK_EQ_INT(kp_pfx_state_evictable_blocks(t.idx), 2);
    kp_pfx_evict(t.idx, UINT64_MAX, t.now);
    kp_pfx_get_stats(t.idx, &ps);
    CHECK(ps.n_states == 1 && ps.state_evictions == 1);
    kp_pfx_match(t.idx, a, 24, &m);
    CHECK(m.n_reuse == 20);
    CHECK_MSG(kp_pfx_check(t.idx, &err) == KP_OK, "%s", err.msg);
    CHECK(kp_pfx_unpin(t.idx, id, &err) == KP_OK);
    kp_pfx_evict(t.idx, UINT64_MAX, t.now);
    kp_pfx_get_stats(t.idx, &ps);
    CHECK(ps.n_states == 0 && ps.n_nodes == 0);
    CHECK(kp_pfx_set_state(t.idx, 0, &err) == KP_OK); /* empty again: may be changed */
    free(st);
    free(want);
    bench_done(&t);
}

int main(void) {
    RUN(test_split);
    RUN(test_unaligned_reuse_and_cow);
    RUN(test_block_size_one);
    RUN(test_lease_and_extend);
    RUN(test_pins);
    RUN(test_eviction_order);
    RUN(test_evicted_record);
    RUN(test_window_drops);
    RUN(test_window_marks);
    RUN(test_window_branch);
    RUN(test_memory_bill);
    RUN(test_errors);
    RUN(test_property);
    RUN(test_state_snapshots);
    return harness_finish("prefix");
}
