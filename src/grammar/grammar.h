/*
 * grammar.h - constrained decoding (floor 4): grammars over bytes, an
 * incremental matcher, and token masks for the sampler.
 *
 * Three objects, three lifetimes:
 *
 *   kp_grammar  a context-free grammar over bytes, compiled once per request
 *               from a JSON Schema (kp_grammar_compile_schema), "any JSON
 *               object" (kp_grammar_json_object) or llama.cpp's GBNF
 *               (kp_grammar_compile_gbnf). Immutable: any number of threads
 *               may read it; reference counted (kp_grammar_ref).
 *   kp_gvocab   the vocabulary's token byte strings as a byte trie, built
 *               once per vocabulary (per model), immutable, shared.
 *   kp_gmatch   one generation's position in a grammar (a set of parse
 *               stacks) plus its mask caches. One thread at a time uses a
 *               matcher and its clones (clones share a cache).
 *
 * The sampler's loop (the integration step):
 *
 *   kp_gvocab_new(&gv, vocab, &err);                        once per model
 *   kp_grammar_compile_schema(schema, NULL, &g, &err);      once per request
 *   kp_gmatch_new(&m, g, gv, &err);
 *   uint32_t *mask = calloc(kp_gvocab_mask_words(gv), 4);
 *   loop:
 *     kp_gmatch_mask(m, mask, &n_allowed, &err);           allowed tokens
 *     n_allowed == 0: stop (kp_gmatch_complete tells whether the document
 *                     is whole);
 *     kp_gmask_apply(mask, logits, n_logits);              -inf elsewhere
 *     id = sample(logits);                                 the usual chain
 *     kp_gmatch_accept_token(m, id, &err);                 cannot fail for
 *                                                          an allowed id
 *     id is end-of-generation: done (the document is complete).
 *
 * The probabilities the sampler then sees are those of the masked
 * distribution: softmax over the allowed tokens only (top-k, top-p, min-p
 * and temperature act on what is left).
 *
 * Mask caches live with a matcher and its clones. A request whose schema
 * was seen before gets warm masks when the caller keeps, per schema, the
 * grammar and a matcher at the start and kp_gmatch_clone's it for each
 * request (kp_gmatch_reset a finished one); a fresh matcher builds its
 * cache entries on first use (the cold cost measured by bench_grammar).
 *
 * How it works (details in each file's top comment):
 *
 *   schema.c / gbnf.c --> builder --> gram.c: checks, FIRST/FOLLOW, flat
 *                                     kp_grammar (rules of TERM/REF/REP)
 *   pda.c: parse stacks as hash-consed frame lists, sets of them as
 *          interned configurations, a lazily built DFA over them
 *   gvocab.c: the vocabulary's pieces as a byte trie (preorder)
 *   gmatch.c: the matcher; masks = per-leaf cached entries keyed by the
 *             top two stack frames, plus a walk of the uncertain tokens
 *
 * Tokens. A token is allowed iff feeding every byte of its piece
 * (kp_tok_piece_view with special = false) keeps the matcher alive. A
 * token whose piece is empty (control tokens) is never allowed, except an
 * end-of-generation token (kp_tok_is_eog), which is allowed exactly when the
 * input so far is a complete document; an end-of-generation token is only
 * ever that, even when it also has a printable piece. Ids at or above the
 * vocabulary size are never allowed.
 *
 * Bounds (never a crash, never unbounded memory; see each function):
 *   - a matcher holds at most KP_GRAMMAR_MAX_STACKS parse stacks after any
 *     byte; more (a very ambiguous grammar) is KP_EFULL "... parse stacks",
 *     the matcher unchanged;
 *   - its node arena is compacted between calls and capped at
 *     KP_GRAMMAR_MAX_NODES stack frames; a call that would need more is
 *     KP_EFULL (nesting that deep or a walk that wide);
 *   - grammars are capped at KP_GRAMMAR_MAX_ELEMS elements, repetition
 *     counts at KP_GRAMMAR_MAX_REPEAT; left recursion, repetitions of
 *     something that can match nothing, and grammars with no finite
 *     document are refused at compile time (KP_EUNSUPPORTED / KP_EINVAL with
 *     the rule's name);
 *   - the limits below (nesting, rules, alternatives, properties, enum
 *     values, anyOf branches, width) are KP_ERANGE at compile time, with a
 *     message naming the limit: what compiles, the matcher can start;
 *   - compiling is linear in the text (ganalyse.c: worklists instead of
 *     round-robin fixpoints; hashed lookups in the builder): 20,000 rules
 *     nested in each other compile in 0.02 s (4.5 s before), and no schema
 *     or grammar of up to 8 MiB (the server's body limit) took a second
 *     (0.1-0.95 s measured, release build, 2 cores); fuzz/fuzz_gcompile.c
 *     holds every compile to 64 steps of work per byte of text. A compile
 *     polls the caller's kp_grammar_stop every KP_BUILDER_POLL steps.
 */
#ifndef KP_GRAMMAR_H
#define KP_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "tok/tok.h"

#define KP_GRAMMAR_MAX_STACKS 2048
#define KP_GRAMMAR_MAX_NODES (1u << 21)
#define KP_GRAMMAR_MAX_ELEMS (1u << 22)
#define KP_GRAMMAR_MAX_REPEAT 65534

/* The compile-time limits (each refused with KP_ERANGE and a message
 * naming the limit and where it was hit; the README's limits section lists
 * them for clients):
 *   WIDTH       ways a grammar may go on at one point: the parse stacks
 *               a matcher must follow there, counted statically over the
 *               factored grammar (an enum of strings counts its distinct
 *               next bytes, not its values). Half of MAX_STACKS, so that
 *               what compiles also matches.
 *   NESTING     GBNF groups ( ) inside each other; JSON Schema
 *               subschemas inside each other (and literal values).
 *   RULES       rules of a GBNF grammar (named ones and groups).
 *   ALTS        alternatives of one GBNF rule or group.
 *   PROPERTIES  properties of one JSON Schema object.
 *   ENUM        values of one enum.
 *   ANYOF       branches of one anyOf / oneOf. */
#define KP_GRAMMAR_MAX_WIDTH 1024
#define KP_GRAMMAR_MAX_NESTING 256
#define KP_GRAMMAR_MAX_RULES 100000
#define KP_GRAMMAR_MAX_ALTS 100000
#define KP_SCHEMA_MAX_PROPERTIES 1000
#define KP_SCHEMA_MAX_ENUM 10000
#define KP_SCHEMA_MAX_ANYOF 1000

typedef struct kp_grammar kp_grammar;
typedef struct kp_gvocab kp_gvocab;
typedef struct kp_gmatch kp_gmatch;

/* ---- compiling ---- */

/* A compile polls stop(arg) every few thousand steps of work (a step: an
 * element written, a rule or an alternative analysed); when it returns
 * true the compile gives up with KP_EIO "... compile stopped". A server
 * sets it to "the client left or the server is stopping". The callback
 * runs on the compiling thread. */
typedef struct {
    bool (*fn)(void *arg);
    void *arg;
} kp_grammar_stop;

typedef struct {
    /* Whitespace the output may carry between two JSON tokens (and before
     * and after the document): at most this many of space, tab, LF, CR in a
     * row. Default 20 (a newline and two-space indentation nine levels
     * deep); 0 forces compact JSON. At most KP_GRAMMAR_MAX_REPEAT. */
    int ws_max;
    /* No whitespace before and after the document (between its tokens,
     * ws_max still applies): generation then ends right after the value's
     * last byte. Default false. */
    bool no_outer_ws;
    /* Literal bytes before and after the document (any bytes; borrowed,
     * copied into the grammar): the documents become prefix + JSON +
     * suffix, e.g. a forced tool call's opening markup, the arguments of
     * schema S, its closing markup. Default none (NULL, 0). */
    const char *prefix, *suffix;
    size_t prefix_len, suffix_len;
    /* Polled during the compile (borrowed); NULL: never stops. */
    const kp_grammar_stop *stop;
} kp_schema_opts;

/* ws_max 20, outer whitespace allowed, no prefix or suffix. */
kp_schema_opts kp_schema_opts_default(void);

/* Compiles a JSON Schema (an object or a boolean) into a grammar whose
 * documents are exactly the JSON texts that (a) validate against the
 * schema and (b) have the output shape described in schema.c: object
 * properties in the schema's order (required ones present, optional ones
 * may be left out, additional ones after the declared ones), at most
 * ws_max whitespace bytes between tokens, numbers per RFC 8259 within
 * bounded digit counts, enum/const values in one canonical spelling.
 * schema is borrowed. o NULL: defaults. Errors: KP_EUNSUPPORTED naming the
 * keyword and its JSON path ("unsupported keyword 'pattern' at
 * #/properties/a"), KP_EINVAL for malformed or unsatisfiable schemas (with
 * the path), KP_ERANGE for counts beyond KP_GRAMMAR_MAX_REPEAT or a grammar
 * beyond KP_GRAMMAR_MAX_ELEMS, KP_ENOMEM. On success *out is the caller's
 * (kp_grammar_free). */
kp_status kp_grammar_compile_schema(const json_t *schema, const kp_schema_opts *o, kp_grammar **out,
                                    kp_error *err);

/* OpenAI's response_format {"type": "json_object"}: any JSON object (with
 * ws_max whitespace between tokens). */
kp_status kp_grammar_json_object(const kp_schema_opts *o, kp_grammar **out, kp_error *err);

/* Compiles llama.cpp's GBNF (text[0..len), UTF-8): rules `name ::= alts`
 * separated by newlines, "literals" and [classes] with \n \r \t \\ \" \[ \]
 * \xHH \uHHHH \UHHHHHHHH escapes, [^...] negation, `.` any character,
 * ( groups ), `|`, postfix * + ? {m} {m,} {m,n}, # comments; `root` is the
 * start. Classes and `.` are over Unicode code points and match their UTF-8
 * bytes. Errors: KP_EINVAL with the line and column ("gbnf:3:7: expecting
 * '::='"), or naming the rule (undefined, defined twice, left-recursive,
 * no finite expansion); KP_EUNSUPPORTED for token references <...>;
 * KP_ERANGE, KP_ENOMEM as above. */
kp_status kp_grammar_compile_gbnf(const char *text, size_t len, kp_grammar **out, kp_error *err);
/* The same, polling stop (NULL: never stops). */
kp_status kp_grammar_compile_gbnf_stop(const char *text, size_t len, const kp_grammar_stop *stop, kp_grammar **out,
                                       kp_error *err);

/* A grammar made of parts: documents are one of the first alternatives,
 * then up to max_count - 1 times one of the more alternatives, then the
 * suffix bytes (a message of tool calls in a template's own markup:
 * literal markup around each tool's arguments; the markup in front of a
 * second call is not the first's). An alternative is a sequence of pieces:
 *
 *   KP_GPIECE_LIT   the bytes[0..len) as they are
 *   KP_GPIECE_JSON  a JSON document of schema (borrowed; $ref resolved in
 *                   it), as kp_grammar_compile_schema writes documents,
 *                   compact: no whitespace between tokens or around
 *   KP_GPIECE_TEXT  text: one or more code points, none of them a control
 *                   character or one of the ASCII bytes[0..len) (a value
 *                   written raw up to the markup that closes it, e.g.
 *                   every character but '<')
 *
 * Consecutive pieces with the same nonzero group are optional together.
 * Errors as kp_grammar_compile_schema's (a schema's keyword and path),
 * KP_EINVAL for no first alternatives or an empty alternative. */
typedef enum { KP_GPIECE_LIT, KP_GPIECE_JSON, KP_GPIECE_TEXT } kp_gpiece_kind;
typedef struct {
    kp_gpiece_kind kind;
    const char *bytes;
    size_t len;
    const json_t *schema;
    uint32_t group;
} kp_gpiece;
typedef struct {
    kp_gpiece *pieces;
    size_t n;
} kp_galt;
kp_status kp_grammar_compile_alts(const kp_galt *first, size_t n_first, const kp_galt *more, size_t n_more,
                                  uint32_t max_count, const char *suffix, size_t suffix_len, kp_grammar **out,
                                  kp_error *err);

/* Grammars are reference counted (atomically: any thread may take and
 * drop references). kp_grammar_ref takes one more and returns g;
 * kp_grammar_free drops one and frees g with the last. A compiled grammar
 * starts with one, the caller's. NULL is a no-op for both. */
kp_grammar *kp_grammar_ref(kp_grammar *g);
void kp_grammar_free(kp_grammar *g);

/* Appends a GBNF-like listing of the compiled grammar to out (one rule per
 * line; classes are byte ranges, written \xHH for non-ASCII bytes, so the
 * listing is for reading, not for kp_grammar_compile_gbnf). false when out
 * ran out of memory. */
bool kp_grammar_dump(const kp_grammar *g, kp_buf *out);

/* Number of rules and elements (sizes for logs and tests). */
size_t kp_grammar_n_rules(const kp_grammar *g);
size_t kp_grammar_n_elems(const kp_grammar *g);

/* ---- the vocabulary index ---- */

/* Builds the byte trie of every token of v (pieces copied: v may be freed
 * afterwards). Errors: KP_EINVAL (NULL), KP_ENOMEM. */
kp_status kp_gvocab_new(kp_gvocab **out, const kp_tok_vocab *v, kp_error *err);

/* The same from raw pieces (benchmarks and tests with synthetic
 * vocabularies): token i has bytes pieces[i][0..lens[i]); eog[i] nonzero
 * marks an end-of-generation token (eog may be NULL: none). Copied. */
kp_status kp_gvocab_new_raw(kp_gvocab **out, int32_t n_vocab, const char *const *pieces,
                            const size_t *lens, const uint8_t *eog, kp_error *err);

void kp_gvocab_free(kp_gvocab *gv); /* NULL is a no-op */

int32_t kp_gvocab_n_vocab(const kp_gvocab *gv);
/* uint32_t words of a mask: (n_vocab + 31) / 32. Token id t is bit t % 32 of
 * word t / 32. */
size_t kp_gvocab_mask_words(const kp_gvocab *gv);
/* Trie nodes and the longest piece (bytes), for logs. */
size_t kp_gvocab_n_nodes(const kp_gvocab *gv);
size_t kp_gvocab_max_len(const kp_gvocab *gv);

/* ---- the matcher ---- */

/* A matcher at the start of g, for tokens of gv; both borrowed (they must
 * outlive it and its clones). Errors: KP_EINVAL (NULL), KP_EFULL (the
 * start alone exceeds the bounds), KP_ENOMEM. */
kp_status kp_gmatch_new(kp_gmatch **out, const kp_grammar *g, const kp_gvocab *gv, kp_error *err);
void kp_gmatch_free(kp_gmatch *m); /* NULL is a no-op */

/* An independent matcher in the same state (its stacks copied, its mask
 * cache shared with m: use m and its clones from one thread at a time). */
kp_status kp_gmatch_clone(kp_gmatch **out, const kp_gmatch *m, kp_error *err);

/* The vocabulary index m was made for (kp_gvocab_mask_words of it sizes
 * m's masks). */
const kp_gvocab *kp_gmatch_vocab(const kp_gmatch *m);

/* The grammar m matches (borrowed from its creator). */
const kp_grammar *kp_gmatch_grammar(const kp_gmatch *m);

/* Back to the start of the grammar (the caches stay: the mask cache shared
 * with the clones, and m's own memo of parse-stack transitions, which a
 * fresh clone lacks; a server reuses finished matchers for that). */
void kp_gmatch_reset(kp_gmatch *m);

/* Feeds bytes. All or nothing: on any error the matcher is unchanged.
 * KP_EINVAL "byte 0x.. at offset N is not allowed" when the grammar
 * rejects them (or the matcher has finished), KP_EFULL at the bounds. */
kp_status kp_gmatch_accept_bytes(kp_gmatch *m, const void *bytes, size_t n, kp_error *err);

/* Feeds one token: its piece's bytes, or for an end-of-generation token
 * the end of the document (allowed only when complete; the matcher is then
 * finished and accepts nothing more). KP_EINVAL for an id out of range, a
 * token with an empty piece, or one the grammar rejects (unchanged). */
kp_status kp_gmatch_accept_token(kp_gmatch *m, int32_t id, kp_error *err);

/* The input so far is a whole document (end-of-generation is allowed). */
bool kp_gmatch_complete(const kp_gmatch *m);
/* Some byte may follow (the input is a proper prefix of a document). */
bool kp_gmatch_can_continue(const kp_gmatch *m);
/* An end-of-generation token was accepted. */
bool kp_gmatch_finished(const kp_gmatch *m);

/* The allowed tokens of the current state as a bitset of
 * kp_gvocab_mask_words(gv) words (overwritten entirely); *n_allowed (may be
 * NULL) receives their count. 0 allowed is not an error: the document is
 * complete and the vocabulary has no end-of-generation token, or the
 * matcher has finished. KP_EFULL when some tokens could not be checked
 * within the bounds AND no token is allowed (tokens that exceed a bound
 * are left out of the mask, since accepting them would fail too);
 * KP_ENOMEM. */
kp_status kp_gmatch_mask(kp_gmatch *m, uint32_t *mask, size_t *n_allowed, kp_error *err);

/* The shortest byte string that makes the input a complete document
 * (empty when it already is), appended to out; KP_ERANGE when longer than
 * max_len bytes, KP_EINVAL when the matcher has finished, KP_ENOMEM.
 * For closing a document that ran out of tokens, and for tests. */
kp_status kp_gmatch_completion(const kp_gmatch *m, size_t max_len, kp_buf *out, kp_error *err);

/* Sets logits[i] = -INFINITY for every i < n_logits whose bit is clear
 * (ids beyond the mask, i >= n_vocab, are cleared too). */
void kp_gmask_apply(const uint32_t *mask, size_t mask_words, float *logits, size_t n_logits);

/* Counters since kp_gmatch_new, for benchmarks: mask calls, mask cache
 * entries computed (each a walk of the vocabulary trie) and found,
 * uncertain tokens checked against the full stack, matcher steps taken by
 * those walks (one per trie node or token byte visited), tokens left out
 * for a bound, compactions and cache flushes. */
typedef struct {
    uint64_t masks, entries_built, entry_hits, unc_checked, walk_steps, bound_skips, flushes;
    size_t cache_bytes;
} kp_gmatch_stats;
void kp_gmatch_get_stats(const kp_gmatch *m, kp_gmatch_stats *st);

#endif
