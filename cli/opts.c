/*
 * opts.c - the command line's option parser (cli.h: cli_args over getopt_long)
 * and the table of the options every command shares.
 *
 * A command's table lists its own options and, by key, the shared ones
 * below; cli_args_init resolves the keys, builds getopt_long's long-option
 * array (canonical names and aliases, each returning 256 + the entry's
 * index) and its short-option string (":" first, so a missing value is told
 * from an unknown option), and rewrites two-letter short options (-np) to
 * their long names. cli_print_options prints every table's lines with one
 * function, so a shared option reads the same in every command's --help.
 *
 * getopt_long's state (optind, optarg, optopt) is the process's: one
 * cli_args is parsed at a time, from init to CLI_END.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The shared options: spellings as llama.cpp's tools have them. */
static const cli_opt shared[] = {
    {"help", "h", NULL, NULL, "print this help and exit", CLI_HELP},
    {"version", NULL, NULL, NULL, "print the version, commit, build flags and kernels, and exit",
     CLI_VERSION},
    {"model", "m", NULL, "FILE", "the GGUF model file (default: the bundled model, or $KVPIN_MODEL)", CLI_MODEL},
    {"threads", "t", NULL, "N", "threads for the forward pass (default: every core)", CLI_THREADS},
    {"ctx-size", "c", "ctx", "N", "context length: the KV cache positions of one sequence", CLI_CTX_SIZE},
    {"n-predict", "n", "predict", "N", "tokens to generate at most", CLI_N_PREDICT},
    {"prompt", "p", NULL, "TEXT", "the prompt", CLI_PROMPT},
    {"file", "f", NULL, "FILE", "read the prompt from FILE (- for stdin)", CLI_FILE},
    {"seed", "s", NULL, "S", "random seed: the same seed gives the same output", CLI_SEED},
    {"temp", NULL, NULL, "T", "sampling temperature (0: greedy)", CLI_TEMP},
    {"top-k", NULL, NULL, "K", "sample among the K most likely tokens (0: all)", CLI_TOP_K},
    {"top-p", NULL, NULL, "P", "sample among the most likely tokens that make up P of the\n"
                               "probability (1: all)", CLI_TOP_P},
    {"min-p", NULL, NULL, "P", "drop tokens less likely than P x the most likely one (0: off)", CLI_MIN_P},
    {"repeat-penalty", NULL, NULL, "R", "penalize tokens seen in the last --repeat-last-n by R (1: off)",
     CLI_REPEAT_PENALTY},
    {"repeat-last-n", NULL, NULL, "N", "how many tokens the penalties look back (0: off, -1: all)",
     CLI_REPEAT_LAST_N},
    {"presence-penalty", NULL, NULL, "P", "subtract P from the logit of every token seen (0: off)",
     CLI_PRESENCE_PENALTY},
    {"frequency-penalty", NULL, NULL, "P", "subtract P x its count from the logit of a seen token (0: off)",
     CLI_FREQUENCY_PENALTY},
    {"host", NULL, NULL, "HOST", "address to listen on: IPv4, IPv6 (::1, [::1], :: for all) or a name",
     CLI_HOST},
    {"port", NULL, NULL, "PORT", "TCP port to listen on (0: any free port)", CLI_PORT},
    {"parallel", "np", NULL, "N", "sequences that run at once", CLI_PARALLEL},
    {"kv-type", NULL, NULL, "TYPE", "element type of the KV cache, K and V: f16, f32, q8_0 or q4_0\n"
     "(the last two need a head_dim that is a multiple of 32)", CLI_KV_TYPE},
    {"kv-type-k", NULL, NULL, "TYPE", "element type of the cached K rows alone (as --kv-type)", CLI_KV_TYPE_K},
    {"kv-type-v", NULL, NULL, "TYPE", "element type of the cached V rows alone (as --kv-type)", CLI_KV_TYPE_V},
    {"kv-budget", NULL, NULL, "BYTES", "memory for the KV cache, e.g. 512M or 2G (more than 0)", CLI_KV_BUDGET},
    {"window-budget", NULL, NULL, "BYTES", "a model with sliding-window layers: memory for their K/V, out of\n"
     "--kv-budget; cached prefixes then keep it only near their ends and pins, and\n"
     "reuse resumes where it is held (default: every cached position keeps it)", CLI_WINDOW_BUDGET},
    {"state-every", NULL, NULL, "N", "a model with recurrent layers (qwen35): snapshot a sequence's state\n"
     "into the prefix cache every N positions (and at prompt ends, answer ends\n"
     "and pins): reuse resumes at most N before a divergence (default 256)", CLI_STATE_EVERY},
    {"kv-block", NULL, NULL, "N", "positions per KV cache block", CLI_KV_BLOCK},
    {"no-prefix-cache", NULL, NULL, NULL, "compute every prompt in full (no reuse of cached K/V)",
     CLI_NO_PREFIX_CACHE},
    {"no-bos", NULL, NULL, NULL, "do not add the BOS token (nor EOS) to the prompt", CLI_NO_BOS},
    {"special", NULL, NULL, NULL, "parse special-token text (<|im_start|>) into its id, and print\n"
                                  "special tokens as text", CLI_SPECIAL},
    {"print-tokens", NULL, NULL, NULL, "print the generated token ids on stderr", CLI_PRINT_TOKENS},
    {"scalar", NULL, NULL, NULL, "use the portable C kernels instead of the CPU's SIMD ones", CLI_SCALAR},
    {"no-repack", NULL, NULL, NULL, "read every weight where the model file maps it: no repacked copy\n"
                                    "of the F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K/MXFP4 matrices, experts\n"
                                    "included (half the weight memory, slower decode)",
     CLI_NO_REPACK},
    {"attn-precision", NULL, NULL, "P", "f32 (default) or bf16: prefill attention's products (Q.K and P.V)\n"
                                        "in bfloat16 dot products where the CPU has AVX512_BF16 (about 2x\n"
                                        "their speed on long prompts; logits within BF16 tolerances; F32\n"
                                        "elsewhere; cache tiers keep the two apart)", CLI_ATTN_PRECISION},
    {"json", NULL, NULL, NULL, "print one JSON object per result", CLI_JSON},
    {"cache-dir", NULL, NULL, "DIR", "the disk tier: full KV blocks are kept in DIR (verified records,\n"
                                     "one folder per model fingerprint) and reused after a restart", CLI_CACHE_DIR},
    {"cache-disk-budget", NULL, NULL, "BYTES", "most bytes the disk tier keeps (least recently used go first;\n"
                                               "default: no limit)", CLI_CACHE_DISK_BUDGET},
    {"cache-redis", NULL, NULL, "HOST:PORT", "the Redis tier: full KV blocks shared with every kvpin of the same\n"
                                             "model on this Redis (kvpin:<fingerprint>:<key>)", CLI_CACHE_REDIS},
    {"cache-redis-timeout-ms", NULL, NULL, "MS", "longest wait for one Redis round trip (default 50); past it\n"
                                                 "the prompt is computed", CLI_CACHE_REDIS_TIMEOUT},
};
#define N_SHARED (sizeof shared / sizeof shared[0])

/* The ranges of the shared options that take an integer (cli_args_int). */
static const struct {
    int key;
    int64_t lo, hi;
} ranges[] = {
    {CLI_THREADS, 1, 1024}, {CLI_CTX_SIZE, 1, 1 << 24}, {CLI_N_PREDICT, 0, 1 << 24}, {CLI_TOP_K, 0, 1 << 30},
    {CLI_REPEAT_LAST_N, -1, 1 << 20}, {CLI_PORT, 0, 65535}, {CLI_PARALLEL, 1, 256}, {CLI_KV_BLOCK, 1, 4096},
};

#define HELP_COL 31 /* the column descriptions start at */

static const cli_opt *shared_opt(int key) {
    for (size_t i = 0; i < N_SHARED; i++)
        if (shared[i].key == key) return &shared[i];
    return NULL;
}

/* The entries of tab, shared ones resolved, then --help and --version
 * unless listed. Returns the count (at most cap). */
static int resolve(const cli_opt *tab, const cli_opt **out, int cap) {
    int n = 0;
    bool help = false, version = false;
    for (const cli_opt *o = tab; o->key && n < cap; o++) {
        const cli_opt *r = o->name ? o : shared_opt(o->key);
        if (!r) continue; /* a key that names no shared option: a table bug, skipped */
        help |= r->key == CLI_HELP;
        version |= r->key == CLI_VERSION;
        out[n++] = r;
    }
    if (!help && n < cap) out[n++] = shared_opt(CLI_HELP);
    if (!version && n < cap) out[n++] = shared_opt(CLI_VERSION);
    return n;
}

bool cli_tab_takes_value(const cli_opt *tab, const char *opt) {
    const cli_opt *ent[CLI_MAX_OPTS];
    int n = resolve(tab, ent, CLI_MAX_OPTS);
    bool dd = opt[0] == '-' && opt[1] == '-';
    const char *s = opt + (dd ? 2 : 1);
    for (int i = 0; i < n; i++) {
        const cli_opt *o = ent[i];
        bool hit = dd ? (!strcmp(o->name, s) || (o->alias && !strcmp(o->alias, s)))
                      : o->shorts && !strcmp(o->shorts, s);
        if (hit) return o->arg != NULL;
    }
    return false;
}

static void print_line(FILE *f, const cli_opt *o) {
    char sh[8] = "", lg[64];
    if (o->shorts) snprintf(sh, sizeof sh, "-%s,", o->shorts);
    snprintf(lg, sizeof lg, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    int w = fprintf(f, "  %4s %s", sh, lg);
    if (w > HELP_COL - 2) {
        fputc('\n', f);
        w = 0;
    }
    fprintf(f, "%*s", HELP_COL - w, "");
    for (const char *h = o->help; *h; h++) {
        fputc(*h, f);
        if (*h == '\n') fprintf(f, "%*s", HELP_COL, "");
    }
    fputc('\n', f);
}

void cli_print_options(FILE *f, const cli_opt *tab) {
    const cli_opt *ent[CLI_MAX_OPTS];
    int n = resolve(tab, ent, CLI_MAX_OPTS);
    fprintf(f, "options:\n");
    for (int i = 0; i < n; i++)
        if (ent[i]->help) print_line(f, ent[i]);
}

/* The entry whose short spelling is exactly s[0..len), or NULL. */
static const cli_opt *by_short(const cli_args *a, const char *s, size_t len) {
    for (int i = 0; i < a->n_ent; i++) {
        const char *sh = a->ent[i]->shorts;
        if (sh && strlen(sh) == len && !strncmp(sh, s, len)) return a->ent[i];
    }
    return NULL;
}

/* Whether the long option `s` (without "--", up to '=' or the end) takes a
 * value: an exact name or alias, else a unique abbreviation, as getopt_long
 * matches it. Unknown or ambiguous: false (getopt_long reports it). */
static bool long_takes_value(const cli_args *a, const char *s) {
    size_t len = strcspn(s, "=");
    const struct option *hit = NULL;
    int n_hits = 0;
    for (const struct option *l = a->longs; l->name; l++) {
        if (strncmp(l->name, s, len)) continue;
        if (strlen(l->name) == len) return l->has_arg != no_argument;
        if (!hit || hit->val != l->val) n_hits++; /* an alias of the same entry is not ambiguous */
        hit = l;
    }
    return n_hits == 1 && hit->has_arg != no_argument;
}

static void bad(cli_args *a, const char *fmt, const char *what) {
    if (!a->quiet) {
        fprintf(stderr, "kvpin %s: ", a->cmd);
        fprintf(stderr, fmt, what);
        if (a->help_cmd) fprintf(stderr, " (see %s)\n", a->help_cmd);
        else fprintf(stderr, " (see kvpin %s --help)\n", a->cmd);
    }
    a->rc = 2;
}

/* Rewrites "-np" / "-np=N" (two-letter short options) to "--parallel" /
 * "--parallel=N", walking the arguments as getopt_long will, so that an
 * option's value that looks like one ("-p -np") is left alone. */
static void map_multi_shorts(cli_args *a) {
    for (int i = 1; i < a->argc; i++) {
        const char *t = a->argv[i];
        if (!strcmp(t, "--")) return;
        if (t[0] != '-' || !t[1]) continue; /* an operand, or "-" */
        if (t[1] == '-') {
            if (!strchr(t, '=') && long_takes_value(a, t + 2)) i++;
            continue;
        }
        size_t len = strcspn(t + 1, "=");
        const cli_opt *m = len > 1 ? by_short(a, t + 1, len) : NULL;
        if (!m && len > 1) { /* a two-letter option of another command: name it, not "-n p" */
            for (size_t k = 0; k < N_SHARED; k++)
                if (shared[k].shorts && strlen(shared[k].shorts) == len && !strncmp(shared[k].shorts, t + 1, len)) {
                    bad(a, "unknown option '%s'", t);
                    a->bad = true;
                    return;
                }
        }
        if (m) {
            size_t need = strlen(m->name) + strlen(t + 1 + len) + 3;
            if (a->arena_used + need > sizeof a->arena) {
                bad(a, "too many or too long '%s' options", t);
                a->bad = true;
                return;
            }
            char *w = a->arena + a->arena_used;
            snprintf(w, need, "--%s%s", m->name, t + 1 + len);
            a->arena_used += need;
            a->argv[i] = w;
            if (!t[1 + len] && m->arg) i++;
            continue;
        }
        for (const char *p = t + 1; *p; p++) { /* a cluster of one-letter options */
            const cli_opt *o = by_short(a, p, 1);
            if (!o && t[2]) { /* "-ngl", "-xyz": name what was written, not its first letter */
                bad(a, "unknown option '%s'", t);
                a->bad = true;
                return;
            }
            if (!o) break;
            if (o->arg) {
                if (!p[1]) i++;
                break;
            }
        }
    }
}

void cli_args_init(cli_args *a, const char *cmd, const cli_opt *tab, void (*usage)(FILE *), int argc,
                   char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->usage = usage;
    a->argc = argc;
    a->argv = argv;
    a->n_ent = resolve(tab, a->ent, CLI_MAX_OPTS);
    size_t nl = 0, ns = 0;
    a->shorts[ns++] = ':';
    for (int i = 0; i < a->n_ent; i++) {
        const cli_opt *o = a->ent[i];
        int has = o->arg ? required_argument : no_argument;
        a->longs[nl++] = (struct option){o->name, has, NULL, 256 + i};
        if (o->alias) a->longs[nl++] = (struct option){o->alias, has, NULL, 256 + i};
        if (o->shorts && !o->shorts[1]) {
            a->shorts[ns++] = o->shorts[0];
            if (o->arg) a->shorts[ns++] = ':';
        }
    }
    a->shorts[ns] = 0;
    a->longs[nl] = (struct option){0};
    optind = 0; /* glibc: start over, as if nothing was parsed before */
    opterr = 0;
    map_multi_shorts(a);
}

int cli_args_next(cli_args *a) {
    a->val = NULL;
    a->opt[0] = 0;
    if (a->bad) {
        a->bad = false;
        a->rc = 2;
        if (!a->quiet) return CLI_STOP;
    }
    int li = -1;
    int c = getopt_long(a->argc, a->argv, a->shorts, a->longs, &li);
    if (c == -1) {
        a->first_arg = optind;
        return CLI_END;
    }
    if (c == '?' || c == ':') {
        /* the argument at fault: a long option is argv[optind - 1] (getopt_long
         * stepped past it); a short one is optopt */
        const char *arg = optind > 0 && optind <= a->argc ? a->argv[optind - 1] : "";
        if (optopt >= 256 && optopt < 256 + a->n_ent) {
            snprintf(a->opt, sizeof a->opt, "--%s", a->ent[optopt - 256]->name);
        } else if (optopt > 0 && optopt < 256) {
            snprintf(a->opt, sizeof a->opt, "-%c", optopt);
        } else {
            snprintf(a->opt, sizeof a->opt, "%.*s", (int)strcspn(arg, "="), arg);
        }
        if (c == ':') bad(a, "option '%s' needs a value", a->opt);
        else if (optopt >= 256) bad(a, "option '%s' takes no value", a->opt);
        else if (optopt == 0 && !strncmp(arg, "--", 2)) {
            /* unknown, or an abbreviation of several options */
            size_t len = strcspn(arg + 2, "=");
            int n = 0, last = -1;
            for (const struct option *l = a->longs; l->name; l++)
                if (!strncmp(l->name, arg + 2, len) && l->val != last) n++, last = l->val;
            bad(a, n > 1 ? "ambiguous option '%s'" : "unknown option '%s'", a->opt);
        } else
            bad(a, "unknown option '%s'", a->opt);
        return a->quiet ? CLI_BAD : CLI_STOP;
    }
    const cli_opt *o = NULL;
    if (c >= 256 && c < 256 + a->n_ent) {
        o = a->ent[c - 256];
        snprintf(a->opt, sizeof a->opt, "--%s", li >= 0 ? a->longs[li].name : o->name);
    } else {
        char s = (char)c;
        o = by_short(a, &s, 1);
        snprintf(a->opt, sizeof a->opt, "-%c", c);
    }
    if (!o) { /* cannot happen: getopt_long returns only what the tables hold */
        bad(a, "unknown option '%s'", a->opt);
        return a->quiet ? CLI_BAD : CLI_STOP;
    }
    a->cur = o;
    a->val = o->arg ? optarg : NULL;
    if (!a->quiet && (o->key == CLI_HELP || o->key == CLI_VERSION)) {
        if (o->key == CLI_HELP) a->usage(stdout);
        else cli_print_version(stdout);
        a->rc = 0;
        return CLI_STOP;
    }
    return o->key;
}

bool cli_args_int(const cli_args *a, int64_t *out) {
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (a->cur && a->cur->key == ranges[i].key) return cli_parse_i64(a->opt, a->val, ranges[i].lo, ranges[i].hi, out);
    fprintf(stderr, "kvpin %s: %s has no integer range (a bug)\n", a->cmd, a->opt);
    return false;
}

bool cli_args_no_operands(cli_args *a) {
    if (a->first_arg >= a->argc) return true;
    bad(a, "unexpected argument '%s'", a->argv[a->first_arg]);
    return false;
}
