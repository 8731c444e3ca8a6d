/*
 * chat_impl.h - what the files of the chat layer share (internal to
 * chat.c, chat_calls.c and toolsyn.c; the contracts are chat.h and
 * toolsyn.h).
 *
 * chat.c loads a request's messages and tools into a chat_conv, rewrites
 * it into the generic tool format and owns the text helpers;
 * chat_calls.c reads calls back out of generated text. Calls go one way:
 * chat_calls.c calls chat.c, never the other way.
 */
#ifndef KP_CHAT_IMPL_H
#define KP_CHAT_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "serve/chat.h"

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } chat_role;


typedef struct {
    const char *name; /* borrowed */
    size_t name_len;
    char *args; /* owned: canonical JSON, or the client's text when it is not JSON */
    size_t args_len;
    bool args_verbatim; /* args is the client's text, not JSON */
    const char *id;     /* borrowed; NULL when absent */
    size_t id_len;
} chat_call;

typedef struct {
    chat_role role;
    char *content; /* owned, never NULL */
    size_t content_len;
    const char *reasoning; /* borrowed; NULL when absent or null */
    size_t reasoning_len;
    chat_call *calls;
    size_t n_calls;
    const char *tool_call_id, *tool_name; /* tool messages, borrowed; NULL when absent */
    size_t tool_call_id_len, tool_name_len;
    size_t src; /* the index of the request's message it comes from */
} chat_msg;

typedef struct {
    char *text; /* owned canonical JSON */
    size_t len;
} chat_text;

typedef struct {
    chat_msg *msgs;
    size_t n;
    chat_text *tools;
    size_t n_tools;
} chat_conv;

/* The role names, by chat_role. */
extern const char *const kp_chat_role_names[];

/* KP_ENOMEM with the chat layer's message. */
kp_status kp_chat_oom(kp_error *err);

/* The JSON object starting with the '{' at t[js] (js < len): 2 with *je
 * after its closing brace, 1 when the text ends first, 0 with *je on a '<'
 * outside strings. Only the nesting is checked. */
int kp_chat_json_extent(const char *t, size_t len, size_t js, size_t *je);

/* An OpenAI tool-call object {"id": "call_...", "type": "function",
 * "function": {"name", "arguments"}} with the id kp_chat_parse_tool_calls
 * gives call index of seed; NULL when memory runs out. */
json_t *kp_chat_call_object(const char *name, size_t name_len, const char *args, size_t args_len, uint64_t seed,
                            size_t index);

/* A forced call's arguments schema from a tool's parameters (a new
 * reference; NULL when memory runs out): a copy with every "properties"
 * in key order, as a template's tojson writes arguments back (RFC 8785),
 * and objects that declare properties closed to others unless they say
 * (additionalProperties false). */
json_t *kp_chat_forced_schema(const json_t *schema);

/* The first occurrence of needle in s[0..len), or NULL. */
const char *kp_chat_find(const char *s, size_t len, const char *needle);

/* The request's messages and tools checked and normalized into c (every
 * error names its field); kp_chat_conv_free releases it. */
kp_status kp_chat_conv_load(chat_conv *c, const json_t *messages, const json_t *tools, kp_error *err);
void kp_chat_conv_free(chat_conv *c);

/* For a family without a tool syntax: c rewritten into the generic tool
 * format (chat.h). */
kp_status kp_chat_generic_tools(chat_conv *c, kp_chat_family f, kp_error *err);

#endif
