/*
 * test_cost.c - the cost model (model/cost.c) against figures computed
 * here from each model's architecture: d_model, n_ff, heads, kv heads,
 * head_dim, vocabulary, tied or not, and the bytes a weight type spends on
 * a block of values (written out here from the block layouts: F32 4 bytes
 * a value, Q8_0 34 bytes a block of 32, Q4_K 144 bytes a block of 256).
 *
 *   - the bundled stories260K (llama, F32, untied): its architecture is
 *     restated here and checked against the file's hyperparameters first;
 *     what a decode step leaves unread (the embedding table, the norms) is
 *     the rest of the file's tensor bytes;
 *   - mkmodel's qwen3-tiny in Q8_0 (tied: the output projection is the
 *     embedding, counted once; head_dim 128 != n_embd / n_head) and its
 *     tiny in Q4_K (untied);
 *   - gen-qwen3moe-f32 (experts): a token multiplies by the router and by
 *     the 3 experts it is routed to, not by the other 5;
 *   - the attention's operations at a depth, and their linearity.
 */
#include <stdint.h>
#include <unistd.h>

#include "harness.h"
#include "model/cost.h"
#include "model/mkmodel.h"
#include "model/model.h"

#define STORIES "models/stories260K.gguf"

/* A model's shape as its architecture describes it. */
typedef struct {
    uint64_t n_layer, d, ff, heads, kv_heads, head_dim, vocab;
    bool tied;
    uint64_t block_bytes, block_elems; /* the weight type's storage */
} arch;

/* Multiply-adds a token does in one layer's matrices: Q (d -> heads x hd),
 * K and V (d -> kv_heads x hd), O (heads x hd -> d), gate and up (d -> ff),
 * down (ff -> d). */
static uint64_t layer_macs(const arch *a) {
    uint64_t q = a->heads * a->head_dim, kv = a->kv_heads * a->head_dim;
    return a->d * q + 2 * a->d * kv + q * a->d + 3 * a->d * a->ff;
}

static uint64_t expect_ops(const arch *a) { return 2 * (a->n_layer * layer_macs(a) + a->d * a->vocab); }
static uint64_t expect_output_ops(const arch *a) { return 2 * a->d * a->vocab; }
static uint64_t expect_bytes(const arch *a) {
    uint64_t elems = a->n_layer * layer_macs(a) + a->d * a->vocab; /* one element per multiply-add */
    return elems / a->block_elems * a->block_bytes;
}

static void check_model(const kp_model *m, const arch *a, const char *what) {
    const kp_hparams *hp = &m->hp;
    CHECK_MSG(hp->n_layer == a->n_layer && hp->n_embd == a->d && hp->n_ff == a->ff && hp->n_head == a->heads &&
                  hp->n_head_kv == a->kv_heads && hp->head_dim == a->head_dim && hp->n_vocab == a->vocab &&
                  hp->tied_output == a->tied,
              "%s: the file is not the architecture restated here", what);
    kp_cost c;
    kp_model_cost(m, &c);
    CHECK_MSG(c.matmul_ops == expect_ops(a), "%s: matmul_ops %llu, expected %llu", what,
              (unsigned long long)c.matmul_ops, (unsigned long long)expect_ops(a));
    CHECK_MSG(c.output_ops == expect_output_ops(a), "%s: output_ops %llu, expected %llu", what,
              (unsigned long long)c.output_ops, (unsigned long long)expect_output_ops(a));
    CHECK_MSG(c.weight_bytes_read == expect_bytes(a), "%s: weight_bytes_read %llu, expected %llu", what,
              (unsigned long long)c.weight_bytes_read, (unsigned long long)expect_bytes(a));
}

/* qwen3moe: per layer Q (128 -> 4 x 32), K and V (128 -> 2 x 32), O, the
 * router (128 -> 8 experts) and 3 routed experts' gate and up (128 -> 64)
 * and down (64 -> 128); then the untied output (128 -> 512). F32 bytes. */
static void test_experts(void) {
    kp_model *m = NULL;
    kp_error err = {0};
    if (kp_model_load(&m, harness_path("tests/data/models/gen-qwen3moe-f32.gguf"), &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    uint64_t layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 128 * 8 + 3 * (2 * 128 * 64 + 64 * 128);
    uint64_t macs = 2 * layer + 128 * 512;
    kp_cost c;
    kp_model_cost(m, &c);
    CHECK_EQ_INT(c.matmul_ops, 2 * macs);
    CHECK_EQ_INT(c.output_ops, 2 * 128 * 512);
    CHECK_EQ_INT(c.weight_bytes_read, 4 * macs);
    kp_model_free(m);
}

/* qwen35moe: per recurrent layer (6) attn_qkv (64 -> 128), attn_gate (64 ->
 * 64), ssm_beta and ssm_alpha (64 -> 4), ssm_out (64 -> 64); per attention
 * layer (2) Q (64 -> 2 x 4 x 32: query and gate), K and V (64 -> 2 x 32), O
 * (128 -> 64); in every layer the router (64 -> 8), 3 routed experts' gate
 * and up (64 -> 32) and down (32 -> 64), and the shared expert's gate, up
 * and down (64 -> 32 -> 64); then the untied output (64 -> 512). F32 bytes. */
static void test_experts_shared(void) {
    kp_model *m = NULL;
    kp_error err = {0};
    if (kp_model_load(&m, harness_path("tests/data/models/gen-qwen35moe-f32.gguf"), &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    uint64_t ffn = 64 * 8 + 3 * (2 * 64 * 32 + 32 * 64) + (2 * 64 * 32 + 32 * 64);
    uint64_t rec = 64 * 128 + 64 * 64 + 2 * 64 * 4 + 64 * 64, att = 64 * 256 + 2 * 64 * 64 + 128 * 64;
    uint64_t macs = 6 * (rec + ffn) + 2 * (att + ffn) + 64 * 512;
    kp_cost c;
    kp_model_cost(m, &c);
    CHECK_EQ_INT(c.matmul_ops, 2 * macs);
    CHECK_EQ_INT(c.output_ops, 2 * 64 * 512);
    CHECK_EQ_INT(c.weight_bytes_read, 4 * macs);
    kp_model_free(m);
}

static void test_stories260k(void) {
    kp_model *m = NULL;
    kp_error err = {0};
    if (kp_model_load(&m, harness_path(STORIES), &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    /* llama2.c's stories260K: dim 64, 5 layers, 8 heads, 4 kv heads, hidden 172, vocab 512, F32 */
    arch a = {5, 64, 172, 8, 4, 8, 512, false, 4, 1};
    check_model(m, &a, "stories260K");
    /* per token: 5 x (64x64 + 2x64x32 + 64x64 + 3x64x172) + 64x512 = 259328 multiply-adds */
    kp_cost c;
    kp_model_cost(m, &c);
    CHECK_EQ_INT(c.matmul_ops, 2 * 259328);
    /* untied: what a decode step does not read is the embedding table (512 x 64 F32) and the norms
     * (two of 64 per layer, one at the output), the rest of the file's tensors */
    uint64_t unread = 512 * 64 * 4 + (5 * 2 * 64 + 64) * 4;
    CHECK_EQ_INT(m->weight_bytes - c.weight_bytes_read, unread);
    kp_model_free(m);
}

/* Writes spec with the bundled model's tokenizer (512 tokens) and loads it. */
static kp_model *make(const kp_mkmodel_spec *spec) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvpin-test-cost-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    close(fd);
    kp_error err = {0};
    kp_model *m = NULL;
    if (kp_mkmodel_write(spec, harness_path(STORIES), path, NULL, &err) != KP_OK ||
        kp_model_load(&m, path, &err) != KP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        m = NULL;
    }
    unlink(path); /* the mapping stays valid */
    return m;
}

static void test_mkmodel_tied_q8_0(void) {
    kp_mkmodel_spec s;
    CHECK(kp_mkmodel_spec_preset("qwen3-tiny", &s, NULL) == KP_OK);
    s.wtype = KP_DTYPE_Q8_0;
    kp_model *m = make(&s);
    if (!m) return;
    /* qwen3-tiny: 2 layers, d 256, 4 heads of 128, 2 kv heads, ff 768, tied; every row length is a
     * multiple of 32, so every matrix is Q8_0 */
    arch a = {2, 256, 768, 4, 2, 128, 512, true, 34, 32};
    check_model(m, &a, "qwen3-tiny Q8_0");
    /* tied: the one table is both the embedding and the output projection; the file's other
     * tensors are the norms: attn, ffn (256 each), q and k (128 each) per layer, the output norm */
    kp_cost c;
    kp_model_cost(m, &c);
    CHECK_EQ_INT(m->weight_bytes - c.weight_bytes_read, (2 * (256 + 256 + 128 + 128) + 256) * 4);
    kp_model_free(m);
}

static void test_mkmodel_untied_q4_k(void) {
    kp_mkmodel_spec s;
    CHECK(kp_mkmodel_spec_preset("tiny", &s, NULL) == KP_OK);
    s.wtype = KP_DTYPE_Q4_K;
    kp_model *m = make(&s);
    if (!m) return;
    /* tiny: 2 layers, d 256, 4 heads of 64, 2 kv heads, ff 512, untied; rows of 256 and 512 */
    arch a = {2, 256, 512, 4, 2, 64, 512, false, 144, 256};
    check_model(m, &a, "tiny Q4_K");
    kp_model_free(m);
}

static void test_attn_ops(void) {
    kp_hparams hp = {0};
    hp.n_layer = hp.n_kv_layer = 5; /* every layer attends (no recurrent ones) */
    hp.n_head = 8;
    hp.head_dim = 8;
    hp.n_head_kv = 4; /* K/V heads shared by query heads: the work is per query head */
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 0), 0);
    /* one position: per layer and query head, q.k (8 multiply-adds) and p x v (8) */
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 1), 5 * 8 * (8 + 8) * 2);
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 1000), 1000 * kp_model_attn_ops(&hp, 1));
    hp.n_layer = hp.n_kv_layer = 30;
    hp.n_head = 9;
    hp.head_dim = 64;
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 4096), 4ull * 30 * 9 * 64 * 4096);
    /* 25 of 30 layers attend to a window of 512: past it they stop growing */
    hp.n_swa = 512;
    hp.n_swa_layers = 25;
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 100), 4ull * 30 * 9 * 64 * 100);
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 4096), 4ull * 9 * 64 * (5 * 4096 + 25 * 512));
    /* a hybrid's recurrent layers do no attention: 24 layers, 6 of them attending */
    hp.n_swa = hp.n_swa_layers = 0;
    hp.n_layer = 24;
    hp.n_kv_layer = 6;
    CHECK_EQ_INT(kp_model_attn_ops(&hp, 100), 4ull * 6 * 9 * 64 * 100);
}

int main(void) {
    RUN(test_stories260k);
    RUN(test_experts);
    RUN(test_experts_shared);
    RUN(test_mkmodel_tied_q8_0);
    RUN(test_mkmodel_untied_q4_k);
    RUN(test_attn_ops);
    return harness_finish("cost");
}
