/*
 * prompt.h - the prompt of a request as token ids (floor 7).
 *
 * Every endpoint that takes a prompt (the generation dialects, the cache
 * probe and pin, count_tokens) turns it into token ids here, the same way:
 *
 *   "prompt": text        -> tokens (+ BOS when the model wants it)
 *   "prompt": token ids   -> checked against the vocabulary
 *   "messages" (+ tools)  -> the chat template -> tokens, the client's text
 *                            tokenized as plain text
 */
#ifndef KP_PROMPT_H
#define KP_PROMPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/http.h"
#include "serve/oai.h"
#include "serve/volatile.h"

/* How a chat prompt is rendered (kp_chat_opts beyond the tokens' texts). */
typedef struct {
    bool add_generation_prompt; /* chat: end with the assistant opener */
    bool disable_thinking;      /* qwen3's enable_thinking false */
    const json_t *template_kwargs; /* chat_template_kwargs, for a Jinja template (borrowed; NULL: none) */
    bool message_starts;        /* a generation: find where the messages start (kp_prompt's
                                   msg_starts), when the server wants them (--window-budget) */
} kp_prompt_opts;

/* A request's prompt as token ids. */
typedef struct {
    int32_t *ids; /* malloc'd */
    size_t n;
    char *text;   /* the rendered or given text (for the cache report), malloc'd; NULL for token ids */
    size_t text_len;
    kp_volatile_report dropped; /* what was left out of the system messages (volatile.h) */
    size_t rewrite_byte;  /* > 0: the rendering of the conversation up to its last answer
                             (that answer's own turn) is not a prefix of text: it differs
                             here (the template rewrites history; doctor.h's hints) */
    int rewrite_line[2];  /* with rewrite_byte: the template lines writing that byte in
                             text and in that earlier rendering (0: not known) */
    uint32_t *msg_starts; /* rendered messages, asked for (kp_prompt_opts.message_starts)
                             under a window budget: the token positions where messages
                             start (malloc'd, kp_prompt_free; NULL: none), resume points
                             for the engine (kp_eng_begin_msgs) */
    uint32_t n_msg_starts;
} kp_prompt;

/* The prompt of a request body: prompt (text or token ids) or messages
 * (+ tools) through the server's chat template, rendered as po says (NULL:
 * the generation prompt on, thinking on), after the volatile start of
 * their system texts was dropped (volatile.h). Only the template's markup
 * may produce control tokens: the client's text in a rendering is
 * tokenized as plain text, and so is a completions prompt unless
 * parse_special. On success *out holds it (kp_prompt_free). false with
 * *e: the client's 400 naming the field, or a 500; *out empty. */
bool kp_prompt_tokens(kp_server *s, const json_t *prompt, const json_t *messages, const json_t *tools,
                      bool parse_special, const kp_prompt_opts *po, kp_prompt *out, kp_oai_error *e);

/* Frees what p holds and zeroes it. */
void kp_prompt_free(kp_prompt *p);

/* false with *e (400 kv_budget_exceeded naming prompt_param when the
 * prompt alone is too long, else max_tokens) when a request of n prompt
 * tokens and max_tokens can never fit the KV budget (kp_sched_fit). */
bool kp_prompt_fits_budget(kp_server *s, uint32_t n, uint32_t max_tokens, bool max_tokens_set,
                           const char *prompt_param, kp_oai_error *e);

#endif
