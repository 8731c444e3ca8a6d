/*
 * canon.c - RFC 8785 canonical JSON over jansson values (see canon.h).
 *
 * Owns no state. One output buffer (kp_buf) per call; an allocation
 * failure is remembered in it and reported once at the end.
 *
 * Numbers: ECMAScript Number::toString (ECMA-262 section 6.1.6.1.20) for a
 * finite x > 0, in two steps.
 *
 *   1. Digits. Find the smallest k (1..17) and the k-digit integer s such
 *      that s x 10^(n-k) reads back (strtod) as exactly x, choosing the s
 *      closest to x. For each k, "%.*e" gives the correctly rounded k-digit
 *      decimal R; if R does not read back, its neighbour on the other side
 *      of x (R + 1 or R - 1 in the last digit) may, because the set of
 *      decimals that read back as x is narrower below a power of two than
 *      above it. Any other k-digit decimal is farther from x than one of
 *      those two. k = 17 always reads back.
 *
 *   2. Placement, with the digits d1..dk and the point position n
 *      (x = 0.d1..dk x 10^n):
 *
 *        k <= n <= 21     d1..dk, then n-k zeros            1e20 -> "100000000000000000000"
 *        0 < n <= 21      d1..dn "." dn+1..dk               123.45
 *        -6 < n <= 0      "0." -n zeros, then d1..dk        0.000001
 *        k == 1           d1 "e" sign (n-1)                 1e+21, 1e-7
 *        otherwise        d1 "." d2..dk "e" sign (n-1)      1.5e-7
 *
 *   -0 prints "0"; a negative x prints "-" and the text of -x.
 *
 * Member order: names are compared as UTF-16 code-unit arrays. Walking
 * both names one code point at a time, the first differing code points
 * decide by their first UTF-16 unit (the code point itself below U+10000,
 * the high surrogate D800..DBFF above), and by the code point when the
 * high surrogates agree:
 *
 *   U+00F6 (00F6) < U+20AC (20AC) < U+1F600 (D83D DE00) < U+FB33 (FB33)
 *
 * Strings: jansson keeps strings as UTF-8 with explicit lengths (U+0000
 * allowed); the writer checks UTF-8 validity and escapes per byte, since
 * every byte that needs an escape is ASCII.
 */
#include "base/canon.h"

#include "base/buf.h"
#include "base/unicode.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Numbers                                                             */

/* The k-digit decimal digits * 10^exp10 written as "<digits>e<exp10>" and
 * read back: does it give exactly x? */
static bool reads_back(uint64_t digits, int exp10, double x) {
    char text[48];
    snprintf(text, sizeof text, "%llue%d", (unsigned long long)digits, exp10);
    return strtod(text, NULL) == x;
}

/* Shortest digits of a finite x > 0: writes d1..dk (no trailing zeros) to
 * digits, returns k, sets *point to n (x = 0.d1..dk x 10^n). */
static int shortest_digits(double x, char digits[24], int *point) {
    char text[48];
    uint64_t value = 0; /* the chosen digits as an integer */
    int exp10 = 0;      /* value x 10^exp10 == the chosen decimal */
    for (int k = 1; k <= 17; k++) {
        snprintf(text, sizeof text, "%.*e", k - 1, x);
        /* text is "d[<point>ddd]e<+|->XX"; the point character depends on
         * the locale, so anything that is not a digit before 'e' is skipped */
        uint64_t rounded = 0;
        const char *p = text;
        while (*p && *p != 'e' && *p != 'E') {
            if (*p >= '0' && *p <= '9') rounded = rounded * 10 + (uint64_t)(*p - '0');
            p++;
        }
        int e = (*p == 'e' || *p == 'E') ? atoi(p + 1) : 0;
        int scale = e - (k - 1);
        if (k == 17 || strtod(text, NULL) == x) {
            value = rounded;
            exp10 = scale;
            break;
        }
        if (reads_back(rounded + 1, scale, x)) {
            value = rounded + 1;
            exp10 = scale;
            break;
        }
        if (rounded > 1 && reads_back(rounded - 1, scale, x)) {
            value = rounded - 1;
            exp10 = scale;
            break;
        }
    }
    while (value > 0 && value % 10 == 0) {
        value /= 10;
        exp10++;
    }
    int k = snprintf(digits, 24, "%llu", (unsigned long long)value);
    *point = k + exp10;
    return k;
}

size_t kp_canon_number(double x, char out[KP_CANON_NUMBER_MAX]) {
    if (!isfinite(x)) {
        out[0] = 0;
        return 0;
    }
    if (x == 0) { /* +0 and -0 */
        out[0] = '0';
        out[1] = 0;
        return 1;
    }
    size_t o = 0;
    if (x < 0) {
        out[o++] = '-';
        x = -x;
    }
    char d[24];
    int n;
    int k = shortest_digits(x, d, &n);
    if (k <= n && n <= 21) {
        memcpy(out + o, d, (size_t)k);
        o += (size_t)k;
        for (int i = k; i < n; i++) out[o++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(out + o, d, (size_t)n);
        o += (size_t)n;
        out[o++] = '.';
        memcpy(out + o, d + n, (size_t)(k - n));
        o += (size_t)(k - n);
    } else if (-6 < n && n <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -n; i++) out[o++] = '0';
        memcpy(out + o, d, (size_t)k);
        o += (size_t)k;
    } else {
        out[o++] = d[0];
        if (k > 1) {
            out[o++] = '.';
            memcpy(out + o, d + 1, (size_t)(k - 1));
            o += (size_t)(k - 1);
        }
        int e = n - 1;
        o += (size_t)snprintf(out + o, KP_CANON_NUMBER_MAX - o, "e%c%d", e < 0 ? '-' : '+',
                              e < 0 ? -e : e);
    }
    out[o] = 0;
    assert(o < KP_CANON_NUMBER_MAX);
    return o;
}

/* ------------------------------------------------------------------ */
/* Strings                                                             */

/* Next code point of valid UTF-8 s[*i..n); advances *i. */
static uint32_t utf8_next(const char *s, size_t n, size_t *i) {
    uint32_t cp = 0;
    int k = kp_unicode_utf8_decode((const uint8_t *)s + *i, n - *i, &cp);
    assert(k > 0);
    *i += (size_t)k;
    return cp;
}

static void put_string(kp_buf *b, const char *str, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    kp_buf_putc(b, '"');
    size_t run = 0; /* start of the bytes copied as they are */
    for (size_t i = 0; i < n; i++) {
        unsigned c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        kp_buf_put(b, str + run, i - run);
        run = i + 1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t elen = 2;
        switch (c) {
        case '\b': esc[1] = 'b'; break;
        case '\t': esc[1] = 't'; break;
        case '\n': esc[1] = 'n'; break;
        case '\f': esc[1] = 'f'; break;
        case '\r': esc[1] = 'r'; break;
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        }
        kp_buf_put(b, esc, elen);
    }
    kp_buf_put(b, str + run, n - run);
    kp_buf_putc(b, '"');
}

/* ------------------------------------------------------------------ */
/* Member order                                                        */

typedef struct {
    const char *name;
    size_t name_len;
    const json_t *value;
} canon_member;

/* The first UTF-16 code unit of a code point. */
static uint32_t utf16_lead(uint32_t cp) {
    return cp < 0x10000 ? cp : 0xD800 + ((cp - 0x10000) >> 10);
}

/* Compares two valid UTF-8 strings as arrays of UTF-16 code units. */
static int utf16_compare(const char *a, size_t alen, const char *b, size_t blen) {
    size_t i = 0, j = 0;
    while (i < alen && j < blen) {
        uint32_t ca = utf8_next(a, alen, &i), cb = utf8_next(b, blen, &j);
        if (ca == cb) continue;
        uint32_t la = utf16_lead(ca), lb = utf16_lead(cb);
        if (la != lb) return la < lb ? -1 : 1;
        return ca < cb ? -1 : 1; /* same high surrogate: the low ones decide */
    }
    if (i < alen) return 1;
    if (j < blen) return -1;
    return 0;
}

static int member_compare(const void *pa, const void *pb) {
    const canon_member *a = pa, *b = pb;
    return utf16_compare(a->name, a->name_len, b->name, b->name_len);
}

/* ------------------------------------------------------------------ */
/* Values                                                              */

static kp_status write_value(kp_buf *b, const json_t *v, int depth, kp_error *err) {
    switch (json_typeof(v)) {
    case JSON_NULL: kp_buf_put(b, "null", 4); return KP_OK;
    case JSON_TRUE: kp_buf_put(b, "true", 4); return KP_OK;
    case JSON_FALSE: kp_buf_put(b, "false", 5); return KP_OK;
    case JSON_INTEGER:
    case JSON_REAL: {
        double x = json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
        char text[KP_CANON_NUMBER_MAX];
        size_t n = kp_canon_number(x, text);
        if (n == 0) return kp_fail(err, KP_EINVAL, "JSON has no form for the number %g", x);
        kp_buf_put(b, text, n);
        return KP_OK;
    }
    case JSON_STRING: {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (!kp_unicode_utf8_valid((const uint8_t *)s, n))
            return kp_fail(err, KP_EINVAL, "a JSON string is not valid UTF-8");
        put_string(b, s, n);
        return KP_OK;
    }
    case JSON_ARRAY: {
        if (depth >= KP_CANON_MAX_DEPTH)
            return kp_fail(err, KP_ERANGE, "JSON nested deeper than %d levels", KP_CANON_MAX_DEPTH);
        kp_buf_putc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) kp_buf_putc(b, ',');
            kp_status st = write_value(b, json_array_get(v, i), depth + 1, err);
            if (st != KP_OK) return st;
        }
        kp_buf_putc(b, ']');
        return KP_OK;
    }
    case JSON_OBJECT: {
        if (depth >= KP_CANON_MAX_DEPTH)
            return kp_fail(err, KP_ERANGE, "JSON nested deeper than %d levels", KP_CANON_MAX_DEPTH);
        size_t count = json_object_size(v);
        canon_member *members = count ? malloc(count * sizeof *members) : NULL;
        if (count && !members)
            return kp_fail(err, KP_ENOMEM, "out of memory sorting %zu JSON members", count);
        size_t m = 0;
        /* jansson's iterator API takes a non-const object; it does not modify it */
        for (void *it = json_object_iter((json_t *)v); it && m < count;
             it = json_object_iter_next((json_t *)v, it), m++) {
            members[m].name = json_object_iter_key(it);
            members[m].name_len = json_object_iter_key_len(it);
            members[m].value = json_object_iter_value(it);
            if (!kp_unicode_utf8_valid((const uint8_t *)members[m].name, members[m].name_len)) {
                free(members);
                return kp_fail(err, KP_EINVAL, "a JSON member name is not valid UTF-8");
            }
        }
        assert(m == count);
        if (m > 1) qsort(members, m, sizeof *members, member_compare);
        kp_status st = KP_OK;
        kp_buf_putc(b, '{');
        for (size_t i = 0; i < m && st == KP_OK; i++) {
            if (i) kp_buf_putc(b, ',');
            put_string(b, members[i].name, members[i].name_len);
            kp_buf_putc(b, ':');
            st = write_value(b, members[i].value, depth + 1, err);
        }
        kp_buf_putc(b, '}');
        free(members);
        return st;
    }
    }
    return kp_fail(err, KP_EINVAL, "unknown jansson value type %d", (int)json_typeof(v));
}

kp_status kp_canon_dump(const json_t *v, char **out, size_t *len, kp_error *err) {
    *out = NULL;
    *len = 0;
    if (!v) return kp_fail(err, KP_EINVAL, "no JSON value to canonicalize");
    kp_buf b = {0};
    kp_status st = write_value(&b, v, 0, err);
    if (st != KP_OK) {
        kp_buf_free(&b);
        return st;
    }
    if (!kp_buf_take(&b, out, len)) return kp_fail(err, KP_ENOMEM, "out of memory writing canonical JSON");
    return KP_OK;
}

kp_status kp_canon_text(const char *json, size_t len, char **out, size_t *out_len,
                        kp_error *err) {
    *out = NULL;
    *out_len = 0;
    json_error_t jerr;
    json_t *v = json_loadb(json ? json : "", json ? len : 0,
                           JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL |
                               JSON_ALLOW_NUL,
                           &jerr);
    if (!v) {
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return kp_fail(err, KP_ENOMEM, "out of memory parsing JSON");
        return kp_fail(err, KP_EFORMAT, "%d:%d: %s", jerr.line > 0 ? jerr.line : 1,
                       jerr.column > 0 ? jerr.column : 1, jerr.text);
    }
    kp_status st = kp_canon_dump(v, out, out_len, err);
    json_decref(v);
    return st;
}
