/*
 * chat_tmpl.h - the server's chat template as Jinja text (floor 7): the
 * model's own tokenizer.chat_template (and its tool_use variant), a
 * --chat-template-file, or one of kvpin's built-in templates
 * (chat_builtin.h: --chat-template NAME, a model template that does not
 * compile, a model without one), rendered by the interpreter
 * (jinja/jinja.h) over the request's messages (chat_jinja.h), with the
 * client's bytes reported so that they are tokenized as plain text. Every
 * chat prompt is rendered here: there is no other path.
 *
 *   kp_chat_tmpl *t;
 *   kp_chat_tmpl_new(text, len, tool_text, tool_len, "<s>", "</s>", &t, &err);
 *     or kp_chat_tmpl_builtin(KP_CHAT_QWEN3, "<s>", "</s>", &t, &err);
 *   kp_chat_tmpl_render(t, messages, tools, &opts, kwargs, &out, &len, &plain, &n_plain, &err);
 *
 * Tools. When the template is compiled, its own tool-call syntax is
 * learned from renderings of probe calls (toolsyn.h): replies are read
 * back in it (kp_chat_tmpl_calls). A template that renders no tools at
 * all gets them, and the tool calls and tool messages of the conversation,
 * in kvpin's generic tool format (chat.h), written into the messages
 * before the template sees them (the built-in templates without a tool
 * syntax rely on it).
 * kp_chat_tmpl_family is the family whose rules apply otherwise (reading
 * replies when no syntax was learned, the forced-call form): the family
 * kp_chat_detect gives, else qwen2.5's when the text has "<tool_call>",
 * else chatml's; chatml's too (the generic rules) when the template
 * renders no tools; a built-in template's own family. kp_chat_tmpl_reasoning is "<think>"/"</think>" when
 * the text has "<think>", harmony's analysis channel when the template
 * renders OpenAI harmony (kp_chat_tmpl_harmony: its replies' calls are
 * read as harmony messages, harmony.h; forced calls still come from the
 * learned syntax, which is how the template renders a call back).
 *
 * A compiled template is immutable: renders from any number of threads.
 */
#ifndef KP_CHAT_TMPL_H
#define KP_CHAT_TMPL_H

#include <jansson.h>
#include <stdbool.h>

#include "base/status.h"
#include "serve/chat.h"
#include "serve/reasoning.h"
#include "serve/toolsyn.h"
#include "tok/tok.h"

typedef struct kp_chat_tmpl kp_chat_tmpl;

/* Compiles text[0..len) and, when tool_text is not NULL, the variant used
 * for requests with tools. bos/eos are the token texts the template sees
 * (copied; NULL is ""). Errors: KP_EFORMAT with "line L, column C: msg"
 * (the tool variant's prefixed "tool_use template: "), KP_ENOMEM. */
kp_status kp_chat_tmpl_new(const char *text, size_t len, const char *tool_text, size_t tool_len, const char *bos,
                           const char *eos, kp_chat_tmpl **out, kp_error *err);

/* The built-in template of family f (chat_builtin.h): its text compiled
 * as kp_chat_tmpl_new compiles any, the family f (not guessed from the
 * text), and requests checked before they are rendered as kp_chat_check
 * checks them (chat.h), so that every error names the field at fault.
 * Errors: KP_EUNSUPPORTED for KP_CHAT_UNKNOWN or a value outside the
 * enum, KP_ENOMEM. */
kp_status kp_chat_tmpl_builtin(kp_chat_family f, const char *bos, const char *eos, kp_chat_tmpl **out,
                               kp_error *err);

/* The Jinja text of family f's built-in template (static, NUL-terminated,
 * *len bytes; len may be NULL), or NULL for KP_CHAT_UNKNOWN. */
const char *kp_chat_builtin_text(kp_chat_family f, size_t *len);

void kp_chat_tmpl_free(kp_chat_tmpl *t);

/* Renders messages and tools (borrowed; chat_jinja.h's normalization) with
 * opts' add_generation_prompt, the members of kwargs (the request's
 * chat_template_kwargs, borrowed, NULL for none) as variables, and
 * disable_thinking (enable_thinking false, whatever kwargs say). *out (malloc'd, *len bytes,
 * NUL-terminated) and *plain (malloc'd or NULL, *n_plain ranges sorted and
 * disjoint: the bytes that came from messages and tools, jinja.h's
 * kp_jinja_render_client) are the caller's. plain may be NULL.
 * Errors: KP_EINVAL with the template's own message for raise_exception,
 * "the chat template failed at line L, column C: TypeError: ..." for
 * another failure, a malformed request's message (chat_jinja.h);
 * KP_ERANGE for a limit; KP_ENOMEM. */
kp_status kp_chat_tmpl_render(const kp_chat_tmpl *t, const json_t *messages, const json_t *tools,
                              const kp_chat_opts *opts, const json_t *kwargs, char **out, size_t *len, kp_tok_range **plain,
                              size_t *n_plain, kp_error *err);

/* The line of the template text that writes byte `byte` of the rendering
 * kp_chat_tmpl_render makes of the same arguments (jinja.h's
 * kp_jinja_line_at), or 0 when the rendering fails or is shorter. */
int kp_chat_tmpl_line_at(const kp_chat_tmpl *t, const json_t *messages, const json_t *tools,
                         const kp_chat_opts *opts, const json_t *kwargs, size_t byte);

/* The family whose tool-call rules and forced-call form fit the template
 * (see above); never KP_CHAT_UNKNOWN. */
kp_chat_family kp_chat_tmpl_family(const kp_chat_tmpl *t);

/* The reasoning markers of the template's replies: harmony mode
 * (reasoning.h) when it renders OpenAI harmony, else "<think>"/"</think>"
 * when it writes <think>, else NULL. */
const kp_reasoning_markers *kp_chat_tmpl_reasoning(const kp_chat_tmpl *t);

/* Whether the template renders OpenAI harmony (harmony.h: an answer in
 * history as "<|start|>assistant<|channel|>final<|message|>...", a
 * generation prompt ending "<|start|>assistant"): replies are read as
 * harmony messages (reasoning, content, calls), and generation stops at
 * "<|return|>" and "<|call|>". Rendering for such a template, an
 * assistant message with tool calls, reasoning and content (a preamble)
 * is given without its content: gpt-oss's template renders the reasoning
 * (thinking, chat_jinja.h) before the call and refuses both. */
bool kp_chat_tmpl_harmony(const kp_chat_tmpl *t);

/* The template's own tool-call syntax (toolsyn.h), learned when it was
 * compiled; NULL when it renders no calls or they do not read back, and
 * then *why (when why is not NULL) says which. */
const kp_toolsyn *kp_chat_tmpl_calls(const kp_chat_tmpl *t, const char **why);

/* The template's Jinja text (NUL-terminated, owned by t). */
const char *kp_chat_tmpl_text(const kp_chat_tmpl *t);

/* The BOS / EOS token texts the template sees (owned by t, never NULL). */
const char *kp_chat_tmpl_bos(const kp_chat_tmpl *t);
const char *kp_chat_tmpl_eos(const kp_chat_tmpl *t);

/* Whether the template reads the variable name (its text mentions it). */
bool kp_chat_tmpl_uses(const kp_chat_tmpl *t, const char *name);

#endif
