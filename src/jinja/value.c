/*
 * value.c - the arena and the runtime values of a render, with the Python
 * behaviour jinja2 inherits: str() and repr(), ==, ordering, truthiness,
 * len(), iteration, and values to and from JSON.
 *
 * Arena: chunks of at least 64 KiB, bump-allocated, 16-byte aligned, freed
 * together; `limit` caps the bytes taken (KP_JINJA_MAX_MEMORY per render).
 *
 * Python's printing rules kept here:
 *   str(None) "None", str(True) "True", floats as repr() (shortest digits
 *   that read back; exponent form below 1e-4 and from 1e16: "1e-05",
 *   "1e+16"; "1.0" for integral values), lists "[1, 'a']", tuples "(1,)",
 *   dicts "{'k': 'v'}", strings in repr with ' quotes unless they hold a '
 *   and no ".
 *   Equality: 1 == 1.0 == True; strings, lists, dicts by content.
 *
 * Errors: kp_jfail records the first error of a render (kind, message, the
 * position of the node being evaluated) and every later step sees
 * c->failed and unwinds; kp_jinja_seterr fills a kp_jinja_error.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

struct jchunk {
    jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *kp_ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > (64u << 10) - sizeof(jchunk) ? n : (64u << 10) - sizeof(jchunk);
        if (a->limit && a->total + size + sizeof(jchunk) > a->limit) return NULL;
        c = malloc(sizeof(jchunk) + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->total += size + sizeof(jchunk);
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *kp_ja_strndup(jarena *a, const char *s, size_t n) {
    char *d = kp_ja_alloc(a, n + 1);
    if (d && n) memcpy(d, s, n);
    return d;
}

size_t kp_ja_used(const jarena *a) {
    size_t n = 0;
    for (const jchunk *c = a->head; c; c = c->next) n += sizeof *c + c->used;
    return n;
}

void kp_ja_free(jarena *a) {
    for (jchunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* ---------------------------------------------------------------- constructors */

static jv oom(jctx *c) {
    if (c->arena.limit && c->arena.total + (64u << 10) > c->arena.limit)
        return kp_jfail(c, KP_JINJA_ELIMIT, "the render needs more than %ld bytes of memory", (long)KP_JINJA_MAX_MEMORY);
    return kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
}

jv kp_jv_undef_hint(jctx *c, const char *fmt, ...) {
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    jv v = jv_undef();
    v.u.hint = kp_ja_strndup(&c->arena, m, strlen(m));
    return v;
}

void kp_jv_check_string(jctx *c, size_t n) {
    if (n > (size_t)KP_JINJA_MAX_STRING && !c->failed)
        kp_jfail(c, KP_JINJA_ELIMIT, "a string of %zu bytes is longer than the limit of %ld", n, (long)KP_JINJA_MAX_STRING);
}

void kp_jv_check_items(jctx *c, size_t n) {
    if (n > (size_t)KP_JINJA_MAX_ITEMS && !c->failed)
        kp_jfail(c, KP_JINJA_ELIMIT, "a list of %zu items is longer than the limit of %ld", n, (long)KP_JINJA_MAX_ITEMS);
}

jv kp_jv_str(jctx *c, const char *s, size_t n) {
    kp_jv_check_string(c, n);
    if (c->failed) return jv_undef();
    jstr *js = kp_ja_alloc(&c->arena, sizeof(jstr) + n + 1);
    if (!js) return oom(c);
    js->len = n;
    js->born = ++c->n_str;
    if (n && s) memcpy(js->s, s, n);
    jv v = {0};
    v.t = JT_STR;
    v.u.s = js;
    return v;
}

jv kp_jv_strz(jctx *c, const char *s) { return kp_jv_str(c, s, strlen(s)); }

jv kp_jv_str_client(jctx *c, const char *s, size_t n) {
    jv v = kp_jv_str(c, s, n);
    if (c->failed || n == 0) return v;
    uint8_t *t = kp_ja_alloc(&c->arena, n);
    if (!t) return oom(c);
    memset(t, 1, n);
    v.u.s->taint = t;
    return v;
}

jv kp_jv_substr(jctx *c, jv s, size_t at, size_t n) {
    jv v = kp_jv_str(c, s.u.s->s + at, n);
    if (!c->failed && s.u.s->taint) v.u.s->taint = s.u.s->taint + at; /* shared: arrays are never written */
    return v;
}

/* A string of JSON text: client text while the context's client members load. */
static jv json_str(jctx *c, const char *s, size_t n) {
    return c->load_client ? kp_jv_str_client(c, s, n) : kp_jv_str(c, s, n);
}

jv kp_jv_str_buf(jctx *c, kp_buf *b) {
    jv v;
    if (b->oom) v = oom(c);
    else v = kp_jv_str(c, b->data ? b->data : "", b->len);
    kp_buf_free(b);
    return v;
}

jv kp_jv_list(jctx *c, size_t n) {
    kp_jv_check_items(c, n);
    if (c->failed) return jv_undef();
    jlist *l = kp_ja_alloc(&c->arena, sizeof *l);
    jv *items = n ? kp_ja_alloc(&c->arena, n * sizeof(jv)) : NULL;
    if (!l || (n && !items)) return oom(c);
    l->n = n;
    l->items = items;
    jv v = {0};
    v.t = JT_LIST;
    v.u.l = l;
    return v;
}

jv kp_jv_func(jctx *c, int kind, const char *name) {
    jfunc *fn = kp_ja_alloc(&c->arena, sizeof *fn);
    if (!fn) return oom(c);
    fn->kind = kind;
    fn->name = name;
    jv v = {0};
    v.t = JT_FUNC;
    v.u.fn = fn;
    return v;
}

jv kp_jv_dict(jctx *c) {
    jdict *d = kp_ja_alloc(&c->arena, sizeof *d);
    if (!d) return oom(c);
    jv v = {0};
    v.t = JT_DICT;
    v.u.d = d;
    return v;
}

jv *kp_jdict_get(const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (kp_jv_eq(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

jv *kp_jdict_gets(const jdict *d, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].t == JT_STR && d->keys[i].u.s->len == n && memcmp(d->keys[i].u.s->s, key, n) == 0)
            return &d->vals[i];
    return NULL;
}

bool kp_jdict_set(jctx *c, jdict *d, jv key, jv val) {
    jv *old = kp_jdict_get(d, key);
    if (old) { *old = val; return true; }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        kp_jv_check_items(c, cap);
        jv *k = kp_ja_alloc(&c->arena, cap * sizeof(jv)), *v = kp_ja_alloc(&c->arena, cap * sizeof(jv));
        if (c->failed) return false;
        if (!k || !v) { oom(c); return false; }
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof(jv));
            memcpy(v, d->vals, d->n * sizeof(jv));
        }
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
    return true;
}

/* ---------------------------------------------------------------- JSON */

jv kp_jv_from_json(jctx *c, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = kp_jv_dict(c);
        const char *k;
        json_t *v;
        if (c->failed) return d;
        json_object_foreach((json_t *)j, k, v) {
            if (!kp_jdict_set(c, d.u.d, json_str(c, k, strlen(k)), kp_jv_from_json(c, v))) break;
        }
        return d;
    }
    case JSON_ARRAY: {
        jv l = kp_jv_list(c, json_array_size(j));
        for (size_t i = 0; !c->failed && i < l.u.l->n; i++) l.u.l->items[i] = kp_jv_from_json(c, json_array_get(j, i));
        return l;
    }
    case JSON_STRING: return json_str(c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

json_t *kp_jv_to_json(jctx *c, jv v) {
    switch (v.t) {
    case JT_NONE: return json_null();
    case JT_BOOL: return json_boolean(v.u.b);
    case JT_INT: return json_integer((json_int_t)v.u.i);
    case JT_FLOAT: return json_real(v.u.f);
    case JT_STR: return json_stringn_nocheck(v.u.s->s, v.u.s->len);
    case JT_LIST: {
        if (v.gen) break;
        json_t *a = json_array();
        for (size_t i = 0; a && i < v.u.l->n; i++) {
            json_t *x = kp_jv_to_json(c, v.u.l->items[i]);
            if (!x) { json_decref(a); return NULL; }
            json_array_append_new(a, x);
        }
        return a;
    }
    case JT_DICT:
    case JT_NS: {
        json_t *o = json_object();
        for (size_t i = 0; o && i < v.u.d->n; i++) {
            if (v.u.d->keys[i].t != JT_STR) {
                json_decref(o);
                kp_jfail(c, KP_JINJA_ETYPE, "keys must be str, int, float, bool or None, not %s", kp_jv_typename(v.u.d->keys[i]));
                return NULL;
            }
            json_t *x = kp_jv_to_json(c, v.u.d->vals[i]);
            if (!x) { json_decref(o); return NULL; }
            json_object_setn_new_nocheck(o, v.u.d->keys[i].u.s->s, v.u.d->keys[i].u.s->len, x);
        }
        return o;
    }
    default: break;
    }
    kp_jfail(c, KP_JINJA_ETYPE, "not JSON: %s", kp_jv_typename(v));
    return NULL;
}

/* ---------------------------------------------------------------- Python semantics */

const char *kp_jv_typename(jv v) {
    switch (v.t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST: return v.gen ? "generator" : v.tuple ? "tuple" : "list";
    case JT_DICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_LOOP: return "LoopContext";
    default: return "function";
    }
}

bool kp_jv_truthy(jv v) {
    switch (v.t) {
    case JT_UNDEF: case JT_NONE: return false;
    case JT_BOOL: return v.u.b;
    case JT_INT: return v.u.i != 0;
    case JT_FLOAT: return v.u.f != 0.0;
    case JT_STR: return v.u.s->len != 0;
    case JT_LIST: return v.gen || v.u.l->n != 0;
    case JT_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

bool kp_jv_is_num(jv v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }

double kp_jv_num(jv v) {
    return v.t == JT_FLOAT ? v.u.f : v.t == JT_INT ? (double)v.u.i : v.t == JT_BOOL ? (double)v.u.b : 0.0;
}

bool kp_jv_eq(jv a, jv b) {
    if (kp_jv_is_num(a) && kp_jv_is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t x = a.t == JT_BOOL ? a.u.b : a.u.i, y = b.t == JT_BOOL ? b.u.b : b.u.i;
            return x == y;
        }
        return kp_jv_num(a) == kp_jv_num(b);
    }
    if ((a.t == JT_DICT || a.t == JT_NS) && a.t == b.t) {
        if (a.u.d == b.u.d) return true;
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = kp_jdict_get(b.u.d, a.u.d->keys[i]);
            if (!o || !kp_jv_eq(a.u.d->vals[i], *o)) return false;
        }
        return true;
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JT_UNDEF: case JT_NONE: return true;
    case JT_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JT_LIST:
        if (a.gen || b.gen) return a.u.l == b.u.l;
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!kp_jv_eq(a.u.l->items[i], b.u.l->items[i])) return false;
        return true;
    case JT_LOOP: return a.u.loop == b.u.loop;
    case JT_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

int kp_jv_cmp(jctx *c, jv a, jv b) {
    if (kp_jv_is_num(a) && kp_jv_is_num(b)) {
        double x = kp_jv_num(a), y = kp_jv_num(b);
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t p = a.t == JT_BOOL ? a.u.b : a.u.i, q = b.t == JT_BOOL ? b.u.b : b.u.i;
            return p < q ? -1 : p > q;
        }
        return x < y ? -1 : x > y;
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, n);
        if (r) return r;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.t == JT_LIST && b.t == JT_LIST && a.tuple == b.tuple) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (kp_jv_eq(a.u.l->items[i], b.u.l->items[i])) continue;
            return kp_jv_cmp(c, a.u.l->items[i], b.u.l->items[i]);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    if (a.t == JT_UNDEF || b.t == JT_UNDEF) {
        kp_jfail(c, KP_JINJA_EUNDEFINED, "%s", (a.t == JT_UNDEF ? a : b).u.hint ? (a.t == JT_UNDEF ? a : b).u.hint : "value is undefined");
        return 0;
    }
    kp_jfail(c, KP_JINJA_ETYPE, "'<' not supported between instances of '%s' and '%s'", kp_jv_typename(a), kp_jv_typename(b));
    return 0;
}

void kp_py_float_repr(double x, char out[40]) {
    if (isnan(x)) { strcpy(out, "nan"); return; }
    if (isinf(x)) { strcpy(out, x < 0 ? "-inf" : "inf"); return; }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, exp10;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -5 + 1 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp10 + 1) for (int i = exp10 + 1; i < nd; i++) *o++ = digits[i];
            else *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        }
        *o = 0;
        return;
    }
    *o++ = digits[0];
    if (nd > 1) {
        *o++ = '.';
        for (int i = 1; i < nd; i++) *o++ = digits[i];
    }
    int e = exp10 < 0 ? -exp10 : exp10;
    *o++ = 'e';
    *o++ = exp10 < 0 ? '-' : '+';
    if (e >= 100) *o++ = (char)('0' + e / 100);
    *o++ = (char)('0' + e / 10 % 10);
    *o++ = (char)('0' + e % 10);
    *o = 0;
}

static void write_str_repr(kp_buf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    kp_buf_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == (unsigned char)q || ch == '\\') { kp_buf_putc(b, '\\'); kp_buf_putc(b, (char)ch); }
        else if (ch == '\n') kp_buf_puts(b, "\\n");
        else if (ch == '\r') kp_buf_puts(b, "\\r");
        else if (ch == '\t') kp_buf_puts(b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) kp_buf_printf(b, "\\x%02x", ch);
        else kp_buf_putc(b, (char)ch);
    }
    kp_buf_putc(b, q);
}

static void write_value(kp_buf *b, jv v, bool repr) {
    char num[40];
    switch (v.t) {
    case JT_UNDEF:
        if (repr) kp_buf_puts(b, "Undefined"); /* repr(Undefined()) inside a list */
        break;
    case JT_NONE: kp_buf_puts(b, "None"); break;
    case JT_BOOL: kp_buf_puts(b, v.u.b ? "True" : "False"); break;
    case JT_INT: kp_buf_printf(b, "%lld", (long long)v.u.i); break;
    case JT_FLOAT: kp_py_float_repr(v.u.f, num); kp_buf_puts(b, num); break;
    case JT_STR:
        if (repr && v.markup) kp_buf_puts(b, "Markup(");
        if (repr) write_str_repr(b, v.u.s->s, v.u.s->len);
        else kp_buf_put(b, v.u.s->s, v.u.s->len);
        if (repr && v.markup) kp_buf_putc(b, ')');
        break;
    case JT_LIST:
        if (v.gen) { kp_buf_puts(b, "<generator object>"); break; }
        kp_buf_putc(b, v.tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n && !b->oom; i++) {
            if (i) kp_buf_puts(b, ", ");
            write_value(b, v.u.l->items[i], true);
        }
        if (v.tuple && v.u.l->n == 1) kp_buf_putc(b, ',');
        kp_buf_putc(b, v.tuple ? ')' : ']');
        break;
    case JT_DICT:
        kp_buf_putc(b, '{');
        for (size_t i = 0; i < v.u.d->n && !b->oom; i++) {
            if (i) kp_buf_puts(b, ", ");
            write_value(b, v.u.d->keys[i], true);
            kp_buf_puts(b, ": ");
            write_value(b, v.u.d->vals[i], true);
        }
        kp_buf_putc(b, '}');
        break;
    case JT_NS:
        kp_buf_puts(b, "<Namespace ");
        write_value(b, (jv){.t = JT_DICT, .u.d = v.u.d}, true);
        kp_buf_putc(b, '>');
        break;
    case JT_LOOP: kp_buf_puts(b, "<LoopContext>"); break;
    default: kp_buf_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?"); break;
    }
}

void kp_jv_write_str(kp_buf *b, jv v) { write_value(b, v, false); }
void kp_jv_write_repr(kp_buf *b, jv v) { write_value(b, v, true); }

jv kp_jv_to_str(jctx *c, jv v) {
    if (v.t == JT_STR) return v;
    kp_buf b = {0};
    kp_jv_write_str(&b, v);
    return kp_jv_str_buf(c, &b);
}

size_t kp_utf8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t kp_utf8_offset(const char *s, size_t n, size_t cp) {
    size_t k = 0, i;
    for (i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == cp) return i;
            k++;
        }
    }
    return n;
}

size_t kp_jv_length(jctx *c, jv v) {
    switch (v.t) {
    case JT_STR: return kp_utf8_count(v.u.s->s, v.u.s->len);
    case JT_LIST:
        if (!v.gen) return v.u.l->n;
        break;
    case JT_DICT: case JT_NS: return v.u.d->n;
    case JT_UNDEF: return 0;
    default: break;
    }
    kp_jfail(c, KP_JINJA_ETYPE, "object of type '%s' has no len()", kp_jv_typename(v));
    return 0;
}

bool kp_jv_is_iterable(jv v) {
    return v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF || v.t == JT_LOOP;
}

jv kp_jv_iter_list(jctx *c, jv v) {
    switch (v.t) {
    case JT_LIST:
        v.gen = 0;
        return v;
    case JT_UNDEF: return kp_jv_list(c, 0);
    case JT_DICT: {
        jv l = kp_jv_list(c, v.u.d->n);
        if (!c->failed && v.u.d->n) memcpy(l.u.l->items, v.u.d->keys, v.u.d->n * sizeof(jv));
        return l;
    }
    case JT_STR: {
        jv l = kp_jv_list(c, kp_utf8_count(v.u.s->s, v.u.s->len));
        const char *s = v.u.s->s;
        size_t i = 0, n = v.u.s->len;
        for (size_t k = 0; !c->failed && k < l.u.l->n; k++) {
            size_t j = i + 1;
            while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
            l.u.l->items[k] = kp_jv_str(c, s + i, j - i);
            if (!c->failed && v.u.s->taint) l.u.l->items[k].u.s->taint = v.u.s->taint + i; /* shared */
            i = j;
        }
        return l;
    }
    default:
        return kp_jfail(c, KP_JINJA_ETYPE, "'%s' object is not iterable", kp_jv_typename(v));
    }
}

/* ---------------------------------------------------------------- errors and arguments */

void kp_jinja_seterr(kp_jinja_error *err, kp_jinja_kind kind, int line, int col, const char *fmt, ...) {
    if (!err) return;
    static const kp_status codes[] = {KP_OK, KP_EFORMAT, KP_EINVAL, KP_EINVAL, KP_EINVAL,
                                      KP_EINVAL, KP_EINVAL, KP_ERANGE, KP_ENOMEM};
    err->kind = kind;
    err->code = codes[kind];
    err->line = line;
    err->col = col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

jv kp_jfail(jctx *c, kp_jinja_kind kind, const char *fmt, ...) {
    if (c->failed) return jv_undef();
    c->failed = true;
    if (c->err) {
        char m[KP_ERROR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        kp_jinja_seterr(c->err, kind, c->at ? c->at->line : 0, c->at ? c->at->col : 0, "%s", m);
    }
    return jv_undef();
}

jv kp_jarg(const jargs *a, size_t pos, const char *name, bool *present) {
    if (present) *present = true;
    if (pos < a->nargs) return a->args[pos];
    for (size_t i = 0; name && i < a->nkw; i++)
        if (strcmp(a->kwnames[i], name) == 0) return a->kwvals[i];
    if (present) *present = false;
    return jv_undef();
}

/* Fails with the error an undefined value raises when used. */
jv kp_jv_undef_fail(jctx *c, jv u) {
    if (u.unsafe) return kp_jfail(c, KP_JINJA_ESECURITY, "%s", u.u.hint);
    return kp_jfail(c, KP_JINJA_EUNDEFINED, "%s", u.u.hint ? u.u.hint : "value is undefined");
}
