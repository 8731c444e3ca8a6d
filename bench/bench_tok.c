/*
 * bench_tok.c - tokenizer throughput on ~1 MB of English-like text.
 *
 * The text is made deterministically (no downloads): sentences drawn with a
 * fixed-seed LCG from a list of common English words, with capitals,
 * commas, full stops, the odd number and quote, and paragraph breaks, plus
 * llama.cpp's 46 tokenizer test strings (tests/data/vocab, the .inp files) mixed in
 * every few sentences. Each vocabulary tokenizes the whole text as one call
 * (add_special = false, parse_special = false), best of three runs.
 *
 * Build and run from the repository root:
 *
 *   cc -std=c11 -O2 -D_GNU_SOURCE -Isrc -o build/bench_tok bench/bench_tok.c \
 *      src/tok/tok*.c src/base/unicode.c src/gguf/gguf.c src/gguf/dtype.c src/base/status.c -lpcre2-8 -lm
 *   build/bench_tok [vocab.gguf ...]
 *
 * Without arguments it uses the SPM and BPE vocabularies in tests/data/vocab.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "tok/tok.h"

#define TARGET_BYTES (1u << 20)

static const char *const words[] = {
    "the", "be", "to", "of", "and", "a", "in", "that", "have", "it", "for", "not", "on", "with",
    "he", "as", "you", "do", "at", "this", "but", "his", "by", "from", "they", "we", "say", "her",
    "she", "or", "an", "will", "my", "one", "all", "would", "there", "their", "what", "so", "up",
    "out", "if", "about", "who", "get", "which", "go", "me", "when", "make", "can", "like", "time",
    "no", "just", "him", "know", "take", "people", "into", "year", "your", "good", "some", "could",
    "them", "see", "other", "than", "then", "now", "look", "only", "come", "its", "over", "think",
    "also", "back", "after", "use", "two", "how", "our", "work", "first", "well", "way", "even",
    "new", "want", "because", "any", "these", "give", "day", "most", "us", "little", "girl",
    "named", "Lily", "park", "happy", "played", "together", "morning", "garden", "friend", "house",
    "beautiful", "understand", "question", "government", "information", "development", "system",
    "important", "different", "following", "without", "program", "problem", "however", "another",
    "company", "everything", "something", "children", "remember", "language", "computer",
    "tokenizer", "inference", "server", "cache", "memory", "prefix", "don't", "it's", "we're",
    "they've", "I'll", "she'd", "isn't",
};

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

typedef struct {
    char *d;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
    while (b->n + n + 1 > b->cap) {
        b->cap = b->cap ? b->cap * 2 : 4096;
        b->d = realloc(b->d, b->cap);
        if (!b->d) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    memcpy(b->d + b->n, s, n);
    b->n += n;
    b->d[b->n] = 0;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static char *make_text(size_t *len) {
    size_t inp_n = 0;
    char *inp = NULL;
    FILE *f = fopen("tests/data/vocab/ggml-vocab-gpt-2.gguf.inp", "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        inp = malloc((size_t)n + 1);
        if (inp && fread(inp, 1, (size_t)n, f) == (size_t)n) {
            inp[n] = 0;
            inp_n = (size_t)n;
        }
        fclose(f);
    }
    const char *cases[64];
    size_t case_len[64], n_cases = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    for (char *p = inp, *q; inp_n && (q = strstr(p, sep)) && n_cases < 64; p = q + strlen(sep)) {
        cases[n_cases] = p;
        case_len[n_cases++] = (size_t)(q - p);
    }

    buf b = {0};
    uint32_t seed = 12345;
    size_t n_words = sizeof words / sizeof words[0];
    for (unsigned sentence = 0; b.n < TARGET_BYTES; sentence++) {
        unsigned len = 6 + lcg(&seed) % 14;
        for (unsigned i = 0; i < len; i++) {
            const char *w = words[lcg(&seed) % n_words];
            if (i == 0) {
                char c = w[0] >= 'a' && w[0] <= 'z' ? (char)(w[0] - 32) : w[0];
                put(&b, &c, 1);
                puts_(&b, w + 1);
            } else {
                uint32_t r = lcg(&seed) % 100;
                if (r < 6) {
                    char num[16];
                    snprintf(num, sizeof num, " %u", lcg(&seed) % 2000);
                    puts_(&b, num);
                } else if (r < 8) {
                    puts_(&b, " \"");
                    puts_(&b, w);
                    puts_(&b, "\"");
                    continue;
                }
                puts_(&b, lcg(&seed) % 9 == 0 ? ", " : " ");
                puts_(&b, w);
            }
        }
        puts_(&b, lcg(&seed) % 7 == 0 ? "?" : ".");
        if (n_cases && sentence % 5 == 4) {
            size_t k = lcg(&seed) % n_cases;
            puts_(&b, " ");
            put(&b, cases[k], case_len[k]);
        }
        puts_(&b, sentence % 9 == 8 ? "\n\n" : " ");
    }
    free(inp);
    *len = b.n;
    return b.d;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench(const char *path, const char *text, size_t len) {
    kp_error err = {0};
    kp_gguf *g;
    kp_tok_vocab *v;
    double t0 = now_s();
    if (kp_gguf_open(&g, path, &err) != KP_OK || kp_tok_vocab_load(&v, g, &err) != KP_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return 1;
    }
    kp_gguf_close(g);
    double t_load = now_s() - t0, best = 1e9;
    size_t n_ids = 0;
    for (int rep = 0; rep < 3; rep++) {
        int32_t *ids;
        t0 = now_s();
        if (kp_tok_encode(v, text, len, false, false, &ids, &n_ids, &err) != KP_OK) {
            fprintf(stderr, "%s: %s\n", path, err.msg);
            kp_tok_vocab_free(v);
            return 1;
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
        free(ids);
    }
    const char *name = strrchr(path, '/');
    printf("%-34s %-5s %-15s load %6.1f ms  %8zu tokens  %7.1f ms  %6.2f MB/s\n", name ? name + 1 : path,
           kp_tok_model_name(v), kp_tok_pre_name(v), t_load * 1e3, n_ids, best * 1e3, len / best / 1e6);
    kp_tok_vocab_free(v);
    return 0;
}

int main(int argc, char **argv) {
    static const char *const defaults[] = {
        "tests/data/vocab/ggml-vocab-llama-spm.gguf",
        "tests/data/vocab/ggml-vocab-gpt-2.gguf",
        "tests/data/vocab/gen-qwen2-vocab.gguf",
        "tests/data/vocab/ggml-vocab-deepseek-llm.gguf",
    };
    size_t len;
    char *text = make_text(&len);
    printf("text: %zu bytes of generated English\n", len);
    int rc = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++) rc |= bench(argv[i], text, len);
    } else {
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) rc |= bench(defaults[i], text, len);
    }
    free(text);
    return rc;
}
