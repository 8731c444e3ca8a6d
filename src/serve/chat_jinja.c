/*
 * chat_jinja.c - a chat-completions request as a chat template's context
 * (the rules are in chat_jinja.h). Every value is copied: the request is
 * never modified, the context owns its members.
 */
#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "serve/chat_jinja.h"

/* content as one string: null -> "", parts -> texts joined by "\n". */
static json_t *flatten(const json_t *content) {
    if (!content || json_is_null(content)) return json_string("");
    if (!json_is_array(content)) return json_deep_copy(content);
    kp_buf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (i) kp_buf_putc(&b, '\n');
        if (json_is_string(text)) kp_buf_put(&b, json_string_value(text), json_string_length(text));
    }
    json_t *s = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
    kp_buf_free(&b);
    return s;
}

static kp_status norm_calls(json_t *msg, size_t mi, kp_error *err) {
    json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls || !json_is_array(calls) || json_array_size(calls) == 0) {
        json_object_del(msg, "tool_calls");
        return KP_OK;
    }
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_is_object(call) ? json_object_get(call, "function") : NULL;
        json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        if (!json_is_string(args)) continue;
        json_error_t je;
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args),
                                    JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!parsed)
            return kp_fail(err, KP_EINVAL, "messages[%zu].tool_calls[%zu].function.arguments is not JSON: %s", mi, i,
                           je.text);
        json_object_set_new(fn, "arguments", parsed);
    }
    return KP_OK;
}

kp_status kp_chatj_context(const json_t *request, const char *bos, const char *eos, json_t **ctx,
                           kp_error *err) {
    *ctx = NULL;
    if (!json_is_object(request)) return kp_fail(err, KP_EINVAL, "the request is not a JSON object");
    const json_t *msgs = json_object_get(request, "messages");
    if (!json_is_array(msgs)) return kp_fail(err, KP_EINVAL, "messages must be an array");
    json_t *c = json_object(), *out = json_array();
    if (!c || !out) { json_decref(c); json_decref(out); return kp_fail(err, KP_ENOMEM, "out of memory"); }
    json_object_set_new(c, "messages", out);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) { json_decref(c); return kp_fail(err, KP_EINVAL, "messages[%zu] is not an object", i); }
        json_t *copy = json_deep_copy(m);
        json_t *content = flatten(json_object_get(m, "content"));
        if (!copy || !content) { json_decref(copy); json_decref(content); json_decref(c); return kp_fail(err, KP_ENOMEM, "out of memory"); }
        json_object_set_new(copy, "content", content);
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc) && !json_object_get(m, "thinking")) /* the field gpt-oss's template reads */
            json_object_set_new(copy, "thinking", json_deep_copy(rc));
        json_array_append_new(out, copy);
        kp_status st = norm_calls(copy, i, err);
        if (st != KP_OK) { json_decref(c); return st; }
    }
    const json_t *tools = json_object_get(request, "tools");
    json_object_set_new(c, "tools", kp_chatj_has_tools(request) ? json_deep_copy(tools) : json_null());
    const json_t *agp = json_object_get(request, "add_generation_prompt");
    json_object_set_new(c, "add_generation_prompt", agp ? json_deep_copy(agp) : json_true());
    json_object_set_new(c, "bos_token", json_string(bos ? bos : ""));
    json_object_set_new(c, "eos_token", json_string(eos ? eos : ""));
    const json_t *kw = json_object_get(request, "chat_template_kwargs");
    if (kw && !json_is_object(kw) && !json_is_null(kw)) {
        json_decref(c);
        return kp_fail(err, KP_EINVAL, "chat_template_kwargs must be an object");
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)kw, k, v) /* the request's own members win */
        if (!json_object_get(c, k)) json_object_set_new(c, k, json_deep_copy(v));
    *ctx = c;
    return KP_OK;
}

int kp_chatj_has_tools(const json_t *request) {
    const json_t *tools = json_object_get(request, "tools");
    return json_is_array(tools) && json_array_size(tools) > 0;
}
