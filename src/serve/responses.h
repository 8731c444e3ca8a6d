/*
 * responses.h - the OpenAI Responses API: requests into chat-completions
 * requests, response objects, and the store of responses (floor 6).
 *
 * POST /v1/responses is served as the chat-completions request it means,
 * so the chat layer, forced tool calls and constrained decoding are the
 * ones chat completions use, and a conversation renders to the same tokens
 * through either API:
 *
 *   instructions                 -> a system message first
 *   input "text"                 -> a user message
 *   input items:
 *     {type: message, role, content: string | [input_text | output_text]}
 *                                -> a message of that role (developer as system)
 *     {type: function_call, call_id, name, arguments}
 *                                -> an assistant tool call (calls in a row:
 *                                   one assistant message)
 *     {type: function_call_output, call_id, output}
 *                                -> a tool message
 *   tools [{type: function, name, description, parameters, strict}]
 *                                -> chat tools
 *   tool_choice auto / none / required / {type: function, name}
 *                                -> the same in chat's form
 *   text.format text / json_object / json_schema {name, schema, strict}
 *                                -> response_format
 *   max_output_tokens, temperature, top_p, stream
 *                                -> max_tokens, temperature, top_p, stream
 *
 * previous_response_id continues a stored conversation: the chat
 * messages of the stored response (its input and its answer, without its
 * instructions, which are not carried over) come before the new input.
 *
 * The store (kp_rstore): responses kept in memory for GET and DELETE
 * /v1/responses/{id} and previous_response_id, bounded by count and bytes,
 * least recently used dropped first. Thread-safe (one mutex, held to copy).
 */
#ifndef KP_RESPONSES_H
#define KP_RESPONSES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "serve/oai.h"

typedef struct {
    json_t *root;        /* the parsed body (owned) */
    json_t *chat;        /* the chat-completions body (owned) */
    json_t *conv;        /* the conversation without the instructions: what a stored
                            response keeps, the answer appended (owned) */
    bool stream, store;
    const char *previous; /* previous_response_id, into root; NULL: none */
    kp_buf ignored;       /* accepted fields kvpin does not act on (data NULL: none) */
} kp_resp_request;

/* Translates the Responses body body[0..len). prev_conv: the stored
 * conversation of previous_response_id (borrowed, NULL when the request
 * names none; the caller looks it up with kp_resp_previous first). false
 * with *e (400 and the field) and r empty. */
bool kp_resp_translate(const char *body, size_t len, const json_t *prev_conv, bool strict, kp_resp_request *r,
                       kp_oai_error *e);

/* previous_response_id of body[0..len), or NULL (a new reference to the
 * parsed body is not kept: the string is copied into out, cap bytes).
 * false when the body names none. */
bool kp_resp_previous(const char *body, size_t len, char *out, size_t cap);

void kp_resp_request_free(kp_resp_request *r);

/* The output items of an answer: a message item with one output_text part
 * when text[0..text_len) is not empty or there are no calls, then one
 * function_call item per call of calls (OpenAI tool-call objects,
 * borrowed, may be NULL). item_seed makes the items' ids. A new array. */
json_t *kp_resp_output_json(const char *text, size_t text_len, const json_t *calls, uint64_t item_seed);

/* The id of output item i of an answer ("msg_..." for i 0, "fc_..." for
 * the calls after it), from item_seed: kp_resp_output_json's ids, for a
 * stream to name the same items. */
void kp_resp_item_id(char *out, size_t cap, const char *prefix, uint64_t seed, size_t i);

/* The usage object: input_tokens, input_tokens_details.cached_tokens,
 * output_tokens, output_tokens_details.reasoning_tokens 0, total_tokens. */
json_t *kp_resp_usage_json(uint32_t input, uint32_t cached, uint32_t output);

/* The response object (output and usage consumed; usage may be NULL:
 * null): status "completed", or "incomplete" with incomplete_details
 * {reason: "max_output_tokens"} when incomplete; the request's
 * parameters echoed from r. */
json_t *kp_resp_object_json(const char *id, const char *model, int64_t created, const char *status,
                            const kp_resp_request *r, json_t *output, json_t *usage);

/* The conversation r->conv with the answer appended as an assistant
 * message (text content and/or tool_calls): a new reference. */
json_t *kp_resp_conv_after(const kp_resp_request *r, const char *text, size_t text_len, const json_t *calls);

/* Appends the SSE event "event: NAME\ndata: JSON\n\n" with "type": name
 * first and "sequence_number": *seq (then incremented); data consumed. */
bool kp_resp_event(kp_buf *out, const char *name, json_t *data, uint32_t *seq);

/* ---- the store ---------------------------------------------------------- */

typedef struct kp_rstore kp_rstore;

/* At most max_count responses and max_bytes bytes of them (their JSON
 * texts). KP_ENOMEM. kp_rstore_free(NULL) is a no-op. */
kp_status kp_rstore_new(kp_rstore **out, uint32_t max_count, size_t max_bytes, kp_error *err);
void kp_rstore_free(kp_rstore *s);

/* Keeps response (the object, borrowed: serialized) and conv (the chat
 * conversation, borrowed) under id, dropping the least recently used ones
 * past the bounds. false when it cannot be kept (out of memory, or alone
 * larger than max_bytes). */
bool kp_rstore_put(kp_rstore *s, const char *id, const json_t *response, const json_t *conv);

/* The stored response and/or conversation of id as new references (either
 * out may be NULL); a hit makes it the most recently used. false: none. */
bool kp_rstore_get(kp_rstore *s, const char *id, json_t **response, json_t **conv);

/* Removes id; false when there is none. */
bool kp_rstore_delete(kp_rstore *s, const char *id);

/* How many responses are kept and their bytes. */
void kp_rstore_stats(kp_rstore *s, uint32_t *count, size_t *bytes, uint32_t *max_count, size_t *max_bytes);

#endif
