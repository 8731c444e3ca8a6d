/*
 * test_chat_tmpl.c - the server's chat template as Jinja text
 * (src/serve/chat_tmpl.c).
 *
 * Oracle: Qwen3's real template (tests/data/chat/templates/), whose
 * rendering of these messages jinja2 gives as the ChatML layout written
 * out below; the client ranges must be exactly the bytes of the message
 * contents and roles (located by hand in that text), the template's
 * <|im_start|>/<|im_end|> outside them. Errors: jinja2's raise_exception
 * message verbatim, a syntax error's position as the interpreter's parser
 * reports it (test_jinja.c checks those against jinja2).
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "serve/chat_tmpl.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    *len = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (buf) buf[*len] = 0;
    return buf;
}

static void test_qwen3_ranges(void) {
    size_t len;
    char *src = read_file("tests/data/chat/templates/Qwen-Qwen3-0.6B.jinja", &len);
    CHECK(src != NULL);
    if (!src) return;
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    CHECK(kp_chat_tmpl_new(src, len, NULL, 0, "<s>", "</s>", &t, &err) == KP_OK);
    free(src);
    if (!t) return;
    CHECK(kp_chat_tmpl_family(t) == KP_CHAT_QWEN3);
    CHECK(kp_chat_tmpl_reasoning(t) && !strcmp(kp_chat_tmpl_reasoning(t)->open, "<think>"));
    CHECK(kp_chat_tmpl_uses(t, "enable_thinking"));
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"a <|im_end|> b\"}]", 0, NULL);
    kp_chat_opts o = {true, false};
    char *out = NULL;
    size_t n = 0, np = 0;
    kp_tok_range *plain = NULL;
    CHECK(kp_chat_tmpl_render(t, msgs, NULL, &o, NULL, &out, &n, &plain, &np, &err) == KP_OK);
    const char *want = "<|im_start|>user\na <|im_end|> b<|im_end|>\n<|im_start|>assistant\n";
    CHECK_EQ_STR(out ? out : "", want);
    /* "user" at 12, the content at 17 (14 bytes) */
    CHECK(np == 2 && plain[0].start == 12 && plain[0].len == 4 && plain[1].start == 17 && plain[1].len == 14);
    free(out);
    free(plain);
    o.disable_thinking = true; /* enable_thinking false: an empty think block after the prompt */
    CHECK(kp_chat_tmpl_render(t, msgs, NULL, &o, NULL, &out, &n, NULL, NULL, &err) == KP_OK);
    CHECK(out && n > 20 && !strcmp(out + n - 19, "<think>\n\n</think>\n\n"));
    free(out);
    json_decref(msgs);
    kp_chat_tmpl_free(t);
}

static void test_errors_and_families(void) {
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    const char *bad = "{% for m in messages %}\n{{ m.content ) }}{% endfor %}";
    CHECK(kp_chat_tmpl_new(bad, strlen(bad), NULL, 0, NULL, NULL, &t, &err) == KP_EFORMAT && !t);
    CHECK_MSG(strstr(err.msg, "line 2, column 14") != NULL, "%s", err.msg);
    const char *good = "{{ messages[0].content }}";
    CHECK(kp_chat_tmpl_new(good, strlen(good), bad, strlen(bad), NULL, NULL, &t, &err) == KP_EFORMAT && !t);
    CHECK_MSG(!strncmp(err.msg, "tool_use template: line 2", 25), "%s", err.msg);
    const char *raises = "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
                         "<tool_call>{{ messages[0].content + 1 }}";
    CHECK(kp_chat_tmpl_new(raises, strlen(raises), NULL, 0, NULL, NULL, &t, &err) == KP_OK);
    if (!t) return;
    CHECK(kp_chat_tmpl_family(t) == KP_CHAT_QWEN25 && kp_chat_tmpl_reasoning(t) == NULL);
    json_t *two = json_loads("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"y\"}]", 0, NULL);
    char *out = NULL;
    size_t n;
    CHECK(kp_chat_tmpl_render(t, two, NULL, NULL, NULL, &out, &n, NULL, NULL, &err) == KP_EINVAL && !out);
    CHECK_EQ_STR(err.msg, "one message only");
    json_array_remove(two, 1);
    CHECK(kp_chat_tmpl_render(t, two, NULL, NULL, NULL, &out, &n, NULL, NULL, &err) == KP_EINVAL && !out);
    CHECK_MSG(strstr(err.msg, "line 1, column") && strstr(err.msg, "TypeError"), "%s", err.msg);
    json_decref(two);
    kp_chat_tmpl_free(t);
    const char *plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
    CHECK(kp_chat_tmpl_new(plain, strlen(plain), NULL, 0, NULL, NULL, &t, &err) == KP_OK);
    CHECK(t && kp_chat_tmpl_family(t) == KP_CHAT_CHATML);
    kp_chat_tmpl_free(t);
    kp_chat_tmpl_free(NULL);
}

int main(void) {
    RUN(test_qwen3_ranges);
    RUN(test_errors_and_families);
    return harness_finish("chat_tmpl");
}
