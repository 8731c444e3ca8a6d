/*
 * fuzz_grammar.c - libFuzzer target for the grammar compilers and the
 * matcher (src/grammar/): what a client sends as response_format's schema,
 * json_schema or grammar, then what a model writes under it.
 *
 * Input layout:  byte 0  bit 0: GBNF (else a JSON Schema)
 *                        bits 1-3: whitespace bound of the schema (0..7)
 *                rest    up to the first NUL byte: the schema / grammar
 *                        text; after it: bytes fed to the matcher
 *
 * Per input: compile; a refusal carries a status and a message. A grammar
 * that compiles gets a matcher over a small vocabulary (every byte, a few
 * JSON pieces, an end token); the bytes after the NUL are fed to it until
 * one is refused. Properties beyond "no sanitizer report": at every state
 * reached, the token mask allows a token exactly when a clone of the
 * matcher accepts that token's bytes (spot-checked on a rotating sample);
 * the shortest completion, when there is one, is accepted and leaves the
 * matcher complete; the matcher's reset returns it to the start.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "grammar/grammar.h"

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

#define MAX_TEXT 4096
#define MAX_FEED 256

static kp_gvocab *vocab(void) {
    static char bytes[256];
    static const char *const extra[] = {"{\"", "\":", "\",\"", "\"}", "true", "null", "[1,", "]", "0.5", "-1", "\\u00e9"};
    enum { N = 256 + sizeof extra / sizeof extra[0] + 1 };
    const char *pieces[N];
    size_t lens[N];
    uint8_t eog[N] = {0};
    int32_t k = 0;
    for (int b = 0; b < 256; b++, k++) {
        bytes[b] = (char)b;
        pieces[k] = &bytes[b];
        lens[k] = 1;
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++, k++) {
        pieces[k] = extra[i];
        lens[k] = strlen(extra[i]);
    }
    pieces[k] = "";
    lens[k] = 0;
    eog[k++] = 1;
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    REQUIRE(kp_gvocab_new_raw(&gv, k, pieces, lens, eog, &err) == KP_OK);
    return gv;
}

static bool bit(const uint32_t *m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1; }

/* The mask against a clone fed each of a sample of tokens' bytes. */
static void check_mask(kp_gmatch *m, uint32_t *mask, uint32_t salt) {
    kp_error err = {0};
    size_t n_allowed = 0;
    if (kp_gmatch_mask(m, mask, &n_allowed, &err) != KP_OK) return; /* a node cap: refused, not wrong */
    for (int32_t id = (int32_t)(salt % 7); id < 256; id += 7) {
        kp_gmatch *c = NULL;
        if (kp_gmatch_clone(&c, m, &err) != KP_OK) return;
        char b = (char)id;
        bool ok = kp_gmatch_accept_bytes(c, &b, 1, &err) == KP_OK;
        REQUIRE(ok == bit(mask, id));
        kp_gmatch_free(c);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kp_gvocab *gv;
    if (!gv) gv = vocab();
    if (size < 1) return 0;
    bool gbnf = data[0] & 1;
    const char *text = (const char *)data + 1;
    size_t rest = size - 1;
    const char *nul = memchr(text, 0, rest);
    size_t tlen = nul ? (size_t)(nul - text) : rest;
    if (tlen > MAX_TEXT) return 0;
    const char *feed = nul ? nul + 1 : text + rest;
    size_t flen = (size_t)(text + rest - feed);
    if (flen > MAX_FEED) flen = MAX_FEED;

    kp_grammar *g = NULL;
    kp_error err = {0};
    kp_status st;
    if (gbnf) {
        st = kp_grammar_compile_gbnf(text, tlen, &g, &err);
    } else {
        json_error_t je;
        json_t *s = json_loadb(text, tlen, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!s) return 0;
        kp_schema_opts o = kp_schema_opts_default();
        o.ws_max = (data[0] >> 1) & 7;
        st = kp_grammar_compile_schema(s, &o, &g, &err);
        json_decref(s);
    }
    if (st != KP_OK) {
        REQUIRE(g == NULL && err.msg[0]);
        return 0;
    }
    REQUIRE(g != NULL && kp_grammar_n_rules(g) > 0);
    kp_gmatch *m = NULL;
    if (kp_gmatch_new(&m, g, gv, &err) != KP_OK) {
        REQUIRE(err.msg[0]);
        kp_grammar_free(g);
        return 0;
    }
    uint32_t *mask = malloc(kp_gvocab_mask_words(gv) * sizeof *mask);
    REQUIRE(mask != NULL);
    check_mask(m, mask, 0);
    for (size_t i = 0; i < flen; i++) {
        if (kp_gmatch_accept_bytes(m, feed + i, 1, &err) != KP_OK) break;
        if (i % 16 == 15) check_mask(m, mask, (uint32_t)i);
    }
    /* the shortest way to a complete document from here is one */
    kp_buf done = {0};
    if (kp_gmatch_completion(m, 4096, &done, &err) == KP_OK) {
        kp_gmatch *c = NULL;
        if (kp_gmatch_clone(&c, m, &err) == KP_OK) {
            kp_status ast = kp_gmatch_accept_bytes(c, done.data, done.len, &err);
            REQUIRE(ast == KP_OK || ast == KP_EFULL); /* EFULL: the matcher's depth bound, not a wrong grammar */
            REQUIRE(ast != KP_OK || kp_gmatch_complete(c));
            kp_gmatch_free(c);
        }
    }
    kp_buf_free(&done);
    kp_gmatch_reset(m);
    kp_gmatch_free(m);
    kp_grammar_free(g);
    free(mask);
    return 0;
}
