/*
 * answer.c - a generation request answered in an API's dialect: parse,
 * submit, pump (answer.h).
 *
 * Owns a kp_answer from kp_answer_run until the answer is sent: the
 * choices' scheduler requests (released exactly once, by answer_free),
 * their text, logprobs and calls, the dialect's request, the SSE bytes
 * not yet sent. A whole-body answer is freed before kp_answer_run
 * returns; a stream's is freed by libmicrohttpd's free callback
 * (answer_stream_free) when the response ends, which also writes its log
 * line.
 *
 * The flow of one request:
 *
 *   kp_answer_run
 *     kp_oai_parse_opts          the common request (oai.h)
 *     prepare                    tokens (prompt.h), d->prompt, the context, the
 *                                KV budget, the grammar, the seed
 *     kp_sched_submit_n          n choices (choice i: seed + i)
 *     wait_first                 updates until the stream opens (at admission:
 *                                headers and the dialect's first events go out
 *                                while the prompt is still computed, with a
 *                                keep-alive per slice of the prefill), or until
 *                                every choice ended; each update through take()
 *     stream: kp_http_sse        answer_stream_read: take() per update, the
 *                                buffered events out, a keep-alive comment
 *                                every 5 s without news
 *     else:   d->reply           one JSON body
 *
 * take() is where text becomes events: with tools, text that may still
 * become a tool call (kp_chat_tool_holdback; the template's own syntax,
 * toolsyn.h; harmony messages, harmony.h) is held until it is known;
 * at a choice's end its calls are read out of its text (kp_chat_parse_tool_calls),
 * the rest of its content released, d->calls and d->end called; when
 * every choice ended the kvpin_cache report is made once (the cache key
 * noted, the retention pin made) and d->close writes the last events.
 */
#include "serve/answer.h"

#include "serve/answers.h"
#include "serve/promptlog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/entropy.h"
#include "serve/chat.h"
#include "serve/harmony.h"
#include "serve/prompt.h"
#include "tok/textout.h"
#include "serve/pinid.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

json_t *kp_answer_report_json(const kp_sreq_update *u) {
    json_t *j = kp_oai_cache_json(&u->report, u->has_doctor ? &u->doctor : NULL);
    if (!j) return NULL;
    json_object_set_new(j, "preemptions", json_integer((json_int_t)u->preemptions));
    if (u->finish == KP_FINISH_LENGTH && u->err.msg[0]) json_object_set_new(j, "note", json_string(u->err.msg));
    return j;
}


/* prompt_cache_retention "24h": pins the prompt of a generation that
 * ended (its tokens are cached by now) for 24 hours; the key's previous
 * retention pin (or the oldest keyless one past the table's bound) is
 * removed. rj (the report) gets the pin or why there is none. */
static void retain_prompt(kp_server *s, const char *key, const kp_sreq_update *u, json_t *rj) {
    kp_error err = {0}, err2 = {0};
    uint64_t id = 0;
    kp_eng_stats k;
    int64_t now = (int64_t)time(NULL), ttl = 24 * 3600;
    kp_status st = u->ids && u->prompt_tokens
                       ? kp_sched_pin(s->sched, u->ids, u->prompt_tokens, ttl, now, &id, &k, &err)
                       : kp_fail(&err, KP_EINVAL, "no prompt to pin");
    if (st == KP_OK) {
        uint64_t old = kp_cachekeys_retain(s->ckeys, key, id, now + ttl, now);
        if (old && old != id) kp_sched_unpin(s->sched, old, &err2); /* gone already (expired, unpinned): fine */
        char sid[KP_PINID_MAX];
        kp_pinid_format(s->pin_key, id, sid);
        json_object_set_new(rj, "pinned", json_true());
        json_object_set_new(rj, "pin", json_string(sid));
        json_object_set_new(rj, "tokens", json_integer((json_int_t)u->prompt_tokens));
        json_object_set_new(rj, "expires_at", json_integer((json_int_t)(now + ttl)));
    } else {
        json_object_set_new(rj, "pinned", json_false());
        json_object_set_new(rj, "code", json_string(st == KP_EFULL ? "pinned_cap" : "not_pinned"));
        json_object_set_new(rj, "error", json_string(err.msg));
    }
    kp_sched_cache snap;
    kp_sched_cache_get(s->sched, &snap); /* published before the pin and unpin returned */
    json_object_set_new(rj, "pinned_bytes", json_integer((json_int_t)snap.kv.pinned_bytes));
    json_object_set_new(rj, "pinned_cap_bytes", json_integer((json_int_t)snap.kv.pinned_cap_bytes));
}

/* At the end of a generation: counts it under its prompt_cache_key ("":
 * none) and makes its retention pin (retention NULL: none); cj (the
 * kvpin_cache object, may be NULL) gets "prompt_cache_key" and
 * "retention". */
static void cache_fields(kp_server *s, const char *key, const char *retention, const kp_sreq_update *u, json_t *cj) {
    if (key[0]) {
        kp_cachekeys_note(s->ckeys, key, u->prompt_tokens, u->cached_tokens, (int64_t)time(NULL));
        if (cj) json_object_set_new(cj, "prompt_cache_key", json_string(key));
    }
    if (!retention) return;
    json_t *rj = json_pack("{s:s}", "policy", retention);
    if (rj && !strcmp(retention, "24h")) retain_prompt(s, key[0] ? key : NULL, u, rj);
    if (cj) json_object_set_new(cj, "retention", rj);
    else json_decref(rj);
}

/* The compile's stop (kp_grammar_stop): the client left, or the server
 * is stopping. Notes it in a->left, so the answer closes quietly. */
static bool compile_stop(void *arg) {
    kp_answer *a = arg;
    if ((a->conn && kp_http_client_gone(a->conn)) || atomic_load(&a->s->stopping)) a->left = true;
    return a->left;
}

/* A grammar compile that failed: the client's 400 naming param (the schema
 * or grammar is beyond what kvpin compiles: a keyword, a limit), 500 when
 * out of memory; a stopped compile (a->left) is answered by the caller. */
static bool grammar_failed(kp_answer *a, kp_status st, const kp_error *err, const char *param, const char *what,
                           kp_oai_error *e) {
    if (st == KP_ENOMEM || (st == KP_EIO && !a->left))
        return kp_oai_fail(e, 500, "server_error", NULL, param, "%s", err->msg);
    if (a->left) return kp_oai_fail(e, 503, "server_error", NULL, param, "%s", err->msg);
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, param, "%s%s", what, err->msg);
}

/* The compiled grammar of q's constraint (NULL when it has none) as a new
 * reference, from the server's cache. false with *e set: a schema or
 * grammar kvpin cannot compile is the client's 400, naming the field. */
static bool request_grammar(kp_answer *a, const kp_oai_request *q, kp_grammar **g, kp_oai_error *e) {
    *g = NULL;
    if (!q->constraint) return true;
    kp_error err = {0};
    kp_grammar_stop stop = {compile_stop, a};
    kp_status st = kp_gcache_get(a->s->gc, (kp_gc_kind)q->constraint, q->schema, q->grammar, q->grammar_len, &stop,
                                 g, &err);
    return st == KP_OK || grammar_failed(a, st, &err, q->constraint_param, "", e);
}

/* The grammar of a forced tool call (tool_choice "required" or a named
 * function): the template's call markup around a JSON document of the
 * call schema built from the tools (chat.h kp_chat_call_form_build; one
 * call unless parallel_tool_calls is true: the output ends after it, where
 * a small model would otherwise go on calling), compiled once per tool list
 * through the grammar cache. false with *e: an unknown function name or a
 * parameters schema outside the subset is the client's 400. */
/* The family whose rules read calls back when the template's own syntax
 * was not learned (chat_tmpl.h); KP_CHAT_UNKNOWN without a template. */
static kp_chat_family chat_family(const kp_server *s) {
    return s->cfg.chat_jinja ? kp_chat_tmpl_family(s->cfg.chat_jinja) : KP_CHAT_UNKNOWN;
}

/* Harmony's texts that end a turn ("<|return|>", "<|call|>") which the
 * vocabulary has (eog) or lacks (!eog) as end-of-generation tokens, into
 * out (room for 3, NULL-terminated); none when the template does not
 * render harmony. Returns the count. */
static int harmony_ends(const kp_server *s, bool eog, const char **out) {
    static const char *const ends[] = {"<|return|>", "<|call|>"};
    int n = 0;
    for (size_t e = 0; s->cfg.chat_jinja && kp_chat_tmpl_harmony(s->cfg.chat_jinja) && e < 2; e++) {
        int32_t id = kp_tok_find(s->v, ends[e], strlen(ends[e]));
        if ((id >= 0 && kp_tok_is_eog(s->v, id)) == eog) out[n++] = ends[e];
    }
    out[n] = NULL;
    return n;
}

static bool tool_grammar(kp_answer *a, const kp_oai_request *q, kp_grammar **g, kp_oai_error *e) {
    kp_server *s = a->s;
    *g = NULL;
    bool parallel = json_is_true(json_object_get(q->root, "parallel_tool_calls")); /* one call unless asked */
    kp_chat_call_form form;
    kp_error err = {0};
    const kp_toolsyn *syn = s->cfg.chat_jinja ? kp_chat_tmpl_calls(s->cfg.chat_jinja, NULL) : NULL;
    if (syn) { /* the template's own markup, byte for byte as it renders calls back */
        const char *ends[3];
        harmony_ends(s, true, ends); /* the model ends its call with its own <|call|> token */
        kp_status fs = kp_toolsyn_force(syn, q->tools, q->tool_force_name, parallel, ends, g, &err);
        if (fs == KP_OK) return true;
        if (fs == KP_ENOMEM) return kp_oai_fail(e, 500, "server_error", NULL, "tools", "%s", err.msg);
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, q->tool_force_name ? "tool_choice" : "tools",
                           "a forced tool call: %s", err.msg);
    }
    kp_status st = kp_chat_call_form_build(chat_family(s), q->tools, q->tool_force_name, parallel, &form, &err);
    if (st == KP_OK) {
        kp_gc_frame fr = {form.prefix, form.suffix, form.prefix_len, form.suffix_len};
        kp_grammar_stop stop = {compile_stop, a};
        st = kp_gcache_get_framed(s->gc, form.schema, &fr, &stop, g, &err);
        kp_chat_call_form_free(&form);
        return st == KP_OK || grammar_failed(a, st, &err, "tools", "a forced tool call: ", e);
    }
    if (st == KP_ENOMEM) return kp_oai_fail(e, 500, "server_error", NULL, "tool_choice", "%s", err.msg);
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, "tool_choice", "%s", err.msg);
}

/* The log's word for how a generation ended (not done: the client left). */
static const char *finish_word(const kp_sreq_update *u, bool done) {
    if (!done) return "client_left";
    switch (u->finish) {
    case KP_FINISH_LENGTH: return "length";
    case KP_FINISH_STOP: return "stop";
    case KP_FINISH_CANCELLED: return "cancelled";
    case KP_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* ---- the answer ------------------------------------------------------------------ */

static kp_answer *answer_new(kp_server *s, const kp_dialect *d, void *dreq, bool chat) {
    kp_answer *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->s = s;
    a->d = d;
    a->dreq = dreq;
    a->chat = chat;
    a->created = time(NULL);
    /* ids no other client can guess (the answer's, and the seed of its call
     * and item ids): 128 and 64 bits from the kernel's CSPRNG */
    char hex[33];
    kp_error err;
    size_t pl = strlen(d->id_prefix[chat ? 1 : 0]);
    if (kp_entropy_hex(hex, sizeof hex, 16, &err) != KP_OK || pl + 33 > sizeof a->id ||
        kp_entropy(&a->id_seed, sizeof a->id_seed, &err) != KP_OK) {
        free(a);
        return NULL;
    }
    snprintf(a->id, sizeof a->id, "%s%s", d->id_prefix[chat ? 1 : 0], hex);
    return a;
}

static void cancel_all(kp_answer *a) {
    for (uint32_t i = 0; i < a->n; i++) kp_sreq_cancel(a->rs[i]);
}

static void answer_free(kp_answer *a) {
    if (!a) return;
    for (uint32_t i = 0; i < a->n; i++) {
        kp_sreq_release(a->rs[i]);
        kp_buf_free(&a->ch[i].text);
        json_decref(a->ch[i].lp);
        json_decref(a->ch[i].calls);
    }
    if (a->d->free) a->d->free(a->dreq);
    json_decref(a->report);
    json_decref(a->tool_defs);
    free(a->prompt_text);
    kp_buf_free(&a->out);
    free(a);
}

void kp_answer_usage(const kp_answer *a, uint32_t *prompt, uint32_t *cached, uint32_t *completion) {
    uint32_t done = 0;
    for (uint32_t i = 0; i < a->n; i++) done += a->ch[i].last.completion_tokens;
    *prompt = a->ch[0].last.prompt_tokens;
    *cached = a->ch[0].last.cached_tokens;
    *completion = done;
}

void kp_answer_event(kp_answer *a, json_t *j) {
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!t) return;
    kp_buf_put(&a->out, "data: ", 6);
    kp_buf_put(&a->out, t, strlen(t));
    kp_buf_put(&a->out, "\n\n", 2);
    free(t);
}

/* The last update of the request for the log and the usage: choice 0's,
 * with the completions of every choice. */
static kp_sreq_update summed(const kp_answer *a) {
    kp_sreq_update l = a->ch[0].last;
    uint32_t p, c;
    kp_answer_usage(a, &p, &c, &l.completion_tokens);
    return l;
}

/* The kvpin_cache object at the end (choice 0's prefill; with n > 1 or
 * logprobs the choices and the positions their prefills computed), after
 * the cache key and retention were recorded into it. */
static json_t *final_report(kp_answer *a) {
    json_t *j = kp_answer_report_json(&a->ch[0].last);
    if (j && a->multi) {
        uint32_t computed = 0;
        for (uint32_t i = 0; i < a->n; i++) computed += a->ch[i].last.report.computed_tokens;
        json_object_set_new(j, "choices", json_integer((json_int_t)a->n));
        json_object_set_new(j, "choices_computed_tokens", json_integer((json_int_t)computed));
    }
    if (j && a->capped) json_object_set_new(j, "max_tokens_cap", json_integer((json_int_t)a->s->cfg.max_tokens_cap));
    json_t *dropped = kp_volatile_report_json(a->s->vol, &a->dropped);
    if (j && dropped) json_object_set_new(j, "dropped_volatile_block", dropped);
    else json_decref(dropped);
    cache_fields(a->s, a->key, a->retention, &a->ch[0].last, j);
    return j;
}

/* ---- updates into events ------------------------------------------------------- */

/* Streaming: hands text[released..upto) of choice i to the dialect. */
static void release(kp_answer *a, uint32_t i, size_t upto) {
    kp_choice *ch = &a->ch[i];
    if (upto <= ch->released) return;
    a->d->text(a, i, ch->text.data + ch->released, upto - ch->released, NULL);
    ch->released = upto;
}

/* Splits choice i's text into reasoning and content (final: the reply is
 * complete); streaming, hands the new reasoning to the dialect. Returns
 * whether content may be released (from ch->content_from on). */
static bool split_reasoning(kp_answer *a, uint32_t i, bool final) {
    kp_choice *ch = &a->ch[i];
    ch->content_to = ch->text.len;
    if (!a->reason) return true;
    kp_reasoning_split r;
    kp_reasoning_scan(ch->text.data ? ch->text.data : "", ch->text.len, a->reason, a->reason_open, final,
                      ch->split_any ? &ch->split : NULL, &r);
    ch->split = r;
    ch->split_any = r.state != KP_REASONING_UNDECIDED;
    if (r.state == KP_REASONING_OPEN || r.state == KP_REASONING_CLOSED) {
        ch->reason_from = r.reason_from;
        ch->reason_to = r.reason_to;
        size_t from = ch->reason_released > r.reason_from ? ch->reason_released : r.reason_from;
        if (a->stream && a->d->reasoning && r.reason_to > from)
            a->d->reasoning(a, i, ch->text.data + from, r.reason_to - from);
        if (r.reason_to > ch->reason_released) ch->reason_released = r.reason_to;
    }
    if (r.state == KP_REASONING_UNDECIDED || r.state == KP_REASONING_OPEN) {
        ch->content_from = ch->text.len;
        return false;
    }
    ch->content_from = r.content_from;
    ch->content_to = r.content_to;
    if (ch->released < ch->content_from) ch->released = ch->content_from; /* the markers are not content */
    return true;
}

/* Choice i ended (stop, length; a cancel after the start when not
 * streaming): its calls read out of its text, the rest of it released,
 * and when it was the last, the report and the closing events. */
/* Where a stream's text must be held back because it may become calls:
 * as harmony messages when the template renders harmony, else by the
 * template's own call syntax when it has one, else the family's. */
static size_t tool_holdback(const kp_answer *a, const kp_choice *ch) {
    const char *t = ch->text.data ? ch->text.data : "";
    if (a->harmony) return kp_harmony_holdback(t, ch->text.len);
    const kp_toolsyn *syn = a->s->cfg.chat_jinja ? kp_chat_tmpl_calls(a->s->cfg.chat_jinja, NULL) : NULL;
    return syn ? kp_toolsyn_holdback(syn, t, ch->text.len) : kp_chat_tool_holdback(chat_family(a->s), t, ch->text.len);
}

/* Remembers choice i's answer as the tokens the model wrote (answers.h):
 * the prompt's rendering and the generated pieces against their ids, the
 * end-of-generation token left out (a model may end on <|endoftext|> where
 * its template closes the turn with <|end|>; that token was sampled, never
 * fed, so the cache does not hold it either): an "open" entry, used when
 * the template's markup after it starts with a control token. Answers
 * that stopped (an end token, a grammar's end, a stop string: the client's
 * text then lacks the string, and the entry never matches) or were cut by
 * max_tokens. */
static void remember_answer(kp_answer *a, const kp_choice *ch) {
    const kp_sreq_update *u = &ch->last;
    const kp_tok_vocab *v = a->s->v;
    size_t n = (size_t)u->prompt_tokens + u->completion_tokens;
    if (!a->prompt_text || !u->ids || !u->completion_tokens) return;
    bool eog = kp_tok_is_eog(v, u->ids[n - 1]);
    if (u->finish != KP_FINISH_STOP && u->finish != KP_FINISH_LENGTH) return;
    if (eog) n--;
    kp_buf b = {0};
    kp_buf_put(&b, a->prompt_text, a->prompt_len);
    for (size_t k = u->prompt_tokens; k < n; k++) {
        size_t pl = 0;
        const char *piece = kp_tok_piece_view(v, u->ids[k], true, &pl);
        if (piece) kp_buf_put(&b, piece, pl);
    }
    if (!b.oom) kp_answers_put(a->s->answers, b.data, b.len, u->ids, n, true);
    kp_buf_free(&b);
}

static void choice_over(kp_answer *a, uint32_t i) {
    kp_choice *ch = &a->ch[i];
    if (a->capped && ch->last.finish == KP_FINISH_LENGTH) { /* --max-tokens-cap ends the turn */
        ch->last.finish = KP_FINISH_STOP;
        ch->cap_end = true;
    }
    kp_finish f = ch->last.finish;
    ch->over = true;
    if (a->chat) remember_answer(a, ch);
    split_reasoning(a, i, true);
    ch->content = ch->text.len;
    ch->finish = kp_oai_finish_name(f);
    if (a->tools && (f == KP_FINISH_LENGTH || f == KP_FINISH_STOP)) {
        kp_error err;
        size_t content = ch->text.len;
        const kp_toolsyn *syn = a->s->cfg.chat_jinja ? kp_chat_tmpl_calls(a->s->cfg.chat_jinja, NULL) : NULL;
        if (a->harmony)
            kp_harmony_parse(ch->text.data ? ch->text.data : "", ch->text.len, a->id_seed + i, &ch->calls, &content,
                             &err);
        else if (syn)
            kp_toolsyn_parse(syn, a->tool_defs, ch->text.data ? ch->text.data : "", ch->text.len, a->id_seed + i,
                             &ch->calls, &content, &err);
        else
            kp_chat_parse_tool_calls(chat_family(a->s), ch->text.data ? ch->text.data : "", ch->text.len,
                                     a->id_seed + i, &ch->calls, &content, &err);
        if (ch->calls) {
            ch->content = content > ch->content_from ? content : ch->content_from;
            ch->finish = "tool_calls";
        }
    }
    if (ch->content > ch->content_to && ch->content_to >= ch->content_from) ch->content = ch->content_to;
    if (a->stream) {
        release(a, i, ch->content);
        if (ch->calls) a->d->calls(a, i, ch->calls);
        a->d->end(a, i);
    }
    a->finish = ch->finish;
    if (++a->n_over < a->n) return;
    a->report = final_report(a);
    if (!a->stream) return;
    a->d->close(a);
    a->done = true;
}

/* The stream failed after it opened (u: the failing update). */
static void stream_failed(kp_answer *a, const kp_sreq_update *u) {
    kp_oai_error e;
    kp_oai_from_status(u->finish == KP_FINISH_ERROR ? u->status : KP_EIO, &u->err, NULL, &e);
    if (u->finish == KP_FINISH_CANCELLED) snprintf(e.message, sizeof e.message, "the request was cancelled");
    a->d->fail(a, &e);
    cancel_all(a);
    a->done = true;
}

/* The logprobs of update u of choice i: into the choice's object (not
 * streaming), or a new object for the stream (returned). */
static json_t *take_logprobs(kp_answer *a, kp_choice *ch, const kp_sreq_update *u) {
    if (!a->logprobs || u->n_lp == 0) return NULL;
    json_t *o = a->stream ? kp_oai_logprobs_new(a->chat) : ch->lp;
    kp_oai_logprobs_append(a->s->v, a->chat, u->lp, u->n_lp, o, &ch->lp_off);
    return a->stream ? o : NULL;
}

/* Moves update u of choice i in (its text and logprobs consumed) and, on a
 * stream that opened, turns it into events. */
static void take(kp_answer *a, uint32_t i, kp_sreq_update *u) {
    kp_choice *ch = &a->ch[i];
    if (a->stream && !a->opened && (u->started || u->admitted)) {
        a->d->open(a, u);
        a->opened = true;
    }
    if (a->stream && a->d->prefill && i == 0 && u->admitted && !a->prog_over &&
        (!a->prog_any || u->prefill_done != a->prog_sent)) {
        a->d->prefill(a, u);
        a->prog_any = true;
        a->prog_sent = u->prefill_done;
        a->prog_over = u->prefill_done >= u->prompt_tokens;
    }
    json_t *lp = take_logprobs(a, ch, u);
    size_t before = ch->text.len;
    if (u->len) kp_buf_put(&ch->text, u->text, u->len);
    free(u->text);
    free(u->lp);
    u->text = NULL;
    u->lp = NULL;
    u->len = 0;
    u->n_lp = 0;
    ch->last = *u;
    if (a->stream && (a->tools || a->reason)) {
        if (lp) a->d->text(a, i, NULL, 0, lp);
        if (u->finish == KP_FINISH_NONE && split_reasoning(a, i, false)) {
            size_t upto = a->tools ? tool_holdback(a, ch) : ch->text.len;
            release(a, i, upto < ch->content_to ? upto : ch->content_to);
        }
    } else if (a->stream && (ch->text.len > before || lp)) {
        a->d->text(a, i, ch->text.data ? ch->text.data + before : "", ch->text.len - before, lp);
        ch->released = ch->text.len;
    }
    if (u->finish == KP_FINISH_NONE) return;
    if (u->finish == KP_FINISH_ERROR || (u->finish == KP_FINISH_CANCELLED && a->stream)) stream_failed(a, u);
    else choice_over(a, i);
}

/* ---- the stream ------------------------------------------------------------------ */

static bool pump(kp_answer *a, int timeout_ms) {
    kp_sreq_update u;
    if (!kp_sreq_wait_any(a->rs, a->n, timeout_ms, &a->which, &u)) {
        free(u.text);
        free(u.lp);
        return false;
    }
    take(a, a->which, &u);
    return true;
}

/* The SSE bytes for libmicrohttpd: what is buffered, else the events of
 * the next update (waiting 250 ms at a time); a keep-alive comment every
 * 5 s without news (it keeps proxies open and finds clients that left).
 * At shutdown every choice is cancelled and the stream ends with an error. */
static ssize_t answer_stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    kp_answer *a = cls;
    double waited = 0;
    while (a->off == a->out.len) {
        a->off = 0;
        kp_buf_clear(&a->out);
        if (a->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&a->s->stopping)) {
            cancel_all(a);
            kp_http_quiet_close();
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!pump(a, 250)) {
            waited += 0.25;
            if (waited >= 5) {
                kp_buf_put(&a->out, ": keep-alive\n\n", 14);
                waited = 0;
            }
        }
    }
    if (a->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = a->out.len - a->off < max ? a->out.len - a->off : max;
    memcpy(out, a->out.data + a->off, n);
    a->off += n;
    return (ssize_t)n;
}

/* The response ended (or could not be made): a client that left cancels
 * what still runs; the log line; everything freed. */
static void answer_stream_free(void *cls) {
    kp_answer *a = cls;
    if (!a->done) cancel_all(a);
    kp_sreq_update l = summed(a);
    kp_reqlog_gen(&a->log, &l, a->done && a->finish ? a->finish : finish_word(&l, a->done));
    kp_reqlog_write(a->s, &a->log);
    answer_free(a);
}

/* ---- the request ----------------------------------------------------------------- */

/* What prepare makes for the submit (freed by prepared_free). */
typedef struct {
    kp_prompt pr; /* the prompt's ids, text and what was dropped of it */
    kp_grammar *grammar;
    uint32_t max_tokens;
} prepared;

static void prepared_free(prepared *p) {
    kp_prompt_free(&p->pr);
    kp_grammar_free(p->grammar);
}

/* The prompt's token ids: given in the body (checked against the
 * vocabulary), or from prompt.h. */
static bool prompt_ids(kp_answer *a, kp_oai_request *q, prepared *p, kp_oai_error *e) {
    kp_server *s = a->s;
    if (!q->prompt_tokens) {
        kp_prompt_opts po = {q->add_generation_prompt, q->enable_thinking_set && !q->enable_thinking,
                             json_object_get(q->root, "chat_template_kwargs"), true};
        return kp_prompt_tokens(s, a->chat ? NULL : json_object_get(q->root, "prompt"), q->messages, q->tools,
                                q->parse_special, &po, &p->pr, e);
    }
    p->pr.ids = q->prompt_tokens; /* taken over */
    p->pr.n = q->n_prompt_tokens;
    q->prompt_tokens = NULL;
    for (uint32_t i = 0; i < p->pr.n; i++)
        if (p->pr.ids[i] >= kp_tok_n_vocab(s->v))
            return kp_oai_fail(e, 400, "invalid_request_error", NULL, "prompt",
                               "prompt[%u] is not a token id of this model (0..%d)", i, kp_tok_n_vocab(s->v) - 1);
    return true;
}

/* The grammar (first: a schema beyond a limit is named as such, even when
 * the tools that carry it also make the prompt too long), tokens, the
 * dialect's look at them, the context, the KV budget, the seed. false
 * with *e: the client's error. */
static bool prepare(kp_answer *a, kp_oai_request *q, prepared *p, kp_oai_error *e) {
    kp_server *s = a->s;
    const char *pparam = a->chat ? "messages" : "prompt";
    if (!(q->tool_force ? tool_grammar(a, q, &p->grammar, e) : request_grammar(a, q, &p->grammar, e))) return false;
    if (!prompt_ids(a, q, p, e)) return false;
    a->dropped = p->pr.dropped;
    if (a->d->prompt) a->d->prompt(a, p->pr.ids, p->pr.n);
    if (p->pr.n > s->ctx)
        return kp_oai_fail(e, 400, "invalid_request_error", "context_length_exceeded", pparam,
                           "the prompt has %zu tokens, more than the context of %u tokens", p->pr.n, s->ctx);
    p->max_tokens = q->max_tokens_set ? q->max_tokens
                    : a->chat         ? s->ctx - (uint32_t)p->pr.n
                                      : (s->cfg.completion_max_tokens ? s->cfg.completion_max_tokens : 16);
    if (s->cfg.max_tokens_cap && p->max_tokens > s->cfg.max_tokens_cap) { /* --max-tokens-cap */
        p->max_tokens = s->cfg.max_tokens_cap;
        a->capped = true;
    }
    if (!kp_prompt_fits_budget(s, (uint32_t)p->pr.n, p->max_tokens, q->max_tokens_set, pparam, e)) return false;
    if (!q->seed_set) q->sp.seed = (uint64_t)time(NULL) ^ (atomic_fetch_add(&s->next_id, 1) * GOLDEN);
    return true;
}

/* The chat_template_kwargs the server's template does not read, named as
 * ignored: a template reads those its text names (any of them), and
 * add_generation_prompt. */
static void note_unread_kwargs(const kp_server *s, kp_oai_request *q) {
    const json_t *kw = json_object_get(q->root, "chat_template_kwargs");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)kw, k, v) {
        (void)v;
        if (!strcmp(k, "add_generation_prompt") || (s->cfg.chat_jinja && kp_chat_tmpl_uses(s->cfg.chat_jinja, k)))
            continue;
        char path[160];
        snprintf(path, sizeof path, "chat_template_kwargs.%.96s", k);
        kp_oai_note_ignored(&q->ignored, path);
    }
}

/* The request's stop strings, and for a harmony template the texts that
 * end its turn ("<|return|>", "<|call|>") where the vocabulary does not
 * end generation on them as tokens (a template served on another model),
 * as far as the table holds them. Returns the count. */
static int turn_stops(const kp_answer *a, const kp_oai_request *q, const char **out) {
    const char *ends[3];
    int n = 0, n_ends = a->chat ? harmony_ends(a->s, false, ends) : 0;
    for (int k = 0; k < q->n_stops && n < KP_TEXTOUT_MAX_STOPS; k++) out[n++] = q->stops[k];
    for (int e = 0; e < n_ends && n < KP_TEXTOUT_MAX_STOPS; e++) {
        bool dup = false;
        for (int k = 0; k < n; k++) dup = dup || !strcmp(out[k], ends[e]);
        if (!dup) out[n++] = ends[e];
    }
    return n;
}

/* The request's flags into the answer, then the n choices submitted. */
static bool submit(kp_answer *a, const kp_oai_request *q, const prepared *p, kp_oai_error *e) {
    a->stream = q->stream;
    a->include_usage = q->include_usage;
    a->return_ids = q->return_token_ids;
    a->progress = q->return_progress && q->stream;
    a->tools = a->chat && q->tools; /* the template's tool syntax, or the generic format (chat.h) */
    a->tool_defs = a->tools ? json_incref((json_t *)q->tools) : NULL;
    if (a->chat && a->s->answers && p->pr.text && (a->prompt_text = malloc(p->pr.text_len ? p->pr.text_len : 1)))
        memcpy(a->prompt_text, p->pr.text, p->pr.text_len), a->prompt_len = p->pr.text_len;
    const kp_server_config *cfg = &a->s->cfg;
    a->reason = !a->chat || cfg->reasoning_inline || !cfg->chat_jinja ? NULL : kp_chat_tmpl_reasoning(cfg->chat_jinja);
    a->reason_open = p->pr.text && kp_reasoning_prompt_opens(p->pr.text, p->pr.text_len, a->reason);
    a->harmony = a->chat && cfg->chat_jinja && kp_chat_tmpl_harmony(cfg->chat_jinja);
    const char *stops[KP_TEXTOUT_MAX_STOPS];
    int n_stops = turn_stops(a, q, stops);
    a->logprobs = q->logprobs;
    a->multi = q->n > 1 || q->logprobs;
    snprintf(a->key, sizeof a->key, "%s", q->prompt_cache_key ? q->prompt_cache_key : "");
    a->retention = !q->retention ? NULL : q->retain_24h ? "24h" : "in_memory";
    for (uint32_t i = 0; i < q->n; i++)
        if (a->logprobs && !a->stream && !(a->ch[i].lp = kp_oai_logprobs_new(a->chat)))
            return kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    /* a stream is woken at admission (its first byte) and per slice of the prefill */
    kp_sreq_params sp = {p->pr.ids,  (uint32_t)p->pr.n, p->max_tokens,     q->sp,     stops, n_stops,
                         q->ignore_eos, p->pr.text,    p->pr.text_len, q->max_tokens_set, p->grammar, q->stream,
                         {p->pr.rewrite_byte, a->reason ? a->reason->open : NULL,
                          {p->pr.rewrite_line[0], p->pr.rewrite_line[1]}},
                         p->pr.msg_starts, p->pr.n_msg_starts};
    kp_error err = {0};
    if (a->s->promptlog) { /* --log-prompts: what `kvpin doctor` reads */
        const char *api = !strcmp(a->d->name, "openai") ? (a->chat ? "chat" : "completions")
                          : !strcmp(a->d->name, "anthropic") ? "messages"
                          : !strcmp(a->d->name, "llama")     ? "completion"
                                                             : a->d->name;
        kp_promptlog_write(a->s->promptlog, api, q->prompt_cache_key, p->pr.text, p->pr.text_len, (uint32_t)p->pr.n);
    }
    kp_status st = kp_sched_submit_n(a->s->sched, &sp, q->n, q->logprobs ? (int32_t)q->top_logprobs : -1, a->rs, &err);
    if (st != KP_OK) {
        const char *param = st == KP_ERANGE                ? (a->chat ? "messages" : "prompt")
                            : st == KP_EINVAL && a->multi ? "n"
                                                          : NULL;
        kp_oai_from_status(st, &err, param, e);
        return false;
    }
    a->n = q->n;
    a->which = a->n - 1;
    if (a->dropped.texts) atomic_fetch_add(&a->s->volatile_dropped, a->dropped.texts);
    return true;
}

/* Waits until the stream opens, or (not streaming) every choice ended.
 * Returns true to go on; false when it answered (an error) or the client
 * left (*res then holds the result and the answer is freed). */
static bool wait_first(kp_answer *a, struct MHD_Connection *c, kp_conn *cn, enum MHD_Result *res) {
    kp_server *s = a->s;
    while (a->stream ? !a->opened && !a->done : a->n_over < a->n) {
        kp_sreq_update u;
        bool news = kp_sreq_wait_any(a->rs, a->n, 100, &a->which, &u);
        if (kp_http_client_gone(c) || atomic_load(&s->stopping)) {
            free(u.text);
            free(u.lp);
            cancel_all(a);
            bool stopping = atomic_load(&s->stopping);
            kp_reqlog_gen(&cn->log, &a->ch[0].last, stopping ? "cancelled" : "client_left");
            if (stopping) cn->log.code = "server_stopping";
            answer_free(a);
            kp_http_quiet_close();
            *res = MHD_NO;
            return false;
        }
        if (!news) continue;
        if (u.finish == KP_FINISH_ERROR || (u.finish == KP_FINISH_CANCELLED && !u.started)) {
            free(u.text);
            free(u.lp);
            cancel_all(a);
            kp_oai_error e;
            kp_oai_from_status(u.finish == KP_FINISH_ERROR ? u.status : KP_EIO, &u.err, NULL, &e);
            if (u.finish == KP_FINISH_CANCELLED)
                kp_oai_fail(&e, 503, "server_error", NULL, NULL, "the server is stopping");
            kp_reqlog_gen(&cn->log, &u, finish_word(&u, true));
            answer_free(a);
            *res = kp_http_error(s, c, &e);
            return false;
        }
        take(a, a->which, &u);
    }
    return true;
}

/* The answer out: the stream (the answer goes with it) or the body. */
static enum MHD_Result answer_send(kp_answer *a, struct MHD_Connection *c, kp_conn *cn, const char *ign_h,
                                   const char *ignored) {
    kp_server *s = a->s;
    if (a->stream) {
        a->log = cn->log;
        a->log.status = 200;
        cn->streamed = true;
        return kp_http_sse(s, c, cn, answer_stream_read, a, answer_stream_free, &a->log, ign_h, ignored);
    }
    json_t *j = a->d->reply(a);
    kp_sreq_update l = summed(a);
    kp_reqlog_gen(&cn->log, &l, a->ch[a->n - 1].finish ? a->ch[a->n - 1].finish : finish_word(&l, true));
    answer_free(a);
    return kp_http_json_h(s, c, 200, j, ign_h, ignored);
}

enum MHD_Result kp_answer_run(kp_server *s, struct MHD_Connection *c, kp_conn *cn, const kp_dialect *d, void *dreq,
                              bool chat, const char *body, size_t len, const char *ignored_by_dialect) {
    kp_answer *a = answer_new(s, d, dreq, chat);
    if (!a) {
        if (d->free) d->free(dreq);
        return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    kp_oai_request q;
    kp_oai_error e;
    if (!kp_oai_parse_opts(body, len, chat, s->cfg.strict_api, &q, &e)) {
        answer_free(a);
        return kp_http_error(s, c, &e);
    }
    /* the request policy's leftovers: what the template cannot do, the names for the header and the log */
    if (chat) note_unread_kwargs(s, &q);
    char ignored[1100];
    snprintf(ignored, sizeof ignored, "%s%s%s", ignored_by_dialect, ignored_by_dialect[0] && q.ignored.data ? "," : "",
             q.ignored.data ? q.ignored.data : "");
    snprintf(cn->log.ignored, sizeof cn->log.ignored, "%.200s", ignored);
    const char *ign_h = ignored[0] ? "x-kvpin-ignored-fields" : NULL;
    prepared p = {0};
    a->conn = c;
    bool ok = prepare(a, &q, &p, &e) && submit(a, &q, &p, &e);
    snprintf(cn->log.cache_key, sizeof cn->log.cache_key, "%s", a->key); /* the dashboard shows it */
    prepared_free(&p); /* the scheduler holds its own copies and grammar reference */
    kp_oai_request_free(&q);
    if (!ok && a->left) { /* the grammar's compile stopped: nobody to answer */
        bool stopping = atomic_load(&s->stopping);
        kp_reqlog_gen(&cn->log, &a->ch[0].last, stopping ? "cancelled" : "client_left");
        if (stopping) cn->log.code = "server_stopping";
        answer_free(a);
        kp_http_quiet_close();
        return MHD_NO;
    }
    if (!ok) {
        answer_free(a);
        return kp_http_error(s, c, &e);
    }
    enum MHD_Result res;
    if (!wait_first(a, c, cn, &res)) return res;
    return answer_send(a, c, cn, ign_h, ignored);
}

enum MHD_Result kp_answer_run_chat(kp_server *s, struct MHD_Connection *c, kp_conn *cn, const kp_dialect *d,
                                   void *dreq, const json_t *chat, const kp_buf *ignored) {
    /* both copied out before the run: they live in dreq, which the run frees */
    char *body = json_dumps(chat, JSON_COMPACT);
    char ign[1024];
    snprintf(ign, sizeof ign, "%s", ignored && ignored->data ? ignored->data : "");
    if (!body) {
        if (d->free) d->free(dreq);
        return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    enum MHD_Result r = kp_answer_run(s, c, cn, d, dreq, true, body, strlen(body), ign);
    free(body);
    return r;
}
