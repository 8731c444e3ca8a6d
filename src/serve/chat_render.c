/*
 * chat_render.c - the renderers of the chat template families, and the
 * entry points kp_chat_render / kp_chat_render_plain (chat.h).
 *
 * Owns no state. chat.c loads and normalizes the conversation (and, for
 * families without a tool syntax, rewrites it into the generic tool
 * format); here one function per family writes the layout its Jinja
 * template writes, in the template's order, each naming the template it
 * follows. The client's text is written through put_client, which
 * records its byte ranges (kp_tok_range) so that the tokenizer treats it
 * as plain text.
 */
#include "serve/chat.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/canon.h"
#include "serve/chat_impl.h"

/* ------------------------------------------------------------------ */
/* Renderers                                                           */

typedef struct {
    const char *bos, *eos, *date;
    bool gen, no_think;
    /* the rendering, and the ranges of it that hold the client's text */
    const kp_buf *out;
    kp_tok_range *plain;
    size_t n_plain, cap_plain;
    bool plain_oom;
} chat_env;

/* Appends text that came from the client (message content, tool
 * definitions, a call's name and arguments) to b. When b is the rendering
 * itself, the range it fills is recorded as plain: kp_tok_encode_plain
 * never turns a control token's text found there into that token, so a
 * message cannot close its own turn with "<|im_end|>" or end the prompt
 * with "</s>"; only the template's markup (written with kp_buf_puts) can. */
static void put_client(kp_buf *b, chat_env *e, const char *s, size_t n) {
    size_t at = b->len;
    kp_buf_put(b, s, n);
    if (b != e->out || n == 0 || b->oom) return;
    if (e->n_plain && e->plain[e->n_plain - 1].start + e->plain[e->n_plain - 1].len == at) {
        e->plain[e->n_plain - 1].len += n; /* adjacent: one range */
        return;
    }
    if (!kp_grow((void **)&e->plain, &e->cap_plain, e->n_plain + 1, sizeof *e->plain)) {
        e->plain_oom = true;
        return;
    }
    e->plain[e->n_plain++] = (kp_tok_range){at, n};
}

#define PUT_CONTENT(b, m) put_client(b, e, (m)->content, (m)->content_len)

/* The client's text s[0..len) without Python's leading and trailing whitespace. */
static void put_trimmed(kp_buf *b, chat_env *e, const char *s, size_t len) {
    chat_span t = kp_chat_py_strip(s, len, true, true);
    put_client(b, e, t.s, t.len);
}

/* teknium/OpenHermes-2.5-Mistral-7B; Qwen/Qwen2-7B-Instruct adds a default
 * system message when the first message is not one. */
static kp_status render_chatml(kp_buf *b, const chat_conv *c, chat_env *e,
                               const char *default_system, kp_error *err) {
    (void)err;
    if (default_system && c->msgs[0].role != ROLE_SYSTEM) {
        kp_buf_puts(b, "<|im_start|>system\n");
        kp_buf_puts(b, default_system);
        kp_buf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < c->n; i++) {
        kp_buf_puts(b, "<|im_start|>");
        kp_buf_puts(b, kp_chat_role_names[c->msgs[i].role]);
        kp_buf_puts(b, "\n");
        PUT_CONTENT(b, &c->msgs[i]);
        kp_buf_puts(b, "<|im_end|>\n");
    }
    if (e->gen) kp_buf_puts(b, "<|im_start|>assistant\n");
    return KP_OK;
}

static const char qwen_tools_intro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char qwen_tools_outro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
static const char qwen25_default_system[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

static void put_qwen_tools(kp_buf *b, chat_env *e, const chat_conv *c) {
    kp_buf_puts(b, qwen_tools_intro);
    for (size_t t = 0; t < c->n_tools; t++) {
        kp_buf_puts(b, "\n");
        put_client(b, e, c->tools[t].text, c->tools[t].len);
    }
    kp_buf_puts(b, qwen_tools_outro);
}

static void put_qwen_call(kp_buf *b, chat_env *e, const chat_call *call) {
    kp_buf_puts(b, "<tool_call>\n{\"name\": \"");
    put_client(b, e, call->name, call->name_len);
    kp_buf_puts(b, "\", \"arguments\": ");
    put_client(b, e, call->args, call->args_len);
    kp_buf_puts(b, "}\n</tool_call>");
}

/* Tool results: consecutive tool messages share one user turn. */
static void put_qwen_tool_result(kp_buf *b, chat_env *e, const chat_conv *c, size_t i) {
    if (i == 0 || c->msgs[i - 1].role != ROLE_TOOL) kp_buf_puts(b, "<|im_start|>user");
    kp_buf_puts(b, "\n<tool_response>\n");
    PUT_CONTENT(b, &c->msgs[i]);
    kp_buf_puts(b, "\n</tool_response>");
    if (i + 1 == c->n || c->msgs[i + 1].role != ROLE_TOOL) kp_buf_puts(b, "<|im_end|>\n");
}

/* Qwen/Qwen2.5-7B-Instruct */
static kp_status render_qwen25(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    (void)err;
    const chat_msg *first = &c->msgs[0];
    bool has_system = first->role == ROLE_SYSTEM;
    kp_buf_puts(b, "<|im_start|>system\n");
    if (has_system) PUT_CONTENT(b, first);
    else kp_buf_puts(b, qwen25_default_system);
    if (c->n_tools) {
        kp_buf_puts(b, "\n\n");
        put_qwen_tools(b, e, c);
    } else {
        kp_buf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_USER || (m->role == ROLE_SYSTEM && i > 0) ||
            (m->role == ROLE_ASSISTANT && !m->n_calls)) {
            kp_buf_puts(b, "<|im_start|>");
            kp_buf_puts(b, kp_chat_role_names[m->role]);
            kp_buf_puts(b, "\n");
            PUT_CONTENT(b, m);
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_ASSISTANT) {
            kp_buf_puts(b, "<|im_start|>assistant");
            if (m->content_len) {
                kp_buf_puts(b, "\n");
                PUT_CONTENT(b, m);
            }
            for (size_t j = 0; j < m->n_calls; j++) {
                kp_buf_puts(b, "\n");
                put_qwen_call(b, e, &m->calls[j]);
            }
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_TOOL) {
            put_qwen_tool_result(b, e, c, i);
        }
    }
    if (e->gen) kp_buf_puts(b, "<|im_start|>assistant\n");
    return KP_OK;
}

/* Qwen/Qwen3-0.6B (the whole Qwen 3 line shares it) */
static kp_status render_qwen3(kp_buf *b, const chat_conv *c, chat_env *e,
                              kp_error *err) {
    (void)err;
    const chat_msg *first = &c->msgs[0];
    if (c->n_tools) {
        kp_buf_puts(b, "<|im_start|>system\n");
        if (first->role == ROLE_SYSTEM) {
            PUT_CONTENT(b, first);
            kp_buf_puts(b, "\n\n");
        }
        put_qwen_tools(b, e, c);
    } else if (first->role == ROLE_SYSTEM) {
        kp_buf_puts(b, "<|im_start|>system\n");
        PUT_CONTENT(b, first);
        kp_buf_puts(b, "<|im_end|>\n");
    }
    /* the last user message that is not a wrapped tool response */
    size_t last_query = c->n - 1;
    for (size_t k = c->n; k-- > 0;) {
        const chat_msg *m = &c->msgs[k];
        if (m->role != ROLE_USER) continue;
        static const char open[] = "<tool_response>", close[] = "</tool_response>";
        bool wrapped = m->content_len >= sizeof open - 1 && m->content_len >= sizeof close - 1 &&
                       !memcmp(m->content, open, sizeof open - 1) &&
                       !memcmp(m->content + m->content_len - (sizeof close - 1), close,
                               sizeof close - 1);
        if (!wrapped) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_USER || (m->role == ROLE_SYSTEM && i > 0)) {
            kp_buf_puts(b, "<|im_start|>");
            kp_buf_puts(b, kp_chat_role_names[m->role]);
            kp_buf_puts(b, "\n");
            PUT_CONTENT(b, m);
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_ASSISTANT) {
            chat_span content = {m->content, m->content_len}, reasoning = {"", 0};
            if (m->reasoning) {
                reasoning = (chat_span){m->reasoning, m->reasoning_len};
            } else if (kp_chat_find(m->content, m->content_len, "</think>")) {
                /* content.split('</think>')[-1].lstrip('\n') */
                const char *last = kp_chat_find_last(m->content, m->content_len, "</think>") + 8;
                content = kp_chat_strip_newlines(last, (size_t)(m->content + m->content_len - last), true,
                                         false);
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *end = kp_chat_find(m->content, m->content_len, "</think>");
                chat_span head =
                    kp_chat_strip_newlines(m->content, (size_t)(end - m->content), false, true);
                const char *open = kp_chat_find_last(head.s, head.len, "<think>");
                if (open) head = (chat_span){open + 7, (size_t)(head.s + head.len - (open + 7))};
                reasoning = kp_chat_strip_newlines(head.s, head.len, true, false);
            }
            kp_buf_puts(b, "<|im_start|>assistant\n");
            if (i > last_query && (i + 1 == c->n || reasoning.len)) {
                chat_span r = kp_chat_strip_newlines(reasoning.s, reasoning.len, true, true);
                chat_span body = kp_chat_strip_newlines(content.s, content.len, true, false);
                kp_buf_puts(b, "<think>\n");
                put_client(b, e, r.s, r.len);
                kp_buf_puts(b, "\n</think>\n\n");
                put_client(b, e, body.s, body.len);
            } else {
                put_client(b, e, content.s, content.len);
            }
            for (size_t j = 0; j < m->n_calls; j++) {
                if (j > 0 || content.len) kp_buf_puts(b, "\n");
                put_qwen_call(b, e, &m->calls[j]);
            }
            kp_buf_puts(b, "<|im_end|>\n");
        } else if (m->role == ROLE_TOOL) {
            put_qwen_tool_result(b, e, c, i);
        }
    }
    if (e->gen) {
        kp_buf_puts(b, "<|im_start|>assistant\n");
        if (e->no_think) kp_buf_puts(b, "<think>\n\n</think>\n\n");
    }
    return KP_OK;
}

static void put_llama3_turn(kp_buf *b, chat_env *e, const char *role, const char *text, size_t len) {
    kp_buf_puts(b, "<|start_header_id|>");
    kp_buf_puts(b, role);
    kp_buf_puts(b, "<|end_header_id|>\n\n");
    put_trimmed(b, e, text, len);
    kp_buf_puts(b, "<|eot_id|>");
}

/* meta-llama/Meta-Llama-3-8B-Instruct */
static kp_status render_llama3(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    (void)err;
    for (size_t i = 0; i < c->n; i++) {
        if (i == 0) kp_buf_puts(b, e->bos);
        put_llama3_turn(b, e, kp_chat_role_names[c->msgs[i].role], c->msgs[i].content,
                        c->msgs[i].content_len);
    }
    if (e->gen) kp_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KP_OK;
}

/* meta-llama/Llama-3.1-8B-Instruct, Llama-3.2-*-Instruct, Llama-3.3-70B-
 * Instruct (tools_in_user_message left at its default, true). */
static kp_status render_llama31(kp_buf *b, const chat_conv *c, chat_env *e,
                                kp_error *err) {
    size_t i = 0;
    kp_buf_puts(b, e->bos);
    kp_buf_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (c->n_tools) kp_buf_puts(b, "Environment: ipython\n");
    kp_buf_puts(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    kp_buf_puts(b, e->date);
    kp_buf_puts(b, "\n\n");
    if (c->msgs[0].role == ROLE_SYSTEM) {
        put_trimmed(b, e, c->msgs[0].content, c->msgs[0].content_len);
        i = 1;
    }
    kp_buf_puts(b, "<|eot_id|>");
    if (c->n_tools) {
        if (i == c->n || c->msgs[i].role != ROLE_USER)
            return kp_fail(err, KP_EINVAL,
                           "messages[%zu]: the llama3.1 chat template puts the tool list into the "
                           "first user message, so one must follow the optional system message",
                           i);
        kp_buf_puts(b, "<|start_header_id|>user<|end_header_id|>\n\n"
                 "Given the following functions, please respond with a JSON for a function call "
                 "with its proper arguments that best answers the given prompt.\n\n"
                 "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
                 "argument name and its value}.Do not use variables.\n\n");
        for (size_t t = 0; t < c->n_tools; t++) {
            put_client(b, e, c->tools[t].text, c->tools[t].len);
            kp_buf_puts(b, "\n\n");
        }
        put_trimmed(b, e, c->msgs[i].content, c->msgs[i].content_len);
        kp_buf_puts(b, "<|eot_id|>");
        i++;
    }
    for (; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->n_calls) {
            if (m->n_calls != 1)
                return kp_fail(err, KP_EINVAL,
                               "messages[%zu].tool_calls: the llama3.1 chat template takes one "
                               "tool call per message, not %zu",
                               i, m->n_calls);
            kp_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            put_client(b, e, m->calls[0].name, m->calls[0].name_len);
            kp_buf_puts(b, "\", \"parameters\": ");
            put_client(b, e, m->calls[0].args, m->calls[0].args_len);
            kp_buf_puts(b, "}<|eot_id|>");
        } else if (m->role == ROLE_TOOL) {
            /* the template writes `content | tojson`: a JSON string */
            json_t *s = json_stringn(m->content, m->content_len);
            if (!s) return kp_fail(err, KP_EINVAL, "messages[%zu].content is not valid UTF-8", i);
            char *quoted = NULL;
            size_t qlen = 0;
            kp_status st = kp_canon_dump(s, &quoted, &qlen, err);
            json_decref(s);
            if (st != KP_OK) return st;
            kp_buf_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            put_client(b, e, quoted, qlen);
            kp_buf_puts(b, "<|eot_id|>");
            free(quoted);
        } else {
            put_llama3_turn(b, e, kp_chat_role_names[m->role], m->content, m->content_len);
        }
    }
    if (e->gen) kp_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KP_OK;
}

/* meta-llama/Llama-2-7b-chat-hf (no generation prompt: "[/INST]" is it) */
static kp_status render_llama2(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    size_t first = c->msgs[0].role == ROLE_SYSTEM ? 1 : 0;
    kp_status st = kp_chat_check_alternation(c, first, KP_CHAT_LLAMA2, err);
    if (st != KP_OK) return st;
    kp_buf merged = {0};
    for (size_t i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        const char *text = m->content;
        size_t len = m->content_len;
        if (i == first && first == 1) {
            kp_buf_puts(&merged, "<<SYS>>\n");
            PUT_CONTENT(&merged, &c->msgs[0]);
            kp_buf_puts(&merged, "\n<</SYS>>\n\n");
            PUT_CONTENT(&merged, m);
            if (merged.oom) break;
            text = merged.data;
            len = merged.len;
        }
        if (m->role == ROLE_USER) {
            kp_buf_puts(b, e->bos);
            kp_buf_puts(b, "[INST] ");
            put_trimmed(b, e, text, len);
            kp_buf_puts(b, " [/INST]");
        } else {
            kp_buf_puts(b, " ");
            put_trimmed(b, e, text, len);
            kp_buf_puts(b, " ");
            kp_buf_puts(b, e->eos);
        }
    }
    bool failed = merged.oom;
    kp_buf_free(&merged);
    return failed ? kp_chat_oom(err) : KP_OK;
}

/* mistralai/Mixtral-8x7B-Instruct-v0.1 and Mistral-7B-Instruct-v0.2 (no
 * generation prompt: "[/INST]" is it) */
static kp_status render_mistral(kp_buf *b, const chat_conv *c, chat_env *e,
                                kp_error *err) {
    size_t first = c->msgs[0].role == ROLE_SYSTEM ? 1 : 0;
    kp_status st = kp_chat_check_alternation(c, first, KP_CHAT_MISTRAL, err);
    if (st != KP_OK) return st;
    kp_buf_puts(b, e->bos);
    for (size_t i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_USER) {
            kp_buf_puts(b, " [INST] ");
            if (i == first && first == 1) {
                PUT_CONTENT(b, &c->msgs[0]);
                kp_buf_puts(b, "\n\n");
            }
            PUT_CONTENT(b, m);
            kp_buf_puts(b, " [/INST]");
        } else {
            kp_buf_puts(b, " ");
            PUT_CONTENT(b, m);
            kp_buf_puts(b, e->eos);
        }
    }
    return KP_OK;
}

/* google/gemma-3-*-it (google/gemma-2-*-it renders the same but refuses a
 * system message) */
static kp_status render_gemma(kp_buf *b, const chat_conv *c, chat_env *e,
                              kp_error *err) {
    size_t first = c->msgs[0].role == ROLE_SYSTEM ? 1 : 0;
    kp_status st = kp_chat_check_alternation(c, first, KP_CHAT_GEMMA, err);
    if (st != KP_OK) return st;
    kp_buf_puts(b, e->bos);
    for (size_t i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        kp_buf_puts(b, m->role == ROLE_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (i == first && first == 1) {
            PUT_CONTENT(b, &c->msgs[0]);
            kp_buf_puts(b, "\n\n");
        }
        put_trimmed(b, e, m->content, m->content_len);
        kp_buf_puts(b, "<end_of_turn>\n");
    }
    if (e->gen) kp_buf_puts(b, "<start_of_turn>model\n");
    return KP_OK;
}

/* microsoft/Phi-3.5-mini-instruct (an empty system message is left out) */
static kp_status render_phi3(kp_buf *b, const chat_conv *c, chat_env *e,
                             kp_error *err) {
    (void)err;
    for (size_t i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (m->role == ROLE_SYSTEM && m->content_len == 0) continue;
        kp_buf_puts(b, "<|");
        kp_buf_puts(b, kp_chat_role_names[m->role]);
        kp_buf_puts(b, "|>\n");
        PUT_CONTENT(b, m);
        kp_buf_puts(b, "<|end|>\n");
    }
    kp_buf_puts(b, e->gen ? "<|assistant|>\n" : e->eos);
    return KP_OK;
}

/* HuggingFaceH4/zephyr-7b-beta */
static kp_status render_zephyr(kp_buf *b, const chat_conv *c, chat_env *e,
                               kp_error *err) {
    (void)err;
    for (size_t i = 0; i < c->n; i++) {
        kp_buf_puts(b, "<|");
        kp_buf_puts(b, kp_chat_role_names[c->msgs[i].role]);
        kp_buf_puts(b, "|>\n");
        PUT_CONTENT(b, &c->msgs[i]);
        kp_buf_puts(b, e->eos);
        kp_buf_puts(b, "\n");
    }
    if (e->gen) kp_buf_puts(b, "<|assistant|>\n");
    return KP_OK;
}

/* ------------------------------------------------------------------ */
/* Entry point                                                         */

kp_status kp_chat_render(kp_chat_family f, const json_t *messages, const json_t *tools,
                         const kp_chat_opts *opts, char **out, size_t *len, kp_error *err) {
    return kp_chat_render_plain(f, messages, tools, opts, out, len, NULL, NULL, err);
}

kp_status kp_chat_render_plain(kp_chat_family f, const json_t *messages, const json_t *tools,
                               const kp_chat_opts *opts, char **out, size_t *len, kp_tok_range **plain,
                               size_t *n_plain, kp_error *err) {
    *out = NULL;
    *len = 0;
    if (plain) *plain = NULL;
    if (n_plain) *n_plain = 0;
    if ((unsigned)f >= KP_CHAT_FAMILY_COUNT || f == KP_CHAT_UNKNOWN)
        return kp_fail(err, KP_EUNSUPPORTED,
                       "unknown chat template family; name one (chatml, qwen2, qwen2.5, qwen3, "
                       "llama3, llama3.1, llama2, mistral, gemma, phi3, zephyr)");
    static const kp_chat_opts defaults = {0};
    if (!opts) opts = &defaults;
    chat_env env = {
        .bos = opts->bos_token ? opts->bos_token : "",
        .eos = opts->eos_token ? opts->eos_token : "",
        .date = opts->date_string ? opts->date_string : "26 Jul 2024",
        .gen = opts->add_generation_prompt,
        .no_think = opts->disable_thinking,
    };
    chat_conv conv;
    kp_status st = kp_chat_conv_load(&conv, messages, tools, err);
    if (st == KP_OK && !kp_chat_family_has_tools(f)) st = kp_chat_generic_tools(&conv, f, err);
    kp_buf b = {0};
    env.out = &b;
    if (st == KP_OK) {
        switch (f) {
        case KP_CHAT_CHATML: st = render_chatml(&b, &conv, &env, NULL, err); break;
        case KP_CHAT_QWEN2:
            st = render_chatml(&b, &conv, &env, "You are a helpful assistant.", err);
            break;
        case KP_CHAT_QWEN25: st = render_qwen25(&b, &conv, &env, err); break;
        case KP_CHAT_QWEN3: st = render_qwen3(&b, &conv, &env, err); break;
        case KP_CHAT_LLAMA3: st = render_llama3(&b, &conv, &env, err); break;
        case KP_CHAT_LLAMA31: st = render_llama31(&b, &conv, &env, err); break;
        case KP_CHAT_LLAMA2: st = render_llama2(&b, &conv, &env, err); break;
        case KP_CHAT_MISTRAL: st = render_mistral(&b, &conv, &env, err); break;
        case KP_CHAT_GEMMA: st = render_gemma(&b, &conv, &env, err); break;
        case KP_CHAT_PHI3: st = render_phi3(&b, &conv, &env, err); break;
        case KP_CHAT_ZEPHYR: st = render_zephyr(&b, &conv, &env, err); break;
        case KP_CHAT_UNKNOWN:
        case KP_CHAT_FAMILY_COUNT: assert(0); break;
        }
    }
    kp_chat_conv_free(&conv);
    if (st == KP_OK && env.plain_oom) st = kp_chat_oom(err);
    if (st != KP_OK) {
        kp_buf_free(&b);
        free(env.plain);
        return st;
    }
    if (!kp_buf_take(&b, out, len)) {
        free(env.plain);
        return kp_chat_oom(err);
    }
    if (plain) {
        *plain = env.plain;
        *n_plain = env.n_plain;
    } else {
        free(env.plain);
    }
    return KP_OK;
}

