/*
 * llama.c - llama-server's native API (llama.h): POST /completion (and
 * /completions), GET /props and GET /slots, in the shapes llama.cpp's
 * server gives them, so that tools written for it work unchanged.
 *
 * Owns the dialect's request state (dreq): the times of the stream and
 * the prompt as sent. A /completion body is translated into a completions
 * body and served by the common answer path (answer.h):
 *
 *   prompt        a string or token ids, as given
 *   n_predict     max_tokens; absent or -1: until the end of the context
 *                 (llama-server's default), which kvpin reads as the
 *                 sequence's room (max_tokens = the context)
 *   n_probs       logprobs (the top N of each token)
 *   return_tokens return_token_ids
 *   everything else as the completions parser reads it (oai.h: the
 *   sampling fields llama.cpp and OpenAI share, grammar, json_schema,
 *   cache_prompt, stop, seed, ignore_eos...); fields kvpin does not act
 *   on (id_slot, samplers, mirostat, typical_p...) are accepted and named
 *   in x-kvpin-ignored-fields, or refused with --strict-api.
 *
 * The answer: {index, content, tokens, id_slot, stop: true, model,
 * tokens_predicted, tokens_evaluated, generation_settings, prompt,
 * has_new_line, truncated, stop_type ("eos", "word", "limit"),
 * stopping_word, tokens_cached, timings {prompt_n, prompt_ms,
 * prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms,
 * predicted_per_token_ms, predicted_per_second, cache_n}} and kvpin_cache.
 * Streamed: one event per piece of text {index, content, tokens, stop:
 * false, id_slot, tokens_predicted, tokens_evaluated}, then the whole
 * final object with content "", as llama-server streams (no [DONE]).
 * n > 1 is not part of this API (llama-server has one choice).
 */
#include "serve/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/answer.h"
#include "serve/chat_tmpl.h"
#include "tok/tok.h"

typedef struct {
    double start, first; /* kp_now_s: the request, its first generated piece (0: none yet) */
    char *prompt;        /* the prompt as a string, or NULL */
    size_t prompt_len;
    bool return_tokens;
    uint32_t sent_tokens; /* streaming: completion tokens reported so far */
    json_t *settings;     /* generation_settings: the request's sampling fields over the defaults */
} lreq;

static void lreq_free(void *p) {
    lreq *r = p;
    if (!r) return;
    free(r->prompt);
    json_decref(r->settings);
    free(r);
}

/* The ids a piece brought (streaming: the completion tokens not reported yet). */
static json_t *new_tokens(kp_answer *a, const kp_choice *ch) {
    lreq *r = a->dreq;
    json_t *t = json_array();
    const kp_sreq_update *u = &ch->last;
    uint32_t done = u->completion_tokens;
    if (u->ids) /* a stream carries its tokens, as llama-server's does */
        for (uint32_t k = r->sent_tokens; k < done; k++) json_array_append_new(t, json_integer(u->ids[u->prompt_tokens + k]));
    r->sent_tokens = done;
    return t;
}

static void ll_text(kp_answer *a, uint32_t i, const char *text, size_t len, json_t *lp) {
    lreq *r = a->dreq;
    const kp_choice *ch = &a->ch[i];
    if (!r->first) r->first = kp_now_s();
    json_t *j = json_pack("{s:i, s:s%, s:o, s:b, s:i, s:I, s:I}", "index", (int)i, "content", text ? text : "",
                          text ? len : 0, "tokens", new_tokens(a, ch), "stop", 0, "id_slot", 0, "tokens_predicted",
                          (json_int_t)ch->last.completion_tokens, "tokens_evaluated",
                          (json_int_t)ch->last.prompt_tokens);
    if (lp) json_object_set_new(j, "completion_probabilities", lp);
    kp_answer_event(a, j);
}

/* llama-server's stop_type: the end token, a stop string, or the limit. */
static const char *stop_type(const kp_answer *a, const kp_choice *ch) {
    const kp_sreq_update *u = &ch->last;
    if (u->finish == KP_FINISH_LENGTH) return "limit";
    uint32_t n = u->prompt_tokens + u->completion_tokens;
    if (u->ids && n && kp_tok_is_eog(a->s->v, u->ids[n - 1])) return "eos";
    return u->finish == KP_FINISH_STOP ? "word" : "none";
}

static json_t *timings(const kp_answer *a, const kp_choice *ch) {
    const lreq *r = a->dreq;
    const kp_sreq_update *u = &ch->last;
    double end = kp_now_s(), prompt_ms = u->ttft_ms > u->queue_ms ? u->ttft_ms - u->queue_ms : u->ttft_ms;
    double first = r->first ? r->first : r->start + u->ttft_ms / 1000.0, pred_ms = (end - first) * 1000.0;
    if (pred_ms < 0) pred_ms = 0;
    uint32_t pn = u->prompt_tokens - u->cached_tokens, gn = u->completion_tokens;
    return json_pack("{s:I, s:I, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "cache_n", (json_int_t)u->cached_tokens,
                     "prompt_n", (json_int_t)pn, "prompt_ms", prompt_ms, "prompt_per_token_ms",
                     pn ? prompt_ms / pn : 0.0, "prompt_per_second", prompt_ms > 0 ? pn * 1000.0 / prompt_ms : 0.0,
                     "predicted_n", (json_int_t)gn, "predicted_ms", pred_ms, "predicted_per_token_ms",
                     gn ? pred_ms / gn : 0.0, "predicted_per_second", pred_ms > 0 ? gn * 1000.0 / pred_ms : 0.0);
}

/* The final object (content: the whole text, or "" at a stream's end). */
static json_t *final_json(kp_answer *a, uint32_t i, bool whole) {
    lreq *r = a->dreq;
    kp_choice *ch = &a->ch[i];
    const char *text = ch->text.data ? ch->text.data : "";
    const kp_sreq_update *u = &ch->last;
    json_t *toks = json_array();
    if (r->return_tokens && u->ids && whole)
        for (uint32_t k = 0; k < u->completion_tokens; k++)
            json_array_append_new(toks, json_integer(u->ids[u->prompt_tokens + k]));
    const char *st = stop_type(a, ch);
    json_t *settings = json_deep_copy(r->settings);
    json_object_set_new(settings, "n_ctx", json_integer(a->s->ctx));
    json_t *j = json_pack("{s:i, s:s%, s:o, s:i, s:b, s:s, s:I, s:I, s:o, s:s%, s:b, s:b, s:s, s:s, s:I, s:o}",
                          "index", (int)i, "content", whole ? text : "", whole ? ch->text.len : 0, "tokens", toks,
                          "id_slot", 0, "stop", 1, "model", a->s->cfg.model_name, "tokens_predicted",
                          (json_int_t)u->completion_tokens, "tokens_evaluated", (json_int_t)u->prompt_tokens,
                          "generation_settings", settings, "prompt", r->prompt ? r->prompt : "",
                          r->prompt ? r->prompt_len : 0, "has_new_line",
                          memchr(text, '\n', ch->text.len) != NULL, "truncated", 0, "stop_type", st,
                          "stopping_word", "", "tokens_cached",
                          (json_int_t)(u->prompt_tokens + u->completion_tokens), "timings", timings(a, ch));
    if (whole && ch->lp) {
        json_object_set_new(j, "completion_probabilities", ch->lp);
        ch->lp = NULL;
    }
    return j;
}

static void ll_open(kp_answer *a, const kp_sreq_update *u) { (void)a, (void)u; }

static void ll_calls(kp_answer *a, uint32_t i, const json_t *calls) { (void)a, (void)i, (void)calls; }

static void ll_end(kp_answer *a, uint32_t i) { kp_answer_event(a, final_json(a, i, false)); }

static void ll_close(kp_answer *a) { (void)a; }

static void ll_fail(kp_answer *a, const kp_oai_error *e) { kp_answer_event(a, kp_oai_error_json(e)); }

static json_t *ll_reply(kp_answer *a) {
    json_t *j = final_json(a, 0, true);
    json_object_set_new(j, "kvpin_cache", a->report ? a->report : json_null());
    a->report = NULL;
    return j;
}

/* The sampling defaults a request gets when it sends none (oai.h). */
static json_t *default_params(void) {
    return json_pack("{s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:I, s:b, s:b, s:[], s:I}", "temperature", 1.0, "top_p", 1.0,
                     "top_k", 0, "min_p", 0.0, "presence_penalty", 0.0, "frequency_penalty", 0.0, "repeat_penalty",
                     1.0, "n_predict", (json_int_t)-1, "stream", 0, "ignore_eos", 0, "stop", "n_probs",
                     (json_int_t)0);
}

/* generation_settings of a request: the defaults, with what it set. */
static json_t *settings_of(const json_t *body) {
    json_t *g = default_params();
    const char *k;
    json_t *v, *d;
    json_object_foreach(g, k, d) {
        v = json_object_get(body, k);
        if (v && !json_is_null(v) && json_typeof(v) == json_typeof(d)) json_object_set(g, k, v);
        else if (v && json_is_number(v) && json_is_number(d)) json_object_set(g, k, v);
    }
    const json_t *seed = json_object_get(body, "seed");
    if (json_is_integer(seed)) json_object_set(g, "seed", (json_t *)seed);
    const json_t *stop = json_object_get(body, "stop");
    if (json_is_string(stop)) json_object_set_new(g, "stop", json_pack("[O]", stop));
    return g;
}

static const kp_dialect LLAMA = {
    .name = "llama",
    .id_prefix = {"cmpl-", "chatcmpl-"},
    .errors = NULL,
    .prompt = NULL,
    .open = ll_open,
    .prefill = NULL,
    .text = ll_text,
    .reasoning = NULL,
    .calls = ll_calls,
    .end = ll_end,
    .close = ll_close,
    .fail = ll_fail,
    .reply = ll_reply,
    .free = lreq_free,
};

KP_HANDLER(kp_llama_completion) {
    (void)id;
    json_error_t je;
    json_t *body = json_loadb(cn->body.data, cn->body.len, 0, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        return kp_http_fail(s, c, 400, "invalid_request_error", NULL, NULL, "the body is not a JSON object: %s",
                            je.text);
    }
    lreq *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(body);
        return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    r->start = kp_now_s();
    r->settings = settings_of(body);
    const json_t *p = json_object_get(body, "prompt");
    if (json_is_string(p)) {
        r->prompt = malloc(json_string_length(p) + 1);
        if (r->prompt) memcpy(r->prompt, json_string_value(p), json_string_length(p) + 1), r->prompt_len = json_string_length(p);
    }
    /* llama-server's names into the completions parser's */
    const json_t *np = json_object_get(body, "n_predict");
    if (!np || (json_is_integer(np) && json_integer_value(np) < 0)) {
        json_object_del(body, "n_predict");
        if (!json_object_get(body, "max_tokens")) json_object_set_new(body, "max_tokens", json_integer(s->ctx));
    }
    const json_t *probs = json_object_get(body, "n_probs");
    if (json_is_integer(probs)) {
        if (json_integer_value(probs) > 0) json_object_set(body, "logprobs", (json_t *)probs);
        json_object_del(body, "n_probs");
    }
    const json_t *rt = json_object_get(body, "return_tokens");
    if (json_is_boolean(rt)) {
        r->return_tokens = json_is_true(rt);
        json_object_set_new(body, "return_token_ids", json_boolean(r->return_tokens));
        json_object_del(body, "return_tokens");
    }
    json_object_del(body, "id_slot"); /* one pool of sequences: any slot is this one */
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) {
        lreq_free(r);
        return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    enum MHD_Result res = kp_answer_run(s, c, cn, &LLAMA, r, false, text, strlen(text), "");
    free(text);
    return res;
}


KP_HANDLER(kp_llama_props) {
    (void)cn, (void)id;
    const char *tmpl = s->cfg.chat_jinja ? kp_chat_tmpl_text(s->cfg.chat_jinja) : "";
    json_t *j = json_pack("{s:{s:I, s:o}, s:I, s:s, s:s, s:s, s:s, s:s, s:{s:b, s:b}, s:I, s:s, s:b, s:b, s:b, s:b}",
                          "default_generation_settings", "n_ctx", (json_int_t)s->ctx, "params", default_params(),
                          "total_slots", (json_int_t)kp_sched_parallel(s->sched), "model_path",
                          s->cfg.model_name, "model_alias", s->cfg.model_name, "chat_template", tmpl ? tmpl : "",
                          "bos_token", s->cfg.chat_bos ? s->cfg.chat_bos : "", "eos_token",
                          s->cfg.chat_eos ? s->cfg.chat_eos : "", "modalities", "vision", 0, "audio", 0,
                          "n_ctx_train", (json_int_t)s->m->hp.n_ctx_train, "build_info",
                          s->cfg.build_info ? s->cfg.build_info : "kvpin",
                          "endpoint_slots", 1, "endpoint_props", 1, "endpoint_metrics", 1, "is_sleeping", 0);
    return kp_http_json(s, c, 200, j);
}

KP_HANDLER(kp_llama_slots) {
    (void)cn, (void)id;
    kp_sched_stats st;
    kp_sched_stats_get(s->sched, &st);
    uint32_t n = kp_sched_parallel(s->sched);
    json_t *arr = json_array();
    for (uint32_t i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:I, s:I, s:b, s:b}", "id", (json_int_t)i, "n_ctx",
                                             (json_int_t)s->ctx, "speculative", 0, "is_processing",
                                             i < st.running));
    return kp_http_json(s, c, 200, arr);
}
