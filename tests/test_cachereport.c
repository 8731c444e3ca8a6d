/*
 * test_cachereport.c - the end of a generated sequence (kp_crep_finish).
 *
 * What it leaves behind is read back by others than itself: the index
 * through kp_eng_probe (the first token the engine does not hold), the
 * positions it indexed against kp_eng_finish of the same sequence on a
 * second engine, and the history through kp_crep_explain, whose cause is
 * "hit" when an earlier sequence of the history is a prefix of the request
 * and "cold" when the history is empty (doctor's rules).
 */
#include <stdint.h>
#include <string.h>

#include "cache/cachereport.h"
#include "cache/engine.h"
#include "harness.h"

#define N 24

typedef struct {
    kp_model *m;
    kp_tok_vocab *v;
    kp_pool *pool;
} stories;

static bool open_stories(stories *s) {
    kp_error err = {0};
    memset(s, 0, sizeof *s);
    bool ok = kp_model_load(&s->m, harness_path("models/stories260K.gguf"), &err) == KP_OK &&
              kp_tok_vocab_load(&s->v, s->m->file, &err) == KP_OK && kp_pool_new(&s->pool, 1, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    return ok;
}

static void close_stories(stories *s) {
    kp_pool_free(s->pool);
    kp_tok_vocab_free(s->v);
    kp_model_free(s->m);
}

/* The cause kp_crep_explain gives tokens[0..n) against history c on engine e. */
static kp_doctor_cause cause_of(kp_crep *c, kp_engine *e, const int32_t *tokens, uint32_t n) {
    kp_eng_report r;
    kp_eng_probe(e, tokens, n, &r);
    kp_doctor_report d;
    kp_error err = {0};
    kp_status st = kp_crep_explain(c, tokens, n, NULL, 0, &r, KP_DOCTOR_ESCAPE_HUMAN, &d, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    return st == KP_OK ? d.finding.cause : KP_DOCTOR_CAUSE_COUNT;
}

static uint32_t diverged_at(kp_engine *e, const int32_t *tokens, uint32_t n) {
    kp_eng_report r;
    kp_eng_probe(e, tokens, n, &r);
    return r.diverged_at_token;
}

/* A sequence holding 12 positions, ended with 20 tokens given (a sampled
 * token never decoded has no K/V): 12 are indexed and remembered, the
 * sequence is released; without a history only the index changes. */
static void test_finish_indexes_what_was_computed(void) {
    stories s;
    if (!open_stories(&s)) return;
    kp_error err = {0};
    kp_engine *e = NULL, *ref = NULL;
    kp_crep *history = NULL, *unused = NULL;
    CHECK(kp_eng_new(&e, s.m, s.pool, NULL, NULL, &err) == KP_OK);
    CHECK(kp_eng_new(&ref, s.m, s.pool, NULL, NULL, &err) == KP_OK);
    CHECK(kp_crep_new(&history, s.v, 8, 1024, &err) == KP_OK);
    CHECK(kp_crep_new(&unused, s.v, 8, 1024, &err) == KP_OK);
    if (!e || !ref || !history || !unused) goto done;
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = i == 0 ? 1 : 100 + i;

    kp_eng_seq a = {0}, b = {0};
    CHECK(kp_eng_prefill(e, t, 12, &a, NULL, NULL, &err) == KP_OK);
    CHECK(kp_eng_prefill(ref, t, 12, &b, NULL, NULL, &err) == KP_OK);
    uint32_t added = 99, ref_added = 0;
    CHECK(kp_crep_finish(history, e, &a, t, 20, &added, &err) == KP_OK);
    CHECK(kp_eng_finish(ref, &b, t, 12, &ref_added, &err) == KP_OK);
    CHECK_EQ_INT(added, ref_added);
    CHECK_EQ_INT(added, 12); /* an empty index: every position is new */
    CHECK(kp_eng_seq_len(&a) == 0 && a.kv.n_blocks == 0);
    CHECK_EQ_INT(diverged_at(e, t, N), 12);
    CHECK_EQ_INT(diverged_at(e, t, N), diverged_at(ref, t, N));
    CHECK_EQ_INT(cause_of(history, e, t, N), KP_DOCTOR_CAUSE_HIT);
    CHECK_EQ_INT(cause_of(unused, e, t, N), KP_DOCTOR_CAUSE_COLD);

    /* no history: the index grows, nothing is remembered */
    CHECK(kp_eng_prefill(e, t, N, &a, NULL, NULL, &err) == KP_OK);
    CHECK(kp_crep_finish(NULL, e, &a, t, N, &added, &err) == KP_OK);
    CHECK_EQ_INT(added, N - 12);
    CHECK_EQ_INT(diverged_at(e, t, N), N);
    CHECK_EQ_INT(cause_of(unused, e, t, N), KP_DOCTOR_CAUSE_COLD);

    /* a sequence that holds nothing (a prefill that failed) is released
     * without indexing or remembering anything */
    kp_eng_seq empty = {0};
    kp_eng_stats before, after;
    kp_eng_get_stats(e, &before);
    CHECK(kp_crep_finish(unused, e, &empty, t, N, &added, &err) == KP_OK);
    kp_eng_get_stats(e, &after);
    CHECK_EQ_INT(added, 0);
    CHECK_EQ_INT(after.cached_tokens, before.cached_tokens);
    CHECK_EQ_INT(after.used_bytes, before.used_bytes);
    CHECK_EQ_INT(cause_of(unused, e, t, N), KP_DOCTOR_CAUSE_COLD);
done:
    kp_crep_free(unused);
    kp_crep_free(history);
    kp_eng_free(ref);
    kp_eng_free(e);
    close_stories(&s);
}

int main(void) {
    RUN(test_finish_indexes_what_was_computed);
    return harness_finish("cachereport");
}
