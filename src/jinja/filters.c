/*
 * filters.c - jinja2's filters and tests, the ones chat templates use.
 *
 * Each filter takes the value left of "|" and the call's arguments
 * (positional or by keyword, under jinja2's parameter names) and returns a
 * new value, as jinja2's filters.py does, with its defaults: sort, unique,
 * dictsort, min and max compare strings case-insensitively unless
 * case_sensitive=true; map takes a filter name or attribute=;
 * selectattr/rejectattr take a test name; default only replaces an
 * undefined value unless its second argument is true; indent leaves the
 * first line alone unless first=true and blank lines alone unless
 * blank=true; `tojson` writes RFC 8785 canonical JSON whatever its
 * arguments (a kvpin choice, see jinja.h).
 *
 * Filters and tests are found by name in sorted tables (bsearch). An
 * unknown filter fails the render ("No filter named 'x'."), as jinja2 does
 * when the expression runs.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/canon.h"
#include "jinja/jinja_impl.h"

typedef jv (*filter_fn)(jctx *c, jv v, const jargs *a);
typedef struct { const char *name; filter_fn fn; } filter_entry;

static jv argv_or(const jargs *a, size_t pos, const char *name, jv dflt) {
    bool present;
    jv v = kp_jarg(a, pos, name, &present);
    return present ? v : dflt;
}

static bool undef_check(jctx *c, jv v) {
    if (v.t != JT_UNDEF) return true;
    if (v.unsafe) kp_jfail(c, KP_JINJA_ESECURITY, "%s", v.u.hint);
    else kp_jfail(c, KP_JINJA_EUNDEFINED, "%s", v.u.hint ? v.u.hint : "value is undefined");
    return false;
}






static jv f_trim(jctx *c, jv v, const jargs *a) {
    jv s = kp_jv_to_str(c, v);
    if (c->failed) return s;
    jv r = kp_jinja_strip(c, s, argv_or(a, 0, "chars", jv_none()), 3);
    r.markup = s.markup;
    return r;
}

static jv f_tojson(jctx *c, jv v, const jargs *a) {
    (void)a;
    json_t *j = kp_jv_to_json(c, v);
    if (!j) return jv_undef();
    char *text;
    size_t n;
    kp_error e;
    kp_status st = kp_canon_dump(j, &text, &n, &e);
    json_decref(j);
    if (st != KP_OK) return kp_jfail(c, st == KP_ENOMEM ? KP_JINJA_ENOMEM : KP_JINJA_EVALUE, "%s", e.msg);
    jv r = kp_jv_str(c, text, n);
    free(text);
    return r;
}

static jv f_length(jctx *c, jv v, const jargs *a) {
    (void)a;
    return jv_int((int64_t)kp_jv_length(c, v));
}

static jv f_string(jctx *c, jv v, const jargs *a) {
    (void)a;
    return kp_jv_to_str(c, v);
}

static jv f_default(jctx *c, jv v, const jargs *a) {
    jv dflt = argv_or(a, 0, "default_value", kp_jv_strz(c, ""));
    bool boolean = kp_jv_truthy(argv_or(a, 1, "boolean", jv_bool(false)));
    if (v.t == JT_UNDEF || (boolean && !kp_jv_truthy(v))) return dflt;
    return v;
}

/* environment.getattr for a dotted attribute ("a.b" or "0"), as filters do it. */
static jv attr_path(jctx *c, jv v, jv attr) {
    if (attr.t != JT_STR) return kp_jinja_getitem(c, v, attr);
    const char *s = attr.u.s->s;
    while (!c->failed) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        jv key;
        char *end;
        long long idx = strtoll(s, &end, 10);
        if (n && end == s + n) key = jv_int(idx);
        else key = kp_jv_str(c, s, n);
        v = kp_jinja_getitem(c, v, key);
        if (!dot) break;
        s = dot + 1;
    }
    return v;
}

static jv f_join(jctx *c, jv v, const jargs *a) {
    jv sep = argv_or(a, 0, "d", kp_jv_strz(c, ""));
    jv attr = argv_or(a, 1, "attribute", jv_none());
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    kp_buf b = {0};
    for (size_t i = 0; i < l.u.l->n && !c->failed; i++) {
        if (i) kp_jv_write_str(&b, sep);
        jv item = attr.t == JT_NONE ? l.u.l->items[i] : attr_path(c, l.u.l->items[i], attr);
        kp_jv_write_str(&b, item);
        if (b.len > (size_t)KP_JINJA_MAX_STRING) kp_jv_check_string(c, b.len);
    }
    if (c->failed) { kp_buf_free(&b); return jv_undef(); }
    return kp_jv_str_buf(c, &b);
}



static jv f_items(jctx *c, jv v, const jargs *a) {
    (void)a;
    jv l = kp_jinja_items(c, v);
    l.gen = l.t == JT_LIST;
    return l;
}


static jv f_lower(jctx *c, jv v, const jargs *a) { (void)a; return kp_jinja_case(c, v, 0); }
static jv f_upper(jctx *c, jv v, const jargs *a) { (void)a; return kp_jinja_case(c, v, 1); }
static jv f_capitalize(jctx *c, jv v, const jargs *a) { (void)a; return kp_jinja_case(c, v, 2); }
static jv f_title(jctx *c, jv v, const jargs *a) { (void)a; return kp_jinja_case(c, v, 3); }
static jv f_safe(jctx *c, jv v, const jargs *a) {
    (void)a;
    jv s = kp_jv_to_str(c, v);
    s.markup = s.t == JT_STR;
    return s;
}

static jv f_list(jctx *c, jv v, const jargs *a) {
    (void)a;
    jv l = kp_jv_iter_list(c, v);
    if (c->failed || v.t != JT_LIST) return l;
    jv copy = kp_jv_list(c, l.u.l->n);
    if (!c->failed && l.u.l->n) memcpy(copy.u.l->items, l.u.l->items, l.u.l->n * sizeof(jv));
    return copy;
}

static jv f_replace(jctx *c, jv v, const jargs *a) {
    jv s = kp_jv_to_str(c, v);
    if (c->failed) return s;
    return kp_jinja_replace(c, s, kp_jarg(a, 0, "old", NULL), kp_jarg(a, 1, "new", NULL), argv_or(a, 2, "count", jv_none()));
}

/* ---- sorting: a merge sort (stable, like Python's) over keys ---- */
typedef struct { jctx *c; bool case_sensitive; } sort_ctx;

static jv sort_key(jctx *c, jv v, bool case_sensitive) {
    if (!case_sensitive && v.t == JT_STR) return kp_jinja_case(c, v, 0);
    return v;
}

static void merge_sort(sort_ctx *s, jv *keys, jv *vals, jv *tk, jv *tv, size_t n, bool reverse) {
    if (n < 2 || s->c->failed) return;
    size_t h = n / 2;
    merge_sort(s, keys, vals, tk, tv, h, reverse);
    merge_sort(s, keys + h, vals + h, tk, tv, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = kp_jv_cmp(s->c, keys[j], keys[i]);
        if (reverse ? r > 0 : r < 0) { tk[k] = keys[j]; tv[k++] = vals[j++]; }
        else { tk[k] = keys[i]; tv[k++] = vals[i++]; }
    }
    while (i < h) { tk[k] = keys[i]; tv[k++] = vals[i++]; }
    while (j < n) { tk[k] = keys[j]; tv[k++] = vals[j++]; }
    memcpy(keys, tk, n * sizeof(jv));
    memcpy(vals, tv, n * sizeof(jv));
}

/* Sorts the items of list l by key (attribute path or the item), a new list. */
static jv sorted(jctx *c, jv l, jv attr, bool case_sensitive, bool reverse, bool by_value_of_pair) {
    size_t n = l.u.l->n;
    jv out = kp_jv_list(c, n);
    jv *keys = kp_ja_alloc(&c->arena, (n ? n : 1) * sizeof(jv) * 3);
    if (c->failed) return out;
    if (!keys) return kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !c->failed; i++) {
        jv item = l.u.l->items[i];
        jv k = by_value_of_pair ? item.u.l->items[attr.u.i] : attr.t == JT_NONE ? item : attr_path(c, item, attr);
        keys[i] = sort_key(c, k, case_sensitive);
        out.u.l->items[i] = item;
    }
    sort_ctx s = {c, case_sensitive};
    merge_sort(&s, keys, out.u.l->items, keys + n, keys + 2 * n, n, reverse);
    return out;
}

static jv f_sort(jctx *c, jv v, const jargs *a) {
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    bool reverse = kp_jv_truthy(argv_or(a, 0, "reverse", jv_bool(false)));
    bool cs = kp_jv_truthy(argv_or(a, 1, "case_sensitive", jv_bool(false)));
    return sorted(c, l, argv_or(a, 2, "attribute", jv_none()), cs, reverse, false);
}

static jv f_dictsort(jctx *c, jv v, const jargs *a) {
    if (v.t == JT_UNDEF) return kp_jv_undef_fail(c, v); /* Undefined.items() raises */
    jv items = kp_jinja_items(c, v);
    if (c->failed) return items;
    bool cs = kp_jv_truthy(argv_or(a, 0, "case_sensitive", jv_bool(false)));
    jv by = argv_or(a, 1, "by", jv_none());
    bool reverse = kp_jv_truthy(argv_or(a, 2, "reverse", jv_bool(false)));
    int pos = (by.t == JT_STR && strcmp(by.u.s->s, "value") == 0) ? 1 : 0;
    return sorted(c, items, jv_int(pos), cs, reverse, true);
}

static jv f_unique(jctx *c, jv v, const jargs *a) {
    jv l = kp_jv_iter_list(c, v);
    bool cs = kp_jv_truthy(argv_or(a, 0, "case_sensitive", jv_bool(false)));
    jv attr = argv_or(a, 1, "attribute", jv_none());
    if (c->failed) return l;
    jv out = kp_jv_list(c, l.u.l->n), seen = kp_jv_list(c, l.u.l->n);
    size_t k = 0;
    for (size_t i = 0; i < l.u.l->n && !c->failed; i++) {
        jv item = l.u.l->items[i];
        jv key = sort_key(c, attr.t == JT_NONE ? item : attr_path(c, item, attr), cs);
        if ((key.t == JT_LIST && !key.tuple) || key.t == JT_DICT) /* unique keeps a set of them */
            return kp_jfail(c, KP_JINJA_ETYPE, "unhashable type: '%s'", kp_jv_typename(key));
        bool dup = false;
        for (size_t j = 0; j < k && !dup; j++) dup = kp_jv_eq(seen.u.l->items[j], key);
        if (dup) continue;
        seen.u.l->items[k] = key;
        out.u.l->items[k++] = item;
    }
    if (!c->failed) out.u.l->n = k;
    out.gen = 1;
    return out;
}

static jv minmax(jctx *c, jv v, const jargs *a, bool want_max) {
    jv l = kp_jv_iter_list(c, v);
    bool cs = kp_jv_truthy(argv_or(a, 0, "case_sensitive", jv_bool(false)));
    jv attr = argv_or(a, 1, "attribute", jv_none());
    if (c->failed) return l;
    if (!l.u.l->n) return kp_jv_undef_hint(c, "No aggregated item, sequence was empty.");
    jv best = l.u.l->items[0];
    jv bk = sort_key(c, attr.t == JT_NONE ? best : attr_path(c, best, attr), cs);
    for (size_t i = 1; i < l.u.l->n && !c->failed; i++) {
        jv k = sort_key(c, attr.t == JT_NONE ? l.u.l->items[i] : attr_path(c, l.u.l->items[i], attr), cs);
        int r = kp_jv_cmp(c, k, bk);
        if (want_max ? r > 0 : r < 0) { best = l.u.l->items[i]; bk = k; }
    }
    return best;
}

static jv f_min(jctx *c, jv v, const jargs *a) { return minmax(c, v, a, false); }
static jv f_max(jctx *c, jv v, const jargs *a) { return minmax(c, v, a, true); }

/* select / reject / selectattr / rejectattr */
static jv select_common(jctx *c, jv v, const jargs *a, bool by_attr, bool keep) {
    if (!kp_jv_truthy(v)) v = kp_jv_list(c, 0); /* jinja2: "if value:" before iterating */
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    size_t first_arg = by_attr ? 1 : 0;
    jv attr = by_attr ? kp_jarg(a, 0, NULL, NULL) : jv_none();
    bool has_test = a->nargs > first_arg;
    const char *test = NULL;
    if (has_test) {
        jv t = a->args[first_arg];
        if (t.t != JT_STR) return kp_jfail(c, KP_JINJA_ETYPE, "test name must be a string");
        test = t.u.s->s;
    }
    jargs targs = {a->nargs > first_arg + 1 ? a->args + first_arg + 1 : NULL,
                   a->nargs > first_arg + 1 ? a->nargs - first_arg - 1 : 0, NULL, NULL, 0};
    jv out = kp_jv_list(c, l.u.l->n);
    size_t k = 0;
    for (size_t i = 0; i < l.u.l->n && !c->failed; i++) {
        jv item = l.u.l->items[i];
        jv x = by_attr ? attr_path(c, item, attr) : item;
        bool ok = test ? kp_jv_truthy(kp_jinja_test(c, test, x, &targs)) : kp_jv_truthy(x);
        if (ok == keep) out.u.l->items[k++] = item;
    }
    if (!c->failed) out.u.l->n = k;
    out.gen = 1;
    return out;
}

static jv f_select(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, false, true); }
static jv f_reject(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, false, false); }
static jv f_selectattr(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, true, true); }
static jv f_rejectattr(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, true, false); }

static jv f_map(jctx *c, jv v, const jargs *a) {
    if (!kp_jv_truthy(v)) v = kp_jv_list(c, 0); /* jinja2: "if value:" before iterating */
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    bool has_attr;
    jv attr = kp_jarg(a, a->nargs, "attribute", &has_attr);
    jv dflt = argv_or(a, a->nargs, "default", jv_undef());
    jv out = kp_jv_list(c, l.u.l->n);
    if (has_attr) {
        for (size_t i = 0; i < l.u.l->n && !c->failed; i++) {
            jv x = attr_path(c, l.u.l->items[i], attr);
            out.u.l->items[i] = (x.t == JT_UNDEF && dflt.t != JT_UNDEF) ? dflt : x;
        }
        out.gen = 1;
        return out;
    }
    if (!a->nargs || a->args[0].t != JT_STR) return kp_jfail(c, KP_JINJA_ETYPE, "map requires a filter argument");
    jargs rest = {a->args + 1, a->nargs - 1, a->kwnames, a->kwvals, a->nkw};
    for (size_t i = 0; i < l.u.l->n && !c->failed; i++)
        out.u.l->items[i] = kp_jinja_filter(c, a->args[0].u.s->s, l.u.l->items[i], &rest);
    out.gen = 1;
    return out;
}

static void split_lines(jctx *c, jv s, jv *out) {
    /* str.splitlines() on \n, \r\n, \r */
    size_t n = s.u.s->len, cnt = 0;
    const char *p = s.u.s->s;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\n' || (p[i] == '\r' && !(i + 1 < n && p[i + 1] == '\n'))) cnt++;
    if (n && p[n - 1] != '\n' && p[n - 1] != '\r') cnt++;
    *out = kp_jv_list(c, cnt);
    size_t k = 0, start = 0;
    for (size_t i = 0; i < n && !c->failed; i++) {
        if (p[i] == '\n' || p[i] == '\r') {
            out->u.l->items[k++] = kp_jv_substr(c, s, start, i - start);
            if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') i++;
            start = i + 1;
        }
    }
    if (!c->failed && start < n) out->u.l->items[k++] = kp_jv_substr(c, s, start, n - start);
}

static jv f_indent(jctx *c, jv v, const jargs *a) {
    if (v.t == JT_UNDEF) return kp_jv_undef_fail(c, v);
    if (v.t != JT_STR) /* jinja2 appends "\n" to it first */
        return kp_jfail(c, KP_JINJA_ETYPE, "unsupported operand type(s) for +=: '%s' and 'str'", kp_jv_typename(v));
    jv s = v;
    jv width = argv_or(a, 0, "width", jv_int(4));
    bool first = kp_jv_truthy(argv_or(a, 1, "first", jv_bool(false)));
    bool blank = kp_jv_truthy(argv_or(a, 2, "blank", jv_bool(false)));
    if (c->failed) return s;
    kp_buf ind = {0}, b = {0};
    if (width.t == JT_STR) kp_buf_put(&ind, width.u.s->s, width.u.s->len);
    else if (width.t == JT_INT && width.u.i > 0 && width.u.i < 4096) kp_buf_fill(&ind, ' ', (size_t)width.u.i);
    const char *in = ind.data ? ind.data : "";
    jv lines;
    kp_buf t = {0};
    kp_buf_put(&t, s.u.s->s, s.u.s->len);
    kp_buf_putc(&t, '\n');
    split_lines(c, kp_jv_str_buf(c, &t), &lines);
    if (c->failed) { kp_buf_free(&ind); return jv_undef(); }
    if (first) kp_buf_puts(&b, in);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jv line = lines.u.l->items[i];
        if (i) {
            kp_buf_putc(&b, '\n');
            if (blank || line.u.s->len) kp_buf_puts(&b, in);
        }
        kp_buf_put(&b, line.u.s->s, line.u.s->len);
    }
    kp_buf_free(&ind);
    return kp_jv_str_buf(c, &b);
}

static jv to_int(jctx *c, jv v, jv dflt, int base) {
    if (v.t == JT_INT) return v;
    if (v.t == JT_BOOL) return jv_int(v.u.b);
    if (v.t == JT_FLOAT) return isfinite(v.u.f) ? jv_int((int64_t)v.u.f) : dflt;
    if (v.t == JT_STR) {
        char *end;
        const char *s = v.u.s->s;
        while (isspace((unsigned char)*s)) s++;
        long long i = strtoll(s, &end, base);
        const char *e = end;
        while (isspace((unsigned char)*e)) e++;
        if (end != s && *e == 0) return jv_int(i);
        double d = strtod(s, &end);
        e = end;
        while (isspace((unsigned char)*e)) e++;
        if (end != s && *e == 0 && isfinite(d)) return jv_int((int64_t)d);
    }
    (void)c;
    return dflt;
}

static jv f_int(jctx *c, jv v, const jargs *a) {
    if (v.t == JT_UNDEF) return kp_jv_undef_fail(c, v); /* int(Undefined) raises */
    jv base = argv_or(a, 1, "base", jv_int(10));
    return to_int(c, v, argv_or(a, 0, "default", jv_int(0)), base.t == JT_INT ? (int)base.u.i : 10);
}

static jv f_float(jctx *c, jv v, const jargs *a) {
    if (v.t == JT_UNDEF) return kp_jv_undef_fail(c, v); /* float(Undefined) raises */
    jv dflt = argv_or(a, 0, "default", jv_float(0.0));
    if (v.t == JT_FLOAT) return v;
    if (v.t == JT_INT || v.t == JT_BOOL) return jv_float(kp_jv_num(v));
    if (v.t == JT_STR) {
        char *end;
        double d = strtod(v.u.s->s, &end);
        while (isspace((unsigned char)*end)) end++;
        if (end != v.u.s->s && *end == 0) return jv_float(d);
    }
    (void)c;
    return dflt;
}

static jv f_abs(jctx *c, jv v, const jargs *a) {
    (void)a;
    if (v.t == JT_INT) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    if (v.t == JT_BOOL) return jv_int(v.u.b);
    if (v.t == JT_FLOAT) return jv_float(fabs(v.u.f));
    return kp_jfail(c, KP_JINJA_ETYPE, "bad operand type for abs(): '%s'", kp_jv_typename(v));
}

static jv f_round(jctx *c, jv v, const jargs *a) {
    jv prec = argv_or(a, 0, "precision", jv_int(0));
    jv method = argv_or(a, 1, "method", jv_none());
    if (!kp_jv_is_num(v)) return kp_jfail(c, KP_JINJA_ETYPE, "type %s doesn't define __round__ method", kp_jv_typename(v));
    double p = pow(10.0, (double)(prec.t == JT_INT ? prec.u.i : 0)), x = kp_jv_num(v) * p, r;
    const char *m = method.t == JT_STR ? method.u.s->s : "common";
    if (!strcmp(m, "floor")) r = floor(x);
    else if (!strcmp(m, "ceil")) r = ceil(x);
    else if (!strcmp(m, "common")) r = nearbyint(x);
    else return kp_jfail(c, KP_JINJA_ETYPE, "method must be common, ceil or floor");
    if (v.t != JT_FLOAT && !strcmp(m, "common")) return jv_int((int64_t)(r / p));
    return jv_float(r / p);
}

static jv f_first(jctx *c, jv v, const jargs *a) {
    (void)a;
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    return l.u.l->n ? l.u.l->items[0] : kp_jv_undef_hint(c, "No first item, sequence was empty.");
}

static jv f_last(jctx *c, jv v, const jargs *a) {
    (void)a;
    if (v.t == JT_LIST && v.gen) return kp_jfail(c, KP_JINJA_ETYPE, "'generator' object is not reversible");
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    return l.u.l->n ? l.u.l->items[l.u.l->n - 1] : kp_jv_undef_hint(c, "No last item, sequence was empty.");
}

static jv f_reverse(jctx *c, jv v, const jargs *a) {
    (void)a;
    if (v.t == JT_STR) return kp_jv_slice(c, v, jv_none(), jv_none(), jv_int(-1));
    jv l = kp_jv_iter_list(c, v);
    if (c->failed) return l;
    jv out = kp_jv_list(c, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n && !c->failed; i++) out.u.l->items[i] = l.u.l->items[l.u.l->n - 1 - i];
    out.gen = v.t == JT_LIST && !v.gen; /* reversed(list) is an iterator; a generator is listed first */
    return out;
}

static jv f_batch(jctx *c, jv v, const jargs *a) {
    jv l = kp_jv_iter_list(c, v);
    jv count = kp_jarg(a, 0, "linecount", NULL);
    bool has_fill;
    jv fill = kp_jarg(a, 1, "fill_with", &has_fill);
    if (c->failed) return l;
    if (count.t != JT_INT || count.u.i <= 0) return kp_jfail(c, KP_JINJA_EVALUE, "batch size must be a positive integer");
    size_t k = (size_t)count.u.i, n = l.u.l->n, nb = (n + k - 1) / k;
    jv out = kp_jv_list(c, nb);
    for (size_t b = 0; b < nb && !c->failed; b++) {
        size_t len = (b + 1) * k <= n ? k : n - b * k;
        size_t full = (has_fill && fill.t != JT_NONE) ? k : len;
        jv row = kp_jv_list(c, full);
        for (size_t i = 0; i < full && !c->failed; i++) row.u.l->items[i] = i < len ? l.u.l->items[b * k + i] : fill;
        out.u.l->items[b] = row;
    }
    out.gen = 1;
    return out;
}

static jv f_wordcount(jctx *c, jv v, const jargs *a) {
    (void)a;
    jv s = kp_jv_to_str(c, v);
    if (c->failed) return s;
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s.u.s->len; i++) {
        unsigned char ch = (unsigned char)s.u.s->s[i];
        bool w = isalnum(ch) || ch == '_' || ch >= 0x80;
        if (w && !in) n++;
        in = w;
    }
    return jv_int(n);
}


static jv f_escape(jctx *c, jv v, const jargs *a) {
    (void)a;
    return kp_jinja_escape(c, v);
}

static jv f_format(jctx *c, jv v, const jargs *a) {
    jv s = kp_jv_to_str(c, v);
    if (c->failed) return s;
    if (a->nkw && a->nargs) return kp_jfail(c, KP_JINJA_ETYPE, "can't handle positional and keyword arguments at the same time");
    jv args;
    if (a->nkw) {
        args = kp_jv_dict(c);
        for (size_t i = 0; i < a->nkw && !c->failed; i++) kp_jdict_set(c, args.u.d, kp_jv_strz(c, a->kwnames[i]), a->kwvals[i]);
    } else {
        args = kp_jv_list(c, a->nargs);
        args.tuple = 1;
        if (!c->failed && a->nargs) memcpy(args.u.l->items, a->args, a->nargs * sizeof(jv));
    }
    return kp_jinja_percent_format(c, s, args);
}

static jv f_sum(jctx *c, jv v, const jargs *a) {
    jv l = kp_jv_iter_list(c, v);
    jv attr = argv_or(a, 0, "attribute", jv_none());
    jv acc = argv_or(a, 1, "start", jv_int(0));
    for (size_t i = 0; !c->failed && i < l.u.l->n; i++) {
        jv x = attr.t == JT_NONE ? l.u.l->items[i] : attr_path(c, l.u.l->items[i], attr);
        if (!kp_jv_is_num(x) || !kp_jv_is_num(acc)) return kp_jfail(c, KP_JINJA_ETYPE, "unsupported operand type(s) for +");
        if (x.t == JT_FLOAT || acc.t == JT_FLOAT) acc = jv_float(kp_jv_num(acc) + kp_jv_num(x));
        else acc = jv_int((int64_t)kp_jv_num(acc) + (int64_t)kp_jv_num(x));
    }
    return acc;
}

static jv f_attr(jctx *c, jv v, const jargs *a) {
    jv name = kp_jarg(a, 0, "name", NULL);
    if (name.t != JT_STR) return jv_undef();
    return kp_jinja_getattr(c, v, name.u.s->s);
}

static jv f_center(jctx *c, jv v, const jargs *a) {
    jv s = kp_jv_to_str(c, v);
    jv w = argv_or(a, 0, "width", jv_int(80));
    if (c->failed || w.t != JT_INT) return s;
    size_t n = kp_utf8_count(s.u.s->s, s.u.s->len);
    if ((int64_t)n >= w.u.i || w.u.i > 100000) return s;
    size_t pad = (size_t)w.u.i - n, left = pad / 2 + (pad & (size_t)w.u.i & 1);
    kp_buf b = {0};
    kp_buf_fill(&b, ' ', left);
    kp_buf_put(&b, s.u.s->s, s.u.s->len);
    kp_buf_fill(&b, ' ', pad - left);
    return kp_jv_str_buf(c, &b);
}

static const filter_entry FILTERS[] = {
    {"abs", f_abs},         {"attr", f_attr},         {"batch", f_batch},     {"capitalize", f_capitalize},
    {"center", f_center},   {"count", f_length},      {"d", f_default},       {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},   {"first", f_first},
    {"float", f_float},     {"format", f_format},     {"indent", f_indent},   {"int", f_int},
    {"items", f_items},     {"join", f_join},         {"last", f_last},       {"length", f_length},
    {"list", f_list},       {"lower", f_lower},       {"map", f_map},         {"max", f_max},
    {"min", f_min},         {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round},       {"safe", f_safe},       {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort},   {"string", f_string},   {"sum", f_sum},
    {"title", f_title},     {"tojson", f_tojson},     {"trim", f_trim},       {"unique", f_unique},
    {"upper", f_upper},     {"wordcount", f_wordcount},
};

static int entry_cmp(const void *key, const void *e) { return strcmp(key, ((const filter_entry *)e)->name); }

bool kp_jinja_filter_known(const char *name) {
    return bsearch(name, FILTERS, sizeof FILTERS / sizeof *FILTERS, sizeof *FILTERS, entry_cmp) != NULL;
}

jv kp_jinja_filter(jctx *c, const char *name, jv v, const jargs *a) {
    const filter_entry *e = bsearch(name, FILTERS, sizeof FILTERS / sizeof *FILTERS, sizeof *FILTERS, entry_cmp);
    if (!e) return kp_jfail(c, KP_JINJA_ESYNTAX, "No filter named '%s'.", name);
    /* filters that do not take undefined values quietly */
    if (v.t == JT_UNDEF && (e->fn == f_tojson || e->fn == f_abs || e->fn == f_round || e->fn == f_attr)) {
        undef_check(c, v);
        return jv_undef();
    }
    return e->fn(c, v, a);
}

/* ---------------------------------------------------------------- tests */


static jv test_cmp(jctx *c, const char *name, jv v, jv o) {
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_bool(kp_jv_eq(v, o));
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return jv_bool(!kp_jv_eq(v, o));
    int r = kp_jv_cmp(c, v, o);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) return jv_bool(r < 0);
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return jv_bool(r <= 0);
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) return jv_bool(r > 0);
    return jv_bool(r >= 0);
}

static const char *const TESTS[] = {
    "!=", "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby", "eq", "equalto",
    "escaped", "even", "false", "filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable",
    "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper",
};

static int name_cmp(const void *key, const void *e) { return strcmp(key, *(const char *const *)e); }

bool kp_jinja_test_known(const char *name) {
    return bsearch(name, TESTS, sizeof TESTS / sizeof *TESTS, sizeof *TESTS, name_cmp) != NULL;
}

static bool sameas(jv v, jv o) {
    if (v.t != o.t) return false;
    switch (v.t) {
    case JT_NONE: case JT_UNDEF: return v.t == JT_NONE || v.u.hint == o.u.hint;
    case JT_BOOL: return v.u.b == o.u.b;
    case JT_INT: return v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256;
    case JT_STR: return v.u.s == o.u.s;
    case JT_LIST: return v.u.l == o.u.l;
    case JT_DICT: case JT_NS: return v.u.d == o.u.d;
    default: return kp_jv_eq(v, o);
    }
}

jv kp_jinja_test(jctx *c, const char *name, jv v, const jargs *a) {
    if (!kp_jinja_test_known(name)) return kp_jfail(c, KP_JINJA_ESYNTAX, "No test named '%s'.", name);
    jv o = kp_jarg(a, 0, NULL, NULL);
    if (!strcmp(name, "defined")) return jv_bool(v.t != JT_UNDEF);
    if (!strcmp(name, "undefined")) return jv_bool(v.t == JT_UNDEF);
    if (!strcmp(name, "none")) return jv_bool(v.t == JT_NONE);
    if (!strcmp(name, "string")) return jv_bool(v.t == JT_STR);
    if (!strcmp(name, "number")) return jv_bool(kp_jv_is_num(v));
    if (!strcmp(name, "integer")) return jv_bool(v.t == JT_INT);
    if (!strcmp(name, "float")) return jv_bool(v.t == JT_FLOAT);
    if (!strcmp(name, "boolean")) return jv_bool(v.t == JT_BOOL);
    if (!strcmp(name, "true")) return jv_bool(v.t == JT_BOOL && v.u.b);
    if (!strcmp(name, "false")) return jv_bool(v.t == JT_BOOL && !v.u.b);
    if (!strcmp(name, "mapping")) return jv_bool(v.t == JT_DICT);
    /* Undefined has __len__, __getitem__ and __call__: a sequence, and callable */
    if (!strcmp(name, "sequence")) return jv_bool(v.t == JT_STR || (v.t == JT_LIST && !v.gen) || v.t == JT_DICT || v.t == JT_UNDEF);
    if (!strcmp(name, "iterable")) return jv_bool(kp_jv_is_iterable(v));
    if (!strcmp(name, "callable")) return jv_bool(v.t == JT_FUNC || v.t == JT_UNDEF);
    if (!strcmp(name, "escaped")) return jv_bool(false);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) { /* str(v).islower() / .isupper() */
        jv s = kp_jv_to_str(c, v);
        return c->failed ? s : jv_bool(kp_str_is_case(c, s, name[0] == 'u'));
    }
    if (!strcmp(name, "sameas")) return jv_bool(sameas(v, o));
    if (!strcmp(name, "in")) {
        if (o.t == JT_STR && v.t == JT_STR) return jv_bool(v.u.s->len == 0 || memmem(o.u.s->s, o.u.s->len, v.u.s->s, v.u.s->len));
        jv l = kp_jv_iter_list(c, o);
        for (size_t i = 0; !c->failed && i < l.u.l->n; i++)
            if (kp_jv_eq(l.u.l->items[i], v)) return jv_bool(true);
        return jv_bool(false);
    }
    if (!strcmp(name, "filter")) return jv_bool(v.t == JT_STR && kp_jinja_filter_known(v.u.s->s));
    if (!strcmp(name, "test")) return jv_bool(v.t == JT_STR && kp_jinja_test_known(v.u.s->s));
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (!undef_check(c, v)) return jv_undef();
        if (v.t != JT_INT && v.t != JT_BOOL && v.t != JT_FLOAT)
            return kp_jfail(c, KP_JINJA_ETYPE, "unsupported operand type(s) for %%: '%s' and 'int'", kp_jv_typename(v));
        double x = kp_jv_num(v), d = !strcmp(name, "divisibleby") ? kp_jv_num(o) : 2;
        if (d == 0) return kp_jfail(c, KP_JINJA_EVALUE, "integer modulo by zero");
        double m = fmod(x, d);
        if (m != 0 && ((m < 0) != (d < 0))) m += d; /* Python's % */
        if (!strcmp(name, "odd")) return jv_bool(m == 1);
        return jv_bool(m == 0);
    }
    return test_cmp(c, name, v, o);
}
