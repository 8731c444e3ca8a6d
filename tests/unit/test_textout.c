/*
 * test_textout.c - released text with stop strings.
 *
 * Reference: the concatenated pieces of the generated ids (kp_tok_stream's
 * contract for valid UTF-8; ids are drawn among tokens whose piece is
 * complete, valid UTF-8). For random
 * token streams over two vocabularies (SPM stories260K, BPE gpt-2) and stop
 * strings picked from the expected text itself (so they straddle token and
 * UTF-8 boundaries), the concatenation of everything released must equal
 * the full text cut right before the first occurrence of any stop string,
 * or the whole text when none occurs, and `stopped` must be reported at the
 * first token whose text completes a stop string.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tok/textout.h"

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static kp_tok_vocab *load(const char *rel, kp_gguf **g) {
    kp_error err = {0};
    kp_tok_vocab *v = NULL;
    if (kp_gguf_open(g, harness_path(rel), &err) != KP_OK || kp_tok_vocab_load(&v, *g, &err) != KP_OK) {
        CHECK_MSG(false, "%s: %s", rel, err.msg);
        return NULL;
    }
    return v;
}

/* Whole, valid UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        uint32_t cp = k == 1 ? c : c & (0x7f >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return false;
        i += k;
    }
    return true;
}

static void random_streams(const char *rel) {
    kp_gguf *g = NULL;
    kp_tok_vocab *v = load(rel, &g);
    if (!v) return;
    kp_error err = {0};
    int32_t nv = kp_tok_n_vocab(v);
    int n_stopped = 0;
    for (int round = 0; round < 300; round++) {
        int32_t ids[40];
        int n = 1 + (int)rnd(40);
        char *full = malloc(40 * 64 + 1);
        size_t fl = 0, pl;
        for (int i = 0; i < n; i++) {
            const char *pc;
            do {
                ids[i] = (int32_t)rnd((uint32_t)nv);
                pc = kp_tok_piece_view(v, ids[i], false, &pl);
            } while (!pc || pl == 0 || pl > 64 || !valid_utf8((const unsigned char *)pc, pl));
            memcpy(full + fl, pc, pl);
            fl += pl;
        }
        /* stops: pieces of the expected text, or text that is not in it */
        char sbuf[3][8];
        const char *stops[3];
        int ns = (int)rnd(4);
        for (int k = 0; k < ns; k++) {
            if (fl > 2 && rnd(3)) {
                size_t at = rnd((uint32_t)fl - 1), len = 1 + rnd(6);
                if (at + len > fl) len = fl - at;
                memcpy(sbuf[k], full + at, len);
                sbuf[k][len] = 0;
            } else {
                strcpy(sbuf[k], "\x01zq\x02");
            }
            if (!sbuf[k][0]) strcpy(sbuf[k], "#");
            stops[k] = sbuf[k];
        }
        /* expected: full text up to the earliest stop occurrence */
        size_t cut = fl;
        for (int k = 0; k < ns; k++) {
            char *f = memmem(full, fl, stops[k], strlen(stops[k]));
            if (f && (size_t)(f - full) < cut) cut = (size_t)(f - full);
        }
        kp_textout *t = NULL;
        CHECK(kp_textout_new(&t, v, stops, ns, false, false, &err) == KP_OK);
        char *got = malloc(fl + 64);
        size_t gl = 0;
        bool stopped = false;
        for (int i = 0; i < n && !stopped; i++) {
            const char *txt;
            size_t nt;
            CHECK(kp_textout_push(t, ids[i], &txt, &nt, &stopped, &err) == KP_OK);
            CHECK(gl + nt <= fl);
            if (gl + nt > fl) break;
            memcpy(got + gl, txt, nt);
            gl += nt;
            if (stopped) { /* the pieces of ids[0..i] hold a whole stop string, those before do not */
                size_t upto = 0, before = 0;
                for (int j = 0; j <= i; j++) {
                    before = upto;
                    kp_tok_piece_view(v, ids[j], false, &pl);
                    upto += pl;
                }
                bool holds = false, held = false;
                for (int k = 0; k < ns; k++) {
                    holds |= memmem(full, upto, stops[k], strlen(stops[k])) != NULL;
                    held |= memmem(full, before, stops[k], strlen(stops[k])) != NULL;
                }
                CHECK_MSG(holds && !held, "round %d: stopped at token %d too early or late", round, i);
            }
        }
        if (!stopped) {
            const char *txt;
            size_t nt;
            kp_textout_finish(t, &txt, &nt);
            if (gl + nt <= fl + 3) {
                memcpy(got + gl, txt, nt);
                gl += nt;
            }
        }
        n_stopped += stopped;
        CHECK_MSG(stopped == (cut < fl), "round %d: stopped %d, expected cut %zu of %zu", round, stopped, cut, fl);
        CHECK_MSG(gl == cut && !memcmp(got, full, cut), "round %d: released %zu bytes, expected %zu", round, gl,
                  cut);
        CHECK_EQ_INT(kp_textout_released(t), gl);
        free(got);
        free(full);
        kp_textout_free(t);
    }
    CHECK(n_stopped > 50);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
}

static void test_random_spm(void) { random_streams("models/stories260K.gguf"); }
static void test_random_bpe(void) { random_streams("tests/data/vocab/ggml-vocab-gpt-2.gguf"); }

static void test_errors_and_strip(void) {
    kp_gguf *g = NULL;
    kp_tok_vocab *v = load("models/stories260K.gguf", &g);
    if (!v) return;
    kp_error err = {0};
    kp_textout *t = NULL;
    const char *empty[1] = {""};
    CHECK_EQ_INT(kp_textout_new(&t, v, empty, 1, false, false, &err), KP_EINVAL);
    CHECK(t == NULL);
    const char *many[KP_TEXTOUT_MAX_STOPS + 1];
    for (int i = 0; i <= KP_TEXTOUT_MAX_STOPS; i++) many[i] = "x";
    CHECK_EQ_INT(kp_textout_new(&t, v, many, KP_TEXTOUT_MAX_STOPS + 1, false, false, &err), KP_EINVAL);
    /* the leading SPM space of the first word is dropped once */
    size_t n = 0;
    int32_t *enc = NULL;
    CHECK(kp_tok_encode(v, "Once upon", 9, false, false, &enc, &n, &err) == KP_OK);
    CHECK(kp_textout_new(&t, v, NULL, 0, false, true, &err) == KP_OK);
    char got[64];
    size_t gl = 0;
    for (size_t i = 0; i < n && i < 8; i++) {
        const char *txt;
        size_t nt;
        bool st;
        CHECK(kp_textout_push(t, enc[i], &txt, &nt, &st, &err) == KP_OK);
        memcpy(got + gl, txt, nt);
        gl += nt;
    }
    CHECK(gl == 9 && !memcmp(got, "Once upon", 9));
    const char *txt;
    size_t nt;
    bool st;
    CHECK_EQ_INT(kp_textout_push(t, kp_tok_n_vocab(v), &txt, &nt, &st, &err), KP_EINVAL);
    kp_textout_free(t);
    kp_textout_free(NULL);
    free(enc);
    kp_tok_vocab_free(v);
    kp_gguf_close(g);
}

int main(void) {
    RUN(test_random_spm);
    RUN(test_random_bpe);
    RUN(test_errors_and_strip);
    return harness_finish("textout");
}
