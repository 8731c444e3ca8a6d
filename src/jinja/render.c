/*
 * render.c - the interpreter: statements and expressions over the syntax
 * tree, scopes, macros, the limits, and the public entry points.
 *
 * Scopes (jframe) follow jinja2's rules: the template has one root frame
 * (the context's variables, then its top-level `set`s); `if` opens no
 * scope; each iteration of a `for` runs in a fresh frame over the
 * enclosing one (so a `set` in a loop is gone at the next iteration and
 * after the loop: namespace() is how templates carry values out); a macro
 * call runs in a frame over the frame the macro was defined in. A name not
 * found in any frame is a global (range, namespace, raise_exception...) or
 * an undefined value that remembers its name for the error it may raise.
 *
 * Attribute and item lookup (methods.c) are jinja2's sandboxed
 * getattr/getitem; the sandbox refuses the mutating methods with
 * SecurityError when they are called.
 *
 * Every statement, loop iteration and call is one step; KP_JINJA_MAX_STEPS
 * bounds them, KP_JINJA_MAX_DEPTH the nesting of macro calls,
 * KP_JINJA_MAX_RECURSION the expression and block levels open at once (the
 * C stack), KP_JINJA_MAX_OUTPUT the bytes written (including macro
 * results). A failed render leaves the caller's buffer as it was.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

struct kp_jinja {
    jarena arena;
    jnode *root;
    size_t src_len;
};

struct jframe {
    jframe *parent;
    size_t n, cap;
    const char **names;
    jv *vals;
};

typedef enum { X_OK, X_BREAK, X_CONTINUE, X_ERR } xres;

static jv eval(jctx *c, jframe *f, const jnode *n);
static xres exec_body(jctx *c, jframe *f, const jnode *body);

/* ---------------------------------------------------------------- errors */



const char *kp_jinja_kind_name(kp_jinja_kind kind) {
    static const char *const names[] = {"OK", "TemplateSyntaxError", "TemplateError", "UndefinedError",
                                        "TypeError", "ValueError", "SecurityError", "LimitError", "MemoryError"};
    return (unsigned)kind < sizeof names / sizeof *names ? names[kind] : "Error";
}

static bool step(jctx *c) {
    if (++c->steps > KP_JINJA_MAX_STEPS) {
        kp_jfail(c, KP_JINJA_ELIMIT, "the template ran more than %ld steps", (long)KP_JINJA_MAX_STEPS);
        return false;
    }
    return !c->failed;
}


/* ---------------------------------------------------------------- frames */

static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = kp_ja_alloc(&c->arena, sizeof *f);
    if (!f) { kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); return NULL; }
    f->parent = parent;
    return f;
}

static bool frame_set(jctx *c, jframe *f, const char *name, jv v) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0) { f->vals[i] = v; return true; }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nm = kp_ja_alloc(&c->arena, cap * sizeof *nm);
        jv *vals = kp_ja_alloc(&c->arena, cap * sizeof *vals);
        if (!nm || !vals) { kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); return false; }
        if (f->n) { memcpy(nm, f->names, f->n * sizeof *nm); memcpy(vals, f->vals, f->n * sizeof *vals); }
        f->names = nm;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return true;
}

static jv lookup(jctx *c, jframe *f, const char *name) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (strcmp(f->names[i], name) == 0) return f->vals[i];
    jv g = kp_jinja_global(c, name);
    if (g.t != JT_UNDEF) return g;
    return kp_jv_undef_hint(c, "'%s' is undefined", name);
}

/* ---------------------------------------------------------------- lookups */




/* ---------------------------------------------------------------- operators */

static jv arith_int(jctx *c, jop op, int64_t x, int64_t y) {
    int64_t r;
    switch (op) {
    case OP_ADD: if (__builtin_add_overflow(x, y, &r)) break; return jv_int(r);
    case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) break; return jv_int(r);
    case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) break; return jv_int(r);
    case OP_DIV:
        if (y == 0) return kp_jfail(c, KP_JINJA_EVALUE, "division by zero");
        return jv_float((double)x / (double)y);
    case OP_FLOORDIV:
    case OP_MOD: {
        if (y == 0) return kp_jfail(c, KP_JINJA_EVALUE, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) break;
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
        return jv_int(op == OP_MOD ? m : q);
    }
    case OP_POW: {
        if (y < 0 && x == 0) return kp_jfail(c, KP_JINJA_EVALUE, "0.0 cannot be raised to a negative power");
        if (y < 0) return jv_float(pow((double)x, (double)y));
        int64_t acc = 1, base = x;
        bool over = false;
        for (int64_t e = y; e > 0 && !over; e >>= 1) {
            if (e & 1) over |= __builtin_mul_overflow(acc, base, &acc);
            if (e > 1) over |= __builtin_mul_overflow(base, base, &base);
        }
        if (!over) return jv_int(acc);
        break;
    }
    default: break;
    }
    return kp_jfail(c, KP_JINJA_ELIMIT, "integer result out of the 64-bit range");
}

static jv arith_float(jctx *c, jop op, double x, double y) {
    switch (op) {
    case OP_ADD: return jv_float(x + y);
    case OP_SUB: return jv_float(x - y);
    case OP_MUL: return jv_float(x * y);
    case OP_DIV:
        if (y == 0) return kp_jfail(c, KP_JINJA_EVALUE, "float division by zero");
        return jv_float(x / y);
    case OP_FLOORDIV: {
        if (y == 0) return kp_jfail(c, KP_JINJA_EVALUE, "float floor division by zero");
        /* CPython's float_floor_div: through fmod, so 1 // 0.1 is 9.0 */
        double mod = fmod(x, y), div = (x - mod) / y, fl;
        if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
        if (div != 0) {
            fl = floor(div);
            if (div - fl > 0.5) fl += 1.0;
        } else {
            fl = copysign(0.0, x / y);
        }
        return jv_float(fl);
    }
    case OP_MOD: {
        if (y == 0) return kp_jfail(c, KP_JINJA_EVALUE, "float modulo");
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        if (m == 0) m = copysign(0.0, y); /* Python: the sign of the divisor */
        return jv_float(m);
    }
    case OP_POW: {
        if (x == 0 && y < 0) return kp_jfail(c, KP_JINJA_EVALUE, "0.0 cannot be raised to a negative power");
        double r = pow(x, y);
        if (isinf(r) && isfinite(x) && isfinite(y)) return kp_jfail(c, KP_JINJA_EVALUE, "(34, 'Numerical result out of range')");
        return jv_float(r);
    }
    default: return jv_undef();
    }
}

static jv repeat(jctx *c, jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.t == JT_STR) {
        size_t n = seq.u.s->len;
        if (n && (uint64_t)times > (uint64_t)KP_JINJA_MAX_STRING / n) kp_jv_check_string(c, (size_t)KP_JINJA_MAX_STRING + 1);
        if (c->failed) return jv_undef();
        kp_buf b = {0};
        for (int64_t i = 0; i < times; i++) kp_buf_put(&b, seq.u.s->s, n);
        return kp_jt_repeat(c, kp_jv_str_buf(c, &b), seq);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > (uint64_t)KP_JINJA_MAX_ITEMS / n) kp_jv_check_items(c, (size_t)KP_JINJA_MAX_ITEMS + 1);
    if (c->failed) return jv_undef();
    jv r = kp_jv_list(c, n * (size_t)times);
    for (size_t i = 0; !c->failed && i < r.u.l->n; i++) r.u.l->items[i] = seq.u.l->items[i % n];
    r.tuple = seq.tuple;
    return r;
}

static const char *op_sym(jop op) {
    static const char *const s[] = {"+", "-", "*", "/", "//", "%", "**"};
    return op <= OP_POW ? s[op] : "?";
}

static jv binop(jctx *c, jop op, jv a, jv b) {
    if (op == OP_MOD && a.t == JT_STR) { /* str % Undefined is Python's */
        uint64_t born = c->n_str + 1;
        jargs args = {.args = &b, .nargs = 1};
        return kp_jt_derived(c, kp_jinja_percent_format(c, a, b), born, a, &args);
    }
    if (a.t == JT_UNDEF) return kp_jv_undef_fail(c, a);
    if (b.t == JT_UNDEF) return kp_jv_undef_fail(c, b);
    if (kp_jv_is_num(a) && kp_jv_is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT)
            return arith_int(c, op, a.t == JT_BOOL ? a.u.b : a.u.i, b.t == JT_BOOL ? b.u.b : b.u.i);
        return arith_float(c, op, kp_jv_num(a), kp_jv_num(b));
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) {
        bool markup = a.markup || b.markup; /* Markup + str escapes the str (its taint goes whole) */
        uint64_t born = c->n_str + 1;
        if (markup && !a.markup) a = kp_jt_derived(c, kp_jinja_escape(c, a), born, a, NULL);
        if (markup && !b.markup) b = kp_jt_derived(c, kp_jinja_escape(c, b), born, b, NULL);
        if (c->failed) return jv_undef();
        jv r = kp_jt_concat(c, a, b);
        r.markup = markup;
        return r;
    }
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST && a.tuple == b.tuple && !a.gen && !b.gen) {
        jv r = kp_jv_list(c, a.u.l->n + b.u.l->n);
        if (c->failed) return r;
        if (a.u.l->n) memcpy(r.u.l->items, a.u.l->items, a.u.l->n * sizeof(jv));
        if (b.u.l->n) memcpy(r.u.l->items + a.u.l->n, b.u.l->items, b.u.l->n * sizeof(jv));
        r.tuple = a.tuple;
        return r;
    }
    if (op == OP_MUL && (a.t == JT_STR || a.t == JT_LIST) && (b.t == JT_INT || b.t == JT_BOOL))
        return repeat(c, a, b.t == JT_BOOL ? b.u.b : b.u.i);
    if (op == OP_MUL && (b.t == JT_STR || b.t == JT_LIST) && (a.t == JT_INT || a.t == JT_BOOL))
        return repeat(c, b, a.t == JT_BOOL ? a.u.b : a.u.i);
    if (op == OP_ADD && a.t == JT_STR)
        return kp_jfail(c, KP_JINJA_ETYPE, "can only concatenate str (not \"%s\") to str", kp_jv_typename(b));
    if (op == OP_ADD && a.t == JT_LIST)
        return kp_jfail(c, KP_JINJA_ETYPE, "can only concatenate %s (not \"%s\") to %s", kp_jv_typename(a), kp_jv_typename(b), kp_jv_typename(a));
    return kp_jfail(c, KP_JINJA_ETYPE, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), kp_jv_typename(a), kp_jv_typename(b));
}

static bool contains(jctx *c, jv container, jv item) {
    switch (container.t) {
    case JT_STR:
        if (item.t != JT_STR) {
            kp_jfail(c, KP_JINJA_ETYPE, "'in <string>' requires string as left operand, not %s", kp_jv_typename(item));
            return false;
        }
        if (item.u.s->len == 0) return true;
        return memmem(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    case JT_LIST:
        for (size_t i = 0; i < container.u.l->n; i++)
            if (kp_jv_eq(container.u.l->items[i], item)) return true;
        return false;
    case JT_DICT: case JT_NS:
        if ((item.t == JT_LIST && !item.tuple) || item.t == JT_DICT || item.t == JT_NS) {
            kp_jfail(c, KP_JINJA_ETYPE, "unhashable type: '%s'", kp_jv_typename(item));
            return false;
        }
        return kp_jdict_get(container.u.d, item) != NULL;
    case JT_UNDEF: return false;
    default:
        kp_jfail(c, KP_JINJA_ETYPE, "argument of type '%s' is not iterable", kp_jv_typename(container));
        return false;
    }
}

static bool compare(jctx *c, jop op, jv a, jv b) {
    switch (op) {
    case OP_EQ: return kp_jv_eq(a, b);
    case OP_NE: return !kp_jv_eq(a, b);
    case OP_IN: return contains(c, b, a);
    case OP_NOTIN: return !contains(c, b, a) && !c->failed;
    default: break;
    }
    int r = kp_jv_cmp(c, a, b);
    if (op == OP_LT) return r < 0;
    if (op == OP_LE) return r <= 0;
    if (op == OP_GT) return r > 0;
    return r >= 0;
}

/* ---------------------------------------------------------------- calls */


/* The body's output as a string, with its taint (macros, set blocks, filter blocks). */
static jv capture(jctx *c, jframe *f, const jnode *body) {
    kp_buf buf = {0}, tbuf = {0}, *saved = c->out, *tsaved = c->tout;
    c->out = &buf;
    if (tsaved) c->tout = &tbuf;
    xres r = exec_body(c, f, body);
    c->out = saved;
    c->tout = tsaved;
    if (r == X_ERR || c->failed) {
        kp_buf_free(&buf);
        kp_buf_free(&tbuf);
        return jv_undef();
    }
    return kp_jt_str_bufs(c, &buf, tsaved ? &tbuf : NULL);
}

static jv call_macro(jctx *c, jfunc *fn, const jargs *a) {
    const jnode *m = fn->macro;
    if (c->depth >= KP_JINJA_MAX_DEPTH)
        return kp_jfail(c, KP_JINJA_ELIMIT, "macro calls nested deeper than %d", KP_JINJA_MAX_DEPTH);
    jframe *f = frame_new(c, fn->closure);
    if (!f) return jv_undef();
    if (a->nargs > m->nkw)
        return kp_jfail(c, KP_JINJA_ETYPE, "macro '%s' takes not more than %zu argument(s)", m->name, m->nkw);
    for (size_t i = 0; i < a->nkw; i++) {
        size_t k;
        for (k = 0; k < m->nkw && strcmp(m->kwnames[k], a->kwnames[i]) != 0; k++) {}
        if (k == m->nkw && strcmp(a->kwnames[i], "caller") != 0)
            return kp_jfail(c, KP_JINJA_ETYPE, "macro '%s' takes no keyword argument '%s'", m->name, a->kwnames[i]);
    }
    for (size_t k = 0; k < m->nkw && !c->failed; k++) {
        bool present;
        jv v = kp_jarg(a, k, m->kwnames[k], &present);
        if (!present && m->kwvals[k]) v = eval(c, f, m->kwvals[k]);
        else if (!present) v = kp_jv_undef_hint(c, "parameter '%s' was not provided", m->kwnames[k]);
        frame_set(c, f, m->kwnames[k], v);
    }
    if (fn->caller.t == JT_FUNC) frame_set(c, f, "caller", fn->caller);
    if (c->failed) return jv_undef();
    c->depth++;
    jv r = capture(c, f, m->b);
    c->depth--;
    return r;
}

jv kp_jinja_call(jctx *c, jv fn, const jargs *a) {
    if (!step(c)) return jv_undef();
    if (fn.t == JT_UNDEF) return kp_jv_undef_fail(c, fn);
    if (fn.t != JT_FUNC) return kp_jfail(c, KP_JINJA_ETYPE, "'%s' object is not callable", kp_jv_typename(fn));
    uint64_t born = c->n_str + 1;
    switch (fn.u.fn->kind) {
    case JFN_MACRO: return call_macro(c, fn.u.fn, a);
    case JFN_METHOD: return kp_jt_derived(c, kp_jinja_call_method(c, fn.u.fn, a), born, fn.u.fn->self, a);
    case JFN_CYCLE: {
        if (!a->nargs) return kp_jfail(c, KP_JINJA_ETYPE, "no items for cycling given");
        return a->args[fn.u.fn->loop->index0 % a->nargs];
    }
    default: return kp_jt_derived(c, kp_jinja_call_global(c, fn.u.fn, a), born, jv_undef(), a);
    }
}

/* Evaluates a node's arguments (args, kwnames/kwvals) into a. */
static bool eval_args(jctx *c, jframe *f, const jnode *n, jargs *a, size_t extra_front) {
    a->nargs = n->nargs + extra_front;
    a->nkw = n->nkw;
    a->kwnames = n->kwnames;
    a->args = a->nargs ? kp_ja_alloc(&c->arena, a->nargs * sizeof(jv)) : NULL;
    a->kwvals = a->nkw ? kp_ja_alloc(&c->arena, a->nkw * sizeof(jv)) : NULL;
    if ((a->nargs && !a->args) || (a->nkw && !a->kwvals)) { kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); return false; }
    for (size_t i = 0; i < n->nargs && !c->failed; i++) a->args[i + extra_front] = eval(c, f, n->args[i]);
    for (size_t i = 0; i < n->nkw && !c->failed; i++) a->kwvals[i] = eval(c, f, n->kwvals[i]);
    return !c->failed;
}

static jv make_macro(jctx *c, jframe *f, const jnode *m) {
    jv v = kp_jv_func(c, JFN_MACRO, m->name);
    if (v.t == JT_FUNC) {
        v.u.fn->macro = m;
        v.u.fn->closure = f;
    }
    return v;
}

static jv eval_filter(jctx *c, jframe *f, const jnode *n, jv operand) {
    jargs a;
    if (!eval_args(c, f, n, &a, 0)) return jv_undef();
    uint64_t born = c->n_str + 1;
    return kp_jt_derived(c, kp_jinja_filter(c, n->name, operand, &a), born, operand, &a);
}

/* A filter chain built on a NULL operand (set blocks, filter blocks) applied to v. */
static jv apply_chain(jctx *c, jframe *f, const jnode *n, jv v) {
    if (!n) return v;
    v = apply_chain(c, f, n->a, v);
    if (c->failed) return v;
    return eval_filter(c, f, n, v);
}

/* ---------------------------------------------------------------- expressions */

static jv eval_seq(jctx *c, jframe *f, const jnode *n) {
    jv l = kp_jv_list(c, n->nargs);
    for (size_t i = 0; i < n->nargs && !c->failed; i++) l.u.l->items[i] = eval(c, f, n->args[i]);
    l.tuple = n->kind == N_TUPLE;
    return l;
}

static jv eval_dict(jctx *c, jframe *f, const jnode *n) {
    jv d = kp_jv_dict(c);
    for (size_t i = 0; i + 1 < n->nargs && !c->failed; i += 2) {
        jv k = eval(c, f, n->args[i]);
        jv v = eval(c, f, n->args[i + 1]);
        if (!c->failed) kp_jdict_set(c, d.u.d, k, v);
    }
    return d;
}

static jv eval_compare(jctx *c, jframe *f, const jnode *n) {
    jv left = eval(c, f, n->a);
    for (size_t i = 0; i < n->nargs && !c->failed; i++) {
        jv right = eval(c, f, n->args[i]);
        if (c->failed) break;
        if (!compare(c, (jop)n->ops[i], left, right)) return jv_bool(false);
        left = right;
    }
    return c->failed ? jv_undef() : jv_bool(true);
}

static jv eval_concat(jctx *c, jframe *f, const jnode *n) {
    kp_buf b = {0}, tb = {0};
    for (size_t i = 0; i < n->nargs && !c->failed; i++) {
        jv v = eval(c, f, n->args[i]);
        size_t at = b.len;
        kp_jv_write_str(&b, v);
        if (c->tout) kp_jt_put(c, &tb, v, b.len - at);
        if (b.len > (size_t)KP_JINJA_MAX_STRING) kp_jv_check_string(c, b.len);
    }
    if (c->failed) { kp_buf_free(&b); kp_buf_free(&tb); return jv_undef(); }
    return kp_jt_str_bufs(c, &b, c->tout ? &tb : NULL);
}

/* obj[key] / obj[a:b]: a string's piece is client text when obj holds any (taint.c). */
static jv str_piece(jctx *c, jv obj, uint64_t born, jv piece) {
    return obj.t == JT_STR ? kp_jt_derived(c, piece, born, obj, NULL) : piece;
}

static jv eval_call(jctx *c, jframe *f, const jnode *n) {
    jv fn = eval(c, f, n->a);
    if (c->failed) return fn;
    jargs a;
    if (!eval_args(c, f, n, &a, 0)) return jv_undef();
    c->at = n;
    return kp_jinja_call(c, fn, &a);
}

static jv eval_neg(jctx *c, jv v, bool neg) {
    if (v.t == JT_UNDEF) return kp_jv_undef_fail(c, v);
    if (v.t == JT_FLOAT) return jv_float(neg ? -v.u.f : v.u.f);
    if (v.t == JT_INT || v.t == JT_BOOL) {
        int64_t i = v.t == JT_BOOL ? v.u.b : v.u.i;
        return jv_int(neg ? -i : i);
    }
    return kp_jfail(c, KP_JINJA_ETYPE, "bad operand type for unary %s: '%s'", neg ? "-" : "+", kp_jv_typename(v));
}

static jv eval_node(jctx *c, jframe *f, const jnode *n);

/* Every expression and block level the interpreter enters, on the C stack:
 * bounded by KP_JINJA_MAX_RECURSION (macros calling macros multiply the
 * nesting the parser allows). */
static bool enter(jctx *c) {
    if (++c->rdepth > KP_JINJA_MAX_RECURSION) {
        kp_jfail(c, KP_JINJA_ELIMIT, "the template nests more than %d levels deep at run time", KP_JINJA_MAX_RECURSION);
        return false;
    }
    return true;
}

static jv eval(jctx *c, jframe *f, const jnode *n) {
    jv r = enter(c) ? eval_node(c, f, n) : jv_undef();
    c->rdepth--;
    return r;
}

static jv eval_node(jctx *c, jframe *f, const jnode *n) {
    if (c->failed) return jv_undef();
    c->at = n;
    jv a, b;
    uint64_t born;
    switch ((jnkind)n->kind) {
    case N_CONST: return n->value;
    case N_NAME: return lookup(c, f, n->name);
    case N_LIST: case N_TUPLE: return eval_seq(c, f, n);
    case N_DICT: return eval_dict(c, f, n);
    case N_GETATTR:
        a = eval(c, f, n->a);
        c->at = n;
        return c->failed ? a : kp_jinja_getattr(c, a, n->name);
    case N_GETITEM:
        a = eval(c, f, n->a);
        b = eval(c, f, n->b);
        c->at = n;
        born = c->n_str + 1; /* before the call: argument order is unspecified */
        return c->failed ? a : str_piece(c, a, born, kp_jinja_getitem(c, a, b));
    case N_SLICE: {
        a = eval(c, f, n->a);
        jv s = n->b ? eval(c, f, n->b) : jv_none(), e = n->c ? eval(c, f, n->c) : jv_none();
        jv st = n->d ? eval(c, f, n->d) : jv_none();
        c->at = n;
        born = c->n_str + 1;
        return c->failed ? a : str_piece(c, a, born, kp_jv_slice(c, a, s, e, st));
    }
    case N_CALL: return eval_call(c, f, n);
    case N_FILTER:
        a = eval(c, f, n->a);
        if (c->failed) return a;
        return eval_filter(c, f, n, a);
    case N_TEST: {
        a = eval(c, f, n->a);
        jargs args;
        if (c->failed || !eval_args(c, f, n, &args, 0)) return jv_undef();
        c->at = n;
        b = kp_jinja_test(c, n->name, a, &args);
        return c->failed ? b : jv_bool(n->op ? !kp_jv_truthy(b) : kp_jv_truthy(b));
    }
    case N_NOT: a = eval(c, f, n->a); return jv_bool(!kp_jv_truthy(a));
    case N_NEG: case N_POS: a = eval(c, f, n->a); c->at = n; return c->failed ? a : eval_neg(c, a, n->kind == N_NEG);
    case N_BINOP:
        a = eval(c, f, n->a);
        b = eval(c, f, n->b);
        c->at = n;
        return c->failed ? a : binop(c, (jop)n->op, a, b);
    case N_AND: a = eval(c, f, n->a); return kp_jv_truthy(a) ? eval(c, f, n->b) : a;
    case N_OR: a = eval(c, f, n->a); return kp_jv_truthy(a) ? a : eval(c, f, n->b);
    case N_COMPARE: return eval_compare(c, f, n);
    case N_CONDEXPR:
        if (kp_jv_truthy(eval(c, f, n->a))) return eval(c, f, n->b);
        return n->c ? eval(c, f, n->c) : kp_jv_undef_hint(c, "the inline if-expression evaluated to false and no else section was defined.");
    case N_CONCAT: return eval_concat(c, f, n);
    default: return kp_jfail(c, KP_JINJA_ETYPE, "not an expression");
    }
}

/* ---------------------------------------------------------------- statements */

/* n bytes of output; their taint is v's (tout) */
static bool emit(jctx *c, const char *s, size_t n, jv v) {
    if (c->watch != SIZE_MAX && c->out == c->top && !c->watch_line && c->stmt && c->out->len <= c->watch &&
        c->watch - c->out->len < n) { /* the byte asked for: its statement's line, + the text's newlines before it */
        int line = c->stmt->line;
        if (c->stmt->kind == N_DATA)
            for (size_t i = 0; i < c->watch - c->out->len; i++) line += s[i] == '\n';
        c->watch_line = line;
    }
    c->out_total += n;
    if (c->out_total > (size_t)KP_JINJA_MAX_OUTPUT) {
        kp_jfail(c, KP_JINJA_ELIMIT, "the output is longer than %ld bytes", (long)KP_JINJA_MAX_OUTPUT);
        return false;
    }
    if (!kp_buf_put(c->out, s, n)) { kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); return false; }
    return kp_jt_put(c, c->tout, v, n);
}

static bool emit_value(jctx *c, jv v) {
    if (v.t == JT_STR) return emit(c, v.u.s->s, v.u.s->len, v);
    if (v.t == JT_UNDEF) return true;
    kp_buf b = {0};
    kp_jv_write_str(&b, v);
    bool ok = !b.oom && emit(c, b.data ? b.data : "", b.len, v);
    if (b.oom) kp_jfail(c, KP_JINJA_ENOMEM, "out of memory");
    kp_buf_free(&b);
    return ok;
}

static bool assign(jctx *c, jframe *f, const jnode *target, jv v) {
    if (target->kind == N_NAME) return frame_set(c, f, target->name, v);
    if (target->kind == N_NSREF) {
        jv ns = lookup(c, f, target->name);
        c->at = target;
        if (ns.t != JT_NS) { kp_jfail(c, KP_JINJA_ETYPE, "cannot assign attribute on non-namespace object"); return false; }
        return kp_jdict_set(c, ns.u.d, kp_jv_strz(c, target->kwnames[0]), v);
    }
    if (target->kind == N_TUPLE) {
        jv l = kp_jv_iter_list(c, v);
        if (c->failed) return false;
        if (l.u.l->n != target->nargs) {
            kp_jfail(c, KP_JINJA_EVALUE, l.u.l->n > target->nargs ? "too many values to unpack (expected %zu)"
                                                               : "not enough values to unpack (expected %zu)",
                  target->nargs);
            return false;
        }
        for (size_t i = 0; i < target->nargs; i++)
            if (!assign(c, f, target->args[i], l.u.l->items[i])) return false;
        return true;
    }
    kp_jfail(c, KP_JINJA_ETYPE, "cannot assign to this expression");
    return false;
}

static xres exec_for(jctx *c, jframe *f, const jnode *n) {
    jv seq = eval(c, f, n->b);
    if (c->failed) return X_ERR;
    c->at = n;
    jv items = kp_jv_iter_list(c, seq);
    if (c->failed) return X_ERR;
    jframe *it = frame_new(c, f);
    if (!it) return X_ERR;
    if (n->d) { /* the loop filter: applied before the loop counts */
        jv kept = kp_jv_list(c, items.u.l->n);
        size_t k = 0;
        for (size_t i = 0; i < items.u.l->n && !c->failed; i++) {
            it->n = 0;
            if (!step(c) || !assign(c, it, n->a, items.u.l->items[i])) return X_ERR;
            if (kp_jv_truthy(eval(c, it, n->d))) kept.u.l->items[k++] = items.u.l->items[i];
        }
        if (c->failed) return X_ERR;
        kept.u.l->n = k;
        items = kept;
    }
    jloop *loop = kp_ja_alloc(&c->arena, sizeof *loop);
    if (!loop) { kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); return X_ERR; }
    loop->items = items;
    loop->length = items.u.l->n;
    jv lv = {0};
    lv.t = JT_LOOP;
    lv.u.loop = loop;
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (!step(c)) return X_ERR;
        loop->index0 = i;
        it->n = 0;
        if (!frame_set(c, it, "loop", lv) || !assign(c, it, n->a, items.u.l->items[i])) return X_ERR;
        xres r = exec_body(c, it, n->args[0]);
        if (r == X_ERR) return X_ERR;
        if (r == X_BREAK) break;
    }
    if (items.u.l->n == 0 && n->c) return exec_body(c, f, n->c) == X_ERR ? X_ERR : X_OK;
    return X_OK;
}

static xres exec_callblock(jctx *c, jframe *f, const jnode *n) {
    const jnode *call = n->a;
    jv fn = eval(c, f, call->a);
    jargs a;
    if (c->failed || !eval_args(c, f, call, &a, 0)) return X_ERR;
    jv caller = make_macro(c, f, n->b);
    if (c->failed) return X_ERR;
    if (fn.t == JT_FUNC && fn.u.fn->kind == JFN_MACRO) {
        jfunc *copy = kp_ja_alloc(&c->arena, sizeof *copy);
        if (!copy) { kp_jfail(c, KP_JINJA_ENOMEM, "out of memory"); return X_ERR; }
        *copy = *fn.u.fn;
        copy->caller = caller;
        fn.u.fn = copy;
    }
    c->at = n;
    jv r = kp_jinja_call(c, fn, &a);
    return c->failed ? X_ERR : emit_value(c, r) ? X_OK : X_ERR;
}

static xres exec_stmt_in(jctx *c, jframe *f, const jnode *n);

/* A statement, remembered as the one writing output while it runs. */
static xres exec_stmt(jctx *c, jframe *f, const jnode *n) {
    const jnode *outer = c->stmt;
    c->stmt = n;
    xres r = exec_stmt_in(c, f, n);
    c->stmt = outer;
    return r;
}

static xres exec_stmt_in(jctx *c, jframe *f, const jnode *n) {
    if (!step(c)) return X_ERR;
    c->at = n;
    switch ((jnkind)n->kind) {
    case N_DATA: return emit(c, n->name, n->len, jv_none()) ? X_OK : X_ERR;
    case N_OUTPUT: {
        jv v = eval(c, f, n->a);
        return c->failed ? X_ERR : emit_value(c, v) ? X_OK : X_ERR;
    }
    case N_BODY:
        if (n->op) { /* a {% generation %} body: its own scope, as a call block's */
            jframe *inner = frame_new(c, f);
            return inner ? exec_body(c, inner, n) : X_ERR;
        }
        return exec_body(c, f, n);
    case N_IF: {
        jv cond = eval(c, f, n->a);
        if (c->failed) return X_ERR;
        if (kp_jv_truthy(cond)) return exec_body(c, f, n->b);
        return n->c ? exec_body(c, f, n->c) : X_OK;
    }
    case N_FOR: return exec_for(c, f, n);
    case N_SET: {
        jv v = eval(c, f, n->b);
        return !c->failed && assign(c, f, n->a, v) ? X_OK : X_ERR;
    }
    case N_SETBLOCK: {
        jv v = apply_chain(c, f, n->c, capture(c, f, n->b));
        return !c->failed && assign(c, f, n->a, v) ? X_OK : X_ERR;
    }
    case N_FILTERBLOCK: {
        jv v = apply_chain(c, f, n->c, capture(c, f, n->b));
        return !c->failed && emit_value(c, v) ? X_OK : X_ERR;
    }
    case N_MACRO: {
        jv m = make_macro(c, f, n);
        return !c->failed && frame_set(c, f, n->name, m) ? X_OK : X_ERR;
    }
    case N_CALLBLOCK: return exec_callblock(c, f, n);
    case N_BREAK: return X_BREAK;
    case N_CONTINUE: return X_CONTINUE;
    default: {
        jv v = eval(c, f, n);
        return c->failed ? X_ERR : emit_value(c, v) ? X_OK : X_ERR;
    }
    }
}

static xres exec_body(jctx *c, jframe *f, const jnode *body) {
    xres r = enter(c) ? X_OK : X_ERR;
    for (size_t i = 0; r == X_OK && i < body->nargs; i++) r = exec_stmt(c, f, body->args[i]);
    c->rdepth--;
    return r;
}

/* ---------------------------------------------------------------- entry points */

kp_status kp_jinja_compile(const char *src, size_t len, kp_jinja **out, kp_jinja_error *err) {
    if (err) memset(err, 0, sizeof *err);
    *out = NULL;
    kp_jinja *t = calloc(1, sizeof *t);
    if (!t) { kp_jinja_seterr(err, KP_JINJA_ENOMEM, 0, 0, "out of memory"); return KP_ENOMEM; }
    /* jinja2 reads "\r\n" and "\r" as "\n" and drops one trailing newline */
    char *text = kp_ja_alloc(&t->arena, len + 1);
    if (!text) { free(t); kp_jinja_seterr(err, KP_JINJA_ENOMEM, 0, 0, "out of memory"); return KP_ENOMEM; }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            text[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            text[n++] = src[i];
        }
    }
    if (n && text[n - 1] == '\n') n--;
    t->src_len = n;
    jtokens toks = {0};
    kp_jinja_error local;
    kp_jinja_error *e = err ? err : &local;
    memset(e, 0, sizeof *e);
    if (kp_jinja_lex(text, n, &t->arena, &toks, e)) t->root = kp_jinja_parse(&toks, &t->arena, e);
    free(toks.toks);
    if (!t->root) {
        kp_jinja_free(t);
        return e->code ? e->code : KP_EFORMAT;
    }
    *out = t;
    return KP_OK;
}

static bool is_client(const char *name, const char *const *client) {
    for (size_t i = 0; client && client[i]; i++)
        if (!strcmp(client[i], name)) return true;
    return false;
}

/* The render itself: tout, when not NULL, receives the output's taint. */
static kp_status render(const kp_jinja *t, const json_t *ctx, const char *const *client, kp_buf *out, kp_buf *tout,
                        size_t watch, int *watch_line, kp_jinja_error *err) {
    kp_jinja_error local;
    kp_jinja_error *e = err ? err : &local;
    memset(e, 0, sizeof *e);
    jctx c = {.err = e, .out = out, .tout = tout, .top = out, .watch = watch == SIZE_MAX ? SIZE_MAX : out->len + watch};
    c.arena.limit = (size_t)KP_JINJA_MAX_MEMORY;
    size_t start = out->len;
    jframe *root = frame_new(&c, NULL);
    c.root = root;
    if (root && ctx && json_is_object(ctx)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)ctx, k, v) {
            if (c.failed) break;
            c.load_client = tout && is_client(k, client);
            frame_set(&c, root, k, kp_jv_from_json(&c, v));
        }
        c.load_client = false;
    }
    if (!c.failed) exec_body(&c, root, t->root);
    if (watch_line) *watch_line = c.watch_line;
    kp_ja_free(&c.arena);
    if (c.utf8) freelocale(c.utf8);
    if (c.failed) {
        kp_buf_truncate(out, start);
        return e->code ? e->code : KP_EINVAL;
    }
    return KP_OK;
}

kp_status kp_jinja_render(const kp_jinja *t, const json_t *ctx, kp_buf *out, kp_jinja_error *err) {
    return render(t, ctx, NULL, out, NULL, SIZE_MAX, NULL, err);
}

kp_status kp_jinja_line_at(const kp_jinja *t, const json_t *ctx, size_t byte, int *line, kp_jinja_error *err) {
    kp_buf out = {0};
    *line = 0;
    kp_status st = render(t, ctx, NULL, &out, NULL, byte, line, err);
    if (st == KP_OK && out.oom) st = KP_ENOMEM;
    if (st != KP_OK) *line = 0;
    kp_buf_free(&out);
    return st;
}

kp_status kp_jinja_render_client(const kp_jinja *t, const json_t *ctx, const char *const *client, kp_buf *out,
                                 kp_jinja_range **ranges, size_t *n_ranges, kp_jinja_error *err) {
    *ranges = NULL;
    *n_ranges = 0;
    kp_buf tout = {0};
    size_t start = out->len;
    kp_status st = render(t, ctx, client, out, &tout, SIZE_MAX, NULL, err);
    if (st == KP_OK && tout.oom) st = KP_ENOMEM;
    if (st == KP_OK) st = kp_jt_ranges(&tout, start, ranges, n_ranges);
    if (st == KP_ENOMEM && err && !err->code) {
        kp_jinja_seterr(err, KP_JINJA_ENOMEM, 0, 0, "out of memory");
        err->code = KP_ENOMEM;
    }
    if (st != KP_OK) kp_buf_truncate(out, start);
    kp_buf_free(&tout);
    return st;
}

size_t kp_jinja_size(const kp_jinja *t) { return t ? kp_ja_used(&t->arena) + sizeof *t : 0; }

void kp_jinja_free(kp_jinja *t) {
    if (!t) return;
    kp_ja_free(&t->arena);
    free(t);
}
