/*
 * test_unicode.c - kp_unicode_utf8_decode against the Unicode Standard
 * (version 15.0, chapter 3, section 3.9), not against our own output:
 *
 *   - an oracle built from Table 3-7 (Well-Formed UTF-8 Byte Sequences) as
 *     data classifies every 1-, 2- and 3-byte input and every 4-byte input
 *     with a lead F0..F4 (fourth bytes sampled at the range edges): well-
 *     formed with its length, truncated, or ill-formed with the length of
 *     the maximal subpart (the definition of section 3.9, D93b); the code
 *     point of a well-formed one comes from the bit distribution of Table
 *     3-6 and must lie in its row's code point range;
 *   - every scalar value U+0000..U+10FFFF, encoded with Table 3-6, decodes
 *     to itself; the surrogates so encoded are ill-formed;
 *   - the first and last code point of each row of Table 3-7;
 *   - kp_unicode_utf8_valid agrees with the oracle read character by
 *     character over every string of up to 3 bytes;
 *   - the example of "U+FFFD Substitution of Maximal Subparts" in 3.9:
 *     61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 reads as
 *     a FFFD FFFD FFFD b FFFD c FFFD FFFD d.
 */
#include <stdbool.h>
#include <stdint.h>

#include "harness.h"
#include "base/unicode.h"

/* Table 3-7, one row per line: code point range, byte count, the range of
 * each byte. */
typedef struct {
    uint32_t first, last;
    int len;
    uint8_t lo[4], hi[4];
} row;

static const row TABLE_3_7[] = {
    {0x0000, 0x007F, 1, {0x00}, {0x7F}},
    {0x0080, 0x07FF, 2, {0xC2, 0x80}, {0xDF, 0xBF}},
    {0x0800, 0x0FFF, 3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
    {0x1000, 0xCFFF, 3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},
    {0xD000, 0xD7FF, 3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
    {0xE000, 0xFFFF, 3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},
    {0x10000, 0x3FFFF, 4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
    {0x40000, 0xFFFFF, 4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
    {0x100000, 0x10FFFF, 4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
};
#define N_ROWS (sizeof TABLE_3_7 / sizeof TABLE_3_7[0])

static const row *row_of(uint8_t lead) {
    for (size_t r = 0; r < N_ROWS; r++)
        if (lead >= TABLE_3_7[r].lo[0] && lead <= TABLE_3_7[r].hi[0]) return &TABLE_3_7[r];
    return NULL;
}

/* Table 3-6 (UTF-8 Bit Distribution), decoding direction. */
static uint32_t bits_of(const uint8_t *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 |
               (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    }
}

/* Table 3-6, encoding direction (any value up to 0x10FFFF, surrogates too). */
static int encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* What the standard says about s[0..n): the length of a well-formed
 * sequence, 0 when s[0..n) is a proper beginning of one, or minus the
 * length of the maximal subpart (at least the one byte). */
static int oracle(const uint8_t *s, size_t n, uint32_t *cp) {
    const row *r = row_of(s[0]);
    if (!r) return -1;
    for (int i = 1; i < r->len; i++) {
        if ((size_t)i >= n) return 0;
        if (s[i] < r->lo[i] || s[i] > r->hi[i]) return -i;
    }
    *cp = bits_of(s, r->len);
    return r->len;
}

typedef struct {
    long checked, wrong;
    uint8_t first_wrong[4];
    size_t first_wrong_n;
} tally;

static void check_one(tally *t, const uint8_t *s, size_t n) {
    const uint32_t untouched = 0xDEADBEEF;
    uint32_t want_cp = untouched, got_cp = untouched;
    int want = oracle(s, n, &want_cp);
    int got = kp_unicode_utf8_decode(s, n, &got_cp);
    bool ok = got == want && got_cp == want_cp;
    if (want > 0) {
        const row *r = row_of(s[0]);
        ok = ok && want_cp >= r->first && want_cp <= r->last;
    }
    /* cpt may be NULL, and the answer does not change */
    ok = ok && kp_unicode_utf8_decode(s, n, NULL) == want;
    t->checked++;
    if (!ok && t->wrong++ == 0) {
        memcpy(t->first_wrong, s, n);
        t->first_wrong_n = n;
    }
}

static void report(const tally *t, const char *what) {
    CHECK_MSG(t->wrong == 0, "%s: %ld of %ld inputs disagree with Table 3-7, first %02X %02X %02X %02X (n %zu)",
              what, t->wrong, t->checked, t->first_wrong[0], t->first_wrong[1], t->first_wrong[2],
              t->first_wrong[3], t->first_wrong_n);
}

static void test_every_short_input(void) {
    tally t = {0};
    uint8_t s[4] = {0};
    for (int a = 0; a < 256; a++) {
        s[0] = (uint8_t)a;
        check_one(&t, s, 1);
        for (int b = 0; b < 256; b++) {
            s[1] = (uint8_t)b;
            check_one(&t, s, 2);
            for (int c = 0; c < 256; c++) {
                s[2] = (uint8_t)c;
                check_one(&t, s, 3);
            }
        }
    }
    CHECK_EQ_INT(t.checked, 256 + 256 * 256 + 256 * 256 * 256);
    report(&t, "1 to 3 bytes");
}

static void test_four_byte_leads(void) {
    static const uint8_t last[] = {0x00, 0x41, 0x7F, 0x80, 0x9F, 0xA0, 0xBF, 0xC0, 0xF4, 0xFF};
    tally t = {0};
    uint8_t s[4];
    for (int a = 0xF0; a <= 0xF4; a++)
        for (int b = 0; b < 256; b++)
            for (int c = 0; c < 256; c++)
                for (size_t d = 0; d < sizeof last; d++) {
                    s[0] = (uint8_t)a;
                    s[1] = (uint8_t)b;
                    s[2] = (uint8_t)c;
                    s[3] = last[d];
                    check_one(&t, s, 4);
                }
    report(&t, "4 bytes");
}

static bool oracle_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = oracle(s + i, n - i, &cp);
        if (k <= 0) return false;
        i += (size_t)k;
    }
    return true;
}

static void test_valid(void) {
    long wrong = 0, valid = 0;
    uint8_t s[3];
    CHECK(kp_unicode_utf8_valid(s, 0));
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++)
            for (int c = 0; c < 256; c++) {
                s[0] = (uint8_t)a, s[1] = (uint8_t)b, s[2] = (uint8_t)c;
                for (size_t n = 1; n <= 3; n++) {
                    bool want = oracle_valid(s, n);
                    valid += want;
                    wrong += kp_unicode_utf8_valid(s, n) != want;
                }
            }
    CHECK_EQ_INT(wrong, 0);
    CHECK(valid > 0);
}

static void test_every_scalar_value(void) {
    long wrong = 0, surrogates_accepted = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        uint8_t s[4];
        int len = encode(cp, s);
        uint32_t got = 0;
        int k = kp_unicode_utf8_decode(s, (size_t)len, &got);
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            if (k != -1) surrogates_accepted++; /* ED A0..BF: ED alone is the maximal subpart */
        } else if (k != len || got != cp) {
            wrong++;
        }
    }
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(surrogates_accepted, 0);
}

static void test_row_edges(void) {
    for (size_t r = 0; r < N_ROWS; r++) {
        const row *w = &TABLE_3_7[r];
        uint32_t cp = 0;
        CHECK_EQ_INT(kp_unicode_utf8_decode(w->lo, (size_t)w->len, &cp), w->len);
        CHECK_MSG(cp == w->first, "row %zu: first U+%04X, got U+%04X", r, (unsigned)w->first, (unsigned)cp);
        CHECK_EQ_INT(kp_unicode_utf8_decode(w->hi, (size_t)w->len, &cp), w->len);
        CHECK_MSG(cp == w->last, "row %zu: last U+%04X, got U+%04X", r, (unsigned)w->last, (unsigned)cp);
        for (int n = 1; n < w->len; n++) /* every proper beginning is truncated */
            CHECK_EQ_INT(kp_unicode_utf8_decode(w->lo, (size_t)n, &cp), 0);
    }
    /* the forms the table leaves out, one by one */
    static const struct {
        uint8_t s[4];
        size_t n;
        int want;
        const char *what;
    } bad[] = {
        {{0xC0, 0x80}, 2, -1, "overlong U+0000"},
        {{0xC1, 0xBF}, 2, -1, "overlong U+007F"},
        {{0xE0, 0x9F, 0xBF}, 3, -1, "overlong U+07FF"},
        {{0xF0, 0x8F, 0xBF, 0xBF}, 4, -1, "overlong U+FFFF"},
        {{0xED, 0xA0, 0x80}, 3, -1, "surrogate U+D800"},
        {{0xED, 0xBF, 0xBF}, 3, -1, "surrogate U+DFFF"},
        {{0xF4, 0x90, 0x80, 0x80}, 4, -1, "U+110000"},
        {{0xF5, 0x80, 0x80, 0x80}, 4, -1, "lead F5"},
        {{0xFF}, 1, -1, "lead FF"},
        {{0x80}, 1, -1, "lone continuation"},
        {{0xE1, 0x80, 0x41}, 3, -2, "E1 80 then ASCII"},
        {{0xF1, 0x80, 0x80, 0xE1}, 4, -3, "F1 80 80 then a lead"},
        {{0xC2, 0xC2}, 2, -1, "C2 then a lead"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t cp = 0xDEADBEEF;
        int k = kp_unicode_utf8_decode(bad[i].s, bad[i].n, &cp);
        CHECK_MSG(k == bad[i].want && cp == 0xDEADBEEF, "%s: %d", bad[i].what, k);
    }
}

static void test_substitution_example(void) {
    static const uint8_t in[] = {0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64};
    static const uint32_t want[] = {0x61, 0xFFFD, 0xFFFD, 0xFFFD, 0x62, 0xFFFD, 0x63, 0xFFFD, 0xFFFD, 0x64};
    uint32_t got[16];
    size_t n = 0;
    for (size_t i = 0; i < sizeof in && n < 16;) {
        uint32_t cp = 0;
        int k = kp_unicode_utf8_decode(in + i, sizeof in - i, &cp);
        if (k > 0) {
            got[n++] = cp;
            i += (size_t)k;
        } else {
            got[n++] = KP_UNICODE_REPLACEMENT;
            i += k < 0 ? (size_t)-k : sizeof in - i; /* 0: the rest is one truncated character */
        }
    }
    CHECK_EQ_INT(n, sizeof want / sizeof want[0]);
    CHECK(n == sizeof want / sizeof want[0] && memcmp(got, want, sizeof want) == 0);
}

/* kp_unicode_utf8_repair on the same example (Unicode 15, 3.9, Table 3-8:
 * "a" U+FFFD U+FFFD U+FFFD "b" U+FFFD "c" U+FFFD U+FFFD "d"), on a
 * character cut short by the end, and on text that is already valid. */
static void test_repair(void) {
    static const uint8_t in[] = {0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64};
    static const char want[] = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD" "d";
    uint8_t out[3 * sizeof in];
    size_t n = kp_unicode_utf8_repair(in, sizeof in, out);
    CHECK(n == sizeof want - 1 && memcmp(out, want, n) == 0);
    static const uint8_t cut[] = {0x41, 0xF0, 0x9F, 0x98};
    n = kp_unicode_utf8_repair(cut, sizeof cut, out);
    CHECK(n == 4 && memcmp(out, "A\xEF\xBF\xBD", 4) == 0);
    static const char ok[] = "caf\xC3\xA9 \xF0\x9F\x98\x80";
    n = kp_unicode_utf8_repair((const uint8_t *)ok, sizeof ok - 1, out);
    CHECK(n == sizeof ok - 1 && memcmp(out, ok, n) == 0);
    CHECK(kp_unicode_utf8_repair(in, 0, out) == 0);
}

int main(void) {
    RUN(test_repair);
    RUN(test_every_short_input);
    RUN(test_four_byte_leads);
    RUN(test_valid);
    RUN(test_every_scalar_value);
    RUN(test_row_edges);
    RUN(test_substitution_example);
    return harness_finish("unicode");
}
