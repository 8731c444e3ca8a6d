/*
 * oai.c - OpenAI request parsing and response objects (oai.h).
 *
 * Owns nothing between calls; a parsed request owns its jansson root and
 * the token array. Every field is looked at once, in a table-driven walk
 * over the body's members:
 *
 *   member --acted on?------> typed check (number range, integer, string, bool)
 *          \-policy field?--> n_predict, chat_template_kwargs, cache fields...
 *          \-OpenAI, not acted on?--> type check, named in r->ignored
 *          \-neutral-only?--> accepted if neutral, else 400 naming it
 *          \-otherwise------> named in r->ignored (strict: 400 "unknown field")
 *
 * then the members of messages, content parts, tool calls and tools the
 * same way (check_messages, check_tools), by path ("messages[0].foo").
 *
 * Numbers: JSON integers and reals are both accepted where a number is
 * meant; integers must be integral and within range (2^31 for counts).
 */
#include "serve/oai.h"

#include "base/unicode.h"
#include "tok/tok.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kp_oai_fail(kp_oai_error *e, int http, const char *type, const char *code, const char *param,
                 const char *fmt, ...) {
    e->http = http;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

void kp_oai_from_status(kp_status st, const kp_error *err, const char *param, kp_oai_error *e) {
    switch (st) {
    case KP_EFULL:
        kp_oai_fail(e, 503, "server_error", "overloaded", param, "%s", err->msg);
        break;
    case KP_ERANGE:
        kp_oai_fail(e, 400, "invalid_request_error", "context_length_exceeded", param, "%s", err->msg);
        break;
    case KP_EINVAL:
    case KP_EFORMAT:
    case KP_EUNSUPPORTED:
    case KP_ENOTFOUND:
        kp_oai_fail(e, 400, "invalid_request_error", NULL, param, "%s", err->msg);
        break;
    default:
        kp_oai_fail(e, 500, "server_error", NULL, param, "%s", err->msg[0] ? err->msg : "internal error");
    }
}


#define BAD(e, param, ...) kp_oai_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

json_t *kp_oai_parse_object(const char *body, size_t len, kp_oai_error *e) {
    if (len == 0) {
        BAD(e, "", "the request body is empty; send a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root) {
        BAD(e, "", "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        BAD(e, "", "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

bool kp_oai_only_fields(const json_t *obj, const char *const *allowed, kp_oai_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++) ok = !strcmp(k, allowed[i]);
        if (!ok) return BAD(e, k, "unknown field \"%s\"", k);
    }
    return true;
}

static bool get_number(const json_t *v, const char *name, double lo, double hi, double *out, kp_oai_error *e) {
    if (!json_is_number(v)) return BAD(e, name, "%s must be a number", name);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return BAD(e, name, "%s must be between %g and %g", name, lo, hi);
    *out = x;
    return true;
}

static bool get_count(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out, kp_oai_error *e) {
    double x;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < lo || i > hi)
            return BAD(e, name, "%s must be an integer between %lld and %lld", name, (long long)lo, (long long)hi);
        *out = i;
        return true;
    }
    if (!json_is_real(v)) return BAD(e, name, "%s must be an integer", name);
    x = json_real_value(v);
    if (x != floor(x)) return BAD(e, name, "%s must be an integer", name);
    if (x < (double)lo || x > (double)hi)
        return BAD(e, name, "%s must be an integer between %lld and %lld", name, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return true;
}

static bool get_bool(const json_t *v, const char *name, bool *out, kp_oai_error *e) {
    if (!json_is_boolean(v)) return BAD(e, name, "%s must be true or false", name);
    *out = json_is_true(v);
    return true;
}

static bool parse_prompt(const json_t *v, kp_oai_request *r, kp_oai_error *e) {
    if (json_is_string(v)) {
        r->prompt_text = json_string_value(v);
        r->prompt_len = json_string_length(v);
        return true;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD(e, "prompt", "prompt must be a string, an array of one string or a non-empty array of token ids");
    const json_t *first = json_array_get(v, 0);
    if (json_is_string(first)) {
        if (json_array_size(v) != 1)
            return BAD(e, "prompt", "several prompts in one request are not supported; send one request each");
        r->prompt_text = json_string_value(first);
        r->prompt_len = json_string_length(first);
        return true;
    }
    if (json_is_array(first))
        return BAD(e, "prompt", "several prompts in one request are not supported; send one request each");
    size_t n = json_array_size(v);
    if (n > (1u << 24)) return BAD(e, "prompt", "the prompt has too many tokens (%zu)", n);
    r->prompt_tokens = malloc(n * sizeof *r->prompt_tokens);
    if (!r->prompt_tokens) return kp_oai_fail(e, 500, "server_error", NULL, "prompt", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return BAD(e, "prompt", "prompt[%zu] must be a token id (a non-negative integer)", i);
        r->prompt_tokens[i] = (int32_t)json_integer_value(t);
    }
    r->n_prompt_tokens = (uint32_t)n;
    return true;
}

static bool parse_stop(const json_t *v, kp_oai_request *r, kp_oai_error *e) {
    if (json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return true;
        if (strlen(json_string_value(v)) != json_string_length(v))
            return BAD(e, "stop", "stop strings must not contain NUL characters");
        r->stops[r->n_stops++] = json_string_value(v);
        return true;
    }
    if (!json_is_array(v)) return BAD(e, "stop", "stop must be a string or an array of strings");
    if (json_array_size(v) > KP_OAI_MAX_STOPS)
        return BAD(e, "stop", "at most %d stop strings", KP_OAI_MAX_STOPS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) return BAD(e, "stop", "stop[%zu] must be a string", i);
        if (strlen(json_string_value(s)) != json_string_length(s))
            return BAD(e, "stop", "stop strings must not contain NUL characters");
        if (json_string_length(s) > 0) r->stops[r->n_stops++] = json_string_value(s);
    }
    return true;
}

/* Fields OpenAI defines that kvpin accepts at their neutral value only. */
static bool neutral(const char *k, const json_t *v, bool chat, kp_oai_error *e, bool *known) {
    *known = true;
    if (!chat && !strcmp(k, "top_logprobs")) { /* chat's top_logprobs is read above */
        if (json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 0)) return true;
        return BAD(e, k, "%s is not supported by kvpin", k);
    }
    *known = false;
    return true;
}

/* tool_choice: "auto" and null (the default), "none" (kp_oai_parse_opts
 * drops the tools), "required" (a call of one of the tools), or
 * {"type": "function", "function": {"name": N}} (a call of N): the last
 * two constrain the output to the template's call syntax (r->tool_force,
 * compiled by the server from the tools' schemas). */
static bool parse_tool_choice(const json_t *v, kp_oai_request *r, kp_oai_error *e) {
    const char *k = "tool_choice";
    if (json_is_null(v)) return true;
    if (json_is_string(v)) {
        const char *x = json_string_value(v);
        if (!strcmp(x, "auto") || !strcmp(x, "none")) return true;
        if (!strcmp(x, "required")) return r->tool_force = true;
        return BAD(e, k, "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}, not \"%.64s\"", x);
    }
    const json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    const json_t *fn = json_is_object(v) ? json_object_get(v, "function") : NULL;
    const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if (!json_is_string(t) || strcmp(json_string_value(t), "function"))
        return BAD(e, k, "tool_choice as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return BAD(e, k, "tool_choice.function.name must be a non-empty string");
    r->tool_force = true;
    r->tool_force_name = json_string_value(name);
    return true;
}

/* ---- the request policy ------------------------------------------------- */

#define OOM(e) kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory")

static bool listed(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return true;
    return false;
}

bool kp_oai_sort_fields(const json_t *obj, const char *const *known, const char *const *api, bool strict,
                        kp_buf *ignored, const char **unknown) {
    const char *k;
    json_t *v;
    *unknown = NULL;
    json_object_foreach((json_t *)obj, k, v) {
        if (listed(known, k)) continue;
        if (strict && !listed(api, k)) {
            *unknown = k;
            return false;
        }
        if (!json_is_null(v)) kp_oai_note_ignored(ignored, k);
    }
    return true;
}

bool kp_oai_sort_members(const json_t *obj, const char *where, const char *const *known, const char *const *api,
                         bool strict, kp_buf *ignored, kp_oai_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (listed(known, k)) continue;
        char path[192];
        snprintf(path, sizeof path, "%s.%.64s", where, k);
        if (strict && !(api && listed(api, k)))
            return kp_oai_fail(e, 400, "invalid_request_error", NULL, path, "%s: unknown field", path);
        if (!json_is_null(v)) kp_oai_note_ignored(ignored, path);
    }
    return true;
}

bool kp_oai_note_ignored(kp_buf *list, const char *name) {
    if (list->len >= 3 && !memcmp(list->data + list->len - 3, "...", 3)) return true; /* cut already */
    char clean[97];
    size_t n = 0;
    for (const unsigned char *u = (const unsigned char *)name; *u && n < 96; u++)
        clean[n++] = *u < 0x21 || *u > 0x7e || *u == ',' ? '?' : (char)*u;
    clean[n] = 0;
    if (list->len + 1 + n + 4 > 1024) return kp_buf_puts(list, list->len ? ",..." : "...");
    if (list->len && !kp_buf_putc(list, ',')) return false;
    return kp_buf_puts(list, clean);
}

static bool in_list(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return true;
    return false;
}

/* A field kvpin does not act on at path: named in r->ignored; an unknown
 * one (!known) is refused instead when strict. */
static bool other_field(kp_oai_request *r, bool strict, bool known, const char *path, kp_oai_error *e) {
    if (!known && strict) return BAD(e, path, "unknown field \"%s\"", path);
    return kp_oai_note_ignored(&r->ignored, path) || OOM(e);
}

/* The unknown members of obj (not in known[]) at "prefix.member". */
static bool unknown_members(kp_oai_request *r, bool strict, const json_t *obj, const char *const *known,
                            const char *prefix, kp_oai_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (in_list(k, known)) continue;
        char path[192];
        snprintf(path, sizeof path, "%s.%.96s", prefix, k);
        if (!other_field(r, strict, false, path, e)) return false;
    }
    return true;
}

/* Records a constraint from field k; one per request. */
static bool set_constraint(kp_oai_request *r, const char *k, int kind, kp_oai_error *e) {
    if (r->constraint)
        return BAD(e, k, "%s and %s both constrain the output; send one of them", r->constraint_param, k);
    r->constraint = kind;
    r->constraint_param = k;
    return true;
}

/* Checks that obj (a part of response_format called what) has only the
 * listed members. */
static bool rf_members(const json_t *obj, const char *const *allowed, const char *what, kp_oai_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++) ok = !strcmp(k, allowed[i]);
        if (!ok) return BAD(e, "response_format", "unknown field \"%s\" in %s", k, what);
    }
    return true;
}

enum { F_COMPL = 1, F_CHAT = 2, F_BOTH = 3 };
typedef enum { T_STRING, T_BOOL, T_INT, T_OBJECT, T_ARRAY, T_ANY } field_type;

/* OpenAI's fields that kvpin accepts (type-checked) without acting on them. */
static const struct {
    const char *name;
    int where;
    field_type type;
} NOT_ACTED[] = {
    {"user", F_BOTH, T_STRING},          {"metadata", F_BOTH, T_OBJECT},
    {"store", F_BOTH, T_BOOL},           {"logit_bias", F_BOTH, T_OBJECT},
    {"service_tier", F_BOTH, T_STRING},  {"safety_identifier", F_BOTH, T_STRING},
    {"echo", F_COMPL, T_BOOL},           {"best_of", F_COMPL, T_INT},
    {"suffix", F_COMPL, T_STRING},       {"reasoning_effort", F_CHAT, T_STRING},
    {"verbosity", F_CHAT, T_STRING},     {"modalities", F_CHAT, T_ARRAY},
    {"prediction", F_CHAT, T_OBJECT},    {"audio", F_CHAT, T_OBJECT},
    {"web_search_options", F_CHAT, T_OBJECT}, {"parallel_tool_calls", F_CHAT, T_BOOL},
    {"function_call", F_CHAT, T_ANY},    {"functions", F_CHAT, T_ARRAY},
};

/* Whether v asks for what kvpin does anyway (so the field is not named). */
static bool asks_nothing(const char *k, const json_t *v) {
    if (json_is_null(v)) return true;
    if (!strcmp(k, "echo") || !strcmp(k, "store")) return json_is_false(v);
    if (!strcmp(k, "parallel_tool_calls")) return json_is_true(v);
    if (!strcmp(k, "best_of")) return json_is_integer(v) && json_integer_value(v) == 1;
    if (!strcmp(k, "suffix")) return json_string_length(v) == 0;
    if (!strcmp(k, "logit_bias")) return json_object_size(v) == 0;
    if (!strcmp(k, "modalities"))
        return json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
               !strcmp(json_string_value(json_array_get(v, 0)), "text");
    return false;
}

static const char *const TYPE_WORD[] = {"a string", "true or false", "an integer", "an object", "an array", ""};

/* One of NOT_ACTED (*known true), checked and named. */
static bool not_acted(const char *k, const json_t *v, bool chat, kp_oai_request *r, kp_oai_error *e, bool *known) {
    *known = false;
    for (size_t i = 0; i < sizeof NOT_ACTED / sizeof NOT_ACTED[0]; i++) {
        if (strcmp(k, NOT_ACTED[i].name) || !(NOT_ACTED[i].where & (chat ? F_CHAT : F_COMPL))) continue;
        *known = true;
        field_type t = NOT_ACTED[i].type;
        bool ok = json_is_null(v) || t == T_ANY || (t == T_STRING && json_is_string(v)) ||
                  (t == T_BOOL && json_is_boolean(v)) || (t == T_INT && json_is_integer(v)) ||
                  (t == T_OBJECT && json_is_object(v)) || (t == T_ARRAY && json_is_array(v));
        if (!ok) return BAD(e, k, "%s must be %s", k, TYPE_WORD[t]);
        return asks_nothing(k, v) || other_field(r, false, true, k, e);
    }
    return true;
}

/* chat_template_kwargs: the template variables kvpin's renderings know
 * (add_generation_prompt, enable_thinking) are read here; the others are
 * named as ignored by the answer (answer.c), which knows whether the
 * server's template reads them. A free-form map by nature, so never
 * refused for its members. */
static bool template_kwargs(const json_t *v, kp_oai_request *r, kp_oai_error *e) {
    if (json_is_null(v)) return true;
    if (!json_is_object(v)) return BAD(e, "chat_template_kwargs", "chat_template_kwargs must be an object");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        char path[160];
        snprintf(path, sizeof path, "chat_template_kwargs.%.96s", k);
        if (!strcmp(k, "add_generation_prompt") && !json_is_null(x)) {
            if (!get_bool(x, path, &r->add_generation_prompt, e)) return false;
        } else if (!strcmp(k, "enable_thinking") && !json_is_null(x)) {
            if (!get_bool(x, path, &r->enable_thinking, e)) return false;
            r->enable_thinking_set = true;
        }
    }
    return true;
}

/* The fields of this section's own (llama.cpp's and OpenAI's cache fields)
 * that kvpin acts on; *known false when k is none of them. */
static bool policy_field(const char *k, const json_t *v, bool chat, kp_oai_request *r, int64_t *n_predict,
                         kp_oai_error *e, bool *known) {
    *known = true;
    if (json_is_null(v)) return true;
    if (!strcmp(k, "n_predict")) return get_count(v, k, -1, INT32_MAX, n_predict, e);
    if (chat && !strcmp(k, "add_generation_prompt")) return get_bool(v, k, &r->add_generation_prompt, e);
    if (chat && !strcmp(k, "chat_template_kwargs")) return template_kwargs(v, r, e);
    if (!strcmp(k, "return_progress")) return get_bool(v, k, &r->return_progress, e);
    if (!strcmp(k, "cache_prompt")) {
        bool on = true;
        if (!get_bool(v, k, &on, e)) return false;
        return on || other_field(r, false, true, k, e); /* cached equals recomputed: reuse is always on */
    }
    if (!strcmp(k, "prompt_cache_key")) {
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
            return BAD(e, k, "prompt_cache_key must be a string");
        if (json_string_length(v) > 256) return BAD(e, k, "prompt_cache_key is longer than 256 bytes");
        r->prompt_cache_key = json_string_value(v);
        return true;
    }
    if (!strcmp(k, "prompt_cache_retention")) {
        const char *x = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(x, "in_memory") && strcmp(x, "24h"))
            return BAD(e, k, "prompt_cache_retention must be \"in_memory\" or \"24h\"");
        r->retention = x;
        r->retain_24h = !strcmp(x, "24h");
        return true;
    }
    *known = false;
    return true;
}

static const char *const MSG_KNOWN[] = {"role", "content", "name", "tool_calls", "tool_call_id",
                                        "reasoning_content", NULL};
static const char *const MSG_NOT_ACTED[] = {"refusal", "audio", "function_call", NULL};
static const char *const PART_KNOWN[] = {"type", "text", NULL};
static const char *const CALL_KNOWN[] = {"id", "type", "function", "index", NULL};
static const char *const CALL_FN_KNOWN[] = {"name", "arguments", NULL};
static const char *const TOOL_KNOWN[] = {"type", "function", NULL};
static const char *const TOOL_FN_KNOWN[] = {"name", "description", "parameters", "strict", NULL};

/* The members of the messages that kvpin does not read, and the content
 * parts it cannot; the rest of the checking is the renderer's (chat.h). */
static bool check_messages(kp_oai_request *r, bool strict, kp_oai_error *e) {
    size_t i, j;
    json_t *m, *part, *call;
    char path[192];
    json_array_foreach((json_t *)r->messages, i, m) {
        if (!json_is_object(m)) continue;
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            if (in_list(k, MSG_KNOWN)) continue;
            bool na = in_list(k, MSG_NOT_ACTED);
            if (na && json_is_null(v)) continue;
            snprintf(path, sizeof path, "messages[%zu].%.96s", i, k);
            if (!other_field(r, strict, na, path, e)) return false;
        }
        const json_t *content = json_object_get(m, "content");
        json_array_foreach((json_t *)(json_is_array(content) ? content : NULL), j, part) {
            if (!json_is_object(part)) continue;
            const json_t *t = json_object_get(part, "type");
            snprintf(path, sizeof path, "messages[%zu].content[%zu].type", i, j);
            if (!json_is_string(t)) return BAD(e, path, "%s must be a string (\"text\")", path);
            if (strcmp(json_string_value(t), "text"))
                return BAD(e, path,
                           "%s: kvpin serves text models and cannot read \"%.64s\" parts; send the content as "
                           "a string or as {\"type\": \"text\", \"text\": ...} parts",
                           path, json_string_value(t));
            snprintf(path, sizeof path, "messages[%zu].content[%zu]", i, j);
            if (!unknown_members(r, strict, part, PART_KNOWN, path, e)) return false;
        }
        const json_t *calls = json_object_get(m, "tool_calls");
        json_array_foreach((json_t *)(json_is_array(calls) ? calls : NULL), j, call) {
            if (!json_is_object(call)) continue;
            snprintf(path, sizeof path, "messages[%zu].tool_calls[%zu]", i, j);
            if (!unknown_members(r, strict, call, CALL_KNOWN, path, e)) return false;
            const json_t *fn = json_object_get(call, "function");
            snprintf(path, sizeof path, "messages[%zu].tool_calls[%zu].function", i, j);
            if (json_is_object(fn) && !unknown_members(r, strict, fn, CALL_FN_KNOWN, path, e)) return false;
        }
    }
    return true;
}

/* Deletes the members of obj not in known[]. */
static void drop_unknown(json_t *obj, const char *const *known) {
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(obj, tmp, k, v) {
        if (!in_list(k, known)) json_object_del(obj, k);
    }
}

/* The unknown members of tool definitions: named (or refused when
 * strict) and left out of what the template renders (r->tools_own). */
static bool check_tools(kp_oai_request *r, bool strict, kp_oai_error *e) {
    size_t i;
    json_t *t;
    size_t before = r->ignored.len;
    json_array_foreach((json_t *)r->tools, i, t) {
        if (!json_is_object(t)) continue;
        char path[64];
        snprintf(path, sizeof path, "tools[%zu]", i);
        if (!unknown_members(r, strict, t, TOOL_KNOWN, path, e)) return false;
        const json_t *fn = json_object_get(t, "function");
        snprintf(path, sizeof path, "tools[%zu].function", i);
        if (json_is_object(fn) && !unknown_members(r, strict, fn, TOOL_FN_KNOWN, path, e)) return false;
    }
    if (r->ignored.len == before) return true;
    json_t *own = json_deep_copy(r->tools);
    if (!own) return OOM(e);
    json_array_foreach(own, i, t) {
        if (!json_is_object(t)) continue;
        drop_unknown(t, TOOL_KNOWN);
        json_t *fn = json_object_get(t, "function");
        if (json_is_object(fn)) drop_unknown(fn, TOOL_FN_KNOWN);
    }
    r->tools_own = own;
    r->tools = own;
    return true;
}

/* response_format: text, json_object (llama.cpp: with a schema), or
 * json_schema {name, description, schema, strict}. The schema itself is
 * checked when it is compiled (serve/gcache.h). */
static bool parse_response_format(const json_t *v, kp_oai_request *r, kp_oai_error *e) {
    const char *k = "response_format";
    if (json_is_null(v)) return true;
    const json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (!json_is_string(t))
        return BAD(e, k, "response_format must be an object with a type: \"text\", \"json_object\" or \"json_schema\"");
    const char *type = json_string_value(t);
    if (!strcmp(type, "text")) {
        static const char *const allowed[] = {"type", NULL};
        return rf_members(v, allowed, k, e);
    }
    if (!strcmp(type, "json_object")) {
        static const char *const allowed[] = {"type", "schema", NULL};
        if (!rf_members(v, allowed, k, e)) return false;
        const json_t *sc = json_object_get(v, "schema");
        if (!sc || json_is_null(sc)) return set_constraint(r, k, KP_GC_JSON_OBJECT, e);
        if (!json_is_object(sc) && !json_is_boolean(sc))
            return BAD(e, k, "response_format.schema must be a JSON Schema (an object or a boolean)");
        r->schema = sc;
        return set_constraint(r, k, KP_GC_SCHEMA, e);
    }
    if (!strcmp(type, "json_schema")) {
        static const char *const allowed[] = {"type", "json_schema", NULL};
        static const char *const inner[] = {"name", "description", "schema", "strict", NULL};
        if (!rf_members(v, allowed, k, e)) return false;
        const json_t *js = json_object_get(v, "json_schema");
        if (!json_is_object(js))
            return BAD(e, k, "response_format.json_schema must be an object with name and schema");
        if (!rf_members(js, inner, "response_format.json_schema", e)) return false;
        const json_t *name = json_object_get(js, "name"), *desc = json_object_get(js, "description"),
                     *strict = json_object_get(js, "strict"), *sc = json_object_get(js, "schema");
        if (name && !json_is_string(name)) return BAD(e, k, "response_format.json_schema.name must be a string");
        if (desc && !json_is_string(desc) && !json_is_null(desc))
            return BAD(e, k, "response_format.json_schema.description must be a string");
        if (strict && !json_is_boolean(strict) && !json_is_null(strict))
            return BAD(e, k, "response_format.json_schema.strict must be true or false");
        if (!sc || json_is_null(sc)) return set_constraint(r, k, KP_GC_JSON_OBJECT, e);
        if (!json_is_object(sc) && !json_is_boolean(sc))
            return BAD(e, k, "response_format.json_schema.schema must be a JSON Schema (an object or a boolean)");
        r->schema = sc;
        return set_constraint(r, k, KP_GC_SCHEMA, e);
    }
    return BAD(e, k, "response_format.type must be \"text\", \"json_object\" or \"json_schema\", not \"%s\"", type);
}

void kp_oai_request_free(kp_oai_request *r) {
    json_decref(r->root);
    json_decref(r->tools_own);
    kp_buf_free(&r->ignored);
    free(r->prompt_tokens);
    memset(r, 0, sizeof *r);
}

bool kp_oai_parse(const char *body, size_t len, bool chat, kp_oai_request *r, kp_oai_error *e) {
    return kp_oai_parse_opts(body, len, chat, false, r, e);
}

/* ---- the top-level fields: one table ---------------------------------------------- */

/* What the walk over a body's members carries besides the request. */
typedef struct {
    bool chat, strict;
    bool have_prompt, top_set;
    int64_t n_predict; /* -1: absent */
} walk;

typedef bool (*field_fn)(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e);

static bool f_model(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    r->model = json_string_value(v);
    return json_is_string(v) || json_is_null(v) || BAD(e, k, "model must be a string");
}

static bool f_prompt(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)k;
    w->have_prompt = true;
    return parse_prompt(v, r, e);
}

static bool f_messages(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    r->messages = v;
    return (json_is_array(v) && json_array_size(v) > 0) ||
           BAD(e, k, "messages must be a non-empty array of message objects");
}

static bool f_tools(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    if (!json_is_array(v)) return BAD(e, k, "tools must be an array of tool objects");
    if (json_array_size(v) > 0) r->tools = v;
    return true;
}

static bool f_max_tokens(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    int64_t i;
    if (!get_count(v, k, 0, INT32_MAX, &i, e)) return false;
    r->max_tokens = (uint32_t)i;
    r->max_tokens_set = true;
    return true;
}

static bool f_top_k(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    int64_t i;
    if (!get_count(v, k, 0, 1 << 30, &i, e)) return false;
    r->sp.top_k = (int32_t)i;
    return true;
}

static bool f_seed(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    int64_t i;
    if (!get_count(v, k, INT64_MIN, INT64_MAX, &i, e)) return false;
    r->sp.seed = (uint64_t)i;
    r->seed_set = true;
    return true;
}

static bool f_stop(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)k;
    (void)w;
    return parse_stop(v, r, e);
}

static bool f_stream(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    return get_bool(v, k, &r->stream, e);
}

static bool f_stream_options(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    if (!json_is_object(v)) return BAD(e, k, "stream_options must be an object");
    static const char *const known[] = {"include_usage", "include_obfuscation", NULL};
    const json_t *iu = json_object_get(v, "include_usage");
    const json_t *io = json_object_get(v, "include_obfuscation");
    bool obf = false;
    return unknown_members(r, w->strict, v, known, "stream_options", e) &&
           (!iu || json_is_null(iu) || get_bool(iu, "stream_options.include_usage", &r->include_usage, e)) &&
           (!io || json_is_null(io) || get_bool(io, "stream_options.include_obfuscation", &obf, e)) &&
           (!obf || other_field(r, false, true, "stream_options.include_obfuscation", e));
}

static bool f_n(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    int64_t i;
    if (!get_count(v, k, 1, KP_OAI_MAX_N, &i, e)) return false;
    r->n = (uint32_t)i;
    return true;
}

/* chat: true or false; completions: the legacy shape, how many top tokens */
static bool f_logprobs(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    if (json_is_false(v)) return true;
    int64_t i;
    if (w->chat) {
        r->logprobs = true;
        return json_is_true(v) || BAD(e, k, "logprobs must be true or false");
    }
    if (!get_count(v, k, 0, 5, &i, e)) return false;
    r->logprobs = true;
    r->top_logprobs = (uint32_t)i;
    return true;
}

static bool f_top_logprobs(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    int64_t i;
    if (!get_count(v, k, 0, KP_LOGPROBS_MAX, &i, e)) return false;
    r->top_logprobs = (uint32_t)i;
    w->top_set = true;
    return true;
}

static bool f_ignore_eos(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    return get_bool(v, k, &r->ignore_eos, e);
}

static bool f_parse_special(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    return get_bool(v, k, &r->parse_special, e);
}

static bool f_return_token_ids(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    return get_bool(v, k, &r->return_token_ids, e);
}

static bool f_tool_choice(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)k;
    (void)w;
    return parse_tool_choice(v, r, e);
}

static bool f_response_format(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)k;
    (void)w;
    return parse_response_format(v, r, e);
}

static bool f_grammar(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    if (json_is_string(v) && json_string_length(v) == 0) return true;
    if (!json_is_string(v)) return BAD(e, k, "grammar must be a string (llama.cpp's GBNF)");
    if (!set_constraint(r, k, KP_GC_GBNF, e)) return false;
    r->grammar = json_string_value(v);
    r->grammar_len = json_string_length(v);
    return true;
}

static bool f_json_schema(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    (void)w;
    if (!json_is_object(v) && !json_is_boolean(v))
        return BAD(e, k, "json_schema must be a JSON Schema (an object or a boolean)");
    if (!set_constraint(r, k, KP_GC_SCHEMA, e)) return false;
    r->schema = v;
    return true;
}

/* The sampling numbers: the range each takes and where it goes. */
static float *sp_temp(kp_oai_request *r) { return &r->sp.temp; }
static float *sp_top_p(kp_oai_request *r) { return &r->sp.top_p; }
static float *sp_min_p(kp_oai_request *r) { return &r->sp.min_p; }
static float *sp_presence(kp_oai_request *r) { return &r->sp.presence_penalty; }
static float *sp_frequency(kp_oai_request *r) { return &r->sp.frequency_penalty; }
static float *sp_repeat(kp_oai_request *r) { return &r->sp.repeat_penalty; }

enum { FOR_BOTH = 3, FOR_CHAT = 1, FOR_COMPLETIONS = 2 };

/* Every top-level field kvpin acts on, once: the endpoints it belongs to,
 * whether null means absent, and either a number's range and place, or
 * the function that checks and takes it. A member no entry names goes to
 * the request policy (policy_field, not_acted, neutral, other_field). */
static const struct {
    const char *name;
    unsigned char api;   /* FOR_* */
    bool null_is_absent; /* null (and for logprobs, false) means the field is absent */
    field_fn fn;         /* NULL: a number in [lo, hi] stored through num */
    double lo, hi;
    float *(*num)(kp_oai_request *r);
} FIELDS[] = {
    {"model", FOR_BOTH, false, f_model, 0, 0, NULL},
    {"prompt", FOR_COMPLETIONS, false, f_prompt, 0, 0, NULL},
    {"messages", FOR_CHAT, false, f_messages, 0, 0, NULL},
    {"tools", FOR_CHAT, true, f_tools, 0, 0, NULL},
    {"max_tokens", FOR_BOTH, true, f_max_tokens, 0, 0, NULL},
    {"max_completion_tokens", FOR_CHAT, true, f_max_tokens, 0, 0, NULL},
    {"temperature", FOR_BOTH, true, NULL, 0, 2, sp_temp},
    {"top_p", FOR_BOTH, true, NULL, 0, 1, sp_top_p},
    {"top_k", FOR_BOTH, true, f_top_k, 0, 0, NULL},
    {"min_p", FOR_BOTH, true, NULL, 0, 1, sp_min_p},
    {"presence_penalty", FOR_BOTH, true, NULL, -2, 2, sp_presence},
    {"frequency_penalty", FOR_BOTH, true, NULL, -2, 2, sp_frequency},
    {"repeat_penalty", FOR_BOTH, true, NULL, 0.01, 10, sp_repeat},
    {"seed", FOR_BOTH, true, f_seed, 0, 0, NULL},
    {"stop", FOR_BOTH, false, f_stop, 0, 0, NULL},
    {"stream", FOR_BOTH, true, f_stream, 0, 0, NULL},
    {"stream_options", FOR_BOTH, true, f_stream_options, 0, 0, NULL},
    {"n", FOR_BOTH, true, f_n, 0, 0, NULL},
    {"logprobs", FOR_BOTH, true, f_logprobs, 0, 0, NULL},
    {"top_logprobs", FOR_CHAT, true, f_top_logprobs, 0, 0, NULL},
    {"ignore_eos", FOR_BOTH, false, f_ignore_eos, 0, 0, NULL},
    {"parse_special", FOR_COMPLETIONS, true, f_parse_special, 0, 0, NULL},
    {"tool_choice", FOR_CHAT, false, f_tool_choice, 0, 0, NULL},
    {"response_format", FOR_BOTH, false, f_response_format, 0, 0, NULL},
    {"grammar", FOR_BOTH, true, f_grammar, 0, 0, NULL},
    {"json_schema", FOR_BOTH, true, f_json_schema, 0, 0, NULL},
    {"return_token_ids", FOR_BOTH, true, f_return_token_ids, 0, 0, NULL},
};

/* One member of the body: its table entry, or the request policy. */
static bool parse_member(const char *k, const json_t *v, kp_oai_request *r, walk *w, kp_oai_error *e) {
    unsigned api = w->chat ? FOR_CHAT : FOR_COMPLETIONS;
    for (size_t i = 0; i < sizeof FIELDS / sizeof *FIELDS; i++) {
        if (!(FIELDS[i].api & api) || strcmp(k, FIELDS[i].name)) continue;
        if (FIELDS[i].null_is_absent && json_is_null(v)) return true;
        if (FIELDS[i].fn) return FIELDS[i].fn(k, v, r, w, e);
        double x = 0;
        if (!get_number(v, k, FIELDS[i].lo, FIELDS[i].hi, &x, e)) return false;
        *FIELDS[i].num(r) = (float)x;
        return true;
    }
    bool known;
    bool ok = policy_field(k, v, w->chat, r, &w->n_predict, e, &known);
    if (ok && !known) ok = not_acted(k, v, w->chat, r, e, &known);
    if (ok && !known) ok = neutral(k, v, w->chat, e, &known);
    if (ok && !known) ok = other_field(r, w->strict, false, k, e);
    return ok;
}

/* What holds between fields, once every member was read. */
static bool check_whole(kp_oai_request *r, walk *w, kp_oai_error *e) {
    bool chat = w->chat;
    if (chat && !r->messages) return BAD(e, "messages", "messages is required");
    if (!chat && !w->have_prompt) return BAD(e, "prompt", "prompt is required");
    if (chat && w->top_set && !r->logprobs && r->top_logprobs > 0)
        return BAD(e, "top_logprobs", "top_logprobs needs logprobs: true");
    if (r->include_usage && !r->stream)
        return BAD(e, "stream_options", "stream_options is only allowed with stream: true");
    /* tool_choice "none": the model is not shown the tools (nor are its
     * replies read as calls); calls and results in the history still render */
    const json_t *choice = chat ? json_object_get(r->root, "tool_choice") : NULL;
    if (json_is_string(choice) && !strcmp(json_string_value(choice), "none")) r->tools = NULL;
    if (r->tool_force && !r->tools)
        return BAD(e, "tool_choice", "tool_choice asks for a tool call, but the request has no tools");
    if (r->tool_force && r->constraint)
        return BAD(e, "tool_choice", "tool_choice and %s both constrain the output; send one of them",
                   r->constraint_param);
    if (w->n_predict >= 0) { /* llama.cpp's name of max_tokens (-1: no limit) */
        if (r->max_tokens_set && r->max_tokens != (uint32_t)w->n_predict)
            return BAD(e, "n_predict", "n_predict (%lld) and max_tokens (%u) disagree; send one of them",
                       (long long)w->n_predict, r->max_tokens);
        r->max_tokens = (uint32_t)w->n_predict;
        r->max_tokens_set = true;
    }
    bool ok = (!r->return_progress || r->stream || other_field(r, false, true, "return_progress", e)) &&
              (!chat || check_messages(r, w->strict, e)) && (!r->tools || check_tools(r, w->strict, e));
    if (ok && r->ignored.oom) return OOM(e);
    return ok;
}

bool kp_oai_parse_opts(const char *body, size_t len, bool chat, bool strict, kp_oai_request *r, kp_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->add_generation_prompt = true;
    r->enable_thinking = true;
    r->n = 1;
    r->sp = kp_sampler_defaults();
    r->sp.temp = 1.0f; /* OpenAI's defaults: temperature 1, top_p 1, no top-k / min-p */
    r->sp.top_p = 1.0f;
    r->sp.top_k = 0;
    r->sp.min_p = 0.0f;
    r->root = kp_oai_parse_object(body, len, e);
    if (!r->root) return false;
    walk w = {chat, strict, false, false, -1};
    const char *k;
    json_t *v;
    bool ok = true;
    json_object_foreach(r->root, k, v) if (ok) ok = parse_member(k, v, r, &w, e);
    if (ok) ok = check_whole(r, &w, e);
    if (!ok) kp_oai_request_free(r);
    return ok;
}

/* A JSON string of s, with bytes that are not valid UTF-8 (say, from a
 * client's URL echoed in a message) replaced by '?'. */
static json_t *lossy_string(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (!c) return json_string("");
    for (size_t i = 0; i <= n; i++) c[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    j = json_string(c);
    free(c);
    return j ? j : json_string("");
}

bool kp_oai_sse_event(kp_buf *out, const char *name, json_t *head, json_t *data) {
    if (!head || !data) {
        json_decref(head);
        json_decref(data);
        return false;
    }
    json_object_update(head, data);
    json_decref(data);
    char *t = json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(head);
    if (!t) return false;
    kp_buf_printf(out, "event: %s\ndata: %s\n\n", name, t);
    free(t);
    return !out->oom;
}

json_t *kp_oai_string_repaired(const char *text, size_t len) {
    json_t *j = json_stringn(text ? text : "", text ? len : 0);
    if (j) return j;
    char *clean = malloc(len * 3 + 1); /* each byte at most one U+FFFD */
    size_t k = clean ? kp_unicode_utf8_repair((const uint8_t *)text, len, (uint8_t *)clean) : 0;
    j = clean ? json_stringn(clean, k) : NULL;
    free(clean);
    return j;
}

json_t *kp_oai_error_json(const kp_oai_error *e) {
    json_t *o = json_object();
    json_object_set_new(o, "message", lossy_string(e->message));
    json_object_set_new(o, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(o, "param", e->param[0] ? lossy_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code ? json_string(e->code) : json_null());
    return json_pack("{s:o}", "error", o);
}

json_t *kp_oai_usage_json(uint32_t prompt, uint32_t cached, uint32_t completion) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                     (json_int_t)completion, "total_tokens", (json_int_t)prompt + completion,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)cached);
}

/* The tiers' part of a cache report: "reused_from" {ram, disk, redis}
 * always; "restore" {cause "restored" | "restore_failed", reason, tier}
 * when a tier below RAM gave blocks or refused one. */
static void tier_report_json(json_t *o, const kp_eng_report *r) {
    uint32_t below = r->reused_from[KP_TIER_DISK] + r->reused_from[KP_TIER_REDIS];
    json_object_set_new(o, "reused_from",
                        json_pack("{s:I, s:I, s:I}", "ram", (json_int_t)(r->reused_tokens - below), "disk",
                                  (json_int_t)r->reused_from[KP_TIER_DISK], "redis",
                                  (json_int_t)r->reused_from[KP_TIER_REDIS]));
    if (!below && r->restore_failed == KP_BLOCKREC_OK) return;
    bool failed = r->restore_failed != KP_BLOCKREC_OK;
    json_object_set_new(o, "restore",
                        json_pack("{s:s, s:o, s:o}", "cause", failed ? "restore_failed" : "restored", "reason",
                                  failed ? json_string(kp_blockrec_reason_name(r->restore_failed)) : json_null(), "tier",
                                  failed ? json_string(kp_tier_name(r->restore_failed_tier)) : json_null()));
}

/* The cause a cache report gets over the doctor's (which explains the
 * index alone): rows from a request in flight, a tier below RAM that
 * refused a block, or tiers that gave blocks; NULL for none. det[cap]
 * (when cap) receives its detail. */
static const char *below_index_cause(const kp_eng_report *r, char *det, size_t cap) {
    uint32_t below = r->reused_from[KP_TIER_DISK] + r->reused_from[KP_TIER_REDIS];
    if (r->inflight_tokens > 0) {
        if (cap)
            snprintf(det, cap,
                     "shared_inflight: %u prompt tokens reused from a request computing them at the same time "
                     "(waited %.1f ms)",
                     r->inflight_tokens, r->inflight_wait_ms);
        return "shared_inflight";
    }
    if (r->restore_failed != KP_BLOCKREC_OK) {
        if (cap)
            snprintf(det, cap,
                     "restore_failed: the %s tier refused a block of this prompt (%s); %u prompt tokens were "
                     "restored before it (disk %u, redis %u), the rest computed",
                     kp_tier_name(r->restore_failed_tier), kp_blockrec_reason_name(r->restore_failed), below,
                     r->reused_from[KP_TIER_DISK], r->reused_from[KP_TIER_REDIS]);
        return "restore_failed";
    }
    if (below > 0) {
        if (cap)
            snprintf(det, cap,
                     "restored: %u prompt tokens not in RAM were read from the tiers below it (disk %u, redis %u) "
                     "and verified (fingerprint, tokens, checksum); %u computed",
                     below, r->reused_from[KP_TIER_DISK], r->reused_from[KP_TIER_REDIS], r->computed_tokens);
        return "restored";
    }
    return NULL;
}

const char *kp_oai_cache_cause(const kp_eng_report *r, const kp_doctor_report *d) {
    const char *c = below_index_cause(r, NULL, 0);
    return c ? c : d ? kp_doctor_cause_name(d->finding.cause) : NULL;
}

json_t *kp_oai_cache_json(const kp_eng_report *r, const kp_doctor_report *d) {
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:b}", "prompt_tokens", (json_int_t)r->prompt_tokens,
                          "reused_tokens", (json_int_t)r->reused_tokens, "computed_tokens",
                          (json_int_t)r->computed_tokens, "diverged_at_token", (json_int_t)r->diverged_at_token,
                          "evicted", r->evicted);
    if (!o) return o;
    tier_report_json(o, r);
    /* rows taken from another request's prefill in flight (the scheduler's crews) */
    json_object_set_new(o, "shared_inflight", json_boolean(r->inflight_tokens > 0));
    json_object_set_new(o, "inflight_reused_tokens", json_integer((json_int_t)r->inflight_tokens));
    json_object_set_new(o, "inflight_wait_ms", json_real(r->inflight_wait_ms));
    if (r->recurrent) /* a recurrent model resumes at a state snapshot (engine.h) */
        json_object_set_new(o, "state_recomputed_tokens", json_integer((json_int_t)r->state_recomputed_tokens));
    if (!d) return o;
    char advice[512] = "";
    if (d->finding.cause != KP_DOCTOR_CAUSE_HIT)
        kp_doctor_advice(d->finding.cause, d->finding.detail, d->finding.line, d->div.percent_recomputed,
                      "this request", advice, sizeof advice);
    json_object_set_new(o, "diverged_at_byte", json_integer((json_int_t)d->div.byte));
    json_object_set_new(o, "reused_bytes", json_integer((json_int_t)d->div.reused_bytes));
    char det[KP_DOCTOR_DETAIL_MAX];
    const char *below = below_index_cause(r, det, sizeof det);
    if (below) { /* the doctor's cause explains the index; it goes to index_cause */
        json_object_set_new(o, "cause", json_string(below));
        json_object_set_new(o, "detail", json_string(det));
        json_object_set_new(o, "index_cause", json_string(kp_doctor_cause_name(d->finding.cause)));
        advice[0] = 0;
    } else {
        json_object_set_new(o, "cause", json_string(kp_doctor_cause_name(d->finding.cause)));
        json_object_set_new(o, "detail", json_string(d->finding.detail));
    }
    json_object_set_new(o, "line", json_integer((json_int_t)d->finding.line));
    json_object_set_new(o, "percent_recomputed", json_real(d->div.percent_recomputed));
    /* the snippets are JSON-escaped already (KP_DOCTOR_ESCAPE_JSON): decode them back */
    const char *names[2] = {"cached_snippet", "request_snippet"};
    const char *snips[2] = {d->cached_snippet, d->request_snippet};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(snips[i]);
        char *q = malloc(n + 3);
        json_t *s = NULL;
        if (q) {
            q[0] = '"';
            memcpy(q + 1, snips[i], n);
            q[n + 1] = '"';
            q[n + 2] = 0;
            s = json_loads(q, JSON_DECODE_ANY, NULL);
            free(q);
        }
        json_object_set_new(o, names[i], s && json_is_string(s) ? s : json_string(""));
        if (s && !json_is_string(s)) json_decref(s);
    }
    json_object_set_new(o, "advice", advice[0] ? json_string(advice) : json_null());
    return o;
}

/* A JSON string of bytes[0..n) that may not be valid UTF-8 (a piece of a
 * character): the bytes that break it become U+FFFD. */
static json_t *piece_string(const char *b, size_t n) {
    json_t *j = json_stringn(b, n);
    if (j) return j;
    uint8_t *t = malloc(3 * n + 1);
    if (!t) return json_string("");
    size_t m = kp_unicode_utf8_repair((const uint8_t *)b, n, t);
    j = json_stringn((const char *)t, m);
    free(t);
    return j ? j : json_string("");
}

static json_t *bytes_json(const char *b, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

static const char *piece(const kp_tok_vocab *v, int32_t id, size_t *len) {
    const char *p = kp_tok_piece_view(v, id, false, len);
    if (!p) *len = 0;
    return p ? p : "";
}

bool kp_oai_logprobs_append(const kp_tok_vocab *v, bool chat, const kp_token_logprobs *lp, uint32_t n,
                            json_t *out, size_t *text_off) {
    json_t *content = chat ? json_object_get(out, "content") : NULL;
    json_t *tokens = json_object_get(out, "tokens"), *tlp = json_object_get(out, "token_logprobs"),
           *top = json_object_get(out, "top_logprobs"), *off = json_object_get(out, "text_offset");
    if (chat ? !content : !tokens || !tlp || !top || !off) return false;
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        const char *t = piece(v, lp[i].token, &len);
        if (chat) {
            json_t *tops = json_array();
            for (uint32_t k = 0; k < lp[i].n_top; k++) {
                size_t l2;
                const char *t2 = piece(v, lp[i].top_token[k], &l2);
                json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token", piece_string(t2, l2), "logprob",
                                                      (double)lp[i].top_logprob[k], "bytes", bytes_json(t2, l2)));
            }
            json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", piece_string(t, len), "logprob",
                                                     (double)lp[i].logprob, "bytes", bytes_json(t, len),
                                                     "top_logprobs", tops));
        } else {
            json_t *tops = json_object();
            for (uint32_t k = 0; k < lp[i].n_top; k++) {
                size_t l2;
                const char *t2 = piece(v, lp[i].top_token[k], &l2);
                json_t *key = piece_string(t2, l2);
                if (!json_object_get(tops, json_string_value(key))) /* two tokens of one text: the likelier */
                    json_object_set_new(tops, json_string_value(key), json_real((double)lp[i].top_logprob[k]));
                json_decref(key);
            }
            json_array_append_new(tokens, piece_string(t, len));
            json_array_append_new(tlp, json_real((double)lp[i].logprob));
            json_array_append_new(top, tops);
            json_array_append_new(off, json_integer((json_int_t)*text_off));
        }
        *text_off += len;
    }
    return true;
}

json_t *kp_oai_logprobs_new(bool chat) {
    if (chat) return json_pack("{s:[], s:n}", "content", "refusal");
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

const char *kp_oai_finish_name(kp_finish finish) {
    switch (finish) {
    case KP_FINISH_LENGTH: return "length";
    case KP_FINISH_STOP: return "stop";
    default: return NULL;
    }
}
