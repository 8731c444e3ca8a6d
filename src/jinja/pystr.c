/*
 * pystr.c - Python's str operations the filters and methods share (floor
 * of src/jinja/ just above value.c): strip with str.isspace's whitespace or
 * a set of characters, lower/upper/capitalize/title, replace with a count,
 * markupsafe's escape, a mapping's items as (key, value) tuples.
 *
 * Strings are UTF-8; positions are code points. Case mapping beyond ASCII
 * is glibc's (towupper_l in C.UTF-8), Python's simple case mapping but for
 * the letters whose capital is two letters (only ß -> SS is done).
 */
#include <ctype.h>
#include <locale.h>
#include <wctype.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

bool kp_jv_need_str(jctx *c, jv v, const char *what) {
    if (v.t == JT_STR) return true;
    kp_jfail(c, KP_JINJA_ETYPE, "%s arg must be str, not %s", what, kp_jv_typename(v));
    return false;
}

/* Python's str.isspace for one code point. */
bool kp_py_space(unsigned cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

unsigned kp_cp_at(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char c = (unsigned char)s[i];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + k > n) k = n - i;
    unsigned cp = k == 1 ? c : k == 2 ? (c & 31u) : k == 3 ? (c & 15u) : (c & 7u);
    for (size_t j = 1; j < k; j++) cp = cp << 6 | ((unsigned char)s[i + j] & 63u);
    *len = k;
    return cp;
}

size_t kp_prev_cp(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

static bool in_chars(unsigned cp, const jstr *chars) {
    for (size_t i = 0; i < chars->len;) {
        size_t k;
        if (kp_cp_at(chars->s, chars->len, i, &k) == cp) return true;
        i += k;
    }
    return false;
}

/* str.strip / lstrip / rstrip (which: 1 left, 2 right, 3 both); chars NULL: whitespace. */
jv kp_jinja_strip(jctx *c, jv s, jv chars, int which) {
    if (chars.t != JT_NONE && chars.t != JT_UNDEF && chars.t != JT_STR)
        return kp_jfail(c, KP_JINJA_ETYPE, "strip arg must be None or str");
    const jstr *set = chars.t == JT_STR ? chars.u.s : NULL;
    const char *p = s.u.s->s;
    size_t a = 0, b = s.u.s->len;
    if (which & 1)
        while (a < b) {
            size_t k;
            unsigned cp = kp_cp_at(p, b, a, &k);
            if (set ? !in_chars(cp, set) : !kp_py_space(cp)) break;
            a += k;
        }
    if (which & 2)
        while (b > a) {
            size_t i = kp_prev_cp(p, b), k;
            unsigned cp = kp_cp_at(p, b, i, &k);
            if (set ? !in_chars(cp, set) : !kp_py_space(cp)) break;
            b = i;
        }
    return kp_jv_substr(c, s, a, b - a);
}

static jv pair(jctx *c, jv k, jv v) {
    jv t = kp_jv_list(c, 2);
    if (c->failed) return t;
    t.tuple = 1;
    t.u.l->items[0] = k;
    t.u.l->items[1] = v;
    return t;
}

jv kp_jinja_items(jctx *c, jv v) {
    if (v.t == JT_UNDEF) return kp_jv_list(c, 0);
    if (v.t != JT_DICT && v.t != JT_NS) return kp_jfail(c, KP_JINJA_ETYPE, "can only get item pairs from a mapping.");
    jv l = kp_jv_list(c, v.u.d->n);
    for (size_t i = 0; i < v.u.d->n && !c->failed; i++) l.u.l->items[i] = pair(c, v.u.d->keys[i], v.u.d->vals[i]);
    return l;
}

void kp_put_utf8(kp_buf *b, unsigned cp) {
    char u[4];
    if (cp < 0x80) { kp_buf_putc(b, (char)cp); return; }
    if (cp < 0x800) { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 63)); kp_buf_put(b, u, 2); return; }
    if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 63)); u[2] = (char)(0x80 | (cp & 63));
        kp_buf_put(b, u, 3);
        return;
    }
    u[0] = (char)(0xF0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 63));
    u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63));
    kp_buf_put(b, u, 4);
}

/* The render's C.UTF-8 locale (towupper_l & co. know every script's
 * letters), made at the first letter beyond ASCII; NULL when the system
 * has none, and then only ASCII letters have a case. */
static locale_t utf8_locale(jctx *c) {
    if (!c->utf8_tried) {
        c->utf8_tried = true;
        c->utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    }
    return c->utf8;
}

static unsigned map_case(jctx *c, unsigned cp, bool up) {
    if (cp < 0x80) return (unsigned)(up ? toupper((int)cp) : tolower((int)cp));
    locale_t l = utf8_locale(c);
    if (!l) return cp;
    return (unsigned)(up ? towupper_l((wint_t)cp, l) : towlower_l((wint_t)cp, l));
}

bool kp_cp_is(jctx *c, unsigned cp, char what) {
    if (cp < 0x80) {
        int ch = (int)cp;
        return what == 'a' ? isalpha(ch) != 0 : what == 'n' ? isalnum(ch) != 0 : what == 'd' ? isdigit(ch) != 0
                                                                                     : isalpha(ch) != 0;
    }
    locale_t l = utf8_locale(c);
    if (!l) return false;
    wint_t w = (wint_t)cp;
    switch (what) {
    case 'a': return iswalpha_l(w, l) != 0;
    case 'n': return iswalnum_l(w, l) != 0;
    case 'd': return iswdigit_l(w, l) != 0;
    default: return iswupper_l(w, l) || iswlower_l(w, l);
    }
}

/* One code point of s at i, *k its bytes; an invalid sequence is one byte,
 * returned as 0xFFFFFFFF (copied as it is, never mapped). */
static unsigned next_cp(const char *s, size_t n, size_t i, size_t *k) {
    unsigned cp = kp_cp_at(s, n, i, k);
    for (size_t j = 1; j < *k; j++)
        if (((unsigned char)s[i + j] & 0xC0) != 0x80) { *k = 1; return 0xFFFFFFFFu; }
    if (*k == 1 && (unsigned char)s[i] >= 0x80) return 0xFFFFFFFFu;
    return cp;
}

bool kp_str_is_case(jctx *c, jv s, bool upper) {
    bool cased = false;
    for (size_t i = 0, k; i < s.u.s->len; i += k) {
        unsigned cp = next_cp(s.u.s->s, s.u.s->len, i, &k);
        if (cp == 0xFFFFFFFFu || !kp_cp_is(c, cp, 'c')) continue;
        if (map_case(c, cp, upper) != cp && map_case(c, cp, !upper) == cp) return false; /* of the other case */
        cased = true;
    }
    return cased;
}

jv kp_jinja_case(jctx *c, jv v, int mode) {
    jv s = kp_jv_to_str(c, v);
    if (c->failed) return s;
    kp_buf b = {0};
    bool start = true;
    const char *p = s.u.s->s;
    for (size_t i = 0, k; i < s.u.s->len; i += k) {
        unsigned cp = next_cp(p, s.u.s->len, i, &k);
        if (cp == 0xFFFFFFFFu) {
            kp_buf_put(&b, p + i, k);
            start = mode == 4;
            continue;
        }
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode >= 3 && start);
        if (cp == 0xDF && up) /* ß has no one-letter capital: upper() SS, title case Ss */
            kp_buf_puts(&b, mode == 1 || mode == 3 ? "SS" : "Ss");
        else kp_put_utf8(&b, map_case(c, cp, up));
        if (mode == 3) /* jinja2's title: words start after "-", whitespace, "(", "{", "[", "<" */
            start = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || kp_py_space(cp);
        else if (mode == 4) /* str.title: after any character without a case */
            start = !kp_cp_is(c, cp, 'c');
    }
    jv r = kp_jv_str_buf(c, &b);
    r.markup = s.markup;
    return r;
}

/* markupsafe's escape: & < > " ' as entities, a Markup value as it is. */
jv kp_jinja_escape(jctx *c, jv v) {
    jv s = kp_jv_to_str(c, v);
    if (c->failed || s.markup) return s;
    kp_buf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char ch = s.u.s->s[i];
        switch (ch) {
        case '&': kp_buf_puts(&b, "&amp;"); break;
        case '<': kp_buf_puts(&b, "&lt;"); break;
        case '>': kp_buf_puts(&b, "&gt;"); break;
        case '"': kp_buf_puts(&b, "&#34;"); break;
        case '\'': kp_buf_puts(&b, "&#39;"); break;
        default: kp_buf_putc(&b, ch);
        }
    }
    jv r = kp_jv_str_buf(c, &b);
    r.markup = r.t == JT_STR;
    return r;
}

jv kp_jinja_replace(jctx *c, jv s, jv old, jv new_, jv count) {
    if (!kp_jv_need_str(c, old, "replace()") || !kp_jv_need_str(c, new_, "replace()")) return jv_undef();
    int64_t max = count.t == JT_INT ? count.u.i : -1;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, on = old.u.s->len;
    kp_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (on == 0) {
        for (; i <= n && (max < 0 || done < max); done++) {
            kp_buf_put(&b, new_.u.s->s, new_.u.s->len);
            if (i == n) { i++; break; }
            size_t j = i + 1;
            while (j < n && ((unsigned char)p[j] & 0xC0) == 0x80) j++;
            kp_buf_put(&b, p + i, j - i);
            i = j;
        }
        if (i <= n) kp_buf_put(&b, p + i, n - i);
        if (b.len > (size_t)KP_JINJA_MAX_STRING) kp_jv_check_string(c, b.len);
        return kp_jv_str_buf(c, &b);
    }
    while (i < n) {
        const char *hit = (max < 0 || done < max) ? memmem(p + i, n - i, old.u.s->s, on) : NULL;
        if (!hit) break;
        kp_buf_put(&b, p + i, (size_t)(hit - (p + i)));
        kp_buf_put(&b, new_.u.s->s, new_.u.s->len);
        i = (size_t)(hit - p) + on;
        done++;
        if (b.len > (size_t)KP_JINJA_MAX_STRING) { kp_jv_check_string(c, b.len); kp_buf_free(&b); return jv_undef(); }
    }
    kp_buf_put(&b, p + i, n - i);
    return kp_jv_str_buf(c, &b);
}
