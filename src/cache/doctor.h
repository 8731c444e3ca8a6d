/*
 * doctor.h - why a prompt missed the prefix cache.
 *
 * kvpin reuses cached K/V up to the first token where a new prompt differs
 * from what is cached. This module explains a miss from the two texts alone
 * (no model, no tokenizer, no cache): where the request diverged from the
 * longest cached match, what the two texts look like there, what kind of
 * change it was, and one sentence of advice.
 *
 *   cached : "System: today is 2026-11-28 09:14.\nYou are a helpful ..."
 *   request: "System: today is 2026-11-29 10:02.\nYou are a helpful ..."
 *                                    ^ byte 26, line 1
 *            shared (K/V reused)    | recomputed from here on
 *
 * The pieces, each usable alone:
 *
 *   kp_doctor_diverge   first differing byte (on a UTF-8 character start), the
 *                    token-level reuse point, the share of the prompt
 *                    recomputed;
 *   kp_doctor_classify  the cause (kp_doctor_cause) and a one-line detail, the line
 *                    of the divergence and whether it lies inside JSON;
 *   kp_doctor_snippet   ~40 characters of text around a byte offset, valid
 *                    UTF-8, control characters escaped;
 *   kp_doctor_advice    one sentence for a person, e.g. "turn 3 re-prefills 97%
 *                    of its prompt: line 2 holds a timestamp that changes
 *                    every turn (...); move it to the end of the prompt";
 *   kp_doctor_explain   all of the above in one kp_doctor_report.
 *
 * Every function is pure: no global state, safe from any number of threads.
 * Texts are byte strings with explicit lengths (NUL bytes allowed); they are
 * borrowed for the duration of the call only.
 */
#ifndef KP_DOCTOR_H
#define KP_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* Why the request did not reuse more of the cache. The names returned by
 * kp_doctor_cause_name are stable (logs, JSON, metrics labels). */
typedef enum {
    KP_DOCTOR_CAUSE_HIT = 0,            /* "hit": the request starts with the whole
                                        cached text, or is covered by it;
                                        nothing was missed */
    KP_DOCTOR_CAUSE_COLD,               /* "cold": nothing cached shares the start */
    KP_DOCTOR_CAUSE_EVICTED,            /* "evicted": a matching prefix was cached but
                                        its blocks were evicted (the caller, which
                                        owns the prefix index, decides this) */
    KP_DOCTOR_CAUSE_TIMESTAMP,          /* "timestamp": a date or time changed */
    KP_DOCTOR_CAUSE_COUNTER,            /* "counter": a number changed */
    KP_DOCTOR_CAUSE_IDENTIFIER,         /* "identifier": a UUID, hex id, request id or
                                        base64-like token changed */
    KP_DOCTOR_CAUSE_REORDERED_JSON,     /* "reordered_json": the same JSON keys in
                                        another order */
    KP_DOCTOR_CAUSE_WHITESPACE,         /* "whitespace": equal once whitespace is
                                        ignored (CRLF vs LF, trailing spaces,
                                        indentation, JSON formatting) */
    KP_DOCTOR_CAUSE_INSERTED_AT_FRONT,  /* "inserted_at_front": text inserted before
                                        text that was cached, which follows intact
                                        (a summary prepended, a head rewritten) */
    KP_DOCTOR_CAUSE_OTHER,              /* "other": any other edit */
    KP_DOCTOR_CAUSE_RETOKENIZED,        /* "retokenized": the same text, split into
                                        other tokens than the cached ones (a
                                        model's answer sent back as text and
                                        tokenized anew); needs token spans */
    KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY, /* "template_rewrites_history": the chat
                                        template renders an earlier turn otherwise
                                        once another follows (Qwen 3 drops the
                                        reasoning of earlier answers); needs the
                                        chat layer's hints */
    KP_DOCTOR_CAUSE_NEW_PREFIX,         /* "new_prefix": the request shares only a
                                        short start with the cache (the chat
                                        template's opening markup, a system
                                        prompt) and goes on as another text, none
                                        of which resumes later: a different
                                        conversation, not an edit */
    KP_DOCTOR_CAUSE_WINDOW_EVICTED,     /* "window_evicted": the tokens matched
                                        further, but the sliding-window layers'
                                        K/V before that point was dropped (a
                                        window budget), so reuse resumed at the
                                        latest position whose window was held;
                                        the caller, which owns the cache,
                                        decides this */
    KP_DOCTOR_CAUSE_RECURRENT_STATE,    /* "recurrent_state": the model has
                                        recurrent layers whose state cannot be
                                        cut back to a shared prefix, so nothing
                                        cached is reused; no longer reported
                                        since the prefix index keeps state
                                        snapshots (state_checkpoint), kept so
                                        the numbers stay */
    KP_DOCTOR_CAUSE_STATE_CHECKPOINT,   /* "state_checkpoint": the tokens matched
                                        further, but the model's recurrent state
                                        was snapshotted last before that point
                                        (or was evicted there), so reuse resumed
                                        at the latest snapshot and the matched
                                        tokens after it were computed again; the
                                        caller decides this too */
    KP_DOCTOR_CAUSE_COUNT
} kp_doctor_cause;

/* The stable name of a cause ("timestamp", ...); "invalid" for a value
 * outside the enum. The string is static. */
const char *kp_doctor_cause_name(kp_doctor_cause cause);

/* Parses a stable name (exact, case-sensitive) into *out. KP_ENOTFOUND (and
 * a message naming the text) for an unknown name, KP_EINVAL for NULL. */
kp_status kp_doctor_cause_parse(const char *name, kp_doctor_cause *out, kp_error *err);

/* ------------------------------------------------------------------ */
/* Divergence                                                          */

#define KP_DOCTOR_NO_TOKEN ((size_t)-1)

/* What the chat layer knows of a request (optional; zeroed: nothing). */
typedef struct {
    size_t rewrite_byte;        /* > 0: the template's rendering of the conversation up
                                   to its last answer (as the answer's own turn) stops
                                   being a prefix of this prompt at this byte */
    const char *reasoning_open; /* the template's reasoning marker ("<think>"), or NULL:
                                   cached reasoning missing from the request at the
                                   divergence is a rewrite too */
    int rewrite_line[2];        /* with rewrite_byte: the template's lines that write that
                                   byte now and wrote it when the answer was the last
                                   turn (0: not known); the detail names them */
} kp_doctor_hints;

/* What the caller knows from the token level (the prefix index matches token
 * ids, so reuse is token-exact). */
typedef struct {
    size_t token_index; /* index of the first request token that differs from
                           the cached tokens = number of tokens reused */
    size_t token_byte;  /* byte offset in the request where that token starts
                           (request_len when every request token matched) */
    size_t n_tokens;    /* tokens in the request, or 0 when unknown */
    /* Optional (0 / NULL when unknown): the byte where that request token
     * ends, and the text of the cached token at the same index. When the
     * request's token [token_byte, token_end) lies wholly inside the text
     * both share, the texts agree where the tokens part: the same text was
     * tokenized differently, and the cause is retokenized (the detail names
     * both pieces; cached_piece_len 0: the cached one is not named). */
    size_t token_end;
    char cached_piece[64]; /* cut on a character boundary */
    size_t cached_piece_len;
    kp_doctor_hints hints; /* the chat layer's (template_rewrites_history) */
} kp_doctor_tokens;

typedef struct {
    /* The text divergence: the first byte where the texts differ, moved back
     * to the start of the UTF-8 character that contains it, so it never
     * splits a character. When one text starts with the whole other one it is
     * the shorter length (snapped the same way). This is where the prompt
     * changed: classify and snippets look here. */
    size_t byte;
    bool full_match;     /* one text starts with the whole other one */
    /* The token divergence, copied from kp_doctor_tokens (KP_DOCTOR_NO_TOKEN and
     * token_byte == byte without it). */
    size_t token_index;
    size_t token_byte;
    /* Bytes of the request the cache supplies: token_byte with tokens
     * (authoritative, the cache is token-exact; a token merge can end reuse
     * a few bytes before the text changed), else byte. */
    size_t reused_bytes;
    /* Share of the prompt computed again, 0..100: by tokens when n_tokens is
     * known ((n_tokens - token_index) / n_tokens), else by bytes
     * ((request_len - reused_bytes) / request_len); 0 for an empty request. */
    double percent_recomputed;
} kp_doctor_divergence;

/* Compares cached[0..cached_len) with request[0..request_len) and fills *out.
 * tokens may be NULL. The texts need not be valid UTF-8 (snapping moves back
 * at most 3 continuation bytes). KP_EINVAL when a pointer is NULL with a
 * nonzero length, or when the token information contradicts the texts:
 * token_byte > request_len, token_byte past the text divergence (identical
 * tokens cannot run past a byte difference), or token_index > n_tokens. */
kp_status kp_doctor_diverge(const char *cached, size_t cached_len, const char *request,
                         size_t request_len, const kp_doctor_tokens *tokens,
                         kp_doctor_divergence *out, kp_error *err);

/* ------------------------------------------------------------------ */
/* Classification                                                      */

/* What the caller's cache held for this request. */
typedef enum {
    KP_DOCTOR_CACHE_TEXT = 0, /* `cached` is the longest cached match, still cached */
    KP_DOCTOR_CACHE_NOTHING,  /* nothing was cached: the cause is cold */
    KP_DOCTOR_CACHE_EVICTED   /* `cached` was cached once and has been evicted */
} kp_doctor_cache_state;

#define KP_DOCTOR_DETAIL_MAX 320

typedef struct {
    kp_doctor_cause cause;
    /* One line, printable UTF-8 (control characters escaped), for example
     * "timestamp: '2026-11-28 09:14' -> '2026-11-29 10:02' on line 2". It
     * starts with the cause name and a colon. */
    char detail[KP_DOCTOR_DETAIL_MAX];
    size_t byte;   /* the divergence examined (see kp_doctor_classify) */
    size_t line;   /* 1-based line of `byte` in the request */
    size_t column; /* 1-based column of `byte`, in characters */
    bool in_json;  /* `byte` lies inside a JSON object or array of the request
                      (a bracketed region that parses as JSON) */
} kp_doctor_finding;

/* Classifies the change at the divergence. diverge_byte may be any offset at
 * or before the first difference (the text divergence or the token start
 * from kp_doctor_diverge): the bytes before it must be equal in both texts, and
 * the classifier moves forward to the first differing character itself.
 *
 * The cause is decided in this order, on the texts around the divergence d
 * (d0 = the start of d's line):
 *   state NOTHING or cached_len == 0 -> cold; state EVICTED -> evicted;
 *   no byte differs in the overlap -> hit;
 *   the innermost JSON object/array enclosing d parses in both texts, the
 *     values are equal and some object's keys come in another order ->
 *     reordered_json (equal values in the same order fall through, so pure
 *     JSON formatting ends up as whitespace);
 *   equal when whitespace is ignored, over the whitespace at d and the 32
 *     non-space bytes after it (or until a text ends) -> whitespace;
 *   the cached text from d0 on appears intact later in the request, or
 *     (mid-line, inside JSON) the cached text from d on appears >= 32 bytes
 *     later -> inserted_at_front (a whole element put in front; words
 *     inserted mid-line in prose are an edit, however many);
 *   a date/time spans d in both texts -> timestamp; an identifier does ->
 *     identifier; a number does -> counter;
 *   from d0, at least two lines were rewritten or removed and the rest of
 *     the cached text (>= 32 bytes) follows intact -> inserted_at_front (one
 *     line rewritten, into any number of lines, is an edit);
 *   the texts share at most 256 bytes, which end (but for the first letters
 *     of the word at d) with a line or with markup ('>' or ']', then spaces:
 *     "<|im_start|>user\n", "[INST] "), and no
 *     tail of the cached text past d (>= 16 bytes, and at least as long as
 *     the cached text it skips) appears in the request after d ->
 *     new_prefix (another conversation after the template's opening);
 *   otherwise other, or cold when the texts differ from byte 0.
 * Detail formats (values quoted, escaped, cut to 40 characters with "..."):
 *   "timestamp: '<old>' -> '<new>' on line L" (counter, identifier alike),
 *   "reordered_json: keys 'a', 'b' -> 'b', 'a'[ in $.path] on line L",
 *   "whitespace: [CRLF vs LF, ]'<old run>' -> '<new run>' on line L",
 *   "inserted_at_front: N bytes ('<text>') inserted before cached text that
 *    follows intact on line L" or "...: lines A-B (N bytes) replaced by M
 *    bytes ('<text>') | removed, before cached text from line C that follows
 *    intact on line L",
 *   "new_prefix: only the opening '<shared start>' (N bytes) is shared, then
 *    '<request text>' instead of '<cached text>' on line L" (cut where the
 *    word that differs starts),
 *   "other: '<old word..end of line>' -> '<new ...>' on line L".
 * KP_EINVAL for NULL pointers with nonzero lengths, diverge_byte beyond
 * either text, a difference before diverge_byte, a bad state, or
 * diverge_byte > 0 with state NOTHING (whose cached text is ignored and may
 * be NULL). Allocates only inside jansson (a failed parse, for whatever
 * reason, counts as "not JSON"). */
kp_status kp_doctor_classify(const char *cached, size_t cached_len, const char *request,
                          size_t request_len, size_t diverge_byte, kp_doctor_cache_state state,
                          kp_doctor_finding *out, kp_error *err);

/* ------------------------------------------------------------------ */
/* Snippets                                                            */

typedef enum {
    /* For people: \n \t \r \\ and \xNN for other control bytes, DEL and
     * bytes that are not valid UTF-8; U+2028, U+2029 and C1 controls as
     * \uNNNN. Quotes are kept. */
    KP_DOCTOR_ESCAPE_HUMAN = 0,
    /* The content of a JSON string literal (write it between quotes): \" \\
     * \n \t \r \b \f, \u00NN for other controls, \ufffd for invalid bytes,
     * \u2028 \u2029 and C1 controls escaped. */
    KP_DOCTOR_ESCAPE_JSON
} kp_doctor_escape;

#define KP_DOCTOR_SNIPPET_BEFORE 16 /* characters before the divergence */
#define KP_DOCTOR_SNIPPET_AFTER 24  /* characters from the divergence on */
/* Enough for KP_DOCTOR_SNIPPET_BEFORE + AFTER characters, each escaped to at
 * most 6 bytes, and the NUL. */
#define KP_DOCTOR_SNIPPET_MAX 256

/* The character-aligned window around `at` (clamped to len, moved back to a
 * character start): up to `before` characters before it and `after`
 * characters from it on. A character is one valid UTF-8 sequence or one
 * invalid byte. Sets [*start, *end); *at_out receives the aligned `at`. */
void kp_doctor_snippet_span(const char *text, size_t len, size_t at, size_t before, size_t after,
                         size_t *start, size_t *end, size_t *at_out);

/* Writes the window of kp_doctor_snippet_span, escaped in `mode`, to
 * out[0..cap) (always NUL-terminated when cap > 0; escapes and characters
 * are never cut: what does not fit is left out whole). *marker (may be NULL)
 * receives the offset in out where the character at `at` begins. Returns
 * the length written. */
size_t kp_doctor_snippet(const char *text, size_t len, size_t at, size_t before, size_t after,
                      kp_doctor_escape mode, char *out, size_t cap, size_t *marker);

/* ------------------------------------------------------------------ */
/* Advice                                                              */

/* One sentence for a person into out[0..cap) (NUL-terminated when cap > 0;
 * a truncated sentence is cut on a character boundary), e.g.
 *   "turn 3 re-prefills 97% of its prompt: line 2 holds a timestamp that
 *    changes every turn ('2026-11-28 09:14' -> '2026-11-29 10:02'); move it
 *    to the end of the prompt or round it to the day"
 * subject names the request ("turn 3"; NULL -> "the request"). detail may be
 * NULL; a detail in kp_doctor_finding's format contributes its middle part
 * (the leading "<cause>: " and trailing " on line N" are dropped), any
 * other detail is quoted whole. line is 1-based (0: not mentioned).
 * Returns the length of the full sentence (as snprintf does). */
size_t kp_doctor_advice(kp_doctor_cause cause, const char *detail, size_t line,
                     double percent_recomputed, const char *subject, char *out, size_t cap);

/* ------------------------------------------------------------------ */
/* Everything at once                                                  */

typedef struct {
    kp_doctor_divergence div;
    kp_doctor_finding finding;
    char cached_snippet[KP_DOCTOR_SNIPPET_MAX];  /* around finding.byte, escaped */
    char request_snippet[KP_DOCTOR_SNIPPET_MAX];
    size_t cached_marker;  /* offset of finding.byte inside cached_snippet */
    size_t request_marker; /* offset of finding.byte inside request_snippet */
} kp_doctor_report;

/* kp_doctor_diverge, then kp_doctor_classify at the text divergence (or, when
 * the tokens part inside shared text, see kp_doctor_tokens.token_end: cause
 * retokenized at the token's byte, detail "retokenized: token K is '<piece>'
 * here and '<cached piece>' in the cache, the same text split differently on
 * line L"; or, from the hints, cause template_rewrites_history at the text
 * divergence when it lies at most 64 bytes before the rewrite byte, or when
 * the cached text there opens the reasoning the request lacks), then both snippets (KP_DOCTOR_SNIPPET_BEFORE/AFTER characters, escaped in `mode`).
 * Errors as kp_doctor_diverge and kp_doctor_classify. */
kp_status kp_doctor_explain(const char *cached, size_t cached_len, const char *request,
                         size_t request_len, const kp_doctor_tokens *tokens,
                         kp_doctor_cache_state state, kp_doctor_escape mode, kp_doctor_report *out,
                         kp_error *err);

#endif
