/*
 * tokenize.c - `kvpin tokenize` and `kvpin detokenize`.
 *
 * tokenize reads ALL of stdin as bytes (no newline added or removed) and
 * prints the ids space-separated on one line. detokenize reads ids (from
 * the arguments, or stdin) and prints the text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

static bool open_vocab(const char *path, gguf **g, kp_tok_vocab **v, const char *cmd) {
    kp_error err = {0};
    *g = NULL;
    *v = NULL;
    if (kp_gguf_open(g, path ? path : cli_default_model(), &err) != KP_OK ||
        kp_tok_vocab_load(v, *g, &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        kp_gguf_close(*g);
        return false;
    }
    const char *warn = kp_tok_warnings(*v);
    if (warn) fprintf(stderr, "kvpin %s: warning: %s\n", cmd, warn);
    return true;
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    bool no_bos = false, special = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--no-bos")) no_bos = true;
        else if (!strcmp(argv[i], "--special")) special = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvpin tokenize [-m MODEL] [--no-bos] [--special] < text\n"
                   "Reads all of stdin as UTF-8 and prints the token ids on one line.\n"
                   "--no-bos: add neither BOS nor EOS. --special: parse special-token text\n"
                   "(e.g. <|im_start|>) into its id.\n");
            return 0;
        } else {
            fprintf(stderr, "kvpin tokenize: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    gguf *g;
    kp_tok_vocab *v;
    if (!open_vocab(path, &g, &v, "tokenize")) return 1;
    size_t len;
    char *text = cli_read_all("-", &len);
    int rc = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    kp_error err = {0};
    if (text) {
        if (kp_tok_encode(v, text, len, !no_bos, special, &ids, &n, &err) != KP_OK) {
            fprintf(stderr, "kvpin tokenize: %s\n", err.msg);
        } else {
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
            printf("\n");
            rc = 0;
        }
    }
    free(ids);
    free(text);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *path = NULL;
    bool special = false;
    int first_id = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--special")) special = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvpin detokenize [-m MODEL] [--special] [ID ...]\n"
                   "Prints the text of the ids (from the arguments, or stdin when none).\n");
            return 0;
        } else if (argv[i][0] == '-' && (argv[i][1] < '0' || argv[i][1] > '9')) {
            fprintf(stderr, "kvpin detokenize: unknown argument '%s'\n", argv[i]);
            return 2;
        } else {
            first_id = i;
            break;
        }
    }
    gguf *g;
    kp_tok_vocab *v;
    if (!open_vocab(path, &g, &v, "detokenize")) return 1;
    char *input = NULL;
    size_t len = 0;
    if (first_id == argc) {
        input = cli_read_all("-", &len);
        if (!input) {
            kp_tok_vocab_free(v);
            kp_gguf_close(g);
            return 1;
        }
    }
    size_t cap = 64, n = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    int rc = 1;
    const char *p = input;
    for (int i = first_id; ids; ) {
        const char *word;
        char *end;
        if (input) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
            if (!*p) break;
            word = p;
        } else {
            if (i >= argc) break;
            word = argv[i++];
        }
        long id = strtol(word, &end, 10);
        if (end == word || (!input && *end) || id < 0 || id >= kp_tok_n_vocab(v)) {
            fprintf(stderr, "kvpin detokenize: '%.20s' is not a token id of this vocabulary (0..%d)\n",
                    word, kp_tok_n_vocab(v) - 1);
            goto done;
        }
        if (input) p = end;
        if (n == cap) {
            int32_t *ni = realloc(ids, cap * 2 * sizeof(int32_t));
            if (!ni) goto done;
            ids = ni;
            cap *= 2;
        }
        ids[n++] = (int32_t)id;
    }
    char *text = NULL;
    size_t tl = 0;
    kp_error err = {0};
    if (ids && kp_tok_detokenize(v, ids, n, false, special, &text, &tl, &err) == KP_OK) {
        fwrite(text, 1, tl, stdout);
        free(text);
        rc = 0;
    } else if (ids) {
        fprintf(stderr, "kvpin detokenize: %s\n", err.msg);
    }
done:
    free(ids);
    free(input);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
    return rc;
}
