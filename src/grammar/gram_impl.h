/*
 * gram_impl.h - the compiled grammar's layout and the builder the
 * compilers (GBNF, JSON Schema) write into. Internal to src/grammar/.
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an
 * alternative is a sequence of elements, each one of
 *
 *   TERM set     one byte from a 256-bit set (UTF-8 characters are
 *                sequences of TERMs; a class of code points becomes
 *                alternatives of such sequences, see kp_builder_class)
 *   REF r        rule r
 *   REP k        rule reps[k].rule repeated reps[k].min..max times
 *                (max KP_GREP_INF: unbounded); the counter lives in the
 *                parse stack, so x{0,10000} costs one element
 *   END          closes the alternative
 *
 * Flat layout after kp_builder_finish (positions index elems[]):
 *
 *   elems:  [REF root][END] | alt 0 of rule 0 ... [END] | alt 1 ... [END] | ...
 *            position 0: the start
 *   rule_alt[r] .. rule_alt[r+1]  indexes alt_pos[]: where rule r's
 *                                 alternatives start
 *   elem_rule[p]                  the rule position p belongs to
 *   sets[], reps[]                TERM / REP payloads
 *
 * Analyses done once by kp_builder_finish: unproductive alternatives (that can
 * never finish) are dropped and a grammar whose root cannot finish is
 * refused; nullable rules; left recursion (a rule reachable from itself
 * without consuming a byte) is refused, and so is a repetition (max > 1) of
 * a nullable rule; FOLLOW byte sets of every rule (the bytes that may come
 * right after it, used by the mask cache); the shortest completion of
 * every rule (min_len, best_alt).
 */
#ifndef KP_GRAM_IMPL_H
#define KP_GRAM_IMPL_H

#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "base/status.h"
#include "grammar/grammar.h"

typedef struct {
    uint64_t w[4];
} kp_gset;

static inline bool kp_gset_has(const kp_gset *s, uint8_t b) { return (s->w[b >> 6] >> (b & 63)) & 1; }
static inline void kp_gset_add(kp_gset *s, uint8_t b) { s->w[b >> 6] |= 1ull << (b & 63); }
static inline void kp_gset_add_range(kp_gset *s, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) kp_gset_add(s, (uint8_t)b);
}

#define KP_GREP_INF 0xFFFFu

typedef struct {
    uint32_t rule;
    uint16_t min, max; /* max KP_GREP_INF: unbounded */
} kp_grep;

enum { KP_GE_END = 0, KP_GE_TERM = 1, KP_GE_REF = 2, KP_GE_REP = 3 };
#define KP_GE(t, a) (((uint32_t)(t) << 30) | (uint32_t)(a))
#define KP_GE_TYPE(e) ((uint32_t)(e) >> 30)
#define KP_GE_ARG(e) ((uint32_t)(e) & 0x3FFFFFFFu)

struct kp_grammar {
    uint32_t n_rules, root;
    uint32_t *elems, n_elems;
    uint32_t *elem_rule;
    uint32_t *rule_alt; /* n_rules + 1 */
    uint32_t *alt_pos, n_alts;
    kp_gset *sets;
    uint32_t n_sets;
    kp_grep *reps;
    uint32_t n_reps;
    kp_gset *follow;    /* per rule */
    uint8_t *nullable;  /* per rule */
    uint32_t *min_len;  /* per rule: bytes of its shortest expansion (saturating) */
    uint32_t *best_alt; /* per rule: an alternative (index into alt_pos) of that length */
    char **names;       /* per rule */
    atomic_uint refs;   /* kp_grammar_ref / kp_grammar_free; 1 when built */
};

/* ---- the builder ---- */

typedef struct {
    uint32_t *v;
    uint32_t n, cap;
} kp_gseq;

typedef struct {
    char *name;
    kp_gseq *alts;
    uint32_t n_alts, cap_alts;
    bool defined; /* GBNF: has a definition (not only references) */
} kp_draft_rule;

/* An open-addressing index of builder entries (rules by name, sets and
 * repetitions by content): slot values are entry + 1, 0 empty. */
typedef struct {
    uint32_t *slot;
    uint32_t mask, n;
} kp_gindex;

typedef struct {
    kp_draft_rule *rules;
    uint32_t n_rules, cap_rules;
    kp_gset *sets;
    uint32_t n_sets, cap_sets;
    kp_grep *reps;
    uint32_t n_reps, cap_reps;
    kp_gindex by_name, by_set, by_rep; /* so that lookups cost O(1), not a scan */
    size_t n_elems; /* elements written so far, for the size cap */
    const kp_grammar_stop *stop; /* polled every KP_BUILDER_POLL steps; NULL: never */
    uint32_t ticks;
    bool oom, too_big, stopped;
} kp_builder;

#define KP_BUILDER_POLL 4096u

void kp_builder_init(kp_builder *b);
void kp_builder_free(kp_builder *b);

/* One step of work: every KP_BUILDER_POLL steps the stop callback is
 * asked; true once it said stop (b->stopped, and every later push fails). */
bool kp_builder_tick(kp_builder *b);

/* The status of a builder whose push or add failed (stopped, too big, out
 * of memory), with the message prefixed by who ("gbnf", "json schema"). */
kp_status kp_builder_failure(const kp_builder *b, const char *who, kp_error *err);

/* Left-factors b's rules (gfactor.c): a rule with at least
 * KP_FACTOR_MIN_ALTS alternatives (and every rule the factoring makes)
 * gets one alternative per distinct first element, the rest of each group
 * moved into a new rule; a first element that is a rule of one
 * alternative is unfolded first. The language is unchanged; an enum of
 * thousands of strings becomes a trie, so the matcher follows one parse
 * per distinct next byte instead of one per value. false: out of memory
 * or stopped (b->oom / b->stopped). */
#define KP_FACTOR_MIN_ALTS 8u
bool kp_builder_factor(kp_builder *b);

/* A new rule named printf-style (the name is for messages and listings;
 * names need not be unique). UINT32_MAX when out of memory (b->oom). */
uint32_t kp_builder_rule(kp_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The rule named name[0..len) (the first one with that name), created
 * (undefined) when there is none: GBNF's forward references. */
uint32_t kp_builder_named(kp_builder *b, const char *name, size_t len);

/* Appends an element / literal bytes / another sequence. false on OOM or
 * the size cap (b->oom / b->too_big). */
bool kp_gseq_push(kp_builder *b, kp_gseq *s, uint32_t elem);
bool kp_gseq_lit(kp_builder *b, kp_gseq *s, const void *bytes, size_t n);
bool kp_gseq_str(kp_builder *b, kp_gseq *s, const char *str);
void kp_gseq_free(kp_gseq *s);

/* Adds seq as an alternative of rule (seq's storage moves into the rule;
 * *seq is left empty). */
bool kp_builder_alt(kp_builder *b, uint32_t rule, kp_gseq *seq);
/* Adds an alternative of one element / of literal bytes. */
bool kp_builder_alt1(kp_builder *b, uint32_t rule, uint32_t elem);
bool kp_builder_alt_str(kp_builder *b, uint32_t rule, const char *str);

/* TERM element of a byte set (sets are shared by content). */
uint32_t kp_builder_term(kp_builder *b, const kp_gset *s);
uint32_t kp_builder_byte(kp_builder *b, uint8_t byte);
uint32_t kp_builder_bytes(kp_builder *b, unsigned lo, unsigned hi); /* [lo-hi] */
/* REP element: rule repeated min..max (max KP_GREP_INF for unbounded). */
uint32_t kp_builder_rep(kp_builder *b, uint32_t rule, uint32_t min, uint32_t max);
/* The rule an element stands for (a REF's rule, else a new one-alternative
 * rule holding the element), for repeating it. */
uint32_t kp_builder_as_rule(kp_builder *b, uint32_t elem);

/* A class of code points: ranges [lo, hi] (any order, may overlap; hi <=
 * 0x10FFFF), negated over all code points when negate. Surrogates
 * (U+D800..DFFF) are never matched (they have no UTF-8 form).
 * kp_builder_class gives one element: a TERM when every member is ASCII, else a
 * REF to a new rule with one alternative per UTF-8 byte-range sequence.
 * kp_builder_class_into adds those alternatives to an existing rule instead.
 * An empty class gives a TERM of the empty set (it matches nothing). */
typedef struct {
    uint32_t lo, hi;
} kp_gcrange;
bool kp_builder_class(kp_builder *b, const kp_gcrange *r, size_t n, bool negate, uint32_t *elem);
bool kp_builder_class_into(kp_builder *b, uint32_t rule, const kp_gcrange *r, size_t n, bool negate);

/* Encodes code point c as UTF-8 TERMs onto s. */
bool kp_gseq_cpt(kp_builder *b, kp_gseq *s, uint32_t c);

/* The rule of the JSON documents of schema, compiled into b as
 * kp_grammar_compile_schema compiles them (ws_max whitespace between
 * tokens; $ref resolved in schema), for grammars made of several parts
 * (compose.c). UINT32_MAX with *st and err set when it cannot be. */
uint32_t kp_schema_into(kp_builder *b, const json_t *schema, int ws_max, kp_status *st, kp_error *err);

/* Checks, analyses and flattens the grammar with start rule root; b is
 * freed either way. Errors (message names the rule): KP_EINVAL for an
 * undefined rule, a root that can never finish; KP_EUNSUPPORTED for left
 * recursion and repetitions of nullable rules; KP_ERANGE for the size cap;
 * KP_ENOMEM. */
kp_status kp_builder_finish(kp_builder *b, uint32_t root, kp_grammar **out, kp_error *err);

#endif
