/*
 * test_canon.c - RFC 8785 canonical JSON.
 *
 * References, none of them produced by kvpin:
 *   - RFC 8785 itself: the Appendix B number table, the section 3.2.2
 *     example and the section 3.2.3 sorting example with their outputs;
 *   - V8 (node): tools/canon_ref.mjs wrote tests/data/canon/numbers.txt
 *     ("<IEEE-754 bits in hex>,<JSON.stringify of that double>", powers of
 *     two and ten with their neighbours, format boundaries, random bit
 *     patterns) and doc-NN.json / doc-NN.canon (a document written with
 *     shuffled members, whitespace, \u escapes, 1E2-style numbers, and its
 *     canonical bytes from JSON.stringify and a UTF-16 sort);
 *   - the rules of the RFC applied by hand to small values (escapes of
 *     every control character, member order across the surrogate range).
 */
#include "base/canon.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static double from_bits(uint64_t bits) {
    double x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* Canonical bytes of a JSON text, or NULL (and the status in *st). */
static char *canon(const char *text, kp_status *st, kp_error *err) {
    char *out = NULL;
    size_t len = 0;
    kp_status s = kp_canon_text(text, strlen(text), &out, &len, err);
    if (st) *st = s;
    if (s == KP_OK && strlen(out) != len) { /* no NUL bytes inside canonical text */
        free(out);
        return NULL;
    }
    return out;
}

#define CHECK_CANON(text, expected)                                                 \
    do {                                                                            \
        kp_error e_ = {0};                                                          \
        char *got_ = canon(text, NULL, &e_);                                        \
        CHECK_MSG(got_ && strcmp(got_, expected) == 0, "%s -> %s (want %s) %s",     \
                  text, got_ ? got_ : "(null)", expected, e_.msg);                  \
        free(got_);                                                                 \
    } while (0)

/* ------------------------------------------------------------------ */
/* RFC 8785                                                            */

static void test_rfc_number_table(void) {
    /* RFC 8785 Appendix B */
    static const struct {
        uint64_t bits;
        const char *text;
    } table[] = {
        {0x0000000000000000, "0"},
        {0x8000000000000000, "0"},
        {0x0000000000000001, "5e-324"},
        {0x8000000000000001, "-5e-324"},
        {0x7fefffffffffffff, "1.7976931348623157e+308"},
        {0xffefffffffffffff, "-1.7976931348623157e+308"},
        {0x4340000000000000, "9007199254740992"},
        {0xc340000000000000, "-9007199254740992"},
        {0x4430000000000000, "295147905179352830000"},
        {0x44b52d02c7e14af5, "9.999999999999997e+22"},
        {0x44b52d02c7e14af6, "1e+23"},
        {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
        {0x444b1ae4d6e2ef4e, "999999999999999700000"},
        {0x444b1ae4d6e2ef4f, "999999999999999900000"},
        {0x444b1ae4d6e2ef50, "1e+21"},
        {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
        {0x3eb0c6f7a0b5ed8d, "0.000001"},
        {0x41b3de4355555553, "333333333.3333332"},
        {0x41b3de4355555554, "333333333.33333325"},
        {0x41b3de4355555555, "333333333.3333333"},
        {0x41b3de4355555556, "333333333.3333334"},
        {0x41b3de4355555557, "333333333.33333343"},
        {0xbecbf647612f3696, "-0.0000033333333333333333"},
        {0x43143ff3c1cb0959, "1424953923781206.2"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        char out[KP_CANON_NUMBER_MAX];
        size_t n = kp_canon_number(from_bits(table[i].bits), out);
        CHECK_MSG(n == strlen(table[i].text) && strcmp(out, table[i].text) == 0,
                  "%016llx -> %s, want %s", (unsigned long long)table[i].bits, out,
                  table[i].text);
    }
    /* NaN and the infinities have no JSON form (the RFC's "error" rows) */
    char out[KP_CANON_NUMBER_MAX];
    CHECK_EQ_INT(kp_canon_number(from_bits(0x7fffffffffffffff), out), 0);
    CHECK_EQ_INT(kp_canon_number(from_bits(0x7ff0000000000000), out), 0);
    CHECK_EQ_INT(kp_canon_number(-INFINITY, out), 0);
    CHECK_EQ_STR(out, "");
}

static void test_rfc_main_example(void) {
    /* RFC 8785 section 3.2.2: input and the canonical output */
    CHECK_CANON("{\n"
                "  \"numbers\": [333333333.33333329, 1E30, 4.50,\n"
                "              2e-3, 0.000000000000000000000000001],\n"
                "  \"string\": \"\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\\"\\/\",\n"
                "  \"literals\": [null, true, false]\n"
                "}",
                "{\"literals\":[null,true,false],"
                "\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
                "\"string\":\"\xe2\x82\xac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}");
}

static void test_rfc_sorting_example(void) {
    /* RFC 8785 section 3.2.3: the members come out in this order */
    CHECK_CANON("{\n"
                "  \"\\u20ac\": \"Euro Sign\",\n"
                "  \"\\r\": \"Carriage Return\",\n"
                "  \"\\ufb33\": \"Hebrew Letter Dalet With Dagesh\",\n"
                "  \"1\": \"One\",\n"
                "  \"\\ud83d\\ude00\": \"Emoji: Grinning Face\",\n"
                "  \"\\u0080\": \"Control\",\n"
                "  \"\\u00f6\": \"Latin Small Letter O With Diaeresis\"\n"
                "}",
                "{\"\\r\":\"Carriage Return\","
                "\"1\":\"One\","
                "\"\xc2\x80\":\"Control\","
                "\"\xc3\xb6\":\"Latin Small Letter O With Diaeresis\","
                "\"\xe2\x82\xac\":\"Euro Sign\","
                "\"\xf0\x9f\x98\x80\":\"Emoji: Grinning Face\","
                "\"\xef\xac\xb3\":\"Hebrew Letter Dalet With Dagesh\"}");
}

/* ------------------------------------------------------------------ */
/* V8 reference data                                                   */

static void test_v8_numbers(void) {
    size_t len;
    char *text = harness_read_file(harness_path("tests/data/canon/numbers.txt"), &len);
    CHECK(text != NULL);
    if (!text) return;
    int lines = 0, bad = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
        char *comma = strchr(line, ',');
        if (comma) {
            *comma = 0;
            double x = from_bits(strtoull(line, NULL, 16));
            char out[KP_CANON_NUMBER_MAX];
            kp_canon_number(x, out);
            lines++;
            if (strcmp(out, comma + 1) != 0) {
                if (bad++ < 10)
                    fprintf(stderr, "  number %s: got %s, V8 says %s\n", line, out, comma + 1);
            }
        }
        if (!end) break;
        line = end + 1;
    }
    CHECK_MSG(lines > 8000, "only %d numbers read", lines);
    CHECK_MSG(bad == 0, "%d of %d numbers differ from V8", bad, lines);
    free(text);
}

static void test_v8_documents(void) {
    int docs = 0;
    for (int i = 0; i < 100; i++) {
        char in_path[64], out_path[64];
        snprintf(in_path, sizeof in_path, "tests/data/canon/doc-%02d.json", i);
        snprintf(out_path, sizeof out_path, "tests/data/canon/doc-%02d.canon", i);
        size_t in_len, want_len;
        char *in = harness_read_file(harness_path(in_path), &in_len);
        if (!in) break;
        char *want = harness_read_file(harness_path(out_path), &want_len);
        CHECK(want != NULL);
        char *got = NULL, *again = NULL;
        size_t got_len = 0, again_len = 0;
        kp_error err = {0};
        kp_status st = kp_canon_text(in, in_len, &got, &got_len, &err);
        CHECK_MSG(st == KP_OK, "%s: %s", in_path, err.msg);
        CHECK_MSG(want && got && got_len == want_len && memcmp(got, want, want_len) == 0,
                  "%s:\n  got  %s\n  want %s", in_path, got ? got : "(null)", want ? want : "");
        /* canonical text is a fixed point */
        if (got) {
            CHECK(kp_canon_text(got, got_len, &again, &again_len, NULL) == KP_OK);
            CHECK(again && again_len == got_len && memcmp(again, got, got_len) == 0);
        }
        free(in);
        free(want);
        free(got);
        free(again);
        docs++;
    }
    CHECK_MSG(docs >= 40, "only %d documents", docs);
}

/* ------------------------------------------------------------------ */
/* The rules on small values                                           */

static void test_string_escapes(void) {
    /* every control character: the seven two-character escapes, the rest
     * as \u00xx with lowercase hex; DEL, '/', U+2028 and non-ASCII literal */
    char raw[40];
    for (int c = 0; c < 32; c++) raw[c] = (char)c;
    json_t *s = json_stringn(raw, 32);
    CHECK(s != NULL);
    char *out;
    size_t len;
    CHECK(kp_canon_dump(s, &out, &len, NULL) == KP_OK);
    char want[400] = "\"";
    for (int c = 0; c < 32; c++) {
        const char *two = c == 8 ? "\\b" : c == 9 ? "\\t" : c == 10 ? "\\n" : c == 12 ? "\\f"
                        : c == 13 ? "\\r" : NULL;
        size_t w = strlen(want);
        if (two) snprintf(want + w, sizeof want - w, "%s", two);
        else snprintf(want + w, sizeof want - w, "\\u%04x", c);
    }
    strcat(want, "\"");
    CHECK_EQ_STR(out, want);
    CHECK_EQ_INT(len, strlen(want));
    free(out);
    json_decref(s);

    CHECK_CANON("\"\\u007f/\\/\\u2028\\u2029\\\"\\\\\\u00e9\\uD83D\\uDE00\"",
                "\"\x7f//\xe2\x80\xa8\xe2\x80\xa9\\\"\\\\\xc3\xa9\xf0\x9f\x98\x80\"");
    /* U+0000 inside a string value, and inside a name built through the API
     * (jansson's parser refuses it in a name: see test_parse_errors) */
    CHECK_CANON("{\"ab\":\"x\\u0000y\"}", "{\"ab\":\"x\\u0000y\"}");
    json_t *o = json_object();
    json_object_setn_new(o, "a\0b", 3, json_stringn("\0", 1));
    CHECK(kp_canon_dump(o, &out, &len, NULL) == KP_OK);
    CHECK(out && len == 21 && memcmp(out, "{\"a\\u0000b\":\"\\u0000\"}", 21) == 0);
    free(out);
    json_decref(o);
}

static void test_member_order(void) {
    /* UTF-16 order: "" < "a" < U+00F6 < U+1F600 (D83D DE00) < U+1F601
     * (D83D DE01) < U+E000 < U+FFFD; UTF-8 byte order would put U+E000 and
     * U+FFFD before the emoji, and code point order would too */
    json_t *o = json_object();
    const char *names[] = {"\xef\xbf\xbd", "\xee\x80\x80", "\xf0\x9f\x98\x81", "a",
                           "\xf0\x9f\x98\x80", "\xc3\xb6", ""};
    for (int i = 0; i < 7; i++) json_object_set_new(o, names[i], json_integer(i));
    char *out;
    size_t len;
    CHECK(kp_canon_dump(o, &out, &len, NULL) == KP_OK);
    CHECK_EQ_STR(out, "{\"\":6,\"a\":3,\"\xc3\xb6\":5,\"\xf0\x9f\x98\x80\":4,"
                      "\"\xf0\x9f\x98\x81\":2,\"\xee\x80\x80\":1,\"\xef\xbf\xbd\":0}");
    free(out);
    json_decref(o);
    /* U+10000 (D800 DC00) sorts before U+FFFF; a prefix sorts first */
    CHECK_CANON("{\"\\uffff\":1,\"\\ud800\\udc00\":2,\"ab\":3,\"a\":4,\"b\":5}",
                "{\"a\":4,\"ab\":3,\"b\":5,\"\xf0\x90\x80\x80\":2,\"\xef\xbf\xbf\":1}");
    /* nested objects are sorted too; arrays keep their order */
    CHECK_CANON("{\"z\":[3,{\"y\":1,\"x\":2},1],\"a\":{\"c\":{\"e\":0,\"d\":0},\"b\":0}}",
                "{\"a\":{\"b\":0,\"c\":{\"d\":0,\"e\":0}},\"z\":[3,{\"x\":2,\"y\":1},1]}");
}

static void test_numbers_in_documents(void) {
    /* every number is a double: integers beyond 2^53 round, 1E2 == 100 */
    CHECK_CANON("[1E2, 100.000, 1e+2, 10e1, 0.1e3, -0, -0.0, 0e10]",
                "[100,100,100,100,100,0,0,0]");
    CHECK_CANON("[9007199254740993, 123456789012345678901234567890]",
                "[9007199254740992,1.2345678901234568e+29]");
    CHECK_CANON("[1e21, 999999999999999999999, 1e-6, 1e-7, 0.0000012, -1.5e-7]",
                "[1e+21,1e+21,0.000001,1e-7,0.0000012,-1.5e-7]");
    /* json_integer values are doubles too */
    json_t *a = json_pack("[I,I,f]", (json_int_t)9007199254740993LL, (json_int_t)-5, -0.0);
    char *out;
    size_t len;
    CHECK(kp_canon_dump(a, &out, &len, NULL) == KP_OK);
    CHECK_EQ_STR(out, "[9007199254740992,-5,0]");
    free(out);
    json_decref(a);
}

static void test_scalars_and_whitespace(void) {
    CHECK_CANON(" \n\t null \r\n", "null");
    CHECK_CANON("true", "true");
    CHECK_CANON("[ ]", "[]");
    CHECK_CANON("{ }", "{}");
    CHECK_CANON("\"\"", "\"\"");
    CHECK_CANON("[ [ ], { }, [ [ null ] ] ]", "[[],{},[[null]]]");
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */

static void expect_error(const char *text, kp_status code, const char *msg_start,
                         const char *msg_part) {
    kp_error err = {0};
    kp_status st;
    char *out = canon(text, &st, &err);
    CHECK_MSG(st == code && out == NULL, "%s: status %d (%s), want %d", text, (int)st, err.msg,
              (int)code);
    if (msg_start)
        CHECK_MSG(strncmp(err.msg, msg_start, strlen(msg_start)) == 0, "%s: message '%s'", text,
                  err.msg);
    if (msg_part) CHECK_MSG(strstr(err.msg, msg_part) != NULL, "%s: message '%s'", text, err.msg);
    free(out);
}

static void test_parse_errors(void) {
    expect_error("", KP_EFORMAT, "1:", NULL);
    expect_error("{", KP_EFORMAT, "1:", NULL);
    expect_error("[1,]", KP_EFORMAT, "1:", NULL);
    expect_error("{} {}", KP_EFORMAT, "1:", NULL);
    expect_error("{\"a\" 1}", KP_EFORMAT, "1:", NULL);
    expect_error("'single'", KP_EFORMAT, "1:", NULL);
    expect_error("{\n  \"a\": 1,\n  \"b\": tru\n}", KP_EFORMAT, "3:", NULL);
    /* duplicate member names: refused, not "last one wins" */
    expect_error("{\"a\":1,\"b\":2,\"a\":3}", KP_EFORMAT, "1:", "duplicate");
    expect_error("{\"x\":{\"\\u0061\":1,\"a\":2}}", KP_EFORMAT, "1:", "duplicate");
    /* no NaN or infinities, however spelled, and no overflow to infinity */
    expect_error("NaN", KP_EFORMAT, "1:", NULL);
    expect_error("[Infinity]", KP_EFORMAT, "1:", NULL);
    expect_error("[-Infinity]", KP_EFORMAT, "1:", NULL);
    expect_error("[1e400]", KP_EFORMAT, "1:", NULL);
    expect_error("[-1e309]", KP_EFORMAT, "1:", NULL);
    /* invalid UTF-8 and lone surrogates */
    expect_error("\"\xff\"", KP_EFORMAT, "1:", NULL);
    expect_error("\"\\ud800\"", KP_EFORMAT, "1:", NULL);
    /* jansson's parser does not take U+0000 in a member name */
    expect_error("{\"a\\u0000\":1}", KP_EFORMAT, "1:", NULL);
}

static char *nested(int depth) {
    char *s = malloc((size_t)depth * 2 + 1);
    memset(s, '[', (size_t)depth);
    memset(s + depth, ']', (size_t)depth);
    s[depth * 2] = 0;
    return s;
}

static void test_depth_limit(void) {
    char *ok = nested(KP_CANON_MAX_DEPTH);
    char *out;
    size_t len;
    CHECK(kp_canon_text(ok, strlen(ok), &out, &len, NULL) == KP_OK);
    CHECK(out && strcmp(out, ok) == 0);
    free(out);
    free(ok);
    char *deep = nested(KP_CANON_MAX_DEPTH + 1);
    kp_error err = {0};
    CHECK(kp_canon_text(deep, strlen(deep), &out, &len, &err) == KP_ERANGE);
    CHECK(out == NULL && len == 0);
    CHECK(strstr(err.msg, "deeper") != NULL);
    free(deep);
    /* beyond the parser's own limit: a parse error, not a crash */
    char *deeper = nested(100000);
    CHECK(kp_canon_text(deeper, strlen(deeper), &out, &len, &err) == KP_EFORMAT);
    free(deeper);
    /* a cycle built through the API ends at the depth limit */
    json_t *a = json_array(), *b = json_array();
    json_array_append(a, b);
    json_array_append(b, a);
    CHECK(kp_canon_dump(a, &out, &len, &err) == KP_ERANGE);
    json_array_clear(b); /* break the cycle so both are freed */
    json_decref(a);
    json_decref(b);
}

static void test_dump_errors(void) {
    char *out = (char *)1;
    size_t len = 7;
    kp_error err = {0};
    CHECK(kp_canon_dump(NULL, &out, &len, &err) == KP_EINVAL);
    CHECK(out == NULL && len == 0);
    /* strings built without jansson's UTF-8 check */
    json_t *bad = json_stringn_nocheck("ok\xc0\xaf", 4);
    CHECK(kp_canon_dump(bad, &out, &len, &err) == KP_EINVAL);
    CHECK(strstr(err.msg, "UTF-8") != NULL);
    json_decref(bad);
    json_t *o = json_object();
    json_object_set_new_nocheck(o, "\xed\xa0\x80", json_null()); /* a surrogate in UTF-8 */
    CHECK(kp_canon_dump(o, &out, &len, &err) == KP_EINVAL);
    json_decref(o);
}

int main(void) {
    RUN(test_rfc_number_table);
    RUN(test_rfc_main_example);
    RUN(test_rfc_sorting_example);
    RUN(test_v8_numbers);
    RUN(test_v8_documents);
    RUN(test_string_escapes);
    RUN(test_member_order);
    RUN(test_numbers_in_documents);
    RUN(test_scalars_and_whitespace);
    RUN(test_parse_errors);
    RUN(test_depth_limit);
    RUN(test_dump_errors);
    return harness_finish("canon");
}
