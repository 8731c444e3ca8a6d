/*
 * harmony.h - OpenAI's harmony format (gpt-oss) read back from a reply
 * (floor 7).
 *
 * A template that renders harmony ends its generation prompt with
 * "<|start|>assistant"; the model then writes messages, each a header,
 * "<|message|>", a body and a closing marker. The first message's header
 * follows the prompt's "<|start|>assistant"; later ones open with
 * "<|start|>assistant" themselves:
 *
 *   <|channel|>analysis<|message|>REASONING<|end|>
 *   <|start|>assistant<|channel|>final<|message|>CONTENT<|return|>
 *
 *   <|channel|>analysis<|message|>REASONING<|end|>
 *   <|start|>assistant<|channel|>commentary<|message|>PREAMBLE<|end|>
 *   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>
 *
 *   header   (<|channel|>CHANNEL | to=RECIPIENT | <|constrain|>TYPE | TYPE)*
 *            in any order, separated by optional spaces (the recipient may
 *            come before the channel, as the gpt-oss template renders calls
 *            back: " to=functions.NAME<|channel|>commentary json");
 *   closing  <|end|> (more messages follow), <|return|> or <|call|> (the
 *            end of generation: gpt-oss vocabularies have them as
 *            end-of-generation tokens, and the server stops on their texts
 *            otherwise), or nothing when the text ends.
 *
 * The analysis channel is the reasoning (reasoning.h's harmony mode); a
 * message to "functions.NAME" is a tool call whose body is its JSON
 * arguments; any other message's body is content (final, or a commentary
 * preamble). OpenAI's published spec: the cookbook's "OpenAI Harmony
 * Response Format" (github.com/openai/harmony).
 *
 * Pure functions of the text; no state.
 */
#ifndef KP_HARMONY_H
#define KP_HARMONY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "serve/toolsyn.h"

typedef enum {
    KP_HARMONY_NONE = 0, /* the text there is not a message */
    KP_HARMONY_PARTIAL,  /* it may become one: the text ends inside the header */
    KP_HARMONY_MSG       /* a message (its body may still be growing: closed false) */
} kp_harmony_read_result;

/* One message of a reply; offsets into the text. */
typedef struct {
    size_t chan_from, chan_to; /* the channel's name ("analysis"; empty: none) */
    size_t to_from, to_to;     /* the recipient ("functions.get_weather"; empty: none) */
    size_t body_from;          /* after "<|message|>" */
    size_t body_to;            /* where the closing marker starts (closed), else the text's end */
    size_t end;                /* after the closing marker (closed), else the text's end */
    bool closed;
} kp_harmony_msg;

/* Reads the message whose markup starts at t[at] (whitespace first is
 * skipped). first: the reply's first message, whose "<|start|>assistant"
 * was the generation prompt (it may still be written); later messages
 * must open with "<|start|>" and a role. */
kp_harmony_read_result kp_harmony_read(const char *t, size_t len, size_t at, bool first, kp_harmony_msg *m);

/* Whether m's channel is channel. */
bool kp_harmony_channel_is(const kp_harmony_msg *m, const char *t, const char *channel);

/* The name m calls ("get_weather" of "functions.get_weather": *n bytes at
 * the result), or NULL when m is not a function call. */
const char *kp_harmony_call_name(const kp_harmony_msg *m, const char *t, size_t *n);

/* The end of t[from..len) without a tail that may still become a closing
 * marker or the next message's "<|start|>" (what a stream may release). */
size_t kp_harmony_safe_end(const char *t, size_t from, size_t len);

/* The calls at the end of text[0..len), as kp_toolsyn_parse gives them
 * (toolsyn.h): the trailing run of messages to functions.NAME whose bodies
 * are JSON objects (the last may lack its closing marker), *content_len
 * the end of the message before them (after its closing marker, trailing
 * whitespace cut; 0 when the calls open the reply). No calls: *calls NULL
 * and *content_len the text without trailing whitespace. KP_ENOMEM only. */
kp_status kp_harmony_parse(const char *text, size_t len, uint64_t id_seed, json_t **calls, size_t *content_len,
                           kp_error *err);

/* For streaming: where text[0..len) must be held back because it is, or
 * may become, the calls (or a message header not yet decided). */
size_t kp_harmony_holdback(const char *text, size_t len);

/* Whether the template renders harmony: an assistant answer in history as
 * "<|start|>assistant<|channel|>final<|message|>ANSWER" and a generation
 * prompt that ends "<|start|>assistant". render renders a chat-completions
 * body (toolsyn.h). false when the template refuses the probes; *oom when
 * memory ran out. */
bool kp_harmony_detect(kp_toolsyn_render_fn render, void *ctx, bool *oom);

#endif
