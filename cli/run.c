/*
 * run.c - `kvpin run`, `kvpin logits`, `kvpin inspect`: one sequence through
 * an engine without a prefix cache (engine/engine.h).
 *
 * The prompt: the ids of --tokens (logits), else the text of -p or -f
 * tokenized by the library as kp_generate_text does (kp_tokenize_prompt,
 * kvpin.h), so an empty prompt starts from BOS here as there.
 *
 * run: kp_eng_generate: prefill the prompt in batches of up to EVAL_BATCH
 * tokens (the KV of every prompt position is written), then decode one
 * token at a time (each step appends one K/V row per layer and kv-head);
 * the kp_gen (engine/gen.h) samples, applies stop strings and the limits
 * and releases text, streamed to stdout as whole UTF-8 characters; a
 * summary goes to stderr. When stderr is a terminal and the prompt is long
 * (more than PROGRESS_MIN tokens), the prompt is prefilled in slices of
 * PROGRESS_SLICE first, with a progress bar on stderr (prefill_with_bar).
 * logits: the prompt in batches of up to EVAL_BATCH tokens with logits for
 * every position (kp_eng_step with all_logits), written as float32
 * [n_tokens][n_vocab].
 * inspect: run's loop with the engine's attention probe, printing the cache
 * length and the newest position's attention over every cached position for
 * one layer and head; with --html FILE also the page of every step's
 * weights as a heat map (heatmap.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "engine/engine.h"
#include "engine/gen.h"
#include "cli.h"
#include "heatmap.h"
#include "model/sampler.h"
#include "tok/textout.h"

#define EVAL_BATCH 2048 /* prompt tokens per forward call */
#define PROGRESS_MIN 512   /* longer prompts show a prefill progress bar on a terminal */
#define PROGRESS_SLICE 256 /* prompt tokens per forward call while the bar shows */

#define MAX_STOPS KP_TEXTOUT_MAX_STOPS

typedef struct {
    cli_session_opts so;
    const char *prompt;       /* -p */
    const char *prompt_file;  /* -f */
    const char *tokens;       /* --tokens "1 2 3" */
    const char *out;          /* -o */
    int64_t n_predict;
    kp_sampler_params sp;
    bool seed_set;
    bool no_bos;
    bool special;
    bool print_tokens;
    const char *stops[MAX_STOPS];
    int n_stops;
    int64_t layer, head;
    const char *html;         /* inspect --html */
} run_opts;

enum { O_STOP = CLI_OWN, O_TOKENS, O_OUTPUT, O_LAYER, O_HEAD, O_PROMPT_CACHE, O_HTML };

static const cli_opt run_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE), CLI_USE(CLI_N_PREDICT), CLI_SAMPLING_OPTS,
    {"stop", NULL, NULL, "STR", "end the text before STR (repeatable, at most 16)", O_STOP},
    CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V), CLI_USE(CLI_NO_BOS), CLI_USE(CLI_SPECIAL),
    CLI_USE(CLI_PRINT_TOKENS), CLI_USE(CLI_SCALAR), CLI_USE(CLI_NO_REPACK), CLI_USE(CLI_ATTN_PRECISION),
    /* cmd_run hands these to cache.c before run's parser sees them */
    {"prompt-cache", NULL, NULL, NULL, "several prompts through one prefix cache: -p/-f repeated, or\n"
                                       "--turns FILE.jsonl (see kvpin run --prompt-cache --help)", O_PROMPT_CACHE},
    {0},
};
static const cli_opt logits_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE),
    {"tokens", NULL, NULL, "IDS", "the prompt as token ids, \"1 2 3\" (instead of -p or -f)", O_TOKENS},
    {"output", "o", NULL, "FILE", "write the logits to FILE", O_OUTPUT},
    CLI_USE(CLI_NO_BOS), CLI_USE(CLI_SPECIAL), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V), CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE),
    CLI_USE(CLI_SCALAR), CLI_USE(CLI_NO_REPACK), CLI_USE(CLI_ATTN_PRECISION), {0},
};
static const cli_opt inspect_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE), CLI_USE(CLI_N_PREDICT),
    {"layer", NULL, NULL, "L", "the layer whose attention is shown (default: the last)", O_LAYER},
    {"head", NULL, NULL, "H", "the query head whose attention is shown (default: 0)", O_HEAD},
    {"html", NULL, NULL, "FILE", "also write every step's attention as a heat map page to FILE", O_HTML},
    CLI_SAMPLING_OPTS, CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V), CLI_USE(CLI_NO_BOS),
    CLI_USE(CLI_SPECIAL), CLI_USE(CLI_PRINT_TOKENS), CLI_USE(CLI_SCALAR), CLI_USE(CLI_NO_REPACK), CLI_USE(CLI_ATTN_PRECISION), {0},
};

static void run_help(FILE *f) {
    fprintf(f, "usage: kvpin run [options]\n"
               "Generates text from a prompt: stdout gets the text as it is generated, stderr a summary\n"
               "(prefill and decode speed, time to first token, the KV cache bill).\n");
    cli_print_options(f, run_tab);
    fprintf(f, "Defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05, --repeat-penalty 1,\n"
               "--repeat-last-n 64, --kv-type f16, -c min(training context, 4096), a random seed.\n"
               "Without -p/-f the prompt is empty (generation starts at BOS).\n");
}
static void logits_help(FILE *f) {
    fprintf(f, "usage: kvpin logits [options] (-p TEXT | -f FILE | --tokens IDS) -o OUT.f32\n"
               "Runs the prompt in one batch and writes float32 little-endian logits for every\n"
               "position ([n_tokens][n_vocab]) to OUT; prints the token ids on stdout.\n");
    cli_print_options(f, logits_tab);
    fprintf(f, "Defaults: --kv-type f32, -c the prompt's length when it exceeds min(training context, 4096).\n");
}
static void inspect_help(FILE *f) {
    fprintf(f, "usage: kvpin inspect [options] (-p TEXT | -f FILE)\n"
               "Shows prefill writing the KV cache and each decode step appending to it: the\n"
               "cache length and the attention of the newest position over every cached\n"
               "position for one layer and query head.\n");
    cli_print_options(f, inspect_tab);
    fprintf(f, "Defaults: -n 8, greedy (--temp 0), --kv-type f16, -c min(training context, 4096).\n");
}

static void run_usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "run")) run_help(f);
    else if (!strcmp(cmd, "logits")) logits_help(f);
    else inspect_help(f);
}

static int parse_run_opts(int argc, char **argv, const char *cmd, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->so.kv_type = strcmp(cmd, "logits") ? KP_DTYPE_F16 : KP_DTYPE_F32;
    o->so.kv_type_v = o->so.kv_type;
    o->n_predict = strcmp(cmd, "inspect") ? 128 : 8;
    o->sp = kp_sampler_defaults();
    if (!strcmp(cmd, "inspect")) o->sp.temp = 0;
    o->layer = -1;
    bool logits = !strcmp(cmd, "logits"), inspect = !strcmp(cmd, "inspect");
    cli_args a;
    const cli_opt *tab = logits ? logits_tab : inspect ? inspect_tab : run_tab;
    cli_args_init(&a, cmd, tab, logits ? logits_help : inspect ? inspect_help : run_help, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        const char *v = a.val;
        int64_t n;
        switch (k) {
        case CLI_STOP: return a.rc;
        case O_PROMPT_CACHE: break; /* not seen here: cmd_run sends it to cache.c */
        case CLI_NO_BOS: o->no_bos = true; break;
        case CLI_SPECIAL: o->special = true; break;
        case CLI_PRINT_TOKENS: o->print_tokens = true; break;
        case CLI_SCALAR: o->so.scalar = true; break;
        case CLI_NO_REPACK: o->so.no_repack = true; break;
        case CLI_ATTN_PRECISION: if (!cli_parse_attn(v, &o->so.attn)) return 2; break;
        case CLI_MODEL: o->so.model_path = v; break;
        case CLI_PROMPT: o->prompt = v; break;
        case CLI_FILE: o->prompt_file = v; break;
        case O_TOKENS: o->tokens = v; break;
        case O_OUTPUT: o->out = v; break;
        case O_HTML: o->html = v; break;
        case O_STOP:
            if (o->n_stops == MAX_STOPS || !*v) {
                fprintf(stderr, "kvpin %s: at most %d non-empty --stop strings\n", cmd, MAX_STOPS);
                return 2;
            }
            o->stops[o->n_stops++] = v;
            break;
        case CLI_N_PREDICT:
            if (!cli_args_int(&a, &o->n_predict)) return 2;
            break;
        case CLI_THREADS:
            if (!cli_args_int(&a, &n)) return 2;
            o->so.n_threads = (int)n;
            break;
        case CLI_CTX_SIZE:
            if (!cli_args_int(&a, &n)) return 2;
            o->so.n_ctx = (uint32_t)n;
            break;
        case CLI_KV_TYPE:
        case CLI_KV_TYPE_K:
        case CLI_KV_TYPE_V:
            if (!cli_parse_kv_opt(k, v, &o->so.kv_type, &o->so.kv_type_v)) return 2;
            break;
        case O_LAYER:
            if (!cli_parse_i64(a.opt, v, 0, 1 << 20, &o->layer)) return 2;
            break;
        case O_HEAD:
            if (!cli_parse_i64(a.opt, v, 0, 1 << 20, &o->head)) return 2;
            break;
        default: /* the sampling options (the tables hold nothing else) */
            if (cli_parse_sampler_opt(&a, &o->sp, &o->seed_set) <= 0) return 2;
        }
    }
    if (!cli_args_no_operands(&a)) return 2;
    if (o->prompt && o->prompt_file) {
        fprintf(stderr, "kvpin %s: give -p or -f, not both\n", cmd);
        return 2;
    }
    kp_error err = {0};
    if (kp_sampler_check(&o->sp, &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        return 2;
    }
    if (!o->seed_set) o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return -1; /* go on */
}

/* The prompt of o: --tokens as given, a text (-p, -f, or none: empty) as
 * the library tokenizes a prompt (kp_tokenize_prompt: an empty one starts
 * from BOS); prints errors. */
static bool prompt_tokens(const cli_model *cm, const run_opts *o, const char *cmd, int32_t **ids, size_t *n) {
    const kp_tok_vocab *voc = cm->tok;
    *ids = NULL;
    *n = 0;
    if (o->tokens) {
        size_t cap = 16;
        *ids = malloc(cap * sizeof(int32_t));
        const char *p = o->tokens;
        while (*ids && *p) {
            char *end;
            while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') p++;
            if (!*p) break;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= kp_tok_n_vocab(voc)) {
                fprintf(stderr, "kvpin %s: bad token id in --tokens near '%.16s' (vocabulary of %d)\n",
                        cmd, p, kp_tok_n_vocab(voc));
                free(*ids);
                *ids = NULL;
                return false;
            }
            if (!kp_grow((void **)ids, &cap, *n + 1, sizeof **ids)) break;
            (*ids)[(*n)++] = (int32_t)v;
            p = end;
        }
        if (!*ids) fprintf(stderr, "kvpin %s: out of memory\n", cmd);
        return *ids != NULL;
    }
    char *text = NULL;
    size_t len = 0;
    if (o->prompt_file) {
        text = cli_read_all(o->prompt_file, &len);
        if (!text) return false;
    }
    const char *t = text ? text : o->prompt ? o->prompt : "";
    if (!text) len = strlen(t);
    kp_err err;
    kp_rc rc = kp_tokenize_prompt(cm->lm, t, len, !o->no_bos, o->special, ids, n, &err);
    free(text);
    if (rc != KP_RC_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        return false;
    }
    return true;
}

/* What the hooks of kp_eng_generate need. */
typedef struct {
    bool inspect;
    kp_engine *e;
    const kp_eng_seq *seq;
    const kp_tok_vocab *v;
    const kp_hparams *hp;
    const int32_t *ids;
    size_t n_prompt;
    int layer, head;
    double t0, t_prefill, t_first, t_decode0;
    bool first;
    cli_heat *heat; /* --html: every step's weights, or NULL */
} gen_ctx;

static void on_prefill(void *vc, const kp_eng_report *r) {
    (void)r;
    gen_ctx *c = vc;
    c->t_prefill = cli_now() - c->t0;
    if (c->inspect) {
        int32_t np;
        const float *pr = kp_eng_attn_probe(c->e, &np);
        printf("prefill: %zu prompt tokens in one batch -> K/V written for positions 0..%zu; cache length %u\n",
               c->n_prompt, c->n_prompt - 1, kp_eng_seq_len(c->seq));
        printf("  attention of position %zu (layer %d, head %d, kv-head %d) over the cache:\n", c->n_prompt - 1,
               c->layer, c->head, c->head / (int)(c->hp->n_head / c->hp->n_head_kv));
        if (c->heat && pr) {
            for (size_t p = 0; p < c->n_prompt; p++) cli_heat_token(c->heat, c->ids[p]);
            cli_heat_row(c->heat, pr, (uint32_t)np);
        }
        for (int32_t p = 0; pr && p < np; p++) {
            size_t pl;
            const char *piece = kp_tok_piece_view(c->v, c->ids[p], true, &pl);
            int bar = (int)(pr[p] * 40 + 0.5f);
            printf("    pos %4d  %-14.*s %6.4f %.*s\n", p, (int)(pl > 14 ? 14 : pl), piece, (double)pr[p], bar,
                   "########################################");
        }
    }
    c->t_decode0 = cli_now();
}

static void on_step(void *vc, const kp_gen_out *o) {
    gen_ctx *c = vc;
    if (o->token >= 0 && c->first) {
        c->t_first = cli_now() - c->t0;
        c->first = false;
    }
    if (!c->inspect && o->len > 0) {
        fwrite(o->text, 1, o->len, stdout);
        if (o->finish == KP_FINISH_NONE) fflush(stdout);
    }
}

static void on_decode(void *vc, int32_t tok, uint32_t seq_len) {
    gen_ctx *c = vc;
    if (!c->inspect) return;
    int32_t np;
    const float *pr = kp_eng_attn_probe(c->e, &np);
    size_t pl;
    const char *piece = kp_tok_piece_view(c->v, tok, true, &pl);
    if (c->heat && pr) {
        cli_heat_token(c->heat, tok);
        cli_heat_row(c->heat, pr, (uint32_t)np);
    }
    printf("decode: token %d '%.*s' at position %u -> appended 1 K/V row per layer and kv-head;"
           " cache length %u\n", tok, (int)pl, piece, seq_len - 1, seq_len);
    printf("  attention of position %u over the cache:", seq_len - 1);
    for (int32_t p = 0; pr && p < np; p++) printf("%s%.3f", p % 12 ? " " : "\n    ", (double)pr[p]);
    printf("\n");
}

/* Prefills ids[0..n - 1) into the empty seq in slices, redrawing a bar on
 * stderr after each, and clears the bar; kp_eng_generate then appends the
 * last token (and computes its logits). False with *err on failure (seq
 * is then released). */
static bool prefill_with_bar(kp_engine *e, kp_eng_seq *seq, const int32_t *ids, size_t n, kp_error *err) {
    size_t done = 0, upto = n - 1;
    double t0 = cli_now();
    while (done < upto) {
        uint32_t m = (uint32_t)(upto - done < PROGRESS_SLICE ? upto - done : PROGRESS_SLICE);
        kp_status st = done == 0 ? kp_eng_prefill(e, ids, m, seq, NULL, NULL, err)
                                 : kp_eng_append(e, seq, ids + done, m, PROGRESS_SLICE, NULL, err);
        if (st != KP_OK) {
            fprintf(stderr, "\r\033[K");
            kp_eng_seq_abort(e, seq);
            return false;
        }
        done += m;
        int width = 40, fill = (int)(width * done / n);
        double dt = cli_now() - t0;
        fprintf(stderr, "\rprefill [%.*s%*s] %zu/%zu tokens, %.0f tok/s", fill,
                "########################################", width - fill, "", done, n, dt > 0 ? done / dt : 0.0);
        fflush(stderr);
    }
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    return true;
}

static int do_generate(int argc, char **argv, bool inspect) {
    const char *cmd = inspect ? "inspect" : "run";
    run_opts o;
    int rc = parse_run_opts(argc, argv, cmd, &o);
    if (rc >= 0) return rc;
    if (inspect && !o.prompt && !o.prompt_file) {
        run_usage(stderr, cmd);
        return 2;
    }
    cli_model cm;
    if (!cli_model_open(&cm, &o.so, cmd)) return 1;
    const kp_hparams *hp = &cm.m->hp;
    int layer = o.layer < 0 ? (int)hp->n_layer - 1 : (int)o.layer;
    if (inspect && (layer >= (int)hp->n_layer || o.head >= hp->n_head)) {
        fprintf(stderr, "kvpin inspect: the model has %u layers and %u heads\n", hp->n_layer, hp->n_head);
        cli_model_close(&cm);
        return 2;
    }
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    kp_engine *e = NULL;
    kp_gen *g = NULL;
    kp_eng_seq seq = {0};
    kp_error err = {0};
    cli_heat heat = {0};
    rc = 1;
    if (!prompt_tokens(&cm, &o, cmd, &ids, &n_prompt)) goto done;
    if (n_prompt > cm.n_ctx) {
        fprintf(stderr, "kvpin %s: the prompt has %zu tokens, more than the context of %u (use -c/--ctx-size)\n",
                cmd, n_prompt, cm.n_ctx);
        goto done;
    }
    /* one sequence, no prefix cache: a pool of exactly the context */
    kp_eng_config ec = {o.so.kv_type, 16, 0, cm.n_ctx, true, NULL, o.so.kv_type_v, o.so.no_repack, 0, 0};
    uint32_t n_predict = (uint32_t)o.n_predict;
    kp_gen_params gp = {o.sp, n_predict, cm.n_ctx, (int32_t)hp->n_vocab, false, o.stops, o.n_stops, o.special};
    if (kp_eng_new(&e, cm.m, cm.pool, cm.kernels, &ec, &err) != KP_OK ||
        kp_eng_set_attn(e, o.so.attn, &err) != KP_OK ||
        kp_gen_new(&g, cm.tok, ids, (uint32_t)n_prompt, &gp, &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        goto done;
    }
    if (inspect) kp_eng_set_attn_probe(e, layer, (int)o.head);
    gen_ctx c = {inspect, e, &seq, cm.tok, hp, ids, n_prompt, layer, (int)o.head, cli_now(), 0, 0, 0, true,
                 inspect && o.html ? &heat : NULL};
    c.t_decode0 = c.t0;
    kp_eng_gen_opts go = {&c, on_prefill, on_step, on_decode, EVAL_BATCH, false};
    if (!inspect && n_prompt > PROGRESS_MIN && isatty(STDERR_FILENO) && !prefill_with_bar(e, &seq, ids, n_prompt, &err)) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        goto done;
    }
    if (kp_eng_generate(e, &seq, g, &go, NULL, &err) != KP_OK) {
        fflush(stdout);
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        goto done;
    }
    if (!inspect) putchar('\n');
    fflush(stdout);
    if (c.heat) {
        const char *mp = o.so.model_path ? o.so.model_path : cli_default_model(), *sl = strrchr(mp, '/');
        bool wrote = cli_heat_write(&heat, o.html, cm.tok, sl ? sl + 1 : mp, layer, (int)o.head,
                                    (int)o.head / (int)(hp->n_head / hp->n_head_kv), (uint32_t)n_prompt);
        if (!wrote) goto done;
    }
    double t_decode = cli_now() - c.t_decode0;
    uint32_t n_gen = kp_gen_n_generated(g), n_pos = kp_eng_seq_len(&seq);
    const char *reason = kp_gen_cause_name(kp_gen_cause_of(g));
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    uint64_t per = st.bytes_per_token, used_blocks = st.used_bytes / st.block_bytes;
    char b1[32], b2[32];
    if (o.print_tokens) {
        const int32_t *gen = kp_gen_tokens(g) + n_prompt;
        fprintf(stderr, "tokens:");
        for (uint32_t i = 0; i < n_gen; i++) fprintf(stderr, " %d", gen[i]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "prompt: %zu tokens, prefill %.1f ms (%.1f tok/s), time to first token %.1f ms\n",
            n_prompt, c.t_prefill * 1e3, n_prompt / (c.t_prefill > 0 ? c.t_prefill : 1e-9), c.t_first * 1e3);
    fprintf(stderr, "generated: %u tokens, decode %.1f tok/s, stopped by %s (seed %llu)\n", n_gen,
            n_gen > 1 ? (n_gen - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0, reason,
            (unsigned long long)o.sp.seed);
    char kvf[96];
    if (st.kv_type == st.kv_type_v && (st.kv_type == KP_DTYPE_F16 || st.kv_type == KP_DTYPE_F32))
        snprintf(kvf, sizeof kvf, "2 x %u layers x %u kv-heads x %u head_dim x %zu", hp->n_kv_layer, hp->n_head_kv,
                 hp->head_dim, kp_dtype_row_size(st.kv_type, 1));
    else /* the quantized and mixed types: the formula with their block sizes */
        cli_kv_formula(hp, st.kv_type, st.kv_type_v, kvf, sizeof kvf);
    fprintf(stderr, "KV cache: %u positions x %llu bytes (%s) = %s;"
            " %u blocks of %u positions hold %s\n",
            n_pos, (unsigned long long)per, kvf, cli_bytes(per * n_pos, b1, sizeof b1), (unsigned)used_blocks,
            st.block_size, cli_bytes(st.used_bytes, b2, sizeof b2));
    uint64_t rss = cli_peak_rss();
    if (rss) {
        char b3[32], b4[32];
        char b5[32];
        uint64_t known = cm.m->weight_bytes + st.used_bytes + st.packed_weight_bytes;
        if (st.packed_weight_bytes) /* the mapped file's pages and the repacked copies both count */
            fprintf(stderr,
                    "memory: peak RSS %s = weights %s (mapped) + %s repacked at load + KV blocks %s + other %s\n",
                    cli_bytes(rss, b1, sizeof b1), cli_bytes(cm.m->weight_bytes, b2, sizeof b2),
                    cli_bytes(st.packed_weight_bytes, b5, sizeof b5), cli_bytes(st.used_bytes, b3, sizeof b3),
                    rss > known ? cli_bytes(rss - known, b4, sizeof b4) : "0 B");
        else
            fprintf(stderr, "memory: peak RSS %s = weights %s (mapped, used in place) + KV blocks %s + other %s\n",
                    cli_bytes(rss, b1, sizeof b1), cli_bytes(cm.m->weight_bytes, b2, sizeof b2),
                    cli_bytes(st.used_bytes, b3, sizeof b3),
                    rss > known ? cli_bytes(rss - known, b4, sizeof b4) : "0 B");
    }
    rc = 0;
done:
    if (e) kp_eng_seq_abort(e, &seq);
    cli_heat_free(&heat);
    kp_gen_free(g);
    kp_eng_free(e);
    free(ids);
    cli_model_close(&cm);
    return rc;
}

int cmd_run(int argc, char **argv) {
    int crc = cli_llama_compat("run", &argc, argv, run_tab); /* llama-cli's spellings, before any getopt pass */
    if (crc) return crc;
    if (cli_cache_wanted(argc, argv)) return cmd_run_cached(argc, argv); /* cache.c */
    return do_generate(argc, argv, false);
}
int cmd_inspect(int argc, char **argv) { return do_generate(argc, argv, true); }

int cmd_logits(int argc, char **argv) {
    run_opts o;
    int rc = parse_run_opts(argc, argv, "logits", &o);
    if (rc >= 0) return rc;
    if (!o.out || (!o.prompt && !o.prompt_file && !o.tokens)) {
        run_usage(stderr, "logits");
        return 2;
    }
    cli_model cm;
    int32_t *ids = NULL;
    size_t n = 0;
    float *all = NULL;
    FILE *f = NULL;
    kp_engine *e = NULL;
    kp_eng_seq seq = {0};
    kp_error err = {0};
    rc = 1;
    bool ctx_given = o.so.n_ctx != 0;
    if (!cli_model_open(&cm, &o.so, "logits")) return 1;
    if (!prompt_tokens(&cm, &o, "logits", &ids, &n)) goto done;
    uint32_t nv = cm.m->hp.n_vocab;
    all = malloc(n * nv * sizeof(float));
    if (!all) {
        fprintf(stderr, "kvpin logits: out of memory for %zu x %u logits\n", n, nv);
        goto done;
    }
    if (n > cm.n_ctx) {
        if (ctx_given) {
            fprintf(stderr, "kvpin logits: %zu tokens exceed the context of %u\n", n, cm.n_ctx);
            goto done;
        }
        cm.n_ctx = (uint32_t)n; /* exactly the prompt */
    }
    kp_eng_config ec = {o.so.kv_type, 16, 0, cm.n_ctx, true, NULL, o.so.kv_type_v, o.so.no_repack, 0, 0};
    if (kp_eng_new(&e, cm.m, cm.pool, cm.kernels, &ec, &err) != KP_OK ||
        kp_eng_set_attn(e, o.so.attn, &err) != KP_OK) {
        fprintf(stderr, "kvpin logits: %s\n", err.msg);
        goto done;
    }
    for (size_t i = 0; i < n; i += EVAL_BATCH) {
        uint32_t m = n - i < EVAL_BATCH ? (uint32_t)(n - i) : EVAL_BATCH;
        kp_eng_item it = {&seq, ids + i, m, all + i * nv, KP_OK, {0}, true};
        kp_status st = kp_eng_step(e, &it, 1, &err);
        if (st != KP_OK || it.status != KP_OK) {
            fprintf(stderr, "kvpin logits: %s\n", st != KP_OK ? err.msg : it.err.msg);
            goto done;
        }
    }
    f = fopen(o.out, "wb");
    if (!f || fwrite(all, sizeof(float), n * nv, f) != n * nv || fclose(f) != 0) {
        fprintf(stderr, "kvpin logits: cannot write %s\n", o.out);
        f = NULL;
        goto done;
    }
    f = NULL;
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    printf("\n");
    rc = 0;
done:
    if (e) kp_eng_seq_abort(e, &seq);
    kp_eng_free(e);
    free(all);
    free(ids);
    cli_model_close(&cm);
    return rc;
}
