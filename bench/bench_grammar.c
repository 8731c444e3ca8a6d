/*
 * bench_grammar.c - token mask cost of the grammar engine (src/grammar/)
 * during generation-like walks, against one decode step of the model.
 *
 * For each vocabulary and schema: a realistic valid document is tokenized
 * and fed token by token; before each token the allowed-token mask is
 * computed and timed (this is what the sampler pays per generated token).
 * Two regimes:
 *
 *   cold  a new grammar and matcher per run: a request whose schema the
 *         server has not seen (every mask cache entry built on first use);
 *   clone a clone per run of the first run's matcher (reset to the start),
 *         sharing its mask cache, its own transition memo cold: the same
 *         schema again while no finished matcher is spare;
 *   warm  the first run's matcher reset between runs, both caches kept:
 *         the same schema again as the server mostly runs it (the matcher
 *         of a finished request, reset, for the next one).
 *
 * Reported per vocabulary and schema: grammar compile time, per-token mask
 * p50 / p99 / max over all runs, and p50 / p99 as a share of one decode
 * step. Vocabularies:
 *
 *   starcoder  tests/data/vocab/ggml-vocab-starcoder.gguf, 49,152 tokens,
 *              the vocabulary of the SmolLM2-135M-shaped bench models;
 *   151936     Qwen2's vocabulary size, synthesized: the distinct token
 *              pieces of every vocabulary in tests/data/vocab (147,385),
 *              padded with concatenations of two pieces to 151,643 normal
 *              tokens, plus 292 control tokens and one end-of-generation
 *              token; documents are tokenized greedily (longest piece).
 *
 * The decode step: --decode-ms MS, else a measured decode of -m MODEL
 * (default build/bench/smollm2-135m-Q8_0.gguf, -t threads, default 2):
 * the median of 48 single-token steps after a 64-token prompt; without a
 * model the ratio columns are left out and the run says so.
 *
 *   make build/rel/bench_grammar && build/rel/bench_grammar [-r runs]
 *        [-m model.gguf] [-t threads] [--decode-ms MS] [--quick] [-v US]
 *
 * --quick: the starcoder vocabulary only; -v US: also print each mask
 * slower than US microseconds (its cache entries built and walk steps).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/threadpool.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tok/tok.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* ---- the schemas and documents ---- */

typedef struct {
    const char *name, *schema, *doc; /* schema NULL: json_object mode */
} workload;

static const workload loads[] = {
    {"order (nested, arrays, enums, $ref, formats)",
     "{\"type\":\"object\",\"properties\":{"
     "\"order_id\":{\"type\":\"string\",\"format\":\"uuid\"},"
     "\"customer\":{\"$ref\":\"#/$defs/person\"},"
     "\"items\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"properties\":{"
     "\"sku\":{\"type\":\"string\",\"maxLength\":32},\"qty\":{\"type\":\"integer\"},\"price\":{\"type\":\"number\"},"
     "\"category\":{\"enum\":[\"book\",\"electronics\",\"grocery\",\"toy\"]}},"
     "\"required\":[\"sku\",\"qty\",\"price\"],\"additionalProperties\":false}},"
     "\"status\":{\"enum\":[\"pending\",\"shipped\",\"delivered\",\"cancelled\"]},"
     "\"created\":{\"type\":\"string\",\"format\":\"date-time\"},"
     "\"notes\":{\"type\":[\"string\",\"null\"]},\"gift\":{\"type\":\"boolean\"}},"
     "\"required\":[\"order_id\",\"customer\",\"items\",\"status\"],\"additionalProperties\":false,"
     "\"$defs\":{\"person\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
     "\"email\":{\"type\":\"string\"},\"address\":{\"type\":\"object\",\"properties\":{"
     "\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
     "\"zip\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":10}},\"required\":[\"city\"],"
     "\"additionalProperties\":false}},\"required\":[\"name\"],\"additionalProperties\":false}}}",
     "{\n  \"order_id\": \"3f2b8c1e-9d4a-4e7b-8c2d-1a5f6e7d8c9b\",\n  \"customer\": {\n    \"name\": \"Marie "
     "Curie\",\n    \"email\": \"marie.curie@example.org\",\n    \"address\": {\n      \"street\": \"11 rue Pierre et "
     "Marie Curie\",\n      \"city\": \"Paris\",\n      \"zip\": \"75005\"\n    }\n  },\n  \"items\": [\n    {\n      "
     "\"sku\": \"BK-0451-RADIUM\",\n      \"qty\": 2,\n      \"price\": 24.99,\n      \"category\": \"book\"\n    },\n"
     "    {\n      \"sku\": \"EL-7730-SCOPE\",\n      \"qty\": 1,\n      \"price\": 1299.5,\n      \"category\": "
     "\"electronics\"\n    }\n  ],\n  \"status\": \"shipped\",\n  \"created\": \"2024-03-14T09:26:53.589Z\",\n  "
     "\"notes\": \"Leave the parcel with the concierge if nobody answers; the lab is on the second floor.\",\n  "
     "\"gift\": false\n}"},
    {"tool call (forced function, const name)",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\","
     "\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City and country\"},"
     "\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},"
     "\"required\":[\"location\",\"unit\"],\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],"
     "\"additionalProperties\":false}",
     "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": \"celsius\", \"days\": 3}}"},
    {"tree (recursive $ref)",
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"size\":{\"type\":"
     "\"integer\"},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"name\"],"
     "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     "{\"name\": \"src\", \"children\": [{\"name\": \"grammar\", \"children\": [{\"name\": \"gram.c\", \"size\": 24110}, "
     "{\"name\": \"pda.c\", \"size\": 15342}, {\"name\": \"gmatch.c\", \"size\": 30991}]}, {\"name\": \"tok\", "
     "\"children\": [{\"name\": \"tok.c\", \"size\": 41222}]}, {\"name\": \"README.md\", \"size\": 2048}]}"},
    {"json_object (any object)", NULL,
     "{\"title\": \"The structure of scientific revolutions\", \"year\": 1962, \"tags\": [\"history\", \"philosophy\", "
     "\"science\"], \"rating\": 4.5, \"meta\": {\"pages\": 264, \"isbn\": \"978-0-226-45808-3\", \"in_print\": true}}"},
};

/* ---- vocabularies ---- */

typedef struct {
    const char *name;
    kp_gvocab *gv;
    kp_tok_vocab *tok; /* NULL: tokenize greedily over pieces */
    char **pieces;     /* synthetic: every piece, and sorted views for the greedy tokenizer */
    size_t *lens;
    int32_t n;
    int32_t *sorted; /* ids sorted by piece bytes */
} vocab;

typedef struct {
    const char *p;
    size_t n;
} piece;

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, n);
    return c ? c : (x->n < y->n ? -1 : x->n > y->n);
}

static const vocab *g_sort_v;
static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    piece px = {g_sort_v->pieces[x], g_sort_v->lens[x]}, py = {g_sort_v->pieces[y], g_sort_v->lens[y]};
    return cmp_piece(&px, &py);
}

static kp_tok_vocab *load_tok(const char *path) {
    kp_gguf *g = NULL;
    kp_error err = {0};
    kp_tok_vocab *v = NULL;
    if (kp_gguf_open(&g, path, &err) != KP_OK) return NULL;
    if (kp_tok_vocab_load(&v, g, &err) != KP_OK) v = NULL;
    kp_gguf_close(g);
    return v;
}

#define QWEN_VOCAB 151936
#define QWEN_NORMAL 151643

/* The synthetic 151,936-token vocabulary (see the top comment). */
static bool make_synthetic(vocab *out) {
    static const char *const files[] = {"deepseek-llm", "deepseek-coder", "falcon", "gpt-2", "mpt", "refact",
                                        "starcoder", "llama-spm", "phi-3"};
    piece *all = NULL;
    size_t n = 0, cap = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/vocab/ggml-vocab-%s.gguf", files[f]);
        kp_tok_vocab *v = load_tok(path);
        if (!v) {
            fprintf(stderr, "bench_grammar: cannot load %s\n", path);
            continue;
        }
        for (int32_t i = 0; i < kp_tok_n_vocab(v); i++) {
            size_t l;
            const char *p = kp_tok_piece_view(v, i, false, &l);
            if (!l) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 65536;
                all = realloc(all, cap * sizeof *all);
            }
            char *c = malloc(l);
            memcpy(c, p, l);
            all[n++] = (piece){c, l};
        }
        kp_tok_vocab_free(v);
    }
    qsort(all, n, sizeof *all, cmp_piece);
    size_t u = 0;
    for (size_t i = 0; i < n; i++) {
        if (u && cmp_piece(&all[i], &all[u - 1]) == 0) {
            free((char *)all[i].p);
            continue;
        }
        all[u++] = all[i];
    }
    if (u > QWEN_NORMAL) u = QWEN_NORMAL;
    out->n = QWEN_VOCAB;
    out->pieces = calloc(QWEN_VOCAB, sizeof *out->pieces);
    out->lens = calloc(QWEN_VOCAB, sizeof *out->lens);
    for (size_t i = 0; i < u; i++) {
        out->pieces[i] = (char *)all[i].p;
        out->lens[i] = all[i].n;
    }
    /* pad with two-piece concatenations not already present (deterministic) */
    uint32_t s = 12345;
    size_t have = u;
    while (have < QWEN_NORMAL) {
        s = s * 1664525u + 1013904223u;
        size_t a = (s >> 8) % u;
        s = s * 1664525u + 1013904223u;
        size_t b = (s >> 8) % u;
        size_t l = all[a].n + all[b].n;
        if (l > 16) continue;
        char *c = malloc(l);
        memcpy(c, all[a].p, all[a].n);
        memcpy(c + all[a].n, all[b].p, all[b].n);
        piece q = {c, l};
        if (bsearch(&q, all, u, sizeof *all, cmp_piece)) {
            free(c);
            continue;
        }
        out->pieces[have] = c;
        out->lens[have++] = l;
    }
    free(all);
    uint8_t *eog = calloc(QWEN_VOCAB, 1);
    eog[QWEN_NORMAL] = 1; /* the first special token plays <|im_end|> */
    kp_error err = {0};
    bool ok = kp_gvocab_new_raw(&out->gv, QWEN_VOCAB, (const char *const *)out->pieces, out->lens, eog, &err) == KP_OK;
    free(eog);
    if (!ok) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return false;
    }
    out->sorted = malloc((size_t)QWEN_NORMAL * sizeof *out->sorted);
    for (int32_t i = 0; i < QWEN_NORMAL; i++) out->sorted[i] = i;
    g_sort_v = out;
    qsort(out->sorted, QWEN_NORMAL, sizeof *out->sorted, cmp_id);
    return true;
}

/* Longest-piece-first tokenization over the sorted pieces. */
static int32_t *greedy(const vocab *v, const char *text, size_t len, size_t *n_out) {
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    size_t n = 0;
    for (size_t at = 0; at < len;) {
        int32_t best = -1;
        size_t best_len = 0;
        for (size_t l = len - at < 16 ? len - at : 16; l >= 1 && best < 0; l--) {
            size_t lo = 0, hi = QWEN_NORMAL;
            piece q = {text + at, l};
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                piece m = {v->pieces[v->sorted[mid]], v->lens[v->sorted[mid]]};
                int c = cmp_piece(&m, &q);
                if (c == 0) {
                    best = v->sorted[mid];
                    best_len = l;
                    break;
                }
                if (c < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
        }
        if (best < 0) {
            free(ids);
            return NULL;
        }
        ids[n++] = best;
        at += best_len;
    }
    *n_out = n;
    return ids;
}

/* ---- the decode step ---- */

static double decode_ms(const char *path, int threads) {
    kp_model *m = NULL;
    kp_threads *pool = NULL;
    kp_engine *e = NULL;
    kp_error err = {0};
    double r = -1;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fclose(f);
    if (kp_model_load(&m, path, &err) != KP_OK || kp_threads_new(&pool, threads, &err) != KP_OK ||
        kp_eng_new(&e, m, pool, NULL, NULL, &err) != KP_OK) {
        fprintf(stderr, "bench_grammar: decode: %s\n", err.msg);
    } else {
        int32_t n_vocab = m->hp.n_vocab;
        float *logits = malloc((size_t)n_vocab * sizeof *logits);
        int32_t prompt[64];
        for (int i = 0; i < 64; i++) prompt[i] = (int32_t)(100 + i * 37) % n_vocab;
        kp_eng_seq seq = {0};
        double t[48];
        if (kp_eng_prefill(e, prompt, 64, &seq, logits, NULL, &err) == KP_OK) {
            int ok = 1;
            for (int i = 0; i < 48 && ok; i++) {
                double a = now_s();
                ok = kp_eng_decode(e, &seq, (int32_t)(200 + i) % n_vocab, logits, &err) == KP_OK;
                t[i] = (now_s() - a) * 1e3;
            }
            if (ok) r = pct(t, 48, 0.5);
            kp_eng_seq_abort(e, &seq);
        }
        free(logits);
    }
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_model_free(m);
    return r;
}

/* ---- one walk ---- */

typedef struct {
    double *t;
    size_t n, cap;
    double compile_ms;
    kp_gmatch_stats st;
} samples;

static void add(samples *s, double v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->t = realloc(s->t, s->cap * sizeof *s->t);
    }
    s->t[s->n++] = v;
}

static kp_status compile(const workload *w, kp_grammar **g, kp_error *err) {
    if (!w->schema) return kp_grammar_json_object(NULL, g, err);
    json_error_t je;
    json_t *s = json_loads(w->schema, 0, &je);
    if (!s) return kp_fail(err, KP_EINVAL, "bad schema: %s", je.text);
    kp_status st = kp_grammar_compile_schema(s, NULL, g, err);
    json_decref(s);
    return st;
}

static double verbose_us; /* -v US: print every mask slower than this */

/* Feeds ids through m, timing each mask; false on any failure. */
static bool walk(kp_gmatch *m, const kp_gvocab *gv, const int32_t *ids, size_t n, uint32_t *mask, samples *s,
                 kp_error *err) {
    for (size_t i = 0; i <= n; i++) {
        size_t na;
        kp_gmatch_stats a, b;
        kp_gmatch_get_stats(m, &a);
        double t0 = now_s();
        kp_status st = kp_gmatch_mask(m, mask, &na, err);
        double dt = (now_s() - t0) * 1e6;
        add(s, dt);
        if (verbose_us > 0 && dt > verbose_us) {
            kp_gmatch_get_stats(m, &b);
            printf("      mask %zu: %.1f us, %zu allowed, %llu entries built, %llu walk steps, %llu uncertain checked\n",
                   i, dt, na, (unsigned long long)(b.entries_built - a.entries_built),
                   (unsigned long long)(b.walk_steps - a.walk_steps), (unsigned long long)(b.unc_checked - a.unc_checked));
        }
        if (st != KP_OK) return false;
        if (i == n) return kp_gmatch_complete(m);
        if (!((mask[ids[i] / 32] >> (ids[i] % 32)) & 1)) {
            kp_fail(err, KP_EINVAL, "token %zu (%d) of the document is not in the mask", i, ids[i]);
            return false;
        }
        if (kp_gmatch_accept_token(m, ids[i], err) != KP_OK) return false;
    }
    (void)gv;
    return true;
}

static void report(const char *regime, samples *s, double dec_ms) {
    double p50 = pct(s->t, s->n, 0.5), p99 = pct(s->t, s->n, 0.99), mx = s->t[s->n - 1];
    printf("    %-5s p50 %8.1f us  p99 %8.1f us  max %8.1f us", regime, p50, p99, mx);
    if (dec_ms > 0) printf("   p50 %5.2f%%  p99 %6.2f%% of a decode step", p50 / (dec_ms * 10), p99 / (dec_ms * 10));
    printf("\n");
}

static void bench_vocab(const vocab *v, int runs, double dec_ms) {
    printf("== vocabulary %s: %d tokens, %zu trie nodes, longest piece %zu bytes\n", v->name, kp_gvocab_n_vocab(v->gv),
           kp_gvocab_n_nodes(v->gv), kp_gvocab_max_len(v->gv));
    uint32_t *mask = malloc(kp_gvocab_mask_words(v->gv) * 4);
    for (size_t w = 0; w < sizeof loads / sizeof loads[0]; w++) {
        const workload *wl = &loads[w];
        int32_t *ids = NULL;
        size_t n = 0;
        kp_error err = {0};
        if (v->tok) {
            if (kp_tok_encode(v->tok, wl->doc, strlen(wl->doc), false, false, &ids, &n, &err) != KP_OK) ids = NULL;
        } else {
            ids = greedy(v, wl->doc, strlen(wl->doc), &n);
        }
        if (!ids) {
            printf("  %s: cannot tokenize the document\n", wl->name);
            continue;
        }
        samples cold = {0}, clone = {0}, warm = {0};
        double comp = 1e9;
        bool ok = true;
        kp_grammar *keep = NULL;
        kp_gmatch *km = NULL;
        for (int r = 0; r < runs && ok; r++) {
            kp_grammar *g = NULL;
            kp_gmatch *m = NULL;
            double a = now_s();
            ok = compile(wl, &g, &err) == KP_OK && kp_gmatch_new(&m, g, v->gv, &err) == KP_OK;
            double c = (now_s() - a) * 1e3;
            if (c < comp) comp = c;
            ok = ok && walk(m, v->gv, ids, n, mask, &cold, &err);
            if (r == 0) kp_gmatch_get_stats(m, &cold.st);
            if (ok && r == 0) {
                keep = g;
                km = m;
                continue;
            }
            kp_gmatch_free(m);
            kp_grammar_free(g);
        }
        kp_gmatch_reset(km); /* the kept matcher, at the start, its cache warm */
        for (int r = 0; r < runs && ok; r++) {
            kp_gmatch *c = NULL; /* a request's matcher when no finished one is spare: a clone */
            ok = kp_gmatch_clone(&c, km, &err) == KP_OK && walk(c, v->gv, ids, n, mask, &clone, &err);
            kp_gmatch_free(c);
        }
        for (int r = 0; r < runs && ok; r++) {
            kp_gmatch_reset(km); /* a finished request's matcher, reset (the server's spares) */
            ok = walk(km, v->gv, ids, n, mask, &warm, &err);
        }
        if (ok) {
            printf("  %s: %zu tokens, %zu bytes; compile %.2f ms; first run: %llu cache entries built, %llu walk "
                   "steps, %llu uncertain tokens checked\n",
                   wl->name, n, strlen(wl->doc), comp, (unsigned long long)cold.st.entries_built,
                   (unsigned long long)cold.st.walk_steps, (unsigned long long)cold.st.unc_checked);
            report("cold", &cold, dec_ms);
            report("clone", &clone, dec_ms);
            report("warm", &warm, dec_ms);
        } else {
            printf("  %s: FAILED: %s\n", wl->name, err.msg);
        }
        kp_gmatch_free(km);
        kp_grammar_free(keep);
        free(cold.t);
        free(clone.t);
        free(warm.t);
        free(ids);
    }
    free(mask);
}

int main(int argc, char **argv) {
    int runs = 5, threads = 2;
    double dec = -1;
    const char *model = "build/bench/smollm2-135m-Q8_0.gguf";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--decode-ms") && i + 1 < argc)
            dec = atof(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "-v") && i + 1 < argc)
            verbose_us = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_grammar [-r runs] [-m model.gguf] [-t threads] [--decode-ms MS] [--quick] "
                            "[-v US]\n");
            return 2;
        }
    }
    if (runs < 1) runs = 1;
    if (dec > 0) {
        printf("decode step: %.2f ms (given)\n", dec);
    } else {
        dec = decode_ms(model, threads);
        if (dec > 0)
            printf("decode step: %.2f ms (median of 48 decodes of %s, %d threads)\n", dec, model, threads);
        else
            printf("decode step: not measured (no model at %s; pass --decode-ms): no ratios\n", model);
    }
    vocab sc = {.name = "starcoder"};
    sc.tok = load_tok("tests/data/vocab/ggml-vocab-starcoder.gguf");
    kp_error err = {0};
    if (!sc.tok || kp_gvocab_new(&sc.gv, sc.tok, &err) != KP_OK) {
        fprintf(stderr, "bench_grammar: cannot load the starcoder vocabulary (run from the repository root)\n");
        return 1;
    }
    bench_vocab(&sc, runs, dec);
    kp_gvocab_free(sc.gv);
    kp_tok_vocab_free(sc.tok);
    if (quick) return 0;
    vocab q = {.name = "151936 (synthetic, Qwen2's size)"};
    if (!make_synthetic(&q)) return 1;
    bench_vocab(&q, runs, dec);
    kp_gvocab_free(q.gv);
    for (int32_t i = 0; i < q.n; i++) free(q.pieces[i]);
    free(q.pieces);
    free(q.lens);
    free(q.sorted);
    return 0;
}
