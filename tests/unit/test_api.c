/*
 * test_api.c - the public library interface (include/kvpin.h) as a user
 * sees it: only kvpin.h is included, every call goes through kp_lm /
 * kp_session. Expected values come from references and invariants:
 * llama.cpp's token ids and greedy continuation of "Once upon a time"
 * (tests/data/golden/stories260K.once.json), llama2.c's greedy text from
 * BOS (tests/data/stories260K.llama2c-greedy.txt), the reuse a prompt must
 * get computed here from the tokenizer (the longest common token prefix
 * with what earlier generations fed the cache), "cached equals
 * recomputed" (a session without a prefix cache gives the same greedy
 * text), and the KV formula from the model's hyperparameters.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvpin.h"

#define MODEL "models/stories260K.gguf"

static kp_lm *open_lm(void) {
    kp_err err;
    kp_lm *lm = NULL;
    kp_rc rc = kp_lm_open(&lm, MODEL, &err);
    CHECK_MSG(rc == KP_RC_OK, "%s", rc == KP_RC_OK ? "" : err.msg);
    return lm;
}

static kp_session *new_session(const kp_lm *lm, const kp_session_params *p) {
    kp_err err;
    kp_session *s = NULL;
    kp_rc rc = kp_session_new(&s, lm, p, &err);
    CHECK_MSG(rc == KP_RC_OK, "%s", rc == KP_RC_OK ? "" : err.msg);
    return s;
}

/* ids of text (BOS added); caller frees with kp_mem_free */
static int32_t *tokens_of(const kp_lm *lm, const char *text, size_t *n) {
    kp_err err;
    int32_t *ids = NULL;
    *n = 0;
    CHECK(kp_tokenize(lm, text, strlen(text), true, false, &ids, n, &err) == KP_RC_OK);
    return ids;
}

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static kp_request greedy(uint32_t max_tokens) {
    kp_request rq = kp_request_defaults();
    rq.sampling.temp = 0;
    rq.max_tokens = max_tokens;
    return rq;
}

static json_t *golden(void) {
    json_error_t je;
    json_t *g = json_load_file("tests/data/golden/stories260K.once.json", 0, &je);
    CHECK_MSG(g != NULL, "golden: %s", je.text);
    return g;
}

static void test_version_and_names(void) {
    CHECK_EQ_STR(kp_version(), KP_VERSION);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", KP_VERSION_MAJOR, KP_VERSION_MINOR, KP_VERSION_PATCH);
    CHECK_EQ_STR(v, KP_VERSION);
    CHECK_EQ_STR(kp_rc_name(KP_RC_OK), "ok");
    CHECK_EQ_STR(kp_rc_name(KP_RC_IO), "i/o error");
    CHECK_EQ_STR(kp_rc_name((kp_rc)99), "unknown status");
    /* x_free(NULL) are no-ops */
    kp_lm_free(NULL);
    kp_session_free(NULL);
    kp_mem_free(NULL);
}

static void test_open_errors(void) {
    kp_err err;
    kp_lm *lm = (kp_lm *)&err; /* set to NULL on failure */
    CHECK(kp_lm_open(&lm, "tests/data/no-such-model.gguf", &err) == KP_RC_IO);
    CHECK(lm == NULL);
    CHECK(err.code == KP_RC_IO);
    CHECK_MSG(strstr(err.msg, "tests/data/no-such-model.gguf") != NULL, "%s", err.msg);
    CHECK(kp_lm_open(&lm, "tests/data/README.md", &err) == KP_RC_FORMAT);
    CHECK(lm == NULL);
    CHECK_MSG(strstr(err.msg, "tests/data/README.md") != NULL, "%s", err.msg);
    /* a vocabulary-only file: well-formed GGUF, no weights */
    CHECK(kp_lm_open(&lm, "tests/data/vocab/ggml-vocab-deepseek-llm.gguf", &err) == KP_RC_FORMAT);
    CHECK_MSG(strstr(err.msg, "ggml-vocab-deepseek-llm.gguf") && strstr(err.msg, "tensor"), "%s", err.msg);
    CHECK(kp_lm_open(NULL, MODEL, &err) == KP_RC_INVAL);
    CHECK(kp_lm_open(&lm, NULL, NULL) == KP_RC_INVAL); /* a NULL kp_err is allowed */
    kp_session *s = (kp_session *)&err;
    CHECK(kp_session_new(&s, NULL, NULL, &err) == KP_RC_INVAL);
    CHECK(s == NULL);
}

static void test_tokens(void) {
    kp_lm *lm = open_lm();
    json_t *g = golden();
    if (!lm || !g) goto done;
    kp_lm_info info;
    kp_lm_describe(lm, &info);
    CHECK_EQ_STR(info.arch, "llama");
    CHECK_EQ_STR(info.tokenizer, "llama");
    CHECK_EQ_INT(info.n_vocab, json_integer_value(json_object_get(g, "n_vocab")));
    CHECK_EQ_INT(info.bos, json_integer_value(json_object_get(g, "bos_id")));
    CHECK_EQ_INT(info.eos, json_integer_value(json_object_get(g, "eos_id")));
    CHECK(info.add_bos);
    CHECK(kp_lm_is_eog(lm, info.eos));
    CHECK(!kp_lm_is_eog(lm, 403));
    CHECK(!kp_lm_is_eog(lm, -1));
    CHECK(info.n_layer > 0 && info.head_dim > 0 && info.weight_bytes > 0);

    kp_err err;
    size_t n;
    int32_t *ids = tokens_of(lm, "Once upon a time", &n);
    json_t *want = json_object_get(g, "tokens");
    CHECK_EQ_INT(n, json_array_size(want));
    for (size_t i = 0; i < n && i < json_array_size(want); i++)
        CHECK_EQ_INT(ids[i], json_integer_value(json_array_get(want, i)));
    char *text = NULL;
    size_t len = 0;
    /* without BOS, the text comes back as it went in */
    CHECK(kp_detokenize(lm, ids + 1, n - 1, false, &text, &len, &err) == KP_RC_OK);
    CHECK_EQ_STR(text, "Once upon a time");
    CHECK_EQ_INT(len, strlen("Once upon a time"));
    kp_mem_free(text);
    /* special: BOS renders as its text */
    CHECK(kp_detokenize(lm, ids, 1, true, &text, &len, &err) == KP_RC_OK);
    CHECK_EQ_STR(text, "<s>");
    kp_mem_free(text);
    CHECK(kp_detokenize(lm, ids, 0, false, &text, &len, &err) == KP_RC_OK);
    CHECK_EQ_STR(text, "");
    CHECK_EQ_INT(len, 0);
    kp_mem_free(text);
    kp_mem_free(ids);
    int32_t bad = 100000;
    CHECK(kp_detokenize(lm, &bad, 1, false, &text, &len, &err) == KP_RC_INVAL);
    CHECK(kp_tokenize(lm, "", 0, false, false, &ids, &n, &err) == KP_RC_OK);
    CHECK_EQ_INT(n, 0);
    kp_mem_free(ids);
    CHECK(kp_tokenize(NULL, "x", 1, true, false, &ids, &n, &err) == KP_RC_INVAL);
done:
    json_decref(g);
    kp_lm_free(lm);
}

/* kp_tokenize_prompt: a text gets llama.cpp's ids (the golden, BOS
 * included), the ids kp_tokenize gives; a prompt kp_tokenize makes empty
 * (no text, BOS not added) is the model's BOS alone (kp_lm_describe),
 * also on a model that does not add BOS (qwen2); a generation from its
 * ids is kp_generate_text's of the same text. */
static void test_tokenize_prompt(void) {
    kp_lm *lm = open_lm(), *qwen = NULL;
    json_t *g = golden();
    kp_err err;
    if (!lm || !g || kp_lm_open(&qwen, "tests/data/models/gen-qwen2-f32.gguf", &err) != KP_RC_OK) {
        CHECK_MSG(false, "%s", "cannot open the models or the golden");
        goto done;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(kp_tokenize_prompt(lm, "Once upon a time", 16, true, false, &ids, &n, &err) == KP_RC_OK);
    json_t *want = json_object_get(g, "tokens");
    CHECK_EQ_INT(n, json_array_size(want));
    for (size_t i = 0; i < n && i < json_array_size(want); i++)
        CHECK_EQ_INT(ids[i], json_integer_value(json_array_get(want, i)));
    kp_mem_free(ids);
    const kp_lm *models[2] = {lm, qwen};
    const char *texts[3] = {"Once", "", NULL};
    for (int k = 0; k < 2; k++) {
        kp_lm_info info;
        kp_lm_describe(models[k], &info);
        for (int t = 0; t < 3; t++)
            for (int add = 0; add < 2; add++) {
                const char *text = texts[t];
                size_t len = text ? strlen(text) : 0, n_plain = 0;
                int32_t *plain = NULL;
                ids = NULL;
                n = 0;
                CHECK(kp_tokenize(models[k], text, len, add, false, &plain, &n_plain, &err) == KP_RC_OK);
                CHECK(kp_tokenize_prompt(models[k], text, len, add, false, &ids, &n, &err) == KP_RC_OK);
                if (n_plain > 0) {
                    CHECK(n == n_plain && ids && plain && memcmp(ids, plain, n * sizeof *ids) == 0);
                } else {
                    CHECK(info.bos >= 0);
                    CHECK(n == 1 && ids && ids[0] == info.bos);
                }
                kp_mem_free(plain);
                kp_mem_free(ids);
            }
    }
    CHECK(kp_tokenize_prompt(NULL, "x", 1, true, false, &ids, &n, &err) == KP_RC_INVAL);
    CHECK(kp_tokenize_prompt(lm, NULL, 3, true, false, &ids, &n, &err) == KP_RC_INVAL);
    CHECK(kp_tokenize_prompt(lm, "x", 1, true, false, NULL, &n, &err) == KP_RC_INVAL);

    /* generating from its ids is generating from the text */
    kp_session_params sp = {0};
    sp.no_prefix_cache = true;
    kp_session *a = new_session(lm, &sp), *b = new_session(lm, &sp);
    if (a && b) {
        kp_request rq = greedy(12);
        rq.no_bos = true;
        kp_output oa, ob;
        CHECK(kp_tokenize_prompt(lm, "", 0, false, false, &ids, &n, &err) == KP_RC_OK);
        CHECK(kp_generate(a, ids, n, &rq, &oa, &err) == KP_RC_OK);
        CHECK(kp_generate_text(b, "", 0, &rq, &ob, &err) == KP_RC_OK);
        CHECK_EQ_INT(oa.n_tokens, ob.n_tokens);
        CHECK(oa.n_tokens > 0 && memcmp(oa.tokens, ob.tokens, oa.n_tokens * sizeof *oa.tokens) == 0);
        CHECK_EQ_STR(oa.text, ob.text);
        kp_mem_free(ids);
    }
    kp_session_free(a);
    kp_session_free(b);
done:
    json_decref(g);
    kp_lm_free(qwen);
    kp_lm_free(lm);
}

/* llama.cpp's greedy continuation of "Once upon a time" (F32 KV), as ids
 * and as text: 32 tokens, stopped by length. */
static void test_greedy_equals_llamacpp(void) {
    kp_lm *lm = open_lm();
    json_t *g = golden();
    kp_session_params sp = {0};
    sp.kv_type = KP_KV_F32;
    kp_session *s = lm ? new_session(lm, &sp) : NULL;
    if (!s || !g) goto done;
    json_t *want = json_object_get(g, "greedy"), *prompt = json_object_get(g, "tokens");
    int32_t p[16];
    size_t np = json_array_size(prompt);
    for (size_t i = 0; i < np && i < 16; i++) p[i] = (int32_t)json_integer_value(json_array_get(prompt, i));
    kp_request rq = greedy((uint32_t)json_array_size(want));
    kp_output out;
    kp_err err;
    CHECK(kp_generate(s, p, np, &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.n_tokens, json_array_size(want));
    for (size_t i = 0; i < out.n_tokens && i < json_array_size(want); i++)
        CHECK_EQ_INT(out.tokens[i], json_integer_value(json_array_get(want, i)));
    CHECK_EQ_STR(out.text, json_string_value(json_object_get(g, "greedy_text")));
    CHECK_EQ_INT(out.text_len, strlen(out.text));
    CHECK(out.end == KP_END_LENGTH);
    CHECK_EQ_STR(out.end_cause, "length");
    CHECK_EQ_INT(out.cache.prompt_tokens, np);
    CHECK_EQ_INT(out.cache.reused_tokens, 0);
    CHECK_EQ_INT(out.cache.computed_tokens, np);
    CHECK(out.cache.cause == KP_CAUSE_COLD);
    CHECK_EQ_STR(out.cache.cause_name, "cold");
    /* the same through text, on a fresh session */
    kp_session_free(s);
    s = new_session(lm, &sp);
    CHECK(kp_generate_text(s, "Once upon a time", 16, &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_STR(out.text, json_string_value(json_object_get(g, "greedy_text")));
done:
    json_decref(g);
    kp_session_free(s);
    kp_lm_free(lm);
}

typedef struct {
    char buf[4096];
    size_t len;
    int calls, stop_after; /* stop_after 0: never */
} sink;

static int collect(void *u, const char *text, size_t len) {
    sink *k = u;
    if (k->len + len < sizeof k->buf) {
        memcpy(k->buf + k->len, text, len);
        k->len += len;
        k->buf[k->len] = 0;
    }
    k->calls++;
    return k->stop_after && k->calls >= k->stop_after;
}

/* Two turns, the second extending the first's prompt and answer: it reuses
 * exactly the tokens it shares with what the first fed the cache, and its
 * text is what a session without a prefix cache computes from scratch. */
static void test_turns_reuse(void) {
    kp_lm *lm = open_lm();
    kp_session *s = lm ? new_session(lm, NULL) : NULL;
    kp_session_params nc = {0};
    nc.no_prefix_cache = true;
    kp_session *fresh = lm ? new_session(lm, &nc) : NULL;
    if (!s || !fresh) goto done;
    const char *p1 = "Once upon a time";
    sink k = {{0}, 0, 0, 0};
    kp_request rq = greedy(24);
    rq.on_text = collect;
    rq.user = &k;
    kp_output out;
    kp_err err;
    CHECK(kp_generate_text(s, p1, strlen(p1), &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_STR(k.buf, out.text); /* the callback saw the whole text */
    CHECK(k.calls > 1);
    CHECK(out.end == KP_END_LENGTH);
    CHECK_EQ_INT(out.n_tokens, 24);
    /* what the cache holds now: prompt 1 + every generated token */
    size_t n1;
    int32_t *ids1 = tokens_of(lm, p1, &n1);
    int32_t cached[256];
    memcpy(cached, ids1, n1 * sizeof *ids1);
    memcpy(cached + n1, out.tokens, out.n_tokens * sizeof *out.tokens);
    size_t n_cached = n1 + out.n_tokens;
    char p2[1024];
    snprintf(p2, sizeof p2, "%s%s Then the sun came out.", p1, out.text);
    size_t n2;
    int32_t *ids2 = tokens_of(lm, p2, &n2);
    size_t share = lcp(ids2, n2, cached, n_cached);
    CHECK(share > n1); /* the answer is reused too, not only prompt 1 */
    rq.on_text = NULL;
    CHECK(kp_generate_text(s, p2, strlen(p2), &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.cache.prompt_tokens, n2);
    CHECK_EQ_INT(out.cache.reused_tokens, share);
    CHECK_EQ_INT(out.cache.computed_tokens, n2 - share);
    CHECK_EQ_INT(out.cache.diverged_at_token, share);
    CHECK(out.cache.cause == KP_CAUSE_HIT);
    CHECK_EQ_STR(out.cache.cause_name, "hit");
    CHECK_EQ_STR(out.cache.advice, "");
    /* the prompt's text starts with the cached text (prompt 1 + answer): the
     * divergence is where the cached text ends */
    CHECK_EQ_INT(out.cache.diverged_at_byte, strlen(p1) + strlen(k.buf));
    char *text2 = strdup(out.text);
    kp_output o2;
    CHECK(kp_generate_text(fresh, p2, strlen(p2), &rq, &o2, &err) == KP_RC_OK);
    CHECK_EQ_INT(o2.cache.reused_tokens, 0);
    CHECK_EQ_STR(text2, o2.text);
    free(text2);
    /* the same prompt again: a full hit recomputes only the last position */
    CHECK(kp_generate(s, ids2, n2, &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.cache.reused_tokens, n2 - 1);
    CHECK_EQ_INT(out.cache.diverged_at_token, n2);
    CHECK(out.cache.cause == KP_CAUSE_HIT);
    kp_memory m;
    kp_session_memory(s, &m);
    CHECK(m.prefix_cache);
    CHECK(m.cached_tokens >= n2 + 24);
    CHECK(m.used_bytes > 0 && m.used_bytes <= m.budget_bytes);
    CHECK_EQ_INT(m.pinned_bytes, 0);
    kp_mem_free(ids1);
    kp_mem_free(ids2);
done:
    kp_session_free(fresh);
    kp_session_free(s);
    kp_lm_free(lm);
}

/* A changed timestamp: the report says where (the token the tokenizer
 * says, the first differing byte) and why. */
static void test_report_timestamp(void) {
    kp_lm *lm = open_lm();
    kp_session *s = lm ? new_session(lm, NULL) : NULL;
    if (!s) goto done;
    const char *a = "Today is 2026-11-28 09:14. Once upon a time", *b = "Today is 2026-11-29 10:02. Once upon a time";
    kp_request rq = greedy(4);
    kp_output out;
    kp_err err;
    CHECK(kp_generate_text(s, a, strlen(a), &rq, &out, &err) == KP_RC_OK);
    CHECK(kp_generate_text(s, b, strlen(b), &rq, &out, &err) == KP_RC_OK);
    size_t na, nb;
    int32_t *ia = tokens_of(lm, a, &na), *ib = tokens_of(lm, b, &nb);
    size_t share = lcp(ia, na, ib, nb), byte = 0;
    while (a[byte] == b[byte]) byte++;
    CHECK_EQ_INT(out.cache.reused_tokens, share);
    CHECK_EQ_INT(out.cache.diverged_at_token, share);
    CHECK_EQ_INT(out.cache.diverged_at_byte, byte);
    CHECK_EQ_INT(out.cache.line, 1);
    CHECK(out.cache.cause == KP_CAUSE_TIMESTAMP);
    CHECK_EQ_STR(out.cache.cause_name, "timestamp");
    CHECK_MSG(strstr(out.cache.detail, "2026-11-28 09:14") && strstr(out.cache.detail, "2026-11-29 10:02"), "%s",
              out.cache.detail);
    CHECK_MSG(strstr(out.cache.advice, "timestamp") != NULL, "%s", out.cache.advice);
    CHECK(out.cache.cached_snippet[0] && out.cache.request_snippet[0]);
    CHECK_NEAR(out.cache.percent_recomputed, 100.0 * (double)(nb - share) / (double)nb, 1e-9);
    /* probe: the same report without computing anything */
    kp_memory m0, m1;
    kp_session_memory(s, &m0);
    kp_cache_report r;
    CHECK(kp_session_probe(s, ib, nb, &r, &err) == KP_RC_OK);
    CHECK_EQ_INT(r.reused_tokens, nb - 1); /* b is cached now: a full hit */
    CHECK(r.cause == KP_CAUSE_HIT);
    kp_session_memory(s, &m1);
    CHECK_EQ_INT(m1.used_bytes, m0.used_bytes);
    CHECK_EQ_INT(m1.cached_tokens, m0.cached_tokens);
    CHECK(kp_session_probe(s, ib, 0, &r, &err) == KP_RC_INVAL);
    int32_t badp[1] = {100000};
    CHECK(kp_session_probe(s, badp, 1, &r, &err) == KP_RC_INVAL);
    kp_mem_free(ia);
    kp_mem_free(ib);
done:
    kp_session_free(s);
    kp_lm_free(lm);
}

/* A stop string ends the text before it (llama2.c's greedy text from BOS
 * is the reference); the callback can end a generation. */
static void test_stop_and_cancel(void) {
    kp_lm *lm = open_lm();
    kp_session *s = lm ? new_session(lm, NULL) : NULL;
    FILE *f = fopen("tests/data/stories260K.llama2c-greedy.txt", "rb");
    CHECK(f != NULL);
    char ref[8192] = {0};
    if (f) {
        size_t got = fread(ref, 1, sizeof ref - 1, f);
        ref[got] = 0;
        fclose(f);
    }
    if (!s || !f) goto done;
    const char *stops[] = {"Lily."};
    kp_request rq = greedy(256);
    rq.stops = stops;
    rq.n_stops = 1;
    kp_output out;
    kp_err err;
    CHECK(kp_generate_text(s, "", 0, &rq, &out, &err) == KP_RC_OK); /* empty: starts at BOS */
    char *at = strstr(ref, "Lily.");
    CHECK(at != NULL);
    if (at) {
        CHECK_EQ_INT(out.text_len, (size_t)(at - ref));
        CHECK(strncmp(out.text, ref, (size_t)(at - ref)) == 0);
    }
    CHECK(out.end == KP_END_STOP);
    CHECK_EQ_STR(out.end_cause, "stop string");
    /* the callback says stop at its first text: one token's text, then the end */
    sink k = {{0}, 0, 0, 1};
    kp_request rc = greedy(64);
    rc.on_text = collect;
    rc.user = &k;
    CHECK(kp_generate_text(s, "Once upon a time", 16, &rc, &out, &err) == KP_RC_OK);
    CHECK(out.end == KP_END_CANCELLED);
    CHECK_EQ_INT(k.calls, 1);
    CHECK_EQ_STR(out.text, k.buf);
    CHECK(out.n_tokens >= 1 && out.n_tokens <= 2);
    /* max_tokens 0: the prompt is computed and cached, nothing generated */
    kp_request r0 = greedy(0);
    CHECK(kp_generate_text(s, "The cat sat", 11, &r0, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.n_tokens, 0);
    CHECK_EQ_STR(out.text, "");
    CHECK(out.end == KP_END_LENGTH);
    CHECK(kp_generate_text(s, "The cat sat", 11, &r0, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.cache.reused_tokens, out.cache.prompt_tokens - 1);
done:
    kp_session_free(s);
    kp_lm_free(lm);
}

static void test_pins_and_clear(void) {
    kp_lm *lm = open_lm();
    kp_session *s = lm ? new_session(lm, NULL) : NULL;
    kp_session_params nc = {0};
    nc.no_prefix_cache = true;
    kp_session *off = lm ? new_session(lm, &nc) : NULL;
    if (!s || !off) goto done;
    const char *sys = "You are a storyteller. Tell short stories about a cat named Tom.";
    size_t n;
    int32_t *ids = tokens_of(lm, sys, &n);
    kp_err err;
    uint64_t id = 0, id2 = 0;
    kp_memory m;
    /* a prefix that is not cached yet is computed, then pinned */
    CHECK(kp_session_pin(s, ids, n, 0, &id, &err) == KP_RC_OK);
    CHECK(id > 0);
    kp_session_memory(s, &m);
    CHECK_EQ_INT(m.n_pins, 1);
    CHECK(m.pinned_bytes >= (uint64_t)n * m.bytes_per_token);
    CHECK(m.pinned_bytes <= m.pinned_cap_bytes);
    CHECK(m.cached_tokens >= n);
    /* a prompt starting with it reuses it all */
    char p[512];
    snprintf(p, sizeof p, "%s Once upon a time", sys);
    kp_request rq = greedy(8);
    kp_output out;
    CHECK(kp_generate_text(s, p, strlen(p), &rq, &out, &err) == KP_RC_OK);
    size_t np;
    int32_t *pids = tokens_of(lm, p, &np);
    CHECK_EQ_INT(out.cache.reused_tokens, lcp(pids, np, ids, n));
    CHECK(out.cache.cause == KP_CAUSE_HIT);
    kp_mem_free(pids);
    /* pinning it again (cached now) makes a second pin */
    CHECK(kp_session_pin(s, ids, n, 3600, &id2, &err) == KP_RC_OK);
    CHECK(id2 > 0 && id2 != id);
    CHECK(kp_session_unpin(s, id, &err) == KP_RC_OK);
    CHECK(kp_session_unpin(s, id, &err) == KP_RC_NOTFOUND);
    CHECK(err.code == KP_RC_NOTFOUND);
    CHECK(kp_session_unpin(s, id2, &err) == KP_RC_OK);
    kp_session_memory(s, &m);
    CHECK_EQ_INT(m.n_pins, 0);
    CHECK_EQ_INT(m.pinned_bytes, 0);
    CHECK(kp_session_pin(s, ids, 0, 0, &id, &err) == KP_RC_INVAL);
    CHECK(kp_session_pin(s, ids, n, -1, &id, &err) == KP_RC_INVAL);
    CHECK(kp_session_pin(off, ids, n, 0, &id, &err) == KP_RC_UNSUPPORTED);
    /* clear: nothing cached, nothing used, pins gone, the next prompt is cold */
    CHECK(kp_session_pin(s, ids, n, 0, &id, &err) == KP_RC_OK);
    CHECK(kp_session_clear(s, &err) == KP_RC_OK);
    kp_session_memory(s, &m);
    CHECK_EQ_INT(m.cached_tokens, 0);
    CHECK_EQ_INT(m.used_bytes, 0);
    CHECK_EQ_INT(m.n_pins, 0);
    CHECK(kp_session_unpin(s, id, &err) == KP_RC_NOTFOUND);
    CHECK(kp_generate_text(s, p, strlen(p), &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.cache.reused_tokens, 0);
    CHECK(out.cache.cause == KP_CAUSE_COLD);
    /* without a prefix cache nothing is reused */
    CHECK(kp_generate_text(off, p, strlen(p), &rq, &out, &err) == KP_RC_OK);
    CHECK(kp_generate_text(off, p, strlen(p), &rq, &out, &err) == KP_RC_OK);
    CHECK_EQ_INT(out.cache.reused_tokens, 0);
    kp_session_memory(off, &m);
    CHECK(!m.prefix_cache);
    kp_mem_free(ids);
done:
    kp_session_free(off);
    kp_session_free(s);
    kp_lm_free(lm);
}

/* The memory bill follows the KV formula: 2 x layers x kv-heads x head_dim
 * x element size per token. */
static void test_memory_bill(void) {
    kp_lm *lm = open_lm();
    if (!lm) return;
    kp_lm_info info;
    kp_lm_describe(lm, &info);
    uint64_t per16 = 2ull * info.n_layer * info.n_head_kv * info.head_dim * 2;
    kp_session_params p = {0};
    p.kv_budget = 64 * per16 * 16; /* 64 blocks of 16 positions */
    p.n_ctx = 256;
    p.n_threads = 1;
    kp_session *s = new_session(lm, &p);
    kp_memory m;
    kp_session_memory(s, &m);
    CHECK_EQ_INT(m.bytes_per_token, per16);
    CHECK(m.kv_type == KP_KV_F16);
    CHECK_EQ_INT(m.block_tokens, 16);
    CHECK_EQ_INT(m.budget_bytes, p.kv_budget);
    CHECK_EQ_INT(m.used_bytes, 0);
    CHECK_EQ_INT(kp_session_n_ctx(s), 256);
    kp_session_free(s);
    p.kv_type = KP_KV_F32;
    p.kv_budget = 0;
    p.kv_block = 32;
    s = new_session(lm, &p);
    kp_session_memory(s, &m);
    CHECK_EQ_INT(m.bytes_per_token, 2 * per16);
    CHECK(m.kv_type == KP_KV_F32);
    CHECK_EQ_INT(m.block_tokens, 32);
    /* the default budget: 2 x (n_ctx + one block) positions */
    CHECK_EQ_INT(m.budget_bytes, 2 * (256 + 32) * 2 * per16);
    kp_session_free(s);
    kp_lm_free(lm);
}

static void test_limits_and_bad_input(void) {
    kp_lm *lm = open_lm();
    kp_session_params p = {0};
    p.n_ctx = 8;
    kp_session *s = lm ? new_session(lm, &p) : NULL;
    if (!s) goto done;
    kp_err err;
    kp_output out;
    kp_request rq = greedy(100);
    const char *longp = "Once upon a time there was a little girl named Lily who loved to play";
    CHECK(kp_generate_text(s, longp, strlen(longp), &rq, &out, &err) == KP_RC_RANGE);
    CHECK_MSG(strstr(err.msg, "context of 8") != NULL, "%s", err.msg);
    /* the context end stops generation */
    CHECK(kp_generate_text(s, "Once", 4, &rq, &out, &err) == KP_RC_OK);
    CHECK(out.end == KP_END_LENGTH);
    CHECK_EQ_STR(out.end_cause, "context full");
    CHECK(out.cache.prompt_tokens + out.n_tokens <= 9);
    int32_t bad[2] = {1, 4096};
    CHECK(kp_generate(s, bad, 2, &rq, &out, &err) == KP_RC_INVAL);
    CHECK(out.end == KP_END_ERROR);
    CHECK(kp_generate(s, bad, 0, &rq, &out, &err) == KP_RC_INVAL);
    CHECK(kp_generate(NULL, bad, 1, &rq, &out, &err) == KP_RC_INVAL);
    const char *many[KP_MAX_STOPS + 1];
    for (int i = 0; i <= KP_MAX_STOPS; i++) many[i] = "x";
    kp_request rs = greedy(4);
    rs.stops = many;
    rs.n_stops = KP_MAX_STOPS + 1;
    CHECK(kp_generate_text(s, "Once", 4, &rs, &out, &err) == KP_RC_INVAL);
    const char *empty[] = {""};
    rs.stops = empty;
    rs.n_stops = 1;
    CHECK(kp_generate_text(s, "Once", 4, &rs, &out, &err) == KP_RC_INVAL);
    kp_request rt = greedy(4);
    rt.sampling.temp = NAN;
    CHECK(kp_generate_text(s, "Once", 4, &rt, &out, &err) == KP_RC_INVAL);
    rt = greedy(4);
    rt.sampling.top_p = 2;
    CHECK(kp_generate_text(s, "Once", 4, &rt, &out, &err) == KP_RC_INVAL);
    CHECK_MSG(strstr(err.msg, "top_p") != NULL, "%s", err.msg);
    /* the session still works after every refusal */
    CHECK(kp_generate_text(s, "Once", 4, NULL, &out, &err) == KP_RC_OK);
    kp_session *t = (kp_session *)&err;
    kp_session_params q = {0};
    q.kv_budget = 1;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_INVAL);
    CHECK(t == NULL);
    q.kv_budget = 0;
    q.kv_type = (kp_kv_type)7;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_INVAL);
    q.kv_type = KP_KV_F16;
    q.n_ctx = (1u << 24) + 1;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_RANGE);
    q.n_ctx = 0;
    /* the block types on a model whose head_dim (8) is not a multiple of 32 */
    q.kv_type = KP_KV_Q8_0;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_INVAL);
    CHECK_MSG(strstr(err.msg, "multiple of 32") != NULL, "%s", err.msg);
    q.kv_type = KP_KV_F16;
    q.kv_type_v_set = true;
    q.kv_type_v = KP_KV_Q4_0;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_INVAL);
    CHECK_MSG(strstr(err.msg, "V cache type q4_0") != NULL, "%s", err.msg);
    q.kv_type_v = (kp_kv_type)9;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_INVAL);
    CHECK(t == NULL);
    /* K and V of their own types: the bill says so */
    q.kv_type = KP_KV_F32;
    q.kv_type_v = KP_KV_F16;
    CHECK(kp_session_new(&t, lm, &q, &err) == KP_RC_OK);
    if (t) {
        kp_memory mm;
        kp_session_memory(t, &mm);
        CHECK(mm.kv_type == KP_KV_F32 && mm.kv_type_v == KP_KV_F16);
        kp_lm_info info;
        kp_lm_describe(lm, &info);
        CHECK_EQ_INT(mm.bytes_per_token, (uint64_t)info.n_layer * info.n_head_kv * info.head_dim * (4 + 2));
    }
    kp_session_free(t);
done:
    kp_session_free(s);
    kp_lm_free(lm);
}

/* A budget of 6 blocks of 16 positions: two prompts of 2-3 blocks each
 * fill it, a third evicts the least recently used one (the first), which
 * then comes back as "evicted" and reuses less than it shares with what it
 * computed before. */
static void test_eviction(void) {
    kp_lm *lm = open_lm();
    if (!lm) return;
    kp_lm_info info;
    kp_lm_describe(lm, &info);
    kp_session_params p = {0};
    p.n_ctx = 64;
    p.kv_budget = 6ull * 16 * (2ull * info.n_layer * info.n_head_kv * info.head_dim * 2);
    kp_session *s = new_session(lm, &p);
    const char *v[] = {"Tom had a red ball. He liked to play with it every day in the sun.",
                       "Lily went to the park with her mom. They saw a big dog and a little cat there.",
                       "The bird sang a song in the tree. A boy named Sam heard it and smiled at the bird."};
    kp_request rq = greedy(8);
    kp_output out;
    kp_err err;
    for (int i = 0; i < 3 && s; i++) CHECK(kp_generate_text(s, v[i], strlen(v[i]), &rq, &out, &err) == KP_RC_OK);
    CHECK(out.cache.evictions > 0);
    kp_memory m;
    kp_session_memory(s, &m);
    CHECK(m.n_evictions > 0);
    CHECK(m.used_bytes <= m.budget_bytes);
    size_t n0;
    int32_t *ids0 = tokens_of(lm, v[0], &n0);
    CHECK(kp_generate_text(s, v[0], strlen(v[0]), &rq, &out, &err) == KP_RC_OK);
    CHECK(out.cache.cause == KP_CAUSE_EVICTED);
    CHECK_EQ_STR(out.cache.cause_name, "evicted");
    CHECK(out.cache.reused_tokens < n0 - 1);
    CHECK_MSG(strstr(out.cache.advice, "evict") != NULL, "%s", out.cache.advice);
    kp_mem_free(ids0);
    kp_session_free(s);
    kp_lm_free(lm);
}

/* Sampling with a seed is reproducible across sessions. */
static void test_seeded_sampling(void) {
    kp_lm *lm = open_lm();
    kp_session *a = lm ? new_session(lm, NULL) : NULL, *b = lm ? new_session(lm, NULL) : NULL;
    if (!a || !b) goto done;
    kp_request rq = kp_request_defaults();
    rq.sampling.temp = 1;
    rq.sampling.seed = 7;
    rq.max_tokens = 40;
    kp_output oa, ob;
    kp_err err;
    CHECK(kp_generate_text(a, "Once", 4, &rq, &oa, &err) == KP_RC_OK);
    CHECK(kp_generate_text(b, "Once", 4, &rq, &ob, &err) == KP_RC_OK);
    CHECK_EQ_STR(oa.text, ob.text);
    CHECK_EQ_INT(oa.n_tokens, ob.n_tokens);
done:
    kp_session_free(a);
    kp_session_free(b);
    kp_lm_free(lm);
}

int main(void) {
    RUN(test_version_and_names);
    RUN(test_open_errors);
    RUN(test_tokens);
    RUN(test_tokenize_prompt);
    RUN(test_greedy_equals_llamacpp);
    RUN(test_turns_reuse);
    RUN(test_report_timestamp);
    RUN(test_stop_and_cancel);
    RUN(test_pins_and_clear);
    RUN(test_memory_bill);
    RUN(test_eviction);
    RUN(test_limits_and_bad_input);
    RUN(test_seeded_sampling);
    return harness_finish("api");
}
