/*
 * responses.c - the OpenAI Responses API's translation, objects and
 * store (responses.h).
 *
 * The translation owns nothing between calls: one walk over the body's
 * members, then over the input items, building chat messages in order
 * (function_call items in a row gather into one assistant message).
 *
 * The store is a doubly linked list, most recently used first, of
 * entries {id, response text, conversation text}, searched linearly (a few
 * hundred at most); texts are kept serialized so that its bytes are known
 * and nothing is shared with a request.
 */
#include "serve/responses.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static bool input_items(const json_t *input, json_t *msgs, kp_oai_error *e) {
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
        if (!type) return BAD(e, where, "%s needs a type (message, function_call, function_call_output)", where);
        if (strcmp(type, "function_call")) calls = NULL;
        if (!strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                          strcmp(role, "developer"))) {
                char p[48];
                snprintf(p, sizeof p, "%s.role", where);
                return BAD(e, p, "%s must be \"user\", \"assistant\", \"system\" or \"developer\"", p);
            }
            json_t *content = item_content(json_object_get(it, "content"), where, e);
            if (!content) return false;
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", role, "content", content));
        } else if (!strcmp(type, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
            const json_t *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_string_length(name) || !json_is_string(args))
                return BAD(e, where, "%s: a function_call needs call_id, name and arguments (strings)", where);
            if (!calls) {
                json_t *m = json_pack("{s:s, s:n, s:[]}", "role", "assistant", "content", "tool_calls");
                json_array_append_new(msgs, m);
                calls = json_object_get(m, "tool_calls");
            }
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
                             "function_call_output)", p, type);
        }
    }
    return true;
}

static bool tools_field(const json_t *tools, json_t *chat, kp_oai_error *e) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return BAD(e, "tools", "tools must be an array of function tools");
    if (!json_array_size(tools)) return true;
    json_t *out = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        char where[32];
        snprintf(where, sizeof where, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *name = json_object_get(t, "name"), *params = json_object_get(t, "parameters");
        const json_t *desc = json_object_get(t, "description"), *strict = json_object_get(t, "strict");
        if (!type || strcmp(type, "function")) {
            json_decref(out);
            return BAD(e, where, "%s: tool type \"%.40s\" is not supported by this server (function only)", where,
                       type ? type : "");
        }
        if (!json_is_string(name) || !json_string_length(name) || (params && !json_is_object(params) && !json_is_null(params))) {
            json_decref(out);
            return BAD(e, where, "%s needs a name and parameters that are a JSON Schema object", where);
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        if (json_is_object(params)) json_object_set(fn, "parameters", (json_t *)params);
        if (json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
        if (json_is_boolean(strict)) json_object_set(fn, "strict", (json_t *)strict);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(chat, "tools", out);
    return true;
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
    json_t *root = json_loadb(body, len, 0, NULL);
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
    r->store = true;
    bool ok = r->chat && r->conv;
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
        ok = input_items(json_object_get(root, "input"), fresh, e);
        json_array_foreach(fresh, i, m) {
            json_array_append(msgs, m);
            json_array_append(r->conv, m);
        }
        json_decref(fresh);
    }
    if (ok) ok = tools_field(json_object_get(root, "tools"), r->chat, e);
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
    const json_t *pt = json_object_get(root, "parallel_tool_calls");
    if (ok && json_is_boolean(pt)) json_object_set(r->chat, "parallel_tool_calls", (json_t *)pt);
    const json_t *st = json_object_get(root, "stream"), *so = json_object_get(root, "store");
    if (ok && st && !json_is_null(st) && !json_is_boolean(st)) ok = BAD(e, "stream", "stream must be true or false");
    if (ok && so && !json_is_null(so) && !json_is_boolean(so)) ok = BAD(e, "store", "store must be true or false");
    r->stream = json_is_true(st);
    if (json_is_boolean(so)) r->store = json_is_true(so);
    static const char *const known[] = {"model", "input", "instructions", "tools", "tool_choice", "text",
                                        "temperature", "top_p", "max_output_tokens", "parallel_tool_calls",
                                        "stream", "store", "previous_response_id", NULL};
    static const char *const openai[] = {"metadata", "user", "reasoning", "truncation", "include", "service_tier",
                                         "background", "prompt", "prompt_cache_key", "safety_identifier",
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
    kp_buf_free(&r->ignored);
    memset(r, 0, sizeof *r);
}

void kp_resp_item_id(char *out, size_t cap, const char *prefix, uint64_t seed, size_t i) {
    uint64_t x = (seed + i + 1) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    snprintf(out, cap, "%s_%016llx", prefix, (unsigned long long)x);
}

json_t *kp_resp_output_json(const char *text, size_t text_len, const json_t *calls, uint64_t item_seed) {
    json_t *a = json_array();
    char id[48];
    if (text_len || json_array_size(calls) == 0) {
        kp_resp_item_id(id, sizeof id, "msg", item_seed, 0);
        json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[]}]}", "type", "message", "id", id,
                                           "status", "completed", "role", "assistant", "content", "type",
                                           "output_text", "text", text ? text : "", text_len, "annotations"));
    }
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        kp_resp_item_id(id, sizeof id, "fc", item_seed, i + 1);
        json_array_append_new(a, json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "type", "function_call", "id", id,
                                           "call_id", json_object_get(c, "id"), "name", json_object_get(fn, "name"),
                                           "arguments", json_object_get(fn, "arguments"), "status", "completed"));
    }
    return a;
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

/* ---- the store ---------------------------------------------------------- */

typedef struct rentry {
    char *id, *response, *conv;
    size_t bytes;
    struct rentry *prev, *next;
} rentry;

struct kp_rstore {
    pthread_mutex_t mu;
    rentry *head, *tail; /* most recently used first */
    uint32_t count, max_count;
    size_t bytes, max_bytes;
};

kp_status kp_rstore_new(kp_rstore **out, uint32_t max_count, size_t max_bytes, kp_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kp_fail(err, KP_ENOMEM, "out of memory for the response store");
    (*out)->max_count = max_count ? max_count : 1;
    (*out)->max_bytes = max_bytes ? max_bytes : 1;
    pthread_mutex_init(&(*out)->mu, NULL);
    return KP_OK;
}

static void unlink_entry(kp_rstore *s, rentry *x) {
    if (x->prev) x->prev->next = x->next;
    else s->head = x->next;
    if (x->next) x->next->prev = x->prev;
    else s->tail = x->prev;
    x->prev = x->next = NULL;
}

static void push_front(kp_rstore *s, rentry *x) {
    x->next = s->head;
    if (s->head) s->head->prev = x;
    s->head = x;
    if (!s->tail) s->tail = x;
}

static void drop(kp_rstore *s, rentry *x) {
    unlink_entry(s, x);
    s->count--;
    s->bytes -= x->bytes;
    free(x->id);
    free(x->response);
    free(x->conv);
    free(x);
}

void kp_rstore_free(kp_rstore *s) {
    if (!s) return;
    while (s->head) drop(s, s->head);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static rentry *find(kp_rstore *s, const char *id) {
    for (rentry *x = s->head; x; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

bool kp_rstore_put(kp_rstore *s, const char *id, const json_t *response, const json_t *conv) {
    rentry *x = calloc(1, sizeof *x);
    if (!x) return false;
    x->id = strdup(id);
    x->response = json_dumps(response, JSON_COMPACT | JSON_PRESERVE_ORDER);
    x->conv = json_dumps(conv, JSON_COMPACT);
    if (!x->id || !x->response || !x->conv) {
        free(x->id);
        free(x->response);
        free(x->conv);
        free(x);
        return false;
    }
    x->bytes = strlen(x->id) + strlen(x->response) + strlen(x->conv);
    pthread_mutex_lock(&s->mu);
    bool fits = x->bytes <= s->max_bytes;
    if (fits) {
        rentry *old = find(s, id);
        if (old) drop(s, old);
        while (s->tail && (s->count + 1 > s->max_count || s->bytes + x->bytes > s->max_bytes)) drop(s, s->tail);
        push_front(s, x);
        s->count++;
        s->bytes += x->bytes;
    }
    pthread_mutex_unlock(&s->mu);
    if (!fits) {
        free(x->id);
        free(x->response);
        free(x->conv);
        free(x);
    }
    return fits;
}

bool kp_rstore_get(kp_rstore *s, const char *id, json_t **response, json_t **conv) {
    if (response) *response = NULL;
    if (conv) *conv = NULL;
    pthread_mutex_lock(&s->mu);
    rentry *x = find(s, id);
    if (x) {
        unlink_entry(s, x);
        push_front(s, x);
        if (response) *response = json_loads(x->response, JSON_PRESERVE_ORDER, NULL);
        if (conv) *conv = json_loads(x->conv, 0, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    return x != NULL;
}

bool kp_rstore_delete(kp_rstore *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    rentry *x = find(s, id);
    if (x) drop(s, x);
    pthread_mutex_unlock(&s->mu);
    return x != NULL;
}

void kp_rstore_stats(kp_rstore *s, uint32_t *count, size_t *bytes, uint32_t *max_count, size_t *max_bytes) {
    pthread_mutex_lock(&s->mu);
    *count = s->count;
    *bytes = s->bytes;
    *max_count = s->max_count;
    *max_bytes = s->max_bytes;
    pthread_mutex_unlock(&s->mu);
}
