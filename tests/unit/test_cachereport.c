/*
 * test_cachereport.c - the end of a generated sequence (kp_cachereport_finish).
 *
 * What it leaves behind is read back by others than itself: the index
 * through kp_eng_probe (the first token the engine does not hold), the
 * positions it indexed against kp_eng_finish of the same sequence on a
 * second engine, and the history through kp_cachereport_explain, whose cause is
 * "hit" when an earlier sequence of the history is a prefix of the request
 * and "cold" when the history is empty (doctor's rules).
 *
 * And where a report says the request left the cache, on every vocabulary
 * in the tree (tests/data/vocab: byte-level BPE ones whose detokenizer
 * cleans up spaces, " ." -> ".", and ones that do not; SentencePiece):
 * two texts that differ first at a byte the test places after text that
 * clean-up would change are reported to diverge at that byte of the
 * request (the first differing byte, an oracle of the texts alone), the
 * cause is not "whitespace", and the token the report names covers it.
 *
 * And the same text cached as other tokens (a word encoded in two halves,
 * as a model may write it, then sent back and encoded whole) is reported
 * "retokenized" at the request token where the ids part, which lies in the
 * text both share, on every vocabulary where such a split spells the same
 * bytes (checked on the detokenized ids, the test's oracle).
 *
 * And a reuse cut short by a window budget is "window_evicted".
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cachereport.h"
#include "gguf/gguf.h"
#include "engine/engine.h"
#include "harness.h"

#define N 24

typedef struct {
    kp_model *m;
    kp_tok_vocab *v;
    kp_threads *pool;
} stories;

static bool open_stories(stories *s) {
    kp_error err = {0};
    memset(s, 0, sizeof *s);
    bool ok = kp_model_load(&s->m, harness_path("models/stories260K.gguf"), &err) == KP_OK &&
              kp_tok_vocab_load(&s->v, s->m->file, &err) == KP_OK && kp_threads_new(&s->pool, 1, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    return ok;
}

static void close_stories(stories *s) {
    kp_threads_free(s->pool);
    kp_tok_vocab_free(s->v);
    kp_model_free(s->m);
}

/* The cause kp_cachereport_explain gives tokens[0..n) against history c on engine e. */
static kp_doctor_cause cause_of(kp_cachereport *c, kp_engine *e, const int32_t *tokens, uint32_t n) {
    kp_eng_report r;
    kp_eng_probe(e, tokens, n, &r);
    kp_doctor_report d;
    kp_error err = {0};
    kp_status st = kp_cachereport_explain(c, tokens, n, NULL, 0, &r, KP_DOCTOR_ESCAPE_HUMAN, &d, &err);
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
    kp_cachereport *history = NULL, *unused = NULL;
    CHECK(kp_eng_new(&e, s.m, s.pool, NULL, NULL, &err) == KP_OK);
    CHECK(kp_eng_new(&ref, s.m, s.pool, NULL, NULL, &err) == KP_OK);
    CHECK(kp_cachereport_new(&history, s.v, 8, 1024, &err) == KP_OK);
    CHECK(kp_cachereport_new(&unused, s.v, 8, 1024, &err) == KP_OK);
    if (!e || !ref || !history || !unused) goto done;
    int32_t t[N];
    for (int i = 0; i < N; i++) t[i] = i == 0 ? 1 : 100 + i;

    kp_eng_seq a = {0}, b = {0};
    CHECK(kp_eng_prefill(e, t, 12, &a, NULL, NULL, &err) == KP_OK);
    CHECK(kp_eng_prefill(ref, t, 12, &b, NULL, NULL, &err) == KP_OK);
    uint32_t added = 99, ref_added = 0;
    CHECK(kp_cachereport_finish(history, e, &a, t, 20, &added, &err) == KP_OK);
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
    CHECK(kp_cachereport_finish(NULL, e, &a, t, N, &added, &err) == KP_OK);
    CHECK_EQ_INT(added, N - 12);
    CHECK_EQ_INT(diverged_at(e, t, N), N);
    CHECK_EQ_INT(cause_of(unused, e, t, N), KP_DOCTOR_CAUSE_COLD);

    /* a sequence that holds nothing (a prefill that failed) is released
     * without indexing or remembering anything */
    kp_eng_seq empty = {0};
    kp_eng_stats before, after;
    kp_eng_get_stats(e, &before);
    CHECK(kp_cachereport_finish(unused, e, &empty, t, N, &added, &err) == KP_OK);
    kp_eng_get_stats(e, &after);
    CHECK_EQ_INT(added, 0);
    CHECK_EQ_INT(after.cached_tokens, before.cached_tokens);
    CHECK_EQ_INT(after.used_bytes, before.used_bytes);
    CHECK_EQ_INT(cause_of(unused, e, t, N), KP_DOCTOR_CAUSE_COLD);
done:
    kp_cachereport_free(unused);
    kp_cachereport_free(history);
    kp_eng_free(ref);
    kp_eng_free(e);
    close_stories(&s);
}

/* Under a window budget (gen-gemma3: a window of 16 on 5 of 6 layers,
 * blocks of 16): A = 80 tokens, finished, keeps the window rows of its
 * last block only (engine.c). A prompt that leaves A at token 40 matches
 * 40 tokens, but the window before 40 is gone and no earlier position has
 * its window (block 0 has none either): it reuses 0, and its cause is
 * window_evicted, with a detail that says where the tokens matched and
 * where the reuse resumed. A itself again (a full hit, 79 reused: its
 * window is held) is a hit. */
static void test_window_evicted(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_tok_vocab *v = NULL;
    kp_threads *pool = NULL;
    kp_engine *e = NULL;
    kp_cachereport *history = NULL;
    bool ok = kp_model_load(&m, harness_path("tests/data/models/gen-gemma3-f32.gguf"), &err) == KP_OK &&
              kp_tok_vocab_load(&v, m->file, &err) == KP_OK && kp_threads_new(&pool, 1, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    if (!ok) goto done;
    uint64_t wb = 16 * kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, KP_DTYPE_F16, KP_DTYPE_F16);
    kp_eng_config c = {KP_DTYPE_F16, 16, 0, 128, false, NULL, KP_DTYPE_F16, false, 64 * wb, 0};
    CHECK_MSG(kp_eng_new(&e, m, pool, NULL, &c, &err) == KP_OK, "%s", err.msg);
    CHECK(kp_cachereport_new(&history, v, 8, 1024, &err) == KP_OK);
    if (!e || !history) goto done;
    int32_t a[80], b[80];
    for (int i = 0; i < 80; i++) a[i] = i == 0 ? 1 : 100 + i;
    memcpy(b, a, sizeof a);
    b[40] = 7;
    kp_eng_seq s = {0};
    CHECK(kp_eng_prefill(e, a, 80, &s, NULL, NULL, &err) == KP_OK);
    CHECK(kp_cachereport_finish(history, e, &s, a, 80, NULL, &err) == KP_OK);
    kp_eng_report r;
    kp_eng_probe(e, b, 80, &r);
    CHECK_EQ_INT(r.diverged_at_token, 40);
    CHECK_EQ_INT(r.window_cut_from, 40);
    CHECK_EQ_INT(r.reused_tokens, 0);
    kp_doctor_report d;
    CHECK(kp_cachereport_explain(history, b, 80, NULL, 0, &r, KP_DOCTOR_ESCAPE_HUMAN, &d, &err) == KP_OK);
    CHECK_EQ_STR(kp_doctor_cause_name(d.finding.cause), "window_evicted");
    CHECK_MSG(strstr(d.finding.detail, "matched 40 of 80 tokens") && strstr(d.finding.detail, "resumed at token 0"),
              "%s", d.finding.detail);
    kp_eng_probe(e, a, 80, &r);
    CHECK_EQ_INT(r.reused_tokens, 79);
    CHECK_EQ_INT(r.window_cut_from, 0);
    CHECK_EQ_INT(cause_of(history, e, a, 80), KP_DOCTOR_CAUSE_HIT);
done:
    kp_cachereport_free(history);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_tok_vocab_free(v);
    kp_model_free(m);
}

/* A model with recurrent layers (qwen35) resumes at a state snapshot
 * (engine.h, state_cut_from): a request extending a finished sequence
 * resumes at its end (a snapshot), one that leaves it at token 30 finds no
 * snapshot before (they are at 40 only, its end) and gets the cause
 * state_checkpoint, whose detail says where it matched and how much was
 * computed again. */
static void test_recurrent_state(void) {
    kp_error err = {0};
    kp_model *m = NULL;
    kp_tok_vocab *v = NULL;
    kp_threads *pool = NULL;
    kp_engine *e = NULL;
    kp_cachereport *history = NULL;
    bool ok = kp_model_load(&m, harness_path("tests/data/models/gen-qwen35-f32.gguf"), &err) == KP_OK &&
              kp_tok_vocab_load(&v, m->file, &err) == KP_OK && kp_threads_new(&pool, 1, &err) == KP_OK;
    CHECK_MSG(ok, "%s", err.msg);
    if (!ok) goto done;
    CHECK_MSG(kp_eng_new(&e, m, pool, NULL, NULL, &err) == KP_OK, "%s", err.msg);
    CHECK(kp_cachereport_new(&history, v, 8, 1024, &err) == KP_OK);
    if (!e || !history) goto done;
    int32_t a[40], b[50];
    for (int i = 0; i < 50; i++) b[i] = i == 0 ? 1 : 100 + i;
    memcpy(a, b, sizeof a);
    kp_eng_seq s = {0};
    kp_eng_report r;
    CHECK(kp_eng_prefill(e, a, 40, &s, NULL, &r, &err) == KP_OK);
    CHECK(r.recurrent && r.reused_tokens == 0);
    CHECK(kp_cachereport_finish(history, e, &s, a, 40, NULL, &err) == KP_OK);
    kp_eng_probe(e, b, 50, &r); /* extends a: resumes at its end */
    CHECK(r.recurrent && r.reused_tokens == 40 && r.state_recomputed_tokens == 0 && r.computed_tokens == 10);
    b[30] = 7;
    kp_eng_probe(e, b, 50, &r);
    CHECK(r.reused_tokens == 0 && r.state_cut_from == 30 && r.state_recomputed_tokens == 30);
    kp_doctor_report d;
    CHECK(kp_cachereport_explain(history, b, 50, NULL, 0, &r, KP_DOCTOR_ESCAPE_HUMAN, &d, &err) == KP_OK);
    CHECK_EQ_STR(kp_doctor_cause_name(d.finding.cause), "state_checkpoint");
    CHECK_MSG(strstr(d.finding.detail, "matched 30 of 50 tokens") && strstr(d.finding.detail, "30 matched tokens"),
              "%s", d.finding.detail);
done:
    kp_cachereport_free(history);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_tok_vocab_free(v);
    kp_model_free(m);
}

static uint32_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    uint32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* One vocabulary: the report of text b against a history holding text a.
 * Returns whether the vocabulary cleans up spaces (0/1), -1 when it does
 * not load (an unsupported kind, named). */
static int divergence_on(const char *path) {
    kp_gguf *g = NULL;
    kp_tok_vocab *v = NULL;
    kp_error err = {0};
    if (kp_gguf_open(&g, path, &err) != KP_OK || kp_tok_vocab_load(&v, g, &err) != KP_OK) {
        printf("  %s: not a vocabulary kvpin loads (%s)\n", path, err.msg);
        kp_gguf_close(g);
        return -1;
    }
    static const char prefix[] = "Hello , world . It 's fine ; ok ? Yes !\nAgain , here . Don 't stop !\n";
    static const char a[] = "Hello , world . It 's fine ; ok ? Yes !\nAgain , here . Don 't stop !\nalpha one";
    static const char b[] = "Hello , world . It 's fine ; ok ? Yes !\nAgain , here . Don 't stop !\nbravo two";
    size_t want = sizeof prefix - 1;
    int32_t *ia = NULL, *ib = NULL;
    size_t na = 0, nb = 0;
    kp_cachereport *c = NULL;
    int cleans = 0;
    bool ok = kp_tok_encode(v, a, strlen(a), true, false, &ia, &na, &err) == KP_OK &&
              kp_tok_encode(v, b, strlen(b), true, false, &ib, &nb, &err) == KP_OK &&
              kp_cachereport_new(&c, v, 8, 1 << 20, &err) == KP_OK && kp_cachereport_add(c, ia, (uint32_t)na, &err) == KP_OK;
    CHECK_MSG(ok, "%s: %s", path, err.msg);
    if (ok) {
        char *shown = NULL;
        size_t sl = 0;
        if (kp_tok_detokenize(v, ia, na, true, false, &shown, &sl, &err) == KP_OK)
            cleans = !(sl >= strlen(a) && !memcmp(shown + (sl - strlen(a)), a, strlen(a)));
        free(shown);
        kp_eng_report r;
        memset(&r, 0, sizeof r);
        r.diverged_at_token = lcp(ia, na, ib, nb);
        kp_doctor_report d;
        kp_status st = kp_cachereport_explain(c, ib, (uint32_t)nb, b, strlen(b), &r, KP_DOCTOR_ESCAPE_HUMAN, &d, &err);
        CHECK_MSG(st == KP_OK, "%s: %s", path, err.msg);
        if (st == KP_OK) {
            CHECK_MSG(d.div.byte == want, "%s: diverged at byte %zu, the texts differ first at %zu", path, d.div.byte,
                      want);
            CHECK_MSG(d.finding.cause != KP_DOCTOR_CAUSE_WHITESPACE && d.finding.cause != KP_DOCTOR_CAUSE_HIT,
                      "%s: cause %s", path, kp_doctor_cause_name(d.finding.cause));
            /* the token the engine stopped at starts at or before the byte, and
             * its piece reaches past it */
            size_t pl = 0;
            const char *piece = r.diverged_at_token < nb ? kp_tok_piece_view(v, ib[r.diverged_at_token], true, &pl)
                                                         : NULL;
            CHECK_MSG(piece && d.div.token_byte <= want && d.div.token_byte + pl > want,
                      "%s: token %u at byte %zu (%zu bytes) does not cover byte %zu", path,
                      (unsigned)r.diverged_at_token, d.div.token_byte, pl, want);
        }
    }
    kp_cachereport_free(c);
    free(ia);
    free(ib);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    return cleans;
}

/* One vocabulary: a history holding "...alphabetical" encoded as
 * "...alpha" + "betical" and a request of the same text encoded whole plus
 * more. Returns 1 when a split spells the same bytes (and was checked), 0
 * when none does on this vocabulary, -1 when it does not load. */
static int retokenized_on(const char *path) {
    kp_gguf *g = NULL;
    kp_tok_vocab *v = NULL;
    kp_error err = {0};
    if (kp_gguf_open(&g, path, &err) != KP_OK || kp_tok_vocab_load(&v, g, &err) != KP_OK) {
        kp_gguf_close(g);
        return -1;
    }
    static const char text[] = "Sort the list in alphabetical order, then print it.";
    static const char more[] = "Sort the list in alphabetical order, then print it. And count it.";
    size_t word = strstr(text, "alphabetical") - text;
    int checked = 0;
    for (size_t cut = word + 2; cut < word + 11 && !checked; cut++) {
        int32_t *head = NULL, *tail = NULL, *whole = NULL, *req = NULL;
        size_t nh = 0, nt = 0, nw = 0, nr = 0;
        char *raw_split = NULL, *raw_whole = NULL;
        size_t ls = 0, lw = 0;
        bool ok = kp_tok_encode(v, text, cut, true, false, &head, &nh, &err) == KP_OK &&
                  kp_tok_encode(v, text + cut, strlen(text) - cut, false, false, &tail, &nt, &err) == KP_OK &&
                  kp_tok_encode(v, text, strlen(text), true, false, &whole, &nw, &err) == KP_OK &&
                  kp_tok_encode(v, more, strlen(more), true, false, &req, &nr, &err) == KP_OK;
        int32_t *split = ok ? malloc((nh + nt) * sizeof *split) : NULL;
        if (split) {
            memcpy(split, head, nh * sizeof *split);
            memcpy(split + nh, tail, nt * sizeof *split);
            ok = kp_tok_detokenize_raw(v, split, nh + nt, true, false, &raw_split, &ls, NULL, &err) == KP_OK &&
                 kp_tok_detokenize_raw(v, whole, nw, true, false, &raw_whole, &lw, NULL, &err) == KP_OK;
        }
        uint32_t k = split ? lcp(split, nh + nt, req, nr) : 0;
        /* the oracle: the same bytes, other ids, and the request extends the text */
        if (ok && split && ls == lw && !memcmp(raw_split, raw_whole, ls) && k < nh + nt && nr > nw &&
            lcp(whole, nw, req, nr) == nw) {
            kp_cachereport *c = NULL;
            CHECK(kp_cachereport_new(&c, v, 8, 1 << 20, &err) == KP_OK &&
                  kp_cachereport_add(c, split, (uint32_t)(nh + nt), &err) == KP_OK);
            kp_eng_report r;
            memset(&r, 0, sizeof r);
            r.diverged_at_token = k;
            kp_doctor_report d;
            kp_status st = c ? kp_cachereport_explain(c, req, (uint32_t)nr, more, strlen(more), &r,
                                                      KP_DOCTOR_ESCAPE_HUMAN, &d, &err)
                             : KP_EINVAL;
            CHECK_MSG(st == KP_OK, "%s: %s", path, err.msg);
            if (st == KP_OK) {
                CHECK_MSG(d.finding.cause == KP_DOCTOR_CAUSE_RETOKENIZED, "%s: cause %s (%s)", path,
                          kp_doctor_cause_name(d.finding.cause), d.finding.detail);
                CHECK_MSG(d.finding.byte <= cut && d.div.token_index == k, "%s: byte %zu, cut at %zu", path,
                          d.finding.byte, cut);
                char want[32];
                snprintf(want, sizeof want, "token %u is '", (unsigned)k);
                CHECK_MSG(strstr(d.finding.detail, want) && strstr(d.finding.detail, "in the cache"), "%s: %s",
                          path, d.finding.detail);
            }
            kp_cachereport_free(c);
            checked = 1;
        }
        free(head), free(tail), free(whole), free(req), free(split), free(raw_split), free(raw_whole);
    }
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    return checked;
}

static void test_retokenized_every_vocabulary(void) {
    int checked = 0, loaded = 0;
    DIR *dir = opendir(harness_path("tests/data/vocab"));
    CHECK(dir != NULL);
    struct dirent *de;
    while (dir && (de = readdir(dir))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 5, ".gguf")) continue;
        char rel[512];
        snprintf(rel, sizeof rel, "tests/data/vocab/%s", de->d_name);
        int k = retokenized_on(harness_path(rel));
        if (k < 0) continue;
        loaded++;
        checked += k;
        if (!k) printf("  %s: no split of the word spells the same bytes\n", de->d_name);
    }
    if (dir) closedir(dir);
    CHECK_MSG(checked >= 4 && checked * 2 > loaded, "retokenization checked on %d of %d vocabularies", checked,
              loaded);
}

static void test_divergence_every_vocabulary(void) {
    int seen[2] = {0, 0};
    DIR *dir = opendir(harness_path("tests/data/vocab"));
    CHECK(dir != NULL);
    struct dirent *de;
    while (dir && (de = readdir(dir))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 5, ".gguf")) continue;
        char rel[512];
        snprintf(rel, sizeof rel, "tests/data/vocab/%s", de->d_name);
        int k = divergence_on(harness_path(rel));
        if (k >= 0) seen[k]++;
    }
    if (dir) closedir(dir);
    int k = divergence_on(harness_path("models/stories260K.gguf"));
    if (k >= 0) seen[k]++;
    /* both kinds were met: the test covers clean-up on and off */
    CHECK_MSG(seen[0] >= 2 && seen[1] >= 2, "vocabularies without clean-up: %d, with: %d", seen[0], seen[1]);
}

int main(void) {
    RUN(test_finish_indexes_what_was_computed);
    RUN(test_window_evicted);
    RUN(test_recurrent_state);
    RUN(test_divergence_every_vocabulary);
    RUN(test_retokenized_every_vocabulary);
    return harness_finish("cachereport");
}
