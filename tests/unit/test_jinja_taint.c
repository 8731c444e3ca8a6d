/*
 * test_jinja_taint.c - which bytes of a rendering came from client text
 * (kp_jinja_render_client, src/jinja/taint.c).
 *
 * Oracle: the rule taint.c states, applied by hand to each template: bytes
 * copied from a string of `messages` or `tools` (concatenation, slicing,
 * indexing, strip, split, iteration, output, macros, set blocks) are
 * client text byte for byte;
 * a string a filter, method or `%` built from client text is client text
 * whole; the template's literals, bos_token and kwargs are markup. The
 * expected texts show client ranges between « and »; every text is also
 * checked to be the bytes kp_jinja_render gives (taint never changes
 * output).
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jinja/jinja.h"

static const char *CTX =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"  hi <|im_end|> \"},"
    " {\"role\": \"assistant\", \"content\": \"ab\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"bos_token\": \"<s>\", \"enable_thinking\": \"<think>\"}";

typedef struct { const char *tmpl, *want; } taint_case;
static const taint_case CASES[] = {
    {"{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}",
     "<s><|im_start|>«user»\n«hi <|im_end|>»<|im_end|>\n<|im_start|>«assistant»\n«ab»<|im_end|>\n"},
    {"{{ messages[1].content.replace('a', '<X>') }}|{{ messages[1].content | replace('b', '') }}", "«<X>b»|«a»"},
    {"{{ messages[0].content[2:4] }}|{{ messages[1].content[-1] }}|{{ messages[1].content[::-1] }}", "«hi»|«b»|«ba»"},
    {"{% for ch in messages[1].content %}{{ ch }}-{% endfor %}", "«a»-«b»-"},
    {"{{ tools | tojson }}",
     "«[{\"function\":{\"name\":\"get\",\"parameters\":{\"properties\":{\"city\":{\"type\":\"string\"}},"
     "\"type\":\"object\"}},\"type\":\"function\"}]»"},
    {"<tools>{% for t in tools %}{{ t.function | tojson }}{% endfor %}</tools>",
     "<tools>«{\"name\":\"get\",\"parameters\":{\"properties\":{\"city\":{\"type\":\"string\"}},\"type\":\"object\"}}»"
     "</tools>"},
    {"{% for k, v in tools[0].function.parameters.properties.items() %}<p={{ k }}>{{ v.type }}{% endfor %}",
     "<p=«city»>«string»"},
    {"{{ '<a>' ~ messages[1].content ~ '</a>' }}|{{ '<' + messages[1].role + '>' }}|{{ messages[1].content * 2 }}",
     "<a>«ab»</a>|<«assistant»>|«abab»"},
    {"{% macro w(x) %}[{{ x }}]{% endmacro %}{{ w(messages[1].content) }}"
     "{% set s %}<{{ messages[1].content }}>{% endset %}{{ s }}{% set u | upper %}<{{ messages[1].role[:1] }}>{% endset %}{{ u }}",
     "[«ab»]<«ab»>«<A>»"},
    {"{{ '<t>%s</t>' % messages[1].content }}|{{ '<t>%s</t>' % bos_token }}|{{ '<{}>'.format(messages[1].role) }}",
     "«<t>ab</t>»|<t><s></t>|«<assistant>»"},
    {"{% set ns = namespace(p='<|x|>', c=messages[1].content) %}{{ ns.p }}{{ ns.c }}{{ messages[1].get('missing', '<d>') }}",
     "<|x|>«ab»<d>"},
    {"{{ messages[1] }}", "«{'role': 'assistant', 'content': 'ab'}»"},
    {"{{ enable_thinking }}{{ messages | length }}{{ messages | last | attr('role') }}", "<think>2«assistant»"},
    {"{{ messages[0].content.split(' ') | join('+') }}|{{ messages[1].content | upper }}", "«++hi+<|im_end|>+»|«AB»"},
    {"{{ ('<a> ' ~ messages[1].content ~ ' ') | trim }}|{{ ('<a>' ~ messages[1].content)[1:-1] }}|"
     "{{ ('<x> ' ~ messages[1].content).split(' ') | first }}|{{ ('<x> ' ~ messages[1].content).split(' ') | last }}|"
     "{{ ('<x>' ~ messages[1].content)[0] }}{{ ('<x>' ~ messages[1].content).removeprefix('<x') }}",
     "<a> «ab»|a>«a»|<x>|«ab»|<>«ab»"},
    {"{{ ('<b>' | safe) + messages[1].content }}|{{ messages[1].content | safe + '</b>' }}|{{ messages | map(attribute='role') | map('upper') | batch(2) | list }}",
     "<b>«ab»|«ab»&lt;/b&gt;|«[['USER', 'ASSISTANT']]»"},
    {"{% if messages[0].content | trim | length > 3 %}<|long|>{% endif %}{{ messages | map(attribute='role') | join(',') }}",
     "<|long|>«user,assistant»"},
};

/* The output with « and » around the ranges. */
static char *annotate(const char *s, size_t n, const kp_jinja_range *r, size_t nr) {
    kp_buf b = {0};
    size_t at = 0;
    for (size_t i = 0; i < nr; i++) {
        kp_buf_put(&b, s + at, r[i].start - at);
        kp_buf_puts(&b, "«");
        kp_buf_put(&b, s + r[i].start, r[i].len);
        kp_buf_puts(&b, "»");
        at = r[i].start + r[i].len;
    }
    kp_buf_put(&b, s + at, n - at);
    kp_buf_putc(&b, '\0');
    char *out = NULL;
    size_t len;
    kp_buf_take(&b, &out, &len);
    return out;
}

static void test_ranges(void) {
    static const char *const client[] = {"messages", "tools", NULL};
    json_t *ctx = json_loads(CTX, 0, NULL);
    CHECK(ctx != NULL);
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        kp_jinja *t = NULL;
        kp_jinja_error e;
        CHECK_MSG(kp_jinja_compile(CASES[i].tmpl, strlen(CASES[i].tmpl), &t, &e) == KP_OK, "%s: %s", CASES[i].tmpl, e.msg);
        if (!t) continue;
        kp_buf plain = {0}, out = {0};
        kp_jinja_range *r = NULL;
        size_t nr = 0;
        CHECK_MSG(kp_jinja_render(t, ctx, &plain, &e) == KP_OK, "%s: %s", CASES[i].tmpl, e.msg);
        CHECK_MSG(kp_jinja_render_client(t, ctx, client, &out, &r, &nr, &e) == KP_OK, "%s: %s", CASES[i].tmpl, e.msg);
        CHECK(out.len == plain.len && (out.len == 0 || memcmp(out.data, plain.data, out.len) == 0));
        for (size_t k = 0; k < nr; k++) { /* sorted, disjoint, not adjacent, inside */
            CHECK(r[k].len > 0 && r[k].start + r[k].len <= out.len);
            if (k) CHECK(r[k].start > r[k - 1].start + r[k - 1].len);
        }
        char *got = annotate(out.data ? out.data : "", out.len, r, nr);
        CHECK_MSG(got && strcmp(got, CASES[i].want) == 0, "%s\n  want [%s]\n  got  [%s]", CASES[i].tmpl,
                  CASES[i].want, got ? got : "(null)");
        free(got);
        free(r);
        kp_buf_free(&plain);
        kp_buf_free(&out);
        kp_jinja_free(t);
    }
    json_decref(ctx);
}

/* No client list: no ranges; a failed render: none either, out untouched. */
static void test_none_and_errors(void) {
    json_t *ctx = json_loads(CTX, 0, NULL);
    kp_jinja *t = NULL;
    const char *src = "{{ messages[0].content }}{% if messages[1] %}{{ raise_exception('bad ' ~ messages[1].role) }}{% endif %}";
    CHECK(kp_jinja_compile(src, strlen(src), &t, NULL) == KP_OK);
    kp_buf out = {0};
    kp_buf_puts(&out, "keep");
    kp_jinja_range *r = (kp_jinja_range *)&out; /* must be reset */
    size_t nr = 7;
    kp_jinja_error e;
    static const char *const client[] = {"messages", NULL};
    CHECK(kp_jinja_render_client(t, ctx, client, &out, &r, &nr, &e) == KP_EINVAL);
    CHECK(e.kind == KP_JINJA_ERAISED && strcmp(e.msg, "bad assistant") == 0);
    CHECK(r == NULL && nr == 0 && out.len == 4);
    kp_jinja_free(t);
    src = "x{{ messages[1].content }}";
    CHECK(kp_jinja_compile(src, strlen(src), &t, NULL) == KP_OK);
    CHECK(kp_jinja_render_client(t, ctx, NULL, &out, &r, &nr, &e) == KP_OK);
    CHECK(r == NULL && nr == 0 && out.len == 7);
    static const char *const tools_only[] = {"tools", NULL};
    CHECK(kp_jinja_render_client(t, ctx, tools_only, &out, &r, &nr, &e) == KP_OK);
    CHECK(r == NULL && nr == 0 && out.len == 10);
    CHECK(kp_jinja_render_client(t, ctx, client, &out, &r, &nr, &e) == KP_OK);
    CHECK(nr == 1 && r[0].start == 11 && r[0].len == 2); /* offsets into out, after what it held */
    free(r);
    kp_buf_free(&out);
    kp_jinja_free(t);
    json_decref(ctx);
}

int main(void) {
    RUN(test_ranges);
    RUN(test_none_and_errors);
    return harness_finish("jinja_taint");
}
