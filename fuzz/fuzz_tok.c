/*
 * fuzz_tok.c - libFuzzer target for the tokenizers: random bytes as text,
 * through every vocabulary in tests/data/vocab/ and the bundled model.
 *
 * Input layout:  byte 0  which vocabulary (modulo the number loaded)
 *                byte 1  bit 0 add_special, bit 1 parse_special,
 *                        bit 2 special pieces when detokenizing
 *                rest    the text (any bytes, not necessarily UTF-8)
 *
 * Per input: kp_tok_encode, then kp_tok_detokenize of the ids, then the
 * ids through a kp_tok_stream. Properties beyond "no sanitizer report":
 * encode fails only with KP_ERANGE (PCRE2's match limit) or KP_ENOMEM;
 * every id is inside the vocabulary; the stream's output is valid UTF-8
 * (strict decoder in src/base/unicode.h); when every piece is valid UTF-8
 * by itself, the stream's output equals the concatenated pieces.
 *
 * The vocabularies are loaded once (LLVMFuzzerInitialize) from
 * $KVPIN_FUZZ_VOCAB (a directory; default tests/data/vocab) plus
 * models/stories260K.gguf, so run it from the repository root.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

#define MAX_VOCABS 32

/* Loaded once before the first input and never changed: the fuzzer's
 * fixture, not library state. */
static kp_tok_vocab *vocabs[MAX_VOCABS];
static kp_gguf *files[MAX_VOCABS];
static int n_vocabs;

static void load(const char *path) {
    kp_error err;
    kp_gguf *g;
    kp_tok_vocab *v;
    if (n_vocabs == MAX_VOCABS || kp_gguf_open(&g, path, &err) != KP_OK) return;
    if (kp_tok_vocab_load(&v, g, &err) != KP_OK) {
        kp_gguf_close(g);
        return;
    }
    files[n_vocabs] = g;
    vocabs[n_vocabs++] = v;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("KVPIN_FUZZ_VOCAB");
    if (!dir) dir = "tests/data/vocab";
    DIR *d = opendir(dir);
    char *names[MAX_VOCABS];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < MAX_VOCABS;) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf")) {
            names[n] = malloc(strlen(dir) + l + 2);
            if (names[n]) sprintf(names[n++], "%s/%s", dir, e->d_name);
        }
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str); /* the same order on every machine */
    load("models/stories260K.gguf");
    for (int i = 0; i < n; i++) {
        load(names[i]);
        free(names[i]);
    }
    if (n_vocabs == 0) {
        fprintf(stderr, "fuzz_tok: no vocabulary loaded (run from the repository root)\n");
        abort();
    }
    return 0;
}

/* Appends n bytes to the malloc'd *buf of *len bytes; false when out of memory. */
static bool append(char **buf, size_t *len, const char *b, size_t n) {
    char *nb = realloc(*buf, *len + n + 1);
    if (!nb) return false;
    if (n) memcpy(nb + *len, b, n);
    *buf = nb;
    *len += n;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const kp_tok_vocab *v = vocabs[data[0] % n_vocabs];
    bool add_special = data[1] & 1, parse_special = data[1] & 2, special = data[1] & 4;
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    kp_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    kp_status st = kp_tok_encode(v, text, len, add_special, parse_special, &ids, &n, &err);
    if (st != KP_OK) {
        REQUIRE(st == KP_ERANGE || st == KP_ENOMEM);
        REQUIRE(ids == NULL && err.msg[0]);
        return 0;
    }
    int32_t nv = kp_tok_n_vocab(v);
    for (size_t i = 0; i < n; i++) REQUIRE(ids[i] >= 0 && ids[i] < nv);
    char *out = NULL;
    size_t out_len = 0;
    if (kp_tok_detokenize(v, ids, n, false, special, &out, &out_len, &err) == KP_OK) free(out);
    kp_tok_stream *s = NULL;
    if (kp_tok_stream_new(&s, v, special, &err) == KP_OK) {
        char *all = NULL, *pieces = NULL;
        size_t all_n = 0, pieces_n = 0;
        bool pieces_valid = true, ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            const char *b, *p;
            size_t bn, pl;
            if (kp_tok_stream_push(s, ids[i], &b, &bn, &err) != KP_OK) {
                ok = false;
                break;
            }
            p = kp_tok_piece_view(v, ids[i], special, &pl);
            REQUIRE(p != NULL);
            pieces_valid = pieces_valid && kp_unicode_utf8_valid((const uint8_t *)p, pl);
            ok = append(&all, &all_n, b, bn) && append(&pieces, &pieces_n, p, pl);
        }
        const char *b;
        size_t bn;
        kp_tok_stream_flush(s, &b, &bn);
        if (ok && append(&all, &all_n, b, bn)) {
            REQUIRE(kp_unicode_utf8_valid((const uint8_t *)all, all_n));
            if (pieces_valid) REQUIRE(all_n == pieces_n && (all_n == 0 || !memcmp(all, pieces, all_n)));
        }
        free(all);
        free(pieces);
        kp_tok_stream_free(s);
    }
    free(ids);
    return 0;
}
