/*
 * test_gcache.c - the server's cache of compiled request grammars
 * (serve/gcache.h).
 *
 * Expected values are invariants of the contract: the same constraint
 * (equal canonical schema bytes and member order) gives the same grammar
 * object and counts a hit; schemas that differ only in spelling (number
 * forms, whitespace) hit too; a different property order is another
 * grammar (the output follows it); failed compiles are not kept; past cap
 * entries the least recently used one is dropped while requests keep
 * their references alive; the grammars have no outer whitespace; a
 * compile whose stop callback says stop (the client left) ends with
 * KP_EIO and is not kept either.
 */
#include <string.h>

#include "base/buf.h"
#include "harness.h"
#include "serve/gcache.h"

static json_t *js(const char *text) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    CHECK_MSG(j != NULL, "%s: %s", text, je.text);
    return j;
}

/* 2 complete, 1 proper prefix, 0 rejected. */
static int doc(const kp_grammar *g, const char *text) {
    static const char *const p[1] = {"a"};
    static const size_t l[1] = {1};
    kp_gvocab *gv = NULL;
    kp_gmatch *m = NULL;
    kp_error err = {0};
    int r = -1;
    if (kp_gvocab_new_raw(&gv, 1, p, l, NULL, &err) == KP_OK && kp_gmatch_new(&m, g, gv, &err) == KP_OK)
        r = kp_gmatch_accept_bytes(m, text, strlen(text), NULL) != KP_OK ? 0 : kp_gmatch_complete(m) ? 2 : 1;
    kp_gmatch_free(m);
    kp_gvocab_free(gv);
    return r;
}

static void test_hits_and_keys(void) {
    kp_gcache *c = NULL;
    kp_error err = {0};
    CHECK(kp_gcache_new(&c, 4, &err) == KP_OK);
    json_t *a = js("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"maxLength\":3}},"
                   "\"required\":[\"x\",\"y\"]}");
    json_t *a2 = js(" { \"type\" : \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"y\": {\"maxLength\": 3.0}},"
                    " \"required\": [\"x\", \"y\"] } ");
    json_t *b = js("{\"type\":\"object\",\"properties\":{\"y\":{\"maxLength\":3},\"x\":{\"type\":\"integer\"}},"
                   "\"required\":[\"x\",\"y\"]}");
    kp_grammar *g1 = NULL, *g2 = NULL, *g3 = NULL, *g4 = NULL;
    uint64_t hits, compiles;
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, a, NULL, 0, NULL, &g1, &err) == KP_OK);
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, a2, NULL, 0, NULL, &g2, &err) == KP_OK);
    CHECK(g1 && g1 == g2);
    kp_gcache_counts(c, &hits, &compiles);
    CHECK(hits == 1 && compiles == 1);
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, b, NULL, 0, NULL, &g3, &err) == KP_OK);
    CHECK(g3 && g3 != g1);
    CHECK_EQ_INT(doc(g1, "{\"x\":1,\"y\":\"ab\"}"), 2);
    CHECK_EQ_INT(doc(g3, "{\"y\":\"ab\",\"x\":1}"), 2);
    CHECK_EQ_INT(doc(g3, "{\"x\":1,\"y\":\"ab\"}"), 0); /* the schema's order */
    CHECK_EQ_INT(doc(g1, " {\"x\":1,\"y\":\"ab\"}"), 0); /* no outer whitespace */
    CHECK_EQ_INT(doc(g1, "{\"x\":1,\"y\":\"ab\"} "), 0);
    CHECK_EQ_INT(doc(g1, "{\"x\":1,  \"y\":\"ab\"}"), 0); /* at most KP_GCACHE_WS (1) between tokens */
    CHECK_EQ_INT(doc(g1, "{\"x\":1, \"y\":\"ab\"}"), 2);
    /* json_object and GBNF have their own keys */
    CHECK(kp_gcache_get(c, KP_GC_JSON_OBJECT, NULL, NULL, 0, NULL, &g4, &err) == KP_OK);
    CHECK(g4 && doc(g4, "{\"k\":[1,2]}") == 2);
    kp_grammar *g5 = NULL, *g6 = NULL;
    CHECK(kp_gcache_get(c, KP_GC_GBNF, NULL, "root ::= \"a\"", 12, NULL, &g5, &err) == KP_OK);
    CHECK(kp_gcache_get(c, KP_GC_GBNF, NULL, "root ::= \"a\"", 12, NULL, &g6, &err) == KP_OK);
    CHECK(g5 && g5 == g6 && doc(g5, "a") == 2);
    /* a failed compile: the error, nothing kept */
    json_t *bad = js("{\"type\":\"string\",\"pattern\":\"a\"}");
    kp_grammar *g7 = NULL;
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, bad, NULL, 0, NULL, &g7, &err) == KP_EUNSUPPORTED && g7 == NULL);
    CHECK(strstr(err.msg, "pattern") != NULL);
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, bad, NULL, 0, NULL, &g7, &err) == KP_EUNSUPPORTED);
    kp_gcache_counts(c, &hits, &compiles);
    CHECK(hits == 2 && compiles == 4);
    /* 4 entries (a, b, json_object, gbnf): one more drops the least recently used (a) */
    kp_grammar *g8 = NULL, *g9 = NULL;
    CHECK(kp_gcache_get(c, KP_GC_GBNF, NULL, "root ::= \"b\"", 12, NULL, &g8, &err) == KP_OK);
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, a, NULL, 0, NULL, &g9, &err) == KP_OK);
    CHECK(g9 && g9 != g1);                                 /* compiled again */
    CHECK_EQ_INT(doc(g1, "{\"x\":1,\"y\":\"ab\"}"), 2); /* the evicted one lives on in its holders */
    kp_gcache_free(c);                                     /* requests keep their references */
    CHECK_EQ_INT(doc(g3, "{\"y\":\"a\",\"x\":2}"), 2);
    kp_grammar *all[] = {g1, g2, g3, g4, g5, g6, g8, g9};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kp_grammar_free(all[i]);
    json_decref(a);
    json_decref(a2);
    json_decref(b);
    json_decref(bad);
    CHECK(kp_gcache_new(&c, 0, &err) == KP_EINVAL);
    kp_gcache_free(NULL);
}

static bool always(void *arg) {
    (*(int *)arg)++;
    return true;
}

static void test_stop(void) {
    kp_gcache *c = NULL;
    kp_error err = {0};
    CHECK(kp_gcache_new(&c, 4, &err) == KP_OK);
    /* a schema big enough that its compile polls the stop at least once */
    kp_buf t = {0};
    kp_buf_puts(&t, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 400; i++) kp_buf_printf(&t, "%s\"p%d\":{\"type\":\"string\"}", i ? "," : "", i);
    kp_buf_puts(&t, "}}");
    json_t *s = js(t.data);
    int calls = 0;
    kp_grammar_stop stop = {always, &calls};
    kp_grammar *g = NULL;
    CHECK_EQ_INT(kp_gcache_get(c, KP_GC_SCHEMA, s, NULL, 0, &stop, &g, &err), KP_EIO);
    CHECK(g == NULL && calls == 1 && strstr(err.msg, "stopped"));
    uint64_t hits = 9, compiles = 9;
    kp_gcache_counts(c, &hits, &compiles);
    CHECK(hits == 0 && compiles == 0); /* nothing kept */
    CHECK(kp_gcache_get(c, KP_GC_SCHEMA, s, NULL, 0, NULL, &g, &err) == KP_OK && g);
    kp_grammar_free(g);
    kp_buf_free(&t);
    json_decref(s);
    kp_gcache_free(c);
}

int main(void) {
    RUN(test_hits_and_keys);
    RUN(test_stop);
    return harness_finish("gcache");
}
