/*
 * volatile.h - system text that changes every session, left out of the
 * prompt so that a stable prefix stays stable (floor 7).
 *
 * Some clients put a per-session value at the very start of their system
 * prompt: Claude Code's first system block is
 *
 *   x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;
 *
 * where the characters after the version change with each session's first
 * prompt, so every new session would recompute the whole 28k-token system
 * prompt and tools behind it. A volatile pattern names such text: a PCRE2
 * regular expression matched at the start of each text of a system
 * message (its string content, or each of its text parts); the matched
 * bytes are dropped, and a text (a part, a message) left empty is dropped
 * whole. Only system messages are touched, and only at the start of a
 * text, so what a user wrote is never edited.
 *
 * The built-in patterns (on unless the server is started with
 * --keep-volatile) are the known clients' (VOLATILE_BUILTINS in
 * volatile.c); --volatile-prefix REGEX adds one. Each request's report
 * says what was dropped (kvpin_cache.dropped_volatile_block).
 */
#ifndef KP_VOLATILE_H
#define KP_VOLATILE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define KP_VOLATILE_MAX 16 /* patterns at most (built-ins included) */

typedef struct kp_volatile kp_volatile;

/* What one conversation had dropped. */
typedef struct {
    uint32_t texts;    /* system texts shortened or dropped */
    uint32_t bytes;    /* bytes dropped */
    uint32_t patterns; /* bit i: pattern i matched (kp_volatile_name) */
} kp_volatile_report;

/* Compiles the built-in patterns (unless keep_builtins is false) and
 * patterns[0..n). KP_EINVAL naming the pattern and PCRE2's message when
 * one does not compile, KP_ERANGE past KP_VOLATILE_MAX. *out NULL with
 * nothing to match is fine too (kp_volatile_strip then copies nothing). */
kp_status kp_volatile_new(kp_volatile **out, bool builtins, const char *const *patterns, size_t n, kp_error *err);
void kp_volatile_free(kp_volatile *v);

/* How many patterns there are, and pattern i's name: the built-in's
 * ("claude-code-billing") or the expression given. */
uint32_t kp_volatile_count(const kp_volatile *v);
const char *kp_volatile_name(const kp_volatile *v, uint32_t i);

/* messages (a chat messages array, borrowed) with the volatile start of
 * every system text dropped, as a new reference: messages itself when
 * nothing matched (v NULL too), else a copy. *rep (may be NULL) says what
 * was dropped. NULL when out of memory. */
json_t *kp_volatile_strip(const kp_volatile *v, const json_t *messages, kp_volatile_report *rep);

/* The report as kvpin_cache's "dropped_volatile_block" object {texts,
 * bytes, patterns: [names]}, or NULL when nothing was dropped. */
json_t *kp_volatile_report_json(const kp_volatile *v, const kp_volatile_report *rep);

#endif
