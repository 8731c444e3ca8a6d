/*
 * bench.c - `kvpin bench`: prompt processing (pp) and text generation (tg)
 * speed, like llama-bench, at one or more cache depths.
 *
 * One engine without a prefix cache (engine/engine.h), its pool sized for
 * the deepest test. For each depth D the sequence is first filled with D
 * tokens (not timed). ppP times one batched forward of P tokens at
 * positions D..D+P-1 (kp_eng_append, up to EVAL_BATCH tokens per call);
 * tgN times kp_eng_generate of N greedy tokens after D cached positions:
 * the prompt's token at D, then N - 1 decode steps, each sampling its token
 * (N single-token forward calls at positions D..D+N-1). Each test runs -r
 * times (the sequence is cut back to D between runs, so the depth fill is
 * reused) and reports tokens/s as median, min and max.
 *
 * -b B[,B...] adds, per depth, the tg test with B sequences decoding
 * together: B sequences of their own (filled to D one by one: there is no
 * prefix cache to share the fill), each cut back to D before a run, then N
 * steps of kp_eng_step with one greedy token per sequence (each weight read
 * once per step for all B). It reports the aggregate tokens/s (B x N / the
 * run's time) and its ratio to the one-sequence tg median at that depth:
 * how batched decode scales.
 *
 * Achieved against possible. Before the tests the machine is probed on the
 * engine's thread pool (kernels/probe.h; well under a second, skipped with
 * --no-probe): streaming read bandwidth over max(4 x LLC, 256 MiB), and the
 * int8 multiply-add peak of the widest loop the CPU has (the scalar loop
 * with --scalar). The cost model (model/cost.h) turns tokens/s into work:
 *
 *   pp  GOPS = t/s x ops per token: the layer matrices for every token, the
 *       output projection once per test (a prompt batch computes the last
 *       token's logits only), and the attention at positions D..D+P-1
 *       (mean depth D + (P+1)/2); against the int8 peak.
 *   tg  GB/s = t/s x bytes per decode step: every matrix it multiplies by
 *       (layers + output projection; the embedding table only when tied,
 *       as the output) + the K/V of the cache at mid-run length D + N/2;
 *       against the read bandwidth.
 *
 * --plot FILE.svg draws the latency picture from the measurements
 * (plot.h): prefill tokens/s and time to first token (P / pp tokens/s)
 * against the prompt length (-p takes several), one series per depth,
 * and decode tokens/s against the depth with the bytes-bound ceiling (the
 * read bandwidth over the bytes a decode step reads) as a line. --peer
 * FILE adds llama.cpp's points for the same model file from its JSON lines
 * (bench/llamacpp_bench.mjs --json).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/gen.h"
#include "cli.h"
#include "kernels/probe.h"
#include "model/cost.h"
#include "plot.h"

#define EVAL_BATCH 2048 /* prompt tokens per forward call */

#define MAX_DEPTHS 16

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0..n) (n >= 1) and returns its median. */
static double sort_median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* What every result line names. */
typedef struct {
    const char *model, *kv, *kernels;
    int n_threads;
    int64_t reps;
} row_ctx;

/* The start of a result's JSON line, up to its test's own fields (the
 * caller adds them and the closing brace); batch 0: no "batch" field. tps
 * sorted. */
static void json_head(const row_ctx *c, const char *test, int batch, int64_t d, const double *tps, double med) {
    printf("{\"engine\":\"kvpin\",\"model\":\"%s\",\"test\":\"%s\"", c->model, test);
    if (batch) printf(",\"batch\":%d", batch);
    printf(",\"depth\":%lld,\"n_threads\":%d,\"kv_type\":\"%s\",\"kernels\":\"%s\",\"tps_median\":%.3f,"
           "\"tps_min\":%.3f,\"tps_max\":%.3f,\"reps\":%lld",
           (long long)d, c->n_threads, c->kv, c->kernels, med, tps[0], tps[c->reps - 1], (long long)c->reps);
}

/* A result's row of the table (tps sorted). */
static void table_row(const row_ctx *c, const char *test, int64_t d, const double *tps, double med,
                      const char *extra) {
    printf("| %-8s | %6lld | %10.2f | %10.2f | %10.2f | %-38s |\n", test, (long long)d, med, tps[0],
           tps[c->reps - 1], extra);
}

/* A comma-separated list of values in [min, max] appended to v[0..*n). */
static bool parse_list(const char *opt, const char *what, const char *s, int64_t min, int64_t max, int64_t *v,
                       int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_DEPTHS) {
            fprintf(stderr, "kvpin bench: at most %d %s\n", MAX_DEPTHS, what);
            return false;
        }
        if (!cli_parse_i64(opt, tok, min, max, &v[(*n)++])) return false;
    }
    return true;
}

/* One measured test, for --plot. */
typedef struct {
    bool pp;
    int64_t n, depth;
    double tps;
} measured;

static const char *const COLOURS[] = {"#1b6ca8", "#2f8f5b", "#8a4fb0", "#c2417a", "#b8860b", "#444444"};

/* The latency picture of kvpin's measurements and, from peer (JSON lines,
 * may be NULL), llama.cpp's for the same model file, as an SVG at path. */
static bool write_plot(const char *path, const char *peer, const char *name, const measured *ms, int n_ms,
                       double bw, double weight_bytes, double kv_per, int64_t n_tg, int n_threads) {
    cli_plot_chart *c = calloc(1, sizeof *c);
    if (!c) return false;
    snprintf(c->title, sizeof c->title, "kvpin bench: %s, %d threads (tokens/s: median of the runs)", name, n_threads);
    cli_plot_panel *pf = cli_plot_add_panel(c, "prefill", "prompt tokens", "tokens / s");
    cli_plot_panel *pt = cli_plot_add_panel(c, "time to first token", "prompt tokens", "ms (prompt / prefill speed)");
    cli_plot_panel *pd = cli_plot_add_panel(c, "decode", "cache depth (positions)", "tokens / s");
    char sname[64];
    int64_t max_depth = 0;
    for (int i = 0; i < n_ms; i++) {
        const measured *m = &ms[i];
        max_depth = m->depth > max_depth ? m->depth : max_depth;
        if (m->pp) {
            snprintf(sname, sizeof sname, "kvpin, depth %lld", (long long)m->depth);
            int k = pf->n_series % 6;
            cli_plot_series *a = cli_plot_series_of(pf, sname, COLOURS[k], false);
            cli_plot_series *b = cli_plot_series_of(pt, sname, COLOURS[k], false);
            cli_plot_join(a);
            cli_plot_join(b);
            cli_plot_point(a, (double)m->n, m->tps);
            cli_plot_point(b, (double)m->n, 1e3 * m->n / m->tps);
        } else {
            snprintf(sname, sizeof sname, "kvpin tg%lld", (long long)m->n);
            cli_plot_series *d = cli_plot_series_of(pd, sname, COLOURS[0], false);
            cli_plot_join(d);
            cli_plot_point(d, (double)m->depth, m->tps);
        }
    }
    FILE *f = peer ? fopen(peer, "r") : NULL;
    if (peer && !f) fprintf(stderr, "kvpin bench: note: cannot read --peer %s; plotted without it\n", peer);
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *eng = json_string_value(json_object_get(j, "engine"));
        const char *model = json_string_value(json_object_get(j, "model"));
        const char *test = json_string_value(json_object_get(j, "test"));
        const char *mode = json_string_value(json_object_get(j, "flash_attn_mode"));
        double tps = json_number_value(json_object_get(j, "tps_median"));
        double depth = json_number_value(json_object_get(j, "depth"));
        if (eng && strcmp(eng, "kvpin") && model && !strcmp(model, name) && test && tps > 0 &&
            (!strncmp(test, "pp", 2) || !strncmp(test, "tg", 2))) {
            double n = atof(test + 2);
            if (test[0] == 'p') {
                snprintf(sname, sizeof sname, "llama.cpp fa %s, depth %.0f", mode ? mode : "?", depth);
                cli_plot_point(cli_plot_series_of(pf, sname, "#d1603d", false), n, tps);
                cli_plot_point(cli_plot_series_of(pt, sname, "#d1603d", false), n, 1e3 * n / tps);
            } else {
                snprintf(sname, sizeof sname, "llama.cpp fa %s %s", mode ? mode : "?", test);
                cli_plot_point(cli_plot_series_of(pd, sname, "#d1603d", false), depth, tps);
            }
        }
        json_decref(j);
    }
    if (f) fclose(f);
    if (bw > 0) {
        /* the ceiling: every weight and the K/V of the cache read once per token */
        snprintf(sname, sizeof sname, "bytes-bound ceiling (%.1f GB/s read)", bw / 1e9);
        cli_plot_series *ceil = cli_plot_series_of(pd, sname, "#999999", true);
        for (int i = 0; i <= 16; i++) {
            double d = (double)max_depth * i / 16;
            cli_plot_point(ceil, d, bw / (weight_bytes + kv_per * (d + (double)n_tg / 2)));
        }
    }
    bool ok = cli_plot_write(c, path);
    free(c);
    return ok;
}

enum { O_N_PROMPT = CLI_OWN, O_N_GEN, O_N_DEPTH, O_REPS, O_PLOT, O_PEER, O_NO_PROBE, O_BATCH };

#define MAX_BATCH 64

/* greedy: the index of the largest of n logits */
static int32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* One run of tg with nb sequences stepping together: every sequence (at
 * depth d already) cut back to d, then n steps of one token each, sequence
 * i starting from its own token; *dt the time of the n steps. */
static kp_status batch_run(kp_engine *e, kp_eng_seq *seqs, int nb, const int32_t *toks, int64_t d, int64_t n,
                           uint32_t n_vocab, float *lg, double *dt, kp_error *err) {
    int32_t cur[MAX_BATCH];
    kp_eng_item items[MAX_BATCH];
    for (int i = 0; i < nb; i++) {
        kp_status st = kp_eng_seq_truncate(e, &seqs[i], (uint32_t)d, err);
        if (st != KP_OK) return st;
        cur[i] = (int32_t)(((uint32_t)toks[d] + (uint32_t)i) % n_vocab);
    }
    double t0 = cli_now();
    for (int64_t s = 0; s < n; s++) {
        for (int i = 0; i < nb; i++) items[i] = (kp_eng_item){.seq = &seqs[i], .tokens = &cur[i], .n = 1, .logits = lg + (size_t)i * n_vocab};
        kp_status st = kp_eng_step(e, items, (uint32_t)nb, err);
        if (st != KP_OK) return st;
        for (int i = 0; i < nb; i++) {
            if (items[i].status != KP_OK) {
                *err = items[i].err;
                return items[i].status;
            }
            cur[i] = argmax(lg + (size_t)i * n_vocab, n_vocab);
        }
    }
    *dt = cli_now() - t0;
    return KP_OK;
}

/* llama-bench's spellings: -p/-n are token counts here, not a prompt */
static const cli_opt bench_tab[] = {
    CLI_USE(CLI_MODEL),
    {"n-prompt", "p", NULL, "N[,N...]", "prompt tokens of the pp tests (0: skip them)", O_N_PROMPT},
    {"n-gen", "n", NULL, "N", "generated tokens of the tg test (0: skip it)", O_N_GEN},
    {"n-depth", "d", NULL, "D[,D...]", "cache depths to test at (repeatable)", O_N_DEPTH},
    {"repetitions", "r", NULL, "N", "runs of each test", O_REPS},
    {"plot", NULL, NULL, "FILE.svg", "also draw the results as an SVG: prefill speed and time to first\n"
                                     "token vs prompt length, decode speed vs depth with the bytes-bound\n"
                                     "ceiling", O_PLOT},
    {"peer", NULL, NULL, "FILE", "llama.cpp's JSON lines (bench/llamacpp_bench.mjs --json) to plot\n"
                                 "beside kvpin's (the same model file)", O_PEER},
    {"no-probe", NULL, NULL, NULL, "skip measuring the machine's read bandwidth and int8 peak", O_NO_PROBE},
    {"batch", "b", NULL, "B[,B...]", "also run tg with B sequences decoding together (2..64): the\n"
                                     "aggregate tokens/s and its ratio to one sequence's", O_BATCH},
    CLI_USE(CLI_THREADS), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V), CLI_USE(CLI_JSON), CLI_USE(CLI_SCALAR), CLI_USE(CLI_NO_REPACK), CLI_USE(CLI_ATTN_PRECISION), {0},
};

static void bench_usage(FILE *f) {
    fprintf(f, "usage: kvpin bench [options]\n"
               "Prompt processing (ppN) and generation (tgN) tokens/s at cache depths, like llama-bench:\n"
               "median, min and max of -r runs. The machine's read bandwidth and int8 peak are\n"
               "measured first; pp shows the GOPS it reaches, tg the GB/s, as %% of those.\n");
    cli_print_options(f, bench_tab);
    fprintf(f, "Defaults: -p 512, -n 128, -d 0, -r 5, --kv-type f16; with --plot, -p 128,256,512 and\n"
               "-d 0,512,1024 (a sweep). --plot FILE.svg draws the results (a point per test and depth, the\n"
               "points of a series joined); --peer adds llama.cpp's.\n");
}

int cmd_bench(int argc, char **argv) {
    cli_session_opts so = {0};
    so.kv_type = so.kv_type_v = KP_DTYPE_F16;
    int64_t n_tg = 128, reps = 5, depths[MAX_DEPTHS], pps[MAX_DEPTHS], batches[MAX_DEPTHS];
    int n_depths = 0, n_pps = 0, n_batches = 0;
    bool json = false, probe = true;
    const char *plot = NULL, *peer = NULL;
    cli_args a;
    cli_args_init(&a, "bench", bench_tab, bench_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        const char *v = a.val;
        int64_t t;
        switch (k) {
        case CLI_STOP: return a.rc;
        case CLI_JSON: json = true; break;
        case CLI_SCALAR: so.scalar = true; break;
        case CLI_NO_REPACK: so.no_repack = true; break;
        case CLI_ATTN_PRECISION: if (!cli_parse_attn(v, &so.attn)) return 2; break;
        case CLI_MODEL: so.model_path = v; break;
        case O_N_PROMPT: if (!parse_list(a.opt, "prompt lengths", v, 0, 1 << 20, pps, &n_pps)) return 2; break;
        case O_PLOT: plot = v; break;
        case O_PEER: peer = v; break;
        case O_NO_PROBE: probe = false; break;
        case O_BATCH: if (!parse_list(a.opt, "batch sizes", v, 1, MAX_BATCH, batches, &n_batches)) return 2; break;
        case O_N_GEN: if (!cli_parse_i64(a.opt, v, 0, 1 << 20, &n_tg)) return 2; break;
        case O_REPS: if (!cli_parse_i64(a.opt, v, 1, 1000, &reps)) return 2; break;
        case CLI_THREADS: if (!cli_args_int(&a, &t)) return 2; so.n_threads = (int)t; break;
        case O_N_DEPTH: if (!parse_list("-d", "depths", v, 0, 1 << 22, depths, &n_depths)) return 2; break;
        case CLI_KV_TYPE:
        case CLI_KV_TYPE_K:
        case CLI_KV_TYPE_V: if (!cli_parse_kv_opt(k, v, &so.kv_type, &so.kv_type_v)) return 2; break;
        }
    }
    if (!cli_args_no_operands(&a)) return 2;
    /* a plot of one point per panel says nothing: --plot sweeps unless told */
    if (n_depths == 0 && plot) depths[n_depths++] = 0, depths[n_depths++] = 512, depths[n_depths++] = 1024;
    if (n_pps == 0 && plot) pps[n_pps++] = 128, pps[n_pps++] = 256, pps[n_pps++] = 512;
    if (n_depths == 0) depths[n_depths++] = 0;
    if (n_pps == 0) pps[n_pps++] = 512;
    int64_t n_pp = 0; /* the longest prompt */
    for (int i = 0; i < n_pps; i++) n_pp = pps[i] > n_pp ? pps[i] : n_pp;
    int64_t max_depth = 0, max_batch = 1;
    for (int i = 0; i < n_depths; i++) max_depth = depths[i] > max_depth ? depths[i] : max_depth;
    for (int i = 0; i < n_batches; i++) max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    so.n_ctx = (uint32_t)(max_depth + (n_pp > n_tg ? n_pp : n_tg) + 1);
    cli_model cm;
    if (!cli_model_open(&cm, &so, "bench")) return 1;
    const kp_hparams *hp = &cm.m->hp;
    int64_t n_fill = max_depth + (n_pp > n_tg ? n_pp : n_tg);
    int32_t *toks = malloc((size_t)(n_fill + 1) * sizeof(int32_t));
    float *logits = malloc(hp->n_vocab * sizeof(float));
    float *blog = max_batch > 1 ? malloc((size_t)max_batch * hp->n_vocab * sizeof(float)) : NULL;
    kp_eng_seq bseq[MAX_BATCH];
    memset(bseq, 0, sizeof bseq);
    double *tps = malloc((size_t)reps * sizeof(double));
    double *att_rate = malloc((size_t)reps * sizeof(double)), *att_share = malloc((size_t)reps * sizeof(double));
    measured ms[2 * MAX_DEPTHS * MAX_DEPTHS];
    int n_ms = 0;
    kp_engine *e = NULL;
    kp_eng_seq seq = {0};
    kp_gen *g = NULL;
    kp_error err = {0};
    int rc = 1;
    if (!toks || !logits || !tps || (max_batch > 1 && !blog)) goto done;
    kp_eng_config ec = {so.kv_type, 16, 0, so.n_ctx, true, NULL, so.kv_type_v, so.no_repack, 0, 0};
    if (max_batch > 1) /* the tg sequence and max_batch others, each of up to n_ctx positions */
        ec.budget_bytes = (uint64_t)(max_batch + 1) * ((so.n_ctx + 15) / 16 + 1) * 16 *
                          kp_model_kv_bytes_per_token_kv(&cm.m->hp, so.kv_type, so.kv_type_v);
    if (kp_eng_new(&e, cm.m, cm.pool, cm.kernels, &ec, &err) != KP_OK || kp_eng_set_attn(e, so.attn, &err) != KP_OK)
        goto fail;
    uint64_t x = 12345;
    for (int64_t i = 0; i <= n_fill; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((x >> 33) % hp->n_vocab);
    }
    /* the machine's ceilings, on the engine's pool (0: not measured) */
    double bw = 0, peak = 0, fpeak = 0;
    const char *peak_isa = NULL, *fpeak_isa = NULL;
    kp_probe_bw pb = {0};
    bool over = false; /* a decode test above the probe's best read */
    if (probe) {
        kp_error perr = {0};
        if (kp_probe_read_bw_stable(cm.pool, kp_probe_default_bytes(), 5, 20, so.scalar, &pb, &perr) != KP_OK ||
            !((bw = pb.best) > 0) || kp_probe_int8_peak(cm.pool, so.scalar, &peak_isa, &peak, &perr) != KP_OK ||
            !(peak > 0)) {
            fprintf(stderr, "kvpin bench: note: machine probe failed (%s); no ceilings\n", perr.msg);
            bw = peak = 0;
            peak_isa = NULL;
        } else if (kp_probe_float_peak(cm.pool, strstr(kp_eng_attn_name(e), "bf16") != NULL, so.scalar, &fpeak_isa,
                                       &fpeak, &perr) != KP_OK || !(fpeak > 0)) {
            fpeak = 0; /* the attention figures go without a ceiling */
            fpeak_isa = NULL;
        }
    }
    kp_cost cost;
    kp_model_cost(cm.m, &cost);
    const char *name = strrchr(so.model_path ? so.model_path : cli_default_model(), '/');
    name = name ? name + 1 : (so.model_path ? so.model_path : cli_default_model());
    uint64_t kv_per = kp_model_kv_bytes_per_token_kv(hp, so.kv_type, so.kv_type_v);
    char kvn[24];
    cli_kv_name(so.kv_type, so.kv_type_v, kvn, sizeof kvn);
    const row_ctx rc_ = {name, kvn, cm.kernels->name, cm.n_threads, reps};
    if (!json) {
        char b1[32];
        printf("model %s: %s, %u layers, weights %s (%s), KV %s, %d threads, kernels %s\n", name,
               hp->arch_name, hp->n_layer, cli_bytes(cm.m->weight_bytes, b1, sizeof b1),
               kp_dtype_name(cm.m->layers[0].wq.type), kvn, cm.n_threads,
               cm.kernels->name);
        if (peak_isa)
            printf("machine: read bandwidth %.1f GB/s (%d thread%s; best of %d passes, median %.1f, min %.1f%s), "
                   "int8 peak %.0f GOPS (%s)\n",
                   bw / 1e9, cm.n_threads, cm.n_threads == 1 ? "" : "s", pb.passes, pb.median / 1e9, pb.min / 1e9,
                   pb.stable ? "" : "; not stable: the machine is shared or throttling", peak / 1e9, peak_isa);
        else
            printf("machine: not measured (%s)\n", probe ? "the probe failed" : "--no-probe");
        if (fpeak_isa)
            printf("attention: table %s; its multiply-add peak %.0f GFLOP/s (%s)\n", kp_eng_attn_name(e), fpeak / 1e9,
                   fpeak_isa);
        else
            printf("attention: table %s\n", kp_eng_attn_name(e));
        printf("per token: %.3g M matrix ops; a decode step reads %s of weights + %llu bytes of K/V a "
               "position\n\n",
               cost.matmul_ops / 1e6, cli_bytes(cost.weight_bytes_read, b1, sizeof b1),
               (unsigned long long)kv_per);
        printf("| %-8s | %6s | %10s | %10s | %10s | %-38s |\n", "test", "depth", "t/s median", "t/s min",
               "t/s max", peak_isa ? "achieved (% of the machine)" : "achieved");
        printf("|%s|%s|%s|%s|%s|%s|\n", "----------", "--------", "------------", "------------",
               "------------", "----------------------------------------");
    }
    for (int di = 0; di < n_depths; di++) {
        int64_t d = depths[di];
        double tg_med = 0; /* the one-sequence tg median at d */
        kp_eng_seq_abort(e, &seq);
        if (d > 0 && kp_eng_append(e, &seq, toks, (uint32_t)d, EVAL_BATCH, logits, &err) != KP_OK) goto fail;
        for (int ti = 0; ti <= n_pps; ti++) {
            int kind = ti == n_pps; /* the pp tests, then tg */
            int64_t n = kind == 0 ? pps[ti] : n_tg;
            if (n == 0) continue;
            for (int64_t r = 0; r < reps; r++) {
                if (kp_eng_seq_truncate(e, &seq, (uint32_t)d, &err) != KP_OK) goto fail;
                /* tg: greedy, every token counts (no end of generation), the
                 * prompt is the depth and the token at d */
                kp_gen_params gp = {kp_sampler_defaults(), (uint32_t)n, so.n_ctx, (int32_t)hp->n_vocab, true,
                                    NULL, 0, false};
                gp.sp.temp = 0;
                if (kind == 1 && kp_gen_new(&g, cm.tok, toks, (uint32_t)d + 1, &gp, &err) != KP_OK) goto fail;
                double af0, as0, af1, as1;
                kp_eng_attn_work(e, &af0, &as0);
                double t0 = cli_now();
                kp_status st = kind == 0 ? kp_eng_append(e, &seq, toks + d, (uint32_t)n, EVAL_BATCH, logits, &err)
                                         : kp_eng_generate(e, &seq, g, NULL, NULL, &err);
                double dt = cli_now() - t0;
                kp_gen_free(g);
                g = NULL;
                if (st != KP_OK) goto fail;
                tps[r] = n / (dt > 0 ? dt : 1e-9);
                kp_eng_attn_work(e, &af1, &as1);
                att_rate[r] = as1 > as0 ? (af1 - af0) / (as1 - as0) : 0;
                att_share[r] = dt > 0 ? (as1 - as0) / dt : 0;
            }
            double att_med = sort_median(att_rate, reps), share_med = sort_median(att_share, reps);
            double med = sort_median(tps, reps);
            ms[n_ms++] = (measured){kind == 0, n, d, med};
            char test[32];
            snprintf(test, sizeof test, "%s%lld", kind == 0 ? "pp" : "tg", (long long)n);
            /* tg, bytes per decode step: every matrix once + K/V of the cache (mid-run length) */
            double bytes = (double)cost.weight_bytes_read + (double)kv_per * (double)(d + n / 2);
            /* pp, operations per token: positions d..d+n-1 attend to d+1..d+n positions */
            double attn = 0.5 * (double)(kp_model_attn_ops(hp, (uint64_t)d + 1) +
                                         kp_model_attn_ops(hp, (uint64_t)(d + n)));
            double mm = (double)(cost.matmul_ops - cost.output_ops) + (double)cost.output_ops / (double)n;
            double gbs = bytes * med / 1e9, gops = (mm + attn) * med / 1e9;
            if (json) {
                json_head(&rc_, test, kind == 1, d, tps, med);
                if (peak_isa)
                    printf(",\"read_bw_gbs\":%.3f,\"peak_gops\":%.3f,\"peak_isa\":\"%s\"", bw / 1e9, peak / 1e9,
                           peak_isa);
                if (kind == 1) {
                    printf(",\"bytes_per_token\":%.0f,\"tg_gbs\":%.6g,\"gbps\":%.6g", bytes, gbs, gbs);
                    if (peak_isa) printf(",\"tg_pct_of_read_bw\":%.3f", 100.0 * gbs * 1e9 / bw);
                    if (peak_isa) printf(",\"read_bw_median_gbs\":%.3f,\"read_bw_min_gbs\":%.3f,\"read_bw_passes\":%d",
                                         pb.median / 1e9, pb.min / 1e9, pb.passes);
                } else {
                    printf(",\"ops_per_token\":%.0f,\"pp_gops\":%.6g,\"pp_attn_gops\":%.6g", mm + attn, gops,
                           attn * med / 1e9);
                    if (peak_isa) printf(",\"pp_pct_of_peak\":%.3f", 100.0 * gops * 1e9 / peak);
                    printf(",\"attn_table\":\"%s\",\"attn_gflops\":%.6g,\"attn_time_share\":%.4f", kp_eng_attn_name(e),
                           att_med / 1e9, share_med);
                    if (fpeak_isa)
                        printf(",\"attn_peak_gflops\":%.3f,\"attn_peak_isa\":\"%s\",\"attn_pct_of_peak\":%.3f",
                               fpeak / 1e9, fpeak_isa, 100.0 * att_med / fpeak);
                }
                printf("}\n");
            } else {
                char extra[128], pct[32] = "";
                if (kind == 1) {
                    if (peak_isa) {
                        double p = 100.0 * gbs * 1e9 / bw;
                        over = over || p > 100.0;
                        snprintf(pct, sizeof pct, " (%.1f%% of read%s)", p, p > 100.0 ? " *" : "");
                    }
                    snprintf(extra, sizeof extra, "%.2f MB -> %.2f GB/s%s", bytes / 1e6, gbs, pct);
                } else {
                    if (peak_isa) snprintf(pct, sizeof pct, " (%.1f%% of int8)", 100.0 * gops * 1e9 / peak);
                    char apct[32] = "";
                    if (fpeak_isa) snprintf(apct, sizeof apct, " (%.0f%% of peak)", 100.0 * att_med / fpeak);
                    snprintf(extra, sizeof extra, "%.2f GOPS%s; attn %.0f%% time, %.0f GFLOP/s%s", gops, pct,
                             100.0 * share_med, att_med / 1e9, apct);
                }
                table_row(&rc_, test, d, tps, med, extra);
            }
            fflush(stdout);
            if (kind == 1) tg_med = med;
        }
        for (int bi = 0; bi < n_batches && n_tg > 0; bi++) {
            int nb = (int)batches[bi];
            if (nb < 2) continue;
            for (int i = 0; i < nb; i++) {
                kp_eng_seq_abort(e, &bseq[i]);
                if (d > 0 && kp_eng_append(e, &bseq[i], toks, (uint32_t)d, EVAL_BATCH, logits, &err) != KP_OK)
                    goto fail;
            }
            for (int64_t r = 0; r < reps; r++) {
                double dt = 0;
                if (batch_run(e, bseq, nb, toks, d, n_tg, hp->n_vocab, blog, &dt, &err) != KP_OK) goto fail;
                tps[r] = (double)nb * (double)n_tg / (dt > 0 ? dt : 1e-9);
            }
            for (int i = 0; i < nb; i++) kp_eng_seq_abort(e, &bseq[i]);
            double med = sort_median(tps, reps);
            /* a step reads every matrix once and the K/V of all nb caches */
            double step_bytes = (double)cost.weight_bytes_read + (double)nb * (double)kv_per * (double)(d + n_tg / 2);
            double gbs = step_bytes * med / nb / 1e9, scale = tg_med > 0 ? med / tg_med : 0;
            char test[48];
            if (json) {
                snprintf(test, sizeof test, "tg%lld", (long long)n_tg);
                json_head(&rc_, test, nb, d, tps, med);
                printf(",\"tps_per_seq\":%.3f,\"bytes_per_step\":%.0f,\"tg_gbs\":%.6g", med / nb, step_bytes, gbs);
                if (tg_med > 0) printf(",\"vs_one_seq\":%.3f", scale);
                printf("}\n");
            } else {
                char extra[64];
                snprintf(extra, sizeof extra, "%.2f GB/s, x%.2f of one sequence", gbs, scale);
                snprintf(test, sizeof test, "tg%lld x%d", (long long)n_tg, nb);
                table_row(&rc_, test, d, tps, med, extra);
            }
            fflush(stdout);
        }
    }
    if (over && !json)
        printf("\n* above the probe's best read (%.1f GB/s; its passes ranged %.1f-%.1f): the machine's\n"
               "  bandwidth moved during the run (shared or throttling), or part of a step's bytes came from\n"
               "  cache (a small model fits it). Read such a figure as at the limit, not above it.\n",
               bw / 1e9, pb.min / 1e9, pb.best / 1e9);
    rc = 0;
    if (plot && !write_plot(plot, peer, name, ms, n_ms, bw, (double)cost.weight_bytes_read, (double)kv_per, n_tg,
                            cm.n_threads))
        rc = 1;
    goto done;
fail:
    fprintf(stderr, "kvpin bench: %s\n", err.msg);
done:
    if (e) kp_eng_seq_abort(e, &seq);
    for (int i = 0; e && i < MAX_BATCH; i++) kp_eng_seq_abort(e, &bseq[i]);
    kp_gen_free(g);
    kp_eng_free(e);
    free(toks);
    free(logits);
    free(blog);
    free(tps);
    free(att_rate);
    free(att_share);
    cli_model_close(&cm);
    return rc;
}
