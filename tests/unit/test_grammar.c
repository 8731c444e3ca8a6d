/*
 * test_grammar.c - the grammar engine (src/grammar/): GBNF and JSON Schema
 * compilation, the matcher, token masks, completions, bounds.
 *
 * Where expected values come from:
 *   - accepted / rejected documents: written by hand from the GBNF rules
 *     (llama.cpp's grammars/README.md semantics) and from the JSON Schema
 *     spec (draft 2020-12 validation), RFC 8259 (JSON numbers, strings),
 *     RFC 3339 (date, date-time), RFC 4122 (uuid);
 *   - the property tests: a random schema generator over the supported
 *     subset, an independent validator of that subset (validate(), written
 *     from the spec and sharing no code with the compiler), jansson for
 *     parsing, and an independent generator of valid documents (gen_doc)
 *     tokenized by the real tokenizer;
 *   - token masks: a brute-force mask (every token's bytes fed to a clone
 *     of the matcher) against the fast one;
 *   - the vocabularies of tests/data/vocab and models/stories260K.gguf.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "grammar/pda.h" /* white-box: the node cap */
#include "harness.h"
#include "tok/tok.h"

/* ---- helpers ---- */

static kp_tok_vocab *load_vocab(const char *rel) {
    kp_gguf *g = NULL;
    kp_error err = {0};
    if (kp_gguf_open(&g, harness_path(rel), &err) != KP_OK) {
        fprintf(stderr, "cannot open %s: %s\n", rel, err.msg);
        return NULL;
    }
    kp_tok_vocab *v = NULL;
    if (kp_tok_vocab_load(&v, g, &err) != KP_OK) fprintf(stderr, "cannot load %s: %s\n", rel, err.msg);
    kp_gguf_close(g);
    return v;
}

static kp_tok_vocab *load_stories(void) {
    FILE *f = fopen(harness_path("models/stories260K.gguf"), "rb");
    if (f) {
        fclose(f);
        return load_vocab("models/stories260K.gguf");
    }
    return load_vocab("tests/data/stories260K.gguf");
}

/* A one-token vocabulary for byte-level tests (masks unused). */
static kp_gvocab *tiny_vocab(void) {
    static const char *const p[2] = {"a", "b"};
    static const size_t l[2] = {1, 1};
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new_raw(&gv, 2, p, l, NULL, &err) == KP_OK);
    return gv;
}

/* 0: rejected, 1: a proper prefix, 2: complete. -1: matcher error. */
static int run_bytes(const kp_grammar *g, const kp_gvocab *gv, const char *doc, size_t len) {
    kp_gmatch *m = NULL;
    kp_error err = {0};
    if (kp_gmatch_new(&m, g, gv, &err) != KP_OK) return -1;
    kp_status st = kp_gmatch_accept_bytes(m, doc, len, &err);
    int r = st == KP_OK ? (kp_gmatch_complete(m) ? 2 : 1) : st == KP_EINVAL ? 0 : -1;
    kp_gmatch_free(m);
    return r;
}

static kp_grammar *gbnf(const char *text) {
    kp_grammar *g = NULL;
    kp_error err = {0};
    kp_status st = kp_grammar_compile_gbnf(text, strlen(text), &g, &err);
    CHECK_MSG(st == KP_OK, "gbnf: %s\n%s", err.msg, text);
    return g;
}

static kp_grammar *schema_g(const char *text, int ws_max) {
    json_error_t je;
    json_t *s = json_loads(text, JSON_DECODE_ANY, &je);
    CHECK_MSG(s != NULL, "bad test schema %s: %s", text, je.text);
    if (!s) return NULL;
    kp_schema_opts o = kp_schema_opts_default();
    o.ws_max = ws_max;
    kp_grammar *g = NULL;
    kp_error err = {0};
    kp_status st = kp_grammar_compile_schema(s, &o, &g, &err);
    CHECK_MSG(st == KP_OK, "schema: %s\n%s", err.msg, text);
    json_decref(s);
    return g;
}

/* ---- GBNF ---- */

typedef struct {
    const char *doc;
    int want; /* 0 rejected, 1 prefix, 2 complete */
} docw;

static void check_docs(const char *what, const kp_grammar *g, const docw *d, size_t n) {
    kp_gvocab *gv = tiny_vocab();
    for (size_t i = 0; g && gv && i < n; i++) {
        int got = run_bytes(g, gv, d[i].doc, strlen(d[i].doc));
        CHECK_MSG(got == d[i].want, "%s: \"%s\": got %d want %d", what, d[i].doc, got, d[i].want);
    }
    kp_gvocab_free(gv);
}

static void gbnf_case(const char *text, const docw *d, size_t n) {
    kp_grammar *g = gbnf(text);
    check_docs(text, g, d, n);
    kp_grammar_free(g);
}

#define GCASE(text, ...)                                                                                    \
    do {                                                                                                    \
        static const docw d_[] = {__VA_ARGS__};                                                             \
        gbnf_case(text, d_, sizeof d_ / sizeof d_[0]);                                                      \
    } while (0)

static void test_gbnf_basic(void) {
    GCASE("root ::= \"abc\"\n", {"abc", 2}, {"ab", 1}, {"", 1}, {"abd", 0}, {"abcd", 0});
    GCASE("root ::= \"a\" | \"bc\" | \"\"\n", {"", 2}, {"a", 2}, {"b", 1}, {"bc", 2}, {"ab", 0});
    /* classes, ranges, negation */
    GCASE("root ::= [a-c] [xyz0-9]\n", {"a5", 2}, {"cz", 2}, {"d1", 0}, {"aa", 0});
    GCASE("root ::= [^a-c\\n]\n", {"d", 2}, {"a", 0}, {"\n", 0}, {"\xc3\xa9", 2}, {"\xc3", 1});
    /* repetition */
    GCASE("root ::= \"a\" \"b\"* \"c\"\n", {"ac", 2}, {"abbbc", 2}, {"abbb", 1}, {"abxc", 0});
    GCASE("root ::= \"x\"+\n", {"", 1}, {"x", 2}, {"xxxx", 2}, {"xy", 0});
    GCASE("root ::= \"a\"? \"b\"\n", {"b", 2}, {"ab", 2}, {"aab", 0});
    GCASE("root ::= \"ab\"{2}\n", {"abab", 2}, {"ab", 1}, {"ababab", 0});
    GCASE("root ::= [0-9]{2,4}\n", {"1", 1}, {"12", 2}, {"1234", 2}, {"12345", 0});
    GCASE("root ::= [0-9]{3,}\n", {"12", 1}, {"123", 2}, {"1234567890", 2}, {"12a", 0});
    GCASE("root ::= [0-9]{0,2} \"!\"\n", {"!", 2}, {"12!", 2}, {"123!", 0});
    /* groups, rules, comments, multi-line alternates */
    GCASE("# a comment\nroot ::= (\"a\" | \"b\")* end   # trailing\nend ::= \"!\"\n", {"abba!", 2}, {"!", 2},
          {"ab", 1}, {"abc", 0});
    GCASE("root ::= item (\",\" item)*\nitem ::=\n  \"x\" |\n  \"yy\"\n", {"x,yy,x", 2}, {"x,", 1}, {"x,,", 0});
    GCASE("root ::= (\n  \"a\"\n  \"b\"\n)\n", {"ab", 2}, {"a", 1});
    /* escapes in literals and classes */
    GCASE("root ::= \"\\n\\t\\\\\\\"\\x41\\u00e9\\U0001F600\"\n", {"\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80", 2},
          {"\n\t\\\"A\xc3\xa9\xf0\x9f\x98", 1});
    GCASE("root ::= [\\[\\]-]+\n", {"[]-", 2}, {"a", 0}); /* '-' last is itself */
    /* a UTF-16 pair written as two \u escapes (as JSON writes U+1F600) is the one character */
    GCASE("root ::= \"\\uD83D\\uDE00\"\n", {"\xf0\x9f\x98\x80", 2}, {"\xed\xa0\xbd", 0});
    /* . is any character, as UTF-8 */
    GCASE("root ::= . .\n", {"ab", 2}, {"\xe6\x97\xa5\xe6\x9c\xac", 2}, {"\xe6\x97", 1}, {"\xff", 0},
          {"\xed\xa0\x80", 0} /* a surrogate has no UTF-8 form */, {"\xc0\xaf", 0} /* overlong */);
    /* recursion (not left) */
    GCASE("root ::= \"(\" root \")\" | \"\"\n", {"", 2}, {"(())", 2}, {"((", 1}, {"())", 0});
    /* ambiguity merges */
    GCASE("root ::= (\"a\" | \"a\" | [a])*\n", {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 2});
}

static void test_gbnf_utf8_classes(void) {
    /* code point classes split into UTF-8 byte ranges: check every boundary */
    kp_grammar *g = gbnf("root ::= [\\u0080-\\u07FF\\u0800-\\uFFFF\\U00010000-\\U0010FFFF]\n");
    kp_gvocab *gv = tiny_vocab();
    static const uint32_t cps[] = {0x80,   0x7FF,  0x800,   0xFFF,   0x1000,  0xD7FF,  0xE000,
                                   0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF};
    for (size_t i = 0; g && gv && i < sizeof cps / sizeof cps[0]; i++) {
        char u[5];
        uint32_t c = cps[i];
        size_t n;
        if (c < 0x800) {
            u[0] = (char)(0xC0 | c >> 6);
            u[1] = (char)(0x80 | (c & 63));
            n = 2;
        } else if (c < 0x10000) {
            u[0] = (char)(0xE0 | c >> 12);
            u[1] = (char)(0x80 | ((c >> 6) & 63));
            u[2] = (char)(0x80 | (c & 63));
            n = 3;
        } else {
            u[0] = (char)(0xF0 | c >> 18);
            u[1] = (char)(0x80 | ((c >> 12) & 63));
            u[2] = (char)(0x80 | ((c >> 6) & 63));
            u[3] = (char)(0x80 | (c & 63));
            n = 4;
        }
        CHECK_MSG(run_bytes(g, gv, u, n) == 2, "U+%X", c);
        for (size_t k = 1; k < n; k++) CHECK_MSG(run_bytes(g, gv, u, k) == 1, "U+%X prefix %zu", c, k);
    }
    CHECK(run_bytes(g, gv, "a", 1) == 0);
    CHECK(run_bytes(g, gv, "\xed\xa0\x80", 3) == 0);     /* U+D800 */
    CHECK(run_bytes(g, gv, "\xf4\x90\x80\x80", 4) == 0); /* U+110000 */
    CHECK(run_bytes(g, gv, "\xe0\x80\x80", 3) == 0);     /* overlong */
    kp_grammar_free(g);
    /* a narrow class inside one lead byte */
    g = gbnf("root ::= [\\u00e0-\\u00e9\\u00f0-\\u00f5]\n");
    CHECK(run_bytes(g, gv, "\xc3\xa5", 2) == 2);
    CHECK(run_bytes(g, gv, "\xc3\xb3", 2) == 2);
    CHECK(run_bytes(g, gv, "\xc3\xaa", 2) == 0);
    CHECK(run_bytes(g, gv, "\xc3\xb6", 2) == 0);
    kp_grammar_free(g);
    kp_gvocab_free(gv);
}

typedef struct {
    const char *text;
    kp_status code;
    const char *msg; /* substring */
} errcase;

static void test_gbnf_errors(void) {
    static const errcase cases[] = {
        {"rot ::= \"a\"\n", KP_EINVAL, "no 'root'"},
        {"root ::= x\n", KP_EINVAL, "undefined rule 'x'"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", KP_EINVAL, "defined twice"},
        {"root ::= \"a\n", KP_EINVAL, "end of input"},
        {"root ::= [abc\n", KP_EINVAL, "gbnf:1:10: unterminated character class"},
        {"root = \"a\"\n", KP_EINVAL, "expecting '::='"},
        {"root ::= ( \"a\"\n", KP_EINVAL, "')'"},
        {"root ::= * \"a\"\n", KP_EINVAL, "item before '*'"},
        {"root ::= \"\\q\"\n", KP_EINVAL, "unknown escape"},
        {"root ::= \"a\"{3,2}\n", KP_EINVAL, "max below min"},
        {"root ::= \"a\"{99999}\n", KP_ERANGE, "repetition count"},
        {"root ::= <[1000]>\n", KP_EUNSUPPORTED, "token references"},
        {"root ::= x \"a\" | \"b\"\nx ::= root\n", KP_EUNSUPPORTED, "left recursion"},
        {"root ::= y root | \"b\"\ny ::= \"\" | \"c\"\n", KP_EUNSUPPORTED, "left recursion"},
        {"root ::= (\"a\"?)*\n", KP_EUNSUPPORTED, "empty string"},
        {"root ::= \"a\" root\n", KP_EINVAL, "can never finish"},
        {"root ::= \"a\"\n\"b\"\n", KP_EINVAL, "gbnf:2:1"},
        {"root ::= [^\\x00-\\U0010FFFF]\n", KP_EINVAL, "can never finish"},
        {"root ::= \"\\uD800\"\n", KP_EINVAL, "lone UTF-16 surrogate"},
        {"root ::= \"\\uDC00\\uD800\"\n", KP_EINVAL, "lone UTF-16 surrogate"},
        {"root ::= [\\uD800-\\uDFFF]\n", KP_EINVAL, "lone UTF-16 surrogate"},
        {"root ::= \"\\U0000D800\"\n", KP_EINVAL, "lone UTF-16 surrogate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kp_grammar *g = NULL;
        kp_error err = {0};
        kp_status st = kp_grammar_compile_gbnf(cases[i].text, strlen(cases[i].text), &g, &err);
        CHECK_MSG(st == cases[i].code && strstr(err.msg, cases[i].msg), "%s -> %d '%s' (want %d '%s')", cases[i].text,
                  st, err.msg, cases[i].code, cases[i].msg);
        kp_grammar_free(g);
    }
    /* unproductive alternatives are dropped, the rest stays */
    kp_grammar *g = gbnf("root ::= \"a\" | \"b\" loop\nloop ::= \"c\" loop\n");
    docw d[] = {{"a", 2}, {"b", 0}};
    check_docs("unproductive", g, d, 2);
    kp_grammar_free(g);
    kp_error err = {0};
    CHECK(kp_grammar_compile_gbnf(NULL, 3, &g, &err) == KP_EINVAL);
}

/* ---- JSON Schema: keyword by keyword ---- */

static void schema_case(const char *schema, int ws_max, const docw *d, size_t n) {
    kp_grammar *g = schema_g(schema, ws_max);
    check_docs(schema, g, d, n);
    kp_grammar_free(g);
}

#define SCASE(schema, ...)                                                                                  \
    do {                                                                                                    \
        static const docw d_[] = {__VA_ARGS__};                                                             \
        schema_case(schema, 2, d_, sizeof d_ / sizeof d_[0]);                                               \
    } while (0)

static void test_schema_scalars(void) {
    SCASE("{\"type\":\"null\"}", {"null", 2}, {" null ", 2}, {"nul", 1}, {"0", 0});
    SCASE("{\"type\":\"boolean\"}", {"true", 2}, {"false", 2}, {"tru", 1}, {"1", 0}, {"\"true\"", 0});
    /* RFC 8259 numbers: no leading zeros, no '+', fraction and exponent need digits */
    SCASE("{\"type\":\"integer\"}", {"0", 2}, {"-0", 2}, {"42", 2}, {"-7", 2}, {"123456789012345678", 2},
          {"01", 0}, {"+1", 0}, {"1.5", 0}, {"1e3", 0}, {"-", 1}, {"--1", 0}, {"1234567890123456789", 0});
    SCASE("{\"type\":\"number\"}", {"0", 2}, {"1.5", 2}, {"-0.25", 2}, {"1e10", 2}, {"2E-3", 2}, {"3.0e+12", 2},
          {"1.", 1}, {"1.e3", 0}, {".5", 0}, {"00.1", 0}, {"1e", 1}, {"1e+", 1}, {"1e123", 0}, {"NaN", 0},
          {"Infinity", 0});
    /* strings: escapes, controls, UTF-8, surrogates */
    SCASE("{\"type\":\"string\"}", {"\"\"", 2}, {"\"abc\"", 2}, {"\"a\\\"b\\\\c\\/\\b\\f\\n\\r\\t\"", 2},
          {"\"\\u00e9\\u00E9\"", 2}, {"\"\\ud83d\\ude00\"", 2}, {"\"\\ud83d\"", 0} /* lone high surrogate */,
          {"\"\\ude00\"", 0}, {"\"\\x41\"", 0}, {"\"a\nb\"", 0}, {"\"\t\"", 0}, {"\"caf\xc3\xa9\"", 2},
          {"\"\xf0\x9f\x99\x82\"", 2}, {"\"\xc3\"", 0} /* bad UTF-8 */, {"\"abc", 1}, {"abc", 0}, {"\"\x7f\"", 2});
    SCASE("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", 2}, {"\"abc\"", 2}, {"\"a\"", 0},
          {"\"abcd\"", 0}, {"\"\xe6\x97\xa5\xe6\x9c\xac\"", 2} /* 2 code points */, {"\"\\u00e9x\"", 2},
          {"\"\\ud83d\\ude00\\ud83d\\ude00\"", 2} /* pairs count once */, {"\"\xf0\x9f\x99\x82\"", 0});
    SCASE("{\"type\":\"string\",\"maxLength\":0}", {"\"\"", 2}, {"\"a\"", 0});
    SCASE("{\"type\":\"string\",\"minLength\":30}", {"\"abcdefghijklmnopqrstuvwxyzabc\"", 0},
          {"\"abcdefghijklmnopqrstuvwxyzabcd\"", 2}, {"\"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrst\"", 2});
    SCASE("{\"type\":\"string\",\"maxLength\":40}", {"\"abcdefghijklmnopqrstuvwxyzabcdefghijklmn\"", 2},
          {"\"abcdefghijklmnopqrstuvwxyzabcdefghijklmno\"", 0});
    /* type lists */
    SCASE("{\"type\":[\"string\",\"null\"]}", {"null", 2}, {"\"x\"", 2}, {"1", 0});
    SCASE("{\"type\":[\"integer\",\"number\"]}", {"1", 2}, {"1.5", 2});
    /* no type: anything (type-specific keywords apply only to their type) */
    SCASE("{\"minLength\":3}", {"\"abc\"", 2}, {"\"ab\"", 0}, {"5", 2}, {"[1]", 2}, {"{\"a\":[null]}", 2});
    SCASE("true", {"{\"a\":[1,{\"b\":\"c\"}]}", 2}, {"[]", 2}, {"\"s\"", 2}, {"-1.5e3", 2}, {"nul", 1}, {"}", 0});
}

static void test_schema_formats(void) {
    SCASE("{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-29\"", 2} /* leap year */, {"\"2023-02-29\"", 0},
          {"\"2000-02-29\"", 2} /* divisible by 400 */, {"\"1900-02-29\"", 0} /* by 100, not 400 */,
          {"\"2023-04-30\"", 2}, {"\"2023-04-31\"", 0}, {"\"2023-12-31\"", 2}, {"\"2023-13-01\"", 0},
          {"\"2023-00-10\"", 0}, {"\"2023-01-00\"", 0}, {"\"0000-02-29\"", 2}, {"\"23-01-01\"", 0},
          {"\"2023-1-01\"", 0});
    SCASE("{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-01-31T23:59:59Z\"", 2},
          {"\"2024-01-31T00:00:00.123456+05:30\"", 2}, {"\"2024-01-31T24:00:00Z\"", 0},
          {"\"2024-01-31T12:60:00Z\"", 0}, {"\"2024-01-31T12:00:00\"", 0} /* offset required */,
          {"\"2024-01-31 12:00:00Z\"", 0}, {"\"2024-01-31T12:00:00-0530\"", 0}, {"\"2024-01-31T12:00:00.Z\"", 0});
    SCASE("{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\"", 2},
          {"\"123E4567-E89B-12D3-A456-426614174000\"", 2}, {"\"123e4567e89b12d3a456426614174000\"", 0},
          {"\"123e4567-e89b-12d3-a456-42661417400\"", 0}, {"\"g23e4567-e89b-12d3-a456-426614174000\"", 0});
    /* RFC 3339 full-time */
    SCASE("{\"type\":\"string\",\"format\":\"time\"}", {"\"23:59:59Z\"", 2}, {"\"08:30:00.5+01:00\"", 2},
          {"\"24:00:00Z\"", 0}, {"\"8:30:00Z\"", 0}, {"\"08:30Z\"", 0});
    /* RFC 5322 addr-spec, dot-atom forms (zod's .email()) */
    SCASE("{\"type\":\"string\",\"format\":\"email\"}", {"\"ada@example.com\"", 2},
          {"\"first.last+tag@mail.example.co.uk\"", 2}, {"\"a_b-c@x-y.io\"", 2}, {"\"ada@example\"", 0} /* no TLD */,
          {"\"@example.com\"", 0}, {"\"ada@@example.com\"", 0}, {"\"ada@-example.com\"", 0},
          {"\"ada example@x.com\"", 0}, {"\"ada@example.c\"", 0} /* one-letter TLD */, {"\"ada@example.com", 1});
    SCASE("{\"type\":\"string\",\"format\":\"hostname\"}", {"\"localhost\"", 2}, {"\"api.example.com\"", 2},
          {"\"a..b\"", 0}, {"\".example\"", 0}, {"\"ex ample\"", 0});
    /* RFC 3986 URIs (zod's .url()) */
    SCASE("{\"type\":\"string\",\"format\":\"uri\"}", {"\"https://example.com/a/b?q=1&r=%20#frag\"", 2},
          {"\"mailto:ada@example.com\"", 2}, {"\"urn:isbn:0451450523\"", 2}, {"\"http://[::1]:8080/\"", 2},
          {"\"//example.com\"", 0} /* no scheme */, {"\"1http://x\"", 0}, {"\"https://exa mple.com\"", 0},
          {"\"https:\"", 0}, {"\"https://a\\\"b\"", 0});
    SCASE("{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"192.168.0.1\"", 2}, {"\"255.255.255.255\"", 2},
          {"\"0.0.0.0\"", 2}, {"\"256.1.1.1\"", 0}, {"\"01.2.3.4\"", 0}, {"\"1.2.3\"", 0});
    /* a format kvpin does not know is an annotation: any string */
    SCASE("{\"type\":\"string\",\"format\":\"idn-email\"}", {"\"anything at all\"", 2}, {"\"\"", 2}, {"5", 0});
}

static void test_schema_enum_const(void) {
    SCASE("{\"enum\":[\"red\",\"green\",1,null,true,2.5,[1,\"a\"],{\"k\":false}]}", {"\"red\"", 2},
          {"\"green\"", 2}, {"1", 2}, {"null", 2}, {"true", 2}, {"2.5", 2}, {"[1,\"a\"]", 2}, {"[ 1 , \"a\" ]", 2},
          {"{\"k\":false}", 2}, {"{ \"k\" : false }", 2}, {"\"blue\"", 0}, {"false", 0}, {"2", 1} /* 2.5 */, {"[1]", 0},
          {"\"re", 1});
    SCASE("{\"enum\":[\"caf\xc3\xa9\",\"a\\\"b\",\"tab\\tx\",\"\\u0001\"]}", {"\"caf\xc3\xa9\"", 2},
          {"\"a\\\"b\"", 2}, {"\"tab\\tx\"", 2}, {"\"\\u0001\"", 2}, {"\"caf\\u00e9\"", 0} /* one spelling */);
    SCASE("{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", 2}, {"\"b\"", 2}, {"1", 0});
    SCASE("{\"type\":\"integer\",\"enum\":[1,2.0,2.5]}", {"1", 2}, {"2", 2}, {"2.5", 0});
    SCASE("{\"const\":\"x\"}", {"\"x\"", 2}, {"\"y\"", 0});
    SCASE("{\"const\":{\"a\":[1,2],\"b\":null}}", {"{\"a\":[1,2],\"b\":null}", 2}, {"{\"a\":[1,2]}", 0});
    SCASE("{\"const\":-1e+20}", {"-1e+20", 2}, {"-100000000000000000000", 0});
}

static void test_schema_objects(void) {
    /* declared properties in schema order, required ones present, no others */
    SCASE("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
          "\"required\":[\"a\"],\"additionalProperties\":false}",
          {"{\"a\":1}", 2}, {"{\"a\":1,\"b\":\"x\"}", 2}, {"{ \"a\" : 1 , \"b\" : \"x\" }", 2}, {"{}", 0},
          {"{\"b\":\"x\"}", 0}, {"{\"a\":1,\"c\":2}", 0}, {"{\"a\":\"1\"}", 0}, {"{\"a\":1,}", 0},
          {"{\"a\":1 \"b\":\"x\"}", 0});
    /* optional first, required later; all optional */
    SCASE("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"},"
          "\"c\":{\"type\":\"null\"}},\"required\":[\"c\"],\"additionalProperties\":false}",
          {"{\"c\":null}", 2}, {"{\"a\":null,\"c\":null}", 2}, {"{\"b\":null,\"c\":null}", 2},
          {"{\"a\":null,\"b\":null,\"c\":null}", 2}, {"{\"a\":null}", 0}, {"{\"a\":null,\"b\":null}", 0},
          {"{,\"c\":null}", 0});
    SCASE("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"}},"
          "\"additionalProperties\":false}",
          {"{}", 2}, {"{\"a\":null}", 2}, {"{\"b\":null}", 2}, {"{\"a\":null,\"b\":null}", 2}, {"{,}", 0});
    /* additional properties: any (absent), a schema, keys other than declared */
    SCASE("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}}}", {"{\"ab\":1,\"x\":[true]}", 2},
          {"{\"x\":\"y\"}", 2}, {"{\"a\":1}", 2}, {"{\"abc\":1}", 2}, {"{\"\":0}", 2},
          /* the output shape: additional keys differ from declared ones and come after them */
          {"{\"ab\":1,\"ab\":2}", 0}, {"{\"x\":1,\"ab\":1}", 0});
    SCASE("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", {"{\"x\":1,\"y\":2}", 2},
          {"{\"x\":\"1\"}", 0}, {"{}", 2});
    SCASE("{\"type\":\"object\",\"additionalProperties\":true,\"required\":[\"id\"]}", {"{\"id\":\"z\"}", 2},
          {"{\"id\":1,\"other\":2}", 2}, {"{\"other\":2}", 0});
    SCASE("{\"type\":\"object\",\"properties\":{\"a\":false,\"b\":{\"type\":\"null\"}}}", {"{\"b\":null}", 2},
          {"{\"a\":1}", 0}, {"{\"aa\":1}", 2});
    /* names that need escapes */
    SCASE("{\"type\":\"object\",\"properties\":{\"q\\\"t\":{\"type\":\"null\"},\"\xc3\xa9\":{\"type\":\"null\"}},"
          "\"required\":[\"q\\\"t\"],\"additionalProperties\":false}",
          {"{\"q\\\"t\":null}", 2}, {"{\"q\\\"t\":null,\"\xc3\xa9\":null}", 2}, {"{\"q\\\"t\":null,\"e\":null}", 0});
    /* json_object mode */
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK(kp_grammar_json_object(NULL, &g, &err) == KP_OK);
    docw d[] = {{"{}", 2}, {"{\"a\":[1,2,{\"b\":null}],\"c\":\"d\"}", 2}, {" { } ", 2}, {"[]", 0}, {"1", 0},
                {"{\"a\"}", 0}, {"{\"a\":1,}", 0}};
    check_docs("json_object", g, d, sizeof d / sizeof d[0]);
    kp_grammar_free(g);
}

static void test_schema_arrays_refs(void) {
    SCASE("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", {"[1]", 2},
          {"[1,2,3]", 2}, {"[ 1 , 2 ]", 2}, {"[]", 0}, {"[1,2,3,4]", 0}, {"[1,]", 0}, {"[\"a\"]", 0});
    SCASE("{\"type\":\"array\"}", {"[]", 2}, {"[1,\"a\",null,[{}]]", 2});
    SCASE("{\"type\":\"array\",\"items\":false}", {"[]", 2}, {"[1]", 0});
    SCASE("{\"type\":\"array\",\"maxItems\":0}", {"[]", 2}, {"[1]", 0});
    SCASE("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}", {"3", 2}, {"\"a\"", 2},
          {"\"ab\"", 0}, {"null", 0});
    SCASE("{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"}]}", {"null", 2}, {"true", 2}, {"0", 0});
    SCASE("{\"allOf\":[{\"type\":\"null\"}],\"description\":\"d\"}", {"null", 2}, {"1", 0});
    /* $ref into $defs and definitions, recursion */
    SCASE("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
          "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
          "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
          {"{\"v\":1}", 2}, {"{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}", 2},
          {"{\"v\":1,\"kids\":[{}]}", 0}, {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":\"x\"}]}]}", 0});
    SCASE("{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":"
          "\"#/definitions/s\"},\"b\":{\"$ref\":\"#/definitions/s\"}},\"additionalProperties\":false}",
          {"{\"a\":\"x\",\"b\":\"y\"}", 2}, {"{\"a\":1}", 0});
    SCASE("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2}", {"[]", 2}, {"[[],[[]]]", 2},
          {"[[],[],[]]", 0});
    SCASE("{\"$defs\":{\"a~b\":{\"type\":\"null\"},\"c/d\":{\"type\":\"boolean\"}},\"anyOf\":[{\"$ref\":"
          "\"#/$defs/a~0b\"},{\"$ref\":\"#/$defs/c~1d\"}]}",
          {"null", 2}, {"false", 2}, {"1", 0});
    /* annotations are accepted and change nothing */
    SCASE("{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":\"x\",\"title\":\"t\","
          "\"description\":\"d\",\"default\":1,\"examples\":[1],\"$comment\":\"c\",\"type\":\"integer\"}",
          {"1", 2}, {"\"1\"", 0});
}

static void test_schema_whitespace(void) {
    /* at most ws_max whitespace bytes between tokens */
    static const docw d2[] = {{"{\"a\":1}", 2}, {"{  \"a\"  :  1  }", 2}, {"{   \"a\":1}", 0}, {"\n{\"a\":\t1}\r\n", 2}};
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", 2, d2, 4);
    static const docw d0[] = {{"{\"a\":1}", 2}, {"{ \"a\":1}", 0}, {" {\"a\":1}", 0}};
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", 0, d0, 3);
}

static void test_schema_errors(void) {
    static const errcase cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", KP_EUNSUPPORTED, "unsupported keyword 'pattern' at #"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0.5}}}", KP_EUNSUPPORTED,
         "a fractional 'minimum' (0.5) is not supported for numbers"},
        {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", KP_EINVAL, "no integer is at least 3 and at most 2"},
        {"{\"type\":\"integer\",\"minimum\":2.2,\"maximum\":2.8}", KP_EINVAL, "no integer"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":1,\"maximum\":1}", KP_EINVAL, "no number is above 1"},
        {"{\"type\":\"number\",\"minimum\":\"1\"}", KP_EINVAL, "'minimum' must be a number"},
        {"{\"type\":\"number\",\"exclusiveMaximum\":true}", KP_EINVAL, "needs 'maximum' beside it"},
        {"{\"type\":\"integer\",\"minimum\":1e19}", KP_EUNSUPPORTED, "bounds beyond"},
        {"{\"type\":\"array\",\"items\":{\"multipleOf\":2}}", KP_EUNSUPPORTED, "'multipleOf' at #/items"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"not\":{}}]}", KP_EUNSUPPORTED, "'not' at #/anyOf/1"},
        {"{\"$defs\":{\"x\":{\"uniqueItems\":true}},\"$ref\":\"#/$defs/x\"}", KP_EUNSUPPORTED,
         "'uniqueItems' at #/$defs/x"},
        {"{\"type\":\"string\",\"format\":\"email\",\"maxLength\":3}", KP_EUNSUPPORTED, "minLength/maxLength"},
        {"{\"prefixItems\":[{}]}", KP_EUNSUPPORTED, "'prefixItems'"},
        {"{\"type\":\"array\",\"items\":[{}]}", KP_EUNSUPPORTED, "tuple"},
        {"{\"allOf\":[{},{}]}", KP_EUNSUPPORTED, "allOf"},
        {"{\"$ref\":\"#/$defs/x\",\"type\":\"null\",\"$defs\":{\"x\":{}}}", KP_EUNSUPPORTED, "'$ref' together with 'type'"},
        {"{\"anyOf\":[{}],\"type\":\"null\"}", KP_EUNSUPPORTED, "'anyOf' together with 'type'"},
        {"{\"enum\":[1],\"minimum\":0}", KP_EUNSUPPORTED, "'minimum'"},
        {"{\"enum\":[\"a\"],\"maxLength\":0}", KP_EUNSUPPORTED, "'enum' together with 'maxLength'"},
        {"{\"$ref\":\"other.json#/x\"}", KP_EUNSUPPORTED, "not a '#' pointer"},
        {"{\"$ref\":\"#/$defs/missing\"}", KP_EINVAL, "points to nothing"},
        {"{\"$ref\":\"#\"}", KP_EINVAL, "can never finish"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#\"}]}", KP_EUNSUPPORTED, "left recursion"},
        {"{\"type\":\"strin\"}", KP_EINVAL, "unknown type 'strin'"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", KP_EINVAL, "no string fits"},
        {"{\"type\":\"array\",\"minItems\":-1}", KP_EINVAL, "non-negative"},
        {"{\"type\":\"array\",\"maxItems\":100000}", KP_ERANGE, "maxItems"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}", KP_EINVAL, "can never be present"},
        {"{\"type\":\"object\",\"required\":[\"a\"],\"additionalProperties\":false}", KP_EINVAL, "can never be present"},
        {"{\"type\":\"integer\",\"enum\":[\"a\"]}", KP_EINVAL, "no 'enum' value"},
        {"false", KP_EINVAL, "no value fits"},
        {"{\"anyOf\":[false]}", KP_EINVAL, "every branch"},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"c\"]}},"
         "\"$ref\":\"#/$defs/n\"}",
         KP_EINVAL, "can never finish"},
        {"{\"properties\":{\"a\":{\"$id\":\"x\"}}}", KP_EUNSUPPORTED, "'$id' inside a subschema"},
        {"3", KP_EINVAL, "must be an object or a boolean"},
        {"{\"x-vendor\":1}", KP_EUNSUPPORTED, "'x-vendor'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t je;
        json_t *s = json_loads(cases[i].text, JSON_DECODE_ANY, &je);
        CHECK_MSG(s != NULL, "bad test schema %s", cases[i].text);
        kp_grammar *g = NULL;
        kp_error err = {0};
        kp_status st = kp_grammar_compile_schema(s, NULL, &g, &err);
        CHECK_MSG(st == cases[i].code && strstr(err.msg, cases[i].msg), "%s -> %d '%s' (want %d '%s')", cases[i].text,
                  st, err.msg, cases[i].code, cases[i].msg);
        kp_grammar_free(g);
        json_decref(s);
    }
    kp_schema_opts o = kp_schema_opts_default();
    o.ws_max = -1;
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK(kp_grammar_compile_schema(json_true(), &o, &g, &err) == KP_EINVAL);
    CHECK(kp_grammar_compile_schema(NULL, NULL, &g, &err) == KP_EINVAL);
}

/* ---- an independent validator of the subset (from the JSON Schema spec) ---- */

static bool num_eq(const json_t *a, const json_t *b) {
    if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
    return json_number_value(a) == json_number_value(b);
}

/* JSON equality as JSON Schema defines it: numbers by value, objects as
 * key sets. */
static bool jeq(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return num_eq(a, b);
    if (json_typeof(a) != json_typeof(b)) return false;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jeq(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)a, k, x) {
            json_t *y = json_object_get(b, k);
            if (!y || !jeq(x, y)) return false;
        }
        return true;
    }
    default: return true;
    }
}

static const json_t *v_resolve(const json_t *root, const char *ref) {
    const json_t *cur = root;
    const char *p = ref + 1; /* after '#' */
    while (cur && *p == '/') {
        char seg[128];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~') ch = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof seg) seg[n++] = ch;
        }
        seg[n] = 0;
        cur = json_is_object(cur) ? json_object_get(cur, seg) : NULL;
    }
    return cur;
}

static size_t cp_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static bool dig(const char *s, int from, int to) {
    for (int i = from; i < to; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}
static int num2(const char *s) { return (s[0] - '0') * 10 + (s[1] - '0'); }

/* RFC 3339 full-date */
static bool v_date(const char *s, size_t n) {
    if (n != 10 || !dig(s, 0, 4) || s[4] != '-' || !dig(s, 5, 7) || s[7] != '-' || !dig(s, 8, 10)) return false;
    int y = num2(s) * 100 + num2(s + 2), m = num2(s + 5), d = num2(s + 8);
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m < 1 || m > 12 || d < 1) return false;
    bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    return d <= mdays[m - 1] + (m == 2 && leap);
}

/* RFC 3339 date-time: full-date "T" partial-time time-offset */
static bool v_datetime(const char *s, size_t n) {
    if (n < 20 || !v_date(s, 10) || (s[10] != 'T' && s[10] != 't')) return false;
    const char *t = s + 11;
    size_t m = n - 11;
    if (m < 9 || !dig(t, 0, 2) || t[2] != ':' || !dig(t, 3, 5) || t[5] != ':' || !dig(t, 6, 8)) return false;
    if (num2(t) > 23 || num2(t + 3) > 59 || num2(t + 6) > 60) return false;
    size_t i = 8;
    if (i < m && t[i] == '.') {
        size_t j = ++i;
        while (i < m && t[i] >= '0' && t[i] <= '9') i++;
        if (i == j) return false;
    }
    if (i < m && (t[i] == 'Z' || t[i] == 'z')) return i + 1 == m;
    if (i + 6 != m || (t[i] != '+' && t[i] != '-') || !dig(t, (int)i + 1, (int)i + 3) || t[i + 3] != ':' ||
        !dig(t, (int)i + 4, (int)i + 6))
        return false;
    return num2(t + i + 1) <= 23 && num2(t + i + 4) <= 59;
}

/* RFC 4122 string form */
static bool v_uuid(const char *s, size_t n) {
    if (n != 36) return false;
    for (size_t i = 0; i < 36; i++) {
        bool hy = i == 8 || i == 13 || i == 18 || i == 23;
        char c = s[i];
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (hy ? c != '-' : !hex) return false;
    }
    return true;
}

static bool type_is(const json_t *v, const char *t) {
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    return false;
}

static bool validate(const json_t *v, const json_t *s, const json_t *root, int depth) {
    if (depth > 200) return false;
    if (json_is_boolean(s)) return json_is_true(s);
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const json_t *t = v_resolve(root, json_string_value(x));
        if (!t || !validate(v, t, root, depth + 1)) return false;
    }
    if ((x = json_object_get(s, "anyOf"))) {
        bool any = false;
        for (size_t i = 0; i < json_array_size(x) && !any; i++) any = validate(v, json_array_get(x, i), root, depth + 1);
        if (!any) return false;
    }
    if ((x = json_object_get(s, "oneOf"))) {
        int n = 0;
        for (size_t i = 0; i < json_array_size(x); i++) n += validate(v, json_array_get(x, i), root, depth + 1);
        if (n != 1) return false;
    }
    if ((x = json_object_get(s, "allOf")))
        for (size_t i = 0; i < json_array_size(x); i++)
            if (!validate(v, json_array_get(x, i), root, depth + 1)) return false;
    if ((x = json_object_get(s, "enum"))) {
        bool any = false;
        for (size_t i = 0; i < json_array_size(x) && !any; i++) any = jeq(v, json_array_get(x, i));
        if (!any) return false;
    }
    if ((x = json_object_get(s, "const")) && !jeq(v, x)) return false;
    if ((x = json_object_get(s, "type"))) {
        bool any = false;
        if (json_is_string(x)) any = type_is(v, json_string_value(x));
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x) && !any; i++)
            any = type_is(v, json_string_value(json_array_get(x, i)));
        if (!any) return false;
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        const json_t *em = json_object_get(s, "exclusiveMinimum"), *eM = json_object_get(s, "exclusiveMaximum");
        if ((x = json_object_get(s, "minimum")) && (json_is_true(em) ? d <= json_number_value(x) : d < json_number_value(x)))
            return false;
        if ((x = json_object_get(s, "maximum")) && (json_is_true(eM) ? d >= json_number_value(x) : d > json_number_value(x)))
            return false;
        if (json_is_number(em) && d <= json_number_value(em)) return false;
        if (json_is_number(eM) && d >= json_number_value(eM)) return false;
    }
    if (json_is_string(v)) {
        size_t n = cp_count(json_string_value(v), json_string_length(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "format"))) {
            const char *f = json_string_value(x), *t = json_string_value(v);
            size_t tn = json_string_length(v);
            if (!strcmp(f, "date") && !v_date(t, tn)) return false;
            if (!strcmp(f, "date-time") && !v_datetime(t, tn)) return false;
            if (!strcmp(f, "uuid") && !v_uuid(t, tn)) return false;
        }
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if ((x = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "items")))
            for (size_t i = 0; i < n; i++)
                if (!validate(json_array_get(v, i), x, root, depth + 1)) return false;
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"), *ap = json_object_get(s, "additionalProperties");
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)v, k, val) {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps ? !validate(val, ps, root, depth + 1) : ap && !validate(val, ap, root, depth + 1)) return false;
        }
        if ((x = json_object_get(s, "required")))
            for (size_t i = 0; i < json_array_size(x); i++)
                if (!json_object_get(v, json_string_value(json_array_get(x, i)))) return false;
    }
    return true;
}

/* Numeric bounds, against arithmetic: for ranges at and across zero, with
 * every mix of exclusive ends, a document is complete iff its value is in
 * the range (spellings of zero with a minus sign aside: the grammar writes
 * zero as "0", JSON also allows "-0"); integers also by exhaustion around
 * both ends, and every integer's one spelling. */
static void test_schema_ranges(void) {
    kp_gvocab *gv = tiny_vocab();
    static const long long ends[][2] = {{0, 0}, {0, 1}, {1, 5}, {-1, 1}, {-5, 0}, {-12, -3}, {7, 342}, {0, 100},
                                        {-1000, 999}, {99, 1000}, {-9007199254740991LL, 9007199254740991LL}};
    static const char *const fracs[] = {"", ".0", ".000", ".5", ".0001", ".9999", ".10", ".000001"};
    int checked = 0;
    for (size_t ri = 0; gv && ri < sizeof ends / sizeof ends[0]; ri++) {
        long long lo = ends[ri][0], hi = ends[ri][1];
        for (int mode = 0; mode < 8; mode++) {
            bool integer = mode & 4, le = mode & 1, he = mode & 2;
            char schema[256];
            snprintf(schema, sizeof schema, "{\"type\":\"%s\",\"%s\":%lld,\"%s\":%lld}",
                     integer ? "integer" : "number", le ? "exclusiveMinimum" : "minimum", lo,
                     he ? "exclusiveMaximum" : "maximum", hi);
            bool any = integer ? lo + le <= hi - he : (lo < hi || (!le && !he));
            json_t *sj = json_loads(schema, 0, NULL);
            kp_grammar *g = NULL;
            kp_error err = {0};
            kp_status st = kp_grammar_compile_schema(sj, NULL, &g, &err);
            json_decref(sj);
            CHECK_MSG(any ? st == KP_OK : st == KP_EINVAL, "%s: %d %s", schema, st, err.msg);
            if (!g) continue;
            long long span = hi - lo > 40 ? 40 : hi - lo;
            long long probes[2][2] = {{lo - 25, lo + span + 25}, {hi - span - 25, hi + 25}};
            for (int side = 0; side < 2; side++)
                for (long long x = probes[side][0]; x <= probes[side][1]; x++) {
                    for (size_t fi = 0; fi < sizeof fracs / sizeof fracs[0]; fi++) {
                        if (integer && fi > 0) break;
                        if (fi > 0 && (x > 1000000000000LL || x < -1000000000000LL)) break; /* past double's digits */
                        char doc[64];
                        /* x + frac as a decimal: for x < 0 the fraction lowers it, -3.5 */
                        snprintf(doc, sizeof doc, "%lld%s", x, fracs[fi]);
                        if (x == 0 && fi > 0 && side == 0) snprintf(doc, sizeof doc, "-0%s", fracs[fi]);
                        double v = strtod(doc, NULL);
                        bool negzero = doc[0] == '-' && v == 0;
                        if (negzero) continue;
                        bool in = (le ? v > (double)lo : v >= (double)lo) && (he ? v < (double)hi : v <= (double)hi);
                        if (integer && fi > 0) in = false;
                        int got = run_bytes(g, gv, doc, strlen(doc));
                        CHECK_MSG((got == 2) == in, "%s: \"%s\" got %d, in range %d", schema, doc, got, in);
                        checked++;
                    }
                }
            /* no leading zeros, no exponent, "-0" no integer */
            static const char *const never[] = {"007", "01", "1e2", "1E0", "00"};
            for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
                CHECK_MSG(run_bytes(g, gv, never[i], strlen(never[i])) != 2, "%s: \"%s\"", schema, never[i]);
            if (integer) CHECK_MSG(run_bytes(g, gv, "-0", 2) != 2, "%s: -0", schema);
            kp_grammar_free(g);
        }
    }
    CHECK(checked > 10000);
    /* rounded inward for integers, the tighter bound of two, draft 4's booleans */
    static const docw d1[] = {{"3", 2}, {"2", 0}, {"7", 2}, {"8", 0}};
    schema_case("{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":7.9}", 0, d1, 4);
    static const docw d2[] = {{"5", 1}, {"5.0", 1}, {"5.00", 1}, {"5.5", 2}, {"9.9", 2}, {"10", 0}, {"0", 0}};
    schema_case("{\"type\":\"number\",\"minimum\":5,\"exclusiveMinimum\":true,\"maximum\":10,"
                "\"exclusiveMaximum\":true}", 0, d2, 7);
    static const docw d3[] = {{"4", 0}, {"5", 2}, {"6", 2}, {"7", 0}};
    schema_case("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":4,\"maximum\":6}", 0, d3, 4);
    /* zod's int(): the safe-integer bounds */
    static const docw d4[] = {{"9007199254740991", 2}, {"9007199254740992", 0}, {"-9007199254740991", 2}, {"0", 2}};
    schema_case("{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", 0, d4, 4);
    /* bounds beside other types constrain only numbers */
    static const docw d5[] = {{"\"x\"", 2}, {"3", 2}, {"-1", 0}, {"null", 2}};
    schema_case("{\"type\":[\"string\",\"integer\",\"null\"],\"minimum\":0}", 0, d5, 4);
    kp_gvocab_free(gv);
}

static void test_validator_itself(void) {
    /* the validator is the property tests' oracle: spot-check it against the spec */
    struct {
        const char *schema, *doc;
        bool valid;
    } c[] = {
        {"{\"type\":\"integer\"}", "1.0", true}, {"{\"type\":\"integer\"}", "1.5", false},
        {"{\"enum\":[1]}", "1.0", true}, {"{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", "1", false},
        {"{\"minLength\":2}", "\"\xc3\xa9\"", false}, {"{\"minLength\":2}", "3", true},
        {"{\"properties\":{\"a\":{\"type\":\"null\"}},\"additionalProperties\":false}", "{\"a\":null,\"b\":1}", false},
        {"{\"required\":[\"a\"]}", "{}", false}, {"{\"format\":\"date\"}", "\"2023-02-29\"", false},
        {"{\"format\":\"date\"}", "\"2024-02-29\"", true}, {"{\"format\":\"date-time\"}", "\"2024-02-29t10:00:00z\"", true},
        {"{\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-42661417400Z\"", false},
        {"{\"$defs\":{\"x\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/x\"}", "null", true},
        {"{\"items\":{\"type\":\"null\"},\"maxItems\":1}", "[null,null]", false},
        {"{\"minimum\":2}", "1.99", false}, {"{\"minimum\":2}", "2", true}, {"{\"maximum\":2}", "2.0", true},
        {"{\"exclusiveMinimum\":2}", "2", false}, {"{\"minimum\":2,\"exclusiveMinimum\":true}", "2.5", true},
        {"{\"maximum\":2,\"exclusiveMaximum\":true}", "2", false}, {"{\"exclusiveMaximum\":0}", "-0.001", true},
        {"{\"minimum\":2}", "\"1\"", true},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        json_error_t je;
        json_t *s = json_loads(c[i].schema, 0, &je), *d = json_loads(c[i].doc, JSON_DECODE_ANY, &je);
        CHECK_MSG(s && d && validate(d, s, s, 0) == c[i].valid, "%s on %s", c[i].schema, c[i].doc);
        json_decref(s);
        json_decref(d);
    }
}

/* ---- random schemas over the supported subset ---- */

typedef struct {
    uint64_t s;
} rng;

static uint32_t rnd(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 11);
}
static uint32_t rn(rng *r, uint32_t n) { return n ? rnd(r) % n : 0; }

static const char *const str_palette[] = {"red", "caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x99\x82 ok",
                                          "a\"b", "tab\tx", "", "x"};
static const char *const names[] = {"id", "name", "value", "tags", "a", "ab", "caf\xc3\xa9", "x y"};

static json_t *rand_literal(rng *r, int depth) {
    switch (rn(r, depth > 1 ? 6 : 8)) {
    case 0: return json_string(str_palette[rn(r, 8)]);
    case 1: return json_integer((json_int_t)rn(r, 200) - 50);
    case 2: {
        static const double reals[] = {1.5, -0.25, 2.75, 1e20, 3.0};
        return json_real(reals[rn(r, 5)]);
    }
    case 3: return json_null();
    case 4: return json_boolean(rn(r, 2));
    case 5: return json_string(str_palette[rn(r, 8)]);
    case 6: return json_pack("[oo]", rand_literal(r, depth + 1), rand_literal(r, depth + 1));
    default: return json_pack("{so}", names[rn(r, 8)], rand_literal(r, depth + 1));
    }
}

static json_t *rand_schema(rng *r, int depth, int n_defs, bool node_def);

static json_t *rand_scalar(rng *r) {
    switch (rn(r, 9)) {
    case 0: return json_pack("{ss}", "type", "integer");
    case 1: return json_pack("{ss}", "type", "number");
    case 2: return json_pack("{ss}", "type", "boolean");
    case 3: return json_pack("{ss}", "type", "null");
    case 4: {
        static const char *const f[] = {"date", "date-time", "uuid"};
        return json_pack("{ssss}", "type", "string", "format", f[rn(r, 3)]);
    }
    case 5: {
        json_t *s = json_pack("{ss}", "type", "string");
        uint32_t mn = rn(r, 3);
        if (rn(r, 2)) json_object_set_new(s, "minLength", json_integer(mn));
        if (rn(r, 2)) json_object_set_new(s, "maxLength", json_integer(mn + rn(r, 6)));
        return s;
    }
    case 6: {
        json_t *e = json_array();
        for (uint32_t i = 0, n = 1 + rn(r, 4); i < n; i++) json_array_append_new(e, rand_literal(r, 0));
        return json_pack("{so}", "enum", e);
    }
    case 7: return json_pack("{so}", "const", rand_literal(r, 0));
    default: return json_pack("{s[ss]}", "type", "string", "null");
    }
}

static json_t *rand_schema(rng *r, int depth, int n_defs, bool node_def) {
    uint32_t k = depth >= 3 ? 0 : rn(r, 12);
    if (k <= 3) return rand_scalar(r);
    if (k == 4 || k == 5) {
        json_t *s = json_pack("{ss}", "type", "array");
        if (rn(r, 4)) json_object_set_new(s, "items", rand_schema(r, depth + 1, n_defs, node_def));
        uint32_t mn = rn(r, 3);
        if (rn(r, 2)) json_object_set_new(s, "minItems", json_integer(mn));
        if (rn(r, 2)) json_object_set_new(s, "maxItems", json_integer(mn + rn(r, 3)));
        return s;
    }
    if (k == 6 || k == 7) {
        json_t *s = json_pack("{ss}", "type", "object"), *props = json_object(), *req = json_array();
        uint32_t used = 0;
        for (uint32_t i = 0, n = rn(r, 5); i < n; i++) {
            uint32_t j = rn(r, 8);
            if (used & (1u << j)) continue;
            used |= 1u << j;
            json_object_set_new(props, names[j], rn(r, 10) ? rand_schema(r, depth + 1, n_defs, node_def) : json_false());
            if (rn(r, 2) && !json_is_false(json_object_get(props, names[j]))) json_array_append_new(req, json_string(names[j]));
        }
        json_object_set_new(s, "properties", props);
        json_object_set_new(s, "required", req);
        switch (rn(r, 4)) {
        case 0: json_object_set_new(s, "additionalProperties", json_false()); break;
        case 1: json_object_set_new(s, "additionalProperties", json_true()); break;
        case 2: json_object_set_new(s, "additionalProperties", rand_scalar(r)); break;
        default: break;
        }
        return s;
    }
    if (k == 8) {
        json_t *a = json_array();
        for (uint32_t i = 0, n = 2 + rn(r, 2); i < n; i++) json_array_append_new(a, rand_schema(r, depth + 1, n_defs, node_def));
        return json_pack("{so}", "anyOf", a);
    }
    if (k == 9) { /* oneOf with branches of different types, so one matches */
        static const char *const t[] = {"null", "boolean", "string", "array"};
        uint32_t x = rn(r, 4), y = (x + 1 + rn(r, 3)) % 4;
        return json_pack("{s[{ss}{ss}]ss}", "oneOf", "type", t[x], "type", t[y], "description", "one of two");
    }
    if (k == 10 && (n_defs || node_def)) {
        char ref[32];
        if (node_def && (!n_defs || rn(r, 2)))
            snprintf(ref, sizeof ref, "#/$defs/node");
        else
            snprintf(ref, sizeof ref, "#/$defs/d%u", rn(r, (uint32_t)n_defs));
        return json_pack("{ss}", "$ref", ref);
    }
    return rn(r, 2) ? json_true() : json_object();
}

static json_t *rand_root(rng *r) {
    int n_defs = rn(r, 3) == 0 ? 1 + (int)rn(r, 2) : 0;
    bool node = rn(r, 4) == 0;
    json_t *s = rand_schema(r, 0, n_defs, node);
    if (json_is_boolean(s) || (!n_defs && !node)) return s;
    json_t *defs = json_object();
    for (int i = 0; i < n_defs; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        json_object_set_new(defs, name, rand_schema(r, 2, 0, false));
    }
    if (node)
        json_object_set_new(defs, "node",
                            json_pack("{sss{s{ss}s{sss{ss}si}}s[s]sb}", "type", "object", "properties", "v", "type",
                                      "integer", "kids", "type", "array", "items", "$ref", "#/$defs/node", "maxItems",
                                      2, "required", "v", "additionalProperties", 0));
    json_object_set_new(s, "$defs", defs);
    return s;
}

/* ---- an independent generator of valid documents, as text ---- */

typedef struct {
    rng *r;
    kp_buf out;
    int ws_max;
    const json_t *root;
} gen;

static void g_ws(gen *g) {
    if (g->ws_max == 0 || rn(g->r, 3) == 0) return;
    int n = rn(g->r, 4) == 0 ? (int)rn(g->r, (uint32_t)g->ws_max + 1) : (int)rn(g->r, 2) + 1;
    if (n > g->ws_max) n = g->ws_max;
    static const char wsc[] = " \t\n\r";
    for (int i = 0; i < n; i++) kp_buf_putc(&g->out, i == 0 && n > 2 ? '\n' : i > 0 && n > 2 ? ' ' : wsc[rn(g->r, 4)]);
}

/* the documented canonical spelling of enum/const strings */
static void g_canon_str(gen *g, const char *s, size_t n) {
    kp_buf_putc(&g->out, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') kp_buf_puts(&g->out, "\\\"");
        else if (c == '\\') kp_buf_puts(&g->out, "\\\\");
        else if (c == '\b') kp_buf_puts(&g->out, "\\b");
        else if (c == '\f') kp_buf_puts(&g->out, "\\f");
        else if (c == '\n') kp_buf_puts(&g->out, "\\n");
        else if (c == '\r') kp_buf_puts(&g->out, "\\r");
        else if (c == '\t') kp_buf_puts(&g->out, "\\t");
        else if (c < 0x20) kp_buf_printf(&g->out, "\\u%04x", c);
        else kp_buf_putc(&g->out, (char)c);
    }
    kp_buf_putc(&g->out, '"');
}

static void g_canon(gen *g, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: kp_buf_puts(&g->out, "null"); break;
    case JSON_TRUE: kp_buf_puts(&g->out, "true"); break;
    case JSON_FALSE: kp_buf_puts(&g->out, "false"); break;
    case JSON_INTEGER: kp_buf_printf(&g->out, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: {
        double d = json_real_value(v);
        char t[64];
        if (d == floor(d) && fabs(d) < 1e15) {
            snprintf(t, sizeof t, "%.0f", d);
        } else {
            for (int p = 1; p <= 17; p++) {
                snprintf(t, sizeof t, "%.*g", p, d);
                if (strtod(t, NULL) == d) break;
            }
        }
        kp_buf_puts(&g->out, t);
        break;
    }
    case JSON_STRING: g_canon_str(g, json_string_value(v), json_string_length(v)); break;
    case JSON_ARRAY:
        kp_buf_putc(&g->out, '[');
        g_ws(g);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) {
                kp_buf_putc(&g->out, ',');
                g_ws(g);
            }
            g_canon(g, json_array_get(v, i));
            g_ws(g);
        }
        kp_buf_putc(&g->out, ']');
        break;
    case JSON_OBJECT: {
        kp_buf_putc(&g->out, '{');
        g_ws(g);
        size_t i = 0;
        for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it), i++) {
            if (i) {
                kp_buf_putc(&g->out, ',');
                g_ws(g);
            }
            g_canon_str(g, json_object_iter_key(it), strlen(json_object_iter_key(it)));
            g_ws(g);
            kp_buf_putc(&g->out, ':');
            g_ws(g);
            g_canon(g, json_object_iter_value(it));
            g_ws(g);
        }
        kp_buf_putc(&g->out, '}');
        break;
    }
    }
}

/* one code point of string content, written raw or escaped in one of the
 * ways RFC 8259 allows */
static void g_char(gen *g) {
    static const uint32_t cps[] = {'a', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', 0x01, 0xE9, 0x65E5, 0x1F642, 0x7F};
    uint32_t c = cps[rn(g->r, sizeof cps / sizeof cps[0])];
    bool esc = rn(g->r, 3) == 0;
    const char *hexd = rn(g->r, 2) ? "0123456789abcdef" : "0123456789ABCDEF";
    if (c == '"' || c == '\\' || (c == '/' && esc)) {
        kp_buf_putc(&g->out, '\\');
        kp_buf_putc(&g->out, (char)c);
    } else if (c < 0x20 || (esc && c < 0x10000)) {
        if (c == '\n' && !esc) {
            kp_buf_puts(&g->out, "\\n");
        } else if (c == '\t' && !esc) {
            kp_buf_puts(&g->out, "\\t");
        } else {
            kp_buf_printf(&g->out, "\\u%c%c%c%c", hexd[c >> 12], hexd[(c >> 8) & 15], hexd[(c >> 4) & 15], hexd[c & 15]);
        }
    } else if (esc) { /* a surrogate pair */
        uint32_t v = c - 0x10000, hi = 0xD800 + (v >> 10), lo = 0xDC00 + (v & 0x3FF);
        kp_buf_printf(&g->out, "\\u%c%c%c%c\\u%c%c%c%c", hexd[hi >> 12], hexd[(hi >> 8) & 15], hexd[(hi >> 4) & 15],
                      hexd[hi & 15], hexd[lo >> 12], hexd[(lo >> 8) & 15], hexd[(lo >> 4) & 15], hexd[lo & 15]);
    } else {
        char u[5] = {0};
        if (c < 0x80) u[0] = (char)c;
        else if (c < 0x800) { u[0] = (char)(0xC0 | c >> 6); u[1] = (char)(0x80 | (c & 63)); }
        else if (c < 0x10000) { u[0] = (char)(0xE0 | c >> 12); u[1] = (char)(0x80 | ((c >> 6) & 63)); u[2] = (char)(0x80 | (c & 63)); }
        else { u[0] = (char)(0xF0 | c >> 18); u[1] = (char)(0x80 | ((c >> 12) & 63)); u[2] = (char)(0x80 | ((c >> 6) & 63)); u[3] = (char)(0x80 | (c & 63)); }
        kp_buf_puts(&g->out, u);
    }
}

static void g_digits(gen *g, int n, bool lead_nonzero) {
    for (int i = 0; i < n; i++) kp_buf_putc(&g->out, (char)('0' + (i == 0 && lead_nonzero ? 1 + rn(g->r, 9) : rn(g->r, 10))));
}

static void g_int(gen *g) {
    if (rn(g->r, 2)) kp_buf_putc(&g->out, '-');
    if (rn(g->r, 5) == 0)
        kp_buf_putc(&g->out, '0');
    else
        g_digits(g, 1 + (int)rn(g->r, 18), true);
}

static void g_format(gen *g, const char *f) {
    kp_buf_putc(&g->out, '"');
    if (!strcmp(f, "uuid")) {
        static const char *const hx[2] = {"0123456789abcdef", "0123456789ABCDEF"};
        for (int i = 0; i < 36; i++)
            kp_buf_putc(&g->out, i == 8 || i == 13 || i == 18 || i == 23 ? '-' : hx[rn(g->r, 2)][rn(g->r, 16)]);
    } else {
        int y = (int)rn(g->r, 10000), m = 1 + (int)rn(g->r, 12);
        static const int md[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
        int dmax = md[m - 1] + (m == 2 && leap);
        int d = rn(g->r, 3) == 0 ? dmax : 1 + (int)rn(g->r, (uint32_t)dmax);
        kp_buf_printf(&g->out, "%04d-%02d-%02d", y, m, d);
        if (!strcmp(f, "date-time")) {
            kp_buf_printf(&g->out, "T%02u:%02u:%02u", rn(g->r, 24), rn(g->r, 60), rn(g->r, 60));
            if (rn(g->r, 2)) {
                kp_buf_putc(&g->out, '.');
                g_digits(g, 1 + (int)rn(g->r, 9), false);
            }
            if (rn(g->r, 2))
                kp_buf_putc(&g->out, 'Z');
            else
                kp_buf_printf(&g->out, "%c%02u:%02u", rn(g->r, 2) ? '+' : '-', rn(g->r, 24), rn(g->r, 60));
        }
    }
    kp_buf_putc(&g->out, '"');
}

static void g_value(gen *g, const json_t *s, int depth);

static void g_any(gen *g, int depth) {
    uint32_t k = rn(g->r, depth > 3 ? 5 : 7);
    if (k == 5) {
        json_t *s = json_pack("{ss}", "type", "array");
        g_value(g, s, depth);
        json_decref(s);
    } else if (k == 6) {
        json_t *s = json_pack("{ss}", "type", "object");
        g_value(g, s, depth);
        json_decref(s);
    } else {
        static const char *const t[] = {"null", "boolean", "integer", "number", "string"};
        json_t *s = json_pack("{ss}", "type", t[k]);
        g_value(g, s, depth);
        json_decref(s);
    }
}

static bool in_names(const char *k, const char *const *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, v[i])) return true;
    return false;
}

static void g_object(gen *g, const json_t *s, int depth) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    bool ap_ok = !ap || !json_is_false(ap);
    const char *declared[32];
    size_t nd = 0;
    bool first = true;
    kp_buf_putc(&g->out, '{');
    g_ws(g);
    /* the declared properties in schema order, then required-only ones */
    const char *order[32];
    const json_t *osch[32];
    bool oreq[32];
    size_t no = 0;
    const char *k;
    json_t *ps;
    if (props)
        json_object_foreach((json_t *)props, k, ps) {
            declared[nd++] = k;
            if (json_is_false(ps)) continue;
            bool r = false;
            for (size_t i = 0; req && i < json_array_size(req); i++) r |= !strcmp(json_string_value(json_array_get(req, i)), k);
            order[no] = k;
            osch[no] = ps;
            oreq[no++] = r;
        }
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const char *rk = json_string_value(json_array_get(req, i));
        if (in_names(rk, declared, nd) || in_names(rk, order, no)) continue;
        order[no] = rk;
        osch[no] = ap ? ap : json_true();
        oreq[no++] = true;
    }
    for (size_t i = 0; i < no; i++) {
        if (!oreq[i] && (depth > 5 || rn(g->r, 2))) continue;
        if (!first) {
            kp_buf_putc(&g->out, ',');
            g_ws(g);
        }
        first = false;
        g_canon_str(g, order[i], strlen(order[i]));
        g_ws(g);
        kp_buf_putc(&g->out, ':');
        g_ws(g);
        g_value(g, osch[i], depth + 1);
        g_ws(g);
    }
    static const char *const extra[] = {"k1", "zz", "a", "abc", "nam", "\xc3\xa9t\xc3\xa9", "x"};
    for (uint32_t n = ap_ok && depth <= 5 ? rn(g->r, 3) : 0, i = 0; i < n; i++) {
        const char *ek = extra[rn(g->r, 7)];
        if (in_names(ek, declared, nd) || in_names(ek, order, no)) continue;
        if (!first) {
            kp_buf_putc(&g->out, ',');
            g_ws(g);
        }
        first = false;
        g_canon_str(g, ek, strlen(ek));
        g_ws(g);
        kp_buf_putc(&g->out, ':');
        g_ws(g);
        if (ap && json_is_object(ap))
            g_value(g, ap, depth + 1);
        else
            g_any(g, depth + 1);
        g_ws(g);
    }
    kp_buf_putc(&g->out, '}');
}

static void g_value(gen *g, const json_t *s, int depth) {
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        g_any(g, depth);
        return;
    }
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        g_value(g, v_resolve(g->root, json_string_value(x)), depth + 1);
        return;
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf")) || (x = json_object_get(s, "allOf"))) {
        g_value(g, json_array_get(x, rn(g->r, (uint32_t)json_array_size(x))), depth + 1);
        return;
    }
    if ((x = json_object_get(s, "const"))) {
        g_canon(g, x);
        return;
    }
    const json_t *t = json_object_get(s, "type");
    if ((x = json_object_get(s, "enum"))) {
        const json_t *v;
        do v = json_array_get(x, rn(g->r, (uint32_t)json_array_size(x)));
        while (t && !(json_is_string(t) ? type_is(v, json_string_value(t)) : true));
        g_canon(g, v);
        return;
    }
    const char *ty = t ? (json_is_string(t) ? json_string_value(t)
                                            : json_string_value(json_array_get(t, rn(g->r, (uint32_t)json_array_size(t)))))
                       : NULL;
    if (!ty) {
        /* no type: pick one; the keywords of the others do not apply */
        static const char *const all[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
        ty = all[rn(g->r, depth > 4 ? 5 : 7)];
    }
    if (!strcmp(ty, "null")) {
        kp_buf_puts(&g->out, "null");
    } else if (!strcmp(ty, "boolean")) {
        kp_buf_puts(&g->out, rn(g->r, 2) ? "true" : "false");
    } else if (!strcmp(ty, "integer")) {
        g_int(g);
    } else if (!strcmp(ty, "number")) {
        g_int(g);
        if (rn(g->r, 2)) {
            kp_buf_putc(&g->out, '.');
            g_digits(g, 1 + (int)rn(g->r, 18), false);
        }
        if (rn(g->r, 3) == 0) {
            kp_buf_putc(&g->out, "eE"[rn(g->r, 2)]);
            if (rn(g->r, 2)) kp_buf_putc(&g->out, "+-"[rn(g->r, 2)]);
            g_digits(g, 1 + (int)rn(g->r, 2), false);
        }
    } else if (!strcmp(ty, "string")) {
        if ((x = json_object_get(s, "format"))) {
            g_format(g, json_string_value(x));
        } else {
            uint32_t mn = (x = json_object_get(s, "minLength")) ? (uint32_t)json_integer_value(x) : 0;
            uint32_t mx = (x = json_object_get(s, "maxLength")) ? (uint32_t)json_integer_value(x) : mn + 8;
            uint32_t n = mn + rn(g->r, mx - mn + 1);
            kp_buf_putc(&g->out, '"');
            for (uint32_t i = 0; i < n; i++) g_char(g);
            kp_buf_putc(&g->out, '"');
        }
    } else if (!strcmp(ty, "array")) {
        uint32_t mn = (x = json_object_get(s, "minItems")) ? (uint32_t)json_integer_value(x) : 0;
        uint32_t mx = (x = json_object_get(s, "maxItems")) ? (uint32_t)json_integer_value(x) : mn + 3;
        uint32_t n = depth > 5 ? mn : mn + rn(g->r, mx - mn + 1);
        const json_t *items = json_object_get(s, "items");
        kp_buf_putc(&g->out, '[');
        g_ws(g);
        for (uint32_t i = 0; i < n; i++) {
            if (i) {
                kp_buf_putc(&g->out, ',');
                g_ws(g);
            }
            if (items)
                g_value(g, items, depth + 1);
            else
                g_any(g, depth + 1);
            g_ws(g);
        }
        kp_buf_putc(&g->out, ']');
    } else {
        g_object(g, s, depth);
    }
}

/* A valid document of schema s (root: where $refs point), as text. */
static void gen_doc(rng *r, const json_t *s, int ws_max, kp_buf *out) {
    gen g = {.r = r, .ws_max = ws_max, .root = s};
    g_ws(&g);
    g_value(&g, s, 0);
    g_ws(&g);
    *out = g.out;
}

/* ---- masks ---- */

static bool bit(const uint32_t *mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

/* The brute-force mask: every token's bytes fed to a clone of m. Returns
 * the number of differences with `fast` (and prints the first few). */
static int brute_mask_diff(const kp_gmatch *m, const kp_tok_vocab *v, const uint32_t *fast) {
    int32_t n = kp_tok_n_vocab(v);
    int diffs = 0;
    kp_gmatch *c = NULL;
    kp_error err = {0};
    for (int32_t id = 0; id < n; id++) {
        bool want;
        size_t len;
        const char *p = kp_tok_piece_view(v, id, false, &len);
        if (kp_tok_is_eog(v, id)) {
            want = kp_gmatch_complete(m);
        } else if (len == 0) {
            want = false;
        } else {
            if (!c && kp_gmatch_clone(&c, m, &err) != KP_OK) return -1;
            want = kp_gmatch_accept_bytes(c, p, len, NULL) == KP_OK;
            if (want) {
                kp_gmatch_free(c);
                c = NULL;
            }
        }
        if (want != bit(fast, id)) {
            if (diffs++ < 3) fprintf(stderr, "  mask differs at token %d '%.*s': brute %d fast %d\n", id, (int)len, p, want, !want);
        }
    }
    kp_gmatch_free(c);
    return diffs;
}

static size_t count_bits(const uint32_t *mask, size_t words) {
    size_t n = 0;
    for (size_t i = 0; i < words; i++) n += (size_t)__builtin_popcount(mask[i]);
    return n;
}

/* A uniformly random allowed token (the k-th set bit). */
static int32_t pick(rng *r, const uint32_t *mask, size_t words, size_t n_allowed) {
    size_t k = rn(r, (uint32_t)n_allowed);
    for (size_t w = 0; w < words; w++) {
        size_t c = (size_t)__builtin_popcount(mask[w]);
        if (k >= c) {
            k -= c;
            continue;
        }
        uint32_t x = mask[w];
        while (k--) x &= x - 1;
        return (int32_t)(w * 32 + (size_t)__builtin_ctz(x));
    }
    return -1;
}

/* ---- property tests ---- */

typedef struct {
    int schemas, compile_fail, walks, walk_docs, completions, brute, brute_diff, gen_docs, gen_fed, gen_skipped;
    int bad_json, invalid;
} pstats;

static bool parse_and_validate(const char *text, size_t len, const json_t *schema, pstats *ps, const char *what) {
    json_error_t je;
    json_t *d = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!d) {
        ps->bad_json++;
        CHECK_MSG(0, "%s: not JSON (%s): %.*s", what, je.text, (int)len, text);
        return false;
    }
    bool ok = validate(d, schema, schema, 0);
    if (!ok) {
        ps->invalid++;
        char *st = json_dumps(schema, JSON_COMPACT);
        CHECK_MSG(0, "%s: does not validate: %.*s\n  schema %s", what, (int)len, text, st);
        free(st);
    }
    json_decref(d);
    return ok;
}

/* (a) the completion of a clone of m exists, completes it, and the whole
 * document is valid */
static void check_completion(const kp_gmatch *m, const kp_buf *sofar, const json_t *schema, pstats *ps) {
    kp_gmatch *c = NULL;
    kp_error err = {0};
    kp_buf suffix = {0}, doc = {0};
    CHECK(kp_gmatch_clone(&c, m, &err) == KP_OK);
    kp_status st = kp_gmatch_completion(c, 1 << 16, &suffix, &err);
    CHECK_MSG(st == KP_OK, "completion: %s", err.msg);
    if (st == KP_OK) {
        st = kp_gmatch_accept_bytes(c, suffix.data ? suffix.data : "", suffix.len, &err);
        CHECK_MSG(st == KP_OK && kp_gmatch_complete(c), "completion not accepted: %s", err.msg);
        kp_buf_put(&doc, sofar->data ? sofar->data : "", sofar->len);
        kp_buf_put(&doc, suffix.data ? suffix.data : "", suffix.len);
        parse_and_validate(doc.data ? doc.data : "", doc.len, schema, ps, "prefix + completion");
        ps->completions++;
    }
    kp_buf_free(&suffix);
    kp_buf_free(&doc);
    kp_gmatch_free(c);
}

/* A random walk: random allowed tokens; every prefix can continue or is
 * complete; then the shortest completion; the document must validate. */
static void random_walk(rng *r, const kp_grammar *g, const kp_gvocab *gv, const kp_tok_vocab *v, const json_t *schema,
                        pstats *ps, int max_tokens, int brute_every) {
    kp_gmatch *m = NULL;
    kp_error err = {0};
    if (kp_gmatch_new(&m, g, gv, &err) != KP_OK) {
        CHECK_MSG(0, "kp_gmatch_new: %s", err.msg);
        return;
    }
    size_t words = kp_gvocab_mask_words(gv);
    uint32_t *mask = malloc(words * 4);
    kp_buf doc = {0};
    int n_tok = 1 + (int)rn(r, (uint32_t)max_tokens);
    bool ended = false;
    for (int i = 0; i < n_tok && !ended; i++) {
        size_t na = 0;
        kp_status st = kp_gmatch_mask(m, mask, &na, &err);
        CHECK_MSG(st == KP_OK, "mask: %s", err.msg);
        if (st != KP_OK) break;
        CHECK_EQ_INT(na, count_bits(mask, words));
        CHECK(kp_gmatch_complete(m) || kp_gmatch_can_continue(m));
        if (brute_every && i % brute_every == 0) {
            int d = brute_mask_diff(m, v, mask);
            ps->brute++;
            if (d) ps->brute_diff++;
            CHECK_MSG(d == 0, "fast mask != brute force (%d tokens) after '%.*s'", d, (int)doc.len, doc.data);
        }
        if (i % 7 == 3) check_completion(m, &doc, schema, ps);
        if (na == 0) break;
        int32_t id = pick(r, mask, words, na);
        /* lean towards ending when an end-of-generation token is allowed */
        if (kp_gmatch_complete(m) && rn(r, 3) == 0) {
            for (int32_t e = 0; e < kp_tok_n_vocab(v); e++)
                if (kp_tok_is_eog(v, e)) {
                    id = e;
                    break;
                }
        }
        st = kp_gmatch_accept_token(m, id, &err);
        CHECK_MSG(st == KP_OK, "an allowed token is refused: %s", err.msg);
        if (st != KP_OK) break;
        if (kp_tok_is_eog(v, id)) {
            ended = true;
            CHECK(kp_gmatch_finished(m));
        } else {
            size_t len;
            const char *p = kp_tok_piece_view(v, id, false, &len);
            kp_buf_put(&doc, p, len);
        }
    }
    if (!ended) {
        kp_buf suffix = {0};
        kp_status st = kp_gmatch_completion(m, 1 << 16, &suffix, &err);
        CHECK_MSG(st == KP_OK, "completion: %s", err.msg);
        if (st == KP_OK) {
            CHECK(kp_gmatch_accept_bytes(m, suffix.data ? suffix.data : "", suffix.len, &err) == KP_OK);
            CHECK(kp_gmatch_complete(m));
            kp_buf_put(&doc, suffix.data ? suffix.data : "", suffix.len);
        }
        kp_buf_free(&suffix);
    }
    parse_and_validate(doc.data ? doc.data : "", doc.len, schema, ps, "random walk");
    ps->walks++;
    kp_buf_free(&doc);
    free(mask);
    kp_gmatch_free(m);
}

/* (c) a generated valid document, tokenized by the real tokenizer, is
 * accepted token by token (each one in the mask) and complete at the end */
static void feed_generated(rng *r, const kp_grammar *g, const kp_gvocab *gv, const kp_tok_vocab *v,
                           const json_t *schema, int ws_max, pstats *ps, bool mask_each) {
    kp_buf text = {0};
    gen_doc(r, schema, ws_max, &text);
    ps->gen_docs++;
    /* SentencePiece adds a leading space: let it be the document's only one */
    if (kp_tok_add_space_prefix(v) && kp_tok_model_kind(v) == KP_TOK_MODEL_SPM) {
        size_t k = 0;
        while (k < text.len && strchr(" \t\n\r", text.data[k])) k++;
        memmove(text.data, text.data + k, text.len - k + 1);
        text.len -= k;
    }
    /* the generator is checked by the validator too */
    if (!parse_and_validate(text.data, text.len, schema, ps, "generated document")) {
        kp_buf_free(&text);
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kp_error err = {0};
    CHECK(kp_tok_encode(v, text.data, text.len, false, false, &ids, &n, &err) == KP_OK);
    /* the pieces must spell the text (SPM adds one leading space) */
    kp_buf spelled = {0};
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = kp_tok_piece_view(v, ids[i], false, &len);
        kp_buf_put(&spelled, p, len);
    }
    bool same = spelled.len == text.len && memcmp(spelled.data, text.data, text.len) == 0;
    bool spm_space = spelled.len == text.len + 1 && spelled.data[0] == ' ' && memcmp(spelled.data + 1, text.data, text.len) == 0;
    if (!same && !(spm_space && ws_max > 0)) {
        ps->gen_skipped++;
    } else {
        kp_gmatch *m = NULL;
        CHECK(kp_gmatch_new(&m, g, gv, &err) == KP_OK);
        size_t words = kp_gvocab_mask_words(gv);
        uint32_t *mask = malloc(words * 4);
        bool ok = m && mask;
        for (size_t i = 0; i < n && ok; i++) {
            if (mask_each) {
                CHECK(kp_gmatch_mask(m, mask, NULL, &err) == KP_OK);
                CHECK_MSG(bit(mask, ids[i]), "token %zu (%d) of a valid document is not in the mask: %s", i, ids[i],
                          text.data);
            }
            ok = kp_gmatch_accept_token(m, ids[i], &err) == KP_OK;
            CHECK_MSG(ok, "a valid document is refused at token %zu: %s\n  %s", i, err.msg, text.data);
        }
        if (ok) {
            CHECK_MSG(kp_gmatch_complete(m), "a valid document is not complete: %s", text.data);
            ps->gen_fed++;
        }
        free(mask);
        kp_gmatch_free(m);
    }
    kp_buf_free(&spelled);
    free(ids);
    kp_buf_free(&text);
}

static void property_run(const char *label, const kp_tok_vocab *v, uint64_t seed, int n_schemas, int walks,
                         int max_tokens, int gens, int brute_every) {
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new(&gv, v, &err) == KP_OK);
    if (!gv) return;
    rng r = {seed};
    pstats ps = {0};
    for (int i = 0; i < n_schemas; i++) {
        json_t *s = rand_root(&r);
        int ws_max = 1 + (int)rn(&r, 6);
        kp_schema_opts o = kp_schema_opts_default();
        o.ws_max = ws_max;
        kp_grammar *g = NULL;
        kp_status st = kp_grammar_compile_schema(s, &o, &g, &err);
        ps.schemas++;
        if (st != KP_OK) {
            /* the generator only builds supported schemas; the one refusal
             * allowed is a schema with no finite document */
            bool ok = st == KP_EINVAL && strstr(err.msg, "can never finish");
            char *t = json_dumps(s, JSON_COMPACT);
            CHECK_MSG(ok, "schema refused: %s\n  %s", err.msg, t);
            free(t);
            ps.compile_fail++;
            json_decref(s);
            continue;
        }
        for (int w = 0; w < walks; w++) random_walk(&r, g, gv, v, s, &ps, max_tokens, brute_every);
        for (int k = 0; k < gens; k++) feed_generated(&r, g, gv, v, s, ws_max, &ps, k == 0);
        kp_grammar_free(g);
        json_decref(s);
    }
    printf("  %s: %d schemas (%d without finite documents), %d random walks, %d completions checked, "
           "%d brute-force masks (%d differ), %d generated documents (%d fed, %d not spelled by the tokenizer)\n",
           label, ps.schemas, ps.compile_fail, ps.walks, ps.completions, ps.brute, ps.brute_diff, ps.gen_docs,
           ps.gen_fed, ps.gen_skipped);
    CHECK(ps.bad_json == 0 && ps.invalid == 0 && ps.brute_diff == 0);
    CHECK(ps.gen_fed > ps.gen_docs / 2);
    kp_gvocab_free(gv);
}

static void test_property_bpe_small(void) {
    kp_tok_vocab *v = load_vocab("tests/data/vocab/gen-qwen2-vocab.gguf");
    CHECK(v != NULL);
    if (v) property_run("gen-qwen2 (2048 tokens, byte-level BPE)", v, 0x9E3779B97F4A7C15ull, 1200, 2, 40, 3, 20);
    kp_tok_vocab_free(v);
}

static void test_property_spm(void) {
    kp_tok_vocab *v = load_stories();
    CHECK(v != NULL);
    if (v) property_run("stories260K (512 tokens, SentencePiece with byte fallback)", v, 0xD1B54A32D192ED03ull, 600, 2,
                        40, 3, 9);
    kp_tok_vocab_free(v);
}

static void test_property_bpe_large(void) {
    kp_tok_vocab *v = load_vocab("tests/data/vocab/ggml-vocab-starcoder.gguf");
    CHECK(v != NULL);
    if (v) property_run("starcoder (49152 tokens)", v, 0xA0761D6478BD642Full, 40, 1, 25, 2, 12);
    kp_tok_vocab_free(v);
}

/* ---- multi-byte characters split across tokens ---- */

/* Every segmentation of the value's bytes into the vocabulary's pieces is
 * accepted: at each byte offset every token whose piece matches there is
 * in the mask and accepted, a wrong continuation byte is not; the walk
 * over all segmentations ends complete. */
static int64_t dfs_splits(const kp_gmatch *m, const kp_tok_vocab *v, const uint8_t *doc, size_t len, size_t at,
                          int64_t budget) {
    if (at == len) {
        CHECK(kp_gmatch_complete(m));
        return 1;
    }
    int64_t paths = 0;
    kp_error err = {0};
    for (int32_t id = 0; id < kp_tok_n_vocab(v) && paths < budget; id++) {
        size_t pl;
        const char *p = kp_tok_piece_view(v, id, false, &pl);
        if (!pl || pl > len - at || memcmp(p, doc + at, pl) != 0 || kp_tok_is_eog(v, id)) continue;
        kp_gmatch *c = NULL;
        CHECK(kp_gmatch_clone(&c, m, &err) == KP_OK);
        kp_status st = kp_gmatch_accept_token(c, id, &err);
        CHECK_MSG(st == KP_OK, "split at %zu by token %d refused: %s", at, id, err.msg);
        if (st == KP_OK) paths += dfs_splits(c, v, doc, len, at + pl, budget - paths);
        kp_gmatch_free(c);
    }
    return paths;
}

static void multibyte_on(const char *label, kp_tok_vocab *v) {
    static const char *const words[] = {"caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x99\x82", "na\xc3\xafve"};
    kp_grammar *g = schema_g("{\"type\":\"object\",\"properties\":{\"w\":{\"enum\":[\"caf\xc3\xa9\",\"\xe6\x97\xa5\xe6\x9c\xac\","
                             "\"\xf0\x9f\x99\x82\",\"na\xc3\xafve\"]}},\"required\":[\"w\"],\"additionalProperties\":false}",
                             1);
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new(&gv, v, &err) == KP_OK);
    if (!g || !gv) return;
    size_t words_n = kp_gvocab_mask_words(gv);
    uint32_t *mask = malloc(words_n * 4);
    int64_t total = 0;
    for (size_t w = 0; w < 4; w++) {
        char doc[64];
        snprintf(doc, sizeof doc, "\"%s\"}", words[w]);
        size_t len = strlen(doc);
        kp_gmatch *m = NULL;
        CHECK(kp_gmatch_new(&m, g, gv, &err) == KP_OK);
        CHECK(kp_gmatch_accept_bytes(m, "{\"w\":", 5, &err) == KP_OK);
        /* per offset: the state is the same whichever split led there */
        kp_gmatch *at = NULL;
        CHECK(kp_gmatch_clone(&at, m, &err) == KP_OK);
        for (size_t i = 0; i < len && at; i++) {
            CHECK(kp_gmatch_mask(at, mask, NULL, &err) == KP_OK);
            for (int32_t id = 0; id < kp_tok_n_vocab(v); id++) {
                size_t pl;
                const char *p = kp_tok_piece_view(v, id, false, &pl);
                if (!pl || kp_tok_is_eog(v, id)) continue;
                bool matches = pl <= len - i && memcmp(p, doc + i, pl) == 0;
                if (matches) CHECK_MSG(bit(mask, id), "%s: '%s' offset %zu: token %d not allowed", label, doc, i, id);
                /* a single byte that makes another character (or broken UTF-8) must not be allowed
                 * where the enum admits only one continuation */
                if (pl == 1 && !matches && i > 0 && ((unsigned char)doc[i] & 0xC0) == 0x80)
                    CHECK_MSG(!bit(mask, id), "%s: '%s' offset %zu: wrong byte 0x%02x allowed", label, doc, i,
                              (unsigned char)p[0]);
            }
            CHECK(kp_gmatch_accept_bytes(at, doc + i, 1, &err) == KP_OK);
        }
        CHECK(at && kp_gmatch_complete(at));
        kp_gmatch_free(at);
        int64_t paths = dfs_splits(m, v, (const uint8_t *)doc, len, 0, 20000);
        CHECK(paths >= 1);
        total += paths;
        kp_gmatch_free(m);
    }
    printf("  %s: %lld tokenizations of the four enum values accepted\n", label, (long long)total);
    free(mask);
    kp_gvocab_free(gv);
    kp_grammar_free(g);
}

static void test_multibyte(void) {
    kp_tok_vocab *v = load_vocab("tests/data/vocab/ggml-vocab-gpt-2.gguf");
    CHECK(v != NULL);
    if (v) multibyte_on("gpt-2 (byte-level BPE)", v);
    kp_tok_vocab_free(v);
    v = load_stories();
    CHECK(v != NULL);
    /* SPM: the byte-fallback tokens <0xE6> ... split characters */
    int32_t byte_e6 = v ? kp_tok_find(v, "<0xE6>", 6) : -1;
    CHECK(byte_e6 >= 0);
    if (v) multibyte_on("stories260K (SentencePiece, byte fallback)", v);
    kp_tok_vocab_free(v);
    v = load_vocab("tests/data/vocab/ggml-vocab-llama-spm.gguf");
    if (v) multibyte_on("llama-spm (SentencePiece, 32000)", v);
    kp_tok_vocab_free(v);
}

/* ---- matcher API: tokens, end of generation, clone, reset ---- */

static void test_matcher_api(void) {
    static const char *const pieces[] = {"{", "}", "\"a\"", ":", "1", "", "\"a\":1", "x", ""};
    static const size_t lens[] = {1, 1, 3, 1, 1, 0, 5, 1, 0};
    static const uint8_t eog[] = {0, 0, 0, 0, 0, 1, 0, 0, 0};
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new_raw(&gv, 9, pieces, lens, eog, &err) == KP_OK);
    kp_grammar *g = schema_g("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
                             "\"additionalProperties\":false}",
                             0);
    kp_gmatch *m = NULL;
    CHECK(gv && g && kp_gmatch_new(&m, g, gv, &err) == KP_OK);
    if (!m) return;
    uint32_t mask[1];
    size_t na;
    CHECK(kp_gmatch_mask(m, mask, &na, &err) == KP_OK);
    CHECK_EQ_INT(mask[0], 1u << 0); /* only "{" */
    CHECK_EQ_INT(na, 1);
    CHECK_EQ_INT(kp_gmatch_accept_token(m, 5, &err), KP_EINVAL); /* end before the document is complete */
    CHECK_EQ_INT(kp_gmatch_accept_token(m, 8, &err), KP_EINVAL); /* no text */
    CHECK_EQ_INT(kp_gmatch_accept_token(m, 9, &err), KP_EINVAL); /* out of range */
    CHECK_EQ_INT(kp_gmatch_accept_token(m, 7, &err), KP_EINVAL); /* not allowed */
    CHECK(strstr(err.msg, "not allowed"));
    CHECK(kp_gmatch_accept_token(m, 0, &err) == KP_OK);
    CHECK(kp_gmatch_mask(m, mask, &na, &err) == KP_OK);
    CHECK_EQ_INT(mask[0], (1u << 2) | (1u << 6)); /* "\"a\"" and "\"a\":1" */
    kp_gmatch *c = NULL;
    CHECK(kp_gmatch_clone(&c, m, &err) == KP_OK);
    CHECK(kp_gmatch_accept_token(c, 6, &err) == KP_OK);
    CHECK(kp_gmatch_accept_token(c, 1, &err) == KP_OK);
    CHECK(kp_gmatch_complete(c) && !kp_gmatch_can_continue(c));
    CHECK(kp_gmatch_mask(c, mask, &na, &err) == KP_OK);
    CHECK_EQ_INT(mask[0], 1u << 5); /* only the end */
    CHECK(kp_gmatch_accept_token(c, 5, &err) == KP_OK);
    CHECK(kp_gmatch_finished(c) && !kp_gmatch_complete(c));
    CHECK(kp_gmatch_mask(c, mask, &na, &err) == KP_OK);
    CHECK_EQ_INT(na, 0);
    CHECK_EQ_INT(kp_gmatch_accept_token(c, 1, &err), KP_EINVAL);
    /* the original did not move */
    CHECK(!kp_gmatch_complete(m) && kp_gmatch_can_continue(m));
    CHECK(kp_gmatch_mask(m, mask, &na, &err) == KP_OK);
    CHECK_EQ_INT(mask[0], (1u << 2) | (1u << 6));
    /* all or nothing */
    CHECK_EQ_INT(kp_gmatch_accept_bytes(m, "\"a\":x", 5, &err), KP_EINVAL);
    CHECK(strstr(err.msg, "offset 4"));
    CHECK(kp_gmatch_accept_bytes(m, "\"a\":", 4, &err) == KP_OK);
    kp_buf comp = {0};
    CHECK(kp_gmatch_completion(m, 100, &comp, &err) == KP_OK);
    CHECK(comp.len == 2 && memcmp(comp.data, "0}", 2) == 0);
    kp_buf_free(&comp);
    kp_gmatch_reset(c);
    CHECK(!kp_gmatch_finished(c));
    CHECK(kp_gmatch_mask(c, mask, &na, &err) == KP_OK);
    CHECK_EQ_INT(mask[0], 1u << 0);
    kp_gmatch_free(c);
    kp_gmatch_free(m);
    kp_gmatch_free(NULL);
    kp_grammar_free(NULL);
    kp_gvocab_free(NULL);
    /* -inf outside the mask, and beyond it */
    float logits[40];
    for (int i = 0; i < 40; i++) logits[i] = 1.0f;
    uint32_t one = (1u << 3) | (1u << 31);
    kp_gmask_apply(&one, 1, logits, 40);
    CHECK(logits[3] == 1.0f && logits[31] == 1.0f && isinf(logits[0]) && isinf(logits[32]) && isinf(logits[39]));
    CHECK_EQ_INT(kp_gmatch_new(&m, NULL, gv, &err), KP_EINVAL);
    kp_grammar_free(g);
    kp_gvocab_free(gv);
}

/* ---- bounds ---- */

static void test_bounds(void) {
    kp_error err = {0};
    kp_gvocab *gv = tiny_vocab();
    /* more live stacks than KP_GRAMMAR_MAX_STACKS: no single point is wide
     * (so it compiles), but after n 'a's the document may close n optional
     * "b"s, one stack each */
    kp_grammar *g = gbnf("root ::= \"a\" root \"b\"? | \"a\"\n");
    kp_gmatch *m = NULL;
    CHECK(g && kp_gmatch_new(&m, g, gv, &err) == KP_OK);
    if (m) {
        kp_status st = KP_OK;
        int n = 0;
        while (n < KP_GRAMMAR_MAX_STACKS + 10 && (st = kp_gmatch_accept_bytes(m, "a", 1, &err)) == KP_OK) n++;
        CHECK_EQ_INT(st, KP_EFULL);
        CHECK(strstr(err.msg, "parse stacks"));
        CHECK(n > KP_GRAMMAR_MAX_STACKS - 10 && n <= KP_GRAMMAR_MAX_STACKS);
        CHECK(kp_gmatch_can_continue(m) && kp_gmatch_complete(m)); /* unchanged: n 'a's is a document */
        CHECK(kp_gmatch_accept_bytes(m, "b", 1, &err) == KP_OK); /* closing still fits */
    }
    kp_gmatch_free(m);
    kp_grammar_free(g);
    /* the node cap (white-box: a small one) */
    g = gbnf("root ::= \"(\" root \")\" | \"x\"\n");
    kp_parser p;
    CHECK(g && kp_parser_init(&p, g, 64, &err) == KP_OK);
    if (g) {
        uint32_t cfg = 0;
        kp_status st = kp_parser_start(&p, &cfg, &err);
        int depth = 0;
        while (st == KP_OK && depth < 1000) {
            st = kp_parser_step(&p, cfg, '(', &cfg, &err);
            depth++;
        }
        CHECK_EQ_INT(st, KP_EFULL);
        CHECK(depth < 64 && strstr(err.msg, "stack frames"));
        kp_parser_fini(&p);
    }
    kp_grammar_free(g);
    /* deep nesting through the public matcher, across compactions */
    g = gbnf("root ::= \"[\" root \"]\" | \"x\"\n");
    CHECK(g && kp_gmatch_new(&m, g, gv, &err) == KP_OK);
    if (m) {
        enum { CHUNK = 100000, CHUNKS = 6 };
        char *open = malloc(CHUNK), *close = malloc(CHUNK);
        memset(open, '[', CHUNK);
        memset(close, ']', CHUNK);
        bool ok = true;
        for (int i = 0; i < CHUNKS && ok; i++) ok = kp_gmatch_accept_bytes(m, open, CHUNK, &err) == KP_OK;
        CHECK_MSG(ok, "deep nesting: %s", err.msg);
        CHECK(kp_gmatch_accept_bytes(m, "x", 1, &err) == KP_OK);
        for (int i = 0; i < CHUNKS && ok; i++) {
            CHECK(!kp_gmatch_complete(m));
            ok = kp_gmatch_accept_bytes(m, close, CHUNK, &err) == KP_OK;
        }
        CHECK(ok && kp_gmatch_complete(m));
        kp_gmatch_stats st;
        kp_gmatch_get_stats(m, &st);
        CHECK(st.flushes >= 1); /* the arena was compacted on the way */
        free(open);
        free(close);
    }
    kp_gmatch_free(m);
    kp_grammar_free(g);
    /* a 65534-fold repetition is one element; the count lives in the stack */
    g = gbnf("root ::= [a]{0,65534}\n");
    CHECK(g && kp_grammar_n_elems(g) < 16);
    CHECK(g && kp_gmatch_new(&m, g, gv, &err) == KP_OK);
    if (m) {
        char *a = malloc(65535);
        memset(a, 'a', 65535);
        CHECK(kp_gmatch_accept_bytes(m, a, 65534, &err) == KP_OK && kp_gmatch_complete(m));
        CHECK_EQ_INT(kp_gmatch_accept_bytes(m, a, 1, &err), KP_EINVAL);
        free(a);
    }
    kp_gmatch_free(m);
    kp_grammar_free(g);
    /* completions longer than asked for */
    g = schema_g("{\"type\":\"array\",\"minItems\":1000,\"items\":{\"type\":\"string\",\"minLength\":50}}", 0);
    CHECK(g && kp_gmatch_new(&m, g, gv, &err) == KP_OK);
    if (m) {
        kp_buf b = {0};
        CHECK_EQ_INT(kp_gmatch_completion(m, 1000, &b, &err), KP_ERANGE);
        CHECK(kp_gmatch_completion(m, 100000, &b, &err) == KP_OK && b.len == 2 + 1000 * 52 + 999);
        kp_buf_free(&b);
    }
    kp_gmatch_free(m);
    kp_grammar_free(g);
    kp_gvocab_free(gv);
}

/* masks where REP counters are clamped (long strings) and where tokens
 * are longer than the clamp: fast against brute force on a vocabulary of
 * runs of 'a' (1..40 bytes), quotes and both */
static void test_mask_counters(void) {
    enum { N = 90 };
    static char store[N][48];
    const char *pieces[N];
    size_t lens[N];
    int n = 0;
    for (int len = 1; len <= 40; len++, n++) {
        memset(store[n], 'a', (size_t)len);
        pieces[n] = store[n];
        lens[n] = (size_t)len;
    }
    for (int len = 1; len <= 40; len += 3, n++) {
        memset(store[n], 'a', (size_t)len);
        store[n][len] = '"';
        pieces[n] = store[n];
        lens[n] = (size_t)len + 1;
    }
    store[n][0] = '"';
    pieces[n] = store[n];
    lens[n++] = 1;
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new_raw(&gv, n, pieces, lens, NULL, &err) == KP_OK);
    static const char *const schemas[] = {
        "{\"type\":\"string\",\"maxLength\":30}", "{\"type\":\"string\",\"minLength\":27,\"maxLength\":60}",
        "{\"type\":\"string\",\"minLength\":33}", "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":26},\"maxItems\":2}"};
    size_t words = kp_gvocab_mask_words(gv);
    uint32_t *fast = malloc(words * 4);
    int states = 0;
    for (size_t si = 0; si < 4 && gv; si++) {
        kp_grammar *g = schema_g(schemas[si], 0);
        for (int pre = 0; g && pre <= 45; pre += 3) {
            kp_gmatch *m = NULL;
            CHECK(kp_gmatch_new(&m, g, gv, &err) == KP_OK);
            char doc[64];
            int k = 0;
            if (si == 3) doc[k++] = '[';
            doc[k++] = '"';
            for (int i = 0; i < pre; i++) doc[k++] = 'a';
            if (kp_gmatch_accept_bytes(m, doc, (size_t)k, &err) == KP_OK) {
                CHECK(kp_gmatch_mask(m, fast, NULL, &err) == KP_OK);
                for (int id = 0; id < n; id++) {
                    kp_gmatch *c = NULL;
                    CHECK(kp_gmatch_clone(&c, m, &err) == KP_OK);
                    bool want = kp_gmatch_accept_bytes(c, pieces[id], lens[id], &err) == KP_OK;
                    CHECK_MSG(want == bit(fast, id), "%s after %d a's: token of %zu bytes: brute %d fast %d",
                              schemas[si], pre, lens[id], want, !want);
                    kp_gmatch_free(c);
                }
                states++;
            }
            kp_gmatch_free(m);
        }
        kp_grammar_free(g);
    }
    CHECK(states > 30);
    free(fast);
    kp_gvocab_free(gv);
}

/* The walk's shortcuts (whole subtrees accepted when the state loops on
 * their bytes, on whole UTF-8 characters, or would with its counters
 * unbounded) against brute force, on a vocabulary rich in non-ASCII
 * pieces: a slice of deepseek-llm's plus every byte and pieces that split
 * characters. Random walks over several string-heavy schemas. */
static void test_mask_unicode(void) {
    kp_tok_vocab *src = load_vocab("tests/data/vocab/ggml-vocab-deepseek-llm.gguf");
    CHECK(src != NULL);
    if (!src) return;
    static const char *const extra[] = {"\xc3\xa9\"", "\xe6\x97\xa5\xe6\x9c\xac\"", "\"\xe6\x97\xa5", "\xe6\x97",
                                        "\xa5\xe6", "a\xff", "\xf0\x9f\x99", "\x82\"}", "\xe6\x97\xa5\xe6\x9c\xac\xe6\x97\xa5\xe6\x9c\xac",
                                        "\\u00e9", "\xed\xa0\x80", "\xc0\xaf", "\"", "\",", "\"}", "\xe4\xb8\xad\xe6\x96\x87" "abc"};
    enum { STRIDE = 37 };
    int32_t n_src = kp_tok_n_vocab(src);
    int32_t n = 256 + (n_src + STRIDE - 1) / STRIDE + (int32_t)(sizeof extra / sizeof extra[0]) + 1;
    const char **pieces = calloc((size_t)n, sizeof *pieces);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *eog = calloc((size_t)n, 1);
    static char bytes[256];
    int32_t k = 0;
    for (int b = 0; b < 256; b++, k++) {
        bytes[b] = (char)b;
        pieces[k] = &bytes[b];
        lens[k] = 1;
    }
    for (int32_t id = 0; id < n_src; id += STRIDE, k++) pieces[k] = kp_tok_piece_view(src, id, false, &lens[k]);
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++, k++) {
        pieces[k] = extra[i];
        lens[k] = strlen(extra[i]);
    }
    eog[k++] = 1; /* an end token */
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new_raw(&gv, k, pieces, lens, eog, &err) == KP_OK);
    static const char *const schemas[] = {
        "{\"type\":\"string\"}",
        "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
        "{\"type\":\"string\",\"maxLength\":40}",
        "{\"type\":\"object\",\"properties\":{\"\xe5\x90\x8d\":{\"type\":\"string\"},\"n\":{\"enum\":[\"\xe6\x97\xa5\xe6\x9c\xac\",\"caf\xc3\xa9\"]}}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3}}",
    };
    size_t words = kp_gvocab_mask_words(gv);
    uint32_t *mask = malloc(words * 4);
    rng r = {0x5DEECE66Dull};
    int states = 0, diffs = 0;
    for (size_t si = 0; gv && si < sizeof schemas / sizeof schemas[0]; si++) {
        kp_grammar *g = schema_g(schemas[si], 1);
        for (int walk = 0; g && walk < 3; walk++) {
            kp_gmatch *m = NULL;
            CHECK(kp_gmatch_new(&m, g, gv, &err) == KP_OK);
            for (int step = 0; m && step < 12; step++) {
                size_t na = 0;
                CHECK(kp_gmatch_mask(m, mask, &na, &err) == KP_OK);
                for (int32_t id = 0; id < k; id++) {
                    bool want;
                    if (eog[id]) {
                        want = kp_gmatch_complete(m);
                    } else {
                        kp_gmatch *c = NULL;
                        CHECK(kp_gmatch_clone(&c, m, &err) == KP_OK);
                        want = kp_gmatch_accept_bytes(c, pieces[id], lens[id], NULL) == KP_OK;
                        kp_gmatch_free(c);
                    }
                    if (want != bit(mask, id) && diffs++ < 5)
                        fprintf(stderr, "  %s: token %d (%zu bytes): brute %d fast %d\n", schemas[si], id, lens[id], want, !want);
                }
                states++;
                if (na == 0) break;
                int32_t id = pick(&r, mask, words, na);
                if (eog[id]) break;
                CHECK(kp_gmatch_accept_token(m, id, &err) == KP_OK);
            }
            kp_gmatch_free(m);
        }
        kp_grammar_free(g);
    }
    CHECK_EQ_INT(diffs, 0);
    CHECK(states > 50);
    printf("  %d tokens (non-ASCII rich): %d states, fast mask = brute force\n", k, states);
    free(mask);
    free(pieces);
    free(lens);
    free(eog);
    kp_gvocab_free(gv);
    kp_tok_vocab_free(src);
}

/* Prefix and suffix bytes around the document (a forced tool call) and no
 * outer whitespace: exactly prefix + document + suffix, nothing after; the
 * shortest completion from the start is prefix + shortest document +
 * suffix; the reference counts keep a grammar alive until the last free. */
static void test_schema_affixes(void) {
    static const char pre[] = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
    static const char suf[] = "}\n</tool_call>";
    json_error_t je;
    json_t *sc = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                            "\"required\":[\"a\"],\"additionalProperties\":false}",
                            0, &je);
    CHECK(sc != NULL);
    kp_gvocab *gv = tiny_vocab();
    for (int outer = 0; outer < 2 && sc && gv; outer++) {
        kp_schema_opts o = kp_schema_opts_default();
        o.ws_max = 1;
        o.no_outer_ws = !outer;
        o.prefix = pre;
        o.prefix_len = strlen(pre);
        o.suffix = suf;
        o.suffix_len = strlen(suf);
        kp_grammar *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_grammar_compile_schema(sc, &o, &g, &err) == KP_OK, "%s", err.msg);
        if (!g) continue;
        char doc[256];
        snprintf(doc, sizeof doc, "%s{\"a\": 12}%s", pre, suf);
        CHECK_EQ_INT(run_bytes(g, gv, doc, strlen(doc)), 2);
        kp_gmatch *m = NULL;
        CHECK(kp_gmatch_new(&m, g, gv, &err) == KP_OK);
        CHECK(kp_gmatch_accept_bytes(m, doc, strlen(doc), &err) == KP_OK);
        CHECK_MSG(kp_gmatch_complete(m) && !kp_gmatch_can_continue(m), "outer %d: complete %d, can continue %d", outer, kp_gmatch_complete(m), kp_gmatch_can_continue(m)); /* the suffix ends it, outer ws or not */
        kp_gmatch_free(m);
        snprintf(doc, sizeof doc, "%s{\"a\": 12}", pre);
        CHECK_EQ_INT(run_bytes(g, gv, doc, strlen(doc)), 1); /* the suffix is still due */
        snprintf(doc, sizeof doc, "%s {\"a\":1}%s", pre, suf);
        CHECK_EQ_INT(run_bytes(g, gv, doc, strlen(doc)), outer ? 2 : 0);
        CHECK_EQ_INT(run_bytes(g, gv, "{\"a\":1}", 7), 0); /* no prefix */
        snprintf(doc, sizeof doc, "%s{\"a\":1}}", pre);
        CHECK_EQ_INT(run_bytes(g, gv, doc, strlen(doc)), 1);
        snprintf(doc, sizeof doc, "%s{\"a\":1}}\n</tool_call>x", pre);
        CHECK_EQ_INT(run_bytes(g, gv, doc, strlen(doc)), 0); /* nothing after the suffix */
        CHECK(kp_gmatch_new(&m, g, gv, &err) == KP_OK);
        kp_buf b = {0};
        CHECK(m && kp_gmatch_completion(m, 4096, &b, &err) == KP_OK);
        CHECK(b.len > strlen(pre) + strlen(suf) && !memcmp(b.data, pre, strlen(pre)) &&
              !memcmp(b.data + b.len - strlen(suf), suf, strlen(suf)));
        CHECK(b.len && run_bytes(g, gv, b.data, b.len) == 2);
        kp_buf_free(&b);
        kp_gmatch_free(m);
        CHECK(kp_grammar_ref(g) == g); /* two references: one free leaves it usable */
        kp_grammar_free(g);
        CHECK_EQ_INT(run_bytes(g, gv, "x", 1), 0);
        kp_grammar_free(g);
    }
    kp_schema_opts bad = kp_schema_opts_default();
    bad.prefix_len = 3;
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK(kp_grammar_compile_schema(sc, &bad, &g, &err) == KP_EINVAL && g == NULL);
    kp_grammar_ref(NULL);
    kp_grammar_free(NULL);
    json_decref(sc);
    kp_gvocab_free(gv);
}

/* Clones of one matcher share its mask cache (a server's warm matcher per
 * schema): masks of clones that walk different paths, one after another
 * and interleaved, equal brute force (each token's bytes fed to a clone). */
static void test_clone_shared_cache(void) {
    kp_tok_vocab *v = load_stories();
    CHECK(v != NULL);
    if (!v) return;
    kp_gvocab *gv = NULL;
    kp_error err = {0};
    CHECK(kp_gvocab_new(&gv, v, &err) == KP_OK);
    kp_grammar *g = schema_g("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":6},"
                             "\"b\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yy\",1]},\"maxItems\":3},"
                             "\"c\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
                             1);
    kp_gmatch *proto = NULL;
    CHECK(gv && g && kp_gmatch_new(&proto, g, gv, &err) == KP_OK);
    size_t words = gv ? kp_gvocab_mask_words(gv) : 0;
    uint32_t *mask = malloc(words * 4 + 4);
    int32_t n = kp_tok_n_vocab(v);
    rng r = {0x2545F4914F6CDD1Dull};
    int diffs = 0, states = 0;
    enum { W = 3 };
    for (int round = 0; proto && round < 4; round++) {
        kp_gmatch *w[W] = {0};
        bool live[W];
        for (int i = 0; i < W; i++) {
            CHECK(kp_gmatch_clone(&w[i], proto, &err) == KP_OK);
            live[i] = w[i] != NULL;
        }
        for (int step = 0; step < 40; step++) {
            int i = (int)rn(&r, W); /* interleaved */
            if (!live[i]) continue;
            size_t na = 0;
            CHECK(kp_gmatch_mask(w[i], mask, &na, &err) == KP_OK);
            for (int32_t id = 0; id < n; id++) {
                size_t len;
                const char *pc = kp_tok_piece_view(v, id, false, &len);
                bool want;
                if (kp_tok_is_eog(v, id)) {
                    want = kp_gmatch_complete(w[i]);
                } else if (!pc || len == 0) {
                    want = false;
                } else {
                    kp_gmatch *c = NULL;
                    CHECK(kp_gmatch_clone(&c, w[i], &err) == KP_OK);
                    want = kp_gmatch_accept_bytes(c, pc, len, NULL) == KP_OK;
                    kp_gmatch_free(c);
                }
                if (want != bit(mask, id) && diffs++ < 5)
                    fprintf(stderr, "  clone %d step %d: token %d brute %d mask %d\n", i, step, id, want, !want);
            }
            states++;
            if (na == 0) {
                live[i] = false;
                continue;
            }
            int32_t id = pick(&r, mask, words, na);
            CHECK(kp_gmatch_accept_token(w[i], id, &err) == KP_OK);
            if (kp_gmatch_finished(w[i])) live[i] = false;
        }
        for (int i = 0; i < W; i++) kp_gmatch_free(w[i]);
    }
    CHECK_EQ_INT(diffs, 0);
    CHECK(states > 100);
    free(mask);
    kp_gmatch_free(proto);
    kp_grammar_free(g);
    kp_gvocab_free(gv);
    kp_tok_vocab_free(v);
}

static void test_dump(void) {
    kp_grammar *g = gbnf("root ::= \"ab\" [x-z]* ( \"c\" | d ){2,3}\nd ::= [^a]\n");
    kp_buf b = {0};
    CHECK(g && kp_grammar_dump(g, &b));
    CHECK(b.data && strstr(b.data, "root ::= \"ab\"") && strstr(b.data, "{2,3}") && strstr(b.data, "[x-z]"));
    kp_buf_free(&b);
    kp_grammar_free(g);
}

/* Arguments: --quick skips the slower property runs; any other argument
 * runs only the tests whose name contains it. */
static const char *only;
#define RUN_IF(fn)                                                                                          \
    do {                                                                                                    \
        if (!only || strstr(#fn, only)) RUN(fn);                                                            \
    } while (0)


/* ---- compile cost, limits, large enums (issue: superlinear compiles,
 * 503 for large schemas) ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A stop callback that counts its polls (one per KP_BUILDER_POLL steps of
 * work) and says stop after `after` of them (0: never). */
typedef struct {
    unsigned polls, after;
} poll_count;

static bool count_polls(void *arg) {
    poll_count *c = arg;
    c->polls++;
    return c->after && c->polls >= c->after;
}

/* r0 ::= "(" r1 ")" ... r(n-1) ::= "(" rn ")", rn ::= "a": n levels of
 * nesting through named rules (the shape of n nested groups, which the
 * nesting limit refuses as groups). Compiled with a polling stop; the
 * number of polls is returned through *polls. */
static kp_status deep_rules(int n, unsigned *polls, double *secs, kp_error *err) {
    kp_buf t = {0};
    kp_buf_puts(&t, "root ::= r0\n");
    for (int i = 0; i < n; i++) kp_buf_printf(&t, "r%d ::= \"(\" r%d \")\"\n", i, i + 1);
    kp_buf_printf(&t, "r%d ::= \"a\"\n", n);
    poll_count pc = {0, 0};
    kp_grammar_stop stop = {count_polls, &pc};
    kp_grammar *g = NULL;
    double t0 = now_s();
    kp_status st = kp_grammar_compile_gbnf_stop(t.data, t.len, &stop, &g, err);
    *secs = now_s() - t0;
    *polls = pc.polls;
    if (st == KP_OK) {
        kp_gvocab *gv = tiny_vocab();
        kp_buf doc = {0};
        for (int i = 0; i < n; i++) kp_buf_putc(&doc, '(');
        CHECK_EQ_INT(run_bytes(g, gv, doc.data, doc.len), 1);
        kp_gvocab_free(gv);
        kp_buf_free(&doc);
    }
    kp_grammar_free(g);
    kp_buf_free(&t);
    return st;
}

static void test_compile_linear(void) {
    kp_error err = {0};
    unsigned p_small = 0, p_big = 0;
    double s_small = 0, s_big = 0;
    /* the work, counted in the builder's steps (polled every 4096): ten
     * times the grammar costs about ten times the steps; the round-robin
     * fixpoints took one pass over the grammar per level (100 times) */
    CHECK(deep_rules(2000, &p_small, &s_small, &err) == KP_OK);
    CHECK(deep_rules(20000, &p_big, &s_big, &err) == KP_OK);
    CHECK_MSG(p_big <= 13 * (p_small + 1), "steps: %u polls for 2,000 levels, %u for 20,000", p_small, p_big);
    /* and the clock, with a bound far above the ~0.05 s it takes (release
     * build) even under the sanitizers on a busy machine: before, 4.5 s */
    CHECK_MSG(s_big < 2.5, "20,000 levels compiled in %.2f s", s_big);
    printf("  20,000 levels of nesting: %.3f s, %u polls (2,000: %.3f s, %u polls)\n", s_big, p_big, s_small, p_small);
    /* a stop that says stop: the compile ends, KP_EIO, nothing leaks */
    kp_buf t = {0};
    kp_buf_puts(&t, "root ::= r0\n");
    for (int i = 0; i < 5000; i++) kp_buf_printf(&t, "r%d ::= \"x\" r%d | \"y\"\n", i, i + 1);
    kp_buf_puts(&t, "r5000 ::= \"z\"\n");
    poll_count pc = {0, 2};
    kp_grammar_stop stop = {count_polls, &pc};
    kp_grammar *g = NULL;
    CHECK_EQ_INT(kp_grammar_compile_gbnf_stop(t.data, t.len, &stop, &g, &err), KP_EIO);
    CHECK(g == NULL && strstr(err.msg, "stopped") && pc.polls == 2);
    kp_buf_free(&t);
    kp_buf_puts(&t, "{\"type\":\"object\",\"properties\":{"); /* big enough for a few polls */
    for (int i = 0; i < 500; i++) kp_buf_printf(&t, "%s\"p%d\":{\"type\":\"string\"}", i ? "," : "", i);
    kp_buf_puts(&t, "}}");
    json_t *sch = json_loads(t.data, 0, NULL);
    kp_schema_opts o = kp_schema_opts_default();
    pc = (poll_count){0, 1};
    o.stop = &stop;
    CHECK_EQ_INT(kp_grammar_compile_schema(sch, &o, &g, &err), KP_EIO);
    CHECK(g == NULL && strstr(err.msg, "stopped"));
    pc = (poll_count){0, 0}; /* never stops: the same schema compiles */
    CHECK(kp_grammar_compile_schema(sch, &o, &g, &err) == KP_OK && g);
    kp_grammar_free(g);
    json_decref(sch);
    kp_buf_free(&t);
}

/* Compiles text (GBNF when gbnf, else a JSON Schema) expecting KP_ERANGE
 * with every one of the words in its message. */
static void expect_limit(bool is_gbnf, const char *text, const char *w1, const char *w2) {
    kp_error err = {0};
    kp_grammar *g = NULL;
    kp_status st;
    if (is_gbnf) {
        st = kp_grammar_compile_gbnf(text, strlen(text), &g, &err);
    } else {
        json_t *s = json_loads(text, 0, NULL);
        CHECK(s != NULL);
        st = kp_grammar_compile_schema(s, NULL, &g, &err);
        json_decref(s);
    }
    CHECK_MSG(st == KP_ERANGE && g == NULL, "expected a limit (%s), got %d: %s", w1, (int)st, err.msg);
    CHECK_MSG(strstr(err.msg, w1) && (!w2 || strstr(err.msg, w2)), "message lacks '%s'/'%s': %s", w1, w2 ? w2 : "",
              err.msg);
    kp_grammar_free(g);
}

/* {"type":"object","properties":{"e":<inner>},"required":["e"],
 * "additionalProperties":false} */
static char *object_with(const char *inner) {
    kp_buf b = {0};
    kp_buf_printf(&b, "{\"type\":\"object\",\"properties\":{\"e\":%s},\"required\":[\"e\"],"
                      "\"additionalProperties\":false}",
                  inner);
    return b.data;
}

static void test_limits(void) {
    kp_buf t = {0};
    /* GBNF nesting: groups inside groups */
    for (int i = 0; i <= KP_GRAMMAR_MAX_NESTING; i++) kp_buf_putc(&t, '(');
    kp_buf_putc(&t, 'x');
    for (int i = 0; i <= KP_GRAMMAR_MAX_NESTING; i++) kp_buf_putc(&t, ')');
    kp_buf b = {0};
    kp_buf_printf(&b, "root ::= %s\nx ::= \"a\"\n", t.data);
    expect_limit(true, b.data, "KP_GRAMMAR_MAX_NESTING", "256");
    kp_buf_free(&b);
    kp_buf_free(&t);
    /* ... and exactly at the limit it compiles */
    for (int i = 0; i < KP_GRAMMAR_MAX_NESTING; i++) kp_buf_putc(&t, '(');
    kp_buf_puts(&t, "\"a\"");
    for (int i = 0; i < KP_GRAMMAR_MAX_NESTING; i++) kp_buf_putc(&t, ')');
    kp_buf_printf(&b, "root ::= %s\n", t.data);
    kp_grammar *g = gbnf(b.data);
    kp_grammar_free(g);
    kp_buf_free(&b);
    kp_buf_free(&t);
    /* rules; alternatives of one rule */
    kp_buf_puts(&t, "root ::= \"a\"\n");
    for (int i = 0; i < KP_GRAMMAR_MAX_RULES; i++) kp_buf_printf(&t, "r%d ::= \"b\"\n", i);
    expect_limit(true, t.data, "KP_GRAMMAR_MAX_RULES", NULL);
    kp_buf_free(&t);
    kp_buf_puts(&t, "root ::= \"a0\"");
    for (int i = 1; i <= KP_GRAMMAR_MAX_ALTS; i++) kp_buf_printf(&t, " | \"a%d\"", i);
    kp_buf_putc(&t, '\n');
    expect_limit(true, t.data, "KP_GRAMMAR_MAX_ALTS", NULL);
    kp_buf_free(&t);
    /* width: 1,100 rules of two alternatives each at one point */
    kp_buf_puts(&t, "root ::= x0");
    for (int i = 1; i < 1100; i++) kp_buf_printf(&t, " | x%d", i);
    kp_buf_putc(&t, '\n');
    for (int i = 0; i < 1100; i++) kp_buf_printf(&t, "x%d ::= \"a\" [0-9] | \"b\" \"%d\"\n", i, i);
    expect_limit(true, t.data, "KP_GRAMMAR_MAX_WIDTH", "'root'");
    kp_buf_free(&t);
    /* schema: properties, enum, anyOf, nesting */
    kp_buf_puts(&t, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i <= KP_SCHEMA_MAX_PROPERTIES; i++) kp_buf_printf(&t, "%s\"p%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    kp_buf_puts(&t, "}}");
    expect_limit(false, t.data, "KP_SCHEMA_MAX_PROPERTIES", "1001");
    kp_buf_free(&t);
    kp_buf_puts(&t, "{\"enum\":[");
    for (int i = 0; i <= KP_SCHEMA_MAX_ENUM; i++) kp_buf_printf(&t, "%s\"v%d\"", i ? "," : "", i);
    kp_buf_puts(&t, "]}");
    char *o = object_with(t.data);
    expect_limit(false, o, "KP_SCHEMA_MAX_ENUM", "#/properties/e");
    free(o);
    kp_buf_free(&t);
    kp_buf_puts(&t, "{\"anyOf\":[");
    for (int i = 0; i <= KP_SCHEMA_MAX_ANYOF; i++) kp_buf_printf(&t, "%s{\"const\":%d}", i ? "," : "", i);
    kp_buf_puts(&t, "]}");
    expect_limit(false, t.data, "KP_SCHEMA_MAX_ANYOF", NULL);
    kp_buf_free(&t);
    for (int i = 0; i <= KP_GRAMMAR_MAX_NESTING; i++) kp_buf_puts(&t, "{\"type\":\"array\",\"items\":");
    kp_buf_puts(&t, "true");
    for (int i = 0; i <= KP_GRAMMAR_MAX_NESTING; i++) kp_buf_putc(&t, '}');
    expect_limit(false, t.data, "nested deeper than 256", NULL);
    kp_buf_free(&t);
    /* width in a schema: 600 branches, each an object of two optional
     * properties (objects do not factor: their members differ) */
    kp_buf_puts(&t, "{\"anyOf\":[");
    for (int i = 0; i < 600; i++)
        kp_buf_printf(&t, "%s{\"type\":\"object\",\"properties\":{\"a%d\":{\"type\":\"integer\"},\"b%d\":{\"type\":\"integer\"}},"
                          "\"additionalProperties\":false}",
                      i ? "," : "", i, i);
    kp_buf_puts(&t, "]}");
    expect_limit(false, t.data, "KP_GRAMMAR_MAX_WIDTH", NULL);
    kp_buf_free(&t);
}

/* A random walk under g over a vocabulary of every byte and an
 * end-of-generation token: each step takes one of the allowed tokens
 * (chosen by a fixed LCG); the document when the end was taken, NULL when
 * a mask allowed nothing or failed (with the error printed). */
static char *walk(const kp_grammar *g, uint32_t seed) {
    static char bytes[256];
    const char *pieces[257];
    size_t lens[257];
    uint8_t eog[257] = {0};
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    pieces[256] = "";
    lens[256] = 0;
    eog[256] = 1;
    kp_error err = {0};
    kp_gvocab *gv = NULL;
    kp_gmatch *m = NULL;
    kp_buf doc = {0};
    bool ended = false;
    if (kp_gvocab_new_raw(&gv, 257, pieces, lens, eog, &err) == KP_OK && kp_gmatch_new(&m, g, gv, &err) == KP_OK) {
        uint32_t mask[9];
        for (int step = 0; step < 4000 && !ended; step++) {
            size_t na = 0;
            if (kp_gmatch_mask(m, mask, &na, &err) != KP_OK || na == 0) {
                printf("  walk: step %d after \"%.60s\": %zu allowed (%s)\n", step, doc.data ? doc.data : "", na, err.msg);
                break;
            }
            seed = seed * 1103515245u + 12345u;
            size_t pick = (seed >> 8) % na, k = 0;
            int32_t id = 0;
            for (; id < 257; id++)
                if ((mask[id >> 5] >> (id & 31)) & 1 && k++ == pick) break;
            if (kp_gmatch_accept_token(m, id, &err) != KP_OK) break;
            if (id == 256)
                ended = true;
            else
                kp_buf_putc(&doc, (char)id);
        }
    }
    kp_gmatch_free(m);
    kp_gvocab_free(gv);
    if (!ended) {
        kp_buf_free(&doc);
        return NULL;
    }
    kp_buf_putc(&doc, 0);
    return doc.data;
}

static void test_large_enums(void) {
    kp_error err = {0};
    /* an enum of 2,048 strings inside an object: every walk ends in a
     * document whose value is one of them (jansson parses it) */
    enum { N = 2048 };
    kp_buf t = {0};
    kp_buf_puts(&t, "{\"enum\":[");
    for (int i = 0; i < N; i++) kp_buf_printf(&t, "%s\"value%d\"", i ? "," : "", i);
    kp_buf_puts(&t, "]}");
    char *o = object_with(t.data);
    kp_buf_free(&t);
    kp_grammar *g = schema_g(o, 1);
    for (uint32_t seed = 1; g && seed <= 8; seed++) {
        char *doc = walk(g, seed);
        CHECK_MSG(doc != NULL, "walk %u under an enum of 2,048 ended early", seed);
        json_t *j = doc ? json_loads(doc, 0, NULL) : NULL;
        const char *v = json_string_value(json_object_get(j, "e"));
        int k = -1;
        CHECK_MSG(v && sscanf(v, "value%d", &k) == 1 && k >= 0 && k < N && json_object_size(j) == 1, "%s", doc);
        json_decref(j);
        free(doc);
    }
    kp_gvocab *gv = tiny_vocab();
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":\"value2047\"}", 17), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":\"value2048\"}", 17), 0);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":\"value20\"}", 15), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":\"value\"}", 13), 0);
    kp_grammar_free(g);
    free(o);
    /* at the limits: KP_SCHEMA_MAX_ENUM values of mixed kinds, anyOf of
     * KP_SCHEMA_MAX_ANYOF consts, 50,000 GBNF alternatives */
    kp_buf_puts(&t, "{\"enum\":[");
    for (int i = 0; i < KP_SCHEMA_MAX_ENUM; i++)
        kp_buf_printf(&t, i % 3 == 0 ? "%s%d" : i % 3 == 1 ? "%s\"s%d\"" : "%s[%d,true]", i ? "," : "", i);
    kp_buf_puts(&t, "]}");
    o = object_with(t.data);
    kp_buf_free(&t);
    g = schema_g(o, 1);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":[9998,true]}", 17), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\": \"s9997\"}", 14), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":9999}", 10), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "{\"e\":\"s9999\"}", 13), 0);
    char *doc = g ? walk(g, 7) : NULL;
    CHECK(doc != NULL);
    free(doc);
    kp_grammar_free(g);
    free(o);
    kp_buf_puts(&t, "{\"anyOf\":[");
    for (int i = 0; i < KP_SCHEMA_MAX_ANYOF; i++) kp_buf_printf(&t, "%s{\"const\":\"c%d\"}", i ? "," : "", i);
    kp_buf_puts(&t, "]}");
    g = schema_g(t.data, 0);
    kp_buf_free(&t);
    CHECK_EQ_INT(run_bytes(g, gv, "\"c999\"", 6), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "\"c1000\"", 7), 0);
    kp_grammar_free(g);
    kp_buf_puts(&t, "root ::= \"a0\"");
    for (int i = 1; i < 50000; i++) kp_buf_printf(&t, " | \"a%d\"", i);
    kp_buf_putc(&t, '\n');
    double t0 = now_s();
    g = gbnf(t.data);
    printf("  50,000 GBNF alternatives: compiled in %.3f s\n", now_s() - t0);
    kp_buf_free(&t);
    CHECK_EQ_INT(run_bytes(g, gv, "a49999", 6), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "a4999", 5), 2);
    CHECK_EQ_INT(run_bytes(g, gv, "a50000", 6), 0);
    kp_grammar_free(g);
    kp_gvocab_free(gv);
    (void)err;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (argc > 1 && !quick) only = argv[1];
    RUN_IF(test_gbnf_basic);
    RUN_IF(test_gbnf_utf8_classes);
    RUN_IF(test_gbnf_errors);
    RUN_IF(test_schema_scalars);
    RUN_IF(test_schema_formats);
    RUN_IF(test_schema_enum_const);
    RUN_IF(test_schema_objects);
    RUN_IF(test_schema_arrays_refs);
    RUN_IF(test_schema_whitespace);
    RUN_IF(test_schema_errors);
    RUN_IF(test_schema_affixes);
    RUN_IF(test_validator_itself);
    RUN_IF(test_schema_ranges);
    RUN_IF(test_matcher_api);
    RUN_IF(test_bounds);
    RUN_IF(test_compile_linear);
    RUN_IF(test_limits);
    RUN_IF(test_large_enums);
    RUN_IF(test_mask_counters);
    RUN_IF(test_mask_unicode);
    RUN_IF(test_clone_shared_cache);
    RUN_IF(test_dump);
    RUN_IF(test_multibyte);
    RUN_IF(test_property_bpe_small);
    if (!quick) {
        RUN_IF(test_property_spm);
        RUN_IF(test_property_bpe_large);
    }
    return harness_finish("grammar");
}
