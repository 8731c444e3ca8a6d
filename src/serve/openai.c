/*
 * openai.c - OpenAI's chat completions and completions (openai.h): the
 * dialect that writes their answers and streams.
 *
 * Owns no request state (dreq is NULL): the body is the common request.
 * A stream, per choice i (every chunk names its choice in `index`):
 *
 *   chat: {"delta": {"role": "assistant", "content": ""}}   one per choice, at admission
 *   [prompt_progress chunks without choices]                 return_progress; else
 *   [": prefill N/M tokens" comments]                        while the prompt is computed
 *   {"delta": {"reasoning_content": TEXT}}                 chat: a reasoning model's thinking
 *   {"delta": {"content": TEXT}, "logprobs": LP | null}      completions: {"text": TEXT}
 *   {"delta": {"tool_calls": [{index, id, type, function: {name, arguments: ""}}]}}
 *   {"delta": {"tool_calls": [{index, function: {arguments}}]}}   per call, at the end
 *   {"delta": {}, "finish_reason": F}                        + token ids (return_token_ids)
 *   {"choices": [], "usage": ..., "kvpin_cache": ...}        include_usage, once
 *   [DONE]
 *
 * An error after the stream began is a chunk {"error": ...} before [DONE].
 * Usage counts the prompt once and sums the choices' completions; the
 * kvpin_cache report is choice 0's prefill (with n > 1 or logprobs, also
 * the choices and the positions their prefills computed together).
 */
#include "serve/openai.h"

#include <stdio.h>
#include <string.h>

#include "serve/answer.h"

static json_t *chunk_base(const kp_answer *a) {
    json_t *j = json_pack("{s:s, s:s, s:I, s:s}", "id", a->id, "object",
                          a->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)a->created,
                          "model", a->s->cfg.model_name);
    if (j && a->include_usage) json_object_set_new(j, "usage", json_null()); /* as OpenAI: null until the last */
    return j;
}

/* One chunk of choice i (choice consumed). */
static void chunk(kp_answer *a, json_t *choice) {
    json_t *j = chunk_base(a);
    json_object_set_new(j, "choices", json_pack("[o]", choice));
    kp_answer_event(a, j);
}

/* return_token_ids: the prompt's and the completion's ids on a choice. */
static void add_token_ids(json_t *choice, const kp_sreq_update *u) {
    json_t *p = json_array(), *g = json_array();
    for (uint32_t i = 0; u->ids && i < u->prompt_tokens + u->completion_tokens; i++)
        json_array_append_new(i < u->prompt_tokens ? p : g, json_integer(u->ids[i]));
    json_object_set_new(choice, "prompt_token_ids", p);
    json_object_set_new(choice, "token_ids", g);
}

/* chat: the role first, for every choice, as OpenAI does */
static void oa_open(kp_answer *a, const kp_sreq_update *u) {
    (void)u;
    if (!a->chat) return;
    for (uint32_t i = 0; i < a->n; i++)
        chunk(a, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", (int)i, "delta", "role", "assistant", "content",
                           "", "logprobs", "finish_reason"));
}

/* While the prompt is computed: with return_progress a chunk with no
 * choices and llama.cpp's prompt_progress object (total prompt tokens, those from the cache, those computed so far
 * counting the cached ones, milliseconds since the prefill began). The
 * first one is the state at admission (processed = cache), the last one
 * processed = total; slices that passed between two waits are reported
 * once, by the later. Without it, an SSE comment per slice until the
 * prompt is computed (": prefill 512/28700 tokens"), which every client
 * skips and which keeps the connection and the client's first-byte timer
 * alive. */
static void oa_prefill(kp_answer *a, const kp_sreq_update *u) {
    if (!a->progress) {
        if (u->prefill_done < u->prompt_tokens)
            kp_buf_printf(&a->out, ": prefill %u/%u tokens\n\n", u->prefill_done, u->prompt_tokens);
        return;
    }
    if (!a->prog_any && u->prefill_done > u->report.reused_tokens) { /* the state at admission comes first */
        kp_sreq_update at = *u;
        at.prefill_done = u->report.reused_tokens;
        at.prefill_ms = 0;
        a->prog_any = true;
        oa_prefill(a, &at);
    }
    json_t *j = chunk_base(a);
    json_object_set_new(j, "choices", json_array());
    json_object_set_new(j, "prompt_progress",
                        json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)u->prompt_tokens, "cache",
                                  (json_int_t)u->report.reused_tokens, "processed", (json_int_t)u->prefill_done,
                                  "time_ms", (json_int_t)(u->prefill_ms + 0.5)));
    kp_answer_event(a, j);
}

static void oa_text(kp_answer *a, uint32_t i, const char *text, size_t len, json_t *lp) {
    json_t *choice;
    if (a->chat) {
        json_t *delta = json_object();
        if (text) json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:n}", "index", (int)i, "delta", delta, "logprobs",
                           lp ? lp : json_null(), "finish_reason");
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:n}", "index", (int)i, "text", text ? text : "", text ? len : 0,
                           "logprobs", lp ? lp : json_null(), "finish_reason");
    }
    chunk(a, choice);
}

/* chat: reasoning as llama.cpp's server and DeepSeek's API stream it */
static void oa_reasoning(kp_answer *a, uint32_t i, const char *text, size_t len) {
    chunk(a, json_pack("{s:i, s:{s:s%}, s:n, s:n}", "index", (int)i, "delta", "reasoning_content", text, len,
                       "logprobs", "finish_reason"));
}

/* The tool calls as OpenAI streams them: per call, a chunk with its index,
 * id, type and name and empty arguments, then one with the arguments. */
static void oa_calls(kp_answer *a, uint32_t i, const json_t *calls) {
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *head = json_pack("{s:I, s:O, s:s, s:{s:O, s:s}}", "index", (json_int_t)k, "id",
                                 json_object_get(call, "id"), "type", "function", "function", "name",
                                 json_object_get(fn, "name"), "arguments", "");
        json_t *args = json_pack("{s:I, s:{s:O}}", "index", (json_int_t)k, "function", "arguments",
                                 json_object_get(fn, "arguments"));
        chunk(a, json_pack("{s:i, s:{s:[o]}, s:n, s:n}", "index", (int)i, "delta", "tool_calls", head, "logprobs",
                           "finish_reason"));
        chunk(a, json_pack("{s:i, s:{s:[o]}, s:n, s:n}", "index", (int)i, "delta", "tool_calls", args, "logprobs",
                           "finish_reason"));
    }
}

/* A choice's last chunk: its finish reason, and its token ids when asked. */
static void oa_end(kp_answer *a, uint32_t i) {
    const kp_choice *ch = &a->ch[i];
    json_t *choice;
    if (a->chat)
        choice = json_pack("{s:i, s:{}, s:n, s:s}", "index", (int)i, "delta", "logprobs", "finish_reason", ch->finish);
    else
        choice = json_pack("{s:i, s:s, s:n, s:s}", "index", (int)i, "text", "", "logprobs", "finish_reason",
                           ch->finish);
    if (a->return_ids && choice) add_token_ids(choice, &ch->last);
    chunk(a, choice);
}

static json_t *usage_json(const kp_answer *a) {
    uint32_t prompt, cached, completion;
    kp_answer_usage(a, &prompt, &cached, &completion);
    return kp_oai_usage_json(prompt, cached, completion);
}

/* The usage chunk with kvpin_cache when asked, then [DONE]. */
static void oa_close(kp_answer *a) {
    if (a->include_usage) {
        json_t *j = chunk_base(a);
        json_object_set_new(j, "choices", json_array());
        json_object_set_new(j, "usage", usage_json(a));
        json_object_set_new(j, "kvpin_cache", a->report);
        a->report = NULL;
        kp_answer_event(a, j);
    }
    kp_buf_put(&a->out, "data: [DONE]\n\n", 14);
}

static void oa_fail(kp_answer *a, const kp_oai_error *e) {
    kp_answer_event(a, kp_oai_error_json(e));
    kp_buf_put(&a->out, "data: [DONE]\n\n", 14);
}

/* The final choice object of choice i. */
static json_t *choice_json(kp_answer *a, uint32_t i) {
    kp_choice *ch = &a->ch[i];
    const char *text = ch->text.data ? ch->text.data : "";
    json_t *lp = ch->lp ? ch->lp : json_null();
    ch->lp = NULL;
    json_t *o;
    if (a->chat) {
        size_t n = ch->content - ch->content_from;
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                ch->calls && !n ? json_null() : json_stringn(text + ch->content_from, n));
        if (ch->reason_to > ch->reason_from)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(text + ch->reason_from, ch->reason_to - ch->reason_from));
        if (ch->calls) json_object_set(msg, "tool_calls", ch->calls);
        o = json_pack("{s:i, s:o, s:o, s:s?}", "index", (int)i, "message", msg, "logprobs", lp, "finish_reason",
                      ch->finish);
    } else {
        o = json_pack("{s:i, s:s%, s:o, s:s?}", "index", (int)i, "text", text, ch->text.len, "logprobs", lp,
                      "finish_reason", ch->finish);
    }
    if (a->return_ids && o) add_token_ids(o, &ch->last);
    return o;
}

static json_t *oa_reply(kp_answer *a) {
    json_t *arr = json_array();
    for (uint32_t i = 0; i < a->n; i++) json_array_append_new(arr, choice_json(a, i));
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", a->id, "object",
                          a->chat ? "chat.completion" : "text_completion", "created", (json_int_t)time(NULL), "model",
                          a->s->cfg.model_name, "choices", arr, "usage", usage_json(a), "kvpin_cache",
                          a->report ? a->report : json_null());
    a->report = NULL;
    return j;
}

static const kp_dialect OPENAI = {
    .name = "openai",
    .id_prefix = {"cmpl-", "chatcmpl-"},
    .errors = NULL,
    .prompt = NULL,
    .open = oa_open,
    .prefill = oa_prefill,
    .text = oa_text,
    .reasoning = oa_reasoning,
    .calls = oa_calls,
    .end = oa_end,
    .close = oa_close,
    .fail = oa_fail,
    .reply = oa_reply,
    .free = NULL,
};

KP_HANDLER(kp_openai_chat) {
    return kp_answer_run(s, c, cn, &OPENAI, NULL, true, cn->body.data, cn->body.len, "");
}

KP_HANDLER(kp_openai_completions) {
    return kp_answer_run(s, c, cn, &OPENAI, NULL, false, cn->body.data, cn->body.len, "");
}
