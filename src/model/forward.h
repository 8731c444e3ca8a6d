/*
 * forward.h - the batched transformer forward pass over KV blocks.
 *
 * One call processes a batch of tokens that may belong to several
 * sequences, each token with its own position. For every layer it computes
 * Q, K, V for all tokens with matrix-matrix products (each weight is read
 * once per call for the whole batch), writes K and V of every token into
 * its sequence's KV blocks, then lets every token attend to positions
 * 0..pos of its own sequence (pos - n_swa + 1 .. pos in a sliding-window
 * layer, model.h). So a prompt's prefill, a prefill chunk, and
 * the decode steps of eight sequences are the same code path.
 *
 * The pass owns only scratch memory; the model, the KV pool, the sequences
 * and the thread pool are borrowed.
 */
#ifndef KP_FORWARD_H
#define KP_FORWARD_H

#include <stdint.h>

#include "kv/kvpool.h"
#include "model/model.h"
#include "kernels/quant.h"
#include "base/status.h"
#include "base/threadpool.h"
#include "kernels/attn.h"

typedef struct kp_forward kp_forward;

/* All borrowed; they must outlive the kp_forward. kernels NULL: the best
 * table for this CPU. */
kp_status kp_forward_new(kp_forward **out, const kp_model *m, kp_kvpool *kv, kp_threads *threads,
                         const kp_kernels *kernels, kp_error *err);
void kp_forward_free(kp_forward *f);

/* Copies the weight matrices whose type the kernel table has a repacked
 * layout for (kp_kernels pack: F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K and
 * MXFP4 in the avx512vnni table; the experts' 3-D weights matrix by matrix)
 * into memory the pass owns, in that layout, and uses the copies
 * from then on:
 * the same results bit for bit, faster decode. Tensors read by row (the
 * token embedding) stay in the mapping; a tied output projection gets a
 * copy of its own. Idempotent. *bytes_out (may be NULL): the bytes of the
 * copies, 0 when the table has no layout for any weight. KP_ENOMEM: the
 * pass keeps using the mapped weights. */
kp_status kp_forward_pack_weights(kp_forward *f, uint64_t *bytes_out, kp_error *err);

/* The most bytes kp_forward_pack_weights may copy (call before it). The
 * copies stay resident while the kernel can drop the mapping's pages, so
 * a model near the machine's memory must not be copied whole: past the
 * limit the experts' 3-D weights (the bulk of a mixture-of-experts model)
 * stay in the mapping, and if the 2-D weights alone exceed it nothing is
 * copied. Default: 3/4 of the physical memory. */
void kp_forward_set_pack_limit(kp_forward *f, uint64_t bytes);

/* The precision of attention's products in prefill tiles (kernels/attn.h):
 * KP_ATTN_F32 (the default) or KP_ATTN_BF16, which takes the avx512bf16
 * table where the CPU has AVX512_BF16 (scalar-bf16 with the scalar
 * kernels) and stays F32 where it has not. Returns the table now in use
 * (its name tells which); call before the first batch. */
const kp_attn_kernels *kp_forward_set_attn(kp_forward *f, kp_attn_precision p);

/* Attention's work since the pass was made: its multiply-adds (2 FLOP
 * each: the scores and the weighted sums of every query head over the keys
 * it sees) and the wall time of the attention calls (all threads). */
void kp_forward_attn_work(const kp_forward *f, double *flops, double *seconds);

typedef struct {
    int32_t n_tokens;
    const int32_t *tokens;  /* [n_tokens] token ids */
    const int32_t *pos;     /* [n_tokens] position of each token in its sequence */
    const int32_t *seq;     /* [n_tokens] index into seqs */
    const uint8_t *logits;  /* [n_tokens] nonzero: return this token's logits;
                               NULL: only the batch's last token */
    kp_kvseq **seqs;        /* [n_seqs] borrowed; their KV grows */
    int32_t n_seqs;
} kp_batch;

/* Runs the batch. For each sequence, the batch's tokens must have
 * consecutive increasing positions starting at or before the sequence's
 * current length (a position below the length truncates the sequence
 * there and overwrites: that is how a cached prompt recomputes its last
 * token). Blocks are
 * reserved as needed (KP_EFULL when the pool is full; the sequences then
 * keep what they had). logits_out receives n_vocab floats per requested
 * token, in batch order. Bad token ids, positions or sequence indexes:
 * KP_EINVAL, nothing computed. */
kp_status kp_forward_run(kp_forward *f, const kp_batch *b, float *logits_out, kp_error *err);

/* kp_forward_run without the output projection: hidden_out receives
 * n_embd floats per requested token, in batch order, the final norm's
 * output (what the projection would multiply): the hidden states
 * embeddings are pooled from. Errors as kp_forward_run. */
kp_status kp_forward_hidden(kp_forward *f, const kp_batch *b, float *hidden_out, kp_error *err);

/* Attention probe for `kvpin inspect`: after each run, the softmax weights
 * of the batch's last token for (layer, head) over positions 0..pos are
 * kept; kp_forward_probe returns them (NULL if the probe is off) and their
 * count. layer < 0 turns the probe off. */
void kp_forward_set_probe(kp_forward *f, int layer, int head);
const float *kp_forward_probe(const kp_forward *f, int32_t *n_pos);

#endif
