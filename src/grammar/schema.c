/*
 * schema.c - JSON Schema (a subset) into the builder (gram_impl.h).
 *
 * Supported: type (one or a list), properties, required,
 * additionalProperties (true / absent / false / a schema), enum, const,
 * items (one schema), minItems, maxItems, anyOf, oneOf (compiled as anyOf:
 * a document may match several branches), allOf with one schema, $ref
 * ('#' JSON pointers into the document, so #/$defs/x and #/definitions/x,
 * recursion included), minLength, maxLength, format date / date-time /
 * time / uuid / email / hostname / uri / ipv4 (any other format is an
 * annotation, as JSON Schema has it: the string is not constrained), minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers
 * since draft 6, or draft 4's booleans beside minimum and maximum;
 * integer bounds for numbers, any bounds for integers; numrange.h writes
 * the range out digit by digit), boolean schemas, and the annotations title, description, default,
 * examples, $schema, $comment, readOnly, writeOnly, deprecated, $id (at
 * the root only). Any other keyword is KP_EUNSUPPORTED naming it and its
 * path ("#/properties/a/pattern"). $ref, anyOf/oneOf/allOf and enum/const
 * accept only annotations beside them (enum/const also `type`, which
 * filters the values); anything else beside them is refused too.
 *
 * The documents (the output shape):
 *
 *   root    prefix ws value ws suffix; ws = [ \t\n\r]{0,ws_max} between any
 *           two tokens (the outer two left out with no_outer_ws); prefix
 *           and suffix literal bytes (default none)
 *   object  "{" ws members "}" with the declared properties in schema
 *           order, required ones always, optional ones maybe, then any
 *           additional ones (when allowed) whose keys are none of the
 *           declared names and are written without escapes until they
 *           differ from every declared name. The comma logic is a chain
 *           of rules F_i / N_i ("nothing written yet" / "something
 *           written") over the properties:
 *             F_i ::= kv_i ws N_i+1 | F_i+1 (if optional)
 *             N_i ::= "," ws kv_i ws N_i+1 | N_i+1 (if optional)
 *   array   "[" ws ( "]" | item ws ("," ws item ws){min-1,max-1} "]" )
 *   string  '"' char{minLength,maxLength} '"'; a char is one code point:
 *           unescaped UTF-8 (U+0020.., not '"' or '\'), a short escape,
 *           \uXXXX (lowercase or uppercase hex) other than a lone
 *           surrogate, or a surrogate pair \uD8xx\uDCxx
 *   number  -?(0|[1-9][0-9]{0,17})(\.[0-9]{1,18})?([eE][-+]?[0-9]{1,2})?
 *           (integer: without fraction and exponent). The digit bounds
 *           keep every number within int64 / double range and stop a model
 *           from writing digits forever.
 *   enum/const  each value in one spelling: strings with the shortest
 *           escapes (\" \\ \b \f \n \r \t, \u00xx for other controls, the
 *           rest raw), numbers as integers or the shortest %g that reads
 *           back to the same double, arrays and objects with ws between
 *           tokens and object members in the value's own order.
 *   formats date: YYYY-MM-DD with the month's day count (Feb 29 in leap
 *           years only); date-time: date "T" hh:mm:ss(.d{1,9})? then "Z"
 *           or +hh:mm / -hh:mm (no leap second 60); time: that time alone;
 *           uuid: 8-4-4-4-12 hex; email: local part of 1-64 of RFC 5322's
 *           atext and "." (no quoted forms), "@", DNS labels, a dot and a
 *           2-24 letter top-level label; hostname: DNS labels joined by
 *           "."; uri: a scheme, ":" and 1-2048 of RFC 3986's unreserved,
 *           reserved and "%" characters; ipv4: dotted decimal 0-255.
 *
 * Rules are named by their JSON path, so grammar errors (a schema with no
 * finite document, a $ref loop without JSON in between) name the schema.
 *
 * Limits (grammar.h), each a KP_ERANGE naming it and the path:
 * subschemas and literal values nested KP_GRAMMAR_MAX_NESTING deep,
 * KP_SCHEMA_MAX_PROPERTIES properties (or required names) in one object,
 * KP_SCHEMA_MAX_ENUM values in one enum, KP_SCHEMA_MAX_ANYOF branches in
 * one anyOf / oneOf; the grammar's width (KP_GRAMMAR_MAX_WIDTH) is checked
 * on the result (ganalyse.c). Enum values are written as one alternative
 * each: the builder's factoring merges their common beginnings (gfactor.c).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/unicode.h"
#include "grammar/gram_impl.h"
#include "grammar/numrange.h"

#define MAX_DEPTH KP_GRAMMAR_MAX_NESTING
#define MAX_NAME 1024 /* property names, when additional properties must avoid them */
#define INT_DIGITS 18  /* 0 | [1-9][0-9]{0,17} */
#define FRAC_DIGITS 18
#define EXP_DIGITS 2

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ALL = 127 };

typedef struct {
    const json_t *target;
    uint32_t rule;
} refmemo;

typedef struct {
    kp_builder *b;
    const json_t *root;
    kp_error *err;
    kp_status st;
    uint32_t ws_max;
    uint32_t r_wsch, r_char, r_string, r_digit, r_hex, r_int, r_num, r_value, r_obj, r_date, r_time;
    refmemo *refs;
    uint32_t n_refs, cap_refs;
    char path[512];
    size_t plen;
    int depth;
} sc;

kp_schema_opts kp_schema_opts_default(void) { return (kp_schema_opts){.ws_max = 20}; }

static bool fail(sc *c, kp_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(sc *c, kp_status code, const char *fmt, ...) {
    if (c->st != KP_OK) return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = kp_fail(c->err, code, "json schema: %s at %s", msg, c->path);
    return false;
}

/* A push or add failed: stopped, too big or out of memory. */
static bool oom(sc *c) {
    if (c->st != KP_OK) return false;
    kp_error e = {0};
    c->st = kp_builder_failure(c->b, "json schema", &e);
    kp_fail(c->err, c->st, "%s at %s", e.msg, c->path);
    return false;
}

/* Appends "/seg" (JSON-pointer escaped) to the path; returns the old length. */
static size_t path_push(sc *c, const char *seg, size_t n) {
    size_t old = c->plen;
    if (c->plen + 2 < sizeof c->path) c->path[c->plen++] = '/';
    for (size_t i = 0; i < n && c->plen + 3 < sizeof c->path; i++) {
        char ch = seg[i];
        if (ch == '~' || ch == '/') {
            c->path[c->plen++] = '~';
            c->path[c->plen++] = ch == '~' ? '0' : '1';
        } else {
            c->path[c->plen++] = ch ? ch : '?';
        }
    }
    c->path[c->plen] = 0;
    return old;
}
static size_t path_pushs(sc *c, const char *seg) { return path_push(c, seg, strlen(seg)); }
static size_t path_pushi(sc *c, size_t i) {
    char t[32];
    snprintf(t, sizeof t, "%zu", i);
    return path_pushs(c, t);
}
static void path_pop(sc *c, size_t old) {
    c->plen = old;
    c->path[old] = 0;
}

static uint32_t new_rule(sc *c, const char *suffix) {
    uint32_t r = kp_builder_rule(c->b, "%s%s", c->path, suffix);
    if (r == UINT32_MAX) oom(c);
    return r;
}

/* ---- shared pieces ---- */

static bool push(sc *c, kp_gseq *s, uint32_t e) { return kp_gseq_push(c->b, s, e) || oom(c); }
static bool push_str(sc *c, kp_gseq *s, const char *str) { return kp_gseq_str(c->b, s, str) || oom(c); }
static bool push_ws(sc *c, kp_gseq *s) {
    if (c->ws_max == 0) return true;
    if (c->r_wsch == UINT32_MAX) {
        c->r_wsch = kp_builder_rule(c->b, "%s", "ws");
        kp_gset ws = {{0}};
        kp_gset_add(&ws, ' ');
        kp_gset_add(&ws, '\t');
        kp_gset_add(&ws, '\n');
        kp_gset_add(&ws, '\r');
        if (c->r_wsch == UINT32_MAX || !kp_builder_alt1(c->b, c->r_wsch, kp_builder_term(c->b, &ws))) return oom(c);
    }
    return push(c, s, kp_builder_rep(c->b, c->r_wsch, 0, c->ws_max));
}
/* Literal bytes b[0..n) (any bytes, not only UTF-8). */
static bool push_bytes(sc *c, kp_gseq *s, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!push(c, s, kp_builder_byte(c->b, (uint8_t)b[i]))) return false;
    return true;
}
static bool add_alt(sc *c, uint32_t rule, kp_gseq *s) { return kp_builder_alt(c->b, rule, s) || oom(c); }
static bool alt_ref(sc *c, uint32_t rule, uint32_t sub) {
    return sub != UINT32_MAX && (kp_builder_alt1(c->b, rule, KP_GE(KP_GE_REF, sub)) || oom(c));
}

static uint32_t set_term(sc *c, const char *members) {
    kp_gset s = {{0}};
    for (const char *p = members; *p; p++) {
        if (p[1] == '-' && p[2]) {
            kp_gset_add_range(&s, (uint8_t)p[0], (uint8_t)p[2]);
            p += 2;
        } else {
            kp_gset_add(&s, (uint8_t)*p);
        }
    }
    return kp_builder_term(c->b, &s);
}

static uint32_t digit_rule(sc *c) {
    if (c->r_digit == UINT32_MAX) {
        c->r_digit = kp_builder_rule(c->b, "%s", "digit");
        if (c->r_digit == UINT32_MAX || !kp_builder_alt1(c->b, c->r_digit, set_term(c, "0-9"))) oom(c);
    }
    return c->r_digit;
}

static uint32_t hex_rule(sc *c) {
    if (c->r_hex == UINT32_MAX) {
        c->r_hex = kp_builder_rule(c->b, "%s", "hex");
        if (c->r_hex == UINT32_MAX || !kp_builder_alt1(c->b, c->r_hex, set_term(c, "0-9a-fA-F"))) oom(c);
    }
    return c->r_hex;
}

/* One code point of a JSON string's content. */
static uint32_t char_rule(sc *c) {
    if (c->r_char != UINT32_MAX) return c->r_char;
    kp_builder *b = c->b;
    uint32_t r = c->r_char = kp_builder_rule(b, "%s", "char");
    uint32_t hx = hex_rule(c);
    if (r == UINT32_MAX || hx == UINT32_MAX) {
        oom(c);
        return UINT32_MAX;
    }
    uint32_t h = KP_GE(KP_GE_REF, hx);
    kp_gseq s = {0};
    bool ok = push(c, &s, set_term(c, " !#-[]-\x7f")) && add_alt(c, r, &s) &&                          /* plain */
              push_str(c, &s, "\\") && push(c, &s, set_term(c, "\"\\/bfnrt")) && add_alt(c, r, &s) && /* \n */
              push_str(c, &s, "\\u") && push(c, &s, set_term(c, "0-9a-cA-Ce-fE-F")) && push(c, &s, h) &&
              push(c, &s, h) && push(c, &s, h) && add_alt(c, r, &s) &&
              push_str(c, &s, "\\u") && push(c, &s, set_term(c, "dD")) && push(c, &s, set_term(c, "0-7")) &&
              push(c, &s, h) && push(c, &s, h) && add_alt(c, r, &s) &&
              push_str(c, &s, "\\u") && push(c, &s, set_term(c, "dD")) && push(c, &s, set_term(c, "89abAB")) &&
              push(c, &s, h) && push(c, &s, h) && push_str(c, &s, "\\u") && push(c, &s, set_term(c, "dD")) &&
              push(c, &s, set_term(c, "c-fC-F")) && push(c, &s, h) && push(c, &s, h) && add_alt(c, r, &s);
    kp_gcrange non_ascii = {0x80, 0x10FFFF};
    ok = ok && (kp_builder_class_into(b, r, &non_ascii, 1, false) || oom(c));
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* '"' char{min,max} '"' */
static uint32_t string_rule(sc *c, uint32_t min, uint32_t max) {
    bool plain = min == 0 && max == KP_GREP_INF;
    if (plain && c->r_string != UINT32_MAX) return c->r_string;
    uint32_t ch = char_rule(c);
    uint32_t r = plain ? kp_builder_rule(c->b, "%s", "string") : new_rule(c, "");
    if (ch == UINT32_MAX || r == UINT32_MAX) return UINT32_MAX;
    kp_gseq s = {0};
    bool ok = push_str(c, &s, "\"") && push(c, &s, kp_builder_rep(c->b, ch, min, max)) && push_str(c, &s, "\"") &&
              add_alt(c, r, &s);
    kp_gseq_free(&s);
    if (plain) c->r_string = r;
    return ok ? r : UINT32_MAX;
}

/* -?(0|[1-9][0-9]{0,17}) */
static uint32_t int_rule(sc *c) {
    if (c->r_int != UINT32_MAX) return c->r_int;
    uint32_t d = digit_rule(c);
    uint32_t r = c->r_int = kp_builder_rule(c->b, "%s", "integer");
    if (d == UINT32_MAX || r == UINT32_MAX) return UINT32_MAX;
    kp_gseq s = {0};
    bool ok = true;
    for (int neg = 0; neg < 2 && ok; neg++) {
        ok = (!neg || push_str(c, &s, "-")) && push_str(c, &s, "0") && add_alt(c, r, &s) &&
             (!neg || push_str(c, &s, "-")) && push(c, &s, set_term(c, "1-9")) &&
             push(c, &s, kp_builder_rep(c->b, d, 0, INT_DIGITS - 1)) && add_alt(c, r, &s);
    }
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

static uint32_t num_rule(sc *c) {
    if (c->r_num != UINT32_MAX) return c->r_num;
    uint32_t d = digit_rule(c), i = int_rule(c);
    uint32_t frac = kp_builder_rule(c->b, "%s", "fraction"), exp = kp_builder_rule(c->b, "%s", "exponent");
    uint32_t r = c->r_num = kp_builder_rule(c->b, "%s", "number");
    if (d == UINT32_MAX || i == UINT32_MAX || frac == UINT32_MAX || exp == UINT32_MAX || r == UINT32_MAX) {
        oom(c);
        return UINT32_MAX;
    }
    kp_gseq s = {0};
    bool ok = push_str(c, &s, ".") && push(c, &s, kp_builder_rep(c->b, d, 1, FRAC_DIGITS)) && add_alt(c, frac, &s) &&
              push(c, &s, set_term(c, "eE")) && push(c, &s, kp_builder_rep(c->b, d, 1, EXP_DIGITS)) && add_alt(c, exp, &s) &&
              push(c, &s, set_term(c, "eE")) && push(c, &s, set_term(c, "-+")) &&
              push(c, &s, kp_builder_rep(c->b, d, 1, EXP_DIGITS)) && add_alt(c, exp, &s) &&
              push(c, &s, KP_GE(KP_GE_REF, i)) && push(c, &s, kp_builder_rep(c->b, frac, 0, 1)) &&
              push(c, &s, kp_builder_rep(c->b, exp, 0, 1)) && add_alt(c, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* "[" ws ( "]" | item ws ("," ws item ws){min-1,max-1} "]" ) */
static uint32_t array_of(sc *c, uint32_t item, uint32_t min, uint32_t max, const char *name) {
    const char *base = name[0] ? name : c->path;
    uint32_t body = kp_builder_rule(c->b, "%s[]", base), more = kp_builder_rule(c->b, "%s[,]", base);
    uint32_t r = kp_builder_rule(c->b, "%s%s", base, name[0] ? "" : "[");
    if (body == UINT32_MAX || more == UINT32_MAX || r == UINT32_MAX) return oom(c), UINT32_MAX;
    kp_gseq s = {0};
    bool ok = true;
    if (min == 0) ok = push_str(c, &s, "]") && add_alt(c, body, &s);
    if (ok && max >= 1 && item != UINT32_MAX) {
        ok = push_str(c, &s, ",") && push_ws(c, &s) && push(c, &s, KP_GE(KP_GE_REF, item)) && push_ws(c, &s) &&
             add_alt(c, more, &s) && push(c, &s, KP_GE(KP_GE_REF, item)) && push_ws(c, &s);
        uint32_t lo = min ? min - 1 : 0, hi = max == KP_GREP_INF ? KP_GREP_INF : max - 1;
        if (ok && hi > 0) ok = push(c, &s, kp_builder_rep(c->b, more, lo, hi));
        ok = ok && push_str(c, &s, "]") && add_alt(c, body, &s);
    }
    ok = ok && push_str(c, &s, "[") && push_ws(c, &s) && push(c, &s, KP_GE(KP_GE_REF, body)) && add_alt(c, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* "{" ws ( "}" | kv ws ("," ws kv ws)* "}" ), kv = key ws ":" ws value */
static uint32_t object_of(sc *c, uint32_t key, uint32_t value, const char *name) {
    uint32_t kv = kp_builder_rule(c->b, "%s:", name), more = kp_builder_rule(c->b, "%s,", name);
    uint32_t body = kp_builder_rule(c->b, "%s{}", name), r = kp_builder_rule(c->b, "%s", name);
    if (kv == UINT32_MAX || more == UINT32_MAX || body == UINT32_MAX || r == UINT32_MAX) return oom(c), UINT32_MAX;
    kp_gseq s = {0};
    bool ok = push(c, &s, KP_GE(KP_GE_REF, key)) && push_ws(c, &s) && push_str(c, &s, ":") && push_ws(c, &s) &&
              push(c, &s, KP_GE(KP_GE_REF, value)) && add_alt(c, kv, &s) &&
              push_str(c, &s, ",") && push_ws(c, &s) && push(c, &s, KP_GE(KP_GE_REF, kv)) && push_ws(c, &s) &&
              add_alt(c, more, &s) &&
              push_str(c, &s, "}") && add_alt(c, body, &s) &&
              push(c, &s, KP_GE(KP_GE_REF, kv)) && push_ws(c, &s) && push(c, &s, kp_builder_rep(c->b, more, 0, KP_GREP_INF)) &&
              push_str(c, &s, "}") && add_alt(c, body, &s) &&
              push_str(c, &s, "{") && push_ws(c, &s) && push(c, &s, KP_GE(KP_GE_REF, body)) && add_alt(c, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* Any JSON value. */
static uint32_t value_rule(sc *c) {
    if (c->r_value != UINT32_MAX) return c->r_value;
    uint32_t r = c->r_value = kp_builder_rule(c->b, "%s", "value");
    if (r == UINT32_MAX) return oom(c), UINT32_MAX;
    uint32_t str = string_rule(c, 0, KP_GREP_INF);
    uint32_t obj = c->r_obj = object_of(c, str, r, "object");
    uint32_t arr = array_of(c, r, 0, KP_GREP_INF, "array");
    bool ok = alt_ref(c, r, obj) && alt_ref(c, r, arr) && alt_ref(c, r, str) && alt_ref(c, r, num_rule(c)) &&
              (kp_builder_alt_str(c->b, r, "true") || oom(c)) && (kp_builder_alt_str(c->b, r, "false") || oom(c)) &&
              (kp_builder_alt_str(c->b, r, "null") || oom(c));
    return ok ? r : UINT32_MAX;
}

/* ---- formats ---- */

static bool alts_str(sc *c, uint32_t r, const char *const *v) {
    for (; *v; v++)
        if (!kp_builder_alt_str(c->b, r, *v)) return oom(c);
    return true;
}

/* YYYY-MM-DD with valid day counts. */
static uint32_t date_rule(sc *c) {
    if (c->r_date != UINT32_MAX) return c->r_date;
    kp_builder *b = c->b;
    uint32_t r = c->r_date = kp_builder_rule(b, "%s", "date");
    uint32_t m31 = kp_builder_rule(b, "%s", "month31"), m30 = kp_builder_rule(b, "%s", "month30");
    uint32_t d31 = kp_builder_rule(b, "%s", "day31"), d30 = kp_builder_rule(b, "%s", "day30"), d28 = kp_builder_rule(b, "%s", "day28");
    uint32_t md = kp_builder_rule(b, "%s", "month-day"), leap = kp_builder_rule(b, "%s", "leap-year");
    uint32_t dg = digit_rule(c);
    if (r == UINT32_MAX || m31 == UINT32_MAX || m30 == UINT32_MAX || d31 == UINT32_MAX || d30 == UINT32_MAX ||
        d28 == UINT32_MAX || md == UINT32_MAX || leap == UINT32_MAX || dg == UINT32_MAX)
        return oom(c), UINT32_MAX;
    static const char *const s_m31[] = {"01", "03", "05", "07", "08", "10", "12", NULL};
    static const char *const s_m30[] = {"04", "06", "09", "11", NULL};
    uint32_t D = KP_GE(KP_GE_REF, dg);
    kp_gseq s = {0};
    bool ok = alts_str(c, m31, s_m31) && alts_str(c, m30, s_m30) &&
              /* day31: 0[1-9] | [12][0-9] | 3[01]; day30: ... | 30; day28: 0[1-9] | 1[0-9] | 2[0-8] */
              push_str(c, &s, "0") && push(c, &s, set_term(c, "1-9")) && add_alt(c, d31, &s) &&
              push(c, &s, set_term(c, "12")) && push(c, &s, D) && add_alt(c, d31, &s) &&
              push_str(c, &s, "3") && push(c, &s, set_term(c, "01")) && add_alt(c, d31, &s) &&
              push_str(c, &s, "0") && push(c, &s, set_term(c, "1-9")) && add_alt(c, d30, &s) &&
              push(c, &s, set_term(c, "12")) && push(c, &s, D) && add_alt(c, d30, &s) &&
              push_str(c, &s, "30") && add_alt(c, d30, &s) &&
              push_str(c, &s, "0") && push(c, &s, set_term(c, "1-9")) && add_alt(c, d28, &s) &&
              push_str(c, &s, "1") && push(c, &s, D) && add_alt(c, d28, &s) &&
              push_str(c, &s, "2") && push(c, &s, set_term(c, "0-8")) && add_alt(c, d28, &s) &&
              /* month-day */
              push(c, &s, KP_GE(KP_GE_REF, m31)) && push_str(c, &s, "-") && push(c, &s, KP_GE(KP_GE_REF, d31)) &&
              add_alt(c, md, &s) &&
              push(c, &s, KP_GE(KP_GE_REF, m30)) && push_str(c, &s, "-") && push(c, &s, KP_GE(KP_GE_REF, d30)) &&
              add_alt(c, md, &s) &&
              push_str(c, &s, "02-") && push(c, &s, KP_GE(KP_GE_REF, d28)) && add_alt(c, md, &s) &&
              /* leap years: YY then a multiple of 4 other than 00, or a multiple of 4 then 00 */
              push(c, &s, D) && push(c, &s, D) && push_str(c, &s, "0") && push(c, &s, set_term(c, "48")) &&
              add_alt(c, leap, &s) &&
              push(c, &s, D) && push(c, &s, D) && push(c, &s, set_term(c, "2468")) && push(c, &s, set_term(c, "048")) &&
              add_alt(c, leap, &s) &&
              push(c, &s, D) && push(c, &s, D) && push(c, &s, set_term(c, "13579")) && push(c, &s, set_term(c, "26")) &&
              add_alt(c, leap, &s) &&
              push_str(c, &s, "0") && push(c, &s, set_term(c, "048")) && push_str(c, &s, "00") && add_alt(c, leap, &s) &&
              push(c, &s, set_term(c, "2468")) && push(c, &s, set_term(c, "048")) && push_str(c, &s, "00") &&
              add_alt(c, leap, &s) &&
              push(c, &s, set_term(c, "13579")) && push(c, &s, set_term(c, "26")) && push_str(c, &s, "00") &&
              add_alt(c, leap, &s) &&
              /* date */
              push(c, &s, D) && push(c, &s, D) && push(c, &s, D) && push(c, &s, D) && push_str(c, &s, "-") &&
              push(c, &s, KP_GE(KP_GE_REF, md)) && add_alt(c, r, &s) &&
              push(c, &s, KP_GE(KP_GE_REF, leap)) && push_str(c, &s, "-02-29") && add_alt(c, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* hh:mm:ss(.d{1,9})?(Z|[+-]hh:mm) */
static uint32_t time_rule(sc *c) {
    if (c->r_time != UINT32_MAX) return c->r_time;
    kp_builder *b = c->b;
    uint32_t r = c->r_time = kp_builder_rule(b, "%s", "time");
    uint32_t hh = kp_builder_rule(b, "%s", "hour"), sf = kp_builder_rule(b, "%s", "secfrac"), off = kp_builder_rule(b, "%s", "offset");
    uint32_t dg = digit_rule(c);
    if (r == UINT32_MAX || hh == UINT32_MAX || sf == UINT32_MAX || off == UINT32_MAX || dg == UINT32_MAX)
        return oom(c), UINT32_MAX;
    uint32_t D = KP_GE(KP_GE_REF, dg), H = KP_GE(KP_GE_REF, hh);
    kp_gseq s = {0};
    bool ok = push(c, &s, set_term(c, "01")) && push(c, &s, D) && add_alt(c, hh, &s) &&
              push_str(c, &s, "2") && push(c, &s, set_term(c, "0-3")) && add_alt(c, hh, &s) &&
              push_str(c, &s, ".") && push(c, &s, kp_builder_rep(b, dg, 1, 9)) && add_alt(c, sf, &s) &&
              push_str(c, &s, "Z") && add_alt(c, off, &s) &&
              push(c, &s, set_term(c, "-+")) && push(c, &s, H) && push_str(c, &s, ":") &&
              push(c, &s, set_term(c, "0-5")) && push(c, &s, D) && add_alt(c, off, &s) &&
              push(c, &s, H) && push_str(c, &s, ":") && push(c, &s, set_term(c, "0-5")) && push(c, &s, D) &&
              push_str(c, &s, ":") && push(c, &s, set_term(c, "0-5")) && push(c, &s, D) &&
              push(c, &s, kp_builder_rep(b, sf, 0, 1)) && push(c, &s, KP_GE(KP_GE_REF, off)) && add_alt(c, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* elem repeated lo..hi times, as one element. */
static uint32_t rep_of(sc *c, uint32_t elem, uint32_t lo, uint32_t hi) {
    uint32_t r = kp_builder_as_rule(c->b, elem);
    if (r == UINT32_MAX) return oom(c), UINT32_MAX;
    return kp_builder_rep(c->b, r, lo, hi);
}

/* A DNS label: an ASCII letter or digit, then up to 62 letters, digits or
 * hyphens (a hyphen last is let through: the grammar stays small). */
static bool push_label(sc *c, kp_gseq *s) {
    return push(c, s, set_term(c, "A-Za-z0-9")) && push(c, s, rep_of(c, set_term(c, "A-Za-z0-9-"), 0, 62));
}

/* hostname: label ("." label){0,126}; email: local "@" label ("." label)* "."
 * letters{2,24}; uri: scheme ":" then 1..2048 of RFC 3986's characters
 * (unreserved, reserved and "%"); ipv4: four decimal octets 0-255. */
static bool push_formats2(sc *c, kp_gseq *s, const char *fmt) {
    kp_builder *b = c->b;
    if (!strcmp(fmt, "hostname") || !strcmp(fmt, "email")) {
        if (!strcmp(fmt, "email") &&
            !(push(c, s, rep_of(c, set_term(c, "A-Za-z0-9!#$%&'*+/=?^_`{|}~.-"), 1, 64)) && push_str(c, s, "@")))
            return false;
        uint32_t more = kp_builder_rule(b, "%s", "dot-label");
        kp_gseq m = {0};
        bool ok = more != UINT32_MAX && push_str(c, &m, ".") && push_label(c, &m) && add_alt(c, more, &m);
        kp_gseq_free(&m);
        if (!ok || !push_label(c, s)) return false;
        if (!strcmp(fmt, "hostname")) return push(c, s, kp_builder_rep(b, more, 0, 126));
        return push(c, s, kp_builder_rep(b, more, 0, 126)) && push_str(c, s, ".") &&
               push(c, s, rep_of(c, set_term(c, "A-Za-z"), 2, 24));
    }
    if (!strcmp(fmt, "uri")) /* '"' and '\' are not among them: no escapes */
        return push(c, s, set_term(c, "A-Za-z")) && push(c, s, rep_of(c, set_term(c, "A-Za-z0-9+.-"), 0, 31)) &&
               push_str(c, s, ":") &&
               push(c, s, rep_of(c, set_term(c, "A-Za-z0-9._~:/?#[]@!$&'()*+,;=%-"), 1, 2048));
    /* ipv4 */
    uint32_t oct = kp_builder_rule(b, "%s", "dec-octet");
    kp_gseq o = {0};
    bool ok = oct != UINT32_MAX && push_str(c, &o, "25") && push(c, &o, set_term(c, "0-5")) && add_alt(c, oct, &o) &&
              push_str(c, &o, "2") && push(c, &o, set_term(c, "0-4")) && push(c, &o, set_term(c, "0-9")) &&
              add_alt(c, oct, &o) && push_str(c, &o, "1") && push(c, &o, set_term(c, "0-9")) &&
              push(c, &o, set_term(c, "0-9")) && add_alt(c, oct, &o) && push(c, &o, set_term(c, "1-9")) &&
              push(c, &o, set_term(c, "0-9")) && add_alt(c, oct, &o) && push(c, &o, set_term(c, "0-9")) &&
              add_alt(c, oct, &o);
    kp_gseq_free(&o);
    for (int i = 0; ok && i < 4; i++) ok = (i == 0 || push_str(c, s, ".")) && push(c, s, KP_GE(KP_GE_REF, oct));
    return ok;
}

/* The formats a string's grammar constrains; any other is an annotation
 * (JSON Schema's default) and the string is unconstrained. */
static bool format_known(const char *fs) {
    static const char *const known[] = {"date", "date-time", "time", "uuid", "email", "hostname", "uri", "ipv4", NULL};
    for (const char *const *k = known; *k; k++)
        if (!strcmp(fs, *k)) return true;
    return false;
}

static uint32_t format_rule(sc *c, const char *fmt) {
    kp_builder *b = c->b;
    uint32_t r = new_rule(c, "");
    if (r == UINT32_MAX) return UINT32_MAX;
    kp_gseq s = {0};
    bool ok = push_str(c, &s, "\"");
    if (strcmp(fmt, "time") == 0) {
        ok = ok && push(c, &s, KP_GE(KP_GE_REF, time_rule(c)));
    } else if (strcmp(fmt, "email") == 0 || strcmp(fmt, "hostname") == 0 || strcmp(fmt, "uri") == 0 ||
               strcmp(fmt, "ipv4") == 0) {
        ok = ok && push_formats2(c, &s, fmt);
    } else if (strcmp(fmt, "date") == 0) {
        ok = ok && push(c, &s, KP_GE(KP_GE_REF, date_rule(c)));
    } else if (strcmp(fmt, "date-time") == 0) {
        ok = ok && push(c, &s, KP_GE(KP_GE_REF, date_rule(c))) && push_str(c, &s, "T") &&
             push(c, &s, KP_GE(KP_GE_REF, time_rule(c)));
    } else {
        uint32_t hx = hex_rule(c);
        static const uint32_t groups[5] = {8, 4, 4, 4, 12};
        for (int i = 0; i < 5 && ok; i++)
            ok = (i == 0 || push_str(c, &s, "-")) && push(c, &s, kp_builder_rep(b, hx, groups[i], groups[i]));
    }
    ok = ok && c->st == KP_OK && push_str(c, &s, "\"") && add_alt(c, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* ---- literal values (enum, const) ---- */

static bool lit_string(sc *c, kp_gseq *s, const char *v, size_t n) {
    if (!push_str(c, s, "\"")) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)v[i];
        char e[8];
        const char *out = NULL;
        switch (ch) {
        case '"': out = "\\\""; break;
        case '\\': out = "\\\\"; break;
        case '\b': out = "\\b"; break;
        case '\f': out = "\\f"; break;
        case '\n': out = "\\n"; break;
        case '\r': out = "\\r"; break;
        case '\t': out = "\\t"; break;
        default:
            if (ch < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", ch);
                out = e;
            }
        }
        if (out ? !push_str(c, s, out) : !push(c, s, kp_builder_byte(c->b, ch))) return false;
    }
    return push_str(c, s, "\"");
}

static bool lit_value(sc *c, kp_gseq *s, const json_t *v, int depth) {
    if (depth > MAX_DEPTH) return fail(c, KP_ERANGE, "value nested deeper than %d (KP_GRAMMAR_MAX_NESTING)", MAX_DEPTH);
    char t[64];
    switch (json_typeof(v)) {
    case JSON_NULL: return push_str(c, s, "null");
    case JSON_TRUE: return push_str(c, s, "true");
    case JSON_FALSE: return push_str(c, s, "false");
    case JSON_INTEGER:
        snprintf(t, sizeof t, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return push_str(c, s, t);
    case JSON_REAL: {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 1e15) {
            snprintf(t, sizeof t, "%.0f", d);
        } else {
            for (int prec = 1; prec <= 17; prec++) {
                snprintf(t, sizeof t, "%.*g", prec, d);
                if (strtod(t, NULL) == d) break;
            }
        }
        return push_str(c, s, t);
    }
    case JSON_STRING: return lit_string(c, s, json_string_value(v), json_string_length(v));
    case JSON_ARRAY: {
        if (!push_str(c, s, "[") || !push_ws(c, s)) return false;
        for (size_t i = 0; i < json_array_size(v); i++)
            if ((i && (!push_str(c, s, ",") || !push_ws(c, s))) || !lit_value(c, s, json_array_get(v, i), depth + 1) ||
                !push_ws(c, s))
                return false;
        return push_str(c, s, "]");
    }
    case JSON_OBJECT: {
        if (!push_str(c, s, "{") || !push_ws(c, s)) return false;
        size_t i = 0;
        for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it), i++) {
            if ((i && (!push_str(c, s, ",") || !push_ws(c, s))) ||
                !lit_string(c, s, json_object_iter_key(it), json_object_iter_key_len(it)) || !push_ws(c, s) ||
                !push_str(c, s, ":") || !push_ws(c, s) || !lit_value(c, s, json_object_iter_value(it), depth + 1) ||
                !push_ws(c, s))
                return false;
        }
        return push_str(c, s, "}");
    }
    }
    return false;
}

static bool value_has_type(const json_t *v, unsigned types) {
    switch (json_typeof(v)) {
    case JSON_NULL: return types & T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return types & T_BOOL;
    case JSON_INTEGER: return types & (T_INT | T_NUM);
    case JSON_REAL: {
        double d = json_real_value(v);
        return (types & T_NUM) || ((types & T_INT) && d == floor(d));
    }
    case JSON_STRING: return types & T_STR;
    case JSON_ARRAY: return types & T_ARR;
    case JSON_OBJECT: return types & T_OBJ;
    }
    return false;
}

/* ---- schemas ---- */

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$comment",
                                          "readOnly", "writeOnly", "deprecated", "$defs", "definitions", NULL};
static const char *const keywords[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                       "items", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref",
                                       "minLength", "maxLength", "format", "$id", "minimum", "maximum",
                                       "exclusiveMinimum", "exclusiveMaximum", NULL};

static bool in_list(const char *k, const char *const *l) {
    for (; *l; l++)
        if (strcmp(k, *l) == 0) return true;
    return false;
}

static uint32_t comp(sc *c, const json_t *s);

static bool get_count(sc *c, const json_t *s, const char *kw, uint32_t *v) {
    const json_t *x = json_object_get(s, kw);
    if (!x) return true;
    if (json_is_real(x) && json_real_value(x) == floor(json_real_value(x)) && json_real_value(x) >= 0 &&
        json_real_value(x) <= KP_GRAMMAR_MAX_REPEAT) {
        *v = (uint32_t)json_real_value(x);
        return true;
    }
    if (!json_is_integer(x) || json_integer_value(x) < 0) return fail(c, KP_EINVAL, "'%s' must be a non-negative integer", kw);
    if (json_integer_value(x) > KP_GRAMMAR_MAX_REPEAT)
        return fail(c, KP_ERANGE, "'%s' %" JSON_INTEGER_FORMAT " is above the supported %u", kw, json_integer_value(x),
                    KP_GRAMMAR_MAX_REPEAT);
    *v = (uint32_t)json_integer_value(x);
    return true;
}

static bool parse_types(sc *c, const json_t *t, unsigned *out) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    *out = 0;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    if (json_is_array(t) && n == 0) return fail(c, KP_EINVAL, "'type' is an empty list");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(x)) return fail(c, KP_EINVAL, "'type' must be a string or a list of strings");
        unsigned bit = 0;
        for (int k = 0; k < 7; k++)
            if (strcmp(json_string_value(x), names[k]) == 0) bit = 1u << k;
        if (!bit) return fail(c, KP_EINVAL, "unknown type '%s'", json_string_value(x));
        *out |= bit;
    }
    return true;
}

/* Resolves a '#...' JSON pointer against the root. */
static const json_t *resolve(sc *c, const char *ref) {
    if (ref[0] != '#') {
        fail(c, KP_EUNSUPPORTED, "$ref '%s' is not a '#' pointer into this schema", ref);
        return NULL;
    }
    const json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        fail(c, KP_EUNSUPPORTED, "$ref '%s' (anchors are not supported)", ref);
        return NULL;
    }
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1')) {
                ch = *p++ == '0' ? '~' : '/';
            } else if (ch == '%' && p[0] && p[1]) {
                char hx[3] = {p[0], p[1], 0};
                char *e;
                long v = strtol(hx, &e, 16);
                if (*e == 0) {
                    ch = (char)v;
                    p += 2;
                }
            }
            if (n + 1 < sizeof seg) seg[n++] = ch;
        }
        seg[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_getn(cur, seg, n);
        } else if (json_is_array(cur)) {
            char *e;
            unsigned long i = strtoul(seg, &e, 10);
            cur = (*e || !n) ? NULL : json_array_get(cur, i);
        } else {
            cur = NULL;
        }
        if (!cur) {
            fail(c, KP_EINVAL, "$ref '%s' points to nothing", ref);
            return NULL;
        }
    }
    return cur;
}

static uint32_t comp_ref(sc *c, const json_t *target, const char *ref) {
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == target) return c->refs[i].rule;
    char saved[sizeof c->path];
    size_t saved_len = c->plen;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref);
    c->plen = strlen(c->path);
    uint32_t r = new_rule(c, "");
    if (r != UINT32_MAX) {
        if (!kp_grow_u32((void **)&c->refs, &c->cap_refs, c->n_refs + 1, sizeof *c->refs)) {
            oom(c);
            r = UINT32_MAX;
        }
        if (r != UINT32_MAX) {
            c->refs[c->n_refs++] = (refmemo){target, r};
            uint32_t body = comp(c, target);
            if (!alt_ref(c, r, body)) r = UINT32_MAX;
        }
    }
    memcpy(c->path, saved, sizeof saved);
    c->plen = saved_len;
    return r;
}

/* The key grammar of additional properties: any string key except the
 * declared names, written without escapes until it differs from all of
 * them. A trie of the names' code points; each node is a rule. */
typedef struct {
    uint32_t *cp;
    size_t n;
} cps;

static uint32_t key_excluding(sc *c, cps *names, size_t n_names, size_t depth, size_t lo, size_t hi, bool *ok);

static int cmp_cps(const void *a, const void *b) {
    const cps *x = a, *y = b;
    for (size_t i = 0; i < x->n && i < y->n; i++)
        if (x->cp[i] != y->cp[i]) return x->cp[i] < y->cp[i] ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* names[lo..hi) share their first `depth` code points (sorted). */
static uint32_t key_excluding(sc *c, cps *names, size_t n_names, size_t depth, size_t lo, size_t hi, bool *ok) {
    uint32_t r = new_rule(c, "/key");
    uint32_t ch = char_rule(c);
    if (r == UINT32_MAX || ch == UINT32_MAX || depth > MAX_NAME) {
        if (depth > MAX_NAME) fail(c, KP_ERANGE, "property name longer than %d characters", MAX_NAME);
        *ok = false;
        return UINT32_MAX;
    }
    bool is_end = false;
    kp_gcrange *kids = malloc((hi - lo + 4) * sizeof *kids);
    size_t n_kids = 0;
    if (!kids) {
        oom(c);
        *ok = false;
        return UINT32_MAX;
    }
    kp_gseq s = {0};
    for (size_t i = lo; i < hi && *ok;) {
        if (names[i].n == depth) {
            is_end = true;
            i++;
            continue;
        }
        uint32_t cp = names[i].cp[depth];
        size_t j = i;
        while (j < hi && names[j].n > depth && names[j].cp[depth] == cp) j++;
        if (cp >= 0x20 && cp != '"' && cp != '\\') kids[n_kids++] = (kp_gcrange){cp, cp};
        uint8_t u[4];
        size_t nu = kp_unicode_encode(cp, u);
        uint32_t sub = key_excluding(c, names, n_names, depth + 1, i, j, ok);
        if (*ok) {
            json_t *one = json_stringn((const char *)u, nu);
            /* the child's canonical spelling: raw, or its escape */
            kp_gseq lit = {0};
            *ok = one && lit_string(c, &lit, json_string_value(one), json_string_length(one));
            json_decref(one);
            if (*ok)
                for (uint32_t k = 1; k + 1 < lit.n && *ok; k++) *ok = push(c, &s, lit.v[k]);
            kp_gseq_free(&lit);
            *ok = *ok && push(c, &s, KP_GE(KP_GE_REF, sub)) && add_alt(c, r, &s);
        }
        i = j;
    }
    /* leave the trie with a raw character that is no child, then anything */
    if (*ok) {
        kids[n_kids++] = (kp_gcrange){0, 0x1F};
        kids[n_kids++] = (kp_gcrange){'"', '"'};
        kids[n_kids++] = (kp_gcrange){'\\', '\\'};
        uint32_t leave;
        *ok = (kp_builder_class(c->b, kids, n_kids, true, &leave) || oom(c)) && push(c, &s, leave) &&
              push(c, &s, kp_builder_rep(c->b, ch, 0, KP_GREP_INF)) && push_str(c, &s, "\"") && add_alt(c, r, &s);
    }
    if (*ok && !is_end) *ok = push_str(c, &s, "\"") && add_alt(c, r, &s);
    kp_gseq_free(&s);
    free(kids);
    (void)n_names;
    return *ok ? r : UINT32_MAX;
}

static bool decode_cps(sc *c, const char *s, size_t n, cps *out) {
    out->cp = malloc((n + 1) * sizeof *out->cp);
    out->n = 0;
    if (!out->cp) return oom(c);
    for (size_t i = 0; i < n;) {
        size_t used;
        out->cp[out->n++] = kp_unicode_decode_lenient((const uint8_t *)s + i, n - i, &used);
        i += used;
    }
    return true;
}

typedef struct {
    const char *name;
    size_t len;
    const json_t *schema;
    bool required, declared; /* declared: in properties (else: required only) */
} prop;

/* An object schema being compiled: its properties (the declared ones
 * and those required but undeclared, which take the additional schema),
 * the keys additional properties may not use, and the rules made. */
typedef struct {
    const json_t *props, *req, *ap;
    bool ap_allowed;
    prop *pv;       /* the properties that may appear, np of them */
    size_t np;
    cps *excl;      /* every named key, decoded: additional keys are none of them */
    size_t n_excl;
    uint32_t *val;  /* each property's value rule */
    uint32_t *F, *N; /* the chain of rules: F[i] the members from property i on, first;
                        N[i] the same after a comma */
} obj;

/* The properties of o: the declared ones (false: excluded from additional
 * keys only), then the required ones, marked or added. */
static bool obj_props(sc *c, obj *o) {
    for (void *it = o->props ? json_object_iter((json_t *)o->props) : NULL; it;
         it = json_object_iter_next((json_t *)o->props, it)) {
        const char *k = json_object_iter_key(it);
        size_t kl = json_object_iter_key_len(it);
        if (!decode_cps(c, k, kl, &o->excl[o->n_excl])) return false;
        o->n_excl++;
        const json_t *ps = json_object_iter_value(it);
        if (json_is_false(ps)) continue; /* may not appear: excluded from additional keys only */
        o->pv[o->np++] = (prop){k, kl, ps, false, true};
    }
    for (size_t i = 0; i < (o->req ? json_array_size(o->req) : 0); i++) {
        const json_t *x = json_array_get(o->req, i);
        if (!json_is_string(x)) return fail(c, KP_EINVAL, "'required' must be a list of strings"), false;
        const char *k = json_string_value(x);
        size_t kl = json_string_length(x), j;
        for (j = 0; j < o->np; j++)
            if (o->pv[j].len == kl && memcmp(o->pv[j].name, k, kl) == 0) break;
        if (j < o->np) {
            o->pv[j].required = true;
            continue;
        }
        const json_t *declared = o->props ? json_object_getn(o->props, k, kl) : NULL;
        if (declared || !o->ap_allowed)
            return fail(c, KP_EINVAL, "required property '%s' can never be present (%s)", k,
                        declared ? "its schema is false" : "not in properties and additionalProperties is false"),
                   false;
        /* required but undeclared: a declared property with the additional schema */
        if (!decode_cps(c, k, kl, &o->excl[o->n_excl])) return false;
        o->n_excl++;
        o->pv[o->np++] = (prop){k, kl, o->ap ? o->ap : json_true(), true, false};
    }
    return true;
}

/* The value rule of each property. */
static bool obj_values(sc *c, obj *o) {
    for (size_t i = 0; i < o->np; i++) {
        size_t old = path_pushs(c, o->pv[i].declared ? "properties" : "additionalProperties");
        if (o->pv[i].declared) path_push(c, o->pv[i].name, o->pv[i].len);
        o->val[i] = comp(c, o->pv[i].schema);
        path_pop(c, old);
        if (o->val[i] == UINT32_MAX) return false;
    }
    return true;
}

/* The rule of one additional member (a key none of the named ones, its
 * value of the additional schema) into *kva. */
static bool obj_additional(sc *c, obj *o, kp_gseq *sq, uint32_t *kva) {
    size_t old = path_pushs(c, "additionalProperties");
    uint32_t av = comp(c, o->ap ? o->ap : json_true());
    path_pop(c, old);
    if (av == UINT32_MAX) return false;
    uint32_t key;
    if (o->n_excl == 0) {
        key = string_rule(c, 0, KP_GREP_INF);
    } else {
        qsort(o->excl, o->n_excl, sizeof *o->excl, cmp_cps);
        bool ok = true;
        uint32_t inner = key_excluding(c, o->excl, o->n_excl, 0, 0, o->n_excl, &ok);
        key = new_rule(c, "/key\"");
        if (!ok || key == UINT32_MAX || !push_str(c, sq, "\"") || !push(c, sq, KP_GE(KP_GE_REF, inner)) ||
            !add_alt(c, key, sq))
            return false;
    }
    *kva = new_rule(c, "/additional");
    return key != UINT32_MAX && *kva != UINT32_MAX && push(c, sq, KP_GE(KP_GE_REF, key)) && push_ws(c, sq) &&
           push_str(c, sq, ":") && push_ws(c, sq) && push(c, sq, KP_GE(KP_GE_REF, av)) && add_alt(c, *kva, sq);
}

/* The F_i / N_i chain, built from the end: the properties in their order,
 * each optional unless required, then any additional members. */
static bool obj_chain(sc *c, obj *o, kp_gseq *sq, uint32_t kva) {
    size_t np = o->np;
    uint32_t *F = o->F, *N = o->N;
    F[np] = new_rule(c, "/F-end");
    N[np] = new_rule(c, "/N-end");
    if (F[np] == UINT32_MAX || N[np] == UINT32_MAX) return false;
    if (o->ap_allowed) {
        uint32_t more = new_rule(c, "/additional,");
        if (more == UINT32_MAX || !push_str(c, sq, ",") || !push_ws(c, sq) || !push(c, sq, KP_GE(KP_GE_REF, kva)) ||
            !push_ws(c, sq) || !add_alt(c, more, sq) || !push(c, sq, KP_GE(KP_GE_REF, kva)) || !push_ws(c, sq) ||
            !push(c, sq, kp_builder_rep(c->b, more, 0, KP_GREP_INF)) || !add_alt(c, F[np], sq) ||
            !push(c, sq, kp_builder_rep(c->b, more, 0, KP_GREP_INF)) || !add_alt(c, N[np], sq))
            return false;
    } else if (!add_alt(c, N[np], sq)) {
        return false;
    }
    if (!add_alt(c, F[np], sq)) return false; /* nothing at all */
    for (size_t i = np; i-- > 0;) {
        F[i] = new_rule(c, "/F");
        N[i] = new_rule(c, "/N");
        uint32_t kv = new_rule(c, "/kv");
        if (F[i] == UINT32_MAX || N[i] == UINT32_MAX || kv == UINT32_MAX) return false;
        if (!lit_string(c, sq, o->pv[i].name, o->pv[i].len) || !push_ws(c, sq) || !push_str(c, sq, ":") ||
            !push_ws(c, sq) || !push(c, sq, KP_GE(KP_GE_REF, o->val[i])) || !add_alt(c, kv, sq) ||
            !push(c, sq, KP_GE(KP_GE_REF, kv)) || !push_ws(c, sq) || !push(c, sq, KP_GE(KP_GE_REF, N[i + 1])) ||
            !add_alt(c, F[i], sq) || !push_str(c, sq, ",") || !push_ws(c, sq) || !push(c, sq, KP_GE(KP_GE_REF, kv)) ||
            !push_ws(c, sq) || !push(c, sq, KP_GE(KP_GE_REF, N[i + 1])) || !add_alt(c, N[i], sq))
            return false;
        if (!o->pv[i].required && (!alt_ref(c, F[i], F[i + 1]) || !alt_ref(c, N[i], N[i + 1]))) return false;
    }
    return true;
}

static uint32_t object_rule(sc *c, const json_t *s) {
    obj o = {0};
    o.props = json_object_get(s, "properties");
    o.req = json_object_get(s, "required");
    o.ap = json_object_get(s, "additionalProperties");
    if (o.props && !json_is_object(o.props)) return fail(c, KP_EINVAL, "'properties' must be an object"), UINT32_MAX;
    if (o.req && !json_is_array(o.req)) return fail(c, KP_EINVAL, "'required' must be a list of strings"), UINT32_MAX;
    if (o.ap && !json_is_object(o.ap) && !json_is_boolean(o.ap))
        return fail(c, KP_EINVAL, "'additionalProperties' must be a schema"), UINT32_MAX;
    o.ap_allowed = !o.ap || json_is_true(o.ap) || json_is_object(o.ap);
    if ((o.props ? json_object_size(o.props) : 0) > KP_SCHEMA_MAX_PROPERTIES ||
        (o.req ? json_array_size(o.req) : 0) > KP_SCHEMA_MAX_PROPERTIES)
        return fail(c, KP_ERANGE, "the object has %zu properties; at most %d (KP_SCHEMA_MAX_PROPERTIES)",
                    o.props && json_object_size(o.props) > KP_SCHEMA_MAX_PROPERTIES ? json_object_size(o.props)
                                                                                  : json_array_size(o.req),
                    KP_SCHEMA_MAX_PROPERTIES),
               UINT32_MAX;
    size_t most = (o.props ? json_object_size(o.props) : 0) + (o.req ? json_array_size(o.req) : 0);
    o.pv = calloc(most + 1, sizeof *o.pv);
    o.excl = calloc(most + 1, sizeof *o.excl);
    o.val = calloc(most + 1, sizeof *o.val);
    o.F = malloc((most + 2) * sizeof *o.F);
    o.N = malloc((most + 2) * sizeof *o.N);
    uint32_t result = UINT32_MAX, kva = UINT32_MAX;
    kp_gseq sq = {0};
    if (!o.pv || !o.excl || !o.val || !o.F || !o.N) oom(c);
    else if (obj_props(c, &o) && obj_values(c, &o) && (!o.ap_allowed || obj_additional(c, &o, &sq, &kva)) &&
             obj_chain(c, &o, &sq, kva)) {
        result = new_rule(c, "{");
        if (result == UINT32_MAX || !push_str(c, &sq, "{") || !push_ws(c, &sq) ||
            !push(c, &sq, KP_GE(KP_GE_REF, o.F[0])) || !push_str(c, &sq, "}") || !add_alt(c, result, &sq))
            result = UINT32_MAX;
    }
    kp_gseq_free(&sq);
    for (size_t i = 0; o.excl && i < o.n_excl; i++) free(o.excl[i].cp);
    free(o.excl);
    free(o.pv);
    free(o.val);
    free(o.F);
    free(o.N);
    return c->st == KP_OK ? result : UINT32_MAX;
}

static uint32_t array_rule(sc *c, const json_t *s) {
    const json_t *items = json_object_get(s, "items");
    uint32_t min = 0, max = KP_GREP_INF;
    if (!get_count(c, s, "minItems", &min) || !get_count(c, s, "maxItems", &max)) return UINT32_MAX;
    if (max < min) return fail(c, KP_EINVAL, "minItems %u is above maxItems %u: no array fits", min, max), UINT32_MAX;
    uint32_t item = UINT32_MAX;
    if (items && json_is_array(items))
        return fail(c, KP_EUNSUPPORTED, "'items' as a list (tuple validation) is not supported"), UINT32_MAX;
    if (items && json_is_false(items)) {
        if (min > 0) return fail(c, KP_EINVAL, "items is false but minItems is %u", min), UINT32_MAX;
        max = 0;
    } else {
        size_t old = path_pushs(c, "items");
        item = comp(c, items ? items : json_true());
        path_pop(c, old);
        if (item == UINT32_MAX) return UINT32_MAX;
    }
    return array_of(c, item, min, max, "");
}

static uint32_t string_kw(sc *c, const json_t *s) {
    uint32_t min = 0, max = KP_GREP_INF;
    if (!get_count(c, s, "minLength", &min) || !get_count(c, s, "maxLength", &max)) return UINT32_MAX;
    const json_t *f = json_object_get(s, "format");
    if (f) {
        if (!json_is_string(f)) return fail(c, KP_EINVAL, "'format' must be a string"), UINT32_MAX;
        const char *fs = json_string_value(f);
        if (!format_known(fs)) return string_rule(c, min, max); /* an annotation only */
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return fail(c, KP_EUNSUPPORTED, "'format' together with minLength/maxLength is not supported"), UINT32_MAX;
        return format_rule(c, fs);
    }
    if (max < min) return fail(c, KP_EINVAL, "minLength %u is above maxLength %u: no string fits", min, max), UINT32_MAX;
    return string_rule(c, min, max);
}

/* The numeric bounds of s: *has when it has any; the lowest and highest
 * value and whether each is exclusive, clamped to what the grammars write
 * (|x| <= KP_GNUM_MAX). A number's bounds must be integers; an integer's
 * are rounded inward. */
static bool num_bounds(sc *c, const json_t *s, bool integer, bool *has, int64_t *lo, bool *lo_excl, int64_t *hi,
                       bool *hi_excl) {
    static const char *const names[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    const json_t *k[4];
    *has = false;
    for (int i = 0; i < 4; i++) {
        k[i] = json_object_get(s, names[i]);
        if (!k[i]) continue;
        *has = true;
        bool draft4 = (i == 1 || i == 3) && json_is_boolean(k[i]);
        if (!json_is_number(k[i]) && !draft4)
            return fail(c, KP_EINVAL, "'%s' must be a number%s", names[i], i % 2 ? " (or draft 4's boolean)" : "");
        if (draft4 && !k[i - 1])
            return fail(c, KP_EINVAL, "'%s': true needs '%s' beside it", names[i], names[i - 1]);
    }
    double bound[2] = {-(double)KP_GNUM_MAX, (double)KP_GNUM_MAX};
    bool excl[2] = {false, false};
    for (int side = 0; side < 2; side++) {
        const json_t *inc = k[2 * side], *ex = k[2 * side + 1];
        bool ex_flag = ex && json_is_boolean(ex);
        for (int j = 0; j < 2; j++) {
            const json_t *v = j ? ex : inc;
            if (!v || !json_is_number(v)) continue;
            double x = json_number_value(v);
            bool e = j == 1 || (ex_flag && json_is_true(ex));
            if (!isfinite(x)) return fail(c, KP_EINVAL, "'%s' is not a finite number", names[2 * side + j]);
            if (x != floor(x)) {
                if (!integer)
                    return fail(c, KP_EUNSUPPORTED,
                                "a fractional '%s' (%g) is not supported for numbers (integer bounds are)",
                                names[2 * side + j], x);
                x = side == 0 ? ceil(x) : floor(x); /* an integer above 0.5 is one at or above 1 */
                e = false;
            }
            /* the tighter of minimum and exclusiveMinimum (maximum, ...) */
            bool tighter = side == 0 ? (x > bound[0] || (x == bound[0] && e)) : (x < bound[1] || (x == bound[1] && e));
            if (tighter) {
                bound[side] = x;
                excl[side] = e;
            }
        }
    }
    if (bound[0] > (double)KP_GNUM_MAX || bound[1] < -(double)KP_GNUM_MAX)
        return fail(c, KP_EUNSUPPORTED, "bounds beyond %lld in magnitude are not supported", (long long)KP_GNUM_MAX);
    if (bound[0] < -(double)KP_GNUM_MAX) bound[0] = -(double)KP_GNUM_MAX, excl[0] = false;
    if (bound[1] > (double)KP_GNUM_MAX) bound[1] = (double)KP_GNUM_MAX, excl[1] = false;
    *lo = (int64_t)bound[0];
    *hi = (int64_t)bound[1];
    *lo_excl = excl[0];
    *hi_excl = excl[1];
    return true;
}

/* A number or integer in s's bounds; num_rule / int_rule when it has none. */
static uint32_t bounded_num(sc *c, const json_t *s, bool integer) {
    bool has = false, lo_excl = false, hi_excl = false, empty = false;
    int64_t lo = 0, hi = 0;
    if (!num_bounds(c, s, integer, &has, &lo, &lo_excl, &hi, &hi_excl)) return UINT32_MAX;
    if (!has) return integer ? int_rule(c) : num_rule(c);
    uint32_t r = new_rule(c, integer ? "<integer>" : "<number>");
    if (r == UINT32_MAX) return UINT32_MAX;
    if (!kp_gnum_range(c->b, r, lo, lo_excl, hi, hi_excl, integer, &empty)) return oom(c), UINT32_MAX;
    if (empty)
        return fail(c, KP_EINVAL, "no %s is %s %lld and %s %lld", integer ? "integer" : "number",
                    lo_excl ? "above" : "at least", (long long)lo, hi_excl ? "below" : "at most", (long long)hi),
               UINT32_MAX;
    return r;
}

/* The first constraint keyword of s other than those in allowed. */
static const char *other_keyword(const json_t *s, const char *const *allowed) {
    for (void *it = json_object_iter((json_t *)s); it; it = json_object_iter_next((json_t *)s, it)) {
        const char *k = json_object_iter_key(it);
        if (!in_list(k, annotations) && !in_list(k, allowed) && strcmp(k, "$id") != 0) return k;
    }
    return NULL;
}

static uint32_t comp_body(sc *c, const json_t *s) {
    if (json_is_true(s)) return value_rule(c);
    if (json_is_false(s)) return fail(c, KP_EINVAL, "the schema is false: no value fits"), UINT32_MAX;
    if (!json_is_object(s)) return fail(c, KP_EINVAL, "a schema must be an object or a boolean"), UINT32_MAX;
    for (void *it = json_object_iter((json_t *)s); it; it = json_object_iter_next((json_t *)s, it)) {
        const char *k = json_object_iter_key(it);
        if (in_list(k, annotations)) continue;
        if (!in_list(k, keywords)) return fail(c, KP_EUNSUPPORTED, "unsupported keyword '%s'", k), UINT32_MAX;
        if (strcmp(k, "$id") == 0 && s != c->root)
            return fail(c, KP_EUNSUPPORTED, "'$id' inside a subschema is not supported"), UINT32_MAX;
    }
    const json_t *x;
    const char *other;
    if ((x = json_object_get(s, "$ref"))) {
        static const char *const ok[] = {"$ref", NULL};
        if ((other = other_keyword(s, ok)))
            return fail(c, KP_EUNSUPPORTED, "'$ref' together with '%s' is not supported", other), UINT32_MAX;
        if (!json_is_string(x)) return fail(c, KP_EINVAL, "'$ref' must be a string"), UINT32_MAX;
        const json_t *t = resolve(c, json_string_value(x));
        return t ? comp_ref(c, t, json_string_value(x)) : UINT32_MAX;
    }
    static const char *const combi[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) {
        if (!(x = json_object_get(s, combi[k]))) continue;
        const char *ok[] = {combi[k], NULL};
        if ((other = other_keyword(s, ok)))
            return fail(c, KP_EUNSUPPORTED, "'%s' together with '%s' is not supported", combi[k], other), UINT32_MAX;
        if (!json_is_array(x) || json_array_size(x) == 0)
            return fail(c, KP_EINVAL, "'%s' must be a non-empty list of schemas", combi[k]), UINT32_MAX;
        if (json_array_size(x) > KP_SCHEMA_MAX_ANYOF)
            return fail(c, KP_ERANGE, "'%s' has %zu branches; at most %d (KP_SCHEMA_MAX_ANYOF)", combi[k],
                        json_array_size(x), KP_SCHEMA_MAX_ANYOF),
                   UINT32_MAX;
        size_t old = path_pushs(c, combi[k]);
        if (k == 2) {
            if (json_array_size(x) != 1) {
                fail(c, KP_EUNSUPPORTED, "'allOf' with %zu schemas is not supported (only one)", json_array_size(x));
                path_pop(c, old);
                return UINT32_MAX;
            }
            size_t old2 = path_pushi(c, 0);
            uint32_t r = comp(c, json_array_get(x, 0));
            path_pop(c, old2);
            path_pop(c, old);
            return r;
        }
        uint32_t r = new_rule(c, "");
        size_t n_ok = 0;
        for (size_t i = 0; i < json_array_size(x) && r != UINT32_MAX; i++) {
            const json_t *br = json_array_get(x, i);
            if (json_is_false(br)) continue;
            size_t old2 = path_pushi(c, i);
            uint32_t sub = comp(c, br);
            path_pop(c, old2);
            if (!alt_ref(c, r, sub)) r = UINT32_MAX;
            n_ok++;
        }
        path_pop(c, old);
        if (r != UINT32_MAX && n_ok == 0) return fail(c, KP_EINVAL, "every branch of '%s' is false", combi[k]), UINT32_MAX;
        return r;
    }
    unsigned types = T_ALL;
    if ((x = json_object_get(s, "type")) && !parse_types(c, x, &types)) return UINT32_MAX;
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        static const char *const ok[] = {"enum", "const", "type", NULL};
        if ((other = other_keyword(s, ok)))
            return fail(c, KP_EUNSUPPORTED, "'%s' together with '%s' is not supported", en ? "enum" : "const", other),
                   UINT32_MAX;
        if (en && cn) return fail(c, KP_EUNSUPPORTED, "'enum' together with 'const' is not supported"), UINT32_MAX;
        if (en && !json_is_array(en)) return fail(c, KP_EINVAL, "'enum' must be a list"), UINT32_MAX;
        if (en && json_array_size(en) > KP_SCHEMA_MAX_ENUM)
            return fail(c, KP_ERANGE, "'enum' has %zu values; at most %d (KP_SCHEMA_MAX_ENUM)", json_array_size(en),
                        KP_SCHEMA_MAX_ENUM),
                   UINT32_MAX;
        uint32_t r = new_rule(c, "");
        size_t n = en ? json_array_size(en) : 1, n_ok = 0;
        kp_gseq sq = {0};
        for (size_t i = 0; i < n && r != UINT32_MAX; i++) {
            const json_t *v = en ? json_array_get(en, i) : cn;
            if (!value_has_type(v, types)) continue;
            if (!lit_value(c, &sq, v, 0) || !add_alt(c, r, &sq)) r = UINT32_MAX;
            n_ok++;
        }
        kp_gseq_free(&sq);
        if (r != UINT32_MAX && n_ok == 0)
            return fail(c, KP_EINVAL, "no '%s' value has the schema's type", en ? "enum" : "const"), UINT32_MAX;
        return r;
    }
    if ((types & T_NUM) && (types & T_INT)) types &= ~(unsigned)T_INT;
    uint32_t r = new_rule(c, "");
    if (r == UINT32_MAX) return UINT32_MAX;
    bool ok = true;
    if (ok && (types & T_OBJ)) ok = alt_ref(c, r, object_rule(c, s));
    if (ok && (types & T_ARR)) ok = alt_ref(c, r, array_rule(c, s));
    if (ok && (types & T_STR)) ok = alt_ref(c, r, string_kw(c, s));
    if (ok && (types & T_NUM)) ok = alt_ref(c, r, bounded_num(c, s, false));
    if (ok && (types & T_INT)) ok = alt_ref(c, r, bounded_num(c, s, true));
    if (ok && (types & T_BOOL)) ok = (kp_builder_alt_str(c->b, r, "true") && kp_builder_alt_str(c->b, r, "false")) || oom(c);
    if (ok && (types & T_NULL)) ok = kp_builder_alt_str(c->b, r, "null") || oom(c);
    return ok ? r : UINT32_MAX;
}

static uint32_t comp(sc *c, const json_t *s) {
    if (c->st != KP_OK) return UINT32_MAX;
    if (++c->depth > MAX_DEPTH) {
        fail(c, KP_ERANGE, "schema nested deeper than %d (KP_GRAMMAR_MAX_NESTING)", MAX_DEPTH);
        c->depth--;
        return UINT32_MAX;
    }
    uint32_t r = comp_body(c, s);
    c->depth--;
    if (r == UINT32_MAX && c->st == KP_OK) oom(c);
    return r;
}

static kp_status compile(const json_t *schema, const kp_schema_opts *o, bool any_object, kp_grammar **out,
                         kp_error *err) {
    if (!out || (!schema && !any_object)) return kp_fail(err, KP_EINVAL, "json schema: NULL argument");
    *out = NULL;
    kp_schema_opts d = kp_schema_opts_default();
    if (!o) o = &d;
    if ((o->prefix_len && !o->prefix) || (o->suffix_len && !o->suffix))
        return kp_fail(err, KP_EINVAL, "json schema: NULL prefix or suffix with a length");
    if (o->ws_max < 0 || o->ws_max > (int)KP_GRAMMAR_MAX_REPEAT)
        return kp_fail(err, KP_EINVAL, "json schema: ws_max %d outside 0..%u", o->ws_max, KP_GRAMMAR_MAX_REPEAT);
    kp_builder b;
    kp_builder_init(&b);
    b.stop = o->stop;
    sc c = {.b = &b, .root = schema, .err = err, .st = KP_OK, .ws_max = (uint32_t)o->ws_max};
    c.r_wsch = c.r_char = c.r_string = c.r_digit = c.r_hex = c.r_int = c.r_num = c.r_value = c.r_obj = c.r_date =
        c.r_time = UINT32_MAX;
    snprintf(c.path, sizeof c.path, "#");
    c.plen = 1;
    uint32_t root = kp_builder_rule(&b, "%s", "root");
    uint32_t v = UINT32_MAX;
    if (root == UINT32_MAX) {
        oom(&c);
    } else if (any_object) {
        if (value_rule(&c) != UINT32_MAX) v = c.r_obj;
    } else {
        v = comp(&c, schema);
    }
    kp_gseq s = {0};
    if (c.st == KP_OK && v != UINT32_MAX &&
        !(push_bytes(&c, &s, o->prefix, o->prefix_len) && (o->no_outer_ws || push_ws(&c, &s)) &&
          push(&c, &s, KP_GE(KP_GE_REF, v)) && (o->no_outer_ws || push_ws(&c, &s)) &&
          push_bytes(&c, &s, o->suffix, o->suffix_len) && add_alt(&c, root, &s)))
        oom(&c);
    kp_gseq_free(&s);
    free(c.refs);
    if (c.st == KP_OK && v == UINT32_MAX) oom(&c);
    if (c.st != KP_OK) {
        kp_builder_free(&b);
        return c.st;
    }
    return kp_builder_finish(&b, root, out, err);
}

kp_status kp_grammar_compile_schema(const json_t *schema, const kp_schema_opts *o, kp_grammar **out, kp_error *err) {
    return compile(schema, o, false, out, err);
}

kp_status kp_grammar_json_object(const kp_schema_opts *o, kp_grammar **out, kp_error *err) {
    return compile(NULL, o, true, out, err);
}

uint32_t kp_schema_into(kp_builder *b, const json_t *schema, int ws_max, kp_status *st, kp_error *err) {
    sc c = {.b = b, .root = schema, .err = err, .st = KP_OK, .ws_max = (uint32_t)(ws_max < 0 ? 0 : ws_max)};
    c.r_wsch = c.r_char = c.r_string = c.r_digit = c.r_hex = c.r_int = c.r_num = c.r_value = c.r_obj = c.r_date =
        c.r_time = UINT32_MAX;
    snprintf(c.path, sizeof c.path, "#");
    c.plen = 1;
    uint32_t v = comp(&c, schema);
    free(c.refs);
    if (c.st == KP_OK && v == UINT32_MAX) oom(&c);
    *st = c.st;
    return c.st == KP_OK ? v : UINT32_MAX;
}
