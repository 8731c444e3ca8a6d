/*
 * session.c - model + tokenizer + pools + forward for the CLI (session.h).
 */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define EVAL_BATCH 2048

bool cli_session_open(cli_session *s, const cli_session_opts *o, const char *cmd) {
    kp_error err = {0};
    memset(s, 0, sizeof *s);
    const char *path = o->model_path ? o->model_path : cli_default_model();
    if (kp_model_load(&s->m, path, &err) != KP_OK) goto fail;
    if (kp_tok_vocab_load(&s->tok, s->m->file, &err) != KP_OK) goto fail;
    s->n_threads = o->n_threads > 0 ? o->n_threads : kp_cpu_count();
    if (kp_pool_new(&s->pool, s->n_threads, &err) != KP_OK) goto fail;
    s->n_ctx = o->n_ctx ? o->n_ctx : (s->m->hp.n_ctx_train < 4096 ? s->m->hp.n_ctx_train : 4096);
    s->kv_type = o->kv_type;
    s->kernels = o->scalar ? kp_kernels_scalar() : kp_kernels_best();
    if (!cli_session_set_ctx(s, s->n_ctx, cmd)) {
        cli_session_close(s);
        return false;
    }
    return true;
fail:
    fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
    cli_session_close(s);
    return false;
}

bool cli_session_set_ctx(cli_session *s, uint32_t n_ctx, const char *cmd) {
    kp_error err = {0};
    if (s->kv) kp_kvseq_release(&s->seq, s->kv);
    kp_forward_free(s->fw);
    kp_kvpool_free(s->kv);
    s->fw = NULL;
    s->kv = NULL;
    s->n_ctx = n_ctx;
    kp_kvpool_config kc = {s->m->hp.n_layer, s->m->hp.n_head_kv, s->m->hp.head_dim, s->kv_type, 16, 0};
    uint64_t blocks = ((uint64_t)n_ctx + kc.block_size - 1) / kc.block_size;
    kc.budget_bytes = blocks * kp_model_kv_bytes_per_token(&s->m->hp, s->kv_type) * kc.block_size;
    if (kp_kvpool_new(&s->kv, &kc, &err) != KP_OK ||
        kp_forward_new(&s->fw, s->m, s->kv, s->pool, s->kernels, &err) != KP_OK) {
        fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
        return false;
    }
    return true;
}

void cli_session_close(cli_session *s) {
    if (s->kv) kp_kvseq_release(&s->seq, s->kv);
    kp_forward_free(s->fw);
    kp_kvpool_free(s->kv);
    kp_pool_free(s->pool);
    kp_tok_vocab_free(s->tok);
    kp_model_free(s->m);
    memset(s, 0, sizeof *s);
}

bool cli_session_eval(cli_session *s, const int32_t *ids, int32_t n, float *all_logits,
                      float *last_logits, const char *cmd) {
    kp_error err = {0};
    uint32_t nv = s->m->hp.n_vocab;
    int32_t *pos = malloc((size_t)(n < EVAL_BATCH ? n : EVAL_BATCH) * sizeof(int32_t));
    int32_t *seq = calloc((size_t)(n < EVAL_BATCH ? n : EVAL_BATCH), sizeof(int32_t));
    uint8_t *want = malloc((size_t)(n < EVAL_BATCH ? n : EVAL_BATCH));
    bool ok = pos && seq && want;
    if (!ok) snprintf(err.msg, sizeof err.msg, "out of memory");
    kp_kvseq *seqs[1] = {&s->seq};
    for (int32_t i = 0; ok && i < n; i += EVAL_BATCH) {
        int32_t m = n - i < EVAL_BATCH ? n - i : EVAL_BATCH;
        if (s->seq.n_pos + (uint32_t)m > s->n_ctx) {
            snprintf(err.msg, sizeof err.msg, "context full: %u + %d tokens exceed the context of %u (use --ctx)",
                     s->seq.n_pos, m, s->n_ctx);
            ok = false;
            break;
        }
        for (int32_t j = 0; j < m; j++) {
            pos[j] = (int32_t)s->seq.n_pos + j;
            want[j] = all_logits != NULL || i + j == n - 1;
        }
        kp_batch b = {m, ids + i, pos, seq, want, seqs, 1};
        float *out = all_logits ? all_logits + (size_t)i * nv : last_logits;
        bool last_chunk = i + m == n;
        if (!all_logits && !last_chunk) {
            memset(want, 0, (size_t)m);
            out = NULL;
        }
        if (kp_forward_run(s->fw, &b, out, &err) != KP_OK) ok = false;
    }
    free(pos);
    free(seq);
    free(want);
    if (!ok) fprintf(stderr, "kvpin %s: %s\n", cmd, err.msg);
    return ok;
}
