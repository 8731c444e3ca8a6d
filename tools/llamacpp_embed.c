/*
 * llamacpp_embed.c - reference embeddings computed by llama.cpp's public C
 * API (libllama), with nothing of kvpin taking part, for
 * tests/data/golden/embeddings.json (tests/e2e/embeddings_e2e.py).
 *
 *   llamacpp_embed MODEL.gguf mean|last TEXT...
 *
 * prints one JSON object: {"reference", "model", "pooling", "cases":
 * [{"text", "tokens", "embedding"}]}, each embedding L2-normalized as
 * llama-server's OpenAI endpoint returns it. Settings: CPU only, 2 threads,
 * embeddings on, the pooling asked (LLAMA_POOLING_TYPE_MEAN / _LAST), K and
 * V cache F32, flash attention off, n_ctx = n_batch = n_ubatch = 512, one
 * sequence per text (the memory cleared in between); tokens by
 * llama_tokenize(text, add_special = true, parse_special = false).
 *
 * Build against a llama.cpp tree built with CMake (LLAMA=/work/peer/llama.cpp):
 *
 *   cc -std=c11 -O1 -o build/llamacpp_embed tools/llamacpp_embed.c \
 *      -I$LLAMA/include -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama -lggml -lggml-base \
 *      -Wl,-rpath,$LLAMA/build/bin -lm
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>

static void put_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[2], "mean") && strcmp(argv[2], "last"))) {
        fprintf(stderr, "usage: llamacpp_embed MODEL.gguf mean|last TEXT...\n");
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.embeddings = true;
    cp.pooling_type = !strcmp(argv[2], "mean") ? LLAMA_POOLING_TYPE_MEAN : LLAMA_POOLING_TYPE_LAST;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_embd = llama_model_n_embd(model);
    printf("{\"reference\": \"llama.cpp de3ff815ea7d (libllama)\", \"model\": ");
    const char *base = strrchr(argv[1], '/');
    put_json_string(base ? base + 1 : argv[1]);
    printf(", \"pooling\": \"%s\", \"cases\": [", argv[2]);
    for (int a = 3; a < argc; a++) {
        llama_token toks[512];
        int n = llama_tokenize(vocab, argv[a], (int)strlen(argv[a]), toks, 512, true, false);
        if (n <= 0) return 1;
        llama_memory_clear(llama_get_memory(ctx), true);
        struct llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = toks[i];
            b.pos[i] = i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = n;
        if (llama_decode(ctx, b)) return 1;
        const float *e = llama_get_embeddings_seq(ctx, 0);
        if (!e) return 1;
        double norm = 0;
        for (int j = 0; j < n_embd; j++) norm += (double)e[j] * e[j];
        norm = sqrt(norm);
        printf("%s\n {\"text\": ", a > 3 ? "," : "");
        put_json_string(argv[a]);
        printf(", \"tokens\": [");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", toks[i]);
        printf("], \"embedding\": [");
        for (int j = 0; j < n_embd; j++) printf("%s%.9g", j ? ", " : "", norm > 0 ? e[j] / norm : e[j]);
        printf("]}");
        llama_batch_free(b);
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
