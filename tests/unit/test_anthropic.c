/*
 * test_anthropic.c - the Messages API translation and shapes (anthropic.h)
 * and the breakpoint pin table (breakpoints.h).
 *
 * Expected values come from the translation table documented in
 * anthropic.h (each Anthropic field and the chat-completions field it
 * becomes), from Anthropic's API reference (error types by status, the
 * usage fields, tool_use blocks) and from invariants: the three input
 * counts of usage add up to the prompt; a breakpoint's conversation is the
 * request's conversation cut after the block; a refreshed pin replaces the
 * previous one of its prefix.
 */
#include "serve/anthropic.h"
#include "serve/breakpoints.h"

#include <jansson.h>
#include <string.h>

#include "harness.h"

static bool tr(const char *body, kp_anth_request *r, kp_oai_error *e) {
    return kp_anth_translate(body, strlen(body), false, false, r, e);
}

static json_t *J(const char *text) { return json_loads(text, 0, NULL); }

static bool same(const json_t *a, const char *b) {
    json_t *x = J(b);
    bool eq = json_equal(a, x);
    if (!eq) {
        char *t = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
        fprintf(stderr, "  got      %s\n  expected %s\n", t, b);
        free(t);
    }
    json_decref(x);
    return eq;
}

static void test_text_and_system(void) {
    kp_anth_request r;
    kp_oai_error e;
    CHECK(tr("{\"model\":\"m\",\"max_tokens\":8,\"system\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\","
             "\"text\":\"B\"}],\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0.5,"
             "\"top_k\":3,\"stop_sequences\":[\"x\"],\"metadata\":{\"user_id\":\"u\"}}",
             &r, &e));
    CHECK(same(json_object_get(r.chat, "messages"),
               "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\",\"text\":"
               "\"B\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}]"));
    CHECK_EQ_INT(json_integer_value(json_object_get(r.chat, "max_tokens")), 8);
    CHECK_EQ_INT(json_integer_value(json_object_get(r.chat, "top_k")), 3);
    CHECK(same(json_object_get(r.chat, "stop"), "[\"x\"]"));
    CHECK(json_object_get(r.chat, "stream") == NULL);
    CHECK_EQ_INT(r.n_br, 0);
    CHECK_EQ_STR(r.ignored.data ? r.ignored.data : "", "metadata");
    kp_anth_request_free(&r);
    kp_anth_request_free(NULL);
}

static void test_tools_round_trip(void) {
    kp_anth_request r;
    kp_oai_error e;
    CHECK(tr("{\"model\":\"m\",\"max_tokens\":8,\"tools\":[{\"name\":\"w\",\"description\":\"d\",\"input_schema\":"
             "{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"w\"},\"messages\":["
             "{\"role\":\"user\",\"content\":\"Q\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"T\"},{\"type\":\"tool_use\","
             "\"id\":\"toolu_1\",\"name\":\"w\",\"input\":{\"c\":1}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":"
             "[{\"type\":\"text\",\"text\":\"r1\"},{\"type\":\"text\",\"text\":\"r2\"}]},{\"type\":\"text\","
             "\"text\":\"more\"}]}]}",
             &r, &e));
    CHECK(same(json_object_get(r.chat, "tools"),
               "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"d\",\"parameters\":{\"type\":"
               "\"object\"}}}]"));
    CHECK(same(json_object_get(r.chat, "tool_choice"), "{\"type\":\"function\",\"function\":{\"name\":\"w\"}}"));
    CHECK(same(json_object_get(r.chat, "messages"),
               "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Q\"}]},"
               "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"T\"}],\"tool_calls\":[{\"id\":"
               "\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":{\"c\":1}}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"r1\\nr2\"},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]}]"));
    kp_anth_request_free(&r);
    /* an assistant's thinking blocks become its reasoning_content (the
     * template renders or drops it); redacted ones are left out and named */
    CHECK(tr("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":"
             "\"s\"},{\"type\":\"redacted_thinking\",\"data\":\"x\"},{\"type\":\"thinking\",\"thinking\":\"ok\","
             "\"signature\":\"\"},{\"type\":\"text\",\"text\":\"A\"}]},{\"role\":\"user\",\"content\":\"Q2\"}]}",
             &r, &e));
    CHECK(same(json_array_get(json_object_get(r.chat, "messages"), 1),
               "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"A\"}],"
               "\"reasoning_content\":\"hm\\nok\"}"));
    CHECK_EQ_STR(r.ignored.data, "messages[1].content[1]");
    kp_anth_request_free(&r);
    /* any -> required, none -> none */
    CHECK(tr("{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"name\":\"w\",\"input_schema\":{}}],\"tool_choice\":"
             "{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}",
             &r, &e));
    CHECK_EQ_STR(json_string_value(json_object_get(r.chat, "tool_choice")), "required");
    kp_anth_request_free(&r);
}

static void test_breakpoints(void) {
    kp_anth_request r;
    kp_oai_error e;
    CHECK(tr("{\"model\":\"m\",\"max_tokens\":1,\"stream\":true,\"system\":[{\"type\":\"text\",\"text\":\"S\","
             "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}],\"messages\":[{\"role\":\"user\","
             "\"content\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\"}},"
             "{\"type\":\"text\",\"text\":\"b\"}]}]}",
             &r, &e));
    CHECK(r.stream);
    CHECK(json_is_true(json_object_get(r.chat, "stream")));
    CHECK_EQ_INT(r.n_br, 2);
    CHECK_EQ_STR(r.br[0].where, "system[0]");
    CHECK_EQ_INT(r.br[0].ttl_s, 3600);
    CHECK(same(r.br[0].messages, "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"S\"}]}]"));
    CHECK_EQ_STR(r.br[1].where, "messages[0].content[0]");
    CHECK_EQ_INT(r.br[1].ttl_s, 300);
    /* the conversation cut after block 0: block 1 is not in it */
    CHECK(same(r.br[1].messages, "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"S\"}]},"
                                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]"));
    kp_anth_request_free(&r);
}

/* A system message among the turns (Claude Code 2.1 sends its environment
 * so) is a chat system message in its place, its text blocks as parts. */
static void test_system_in_messages(void) {
    kp_anth_request r;
    kp_oai_error e;
    CHECK(tr("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"U\"},"
             "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"E\"}]},{\"role\":\"user\",\"content\":\"V\"}]}",
             &r, &e));
    CHECK(same(json_object_get(r.chat, "messages"),
               "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"U\"}]},"
               "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"E\"}]},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"V\"}]}]"));
    kp_anth_request_free(&r);
}

/* Each refused body, and the field its error names. */
/* Members inside the body kvpin does not act on are named (or, with
 * --strict-api, refused unless the API documents them): in messages,
 * blocks, system blocks and tools; cache_control on a message object
 * (Anthropic's goes on blocks) included. */
static void test_nested_fields(void) {
    const char *body = "{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"S\",\"citations\":"
                       "[]}],\"tools\":[{\"name\":\"w\",\"input_schema\":{},\"colour\":1}],\"messages\":[{\"role\":"
                       "\"user\",\"cache_control\":{\"type\":\"ephemeral\"},\"content\":[{\"type\":\"text\",\"text\":\"Q\","
                       "\"weight\":2}]}]}";
    kp_anth_request r;
    kp_oai_error e;
    CHECK(tr(body, &r, &e));
    /* the four, in whatever order the translation meets them */
    static const char *const want[] = {"system[0].citations", "tools[0].colour", "messages[0].cache_control",
                                       "messages[0].content[0].weight"};
    size_t total = 0;
    for (size_t i = 0; i < 4; i++) {
        const char *hit = r.ignored.data ? strstr(r.ignored.data, want[i]) : NULL;
        size_t n = strlen(want[i]);
        CHECK_MSG(hit && (hit == r.ignored.data || hit[-1] == ',') && (hit[n] == 0 || hit[n] == ','), "%s in %s",
                  want[i], r.ignored.data ? r.ignored.data : "(none)");
        total += n + 1;
    }
    CHECK_EQ_INT(r.ignored.len + 1, total); /* nothing else */
    kp_anth_request_free(&r);
    /* strict: the first one the API does not document */
    CHECK(!kp_anth_translate(body, strlen(body), false, true, &r, &e));
    CHECK_EQ_STR(e.param, "tools[0].colour");
    CHECK(strstr(e.message, "unknown field") != NULL);
    const char *documented = "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
                             "[{\"type\":\"text\",\"text\":\"Q\",\"citations\":[]}]}]}";
    CHECK(kp_anth_translate(documented, strlen(documented), false, true, &r, &e));
    CHECK_EQ_STR(r.ignored.data, "messages[0].content[0].citations");
    kp_anth_request_free(&r);
}

static void test_refused(void) {
    static const struct {
        const char *body, *param, *word;
    } cases[] = {
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}", "max_tokens", "required"},
        {"{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}", "max_tokens", ">= 1"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}", "model", "required"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", "messages", "non-empty"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"Q\"}]}",
         "messages[0].role", "system"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"a\",\"name\":\"w\",\"input\":{}}]}]}",
         "messages[0].content[0].type", "text blocks only"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}",
         "messages[0].content[0].type", "image"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}",
         "messages[0].content[0].type", "document"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}",
         "messages[0].content[0].type", "unknown"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"toolu_x\",\"content\":\"r\"}]}]}",
         "messages[0].content[0]", "toolu_x"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"a\",\"name\":\"w\",\"input\":{}}]}]}",
         "messages[0].content[0].type", "assistant"},
        /* as Anthropic's API: unique tool_use ids, one tool_result each, all in the next message */
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}},{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}}]}]}",
         "messages[1].content[1]", "used twice"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":\"r\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}}]}]}",
         "messages[3].content[0]", "used twice"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":\"r\"},{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":\"r\"}]}]}",
         "messages[2].content[1]", "second tool_result"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}},{\"type\":\"tool_use\",\"id\":\"b\",\"name\":\"w\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":\"r\"}]}]}",
         "messages[2]", "without tool_result blocks immediately after: b"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{}}]},{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":\"r\"}]}]}",
         "messages[2]", "without tool_result blocks immediately after: a"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":"
         "{\"type\":\"ephemeral\",\"ttl\":\"2h\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}",
         "system[0].cache_control", "ttl"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":"
         "{\"type\":\"persistent\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}",
         "system[0].cache_control", "ephemeral"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\","
         "\"content\":\"Q\"}]}",
         "tool_choice", "no tools"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}",
         "temperature", "0 to 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kp_anth_request r;
        kp_oai_error e;
        bool ok = tr(cases[i].body, &r, &e);
        CHECK_MSG(!ok, "case %zu accepted", i);
        if (ok) {
            kp_anth_request_free(&r);
            continue;
        }
        CHECK_EQ_INT(e.http, 400);
        CHECK_EQ_STR(e.param, cases[i].param);
        CHECK_MSG(strstr(e.message, cases[i].word) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, e.message,
                  cases[i].word);
        CHECK(r.chat == NULL && r.n_br == 0);
    }
    /* five breakpoints: the fifth is refused */
    char body[2048] = "{\"model\":\"m\",\"max_tokens\":1,\"system\":[";
    for (int i = 0; i < 5; i++)
        snprintf(body + strlen(body), sizeof body - strlen(body),
                 "%s{\"type\":\"text\",\"text\":\"p%d\",\"cache_control\":{\"type\":\"ephemeral\"}}", i ? "," : "", i);
    strcat(body, "],\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}");
    kp_anth_request r;
    kp_oai_error e;
    CHECK(!tr(body, &r, &e));
    CHECK_EQ_STR(e.param, "system[4].cache_control");
    CHECK(strstr(e.message, "maximum of 4") != NULL);
    /* strict: an unknown top-level field is refused, Anthropic's own are not */
    const char *b2 = "{\"model\":\"m\",\"max_tokens\":1,\"bogus\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}";
    CHECK(!kp_anth_translate(b2, strlen(b2), false, true, &r, &e));
    CHECK_EQ_STR(e.param, "bogus");
    CHECK(kp_anth_translate(b2, strlen(b2), false, false, &r, &e));
    CHECK_EQ_STR(r.ignored.data, "bogus");
    kp_anth_request_free(&r);
    /* count_tokens needs no max_tokens */
    const char *b3 = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}";
    CHECK(kp_anth_translate(b3, strlen(b3), true, false, &r, &e));
    kp_anth_request_free(&r);
}

static void test_errors(void) {
    static const struct {
        int in, out;
        const char *type;
    } map[] = {{400, 400, "invalid_request_error"}, {401, 401, "authentication_error"}, {403, 403, "permission_error"},
               {404, 404, "not_found_error"},       {405, 405, "invalid_request_error"}, {413, 413, "request_too_large"},
               {429, 429, "rate_limit_error"},      {500, 500, "api_error"},            {503, 529, "overloaded_error"}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        const char *type;
        CHECK_EQ_INT(kp_anth_error_status(map[i].in, &type), map[i].out);
        CHECK_EQ_STR(type, map[i].type);
    }
    kp_oai_error e;
    kp_oai_fail(&e, 404, "invalid_request_error", NULL, NULL, "no such thing");
    json_t *j = kp_anth_error_json(&e);
    CHECK(same(j, "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"no such thing\"}}"));
    json_decref(j);
}

static void test_shapes(void) {
    json_t *calls = J("[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
                      "\"{\\\"c\\\":1}\"}},{\"id\":\"call_d\",\"type\":\"function\",\"function\":{\"name\":\"v\","
                      "\"arguments\":\"not json\"}}]");
    json_t *c = kp_anth_content_json("Hi", 2, calls);
    CHECK(same(c, "[{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":\"tool_use\",\"id\":\"toolu_abc\",\"name\":\"w\","
                  "\"input\":{\"c\":1}},{\"type\":\"tool_use\",\"id\":\"toolu_d\",\"name\":\"v\",\"input\":{}}]"));
    json_decref(c);
    c = kp_anth_content_json("", 0, calls);
    CHECK_EQ_INT(json_array_size(c), 2);
    json_decref(c);
    c = kp_anth_content_json("", 0, NULL); /* nothing at all: one empty text block */
    CHECK(same(c, "[{\"type\":\"text\",\"text\":\"\"}]"));
    json_t *m = kp_anth_message_json("msg_1", "x", c, "end_turn", NULL, kp_anth_usage_json(1, 2, 3, 4));
    CHECK(same(m, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"x\",\"content\":[{\"type\":"
                  "\"text\",\"text\":\"\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"usage\":{"
                  "\"input_tokens\":1,\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":3,"
                  "\"output_tokens\":4}}"));
    json_decref(m);
    json_decref(calls);
    /* stop reasons */
    const char *stops[] = {"ab", "cd"};
    const char *which;
    CHECK_EQ_STR(kp_anth_stop_reason(true, true, false, stops, 2, NULL, 0, 0, &which), "tool_use");
    CHECK_EQ_STR(kp_anth_stop_reason(false, true, false, stops, 2, NULL, 0, 0, &which), "max_tokens");
    CHECK_EQ_STR(kp_anth_stop_reason(false, false, true, stops, 2, NULL, 0, 0, &which), "end_turn");
    CHECK(which == NULL);
    CHECK_EQ_STR(kp_anth_stop_reason(false, false, false, stops, 2, "xxcdab", 6, 2, &which), "stop_sequence");
    CHECK_EQ_STR(which, "cd");
    CHECK_EQ_STR(kp_anth_stop_reason(false, false, false, stops, 0, NULL, 0, 0, &which), "end_turn");
    /* an event: its type first */
    kp_buf b = {0};
    CHECK(kp_anth_event(&b, "ping", json_object()));
    CHECK_EQ_STR(b.data, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    kp_buf_free(&b);
}

static void test_cache_usage(void) {
    uint32_t in, cr, rd;
    kp_anth_cache_usage(100, 40, NULL, 0, 0, &in, &cr, &rd); /* automatic reuse: reads */
    CHECK(in == 60 && cr == 0 && rd == 40);
    uint32_t bp[2] = {30, 70};
    kp_anth_cache_usage(100, 0, bp, 2, 0, &in, &cr, &rd); /* first time: written up to the last breakpoint */
    CHECK(in == 30 && cr == 70 && rd == 0);
    kp_anth_cache_usage(100, 90, bp, 2, 0, &in, &cr, &rd); /* expired: a creation again, reuse or not */
    CHECK(in == 30 && cr == 70 && rd == 0);
    kp_anth_cache_usage(100, 99, bp, 2, 2, &in, &cr, &rd); /* a hit: all the reuse is read */
    CHECK(in == 1 && cr == 0 && rd == 99);
    kp_anth_cache_usage(100, 30, bp, 2, 1, &in, &cr, &rd); /* the first held, the second written */
    CHECK(in == 30 && cr == 40 && rd == 30);
    for (uint32_t n = 1; n < 50; n += 7) /* always adds up */
        for (uint32_t reused = 0; reused <= n; reused += 3)
            for (int live = 0; live < 3; live++) {
                kp_anth_cache_usage(n, reused, bp, 2, live, &in, &cr, &rd);
                CHECK_EQ_INT(in + cr + rd, n);
            }
}

static void test_breakpoint_pins(void) {
    kp_breakpoints *b;
    kp_error err;
    CHECK(kp_breakpoints_new(&b, 2, &err) == KP_OK);
    int32_t ids[3] = {1, 2, 3};
    uint64_t h1 = kp_breakpoints_hash(ids, 2), h2 = kp_breakpoints_hash(ids, 3), h3 = kp_breakpoints_hash(ids + 1, 2);
    CHECK(h1 != h2 && h1 != h3);
    CHECK(kp_breakpoints_hash(ids, 2) == h1);
    uint64_t ev;
    CHECK(!kp_breakpoints_live(b, h1, 100));
    CHECK(kp_breakpoints_set(b, h1, 7, 2, 110, 100, &ev) == 0 && ev == 0);
    CHECK(kp_breakpoints_live(b, h1, 109));
    CHECK(!kp_breakpoints_live(b, h1, 110));
    CHECK(kp_breakpoints_set(b, h1, 8, 2, 120, 105, &ev) == 7 && ev == 0); /* a refresh replaces pin 7 */
    CHECK(kp_breakpoints_set(b, h2, 9, 3, 120, 106, &ev) == 0 && ev == 0);
    uint64_t t;
    CHECK_EQ_INT(kp_breakpoints_count(b, 107, &t), 2);
    CHECK_EQ_INT(t, 5);
    CHECK(kp_breakpoints_set(b, h3, 10, 2, 130, 107, &ev) == 0 && ev == 8); /* full: the least recently set goes */
    CHECK(!kp_breakpoints_live(b, h1, 108));
    kp_breakpoints_free(b);
    kp_breakpoints_free(NULL);
}

int main(void) {
    RUN(test_text_and_system);
    RUN(test_tools_round_trip);
    RUN(test_breakpoints);
    RUN(test_system_in_messages);
    RUN(test_nested_fields);
    RUN(test_refused);
    RUN(test_errors);
    RUN(test_shapes);
    RUN(test_cache_usage);
    RUN(test_breakpoint_pins);
    return harness_finish("test_anthropic");
}
