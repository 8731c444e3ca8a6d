/*
 * session.h - what every model-running subcommand sets up: the model, its
 * tokenizer, a thread pool, a KV pool sized for the context, and the
 * forward pass. One sequence at a time (the server's engine generalizes it).
 */
#ifndef KP_CLI_SESSION_H
#define KP_CLI_SESSION_H

#include "model/forward.h"
#include "kv/kvpool.h"
#include "model/model.h"
#include "base/threadpool.h"
#include "tok/tok.h"
#include "cli.h"

typedef struct {
    kp_model *m;
    kp_tok_vocab *tok;
    kp_pool *pool;
    kp_kvpool *kv;
    kp_forward *fw;
    kp_kvseq seq;
    uint32_t n_ctx;
    kp_dtype kv_type;
    int n_threads;
    const kp_kernels *kernels;
} cli_session;

/* cli_session_opts: cli.h */

/* Prints the error itself (prefixed by `cmd`) and returns false on failure. */
bool cli_session_open(cli_session *s, const cli_session_opts *o, const char *cmd);
void cli_session_close(cli_session *s);

/* Re-creates the KV pool (and forward pass) for n_ctx positions; the
 * sequence is emptied. Prints errors; false on failure. */
bool cli_session_set_ctx(cli_session *s, uint32_t n_ctx, const char *cmd);

/* Runs tokens [0, n) of `ids` at positions start.. in batches of at most
 * 2048 tokens; logits of every token into `all_logits` when non-NULL, else
 * of the last token into `last_logits`. Prints errors; false on failure. */
bool cli_session_eval(cli_session *s, const int32_t *ids, int32_t n, float *all_logits,
                      float *last_logits, const char *cmd);

#endif
