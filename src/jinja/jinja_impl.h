/*
 * jinja_impl.h - the types the files of src/jinja/ share: the arena, the
 * runtime values, the syntax tree and the interpreter state.
 *
 *   lex.c      template text -> tokens (whitespace control, raw, comments)
 *   parse.c    tokens -> syntax tree (jnode), allocated in the template's arena
 *   value.c    the arena, runtime values (jv), Python's str()/repr()/==/<, errors
 *   pystr.c    Python's str operations shared by filters and methods
 *   methods.c  attribute/item lookup, str/dict/list methods, the globals,
 *              '%' and str.format, slices
 *   filters.c  filters and tests
 *   render.c   statements and expressions over a tree, scopes, macros, limits
 *
 * Calls go down that list only (render -> filters -> methods -> pystr ->
 * value; lex and parse -> value, parse -> filters for the names), so the
 * files of the folder never call each other in a circle (make check).
 *
 * Values (jv, 16 bytes, passed by value) live in a per-render arena freed
 * at once when the render ends; strings, lists and dicts are immutable once
 * built, except a namespace's dict. The syntax tree is never written after
 * parsing, so one template serves concurrent renders.
 */
#ifndef KP_JINJA_IMPL_H
#define KP_JINJA_IMPL_H

#include <locale.h>
#include <stdbool.h>
#include <stdint.h>

#include "jinja/jinja.h"

/* ---- the arena: bump allocation in chunks, a byte budget ---- */
typedef struct jchunk jchunk;
typedef struct {
    jchunk *head;
    size_t total, limit; /* bytes taken, the most it may take (0: no limit) */
} jarena;
void *kp_ja_alloc(jarena *a, size_t n); /* zeroed, 16-aligned; NULL when out of memory or budget */
char *kp_ja_strndup(jarena *a, const char *s, size_t n);
size_t kp_ja_used(const jarena *a); /* bytes handed out, with the chunk headers */
void kp_ja_free(jarena *a);

/* ---- values ---- */
typedef enum {
    JT_UNDEF, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT, JT_STR, JT_LIST, JT_DICT,
    JT_NS,   /* namespace(): a dict whose members `set ns.x` may change */
    JT_LOOP, /* the `loop` object of a for loop */
    JT_FUNC  /* a macro, a global, a bound method */
} jtype;

/* UTF-8, NUL-terminated. taint: NULL (every byte the template's) or len
 * bytes, 1 where the byte came from client text (taint.c); never written
 * once the string exists, so strings may share a parent's array. born: the
 * render's count of strings when this one was made (0: a constant of the
 * template), which tells the strings an operation made from the older. */
typedef struct jstr { const uint8_t *taint; uint64_t born; size_t len; char s[]; } jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jloop jloop;
typedef struct jfunc jfunc;

typedef struct jv {
    uint8_t t;       /* jtype */
    uint8_t unsafe;  /* JT_UNDEF: using it raises SecurityError(hint) */
    uint8_t tuple;   /* JT_LIST: a tuple (printed with parentheses) */
    uint8_t gen;     /* JT_LIST: a generator (map, select...): no len(), no JSON, always true */
    uint8_t markup;  /* JT_STR: Markup (|safe, |escape): `+` escapes a plain str operand */
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        jloop *loop;
        jfunc *fn;
        const char *hint; /* JT_UNDEF: the message using it raises, or NULL */
    } u;
} jv;

struct jlist { size_t n; jv *items; };
struct jdict { size_t n, cap; jv *keys, *vals; };

/* ---- the syntax tree ---- */
typedef enum {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL,
    N_FILTER, N_TEST, N_NOT, N_NEG, N_POS, N_BINOP, N_AND, N_OR, N_COMPARE, N_CONDEXPR,
    N_CONCAT, N_NSREF,
    /* statements */
    N_BODY, N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_BREAK, N_CONTINUE
} jnkind;

typedef enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
} jop;

typedef struct jnode jnode;
struct jnode {
    uint8_t kind; /* jnkind */
    uint8_t op;   /* jop (N_BINOP), negated test (N_TEST) */
    int line, col;
    jnode *a, *b, *c, *d;       /* operands, bodies (meaning per kind, see parse.c) */
    jnode **args; size_t nargs; /* items, positional arguments, statements */
    const char **kwnames;       /* keyword arguments / macro parameters */
    jnode **kwvals; size_t nkw;
    uint8_t *ops;               /* N_COMPARE: one jop per operand after the first */
    const char *name;           /* names, attributes, filter/test names, data text */
    size_t len;                 /* N_DATA: bytes of name */
    jv value;                   /* N_CONST */
};

/* ---- tokens ---- */
typedef enum {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP
} jtkind;

typedef struct {
    uint8_t kind;
    int line, col;
    const char *s; size_t len; /* TK_DATA, TK_NAME, TK_STRING (unescaped), TK_OP (spelling) */
    int64_t i; double f;
} jtoken;

typedef struct {
    jtoken *toks; size_t n, cap;
} jtokens;

/* lex.c: src must be the normalized text (see kp_jinja_compile). Strings
 * and data go into the arena. */
bool kp_jinja_lex(const char *src, size_t len, jarena *a, jtokens *out, kp_jinja_error *err);
/* parse.c */
jnode *kp_jinja_parse(const jtokens *toks, jarena *a, kp_jinja_error *err);

/* ---- errors ---- */
void kp_jinja_seterr(kp_jinja_error *err, kp_jinja_kind kind, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- the interpreter state of one render ---- */
typedef struct jframe jframe;
typedef struct jctx {
    jarena arena;
    kp_jinja_error *err;
    bool failed;
    const jnode *at;  /* the node being evaluated (error positions) */
    long steps, depth, rdepth; /* steps taken, macro calls and levels (eval/blocks) open */
    kp_buf *out;      /* where output goes now (a macro's own buffer while it runs) */
    size_t out_total;
    jframe *root;
    locale_t utf8;    /* C.UTF-8 for case mapping beyond ASCII, made when first needed */
    bool utf8_tried;
    kp_buf *tout;     /* taint of out, one byte a byte (taint.c); NULL: nobody asked */
    bool load_client; /* kp_jv_from_json marks every string it makes as client text */
    uint64_t n_str;   /* strings made so far (jstr.born) */
    const jnode *stmt; /* the statement being executed (kp_jinja_line_at) */
    kp_buf *top;       /* the render's own output (not a macro's buffer) */
    size_t watch;      /* kp_jinja_line_at: the byte of top asked for; SIZE_MAX: none */
    int watch_line;    /* the template line that wrote it, once written */
} jctx;

/* value.c: fails the render with kind and message at the current node; returns an undefined value. */
jv kp_jfail(jctx *c, kp_jinja_kind kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define JFAILED(c) ((c)->failed)

/* value.c: constructors (arena; on failure they set c->failed and return undefined) */
static inline jv jv_undef(void) { jv v = {0}; v.t = JT_UNDEF; return v; }
static inline jv jv_none(void) { jv v = {0}; v.t = JT_NONE; return v; }
static inline jv jv_bool(bool b) { jv v = {0}; v.t = JT_BOOL; v.u.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {0}; v.t = JT_INT; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {0}; v.t = JT_FLOAT; v.u.f = f; return v; }
jv kp_jv_undef_hint(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv kp_jv_str(jctx *c, const char *s, size_t n); /* s NULL: n zero bytes */
jv kp_jv_strz(jctx *c, const char *s);
jv kp_jv_str_client(jctx *c, const char *s, size_t n); /* every byte client text (taint.c) */
jv kp_jv_substr(jctx *c, jv s, size_t at, size_t n);  /* s's bytes [at, at + n), and their taint */
jv kp_jv_str_buf(jctx *c, kp_buf *b); /* the buffer's bytes as a string; frees b */
jv kp_jv_list(jctx *c, size_t n);     /* n items, all undefined, to fill */
jv kp_jv_dict(jctx *c);
jv kp_jv_func(jctx *c, int kind, const char *name); /* a JT_FUNC of kind JFN_*, its other fields zero */
bool kp_jdict_set(jctx *c, jdict *d, jv key, jv val);
jv *kp_jdict_get(const jdict *d, jv key);
jv *kp_jdict_gets(const jdict *d, const char *key);
jv kp_jv_from_json(jctx *c, const json_t *j);
json_t *kp_jv_to_json(jctx *c, jv v); /* NULL and a TypeError for what JSON cannot hold */

bool kp_jv_truthy(jv v);
bool kp_jv_is_num(jv v); /* bool, int or float */
double kp_jv_num(jv v);
bool kp_jv_eq(jv a, jv b);
int kp_jv_cmp(jctx *c, jv a, jv b); /* <0, 0, >0; sets a TypeError when not ordered */
const char *kp_jv_typename(jv v); /* Python's: "str", "int", "dict"... */
/* Python's str(v) and repr(v) appended to b */
void kp_jv_write_str(kp_buf *b, jv v);
void kp_jv_write_repr(kp_buf *b, jv v);
jv kp_jv_to_str(jctx *c, jv v);
void kp_py_float_repr(double x, char out[40]);
size_t kp_utf8_count(const char *s, size_t n);
size_t kp_utf8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point cp */
size_t kp_jv_length(jctx *c, jv v);   /* len(); TypeError for what has none */
bool kp_jv_is_iterable(jv v);
jv kp_jv_iter_list(jctx *c, jv v);    /* list(v): items of a list, keys of a dict, chars of a string */
void kp_jv_check_string(jctx *c, size_t n);
void kp_jv_check_items(jctx *c, size_t n);

typedef struct {
    jv *args; size_t nargs;
    const char **kwnames; jv *kwvals; size_t nkw;
} jargs;
jv kp_jinja_call(jctx *c, jv fn, const jargs *a); /* render.c */
jv kp_jinja_getattr(jctx *c, jv obj, const char *name); /* methods.c */
jv kp_jinja_getitem(jctx *c, jv obj, jv key);

/* filters.c */
jv kp_jinja_filter(jctx *c, const char *name, jv v, const jargs *a);
bool kp_jinja_filter_known(const char *name);
jv kp_jinja_test(jctx *c, const char *name, jv v, const jargs *a);
bool kp_jinja_test_known(const char *name);

/* methods.c */
struct jfunc {
    int kind;         /* JFN_* */
    const char *name; /* method or global name */
    jv self;          /* JFN_METHOD: the object */
    const jnode *macro;
    jframe *closure;
    jv caller;        /* JFN_MACRO called from a call block */
    jloop *loop;      /* JFN_CYCLE */
};
enum { JFN_MACRO, JFN_GLOBAL, JFN_METHOD, JFN_CYCLE };
struct jloop {
    size_t index0, length;
    jv items;
};
/* The method `name` of obj, or an undefined value (unsafe for the
 * mutating methods the sandbox refuses, plain when there is none). */
jv kp_jinja_method(jctx *c, jv obj, const char *name, bool *found);
jv kp_jinja_call_method(jctx *c, jfunc *fn, const jargs *a);
jv kp_jinja_call_global(jctx *c, jfunc *fn, const jargs *a);
jv kp_jinja_global(jctx *c, const char *name); /* range, namespace, ...; undefined when none */
jv kp_jinja_percent_format(jctx *c, jv fmt, jv args);
jv kp_jv_slice(jctx *c, jv v, jv start, jv stop, jv step);

/* pystr.c */
bool kp_py_space(unsigned cp);                         /* Python's str.isspace of one code point */
unsigned kp_cp_at(const char *s, size_t n, size_t i, size_t *len); /* the code point at byte i, *len its bytes */
size_t kp_prev_cp(const char *s, size_t end);          /* where the code point ending at end starts */
void kp_put_utf8(kp_buf *b, unsigned cp);              /* appends cp as UTF-8 */
bool kp_str_is_case(jctx *c, jv s, bool upper);        /* str.isupper() / str.islower() */
bool kp_cp_is(jctx *c, unsigned cp, char what);        /* 'a' alpha, 'n' alnum, 'd' digit, 'c' cased */
jv kp_jinja_escape(jctx *c, jv v);                       /* markupsafe.escape */
jv kp_jinja_strip(jctx *c, jv s, jv chars, int which);   /* which: 1 left, 2 right, 3 both */
jv kp_jinja_case(jctx *c, jv v, int mode);               /* 0 lower, 1 upper, 2 capitalize, 3 |title, 4 str.title */
jv kp_jinja_replace(jctx *c, jv s, jv old, jv new_, jv count);
jv kp_jinja_items(jctx *c, jv v);                        /* [(key, value), ...] */
bool kp_jv_need_str(jctx *c, jv v, const char *what);   /* a TypeError unless v is a str */
jv kp_jv_undef_fail(jctx *c, jv u);                      /* value.c: the error using u raises */

/* taint.c: which bytes came from client text (called by render.c only) */
bool kp_jt_deep(jv v);                       /* v holds a client byte (strings, keys, items) */
jv kp_jt_derived(jctx *c, jv r, uint64_t born_from, jv in, const jargs *a);
jv kp_jt_concat(jctx *c, jv a, jv b);        /* a + b with both taints */
jv kp_jt_repeat(jctx *c, jv r, jv seq);      /* r is seq's bytes repeated: its taint too */
bool kp_jt_put(jctx *c, kp_buf *tb, jv v, size_t n); /* taint of n bytes written for v */
jv kp_jt_str_bufs(jctx *c, kp_buf *b, kp_buf *tb);   /* a string of b's bytes, tb's taint; frees both */
kp_status kp_jt_ranges(const kp_buf *tb, size_t base, kp_jinja_range **ranges, size_t *n);

/* a keyword or positional argument: index pos, or name */
jv kp_jarg(const jargs *a, size_t pos, const char *name, bool *present);

#endif
