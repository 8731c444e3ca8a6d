/*
 * forward.c - the batched transformer forward pass (see forward.h).
 *
 * Per layer, for a batch of n tokens (E = n_embd, Q = n_head*hd,
 * KV = n_head_kv*hd, F = n_ff):
 *
 *   xn      = rmsnorm(x) * attn_norm                        [n][E]
 *   q, k, v = xn @ wq, wk, wv (+ qwen2 biases)              [n][Q], [n][KV], [n][KV]
 *   qwen3:  q, k = per-head rmsnorm * q_norm, k_norm
 *   q, k    = rope(q, k, pos)                               NORM or NEOX pairs
 *   KV[seq][pos] = k, v                                     into the sequence's blocks
 *   att     = softmax(q k^T / sqrt(hd)) v  over 0..pos      [n][Q]
 *   x      += att @ wo
 *   xn      = rmsnorm(x) * ffn_norm
 *   x      += (silu(xn @ w_gate) * (xn @ w_up)) @ w_down       silu with a vector exp
 *
 * then logits = rmsnorm(x) * output_norm @ output for the requested tokens.
 *
 * What the hyperparameters switch (model.h), for gemma3 and its kin:
 *
 *   x        = embedding * embd_scale                        (sqrtf(n_embd))
 *   q        = q * attn_scale after rope when attn_scale_on_q, and the scores
 *              then use scale 1 (llama.cpp scales Q, not the scores)
 *   rope     = (rope_base, rope_freq_scale) in FULL layers,
 *              (rope_base_swa, rope_freq_scale_swa) in WINDOW layers
 *   att      over q - n_swa < p <= q in WINDOW layers, 0 <= p <= q in FULL ones
 *   x       += rmsnorm(att @ wo) * attn_post_norm            (post_norms)
 *   x       += rmsnorm(ffn) * ffn_post_norm                  (post_norms)
 *   ffn      = (gelu_tanh(xn @ w_gate) * (xn @ w_up)) @ w_down  (KP_FFN_GELU_TANH)
 *   logits   = softcap * tanh(logits / softcap)              (logit_softcap > 0)
 *   ffn      = the chosen experts' weighted sum                (n_expert > 0, qwen3moe:
 *                                                               the experts section)
 *   ffn     += sigmoid(xn . gate_inp_shexp) x                  (n_ff_shexp > 0, qwen35moe:
 *              (silu(xn @ w_gate_shexp) * (xn @ w_up_shexp)) @ w_down_shexp   the shared expert)
 *
 * and for gpt-oss (model.h: Experts, Sinks):
 *
 *   q, k, v += bq, bk, bv;  x += att @ wo + bo                 (the biases present)
 *   att      = softmax with the head's sink in the denominator: the kernels'
 *              partial state [m, l, o] merged with exp(sink - m') (att_merge2,
 *              att_merge), in every path (tiles, window tiles, decode chunks)
 *   rope     = YaRN (hp.rope_yarn): rope_tables blends each pair's angle and
 *              scales cos and sin, as ggml's rope_yarn
 *   router   = xn @ w_router + b_router; the top k logits, weights their softmax
 *   expert   = (oai_swiglu(xn @ gate + b_gate, xn @ up + b_up)) @ down + b_down
 *
 * Sliding windows and the prefix cache. Every layer, WINDOW layers too,
 * writes the K/V of every position into the sequence's blocks; a WINDOW
 * layer only reads fewer of them. So a block of the prefix cache holds
 * the same bytes whatever layer kinds the model has, a prompt that reuses
 * cached blocks and diverges at any position finds every K/V row its
 * window needs, and a cached prompt gives the logits of a recompute (the
 * cost: a WINDOW layer's K/V of positions no future query of that
 * sequence will read stay in the pool; the memory bill in `kvpin info`
 * says what they cost; under a window budget the engine drops them where
 * no resume point needs them, engine.c, and this pass never reads a
 * dropped row: it reads [lo, pos] only). A WINDOW layer reads only its window, and the
 * kernels mask only above (causal), so a token's keys [lo, pos] go in two
 * parts fixed by its position: the head [lo, e), up to the end e of the
 * K/V step holding lo, in a tile of its own, and [e, pos] with the tokens
 * of its tile, which all have their lo in that step (att_window_tile);
 * the two partial softmax states are merged. Bitwise the same alone or in
 * any tile, as for FULL layers. Decode chunks clip the window's start.
 *
 * Matrix products: activations are converted once per product to the
 * weight type's dot type (F32, F16, BF16, Q8_0, Q8_K, as llama.cpp does), then
 * the weight rows are split into tasks of MM_ROWS rows across the thread
 * pool; a task hands its rows and the whole batch (or a chunk of about
 * MM_ACT_BYTES of converted activations, which stays in L2) to one call of
 * the kernel table's gemm, which keeps the rows in L1 while the tokens
 * stream past them, so each weight row is read from memory once per chunk
 * (types without a gemm kernel: dot_tile on 4 rows x 4 tokens at a time).
 * Q8_0 activations carry per-block float scales and sums (kp_q8_0_aux),
 * computed once per token next to the conversion. Where the kernel table
 * has a repacked layout for a weight type (kp_forward_pack_weights), the
 * pass holds copies of those matrices in it and calls gemm_packed on them:
 * a task's MM_ROWS rows are whole groups of the layout, the same bits.
 * Experts' 3-D weights are copied the same way, each expert's matrix
 * packed alone (kp_experts.packed), so a decode step streams only the
 * chosen experts' groups.
 * Products that share an input (q/k/v, gate/up) run as one parallel region.
 *
 * Attention (kernels in attn.h: flash-style tiles with an online softmax,
 * so no row of scores over the whole context is stored): the query heads
 * of a GQA group are handled together so each cached K/V row is loaded
 * once per group. In prefill a task is (tile of consecutive tokens of one
 * sequence, kv-head), about ATT_TILE_ROWS query rows: the cached rows are
 * streamed through the tile in steps of up to KP_ATTN_STEP positions, and
 * each step's K/V rows serve the whole tile from L1. Steps start at
 * positions fixed by the block layout, and the kernels compute every row
 * independently of its tile, so a token's output is bitwise the same
 * whatever tile it lands in (prefill of any split, or decode).
 *
 *   cached positions of the sequence   0 ......................... pos
 *   steps (B = 16)                     |16 |16 |16 | ... |16 |16 |..|
 *   tile of T tokens x G heads         each step: T*G rows x 16 keys
 *
 * When the batch is too small to keep every thread busy (decode), a task
 * is (token, kv-head, chunk of positions) and the chunks' partial softmax
 * states (max, sum, weighted V) are merged afterwards, so long caches are
 * still read by every thread; those results are merged anyway, so their
 * tiles may sum in a faster order (kp_attn_tile.free_order).
 */
#include "model/forward.h"

#include "base/bigmem.h"
#include "base/buf.h"
#include "kernels/attn.h"
#include "model/deltanet.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MM_ROWS 16
#define MM_ACT_BYTES (1 << 20) /* activation bytes per matmul task, kept in L2 */
#define MAX_JOBS 3
#define ATT_MIN_CHUNK 128
#define ATT_TILE_ROWS 144 /* query rows (tokens x heads of a group) sharing each K/V step in prefill: a
                            * 135M warm turn (1,000 over 20,000 cached) 181 -> 191 t/s against 48 */

/* One product of the experts' step: expert e's matrix times its rows of
 * the grouped activations (rows first .. first + n - 1), into out. */
typedef struct {
    kp_weight w;
    uint32_t expert;
    int32_t first, n;
    float *out;          /* [n][w.n_out] */
} moe_job;

struct kp_forward {
    const kp_model *m;
    kp_kvpool *kv;
    kp_threads *threads;
    const kp_kernels *k;
    const kp_attn_kernels *ak;
    int n_threads;
    /* scratch sized for cap_tokens tokens */
    int32_t cap_tokens;
    float *x, *xn, *q, *kk, *vv, *att, *gate, *up; /* gate, up: [n][n_ff], or [n x used][n_ff_exp] with experts */
    /* experts (hp.n_expert > 0): see the experts section */
    float *router;               /* [n][n_expert] router logits, then probabilities */
    float *moe_out;              /* [n x used][n_embd] each chosen expert's output, rows grouped by expert */
    float *moe_w;                /* [n][used] the chosen experts' weights, in rank order */
    int32_t *moe_sel;            /* [n][used] the chosen experts, in rank order */
    int32_t *moe_slot;           /* [n][used] the grouped row of (token, rank) */
    int32_t *moe_token;          /* [n x used] the token of each grouped row */
    int32_t *moe_first;          /* [n_expert + 1] each expert's first grouped row */
    void *moe_jobs;              /* [2 x n_expert] the products of one step */
    float *sh_out;               /* [n][n_embd] the gated shared expert's output (hp.n_ff_shexp > 0) */
    float *qg;                   /* [n][n_head][query | gate] the gated q projection (attn_gated) */
    /* RECURRENT layers (deltanet.h): projections, output, and the sequences' states */
    float *r_qkv, *r_z, *r_beta, *r_alpha, *r_out; /* [n][C], [n][Dv], [n][H], [n][H], [n][Dv] */
    float *r_ones, *r_scratch;   /* [max(C, S)] ones, [C] */
    float **r_state;             /* [cap_seqs] a sequence's state of the current layer */
    int32_t r_cap_seqs;
    float *rope_cs;              /* [n][n_rot/2][2] cos, sin (FULL layers) */
    float *rope_cs_swa;          /* the same with the WINDOW layers' base and scale */
    float *gelu;                 /* [65536] GELU-tanh of each F16 value, as F32 (GeGLU models), or NULL */
    uint8_t *act[KP_DTYPE_COUNT_]; /* converted activations per dot type */
    size_t act_cap[KP_DTYPE_COUNT_];
    /* attention scratch */
    float *att_ws;               /* [n_threads][att_ws_floats] tile workspaces, 64-byte aligned */
    size_t att_ws_floats, att_ws_cap;
    size_t cap_partials;
    float *partials;
    int32_t *tiles;              /* [n_tiles][2]: first token, count */
    size_t cap_tiles;
    /* repacked weights (kp_forward_pack_weights): copies of the model's
     * layers and output projection whose matrices point into pack_mem */
    kp_layer *layers;
    kp_weight output;
    void *pack_mem;
    uint64_t pack_bytes;
    uint64_t pack_limit;         /* the most kp_forward_pack_weights may copy */
    /* attention's work so far (kp_forward_attn_work) */
    double att_flops, att_seconds;
    /* probe */
    int probe_layer, probe_head;
    float *probe;
    int32_t probe_n;
    size_t probe_cap;
};

/* ggml's GELU-tanh table (GGML_GELU_FP16, on by default on the CPU): for
 * each F16 value h, gelu(h) computed in F32 and rounded to F16; kept here
 * as F32. gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))). */
static float *gelu_table(void) {
    float *t = malloc(65536 * sizeof(float));
    if (!t) return NULL;
    const float c = 0.79788456080286535587989211986876f, a = 0.044715f;
    for (uint32_t i = 0; i < 65536; i++) {
        float x = kp_fp16_to_fp32((uint16_t)i);
        float y = 0.5f * x * (1.0f + tanhf(c * x * (1.0f + a * x * x)));
        t[i] = kp_fp16_to_fp32(kp_fp32_to_fp16(y));
    }
    return t;
}

/* 3/4 of the machine's physical memory (unknown: no limit). */
static uint64_t default_pack_limit(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0) return UINT64_MAX;
    return (uint64_t)pages / 4 * 3 * (uint64_t)size;
}

kp_status kp_forward_new(kp_forward **out, const kp_model *m, kp_kvpool *kv, kp_threads *threads,
                         const kp_kernels *kernels, kp_error *err) {
    *out = NULL;
    const kp_kvpool_config *c = kp_kvpool_config_of(kv);
    if (c->n_layer != m->hp.n_kv_layer || c->n_head_kv != m->hp.n_head_kv ||
        c->head_dim != m->hp.head_dim)
        return kp_fail(err, KP_EINVAL, "KV pool shape does not match the model");
    kp_forward *f = calloc(1, sizeof *f);
    if (!f) return kp_fail(err, KP_ENOMEM, "out of memory creating the forward pass");
    f->m = m;
    f->kv = kv;
    f->threads = threads;
    f->k = kernels ? kernels : kp_kernels_best();
    f->ak = f->k == kp_kernels_scalar() ? kp_attn_scalar() : kp_attn_best();
    f->n_threads = kp_threads_size(threads);
    f->probe_layer = -1;
    f->pack_limit = default_pack_limit();
    if (m->hp.ffn_act == KP_FFN_GELU_TANH && !(f->gelu = gelu_table())) {
        free(f);
        return kp_fail(err, KP_ENOMEM, "out of memory for the GELU table");
    }
    *out = f;
    return KP_OK;
}

const kp_attn_kernels *kp_forward_set_attn(kp_forward *f, kp_attn_precision p) {
    const bool scalar = f->k == kp_kernels_scalar();
    const kp_attn_kernels *bf = scalar ? kp_attn_scalar_bf16() : kp_attn_bf16_best();
    f->ak = p == KP_ATTN_BF16 && bf ? bf : scalar ? kp_attn_scalar() : kp_attn_best();
    return f->ak;
}

void kp_forward_free(kp_forward *f) {
    if (!f) return;
    free(f->x); free(f->xn); free(f->q); free(f->kk); free(f->vv); free(f->att);
    free(f->qg); free(f->r_qkv); free(f->r_z); free(f->r_beta); free(f->r_alpha); free(f->r_out);
    free(f->r_ones); free(f->r_scratch); free(f->r_state);
    free(f->gate); free(f->up); free(f->rope_cs); free(f->rope_cs_swa); free(f->gelu);
    free(f->router); free(f->moe_out); free(f->moe_w);
    free(f->moe_sel); free(f->moe_slot); free(f->moe_token); free(f->moe_first); free(f->moe_jobs);
    free(f->sh_out);
    for (int i = 0; i < KP_DTYPE_COUNT_; i++) free(f->act[i]);
    free(f->att_ws);
    free(f->partials);
    free(f->tiles);
    free(f->probe);
    free(f->layers);
    kp_big_free(f->pack_mem);
    free(f);
}

/* ---- repacked weights ------------------------------------------------------ */

#define PACK_TASK_GROUPS 8 /* row groups per packing task */
#define PACK_PER_LAYER 16  /* the 2-D weights of a layer pack_list visits */

typedef struct {
    const kp_kernels *k;
    const kp_weight *src;
    uint8_t *dst;
    int rows; /* pack_rows of the type */
} pack_ctx;

static void pack_task(void *vctx, int task, int thread) {
    (void)thread;
    const pack_ctx *c = vctx;
    const kp_weight *w = c->src;
    int64_t r0 = (int64_t)task * PACK_TASK_GROUPS * c->rows;
    int64_t nr = w->n_out - r0 < (int64_t)PACK_TASK_GROUPS * c->rows ? w->n_out - r0
                                                                     : (int64_t)PACK_TASK_GROUPS * c->rows;
    c->k->pack[w->type](w->n_in, nr, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
                        c->dst + (size_t)r0 * w->row_bytes);
}

/* The table packs w when it has a layout for its type and row length
 * whose groups tile the matmul tasks (MM_ROWS rows each). */
static int pack_rows_for(const kp_kernels *k, const kp_weight *w) {
    int r = k->pack_rows[w->type], pk = k->pack_k[w->type];
    if (!w->data || w->n_out == 0) return 0; /* absent (an MoE layer's dense FFN) */
    if (r <= 0 || !k->pack[w->type] || !k->gemm_packed[w->type] || MM_ROWS % r != 0) return 0;
    if (pk <= 0 || w->n_in % pk != 0) return 0;
    return r;
}

/* The forward's copies of the weights, in a fixed order. */
static int pack_list(kp_forward *f, kp_weight **list) {
    int n = 0;
    for (uint32_t l = 0; l < f->m->hp.n_layer; l++) {
        kp_layer *L = &f->layers[l];
        kp_weight *ws[] = {&L->wq,        &L->wk,         &L->wv,          &L->wo,      &L->w_gate, &L->w_up,
                           &L->w_down,    &L->w_router,   &L->w_qkv,       &L->w_z,     &L->w_beta, &L->w_alpha,
                           &L->w_ssm_out, &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp};
        assert(sizeof ws / sizeof ws[0] == PACK_PER_LAYER);
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) list[n++] = ws[i];
    }
    list[n++] = &f->output;
    return n;
}

/* Bytes w takes repacked for rows-per-group r, rounded up to 64. */
static uint64_t packed_size(const kp_weight *w, int r) {
    return (kp_pack_bytes(w->type, w->n_in, w->n_out, r) + 63) & ~(uint64_t)63;
}

/* Packs w into dst (packed_size bytes) across the pool. */
static void pack_weight(kp_forward *f, const kp_weight *w, int r, uint8_t *dst) {
    pack_ctx c = {f->k, w, dst, r};
    int64_t per = (int64_t)PACK_TASK_GROUPS * r;
    kp_threads_run(f->threads, pack_task, &c, (int)((w->n_out + per - 1) / per));
}

/* The layer's 3-D expert weights (absent in dense layers: n_expert 0). */
static void expert_list(kp_layer *L, kp_experts *xs[3]) {
    xs[0] = &L->e_gate;
    xs[1] = &L->e_up;
    xs[2] = &L->e_down;
}

/* Rows per group an expert weight packs with (0: kept in place). */
static int pack_rows_experts(const kp_kernels *k, const kp_experts *x) {
    if (!x->data || x->n_expert == 0) return 0;
    kp_weight w = kp_expert_matrix(x, 0);
    return pack_rows_for(k, &w);
}

kp_status kp_forward_pack_weights(kp_forward *f, uint64_t *bytes_out, kp_error *err) {
    if (bytes_out) *bytes_out = f->pack_bytes;
    if (f->layers) return KP_OK;
    const kp_model *m = f->m;
    const uint32_t nl = m->hp.n_layer;
    kp_layer *layers = malloc((size_t)nl * sizeof *layers);
    kp_weight **list = malloc(((size_t)nl * PACK_PER_LAYER + 1) * sizeof *list);
    if (!layers || !list) {
        free(layers);
        free(list);
        return kp_fail(err, KP_ENOMEM, "out of memory repacking the weights");
    }
    memcpy(layers, m->layers, (size_t)nl * sizeof *layers);
    f->layers = layers;
    f->output = m->output;
    int n = pack_list(f, list);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        int r = pack_rows_for(f->k, list[i]);
        if (r) total += packed_size(list[i], r);
    }
    uint64_t experts = 0;
    for (uint32_t l = 0; l < nl; l++) { /* every expert's matrix, each packed alone */
        kp_experts *xs[3];
        expert_list(&f->layers[l], xs);
        for (int j = 0; j < 3; j++) {
            int r = pack_rows_experts(f->k, xs[j]);
            kp_weight w0 = kp_expert_matrix(xs[j], 0);
            if (r) experts += packed_size(&w0, r) * xs[j]->n_expert;
        }
    }
    /* the copies stay in memory while the mapping's pages can be dropped:
     * past the limit the experts stay mapped, then everything does */
    const bool with_experts = total + experts <= f->pack_limit;
    if (with_experts) total += experts;
    else if (total > f->pack_limit) total = 0;
    if (total == 0) {
        free(list);
        return KP_OK;
    }
    uint8_t *mem = kp_big_alloc((size_t)total); /* streamed every token: huge pages */
    if (!mem) {
        free(list);
        free(f->layers);
        f->layers = NULL;
        return kp_fail(err, KP_ENOMEM, "out of memory repacking the weights (%llu bytes)",
                       (unsigned long long)total);
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        kp_weight *w = list[i];
        int r = pack_rows_for(f->k, w);
        if (!r) continue;
        pack_weight(f, w, r, mem + at);
        w->data = mem + at;
        w->packed = true;
        at += packed_size(w, r);
    }
    for (uint32_t l = 0; with_experts && l < nl; l++) {
        kp_experts *xs[3];
        expert_list(&f->layers[l], xs);
        for (int j = 0; j < 3; j++) {
            int r = pack_rows_experts(f->k, xs[j]);
            if (!r) continue;
            kp_weight w0 = kp_expert_matrix(xs[j], 0);
            uint64_t stride = packed_size(&w0, r);
            for (uint32_t e = 0; e < xs[j]->n_expert; e++) {
                kp_weight we = kp_expert_matrix(xs[j], e);
                pack_weight(f, &we, r, mem + at + e * stride);
            }
            xs[j]->data = mem + at;
            xs[j]->mat_bytes = (size_t)stride;
            xs[j]->packed = true;
            at += stride * xs[j]->n_expert;
        }
    }
    assert(at == total);
    free(list);
    f->pack_mem = mem;
    f->pack_bytes = total;
    if (bytes_out) *bytes_out = total;
    return KP_OK;
}

void kp_forward_set_pack_limit(kp_forward *f, uint64_t bytes) { f->pack_limit = bytes; }

void kp_forward_set_probe(kp_forward *f, int layer, int head) {
    f->probe_layer = layer;
    f->probe_head = head;
    f->probe_n = 0;
}

const float *kp_forward_probe(const kp_forward *f, int32_t *n_pos) {
    *n_pos = f->probe_n;
    return f->probe_layer >= 0 && f->probe_n > 0 ? f->probe : NULL;
}

static kp_status ensure_scratch(kp_forward *f, int32_t n, kp_error *err) {
    if (n <= f->cap_tokens) return KP_OK;
    const kp_hparams *hp = &f->m->hp;
    size_t E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim;
    size_t KV = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    size_t K = hp->n_expert_used; /* 0 without experts */
    if (hp->n_expert) F = K * hp->n_ff_exp > hp->n_ff_shexp ? K * hp->n_ff_exp : hp->n_ff_shexp;
    size_t C = 0, Dv = hp->ssm_d_inner, H = hp->ssm_n_v_head;
    if (hp->n_rec_layers) C = 2 * (size_t)hp->ssm_d_state * hp->ssm_n_k_head + Dv;
    void **bufs[] = {(void **)&f->x, (void **)&f->xn, (void **)&f->q, (void **)&f->kk, (void **)&f->vv,
                     (void **)&f->att, (void **)&f->gate, (void **)&f->up, (void **)&f->rope_cs,
                     (void **)&f->rope_cs_swa, (void **)&f->router, (void **)&f->moe_out, (void **)&f->moe_w,
                     (void **)&f->moe_sel, (void **)&f->moe_slot, (void **)&f->moe_token, (void **)&f->qg,
                     (void **)&f->r_qkv, (void **)&f->r_z, (void **)&f->r_beta, (void **)&f->r_alpha,
                     (void **)&f->r_out, (void **)&f->sh_out};
    /* per token, in 4-byte elements (floats or int32) */
    size_t sizes[] = {E, E, Q, KV, KV, Q, F, F, hp->n_rot, hp->n_rot, hp->n_expert, K * E, K, K, K, K,
                      hp->attn_gated ? 2 * Q : 0, C, C ? Dv : 0, C ? H : 0, C ? H : 0, C ? Dv : 0,
                      hp->n_ff_shexp ? E : 0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i] == 0) continue;
        void *nb = realloc(*bufs[i], (size_t)n * sizes[i] * sizeof(float));
        if (!nb) return kp_fail(err, KP_ENOMEM, "out of memory for a batch of %d tokens", n);
        *bufs[i] = nb;
    }
    if (C && !f->r_ones) {
        size_t w = C > hp->ssm_d_state ? C : hp->ssm_d_state;
        f->r_ones = malloc(w * sizeof(float));
        f->r_scratch = malloc(C * sizeof(float));
        if (!f->r_ones || !f->r_scratch) return kp_fail(err, KP_ENOMEM, "out of memory for the recurrent layers");
        for (size_t i = 0; i < w; i++) f->r_ones[i] = 1.0f;
    }
    if (hp->n_expert && !f->moe_first) {
        f->moe_first = malloc(((size_t)hp->n_expert + 1) * sizeof(int32_t));
        f->moe_jobs = malloc((size_t)hp->n_expert * 2 * sizeof(moe_job));
        if (!f->moe_first || !f->moe_jobs) return kp_fail(err, KP_ENOMEM, "out of memory for the experts' jobs");
    }
    f->cap_tokens = n;
    return KP_OK;
}

/* ---- small math --------------------------------------------------------- */

/* As ggml's CPU rms_norm rounds it: float squares summed in double, the
 * mean rounded to float, 1/sqrtf in float. */
static void rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    float mean = (float)(ss / (double)n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* The per-token passes between the matrix products (norms, the residual
 * sums, rope) run a task per token row on the pool once a batch has
 * ROW_TASKS_MIN rows: run on the caller alone they left the other threads
 * spinning (135M, pp4096: 7% of the time). Each row's arithmetic is the
 * same wherever it runs. */
#define ROW_TASKS_MIN 8
static void run_rows(kp_forward *f, int n, void (*fn)(void *, int, int), void *ctx) {
    if (n >= ROW_TASKS_MIN) kp_threads_run(f->threads, fn, ctx, n);
    else for (int t = 0; t < n; t++) fn(ctx, t, 0);
}

/* out[t] = rmsnorm(x[t]) * w for the n rows of E (out may be x). */
typedef struct {
    float *out;
    const float *x, *w;
    size_t E;
    float eps;
} norm_ctx;

static void norm_task(void *vctx, int t, int thread) {
    (void)thread;
    const norm_ctx *c = vctx;
    rmsnorm(c->out + (size_t)t * c->E, c->x + (size_t)t * c->E, c->w, (int64_t)c->E, c->eps);
}

static void norm_rows(kp_forward *f, int n, float *out, const float *x, const float *w) {
    norm_ctx c = {out, x, w, f->m->hp.n_embd, f->m->hp.rms_eps};
    run_rows(f, n, norm_task, &c);
}

/* The residual sum of a block's output y (f->xn): y += bias (if any),
 * y = rmsnorm(y) * post_norm (if any), x += y, row by row. */
typedef struct {
    kp_forward *f;
    const float *bias, *post_norm;
} residual_ctx;

static void residual_task(void *vctx, int t, int thread) {
    (void)thread;
    const residual_ctx *c = vctx;
    const size_t E = c->f->m->hp.n_embd;
    float *y = c->f->xn + (size_t)t * E, *x = c->f->x + (size_t)t * E;
    if (c->bias)
        for (size_t i = 0; i < E; i++) y[i] += c->bias[i];
    if (c->post_norm) rmsnorm(y, y, c->post_norm, (int64_t)E, c->f->m->hp.rms_eps);
    for (size_t i = 0; i < E; i++) x[i] += y[i];
}

static void residual_rows(kp_forward *f, int n, const float *bias, const float *post_norm) {
    residual_ctx c = {f, bias, post_norm};
    run_rows(f, n, residual_task, &c);
}

/* gate = act(gate) * up, a task per token row: silu with the attention
 * table's vector exp, gpt-oss's clamped SwiGLU, or ggml's GeGLU (the
 * attention table's geglu_row: gelu_tanh looked up by the F16 input). */
typedef struct {
    float *gate;
    const float *up;
    size_t n_ff;
    const kp_attn_kernels *ak;
    float limit, alpha;  /* limit > 0: gpt-oss's clamped SwiGLU (oai_swiglu_row) */
    const float *gelu;   /* not NULL: GeGLU through this table (kp_attn_kernels.geglu_row) */
} swiglu_ctx;

/* gpt-oss's SwiGLU (model.h, Experts), as ggml's swiglu_oai on the CPU:
 * x = min(gate, limit), y = clamp(up, -limit, limit),
 * gate = x / (1 + expf(-alpha x)) * (y + 1). */
static void oai_swiglu_row(float *gate, const float *up, size_t n, float alpha, float limit) {
    for (size_t i = 0; i < n; i++) {
        const float x = gate[i] < limit ? gate[i] : limit;
        const float y = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        gate[i] = x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
    }
}

static void swiglu_task(void *vctx, int task, int thread) {
    (void)thread;
    swiglu_ctx *c = vctx;
    float *g = c->gate + (size_t)task * c->n_ff;
    const float *u = c->up + (size_t)task * c->n_ff;
    if (c->gelu) c->ak->geglu_row(c->gelu, g, u, (int64_t)c->n_ff);
    else if (c->limit > 0) oai_swiglu_row(g, u, c->n_ff, c->alpha, c->limit);
    else c->ak->swiglu_row(g, u, (int64_t)c->n_ff);
}

/* ---- matrix products ---------------------------------------------------- */

typedef struct {
    const kp_weight *w;
    float *out;          /* [n][w->n_out] */
} mm_job;

typedef struct {
    kp_forward *f;
    int n;               /* tokens */
    int chunk;           /* tokens per task: n, or a multiple of 4 */
    int n_jobs;
    mm_job jobs[MAX_JOBS];
    int task_start[MAX_JOBS + 1]; /* row tasks of one token chunk, per job */
} mm_ctx;

/* The activation buffer of dot type at for n rows of n_in elements: the n
 * converted rows, then, for Q8_0, n rows of kp_q8_0_aux (block scales and
 * sums that gemm kernels would otherwise recompute in every task). */
static size_t act_aux_offset(size_t n, size_t a_stride) { return (n * a_stride + 7) & ~(size_t)7; }

static size_t act_bytes(kp_dtype at, size_t n, int64_t n_in) {
    size_t a_stride = kp_dtype_row_size(at, n_in);
    if (at != KP_DTYPE_Q8_0) return n * a_stride;
    return act_aux_offset(n, a_stride) + n * (size_t)(n_in / 32) * sizeof(kp_q8_0_aux);
}

/* Rows r0 .. r1 - 1 of w times nt activation rows at ad (a_stride bytes
 * apart; aux: their Q8_0 summaries or NULL) into od (out_stride floats a
 * token): the kernel table's packed gemm, gemm, or 4 x 4 dot tiles. */
static void mm_block(const kp_kernels *k, const kp_weight *w, int64_t r0, int64_t r1, const uint8_t *ad,
                     size_t a_stride, const uint8_t *aux, size_t aux_stride, int nt, float *od, size_t out_stride) {
    const uint8_t *wd = (const uint8_t *)w->data + r0 * w->row_bytes;
    if (w->packed) { /* r0 is a multiple of MM_ROWS, so the first row of a group */
        k->gemm_packed[w->type](w->n_in, (int)(r1 - r0), nt, wd, ad, a_stride, aux, aux_stride, od, out_stride);
        return;
    }
    if (k->gemm[w->type]) {
        k->gemm[w->type](w->n_in, (int)(r1 - r0), nt, wd, w->row_bytes, ad, a_stride, aux, aux_stride, od,
                         out_stride);
        return;
    }
    for (int c0 = 0; c0 < nt; c0 += 4) { /* no whole-block kernel: 4 x 4 tiles */
        int nc = nt - c0 < 4 ? nt - c0 : 4;
        for (int64_t r = 0; r < r1 - r0; r += 4) {
            int nr = r1 - r0 - r < 4 ? (int)(r1 - r0 - r) : 4;
            k->dot_tile[w->type](w->n_in, nr, nc, wd + r * w->row_bytes, w->row_bytes, ad + (size_t)c0 * a_stride,
                                 a_stride, od + (size_t)c0 * out_stride + r, out_stride);
        }
    }
}

/* The converted activation rows of weight w from row t0 of n: their
 * address, stride, and Q8_0 summaries (aux NULL for other dot types). */
static const uint8_t *mm_act(const kp_forward *f, const kp_weight *w, int n, int t0, size_t *a_stride,
                             const uint8_t **aux, size_t *aux_stride) {
    kp_dtype at = kp_vec_dot_type(w->type);
    const uint8_t *act = f->act[at];
    *a_stride = kp_dtype_row_size(at, w->n_in);
    *aux = NULL;
    *aux_stride = 0;
    if (at == KP_DTYPE_Q8_0) {
        *aux_stride = (size_t)(w->n_in / 32) * sizeof(kp_q8_0_aux);
        *aux = act + act_aux_offset((size_t)n, *a_stride) + (size_t)t0 * *aux_stride;
    }
    return act + (size_t)t0 * *a_stride;
}

/* Task = (token chunk, job, MM_ROWS weight rows), token chunk slowest, so
 * the threads work through one chunk of activations at a time. */
static void mm_task(void *vctx, int task, int thread) {
    (void)thread;
    mm_ctx *c = vctx;
    int per_chunk = c->task_start[c->n_jobs];
    int t0 = task / per_chunk * c->chunk;
    int nt = c->n - t0 < c->chunk ? c->n - t0 : c->chunk;
    task %= per_chunk;
    int j = 0;
    while (task >= c->task_start[j + 1]) j++;
    const mm_job *job = &c->jobs[j];
    const kp_weight *w = job->w;
    int64_t r0 = (int64_t)(task - c->task_start[j]) * MM_ROWS;
    int64_t r1 = r0 + MM_ROWS < w->n_out ? r0 + MM_ROWS : w->n_out;
    size_t a_stride, aux_stride;
    const uint8_t *aux, *ad = mm_act(c->f, w, c->n, t0, &a_stride, &aux, &aux_stride);
    mm_block(c->f->k, w, r0, r1, ad, a_stride, aux, aux_stride, nt, job->out + (size_t)t0 * w->n_out + r0,
             (size_t)w->n_out);
}

typedef struct {
    kp_forward *f;
    const float *x;
    const int32_t *rows; /* activation row i is row rows[i] of x; NULL: row i */
    int n;               /* tokens */
    int64_t n_in;
    kp_dtype at;
    kp_dtype wtype;
} quant_ctx;

static void quant_task(void *vctx, int task, int thread) {
    (void)thread;
    quant_ctx *c = vctx;
    size_t stride = kp_dtype_row_size(c->at, c->n_in);
    uint8_t *row = c->f->act[c->at] + (size_t)task * stride;
    size_t src = (size_t)(c->rows ? c->rows[task] : task);
    c->f->k->quantize_act[c->wtype](c->x + src * c->n_in, row, c->n_in);
    if (c->at == KP_DTYPE_Q8_0) {
        size_t nb = (size_t)(c->n_in / 32);
        kp_q8_0_aux *aux = (kp_q8_0_aux *)(c->f->act[c->at] + act_aux_offset((size_t)c->n, stride));
        kp_q8_0_aux_row(row, aux + (size_t)task * nb, c->n_in);
    }
}

/* Converts the n rows of x (row i = row rows[i] of x, or row i when rows
 * is NULL) to w's dot type into f->act, unless done[that type] already. */
static kp_status convert_act(kp_forward *f, const float *x, const int32_t *rows, int n, const kp_weight *w,
                             bool *done, kp_error *err) {
    kp_dtype at = kp_vec_dot_type(w->type);
    if (done[at]) return KP_OK;
    done[at] = true;
    size_t need = act_bytes(at, (size_t)n, w->n_in);
    if (!kp_grow((void **)&f->act[at], &f->act_cap[at], need, 1))
        return kp_fail(err, KP_ENOMEM, "out of memory for activations");
    quant_ctx q = {f, x, rows, n, w->n_in, at, w->type};
    if (n >= 8) kp_threads_run(f->threads, quant_task, &q, n);
    else for (int t = 0; t < n; t++) quant_task(&q, t, 0);
    return KP_OK;
}

/* out_j = x @ w_j for the jobs (all w_j share n_in); x is [n][n_in]. */
static kp_status matmul(kp_forward *f, const float *x, int n, int n_jobs, const mm_job *jobs,
                        kp_error *err) {
    mm_ctx c = {.f = f, .n = n, .chunk = n, .n_jobs = n_jobs};
    bool done[KP_DTYPE_COUNT_] = {false};
    kp_status st;
    c.task_start[0] = 0;
    for (int j = 0; j < n_jobs; j++) {
        const kp_weight *w = jobs[j].w;
        kp_dtype at = kp_vec_dot_type(w->type);
        c.jobs[j] = jobs[j];
        c.task_start[j + 1] = c.task_start[j] + (int)((w->n_out + MM_ROWS - 1) / MM_ROWS);
        size_t a_stride = kp_dtype_row_size(at, w->n_in);
        if ((size_t)c.chunk * a_stride > MM_ACT_BYTES) {
            size_t fit = MM_ACT_BYTES / a_stride / 4 * 4;
            c.chunk = fit < 4 ? 4 : (int)fit;
        }
        if ((st = convert_act(f, x, NULL, n, w, done, err)) != KP_OK) return st;
    }
    int n_chunks = (n + c.chunk - 1) / c.chunk;
    kp_threads_run(f->threads, mm_task, &c, n_chunks * c.task_start[n_jobs]);
    return KP_OK;
}

/* ---- experts --------------------------------------------------------------- */

/*
 * A mixture-of-experts FFN (model.h, Experts) for a batch of n tokens,
 * K = n_expert_used:
 *
 *   router = xn @ w_router; p = softmax(router)          [n][n_expert]
 *   per token: the K experts of highest p, in rank order  moe_sel [n][K]
 *              w_j = p_j / max(sum_j p_j, 2^-14)            moe_w   [n][K]
 *   group the n x K (token, rank) pairs by expert, tokens in order:
 *
 *     grouped rows   | expert 0: t1 t4 t5 | expert 2: t0 t1 | expert 3: t0 t4 ... |
 *     moe_first      0                    3                 5
 *     moe_token[r]   the token of row r;  moe_slot[t][j]: the row of (t, rank j)
 *
 *   the xn rows of the grouped rows are converted once into the activation
 *   buffer; then one parallel region runs every chosen expert's gate and up
 *   matrices over its rows, each expert's matrices read once for the whole
 *   batch (decode: the K experts' rows only), SwiGLU, and a second region
 *   the down matrices into moe_out; finally
 *
 *   ffn[t] = w_0 y(t, 0) + w_1 y(t, 1) + ...               in rank order
 *
 * as llama.cpp adds its weighted expert outputs. A token's result depends
 * on its own row alone (the kernels compute each output independently of
 * the call's shape), so any batch split gives the same bits.
 */

/* Softmax of the router logits in place, as ggml's CPU soft_max: exp of
 * the difference to the max in float, summed in double, scaled by 1/sum. */
static void moe_softmax(float *p, uint32_t n) {
    float mx = -INFINITY;
    for (uint32_t e = 0; e < n; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0;
    for (uint32_t e = 0; e < n; e++) sum += (double)(p[e] = expf(p[e] - mx));
    float inv = (float)(1.0 / sum);
    for (uint32_t e = 0; e < n; e++) p[e] *= inv;
}

/* Token t's K experts (highest p first, ties to the lower id) and their
 * weights: with KP_GATE_SOFTMAX p are probabilities and the weights the
 * chosen ones renormalized; with KP_GATE_SOFTMAX_TOPK p are logits and the
 * weights the softmax of the chosen ones. */
static void moe_route(const kp_hparams *hp, const float *p, int32_t *sel, float *w) {
    uint32_t K = hp->n_expert_used;
    double sum = 0;
    for (uint32_t j = 0; j < K; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < hp->n_expert; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j && !taken; i++) taken = sel[i] == (int32_t)e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
        }
        sel[j] = best;
        w[j] = p[best];
        sum += (double)w[j];
    }
    if (hp->gate == KP_GATE_SOFTMAX_TOPK) {
        moe_softmax(w, K);
        return;
    }
    float s = (float)sum;
    if (s < 6.103515625e-5f) s = 6.103515625e-5f; /* llama.cpp's clamp: the smallest normal F16 */
    for (uint32_t j = 0; j < K; j++) w[j] /= s;
}

/* Adds each expert's bias row (bias[e][0 .. width), NULL: none) to its
 * grouped rows of x ([rows][width]). */
static void moe_bias(const kp_forward *f, const float *bias, float *x, size_t width) {
    if (!bias) return;
    for (uint32_t e = 0; e < f->m->hp.n_expert; e++)
        for (int32_t r = f->moe_first[e]; r < f->moe_first[e + 1]; r++)
            for (size_t i = 0; i < width; i++) x[(size_t)r * width + i] += bias[(size_t)e * width + i];
}

/* Groups the n x K (token, rank) pairs by expert (see above). */
static void moe_group(kp_forward *f, int n) {
    const kp_hparams *hp = &f->m->hp;
    uint32_t K = hp->n_expert_used, E = hp->n_expert;
    int32_t *first = f->moe_first;
    memset(first, 0, ((size_t)E + 1) * sizeof *first);
    for (size_t i = 0; i < (size_t)n * K; i++) first[f->moe_sel[i] + 1]++;
    for (uint32_t e = 0; e < E; e++) first[e + 1] += first[e];
    for (int t = 0; t < n; t++) /* tokens in order; first[e] walks to the next expert's start */
        for (uint32_t j = 0; j < K; j++) {
            int32_t r = first[f->moe_sel[(size_t)t * K + j]]++;
            f->moe_token[r] = t;
            f->moe_slot[(size_t)t * K + j] = r;
        }
    for (uint32_t e = E; e > 0; e--) first[e] = first[e - 1]; /* back to each expert's start */
    first[0] = 0;
}

typedef struct {
    kp_forward *f;
    const moe_job *jobs;
    int n_jobs;
    int n_rows;          /* grouped rows (their activations' count) */
    const int *task_start; /* [n_jobs + 1] */
} moe_ctx;

/* Task = (job, MM_ROWS rows of its matrix) over all the job's rows. */
static void moe_task(void *vctx, int task, int thread) {
    (void)thread;
    const moe_ctx *c = vctx;
    int lo = 0, hi = c->n_jobs - 1;
    while (lo < hi) { /* the job whose task range holds task */
        int mid = (lo + hi + 1) / 2;
        if (c->task_start[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    const moe_job *job = &c->jobs[lo];
    const kp_weight *w = &job->w;
    int64_t r0 = (int64_t)(task - c->task_start[lo]) * MM_ROWS;
    int64_t r1 = r0 + MM_ROWS < w->n_out ? r0 + MM_ROWS : w->n_out;
    size_t a_stride, aux_stride;
    const uint8_t *aux, *ad = mm_act(c->f, w, c->n_rows, job->first, &a_stride, &aux, &aux_stride);
    mm_block(c->f->k, w, r0, r1, ad, a_stride, aux, aux_stride, job->n, job->out + r0, (size_t)w->n_out);
}

/* One parallel region over the experts' products jobs[0 .. n_jobs) whose
 * inputs are the n_rows grouped rows of x (row r = row rows[r] of x, or
 * row r when rows is NULL). */
static kp_status moe_matmul(kp_forward *f, const float *x, const int32_t *rows, int n_rows, const moe_job *jobs,
                            int n_jobs, kp_error *err) {
    bool done[KP_DTYPE_COUNT_] = {false};
    int task_start[2 * 1024 + 1];
    kp_status st;
    task_start[0] = 0;
    for (int j = 0; j < n_jobs; j++) {
        task_start[j + 1] = task_start[j] + (int)((jobs[j].w.n_out + MM_ROWS - 1) / MM_ROWS);
        if ((st = convert_act(f, x, rows, n_rows, &jobs[j].w, done, err)) != KP_OK) return st;
    }
    moe_ctx c = {f, jobs, n_jobs, n_rows, task_start};
    if (n_jobs > 0) kp_threads_run(f->threads, moe_task, &c, task_start[n_jobs]);
    return KP_OK;
}

/* ffn = the experts' weighted sum for the n tokens of f->xn, into f->xn. */
static kp_status moe_ffn(kp_forward *f, int n, const kp_layer *L, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    size_t E = hp->n_embd, X = hp->n_ff_exp, K = hp->n_expert_used;
    int rows = n * (int)K;
    kp_status st;
    mm_job r = {&L->w_router, f->router};
    if ((st = matmul(f, f->xn, n, 1, &r, err)) != KP_OK) return st;
    for (int t = 0; t < n; t++) {
        float *p = f->router + (size_t)t * hp->n_expert;
        if (L->b_router)
            for (uint32_t e = 0; e < hp->n_expert; e++) p[e] += L->b_router[e];
        if (hp->gate == KP_GATE_SOFTMAX) moe_softmax(p, hp->n_expert);
        moe_route(hp, p, f->moe_sel + (size_t)t * K, f->moe_w + (size_t)t * K);
    }
    moe_group(f, n);
    moe_job *jobs = f->moe_jobs;
    int nj = 0;
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        int32_t a = f->moe_first[e], cnt = f->moe_first[e + 1] - a;
        if (cnt == 0) continue; /* not chosen by any token: not read */
        jobs[nj++] = (moe_job){kp_expert_matrix(&L->e_gate, e), e, a, cnt, f->gate + (size_t)a * X};
        jobs[nj++] = (moe_job){kp_expert_matrix(&L->e_up, e), e, a, cnt, f->up + (size_t)a * X};
    }
    if ((st = moe_matmul(f, f->xn, f->moe_token, rows, jobs, nj, err)) != KP_OK) return st;
    moe_bias(f, L->b_gate_exps, f->gate, X);
    moe_bias(f, L->b_up_exps, f->up, X);
    swiglu_ctx sw = {f->gate, f->up, X, f->ak, hp->swiglu_limit, hp->swiglu_alpha, NULL};
    if (rows >= 4) kp_threads_run(f->threads, swiglu_task, &sw, rows);
    else for (int i = 0; i < rows; i++) swiglu_task(&sw, i, 0);
    for (int j = 0; j < nj / 2; j++) { /* the down matrices of the same experts */
        const moe_job g = jobs[2 * j];
        jobs[j] = (moe_job){kp_expert_matrix(&L->e_down, g.expert), g.expert, g.first, g.n,
                            f->moe_out + (size_t)g.first * E};
    }
    if ((st = moe_matmul(f, f->gate, NULL, rows, jobs, nj / 2, err)) != KP_OK) return st;
    moe_bias(f, L->b_down_exps, f->moe_out, E);
    for (int t = 0; t < n; t++) {
        float *out = f->xn + (size_t)t * E;
        const float *w = f->moe_w + (size_t)t * K;
        const int32_t *slot = f->moe_slot + (size_t)t * K;
        const float *y = f->moe_out + (size_t)slot[0] * E;
        for (size_t i = 0; i < E; i++) out[i] = y[i] * w[0];
        for (size_t j = 1; j < K; j++) {
            y = f->moe_out + (size_t)slot[j] * E;
            for (size_t i = 0; i < E; i++) out[i] += y[i] * w[j];
        }
    }
    return KP_OK;
}

/* ---- rope ---------------------------------------------------------------- */

/* YaRN's correction range for rope base (ggml_rope_yarn_corr_dims): the
 * pair indices where a rotation makes beta_fast, resp. beta_slow, turns
 * over the original context, floored / ceiled and kept in [0, n_dims - 1]. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float beta, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (beta * 2 * 3.14159265358979323846f)) / (2 * logf(base));
}

static void yarn_corr_dims(int n_dims, int n_ctx_orig, float base, float beta_fast, float beta_slow, float dims[2]) {
    float start = floorf(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base));
    float end = ceilf(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base));
    dims[0] = start > 0 ? start : 0;
    dims[1] = end < (float)(n_dims - 1) ? end : (float)(n_dims - 1);
}

/* cos and sin of every (token, pair) into out, for rope base and scale,
 * computed as ggml's CPU rope does, in float: theta_0 = pos, theta_(i+1) =
 * theta_i * base^(-2/n_rot) (one rounding per step), the angle
 * freq_scale * (theta_i / factor_i), then cosf and sinf. With YaRN
 * (hp.rope_yarn) the angle blends toward theta_i / factor_i by a ramp over
 * the correction range, and cos and sin are scaled by mscale, as ggml's
 * rope_yarn. IMROPE (hp.rope_imrope, model.h's Hybrid) gives the pairs of
 * the fourth section angle 0 (text tokens' fourth position). (An exact angle
 * differs from it by up to ~1e-4 rad at a few hundred positions, which a
 * GELU looked up by its F16 input, gemma3's, turns into jumps of 2^-11.) */
static void rope_tables(kp_forward *f, const kp_batch *b, float base, float freq_scale, float *out) {
    const kp_hparams *hp = &f->m->hp;
    int half = (int)hp->n_rot / 2;
    const float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
    float corr[2] = {0, 0}, mscale = 1.0f;
    if (hp->rope_yarn) {
        yarn_corr_dims((int)hp->n_rot, (int)hp->yarn_n_ctx_orig, base, hp->yarn_beta_fast, hp->yarn_beta_slow, corr);
        mscale = hp->yarn_attn_factor * (1.0f + 0.1f * logf(1.0f / freq_scale));
    }
    const int32_t *sec = hp->rope_sections;
    const int sect_dims = sec[0] + sec[1] + sec[2] + sec[3];
    for (int t = 0; t < b->n_tokens; t++) {
        float *cs = out + (size_t)t * hp->n_rot;
        float theta = (float)b->pos[t];
        for (int i = 0; i < half; i++) {
            float ff = f->m->rope_freqs ? f->m->rope_freqs[i] : 1.0f;
            float th = theta;
            if (hp->rope_imrope) { /* a pair of none of the first three sections: position 0 for text */
                int s = i % sect_dims;
                bool pos = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) ||
                           (s % 3 == 2 && s < 3 * sec[2]);
                if (!pos) th = 0.0f;
            }
            float extrap = th / ff, angle = freq_scale * extrap;
            if (hp->rope_yarn) { /* pairs below corr[0] keep the extrapolated angle, above corr[1] the scaled one */
                float y = ((float)i - corr[0]) / (corr[1] - corr[0] > 0.001f ? corr[1] - corr[0] : 0.001f);
                float mix = 1.0f - (y < 0 ? 0 : y > 1 ? 1 : y);
                angle = angle * (1.0f - mix) + extrap * mix;
            }
            cs[2 * i] = cosf(angle) * mscale;
            cs[2 * i + 1] = sinf(angle) * mscale;
            theta *= theta_scale;
        }
    }
}

static void rope_apply(const kp_hparams *hp, float *v, const float *cs) {
    int half = (int)hp->n_rot / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int a = hp->rope_type == KP_ROPE_NORM ? 2 * i : i;
        int bb = hp->rope_type == KP_ROPE_NORM ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[bb];
        v[a] = x0 * c - x1 * s;
        v[bb] = x0 * s + x1 * c;
    }
}

/* ---- attention ----------------------------------------------------------- */

typedef struct {
    kp_forward *f;
    const kp_batch *b;
    uint32_t layer;
    int n_chunks;        /* position chunks per (token, kv head); 1: tiles */
    int n_tiles;
    float scale;
    uint32_t window;     /* WINDOW layer: positions each query sees; 0: all */
    const float *sinks;  /* [n_head] the layer's sink logits, or NULL */
} att_ctx;

/* Head g of kv-head h's sink logit, -INFINITY without sinks. */
static float att_sink(const att_ctx *c, int h, int g, int G) {
    return c->sinks ? c->sinks[h * G + g] : -INFINITY;
}

/* The first position query position pos sees: pos - window + 1 (at least 0),
 * 0 in a FULL layer. */
static int64_t att_first(uint32_t window, int64_t pos) {
    return window && pos + 1 > (int64_t)window ? pos + 1 - (int64_t)window : 0;
}

/* The step of cached positions from p (< p1) of sequence s: its row count,
 * K and V rows. A step ends at a block's end or, inside a block, every
 * KP_ATTN_STEP rows, so where steps start depends only on the positions:
 * a token gets the same steps alone (decode) as inside a tile (prefill). */
static int64_t att_step_at(kp_forward *f, const kp_kvseq *s, uint32_t layer, uint32_t h, int64_t p, int64_t p1,
                           const void **k, const void **v) {
    int64_t B = kp_kvpool_config_of(f->kv)->block_size;
    int64_t r = p % B, rn = KP_ATTN_STEP - r % KP_ATTN_STEP;
    if (rn > B - r) rn = B - r;
    if (rn > p1 - p) rn = p1 - p;
    int32_t blk = s->blocks[p / B];
    *k = (const uint8_t *)kp_kvpool_k(f->kv, blk, layer, h) + (size_t)r * kp_kvpool_k_row_bytes(f->kv);
    *v = (const uint8_t *)kp_kvpool_v(f->kv, blk, layer, h) + (size_t)r * kp_kvpool_v_row_bytes(f->kv);
    return rn;
}

/* Where the step holding position p ends (att_step_at's steps, which
 * depend on the position alone). */
static int64_t att_step_end(const kp_forward *f, int64_t p) {
    int64_t B = kp_kvpool_config_of(f->kv)->block_size;
    int64_t r = p % B, rn = KP_ATTN_STEP - r % KP_ATTN_STEP;
    return p + (rn > B - r ? B - r : rn);
}

/* Streams the cached positions [p0, p1) of sequence s (layer, kv-head h)
 * through tile t, step by step. Each step is told the next step's rows
 * (t->next_*), which it prefetches while it computes: the blocks of a
 * sequence are scattered over the pool, which the hardware prefetcher
 * cannot guess. K and V both F16 or both F32 take the table's own step
 * for that type; any other pair (Q8_0, Q4_0, mixed) takes tile_step_kv. */
static void att_stream(kp_forward *f, kp_attn_tile *t, const kp_kvseq *s, uint32_t layer, uint32_t h,
                       int64_t p0, int64_t p1) {
    const kp_attn_kernels *ak = f->ak;
    const kp_kvpool_config *kc = kp_kvpool_config_of(f->kv);
    kp_dtype kt = kc->kv_type, vt = kc->kv_type_v;
    int same = kt == vt ? (kt == KP_DTYPE_F16 ? 1 : kt == KP_DTYPE_F32 ? 2 : 0) : 0;
    size_t kr = kp_kvpool_k_row_bytes(f->kv), vr = kp_kvpool_v_row_bytes(f->kv);
    size_t row_bytes = kr > vr ? kr : vr; /* the prefetch hint covers the longer of the two */
    const void *k = NULL, *v = NULL;
    int64_t rn = p0 < p1 ? att_step_at(f, s, layer, h, p0, p1, &k, &v) : 0;
    t->next_k = k, t->next_v = v, t->next_bytes = (size_t)rn * row_bytes;
    kp_attn_prefetch_next(t, 0, 1); /* the first step's rows, before it needs them */
    for (int64_t p = p0; p < p1;) {
        const void *kn = NULL, *vn = NULL;
        int64_t pn = p + rn, nn = pn < p1 ? att_step_at(f, s, layer, h, pn, p1, &kn, &vn) : 0;
        t->next_k = kn;
        t->next_v = vn;
        t->next_bytes = (size_t)nn * row_bytes;
        if (same == 1) ak->tile_step_f16(t, k, v, (int)rn, (int32_t)p);
        else if (same == 2) ak->tile_step_f32(t, k, v, (int)rn, (int32_t)p);
        else ak->tile_step_kv(t, k, kt, v, vt, (int)rn, (int32_t)p);
        p = pn, k = kn, v = vn, rn = nn;
    }
}

/* Decode with few tokens: a task is (token, kv-head, chunk of positions);
 * it leaves the chunk's partial softmax state in f->partials, per head of
 * the group: [max, sum, acc[hd]]. */
static void att_task(void *vctx, int task, int thread) {
    att_ctx *c = vctx;
    kp_forward *f = c->f;
    const kp_hparams *hp = &f->m->hp;
    const kp_kvpool_config *kc = kp_kvpool_config_of(f->kv);
    int hd = (int)hp->head_dim, G = (int)(hp->n_head / hp->n_head_kv);
    int chunk = task % c->n_chunks;
    int h = (task / c->n_chunks) % (int)hp->n_head_kv;
    int t = task / c->n_chunks / (int)hp->n_head_kv;
    const kp_kvseq *s = c->b->seqs[c->b->seq[t]];
    int64_t n_pos = (int64_t)c->b->pos[t] + 1, lo = att_first(c->window, c->b->pos[t]);
    uint32_t B = kc->block_size;
    int64_t base = lo / B * B; /* chunks start on block edges from the window's block */
    int64_t per = (n_pos - base + c->n_chunks - 1) / c->n_chunks;
    per = (per + B - 1) / B * B;
    int64_t p0 = base + (int64_t)chunk * per, p1 = p0 + per < n_pos ? p0 + per : n_pos;
    if (p0 < lo) p0 = lo;
    float *part = f->partials + (size_t)task * G * (hd + 2);
    if (p0 >= p1) {
        for (int g = 0; g < G; g++) {
            part[g * (hd + 2)] = -INFINITY;
            part[g * (hd + 2) + 1] = 0;
        }
        return;
    }
    size_t Qd = (size_t)hp->n_head * hd;
    /* the chunks are merged, so no summation order is worth keeping */
    kp_attn_tile at = {.hd = hd, .G = G, .n_tok = 1, .pos0 = c->b->pos[t], .scale = c->scale,
                       .free_order = true, .ws = f->att_ws + (size_t)thread * f->att_ws_floats};
    f->ak->tile_begin(&at, f->q + (size_t)t * Qd + (size_t)h * G * hd, (int64_t)Qd);
    att_stream(f, &at, s, c->layer, (uint32_t)h, p0, p1);
    f->ak->tile_partial(&at, part);
}

/* Merges partial states a and b of one row ([m, l, o[hd]] each; b may be
 * NULL, either may have seen nothing) and the head's sink logit (a term of
 * the denominator only; -INFINITY: none) into its normalized output. */
static void att_merge2(const float *a, const float *b, float sink, int hd, float *out) {
    static const float none[2] = {-INFINITY, 0};
    const float *bb = b ? b : none;
    float m = a[0] > bb[0] ? a[0] : bb[0];
    m = sink > m ? sink : m;
    float wa = a[0] == -INFINITY ? 0.0f : expf(a[0] - m), wb = bb[0] == -INFINITY ? 0.0f : expf(bb[0] - m);
    float ws = sink == -INFINITY ? 0.0f : expf(sink - m);
    float inv = 1.0f / (a[1] * wa + bb[1] * wb + ws);
    for (int d = 0; d < hd; d++) out[d] = (a[2 + d] * wa + (b ? b[2 + d] * wb : 0.0f)) * inv;
}

/* A tile of a WINDOW layer. Token i sees [lo_i, pos_i], lo_i = pos_i - n_swa
 * + 1, and the kernels mask only above, so its keys go in two parts that
 * depend on its position alone: the head [lo_i, e) up to the end e of the
 * step holding lo_i, in a tile of its own (G rows, one step at most), and
 * the rest [e, pos_i] with the tile, whose tokens all have their lo in the
 * same step (attention() forms the tiles so), so every row of the tile may
 * see all of it. The two partial states are merged. A token gets the same
 * bits alone (decode) as in any tile. */
static void att_window_tile(att_ctx *c, kp_attn_tile *at, const kp_kvseq *s, uint32_t h, int t0, int T,
                            float *out, int64_t stride) {
    kp_forward *f = c->f;
    const kp_hparams *hp = &f->m->hp;
    int hd = (int)hp->head_dim, G = at->G;
    const float *q = f->q + (size_t)t0 * stride + (size_t)h * G * hd;
    int64_t e = att_step_end(f, att_first(c->window, c->b->pos[t0]));
    float *part = at->ws + kp_attn_tile_floats(hd, T * G), *head = part + (size_t)T * G * (hd + 2);
    f->ak->tile_begin(at, q, stride);
    att_stream(f, at, s, c->layer, h, e, (int64_t)c->b->pos[t0 + T - 1] + 1);
    f->ak->tile_partial(at, part);
    for (int i = 0; i < T; i++) {
        int32_t pos = c->b->pos[t0 + i];
        int64_t lo = att_first(c->window, pos), hi = e < (int64_t)pos + 1 ? e : (int64_t)pos + 1;
        kp_attn_tile one = {.hd = hd, .G = G, .n_tok = 1, .pos0 = pos, .scale = c->scale, .ws = at->ws};
        f->ak->tile_begin(&one, q + (size_t)i * stride, stride);
        att_stream(f, &one, s, c->layer, h, lo, hi);
        f->ak->tile_partial(&one, head);
        for (int g = 0; g < G; g++)
            att_merge2(head + (size_t)g * (hd + 2), part + ((size_t)i * G + g) * (hd + 2), att_sink(c, (int)h, g, G),
                       hd, out + (size_t)i * stride + (size_t)g * hd);
    }
}

/* Prefill: a task is (tile of consecutive tokens of one sequence, kv-head);
 * the tile's T * G query rows (about ATT_TILE_ROWS) share every cached K/V
 * step while it sits in L1 (see attn.h). Token i of the tile sees positions
 * 0..pos_i (causal). Tasks go kv-head by kv-head, so the threads share
 * one head's cached rows in L2 at a time, and within a head the last tiles,
 * which see the most positions, go first, so the threads finish together. */
static void att_tile_task(void *vctx, int task, int thread) {
    att_ctx *c = vctx;
    kp_forward *f = c->f;
    const kp_hparams *hp = &f->m->hp;
    int hd = (int)hp->head_dim, G = (int)(hp->n_head / hp->n_head_kv);
    int h = task / c->n_tiles;
    const int32_t *tile = f->tiles + 2 * (c->n_tiles - 1 - task % c->n_tiles);
    int t0 = tile[0], T = tile[1];
    const kp_kvseq *s = c->b->seqs[c->b->seq[t0]];
    size_t Qd = (size_t)hp->n_head * hd, off = (size_t)h * G * hd;
    kp_attn_tile at = {.hd = hd, .G = G, .n_tok = T, .pos0 = c->b->pos[t0], .scale = c->scale,
                       .ws = f->att_ws + (size_t)thread * f->att_ws_floats};
    if (c->window) {
        att_window_tile(c, &at, s, (uint32_t)h, t0, T, f->att + (size_t)t0 * Qd + off, (int64_t)Qd);
        return;
    }
    f->ak->tile_begin(&at, f->q + (size_t)t0 * Qd + off, (int64_t)Qd);
    att_stream(f, &at, s, c->layer, (uint32_t)h, 0, (int64_t)c->b->pos[t0 + T - 1] + 1);
    if (!c->sinks) {
        f->ak->tile_end(&at, f->att + (size_t)t0 * Qd + off, (int64_t)Qd);
        return;
    }
    float *part = at.ws + kp_attn_tile_floats(hd, T * G); /* the partial states, then the sinks */
    f->ak->tile_partial(&at, part);
    for (int i = 0; i < T; i++)
        for (int g = 0; g < G; g++)
            att_merge2(part + ((size_t)i * G + g) * (hd + 2), NULL, att_sink(c, h, g, G), hd,
                       f->att + (size_t)(t0 + i) * Qd + off + (size_t)g * hd);
}

/* Merges the chunk partials of each (token, kv head) and the heads' sink
 * logits (NULL: none) into f->att. */
static void att_merge(kp_forward *f, int n_tokens, int n_chunks, const float *sinks) {
    const kp_hparams *hp = &f->m->hp;
    int hd = (int)hp->head_dim, G = (int)(hp->n_head / hp->n_head_kv);
    size_t Qd = (size_t)hp->n_head * hd;
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < (int)hp->n_head_kv; h++)
            for (int g = 0; g < G; g++) {
                float *out = f->att + (size_t)t * Qd + ((size_t)h * G + g) * hd;
                size_t base = ((size_t)t * hp->n_head_kv + h) * n_chunks;
                float mx = -INFINITY, sink = sinks ? sinks[h * G + g] : -INFINITY;
                for (int c = 0; c < n_chunks; c++) {
                    float m = f->partials[(base + c) * G * (hd + 2) + g * (hd + 2)];
                    mx = m > mx ? m : mx;
                }
                mx = sink > mx ? sink : mx;
                double sum = sink == -INFINITY ? 0 : expf(sink - mx);
                memset(out, 0, (size_t)hd * sizeof(float));
                for (int c = 0; c < n_chunks; c++) {
                    const float *pp = f->partials + (base + c) * G * (hd + 2) + g * (hd + 2);
                    if (pp[0] == -INFINITY) continue;
                    float w = expf(pp[0] - mx);
                    sum += (double)w * pp[1];
                    for (int i = 0; i < hd; i++) out[i] += w * pp[2 + i];
                }
                float inv = (float)(1.0 / sum);
                for (int i = 0; i < hd; i++) out[i] *= inv;
            }
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static kp_status attention_run(kp_forward *f, const kp_batch *b, uint32_t layer, uint32_t kl, kp_error *err);

/* attention_run, timed, with its multiply-adds counted: a token at
 * position p sees min(p + 1, window) keys, each a dot product of head_dim
 * and a weighted sum of head_dim per query head (2 FLOP a multiply-add). */
static kp_status attention(kp_forward *f, const kp_batch *b, uint32_t layer, uint32_t kl, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    uint32_t window = f->m->layers[layer].kind == KP_LAYER_WINDOW ? hp->n_swa : 0;
    double keys = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        double vis = (double)b->pos[t] + 1;
        keys += window && vis > window ? (double)window : vis;
    }
    double t0 = mono_s();
    kp_status st = attention_run(f, b, layer, kl, err);
    f->att_seconds += mono_s() - t0;
    f->att_flops += 4.0 * (double)hp->head_dim * (double)hp->n_head * keys;
    return st;
}

void kp_forward_attn_work(const kp_forward *f, double *flops, double *seconds) {
    *flops = f->att_flops;
    *seconds = f->att_seconds;
}

/* Attention of model layer `layer`, whose K/V are the pool's layer kl. */
static kp_status attention_run(kp_forward *f, const kp_batch *b, uint32_t layer, uint32_t kl, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    int G = (int)(hp->n_head / hp->n_head_kv), hd = (int)hp->head_dim;
    uint32_t window = f->m->layers[layer].kind == KP_LAYER_WINDOW ? hp->n_swa : 0;
    const float *sinks = f->m->layers[layer].attn_sinks;
    int64_t max_pos = 0;
    for (int t = 0; t < b->n_tokens; t++) max_pos = b->pos[t] + 1 > max_pos ? b->pos[t] + 1 : max_pos;
    int base_tasks = b->n_tokens * (int)hp->n_head_kv;
    int n_chunks = 1;
    if (base_tasks < 4 * f->n_threads && f->n_threads > 1) {
        /* few (token, kv-head) pairs (decode): split the positions so every
         * thread streams an equal share of the cache, in as few tasks as
         * that takes: each task starts cold and leaves a partial to merge
         * (n_threads chunks per pair against 4 x that: tg at depth 2048
         * 157 -> 166 tok/s, 8192 75 -> 78, 135M Q4_0, 2 threads) */
        n_chunks = f->n_threads;
        int64_t span = window && max_pos > (int64_t)window ? (int64_t)window : max_pos;
        int64_t by_len = (span + ATT_MIN_CHUNK - 1) / ATT_MIN_CHUNK;
        if (n_chunks > by_len) n_chunks = (int)by_len;
        if (n_chunks < 1) n_chunks = 1;
    }
    int tile_tokens = ATT_TILE_ROWS / G < 1 ? 1 : ATT_TILE_ROWS / G;
    /* per-thread workspace, a multiple of 16 floats so each one starts on
     * a cache line; WINDOW tiles keep two partial states per row after it */
    size_t ws = kp_attn_tile_floats(hd, n_chunks == 1 ? tile_tokens * G : G);
    if (window || sinks) ws += (size_t)(tile_tokens + 1) * G * (hd + 2);
    ws = (ws + 15) & ~(size_t)15;
    if (ws * f->n_threads > f->att_ws_cap) {
        free(f->att_ws);
        f->att_ws_cap = 0;
        f->att_ws = aligned_alloc(64, ws * f->n_threads * sizeof(float));
        if (!f->att_ws) return kp_fail(err, KP_ENOMEM, "out of memory for attention workspace");
        f->att_ws_cap = ws * f->n_threads;
    }
    f->att_ws_floats = ws;
    if (n_chunks > 1) {
        size_t need = (size_t)base_tasks * n_chunks * G * (hd + 2) * sizeof(float);
        if (!kp_grow((void **)&f->partials, &f->cap_partials, need, 1))
            return kp_fail(err, KP_ENOMEM, "out of memory for attention partials");
    }
    att_ctx c = {f, b, kl, n_chunks, 0, hp->attn_scale_on_q ? 1.0f : hp->attn_scale, window, sinks};
    if (n_chunks == 1) {
        /* tiles: runs of consecutive tokens of one sequence, at most tile_tokens */
        if (!kp_grow((void **)&f->tiles, &f->cap_tiles, (size_t)b->n_tokens * 2 * sizeof(int32_t), 1))
            return kp_fail(err, KP_ENOMEM, "out of memory for attention tiles");
        int n_tiles = 0;
        for (int t = 0; t < b->n_tokens;) {
            int T = 1;
            while (T < tile_tokens && t + T < b->n_tokens && b->seq[t + T] == b->seq[t] &&
                   b->pos[t + T] == b->pos[t] + T &&
                   (!window || att_step_end(f, att_first(window, b->pos[t + T])) ==
                                   att_step_end(f, att_first(window, b->pos[t]))))
                T++;
            f->tiles[2 * n_tiles] = t;
            f->tiles[2 * n_tiles + 1] = T;
            n_tiles++;
            t += T;
        }
        c.n_tiles = n_tiles;
        kp_threads_run(f->threads, att_tile_task, &c, n_tiles * (int)hp->n_head_kv);
        return KP_OK;
    }
    kp_threads_run(f->threads, att_task, &c, base_tasks * n_chunks);
    att_merge(f, b->n_tokens, n_chunks, sinks);
    return KP_OK;
}

/* Softmax weights of the batch's last token, (layer, probe_head), for inspect. */
static kp_status probe_capture(kp_forward *f, const kp_batch *b, uint32_t layer, uint32_t kl, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    const kp_kvpool_config *kc = kp_kvpool_config_of(f->kv);
    if (f->probe_layer != (int)layer || f->probe_head < 0 || f->probe_head >= (int)hp->n_head)
        return KP_OK;
    int t = b->n_tokens - 1, hd = (int)hp->head_dim;
    int kvh = f->probe_head / (int)(hp->n_head / hp->n_head_kv);
    int32_t n_pos = b->pos[t] + 1;
    if (!kp_grow((void **)&f->probe, &f->probe_cap, (size_t)n_pos + (size_t)hd, sizeof(float)))
        return kp_fail(err, KP_ENOMEM, "out of memory for the attention probe");
    const kp_kvseq *s = b->seqs[b->seq[t]];
    const float *qv = f->q + (size_t)t * hp->n_head * hd + (size_t)f->probe_head * hd;
    float mx = -INFINITY, scale = hp->attn_scale_on_q ? 1.0f : hp->attn_scale;
    int64_t lo = att_first(f->m->layers[layer].kind == KP_LAYER_WINDOW ? hp->n_swa : 0, b->pos[t]);
    for (int32_t p = 0; p < n_pos; p++) {
        if (p < lo) { /* outside the window: weight 0 */
            f->probe[p] = -INFINITY;
            continue;
        }
        const uint8_t *kb = kp_kvpool_k(f->kv, s->blocks[p / kc->block_size], kl, (uint32_t)kvh);
        size_t off = (size_t)(p % kc->block_size) * hd;
        float d;
        if (kc->kv_type == KP_DTYPE_F16) {
            d = f->k->dot_f32_f16(hd, qv, (const uint16_t *)kb + off);
        } else if (kc->kv_type == KP_DTYPE_F32) {
            d = f->k->dot_f32(hd, qv, (const float *)kb + off);
        } else { /* a quantized row, decoded past the probe's n_pos weights */
            float *kf = f->probe + n_pos;
            kp_dequantize_row(kc->kv_type, kb + (size_t)(p % kc->block_size) * kp_kvpool_k_row_bytes(f->kv), kf, hd);
            d = f->k->dot_f32(hd, qv, kf);
        }
        f->probe[p] = d * scale;
        mx = f->probe[p] > mx ? f->probe[p] : mx;
    }
    const float *sinks = f->m->layers[layer].attn_sinks; /* a sink takes its share of the weight */
    float sink = sinks ? sinks[f->probe_head] : -INFINITY;
    mx = sink > mx ? sink : mx;
    double sum = sink == -INFINITY ? 0 : expf(sink - mx);
    for (int32_t p = 0; p < n_pos; p++) sum += f->probe[p] = expf(f->probe[p] - mx);
    for (int32_t p = 0; p < n_pos; p++) f->probe[p] = (float)(f->probe[p] / sum);
    f->probe_n = n_pos;
    return KP_OK;
}

/* ---- the pass ------------------------------------------------------------ */

static kp_status validate(kp_forward *f, const kp_batch *b, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    if (b->n_tokens <= 0) return kp_fail(err, KP_EINVAL, "empty batch");
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= hp->n_vocab)
            return kp_fail(err, KP_EINVAL, "token id %d out of range (vocabulary of %u)",
                           b->tokens[t], hp->n_vocab);
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
            return kp_fail(err, KP_EINVAL, "token %d names sequence %d of %d", t, b->seq[t], b->n_seqs);
        if (b->pos[t] < 0 || b->pos[t] >= INT32_MAX - 1)
            return kp_fail(err, KP_EINVAL, "position %d out of range", b->pos[t]);
    }
    /* per sequence: consecutive positions starting at or before its length */
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t expect = -1;
        for (int t = 0; t < b->n_tokens; t++) {
            if (b->seq[t] != s) continue;
            if (expect < 0) {
                if ((uint32_t)b->pos[t] > b->seqs[s]->n_pos)
                    return kp_fail(err, KP_EINVAL, "sequence %d: position %d leaves a gap after its %u cached positions",
                                   s, b->pos[t], b->seqs[s]->n_pos);
                /* a recurrent state goes on from where it stands, or restarts at 0 */
                if (hp->n_rec_layers && b->pos[t] != 0 &&
                    (!b->seqs[s]->rstate || (uint32_t)b->pos[t] != b->seqs[s]->rstate_pos))
                    return kp_fail(err, KP_EUNSUPPORTED,
                                   "sequence %d: position %d: the recurrent state of this model summarizes %u "
                                   "positions and cannot be cut back or skip ahead",
                                   s, b->pos[t], b->seqs[s]->rstate ? b->seqs[s]->rstate_pos : 0);
            } else if (b->pos[t] != expect) {
                return kp_fail(err, KP_EINVAL, "sequence %d: positions in a batch must be consecutive (%d after %d)",
                               s, b->pos[t], expect - 1);
            }
            expect = b->pos[t] + 1;
        }
    }
    return KP_OK;
}

/* One K or V row of hd floats into the pool as type t: F32 copied, F16
 * rounded to nearest even, Q8_0 / Q4_0 by ggml's reference quantizers
 * (kp_quantize_row: round to nearest, the bytes llama.cpp's KV copy writes
 * for Q4_0, and for Q8_0 up to how exact ties round). */
static void store_row(kp_dtype t, const float *x, uint8_t *dst, size_t hd) {
    if (t == KP_DTYPE_F16) kp_fp32_to_fp16_row(x, (uint16_t *)dst, (int64_t)hd);
    else if (t == KP_DTYPE_F32) memcpy(dst, x, hd * sizeof(float));
    else kp_quantize_row(t, x, dst, (int64_t)hd);
}

static void store_kv(kp_forward *f, const kp_batch *b, uint32_t layer) {
    const kp_hparams *hp = &f->m->hp;
    const kp_kvpool_config *kc = kp_kvpool_config_of(f->kv);
    size_t hd = hp->head_dim, KVd = (size_t)hp->n_head_kv * hd;
    for (int t = 0; t < b->n_tokens; t++) {
        const kp_kvseq *s = b->seqs[b->seq[t]];
        int32_t blk = s->blocks[b->pos[t] / kc->block_size];
        size_t ri = (size_t)(b->pos[t] % kc->block_size);
        for (uint32_t h = 0; h < hp->n_head_kv; h++) {
            const float *ks = f->kk + t * KVd + h * hd, *vs = f->vv + t * KVd + h * hd;
            store_row(kc->kv_type, ks, (uint8_t *)kp_kvpool_k(f->kv, blk, layer, h) + ri * kp_kvpool_k_row_bytes(f->kv),
                      hd);
            store_row(kc->kv_type_v, vs,
                      (uint8_t *)kp_kvpool_v(f->kv, blk, layer, h) + ri * kp_kvpool_v_row_bytes(f->kv), hd);
        }
    }
}

/* Reserves the blocks of every sequence of the batch; on failure every
 * sequence keeps its old length. */
static kp_status reserve_blocks(kp_forward *f, const kp_batch *b, kp_error *err) {
    kp_status st;
    for (int s = 0; s < b->n_seqs; s++) {
        uint32_t need = 0;
        int32_t first = -1;
        for (int t = 0; t < b->n_tokens; t++) {
            if (b->seq[t] != s) continue;
            if (first < 0) first = b->pos[t];
            need = (uint32_t)b->pos[t] + 1;
        }
        if (first < 0) continue;
        if ((uint32_t)first < b->seqs[s]->n_pos) kp_kvseq_truncate(b->seqs[s], f->kv, (uint32_t)first);
        if ((st = kp_kvseq_reserve(b->seqs[s], f->kv, need, err)) != KP_OK) return st;
    }
    return KP_OK;
}

/* A token's queries and keys made ready for attention: the biases, the
 * per-head norms, rope, the query scale (a task per token). */
typedef struct {
    kp_forward *f;
    const kp_layer *L;
    const float *rope_cs;
} qk_ctx;

static void qk_task(void *vctx, int t, int thread) {
    (void)thread;
    const qk_ctx *c = vctx;
    const kp_layer *L = c->L;
    const kp_hparams *hp = &c->f->m->hp;
    const size_t hd = hp->head_dim, Qd = (size_t)hp->n_head * hd, KVd = (size_t)hp->n_head_kv * hd;
    float *qt = c->f->q + (size_t)t * Qd, *kt = c->f->kk + (size_t)t * KVd, *vt = c->f->vv + (size_t)t * KVd;
    if (L->bq) {
        for (size_t i = 0; i < Qd; i++) qt[i] += L->bq[i];
        for (size_t i = 0; i < KVd; i++) kt[i] += L->bk[i];
        for (size_t i = 0; i < KVd; i++) vt[i] += L->bv[i];
    }
    if (L->q_norm) {
        for (uint32_t h = 0; h < hp->n_head; h++) rmsnorm(qt + h * hd, qt + h * hd, L->q_norm, (int64_t)hd, hp->rms_eps);
        for (uint32_t h = 0; h < hp->n_head_kv; h++)
            rmsnorm(kt + h * hd, kt + h * hd, L->k_norm, (int64_t)hd, hp->rms_eps);
    }
    const float *cs = c->rope_cs + (size_t)t * hp->n_rot;
    for (uint32_t h = 0; h < hp->n_head; h++) rope_apply(hp, qt + h * hd, cs);
    for (uint32_t h = 0; h < hp->n_head_kv; h++) rope_apply(hp, kt + h * hd, cs);
    if (hp->attn_scale_on_q)
        for (size_t i = 0; i < Qd; i++) qt[i] *= hp->attn_scale;
}

/* The attention half of layer l: x += [post-norm](attention(x) @ wo). */
static kp_status layer_attention(kp_forward *f, const kp_batch *b, uint32_t l, const kp_layer *L, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    int n = b->n_tokens;
    size_t hd = hp->head_dim, Qd = (size_t)hp->n_head * hd;
    kp_status st;
    norm_rows(f, n, f->xn, f->x, L->attn_norm);
    mm_job qkv[3] = {{&L->wq, hp->attn_gated ? f->qg : f->q}, {&L->wk, f->kk}, {&L->wv, f->vv}};
    if ((st = matmul(f, f->xn, n, 3, qkv, err)) != KP_OK) return st;
    if (hp->attn_gated) /* per head [query | gate]: the queries to q, the gates stay */
        for (int t = 0; t < n; t++)
            for (uint32_t h = 0; h < hp->n_head; h++)
                memcpy(f->q + (size_t)t * Qd + h * hd, f->qg + (size_t)t * 2 * Qd + 2 * (size_t)h * hd,
                       hd * sizeof(float));
    qk_ctx qc = {f, L, L->kind == KP_LAYER_WINDOW ? f->rope_cs_swa : f->rope_cs};
    run_rows(f, n, qk_task, &qc);
    store_kv(f, b, L->kv_layer);
    if ((st = attention(f, b, l, L->kv_layer, err)) != KP_OK) return st;
    if ((st = probe_capture(f, b, l, L->kv_layer, err)) != KP_OK) return st;
    if (hp->attn_gated) /* att *= sigmoid(gate), the gates in qg: per head [query | gate] */
        for (int t = 0; t < n; t++)
            for (uint32_t h = 0; h < hp->n_head; h++) {
                const float *g = f->qg + (size_t)t * 2 * Qd + (2 * (size_t)h + 1) * hd;
                float *a = f->att + (size_t)t * Qd + h * hd;
                for (size_t i = 0; i < hd; i++) a[i] *= 1.0f / (1.0f + expf(-g[i]));
            }
    mm_job o = {&L->wo, f->xn};
    if ((st = matmul(f, f->att, n, 1, &o, err)) != KP_OK) return st;
    residual_rows(f, n, L->bo, L->attn_post_norm);
    return KP_OK;
}

/* The mixer of RECURRENT layer L (the ri-th such layer): x += ssm_out(
 * deltanet(x)), each sequence's state of that layer updated (deltanet.h).
 * run_layers marked the sequences with tokens in the batch (rstate_pos
 * RSTATE_RUNNING). */
#define RSTATE_RUNNING UINT32_MAX
static kp_status layer_recurrent(kp_forward *f, const kp_batch *b, const kp_layer *L, uint32_t ri, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    int n = b->n_tokens;
    size_t E = hp->n_embd;
    kp_status st;
    norm_rows(f, n, f->xn, f->x, L->attn_norm);
    mm_job p3[3] = {{&L->w_qkv, f->r_qkv}, {&L->w_z, f->r_z}, {&L->w_beta, f->r_beta}};
    if ((st = matmul(f, f->xn, n, 3, p3, err)) != KP_OK) return st;
    mm_job pa = {&L->w_alpha, f->r_alpha};
    if ((st = matmul(f, f->xn, n, 1, &pa, err)) != KP_OK) return st;
    const uint64_t lf = kp_model_rec_layer_floats(hp);
    for (int s = 0; s < b->n_seqs; s++) {
        kp_kvseq *q = b->seqs[s];
        f->r_state[s] = q->rstate && q->rstate_pos == RSTATE_RUNNING ? q->rstate + ri * lf : NULL;
    }
    kp_dn_batch d = {hp,       L,        f->ak,      f->k->dot_f32, f->threads, n,        b->seq,
                     b->n_seqs, f->r_state, f->r_qkv, f->r_z,      f->r_beta,  f->r_alpha, f->r_out,
                     f->r_ones, f->r_scratch};
    kp_dn_run(&d);
    mm_job o = {&L->w_ssm_out, f->xn};
    if ((st = matmul(f, f->r_out, n, 1, &o, err)) != KP_OK) return st;
    for (size_t i = 0; i < (size_t)n * E; i++) f->x[i] += f->xn[i];
    return KP_OK;
}

/* Gives every sequence with tokens in the batch its recurrent state (zeros
 * when it starts at position 0) and marks it RSTATE_RUNNING until the pass
 * is done: a pass that fails halfway leaves it so, and validate() then
 * refuses to go on from it. */
static kp_status rec_states_begin(kp_forward *f, const kp_batch *b, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    if (!hp->n_rec_layers) return KP_OK;
    if (b->n_seqs > f->r_cap_seqs) {
        float **ns = realloc(f->r_state, (size_t)b->n_seqs * sizeof *ns);
        if (!ns) return kp_fail(err, KP_ENOMEM, "out of memory for %d sequences' states", b->n_seqs);
        f->r_state = ns;
        f->r_cap_seqs = b->n_seqs;
    }
    const uint64_t floats = kp_model_rec_state_floats(hp);
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t first = -1;
        for (int t = 0; t < b->n_tokens && first < 0; t++)
            if (b->seq[t] == s) first = b->pos[t];
        if (first < 0) continue;
        kp_kvseq *q = b->seqs[s];
        if (!q->rstate && !(q->rstate = malloc((size_t)floats * sizeof(float))))
            return kp_fail(err, KP_ENOMEM, "out of memory for a recurrent state (%llu bytes)",
                           (unsigned long long)floats * sizeof(float));
        if (first == 0) memset(q->rstate, 0, (size_t)floats * sizeof(float));
    }
    for (int s = 0; s < b->n_seqs; s++) /* marked only once every state is there */
        for (int t = 0; t < b->n_tokens; t++)
            if (b->seq[t] == s) {
                b->seqs[s]->rstate_pos = RSTATE_RUNNING;
                break;
            }
    return KP_OK;
}

/* out = (act(xn @ w_gate) * (xn @ w_up)) @ w_down for the n tokens of
 * f->xn (act: the model's, SiLU or GELU-tanh), through f->gate and f->up;
 * out may be f->xn. The dense FFN, and qwen35moe's shared expert. */
static kp_status dense_ffn(kp_forward *f, int n, const kp_weight *w_gate, const kp_weight *w_up,
                           const kp_weight *w_down, float *out, kp_error *err) {
    size_t F = (size_t)w_gate->n_out;
    kp_status st;
    mm_job gu[2] = {{w_gate, f->gate}, {w_up, f->up}};
    if ((st = matmul(f, f->xn, n, 2, gu, err)) != KP_OK) return st;
    swiglu_ctx sw = {f->gate, f->up, F, f->ak, 0, 0, f->m->hp.ffn_act == KP_FFN_GELU_TANH ? f->gelu : NULL};
    if (n >= 4) kp_threads_run(f->threads, swiglu_task, &sw, n);
    else for (int t = 0; t < n; t++) swiglu_task(&sw, t, 0);
    mm_job d = {w_down, out};
    return matmul(f, f->gate, n, 1, &d, err);
}

/* qwen35moe's shared expert (model.h, Shared expert) on the n tokens of
 * f->xn, into f->sh_out: its SwiGLU FFN times sigmoid(xn . gate_inp_shexp),
 * the gate's product in F32 as ggml's for an F32 1-D weight. */
static kp_status shared_expert(kp_forward *f, int n, const kp_layer *L, kp_error *err) {
    size_t E = f->m->hp.n_embd;
    kp_status st = dense_ffn(f, n, &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp, f->sh_out, err);
    if (st != KP_OK) return st;
    for (int t = 0; t < n; t++) {
        float g = f->k->dot_f32((int64_t)E, f->xn + (size_t)t * E, L->gate_inp_shexp);
        float s = 1.0f / (1.0f + expf(-g));
        float *y = f->sh_out + (size_t)t * E;
        for (size_t i = 0; i < E; i++) y[i] *= s;
    }
    return KP_OK;
}

/* The feed-forward half of a layer: x += [post-norm](ffn(x)). */
static kp_status layer_ffn(kp_forward *f, int n, const kp_layer *L, kp_error *err) {
    const kp_hparams *hp = &f->m->hp;
    size_t E = hp->n_embd;
    kp_status st;
    norm_rows(f, n, f->xn, f->x, L->ffn_norm);
    if (hp->n_expert) {
        /* the shared expert reads xn before the routed sum overwrites it */
        if (hp->n_ff_shexp && (st = shared_expert(f, n, L, err)) != KP_OK) return st;
        if ((st = moe_ffn(f, n, L, err)) != KP_OK) return st;
        if (hp->n_ff_shexp)
            for (size_t i = 0; i < (size_t)n * E; i++) f->xn[i] += f->sh_out[i];
    } else if ((st = dense_ffn(f, n, &L->w_gate, &L->w_up, &L->w_down, f->xn, err)) != KP_OK) {
        return st;
    }
    residual_rows(f, n, NULL, L->ffn_post_norm);
    return KP_OK;
}

/* The batch through every layer; the final-norm rows of the requested
 * tokens gathered at f->xn (*n_out of them). */
static kp_status run_layers(kp_forward *f, const kp_batch *b, int *n_out_ret, kp_error *err) {
    const kp_model *m = f->m;
    const kp_hparams *hp = &m->hp;
    kp_status st;
    *n_out_ret = 0;
    if ((st = validate(f, b, err)) != KP_OK) return st;
    int n = b->n_tokens;
    if ((st = reserve_blocks(f, b, err)) != KP_OK) return st;
    if ((st = ensure_scratch(f, n, err)) != KP_OK) return st;
    size_t E = hp->n_embd;
    for (int t = 0; t < n; t++)
        kp_dequantize_row(m->tok_embd.type,
                          (const uint8_t *)m->tok_embd.data + (size_t)b->tokens[t] * m->tok_embd.row_bytes,
                          f->x + t * E, (int64_t)E);
    if (hp->embd_scale != 1.0f)
        for (size_t i = 0; i < (size_t)n * E; i++) f->x[i] *= hp->embd_scale;
    rope_tables(f, b, hp->rope_base, hp->rope_freq_scale, f->rope_cs);
    if (hp->n_swa_layers > 0) rope_tables(f, b, hp->rope_base_swa, hp->rope_freq_scale_swa, f->rope_cs_swa);
    f->probe_n = 0;
    if ((st = rec_states_begin(f, b, err)) != KP_OK) return st;
    for (uint32_t l = 0, ri = 0; l < hp->n_layer; l++) {
        const kp_layer *L = f->layers ? &f->layers[l] : &m->layers[l];
        if (L->kind == KP_LAYER_RECURRENT) st = layer_recurrent(f, b, L, ri++, err);
        else st = layer_attention(f, b, l, L, err);
        if (st != KP_OK) return st;
        if ((st = layer_ffn(f, n, L, err)) != KP_OK) return st;
    }
    /* sequences now hold every position the batch wrote (and their states summarize them) */
    for (int t = 0; t < n; t++) {
        kp_kvseq *q = b->seqs[b->seq[t]];
        q->n_pos = (uint32_t)b->pos[t] + 1;
        if (hp->n_rec_layers) q->rstate_pos = q->n_pos;
    }
    /* logits for the requested tokens: gather their rows, norm, project */
    int n_out = 0;
    for (int t = 0; t < n; t++) {
        bool want = b->logits ? b->logits[t] != 0 : t == n - 1;
        if (!want) continue;
        rmsnorm(f->xn + (size_t)n_out * E, f->x + t * E, m->output_norm, (int64_t)E, hp->rms_eps);
        n_out++;
    }
    *n_out_ret = n_out;
    return KP_OK;
}

kp_status kp_forward_hidden(kp_forward *f, const kp_batch *b, float *hidden_out, kp_error *err) {
    int n_out = 0;
    kp_status st = run_layers(f, b, &n_out, err);
    if (st == KP_OK && n_out)
        memcpy(hidden_out, f->xn, (size_t)n_out * f->m->hp.n_embd * sizeof *hidden_out);
    return st;
}

kp_status kp_forward_run(kp_forward *f, const kp_batch *b, float *logits_out, kp_error *err) {
    const kp_model *m = f->m;
    const kp_hparams *hp = &m->hp;
    int n_out = 0;
    kp_status st = run_layers(f, b, &n_out, err);
    if (st != KP_OK || n_out == 0) return st;
    mm_job lo = {f->layers ? &f->output : &m->output, logits_out};
    if ((st = matmul(f, f->xn, n_out, 1, &lo, err)) != KP_OK) return st;
    if (hp->logit_softcap > 0) {
        float cap = hp->logit_softcap, inv = 1.0f / cap;
        for (size_t i = 0; i < (size_t)n_out * hp->n_vocab; i++) logits_out[i] = tanhf(logits_out[i] * inv) * cap;
    }
    return KP_OK;
}
