/*
 * lex.c - template text to tokens, with jinja2's whitespace rules.
 *
 * The text alternates data and tags. Data runs up to the next "{{", "{%"
 * or "{#"; a tag's inside is cut into names, numbers, strings and
 * operators until its closer ("}}", "%}", "#}") at bracket depth 0.
 *
 *   {%- / {{- / {#-   strip every whitespace character before the tag
 *   -%} / -}} / -#}   strip every whitespace character after it
 *   lstrip_blocks     a "{%" or "{#" alone after the start of its line
 *                     (spaces and tabs only) takes those blanks away;
 *                     "{%+" keeps them. "{{" never strips.
 *   trim_blocks       one newline right after "%}" or "#}" is dropped;
 *                     "+%}" keeps it
 *   {% raw %}..{% endraw %}  data, verbatim (the endraw tag obeys the rules)
 *
 * A string literal is unescaped as Python's unicode-escape codec does
 * (\n \t \\ \' \" \xNN \uNNNN \UNNNNNNNN \0..., an unknown escape stays as
 * written). Tokens carry their 1-based line and column.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

typedef struct {
    const char *src;
    size_t len, pos;
    int line;
    size_t line_start;  /* offset where the current line starts */
    size_t counted;     /* newlines counted up to here */
    jarena *a;
    jtokens *out;
    kp_jinja_error *err;
} lexer;

/* Brings the line count up to offset p (offsets only grow). */
static void lx_seek(lexer *lx, size_t p) {
    for (size_t i = lx->counted; i < p && i < lx->len; i++)
        if (lx->src[i] == '\n') { lx->line++; lx->line_start = i + 1; }
    if (p > lx->counted) lx->counted = p;
}

static bool lx_emit(lexer *lx, jtkind kind, size_t at, const char *s, size_t n) {
    if (lx->out->n == lx->out->cap) {
        size_t cap = lx->out->cap;
        if (!kp_grow((void **)&lx->out->toks, &cap, lx->out->n + 1, sizeof(jtoken))) {
            kp_jinja_seterr(lx->err, KP_JINJA_ENOMEM, 0, 0, "out of memory");
            return false;
        }
        lx->out->cap = cap;
    }
    lx_seek(lx, at);
    jtoken *t = &lx->out->toks[lx->out->n++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    t->line = lx->line;
    t->col = (int)(at - lx->line_start) + 1;
    t->s = s;
    t->len = n;
    return true;
}

static bool lx_fail(lexer *lx, size_t at, const char *msg) {
    lx_seek(lx, at);
    kp_jinja_seterr(lx->err, KP_JINJA_ESYNTAX, lx->line, (int)(at - lx->line_start) + 1, "%s", msg);
    return false;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Bytes of the whitespace character (Python's \s: str.isspace, so U+00A0,
 * U+3000... too) that starts at i / ends at end; 0 when there is none. */
static size_t ws_at(const lexer *lx, size_t i) {
    size_t k;
    return i < lx->len && kp_py_space(kp_cp_at(lx->src, lx->len, i, &k)) ? k : 0;
}
static size_t ws_before(const lexer *lx, size_t from, size_t end) {
    if (end <= from) return 0;
    size_t i = kp_prev_cp(lx->src, end), k;
    if (i < from) return 0;
    return kp_py_space(kp_cp_at(lx->src, end, i, &k)) && i + k == end ? k : 0;
}

/* The data src[from..to) after the stripping the tag at `to` asks for. */
static bool lx_data(lexer *lx, size_t from, size_t to, char sign, bool is_var, bool line_starting) {
    size_t end = to;
    if (sign == '-') {
        for (size_t k; (k = ws_before(lx, from, end)) > 0;) end -= k;
    } else if (sign != '+' && !is_var) {
        size_t l = end;
        while (l > from && lx->src[l - 1] != '\n') l--;
        if (l > from || line_starting) {
            size_t k = l;
            for (size_t w; k < end && (w = ws_at(lx, k)) > 0;) k += w;
            if (k == end && end > l) end = l;
        }
    }
    if (end > from) return lx_emit(lx, TK_DATA, from, lx->src + from, end - from);
    return true;
}

/* Skips a tag's closer at p ("-%}", "+%}", "%}"...: close is "%}", "}}"
 * or "#}"); returns the offset after it and what it swallowed. */
static size_t lx_closer(lexer *lx, size_t p, char closech, bool trim) {
    const char *s = lx->src;
    if (s[p] == '-') {
        p += 3;
        for (size_t w; (w = ws_at(lx, p)) > 0;) p += w;
        return p;
    }
    if (s[p] == '+') return p + 3;
    p += 2;
    if (trim && closech != '}' && p < lx->len && s[p] == '\n') p++;
    return p;
}

/* Does a closer ("%}" family) start at p? */
static bool lx_at_closer(const lexer *lx, size_t p, char c1) {
    const char *s = lx->src;
    size_t n = lx->len;
    if (p + 1 < n && s[p] == c1 && s[p + 1] == '}') return true;
    if (p + 2 < n && (s[p] == '-' || s[p] == '+') && s[p + 1] == c1 && s[p + 2] == '}')
        return !(c1 == '}' && s[p] == '+'); /* "+}}" is not a closer */
    return false;
}

/* The value of a hex digit, -1 for another character. */
static int hexval(char c) {
    if (!isxdigit((unsigned char)c)) return -1;
    return isdigit((unsigned char)c) ? c - '0' : tolower((unsigned char)c) - 'a' + 10;
}


/* One escape after the backslash at s[i]; returns the bytes consumed after it. */
static size_t lx_escape(const char *s, size_t i, size_t end, kp_buf *b) {
    char c = s[i];
    switch (c) {
    case 'n': kp_buf_putc(b, '\n'); return 1;
    case 't': kp_buf_putc(b, '\t'); return 1;
    case 'r': kp_buf_putc(b, '\r'); return 1;
    case '\\': kp_buf_putc(b, '\\'); return 1;
    case '\'': kp_buf_putc(b, '\''); return 1;
    case '"': kp_buf_putc(b, '"'); return 1;
    case 'a': kp_buf_putc(b, '\a'); return 1;
    case 'b': kp_buf_putc(b, '\b'); return 1;
    case 'f': kp_buf_putc(b, '\f'); return 1;
    case 'v': kp_buf_putc(b, '\v'); return 1;
    case '\n': return 1;
    default: break;
    }
    if (c >= '0' && c <= '7') {
        unsigned v = 0;
        size_t k = 0;
        while (k < 3 && i + k < end && s[i + k] >= '0' && s[i + k] <= '7') v = v * 8 + (unsigned)(s[i + k++] - '0');
        kp_put_utf8(b, v);
        return k;
    }
    size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits && i + digits < end) {
        unsigned v = 0;
        size_t k;
        for (k = 1; k <= digits && hexval(s[i + k]) >= 0; k++) v = v * 16 + (unsigned)hexval(s[i + k]);
        if (k == digits + 1 && v <= 0x10FFFF) { kp_put_utf8(b, v); return digits + 1; }
    }
    kp_buf_putc(b, '\\');
    return 0;
}

static bool lx_string(lexer *lx, size_t *pp) {
    const char *s = lx->src;
    size_t p = *pp, start = p;
    char q = s[p++];
    size_t end = p;
    while (end < lx->len && s[end] != q) end += (s[end] == '\\' && end + 1 < lx->len) ? 2 : 1;
    if (end >= lx->len) return lx_fail(lx, start, "unexpected char '\"' or unterminated string");
    kp_buf b = {0};
    for (size_t i = p; i < end; i++) {
        if (s[i] == '\\') i += lx_escape(s, i + 1, end, &b);
        else kp_buf_putc(&b, s[i]);
    }
    char *txt = b.oom ? NULL : kp_ja_strndup(lx->a, b.data ? b.data : "", b.len);
    size_t n = b.len;
    kp_buf_free(&b);
    if (!txt) { kp_jinja_seterr(lx->err, KP_JINJA_ENOMEM, 0, 0, "out of memory"); return false; }
    if (!lx_emit(lx, TK_STRING, start, txt, n)) return false;
    *pp = end + 1;
    return true;
}

static bool lx_number(lexer *lx, size_t *pp) {
    const char *s = lx->src;
    size_t p = *pp, start = p;
    bool is_float = false;
    while (p < lx->len && (isdigit((unsigned char)s[p]) || s[p] == '_')) p++;
    if (p + 1 < lx->len && s[p] == '.' && isdigit((unsigned char)s[p + 1])) {
        is_float = true;
        p++;
        while (p < lx->len && (isdigit((unsigned char)s[p]) || s[p] == '_')) p++;
    }
    if (p < lx->len && (s[p] == 'e' || s[p] == 'E')) {
        size_t q = p + 1;
        if (q < lx->len && (s[q] == '+' || s[q] == '-')) q++;
        if (q < lx->len && isdigit((unsigned char)s[q])) {
            is_float = true;
            p = q;
            while (p < lx->len && isdigit((unsigned char)s[p])) p++;
        }
    }
    char tmp[128];
    size_t k = 0;
    for (size_t i = start; i < p && k < sizeof tmp - 1; i++)
        if (s[i] != '_') tmp[k++] = s[i];
    tmp[k] = 0;
    if (!lx_emit(lx, is_float ? TK_FLOAT : TK_INT, start, s + start, p - start)) return false;
    jtoken *t = &lx->out->toks[lx->out->n - 1];
    if (is_float) {
        t->f = strtod(tmp, NULL);
    } else {
        char *e;
        unsigned long long v = strtoull(tmp, &e, 10);
        if (v > (unsigned long long)INT64_MAX) return lx_fail(lx, start, "integer literal too large");
        t->i = (int64_t)v;
    }
    *pp = p;
    return true;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~",
                                  "[", "]", "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};

/* The inside of a tag from *pp up to its closer (c1 '%' or '}'). */
static bool lx_tag(lexer *lx, size_t *pp, char c1) {
    const char *s = lx->src;
    size_t p = *pp;
    int depth = 0;
    for (;;) {
        while (p < lx->len && is_ws(s[p])) p++;
        if (p >= lx->len) return lx_fail(lx, p, c1 == '%' ? "unexpected end of template, expected 'end of statement block'"
                                                         : "unexpected end of template, expected 'end of print statement'");
        if (depth == 0 && lx_at_closer(lx, p, c1)) {
            if (!lx_emit(lx, c1 == '%' ? TK_BLOCK_END : TK_VAR_END, p, s + p, 0)) return false;
            *pp = p;
            return true;
        }
        char c = s[p];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t q = p;
            while (q < lx->len && (isalnum((unsigned char)s[q]) || s[q] == '_')) q++;
            if (!lx_emit(lx, TK_NAME, p, s + p, q - p)) return false;
            p = q;
        } else if (isdigit((unsigned char)c)) {
            if (!lx_number(lx, &p)) return false;
        } else if (c == '\'' || c == '"') {
            if (!lx_string(lx, &p)) return false;
        } else {
            size_t k, n = 0;
            for (k = 0; k < sizeof OPS / sizeof *OPS; k++) {
                n = strlen(OPS[k]);
                if (p + n <= lx->len && memcmp(s + p, OPS[k], n) == 0) break;
            }
            if (k == sizeof OPS / sizeof *OPS) {
                char m[64];
                snprintf(m, sizeof m, "unexpected char '%c'", c);
                return lx_fail(lx, p, m);
            }
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            if (!lx_emit(lx, TK_OP, p, OPS[k], n)) return false;
            p += n;
        }
    }
}

/* {% raw %} at p (the "{%" opener) when it is one: its body becomes data. */
static bool lx_try_raw(lexer *lx, size_t p, size_t *next, bool *is_raw) {
    const char *s = lx->src;
    size_t q = p + 2;
    *is_raw = false;
    if (q < lx->len && (s[q] == '-' || s[q] == '+')) q++;
    while (q < lx->len && is_ws(s[q])) q++;
    if (q + 3 > lx->len || memcmp(s + q, "raw", 3) != 0) return true;
    q += 3;
    while (q < lx->len && is_ws(s[q])) q++;
    if (q + 3 <= lx->len && memcmp(s + q, "-%}", 3) == 0) {
        q += 3;
        for (size_t w; (w = ws_at(lx, q)) > 0;) q += w;
    } else if (q + 2 <= lx->len && memcmp(s + q, "%}", 2) == 0) {
        q += 2;
    } else {
        return true;
    }
    *is_raw = true;
    /* the body runs to {%[-+]? endraw [-+]?%} */
    for (size_t r = q; r + 1 < lx->len; r++) {
        if (s[r] != '{' || s[r + 1] != '%') continue;
        size_t t = r + 2;
        char sign = 0;
        if (t < lx->len && (s[t] == '-' || s[t] == '+')) sign = s[t++];
        while (t < lx->len && is_ws(s[t])) t++;
        if (t + 6 > lx->len || memcmp(s + t, "endraw", 6) != 0) continue;
        t += 6;
        while (t < lx->len && is_ws(s[t])) t++;
        if (!lx_at_closer(lx, t, '%')) continue;
        if (!lx_data(lx, q, r, sign, false, false)) return false;
        *next = lx_closer(lx, t, '%', true);
        return true;
    }
    return lx_fail(lx, p, "Missing end of raw directive");
}

bool kp_jinja_lex(const char *src, size_t len, jarena *a, jtokens *out, kp_jinja_error *err) {
    lexer lx = {.src = src, .len = len, .line = 1, .a = a, .out = out, .err = err};
    size_t pos = 0;
    bool line_starting = true;
    while (pos < len) {
        size_t p = pos;
        while (p + 1 < len && !(src[p] == '{' && (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#'))) p++;
        if (p + 1 >= len) {
            if (!lx_emit(&lx, TK_DATA, pos, src + pos, len - pos)) return false;
            break;
        }
        char kind = src[p + 1];
        char sign = (p + 2 < len && (src[p + 2] == '-' || src[p + 2] == '+')) ? src[p + 2] : 0;
        if (kind == '%') {
            bool is_raw;
            size_t next = p;
            if (!lx_try_raw(&lx, p, &next, &is_raw)) return false;
            if (is_raw) {
                if (!lx_data(&lx, pos, p, sign, false, line_starting)) return false;
                pos = next;
                line_starting = src[pos - 1] == '\n';
                continue;
            }
        }
        if (!lx_data(&lx, pos, p, sign, kind == '{', line_starting)) return false;
        size_t q = p + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t r = q;
            while (r < len && !lx_at_closer(&lx, r, '#')) r++;
            if (r >= len) return lx_fail(&lx, p, "Missing end of comment tag");
            pos = lx_closer(&lx, r, '#', true);
        } else {
            char c1 = kind == '%' ? '%' : '}';
            if (!lx_emit(&lx, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, p, src + p, 0)) return false;
            if (!lx_tag(&lx, &q, c1)) return false;
            pos = lx_closer(&lx, q, c1, true);
        }
        line_starting = src[pos - 1] == '\n';
    }
    return lx_emit(&lx, TK_EOF, len, src + len, 0);
}
