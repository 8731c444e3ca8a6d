/*
 * toolsyn.h - a chat template's own tool-call syntax, learned by rendering
 * probe conversations through the template, and the way back from
 * generated text to calls in that syntax (floor 7).
 *
 * A model writes tool calls the way its chat template renders them in
 * history; every family has its own markup (Hermes' <tool_call> JSON,
 * Qwen3-Coder's <function=...><parameter=...>, Mistral's
 * [TOOL_CALLS]name[ARGS]{...}, DeepSeek's <｜tool▁call▁begin｜>, GLM's
 * <arg_key>/<arg_value>, Llama 3.x bare JSON, ...). Instead of a parser per
 * family, kp_toolsyn_learn renders an assistant message with known calls
 * (sentinel names, ids, keys and values) and without, takes the bytes the
 * calls added, and reads their layout off where the sentinels landed:
 *
 *   section   OPEN call (SEP call)* TAIL          SEP, TAIL: after a call
 *   call      JSON    a JSON object holding the name and the arguments
 *                     ({"name": N, "arguments": A}, or {N: A})
 *             NAMED   N MID A         A a JSON object (DeepSeek, Mistral,
 *                                     Kimi, functionary...)
 *             PARAMS  N MID (KPRE key KMID value KPOST)*    (Qwen3-Coder,
 *                                     GLM, MiniMax, Seed...)
 *
 * Literals are matched loosely: a run of whitespace in the template's
 * markup matches any run of whitespace in the text, or none (models vary
 * their newlines); a call id the template writes matches any id, an index
 * any digits. A learned syntax must read the template's own rendering of
 * a second, different conversation back into exactly its calls, or it is
 * not used (kp_toolsyn_learn says why).
 *
 *   kp_toolsyn *s;
 *   kp_toolsyn_learn(render, ctx, &s, why, sizeof why, &err);
 *   kp_toolsyn_parse(s, tools, text, len, seed, &calls, &content_len, &err);
 *   kp_toolsyn_holdback(s, text, len);           streaming
 *
 * What is read: the calls section must end the message (whitespace after
 * it is fine; the section may stop anywhere inside its closing markup, as
 * when generation ends on an end-of-turn token); text before it is the
 * content. A section that does not parse is content, never an error.
 * Values of PARAMS calls are strings when the tool's schema says so (or
 * has no type for them), else JSON when they parse as JSON, else strings.
 *
 * A template that renders OpenAI's harmony format (gpt-oss) is learned
 * too (named calls after " to=functions."), but its replies are read by
 * harmony.h: the model writes the header of a call in another order than
 * the template renders it back. Its learned syntax still makes forced
 * calls, in the bytes the template renders.
 *
 * A learned syntax is immutable: any number of threads may use it.
 */
#ifndef KP_TOOLSYN_H
#define KP_TOOLSYN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kp_toolsyn kp_toolsyn;

/* Renders a chat-completions body (messages, tools, add_generation_prompt)
 * through the template into *out (malloc'd, *len bytes). Any status but
 * KP_OK means the template refused the conversation. */
typedef kp_status (*kp_toolsyn_render_fn)(void *ctx, const json_t *body, char **out, size_t *len);

/* Learns the template's call syntax. *out NULL (and KP_OK) when the
 * template renders no tool calls, or renders them in a layout that does
 * not read back; why (may be NULL) then says which, for the log.
 * *renders_tools: false when the template's prompt is the same with and
 * without tools (it ignores them; true when that cannot be told). Errors: KP_ENOMEM only. */
kp_status kp_toolsyn_learn(kp_toolsyn_render_fn render, void *ctx, kp_toolsyn **out, bool *renders_tools, char *why,
                           size_t why_size, kp_error *err);

void kp_toolsyn_free(kp_toolsyn *s); /* NULL is a no-op */

/* The calls in text[0..len), generated after a rendering with tools (the
 * text after the generation prompt and any reasoning, without the end of
 * turn token), as kp_chat_parse_tool_calls gives them (chat.h): *calls a
 * new array of OpenAI tool-call objects or NULL, *content_len the length
 * of the content before them without trailing whitespace. tools (the
 * request's array, may be NULL) types PARAMS values. KP_ENOMEM only. */
kp_status kp_toolsyn_parse(const kp_toolsyn *s, const json_t *tools, const char *text, size_t len, uint64_t id_seed,
                           json_t **calls, size_t *content_len, kp_error *err);

/* For streaming: the offset from which text[0..len) must be held back
 * because it is, or may become, the calls section (or whitespace in front
 * of it). Never decreases as the text grows; never passes the final
 * text's content_len. */
size_t kp_toolsyn_holdback(const kp_toolsyn *s, const char *text, size_t len);

/* The grammar of a forced call (tool_choice "required": any of tools; a
 * named function: name) in the template's own markup: per tool, the bytes
 * the template renders for a call of it, around its arguments written as
 * the template writes them back (JSON in RFC 8785 order, compact; each
 * parameter in key order, optional ones optional), so a call the client
 * sends back renders to the very bytes generated. The arguments' schema is
 * the tool's parameters, closed to undeclared properties unless it says
 * otherwise. One call, or with parallel (and a template that renders
 * several) up to 16. ends (NULL-terminated, may be NULL): texts the
 * vocabulary has as end-of-generation tokens; markup that ends the message
 * with one (harmony's "<|call|>") is left out of the grammar, and the
 * model ends with the token itself (a grammar writes text, never a
 * control token). Errors: KP_EINVAL for malformed tools or an unknown
 * name ("tool_choice: no function named ..."), KP_EUNSUPPORTED when the
 * template writes a tool's calls in a way that cannot be generated
 * exactly (naming the tool), a schema the grammar compiler refuses (its
 * message), KP_ENOMEM. */
struct kp_grammar;
kp_status kp_toolsyn_force(const kp_toolsyn *s, const json_t *tools, const char *name, bool parallel,
                           const char *const *ends, struct kp_grammar **out, kp_error *err);

/* A one-line description of the syntax for logs: the call form and its
 * opening markup, e.g. "named calls after '[TOOL_CALLS]'". Static storage
 * inside s. */
const char *kp_toolsyn_describe(const kp_toolsyn *s);

/* Whether a message may hold more than one call (the template renders
 * two). */
bool kp_toolsyn_parallel(const kp_toolsyn *s);

#endif
