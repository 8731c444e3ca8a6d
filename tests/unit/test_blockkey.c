/*
 * test_blockkey.c - block identity (cache/blockkey.h), the model
 * fingerprint (cache/fingerprint.h) and KV block records
 * (cache/blockrec.h).
 *
 * Keys are checked against an independent implementation: the xxhsum
 * command (Debian xxhash) over the same bytes (16 parent key bytes, then
 * the tokens as int32 little-endian), so a key is the same in every
 * process. The fingerprint must change with the KV type, the block size
 * and one weight byte, and the weights hash must come from its cache on
 * the second call and be recomputed when the file's mtime changes. A
 * record must round-trip bit for bit, and each corruption (cut short, a
 * flipped K/V byte, other tokens, another key, another fingerprint, a bad
 * magic) must be refused under its own reason.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "cache/blockrec.h"
#include "cache/fingerprint.h"
#include "harness.h"
#include "kv/kvpool.h"
#include "model/model.h"

static char tmpdir[256];

/* xxhsum -H2 of bytes[0..n) as 32 hex digits into hex[33]; false when the
 * command is missing. */
static bool xxhsum128(const uint8_t *bytes, size_t n, char hex[33]) {
    char path[300], cmd[400];
    snprintf(path, sizeof path, "%s/msg.bin", tmpdir);
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    fwrite(bytes, 1, n, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "xxhsum -H2 '%s' 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    char line[256] = {0};
    bool ok = fgets(line, sizeof line, p) != NULL;
    pclose(p);
    if (!ok || strlen(line) < 32) return false;
    memcpy(hex, line, 32);
    hex[32] = 0;
    return true;
}

static size_t message(uint8_t *buf, const kp_bkey *parent, const int32_t *t, uint32_t n) {
    memcpy(buf, parent->b, 16);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)t[i];
        for (int b = 0; b < 4; b++) buf[16 + 4 * i + b] = (uint8_t)(u >> (8 * b));
    }
    return 16 + 4 * (size_t)n;
}

static void test_keys_match_xxhsum(void) {
    int32_t t[200];
    for (int i = 0; i < 200; i++) t[i] = (int32_t)(i * 7919 % 32000) - (i == 3 ? 40000 : 0);
    kp_bkey keys[12];
    CHECK_EQ_INT(kp_bkey_chain(t, 200, 16, keys), 12);
    uint8_t buf[16 + 4 * 200];
    kp_bkey zero = {{0}};
    char want[33], got[33];
    for (int j = 0; j < 3; j++) {
        size_t n = message(buf, j ? &keys[j - 1] : &zero, t + 16 * j, 16);
        CHECK_MSG(xxhsum128(buf, n, want), "xxhsum (Debian package xxhash) is needed");
        kp_bkey_hex(&keys[j], got);
        CHECK_EQ_STR(got, want);
    }
    /* a block longer than the stack buffer streams: the same value */
    kp_bkey big = kp_bkey_next(&keys[0], t, 200);
    size_t n = message(buf, &keys[0], t, 200);
    CHECK(xxhsum128(buf, n, want));
    kp_bkey_hex(&big, got);
    CHECK_EQ_STR(got, want);
    /* chained: a change in block 0 changes every later key */
    t[5]++;
    kp_bkey k2[12];
    kp_bkey_chain(t, 200, 16, k2);
    for (int j = 0; j < 12; j++) CHECK(!kp_bkey_eq(&keys[j], &k2[j]));
    kp_bkey back;
    kp_bkey_hex(&keys[4], got);
    CHECK(kp_bkey_parse(got, &back) && kp_bkey_eq(&back, &keys[4]));
    CHECK(!kp_bkey_parse("00", &back));
}

static bool copy_file(const char *from, const char *to) {
    size_t n;
    char *d = harness_read_file(from, &n);
    if (!d) return false;
    FILE *f = fopen(to, "wb");
    bool ok = f && fwrite(d, 1, n, f) == n;
    if (f) fclose(f);
    free(d);
    return ok;
}

static void test_fingerprint(void) {
    char path[300], flipped[300], side[320];
    snprintf(path, sizeof path, "%s/m.gguf", tmpdir);
    snprintf(flipped, sizeof flipped, "%s/m2.gguf", tmpdir);
    snprintf(side, sizeof side, "%s.kvpin-fp", path);
    CHECK(copy_file(harness_path("models/stories260K.gguf"), path));
    kp_model *m = NULL, *m2 = NULL;
    kp_error err = {0};
    CHECK(kp_model_load(&m, path, &err) == KP_OK);
    if (!m) return;
    kp_bkey w1, w2;
    bool cached = true;
    CHECK(kp_fingerprint_weights(m, NULL, &w1, &cached, &err) == KP_OK && !cached);
    CHECK(access(side, F_OK) == 0);
    CHECK(kp_fingerprint_weights(m, NULL, &w2, &cached, &err) == KP_OK && cached && kp_bkey_eq(&w1, &w2));
    kp_bkey direct = kp_fingerprint_weights_compute(m);
    CHECK(kp_bkey_eq(&w1, &direct));
    /* a new mtime: the cache line no longer matches, the hash is recomputed */
    struct timespec ts[2] = {{0, UTIME_NOW}, {12345, 0}};
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
    CHECK(kp_fingerprint_weights(m, NULL, &w2, &cached, &err) == KP_OK && !cached && kp_bkey_eq(&w1, &w2));

    kp_fingerprint a, b, c;
    kp_fingerprint_make(&a, m, &w1, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    kp_fingerprint_make(&b, m, &w1, KP_DTYPE_F32, KP_DTYPE_F32, 16, false);
    kp_fingerprint_make(&c, m, &w1, KP_DTYPE_F16, KP_DTYPE_F16, 32, false);
    CHECK(!kp_bkey_eq(&a.id, &b.id) && !kp_bkey_eq(&a.id, &c.id) && !kp_bkey_eq(&b.id, &c.id));
    kp_fingerprint a2, q8, q8v;
    kp_fingerprint_make(&a2, m, &w1, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(kp_bkey_eq(&a.id, &a2.id));
    /* quantized K, and K and V of different types */
    kp_fingerprint_make(&q8, m, &w1, KP_DTYPE_Q8_0, KP_DTYPE_Q8_0, 16, false);
    kp_fingerprint_make(&q8v, m, &w1, KP_DTYPE_Q8_0, KP_DTYPE_Q4_0, 16, false);
    CHECK(!kp_bkey_eq(&q8.id, &a.id) && !kp_bkey_eq(&q8.id, &q8v.id));
    /* prefill attention in bfloat16 writes other K/V: another fingerprint, one line more */
    kp_fingerprint bf;
    kp_fingerprint_make(&bf, m, &w1, KP_DTYPE_F16, KP_DTYPE_F16, 16, true);
    CHECK(!kp_bkey_eq(&bf.id, &a.id) && strstr(bf.text, "\nattn bf16\n") && !strstr(a.text, "attn"));
    char why[256];
    kp_fingerprint_diff(a.text, b.text, why, sizeof why);
    CHECK_MSG(strstr(why, "kv_type F32 (here F16)") != NULL, "diff: %s", why);
    kp_fingerprint_diff(a.text, a2.text, why, sizeof why);
    CHECK_EQ_STR(why, "");
    kp_fingerprint_diff(a.text, "junk", why, sizeof why);
    CHECK_EQ_STR(why, "unknown");

    /* one weight byte differs: another weights hash, another fingerprint */
    CHECK(copy_file(path, flipped));
    const kp_gguf_tensor *t = kp_gguf_find_tensor(m->file, "output_norm.weight");
    CHECK(t != NULL);
    if (t) {
        FILE *f = fopen(flipped, "r+b");
        long off = (long)(kp_gguf_data_offset(m->file) + t->offset + 1);
        fseek(f, off, SEEK_SET);
        int ch = fgetc(f);
        fseek(f, off, SEEK_SET);
        fputc(ch ^ 1, f);
        fclose(f);
    }
    CHECK(kp_model_load(&m2, flipped, &err) == KP_OK);
    if (m2) {
        kp_bkey w3;
        CHECK(kp_fingerprint_weights(m2, NULL, &w3, NULL, &err) == KP_OK && !kp_bkey_eq(&w1, &w3));
        kp_fingerprint d;
        kp_fingerprint_make(&d, m2, &w3, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
        CHECK(!kp_bkey_eq(&a.id, &d.id));
        kp_fingerprint_diff(a.text, d.text, why, sizeof why);
        CHECK(strncmp(why, "weights ", 8) == 0);
    }
    kp_model_free(m2);
    kp_model_free(m);
}

/* m's fingerprint as it is now differs from a, and the diff names want. */
static void check_changed(const kp_model *m, const kp_bkey *w, const kp_fingerprint *a, const char *want) {
    kp_fingerprint b;
    char why[256];
    kp_fingerprint_make(&b, m, w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(!kp_bkey_eq(&a->id, &b.id));
    kp_fingerprint_diff(a->text, b.text, why, sizeof why);
    CHECK_MSG(strstr(why, want) != NULL, "diff: %s (want %s)", why, want);
}

/* gemma3: the window, the layer kinds and the WINDOW layers' rope are in
 * the fingerprint (a block made with another window is other K/V); a
 * model without them keeps the lines it had. */
static void test_fingerprint_windows(void) {
    kp_model *m = NULL, *st = NULL;
    kp_error err = {0};
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-gemma3-f32.gguf"), &err) == KP_OK);
    CHECK(kp_model_load(&st, harness_path("models/stories260K.gguf"), &err) == KP_OK);
    if (!m || !st) {
        kp_model_free(m);
        kp_model_free(st);
        return;
    }
    kp_bkey w = kp_fingerprint_weights_compute(m);
    kp_fingerprint a, b, s;
    kp_fingerprint_make(&a, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK_MSG(strstr(a.text, "\nn_swa 16\nlayer_kinds wwwwwf\n") != NULL, "%s", a.text);
    CHECK(strstr(a.text, "\nffn_act gelu_tanh\n") && strstr(a.text, "\npost_norms 1\n"));
    kp_fingerprint_make(&s, st, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(strstr(s.text, "n_swa") == NULL && strstr(s.text, "layer_kinds") == NULL);
    m->hp.n_swa = 32;
    check_changed(m, &w, &a, "n_swa 32 (here 16)");
    m->hp.n_swa = 16;
    m->layers[2].kind = KP_LAYER_FULL;
    check_changed(m, &w, &a, "layer_kinds wwfwwf (here wwwwwf)");
    m->layers[2].kind = KP_LAYER_WINDOW;
    m->hp.rope_base_swa = 20000.0f;
    kp_fingerprint_make(&b, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(!kp_bkey_eq(&a.id, &b.id));
    m->hp.rope_base_swa = 10000.0f;
    kp_fingerprint_make(&b, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(kp_bkey_eq(&a.id, &b.id));
    kp_model_free(m);
    kp_model_free(st);
}

/* qwen3moe: the expert counts and width are in the fingerprint (another
 * routing is other K/V from the second layer on); a dense model has no
 * such lines. */
static void test_fingerprint_experts(void) {
    kp_model *m = NULL;
    kp_error err = {0};
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-qwen3moe-f32.gguf"), &err) == KP_OK);
    if (!m) return;
    kp_bkey w = kp_fingerprint_weights_compute(m);
    kp_fingerprint a, b;
    kp_fingerprint_make(&a, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK_MSG(strstr(a.text, "\narch qwen3moe\n") && strstr(a.text, "\nn_expert 8\nn_expert_used 3\nn_ff_exp 64\n"),
              "%s", a.text);
    CHECK(strstr(a.text, "layer_kinds") == NULL);
    m->hp.n_expert_used = 2;
    check_changed(m, &w, &a, "n_expert_used 2 (here 3)");
    m->hp.n_expert_used = 3;
    m->hp.n_expert = 16;
    check_changed(m, &w, &a, "n_expert 16 (here 8)");
    m->hp.n_expert = 8;
    m->hp.n_ff_exp = 32;
    check_changed(m, &w, &a, "n_ff_exp 32 (here 64)");
    m->hp.n_ff_exp = 64;
    kp_fingerprint_make(&b, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(kp_bkey_eq(&a.id, &b.id));
    kp_model_free(m);
}

/* qwen35moe: the shared expert's width joins the experts' lines (every
 * token goes through it); qwen3moe's lines stay without it. */
static void test_fingerprint_qwen35moe(void) {
    kp_model *m = NULL;
    kp_error err = {0};
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-qwen35moe-f32.gguf"), &err) == KP_OK);
    if (!m) return;
    kp_bkey w = kp_fingerprint_weights_compute(m);
    kp_fingerprint a, b;
    kp_fingerprint_make(&a, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK_MSG(strstr(a.text, "\narch qwen35moe\n") &&
                  strstr(a.text, "\nn_expert 8\nn_expert_used 3\nn_ff_exp 32\nn_ff_shexp 32\n") &&
                  !strstr(a.text, "\ngate "),
              "%s", a.text);
    m->hp.n_ff_shexp = 64;
    check_changed(m, &w, &a, "n_ff_shexp 64 (here 32)");
    m->hp.n_ff_shexp = 32;
    kp_fingerprint_make(&b, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(kp_bkey_eq(&a.id, &b.id));
    kp_model_free(m);
}

/* gpt-oss: YaRN's parameters and the gating and clamp of its experts are
 * in the fingerprint (each changes the K/V a prompt leaves); qwen3moe's
 * lines are as they were (test_fingerprint_experts). */
static void test_fingerprint_gptoss(void) {
    kp_model *m = NULL;
    kp_error err = {0};
    CHECK(kp_model_load(&m, harness_path("tests/data/models/gen-gpt-oss-f32.gguf"), &err) == KP_OK);
    if (!m) return;
    kp_bkey w = kp_fingerprint_weights_compute(m);
    kp_fingerprint a, b;
    kp_fingerprint_make(&a, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK_MSG(strstr(a.text, "\narch gpt-oss\n") && strstr(a.text, "\nyarn_n_ctx_orig 4096\n") &&
                  strstr(a.text, "\ngate softmax_topk\n") && strstr(a.text, "\nlayer_kinds wfwf\n"),
              "%s", a.text);
    m->hp.yarn_n_ctx_orig = 8192;
    check_changed(m, &w, &a, "yarn_n_ctx_orig 8192 (here 4096)");
    m->hp.yarn_n_ctx_orig = 4096;
    m->hp.yarn_beta_fast = 16.0f;
    check_changed(m, &w, &a, "yarn_beta_fast 0x1p+4");
    m->hp.yarn_beta_fast = 32.0f;
    float af = m->hp.yarn_attn_factor;
    m->hp.yarn_attn_factor = 1.5f;
    check_changed(m, &w, &a, "yarn_attn_factor 0x1.8p+0");
    m->hp.yarn_attn_factor = af;
    m->hp.swiglu_limit = 8.0f;
    check_changed(m, &w, &a, "swiglu_limit 0x1p+3");
    m->hp.swiglu_limit = 7.0f;
    m->hp.gate = KP_GATE_SOFTMAX;
    check_changed(m, &w, &a, "gate softmax");
    m->hp.gate = KP_GATE_SOFTMAX_TOPK;
    m->hp.rope_yarn = false;
    check_changed(m, &w, &a, ""); /* the lines go: another id */
    m->hp.rope_yarn = true;
    kp_fingerprint_make(&b, m, &w, KP_DTYPE_F16, KP_DTYPE_F16, 16, false);
    CHECK(kp_bkey_eq(&a.id, &b.id));
    kp_model_free(m);
}

static void test_record(void) {
    kp_kvpool *p = NULL;
    kp_error err = {0};
    kp_kvpool_config kc = {3, 2, 8, KP_DTYPE_F16, 4, 0, KP_DTYPE_F16, NULL, 0, 0};
    kc.budget_bytes = 4 * (uint64_t)3 * 2 * 2 * 4 * 8 * 2;
    CHECK(kp_kvpool_new(&p, &kc, &err) == KP_OK);
    if (!p) return;
    CHECK_EQ_INT(kp_kvpool_n_blocks(p), 4);
    int32_t b0, b1;
    CHECK(kp_kvpool_alloc(p, &b0, &err) == KP_OK && kp_kvpool_alloc(p, &b1, &err) == KP_OK);
    size_t run = 4 * 8 * 2;
    for (uint32_t l = 0; l < 3; l++)
        for (uint32_t h = 0; h < 2; h++) {
            uint8_t *k = kp_kvpool_k(p, b0, l, h), *v = kp_kvpool_v(p, b0, l, h);
            for (size_t i = 0; i < run; i++) {
                k[i] = (uint8_t)(i * 31 + l * 7 + h);
                v[i] = (uint8_t)(i * 17 + l * 3 + h + 100);
            }
            memset(kp_kvpool_k(p, b1, l, h), 0, run);
            memset(kp_kvpool_v(p, b1, l, h), 0, run);
        }
    int32_t tok[4] = {5, 6, 7, 8}, other[4] = {5, 6, 7, 9};
    kp_bkey fp = kp_bkey_next(NULL, tok, 1), key = kp_bkey_next(NULL, tok, 4), zero = {{0}};
    size_t n = kp_blockrec_size(p);
    CHECK_EQ_INT(n, KP_BLOCKREC_HEADER + 16 + 3 * 2 * 2 * run);
    uint8_t *rec = malloc(n), *bad = malloc(n);
    kp_blockrec_encode(rec, p, b0, &fp, &key, &zero, tok);
    CHECK(!memcmp(rec, "KVPINBLK", 8));
    CHECK_EQ_INT(kp_blockrec_check(rec, n, p, &fp, &key, tok), KP_BLOCKREC_OK);
    kp_blockrec_load(rec, p, b1);
    for (uint32_t l = 0; l < 3; l++)
        for (uint32_t h = 0; h < 2; h++) {
            CHECK(!memcmp(kp_kvpool_k(p, b0, l, h), kp_kvpool_k(p, b1, l, h), run));
            CHECK(!memcmp(kp_kvpool_v(p, b0, l, h), kp_kvpool_v(p, b1, l, h), run));
        }
    /* each corruption, its reason */
    CHECK_EQ_INT(kp_blockrec_check(rec, n - 1, p, &fp, &key, tok), KP_BLOCKREC_TRUNCATED);
    CHECK_EQ_INT(kp_blockrec_check(rec, 40, p, &fp, &key, tok), KP_BLOCKREC_TRUNCATED);
    for (size_t off = KP_BLOCKREC_HEADER + 16; off < n; off += 97) {
        memcpy(bad, rec, n);
        bad[off] ^= 0x10;
        CHECK_EQ_INT(kp_blockrec_check(bad, n, p, &fp, &key, tok), KP_BLOCKREC_CHECKSUM);
    }
    CHECK_EQ_INT(kp_blockrec_check(rec, n, p, &fp, &key, other), KP_BLOCKREC_TOKENS);
    kp_bkey key2 = kp_bkey_next(NULL, other, 4), fp2 = kp_bkey_next(NULL, other + 3, 1);
    CHECK_EQ_INT(kp_blockrec_check(rec, n, p, &fp, &key2, tok), KP_BLOCKREC_TOKENS);
    CHECK_EQ_INT(kp_blockrec_check(rec, n, p, &fp2, &key, tok), KP_BLOCKREC_FINGERPRINT);
    memcpy(bad, rec, n);
    bad[0] = 'X';
    CHECK_EQ_INT(kp_blockrec_check(bad, n, p, &fp, &key, tok), KP_BLOCKREC_FORMAT);
    memcpy(bad, rec, n);
    bad[64] = 8; /* n_tokens */
    CHECK_EQ_INT(kp_blockrec_check(bad, n, p, &fp, &key, tok), KP_BLOCKREC_FORMAT);
    memcpy(bad, rec, n);
    bad[KP_BLOCKREC_HEADER] ^= 1; /* a token the header's key was not made from */
    CHECK_EQ_INT(kp_blockrec_check(bad, n, p, &fp, &key, tok), KP_BLOCKREC_TOKENS);
    CHECK_EQ_STR(kp_blockrec_reason_name(KP_BLOCKREC_CHECKSUM), "checksum");
    free(rec);
    free(bad);
    kp_kvpool_free(p);
}

/* K and V of different (quantized) types: runs of each one's own size,
 * the record round-trips byte for byte. */
static void test_record_mixed_types(void) {
    kp_kvpool *p = NULL;
    kp_error err = {0};
    kp_kvpool_config kc = {2, 2, 32, KP_DTYPE_Q8_0, 4, 0, KP_DTYPE_Q4_0, NULL, 0, 0};
    size_t krun = 4 * 34, vrun = 4 * 18; /* q8_0: 34 bytes per 32 values, q4_0: 18 */
    kc.budget_bytes = 2 * (uint64_t)2 * 2 * (krun + vrun);
    CHECK(kp_kvpool_new(&p, &kc, &err) == KP_OK);
    if (!p) return;
    int32_t b0, b1;
    CHECK(kp_kvpool_alloc(p, &b0, &err) == KP_OK && kp_kvpool_alloc(p, &b1, &err) == KP_OK);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < 2; h++) {
            uint8_t *k = kp_kvpool_k(p, b0, l, h), *v = kp_kvpool_v(p, b0, l, h);
            for (size_t i = 0; i < krun; i++) k[i] = (uint8_t)(i * 13 + l + 5 * h);
            for (size_t i = 0; i < vrun; i++) v[i] = (uint8_t)(i * 7 + 3 * l + h + 1);
            memset(kp_kvpool_k(p, b1, l, h), 0, krun);
            memset(kp_kvpool_v(p, b1, l, h), 0, vrun);
        }
    int32_t tok[4] = {1, 2, 3, 4};
    kp_bkey fp = kp_bkey_next(NULL, tok, 2), key = kp_bkey_next(NULL, tok, 4), zero = {{0}};
    size_t n = kp_blockrec_size(p);
    CHECK_EQ_INT(n, KP_BLOCKREC_HEADER + 16 + 2 * 2 * (krun + vrun));
    uint8_t *rec = malloc(n);
    kp_blockrec_encode(rec, p, b0, &fp, &key, &zero, tok);
    CHECK_EQ_INT(kp_blockrec_check(rec, n, p, &fp, &key, tok), KP_BLOCKREC_OK);
    kp_blockrec_load(rec, p, b1);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < 2; h++) {
            CHECK(!memcmp(kp_kvpool_k(p, b0, l, h), kp_kvpool_k(p, b1, l, h), krun));
            CHECK(!memcmp(kp_kvpool_v(p, b0, l, h), kp_kvpool_v(p, b1, l, h), vrun));
        }
    free(rec);
    kp_kvpool_free(p);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvpin-blockkey-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_keys_match_xxhsum);
    RUN(test_fingerprint);
    RUN(test_fingerprint_windows);
    RUN(test_fingerprint_experts);
    RUN(test_fingerprint_qwen35moe);
    RUN(test_fingerprint_gptoss);
    RUN(test_record);
    RUN(test_record_mixed_types);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) return 1;
    return harness_finish("blockkey");
}
