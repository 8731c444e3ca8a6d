/*
 * cache.c - `kvpin run --prompt-cache` (several prompts through one engine
 * whose prefix cache carries K/V from turn to turn) and `kvpin doctor`
 * (offline: where each prompt of a log diverged from the earlier ones, and
 * why).
 *
 * Turns come from `-f FILE` given several times, `-p TEXT` given several
 * times, or `--turns FILE.jsonl` (one JSON object per line, {"prompt": "..."};
 * blank lines are skipped). run tokenizes every prompt as the library does
 * (kp_tokenize_prompt, kvpin.h: an empty one starts from BOS), then per turn:
 *
 *   prompt   -> kp_eng_generate: prefill (reuse the cached prefix, compute
 *               the rest), then up to -n tokens (greedy unless --temp; the
 *               kp_gen applies --stop strings and the limits; every
 *               generated token but an end-of-generation one is decoded,
 *               so the cache holds prompt + answer)
 *            -> kp_cachereport_finish (index prompt + answer; no kp_cachereport history:
 *               the report compares against the turns themselves)
 *   stdout: the generated text of the turn and a newline (as `kvpin run`)
 *   stderr: reused / computed tokens, time to first token, cache report
 *
 * The cached text of the cache report: of the earlier turns (their prompt
 * text followed by their generated text, and the matching tokens), the one
 * with the longest common token prefix with this prompt (ties: the most
 * recent). It is what the index holds along the matched path, without
 * walking the tree. The divergence token is the index's own (kp_eng_report),
 * so an evicted prefix shows as fewer reused tokens and cause "evicted".
 *
 * doctor does the same comparison on prompts alone, with the tokenizer only
 * (no weights are read): every turn against every earlier turn.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "base/buf.h"
#include "engine/cachereport.h"
#include "cache/doctor.h"
#include "engine/engine.h"
#include "engine/gen.h"
#include "serve/chat_tmpl.h"
#include "model/sampler.h"
#include "tok/textout.h"
#include "tok/tok.h"

/* ---- turns ------------------------------------------------------------ */

typedef struct {
    char *text; /* prompt (run: prompt + generated text once finished) */
    size_t len;
    size_t prompt_len;
    int32_t *ids; /* prompt tokens (run: + the generated tokens decoded) */
    size_t n_ids;
    size_t n_prompt;
    bool chat; /* rendered from messages: the template's markup holds control tokens */
} turn;

typedef struct {
    turn *v;
    size_t n, cap;
} turn_list;

static void turns_free(turn_list *t) {
    for (size_t i = 0; i < t->n; i++) {
        free(t->v[i].text);
        free(t->v[i].ids);
    }
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* Takes ownership of text. */
static bool turns_add(turn_list *t, char *text, size_t len) {
    if (!kp_grow((void **)&t->v, &t->cap, t->n + 1, sizeof *t->v)) {
        free(text);
        return false;
    }
    turn *u = &t->v[t->n++];
    memset(u, 0, sizeof *u);
    u->text = text;
    u->len = u->prompt_len = len;
    return true;
}

/* Renders a chat request object (messages, tools, add_generation_prompt,
 * chat_template_kwargs) into *text (malloc'd); false with a message. */
typedef bool (*chat_render_fn)(void *ctx, const json_t *req, char **text, size_t *len, char *msg, size_t msg_size);

/* Reads FILE.jsonl: one {"prompt": "..."} per non-blank line, or with
 * render, a chat request {"messages": [...], ...} (a server's chat log)
 * rendered by it. Prints a message naming the file and line on failure. */
static bool turns_load_jsonl(turn_list *t, const char *path, const char *cmd, chat_render_fn render, void *rctx) {
    size_t len;
    char *buf = cli_read_all(path, &len);
    if (!buf) return false;
    bool ok = true;
    size_t line_no = 0;
    for (char *p = buf; ok && p < buf + len;) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        char *end = nl ? nl : buf + len;
        line_no++;
        char *q = p;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < end) {
            json_error_t je;
            json_t *o = json_loadb(p, (size_t)(end - p), 0, &je);
            json_t *pr = json_is_object(o) ? json_object_get(o, "prompt") : NULL;
            if (!o) {
                fprintf(stderr, "kvpin %s: %s:%zu: invalid JSON: %s\n", cmd, path, line_no, je.text);
                ok = false;
            } else if (!json_is_object(o)) {
                fprintf(stderr, "kvpin %s: %s:%zu: expected a JSON object {\"prompt\": \"...\"}\n", cmd, path,
                        line_no);
                ok = false;
            } else if (!pr && json_object_get(o, "messages") && render) {
                char *s = NULL, msg[300];
                size_t n = 0;
                if (!render(rctx, o, &s, &n, msg, sizeof msg)) {
                    fprintf(stderr, "kvpin %s: %s:%zu: %s\n", cmd, path, line_no, msg);
                    ok = false;
                } else if (!turns_add(t, s, n)) {
                    fprintf(stderr, "kvpin %s: out of memory\n", cmd);
                    ok = false;
                } else {
                    t->v[t->n - 1].chat = true;
                }
            } else if (!json_is_string(pr)) {
                fprintf(stderr, "kvpin %s: %s:%zu: missing \"prompt\" string%s\n", cmd, path, line_no,
                        render ? " (or a chat request's \"messages\")" : "");
                ok = false;
            } else {
                size_t n = json_string_length(pr);
                char *s = malloc(n + 1);
                if (!s || !turns_add(t, s, n)) {
                    if (!s) free(s);
                    fprintf(stderr, "kvpin %s: out of memory\n", cmd);
                    ok = false;
                } else {
                    memcpy(s, json_string_value(pr), n);
                    s[n] = 0;
                }
            }
            json_decref(o);
        }
        p = end + 1;
    }
    free(buf);
    if (ok && t->n == 0) {
        fprintf(stderr, "kvpin %s: %s holds no turns\n", cmd, path);
        ok = false;
    }
    return ok;
}

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* The earlier turn (index < upto) sharing the longest token prefix with
 * ids; ties go to the most recent. -1 when upto is 0. */
static long best_earlier(const turn_list *t, size_t upto, const int32_t *ids, size_t n, size_t *common) {
    long best = -1;
    *common = 0;
    for (size_t j = 0; j < upto; j++) {
        size_t l = lcp(ids, n, t->v[j].ids, t->v[j].n_ids);
        if (best < 0 || l >= *common) {
            best = (long)j;
            *common = l;
        }
    }
    return best;
}

/* First differing byte of a and b, moved back to a UTF-8 character start. */
static size_t text_divergence(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    for (int k = 0; k < 3 && i > 0 && i < nb && ((unsigned char)b[i] & 0xC0) == 0x80; k++) i--;
    return i;
}

/* Explains turn `cur` against the cached turn prev (NULL: nothing cached). */
static kp_status explain(const kp_tok_vocab *v, const turn *cur, const turn *prev, size_t token_index,
                         kp_doctor_cache_state state, bool special, kp_doctor_escape mode, kp_doctor_report *rep,
                         kp_error *err) {
    const char *cached = prev ? prev->text : "";
    size_t cached_len = prev ? prev->len : 0;
    if (state == KP_DOCTOR_CACHE_NOTHING) {
        cached = "";
        cached_len = 0;
    }
    size_t tdiv = text_divergence(cached, cached_len, cur->text, cur->prompt_len);
    bool text = state == KP_DOCTOR_CACHE_TEXT && prev;
    kp_doctor_tokens tk = kp_cachereport_tokens(v, cur->ids, cur->n_prompt, token_index, cur->text, cur->prompt_len,
                                                special, tdiv, text ? prev->ids : NULL, text ? prev->n_ids : 0);
    return kp_doctor_explain(cached, cached_len, cur->text, cur->prompt_len, &tk, state, mode, rep, err);
}

/* ---- kvpin run --prompt-cache ----------------------------------------- */

enum { O_TURNS = CLI_OWN, O_PROMPT_CACHE, O_STOP };

static const cli_opt cache_tab[] = {
    {"prompt-cache", NULL, NULL, NULL, "this mode (implied by several -p/-f, --turns, --no-prefix-cache)",
     O_PROMPT_CACHE},
    CLI_USE(CLI_MODEL), CLI_USE(CLI_PROMPT), CLI_USE(CLI_FILE),
    {"turns", NULL, NULL, "FILE", "the prompts, one JSON object per line: {\"prompt\": \"...\"}", O_TURNS},
    CLI_USE(CLI_N_PREDICT), CLI_SAMPLING_OPTS, CLI_USE(CLI_THREADS), CLI_USE(CLI_CTX_SIZE), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V),
    CLI_USE(CLI_KV_BUDGET), CLI_USE(CLI_WINDOW_BUDGET), CLI_USE(CLI_STATE_EVERY), CLI_USE(CLI_KV_BLOCK), CLI_USE(CLI_NO_PREFIX_CACHE), CLI_USE(CLI_NO_BOS),
    CLI_USE(CLI_SPECIAL), CLI_USE(CLI_PRINT_TOKENS), CLI_USE(CLI_SCALAR), CLI_USE(CLI_NO_REPACK),
    {"stop", NULL, NULL, "STR", "end the text before STR (repeatable, at most 16)", O_STOP},
    CLI_USE(CLI_CACHE_DIR), CLI_USE(CLI_CACHE_DISK_BUDGET),
    {0},
};

static void cache_usage(FILE *f);

/* Scans the arguments with run --prompt-cache's table (a superset of run's),
 * so every spelling counts: -p X, -pX, --prompt=X, --file X, ... */
bool cli_cache_wanted(int argc, char **argv) {
    int n_f = 0, n_p = 0;
    bool cache = false;
    cli_args a;
    cli_args_init(&a, "run", cache_tab, cache_usage, argc, argv);
    a.quiet = true;
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        n_f += k == CLI_FILE;
        n_p += k == CLI_PROMPT;
        cache |= k == O_PROMPT_CACHE || k == O_TURNS || k == CLI_NO_PREFIX_CACHE || k == CLI_CACHE_DIR;
    }
    return cache || n_f > 1 || n_p > 1;
}

static void cache_usage(FILE *f) {
    fprintf(f, "usage: kvpin run --prompt-cache [options] (-f FILE | -p TEXT)... | --turns FILE.jsonl\n"
               "Runs the prompts one after another through one engine: each turn reuses the K/V\n"
               "of what earlier turns computed (prompt + answer) up to its first differing token.\n"
               "Each turn's text goes to stdout followed by a newline; per turn, stderr shows reused\n"
               "and computed tokens, time to first token and where and why the prompt left the cache.\n");
    cli_print_options(f, cache_tab);
    fprintf(f, "Defaults: greedy (--temp 0), -n 128, --kv-type f16, --kv-block 16, -c min(training\n"
               "context, 4096), --kv-budget room for 2 x ctx positions (at most half of RAM).\n");
}

typedef struct {
    const char *model_path;
    const char *turns_file;
    const char *srcs[256]; /* -f FILE / -p TEXT in order */
    bool src_is_file[256];
    int n_srcs;
    int64_t n_predict;
    kp_sampler_params sp;
    bool seed_set;
    const char *stops[KP_TEXTOUT_MAX_STOPS];
    int n_stops;
    int n_threads;
    uint32_t n_ctx;
    kp_dtype kv_type, kv_type_v;
    uint64_t budget;
    uint32_t block;
    bool no_cache, no_bos, special, print_tokens, scalar, no_repack;
    const char *cache_dir;
    uint64_t disk_budget;
    uint64_t window_budget; /* --window-budget (0: none) */
    uint32_t state_every;   /* --state-every (0: the engine's default) */
} cache_opts;

static int parse_cache_opts(int argc, char **argv, cache_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sp = kp_sampler_defaults();
    o->sp.temp = 0;
    o->kv_type = o->kv_type_v = KP_DTYPE_F16;
    o->block = 16;
    cli_args a;
    cli_args_init(&a, "run", cache_tab, cache_usage, argc, argv);
    a.help_cmd = "kvpin run --prompt-cache --help";
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        const char *v = a.val, *opt = a.opt;
        int64_t n;
        switch (k) {
        case CLI_STOP: return a.rc;
        case O_PROMPT_CACHE: break;
        case CLI_NO_PREFIX_CACHE: o->no_cache = true; break;
        case CLI_NO_BOS: o->no_bos = true; break;
        case CLI_SPECIAL: o->special = true; break;
        case CLI_PRINT_TOKENS: o->print_tokens = true; break;
        case CLI_SCALAR: o->scalar = true; break;
        case CLI_NO_REPACK: o->no_repack = true; break;
        case CLI_MODEL: o->model_path = v; break;
        case O_TURNS: o->turns_file = v; break;
        case O_STOP:
            if (o->n_stops == KP_TEXTOUT_MAX_STOPS || !*v) {
                fprintf(stderr, "kvpin run: at most %d non-empty --stop strings\n", KP_TEXTOUT_MAX_STOPS);
                return 2;
            }
            o->stops[o->n_stops++] = v;
            break;
        case CLI_FILE:
        case CLI_PROMPT:
            if (o->n_srcs == 256) {
                fprintf(stderr, "kvpin run: at most 256 -f/-p prompts\n");
                return 2;
            }
            o->src_is_file[o->n_srcs] = k == CLI_FILE;
            o->srcs[o->n_srcs++] = v;
            break;
        case CLI_N_PREDICT:
            if (!cli_args_int(&a, &o->n_predict)) return 2;
            break;
        case CLI_THREADS:
            if (!cli_args_int(&a, &n)) return 2;
            o->n_threads = (int)n;
            break;
        case CLI_CTX_SIZE:
            if (!cli_args_int(&a, &n)) return 2;
            o->n_ctx = (uint32_t)n;
            break;
        case CLI_KV_BLOCK:
            if (!cli_args_int(&a, &n)) return 2;
            o->block = (uint32_t)n;
            break;
        case CLI_CACHE_DIR: o->cache_dir = v; break;
        case CLI_WINDOW_BUDGET:
            if (!cli_parse_bytes(opt, v, &o->window_budget)) return 2;
            break;
        case CLI_STATE_EVERY: {
            int64_t every;
            if (!cli_parse_i64(opt, v, 1, 1 << 24, &every)) return 2;
            o->state_every = (uint32_t)every;
            break;
        }
        case CLI_CACHE_DISK_BUDGET:
            if (!cli_parse_bytes(opt, v, &o->disk_budget)) return 2;
            break;
        case CLI_KV_BUDGET:
            if (!cli_parse_bytes(opt, v, &o->budget)) return 2;
            if (o->budget == 0) {
                fprintf(stderr, "kvpin run: %s 0 leaves no room for the KV cache: leave %s out for the default "
                                "(2 x ctx positions), give a size such as 64M, or use --no-prefix-cache to "
                                "keep nothing cached\n", opt, opt);
                return 2;
            }
            break;
        case CLI_KV_TYPE:
        case CLI_KV_TYPE_K:
        case CLI_KV_TYPE_V:
            if (!cli_parse_kv_opt(k, v, &o->kv_type, &o->kv_type_v)) return 2;
            break;
        default: /* the sampling options (the table holds nothing else) */
            if (cli_parse_sampler_opt(&a, &o->sp, &o->seed_set) <= 0) return 2;
        }
    }
    if (!cli_args_no_operands(&a)) return 2;
    if (o->turns_file && o->n_srcs) {
        fprintf(stderr, "kvpin run: give --turns or -f/-p prompts, not both\n");
        return 2;
    }
    if (!o->turns_file && !o->n_srcs) {
        fprintf(stderr, "kvpin run: --prompt-cache needs prompts (-f FILE / -p TEXT, several times, or --turns FILE.jsonl)\n");
        return 2;
    }
    kp_error err = {0};
    if (kp_sampler_check(&o->sp, &err) != KP_OK) {
        fprintf(stderr, "kvpin run: %s\n", err.msg);
        return 2;
    }
    if (!o->seed_set) o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return -1;
}

static bool load_sources(const cache_opts *o, turn_list *t) {
    if (o->turns_file) return turns_load_jsonl(t, o->turns_file, "run", NULL, NULL);
    for (int i = 0; i < o->n_srcs; i++) {
        size_t len;
        char *s;
        if (o->src_is_file[i]) {
            s = cli_read_all(o->srcs[i], &len);
            if (!s) return false;
        } else {
            len = strlen(o->srcs[i]);
            s = malloc(len + 1);
            if (s) memcpy(s, o->srcs[i], len + 1);
        }
        if (!s || !turns_add(t, s, len)) {
            fprintf(stderr, "kvpin run: out of memory\n");
            return false;
        }
    }
    return true;
}

/* Tokenizes every turn's prompt into ids / n_prompt: run's with the model
 * lm as the library tokenizes a prompt (kp_tokenize_prompt: an empty one
 * becomes [BOS], as in `kvpin run`), doctor's (lm NULL) with the
 * vocabulary v alone, as they are. */
static bool tokenize_turns(const kp_lm *lm, const kp_tok_vocab *v, turn_list *t, bool add_special, bool special,
                           const char *cmd) {
    for (size_t i = 0; i < t->n; i++) {
        turn *u = &t->v[i];
        const char *msg = NULL;
        kp_err lm_err;
        kp_error err = {0};
        if (lm) {
            if (kp_tokenize_prompt(lm, u->text, u->prompt_len, add_special, special, &u->ids, &u->n_ids, &lm_err) !=
                KP_RC_OK)
                msg = lm_err.msg;
        } else if (kp_tok_encode(v, u->text, u->prompt_len, add_special && !u->chat, special || u->chat, &u->ids,
                                 &u->n_ids, &err) != KP_OK) {
            msg = err.msg;
        }
        if (msg) {
            fprintf(stderr, "kvpin %s: turn %zu: %s\n", cmd, i + 1, msg);
            return false;
        }
        u->n_prompt = u->n_ids;
    }
    return true;
}

static void print_report(const turn_list *t, size_t i, const kp_eng_report *r, const kp_tok_vocab *v, bool special) {
    const turn *cur = &t->v[i];
    size_t common;
    long j = best_earlier(t, i, cur->ids, cur->n_prompt, &common);
    kp_doctor_cache_state state = r->evicted ? KP_DOCTOR_CACHE_EVICTED
                               : j < 0 || r->cold ? KP_DOCTOR_CACHE_NOTHING
                                                  : KP_DOCTOR_CACHE_TEXT;
    if (state == KP_DOCTOR_CACHE_EVICTED && j < 0) state = KP_DOCTOR_CACHE_NOTHING;
    kp_doctor_report rep;
    kp_error err = {0};
    if (explain(v, cur, j >= 0 ? &t->v[j] : NULL, r->diverged_at_token, state, special, KP_DOCTOR_ESCAPE_HUMAN, &rep,
                &err) != KP_OK) {
        fprintf(stderr, "  cache report: %s\n", err.msg);
        return;
    }
    char subject[32], advice[512];
    snprintf(subject, sizeof subject, "turn %zu", i + 1);
    fprintf(stderr, "  cache: diverged at token %u of %u, byte %zu (line %zu): %s\n", r->diverged_at_token,
            r->prompt_tokens, rep.div.byte, rep.finding.line, rep.finding.detail);
    if (rep.finding.cause != KP_DOCTOR_CAUSE_COLD) {
        fprintf(stderr, "    cached : %s\n", rep.cached_snippet);
        fprintf(stderr, "    request: %s\n", rep.request_snippet);
    }
    if (r->window_cut_from > r->reused_tokens) { /* a window budget cut the reuse (engine.h) */
        fprintf(stderr,
                "  cache: window_evicted: reuse resumed at token %u of the %u that matched: the sliding-window "
                "layers' K/V before them was dropped (window budget)\n",
                r->reused_tokens, r->window_cut_from);
        kp_doctor_advice(KP_DOCTOR_CAUSE_WINDOW_EVICTED, NULL, 0,
                         100.0 * r->computed_tokens / (r->prompt_tokens ? r->prompt_tokens : 1), subject, advice,
                         sizeof advice);
        fprintf(stderr, "    advice : %s\n", advice);
        return;
    }
    if (rep.finding.cause != KP_DOCTOR_CAUSE_HIT && !(rep.finding.cause == KP_DOCTOR_CAUSE_COLD && i == 0)) {
        kp_doctor_advice(rep.finding.cause, rep.finding.detail, rep.finding.line, rep.div.percent_recomputed, subject,
                      advice, sizeof advice);
        fprintf(stderr, "    advice : %s\n", advice);
    }
}

/* What the hooks of kp_eng_generate need for one turn. */
typedef struct {
    kp_buf text; /* the turn's text, its prompt then the released text: holds
                    u->text's memory while the turn generates */
    double t0, t_first;
    bool first;
} turn_ctx;

/* Each step's released text goes to stdout and after the turn's text. */
static void turn_step(void *vc, const kp_gen_out *o) {
    turn_ctx *c = vc;
    if (o->token >= 0 && c->first) {
        c->t_first = cli_now() - c->t0;
        c->first = false;
    }
    if (!o->len) return;
    fwrite(o->text, 1, o->len, stdout);
    kp_buf_put(&c->text, o->text, o->len); /* a failure sets text.oom */
}

int cmd_run_cached(int argc, char **argv) {
    cache_opts o;
    int rc = parse_cache_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    kp_error err = {0};
    cli_model cm = {0};
    kp_engine *e = NULL;
    kp_gen *g = NULL;
    turn_list t = {0};
    rc = 1;
    if (!load_sources(&o, &t)) goto done;
    cli_session_opts so = {o.model_path, o.n_threads, o.kv_type, o.n_ctx, o.scalar, o.kv_type_v, o.no_repack, KP_ATTN_F32};
    if (!cli_model_open(&cm, &so, "run")) goto done;
    const kp_tok_vocab *v = cm.tok;
    if (!tokenize_turns(cm.lm, v, &t, !o.no_bos, o.special, "run")) goto done;
    const kp_hparams *hp = &cm.m->hp;
    uint32_t n_ctx = o.n_ctx ? o.n_ctx : (hp->n_ctx_train && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    uint64_t per = kp_model_kv_bytes_per_token_kv(hp, o.kv_type, o.kv_type_v);
    /* default: the context plus as much again for cached turns, at most half of RAM */
    uint64_t budget = o.budget ? o.budget : 2 * ((uint64_t)n_ctx + o.block) * per;
    if (!o.budget && !o.no_cache) /* a recurrent model's state snapshots, as many again (engine.h) */
        budget += 2 * kp_eng_state_room(cm.m, o.kv_type, o.kv_type_v, o.block, n_ctx, o.state_every);
    if (!o.budget && cli_half_of_ram() && budget > cli_half_of_ram()) budget = cli_half_of_ram();
    kp_eng_config ec = {o.kv_type, o.block, budget, n_ctx, o.no_cache, NULL, o.kv_type_v, o.no_repack, o.window_budget, o.state_every};
    if (kp_eng_new(&e, cm.m, cm.pool, cm.kernels, &ec, &err) != KP_OK) {
        fprintf(stderr, "kvpin run: %s\n", err.msg);
        goto done;
    }
    if (o.cache_dir) {
        kp_tiers_config tc = {o.cache_dir, o.disk_budget, NULL, 0, NULL, NULL, NULL, 0};
        if (kp_eng_open_tiers(e, &tc, &err) != KP_OK) {
            fprintf(stderr, "kvpin run: %s\n", err.msg);
            goto done;
        }
        if (*kp_eng_tier_note(e)) fprintf(stderr, "kvpin run: disk tier: %s\n", kp_eng_tier_note(e));
    }
    uint64_t total_reused = 0, total_prompt = 0;
    for (size_t i = 0; i < t.n; i++) {
        turn *u = &t.v[i];
        kp_eng_seq s = {0};
        kp_eng_report r;
        kp_gen_params gp = {o.sp,   (uint32_t)o.n_predict, n_ctx, (int32_t)hp->n_vocab, false, o.stops, o.n_stops,
                            o.special};
        if (kp_gen_new(&g, v, u->ids, (uint32_t)u->n_prompt, &gp, &err) != KP_OK) {
            fprintf(stderr, "kvpin run: turn %zu: %s\n", i + 1, err.msg);
            goto done;
        }
        kp_eng_stats st0, st1;
        kp_eng_get_stats(e, &st0);
        turn_ctx c = {{u->text, u->len, u->len + 1, false}, cli_now(), 0, true};
        /* every generated token but an end-of-generation one is decoded: the
         * cache then holds prompt + answer */
        kp_eng_gen_opts go = {&c, NULL, turn_step, NULL, 0, true};
        kp_status st = kp_eng_generate(e, &s, g, &go, &r, &err);
        u->text = c.text.data; /* prompt + answer */
        u->len = c.text.len;
        if (st != KP_OK) {
            fflush(stdout);
            fprintf(stderr, "kvpin run: turn %zu: %s\n", i + 1, err.msg);
            kp_eng_seq_abort(e, &s);
            goto done;
        }
        putchar('\n');
        fflush(stdout);
        /* the turn's tokens as the cache holds them: prompt + decoded answer */
        uint32_t n_ids = kp_eng_seq_len(&s);
        int32_t *ids = realloc(u->ids, (size_t)n_ids * sizeof(int32_t));
        if (!ids || c.text.oom) {
            if (ids) u->ids = ids;
            kp_eng_seq_abort(e, &s);
            fprintf(stderr, "kvpin run: out of memory\n");
            goto done;
        }
        memcpy(ids, kp_gen_tokens(g), (size_t)n_ids * sizeof(int32_t));
        u->ids = ids;
        u->n_ids = n_ids;
        uint32_t added = 0;
        if (kp_cachereport_finish(NULL, e, &s, u->ids, (uint32_t)u->n_ids, &added, &err) != KP_OK)
            fprintf(stderr, "kvpin run: turn %zu: could not index: %s\n", i + 1, err.msg);
        kp_eng_get_stats(e, &st1);
        total_reused += r.reused_tokens;
        total_prompt += u->n_prompt;
        if (o.print_tokens) {
            fprintf(stderr, "tokens:");
            for (size_t k = u->n_prompt; k < u->n_ids; k++) fprintf(stderr, " %d", u->ids[k]);
            fprintf(stderr, "\n");
        }
        fprintf(stderr,
                "turn %zu: %u prompt tokens, %u reused, %u computed, time to first token %.1f ms, "
                "%u generated (stopped by %s)%s\n",
                i + 1, r.prompt_tokens, r.reused_tokens, r.computed_tokens, c.t_first * 1e3, kp_gen_n_generated(g),
                kp_gen_cause_name(kp_gen_cause_of(g)),
                st1.n_evictions > st0.n_evictions ? ", evicted cached prefixes to make room" : "");
        if (st1.n_window_layers) {
            char f1[32], w1[32];
            fprintf(stderr, "turn %zu: the cache holds %s of full-layer rows and %s of window-layer rows",
                    i + 1, cli_bytes(st1.index_full_bytes, f1, sizeof f1),
                    cli_bytes(st1.index_window_bytes, w1, sizeof w1));
            if (r.window_cut_from)
                fprintf(stderr, "; the tokens matched %u, reuse resumed at %u, the latest position whose window "
                                "rows are held",
                        r.window_cut_from, r.reused_tokens);
            fputc('\n', stderr);
        }
        if (r.recurrent && !o.no_cache) { /* state snapshots (engine.h) */
            char sb[32];
            fprintf(stderr, "turn %zu: the cache holds %u state snapshots (%s)", i + 1, st1.n_states,
                    cli_bytes(st1.index_state_bytes, sb, sizeof sb));
            if (r.state_cut_from)
                fprintf(stderr, "; the tokens matched %u, reuse resumed at %u, the latest state snapshot (%u "
                                "computed again)",
                        r.state_cut_from, r.reused_tokens, r.state_recomputed_tokens);
            fputc('\n', stderr);
        }
        if (o.cache_dir && (r.reused_from[KP_TIER_DISK] || r.restore_failed != KP_BLOCKREC_OK))
            fprintf(stderr, "turn %zu: %u tokens restored from disk%s%s\n", i + 1, r.reused_from[KP_TIER_DISK],
                    r.restore_failed != KP_BLOCKREC_OK ? ", restore stopped: " : "",
                    r.restore_failed != KP_BLOCKREC_OK ? kp_blockrec_reason_name(r.restore_failed) : "");
        kp_gen_free(g);
        g = NULL;
        if (!o.no_cache) print_report(&t, i, &r, v, o.special);
    }
    kp_eng_stats st;
    kp_eng_get_stats(e, &st);
    char b1[32], b2[32];
    fprintf(stderr, "prefix cache: %llu of %llu prompt tokens reused; %llu tokens cached in %s of a %s budget",
            (unsigned long long)total_reused, (unsigned long long)total_prompt,
            (unsigned long long)st.cached_tokens, cli_bytes(st.index_bytes, b1, sizeof b1),
            cli_bytes(st.budget_bytes, b2, sizeof b2));
    fprintf(stderr, ", %llu evictions%s\n", (unsigned long long)st.n_evictions, o.no_cache ? " (cache off)" : "");
    rc = 0;
done:
    kp_gen_free(g);
    kp_eng_free(e);
    turns_free(&t);
    cli_model_close(&cm);
    return rc;
}

/* ---- kvpin doctor ------------------------------------------------------ */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* doctor's view of the tiers below RAM (--cache-dir, --cache-redis): an
 * engine over the model with a pool of a few blocks, only to open the
 * tiers under the fingerprint a server with the same options has. */
typedef struct {
    const char *dir, *redis;
    uint32_t redis_timeout;
    kp_dtype kv_type, kv_type_v;
    uint32_t block;
    cli_model cm;
    kp_engine *e;
} doctor_tiers;

static bool doctor_tiers_open(doctor_tiers *d, const char *model) {
    cli_session_opts so = {model, 1, d->kv_type, 0, false, d->kv_type_v, true, KP_ATTN_F32};
    if (!cli_model_open(&d->cm, &so, "doctor")) return false;
    kp_error err = {0};
    uint64_t per = kp_model_kv_bytes_per_token_kv(&d->cm.m->hp, d->kv_type, d->kv_type_v);
    kp_eng_config ec = {d->kv_type, d->block, 4 * (uint64_t)d->block * per, d->block, false, NULL, d->kv_type_v,
                        true, 0, 0};
    kp_tiers_config tc = {d->dir, 0, d->redis, d->redis_timeout, NULL, NULL, NULL, 0};
    if (kp_eng_new(&d->e, d->cm.m, d->cm.pool, d->cm.kernels, &ec, &err) != KP_OK ||
        kp_eng_open_tiers(d->e, &tc, &err) != KP_OK) {
        fprintf(stderr, "kvpin doctor: %s\n", err.msg);
        return false;
    }
    if (d->redis && !kp_eng_tier_wait_ready(d->e, 2000 + 2 * d->redis_timeout)) {
        fprintf(stderr, "kvpin doctor: cannot reach Redis at %s (the Redis tier counts as empty)\n", d->redis);
    }
    kp_tiers_stats ts;
    kp_eng_tier_stats(d->e, &ts);
    fprintf(stderr, "kvpin doctor: tiers under fingerprint %.16s%s%s%s%s\n", ts.fingerprint,
            d->dir ? ": disk " : "", d->dir ? d->dir : "", d->redis ? ", redis " : "", d->redis ? d->redis : "");
    if (*kp_eng_tier_note(d->e)) fprintf(stderr, "kvpin doctor: disk tier: %s\n", kp_eng_tier_note(d->e));
    return true;
}

/* A model with recurrent layers resumes only at a state snapshot: the
 * text line of where one prompt would resume from the tiers alone, after
 * reading and verifying the snapshot (kp_eng_tier_probe_state). */
static void doctor_state_line(uint32_t at, kp_tier_id from, uint32_t refused_at, kp_blockrec_reason why) {
    if (at) printf("  state  : a server without it in RAM resumes at token %u, a verified state snapshot on %s",
                   at, kp_tier_name(from));
    else printf("  state  : no usable state snapshot on the tiers: a server without it in RAM computes from 0");
    if (refused_at) printf(" (the snapshot at %u is refused: %s)", refused_at, kp_blockrec_reason_name(why));
    printf("\n");
}

/* The text line of one prompt: what the tiers hold of it, and what that
 * means next to what the earlier prompts of the log share with it. */
static void doctor_tiers_line(const doctor_tiers *d, size_t n, size_t common, const uint32_t on[KP_TIER_N]) {
    uint32_t below = on[KP_TIER_DISK] + on[KP_TIER_REDIS];
    printf("  tiers  : %u of %zu prompt tokens held as whole blocks (disk %u, redis %u)", below, n,
           on[KP_TIER_DISK], on[KP_TIER_REDIS]);
    if (below > common)
        printf(": %u more than the earlier prompts share; a server on this %s restores them (evicted from RAM "
               "but on %s) instead of computing\n",
               below - (uint32_t)common, d->dir ? "directory" : "Redis", on[KP_TIER_DISK] ? "disk" : "Redis");
    else if (below)
        printf(": if RAM evicted them, a server on this %s restores them instead of computing\n",
               d->dir ? "directory" : "Redis");
    else
        printf(": none (never stored, evicted from the tier, or another fingerprint)\n");
}

enum { O_DOCTOR_TEMPLATE_FILE = CLI_OWN };
static const cli_opt doctor_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_JSON), CLI_USE(CLI_SPECIAL), CLI_USE(CLI_CACHE_DIR), CLI_USE(CLI_CACHE_REDIS),
    CLI_USE(CLI_CACHE_REDIS_TIMEOUT), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V),
    CLI_USE(CLI_KV_BLOCK),
    {"chat-template-file", NULL, NULL, "FILE", "render chat requests in FILE with this Jinja template instead of\n"
                                               "the model's own", O_DOCTOR_TEMPLATE_FILE},
    {0},
};

/* The chat template a doctor renders a chat log's requests with: the
 * model's tokenizer.chat_template (or FILE), its BOS / EOS token texts. */
static kp_chat_tmpl *doctor_template(const kp_gguf *g, const kp_tok_vocab *v, const char *file) {
    size_t len = 0;
    char *text = NULL;
    if (file) {
        text = cli_read_all(file, &len);
    } else {
        kp_gguf_str s;
        kp_error e;
        if (kp_gguf_get_str(g, "tokenizer.chat_template", &s, &e) == KP_OK && s.len && (text = malloc(s.len + 1))) {
            memcpy(text, s.data, s.len);
            text[s.len] = 0;
            len = s.len;
        }
    }
    if (!text) {
        if (!file) fprintf(stderr, "kvpin doctor: the model has no chat template (--chat-template-file FILE)\n");
        return NULL;
    }
    const char *bos = kp_tok_bos(v) >= 0 ? kp_tok_text(v, kp_tok_bos(v), NULL) : "";
    const char *eos = kp_tok_eos(v) >= 0 ? kp_tok_text(v, kp_tok_eos(v), NULL) : "";
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    if (kp_chat_tmpl_new(text, len, NULL, 0, bos, eos, &t, &err) != KP_OK)
        fprintf(stderr, "kvpin doctor: %s: %s\n", file ? file : "the model's chat template", err.msg);
    free(text);
    return t;
}

/* The template, loaded on the first chat request of the log. */
typedef struct {
    const kp_gguf *g;
    const kp_tok_vocab *v;
    const char *file;
    kp_chat_tmpl *t;
    bool tried;
} doctor_chat;

/* chat_render_fn over the doctor's template: as the server renders a request. */
static bool doctor_render(void *ctx, const json_t *req, char **text, size_t *len, char *msg, size_t msg_size) {
    doctor_chat *dc = ctx;
    if (!dc->tried) dc->t = doctor_template(dc->g, dc->v, dc->file);
    dc->tried = true;
    kp_chat_tmpl *t = dc->t;
    if (!t) return snprintf(msg, msg_size, "a chat request, and no chat template to render it"), false;
    const json_t *agp = json_object_get(req, "add_generation_prompt");
    const json_t *kw = json_object_get(req, "chat_template_kwargs");
    kp_chat_opts o = {.add_generation_prompt = !json_is_false(agp)};
    kp_error err = {0};
    if (kp_chat_tmpl_render(t, json_object_get(req, "messages"), json_object_get(req, "tools"), &o,
                            json_is_object(kw) ? kw : NULL, text, len, NULL, NULL, &err) != KP_OK)
        return snprintf(msg, msg_size, "%s", err.msg), false;
    return true;
}

static void doctor_usage(FILE *f) {
    fprintf(f, "usage: kvpin doctor [options] FILE.jsonl\n"
               "Explains, offline, how much of each prompt in a log could reuse the K/V of an\n"
               "earlier prompt, where it diverged (token and byte), why (cold, timestamp, counter,\n"
               "identifier, reordered_json, whitespace, inserted_at_front, new_prefix: another\n"
               "conversation after a shared opening, ...) and what to do.\n"
               "FILE holds one JSON object per line: {\"prompt\": \"...\"} (the log of kvpin serve\n"
               "--log-prompts), or a chat request {\"messages\": [...], \"tools\": [...]}, rendered\n"
               "with the model's chat template (or --chat-template-file). Only the model's\n"
               "vocabulary (and template) is read. --json prints one object per turn: turn, prompt_tokens,\n"
               "reusable_tokens, diverged_at_token, diverged_at_byte, cause, cached_snippet,\n"
               "request_snippet, advice.\n"
               "With --cache-dir and/or --cache-redis it also tells, per prompt, how many of its\n"
               "tokens the tiers below RAM hold as whole blocks under this model's fingerprint\n"
               "(the weights are read for it; --kv-type* and --kv-block must be the server's):\n"
               "what a server on that directory or Redis restores instead of computing, even\n"
               "when its RAM evicted them (--json: on_disk_tokens, in_redis_tokens).\n");
    cli_print_options(f, doctor_tab);
}

int cmd_doctor(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *tmpl_file = NULL;
    bool json = false, special = false;
    doctor_tiers dt = {.kv_type = KP_DTYPE_F16, .kv_type_v = KP_DTYPE_F16, .block = 16};
    cli_args a;
    cli_args_init(&a, "doctor", doctor_tab, doctor_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        int64_t n;
        if (k == CLI_STOP) return a.rc;
        if (k == CLI_JSON) json = true;
        else if (k == CLI_SPECIAL) special = true;
        else if (k == CLI_MODEL) model = a.val;
        else if (k == O_DOCTOR_TEMPLATE_FILE) tmpl_file = a.val;
        else if (k == CLI_CACHE_DIR) dt.dir = a.val;
        else if (k == CLI_CACHE_REDIS) dt.redis = a.val;
        else if (k == CLI_CACHE_REDIS_TIMEOUT && !cli_parse_i64(a.opt, a.val, 1, 60000, &n)) return 2;
        else if (k == CLI_CACHE_REDIS_TIMEOUT) dt.redis_timeout = (uint32_t)n;
        else if ((k == CLI_KV_TYPE || k == CLI_KV_TYPE_K || k == CLI_KV_TYPE_V) &&
                 !cli_parse_kv_opt(k, a.val, &dt.kv_type, &dt.kv_type_v))
            return 2;
        else if (k == CLI_KV_BLOCK && !cli_args_int(&a, &n)) return 2;
        else if (k == CLI_KV_BLOCK) dt.block = (uint32_t)n;
    }
    if (a.first_arg < argc) file = argv[a.first_arg];
    if (a.first_arg + 1 < argc) {
        fprintf(stderr, "kvpin doctor: one FILE.jsonl only ('%s' and '%s')\n", file, argv[a.first_arg + 1]);
        return 2;
    }
    if (!file) {
        doctor_usage(stderr);
        return 2;
    }
    turn_list t = {0};
    kp_gguf *g = NULL;
    kp_tok_vocab *v = NULL;
    kp_error err = {0};
    int rc = 1;
    doctor_chat dc = {.file = tmpl_file};
    if (kp_gguf_open(&g, model ? model : cli_default_model(), &err) != KP_OK ||
        kp_tok_vocab_load(&v, g, &err) != KP_OK) {
        fprintf(stderr, "kvpin doctor: %s\n", err.msg);
        goto done;
    }
    dc.g = g;
    dc.v = v;
    if (!turns_load_jsonl(&t, file, "doctor", doctor_render, &dc)) goto done;
    if (!tokenize_turns(NULL, v, &t, true, special, "doctor")) goto done;
    if ((dt.dir || dt.redis) && !doctor_tiers_open(&dt, model)) goto done;
    size_t total = 0, reusable = 0, worst = 0, total_tiers = 0;
    double worst_pct = -1;
    char worst_advice[512] = "";
    for (size_t i = 0; i < t.n; i++) {
        turn *u = &t.v[i];
        size_t common;
        long j = best_earlier(&t, i, u->ids, u->n_prompt, &common);
        kp_doctor_report rep;
        if (explain(v, u, j >= 0 ? &t.v[j] : NULL, common,
                    j >= 0 ? KP_DOCTOR_CACHE_TEXT : KP_DOCTOR_CACHE_NOTHING, special,
                    json ? KP_DOCTOR_ESCAPE_JSON : KP_DOCTOR_ESCAPE_HUMAN, &rep, &err) != KP_OK) {
            fprintf(stderr, "kvpin doctor: turn %zu: %s\n", i + 1, err.msg);
            goto done;
        }
        char subject[32], advice[512];
        snprintf(subject, sizeof subject, "turn %zu", i + 1);
        kp_doctor_advice(rep.finding.cause, rep.finding.detail, rep.finding.line, rep.div.percent_recomputed, subject,
                      advice, sizeof advice);
        total += u->n_prompt;
        reusable += common;
        if (i > 0 && rep.div.percent_recomputed > worst_pct) {
            worst_pct = rep.div.percent_recomputed;
            worst = i;
            memcpy(worst_advice, advice, sizeof advice);
        }
        const char *cause = kp_doctor_cause_name(rep.finding.cause);
        uint32_t on[KP_TIER_N] = {0}, state_at = 0, refused_at = 0;
        kp_tier_id state_from = KP_TIER_DISK;
        kp_blockrec_reason why = KP_BLOCKREC_OK;
        bool recurrent = dt.e && kp_eng_recurrent(dt.e);
        if (dt.e) kp_eng_tier_probe(dt.e, u->ids, (uint32_t)u->n_prompt, on);
        if (recurrent) state_at = kp_eng_tier_probe_state(dt.e, u->ids, (uint32_t)u->n_prompt, &state_from, &refused_at, &why);
        total_tiers += on[KP_TIER_DISK] + on[KP_TIER_REDIS];
        if (json) {
            /* snippets are already escaped for a JSON string literal */
            printf("{\"turn\":%zu,\"prompt_tokens\":%zu,\"reusable_tokens\":%zu,\"diverged_at_token\":%zu,"
                   "\"diverged_at_byte\":%zu,\"cause\":\"%s\",\"cached_snippet\":\"%s\",\"request_snippet\":\"%s\","
                   "\"advice\":",
                   i + 1, u->n_prompt, common, common, rep.div.byte, cause, rep.cached_snippet,
                   rep.request_snippet);
            json_str(stdout, advice);
            if (dt.e) printf(",\"on_disk_tokens\":%u,\"in_redis_tokens\":%u", on[KP_TIER_DISK], on[KP_TIER_REDIS]);
            if (recurrent)
                printf(",\"tier_state_resume_token\":%u,\"tier_state_from\":\"%s\",\"tier_state_refused_at\":%u,"
                       "\"tier_state_refused_reason\":\"%s\"",
                       state_at, state_at ? kp_tier_name(state_from) : "", refused_at,
                       refused_at ? kp_blockrec_reason_name(why) : "");
            printf("}\n");
        } else {
            char from[48] = "";
            if (j >= 0) snprintf(from, sizeof from, " from turn %ld", j + 1);
            printf("turn %zu: %zu prompt tokens, %zu reusable%s, diverged at token %zu, byte %zu (line %zu): %s\n",
                   i + 1, u->n_prompt, common, from, common, rep.div.byte, rep.finding.line, rep.finding.detail);
            if (j >= 0) {
                printf("  cached : %s\n  request: %s\n", rep.cached_snippet, rep.request_snippet);
            }
            printf("  advice : %s\n", advice);
            if (dt.e) doctor_tiers_line(&dt, u->n_prompt, common, on);
            if (recurrent) doctor_state_line(state_at, state_from, refused_at, why);
        }
    }
    if (!json) {
        printf("summary: %zu turns, %zu of %zu prompt tokens reusable (%.0f%%)", t.n, reusable, total,
               total ? 100.0 * (double)reusable / (double)total : 0.0);
        if (dt.e) printf("; %zu held by the tiers below RAM", total_tiers);
        if (worst_pct >= 0) printf("; worst: turn %zu: %s", worst + 1, worst_advice);
        printf("\n");
    }
    fflush(stdout);
    rc = 0;
done:
    kp_chat_tmpl_free(dc.t);
    kp_eng_free(dt.e);
    cli_model_close(&dt.cm);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    turns_free(&t);
    return rc;
}
