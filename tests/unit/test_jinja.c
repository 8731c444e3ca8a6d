/*
 * test_jinja.c - the Jinja interpreter (src/jinja/) against jinja2.
 *
 * Oracle: Python's jinja2 3.1 in transformers' configuration
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
 * raise_exception, strftime_now, the generation tag, tojson writing RFC
 * 8785 canonical JSON: tools/chat_jinja_check.py's make_env). Every
 * expected text and error message below is what jinja2 rendered or raised
 * for that template on CTX, with SOURCE_DATE_EPOCH=1733356800; jinja2
 * gives only the line of a syntax error, the columns are the position of
 * the offending token. The limits are kvpin's own (jinja.h).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jinja/jinja.h"

static const char *CTX = "{\"msgs\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}], \"d\": {\"b\": 2, \"a\": 1, \"C\": 3}, \"s\": \"  Hello World  \", \"n\": 7, \"f\": 2.5, \"none\": null, \"l\": [3, 1, 2], \"u\": \"h\\u00e9llo w\\u00f6rld\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"x\", \"parameters\": {\"b\": 1, \"a\": [1, 2.5]}}}]}";

typedef struct { const char *tmpl, *want; } render_case;
static const render_case RENDERS[] = {
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc"},
    {"a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
    {"a\n{%+ if true %}b{% endif +%}\nc", "a\nb\nc"},
    {"x {{- ' y ' -}} z", "x y z"},
    {"{# comment #}\n{#- c -#}  a", "a"},
    {"{% raw %}{{ not }} {% evaluated %}{% endraw %}", "{{ not }} {% evaluated %}"},
    {"line\r\nnext\r\n", "line\nnext"},
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ 10 / 4 }} {{ 1 / 3 }}", "7 9 3 -4 1 2 64 2.5 0.3333333333333333"},
    {"{{ 1.0 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 100.0 * 3 }} {{ 3 - 1.5 }} {{ -0.0 }}", "1.0 1e+16 1.5e-05 0.30000000000000004 300.0 1.5 -0.0"},
    {"{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }}", "a1NoneTrue ababab [1, 2]"},
    {"{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' in 'cat' }} {{ 3 not in l }} {{ 'a' in d }} {{ 1 == 1.0 }} {{ true == 1 }}", "True False True False True True True"},
    {"{{ not none and 0 or 'x' }} {{ none or [] }} {{ 'y' if n > 5 else 'z' }} {{ 'q' if false }}|", "x [] y |"},
    {"{{ 'it\\'s' }} {{ \"tab\\there\" }} {{ '\\u00e9\\x41' }} {{ 'a' 'b' }}", "it's tab\there éA ab"},
    {"{{ [1, 'a', none, true, 1.5, (1,), (1, 2), {'k': \"it's\"}] }}", "[1, 'a', None, True, 1.5, (1,), (1, 2), {'k': \"it's\"}]"},
    {"{{ d.a }} {{ d['b'] }} {{ d.missing is defined }} {{ msgs[0].role }} {{ msgs[-1]['content'] }} {{ l[5] is defined }}", "1 2 False user yo False"},
    {"{{ s[2:7] }}|{{ l[::-1] }}|{{ u[1:4] }}|{{ 'abcdef'[::2] }}|{{ l[-2:] }}", "Hello|[2, 1, 3]|éll|ace|[1, 2]"},
    {"{% for m in msgs %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %} {% endfor %}", "1/2:userF 2/2:assistantL "},
    {"{% for x in l if x > 1 %}{{ loop.index0 }}{{ x }}{{ loop.revindex }},{% else %}none{% endfor %}", "032,121,"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}", "empty"},
    {"{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", "3"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "b=2;a=1;C=3;"},
    {"{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }} {% endfor %}", "-1|a 3-2|b 1-|a "},
    {"{% set x = 1 %}{% for i in l %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", "4231"},
    {"{% set ns = namespace(total=0) %}{% for i in l %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}", "6"},
    {"{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t %}block {{ n }}{% endset %}[{{ t }}]{% set u2 | upper %}up{% endset %}{{ u2 }}", "12[block 7]UP"},
    {"{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }}", "Hello, Bob! Hi, Al!"},
    {"{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner {{ n }}{% endcall %}", "<inner 7>"},
    {"{% filter upper %}shout {{ s | trim }}{% endfilter %}", "SHOUT HELLO WORLD"},
    {"{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}", "mid"},
    {"{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ true is boolean }} {{ none is none }} {{ d is mapping }} {{ l is sequence }} {{ s is string }} {{ x is undefined }} {{ l is iterable }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ n is eq 7 }} {{ n is ne 7 }} {{ n is gt 3 }} {{ n is lt 3 }} {{ n is ge 7 }} {{ n is le 6 }} {{ 2 is in l }} {{ none is sameas none }} {{ true is true }} {{ false is false }} {{ raise_exception is callable }}", "True False True True True True True True True True True True True True True True False True False True False True True True True True"},
    {"{{ s | trim }}|{{ s | length }}|{{ l | length }}|{{ d | length }}|{{ u | length }}|{{ l | count }}", "Hello World|15|3|3|11|3"},
    {"{{ l | sort }} {{ l | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ msgs | sort(attribute='role') | map(attribute='role') | list }}", "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['assistant', 'user']"},
    {"{{ d | dictsort }} {{ d | items | list }} {{ l | join(',') }} {{ msgs | map(attribute='content') | join(' ') }}", "[('a', 1), ('b', 2), ('C', 3)] [('b', 2), ('a', 1), ('C', 3)] 3,1,2 hi yo"},
    {"{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | first }} {{ l | select('odd') | list }} {{ l | reject('odd') | list }}", "1 yo [3, 1] [2]"},
    {"{{ x | default('dflt') }} {{ '' | default('e', true) }} {{ '' | d('e') }}|{{ none | default('z') }}", "dflt e |None"},
    {"{{ s | upper }} {{ s | lower }} {{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ s | replace('l', 'L') }} {{ s | replace('l', '', 1) }}", "  HELLO WORLD     hello world   Hello World Hello   HeLLo WorLd     Helo World  "},
    {"{{ l | first }} {{ l | last }} {{ l | min }} {{ l | max }} {{ l | sum }} {{ [1, 2, 1, 3] | unique | list }} {{ l | reverse | list }} {{ 'abc' | reverse }}", "3 2 1 3 6 [1, 2, 3] [2, 1, 3] cba"},
    {"{{ '42' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3 | string }}x", "42 0 3 2.5 3 2.57 2.0 3x"},
    {"{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(4, first=true) }}|{{ 'x\n\ny' | indent(2, blank=true) }}", "a\n  b\n\n  c|    a\n    b|x\n  \n  y"},
    {"{{ l | batch(2) | list }} {{ 'one two  three' | wordcount }} {{ '<a href=\"x\">' | e }} {{ '%s-%d' | format('a', 3) }} {{ '%05.1f|%-4s|%x' % (3.14159, 'ab', 255) }}", "[[3, 1], [2]] 3 &lt;a href=&#34;x&#34;&gt; a-3 003.1|ab  |ff"},
    {"{{ tools | tojson }} {{ 'é\"\\n' | tojson }} {{ d | tojson(indent=2) }} {{ 1.0 | tojson }}", "[{\"function\":{\"name\":\"x\",\"parameters\":{\"a\":[1,2.5],\"b\":1}},\"type\":\"function\"}] \"é\\\"\\n\" {\"C\":3,\"a\":1,\"b\":2} 1"},
    {"{{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d.keys() | list }} {{ d.values() | list }}", "1 no ['b', 'a', 'C'] [2, 1, 3]"},
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}", "Hello World|Hello World  |  Hello World|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a.b', 'c']"},
    {"{{ s.startswith('  He') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }} {{ 'a-b'.replace('-', '+') }} {{ 'X'.lower() }} {{ 'x'.upper() }}", "True True 2 3 2 True False a+b x X"},
    {"{{ '{} and {}'.format('a', 1) }} {{ '{0}{0}'.format('z') }} {{ '{name}!'.format(name='N') }} {{ '{:>5}|{:<3}|{:.2f}'.format('r', 'l', 3.14159) }}", "a and 1 zz N!     r|l  |3.14"},
    {"{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", "[0, 1, 2] [1, 4, 7] {'a': 1, 'b': 'x'} 1"},
    {"{{ strftime_now('%Y-%m-%d %d %b %Y') }}", "2024-12-05 05 Dec 2024"},
    {"{% generation %}gen {{ n }}{% endgeneration %}", "gen 7"},
    {"{{ msgs[0].content | safe + '<b>' }} {{ '<i>' + 'x' | safe }} {{ '<b>' ~ ('y' | safe) }}", "hi&lt;b&gt; &lt;i&gt;x <b>y"},
    {"{{ 1 // 0.1 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ 2.5 is odd }} {{ -3 is odd }} {{ 3.0 is odd }}", "9.0 -4.0 -0.5 False True True"},
    {"{{ 'hello-world (x) o\\'neil' | title }} {{ 'hello-world (x) o\\'neil'.title() }}", "Hello-World (X) O'neil Hello-World (X) O'Neil"},
    {"{{ [x, 1] }} {{ x is sequence }} {{ x is callable }} {{ d is lower }} {{ 'ABC' is upper }}", "[Undefined, 1] True True False True"},
    {"{{ 'abc' % [1] }} {{ '%s' % 'x' }} {{ '%(a)s' % {'a': 5} }}", "abc x 5"},
    {"{% set t = l | selectattr('x', 'defined') %}{{ t | list }} {{ (l | map('string')) is sequence }} {{ l | map('string') | first }}", "[] False 3"},
    {"{{ none | selectattr('a') | list }} {{ '' | map('upper') | list }}", "[] []"},
    {"{% for k in d | dictsort(reverse=true) %}{{ k[0] }}{% endfor %} {{ d | dictsort(by='value') }}", "Cba [('a', 1), ('b', 2), ('C', 3)]"},
    {"{{ 'éàü ÿ ß straße Ωμέγα привет' | upper }}|{{ 'ÉÀÜ ΩΜΈΓΑ ПРИВЕТ' | lower }}|{{ 'élan vital-été (ça)' | title }}|{{ 'élan vital-été (ça) 1a'.title() }}|{{ 'über' | capitalize }}", "ÉÀÜ Ÿ SS STRASSE ΩΜΈΓΑ ПРИВЕТ|éàü ωμέγα привет|Élan Vital-Été (Ça)|Élan Vital-Été (Ça) 1A|Über"},
    {"{{ 'é' is lower }} {{ 'É' is upper }} {{ 'éA' is lower }} {{ '日本' is lower }} {{ 'é'.isalpha() }} {{ '日本'.isalpha() }} {{ 'ß'.upper() }} {{ 'ß' | title }}", "True True False False True True SS SS"},
    {"a 　{%- if true %}b{% endif -%}  c|x\n　 {% if true %}y{% endif %}\n z", "abc|x\ny z"},
    {"{{ '\"q\"' | safe + '<' }} {{ ('<' | e) + '>' }} {{ '<' | e | e }}", "\"q\"&lt; &lt;&gt; &lt;"},
};

typedef struct { const char *tmpl; kp_jinja_kind kind; const char *msg; } error_case;
static const error_case ERRORS[] = {
    {"{{ raise_exception('Only user and assistant roles are supported!') }}", KP_JINJA_ERAISED, "Only user and assistant roles are supported!"},
    {"{% for x in l %}{{ raise_exception('bad ' ~ x) }}{% endfor %}", KP_JINJA_ERAISED, "bad 3"},
    {"{{ l.append(4) }}", KP_JINJA_ESECURITY, "access to attribute 'append' of 'list' object is unsafe."},
    {"{% set _ = d.update({'z': 1}) %}", KP_JINJA_ESECURITY, "access to attribute 'update' of 'dict' object is unsafe."},
    {"{{ d.pop('a') }}", KP_JINJA_ESECURITY, "access to attribute 'pop' of 'dict' object is unsafe."},
    {"{{ x.y }}", KP_JINJA_EUNDEFINED, "'x' is undefined"},
    {"{{ 'a' + 1 }}", KP_JINJA_ETYPE, "can only concatenate str (not \"int\") to str"},
    {"{{ d.missing.deeper }}", KP_JINJA_EUNDEFINED, "'dict object' has no attribute 'missing'"},
    {"{{ 1 / 0 }}", KP_JINJA_EVALUE, "division by zero"},
    {"{{ none | length }}", KP_JINJA_ETYPE, "object of type 'NoneType' has no len()"},
    {"{{ range(1000000) | length }}", KP_JINJA_ELIMIT, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"{% set a, b = [1, 2, 3] %}", KP_JINJA_EVALUE, "too many values to unpack (expected 2)"},
    {"{{ l | map('upper') | tojson }}", KP_JINJA_ETYPE, NULL},
    {"{{ d[1:] }}", KP_JINJA_ETYPE, "unhashable type: 'slice'"},
    {"{{ n[1:] }}", KP_JINJA_ETYPE, "'int' object is not subscriptable"},
    {"{{ x | int }}", KP_JINJA_EUNDEFINED, "'x' is undefined"},
    {"{{ x | dictsort }}", KP_JINJA_EUNDEFINED, "'x' is undefined"},
    {"{{ 5 | indent }}", KP_JINJA_ETYPE, "unsupported operand type(s) for +=: 'int' and 'str'"},
    {"{{ 'abc' % 5 }}", KP_JINJA_ETYPE, "not all arguments converted during string formatting"},
    {"{{ [1] in d }}", KP_JINJA_ETYPE, "unhashable type: 'list'"},
};

/* Renders tmpl on the JSON text ctx; returns the output (malloc'd) or NULL with *e set. */
static char *render(const char *tmpl, const char *ctx, kp_jinja_error *e) {
    kp_jinja *t;
    if (kp_jinja_compile(tmpl, strlen(tmpl), &t, e) != KP_OK) return NULL;
    json_t *c = ctx ? json_loads(ctx, 0, NULL) : NULL;
    kp_buf out = {0};
    kp_status st = kp_jinja_render(t, c, &out, e);
    json_decref(c);
    kp_jinja_free(t);
    char *s = NULL;
    size_t n;
    if (st == KP_OK) kp_buf_take(&out, &s, &n);
    kp_buf_free(&out);
    return s;
}

static void test_renders(void) {
    setenv("SOURCE_DATE_EPOCH", "1733356800", 1);
    for (size_t i = 0; i < sizeof RENDERS / sizeof *RENDERS; i++) {
        kp_jinja_error e;
        char *got = render(RENDERS[i].tmpl, CTX, &e);
        CHECK_MSG(got && strcmp(got, RENDERS[i].want) == 0, "%s\n  want [%s]\n  got  [%s] %s", RENDERS[i].tmpl,
                  RENDERS[i].want, got ? got : "(error)", got ? "" : e.msg);
        free(got);
    }
}

static void test_errors(void) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof *ERRORS; i++) {
        kp_jinja_error e;
        char *got = render(ERRORS[i].tmpl, CTX, &e);
        CHECK_MSG(!got, "%s rendered [%s]", ERRORS[i].tmpl, got);
        if (!got) {
            CHECK_MSG(e.kind == ERRORS[i].kind, "%s: kind %s, want %s (%s)", ERRORS[i].tmpl, kp_jinja_kind_name(e.kind),
                      kp_jinja_kind_name(ERRORS[i].kind), e.msg);
            if (ERRORS[i].msg) CHECK_MSG(strcmp(e.msg, ERRORS[i].msg) == 0, "%s: [%s] want [%s]", ERRORS[i].tmpl, e.msg, ERRORS[i].msg);
            CHECK(e.line == 1 && e.col >= 1);
        }
        free(got);
    }
}

/* Syntax errors: jinja2's message and line; the column of the token. */
static void test_syntax_errors(void) {
    static const struct { const char *tmpl, *msg; int line, col; } cases[] = {
        {"{% if x %}\nabc", "Unexpected end of template. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'.", 2, 4},
        {"a\n\n{{ 1 + }}", "unexpected 'end of print statement'", 3, 8},
        {"{% for x in %}{% endfor %}", "Expected an expression, got 'end of statement block'", 1, 13},
        {"x\n{% foo %}", "Encountered unknown tag 'foo'.", 2, 4},
        {"ab\n{% endif %}", "Encountered unknown tag 'endif'.", 2, 4},
        {"{# never closed", "Missing end of comment tag", 1, 1},
        {"{{ x | nosuchfilter }}", "No filter named 'nosuchfilter'.", 1, 6},
        {"{{ x is nosuchtest }}", "No test named 'nosuchtest'.", 1, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kp_jinja *t = NULL;
        kp_jinja_error e;
        kp_status st = kp_jinja_compile(cases[i].tmpl, strlen(cases[i].tmpl), &t, &e);
        CHECK(st == KP_EFORMAT && t == NULL);
        CHECK(e.kind == KP_JINJA_ESYNTAX);
        CHECK_MSG(strcmp(e.msg, cases[i].msg) == 0, "[%s] want [%s]", e.msg, cases[i].msg);
        CHECK_MSG(e.line == cases[i].line && e.col == cases[i].col, "%s: %d:%d want %d:%d", cases[i].tmpl, e.line, e.col,
                  cases[i].line, cases[i].col);
    }
    /* an unknown filter inside an if waits for run time (jinja2 compiles it) */
    kp_jinja *t = NULL;
    kp_jinja_error e;
    const char *soft = "{% if x %}{{ y | nosuchfilter }}{% endif %}ok";
    CHECK(kp_jinja_compile(soft, strlen(soft), &t, &e) == KP_OK);
    kp_buf out = {0};
    CHECK(kp_jinja_render(t, NULL, &out, &e) == KP_OK && out.len == 2);
    kp_buf_free(&out);
    kp_jinja_free(t);
}

/* The limits: each fails fast with KP_JINJA_ELIMIT. */
static void test_limits(void) {
    static const char *const hostile[] = {
        "{{ 'x' * 1000000000 }}",
        "{{ [1] * 10000000000 }}",
        "{{ range(1000000000000) | length }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100) %}0123456789012345678901234567890123456789{% endfor %}{% endfor %}",
        "{{ 2 ** 100 }}",
    };
    for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) {
        kp_jinja_error e;
        char *got = render(hostile[i], NULL, &e);
        CHECK_MSG(!got && e.kind == KP_JINJA_ELIMIT && e.code == KP_ERANGE, "%s: %s", hostile[i], got ? "rendered" : e.msg);
        free(got);
    }
    /* 60 nested lists a level in a macro 90 levels deep: within the parser's
     * nesting, beyond the run-time one (KP_JINJA_MAX_RECURSION) */
    kp_buf rec = {0};
    kp_buf_puts(&rec, "{% macro f(n) %}{% if n < 90 %}{{ ");
    kp_buf_fill(&rec, '[', 60);
    kp_buf_puts(&rec, "f(n + 1)");
    kp_buf_fill(&rec, ']', 60);
    kp_buf_puts(&rec, " }}{% endif %}{% endmacro %}{{ f(0) }}");
    kp_jinja_error re;
    char *rgot = render(rec.data, NULL, &re);
    CHECK_MSG(!rgot && re.kind == KP_JINJA_ELIMIT && strstr(re.msg, "levels deep"), "%s", rgot ? "rendered" : re.msg);
    free(rgot);
    kp_buf_free(&rec);
    /* deep nesting is refused by the parser, not the C stack */
    size_t n = 100000;
    char *deep = malloc(2 * n + 8);
    memcpy(deep, "{{ ", 3);
    memset(deep + 3, '(', n);
    deep[3 + n] = '1';
    memset(deep + 4 + n, ')', n);
    memcpy(deep + 4 + 2 * n, " }}", 4);
    kp_jinja *t = NULL;
    kp_jinja_error e;
    CHECK(kp_jinja_compile(deep, strlen(deep), &t, &e) != KP_OK && t == NULL && e.kind == KP_JINJA_ESYNTAX);
    free(deep);
}

/* A failed render leaves the output as it was. */
static void test_output_untouched(void) {
    kp_jinja *t;
    kp_jinja_error e;
    const char *src = "partial {{ raise_exception('stop') }}";
    CHECK(kp_jinja_compile(src, strlen(src), &t, &e) == KP_OK);
    kp_buf out = {0};
    kp_buf_puts(&out, "before");
    CHECK(kp_jinja_render(t, NULL, &out, &e) != KP_OK);
    CHECK(out.len == 6 && memcmp(out.data, "before", 6) == 0);
    CHECK_EQ_STR(e.msg, "stop");
    CHECK(e.kind == KP_JINJA_ERAISED);
    kp_buf_free(&out);
    kp_jinja_free(t);
    kp_jinja_free(NULL);
}

/* One compiled template, renders on four threads at once. */
typedef struct { const kp_jinja *t; json_t *ctx; int ok; } thread_arg;
static void *render_thread(void *p) {
    thread_arg *a = p;
    for (int i = 0; i < 50; i++) {
        kp_buf out = {0};
        kp_jinja_error e;
        if (kp_jinja_render(a->t, a->ctx, &out, &e) == KP_OK && out.len == 25 && !memcmp(out.data, "1/2:userF 2/2:assistantL ", 25))
            a->ok++;
        kp_buf_free(&out);
    }
    return NULL;
}

static void test_threads(void) {
    const char *src = RENDERS[16].tmpl;
    kp_jinja *t;
    kp_jinja_error e;
    CHECK(kp_jinja_compile(src, strlen(src), &t, &e) == KP_OK);
    CHECK(kp_jinja_size(t) > 0);
    json_t *ctx = json_loads(CTX, 0, NULL);
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, ctx, 0};
        pthread_create(&th[i], NULL, render_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].ok, 50);
    }
    json_decref(ctx);
    kp_jinja_free(t);
}

/* kp_jinja_line_at: the template line that wrote a byte, read off the
 * template text by hand (the statement's line; for template text the line
 * the byte stands on; a macro's output where it is output). */
static void test_line_at(void) {
    static const char tmpl[] = "{%- for m in messages %}\n"                   /* 1 */
                               "{%- if m.role == 'user' %}\n"                 /* 2 */
                               "<u>{{ m.content }}</u>\n"                     /* 3 */
                               "{%- else %}\n"                                /* 4 */
                               "{{ '<b>' + m.content + '</b>' }}\n"           /* 5 */
                               "{%- endif %}\n"                               /* 6 */
                               "{%- endfor %}\n"                              /* 7 */
                               "first\nsecond\n"                              /* 8, 9 */
                               "{% macro f(x) %}[{{ x }}]{% endmacro %}{{ f('m') }}"; /* 10 */
    kp_jinja *t;
    kp_jinja_error e;
    CHECK_EQ_INT(kp_jinja_compile(tmpl, strlen(tmpl), &t, &e), KP_OK);
    json_t *ctx = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"},"
                             " {\"role\": \"bot\", \"content\": \"yo\"}]}", 0, NULL);
    kp_buf out = {0};
    CHECK_EQ_INT(kp_jinja_render(t, ctx, &out, &e), KP_OK);
    const char *want = "<u>hi</u><b>yo</b>first\nsecond\n[m]";
    CHECK_MSG(out.len == strlen(want) && !memcmp(out.data, want, out.len), "rendered [%.*s]", (int)out.len, out.data);
    static const struct {
        const char *at; /* the byte: the first occurrence of this text */
        int line;
    } cases[] = {{"<u>", 3}, {"hi", 3}, {"</u>", 3}, {"<b>", 5}, {"yo", 5}, {"first", 8},
                 {"second", 9}, {"[m]", 10}, {"m]", 10}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t byte = (size_t)(strstr(want, cases[i].at) - want);
        int line = -1;
        CHECK_EQ_INT(kp_jinja_line_at(t, ctx, byte, &line, &e), KP_OK);
        CHECK_MSG(line == cases[i].line, "byte %zu (%s): line %d, want %d", byte, cases[i].at, line, cases[i].line);
    }
    int line = -1;
    CHECK_EQ_INT(kp_jinja_line_at(t, ctx, strlen(want), &line, &e), KP_OK); /* past the end */
    CHECK_EQ_INT(line, 0);
    kp_buf_free(&out);
    json_decref(ctx);
    kp_jinja_free(t);
}

int main(void) {
    RUN(test_line_at);
    RUN(test_renders);
    RUN(test_errors);
    RUN(test_syntax_errors);
    RUN(test_limits);
    RUN(test_output_untouched);
    RUN(test_threads);
    return harness_finish("jinja");
}
