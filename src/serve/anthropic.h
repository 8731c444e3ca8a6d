/*
 * anthropic.h - the Anthropic Messages API shapes, as JSON (floor 7).
 *
 * kvpin serves POST /v1/messages by translating the request into the
 * chat-completions request it means, so that one chat layer renders every
 * API (the same conversation gives the same tokens, and the same cached
 * prefix, whichever API sent it), and the forced tool calls, stops and
 * sampling of chat completions apply as they are:
 *
 *   Messages body --kp_anth_translate--> chat-completions body (json)
 *                                        + cache_control breakpoints
 *   text, calls, usage --kp_anth_message_json / kp_anth_event--> Anthropic JSON
 *
 * The translation (what kp_anth_translate writes into the chat body):
 *
 *   system (string, or text blocks)    -> {"role":"system","content":...}
 *                                         (blocks as text parts, which the
 *                                         chat layer joins with "\n")
 *   user content (string, or blocks)   -> a user message; text blocks as
 *                                         text parts; tool_result blocks
 *                                         become {"role":"tool",
 *                                         "tool_call_id","content"} messages,
 *                                         in the order of the blocks
 *   system content among the messages  -> a system message in its place
 *                                         (text blocks only)
 *   assistant content                  -> an assistant message: text blocks
 *                                         as content, tool_use blocks as
 *                                         tool_calls (arguments: the input
 *                                         object)
 *   tools [{name, description, input_schema}]
 *                                      -> [{"type":"function","function":
 *                                          {name, description, parameters}}]
 *   tool_choice auto / any / tool NAME / none
 *                                      -> "auto" / "required" / a named
 *                                         function / "none"
 *   max_tokens, stop_sequences, temperature, top_p, top_k, stream
 *                                      -> max_tokens, stop, temperature,
 *                                         top_p, top_k, stream
 *
 * thinking and redacted_thinking blocks of assistant messages (a reasoning
 * model's, sent back by its client) are left out and named in `ignored`.
 *
 * Refused with a 400 naming the field: a missing or non-integer
 * max_tokens (>= 1), a missing model, messages that are not a non-empty
 * array of user/assistant messages, block types other than text,
 * tool_use, tool_result (image and document are named as unsupported),
 * a tool_result whose tool_use_id no tool_use of the previous assistant
 * message has, tool_use outside assistant messages, tool_result outside
 * user messages, more than KP_ANTH_MAX_BREAKS cache_control breakpoints,
 * a cache_control that is not {"type":"ephemeral"} with an optional ttl
 * "5m" or "1h". metadata, anthropic fields kvpin does not act on and
 * unknown fields are accepted and listed in `ignored` (strict: unknown
 * top-level fields are a 400).
 *
 * Every function here is pure (no state between calls): safe from any
 * number of threads.
 */
#ifndef KP_ANTHROPIC_H
#define KP_ANTHROPIC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "serve/http.h"
#include "serve/oai.h"

#define KP_ANTH_MAX_BREAKS 4 /* cache_control breakpoints per request, as Anthropic allows */

/* One cache_control breakpoint: the conversation cut right after the
 * block that carries it, as chat messages and tools (both owned), which
 * render (without the generation prompt) to a prefix of the whole
 * request's rendering up to that block. */
typedef struct {
    json_t *messages; /* chat messages up to the block (owned) */
    json_t *tools;    /* chat tools up to the block, or all; NULL: none (owned) */
    int64_t ttl_s;    /* 300 ("5m", the default) or 3600 ("1h") */
    char where[64];   /* "system[1]", "tools[0]", "messages[2].content[0]" */
} kp_anth_break;

typedef struct {
    json_t *chat;            /* the chat-completions body (owned) */
    kp_anth_break br[KP_ANTH_MAX_BREAKS];
    int n_br;
    kp_buf ignored;          /* accepted fields kvpin does not act on: "metadata,..." (data NULL: none) */
    bool stream;
} kp_anth_request;

/* Translates the Messages body body[0..len) (count_tokens: the body of
 * /v1/messages/count_tokens, where max_tokens is not required and stream
 * not taken). On success r owns what it holds (kp_anth_request_free);
 * false with *e set (HTTP 400 and the field) and r empty. */
bool kp_anth_translate(const char *body, size_t len, bool count_tokens, bool strict, kp_anth_request *r,
                       kp_oai_error *e);

/* Releases what r holds and zeroes it; NULL is a no-op. */
void kp_anth_request_free(kp_anth_request *r);

/* Anthropic's HTTP status and error type for a kvpin error: 400
 * invalid_request_error (also 405, 431 and other 4xx), 401
 * authentication_error, 403 permission_error, 404 not_found_error, 413
 * request_too_large, 429 rate_limit_error, 503 -> 529 overloaded_error,
 * 500 and other 5xx api_error. *type is static. */
int kp_anth_error_status(int http, const char **type);

/* {"type":"error","error":{"type","message"}} for e (a new reference). */
json_t *kp_anth_error_json(const kp_oai_error *e);

/* The usage object: input_tokens, cache_creation_input_tokens,
 * cache_read_input_tokens, output_tokens. */
json_t *kp_anth_usage_json(uint32_t input, uint32_t creation, uint32_t read, uint32_t output);

/* The content blocks of an answer: a text block with text[0..text_len)
 * when it is not empty, then one tool_use block per call of calls (an
 * array of OpenAI tool-call objects, borrowed, may be NULL) with its id
 * ("call_X" becomes "toolu_X"), name and input (the parsed arguments;
 * arguments that are not a JSON object become {}). A new array. */
json_t *kp_anth_content_json(const char *text, size_t text_len, const json_t *calls);

/* A tool_use block's id for an OpenAI call id: "toolu_" + what follows
 * "call_" (or the whole id). Writes at most cap bytes to out. */
void kp_anth_tool_id(const char *call_id, char *out, size_t cap);

/* The message object {id, type "message", role "assistant", model,
 * content (consumed), stop_reason, stop_sequence (NULL: null), usage
 * (consumed)}. stop_reason NULL: null (the message_start of a stream). */
json_t *kp_anth_message_json(const char *id, const char *model, json_t *content, const char *stop_reason,
                             const char *stop_sequence, json_t *usage);

/* The stop_reason of an answer that ended: "tool_use" when it holds
 * calls; "max_tokens" when cut at the limit (length); else, when the last
 * generated token is not an end-of-generation token and stops were given,
 * "stop_sequence" with *which the stop found at full[text_len..] (full:
 * the detokenized completion, may be NULL: then the first stop); else
 * "end_turn". Static strings; *which into stops (NULL when none). */
const char *kp_anth_stop_reason(bool calls, bool length, bool last_is_eog, const char *const *stops, int n_stops,
                                const char *full, size_t full_len, size_t text_len, const char **which);

/* Appends the SSE event "event: NAME\ndata: JSON\n\n" (data consumed; its
 * "type" member is set to name). false when out of memory. */
bool kp_anth_event(kp_buf *out, const char *name, json_t *data);

/* The cache usage of a prompt of n tokens, of which reused came from the
 * cache, with breakpoints at positions bp[0..n_bp) (tokens of the prefix
 * each ends; n_bp 0: none) of which `live` are held by a pin that had not
 * expired before this request:
 *   no breakpoints:      read = reused, creation = 0
 *   a live breakpoint:   read = reused, creation = the last breakpoint's
 *                        tokens past it (0 when reused covers them)
 *   none live:           read = 0, creation = the last breakpoint's tokens
 * and input = n - read - creation, so the three add up to n. */
void kp_anth_cache_usage(uint32_t n, uint32_t reused, const uint32_t *bp, int n_bp, int live, uint32_t *input,
                         uint32_t *creation, uint32_t *read);

/* ---- the endpoints (routes.c) ---------------------------------------------- */

/* POST /v1/messages: the translation served through answer.h in this
 * dialect; POST /v1/messages/count_tokens: the prompt's tokens. */
KP_HANDLER(kp_anth_messages);
KP_HANDLER(kp_anth_count_tokens);

/* The error shape of every /v1/messages path (kp_error_shape): Anthropic's
 * error object and status (kp_anth_error_status, kp_anth_error_json). */
json_t *kp_anth_error_shape(const kp_oai_error *e, int *http);

#endif
