/*
 * prompt.c - the prompt of a request as token ids (prompt.h).
 *
 * Owns nothing. Text is tokenized as the model expects a prompt (BOS when
 * the vocabulary wants one); messages are rendered by the chat template
 * with the client's text marked plain (kp_chat_render_plain), so that only
 * the template's markup can produce control tokens.
 */
#include "serve/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "serve/chat.h"
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

/* The prompt of a request body: "prompt" (text or token ids) or "messages"
 * (+ "tools") through the chat template, rendered as po says (NULL: the
 * generation prompt on, thinking on). Only the template's markup may
 * produce control tokens: the client's text in a rendering is tokenized as
 * plain text (kp_chat_render_plain's ranges), and so is a completions
 * prompt unless parse_special asks otherwise. */
bool kp_prompt_tokens(kp_server *s, const json_t *prompt, const json_t *messages, const json_t *tools,
                           bool parse_special, const kp_prompt_opts *po, int32_t **ids, size_t *n, char **text_out,
                           size_t *text_len, kp_oai_error *e) {
    *ids = NULL;
    *n = 0;
    *text_out = NULL;
    *text_len = 0;
    if (messages) {
        if (s->cfg.chat == KP_CHAT_UNKNOWN)
            return kp_oai_fail(e, 400, "invalid_request_error", "no_chat_template", "messages",
                               "the model has no chat template kvpin can render; start the server with "
                               "--chat-template NAME or use /v1/completions");
        kp_chat_opts o = {s->cfg.chat_bos, s->cfg.chat_eos, po ? po->add_generation_prompt : true, NULL,
                          po ? po->disable_thinking : false};
        char *text = NULL;
        size_t len = 0;
        kp_error err = {0};
        kp_tok_range *plain = NULL;
        size_t n_plain = 0;
        kp_status st = kp_chat_render_plain(s->cfg.chat, messages, tools, &o, &text, &len, &plain, &n_plain, &err);
        if (st != KP_OK) { /* the renderer's messages start with the field at fault */
            const char *field = !strncmp(err.msg, "tools", 5) ? "tools" : "messages";
            if (st == KP_ERANGE) /* nesting too deep: a bad request, not a long prompt */
                return kp_oai_fail(e, 400, "invalid_request_error", NULL, field, "%s", err.msg);
            kp_oai_from_status(st, &err, field, e);
            return false;
        }
        bool ok = tokenize_prompt(s, text, len, plain, n_plain, ids, n, e);
        free(plain);
        if (ok) {
            *text_out = text;
            *text_len = len;
        } else {
            free(text);
        }
        return ok;
    }
    const json_t *p = json_is_string(prompt) ? prompt
                      : json_is_array(prompt) && json_array_size(prompt) == 1 &&
                              json_is_string(json_array_get(prompt, 0))
                          ? json_array_get(prompt, 0)
                          : NULL;
    if (p) {
        kp_tok_range all = {0, json_string_length(p)};
        if (!tokenize_prompt(s, json_string_value(p), json_string_length(p), &all, parse_special ? 0 : 1, ids, n, e))
            return false;
        *text_out = strdup(json_string_value(p)); /* NULL (no text in the report) when out of memory */
        *text_len = *text_out ? json_string_length(p) : 0;
        return true;
    }
    if (json_is_array(prompt) && json_array_size(prompt) > 0) {
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
        *ids = t;
        *n = k;
        return true;
    }
    return kp_oai_fail(e, 400, "invalid_request_error", NULL, messages ? "messages" : "prompt",
                       "prompt must be a string, an array of one string or a non-empty array of token ids");
}


bool kp_prompt_fits_budget(kp_server *s, uint32_t n, uint32_t max_tokens, bool max_tokens_set,
                           const char *prompt_param, kp_oai_error *e) {
    uint32_t eff;
    kp_error err = {0};
    if (kp_sched_fit(s->sched, n, max_tokens, max_tokens_set, &eff, &err) == KP_OK) return true;
    return kp_oai_fail(e, 400, "invalid_request_error", "kv_budget_exceeded",
                       n > kp_sched_kv_positions(s->sched) ? prompt_param : "max_tokens", "%s", err.msg);
}
