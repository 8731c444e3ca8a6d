/*
 * fuzz_gcompile.c - libFuzzer target for the cost of compiling grammars
 * (src/grammar/): a small input expands into a large JSON Schema or GBNF
 * grammar, which must compile (or be refused) within a time limit and a
 * number of work steps linear in its size. A superlinear case is a finding
 * even when nothing crashes: the compile runs on a server's connection
 * thread, and its cost was once quadratic (20,000 nested groups: 4.5 s).
 *
 * Input layout:  byte 0     bit 0: GBNF (else a JSON Schema)
 *                bytes 1-2  n, the repetitions (little endian, at most
 *                           MAX_REPEAT)
 *                rest       fragment NUL prefix NUL suffix (each part may be
 *                           missing: empty)
 *
 * The text: the prefix, then the fragment written n times, then the
 * suffix. In a fragment '@' is replaced by the repetition's index i and
 * '#' by i + 1; in the prefix and the suffix, '@' by n. A fragment with a
 * '$' is nested instead: its head (before the '$') written for i = 0..n-1,
 * the suffix, then its tail for i = n-1..0:
 *
 *   prefix head(0) ... head(n-1) suffix tail(n-1) ... tail(0)
 *
 * Example: GBNF, n = 20000, prefix `root ::= r0\n`, fragment
 * `r@ ::= "(" r# ")"\n`, suffix `r@ ::= "a"\n`: 20,000 rules deep. The
 * seeds (fuzz/make_seeds.py --grammar writes seeds-gcompile/) are deep rule
 * chains, wide alternatives, nested groups and arrays, enums, anyOf lists,
 * long property lists and numeric ranges, near and beyond the limits.
 *
 * Per input: the text is compiled with a kp_grammar_stop that counts its
 * polls (one per KP_BUILDER_POLL steps of work) and watches the clock:
 * more than STEPS_PER_BYTE steps per byte of text (plus a constant), or
 * more than TIME_LIMIT seconds, traps. The grammar, when it compiles, gets
 * a matcher and its start's mask over a byte vocabulary (the matcher must
 * start within the bounds: what compiles, runs).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "grammar/gram_impl.h" /* KP_BUILDER_POLL */
#include "grammar/grammar.h"

#define REQUIRE(cond, ...)                                                                \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fuzz_gcompile: " __VA_ARGS__);                               \
            fputc('\n', stderr);                                                          \
            __builtin_trap();                                                             \
        }                                                                                 \
    } while (0)

#define MAX_REPEAT 60000
#define MAX_TEXT (4u << 20) /* bytes of expanded text: the server's bodies are at most 8 MiB */
#define TIME_LIMIT 10.0     /* seconds, under ASan and UBSan on a loaded machine: linear compiles of
                               4 MiB take well under 1 s in the release build */
#define STEPS_PER_BYTE 64u
#define STEPS_FIXED (1u << 20)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    double start;
    uint64_t polls, max_polls;
} watch;

static bool over(void *arg) {
    watch *w = arg;
    w->polls++;
    double t = now_s() - w->start;
    REQUIRE(w->polls <= w->max_polls, "more than %llu steps of work for the text (superlinear?)",
            (unsigned long long)(w->max_polls * KP_BUILDER_POLL));
    REQUIRE(t <= TIME_LIMIT, "compile still running after %.1f s", t);
    return false;
}

/* Appends part[0..n) with '@' replaced by i and '#' by i + 1. */
static void put_part(kp_buf *b, const uint8_t *part, size_t n, unsigned i) {
    for (size_t k = 0; k < n && b->len < MAX_TEXT; k++) {
        if (part[k] == '@' || part[k] == '#')
            kp_buf_printf(b, "%u", part[k] == '@' ? i : i + 1);
        else
            kp_buf_putc(b, (char)part[k]);
    }
}

static kp_gvocab *byte_vocab(void) {
    static char bytes[256];
    const char *pieces[257];
    size_t lens[257];
    uint8_t eog[257] = {0};
    for (int b = 0; b < 256; b++) {
        bytes[b] = (char)b;
        pieces[b] = &bytes[b];
        lens[b] = 1;
    }
    pieces[256] = "";
    lens[256] = 0;
    eog[256] = 1;
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    REQUIRE(kp_gvocab_new_raw(&gv, 257, pieces, lens, eog, &err) == KP_OK, "vocabulary: %s", err.msg);
    return gv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kp_gvocab *gv;
    if (!gv) gv = byte_vocab();
    if (size < 3) return 0;
    bool is_gbnf = data[0] & 1;
    unsigned n = (unsigned)data[1] | (unsigned)data[2] << 8;
    if (n > MAX_REPEAT) n = MAX_REPEAT;
    const uint8_t *frag = data + 3, *end = data + size;
    const uint8_t *fend = memchr(frag, 0, (size_t)(end - frag));
    if (!fend) fend = end;
    const uint8_t *pre = fend < end ? fend + 1 : end;
    const uint8_t *pend = pre < end ? memchr(pre, 0, (size_t)(end - pre)) : NULL;
    if (!pend) pend = end;
    const uint8_t *suf = pend < end ? pend + 1 : end;
    const uint8_t *dollar = memchr(frag, '$', (size_t)(fend - frag));

    kp_buf t = {0};
    put_part(&t, pre, (size_t)(pend - pre), n);
    if (dollar) {
        for (unsigned i = 0; i < n && t.len < MAX_TEXT; i++) put_part(&t, frag, (size_t)(dollar - frag), i);
        put_part(&t, suf, (size_t)(end - suf), n);
        for (unsigned i = n; i-- > 0 && t.len < MAX_TEXT;) put_part(&t, dollar + 1, (size_t)(fend - dollar - 1), i);
    } else {
        for (unsigned i = 0; i < n && t.len < MAX_TEXT; i++) put_part(&t, frag, (size_t)(fend - frag), i);
        put_part(&t, suf, (size_t)(end - suf), n);
    }
    json_t *schema = NULL;
    if (!t.oom && !is_gbnf) schema = json_loadb(t.data ? t.data : "", t.len, JSON_DECODE_ANY, NULL);
    if (t.oom || (!is_gbnf && !schema)) {
        kp_buf_free(&t);
        return 0;
    }

    watch w = {now_s(), 0, (STEPS_PER_BYTE * (uint64_t)t.len + STEPS_FIXED) / KP_BUILDER_POLL + 1};
    kp_grammar_stop stop = {over, &w};
    kp_grammar *g = NULL;
    kp_error err = {0};
    kp_status st;
    if (is_gbnf) {
        st = kp_grammar_compile_gbnf_stop(t.data ? t.data : "", t.len, &stop, &g, &err);
    } else {
        kp_schema_opts o = kp_schema_opts_default();
        o.stop = &stop;
        st = kp_grammar_compile_schema(schema, &o, &g, &err);
        json_decref(schema);
    }
    double secs = now_s() - w.start;
    REQUIRE(secs <= TIME_LIMIT, "compile of %zu bytes took %.1f s", t.len, secs);
    REQUIRE((st == KP_OK) == (g != NULL), "status %d with grammar %p", (int)st, (void *)g);
    REQUIRE(st == KP_OK || err.msg[0], "refusal %d without a message", (int)st);
    REQUIRE(st != KP_EIO, "the stop never says stop, yet: %s", err.msg);
    if (getenv("FUZZ_GCOMPILE_VERBOSE")) /* what each seed does */
        fprintf(stderr, "%zu bytes, %.3f s, %llu polls: %s\n", t.len, secs, (unsigned long long)w.polls,
                st == KP_OK ? "compiled" : err.msg);
    if (g) {
        kp_gmatch *m = NULL;
        st = kp_gmatch_new(&m, g, gv, &err);
        REQUIRE(st == KP_OK, "a compiled grammar's matcher cannot start: %s", err.msg);
        uint32_t mask[9];
        size_t na = 0;
        st = kp_gmatch_mask(m, mask, &na, &err);
        REQUIRE(st == KP_OK || st == KP_EFULL, "mask at the start: %d %s", (int)st, err.msg);
        kp_gmatch_free(m);
        kp_grammar_free(g);
    }
    kp_buf_free(&t);
    return 0;
}
