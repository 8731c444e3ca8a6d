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
 *
 * Harmony mode's splits are written from OpenAI's published harmony
 * format (the cookbook's "OpenAI Harmony Response Format" examples: an
 * analysis message, then a final message, a preamble or a call), with the
 * same stream property over text[content_from..content_to).
 */
#include <stdbool.h>
#include <string.h>

#include "harness.h"
#include "serve/reasoning.h"

static const kp_reasoning_markers THINK = {"<think>", "</think>", false};
static const kp_reasoning_markers HARMONY = {"<|channel|>analysis<|message|>", "<|end|>", true};

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

static const split_case HARMONY_CASES[] = {
    {"<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
     false, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.", "2 + 2 = 4."},
    {"<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>",
     false, "Need to use function get_weather.", ""},
    {"<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant<|channel|>commentary<|message|>"
     "**Action plan**:\n1. Generate an HTML file\n---\nWill start executing the plan step by step<|end|>"
     "<|start|>assistant<|channel|>commentary to=functions.generate_file<|constrain|>json<|message|>"
     "{\"template\": \"basic_html\", \"path\": \"index.html\"}<|call|>",
     false, "{long chain of thought}",
     "**Action plan**:\n1. Generate an HTML file\n---\nWill start executing the plan step by step"},
    {"<|channel|>final<|message|>Hello there.<|return|>", false, NULL, "Hello there."},
    {"<|channel|>final<|message|>cut by max_tokens", false, NULL, "cut by max_tokens"},
    {"<|channel|>analysis<|message|>cut in the reasoning", false, "cut in the reasoning", ""},
    {" to=functions.set_level<|channel|>commentary json<|message|>{\"level\":3}<|call|>", false, NULL, ""},
    {"Plain text, no markup <|end|> at all.", false, NULL, "Plain text, no markup <|end|> at all."},
    {"<|channel|>analysis<|message|>plan<|end|>then plain text", false, "plan", "then plain text"},
    {"<|chan", false, NULL, "<|chan"},
    {"", false, NULL, ""},
};

/* Harmony's content: text[content_from..content_to). */
static void harmony_content(const char *t, const kp_reasoning_split *r, const char **c, size_t *n) {
    *c = t + r->content_from;
    *n = r->content_to - r->content_from;
}

static void test_harmony_splits(void) {
    for (size_t k = 0; k < sizeof HARMONY_CASES / sizeof *HARMONY_CASES; k++) {
        const split_case *c = &HARMONY_CASES[k];
        size_t len = strlen(c->text);
        kp_reasoning_split f;
        kp_reasoning_scan(c->text, len, &HARMONY, false, true, NULL, &f);
        bool has = f.state == KP_REASONING_OPEN || f.state == KP_REASONING_CLOSED;
        CHECK_MSG(has == (c->reasoning != NULL), "harmony case %zu: state %d", k, (int)f.state);
        if (c->reasoning && has)
            CHECK_MSG(f.reason_to - f.reason_from == strlen(c->reasoning) &&
                          !memcmp(c->text + f.reason_from, c->reasoning, strlen(c->reasoning)),
                      "harmony case %zu: reasoning '%.*s'", k, (int)(f.reason_to - f.reason_from),
                      c->text + f.reason_from);
        const char *fc;
        size_t fcl;
        harmony_content(c->text, &f, &fc, &fcl);
        CHECK_MSG(f.content_from <= f.content_to && f.content_to <= len && fcl == strlen(c->content) &&
                      !memcmp(fc, c->content, fcl),
                  "harmony case %zu: content '%.*s'", k, (int)fcl, fc);
        const char *fr = c->text + f.reason_from;
        size_t frl = f.reason_to - f.reason_from;
        for (size_t n = 0; n <= len; n++) {
            kp_reasoning_split p;
            kp_reasoning_scan(c->text, n, &HARMONY, false, false, NULL, &p);
            if (p.state == KP_REASONING_OPEN || p.state == KP_REASONING_CLOSED)
                CHECK_MSG(has && has_prefix(fr, frl, c->text + p.reason_from, p.reason_to - p.reason_from),
                          "harmony case %zu at %zu: reasoning shown is not a prefix of the final one", k, n);
            if (p.state == KP_REASONING_NONE || p.state == KP_REASONING_CLOSED) {
                const char *pc;
                size_t pcl;
                harmony_content(c->text, &p, &pc, &pcl);
                CHECK_MSG(p.content_from <= n && p.content_to <= n && has_prefix(fc, fcl, pc, pcl),
                          "harmony case %zu at %zu: content shown '%.*s' is not a prefix of the final content", k,
                          n, (int)pcl, pc);
                CHECK_MSG(!memchr(pc, '<', pcl) || !strncmp(c->text, "Plain", 5),
                          "harmony case %zu at %zu: markup shown as content '%.*s'", k, n, (int)pcl, pc);
            }
        }
    }
    /* a prompt ending "<|start|>assistant" does not open harmony's reasoning */
    const char *p = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
    CHECK(!kp_reasoning_prompt_opens(p, strlen(p), &HARMONY));
}

int main(void) {
    RUN(test_harmony_splits);
    RUN(test_final_splits);
    RUN(test_prefixes_never_retract);
    RUN(test_held_tails);
    RUN(test_prompt_opens);
    return harness_finish("reasoning");
}
