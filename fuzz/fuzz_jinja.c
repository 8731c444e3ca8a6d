/*
 * fuzz_jinja.c - libFuzzer target for the Jinja interpreter (src/jinja/):
 * a template, compiled and rendered on a context.
 *
 * Input layout:  the template text, then optionally a NUL and a JSON
 *                object, the context (a fixed small conversation when it
 *                is absent or not an object). The seeds are the real chat
 *                templates of tests/data/chat/templates/ with a
 *                conversation each (fuzz/make_seeds.py --jinja).
 *
 * Properties beyond "no sanitizer report": a template that does not
 * compile gets a syntax error (or out of memory) with a message and a
 * 1-based line; a render either succeeds or fails with a kind and a
 * message, leaving the output as it was; the output is at most
 * KP_JINJA_MAX_OUTPUT bytes; a second render of the compiled template,
 * with messages and tools as client text (kp_jinja_render_client), gives
 * the same bytes or the same error (SOURCE_DATE_EPOCH is fixed, so
 * strftime_now is too; only a limit may differ, taint takes memory), and
 * its client ranges are sorted, disjoint, not adjacent and inside the
 * output.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

static const char DEFAULT_CTX[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"hi\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\",\"function\":"
    "{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"content\":\"r\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setenv("SOURCE_DATE_EPOCH", "1733356800", 1);
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    json_t *ctx = NULL;
    if (nul) ctx = json_loadb((const char *)nul + 1, size - tlen - 1, 0, NULL);
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        ctx = json_loads(DEFAULT_CTX, 0, NULL);
    }
    kp_jinja *t = NULL;
    kp_jinja_error e;
    if (kp_jinja_compile(text, tlen, &t, &e) != KP_OK) {
        REQUIRE(t == NULL && e.msg[0]);
        REQUIRE(e.kind == KP_JINJA_ESYNTAX || e.kind == KP_JINJA_ENOMEM);
        REQUIRE(e.kind != KP_JINJA_ESYNTAX || e.line >= 1);
        json_decref(ctx);
        return 0;
    }
    kp_buf out = {0}, again = {0};
    kp_buf_puts(&out, "x");
    kp_buf_puts(&again, "x");
    kp_jinja_error e2;
    kp_status st = kp_jinja_render(t, ctx, &out, &e);
    static const char *const client[] = {"messages", "tools", NULL};
    kp_jinja_range *r = NULL;
    size_t nr = 0;
    kp_status st2 = kp_jinja_render_client(t, ctx, client, &again, &r, &nr, &e2);
    if (st != st2) { /* only a limit (memory) may tell the two apart */
        REQUIRE(e.kind == KP_JINJA_ELIMIT || e2.kind == KP_JINJA_ELIMIT || e.kind == KP_JINJA_ENOMEM ||
                e2.kind == KP_JINJA_ENOMEM);
    } else if (st == KP_OK) {
        REQUIRE(out.len <= (size_t)KP_JINJA_MAX_OUTPUT + 1);
        REQUIRE(out.len == again.len && memcmp(out.data, again.data, out.len) == 0);
        for (size_t i = 0; i < nr; i++) {
            REQUIRE(r[i].len > 0 && r[i].start >= 1 && r[i].start + r[i].len <= again.len);
            REQUIRE(i == 0 || r[i].start > r[i - 1].start + r[i - 1].len);
        }
    } else {
        REQUIRE(e.kind != KP_JINJA_OK && e.msg[0]);
        REQUIRE(out.len == 1 && again.len == 1);
        REQUIRE(e.kind == e2.kind && strcmp(e.msg, e2.msg) == 0);
    }
    free(r);
    kp_buf_free(&out);
    kp_buf_free(&again);
    kp_jinja_free(t);
    json_decref(ctx);
    return 0;
}
