/*
 * textout.h - generated token ids to the text a client may see (floor 3).
 *
 * Wraps a kp_tok_stream (which assembles UTF-8 characters split across tokens)
 * and applies stop strings: text that could still turn out to begin a stop
 * string is held back until it cannot, and text from a stop string on is
 * never released. So a caller can stream every released byte at once and
 * never has to take text back:
 *
 *   generated : "... the end.\n\nUser:"      stop string "\nUser:"
 *   released  : "... the end.\n"             (held "\nUser" until ':' decided)
 *   stopped   : yes; nothing after the stop string is released
 *
 * Optionally drops the single leading space the SPM tokenizers put in front
 * of the first word (when generation starts right after BOS).
 */
#ifndef KP_TEXTOUT_H
#define KP_TEXTOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tok/tok.h"

#define KP_TEXTOUT_MAX_STOPS 16

typedef struct kp_textout kp_textout;

/* v is borrowed (must outlive the textout); the stop strings are copied.
 * At most KP_TEXTOUT_MAX_STOPS non-empty stops (KP_EINVAL otherwise).
 * special: render control tokens as their text. strip_space: drop one
 * leading ' ' of the first released text. */
kp_status kp_textout_new(kp_textout **out, const kp_tok_vocab *v, const char *const *stops, int n_stops,
                         bool special, bool strip_space, kp_error *err);
void kp_textout_free(kp_textout *t); /* NULL is a no-op */

/* Feeds one generated id. *text / *n receive the newly released bytes
 * (possibly none; the pointer stays valid until the next call); *stopped is
 * set when a stop string has now occurred (then nothing more is ever
 * released). KP_EINVAL for an id out of range, KP_ENOMEM. */
kp_status kp_textout_push(kp_textout *t, int32_t id, const char **text, size_t *n, bool *stopped,
                          kp_error *err);

/* The end of generation (length, end-of-generation token): releases what
 * was held back, incl. the replacement of an incomplete UTF-8 character.
 * Nothing after a stop. */
void kp_textout_finish(kp_textout *t, const char **text, size_t *n);

/* Bytes released so far. */
size_t kp_textout_released(const kp_textout *t);

#endif
