/*
 * bench.c - `kvpin bench`: prompt processing (pp) and text generation (tg)
 * speed, like llama-bench, at one or more cache depths.
 *
 * One engine without a prefix cache (cache/engine.h), its pool sized for
 * the deepest test. For each depth D the sequence is first filled with D
 * tokens (not timed). ppP times one batched forward of P tokens at
 * positions D..D+P-1 (kp_eng_append, up to EVAL_BATCH tokens per call);
 * tgN times kp_eng_generate of N greedy tokens after D cached positions:
 * the prompt's token at D, then N - 1 decode steps, each sampling its token
 * (N single-token forward calls at positions D..D+N-1). Each test runs -r
 * times (the sequence is cut back to D between runs, so the depth fill is
 * reused) and reports tokens/s as median, min and max. For tg the table
 * also shows the bytes a decode step must read (all weights + the K/V of
 * every cached position) times tokens/s: the achieved bandwidth, next to
 * this machine's measured memory copy bandwidth.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/engine.h"
#include "cache/gen.h"
#include "cli.h"

#define EVAL_BATCH 2048 /* prompt tokens per forward call */

#define MAX_DEPTHS 16

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* memcpy bandwidth (read + write bytes per second) over a 256 MiB buffer,
 * best of 3. */
static double copy_bandwidth(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int r = 0; r < 3; r++) {
            double t0 = cli_now();
            memcpy(b, a, n);
            double dt = cli_now() - t0;
            if (dt > 0 && 2.0 * n / dt > best) best = 2.0 * n / dt;
        }
    }
    free(a);
    free(b);
    return best;
}

static bool parse_depths(const char *s, int64_t *depths, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_DEPTHS) {
            fprintf(stderr, "kvpin bench: at most %d depths\n", MAX_DEPTHS);
            return false;
        }
        if (!cli_parse_i64("-d", tok, 0, 1 << 22, &depths[(*n)++])) return false;
    }
    return true;
}

enum { O_N_PROMPT = CLI_OWN, O_N_GEN, O_N_DEPTH, O_REPS };

/* llama-bench's spellings: -p/-n are token counts here, not a prompt */
static const cli_opt bench_tab[] = {
    CLI_USE(CLI_MODEL),
    {"n-prompt", "p", NULL, "N", "prompt tokens of the pp test (0: skip it)", O_N_PROMPT},
    {"n-gen", "n", NULL, "N", "generated tokens of the tg test (0: skip it)", O_N_GEN},
    {"n-depth", "d", NULL, "D[,D...]", "cache depths to test at (repeatable)", O_N_DEPTH},
    {"repetitions", "r", NULL, "N", "runs of each test", O_REPS},
    CLI_USE(CLI_THREADS), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_JSON), CLI_USE(CLI_SCALAR), {0},
};

static void bench_usage(FILE *f) {
    fprintf(f, "usage: kvpin bench [options]\n"
               "Prompt processing (ppN) and generation (tgN) tokens/s at cache depths, like llama-bench:\n"
               "median, min and max of -r runs; tg also shows the bandwidth it reaches.\n");
    cli_print_options(f, bench_tab);
    fprintf(f, "Defaults: -p 512, -n 128, -d 0, -r 5, --kv-type f16.\n");
}

int cmd_bench(int argc, char **argv) {
    cli_session_opts so = {0};
    so.kv_type = KP_DTYPE_F16;
    int64_t n_pp = 512, n_tg = 128, reps = 5, depths[MAX_DEPTHS];
    int n_depths = 0;
    bool json = false;
    cli_args a;
    cli_args_init(&a, "bench", bench_tab, bench_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        const char *v = a.val;
        int64_t t;
        switch (k) {
        case CLI_STOP: return a.rc;
        case CLI_JSON: json = true; break;
        case CLI_SCALAR: so.scalar = true; break;
        case CLI_MODEL: so.model_path = v; break;
        case O_N_PROMPT: if (!cli_parse_i64(a.opt, v, 0, 1 << 20, &n_pp)) return 2; break;
        case O_N_GEN: if (!cli_parse_i64(a.opt, v, 0, 1 << 20, &n_tg)) return 2; break;
        case O_REPS: if (!cli_parse_i64(a.opt, v, 1, 1000, &reps)) return 2; break;
        case CLI_THREADS: if (!cli_args_int(&a, &t)) return 2; so.n_threads = (int)t; break;
        case O_N_DEPTH: if (!parse_depths(v, depths, &n_depths)) return 2; break;
        case CLI_KV_TYPE: if (!cli_parse_kv_type(v, &so.kv_type)) return 2; break;
        }
    }
    if (!cli_args_no_operands(&a)) return 2;
    if (n_depths == 0) depths[n_depths++] = 0;
    int64_t max_depth = 0;
    for (int i = 0; i < n_depths; i++) max_depth = depths[i] > max_depth ? depths[i] : max_depth;
    so.n_ctx = (uint32_t)(max_depth + (n_pp > n_tg ? n_pp : n_tg) + 1);
    cli_model cm;
    if (!cli_model_open(&cm, &so, "bench")) return 1;
    const kp_hparams *hp = &cm.m->hp;
    int64_t n_fill = max_depth + (n_pp > n_tg ? n_pp : n_tg);
    int32_t *toks = malloc((size_t)(n_fill + 1) * sizeof(int32_t));
    float *logits = malloc(hp->n_vocab * sizeof(float));
    double *tps = malloc((size_t)reps * sizeof(double));
    kp_engine *e = NULL;
    kp_eng_seq seq = {0};
    kp_gen *g = NULL;
    kp_error err = {0};
    int rc = 1;
    if (!toks || !logits || !tps) goto done;
    kp_eng_config ec = {so.kv_type, 16, 0, so.n_ctx, true, NULL};
    if (kp_eng_new(&e, cm.m, cm.pool, cm.kernels, &ec, &err) != KP_OK) goto fail;
    uint64_t x = 12345;
    for (int64_t i = 0; i <= n_fill; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((x >> 33) % hp->n_vocab);
    }
    double bw = json ? 0 : copy_bandwidth();
    const char *name = strrchr(so.model_path ? so.model_path : cli_default_model(), '/');
    name = name ? name + 1 : (so.model_path ? so.model_path : cli_default_model());
    uint64_t kv_per = kp_model_kv_bytes_per_token(hp, so.kv_type);
    if (!json) {
        char b1[32];
        printf("model %s: %s, %u layers, weights %s (%s), KV %s, %d threads, kernels %s\n", name,
               hp->arch_name, hp->n_layer, cli_bytes(cm.m->weight_bytes, b1, sizeof b1),
               kp_dtype_name(cm.m->layers[0].wq.type), kp_dtype_name(so.kv_type), cm.n_threads,
               cm.kernels->name);
        printf("memory copy bandwidth: %.1f GB/s\n\n", bw / 1e9);
        printf("| %-8s | %6s | %10s | %10s | %10s | %22s |\n", "test", "depth", "t/s median", "t/s min",
               "t/s max", "tg bytes/token -> GB/s");
        printf("|%s|%s|%s|%s|%s|%s|\n", "----------", "--------", "------------", "------------",
               "------------", "------------------------");
    }
    for (int di = 0; di < n_depths; di++) {
        int64_t d = depths[di];
        kp_eng_seq_abort(e, &seq);
        if (d > 0 && kp_eng_append(e, &seq, toks, (uint32_t)d, EVAL_BATCH, logits, &err) != KP_OK) goto fail;
        for (int kind = 0; kind < 2; kind++) {
            int64_t n = kind == 0 ? n_pp : n_tg;
            if (n == 0) continue;
            for (int64_t r = 0; r < reps; r++) {
                if (kp_eng_seq_truncate(e, &seq, (uint32_t)d, &err) != KP_OK) goto fail;
                /* tg: greedy, every token counts (no end of generation), the
                 * prompt is the depth and the token at d */
                kp_gen_params gp = {kp_sampler_defaults(), (uint32_t)n, so.n_ctx, (int32_t)hp->n_vocab, true,
                                    NULL, 0, false};
                gp.sp.temp = 0;
                if (kind == 1 && kp_gen_new(&g, cm.tok, toks, (uint32_t)d + 1, &gp, &err) != KP_OK) goto fail;
                double t0 = cli_now();
                kp_status st = kind == 0 ? kp_eng_append(e, &seq, toks + d, (uint32_t)n, EVAL_BATCH, logits, &err)
                                         : kp_eng_generate(e, &seq, g, NULL, NULL, &err);
                double dt = cli_now() - t0;
                kp_gen_free(g);
                g = NULL;
                if (st != KP_OK) goto fail;
                tps[r] = n / (dt > 0 ? dt : 1e-9);
            }
            qsort(tps, (size_t)reps, sizeof(double), cmp_double);
            double med = reps % 2 ? tps[reps / 2] : 0.5 * (tps[reps / 2 - 1] + tps[reps / 2]);
            char test[32];
            snprintf(test, sizeof test, "%s%lld", kind == 0 ? "pp" : "tg", (long long)n);
            /* bytes per decode step: every weight once + K/V of the cache (mid-run length) */
            double bytes = (double)cm.m->weight_bytes + (double)kv_per * (double)(d + n / 2);
            if (json) {
                printf("{\"engine\":\"kvpin\",\"model\":\"%s\",\"test\":\"%s\",\"depth\":%lld,\"n_threads\":%d,"
                       "\"kv_type\":\"%s\",\"kernels\":\"%s\",\"tps_median\":%.3f,\"tps_min\":%.3f,"
                       "\"tps_max\":%.3f,\"reps\":%lld",
                       name, test, (long long)d, cm.n_threads, kp_dtype_name(so.kv_type), cm.kernels->name,
                       med, tps[0], tps[reps - 1], (long long)reps);
                if (kind == 1) printf(",\"bytes_per_token\":%.0f,\"gbps\":%.3f", bytes, bytes * med / 1e9);
                printf("}\n");
            } else {
                char extra[64] = "";
                if (kind == 1)
                    snprintf(extra, sizeof extra, "%.1f MB -> %.1f (%.0f%%)", bytes / 1e6, bytes * med / 1e9,
                             bw > 0 ? 100.0 * bytes * med / bw : 0.0);
                printf("| %-8s | %6lld | %10.2f | %10.2f | %10.2f | %22s |\n", test, (long long)d, med,
                       tps[0], tps[reps - 1], extra);
            }
            fflush(stdout);
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvpin bench: %s\n", err.msg);
done:
    if (e) kp_eng_seq_abort(e, &seq);
    kp_gen_free(g);
    kp_eng_free(e);
    free(toks);
    free(logits);
    free(tps);
    cli_model_close(&cm);
    return rc;
}
