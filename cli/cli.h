/*
 * cli.h - shared pieces of the kvpin command line (floor 6).
 *
 * Each subcommand is a function `int cmd_NAME(int argc, char **argv)` that
 * returns the process exit code: 0 success, 1 runtime failure (bad model
 * file, I/O), 2 usage error. Only this layer prints to the terminal and
 * decides exit codes; library errors arrive as kp_error values.
 */
#ifndef KP_CLI_H
#define KP_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "gguf/dtype.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "model/sampler.h"
#include "tok/tok.h"

/* The options every model-running subcommand shares (run, logits,
 * inspect, bench). */
typedef struct {
    const char *model_path;  /* NULL: the bundled model */
    int n_threads;           /* <= 0: all cores */
    kp_dtype kv_type;
    uint32_t n_ctx;          /* 0: min(training context, 4096) */
    bool scalar;             /* portable kernels instead of AVX2 */
} cli_session_opts;

/* What such a subcommand loads before it makes its engine
 * (cache/engine.h): the model, its tokenizer, a thread pool, the kernels. */
typedef struct {
    kp_model *m;
    kp_tok_vocab *tok;
    kp_pool *pool;
    int n_threads;
    const kp_kernels *kernels;
    uint32_t n_ctx;          /* o->n_ctx, else min(training context, 4096) */
} cli_model;

/* Loads what o names (model.c); prints the error itself (prefixed by
 * `cmd`) and returns false on failure, with *cm empty. */
bool cli_model_open(cli_model *cm, const cli_session_opts *o, const char *cmd);
void cli_model_close(cli_model *cm); /* an empty or closed one is a no-op */

/* The model used when -m is not given: the bundled one, found next to the
 * binary's repository or via $KVPIN_MODEL. */
const char *cli_default_model(void);

/* Strict number parsing for option values; print an error naming the
 * option and return false on garbage, overflow or out-of-range values. */
bool cli_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out);
bool cli_parse_f32(const char *opt, const char *s, float *out);
bool cli_parse_u64(const char *opt, const char *s, uint64_t *out);
/* "f32" / "f16" for the KV cache. */
bool cli_parse_kv_type(const char *s, kp_dtype *out);
/* Sampling options shared by run and run --prompt-cache: --temp --top-k
 * --top-p --min-p --repeat-penalty --repeat-last-n --presence-penalty
 * --frequency-penalty --seed with value v. Returns 1 when `opt` is one of
 * them and was applied, 0 when it is not a sampling option, -1 when the
 * value is bad (an error was printed). */
int cli_parse_sampler_opt(const char *opt, const char *v, kp_sampler_params *sp, bool *seed_set);
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
/* cache.c: `kvpin run` with several prompts through the prefix cache. */
bool cli_cache_wanted(int argc, char **argv);
int cmd_run_cached(int argc, char **argv);

#endif
