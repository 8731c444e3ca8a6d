/*
 * gcache.h - compiled grammars of requests, by what was asked (floor 7).
 *
 * Agent loops send the same response_format (or GBNF grammar) with every
 * turn; compiling it each time would cost a compile and, worse, a cold
 * mask cache (the scheduler keeps warm matchers per kp_grammar pointer).
 * A kp_gcache maps the request's constraint to one shared, immutable
 * kp_grammar:
 *
 *   key = kind byte + canonical bytes (RFC 8785, base/canon.h) of the
 *         schema and the order of its member names (the output follows
 *         the schema's property order, which canonical bytes sort away),
 *         or the GBNF text as sent
 *   entries: at most cap, least recently used evicted; each holds one
 *            reference to its grammar (requests hold their own)
 *
 * Thread-safe: one mutex around the table; compiling happens outside it
 * (two threads missing on the same key both compile, the second result is
 * kept only if the key is still absent).
 *
 * Grammars for requests are compiled with no whitespace before or after
 * the document (kp_schema_opts.no_outer_ws), so generation stops right
 * after the value's last byte, and at most KP_GCACHE_WS bytes of
 * whitespace between two JSON tokens; none in a framed document (a forced
 * tool call, written compact as the template writes the call back).
 */
#ifndef KP_GCACHE_H
#define KP_GCACHE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "grammar/grammar.h"

#define KP_GCACHE_WS 1

typedef enum {
    KP_GC_JSON_OBJECT = 1, /* response_format json_object: any JSON object */
    KP_GC_SCHEMA,          /* a JSON Schema */
    KP_GC_GBNF,            /* llama.cpp's GBNF text */
    KP_GC_FRAMED           /* literal bytes + a document of a JSON Schema + literal bytes
                              (a forced tool call: kp_gcache_get_framed) */
} kp_gc_kind;

/* The literal bytes around a framed schema's document (borrowed). */
typedef struct {
    const char *prefix, *suffix;
    size_t prefix_len, suffix_len;
} kp_gc_frame;

typedef struct kp_gcache kp_gcache;

/* An empty cache of at most cap entries (cap >= 1). KP_EINVAL, KP_ENOMEM. */
kp_status kp_gcache_new(kp_gcache **out, size_t cap, kp_error *err);
void kp_gcache_free(kp_gcache *c); /* NULL is a no-op; requests keep their references */

/* The grammar for a constraint: kind JSON_OBJECT (schema and text
 * unused), SCHEMA (schema, borrowed) or GBNF (text[0..len)). *out is a
 * new reference for the caller (kp_grammar_free). A compile polls stop
 * (borrowed, NULL: never stops): the server's says whether the client left.
 * Errors are the compiler's (KP_EUNSUPPORTED naming a keyword and its
 * path, KP_EINVAL, KP_ERANGE for a limit of grammar.h, KP_EIO when stop
 * said stop) or KP_ENOMEM; nothing is cached for a failed compile. */
kp_status kp_gcache_get(kp_gcache *c, kp_gc_kind kind, const json_t *schema, const char *text, size_t len,
                        const kp_grammar_stop *stop, kp_grammar **out, kp_error *err);

/* The grammar of prefix + a document of schema + suffix (fr's bytes and
 * the schema borrowed; the key covers all three), compiled as for
 * KP_GC_SCHEMA. Used for forced tool calls, whose frame is the template's
 * call markup (serve/chat.h kp_chat_call_form_build). Errors as above. */
kp_status kp_gcache_get_framed(kp_gcache *c, const json_t *schema, const kp_gc_frame *fr, const kp_grammar_stop *stop,
                               kp_grammar **out, kp_error *err);

/* Counters: lookups that found a compiled grammar, and compiles. */
void kp_gcache_counts(kp_gcache *c, uint64_t *hits, uint64_t *compiles);

#endif
