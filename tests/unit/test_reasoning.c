/*
 * test_reasoning.c - a reply's reasoning split from its content
 * (serve/reasoning.h).
 *
 * The expected splits are written from the format a reasoning template
 * teaches ("<think>\n" R "\n</think>\n\n" C; llama.cpp's server and
 * DeepSeek's API return R and C without the markers and the whitespace
 * around them), one case per rule of reasoning.h. And for every case, the
 * property a stream relies on: scanned at every prefix of the text, what
 * a prefix marks as reasoning is a prefix of the final reasoning, and what
 * it marks as content (once not held) is a prefix of the final content,
 * and a scan resumed from the previous prefix's answer gives the answer a
 * fresh scan gives.
 */
#include <stdbool.h>
#include <string.h>

#include "harness.h"
#include "serve/reasoning.h"

static const kp_reasoning_markers THINK = {"<think>", "</think>"};

typedef struct {
    const char *text;
    bool starts_open;
    const char *reasoning; /* NULL: none */
    const char *content;
} split_case;

static const split_case CASES[] = {
    {"<think>\nI plan.\n</think>\n\nHello.", false, "I plan.", "Hello."},
    {"  \n<think>plan</think>answer", false, "plan", "answer"},
    {"Hello, no thinking.", false, NULL, "Hello, no thinking."},
    {"  Hello after spaces", false, NULL, "  Hello after spaces"},
    {"<think></think>\n\nanswer", false, "", "answer"},
    {"<think>\nnever closed, cut by max_tokens  ", false, "never closed, cut by max_tokens", ""},
    {"<thi", false, NULL, "<thi"},
    {"", false, NULL, ""},
    {"<think>a</think>b</think>c", false, "a", "b</think>c"},
    {"I plan.\n</think>\n\nHello.", true, "I plan.", "Hello."},
    {"all reasoning, the prompt opened it", true, "all reasoning, the prompt opened it", ""},
    {"x <think>not at the start</think>", false, NULL, "x <think>not at the start</think>"},
    {"<think>\nmulti\nline\n</think>\n\n<tool_call>\n{}\n</tool_call>", false, "multi\nline",
     "<tool_call>\n{}\n</tool_call>"},
    {"<think>\n\xc3\xa9t\xc3\xa9 \xe2\x9c\x93\n</think>\n\n\xe2\x9c\x93 ok", false, "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93",
     "\xe2\x9c\x93 ok"},
};

static bool has_prefix(const char *s, size_t n, const char *p, size_t pn) { return pn <= n && !memcmp(s, p, pn); }

static void test_final_splits(void) {
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const split_case *c = &CASES[k];
        size_t len = strlen(c->text);
        kp_reasoning_split r;
        kp_reasoning_scan(c->text, len, &THINK, c->starts_open, true, NULL, &r);
        bool has = r.state == KP_REASONING_OPEN || r.state == KP_REASONING_CLOSED;
        CHECK_MSG(has == (c->reasoning != NULL), "case %zu: state %d", k, (int)r.state);
        if (c->reasoning && has)
            CHECK_MSG(r.reason_to - r.reason_from == strlen(c->reasoning) &&
                          !memcmp(c->text + r.reason_from, c->reasoning, strlen(c->reasoning)),
                      "case %zu: reasoning '%.*s'", k, (int)(r.reason_to - r.reason_from), c->text + r.reason_from);
        CHECK_MSG(r.content_from <= len && !strcmp(c->text + r.content_from, c->content), "case %zu: content '%s'", k,
                  c->text + (r.content_from <= len ? r.content_from : len));
    }
}

static void test_prefixes_never_retract(void) {
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const split_case *c = &CASES[k];
        size_t len = strlen(c->text);
        kp_reasoning_split f;
        kp_reasoning_scan(c->text, len, &THINK, c->starts_open, true, NULL, &f);
        const char *fr = c->text + f.reason_from, *fc = c->text + f.content_from;
        size_t frl = f.reason_to - f.reason_from, fcl = len - f.content_from;
        bool final_has = f.state == KP_REASONING_OPEN || f.state == KP_REASONING_CLOSED;
        kp_reasoning_split prev;
        bool have_prev = false;
        for (size_t n = 0; n <= len; n++) {
            kp_reasoning_split p, q;
            kp_reasoning_scan(c->text, n, &THINK, c->starts_open, false, NULL, &p);
            /* resumed from the previous prefix's answer: the same answer */
            kp_reasoning_scan(c->text, n, &THINK, c->starts_open, false, have_prev ? &prev : NULL, &q);
            CHECK_MSG(p.state == q.state && p.reason_from == q.reason_from && p.reason_to == q.reason_to &&
                          p.content_from == q.content_from,
                      "case %zu at %zu: a resumed scan differs", k, n);
            prev = q;
            have_prev = q.state != KP_REASONING_UNDECIDED;
            if (p.state == KP_REASONING_OPEN || p.state == KP_REASONING_CLOSED) {
                CHECK_MSG(final_has, "case %zu at %zu: reasoning the final split does not have", k, n);
                CHECK_MSG(has_prefix(fr, frl, c->text + p.reason_from, p.reason_to - p.reason_from),
                          "case %zu at %zu: reasoning shown is not a prefix of the final one", k, n);
            }
            if (p.state == KP_REASONING_NONE || p.state == KP_REASONING_CLOSED)
                CHECK_MSG(p.content_from <= n && has_prefix(fc, fcl, c->text + p.content_from, n - p.content_from),
                          "case %zu at %zu: content shown is not a prefix of the final content", k, n);
        }
        /* the final scan resumed from the stream's last one: the final answer */
        kp_reasoning_split g;
        kp_reasoning_scan(c->text, len, &THINK, c->starts_open, true, have_prev ? &prev : NULL, &g);
        CHECK_MSG(g.state == f.state && g.reason_from == f.reason_from && g.reason_to == f.reason_to &&
                      g.content_from == f.content_from,
                  "case %zu: the resumed final scan differs", k);
    }
}

static void test_held_tails(void) {
    kp_reasoning_split r;
    const char *t = "<think>\nplan </thi";
    kp_reasoning_scan(t, strlen(t), &THINK, false, false, NULL, &r);
    CHECK_EQ_INT(r.state, KP_REASONING_OPEN);
    CHECK_EQ_INT(r.reason_to - r.reason_from, 4); /* "plan": the space and "</thi" held */
    CHECK_EQ_INT(r.content_from, strlen(t));
    t = "  <th";
    kp_reasoning_scan(t, strlen(t), &THINK, false, false, NULL, &r);
    CHECK_EQ_INT(r.state, KP_REASONING_UNDECIDED);
    CHECK_EQ_INT(r.content_from, strlen(t));
    t = "<think>a</think>\n\n";
    kp_reasoning_scan(t, strlen(t), &THINK, false, false, NULL, &r);
    CHECK_EQ_INT(r.state, KP_REASONING_CLOSED);
    CHECK_EQ_INT(r.content_from, strlen(t)); /* only whitespace after the marker so far */
    kp_reasoning_scan("<think>", 7, NULL, false, true, NULL, &r);
    CHECK_EQ_INT(r.state, KP_REASONING_NONE);
    CHECK_EQ_INT(r.content_from, 0);
}

static void test_prompt_opens(void) {
    const char *p = "<|im_start|>assistant\n<think>\n";
    CHECK(kp_reasoning_prompt_opens(p, strlen(p), &THINK));
    p = "<|im_start|>assistant\n<think>\n\n</think>\n\n"; /* Qwen 3 with enable_thinking false */
    CHECK(!kp_reasoning_prompt_opens(p, strlen(p), &THINK));
    p = "<|im_start|>assistant\n";
    CHECK(!kp_reasoning_prompt_opens(p, strlen(p), &THINK));
    CHECK(!kp_reasoning_prompt_opens(p, strlen(p), NULL));
}

int main(void) {
    RUN(test_final_splits);
    RUN(test_prefixes_never_retract);
    RUN(test_held_tails);
    RUN(test_prompt_opens);
    return harness_finish("reasoning");
}
