/*
 * toolsyn.c - a template's tool-call syntax, learned from its own
 * renderings (toolsyn.h), and calls read back in that syntax.
 *
 * Owns the learned literals. Learning renders four conversations through
 * the template, all ending with an assistant message after one user
 * message, with tools kpfa and kpfb (parameters kpk1, kpk2) given:
 *
 *   A0  content "KPCONTENT", no calls
 *   A1  kpfa {"kpk1": "kpv1", "kpk2": "kpv2"}           (id kpid00001)
 *   A2  A1's call, then kpfb {"kpk1": "kpv3"}           (id kpid00002)
 *   V   another conversation's calls, to check the syntax reads back
 *
 * The markup of calls is what A1 (A2) has where A0 has its content: the
 * bytes between their longest common prefix and suffix. In it the
 * sentinels give the layout (toolsyn.h's grammar):
 *
 *   A1 markup, NAMED:   OPEN kpfa MID {"kpk1":"kpv1","kpk2":"kpv2"} TAIL
 *   A1 markup, PARAMS:  OPEN kpfa MID KPRE kpk1 KMID kpv1 KPOST KPRE kpk2 KMID kpv2 KPOST REST
 *                       (A = MID KPRE, C = KPOST KPRE: KPRE is their
 *                       common suffix; TAIL = KPOST REST)
 *   A2 markup:          ... first call SEP second call TAIL
 *
 * In literals, the sentinel id becomes ID (any id), another name or key
 * sentinel NAME (any name), and digits that differ between the first and
 * the second call IDX (any digits): Kimi's functions.kpfa:0 and :1. A
 * fifth rendering, with a number as kpk2's value, finds markup that names
 * a value's type (DeepSeek's string="true" / "false", Kimi K3's
 * type="string"): the word that differs becomes WORD (any letters).
 *
 * Reading back walks the text once per candidate start of OPEN (the first
 * that parses as a section reaching the end of the text wins); every
 * literal is matched loosely (lit_match), names are runs of
 * [A-Za-z0-9_.-], JSON is delimited by its nesting (kp_chat_json_extent)
 * and PARAMS values end where the next literal (C, SEP or TAIL) matches.
 */
#include "serve/toolsyn.h"

#include "grammar/grammar.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/canon.h"
#include "serve/chat_impl.h"

/* Placeholders inside learned literals (bytes no template writes). */
#define PH_ID '\x01'   /* a call id: [A-Za-z0-9_-]+ */
#define PH_IDX '\x02'  /* an index: [0-9]+ */
#define PH_NAME '\x03' /* a name or key again: [A-Za-z0-9_.-]+ */
#define PH_WORD '\x04' /* a word that names a value's type: [A-Za-z]+ */

typedef enum { CALL_JSON, CALL_NAMED, CALL_PARAMS } call_form;

typedef struct {
    char *s;
    size_t n;
} lit;

struct kp_toolsyn {
    call_form form;
    lit open, sep, tail; /* sep.s NULL: one call per message */
    /* CALL_JSON: the members holding the name and the arguments; name_is_key:
     * the object is {NAME: ARGS} */
    char *name_key, *args_key;
    bool name_is_key;
    lit mid;                 /* NAMED: between the name and the arguments */
    lit a, kmid, c;          /* PARAMS: name..first key, key..value, value..next key */
    lit sep0, tail0;         /* PARAMS: name..next call / end, for a call without parameters */
    size_t kpost;            /* PARAMS: the length of KPOST (the start of c, sep, tail) */
    char desc[160];
    kp_toolsyn_render_fn render; /* the template, for forced calls' exact markup */
    void *ctx;
};

typedef enum { M_NONE, M_OPEN, M_DONE } mres;

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '-' || c == '.';
}
static bool is_id(char c) { return is_name(c) && c != '.'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static size_t skip_ws(const char *t, size_t len, size_t i) {
    while (i < len && is_ws(t[i])) i++;
    return i;
}

static size_t rtrim(const char *t, size_t n) {
    while (n > 0 && is_ws(t[n - 1])) n--;
    return n;
}

/* Matches l at t[i] loosely (see the head comment). M_DONE with *end after
 * the match; M_OPEN when the text ends before l does; M_NONE. */
static mres lit_match(const lit *l, const char *t, size_t len, size_t i, size_t *end) {
    size_t k = 0;
    while (k < l->n) {
        char c = l->s[k];
        if (is_ws(c)) {
            while (k < l->n && is_ws(l->s[k])) k++;
            i = skip_ws(t, len, i);
            if (i == len && k < l->n) return M_OPEN;
            continue;
        }
        if (i == len) return M_OPEN;
        if (c == PH_ID || c == PH_IDX || c == PH_NAME || c == PH_WORD) {
            bool (*cls)(char) = c == PH_ID ? is_id : c == PH_IDX ? is_digit : c == PH_WORD ? is_alpha : is_name;
            if (!cls(t[i])) return M_NONE;
            while (i < len && cls(t[i])) i++;
            k++;
            continue;
        }
        if (t[i] != c) return M_NONE;
        i++, k++;
    }
    *end = i;
    return M_DONE;
}

/* ---- reading a section ---- */

typedef struct {
    size_t ns, ne;   /* the name */
    size_t as, ae;   /* JSON / NAMED: the JSON object; PARAMS: unused */
    size_t pfirst;   /* PARAMS: index of the first parameter in the list */
    size_t np;
} call_span;

typedef struct {
    size_t ks, ke, vs, ve;
} param_span;

typedef struct {
    call_span *c;
    size_t n, cap;
    param_span *p;
    size_t np, capp;
    bool oom;
} spans;

static void spans_reset(spans *s) { s->n = s->np = 0; }

static call_span *push_call(spans *s) {
    if (!s) return NULL;
    if (!kp_grow((void **)&s->c, &s->cap, s->n + 1, sizeof *s->c)) {
        s->oom = true;
        return NULL;
    }
    memset(&s->c[s->n], 0, sizeof s->c[0]);
    s->c[s->n].pfirst = s->np;
    return &s->c[s->n++];
}

static void push_param(spans *s, size_t ks, size_t ke, size_t vs, size_t ve) {
    if (!s || s->oom || !s->n) return;
    if (!kp_grow((void **)&s->p, &s->capp, s->np + 1, sizeof *s->p)) {
        s->oom = true;
        return;
    }
    s->p[s->np++] = (param_span){ks, ke, vs, ve};
    s->c[s->n - 1].np++;
}

/* The name at t[i]: M_DONE with *end, M_OPEN at the end of the text. */
static mres name_at(const char *t, size_t len, size_t i, size_t *end) {
    size_t j = i;
    while (j < len && is_name(t[j])) j++;
    if (j == len) return M_OPEN;
    if (j == i || j - i > 256) return M_NONE;
    *end = j;
    return M_DONE;
}

/* The JSON object at t[i] (after whitespace). */
static mres json_at(const char *t, size_t len, size_t i, size_t *s, size_t *e) {
    i = skip_ws(t, len, i);
    if (i == len) return M_OPEN;
    if (t[i] != '{') return M_NONE;
    *s = i;
    int m = kp_chat_json_extent(t, len, i, e);
    return m == 2 ? M_DONE : m == 1 ? M_OPEN : M_NONE;
}

/* After a call ending at t[i]: the end of the section (TAIL and nothing
 * but whitespace after it), another call (*more, *end after SEP), M_OPEN
 * when the text ends inside either, or M_NONE. sep/tail: the literals for
 * this point (PARAMS' zero-parameter variants or the usual ones). */
static mres after_call(const lit *sep, const lit *tail, const char *t, size_t len, size_t i, bool *more,
                       size_t *end) {
    *more = false;
    if (skip_ws(t, len, i) == len) return M_OPEN; /* the end, or more to come */
    size_t te = 0, se = 0;
    mres mt = lit_match(tail, t, len, i, &te);
    if (mt == M_DONE && skip_ws(t, len, te) == len) {
        *end = te;
        return M_DONE;
    }
    mres ms = sep->s ? lit_match(sep, t, len, i, &se) : M_NONE;
    /* SEP made only of whitespace (calls on lines of their own) matches
     * in front of TAIL too: TAIL cut off by the end of the text wins when
     * no call can start after SEP */
    if (ms == M_DONE && mt == M_OPEN) {
        size_t k = skip_ws(t, len, se);
        if (k == len || !(t[k] == '{' || is_name(t[k]))) return M_OPEN;
    }
    if (ms == M_DONE) {
        *more = true;
        *end = se;
        return M_DONE;
    }
    return mt == M_OPEN || ms == M_OPEN ? M_OPEN : M_NONE;
}

/* A PARAMS call's parameters from t[i] (just after A). */
static mres params_at(const kp_toolsyn *s, const char *t, size_t len, size_t i, spans *sp, bool *more, size_t *end) {
    for (;;) {
        /* the key: up to KMID */
        size_t ks = i, ke = i, vs = 0;
        mres m = M_NONE;
        for (; ke < len && ke - ks <= 256 && t[ke] != '\n'; ke++)
            if (ke > ks && (m = lit_match(&s->kmid, t, len, ke, &vs)) != M_NONE) break;
        if (ke == len || m == M_OPEN) return M_OPEN;
        if (m != M_DONE) return M_NONE;
        /* the value: up to the first place where C, SEP or TAIL matches */
        for (size_t ve = vs;; ve++) {
            if (ve == len) {
                push_param(sp, ks, ke, vs, rtrim(t, len) > vs ? rtrim(t, len) : vs);
                return M_OPEN;
            }
            size_t at = 0;
            mres mc = lit_match(&s->c, t, len, ve, &at);
            if (mc == M_DONE) {
                push_param(sp, ks, ke, vs, ve);
                i = at;
                break;
            }
            mres ma = after_call(&s->sep, &s->tail, t, len, ve, more, end);
            if (ma == M_DONE || (ma == M_OPEN && skip_ws(t, len, ve) < len)) {
                push_param(sp, ks, ke, vs, ve);
                return ma;
            }
        }
    }
}

/* One call at t[i]; then what follows it. */
static mres call_at(const kp_toolsyn *s, const char *t, size_t len, size_t i, spans *sp, bool *more, size_t *end) {
    call_span *c = push_call(sp);
    if (sp && !c) return M_NONE;
    size_t at = 0, as = 0, ae = 0;
    mres m;
    if (s->form == CALL_JSON) {
        if ((m = json_at(t, len, i, &as, &ae)) != M_DONE) return m;
        if (c) c->as = as, c->ae = ae;
        return after_call(&s->sep, &s->tail, t, len, ae, more, end);
    }
    size_t ne = 0;
    i = skip_ws(t, len, i);
    if ((m = name_at(t, len, i, &ne)) != M_DONE) return m;
    if (c) c->ns = i, c->ne = ne;
    if (s->form == CALL_NAMED) {
        if ((m = lit_match(&s->mid, t, len, ne, &at)) != M_DONE) return m;
        if ((m = json_at(t, len, at, &as, &ae)) != M_DONE) return m;
        if (c) c->as = as, c->ae = ae;
        return after_call(&s->sep, &s->tail, t, len, ae, more, end);
    }
    m = lit_match(&s->a, t, len, ne, &at);
    if (m == M_DONE) return params_at(s, t, len, at, sp, more, end);
    mres z = after_call(&s->sep0, &s->tail0, t, len, ne, more, end);
    return z != M_NONE ? z : m;
}

/* A section from t[i]: M_DONE when it parses to the end of the text,
 * M_OPEN when the text ends inside it, else M_NONE. */
static mres section_at(const kp_toolsyn *s, const char *t, size_t len, size_t i, spans *sp) {
    if (sp) spans_reset(sp);
    size_t at = 0;
    mres m = lit_match(&s->open, t, len, i, &at);
    if (m != M_DONE) return m;
    for (;;) {
        bool more = false;
        size_t end = 0;
        m = call_at(s, t, len, at, sp, &more, &end);
        if (m != M_DONE || !more) return m;
        at = end;
    }
}

/* The first byte of OPEN that is not whitespace (SIZE_MAX: OPEN is only
 * whitespace or starts with a placeholder: the section starts the text). */
static size_t open_core(const kp_toolsyn *s) {
    size_t k = 0;
    while (k < s->open.n && is_ws(s->open.s[k])) k++;
    if (k == s->open.n || (unsigned char)s->open.s[k] <= (unsigned char)PH_WORD) return SIZE_MAX;
    return k;
}

/* The start of the section that ends the text (SIZE_MAX: none). complete:
 * a section cut off inside a call is not one. */
static size_t find_section(const kp_toolsyn *s, const char *t, size_t len, bool complete, spans *sp) {
    size_t core = open_core(s);
    if (core == SIZE_MAX) {
        size_t i = skip_ws(t, len, 0);
        mres m = section_at(s, t, len, i, sp);
        return m == M_DONE || (m == M_OPEN && (!complete || (sp && sp->n && i < len))) ? i : SIZE_MAX;
    }
    char first = s->open.s[core];
    for (size_t i = 0; i < len;) {
        const char *p = memchr(t + i, first, len - i);
        if (!p) break;
        i = (size_t)(p - t);
        mres m = section_at(s, t, len, i, sp);
        if (m == M_DONE) return i;
        if (m == M_OPEN) {
            if (!complete) return i;
            /* a final text may end inside TAIL or after a call's last byte */
            if (sp && sp->n && !sp->oom) {
                const call_span *c = &sp->c[sp->n - 1];
                bool whole = s->form == CALL_PARAMS ? c->ne > c->ns : c->ae > c->as;
                if (whole) return i;
            }
        }
        i++;
    }
    return SIZE_MAX;
}

/* ---- values ---- */

/* The schema type of tools[name].parameters.properties[key]: "string" when
 * the schema says string or says nothing, else its type (or "" for any). */
static bool param_is_string(const json_t *tools, const char *name, size_t nlen, const char *key, size_t klen) {
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        const json_t *n = json_object_get(fn, "name");
        if (!json_is_string(n) || json_string_length(n) != nlen || memcmp(json_string_value(n), name, nlen)) continue;
        const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)props, k, v) {
            if (strlen(k) != klen || memcmp(k, key, klen)) continue;
            const json_t *ty = json_object_get(v, "type");
            if (!ty) return !json_object_get(v, "enum") && !json_object_get(v, "anyOf");
            if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
            return false;
        }
    }
    return tools == NULL || json_array_size(tools) == 0;
}

/* A PARAMS value: a string, or JSON when its schema is not a string's and
 * it parses. */
static json_t *param_value(const char *v, size_t n, bool string) {
    if (!string) {
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
        if (j) return j;
    }
    return json_stringn_nocheck(v, n);
}

/* Call c's name (*name, malloc'd) and the canonical JSON of its arguments
 * (returned, malloc'd, *alen bytes); NULL when the call is malformed (not
 * a call; *oom false) or memory ran out (*oom true). */
static char *call_args(const kp_toolsyn *s, const json_t *tools, const char *t, const spans *sp, const call_span *c,
                       char **name, size_t *nlen, size_t *alen, bool *oom) {
    *oom = false;
    *name = NULL;
    json_t *args = NULL, *obj = NULL;
    const char *nm = NULL;
    size_t nl = 0;
    if (s->form == CALL_PARAMS) {
        nm = t + c->ns, nl = c->ne - c->ns;
        args = json_object();
        for (size_t k = 0; args && k < c->np; k++) {
            const param_span *p = &sp->p[c->pfirst + k];
            char *key = strndup(t + p->ks, p->ke - p->ks);
            json_t *v = key ? param_value(t + p->vs, p->ve - p->vs, param_is_string(tools, nm, nl, key, p->ke - p->ks))
                            : NULL;
            if (!v || json_object_set_new(args, key, v)) {
                json_decref(args);
                args = NULL;
            }
            free(key);
        }
        if (!args) {
            *oom = true;
            return NULL;
        }
    } else {
        obj = json_loadb(t + c->as, c->ae - c->as, JSON_DECODE_INT_AS_REAL, NULL);
        if (!obj) return NULL;
        if (s->form == CALL_NAMED) {
            nm = t + c->ns, nl = c->ne - c->ns;
            args = json_incref(obj);
        } else if (s->name_is_key) {
            void *it = json_object_size(obj) == 1 ? json_object_iter(obj) : NULL;
            if (it) nm = json_object_iter_key(it), nl = strlen(nm), args = json_incref(json_object_iter_value(it));
        } else {
            const json_t *n = json_object_get(obj, s->name_key);
            if (json_is_string(n)) nm = json_string_value(n), nl = json_string_length(n);
            args = json_incref(json_object_get(obj, s->args_key));
        }
    }
    if (json_is_string(args)) { /* arguments written as a JSON text */
        json_t *in = json_loads(json_string_value(args), 0, NULL);
        json_decref(args);
        args = in;
    }
    if (!args || json_is_null(args)) {
        json_decref(args);
        args = json_object();
    }
    char *canon = NULL;
    if (nm && nl && json_is_object(args)) {
        kp_status st = kp_canon_dump(args, &canon, alen, NULL);
        if (st == KP_ENOMEM) *oom = true;
        if (st != KP_OK) canon = NULL;
    }
    if (canon && !(*name = strndup(nm, nl))) {
        free(canon);
        canon = NULL;
        *oom = true;
    }
    *nlen = nl;
    json_decref(args);
    json_decref(obj);
    return canon;
}

kp_status kp_toolsyn_parse(const kp_toolsyn *s, const json_t *tools, const char *text, size_t len, uint64_t id_seed,
                           json_t **calls, size_t *content_len, kp_error *err) {
    *calls = NULL;
    *content_len = rtrim(text, len);
    spans sp = {0};
    size_t at = find_section(s, text, len, true, &sp);
    kp_status st = sp.oom ? KP_ENOMEM : KP_OK;
    json_t *arr = NULL;
    if (st == KP_OK && at != SIZE_MAX && sp.n > 0) {
        arr = json_array();
        if (!arr) st = KP_ENOMEM;
        for (size_t k = 0; st == KP_OK && k < sp.n; k++) {
            char *name = NULL;
            size_t nlen = 0, alen = 0;
            bool oom = false;
            char *args = call_args(s, tools, text, &sp, &sp.c[k], &name, &nlen, &alen, &oom);
            if (oom) {
                st = KP_ENOMEM;
            } else if (!args) {
                json_decref(arr); /* a malformed call: the whole section is content */
                arr = NULL;
                break;
            } else {
                json_t *call = kp_chat_call_object(name, nlen, args, alen, id_seed, k);
                if (!call || json_array_append_new(arr, call)) st = KP_ENOMEM;
            }
            free(name);
            free(args);
        }
    }
    free(sp.c);
    free(sp.p);
    if (st != KP_OK) {
        json_decref(arr);
        return kp_fail(err, KP_ENOMEM, "out of memory reading tool calls");
    }
    if (arr) {
        *calls = arr;
        *content_len = rtrim(text, at);
    }
    return KP_OK;
}

size_t kp_toolsyn_holdback(const kp_toolsyn *s, const char *text, size_t len) {
    size_t at = find_section(s, text, len, false, NULL);
    return rtrim(text, at == SIZE_MAX ? len : at);
}

const char *kp_toolsyn_describe(const kp_toolsyn *s) { return s->desc; }

bool kp_toolsyn_parallel(const kp_toolsyn *s) { return s->sep.s != NULL; }

void kp_toolsyn_free(kp_toolsyn *s) {
    if (!s) return;
    lit *l[] = {&s->open, &s->sep, &s->tail, &s->mid, &s->a, &s->kmid, &s->c, &s->sep0, &s->tail0};
    for (size_t i = 0; i < sizeof l / sizeof l[0]; i++) free(l[i]->s);
    free(s->name_key);
    free(s->args_key);
    free(s);
}

/* ---- learning ---- */

static const char *const SENT_NAMES[] = {"kpfa", "kpfb", "kpk1", "kpk2"};
static const char *const SENT_IDS[] = {"kpid00001", "kpid00002"};

/* A literal from t[0..n): sentinel ids -> ID, names and keys -> NAME. */
static bool lit_make(lit *l, const char *t, size_t n) {
    kp_buf b = {0};
    for (size_t i = 0; i < n;) {
        bool hit = false;
        for (size_t k = 0; k < 2 && !hit; k++)
            if (n - i >= 9 && !memcmp(t + i, SENT_IDS[k], 9)) kp_buf_putc(&b, PH_ID), i += 9, hit = true;
        for (size_t k = 0; k < 4 && !hit; k++)
            if (n - i >= 4 && !memcmp(t + i, SENT_NAMES[k], 4)) kp_buf_putc(&b, PH_NAME), i += 4, hit = true;
        if (!hit) kp_buf_putc(&b, t[i++]);
    }
    kp_buf_putc(&b, 0);
    if (b.oom) {
        kp_buf_free(&b);
        return false;
    }
    l->s = b.data;
    l->n = b.len - 1;
    return true;
}

/* a and b equal but for runs of digits (which become IDX in a) and, with
 * words, runs of letters (WORD). false: they differ otherwise (a
 * unchanged). */
static bool lit_merge_runs(lit *a, const lit *b, bool words) {
    char *out = malloc(a->n + 1);
    if (!out) return false;
    size_t i = 0, j = 0, o = 0;
    while (i < a->n && j < b->n) {
        bool (*cls)(char) = is_digit(a->s[i]) && is_digit(b->s[j])               ? is_digit
                            : words && is_alpha(a->s[i]) && is_alpha(b->s[j]) ? is_alpha
                                                                                : NULL;
        if (cls) {
            size_t i0 = i, j0 = j;
            while (i < a->n && cls(a->s[i])) i++;
            while (j < b->n && cls(b->s[j])) j++;
            if (i - i0 == j - j0 && !memcmp(a->s + i0, b->s + j0, i - i0)) memcpy(out + o, a->s + i0, i - i0), o += i - i0;
            else out[o++] = cls == is_digit ? PH_IDX : PH_WORD;
            continue;
        }
        if (a->s[i] != b->s[j]) break;
        out[o++] = a->s[i++], j++;
    }
    if (i < a->n || j < b->n) {
        free(out);
        return false;
    }
    out[o] = 0;
    free(a->s);
    a->s = out;
    a->n = o;
    return true;
}

static bool lit_merge(lit *a, const lit *b) { return lit_merge_runs(a, b, false); }

static bool lit_eq(const lit *a, const lit *b) { return a->n == b->n && !memcmp(a->s, b->s, a->n); }

typedef struct {
    kp_toolsyn_render_fn render;
    void *ctx;
    json_t *tools;
} prober;

static json_t *probe_call(const char *id, const char *name, const char *args) {
    return json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name, "arguments",
                     args);
}

/* Renders [user, assistant(content, calls)] without a generation prompt;
 * with trail, a tool result follows (the next turn of an agent loop, where
 * the template renders the answer as history). */
static kp_status probe_render_trail(prober *p, const char *content, json_t *calls, bool trail, char **out,
                                    size_t *len) {
    json_t *asst = json_pack("{s:s, s:s}", "role", "assistant", "content", content);
    if (asst && calls) json_object_set_new(asst, "tool_calls", calls);
    else json_decref(calls);
    json_t *body = asst ? json_pack("{s:[{s:s, s:s}, o], s:O, s:b}", "messages", "role", "user", "content", "kpu",
                                    asst, "tools", p->tools, "add_generation_prompt", 0)
                        : NULL;
    if (body && trail)
        json_array_append_new(json_object_get(body, "messages"),
                              json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", "kpid00001", "content", "kpres"));
    if (!body) return KP_ENOMEM;
    *out = NULL;
    kp_status st = p->render(p->ctx, body, out, len);
    json_decref(body);
    return st;
}

static kp_status probe_render(prober *p, const char *content, json_t *calls, char **out, size_t *len) {
    return probe_render_trail(p, content, calls, false, out, len);
}

/* Renders [user] with the generation prompt. */
static kp_status probe_gen(prober *p, char **out, size_t *len) {
    json_t *body = json_pack("{s:[{s:s, s:s}], s:O, s:b}", "messages", "role", "user", "content", "kpu", "tools",
                             p->tools, "add_generation_prompt", 1);
    if (!body) return KP_ENOMEM;
    *out = NULL;
    kp_status st = p->render(p->ctx, body, out, len);
    json_decref(body);
    return st;
}

/* The bytes x has where c (the content rendering) has its content. */
static void markup(const char *c, size_t cn, const char *x, size_t xn, size_t *s, size_t *e) {
    size_t p = 0, q = 0;
    while (p < cn && p < xn && c[p] == x[p]) p++;
    while (q < cn - p && q < xn - p && c[cn - 1 - q] == x[xn - 1 - q]) q++;
    /* never cut a marker such as <|START_ACTION|> or [TOOL_CALLS] in two:
     * a difference that starts (ends) inside one takes all of it */
    for (size_t k = p; k-- > 0 && p - k <= 32;) {
        if (x[k] == '>' || x[k] == ']' || is_ws(x[k])) break;
        if (x[k] == '<' || x[k] == '[') {
            p = k;
            break;
        }
    }
    size_t e0 = xn - q;
    for (size_t k = e0; k < xn && k - e0 < 32; k++) {
        if (x[k] == '<' || x[k] == '[' || is_ws(x[k])) break;
        if (x[k] == '>' || x[k] == ']') {
            q = xn - k - 1;
            break;
        }
    }
    *s = p;
    *e = xn - q;
}

/* Where needle occurs in t[from..to) (SIZE_MAX: nowhere). */
static size_t find(const char *t, size_t from, size_t to, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = from; i + n <= to; i++)
        if (!memcmp(t + i, needle, n)) return i;
    return SIZE_MAX;
}

/* The JSON object in t[from..to) that parses equal to want: its span. */
static bool find_json(const char *t, size_t from, size_t to, const json_t *want, size_t *s, size_t *e) {
    for (size_t i = from; i < to; i++) {
        if (t[i] != '{') continue;
        size_t je = 0;
        if (kp_chat_json_extent(t, to, i, &je) != 2) continue;
        json_t *v = json_loadb(t + i, je - i, 0, NULL);
        bool eq = v && json_equal(v, want);
        json_decref(v);
        if (eq) {
            *s = i, *e = je;
            return true;
        }
    }
    return false;
}

/* The innermost JSON object in t[from..to) around [as, ae) holding the
 * name: sets the JSON form's keys. */
static bool find_call_object(kp_toolsyn *s, const char *t, size_t from, size_t to, size_t as, size_t ae,
                             const json_t *args, size_t *os, size_t *oe) {
    for (size_t i = as; i-- > from;) {
        if (t[i] != '{') continue;
        size_t je = 0;
        if (kp_chat_json_extent(t, to, i, &je) != 2 || je < ae) continue;
        json_t *v = json_loadb(t + i, je - i, 0, NULL);
        const char *k;
        json_t *m;
        bool ok = false;
        json_object_foreach(v, k, m) {
            if (json_is_string(m) && !strcmp(json_string_value(m), "kpfa") && !s->name_key) s->name_key = strdup(k);
            else if (json_equal(m, args) && !s->args_key && strcmp(k, "kpfa")) s->args_key = strdup(k);
            else if (!strcmp(k, "kpfa") && json_equal(m, args)) s->name_is_key = true;
        }
        ok = s->name_is_key ? json_object_size(v) == 1 : s->name_key && s->args_key;
        json_decref(v);
        if (ok) {
            *os = i, *oe = je;
            return true;
        }
        free(s->name_key), free(s->args_key);
        s->name_key = s->args_key = NULL;
        s->name_is_key = false;
    }
    return false;
}

/* The first call of markup x[ms..me): its layout into s (open, the call's
 * own literals) and the offset where the call ends (*ce). */
typedef struct {
    size_t n, ne;    /* the name */
    size_t as, ae;   /* JSON: the object; NAMED: the arguments */
    size_t k1, v1e, k2, v2e; /* PARAMS */
} first_call;

static json_t *args_probe1(void) { return json_pack("{s:s, s:s}", "kpk1", "kpv1", "kpk2", "kpv2"); }

static const char *learn_layout(kp_toolsyn *s, const char *x, size_t ms, size_t me, first_call *f, bool *oom) {
    *oom = false;
    json_t *args = args_probe1();
    if (!args) return *oom = true, NULL;
    size_t name = find(x, ms, me, "kpfa");
    if (name == SIZE_MAX) {
        json_decref(args);
        return "it renders no tool calls";
    }
    size_t as = 0, ae = 0, os = 0, oe = 0;
    bool json_args = find_json(x, ms, me, args, &as, &ae);
    if (json_args && find_call_object(s, x, ms, me, as, ae, args, &os, &oe)) {
        s->form = CALL_JSON;
        f->as = os, f->ae = oe;
        bool ok = lit_make(&s->open, x + ms, os - ms);
        json_decref(args);
        if (!ok || (!s->name_is_key && (!s->name_key || !s->args_key))) return *oom = true, NULL;
        return NULL;
    }
    json_decref(args);
    f->n = name, f->ne = name + 4;
    if (!lit_make(&s->open, x + ms, name - ms)) return *oom = true, NULL;
    if (json_args) {
        if (as < f->ne) return "its calls hold the arguments before the name";
        s->form = CALL_NAMED;
        f->as = as, f->ae = ae;
        if (!lit_make(&s->mid, x + f->ne, as - f->ne)) return *oom = true, NULL;
        return NULL;
    }
    s->form = CALL_PARAMS;
    size_t k1 = find(x, f->ne, me, "kpk1"), v1 = find(x, f->ne, me, "kpv1");
    size_t k2 = find(x, f->ne, me, "kpk2"), v2 = find(x, f->ne, me, "kpv2");
    if (k1 == SIZE_MAX || v1 == SIZE_MAX || k2 == SIZE_MAX || v2 == SIZE_MAX || !(k1 < v1 && v1 < k2 && k2 < v2))
        return "its calls' arguments are neither JSON nor key-value parameters in order";
    f->k1 = k1, f->v1e = v1 + 4, f->k2 = k2, f->v2e = v2 + 4;
    lit a = {0}, c = {0}, b2 = {0};
    bool ok = lit_make(&a, x + f->ne, k1 - f->ne) && lit_make(&s->kmid, x + k1 + 4, v1 - k1 - 4) &&
              lit_make(&c, x + v1 + 4, k2 - v1 - 4) && lit_make(&b2, x + k2 + 4, v2 - k2 - 4);
    if (!ok) {
        free(a.s), free(c.s), free(b2.s);
        return *oom = true, NULL;
    }
    bool same = lit_eq(&s->kmid, &b2);
    free(b2.s);
    /* KPRE: the common end of A (MID KPRE) and C (KPOST KPRE) */
    size_t q = 0;
    while (q < a.n && q < c.n && a.s[a.n - 1 - q] == c.s[c.n - 1 - q]) q++;
    if (q == c.n && q > 0) q--; /* KPOST is never empty */
    s->a = a;
    s->c = c;
    s->kpost = c.n - q;
    if (!same || s->kmid.n == 0 || s->kpost == 0) return "its parameters are not written the same way each time";
    return NULL;
}

/* The literal after a call that ends at x[at] (up to the end of the
 * markup, or up to the next call's start). */
static const char *learn_tail(kp_toolsyn *s, const char *x, size_t at, size_t me, lit *out, bool *oom) {
    (void)s;
    if (!lit_make(out, x + at, me - at)) return *oom = true, NULL;
    return NULL;
}

/* PARAMS: the literals after the name of a call without parameters:
 * MID then what follows KPOST in SEP / TAIL. */
static bool learn_zero(kp_toolsyn *s) {
    size_t mid = s->a.n - (s->c.n - s->kpost); /* A = MID KPRE */
    const lit *from[] = {&s->sep, &s->tail};
    lit *to[] = {&s->sep0, &s->tail0};
    for (int k = 0; k < 2; k++) {
        if (!from[k]->s) continue;
        size_t rest = from[k]->n >= s->kpost ? from[k]->n - s->kpost : 0;
        char *b = malloc(mid + rest + 1);
        if (!b) return false;
        memcpy(b, s->a.s, mid);
        memcpy(b + mid, from[k]->s + from[k]->n - rest, rest);
        b[mid + rest] = 0;
        to[k]->s = b;
        to[k]->n = mid + rest;
    }
    return true;
}

/* Where the first call of markup x ends (after its arguments). */
static size_t call_end(const kp_toolsyn *s, const first_call *f) {
    return s->form == CALL_PARAMS ? f->v2e : f->ae;
}

/* The second call in A2's markup: SEP (between the calls, digits merged
 * with the first call's literals) and TAIL. */
static const char *learn_second(kp_toolsyn *s, const char *x, size_t ms, size_t me, bool *oom) {
    first_call f = {0};
    kp_toolsyn probe = {.form = s->form};
    const char *why = learn_layout(&probe, x, ms, me, &f, oom);
    lit open2 = probe.open;
    bool same_open = !why && !*oom && lit_eq(&open2, &s->open);
    free(probe.open.s), free(probe.mid.s), free(probe.a.s), free(probe.kmid.s), free(probe.c.s);
    free(probe.name_key), free(probe.args_key);
    if (*oom) return NULL;
    if (!same_open) return "its second call does not start as its first";
    size_t e1 = call_end(s, &f);
    /* the second call: name kpfb (or its JSON object), after e1 */
    size_t n2;
    lit sep = {0};
    if (s->form == CALL_JSON) {
        size_t o2 = SIZE_MAX;
        for (size_t i = e1; i < me && o2 == SIZE_MAX; i++) {
            size_t je;
            if (x[i] == '{' && kp_chat_json_extent(x, me, i, &je) == 2) {
                json_t *v = json_loadb(x + i, je - i, 0, NULL);
                char *d = v ? json_dumps(v, JSON_COMPACT) : NULL;
                if (d && strstr(d, "kpfb")) o2 = i;
                free(d);
                json_decref(v);
            }
        }
        if (o2 == SIZE_MAX) return "its second call is not a JSON object like the first";
        n2 = o2;
    } else {
        n2 = find(x, e1, me, "kpfb");
        if (n2 == SIZE_MAX) return "its second call has no name";
    }
    if (!lit_make(&sep, x + e1, n2 - e1)) return *oom = true, NULL;
    s->sep = sep;
    /* the second call's own literals match the first's, up to digits */
    if (s->form == CALL_NAMED) {
        size_t a2 = SIZE_MAX;
        for (size_t i = n2 + 4; i < me && a2 == SIZE_MAX; i++)
            if (x[i] == '{') a2 = i;
        lit mid2 = {0};
        if (a2 == SIZE_MAX || !lit_make(&mid2, x + n2 + 4, a2 - n2 - 4)) return a2 == SIZE_MAX ? "its second call has no arguments" : (*oom = true, NULL);
        bool ok = lit_merge(&s->mid, &mid2);
        free(mid2.s);
        if (!ok) return "its calls' markup differs between the first and the second";
    } else if (s->form == CALL_PARAMS) {
        size_t k1 = find(x, n2, me, "kpk1");
        lit a2 = {0};
        if (k1 == SIZE_MAX || !lit_make(&a2, x + n2 + 4, k1 - n2 - 4)) return k1 == SIZE_MAX ? "its second call has no parameters" : (*oom = true, NULL);
        bool ok = lit_merge(&s->a, &a2);
        free(a2.s);
        if (!ok) return "its calls' markup differs between the first and the second";
    }
    return NULL;
}

/* A check conversation: the template's rendering of other calls, with a
 * number and an object among their arguments, must read back as exactly
 * those calls. */
static const char *verify(kp_toolsyn *s, prober *p, const char *c0, size_t c0n, bool *oom) {
    static const char *const names[] = {"get_weather", "lookup_user"};
    static const char *const args[] = {"{\"city\":\"Paris, France\",\"days\":3}",
                                       "{\"q\":\"a-b c\",\"opts\":{\"n\":[1,2]}}"};
    json_t *tools = json_pack("[{s:{s:s, s:{s:{s:{s:s}, s:{s:s}}}}}, {s:{s:s, s:{s:{s:{s:s}, s:{s:s}}}}}]",
                              "function", "name", "get_weather", "parameters", "properties", "city", "type", "string",
                              "days", "type", "integer", "function", "name", "lookup_user", "parameters",
                              "properties", "q", "type", "string", "opts", "type", "object");
    json_t *calls = json_array();
    size_t n = s->sep.s ? 2 : 1;
    for (size_t i = 0; calls && i < n; i++)
        json_array_append_new(calls, probe_call(i ? "kpid00002" : "kpid00001", names[i], args[i]));
    char *x = NULL;
    size_t xn = 0;
    kp_status st = calls && tools ? probe_render(p, "", calls, &x, &xn) : KP_ENOMEM;
    if (!calls) json_decref(calls);
    if (st != KP_OK) {
        free(x);
        json_decref(tools);
        if (st == KP_ENOMEM) return *oom = true, NULL;
        return "it refuses the check conversation";
    }
    size_t ms, me;
    markup(c0, c0n, x, xn, &ms, &me);
    json_t *got = NULL;
    size_t cl = 0;
    kp_error err;
    st = kp_toolsyn_parse(s, tools, x + ms, me - ms, 1, &got, &cl, &err);
    free(x);
    json_decref(tools);
    if (st != KP_OK) return *oom = true, NULL;
    bool ok = json_array_size(got) == n && cl == 0;
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *fn = json_object_get(json_array_get(got, i), "function");
        json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        json_t *w = json_loads(args[i], 0, NULL);
        ok = !strcmp(json_string_value(json_object_get(fn, "name")), names[i]) && json_equal(a, w);
        json_decref(a);
        json_decref(w);
    }
    json_decref(got);
    return ok ? NULL : "its rendering of calls with numbers and objects does not read back";
}

static json_t *probe_tools(void) {
    return json_pack("[{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s}}}}}, {s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}, "
                     "s:{s:s}}}}}]",
                     "type", "function", "function", "name", "kpfa", "description", "kpdesc", "parameters", "type",
                     "object", "properties", "kpk1", "type", "string", "kpk2", "type", "string", "type", "function",
                     "function", "name", "kpfb", "description", "kpdesc", "parameters", "type", "object",
                     "properties", "kpk1", "type", "string", "kpk2", "type", "string");
}

kp_status kp_toolsyn_learn(kp_toolsyn_render_fn render, void *ctx, kp_toolsyn **out, bool *renders_tools, char *why,
                           size_t why_size, kp_error *err) {
    *out = NULL;
    *renders_tools = true; /* unless shown otherwise */
    if (why && why_size) why[0] = 0;
    prober p = {render, ctx, probe_tools()};
    kp_toolsyn *s = calloc(1, sizeof *s);
    char *c0 = NULL, *x1 = NULL, *x2 = NULL;
    size_t c0n = 0, x1n = 0, x2n = 0;
    const char *reason = NULL;
    bool oom = !p.tools || !s;
    kp_status st = KP_OK;
    if (!oom) st = probe_render(&p, "KPCONTENT", NULL, &c0, &c0n);
    if (!oom && st == KP_OK) { /* tools rendered: the prompt changes with them */
        json_t *tools = p.tools;
        char *bare = NULL;
        size_t bn = 0;
        p.tools = json_null();
        kp_status bs = probe_render(&p, "KPCONTENT", NULL, &bare, &bn);
        p.tools = tools;
        oom = bs == KP_ENOMEM;
        *renders_tools = bs != KP_OK || bn != c0n || memcmp(bare, c0, bn) != 0;
        free(bare);
    }
    if (!oom && st == KP_OK) {
        json_t *calls = json_pack("[o]", probe_call("kpid00001", "kpfa", "{\"kpk1\":\"kpv1\",\"kpk2\":\"kpv2\"}"));
        st = calls ? probe_render(&p, "", calls, &x1, &x1n) : KP_ENOMEM;
    }
    oom = oom || st == KP_ENOMEM;
    if (!oom && st != KP_OK) reason = "it refuses an assistant message with a tool call";
    first_call f = {0};
    size_t ms = 0, me = 0;
    if (!oom && !reason) {
        markup(c0, c0n, x1, x1n, &ms, &me);
        reason = learn_layout(s, x1, ms, me, &f, &oom);
    }
    if (!oom && !reason && s->form == CALL_PARAMS) {
        /* markup that names a value's type (string="true", type="string")
         * becomes a word that matches any type: learned from a number */
        json_t *calls = json_pack("[o]", probe_call("kpid00001", "kpfa", "{\"kpk1\":\"kpv1\",\"kpk2\":9137}"));
        char *xn = NULL;
        size_t xnn = 0;
        st = calls ? probe_render(&p, "", calls, &xn, &xnn) : KP_ENOMEM;
        oom = st == KP_ENOMEM;
        size_t ts = 0, te = 0;
        if (st == KP_OK) markup(c0, c0n, xn, xnn, &ts, &te);
        size_t k2 = st == KP_OK ? find(xn, ts, te, "kpk2") : SIZE_MAX;
        size_t v2 = k2 != SIZE_MAX ? find(xn, k2, te, "9137") : SIZE_MAX;
        lit typed = {0};
        if (v2 != SIZE_MAX && !lit_make(&typed, xn + k2 + 4, v2 - k2 - 4)) oom = true;
        if (typed.s && !lit_eq(&typed, &s->kmid)) lit_merge_runs(&s->kmid, &typed, true);
        free(typed.s);
        free(xn);
    }
    if (!oom && !reason) {
        json_t *calls = json_pack("[o, o]", probe_call("kpid00001", "kpfa", "{\"kpk1\":\"kpv1\",\"kpk2\":\"kpv2\"}"),
                                  probe_call("kpid00002", "kpfb", "{\"kpk1\":\"kpv3\"}"));
        st = calls ? probe_render(&p, "", calls, &x2, &x2n) : KP_ENOMEM;
        oom = st == KP_ENOMEM;
        size_t m2s = 0, m2e = 0;
        if (st == KP_OK) markup(c0, c0n, x2, x2n, &m2s, &m2e);
        /* a template that renders one call per message (or refuses two)
         * has no separator */
        if (!oom && st == KP_OK && find(x2, m2s, m2e, "kpfb") != SIZE_MAX) {
            reason = learn_second(s, x2, m2s, m2e, &oom);
            /* TAIL: after the second call, in A2 */
            if (!oom && !reason) {
                size_t k = find(x2, m2s, m2e, "kpfb");
                size_t e2 = SIZE_MAX;
                if (s->form == CALL_PARAMS) {
                    size_t v3 = find(x2, k, m2e, "kpv3");
                    e2 = v3 == SIZE_MAX ? SIZE_MAX : v3 + 4;
                } else {
                    for (size_t i = k; i > m2s && s->form == CALL_JSON; i--)
                        if (x2[i] == '{') {
                            size_t je;
                            if (kp_chat_json_extent(x2, m2e, i, &je) == 2 && je > k) {
                                e2 = je;
                                break;
                            }
                        }
                    if (s->form == CALL_NAMED) {
                        for (size_t i = k; i < m2e && e2 == SIZE_MAX; i++) {
                            size_t je;
                            if (x2[i] == '{' && kp_chat_json_extent(x2, m2e, i, &je) == 2) e2 = je;
                        }
                    }
                }
                if (e2 == SIZE_MAX) reason = "its second call has no end";
                else learn_tail(s, x2, e2, m2e, &s->tail, &oom);
            }
        }
    }
    if (!oom && !reason && !s->tail.s) learn_tail(s, x1, call_end(s, &f), me, &s->tail, &oom);
    if (!oom && !reason && s->form == CALL_PARAMS && !learn_zero(s)) oom = true;
    if (!oom && !reason) {
        static const char *const forms[] = {"JSON calls", "named calls", "parameter calls"};
        char open[48];
        size_t k = 0;
        for (size_t i = 0; i < s->open.n && k + 1 < sizeof open; i++)
            open[k++] = s->open.s[i] == '\n' ? ' ' : s->open.s[i] < ' ' ? '*' : s->open.s[i];
        open[k] = 0;
        snprintf(s->desc, sizeof s->desc, "%s after '%s'%s", forms[s->form], open,
                 s->sep.s ? "" : ", one per message");
        reason = verify(s, &p, c0, c0n, &oom);
    }
    free(c0), free(x1), free(x2);
    json_decref(p.tools);
    if (oom) {
        kp_toolsyn_free(s);
        return kp_fail(err, KP_ENOMEM, "out of memory learning the template's tool calls");
    }
    if (reason) {
        if (why && why_size) snprintf(why, why_size, "%s", reason);
        kp_toolsyn_free(s);
        return KP_OK;
    }
    s->render = render;
    s->ctx = ctx;
    *out = s;
    return KP_OK;
}

/* ---- forced calls ---- */
/*
 * A forced call is generated in the exact bytes the template renders for
 * it, so that when the client sends the call back, the next prompt holds
 * the very tokens the model wrote (an agent loop keeps its cache). The
 * markup around each tool's arguments is taken from the template's
 * rendering of a call of that tool; the arguments are written as the
 * template writes arguments back (its tojson: RFC 8785, compact, keys in
 * order), so the schema is given sorted properties; properties beyond the
 * declared ones are allowed only when the schema says so.
 *
 *   JSON, NAMED   OPEN ... name ... [args] ... TAIL, args found as the
 *                 sentinel object {"kpzq": "kpsent"}
 *   PARAMS        each parameter written with a sentinel value of its
 *                 type (strings kpsv<i>, numbers 9137<i>, objects
 *                 {"kpo<i>": 1}); the markup between values is split at
 *                 KPOST so that optional parameters form optional groups
 */

typedef struct {
    kp_galt *first, *more;
    size_t n_first, n_more;
    char **texts; /* renderings the pieces point into */
    size_t n_texts;
    json_t **schemas;
    size_t n_schemas;
    char *suffix;
    size_t suffix_len;
    const char *gen; /* the generation prompt's rendering: what the model writes after it */
    size_t gen_len;
    bool trail;      /* renderings end with a tool result (false: the template refuses one
                        after an answer without calls, as gpt-oss's does) */
} forced;

static void forced_free(forced *f) {
    for (size_t i = 0; i < f->n_first; i++) free(f->first[i].pieces);
    for (size_t i = 0; i < f->n_more; i++) free(f->more[i].pieces);
    for (size_t i = 0; i < f->n_texts; i++) free(f->texts[i]);
    for (size_t i = 0; i < f->n_schemas; i++) json_decref(f->schemas[i]);
    free(f->first), free(f->more), free(f->texts), free(f->schemas), free(f->suffix);
}

static bool keep_text(forced *f, char *t) {
    char **v = realloc(f->texts, (f->n_texts + 1) * sizeof *v);
    if (!v) return free(t), false;
    f->texts = v;
    f->texts[f->n_texts++] = t;
    return true;
}

static const json_t *keep_schema(forced *f, json_t *s) {
    json_t **v = s ? realloc(f->schemas, (f->n_schemas + 1) * sizeof *v) : NULL;
    if (!v) return json_decref(s), NULL;
    f->schemas = v;
    f->schemas[f->n_schemas++] = s;
    return s;
}

static bool add_piece(kp_galt *a, kp_gpiece_kind kind, const char *bytes, size_t len, const json_t *schema,
                      uint32_t group) {
    if (kind == KP_GPIECE_LIT && len == 0) return true;
    kp_gpiece *v = realloc(a->pieces, (a->n + 1) * sizeof *v);
    if (!v) return false;
    a->pieces = v;
    a->pieces[a->n++] = (kp_gpiece){kind, bytes, len, schema, group};
    return true;
}

static bool add_alt(kp_galt **v, size_t *n, kp_galt a) {
    kp_galt *w = realloc(*v, (*n + 1) * sizeof *w);
    if (!w) return false;
    *v = w;
    w[(*n)++] = a;
    return true;
}

/* Where generation starts in x, a rendering with an answer whose markup
 * starts at ms: after the generation prompt when x holds it and it ends
 * before the markup (the template may write more in front of an answer
 * in history, as GLM's empty <think></think>: the model writes it too). */
static size_t gen_start(const forced *f, const char *x, size_t ms) {
    if (f->gen && f->gen_len <= ms && !memcmp(x, f->gen, f->gen_len)) return f->gen_len;
    return ms;
}

/* Renders [user, assistant with calls] with the request's tools, and a
 * tool result after them when f->trail; the text is kept in f. */
static kp_status force_render(const kp_toolsyn *s, const json_t *tools, json_t *calls, const char *content, forced *f,
                              char **x, size_t *xn) {
    prober p = {s->render, s->ctx, (json_t *)tools};
    kp_status st = probe_render_trail(&p, content, calls, f->trail, x, xn);
    if (st == KP_OK && !keep_text(f, *x)) st = KP_ENOMEM;
    if (st != KP_OK && st != KP_ENOMEM) st = KP_EUNSUPPORTED;
    return st;
}

/* The sentinel value of a parameter of schema ps (index i) as JSON text
 * into b, and the text to find in the rendering; *json: a JSON piece (not
 * raw text). */
static void sentinel_value(const json_t *ps, size_t i, char *val, size_t vn, char *find_s, size_t fn, bool *json) {
    const json_t *ty = json_object_get(ps, "type");
    const char *t = json_is_string(ty) ? json_string_value(ty) : "string";
    *json = true;
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        snprintf(val, vn, "%zu", 913700 + i);
        snprintf(find_s, fn, "%zu", 913700 + i);
    } else if (!strcmp(t, "object")) {
        snprintf(val, vn, "{\"kpo%zu\":1}", i);
        snprintf(find_s, fn, "kpo%zu", i);
    } else if (!strcmp(t, "array")) {
        snprintf(val, vn, "[\"kpo%zu\"]", i);
        snprintf(find_s, fn, "kpo%zu", i);
    } else if (!strcmp(t, "boolean")) {
        snprintf(val, vn, "true");
        snprintf(find_s, fn, "true");
    } else {
        *json = false;
        snprintf(val, vn, "\"kpsv%zu\"", i);
        snprintf(find_s, fn, "kpsv%zu", i);
    }
}

/* The alternative of tool fn (its "function" object) in PARAMS form. */
static kp_status force_params(const kp_toolsyn *s, const json_t *tools, const json_t *fn, const json_t *fschema,
                              const char *c0, size_t c0n, forced *f, kp_galt *a, kp_error *err) {
    const char *name = json_string_value(json_object_get(fn, "name"));
    const json_t *props = json_object_get(fschema, "properties");
    const json_t *req = json_object_get(fschema, "required");
    size_t np = json_object_size(props);
    for (size_t k = 0; k < s->c.n; k++)
        if ((unsigned char)s->c.s[k] <= (unsigned char)PH_WORD)
            return kp_fail(err, KP_EUNSUPPORTED, "the template's parameter markup varies");
    size_t kpre = s->c.n - s->kpost;
    kp_buf args = {0};
    kp_buf_putc(&args, '{');
    const char *k;
    const json_t *ps;
    size_t i = 0;
    json_object_foreach((json_t *)props, k, ps) {
        char val[64], fs[32];
        bool js;
        sentinel_value(ps, i++, val, sizeof val, fs, sizeof fs, &js);
        json_t *key = json_string(k);
        char *kq = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
        json_decref(key);
        if (i > 1) kp_buf_putc(&args, ',');
        kp_buf_puts(&args, kq ? kq : "\"\"");
        kp_buf_putc(&args, ':');
        kp_buf_puts(&args, val);
        free(kq);
    }
    kp_buf_putc(&args, '}');
    kp_buf_putc(&args, 0);
    json_t *calls = args.oom ? NULL : json_pack("[o]", probe_call("kpid00001", name, args.data));
    kp_buf_free(&args);
    if (!calls) return kp_fail(err, KP_ENOMEM, "out of memory");
    char *x = NULL;
    size_t xn = 0, ms, me;
    kp_status st = force_render(s, tools, calls, "", f, &x, &xn);
    if (st != KP_OK) return kp_fail(err, st, "the template refuses a call of %s", name);
    markup(c0, c0n, x, xn, &ms, &me);
    size_t at = ms, prev_end = SIZE_MAX, gs = gen_start(f, x, ms);
    i = 0;
    json_object_foreach((json_t *)props, k, ps) {
        char val[64], fs[32];
        bool js;
        sentinel_value(ps, i, val, sizeof val, fs, sizeof fs, &js);
        size_t kp = find(x, at, me, k);
        size_t vs = kp == SIZE_MAX ? SIZE_MAX : find(x, kp + strlen(k), me, fs);
        if (vs == SIZE_MAX) return kp_fail(err, KP_EUNSUPPORTED, "the template does not write parameter %s of %s", k, name);
        size_t ve = vs + strlen(fs);
        if (js && (val[0] == '{' || val[0] == '[')) { /* the whole JSON value around the sentinel */
            size_t o = vs;
            while (o > kp && x[o] != val[0]) o--;
            size_t e = 0;
            json_t *v = NULL;
            if (val[0] == '{' && kp_chat_json_extent(x, me, o, &e) == 2) v = json_loadb(x + o, e - o, 0, NULL);
            if (val[0] == '[') {
                const char *cl = memchr(x + ve, ']', me - ve);
                if (cl) e = (size_t)(cl - x) + 1, v = json_loadb(x + o, e - o, 0, NULL);
            }
            json_decref(v);
            if (!v) return kp_fail(err, KP_EUNSUPPORTED, "the template does not write parameter %s of %s as JSON", k, name);
            vs = o, ve = e;
        }
        size_t g = i == 0 ? (kp >= kpre && kp - kpre >= ms ? kp - kpre : SIZE_MAX) : prev_end;
        if (g == SIZE_MAX || g > vs) return kp_fail(err, KP_EUNSUPPORTED, "the template's parameter markup varies");
        if (i == 0 && !add_piece(a, KP_GPIECE_LIT, x + gs, g - gs, NULL, 0)) return kp_fail(err, KP_ENOMEM, "out of memory");
        bool required = false;
        for (size_t r = 0; r < json_array_size(req); r++)
            required = required || !strcmp(json_string_value(json_array_get(req, r)) ? json_string_value(json_array_get(req, r)) : "", k);
        uint32_t grp = required ? 0 : (uint32_t)i + 1;
        size_t post = ve + s->kpost <= me ? s->kpost : me - ve;
        char stop[2] = {'<', 0};
        for (size_t q = 0; q < post; q++)
            if (!is_ws(x[ve + q])) {
                stop[0] = x[ve + q];
                break;
            }
        /* TEXT: never the byte that starts the closing markup */
        char *sb = js ? NULL : strdup(stop);
        bool ok = (js || (sb && keep_text(f, sb))) && add_piece(a, KP_GPIECE_LIT, x + g, vs - g, NULL, grp) &&
                  (js ? add_piece(a, KP_GPIECE_JSON, NULL, 0, ps, grp) : add_piece(a, KP_GPIECE_TEXT, sb, 1, NULL, grp)) &&
                  add_piece(a, KP_GPIECE_LIT, x + ve, post, NULL, grp);
        if (!ok) return kp_fail(err, KP_ENOMEM, "out of memory");
        prev_end = ve + post;
        at = prev_end;
        i++;
    }
    size_t tail = np ? prev_end : gs;
    if (!add_piece(a, KP_GPIECE_LIT, x + tail, me - tail, NULL, 0)) return kp_fail(err, KP_ENOMEM, "out of memory");
    return KP_OK;
}

/* JSON and NAMED forms: the markup of calls of fn around the sentinel
 * arguments: n_calls 1 (alternative a: the whole message) or 2 (after the
 * first call of tools[0]: a more alternative, and the suffix). */
static kp_status force_json(const kp_toolsyn *s, const json_t *tools, const json_t *fn, const json_t *fschema,
                            const json_t *first_fn, bool second, const char *c0, size_t c0n, forced *f, kp_galt *a,
                            kp_error *err) {
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *calls = second ? json_pack("[o, o]", probe_call("kpid00001", json_string_value(json_object_get(first_fn, "name")),
                                                           "{\"kpzq\":\"kpsen1\"}"),
                                       probe_call("kpid00002", name, "{\"kpzq\":\"kpsen2\"}"))
                           : json_pack("[o]", probe_call("kpid00001", name, "{\"kpzq\":\"kpsen1\"}"));
    json_t *w1 = json_pack("{s:s}", "kpzq", "kpsen1"), *w2 = json_pack("{s:s}", "kpzq", "kpsen2");
    char *x = NULL;
    size_t xn = 0, ms, me, a1s, a1e, a2s = 0, a2e = 0;
    kp_status st = calls && w1 && w2 ? force_render(s, tools, calls, "", f, &x, &xn) : KP_ENOMEM;
    bool found = false;
    if (st == KP_OK) {
        markup(c0, c0n, x, xn, &ms, &me);
        found = find_json(x, ms, me, w1, &a1s, &a1e) && (!second || find_json(x, a1e, me, w2, &a2s, &a2e));
    }
    json_decref(w1), json_decref(w2);
    if (st != KP_OK) return kp_fail(err, st, "the template refuses a call of %s", name);
    if (!found) return kp_fail(err, KP_EUNSUPPORTED, "the template does not write the arguments of %s as JSON", name);
    bool ok;
    if (!second) {
        size_t gs = gen_start(f, x, ms);
        ok = add_piece(a, KP_GPIECE_LIT, x + gs, a1s - gs, NULL, 0) && add_piece(a, KP_GPIECE_JSON, NULL, 0, fschema, 0) &&
             add_piece(a, KP_GPIECE_LIT, x + a1e, me - a1e, NULL, 0);
    } else {
        ok = add_piece(a, KP_GPIECE_LIT, x + a1e, a2s - a1e, NULL, 0) && add_piece(a, KP_GPIECE_JSON, NULL, 0, fschema, 0);
        if (ok && !f->suffix) {
            f->suffix = malloc(me - a2e + 1);
            ok = f->suffix != NULL;
            if (ok) memcpy(f->suffix, x + a2e, me - a2e), f->suffix_len = me - a2e;
        }
    }
    return ok ? KP_OK : kp_fail(err, KP_ENOMEM, "out of memory");
}

/* Cuts the first of ends (NULL-terminated, may be NULL) that *len bytes
 * end with: the model ends there with its end-of-generation token. */
static void cut_end(const char *bytes, size_t *len, const char *const *ends) {
    for (size_t k = 0; ends && ends[k]; k++) {
        size_t el = strlen(ends[k]);
        if (el && *len >= el && !memcmp(bytes + *len - el, ends[k], el)) {
            *len -= el;
            return;
        }
    }
}

/* A message's last literal without an end text (cut_end). */
static void cut_alt_end(kp_galt *a, const char *const *ends) {
    kp_gpiece *last = a->n ? &a->pieces[a->n - 1] : NULL;
    if (!last || last->kind != KP_GPIECE_LIT || last->group) return;
    cut_end(last->bytes, &last->len, ends);
    if (last->len == 0 && a->n > 1) a->n--;
}

kp_status kp_toolsyn_force(const kp_toolsyn *s, const json_t *tools, const char *name, bool parallel,
                           const char *const *ends, kp_grammar **out, kp_error *err) {
    *out = NULL;
    if (!json_is_array(tools) || json_array_size(tools) == 0)
        return kp_fail(err, KP_EINVAL, "tools: forcing a call needs a non-empty tools array");
    parallel = parallel && s->sep.s && s->form != CALL_PARAMS;
    forced f = {0};
    char *c0 = NULL;
    size_t c0n = 0;
    prober p = {s->render, s->ctx, (json_t *)tools};
    char *gen = NULL;
    size_t gen_len = 0;
    f.trail = true;
    kp_status st = probe_render_trail(&p, "KPCONTENT", NULL, true, &c0, &c0n);
    if (st != KP_OK && st != KP_ENOMEM) { /* a tool result only after a call: the answer as the last message */
        free(c0);
        c0 = NULL;
        f.trail = false;
        st = probe_render_trail(&p, "KPCONTENT", NULL, false, &c0, &c0n);
    }
    if (st == KP_OK) st = probe_gen(&p, &gen, &gen_len);
    if (st != KP_OK) {
        free(c0);
        free(gen);
        return kp_fail(err, st == KP_ENOMEM ? KP_ENOMEM : KP_EUNSUPPORTED, "the template refuses these tools");
    }
    f.gen = gen;
    f.gen_len = gen_len;
    const json_t *first_fn = NULL;
    size_t matched = 0;
    for (size_t i = 0; st == KP_OK && i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *type = json_object_get(t, "type");
        const json_t *fn = json_object_get(t, "function"), *fname = json_object_get(fn, "name");
        if (!json_is_object(t) || !json_is_object(fn) || !json_is_string(fname) || json_string_length(fname) == 0 ||
            (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))) {
            st = kp_fail(err, KP_EINVAL, "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            break;
        }
        if (name && strcmp(json_string_value(fname), name) != 0) continue;
        const json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params)) {
            st = kp_fail(err, KP_EINVAL, "tools[%zu].function.parameters must be a JSON Schema object", i);
            break;
        }
        json_t *ps = params && !json_is_null(params) ? kp_chat_forced_schema(params) : json_pack("{s:s, s:{}}", "type", "object", "properties");
        if (ps && !json_object_get(ps, "type")) json_object_set_new(ps, "type", json_string("object"));
        if (ps && !json_object_get(ps, "additionalProperties")) json_object_set_new(ps, "additionalProperties", json_false());
        const json_t *fs = keep_schema(&f, ps);
        if (!fs) {
            st = kp_fail(err, KP_ENOMEM, "out of memory");
            break;
        }
        matched++;
        if (!first_fn) first_fn = fn;
        kp_galt a = {0};
        st = s->form == CALL_PARAMS ? force_params(s, tools, fn, fs, c0, c0n, &f, &a, err)
                                    : force_json(s, tools, fn, fs, NULL, false, c0, c0n, &f, &a, err);
        if (st == KP_OK && parallel && a.n >= 2) a.n--; /* the message's end comes after the last call */
        else if (st == KP_OK) cut_alt_end(&a, ends);
        if (st == KP_OK && !add_alt(&f.first, &f.n_first, a)) st = kp_fail(err, KP_ENOMEM, "out of memory");
        if (st != KP_OK) free(a.pieces);
        if (st == KP_OK && parallel) {
            kp_galt m = {0};
            st = force_json(s, tools, fn, fs, first_fn, true, c0, c0n, &f, &m, err);
            if (st == KP_OK && !add_alt(&f.more, &f.n_more, m)) st = kp_fail(err, KP_ENOMEM, "out of memory");
            if (st != KP_OK) free(m.pieces);
        }
    }
    if (st == KP_OK && !matched) st = kp_fail(err, KP_EINVAL, "tool_choice: no function named \"%.64s\" in tools", name);
    if (st == KP_OK && f.suffix) cut_end(f.suffix, &f.suffix_len, ends);
    if (st == KP_OK)
        st = kp_grammar_compile_alts(f.first, f.n_first, f.more, f.n_more, parallel ? 16 : 1, f.suffix, f.suffix_len,
                                     out, err);
    free(c0);
    free(gen);
    forced_free(&f);
    return st;
}
