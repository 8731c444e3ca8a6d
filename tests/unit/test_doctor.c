/*
 * test_doctor.c - divergence, snippets, cause classification and advice.
 *
 * The table of prompt pairs below is the heart of it: each pair was built
 * by taking a realistic prompt and applying one known change (a date moved
 * on, keys shuffled, a summary prepended...); the expected cause is that
 * change, decided when the pair was written. UTF-8 validity of every
 * snippet is checked with an independent strict validator (RFC 3629) and,
 * for JSON-escaped snippets, by parsing them back with jansson.
 */
#include "cache/doctor.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ------------------------------------------------------------------ */
/* Independent checks                                                  */

/* Strict UTF-8 (RFC 3629 table 4 / Unicode 3.9 D92). */
static bool valid_utf8(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned b = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (b <= 0x7F) { i++; continue; }
        else if (b >= 0xC2 && b <= 0xDF) len = 2;
        else if (b == 0xE0) { len = 3; lo = 0xA0; }
        else if (b >= 0xE1 && b <= 0xEC) len = 3;
        else if (b == 0xED) { len = 3; hi = 0x9F; }
        else if (b >= 0xEE && b <= 0xEF) len = 3;
        else if (b == 0xF0) { len = 4; lo = 0x90; }
        else if (b >= 0xF1 && b <= 0xF3) len = 4;
        else if (b == 0xF4) { len = 4; hi = 0x8F; }
        else return false;
        if (i + len > n) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

static bool has_control(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F) return true;
    return false;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ------------------------------------------------------------------ */
/* Cause names                                                         */

static void test_cause_names(void) {
    const char *expected[] = {"hit",        "cold",           "evicted",    "timestamp",
                              "counter",    "identifier",     "reordered_json", "whitespace",
                              "inserted_at_front", "other", "retokenized",
                              "template_rewrites_history", "new_prefix", "window_evicted", "recurrent_state",
                              "state_checkpoint"};
    CHECK_EQ_INT(sizeof expected / sizeof expected[0], KP_DOCTOR_CAUSE_COUNT);
    for (int i = 0; i < KP_DOCTOR_CAUSE_COUNT; i++) {
        CHECK_EQ_STR(kp_doctor_cause_name((kp_doctor_cause)i), expected[i]);
        kp_doctor_cause back = KP_DOCTOR_CAUSE_COUNT;
        CHECK_EQ_INT(kp_doctor_cause_parse(expected[i], &back, NULL), KP_OK);
        CHECK_EQ_INT(back, i);
    }
    CHECK_EQ_INT(KP_DOCTOR_CAUSE_TIMESTAMP, 3); /* spot-check the order of the enum */
    CHECK_EQ_STR(kp_doctor_cause_name(KP_DOCTOR_CAUSE_COUNT), "invalid");
    CHECK_EQ_STR(kp_doctor_cause_name((kp_doctor_cause)-1), "invalid");
    kp_error err = {0};
    kp_doctor_cause c = KP_DOCTOR_CAUSE_HIT;
    CHECK_EQ_INT(kp_doctor_cause_parse("Timestamp", &c, &err), KP_ENOTFOUND);
    CHECK(contains(err.msg, "Timestamp"));
    CHECK_EQ_INT(kp_doctor_cause_parse("timestamp ", &c, NULL), KP_ENOTFOUND);
    CHECK_EQ_INT(kp_doctor_cause_parse("", &c, NULL), KP_ENOTFOUND);
    CHECK_EQ_INT(kp_doctor_cause_parse(NULL, &c, NULL), KP_EINVAL);
    CHECK_EQ_INT(c, KP_DOCTOR_CAUSE_HIT); /* untouched on failure */
}

/* ------------------------------------------------------------------ */
/* Divergence and snapping                                             */

static kp_doctor_divergence diverge(const char *c, size_t cl, const char *r, size_t rl) {
    kp_doctor_divergence dv;
    memset(&dv, 0xAB, sizeof dv);
    kp_status st = kp_doctor_diverge(c, cl, r, rl, NULL, &dv, NULL);
    CHECK_EQ_INT(st, KP_OK);
    return dv;
}

static void test_diverge_ascii(void) {
    kp_doctor_divergence dv = diverge("abcdef", 6, "abcxyz", 6);
    CHECK_EQ_INT(dv.byte, 3);
    CHECK(!dv.full_match);
    CHECK_EQ_INT(dv.token_index, KP_DOCTOR_NO_TOKEN);
    CHECK_EQ_INT(dv.token_byte, 3);
    CHECK_EQ_INT(dv.reused_bytes, 3);
    CHECK_NEAR(dv.percent_recomputed, 50.0, 1e-12); /* 3 of 6 bytes */

    dv = diverge("abc", 3, "abcdef", 6); /* request extends the cache */
    CHECK_EQ_INT(dv.byte, 3);
    CHECK(dv.full_match);
    CHECK_NEAR(dv.percent_recomputed, 50.0, 1e-12);

    dv = diverge("abcdef", 6, "abc", 3); /* request covered by the cache */
    CHECK_EQ_INT(dv.byte, 3);
    CHECK(dv.full_match);
    CHECK_NEAR(dv.percent_recomputed, 0.0, 1e-12);

    dv = diverge("same text", 9, "same text", 9);
    CHECK_EQ_INT(dv.byte, 9);
    CHECK(dv.full_match);
    CHECK_NEAR(dv.percent_recomputed, 0.0, 1e-12);

    dv = diverge("x", 1, "y", 1);
    CHECK_EQ_INT(dv.byte, 0);
    CHECK_NEAR(dv.percent_recomputed, 100.0, 1e-12);

    dv = diverge(NULL, 0, NULL, 0);
    CHECK_EQ_INT(dv.byte, 0);
    CHECK(dv.full_match);
    CHECK_NEAR(dv.percent_recomputed, 0.0, 1e-12);

    /* NUL bytes are ordinary bytes */
    dv = diverge("a\0b\0c", 5, "a\0b\0d", 5);
    CHECK_EQ_INT(dv.byte, 4);
}

static void test_diverge_utf8_snap(void) {
    /* é (C3 A9) vs è (C3 A8): first difference at byte 4, inside the
     * character that starts at 3 */
    kp_doctor_divergence dv = diverge("caf\xC3\xA9", 5, "caf\xC3\xA8", 5);
    CHECK_EQ_INT(dv.byte, 3);
    /* € (E2 82 AC) vs ₹ (E2 82 B9): two shared bytes */
    dv = diverge("\xE2\x82\xAC", 3, "\xE2\x82\xB9", 3);
    CHECK_EQ_INT(dv.byte, 0);
    /* 😀 (F0 9F 98 80) vs 😁 (F0 9F 98 81): three shared bytes, the most */
    dv = diverge("ok \xF0\x9F\x98\x80", 7, "ok \xF0\x9F\x98\x81", 7);
    CHECK_EQ_INT(dv.byte, 3);
    /* different lead bytes: no move */
    dv = diverge("a\xC3\xA9", 3, "a\xE2\x82\xAC", 4);
    CHECK_EQ_INT(dv.byte, 1);
    /* the cached text ends inside a character the request completes: the
     * half character is not shared */
    dv = diverge("ab\xC3", 3, "ab\xC3\xA9", 4);
    CHECK_EQ_INT(dv.byte, 2);
    CHECK(dv.full_match); /* bytewise the cache is a prefix */
    /* not UTF-8: a run of continuation bytes moves back at most 3 bytes */
    dv = diverge("aa\x80\x80\x80\x80\x81", 7, "aa\x80\x80\x80\x80\x82", 7);
    CHECK_EQ_INT(dv.byte, 3);
    /* an invalid lead byte that differs stays put */
    dv = diverge("abc\xFF", 4, "abc\xFE", 4);
    CHECK_EQ_INT(dv.byte, 3);
    /* a shared multi-byte text followed by an ASCII difference */
    dv = diverge("\xE6\x97\xA5\xE6\x9C\xAC!", 7, "\xE6\x97\xA5\xE6\x9C\xAC?", 7);
    CHECK_EQ_INT(dv.byte, 6);
}

static void test_diverge_tokens(void) {
    /* text diverges at byte 23 ("...09:14" vs "...10:02"); the tokenizer
     * had the token "09" start at byte 21, token index 7 of 40 */
    const char *c = "System: date 2026-11-2 09:14 rest";
    const char *r = "System: date 2026-11-2 10:02 rest";
    size_t raw = 23;
    CHECK(memcmp(c, r, raw) == 0 && c[raw] != r[raw]);
    kp_doctor_tokens tk = {.token_index = 7, .token_byte = 21, .n_tokens = 40};
    kp_doctor_divergence dv;
    CHECK_EQ_INT(kp_doctor_diverge(c, strlen(c), r, strlen(r), &tk, &dv, NULL), KP_OK);
    CHECK_EQ_INT(dv.byte, raw);
    CHECK_EQ_INT(dv.token_index, 7);
    CHECK_EQ_INT(dv.token_byte, 21);
    CHECK_EQ_INT(dv.reused_bytes, 21);
    CHECK_NEAR(dv.percent_recomputed, 100.0 * 33.0 / 40.0, 1e-9);

    /* without n_tokens the share is by bytes, from the token start */
    tk.n_tokens = 0;
    CHECK_EQ_INT(kp_doctor_diverge(c, strlen(c), r, strlen(r), &tk, &dv, NULL), KP_OK);
    CHECK_NEAR(dv.percent_recomputed, 100.0 * (double)(strlen(r) - 21) / (double)strlen(r), 1e-9);

    /* a byte-level token may start inside a character, after the snapped
     * divergence but not after the raw one */
    kp_doctor_tokens inside = {.token_index = 3, .token_byte = 4, .n_tokens = 5};
    CHECK_EQ_INT(kp_doctor_diverge("caf\xC3\xA9", 5, "caf\xC3\xA8", 5, &inside, &dv, NULL), KP_OK);
    CHECK_EQ_INT(dv.byte, 3);
    CHECK_EQ_INT(dv.reused_bytes, 4);

    kp_error err = {0};
    kp_doctor_tokens past = {.token_index = 8, .token_byte = raw + 1, .n_tokens = 40};
    CHECK_EQ_INT(kp_doctor_diverge(c, strlen(c), r, strlen(r), &past, &dv, &err), KP_EINVAL);
    CHECK(contains(err.msg, "first differing byte"));
    kp_doctor_tokens beyond = {.token_index = 8, .token_byte = strlen(r) + 1, .n_tokens = 40};
    CHECK_EQ_INT(kp_doctor_diverge(c, strlen(c), r, strlen(r), &beyond, &dv, NULL), KP_EINVAL);
    kp_doctor_tokens too_many = {.token_index = 41, .token_byte = 21, .n_tokens = 40};
    CHECK_EQ_INT(kp_doctor_diverge(c, strlen(c), r, strlen(r), &too_many, &dv, NULL), KP_EINVAL);
    /* every token matched: nothing recomputed */
    kp_doctor_tokens all = {.token_index = 12, .token_byte = 11, .n_tokens = 12};
    CHECK_EQ_INT(kp_doctor_diverge("hello world!", 12, "hello world", 11, &all, &dv, NULL), KP_OK);
    CHECK_NEAR(dv.percent_recomputed, 0.0, 1e-12);

    CHECK_EQ_INT(kp_doctor_diverge(NULL, 3, r, strlen(r), NULL, &dv, NULL), KP_EINVAL);
    CHECK_EQ_INT(kp_doctor_diverge(c, 3, NULL, 1, NULL, &dv, NULL), KP_EINVAL);
    CHECK_EQ_INT(kp_doctor_diverge(c, 3, r, 3, NULL, NULL, NULL), KP_EINVAL);
}

/* ------------------------------------------------------------------ */
/* Snippets                                                            */

static void test_snippet_escapes(void) {
    const char *t = "key:\tvalue\nnext \"quoted\" back\\slash\r\nend";
    size_t n = strlen(t);
    char out[KP_DOCTOR_SNIPPET_MAX];
    size_t marker = 999;
    size_t w = kp_doctor_snippet(t, n, 0, 16, 200, KP_DOCTOR_ESCAPE_HUMAN, out, sizeof out, &marker);
    CHECK_EQ_INT(w, strlen(out));
    CHECK_EQ_INT(marker, 0);
    CHECK_EQ_STR(out, "key:\\tvalue\\nnext \"quoted\" back\\\\slash\\r\\nend");
    w = kp_doctor_snippet(t, n, 0, 16, 200, KP_DOCTOR_ESCAPE_JSON, out, sizeof out, NULL);
    CHECK_EQ_STR(out, "key:\\tvalue\\nnext \\\"quoted\\\" back\\\\slash\\r\\nend");

    /* other controls, DEL, C1, line separators, invalid bytes */
    const char odd[] = "a\x01" "b\x7F" "c\xC2\x85" "d\xE2\x80\xA8" "e\xFF" "f\b\f";
    size_t on = sizeof odd - 1;
    kp_doctor_snippet(odd, on, 0, 0, 100, KP_DOCTOR_ESCAPE_HUMAN, out, sizeof out, NULL);
    CHECK_EQ_STR(out, "a\\x01b\\x7Fc\\u0085d\\u2028e\\xFFf\\x08\\x0C");
    kp_doctor_snippet(odd, on, 0, 0, 100, KP_DOCTOR_ESCAPE_JSON, out, sizeof out, NULL);
    CHECK_EQ_STR(out, "a\\u0001b\\u007fc\\u0085d\\u2028e\\ufffdf\\b\\f");

    /* JSON mode is a valid JSON string body that decodes to the span */
    const char *mixed = "T\xC3\xBCr \"x\"\t\xE2\x82\xAC\n\xF0\x9F\x98\x80 \\ \x1B[0m";
    size_t mn = strlen(mixed);
    kp_doctor_snippet(mixed, mn, 0, 0, 100, KP_DOCTOR_ESCAPE_JSON, out, sizeof out, NULL);
    char quoted[KP_DOCTOR_SNIPPET_MAX + 2];
    snprintf(quoted, sizeof quoted, "\"%s\"", out);
    json_error_t jerr;
    json_t *js = json_loads(quoted, JSON_DECODE_ANY, &jerr);
    CHECK(js != NULL);
    if (js) {
        CHECK_EQ_INT(json_string_length(js), mn);
        CHECK(memcmp(json_string_value(js), mixed, mn) == 0);
        json_decref(js);
    }
}

static void test_snippet_window_utf8(void) {
    /* 60 x 'é' (2 bytes each): at = 61 is inside the 31st character */
    char text[121];
    for (int i = 0; i < 60; i++) memcpy(text + 2 * i, "\xC3\xA9", 2);
    text[120] = 0;
    size_t s, e, a;
    kp_doctor_snippet_span(text, 120, 61, 16, 24, &s, &e, &a);
    CHECK_EQ_INT(a, 60);
    CHECK_EQ_INT(s, 60 - 2 * 16);
    CHECK_EQ_INT(e, 60 + 2 * 24);
    char out[KP_DOCTOR_SNIPPET_MAX];
    size_t marker = 0;
    size_t w = kp_doctor_snippet(text, 120, 61, 16, 24, KP_DOCTOR_ESCAPE_HUMAN, out, sizeof out, &marker);
    CHECK_EQ_INT(w, 80);
    CHECK_EQ_INT(marker, 32);
    CHECK(valid_utf8(out, w));

    /* the window is clamped at both ends */
    kp_doctor_snippet_span(text, 120, 2, 16, 200, &s, &e, &a);
    CHECK_EQ_INT(s, 0);
    CHECK_EQ_INT(e, 120);
    kp_doctor_snippet_span(text, 120, 5000, 3, 3, &s, &e, &a);
    CHECK_EQ_INT(a, 120);
    CHECK_EQ_INT(s, 114);
    CHECK_EQ_INT(e, 120);

    /* 4-byte characters: 🟢 at every step */
    char emoji[4 * 50 + 1];
    for (int i = 0; i < 50; i++) memcpy(emoji + 4 * i, "\xF0\x9F\x9F\xA2", 4);
    for (size_t at = 0; at <= 200; at++) {
        w = kp_doctor_snippet(emoji, 200, at, 16, 24, KP_DOCTOR_ESCAPE_JSON, out, sizeof out, &marker);
        CHECK(valid_utf8(out, w));
        CHECK(w % 4 == 0);
        CHECK(marker % 4 == 0 && marker <= w);
    }

    /* a character split by the end of the text stays visible as bytes */
    kp_doctor_snippet("ab\xE2\x82", 4, 0, 0, 10, KP_DOCTOR_ESCAPE_HUMAN, out, sizeof out, NULL);
    CHECK_EQ_STR(out, "ab\\xE2\\x82");

    /* a small buffer never cuts an escape or a character */
    w = kp_doctor_snippet("\n\n", 2, 0, 0, 10, KP_DOCTOR_ESCAPE_HUMAN, out, 3, NULL);
    CHECK_EQ_INT(w, 2);
    CHECK_EQ_STR(out, "\\n");
    w = kp_doctor_snippet("\n\n", 2, 0, 0, 10, KP_DOCTOR_ESCAPE_HUMAN, out, 2, NULL);
    CHECK_EQ_INT(w, 0);
    CHECK_EQ_STR(out, "");
    w = kp_doctor_snippet("\xC3\xA9\xC3\xA9", 4, 0, 0, 10, KP_DOCTOR_ESCAPE_HUMAN, out, 4, NULL);
    CHECK_EQ_STR(out, "\xC3\xA9");
    /* the worst case fits KP_DOCTOR_SNIPPET_MAX: 40 control bytes */
    char ctl[64];
    memset(ctl, 0x01, sizeof ctl);
    w = kp_doctor_snippet(ctl, sizeof ctl, 32, KP_DOCTOR_SNIPPET_BEFORE, KP_DOCTOR_SNIPPET_AFTER,
                       KP_DOCTOR_ESCAPE_JSON, out, sizeof out, &marker);
    CHECK_EQ_INT(w, 6 * (KP_DOCTOR_SNIPPET_BEFORE + KP_DOCTOR_SNIPPET_AFTER));
    CHECK_EQ_INT(marker, 6 * KP_DOCTOR_SNIPPET_BEFORE);
    kp_doctor_snippet(NULL, 0, 0, 4, 4, KP_DOCTOR_ESCAPE_HUMAN, out, sizeof out, NULL);
    CHECK_EQ_STR(out, "");
}

/* ------------------------------------------------------------------ */
/* The table of prompt pairs                                           */

#define SYS                                                                         \
    "You are Atlas, a coding assistant for the Orbit team.\n"                        \
    "Answer concisely and cite files by path.\n"

#define TURN1                                                                       \
    "User: How do I run only the parser tests from the command line?\n"             \
    "Assistant: Use `make test T=parser`; it builds the suite and runs it alone.\n"
#define TURN2                                                                       \
    "User: The parser suite now fails on a fresh checkout with a missing header.\n" \
    "Assistant: Run `make deps` first; it installs libjansson-dev and pcre2.\n"
#define TURN3                                                                       \
    "User: That worked. Can you explain what src/lexer.c does with CRLF input?\n"   \
    "Assistant: It folds CRLF into LF before tokenizing, see lexer_next_line.\n"
#define TURN4 "User: Thanks, now add a test for a lone CR at the end of a file.\n"

#define WEATHER_NDP                                                                 \
    "{\"name\":\"get_weather\",\"description\":\"Get the current weather for a "   \
    "city.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":" \
    "\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"          \
    "\"required\":[\"city\"]}}"
#define WEATHER_DNP                                                                 \
    "{\"description\":\"Get the current weather for a city.\",\"name\":"           \
    "\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":" \
    "{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}}," \
    "\"required\":[\"city\"]}}"
#define SEARCH_TOOL                                                                 \
    "{\"name\":\"search_code\",\"description\":\"Search the repository for a "     \
    "pattern.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"pattern\":"  \
    "{\"type\":\"string\"}},\"required\":[\"pattern\"]}}"
#define SEARCH_TOOL_SHUFFLED                                                        \
    "{\"name\":\"search_code\",\"description\":\"Search the repository for a "     \
    "pattern.\",\"parameters\":{\"required\":[\"pattern\"],\"type\":\"object\","   \
    "\"properties\":{\"pattern\":{\"type\":\"string\"}}}}"

/* A conversation as a ChatML template (Qwen's) renders it. */
#define CHATML_SYS "<|im_start|>system\nYou are Atlas, a coding assistant for the Orbit team.<|im_end|>\n"
#define CHATML_Q1 "<|im_start|>user\nHow do I run only the parser tests from the command line?<|im_end|>\n"
#define CHATML_A1                                                                   \
    "<|im_start|>assistant\nUse `make test T=parser`; it builds the suite and runs it alone.<|im_end|>\n"
#define CHATML_Q2                                                                   \
    "<|im_start|>user\nThe parser suite now fails on a fresh checkout with a missing header.<|im_end|>\n"
#define CHATML_A2 "<|im_start|>assistant\nRun `make deps` first.<|im_end|>\n<|im_start|>user\nThanks.<|im_end|>\n"

typedef struct {
    const char *name;
    const char *cached;
    const char *request;
    kp_doctor_cause cause;
    size_t line;              /* expected line of the divergence; 0: not checked */
    const char *detail_has;   /* substring of the detail; NULL: not checked */
    int in_json;              /* 1 / 0 expected, -1 not checked */
    kp_doctor_cache_state state; /* KP_DOCTOR_CACHE_TEXT unless stated */
} pair;

static const pair pairs[] = {
    /* ---- timestamps ---------------------------------------------------- */
    {"iso date and time in the system prompt",
     SYS "Current time: 2026-11-28 09:14\n" TURN1,
     SYS "Current time: 2026-11-29 10:02\n" TURN1,
     KP_DOCTOR_CAUSE_TIMESTAMP, 3, "'2026-11-28 09:14' -> '2026-11-29 10:02'", 0, 0},
    {"iso with T and Z, only the seconds moved",
     "Session started 2026-11-28T09:14:05Z. Keep answers short.\n" TURN1,
     "Session started 2026-11-28T09:14:07Z. Keep answers short.\n" TURN1,
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "'2026-11-28T09:14:05Z' -> '2026-11-28T09:14:07Z'", 0, 0},
    {"iso with a zone offset",
     SYS "now=2026-11-28T09:14:05+01:00\n",
     SYS "now=2026-11-28T09:15:00+01:00\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 3, "+01:00' -> '", 0, 0},
    {"rfc 2822 date header",
     "Date: Sat, 28 Nov 2026 09:14:00 +0000\nFrom: ci@orbit.dev\nSubject: nightly build\n",
     "Date: Sun, 29 Nov 2026 10:02:00 +0000\nFrom: ci@orbit.dev\nSubject: nightly build\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "'Sat, 28 Nov 2026 09:14:00 +0000' -> 'Sun, 29 Nov 2026 10:02:00 +0000'",
     0, 0},
    {"today is weekday, month day",
     SYS "Today is Monday, November 29. Plan the sprint review.\n",
     SYS "Today is Tuesday, November 30. Plan the sprint review.\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 3, "'Monday, November 29' -> 'Tuesday, November 30'", 0, 0},
    {"weekdays sharing their first letter",
     "Today is Saturday, November 28, 2026.\n" SYS,
     "Today is Sunday, November 29, 2026.\n" SYS,
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "'Saturday, November 28, 2026' -> 'Sunday, November 29, 2026'", 0, 0},
    {"unix seconds",
     "[ctx ts=1732871640 user=ana]\n" TURN1,
     "[ctx ts=1732958040 user=ana]\n" TURN1,
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "'1732871640' -> '1732958040'", 0, 0},
    {"unix milliseconds in a JSON context block",
     SYS "{\"created_ms\": 1764321240123, \"user\": \"ana\"}\n",
     SYS "{\"created_ms\": 1764321302456, \"user\": \"ana\"}\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 3, "'1764321240123' -> '1764321302456'", 1, 0},
    {"a bare clock time",
     SYS "Local time 10:02:33. The office closes at six.\n",
     SYS "Local time 10:05:12. The office closes at six.\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 3, "'10:02:33' -> '10:05:12'", 0, 0},
    {"12-hour clock with AM",
     "It is 9:14 AM in Lisbon; the user is on call.\n" SYS,
     "It is 10:02 AM in Lisbon; the user is on call.\n" SYS,
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "'9:14 AM' -> '10:02 AM'", 0, 0},
    {"US numeric date",
     "Report date: 11/28/2026\nOpen incidents are listed below.\n",
     "Report date: 11/29/2026\nOpen incidents are listed below.\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "'11/28/2026' -> '11/29/2026'", 0, 0},
    {"German dotted date with time",
     "Du bist ein hilfreicher Assistent.\nStand: 28.11.2026 09:14\nAntworte auf Deutsch.\n",
     "Du bist ein hilfreicher Assistent.\nStand: 29.11.2026 10:02\nAntworte auf Deutsch.\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 2, "'28.11.2026 09:14' -> '29.11.2026 10:02'", 0, 0},
    {"Llama 3 header, day month year",
     "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
     "Today Date: 28 Nov 2026\n\n" SYS,
     "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
     "Today Date: 29 Nov 2026\n\n" SYS,
     KP_DOCTOR_CAUSE_TIMESTAMP, 4, "'28 Nov 2026' -> '29 Nov 2026'", 0, 0},
    {"Chinese date with multi-byte characters around it",
     "\xE4\xBD\xA0\xE6\x98\xAF\xE5\x8A\xA9\xE6\x89\x8B\xE3\x80\x82\xE4\xBB\x8A\xE5\xA4\xA9\xE6\x98\xAF"
     "2026\xE5\xB9\xB4" "11\xE6\x9C\x88" "28\xE6\x97\xA5\xE3\x80\x82\n",
     "\xE4\xBD\xA0\xE6\x98\xAF\xE5\x8A\xA9\xE6\x89\x8B\xE3\x80\x82\xE4\xBB\x8A\xE5\xA4\xA9\xE6\x98\xAF"
     "2026\xE5\xB9\xB4" "11\xE6\x9C\x88" "29\xE6\x97\xA5\xE3\x80\x82\n",
     KP_DOCTOR_CAUSE_TIMESTAMP, 1, "2026\xE5\xB9\xB4" "11\xE6\x9C\x88" "28\xE6\x97\xA5", 0, 0},

    /* ---- counters ------------------------------------------------------ */
    {"turn number",
     SYS "[turn 3 of the session]\n" TURN1,
     SYS "[turn 4 of the session]\n" TURN1,
     KP_DOCTOR_CAUSE_COUNTER, 3, "'3' -> '4'", 0, 0},
    {"message count",
     SYS "messages: 17\n" TURN1 TURN2,
     SYS "messages: 18\n" TURN1 TURN2,
     KP_DOCTOR_CAUSE_COUNTER, 3, "'17' -> '18'", 0, 0},
    {"a counter gaining a digit",
     "Attempt 9 of 10. The previous attempt failed with exit code 2.\n",
     "Attempt 10 of 10. The previous attempt failed with exit code 2.\n",
     KP_DOCTOR_CAUSE_COUNTER, 1, "'9' -> '10'", 0, 0},
    {"budget with a thousands separator",
     SYS "Budget: 12,480 tokens left for this task.\n",
     SYS "Budget: 12,312 tokens left for this task.\n",
     KP_DOCTOR_CAUSE_COUNTER, 3, "'12,480' -> '12,312'", 0, 0},
    {"decimal balance",
     "Account summary. balance: 17.50 USD, plan: team.\n",
     "Account summary. balance: 17.75 USD, plan: team.\n",
     KP_DOCTOR_CAUSE_COUNTER, 1, "'17.50' -> '17.75'", 0, 0},
    {"counter inside a JSON state block",
     SYS "State: {\"turn\": 3, \"mode\": \"chat\", \"tools\": [\"search_code\"]}\n",
     SYS "State: {\"turn\": 4, \"mode\": \"chat\", \"tools\": [\"search_code\"]}\n",
     KP_DOCTOR_CAUSE_COUNTER, 3, "'3' -> '4'", 1, 0},

    /* ---- identifiers --------------------------------------------------- */
    {"UUID session id",
     "session_id: 550e8400-e29b-41d4-a716-446655440000\n" SYS,
     "session_id: 7c9e6679-7425-40de-944b-e07fc1f90ae7\n" SYS,
     KP_DOCTOR_CAUSE_IDENTIFIER, 1, "'550e8400-e29b-41d4-a716-446655440000' -> ", 0, 0},
    {"all-digit UUID (only its shape says it is an id)",
     SYS "fixture: 00000000-0000-0000-0000-000000000017\n" TURN1,
     SYS "fixture: 00000000-0000-0000-0000-000000000018\n" TURN1,
     KP_DOCTOR_CAUSE_IDENTIFIER, 3, "'00000000-0000-0000-0000-000000000017' -> ", 0, 0},
    {"hex trace id",
     SYS "X-Trace: 4bf92f3577b34da6a3ce929d0e0e4736\n" TURN1,
     SYS "X-Trace: 00f067aa0ba902b7a3ce929d0e0e4736\n" TURN1,
     KP_DOCTOR_CAUSE_IDENTIFIER, 3, "'4bf92f3577b34da6a3ce929d0e0e4736' -> '00f067aa0ba902b7", 0, 0},
    {"request id with a prefix",
     "request_id=req_AbC123xYz; route=/v1/chat/completions\n" SYS,
     "request_id=req_Q9wE4rTy; route=/v1/chat/completions\n" SYS,
     KP_DOCTOR_CAUSE_IDENTIFIER, 1, "'req_AbC123xYz' -> 'req_Q9wE4rTy'", 0, 0},
    {"completion id inside JSON",
     "{\"id\": \"chatcmpl-9xQ2LmTz8KpR\", \"object\": \"chat.completion\", \"model\": \"qwen\"}",
     "{\"id\": \"chatcmpl-A1bC2dE3fG4h\", \"object\": \"chat.completion\", \"model\": \"qwen\"}",
     KP_DOCTOR_CAUSE_IDENTIFIER, 1, "'chatcmpl-9xQ2LmTz8KpR' -> 'chatcmpl-A1bC2dE3fG4h'", 1, 0},
    {"git commit hash",
     SYS "Repository HEAD is at 3f2a9c1d8e7b on branch main.\n",
     SYS "Repository HEAD is at 8b1e0d4c2a6f on branch main.\n",
     KP_DOCTOR_CAUSE_IDENTIFIER, 3, "'3f2a9c1d8e7b' -> '8b1e0d4c2a6f'", 0, 0},
    {"base64 nonce with + and /",
     "auth: nonce=mF+q/8Zr+Tx2/Lp9Ws== scope=repo\n" SYS,
     "auth: nonce=mF+q/8Zr+Tx2/Kd4Qv== scope=repo\n" SYS,
     KP_DOCTOR_CAUSE_IDENTIFIER, 1, "'mF+q/8Zr+Tx2/Lp9Ws==' -> 'mF+q/8Zr+Tx2/Kd4Qv=='", 0, 0},

    /* ---- reordered JSON ------------------------------------------------ */
    {"tool schema with shuffled top-level keys",
     SYS "Tools:\n" WEATHER_NDP "\nUser: weather in Porto?\n",
     SYS "Tools:\n" WEATHER_DNP "\nUser: weather in Porto?\n",
     KP_DOCTOR_CAUSE_REORDERED_JSON, 4, "'name', 'description', 'parameters' -> 'description', 'name'", 1,
     0},
    {"second tool of an array with nested keys shuffled",
     SYS "Tools: [" WEATHER_NDP "," SEARCH_TOOL "]\n" TURN1,
     SYS "Tools: [" WEATHER_NDP "," SEARCH_TOOL_SHUFFLED "]\n" TURN1,
     KP_DOCTOR_CAUSE_REORDERED_JSON, 3, "'type', 'properties', 'required' -> 'required', 'type'", 1, 0},
    {"pretty-printed request body with keys swapped",
     "{\n  \"model\": \"qwen2.5-7b-instruct\",\n  \"temperature\": 0.2,\n  \"stream\": true\n}\n",
     "{\n  \"temperature\": 0.2,\n  \"model\": \"qwen2.5-7b-instruct\",\n  \"stream\": true\n}\n",
     KP_DOCTOR_CAUSE_REORDERED_JSON, 2, NULL, 1, 0},
    {"keys shuffled and reformatted",
     "Context: {\"user\": {\"name\": \"ana\", \"team\": \"orbit\"}, \"lang\": \"pt\"}\n" TURN1,
     "Context: {\"lang\":\"pt\",\"user\":{\"team\":\"orbit\",\"name\":\"ana\"}}\n" TURN1,
     KP_DOCTOR_CAUSE_REORDERED_JSON, 1, NULL, 1, 0},

    /* ---- whitespace ---------------------------------------------------- */
    {"CRLF vs LF",
     "You are Atlas.\r\nAnswer concisely.\r\nCite files by path.\r\n",
     "You are Atlas.\nAnswer concisely.\nCite files by path.\n",
     KP_DOCTOR_CAUSE_WHITESPACE, 1, "CRLF vs LF, '\\r\\n' -> '\\n'", 0, 0},
    {"trailing spaces removed",
     "You are Atlas.   \nRules:\n- be brief\n- cite paths\n",
     "You are Atlas.\nRules:\n- be brief\n- cite paths\n",
     KP_DOCTOR_CAUSE_WHITESPACE, 1, "'   \\n' -> '\\n'", 0, 0},
    {"indentation changed",
     SYS "Rules:\n  - be brief\n  - cite paths\n",
     SYS "Rules:\n    - be brief\n    - cite paths\n",
     KP_DOCTOR_CAUSE_WHITESPACE, 4, NULL, 0, 0},
    {"double space collapsed",
     "You are Atlas.  Answer concisely and cite files by path.\n",
     "You are Atlas. Answer concisely and cite files by path.\n",
     KP_DOCTOR_CAUSE_WHITESPACE, 1, NULL, 0, 0},
    {"tab indentation became spaces",
     SYS "```python\ndef parse(line):\n\treturn line.split(',')\n```\n",
     SYS "```python\ndef parse(line):\n    return line.split(',')\n```\n",
     KP_DOCTOR_CAUSE_WHITESPACE, 5, "'\\n\\t' -> '\\n    '", 0, 0},
    {"JSON formatting only, same key order",
     SYS "Last call: {\"city\": \"Porto\", \"days\": 3}\n",
     SYS "Last call: {\"city\":\"Porto\",\"days\":3}\n",
     KP_DOCTOR_CAUSE_WHITESPACE, 3, NULL, 1, 0},
    {"a blank line added at the very start",
     SYS TURN1,
     "\n" SYS TURN1,
     KP_DOCTOR_CAUSE_WHITESPACE, 1, NULL, 0, 0},

    /* ---- inserted at front --------------------------------------------- */
    {"summary prepended at byte 0",
     SYS TURN1 TURN2,
     "Summary of earlier conversation: the user is fixing a flaky parser test.\n" SYS TURN1 TURN2,
     KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, 1, "bytes ('Summary of earlier conversation: the use...') inserted before cached text", 0, 0},
    {"summary inserted after the system prompt",
     SYS TURN2 TURN3,
     SYS "Summary: earlier the user set up the build and ran the parser tests.\n" TURN2 TURN3,
     KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, 3, "('Summary: earlier the user set up the bui...') inserted", 0, 0},
    {"prepended text that happens to start with the same word",
     "The user wants a refactor of src/parser.c without changing behaviour.\n" TURN1,
     "The conversation so far was summarized by the agent.\n"
     "The user wants a refactor of src/parser.c without changing behaviour.\n" TURN1,
     KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, 1, "('The conversation so far was summarized b...') inserted", 0, 0},
    {"a new tool put in front of the tools array",
     SYS "Tools: [" WEATHER_NDP "]\n" TURN1,
     SYS "Tools: [" SEARCH_TOOL "," WEATHER_NDP "]\n" TURN1,
     KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, 3, "('{\"name\":\"search_code\"", 1, 0},
    {"head rewritten into a summary, later turns kept",
     SYS "Summary: the user set up the repo and asked about the build.\n" TURN1 TURN2 TURN3,
     SYS "Summary: the user set up the repo, ran the parser tests and installed deps.\n" TURN3
         TURN4,
     KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, 3,
     "('Summary: the user set up the repo, ran t...') before cached text from line 8", 0, 0},
    {"oldest turn dropped by a sliding window",
     SYS TURN1 TURN2 TURN3,
     SYS TURN2 TURN3 TURN4,
     KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, 3, "lines 3-4 (", 0, 0},

    /* ---- other edits --------------------------------------------------- */
    {"a sentence edited mid-line",
     SYS "Style: prefer short answers. Use bullet lists for steps.\n" TURN1,
     SYS "Style: prefer detailed answers with examples. Use bullet lists for steps.\n" TURN1,
     KP_DOCTOR_CAUSE_OTHER, 3, "'short answers", 0, 0},
    {"one line replaced from its first character",
     SYS "Tone: terse and technical.\n" TURN1 TURN2,
     SYS "Persona: a friendly mentor.\n" TURN1 TURN2,
     KP_DOCTOR_CAUSE_OTHER, 3, "'Tone: terse and technical.' -> 'Persona: a friendly mentor.'", 0, 0},
    {"a few words inserted mid-sentence",
     "You are a helpful assistant for the Orbit team.\n" TURN1,
     "You are a very helpful assistant for the Orbit team.\n" TURN1,
     KP_DOCTOR_CAUSE_OTHER, 1, NULL, 0, 0},
    {"a number written as a word",
     SYS "Give three examples for every rule.\n",
     SYS "Give four examples for every rule.\n",
     KP_DOCTOR_CAUSE_OTHER, 3, "'three examples", 0, 0},
    {"tools array reordered (array order is not key order)",
     SYS "Tools: [" WEATHER_NDP "," SEARCH_TOOL "]\n",
     SYS "Tools: [" SEARCH_TOOL "," WEATHER_NDP "]\n",
     KP_DOCTOR_CAUSE_OTHER, 3, NULL, 1, 0},
    {"umlaut vs e-acute sharing the lead byte",
     "Ville: Z\xC3\xBCrich, Suisse. R\xC3\xA9ponds en fran\xC3\xA7" "ais.\n",
     "Ville: Z\xC3\xA9land, Danemark. R\xC3\xA9ponds en fran\xC3\xA7" "ais.\n",
     KP_DOCTOR_CAUSE_OTHER, 1, "'Z\xC3\xBCrich", 0, 0},
    {"emoji status sharing two bytes",
     "Build status: \xF0\x9F\x9F\xA2 green, all 214 tests pass.\n",
     "Build status: \xF0\x9F\x94\xB4 red, 3 of 214 tests fail.\n",
     KP_DOCTOR_CAUSE_OTHER, 1, "'\xF0\x9F\x9F\xA2 green", 0, 0},
    {"Japanese kanji sharing two bytes",
     "\xE3\x81\x82\xE3\x81\xAA\xE3\x81\x9F\xE3\x81\xAF\xE8\xA6\xAA\xE5\x88\x87\xE3\x81\xAA"
     "\xE3\x82\xA2\xE3\x82\xB7\xE3\x82\xB9\xE3\x82\xBF\xE3\x83\xB3\xE3\x83\x88\xE3\x81\xA7\xE3\x81\x99\xE3\x80\x82\n",
     "\xE3\x81\x82\xE3\x81\xAA\xE3\x81\x9F\xE3\x81\xAF\xE8\xA6\x96\xE8\xA6\x9A\xE7\x9A\x84\xE3\x81\xAA"
     "\xE3\x82\xA2\xE3\x82\xB7\xE3\x82\xB9\xE3\x82\xBF\xE3\x83\xB3\xE3\x83\x88\xE3\x81\xA7\xE3\x81\x99\xE3\x80\x82\n",
     KP_DOCTOR_CAUSE_OTHER, 1, NULL, 0, 0},

    /* ---- edits inside earlier history (chat-template text) ------------- */
    {"a clause inserted into an earlier user message",
     CHATML_SYS CHATML_Q1 CHATML_A1 CHATML_Q2,
     CHATML_SYS "<|im_start|>user\nHow do I run only the parser tests, with verbose output and no rebuild, "
     "from the command line?<|im_end|>\n" CHATML_A1 CHATML_Q2 CHATML_A2,
     KP_DOCTOR_CAUSE_OTHER, 4, "'tests from the command line?", 0, 0},
    {"an earlier one-line user message rewritten into two lines",
     CHATML_SYS CHATML_Q1 CHATML_A1 CHATML_Q2,
     CHATML_SYS "<|im_start|>user\nI only want the parser tests.\nWhich command runs them alone?<|im_end|>\n"
     CHATML_A1 CHATML_Q2 CHATML_A2,
     KP_DOCTOR_CAUSE_OTHER, 4, NULL, 0, 0},

    /* ---- a new conversation after the template's opening --------------- */
    {"unrelated conversation sharing only the template's first line",
     "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
     "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n",
     "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
     KP_DOCTOR_CAUSE_NEW_PREFIX, 2, "only the opening '<|im_start|>user\\n' (17 bytes) is shared, then 'Write a haiku about autumn leaves.", 0, 0},
    {"unrelated conversation after a shared system prompt",
     CHATML_SYS CHATML_Q1 CHATML_A1,
     CHATML_SYS "<|im_start|>user\nSummarize this log: disk full on /dev/sda1 at boot.<|im_end|>\n"
     "<|im_start|>assistant\n",
     KP_DOCTOR_CAUSE_NEW_PREFIX, 4, NULL, 0, 0},
    {"unrelated conversation after Llama 3's header",
     "<|start_header_id|>user<|end_header_id|>\n\nTranslate 'good morning' into Portuguese.<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nBom dia.",
     "<|start_header_id|>user<|end_header_id|>\n\nList three prime numbers above 100.<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n",
     KP_DOCTOR_CAUSE_NEW_PREFIX, 3, NULL, 0, 0},
    {"unrelated conversation after Mistral's [INST]",
     "[INST] Give me a name for a grey cat. [/INST] Ash.",
     "[INST] How many legs does a spider have? [/INST]",
     KP_DOCTOR_CAUSE_NEW_PREFIX, 1, "opening '[INST] ' (7 bytes)", 0, 0},

    {"two prompts sharing the first letters of their first word",
     "Translate to French: The meeting moved to Friday.\n",
     "Transcribe the attached recording of the meeting.\n",
     KP_DOCTOR_CAUSE_OTHER, 1, "'Translate to French", 0, 0},

    /* ---- hits ---------------------------------------------------------- */
    {"identical prompts", SYS TURN1, SYS TURN1, KP_DOCTOR_CAUSE_HIT, 5, "equals the cached text", 0, 0},
    {"next turn appended", SYS TURN1, SYS TURN1 TURN2, KP_DOCTOR_CAUSE_HIT, 5,
     "starts with the whole cached text", 0, 0},
    {"request shorter than the cached text", SYS TURN1 TURN2, SYS TURN1, KP_DOCTOR_CAUSE_HIT, 5,
     "covers the whole request", 0, 0},

    /* ---- cold and evicted ---------------------------------------------- */
    {"unrelated prompts",
     "Translate to French: The meeting moved to Friday.\n",
     "Summarize this log:\n[ERROR] disk full on /dev/sda1\n",
     KP_DOCTOR_CAUSE_COLD, 1, "differ from the first byte", 0, 0},
    {"nothing cached", SYS TURN1, SYS TURN1, KP_DOCTOR_CAUSE_COLD, 1, "nothing was cached", 0,
     KP_DOCTOR_CACHE_NOTHING},
    {"empty cached text", "", SYS, KP_DOCTOR_CAUSE_COLD, 1, NULL, 0, 0},
    {"evicted prefix", SYS TURN1, SYS TURN1 TURN2, KP_DOCTOR_CAUSE_EVICTED, 5, "evicted", 0,
     KP_DOCTOR_CACHE_EVICTED},
};

#define N_PAIRS (sizeof pairs / sizeof pairs[0])

/* Causes that do not depend on which text is the cached one. */
static bool symmetric(const pair *p) {
    switch (p->cause) {
    case KP_DOCTOR_CAUSE_TIMESTAMP:
    case KP_DOCTOR_CAUSE_COUNTER:
    case KP_DOCTOR_CAUSE_IDENTIFIER:
    case KP_DOCTOR_CAUSE_REORDERED_JSON:
    case KP_DOCTOR_CAUSE_WHITESPACE:
    case KP_DOCTOR_CAUSE_HIT:
        return p->state == KP_DOCTOR_CACHE_TEXT;
    default: return false;
    }
}

static void test_pairs(void) {
    CHECK(N_PAIRS >= 40);
    int per_cause[KP_DOCTOR_CAUSE_COUNT] = {0};
    for (size_t k = 0; k < N_PAIRS; k++) {
        const pair *p = &pairs[k];
        size_t cl = strlen(p->cached), rl = strlen(p->request);
        kp_doctor_report rep;
        kp_error err = {0};
        kp_status st = kp_doctor_explain(p->cached, cl, p->request, rl, NULL, p->state,
                                      KP_DOCTOR_ESCAPE_HUMAN, &rep, &err);
        CHECK_MSG(st == KP_OK, "%s: %s", p->name, err.msg);
        if (st != KP_OK) continue;
        const kp_doctor_finding *f = &rep.finding;
        per_cause[f->cause]++;
        CHECK_MSG(f->cause == p->cause, "%s: got %s, expected %s (%s)", p->name,
                  kp_doctor_cause_name(f->cause), kp_doctor_cause_name(p->cause), f->detail);
        if (p->line) CHECK_MSG(f->line == p->line, "%s: line %zu, expected %zu", p->name, f->line, p->line);
        if (p->detail_has)
            CHECK_MSG(contains(f->detail, p->detail_has), "%s: detail \"%s\" lacks \"%s\"", p->name,
                      f->detail, p->detail_has);
        if (p->in_json >= 0)
            CHECK_MSG(f->in_json == (p->in_json == 1), "%s: in_json %d", p->name, f->in_json);

        /* the detail names its cause and stays one printable line */
        char prefix[40];
        snprintf(prefix, sizeof prefix, "%s: ", kp_doctor_cause_name(f->cause));
        CHECK_MSG(strncmp(f->detail, prefix, strlen(prefix)) == 0, "%s: %s", p->name, f->detail);
        CHECK_MSG(valid_utf8(f->detail, strlen(f->detail)) && !has_control(f->detail), "%s", p->name);

        /* divergence: the bytes before are shared, at a character start */
        size_t d = rep.div.byte;
        CHECK(d <= cl && d <= rl);
        CHECK(memcmp(p->cached, p->request, d) == 0);
        CHECK(d == rl || ((unsigned char)p->request[d] & 0xC0) != 0x80);
        CHECK_EQ_INT(f->byte, d);

        /* snippets: valid UTF-8, escaped, marker on the divergence */
        CHECK_MSG(valid_utf8(rep.cached_snippet, strlen(rep.cached_snippet)), "%s", p->name);
        CHECK_MSG(valid_utf8(rep.request_snippet, strlen(rep.request_snippet)), "%s", p->name);
        CHECK(!has_control(rep.cached_snippet) && !has_control(rep.request_snippet));
        CHECK(rep.cached_marker <= strlen(rep.cached_snippet));
        CHECK(rep.request_marker <= strlen(rep.request_snippet));
        /* the shared part before the marker is the same in both snippets */
        CHECK(rep.cached_marker == rep.request_marker);
        CHECK(memcmp(rep.cached_snippet, rep.request_snippet, rep.request_marker) == 0);

        /* the same in JSON mode parses back with jansson */
        kp_doctor_report jrep;
        CHECK_EQ_INT(kp_doctor_explain(p->cached, cl, p->request, rl, NULL, p->state,
                                    KP_DOCTOR_ESCAPE_JSON, &jrep, NULL),
                     KP_OK);
        char quoted[KP_DOCTOR_SNIPPET_MAX + 2];
        snprintf(quoted, sizeof quoted, "\"%s\"", jrep.request_snippet);
        json_t *js = json_loads(quoted, JSON_DECODE_ANY, NULL);
        CHECK_MSG(js != NULL, "%s: JSON snippet %s", p->name, quoted);
        if (js) {
            size_t s, e, a;
            kp_doctor_snippet_span(p->request, rl, d, KP_DOCTOR_SNIPPET_BEFORE, KP_DOCTOR_SNIPPET_AFTER, &s,
                                &e, &a);
            CHECK(json_string_length(js) == e - s &&
                  memcmp(json_string_value(js), p->request + s, e - s) == 0);
            json_decref(js);
        }

        /* advice is one valid sentence naming the line */
        char advice[512];
        size_t need = kp_doctor_advice(f->cause, f->detail, f->line, rep.div.percent_recomputed,
                                    "turn 3", advice, sizeof advice);
        CHECK(need == strlen(advice) || need >= sizeof advice);
        CHECK(strncmp(advice, "turn 3 re-prefills ", 19) == 0);
        CHECK(valid_utf8(advice, strlen(advice)) && !has_control(advice));

        /* the classifier accepts any earlier start (a token start) */
        if (d > 0) {
            kp_doctor_finding early;
            CHECK_EQ_INT(kp_doctor_classify(p->cached, cl, p->request, rl, d - 1, p->state, &early, NULL),
                         KP_OK);
            CHECK_MSG(early.cause == f->cause && early.byte == d && strcmp(early.detail, f->detail) == 0,
                      "%s: from d-1: %s", p->name, early.detail);
        }

        if (symmetric(p)) {
            kp_doctor_finding sw;
            CHECK_EQ_INT(kp_doctor_classify(p->request, rl, p->cached, cl, 0, p->state, &sw, NULL), KP_OK);
            CHECK_MSG(sw.cause == p->cause, "%s swapped: %s", p->name, sw.detail);
        }
    }
    /* every cause found on texts alone is exercised by the table
     * (retokenized needs token spans, template_rewrites_history the chat
     * layer's hints, window_evicted, recurrent_state and state_checkpoint
     * the engine's report: their own tests) */
    for (int c = 0; c < KP_DOCTOR_CAUSE_COUNT; c++)
        if (c != KP_DOCTOR_CAUSE_RETOKENIZED && c != KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY &&
            c != KP_DOCTOR_CAUSE_WINDOW_EVICTED && c != KP_DOCTOR_CAUSE_RECURRENT_STATE &&
            c != KP_DOCTOR_CAUSE_STATE_CHECKPOINT)
            CHECK_MSG(per_cause[c] > 0, "no pair for %s", kp_doctor_cause_name((kp_doctor_cause)c));
}

/* ------------------------------------------------------------------ */
/* Classifier details                                                  */

static void test_classify_position(void) {
    /* divergence on line 3, after 3 characters of which two are 2-byte */
    const char *c = "one\ntwo\n\xC3\xA0 \xC3\xA9x tail\n";
    const char *r = "one\ntwo\n\xC3\xA0 \xC3\xA9y tail\n";
    kp_doctor_finding f;
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    CHECK_EQ_INT(f.byte, 8 + 5);
    CHECK_EQ_INT(f.line, 3);
    CHECK_EQ_INT(f.column, 4);
    CHECK(!f.in_json);
    CHECK(contains(f.detail, " on line 3"));

    kp_error err = {0};
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 14, KP_DOCTOR_CACHE_TEXT, &f, &err),
                 KP_EINVAL);
    CHECK(contains(err.msg, "differ before byte 14"));
    CHECK_EQ_INT(kp_doctor_classify(c, 3, r, strlen(r), 4, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_EINVAL);
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, (kp_doctor_cache_state)7, &f, NULL),
                 KP_EINVAL);
    CHECK_EQ_INT(kp_doctor_classify(NULL, 2, r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_EINVAL);
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, NULL, NULL),
                 KP_EINVAL);
    /* with nothing cached the cached text is ignored, even NULL */
    CHECK_EQ_INT(kp_doctor_classify(NULL, 0, r, strlen(r), 0, KP_DOCTOR_CACHE_NOTHING, &f, NULL), KP_OK);
    CHECK_EQ_INT(f.cause, KP_DOCTOR_CAUSE_COLD);
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 3, KP_DOCTOR_CACHE_NOTHING, &f, NULL),
                 KP_EINVAL);
}

/* The sizes quoted by inserted_at_front details, from the literals. */
static void test_insert_details(void) {
#define OLD_SUMMARY "Summary: the user set up the repo and asked about the build.\n"
#define NEW_SUMMARY "Summary: the user set up the repo, ran the parser tests and installed deps.\n"
#define PREPENDED "Summary of earlier conversation: the user is fixing a flaky parser test.\n"
    char want[256];
    kp_doctor_finding f;
    const char *c = SYS OLD_SUMMARY TURN1 TURN2 TURN3, *r = SYS NEW_SUMMARY TURN3 TURN4;
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    snprintf(want, sizeof want, "inserted_at_front: lines 3-7 (%zu bytes) replaced by %zu bytes (",
             sizeof(OLD_SUMMARY TURN1 TURN2) - 1, sizeof(NEW_SUMMARY) - 1);
    CHECK_MSG(strncmp(f.detail, want, strlen(want)) == 0, "%s", f.detail);
    CHECK(contains(f.detail, " before cached text from line 8 that follows intact on line 3"));

    c = SYS TURN1 TURN2 TURN3;
    r = SYS TURN2 TURN3 TURN4;
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    snprintf(want, sizeof want,
             "inserted_at_front: lines 3-4 (%zu bytes) removed before cached text from line 5 "
             "that follows intact on line 3",
             sizeof(TURN1) - 1);
    CHECK_EQ_STR(f.detail, want);

    c = SYS TURN1;
    r = PREPENDED SYS TURN1;
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    snprintf(want, sizeof want, "inserted_at_front: %zu bytes ('%.40s...') inserted", sizeof(PREPENDED) - 1,
             PREPENDED);
    CHECK_MSG(strncmp(f.detail, want, strlen(want)) == 0, "%s", f.detail);
#undef OLD_SUMMARY
#undef NEW_SUMMARY
#undef PREPENDED
}

/* A long prompt: a tool schema block with many braces before a timestamp
 * near the end; and inputs that would make a naive bracket search slow. */
static void test_classify_large(void) {
    size_t cap = 300000;
    char *c = malloc(cap), *r = malloc(cap);
    CHECK(c && r);
    if (!c || !r) { free(c); free(r); return; }
    size_t n = 0;
    while (n + sizeof(WEATHER_NDP) + 2 < 200000) {
        memcpy(c + n, WEATHER_NDP "\n", sizeof(WEATHER_NDP));
        n += sizeof(WEATHER_NDP);
    }
    const char *tail_c = "Now: 2026-11-28 09:14:00\nUser: go\n";
    const char *tail_r = "Now: 2026-11-28 09:15:30\nUser: go\n";
    memcpy(r, c, n);
    memcpy(c + n, tail_c, strlen(tail_c));
    memcpy(r + n, tail_r, strlen(tail_r));
    size_t len = n + strlen(tail_c);
    kp_doctor_report rep;
    kp_doctor_tokens tk = {.token_index = 5000, .token_byte = n + 16, .n_tokens = 5100}; /* the token "09" */
    CHECK_EQ_INT(kp_doctor_explain(c, len, r, len, &tk, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN, &rep,
                                NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_TIMESTAMP);
    CHECK_EQ_INT(rep.div.byte, n + 20);
    CHECK_NEAR(rep.div.percent_recomputed, 100.0 * 100.0 / 5100.0, 1e-9);
    CHECK(!rep.finding.in_json);

    /* 200000 unmatched '[' before a difference */
    memset(c, '[', 200000);
    memcpy(r, c, 200000);
    c[200000] = 'a';
    r[200000] = 'b';
    kp_doctor_finding f;
    CHECK_EQ_INT(kp_doctor_classify(c, 200001, r, 200001, 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    CHECK_EQ_INT(f.cause, KP_DOCTOR_CAUSE_OTHER);
    CHECK(!f.in_json);

    /* brackets nested deeper than the matcher follows, around text that is
     * not JSON: no crash, not JSON, the number still found */
    n = 0;
    for (int i = 0; i < 400; i++) c[n++] = '[';
    c[n++] = 'x';
    c[n++] = '1';
    for (int i = 0; i < 400; i++) c[n++] = ']';
    memcpy(r, c, n);
    r[401] = '2';
    CHECK_EQ_INT(kp_doctor_classify(c, n, r, n, 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    CHECK_EQ_INT(f.cause, KP_DOCTOR_CAUSE_COUNTER);
    CHECK(!f.in_json);
    free(c);
    free(r);
}

/* ------------------------------------------------------------------ */
/* Advice                                                              */

static void test_advice(void) {
    /* the example */
    const char *c = SYS "Now: 2026-11-28 09:14\n" TURN1;
    const char *r = SYS "Now: 2026-11-29 10:02\n" TURN1;
    kp_doctor_finding f;
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    CHECK_EQ_INT(f.cause, KP_DOCTOR_CAUSE_TIMESTAMP);
    CHECK_EQ_INT(f.line, 3);
    char out[512];
    size_t need = kp_doctor_advice(f.cause, f.detail, f.line, 97.0, "turn 3", out, sizeof out);
    CHECK_EQ_STR(out, "turn 3 re-prefills 97% of its prompt: line 3 holds a timestamp that changes "
                      "every turn ('2026-11-28 09:14' -> '2026-11-29 10:02'); move it to the end of "
                      "the prompt or round it to the day");
    CHECK_EQ_INT(need, strlen(out));

    /* snprintf-style truncation, cut on a character boundary */
    char small[40];
    size_t need2 = kp_doctor_advice(f.cause, f.detail, f.line, 97.0, "turn 3", small, sizeof small);
    CHECK_EQ_INT(need2, need);
    CHECK_EQ_INT(strlen(small), sizeof small - 1);
    CHECK(strncmp(small, out, sizeof small - 1) == 0);
    /* a long multi-byte subject is cut on a character boundary too */
    char subject[400], big[600];
    for (int i = 0; i < 199; i++) memcpy(subject + 2 * i, "\xC3\xA9", 2);
    subject[398] = 0;
    kp_doctor_advice(f.cause, f.detail, f.line, 97.0, subject, big, sizeof big);
    CHECK(valid_utf8(big, strlen(big)));
    CHECK(strncmp(big, subject, 398) == 0 && contains(big, " re-prefills 97% "));
    char tiny[8];
    kp_doctor_advice(f.cause, f.detail, f.line, 97.0, "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", tiny,
                  sizeof tiny);
    CHECK_EQ_STR(tiny, "\xC3\xA9\xC3\xA9\xC3\xA9");
    CHECK_EQ_INT(kp_doctor_advice(f.cause, f.detail, f.line, 97.0, "turn 3", NULL, 0), need);

    /* percentages: never 0% for a little, never 100% for almost all */
    kp_doctor_advice(KP_DOCTOR_CAUSE_OTHER, NULL, 2, 0.2, NULL, out, sizeof out);
    CHECK_EQ_STR(out, "the request re-prefills 1% of its prompt: line 2 was edited; keep the stable "
                      "part of the prompt first and put text that changes at the end");
    kp_doctor_advice(KP_DOCTOR_CAUSE_COLD, NULL, 1, 99.7, NULL, out, sizeof out);
    CHECK(contains(out, " 99% "));
    kp_doctor_advice(KP_DOCTOR_CAUSE_COLD, NULL, 1, 100.0, NULL, out, sizeof out);
    CHECK(contains(out, " 100% "));
    kp_doctor_advice(KP_DOCTOR_CAUSE_HIT, NULL, 1, 0.0, NULL, out, sizeof out);
    CHECK(contains(out, " 0% ") && contains(out, "nothing to fix"));
    kp_doctor_advice(KP_DOCTOR_CAUSE_HIT, NULL, 1, -3.0, NULL, out, sizeof out);
    CHECK(contains(out, " 0% "));

    /* every cause has its own sentence; line 0 says "the prompt" */
    for (int k = 0; k < KP_DOCTOR_CAUSE_COUNT; k++) {
        kp_doctor_advice((kp_doctor_cause)k, NULL, 0, 50.0, "turn 2", out, sizeof out);
        CHECK(strncmp(out, "turn 2 re-prefills 50% of its prompt: ", 38) == 0);
        CHECK(!contains(out, "line 0"));
        for (int j = 0; j < k; j++) {
            char other[512];
            kp_doctor_advice((kp_doctor_cause)j, NULL, 0, 50.0, "turn 2", other, sizeof other);
            CHECK(strcmp(out, other) != 0);
        }
    }
    kp_doctor_advice(KP_DOCTOR_CAUSE_INSERTED_AT_FRONT, NULL, 7, 40.0, NULL, out, sizeof out);
    CHECK(contains(out, "changed at line 7"));
    kp_doctor_advice(KP_DOCTOR_CAUSE_REORDERED_JSON, NULL, 4, 40.0, NULL, out, sizeof out);
    CHECK(contains(out, "the JSON at line 4 has the same keys in another order"));
    /* a new conversation is not told it edited anything */
    kp_doctor_advice(KP_DOCTOR_CAUSE_NEW_PREFIX, NULL, 2, 95.0, NULL, out, sizeof out);
    CHECK(contains(out, "a different conversation from line 2 on") && !contains(out, "edited"));
    /* a window budget's cut says what to raise */
    kp_doctor_advice(KP_DOCTOR_CAUSE_WINDOW_EVICTED, NULL, 0, 60.0, NULL, out, sizeof out);
    CHECK(contains(out, "sliding-window layers") && contains(out, "--window-budget") && !contains(out, "edited"));
    /* a foreign detail is quoted whole */
    kp_doctor_advice(KP_DOCTOR_CAUSE_EVICTED, "LRU pressure from 3 agents", 2, 80.0, "turn 9", out,
                  sizeof out);
    CHECK(contains(out, "(LRU pressure from 3 agents)"));
    kp_doctor_advice(KP_DOCTOR_CAUSE_COUNT, NULL, 1, 10.0, NULL, out, sizeof out);
    CHECK(contains(out, "unknown"));
}

/* A known client's per-session line (Claude Code's billing header) is
 * named in the finding, and the advice gives the client's own switch
 * instead of the cause's general fix; the same change on another line is
 * not attributed to it. */
/* The same text as other tokens: the request's token lies inside text both
 * share, so the cause is retokenized at the token, whatever the texts do
 * later; a token that reaches past the text divergence is not. */
static void test_retokenized(void) {
    const char *c = "Plan: sort alphabetically";
    const char *r = "Plan: sort alphabetically, then print";
    kp_doctor_tokens tk = {.token_index = 3, .token_byte = 10, .n_tokens = 9, .token_end = 16};
    memcpy(tk.cached_piece, " alph", 5);
    tk.cached_piece_len = 5;
    kp_doctor_report rep;
    CHECK_EQ_INT(kp_doctor_explain(c, strlen(c), r, strlen(r), &tk, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN, &rep,
                                   NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_RETOKENIZED);
    CHECK_EQ_INT(rep.finding.byte, 10);
    CHECK_EQ_INT(rep.finding.column, 11);
    CHECK(contains(rep.finding.detail, "token 3 is ' alpha' here and ' alph' in the cache"));
    CHECK(contains(rep.request_snippet, "sort alphabetically"));
    char advice[512];
    kp_doctor_advice(rep.finding.cause, rep.finding.detail, rep.finding.line, rep.div.percent_recomputed, NULL, advice,
                     sizeof advice);
    CHECK(contains(advice, "split into other tokens") && contains(advice, "token ids to /v1/completions"));
    /* the token runs past the text both share: a text edit, not this */
    const char *r2 = "Plan: sort alphanumerically";
    kp_doctor_tokens edit = {.token_index = 3, .token_byte = 10, .n_tokens = 9, .token_end = 27};
    CHECK_EQ_INT(kp_doctor_explain(c, strlen(c), r2, strlen(r2), &edit, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_OTHER);
    /* nothing known of the token's end: as before */
    kp_doctor_tokens plain = {.token_index = 3, .token_byte = 10, .n_tokens = 9};
    CHECK_EQ_INT(kp_doctor_explain(c, strlen(c), r, strlen(r), &plain, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_HIT);
    /* evicted stays evicted */
    CHECK_EQ_INT(kp_doctor_explain(c, strlen(c), r, strlen(r), &tk, KP_DOCTOR_CACHE_EVICTED, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_EVICTED);
}

/* The chat layer's hints: the template rendered an earlier turn otherwise
 * (the rewrite byte, near the divergence), or the cached answer opened its
 * reasoning where the request has none. */
static void test_template_rewrites(void) {
    const char *c = "<user>Hi</user><bot><think>\nplan\n</think>\n\nHello</bot>";
    const char *r = "<user>Hi</user><bot>Hello</bot><user>More</user><bot>";
    kp_doctor_tokens tk = {.token_index = 5, .token_byte = 20, .n_tokens = 12};
    kp_doctor_report rep;
    /* without hints: an edit */
    CHECK_EQ_INT(kp_doctor_explain(c, strlen(c), r, strlen(r), &tk, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN, &rep,
                                   NULL),
                 KP_OK);
    CHECK(rep.finding.cause != KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY);
    /* the reasoning marker: the cached answer's reasoning is missing */
    tk.hints.reasoning_open = "<think>";
    CHECK_EQ_INT(kp_doctor_explain(c, strlen(c), r, strlen(r), &tk, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN, &rep,
                                   NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY);
    CHECK_EQ_INT(rep.finding.byte, 20);
    CHECK(contains(rep.finding.detail, "reasoning"));
    /* the rewrite byte at the divergence */
    const char *c2 = "<sys>Today: Mon</sys><user>Hi</user><bot>Hello</bot>";
    const char *r2 = "<sys>Today: Tue</sys><user>Hi</user><bot>Hello</bot><user>More</user>";
    kp_doctor_tokens t2 = {.token_index = 3, .token_byte = 12, .n_tokens = 20};
    t2.hints.rewrite_byte = 12;
    CHECK_EQ_INT(kp_doctor_explain(c2, strlen(c2), r2, strlen(r2), &t2, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK_EQ_INT(rep.finding.cause, KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY);
    CHECK(!contains(rep.finding.detail, "template line")); /* no lines known */
    /* the template lines that write the byte now and wrote it then */
    t2.hints.rewrite_line[0] = 7, t2.hints.rewrite_line[1] = 4;
    CHECK_EQ_INT(kp_doctor_explain(c2, strlen(c2), r2, strlen(r2), &t2, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK_MSG(contains(rep.finding.detail, "(template line 7; line 4 while that answer was the last turn)"), "%s",
              rep.finding.detail);
    t2.hints.rewrite_line[1] = 7;
    CHECK_EQ_INT(kp_doctor_explain(c2, strlen(c2), r2, strlen(r2), &t2, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK_MSG(contains(rep.finding.detail, "(template line 7)"), "%s", rep.finding.detail);
    /* a rewrite far after the divergence does not explain it */
    t2.hints.rewrite_byte = 200;
    CHECK_EQ_INT(kp_doctor_explain(c2, strlen(c2), r2, strlen(r2), &t2, KP_DOCTOR_CACHE_TEXT, KP_DOCTOR_ESCAPE_HUMAN,
                                   &rep, NULL),
                 KP_OK);
    CHECK(rep.finding.cause != KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY);
    char advice[512];
    kp_doctor_advice(KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY, "", 3, 20, NULL, advice, sizeof advice);
    CHECK(contains(advice, "rewrites an earlier turn") && contains(advice, "enable_thinking"));
}

static void test_known_client(void) {
    const char *c = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;\nYou are an agent.\n";
    const char *r = "x-anthropic-billing-header: cc_version=2.1.332.1c9; cc_entrypoint=sdk-cli;\nYou are an agent.\n";
    kp_doctor_finding f;
    CHECK_EQ_INT(kp_doctor_classify(c, strlen(c), r, strlen(r), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    CHECK(f.cause != KP_DOCTOR_CAUSE_HIT && f.line == 1);
    CHECK_MSG(strstr(f.detail, "Claude Code's per-session billing header") != NULL, "detail: %s", f.detail);
    char adv[1024];
    kp_doctor_advice(f.cause, f.detail, f.line, 90.0, NULL, adv, sizeof adv);
    CHECK_MSG(strstr(adv, "CLAUDE_CODE_ATTRIBUTION_HEADER=0") && strstr(adv, "--keep-volatile"), "advice: %s", adv);
    const char *c2 = "version=2.1.332.0b8\n", *r2 = "version=2.1.332.1c9\n";
    CHECK_EQ_INT(kp_doctor_classify(c2, strlen(c2), r2, strlen(r2), 0, KP_DOCTOR_CACHE_TEXT, &f, NULL), KP_OK);
    CHECK(strstr(f.detail, "Claude Code") == NULL);
    kp_doctor_advice(f.cause, f.detail, f.line, 90.0, NULL, adv, sizeof adv);
    CHECK(strstr(adv, "CLAUDE_CODE_ATTRIBUTION_HEADER") == NULL);
}

int main(void) {
    RUN(test_cause_names);
    RUN(test_diverge_ascii);
    RUN(test_diverge_utf8_snap);
    RUN(test_diverge_tokens);
    RUN(test_snippet_escapes);
    RUN(test_snippet_window_utf8);
    RUN(test_pairs);
    RUN(test_classify_position);
    RUN(test_insert_details);
    RUN(test_classify_large);
    RUN(test_advice);
    RUN(test_known_client);
    RUN(test_retokenized);
    RUN(test_template_rewrites);
    return harness_finish("doctor");
}
