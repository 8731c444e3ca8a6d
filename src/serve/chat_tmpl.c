/*
 * chat_tmpl.c - the server's chat template as Jinja text (chat_tmpl.h).
 *
 * Owns the compiled template(s), copies of the BOS/EOS texts and what the
 * text says about the family (read once, at kp_chat_tmpl_new). A render
 * turns the messages into a chat-completions body, that body into the
 * template's context (chat_jinja.c: the same normalization `kvpin
 * template` applies), and renders it with "messages" and "tools" as client
 * text, so that *plain covers every byte they gave the prompt. A built-in
 * template (kp_chat_tmpl_builtin) is the same with its text from
 * chat_builtin.h (the table the Makefile generates from
 * src/serve/templates/), its family named rather than guessed, and every
 * request checked by kp_chat_check (chat.h) before it is rendered.
 */
#include "serve/chat_tmpl.h"

#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"
#include "serve/chat_builtin.h"
#include "serve/chat_jinja.h"
#include "serve/harmony.h"
#include "serve/toolsyn.h"

struct kp_chat_tmpl {
    kp_jinja *main, *tool_use; /* tool_use NULL: main serves requests with tools too */
    char *bos, *eos;
    kp_chat_family family;
    bool think;
    bool harmony;      /* it renders OpenAI harmony (harmony.h): replies are read as its messages */
    char *text; /* main's text, NUL-terminated (kp_chat_tmpl_uses) */
    kp_toolsyn *calls; /* the template's own tool-call syntax, or NULL (why_calls says why) */
    bool generic;      /* the template renders no tools: they go in kvpin's generic format (chat.h) */
    bool builtin;      /* one of kvpin's own texts (chat_builtin.h): requests checked as chat.h says */
    char why_calls[128];
};

/* kp_toolsyn_render_fn: a probe body rendered as a request with tools. */
static kp_status probe_render(void *ctx, const json_t *body, char **out, size_t *len) {
    const kp_chat_tmpl *t = ctx;
    json_t *c = NULL;
    kp_error err;
    kp_status st = kp_chatj_context(body, t->bos, t->eos, &c, &err);
    if (st != KP_OK) return st;
    kp_buf b = {0};
    kp_jinja_error e;
    st = kp_jinja_render(t->tool_use ? t->tool_use : t->main, c, &b, &e);
    json_decref(c);
    if (st == KP_OK && !kp_buf_take(&b, out, len)) st = KP_ENOMEM;
    kp_buf_free(&b);
    return st;
}

static kp_status compile(const char *src, size_t len, const char *what, kp_jinja **out, kp_error *err) {
    kp_jinja_error e;
    kp_status st = kp_jinja_compile(src, len, out, &e);
    if (st == KP_OK) return KP_OK;
    if (st == KP_ENOMEM) return kp_fail(err, KP_ENOMEM, "out of memory");
    return kp_fail(err, st, "%sline %d, column %d: %s", what, e.line, e.col, e.msg);
}

static char *dup_or_empty(const char *s) { return strdup(s ? s : ""); }

kp_status kp_chat_tmpl_new(const char *text, size_t len, const char *tool_text, size_t tool_len, const char *bos,
                           const char *eos, kp_chat_tmpl **out, kp_error *err) {
    *out = NULL;
    kp_chat_tmpl *t = calloc(1, sizeof *t);
    if (!t || !(t->bos = dup_or_empty(bos)) || !(t->eos = dup_or_empty(eos)) || !(t->text = malloc(len + 1))) {
        kp_chat_tmpl_free(t);
        return kp_fail(err, KP_ENOMEM, "out of memory");
    }
    memcpy(t->text, text, len);
    t->text[len] = 0;
    kp_status st = compile(text, len, "", &t->main, err);
    if (st == KP_OK && tool_text) st = compile(tool_text, tool_len, "tool_use template: ", &t->tool_use, err);
    if (st != KP_OK) {
        kp_chat_tmpl_free(t);
        return st;
    }
    t->family = kp_chat_detect(t->text);
    if (t->family == KP_CHAT_UNKNOWN) t->family = strstr(t->text, "<tool_call>") ? KP_CHAT_QWEN25 : KP_CHAT_CHATML;
    t->think = strstr(t->text, "<think>") != NULL;
    bool oom = false;
    t->harmony = kp_harmony_detect(probe_render, t, &oom); /* by what it renders, not by its name */
    if (oom) {
        kp_chat_tmpl_free(t);
        return kp_fail(err, KP_ENOMEM, "out of memory");
    }
    bool renders_tools = false;
    st = kp_toolsyn_learn(probe_render, t, &t->calls, &renders_tools, t->why_calls, sizeof t->why_calls, err);
    if (st != KP_OK) {
        kp_chat_tmpl_free(t);
        return st;
    }
    /* a template blind to tools gets them in the generic format, written
     * as plain messages; its replies are read by the generic rules */
    t->generic = !t->calls && !renders_tools;
    if (t->generic && kp_chat_family_has_tools(t->family)) t->family = KP_CHAT_CHATML;
    *out = t;
    return KP_OK;
}

const char *kp_chat_builtin_text(kp_chat_family f, size_t *len) {
    const char *name = kp_chat_family_name(f);
    for (const kp_embedded *e = kp_chat_builtins; e->name; e++)
        if (!strcmp(e->name, name)) {
            if (len) *len = e->size;
            return (const char *)e->bytes;
        }
    return NULL;
}

kp_status kp_chat_tmpl_builtin(kp_chat_family f, const char *bos, const char *eos, kp_chat_tmpl **out,
                               kp_error *err) {
    *out = NULL;
    size_t len = 0;
    const char *text = kp_chat_builtin_text(f, &len);
    if (!text)
        return kp_fail(err, KP_EUNSUPPORTED,
                       "unknown chat template family; name one (chatml, qwen2, qwen2.5, qwen3, llama3, llama3.1, "
                       "llama2, mistral, gemma, phi3, zephyr)");
    kp_status st = kp_chat_tmpl_new(text, len, NULL, 0, bos, eos, out, err);
    if (st != KP_OK) return st;
    (*out)->family = f; /* named, not guessed from the text */
    (*out)->builtin = true;
    return KP_OK;
}

void kp_chat_tmpl_free(kp_chat_tmpl *t) {
    if (!t) return;
    kp_jinja_free(t->main);
    kp_jinja_free(t->tool_use);
    free(t->bos);
    free(t->eos);
    free(t->text);
    kp_toolsyn_free(t->calls);
    free(t);
}

/* The chat-completions body the template's context is built from. */
static json_t *request_body(const json_t *messages, const json_t *tools, const kp_chat_opts *o,
                            const json_t *kwargs) {
    json_t *r = json_object();
    if (!r) return NULL;
    json_object_set(r, "messages", (json_t *)messages);
    if (tools && !json_is_null(tools)) json_object_set(r, "tools", (json_t *)tools);
    json_object_set_new(r, "add_generation_prompt", json_boolean(o && o->add_generation_prompt));
    json_t *kw = json_is_object(kwargs) ? json_copy((json_t *)kwargs) : json_object();
    if (kw && o && o->disable_thinking) json_object_set_new(kw, "enable_thinking", json_false());
    if (!kw || json_object_set_new(r, "chat_template_kwargs", kw) != 0) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* Harmony history: an assistant message with tool calls, reasoning and
 * content (a preamble) keeps its reasoning, which gpt-oss's template renders
 * as the analysis message before the call, and loses its content, which
 * the template would render in the same place and refuses beside the
 * reasoning (the chain of thought is what the model reads back before a
 * call, as OpenAI's harmony guide has it). A new array, or NULL when no
 * message needs it (or memory ran out: *oom). */
static json_t *harmony_history(const json_t *messages, bool *oom) {
    json_t *out = NULL;
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        const json_t *rc = json_object_get(m, "reasoning_content"), *c = json_object_get(m, "content");
        const json_t *calls = json_object_get(m, "tool_calls");
        bool strip = json_is_string(rc) && json_string_length(rc) && json_array_size(calls) &&
                     ((json_is_string(c) && json_string_length(c)) || json_array_size(c));
        if (!strip) continue;
        if (!out && !(out = json_deep_copy(messages))) break;
        json_object_set_new(json_array_get(out, i), "content", json_string(""));
    }
    *oom = !out && i < json_array_size(messages);
    return out;
}

static kp_status render_fail(const kp_jinja_error *e, kp_error *err) {
    if (e->kind == KP_JINJA_ERAISED) return kp_fail(err, KP_EINVAL, "%s", e->msg);
    return kp_fail(err, e->code ? e->code : KP_EINVAL, "the chat template failed at line %d, column %d: %s: %s",
                   e->line, e->col, kp_jinja_kind_name(e->kind), e->msg);
}

/* The interpreter's ranges as the tokenizer's (the same two sizes). */
static kp_status to_tok_ranges(const kp_jinja_range *r, size_t n, kp_tok_range **plain, size_t *n_plain,
                               kp_error *err) {
    *plain = NULL;
    *n_plain = 0;
    if (!n) return KP_OK;
    kp_tok_range *p = malloc(n * sizeof *p);
    if (!p) return kp_fail(err, KP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) p[i] = (kp_tok_range){r[i].start, r[i].len};
    *plain = p;
    *n_plain = n;
    return KP_OK;
}

/* The template's variables for a request (*ctx, a new reference) and the
 * compiled text that renders it (*j). */
static kp_status context_for(const kp_chat_tmpl *t, const json_t *messages, const json_t *tools,
                             const kp_chat_opts *opts, const json_t *kwargs, json_t **ctx, const kp_jinja **j,
                             kp_error *err) {
    *ctx = NULL;
    json_t *generic = NULL;
    if (t->builtin) { /* kvpin's own texts refuse what the C checks refuse, with their messages */
        kp_status cs = kp_chat_check(t->family, messages, tools, err);
        if (cs != KP_OK) return cs;
    }
    if (t->generic && kp_chat_tool_traffic(messages, tools)) {
        kp_status gs = kp_chat_generic_messages(t->family, messages, tools, &generic, err);
        if (gs != KP_OK) return gs;
        messages = generic;
        tools = NULL;
    }
    bool oom = false;
    json_t *history = t->harmony && json_is_array(messages) ? harmony_history(messages, &oom) : NULL;
    if (history) messages = history;
    json_t *body = oom ? NULL : request_body(messages, tools, opts, kwargs);
    json_decref(generic);
    json_decref(history);
    if (!body) return kp_fail(err, KP_ENOMEM, "out of memory");
    kp_status st = kp_chatj_context(body, t->bos, t->eos, ctx, err);
    json_decref(body);
    if (st != KP_OK) return st;
    *j = t->tool_use && kp_chatj_has_tools(*ctx) ? t->tool_use : t->main;
    return KP_OK;
}

int kp_chat_tmpl_line_at(const kp_chat_tmpl *t, const json_t *messages, const json_t *tools,
                         const kp_chat_opts *opts, const json_t *kwargs, size_t byte) {
    json_t *ctx = NULL;
    const kp_jinja *j = NULL;
    kp_error err;
    int line = 0;
    if (context_for(t, messages, tools, opts, kwargs, &ctx, &j, &err) == KP_OK) {
        kp_jinja_error e;
        if (kp_jinja_line_at(j, ctx, byte, &line, &e) != KP_OK) line = 0;
    }
    json_decref(ctx);
    return line;
}

kp_status kp_chat_tmpl_render(const kp_chat_tmpl *t, const json_t *messages, const json_t *tools,
                              const kp_chat_opts *opts, const json_t *kwargs, char **out, size_t *len,
                              kp_tok_range **plain, size_t *n_plain, kp_error *err) {
    static const char *const client[] = {"messages", "tools", NULL};
    *out = NULL;
    *len = 0;
    if (plain) { *plain = NULL; *n_plain = 0; }
    json_t *ctx = NULL;
    const kp_jinja *j = NULL;
    kp_status st = context_for(t, messages, tools, opts, kwargs, &ctx, &j, err);
    if (st != KP_OK) return st;
    kp_buf b = {0};
    kp_jinja_range *r = NULL;
    size_t nr = 0;
    kp_jinja_error e;
    st = kp_jinja_render_client(j, ctx, client, &b, &r, &nr, &e);
    json_decref(ctx);
    if (st != KP_OK) {
        kp_buf_free(&b);
        return render_fail(&e, err);
    }
    if (plain) st = to_tok_ranges(r, nr, plain, n_plain, err);
    free(r);
    if (st == KP_OK && !kp_buf_take(&b, out, len)) st = kp_fail(err, KP_ENOMEM, "out of memory");
    kp_buf_free(&b);
    if (st != KP_OK && plain) {
        free(*plain);
        *plain = NULL;
        *n_plain = 0;
    }
    return st;
}

kp_chat_family kp_chat_tmpl_family(const kp_chat_tmpl *t) { return t->family; }

const kp_reasoning_markers *kp_chat_tmpl_reasoning(const kp_chat_tmpl *t) {
    static const kp_reasoning_markers think = {"<think>", "</think>", false};
    static const kp_reasoning_markers harmony = {"<|channel|>analysis<|message|>", "<|end|>", true};
    return t->harmony ? &harmony : t->think ? &think : NULL;
}

bool kp_chat_tmpl_harmony(const kp_chat_tmpl *t) { return t->harmony; }

bool kp_chat_tmpl_uses(const kp_chat_tmpl *t, const char *name) { return strstr(t->text, name) != NULL; }

const kp_toolsyn *kp_chat_tmpl_calls(const kp_chat_tmpl *t, const char **why) {
    if (why) *why = t->why_calls;
    return t->calls;
}

const char *kp_chat_tmpl_text(const kp_chat_tmpl *t) { return t->text; }

const char *kp_chat_tmpl_bos(const kp_chat_tmpl *t) { return t->bos; }

const char *kp_chat_tmpl_eos(const kp_chat_tmpl *t) { return t->eos; }
