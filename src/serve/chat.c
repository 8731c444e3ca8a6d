/*
 * chat.c - the chat template families (see chat.h): their names and
 * detection, a request's conversation loaded and normalized (chat_impl.h),
 * the checks a built-in template's request passes (kp_chat_check), and
 * the generic tool format. The families' layouts are Jinja text
 * (src/serve/templates/, chat_builtin.h) rendered by chat_tmpl.c; the way
 * back from generated text to calls is chat_calls.c.
 *
 * Owns no state. A request is checked and rewritten in two passes:
 *
 *   1. load: the request's messages and tools are checked and normalized
 *      into a chat_conv (below); every error names the offending field.
 *      Content arrays are joined, tool-call arguments and tool schemas are
 *      written as canonical JSON (kp_canon_*), so what follows never sees
 *      jansson values and never fails on types.
 *   2. for families without a tool syntax, generic_tools rewrites the
 *      loaded conversation into the generic tool format (plain system /
 *      user / assistant messages; its section says how), and
 *      kp_chat_generic_messages hands it to a template as JSON. The
 *      refusals of templates that need user and assistant to alternate
 *      are checked on the rewritten conversation, naming the request's
 *      message.
 *
 *   chat_conv                        chat_msg (one per message)
 *   +-----------------------------+  +----------------------------------+
 *   | msgs  -> chat_msg[n]        |  | role      SYSTEM/USER/ASSISTANT/ |
 *   | n                           |  |           TOOL                   |
 *   | tools -> chat_text[n_tools] |  | content   owned copy, parts      |
 *   |   (canonical JSON, owned)   |  |           joined by "\n"; "" for |
 *   +-----------------------------+  |           null                   |
 *                                    | reasoning borrowed from the json |
 *                                    | calls  -> chat_call[n_calls]     |
 *                                    |   name (borrowed), args (owned,  |
 *                                    |   canonical JSON or verbatim)    |
 *                                    +----------------------------------+
 *
 * Borrowed strings point into the caller's json_t, alive for the call.
 * Texts carry lengths: a JSON string may hold U+0000.
 *
 * The way back, from generated text to OpenAI tool calls
 * (kp_chat_parse_tool_calls, kp_chat_tool_holdback), is chat_calls.c:
 * one scan cuts the text into content and call blocks for both, so the
 * parser and the streaming holdback cannot disagree; its comment draws
 * the block layout.
 */
#include "serve/chat.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/rng.h"
#include "base/canon.h"
#include "serve/chat_impl.h"

/* ------------------------------------------------------------------ */
/* Families                                                            */

static const struct {
    const char *name;
    bool tools;
} families[KP_CHAT_FAMILY_COUNT] = {
    [KP_CHAT_UNKNOWN] = {"unknown", false}, [KP_CHAT_CHATML] = {"chatml", false},
    [KP_CHAT_QWEN2] = {"qwen2", false},     [KP_CHAT_QWEN25] = {"qwen2.5", true},
    [KP_CHAT_QWEN3] = {"qwen3", true},      [KP_CHAT_LLAMA3] = {"llama3", false},
    [KP_CHAT_LLAMA31] = {"llama3.1", true}, [KP_CHAT_LLAMA2] = {"llama2", false},
    [KP_CHAT_MISTRAL] = {"mistral", false}, [KP_CHAT_GEMMA] = {"gemma", false},
    [KP_CHAT_PHI3] = {"phi3", false},       [KP_CHAT_ZEPHYR] = {"zephyr", false},
};

const char *kp_chat_family_name(kp_chat_family f) {
    if ((unsigned)f >= KP_CHAT_FAMILY_COUNT) return "unknown";
    return families[f].name;
}

bool kp_chat_family_has_tools(kp_chat_family f) {
    return (unsigned)f < KP_CHAT_FAMILY_COUNT && families[f].tools;
}

kp_chat_family kp_chat_family_from_name(const char *name) {
    static const struct {
        const char *alias;
        kp_chat_family f;
    } aliases[] = {{"qwen25", KP_CHAT_QWEN25},   {"qwen2_5", KP_CHAT_QWEN25},
                   {"llama31", KP_CHAT_LLAMA31}, {"llama3_1", KP_CHAT_LLAMA31},
                   {"llama3.2", KP_CHAT_LLAMA31}, {"llama3.3", KP_CHAT_LLAMA31}};
    if (!name) return KP_CHAT_UNKNOWN;
    for (int f = 1; f < KP_CHAT_FAMILY_COUNT; f++)
        if (!strcasecmp(name, families[f].name)) return (kp_chat_family)f;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcasecmp(name, aliases[i].alias)) return aliases[i].f;
    return KP_CHAT_UNKNOWN;
}

/* Ordered checks: the first family whose markers all occur wins. The
 * Qwen variants share <|im_start|>, so their own markers come first. */
kp_chat_family kp_chat_detect(const char *t) {
    if (!t) return KP_CHAT_UNKNOWN;
#define HAS(s) (strstr(t, s) != NULL)
    if (HAS("<|im_start|>")) {
        if (HAS("<think>") || HAS("</think>")) return KP_CHAT_QWEN3;
        if (HAS("You are Qwen, created by Alibaba Cloud") || HAS("<tool_call>"))
            return KP_CHAT_QWEN25;
        if (HAS("You are a helpful assistant")) return KP_CHAT_QWEN2;
        return KP_CHAT_CHATML;
    }
    if (HAS("<|start_header_id|>")) {
        if (HAS("Cutting Knowledge Date") || HAS("Environment: ipython")) return KP_CHAT_LLAMA31;
        return KP_CHAT_LLAMA3;
    }
    if (HAS("<start_of_turn>")) return KP_CHAT_GEMMA;
    if (HAS("[INST]")) return HAS("<<SYS>>") ? KP_CHAT_LLAMA2 : KP_CHAT_MISTRAL;
    if (HAS("<|assistant|>")) {
        if (HAS("<|end|>")) return KP_CHAT_PHI3;
        if (HAS("<|user|>")) return KP_CHAT_ZEPHYR;
    }
#undef HAS
    return KP_CHAT_UNKNOWN;
}

const char *const kp_chat_role_names[] = {"system", "user", "assistant", "tool"};

/* ------------------------------------------------------------------ */
/* Text helpers                                                        */

const char *kp_chat_find(const char *s, size_t len, const char *needle) {
    return memmem(s, len, needle, strlen(needle));
}

/* ------------------------------------------------------------------ */
/* The normalized conversation                                         */


void kp_chat_conv_free(chat_conv *c) {
    for (size_t i = 0; c->msgs && i < c->n; i++) {
        free(c->msgs[i].content);
        for (size_t j = 0; j < c->msgs[i].n_calls; j++) free(c->msgs[i].calls[j].args);
        free(c->msgs[i].calls);
    }
    free(c->msgs);
    for (size_t i = 0; c->tools && i < c->n_tools; i++) free(c->tools[i].text);
    free(c->tools);
    memset(c, 0, sizeof *c);
}

kp_status kp_chat_oom(kp_error *err) {
    return kp_fail(err, KP_ENOMEM, "out of memory rendering the chat");
}

/* content: a string or an array of text parts -> one owned string. */
static kp_status load_content(chat_msg *m, size_t i, const json_t *content, kp_error *err) {
    if (json_is_string(content)) {
        m->content_len = json_string_length(content);
        m->content = malloc(m->content_len + 1);
        if (!m->content) return kp_chat_oom(err);
        memcpy(m->content, json_string_value(content), m->content_len);
        m->content[m->content_len] = 0;
        return KP_OK;
    }
    if (!json_is_array(content))
        return kp_fail(err, KP_EINVAL,
                       "messages[%zu].content must be a string or an array of text parts", i);
    kp_buf b = {0};
    for (size_t p = 0; p < json_array_size(content); p++) {
        const json_t *part = json_array_get(content, p);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        kp_status st = KP_OK;
        if (!json_is_object(part))
            st = kp_fail(err, KP_EINVAL, "messages[%zu].content[%zu] must be an object", i, p);
        else if (!json_is_string(type))
            st = kp_fail(err, KP_EINVAL, "messages[%zu].content[%zu].type must be a string", i, p);
        else if (strcmp(json_string_value(type), "text") != 0)
            st = kp_fail(err, KP_EINVAL,
                         "messages[%zu].content[%zu].type: unsupported content part \"%s\" "
                         "(only \"text\" parts can be rendered)",
                         i, p, json_string_value(type));
        else if (!json_is_string(text))
            st = kp_fail(err, KP_EINVAL, "messages[%zu].content[%zu].text must be a string", i, p);
        if (st != KP_OK) {
            kp_buf_free(&b);
            return st;
        }
        if (p) kp_buf_put(&b, "\n", 1);
        kp_buf_put(&b, json_string_value(text), json_string_length(text));
    }
    return kp_buf_take(&b, &m->content, &m->content_len) ? KP_OK : kp_chat_oom(err);
}

/* Canonical JSON of arguments given as a JSON text or as a value. */
static kp_status load_arguments(chat_call *c, size_t i, size_t j, const json_t *args,
                                kp_error *err) {
    kp_error local = {0};
    kp_status st;
    if (json_is_string(args)) {
        const char *text = json_string_value(args);
        size_t len = json_string_length(args);
        st = kp_canon_text(text, len, &c->args, &c->args_len, &local);
        if (st == KP_OK) return KP_OK;
        if (st == KP_ENOMEM) return kp_chat_oom(err);
        /* not JSON (or not canonicalizable): the model gets the client's text */
        c->args_verbatim = true;
        c->args = malloc(len + 1);
        if (!c->args) return kp_chat_oom(err);
        memcpy(c->args, text, len);
        c->args[len] = 0;
        c->args_len = len;
        return KP_OK;
    }
    if (json_is_object(args) || json_is_array(args)) {
        st = kp_canon_dump(args, &c->args, &c->args_len, &local);
        if (st == KP_OK) return KP_OK;
        return kp_fail(err, st, "messages[%zu].tool_calls[%zu].function.arguments: %s", i, j,
                       local.msg);
    }
    return kp_fail(err, KP_EINVAL,
                   "messages[%zu].tool_calls[%zu].function.arguments must be a string (JSON "
                   "text) or an object",
                   i, j);
}

static kp_status load_calls(chat_msg *m, size_t i, const json_t *calls, kp_error *err) {
    if (!calls || json_is_null(calls)) return KP_OK;
    if (!json_is_array(calls))
        return kp_fail(err, KP_EINVAL, "messages[%zu].tool_calls must be an array", i);
    size_t n = json_array_size(calls);
    if (n == 0) return KP_OK;
    if (m->role != ROLE_ASSISTANT)
        return kp_fail(err, KP_EINVAL,
                       "messages[%zu].tool_calls: only assistant messages carry tool calls", i);
    m->calls = calloc(n, sizeof *m->calls);
    if (!m->calls) return kp_chat_oom(err);
    for (size_t j = 0; j < n; j++) {
        const json_t *call = json_array_get(calls, j);
        if (!json_is_object(call))
            return kp_fail(err, KP_EINVAL, "messages[%zu].tool_calls[%zu] must be an object", i, j);
        const json_t *type = json_object_get(call, "type");
        if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].tool_calls[%zu].type must be \"function\"", i, j);
        const json_t *id = json_object_get(call, "id");
        if (id && !json_is_string(id))
            return kp_fail(err, KP_EINVAL, "messages[%zu].tool_calls[%zu].id must be a string", i,
                           j);
        const json_t *fn = json_object_get(call, "function");
        if (!json_is_object(fn))
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].tool_calls[%zu].function must be an object", i, j);
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name) || json_string_length(name) == 0)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].tool_calls[%zu].function.name must be a non-empty string",
                           i, j);
        m->calls[j].name = json_string_value(name);
        m->calls[j].name_len = json_string_length(name);
        m->calls[j].id = json_string_value(id);
        m->calls[j].id_len = id ? json_string_length(id) : 0;
        m->n_calls = j + 1; /* from here on conv_free releases args */
        kp_status st = load_arguments(&m->calls[j], i, j, json_object_get(fn, "arguments"), err);
        if (st != KP_OK) return st;
    }
    return KP_OK;
}

static kp_status load_message(chat_msg *m, size_t i, const json_t *msg, kp_error *err) {
    if (!json_is_object(msg)) return kp_fail(err, KP_EINVAL, "messages[%zu] must be an object", i);
    const json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role))
        return kp_fail(err, KP_EINVAL,
                       "messages[%zu].role must be a string (\"system\", \"developer\", "
                       "\"user\", \"assistant\" or \"tool\")",
                       i);
    const char *r = json_string_value(role);
    int found = -1;
    for (int k = 0; k < 4; k++)
        if (json_string_length(role) == strlen(kp_chat_role_names[k]) && !strcmp(r, kp_chat_role_names[k]))
            found = k;
    /* OpenAI's developer messages are the system messages of newer models:
     * every template renders them as system */
    if (json_string_length(role) == 9 && !strcmp(r, "developer")) found = ROLE_SYSTEM;
    if (found < 0)
        return kp_fail(err, KP_EINVAL, "messages[%zu].role: unknown role \"%.64s\"", i, r);
    m->role = (chat_role)found;

    kp_status st = load_calls(m, i, json_object_get(msg, "tool_calls"), err);
    if (st != KP_OK) return st;

    const json_t *content = json_object_get(msg, "content");
    if (!content || json_is_null(content)) {
        if (m->n_calls == 0)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].content must be a string or an array of text parts "
                           "(null only for an assistant message with tool_calls)",
                           i);
        m->content = calloc(1, 1);
        if (!m->content) return kp_chat_oom(err);
    } else {
        st = load_content(m, i, content, err);
        if (st != KP_OK) return st;
    }

    const json_t *reasoning = json_object_get(msg, "reasoning_content");
    if (reasoning && !json_is_null(reasoning)) {
        if (!json_is_string(reasoning))
            return kp_fail(err, KP_EINVAL, "messages[%zu].reasoning_content must be a string", i);
        m->reasoning = json_string_value(reasoning);
        m->reasoning_len = json_string_length(reasoning);
    }
    static const char *const string_fields[] = {"tool_call_id", "name"};
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(msg, string_fields[k]);
        if (v && !json_is_null(v) && !json_is_string(v))
            return kp_fail(err, KP_EINVAL, "messages[%zu].%s must be a string", i,
                           string_fields[k]);
        const char **at = k == 0 ? &m->tool_call_id : &m->tool_name;
        *at = json_string_value(v); /* NULL unless a string */
        *(k == 0 ? &m->tool_call_id_len : &m->tool_name_len) = *at ? json_string_length(v) : 0;
    }
    return KP_OK;
}

static kp_status load_tools(chat_conv *c, const json_t *tools, kp_error *err) {
    if (!tools || json_is_null(tools)) return KP_OK;
    if (!json_is_array(tools)) return kp_fail(err, KP_EINVAL, "tools must be an array");
    size_t n = json_array_size(tools);
    if (n == 0) return KP_OK;
    c->tools = calloc(n, sizeof *c->tools);
    if (!c->tools) return kp_chat_oom(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(tools, i);
        if (!json_is_object(t)) return kp_fail(err, KP_EINVAL, "tools[%zu] must be an object", i);
        const json_t *fn = json_object_get(t, "function");
        if (fn && !json_is_object(fn))
            return kp_fail(err, KP_EINVAL, "tools[%zu].function must be an object", i);
        if (fn && !json_is_string(json_object_get(fn, "name")))
            return kp_fail(err, KP_EINVAL, "tools[%zu].function.name must be a string", i);
        kp_error local = {0};
        kp_status st = kp_canon_dump(t, &c->tools[i].text, &c->tools[i].len, &local);
        c->n_tools = i + 1;
        if (st != KP_OK) return kp_fail(err, st, "tools[%zu]: %s", i, local.msg);
    }
    return KP_OK;
}

kp_status kp_chat_conv_load(chat_conv *c, const json_t *messages, const json_t *tools,
                           kp_error *err) {
    memset(c, 0, sizeof *c);
    if (!json_is_array(messages)) return kp_fail(err, KP_EINVAL, "messages must be an array");
    size_t n = json_array_size(messages);
    if (n == 0) return kp_fail(err, KP_EINVAL, "messages must not be empty");
    c->msgs = calloc(n, sizeof *c->msgs);
    if (!c->msgs) return kp_chat_oom(err);
    c->n = n;
    for (size_t i = 0; i < n; i++) {
        c->msgs[i].src = i;
        kp_status st = load_message(&c->msgs[i], i, json_array_get(messages, i), err);
        if (st != KP_OK) return st;
    }
    return load_tools(c, tools, err);
}

/* llama2, mistral, gemma: after an optional first system message, user and
 * assistant alternate, starting with user (the templates raise otherwise). */
static kp_status check_alternation(const chat_conv *c, size_t first, kp_chat_family f, kp_error *err) {
    for (size_t i = first; i < c->n; i++) {
        chat_role want = (i - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        if (c->msgs[i].role == want) continue;
        if (c->msgs[i].role == ROLE_SYSTEM)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].role: the %s chat template takes a system message only "
                           "as the first message",
                           c->msgs[i].src, families[f].name);
        return kp_fail(err, KP_EINVAL,
                       "messages[%zu].role: the %s chat template expects \"%s\" here (after an "
                       "optional first system message, user and assistant messages alternate, "
                       "starting with user)",
                       c->msgs[i].src, families[f].name, kp_chat_role_names[want]);
    }
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* The generic tool format                                             */
/*
 * Families whose template has no tool syntax get tools through one format
 * of kvpin's own (chat.h has the bytes). It is a rewrite of the loaded
 * conversation into plain system / user / assistant messages, so every
 * renderer writes it as its template writes any such message:
 *
 *   tools                   the tools block appended to the first system
 *                           message (after "\n\n"), or a system message
 *                           of its own in front (qwen2: its default
 *                           system text, "\n\n", the block)
 *   assistant + tool_calls  content, "\n" when there is content, then
 *                           {"tool_calls":[{"name":..,"arguments":..}]}
 *   tool messages in a row  one user message {"tool_results":[...]};
 *                           llama2, mistral and gemma (whose templates
 *                           need strict alternation) also take a user
 *                           message right after them into it, after
 *                           "\n\n"
 *
 * The rewritten messages are message content, so the whole of it, tool
 * definitions included, is the client's text (plain ranges). chat_msg.src
 * keeps the request's index for error messages.
 */

static const char generic_tools_intro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query. The "
    "functions, one JSON object each:\n";
static const char generic_tools_outro[] =
    "\nTo call functions, end your reply with one JSON object in this form, and nothing after "
    "it:\n{\"tool_calls\":[{\"name\":\"<function-name>\",\"arguments\":<args-json-object>}]}";

/* The canonical JSON string of s[0..n) (a quoted, escaped string). */
static bool put_json_string(kp_buf *b, const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    char *q = NULL;
    size_t qlen = 0;
    bool ok = v && kp_canon_dump(v, &q, &qlen, NULL) == KP_OK;
    json_decref(v);
    if (ok) kp_buf_put(b, q, qlen);
    free(q);
    return ok;
}

static kp_status generic_utf8(size_t src, kp_error *err) {
    return kp_fail(err, KP_EINVAL, "messages[%zu] is not valid UTF-8", src);
}

/* {"tool_calls":[...]} of an assistant message's calls. */
static kp_status generic_put_calls(kp_buf *b, const chat_msg *m, kp_error *err) {
    kp_buf_puts(b, "{\"tool_calls\":[");
    for (size_t j = 0; j < m->n_calls; j++) {
        const chat_call *call = &m->calls[j];
        kp_buf_puts(b, j ? ",{\"name\":" : "{\"name\":");
        if (!put_json_string(b, call->name, call->name_len)) return generic_utf8(m->src, err);
        kp_buf_puts(b, ",\"arguments\":");
        if (!call->args_verbatim) kp_buf_put(b, call->args, call->args_len);
        else if (!put_json_string(b, call->args, call->args_len)) return generic_utf8(m->src, err);
        kp_buf_puts(b, "}");
    }
    kp_buf_puts(b, "]}");
    return KP_OK;
}

/* The name of the call the tool message m answers: its own "name", else
 * the call with its tool_call_id in the last assistant message with calls
 * of prev[0..n_prev). NULL when neither is known. */
static const char *generic_tool_name(const chat_msg *prev, size_t n_prev, const chat_msg *m,
                                     size_t *len) {
    *len = m->tool_name_len;
    if (m->tool_name || !m->tool_call_id) return m->tool_name;
    for (size_t k = n_prev; k-- > 0;) {
        if (prev[k].role != ROLE_ASSISTANT || !prev[k].n_calls) continue;
        for (size_t j = 0; j < prev[k].n_calls; j++) {
            const chat_call *call = &prev[k].calls[j];
            if (call->id && call->id_len == m->tool_call_id_len &&
                !memcmp(call->id, m->tool_call_id, call->id_len)) {
                *len = call->name_len;
                return call->name;
            }
        }
        break;
    }
    return NULL;
}

/* {"tool_call_id":..,"name":..,"content":..} of the tool message m, the
 * messages before it being prev[0..n_prev) (members that are not known
 * are left out). */
static kp_status generic_put_result(kp_buf *b, const chat_msg *prev, size_t n_prev,
                                    const chat_msg *m, kp_error *err) {
    size_t name_len = 0;
    const char *name = generic_tool_name(prev, n_prev, m, &name_len);
    bool ok = true;
    kp_buf_puts(b, "{");
    if (m->tool_call_id) {
        kp_buf_puts(b, "\"tool_call_id\":");
        ok = put_json_string(b, m->tool_call_id, m->tool_call_id_len);
        kp_buf_puts(b, ",");
    }
    if (ok && name) {
        kp_buf_puts(b, "\"name\":");
        ok = put_json_string(b, name, name_len);
        kp_buf_puts(b, ",");
    }
    kp_buf_puts(b, "\"content\":");
    ok = ok && put_json_string(b, m->content, m->content_len);
    kp_buf_puts(b, "}");
    return ok ? KP_OK : generic_utf8(m->src, err);
}

static void msg_release(chat_msg *m) {
    free(m->content);
    for (size_t j = 0; j < m->n_calls; j++) free(m->calls[j].args);
    free(m->calls);
    m->content = NULL;
    m->calls = NULL;
    m->n_calls = 0;
}

/* Replaces m's content with b's bytes (b is emptied). */
static kp_status msg_set_content(chat_msg *m, kp_buf *b, kp_error *err) {
    char *text = NULL;
    size_t len = 0;
    if (!kp_buf_take(b, &text, &len)) return kp_chat_oom(err);
    free(m->content);
    m->content = text;
    m->content_len = len;
    return KP_OK;
}

/* The tools block of chat.h. */
static void generic_put_tools(kp_buf *b, const chat_conv *c) {
    kp_buf_puts(b, generic_tools_intro);
    for (size_t t = 0; t < c->n_tools; t++) {
        kp_buf_put(b, c->tools[t].text, c->tools[t].len);
        kp_buf_puts(b, "\n");
    }
    kp_buf_puts(b, generic_tools_outro);
}

/* Rewrites c in the generic format (the comment above) for family f. */
kp_status kp_chat_generic_tools(chat_conv *c, kp_chat_family f, kp_error *err) {
    bool alternate = f == KP_CHAT_LLAMA2 || f == KP_CHAT_MISTRAL || f == KP_CHAT_GEMMA;
    bool insert = c->n_tools && c->msgs[0].role != ROLE_SYSTEM;
    chat_msg *out = calloc(c->n + 1, sizeof *out);
    if (!out) return kp_chat_oom(err);
    size_t n = 0;
    kp_status st = KP_OK;
    kp_buf b = {0};
    if (insert) {
        out[n].role = ROLE_SYSTEM;
        out[n].src = 0;
        if (f == KP_CHAT_QWEN2) kp_buf_puts(&b, "You are a helpful assistant.\n\n");
        generic_put_tools(&b, c);
        st = msg_set_content(&out[n++], &b, err);
    }
    for (size_t i = 0; i < c->n && st == KP_OK;) {
        chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_TOOL) {
            /* the run of tool messages (and, alternating, a user message after it) */
            chat_msg *r = &out[n++];
            r->role = ROLE_USER;
            r->src = m->src;
            kp_buf_puts(&b, "{\"tool_results\":[");
            size_t k = i;
            for (; st == KP_OK && k < c->n && c->msgs[k].role == ROLE_TOOL; k++) {
                if (k > i) kp_buf_puts(&b, ",");
                st = generic_put_result(&b, out, n - 1, &c->msgs[k], err);
            }
            kp_buf_puts(&b, "]}");
            if (st == KP_OK && alternate && k < c->n && c->msgs[k].role == ROLE_USER) {
                kp_buf_puts(&b, "\n\n");
                kp_buf_put(&b, c->msgs[k].content, c->msgs[k].content_len);
                k++;
            }
            if (st == KP_OK) st = msg_set_content(r, &b, err);
            for (size_t j = i; j < k; j++) msg_release(&c->msgs[j]);
            i = k;
            continue;
        }
        out[n] = *m; /* moved: the old slot no longer owns anything */
        memset(m, 0, sizeof *m);
        m = &out[n++];
        if (i == 0 && m->role == ROLE_SYSTEM && c->n_tools) {
            kp_buf_put(&b, m->content, m->content_len);
            if (m->content_len) kp_buf_puts(&b, "\n\n");
            generic_put_tools(&b, c);
            st = msg_set_content(m, &b, err);
        } else if (m->n_calls) {
            kp_buf_put(&b, m->content, m->content_len);
            if (m->content_len) kp_buf_puts(&b, "\n");
            st = generic_put_calls(&b, m, err);
            if (st == KP_OK) st = msg_set_content(m, &b, err);
        }
        i++;
    }
    kp_buf_free(&b);
    /* the calls are in the content now (tool results looked their names up) */
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < out[i].n_calls; j++) free(out[i].calls[j].args);
        free(out[i].calls);
        out[i].calls = NULL;
        out[i].n_calls = 0;
    }
    /* out takes the place of c->msgs whatever happened: conv_free frees both */
    for (size_t i = 0; i < c->n; i++) msg_release(&c->msgs[i]);
    free(c->msgs);
    c->msgs = out;
    c->n = n;
    return st;
}


/* ------------------------------------------------------------------ */
/* The generic tool format for templates in Jinja                      */

bool kp_chat_tool_traffic(const json_t *messages, const json_t *tools) {
    if (json_array_size(tools) > 0) return true;
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if ((role && !strcmp(role, "tool")) || json_array_size(json_object_get(m, "tool_calls")) > 0) return true;
    }
    return false;
}

kp_status kp_chat_check(kp_chat_family f, const json_t *messages, const json_t *tools, kp_error *err) {
    chat_conv c;
    kp_status st = kp_chat_conv_load(&c, messages, tools, err);
    if (st == KP_OK && !kp_chat_family_has_tools(f)) st = kp_chat_generic_tools(&c, f, err);
    if (st == KP_OK && (f == KP_CHAT_LLAMA2 || f == KP_CHAT_MISTRAL || f == KP_CHAT_GEMMA))
        st = check_alternation(&c, c.msgs[0].role == ROLE_SYSTEM ? 1 : 0, f, err);
    kp_chat_conv_free(&c);
    return st;
}

kp_status kp_chat_generic_messages(kp_chat_family f, const json_t *messages, const json_t *tools, json_t **out,
                                   kp_error *err) {
    *out = NULL;
    chat_conv c = {0};
    kp_status st = kp_chat_conv_load(&c, messages, tools, err);
    if (st == KP_OK) st = kp_chat_generic_tools(&c, f, err);
    json_t *arr = st == KP_OK ? json_array() : NULL;
    if (st == KP_OK && !arr) st = kp_chat_oom(err);
    for (size_t i = 0; st == KP_OK && i < c.n; i++) {
        const chat_msg *m = &c.msgs[i];
        json_t *o = json_pack("{s:s, s:s%}", "role", kp_chat_role_names[m->role], "content", m->content,
                              m->content_len);
        if (o && m->reasoning) json_object_set_new(o, "reasoning_content", json_stringn(m->reasoning, m->reasoning_len));
        if (!o || json_array_append_new(arr, o)) st = kp_chat_oom(err);
    }
    kp_chat_conv_free(&c);
    if (st != KP_OK) {
        json_decref(arr);
        return st;
    }
    *out = arr;
    return KP_OK;
}
