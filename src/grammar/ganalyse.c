/*
 * ganalyse.c - from a builder to a kp_grammar: the checks that make a
 * grammar safe to match, the analyses the matcher needs, and the flat
 * layout of gram_impl.h.
 *
 * kp_builder_finish runs, in order:
 *
 *   check_built     the builder's own verdicts: stopped, too big, out of
 *                   memory, no root, a rule used but never defined
 *   factor          left factoring of rules with many alternatives (gfactor.c)
 *   productive      rules that can finish; unproductive alternatives are
 *                   dropped, a root that cannot finish is refused
 *   reachable       rules reachable from the root
 *   nullable        rules that can match the empty string; a repetition
 *                   (max > 1) of one is refused
 *   left corners    a DFS over "rule r may start with rule s": a circle is
 *                   left recursion (refused); otherwise its postorder lists
 *                   every reachable rule after the rules it may start with
 *   FIRST, width    one pass in that order
 *   FOLLOW          one backward pass over each alternative for what comes
 *                   after each rule inside it, then the edges "FOLLOW(x)
 *                   includes FOLLOW(r)" (x ends an alternative of r) by a
 *                   worklist
 *   flatten, then the shortest expansion of every rule
 *
 * Cost. Every step is linear in the size of the grammar (rules, alternatives,
 * elements): productive and nullable count, per alternative, the rules it
 * still waits for and are woken through an index of where each rule is used;
 * the FOLLOW worklist takes a rule again only when its set grew (at most 256
 * times, in practice once or twice); shortest expansions are Knuth's
 * generalisation of Dijkstra's algorithm (a binary heap of alternatives whose
 * rules are all known: n log n). Round-robin fixpoints, which this replaced,
 * took one pass over the whole grammar per level of nesting: quadratic, 4 s
 * for 20,000 nested groups. Each unit of work is a builder tick, so the
 * caller's stop callback is polled throughout.
 *
 * The width (KP_GRAMMAR_MAX_WIDTH). Entering position p of an alternative
 * creates one parse stack per TERM it may reach without reading a byte:
 *
 *   width(TERM) = 1      width(REF r) = width(REP of r) = W(r)
 *   W(r)        = sum over r's alternatives of the width of their start
 *   width at p  = width(elem p) + (elem p nullable ? width at p + 1 : 0)
 *
 * (W in left-corner order; the alternative's end pops to the caller, whose
 * own width is counted where the caller is entered.) A rule or position
 * wider than the limit is refused with its name: the matcher could not
 * follow it (KP_GRAMMAR_MAX_STACKS) and would fail in the middle of a
 * generation instead of at compile time. The limit is half the matcher's, as
 * a position that pops out of several rules at once adds their widths.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "grammar/gram_impl.h"

#define LEN_INF 0x7FFFFFFFu
#define WIDTH_SAT 0x7FFFFFFFu

typedef struct {
    kp_builder *b;
    uint8_t *prod, *null, *reach;
    kp_gset *first, *follow;
    uint32_t *order, n_order; /* reachable rules, each after its left corners */
    uint32_t *width;          /* per rule: W(r), saturated */
} an;

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

static uint32_t sat_add(uint32_t x, uint32_t y) { return x >= LEN_INF - y ? LEN_INF : x + y; }
static uint32_t sat_mul(uint32_t x, uint32_t y) {
    if (x == 0 || y == 0) return 0;
    return x > LEN_INF / y ? LEN_INF : x * y;
}

static uint32_t elem_rule(const kp_builder *b, uint32_t e) {
    uint32_t t = KP_GE_TYPE(e);
    if (t == KP_GE_REF) return KP_GE_ARG(e);
    if (t == KP_GE_REP) return b->reps[KP_GE_ARG(e)].rule;
    return UINT32_MAX;
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

static uint32_t elem_width(const an *a, uint32_t e) {
    return KP_GE_TYPE(e) == KP_GE_TERM ? 1 : a->width[elem_rule(a->b, e)];
}

/* ---- productive and nullable: counting worklists ---- */

enum { NEED_NONE, NEED_NEVER, NEED_RULE };

/* What element e needs for the property: nothing, the impossible, or rule *x. */
typedef int (*need_fn)(const an *a, uint32_t e, uint32_t *x);

static int need_prod(const an *a, uint32_t e, uint32_t *x) {
    switch (KP_GE_TYPE(e)) {
    case KP_GE_TERM: return set_empty(&a->b->sets[KP_GE_ARG(e)]) ? NEED_NEVER : NEED_NONE;
    case KP_GE_REF: *x = KP_GE_ARG(e); return NEED_RULE;
    case KP_GE_REP: {
        const kp_grep *r = &a->b->reps[KP_GE_ARG(e)];
        if (r->min == 0) return NEED_NONE;
        *x = r->rule;
        return NEED_RULE;
    }
    }
    return NEED_NEVER;
}

static int need_null(const an *a, uint32_t e, uint32_t *x) {
    if (KP_GE_TYPE(e) == KP_GE_TERM) return NEED_NEVER;
    return need_prod(a, e, x); /* REF: the rule; REP: nothing when min is 0, else the rule */
}

/* Sets mark[r] for every rule with an alternative whose elements all have
 * the property (the least fixpoint): each alternative counts the rules it
 * still waits for (a rule used twice, twice); a rule newly marked wakes the
 * alternatives that use it through the index `users`. false: out of memory
 * or stopped. */
static bool propagate(an *a, need_fn need, uint8_t *mark) {
    kp_builder *b = a->b;
    uint32_t n = b->n_rules;
    size_t n_alts = 0, n_uses = 0;
    for (uint32_t r = 0; r < n; r++) {
        n_alts += b->rules[r].n_alts;
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++) n_uses += b->rules[r].alts[i].n;
    }
    uint32_t *alt_rule = malloc((n_alts + 1) * sizeof *alt_rule), *open = malloc((n_alts + 1) * sizeof *open);
    uint32_t *start = calloc((size_t)n + 2, sizeof *start), *users = malloc((n_uses + 1) * sizeof *users);
    uint32_t *stack = malloc(((size_t)n + 1) * sizeof *stack);
    bool ok = alt_rule && open && start && users && stack;
    size_t k = 0;
    for (uint32_t r = 0; ok && r < n; r++)
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++, k++) {
            const kp_gseq *s = &b->rules[r].alts[i];
            alt_rule[k] = r;
            open[k] = 0;
            for (uint32_t j = 0; j < s->n; j++) {
                uint32_t x = 0;
                int w = need(a, s->v[j], &x);
                if (w == NEED_NEVER) open[k] = UINT32_MAX;
                if (w == NEED_RULE) {
                    if (open[k] != UINT32_MAX) open[k]++;
                    start[x + 2]++;
                }
            }
        }
    for (uint32_t r = 0; ok && r < n; r++) start[r + 2] += start[r + 1];
    k = 0;
    for (uint32_t r = 0; ok && r < n; r++)
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++, k++) {
            const kp_gseq *s = &b->rules[r].alts[i];
            for (uint32_t j = 0; j < s->n; j++) {
                uint32_t x = 0;
                if (need(a, s->v[j], &x) == NEED_RULE) users[start[x + 1]++] = (uint32_t)k;
            }
            if (kp_builder_tick(b)) ok = false;
        }
    /* now users of rule x are users[start[x] .. start[x + 1]) */
    uint32_t sp = 0;
    for (k = 0; ok && k < n_alts; k++)
        if (open[k] == 0 && !mark[alt_rule[k]]) {
            mark[alt_rule[k]] = 1;
            stack[sp++] = alt_rule[k];
        }
    while (ok && sp) {
        uint32_t x = stack[--sp];
        for (uint32_t u = start[x]; u < start[x + 1]; u++) {
            uint32_t al = users[u];
            if (open[al] == UINT32_MAX || --open[al] != 0 || mark[alt_rule[al]]) continue;
            mark[alt_rule[al]] = 1;
            stack[sp++] = alt_rule[al];
        }
        if (kp_builder_tick(b)) ok = false;
    }
    free(alt_rule);
    free(open);
    free(start);
    free(users);
    free(stack);
    if (!ok && !b->stopped) b->oom = true;
    return ok;
}

static void drop_unproductive(an *a) {
    kp_builder *b = a->b;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        kp_draft_rule *R = &b->rules[r];
        uint32_t k = 0;
        for (uint32_t i = 0; i < R->n_alts; i++) {
            bool ok = true;
            for (uint32_t j = 0; j < R->alts[i].n && ok; j++) {
                uint32_t x = 0;
                int w = need_prod(a, R->alts[i].v[j], &x);
                ok = w == NEED_NONE || (w == NEED_RULE && a->prod[x]);
            }
            if (ok)
                R->alts[k++] = R->alts[i];
            else
                kp_gseq_free(&R->alts[i]);
        }
        R->n_alts = k;
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
 * left recursion. Iterative DFS over the reachable rules; on a circle writes
 * "a -> b -> a" into msg and returns true; else a->order is the postorder. */
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
                a->order[a->n_order++] = r;
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

/* FIRST and W of every reachable rule, in left-corner order (each rule's
 * corners are done before it). */
static void first_and_width(an *a) {
    const kp_builder *b = a->b;
    for (uint32_t k = 0; k < a->n_order; k++) {
        uint32_t r = a->order[k];
        uint64_t w = 0;
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++) {
            const kp_gseq *s = &b->rules[r].alts[i];
            for (uint32_t j = 0; j < s->n; j++) {
                set_or(&a->first[r], elem_first(a, s->v[j]));
                w += elem_width(a, s->v[j]);
                if (!elem_null(a, s->v[j])) break;
            }
        }
        a->width[r] = w > WIDTH_SAT ? WIDTH_SAT : (uint32_t)w;
    }
}

/* The widest rule or position against KP_GRAMMAR_MAX_WIDTH. */
static kp_status check_width(const an *a, uint32_t root, kp_error *err) {
    const kp_builder *b = a->b;
    for (uint32_t k = 0; k < a->n_order; k++) { /* the narrowest culprit first: corners come first */
        uint32_t r = a->order[k];
        if (a->width[r] > KP_GRAMMAR_MAX_WIDTH)
            return kp_fail(err, KP_ERANGE,
                           "grammar: rule '%s' may begin %u ways at once; at most %u (KP_GRAMMAR_MAX_WIDTH: "
                           "alternatives, optional items in a row, enum values or anyOf branches that differ "
                           "from their first byte)",
                           b->rules[r].name, a->width[r], KP_GRAMMAR_MAX_WIDTH);
    }
    (void)root;
    for (uint32_t k = 0; k < a->n_order; k++) {
        uint32_t r = a->order[k];
        for (uint32_t i = 0; i < b->rules[r].n_alts; i++) {
            const kp_gseq *s = &b->rules[r].alts[i];
            uint64_t sw = 0;
            for (uint32_t j = s->n; j-- > 0;) {
                sw = elem_width(a, s->v[j]) + (elem_null(a, s->v[j]) ? sw : 0);
                if (sw > KP_GRAMMAR_MAX_WIDTH)
                    return kp_fail(err, KP_ERANGE,
                                   "grammar: rule '%s' may go on %llu ways at once after its item %u; at most %u "
                                   "(KP_GRAMMAR_MAX_WIDTH: optional items in a row that each offer many ways)",
                                   b->rules[r].name, (unsigned long long)sw, j, KP_GRAMMAR_MAX_WIDTH);
            }
        }
    }
    return KP_OK;
}

/* FOLLOW of every reachable rule. */
static bool follow_sets(an *a) {
    kp_builder *b = a->b;
    uint32_t n = b->n_rules;
    uint32_t *edge = NULL; /* pairs (r, x): FOLLOW(x) includes FOLLOW(r) */
    size_t n_edges = 0, cap_edges = 0;
    bool ok = true;
    for (uint32_t k = 0; ok && k < a->n_order; k++) {
        uint32_t r = a->order[k];
        for (uint32_t i = 0; ok && i < b->rules[r].n_alts; i++) {
            const kp_gseq *s = &b->rules[r].alts[i];
            kp_gset suf = {{0}}; /* FIRST of the elements after j */
            bool suf_null = true;
            for (uint32_t j = s->n; ok && j-- > 0;) {
                uint32_t e = s->v[j], x = elem_rule(b, e);
                if (x != UINT32_MAX) {
                    set_or(&a->follow[x], &suf);
                    if (KP_GE_TYPE(e) == KP_GE_REP && b->reps[KP_GE_ARG(e)].max > 1) set_or(&a->follow[x], &a->first[x]);
                    if (suf_null && x != r) {
                        void *mem = edge;
                        if (!kp_grow(&mem, &cap_edges, 2 * n_edges + 2, sizeof *edge)) {
                            ok = false;
                            break;
                        }
                        edge = mem;
                        edge[2 * n_edges] = r;
                        edge[2 * n_edges + 1] = x;
                        n_edges++;
                    }
                }
                if (elem_null(a, e)) {
                    set_or(&suf, elem_first(a, e));
                } else {
                    suf = *elem_first(a, e);
                    suf_null = false;
                }
                if (kp_builder_tick(b)) ok = false;
            }
        }
    }
    /* the edges grouped by r, then a worklist: a rule whose set grew passes it on */
    uint32_t *start = ok ? calloc((size_t)n + 2, sizeof *start) : NULL, *to = NULL, *queue = NULL;
    uint8_t *inq = NULL;
    if (ok) {
        to = malloc((n_edges + 1) * sizeof *to);
        queue = malloc(((size_t)n + 1) * sizeof *queue);
        inq = calloc((size_t)n + 1, 1);
        ok = start && to && queue && inq;
    }
    if (ok) {
        for (size_t k = 0; k < n_edges; k++) start[edge[2 * k] + 2]++;
        for (uint32_t r = 0; r < n; r++) start[r + 2] += start[r + 1];
        for (size_t k = 0; k < n_edges; k++) to[start[edge[2 * k] + 1]++] = edge[2 * k + 1];
        uint32_t head = 0, len = 0;
        for (uint32_t k = 0; k < a->n_order; k++) {
            queue[len++] = a->order[k];
            inq[a->order[k]] = 1;
        }
        while (ok && len) {
            uint32_t r = queue[head];
            head = (head + 1) % (n + 1);
            len--;
            inq[r] = 0;
            for (uint32_t u = start[r]; u < start[r + 1]; u++) {
                uint32_t x = to[u];
                if (set_or(&a->follow[x], &a->follow[r]) && !inq[x]) {
                    inq[x] = 1;
                    queue[(head + len) % (n + 1)] = x;
                    len++;
                }
            }
            if (kp_builder_tick(b)) ok = false;
        }
    }
    free(edge);
    free(start);
    free(to);
    free(queue);
    free(inq);
    if (!ok && !b->stopped) b->oom = true;
    return ok;
}

/* ---- finish: check, analyse, flatten ---- */

/* The builder's own verdicts, before any analysis: stopped, too big, out
 * of memory, no start rule, a rule referred to but never defined. */
static kp_status check_built(const kp_builder *b, uint32_t root, kp_error *err) {
    if (b->stopped || b->too_big || b->oom) return kp_builder_failure(b, "grammar", err);
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
    free(a->order);
    free(a->width);
}

/* The analyses of a->b from root (productive, reachable, nullable, first,
 * width, follow; a's arrays allocated here, an_free releases them) and the
 * checks that make the grammar safe to run: root finishes, no repeated
 * rule matches the empty string, no left recursion, no point wider than
 * KP_GRAMMAR_MAX_WIDTH. */
static kp_status analyse(an *a, uint32_t root, kp_error *err) {
    kp_builder *b = a->b;
    uint32_t n = b->n_rules;
    kp_status st = KP_OK;
    a->prod = calloc(n, 1);
    a->null = calloc(n, 1);
    a->reach = calloc(n, 1);
    a->first = calloc(n, sizeof *a->first);
    a->follow = calloc(n, sizeof *a->follow);
    a->order = malloc((size_t)n * sizeof *a->order);
    a->width = calloc(n, sizeof *a->width);
    uint32_t *stack = malloc((size_t)n * sizeof *stack), *iter = malloc((size_t)n * 2 * sizeof *iter);
    uint8_t *color = calloc(n, 1);
    char cyc[256];
    if (!a->prod || !a->null || !a->reach || !a->first || !a->follow || !a->order || !a->width || !stack || !iter ||
        !color) {
        st = kp_fail(err, KP_ENOMEM, "grammar: out of memory");
        goto done;
    }
    if (!propagate(a, need_prod, a->prod)) {
        st = kp_builder_failure(b, "grammar", err);
        goto done;
    }
    if (!a->prod[root]) {
        st = kp_fail(err, KP_EINVAL, "grammar: rule '%s' can never finish (no finite document)", b->rules[root].name);
        goto done;
    }
    drop_unproductive(a);
    mark_reach(a, root, stack);
    if (!propagate(a, need_null, a->null)) {
        st = kp_builder_failure(b, "grammar", err);
        goto done;
    }
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
    first_and_width(a);
    if ((st = check_width(a, root, err)) != KP_OK) goto done;
    if (!follow_sets(a)) st = kp_builder_failure(b, "grammar", err);
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

/* The rule an element waits for in shortest_expansions (a REF's, a REP's
 * with min > 0), else UINT32_MAX. */
static uint32_t len_dep(const kp_grammar *g, uint32_t e) {
    if (KP_GE_TYPE(e) == KP_GE_REF) return KP_GE_ARG(e);
    if (KP_GE_TYPE(e) == KP_GE_REP && g->reps[KP_GE_ARG(e)].min > 0) return g->reps[KP_GE_ARG(e)].rule;
    return UINT32_MAX;
}

/* The length of an alternative's shortest expansion, its rules' known. */
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

typedef struct {
    uint32_t len, alt;
} cand;

static bool cand_less(cand x, cand y) { return x.len < y.len || (x.len == y.len && x.alt < y.alt); }

static void heap_push(cand *h, uint32_t *n, cand c) {
    uint32_t i = (*n)++;
    while (i > 0 && cand_less(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, uint32_t *n) {
    cand top = h[0], last = h[--*n];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Shortest expansions (Knuth 1977, "A generalization of Dijkstra's
 * algorithm"): an alternative becomes a candidate once every rule it
 * waits for is settled; the shortest candidate settles its rule (ties: the
 * earlier alternative). best_alt of a rule only uses rules settled before
 * it, so following best_alt always terminates. false: out of memory or
 * stopped. */
static bool shortest_expansions(kp_grammar *g, kp_builder *b) {
    uint32_t n = g->n_rules, na = g->n_alts;
    uint32_t *owner = malloc(((size_t)na + 1) * sizeof *owner), *wait = calloc((size_t)na + 1, sizeof *wait);
    uint32_t *start = calloc((size_t)n + 2, sizeof *start), *users = malloc(((size_t)g->n_elems + 1) * sizeof *users);
    cand *heap = malloc(((size_t)na + 1) * sizeof *heap);
    uint8_t *done = calloc((size_t)n + 1, 1);
    bool ok = owner && wait && start && users && heap && done;
    for (uint32_t r = 0; r < n; r++) {
        g->min_len[r] = LEN_INF;
        g->best_alt[r] = UINT32_MAX;
    }
    for (uint32_t r = 0; ok && r < n; r++)
        for (uint32_t k = g->rule_alt[r]; k < g->rule_alt[r + 1]; k++) {
            owner[k] = r;
            for (uint32_t q = g->alt_pos[k]; KP_GE_TYPE(g->elems[q]) != KP_GE_END; q++) {
                uint32_t x = len_dep(g, g->elems[q]);
                if (x == UINT32_MAX) continue;
                wait[k]++;
                start[x + 2]++;
            }
        }
    for (uint32_t r = 0; ok && r < n; r++) start[r + 2] += start[r + 1];
    for (uint32_t k = 0; ok && k < na; k++)
        for (uint32_t q = g->alt_pos[k]; KP_GE_TYPE(g->elems[q]) != KP_GE_END; q++) {
            uint32_t x = len_dep(g, g->elems[q]);
            if (x != UINT32_MAX) users[start[x + 1]++] = k;
        }
    uint32_t nh = 0;
    for (uint32_t k = 0; ok && k < na; k++)
        if (wait[k] == 0) heap_push(heap, &nh, (cand){alt_min_len(g, k), k});
    while (ok && nh) {
        cand c = heap_pop(heap, &nh);
        uint32_t r = owner[c.alt];
        if (done[r]) continue;
        done[r] = 1;
        g->min_len[r] = c.len;
        g->best_alt[r] = c.alt;
        for (uint32_t u = start[r]; u < start[r + 1]; u++) {
            uint32_t k = users[u];
            if (--wait[k] == 0 && !done[owner[k]]) heap_push(heap, &nh, (cand){alt_min_len(g, k), k});
        }
        if (kp_builder_tick(b)) ok = false;
    }
    free(owner);
    free(wait);
    free(start);
    free(users);
    free(heap);
    free(done);
    return ok;
}

kp_status kp_builder_finish(kp_builder *b, uint32_t root, kp_grammar **out, kp_error *err) {
    *out = NULL;
    an a = {.b = b};
    kp_status st = check_built(b, root, err);
    if (st == KP_OK && !kp_builder_factor(b)) st = kp_builder_failure(b, "grammar", err);
    if (st == KP_OK) st = analyse(&a, root, err);
    if (st == KP_OK) {
        kp_grammar *g = flatten(b, &a, root);
        if (!g) {
            st = kp_fail(err, KP_ENOMEM, "grammar: out of memory");
        } else if (!shortest_expansions(g, b)) {
            kp_grammar_free(g);
            st = b->stopped ? kp_builder_failure(b, "grammar", err) : kp_fail(err, KP_ENOMEM, "grammar: out of memory");
        } else {
            *out = g;
        }
    }
    an_free(&a);
    kp_builder_free(b);
    return st;
}
