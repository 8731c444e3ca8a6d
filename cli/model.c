/*
 * model.c - what a model-running subcommand loads (cli.h: cli_model): the
 * model file, opened as the library opens it (kp_lm_open, kvpin.h), its
 * model and tokenizer (api/lm_parts.h), a thread pool and the kernel
 * table. The KV pool, the forward pass and generation belong to the engine
 * the subcommand makes from these (engine/engine.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "api/lm_parts.h"
#include "kv/kvpool.h"

bool cli_model_open(cli_model *cm, const cli_session_opts *o, const char *cmd) {
    kp_error err = {0};
    memset(cm, 0, sizeof *cm);
    const char *path = o->model_path ? o->model_path : cli_default_model();
    cm->n_threads = o->n_threads > 0 ? o->n_threads : kp_cpu_count();
    kp_err lm_err;
    if (kp_lm_open(&cm->lm, path, &lm_err) != KP_RC_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, lm_err.msg);
        cli_model_close(cm);
        return false;
    }
    cm->m = kp_lm_model(cm->lm);
    cm->tok = kp_lm_vocab(cm->lm);
    if (kp_threads_new(&cm->pool, cm->n_threads, &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        cli_model_close(cm);
        return false;
    }
    if (kp_kvpool_check_type(o->kv_type, cm->m->hp.head_dim, "K", &err) != KP_OK ||
        kp_kvpool_check_type(o->kv_type_v, cm->m->hp.head_dim, "V", &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        cli_model_close(cm);
        return false;
    }
    cm->kernels = o->scalar ? kp_kernels_scalar() : kp_kernels_best();
    uint32_t train = cm->m->hp.n_ctx_train;
    cm->n_ctx = o->n_ctx ? o->n_ctx : train < 4096 ? train : 4096;
    return true;
}

void cli_model_close(cli_model *cm) {
    kp_threads_free(cm->pool);
    kp_lm_free(cm->lm);
    memset(cm, 0, sizeof *cm);
}
