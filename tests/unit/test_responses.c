/*
 * test_responses.c - the Responses API translation, objects and store
 * (responses.h).
 *
 * Expected values come from the translation table documented in
 * responses.h (each Responses field and the chat-completions field it
 * becomes), OpenAI's API reference (output items, usage) and invariants:
 * a continued conversation is the stored one followed by the new input;
 * the store never holds more than its bounds and drops the least recently
 * used first.
 */
#include "serve/responses.h"
#include "serve/response_store.h"

#include <jansson.h>
#include <string.h>

#include "harness.h"

static bool same(const json_t *a, const char *b) {
    json_t *x = json_loads(b, 0, NULL);
    bool eq = json_equal(a, x);
    if (!eq) {
        char *t = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
        fprintf(stderr, "  got      %s\n  expected %s\n", t, b);
        free(t);
    }
    json_decref(x);
    return eq;
}

static bool tr(const char *body, const json_t *prev, kp_resp_request *r, kp_oai_error *e) {
    return kp_resp_translate(body, strlen(body), prev, false, r, e);
}

static void test_translate(void) {
    kp_resp_request r;
    kp_oai_error e;
    CHECK(tr("{\"model\":\"m\",\"instructions\":\"I\",\"input\":[{\"type\":\"message\",\"role\":\"developer\","
             "\"content\":\"D\"},{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Q\"}]},"
             "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
             "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"o\"}],"
             "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
             "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"max_output_tokens\":9,\"store\":false,"
             "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"}}},"
             "\"user\":\"u\"}",
             NULL, &r, &e));
    CHECK(same(json_object_get(r.chat, "messages"),
               "[{\"role\":\"system\",\"content\":\"I\"},{\"role\":\"developer\",\"content\":\"D\"},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Q\"}]},"
               "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
               "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},{\"id\":\"c2\",\"type\":\"function\","
               "\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"o\"}]"));
    CHECK(same(json_object_get(r.chat, "tools"),
               "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]"));
    CHECK(same(json_object_get(r.chat, "tool_choice"), "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"));
    CHECK(same(json_object_get(r.chat, "response_format"),
               "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\"}}}"));
    CHECK_EQ_INT(json_integer_value(json_object_get(r.chat, "max_tokens")), 9);
    CHECK(!r.store && !r.stream);
    CHECK_EQ_STR(r.ignored.data, "user");
    /* the conversation kept for a continuation has no instructions */
    CHECK_EQ_INT(json_array_size(r.conv), 4);
    json_t *calls = json_loads("[{\"id\":\"c9\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                               "\"{}\"}}]", 0, NULL);
    json_t *after = kp_resp_conv_after(&r, "T", 1, calls);
    CHECK(same(json_array_get(after, 4), "{\"role\":\"assistant\",\"content\":\"T\",\"tool_calls\":[{\"id\":\"c9\","
                                         "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}"));
    /* continuing: the stored conversation, then the new input, after the new instructions */
    kp_resp_request r2;
    CHECK(tr("{\"instructions\":\"J\",\"input\":\"next\",\"previous_response_id\":\"resp_1\"}", after, &r2, &e));
    CHECK_EQ_STR(r2.previous, "resp_1");
    json_t *m = json_object_get(r2.chat, "messages");
    CHECK_EQ_INT(json_array_size(m), 7);
    CHECK(same(json_array_get(m, 0), "{\"role\":\"system\",\"content\":\"J\"}"));
    CHECK(same(json_array_get(m, 6), "{\"role\":\"user\",\"content\":\"next\"}"));
    CHECK_EQ_INT(json_array_size(r2.conv), 6);
    char prev[32];
    const char *b = "{\"previous_response_id\":\"resp_1\"}";
    CHECK(kp_resp_previous(b, strlen(b), prev, sizeof prev));
    CHECK_EQ_STR(prev, "resp_1");
    CHECK(!kp_resp_previous("{}", 2, prev, sizeof prev));
    kp_resp_request_free(&r2);
    json_decref(after);
    json_decref(calls);
    kp_resp_request_free(&r);
    kp_resp_request_free(NULL);
}

/* A reasoning item sent back (its reasoning_text parts, else its summary)
 * is the reasoning_content of the assistant turn that follows it. */
static void test_reasoning_items(void) {
    kp_resp_request r;
    kp_oai_error e;
    CHECK(tr("{\"input\":[{\"role\":\"user\",\"content\":\"Q\"},{\"type\":\"reasoning\",\"id\":\"rs_1\","
             "\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"a\"},{\"type\":"
             "\"reasoning_text\",\"text\":\"b\"}]},{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\","
             "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"o\"},"
             "{\"type\":\"reasoning\",\"id\":\"rs_2\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s\"}]},"
             "{\"role\":\"assistant\",\"content\":\"A\"},{\"type\":\"reasoning\",\"id\":\"rs_3\",\"summary\":[],"
             "\"encrypted_content\":\"zz\"},{\"role\":\"user\",\"content\":\"Q2\"}]}",
             NULL, &r, &e));
    const json_t *m = json_object_get(r.chat, "messages");
    CHECK(same(json_array_get(m, 1), "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"a\\nb\","
                                     "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                                     "\"f\",\"arguments\":\"{}\"}}]}"));
    CHECK(same(json_array_get(m, 3), "{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":\"s\"}"));
    CHECK(same(json_array_get(m, 4), "{\"role\":\"user\",\"content\":\"Q2\"}"));
    CHECK_EQ_INT(json_array_size(m), 5);
    kp_resp_request_free(&r);
}

/* Members of input items kvpin does not act on are named, or refused with
 * --strict-api; those the API gives items it returns (id, status) pass. */
static void test_item_members(void) {
    const char *body = "{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":\"Q\",\"colour\":1},"
                       "{\"type\":\"function_call\",\"id\":\"fc_1\",\"status\":\"completed\",\"call_id\":\"c\","
                       "\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"c\","
                       "\"output\":\"o\",\"extra\":true}]}";
    kp_resp_request r;
    kp_oai_error e;
    CHECK(kp_resp_translate(body, strlen(body), NULL, false, &r, &e));
    CHECK_EQ_STR(r.ignored.data, "input[0].colour,input[2].extra");
    kp_resp_request_free(&r);
    CHECK(!kp_resp_translate(body, strlen(body), NULL, true, &r, &e));
    CHECK_EQ_STR(e.param, "input[0].colour");
}

static void test_refused(void) {
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{\"input\":[]}", "input"},
        {"{\"input\":5}", "input"},
        {"{\"input\":[{\"type\":\"message\",\"role\":\"tool\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}", "input[0].content[0].type"},
        {"{\"input\":[{\"type\":\"reasoning\",\"content\":[{\"type\":\"output_text\",\"text\":\"x\"}]}]}",
         "input[0]"},
        {"{\"input\":[{\"type\":\"computer_call\"}]}", "input[0].type"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\"}]}", "input[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"teleport\"}]}", "tools[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"n\",\"tools\":[{\"type\":\"web_search\"}]}]}",
         "tools[0].tools[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"n\"}]}", "tools[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"},{\"type\":\"namespace\",\"name\":\"n\","
         "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}]}", "tools[1].tools[0]"},
        {"{\"input\":\"x\",\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"temperature\":3}", "temperature"},
        {"{\"input\":\"x\",\"store\":\"yes\"}", "store"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kp_resp_request r;
        kp_oai_error e;
        bool ok = tr(cases[i].body, NULL, &r, &e);
        CHECK_MSG(!ok, "case %zu accepted", i);
        if (ok) {
            kp_resp_request_free(&r);
            continue;
        }
        CHECK_EQ_INT(e.http, 400);
        CHECK_EQ_STR(e.param, cases[i].param);
        CHECK(r.root == NULL && r.chat == NULL);
    }
}

/* Codex's tools: a namespace's functions become chat tools by their own
 * names and its calls' items name the namespace again (what Codex
 * dispatches on: a function_call item {name, namespace}); hosted tools are
 * left out and named, or refused when strict. */
static void test_tools(void) {
    const char *body = "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f1\"},"
                       "{\"type\":\"namespace\",\"name\":\"ns1\",\"description\":\"group\",\"tools\":["
                       "{\"type\":\"function\",\"name\":\"f2\",\"parameters\":{\"type\":\"object\"}},"
                       "{\"type\":\"function\",\"name\":\"f3\"}]},"
                       "{\"type\":\"web_search\",\"external_web_access\":false}]}";
    kp_resp_request r;
    kp_oai_error e;
    CHECK(tr(body, NULL, &r, &e));
    CHECK(same(json_object_get(r.chat, "tools"),
               "[{\"type\":\"function\",\"function\":{\"name\":\"f1\"}},"
               "{\"type\":\"function\",\"function\":{\"name\":\"f2\",\"parameters\":{\"type\":\"object\"}}},"
               "{\"type\":\"function\",\"function\":{\"name\":\"f3\"}}]"));
    CHECK(same(r.ns_of, "{\"f2\":\"ns1\",\"f3\":\"ns1\"}"));
    CHECK(r.ignored.data && strstr(r.ignored.data, "tools[2]:web_search"));
    json_t *calls = json_loads("[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f2\",\"arguments\":\"{}\"}},"
                               "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"f1\",\"arguments\":\"{}\"}}]",
                               0, NULL);
    json_t *o = kp_resp_output_json("", 0, calls, 7, "completed", r.ns_of);
    CHECK_EQ_INT((int)json_array_size(o), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(o, 0), "namespace")), "ns1");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(o, 0), "name")), "f2");
    CHECK(json_object_get(json_array_get(o, 1), "namespace") == NULL);
    json_decref(o);
    json_decref(calls);
    kp_resp_request_free(&r);
    /* strict: a hosted tool is refused, naming it */
    CHECK(!kp_resp_translate(body, strlen(body), NULL, true, &r, &e));
    CHECK_EQ_INT(e.http, 400);
    CHECK_EQ_STR(e.param, "tools[2]");
}

static void test_objects(void) {
    json_t *calls = json_loads("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                               "\"{}\"}}]", 0, NULL);
    json_t *o = kp_resp_output_json("Hi", 2, calls, 5, "completed", NULL);
    CHECK_EQ_INT(json_array_size(o), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(o, 0), "type")), "message");
    CHECK(same(json_object_get(json_array_get(o, 0), "content"),
               "[{\"type\":\"output_text\",\"text\":\"Hi\",\"annotations\":[]}]"));
    const json_t *fc = json_array_get(o, 1);
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "type")), "function_call");
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "call_id")), "call_1");
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "arguments")), "{}");
    char id[48];
    kp_resp_item_id(id, sizeof id, "fc", 5, 1);
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "id")), id);
    json_decref(o);
    o = kp_resp_output_json("", 0, calls, 5, "completed", NULL); /* calls alone: no message item */
    CHECK_EQ_INT(json_array_size(o), 1);
    json_decref(o);
    json_decref(calls);
    json_t *u = kp_resp_usage_json(10, 4, 3);
    CHECK(same(u, "{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":3,"
                  "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":13}"));
    json_decref(u);
    kp_resp_request r;
    kp_oai_error e;
    CHECK(tr("{\"input\":\"x\",\"max_output_tokens\":4}", NULL, &r, &e));
    json_t *obj = kp_resp_object_json("resp_1", "m", 7, "incomplete", &r, NULL, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(obj, "object")), "response");
    CHECK(same(json_object_get(obj, "incomplete_details"), "{\"reason\":\"max_output_tokens\"}"));
    CHECK_EQ_INT(json_integer_value(json_object_get(obj, "max_output_tokens")), 4);
    CHECK(json_is_true(json_object_get(obj, "store")));
    json_decref(obj);
    kp_resp_request_free(&r);
    kp_buf b = {0};
    uint32_t seq = 3;
    CHECK(kp_resp_event(&b, "response.created", json_object(), &seq));
    CHECK_EQ_STR(b.data, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":3}\n\n");
    CHECK_EQ_INT(seq, 4);
    kp_buf_free(&b);
}

static void test_store(void) {
    kp_response_store *s;
    kp_error err;
    CHECK(kp_response_store_new(&s, 2, 1 << 20, &err) == KP_OK);
    json_t *o = json_pack("{s:s}", "id", "a"), *conv = json_pack("[{s:s}]", "role", "user");
    CHECK(kp_response_store_put(s, "a", o, conv));
    CHECK(kp_response_store_put(s, "b", o, conv));
    json_t *got = NULL, *gc = NULL;
    CHECK(kp_response_store_get(s, "a", &got, &gc)); /* a is now the most recently used */
    CHECK(json_equal(got, o) && json_equal(gc, conv));
    json_decref(got);
    json_decref(gc);
    CHECK(kp_response_store_put(s, "c", o, conv)); /* over the count: b goes */
    CHECK(!kp_response_store_get(s, "b", NULL, NULL));
    CHECK(kp_response_store_get(s, "a", NULL, NULL) && kp_response_store_get(s, "c", NULL, NULL));
    uint32_t n, mc;
    size_t bytes, mb;
    kp_response_store_stats(s, &n, &bytes, &mc, &mb);
    CHECK_EQ_INT(n, 2);
    CHECK(bytes > 0 && mc == 2);
    CHECK(kp_response_store_delete(s, "a"));
    CHECK(!kp_response_store_delete(s, "a"));
    kp_response_store_stats(s, &n, &bytes, &mc, &mb);
    CHECK_EQ_INT(n, 1);
    kp_response_store_free(s);
    /* a byte bound: what alone is larger is refused, and the bytes never pass it */
    CHECK(kp_response_store_new(&s, 100, 100, &err) == KP_OK);
    json_t *big = json_pack("{s:s}", "t", "01234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789");
    CHECK(!kp_response_store_put(s, "x", big, conv));
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        CHECK(kp_response_store_put(s, id, o, conv));
        kp_response_store_stats(s, &n, &bytes, &mc, &mb);
        CHECK(bytes <= 100);
    }
    CHECK(kp_response_store_get(s, "r9", NULL, NULL));
    CHECK(!kp_response_store_get(s, "r0", NULL, NULL));
    kp_response_store_free(s);
    kp_response_store_free(NULL);
    json_decref(big);
    json_decref(o);
    json_decref(conv);
}

int main(void) {
    RUN(test_translate);
    RUN(test_reasoning_items);
    RUN(test_item_members);
    RUN(test_refused);
    RUN(test_tools);
    RUN(test_objects);
    RUN(test_store);
    return harness_finish("test_responses");
}
