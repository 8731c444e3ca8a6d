/*
 * engine.c - the single-process engine (engine.h): KV pool + prefix index +
 * forward pass, one sequence at a time.
 *
 * Owns: the kp_kvpool (budget_bytes / block_bytes blocks), the pfx_index
 * over it (or none), the kp_forward scratch. Borrows: model, threads,
 * kernels. The caller owns each eng_seq (its block table and lease).
 *
 * Prefill of tokens[0..n) against the index:
 *
 *   tokens   | 0 ........ n_reuse-1 | n_reuse ............ n-1 |
 *   source   | cached rows (acquire)| forward pass, batches of  |
 *            | shared blocks, a     | ENG_BATCH tokens, logits  |
 *            | private copy of the  | of the last token only    |
 *            | partial last block   |                           |
 *
 *   n_reuse = match.n_reuse: the whole match, or n - 1 on a full hit (the
 *   last position is computed again to get its logits).
 *
 * Invariants:
 *   - a sequence only ever writes positions >= its n_pos at acquire time
 *     (prefix.h's contract): prefill appends from n_reuse, decode appends at
 *     n_pos, nothing rewinds;
 *   - blocks are reserved before every forward call; when the pool answers
 *     KP_EFULL the engine asks pfx_evict for exactly the missing blocks and
 *     retries; when nothing unheld is left it drops the sequence's own lease
 *     (a lease holds whole nodes, also cached rows past the ones the
 *     sequence uses) and tries once more, and gives up (KP_EFULL) only then.
 *     Eviction never takes rows a sequence reads: the sequence holds its own
 *     reference to every block in its table;
 *   - eng_finish indexes only positions that have K/V (min(n, n_pos)), then
 *     drops the lease and every block reference of the sequence: once all
 *     sequences are finished and the index is freed, every block is free.
 */
#include "engine.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENG_BATCH 256 /* prompt tokens per forward call */

struct eng_engine {
    const kp_model *m;
    kp_kvpool *kv;
    pfx_index *idx; /* NULL: prefix cache off */
    kp_forward *fw;
    uint32_t max_pos;
    pfx_config pfx_cfg; /* kept for eng_clear */
    bool has_pfx_cfg;
    /* batch scratch, ENG_BATCH entries each */
    int32_t *pos, *seqi;
    uint8_t *want;
};

kp_status eng_new(eng_engine **out, const kp_model *m, kp_pool *threads, const kp_kernels *kernels,
                  const eng_config *cfg, kp_error *err) {
    *out = NULL;
    eng_config c = {KP_DTYPE_F16, 16, 0, 0, false, NULL};
    if (cfg) c = *cfg;
    if (!c.block_size) c.block_size = 16;
    if (!c.max_pos) c.max_pos = m->hp.n_ctx_train && m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    uint64_t per_tok = kp_model_kv_bytes_per_token(&m->hp, c.kv_type);
    uint64_t block_bytes = per_tok * c.block_size;
    if (!c.budget_bytes) c.budget_bytes = ((uint64_t)c.max_pos + c.block_size - 1) / c.block_size * block_bytes;
    if (c.budget_bytes < block_bytes)
        return kp_fail(err, KP_EINVAL, "KV budget of %llu bytes is smaller than one block (%llu bytes)",
                       (unsigned long long)c.budget_bytes, (unsigned long long)block_bytes);
    eng_engine *e = calloc(1, sizeof *e);
    if (!e) return kp_fail(err, KP_ENOMEM, "out of memory for the engine");
    e->m = m;
    e->max_pos = c.max_pos;
    if (c.pfx) {
        e->pfx_cfg = *c.pfx;
        e->has_pfx_cfg = true;
    }
    e->pos = malloc(ENG_BATCH * sizeof(int32_t));
    e->seqi = calloc(ENG_BATCH, sizeof(int32_t));
    e->want = calloc(ENG_BATCH, 1);
    kp_status st = KP_ENOMEM;
    if (!e->pos || !e->seqi || !e->want) {
        kp_fail(err, KP_ENOMEM, "out of memory for the engine");
        goto fail;
    }
    kp_kvpool_config kc = {m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, c.kv_type, c.block_size,
                           c.budget_bytes};
    if ((st = kp_kvpool_new(&e->kv, &kc, err)) != KP_OK) goto fail;
    if (!c.no_prefix_cache && (st = pfx_new(&e->idx, e->kv, c.pfx, err)) != KP_OK) goto fail;
    if ((st = kp_forward_new(&e->fw, m, e->kv, threads, kernels, err)) != KP_OK) goto fail;
    *out = e;
    return KP_OK;
fail:
    eng_free(e);
    return st;
}

void eng_free(eng_engine *e) {
    if (!e) return;
    kp_forward_free(e->fw);
    pfx_free(e->idx);
    kp_kvpool_free(e->kv);
    free(e->pos);
    free(e->seqi);
    free(e->want);
    free(e);
}

pfx_index *eng_index(eng_engine *e) { return e->idx; }
kp_kvpool *eng_kvpool(eng_engine *e) { return e->kv; }
uint32_t eng_max_pos(const eng_engine *e) { return e->max_pos; }
uint32_t eng_seq_len(const eng_seq *seq) { return seq->kv.n_pos; }

/* Makes sure positions [0, n_pos) of s have blocks, evicting unheld cached
 * prefixes when the pool is full. */
static kp_status reserve(eng_engine *e, eng_seq *seq, uint32_t n_pos, eng_report *r, kp_error *err) {
    kp_kvseq *s = &seq->kv;
    uint32_t B = kp_kvpool_config_of(e->kv)->block_size;
    for (;;) {
        kp_status st = kp_kvseq_reserve(s, e->kv, n_pos, err);
        if (st != KP_EFULL) return st;
        uint32_t need = (uint32_t)(((uint64_t)n_pos + B - 1) / B) - s->n_blocks;
        uint64_t got = e->idx ? pfx_evict(e->idx, (uint64_t)need * kp_kvpool_block_bytes(e->kv),
                                          (int64_t)time(NULL))
                              : 0;
        if (r) {
            r->evictions++;
            r->evicted_bytes += got;
        }
        if (got == 0 && seq->lease.node) {
            /* Everything evictable is on our own held path (a lease holds a
             * whole node, also the part past the rows we use). Our rows stay
             * valid without it: the sequence holds its own block references. */
            pfx_release(e->idx, &seq->lease);
            continue;
        }
        if (got == 0)
            return kp_fail(err, KP_EFULL,
                           "KV budget full: %u positions need %u more blocks of %u and nothing cached "
                           "can be evicted (raise --kv-budget)",
                           n_pos, need, B);
    }
}

void eng_seq_abort(eng_engine *e, eng_seq *seq) {
    if (e->idx) pfx_release(e->idx, &seq->lease);
    kp_kvseq_release(&seq->kv, e->kv);
    memset(seq, 0, sizeof *seq);
}

/* Runs tokens[0..n) at positions start.. of seq; logits of the last one. */
static kp_status run_tokens(eng_engine *e, eng_seq *seq, const int32_t *tokens, uint32_t n, float *logits,
                            kp_error *err) {
    kp_kvseq *seqs[1] = {&seq->kv};
    for (uint32_t i = 0; i < n; i += ENG_BATCH) {
        uint32_t m = n - i < ENG_BATCH ? n - i : ENG_BATCH;
        bool last = i + m == n;
        for (uint32_t j = 0; j < m; j++) {
            e->pos[j] = (int32_t)(seq->kv.n_pos + j);
            e->want[j] = last && j == m - 1 && logits;
        }
        kp_batch b = {(int32_t)m, tokens + i, e->pos, e->seqi, e->want, seqs, 1};
        kp_status st = kp_forward_run(e->fw, &b, last ? logits : NULL, err);
        if (st != KP_OK) return st;
    }
    return KP_OK;
}

kp_status eng_prefill(eng_engine *e, const int32_t *tokens, uint32_t n, eng_seq *seq,
                      float *logits_out, eng_report *report, kp_error *err) {
    eng_report r;
    memset(&r, 0, sizeof r);
    r.cached_next = -1;
    r.prompt_tokens = n;
    if (report) *report = r;
    if (n == 0 || !tokens) return kp_fail(err, KP_EINVAL, "empty prompt");
    if (seq->kv.n_pos || seq->kv.n_blocks || seq->lease.node)
        return kp_fail(err, KP_EINVAL, "prefill into a sequence that is not empty");
    if (n > e->max_pos)
        return kp_fail(err, KP_ERANGE, "the prompt has %u tokens, more than the maximum of %u", n, e->max_pos);
    int32_t nv = (int32_t)e->m->hp.n_vocab;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= nv)
            return kp_fail(err, KP_EINVAL, "token %d at %u is outside the vocabulary of %d", tokens[i], i, nv);
    kp_status st = KP_OK;
    if (e->idx) {
        pfx_match_result mr;
        pfx_match(e->idx, tokens, n, &mr);
        pfx_stats ps;
        pfx_get_stats(e->idx, &ps);
        r.cold = ps.n_nodes == 0;
        r.diverged_at_token = mr.n_match;
        r.cached_next = mr.cached_next;
        r.n_continuations = mr.n_continuations;
        r.evicted = mr.evicted;
        r.evicted_len = mr.evicted_len;
        st = pfx_acquire(e->idx, tokens, mr.n_reuse, &seq->kv, &seq->lease, err);
        if (st == KP_EFULL) { /* the partial-block copy found no free block: compute instead */
            st = pfx_acquire(e->idx, tokens, mr.n_reuse / kp_kvpool_config_of(e->kv)->block_size *
                                                 kp_kvpool_config_of(e->kv)->block_size,
                             &seq->kv, &seq->lease, err);
        }
        if (st != KP_OK) goto fail;
        r.reused_tokens = seq->kv.n_pos;
        assert(r.reused_tokens <= mr.n_reuse && r.reused_tokens < n);
    } else {
        r.cold = true;
    }
    r.computed_tokens = n - r.reused_tokens;
    if ((st = reserve(e, seq, n, &r, err)) != KP_OK) goto fail;
    if ((st = run_tokens(e, seq, tokens + r.reused_tokens, r.computed_tokens, logits_out, err)) != KP_OK)
        goto fail;
    assert(seq->kv.n_pos == n);
    if (report) *report = r;
    return KP_OK;
fail:
    if (report) *report = r;
    eng_seq_abort(e, seq);
    return st;
}

kp_status eng_decode(eng_engine *e, eng_seq *seq, int32_t token, float *logits_out, kp_error *err) {
    uint32_t p = seq->kv.n_pos;
    if (p >= e->max_pos)
        return kp_fail(err, KP_ERANGE, "the sequence reached the maximum of %u positions", e->max_pos);
    if (token < 0 || token >= (int32_t)e->m->hp.n_vocab)
        return kp_fail(err, KP_EINVAL, "token %d is outside the vocabulary of %u", token, e->m->hp.n_vocab);
    kp_status st = reserve(e, seq, p + 1, NULL, err);
    if (st == KP_OK) st = run_tokens(e, seq, &token, 1, logits_out, err);
    assert(st != KP_OK || seq->kv.n_pos == p + 1);
    return st;
}

kp_status eng_finish(eng_engine *e, eng_seq *seq, const int32_t *tokens, uint32_t n, uint32_t *n_added,
                     kp_error *err) {
    kp_status st = KP_OK;
    if (n_added) *n_added = 0;
    if (n > seq->kv.n_pos) n = seq->kv.n_pos;
    if (e->idx && n > 0 && tokens) st = pfx_insert(e->idx, tokens, n, &seq->kv, NULL, n_added, err);
    eng_seq_abort(e, seq);
    return st;
}

kp_status eng_clear(eng_engine *e, kp_error *err) {
    if (!e->idx) return KP_OK;
    pfx_free(e->idx);
    e->idx = NULL;
    return pfx_new(&e->idx, e->kv, e->has_pfx_cfg ? &e->pfx_cfg : NULL, err);
}

void eng_stats(eng_engine *e, pfx_stats *out) {
    if (e->idx) {
        pfx_get_stats(e->idx, out);
        return;
    }
    memset(out, 0, sizeof *out);
    uint64_t bb = kp_kvpool_block_bytes(e->kv);
    uint32_t nb = kp_kvpool_n_blocks(e->kv);
    out->block_bytes = bb;
    out->budget_bytes = (uint64_t)nb * bb;
    out->used_bytes = (uint64_t)(nb - kp_kvpool_n_free(e->kv)) * bb;
    out->free_bytes = out->budget_bytes - out->used_bytes;
}
