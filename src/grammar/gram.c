/*
 * gram.c - the grammar builder, the analyses that make a grammar safe to
 * match (see gram_impl.h for the layout), code-point classes as UTF-8 byte
 * sequences, and the listing.
 *
 * Builder data: rules[] each with alts[] (kp_gseq of elements), sets[]
 * (deduplicated by content), reps[]. kp_builder_finish runs, in order:
 * undefined-rule check, reachability, productive rules (unproductive
 * alternatives are dropped), nullable rules, the repetition check, the
 * left-recursion check (a DFS over "rule r may start with rule s"), FIRST
 * and FOLLOW byte sets, shortest expansions; then flattens everything
 * into the kp_grammar arrays. Every fixpoint is monotone over finite
 * lattices, so it terminates.
 *
 * UTF-8 classes: a range of code points of one encoded length is split
 * until each piece is a "rectangle" (every byte position ranges over an
 * interval independently), the classic construction used by RE2 and Rust's
 * regex; each rectangle is one alternative of TERMs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/unicode.h"
#include "grammar/gram_impl.h"

/* ---- small helpers ---- */

void kp_builder_init(kp_builder *b) { memset(b, 0, sizeof *b); }

void kp_gseq_free(kp_gseq *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

void kp_builder_free(kp_builder *b) {
    for (uint32_t r = 0; r < b->n_rules; r++) {
        for (uint32_t a = 0; a < b->rules[r].n_alts; a++) kp_gseq_free(&b->rules[r].alts[a]);
        free(b->rules[r].alts);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->sets);
    free(b->reps);
    memset(b, 0, sizeof *b);
}

static uint32_t add_rule(kp_builder *b, char *name, bool defined) {
    if (!name || !kp_grow_u32((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules) ||
        b->n_rules >= KP_GE_ARG(~0u)) {
        free(name);
        b->oom = true;
        return UINT32_MAX;
    }
    kp_draft_rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->defined = defined;
    return b->n_rules++;
}

uint32_t kp_builder_rule(kp_builder *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return add_rule(b, strdup(tmp), true);
}

uint32_t kp_builder_named(kp_builder *b, const char *name, size_t len) {
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (strlen(b->rules[r].name) == len && memcmp(b->rules[r].name, name, len) == 0) return r;
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, name, len);
        s[len] = 0;
    }
    return add_rule(b, s, false);
}

bool kp_gseq_push(kp_builder *b, kp_gseq *s, uint32_t elem) {
    if (b->oom || b->too_big) return false;
    if (b->n_elems >= KP_GRAMMAR_MAX_ELEMS) {
        b->too_big = true;
        return false;
    }
    if (elem == UINT32_MAX || !kp_grow_u32((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) {
        b->oom = true;
        return false;
    }
    s->v[s->n++] = elem;
    b->n_elems++;
    return true;
}

bool kp_gseq_lit(kp_builder *b, kp_gseq *s, const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    for (size_t i = 0; i < n; i++)
        if (!kp_gseq_push(b, s, kp_builder_byte(b, p[i]))) return false;
    return true;
}

bool kp_gseq_str(kp_builder *b, kp_gseq *s, const char *str) { return kp_gseq_lit(b, s, str, strlen(str)); }

bool kp_gseq_cpt(kp_builder *b, kp_gseq *s, uint32_t c) {
    uint8_t u[4];
    size_t n = kp_unicode_encode(c, u);
    return n > 0 && kp_gseq_lit(b, s, u, n);
}

bool kp_builder_alt(kp_builder *b, uint32_t rule, kp_gseq *seq) {
    if (b->oom || b->too_big || rule >= b->n_rules) {
        kp_gseq_free(seq);
        return false;
    }
    kp_draft_rule *r = &b->rules[rule];
    if (!kp_grow_u32((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts)) {
        kp_gseq_free(seq);
        b->oom = true;
        return false;
    }
    r->alts[r->n_alts++] = *seq;
    memset(seq, 0, sizeof *seq);
    return true;
}

bool kp_builder_alt1(kp_builder *b, uint32_t rule, uint32_t elem) {
    kp_gseq s = {0};
    return kp_gseq_push(b, &s, elem) && kp_builder_alt(b, rule, &s);
}

bool kp_builder_alt_str(kp_builder *b, uint32_t rule, const char *str) {
    kp_gseq s = {0};
    if (!kp_gseq_str(b, &s, str)) {
        kp_gseq_free(&s);
        return false;
    }
    return kp_builder_alt(b, rule, &s);
}

uint32_t kp_builder_term(kp_builder *b, const kp_gset *s) {
    for (uint32_t i = 0; i < b->n_sets; i++)
        if (memcmp(&b->sets[i], s, sizeof *s) == 0) return KP_GE(KP_GE_TERM, i);
    if (!kp_grow_u32((void **)&b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets)) {
        b->oom = true;
        return UINT32_MAX;
    }
    b->sets[b->n_sets] = *s;
    return KP_GE(KP_GE_TERM, b->n_sets++);
}

uint32_t kp_builder_bytes(kp_builder *b, unsigned lo, unsigned hi) {
    kp_gset s = {{0}};
    if (lo <= hi && hi <= 255) kp_gset_add_range(&s, lo, hi);
    return kp_builder_term(b, &s);
}

uint32_t kp_builder_byte(kp_builder *b, uint8_t byte) { return kp_builder_bytes(b, byte, byte); }

uint32_t kp_builder_rep(kp_builder *b, uint32_t rule, uint32_t min, uint32_t max) {
    if (rule == UINT32_MAX) return UINT32_MAX;
    if (min > KP_GRAMMAR_MAX_REPEAT || (max != KP_GREP_INF && (max > KP_GRAMMAR_MAX_REPEAT || max < min))) {
        b->too_big = true;
        return UINT32_MAX;
    }
    if (!kp_grow_u32((void **)&b->reps, &b->cap_reps, b->n_reps + 1, sizeof *b->reps)) {
        b->oom = true;
        return UINT32_MAX;
    }
    b->reps[b->n_reps] = (kp_grep){rule, (uint16_t)min, (uint16_t)max};
    return KP_GE(KP_GE_REP, b->n_reps++);
}

uint32_t kp_builder_as_rule(kp_builder *b, uint32_t elem) {
    if (elem == UINT32_MAX) return UINT32_MAX;
    if (KP_GE_TYPE(elem) == KP_GE_REF) return KP_GE_ARG(elem);
    uint32_t r = kp_builder_rule(b, "%s", "(item)");
    if (r == UINT32_MAX || !kp_builder_alt1(b, r, elem)) return UINT32_MAX;
    return r;
}

/* ---- code-point classes ---- */

static int cmp_range(const void *a, const void *b) {
    const kp_gcrange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

/* The class as sorted, disjoint ranges without surrogates in *out (malloc'd,
 * count in *n_out). */
static bool normalize(const kp_gcrange *r, size_t n, bool negate, kp_gcrange **out, size_t *n_out) {
    kp_gcrange *v = malloc((n + 2) * 2 * sizeof *v);
    if (!v) return false;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].lo > r[i].hi || r[i].lo > 0x10FFFF) continue;
        v[k].lo = r[i].lo;
        v[k].hi = r[i].hi > 0x10FFFF ? 0x10FFFF : r[i].hi;
        k++;
    }
    qsort(v, k, sizeof *v, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m && v[i].lo <= v[m - 1].hi + 1) {
            if (v[i].hi > v[m - 1].hi) v[m - 1].hi = v[i].hi;
        } else {
            v[m++] = v[i];
        }
    }
    if (negate) {
        kp_gcrange *w = malloc((m + 1) * sizeof *w);
        if (!w) {
            free(v);
            return false;
        }
        size_t j = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < m; i++) {
            if (v[i].lo > next) w[j++] = (kp_gcrange){next, v[i].lo - 1};
            next = v[i].hi + 1;
        }
        if (next <= 0x10FFFF) w[j++] = (kp_gcrange){next, 0x10FFFF};
        memcpy(v, w, j * sizeof *w);
        free(w);
        m = j;
    }
    /* cut out the surrogates: at most one range grows into two */
    size_t j = 0;
    kp_gcrange *w = malloc((m + 1) * sizeof *w);
    if (!w) {
        free(v);
        return false;
    }
    for (size_t i = 0; i < m; i++) {
        uint32_t lo = v[i].lo, hi = v[i].hi;
        if (hi < 0xD800 || lo > 0xDFFF) {
            w[j++] = v[i];
            continue;
        }
        if (lo < 0xD800) w[j++] = (kp_gcrange){lo, 0xD7FF};
        if (hi > 0xDFFF) w[j++] = (kp_gcrange){0xE000, hi};
    }
    free(v);
    *out = w;
    *n_out = j;
    return true;
}

/* One alternative per UTF-8 rectangle of the multi-byte range [lo, hi]. */
static bool split_utf8(kp_builder *b, uint32_t rule, uint32_t lo, uint32_t hi) {
    uint32_t st[64][2];
    int sp = 0;
    st[sp][0] = lo;
    st[sp][1] = hi;
    sp++;
    while (sp > 0) {
        sp--;
        uint32_t s = st[sp][0], e = st[sp][1];
        if (s > e) continue;
        static const uint32_t lim[3] = {0x7F, 0x7FF, 0xFFFF};
        bool split = false;
        for (int i = 0; i < 3 && !split; i++) {
            if (s <= lim[i] && e > lim[i]) {
                st[sp][0] = lim[i] + 1;
                st[sp][1] = e;
                st[sp + 1][0] = s;
                st[sp + 1][1] = lim[i];
                sp += 2;
                split = true;
            }
        }
        if (split) continue;
        uint8_t a[4], z[4];
        size_t n = kp_unicode_encode(s, a);
        kp_unicode_encode(e, z);
        for (size_t i = 1; i < n && !split; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((s & ~m) != (e & ~m)) {
                if ((s & m) != 0) {
                    st[sp][0] = (s | m) + 1;
                    st[sp][1] = e;
                    st[sp + 1][0] = s;
                    st[sp + 1][1] = s | m;
                    sp += 2;
                    split = true;
                } else if ((e & m) != m) {
                    st[sp][0] = e & ~m;
                    st[sp][1] = e;
                    st[sp + 1][0] = s;
                    st[sp + 1][1] = (e & ~m) - 1;
                    sp += 2;
                    split = true;
                }
            }
        }
        if (split) continue;
        kp_gseq q = {0};
        for (size_t i = 0; i < n; i++)
            if (!kp_gseq_push(b, &q, kp_builder_bytes(b, a[i], z[i]))) {
                kp_gseq_free(&q);
                return false;
            }
        if (!kp_builder_alt(b, rule, &q)) return false;
    }
    return true;
}

/* Alternatives of the normalized ranges: all ASCII members as one TERM
 * alternative, then the UTF-8 rectangles. */
static bool class_alts(kp_builder *b, uint32_t rule, const kp_gcrange *v, size_t m) {
    kp_gset ascii = {{0}};
    bool any_ascii = false;
    for (size_t i = 0; i < m; i++)
        if (v[i].lo < 0x80) {
            kp_gset_add_range(&ascii, v[i].lo, v[i].hi < 0x80 ? v[i].hi : 0x7F);
            any_ascii = true;
        }
    if (any_ascii && !kp_builder_alt1(b, rule, kp_builder_term(b, &ascii))) return false;
    for (size_t i = 0; i < m; i++) {
        uint32_t lo = v[i].lo < 0x80 ? 0x80 : v[i].lo;
        if (v[i].hi >= 0x80 && !split_utf8(b, rule, lo, v[i].hi)) return false;
    }
    return true;
}

bool kp_builder_class_into(kp_builder *b, uint32_t rule, const kp_gcrange *r, size_t n, bool negate) {
    kp_gcrange *v;
    size_t m;
    if (!normalize(r, n, negate, &v, &m)) {
        b->oom = true;
        return false;
    }
    bool ok = class_alts(b, rule, v, m);
    free(v);
    return ok;
}

bool kp_builder_class(kp_builder *b, const kp_gcrange *r, size_t n, bool negate, uint32_t *elem) {
    kp_gcrange *v;
    size_t m;
    if (!normalize(r, n, negate, &v, &m)) {
        b->oom = true;
        return false;
    }
    bool ok;
    if (m == 0 || v[m - 1].hi < 0x80) {
        kp_gset s = {{0}};
        for (size_t i = 0; i < m; i++) kp_gset_add_range(&s, v[i].lo, v[i].hi);
        *elem = kp_builder_term(b, &s);
        ok = *elem != UINT32_MAX;
    } else {
        uint32_t rule = kp_builder_rule(b, "%s", "[class]");
        ok = rule != UINT32_MAX && class_alts(b, rule, v, m);
        *elem = KP_GE(KP_GE_REF, rule);
    }
    free(v);
    return ok;
}

/* ---- analyses ---- */

static bool set_empty(const kp_gset *s) { return !(s->w[0] | s->w[1] | s->w[2] | s->w[3]); }

static bool set_or(kp_gset *d, const kp_gset *s) {
    bool ch = false;
    for (int i = 0; i < 4; i++) {
        uint64_t n = d->w[i] | s->w[i];
        ch |= n != d->w[i];
        d->w[i] = n;
    }
    return ch;
}

typedef struct {
    kp_builder *b;
    uint8_t *prod, *null, *reach;
    kp_gset *first, *follow;
} an;

static uint32_t elem_rule(const kp_builder *b, uint32_t e) {
    uint32_t t = KP_GE_TYPE(e);
    if (t == KP_GE_REF) return KP_GE_ARG(e);
    if (t == KP_GE_REP) return b->reps[KP_GE_ARG(e)].rule;
    return UINT32_MAX;
}

static bool elem_prod(const an *a, uint32_t e) {
    switch (KP_GE_TYPE(e)) {
    case KP_GE_TERM: return !set_empty(&a->b->sets[KP_GE_ARG(e)]);
    case KP_GE_REF: return a->prod[KP_GE_ARG(e)];
    case KP_GE_REP: {
        const kp_grep *r = &a->b->reps[KP_GE_ARG(e)];
        return r->min == 0 || a->prod[r->rule];
    }
    }
    return false;
}

static bool elem_null(const an *a, uint32_t e) {
    switch (KP_GE_TYPE(e)) {
    case KP_GE_REF: return a->null[KP_GE_ARG(e)];
    case KP_GE_REP: {
        const kp_grep *r = &a->b->reps[KP_GE_ARG(e)];
        return r->min == 0 || a->null[r->rule];
    }
    }
    return false;
}

static const kp_gset *elem_first(const an *a, uint32_t e) {
    if (KP_GE_TYPE(e) == KP_GE_TERM) return &a->b->sets[KP_GE_ARG(e)];
    return &a->first[elem_rule(a->b, e)];
}

static void fixpoint_prod(an *a) {
    kp_builder *b = a->b;
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < b->n_rules; r++) {
            if (a->prod[r]) continue;
            for (uint32_t i = 0; i < b->rules[r].n_alts && !a->prod[r]; i++) {
                const kp_gseq *s = &b->rules[r].alts[i];
                bool ok = true;
                for (uint32_t j = 0; j < s->n && ok; j++) ok = elem_prod(a, s->v[j]);
                if (ok) a->prod[r] = ch = true;
            }
        }
    }
}

static void drop_unproductive(an *a) {
    kp_builder *b = a->b;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        kp_draft_rule *R = &b->rules[r];
        uint32_t k = 0;
        for (uint32_t i = 0; i < R->n_alts; i++) {
            bool ok = true;
            for (uint32_t j = 0; j < R->alts[i].n && ok; j++) ok = elem_prod(a, R->alts[i].v[j]);
            if (ok)
                R->alts[k++] = R->alts[i];
            else
                kp_gseq_free(&R->alts[i]);
        }
        R->n_alts = k;
    }
}

static void fixpoint_null(an *a) {
    kp_builder *b = a->b;
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < b->n_rules; r++) {
            if (a->null[r]) continue;
            for (uint32_t i = 0; i < b->rules[r].n_alts && !a->null[r]; i++) {
                const kp_gseq *s = &b->rules[r].alts[i];
                bool ok = true;
                for (uint32_t j = 0; j < s->n && ok; j++) ok = elem_null(a, s->v[j]);
                if (ok) a->null[r] = ch = true;
            }
        }
    }
}

static void fixpoint_first(an *a) {
    kp_builder *b = a->b;
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < b->n_rules; r++)
            for (uint32_t i = 0; i < b->rules[r].n_alts; i++) {
                const kp_gseq *s = &b->rules[r].alts[i];
                for (uint32_t j = 0; j < s->n; j++) {
                    ch |= set_or(&a->first[r], elem_first(a, s->v[j]));
                    if (!elem_null(a, s->v[j])) break;
                }
            }
    }
}

static void fixpoint_follow(an *a) {
    kp_builder *b = a->b;
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < b->n_rules; r++)
            for (uint32_t i = 0; i < b->rules[r].n_alts; i++) {
                const kp_gseq *s = &b->rules[r].alts[i];
                for (uint32_t j = 0; j < s->n; j++) {
                    uint32_t x = elem_rule(b, s->v[j]);
                    if (x == UINT32_MAX) continue;
                    if (KP_GE_TYPE(s->v[j]) == KP_GE_REP && b->reps[KP_GE_ARG(s->v[j])].max > 1)
                        ch |= set_or(&a->follow[x], &a->first[x]);
                    bool rest_null = true;
                    for (uint32_t k = j + 1; k < s->n && rest_null; k++) {
                        ch |= set_or(&a->follow[x], elem_first(a, s->v[k]));
                        rest_null = elem_null(a, s->v[k]);
                    }
                    if (rest_null) ch |= set_or(&a->follow[x], &a->follow[r]);
                }
            }
    }
}

static void mark_reach(an *a, uint32_t root, uint32_t *stack) {
    kp_builder *b = a->b;
    uint32_t sp = 0;
    a->reach[root] = 1;
    stack[sp++] = root;
    while (sp) {
        uint32_t r = stack[--sp];
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++) {
            const kp_gseq *s = &b->rules[r].alts[i];
            for (uint32_t j = 0; j < s->n; j++) {
                uint32_t x = elem_rule(b, s->v[j]);
                if (x != UINT32_MAX && !a->reach[x]) {
                    a->reach[x] = 1;
                    stack[sp++] = x;
                }
            }
        }
    }
}

/* "rule r may begin with rule x": the elements of an alternative up to and
 * including the first one that is not nullable. A circle in this graph is
 * left recursion. Iterative DFS; on a circle writes "a -> b -> a" into msg. */
static bool find_left_cycle(an *a, uint32_t *stack, uint32_t *iter, uint8_t *color, char *msg, size_t cap) {
    kp_builder *b = a->b;
    for (uint32_t s0 = 0; s0 < b->n_rules; s0++) {
        if (!a->reach[s0] || color[s0]) continue;
        uint32_t sp = 0;
        stack[sp] = s0;
        iter[2 * sp] = iter[2 * sp + 1] = 0;
        sp++;
        color[s0] = 1;
        while (sp) {
            uint32_t r = stack[sp - 1];
            /* iter[2i], iter[2i+1]: (alternative, element) cursor over r's left corners */
            uint32_t ai = iter[2 * (sp - 1)], ej = iter[2 * (sp - 1) + 1];
            uint32_t next = UINT32_MAX;
            while (ai < b->rules[r].n_alts) {
                const kp_gseq *s = &b->rules[r].alts[ai];
                if (ej < s->n) {
                    uint32_t e = s->v[ej];
                    bool stop = !elem_null(a, e);
                    uint32_t x = elem_rule(b, e);
                    if (stop) {
                        ai++;
                        ej = 0;
                    } else {
                        ej++;
                    }
                    if (x != UINT32_MAX) {
                        next = x;
                        break;
                    }
                } else {
                    ai++;
                    ej = 0;
                }
            }
            iter[2 * (sp - 1)] = ai;
            iter[2 * (sp - 1) + 1] = ej;
            if (next == UINT32_MAX) {
                color[r] = 2;
                sp--;
                continue;
            }
            if (color[next] == 1) {
                size_t k = 0;
                uint32_t from = 0;
                while (stack[from] != next) from++;
                for (uint32_t i = from; i < sp && k + 8 < cap; i++)
                    k += (size_t)snprintf(msg + k, cap - k, "'%s' -> ", b->rules[stack[i]].name);
                if (k < cap) snprintf(msg + k, cap - k, "'%s'", b->rules[next].name);
                return true;
            }
            if (color[next] == 0) {
                color[next] = 1;
                stack[sp] = next;
                iter[2 * sp] = iter[2 * sp + 1] = 0;
                sp++;
            }
        }
    }
    return false;
}

#define LEN_INF 0x7FFFFFFFu

static uint32_t sat_add(uint32_t x, uint32_t y) { return x >= LEN_INF - y ? LEN_INF : x + y; }
static uint32_t sat_mul(uint32_t x, uint32_t y) {
    if (x == 0 || y == 0) return 0;
    return x > LEN_INF / y ? LEN_INF : x * y;
}

/* ---- finish: check, analyse, flatten ---- */

/* The builder's own verdicts, before any analysis: too big, out of
 * memory, no start rule, a rule referred to but never defined. */
static kp_status check_built(const kp_builder *b, uint32_t root, kp_error *err) {
    if (b->too_big)
        return kp_fail(err, KP_ERANGE, "grammar: more than %u elements or a repetition count above %u",
                       KP_GRAMMAR_MAX_ELEMS, KP_GRAMMAR_MAX_REPEAT);
    if (b->oom) return kp_fail(err, KP_ENOMEM, "grammar: out of memory");
    if (root >= b->n_rules) return kp_fail(err, KP_EINVAL, "grammar: no start rule");
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (!b->rules[r].defined) return kp_fail(err, KP_EINVAL, "grammar: undefined rule '%s'", b->rules[r].name);
    return KP_OK;
}

static void an_free(an *a) {
    free(a->prod);
    free(a->null);
    free(a->reach);
    free(a->first);
    free(a->follow);
}

/* The analyses of a->b from root (productive, reachable, nullable, first,
 * follow sets; a's arrays allocated here, an_free releases them) and the
 * checks that make the grammar safe to run: root finishes, no repeated
 * rule matches the empty string, no left recursion. */
static kp_status analyse(an *a, uint32_t root, kp_error *err) {
    const kp_builder *b = a->b;
    uint32_t n = b->n_rules;
    kp_status st = KP_OK;
    a->prod = calloc(n, 1);
    a->null = calloc(n, 1);
    a->reach = calloc(n, 1);
    a->first = calloc(n, sizeof *a->first);
    a->follow = calloc(n, sizeof *a->follow);
    uint32_t *stack = malloc((size_t)n * sizeof *stack), *iter = malloc((size_t)n * 2 * sizeof *iter);
    uint8_t *color = calloc(n, 1);
    char cyc[256];
    if (!a->prod || !a->null || !a->reach || !a->first || !a->follow || !stack || !iter || !color) {
        st = kp_fail(err, KP_ENOMEM, "grammar: out of memory");
        goto done;
    }
    fixpoint_prod(a);
    if (!a->prod[root]) {
        st = kp_fail(err, KP_EINVAL, "grammar: rule '%s' can never finish (no finite document)", b->rules[root].name);
        goto done;
    }
    drop_unproductive(a);
    mark_reach(a, root, stack);
    fixpoint_null(a);
    for (uint32_t k = 0; k < b->n_reps; k++) {
        const kp_grep *rp = &b->reps[k];
        if (rp->max > 1 && a->reach[rp->rule] && a->null[rp->rule]) {
            st = kp_fail(err, KP_EUNSUPPORTED, "grammar: rule '%s' is repeated but can match the empty string",
                         b->rules[rp->rule].name);
            goto done;
        }
    }
    if (find_left_cycle(a, stack, iter, color, cyc, sizeof cyc)) {
        st = kp_fail(err, KP_EUNSUPPORTED, "grammar: left recursion (a rule reaches itself without reading a byte): %s",
                     cyc);
        goto done;
    }
    fixpoint_first(a);
    fixpoint_follow(a);
done:
    free(stack);
    free(iter);
    free(color);
    return st;
}

/* The grammar's flat arrays from the builder's rules (their names taken
 * over) and the analyses (nullable and follow taken over from a): every
 * alternative's elements in a row, each ended by END, element 0 the start
 * (a reference to root, then END). NULL when out of memory. */
static kp_grammar *flatten(kp_builder *b, an *a, uint32_t root) {
    uint32_t n = b->n_rules;
    kp_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    atomic_init(&g->refs, 1);
    g->n_rules = n;
    g->root = root;
    uint32_t n_alts = 0, n_elems = 2;
    for (uint32_t r = 0; r < n; r++) {
        n_alts += b->rules[r].n_alts;
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++) n_elems += b->rules[r].alts[i].n + 1;
    }
    g->n_elems = n_elems;
    g->n_alts = n_alts;
    g->elems = malloc((size_t)n_elems * sizeof *g->elems);
    g->elem_rule = malloc((size_t)n_elems * sizeof *g->elem_rule);
    g->rule_alt = malloc(((size_t)n + 1) * sizeof *g->rule_alt);
    g->alt_pos = malloc(((size_t)n_alts + 1) * sizeof *g->alt_pos);
    g->sets = malloc(((size_t)b->n_sets + 1) * sizeof *g->sets);
    g->reps = malloc(((size_t)b->n_reps + 1) * sizeof *g->reps);
    g->names = calloc(n, sizeof *g->names);
    g->nullable = a->null;
    g->follow = a->follow;
    a->null = NULL;
    a->follow = NULL;
    g->min_len = malloc((size_t)n * sizeof *g->min_len);
    g->best_alt = malloc((size_t)n * sizeof *g->best_alt);
    if (!g->elems || !g->elem_rule || !g->rule_alt || !g->alt_pos || !g->sets || !g->reps || !g->names ||
        !g->min_len || !g->best_alt) {
        kp_grammar_free(g);
        return NULL;
    }
    if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
    g->n_sets = b->n_sets;
    if (b->n_reps) memcpy(g->reps, b->reps, (size_t)b->n_reps * sizeof *g->reps);
    g->n_reps = b->n_reps;
    g->elems[0] = KP_GE(KP_GE_REF, root);
    g->elems[1] = KP_GE(KP_GE_END, 0);
    g->elem_rule[0] = g->elem_rule[1] = root;
    uint32_t p = 2, ai = 0;
    for (uint32_t r = 0; r < n; r++) {
        g->rule_alt[r] = ai;
        g->names[r] = b->rules[r].name;
        b->rules[r].name = NULL;
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++) {
            const kp_gseq *sq = &b->rules[r].alts[i];
            g->alt_pos[ai++] = p;
            for (uint32_t j = 0; j < sq->n; j++) {
                g->elem_rule[p] = r;
                g->elems[p++] = sq->v[j];
            }
            g->elem_rule[p] = r;
            g->elems[p++] = KP_GE(KP_GE_END, 0);
        }
    }
    g->rule_alt[n] = ai;
    return g;
}

/* The length of an alternative's shortest expansion, given each rule's so far. */
static uint32_t alt_min_len(const kp_grammar *g, uint32_t k) {
    uint32_t len = 0;
    for (uint32_t q = g->alt_pos[k]; KP_GE_TYPE(g->elems[q]) != KP_GE_END && len < LEN_INF; q++) {
        uint32_t e = g->elems[q];
        if (KP_GE_TYPE(e) == KP_GE_TERM) {
            len = sat_add(len, 1);
        } else if (KP_GE_TYPE(e) == KP_GE_REF) {
            len = sat_add(len, g->min_len[KP_GE_ARG(e)]);
        } else {
            const kp_grep *rp = &g->reps[KP_GE_ARG(e)];
            len = sat_add(len, sat_mul(rp->min, rp->min ? g->min_len[rp->rule] : 0));
        }
    }
    return len;
}

/* Shortest expansions: relax until stable; a rule's best alternative is
 * only replaced by a strictly shorter one, so following best_alt always
 * terminates (each choice was made after those it depends on). */
static void shortest_expansions(kp_grammar *g) {
    for (uint32_t r = 0; r < g->n_rules; r++) {
        g->min_len[r] = LEN_INF;
        g->best_alt[r] = UINT32_MAX;
    }
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < g->n_rules; r++)
            for (uint32_t k = g->rule_alt[r]; k < g->rule_alt[r + 1]; k++) {
                uint32_t len = alt_min_len(g, k);
                if (len < g->min_len[r]) {
                    g->min_len[r] = len;
                    g->best_alt[r] = k;
                    ch = true;
                }
            }
    }
}

kp_status kp_builder_finish(kp_builder *b, uint32_t root, kp_grammar **out, kp_error *err) {
    *out = NULL;
    an a = {.b = b};
    kp_status st = check_built(b, root, err);
    if (st == KP_OK) st = analyse(&a, root, err);
    if (st == KP_OK) {
        kp_grammar *g = flatten(b, &a, root);
        if (g) {
            shortest_expansions(g);
            *out = g;
        } else {
            st = kp_fail(err, KP_ENOMEM, "grammar: out of memory");
        }
    }
    an_free(&a);
    kp_builder_free(b);
    return st;
}

kp_grammar *kp_grammar_ref(kp_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void kp_grammar_free(kp_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    if (g->names)
        for (uint32_t r = 0; r < g->n_rules; r++) free(g->names[r]);
    free(g->names);
    free(g->elems);
    free(g->elem_rule);
    free(g->rule_alt);
    free(g->alt_pos);
    free(g->sets);
    free(g->reps);
    free(g->follow);
    free(g->nullable);
    free(g->min_len);
    free(g->best_alt);
    free(g);
}

size_t kp_grammar_n_rules(const kp_grammar *g) { return g ? g->n_rules : 0; }
size_t kp_grammar_n_elems(const kp_grammar *g) { return g ? g->n_elems : 0; }

/* ---- listing ---- */

static void put_byte(kp_buf *o, unsigned c, bool in_class) {
    if (c == '\\' || c == '"' || (in_class && (c == ']' || c == '-' || c == '^')))
        kp_buf_printf(o, "\\%c", c);
    else if (c == '\n')
        kp_buf_puts(o, "\\n");
    else if (c == '\t')
        kp_buf_puts(o, "\\t");
    else if (c == '\r')
        kp_buf_puts(o, "\\r");
    else if (c < 0x20 || c >= 0x7F)
        kp_buf_printf(o, "\\x%02X", c);
    else
        kp_buf_putc(o, (char)c);
}

static int singleton(const kp_gset *s) {
    int only = -1;
    for (int c = 0; c < 256; c++)
        if (kp_gset_has(s, (uint8_t)c)) {
            if (only >= 0) return -1;
            only = c;
        }
    return only;
}

bool kp_grammar_dump(const kp_grammar *g, kp_buf *o) {
    for (uint32_t r = 0; r < g->n_rules; r++) {
        kp_buf_printf(o, "%s ::=", g->names[r]);
        for (uint32_t k = g->rule_alt[r]; k < g->rule_alt[r + 1]; k++) {
            if (k > g->rule_alt[r]) kp_buf_puts(o, " |");
            bool in_lit = false;
            for (uint32_t q = g->alt_pos[k]; KP_GE_TYPE(g->elems[q]) != KP_GE_END; q++) {
                uint32_t e = g->elems[q];
                int one = KP_GE_TYPE(e) == KP_GE_TERM ? singleton(&g->sets[KP_GE_ARG(e)]) : -1;
                if (in_lit && one < 0) {
                    kp_buf_putc(o, '"');
                    in_lit = false;
                }
                if (one >= 0) {
                    if (!in_lit) kp_buf_puts(o, " \"");
                    in_lit = true;
                    put_byte(o, (unsigned)one, false);
                    continue;
                }
                if (KP_GE_TYPE(e) == KP_GE_TERM) {
                    const kp_gset *s = &g->sets[KP_GE_ARG(e)];
                    kp_buf_puts(o, " [");
                    for (int c = 0; c < 256; c++) {
                        if (!kp_gset_has(s, (uint8_t)c)) continue;
                        int d = c;
                        while (d < 255 && kp_gset_has(s, (uint8_t)(d + 1))) d++;
                        put_byte(o, (unsigned)c, true);
                        if (d > c) {
                            kp_buf_putc(o, '-');
                            put_byte(o, (unsigned)d, true);
                        }
                        c = d;
                    }
                    kp_buf_putc(o, ']');
                } else if (KP_GE_TYPE(e) == KP_GE_REF) {
                    kp_buf_printf(o, " %s", g->names[KP_GE_ARG(e)]);
                } else {
                    const kp_grep *rp = &g->reps[KP_GE_ARG(e)];
                    kp_buf_printf(o, " %s", g->names[rp->rule]);
                    if (rp->max == KP_GREP_INF)
                        kp_buf_printf(o, rp->min == 0 ? "*" : rp->min == 1 ? "+" : "{%u,}", rp->min);
                    else if (rp->min == 0 && rp->max == 1)
                        kp_buf_putc(o, '?');
                    else
                        kp_buf_printf(o, "{%u,%u}", rp->min, rp->max);
                }
            }
            if (in_lit) kp_buf_putc(o, '"');
        }
        kp_buf_putc(o, '\n');
    }
    return !o->oom;
}
