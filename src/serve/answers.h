/*
 * answers.h - kvpin's own answers, remembered as the tokens the model
 * wrote (floor 7).
 *
 * An agent sends the assistant message it received back with the next
 * turn. The template renders it again, but tokenizing that text does not
 * always give the tokens the model generated (a model may write "{"
 * and "\"" where the tokenizer makes one "{\"" token, any split of a word
 * it likes): from the first such token on, the prefix cache would compute
 * the rest of the prompt again, every turn. So each chat answer that ended
 * on an end-of-generation token is remembered as
 *
 *   text = the prompt's rendering + the pieces of the generated tokens (the
 *          control tokens' texts included), the end token left out
 *   ids  = the prompt's tokens + the generated ones, the same
 *
 * and a later prompt whose rendering starts with that text, byte for byte,
 * takes those ids for it; only the rest is tokenized. Such an entry is
 * "open": it counts only when the template's markup that follows (which
 * closes the turn) starts with a control token, so that nothing could have
 * merged across the split (the caller checks: kp_answers_match's *open).
 * The tokens then are the ones whose K/V the cache holds (the end token
 * was sampled, never fed).
 *
 * Never wrong: the ids are a tokenization of exactly those bytes (the one
 * the model used); a rendering that differs in any byte does not match.
 * Bounded: at most max_bytes of texts and ids, the least recently matched
 * or stored dropped first. Thread-safe (one mutex; a lookup compares the
 * tail, then the whole text, of the entries no longer than the prompt).
 */
#ifndef KP_ANSWERS_H
#define KP_ANSWERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kp_answers kp_answers;

/* An empty memory of at most max_bytes (> 0). KP_ENOMEM. */
kp_status kp_answers_new(kp_answers **out, size_t max_bytes, kp_error *err);
void kp_answers_free(kp_answers *a); /* NULL is a no-op */

/* Remembers that text[0..len) is the tokens ids[0..n) (both copied); open:
 * they do not end on a control token. An entry larger than the whole
 * memory, or when memory runs out, is not kept. The same text again
 * refreshes its entry. */
void kp_answers_put(kp_answers *a, const char *text, size_t len, const int32_t *ids, size_t n, bool open);

/* The longest remembered text that text[0..len) starts with: its length
 * (0: none), a copy of its ids in *ids (malloc'd, *n of them; NULL and 0
 * when none or out of memory, then 0 is returned) and whether it is open
 * (the tokens that follow must start with a control token to use it). */
size_t kp_answers_match(kp_answers *a, const char *text, size_t len, int32_t **ids, size_t *n, bool *open);

/* Entries, bytes held, matches found and answers stored so far. */
void kp_answers_counts(kp_answers *a, size_t *entries, size_t *bytes, uint64_t *matches, uint64_t *stored);

#endif
