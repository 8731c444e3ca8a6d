/*
 * chat_jinja.h - a chat-completions request as the context of a chat
 * template (floor 7), for the Jinja interpreter (jinja/jinja.h).
 *
 * The request is normalized the way OpenAI-compatible servers (llama.cpp,
 * vLLM, kvpin) do before templating, the rules tools/chat_golden.py and
 * tests/data/chat/README.md document:
 *
 *   content: [{"type":"text","text":..}, ...]  -> the texts joined by "\n"
 *   content: null or absent                     -> ""
 *   tool_calls[].function.arguments "{...}"     -> the parsed JSON value
 *   tool_calls: []                              -> no tool_calls member
 *   tools absent or []                          -> tools: null
 *   reasoning_content "..." without thinking    -> thinking: the same text
 *                                                  (gpt-oss's template reads
 *                                                  the reasoning there)
 *
 * The context is { messages, tools, add_generation_prompt (default true,
 * else the request's value as it is), bos_token, eos_token, and every
 * other member of chat_template_kwargs } (a kwarg named like one of the
 * first five does not replace it).
 */
#ifndef KP_CHAT_JINJA_H
#define KP_CHAT_JINJA_H

#include <jansson.h>

#include "base/status.h"

/* Builds the template context of request (borrowed, not modified) into
 * *ctx (a new reference the caller decrefs). bos/eos may be NULL ("").
 * KP_EINVAL with a message naming the field for a malformed request
 * (messages not an array, a message not an object, arguments not JSON). */
kp_status kp_chatj_context(const json_t *request, const char *bos, const char *eos, json_t **ctx,
                           kp_error *err);

/* True when the request has a non-empty tools array (the CLI then picks a
 * model's tool_use template variant when it has one). */
int kp_chatj_has_tools(const json_t *request);

#endif
