/*
 * test_chat.c - chat template families against the real templates.
 *
 * Reference: tests/data/chat/golden/<template>__<conversation>.txt are the
 * real Jinja templates of tests/data/chat/templates/ rendered by jinja2 the
 * way Hugging Face transformers renders them (tools/chat_golden.py), with
 * `tojson` writing canonical JSON (see tests/data/chat/README.md for why and
 * what else the script normalizes). A .err file instead means the template
 * raised for that conversation; kvpin must refuse it too, except for the
 * deviations listed in `deviations` below, each with its reason.
 *
 * For every template: its family is detected from the Jinja text, then
 * every conversation of tests/data/chat/conversations.json is rendered with
 * the template's BOS/EOS text and the conversation's add_generation_prompt
 * and compared byte for byte. Families without tools must refuse
 * conversations that use tools (the templates silently drop them).
 *
 * Invariants checked on every conversation a family accepts: the same input
 * renders the same bytes; tools and arguments with keys in another order
 * render the same bytes; every earlier turn rendered with the generation
 * prompt is a byte prefix of the whole conversation (the prefix-cache
 * property). Then every error path, each with the field it must name.
 */
#include "chat.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static json_t *load_json(const char *rel) {
    size_t len;
    char *text = harness_read_file(harness_path(rel), &len);
    if (!text) return NULL;
    json_error_t jerr;
    json_t *v = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!v) fprintf(stderr, "%s:%d: %s\n", rel, jerr.line, jerr.text);
    free(text);
    return v;
}

static char *read_rel(const char *rel, size_t *len) {
    return harness_read_file(harness_path(rel), len);
}

static bool file_exists(const char *rel) {
    FILE *f = fopen(harness_path(rel), "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* Does a conversation send tools or tool traffic? */
static bool uses_tools(const json_t *conv) {
    if (json_array_size(json_object_get(conv, "tools"))) return true;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(conv, "messages"), i, m) {
        if (!strcmp(json_string_value(json_object_get(m, "role")), "tool")) return true;
        if (json_array_size(json_object_get(m, "tool_calls"))) return true;
    }
    return false;
}

static bool system_first(const json_t *conv) {
    json_t *m0 = json_array_get(json_object_get(conv, "messages"), 0);
    return !strcmp(json_string_value(json_object_get(m0, "role")), "system");
}

static kp_chat_opts conv_opts(const json_t *tmpl, const json_t *conv) {
    kp_chat_opts o = {0};
    o.bos_token = json_string_value(json_object_get(tmpl, "bos"));
    o.eos_token = json_string_value(json_object_get(tmpl, "eos"));
    o.add_generation_prompt = json_is_true(json_object_get(conv, "add_generation_prompt"));
    o.date_string = json_string_value(json_object_get(conv, "date_string"));
    o.disable_thinking = json_is_false(json_object_get(conv, "enable_thinking"));
    return o;
}

static kp_status render_conv(kp_chat_family f, const json_t *conv, const kp_chat_opts *o,
                             char **out, size_t *len, kp_error *err) {
    return kp_chat_render(f, json_object_get(conv, "messages"), json_object_get(conv, "tools"), o,
                          out, len, err);
}

/* Where kvpin knowingly differs from a template, and what it is compared
 * with instead (NULL: nothing; the difference is the point). */
static const struct {
    const char *template_stem;
    bool any_system_first; /* every conversation that starts with a system message */
    const char *conversation;
    const char *instead; /* template stem whose golden is used instead */
    const char *why;
} deviations[] = {
    {"google-gemma-2-2b-it", true, NULL, "google-gemma-3-it",
     "Gemma 2's template refuses a system message; kvpin merges it into the first user turn "
     "as Gemma 3's template does"},
    {"microsoft-Phi-3-mini-4k-instruct", false, "empty_content", "microsoft-Phi-3.5-mini-instruct",
     "Phi-3-mini-4k writes an empty system turn; kvpin follows Phi-3.5, which leaves it out"},
};

static void test_goldens(void) {
    json_t *templates = load_json("tests/data/chat/templates.json");
    json_t *convs = load_json("tests/data/chat/conversations.json");
    CHECK(templates && convs);
    if (!templates || !convs) goto done;
    int compared = 0, refused_as_template = 0, refused_tools = 0, deviated = 0;
    size_t ti;
    json_t *tmpl;
    json_array_foreach(templates, ti, tmpl) {
        const char *file = json_string_value(json_object_get(tmpl, "file"));
        char rel[512], stem[256];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(file) - strlen(".jinja")), file);
        snprintf(rel, sizeof rel, "tests/data/chat/templates/%s", file);
        char *jinja = read_rel(rel, NULL);
        CHECK_MSG(jinja != NULL, "cannot read %s", rel);
        if (!jinja) continue;
        kp_chat_family f = kp_chat_detect(jinja);
        free(jinja);
        const char *want_family = json_string_value(json_object_get(tmpl, "family"));
        CHECK_MSG(f == kp_chat_family_from_name(want_family) && f != KP_CHAT_UNKNOWN,
                  "%s detected as %s, not %s", file, kp_chat_family_name(f), want_family);

        const char *cname;
        json_t *conv;
        json_object_foreach(convs, cname, conv) {
            const char *golden_stem = stem;
            const char *why = NULL;
            for (size_t d = 0; d < sizeof deviations / sizeof deviations[0]; d++) {
                if (strcmp(deviations[d].template_stem, stem)) continue;
                if (deviations[d].any_system_first ? system_first(conv)
                                                   : !strcmp(deviations[d].conversation, cname)) {
                    golden_stem = deviations[d].instead;
                    why = deviations[d].why;
                }
            }
            kp_chat_opts o = conv_opts(tmpl, conv);
            char *out = NULL;
            size_t len = 0;
            kp_error err = {0};
            kp_status st = render_conv(f, conv, &o, &out, &len, &err);

            char txt[512], errf[512];
            snprintf(txt, sizeof txt, "tests/data/chat/golden/%s__%s.txt", golden_stem, cname);
            snprintf(errf, sizeof errf, "tests/data/chat/golden/%s__%s.err", golden_stem, cname);
            if (uses_tools(conv) && !kp_chat_family_has_tools(f)) {
                CHECK_MSG(st == KP_EINVAL && strstr(err.msg, "does not support"),
                          "%s / %s: a family without tools must refuse tools (status %d: %s)",
                          stem, cname, (int)st, err.msg);
                refused_tools++;
            } else if (file_exists(errf)) {
                CHECK_MSG(st == KP_EINVAL && out == NULL,
                          "%s / %s: the template refuses this conversation, kvpin rendered it",
                          stem, cname);
                refused_as_template++;
            } else {
                size_t glen = 0;
                char *golden = read_rel(txt, &glen);
                CHECK_MSG(golden != NULL, "missing golden %s", txt);
                CHECK_MSG(st == KP_OK, "%s / %s: %s", stem, cname, err.msg);
                bool same = golden && out && glen == len && memcmp(golden, out, len) == 0;
                if (!same && golden && out) {
                    size_t at = 0;
                    while (at < len && at < glen && out[at] == golden[at]) at++;
                    fprintf(stderr, "  %s / %s differs at byte %zu:\n  kvpin : %.80s\n  jinja2: %.80s\n",
                            stem, cname, at, out + at, golden + at);
                }
                CHECK_MSG(same, "%s / %s: bytes differ from %s", stem, cname, txt);
                if (why) deviated++;
                else compared++;
                free(golden);
            }
            free(out);
        }
    }
    CHECK_MSG(compared >= 150, "only %d renderings compared", compared);
    CHECK(refused_as_template >= 6);
    CHECK(refused_tools >= 30);
    CHECK(deviated >= 8);
done:
    json_decref(templates);
    json_decref(convs);
}

/* ------------------------------------------------------------------ */
/* Invariants                                                          */

static const char *const family_names[] = {"chatml", "qwen2",   "qwen2.5", "qwen3",
                                           "llama3", "llama3.1", "llama2", "mistral",
                                           "gemma",  "phi3",    "zephyr"};

static kp_chat_opts some_opts(kp_chat_family f, bool gen) {
    kp_chat_opts o = {0};
    o.bos_token = f == KP_CHAT_GEMMA ? "<bos>" : f == KP_CHAT_LLAMA31 ? "<|begin_of_text|>" : "<s>";
    o.eos_token = "</s>";
    o.add_generation_prompt = gen;
    return o;
}

static const char *role_of(const json_t *msgs, size_t i) {
    return json_string_value(json_object_get(json_array_get(msgs, i), "role"));
}

static void test_prefix_property(void) {
    json_t *convs = load_json("tests/data/chat/conversations.json");
    CHECK(convs != NULL);
    if (!convs) return;
    int checked = 0;
    for (size_t fi = 0; fi < sizeof family_names / sizeof family_names[0]; fi++) {
        kp_chat_family f = kp_chat_family_from_name(family_names[fi]);
        const char *cname;
        json_t *conv;
        json_object_foreach(convs, cname, conv) {
            json_t *msgs = json_object_get(conv, "messages");
            json_t *tools = json_object_get(conv, "tools");
            kp_chat_opts full_o = some_opts(f, json_is_true(json_object_get(conv, "add_generation_prompt")));
            char *full = NULL, *again = NULL;
            size_t full_len = 0, again_len = 0;
            if (kp_chat_render(f, msgs, tools, &full_o, &full, &full_len, NULL) != KP_OK) continue;
            /* stable: the same input gives the same bytes */
            CHECK(kp_chat_render(f, msgs, tools, &full_o, &again, &again_len, NULL) == KP_OK);
            CHECK(again && again_len == full_len && memcmp(again, full, full_len) == 0);
            free(again);
            for (size_t k = 1; k < json_array_size(msgs); k++) {
                const char *last = role_of(msgs, k - 1), *next = role_of(msgs, k);
                if (strcmp(last, "user") && strcmp(last, "tool")) continue;
                if (strcmp(next, "assistant")) continue;
                json_t *head = json_array();
                for (size_t i = 0; i < k; i++) json_array_append(head, json_array_get(msgs, i));
                kp_chat_opts o = some_opts(f, true);
                char *part = NULL;
                size_t part_len = 0;
                kp_error err = {0};
                kp_status st = kp_chat_render(f, head, tools, &o, &part, &part_len, &err);
                CHECK_MSG(st == KP_OK, "%s / %s, first %zu: %s", family_names[fi], cname, k, err.msg);
                bool prefix = part && part_len <= full_len && memcmp(part, full, part_len) == 0;
                CHECK_MSG(prefix, "%s / %s: the first %zu messages are not a prefix:\n%s\n--- vs ---\n%s",
                          family_names[fi], cname, k, part ? part : "", full);
                checked++;
                free(part);
                json_decref(head);
            }
            free(full);
        }
    }
    CHECK_MSG(checked >= 40, "only %d prefix checks", checked);
    json_decref(convs);
}

/* The same tools and arguments with members in another order and other
 * spacing render the same bytes, for every family with tools. */
static void test_key_order_stability(void) {
    json_t *convs = load_json("tests/data/chat/conversations.json");
    CHECK(convs != NULL);
    if (!convs) return;
    json_t *a = json_object_get(convs, "tool_call"), *b = json_object_get(convs, "tool_call_shuffled");
    CHECK(a && b);
    /* a third order: every object re-read after sorting its keys */
    char *sorted_text = json_dumps(a, JSON_SORT_KEYS | JSON_INDENT(3));
    json_t *c = json_loads(sorted_text, 0, NULL);
    free(sorted_text);
    int families_checked = 0;
    for (int f = 1; f < KP_CHAT_FAMILY_COUNT; f++) {
        if (!kp_chat_family_has_tools((kp_chat_family)f)) continue;
        kp_chat_opts o = some_opts((kp_chat_family)f, true);
        char *ra = NULL, *rb = NULL, *rc = NULL;
        size_t la = 0, lb = 0, lc = 0;
        CHECK(render_conv((kp_chat_family)f, a, &o, &ra, &la, NULL) == KP_OK);
        CHECK(render_conv((kp_chat_family)f, b, &o, &rb, &lb, NULL) == KP_OK);
        CHECK(render_conv((kp_chat_family)f, c, &o, &rc, &lc, NULL) == KP_OK);
        CHECK_MSG(ra && rb && la == lb && !memcmp(ra, rb, la), "%s: shuffled keys change the prompt",
                  kp_chat_family_name((kp_chat_family)f));
        CHECK(ra && rc && la == lc && !memcmp(ra, rc, la));
        /* and the arguments are canonical JSON */
        CHECK(ra && strstr(ra, "{\"city\":\"Paris\",\"unit\":\"celsius\"}") != NULL);
        free(ra);
        free(rb);
        free(rc);
        families_checked++;
    }
    CHECK_EQ_INT(families_checked, 3);
    json_decref(c);
    json_decref(convs);
}

/* ------------------------------------------------------------------ */
/* Details                                                             */

static char *render_text(kp_chat_family f, const char *messages_json, const char *tools_json,
                         const kp_chat_opts *o, kp_status *st, kp_error *err) {
    json_error_t jerr;
    json_t *msgs = json_loads(messages_json, 0, &jerr);
    json_t *tools = tools_json ? json_loads(tools_json, 0, &jerr) : NULL;
    if (!msgs || (tools_json && !tools)) {
        fprintf(stderr, "bad test JSON: %s\n", jerr.text);
        json_decref(msgs);
        json_decref(tools);
        *st = KP_EINVAL;
        return NULL;
    }
    char *out = NULL;
    size_t len = 0;
    *st = kp_chat_render(f, msgs, tools, o, &out, &len, err);
    if (*st != KP_OK) CHECK(out == NULL && len == 0);
    else CHECK(out && strlen(out) == len);
    json_decref(msgs);
    json_decref(tools);
    return out;
}

static void test_arguments(void) {
    kp_chat_opts o = {.add_generation_prompt = true};
    kp_status st;
    kp_error err = {0};
    /* not JSON: kept verbatim (as Qwen 3's template keeps a string) */
    char *out = render_text(KP_CHAT_QWEN3,
                            "[{\"role\":\"user\",\"content\":\"go\"},"
                            "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
                            "\"function\":{\"name\":\"f\",\"arguments\":\"{not json, \\\"b\\\": 1\"}}]}]",
                            NULL, &o, &st, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    CHECK(out && strstr(out, "{\"name\": \"f\", \"arguments\": {not json, \"b\": 1}\n</tool_call>"));
    free(out);
    /* an object instead of a string: canonical too */
    out = render_text(KP_CHAT_QWEN25,
                      "[{\"role\":\"user\",\"content\":\"go\"},"
                      "{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                      "\"arguments\":{\"z\":1.50,\"a\":[1E2,\"\\u00e9\"]}}}]}]",
                      NULL, &o, &st, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    CHECK(out && strstr(out, "\"arguments\": {\"a\":[100,\"\xc3\xa9\"],\"z\":1.5}}"));
    free(out);
    /* duplicate keys in the arguments text are not canonicalizable: verbatim */
    out = render_text(KP_CHAT_LLAMA31,
                      "[{\"role\":\"user\",\"content\":\"go\"},"
                      "{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                      "\"arguments\":\"{\\\"a\\\":1,\\\"a\\\":2}\"}}]}]",
                      NULL, &o, &st, &err);
    CHECK(st == KP_OK && out && strstr(out, "\"parameters\": {\"a\":1,\"a\":2}}<|eot_id|>"));
    free(out);
}

static void test_options(void) {
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    kp_status st;
    kp_error err = {0};
    /* NULL options: no BOS text, no generation prompt */
    char *out = render_text(KP_CHAT_LLAMA3, msgs, NULL, NULL, &st, &err);
    CHECK_EQ_STR(out, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
    free(out);
    kp_chat_opts o = {.add_generation_prompt = true, .bos_token = "<s>"};
    out = render_text(KP_CHAT_MISTRAL, msgs, NULL, &o, &st, &err);
    CHECK_EQ_STR(out, "<s> [INST] hi [/INST]"); /* [/INST] is mistral's generation prompt */
    free(out);
    /* llama3.1's default date, and its override */
    out = render_text(KP_CHAT_LLAMA31, msgs, NULL, &o, &st, &err);
    CHECK(out && strstr(out, "Today Date: 26 Jul 2024\n\n<|eot_id|>"));
    free(out);
    o.date_string = "01 Jan 2030";
    out = render_text(KP_CHAT_LLAMA31, msgs, NULL, &o, &st, &err);
    CHECK(out && strstr(out, "Today Date: 01 Jan 2030\n\n<|eot_id|>"));
    free(out);
    /* an empty tools array is no tools, for every family */
    for (int f = 1; f < KP_CHAT_FAMILY_COUNT; f++) {
        char *with = render_text((kp_chat_family)f, msgs, "[]", &o, &st, &err);
        CHECK_MSG(st == KP_OK, "%s: %s", kp_chat_family_name((kp_chat_family)f), err.msg);
        char *without = render_text((kp_chat_family)f, msgs, NULL, &o, &st, &err);
        CHECK(with && without && !strcmp(with, without));
        free(with);
        free(without);
    }
    /* NUL inside content survives (lengths, not C strings) */
    json_t *m = json_pack("[{s:s,s:s%}]", "role", "user", "content", "a\0b", (size_t)3);
    char *o2 = NULL;
    size_t len = 0;
    CHECK(kp_chat_render(KP_CHAT_CHATML, m, NULL, NULL, &o2, &len, NULL) == KP_OK);
    CHECK(o2 && len == strlen("<|im_start|>user\na") + 2 + strlen("<|im_end|>\n") &&
          !memcmp(o2 + strlen("<|im_start|>user\n"), "a\0b<|im_end|>\n", 14));
    free(o2);
    json_decref(m);
}

static void test_detect_and_names(void) {
    CHECK(kp_chat_detect(NULL) == KP_CHAT_UNKNOWN);
    CHECK(kp_chat_detect("") == KP_CHAT_UNKNOWN);
    CHECK(kp_chat_detect("{% for m in messages %}{{ m.content }}{% endfor %}") == KP_CHAT_UNKNOWN);
    CHECK(kp_chat_detect("{{'<|assistant|>' + eos_token}}") == KP_CHAT_UNKNOWN);
    for (int f = 1; f < KP_CHAT_FAMILY_COUNT; f++) {
        const char *name = kp_chat_family_name((kp_chat_family)f);
        CHECK_MSG(kp_chat_family_from_name(name) == (kp_chat_family)f, "%s", name);
    }
    CHECK(kp_chat_family_from_name("QWEN2.5") == KP_CHAT_QWEN25);
    CHECK(kp_chat_family_from_name("qwen25") == KP_CHAT_QWEN25);
    CHECK(kp_chat_family_from_name("llama3.2") == KP_CHAT_LLAMA31);
    CHECK(kp_chat_family_from_name("Llama3") == KP_CHAT_LLAMA3);
    CHECK(kp_chat_family_from_name("unknown") == KP_CHAT_UNKNOWN);
    CHECK(kp_chat_family_from_name("gpt") == KP_CHAT_UNKNOWN);
    CHECK(kp_chat_family_from_name(NULL) == KP_CHAT_UNKNOWN);
    CHECK_EQ_STR(kp_chat_family_name(KP_CHAT_UNKNOWN), "unknown");
    CHECK_EQ_STR(kp_chat_family_name((kp_chat_family)99), "unknown");
    CHECK(!kp_chat_family_has_tools((kp_chat_family)-1));
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */

static void expect_error(kp_chat_family f, const char *msgs, const char *tools, kp_status code,
                         const char *msg_part) {
    kp_status st;
    kp_error err = {0};
    kp_chat_opts o = {.add_generation_prompt = true};
    char *out = render_text(f, msgs, tools, &o, &st, &err);
    CHECK_MSG(st == code && !out, "%s: status %d (%s), want %d", msgs, (int)st, err.msg, (int)code);
    CHECK_MSG(strstr(err.msg, msg_part) != NULL, "%s: message \"%s\" lacks \"%s\"", msgs, err.msg,
              msg_part);
    free(out);
}

static void test_errors(void) {
    const kp_chat_family Q = KP_CHAT_QWEN25;
    expect_error(Q, "{}", NULL, KP_EINVAL, "messages must be an array");
    expect_error(Q, "[]", NULL, KP_EINVAL, "messages must not be empty");
    expect_error(Q, "[1]", NULL, KP_EINVAL, "messages[0] must be an object");
    expect_error(Q, "[{\"content\":\"x\"}]", NULL, KP_EINVAL, "messages[0].role must be a string");
    expect_error(Q, "[{\"role\":7,\"content\":\"x\"}]", NULL, KP_EINVAL, "messages[0].role must be a string");
    expect_error(Q,
                 "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                 "{\"role\":\"user\",\"content\":\"c\"},{\"role\":\"foo\",\"content\":\"d\"}]",
                 NULL, KP_EINVAL, "messages[3].role: unknown role \"foo\"");
    expect_error(Q, "[{\"role\":\"User\",\"content\":\"x\"}]", NULL, KP_EINVAL, "unknown role \"User\"");
    expect_error(Q, "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":5}]", NULL,
                 KP_EINVAL, "messages[1].content must be a string or an array of text parts");
    expect_error(Q, "[{\"role\":\"user\"}]", NULL, KP_EINVAL, "messages[0].content must be");
    expect_error(Q, "[{\"role\":\"user\",\"content\":null}]", NULL, KP_EINVAL, "messages[0].content must be");
    expect_error(Q, "[{\"role\":\"assistant\",\"content\":null}]", NULL, KP_EINVAL, "messages[0].content must be");
    expect_error(Q, "[{\"role\":\"user\",\"content\":[\"x\"]}]", NULL, KP_EINVAL,
                 "messages[0].content[0] must be an object");
    expect_error(Q,
                 "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]",
                 NULL, KP_EINVAL, "messages[0].content[1].type: unsupported content part \"image_url\"");
    expect_error(Q, "[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]", NULL, KP_EINVAL,
                 "messages[0].content[0].type must be a string");
    expect_error(Q, "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]", NULL, KP_EINVAL,
                 "messages[0].content[0].text must be a string");
    expect_error(Q, "[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":{}}]", NULL, KP_EINVAL,
                 "messages[0].tool_calls must be an array");
    expect_error(Q,
                 "[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                 "\"arguments\":\"{}\"}}]}]",
                 NULL, KP_EINVAL, "messages[0].tool_calls: only assistant messages carry tool calls");
    expect_error(Q, "[{\"role\":\"assistant\",\"tool_calls\":[3]}]", NULL, KP_EINVAL,
                 "messages[0].tool_calls[0] must be an object");
    expect_error(Q,
                 "[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"code\",\"function\":"
                 "{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                 NULL, KP_EINVAL, "messages[0].tool_calls[0].type must be \"function\"");
    expect_error(Q, "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\"}]}]", NULL, KP_EINVAL,
                 "messages[0].tool_calls[0].function must be an object");
    expect_error(Q, "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":1,\"function\":{}}]}]", NULL,
                 KP_EINVAL, "messages[0].tool_calls[0].id must be a string");
    expect_error(Q,
                 "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                 "{\"function\":{\"arguments\":\"{}\"}}]}]",
                 NULL, KP_EINVAL, "messages[0].tool_calls[1].function.name must be a non-empty string");
    expect_error(Q, "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":7}}]}]",
                 NULL, KP_EINVAL, "messages[0].tool_calls[0].function.arguments must be a string");
    expect_error(Q, "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}]", NULL,
                 KP_EINVAL, "messages[0].tool_calls[0].function.arguments must be a string");
    expect_error(Q, "[{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":5}]", NULL, KP_EINVAL,
                 "messages[0].tool_call_id must be a string");
    expect_error(Q, "[{\"role\":\"tool\",\"content\":\"r\",\"name\":[]}]", NULL, KP_EINVAL,
                 "messages[0].name must be a string");
    expect_error(Q, "[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":1}]", NULL,
                 KP_EINVAL, "messages[0].reasoning_content must be a string");
    expect_error(Q, "[{\"role\":\"user\",\"content\":\"x\"}]", "{}", KP_EINVAL, "tools must be an array");
    expect_error(Q, "[{\"role\":\"user\",\"content\":\"x\"}]", "[{\"type\":\"function\"},\"f\"]",
                 KP_EINVAL, "tools[1] must be an object");
    expect_error(Q, "[{\"role\":\"user\",\"content\":\"x\"}]", "[{\"type\":\"function\",\"function\":3}]",
                 KP_EINVAL, "tools[0].function must be an object");
    expect_error(Q, "[{\"role\":\"user\",\"content\":\"x\"}]",
                 "[{\"type\":\"function\",\"function\":{\"description\":\"d\"}}]", KP_EINVAL,
                 "tools[0].function.name must be a string");

    /* families without tools */
    const char *tool_list = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]";
    expect_error(KP_CHAT_LLAMA2, "[{\"role\":\"user\",\"content\":\"x\"}]", tool_list, KP_EINVAL,
                 "tools: the llama2 chat template does not support tools");
    expect_error(KP_CHAT_GEMMA,
                 "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"r\"}]", NULL,
                 KP_EINVAL, "messages[1]: the gemma chat template does not support tool messages");
    expect_error(KP_CHAT_CHATML,
                 "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":"
                 "[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                 NULL, KP_EINVAL, "messages[1].tool_calls: the chatml chat template does not support tool calls");

    /* orders the templates refuse */
    expect_error(KP_CHAT_GEMMA, "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]",
                 NULL, KP_EINVAL, "messages[1].role: the gemma chat template expects \"assistant\" here");
    expect_error(KP_CHAT_MISTRAL, "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"assistant\",\"content\":\"a\"}]",
                 NULL, KP_EINVAL, "messages[1].role: the mistral chat template expects \"user\" here");
    expect_error(KP_CHAT_LLAMA2,
                 "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                 "{\"role\":\"system\",\"content\":\"s\"}]",
                 NULL, KP_EINVAL, "messages[2].role: the llama2 chat template takes a system message only");
    expect_error(KP_CHAT_LLAMA31,
                 "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":["
                 "{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},{\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}]",
                 NULL, KP_EINVAL, "messages[1].tool_calls: the llama3.1 chat template takes one tool call");
    expect_error(KP_CHAT_LLAMA31, "[{\"role\":\"system\",\"content\":\"s\"}]", tool_list, KP_EINVAL,
                 "messages[1]: the llama3.1 chat template puts the tool list into the first user message");
    /* strings built without jansson's UTF-8 check: trimming stays inside the
     * string, and a JSON-quoted tool result is refused */
    json_t *bad = json_pack("[{s:s,s:o}]", "role", "user", "content",
                            json_stringn_nocheck("ok \xe2", 4));
    char *out = NULL;
    size_t len = 0;
    kp_error err = {0};
    CHECK(kp_chat_render(KP_CHAT_LLAMA3, bad, NULL, NULL, &out, &len, &err) == KP_OK);
    CHECK(out && len == strlen("<|start_header_id|>user<|end_header_id|>\n\nok \xe2<|eot_id|>"));
    free(out);
    json_array_append_new(bad, json_pack("{s:s,s:o}", "role", "tool", "content",
                                         json_stringn_nocheck("\xff", 1)));
    CHECK(kp_chat_render(KP_CHAT_LLAMA31, bad, NULL, NULL, &out, &len, &err) == KP_EINVAL);
    CHECK(strstr(err.msg, "messages[1].content is not valid UTF-8") != NULL);
    json_decref(bad);

    expect_error(KP_CHAT_UNKNOWN, "[{\"role\":\"user\",\"content\":\"x\"}]", NULL, KP_EUNSUPPORTED,
                 "unknown chat template family");
    expect_error((kp_chat_family)77, "[{\"role\":\"user\",\"content\":\"x\"}]", NULL, KP_EUNSUPPORTED,
                 "unknown chat template family");
}

int main(void) {
    RUN(test_detect_and_names);
    RUN(test_goldens);
    RUN(test_prefix_property);
    RUN(test_key_order_stability);
    RUN(test_arguments);
    RUN(test_options);
    RUN(test_errors);
    return harness_finish("chat");
}
