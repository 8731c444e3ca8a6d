/*
 * cost.h - what one token costs a loaded model: the multiply-adds of its
 * matrix products, the weight bytes a decode step reads, and the
 * attention's work at a cache depth.
 *
 * `kvpin bench` turns its tokens/s into achieved GOPS (prompt batches,
 * against the int8 peak) and GB/s (decode, against the read bandwidth) with
 * these figures (kernels/probe.h measures the ceilings). Counted from the
 * weights the forward pass uses (model.h), so they follow the file's shape
 * and element types; 2 operations per multiply-add.
 *
 *   matmul_ops         2 x the elements of every 2-D matrix a token is
 *                      multiplied by: per layer wq, wk, wv, wo, w_gate,
 *                      w_up, w_down (with experts: the router and the
 *                      n_expert_used experts' gate, up and down matrices a
 *                      token is routed to, and qwen35moe's shared expert's
 *                      gate, up and down); and the output projection. The
 *                      token embedding is a row lookup, not a product.
 *   output_ops         the output projection's share of matmul_ops (a
 *                      prompt batch computes it for its last token only).
 *   weight_bytes_read  the bytes of those same matrices (row_bytes x rows):
 *                      one decode step of one token reads each once (a
 *                      batch routed to more experts reads more). The embedding table
 *                      is not read (one row is), unless it is tied: then it
 *                      is the output projection, counted once.
 *
 * Norm weights and biases (1-D, a few KiB) are in neither.
 */
#ifndef KP_COST_H
#define KP_COST_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    uint64_t matmul_ops;        /* per token, output projection included */
    uint64_t output_ops;        /* of which the output projection */
    uint64_t weight_bytes_read; /* per decode step */
} kp_cost;

void kp_model_cost(const kp_model *m, kp_cost *out);

/* The attention's multiply-adds x 2 for one token that attends to d
 * positions: q.k over head_dim and the weighted sum of V over head_dim, in
 * every head of every attention layer: 4 x n_kv_layer x n_head x head_dim
 * x d, where a sliding-window layer attends to min(d, n_swa) positions (a
 * recurrent layer attends to none: its work is in its matrices). */
uint64_t kp_model_attn_ops(const kp_hparams *hp, uint64_t d);

#endif
