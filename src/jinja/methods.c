/*
 * methods.c - attribute and item lookup, and what a template can call
 * besides filters: Python's str, dict and list methods, the globals
 * (range, namespace, dict, raise_exception, strftime_now), "%" formatting
 * and str.format, slices.
 *
 * Lookup is jinja2's sandboxed getattr/getitem: `d.items` on a dict is its
 * method, `d.key` falls back to the item; `d['key']` tries the item first,
 * then the attribute; `loop.*` is computed from the loop's position.
 *
 * The sandbox: jinja2's ImmutableSandboxedEnvironment refuses the methods
 * that change a list or a dict (append, extend, insert, pop, remove,
 * clear, sort, reverse; update, setdefault, popitem): looking one up gives
 * an undefined value that raises SecurityError("access to attribute
 * 'append' of 'list' object is unsafe.") when called. range() refuses more
 * than 100000 items, as jinja2's sandbox does (MAX_RANGE).
 *
 * strftime_now formats the current local time, or SOURCE_DATE_EPOCH (UTC)
 * when that variable is set, for reproducible renders.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja/jinja_impl.h"

#define JINJA_MAX_RANGE 100000


static const char *const STR_METHODS[] = {
    "capitalize", "count", "endswith", "find", "format", "index", "isalnum", "isalpha", "isdigit",
    "islower", "isnumeric", "isspace", "isupper", "join", "lower", "lstrip", "removeprefix",
    "removesuffix", "replace", "rfind", "rindex", "rsplit", "rstrip", "split", "splitlines",
    "startswith", "strip", "title", "upper", NULL};
static const char *const DICT_METHODS[] = {"copy", "get", "items", "keys", "values", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const LIST_METHODS[] = {"copy", "count", "index", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};

static bool in_set(const char *const *set, const char *name) {
    for (; *set; set++)
        if (!strcmp(*set, name)) return true;
    return false;
}

jv kp_jinja_method(jctx *c, jv obj, const char *name, bool *found) {
    const char *const *safe = NULL, *const *unsafe = NULL;
    if (obj.t == JT_STR) safe = STR_METHODS;
    else if (obj.t == JT_DICT) { safe = DICT_METHODS; unsafe = DICT_UNSAFE; }
    else if (obj.t == JT_LIST && !obj.tuple) { safe = LIST_METHODS; unsafe = LIST_UNSAFE; }
    else if (obj.t == JT_LIST) safe = LIST_METHODS + 1;
    *found = false;
    if (unsafe && in_set(unsafe, name)) {
        *found = true;
        jv u = kp_jv_undef_hint(c, "access to attribute '%s' of '%s' object is unsafe.", name, kp_jv_typename(obj));
        u.unsafe = 1;
        return u;
    }
    if (!safe || !in_set(safe, name)) return jv_undef();
    *found = true;
    jv v = kp_jv_func(c, JFN_METHOD, name);
    if (v.t == JT_FUNC) v.u.fn->self = obj;
    return v;
}

/* ---------------------------------------------------------------- attribute and item lookup */

static jv loop_attr(jctx *c, jloop *l, const char *name) {
    size_t i = l->index0, n = l->length;
    if (!strcmp(name, "index")) return jv_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return jv_int((int64_t)i);
    if (!strcmp(name, "revindex")) return jv_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return jv_int((int64_t)n);
    if (!strcmp(name, "depth")) return jv_int(1);
    if (!strcmp(name, "depth0")) return jv_int(0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->items.u.l->items[i - 1] : kp_jv_undef_hint(c, "there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->items.u.l->items[i + 1] : kp_jv_undef_hint(c, "there is no next item");
    if (!strcmp(name, "cycle")) {
        jv v = kp_jv_func(c, JFN_CYCLE, "cycle");
        if (v.t == JT_FUNC) v.u.fn->loop = l;
        return v;
    }
    return kp_jv_undef_hint(c, "'LoopContext object' has no attribute '%s'", name);
}

jv kp_jinja_getattr(jctx *c, jv obj, const char *name) {
    bool found;
    switch (obj.t) {
    case JT_UNDEF: return kp_jv_undef_fail(c, obj);
    case JT_LOOP: return loop_attr(c, obj.u.loop, name);
    case JT_NS: {
        jv *v = kp_jdict_gets(obj.u.d, name);
        return v ? *v : kp_jv_undef_hint(c, "'jinja2.utils.Namespace object' has no attribute '%s'", name);
    }
    case JT_DICT: {
        jv m = kp_jinja_method(c, obj, name, &found);
        if (found) return m;
        jv *v = kp_jdict_gets(obj.u.d, name);
        return v ? *v : kp_jv_undef_hint(c, "'dict object' has no attribute '%s'", name);
    }
    default: {
        jv m = kp_jinja_method(c, obj, name, &found);
        if (found) return m;
        return kp_jv_undef_hint(c, "'%s object' has no attribute '%s'", kp_jv_typename(obj), name);
    }
    }
}

jv kp_jinja_getitem(jctx *c, jv obj, jv key) {
    if (obj.t == JT_UNDEF) return kp_jv_undef_fail(c, obj);
    if (obj.t == JT_DICT) {
        jv *v = kp_jdict_get(obj.u.d, key);
        if (v) return *v;
    } else if (obj.t == JT_LIST && obj.gen) {
        return kp_jv_undef_hint(c, "generator object has no element"); /* jinja2: a failed lookup is undefined */
    } else if ((obj.t == JT_LIST || obj.t == JT_STR) && (key.t == JT_INT || key.t == JT_BOOL)) {
        int64_t i = key.t == JT_BOOL ? key.u.b : key.u.i;
        int64_t n = (int64_t)(obj.t == JT_LIST ? obj.u.l->n : kp_utf8_count(obj.u.s->s, obj.u.s->len));
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj.t == JT_LIST) return obj.u.l->items[i];
            size_t a = kp_utf8_offset(obj.u.s->s, obj.u.s->len, (size_t)i);
            size_t b = kp_utf8_offset(obj.u.s->s, obj.u.s->len, (size_t)i + 1);
            return kp_jv_substr(c, obj, a, b - a);
        }
        return kp_jv_undef_hint(c, "%s object has no element %lld", kp_jv_typename(obj), (long long)(key.t == JT_BOOL ? key.u.b : key.u.i));
    }
    if (key.t == JT_STR) return kp_jinja_getattr(c, obj, key.u.s->s);
    if (obj.t == JT_DICT) {
        kp_buf b = {0};
        kp_jv_write_repr(&b, key);
        jv u = kp_jv_undef_hint(c, "dict object has no element %s", b.data ? b.data : "");
        kp_buf_free(&b);
        return u;
    }
    return kp_jv_undef_hint(c, "'%s object' has no element", kp_jv_typename(obj));
}

/* ---------------------------------------------------------------- str methods */



static bool is_ws(unsigned char ch) { return ch == ' ' || (ch >= 9 && ch <= 13) || (ch >= 0x1c && ch <= 0x1f); }

static jv str_split(jctx *c, jv s, jv sep, jv maxsplit, bool from_right) {
    int64_t max = maxsplit.t == JT_INT ? maxsplit.u.i : -1;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    jv parts[1];
    (void)parts;
    /* collect [start, end) pairs, then build the list */
    size_t cap = 0, cnt = 0;
    size_t *spans = NULL;
    bool ok = true;
#define PUSH(a_, b_)                                                                       \
    do {                                                                                   \
        if (!kp_grow((void **)&spans, &cap, 2 * cnt + 2, sizeof *spans)) { ok = false; break; } \
        spans[2 * cnt] = (a_);                                                             \
        spans[2 * cnt + 1] = (b_);                                                         \
        cnt++;                                                                             \
    } while (0)
    if (sep.t == JT_NONE || sep.t == JT_UNDEF) {
        if (!from_right) {
            size_t i = 0;
            while (ok && i < n) {
                while (i < n && is_ws((unsigned char)p[i])) i++;
                if (i >= n) break;
                size_t j = i;
                if (max >= 0 && (int64_t)cnt >= max) {
                    size_t e = n;
                    while (e > j && is_ws((unsigned char)p[e - 1])) e--;
                    PUSH(j, e);
                    break;
                }
                while (j < n && !is_ws((unsigned char)p[j])) j++;
                PUSH(i, j);
                i = j;
            }
        } else {
            size_t e = n;
            while (ok && e > 0) {
                while (e > 0 && is_ws((unsigned char)p[e - 1])) e--;
                if (!e) break;
                size_t i = e;
                if (max >= 0 && (int64_t)cnt >= max) {
                    size_t b0 = 0;
                    while (b0 < i && is_ws((unsigned char)p[b0])) b0++;
                    PUSH(b0, e);
                    break;
                }
                while (i > 0 && !is_ws((unsigned char)p[i - 1])) i--;
                PUSH(i, e);
                e = i;
            }
        }
    } else {
        if (!kp_jv_need_str(c, sep, "split()")) { free(spans); return jv_undef(); }
        size_t sn = sep.u.s->len;
        if (!sn) { free(spans); return kp_jfail(c, KP_JINJA_EVALUE, "empty separator"); }
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *hit = (max < 0 || (int64_t)cnt < max) ? memmem(p + i, n - i, sep.u.s->s, sn) : NULL;
                if (!hit) { PUSH(i, n); break; }
                PUSH(i, (size_t)(hit - p));
                if (!ok) break;
                i = (size_t)(hit - p) + sn;
            }
        } else {
            size_t e = n;
            for (;;) {
                size_t hit = SIZE_MAX;
                if ((max < 0 || (int64_t)cnt < max) && e >= sn)
                    for (size_t k = e - sn + 1; k-- > 0;)
                        if (memcmp(p + k, sep.u.s->s, sn) == 0) { hit = k; break; }
                if (hit == SIZE_MAX) { PUSH(0, e); break; }
                PUSH(hit + sn, e);
                if (!ok) break;
                e = hit;
            }
        }
    }
#undef PUSH
    if (!ok) { free(spans); return kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); }
    jv l = kp_jv_list(c, cnt);
    for (size_t k = 0; k < cnt && !c->failed; k++) {
        size_t idx = from_right ? cnt - 1 - k : k;
        l.u.l->items[k] = kp_jv_substr(c, s, spans[2 * idx], spans[2 * idx + 1] - spans[2 * idx]);
    }
    free(spans);
    return l;
}

/* startswith/endswith with a str or a tuple of str */
static jv str_affix(jctx *c, jv s, jv what, bool end) {
    if (what.t == JT_LIST) {
        for (size_t i = 0; i < what.u.l->n; i++) {
            jv r = str_affix(c, s, what.u.l->items[i], end);
            if (c->failed || kp_jv_truthy(r)) return r;
        }
        return jv_bool(false);
    }
    if (what.t != JT_STR)
        return kp_jfail(c, KP_JINJA_ETYPE, "%s first arg must be str or a tuple of str, not %s",
                     end ? "endswith" : "startswith", kp_jv_typename(what));
    size_t n = s.u.s->len, k = what.u.s->len;
    if (k > n) return jv_bool(false);
    return jv_bool(memcmp(s.u.s->s + (end ? n - k : 0), what.u.s->s, k) == 0);
}

/* find / rfind / index / rindex / count: positions in code points */
static jv str_find(jctx *c, jv s, jv sub, const char *how) {
    if (!kp_jv_need_str(c, sub, how)) return jv_undef();
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, k = sub.u.s->len;
    if (!strcmp(how, "count")) {
        if (!k) return jv_int((int64_t)kp_utf8_count(p, n) + 1);
        int64_t cnt = 0;
        for (const char *q = p; (q = memmem(q, n - (size_t)(q - p), sub.u.s->s, k)); q += k) cnt++;
        return jv_int(cnt);
    }
    bool right = how[0] == 'r';
    size_t hit = SIZE_MAX;
    if (k <= n) {
        if (!right) {
            const char *q = memmem(p, n, sub.u.s->s, k);
            if (q) hit = (size_t)(q - p);
        } else {
            for (size_t i = n - k + 1; i-- > 0;)
                if (memcmp(p + i, sub.u.s->s, k) == 0) { hit = i; break; }
        }
    }
    if (hit == SIZE_MAX) {
        if (strstr(how, "index")) return kp_jfail(c, KP_JINJA_EVALUE, "substring not found");
        return jv_int(-1);
    }
    return jv_int((int64_t)kp_utf8_count(p, hit));
}

static jv str_is(jctx *c, jv s, const char *name) {
    size_t n = s.u.s->len;
    if (!n) return jv_bool(false);
    if (!strcmp(name, "islower") || !strcmp(name, "isupper")) return jv_bool(kp_str_is_case(c, s, name[2] == 'u'));
    char what = !strcmp(name, "isalpha") ? 'a' : !strcmp(name, "isalnum") ? 'n' : !strcmp(name, "isspace") ? 's' : 'd';
    for (size_t i = 0, k; i < n; i += k) {
        unsigned cp = kp_cp_at(s.u.s->s, n, i, &k);
        if (!(what == 's' ? kp_py_space(cp) : kp_cp_is(c, cp, what))) return jv_bool(false);
    }
    return jv_bool(true);
}

static jv str_format(jctx *c, jv fmt, const jargs *a);

static jv call_str_method(jctx *c, const char *m, jv s, const jargs *a) {
    jv a0 = kp_jarg(a, 0, NULL, NULL), a1 = kp_jarg(a, 1, NULL, NULL);
    bool has0 = a->nargs > 0;
    if (!strcmp(m, "strip")) return kp_jinja_strip(c, s, has0 ? a0 : jv_none(), 3);
    if (!strcmp(m, "lstrip")) return kp_jinja_strip(c, s, has0 ? a0 : jv_none(), 1);
    if (!strcmp(m, "rstrip")) return kp_jinja_strip(c, s, has0 ? a0 : jv_none(), 2);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        bool p0, p1;
        jv sep = kp_jarg(a, 0, "sep", &p0), max = kp_jarg(a, 1, "maxsplit", &p1);
        return str_split(c, s, p0 ? sep : jv_none(), p1 ? max : jv_int(-1), m[0] == 'r');
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) return str_affix(c, s, a0, m[0] == 'e');
    if (!strcmp(m, "replace")) return kp_jinja_replace(c, s, a0, a1, a->nargs > 2 ? a->args[2] : jv_none());
    if (!strcmp(m, "upper")) return kp_jinja_case(c, s, 1);
    if (!strcmp(m, "lower")) return kp_jinja_case(c, s, 0);
    if (!strcmp(m, "title")) return kp_jinja_case(c, s, 4);
    if (!strcmp(m, "capitalize")) return kp_jinja_case(c, s, 2);
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") || !strcmp(m, "count"))
        return str_find(c, s, a0, m);
    if (!strncmp(m, "is", 2)) return str_is(c, s, m);
    if (!strcmp(m, "format")) return str_format(c, s, a);
    if (!strcmp(m, "join")) {
        jv l = kp_jv_iter_list(c, a0);
        kp_buf b = {0};
        for (size_t i = 0; !c->failed && i < l.u.l->n; i++) {
            jv x = l.u.l->items[i];
            if (x.t != JT_STR) { kp_buf_free(&b); return kp_jfail(c, KP_JINJA_ETYPE, "sequence item %zu: expected str instance, %s found", i, kp_jv_typename(x)); }
            if (i) kp_buf_put(&b, s.u.s->s, s.u.s->len);
            kp_buf_put(&b, x.u.s->s, x.u.s->len);
        }
        return kp_jv_str_buf(c, &b);
    }
    if (!strcmp(m, "splitlines")) {
        jv parts = str_split(c, s, kp_jv_strz(c, "\n"), jv_int(-1), false);
        if (!c->failed && parts.u.l->n && parts.u.l->items[parts.u.l->n - 1].u.s->len == 0) parts.u.l->n--;
        return parts;
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        if (!kp_jv_need_str(c, a0, m)) return jv_undef();
        bool end = m[6] == 's';
        if (!kp_jv_truthy(str_affix(c, s, a0, end))) return s;
        size_t k = a0.u.s->len;
        return kp_jv_substr(c, s, end ? 0 : k, s.u.s->len - k);
    }
    return kp_jfail(c, KP_JINJA_ETYPE, "str.%s is not supported", m);
}

/* ---------------------------------------------------------------- dict and list methods */

static jv call_dict_method(jctx *c, const char *m, jv d, const jargs *a) {
    if (!strcmp(m, "items")) return kp_jinja_items(c, d);
    if (!strcmp(m, "copy")) return d;
    if (!strcmp(m, "keys") || !strcmp(m, "values")) {
        jv l = kp_jv_list(c, d.u.d->n);
        if (!c->failed && d.u.d->n) memcpy(l.u.l->items, m[0] == 'k' ? d.u.d->keys : d.u.d->vals, d.u.d->n * sizeof(jv));
        return l;
    }
    /* get(key, default=None) */
    if (a->nargs < 1) return kp_jfail(c, KP_JINJA_ETYPE, "get expected at least 1 argument, got 0");
    jv *v = kp_jdict_get(d.u.d, a->args[0]);
    if (v) return *v;
    return a->nargs > 1 ? a->args[1] : jv_none();
}

static jv call_list_method(jctx *c, const char *m, jv l, const jargs *a) {
    if (!strcmp(m, "copy")) return l;
    jv x = kp_jarg(a, 0, NULL, NULL);
    int64_t cnt = 0;
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (!kp_jv_eq(l.u.l->items[i], x)) continue;
        if (!strcmp(m, "index")) return jv_int((int64_t)i);
        cnt++;
    }
    if (!strcmp(m, "index")) {
        kp_buf b = {0};
        kp_jv_write_repr(&b, x);
        jv r = kp_jfail(c, KP_JINJA_EVALUE, "%s is not in list", b.data ? b.data : "");
        kp_buf_free(&b);
        return r;
    }
    return jv_int(cnt);
}

jv kp_jinja_call_method(jctx *c, jfunc *fn, const jargs *a) {
    jv self = fn->self;
    if (self.t == JT_STR) {
        jv r = call_str_method(c, fn->name, self, a);
        if (self.markup && r.t == JT_STR) r.markup = 1; /* Markup's methods give Markup */
        if (self.markup && r.t == JT_LIST)
            for (size_t i = 0; i < r.u.l->n; i++) r.u.l->items[i].markup = r.u.l->items[i].t == JT_STR;
        return r;
    }
    if (self.t == JT_DICT) return call_dict_method(c, fn->name, self, a);
    return call_list_method(c, fn->name, self, a);
}

/* ---------------------------------------------------------------- globals */

static const char *const GLOBALS[] = {"dict", "namespace", "raise_exception", "range", "strftime_now", NULL};

jv kp_jinja_global(jctx *c, const char *name) {
    for (size_t i = 0; GLOBALS[i]; i++) {
        if (!strcmp(GLOBALS[i], name)) return kp_jv_func(c, JFN_GLOBAL, GLOBALS[i]);
    }
    return jv_undef();
}

static jv g_range(jctx *c, const jargs *a) {
    int64_t v[3] = {0, 0, 1};
    if (a->nargs < 1 || a->nargs > 3) return kp_jfail(c, KP_JINJA_ETYPE, "range expected at most 3 arguments, got %zu", a->nargs);
    for (size_t i = 0; i < a->nargs; i++) {
        jv x = a->args[i];
        if (x.t != JT_INT && x.t != JT_BOOL)
            return kp_jfail(c, KP_JINJA_ETYPE, "'%s' object cannot be interpreted as an integer", kp_jv_typename(x));
        v[a->nargs == 1 ? 1 : i] = x.t == JT_BOOL ? x.u.b : x.u.i;
    }
    int64_t start = v[0], stop = v[1], st = v[2];
    if (st == 0) return kp_jfail(c, KP_JINJA_EVALUE, "range() arg 3 must not be zero");
    double count = st > 0 ? ceil(((double)stop - (double)start) / (double)st) : ceil(((double)start - (double)stop) / (double)-st);
    if (count < 0) count = 0;
    if (count > JINJA_MAX_RANGE)
        return kp_jfail(c, KP_JINJA_ELIMIT, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JINJA_MAX_RANGE);
    jv l = kp_jv_list(c, (size_t)count);
    for (size_t i = 0; !c->failed && i < (size_t)count; i++) l.u.l->items[i] = jv_int(start + (int64_t)i * st);
    return l;
}

static jv g_strftime(jctx *c, const jargs *a) {
    jv f = kp_jarg(a, 0, NULL, NULL);
    if (f.t != JT_STR) return kp_jfail(c, KP_JINJA_ETYPE, "strftime() argument 1 must be str, not %s", kp_jv_typename(f));
    time_t now = time(NULL);
    struct tm tm;
    const char *epoch = getenv("SOURCE_DATE_EPOCH");
    if (epoch && *epoch) {
        now = (time_t)strtoll(epoch, NULL, 10);
        gmtime_r(&now, &tm);
    } else {
        localtime_r(&now, &tm);
    }
    char out[512];
    size_t n = f.u.s->len ? strftime(out, sizeof out, f.u.s->s, &tm) : 0;
    return kp_jv_str(c, out, n);
}

jv kp_jinja_call_global(jctx *c, jfunc *fn, const jargs *a) {
    const char *g = fn->name;
    if (!strcmp(g, "raise_exception")) {
        jv m = kp_jv_to_str(c, kp_jarg(a, 0, "message", NULL));
        return c->failed ? m : kp_jfail(c, KP_JINJA_ERAISED, "%s", m.u.s->s);
    }
    if (!strcmp(g, "range")) return g_range(c, a);
    if (!strcmp(g, "strftime_now")) return g_strftime(c, a);
    /* dict(**kw), namespace(mapping?, **kw) */
    jv d = kp_jv_dict(c);
    if (c->failed) return d;
    if (a->nargs > 1) return kp_jfail(c, KP_JINJA_ETYPE, "%s expected at most 1 argument, got %zu", g, a->nargs);
    if (a->nargs == 1) {
        jv init = a->args[0];
        if (init.t != JT_DICT && init.t != JT_NS) return kp_jfail(c, KP_JINJA_ETYPE, "cannot convert %s to a dictionary", kp_jv_typename(init));
        for (size_t i = 0; i < init.u.d->n && !c->failed; i++) kp_jdict_set(c, d.u.d, init.u.d->keys[i], init.u.d->vals[i]);
    }
    for (size_t i = 0; i < a->nkw && !c->failed; i++) kp_jdict_set(c, d.u.d, kp_jv_strz(c, a->kwnames[i]), a->kwvals[i]);
    if (!strcmp(g, "namespace")) d.t = JT_NS;
    return d;
}

/* ---------------------------------------------------------------- slices */

jv kp_jv_slice(jctx *c, jv v, jv start, jv stop, jv step) {
    if (v.t == JT_UNDEF) return kp_jfail(c, KP_JINJA_EUNDEFINED, "%s", v.u.hint ? v.u.hint : "value is undefined");
    /* jinja2 slices with Python's own subscript (no undefined on failure) */
    if (v.t == JT_DICT) return kp_jfail(c, KP_JINJA_ETYPE, "unhashable type: 'slice'");
    if ((v.t != JT_LIST && v.t != JT_STR) || v.gen)
        return kp_jfail(c, KP_JINJA_ETYPE, "'%s' object is not subscriptable", kp_jv_typename(v));
    int64_t n = (int64_t)(v.t == JT_LIST ? v.u.l->n : kp_utf8_count(v.u.s->s, v.u.s->len));
    jv parts[3] = {start, stop, step};
    for (int i = 0; i < 3; i++)
        if (parts[i].t != JT_NONE && parts[i].t != JT_INT && parts[i].t != JT_BOOL)
            return kp_jfail(c, KP_JINJA_ETYPE, "slice indices must be integers or None or have an __index__ method");
    int64_t st = step.t == JT_NONE ? 1 : step.t == JT_BOOL ? step.u.b : step.u.i;
    if (st == 0) return kp_jfail(c, KP_JINJA_EVALUE, "slice step cannot be zero");
    int64_t lo, hi;
    if (start.t == JT_NONE) lo = st > 0 ? 0 : n - 1;
    else {
        lo = start.t == JT_BOOL ? start.u.b : start.u.i;
        if (lo < 0) lo += n;
        if (lo < 0) lo = st > 0 ? 0 : -1;
        if (lo > n) lo = st > 0 ? n : n - 1;
        if (st < 0 && lo >= n) lo = n - 1;
    }
    if (stop.t == JT_NONE) hi = st > 0 ? n : -1;
    else {
        hi = stop.t == JT_BOOL ? stop.u.b : stop.u.i;
        if (hi < 0) hi += n;
        if (hi < 0) hi = st > 0 ? 0 : -1;
        if (hi > n) hi = n;
    }
    size_t cnt = 0;
    if (st > 0 && hi > lo) cnt = (size_t)((hi - lo + st - 1) / st);
    if (st < 0 && lo > hi) cnt = (size_t)((lo - hi + (-st) - 1) / (-st));
    if (v.t == JT_LIST) {
        jv l = kp_jv_list(c, cnt);
        for (size_t i = 0; !c->failed && i < cnt; i++) l.u.l->items[i] = v.u.l->items[lo + (int64_t)i * st];
        l.tuple = v.tuple;
        return l;
    }
    /* strings: code point offsets */
    const char *p = v.u.s->s;
    size_t len = v.u.s->len;
    if (st == 1) {
        size_t a = kp_utf8_offset(p, len, (size_t)lo), b = cnt ? kp_utf8_offset(p, len, (size_t)(lo + (int64_t)cnt)) : a;
        return kp_jv_substr(c, v, a, b - a);
    }
    size_t *offs = malloc(((size_t)n + 1) * sizeof *offs);
    if (!offs) return kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
    for (size_t i = 0, k = 0; i <= len; i++)
        if (i == len || ((unsigned char)p[i] & 0xC0) != 0x80) offs[k++] = i;
    kp_buf b = {0};
    for (size_t i = 0; i < cnt; i++) {
        int64_t k = lo + (int64_t)i * st;
        kp_buf_put(&b, p + offs[k], offs[k + 1] - offs[k]);
    }
    free(offs);
    return kp_jv_str_buf(c, &b);
}

/* ---------------------------------------------------------------- formatting */

typedef struct { char flags[8]; int width, prec; char type; } fspec;

/* One value under a printf-style spec, Python's way. */
static bool format_one(jctx *c, kp_buf *b, jv v, const fspec *s) {
    char f[32], tmp[64];
    if (s->type == 's' || s->type == 'r' || s->type == 'a') {
        kp_buf t = {0};
        if (s->type == 's') kp_jv_write_str(&t, v);
        else kp_jv_write_repr(&t, v);
        size_t n = t.len, cps = kp_utf8_count(t.data ? t.data : "", n);
        if (s->prec >= 0 && (size_t)s->prec < cps) n = kp_utf8_offset(t.data, n, (size_t)s->prec), cps = (size_t)s->prec;
        size_t pad = s->width > 0 && (size_t)s->width > cps ? (size_t)s->width - cps : 0;
        bool left = strchr(s->flags, '-') != NULL;
        if (!left) kp_buf_fill(b, ' ', pad);
        kp_buf_put(b, t.data ? t.data : "", n);
        if (left) kp_buf_fill(b, ' ', pad);
        kp_buf_free(&t);
        return true;
    }
    if (!kp_jv_is_num(v)) {
        kp_jfail(c, KP_JINJA_ETYPE, "%%%c format: a real number is required, not %s", s->type, kp_jv_typename(v));
        return false;
    }
    if (strchr("dixXoc", s->type)) {
        long long i = v.t == JT_FLOAT ? (long long)v.u.f : (long long)kp_jv_num(v);
        char t = s->type == 'i' ? 'd' : s->type;
        if (t == 'c') {
            kp_buf_putc(b, (char)i);
            return true;
        }
        snprintf(f, sizeof f, "%%%s%s*ll%c", s->flags, s->prec >= 0 ? ".*" : "", t);
        if (s->prec >= 0) snprintf(tmp, sizeof tmp, f, s->width, s->prec, i);
        else snprintf(tmp, sizeof tmp, f, s->width, i);
    } else {
        snprintf(f, sizeof f, "%%%s*.*%c", s->flags, s->type);
        snprintf(tmp, sizeof tmp, f, s->width, s->prec >= 0 ? s->prec : 6, kp_jv_num(v));
    }
    kp_buf_puts(b, tmp);
    return true;
}

jv kp_jinja_percent_format(jctx *c, jv fmt, jv args) {
    const char *p = fmt.u.s->s, *end = p + fmt.u.s->len;
    kp_buf b = {0};
    size_t next = 0;
    bool is_tuple = args.t == JT_LIST && args.tuple;
    while (p < end && !c->failed) {
        if (*p != '%') { kp_buf_putc(&b, *p++); continue; }
        p++;
        if (p < end && *p == '%') { kp_buf_putc(&b, '%'); p++; continue; }
        jv v;
        if (p < end && *p == '(') {
            const char *q = memchr(p, ')', (size_t)(end - p));
            if (!q || args.t != JT_DICT) { kp_jfail(c, KP_JINJA_ETYPE, "format requires a mapping"); break; }
            jv *x = kp_jdict_get(args.u.d, kp_jv_str(c, p + 1, (size_t)(q - p - 1)));
            if (!x) { kp_jfail(c, KP_JINJA_EVALUE, "KeyError: '%.*s'", (int)(q - p - 1), p + 1); break; }
            v = *x;
            p = q + 1;
        } else if (is_tuple) {
            if (next >= args.u.l->n) { kp_jfail(c, KP_JINJA_ETYPE, "not enough arguments for format string"); break; }
            v = args.u.l->items[next++];
        } else {
            if (next++) { kp_jfail(c, KP_JINJA_ETYPE, "not enough arguments for format string"); break; }
            v = args;
        }
        fspec s = {.prec = -1};
        size_t nf = 0;
        while (p < end && strchr("-+ #0", *p)) { if (nf < sizeof s.flags - 1) s.flags[nf++] = *p; p++; }
        while (p < end && isdigit((unsigned char)*p)) s.width = s.width * 10 + (*p++ - '0');
        if (p < end && *p == '.') {
            s.prec = 0;
            p++;
            while (p < end && isdigit((unsigned char)*p)) s.prec = s.prec * 10 + (*p++ - '0');
        }
        if (p >= end || !strchr("sradixXocfFeEgG", *p)) { kp_jfail(c, KP_JINJA_EVALUE, "unsupported format character"); break; }
        s.type = *p++;
        if (s.width > 4096 || s.prec > 4096) { kp_jfail(c, KP_JINJA_ELIMIT, "format width too large"); break; }
        format_one(c, &b, v, &s);
    }
    if (!c->failed && ((is_tuple && next < args.u.l->n) || (!is_tuple && !next && args.t != JT_DICT && args.t != JT_LIST && args.t != JT_UNDEF)))
        kp_jfail(c, KP_JINJA_ETYPE, "not all arguments converted during string formatting");
    if (c->failed) { kp_buf_free(&b); return jv_undef(); }
    return kp_jv_str_buf(c, &b);
}

/* str.format: {} {0} {name} with an optional !r/!s and a :spec (fill, align, width, .prec, type). */
static bool format_field(jctx *c, kp_buf *b, jv v, char conv, const char *spec, size_t sn) {
    if (conv == 'r') {
        kp_buf t = {0};
        kp_jv_write_repr(&t, v);
        v = kp_jv_str_buf(c, &t);
    } else if (conv == 's') {
        v = kp_jv_to_str(c, v);
    }
    if (!sn) { kp_jv_write_str(b, v); return true; }
    char fill = ' ', align = 0;
    size_t i = 0;
    if (sn >= 2 && strchr("<>^=", spec[1])) { fill = spec[0]; align = spec[1]; i = 2; }
    else if (strchr("<>^=", spec[0])) { align = spec[0]; i = 1; }
    fspec s = {.prec = -1};
    if (i < sn && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) s.flags[0] = spec[i++];
    if (i < sn && spec[i] == '0') { fill = '0'; if (!align) align = '='; i++; }
    while (i < sn && isdigit((unsigned char)spec[i])) s.width = s.width * 10 + (spec[i++] - '0');
    if (i < sn && spec[i] == '.') {
        s.prec = 0;
        i++;
        while (i < sn && isdigit((unsigned char)spec[i])) s.prec = s.prec * 10 + (spec[i++] - '0');
    }
    s.type = i < sn ? spec[i] : (v.t == JT_STR ? 's' : v.t == JT_FLOAT ? 'g' : v.t == JT_INT ? 'd' : 's');
    if (s.width > 4096 || s.prec > 4096) { kp_jfail(c, KP_JINJA_ELIMIT, "format width too large"); return false; }
    int width = s.width;
    s.width = 0;
    kp_buf t = {0};
    if (v.t == JT_FLOAT && s.type == 'g' && s.prec < 0 && i >= sn) kp_jv_write_str(&t, v);
    else if (!format_one(c, &t, v, &s)) { kp_buf_free(&t); return false; }
    size_t cps = kp_utf8_count(t.data ? t.data : "", t.len);
    size_t pad = width > 0 && (size_t)width > cps ? (size_t)width - cps : 0;
    if (!align) align = v.t == JT_STR ? '<' : '>';
    size_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad;
    kp_buf_fill(b, fill, left);
    kp_buf_put(b, t.data ? t.data : "", t.len);
    kp_buf_fill(b, fill, pad - left);
    kp_buf_free(&t);
    return true;
}

static jv str_format(jctx *c, jv fmt, const jargs *a) {
    const char *p = fmt.u.s->s, *end = p + fmt.u.s->len;
    kp_buf b = {0};
    size_t auto_idx = 0;
    while (p < end && !c->failed) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { kp_buf_putc(&b, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { kp_buf_putc(&b, '}'); p += 2; continue; }
        if (*p == '}') { kp_jfail(c, KP_JINJA_EVALUE, "Single '}' encountered in format string"); break; }
        if (*p != '{') { kp_buf_putc(&b, *p++); continue; }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) { kp_jfail(c, KP_JINJA_EVALUE, "Single '{' encountered in format string"); break; }
        const char *name = p + 1, *ne = name;
        while (ne < q && *ne != '!' && *ne != ':') ne++;
        char conv = 0;
        const char *spec = ne;
        if (spec < q && *spec == '!') { conv = spec + 1 < q ? spec[1] : 0; spec += 2; }
        if (spec < q && *spec == ':') spec++;
        else spec = q;
        jv v;
        size_t nn = (size_t)(ne - name);
        if (nn == 0) v = kp_jarg(a, auto_idx++, NULL, NULL);
        else if (isdigit((unsigned char)name[0])) v = kp_jarg(a, (size_t)atoi(name), NULL, NULL);
        else {
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)nn, name);
            bool present;
            v = kp_jarg(a, SIZE_MAX, key, &present);
            if (!present) { kp_jfail(c, KP_JINJA_EVALUE, "KeyError: '%s'", key); break; }
        }
        format_field(c, &b, v, conv, spec, (size_t)(q - spec));
        p = q + 1;
    }
    if (c->failed) { kp_buf_free(&b); return jv_undef(); }
    return kp_jv_str_buf(c, &b);
}
