/*
 * responses.c - the OpenAI Responses API, whole (responses.h): requests
 * into chat-completions requests, response objects, and the dialect
 * (answer.h) that writes a Responses answer and stream.
 *
 * The translation owns nothing between calls: one walk over the body's
 * members, then over the input items, building chat messages in order
 * (function_call items in a row gather into one assistant message).
 *
 * A stream (every event with its sequence_number):
 *
 *   response.created, response.in_progress           at admission (the response, in_progress)
 *   response.in_progress per slice of the prefill    while the prompt is computed
 *   a reasoning model's thinking: response.output_item.added (reasoning),
 *   response.content_part.added (reasoning_text), response.reasoning_text.delta...,
 *   response.reasoning_text.done, response.content_part.done, response.output_item.done
 *   response.output_item.added (message), response.content_part.added,
 *   response.output_text.delta...                    while text comes
 *   response.output_text.done, response.content_part.done, response.output_item.done
 *   per call: response.output_item.added (function_call, arguments ""),
 *             response.function_call_arguments.delta / .done, response.output_item.done
 *   response.completed (or response.incomplete)       the final response, stored
 */
#include "serve/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/answer.h"
#include "serve/response_store.h"

#define BAD(e, param, ...) kp_oai_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

/* The text of a message item's content: a string, or input_text /
 * output_text parts (as chat text parts). NULL with *e set. */
static json_t *item_content(const json_t *c, const char *where, kp_oai_error *e) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        BAD(e, where, "%s.content must be a string or an array of input_text parts", where);
        return NULL;
    }
    json_t *parts = json_array();
    size_t i;
    const json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *t = json_object_get(p, "text");
        char pp[96];
        snprintf(pp, sizeof pp, "%s.content[%zu].type", where, i);
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text")) || !json_is_string(t)) {
            json_decref(parts);
            BAD(e, pp, "%s: %s parts are not supported by this server (input_text and output_text only)", pp,
                type ? type : "untyped");
            return NULL;
        }
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", t));
    }
    return parts;
}

/* A reasoning item's text (a new reference): its reasoning_text content
 * parts, else its summary's summary_text parts, joined by "\n" ("" when it
 * has neither: encrypted_content alone, nothing a template can show).
 * NULL with *e set. */
static json_t *reasoning_text(const json_t *it, const char *where, kp_oai_error *e) {
    const json_t *parts = json_object_get(it, "content");
    const char *want = "reasoning_text";
    if (!json_array_size(parts)) {
        parts = json_object_get(it, "summary");
        want = "summary_text";
    }
    if (parts && !json_is_array(parts) && !json_is_null(parts))
        return BAD(e, where, "%s: a reasoning item's content and summary are arrays of parts", where), NULL;
    kp_buf b = {0};
    size_t i;
    const json_t *p;
    json_array_foreach(parts, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *t = json_object_get(p, "text");
        if (!type || strcmp(type, want) || !json_is_string(t)) {
            kp_buf_free(&b);
            return BAD(e, where, "%s: reasoning parts are {\"type\": \"%s\", \"text\": string}", where, want), NULL;
        }
        if (i) kp_buf_put(&b, "\n", 1);
        kp_buf_put(&b, json_string_value(t), json_string_length(t));
    }
    json_t *out = json_stringn(b.data ? b.data : "", b.len);
    kp_buf_free(&b);
    if (!out) BAD(e, where, "out of memory");
    return out;
}

/* input_items' walk; *rs: the last reasoning item's text not yet given to
 * an assistant message (owned by the caller). */
/* The members of input item it (at where) beyond those kvpin acts on or
 * the API has: named in x-kvpin-ignored-fields, or with --strict-api a 400. */
static bool item_members(const json_t *it, const char *type, const char *where, bool strict, kp_buf *ignored,
                         kp_oai_error *e) {
    static const char *const message[] = {"type", "role", "content", "id", "status", NULL};
    static const char *const call[] = {"type", "call_id", "name", "arguments", "id", "status", "namespace", NULL};
    static const char *const output[] = {"type", "call_id", "output", "id", "status", NULL};
    static const char *const reasoning[] = {"type", "id", "summary", "content", "encrypted_content", "status", NULL};
    const char *const *known = !strcmp(type, "message")         ? message
                               : !strcmp(type, "function_call") ? call
                               : !strcmp(type, "function_call_output") ? output
                                                                        : reasoning;
    return kp_oai_sort_members(it, where, known, NULL, strict, ignored, e);
}

static bool walk_items(const json_t *input, json_t *msgs, json_t **rs, bool strict, kp_buf *ignored,
                       kp_oai_error *e) {
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return true;
    }
    if (!json_is_array(input) || json_array_size(input) == 0)
        return BAD(e, "input", "input must be a string or a non-empty array of input items");
    json_t *calls = NULL; /* the assistant message of function_call items in a row */
    size_t i;
    const json_t *it;
    json_array_foreach(input, i, it) {
        char where[32];
        snprintf(where, sizeof where, "input[%zu]", i);
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!json_is_object(it)) return BAD(e, where, "%s must be an input item object", where);
        if (!type && role) type = "message";
        if (!type) return BAD(e, where, "%s needs a type (message, function_call, function_call_output, reasoning)", where);
        bool supported = !strcmp(type, "message") || !strcmp(type, "function_call") ||
                         !strcmp(type, "function_call_output") || !strcmp(type, "reasoning");
        if (supported && !item_members(it, type, where, strict, ignored, e)) return false;
        if (strcmp(type, "function_call")) calls = NULL;
        if (!strcmp(type, "reasoning")) { /* the model's earlier reasoning, sent back */
            json_decref((*rs));
            if (!((*rs) = reasoning_text(it, where, e))) return false;
            continue;
        }
        if (!strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                          strcmp(role, "developer"))) {
                char p[48];
                snprintf(p, sizeof p, "%s.role", where);
                return BAD(e, p, "%s must be \"user\", \"assistant\", \"system\" or \"developer\"", p);
            }
            json_t *content = item_content(json_object_get(it, "content"), where, e);
            if (!content) return false;
            json_t *m = json_pack("{s:s, s:o}", "role", role, "content", content);
            if (!strcmp(role, "assistant") && (*rs) && json_string_length((*rs)))
                json_object_set(m, "reasoning_content", (*rs));
            if (!strcmp(role, "assistant")) {
                json_decref((*rs));
                (*rs) = NULL;
            }
            json_array_append_new(msgs, m);
        } else if (!strcmp(type, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
            const json_t *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_string_length(name) || !json_is_string(args))
                return BAD(e, where, "%s: a function_call needs call_id, name and arguments (strings)", where);
            if (!calls) {
                json_t *m = json_pack("{s:s, s:n, s:[]}", "role", "assistant", "content", "tool_calls");
                if ((*rs) && json_string_length((*rs))) json_object_set(m, "reasoning_content", (*rs));
                json_array_append_new(msgs, m);
                calls = json_object_get(m, "tool_calls");
            }
            json_decref((*rs));
            (*rs) = NULL;
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
                                                   "function", "name", name, "arguments", args));
        } else if (!strcmp(type, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            if (!json_is_string(id) || !json_is_string(out))
                return BAD(e, where, "%s: a function_call_output needs call_id and output (strings)", where);
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:O}", "role", "tool", "tool_call_id", id, "content",
                                                  out));
        } else {
            char p[48];
            snprintf(p, sizeof p, "%s.type", where);
            return BAD(e, p, "%s: %.40s items are not supported by this server (message, function_call, "
                             "function_call_output, reasoning)", p, type);
        }
    }
    return true;
}

static bool input_items(const json_t *input, json_t *msgs, bool strict, kp_buf *ignored, kp_oai_error *e) {
    json_t *rs = NULL;
    bool ok = walk_items(input, msgs, &rs, strict, ignored, e);
    json_decref(rs);
    return ok;
}

/* Tool types the Responses API runs on OpenAI's side: kvpin cannot run
 * them, so they are left out of the prompt (and named as ignored). */
static const char *const HOSTED_TOOLS[] = {"web_search", "web_search_preview", "file_search", "code_interpreter",
                                           "computer_use", "computer_use_preview", "image_generation", "mcp",
                                           "local_shell", "custom", NULL};

/* One function tool (the flat Responses form) as a chat tool, appended to
 * out; its name must be new (names: the names seen so far, a set). */
static bool function_tool(const json_t *t, const char *where, json_t *out, json_t *names, kp_oai_error *e) {
    const json_t *name = json_object_get(t, "name"), *params = json_object_get(t, "parameters");
    const json_t *desc = json_object_get(t, "description"), *strict = json_object_get(t, "strict");
    if (!json_is_string(name) || !json_string_length(name) || (params && !json_is_object(params) && !json_is_null(params)))
        return BAD(e, where, "%s needs a name and parameters that are a JSON Schema object", where);
    if (json_object_get(names, json_string_value(name)))
        return BAD(e, where, "%s: two tools are named \"%.64s\"", where, json_string_value(name));
    json_object_set_new(names, json_string_value(name), json_true());
    json_t *fn = json_pack("{s:O}", "name", name);
    if (json_is_object(params)) json_object_set(fn, "parameters", (json_t *)params);
    if (json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
    if (json_is_boolean(strict)) json_object_set(fn, "strict", (json_t *)strict);
    json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    return true;
}

/* A namespace tool ({type: namespace, name, description, tools: [function
 * tools]}, Codex's groups of tools) flattened into its functions: the
 * model sees and calls them by their own names, and a call's
 * function_call item names the namespace again (r->ns_of). */
static bool namespace_tool(kp_resp_request *r, const json_t *t, const char *where, json_t *out, json_t *names,
                           kp_oai_error *e) {
    const json_t *ns = json_object_get(t, "name"), *inner = json_object_get(t, "tools");
    if (!json_is_string(ns) || !json_string_length(ns) || !json_is_array(inner))
        return BAD(e, where, "%s: a namespace needs a name and tools (an array of function tools)", where);
    size_t k;
    const json_t *f;
    json_array_foreach(inner, k, f) {
        char w[64];
        snprintf(w, sizeof w, "%s.tools[%zu]", where, k);
        const char *type = json_string_value(json_object_get(f, "type"));
        if (!type || strcmp(type, "function"))
            return BAD(e, w, "%s: a namespace holds function tools only (not \"%.40s\")", w, type ? type : "");
        if (!function_tool(f, w, out, names, e)) return false;
        json_object_set(r->ns_of, json_string_value(json_object_get(f, "name")), (json_t *)ns);
    }
    return true;
}

/* tools: function tools as chat tools; namespaces flattened; hosted tools
 * (HOSTED_TOOLS) left out and named in r->ignored ("tools[7]:web_search"),
 * or refused when strict; any other type refused. */
static bool tools_field(kp_resp_request *r, const json_t *tools, bool strict, kp_oai_error *e) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return BAD(e, "tools", "tools must be an array of function tools");
    if (!json_array_size(tools)) return true;
    json_t *out = json_array(), *names = json_object();
    bool ok = out && names;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (!ok) break;
        char where[32];
        snprintf(where, sizeof where, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        bool hosted = false;
        for (int h = 0; type && HOSTED_TOOLS[h] && !hosted; h++) hosted = !strcmp(type, HOSTED_TOOLS[h]);
        if (type && !strcmp(type, "function")) {
            ok = function_tool(t, where, out, names, e);
        } else if (type && !strcmp(type, "namespace")) {
            ok = namespace_tool(r, t, where, out, names, e);
        } else if (hosted && !strict) {
            char note[80];
            snprintf(note, sizeof note, "%s:%s", where, type);
            ok = kp_oai_note_ignored(&r->ignored, note) ||
                 kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        } else {
            ok = BAD(e, where, "%s: tool type \"%.40s\" is not supported by this server (function and namespace "
                               "tools; hosted tools such as web_search are left out unless --strict-api)",
                     where, type ? type : "");
        }
    }
    json_decref(names);
    if (ok && json_array_size(out)) json_object_set_new(r->chat, "tools", out);
    else json_decref(out);
    return ok;
}

static bool tool_choice(const json_t *tc, json_t *chat, kp_oai_error *e) {
    if (!tc || json_is_null(tc)) return true;
    const char *s = json_string_value(tc);
    if (s && (!strcmp(s, "auto") || !strcmp(s, "none") || !strcmp(s, "required"))) {
        json_object_set(chat, "tool_choice", (json_t *)tc);
        return true;
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const json_t *name = json_object_get(tc, "name");
    if (type && !strcmp(type, "function") && json_is_string(name)) {
        json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
        return true;
    }
    return BAD(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                                 "\"name\": ...}");
}

static bool text_format(const json_t *text, json_t *chat, kp_oai_error *e) {
    if (!text || json_is_null(text)) return true;
    const json_t *f = json_object_get(text, "format");
    if (!json_is_object(text)) return BAD(e, "text", "text must be an object");
    if (!f || json_is_null(f)) return true;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (type && !strcmp(type, "text")) return true;
    if (type && !strcmp(type, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return true;
    }
    if (type && !strcmp(type, "json_schema")) {
        const json_t *schema = json_object_get(f, "schema"), *name = json_object_get(f, "name");
        if (!json_is_object(schema)) return BAD(e, "text.format.schema", "text.format.schema must be a JSON Schema object");
        json_t *js = json_pack("{s:s, s:O}", "name", json_is_string(name) ? json_string_value(name) : "response",
                               "schema", schema);
        const json_t *strict = json_object_get(f, "strict");
        if (json_is_boolean(strict)) json_object_set(js, "strict", (json_t *)strict);
        json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
        return true;
    }
    return BAD(e, "text.format.type", "text.format.type must be \"text\", \"json_object\" or \"json_schema\"");
}

static bool number(const json_t *root, const char *k, const char *to, double lo, double hi, json_t *chat,
                   kp_oai_error *e) {
    const json_t *v = json_object_get(root, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return BAD(e, k, "%s must be a number from %g to %g", k, lo, hi);
    json_object_set(chat, to, (json_t *)v);
    return true;
}

bool kp_resp_previous(const char *body, size_t len, char *out, size_t cap) {
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    const char *p = json_string_value(json_object_get(root, "previous_response_id"));
    if (p) snprintf(out, cap, "%s", p);
    json_decref(root);
    return p != NULL;
}

bool kp_resp_translate(const char *body, size_t len, const json_t *prev_conv, bool strict, kp_resp_request *r,
                       kp_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->root = kp_oai_parse_object(body, len, e);
    if (!r->root) return false;
    json_t *root = r->root;
    r->chat = json_object();
    r->conv = prev_conv ? json_deep_copy(prev_conv) : json_array();
    r->ns_of = json_object();
    r->store = true;
    bool ok = r->chat && r->conv && r->ns_of;
    if (!ok) kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const json_t *model = json_object_get(root, "model");
    if (ok && model && !json_is_string(model) && !json_is_null(model)) ok = BAD(e, "model", "model must be a string");
    if (ok && json_is_string(model)) json_object_set(r->chat, "model", (json_t *)model);
    const json_t *prev = json_object_get(root, "previous_response_id");
    if (ok && prev && !json_is_null(prev) && !json_is_string(prev))
        ok = BAD(e, "previous_response_id", "previous_response_id must be a string");
    r->previous = json_string_value(prev);
    const json_t *ins = json_object_get(root, "instructions");
    if (ok && ins && !json_is_null(ins) && !json_is_string(ins)) ok = BAD(e, "instructions", "instructions must be a string");
    json_t *msgs = json_array();
    if (ok && json_is_string(ins) && json_string_length(ins))
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    size_t i;
    json_t *m;
    json_array_foreach(r->conv, i, m) json_array_append(msgs, m);
    if (ok) {
        json_t *fresh = json_array();
        ok = input_items(json_object_get(root, "input"), fresh, strict, &r->ignored, e);
        json_array_foreach(fresh, i, m) {
            json_array_append(msgs, m);
            json_array_append(r->conv, m);
        }
        json_decref(fresh);
    }
    if (ok) ok = tools_field(r, json_object_get(root, "tools"), strict, e);
    if (ok) ok = tool_choice(json_object_get(root, "tool_choice"), r->chat, e);
    if (ok) ok = text_format(json_object_get(root, "text"), r->chat, e);
    if (ok) ok = number(root, "temperature", "temperature", 0, 2, r->chat, e);
    if (ok) ok = number(root, "top_p", "top_p", 0, 1, r->chat, e);
    const json_t *mo = json_object_get(root, "max_output_tokens");
    if (ok && mo && !json_is_null(mo)) {
        if (!json_is_integer(mo) || json_integer_value(mo) < 1 || json_integer_value(mo) > (1 << 30))
            ok = BAD(e, "max_output_tokens", "max_output_tokens must be a whole number >= 1");
        else json_object_set(r->chat, "max_tokens", (json_t *)mo);
    }
    /* the cache key and retention mean for the chat layer what they mean
     * here; grammar is kvpin's own (GBNF, as on chat completions) */
    static const char *const passed[] = {"prompt_cache_key", "prompt_cache_retention", "grammar"};
    for (size_t k = 0; ok && k < sizeof passed / sizeof *passed; k++) {
        const json_t *v = json_object_get(root, passed[k]);
        if (v && !json_is_null(v)) json_object_set(r->chat, passed[k], (json_t *)v);
    }
    const json_t *pt = json_object_get(root, "parallel_tool_calls");
    if (ok && json_is_boolean(pt)) json_object_set(r->chat, "parallel_tool_calls", (json_t *)pt);
    const json_t *st = json_object_get(root, "stream"), *so = json_object_get(root, "store");
    if (ok && st && !json_is_null(st) && !json_is_boolean(st)) ok = BAD(e, "stream", "stream must be true or false");
    if (ok && so && !json_is_null(so) && !json_is_boolean(so)) ok = BAD(e, "store", "store must be true or false");
    r->stream = json_is_true(st);
    if (json_is_boolean(so)) r->store = json_is_true(so);
    static const char *const known[] = {"model", "input", "instructions", "tools", "tool_choice", "text",
                                        "temperature", "top_p", "max_output_tokens", "parallel_tool_calls",
                                        "stream", "store", "previous_response_id", "prompt_cache_key",
                                        "prompt_cache_retention", "grammar", NULL};
    static const char *const openai[] = {"metadata", "user", "reasoning", "truncation", "include", "service_tier",
                                         "background", "prompt", "safety_identifier",
                                         "top_logprobs", "max_tool_calls", "stream_options", "conversation", NULL};
    const char *unknown;
    if (ok && !kp_oai_sort_fields(root, known, openai, strict, &r->ignored, &unknown))
        ok = BAD(e, unknown, "%.64s: unknown field", unknown);
    if (ok) {
        json_object_set_new(r->chat, "messages", msgs);
        if (r->stream) {
            json_object_set_new(r->chat, "stream", json_true());
            json_object_set_new(r->chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
        }
    } else {
        json_decref(msgs);
        kp_resp_request_free(r);
    }
    return ok;
}

void kp_resp_request_free(kp_resp_request *r) {
    if (!r) return;
    json_decref(r->root);
    json_decref(r->chat);
    json_decref(r->conv);
    json_decref(r->ns_of);
    kp_buf_free(&r->ignored);
    memset(r, 0, sizeof *r);
}

void kp_resp_item_id(char *out, size_t cap, const char *prefix, uint64_t seed, size_t i) {
    uint64_t x = (seed + i + 1) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    snprintf(out, cap, "%s_%016llx", prefix, (unsigned long long)x);
}

json_t *kp_resp_output_json(const char *text, size_t text_len, const json_t *calls, uint64_t item_seed,
                            const char *status, const json_t *ns_of) {
    json_t *a = json_array();
    char id[48];
    if (text_len || json_array_size(calls) == 0) {
        kp_resp_item_id(id, sizeof id, "msg", item_seed, 0);
        json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[]}]}", "type", "message", "id", id,
                                           "status", status, "role", "assistant", "content", "type",
                                           "output_text", "text", text ? text : "", text_len, "annotations"));
    }
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        kp_resp_item_id(id, sizeof id, "fc", item_seed, i + 1);
        json_t *item = json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "type", "function_call", "id", id, "call_id",
                                 json_object_get(c, "id"), "name", json_object_get(fn, "name"), "arguments",
                                 json_object_get(fn, "arguments"), "status", "completed");
        json_t *ns = json_object_get(ns_of, json_string_value(json_object_get(fn, "name")));
        if (item && ns) json_object_set(item, "namespace", ns);
        json_array_append_new(a, item);
    }
    return a;
}

json_t *kp_resp_reasoning_item(const char *text, size_t len, uint64_t item_seed, const char *status) {
    char id[48];
    kp_resp_item_id(id, sizeof id, "rs", item_seed, 0);
    json_t *content = json_array();
    if (strcmp(status, "in_progress"))
        json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", text ? text : "", len));
    return json_pack("{s:s, s:s, s:s, s:[], s:o}", "type", "reasoning", "id", id, "status", status, "summary",
                     "content", content);
}

json_t *kp_resp_usage_json(uint32_t input, uint32_t cached, uint32_t output) {
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens", (json_int_t)input, "input_tokens_details",
                     "cached_tokens", (json_int_t)cached, "output_tokens", (json_int_t)output,
                     "output_tokens_details", "reasoning_tokens", 0, "total_tokens", (json_int_t)(input + output));
}

json_t *kp_resp_object_json(const char *id, const char *model, int64_t created, const char *status,
                            const kp_resp_request *r, json_t *output, json_t *usage) {
    const json_t *root = r->root;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:n, s:o}", "id", id, "object", "response", "created_at",
                          (json_int_t)created, "status", status, "model", model, "output",
                          output ? output : json_array(), "error", "usage", usage ? usage : json_null());
    if (!o) return NULL;
    json_object_set_new(o, "incomplete_details", !strcmp(status, "incomplete")
                                                     ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                     : json_null());
    static const char *const echo[] = {"instructions", "max_output_tokens", "previous_response_id", "temperature",
                                       "top_p", "tool_choice", "tools", "text", "metadata", NULL};
    for (const char *const *k = echo; *k; k++) {
        const json_t *v = json_object_get(root, *k);
        json_object_set_new(o, *k, v ? json_deep_copy(v) : json_null());
    }
    if (json_is_null(json_object_get(o, "tools"))) json_object_set_new(o, "tools", json_array());
    if (json_is_null(json_object_get(o, "tool_choice"))) json_object_set_new(o, "tool_choice", json_string("auto"));
    if (json_is_null(json_object_get(o, "text")))
        json_object_set_new(o, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    if (json_is_null(json_object_get(o, "metadata"))) json_object_set_new(o, "metadata", json_object());
    json_object_set_new(o, "parallel_tool_calls", json_boolean(!json_is_false(json_object_get(root, "parallel_tool_calls"))));
    json_object_set_new(o, "store", json_boolean(r->store));
    return o;
}

json_t *kp_resp_conv_after(const kp_resp_request *r, const char *text, size_t text_len, const json_t *calls) {
    json_t *c = json_deep_copy(r->conv);
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_object_set_new(m, "content", text_len || !calls ? json_stringn(text ? text : "", text_len) : json_null());
    if (calls) json_object_set_new(m, "tool_calls", json_deep_copy(calls));
    json_array_append_new(c, m);
    return c;
}

bool kp_resp_event(kp_buf *out, const char *name, json_t *data, uint32_t *seq) {
    if (!data) return false;
    return kp_oai_sse_event(out, name, json_pack("{s:s, s:I}", "type", name, "sequence_number", (json_int_t)(*seq)++),
                            data);
}

/* ---- the dialect: Responses answers and streams ------------------------------------- */

/* What a Responses request keeps through its answer (the dialect's dreq). */
typedef struct {
    kp_resp_request r;
    kp_buf text;         /* streaming: the text sent */
    kp_buf reason;       /* streaming: the reasoning sent */
    bool reason_open;    /* the reasoning item is open */
    const json_t *calls; /* streaming: the calls sent (the answer's) */
    uint32_t seq;        /* sequence_number of the next event */
    bool text_open;      /* the message item is open */
    uint32_t n_items;    /* output items started */
} resp_state;

/* How the response ended: "incomplete" when max_output_tokens cut its
 * text (no calls), else "completed"; its message item says the same. */
static const char *final_status(const kp_answer *x) {
    const kp_choice *ch = &x->ch[0];
    return ch->last.finish == KP_FINISH_LENGTH && !ch->calls ? "incomplete" : "completed";
}

/* The response object of a Responses request that ended, stored when the
 * request asks (store, the default): its conversation with the answer is
 * what previous_response_id continues. output and cj (kvpin_cache, may be
 * NULL) consumed. */
static json_t *resp_final(kp_answer *x, json_t *output, json_t *cj, const char *text, size_t tlen,
                          const json_t *calls, const char *reason, size_t rlen) {
    resp_state *st = x->dreq;
    const kp_sreq_update *u = &x->ch[0].last;
    const char *status = final_status(x);
    json_t *o = kp_resp_object_json(x->id, x->s->cfg.model_name, (int64_t)time(NULL), status, &st->r, output,
                                    kp_resp_usage_json(u->prompt_tokens, u->cached_tokens, u->completion_tokens));
    if (st->r.store) {
        json_t *conv = kp_resp_conv_after(&st->r, text, tlen, calls);
        if (conv && rlen) /* the answer's reasoning, for the template to render or drop */
            json_object_set_new(json_array_get(conv, json_array_size(conv) - 1), "reasoning_content",
                                json_stringn(reason, rlen));
        bool kept = conv && kp_response_store_put(x->s->responses, x->id, o, conv);
        json_decref(conv);
        if (cj) json_object_set_new(cj, "stored", json_boolean(kept));
    }
    json_object_set_new(o, "kvpin_cache", cj);
    return o;
}

static json_t *msg_item(kp_answer *x, const char *status) {
    resp_state *st = x->dreq;
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", x->id_seed, 0);
    json_t *content = json_array();
    if (strcmp(status, "in_progress"))
        json_array_append_new(content, json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text",
                                                 st->text.data ? st->text.data : "", st->text.len, "annotations"));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", status, "role", "assistant",
                     "content", content);
}

/* response.created and response.in_progress. */
static void resp_open(kp_answer *x, const kp_sreq_update *u) {
    (void)u;
    resp_state *st = x->dreq;
    json_t *o = kp_resp_object_json(x->id, x->s->cfg.model_name, (int64_t)x->created, "in_progress", &st->r, NULL,
                                    NULL);
    kp_resp_event(&x->out, "response.created", json_pack("{s:O}", "response", o), &st->seq);
    kp_resp_event(&x->out, "response.in_progress", json_pack("{s:o}", "response", o), &st->seq);
}

/* While the prompt is computed: response.in_progress again per slice of
 * the prefill after the first (it keeps the client's first-byte timer
 * and the connection alive). */
static void resp_prefill(kp_answer *x, const kp_sreq_update *u) {
    resp_state *st = x->dreq;
    if (!x->prog_any || u->prefill_done >= u->prompt_tokens) return;
    json_t *o = kp_resp_object_json(x->id, x->s->cfg.model_name, (int64_t)x->created, "in_progress", &st->r, NULL,
                                    NULL);
    kp_resp_event(&x->out, "response.in_progress", json_pack("{s:o}", "response", o), &st->seq);
}

/* Streaming: the reasoning item ends. */
static void close_reasoning(kp_answer *x) {
    resp_state *st = x->dreq;
    if (!st->reason_open) return;
    char id[48];
    kp_resp_item_id(id, sizeof id, "rs", x->id_seed, 0);
    const char *t = st->reason.data ? st->reason.data : "";
    kp_resp_event(&x->out, "response.reasoning_text.done",
                  json_pack("{s:s, s:I, s:i, s:s%}", "item_id", id, "output_index", (json_int_t)st->n_items,
                            "content_index", 0, "text", t, st->reason.len),
                  &st->seq);
    kp_resp_event(&x->out, "response.content_part.done",
                  json_pack("{s:s, s:I, s:i, s:{s:s, s:s%}}", "item_id", id, "output_index", (json_int_t)st->n_items,
                            "content_index", 0, "part", "type", "reasoning_text", "text", t, st->reason.len),
                  &st->seq);
    kp_resp_event(&x->out, "response.output_item.done",
                  json_pack("{s:I, s:o}", "output_index", (json_int_t)st->n_items, "item",
                            kp_resp_reasoning_item(t, st->reason.len, x->id_seed, "completed")),
                  &st->seq);
    st->reason_open = false;
    st->n_items++;
}

/* The model's reasoning as a reasoning item with one reasoning_text part,
 * streamed as response.reasoning_text.delta. */
static void resp_reasoning(kp_answer *x, uint32_t i, const char *text, size_t len) {
    (void)i;
    resp_state *st = x->dreq;
    char id[48];
    kp_resp_item_id(id, sizeof id, "rs", x->id_seed, 0);
    if (!st->reason_open) {
        kp_resp_event(&x->out, "response.output_item.added",
                      json_pack("{s:I, s:o}", "output_index", (json_int_t)st->n_items, "item",
                                kp_resp_reasoning_item(NULL, 0, x->id_seed, "in_progress")),
                      &st->seq);
        kp_resp_event(&x->out, "response.content_part.added",
                      json_pack("{s:s, s:I, s:i, s:{s:s, s:s}}", "item_id", id, "output_index",
                                (json_int_t)st->n_items, "content_index", 0, "part", "type", "reasoning_text", "text",
                                ""),
                      &st->seq);
        st->reason_open = true;
    }
    kp_buf_put(&st->reason, text, len);
    kp_resp_event(&x->out, "response.reasoning_text.delta",
                  json_pack("{s:s, s:I, s:i, s:s%}", "item_id", id, "output_index", (json_int_t)st->n_items,
                            "content_index", 0, "delta", text, len),
                  &st->seq);
}

/* The message item and its output_text part begin. */
static void open_text(kp_answer *x) {
    resp_state *st = x->dreq;
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", x->id_seed, 0);
    kp_resp_event(&x->out, "response.output_item.added",
                  json_pack("{s:I, s:o}", "output_index", (json_int_t)st->n_items, "item", msg_item(x, "in_progress")),
                  &st->seq);
    kp_resp_event(&x->out, "response.content_part.added",
                  json_pack("{s:s, s:I, s:i, s:{s:s, s:s, s:[]}}", "item_id", id, "output_index",
                            (json_int_t)st->n_items, "content_index", 0, "part", "type", "output_text", "text", "",
                            "annotations"),
                  &st->seq);
    st->text_open = true;
}

static void resp_text(kp_answer *x, uint32_t i, const char *text, size_t len, json_t *lp) {
    (void)i;
    json_decref(lp); /* the Responses API's logprobs are not offered */
    resp_state *st = x->dreq;
    if (!text || !len) return;
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", x->id_seed, 0);
    close_reasoning(x);
    if (!st->text_open) open_text(x);
    kp_buf_put(&st->text, text, len);
    kp_resp_event(&x->out, "response.output_text.delta",
                  json_pack("{s:s, s:I, s:i, s:s%}", "item_id", id, "output_index", (json_int_t)st->n_items,
                            "content_index", 0, "delta", text, len),
                  &st->seq);
}

/* The message item ends with status (an empty one when forced, with
 * nothing sent). */
static void close_text(kp_answer *x, bool force, const char *status) {
    resp_state *st = x->dreq;
    if (!st->text_open && !force) return;
    if (!st->text_open) open_text(x);
    char id[48];
    kp_resp_item_id(id, sizeof id, "msg", x->id_seed, 0);
    const char *t = st->text.data ? st->text.data : "";
    kp_resp_event(&x->out, "response.output_text.done",
                  json_pack("{s:s, s:I, s:i, s:s%}", "item_id", id, "output_index", (json_int_t)st->n_items,
                            "content_index", 0, "text", t, st->text.len),
                  &st->seq);
    kp_resp_event(&x->out, "response.content_part.done",
                  json_pack("{s:s, s:I, s:i, s:{s:s, s:s%, s:[]}}", "item_id", id, "output_index",
                            (json_int_t)st->n_items, "content_index", 0, "part", "type", "output_text", "text", t,
                            st->text.len, "annotations"),
                  &st->seq);
    kp_resp_event(&x->out, "response.output_item.done",
                  json_pack("{s:I, s:o}", "output_index", (json_int_t)st->n_items, "item", msg_item(x, status)),
                  &st->seq);
    st->text_open = false;
    st->n_items++;
}

/* The calls as function_call items: added with empty arguments, the
 * arguments as one delta, done. */
static void resp_calls(kp_answer *x, uint32_t i, const json_t *calls) {
    (void)i;
    resp_state *st = x->dreq;
    close_reasoning(x);
    close_text(x, false, "completed");
    json_t *items = kp_resp_output_json(NULL, 0, calls, x->id_seed, "completed", st->r.ns_of);
    st->calls = calls;
    size_t k;
    json_t *it;
    json_array_foreach(items, k, it) {
        json_t *idx = json_integer((json_int_t)st->n_items);
        json_t *added = json_deep_copy(it);
        json_object_set_new(added, "arguments", json_string(""));
        json_object_set_new(added, "status", json_string("in_progress"));
        kp_resp_event(&x->out, "response.output_item.added",
                      json_pack("{s:O, s:o}", "output_index", idx, "item", added), &st->seq);
        kp_resp_event(&x->out, "response.function_call_arguments.delta",
                      json_pack("{s:O, s:O, s:O}", "item_id", json_object_get(it, "id"), "output_index", idx, "delta",
                                json_object_get(it, "arguments")),
                      &st->seq);
        kp_resp_event(&x->out, "response.function_call_arguments.done",
                      json_pack("{s:O, s:O, s:O}", "item_id", json_object_get(it, "id"), "output_index", idx,
                                "arguments", json_object_get(it, "arguments")),
                      &st->seq);
        kp_resp_event(&x->out, "response.output_item.done", json_pack("{s:O, s:O}", "output_index", idx, "item", it),
                      &st->seq);
        json_decref(idx);
        st->n_items++;
    }
    json_decref(items);
}

static void resp_end(kp_answer *x, uint32_t i) {
    (void)x;
    (void)i; /* one choice: its end is the response's (resp_close) */
}

/* The items closed, response.completed (or .incomplete) with the final
 * response object, stored. */
static void resp_close(kp_answer *x) {
    resp_state *st = x->dreq;
    bool reasoned = st->reason.len > 0;
    close_reasoning(x);
    close_text(x, st->n_items == (reasoned ? 1u : 0u), final_status(x));
    const char *t = st->text.data ? st->text.data : "";
    const char *r = st->reason.data ? st->reason.data : "";
    json_t *output = kp_resp_output_json(t, st->text.len, st->calls, x->id_seed, final_status(x), st->r.ns_of);
    if (reasoned) json_array_insert_new(output, 0, kp_resp_reasoning_item(r, st->reason.len, x->id_seed, "completed"));
    json_t *cj = x->report;
    x->report = NULL;
    json_t *o = resp_final(x, output, cj, t, st->text.len, st->calls, r, st->reason.len);
    const char *status = json_string_value(json_object_get(o, "status"));
    bool incomplete = status && !strcmp(status, "incomplete");
    kp_resp_event(&x->out, incomplete ? "response.incomplete" : "response.completed",
                  json_pack("{s:o}", "response", o), &st->seq);
}

static void resp_fail(kp_answer *x, const kp_oai_error *e) {
    resp_state *st = x->dreq;
    kp_resp_event(&x->out, "error",
                  json_pack("{s:s, s:s?, s:s}", "message", e->message, "code", e->code, "param", e->param), &st->seq);
}

/* The response of a Responses request that ended (not streaming). */
static json_t *resp_reply(kp_answer *x) {
    const kp_choice *ch = &x->ch[0];
    const char *text = ch->text.data ? ch->text.data : "";
    resp_state *st = x->dreq;
    const char *c = text + ch->content_from, *r = text + ch->reason_from;
    size_t cl = ch->content - ch->content_from, rl = ch->reason_to - ch->reason_from;
    json_t *out = kp_resp_output_json(c, cl, ch->calls, x->id_seed, final_status(x), st->r.ns_of);
    if (rl) json_array_insert_new(out, 0, kp_resp_reasoning_item(r, rl, x->id_seed, "completed"));
    json_t *cj = x->report;
    x->report = NULL;
    return resp_final(x, out, cj, c, cl, ch->calls, r, rl);
}

static void resp_state_free(void *p) {
    resp_state *st = p;
    if (!st) return;
    kp_resp_request_free(&st->r);
    kp_buf_free(&st->text);
    kp_buf_free(&st->reason);
    free(st);
}

static const kp_dialect RESPONSES = {
    .name = "responses",
    .id_prefix = {"resp_", "resp_"},
    .errors = NULL,
    .prompt = NULL,
    .open = resp_open,
    .prefill = resp_prefill,
    .text = resp_text,
    .reasoning = resp_reasoning,
    .calls = resp_calls,
    .end = resp_end,
    .close = resp_close,
    .fail = resp_fail,
    .reply = resp_reply,
    .free = resp_state_free,
};

/* POST /v1/responses: the body translated, with the stored conversation
 * of previous_response_id in front, and served as the chat request it
 * means. */
KP_HANDLER(kp_resp_create) {
    kp_oai_error e;
    char prev_id[128];
    json_t *prev = NULL;
    if (kp_resp_previous(cn->body.data, cn->body.len, prev_id, sizeof prev_id) &&
        !kp_response_store_get(s->responses, prev_id, NULL, &prev))
        return kp_http_fail(s, c, 404, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                            "Previous response with id '%.100s' not found (never stored, deleted, or dropped from the "
                            "store)",
                            prev_id);
    resp_state *st = calloc(1, sizeof *st);
    if (!st) {
        json_decref(prev);
        return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    bool ok = kp_resp_translate(cn->body.data, cn->body.len, prev, s->cfg.strict_api, &st->r, &e);
    json_decref(prev);
    if (!ok) {
        free(st);
        return kp_http_error(s, c, &e);
    }
    return kp_answer_run_chat(s, c, cn, &RESPONSES, st, st->r.chat, &st->r.ignored);
}

/* GET and DELETE /v1/responses/{id}. */
static enum MHD_Result stored(kp_server *s, struct MHD_Connection *c, const char *id, bool del) {
    json_t *o = NULL;
    bool found = del ? kp_response_store_delete(s->responses, id) : kp_response_store_get(s->responses, id, &o, NULL);
    if (!found)
        return kp_http_fail(s, c, 404, "invalid_request_error", "not_found", "id", "No response with id '%.100s' found",
                            id);
    if (del)
        return kp_http_json(s, c, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
    return kp_http_json(s, c, 200, o);
}

KP_HANDLER(kp_resp_get) { return stored(s, c, id, false); }

KP_HANDLER(kp_resp_delete) { return stored(s, c, id, true); }
