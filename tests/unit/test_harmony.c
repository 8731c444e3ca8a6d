/*
 * test_harmony.c - OpenAI's harmony format read back (serve/harmony.h).
 *
 * The replies are written from the published format (the cookbook's
 * "OpenAI Harmony Response Format": its tool-call, preamble and tool
 * examples, the recipient in the channel or in the role part of the
 * header, with and without <|constrain|>), and from how gpt-oss's chat
 * template renders a call back (" to=functions.NAME<|channel|>commentary
 * json<|message|>ARGS<|call|>"). Each must read back as the calls it
 * holds and the content in front of them; and at every prefix of it, the
 * stream's holdback never decreases and never passes the final content.
 * Detection: gpt-oss's template renders harmony, Qwen 3's does not.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "serve/chat_tmpl.h"
#include "serve/harmony.h"
#include "serve/reasoning.h"

#define WHOLE SIZE_MAX /* the whole text is content */
#define AFTER_END(s) (strstr((s), "<|end|>") - (s) + 7) /* up to the first message's end */

typedef struct {
    const char *text;
    size_t content_len; /* WHOLE, or a length */
    const char *calls;  /* [{"name", "arguments"}] or NULL */
} parse_case;

static const char ANALYSIS_CALL[] =
    "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>";
static const char PREAMBLE_CALL[] =
    "<|channel|>commentary<|message|>**Action plan**:\n1. Generate an HTML file\n---\nWill start<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.generate_file<|constrain|>json<|message|>"
    "{\"template\": \"basic_html\", \"path\": \"index.html\"}<|call|>";
static const char TWO_CALLS[] =
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Paris\"}<|call|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_location<|message|>{}<|call|>";

static void check_parse(const parse_case *c) {
    size_t len = strlen(c->text), want_cl = c->content_len == WHOLE ? len : c->content_len;
    json_t *got = NULL;
    size_t cl = 0;
    kp_error err;
    CHECK(kp_harmony_parse(c->text, len, 7, &got, &cl, &err) == KP_OK);
    json_t *want = c->calls ? json_loads(c->calls, 0, NULL) : NULL;
    bool ok = cl == want_cl && json_array_size(got) == json_array_size(want) && (!want) == (!got);
    for (size_t i = 0; ok && i < json_array_size(want); i++) {
        const json_t *call = json_array_get(got, i), *fn = json_object_get(call, "function");
        const json_t *w = json_array_get(want, i);
        json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        ok = json_equal(json_object_get(fn, "name"), json_object_get(w, "name")) &&
             json_equal(a, json_object_get(w, "arguments")) && json_is_string(json_object_get(call, "id"));
        json_decref(a);
    }
    if (json_array_size(got) == 2) /* one id per call */
        ok = ok && strcmp(json_string_value(json_object_get(json_array_get(got, 0), "id")),
                          json_string_value(json_object_get(json_array_get(got, 1), "id")));
    if (!ok) {
        char *d = got ? json_dumps(got, JSON_COMPACT) : NULL;
        fprintf(stderr, "  %s\n    -> content %zu (want %zu), calls %s\n", c->text, cl, want_cl, d ? d : "none");
        free(d);
    }
    CHECK(ok);
    size_t prev = 0;
    for (size_t k = 0; k <= len; k++) {
        size_t h = kp_harmony_holdback(c->text, k);
        CHECK_MSG(h >= prev && h <= want_cl && h <= k, "holdback %zu at %zu (before: %zu, content %zu): %s", h, k,
                  prev, want_cl, c->text);
        prev = h;
    }
    json_decref(want);
    json_decref(got);
}

static void test_parse(void) {
    const parse_case cases[] = {
        {ANALYSIS_CALL, (size_t)AFTER_END(ANALYSIS_CALL),
         "[{\"name\":\"get_weather\",\"arguments\":{\"location\":\"San Francisco\"}}]"},
        /* the end of generation as a token: not in the text */
        {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Tokyo\"}", 0,
         "[{\"name\":\"get_weather\",\"arguments\":{\"location\":\"Tokyo\"}}]"},
        /* the recipient in the role part of the header, as the template renders calls back */
        {" to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\",\"days\":3}<|call|>", 0,
         "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}]"},
        {"<|start|>assistant to=functions.get_weather<|channel|>commentary<|message|>{\"city\":\"Paris\"}", 0,
         "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]"},
        {PREAMBLE_CALL, (size_t)AFTER_END(PREAMBLE_CALL),
         "[{\"name\":\"generate_file\",\"arguments\":{\"template\":\"basic_html\",\"path\":\"index.html\"}}]"},
        {TWO_CALLS, 0,
         "[{\"name\":\"get_weather\",\"arguments\":{\"location\":\"Paris\"}},"
         "{\"name\":\"get_location\",\"arguments\":{}}]"},
        /* no calls */
        {"<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.", WHOLE,
         NULL},
        {"Plain text about to=functions.get_weather and <|call|>.", WHOLE, NULL},
        {"<|channel|>commentary to=functions.get_weather<|message|>{\"location\": \"Par", WHOLE, NULL}, /* cut */
        {"<|channel|>commentary to=functions.get_weather<|message|>not json<|call|>", WHOLE, NULL},
        {"<|channel|>analysis to=python<|message|>print(1)<|call|>", WHOLE, NULL}, /* not a function */
        /* a call the model went on after is not the reply's end */
        {"<|channel|>commentary to=functions.f<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>Done.",
         WHOLE, NULL},
        {"", 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_parse(&cases[i]);
}

static void test_read(void) {
    kp_harmony_msg m;
    const char *t = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>";
    CHECK_EQ_INT(kp_harmony_read(t, strlen(t), 0, true, &m), KP_HARMONY_MSG);
    CHECK(kp_harmony_channel_is(&m, t, "commentary") && m.closed && m.end == strlen(t));
    size_t n = 0;
    const char *name = kp_harmony_call_name(&m, t, &n);
    CHECK(name && n == 11 && !memcmp(name, "get_weather", 11));
    CHECK(m.body_to - m.body_from == 2 && !memcmp(t + m.body_from, "{}", 2));
    /* a header cut anywhere is partial, never a message or not one */
    for (size_t k = 0; k < (size_t)(strstr(t, "<|message|>") - t) + 11; k++)
        CHECK_MSG(kp_harmony_read(t, k, 0, true, &m) == KP_HARMONY_PARTIAL, "at %zu", k);
    /* a later message must open with <|start|> */
    t = "<|channel|>final<|message|>x";
    CHECK_EQ_INT(kp_harmony_read(t, strlen(t), 0, false, &m), KP_HARMONY_NONE);
    t = "Hello";
    CHECK_EQ_INT(kp_harmony_read(t, strlen(t), 0, true, &m), KP_HARMONY_NONE);
    /* a body ends at a message the model opened without closing the last */
    t = "<|channel|>final<|message|>a<|start|>assistant<|channel|>final<|message|>b";
    CHECK_EQ_INT(kp_harmony_read(t, strlen(t), 0, true, &m), KP_HARMONY_MSG);
    CHECK(m.closed && m.body_to == m.body_from + 1 && m.end == m.body_to);
    /* a tail that may become a closing marker is not safe to show */
    t = "<|channel|>final<|message|>abc<|re";
    CHECK_EQ_INT(kp_harmony_safe_end(t, 0, strlen(t)), strlen(t) - 4);
    t = "<|channel|>final<|message|>a<b";
    CHECK_EQ_INT(kp_harmony_safe_end(t, 0, strlen(t)), strlen(t));
}

/* Texts made of harmony's pieces at random (a fixed seed): at every
 * prefix the holdback never decreases nor passes the final content, and
 * the reasoning split (reasoning.h's harmony mode) shows only prefixes of
 * the final reasoning and content (which hold no closing marker). */
static void test_random_texts(void) {
    static const char *const pieces[] = {
        "<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " to=functions.f",
        "to=functions.get_weather", " <|constrain|>json", " json", "<|message|>", "{}", "{\"a\": [1, \"}\"]}",
        "<|end|>", "<|call|>", "<|return|>", "hi", " ", "\n", "<", "|", "<|"};
    static const kp_reasoning_markers hm = {"<|channel|>analysis<|message|>", "<|end|>", true};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char text[512];
    for (int round = 0; round < 3000; round++) {
        size_t len = 0;
        /* most texts start as harmony does, some anywhere */
        if (round % 4) {
            const char *head = round % 3 ? "<|channel|>analysis<|message|>" : "<|channel|>final<|message|>";
            memcpy(text, head, strlen(head));
            len = strlen(head);
        }
        int n = 1 + (int)(x % 14);
        for (int k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *p = pieces[x % (sizeof pieces / sizeof pieces[0])];
            size_t pl = strlen(p);
            if (len + pl >= sizeof text) break;
            memcpy(text + len, p, pl);
            len += pl;
        }
        text[len] = 0;
        json_t *calls = NULL;
        size_t cl = 0;
        kp_error err;
        CHECK(kp_harmony_parse(text, len, 1, &calls, &cl, &err) == KP_OK);
        CHECK(cl <= len);
        json_decref(calls);
        kp_reasoning_split f;
        kp_reasoning_scan(text, len, &hm, false, true, NULL, &f);
        CHECK(f.content_from <= f.content_to && f.content_to <= len && f.reason_from <= f.reason_to);
        size_t prev = 0;
        for (size_t k = 0; k <= len; k++) {
            size_t h = kp_harmony_holdback(text, k);
            CHECK_MSG(h >= prev && h <= cl && h <= k, "holdback %zu at %zu (before %zu, content %zu): %s", h, k,
                      prev, cl, text);
            prev = h;
            kp_reasoning_split p;
            kp_reasoning_scan(text, k, &hm, false, false, NULL, &p);
            if (p.state == KP_REASONING_OPEN || p.state == KP_REASONING_CLOSED) {
                size_t rl = p.reason_to - p.reason_from;
                CHECK_MSG((!rl || (p.reason_from == f.reason_from && p.reason_to <= f.reason_to)) &&
                              (f.state == KP_REASONING_OPEN || f.state == KP_REASONING_CLOSED),
                          "reasoning at %zu: %s", k, text);
            }
            if (p.state == KP_REASONING_NONE || p.state == KP_REASONING_CLOSED) {
                size_t pl = p.content_to - p.content_from;
                if (pl)
                    CHECK_MSG(p.content_from == f.content_from && p.content_to <= f.content_to,
                              "content at %zu [%zu, %zu) not a prefix of [%zu, %zu): %s", k, p.content_from,
                              p.content_to, f.content_from, f.content_to, text);
            }
        }
    }
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

static bool renders_harmony(const char *path) {
    size_t len = 0;
    char *text = slurp(path, &len);
    CHECK(text != NULL);
    kp_chat_tmpl *t = NULL;
    kp_error err;
    bool yes = text && kp_chat_tmpl_new(text, len, NULL, 0, "", "", &t, &err) == KP_OK && kp_chat_tmpl_harmony(t);
    const kp_reasoning_markers *m = t ? kp_chat_tmpl_reasoning(t) : NULL;
    if (yes) CHECK(m && m->harmony);
    kp_chat_tmpl_free(t);
    free(text);
    return yes;
}

static void test_detect(void) {
    CHECK(renders_harmony("tests/data/chat/templates/llama.cpp/openai-gpt-oss-120b.jinja"));
    CHECK(!renders_harmony("tests/data/chat/templates/llama.cpp/Qwen-Qwen3-0.6B.jinja"));
    CHECK(!renders_harmony("tests/data/chat/templates/google-gemma-3-it.jinja"));
}

int main(void) {
    RUN(test_read);
    RUN(test_parse);
    RUN(test_random_texts);
    RUN(test_detect);
    return harness_finish("harmony");
}
