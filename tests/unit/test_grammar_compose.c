/*
 * test_grammar_compose.c - grammars made of parts (src/grammar/compose.c,
 * grammar.h kp_grammar_compile_alts).
 *
 * Oracle: the documents the contract in grammar.h describes, written out
 * by hand: literal markup around compact JSON of a schema (the schema
 * compiler's own documents, held to a validator in test_grammar.c), raw
 * text without the closing byte, optional groups, the first / more
 * alternatives and the suffix; each document fed byte by byte to a matcher
 * must be rejected (0), a proper prefix (1) or complete (2) as listed.
 */
#include <string.h>

#include "grammar/grammar.h"
#include "harness.h"

static int run_bytes(const kp_grammar *g, const char *doc) {
    static const char *const p[1] = {"a"};
    static const size_t l[1] = {1};
    kp_gvocab *gv = NULL;
    kp_gmatch *m = NULL;
    kp_error err = {0};
    if (kp_gvocab_new_raw(&gv, 1, p, l, NULL, &err) != KP_OK || kp_gmatch_new(&m, g, gv, &err) != KP_OK) {
        kp_gvocab_free(gv);
        return -1;
    }
    kp_status st = kp_gmatch_accept_bytes(m, doc, strlen(doc), &err);
    int r = st == KP_OK ? (kp_gmatch_complete(m) ? 2 : 1) : st == KP_EINVAL ? 0 : -1;
    kp_gmatch_free(m);
    kp_gvocab_free(gv);
    return r;
}

#define LIT(s) {KP_GPIECE_LIT, s, sizeof(s) - 1, NULL, 0}

static void expect(const kp_grammar *g, const char *doc, int want) {
    int got = g ? run_bytes(g, doc) : -1;
    CHECK_MSG(got == want, "\"%s\": got %d, want %d", doc, got, want);
}

static void test_json_calls(void) {
    json_t *days = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
                              "\"integer\"}},\"required\":[\"city\"],\"additionalProperties\":false}",
                              0, NULL);
    json_t *none = json_loads("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", 0, NULL);
    kp_gpiece a0[] = {LIT("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), {KP_GPIECE_JSON, NULL, 0, days, 0},
                      LIT("}\n</tool_call>")};
    kp_gpiece a1[] = {LIT("<tool_call>\n{\"name\": \"ping\", \"arguments\": "), {KP_GPIECE_JSON, NULL, 0, none, 0},
                      LIT("}\n</tool_call>")};
    kp_galt first[] = {{a0, 3}, {a1, 3}};
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK(kp_grammar_compile_alts(first, 2, NULL, 0, 1, NULL, 0, &g, &err) == KP_OK);
    expect(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":3}}\n</tool_call>", 2);
    expect(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>", 2);
    expect(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>", 2);
    expect(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}", 1);
    /* compact: no whitespace inside the arguments; no undeclared member; the declared order */
    expect(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": { \"city\"", 0);
    expect(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\":3,", 0);
    expect(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"P\",\"x\"", 0);
    expect(g, "<tool_call>\n{\"name\": \"nope\"", 0);
    /* one call: nothing after the closing markup */
    expect(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n", 0);
    kp_grammar_free(g);
    /* several: first alternatives, then more, then the suffix */
    kp_gpiece f0[] = {LIT("[TOOL_CALLS]ping[ARGS]"), {KP_GPIECE_JSON, NULL, 0, none, 0}};
    kp_gpiece m0[] = {LIT("[TOOL_CALLS]ping[ARGS]"), {KP_GPIECE_JSON, NULL, 0, none, 0}};
    kp_galt f[] = {{f0, 2}}, m[] = {{m0, 2}};
    CHECK(kp_grammar_compile_alts(f, 1, m, 1, 3, "</s>", 4, &g, &err) == KP_OK);
    expect(g, "[TOOL_CALLS]ping[ARGS]{}</s>", 2);
    expect(g, "[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]ping[ARGS]{}</s>", 2);
    expect(g, "[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]ping[ARGS]{}[", 0); /* at most 3 */
    expect(g, "[TOOL_CALLS]ping[ARGS]{}", 1);
    kp_grammar_free(g);
    json_decref(days);
    json_decref(none);
}

static void test_params(void) {
    json_t *num = json_loads("{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}", 0, NULL);
    /* <function=f>\n[<parameter=q>\nTEXT\n</parameter>\n]<parameter=n>\nN\n</parameter>\n</function>, q optional */
    kp_gpiece p[] = {LIT("<function=f>\n"),
                     {KP_GPIECE_LIT, "<parameter=q>\n", 14, NULL, 1},
                     {KP_GPIECE_TEXT, "<", 1, NULL, 1},
                     {KP_GPIECE_LIT, "\n</parameter>\n", 14, NULL, 1},
                     LIT("<parameter=n>\n"),
                     {KP_GPIECE_JSON, NULL, 0, num, 0},
                     LIT("\n</parameter>\n</function>")};
    kp_galt first[] = {{p, 7}};
    kp_grammar *g = NULL;
    kp_error err = {0};
    CHECK(kp_grammar_compile_alts(first, 1, NULL, 0, 1, NULL, 0, &g, &err) == KP_OK);
    expect(g, "<function=f>\n<parameter=q>\nSão Paulo, \"x\"\n</parameter>\n<parameter=n>\n7\n</parameter>\n</function>", 2);
    expect(g, "<function=f>\n<parameter=n>\n7\n</parameter>\n</function>", 2);
    expect(g, "<function=f>\n<parameter=q>\na<b", 0);            /* the text never holds '<' */
    expect(g, "<function=f>\n<parameter=q>\n\n</parameter>", 0);  /* nor is it empty */
    expect(g, "<function=f>\n<parameter=n>\n12", 0);               /* the schema's range */
    kp_grammar_free(g);
    /* errors */
    CHECK(kp_grammar_compile_alts(first, 0, NULL, 0, 1, NULL, 0, &g, &err) == KP_EINVAL && !g);
    kp_galt empty[] = {{p, 0}};
    CHECK(kp_grammar_compile_alts(empty, 1, NULL, 0, 1, NULL, 0, &g, &err) == KP_EINVAL && !g);
    json_t *bad = json_loads("{\"type\":\"string\",\"pattern\":\"x\"}", 0, NULL);
    kp_gpiece pb[] = {LIT("x"), {KP_GPIECE_JSON, NULL, 0, bad, 0}};
    kp_galt fb[] = {{pb, 2}};
    CHECK(kp_grammar_compile_alts(fb, 1, NULL, 0, 1, NULL, 0, &g, &err) == KP_EUNSUPPORTED && !g);
    CHECK_MSG(strstr(err.msg, "pattern") != NULL, "%s", err.msg);
    json_decref(bad);
    json_decref(num);
}

int main(void) {
    RUN(test_json_calls);
    RUN(test_params);
    return harness_finish("grammar_compose");
}
