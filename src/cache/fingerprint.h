/*
 * fingerprint.h - what makes a KV block valid for reuse (floor 5): one
 * 128-bit model fingerprint over everything that changes the K/V rows a
 * token chain produces.
 *
 * The fingerprint is XXH3-128 of a canonical text, one "name value" line
 * each, in this order:
 *
 *   kvpin-kv-layout 1          KP_FINGERPRINT_LAYOUT_VERSION (the record and pool layout)
 *   weights <32 hex>           XXH3-128 over every tensor: name, type, dims, bytes
 *   arch llama                 architecture name
 *   n_layer .. n_vocab, n_rot  hyperparameters that shape the rows
 *   rms_eps, rope_base, rope_freq_scale   floats as %a (exact)
 *   rope_type norm|neox, tied_output 0|1
 *   n_swa .. post_norms        only for a model with sliding windows or
 *                              gemma3's other switches (model.h): the window,
 *                              layer_kinds (f/w per layer), the WINDOW layers'
 *                              rope base and scale, attn_scale (and whether on
 *                              Q), embd_scale, logit_softcap, ffn_act, post_norms
 *   n_expert, n_expert_used,   only for a model with experts (qwen3moe): how many,
 *   n_ff_exp                   how many a token is routed to, their width
 *   n_rec_layers .. state      only for a model with recurrent layers (qwen35):
 *                              the state's layout that snapshot records hold
 *                              (staterec.h): which layers, ssm sizes, float32
 *                              and its element count
 *   n_ff_shexp                 only with a shared expert (qwen35moe): its width
 *   kv_type f16                element type of the K rows
 *   kv_type_v f16              ... of the V rows (may differ: --kv-type-v)
 *   block_size 16              positions per block
 *   attn bf16                  only when prefill attention rounds to bfloat16
 *                              (kp_attn_precision): its K/V rows differ
 *
 * The text is kept beside the tier's data (disktier.c writes it as
 * FINGERPRINT) so a directory of another fingerprint can say which line
 * differs. The weights hash reads every tensor byte once per file; its
 * value is cached in a small file keyed by path, size and mtime: beside
 * the model (MODEL.kvpin-fp) when that folder is writable, else in the
 * cache directory given (weights-<hash of the path>.fp). A cache line that
 * does not match the file as it is now is recomputed and rewritten.
 */
#ifndef KP_FINGERPRINT_H
#define KP_FINGERPRINT_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/blockkey.h"
#include "model/model.h"
#include "base/status.h"

#define KP_FINGERPRINT_LAYOUT_VERSION 1
#define KP_FINGERPRINT_TEXT_MAX 2048

typedef struct {
    kp_bkey id;                 /* XXH3-128 of text */
    kp_bkey weights;            /* the weights hash alone */
    char text[KP_FINGERPRINT_TEXT_MAX];  /* the canonical lines, NUL-terminated */
} kp_fingerprint;

/* The weights hash of m's file (kp_gguf_path): read from the cache file
 * when its path, size and mtime match, else computed over every tensor and
 * the cache written (beside the model, else under cache_dir when it is not
 * NULL; a cache that cannot be written is not an error). *from_cache
 * (may be NULL) tells which. KP_EIO when the model file cannot be
 * stat'ed. */
kp_status kp_fingerprint_weights(const kp_model *m, const char *cache_dir, kp_bkey *out, bool *from_cache, kp_error *err);

/* The weights hash computed from the mapped tensors, without any cache. */
kp_bkey kp_fingerprint_weights_compute(const kp_model *m);

/* Fills *out from a weights hash, the model's hyperparameters, the K and
 * V element types, the block size, and whether prefill attention rounds
 * to bfloat16 (a last line "attn bf16", absent otherwise, so F32
 * fingerprints are those of before). */
void kp_fingerprint_make(kp_fingerprint *out, const kp_model *m, const kp_bkey *weights, kp_dtype kv_type,
                kp_dtype kv_type_v, uint32_t block_size, bool attn_bf16);

/* Names the lines where text `other` differs from `ours` (both canonical
 * texts), as "kv_type f32 (here f16), weights ..." into buf[cap]; "unknown"
 * when other has none of the lines. */
void kp_fingerprint_diff(const char *ours, const char *other, char *buf, size_t cap);

#endif
