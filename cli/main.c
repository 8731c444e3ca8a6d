/*
 * main.c - the kvpin binary: subcommand dispatch and shared CLI helpers.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"serve", cmd_serve, "the OpenAI-compatible HTTP server (the main job)"},
    {"run", cmd_run, "generate text from a prompt (streams to stdout)"},
    {"info", cmd_info, "describe a model file: architecture, tensors, tokenizer, KV bill"},
    {"kv", cmd_kv, "the KV cache memory bill of a model"},
    {"tokenize", cmd_tokenize, "text on stdin -> token ids"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"logits", cmd_logits, "logits of every prompt position, as float32"},
    {"inspect", cmd_inspect, "watch prefill write and decode append the KV cache"},
    {"bench", cmd_bench, "prompt processing and generation speed"},
    {"mkmodel", cmd_mkmodel, "write a GGUF model with seeded random weights"},
    {"doctor", cmd_doctor, "explain where and why prompts in a log miss the prefix cache"},
    {"canon", cmd_canon, "canonical JSON (RFC 8785) bytes of a JSON document"},
    {"template", cmd_template, "render a chat template on a chat-completions request"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: kvpin COMMAND [options]   (kvpin COMMAND --help for its options)\n"
                 "       kvpin --version           (also: kvpin version)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (argc > 2) {
            fprintf(stderr, "kvpin %s: unexpected argument '%s'\n", argv[1], argv[2]);
            return 2;
        }
        cli_print_version(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvpin: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

/* The bundled model's file name, and where an installed tree keeps it
 * relative to the binary (PREFIX/bin/kvpin -> PREFIX/share/kvpin/). */
#define BUNDLED_MODEL "stories260K.gguf"
#define INSTALLED_REL "../share/kvpin/"

const char *cli_default_model(void) {
    static char path[PATH_MAX + 64];
    const char *env = getenv("KVPIN_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    /* path holds exe + the suffix: no truncation */
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        /* the repository layout: <root>/kvpin or <root>/build/x/kvpin, model in <root>/models */
        char dir[PATH_MAX];
        memcpy(dir, exe, (size_t)n + 1);
        for (int up = 0; up < 3; up++) {
            char *s = strrchr(dir, '/');
            if (!s) break;
            *s = 0;
            snprintf(path, sizeof path, "%s/models/" BUNDLED_MODEL, dir);
            if (access(path, R_OK) == 0) return path;
        }
        /* an installed tree, wherever it was moved: PREFIX/bin/kvpin */
        if (slash) {
            slash[1] = 0;
            snprintf(path, sizeof path, "%s" INSTALLED_REL BUNDLED_MODEL, exe);
            char real[PATH_MAX];
            if (access(path, R_OK) == 0) return realpath(path, real) ? strcpy(path, real) : path;
        }
    }
#ifdef KP_DATADIR
    /* the data directory of the PREFIX the binary was built for (make install) */
    snprintf(path, sizeof path, "%s/" BUNDLED_MODEL, KP_DATADIR);
    if (access(path, R_OK) == 0) return path;
#endif
    return "models/" BUNDLED_MODEL;
}

bool cli_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno) {
        fprintf(stderr, "kvpin: %s expects an integer, got '%s'\n", opt, s ? s : "");
        return false;
    }
    if (v < min || v > max) {
        fprintf(stderr, "kvpin: %s must be between %lld and %lld, got %lld\n", opt,
                (long long)min, (long long)max, v);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_u64(const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno) goto bad;
    *out = v;
    return true;
bad:
    fprintf(stderr, "kvpin: %s expects a non-negative integer, got '%s'\n", opt, s ? s : "");
    return false;
}

bool cli_parse_f32(const char *opt, const char *s, float *out) {
    char *end;
    errno = 0;
    float v = s ? strtof(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v)) {
        fprintf(stderr, "kvpin: %s expects a number, got '%s'\n", opt, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

int cli_parse_sampler_opt(const cli_args *a, kp_sampler_params *sp, bool *seed_set) {
    int64_t n;
    float *field = NULL;
    const char *opt = a->opt, *v = a->val;
    switch (a->cur ? a->cur->key : 0) {
    case CLI_SEED:
        if (!cli_parse_u64(opt, v, &sp->seed)) return -1;
        *seed_set = true;
        return 1;
    case CLI_TOP_K:
        if (!cli_args_int(a, &n)) return -1;
        sp->top_k = (int32_t)n;
        return 1;
    case CLI_REPEAT_LAST_N:
        if (!cli_args_int(a, &n)) return -1;
        sp->repeat_last_n = (int32_t)n;
        return 1;
    case CLI_TEMP: field = &sp->temp; break;
    case CLI_TOP_P: field = &sp->top_p; break;
    case CLI_MIN_P: field = &sp->min_p; break;
    case CLI_REPEAT_PENALTY: field = &sp->repeat_penalty; break;
    case CLI_PRESENCE_PENALTY: field = &sp->presence_penalty; break;
    case CLI_FREQUENCY_PENALTY: field = &sp->frequency_penalty; break;
    default: return 0;
    }
    return cli_parse_f32(opt, v, field) ? 1 : -1;
}

bool cli_parse_kv_type(const char *s, kp_dtype *out) {
    if (s && !strcasecmp(s, "f32")) *out = KP_DTYPE_F32;
    else if (s && !strcasecmp(s, "f16")) *out = KP_DTYPE_F16;
    else if (s && !strcasecmp(s, "q8_0")) *out = KP_DTYPE_Q8_0;
    else if (s && !strcasecmp(s, "q4_0")) *out = KP_DTYPE_Q4_0;
    else {
        fprintf(stderr, "kvpin: --kv-type must be f32, f16, q8_0 or q4_0, got '%s'\n", s ? s : "");
        return false;
    }
    return true;
}

bool cli_parse_attn(const char *s, kp_attn_precision *out) {
    if (s && !strcasecmp(s, "f32")) *out = KP_ATTN_F32;
    else if (s && !strcasecmp(s, "bf16")) *out = KP_ATTN_BF16;
    else {
        fprintf(stderr, "kvpin: --attn-precision must be f32 or bf16, got '%s'\n", s ? s : "");
        return false;
    }
    return true;
}

bool cli_parse_kv_opt(int key, const char *s, kp_dtype *k, kp_dtype *v) {
    kp_dtype t;
    if (!cli_parse_kv_type(s, &t)) return false;
    if (key != CLI_KV_TYPE_V) *k = t;
    if (key != CLI_KV_TYPE_K) *v = t;
    return true;
}

/* Bytes of one value of a KV type as text: "2", "4", "34/32", "18/32". */
static const char *kv_value_bytes(kp_dtype t) {
    return t == KP_DTYPE_F32 ? "4" : t == KP_DTYPE_F16 ? "2" : t == KP_DTYPE_Q8_0 ? "34/32" : "18/32";
}

const char *cli_kv_formula(const kp_hparams *hp, kp_dtype k, kp_dtype v, char *buf, size_t n) {
    if (k == v)
        snprintf(buf, n, "2 x %u x %u x %u x %s", hp->n_kv_layer, hp->n_head_kv, hp->head_dim, kv_value_bytes(k));
    else
        snprintf(buf, n, "%u x %u x %u x (%s + %s)", hp->n_kv_layer, hp->n_head_kv, hp->head_dim, kv_value_bytes(k),
                 kv_value_bytes(v));
    return buf;
}

const char *cli_kv_name(kp_dtype k, kp_dtype v, char *buf, size_t n) {
    if (k == v) snprintf(buf, n, "%s", kp_dtype_name(k));
    else snprintf(buf, n, "%s/%s", kp_dtype_name(k), kp_dtype_name(v));
    return buf;
}

bool cli_parse_bytes(const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') goto bad;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) goto bad;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || v * mul > 1.8e19) goto bad;
    *out = (uint64_t)(v * mul);
    return true;
bad:
    fprintf(stderr, "kvpin: %s expects a size such as 512M or 2G, got '%s'\n", opt, s ? s : "");
    return false;
}

const char *cli_bytes(uint64_t n, char *buf, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)n);
    else snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

char *cli_read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "kvpin: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 0, n = 0;
    char *buf = NULL;
    for (;;) {
        if (n + 1 >= cap) { /* full: 64 KiB first, then doubling (kp_grow), none past 1 TiB */
            size_t need = cap ? n + 2 : (size_t)1 << 16;
            if (cap > ((size_t)1 << 40) || !kp_grow((void **)&buf, &cap, need, 1)) {
                free(buf);
                buf = NULL;
                break;
            }
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = !buf || ferror(f);
    if (f != stdin) fclose(f);
    if (failed) {
        free(buf);
        fprintf(stderr, "kvpin: cannot read %s\n", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

uint64_t cli_half_of_ram(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 2 : 0;
}

uint64_t cli_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
