/*
 * serve.c - `kvpin serve`: load a model, size the KV budget, start the
 * scheduler and the HTTP server, wait for SIGINT/SIGTERM, shut down.
 *
 * The KV budget, unless --kv-budget says otherwise:
 *
 *   parallel x (ctx + block) positions x bytes per token   (every sequence
 *   can reach the full context, plus one partial block each for
 *   copy-on-write), plus the same again for cached prefixes, and for a
 *   model with recurrent layers the state snapshots of every sequence
 *   (kp_eng_state_room: one every --state-every positions and two ends)
 *   twice too, capped at half of the machine's RAM (then a note says how
 *   many full-context sequences fit).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "serve/chat_tmpl.h"
#include "cli.h"
#include "cache/blockrec.h"
#include "engine/engine.h"
#include "serve/scheduler.h"
#include "serve/server.h"
#include "serve/volatile.h"
#include "base/threadpool.h"

enum {
    O_API_KEY = CLI_OWN, O_API_KEY_FILE, O_CHAT_TEMPLATE, O_CHAT_TEMPLATE_FILE, O_QUEUE, O_PREFILL_CHUNK, O_MAX_BODY, O_TIMEOUT,
    O_ALIAS, O_QUIET, O_REQUEST_TIMEOUT, O_MAX_CONNECTIONS, O_MAX_PER_ADDRESS, O_STRICT_API, O_NO_DASHBOARD,
    O_PIN_TTL_SCALE, O_VOLATILE_PREFIX, O_KEEP_VOLATILE, O_MAX_TOKENS_CAP, O_REASONING_FORMAT,
    O_ALLOWED_HOSTS, O_CORS_ORIGIN, O_CACHE_KEY_FILE, O_ANSWER_MEMORY, O_LOG_PROMPTS, O_POOLING
};

#define MAX_HOST_RULES 64

static const cli_opt serve_tab[] = {
    CLI_USE(CLI_MODEL), CLI_USE(CLI_HOST), CLI_USE(CLI_PORT), CLI_USE(CLI_PARALLEL), CLI_USE(CLI_CTX_SIZE),
    CLI_USE(CLI_THREADS), CLI_USE(CLI_KV_BUDGET), CLI_USE(CLI_WINDOW_BUDGET), CLI_USE(CLI_STATE_EVERY), CLI_USE(CLI_KV_TYPE), CLI_USE(CLI_KV_TYPE_K), CLI_USE(CLI_KV_TYPE_V), CLI_USE(CLI_KV_BLOCK),
    CLI_USE(CLI_NO_PREFIX_CACHE), CLI_USE(CLI_NO_REPACK), CLI_USE(CLI_ATTN_PRECISION),
    {"api-key", NULL, NULL, "KEY", "require \"Authorization: Bearer KEY\"; other users can read it in\n"
                                   "ps: prefer --api-key-file or $KVPIN_API_KEY", O_API_KEY},
    {"api-key-file", NULL, NULL, "FILE", "the API key is the first line of FILE", O_API_KEY_FILE},
    {"chat-template", NULL, NULL, "NAME", "a built-in chat template: chatml, qwen2, qwen2.5, qwen3, llama3,\n"
                                          "llama3.1, llama2, mistral, gemma, phi3, zephyr", O_CHAT_TEMPLATE},
    {"chat-template-file", NULL, NULL, "FILE", "render chat with the Jinja template in FILE", O_CHAT_TEMPLATE_FILE},
    {"alias", "a", NULL, "NAME", "the model id /v1/models reports (default: the file name)", O_ALIAS},
    {"queue", NULL, NULL, "N", "requests that may wait for a sequence (more: 503)", O_QUEUE},
    {"prefill-chunk", NULL, NULL, "N", "prompt tokens prefilled per step while others decode", O_PREFILL_CHUNK},
    {"max-body", NULL, NULL, "BYTES", "largest request body (more: 413)", O_MAX_BODY},
    {"timeout", "to", NULL, "S", "seconds an idle connection is kept", O_TIMEOUT},
    {"request-timeout", NULL, NULL, "S", "seconds a request's head and body may take to arrive, from the\n"
                                         "connection's start or its previous answer (slow clients are cut)",
     O_REQUEST_TIMEOUT},
    {"max-connections", NULL, NULL, "N", "open connections at most (more are refused)", O_MAX_CONNECTIONS},
    {"max-per-address", NULL, NULL, "N", "open connections from one client address at most",
     O_MAX_PER_ADDRESS},
    {"strict-api", NULL, NULL, NULL, "refuse unknown request fields (400) instead of ignoring them and\n"
                                     "naming them in the x-kvpin-ignored-fields header", O_STRICT_API},
    {"quiet", NULL, NULL, NULL, "no request log and no HTTP-library messages on stderr", O_QUIET},
    {"no-dashboard", NULL, NULL, NULL, "no cache dashboard page at GET / and /dashboard (404)", O_NO_DASHBOARD},
    CLI_USE(CLI_CACHE_DIR), CLI_USE(CLI_CACHE_DISK_BUDGET), CLI_USE(CLI_CACHE_REDIS),
    CLI_USE(CLI_CACHE_REDIS_TIMEOUT),
    {"pin-ttl-scale", NULL, NULL, "X", "multiply cache_control TTLs by X (at least 1 s; for tests: 0.004\n"
                                       "makes \"5m\" one second)", O_PIN_TTL_SCALE},
    {"volatile-prefix", NULL, NULL, "REGEX", "leave out of the prompt what REGEX (PCRE2) matches at the start of\n"
                                             "a system text: a client's per-session header (repeatable)",
     O_VOLATILE_PREFIX},
    {"keep-volatile", NULL, NULL, NULL, "keep the known clients' per-session headers in the prompt (Claude\n"
                                        "Code's x-anthropic-billing-header is left out by default)",
     O_KEEP_VOLATILE},
    {"max-tokens-cap", NULL, NULL, "N", "every generation's max_tokens at most N, whatever the request asks\n"
                                        "(a slow machine, or a random-weight model behind an agent)",
     O_MAX_TOKENS_CAP},
    {"answer-memory", NULL, NULL, "SIZE", "remember this much of kvpin's answers as the tokens the model wrote,\n"
                                          "so that a conversation sent back reuses every one of them (default\n"
                                          "64M; 0: off)",
     O_ANSWER_MEMORY},
    {"pooling", NULL, NULL, "MODE", "how /v1/embeddings pools a text's hidden states: mean (default)\n"
                                     "or last (the last position's)", O_POOLING},
    {"log-prompts", NULL, NULL, "FILE", "append each computed prompt to FILE as a JSON line {time, api, key,\n"
                                        "prompt_tokens, prompt}, the log `kvpin doctor FILE` reads (it holds\n"
                                        "the clients' text: keep it private)",
     O_LOG_PROMPTS},
    {"reasoning-format", NULL, NULL, "FORMAT", "a reasoning model's thinking: auto (default; deepseek is the same)\n"
                                               "apart from the content (reasoning_content, thinking blocks,\n"
                                               "reasoning items), none: left in the content as written",
     O_REASONING_FORMAT},
    {"allowed-hosts", NULL, NULL, "LIST", "Host names answered besides IP addresses, localhost, the --host\n"
                                          "name and the machine's (comma-separated, repeatable; \".d.com\":\n"
                                          "d.com and its subdomains; \"*\": any; others get 421)",
     O_ALLOWED_HOSTS},
    {"cache-key-file", NULL, NULL, "FILE", "seal every disk and Redis record with a MAC under this key (32\n"
                                           "bytes, or 64 hex digits: openssl rand -hex 32) and accept only\n"
                                           "records sealed with it: the store need not be trusted", O_CACHE_KEY_FILE},
    {"cors-origin", NULL, NULL, "ORIGIN", "let web pages of ORIGIN (\"https://app.example\", repeatable; \"*\":\n"
                                          "any) read answers (CORS); none by default", O_CORS_ORIGIN},
    {0},
};

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: kvpin serve [options]\n"
            "An OpenAI-compatible HTTP server (POST /v1/completions, /v1/chat/completions, GET /v1/models,\n"
            "/health, /metrics, /v1/cache, POST /v1/cache/probe, /v1/cache/pin, DELETE /v1/cache/pin/ID,\n"
            "POST /tokenize, /detokenize) with a live cache dashboard at GET / (its data: GET /v1/cache/events).\n"
            "It also speaks Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) and OpenAI's\n"
            "Responses API (POST /v1/responses, GET and DELETE /v1/responses/ID).\n"
            "stderr gets one line per request (see README.md) unless --quiet.\n");
    cli_print_options(f, serve_tab);
    fprintf(f,
            "Defaults: the bundled model, --host 127.0.0.1, --port 8080, -np 4, -c min(training context,\n"
            "4096), --kv-budget room for np x ctx positions plus as much again for cached prefixes (and a\n"
            "recurrent model's state snapshots likewise; at most half of RAM), --kv-type f16, --kv-block 16, --queue 64, --prefill-chunk 256, --max-body 8M,\n"
            "--timeout 60, --request-timeout 30, --max-connections 1024, --max-per-address 64.\n"
            "--port 0 picks a free port (the URL is printed on stderr). Chat prompts are the model's own\n"
            "tokenizer.chat_template (its tool_use variant for requests with tools) run as Jinja; a model\n"
            "without one gets chatml. Templates that print the date (strftime_now) see SOURCE_DATE_EPOCH\n"
            "when it is set, else the day the server started (UTC midnight), so prompts stay cacheable.\n"
            "API key: --api-key, else --api-key-file, else $KVPIN_API_KEY; none of them: no key needed.\n"
            "With a key, every request but GET /health needs it (401 before any other answer).\n");
}

/* The first line of path, trailing whitespace dropped, into a malloc'd
 * string; NULL and a message when the file cannot be read or the line is
 * empty. */
static char *read_key_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvpin serve: cannot read --api-key-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char buf[4097];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    bool err = ferror(f);
    struct stat st;
    bool shared = fstat(fileno(f), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO));
    fclose(f);
    buf[n] = 0;
    size_t len = strcspn(buf, "\n");
    while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t' || buf[len - 1] == '\r')) len--;
    if (err || len == 0 || len == sizeof buf - 1) {
        fprintf(stderr, "kvpin serve: --api-key-file %s: %s\n", path,
                err ? "read error" : len == 0 ? "the first line is empty (it must hold the key)"
                                              : "the first line is longer than 4096 bytes");
        return NULL;
    }
    if (shared)
        fprintf(stderr, "kvpin serve: note: --api-key-file %s can be read by other users (chmod 600 it)\n", path);
    buf[len] = 0;
    return strdup(buf);
}

/* The token's text, or "" (for chat templates' bos_token / eos_token). */
static const char *token_text(const kp_tok_vocab *v, int32_t id) {
    size_t len;
    const char *t = id >= 0 ? kp_tok_text(v, id, &len) : NULL;
    return t ? t : "";
}

/* The API key: --api-key (arg), else the first line of --api-key-file
 * (file), else $KVPIN_API_KEY; *out NULL when none is given. A file given
 * is read even when --api-key wins, so a broken one is always reported.
 * False, with a message, on an empty key, an unreadable file or no memory. */
static bool api_key_of(const char *arg, const char *file, char **out) {
    const char *env = getenv("KVPIN_API_KEY");
    char *from_file = file ? read_key_file(file) : NULL;
    *out = NULL;
    if (file && !from_file) return false;
    if (arg && !*arg) {
        fprintf(stderr, "kvpin serve: --api-key must not be empty\n");
        free(from_file);
        return false;
    }
    if (!arg && !file && env && !*env) {
        fprintf(stderr, "kvpin serve: KVPIN_API_KEY is set but empty: unset it, or set it to the key\n");
        return false;
    }
    if (arg) {
        free(from_file);
        *out = strdup(arg);
    } else {
        *out = from_file ? from_file : env ? strdup(env) : NULL;
    }
    if ((arg || file || env) && !*out) {
        fprintf(stderr, "kvpin serve: out of memory\n");
        return false;
    }
    return true;
}

/* The cache tiers' incidents (Redis down, back), one line each. */
static void tier_log(void *ctx, const char *msg) {
    (void)ctx;
    fprintf(stderr, "kvpin serve: %s\n", msg);
}

/* The model's template text under key (malloc'd), or NULL when it has none. */
static char *gguf_template(const kp_gguf *g, const char *key, size_t *len) {
    kp_gguf_str t;
    kp_error e;
    if (kp_gguf_get_str(g, key, &t, &e) != KP_OK || t.len == 0) return NULL;
    char *txt = malloc(t.len + 1);
    if (!txt) return NULL;
    memcpy(txt, t.data, t.len);
    txt[t.len] = 0;
    *len = t.len;
    return txt;
}

/* The built-in template of family fam (a message when it fails: out of
 * memory only). */
static kp_chat_tmpl *builtin_template(kp_chat_family fam, const char *bos, const char *eos) {
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    if (kp_chat_tmpl_builtin(fam, bos, eos, &t, &err) != KP_OK)
        fprintf(stderr, "kvpin serve: the built-in %s chat template: %s\n", kp_chat_family_name(fam), err.msg);
    return t;
}

/* The template chat renders: the built-in one named NAME, else FILE, else
 * the model's tokenizer.chat_template with its tool_use variant; when the
 * model's does not compile, the built-in family it looks like
 * (kp_chat_detect; none: NULL, chat answers 400), and without one
 * chatml's. *failed (after a message) when FILE cannot be read or compiled.
 * Without SOURCE_DATE_EPOCH, strftime_now sees the day the server started. */
static kp_chat_tmpl *chat_template(const kp_gguf *g, kp_chat_family named, const char *file, const char *bos,
                                   const char *eos, bool *failed, char *name, size_t name_size) {
    *failed = false;
    snprintf(name, name_size, "built-in %s", kp_chat_family_name(named));
    if (named != KP_CHAT_UNKNOWN) return builtin_template(named, bos, eos);
    snprintf(name, name_size, "%s", file ? file : "the model's");
    size_t len = 0, tool_len = 0;
    char *text = file ? cli_read_all(file, &len) : gguf_template(g, "tokenizer.chat_template", &len);
    char *tool = file ? NULL : gguf_template(g, "tokenizer.chat_template.tool_use", &tool_len);
    kp_chat_tmpl *t = NULL;
    kp_error err = {0};
    *failed = file && !text;
    kp_chat_family fam = KP_CHAT_CHATML; /* no template at all: ChatML, as llama.cpp's server does */
    if (text && kp_chat_tmpl_new(text, len, tool, tool_len, bos, eos, &t, &err) != KP_OK) {
        *failed = file != NULL;
        fam = kp_chat_detect(text);
        if (file)
            fprintf(stderr, "kvpin serve: %s: %s\n", file, err.msg);
        else if (fam == KP_CHAT_UNKNOWN)
            fprintf(stderr, "kvpin serve: note: the model's chat template does not compile (%s) and is not one "
                            "kvpin recognises; /v1/chat/completions needs --chat-template NAME or "
                            "--chat-template-file FILE\n", err.msg);
        else
            fprintf(stderr, "kvpin serve: note: the model's chat template does not compile (%s); the built-in %s "
                            "template is used\n", err.msg, kp_chat_family_name(fam));
    } else if (!text && !file) {
        fprintf(stderr, "kvpin serve: note: the model has no chat template; chat uses chatml "
                        "(--chat-template NAME to change)\n");
    }
    free(text);
    free(tool);
    if (!t && !*failed && fam != KP_CHAT_UNKNOWN) {
        snprintf(name, name_size, "built-in %s", kp_chat_family_name(fam));
        t = builtin_template(fam, bos, eos);
    }
    if (!t) snprintf(name, name_size, "none");
    if (t && !getenv("SOURCE_DATE_EPOCH")) {
        char day[32];
        snprintf(day, sizeof day, "%lld", (long long)(time(NULL) / 86400 * 86400));
        setenv("SOURCE_DATE_EPOCH", day, 1); /* before any thread reads it */
    }
    return t;
}

int cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *host = "127.0.0.1", *key_arg = NULL, *key_file = NULL, *tmpl = NULL;
    const char *alias = NULL, *cache_dir = NULL, *cache_redis = NULL, *cache_key_file = NULL;
    uint8_t mac_key[KP_BLOCKREC_KEY_BYTES];
    const char *tmpl_file = NULL;
    kp_chat_tmpl *jt = NULL;
    char chat_name[1100] = "none";
    uint64_t disk_budget = 0;
    int64_t redis_timeout = 50;
    int64_t port = 8080, parallel = 4, ctx = 0, threads = 0, queue = 64, chunk = 256, block = 16, timeout = 60;
    int64_t request_timeout = 30, max_conn = 1024, max_per_addr = 64, state_every = 0;
    uint64_t budget = 0, window_budget = 0, max_body = 8u << 20, answer_memory = 64u << 20;
    const char *log_prompts = NULL;
    bool pooling_last = false;
    kp_dtype kv_type = KP_DTYPE_F16, kv_type_v = KP_DTYPE_F16;
    kp_attn_precision attn = KP_ATTN_F32;
    bool no_cache = false, no_repack = false, quiet = false, budget_set = false, strict_api = false, no_dashboard = false;
    float pin_ttl_scale = 1;
    const char *volatile_prefixes[KP_VOLATILE_MAX];
    size_t n_volatile = 0;
    static char host_rules_buf[4096];
    size_t host_rules_used = 0;
    const char *allowed_hosts[MAX_HOST_RULES], *cors_origins[MAX_HOST_RULES];
    size_t n_allowed_hosts = 0, n_cors_origins = 0;
    bool keep_volatile = false;
    int64_t max_tokens_cap = 0;
    bool reasoning_inline = false;
    cli_args a;
    int crc = cli_llama_compat("serve", &argc, argv, serve_tab); /* llama-server's spellings */
    if (crc) return crc;
    cli_args_init(&a, "serve", serve_tab, serve_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        const char *v = a.val, *opt = a.opt;
        bool ok = true;
        switch (k) {
        case CLI_STOP: return a.rc;
        case CLI_NO_PREFIX_CACHE: no_cache = true; break;
        case CLI_NO_REPACK: no_repack = true; break;
        case CLI_ATTN_PRECISION: ok = cli_parse_attn(v, &attn); break;
        case O_QUIET: quiet = true; break;
        case O_STRICT_API: strict_api = true; break;
        case O_NO_DASHBOARD: no_dashboard = true; break;
        case O_KEEP_VOLATILE: keep_volatile = true; break;
        case O_MAX_TOKENS_CAP: ok = cli_parse_i64(opt, v, 1, INT32_MAX, &max_tokens_cap); break;
        case O_REASONING_FORMAT:
            ok = !strcmp(v, "auto") || !strcmp(v, "deepseek") || !strcmp(v, "none");
            if (!ok) fprintf(stderr, "kvpin serve: --reasoning-format must be auto, deepseek or none, not '%s'\n", v);
            reasoning_inline = !strcmp(v, "none");
            break;
        case O_ALLOWED_HOSTS: /* split at commas into host_rules_buf */
            for (const char *p = v; ok && *p;) {
                size_t k = strcspn(p, ",");
                while (k > 0 && p[k - 1] == ' ') k--;
                if (k > 0) {
                    if (n_allowed_hosts == MAX_HOST_RULES || host_rules_used + k + 1 > sizeof host_rules_buf) {
                        fprintf(stderr, "kvpin serve: too many --allowed-hosts (at most %d names)\n", MAX_HOST_RULES);
                        return 2;
                    }
                    memcpy(host_rules_buf + host_rules_used, p, k);
                    host_rules_buf[host_rules_used + k] = 0;
                    allowed_hosts[n_allowed_hosts++] = host_rules_buf + host_rules_used;
                    host_rules_used += k + 1;
                }
                p += strcspn(p, ",");
                while (*p == ',' || *p == ' ') p++;
            }
            break;
        case O_CACHE_KEY_FILE: cache_key_file = v; break;
        case O_CORS_ORIGIN:
            if (n_cors_origins == MAX_HOST_RULES) {
                fprintf(stderr, "kvpin serve: at most %d --cors-origin\n", MAX_HOST_RULES);
                return 2;
            }
            cors_origins[n_cors_origins++] = v;
            break;
        case O_VOLATILE_PREFIX:
            if (n_volatile == KP_VOLATILE_MAX) {
                fprintf(stderr, "kvpin serve: at most %d --volatile-prefix\n", KP_VOLATILE_MAX);
                return 2;
            }
            volatile_prefixes[n_volatile++] = v;
            break;
        case O_PIN_TTL_SCALE:
            ok = cli_parse_f32(opt, v, &pin_ttl_scale);
            if (ok && !(pin_ttl_scale > 0 && pin_ttl_scale <= 1000)) {
                fprintf(stderr, "kvpin serve: --pin-ttl-scale must be a number in (0, 1000]\n");
                return 2;
            }
            break;
        case CLI_MODEL: model_path = v; break;
        case CLI_HOST: host = v; break;
        case CLI_PORT: ok = cli_args_int(&a, &port); break;
        case CLI_PARALLEL: ok = cli_args_int(&a, &parallel); break;
        case CLI_CTX_SIZE: ok = cli_args_int(&a, &ctx); break;
        case CLI_THREADS: ok = cli_args_int(&a, &threads); break;
        case O_QUEUE: ok = cli_parse_i64(opt, v, 0, 1 << 20, &queue); break;
        case O_PREFILL_CHUNK: ok = cli_parse_i64(opt, v, 1, 1 << 16, &chunk); break;
        case CLI_KV_BLOCK: ok = cli_args_int(&a, &block); break;
        case O_TIMEOUT: ok = cli_parse_i64(opt, v, 1, 86400, &timeout); break;
        case O_REQUEST_TIMEOUT: ok = cli_parse_i64(opt, v, 1, 86400, &request_timeout); break;
        case O_MAX_CONNECTIONS: ok = cli_parse_i64(opt, v, 1, 1 << 16, &max_conn); break;
        case O_MAX_PER_ADDRESS: ok = cli_parse_i64(opt, v, 1, 1 << 16, &max_per_addr); break;
        case CLI_KV_BUDGET:
            ok = cli_parse_bytes(opt, v, &budget);
            budget_set = true;
            break;
        case CLI_WINDOW_BUDGET: ok = cli_parse_bytes(opt, v, &window_budget); break;
        case CLI_STATE_EVERY: ok = cli_parse_i64(opt, v, 1, 1 << 24, &state_every); break;
        case O_MAX_BODY: ok = cli_parse_bytes(opt, v, &max_body); break;
        case O_ANSWER_MEMORY: ok = cli_parse_bytes(opt, v, &answer_memory); break;
        case O_LOG_PROMPTS: log_prompts = v; break;
        case O_POOLING:
            ok = !strcmp(v, "mean") || !strcmp(v, "last");
            if (!ok) fprintf(stderr, "kvpin serve: --pooling must be mean or last, not '%s'\n", v);
            pooling_last = ok && !strcmp(v, "last");
            break;
        case CLI_KV_TYPE:
        case CLI_KV_TYPE_K:
        case CLI_KV_TYPE_V: ok = cli_parse_kv_opt(k, v, &kv_type, &kv_type_v); break;
        case O_API_KEY: key_arg = v; break;
        case O_API_KEY_FILE: key_file = v; break;
        case O_CHAT_TEMPLATE: tmpl = v; break;
        case O_CHAT_TEMPLATE_FILE: tmpl_file = v; break;
        case O_ALIAS: alias = v; break;
        case CLI_CACHE_DIR: cache_dir = v; break;
        case CLI_CACHE_DISK_BUDGET: ok = cli_parse_bytes(opt, v, &disk_budget); break;
        case CLI_CACHE_REDIS: cache_redis = v; break;
        case CLI_CACHE_REDIS_TIMEOUT: ok = cli_parse_i64(opt, v, 1, 60000, &redis_timeout); break;
        }
        if (!ok) return 2;
    }
    if (!cli_args_no_operands(&a)) return 2;
    { /* the patterns compile, before the model loads */
        kp_volatile *vol = NULL;
        kp_error verr = {0};
        kp_status vst = kp_volatile_new(&vol, !keep_volatile, volatile_prefixes, n_volatile, &verr);
        kp_volatile_free(vol);
        if (vst != KP_OK) {
            fprintf(stderr, "kvpin serve: --volatile-prefix: %s\n", verr.msg);
            return 2;
        }
    }
    if (budget_set && budget == 0) {
        fprintf(stderr, "kvpin serve: --kv-budget 0 leaves no room for the KV cache: leave --kv-budget out for "
                        "the default (np x ctx positions plus as much again for cached prefixes), give a size "
                        "such as 512M or 2G, or use --no-prefix-cache to keep nothing cached\n");
        return 2;
    }
    if (max_body < 1024) {
        fprintf(stderr, "kvpin serve: --max-body must be at least 1K\n");
        return 2;
    }
    kp_chat_family fam = KP_CHAT_UNKNOWN;
    if (tmpl && (fam = kp_chat_family_from_name(tmpl)) == KP_CHAT_UNKNOWN) {
        fprintf(stderr, "kvpin serve: unknown --chat-template %s (see kvpin serve --help)\n", tmpl);
        return 2;
    }
    if (tmpl && tmpl_file) {
        fprintf(stderr, "kvpin serve: --chat-template and --chat-template-file exclude each other\n");
        return 2;
    }
    char *api_key = NULL;
    if (!api_key_of(key_arg, key_file, &api_key)) return 2;
    if (key_arg) memset((char *)key_arg, 'x', strlen(key_arg)); /* out of ps from now on (not before) */
    kp_error err = {0};
    kp_model *m = NULL;
    kp_tok_vocab *v = NULL;
    kp_threads *pool = NULL;
    kp_engine *e = NULL;
    kp_sched *sched = NULL;
    kp_server *srv = NULL;
    int rc = 1;
    const char *path = model_path ? model_path : cli_default_model();
    if (kp_model_load(&m, path, &err) != KP_OK || kp_tok_vocab_load(&v, m->file, &err) != KP_OK ||
        kp_threads_new(&pool, threads > 0 ? (int)threads : kp_cpu_count(), &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
    }
    const kp_hparams *hp = &m->hp;
    if (kp_kvpool_check_type(kv_type, hp->head_dim, "K", &err) != KP_OK ||
        kp_kvpool_check_type(kv_type_v, hp->head_dim, "V", &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
    }
    uint32_t n_ctx = ctx ? (uint32_t)ctx : (hp->n_ctx_train && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    if (ctx && hp->n_ctx_train && (uint64_t)ctx > hp->n_ctx_train) /* as llama-server warns */
        fprintf(stderr,
                "kvpin serve: warning: -c %u is above the model's training context (%u): positions past it are "
                "ones the model never saw, and its answers there may degrade\n",
                n_ctx, hp->n_ctx_train);
    uint64_t per = kp_model_kv_bytes_per_token_kv(hp, kv_type, kv_type_v);
    char b1[32], b2[32];
    if (!budget) {
        budget = 2 * (uint64_t)parallel * ((uint64_t)n_ctx + (uint64_t)block) * per;
        if (!no_cache) /* a recurrent model's state snapshots, as many again (engine.h) */
            budget += 2 * (uint64_t)parallel *
                      kp_eng_state_room(m, kv_type, kv_type_v, (uint32_t)block, n_ctx, (uint32_t)state_every);
        uint64_t half = cli_half_of_ram();
        if (half && budget > half) {
            budget = half;
            fprintf(stderr, "kvpin serve: note: the KV budget is capped at half of RAM (%s): %llu full-context "
                            "sequences fit; set --kv-budget to change it\n",
                    cli_bytes(half, b1, sizeof b1), (unsigned long long)(half / (((uint64_t)n_ctx + block) * per)));
        }
    }
    {
        bool failed = false;
        jt = chat_template(m->file, fam, tmpl_file, token_text(v, kp_tok_bos(v)), token_text(v, kp_tok_eos(v)),
                           &failed, chat_name, sizeof chat_name);
        if (failed || (!jt && fam != KP_CHAT_UNKNOWN)) {
            rc = failed ? 2 : 1;
            goto done;
        }
    }
    if (window_budget && hp->n_swa_layers && !no_cache) {
        /* every running sequence reads its last window and the block it writes; a step
         * writes a chunk; the cache keeps the window before the end a sequence resumed from */
        uint64_t wpt = kp_model_kv_bytes_per_token_kind(m, KP_LAYER_WINDOW, kv_type, kv_type_v);
        uint64_t need = ((uint64_t)parallel * (hp->n_swa + 2 * (uint64_t)block) + (uint64_t)chunk + hp->n_swa) * wpt;
        /* and admission's peak of one sequence alone (engine.h), or no request would ever run */
        uint64_t alone = (uint64_t)kp_eng_window_peak_blocks(hp->n_swa, (uint32_t)block, (uint32_t)chunk) * block * wpt;
        if (need < alone) need = alone;
        if (window_budget < need) {
            fprintf(stderr, "kvpin serve: --window-budget %s is below what %lld running sequences need: "
                            "np x (window %u + 2 blocks) + --prefill-chunk + a window of positions, and at least "
                            "one sequence's peak (its window, a chunk, the window before its prompt's end and "
                            "3 blocks), %s\n",
                    cli_bytes(window_budget, b1, sizeof b1), (long long)parallel, hp->n_swa,
                    cli_bytes(need, b2, sizeof b2));
            rc = 2;
            goto done;
        }
    }
    kp_eng_config ec = {kv_type, (uint32_t)block, budget, n_ctx, no_cache, NULL, kv_type_v, no_repack, window_budget, (uint32_t)state_every};
    if (kp_eng_new(&e, m, pool, NULL, &ec, &err) != KP_OK || kp_eng_set_attn(e, attn, &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
    }
    if (attn == KP_ATTN_BF16 && strcmp(kp_eng_attn_name(e), "avx512bf16") != 0)
        fprintf(stderr, "kvpin serve: --attn-precision bf16: this CPU has no AVX512_BF16; attention stays F32 (%s)\n",
                kp_eng_attn_name(e));
    else if (attn == KP_ATTN_BF16)
        fprintf(stderr, "kvpin serve: prefill attention in bfloat16 dot products (%s)\n", kp_eng_attn_name(e));
    if ((cache_dir || cache_redis) && no_cache) {
        fprintf(stderr, "kvpin serve: --cache-dir and --cache-redis need the prefix cache (drop "
                        "--no-prefix-cache)\n");
        rc = 2;
        goto done;
    }
    if (cache_key_file && !cache_dir && !cache_redis) {
        fprintf(stderr, "kvpin serve: --cache-key-file seals the records of --cache-dir or --cache-redis; give one\n");
        return 2;
    }
    if (cache_key_file) {
        kp_error kerr = {0};
        if (kp_blockrec_key_load(cache_key_file, mac_key, &kerr) != KP_OK) {
            fprintf(stderr, "kvpin serve: %s\n", kerr.msg);
            return 2;
        }
    }
    if (cache_dir || cache_redis) {
        kp_tiers_config tc = {cache_dir, disk_budget, cache_redis, (uint32_t)redis_timeout, tier_log, NULL,
                              cache_key_file ? mac_key : NULL, 0};
        if (kp_eng_open_tiers(e, &tc, &err) != KP_OK) {
            fprintf(stderr, "kvpin serve: %s\n", err.msg);
            goto done;
        }
        kp_tiers_stats ts;
        kp_eng_tier_stats(e, &ts);
        if (cache_dir && ts.tier[KP_TIER_DISK].states) /* a model with recurrent layers: its snapshots too */
            fprintf(stderr, "kvpin serve: disk tier %s: fingerprint %.16s, %llu blocks and %llu state snapshots (%s) "
                    "found\n", cache_dir, ts.fingerprint, (unsigned long long)ts.tier[KP_TIER_DISK].blocks,
                    (unsigned long long)ts.tier[KP_TIER_DISK].states,
                    cli_bytes(ts.tier[KP_TIER_DISK].bytes, b1, sizeof b1));
        else if (cache_dir)
            fprintf(stderr, "kvpin serve: disk tier %s: fingerprint %.16s, %llu blocks (%s) found\n", cache_dir,
                    ts.fingerprint, (unsigned long long)ts.tier[KP_TIER_DISK].blocks,
                    cli_bytes(ts.tier[KP_TIER_DISK].bytes, b1, sizeof b1));
        if (cache_redis)
            fprintf(stderr, "kvpin serve: redis tier %s: keys kvpin:%s:*, timeout %lld ms\n", cache_redis,
                    ts.fingerprint, (long long)redis_timeout);
        if (*kp_eng_tier_note(e)) fprintf(stderr, "kvpin serve: disk tier: %s\n", kp_eng_tier_note(e));
    }
    kp_sched_config sc = {(uint32_t)parallel, (uint32_t)queue, (uint32_t)chunk};
    if (kp_sched_new(&sched, e, v, &sc, &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
    }
    const char *slash = strrchr(path, '/');
    kp_server_config cfg = {0};
    cfg.host = host;
    cfg.port = (uint16_t)port;
    cfg.api_key = api_key;
    cfg.model_name = alias ? alias : slash ? slash + 1 : path;
    cfg.max_body = (size_t)max_body;
    cfg.timeout_s = (unsigned)timeout;
    cfg.request_timeout_s = (unsigned)request_timeout;
    cfg.max_connections = (unsigned)max_conn;
    cfg.max_per_address = (unsigned)max_per_addr;
    cfg.chat_jinja = jt;
    cfg.quiet = quiet;
    cfg.strict_api = strict_api;
    cfg.pin_ttl_scale = pin_ttl_scale;
    cfg.no_dashboard = no_dashboard;
    cfg.keep_volatile = keep_volatile;
    cfg.max_tokens_cap = (uint32_t)max_tokens_cap;
    cfg.answer_memory = (size_t)answer_memory;
    cfg.log_prompts = log_prompts;
    cfg.pooling_last = pooling_last;
    cfg.build_info = "kvpin " KP_VERSION;
    cfg.embd_threads = threads > 0 ? (uint32_t)threads : 0;
    cfg.reasoning_inline = reasoning_inline;
    cfg.volatile_prefixes = volatile_prefixes;
    cfg.allowed_hosts = allowed_hosts;
    cfg.n_allowed_hosts = n_allowed_hosts;
    cfg.cors_origins = cors_origins;
    cfg.n_cors_origins = n_cors_origins;
    cfg.n_volatile = n_volatile;
    cfg.tiers_of = cache_dir || cache_redis ? e : NULL;
    cfg.message_starts = window_budget && hp->n_swa_layers && !no_cache;
    /* SIGINT/SIGTERM are taken by sigwait below; SIGPIPE from a client that left is ignored */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (kp_server_new(&srv, &cfg, sched, v, m, &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr, "kvpin serve: model %s (%s, %u layers, %u kv-heads x %u head_dim), chat template %s\n", path,
            hp->arch_name, hp->n_layer, hp->n_head_kv, hp->head_dim,
            chat_name);
    char kvf[96], kvn[24];
    fprintf(stderr, "kvpin serve: KV %s, %llu bytes per token (%s); budget %s = %llu positions; "
                    "context %u, parallel %lld, prefix cache %s\n",
            cli_kv_name(kv_type, kv_type_v, kvn, sizeof kvn), (unsigned long long)per,
            cli_kv_formula(hp, kv_type, kv_type_v, kvf, sizeof kvf),
            cli_bytes(budget, b2, sizeof b2), (unsigned long long)(budget / per), n_ctx, (long long)parallel,
            no_cache ? "off" : "on");
    fprintf(stderr, "kvpin serve: listening on %s (OpenAI API at /v1%s)\n", kp_server_url(srv),
            no_dashboard ? "" : ", cache dashboard at /");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "kvpin serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    rc = 0;
done:
    kp_server_free(srv);
    kp_sched_free(sched);
    kp_eng_free(e);
    kp_threads_free(pool);
    kp_tok_vocab_free(v);
    kp_model_free(m);
    kp_chat_tmpl_free(jt);
    free(api_key);
    return rc;
}
