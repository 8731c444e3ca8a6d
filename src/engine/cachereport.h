/*
 * cachereport.h - the cache report of one request (floor 6).
 *
 * The engine says how many tokens a request reused and where it left the
 * prefix index (kp_eng_report); doctor explains a divergence from two texts.
 * This module joins them: it keeps a bounded history of the token sequences
 * that finished recently (what the cache was filled with), picks the one
 * sharing the longest token prefix with a request, detokenizes both and lets
 * doctor find the byte offset, the snippets and the cause:
 *
 *   history (newest first, at most max_entries / max_tokens in all)
 *     [ sys + turn1 + answer1 + turn2 ... ]  <- longest common prefix: cached text
 *     [ other agent's spec ... ]
 *   request tokens -> request text; kp_eng_report.diverged_at_token -> byte
 *
 * A generation ends here too: kp_cachereport_finish indexes what its sequence
 * computed (kp_eng_finish) and adds those tokens to the history, the one
 * place the server's scheduler, the library's kp_generate and `kvpin run
 * --prompt-cache` end a generated sequence.
 *
 * Not thread-safe; the server calls it from its engine thread.
 */
#ifndef KP_CACHEREPORT_H
#define KP_CACHEREPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/doctor.h"
#include "engine/engine.h"
#include "base/status.h"
#include "tok/tok.h"

typedef struct kp_cachereport kp_cachereport;

/* v is borrowed. The history holds at most max_entries sequences and
 * max_tokens tokens in all (the oldest go first). */
kp_status kp_cachereport_new(kp_cachereport **out, const kp_tok_vocab *v, uint32_t max_entries, uint64_t max_tokens,
                      kp_error *err);
void kp_cachereport_free(kp_cachereport *c); /* NULL is a no-op */

/* Remembers a finished sequence (copied). A sequence that is a prefix of an
 * entry adds nothing; an entry that is a prefix of it is replaced. */
kp_status kp_cachereport_add(kp_cachereport *c, const int32_t *tokens, uint32_t n, kp_error *err);

/* Ends the sequence of a generation on engine e: indexes what it computed
 * - tokens[0..min(n, kp_eng_seq_len(seq))), the tokens it was fed in order,
 * the prompt then the decoded answer (kp_gen_tokens and kp_gen_n_tokens of
 * its kp_gen) - with kp_eng_finish, then remembers the same tokens in the
 * history c (kp_cachereport_add; c NULL: no history). A sequence that holds no
 * position is released (kp_eng_seq_abort) and nothing is indexed or added.
 * Either way *seq is {0} afterwards. *n_added (may be NULL) receives the
 * positions newly indexed. Returns kp_eng_finish's status (KP_ENOMEM when
 * the index could not grow; the tokens still go into the history), else
 * kp_cachereport_add's. */
kp_status kp_cachereport_finish(kp_cachereport *c, kp_engine *e, kp_eng_seq *seq, const int32_t *tokens, uint32_t n,
                         uint32_t *n_added, kp_error *err);

/* Forgets everything (the cache was cleared). */
void kp_cachereport_clear(kp_cachereport *c);

/* The report of tokens[0..n) given what the engine did (r from kp_eng_begin or
 * kp_eng_probe). text (may be NULL) is the request's own text, the prompt the
 * tokens came from: byte offsets then refer to it, and the cached text is
 * aligned with it (what detokenizing puts in front of the text, such as the
 * SPM space prefix, is dropped from both). Without it both texts are the
 * detokenized ids. Control tokens are rendered as their text. Snippets are
 * escaped in `mode`. KP_ENOMEM, or doctor's errors. */
kp_status kp_cachereport_explain(kp_cachereport *c, const int32_t *tokens, uint32_t n, const char *text, size_t text_len,
                          const kp_eng_report *r, kp_doctor_escape mode, kp_doctor_report *out, kp_error *err);

/* kp_cachereport_explain with what the chat layer knows of the request
 * (hints may be NULL): the doctor then names a template that rewrites an
 * earlier turn (template_rewrites_history). */
kp_status kp_cachereport_explain_hinted(kp_cachereport *c, const int32_t *tokens, uint32_t n, const char *text,
                                        size_t text_len, const kp_eng_report *r, const kp_doctor_hints *hints,
                                        kp_doctor_escape mode, kp_doctor_report *out, kp_error *err);

/* What the doctor needs to know of the tokens (kp_doctor_tokens): token k of
 * ids[0..n) is the first that differs from the cached ids; its byte span in
 * text (as kp_cachereport_token_byte, the start clamped to text_div, the
 * first byte where the request text and the cached text differ) and, when
 * cached_ids (may be NULL) holds another token at k whose request
 * counterpart lies wholly before text_div, the span's end and the cached
 * token's text: the same text tokenized differently (cause retokenized). */
kp_doctor_tokens kp_cachereport_tokens(const kp_tok_vocab *v, const int32_t *ids, size_t n, size_t k, const char *text,
                                       size_t len, bool special, size_t text_div, const int32_t *cached_ids,
                                       size_t cached_n);

/* The byte offset in the detokenized text of ids[0..n) where token k
 * starts (detokenizing renders ids as one text; a leading space the
 * tokenizer adds in front is not counted), clamped to limit. */
size_t kp_cachereport_token_byte(const kp_tok_vocab *v, const int32_t *ids, size_t n, size_t k, const char *text,
                          size_t len, bool special, size_t limit);

#endif
