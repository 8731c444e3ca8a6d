/*
 * run.c - `kvpin run`, `kvpin logits`, `kvpin inspect`: one sequence through
 * the model.
 *
 * run: prefill the prompt in one batched pass (the KV of every prompt
 * position is written), then decode one token at a time (each step appends
 * one K/V row per layer and kv-head), streaming text to stdout as whole
 * UTF-8 characters; a summary goes to stderr.
 * logits: the prompt in one batch with logits for every position, written
 * as float32 [n_tokens][n_vocab].
 * inspect: run's loop, printing the cache length and the newest position's
 * attention over every cached position for one layer and head.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "model/sampler.h"
#include "session.h"
#include "tok/textout.h"

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
} run_opts;

enum { O_STOP = CLI_OWN, O_TOKENS, O_OUTPUT, O_LAYER, O_HEAD, O_PROMPT_CACHE };

static const cli_opt run_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE), CLI_USE(CLI_N_PREDICT), CLI_SAMPLING_OPTS,
    {"stop", NULL, NULL, "STR", "end the text before STR (repeatable, at most 16)", O_STOP},
    CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_NO_BOS), CLI_USE(CLI_SPECIAL),
    CLI_USE(CLI_PRINT_TOKENS), CLI_USE(CLI_SCALAR),
    /* cmd_run hands these to cache.c before run's parser sees them */
    {"prompt-cache", NULL, NULL, NULL, "several prompts through one prefix cache: -p/-f repeated, or\n"
                                       "--turns FILE.jsonl (see kvpin run --prompt-cache --help)", O_PROMPT_CACHE},
    {0},
};
static const cli_opt logits_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE),
    {"tokens", NULL, NULL, "IDS", "the prompt as token ids, \"1 2 3\" (instead of -p or -f)", O_TOKENS},
    {"output", "o", NULL, "FILE", "write the logits to FILE", O_OUTPUT},
    CLI_USE(CLI_NO_BOS), CLI_USE(CLI_SPECIAL), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE),
    CLI_USE(CLI_SCALAR), {0},
};
static const cli_opt inspect_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE), CLI_USE(CLI_N_PREDICT),
    {"layer", NULL, NULL, "L", "the layer whose attention is shown (default: the last)", O_LAYER},
    {"head", NULL, NULL, "H", "the query head whose attention is shown (default: 0)", O_HEAD},
    CLI_SAMPLING_OPTS, CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_NO_BOS),
    CLI_USE(CLI_SPECIAL), CLI_USE(CLI_PRINT_TOKENS), CLI_USE(CLI_SCALAR), {0},
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
    o->n_predict = strcmp(cmd, "inspect") ? 128 : 8;
    o->sp = kp_sampler_defaults();
    if (!strcmp(cmd, "inspect")) o->sp.temp = 0;
    o->layer = -1;
    bool logits = !strcmp(cmd, "logits"), inspect = !strcmp(cmd, "inspect");
    cli_args a;
    cli_args_init(&a, cmd, logits ? logits_tab : inspect ? inspect_tab : run_tab,
                  logits ? logits_help : inspect ? inspect_help : run_help, argc, argv);
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
        case CLI_MODEL: o->so.model_path = v; break;
        case CLI_PROMPT: o->prompt = v; break;
        case CLI_FILE: o->prompt_file = v; break;
        case O_TOKENS: o->tokens = v; break;
        case O_OUTPUT: o->out = v; break;
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
            if (!cli_parse_kv_type(v, &o->so.kv_type)) return 2;
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

/* Tokenizes the prompt of o (text or --tokens); prints errors. */
static bool prompt_tokens(cli_session *s, const run_opts *o, const char *cmd, int32_t **ids,
                          size_t *n) {
    kp_error err = {0};
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
            if (end == p || v < 0 || v >= kp_tok_n_vocab(s->tok)) {
                fprintf(stderr, "kvpin %s: bad token id in --tokens near '%.16s' (vocabulary of %d)\n",
                        cmd, p, kp_tok_n_vocab(s->tok));
                free(*ids);
                *ids = NULL;
                return false;
            }
            if (*n == cap) {
                int32_t *ni = realloc(*ids, cap * 2 * sizeof(int32_t));
                if (!ni) break;
                *ids = ni;
                cap *= 2;
            }
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
    kp_status st = kp_tok_encode(s->tok, t, len, !o->no_bos, o->special, ids, n, &err);
    free(text);
    if (st != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        return false;
    }
    if (*n == 0) { /* empty prompt and no BOS: start from BOS anyway if there is one */
        if (kp_tok_bos(s->tok) < 0) {
            fprintf(stderr, "kvpin %s: the prompt is empty and the model has no BOS token\n", cmd);
            return false;
        }
        free(*ids);
        *ids = malloc(sizeof(int32_t));
        if (!*ids) return false;
        (*ids)[0] = kp_tok_bos(s->tok);
        *n = 1;
    }
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
    cli_session s;
    if (!cli_session_open(&s, &o.so, cmd)) return 1;
    const kp_hparams *hp = &s.m->hp;
    int layer = o.layer < 0 ? (int)hp->n_layer - 1 : (int)o.layer;
    if (inspect && (layer >= (int)hp->n_layer || o.head >= hp->n_head)) {
        fprintf(stderr, "kvpin inspect: the model has %u layers and %u heads\n", hp->n_layer, hp->n_head);
        cli_session_close(&s);
        return 2;
    }
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    kp_sampler *smp = NULL;
    kp_textout *to = NULL;
    float *logits = malloc(hp->n_vocab * sizeof(float));
    int32_t *gen = malloc(((size_t)o.n_predict + 1) * sizeof(int32_t));
    kp_error err = {0};
    rc = 1;
    if (!logits || !gen) goto done;
    if (!prompt_tokens(&s, &o, cmd, &ids, &n_prompt)) goto done;
    if (n_prompt > s.n_ctx) {
        fprintf(stderr, "kvpin %s: the prompt has %zu tokens, more than the context of %u (use --ctx)\n",
                cmd, n_prompt, s.n_ctx);
        goto done;
    }
    if (kp_sampler_new(&smp, &o.sp, (int32_t)hp->n_vocab, &err) != KP_OK ||
        kp_textout_new(&to, s.tok, o.stops, o.n_stops, o.special,
                       /* drop the SPM leading space when generation starts right after BOS */
                       n_prompt == 1 && ids[0] == kp_tok_bos(s.tok) && kp_tok_add_space_prefix(s.tok),
                       &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++) kp_sampler_accept(smp, ids[i]);
    if (inspect) kp_forward_set_probe(s.fw, layer, (int)o.head);
    double t0 = cli_now();
    if (!cli_session_eval(&s, ids, (int32_t)n_prompt, NULL, logits, cmd)) goto done;
    double t_prefill = cli_now() - t0, t_first = 0;
    if (inspect) {
        int32_t np;
        const float *pr = kp_forward_probe(s.fw, &np);
        printf("prefill: %zu prompt tokens in one batch -> K/V written for positions 0..%zu; cache length %u\n",
               n_prompt, n_prompt - 1, s.seq.n_pos);
        printf("  attention of position %zu (layer %d, head %d, kv-head %d) over the cache:\n",
               n_prompt - 1, layer, (int)o.head, (int)(o.head / (hp->n_head / hp->n_head_kv)));
        for (int32_t p = 0; pr && p < np; p++) {
            size_t pl;
            const char *piece = kp_tok_piece_view(s.tok, ids[p], true, &pl);
            int bar = (int)(pr[p] * 40 + 0.5f);
            printf("    pos %4d  %-14.*s %6.4f %.*s\n", p, (int)(pl > 14 ? 14 : pl), piece, (double)pr[p],
                   bar, "########################################");
        }
    }
    int64_t n_gen = 0;
    bool stopped = false;
    const char *reason = "length";
    double t_decode0 = cli_now();
    while (n_gen < o.n_predict) {
        int32_t tok = kp_sampler_sample(smp, logits);
        if (n_gen == 0) t_first = cli_now() - t0;
        gen[n_gen++] = tok;
        kp_sampler_accept(smp, tok);
        if (kp_tok_is_eog(s.tok, tok)) {
            reason = "end of generation token";
            break;
        }
        if (!inspect) {
            const char *text;
            size_t nt;
            bool hit;
            if (kp_textout_push(to, tok, &text, &nt, &hit, &err) != KP_OK) {
                fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
                goto done;
            }
            if (nt > 0) {
                fwrite(text, 1, nt, stdout);
                fflush(stdout);
            }
            if (hit) {
                stopped = true;
                reason = "stop string";
                break;
            }
        }
        if (n_gen == o.n_predict) break;
        if (s.seq.n_pos >= s.n_ctx) {
            reason = "context full";
            break;
        }
        if (!cli_session_eval(&s, &tok, 1, NULL, logits, cmd)) goto done;
        if (inspect) {
            int32_t np;
            const float *pr = kp_forward_probe(s.fw, &np);
            size_t pl;
            const char *piece = kp_tok_piece_view(s.tok, tok, true, &pl);
            printf("decode: token %d '%.*s' at position %u -> appended 1 K/V row per layer and kv-head;"
                   " cache length %u\n", tok, (int)pl, piece, s.seq.n_pos - 1, s.seq.n_pos);
            printf("  attention of position %u over the cache:", s.seq.n_pos - 1);
            for (int32_t p = 0; pr && p < np; p++) printf("%s%.3f", p % 12 ? " " : "\n    ", (double)pr[p]);
            printf("\n");
        }
    }
    if (!stopped && !inspect) {
        const char *text;
        size_t nt;
        kp_textout_finish(to, &text, &nt);
        if (nt > 0) fwrite(text, 1, nt, stdout);
    }
    if (!inspect) putchar('\n');
    fflush(stdout);
    double t_decode = cli_now() - t_decode0;
    uint64_t per = kp_model_kv_bytes_per_token(hp, s.kv_type);
    uint32_t used_blocks = kp_kvpool_n_blocks(s.kv) - kp_kvpool_n_free(s.kv);
    char b1[32], b2[32];
    if (o.print_tokens) {
        fprintf(stderr, "tokens:");
        for (int64_t i = 0; i < n_gen; i++) fprintf(stderr, " %d", gen[i]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "prompt: %zu tokens, prefill %.1f ms (%.1f tok/s), time to first token %.1f ms\n",
            n_prompt, t_prefill * 1e3, n_prompt / (t_prefill > 0 ? t_prefill : 1e-9), t_first * 1e3);
    fprintf(stderr, "generated: %lld tokens, decode %.1f tok/s, stopped by %s (seed %llu)\n",
            (long long)n_gen, n_gen > 1 ? (n_gen - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0,
            reason, (unsigned long long)o.sp.seed);
    fprintf(stderr, "KV cache: %u positions x %llu bytes (2 x %u layers x %u kv-heads x %u head_dim x %zu) = %s;"
            " %u blocks of %u positions hold %s\n",
            s.seq.n_pos, (unsigned long long)per, hp->n_layer, hp->n_head_kv, hp->head_dim,
            kp_dtype_row_size(s.kv_type, 1), cli_bytes(per * s.seq.n_pos, b1, sizeof b1), used_blocks,
            kp_kvpool_config_of(s.kv)->block_size,
            cli_bytes(used_blocks * kp_kvpool_block_bytes(s.kv), b2, sizeof b2));
    uint64_t rss = cli_peak_rss(), kv_bytes = used_blocks * kp_kvpool_block_bytes(s.kv);
    if (rss) {
        char b3[32], b4[32];
        uint64_t known = s.m->weight_bytes + kv_bytes;
        fprintf(stderr, "memory: peak RSS %s = weights %s (mapped, used in place) + KV blocks %s + other %s\n",
                cli_bytes(rss, b1, sizeof b1), cli_bytes(s.m->weight_bytes, b2, sizeof b2),
                cli_bytes(kv_bytes, b3, sizeof b3),
                rss > known ? cli_bytes(rss - known, b4, sizeof b4) : "0 B");
    }
    rc = 0;
done:
    kp_textout_free(to);
    kp_sampler_free(smp);
    free(ids);
    free(gen);
    free(logits);
    cli_session_close(&s);
    return rc;
}

int cmd_run(int argc, char **argv) {
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
    cli_session s;
    int32_t *ids = NULL;
    size_t n = 0;
    float *all = NULL;
    FILE *f = NULL;
    rc = 1;
    bool ctx_given = o.so.n_ctx != 0;
    if (!cli_session_open(&s, &o.so, "logits")) return 1;
    if (!prompt_tokens(&s, &o, "logits", &ids, &n)) goto done;
    uint32_t nv = s.m->hp.n_vocab;
    all = malloc(n * nv * sizeof(float));
    if (!all) {
        fprintf(stderr, "kvpin logits: out of memory for %zu x %u logits\n", n, nv);
        goto done;
    }
    if (n > s.n_ctx) {
        if (ctx_given) {
            fprintf(stderr, "kvpin logits: %zu tokens exceed the context of %u\n", n, s.n_ctx);
            goto done;
        }
        if (!cli_session_set_ctx(&s, (uint32_t)n, "logits")) goto done; /* exactly the prompt */
    }
    if (!cli_session_eval(&s, ids, (int32_t)n, all, NULL, "logits")) goto done;
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
    free(all);
    free(ids);
    cli_session_close(&s);
    return rc;
}
