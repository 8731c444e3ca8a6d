/*
 * fuzz_model.c - libFuzzer target for loading a model and its tokenizer
 * from a GGUF file, and running it.
 *
 * Each input is a whole GGUF file, parsed with kp_gguf_open_memory from
 * libFuzzer's buffer (a heap copy of exactly `size` bytes, so ASan flags a
 * read past the end). Then:
 *
 *   kp_model_from_gguf      hyperparameters, weight shapes and types
 *   kp_tok_vocab_load       the tokenizer of the same file
 *   kp_eng_new + prefill    when both load: an engine with a small budget
 *   + 2 decode steps        runs the forward pass over the prompt [BOS, 0]
 *                           and two greedy tokens, so a file whose parts
 *                           disagree (a vocabulary that is not the
 *                           embedding's row count, head counts that do not
 *                           divide, ...) is caught as an overflow, not only
 *                           as a parse error.
 *
 * Properties checked beyond "no sanitizer report": a failed load gives a
 * non-empty message and NULL outputs; loaded vocabulary and model agree on
 * the vocabulary size; every greedy token is inside the vocabulary.
 *
 * Seeds: fuzz/seeds-model/ (tiny models written by `kvpin mkmodel`; see
 * fuzz/README.md). Run: `make fuzz FUZZ_TARGET=model`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tok/tok.h"

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

static int32_t argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return (int32_t)best;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kp_error err = {0};
    kp_gguf *g = NULL;
    if (kp_gguf_open_memory(&g, data, size, "fuzz.gguf", &err) != KP_OK) {
        REQUIRE(g == NULL && err.msg[0]);
        return 0;
    }
    kp_model *m = NULL;
    if (kp_model_from_gguf(&m, g, &err) != KP_OK) { /* takes g */
        REQUIRE(m == NULL && err.msg[0]);
        return 0;
    }
    kp_tok_vocab *v = NULL;
    if (kp_tok_vocab_load(&v, m->file, &err) != KP_OK) {
        REQUIRE(v == NULL && err.msg[0]);
        kp_model_free(m);
        return 0;
    }
    const kp_hparams *hp = &m->hp;
    REQUIRE((uint32_t)kp_tok_n_vocab(v) == hp->n_vocab);
    /* keep a run small: the forward pass costs ~ weights x tokens */
    if (m->weight_bytes > (4u << 20) || hp->n_vocab > 200000) goto done;
    kp_threads *pool = NULL;
    kp_engine *e = NULL;
    float *logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    kp_eng_config ec = {KP_DTYPE_F16, 16, 0, 64, true, NULL, KP_DTYPE_F16, true, 0, 0};
    if (logits && kp_threads_new(&pool, 1, &err) == KP_OK && kp_eng_new(&e, m, pool, NULL, &ec, &err) == KP_OK) {
        int32_t prompt[2] = {kp_tok_bos(v) >= 0 ? kp_tok_bos(v) : 0, 0};
        kp_eng_seq s = {0};
        if (kp_eng_prefill(e, prompt, 2, &s, logits, NULL, &err) == KP_OK) {
            for (int i = 0; i < 2; i++) {
                int32_t t = argmax(logits, hp->n_vocab);
                REQUIRE(t >= 0 && (uint32_t)t < hp->n_vocab);
                if (kp_eng_decode(e, &s, t, logits, &err) != KP_OK) break;
            }
            kp_eng_seq_abort(e, &s);
        }
    }
    kp_eng_free(e);
    kp_threads_free(pool);
    free(logits);
done:
    kp_tok_vocab_free(v);
    kp_model_free(m);
    return 0;
}
