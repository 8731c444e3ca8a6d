/*
 * reasoning.h - a reply's reasoning, split from its content (floor 7).
 *
 * Reasoning models write their thinking between markers before the answer
 * their template expects ("<think>\n...\n</think>\n\nThe answer"); some
 * templates open the reasoning in the generation prompt, so the reply
 * starts inside it ("...\n</think>\n\nThe answer"). kvpin hands the
 * reasoning to clients apart from the content, as each API has it: chat
 * completions' `reasoning_content`, a Messages `thinking` block, a
 * Responses `reasoning` item (streamed as deltas in each).
 *
 * kp_reasoning_scan reads a reply written so far and says where its parts
 * lie. It is a pure function of the text: called again as the text grows,
 * what it once gave as reasoning (up to reason_to) or content (from
 * content_from, once not held) stays so, so a stream may hand those out
 * and never take them back.
 *
 *   text:  [ws] <think> [ws] reasoning... [ws] </think> [ws] content...
 *                           ^reason_from      ^reason_to       ^content_from
 *
 *   - leading whitespace, whitespace around the reasoning and whitespace
 *     after the closing marker belong to neither part (as llama.cpp's
 *     server and DeepSeek's API give them);
 *   - a reply that does not start with the opening marker (after
 *     whitespace) has no reasoning: content_from is 0, the text untouched;
 *   - a reply that opens reasoning and never closes it (cut by max_tokens)
 *     is all reasoning;
 *   - while the text could still become a marker (a prefix of "<think>"
 *     at the start, of "</think>" at the end) or whitespace might still
 *     be followed by reasoning, that part is held: safe_to stops before it
 *     and content_from stays at len.
 *
 * Harmony mode (m->harmony; harmony.h): the reply is OpenAI harmony
 * messages, not marked text. The reasoning is the body of a first
 * message on the analysis channel; the content is the body of the
 * message after it (or of the first message, without analysis) when that
 * one is not a tool call, and ends where its closing marker starts
 * (content_to: the markup after it is neither part). A reply that opens
 * with a tool call has empty content at the call (content_from =
 * content_to = its start; the calls are read by kp_harmony_parse). A
 * reply that is not harmony markup is all content. Held: a header not yet
 * complete, a tail that may become a closing marker.
 */
#ifndef KP_REASONING_H
#define KP_REASONING_H

#include <stdbool.h>
#include <stddef.h>

/* A template's reasoning markers (both non-empty). */
typedef struct {
    const char *open, *close;
    bool harmony; /* harmony mode (above): open is "<|channel|>analysis<|message|>", close "<|end|>" */
} kp_reasoning_markers;

typedef enum {
    KP_REASONING_UNDECIDED = 0, /* the start could still be the opening marker */
    KP_REASONING_NONE,          /* no reasoning: all of it is content */
    KP_REASONING_OPEN,          /* inside the reasoning, no closing marker yet */
    KP_REASONING_CLOSED         /* the reasoning ended; content follows */
} kp_reasoning_state;

typedef struct {
    kp_reasoning_state state;
    size_t reason_from; /* the reasoning is text[reason_from..reason_to) */
    size_t reason_to;   /* OPEN, not final: the part that is safe (safe_to) */
    size_t content_from; /* the content starts here (len while held) */
    size_t content_to;   /* and ends here at the latest (len but in harmony mode) */
    size_t close_end;    /* CLOSED: where the closing marker ends */
    size_t searched;     /* OPEN: no closing marker starts before this */
} kp_reasoning_split;

/* Splits text[0..len). starts_open: the prompt opened the reasoning (see
 * kp_reasoning_prompt_opens). final: the reply is complete (nothing is
 * held back any more). m NULL: no reasoning markers, the whole text is
 * content. prev (may be NULL): this function's answer for a shorter
 * prefix of the same text, so that a stream does not scan its text again
 * at every token (a decided split is kept, the search for the closing
 * marker goes on where it stopped); the answer is the same as without it. */
void kp_reasoning_scan(const char *text, size_t len, const kp_reasoning_markers *m, bool starts_open, bool final,
                       const kp_reasoning_split *prev, kp_reasoning_split *out);

/* Whether a rendered prompt ends inside the reasoning: its last non-space
 * text is the opening marker (a template that writes "<think>\n" in its
 * generation prompt). */
bool kp_reasoning_prompt_opens(const char *prompt, size_t len, const kp_reasoning_markers *m);

#endif
