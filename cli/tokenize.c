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

#include "base/buf.h"
#include "cli.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

static bool open_vocab(const char *path, kp_gguf **g, kp_tok_vocab **v, const char *cmd) {
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

static const cli_opt tokenize_tab[] = {CLI_USE(CLI_MODEL), CLI_USE(CLI_NO_BOS), CLI_USE(CLI_SPECIAL), {0}};
static const cli_opt detokenize_tab[] = {CLI_USE(CLI_MODEL), CLI_USE(CLI_SPECIAL), {0}};

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: kvpin tokenize [options] < text\n"
               "Reads all of stdin as UTF-8 and prints the token ids on one line.\n");
    cli_print_options(f, tokenize_tab);
}
static void detokenize_usage(FILE *f) {
    fprintf(f, "usage: kvpin detokenize [options] [ID ...]\n"
               "Prints the text of the ids (from the arguments, or stdin when none).\n");
    cli_print_options(f, detokenize_tab);
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    bool no_bos = false, special = false;
    cli_args a;
    cli_args_init(&a, "tokenize", tokenize_tab, tokenize_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == CLI_STOP) return a.rc;
        if (k == CLI_MODEL) path = a.val;
        else if (k == CLI_NO_BOS) no_bos = true;
        else if (k == CLI_SPECIAL) special = true;
    }
    if (!cli_args_no_operands(&a)) return 2;
    kp_gguf *g;
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
    cli_args a;
    cli_args_init(&a, "detokenize", detokenize_tab, detokenize_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == CLI_STOP) return a.rc;
        if (k == CLI_MODEL) path = a.val;
        else if (k == CLI_SPECIAL) special = true;
    }
    int first_id = a.first_arg;
    kp_gguf *g;
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
        if (!kp_grow((void **)&ids, &cap, n + 1, sizeof *ids)) goto done;
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
