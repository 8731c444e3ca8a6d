/*
 * gbnf.c - llama.cpp's GBNF grammar format into the builder (gram_impl.h).
 *
 * A recursive-descent parser following llama.cpp's grammar-parser: a file
 * is rules `name ::= alternates` ended by a newline; inside ( ) and after
 * '|' newlines are whitespace; '#' starts a comment to the end of the
 * line. Sequences hold "literals", [classes] ([^...] negated, a-z ranges),
 * rule names, ( groups ) and '.', each optionally followed by * + ? {m}
 * {m,} {m,n}, which apply to the item just before (a whole literal, a
 * whole group). Literal and class characters are code points (UTF-8 in the
 * text, or \x \u \U escapes) and match their UTF-8 encoding.
 *
 * Groups and repeated multi-element items become generated rules named
 * "parent(n)", which cannot collide with user names (parentheses are not
 * name characters). A postfix operator becomes one REP element.
 *
 * Limits (grammar.h), each a KP_ERANGE at the place it is hit: groups
 * nested at most KP_GRAMMAR_MAX_NESTING deep (the parser recurses once per
 * group, so this also bounds its stack), at most KP_GRAMMAR_MAX_RULES rules
 * and groups, at most KP_GRAMMAR_MAX_ALTS alternatives in one of them. The
 * parser is linear in the text (the builder's lookups are hashed); the
 * analyses after it too (ganalyse.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/unicode.h"
#include "grammar/gram_impl.h"

typedef struct {
    const char *start, *end;
    kp_builder *b;
    kp_error *err;
    kp_status st;
    uint32_t n_gen;
    uint32_t n_rules; /* defined rules and groups, against KP_GRAMMAR_MAX_RULES */
    int depth;        /* groups open, against KP_GRAMMAR_MAX_NESTING */
} gp;

static bool fail_at(gp *g, const char *at, kp_status code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool fail_at(gp *g, const char *at, kp_status code, const char *fmt, ...) {
    if (g->st != KP_OK) return false;
    int line = 1, col = 1;
    for (const char *q = g->start; q < at && q < g->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->st = kp_fail(g->err, code, "gbnf:%d:%d: %s", line, col, msg);
    return false;
}

/* A push or add failed: stopped, too big or out of memory. */
static bool oom(gp *g) {
    if (g->st == KP_OK) g->st = kp_builder_failure(g->b, "gbnf", g->err);
    return false;
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static const char *skip(const gp *g, const char *p, bool newline_ok) {
    while (p < g->end) {
        if (*p == ' ' || *p == '\t') {
            p++;
        } else if (*p == '#') {
            while (p < g->end && *p != '\n' && *p != '\r') p++;
        } else if (newline_ok && (*p == '\n' || *p == '\r')) {
            p++;
        } else {
            break;
        }
    }
    return p;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class at *pp (advanced). */
static bool parse_char(gp *g, const char **pp, uint32_t *cpt) {
    const char *p = *pp;
    if (p >= g->end) return fail_at(g, p, KP_EINVAL, "unexpected end of input");
    if (*p == '\\') {
        if (p + 1 >= g->end) return fail_at(g, p, KP_EINVAL, "unexpected end of input after '\\'");
        char c = p[1];
        int nhex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (nhex) {
            uint32_t v = 0;
            for (int i = 0; i < nhex; i++) {
                int h = p + 2 + i < g->end ? hexval(p[2 + i]) : -1;
                if (h < 0) return fail_at(g, p, KP_EINVAL, "expecting %d hex digits after '\\%c'", nhex, c);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) return fail_at(g, p, KP_EINVAL, "code point U+%X is beyond U+10FFFF", v);
            const char *next = p + 2 + nhex;
            if (v >= 0xD800 && v <= 0xDBFF && next + 6 <= g->end && next[0] == '\\' && next[1] == 'u') {
                uint32_t lo = 0; /* a UTF-16 pair written as two escapes, as JSON writes it */
                int i = 0;
                for (; i < 4 && hexval(next[2 + i]) >= 0; i++) lo = lo * 16 + (uint32_t)hexval(next[2 + i]);
                if (i == 4 && lo >= 0xDC00 && lo <= 0xDFFF) {
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                    next += 6;
                }
            }
            if (v >= 0xD800 && v <= 0xDFFF) /* its UTF-8 would not be UTF-8 */
                return fail_at(g, p, KP_EINVAL, "U+%04X is a lone UTF-16 surrogate, not a character", v);
            *cpt = v;
            *pp = next;
            return true;
        }
        switch (c) {
        case 'n': *cpt = '\n'; break;
        case 'r': *cpt = '\r'; break;
        case 't': *cpt = '\t'; break;
        case '\\':
        case '"':
        case '[':
        case ']': *cpt = (uint8_t)c; break;
        default: return fail_at(g, p, KP_EINVAL, "unknown escape '\\%c'", c);
        }
        *pp = p + 2;
        return true;
    }
    int k = kp_unicode_utf8_decode((const uint8_t *)p, (size_t)(g->end - p), cpt);
    if (k <= 0) return fail_at(g, p, KP_EINVAL, "invalid UTF-8");
    *pp = p + k;
    return true;
}

static const char *parse_alternates(gp *g, const char *p, uint32_t rule, const char *name, bool nested);

/* Replaces the items seq[from..n) by one REP element. */
static bool repeat(gp *g, const char *at, kp_gseq *seq, uint32_t from, const char *name, uint32_t min, uint32_t max) {
    if (min > KP_GRAMMAR_MAX_REPEAT || (max != KP_GREP_INF && max > KP_GRAMMAR_MAX_REPEAT))
        return fail_at(g, at, KP_ERANGE, "repetition count above %u", KP_GRAMMAR_MAX_REPEAT);
    if (max != KP_GREP_INF && max < min) return fail_at(g, at, KP_EINVAL, "repetition {%u,%u}: max below min", min, max);
    uint32_t rule;
    if (seq->n - from == 1) {
        rule = kp_builder_as_rule(g->b, seq->v[from]);
    } else {
        rule = kp_builder_rule(g->b, "%s(%u)", name, ++g->n_gen);
        kp_gseq body = {0};
        for (uint32_t i = from; i < seq->n; i++)
            if (!kp_gseq_push(g->b, &body, seq->v[i])) {
                kp_gseq_free(&body);
                return oom(g);
            }
        if (!kp_builder_alt(g->b, rule, &body)) return oom(g);
    }
    if (rule == UINT32_MAX) return oom(g);
    g->b->n_elems -= seq->n - from;
    seq->n = from;
    if (max == 0) return true;
    return kp_gseq_push(g->b, seq, kp_builder_rep(g->b, rule, min, max)) || oom(g);
}

static bool parse_count(gp *g, const char **pp, uint32_t *v) {
    const char *p = *pp;
    if (p >= g->end || *p < '0' || *p > '9') return fail_at(g, p, KP_EINVAL, "expecting a number");
    uint64_t x = 0;
    while (p < g->end && *p >= '0' && *p <= '9') {
        x = x * 10 + (uint64_t)(*p - '0');
        if (x > 0xFFFFFFFFull) return fail_at(g, *pp, KP_ERANGE, "repetition count above %u", KP_GRAMMAR_MAX_REPEAT);
        p++;
    }
    *v = (uint32_t)x;
    *pp = p;
    return true;
}

static const char *parse_sequence(gp *g, const char *p, const char *name, kp_gseq *seq, bool nested) {
    kp_builder *b = g->b;
    int64_t last = -1;
    while (p < g->end && g->st == KP_OK) {
        char c = *p;
        if (c == '"') {
            last = seq->n;
            p++;
            while (p < g->end && *p != '"') {
                uint32_t cpt;
                if (!parse_char(g, &p, &cpt)) return p;
                if (!kp_gseq_cpt(b, seq, cpt)) {
                    oom(g);
                    return p;
                }
            }
            if (p >= g->end) {
                fail_at(g, p, KP_EINVAL, "unexpected end of input in a literal");
                return p;
            }
            p = skip(g, p + 1, nested);
        } else if (c == '[') {
            const char *open = p;
            last = seq->n;
            p++;
            bool neg = p < g->end && *p == '^';
            if (neg) p++;
            kp_gcrange *rg = NULL;
            size_t n = 0, cap = 0;
            while (p < g->end && *p != ']') {
                uint32_t lo, hi;
                if (!parse_char(g, &p, &lo)) break;
                hi = lo;
                if (p + 1 < g->end && *p == '-' && p[1] != ']') {
                    p++;
                    if (!parse_char(g, &p, &hi)) break;
                    if (hi < lo) {
                        fail_at(g, p, KP_EINVAL, "class range U+%X-U+%X is reversed", lo, hi);
                        break;
                    }
                }
                if (!kp_grow((void **)&rg, &cap, n + 1, sizeof *rg)) {
                    oom(g);
                    break;
                }
                rg[n++] = (kp_gcrange){lo, hi};
            }
            if (g->st == KP_OK && p >= g->end) fail_at(g, open, KP_EINVAL, "unterminated character class");
            uint32_t e;
            if (g->st == KP_OK && (!kp_builder_class(b, rg, n, neg, &e) || !kp_gseq_push(b, seq, e))) oom(g);
            free(rg);
            if (g->st != KP_OK) return p;
            p = skip(g, p + 1, nested);
        } else if (is_word(c)) {
            const char *q = p;
            while (q < g->end && is_word(*q)) q++;
            uint32_t r = kp_builder_named(b, p, (size_t)(q - p));
            last = seq->n;
            if (r == UINT32_MAX || !kp_gseq_push(b, seq, KP_GE(KP_GE_REF, r))) {
                oom(g);
                return p;
            }
            p = skip(g, q, nested);
        } else if (c == '(') {
            const char *open = p;
            if (g->depth >= KP_GRAMMAR_MAX_NESTING) {
                fail_at(g, p, KP_ERANGE, "groups nested deeper than %d (KP_GRAMMAR_MAX_NESTING)", KP_GRAMMAR_MAX_NESTING);
                return p;
            }
            if (++g->n_rules > KP_GRAMMAR_MAX_RULES) {
                fail_at(g, p, KP_ERANGE, "more than %d rules and groups (KP_GRAMMAR_MAX_RULES)", KP_GRAMMAR_MAX_RULES);
                return p;
            }
            uint32_t r = kp_builder_rule(b, "%s(%u)", name, ++g->n_gen);
            if (r == UINT32_MAX) {
                oom(g);
                return p;
            }
            g->depth++;
            p = parse_alternates(g, skip(g, p + 1, true), r, name, true);
            g->depth--;
            if (g->st != KP_OK) return p;
            if (p >= g->end || *p != ')') {
                fail_at(g, open, KP_EINVAL, "expecting ')' to close this group");
                return p;
            }
            last = seq->n;
            if (!kp_gseq_push(b, seq, KP_GE(KP_GE_REF, r))) {
                oom(g);
                return p;
            }
            p = skip(g, p + 1, nested);
        } else if (c == '.') {
            last = seq->n;
            uint32_t e;
            if (!kp_builder_class(b, NULL, 0, true, &e) || !kp_gseq_push(b, seq, e)) {
                oom(g);
                return p;
            }
            p = skip(g, p + 1, nested);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            const char *at = p;
            if (last < 0) {
                fail_at(g, p, KP_EINVAL, "expecting an item before '%c'", c);
                return p;
            }
            uint32_t min = 0, max = KP_GREP_INF;
            if (c == '+') min = 1;
            if (c == '?') max = 1;
            p++;
            if (c == '{') {
                p = skip(g, p, nested);
                if (!parse_count(g, &p, &min)) return p;
                max = min;
                p = skip(g, p, nested);
                if (p < g->end && *p == ',') {
                    p = skip(g, p + 1, nested);
                    max = KP_GREP_INF;
                    if (p < g->end && *p != '}') {
                        if (!parse_count(g, &p, &max)) return p;
                        if (max == KP_GREP_INF) max = KP_GREP_INF + 1; /* a count, not "unbounded" */
                        p = skip(g, p, nested);
                    }
                }
                if (p >= g->end || *p != '}') {
                    fail_at(g, at, KP_EINVAL, "expecting '}' to close the repetition");
                    return p;
                }
                p++;
            }
            if (!repeat(g, at, seq, (uint32_t)last, name, min, max)) return p;
            p = skip(g, p, nested);
        } else if (c == '<') {
            fail_at(g, p, KP_EUNSUPPORTED, "token references <...> are not supported");
            return p;
        } else {
            break;
        }
    }
    return p;
}

static const char *parse_alternates(gp *g, const char *p, uint32_t rule, const char *name, bool nested) {
    for (uint32_t n_alts = 1;; n_alts++) {
        if (n_alts > KP_GRAMMAR_MAX_ALTS) {
            fail_at(g, p, KP_ERANGE, "more than %d alternatives in one rule or group (KP_GRAMMAR_MAX_ALTS)",
                    KP_GRAMMAR_MAX_ALTS);
            return p;
        }
        kp_gseq seq = {0};
        p = parse_sequence(g, p, name, &seq, nested);
        if (g->st != KP_OK) {
            kp_gseq_free(&seq);
            return p;
        }
        if (!kp_builder_alt(g->b, rule, &seq)) {
            oom(g);
            return p;
        }
        if (p < g->end && *p == '|') {
            p = skip(g, p + 1, true);
            continue;
        }
        return p;
    }
}

static const char *parse_rule(gp *g, const char *p) {
    const char *q = p;
    while (q < g->end && is_word(*q)) q++;
    if (q == p) {
        fail_at(g, p, KP_EINVAL, "expecting a rule name");
        return p;
    }
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(q - p < 100 ? q - p : 100), p);
    uint32_t r = kp_builder_named(g->b, p, (size_t)(q - p));
    if (r == UINT32_MAX) {
        oom(g);
        return p;
    }
    if (g->b->rules[r].defined) {
        fail_at(g, p, KP_EINVAL, "rule '%s' is defined twice", name);
        return p;
    }
    if (++g->n_rules > KP_GRAMMAR_MAX_RULES) {
        fail_at(g, p, KP_ERANGE, "more than %d rules and groups (KP_GRAMMAR_MAX_RULES)", KP_GRAMMAR_MAX_RULES);
        return p;
    }
    g->b->rules[r].defined = true;
    p = skip(g, q, false);
    if (g->end - p < 3 || memcmp(p, "::=", 3) != 0) {
        fail_at(g, p, KP_EINVAL, "expecting '::='");
        return p;
    }
    p = parse_alternates(g, skip(g, p + 3, true), r, name, false);
    if (g->st != KP_OK) return p;
    if (p < g->end && *p == '\r') p++;
    if (p < g->end && *p == '\n')
        p++;
    else if (p < g->end) {
        fail_at(g, p, KP_EINVAL, "expecting a newline or the end after the rule");
        return p;
    }
    return skip(g, p, true);
}

kp_status kp_grammar_compile_gbnf(const char *text, size_t len, kp_grammar **out, kp_error *err) {
    return kp_grammar_compile_gbnf_stop(text, len, NULL, out, err);
}

kp_status kp_grammar_compile_gbnf_stop(const char *text, size_t len, const kp_grammar_stop *stop, kp_grammar **out,
                                       kp_error *err) {
    if (!out || (len && !text)) return kp_fail(err, KP_EINVAL, "kp_grammar_compile_gbnf: NULL argument");
    *out = NULL;
    kp_builder b;
    kp_builder_init(&b);
    b.stop = stop;
    gp g = {.start = text, .end = text + len, .b = &b, .err = err, .st = KP_OK};
    const char *p = skip(&g, text, true);
    while (p < g.end && g.st == KP_OK) p = parse_rule(&g, p);
    if (g.st == KP_OK && (b.too_big || b.oom || b.stopped)) oom(&g);
    if (g.st != KP_OK) {
        kp_builder_free(&b);
        return g.st;
    }
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; r < b.n_rules; r++)
        if (b.rules[r].defined && strcmp(b.rules[r].name, "root") == 0) root = r;
    if (root == UINT32_MAX) {
        kp_builder_free(&b);
        return kp_fail(err, KP_EINVAL, "gbnf: the grammar has no 'root' rule");
    }
    return kp_builder_finish(&b, root, out, err);
}
