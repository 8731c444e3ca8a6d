/*
 * gfactor.c - left factoring of the builder's rules (kp_builder_factor in
 * gram_impl.h), run by kp_builder_finish before the analyses.
 *
 * Why. The matcher follows one parse stack per way the grammar may go on
 * (at most KP_GRAMMAR_MAX_STACKS). An enum of 2,048 strings is 2,048
 * alternatives that all begin with '"': after the quote, 2,048 stacks, and
 * inside an object a few more: "the grammar allows no token here". Factored,
 * the same language is a trie, and the matcher follows one stack per
 * distinct next byte:
 *
 *   e ::= "\"red\"" | "\"green\"" | "\"grey\""
 *
 *   e   ::= "\"" e~
 *   e~  ::= "red\"" | "g" e~           (every rule the factoring makes is
 *   e~  ::= "re" e~                     named after its parent + "~";
 *   e~  ::= "en\"" | "y\""              names need not be unique)
 *
 * The rewrite, for every rule with at least KP_FACTOR_MIN_ALTS alternatives
 * and every rule the rewrite makes (rules are visited in index order and new
 * ones are appended, so one loop reaches them all):
 *
 *   1. unfold: an alternative whose first element is a REF to a rule of one
 *      non-empty alternative, s ::= x rest, starts with x REF(s~) instead
 *      (s~ ::= rest, made once per s; when rest is empty, just x). So an
 *      anyOf of 3,000 const branches, each its own rule, factors too. At
 *      most UNFOLD_MAX times in a row per alternative.
 *   2. group: alternatives with the same first element (the same TERM set,
 *      REF rule or REP: the builder shares sets and REPs by content) become
 *      one alternative `first REF(t)` at the place of the group's first
 *      member, with t ::= the members' rests in their order (an empty rest
 *      is an empty alternative).
 *
 * The language never changes; only the rules' shape does. Rules with fewer
 * alternatives are left as they are: little to gain, and the listing stays
 * what was written.
 *
 * Cost: grouping sorts a rule's alternatives and moves each member's
 * elements down one level, so an element is moved once per level it
 * descends: O(size log size) for a trie of strings. A right-recursive rule
 * can unfold into itself without end (s ::= "a" s under a group of "a"s), so
 * the rewrite has a budget of twice the grammar's elements: when it runs out
 * the remaining rules stay as they are (still correct, only less factored).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "grammar/gram_impl.h"

#define UNFOLD_MAX 8

typedef struct {
    uint32_t tail; /* the rule of this rule's rest (s~ above), UINT32_MAX: not made yet */
    bool made;     /* made by the factoring: always factored */
} rinfo;

typedef struct {
    kp_builder *b;
    rinfo *info;
    uint32_t n_info, cap_info;
    uint64_t budget; /* elements the rewrite may still move */
} fx;

/* info[] covers every rule. */
static bool fx_room(fx *f) {
    uint32_t n = f->b->n_rules;
    if (!kp_grow_u32((void **)&f->info, &f->cap_info, n, sizeof *f->info)) return false;
    for (; f->n_info < n; f->n_info++) f->info[f->n_info] = (rinfo){UINT32_MAX, false};
    return true;
}

/* A new rule named after parent. */
static uint32_t fx_rule(fx *f, uint32_t parent, bool made) {
    const char *name = f->b->rules[parent].name;
    size_t len = strlen(name);
    uint32_t r = len && name[len - 1] == '~' ? kp_builder_rule(f->b, "%s", name) : kp_builder_rule(f->b, "%s~", name);
    if (r == UINT32_MAX || !fx_room(f)) return UINT32_MAX;
    f->info[r].made = made;
    return r;
}

/* The rule of s's rest (s has one alternative of at least two elements). */
static uint32_t tail_of(fx *f, uint32_t s) {
    if (f->info[s].tail != UINT32_MAX) return f->info[s].tail;
    uint32_t t = fx_rule(f, s, false);
    if (t == UINT32_MAX) return UINT32_MAX;
    const kp_gseq *body = &f->b->rules[s].alts[0];
    kp_gseq rest = {0};
    if (!kp_grow_u32((void **)&rest.v, &rest.cap, body->n - 1, sizeof *rest.v)) {
        f->b->oom = true;
        return UINT32_MAX;
    }
    memcpy(rest.v, body->v + 1, (body->n - 1) * sizeof *rest.v);
    rest.n = body->n - 1;
    f->b->n_elems += rest.n;
    if (!kp_builder_alt(f->b, t, &rest)) return UINT32_MAX;
    f->info[s].tail = t;
    return t;
}

/* Step 1 on alternative i of rule r. */
static bool unfold(fx *f, uint32_t r, uint32_t i) {
    kp_builder *b = f->b;
    for (int u = 0; u < UNFOLD_MAX && f->budget > 0; u++) {
        kp_gseq *q = &b->rules[r].alts[i];
        if (q->n == 0 || KP_GE_TYPE(q->v[0]) != KP_GE_REF) return true;
        uint32_t s = KP_GE_ARG(q->v[0]);
        if (s == r || b->rules[s].n_alts != 1 || b->rules[s].alts[0].n == 0) return true;
        uint32_t head = b->rules[s].alts[0].v[0];
        f->budget--;
        if (b->rules[s].alts[0].n == 1) {
            q->v[0] = head;
            continue;
        }
        uint32_t t = tail_of(f, s);
        if (t == UINT32_MAX) return false;
        q = &b->rules[r].alts[i]; /* rules[] may have moved */
        if (!kp_grow_u32((void **)&q->v, &q->cap, q->n + 1, sizeof *q->v)) {
            b->oom = true;
            return false;
        }
        memmove(q->v + 2, q->v + 1, (q->n - 1) * sizeof *q->v);
        q->v[0] = head;
        q->v[1] = KP_GE(KP_GE_REF, t);
        q->n++;
        b->n_elems++;
    }
    return true;
}

typedef struct {
    uint32_t first, alt;
} head;

static int cmp_head(const void *x, const void *y) {
    const head *p = x, *q = y;
    if (p->first != q->first) return p->first < q->first ? -1 : 1;
    return p->alt < q->alt ? -1 : p->alt > q->alt;
}

/* Step 2 on rule r. */
static bool group(fx *f, uint32_t r) {
    kp_builder *b = f->b;
    uint32_t n = b->rules[r].n_alts, m = 0;
    head *h = malloc((size_t)n * sizeof *h);
    uint8_t *gone = calloc(n, 1);
    bool ok = h && gone;
    for (uint32_t i = 0; ok && i < n; i++)
        if (b->rules[r].alts[i].n > 0) h[m++] = (head){b->rules[r].alts[i].v[0], i};
    if (ok) qsort(h, m, sizeof *h, cmp_head);
    for (uint32_t g = 0; ok && g < m;) {
        uint32_t e = g + 1;
        while (e < m && h[e].first == h[g].first) e++;
        if (e - g < 2 || f->budget < e - g) {
            g = e;
            continue;
        }
        f->budget -= e - g;
        uint32_t t = fx_rule(f, r, true);
        kp_gseq joined = {0};
        ok = t != UINT32_MAX && kp_grow_u32((void **)&joined.v, &joined.cap, 2, sizeof *joined.v);
        for (uint32_t k = g; ok && k < e; k++) {
            kp_gseq rest = b->rules[r].alts[h[k].alt]; /* its storage moves into t */
            memset(&b->rules[r].alts[h[k].alt], 0, sizeof rest);
            memmove(rest.v, rest.v + 1, (rest.n - 1) * sizeof *rest.v);
            rest.n--;
            b->n_elems--;
            ok = kp_builder_alt(b, t, &rest);
            if (k > g) gone[h[k].alt] = 1;
        }
        if (ok) {
            joined.v[0] = h[g].first;
            joined.v[1] = KP_GE(KP_GE_REF, t);
            joined.n = 2;
            b->n_elems += 2;
            b->rules[r].alts[h[g].alt] = joined;
        } else {
            kp_gseq_free(&joined);
        }
        g = e;
    }
    if (ok) {
        kp_draft_rule *R = &b->rules[r];
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!gone[i]) R->alts[k++] = R->alts[i];
        R->n_alts = k;
    }
    free(h);
    free(gone);
    if (!ok && !b->stopped) b->oom = true;
    return ok;
}

bool kp_builder_factor(kp_builder *b) {
    fx f = {.b = b, .budget = 2 * (uint64_t)b->n_elems + 1024};
    bool ok = fx_room(&f);
    for (uint32_t r = 0; ok && r < b->n_rules && f.budget > 0; r++) {
        uint32_t n = b->rules[r].n_alts;
        if (n < 2 || (n < KP_FACTOR_MIN_ALTS && !f.info[r].made)) continue;
        for (uint32_t i = 0; ok && i < n; i++) ok = unfold(&f, r, i) && !kp_builder_tick(b);
        ok = ok && group(&f, r);
    }
    free(f.info);
    if (!ok && !b->stopped && !b->too_big) b->oom = true;
    if (ok && b->n_elems > KP_GRAMMAR_MAX_ELEMS) {
        b->too_big = true;
        ok = false;
    }
    return ok;
}
