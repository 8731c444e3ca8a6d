/*
 * numrange.c - bounded JSON numbers as grammar rules (numrange.h).
 *
 * Owns nothing past a call: the rules it makes belong to the builder.
 * The digits of one alternative are collected on a small stack of
 * elements (at most 2 per digit: 18 digits, a sign and a fraction) and
 * added to the rule when the run is complete; a split pushes, recurses
 * and pops, so no sequence is copied.
 */
#include "grammar/numrange.h"

#include <stdio.h>
#include <string.h>

#define DIGITS 18
#define STACK (2 * DIGITS + 4)

/* What follows an integer part. */
typedef enum { F_NONE, F_ANY, F_ZERO, F_NONZERO } frac_kind;

typedef struct {
    kp_builder *b;
    uint32_t rule;
    uint32_t digit, zero;           /* [0-9], "0" */
    uint32_t frac_any, frac_zero, frac_nz; /* "." [0-9]{1,18}; "." "0"{1,18}; "." "0"{0,17} [1-9] [0-9]{0,17} */
    uint32_t stack[STACK];
    uint32_t n;
    uint32_t n_alts;
    bool ok;
} nr;

static void put(nr *c, uint32_t e) {
    if (e == UINT32_MAX || c->n == STACK) c->ok = false;
    else c->stack[c->n++] = e;
}

/* The element a fraction kind adds, UINT32_MAX for none. */
static uint32_t frac_elem(nr *c, frac_kind f) {
    switch (f) {
    case F_ANY: return kp_builder_rep(c->b, c->frac_any, 0, 1);
    case F_ZERO: return kp_builder_rep(c->b, c->frac_zero, 0, 1);
    case F_NONZERO: return KP_GE(KP_GE_REF, c->frac_nz);
    default: return UINT32_MAX;
    }
}

/* The stack, then the fraction, as one alternative of the rule. */
static void emit(nr *c, frac_kind f) {
    if (!c->ok) return;
    kp_gseq s = {0};
    for (uint32_t i = 0; i < c->n && c->ok; i++) c->ok = kp_gseq_push(c->b, &s, c->stack[i]);
    if (c->ok && f != F_NONE) c->ok = kp_gseq_push(c->b, &s, frac_elem(c, f));
    if (c->ok) c->ok = kp_builder_alt(c->b, c->rule, &s);
    kp_gseq_free(&s);
    c->n_alts += c->ok;
}

static bool all(const char *s, size_t n, char ch) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ch) return false;
    return true;
}

/* The n-digit strings from lo to hi (same length, lo <= hi, leading zeros
 * allowed: they are the tail of a longer number), after the stack. */
static void same_len(nr *c, const char *lo, const char *hi, size_t n, frac_kind f) {
    if (!c->ok) return;
    uint32_t mark = c->n;
    if (n == 0) {
        emit(c, f);
    } else if (all(lo, n, '0') && all(hi, n, '9')) {
        put(c, kp_builder_rep(c->b, c->digit, (uint32_t)n, (uint32_t)n));
        emit(c, f);
    } else if (lo[0] == hi[0]) {
        put(c, kp_builder_byte(c->b, (uint8_t)lo[0]));
        same_len(c, lo + 1, hi + 1, n - 1, f);
    } else {
        char nines[DIGITS + 1], zeros[DIGITS + 1];
        memset(nines, '9', n - 1);
        memset(zeros, '0', n - 1);
        /* lo's first digit with the rest from lo's up, unless lo's rest is
         * all zeros (then the middle range takes that digit whole) */
        bool lo_whole = all(lo + 1, n - 1, '0'), hi_whole = all(hi + 1, n - 1, '9');
        char first = lo_whole ? lo[0] : (char)(lo[0] + 1), last = hi_whole ? hi[0] : (char)(hi[0] - 1);
        if (!lo_whole) {
            put(c, kp_builder_byte(c->b, (uint8_t)lo[0]));
            same_len(c, lo + 1, nines, n - 1, f);
            c->n = mark;
        }
        if (first <= last) {
            put(c, kp_builder_bytes(c->b, (uint8_t)first, (uint8_t)last));
            if (n > 1) put(c, kp_builder_rep(c->b, c->digit, (uint32_t)n - 1, (uint32_t)n - 1));
            emit(c, f);
            c->n = mark;
        }
        if (!hi_whole) {
            put(c, kp_builder_byte(c->b, (uint8_t)hi[0]));
            same_len(c, zeros, hi + 1, n - 1, f);
        }
    }
    c->n = mark;
}

static int n_digits(uint64_t v) {
    int d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

/* sign, then the integers a..b (0 <= a <= b <= KP_GNUM_MAX) written
 * without leading zeros, then the fraction f. */
static void uint_range(nr *c, bool minus, uint64_t a, uint64_t b, frac_kind f) {
    uint32_t mark = c->n;
    if (minus) put(c, kp_builder_byte(c->b, '-'));
    uint64_t p = 1;
    for (int d = 1; d <= n_digits(b) && c->ok; d++, p *= 10) {
        uint64_t lo = d == 1 ? 0 : p, hi = p * 10 - 1;
        if (lo < a) lo = a;
        if (hi > b) hi = b;
        if (lo > hi) continue;
        char ls[DIGITS + 2], hs[DIGITS + 2];
        snprintf(ls, sizeof ls, "%0*llu", d, (unsigned long long)lo);
        snprintf(hs, sizeof hs, "%0*llu", d, (unsigned long long)hi);
        same_len(c, ls, hs, (size_t)d, f);
    }
    c->n = mark;
}

/* sign, then the numbers y with a <= y <= b (or strict): an integer part
 * and the fraction that keeps y in range. */
static void unum_range(nr *c, bool minus, uint64_t a, bool ea, uint64_t b, bool eb) {
    if (a == b) {
        if (!ea && !eb) uint_range(c, minus, a, a, F_ZERO);
        return;
    }
    uint_range(c, minus, a, a, ea ? F_NONZERO : F_ANY);
    if (a + 1 <= b - 1) uint_range(c, minus, a + 1, b - 1, F_ANY);
    if (!eb) uint_range(c, minus, b, b, F_ZERO);
}

static uint32_t rule_of(nr *c, const char *name, kp_gseq *s) {
    uint32_t r = kp_builder_rule(c->b, "%s", name);
    if (r == UINT32_MAX || !kp_builder_alt(c->b, r, s)) c->ok = false;
    kp_gseq_free(s);
    return r;
}

bool kp_gnum_range(kp_builder *b, uint32_t rule, int64_t lo, bool lo_excl, int64_t hi, bool hi_excl, bool integer,
                   bool *empty) {
    nr c = {.b = b, .rule = rule, .ok = true};
    *empty = false;
    c.digit = kp_builder_rule(b, "%s", "digit");
    c.zero = kp_builder_rule(b, "%s", "zero");
    if (c.digit == UINT32_MAX || c.zero == UINT32_MAX || !kp_builder_alt1(b, c.digit, kp_builder_bytes(b, '0', '9')) ||
        !kp_builder_alt1(b, c.zero, kp_builder_byte(b, '0')))
        return false;
    kp_gseq s = {0};
    c.ok = kp_gseq_str(b, &s, ".") && kp_gseq_push(b, &s, kp_builder_rep(b, c.digit, 1, DIGITS));
    c.frac_any = rule_of(&c, "fraction", &s);
    c.ok = c.ok && kp_gseq_str(b, &s, ".") && kp_gseq_push(b, &s, kp_builder_rep(b, c.zero, 1, DIGITS));
    c.frac_zero = rule_of(&c, "zero-fraction", &s);
    c.ok = c.ok && kp_gseq_str(b, &s, ".") && kp_gseq_push(b, &s, kp_builder_rep(b, c.zero, 0, DIGITS - 1)) &&
           kp_gseq_push(b, &s, kp_builder_bytes(b, '1', '9')) && kp_gseq_push(b, &s, kp_builder_rep(b, c.digit, 0, DIGITS - 1));
    c.frac_nz = rule_of(&c, "nonzero-fraction", &s);
    if (!c.ok) return false;
    if (integer) {
        if (lo_excl) lo++;
        if (hi_excl) hi--;
        if (lo <= -1) uint_range(&c, true, (uint64_t)(hi < -1 ? -hi : 1), (uint64_t)-lo, F_NONE);
        if (hi >= 0) uint_range(&c, false, (uint64_t)(lo > 0 ? lo : 0), (uint64_t)hi, F_NONE);
    } else if (lo < hi || (lo == hi && !lo_excl && !hi_excl)) {
        if (lo >= 0) {
            unum_range(&c, false, (uint64_t)lo, lo_excl, (uint64_t)hi, hi_excl);
        } else if (hi <= 0) {
            unum_range(&c, true, (uint64_t)-hi, hi_excl, (uint64_t)-lo, lo_excl);
            if (hi == 0 && !hi_excl) uint_range(&c, false, 0, 0, F_ZERO);
        } else {
            unum_range(&c, true, 0, false, (uint64_t)-lo, lo_excl);
            unum_range(&c, false, 0, false, (uint64_t)hi, hi_excl);
        }
    }
    *empty = c.ok && c.n_alts == 0;
    return c.ok;
}
