/*
 * oai.h - the OpenAI request and response shapes, as JSON (floor 7).
 *
 * Parses the bodies of POST /v1/completions and /v1/chat/completions into
 * a plain struct, checking every field's type and range and naming the
 * field that is wrong (the `param` of an OpenAI error), and builds the
 * response objects and stream chunks. No HTTP here (http.c), no model
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
 * n (1..KP_OAI_MAX_N choices), logprobs (completions: an integer 0..5, the
 * top tokens listed; chat: true/false, with top_logprobs 0..20),
 * ignore_eos, parse_special (completions: control-token
 * texts such as "</s>" in the prompt become those tokens; off by default,
 * so text is text), return_token_ids (the prompt's and the
 * completion's token ids in the choice, so a client can resend a turn as
 * ids and reuse the cache to the last token), n_predict (llama.cpp's
 * max_tokens; -1: none), cache_prompt, return_progress, prompt_cache_key,
 * prompt_cache_retention; chat also add_generation_prompt and
 * chat_template_kwargs (add_generation_prompt, enable_thinking);
 * response_format ({"type": "text"}, {"type": "json_object"}, {"type":
 * "json_schema", "json_schema": {"name", "description", "schema",
 * "strict"}}; llama.cpp's {"type": "json_object", "schema": S} too),
 * grammar (llama.cpp's GBNF text) and json_schema (llama.cpp's: a schema),
 * at most one of them. Fields others will act on are accepted at their
 * neutral value only. tool_choice "auto", "none", "required" or a named
 * function (the last two force a call, tool_force). Other OpenAI
 * fields and unknown ones: the policy at kp_oai_parse_opts. tool_choice "none" leaves tools NULL: the tools are
 * not rendered.
 */
#ifndef KP_OAI_H
#define KP_OAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/doctor.h"
#include "engine/engine.h"
#include "model/sampler.h"
#include "serve/gcache.h"
#include "serve/scheduler.h"
#include "base/buf.h"
#include "base/status.h"
#include "tok/tok.h"

#define KP_OAI_MAX_STOPS 16
#define KP_OAI_MAX_N 16 /* choices per request at most (and at most the server's parallel sequences) */

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

/* The client's error for a library status st with its message err: the
 * queue full (KP_EFULL) a 503 "overloaded", KP_ERANGE a 400
 * context_length_exceeded, bad input a 400, the rest a 500; param names
 * the field (NULL: none). */
void kp_oai_from_status(kp_status st, const kp_error *err, const char *param, kp_oai_error *e);

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
    uint32_t n;               /* choices (1..KP_OAI_MAX_N) */
    bool logprobs;            /* report the generated tokens' log-probabilities */
    uint32_t top_logprobs;    /* ... with this many most likely tokens each */
    const char *model;        /* into root, NULL when absent */
    /* the request policy (kp_oai_parse_opts) */
    kp_buf ignored;           /* the fields kvpin accepted without acting on them, and the
                                 unknown ones: "a,b,messages[0].foo" (data NULL when none) */
    json_t *tools_own;        /* tools without their unknown members, when it had some (owned;
                                 tools then points here) */
    bool add_generation_prompt; /* chat: end with the assistant opener (default true) */
    bool enable_thinking_set, enable_thinking; /* chat_template_kwargs.enable_thinking */
    bool return_progress;     /* stream prompt_progress objects during the prefill */
    const char *prompt_cache_key; /* into root, NULL when absent */
    bool retain_24h;          /* prompt_cache_retention "24h" */
    const char *retention;    /* into root: "in_memory", "24h", or NULL when absent */
    /* constrained output (response_format, grammar, json_schema): 0 none,
     * else the kp_gc_kind to compile (serve/gcache.h) */
    int constraint;
    const json_t *schema;         /* into root: KP_GC_SCHEMA */
    const char *grammar;          /* into root: KP_GC_GBNF */
    size_t grammar_len;
    const char *constraint_param; /* the field it came from, for errors */
    /* tool_choice "required" or a named function: the output is a call */
    bool tool_force;
    const char *tool_force_name;  /* into root: the function named, NULL: any tool */
} kp_oai_request;

/* Parses body[0..len). On failure returns false with *e set (400 and the
 * field) and *r empty. kp_oai_request_free releases a parsed request.
 *
 * The policy. Fields kvpin acts on are checked strictly (type, range,
 * the value's meaning). Fields of the OpenAI API that kvpin does not act
 * on are checked for their type and accepted; so are unknown fields,
 * inside message objects, content parts, tool calls and tool definitions
 * too (the unknown members of a tool definition are left out of the
 * rendering). Both kinds are listed in r->ignored by path ("user",
 * "messages[0].foo", "tools[1].function.bar"), except where the value asks
 * for what kvpin does anyway (null, echo false, best_of 1, logit_bias {},
 * store false, modalities ["text"], cache_prompt true...). strict: an
 * unknown field is a 400 "unknown field" naming its path instead.
 * Content parts that are not text (image_url, input_audio, file...) are a
 * 400 naming the part's type field ("messages[1].content[0].type"). The
 * fields other parts of kvpin will act on (response_format, grammar,
 * tool_choice, n, logprobs, top_logprobs) are accepted at their neutral
 * values only. README.md has the table of every field. */
bool kp_oai_parse_opts(const char *body, size_t len, bool chat, bool strict, kp_oai_request *r, kp_oai_error *e);

/* kp_oai_parse_opts, not strict. */
bool kp_oai_parse(const char *body, size_t len, bool chat, kp_oai_request *r, kp_oai_error *e);
void kp_oai_request_free(kp_oai_request *r);

/* Adds name (a field's path) to a list of ignored fields (r->ignored):
 * comma-separated, each name cut at 96 bytes with bytes outside visible
 * ASCII (and ',') written as '?', the whole list at most 1024 bytes (then
 * it ends in "..."), so that it can go into an HTTP header and a log line
 * as it is. False when out of memory. */
bool kp_oai_note_ignored(kp_buf *list, const char *name);

/* The request policy of the agent APIs' bodies: every member of obj named
 * in known (NULL-terminated) is the caller's; any other is ignored and
 * noted in *ignored (unless null) when it is one the API documents (in
 * api) or when not strict; with strict, the first member in neither list
 * is returned in *unknown and the result is false. */
bool kp_oai_sort_fields(const json_t *obj, const char *const *known, const char *const *api, bool strict,
                        kp_buf *ignored, const char **unknown);

/* The same policy inside a body: the members of obj (at path where, e.g.
 * "messages[0].content[1]") not in known are noted as "where.member" in
 * *ignored (unless null), or with strict, when not in api either (may be
 * NULL), a 400 naming that path. */
bool kp_oai_sort_members(const json_t *obj, const char *where, const char *const *known, const char *const *api,
                         bool strict, kp_buf *ignored, kp_oai_error *e);

/* Parses a JSON object body for the small endpoints (tokenize, probe, pin):
 * NULL with *e set when it is not a JSON object. */
json_t *kp_oai_parse_object(const char *body, size_t len, kp_oai_error *e);

/* Checks that obj has only the listed members (NULL-terminated list). */
bool kp_oai_only_fields(const json_t *obj, const char *const *allowed, kp_oai_error *e);

/* The error body {"error": {"message", "type", "param", "code"}}. */
json_t *kp_oai_error_json(const kp_oai_error *e);

/* text[0..len) as a JSON string, each maximal invalid UTF-8 subpart (a
 * split character, a stray byte token) replaced by U+FFFD; NULL when out
 * of memory. */
json_t *kp_oai_string_repaired(const char *text, size_t len);

/* Appends one named SSE event, "event: NAME\ndata: JSON\n\n", to out: the
 * members of head (written first, in their order) then those of data, in
 * one compact JSON object. Takes both references (NULL: false, nothing
 * written). False when out of memory. */
bool kp_oai_sse_event(kp_buf *out, const char *name, json_t *head, json_t *data);

/* The `kvpin_cache` object: the cache report of one request. d may be NULL
 * (no report). shared_inflight, inflight_reused_tokens and inflight_wait_ms
 * say what it took from a request computing the same prompt at the same
 * time; when it took any, cause is "shared_inflight" (the doctor's cause of
 * the index's miss moves to index_cause). */
json_t *kp_oai_cache_json(const kp_eng_report *r, const kp_doctor_report *d);
/* kvpin_cache's "cause": shared_inflight (rows from a request in flight),
 * restore_failed (a tier below RAM refused a block), restored (blocks came
 * from a tier below RAM), else the doctor's cause of d (NULL without d). The
 * doctor's own cause then goes to "index_cause". */
const char *kp_oai_cache_cause(const kp_eng_report *r, const kp_doctor_report *d);

/* The usage object with prompt_tokens_details.cached_tokens. */
json_t *kp_oai_usage_json(uint32_t prompt, uint32_t cached, uint32_t completion);

/* An empty logprobs object of a choice: chat {"content": [], "refusal":
 * null}; completions (OpenAI's legacy shape) {"tokens": [],
 * "token_logprobs": [], "top_logprobs": [], "text_offset": []}. */
json_t *kp_oai_logprobs_new(bool chat);

/* Appends the entries of lp[0..n) (kp_sreq_update.lp) to out (made by
 * kp_oai_logprobs_new with the same chat): chat content[] items {token,
 * logprob, bytes, top_logprobs: [{token, logprob, bytes}]}; completions
 * one entry per token in each list, top_logprobs an object {token text:
 * logprob} (two top tokens of the same text: the likelier one), text_offset
 * the byte offset of the token's text in the choice's text. Token texts are
 * the pieces of v (kp_tok_piece_view): a piece that is part of a UTF-8
 * character has its broken bytes as U+FFFD in `token`, and its raw bytes in
 * `bytes`. *text_off: the offset of the next token, advanced by each
 * piece's length. false when out is not of that shape. */
bool kp_oai_logprobs_append(const kp_tok_vocab *v, bool chat, const kp_token_logprobs *lp, uint32_t n,
                            json_t *out, size_t *text_off);

/* "stop", "length" for the scheduler's finish reasons. */
const char *kp_oai_finish_name(kp_finish finish);

#endif
