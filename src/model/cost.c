/*
 * cost.c - a token's work and weight traffic (see cost.h). Reads the
 * model's weight views only; no state.
 */
#include "model/cost.h"

static uint64_t elems(const kp_weight *w) { return (uint64_t)w->n_in * (uint64_t)w->n_out; }
static uint64_t bytes(const kp_weight *w) { return (uint64_t)w->row_bytes * (uint64_t)w->n_out; }

void kp_model_cost(const kp_model *m, kp_cost *out) {
    uint64_t n = 0, b = 0, K = m->hp.n_expert_used;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const kp_layer *L = &m->layers[l];
        /* an MoE layer's w_gate/w_up/w_down are empty (0 elements) and its router is set */
        /* a recurrent layer's attention weights are empty, its delta-net projections set */
        /* a qwen35moe layer's shared expert is set too (every token goes through it) */
        const kp_weight *ws[] = {&L->wq,         &L->wk,       &L->wv,         &L->wo,      &L->w_gate,
                                 &L->w_up,       &L->w_down,   &L->w_router,   &L->w_qkv,   &L->w_z,
                                 &L->w_beta,     &L->w_alpha,  &L->w_ssm_out,  &L->w_gate_shexp,
                                 &L->w_up_shexp, &L->w_down_shexp};
        for (unsigned i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            n += elems(ws[i]);
            b += bytes(ws[i]);
        }
        const kp_experts *xs[] = {&L->e_gate, &L->e_up, &L->e_down};
        for (unsigned i = 0; m->hp.n_expert && i < 3; i++) { /* the K experts a token is routed to */
            n += K * (uint64_t)xs[i]->n_in * (uint64_t)xs[i]->n_out;
            b += K * (uint64_t)xs[i]->row_bytes * (uint64_t)xs[i]->n_out;
        }
    }
    /* tied: output is a view of token_embd, which is then read once, here */
    out->output_ops = 2 * elems(&m->output);
    out->matmul_ops = 2 * n + out->output_ops;
    out->weight_bytes_read = b + bytes(&m->output);
}

uint64_t kp_model_attn_ops(const kp_hparams *hp, uint64_t d) {
    uint64_t win = hp->n_swa && d > hp->n_swa ? hp->n_swa : d;
    uint64_t per_head = (uint64_t)(hp->n_kv_layer - hp->n_swa_layers) * d + (uint64_t)hp->n_swa_layers * win;
    return 4 * per_head * hp->n_head * hp->head_dim;
}
