/*
 * llamacpp_logits.c - one golden case of tests/data/golden/ computed by
 * llama.cpp's public C API (libllama), with nothing of kvpin taking part:
 * the logits of every prompt position and the greedy continuation, in the
 * format that folder's README describes (NAME.json + NAME.logits.f32).
 *
 *   llamacpp_logits MODEL.gguf PROMPT.txt OUTDIR PROMPT_ID [N_GREEDY [decode]]
 *
 * writes OUTDIR/<model file without .gguf>.<PROMPT_ID>.json and
 * .logits.f32. The settings are the README's, identical for every case:
 *
 *   - CPU only, n_threads = n_threads_batch = 2;
 *   - K and V cache F32, flash attention disabled;
 *   - n_ctx = n_batch = n_ubatch = (n_tokens + 32) rounded up to 256: the
 *     prompt is one llama_decode and one ubatch, logits for every position;
 *   - tokens: llama_tokenize(prompt, add_special = the vocabulary's
 *     add_bos, parse_special = false); an empty result is [bos]
 *     (bos_forced);
 *   - greedy: N_GREEDY tokens (default 32), the argmax (ties to the lowest
 *     id) after each single-token llama_decode; stops after an EOG token.
 *
 * With `decode` the prompt goes in one llama_decode per token instead
 * (llama.cpp's decode kernels: the README's decode_path variation) and
 * only NAME.decode.logits.f32 is written: how far llama.cpp lands from
 * itself, the floor of any tolerance against its goldens.
 *
 * What it does not do: sample, use several sequences, or write more than
 * the fields a kvpin test reads and a reader needs to trust them (model,
 * reference, settings, prompt, tokens, logits, greedy and its margins).
 *
 * Build against a llama.cpp tree built with CMake (LLAMA=/work/peer/llama.cpp):
 *
 *   cc -std=c11 -O1 -o build/llamacpp_logits tools/llamacpp_logits.c \
 *      -I$LLAMA/include -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama -lggml -lggml-base \
 *      -Wl,-rpath,$LLAMA/build/bin -lm
 *
 * tests/data/golden/make_gemma3.sh makes the gemma3 cases with it.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>

#define MAX_GREEDY 256

/* The whole of a small file, NUL-terminated; NULL on failure. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = (n + 4096 + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* s as a JSON string: quotes, backslashes and control bytes escaped, every
 * other byte (UTF-8 included) as it is. */
static void json_str(FILE *o, const char *s, size_t n) {
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(o, "\\%c", c);
        else if (c == '\n') fputs("\\n", o);
        else if (c == '\t') fputs("\\t", o);
        else if (c < 0x20) fprintf(o, "\\u%04x", c);
        else fputc(c, o);
    }
    fputc('"', o);
}

/* The argmax of logits (ties to the lowest id) and its lead over the
 * runner-up. */
static int32_t argmax(const float *l, int n, float *max, float *margin) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && l[i] > second) second = l[i];
    *max = l[best];
    *margin = l[best] - second;
    return best;
}

typedef struct {
    int32_t tok[MAX_GREEDY];
    float max[MAX_GREEDY], margin[MAX_GREEDY];
    int n;
    bool eog;
} greedy_run;

/* Greedy after the prompt: step i's token from the logits after the step
 * before, each next token fed alone at the next position. */
static bool run_greedy(struct llama_context *ctx, const struct llama_vocab *vocab, const float *last, int n_vocab,
                       int n_greedy, greedy_run *g) {
    const float *l = last;
    g->n = 0;
    g->eog = false;
    for (int i = 0; i < n_greedy; i++) {
        int32_t t = argmax(l, n_vocab, &g->max[i], &g->margin[i]);
        g->tok[g->n++] = t;
        if (llama_vocab_is_eog(vocab, t)) {
            g->eog = true;
            break;
        }
        if (i + 1 == n_greedy) break;
        struct llama_batch b = llama_batch_get_one(&g->tok[i], 1);
        if (llama_decode(ctx, b) != 0) return false;
        l = llama_get_logits_ith(ctx, -1);
        if (!l) return false;
    }
    return true;
}

static void write_json(FILE *o, const char *model_file, const char *prompt_id, const char *prompt, size_t prompt_len,
                       const int32_t *toks, int n, bool add_bos, bool bos_forced, int n_vocab,
                       const struct llama_vocab *vocab, const char *logits_file, const greedy_run *g) {
    fprintf(o, "{\n  \"model\": \"%s\",\n  \"model_path\": \"tests/data/models/%s\",\n", model_file, model_file);
    fputs("  \"reference\": \"llama.cpp de3ff815ea7d\",\n", o);
    fputs("  \"settings\": {\"n_threads\": 2, \"type_k\": \"f32\", \"type_v\": \"f32\", \"flash_attn\": false, "
          "\"one_ubatch\": true},\n",
          o);
    fprintf(o, "  \"prompt_id\": \"%s\",\n  \"prompt\": ", prompt_id);
    json_str(o, prompt, prompt_len);
    fprintf(o, ",\n  \"add_bos\": %s,\n  \"bos_forced\": %s,\n  \"tokens\": [", add_bos ? "true" : "false",
            bos_forced ? "true" : "false");
    for (int i = 0; i < n; i++) fprintf(o, "%s%d", i ? ", " : "", toks[i]);
    fprintf(o, "],\n  \"n_tokens\": %d,\n  \"n_vocab\": %d,\n  \"bos_id\": %d,\n  \"eos_id\": %d,\n", n, n_vocab,
            llama_vocab_bos(vocab), llama_vocab_eos(vocab));
    fprintf(o, "  \"logits_file\": \"%s\",\n  \"logits_positions\": [", logits_file);
    for (int i = 0; i < n; i++) fprintf(o, "%s%d", i ? ", " : "", i);
    fputs("],\n  \"greedy\": [", o);
    for (int i = 0; i < g->n; i++) fprintf(o, "%s%d", i ? ", " : "", g->tok[i]);
    fputs("],\n  \"greedy_max_logit\": [", o);
    for (int i = 0; i < g->n; i++) fprintf(o, "%s%.9g", i ? ", " : "", g->max[i]);
    fputs("],\n  \"greedy_margin\": [", o);
    for (int i = 0; i < g->n; i++) fprintf(o, "%s%.9g", i ? ", " : "", g->margin[i]);
    fprintf(o, "],\n  \"stop_reason\": \"%s\"\n}\n", g->eog ? "eog" : "length");
}

/* The prompt's tokens as the README says; *bos_forced when the tokenizer
 * gave none. Returns the count, -1 on failure. */
static int tokenize(const struct llama_vocab *vocab, const char *text, size_t len, int32_t **out, bool *add_bos,
                    bool *bos_forced) {
    *add_bos = llama_vocab_get_add_bos(vocab);
    int cap = (int)len + 8;
    int32_t *toks = malloc((size_t)cap * sizeof *toks);
    if (!toks) return -1;
    int n = llama_tokenize(vocab, text, (int32_t)len, toks, cap, *add_bos, false);
    if (n < 0) {
        free(toks);
        return -1;
    }
    *bos_forced = n == 0;
    if (n == 0) toks[n++] = llama_vocab_bos(vocab);
    *out = toks;
    return n;
}

/* The prompt one token per llama_decode; each position's logits to f. */
static bool prefill_by_token(struct llama_context *ctx, const int32_t *toks, int n, int n_vocab, FILE *f) {
    for (int i = 0; i < n; i++) {
        struct llama_batch b = llama_batch_get_one((int32_t *)&toks[i], 1);
        if (llama_decode(ctx, b) != 0) return false;
        fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), (size_t)n_vocab, f);
    }
    return true;
}

/* The prompt in one decode with logits for every position; writes them to
 * path. Returns the logits of the last position (owned by ctx) or NULL. */
static const float *prefill(struct llama_context *ctx, const int32_t *toks, int n, int n_vocab, const char *path) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) return NULL;
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)n_vocab, f);
    if (fclose(f) != 0) return NULL;
    return llama_get_logits_ith(ctx, n - 1);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: llamacpp_logits MODEL.gguf PROMPT.txt OUTDIR PROMPT_ID [N_GREEDY]\n");
        return 2;
    }
    int n_greedy = argc > 5 ? atoi(argv[5]) : 32;
    if (n_greedy < 1 || n_greedy > MAX_GREEDY) n_greedy = 32;
    size_t plen = 0;
    char *prompt = read_file(argv[2], &plen);
    if (!prompt) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    int32_t *toks = NULL;
    bool add_bos = false, bos_forced = false;
    int n = tokenize(vocab, prompt, plen, &toks, &add_bos, &bos_forced);
    if (n < 0) return 1;
    struct llama_context_params cp = llama_context_default_params();
    uint32_t n_ctx = (uint32_t)(n + n_greedy + 32 + 255) / 256 * 256;
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    /* names: the model file without its folder and .gguf */
    const char *base = strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1];
    char stem[256], logits_file[512], path[1024];
    snprintf(stem, sizeof stem, "%.*s", (int)(strlen(base) > 5 ? strlen(base) - 5 : strlen(base)), base);
    bool by_token = argc > 6 && !strcmp(argv[6], "decode");
    snprintf(logits_file, sizeof logits_file, "%s.%s%s.logits.f32", stem, argv[4], by_token ? ".decode" : "");
    snprintf(path, sizeof path, "%s/%s", argv[3], logits_file);
    if (by_token) {
        FILE *f = fopen(path, "wb");
        bool ok = f && prefill_by_token(ctx, toks, n, n_vocab, f);
        if (f && fclose(f) != 0) ok = false;
        fprintf(stderr, "%s: %d tokens one by one%s\n", path, n, ok ? "" : ": FAILED");
        return ok ? 0 : 1;
    }
    const float *last = prefill(ctx, toks, n, n_vocab, path);
    static greedy_run g;
    if (!last || !run_greedy(ctx, vocab, last, n_vocab, n_greedy, &g)) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    snprintf(path, sizeof path, "%s/%s.%s.json", argv[3], stem, argv[4]);
    FILE *o = fopen(path, "w");
    if (!o) return 1;
    write_json(o, base, argv[4], prompt, plen, toks, n, add_bos, bos_forced, n_vocab, vocab, logits_file, &g);
    fclose(o);
    fprintf(stderr, "%s: %d tokens, %d greedy\n", path, n, g.n);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(toks);
    free(prompt);
    return 0;
}
