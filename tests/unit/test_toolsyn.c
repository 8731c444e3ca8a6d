/*
 * test_toolsyn.c - each template's own tool-call syntax (src/serve/toolsyn.c).
 *
 * Oracles:
 *   - the template itself: for every real template in tests/data/chat/templates
 *     (and its llama.cpp/ folder) whose syntax is learned, the template's
 *     rendering (through the Jinja interpreter, which test_jinja and
 *     jinja_e2e hold byte-exact to jinja2) of assistant messages with calls
 *     unlike the probes' (other names, nested and non-ASCII arguments, two
 *     calls where the template renders two, content in front) must read
 *     back as exactly those calls and that content; a content-only message
 *     as no call;
 *   - the families' published formats, written out by hand below as a
 *     model writes them (spacing of its own, a closing tag left out at the
 *     end of generation, a value typed by the tool's schema);
 *   - invariants of streaming: over every prefix of a text the holdback
 *     never decreases and never passes the final content's length.
 * The templates that must have a syntax are named: a change that loses
 * one fails here.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "serve/chat_tmpl.h"
#include "serve/toolsyn.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (buf) buf[*len] = 0;
    return buf;
}

static kp_chat_tmpl *load(const char *path) {
    size_t n;
    char *src = read_file(path, &n);
    if (!src) return NULL;
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    if (kp_chat_tmpl_new(src, n, NULL, 0, "<s>", "</s>", &t, &err) != KP_OK) t = NULL;
    free(src);
    return t;
}

static json_t *tools_json(void) {
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                      "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"search_docs\",\"parameters\":{\"type\":"
                      "\"object\",\"properties\":{\"query\":{\"type\":\"string\"},\"filter\":{\"type\":\"object\"}}}}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"ping\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{}}}}]",
                      0, NULL);
}

/* The rendering of [user, assistant(content, calls)] without a generation prompt. */
static char *render(const kp_chat_tmpl *t, const char *content, const json_t *calls, const json_t *tools, size_t *n) {
    json_t *asst = json_pack("{s:s, s:s}", "role", "assistant", "content", content);
    if (calls) json_object_set(asst, "tool_calls", (json_t *)calls);
    json_t *msgs = json_pack("[{s:s, s:s}, o]", "role", "user", "content", "What now?", asst);
    kp_chat_opts o = {0};
    char *out = NULL;
    kp_error err;
    if (kp_chat_tmpl_render(t, msgs, tools, &o, NULL, &out, n, NULL, NULL, &err) != KP_OK) out = NULL;
    json_decref(msgs);
    return out;
}

/* Checks that the template's rendering of calls (args as JSON texts) after
 * content reads back as them. Templates may refuse some shapes (one call
 * only, content beside calls): a refusal is skipped, not a failure. */
static int roundtrip(const char *name, const kp_chat_tmpl *t, const kp_toolsyn *s, const char *content,
                     const char *const *names, const char *const *args, size_t n) {
    json_t *tools = tools_json(), *calls = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", i ? "abcDEF789" : "xyz123ABC", "type",
                                               "function", "function", "name", names[i], "arguments", args[i]));
    size_t n0 = 0, n1 = 0;
    char *r0 = render(t, "Plain answer.", NULL, tools, &n0), *r1 = render(t, content, calls, tools, &n1);
    int checked = 0;
    if (r0 && r1) {
        /* the markup: where r1 differs from r0 */
        size_t p = 0, q = 0;
        while (p < n0 && p < n1 && r0[p] == r1[p]) p++;
        while (q < n0 - p && q < n1 - p && r0[n0 - 1 - q] == r1[n1 - 1 - q]) q++;
        for (size_t k = p; k-- > 0 && p - k <= 32;) {
            if (r1[k] == '>' || r1[k] == ']' || r1[k] == ' ' || r1[k] == '\n') break;
            if (r1[k] == '<' || r1[k] == '[') {
                p = k;
                break;
            }
        }
        const char *x = r1 + p;
        size_t xn = n1 - q - p;
        json_t *got = NULL;
        size_t cl = 0;
        kp_error err;
        CHECK(kp_toolsyn_parse(s, tools, x, xn, 7, &got, &cl, &err) == KP_OK);
        bool ok = json_array_size(got) == n;
        for (size_t i = 0; ok && i < n; i++) {
            const json_t *fn = json_object_get(json_array_get(got, i), "function");
            json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
            json_t *w = json_loads(args[i], 0, NULL);
            ok = !strcmp(json_string_value(json_object_get(fn, "name")), names[i]) && json_equal(a, w);
            json_decref(a);
            json_decref(w);
        }
        /* the content, where the template wrote it in front of the calls
         * (some write it after them: then it is not read as content) */
        const char *cpos = *content ? strstr(x, content) : NULL, *npos = strstr(x, names[0]);
        if (cpos && npos && cpos > npos) {
            json_decref(got);
            free(r0);
            free(r1);
            json_decref(calls);
            json_decref(tools);
            return 0;
        }
        if (ok && cpos) ok = cl >= strlen(content) && !memcmp(x, content, strlen(content));
        if (!ok) {
            char *d = got ? json_dumps(got, JSON_COMPACT) : NULL;
            fprintf(stderr, "  %s: %zu call(s) after '%s' read back as %s (content %zu) from: %.*s\n", name, n,
                    content, d ? d : "none", cl, (int)xn, x);
            free(d);
        }
        CHECK(ok);
        /* holdback over every prefix */
        size_t prev = 0;
        bool mono = true;
        for (size_t k = 0; k <= xn; k++) {
            size_t h = kp_toolsyn_holdback(s, x, k);
            if (h < prev || h > cl) mono = false;
            prev = h;
        }
        if (!mono) fprintf(stderr, "  %s: holdback not monotonic / passes content\n", name);
        CHECK(mono);
        json_decref(got);
        checked = 1;
    }
    free(r0);
    free(r1);
    json_decref(calls);
    json_decref(tools);
    return checked;
}

static void test_templates(const char *dir, size_t *n_tmpl, size_t *n_syn, size_t *n_checked) {
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        kp_chat_tmpl *t = load(path);
        if (!t) continue;
        (*n_tmpl)++;
        const kp_toolsyn *s = kp_chat_tmpl_calls(t, NULL);
        if (s) {
            (*n_syn)++;
            static const char *const n1[] = {"get_weather"};
            static const char *const a1[] = {"{\"city\":\"Zürich \\\"Altstadt\\\"\",\"days\":3}"};
            static const char *const n2[] = {"search_docs", "ping"};
            static const char *const a2[] = {"{\"query\":\"kv cache; [a] {b}\"}", "{}"};
            static const char *const a2n[] = {"{\"query\":\"q\",\"filter\":{\"tags\":[\"x\",\"y\"],\"n\":1}}", "{}"};
            *n_checked += (size_t)roundtrip(e->d_name, t, s, "", n1, a1, 1);
            *n_checked += (size_t)roundtrip(e->d_name, t, s, "Let me look that up.", n1, a1, 1);
            if (kp_toolsyn_parallel(s)) *n_checked += (size_t)roundtrip(e->d_name, t, s, "", n2, a2, 2);
            /* nested arguments: JSON forms carry them whole; PARAMS values are JSON too */
            *n_checked += (size_t)roundtrip(e->d_name, t, s, "", n2, a2n, 1);
        }
        kp_chat_tmpl_free(t);
    }
    closedir(d);
}

static void test_all_templates(void) {
    size_t n_tmpl = 0, n_syn = 0, n_checked = 0;
    test_templates("tests/data/chat/templates", &n_tmpl, &n_syn, &n_checked);
    test_templates("tests/data/chat/templates/llama.cpp", &n_tmpl, &n_syn, &n_checked);
    printf("  %zu templates, %zu with a tool-call syntax, %zu renderings read back\n", n_tmpl, n_syn, n_checked);
    CHECK(n_checked >= n_syn * 2);
}

/* The families that must be recognised, and what they must read. */
static const kp_toolsyn *syn_of(kp_chat_tmpl **t, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "tests/data/chat/templates/llama.cpp/%s", file);
    *t = load(path);
    CHECK(*t != NULL);
    const char *why = NULL;
    const kp_toolsyn *s = *t ? kp_chat_tmpl_calls(*t, &why) : NULL;
    if (!s) fprintf(stderr, "  %s: no syntax: %s\n", file, why ? why : "?");
    CHECK(s != NULL);
    return s;
}

#define WHOLE SIZE_MAX /* the whole text is content */

/* text as a model writes it must read back as content[0..cl) and calls. */
static void expect(const char *file, const char *text, size_t want_cl, const char *want_calls) {
    if (want_cl == WHOLE) want_cl = strlen(text);
    kp_chat_tmpl *t = NULL;
    const kp_toolsyn *s = syn_of(&t, file);
    if (!s) {
        kp_chat_tmpl_free(t);
        return;
    }
    json_t *tools = tools_json(), *got = NULL;
    size_t cl = 0;
    kp_error err;
    CHECK(kp_toolsyn_parse(s, tools, text, strlen(text), 7, &got, &cl, &err) == KP_OK);
    /* compare names and arguments only (ids are the server's) */
    json_t *want = want_calls ? json_loads(want_calls, 0, NULL) : NULL;
    bool ok = cl == want_cl && json_array_size(got) == json_array_size(want) && (!want) == (!got);
    for (size_t i = 0; ok && i < json_array_size(want); i++) {
        const json_t *fn = json_object_get(json_array_get(got, i), "function");
        const json_t *w = json_array_get(want, i);
        json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        ok = json_equal(json_object_get(fn, "name"), json_object_get(w, "name")) &&
             json_equal(a, json_object_get(w, "arguments"));
        json_decref(a);
    }
    if (!ok) {
        char *d = got ? json_dumps(got, JSON_COMPACT) : NULL;
        fprintf(stderr, "  %s: %s\n    -> content %zu (want %zu), calls %s\n", file, text, cl, want_cl, d ? d : "none");
        free(d);
    }
    CHECK(ok);
    size_t prev = 0, n = strlen(text);
    for (size_t k = 0; k <= n; k++) {
        size_t h = kp_toolsyn_holdback(s, text, k);
        CHECK(h >= prev && h <= cl);
        prev = h;
    }
    json_decref(want);
    json_decref(got);
    json_decref(tools);
    kp_chat_tmpl_free(t);
}

static void test_model_outputs(void) {
    const char *paris = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]";
    /* Hermes / Qwen: content, then a block; the closing tag cut off by the end of turn */
    expect("Qwen-Qwen3-0.6B.jinja",
           "I'll check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           11, paris);
    expect("Qwen-Qwen2.5-7B-Instruct.jinja",
           "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}", 0, paris);
    expect("Qwen-Qwen2.5-7B-Instruct.jinja", "No tools needed: <tool_call> is a tag.", WHOLE, NULL);
    /* Qwen3-Coder / Qwen3.5: parameters, a value typed by the schema */
    expect("Qwen3-Coder.jinja",
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n3\n"
           "</parameter>\n</function>\n</tool_call>",
           0, "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"São Paulo\",\"days\":3}}]");
    expect("Qwen3.5-4B.jinja",
           "Sure.\n<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
           "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
           5, "[{\"name\":\"ping\",\"arguments\":{}},{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]");
    /* Llama 3.x: the whole message is the call */
    expect("meta-llama-Llama-3.1-8B-Instruct.jinja",
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 0, paris);
    expect("meta-llama-Llama-3.1-8B-Instruct.jinja", "The weather is {\"good\"}.", WHOLE, NULL);
    /* Mistral: name then [ARGS], and the older JSON list with ids */
    expect("unsloth-mistral-Devstral-Small-2507.jinja", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", 0,
           paris);
    expect("mistralai-Mistral-Nemo-Instruct-2407.jinja",
           "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}]", 0,
           paris);
    expect("Mistral-Small-3.2-24B-Instruct-2506.jinja",
           "[TOOL_CALLS]get_weather[CALL_ID]Q2w3E4r5T[ARGS]{\"city\":\"Paris\"}", 0, paris);
    /* DeepSeek V3.1 */
    expect("deepseek-ai-DeepSeek-V3.1.jinja",
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"
           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
           0, paris);
    /* GLM 4.6: key/value pairs */
    expect("GLM-4.6.jinja",
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", 0, paris);
    /* Kimi K2: functions.NAME:INDEX */
    expect("moonshotai-Kimi-K2.jinja",
           "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
           "{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}"
           "<|tool_call_end|><|tool_calls_section_end|>",
           0, "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}},{\"name\":\"ping\",\"arguments\":{}}]");
    /* MiniMax M2: invoke / parameter name attributes */
    expect("MiniMax-M2.jinja",
           "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
           "</invoke>\n</minimax:tool_call>",
           0, paris);
    /* DeepSeek V3.2 DSML: markup that names the value's type */
    expect("deepseek-ai-DeepSeek-V3.2.jinja",
           "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
           "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3"
           "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
           0, "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}]");
    /* a malformed section is content, whole */
    expect("Qwen-Qwen3-0.6B.jinja", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
           WHOLE, NULL);
}

static void test_named(void) {
    static const char *const must[] = {
        "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja", "unsloth-mistral-Devstral-Small-2507.jinja",
        "mistralai-Ministral-3-14B-Reasoning-2512.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-ai-DeepSeek-V4.jinja", "Kimi-K3.jinja", "GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "moonshotai-Kimi-K2.jinja",
        "MiniMax-M2.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "ibm-granite-granite-4.0.jinja",
        "meetkai-functionary-medium-v3.1.jinja", "unsloth-Apriel-1.5.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "openai-gpt-oss-120b.jinja"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
        kp_chat_tmpl *t = NULL;
        syn_of(&t, must[i]);
        kp_chat_tmpl_free(t);
    }
    /* templates without a tool syntax have none */
    kp_chat_tmpl *t = load("tests/data/chat/templates/google-gemma-3-it.jinja");
    CHECK(t && !kp_chat_tmpl_calls(t, NULL));
    kp_chat_tmpl_free(t);
}

int main(void) {
    RUN(test_named);
    RUN(test_model_outputs);
    RUN(test_all_templates);
    return harness_finish("toolsyn");
}
