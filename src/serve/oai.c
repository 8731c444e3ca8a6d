/*
 * oai.c - OpenAI request parsing and response objects (oai.h).
 *
 * Owns nothing between calls; a parsed request owns its jansson root and
 * the token array. Every field is looked at once, in a table-driven walk
 * over the body's members:
 *
 *   member --known?--> typed check (number range, integer, string, bool)
 *          \-neutral-only?--> accepted if neutral, else 400 naming it
 *          \-otherwise------> 400 "unknown field"
 *
 * Numbers: JSON integers and reals are both accepted where a number is
 * meant; integers must be integral and within range (2^31 for counts).
 */
#include "serve/oai.h"

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

#define BAD(e, param, ...) kp_oai_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

json_t *kp_oai_parse_object(const char *body, size_t len, kp_oai_error *e) {
    if (len == 0) {
        BAD(e, "", "the request body is empty; send a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
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
    if (!strcmp(k, "logprobs") || !strcmp(k, "echo") || !strcmp(k, "store")) {
        if (json_is_null(v) || json_is_false(v)) return true;
        if (!strcmp(k, "logprobs") && json_is_integer(v) && json_integer_value(v) == 0) return true;
        return BAD(e, k, "%s is not supported by kvpin", k);
    }
    if (!strcmp(k, "top_logprobs") || !strcmp(k, "best_of") || !strcmp(k, "suffix")) {
        if (json_is_null(v) || (!strcmp(k, "best_of") && json_is_integer(v) && json_integer_value(v) == 1) ||
            (!strcmp(k, "top_logprobs") && json_is_integer(v) && json_integer_value(v) == 0))
            return true;
        return BAD(e, k, "%s is not supported by kvpin", k);
    }
    if (!strcmp(k, "logit_bias")) {
        if (json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0)) return true;
        return BAD(e, k, "logit_bias is not supported by kvpin");
    }
    if (!strcmp(k, "metadata")) {
        if (json_is_null(v) || json_is_object(v)) return true;
        return BAD(e, k, "metadata must be an object");
    }
    if (!strcmp(k, "user")) {
        if (json_is_null(v) || json_is_string(v)) return true;
        return BAD(e, k, "user must be a string");
    }
    if (chat && !strcmp(k, "tool_choice")) {
        if (json_is_null(v) || (json_is_string(v) && (!strcmp(json_string_value(v), "auto") ||
                                                      !strcmp(json_string_value(v), "none"))))
            return true;
        return BAD(e, k, "tool_choice must be \"auto\" or \"none\" (forcing a tool is not supported)");
    }
    if (chat && !strcmp(k, "parallel_tool_calls")) {
        if (json_is_null(v) || json_is_boolean(v)) return true;
        return BAD(e, k, "parallel_tool_calls must be true or false");
    }
    *known = false;
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
    free(r->prompt_tokens);
    memset(r, 0, sizeof *r);
}

bool kp_oai_parse(const char *body, size_t len, bool chat, kp_oai_request *r, kp_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->sp = kp_sampler_defaults();
    r->sp.temp = 1.0f; /* OpenAI's defaults: temperature 1, top_p 1, no top-k / min-p */
    r->sp.top_p = 1.0f;
    r->sp.top_k = 0;
    r->sp.min_p = 0.0f;
    r->root = kp_oai_parse_object(body, len, e);
    if (!r->root) return false;
    bool have_prompt = false;
    const char *k;
    json_t *v;
    json_object_foreach(r->root, k, v) {
        double x;
        int64_t i;
        bool ok = true, known;
        if (!strcmp(k, "model")) {
            if (!json_is_string(v) && !json_is_null(v)) ok = BAD(e, k, "model must be a string");
            r->model = json_string_value(v);
        } else if (!chat && !strcmp(k, "prompt")) {
            ok = parse_prompt(v, r, e);
            have_prompt = true;
        } else if (chat && !strcmp(k, "messages")) {
            if (!json_is_array(v) || json_array_size(v) == 0)
                ok = BAD(e, k, "messages must be a non-empty array of message objects");
            r->messages = v;
        } else if (chat && !strcmp(k, "tools")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v)) ok = BAD(e, k, "tools must be an array of tool objects");
            else if (json_array_size(v) > 0) r->tools = v;
        } else if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
            if (json_is_null(v)) continue;
            if ((ok = get_count(v, k, 0, INT32_MAX, &i, e))) {
                r->max_tokens = (uint32_t)i;
                r->max_tokens_set = true;
            }
        } else if (!strcmp(k, "temperature")) {
            if (json_is_null(v)) continue;
            if ((ok = get_number(v, k, 0, 2, &x, e))) r->sp.temp = (float)x;
        } else if (!strcmp(k, "top_p")) {
            if (json_is_null(v)) continue;
            if ((ok = get_number(v, k, 0, 1, &x, e))) r->sp.top_p = (float)x;
        } else if (!strcmp(k, "top_k")) {
            if (json_is_null(v)) continue;
            if ((ok = get_count(v, k, 0, 1 << 30, &i, e))) r->sp.top_k = (int32_t)i;
        } else if (!strcmp(k, "min_p")) {
            if (json_is_null(v)) continue;
            if ((ok = get_number(v, k, 0, 1, &x, e))) r->sp.min_p = (float)x;
        } else if (!strcmp(k, "presence_penalty")) {
            if (json_is_null(v)) continue;
            if ((ok = get_number(v, k, -2, 2, &x, e))) r->sp.presence_penalty = (float)x;
        } else if (!strcmp(k, "frequency_penalty")) {
            if (json_is_null(v)) continue;
            if ((ok = get_number(v, k, -2, 2, &x, e))) r->sp.frequency_penalty = (float)x;
        } else if (!strcmp(k, "repeat_penalty")) {
            if (json_is_null(v)) continue;
            if ((ok = get_number(v, k, 0.01, 10, &x, e))) r->sp.repeat_penalty = (float)x;
        } else if (!strcmp(k, "seed")) {
            if (json_is_null(v)) continue;
            if ((ok = get_count(v, k, INT64_MIN, INT64_MAX, &i, e))) {
                r->sp.seed = (uint64_t)i;
                r->seed_set = true;
            }
        } else if (!strcmp(k, "stop")) {
            ok = parse_stop(v, r, e);
        } else if (!strcmp(k, "stream")) {
            if (json_is_null(v)) continue;
            ok = get_bool(v, k, &r->stream, e);
        } else if (!strcmp(k, "stream_options")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) {
                ok = BAD(e, k, "stream_options must be an object");
            } else {
                static const char *const allowed[] = {"include_usage", NULL};
                const json_t *iu = json_object_get(v, "include_usage");
                ok = kp_oai_only_fields(v, allowed, e) &&
                     (!iu || json_is_null(iu) || get_bool(iu, "stream_options.include_usage", &r->include_usage, e));
            }
        } else if (!strcmp(k, "n")) {
            if (json_is_null(v)) continue;
            if ((ok = get_count(v, k, 1, 1 << 20, &i, e)) && i != 1)
                ok = BAD(e, k, "n must be 1: kvpin returns one choice per request");
        } else if (!strcmp(k, "ignore_eos")) {
            ok = get_bool(v, k, &r->ignore_eos, e);
        } else if (!chat && !strcmp(k, "parse_special")) {
            ok = json_is_null(v) || get_bool(v, k, &r->parse_special, e);
        } else if (!strcmp(k, "response_format")) {
            ok = parse_response_format(v, r, e);
        } else if (!strcmp(k, "grammar")) {
            if (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) continue;
            if (!json_is_string(v)) {
                ok = BAD(e, k, "grammar must be a string (llama.cpp's GBNF)");
            } else if ((ok = set_constraint(r, k, KP_GC_GBNF, e))) {
                r->grammar = json_string_value(v);
                r->grammar_len = json_string_length(v);
            }
        } else if (!strcmp(k, "json_schema")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v) && !json_is_boolean(v))
                ok = BAD(e, k, "json_schema must be a JSON Schema (an object or a boolean)");
            else if ((ok = set_constraint(r, k, KP_GC_SCHEMA, e)))
                r->schema = v;
        } else if (!strcmp(k, "return_token_ids")) {
            ok = json_is_null(v) || get_bool(v, k, &r->return_token_ids, e);
        } else {
            ok = neutral(k, v, chat, e, &known);
            if (ok && !known) ok = BAD(e, k, "unknown field \"%s\"", k);
        }
        if (!ok) {
            kp_oai_request_free(r);
            return false;
        }
    }
    if (chat && !r->messages) {
        kp_oai_request_free(r);
        return BAD(e, "messages", "messages is required");
    }
    if (!chat && !have_prompt) {
        kp_oai_request_free(r);
        return BAD(e, "prompt", "prompt is required");
    }
    if (r->include_usage && !r->stream) {
        kp_oai_request_free(r);
        return BAD(e, "stream_options", "stream_options is only allowed with stream: true");
    }
    return true;
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

json_t *kp_oai_cache_json(const kp_eng_report *r, const kp_doctor_report *d) {
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:b}", "prompt_tokens", (json_int_t)r->prompt_tokens,
                          "reused_tokens", (json_int_t)r->reused_tokens, "computed_tokens",
                          (json_int_t)r->computed_tokens, "diverged_at_token", (json_int_t)r->diverged_at_token,
                          "evicted", r->evicted);
    if (!o || !d) return o;
    char advice[512] = "";
    if (d->finding.cause != KP_DOCTOR_CAUSE_HIT)
        kp_doctor_advice(d->finding.cause, d->finding.detail, d->finding.line, d->div.percent_recomputed,
                      "this request", advice, sizeof advice);
    json_object_set_new(o, "diverged_at_byte", json_integer((json_int_t)d->div.byte));
    json_object_set_new(o, "reused_bytes", json_integer((json_int_t)d->div.reused_bytes));
    json_object_set_new(o, "cause", json_string(kp_doctor_cause_name(d->finding.cause)));
    json_object_set_new(o, "detail", json_string(d->finding.detail));
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

const char *kp_oai_finish_name(kp_finish finish) {
    switch (finish) {
    case KP_FINISH_LENGTH: return "length";
    case KP_FINISH_STOP: return "stop";
    default: return NULL;
    }
}
