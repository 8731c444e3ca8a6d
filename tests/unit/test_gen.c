/*
 * test_gen.c - one sequence's generation state (engine/gen.h).
 *
 * The logits are scripted: a row whose largest entry is the token wanted
 * next, so greedy sampling replays a chosen token sequence. Expected
 * values come from elsewhere:
 *   - the text from kp_tok_detokenize of the same ids (SPM stories260K:
 *     detokenizing drops the leading space exactly when the ids do not start
 *     with BOS, so [BOS] + ids gives the text after a longer prompt and ids
 *     alone the text right after a BOS-only prompt), cut before the first
 *     occurrence of a stop string;
 *   - the end from the rules themselves: after max_tokens tokens, at the
 *     first end-of-generation token, or at the token that would need
 *     position max_pos;
 *   - sampled tokens from a kp_sampler with the same seed that saw the same
 *     prompt;
 *   - constrained generations (random logits, as a random-weight model
 *     gives, on the bundled model's SPM vocabulary and on the 49,152-token
 *     byte-level BPE vocabulary of the SmolLM2-shaped models): every
 *     sampled token is accepted by a second, independent matcher fed the
 *     tokens one by one, the text is a complete document for a third one
 *     fed its bytes, and jansson parses it; the generation ends (STOP) at
 *     the token that completes a document that cannot grow.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gen.h"
#include "harness.h"

static uint64_t rs = 0x6a09e667f3bcc908ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static kp_tok_vocab *voc;
static kp_gguf *voc_file;
static int32_t nv;

/* A row of logits whose argmax is tok. */
static const float *row(int32_t tok) {
    static float *r;
    if (!r) r = calloc((size_t)nv, sizeof *r);
    memset(r, 0, (size_t)nv * sizeof *r);
    r[tok] = 10;
    return r;
}

/* A token with a plain, non-empty piece: not control, not a byte token, not
 * end-of-generation. */
static int32_t plain_token(void) {
    for (;;) {
        int32_t t = (int32_t)rnd((uint32_t)nv);
        size_t len;
        const char *p = kp_tok_piece_view(voc, t, false, &len);
        if (!p || len == 0 || kp_tok_is_eog(voc, t) || kp_tok_is_control(voc, t)) continue;
        const char *raw = kp_tok_text(voc, t, NULL);
        if (raw && raw[0] == '<') continue; /* <0x..> byte tokens, <unk> */
        return t;
    }
}

/* The text of ids generated after prompt (BOS alone or longer). */
static char *expected_text(const int32_t *ids, size_t n, bool bos_only, size_t *len) {
    int32_t *all = malloc((n + 1) * sizeof *all);
    all[0] = kp_tok_bos(voc);
    memcpy(all + 1, ids, n * sizeof *ids);
    char *text = NULL;
    kp_error err = {0};
    kp_status st = bos_only ? kp_tok_detokenize(voc, ids, n, false, false, &text, len, &err)
                            : kp_tok_detokenize(voc, all, n + 1, false, false, &text, len, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    free(all);
    return text;
}

typedef struct {
    char text[4096];
    size_t len;
    uint32_t steps;
    kp_gen_out last;
} run_out;

/* Steps g with the scripted tokens until it ends; it must end by then. */
static void run(kp_gen *g, const int32_t *script, uint32_t n_script, run_out *o) {
    memset(o, 0, sizeof *o);
    for (uint32_t i = 0; i <= n_script; i++) {
        kp_gen_out out;
        kp_error err = {0};
        kp_status st = kp_gen_step(g, row(script[i < n_script ? i : 0]), &out, &err);
        CHECK_MSG(st == KP_OK, "%s", err.msg);
        if (out.token >= 0) {
            CHECK_MSG(i < n_script, "still running after %u scripted tokens", n_script);
            CHECK_EQ_INT(out.token, script[i < n_script ? i : 0]);
            o->steps++;
        }
        if (o->len + out.len <= sizeof o->text) memcpy(o->text + o->len, out.text, out.len);
        o->len += out.len;
        o->last = out;
        if (out.finish != KP_FINISH_NONE) break;
    }
}

static kp_gen_params greedy(uint32_t max_tokens, uint32_t max_pos) {
    kp_gen_params p = {kp_sampler_defaults(), max_tokens, max_pos, 0, false, NULL, 0, false};
    p.sp.temp = 0;
    return p;
}

/* With no stop string the text is the detokenized ids, with and without
 * the leading space of a BOS-only prompt; max_tokens ends it. */
static void test_text_and_max_tokens(void) {
    for (int round = 0; round < 40; round++) {
        bool bos_only = round % 2 == 0;
        int32_t prompt[3] = {kp_tok_bos(voc), plain_token(), plain_token()};
        uint32_t n_prompt = bos_only ? 1 : 3, n = 1 + rnd(30);
        int32_t ids[32];
        for (uint32_t i = 0; i < n; i++) ids[i] = plain_token();
        kp_gen_params p = greedy(n, 4096);
        kp_gen *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gen_new(&g, voc, prompt, n_prompt, &p, &err) == KP_OK, "%s", err.msg);
        const int32_t *tokens = kp_gen_tokens(g);
        run_out o;
        run(g, ids, n, &o);
        size_t want_len;
        char *want = expected_text(ids, n, bos_only, &want_len);
        CHECK_MSG(o.len == want_len && !memcmp(o.text, want, want_len), "'%.*s' vs '%s'", (int)o.len, o.text,
                  want);
        CHECK(o.steps == n && o.last.finish == KP_FINISH_LENGTH && o.last.cause == KP_GEN_MAX_TOKENS);
        CHECK(kp_gen_finish(g) == KP_FINISH_LENGTH && kp_gen_cause_of(g) == KP_GEN_MAX_TOKENS);
        CHECK(kp_gen_tokens(g) == tokens && kp_gen_n_tokens(g) == n_prompt + n && kp_gen_n_generated(g) == n &&
              kp_gen_n_prompt(g) == n_prompt);
        CHECK(!memcmp(tokens, prompt, n_prompt * sizeof *prompt) && !memcmp(tokens + n_prompt, ids, n * sizeof *ids));
        /* after the end: nothing sampled, the same finish */
        kp_gen_out again;
        CHECK(kp_gen_step(g, row(ids[0]), &again, &err) == KP_OK && again.token == -1 && again.len == 0 &&
              again.finish == KP_FINISH_LENGTH);
        CHECK_EQ_INT(kp_gen_n_tokens(g), n_prompt + n);
        free(want);
        kp_gen_free(g);
    }
}

/* A stop string straddling two tokens ends generation at the token that
 * completes it; the text is the expected text cut before it, and no step
 * released a byte of it. */
static void test_stop_across_tokens(void) {
    int done = 0;
    for (int round = 0; round < 200 && done < 30; round++) {
        int32_t prompt[2] = {kp_tok_bos(voc), plain_token()};
        int32_t ids[24];
        uint32_t n = 24;
        for (uint32_t i = 0; i < n; i++) ids[i] = plain_token();
        size_t full_len;
        char *full = expected_text(ids, n, false, &full_len);
        /* where token k's text ends in the full text */
        uint32_t k = 3 + rnd(n - 6);
        size_t end_k;
        char *head = expected_text(ids, k + 1, false, &end_k);
        free(head);
        size_t piece_next;
        kp_tok_piece_view(voc, ids[k + 1], false, &piece_next);
        if (end_k < 2 || piece_next < 2 || end_k + 2 > full_len) {
            free(full);
            continue;
        }
        char stop[5];
        memcpy(stop, full + end_k - 2, 4); /* 2 bytes of token k, 2 of token k + 1 */
        stop[4] = 0;
        if (strlen(stop) != 4) {
            free(full);
            continue;
        }
        size_t cut = (size_t)((char *)memmem(full, full_len, stop, 4) - full);
        kp_gen_params p = greedy(n, 4096);
        const char *stops[2] = {"\x01never", stop};
        p.stops = stops;
        p.n_stops = 2;
        kp_gen *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gen_new(&g, voc, prompt, 2, &p, &err) == KP_OK, "%s", err.msg);
        run_out o;
        run(g, ids, n, &o);
        CHECK_MSG(o.len == cut && !memcmp(o.text, full, cut), "stop '%s': '%.*s' vs '%.*s'", stop, (int)o.len,
                  o.text, (int)cut, full);
        CHECK(o.last.finish == KP_FINISH_STOP && o.last.cause == KP_GEN_STOP_STRING);
        /* the first occurrence ends within the token whose text reaches past it */
        size_t reach = 0;
        uint32_t at = 0;
        while (reach < cut + 4) {
            char *t = expected_text(ids, ++at, false, &reach);
            free(t);
        }
        CHECK_EQ_INT(o.steps, at);
        CHECK_EQ_INT(kp_gen_n_generated(g), at);
        kp_gen_free(g);
        free(full);
        done++;
    }
    CHECK_MSG(done >= 10, "only %d stop cases", done);
}

/* Text that may begin a stop string is held back, and released by the
 * step that ends generation (max_tokens, context end) or by kp_gen_stop
 * with LENGTH; not by a cancel. */
static void test_held_back_released_at_the_end(void) {
    for (int round = 0; round < 20; round++) {
        int32_t prompt[2] = {kp_tok_bos(voc), plain_token()};
        int32_t ids[12];
        uint32_t n = 6 + rnd(6);
        for (uint32_t i = 0; i < n; i++) ids[i] = plain_token();
        size_t full_len, last_len;
        char *full = expected_text(ids, n, false, &full_len);
        kp_tok_piece_view(voc, ids[n - 1], false, &last_len);
        /* a stop string that starts with the whole last piece and never completes */
        char stop[64];
        snprintf(stop, sizeof stop, "%.*s\x01", (int)last_len, full + full_len - last_len);
        const char *stops[1] = {stop};
        for (int how = 0; how < 4; how++) {
            /* 0: max_tokens, 1: context end, 2: kp_gen_stop LENGTH, 3: kp_gen_stop CANCELLED */
            kp_gen_params p = greedy(how == 0 ? n : 1000, how == 1 ? 2 + n - 1 : 4096);
            p.stops = stops;
            p.n_stops = 1;
            kp_gen *g = NULL;
            kp_error err = {0};
            CHECK(kp_gen_new(&g, voc, prompt, 2, &p, &err) == KP_OK);
            run_out o;
            if (how < 2) {
                run(g, ids, n, &o);
                CHECK(o.last.finish == KP_FINISH_LENGTH &&
                      o.last.cause == (how == 0 ? KP_GEN_MAX_TOKENS : KP_GEN_CONTEXT));
                CHECK(o.steps == n && o.last.len >= last_len &&
                      !memcmp(o.last.text + o.last.len - last_len, full + full_len - last_len, last_len));
            } else {
                memset(&o, 0, sizeof o);
                for (uint32_t i = 0; i < n; i++) {
                    kp_gen_out out;
                    CHECK(kp_gen_step(g, row(ids[i]), &out, &err) == KP_OK && out.finish == KP_FINISH_NONE);
                    memcpy(o.text + o.len, out.text, out.len);
                    o.len += out.len;
                }
                CHECK_EQ_INT(o.len, full_len - last_len); /* the last piece is held back */
                kp_gen_out end;
                kp_gen_stop(g, how == 2 ? KP_FINISH_LENGTH : KP_FINISH_CANCELLED, &end);
                CHECK(end.token == -1 && end.cause == KP_GEN_STOPPED &&
                      end.finish == (how == 2 ? KP_FINISH_LENGTH : KP_FINISH_CANCELLED));
                CHECK_EQ_INT(end.len, how == 2 ? last_len : 0);
                memcpy(o.text + o.len, end.text, end.len);
                o.len += end.len;
                CHECK(kp_gen_finish(g) == end.finish);
                kp_gen_stop(g, KP_FINISH_ERROR, &end); /* already ended: kept */
                CHECK(end.finish == (how == 2 ? KP_FINISH_LENGTH : KP_FINISH_CANCELLED) && end.len == 0);
            }
            size_t want = how == 3 ? full_len - last_len : full_len;
            CHECK_MSG(o.len == want && !memcmp(o.text, full, want), "how %d: '%.*s' vs '%s'", how, (int)o.len,
                      o.text, full);
            kp_gen_free(g);
        }
        free(full);
    }
}

/* An end-of-generation token ends it (STOP, its text not shown) unless
 * ignore_eos, which makes it an ordinary token. */
static void test_eog_and_ignore_eos(void) {
    int32_t eos = kp_tok_eos(voc);
    CHECK(eos >= 0 && kp_tok_is_eog(voc, eos));
    for (int round = 0; round < 10; round++) {
        int32_t prompt[2] = {kp_tok_bos(voc), plain_token()};
        int32_t ids[16];
        uint32_t n = 16, at = 2 + rnd(10);
        for (uint32_t i = 0; i < n; i++) ids[i] = i == at ? eos : plain_token();
        for (int ignore = 0; ignore < 2; ignore++) {
            kp_gen_params p = greedy(n, 4096);
            p.ignore_eos = ignore;
            kp_gen *g = NULL;
            kp_error err = {0};
            CHECK(kp_gen_new(&g, voc, prompt, 2, &p, &err) == KP_OK);
            run_out o;
            run(g, ids, n, &o);
            uint32_t n_text = ignore ? n : at; /* ids whose text is shown */
            size_t want_len;
            char *want = expected_text(ids, n_text, false, &want_len);
            CHECK_MSG(o.len == want_len && !memcmp(o.text, want, want_len), "'%.*s' vs '%s'", (int)o.len, o.text,
                      want);
            if (ignore)
                CHECK(o.steps == n && o.last.finish == KP_FINISH_LENGTH && o.last.cause == KP_GEN_MAX_TOKENS);
            else
                CHECK(o.steps == at + 1 && o.last.token == eos && o.last.finish == KP_FINISH_STOP &&
                      o.last.cause == KP_GEN_EOG && kp_gen_tokens(g)[2 + at] == eos &&
                      kp_gen_n_generated(g) == at + 1);
            free(want);
            kp_gen_free(g);
        }
    }
}

/* The context end: a prompt of 3 in a context of max_pos positions ends
 * with the token that would need position max_pos, shown; max_tokens 0
 * samples nothing. */
static void test_context_end_and_zero(void) {
    int32_t prompt[3] = {kp_tok_bos(voc), plain_token(), plain_token()};
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = plain_token();
    for (uint32_t max_pos = 3; max_pos < 12; max_pos++) {
        kp_gen_params p = greedy(1000, max_pos);
        kp_gen *g = NULL;
        kp_error err = {0};
        CHECK(kp_gen_new(&g, voc, prompt, 3, &p, &err) == KP_OK);
        run_out o;
        run(g, ids, 40, &o);
        uint32_t want_n = max_pos + 1 - 3;
        CHECK_EQ_INT(o.steps, want_n);
        CHECK(o.last.finish == KP_FINISH_LENGTH && o.last.cause == KP_GEN_CONTEXT);
        CHECK_EQ_INT(kp_gen_n_tokens(g), max_pos + 1);
        size_t want_len;
        char *want = expected_text(ids, want_n, false, &want_len);
        CHECK(o.len == want_len && !memcmp(o.text, want, want_len));
        free(want);
        kp_gen_free(g);
    }
    kp_gen_params p = greedy(0, 100);
    kp_gen *g = NULL;
    CHECK(kp_gen_new(&g, voc, prompt, 3, &p, NULL) == KP_OK);
    kp_gen_out out;
    CHECK(kp_gen_step(g, row(ids[0]), &out, NULL) == KP_OK);
    CHECK(out.token == -1 && out.len == 0 && out.finish == KP_FINISH_LENGTH && out.cause == KP_GEN_MAX_TOKENS);
    CHECK_EQ_INT(kp_gen_n_generated(g), 0);
    kp_gen_free(g);
}

/* Sampling: the tokens a seeded sampler draws after seeing the prompt
 * (penalties on, so the prompt matters). */
static void test_sampling_equals_sampler(void) {
    kp_gen_params p = greedy(50, 4096);
    p.ignore_eos = true;
    p.sp.temp = 0.9f;
    p.sp.repeat_penalty = 1.3f;
    p.sp.seed = 77;
    int32_t prompt[5] = {kp_tok_bos(voc), plain_token(), plain_token(), plain_token(), plain_token()};
    kp_gen *g = NULL;
    kp_sampler *ref = NULL;
    kp_error err = {0};
    CHECK(kp_gen_new(&g, voc, prompt, 5, &p, &err) == KP_OK);
    CHECK(kp_sampler_new(&ref, &p.sp, nv, &err) == KP_OK);
    for (int i = 0; i < 5; i++) kp_sampler_accept(ref, prompt[i]);
    float *lg = malloc((size_t)nv * sizeof *lg);
    for (int step = 0; step < 50; step++) {
        for (int32_t i = 0; i < nv; i++) lg[i] = (float)rnd(1000) / 200.0f;
        kp_gen_out out;
        kp_status st = kp_gen_step(g, lg, &out, &err);
        int32_t want = kp_sampler_sample(ref, lg);
        kp_sampler_accept(ref, want);
        CHECK_EQ_INT(out.token, want);
        if (st != KP_OK || out.finish != KP_FINISH_NONE) break;
    }
    free(lg);
    kp_sampler_free(ref);
    kp_gen_free(g);
}

static void test_errors(void) {
    kp_gen *g = NULL;
    kp_error err = {0};
    int32_t prompt[3] = {1, 2, 3};
    kp_gen_params p = greedy(5, 2);
    CHECK(kp_gen_new(&g, voc, prompt, 3, &p, &err) == KP_ERANGE && !g && strstr(err.msg, "context of 2"));
    p.max_pos = 100;
    CHECK(kp_gen_new(&g, voc, prompt, 0, &p, &err) == KP_EINVAL && !g);
    int32_t bad[2] = {1, nv};
    CHECK(kp_gen_new(&g, voc, bad, 2, &p, &err) == KP_EINVAL && !g);
    const char *stops[KP_TEXTOUT_MAX_STOPS + 1];
    for (int i = 0; i <= KP_TEXTOUT_MAX_STOPS; i++) stops[i] = "x";
    p.stops = stops;
    p.n_stops = KP_TEXTOUT_MAX_STOPS + 1;
    CHECK(kp_gen_new(&g, voc, prompt, 3, &p, &err) == KP_EINVAL && !g);
    p.n_stops = 0;
    p.sp.top_p = 2;
    CHECK(kp_gen_new(&g, voc, prompt, 3, &p, &err) == KP_EINVAL && !g);
    kp_gen_free(NULL);
    CHECK_EQ_STR(kp_gen_cause_name(KP_GEN_CONTEXT), "context full");
    CHECK_EQ_STR(kp_gen_cause_name(KP_GEN_EOG), "end of generation token");
}

/* ---- constrained generation ---- */

static kp_grammar *compile_schema(const char *text) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    CHECK(j != NULL);
    kp_schema_opts o = kp_schema_opts_default();
    o.ws_max = 1;
    o.no_outer_ws = true;
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK_MSG(kp_grammar_compile_schema(j, &o, &g, &err) == KP_OK, "%s", err.msg);
    json_decref(j);
    return g;
}

static kp_grammar *compile_gbnf(const char *text) {
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK_MSG(kp_grammar_compile_gbnf(text, strlen(text), &g, &err) == KP_OK, "%s", err.msg);
    return g;
}

typedef struct {
    int runs, stopped, grammar_end, eog_end, parsed;
} cstats;

/* One constrained generation on vocabulary v with random logits (seeded):
 * every token checked by an independent matcher, the text by another. */
static void constrained_run(const kp_tok_vocab *v, const kp_gvocab *gv, const kp_grammar *gr, bool json,
                            uint64_t seed, cstats *cs) {
    int32_t n = kp_tok_n_vocab(v);
    float *lg = malloc((size_t)n * sizeof *lg);
    kp_gen_params p = {kp_sampler_defaults(), 600, 4096, 0, false, NULL, 0, false};
    p.sp.seed = seed;
    p.sp.temp = 1.0f;
    p.sp.top_k = 0;
    p.sp.top_p = 1.0f;
    p.sp.min_p = 0.0f;
    int32_t prompt[1] = {kp_tok_bos(v) >= 0 ? kp_tok_bos(v) : 0};
    kp_gen *g = NULL;
    kp_gmatch *m = NULL, *ref = NULL, *bytes = NULL;
    kp_error err = {0};
    CHECK(kp_gen_new(&g, v, prompt, 1, &p, &err) == KP_OK);
    CHECK(kp_gmatch_new(&m, gr, gv, &err) == KP_OK);
    CHECK(kp_gmatch_new(&ref, gr, gv, &err) == KP_OK);
    CHECK(kp_gmatch_new(&bytes, gr, gv, &err) == KP_OK);
    if (!g || !m || !ref || !bytes || !lg) {
        kp_gen_free(g);
        kp_gmatch_free(m);
        kp_gmatch_free(ref);
        kp_gmatch_free(bytes);
        free(lg);
        return;
    }
    CHECK(kp_gen_constrain(g, m, &err) == KP_OK);
    CHECK(kp_gen_constrain(g, NULL, &err) == KP_EINVAL); /* once */
    kp_buf text = {0};
    kp_gen_out o = {0};
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    int bad = 0;
    for (int step = 0; step < 700 && o.finish == KP_FINISH_NONE; step++) {
        for (int32_t i = 0; i < n; i++) {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            lg[i] = (float)(r % 2000) / 200.0f - 5.0f; /* [-5, 5): a random-weight model's spread */
        }
        CHECK(kp_gen_step(g, lg, &o, &err) == KP_OK);
        if (o.token >= 0 && kp_gmatch_accept_token(ref, o.token, NULL) != KP_OK && bad++ < 3)
            fprintf(stderr, "  token %d at step %d breaks the grammar\n", o.token, step);
        kp_buf_put(&text, o.text, o.len);
    }
    CHECK_EQ_INT(bad, 0);
    cs->runs++;
    if (o.finish == KP_FINISH_STOP) {
        cs->stopped++;
        cs->grammar_end += o.cause == KP_GEN_GRAMMAR;
        cs->eog_end += o.cause == KP_GEN_EOG;
        CHECK(o.cause == KP_GEN_GRAMMAR || o.cause == KP_GEN_EOG);
        /* GRAMMAR: the document cannot grow; EOG: it was complete when it came */
        CHECK(o.cause != KP_GEN_GRAMMAR || (kp_gmatch_complete(ref) && !kp_gmatch_can_continue(ref)) ||
              kp_gmatch_finished(ref));
        CHECK(o.cause != KP_GEN_EOG || kp_gmatch_finished(ref));
        CHECK(kp_gmatch_accept_bytes(bytes, text.data ? text.data : "", text.len, &err) == KP_OK);
        CHECK_MSG(kp_gmatch_complete(bytes), "'%.*s' is not a whole document", (int)text.len, text.data);
        if (json) {
            json_error_t je;
            json_t *j = json_loadb(text.data ? text.data : "", text.len, JSON_DECODE_ANY, &je);
            CHECK_MSG(j != NULL, "'%.*s': %s", (int)text.len, text.data, je.text);
            cs->parsed += j != NULL;
            json_decref(j);
        }
    }
    kp_buf_free(&text);
    kp_gen_free(g);
    kp_gmatch_free(ref);
    kp_gmatch_free(bytes);
    free(lg);
}

static const char *const gen_schemas[] = {
    /* nested objects, arrays, enums, $ref, formats, bounded strings */
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"who\":{\"$ref\":\"#/$defs/person\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":3},"
    "\"n\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"id\",\"who\",\"tags\",\"n\"],\"additionalProperties\":false,"
    "\"$defs\":{\"person\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":[\"integer\",\"null\"]}},"
    "\"required\":[\"name\"],\"additionalProperties\":false}}}",
    /* a recursive list through $ref */
    "{\"$ref\":\"#/definitions/node\",\"definitions\":{\"node\":{\"type\":\"object\",\"properties\":{"
    "\"v\":{\"type\":\"number\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/definitions/node\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}}}",
    /* a tool call's arguments: const, date, minItems */
    "{\"type\":\"object\",\"properties\":{\"fn\":{\"const\":\"get_weather\"},\"day\":{\"type\":\"string\","
    "\"format\":\"date\"},\"cities\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":2,\"items\":{"
    "\"type\":\"string\",\"minLength\":1,\"maxLength\":6}}},\"required\":[\"fn\",\"day\",\"cities\"],"
    "\"additionalProperties\":false}",
};

static void constrained_on(const char *name, const kp_tok_vocab *v, int runs_per_schema) {
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new(&gv, v, &err) == KP_OK);
    if (!gv) return;
    cstats cs = {0};
    for (size_t si = 0; si < sizeof gen_schemas / sizeof gen_schemas[0]; si++) {
        kp_grammar *gr = compile_schema(gen_schemas[si]);
        for (int k = 0; gr && k < runs_per_schema; k++) constrained_run(v, gv, gr, true, 1000 * si + k + 1, &cs);
        kp_grammar_free(gr);
    }
    /* every run must end by the grammar: the schemas are bounded enough */
    CHECK_EQ_INT(cs.stopped, cs.runs);
    CHECK_EQ_INT(cs.parsed, cs.stopped);
    /* json_object: any object (unbounded strings: most runs end, all that end parse) */
    kp_schema_opts o = kp_schema_opts_default();
    o.ws_max = 1;
    o.no_outer_ws = true;
    kp_grammar *obj = NULL;
    CHECK(kp_grammar_json_object(&o, &obj, &err) == KP_OK);
    cstats co = {0};
    for (int k = 0; obj && k < runs_per_schema; k++) constrained_run(v, gv, obj, true, 77 + k, &co);
    CHECK_EQ_INT(co.parsed, co.stopped);
    kp_grammar_free(obj);
    printf("  %s: %d schema runs, all ended by the grammar (%d at a document that cannot grow, %d by an end token) "
           "and parse; json_object: %d of %d ended\n",
           name, cs.runs, cs.grammar_end, cs.eog_end, co.stopped, co.runs);
    kp_gvocab_free(gv);
}

static kp_tok_vocab *bpe49k;

static void test_constrained_spm(void) { constrained_on("stories260K (SPM, 512)", voc, 8); }
static void test_constrained_bpe(void) {
    if (bpe49k) constrained_on("starcoder (byte-level BPE, 49152)", bpe49k, 4);
    else CHECK(bpe49k != NULL);
}

/* A grammar whose documents cannot grow ends the step its last token is
 * sampled, with cause GRAMMAR, even when the logits prefer something else;
 * kp_gen_constrain refuses a gen that already stepped. */
static void test_constrained_end(void) {
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new(&gv, voc, &err) == KP_OK);
    kp_grammar *gr = compile_gbnf("root ::= \"yes\" | \"no\"\n");
    if (!gv || !gr) {
        kp_gvocab_free(gv);
        kp_grammar_free(gr);
        return;
    }
    for (int round = 0; round < 20; round++) {
        int32_t prompt[2] = {kp_tok_bos(voc), plain_token()};
        kp_gen_params p = greedy(50, 4096);
        kp_gen *g = NULL;
        kp_gmatch *m = NULL;
        CHECK(kp_gen_new(&g, voc, prompt, 2, &p, &err) == KP_OK);
        CHECK(kp_gmatch_new(&m, gr, gv, &err) == KP_OK);
        CHECK(kp_gen_constrain(g, m, &err) == KP_OK);
        CHECK(kp_gen_matcher(g) == m);
        kp_buf text = {0};
        kp_gen_out o = {0};
        int steps = 0;
        while (o.finish == KP_FINISH_NONE && steps < 50) {
            CHECK(kp_gen_step(g, row(plain_token()), &o, &err) == KP_OK); /* the argmax is mostly not allowed */
            kp_buf_put(&text, o.text, o.len);
            steps++;
        }
        CHECK(o.finish == KP_FINISH_STOP && o.cause == KP_GEN_GRAMMAR);
        CHECK_MSG((text.len == 3 && !memcmp(text.data, "yes", 3)) || (text.len == 2 && !memcmp(text.data, "no", 2)),
                  "'%.*s'", (int)text.len, text.data);
        CHECK((uint32_t)steps == kp_gen_n_generated(g)); /* ended on the completing token itself */
        kp_buf_free(&text);
        if (round % 2) { /* an ended gen hands its matcher back; reset, it matches the grammar again */
            kp_gmatch *back = kp_gen_release_matcher(g);
            CHECK(back == m && kp_gen_matcher(g) == NULL && kp_gmatch_grammar(back) == gr);
            kp_gmatch_reset(back);
            CHECK(back && kp_gmatch_accept_bytes(back, "no", 2, &err) == KP_OK && kp_gmatch_complete(back));
            kp_gmatch_free(back);
        }
        kp_gen_free(g);
    }
    /* constrain after a step: refused, the matcher freed by the gen */
    int32_t prompt[2] = {kp_tok_bos(voc), plain_token()};
    kp_gen_params p = greedy(5, 4096);
    kp_gen *g = NULL;
    kp_gmatch *m = NULL;
    kp_gen_out o;
    CHECK(kp_gen_new(&g, voc, prompt, 2, &p, &err) == KP_OK);
    CHECK(kp_gen_release_matcher(g) == NULL);
    CHECK(kp_gen_step(g, row(plain_token()), &o, &err) == KP_OK);
    CHECK(kp_gmatch_new(&m, gr, gv, &err) == KP_OK);
    CHECK(kp_gen_constrain(g, m, &err) == KP_EINVAL);
    CHECK(kp_gen_matcher(g) == NULL);
    kp_gen_free(g);
    CHECK_EQ_STR(kp_gen_cause_name(KP_GEN_GRAMMAR), "grammar complete");
    kp_grammar_free(gr);
    kp_gvocab_free(gv);
}

/* A grammar the matcher cannot follow at some point (more parse stacks
 * than KP_GRAMMAR_MAX_STACKS: 2,100 rules deep, each closing with an
 * optional "a", so after the "c" at the bottom every level may close):
 * the step fails with KP_EUNSUPPORTED, a property of the request, never
 * KP_EFULL, which a server answers as "overloaded, retry". */
static void test_constrained_bounds(void) {
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new(&gv, voc, &err) == KP_OK);
    kp_buf t = {0};
    kp_buf_puts(&t, "root ::= l0\n");
    for (int i = 0; i < 2100; i++) kp_buf_printf(&t, "l%d ::= \"a\" l%d \"a\"?\n", i, i + 1);
    kp_buf_puts(&t, "l2100 ::= \"c\"\n");
    kp_grammar *gr = compile_gbnf(t.data);
    kp_buf_free(&t);
    int32_t prompt[2] = {kp_tok_bos(voc), plain_token()};
    kp_gen_params p = greedy(5000, 8192);
    kp_gen *g = NULL;
    kp_gmatch *m = NULL;
    CHECK(gv && gr && kp_gen_new(&g, voc, prompt, 2, &p, &err) == KP_OK);
    CHECK(g && kp_gmatch_new(&m, gr, gv, &err) == KP_OK && kp_gen_constrain(g, m, &err) == KP_OK);
    kp_status st = KP_OK;
    kp_gen_out o = {0};
    int steps = 0;
    while (g && m && st == KP_OK && o.finish == KP_FINISH_NONE && steps < 3000) {
        st = kp_gen_step(g, row(plain_token()), &o, &err);
        steps++;
    }
    CHECK_MSG(st == KP_EUNSUPPORTED && strstr(err.msg, "parse stacks"), "after %d steps: %d %s", steps, (int)st,
              err.msg);
    kp_gen_free(g);
    kp_grammar_free(gr);
    kp_gvocab_free(gv);
}

int main(void) {
    kp_error err = {0};
    if (kp_gguf_open(&voc_file, harness_path("models/stories260K.gguf"), &err) != KP_OK ||
        kp_tok_vocab_load(&voc, voc_file, &err) != KP_OK) {
        fprintf(stderr, "test_gen: %s\n", err.msg);
        return 1;
    }
    nv = kp_tok_n_vocab(voc);
    RUN(test_text_and_max_tokens);
    RUN(test_stop_across_tokens);
    RUN(test_held_back_released_at_the_end);
    RUN(test_eog_and_ignore_eos);
    RUN(test_context_end_and_zero);
    RUN(test_sampling_equals_sampler);
    RUN(test_errors);
    RUN(test_constrained_end);
    RUN(test_constrained_bounds);
    RUN(test_constrained_spm);
    {
        kp_gguf *f = NULL;
        if (kp_gguf_open(&f, harness_path("tests/data/vocab/ggml-vocab-starcoder.gguf"), &err) == KP_OK)
            kp_tok_vocab_load(&bpe49k, f, &err);
        kp_gguf_close(f);
    }
    RUN(test_constrained_bpe);
    kp_tok_vocab_free(bpe49k);
    free((void *)row(0));
    kp_tok_vocab_free(voc);
    kp_gguf_close(voc_file);
    return harness_finish("gen");
}
