/*
 * compat.c - llama.cpp's command-line spellings for `kvpin serve` and
 * `kvpin run` (cli.h: cli_llama_compat).
 *
 * People arrive with llama-server and llama-cli command lines. Before the
 * option parser sees them, the arguments are walked once (as getopt_long
 * would: an option's value is never read as an option) and every spelling
 * of the table below is handled:
 *
 *   map     the kvpin option it means replaces it (-ctk q8_0 -> --kv-type-k q8_0)
 *   note    it means nothing on a CPU server, or kvpin always does it:
 *           taken out, with one line on stderr saying why
 *   refuse  it asks for what kvpin cannot do (downloading a model): exit 2
 *           with what to do instead
 *
 * A value that a flag may or may not have (llama.cpp's -fa took none, now
 * takes on/off/auto) is taken only when it is one of the flag's words.
 * Options kvpin has under the same name (-c, -t, -np, --port, ...) need
 * nothing here.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef enum { MAP, NOTE, REFUSE } action;
typedef enum { NONE, VALUE, MAYBE } takes;

static const struct {
    const char *names[3];
    takes arg;
    action what;
    const char *to;   /* MAP: the kvpin option; NOTE / REFUSE: why */
    const char *const *words; /* MAYBE: the values it may take */
} COMPAT[] = {
    {{"-ctk", "--cache-type-k", NULL}, VALUE, MAP, "--kv-type-k", NULL},
    {{"-ctv", "--cache-type-v", NULL}, VALUE, MAP, "--kv-type-v", NULL},
    {{"-ngl", "--gpu-layers", "--n-gpu-layers"}, VALUE, NOTE, "kvpin runs on the CPU: no layers to offload", NULL},
    {{"-fa", "--flash-attn", NULL}, MAYBE, NOTE, "kvpin's attention is always fused (online softmax over KV tiles)",
     (const char *const[]){"on", "off", "auto", "true", "false", "1", "0", NULL}},
    {{"-cb", "--cont-batching", NULL}, NONE, NOTE, "continuous batching is always on", NULL},
    {{"-nocb", "--no-cont-batching", NULL}, NONE, NOTE, "continuous batching is always on", NULL},
    {{"--jinja", NULL, NULL}, NONE, NOTE, "the chat template is always rendered (see --chat-template)", NULL},
    {{"-b", "--batch-size", NULL}, VALUE, NOTE, "kvpin sizes its batches itself (--prefill-chunk N: prompt tokens "
                                                "per step while others decode)", NULL},
    {{"-ub", "--ubatch-size", NULL}, VALUE, NOTE, "kvpin sizes its batches itself (--prefill-chunk N)", NULL},
    {{"--mlock", NULL, NULL}, NONE, NOTE, "the weights stay mapped from the file; kvpin does not lock them", NULL},
    {{"--no-mmap", NULL, NULL}, NONE, NOTE, "kvpin maps the weights read-only and repacks them into its own memory "
                                            "at load", NULL},
    {{"--metrics", NULL, NULL}, NONE, NOTE, "GET /metrics is always on", NULL},
    {{"--no-webui", NULL, NULL}, NONE, NOTE, "the cache dashboard is at / (--no-dashboard turns it off)", NULL},
    {{"-hf", "--hf-repo", "-hfr"}, VALUE, REFUSE, "kvpin does not download models: download the GGUF file (see "
                                                  "the README's Models) and pass -m FILE", NULL},
    {{"-mu", "--model-url", NULL}, VALUE, REFUSE, "kvpin does not download models: download the GGUF file and "
                                                  "pass -m FILE", NULL},
};

/* The entry spelled s (up to '='), or -1. */
static int find(const char *s) {
    size_t len = strcspn(s, "=");
    for (size_t i = 0; i < sizeof COMPAT / sizeof *COMPAT; i++)
        for (int k = 0; k < 3 && COMPAT[i].names[k]; k++)
            if (strlen(COMPAT[i].names[k]) == len && !strncmp(COMPAT[i].names[k], s, len)) return (int)i;
    return -1;
}

static bool is_word(const char *const *words, const char *s) {
    for (int i = 0; words && words[i]; i++)
        if (!strcmp(words[i], s)) return true;
    return false;
}

int cli_llama_compat(const char *cmd, int *argc, char **argv, const cli_opt *tab) {
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        char *t = argv[i];
        if (!strcmp(t, "--")) { /* the rest are operands */
            while (i < *argc) argv[out++] = argv[i++];
            break;
        }
        int e = t[0] == '-' && t[1] ? find(t) : -1;
        if (e < 0) { /* kvpin's own: keep it, and its value */
            argv[out++] = t;
            if (t[0] == '-' && t[1] && !strchr(t, '=') && cli_tab_takes_value(tab, t) && i + 1 < *argc)
                argv[out++] = argv[++i];
            continue;
        }
        const char *eq = strchr(t, '=');
        const char *val = eq ? eq + 1 : NULL;
        if (!val && COMPAT[e].arg == VALUE) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "kvpin %s: option '%s' needs a value\n", cmd, t);
                return 2;
            }
            val = argv[++i];
        } else if (!val && COMPAT[e].arg == MAYBE && i + 1 < *argc && is_word(COMPAT[e].words, argv[i + 1])) {
            val = argv[++i];
        }
        size_t nl = eq ? (size_t)(eq - t) : strlen(t);
        if (COMPAT[e].what == REFUSE) {
            fprintf(stderr, "kvpin %s: %.*s: %s\n", cmd, (int)nl, t, COMPAT[e].to);
            return 2;
        }
        if (COMPAT[e].what == NOTE) {
            fprintf(stderr, "kvpin %s: note: %.*s%s%s ignored: %s\n", cmd, (int)nl, t, val ? " " : "", val ? val : "",
                    COMPAT[e].to);
            continue;
        }
        argv[out++] = (char *)COMPAT[e].to; /* MAP */
        argv[out++] = (char *)val;
    }
    argv[out] = NULL;
    *argc = out;
    return 0;
}
