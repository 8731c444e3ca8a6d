/*
 * jinja.h - the Jinja template interpreter (floor 1): chat templates as
 * Hugging Face transformers renders them, over JSON values.
 *
 * The semantics are jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks, lstrip_blocks and the loopcontrols extension, plus
 * transformers' additions: the globals raise_exception(msg) and
 * strftime_now(fmt) and the {% generation %} block (its body is rendered).
 * One kvpin choice differs from transformers on purpose: `tojson` writes
 * RFC 8785 canonical JSON (base/canon.h) whatever its arguments, so that a
 * client's key order and spacing never change a prompt.
 *
 *   kp_jinja *t; kp_jinja_error e;
 *   if (kp_jinja_compile(src, len, &t, &e) != KP_OK) ... e.line, e.col, e.msg
 *   kp_buf out = {0};
 *   if (kp_jinja_render(t, ctx, &out, &e) != KP_OK) ... e.kind == KP_JINJA_ERAISED
 *   kp_jinja_free(t);
 *
 * A compiled template is immutable: any number of threads may render it at
 * once (each render allocates its values in its own arena).
 *
 * Limits (hostile templates fail fast with KP_JINJA_ELIMIT, see README):
 * KP_JINJA_MAX_STEPS statements, loop iterations and calls per render,
 * KP_JINJA_MAX_DEPTH nested macro calls, KP_JINJA_MAX_RECURSION levels of
 * expressions and blocks open at once (the C stack), KP_JINJA_MAX_OUTPUT bytes of
 * output, KP_JINJA_MAX_STRING bytes per string, KP_JINJA_MAX_ITEMS items
 * per list, KP_JINJA_MAX_MEMORY bytes of values per render, and
 * KP_JINJA_MAX_NESTING levels of nested expressions and blocks at parse.
 */
#ifndef KP_JINJA_H
#define KP_JINJA_H

#include <jansson.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

#define KP_JINJA_MAX_STEPS   10000000L
#define KP_JINJA_MAX_DEPTH   100
#define KP_JINJA_MAX_OUTPUT  (64L << 20)
#define KP_JINJA_MAX_STRING  (16L << 20)
#define KP_JINJA_MAX_ITEMS   1000000L
#define KP_JINJA_MAX_MEMORY  (512L << 20)
#define KP_JINJA_MAX_NESTING 200
#define KP_JINJA_MAX_RECURSION 2000

/* What went wrong, after the Python exception jinja2 would raise. */
typedef enum {
    KP_JINJA_OK = 0,
    KP_JINJA_ESYNTAX,    /* TemplateSyntaxError: the template does not parse */
    KP_JINJA_ERAISED,    /* the template called raise_exception(msg); msg is exactly msg */
    KP_JINJA_EUNDEFINED, /* UndefinedError: an undefined value used in a way that fails */
    KP_JINJA_ETYPE,      /* TypeError: an operation on the wrong types */
    KP_JINJA_EVALUE,     /* ValueError, KeyError, IndexError, ZeroDivisionError and the like */
    KP_JINJA_ESECURITY,  /* SecurityError: the sandbox refused (list.append, dict.update...) */
    KP_JINJA_ELIMIT,     /* a limit above was reached */
    KP_JINJA_ENOMEM      /* out of memory */
} kp_jinja_kind;

typedef struct {
    kp_status code;     /* KP_OK, KP_EFORMAT (syntax), KP_EINVAL (render), KP_ERANGE, KP_ENOMEM */
    kp_jinja_kind kind;
    int line, col;      /* 1-based position in the template; 0 when unknown */
    char msg[KP_ERROR_MSG_MAX];
} kp_jinja_error;

typedef struct kp_jinja kp_jinja;

/* Compiles the template text src[0..len) (UTF-8; "\r\n" and "\r" read as
 * "\n", one trailing newline dropped as jinja2 does). On success *out is the
 * template, freed with kp_jinja_free. On failure *out is NULL and err (may be
 * NULL) says where and why. */
kp_status kp_jinja_compile(const char *src, size_t len, kp_jinja **out, kp_jinja_error *err);

/* Renders t with the variables of the JSON object ctx (borrowed; NULL means
 * none) appended to out. On failure out is left as it was before the call
 * and err is set; a raise_exception message is err->msg verbatim. The
 * current time of strftime_now is SOURCE_DATE_EPOCH when set. */
kp_status kp_jinja_render(const kp_jinja *t, const json_t *ctx, kp_buf *out, kp_jinja_error *err);

/* A byte range [start, start + len) of a rendering. */
typedef struct {
    size_t start, len;
} kp_jinja_range;

/* kp_jinja_render, also telling which output bytes came from client text.
 * client is a NULL-terminated list of names of ctx's members (borrowed)
 * every string of which, keys included, is client text ("messages",
 * "tools"); the other members (bos_token, kwargs) and the template's
 * literals are markup. *ranges (malloc'd, the caller frees; NULL when
 * there are none) receives *n_ranges ranges of out->data, sorted,
 * disjoint and not adjacent, holding every output byte derived from client
 * text through whatever the template did to it (see taint.c: `~`, `+`,
 * `*`, slicing, indexing, iteration, strip and split keep each byte's
 * origin; any other filter, method or `%` makes the strings it builds
 * from client text client text whole, literal bytes included). The rule is conservative: a byte that
 * client text helped form is client text. Errors as kp_jinja_render
 * (*ranges NULL, *n_ranges 0). */
kp_status kp_jinja_render_client(const kp_jinja *t, const json_t *ctx, const char *const *client, kp_buf *out,
                                 kp_jinja_range **ranges, size_t *n_ranges, kp_jinja_error *err);

/* The template line that wrote byte `byte` of t's rendering of ctx into
 * *line (1-based; 0 when the rendering is shorter): the line of the
 * statement that output it ({{ ... }}, a call block, a filter block), or,
 * for template text, the line the byte stands on. Bytes a macro writes
 * count as written where the macro's output is ({{ macro(...) }}).
 * Renders once more (errors as kp_jinja_render). For saying where a
 * template rewrites a conversation's earlier turns. */
kp_status kp_jinja_line_at(const kp_jinja *t, const json_t *ctx, size_t byte, int *line, kp_jinja_error *err);

/* Bytes the compiled template uses (its text, syntax tree and strings;
 * the arena's unused tail of its last chunk is not counted). */
size_t kp_jinja_size(const kp_jinja *t);

/* The exception name jinja2 would raise for kind ("TemplateSyntaxError", ...). */
const char *kp_jinja_kind_name(kp_jinja_kind kind);

void kp_jinja_free(kp_jinja *t);

#endif
