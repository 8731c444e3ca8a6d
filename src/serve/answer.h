/*
 * answer.h - one generation request answered in an API's dialect (floor 7).
 *
 * Three APIs ask for generations: OpenAI's chat completions and
 * completions, Anthropic's Messages and OpenAI's Responses. Each of them
 * translates its body into the common request, a chat-completions (or
 * completions) body that kp_oai_parse_opts reads (oai.h: ids, sampling,
 * stops, grammar, cache key, retention, n, logprobs), and names its
 * dialect: a table of the functions that write its answer, as the kernels
 * have one table per instruction set. kp_answer_run does the rest, the
 * same for every API:
 *
 *   parse (oai.h) -> tokens (prompt.h) -> d->prompt -> context and KV
 *   budget -> grammar -> submit n choices -> wait for the first token
 *     stream:      200 text/event-stream at admission (the first byte does
 *                  not wait for the prompt to be computed): d->open, d->prefill
 *                  per slice of the prefill, then per update of choice i d->reasoning
 *                  (a reasoning model's thinking, reasoning.h) and d->text (text held
 *                  back while it may still be a marker or a tool call), at its end
 *                  d->calls and d->end, when every
 *                  choice ended d->close (or d->fail on an error)
 *     not stream:  wait for every choice's end, d->reply builds the body
 *
 * A dialect owns only its request (dreq: what its translation kept and
 * its stream's state) and its bytes; the common part (kp_answer) owns the
 * scheduler requests, each choice's text, logprobs and calls, the SSE
 * buffer, the log line, the cache key's bookkeeping. Who includes which:
 * the dialect files (openai.c, anthropic.c, responses.c) include this
 * header; only the routing table (routes.c) includes theirs.
 */
#ifndef KP_ANSWER_H
#define KP_ANSWER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "base/buf.h"
#include "serve/cachekeys.h"
#include "serve/http.h"
#include "serve/oai.h"
#include "serve/reasoning.h"
#include "serve/scheduler.h"
#include "serve/volatile.h"

typedef struct kp_answer kp_answer;

/* One choice of an answer (n > 1: choice i samples with seed + i). */
typedef struct {
    kp_buf text;        /* the whole text so far */
    size_t released;    /* streaming: text[0..released) was handed to d->text */
    json_t *lp;         /* not streaming, logprobs asked: the object being built (owned) */
    size_t lp_off;      /* text offset of the next token's logprob entry */
    kp_sreq_update last; /* the last update (usage, report, ids, finish); no text or logprobs */
    bool over;          /* it ended (stop or length); the three below hold */
    json_t *calls;      /* the tool calls read out of text (owned), or NULL */
    size_t content_from; /* text[content_from..content) is the content (before */
    size_t content;      /* the calls; after the reasoning) */
    size_t content_to;   /* the content ends here at the latest (reasoning.h; harmony's
                            closing markers are not content) */
    size_t reason_from, reason_to; /* text[reason_from..reason_to) is the reasoning
                                      (reasoning.h; equal: none) */
    size_t reason_released; /* streaming: reasoning handed to d->reasoning up to here */
    kp_reasoning_split split; /* the last split of text (reasoning.h), resumed by the next */
    bool split_any;           /* split holds one */
    const char *finish; /* the finish reason reported: "stop", "length", "tool_calls" */
    bool cap_end;       /* --max-tokens-cap ended it (reported as a stop: the turn is over) */
} kp_choice;

/* An API's dialect: how its answer is written. Every function but prompt,
 * progress and free is required. The stream functions append events to
 * a->out (the bytes the client gets next). */
typedef struct {
    const char *name;          /* "openai", "anthropic", "responses" */
    const char *id_prefix[2];  /* the answer's id: [completions, chat] */
    kp_error_shape errors;     /* its error bodies (NULL: OpenAI's) */
    /* after the prompt is tokenized, before the submit (NULL: nothing) */
    void (*prompt)(kp_answer *a, const int32_t *ids, size_t n);
    /* a stream's first events, at admission (u: that update: the prompt's
     * tokens and those the cache holds are known, none computed yet) */
    void (*open)(kp_answer *a, const kp_sreq_update *u);
    /* the stream is open and the prompt is being computed: u says how far
     * (u->prefill_done of u->prompt_tokens); a keep-alive event, or the
     * progress return_progress asked for (NULL: nothing) */
    void (*prefill)(kp_answer *a, const kp_sreq_update *u);
    /* text of choice i (text NULL: none, only logprobs), with the logprobs
     * of the tokens it brings (lp consumed; NULL: none) */
    void (*text)(kp_answer *a, uint32_t i, const char *text, size_t len, json_t *lp);
    /* reasoning text of choice i (reasoning.h), before its content; NULL:
     * the dialect has no place for it (then it is not shown) */
    void (*reasoning)(kp_answer *a, uint32_t i, const char *text, size_t len);
    /* the tool calls of choice i at its end (borrowed: a->ch[i].calls) */
    void (*calls)(kp_answer *a, uint32_t i, const json_t *calls);
    /* choice i ended (its text and calls were given) */
    void (*end)(kp_answer *a, uint32_t i);
    /* every choice ended: the stream's last events (a->report: the
     * kvpin_cache object, which it may take, setting it NULL) */
    void (*close)(kp_answer *a);
    /* the request failed after the stream began */
    void (*fail)(kp_answer *a, const kp_oai_error *e);
    /* not streaming, every choice ended: the whole body (a->report as above) */
    json_t *(*reply)(kp_answer *a);
    /* releases dreq */
    void (*free)(void *dreq);
} kp_dialect;

struct kp_answer {
    kp_server *s;
    struct MHD_Connection *conn; /* the client's (borrowed): polled while the grammar compiles */
    bool left;                   /* the compile stopped because the client left or the server stops */
    const kp_dialect *d;
    void *dreq; /* the dialect's request and stream state (owned: d->free) */
    bool chat, stream, include_usage, return_ids, progress;
    bool tools;    /* tools are rendered: replies are read for calls */
    json_t *tool_defs; /* the request's tools (a reference; NULL without tools): types the
                          values of calls written as parameters (toolsyn.h) */
    char *prompt_text; /* a chat prompt's rendering, kept for the answer memory (answers.h); NULL: not kept */
    size_t prompt_len;
    const kp_reasoning_markers *reason; /* replies are split into reasoning and content (NULL: not) */
    bool reason_open;                   /* the prompt opened the reasoning */
    bool harmony;                       /* the template renders OpenAI harmony: calls are read as
                                           its messages (harmony.h) */
    bool logprobs; /* logprobs asked */
    bool multi;    /* n > 1 or logprobs: the report counts the choices */
    uint32_t n, n_over, which;
    kp_sreq *rs[KP_OAI_MAX_N]; /* the scheduler's request of each choice */
    kp_choice ch[KP_OAI_MAX_N];
    char id[48];
    time_t created;
    uint64_t id_seed; /* tool call and item ids */
    char key[KP_CACHEKEYS_KEY_MAX + 1]; /* prompt_cache_key, "" none */
    const char *retention;          /* prompt_cache_retention, NULL none */
    json_t *report;                 /* at the end: kvpin_cache (owned until a dialect takes it) */
    kp_volatile_report dropped;     /* what was left out of the system messages (volatile.h) */
    bool capped;                    /* --max-tokens-cap lowered the request's max_tokens */
    /* the stream */
    bool opened, done;
    kp_buf out; /* SSE bytes not yet sent: out.data[off..out.len) */
    size_t off;
    const char *finish; /* the last finish reason given, for the log */
    bool prog_any, prog_over;
    uint32_t prog_sent;
    kp_reqlog log; /* the stream's log line, written when it ends */
};

/* Serves the generation of body[0..len) (a chat-completions body when
 * chat, else a completions body) in dialect d. dreq is d's request
 * (owned from here on: released with d->free, NULL allowed); ignored the
 * fields of the dialect's own body kvpin did not act on ("" none), joined
 * with the body's own in x-kvpin-ignored-fields. */
enum MHD_Result kp_answer_run(kp_server *s, struct MHD_Connection *c, kp_conn *cn, const kp_dialect *d, void *dreq,
                              bool chat, const char *body, size_t len, const char *ignored);

/* kp_answer_run of a dialect whose translation made a chat-completions
 * body (chat, and ignored, the fields it did not act on: both borrowed
 * from dreq, which is owned from here on as by kp_answer_run). */
enum MHD_Result kp_answer_run_chat(kp_server *s, struct MHD_Connection *c, kp_conn *cn, const kp_dialect *d,
                                   void *dreq, const json_t *chat, const kp_buf *ignored);

/* A generation's kvpin_cache object: the report of its prompt's prefill,
 * the times it was preempted, and a note when the KV budget cut it short. */
json_t *kp_answer_report_json(const kp_sreq_update *u);

/* The usage over the choices: the prompt once, the completions summed. */
void kp_answer_usage(const kp_answer *a, uint32_t *prompt, uint32_t *cached, uint32_t *completion);

/* Appends `data: <j>\n\n` to the stream (j consumed). */
void kp_answer_event(kp_answer *a, json_t *j);

#endif
