/*
 * bench_jinja.c - the Jinja interpreter's speed on a long agent
 * conversation: one table of goal, measured value and PASS/FAIL.
 *
 * The conversation: 200 messages, a system prompt then turns cycling
 * user -> assistant with one tool call -> tool result -> assistant answer,
 * with 30 tools (each a function with a description and four typed
 * parameters), about 80,000 characters of content (~20,000 tokens at ~4
 * characters a token), deterministic text. It is rendered by the Qwen3 template
 * (Qwen-Qwen3-0.6B.jinja) and the Llama 3.1/3.3 template
 * (meta-llama-Llama-3.3-70B-Instruct.jinja) of tests/data/chat/templates/,
 * compiled once each. Measured: the median wall time of 51 renders (after
 * 5 warm-up renders), goal < 2 ms; the bytes a compiled template uses
 * (kp_jinja_size); the prompt's length. Each template is measured twice:
 * kp_jinja_render, and kp_jinja_render_client with messages and tools as
 * client text (what a server does: the ranges of client bytes too), same
 * goal. Run from the repository root.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "jinja/jinja.h"

#define N_MESSAGES 200
#define N_TOOLS 30
#define N_RENDERS 51

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Deterministic filler text of about n characters. */
static json_t *text(unsigned seed, size_t n) {
    static const char *const words[] = {"the", "agent", "reads", "file", "config", "value", "returns", "error",
                                        "patch", "applies", "test", "passes", "build", "module", "function", "line"};
    kp_buf b = {0};
    while (b.len < n) {
        seed = seed * 1103515245u + 12345u;
        kp_buf_puts(&b, words[(seed >> 16) % 16]);
        kp_buf_putc(&b, (seed >> 8) % 11 == 0 ? '\n' : ' ');
    }
    json_t *s = json_stringn(b.data, b.len);
    kp_buf_free(&b);
    return s;
}

static json_t *make_tools(void) {
    json_t *tools = json_array();
    for (int i = 0; i < N_TOOLS; i++) {
        char name[32];
        snprintf(name, sizeof name, "tool_%02d", i);
        json_t *props = json_object();
        static const char *const types[] = {"string", "integer", "boolean", "string"};
        for (int p = 0; p < 4; p++) {
            char pn[16];
            snprintf(pn, sizeof pn, "arg%d", p);
            json_object_set_new(props, pn, json_pack("{s:s,s:o}", "type", types[p], "description", text((unsigned)(i * 7 + p), 40)));
        }
        json_t *params = json_pack("{s:s,s:o,s:[s]}", "type", "object", "properties", props, "required", "arg0");
        json_array_append_new(tools, json_pack("{s:s,s:{s:s,s:o,s:o}}", "type", "function", "function", "name", name,
                                               "description", text((unsigned)i, 120), "parameters", params));
    }
    return tools;
}

static json_t *make_context(void) {
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "system", "content", text(1, 2000)));
    int i;
    for (i = 0; json_array_size(msgs) + 4 < N_MESSAGES; i++) {
        char name[32], id[32];
        snprintf(name, sizeof name, "tool_%02d", i % N_TOOLS);
        snprintf(id, sizeof id, "call%d", i);
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user", "content", text((unsigned)(100 + i), 200)));
        json_t *args = json_pack("{s:o,s:i,s:b}", "arg0", text((unsigned)i, 30), "arg1", i, "arg2", i & 1);
        json_array_append_new(msgs, json_pack("{s:s,s:s,s:[{s:s,s:s,s:{s:s,s:o}}]}", "role", "assistant", "content", "",
                                              "tool_calls", "id", id, "type", "function", "function", "name", name,
                                              "arguments", args));
        json_array_append_new(msgs, json_pack("{s:s,s:s,s:o}", "role", "tool", "tool_call_id", id, "content",
                                              text((unsigned)(200 + i), 1300)));
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "assistant", "content", text((unsigned)(300 + i), 150)));
    }
    while (json_array_size(msgs) + 1 < N_MESSAGES) { /* user and assistant turns up to N_MESSAGES - 1 */
        const char *role = json_array_size(msgs) % 2 ? "user" : "assistant";
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", role, "content", text((unsigned)(400 + i++), 200)));
    }
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "Continue."));
    return json_pack("{s:o,s:o,s:b,s:s,s:s}", "messages", msgs, "tools", make_tools(), "add_generation_prompt", 1,
                     "bos_token", "<|begin_of_text|>", "eos_token", "<|eot_id|>");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(const char *path, const json_t *ctx, bool client) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "bench_jinja: cannot open %s (run from the repository root)\n", path); return 1; }
    char src[1 << 16];
    size_t n = fread(src, 1, sizeof src, f);
    fclose(f);
    kp_jinja *t;
    kp_jinja_error e;
    if (kp_jinja_compile(src, n, &t, &e) != KP_OK) { fprintf(stderr, "%s: %s\n", path, e.msg); return 1; }
    double times[N_RENDERS];
    size_t out_len = 0;
    for (int i = -5; i < N_RENDERS; i++) {
        static const char *const names[] = {"messages", "tools", NULL};
        kp_buf out = {0};
        kp_jinja_range *ranges = NULL;
        size_t n_ranges = 0;
        double t0 = now_ms();
        kp_status st = client ? kp_jinja_render_client(t, ctx, names, &out, &ranges, &n_ranges, &e)
                              : kp_jinja_render(t, ctx, &out, &e);
        double dt = now_ms() - t0;
        free(ranges);
        if (st != KP_OK) { fprintf(stderr, "%s: %s\n", path, e.msg); kp_jinja_free(t); return 1; }
        if (i >= 0) times[i] = dt;
        out_len = out.len;
        kp_buf_free(&out);
    }
    qsort(times, N_RENDERS, sizeof *times, cmp_double);
    double med = times[N_RENDERS / 2];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char name[96];
    snprintf(name, sizeof name, "%s%s", base, client ? " +client" : "");
    printf("%-50s %9.3f ms  %s (goal < 2 ms)   min %.3f ms, prompt %zu bytes, template %zu bytes compiled\n", name, med,
           med < 2.0 ? "PASS" : "FAIL", times[0], out_len, kp_jinja_size(t));
    kp_jinja_free(t);
    return 0;
}

int main(void) {
    json_t *ctx = make_context();
    size_t chars = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(ctx, "messages"), i, m) chars += json_string_length(json_object_get(m, "content"));
    printf("conversation: %zu messages, %d tools, %zu characters of content (~%zu tokens)\n",
           json_array_size(json_object_get(ctx, "messages")), N_TOOLS, chars, chars / 4);
    printf("%-50s %12s\n", "template", "median render");
    int rc = 0;
    for (int client = 0; client < 2; client++) {
        rc |= bench("tests/data/chat/templates/Qwen-Qwen3-0.6B.jinja", ctx, client);
        rc |= bench("tests/data/chat/templates/meta-llama-Llama-3.3-70B-Instruct.jinja", ctx, client);
    }
    json_decref(ctx);
    return rc;
}
