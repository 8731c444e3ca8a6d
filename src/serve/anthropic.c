/*
 * anthropic.c - the Anthropic Messages API, whole (anthropic.h): requests
 * into chat-completions requests, Anthropic's response objects and events,
 * and the dialect (answer.h) that writes a Messages answer and stream.
 *
 * Owns nothing between calls. The translation walks the body once: the
 * top-level members (a table of what each becomes), then system, tools
 * and messages block by block, building the chat messages in order. A
 * user message's text blocks gather into one pending user message; a
 * tool_result block first flushes it (tool messages and user text keep
 * the blocks' order). At a block with cache_control the conversation so
 * far, the pending message included, is copied into a breakpoint.
 *
 * The dialect's request state (anth_state) holds the translation and the
 * breakpoints, located in the prompt before the submit (anth_prompt: each
 * breakpoint's conversation rendered, its common prefix with the prompt)
 * and pinned for their TTLs when the answer ends (anth_after). A stream:
 *
 *   message_start (usage: input split by the cache), ping   at admission
 *   ping per slice of the prefill                            while the prompt is computed
 *   the model's reasoning: content_block_start (thinking), thinking_delta...,
 *     signature_delta (empty: kvpin signs nothing), content_block_stop
 *   per text run: content_block_start (text), content_block_delta (text_delta)...
 *   per call: content_block_start (tool_use, input {}), one input_json_delta, stop
 *   content_block_stop, message_delta (stop_reason, usage, kvpin_cache), message_stop
 */
#include "serve/anthropic.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/answer.h"
#include "serve/prompt.h"
#include "serve/pinid.h"

#define BAD(e, param, ...) kp_oai_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

/* The translation in progress. */
typedef struct {
    kp_anth_request *r;
    json_t *msgs;    /* the chat messages so far */
    json_t *pending; /* the text parts of a user or assistant message being built, or NULL */
    json_t *calls;   /* the tool_calls of the assistant message being built, or NULL */
    json_t *thinking; /* its thinking blocks' text (a string), or NULL */
    const char *role;
    json_t *tools;   /* the chat tools (NULL: none) */
    json_t *prev_ids; /* tool_use ids of the last assistant message (an array) */
    json_t *all_ids;  /* every tool_use id so far (unique, as Anthropic's API wants) */
    json_t *answered; /* tool_use ids the current user message's tool_results answer */
    bool strict;      /* --strict-api: unknown members are a 400 */
    kp_oai_error *e;
} tr;

/* The pending message as a chat message (a new reference), or NULL when
 * nothing is pending. */
static json_t *pending_msg(const tr *t) {
    if (!t->pending && !t->calls && !t->thinking) return NULL;
    json_t *m = json_pack("{s:s}", "role", t->role);
    if (!m) return NULL;
    if (t->pending && json_array_size(t->pending) > 0) json_object_set(m, "content", t->pending);
    else json_object_set_new(m, "content", t->calls ? json_null() : json_string(""));
    if (t->calls) json_object_set(m, "tool_calls", t->calls);
    if (t->thinking) json_object_set(m, "reasoning_content", t->thinking);
    return m;
}

static void flush(tr *t) {
    json_t *m = pending_msg(t);
    if (m) json_array_append_new(t->msgs, m);
    json_decref(t->pending);
    json_decref(t->calls);
    json_decref(t->thinking);
    t->pending = t->calls = t->thinking = NULL;
}

static bool text_part(tr *t, const char *role, const json_t *text) {
    if (!t->pending) t->pending = json_array();
    t->role = role;
    return json_array_append_new(t->pending, json_pack("{s:s, s:O}", "type", "text", "text", text)) == 0;
}

/* cache_control of a block at path where: checked, and a breakpoint made
 * of msgs (the messages it ends with; consumed) and tools (borrowed, may
 * be NULL) when present. */
static bool cache_control(tr *t, const json_t *block, const char *where, json_t *msgs, json_t *tools) {
    const json_t *cc = json_object_get(block, "cache_control");
    char param[96];
    snprintf(param, sizeof param, "%s.cache_control", where);
    if (!cc || json_is_null(cc)) {
        json_decref(msgs);
        return true;
    }
    const char *type = json_string_value(json_object_get(cc, "type"));
    if (!json_is_object(cc) || !type || strcmp(type, "ephemeral")) {
        json_decref(msgs);
        return BAD(t->e, param, "%s must be {\"type\": \"ephemeral\"} with an optional \"ttl\"", param);
    }
    const json_t *ttl = json_object_get(cc, "ttl");
    int64_t s = 300;
    if (ttl && !json_is_null(ttl)) {
        const char *v = json_string_value(ttl);
        if (v && !strcmp(v, "5m")) s = 300;
        else if (v && !strcmp(v, "1h")) s = 3600;
        else {
            json_decref(msgs);
            return BAD(t->e, param, "%s.ttl must be \"5m\" or \"1h\"", param);
        }
    }
    kp_anth_request *r = t->r;
    if (r->n_br == KP_ANTH_MAX_BREAKS) {
        json_decref(msgs);
        return BAD(t->e, param, "A maximum of %d blocks with cache_control may be provided (one more at %s)",
                   KP_ANTH_MAX_BREAKS, where);
    }
    kp_anth_break *b = &r->br[r->n_br++];
    b->messages = msgs;
    b->tools = tools ? json_deep_copy(tools) : NULL;
    b->ttl_s = s;
    snprintf(b->where, sizeof b->where, "%s", where);
    return true;
}

/* The messages so far with the pending one: a new array. */
static json_t *snapshot(const tr *t) {
    json_t *a = json_deep_copy(t->msgs);
    json_t *m = pending_msg(t);
    if (a && m) json_array_append_new(a, json_deep_copy(m)); /* the pending parts still grow */
    json_decref(m);
    return a;
}

/* tool_result content: a string, or text blocks joined with "\n". */
static json_t *result_text(tr *t, const json_t *c, const char *where) {
    char p[96];
    snprintf(p, sizeof p, "%s.content", where);
    if (!c || json_is_null(c)) return json_string("");
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        BAD(t->e, p, "%s must be a string or an array of text blocks", p);
        return NULL;
    }
    kp_buf b = {0};
    size_t i;
    const json_t *x;
    json_array_foreach(c, i, x) {
        const char *type = json_string_value(json_object_get(x, "type"));
        const json_t *tx = json_object_get(x, "text");
        if (!type || strcmp(type, "text") || !json_is_string(tx)) {
            kp_buf_free(&b);
            BAD(t->e, p, "%s[%zu] must be a text block (%s blocks are not supported by this server)", p, i,
                type ? type : "untyped");
            return NULL;
        }
        if (i) kp_buf_put(&b, "\n", 1);
        kp_buf_put(&b, json_string_value(tx), json_string_length(tx));
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    kp_buf_free(&b);
    return s;
}

/* The request policy inside the body (kp_oai_sort_members): members kvpin
 * does not act on are named, or refused with --strict-api unless the API
 * documents them (api). */
static bool members(tr *t, const json_t *obj, const char *where, const char *const *known, const char *const *api) {
    return kp_oai_sort_members(obj, where, known, api, t->strict, &t->r->ignored, t->e);
}

/* The members of a content block of each type: kvpin's, and the API's
 * others (named, not refused). */
static bool block_members(tr *t, const json_t *b, const char *type, const char *where) {
    static const char *const text[] = {"type", "text", "cache_control", NULL};
    static const char *const text_api[] = {"citations", NULL};
    static const char *const use[] = {"type", "id", "name", "input", "cache_control", NULL};
    static const char *const use_api[] = {"caller", NULL};
    static const char *const result[] = {"type", "tool_use_id", "content", "cache_control", NULL};
    static const char *const result_api[] = {"is_error", NULL};
    static const char *const think[] = {"type", "thinking", "signature", NULL};
    static const char *const redacted[] = {"type", "data", NULL};
    if (!strcmp(type, "text")) return members(t, b, where, text, text_api);
    if (!strcmp(type, "tool_use")) return members(t, b, where, use, use_api);
    if (!strcmp(type, "tool_result")) return members(t, b, where, result, result_api);
    if (!strcmp(type, "thinking")) return members(t, b, where, think, NULL);
    if (!strcmp(type, "redacted_thinking")) return members(t, b, where, redacted, NULL);
    return true;
}

static bool known_id(const json_t *ids, const char *id) {
    size_t i;
    const json_t *x;
    json_array_foreach(ids, i, x) if (!strcmp(json_string_value(x), id)) return true;
    return false;
}

/* One content block of messages[mi] (role user, assistant or system: a
 * system message holds text blocks only). */
static bool block(tr *t, size_t mi, size_t bi, const json_t *b, const char *role, json_t *new_ids) {
    bool user = !strcmp(role, "user"), sys = !strcmp(role, "system");
    char where[64];
    snprintf(where, sizeof where, "messages[%zu].content[%zu]", mi, bi);
    char p[96];
    snprintf(p, sizeof p, "%s.type", where);
    const char *type = json_string_value(json_object_get(b, "type"));
    if (!json_is_object(b) || !type) return BAD(t->e, p, "%s must be a content block with a type", where);
    if (sys && strcmp(type, "text"))
        return BAD(t->e, p, "%s: a system message holds text blocks only (not %.40s)", where, type);
    if (!block_members(t, b, type, where)) return false;
    if (!strcmp(type, "text")) {
        const json_t *tx = json_object_get(b, "text");
        if (!json_is_string(tx)) {
            snprintf(p, sizeof p, "%s.text", where);
            return BAD(t->e, p, "%s must be a string", p);
        }
        if (t->pending && strcmp(t->role, role)) flush(t);
        if (!text_part(t, role, tx)) return kp_oai_fail(t->e, 500, "api_error", NULL, NULL, "out of memory");
    } else if (!strcmp(type, "tool_use")) {
        if (user) return BAD(t->e, p, "%s: tool_use blocks belong to assistant messages", where);
        const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
        const json_t *input = json_object_get(b, "input");
        if (!json_is_string(id) || !json_string_length(id))
            return BAD(t->e, where, "%s.id must be a non-empty string", where);
        if (known_id(t->all_ids, json_string_value(id)))
            return BAD(t->e, where, "%s: tool_use ids must be unique; \"%.64s\" is used twice", where,
                       json_string_value(id));
        json_array_append(t->all_ids, (json_t *)id);
        if (!json_is_string(name) || !json_string_length(name))
            return BAD(t->e, where, "%s.name must be a non-empty string", where);
        if (input && !json_is_object(input) && !json_is_null(input))
            return BAD(t->e, where, "%s.input must be an object", where);
        if (!t->calls) t->calls = json_array();
        t->role = "assistant";
        json_t *args = input && json_is_object(input) ? json_incref((json_t *)input) : json_object();
        json_array_append_new(t->calls, json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", id, "type", "function",
                                                  "function", "name", name, "arguments", args));
        json_array_append(new_ids, (json_t *)id);
    } else if (!strcmp(type, "tool_result")) {
        if (!user) return BAD(t->e, p, "%s: tool_result blocks belong to user messages", where);
        const json_t *id = json_object_get(b, "tool_use_id");
        if (!json_is_string(id) || !json_string_length(id))
            return BAD(t->e, where, "%s.tool_use_id must be a non-empty string", where);
        if (!known_id(t->prev_ids, json_string_value(id)))
            return BAD(t->e, where,
                       "%s: tool_result for tool_use_id \"%.64s\", which no tool_use block of the previous "
                       "assistant message has",
                       where, json_string_value(id));
        if (known_id(t->answered, json_string_value(id)))
            return BAD(t->e, where, "%s: a second tool_result for tool_use_id \"%.64s\"", where,
                       json_string_value(id));
        json_array_append(t->answered, (json_t *)id);
        json_t *content = result_text(t, json_object_get(b, "content"), where);
        if (!content) return false;
        flush(t); /* the results and the user's text in the order of the blocks */
        json_array_append_new(t->msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
                                                 content));
    } else if (!user && !strcmp(type, "thinking")) {
        /* the model's earlier thinking, sent back by its client: the
         * message's reasoning_content, which the template renders or drops */
        const json_t *th = json_object_get(b, "thinking");
        if (!json_is_string(th)) return BAD(t->e, where, "%s.thinking must be a string", where);
        t->role = "assistant";
        if (!t->thinking) {
            t->thinking = json_copy((json_t *)th);
        } else { /* several thinking blocks: one text */
            char *both = NULL;
            if (asprintf(&both, "%s\n%s", json_string_value(t->thinking), json_string_value(th)) < 0) both = NULL;
            json_decref(t->thinking);
            t->thinking = both ? json_string(both) : NULL;
            free(both);
            if (!t->thinking) return BAD(t->e, where, "out of memory");
        }
        return true;
    } else if (!user && !strcmp(type, "redacted_thinking")) {
        /* encrypted by another provider: nothing a template can show */
        kp_oai_note_ignored(&t->r->ignored, where);
        return true;
    } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
        return BAD(t->e, p, "%s: %s blocks are not supported by this server (text only)", where, type);
    } else {
        return BAD(t->e, p, "%s: unknown content block type \"%.40s\" (text, tool_use, tool_result)", where, type);
    }
    json_t *snap = json_object_get(b, "cache_control") ? snapshot(t) : NULL;
    return cache_control(t, b, where, snap, t->tools);
}

/* After user message i: every tool_use of the assistant message before it
 * has its tool_result there, as Anthropic's API requires; then neither set
 * carries over to the next turn. */
static bool answered_all(tr *t, size_t i) {
    size_t k;
    const json_t *id;
    json_array_foreach(t->prev_ids, k, id) if (!known_id(t->answered, json_string_value(id))) {
        char p[48];
        snprintf(p, sizeof p, "messages[%zu]", i);
        return BAD(t->e, p,
                   "messages.%zu: tool_use ids were found without tool_result blocks immediately after: %.64s. "
                   "Each tool_use block must have a corresponding tool_result block in the next message",
                   i, json_string_value(id));
    }
    json_array_clear(t->prev_ids);
    json_array_clear(t->answered);
    return true;
}

static bool messages(tr *t, const json_t *ms) {
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return BAD(t->e, "messages", "messages must be a non-empty array of {role, content} objects");
    size_t i;
    const json_t *m;
    json_array_foreach(ms, i, m) {
        char p[48];
        snprintf(p, sizeof p, "messages[%zu].role", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) return BAD(t->e, p, "messages[%zu] must be an object with a role", i);
        /* a system message among the turns (Claude Code 2.1 sends its
         * environment so): a system message of the chat in its place */
        bool assistant = !strcmp(role, "assistant");
        if (strcmp(role, "user") && !assistant && strcmp(role, "system"))
            return BAD(t->e, p, "%s must be \"user\", \"assistant\" or \"system\"", p);
        static const char *const msg_known[] = {"role", "content", NULL};
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!members(t, m, p, msg_known, NULL)) return false; /* cache_control belongs on a block */
        const json_t *c = json_object_get(m, "content");
        json_t *new_ids = json_array();
        if (json_is_string(c)) {
            flush(t);
            if (!text_part(t, role, c)) {
                json_decref(new_ids);
                return kp_oai_fail(t->e, 500, "api_error", NULL, NULL, "out of memory");
            }
        } else if (json_is_array(c)) {
            flush(t);
            size_t k;
            const json_t *b;
            json_array_foreach(c, k, b) if (!block(t, i, k, b, role, new_ids)) {
                json_decref(new_ids);
                return false;
            }
        } else {
            json_decref(new_ids);
            snprintf(p, sizeof p, "messages[%zu].content", i);
            return BAD(t->e, p, "%s must be a string or an array of content blocks", p);
        }
        flush(t);
        if (!assistant) {
            json_decref(new_ids);
        } else {
            json_decref(t->prev_ids);
            t->prev_ids = new_ids;
        }
        if (!strcmp(role, "user") && !answered_all(t, i)) return false;
    }
    return true;
}

static bool system_field(tr *t, const json_t *sys) {
    if (!sys || json_is_null(sys)) return true;
    if (json_is_string(sys)) {
        if (json_string_length(sys))
            json_array_append_new(t->msgs, json_pack("{s:s, s:O}", "role", "system", "content", sys));
        return true;
    }
    if (!json_is_array(sys)) return BAD(t->e, "system", "system must be a string or an array of text blocks");
    json_t *parts = json_array();
    size_t i;
    const json_t *b;
    json_array_foreach(sys, i, b) {
        char where[32];
        snprintf(where, sizeof where, "system[%zu]", i);
        const char *type = json_string_value(json_object_get(b, "type"));
        const json_t *tx = json_object_get(b, "text");
        if (!json_is_object(b) || !type || strcmp(type, "text") || !json_is_string(tx)) {
            json_decref(parts);
            return BAD(t->e, where, "%s must be a text block {\"type\": \"text\", \"text\": ...}", where);
        }
        if (!block_members(t, b, "text", where)) {
            json_decref(parts);
            return false;
        }
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", tx));
        json_t *snap = NULL;
        if (json_object_get(b, "cache_control")) {
            snap = json_deep_copy(t->msgs);
            json_array_append_new(snap, json_pack("{s:s, s:o}", "role", "system", "content", json_deep_copy(parts)));
        }
        if (!cache_control(t, b, where, snap, t->tools)) {
            json_decref(parts);
            return false;
        }
    }
    if (json_array_size(parts)) json_array_append_new(t->msgs, json_pack("{s:s, s:o}", "role", "system", "content", parts));
    else json_decref(parts);
    return true;
}

/* The chat content of a system field (a string, or text blocks as text
 * parts): a new reference. Only for a system_field already checked. */
static json_t *sys_content(const json_t *system) {
    if (json_is_string(system)) return json_incref((json_t *)system);
    json_t *parts = json_array();
    size_t i;
    const json_t *b;
    json_array_foreach(system, i, b)
        json_array_append_new(parts, json_pack("{s:s, s:O?}", "type", "text", "text", json_object_get(b, "text")));
    return parts;
}

/* tools: checked and converted; breakpoints on tools come after system is
 * known (their prefix renders with the system message, where templates
 * put the tools). */
static bool tools_field(tr *t, const json_t *tools, const json_t *system) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return BAD(t->e, "tools", "tools must be an array of {name, input_schema} objects");
    if (!json_array_size(tools)) return true;
    t->tools = json_array();
    size_t i;
    const json_t *x;
    json_array_foreach(tools, i, x) {
        char where[32];
        snprintf(where, sizeof where, "tools[%zu]", i);
        const json_t *name = json_object_get(x, "name"), *desc = json_object_get(x, "description");
        const json_t *schema = json_object_get(x, "input_schema");
        const char *type = json_string_value(json_object_get(x, "type"));
        if (!json_is_object(x) || !json_is_string(name) || !json_string_length(name))
            return BAD(t->e, where, "%s.name must be a non-empty string", where);
        if (type && strcmp(type, "custom"))
            return BAD(t->e, where, "%s: tool type \"%.40s\" is not supported (client tools with input_schema only)",
                       where, type);
        if (!json_is_object(schema)) return BAD(t->e, where, "%s.input_schema must be a JSON Schema object", where);
        if (desc && !json_is_string(desc) && !json_is_null(desc))
            return BAD(t->e, where, "%s.description must be a string", where);
        static const char *const tool_known[] = {"name", "description", "input_schema", "cache_control", "type", NULL};
        static const char *const tool_api[] = {"strict", "input_examples", "defer_loading", "allowed_callers", NULL};
        if (!members(t, x, where, tool_known, tool_api)) return false;
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
        json_array_append_new(t->tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    json_array_foreach(tools, i, x) {
        if (!json_object_get(x, "cache_control")) continue;
        char where[32];
        snprintf(where, sizeof where, "tools[%zu]", i);
        /* the tools up to this one, rendered with the system message (or
         * an empty first turn when there is none) */
        json_t *upto = json_array();
        for (size_t k = 0; k <= i; k++) json_array_append(upto, json_array_get(t->tools, k));
        json_t *msgs = json_array();
        if ((json_is_string(system) && json_string_length(system)) || (json_is_array(system) && json_array_size(system)))
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", sys_content(system)));
        else
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", ""));
        bool ok = cache_control(t, x, where, msgs, upto);
        json_decref(upto);
        if (!ok) return false;
    }
    return true;
}

static bool tool_choice(tr *t, const json_t *tc, json_t *chat) {
    if (!tc || json_is_null(tc)) return true;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type)
        return BAD(t->e, "tool_choice", "tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp))
        return BAD(t->e, "tool_choice.disable_parallel_tool_use", "disable_parallel_tool_use must be true or false");
    if (!strcmp(type, "auto")) json_object_set_new(chat, "tool_choice", json_string("auto"));
    else if (!strcmp(type, "none")) json_object_set_new(chat, "tool_choice", json_string("none"));
    else if (!strcmp(type, "any")) json_object_set_new(chat, "tool_choice", json_string("required"));
    else if (!strcmp(type, "tool")) {
        const json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name) || !json_string_length(name))
            return BAD(t->e, "tool_choice.name", "tool_choice {\"type\": \"tool\"} needs the tool's name");
        json_object_set_new(chat, "tool_choice",
                            json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    } else {
        return BAD(t->e, "tool_choice.type", "tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\"");
    }
    if (json_is_false(dp)) json_object_set_new(chat, "parallel_tool_calls", json_true());
    if (!t->tools && strcmp(type, "auto") && strcmp(type, "none"))
        return BAD(t->e, "tool_choice", "tool_choice \"%s\" asks for a tool call, but the request has no tools", type);
    return true;
}

static bool number_in(tr *t, const json_t *v, const char *k, double lo, double hi, json_t *chat) {
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return BAD(t->e, k, "%s must be a number from %g to %g", k, lo, hi);
    json_object_set(chat, k, (json_t *)v);
    return true;
}

bool kp_anth_translate(const char *body, size_t len, bool count_tokens, bool strict, kp_anth_request *r,
                       kp_oai_error *e) {
    memset(r, 0, sizeof *r);
    json_t *root = kp_oai_parse_object(body, len, e);
    if (!root) return false;
    tr t = {.r = r,
            .msgs = json_array(),
            .role = "user",
            .prev_ids = json_array(),
            .all_ids = json_array(),
            .answered = json_array(),
            .strict = strict,
            .e = e};
    json_t *chat = json_object();
    bool ok = t.msgs && t.prev_ids && t.all_ids && t.answered && chat;
    if (!ok) kp_oai_fail(e, 500, "api_error", NULL, NULL, "out of memory");
    const json_t *model = json_object_get(root, "model");
    if (ok && !json_is_string(model))
        ok = BAD(e, "model", "model: Field required (a string naming the model)");
    const json_t *mt = json_object_get(root, "max_tokens");
    if (ok && !count_tokens) {
        if (!mt || json_is_null(mt)) ok = BAD(e, "max_tokens", "max_tokens: Field required");
        else if (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > (1 << 30))
            ok = BAD(e, "max_tokens", "max_tokens must be a whole number >= 1");
        else json_object_set(chat, "max_tokens", (json_t *)mt);
    }
    if (ok) json_object_set(chat, "model", (json_t *)model);
    if (ok) ok = tools_field(&t, json_object_get(root, "tools"), json_object_get(root, "system"));
    if (ok) ok = system_field(&t, json_object_get(root, "system"));
    if (ok) ok = messages(&t, json_object_get(root, "messages"));
    if (ok) ok = tool_choice(&t, json_object_get(root, "tool_choice"), chat);
    if (ok) ok = number_in(&t, json_object_get(root, "temperature"), "temperature", 0, 1, chat);
    if (ok) ok = number_in(&t, json_object_get(root, "top_p"), "top_p", 0, 1, chat);
    const json_t *tk = json_object_get(root, "top_k");
    if (ok && tk && !json_is_null(tk)) {
        if (!json_is_integer(tk) || json_integer_value(tk) < 0) ok = BAD(e, "top_k", "top_k must be a whole number >= 0");
        else json_object_set(chat, "top_k", (json_t *)tk);
    }
    const json_t *ss = json_object_get(root, "stop_sequences");
    if (ok && ss && !json_is_null(ss)) {
        if (!json_is_array(ss)) ok = BAD(e, "stop_sequences", "stop_sequences must be an array of strings");
        size_t i;
        const json_t *x;
        if (ok) json_array_foreach(ss, i, x) if (ok && (!json_is_string(x) || !json_string_length(x)))
            ok = BAD(e, "stop_sequences", "stop_sequences[%zu] must be a non-empty string", i);
        if (ok && json_array_size(ss)) json_object_set(chat, "stop", (json_t *)ss);
    }
    const json_t *st = json_object_get(root, "stream");
    if (ok && st && !json_is_null(st)) {
        if (!json_is_boolean(st)) ok = BAD(e, "stream", "stream must be true or false");
        else if (!count_tokens) r->stream = json_is_true(st);
    }
    const json_t *gr = json_object_get(root, "grammar"); /* kvpin's own: GBNF, as on chat completions */
    if (ok && gr && !json_is_null(gr)) json_object_set(chat, "grammar", (json_t *)gr);
    const json_t *md = json_object_get(root, "metadata");
    if (ok && md && !json_is_null(md) && !json_is_object(md)) ok = BAD(e, "metadata", "metadata must be an object");
    /* the rest: accepted and named, unknown ones too unless strict */
    static const char *const known[] = {"model",          "max_tokens",  "system", "messages", "tools",
                                        "tool_choice",    "temperature", "top_p",  "top_k",    "stop_sequences",
                                        "stream",         "grammar",     NULL};
    static const char *const anthropic[] = {"metadata", "service_tier", "thinking", "container", "mcp_servers",
                                            "context_management", NULL};
    const char *unknown;
    if (ok && !kp_oai_sort_fields(root, known, anthropic, strict, &r->ignored, &unknown))
        ok = BAD(e, unknown, "%.64s: unknown field", unknown);
    if (ok) {
        json_object_set(chat, "messages", t.msgs);
        if (t.tools) json_object_set(chat, "tools", t.tools);
        if (r->stream) {
            json_object_set_new(chat, "stream", json_true());
            json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
        }
        r->chat = chat;
    } else {
        json_decref(chat);
    }
    json_decref(t.msgs);
    json_decref(t.tools);
    json_decref(t.pending);
    json_decref(t.calls);
    json_decref(t.thinking);
    json_decref(t.prev_ids);
    json_decref(t.all_ids);
    json_decref(t.answered);
    json_decref(root);
    if (!ok) kp_anth_request_free(r);
    return ok;
}

void kp_anth_request_free(kp_anth_request *r) {
    if (!r) return;
    json_decref(r->chat);
    for (int i = 0; i < r->n_br; i++) {
        json_decref(r->br[i].messages);
        json_decref(r->br[i].tools);
    }
    kp_buf_free(&r->ignored);
    memset(r, 0, sizeof *r);
}

int kp_anth_error_status(int http, const char **type) {
    switch (http) {
    case 401: *type = "authentication_error"; return 401;
    case 403: *type = "permission_error"; return 403;
    case 404: *type = "not_found_error"; return 404;
    case 413: *type = "request_too_large"; return 413;
    case 429: *type = "rate_limit_error"; return 429;
    case 503: *type = "overloaded_error"; return 529;
    default: break;
    }
    if (http >= 500) {
        *type = "api_error";
        return http;
    }
    *type = "invalid_request_error";
    return http;
}

json_t *kp_anth_error_json(const kp_oai_error *e) {
    const char *type;
    kp_anth_error_status(e->http, &type);
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", e->message);
}

json_t *kp_anth_usage_json(uint32_t input, uint32_t creation, uint32_t read, uint32_t output) {
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)input, "cache_creation_input_tokens",
                     (json_int_t)creation, "cache_read_input_tokens", (json_int_t)read, "output_tokens",
                     (json_int_t)output);
}

void kp_anth_tool_id(const char *call_id, char *out, size_t cap) {
    const char *rest = !strncmp(call_id, "call_", 5) ? call_id + 5 : call_id;
    snprintf(out, cap, "toolu_%s", rest);
}

json_t *kp_anth_content_json(const char *text, size_t text_len, const json_t *calls) {
    json_t *a = json_array();
    if (text_len || json_array_size(calls) == 0) /* an answer has a text block when it has nothing else */
        json_array_append_new(a, json_pack("{s:s, s:s%}", "type", "text", "text", text ? text : "", text_len));
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        json_t *input = args ? json_loads(args, 0, NULL) : NULL;
        if (!json_is_object(input)) {
            json_decref(input);
            input = json_object();
        }
        char id[96];
        kp_anth_tool_id(json_string_value(json_object_get(c, "id")) ? json_string_value(json_object_get(c, "id"))
                                                                    : "",
                        id, sizeof id);
        json_array_append_new(a, json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", id, "name",
                                           json_object_get(fn, "name"), "input", input));
    }
    return a;
}

json_t *kp_anth_message_json(const char *id, const char *model, json_t *content, const char *stop_reason,
                             const char *stop_sequence, json_t *usage) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:s?, s:o}", "id", id, "type", "message", "role",
                     "assistant", "model", model, "content", content ? content : json_array(), "stop_reason",
                     stop_reason, "stop_sequence", stop_sequence, "usage", usage ? usage : json_object());
}

const char *kp_anth_stop_reason(bool calls, bool length, bool last_is_eog, const char *const *stops, int n_stops,
                                const char *full, size_t full_len, size_t text_len, const char **which) {
    *which = NULL;
    if (calls) return "tool_use";
    if (length) return "max_tokens";
    if (last_is_eog || n_stops == 0) return "end_turn";
    *which = stops[0];
    for (int i = 0; full && i < n_stops; i++) {
        size_t n = strlen(stops[i]);
        if (text_len + n <= full_len && !memcmp(full + text_len, stops[i], n)) {
            *which = stops[i];
            break;
        }
    }
    return "stop_sequence";
}

bool kp_anth_event(kp_buf *out, const char *name, json_t *data) {
    /* the type first, as Anthropic writes it */
    return kp_oai_sse_event(out, name, data ? json_pack("{s:s}", "type", name) : NULL, data);
}

void kp_anth_cache_usage(uint32_t n, uint32_t reused, const uint32_t *bp, int n_bp, int live, uint32_t *input,
                         uint32_t *creation, uint32_t *read) {
    uint32_t last = 0;
    for (int i = 0; i < n_bp; i++) last = bp[i] > last ? bp[i] : last;
    if (last > n) last = n;
    if (reused > n) reused = n;
    if (n_bp == 0) {
        *read = reused;
        *creation = 0;
    } else if (live > 0) {
        *read = reused;
        *creation = last > reused ? last - reused : 0;
    } else {
        *read = 0;
        *creation = last;
    }
    *input = n - *read - *creation;
}

/* ---- the dialect: Messages answers and streams ---------------------------------------- */

/* The cache_control breakpoints of a Messages request: the tokens of the
 * prefix each ends, its TTL, and how many were held by a live pin when
 * the request came. */
typedef struct {
    uint32_t pos[KP_ANTH_MAX_BREAKS];
    int64_t ttl[KP_ANTH_MAX_BREAKS]; /* seconds, --pin-ttl-scale applied */
    uint64_t hash[KP_ANTH_MAX_BREAKS]; /* kp_breakpoints_hash of the prefix */
    bool hit[KP_ANTH_MAX_BREAKS];    /* a live pin held it when the request came */
    int n, live;
} anth_bps;

/* What a Messages request keeps through its answer (the dialect's dreq). */
typedef struct {
    kp_anth_request a; /* the translation (its chat body's "stop": the stop sequences) */
    anth_bps bps;      /* its cache_control breakpoints, located in the prompt */
    bool text_open;    /* streaming: a text content block is open */
    bool think_open;   /* streaming: a thinking content block is open */
    uint32_t thinking_blocks; /* of n_blocks, thinking blocks */
    uint32_t n_blocks; /* content blocks started */
} anth_state;

/* The stop_reason of an Anthropic answer that ended (kp_anth_stop_reason):
 * whether the last token generated ends the generation, and for a stop
 * string which one, from the detokenized completion. *which points into
 * stops (a JSON array, may be NULL). */
static const char *anth_stop(kp_server *s, const kp_sreq_update *u, bool calls, size_t text_len,
                             const json_t *stops, const char **which) {
    const char *arr[KP_OAI_MAX_STOPS];
    int n = 0;
    size_t i;
    const json_t *x;
    json_array_foreach(stops, i, x) if (n < KP_OAI_MAX_STOPS) arr[n++] = json_string_value(x);
    uint32_t last = u->prompt_tokens + u->completion_tokens;
    bool eog = u->ids && u->completion_tokens && kp_tok_is_eog(s->v, u->ids[last - 1]);
    char *full = NULL;
    size_t flen = 0;
    if (!calls && !eog && n && u->ids && u->finish == KP_FINISH_STOP) {
        kp_error err = {0};
        kp_tok_detokenize(s->v, u->ids + u->prompt_tokens, u->completion_tokens, false, true, &full, &flen, &err);
    }
    const char *r = kp_anth_stop_reason(calls, u->finish == KP_FINISH_LENGTH, eog, arr, n, full, flen, text_len, which);
    free(full);
    return r;
}

/* The usage of an Anthropic answer, with the input split by the cache
 * (kp_anth_cache_usage over its breakpoints). */
static json_t *anth_usage(const anth_bps *b, const kp_sreq_update *u) {
    uint32_t in, cr, rd;
    kp_anth_cache_usage(u->prompt_tokens, u->cached_tokens, b->pos, b->n, b->live, &in, &cr, &rd);
    return kp_anth_usage_json(in, cr, rd, u->completion_tokens);
}

/* At the end of a Messages generation (its prompt is cached by now): each
 * breakpoint's prefix pinned for its TTL, the pin it replaces (a refresh)
 * removed. A pin refused (the pinned-bytes cap) is reported, never an
 * error. cj (may be NULL) gets "cache_control": one object per breakpoint
 * {tokens, ttl, hit, pinned, pin, expires_at | code, error}. */
static void anth_after(kp_server *s, const anth_bps *b, const kp_sreq_update *u, json_t *cj) {
    if (b->n == 0) return;
    json_t *list = json_array();
    int64_t now = (int64_t)time(NULL);
    for (int i = 0; i < b->n; i++) {
        json_t *o = json_pack("{s:I, s:I, s:b}", "tokens", (json_int_t)b->pos[i], "ttl", (json_int_t)b->ttl[i], "hit",
                              b->hit[i]);
        kp_error err = {0}, err2 = {0};
        uint64_t id = 0;
        kp_status st = u->ids && b->pos[i] <= u->prompt_tokens
                           ? kp_sched_pin(s->sched, u->ids, b->pos[i], b->ttl[i], now, &id, NULL, &err)
                           : kp_fail(&err, KP_EINVAL, "no prompt to pin");
        if (st == KP_OK) {
            uint64_t evicted = 0;
            uint64_t old = kp_breakpoints_set(s->breakpoints, b->hash[i], id, b->pos[i], now + b->ttl[i], now, &evicted);
            if (old) kp_sched_unpin(s->sched, old, &err2); /* expired and gone already: fine */
            if (evicted) kp_sched_unpin(s->sched, evicted, &err2);
            char sid[KP_PINID_MAX];
            kp_pinid_format(s->pin_key, id, sid);
            json_object_set_new(o, "pinned", json_true());
            json_object_set_new(o, "pin", json_string(sid));
            json_object_set_new(o, "expires_at", json_integer((json_int_t)(now + b->ttl[i])));
        } else {
            json_object_set_new(o, "pinned", json_false());
            json_object_set_new(o, "code", json_string(st == KP_EFULL ? "pinned_cap" : "not_pinned"));
            json_object_set_new(o, "error", json_string(err.msg));
        }
        json_array_append_new(list, o);
    }
    if (cj) json_object_set_new(cj, "cache_control", list);
    else json_decref(list);
}


/* The breakpoints' positions in the prompt ids[0..n): each breakpoint's
 * conversation rendered without the generation prompt, and the tokens it
 * has in common with the prompt (the renderings are byte-stable and
 * append-only, so that is the prefix up to the breakpoint's block). A
 * breakpoint that does not render is left out. */
static void anth_prompt(kp_answer *x, const int32_t *ids, size_t n) {
    kp_server *s = x->s;
    anth_state *st = x->dreq;
    anth_bps *b = &st->bps;
    memset(b, 0, sizeof *b);
    int64_t now = (int64_t)time(NULL);
    for (int i = 0; i < st->a.n_br; i++) {
        const kp_anth_break *br = &st->a.br[i];
        kp_prompt_opts po = {false, false, NULL, false};
        kp_prompt pr;
        kp_oai_error e;
        if (!kp_prompt_tokens(s, NULL, br->messages, br->tools, false, &po, &pr, &e)) continue;
        size_t m = 0;
        while (m < pr.n && m < n && pr.ids[m] == ids[m]) m++;
        kp_prompt_free(&pr);
        if (m == 0) continue;
        double scaled = (double)br->ttl_s * (s->cfg.pin_ttl_scale > 0 ? s->cfg.pin_ttl_scale : 1);
        b->pos[b->n] = (uint32_t)m;
        b->ttl[b->n] = scaled < 1 ? 1 : (int64_t)(scaled + 0.5);
        b->hash[b->n] = kp_breakpoints_hash(ids, m);
        b->hit[b->n] = kp_breakpoints_live(s->breakpoints, b->hash[b->n], now);
        b->live += b->hit[b->n];
        b->n++;
    }
}

/* message_start (the usage so far: the input split by the cache) and a ping. */
static void anth_open(kp_answer *x, const kp_sreq_update *u) {
    anth_state *st = x->dreq;
    json_t *usage = anth_usage(&st->bps, u);
    json_object_set_new(usage, "output_tokens", json_integer(0));
    kp_anth_event(&x->out, "message_start",
                  json_pack("{s:o}", "message",
                            kp_anth_message_json(x->id, x->s->cfg.model_name, json_array(), NULL, NULL, usage)));
    kp_anth_event(&x->out, "ping", json_object());
}

/* While the prompt is computed: a ping per slice of the prefill after the
 * first (message_start came with one). */
static void anth_prefill(kp_answer *x, const kp_sreq_update *u) {
    if (x->prog_any && u->prefill_done < u->prompt_tokens) kp_anth_event(&x->out, "ping", json_object());
}

/* Streaming: the open thinking block ended (with its signature, which
 * kvpin leaves empty: it signs nothing). */
static void anth_close_thinking(kp_answer *x) {
    anth_state *st = x->dreq;
    if (!st->think_open) return;
    json_t *idx = json_integer((json_int_t)st->n_blocks - 1);
    kp_anth_event(&x->out, "content_block_delta",
                  json_pack("{s:O, s:{s:s, s:s}}", "index", idx, "delta", "type", "signature_delta", "signature", ""));
    kp_anth_event(&x->out, "content_block_stop", json_pack("{s:O}", "index", idx));
    json_decref(idx);
    st->think_open = false;
}

/* The model's reasoning as a thinking block, streamed as thinking_delta. */
static void anth_reasoning(kp_answer *x, uint32_t i, const char *text, size_t len) {
    (void)i;
    anth_state *st = x->dreq;
    if (!st->think_open) {
        kp_anth_event(&x->out, "content_block_start",
                      json_pack("{s:I, s:{s:s, s:s, s:s}}", "index", (json_int_t)st->n_blocks, "content_block", "type",
                                "thinking", "thinking", "", "signature", ""));
        st->think_open = true;
        st->n_blocks++;
        st->thinking_blocks++;
    }
    kp_anth_event(&x->out, "content_block_delta",
                  json_pack("{s:I, s:{s:s, s:s%}}", "index", (json_int_t)st->n_blocks - 1, "delta", "type",
                            "thinking_delta", "thinking", text, len));
}

static void anth_text(kp_answer *x, uint32_t i, const char *text, size_t len, json_t *lp) {
    (void)i;
    json_decref(lp); /* the Messages API has no logprobs */
    anth_state *st = x->dreq;
    if (!text || !len) return;
    anth_close_thinking(x);
    if (!st->text_open) {
        kp_anth_event(&x->out, "content_block_start",
                      json_pack("{s:I, s:{s:s, s:s}}", "index", (json_int_t)st->n_blocks, "content_block", "type",
                                "text", "text", ""));
        st->text_open = true;
        st->n_blocks++;
    }
    kp_anth_event(&x->out, "content_block_delta",
                  json_pack("{s:I, s:{s:s, s:s%}}", "index", (json_int_t)st->n_blocks - 1, "delta", "type",
                            "text_delta", "text", text, len));
}

static void anth_close_text(kp_answer *x) {
    anth_state *st = x->dreq;
    if (!st->text_open) return;
    kp_anth_event(&x->out, "content_block_stop", json_pack("{s:I}", "index", (json_int_t)st->n_blocks - 1));
    st->text_open = false;
}

/* The tool calls as tool_use blocks: each started with an empty input,
 * its input as one input_json_delta, stopped. */
static void anth_calls(kp_answer *x, uint32_t i, const json_t *calls) {
    (void)i;
    anth_state *st = x->dreq;
    anth_close_thinking(x);
    anth_close_text(x);
    json_t *blocks = kp_anth_content_json(NULL, 0, calls);
    size_t k;
    json_t *b;
    json_array_foreach(blocks, k, b) {
        char *args = json_dumps(json_object_get(b, "input"), JSON_COMPACT);
        json_object_set_new(b, "input", json_object());
        json_t *idx = json_integer((json_int_t)st->n_blocks);
        kp_anth_event(&x->out, "content_block_start", json_pack("{s:O, s:O}", "index", idx, "content_block", b));
        kp_anth_event(&x->out, "content_block_delta",
                      json_pack("{s:O, s:{s:s, s:s}}", "index", idx, "delta", "type", "input_json_delta",
                                "partial_json", args ? args : "{}"));
        kp_anth_event(&x->out, "content_block_stop", json_pack("{s:O}", "index", idx));
        json_decref(idx);
        free(args);
        st->n_blocks++;
    }
    json_decref(blocks);
}

static void anth_end(kp_answer *x, uint32_t i) {
    (void)x;
    (void)i; /* one choice: its end is the message's (anth_close) */
}

/* The end of a message, streamed or not: its stop reason (*which: the
 * stop sequence found, or NULL), and the kvpin_cache report (*cj, taken
 * from the answer) with each breakpoint's prefix pinned for its TTL. */
static const char *anth_settle(kp_answer *x, const char **which, json_t **cj) {
    anth_state *st = x->dreq;
    const kp_choice *ch = &x->ch[0];
    const char *reason = ch->cap_end && !ch->calls ? (*which = NULL, "end_turn")
                         : anth_stop(x->s, &ch->last, ch->calls != NULL, ch->text.len,
                                     json_object_get(st->a.chat, "stop"), which);
    *cj = x->report;
    x->report = NULL;
    anth_after(x->s, &st->bps, &ch->last, *cj);
    return reason;
}

/* The end of a Messages stream: the open block closed (an empty text
 * block when there was none), message_delta with the stop reason, the
 * usage and kvpin_cache (with each breakpoint's pin), message_stop. */
static void anth_close(kp_answer *x) {
    anth_state *st = x->dreq;
    const kp_choice *ch = &x->ch[0];
    anth_close_thinking(x);
    anth_close_text(x);
    if (st->n_blocks == st->thinking_blocks) { /* an answer has a text block when it has nothing else */
        json_t *idx = json_integer((json_int_t)st->n_blocks);
        kp_anth_event(&x->out, "content_block_start",
                      json_pack("{s:O, s:{s:s, s:s}}", "index", idx, "content_block", "type", "text", "text", ""));
        kp_anth_event(&x->out, "content_block_stop", json_pack("{s:O}", "index", idx));
        json_decref(idx);
    }
    const char *which;
    json_t *cj;
    const char *reason = anth_settle(x, &which, &cj);
    kp_anth_event(&x->out, "message_delta",
                  json_pack("{s:{s:s, s:s?}, s:o, s:o}", "delta", "stop_reason", reason, "stop_sequence", which,
                            "usage", anth_usage(&st->bps, &ch->last), "kvpin_cache", cj ? cj : json_null()));
    kp_anth_event(&x->out, "message_stop", json_object());
}

static void anth_fail(kp_answer *x, const kp_oai_error *e) { kp_anth_event(&x->out, "error", kp_anth_error_json(e)); }

/* The message of a Messages request that ended. */
static json_t *anth_reply(kp_answer *x) {
    anth_state *st = x->dreq;
    const kp_choice *ch = &x->ch[0];
    const char *text = ch->text.data ? ch->text.data : "";
    const char *which;
    json_t *cj;
    const char *reason = anth_settle(x, &which, &cj);
    json_t *content = kp_anth_content_json(text + ch->content_from, ch->content - ch->content_from, ch->calls);
    if (ch->reason_to > ch->reason_from)
        json_array_insert_new(content, 0,
                              json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", text + ch->reason_from,
                                        ch->reason_to - ch->reason_from, "signature", ""));
    json_t *j = kp_anth_message_json(x->id, x->s->cfg.model_name, content, reason, which,
                                     anth_usage(&st->bps, &ch->last));
    json_object_set_new(j, "kvpin_cache", cj);
    return j;
}

static void anth_state_free(void *p) {
    anth_state *st = p;
    if (!st) return;
    kp_anth_request_free(&st->a);
    free(st);
}

json_t *kp_anth_error_shape(const kp_oai_error *e, int *http) {
    const char *type;
    *http = kp_anth_error_status(e->http, &type);
    return kp_anth_error_json(e);
}

static const kp_dialect ANTHROPIC = {
    .name = "anthropic",
    .id_prefix = {"msg_", "msg_"},
    .errors = kp_anth_error_shape,
    .prompt = anth_prompt,
    .open = anth_open,
    .prefill = anth_prefill,
    .text = anth_text,
    .reasoning = anth_reasoning,
    .calls = anth_calls,
    .end = anth_end,
    .close = anth_close,
    .fail = anth_fail,
    .reply = anth_reply,
    .free = anth_state_free,
};

/* The tools a translated chat body renders: none with tool_choice "none"
 * (kp_oai_parse_opts drops them so too). */
static const json_t *chat_tools(const json_t *chat) {
    const json_t *tc = json_object_get(chat, "tool_choice"), *tools = json_object_get(chat, "tools");
    if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) return NULL;
    return json_array_size(tools) ? tools : NULL;
}

KP_HANDLER(kp_anth_count_tokens) {
    kp_anth_request a;
    kp_oai_error e;
    if (!kp_anth_translate(cn->body.data, cn->body.len, true, s->cfg.strict_api, &a, &e))
        return kp_http_error(s, c, &e);
    kp_prompt pr;
    kp_prompt_opts po = {true, false, NULL, false};
    bool ok = kp_prompt_tokens(s, NULL, json_object_get(a.chat, "messages"), chat_tools(a.chat), false, &po, &pr, &e);
    kp_anth_request_free(&a);
    size_t n = pr.n;
    kp_prompt_free(&pr);
    if (!ok) return kp_http_error(s, c, &e);
    return kp_http_json(s, c, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
}

/* POST /v1/messages: the body translated and served as the chat-completions
 * request it means, answered in Anthropic's shape. */
KP_HANDLER(kp_anth_messages) {
    kp_oai_error e;
    anth_state *st = calloc(1, sizeof *st);
    if (!st) return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    if (!kp_anth_translate(cn->body.data, cn->body.len, false, s->cfg.strict_api, &st->a, &e)) {
        free(st);
        return kp_http_error(s, c, &e);
    }
    return kp_answer_run_chat(s, c, cn, &ANTHROPIC, st, st->a.chat, &st->a.ignored);
}
