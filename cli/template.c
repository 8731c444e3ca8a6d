/*
 * template.c - `kvpin template`: a chat-completions request rendered by a
 * chat template with the Jinja interpreter (jinja/jinja.h), the prompt
 * text exactly as the model would see it.
 *
 *   kvpin template -m MODEL.gguf < request.json
 *   kvpin template --chat-template-file FILE [--bos S] [--eos S] < request.json
 *   kvpin template --chat-template NAME [-m MODEL.gguf | --bos S --eos S] < request.json
 *   kvpin template --batch < cases.jsonl
 *
 * The request is normalized and made a context by serve/chat_jinja.c. The
 * template is the model's tokenizer.chat_template, or its
 * tokenizer.chat_template.tool_use variant when the request has tools and
 * the file has one, or FILE; bos_token and eos_token are the model's token
 * texts (--bos/--eos without a model). With --chat-template NAME, kvpin's
 * built-in template of that family renders the request as the server
 * does (serve/chat_tmpl.h: the request checked, tools in the generic
 * format for a family without a tool syntax). The prompt goes to stdout
 * with nothing added, the template's source to stderr. A template that
 * fails (raise_exception included) exits 1 with its message on stderr.
 *
 * --batch renders many cases in one process (the byte-exact check of make
 * test, tools/chat_jinja_check.py): one JSON object a line,
 * {"template": PATH, "request": {...}, "bos": S, "eos": S}, answered by one
 * line each, {"ok": true, "text": T, "client": [[START, LEN], ...]} (the byte
 * ranges of T that came from the messages and tools, kp_jinja_render_client;
 * the check's renders go through the taint path) or {"ok": false, "kind":
 * "TemplateError", "msg": M, "line": L, "col": C}. Templates are compiled
 * once per path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "cli.h"
#include "gguf/gguf.h"
#include "jinja/jinja.h"
#include "serve/chat_jinja.h"
#include "serve/chat_tmpl.h"

enum { O_TEMPLATE_FILE = CLI_OWN, O_TEMPLATE, O_BOS, O_EOS, O_BATCH };
static const cli_opt template_tab[] = {
    CLI_USE(CLI_MODEL),
    {"chat-template", NULL, NULL, "NAME", "a built-in chat template: chatml, qwen2, qwen2.5, qwen3, llama3,\n"
                                          "llama3.1, llama2, mistral, gemma, phi3, zephyr", O_TEMPLATE},
    {"chat-template-file", NULL, NULL, "FILE", "render the Jinja template in FILE instead of the model's", O_TEMPLATE_FILE},
    {"bos", NULL, NULL, "TEXT", "bos_token when no model is given (default empty)", O_BOS},
    {"eos", NULL, NULL, "TEXT", "eos_token when no model is given (default empty)", O_EOS},
    {"batch", NULL, NULL, NULL, "render the JSON-lines cases on stdin (see the source)", O_BATCH},
    {0}};

static void template_usage(FILE *out) {
    fprintf(out, "usage: kvpin template [-m MODEL.gguf] [--chat-template NAME | --chat-template-file FILE] < request.json\n"
                 "Renders the chat template of MODEL (or FILE) on an OpenAI chat-completions\n"
                 "request body (messages, tools, add_generation_prompt, chat_template_kwargs)\n"
                 "and prints the prompt text exactly; the template's source goes to stderr.\n");
    cli_print_options(out, template_tab);
}

static char *gguf_string(const kp_gguf *g, const char *key) {
    kp_gguf_str s = {0};
    if (kp_gguf_get_str(g, key, &s, NULL) != KP_OK || !s.data) return NULL;
    return strndup(s.data, s.len);
}

static char *gguf_token(const kp_gguf *g, const char *id_key) {
    uint32_t id;
    const kp_gguf_value *toks;
    if (!kp_gguf_find(g, id_key) || kp_gguf_get_u32(g, id_key, 0, &id, NULL) != KP_OK) return strdup("");
    if (kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, NULL) != KP_OK || !toks ||
        id >= toks->v.arr.n)
        return strdup("");
    return strndup(toks->v.arr.strs[id].data, toks->v.arr.strs[id].len);
}

static void print_error(const char *what, const kp_jinja_error *e) {
    if (e->kind == KP_JINJA_ERAISED) fprintf(stderr, "kvpin template: %s\n", e->msg);
    else fprintf(stderr, "kvpin template: %s:%d:%d: %s: %s\n", what, e->line, e->col, kp_jinja_kind_name(e->kind), e->msg);
}

/* ---- --batch ---- */
typedef struct { char *path; kp_jinja *t; kp_jinja_error err; } cached;

static json_t *batch_one(const json_t *c, cached **cache, size_t *n_cache) {
    const char *path = json_string_value(json_object_get(c, "template"));
    json_t *ans = json_object();
    if (!path) { json_object_set_new(ans, "ok", json_false()); json_object_set_new(ans, "msg", json_string("no template")); return ans; }
    cached *hit = NULL;
    for (size_t i = 0; i < *n_cache && !hit; i++)
        if (!strcmp((*cache)[i].path, path)) hit = &(*cache)[i];
    if (!hit) {
        cached *grown = realloc(*cache, (*n_cache + 1) * sizeof **cache);
        if (!grown) return ans;
        *cache = grown;
        hit = &(*cache)[(*n_cache)++];
        memset(hit, 0, sizeof *hit);
        hit->path = strdup(path);
        size_t len;
        char *text = cli_read_all(path, &len);
        if (text) kp_jinja_compile(text, len, &hit->t, &hit->err);
        else snprintf(hit->err.msg, sizeof hit->err.msg, "cannot read %s", path);
        free(text);
    }
    static const char *const CLIENT[] = {"messages", "tools", NULL};
    kp_jinja_error e = hit->err;
    kp_buf out = {0};
    kp_jinja_range *ranges = NULL;
    size_t n_ranges = 0;
    json_t *ctx = NULL;
    kp_error ce = {0};
    if (hit->t) {
        if (kp_chatj_context(json_object_get(c, "request"), json_string_value(json_object_get(c, "bos")),
                             json_string_value(json_object_get(c, "eos")), &ctx, &ce) != KP_OK) {
            e.kind = KP_JINJA_EVALUE;
            snprintf(e.msg, sizeof e.msg, "%s", ce.msg);
        } else if (kp_jinja_render_client(hit->t, ctx, CLIENT, &out, &ranges, &n_ranges, &e) == KP_OK) {
            json_object_set_new(ans, "ok", json_true());
            json_object_set_new(ans, "text", json_stringn_nocheck(out.data ? out.data : "", out.len));
            json_t *cr = json_array();
            for (size_t i = 0; i < n_ranges; i++)
                json_array_append_new(cr, json_pack("[I,I]", (json_int_t)ranges[i].start, (json_int_t)ranges[i].len));
            json_object_set_new(ans, "client", cr);
        }
    }
    json_decref(ctx);
    kp_buf_free(&out);
    free(ranges);
    if (!json_object_get(ans, "ok")) {
        json_object_set_new(ans, "ok", json_false());
        json_object_set_new(ans, "kind", json_string(kp_jinja_kind_name(e.kind)));
        json_object_set_new(ans, "msg", json_string(e.msg));
        json_object_set_new(ans, "line", json_integer(e.line));
        json_object_set_new(ans, "col", json_integer(e.col));
    }
    return ans;
}

static int run_batch(void) {
    cached *cache = NULL;
    size_t n_cache = 0, cap = 0;
    char *line = NULL;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        if (!c) { fprintf(stderr, "kvpin template: --batch: %s\n", je.text); rc = 1; break; }
        json_t *ans = batch_one(c, &cache, &n_cache);
        json_dumpf(ans, stdout, JSON_COMPACT | JSON_ENSURE_ASCII);
        fputc('\n', stdout);
        json_decref(ans);
        json_decref(c);
    }
    free(line);
    for (size_t i = 0; i < n_cache; i++) { free(cache[i].path); kp_jinja_free(cache[i].t); }
    free(cache);
    return rc;
}

/* The request rendered by family fam's built-in template, as the server
 * renders it, to stdout; 0, or 1 after a message. */
static int render_builtin(kp_chat_family fam, const json_t *req, const char *bos, const char *eos) {
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    char *out = NULL;
    size_t len = 0;
    const json_t *agp = json_object_get(req, "add_generation_prompt");
    kp_chat_opts o = {agp ? json_is_true(agp) : true, false};
    kp_status st = kp_chat_tmpl_builtin(fam, bos, eos, &t, &err);
    if (st == KP_OK)
        st = kp_chat_tmpl_render(t, json_object_get(req, "messages"), json_object_get(req, "tools"), &o,
                                 json_object_get(req, "chat_template_kwargs"), &out, &len, NULL, NULL, &err);
    kp_chat_tmpl_free(t);
    if (st != KP_OK) {
        fprintf(stderr, "kvpin template: %s\n", err.msg);
        return 1;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* The template text, its source name and bos/eos, from the model or the options. */
static bool load_template(const char *model, const char *file, bool tools, char **text, size_t *len, char **bos,
                          char **eos, char *source, size_t source_cap) {
    if (model) {
        kp_gguf *g;
        kp_error err = {0};
        if (kp_gguf_open(&g, model, &err) != KP_OK) { fprintf(stderr, "kvpin template: %s\n", err.msg); return false; }
        free(*bos);
        free(*eos);
        *bos = gguf_token(g, "tokenizer.ggml.bos_token_id");
        *eos = gguf_token(g, "tokenizer.ggml.eos_token_id");
        if (!file) {
            const char *key = "tokenizer.chat_template.tool_use";
            *text = tools ? gguf_string(g, key) : NULL;
            if (!*text) *text = gguf_string(g, key = "tokenizer.chat_template");
            snprintf(source, source_cap, "%s: %s", model, key);
            if (*text) *len = strlen(*text);
        }
        kp_gguf_close(g);
        if (!file && !*text) { fprintf(stderr, "kvpin template: %s has no tokenizer.chat_template\n", model); return false; }
    }
    if (file) {
        *text = cli_read_all(file, len);
        snprintf(source, source_cap, "%s", file);
        if (!*text) return false;
    }
    return true;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *name = NULL;
    char *bos = strdup(""), *eos = strdup("");
    bool batch = false;
    cli_args a;
    cli_args_init(&a, "template", template_tab, template_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == CLI_STOP) { free(bos); free(eos); return a.rc; }
        if (k == CLI_MODEL) model = a.val;
        else if (k == O_TEMPLATE_FILE) file = a.val;
        else if (k == O_TEMPLATE) name = a.val;
        else if (k == O_BOS) { free(bos); bos = strdup(a.val); }
        else if (k == O_EOS) { free(eos); eos = strdup(a.val); }
        else if (k == O_BATCH) batch = true;
    }
    if (!cli_args_no_operands(&a)) { free(bos); free(eos); return 2; }
    if (batch) { free(bos); free(eos); return run_batch(); }
    kp_chat_family fam = name ? kp_chat_family_from_name(name) : KP_CHAT_UNKNOWN;
    if (name && (fam == KP_CHAT_UNKNOWN || file)) {
        fprintf(stderr, "kvpin template: %s\n", file ? "--chat-template and --chat-template-file exclude each other"
                                                     : "unknown --chat-template (see kvpin template --help)");
        free(bos);
        free(eos);
        return 2;
    }
    if (!model && !file && !name) model = cli_default_model();

    size_t len = 0;
    char *body = cli_read_all("-", &len);
    json_error_t je;
    json_t *req = body ? json_loadb(body, len, JSON_ALLOW_NUL, &je) : NULL;
    free(body);
    if (!req) { fprintf(stderr, "kvpin template: <stdin>:%d:%d: %s\n", je.line, je.column, je.text); free(bos); free(eos); return 1; }
    char *text = NULL, source[1024];
    size_t tlen = 0;
    int rc = 1;
    json_t *ctx = NULL;
    kp_jinja *t = NULL;
    kp_jinja_error e;
    kp_error ce = {0};
    kp_buf out = {0};
    if (name) { /* the built-in text, with the model's bos/eos when a model is given */
        kp_gguf *g = NULL;
        if (model && kp_gguf_open(&g, model, &ce) != KP_OK) {
            fprintf(stderr, "kvpin template: %s\n", ce.msg);
            goto done;
        }
        if (g) {
            free(bos);
            free(eos);
            bos = gguf_token(g, "tokenizer.ggml.bos_token_id");
            eos = gguf_token(g, "tokenizer.ggml.eos_token_id");
            kp_gguf_close(g);
        }
        fprintf(stderr, "built-in %s\n", kp_chat_family_name(fam));
        rc = render_builtin(fam, req, bos, eos);
        goto done;
    }
    if (!load_template(model, file, kp_chatj_has_tools(req), &text, &tlen, &bos, &eos, source, sizeof source)) goto done;
    fprintf(stderr, "%s\n", source);
    if (kp_chatj_context(req, bos, eos, &ctx, &ce) != KP_OK) { fprintf(stderr, "kvpin template: %s\n", ce.msg); goto done; }
    if (kp_jinja_compile(text, tlen, &t, &e) != KP_OK || kp_jinja_render(t, ctx, &out, &e) != KP_OK) {
        print_error(source, &e);
        goto done;
    }
    fwrite(out.data ? out.data : "", 1, out.len, stdout);
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    kp_buf_free(&out);
    kp_jinja_free(t);
    json_decref(ctx);
    json_decref(req);
    free(text);
    free(bos);
    free(eos);
    return rc;
}
