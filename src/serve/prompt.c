/*
 * prompt.c - the prompt of a request as token ids (prompt.h).
 *
 * Owns nothing. Text is tokenized as the model expects a prompt (BOS when
 * the vocabulary wants one); messages are rendered by the chat template
 * with the client's text marked plain, so that only the template's markup
 * can produce control tokens: the server's chat template (chat_tmpl.h:
 * the model's own, a --chat-template-file or a built-in one; the
 * interpreter reports the client's bytes).
 */
#include "serve/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "serve/answers.h"
#include "serve/chat.h"
#include "serve/chat_tmpl.h"
#include "serve/volatile.h"
#include "tok/tok.h"

/* Text -> tokens the way the model expects a prompt: special tokens in the
 * text are parsed, BOS added when the vocabulary wants one and the text
 * does not start with it already. */
static bool tokenize_prompt(kp_server *s, const char *text, size_t len, const kp_tok_range *plain, size_t n_plain,
                            int32_t **ids, size_t *n, kp_oai_error *e) {
    kp_error err = {0};
    int32_t *t = NULL;
    size_t nt = 0;
    if (kp_tok_encode_plain(s->v, text, len, false, plain, n_plain, &t, &nt, &err) != KP_OK) {
        kp_oai_from_status(KP_EINVAL, &err, "prompt", e);
        return false;
    }
    int32_t bos = kp_tok_bos(s->v);
    if (kp_tok_add_bos(s->v) && bos >= 0 && (nt == 0 || t[0] != bos)) {
        int32_t *t2 = malloc((nt + 1) * sizeof *t2);
        if (!t2) {
            free(t);
            return kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        t2[0] = bos;
        if (nt) memcpy(t2 + 1, t, nt * sizeof *t);
        free(t);
        t = t2;
        nt++;
    }
    if (nt == 0) {
        free(t);
        return kp_oai_fail(e, 400, "invalid_request_error", NULL, "prompt",
                           "the prompt is empty and the model has no BOS token to start from");
    }
    *ids = t;
    *n = nt;
    return true;
}

/* text[0..len) as tokens when it starts with an answer the server
 * remembers (answers.h): that answer's tokens, then the rest tokenized
 * (plain ranges shifted to it, no BOS: it follows a control token). false
 * when there is no such answer (or memory ran out): tokenize as usual. */
static bool tokenize_after_answer(kp_server *s, const char *text, size_t len, const kp_tok_range *plain,
                                  size_t n_plain, int32_t **ids, size_t *n) {
    int32_t *pre = NULL, *rest = NULL;
    size_t np = 0, nr = 0;
    bool open = false;
    size_t m = kp_answers_match(s->answers, text, len, &pre, &np, &open);
    if (!m) return false;
    kp_tok_range *r = n_plain ? malloc(n_plain * sizeof *r) : NULL;
    size_t k = 0;
    for (size_t i = 0; r && i < n_plain; i++) {
        size_t a = plain[i].start, b = plain[i].start + plain[i].len;
        if (b <= m) continue;
        if (a < m) a = m;
        r[k++] = (kp_tok_range){a - m, b - a};
    }
    kp_error err = {0};
    bool ok = (r || !n_plain) && (m == len || kp_tok_encode_plain(s->v, text + m, len - m, false, r, k, &rest, &nr,
                                                                  &err) == KP_OK);
    /* an answer cut short: the template's markup that closes it must start
     * with a control token, or its first bytes could have merged with the
     * answer's last */
    if (ok && open) ok = nr > 0 && kp_tok_is_control(s->v, rest[0]);
    int32_t *t = ok ? malloc((np + nr) * sizeof *t) : NULL;
    if (t) {
        memcpy(t, pre, np * sizeof *t);
        if (nr) memcpy(t + np, rest, nr * sizeof *t);
        *ids = t;
        *n = np + nr;
    }
    free(r);
    free(pre);
    free(rest);
    return t != NULL;
}

static kp_status render_chat(kp_server *s, const json_t *msgs, const json_t *tools, const kp_chat_opts *o,
                             const json_t *kwargs, char **text, size_t *len, kp_tok_range **plain, size_t *n_plain,
                             kp_error *err) {
    return kp_chat_tmpl_render(s->cfg.chat_jinja, msgs, tools, o, kwargs, text, len, plain, n_plain, err);
}

/* Where the rendering of msgs up to their last answer (the answer's turn
 * as the model wrote it: the last message, no generation prompt) stops
 * being a prefix of text[0..len), or 0 when it is one or there is no
 * answer with a turn after it; then lines[0] is the template line that
 * writes text's byte there and lines[1] the one that wrote the answer's
 * rendering's (0: not known). */
static size_t history_rewrite(kp_server *s, const json_t *msgs, const json_t *tools, const kp_chat_opts *o,
                              const json_t *kwargs, const char *text, size_t len, int lines[2]) {
    size_t j = json_array_size(msgs);
    for (; j > 0; j--) {
        const char *role = json_string_value(json_object_get(json_array_get(msgs, j - 1), "role"));
        if (role && !strcmp(role, "assistant")) break;
    }
    if (j == 0 || j == json_array_size(msgs)) return 0;
    json_t *head = json_array();
    for (size_t i = 0; head && i < j; i++) json_array_append(head, json_array_get(msgs, i));
    kp_chat_opts ho = *o;
    ho.add_generation_prompt = false;
    char *h = NULL;
    size_t hl = 0;
    kp_error err;
    size_t at = 0;
    if (head && render_chat(s, head, tools, &ho, kwargs, &h, &hl, NULL, NULL, &err) == KP_OK) {
        size_t i = 0;
        while (i < hl && i < len && h[i] == text[i]) i++;
        at = i < hl ? (i ? i : 1) : 0;
    }
    if (at) { /* the template lines that write that byte now and wrote it then */
        lines[0] = kp_chat_tmpl_line_at(s->cfg.chat_jinja, msgs, tools, o, kwargs, at);
        lines[1] = kp_chat_tmpl_line_at(s->cfg.chat_jinja, head, tools, &ho, kwargs, at);
    }
    free(h);
    json_decref(head);
    return at;
}

/* The most message starts a prompt carries: the latest ones (a rendering
 * of the messages before each is made to find it). */
#define PROMPT_MSG_STARTS 32

/* Under a window budget (kp_server_config.message_starts): the token
 * positions where msgs' messages start in out->ids, rendered from text:
 *
 *   text   | <turn>system ...<end> | <turn>user ...<end> | <turn>model ...
 *   bytes  0                       b1                    b2
 *   ids    | t0 t1 ...             | tk ...              | tm ...
 *   starts                           k                     m
 *
 * b_j is the length of the rendering of the first j messages (no
 * generation prompt) when it is a prefix of text; the token that starts
 * at byte b_j is found by adding up the tokens' pieces, which must add up
 * to text exactly (a BOS the text does not hold counts 0, and so does the
 * space an SPM vocabulary puts before its first text piece), or no start
 * is given. Best effort: none when memory runs out. */
static void message_starts(kp_server *s, const json_t *msgs, const json_t *tools, const kp_chat_opts *o,
                           const json_t *kwargs, const char *text, size_t len, kp_prompt *out) {
    size_t nm = json_array_size(msgs), first = nm > PROMPT_MSG_STARTS ? nm - PROMPT_MSG_STARTS : 1;
    if (nm < 2 || !(out->msg_starts = malloc((nm - first) * sizeof *out->msg_starts))) return;
    /* the byte where each token starts: pieces with their special text, from a BOS the text lacks on */
    size_t *at = malloc((out->n + 1) * sizeof *at), b = 0, bos_len = 0;
    const char *bos = kp_tok_bos(s->v) >= 0 ? kp_tok_piece_view(s->v, kp_tok_bos(s->v), true, &bos_len) : NULL;
    bool skip_bos = out->n && out->ids[0] == kp_tok_bos(s->v) &&
                    !(bos && bos_len <= len && !memcmp(text, bos, bos_len));
    bool dummy = kp_tok_add_space_prefix(s->v); /* SPM: the first text piece's leading space is not in text */
    for (size_t i = 0; at && i < out->n; i++) {
        size_t pl = 0;
        at[i] = b;
        const char *pc = i == 0 && skip_bos ? NULL : kp_tok_piece_view(s->v, out->ids[i], true, &pl);
        if (!pc) pl = 0;
        if (dummy && pl && !kp_tok_is_control(s->v, out->ids[i])) {
            dummy = false;
            if (pc[0] == ' ' && (b >= len || text[b] != ' ')) pl--;
        }
        b += pl;
    }
    json_t *head = json_array();
    kp_chat_opts ho = *o;
    ho.add_generation_prompt = false;
    for (size_t j = 0; j < first && head; j++) json_array_append(head, json_array_get(msgs, j));
    for (size_t j = first, i = 0; at && b == len && head && j < nm; j++) {
        char *h = NULL;
        size_t hl = 0;
        kp_error err;
        if (render_chat(s, head, tools, &ho, kwargs, &h, &hl, NULL, NULL, &err) == KP_OK && hl < len &&
            !memcmp(h, text, hl)) {
            while (i < out->n && at[i] < hl) i++;
            if (i < out->n && at[i] == hl) out->msg_starts[out->n_msg_starts++] = (uint32_t)i;
        }
        free(h);
        json_array_append(head, json_array_get(msgs, j));
    }
    json_decref(head);
    free(at);
}

/* messages (+ tools) through the chat template, the volatile start of
 * the system texts dropped first (volatile.h), into out. */
static bool render_messages(kp_server *s, const json_t *messages, const json_t *tools, const kp_prompt_opts *po,
                            kp_prompt *out, kp_oai_error *e) {
    if (!s->cfg.chat_jinja)
        return kp_oai_fail(e, 400, "invalid_request_error", "no_chat_template", "messages",
                           "the model has no chat template kvpin can render; start the server with "
                           "--chat-template NAME or --chat-template-file FILE, or use /v1/completions");
    json_t *msgs = kp_volatile_strip(s->vol, messages, &out->dropped);
    if (!msgs) return kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    kp_chat_opts o = {po ? po->add_generation_prompt : true, po ? po->disable_thinking : false};
    char *text = NULL;
    size_t len = 0;
    kp_error err = {0};
    kp_tok_range *plain = NULL;
    size_t n_plain = 0;
    const json_t *kwargs = po ? po->template_kwargs : NULL;
    kp_status st = render_chat(s, msgs, tools, &o, kwargs, &text, &len, &plain, &n_plain, &err);
    if (st == KP_OK) out->rewrite_byte = history_rewrite(s, msgs, tools, &o, kwargs, text, len, out->rewrite_line);
    if (st != KP_OK) json_decref(msgs);
    if (st != KP_OK) { /* the renderer's messages start with the field at fault */
        const char *field = !strncmp(err.msg, "tools", 5) ? "tools" : "messages";
        if (st == KP_ERANGE) /* nesting too deep: a bad request, not a long prompt */
            return kp_oai_fail(e, 400, "invalid_request_error", NULL, field, "%s", err.msg);
        kp_oai_from_status(st, &err, field, e);
        return false;
    }
    bool ok = tokenize_after_answer(s, text, len, plain, n_plain, &out->ids, &out->n) ||
              tokenize_prompt(s, text, len, plain, n_plain, &out->ids, &out->n, e);
    free(plain);
    if (ok && po && po->message_starts && s->cfg.message_starts)
        message_starts(s, msgs, tools, &o, kwargs, text, len, out);
    json_decref(msgs);
    if (ok) {
        out->text = text;
        out->text_len = len;
    } else {
        free(text);
    }
    return ok;
}

/* A prompt given as token ids, checked against the vocabulary. */
static bool given_ids(kp_server *s, const json_t *prompt, kp_prompt *out, kp_oai_error *e) {
    size_t k = json_array_size(prompt);
    int32_t *t = malloc(k * sizeof *t);
    if (!t) return kp_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
        const json_t *x = json_array_get(prompt, i);
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || id >= kp_tok_n_vocab(s->v)) {
            free(t);
            return kp_oai_fail(e, 400, "invalid_request_error", NULL, "prompt",
                               "prompt[%zu] is not a token id of this model (0..%d)", i, kp_tok_n_vocab(s->v) - 1);
        }
        t[i] = (int32_t)id;
    }
    out->ids = t;
    out->n = k;
    return true;
}

bool kp_prompt_tokens(kp_server *s, const json_t *prompt, const json_t *messages, const json_t *tools,
                      bool parse_special, const kp_prompt_opts *po, kp_prompt *out, kp_oai_error *e) {
    memset(out, 0, sizeof *out);
    if (messages) return render_messages(s, messages, tools, po, out, e);
    const json_t *p = json_is_string(prompt) ? prompt
                      : json_is_array(prompt) && json_array_size(prompt) == 1 &&
                              json_is_string(json_array_get(prompt, 0))
                          ? json_array_get(prompt, 0)
                          : NULL;
    if (p) {
        kp_tok_range all = {0, json_string_length(p)};
        if (!tokenize_prompt(s, json_string_value(p), json_string_length(p), &all, parse_special ? 0 : 1, &out->ids,
                             &out->n, e))
            return false;
        out->text = strdup(json_string_value(p)); /* NULL (no text in the report) when out of memory */
        out->text_len = out->text ? json_string_length(p) : 0;
        return true;
    }
    if (json_is_array(prompt) && json_array_size(prompt) > 0) return given_ids(s, prompt, out, e);
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, messages ? "messages" : "prompt",
                       "prompt must be a string, an array of one string or a non-empty array of token ids");
}

void kp_prompt_free(kp_prompt *p) {
    free(p->ids);
    free(p->text);
    free(p->msg_starts);
    memset(p, 0, sizeof *p);
}


bool kp_prompt_fits_budget(kp_server *s, uint32_t n, uint32_t max_tokens, bool max_tokens_set,
                           const char *prompt_param, kp_oai_error *e) {
    uint32_t eff;
    kp_error err = {0};
    if (kp_sched_fit(s->sched, n, max_tokens, max_tokens_set, &eff, &err) == KP_OK) return true;
    return kp_oai_fail(e, 400, "invalid_request_error", "kv_budget_exceeded",
                       n > kp_sched_kv_positions(s->sched) ? prompt_param : "max_tokens", "%s", err.msg);
}
