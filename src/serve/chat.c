/*
 * chat.c - chat template families rendered in C (see chat.h).
 *
 * Owns no state. A render is two passes:
 *
 *   1. load: the request's messages and tools are checked and normalized
 *      into a chat_conv (below); every error names the offending field.
 *      Content arrays are joined, tool-call arguments and tool schemas are
 *      written as canonical JSON (kp_canon_*), so the renderers never see
 *      jansson values and never fail on types.
 *   2. render: one function per family writes the layout its Jinja
 *      template writes, in the template's order; each says which template
 *      it follows. Refusals the template makes (raise_exception: roles
 *      that do not alternate, two tool calls for Llama 3.1) are errors.
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
 * (kp_chat_parse_tool_calls, kp_chat_tool_holdback), is the last section:
 * one scan cuts the text into content and call blocks for both, so the
 * parser and the streaming holdback cannot disagree; its comment draws
 * the block layout.
 *
 * Whitespace trimming follows Python's str.strip() (Jinja's trim filter
 * and the .strip() calls in the templates): the code points for which
 * str.isspace() is true, U+0009-000D, U+001C-0020, U+0085, U+00A0,
 * U+1680, U+2000-200A, U+2028, U+2029, U+202F, U+205F, U+3000.
 */
#include "serve/chat.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/rng.h"
#include "base/unicode.h"
#include "serve/canon.h"

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

/* ------------------------------------------------------------------ */
/* Python-style strip                                                  */

static bool py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* The code point starting at s[i] and its length in *n. Strings from
 * jansson are valid UTF-8; bytes that are not (possible only in values
 * built with jansson's *_nocheck calls) count one by one, as characters
 * that are not spaces. */
static uint32_t cp_at(const unsigned char *s, size_t i, size_t len, size_t *n) {
    uint32_t cp;
    int k = kp_unicode_utf8_decode(s + i, len - i, &cp);
    *n = k > 0 ? (size_t)k : 1;
    return k > 0 ? cp : KP_UNICODE_REPLACEMENT;
}

typedef struct {
    const char *s;
    size_t len;
} chat_span;

/* s[0..len) without leading (left) and/or trailing (right) whitespace. */
static chat_span py_strip(const char *str, size_t len, bool left, bool right) {
    const unsigned char *s = (const unsigned char *)str;
    size_t b = 0, e = len, n;
    while (left && b < e && py_space(cp_at(s, b, e, &n))) b += n;
    while (right && e > b) {
        size_t start = e - 1;
        while (start > b && (s[start] & 0xC0) == 0x80) start--;
        if (!py_space(cp_at(s, start, e, &n))) break;
        e = start;
    }
    return (chat_span){str + b, e - b};
}


/* s[0..len) without leading / trailing '\n' (Python's strip('\n') family). */
static chat_span strip_newlines(const char *s, size_t len, bool left, bool right) {
    size_t b = 0, e = len;
    while (left && b < e && s[b] == '\n') b++;
    while (right && e > b && s[e - 1] == '\n') e--;
    return (chat_span){s + b, e - b};
}

static const char *find(const char *s, size_t len, const char *needle) {
    return memmem(s, len, needle, strlen(needle));
}

static const char *find_last(const char *s, size_t len, const char *needle) {
    size_t nl = strlen(needle);
    for (size_t i = len >= nl ? len - nl + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, nl)) return s + i;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* The normalized conversation                                         */

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } chat_role;

static const char *const role_names[] = {"system", "user", "assistant", "tool"};

typedef struct {
    const char *name; /* borrowed */
    size_t name_len;
    char *args; /* owned: canonical JSON, or the client's text when it is not JSON */
    size_t args_len;
} chat_call;

typedef struct {
    chat_role role;
    char *content; /* owned, never NULL */
    size_t content_len;
    const char *reasoning; /* borrowed; NULL when absent or null */
    size_t reasoning_len;
    chat_call *calls;
    size_t n_calls;
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

static void conv_free(chat_conv *c) {
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

static kp_status oom(kp_error *err) {
    return kp_fail(err, KP_ENOMEM, "out of memory rendering the chat");
}

/* content: a string or an array of text parts -> one owned string. */
static kp_status load_content(chat_msg *m, size_t i, const json_t *content, kp_error *err) {
    if (json_is_string(content)) {
        m->content_len = json_string_length(content);
        m->content = malloc(m->content_len + 1);
        if (!m->content) return oom(err);
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
    return kp_buf_take(&b, &m->content, &m->content_len) ? KP_OK : oom(err);
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
        if (st == KP_ENOMEM) return oom(err);
        /* not JSON (or not canonicalizable): the model gets the client's text */
        c->args = malloc(len + 1);
        if (!c->args) return oom(err);
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
    if (!m->calls) return oom(err);
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
                       "messages[%zu].role must be a string (\"system\", \"user\", "
                       "\"assistant\" or \"tool\")",
                       i);
    const char *r = json_string_value(role);
    int found = -1;
    for (int k = 0; k < 4; k++)
        if (json_string_length(role) == strlen(role_names[k]) && !strcmp(r, role_names[k]))
            found = k;
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
        if (!m->content) return oom(err);
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
    }
    return KP_OK;
}

static kp_status load_tools(chat_conv *c, const json_t *tools, kp_error *err) {
    if (!tools || json_is_null(tools)) return KP_OK;
    if (!json_is_array(tools)) return kp_fail(err, KP_EINVAL, "tools must be an array");
    size_t n = json_array_size(tools);
    if (n == 0) return KP_OK;
    c->tools = calloc(n, sizeof *c->tools);
    if (!c->tools) return oom(err);
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

static kp_status conv_load(chat_conv *c, const json_t *messages, const json_t *tools,
                           kp_error *err) {
    memset(c, 0, sizeof *c);
    if (!json_is_array(messages)) return kp_fail(err, KP_EINVAL, "messages must be an array");
    size_t n = json_array_size(messages);
    if (n == 0) return kp_fail(err, KP_EINVAL, "messages must not be empty");
    c->msgs = calloc(n, sizeof *c->msgs);
    if (!c->msgs) return oom(err);
    c->n = n;
    for (size_t i = 0; i < n; i++) {
        kp_status st = load_message(&c->msgs[i], i, json_array_get(messages, i), err);
        if (st != KP_OK) return st;
    }
    return load_tools(c, tools, err);
}

/* Tools and tool traffic are refused by families whose template has none. */
static kp_status check_tool_support(const chat_conv *c, kp_chat_family f, kp_error *err) {
    if (families[f].tools) return KP_OK;
    if (c->n_tools)
        return kp_fail(err, KP_EINVAL, "tools: the %s chat template does not support tools",
                       families[f].name);
    for (size_t i = 0; i < c->n; i++) {
        if (c->msgs[i].role == ROLE_TOOL)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu]: the %s chat template does not support tool messages", i,
                           families[f].name);
        if (c->msgs[i].n_calls)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].tool_calls: the %s chat template does not support tool "
                           "calls",
                           i, families[f].name);
    }
    return KP_OK;
}

/* llama2, mistral, gemma: after an optional first system message, user and
 * assistant alternate, starting with user (the templates raise otherwise). */
static kp_status check_alternation(const chat_conv *c, size_t first, kp_chat_family f,
                                   kp_error *err) {
    for (size_t i = first; i < c->n; i++) {
        chat_role want = (i - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        if (c->msgs[i].role == want) continue;
        if (c->msgs[i].role == ROLE_SYSTEM)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu].role: the %s chat template takes a system message only "
                           "as the first message",
                           i, families[f].name);
        return kp_fail(err, KP_EINVAL,
                       "messages[%zu].role: the %s chat template expects \"%s\" here (after an "
                       "optional first system message, user and assistant messages alternate, "
                       "starting with user)",
                       i, families[f].name, role_names[want]);
    }
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* Renderers                                                           */

typedef struct {
    const char *bos, *eos, *date;
    bool gen, no_think;
    /* the rendering, and the ranges of it that hold the client's text */
    const kp_buf *out;
    kp_tok_range *plain;
    size_t n_plain, cap_plain;
    bool plain_oom;
} chat_env;

/* Appends text that came from the client (message content, tool
 * definitions, a call's name and arguments) to b. When b is the rendering
 * itself, the range it fills is recorded as plain: kp_tok_encode_plain
 * never turns a control token's text found there into that token, so a
 * message cannot close its own turn with "<|im_end|>" or end the prompt
 * with "</s>"; only the template's markup (written with kp_buf_puts) can. */
static void put_client(kp_buf *b, chat_env *e, const char *s, size_t n) {
    size_t at = b->len;
    kp_buf_put(b, s, n);
    if (b != e->out || n == 0 || b->oom) return;
    if (e->n_plain && e->plain[e->n_plain - 1].start + e->plain[e->n_plain - 1].len == at) {
        e->plain[e->n_plain - 1].len += n; /* adjacent: one range */
        return;
    }
    if (!kp_grow((void **)&e->plain, &e->cap_plain, e->n_plain + 1, sizeof *e->plain)) {
        e->plain_oom = true;
        return;
    }
    e->plain[e->n_plain++] = (kp_tok_range){at, n};
}

#define PUT_CONTENT(b, m) put_client(b, e, (m)->content, (m)->content_len)

/* The client's text s[0..len) without Python's leading and trailing whitespace. */
static void put_trimmed(kp_buf *b, chat_env *e, const char *s, size_t len) {
    chat_span t = py_strip(s, len, true, true);
    put_client(b, e, t.s, t.len);
}

/* teknium/OpenHermes-2.5-Mistral-7B; Qwen/Qwen2-7B-Instruct adds a default
 * system message when the first message is not one. */
static kp_status render_chatml(kp_buf *b, const chat_conv *c, chat_env *e,
                               const char *default_system, kp_error *err) {
    (void)err;
    if (default_system && c->msgs[0].role != ROLE_SYSTEM) {
        kp_buf_puts(b, "<|im_start|>system\n");
        kp_buf_puts(b, default_system);
        kp_buf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < c->n; i++) {
        kp_buf_puts(b, "<|im_start|>");
        kp_buf_puts(b, role_names[c->msgs[i].role]);
        kp_buf_puts(b, "\n");
        PUT_CONTENT(b, &c->msgs[i]);
        kp_buf_puts(b, "<|im_end|>\n");
    }
    if (e->gen) kp_buf_puts(b, "<|im_start|>assistant\n");
    return KP_OK;
}

static const char qwen_tools_intro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char qwen_tools_outro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
static const char qwen25_default_system[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

static void put_qwen_tools(kp_buf *b, chat_env *e, const chat_conv *c) {
    kp_buf_puts(b, qwen_tools_intro);
    for (size_t t = 0; t < c->n_tools; t++) {
        kp_buf_puts(b, "\n");
        put_client(b, e, c->tools[t].text, c->tools[t].len);
    }
    kp_buf_puts(b, qwen_tools_outro);
}

static void put_qwen_call(kp_buf *b, chat_env *e, const chat_call *call) {
    kp_buf_puts(b, "<tool_call>\n{\"name\": \"");
    put_client(b, e, call->name, call->name_len);
    kp_buf_puts(b, "\", \"arguments\": ");
    put_client(b, e, call->args, call->args_len);
    kp_buf_puts(b, "}\n</tool_call>");
}

/* Tool results: consecutive tool messages share one user turn. */
static void put_qwen_tool_result(kp_buf *b, chat_env *e, const chat_conv *c, size_t i) {
    if (i == 0 || c->msgs[i - 1].role != ROLE_TOOL) kp_buf_puts(b, "<|im_start|>user");
    kp_buf_puts(b, "\n<tool_response>\n");
    PUT_CONTENT(b, &c->msgs[i]);
    kp_buf_puts(b, "\n</tool_response>");
    if (i + 1 == c->n || c->msgs[i + 1].role != ROLE_TOOL) kp_buf_puts(b, "<|im_end|>\n");
}

/* Qwen/Qwen2.5-7B-Instruct */
static kp_status render_qwen25(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    (void)err;
    const chat_msg *first = &c->msgs[0];
    bool has_system = first->role == ROLE_SYSTEM;
    kp_buf_puts(b, "<|im_start|>system\n");
    if (has_system) PUT_CONTENT(b, first);
    else kp_buf_puts(b, qwen25_default_system);
    if (c->n_tools) {
        kp_buf_puts(b, "\n\n");
        put_qwen_tools(b, e, c);
    } else {
        kp_buf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_USER || (m->role == ROLE_SYSTEM && i > 0) ||
            (m->role == ROLE_ASSISTANT && !m->n_calls)) {
            kp_buf_puts(b, "<|im_start|>");
            kp_buf_puts(b, role_names[m->role]);
            kp_buf_puts(b, "\n");
            PUT_CONTENT(b, m);
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_ASSISTANT) {
            kp_buf_puts(b, "<|im_start|>assistant");
            if (m->content_len) {
                kp_buf_puts(b, "\n");
                PUT_CONTENT(b, m);
            }
            for (size_t j = 0; j < m->n_calls; j++) {
                kp_buf_puts(b, "\n");
                put_qwen_call(b, e, &m->calls[j]);
            }
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_TOOL) {
            put_qwen_tool_result(b, e, c, i);
        }
    }
    if (e->gen) kp_buf_puts(b, "<|im_start|>assistant\n");
    return KP_OK;
}

/* Qwen/Qwen3-0.6B (the whole Qwen 3 line shares it) */
static kp_status render_qwen3(kp_buf *b, const chat_conv *c, chat_env *e,
                              kp_error *err) {
    (void)err;
    const chat_msg *first = &c->msgs[0];
    if (c->n_tools) {
        kp_buf_puts(b, "<|im_start|>system\n");
        if (first->role == ROLE_SYSTEM) {
            PUT_CONTENT(b, first);
            kp_buf_puts(b, "\n\n");
        }
        put_qwen_tools(b, e, c);
    } else if (first->role == ROLE_SYSTEM) {
        kp_buf_puts(b, "<|im_start|>system\n");
        PUT_CONTENT(b, first);
        kp_buf_puts(b, "<|im_end|>\n");
    }
    /* the last user message that is not a wrapped tool response */
    size_t last_query = c->n - 1;
    for (size_t k = c->n; k-- > 0;) {
        const chat_msg *m = &c->msgs[k];
        if (m->role != ROLE_USER) continue;
        static const char open[] = "<tool_response>", close[] = "</tool_response>";
        bool wrapped = m->content_len >= sizeof open - 1 && m->content_len >= sizeof close - 1 &&
                       !memcmp(m->content, open, sizeof open - 1) &&
                       !memcmp(m->content + m->content_len - (sizeof close - 1), close,
                               sizeof close - 1);
        if (!wrapped) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_USER || (m->role == ROLE_SYSTEM && i > 0)) {
            kp_buf_puts(b, "<|im_start|>");
            kp_buf_puts(b, role_names[m->role]);
            kp_buf_puts(b, "\n");
            PUT_CONTENT(b, m);
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_ASSISTANT) {
            chat_span content = {m->content, m->content_len}, reasoning = {"", 0};
            if (m->reasoning) {
                reasoning = (chat_span){m->reasoning, m->reasoning_len};
            } else if (find(m->content, m->content_len, "</think>")) {
                /* content.split('</think>')[-1].lstrip('\n') */
                const char *last = find_last(m->content, m->content_len, "</think>") + 8;
                content = strip_newlines(last, (size_t)(m->content + m->content_len - last), true,
                                         false);
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *end = find(m->content, m->content_len, "</think>");
                chat_span head =
                    strip_newlines(m->content, (size_t)(end - m->content), false, true);
                const char *open = find_last(head.s, head.len, "<think>");
                if (open) head = (chat_span){open + 7, (size_t)(head.s + head.len - (open + 7))};
                reasoning = strip_newlines(head.s, head.len, true, false);
            }
            kp_buf_puts(b, "<|im_start|>assistant\n");
            if (i > last_query && (i + 1 == c->n || reasoning.len)) {
                chat_span r = strip_newlines(reasoning.s, reasoning.len, true, true);
                chat_span body = strip_newlines(content.s, content.len, true, false);
                kp_buf_puts(b, "<think>\n");
                put_client(b, e, r.s, r.len);
                kp_buf_puts(b, "\n</think>\n\n");
                put_client(b, e, body.s, body.len);
            } else {
                put_client(b, e, content.s, content.len);
            }
            for (size_t j = 0; j < m->n_calls; j++) {
                if (j > 0 || content.len) kp_buf_puts(b, "\n");
                put_qwen_call(b, e, &m->calls[j]);
            }
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_TOOL) {
            put_qwen_tool_result(b, e, c, i);
        }
    }
    if (e->gen) {
        kp_buf_puts(b, "<|im_start|>assistant\n");
        if (e->no_think) kp_buf_puts(b, "<think>\n\n</think>\n\n");
    }
    return KP_OK;
}

static void put_llama3_turn(kp_buf *b, chat_env *e, const char *role, const char *text, size_t len) {
    kp_buf_puts(b, "<|start_header_id|>");
    kp_buf_puts(b, role);
    kp_buf_puts(b, "<|end_header_id|>\n\n");
    put_trimmed(b, e, text, len);
    kp_buf_puts(b, "<|eot_id|>");
}

/* meta-llama/Meta-Llama-3-8B-Instruct */
static kp_status render_llama3(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    (void)err;
    for (size_t i = 0; i < c->n; i++) {
        if (i == 0) kp_buf_puts(b, e->bos);
        put_llama3_turn(b, e, role_names[c->msgs[i].role], c->msgs[i].content,
                        c->msgs[i].content_len);
    }
    if (e->gen) kp_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KP_OK;
}

/* meta-llama/Llama-3.1-8B-Instruct, Llama-3.2-*-Instruct, Llama-3.3-70B-
 * Instruct (tools_in_user_message left at its default, true). */
static kp_status render_llama31(kp_buf *b, const chat_conv *c, chat_env *e,
                                kp_error *err) {
    size_t i = 0;
    kp_buf_puts(b, e->bos);
    kp_buf_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (c->n_tools) kp_buf_puts(b, "Environment: ipython\n");
    kp_buf_puts(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    kp_buf_puts(b, e->date);
    kp_buf_puts(b, "\n\n");
    if (c->msgs[0].role == ROLE_SYSTEM) {
        put_trimmed(b, e, c->msgs[0].content, c->msgs[0].content_len);
        i = 1;
    }
    kp_buf_puts(b, "<|eot_id|>");
    if (c->n_tools) {
        if (i == c->n || c->msgs[i].role != ROLE_USER)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu]: the llama3.1 chat template puts the tool list into the "
                           "first user message, so one must follow the optional system message",
                           i);
        kp_buf_puts(b, "<|start_header_id|>user<|end_header_id|>\n\n"
                 "Given the following functions, please respond with a JSON for a function call "
                 "with its proper arguments that best answers the given prompt.\n\n"
                 "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
                 "argument name and its value}.Do not use variables.\n\n");
        for (size_t t = 0; t < c->n_tools; t++) {
            put_client(b, e, c->tools[t].text, c->tools[t].len);
            kp_buf_puts(b, "\n\n");
        }
        put_trimmed(b, e, c->msgs[i].content, c->msgs[i].content_len);
        kp_buf_puts(b, "<|eot_id|>");
        i++;
    }
    for (; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->n_calls) {
            if (m->n_calls != 1)
                return kp_fail(err, KP_EINVAL,
                               "messages[%zu].tool_calls: the llama3.1 chat template takes one "
                               "tool call per message, not %zu",
                               i, m->n_calls);
            kp_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            put_client(b, e, m->calls[0].name, m->calls[0].name_len);
            kp_buf_puts(b, "\", \"parameters\": ");
            put_client(b, e, m->calls[0].args, m->calls[0].args_len);
            kp_buf_puts(b, "}<|eot_id|>");
        } else if (m->role == ROLE_TOOL) {
            /* the template writes `content | tojson`: a JSON string */
            json_t *s = json_stringn(m->content, m->content_len);
            if (!s) return kp_fail(err, KP_EINVAL, "messages[%zu].content is not valid UTF-8", i);
            char *quoted = NULL;
            size_t qlen = 0;
            kp_status st = kp_canon_dump(s, &quoted, &qlen, err);
            json_decref(s);
            if (st != KP_OK) return st;
            kp_buf_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            put_client(b, e, quoted, qlen);
            kp_buf_puts(b, "<|eot_id|>");
            free(quoted);
        } else {
            put_llama3_turn(b, e, role_names[m->role], m->content, m->content_len);
        }
    }
    if (e->gen) kp_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KP_OK;
}

/* meta-llama/Llama-2-7b-chat-hf (no generation prompt: "[/INST]" is it) */
static kp_status render_llama2(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    size_t first = c->msgs[0].role == ROLE_SYSTEM ? 1 : 0;
    kp_status st = check_alternation(c, first, KP_CHAT_LLAMA2, err);
    if (st != KP_OK) return st;
    kp_buf merged = {0};
    for (size_t i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        const char *text = m->content;
        size_t len = m->content_len;
        if (i == first && first == 1) {
            kp_buf_puts(&merged, "<<SYS>>\n");
            PUT_CONTENT(&merged, &c->msgs[0]);
            kp_buf_puts(&merged, "\n<</SYS>>\n\n");
            PUT_CONTENT(&merged, m);
            if (merged.oom) break;
            text = merged.data;
            len = merged.len;
        }
        if (m->role == ROLE_USER) {
            kp_buf_puts(b, e->bos);
            kp_buf_puts(b, "[INST] ");
            put_trimmed(b, e, text, len);
            kp_buf_puts(b, " [/INST]");
        } else {
            kp_buf_puts(b, " ");
            put_trimmed(b, e, text, len);
            kp_buf_puts(b, " ");
            kp_buf_puts(b, e->eos);
        }
    }
    bool failed = merged.oom;
    kp_buf_free(&merged);
    return failed ? oom(err) : KP_OK;
}

/* mistralai/Mixtral-8x7B-Instruct-v0.1 and Mistral-7B-Instruct-v0.2 (no
 * generation prompt: "[/INST]" is it) */
static kp_status render_mistral(kp_buf *b, const chat_conv *c, chat_env *e,
                                kp_error *err) {
    size_t first = c->msgs[0].role == ROLE_SYSTEM ? 1 : 0;
    kp_status st = check_alternation(c, first, KP_CHAT_MISTRAL, err);
    if (st != KP_OK) return st;
    kp_buf_puts(b, e->bos);
    for (size_t i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_USER) {
            kp_buf_puts(b, " [INST] ");
            if (i == first && first == 1) {
                PUT_CONTENT(b, &c->msgs[0]);
                kp_buf_puts(b, "\n\n");
            }
            PUT_CONTENT(b, m);
            kp_buf_puts(b, " [/INST]");
        } else {
            kp_buf_puts(b, " ");
            PUT_CONTENT(b, m);
            kp_buf_puts(b, e->eos);
        }
    }
    return KP_OK;
}

/* google/gemma-3-*-it (google/gemma-2-*-it renders the same but refuses a
 * system message) */
static kp_status render_gemma(kp_buf *b, const chat_conv *c, chat_env *e,
                              kp_error *err) {
    size_t first = c->msgs[0].role == ROLE_SYSTEM ? 1 : 0;
    kp_status st = check_alternation(c, first, KP_CHAT_GEMMA, err);
    if (st != KP_OK) return st;
    kp_buf_puts(b, e->bos);
    for (size_t i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        kp_buf_puts(b, m->role == ROLE_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (i == first && first == 1) {
            PUT_CONTENT(b, &c->msgs[0]);
            kp_buf_puts(b, "\n\n");
        }
        put_trimmed(b, e, m->content, m->content_len);
        kp_buf_puts(b, "<end_of_turn>\n");
    }
    if (e->gen) kp_buf_puts(b, "<start_of_turn>model\n");
    return KP_OK;
}

/* microsoft/Phi-3.5-mini-instruct (an empty system message is left out) */
static kp_status render_phi3(kp_buf *b, const chat_conv *c, chat_env *e,
                             kp_error *err) {
    (void)err;
    for (size_t i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_SYSTEM && m->content_len == 0) continue;
        kp_buf_puts(b, "<|");
        kp_buf_puts(b, role_names[m->role]);
        kp_buf_puts(b, "|>\n");
        PUT_CONTENT(b, m);
        kp_buf_puts(b, "<|end|>\n");
    }
    kp_buf_puts(b, e->gen ? "<|assistant|>\n" : e->eos);
    return KP_OK;
}

/* HuggingFaceH4/zephyr-7b-beta */
static kp_status render_zephyr(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    (void)err;
    for (size_t i = 0; i < c->n; i++) {
        kp_buf_puts(b, "<|");
        kp_buf_puts(b, role_names[c->msgs[i].role]);
        kp_buf_puts(b, "|>\n");
        PUT_CONTENT(b, &c->msgs[i]);
        kp_buf_puts(b, e->eos);
        kp_buf_puts(b, "\n");
    }
    if (e->gen) kp_buf_puts(b, "<|assistant|>\n");
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* Entry point                                                         */

kp_status kp_chat_render(kp_chat_family f, const json_t *messages, const json_t *tools,
                         const kp_chat_opts *opts, char **out, size_t *len, kp_error *err) {
    return kp_chat_render_plain(f, messages, tools, opts, out, len, NULL, NULL, err);
}

kp_status kp_chat_render_plain(kp_chat_family f, const json_t *messages, const json_t *tools,
                               const kp_chat_opts *opts, char **out, size_t *len, kp_tok_range **plain,
                               size_t *n_plain, kp_error *err) {
    *out = NULL;
    *len = 0;
    if (plain) *plain = NULL;
    if (n_plain) *n_plain = 0;
    if ((unsigned)f >= KP_CHAT_FAMILY_COUNT || f == KP_CHAT_UNKNOWN)
        return kp_fail(err, KP_EUNSUPPORTED,
                       "unknown chat template family; name one (chatml, qwen2, qwen2.5, qwen3, "
                       "llama3, llama3.1, llama2, mistral, gemma, phi3, zephyr)");
    static const kp_chat_opts defaults = {0};
    if (!opts) opts = &defaults;
    chat_env env = {
        .bos = opts->bos_token ? opts->bos_token : "",
        .eos = opts->eos_token ? opts->eos_token : "",
        .date = opts->date_string ? opts->date_string : "26 Jul 2024",
        .gen = opts->add_generation_prompt,
        .no_think = opts->disable_thinking,
    };
    chat_conv conv;
    kp_status st = conv_load(&conv, messages, tools, err);
    if (st == KP_OK) st = check_tool_support(&conv, f, err);
    kp_buf b = {0};
    env.out = &b;
    if (st == KP_OK) {
        switch (f) {
        case KP_CHAT_CHATML: st = render_chatml(&b, &conv, &env, NULL, err); break;
        case KP_CHAT_QWEN2:
            st = render_chatml(&b, &conv, &env, "You are a helpful assistant.", err);
            break;
        case KP_CHAT_QWEN25: st = render_qwen25(&b, &conv, &env, err); break;
        case KP_CHAT_QWEN3: st = render_qwen3(&b, &conv, &env, err); break;
        case KP_CHAT_LLAMA3: st = render_llama3(&b, &conv, &env, err); break;
        case KP_CHAT_LLAMA31: st = render_llama31(&b, &conv, &env, err); break;
        case KP_CHAT_LLAMA2: st = render_llama2(&b, &conv, &env, err); break;
        case KP_CHAT_MISTRAL: st = render_mistral(&b, &conv, &env, err); break;
        case KP_CHAT_GEMMA: st = render_gemma(&b, &conv, &env, err); break;
        case KP_CHAT_PHI3: st = render_phi3(&b, &conv, &env, err); break;
        case KP_CHAT_ZEPHYR: st = render_zephyr(&b, &conv, &env, err); break;
        case KP_CHAT_UNKNOWN:
        case KP_CHAT_FAMILY_COUNT: assert(0); break;
        }
    }
    conv_free(&conv);
    if (st == KP_OK && env.plain_oom) st = oom(err);
    if (st != KP_OK) {
        kp_buf_free(&b);
        free(env.plain);
        return st;
    }
    if (!kp_buf_take(&b, out, len)) {
        free(env.plain);
        return oom(err);
    }
    if (plain) {
        *plain = env.plain;
        *n_plain = env.n_plain;
    } else {
        free(env.plain);
    }
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* Tool calls in generated text                                        */
/*
 * The text is cut into blocks by one left-to-right scan that both the
 * parser and the holdback use, so they always agree on where a call
 * starts and ends. Qwen (Hermes layout):
 *
 *   content ... <tool_call>  ws  {json object}  ws  </tool_call>  ws  <tool_call> ...
 *               ^ block start    ^js           ^je                ^ block end
 *
 * The object's extent is found by counting braces and brackets outside
 * strings (jansson then parses exactly text[js..je)); a '<' outside a
 * string cannot be JSON and ends the attempt at once, so a missing '}'
 * does not swallow the next block. At each '<' the scan asks
 * hermes_block what starts there:
 *
 *   MARK_NONE   not a block (the tag or what follows it does not match);
 *               resume where the mismatch was
 *   MARK_OPEN   the text ends inside what may still become a block
 *   MARK_DONE   a block with a complete object; its end is after
 *               "</tool_call>", or the end of the text when the closing
 *               tag is missing or cut off
 *
 * A DONE block whose object is a well-formed call extends the current run
 * of calls; anything else that is not whitespace (content, a malformed
 * block) starts the run over. The calls are the run left at the end of the
 * text. Each decision depends only on the bytes up to the point where it
 * is made, and an OPEN block at the end counts as a possible call for the
 * holdback, so the holdback of a prefix never passes the run of the whole
 * text and never moves back as the text grows.
 *
 * Llama 3.1 has no markup: the message is calls from its first byte or
 * not at all, so its scan walks objects from the start (after whitespace
 * and an optional <|python_tag|>), ';' and whitespace between them.
 *
 * Compared with the reference parsers (llama.cpp common/chat-parser.cpp,
 * vLLM's hermes and llama3_json parsers):
 *   - Qwen: llama.cpp also takes bare JSON, <function=name>, <tools>,
 *     ```json fences and text between calls (for Hermes 2 Pro fine-tunes);
 *     kvpin reads only the <tool_call> blocks the Qwen templates teach, and
 *     since the content is a prefix of the text, only calls that end the
 *     message. Like vLLM, kvpin reads a complete object whose closing tag
 *     is missing at the end of the text; llama.cpp returns such a text as
 *     content once generation has finished.
 *   - Llama 3.1: llama.cpp reads one call at the start of the message,
 *     with "parameters" (optionally after "type": "function") and the rest
 *     as content; vLLM reads several separated by "; " and accepts
 *     "arguments". kvpin reads several, separated by ';' and/or whitespace,
 *     under either key, and only when they are the whole message. The
 *     built-in tool form <|python_tag|>name.call(...) is content: kvpin
 *     renders no built-in tools.
 *   - one malformed call makes llama.cpp and vLLM return the whole text as
 *     content; kvpin keeps the calls that follow it (Qwen).
 */

#define TOOL_CALL_OPEN "<tool_call>"
#define TOOL_CALL_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"

static bool ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static size_t skip_space(const char *t, size_t len, size_t i) {
    while (i < len && ascii_space(t[i])) i++;
    return i;
}

/* The length of t[0..n) without its trailing ASCII whitespace. */
static size_t rtrim_len(const char *t, size_t n) {
    while (n > 0 && ascii_space(t[n - 1])) n--;
    return n;
}

static bool all_space(const char *t, size_t from, size_t to) {
    return skip_space(t, to, from) == to;
}

typedef enum { MARK_NONE, MARK_OPEN, MARK_DONE } chat_mark;

/* Does the literal lit occur at t[i]? MARK_DONE with *at after it; MARK_OPEN
 * when the text ends inside it; MARK_NONE with *at on the first mismatch. */
static chat_mark match_literal(const char *t, size_t len, size_t i, const char *lit, size_t *at) {
    for (size_t k = 0; lit[k]; k++) {
        if (i + k == len) return MARK_OPEN;
        if (t[i + k] != lit[k]) {
            *at = i + k;
            return MARK_NONE;
        }
    }
    *at = i + strlen(lit);
    return MARK_DONE;
}

/* The JSON object starting with the '{' at t[js]: MARK_DONE with *je after
 * its closing brace, MARK_OPEN when the text ends first, MARK_NONE with *je
 * on a '<' outside strings. Only the nesting is checked here. */
static chat_mark json_extent(const char *t, size_t len, size_t js, size_t *je) {
    assert(js < len && t[js] == '{');
    size_t depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = js; i < len; i++) {
        char c = t[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                *je = i + 1;
                return MARK_DONE;
            }
        } else if (c == '<') {
            *je = i;
            return MARK_NONE;
        }
    }
    return MARK_OPEN;
}

/* What starts at the '<' at t[i] (see the comment above). DONE: the block
 * is t[i..*end) and its object t[*js..*je). NONE: *next (> i) is where to
 * look for the next block. */
static chat_mark hermes_block(const char *t, size_t len, size_t i, size_t *js, size_t *je,
                              size_t *end, size_t *next) {
    size_t at = i + 1;
    chat_mark m = match_literal(t, len, i, TOOL_CALL_OPEN, &at);
    if (m != MARK_DONE) {
        *next = at > i ? at : i + 1;
        return m;
    }
    at = skip_space(t, len, at);
    if (at == len) return MARK_OPEN;
    if (t[at] != '{') {
        *next = at;
        return MARK_NONE;
    }
    *js = at;
    m = json_extent(t, len, at, je);
    if (m != MARK_DONE) {
        *next = *je;
        return m;
    }
    at = skip_space(t, len, *je);
    size_t close_end = 0;
    m = match_literal(t, len, at, TOOL_CALL_CLOSE, &close_end);
    if (at == len || m == MARK_OPEN) {
        *end = len; /* closing tag missing or cut off: the object is complete */
        return MARK_DONE;
    }
    if (m == MARK_NONE) {
        *next = close_end;
        return MARK_NONE;
    }
    *end = close_end;
    return MARK_DONE;
}

/* A decoded call: the name (a borrowed view into the parsed object) and
 * the arguments as owned canonical JSON. */
typedef struct {
    json_t *object; /* the parsed call object, owned */
    const char *name;
    size_t name_len;
    char *args; /* owned */
    size_t args_len;
} chat_decoded;

static void decoded_free(chat_decoded *d) {
    json_decref(d->object);
    free(d->args);
    memset(d, 0, sizeof *d);
}

/* The call object t[0..len): *ok says whether it is a well-formed call;
 * when out is non-NULL and *ok, out receives it (the caller frees it with
 * decoded_free). KP_ENOMEM only. */
static kp_status decode_call(const char *t, size_t len, kp_chat_family f, bool *ok,
                             chat_decoded *out) {
    *ok = false;
    json_error_t jerr;
    json_t *obj = json_loadb(t, len, JSON_DECODE_INT_AS_REAL | JSON_REJECT_DUPLICATES, &jerr);
    if (!obj) return json_error_code(&jerr) == json_error_out_of_memory ? KP_ENOMEM : KP_OK;
    const json_t *name = json_object_get(obj, "name");
    const char *own = f == KP_CHAT_LLAMA31 ? "parameters" : "arguments";
    const char *other = f == KP_CHAT_LLAMA31 ? "arguments" : "parameters";
    const json_t *args = json_object_get(obj, own);
    if (!args) args = json_object_get(obj, other);
    char *canon = NULL;
    size_t canon_len = 0;
    kp_status st = KP_OK;
    if (json_is_object(obj) && json_is_string(name) && json_string_length(name) > 0) {
        if (!args || json_is_null(args)) {
            canon = malloc(3);
            if (!canon) st = KP_ENOMEM;
            else memcpy(canon, "{}", 3), canon_len = 2;
        } else if (json_is_object(args)) {
            st = kp_canon_dump(args, &canon, &canon_len, NULL);
        } else if (json_is_string(args)) {
            /* arguments written as a JSON text, the OpenAI wire form */
            st = kp_canon_text(json_string_value(args), json_string_length(args), &canon,
                               &canon_len, NULL);
            if (st == KP_OK && canon[0] != '{') {
                free(canon);
                canon = NULL;
            }
        }
        /* too deep, or otherwise not canonicalizable: not a call */
        if (st != KP_OK && st != KP_ENOMEM) st = KP_OK;
    }
    if (st == KP_OK && canon) {
        *ok = true;
        if (out) {
            out->object = obj;
            out->name = json_string_value(name);
            out->name_len = json_string_length(name);
            out->args = canon;
            out->args_len = canon_len;
            return KP_OK;
        }
    }
    free(canon);
    json_decref(obj);
    return st;
}

/* The objects of the calls found, as spans text[js..je) of the text. */
typedef struct {
    struct {
        size_t js, je;
    } *v;
    size_t n, cap;
} chat_spans;

static bool spans_push(chat_spans *s, size_t js, size_t je) {
    if (!kp_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return false;
    s->v[s->n].js = js;
    s->v[s->n].je = je;
    s->n++;
    return true;
}

static void spans_free(chat_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Where the scan for Qwen calls starts: after a leading <think>...</think>
 * for qwen3 (len when that block is never closed: no call can follow). */
static size_t hermes_scan_start(kp_chat_family f, const char *t, size_t len) {
    if (f != KP_CHAT_QWEN3) return 0;
    size_t i = skip_space(t, len, 0), at;
    if (match_literal(t, len, i, "<think>", &at) != MARK_DONE) return 0;
    const char *close = find(t + at, len - at, "</think>");
    return close ? (size_t)(close - t) + strlen("</think>") : len;
}

/* The scan of Qwen blocks (see the comment at the top of this section).
 * complete: the text is final (an OPEN block is content) rather than still
 * growing (an OPEN block may become a call). Returns the start of the run
 * of calls that ends the text, or SIZE_MAX when there is none; with spans
 * non-NULL, the run's objects go there. KP_ENOMEM only. */
static kp_status hermes_scan(kp_chat_family f, const char *t, size_t len, bool complete,
                             size_t *run, chat_spans *spans) {
    size_t from = hermes_scan_start(f, t, len);
    size_t pos = from, prev_end = from;
    *run = SIZE_MAX;
    while (pos < len) {
        const char *lt = memchr(t + pos, '<', len - pos);
        if (!lt) break;
        size_t i = (size_t)(lt - t), js = 0, je = 0, end = 0, next = i + 1;
        chat_mark m = hermes_block(t, len, i, &js, &je, &end, &next);
        if (m == MARK_NONE) {
            assert(next > i);
            pos = next;
            continue;
        }
        if (!all_space(t, prev_end, i)) *run = SIZE_MAX;
        if (m == MARK_OPEN) {
            if (complete) *run = SIZE_MAX;
            else if (*run == SIZE_MAX) *run = i;
            return KP_OK;
        }
        bool ok = false;
        if (decode_call(t + js, je - js, f, &ok, NULL) != KP_OK) return KP_ENOMEM;
        if (!ok) {
            *run = SIZE_MAX;
        } else {
            if (*run == SIZE_MAX) {
                *run = i;
                if (spans) spans->n = 0;
            }
            if (spans && !spans_push(spans, js, je)) return KP_ENOMEM;
        }
        prev_end = pos = end;
    }
    if (!all_space(t, prev_end, len)) *run = SIZE_MAX;
    return KP_OK;
}

/* The Llama 3.1 message: calls from its first byte, or none. Same contract
 * as hermes_scan; the run, when there is one, starts at 0. */
static kp_status llama31_scan(const char *t, size_t len, bool complete, size_t *run,
                              chat_spans *spans) {
    *run = SIZE_MAX;
    size_t at = skip_space(t, len, 0), next = 0;
    if (at == len) {
        if (!complete) *run = 0;
        return KP_OK;
    }
    if (t[at] == '<') {
        chat_mark m = match_literal(t, len, at, PYTHON_TAG, &next);
        if (m == MARK_OPEN && !complete) *run = 0;
        if (m != MARK_DONE) return KP_OK;
        at = skip_space(t, len, next);
    }
    size_t n_calls = 0;
    for (;;) {
        if (at == len) {
            if (!complete || n_calls > 0) *run = 0;
            return KP_OK;
        }
        if (t[at] != '{') return KP_OK;
        size_t je = 0;
        chat_mark m = json_extent(t, len, at, &je);
        if (m == MARK_OPEN && !complete) *run = 0;
        if (m != MARK_DONE) return KP_OK;
        bool ok = false;
        if (decode_call(t + at, je - at, KP_CHAT_LLAMA31, &ok, NULL) != KP_OK) return KP_ENOMEM;
        if (!ok) return KP_OK;
        if (spans && !spans_push(spans, at, je)) return KP_ENOMEM;
        n_calls++;
        at = je;
        while (at < len && (ascii_space(t[at]) || t[at] == ';')) at++;
    }
}

static kp_status scan_calls(kp_chat_family f, const char *t, size_t len, bool complete,
                            size_t *run, chat_spans *spans) {
    if (f == KP_CHAT_LLAMA31) return llama31_scan(t, len, complete, run, spans);
    return hermes_scan(f, t, len, complete, run, spans);
}

/* "call_" and 24 characters of [A-Za-z0-9] from splitmix64 draws seeded by
 * the seed and the index. */
static void tool_call_id(uint64_t seed, size_t index, char out[5 + 24 + 1]) {
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t state = seed ^ ((uint64_t)index * 0xD1B54A32D192ED03ull);
    memcpy(out, "call_", 5);
    for (int draw = 0; draw < 4; draw++) {
        uint64_t z = kp_splitmix64(&state);
        for (int k = 0; k < 6; k++) {
            out[5 + draw * 6 + k] = alphabet[z % 62];
            z /= 62;
        }
    }
    out[29] = 0;
}

/* {"id", "type": "function", "function": {"name", "arguments"}} or NULL. */
static json_t *tool_call_object(const chat_decoded *d, uint64_t seed, size_t index) {
    char id[30];
    tool_call_id(seed, index, id);
    json_t *fn = json_object(), *call = json_object();
    bool ok = fn && call && !json_object_set_new(call, "id", json_string(id)) &&
              !json_object_set_new(call, "type", json_string("function")) &&
              !json_object_set_new(fn, "name", json_stringn(d->name, d->name_len)) &&
              !json_object_set_new(fn, "arguments", json_stringn(d->args, d->args_len));
    if (ok && !json_object_set_new(call, "function", fn)) return call;
    if (!ok) json_decref(fn);
    json_decref(call);
    return NULL;
}

static kp_status parse_oom(kp_error *err) {
    return kp_fail(err, KP_ENOMEM, "out of memory reading tool calls");
}

kp_status kp_chat_parse_tool_calls(kp_chat_family f, const char *text, size_t len,
                                   uint64_t id_seed, json_t **calls, size_t *content_len,
                                   kp_error *err) {
    *calls = NULL;
    *content_len = len;
    if (!kp_chat_family_has_tools(f)) return KP_OK;
    chat_spans spans = {0};
    size_t run = SIZE_MAX;
    if (scan_calls(f, text, len, true, &run, &spans) != KP_OK) {
        spans_free(&spans);
        return parse_oom(err);
    }
    if (run == SIZE_MAX) {
        spans_free(&spans);
        *content_len = rtrim_len(text, len);
        return KP_OK;
    }
    assert(spans.n > 0);
    json_t *arr = json_array();
    kp_status st = arr ? KP_OK : KP_ENOMEM;
    for (size_t k = 0; st == KP_OK && k < spans.n; k++) {
        chat_decoded d = {0};
        bool ok = false;
        st = decode_call(text + spans.v[k].js, spans.v[k].je - spans.v[k].js, f, &ok, &d);
        assert(st != KP_OK || ok); /* the scan accepted it */
        if (st != KP_OK) break;
        json_t *call = tool_call_object(&d, id_seed, k);
        decoded_free(&d);
        if (!call || json_array_append_new(arr, call)) st = KP_ENOMEM;
    }
    spans_free(&spans);
    if (st != KP_OK) {
        json_decref(arr);
        return parse_oom(err);
    }
    *calls = arr;
    *content_len = rtrim_len(text, run);
    return KP_OK;
}

size_t kp_chat_tool_holdback(kp_chat_family f, const char *text, size_t len) {
    if (!kp_chat_family_has_tools(f)) return len;
    size_t run = SIZE_MAX;
    /* out of memory parsing a block's JSON: hold everything from the start
     * of the run it might belong to, which is never wrong, only late */
    if (scan_calls(f, text, len, false, &run, NULL) != KP_OK) return 0;
    return rtrim_len(text, run == SIZE_MAX ? len : run);
}
