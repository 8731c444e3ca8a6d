/*
 * gram.c - the grammar builder (see gram_impl.h for the layout),
 * code-point classes as UTF-8 byte sequences, reference counting and the
 * listing. The checks and analyses that turn a builder into a kp_grammar
 * are in ganalyse.c, the left factoring in gfactor.c.
 *
 * Builder data: rules[] each with alts[] (kp_gseq of elements), sets[] and
 * reps[] (both shared by content), and three hash indexes (rules by name,
 * sets, reps), so that building costs O(1) per element whatever the
 * grammar's size: a GBNF text of 50,000 rules must not cost 50,000 scans
 * of the rule list.
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
    free(b->by_name.slot);
    free(b->by_set.slot);
    free(b->by_rep.slot);
    memset(b, 0, sizeof *b);
}

bool kp_builder_tick(kp_builder *b) {
    if (b->stopped) return true;
    if (++b->ticks % KP_BUILDER_POLL == 0 && b->stop && b->stop->fn && b->stop->fn(b->stop->arg)) b->stopped = true;
    return b->stopped;
}

kp_status kp_builder_failure(const kp_builder *b, const char *who, kp_error *err) {
    if (b->stopped) return kp_fail(err, KP_EIO, "%s: compile stopped (the client left or the server is stopping)", who);
    if (b->too_big)
        return kp_fail(err, KP_ERANGE, "%s: the grammar exceeds %u elements (KP_GRAMMAR_MAX_ELEMS) or a repetition "
                       "count of %u (KP_GRAMMAR_MAX_REPEAT)", who, KP_GRAMMAR_MAX_ELEMS, KP_GRAMMAR_MAX_REPEAT);
    return kp_fail(err, KP_ENOMEM, "%s: out of memory", who);
}

/* ---- the builder's indexes: FNV-1a over the key, linear probing ---- */

static uint32_t hash_bytes(const void *p, size_t n) {
    const uint8_t *q = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ q[i]) * 16777619u;
    return h ^ (h >> 15);
}

/* The key bytes of entry i of an index. */
typedef struct {
    const void *p;
    size_t n;
} gkey;

static gkey key_name(const kp_builder *b, uint32_t i) { return (gkey){b->rules[i].name, strlen(b->rules[i].name)}; }
static gkey key_set(const kp_builder *b, uint32_t i) { return (gkey){&b->sets[i], sizeof b->sets[i]}; }
static gkey key_rep(const kp_builder *b, uint32_t i) { return (gkey){&b->reps[i], sizeof b->reps[i]}; }

/* The entry of ix whose key is k, or UINT32_MAX. */
static uint32_t index_find(const kp_builder *b, const kp_gindex *ix, gkey (*key)(const kp_builder *, uint32_t),
                           gkey k) {
    if (!ix->slot) return UINT32_MAX;
    for (uint32_t h = hash_bytes(k.p, k.n) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t v = ix->slot[h];
        if (!v) return UINT32_MAX;
        gkey e = key(b, v - 1);
        if (e.n == k.n && memcmp(e.p, k.p, k.n) == 0) return v - 1;
    }
}

/* Adds entry i (its key not yet in ix); false when out of memory. */
static bool index_add(kp_builder *b, kp_gindex *ix, gkey (*key)(const kp_builder *, uint32_t), uint32_t i) {
    if ((ix->n + 1) * 2 > (ix->slot ? ix->mask + 1 : 0)) {
        uint32_t cap = ix->slot ? (ix->mask + 1) * 2 : 64;
        uint32_t *slot = calloc(cap, sizeof *slot);
        if (!slot) return false;
        for (uint32_t j = 0; ix->slot && j <= ix->mask; j++) {
            uint32_t v = ix->slot[j];
            if (!v) continue;
            gkey e = key(b, v - 1);
            uint32_t h = hash_bytes(e.p, e.n) & (cap - 1);
            while (slot[h]) h = (h + 1) & (cap - 1);
            slot[h] = v;
        }
        free(ix->slot);
        ix->slot = slot;
        ix->mask = cap - 1;
    }
    gkey e = key(b, i);
    uint32_t h = hash_bytes(e.p, e.n) & ix->mask;
    while (ix->slot[h]) h = (h + 1) & ix->mask;
    ix->slot[h] = i + 1;
    ix->n++;
    return true;
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
    uint32_t i = b->n_rules++;
    if (index_find(b, &b->by_name, key_name, key_name(b, i)) == UINT32_MAX && !index_add(b, &b->by_name, key_name, i)) {
        b->oom = true;
        return UINT32_MAX;
    }
    kp_builder_tick(b);
    return i;
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
    uint32_t r = index_find(b, &b->by_name, key_name, (gkey){name, len});
    if (r != UINT32_MAX) return r;
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, name, len);
        s[len] = 0;
    }
    return add_rule(b, s, false);
}

bool kp_gseq_push(kp_builder *b, kp_gseq *s, uint32_t elem) {
    if (b->oom || b->too_big || kp_builder_tick(b)) return false;
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
    uint32_t i = index_find(b, &b->by_set, key_set, (gkey){s, sizeof *s});
    if (i != UINT32_MAX) return KP_GE(KP_GE_TERM, i);
    if (!kp_grow_u32((void **)&b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets)) {
        b->oom = true;
        return UINT32_MAX;
    }
    b->sets[b->n_sets] = *s;
    if (!index_add(b, &b->by_set, key_set, b->n_sets)) {
        b->oom = true;
        return UINT32_MAX;
    }
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
    kp_grep rp = {rule, (uint16_t)min, (uint16_t)max}; /* shared by content, as sets: equal REPs factor together */
    uint32_t i = index_find(b, &b->by_rep, key_rep, (gkey){&rp, sizeof rp});
    if (i != UINT32_MAX) return KP_GE(KP_GE_REP, i);
    if (!kp_grow_u32((void **)&b->reps, &b->cap_reps, b->n_reps + 1, sizeof *b->reps)) {
        b->oom = true;
        return UINT32_MAX;
    }
    b->reps[b->n_reps] = rp;
    if (!index_add(b, &b->by_rep, key_rep, b->n_reps)) {
        b->oom = true;
        return UINT32_MAX;
    }
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
