/*
 * responses.h - the OpenAI Responses API: requests into chat-completions
 * requests and response objects (floor 7).
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
 *   tools [{type: namespace, name: NS, tools: [function tools]}]
 *                                -> the functions as chat tools (by their own
 *                                   names); a call's function_call item says
 *                                   "namespace": NS, as Codex expects
 *   tools of hosted types (web_search, file_search, code_interpreter, ...)
 *                                -> left out, named in ignored ("tools[7]:web_search";
 *                                   refused when strict)
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

 * The responses kept for GET, DELETE and previous_response_id are
 * response_store.h's.
 */
#ifndef KP_RESPONSES_H
#define KP_RESPONSES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "serve/http.h"
#include "serve/oai.h"

typedef struct {
    json_t *root;        /* the parsed body (owned) */
    json_t *chat;        /* the chat-completions body (owned) */
    json_t *conv;        /* the conversation without the instructions: what a stored
                            response keeps, the answer appended (owned) */
    bool stream, store;
    const char *previous; /* previous_response_id, into root; NULL: none */
    kp_buf ignored;       /* accepted fields kvpin does not act on (data NULL: none) */
    json_t *ns_of;        /* function name -> its namespace, for the functions of namespace tools (owned) */
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
 * borrowed, may be NULL). item_seed makes the items' ids; status is the
 * message item's ("completed", or "incomplete" when the token limit cut the
 * text); ns_of (may be NULL) maps a function's name to the namespace tool it
 * came from, which its function_call item then names. A new array. */
json_t *kp_resp_output_json(const char *text, size_t text_len, const json_t *calls, uint64_t item_seed,
                            const char *status, const json_t *ns_of);

/* The id of output item i of an answer ("msg_..." for i 0, "fc_..." for
 * the calls after it), from item_seed: kp_resp_output_json's ids, for a
 * stream to name the same items. */
void kp_resp_item_id(char *out, size_t cap, const char *prefix, uint64_t seed, size_t i);

/* The usage object: input_tokens, input_tokens_details.cached_tokens,
 * output_tokens, output_tokens_details.reasoning_tokens 0, total_tokens. */
/* A reasoning output item (id "rs_..." from item_seed) holding text as one
 * reasoning_text part (no part while status is "in_progress"). */
json_t *kp_resp_reasoning_item(const char *text, size_t len, uint64_t item_seed, const char *status);

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

/* ---- the endpoints (routes.c) ---------------------------------------------- */

/* POST /v1/responses (served through answer.h in this dialect; a stored
 * response goes to the response store), GET and DELETE /v1/responses/{id}. */
KP_HANDLER(kp_resp_create);
KP_HANDLER(kp_resp_get);
KP_HANDLER(kp_resp_delete);

#endif
