/*
 * parse.c - tokens to the syntax tree, after jinja2's parser.
 *
 * Expressions, loosest first (jinja2's precedence, with its left-leaning
 * "**" and filters binding tighter than unary minus' operand):
 *
 *   condexpr   or ["if" or ["else" condexpr]]
 *   or / and / not
 *   compare    math1 (("=="|"!="|"<"|"<="|">"|">="|"in"|"not in") math1)*
 *   math1      concat (("+"|"-") concat)*
 *   concat     math2 ("~" math2)*
 *   math2      pow (("*"|"/"|"//"|"%") pow)*
 *   pow        unary ("**" unary)*
 *   unary      ("-"|"+") unary | primary postfix* ; then ("|" filter | "is" test)*
 *
 * What each node kind keeps (jnode fields):
 *
 *   N_GETATTR a.name          N_GETITEM a[b]          N_SLICE a[b:c:d]
 *   N_CALL a(args, kw=..)     N_FILTER a|name(args)   N_TEST a is [not] name(args)
 *   N_COMPARE a ops[i] args[i]                        N_CONDEXPR b if a else c
 *   N_IF a: body b, else c    N_FOR a in b if d: body args[0], else c
 *   N_SET a = b               N_SETBLOCK a, body b, filters c (an N_FILTER chain on NULL)
 *   N_MACRO name(kwnames=kwvals): body b               N_CALLBLOCK call a, caller macro b
 *   N_FILTERBLOCK filters c, body b                     N_NSREF name.attr (kwnames[0])
 *
 * Every node is allocated in the template's arena. Nesting deeper than
 * KP_JINJA_MAX_NESTING is refused (the parser recurses once per level).
 */
#include <stdio.h>
#include <string.h>

#include "jinja/jinja_impl.h"

typedef struct {
    const jtokens *tk;
    size_t i;
    jarena *a;
    kp_jinja_error *err;
    bool failed;
    int nesting;
    int soft; /* inside an if or an inline if of the current scope: unknown filters wait for run time */
} parser;

static const jtoken *cur(parser *p) { return &p->tk->toks[p->i]; }
static const jtoken *peek(parser *p, size_t k) {
    size_t j = p->i + k < p->tk->n ? p->i + k : p->tk->n - 1;
    return &p->tk->toks[j];
}
static void advance(parser *p) { if (p->i + 1 < p->tk->n) p->i++; }

static bool tok_is(const jtoken *t, jtkind k, const char *s) {
    if (t->kind != k) return false;
    return !s || (t->len == strlen(s) && memcmp(t->s, s, t->len) == 0);
}
static bool is_op(parser *p, const char *s) { return tok_is(cur(p), TK_OP, s); }
static bool is_name(parser *p, const char *s) { return tok_is(cur(p), TK_NAME, s); }

static const char *describe(const jtoken *t, char *buf, size_t n) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_BLOCK_END: return "end of statement block";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_DATA: return "template data / text";
    default: snprintf(buf, n, "%.*s", (int)(t->len > 60 ? 60 : t->len), t->s); return buf;
    }
}

static jnode *fail(parser *p, const jtoken *t, const char *fmt, const char *arg) {
    if (!p->failed) {
        char m[256];
        snprintf(m, sizeof m, fmt, arg);
        kp_jinja_seterr(p->err, KP_JINJA_ESYNTAX, t->line, t->col, "%s", m);
    }
    p->failed = true;
    return NULL;
}

static jnode *node(parser *p, jnkind k, const jtoken *at) {
    jnode *n = kp_ja_alloc(p->a, sizeof *n);
    if (!n) {
        if (!p->failed) kp_jinja_seterr(p->err, KP_JINJA_ENOMEM, 0, 0, "out of memory");
        p->failed = true;
        return NULL;
    }
    n->kind = (uint8_t)k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static const char *tok_str(parser *p, const jtoken *t) {
    char *s = kp_ja_strndup(p->a, t->s, t->len);
    if (!s) p->failed = true;
    return s;
}

static bool expect_op(parser *p, const char *s) {
    if (is_op(p, s)) { advance(p); return true; }
    char b[80], m[160];
    snprintf(m, sizeof m, "expected token '%s', got '%%s'", s);
    fail(p, cur(p), m, describe(cur(p), b, sizeof b));
    return false;
}

/* A growable node list (args), in the heap while parsing, copied to the arena. */
typedef struct { jnode **v; size_t n, cap; const char **names; size_t ncap; } nlist;
static bool nl_push(parser *p, nlist *l, jnode *n, const char *name) {
    if (!kp_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) ||
        !kp_grow((void **)&l->names, &l->ncap, l->n + 1, sizeof *l->names)) {
        p->failed = true;
        return false;
    }
    l->names[l->n] = name;
    l->v[l->n++] = n;
    return true;
}
static jnode **nl_finish(parser *p, nlist *l, const char ***names) {
    jnode **v = l->n ? kp_ja_alloc(p->a, l->n * sizeof *v) : NULL;
    const char **nm = (l->n && names) ? kp_ja_alloc(p->a, l->n * sizeof *nm) : NULL;
    if (l->n && (!v || (names && !nm))) p->failed = true;
    if (v) memcpy(v, l->v, l->n * sizeof *v);
    if (nm) memcpy(nm, l->names, l->n * sizeof *nm);
    if (names) *names = nm;
    free(l->v);
    free(l->names);
    return v;
}

static jnode *parse_expr(parser *p, bool with_condexpr);
static jnode *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *end_name, bool explicit_parens);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p, bool with_ns);
static jnode *parse_postfix(parser *p, jnode *n);

static bool enter(parser *p) {
    if (++p->nesting > KP_JINJA_MAX_NESTING) {
        fail(p, cur(p), "%s", "expressions and blocks nested too deeply");
        return false;
    }
    return true;
}

/* (args, name=value) of a call, filter or test; the "(" is current. */
static bool parse_call_args(parser *p, jnode *n) {
    nlist pos = {0}, kw = {0};
    advance(p);
    while (!p->failed && !is_op(p, ")")) {
        if ((pos.n || kw.n) && !expect_op(p, ",")) break;
        if (is_op(p, ")")) break;
        if (cur(p)->kind == TK_NAME && tok_is(peek(p, 1), TK_OP, "=")) {
            const char *name = tok_str(p, cur(p));
            advance(p);
            advance(p);
            nl_push(p, &kw, parse_expr(p, true), name);
        } else {
            if (kw.n) fail(p, cur(p), "%s", "invalid syntax for function call expression");
            nl_push(p, &pos, parse_expr(p, true), NULL);
        }
    }
    n->nargs = pos.n;
    n->args = nl_finish(p, &pos, NULL);
    n->nkw = kw.n;
    n->kwvals = nl_finish(p, &kw, &n->kwnames);
    return !p->failed && expect_op(p, ")");
}

static jnode *parse_subscript(parser *p, jnode *obj) {
    const jtoken *t = cur(p);
    if (is_op(p, ".")) {
        advance(p);
        const jtoken *a = cur(p);
        if (a->kind == TK_NAME) {
            jnode *n = node(p, N_GETATTR, t);
            if (!n) return NULL;
            n->a = obj;
            n->name = tok_str(p, a);
            advance(p);
            return n;
        }
        if (a->kind != TK_INT) return fail(p, a, "%s", "expected name or number");
        jnode *n = node(p, N_GETITEM, t), *k = node(p, N_CONST, a);
        if (!n || !k) return NULL;
        k->value = jv_int(a->i);
        n->a = obj;
        n->b = k;
        advance(p);
        return n;
    }
    advance(p); /* "[" */
    jnode *parts[3] = {NULL, NULL, NULL};
    bool is_slice = false;
    int k = 0;
    for (;;) {
        if (is_op(p, ":")) {
            is_slice = true;
            if (++k > 2) return fail(p, cur(p), "%s", "expected ']'");
            advance(p);
            continue;
        }
        if (is_op(p, "]")) break;
        if (parts[k]) return fail(p, cur(p), "%s", "expected ']'");
        parts[k] = parse_expr(p, true);
        if (p->failed) return NULL;
        if (!is_slice && is_op(p, ",")) return fail(p, cur(p), "%s", "tuple subscripts are not supported");
    }
    advance(p);
    jnode *n = node(p, is_slice ? N_SLICE : N_GETITEM, t);
    if (!n) return NULL;
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    if (!is_slice && !parts[0]) return fail(p, t, "%s", "expected an expression");
    return n;
}

/* n(args): the "(" is current. */
static jnode *parse_call(parser *p, jnode *callee) {
    jnode *c = node(p, N_CALL, cur(p));
    if (!c) return NULL;
    c->a = callee;
    return parse_call_args(p, c) ? c : NULL;
}

static jnode *parse_postfix(parser *p, jnode *n) {
    while (n && !p->failed) {
        if (is_op(p, ".") || is_op(p, "[")) {
            n = parse_subscript(p, n);
        } else if (is_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            break;
        }
    }
    return p->failed ? NULL : n;
}

/* A dotted filter or test name. */
static const char *parse_dotted(parser *p) {
    if (cur(p)->kind != TK_NAME) {
        char b[80];
        fail(p, cur(p), "expected token 'name', got '%s'", describe(cur(p), b, sizeof b));
        return NULL;
    }
    kp_buf b = {0};
    kp_buf_put(&b, cur(p)->s, cur(p)->len);
    advance(p);
    while (is_op(p, ".") && peek(p, 1)->kind == TK_NAME) {
        advance(p);
        kp_buf_putc(&b, '.');
        kp_buf_put(&b, cur(p)->s, cur(p)->len);
        advance(p);
    }
    char *s = b.oom ? NULL : kp_ja_strndup(p->a, b.data, b.len);
    kp_buf_free(&b);
    if (!s) p->failed = true;
    return s;
}

static jnode *parse_filter(parser *p, jnode *operand) {
    const jtoken *t = cur(p);
    advance(p); /* "|" */
    jnode *n = node(p, N_FILTER, t);
    if (!n) return NULL;
    n->a = operand;
    n->name = parse_dotted(p);
    if (n->name && !p->soft && !kp_jinja_filter_known(n->name)) return fail(p, t, "No filter named '%s'.", n->name);
    if (n->name && is_op(p, "(") && !parse_call_args(p, n)) return NULL;
    return p->failed ? NULL : n;
}

static jnode *parse_test(parser *p, jnode *operand) {
    const jtoken *t = cur(p);
    advance(p); /* "is" */
    jnode *n = node(p, N_TEST, t);
    if (!n) return NULL;
    n->a = operand;
    if (is_name(p, "not")) { n->op = 1; advance(p); }
    n->name = parse_dotted(p);
    if (!n->name) return NULL;
    if (!p->soft && !kp_jinja_test_known(n->name)) return fail(p, t, "No test named '%s'.", n->name);
    const jtoken *c = cur(p);
    if (is_op(p, "(")) {
        if (!parse_call_args(p, n)) return NULL;
    } else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT || c->kind == TK_FLOAT ||
                is_op(p, "[") || is_op(p, "{")) &&
               !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
        if (is_name(p, "is")) return fail(p, c, "%s", "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(p, parse_primary(p, false));
        if (!arg) return NULL;
        n->args = kp_ja_alloc(p->a, sizeof *n->args);
        if (!n->args) { p->failed = true; return NULL; }
        n->args[0] = arg;
        n->nargs = 1;
    }
    return n;
}

static jnode *parse_filter_expr(parser *p, jnode *n) {
    while (n && !p->failed) {
        if (is_op(p, "|")) {
            n = parse_filter(p, n);
        } else if (is_name(p, "is")) {
            n = parse_test(p, n);
        } else if (is_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            break;
        }
    }
    return p->failed ? NULL : n;
}

static jnode *parse_list_or_dict(parser *p, bool dict) {
    const jtoken *t = cur(p);
    const char *close = dict ? "}" : "]";
    advance(p);
    nlist items = {0};
    while (!p->failed && !is_op(p, close)) {
        if (items.n && !expect_op(p, ",")) break;
        if (is_op(p, close)) break;
        nl_push(p, &items, parse_expr(p, true), NULL);
        if (dict && !p->failed) {
            if (!expect_op(p, ":")) break;
            nl_push(p, &items, parse_expr(p, true), NULL);
        }
    }
    jnode *n = node(p, dict ? N_DICT : N_LIST, t);
    size_t cnt = items.n;
    jnode **v = nl_finish(p, &items, NULL);
    if (!n || p->failed || !expect_op(p, close)) return NULL;
    n->args = v;
    n->nargs = cnt;
    return n;
}

static jnode *parse_primary(parser *p, bool with_ns) {
    const jtoken *t = cur(p);
    jnode *n;
    char b[80];
    if (t->kind == TK_NAME) {
        advance(p);
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True") || tok_is(t, TK_NAME, "false") ||
            tok_is(t, TK_NAME, "False")) {
            if (!(n = node(p, N_CONST, t))) return NULL;
            n->value = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None")) {
            if (!(n = node(p, N_CONST, t))) return NULL;
            n->value = jv_none();
        } else if (with_ns && is_op(p, ".")) {
            advance(p);
            if (cur(p)->kind != TK_NAME) return fail(p, cur(p), "expected token 'name', got '%s'", describe(cur(p), b, sizeof b));
            if (!(n = node(p, N_NSREF, t))) return NULL;
            n->name = tok_str(p, t);
            n->kwnames = kp_ja_alloc(p->a, sizeof *n->kwnames);
            if (!n->kwnames) { p->failed = true; return NULL; }
            n->kwnames[0] = tok_str(p, cur(p));
            advance(p);
        } else {
            if (!(n = node(p, N_NAME, t))) return NULL;
            n->name = tok_str(p, t);
        }
        return n;
    }
    if (t->kind == TK_STRING) {
        kp_buf s = {0};
        while (cur(p)->kind == TK_STRING) { kp_buf_put(&s, cur(p)->s, cur(p)->len); advance(p); }
        if (!(n = node(p, N_CONST, t))) { kp_buf_free(&s); return NULL; }
        jstr *js = kp_ja_alloc(p->a, sizeof(jstr) + s.len + 1);
        if (!js || s.oom) { kp_buf_free(&s); p->failed = true; return NULL; }
        js->len = s.len;
        if (s.len) memcpy(js->s, s.data, s.len);
        kp_buf_free(&s);
        n->value.t = JT_STR;
        n->value.u.s = js;
        return n;
    }
    if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        advance(p);
        if (!(n = node(p, N_CONST, t))) return NULL;
        n->value = t->kind == TK_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    }
    if (is_op(p, "(")) {
        advance(p);
        n = parse_tuple(p, false, true, NULL, true);
        if (!n || !expect_op(p, ")")) return NULL;
        return n;
    }
    if (is_op(p, "[")) return parse_list_or_dict(p, false);
    if (is_op(p, "{")) return parse_list_or_dict(p, true);
    return fail(p, t, "unexpected '%s'", describe(t, b, sizeof b));
}

static jnode *parse_unary(parser *p, bool with_filter) {
    const jtoken *t = cur(p);
    jnode *n;
    if (!enter(p)) return NULL;
    if (is_op(p, "-") || is_op(p, "+")) {
        advance(p);
        if (!(n = node(p, t->s[0] == '-' ? N_NEG : N_POS, t))) return NULL;
        n->a = parse_unary(p, false);
        if (!n->a) return NULL;
    } else {
        n = parse_primary(p, false);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->nesting--;
    return p->failed ? NULL : n;
}

static jnode *binop(parser *p, const jtoken *t, jop op, jnode *l, jnode *r) {
    if (!l || !r) return NULL;
    jnode *n = node(p, N_BINOP, t);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static jnode *parse_pow(parser *p) {
    jnode *l = parse_unary(p, true);
    while (l && is_op(p, "**")) {
        const jtoken *t = cur(p);
        advance(p);
        l = binop(p, t, OP_POW, l, parse_unary(p, true));
    }
    return l;
}

static jnode *parse_math2(parser *p) {
    jnode *l = parse_pow(p);
    for (;;) {
        jop op;
        if (is_op(p, "*")) op = OP_MUL;
        else if (is_op(p, "/")) op = OP_DIV;
        else if (is_op(p, "//")) op = OP_FLOORDIV;
        else if (is_op(p, "%")) op = OP_MOD;
        else return l;
        const jtoken *t = cur(p);
        advance(p);
        l = binop(p, t, op, l, parse_pow(p));
        if (!l) return NULL;
    }
}

static jnode *parse_concat(parser *p) {
    const jtoken *t = cur(p);
    jnode *first = parse_math2(p);
    if (!first || !is_op(p, "~")) return first;
    nlist l = {0};
    nl_push(p, &l, first, NULL);
    while (!p->failed && is_op(p, "~")) {
        advance(p);
        nl_push(p, &l, parse_math2(p), NULL);
    }
    jnode *n = node(p, N_CONCAT, t);
    size_t cnt = l.n;
    jnode **v = nl_finish(p, &l, NULL);
    if (!n || p->failed) return NULL;
    n->args = v;
    n->nargs = cnt;
    return n;
}

static jnode *parse_math1(parser *p) {
    jnode *l = parse_concat(p);
    while (l && (is_op(p, "+") || is_op(p, "-"))) {
        const jtoken *t = cur(p);
        advance(p);
        l = binop(p, t, t->s[0] == '+' ? OP_ADD : OP_SUB, l, parse_concat(p));
    }
    return l;
}

static jnode *parse_compare(parser *p) {
    const jtoken *t = cur(p);
    jnode *first = parse_math1(p);
    if (!first) return NULL;
    nlist l = {0};
    uint8_t ops[64];
    for (;;) {
        jop op;
        static const char *const cmp[] = {"==", "!=", "<", "<=", ">", ">="};
        static const jop cmpop[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
        int k;
        for (k = 0; k < 6 && !is_op(p, cmp[k]); k++) {}
        if (k < 6) { op = cmpop[k]; advance(p); }
        else if (is_name(p, "in")) { op = OP_IN; advance(p); }
        else if (is_name(p, "not") && tok_is(peek(p, 1), TK_NAME, "in")) { op = OP_NOTIN; advance(p); advance(p); }
        else break;
        if (l.n == 64) { free(l.v); free(l.names); return fail(p, t, "%s", "comparison chain too long"); }
        ops[l.n] = (uint8_t)op;
        nl_push(p, &l, parse_math1(p), NULL);
        if (p->failed) break;
    }
    if (!l.n) return first;
    jnode *n = node(p, N_COMPARE, t);
    size_t cnt = l.n;
    jnode **v = nl_finish(p, &l, NULL);
    if (!n || p->failed) return NULL;
    n->a = first;
    n->args = v;
    n->nargs = cnt;
    n->ops = kp_ja_alloc(p->a, cnt);
    if (!n->ops) { p->failed = true; return NULL; }
    memcpy(n->ops, ops, cnt);
    return n;
}

static jnode *parse_not(parser *p) {
    if (is_name(p, "not")) {
        const jtoken *t = cur(p);
        advance(p);
        if (!enter(p)) return NULL;
        jnode *n = node(p, N_NOT, t);
        if (!n) return NULL;
        n->a = parse_not(p);
        p->nesting--;
        return n->a ? n : NULL;
    }
    return parse_compare(p);
}

static jnode *parse_andor(parser *p, bool is_or) {
    jnode *l = is_or ? parse_andor(p, false) : parse_not(p);
    const char *kw = is_or ? "or" : "and";
    while (l && is_name(p, kw)) {
        const jtoken *t = cur(p);
        advance(p);
        jnode *r = is_or ? parse_andor(p, false) : parse_not(p);
        jnode *n = r ? node(p, is_or ? N_OR : N_AND, t) : NULL;
        if (!n) return NULL;
        n->a = l;
        n->b = r;
        l = n;
    }
    return l;
}

static jnode *parse_expr(parser *p, bool with_condexpr) {
    if (!enter(p)) return NULL;
    jnode *e = parse_andor(p, true);
    while (with_condexpr && e && is_name(p, "if")) {
        const jtoken *t = cur(p);
        advance(p);
        jnode *n = node(p, N_CONDEXPR, t);
        if (!n) return NULL;
        n->b = e;
        p->soft++;
        n->a = parse_andor(p, true);
        if (n->a && is_name(p, "else")) {
            advance(p);
            n->c = parse_expr(p, true);
        }
        p->soft--;
        if (!n->a || p->failed) return NULL;
        e = n;
    }
    p->nesting--;
    return p->failed ? NULL : e;
}

static bool tuple_end(parser *p, const char *end_name) {
    const jtoken *t = cur(p);
    if (t->kind == TK_VAR_END || t->kind == TK_BLOCK_END || t->kind == TK_EOF) return true;
    if (is_op(p, ")") || is_op(p, "=")) return true;
    return end_name && is_name(p, end_name);
}

static jnode *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *end_name, bool explicit_parens) {
    const jtoken *t = cur(p);
    nlist l = {0};
    bool is_tuple = false;
    for (;;) {
        if (l.n && !expect_op(p, ",")) break;
        if (tuple_end(p, end_name)) break;
        jnode *e = simplified ? parse_primary(p, true) : parse_expr(p, with_condexpr);
        if (!e) break;
        nl_push(p, &l, e, NULL);
        if (is_op(p, ",")) is_tuple = true;
        else break;
    }
    size_t cnt = l.n;
    jnode **v = nl_finish(p, &l, NULL);
    if (p->failed) return NULL;
    if (!is_tuple) {
        if (cnt) return v[0];
        if (!explicit_parens) {
            char b[80];
            return fail(p, cur(p), "Expected an expression, got '%s'", describe(cur(p), b, sizeof b));
        }
    }
    jnode *n = node(p, N_TUPLE, t);
    if (!n) return NULL;
    n->args = v;
    n->nargs = cnt;
    return n;
}

/* ---------------------------------------------------------------- statements */

static jnode *parse_body(parser *p, const char *const *ends, const char **ended);
static jnode *parse_scope_body(parser *p, const char *const *ends, const char **ended);

static bool expect_block_end(parser *p) {
    if (cur(p)->kind == TK_BLOCK_END) { advance(p); return true; }
    char b[80];
    fail(p, cur(p), "expected token 'end of statement block', got '%s'", describe(cur(p), b, sizeof b));
    return false;
}

/* The name after "{%" is current; checks and skips "{% name %}". */
static bool end_tag(parser *p) {
    advance(p);
    return expect_block_end(p);
}

static jnode *parse_if(parser *p, const jtoken *t) {
    jnode *n = node(p, N_IF, t);
    if (!n) return NULL;
    n->a = parse_tuple(p, false, false, NULL, false);
    if (!n->a || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *ended = NULL;
    n->b = parse_body(p, ends, &ended);
    if (!n->b) return NULL;
    if (strcmp(ended, "elif") == 0) {
        const jtoken *e = cur(p);
        advance(p);
        jnode *body = node(p, N_BODY, e);
        if (!body) return NULL;
        body->args = kp_ja_alloc(p->a, sizeof *body->args);
        if (!body->args) { p->failed = true; return NULL; }
        body->args[0] = parse_if(p, e);
        body->nargs = 1;
        n->c = body->args[0] ? body : NULL;
        return n->c ? n : NULL;
    }
    if (strcmp(ended, "else") == 0) {
        if (!end_tag(p)) return NULL;
        static const char *const ends2[] = {"endif", NULL};
        n->c = parse_body(p, ends2, &ended);
        if (!n->c) return NULL;
    }
    return end_tag(p) ? n : NULL;
}

static jnode *parse_for(parser *p, const jtoken *t) {
    jnode *n = node(p, N_FOR, t);
    if (!n) return NULL;
    n->a = parse_tuple(p, true, false, "in", false);
    if (!n->a) return NULL;
    if (!is_name(p, "in")) { char b[80]; return fail(p, cur(p), "expected token 'in', got '%s'", describe(cur(p), b, sizeof b)); }
    advance(p);
    n->b = parse_tuple(p, false, false, "recursive", false);
    if (!n->b) return NULL;
    if (is_name(p, "if")) {
        advance(p);
        n->d = parse_expr(p, true);
        if (!n->d) return NULL;
    }
    if (is_name(p, "recursive")) return fail(p, cur(p), "%s", "recursive loops are not supported");
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endfor", "else", NULL};
    const char *ended = NULL;
    jnode *body = parse_scope_body(p, ends, &ended);
    if (!body) return NULL;
    n->args = kp_ja_alloc(p->a, sizeof *n->args);
    if (!n->args) { p->failed = true; return NULL; }
    n->args[0] = body;
    n->nargs = 1;
    if (strcmp(ended, "else") == 0) {
        if (!end_tag(p)) return NULL;
        static const char *const ends2[] = {"endfor", NULL};
        n->c = parse_scope_body(p, ends2, &ended);
        if (!n->c) return NULL;
    }
    return end_tag(p) ? n : NULL;
}

/* "| f(args) | g" after {% set x %} or {% filter %}: a chain on a NULL operand. */
static jnode *parse_filter_chain(parser *p, bool first_has_bar) {
    jnode *chain = NULL;
    bool first = true;
    while (!p->failed && (is_op(p, "|") || (first && !first_has_bar))) {
        if (first && !first_has_bar) {
            jnode *n = node(p, N_FILTER, cur(p));
            if (!n) return NULL;
            n->name = parse_dotted(p);
            if (n->name && is_op(p, "(") && !parse_call_args(p, n)) return NULL;
            chain = n;
        } else {
            chain = parse_filter(p, chain);
        }
        first = false;
        if (!chain) return NULL;
    }
    return chain;
}

static jnode *parse_set(parser *p, const jtoken *t) {
    jnode *target = parse_tuple(p, true, false, NULL, false);
    if (!target) return NULL;
    if (is_op(p, "=")) {
        advance(p);
        jnode *n = node(p, N_SET, t);
        if (!n) return NULL;
        n->a = target;
        n->b = parse_tuple(p, false, true, NULL, false);
        return n->b && expect_block_end(p) ? n : NULL;
    }
    jnode *n = node(p, N_SETBLOCK, t);
    if (!n) return NULL;
    n->a = target;
    if (is_op(p, "|")) n->c = parse_filter_chain(p, true);
    if (p->failed || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *ended;
    n->b = parse_scope_body(p, ends, &ended);
    return n->b && end_tag(p) ? n : NULL;
}

/* (a, b=default, ...) of a macro or a call block's caller. */
static bool parse_signature(parser *p, jnode *n) {
    nlist l = {0};
    if (!expect_op(p, "(")) return false;
    while (!p->failed && !is_op(p, ")")) {
        if (l.n && !expect_op(p, ",")) break;
        if (cur(p)->kind != TK_NAME) { fail(p, cur(p), "%s", "expected a parameter name"); break; }
        const char *name = tok_str(p, cur(p));
        advance(p);
        jnode *def = NULL;
        if (is_op(p, "=")) {
            advance(p);
            def = parse_expr(p, true);
        }
        nl_push(p, &l, def, name);
    }
    n->nkw = l.n;
    n->kwvals = nl_finish(p, &l, &n->kwnames);
    return !p->failed && expect_op(p, ")");
}

static jnode *parse_macro(parser *p, const jtoken *t) {
    jnode *n = node(p, N_MACRO, t);
    if (!n) return NULL;
    if (cur(p)->kind != TK_NAME) return fail(p, cur(p), "%s", "expected a macro name");
    n->name = tok_str(p, cur(p));
    advance(p);
    if (!parse_signature(p, n) || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *ended;
    n->b = parse_scope_body(p, ends, &ended);
    return n->b && end_tag(p) ? n : NULL;
}

static jnode *parse_callblock(parser *p, const jtoken *t) {
    jnode *n = node(p, N_CALLBLOCK, t), *caller = node(p, N_MACRO, t);
    if (!n || !caller) return NULL;
    caller->name = "caller";
    if (is_op(p, "(") && !parse_signature(p, caller)) return NULL;
    n->a = parse_expr(p, true);
    if (!n->a) return NULL;
    if (n->a->kind != N_CALL) return fail(p, t, "%s", "expected call");
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endcall", NULL};
    const char *ended;
    caller->b = parse_scope_body(p, ends, &ended);
    n->b = caller;
    return caller->b && end_tag(p) ? n : NULL;
}

static jnode *parse_statement(parser *p) {
    const jtoken *t = cur(p);
    char b[80];
    if (t->kind != TK_NAME) return fail(p, t, "%s", "tag name expected");
    advance(p);
    if (tok_is(t, TK_NAME, "if")) {
        p->soft++;
        jnode *n = parse_if(p, t);
        p->soft--;
        return n;
    }
    if (tok_is(t, TK_NAME, "for")) return parse_for(p, t);
    if (tok_is(t, TK_NAME, "set")) return parse_set(p, t);
    if (tok_is(t, TK_NAME, "macro")) return parse_macro(p, t);
    if (tok_is(t, TK_NAME, "call")) return parse_callblock(p, t);
    if (tok_is(t, TK_NAME, "break") || tok_is(t, TK_NAME, "continue")) {
        jnode *n = node(p, t->s[0] == 'b' ? N_BREAK : N_CONTINUE, t);
        return n && expect_block_end(p) ? n : NULL;
    }
    if (tok_is(t, TK_NAME, "filter")) {
        jnode *n = node(p, N_FILTERBLOCK, t);
        if (!n) return NULL;
        n->c = parse_filter_chain(p, false);
        if (!n->c || !expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        const char *ended;
        n->b = parse_scope_body(p, ends, &ended);
        return n->b && end_tag(p) ? n : NULL;
    }
    if (tok_is(t, TK_NAME, "generation")) {
        if (!expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        const char *ended;
        jnode *body = parse_scope_body(p, ends, &ended);
        if (body) body->op = 1; /* scoped */
        return body && end_tag(p) ? body : NULL;
    }
    return fail(p, t, "Encountered unknown tag '%s'.", describe(t, b, sizeof b));
}

/* The body of a new scope (for, macro, call, set and filter blocks): not soft. */
static jnode *parse_scope_body(parser *p, const char *const *ends, const char **ended) {
    int soft = p->soft;
    p->soft = 0;
    jnode *n = parse_body(p, ends, ended);
    p->soft = soft;
    return n;
}

/* Statements up to one of the tags `ends` (NULL: the end of the template).
 * On return the tag's name is current and *ended names it. */
static jnode *parse_body(parser *p, const char *const *ends, const char **ended) {
    const jtoken *start = cur(p);
    nlist l = {0};
    if (!enter(p)) return NULL;
    for (;;) {
        const jtoken *t = cur(p);
        if (p->failed) break;
        if (t->kind == TK_EOF) {
            if (ends) {
                char m[256];
                size_t k = 0;
                int o = snprintf(m, sizeof m, "Unexpected end of template. Jinja was looking for the following tags: ");
                for (; ends[k] && o > 0 && (size_t)o < sizeof m; k++)
                    o += snprintf(m + o, sizeof m - (size_t)o, "%s'%s'", k == 0 ? "" : " or ", ends[k]);
                if (o > 0 && (size_t)o < sizeof m) snprintf(m + o, sizeof m - (size_t)o, ".");
                fail(p, t, "%s", m);
            }
            break;
        }
        if (t->kind == TK_DATA) {
            jnode *n = node(p, N_DATA, t);
            if (n) { n->name = t->s; n->len = t->len; }
            nl_push(p, &l, n, NULL);
            advance(p);
        } else if (t->kind == TK_VAR_BEGIN) {
            advance(p);
            jnode *n = node(p, N_OUTPUT, t);
            if (!n) break;
            n->a = parse_tuple(p, false, true, NULL, false);
            if (!n->a) break;
            if (cur(p)->kind != TK_VAR_END) {
                char b[80];
                fail(p, cur(p), "expected token 'end of print statement', got '%s'", describe(cur(p), b, sizeof b));
                break;
            }
            advance(p);
            nl_push(p, &l, n, NULL);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            advance(p);
            const jtoken *name = cur(p);
            bool is_end = false;
            for (size_t k = 0; ends && ends[k]; k++)
                if (tok_is(name, TK_NAME, ends[k])) { *ended = ends[k]; is_end = true; }
            if (is_end) break;
            if (name->kind == TK_NAME && name->len >= 3 && memcmp(name->s, "end", 3) == 0) {
                char b[80];
                fail(p, name, "Encountered unknown tag '%s'.", describe(name, b, sizeof b));
                break;
            }
            nl_push(p, &l, parse_statement(p), NULL);
        } else {
            char b[80];
            fail(p, t, "unexpected '%s'", describe(t, b, sizeof b));
        }
    }
    size_t cnt = l.n;
    jnode **v = nl_finish(p, &l, NULL);
    jnode *body = node(p, N_BODY, start);
    if (p->failed || !body) return NULL;
    body->args = v;
    body->nargs = cnt;
    p->nesting--;
    return body;
}

jnode *kp_jinja_parse(const jtokens *toks, jarena *a, kp_jinja_error *err) {
    parser p = {.tk = toks, .a = a, .err = err};
    jnode *root = parse_body(&p, NULL, NULL);
    if (p.failed) {
        if (err && err->kind == KP_JINJA_OK) kp_jinja_seterr(err, KP_JINJA_ENOMEM, 0, 0, "out of memory");
        return NULL;
    }
    return root;
}
