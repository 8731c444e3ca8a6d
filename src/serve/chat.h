/*
 * chat.h - chat template families: the rules a conversation follows on its
 * way into a prompt and the tool calls on their way back (floor 7).
 *
 * A model's chat template (Jinja text in its GGUF metadata) decides how a
 * conversation becomes the text the model reads. The server runs that
 * text with the Jinja interpreter (chat_tmpl.h). kvpin also carries a
 * template of its own for each family below (src/serve/templates/NAME.jinja,
 * compiled into the library: chat_builtin.h), rendered the same way, for
 * --chat-template NAME, a model whose template does not compile (the
 * family kp_chat_detect sees in it) and a model without one (chatml).
 * This file holds what is not the layout: the families' names and
 * detection, the request checks and the generic tool format of the
 * built-in templates, and the family rules that read tool calls back. A
 * built-in template renders byte for byte what Hugging Face transformers
 * renders with the real template (tests/unit/test_chat.c compares against
 * jinja2 renderings of the templates in tests/data/chat/templates/).
 *
 *   [{"role":"system","content":"Be brief."},      <|im_start|>system
 *    {"role":"user","content":"Hi"}]          ->    Be brief.<|im_end|>
 *                                                   <|im_start|>user
 *   family qwen3, add_generation_prompt             Hi<|im_end|>
 *                                                   <|im_start|>assistant
 *
 * Rendering is byte-stable, which is what lets the prefix cache work:
 *   - the same messages and tools always give the same bytes;
 *   - tool schemas and tool-call arguments are written as canonical JSON
 *     (canon.h), so a client that reorders keys or changes spacing sends
 *     the same prompt;
 *   - appending messages never rewrites earlier turns: the rendering of
 *     messages[0..k) with the generation prompt, where message k-1 is a
 *     user or tool message and message k is an assistant message, is a
 *     byte prefix of the rendering of the whole list. (Qwen 3 re-renders
 *     its own answers without their <think> part once a new user message
 *     follows, as its template does; the prefix still holds up to the
 *     generation prompt.)
 *
 * Families (name for --chat-template, what kp_chat_detect looks for):
 *
 *   chatml    <|im_start|>role ... <|im_end|> (OpenHermes, Dolphin...)
 *   qwen2     ChatML with "You are a helpful assistant." as default system
 *   qwen2.5   ChatML, default system "You are Qwen, created by Alibaba
 *             Cloud...", tools block, <tool_call> / <tool_response>   [tools]
 *   qwen3     ChatML, tools block, <think> handling                   [tools]
 *   llama3    <|start_header_id|>role<|end_header_id|> (Llama 3.0)
 *   llama3.1  Llama 3.1 / 3.2 / 3.3: date header, tools in the first
 *             user message, one tool call per message, ipython role  [tools]
 *   llama2    <s>[INST] <<SYS>> ... <</SYS>> ... [/INST]
 *   mistral   <s> [INST] system\n\nuser [/INST] answer</s> (v0.1-v0.2
 *             layout; system merged into the first user message; v0.3 and
 *             later templates are detected as mistral and rendered so too,
 *             because theirs moves the system prompt every turn)
 *   gemma     <start_of_turn>user/model, system merged into the first
 *             user turn (Gemma 3 layout; Gemma 2 is the same without one)
 *   phi3      <|system|> <|user|> <|assistant|> ... <|end|>
 *   zephyr    <|system|> <|user|> <|assistant|> ... </s>
 *
 * Messages (the "messages" array of a /v1/chat/completions request):
 *
 *   role          "system" | "developer" | "user" | "assistant" | "tool";
 *                 developer (OpenAI's name for the system message of newer
 *                 models) is rendered exactly as system
 *   content       a string; an array of {"type":"text","text":...} parts
 *                 (any role), joined with "\n" as llama.cpp's and vLLM's
 *                 servers join them; null or absent only for an assistant
 *                 message with tool_calls (rendered as "")
 *   tool_calls    assistant only: [{"id", "type":"function", "function":
 *                 {"name", "arguments"}}]; arguments is a JSON text (the
 *                 OpenAI form) or a JSON object, written as canonical
 *                 JSON; a text that is not JSON is refused by a template
 *                 with a tool syntax (chat_jinja.h) and written as a JSON
 *                 string in the generic format
 *   tool_call_id, name          tool messages: checked to be strings
 *   reasoning_content           assistant: a string or null (qwen3 only
 *                               among the built-ins; a template in Jinja
 *                               also sees it as `thinking`, chat_jinja.h)
 *
 * Other members are ignored.
 *
 * The way back: kp_chat_parse_tool_calls reads the tool calls out of the
 * text a model generated after such a rendering, and kp_chat_tool_holdback
 * tells a streaming server which tail of the text may still become a call.
 * What each tools family's calls look like (the layouts its template
 * teaches the model):
 *
 *   qwen2.5, qwen3   zero or more <tool_call> blocks at the end of the
 *                    message, after optional content (qwen3: after an
 *                    optional leading <think>...</think>):
 *
 *                      Let me look.\n<tool_call>\n{"name": "get_weather",
 *                      "arguments": {"city": "Paris"}}\n</tool_call>
 *
 *   llama3.1         the whole message is one or more JSON objects,
 *                    optionally after <|python_tag|>, separated by ';'
 *                    and/or whitespace:
 *
 *                      {"name": "get_weather", "parameters": {"city": "Paris"}}
 *
 * The generic tool format. Families marked [tools] above keep their
 * template's own tool syntax; every other family gets tools through one
 * format of kvpin's own, written as ordinary messages of the template:
 *
 *   - the tools block goes at the end of the first system message, after
 *     "\n\n" (into a system message of its own in front when there is
 *     none; qwen2's holds its default system text, "\n\n", the block;
 *     llama2, mistral and gemma merge it into the first user turn as they
 *     merge any system message). Its bytes, with each tool object of the
 *     request in canonical JSON (canon.h) on a line of its own:
 *
 *       # Tools\n
 *       \n
 *       You may call one or more functions to assist with the user query.
 *       The functions, one JSON object each:\n            (one line)
 *       {"function":{"description":..,"name":..,"parameters":..},"type":"function"}\n
 *       ...one line per tool...
 *       \n
 *       To call functions, end your reply with one JSON object in this
 *       form, and nothing after it:\n                     (one line)
 *       {"tool_calls":[{"name":"<function-name>","arguments":<args-json-object>}]}
 *
 *   - an assistant message with tool_calls is its content, "\n" when the
 *     content is not empty, and
 *       {"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}
 *     (names as JSON strings, arguments canonical; arguments that are not
 *     JSON as a JSON string);
 *   - tool messages in a row are one user message
 *       {"tool_results":[{"tool_call_id":"call_1","name":"get_weather",
 *                         "content":"{\"temp\":18}"}]}
 *     (members in this order; the name is the message's "name", else that
 *     of the call with this id in the last assistant message with calls;
 *     unknown members are left out; content is a JSON string); llama2,
 *     mistral and gemma, whose templates need user and assistant to
 *     alternate, put a user message that follows the results into the
 *     same turn after "\n\n".
 *
 * All of it is message content: the client's text, tokenized as plain
 * text, and stable bytes for the same tools and calls. A reply is read
 * back as calls when it ends with such a {"tool_calls": [...]} object
 * (kp_chat_parse_tool_calls below).
 *
 * Every function here is pure: no global state, safe from any number of
 * threads.
 */
#ifndef KP_CHAT_H
#define KP_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum {
    KP_CHAT_UNKNOWN = 0,
    KP_CHAT_CHATML,
    KP_CHAT_QWEN2,
    KP_CHAT_QWEN25,
    KP_CHAT_QWEN3,
    KP_CHAT_LLAMA3,
    KP_CHAT_LLAMA31,
    KP_CHAT_LLAMA2,
    KP_CHAT_MISTRAL,
    KP_CHAT_GEMMA,
    KP_CHAT_PHI3,
    KP_CHAT_ZEPHYR,
    KP_CHAT_FAMILY_COUNT
} kp_chat_family;

/* What a rendering needs beyond the messages (chat_tmpl.h). A zeroed
 * struct (or NULL) is valid: no generation prompt, thinking on. The BOS
 * and EOS texts belong to the compiled template; llama3.1's date is the
 * request's date_string kwarg, else "26 Jul 2024" (the 3.1 template's
 * own default: a fixed date keeps the system header, and the cache,
 * stable). */
typedef struct {
    bool add_generation_prompt; /* end with the opening of an assistant turn
                                   (families whose template has one) */
    bool disable_thinking;      /* the template's enable_thinking=false (qwen3:
                                   an empty <think></think> after the prompt) */
} kp_chat_opts;

/* The family of a chat template, recognised from distinctive substrings of
 * its Jinja text ("<|im_start|>", "<|start_header_id|>", "[INST]" with or
 * without "<<SYS>>", "<start_of_turn>", "<|assistant|>" with "<|end|>" or
 * "<|user|>"...). KP_CHAT_UNKNOWN when none matches or text is NULL; the
 * caller then asks for --chat-template. text is borrowed. */
kp_chat_family kp_chat_detect(const char *template_text);

/* The family named name ("chatml", "qwen2", "qwen2.5", "qwen3", "llama3",
 * "llama3.1", "llama2", "mistral", "gemma", "phi3", "zephyr"; case does not
 * matter, and "qwen25", "llama31", "llama3.2", "llama3.3" are accepted), or
 * KP_CHAT_UNKNOWN. */
kp_chat_family kp_chat_family_from_name(const char *name);

/* The canonical name of a family ("qwen2.5"...), "unknown" for
 * KP_CHAT_UNKNOWN or a value outside the enum. The string is static. */
const char *kp_chat_family_name(kp_chat_family f);

/* Whether the family's own template has a tool syntax (qwen2.5, qwen3,
 * llama3.1). The other families render tools, tool calls and tool messages
 * in the generic format (above). */
bool kp_chat_family_has_tools(kp_chat_family f);

/* Checks messages (a JSON array, borrowed) and tools (NULL, JSON null, or
 * an array of tool objects, borrowed; an empty array is the same as none)
 * as family f's built-in template takes them (kp_chat_tmpl_builtin's
 * templates run it before every render): the request normalized as
 * above, rewritten into the generic tool format when f has no tool
 * syntax, and the order llama2, mistral and gemma need. KP_OK, or
 * (KP_EINVAL unless noted) with the field named:
 *   messages not a non-empty array, a message not an object,
 *   'messages[3].role: unknown role "foo"',
 *   'messages[1].content must be a string or an array of text parts',
 *   a content part that is not {"type":"text","text":string},
 *   malformed tool_calls / tools, tool_calls on a non-assistant message,
 *   a tool call's name or a tool message that is not valid UTF-8 (strings
 *   built with jansson's *_nocheck calls) in the generic format,
 *   an order the family's template refuses (llama2, mistral and gemma need
 *   user/assistant turns to alternate after an optional first system
 *   message; llama3.1's own refusals, one tool call per message and a
 *   user message to carry the tool list, are its template's),
 *   KP_ENOMEM. */
kp_status kp_chat_check(kp_chat_family f, const json_t *messages, const json_t *tools, kp_error *err);

/* Whether a request brings tools (a non-empty array) or tool traffic (a
 * tool message, an assistant message with tool calls): what a template
 * without a tool syntax gets in the generic format. */
bool kp_chat_tool_traffic(const json_t *messages, const json_t *tools);

/* messages and tools (as kp_chat_check takes them) rewritten in the
 * generic tool format as family f's template sees them, as a new JSON
 * array of plain system / user / assistant messages with string content
 * (an assistant's reasoning_content kept): for a template in Jinja that
 * renders no tools of its own (chat_tmpl.h). Errors as kp_chat_check's
 * for malformed messages and tools. */
kp_status kp_chat_generic_messages(kp_chat_family f, const json_t *messages, const json_t *tools, json_t **out,
                                   kp_error *err);

/* The tool calls in text[0..len) generated by a model of family f after a
 * rendering with tools (the text after the generation prompt, without the
 * end-of-turn token). text is borrowed and may hold any bytes.
 *
 * On KP_OK, *calls is a new JSON array (the caller owns the reference) of
 * OpenAI tool-call objects, in the order the model wrote them,
 *
 *   {"id": "call_<24 letters and digits>", "type": "function",
 *    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
 *
 * whose arguments are the canonical JSON text (canon.h) of the call's
 * arguments object ("{}" when the call has none), or NULL when the text
 * holds no call. *content_len is the length of the ordinary content: the
 * content is text[0..*content_len), the text in front of the calls with
 * its trailing whitespace dropped (ASCII space, \t, \n, \v, \f, \r); when
 * there is no call, the whole text without its trailing whitespace.
 *
 * Which text counts as calls (the rest is content, never an error):
 *   - qwen2.5 / qwen3: the run of well-formed <tool_call> blocks that ends
 *     the message, separated by whitespace only. A block is "<tool_call>",
 *     whitespace, a JSON object, whitespace, "</tool_call>"; the last block
 *     may lack its closing tag (or end in a cut-off piece of it) when its
 *     JSON is complete. Text after a block, a block whose JSON does not
 *     parse or names no function, or a block cut off inside its JSON ends
 *     the run: what comes before stays content, so no byte of the text is
 *     ever dropped except call markup and the whitespace around it (a
 *     well-formed call followed by a malformed one is content, both of
 *     them; a malformed one followed by a well-formed one leaves the first
 *     in the content and returns the second). qwen3 only: a
 *     <think>...</think> at the start of the text is left untouched (it is
 *     part of the content; calls inside it are not calls); a <think> that
 *     is never closed makes the whole text content.
 *   - llama3.1: the whole text, after optional whitespace and an optional
 *     "<|python_tag|>", is one or more JSON objects separated by ';' and/or
 *     whitespace; anything else makes the whole text content.
 *   - the generic format (every other family): the run of well-formed
 *     blocks that ends the message, separated by whitespace only, as for
 *     qwen; a block is a JSON object whose first member is "tool_calls"
 *     (JSON whitespace allowed anywhere between its tokens), a non-empty
 *     array of well-formed call objects; the calls of all the run's blocks
 *     are returned in order. A block with any malformed call, an empty
 *     array, or text after it (a ``` fence too) is content.
 *   - a well-formed call object has a "name" that is a non-empty string,
 *     and arguments under "arguments" (qwen, generic) or "parameters"
 *     (llama3.1; either key is accepted by all) that are an object, a
 *     string holding a JSON object, null or absent. Other members are
 *     ignored.
 *   - KP_CHAT_UNKNOWN (or a value outside the enum): *calls is NULL and
 *     *content_len is len (the text is returned untouched).
 *
 * Ids are "call_" and 24 characters derived from id_seed and the call's
 * index only: the same seed gives the same ids, whatever the text.
 * Errors: KP_ENOMEM only (then *calls is NULL and *content_len is len). */
kp_status kp_chat_parse_tool_calls(kp_chat_family f, const char *text, size_t len,
                                   uint64_t id_seed, json_t **calls, size_t *content_len,
                                   kp_error *err);

/* For streaming: the offset in text[0..len) from which output must be held
 * back, because the bytes from there on are, or may become as more text
 * arrives, a tool call of family f or the whitespace in front of one. len
 * when nothing needs holding; always len for KP_CHAT_UNKNOWN.
 *
 *   qwen2.5 / qwen3   the start of the run of calls that may still end the
 *                     message: a complete well-formed <tool_call> block, a
 *                     block still being written, or any proper prefix of
 *                     "<tool_call>" at the end of the text ("Hi <tool_c" ->
 *                     2, "Hi <b>" -> 6), and the whitespace before it
 *   llama3.1          0 while the text so far may become a calls message
 *                     (it starts, after whitespace, with '{' or with a
 *                     prefix of "<|python_tag|>", and is well-formed so far)
 *   generic           as qwen, with blocks starting at a '{' that is, or
 *                     may still become, {"tool_calls": [ ("Hi {" -> 2,
 *                     "Hi {\"tool" -> 2, "Hi {\"a\"" -> 7)
 *
 * Trailing whitespace is held too (it is dropped from the content when
 * nothing follows it). Guarantees, for the prefixes p of a final text T:
 * the offset never decreases as p grows, and it never passes T's
 * *content_len from kp_chat_parse_tool_calls: the bytes released before
 * it are always the first bytes of T's content, never part of a call.
 * O(len), plus a JSON parse of every complete block on each call. When
 * memory runs out parsing one, it returns 0 (hold everything); a caller
 * keeps what it already released and releases nothing more. */
size_t kp_chat_tool_holdback(kp_chat_family f, const char *text, size_t len);

/* What a forced tool call must look like, for constrained decoding: the
 * model's reply is prefix, then a JSON value valid under schema, then
 * suffix, and kp_chat_parse_tool_calls reads every such reply back as the
 * calls it holds (with no content).
 *
 *   family              prefix            schema                  suffix
 *   qwen2.5, qwen3      "<tool_call>\n"   one call object         "\n</tool_call>"
 *   llama3.1            ""                one call object         ""
 *                                         ("parameters", not "arguments")
 *   generic (others)    ""                {"tool_calls": [calls]}  ""
 *
 * A call object's schema is
 *   {"type":"object","properties":{"name":{"const":NAME},"arguments":ARGS},
 *    "required":["name","arguments"],"additionalProperties":false}
 * with ARGS the tool's function.parameters (copied; "type":"object" set
 * when it has no type or a list of types with "object"; no parameters is
 * {"type":"object","properties":{},"additionalProperties":false}); with
 * several tools, {"anyOf": [one per tool, in order]}. The generic schema is
 *   {"type":"object","properties":{"tool_calls":{"type":"array",
 *    "items":CALL,"minItems":1[,"maxItems":1]}},"required":["tool_calls"],
 *    "additionalProperties":false}
 * with maxItems only when parallel is false. The native forms hold one call.
 *
 * tools is the request's array (borrowed); name NULL for any of its
 * functions (tool_choice "required"), or the one function to call
 * (tool_choice {"type":"function","function":{"name":...}}).
 * On KP_OK, form owns its members (kp_chat_call_form_free). Errors (form
 * zeroed): KP_EINVAL for tools that are not a non-empty array of
 * {"type":"function","function":{"name":...}}, parameters that are not an
 * object schema, a name no tool has ("tool_choice: no function named ...");
 * KP_EUNSUPPORTED for KP_CHAT_UNKNOWN; KP_ENOMEM. */
typedef struct {
    char *prefix; /* literal bytes before the JSON value */
    size_t prefix_len;
    json_t *schema; /* JSON Schema of the value (owned reference) */
    char *suffix; /* literal bytes after it */
    size_t suffix_len;
} kp_chat_call_form;

kp_status kp_chat_call_form_build(kp_chat_family f, const json_t *tools, const char *name,
                                  bool parallel, kp_chat_call_form *form, kp_error *err);

/* Frees what form holds and zeroes it; NULL is a no-op. */
void kp_chat_call_form_free(kp_chat_call_form *form);

#endif
