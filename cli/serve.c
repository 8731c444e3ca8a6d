/*
 * serve.c - `kvpin serve`: load a model, size the KV budget, start the
 * scheduler and the HTTP server, wait for SIGINT/SIGTERM, shut down.
 *
 * The KV budget, unless --kv-budget says otherwise:
 *
 *   parallel x (ctx + block) positions x bytes per token   (every sequence
 *   can reach the full context, plus one partial block each for
 *   copy-on-write), plus the same again for cached prefixes, capped at half
 *   of the machine's RAM (then a note says how many full-context sequences
 *   fit).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/chat.h"
#include "cli.h"
#include "cache/engine.h"
#include "serve/scheduler.h"
#include "serve/server.h"
#include "base/threadpool.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: kvpin serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]\n"
            "                   [--kv-budget BYTES] [--kv-type f16|f32] [--kv-block N] [--api-key KEY]\n"
            "                   [--no-prefix-cache] [--chat-template NAME] [-t N] [--queue N]\n"
            "                   [--prefill-chunk N] [--max-body BYTES] [--timeout S] [--alias NAME] [--quiet]\n"
            "An OpenAI-compatible HTTP server (POST /v1/completions, /v1/chat/completions, GET /v1/models,\n"
            "/health, /metrics, /v1/cache, POST /v1/cache/probe, /v1/cache/pin, DELETE /v1/cache/pin/ID,\n"
            "POST /tokenize, /detokenize). Defaults: the bundled model, 127.0.0.1:8080, --parallel 4,\n"
            "--ctx min(training context, 4096), a KV budget for parallel x ctx positions plus as much again\n"
            "for cached prefixes (at most half of RAM), --queue 64, --prefill-chunk 256 tokens per step,\n"
            "--max-body 8M, --timeout 60 (idle seconds). --port 0 picks a free port (printed on stderr).\n"
            "Chat templates: recognised from the model's tokenizer.chat_template (chatml when the model has\n"
            "none), or --chat-template chatml, qwen2, qwen2.5, qwen3, llama3, llama3.1, llama2, mistral,\n"
            "gemma, phi3, zephyr.\n");
}


/* The token's text, or "" (for chat templates' bos_token / eos_token). */
static const char *token_text(const kp_tok_vocab *v, int32_t id) {
    size_t len;
    const char *t = id >= 0 ? kp_tok_text(v, id, &len) : NULL;
    return t ? t : "";
}

int cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *host = "127.0.0.1", *api_key = NULL, *tmpl = NULL, *alias = NULL;
    int64_t port = 8080, parallel = 4, ctx = 0, threads = 0, queue = 64, chunk = 256, block = 16, timeout = 60;
    uint64_t budget = 0, max_body = 8u << 20;
    kp_dtype kv_type = KP_DTYPE_F16;
    bool no_cache = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-prefix-cache")) {
            no_cache = true;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvpin serve: %s needs a value (or is unknown)\n", a);
            serve_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) ok = cli_parse_i64(a, v, 0, 65535, &port);
        else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) ok = cli_parse_i64(a, v, 1, 256, &parallel);
        else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) ok = cli_parse_i64(a, v, 1, 1 << 24, &ctx);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = cli_parse_i64(a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--queue")) ok = cli_parse_i64(a, v, 0, 1 << 20, &queue);
        else if (!strcmp(a, "--prefill-chunk")) ok = cli_parse_i64(a, v, 1, 1 << 16, &chunk);
        else if (!strcmp(a, "--kv-block")) ok = cli_parse_i64(a, v, 1, 4096, &block);
        else if (!strcmp(a, "--timeout")) ok = cli_parse_i64(a, v, 1, 86400, &timeout);
        else if (!strcmp(a, "--kv-budget")) ok = cli_parse_bytes(a, v, &budget);
        else if (!strcmp(a, "--max-body")) ok = cli_parse_bytes(a, v, &max_body);
        else if (!strcmp(a, "--kv-type")) {
            ok = cli_parse_kv_type(v, &kv_type);
            if (!ok) fprintf(stderr, "kvpin serve: --kv-type must be f16 or f32\n");
        } else if (!strcmp(a, "--api-key")) api_key = v;
        else if (!strcmp(a, "--chat-template")) tmpl = v;
        else if (!strcmp(a, "--alias")) alias = v;
        else {
            fprintf(stderr, "kvpin serve: unknown option %s\n", a);
            serve_usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    if (api_key && !*api_key) {
        fprintf(stderr, "kvpin serve: --api-key must not be empty\n");
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
    kp_error err = {0};
    kp_model *m = NULL;
    kp_tok_vocab *v = NULL;
    kp_pool *pool = NULL;
    kp_engine *e = NULL;
    kp_sched *sched = NULL;
    kp_server *srv = NULL;
    int rc = 1;
    const char *path = model_path ? model_path : cli_default_model();
    if (kp_model_load(&m, path, &err) != KP_OK || kp_tok_vocab_load(&v, m->file, &err) != KP_OK ||
        kp_pool_new(&pool, threads > 0 ? (int)threads : kp_cpu_count(), &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
    }
    const kp_hparams *hp = &m->hp;
    uint32_t n_ctx = ctx ? (uint32_t)ctx : (hp->n_ctx_train && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    uint64_t per = kp_model_kv_bytes_per_token(hp, kv_type);
    char b1[32], b2[32];
    if (!budget) {
        budget = 2 * (uint64_t)parallel * ((uint64_t)n_ctx + (uint64_t)block) * per;
        uint64_t half = cli_half_of_ram();
        if (half && budget > half) {
            budget = half;
            fprintf(stderr, "kvpin serve: note: the KV budget is capped at half of RAM (%s): %llu full-context "
                            "sequences fit; set --kv-budget to change it\n",
                    cli_bytes(half, b1, sizeof b1), (unsigned long long)(half / (((uint64_t)n_ctx + block) * per)));
        }
    }
    if (!tmpl) {
        kp_gguf_str t;
        kp_error e2;
        if (kp_gguf_get_str(m->file, "tokenizer.chat_template", &t, &e2) == KP_OK && t.len > 0) {
            char *txt = malloc(t.len + 1);
            if (txt) {
                memcpy(txt, t.data, t.len);
                txt[t.len] = 0;
                fam = kp_chat_detect(txt);
                free(txt);
            }
            if (fam == KP_CHAT_UNKNOWN)
                fprintf(stderr, "kvpin serve: note: the model's chat template is not one kvpin recognises; "
                                "/v1/chat/completions needs --chat-template NAME\n");
        } else {
            fam = KP_CHAT_CHATML; /* no template at all: ChatML, as llama.cpp's server does */
            fprintf(stderr, "kvpin serve: note: the model has no chat template; chat uses chatml "
                            "(--chat-template NAME to change)\n");
        }
    }
    kp_eng_config ec = {kv_type, (uint32_t)block, budget, n_ctx, no_cache, NULL};
    if (kp_eng_new(&e, m, pool, NULL, &ec, &err) != KP_OK) {
        fprintf(stderr, "kvpin serve: %s\n", err.msg);
        goto done;
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
    cfg.chat = fam;
    cfg.chat_bos = token_text(v, kp_tok_bos(v));
    cfg.chat_eos = token_text(v, kp_tok_eos(v));
    cfg.quiet = quiet;
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
            fam == KP_CHAT_UNKNOWN ? "none" : kp_chat_family_name(fam));
    fprintf(stderr, "kvpin serve: KV %llu bytes per token (2 x %u x %u x %u x %zu); budget %s = %llu positions; "
                    "context %u, parallel %lld, prefix cache %s\n",
            (unsigned long long)per, hp->n_layer, hp->n_head_kv, hp->head_dim, kp_dtype_row_size(kv_type, 1),
            cli_bytes(budget, b2, sizeof b2), (unsigned long long)(budget / per), n_ctx, (long long)parallel,
            no_cache ? "off" : "on");
    fprintf(stderr, "kvpin serve: listening on http://%s:%u (OpenAI API at /v1)\n", host,
            (unsigned)kp_server_port(srv));
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "kvpin serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    rc = 0;
done:
    kp_server_free(srv);
    kp_sched_free(sched);
    kp_eng_free(e);
    kp_pool_free(pool);
    kp_tok_vocab_free(v);
    kp_model_free(m);
    return rc;
}
