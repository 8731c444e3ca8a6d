/*
 * lm_parts.h - the model and the tokenizer inside a kp_lm (kvpin.h), for
 * kvpin's own command line (cli/), floor 7.
 *
 * The commands open their model with kp_lm_open and tokenize a prompt with
 * kp_tokenize_prompt, so what those decide (how a load error names the
 * file; that an empty prompt starts from BOS) is decided in one place, the
 * library. The commands that drive the engine themselves (run, inspect,
 * logits, bench, run --prompt-cache, doctor's tiers) take the parts from
 * here. Not part of the public interface: no KP_API, so libkvpin.so does
 * not export these; libkvpin.a, which the kvpin binary links, has them.
 */
#ifndef KP_LM_PARTS_H
#define KP_LM_PARTS_H

#include "kvpin.h"
#include "model/model.h"
#include "tok/tok.h"

/* The model lm holds, borrowed: valid until kp_lm_free(lm). */
const kp_model *kp_lm_model(const kp_lm *lm);

/* The tokenizer lm holds, borrowed: valid until kp_lm_free(lm). */
const kp_tok_vocab *kp_lm_vocab(const kp_lm *lm);

#endif
