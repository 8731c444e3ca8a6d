/*
 * oai.h - the OpenAI request and response shapes, as JSON (floor 5).
 *
 * Parses the bodies of POST /v1/completions and /v1/chat/completions into
 * a plain struct, checking every field's type and range and naming the
 * field that is wrong (the `param` of an OpenAI error), and builds the
 * response objects and stream chunks. No HTTP here (server.c), no model
 * (the caller tokenizes and renders).
 *
 *   body JSON --kp_oai_parse--> kp_oai_request (prompt / messages, sampling,
 *                                 stops, stream, limits)
 *   text, usage, cache report --kp_oai_*--> json_t objects
 *
 * Fields: completions take prompt (a string, an array of one string, or an
 * array of token ids); chat takes messages (checked later by chat.h) and
 * tools. Both: model, max_tokens (chat also max_completion_tokens),
 * temperature [0,2], top_p [0,1], top_k >= 0, min_p [0,1], seed,
 * presence_penalty and frequency_penalty [-2,2], repeat_penalty (0,10],
 * stop (a string or up to 16 strings), stream, stream_options.include_usage,
 * n (1 only), user, ignore_eos, response_format ({"type": "text"},
 * {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
 * "description", "schema", "strict"}}; llama.cpp's {"type": "json_object",
 * "schema": S} too), grammar (llama.cpp's GBNF text) and json_schema
 * (llama.cpp's: a schema), at most one of them; parse_special (completions: control-token
 * texts such as "</s>" in the prompt become those tokens; off by default,
 * so text is text), return_token_ids (the prompt's and the
 * completion's token ids in the choice, so a client can resend a turn as
 * ids and reuse the cache to the last token). Fields OpenAI defines that kvpin does not
 * act on are accepted only at their neutral value (logprobs false/null,
 * echo false, best_of 1, logit_bias {} or null, tool_choice "auto"/"none"/
 * null, parallel_tool_calls, metadata,
 * store false); any other field is an error ("unknown field").
 */
#ifndef KP_OAI_H
#define KP_OAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/doctor.h"
#include "cache/engine.h"
#include "model/sampler.h"
#include "serve/gcache.h"
#include "serve/scheduler.h"
#include "base/status.h"

#define KP_OAI_MAX_STOPS 16

/* An error for the client: HTTP status, OpenAI type/code and the field. */
typedef struct {
    int http;          /* 400, 401, 404, ... */
    const char *type;  /* "invalid_request_error", "server_error", ... */
    const char *code;  /* NULL, or e.g. "context_length_exceeded" */
    char param[64];    /* the offending field, "" when none */
    char message[KP_ERROR_MSG_MAX];
} kp_oai_error;

/* Fills e (always returns false, for `return kp_oai_fail(...)` chains). */
bool kp_oai_fail(kp_oai_error *e, int http, const char *type, const char *code, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));

typedef struct {
    bool chat;
    json_t *root;             /* the parsed body (owned) */
    /* completions: the prompt as text, or as token ids */
    const char *prompt_text;  /* into root; NULL when tokens are given */
    size_t prompt_len;
    int32_t *prompt_tokens;   /* malloc'd, or NULL */
    uint32_t n_prompt_tokens;
    /* chat */
    const json_t *messages;   /* into root */
    const json_t *tools;      /* into root, NULL when absent/null/empty */
    /* generation */
    uint32_t max_tokens;
    bool max_tokens_set;
    kp_sampler_params sp;
    bool seed_set;
    const char *stops[KP_OAI_MAX_STOPS]; /* into root */
    int n_stops;
    bool stream, include_usage, ignore_eos, return_token_ids;
    bool parse_special;       /* completions: control-token texts in the prompt are tokens */
    const char *model;        /* into root, NULL when absent */
    /* constrained output (response_format, grammar, json_schema): 0 none,
     * else the kp_gc_kind to compile (serve/gcache.h) */
    int constraint;
    const json_t *schema;         /* into root: KP_GC_SCHEMA */
    const char *grammar;          /* into root: KP_GC_GBNF */
    size_t grammar_len;
    const char *constraint_param; /* the field it came from, for errors */
} kp_oai_request;

/* Parses body[0..len). On failure returns false with *e set (400 and the
 * field) and *r empty. kp_oai_request_free releases a parsed request. */
bool kp_oai_parse(const char *body, size_t len, bool chat, kp_oai_request *r, kp_oai_error *e);
void kp_oai_request_free(kp_oai_request *r);

/* Parses a JSON object body for the small endpoints (tokenize, probe, pin):
 * NULL with *e set when it is not a JSON object. */
json_t *kp_oai_parse_object(const char *body, size_t len, kp_oai_error *e);

/* Checks that obj has only the listed members (NULL-terminated list). */
bool kp_oai_only_fields(const json_t *obj, const char *const *allowed, kp_oai_error *e);

/* The error body {"error": {"message", "type", "param", "code"}}. */
json_t *kp_oai_error_json(const kp_oai_error *e);

/* The `kvpin_cache` object: the cache report of one request. d may be NULL
 * (no report). */
json_t *kp_oai_cache_json(const kp_eng_report *r, const kp_doctor_report *d);

/* The usage object with prompt_tokens_details.cached_tokens. */
json_t *kp_oai_usage_json(uint32_t prompt, uint32_t cached, uint32_t completion);

/* "stop", "length" for the scheduler's finish reasons. */
const char *kp_oai_finish_name(kp_finish finish);

#endif
