/*
 * cli.h - shared pieces of the kvpin command line (above every floor of src/).
 *
 * Each subcommand is a function `int cmd_NAME(int argc, char **argv)` that
 * returns the process exit code: 0 success, 1 runtime failure (bad model
 * file, I/O), 2 usage error. Only this layer prints to the terminal and
 * decides exit codes; library errors arrive as kp_error values.
 */
#ifndef KP_CLI_H
#define KP_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpin.h"
#include "base/threadpool.h"
#include "gguf/dtype.h"
#include "kernels/attn.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "model/sampler.h"
#include "tok/tok.h"

/* The options every model-running subcommand shares (run, logits,
 * inspect, bench). */
typedef struct {
    const char *model_path;  /* NULL: the bundled model */
    int n_threads;           /* <= 0: all cores */
    kp_dtype kv_type;        /* K rows */
    uint32_t n_ctx;          /* 0: min(training context, 4096) */
    bool scalar;             /* portable kernels instead of AVX2 */
    kp_dtype kv_type_v;      /* V rows */
    bool no_repack;          /* --no-repack: weights read in the mapping only */
    kp_attn_precision attn;  /* --attn-precision (run, bench; kp_eng_set_attn) */
} cli_session_opts;

/* What such a subcommand loads before it makes its engine
 * (engine/engine.h): the model file through the library's kp_lm_open (so a
 * prompt is tokenized by kp_tokenize_prompt, kvpin.h), its model and
 * tokenizer taken out of it (api/lm_parts.h), a thread pool, the kernels. */
typedef struct {
    kp_lm *lm;
    const kp_model *m;       /* lm's, borrowed */
    const kp_tok_vocab *tok; /* lm's, borrowed */
    kp_threads *pool;
    int n_threads;
    const kp_kernels *kernels;
    uint32_t n_ctx;          /* o->n_ctx, else min(training context, 4096) */
} cli_model;

/* Loads what o names (model.c); prints the error itself (prefixed by
 * `cmd`) and returns false on failure, with *cm empty. */
bool cli_model_open(cli_model *cm, const cli_session_opts *o, const char *cmd);
void cli_model_close(cli_model *cm); /* an empty or closed one is a no-op */

/* The version `kvpin --version` prints is the library's KP_VERSION
 * (kvpin.h, the single place it is written); the commit, compiler and
 * flags come from the build: build/<dir>/buildinfo.h, written by
 * tools/buildinfo.sh. */

/* Prints the version, commit, compiler, build flags and the kernel tables
 * this CPU gets (cli/version.c). */
void cli_print_version(FILE *out);

/* ---- options ------------------------------------------------------------
 *
 * Every command parses its arguments with getopt_long over a table of
 * cli_opt (opts.c). An entry either describes an option of the command, or
 * names one of the shared options by its key alone ({.key = CLI_MODEL},
 * CLI_USE): those are spelled, and described in --help, the same way in
 * every command, as llama.cpp spells them. -h/--help and --version belong to
 * every table without being listed.
 *
 * Spellings accepted: -m FILE, -mFILE, --model FILE, --model=FILE, a
 * unique abbreviation of a long name (--mod), the aliases (--ctx for
 * --ctx-size), and two-letter short options (-np N and -np=N for
 * --parallel, serve's -to S; getopt_long cannot take them, so they are
 * rewritten to the long option before parsing; -np4 is not one). Options
 * and operands may be mixed; "--" ends the options. Options given several
 * times are seen several times. */
typedef struct {
    const char *name;   /* the canonical long name, "ctx-size"; NULL: a shared option (by key) */
    const char *shorts; /* the short spelling without its dash ("c", "np"), or NULL */
    const char *alias;  /* one more long name accepted but not shown ("ctx"), or NULL */
    const char *arg;    /* the value's name in --help ("N"); NULL: the option takes no value */
    const char *help;   /* its line in --help ('\n' continues it); NULL: accepted, not shown */
    int key;            /* what cli_args_next returns for it; 0 ends a table */
} cli_opt;

/* Keys of the shared options; a command's own keys start at CLI_OWN. */
enum {
    CLI_HELP = 256, CLI_VERSION, CLI_MODEL, CLI_THREADS, CLI_CTX_SIZE, CLI_N_PREDICT, CLI_PROMPT, CLI_FILE,
    CLI_SEED, CLI_TEMP, CLI_TOP_K, CLI_TOP_P, CLI_MIN_P, CLI_REPEAT_PENALTY, CLI_REPEAT_LAST_N,
    CLI_PRESENCE_PENALTY, CLI_FREQUENCY_PENALTY, CLI_HOST, CLI_PORT, CLI_PARALLEL, CLI_KV_TYPE, CLI_KV_BUDGET,
    CLI_KV_BLOCK, CLI_NO_PREFIX_CACHE, CLI_NO_BOS, CLI_SPECIAL, CLI_PRINT_TOKENS, CLI_SCALAR, CLI_JSON,
    CLI_KV_TYPE_K, CLI_KV_TYPE_V, CLI_CACHE_DIR, CLI_CACHE_DISK_BUDGET, CLI_CACHE_REDIS, CLI_CACHE_REDIS_TIMEOUT,
    CLI_NO_REPACK, CLI_WINDOW_BUDGET, CLI_ATTN_PRECISION, CLI_STATE_EVERY,
    CLI_OWN = 1000
};
#define CLI_USE(k) {.key = (k)}
#define CLI_SAMPLING_OPTS                                                                                   \
    CLI_USE(CLI_SEED), CLI_USE(CLI_TEMP), CLI_USE(CLI_TOP_K), CLI_USE(CLI_TOP_P), CLI_USE(CLI_MIN_P),       \
        CLI_USE(CLI_REPEAT_PENALTY), CLI_USE(CLI_REPEAT_LAST_N), CLI_USE(CLI_PRESENCE_PENALTY),             \
        CLI_USE(CLI_FREQUENCY_PENALTY)

/* What cli_args_next returns besides option keys. */
enum { CLI_END = -1, CLI_STOP = -2, CLI_BAD = -3 };

#define CLI_MAX_OPTS 64

/* The parser of one command line. getopt_long's state is global: one
 * cli_args at a time. */
typedef struct {
    const char *cmd;      /* "run": messages start "kvpin run: " */
    const char *help_cmd; /* what error messages point to; default "kvpin CMD --help" */
    void (*usage)(FILE *out);
    bool quiet;           /* a scan: nothing printed, --help/--version/errors returned as keys */
    int argc;
    char **argv;
    const cli_opt *ent[CLI_MAX_OPTS];
    int n_ent;
    struct option longs[2 * CLI_MAX_OPTS + 1];
    char shorts[3 * CLI_MAX_OPTS + 2];
    char arena[512];      /* rewritten "-np=N" arguments */
    size_t arena_used;
    bool bad;             /* init found an error (printed); the first next() stops */
    /* after each cli_args_next: */
    const cli_opt *cur;   /* the option's entry */
    const char *val;      /* the option's value; NULL for a flag */
    char opt[64];         /* the option as the user spelled it ("-n", "--ctx"), for messages */
    int rc;               /* CLI_STOP: the exit code (0 after --help or --version, 2 after an error) */
    int first_arg;        /* CLI_END: argv[first_arg .. argc) are the operands */
} cli_args;

/* Prepares to parse argv[1..argc) (argv[0] is the command's name) against
 * tab, which ends with an entry of key 0. argv's pointers are permuted and
 * -np arguments rewritten in place (as getopt_long does). usage prints the
 * command's --help. */
void cli_args_init(cli_args *a, const char *cmd, const cli_opt *tab, void (*usage)(FILE *), int argc, char **argv);

/* The next option's key (its value in a->val), CLI_END after the last one,
 * or CLI_STOP when the command must return a->rc: --help and --version were
 * printed (0), or an unknown option, a missing value or a value given to a
 * flag was reported in one line naming the option and the help command
 * (2). In a quiet scan: CLI_HELP, CLI_VERSION and CLI_BAD are returned
 * instead and parsing goes on. */
int cli_args_next(cli_args *a);

/* The value of the shared option cli_args_next just returned, as an
 * integer in that option's range (the same in every command: -t 1..1024,
 * -c 1..2^24, -n 0..2^24, --port 0..65535, -np 1..256, --kv-block 1..4096,
 * --top-k 0..2^30, --repeat-last-n -1..2^20); false, with a message naming
 * the option, when it is not one. */
bool cli_args_int(const cli_args *a, int64_t *out);

/* The sampling options (CLI_SAMPLING_OPTS): applies the option
 * cli_args_next just returned to sp. Returns 1 when it is one of them and
 * was applied, 0 when it is not a sampling option, -1 when the value is bad
 * (an error was printed). */
int cli_parse_sampler_opt(const cli_args *a, kp_sampler_params *sp, bool *seed_set);

/* At CLI_END: false, with a message, when there are operands (for commands
 * that take none). */
bool cli_args_no_operands(cli_args *a);

/* The --help lines of tab's options (and of --help and --version), one
 * format for all: the short spelling right-aligned in a column, the long
 * one and its value, the description from one column on. */
void cli_print_options(FILE *out, const cli_opt *tab);

/* The model used when -m is not given: $KVPIN_MODEL, else the bundled one,
 * found next to the binary's repository (<root>/models/), in the installed
 * tree relative to the binary (PREFIX/bin/kvpin: PREFIX/share/kvpin/), or in
 * the data directory the release build was made for (KP_DATADIR, from the
 * Makefile's PREFIX); else models/stories260K.gguf in the working
 * directory. */
const char *cli_default_model(void);

/* Strict number parsing for option values; print an error naming the
 * option and return false on garbage, overflow or out-of-range values. */
bool cli_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out);
bool cli_parse_f32(const char *opt, const char *s, float *out);
bool cli_parse_u64(const char *opt, const char *s, uint64_t *out);
/* "f32" / "f16" / "q8_0" / "q4_0" for the KV cache. */
bool cli_parse_kv_type(const char *s, kp_dtype *out);
/* The value of --kv-type (key CLI_KV_TYPE: sets *k and *v), --kv-type-k
 * (*k only) or --kv-type-v (*v only); false, with a message, for a bad name. */
bool cli_parse_kv_opt(int key, const char *s, kp_dtype *k, kp_dtype *v);
/* The value of --attn-precision: "f32" or "bf16"; false, with a message. */
bool cli_parse_attn(const char *s, kp_attn_precision *out);
/* The KV bill's formula into buf: "2 x L x H x hd x B" with B the bytes of
 * one value ("2", "4", "34/32", "18/32"), or "L x H x hd x (Bk + Bv)" when
 * K and V differ. Returns buf. */
const char *cli_kv_formula(const kp_hparams *hp, kp_dtype k, kp_dtype v, char *buf, size_t n);
/* "F16", or "Q8_0/F16" (K/V) when they differ. Returns buf. */
const char *cli_kv_name(kp_dtype k, kp_dtype v, char *buf, size_t n);
/* Sizes like 512M, 2G, 1024 (bytes). */
bool cli_parse_bytes(const char *opt, const char *s, uint64_t *out);

/* Human-readable byte count ("1.50 MiB") into buf. */
const char *cli_bytes(uint64_t n, char *buf, size_t cap);

/* Reads a whole file (or stdin for "-") into a malloc'd, NUL-terminated
 * buffer; NULL and a printed error on failure. */
char *cli_read_all(const char *path, size_t *len);

/* Peak resident set size of this process in bytes (VmHWM), 0 if unknown. */
uint64_t cli_peak_rss(void);

/* Half of the machine's physical memory in bytes (0 when unknown): the cap
 * of a default KV budget. */
uint64_t cli_half_of_ram(void);

/* Monotonic clock in seconds. */
double cli_now(void);

int cmd_info(int argc, char **argv);
int cmd_kv(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* serve.c */
int cmd_canon(int argc, char **argv); /* canon.c */
int cmd_template(int argc, char **argv); /* template.c */
/* cache.c: `kvpin run` with several prompts through the prefix cache. */
bool cli_cache_wanted(int argc, char **argv);
int cmd_run_cached(int argc, char **argv);

/* llama.cpp's spellings of options (llama-server, llama-cli) in argv
 * (compat.c): mapped to kvpin's options, or taken out with a note on
 * stderr, or refused (returns 2, the reason printed); argv and *argc are
 * rewritten in place. tab: the command's options (a value of kvpin's own
 * options is never read as an option). 0 when the line can go on. */
int cli_llama_compat(const char *cmd, int *argc, char **argv, const cli_opt *tab);

/* Whether the option spelled opt ("-c", "--ctx-size", "-np") of table tab
 * (shared options resolved) takes a value. */
bool cli_tab_takes_value(const cli_opt *tab, const char *opt);

#endif
