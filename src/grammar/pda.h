/*
 * pda.h - the matching engine: a set of parse stacks over a kp_grammar,
 * advanced one byte at a time, with every stack frame and every stack set
 * hash-consed so that equal states are equal integers. Internal to
 * src/grammar/ (kp_gmatch in gmatch.c is the public face).
 *
 * A stack is a linked list of frames (nodes), top first:
 *
 *        leaf                                      bottom
 *   [pos p1 | TERM] -> [pos p2, need, rem] -> ... -> NIL
 *
 * For example, with (ws written inline as a repetition, as schema.c does)
 *
 *   root  ::= "{" ws "\"n\"" ws ":" ws num ws "}"      ws   = wsch{0,20}
 *   num   ::= digit+                                  wsch ::= [ \n]
 *
 * the input {"n": 4 leaves three stacks alive, one per way to go on:
 *
 *   [digit: [0-9]] -> [num: digit+ need 0 rem inf] -> [root: ws{20} "}"] -> NIL  more digits
 *   [wsch: [ \n]]  -> [root: ws{19} "}"] -> NIL  (this iteration took one)  whitespace
 *   [root: "}"]    -> NIL                                                      the end
 *
 * where [root: ws{k} "}"] is the REP node at the ws before "}" with k
 * iterations left. A frame is shared by every stack that contains it.
 *
 * A node (pos, parent, need, rem) says "continue at element pos, then pop
 * to parent". Top nodes (leaves) always sit on a TERM; the other nodes are
 * return points (any element but END) and REP counters (need: iterations
 * still required, rem: iterations still allowed, KP_GREP_INF unbounded).
 * Nodes are interned: one id per distinct (pos, parent, need, rem), so a
 * whole stack is identified by its top node and two parses that reach the
 * same stack merge. A call whose continuation is the end of its
 * alternative pushes nothing (tail call), so x* and right recursion keep
 * the stack flat.
 *
 * A configuration (cfg) is the sorted set of leaves after some input plus
 * flags: COMPLETE (a parse popped to NIL: the input is a whole document)
 * and ESC (a parse popped to SENTINEL, used by the mask cache for stacks
 * whose bottom is unknown). Configurations are interned too, and
 * kp_parser_step memoizes (cfg, byte) -> cfg, so the engine is a lazily
 * built DFA over stack sets:
 *
 *      cfg 7 --'a'--> cfg 9 --'"'--> cfg 12 ...      (transition rows)
 *       |
 *       leaves [n3, n8]  flags   (leaf pool + cfg table)
 *
 * The memo is a hash of (cfg, byte); a cfg stepped from KP_PARSER_ROW_AFTER
 * times gets a dense row of 256 next-cfg ids instead (UINT32_MAX: not
 * computed yet), up to KP_PARSER_MAX_ROWS rows: walks step most cfgs once or
 * twice, the few hot ones (inside a string, a number) many times.
 *
 * Ids: node 0 NIL, node 1 SENTINEL; cfg 0 DEAD (no leaf, no flag).
 * Memory grows with every new node/cfg; the owner compacts by copying the
 * live cfg into a fresh engine (kp_parser_import) between calls.
 */
#ifndef KP_PDA_H
#define KP_PDA_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "grammar/gram_impl.h"

#define KP_PARSER_NIL 0u
#define KP_PARSER_SENTINEL 1u
#define KP_PARSER_DEAD 0u
#define KP_PARSER_MAX_ROWS 16384u
#define KP_PARSER_ROW_AFTER 4u

enum { KP_GCFG_COMPLETE = 1, KP_GCFG_ESC = 2 };

typedef struct {
    uint32_t pos, parent;
    uint16_t need, rem;
    uint32_t hnext; /* hash chain */
} kp_gnode;

typedef struct {
    uint32_t off, n; /* leaves: leaf pool [off, off + n) */
    uint32_t flags;
    uint32_t hnext;
    uint32_t row;  /* its transition row in rows[] (256 entries), or UINT32_MAX */
    uint32_t puts; /* transitions memoized from it so far */
} kp_gcfg;

typedef struct kp_parser {
    const kp_grammar *g;
    uint32_t max_nodes;
    kp_gnode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *nbucket, nbucket_mask;
    kp_gcfg *cfgs;
    uint32_t n_cfgs, cap_cfgs;
    uint32_t *cbucket, cbucket_mask;
    uint32_t *leaves, n_leaves, cap_leaves;
    uint32_t *rows, n_rows, cap_rows; /* 256 entries per row */
    uint64_t *memo_key; /* (cfg << 8 | byte) + 1, 0 = empty */
    uint32_t *memo_val, memo_mask, memo_n;
    /* scratch of one step */
    uint32_t *stamp, cap_stamp, epoch;
    uint32_t *work, n_work, cap_work;
    uint32_t *out, n_out, cap_out;
    /* per cfg, computed on demand: the bytes any leaf takes (first), the
     * bytes leading back to it (loop), *_ok 0/1; whether every UTF-8
     * character leads back to it (u8: 0 unknown, 1 yes, 2 no) */
    kp_gset *first, *loop;
    uint8_t *first_ok, *loop_ok, *u8;
    uint32_t cap_first, cap_loop, cap_u8;
    uint32_t *relax, *relax_rem, cap_relax; /* kp_parser_relax; UINT32_MAX: not yet */
} kp_parser;

/* A fresh engine over g (borrowed), capped at max_nodes nodes. */
kp_status kp_parser_init(kp_parser *p, const kp_grammar *g, uint32_t max_nodes, kp_error *err);
void kp_parser_fini(kp_parser *p);

/* Bytes held (nodes, cfgs, leaves, memo): the owner compacts above a limit. */
size_t kp_parser_bytes(const kp_parser *p);
uint32_t kp_parser_n_nodes(const kp_parser *p);

/* The interned node (pos, parent, need, rem); UINT32_MAX when the node cap
 * or memory is exhausted. */
uint32_t kp_parser_node(kp_parser *p, uint32_t pos, uint32_t parent, uint32_t need, uint32_t rem);

/* The configuration of the grammar's start. KP_EFULL / KP_ENOMEM. */
kp_status kp_parser_start(kp_parser *p, uint32_t *cfg, kp_error *err);

/* The configuration holding exactly the leaf node `leaf` (no closure:
 * leaf must sit on a TERM). */
kp_status kp_parser_single(kp_parser *p, uint32_t leaf, uint32_t *cfg, kp_error *err);

/* The configuration after byte b from cfg: every leaf whose TERM holds b
 * moves past it and the result is closed (calls entered, returns popped).
 * DEAD when no parse survives. KP_EFULL when more than
 * KP_GRAMMAR_MAX_STACKS leaves survive or the node cap is hit; KP_ENOMEM. */
kp_status kp_parser_step(kp_parser *p, uint32_t cfg, uint8_t b, uint32_t *out, kp_error *err);

/* The memoized next cfg, or UINT32_MAX when it must be computed
 * (kp_parser_step). */
static inline uint32_t kp_parser_peek(const kp_parser *p, uint32_t cfg, uint8_t b) {
    uint32_t r = p->cfgs[cfg].row;
    return r == UINT32_MAX ? UINT32_MAX : p->rows[(size_t)r * 256 + b];
}

static inline const kp_gcfg *kp_parser_cfg(const kp_parser *p, uint32_t cfg) { return &p->cfgs[cfg]; }
static inline const uint32_t *kp_parser_leaves(const kp_parser *p, uint32_t cfg) {
    return p->leaves + p->cfgs[cfg].off;
}
/* The cfg has a leaf or is complete (ESC alone does not count). */
static inline bool kp_parser_alive(const kp_parser *p, uint32_t cfg) {
    return p->cfgs[cfg].n > 0 || (p->cfgs[cfg].flags & KP_GCFG_COMPLETE);
}

/* The bytes some leaf of cfg takes (a cfg steps to DEAD on every other
 * byte); NULL when out of memory. */
const kp_gset *kp_parser_first(kp_parser *p, uint32_t cfg);

/* The bytes b after which cfg has the same leaves again (its flags may
 * differ; computed once per cfg: a step per byte of its first set). The
 * pointer is valid until the next call. */
kp_status kp_parser_loop(kp_parser *p, uint32_t cfg, const kp_gset **out, kp_error *err);

/* *out: from cfg, every well-formed multi-byte UTF-8 character leads back
 * to cfg's leaves, through states that all have leaves (e.g. inside a JSON
 * string). Cached per cfg. */
kp_status kp_parser_u8loop(kp_parser *p, uint32_t cfg, bool *out, kp_error *err);

/* The cfg with every REP counter of its stacks made unbounded (rem
 * KP_GREP_INF; need KP_GREP_INF where it was not 0: a repetition that may
 * not end yet never will), flags dropped, and the smallest bounded rem it
 * had (KP_GREP_INF: none).
 * A byte string of at most that many bytes cannot exhaust a counter, so
 * on strings that stay inside the repetitions cfg behaves as *relaxed. */
kp_status kp_parser_relax(kp_parser *p, uint32_t cfg, uint32_t *relaxed, uint32_t *min_rem, kp_error *err);

/* Copies configuration cfg of src (its leaves' whole stacks) into dst,
 * giving its id there. dst and src have the same grammar. */
kp_status kp_parser_import(kp_parser *dst, const kp_parser *src, uint32_t cfg, uint32_t *out, kp_error *err);

#endif
