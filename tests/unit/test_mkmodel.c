/*
 * test_mkmodel.c - the GGUF writer (gguf_write.c) and the random-model
 * generator (mkmodel.c), checked through the reader (gguf.c) and against
 * files written by llama.cpp's own tools:
 *
 *   - every metadata value type and tensor layout round-trips through the reader;
 *   - re-emitting a gguf-py file (gen-llama-gqa-f32.gguf) reproduces it byte for byte;
 *   - a model with the reference spec has the reference's metadata keys, values
 *     and tensor infos (and, with the reference's own tokenizer, its header bytes);
 *   - weights have the documented statistics (float64 sums over the F32 file),
 *     quantized files hold the same weights within each type's error;
 *   - llama.cpp's llama_model_quantize (llama-quantize --pure) applied to our
 *     F32 files (tests/data/quant_more/llama-quantize.txt): every type, and the
 *     fallback for row lengths a type cannot encode, give the same tensor
 *     types, bytes and general.file_type as mkmodel writes directly;
 *   - determinism, tokenizer copies, refusals and I/O errors.
 */
#include <stdint.h>
#include <strings.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "harness.h"
#include "model/mkmodel.h"
#include "kernels/quant.h"

#define STORIES "models/stories260K.gguf"
#define REF_GQA "tests/data/models/gen-llama-gqa-f32.gguf"
#define REF_QWEN2 "tests/data/models/gen-qwen2-f32.gguf"
#define REF_QWEN3 "tests/data/models/gen-qwen3-f16.gguf"

/* ---- helpers ---- */

/* A fresh empty file under /tmp; its path is written to buf. */
static void tmp_path(char buf[64]) {
    snprintf(buf, 64, "/tmp/kvpin-test-mkmodel-XXXXXX");
    int fd = mkstemp(buf);
    if (fd >= 0) close(fd);
}

static bool file_exists(const char *path) { return access(path, F_OK) == 0; }

static bool value_eq(const kp_gguf_value *a, const kp_gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case KP_GGUF_TYPE_UINT8: case KP_GGUF_TYPE_UINT16: case KP_GGUF_TYPE_UINT32: case KP_GGUF_TYPE_UINT64:
        return a->v.u64 == b->v.u64;
    case KP_GGUF_TYPE_INT8: case KP_GGUF_TYPE_INT16: case KP_GGUF_TYPE_INT32: case KP_GGUF_TYPE_INT64:
        return a->v.i64 == b->v.i64;
    case KP_GGUF_TYPE_FLOAT32: case KP_GGUF_TYPE_FLOAT64:
        return memcmp(&a->v.f64, &b->v.f64, sizeof(double)) == 0;
    case KP_GGUF_TYPE_BOOL: return a->v.b == b->v.b;
    case KP_GGUF_TYPE_STRING:
        return a->v.str.len == b->v.str.len &&
               memcmp(a->v.str.data, b->v.str.data, a->v.str.len) == 0;
    case KP_GGUF_TYPE_ARRAY: {
        if (a->v.arr.elem_type != b->v.arr.elem_type || a->v.arr.n != b->v.arr.n) return false;
        uint64_t n = a->v.arr.n;
        if (a->v.arr.elem_type == KP_GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < n; i++) {
                kp_gguf_str x = a->v.arr.strs[i], y = b->v.arr.strs[i];
                if (x.len != y.len || memcmp(x.data, y.data, x.len) != 0) return false;
            }
            return true;
        }
        if (a->v.arr.elem_type == KP_GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < n; i++)
                if (!value_eq(&a->v.arr.items[i], &b->v.arr.items[i])) return false;
            return true;
        }
        return n == 0 || memcmp(a->v.arr.raw, b->v.arr.raw,
                                n * kp_gguf_type_size(a->v.arr.elem_type)) == 0;
    }
    default: return false;
    }
}

static bool key_has_prefix(kp_gguf_str key, const char *prefix) {
    size_t n = strlen(prefix);
    return key.len >= n && memcmp(key.data, prefix, n) == 0;
}

static uint32_t get_u32(const kp_gguf *g, const char *key) {
    uint32_t v = 0xFFFFFFFFu;
    kp_gguf_get_u32(g, key, 0xFFFFFFFFu, &v, NULL);
    return v;
}

static float get_f32(const kp_gguf *g, const char *key) {
    float v = -1.0f;
    kp_gguf_get_f32(g, key, -1.0f, &v, NULL);
    return v;
}

static bool str_is(const kp_gguf *g, const char *key, const char *want) {
    kp_gguf_str s;
    return kp_gguf_get_str(g, key, &s, NULL) == KP_OK && s.data && kp_gguf_str_eq(s, want);
}

/* Dequantizes a whole tensor into a malloc'd float array. */
static float *tensor_floats(const kp_gguf_tensor *t) {
    int64_t rows = (int64_t)(t->n_elements / (uint64_t)t->ne[0]);
    size_t row_bytes = kp_dtype_row_size(t->type, t->ne[0]);
    float *out = malloc(t->n_elements * sizeof *out);
    if (!out) return NULL;
    for (int64_t r = 0; r < rows; r++) {
        if (!kp_dequantize_row((kp_dtype)t->type, (const uint8_t *)t->data + r * row_bytes,
                               out + r * t->ne[0], t->ne[0])) {
            free(out);
            return NULL;
        }
    }
    return out;
}

typedef struct {
    double n, sum, sum2, sum4, within1; /* within1: count of |x - mean_expected| < sd_expected */
} stats;

static void stats_add(stats *s, const float *x, uint64_t n, double center, double sd) {
    for (uint64_t i = 0; i < n; i++) {
        double d = (double)x[i] - center;
        s->n += 1;
        s->sum += d;
        s->sum2 += d * d;
        s->sum4 += d * d * d * d;
        s->within1 += fabs(d) < sd;
    }
}

/* Checks a pooled sample against N(center, sd^2) with 5-sigma sampling bounds:
 * the mean, the standard deviation, the kurtosis (3 for a normal) and the
 * fraction within one sd (0.6827). */
static void check_normal(const stats *s, double sd, const char *what) {
    double n = s->n, mean = s->sum / n;
    double var = s->sum2 / n, kurt = (s->sum4 / n) / (var * var);
    CHECK_MSG(n > 0, "%s: empty", what);
    CHECK_MSG(fabs(mean) < 5 * sd / sqrt(n), "%s: mean %g (sd %g, n %g)", what, mean, sd, n);
    CHECK_MSG(fabs(sqrt(var) / sd - 1) < 5 / sqrt(2 * n), "%s: sd %g, expected %g (n %g)", what,
              sqrt(var), sd, n);
    CHECK_MSG(fabs(kurt - 3) < 5 * sqrt(24 / n), "%s: kurtosis %g (n %g)", what, kurt, n);
    double p = 0.682689492137;
    CHECK_MSG(fabs(s->within1 / n - p) < 5 * sqrt(p * (1 - p) / n), "%s: %g within 1 sd", what,
              s->within1 / n);
}

static kp_mkmodel_spec preset(const char *name) {
    kp_mkmodel_spec s;
    memset(&s, 0, sizeof s);
    kp_error err = {0};
    kp_status st = kp_mkmodel_spec_preset(name, &s, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    return s;
}

/* ---- the writer ---- */

/* Every value type, nested arrays, tensors of three types, alignment 64. */
static void test_writer_roundtrip(void) {
    char path[64];
    tmp_path(path);
    kp_error err = {0};
    kp_gguf_w *w = NULL;
    CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u8(w, "t.u8", 200, &err) == KP_OK);
    CHECK(kp_gguf_w_add_i8(w, "t.i8", -100, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u16(w, "t.u16", 60000, &err) == KP_OK);
    CHECK(kp_gguf_w_add_i16(w, "t.i16", -30000, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u32(w, "t.u32", 4000000000u, &err) == KP_OK);
    CHECK(kp_gguf_w_add_i32(w, "t.i32", -2000000000, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u64(w, "t.u64", 0xFEDCBA9876543210ull, &err) == KP_OK);
    CHECK(kp_gguf_w_add_i64(w, "t.i64", INT64_MIN + 5, &err) == KP_OK);
    CHECK(kp_gguf_w_add_f32(w, "t.f32", 0.1f, &err) == KP_OK);
    CHECK(kp_gguf_w_add_f64(w, "t.f64", -1e300, &err) == KP_OK);
    CHECK(kp_gguf_w_add_bool(w, "t.bool", true, &err) == KP_OK);
    CHECK(kp_gguf_w_add_str(w, "t.str", "héllo", &err) == KP_OK);
    CHECK(kp_gguf_w_add_strn(w, "t.strn", "a\0b", 3, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u32(w, "general.alignment", 64, &err) == KP_OK);
    const int16_t a16[3] = {-1, 2, -32768};
    const float af[2] = {1.5f, -0.25f};
    const bool ab[3] = {true, false, true};
    const double ad[1] = {3.25};
    const uint64_t a64[2] = {1, UINT64_MAX};
    CHECK(kp_gguf_w_add_arr(w, "a.i16", KP_GGUF_TYPE_INT16, a16, 3, &err) == KP_OK);
    CHECK(kp_gguf_w_add_arr(w, "a.f32", KP_GGUF_TYPE_FLOAT32, af, 2, &err) == KP_OK);
    CHECK(kp_gguf_w_add_arr(w, "a.bool", KP_GGUF_TYPE_BOOL, ab, 3, &err) == KP_OK);
    CHECK(kp_gguf_w_add_arr(w, "a.f64", KP_GGUF_TYPE_FLOAT64, ad, 1, &err) == KP_OK);
    CHECK(kp_gguf_w_add_arr(w, "a.u64", KP_GGUF_TYPE_UINT64, a64, 2, &err) == KP_OK);
    CHECK(kp_gguf_w_add_arr(w, "a.empty", KP_GGUF_TYPE_UINT32, NULL, 0, &err) == KP_OK);
    const char *strs[3] = {"x", "", "long string"};
    CHECK(kp_gguf_w_add_arr_str(w, "a.str", strs, 3, &err) == KP_OK);
    /* a nested array [[7, 8], []] of INT32, built as the reader would decode it */
    const uint8_t raw78[8] = {7, 0, 0, 0, 8, 0, 0, 0};
    kp_gguf_value items[2];
    memset(items, 0, sizeof items);
    items[0].type = items[1].type = KP_GGUF_TYPE_ARRAY;
    items[0].v.arr.elem_type = items[1].v.arr.elem_type = KP_GGUF_TYPE_INT32;
    items[0].v.arr.n = 2;
    items[0].v.arr.raw = raw78;
    kp_gguf_value nested;
    memset(&nested, 0, sizeof nested);
    nested.type = KP_GGUF_TYPE_ARRAY;
    nested.v.arr.elem_type = KP_GGUF_TYPE_ARRAY;
    nested.v.arr.n = 2;
    nested.v.arr.items = items;
    CHECK(kp_gguf_w_add_value(w, "a.nested", &nested, &err) == KP_OK);

    float f32data[6] = {1, 2, 3, 4, 5, 6};
    uint8_t q8data[2 * 34], f16data[10];
    for (size_t i = 0; i < sizeof q8data; i++) q8data[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof f16data; i++) f16data[i] = (uint8_t)(0x30 + i);
    CHECK(kp_gguf_w_add_tensor(w, "a", KP_DTYPE_F32, 2, (int64_t[]){3, 2}, &err) == KP_OK);
    CHECK(kp_gguf_w_add_tensor(w, "b", KP_DTYPE_Q8_0, 2, (int64_t[]){32, 2}, &err) == KP_OK);
    CHECK(kp_gguf_w_add_tensor(w, "c", KP_DTYPE_F16, 3, (int64_t[]){5, 1, 1}, &err) == KP_OK);
    CHECK_EQ_INT(kp_gguf_w_n_tensors(w), 3);
    CHECK_EQ_INT(kp_gguf_w_tensor_bytes(w, 1), 68);
    CHECK(kp_gguf_w_begin(w, path, &err) == KP_OK);
    CHECK(kp_gguf_w_write_data(w, f32data, 12, &err) == KP_OK); /* in two chunks */
    CHECK(kp_gguf_w_write_data(w, f32data + 3, 12, &err) == KP_OK);
    CHECK(kp_gguf_w_write_data(w, q8data, sizeof q8data, &err) == KP_OK);
    CHECK(kp_gguf_w_write_data(w, f16data, sizeof f16data, &err) == KP_OK);
    CHECK_MSG(kp_gguf_w_finish(w, &err) == KP_OK, "%s", err.msg);
    uint64_t data_offset = kp_gguf_w_data_offset(w);
    kp_gguf_w_free(w);

    kp_gguf *g = NULL;
    CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
    if (g) {
        CHECK_EQ_INT(kp_gguf_version(g), 3);
        CHECK_EQ_INT(kp_gguf_alignment(g), 64);
        CHECK_EQ_INT(kp_gguf_data_offset(g), data_offset);
        CHECK_EQ_INT(kp_gguf_data_offset(g) % 64, 0);
        CHECK_EQ_INT(kp_gguf_file_size(g), data_offset + 64 + 128 + 64);
        CHECK_EQ_INT(kp_gguf_n_kv(g), 22);
        const kp_gguf_kv *kv = kp_gguf_kv_at(g, 0);
        CHECK(kv && kp_gguf_str_eq(kv->key, "t.u8") && kv->value.type == KP_GGUF_TYPE_UINT8 &&
              kv->value.v.u64 == 200);
        const kp_gguf_kv *k;
        CHECK((k = kp_gguf_find(g, "t.i8")) && k->value.type == KP_GGUF_TYPE_INT8 &&
              k->value.v.i64 == -100);
        CHECK((k = kp_gguf_find(g, "t.u16")) && k->value.type == KP_GGUF_TYPE_UINT16 &&
              k->value.v.u64 == 60000);
        CHECK((k = kp_gguf_find(g, "t.i16")) && k->value.type == KP_GGUF_TYPE_INT16 &&
              k->value.v.i64 == -30000);
        CHECK((k = kp_gguf_find(g, "t.u32")) && k->value.type == KP_GGUF_TYPE_UINT32 &&
              k->value.v.u64 == 4000000000u);
        CHECK((k = kp_gguf_find(g, "t.i32")) && k->value.type == KP_GGUF_TYPE_INT32 &&
              k->value.v.i64 == -2000000000);
        CHECK((k = kp_gguf_find(g, "t.u64")) && k->value.type == KP_GGUF_TYPE_UINT64 &&
              k->value.v.u64 == 0xFEDCBA9876543210ull);
        CHECK((k = kp_gguf_find(g, "t.i64")) && k->value.type == KP_GGUF_TYPE_INT64 &&
              k->value.v.i64 == INT64_MIN + 5);
        CHECK((k = kp_gguf_find(g, "t.f32")) && k->value.type == KP_GGUF_TYPE_FLOAT32 &&
              k->value.v.f64 == (double)0.1f);
        CHECK((k = kp_gguf_find(g, "t.f64")) && k->value.type == KP_GGUF_TYPE_FLOAT64 &&
              k->value.v.f64 == -1e300);
        CHECK((k = kp_gguf_find(g, "t.bool")) && k->value.type == KP_GGUF_TYPE_BOOL && k->value.v.b);
        CHECK(str_is(g, "t.str", "héllo"));
        CHECK((k = kp_gguf_find(g, "t.strn")) && k->value.v.str.len == 3 &&
              memcmp(k->value.v.str.data, "a\0b", 3) == 0);
        CHECK((k = kp_gguf_find(g, "a.i16")) && k->value.v.arr.n == 3 &&
              kp_gguf_arr_i64(&k->value, 0) == -1 && kp_gguf_arr_i64(&k->value, 2) == -32768);
        CHECK((k = kp_gguf_find(g, "a.f32")) && kp_gguf_arr_f64(&k->value, 1) == -0.25);
        CHECK((k = kp_gguf_find(g, "a.bool")) && k->value.v.arr.elem_type == KP_GGUF_TYPE_BOOL &&
              k->value.v.arr.n == 3 && memcmp(k->value.v.arr.raw, "\1\0\1", 3) == 0);
        CHECK((k = kp_gguf_find(g, "a.f64")) && kp_gguf_arr_f64(&k->value, 0) == 3.25);
        CHECK((k = kp_gguf_find(g, "a.u64")) && k->value.v.arr.n == 2 &&
              memcmp(k->value.v.arr.raw + 8, "\xff\xff\xff\xff\xff\xff\xff\xff", 8) == 0);
        CHECK((k = kp_gguf_find(g, "a.empty")) && k->value.v.arr.n == 0 &&
              k->value.v.arr.elem_type == KP_GGUF_TYPE_UINT32);
        CHECK((k = kp_gguf_find(g, "a.str")) && k->value.v.arr.n == 3 &&
              kp_gguf_str_eq(k->value.v.arr.strs[0], "x") && k->value.v.arr.strs[1].len == 0 &&
              kp_gguf_str_eq(k->value.v.arr.strs[2], "long string"));
        CHECK((k = kp_gguf_find(g, "a.nested")) && value_eq(&k->value, &nested));

        CHECK_EQ_INT(kp_gguf_n_tensors(g), 3);
        const kp_gguf_tensor *ta = kp_gguf_find_tensor(g, "a"), *tb = kp_gguf_find_tensor(g, "b"),
                          *tc = kp_gguf_find_tensor(g, "c");
        CHECK(ta && tb && tc);
        if (ta && tb && tc) {
            CHECK(ta->n_dims == 2 && ta->ne[0] == 3 && ta->ne[1] == 2 && ta->type == 0);
            CHECK(tb->type == KP_DTYPE_Q8_0 && tb->n_bytes == 68);
            CHECK(tc->n_dims == 3 && tc->ne[0] == 5 && tc->type == KP_DTYPE_F16);
            CHECK_EQ_INT(ta->offset, 0);
            CHECK_EQ_INT(tb->offset, 64);
            CHECK_EQ_INT(tc->offset, 192);
            CHECK(memcmp(ta->data, f32data, 24) == 0);
            CHECK(memcmp(tb->data, q8data, 68) == 0);
            CHECK(memcmp(tc->data, f16data, 10) == 0);
        }
        kp_gguf_close(g);
    }
    unlink(path);
}

/* Re-emitting every key and tensor of a file written by gguf-py gives the
 * same bytes: the writer's layout is llama.cpp's. */
static void test_writer_reproduces_reference(void) {
    const char *src = harness_path(REF_GQA);
    kp_error err = {0};
    kp_gguf *g = NULL;
    CHECK_MSG(kp_gguf_open(&g, src, &err) == KP_OK, "%s", err.msg);
    if (!g) return;
    char path[64];
    tmp_path(path);
    kp_gguf_w *w = NULL;
    CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
    for (size_t i = 0; i < kp_gguf_n_kv(g); i++)
        CHECK_MSG(kp_gguf_w_copy_kv(w, kp_gguf_kv_at(g, i), &err) == KP_OK, "%s", err.msg);
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        char name[KP_GGUF_W_MAX_TENSOR_NAME];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        CHECK(kp_gguf_w_add_tensor(w, name, t->type, t->n_dims, t->ne, &err) == KP_OK);
    }
    CHECK(kp_gguf_w_begin(w, path, &err) == KP_OK);
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        CHECK(kp_gguf_w_write_data(w, t->data, t->n_bytes, &err) == KP_OK);
    }
    CHECK_MSG(kp_gguf_w_finish(w, &err) == KP_OK, "%s", err.msg);
    kp_gguf_w_free(w);
    kp_gguf_close(g);

    size_t n_ref = 0, n_out = 0;
    char *ref = harness_read_file(src, &n_ref), *out = harness_read_file(path, &n_out);
    CHECK(ref && out);
    CHECK_EQ_INT(n_out, n_ref);
    CHECK(ref && out && n_out == n_ref && memcmp(ref, out, n_ref) == 0);
    free(ref);
    free(out);
    unlink(path);
}

/* The stream form, into memory, read back with kp_gguf_open_memory. */
static void test_writer_stream(void) {
    char *mem = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&mem, &size);
    CHECK(f != NULL);
    if (!f) return;
    kp_error err = {0};
    kp_gguf_w *w = NULL;
    CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
    CHECK(kp_gguf_w_add_str(w, "general.architecture", "llama", &err) == KP_OK);
    CHECK(kp_gguf_w_add_tensor(w, "x", KP_DTYPE_F32, 1, (int64_t[]){3}, &err) == KP_OK);
    CHECK(kp_gguf_w_begin_stream(w, f, "memory", &err) == KP_OK);
    const float x[3] = {1, -2, 3};
    CHECK(kp_gguf_w_write_data(w, x, sizeof x, &err) == KP_OK);
    CHECK(kp_gguf_w_finish(w, &err) == KP_OK);
    kp_gguf_w_free(w); /* does not close the stream */
    CHECK(fclose(f) == 0);
    kp_gguf *g = NULL;
    CHECK_MSG(kp_gguf_open_memory(&g, mem, size, "memory", &err) == KP_OK, "%s", err.msg);
    if (g) {
        CHECK(str_is(g, "general.architecture", "llama"));
        const kp_gguf_tensor *t = kp_gguf_find_tensor(g, "x");
        CHECK(t && t->n_bytes == 12 && memcmp(t->data, x, 12) == 0);
        CHECK_EQ_INT(size, kp_gguf_data_offset(g) + 32);
        kp_gguf_close(g);
    }
    free(mem);
}

static void test_writer_errors(void) {
    kp_error err = {0};
    kp_gguf_w *w = NULL;
    CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u32(w, "k", 1, &err) == KP_OK);
    CHECK(kp_gguf_w_add_str(w, "k", "again", &err) == KP_EINVAL);
    CHECK(strstr(err.msg, "duplicate") != NULL);
    CHECK(kp_gguf_w_add_u32(w, "", 1, &err) == KP_EINVAL);
    CHECK(kp_gguf_w_add_u32(w, "general.alignment", 48, &err) == KP_EINVAL);
    CHECK(kp_gguf_w_add_u16(w, "general.alignment", 64, &err) == KP_EINVAL);
    CHECK(kp_gguf_w_add_arr(w, "s", KP_GGUF_TYPE_STRING, "x", 1, &err) == KP_EINVAL);
    int64_t ne[2] = {100, 2};
    CHECK(kp_gguf_w_add_tensor(w, "q", KP_DTYPE_Q4_K, 2, ne, &err) == KP_EINVAL);
    CHECK(strstr(err.msg, "256") != NULL);
    CHECK(kp_gguf_w_add_tensor(w, "t", 31, 2, ne, &err) == KP_EINVAL); /* no type 31 */
    CHECK(kp_gguf_w_add_tensor(w, "t", KP_DTYPE_F32, 5, ne, &err) == KP_EINVAL);
    CHECK(kp_gguf_w_add_tensor(w, "t", KP_DTYPE_F32, 2, (int64_t[]){4, 0}, &err) == KP_EINVAL);
    char longname[80];
    memset(longname, 'x', sizeof longname - 1);
    longname[79] = 0;
    CHECK(kp_gguf_w_add_tensor(w, longname, KP_DTYPE_F32, 1, ne, &err) == KP_EINVAL);
    CHECK(kp_gguf_w_add_tensor(w, "t", KP_DTYPE_F32, 2, ne, &err) == KP_OK);
    CHECK(kp_gguf_w_add_tensor(w, "t", KP_DTYPE_F32, 1, ne, &err) == KP_EINVAL);
    CHECK(kp_gguf_w_add_tensor(w, "u", KP_DTYPE_F32, 1, ne, &err) == KP_OK);
    /* the failed calls changed nothing: one key, two tensors */
    CHECK_EQ_INT(kp_gguf_w_n_tensors(w), 2);
    CHECK(kp_gguf_w_write_data(w, "x", 1, &err) == KP_EINVAL); /* before begin */

    char path[64];
    tmp_path(path);
    CHECK(kp_gguf_w_begin(w, path, &err) == KP_OK);
    CHECK(kp_gguf_w_add_u32(w, "late", 1, &err) == KP_EINVAL);
    float buf[300] = {0};
    CHECK(kp_gguf_w_write_data(w, buf, 800, &err) == KP_OK); /* tensor t: 800 bytes */
    CHECK(kp_gguf_w_write_data(w, buf, 404, &err) == KP_EINVAL); /* u has 400 */
    CHECK(strstr(err.msg, "'u'") != NULL);
    CHECK(kp_gguf_w_finish(w, &err) == KP_EINVAL); /* failed writer */
    kp_gguf_w_free(w);
    CHECK_MSG(!file_exists(path), "partial file %s left behind", path);

    /* finish with a tensor's data missing: refused, file removed */
    CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
    CHECK(kp_gguf_w_add_tensor(w, "t", KP_DTYPE_F32, 1, ne, &err) == KP_OK);
    tmp_path(path);
    CHECK(kp_gguf_w_begin(w, path, &err) == KP_OK);
    CHECK(kp_gguf_w_write_data(w, buf, 16, &err) == KP_OK);
    CHECK(kp_gguf_w_finish(w, &err) == KP_EINVAL);
    CHECK(strstr(err.msg, "16 of 400") != NULL);
    kp_gguf_w_free(w);
    CHECK(!file_exists(path));

    /* a directory that does not exist */
    CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
    CHECK(kp_gguf_w_begin(w, "/nonexistent-kvpin-dir/x.gguf", &err) == KP_EIO);
    CHECK(strstr(err.msg, "/nonexistent-kvpin-dir/x.gguf") != NULL);
    kp_gguf_w_free(w);

    /* a full disk: the error surfaces at a write or at finish, never silently */
    if (file_exists("/dev/full")) {
        CHECK(kp_gguf_w_new(&w, &err) == KP_OK);
        CHECK(kp_gguf_w_add_tensor(w, "t", KP_DTYPE_F32, 1, ne, &err) == KP_OK);
        kp_status st = kp_gguf_w_begin(w, "/dev/full", &err);
        if (st == KP_OK) st = kp_gguf_w_write_data(w, buf, 400, &err);
        if (st == KP_OK) st = kp_gguf_w_finish(w, &err);
        CHECK_EQ_INT(st, KP_EIO);
        CHECK_MSG(strstr(err.msg, "space") != NULL, "%s", err.msg);
        kp_gguf_w_free(w);
    }
    kp_gguf_w_free(NULL);
}

/* ---- the generator ---- */

/* Writes `spec` with `tok` as tokenizer source into a new temp file; returns
 * its path in `path`, or "" on failure (reported). */
static bool write_model(const kp_mkmodel_spec *spec, const char *tok, char path[64]) {
    tmp_path(path);
    kp_error err = {0};
    kp_status st = kp_mkmodel_write(spec, harness_path(tok), path, NULL, &err);
    CHECK_MSG(st == KP_OK, "%s %s: %s", spec->arch, kp_dtype_name(spec->wtype), err.msg);
    return st == KP_OK;
}

/* Expected tensor list of a spec (the contract in mkmodel.h / llama.cpp's names). */
typedef struct {
    char name[64];
    int64_t ne0, ne1; /* ne1 0 = 1-D */
    int64_t ne2;      /* 0 = not 3-D (qwen3moe's experts: n_expert matrices) */
    bool is_weight;   /* 2-D or 3-D: has the spec's type; else F32 (vectors, the router) */
} expect_tensor;

static size_t expected_tensors(const kp_mkmodel_spec *s, int64_t n_vocab, expect_tensor *out) {
    int64_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    int64_t E = s->n_embd, q = s->n_head * hd, kv = s->n_head_kv * hd, F = s->n_ff;
    size_t n = 0;
#define ADD(nm, a, b) (snprintf(out[n].name, 64, "%s", nm), out[n].ne0 = a, out[n].ne1 = b, out[n].ne2 = 0, \
                       out[n].is_weight = b != 0, n++)
    char nm[64];
    ADD("token_embd.weight", E, n_vocab);
    ADD("output_norm.weight", E, 0);
    if (!s->tied) ADD("output.weight", E, n_vocab);
    for (uint32_t l = 0; l < s->n_layer; l++) {
#define L(sfx, a, b) (snprintf(nm, 64, "blk.%u.%s", l, sfx), ADD(nm, a, b))
        L("attn_norm.weight", E, 0);
        L("attn_q.weight", E, q);
        L("attn_k.weight", E, kv);
        L("attn_v.weight", E, kv);
        L("attn_output.weight", q, E);
        L("ffn_norm.weight", E, 0);
        bool moe = strcmp(s->arch, "qwen3moe") == 0;
        if (moe) { /* the router stays F32 (llama-quantize leaves ffn_gate_inp), the experts are 3-D */
            int64_t X = s->n_ff_exp;
            L("ffn_gate_inp.weight", E, s->n_expert);
            out[n - 1].is_weight = false;
            L("ffn_gate_exps.weight", E, X);
            out[n - 1].ne2 = s->n_expert;
            L("ffn_up_exps.weight", E, X);
            out[n - 1].ne2 = s->n_expert;
            L("ffn_down_exps.weight", X, E);
            out[n - 1].ne2 = s->n_expert;
        } else {
            L("ffn_gate.weight", E, F);
            L("ffn_up.weight", E, F);
            L("ffn_down.weight", F, E);
        }
        if (strcmp(s->arch, "qwen2") == 0) {
            L("attn_q.bias", q, 0);
            L("attn_k.bias", kv, 0);
            L("attn_v.bias", kv, 0);
        }
        if (strcmp(s->arch, "qwen3") == 0 || strcmp(s->arch, "gemma3") == 0 || moe) {
            L("attn_q_norm.weight", hd, 0);
            L("attn_k_norm.weight", hd, 0);
        }
        if (strcmp(s->arch, "gemma3") == 0) {
            L("post_attention_norm.weight", E, 0);
            L("post_ffw_norm.weight", E, 0);
        }
#undef L
    }
#undef ADD
    return n;
}

/* Metadata and tensor infos of a generated file against its spec. */
static void check_structure(const kp_gguf *g, const kp_mkmodel_spec *s, const char *tok_src) {
    char key[128];
    const char *a = s->arch;
    uint32_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
#define K(sfx) (snprintf(key, sizeof key, "%s.%s", a, sfx), key)
    CHECK(str_is(g, "general.architecture", a));
    CHECK(str_is(g, "general.name", s->name ? s->name : a));
    CHECK_EQ_INT(get_u32(g, K("block_count")), s->n_layer);
    CHECK_EQ_INT(get_u32(g, K("context_length")), s->n_ctx);
    CHECK_EQ_INT(get_u32(g, K("embedding_length")), s->n_embd);
    CHECK_EQ_INT(get_u32(g, K("feed_forward_length")), s->n_ff);
    CHECK_EQ_INT(get_u32(g, K("attention.head_count")), s->n_head);
    CHECK_EQ_INT(get_u32(g, K("attention.head_count_kv")), s->n_head_kv);
    CHECK_EQ_INT(get_u32(g, K("rope.dimension_count")), hd);
    CHECK(get_f32(g, K("rope.freq_base")) == s->rope_base);
    CHECK(get_f32(g, K("attention.layer_norm_rms_epsilon")) == s->rms_eps);
    bool has_kl = kp_gguf_find(g, K("attention.key_length")) != NULL;
    bool want_kl = hd * s->n_head != s->n_embd || strcmp(a, "qwen3") == 0 || strcmp(a, "gemma3") == 0 ||
                   strcmp(a, "qwen3moe") == 0;
    CHECK_EQ_INT(has_kl, want_kl);
    if (want_kl) {
        CHECK_EQ_INT(get_u32(g, K("attention.key_length")), hd);
        CHECK_EQ_INT(get_u32(g, K("attention.value_length")), hd);
    }
    CHECK_EQ_INT(kp_gguf_find(g, K("attention.sliding_window")) != NULL, s->n_swa != 0);
    if (s->n_swa) CHECK_EQ_INT(get_u32(g, K("attention.sliding_window")), s->n_swa);
    CHECK_EQ_INT(kp_gguf_find(g, K("attention.sliding_window_pattern")) != NULL, s->swa_pattern != 0);
    if (s->swa_pattern) CHECK_EQ_INT(get_u32(g, K("attention.sliding_window_pattern")), s->swa_pattern);
    bool moe = strcmp(a, "qwen3moe") == 0;
    CHECK_EQ_INT(kp_gguf_find(g, K("expert_count")) != NULL, moe);
    CHECK_EQ_INT(kp_gguf_find(g, K("expert_used_count")) != NULL, moe);
    CHECK_EQ_INT(kp_gguf_find(g, K("expert_feed_forward_length")) != NULL, moe);
    if (moe) {
        CHECK_EQ_INT(get_u32(g, K("expert_count")), s->n_expert);
        CHECK_EQ_INT(get_u32(g, K("expert_used_count")), s->n_expert_used);
        CHECK_EQ_INT(get_u32(g, K("expert_feed_forward_length")), s->n_ff_exp);
    }
#undef K
    int ftype = kp_mkmodel_file_type(s->wtype);
    CHECK_EQ_INT(get_u32(g, "general.file_type"), ftype);
    CHECK_EQ_INT(kp_gguf_find(g, "general.quantization_version") != NULL, s->wtype != KP_DTYPE_F32);
    uint32_t align = s->alignment ? s->alignment : 32;
    CHECK_EQ_INT(kp_gguf_alignment(g), align);
    CHECK_EQ_INT(kp_gguf_find(g, "general.alignment") != NULL, align != 32);

    /* tokenizer: every tokenizer.* key of the source, equal, and no other */
    kp_gguf *src = NULL;
    kp_error err = {0};
    CHECK_MSG(kp_gguf_open(&src, harness_path(tok_src), &err) == KP_OK, "%s", err.msg);
    size_t n_tok_keys = 0;
    int64_t n_vocab = 0;
    if (src) {
        for (size_t i = 0; i < kp_gguf_n_kv(src); i++) {
            const kp_gguf_kv *kv = kp_gguf_kv_at(src, i);
            if (!key_has_prefix(kv->key, "tokenizer.")) continue;
            n_tok_keys++;
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)kv->key.len, kv->key.data);
            const kp_gguf_kv *mine = kp_gguf_find(g, name);
            CHECK_MSG(mine && value_eq(&mine->value, &kv->value), "tokenizer key %s", name);
        }
        const kp_gguf_kv *tokens = kp_gguf_find(src, "tokenizer.ggml.tokens");
        n_vocab = tokens ? (int64_t)tokens->value.v.arr.n : 0;
        kp_gguf_close(src);
    }
    size_t n_mine = 0;
    for (size_t i = 0; i < kp_gguf_n_kv(g); i++)
        n_mine += key_has_prefix(kp_gguf_kv_at(g, i)->key, "tokenizer.");
    CHECK_EQ_INT(n_mine, n_tok_keys);
    CHECK(n_tok_keys >= 3);
    snprintf(key, sizeof key, "%s.vocab_size", a);
    CHECK_EQ_INT(get_u32(g, key), n_vocab);

    /* tensors */
    expect_tensor *exp = calloc(4 + 14 * s->n_layer, sizeof *exp);
    size_t n_exp = exp ? expected_tensors(s, n_vocab, exp) : 0;
    CHECK_EQ_INT(kp_gguf_n_tensors(g), n_exp);
    CHECK_EQ_INT(kp_gguf_data_offset(g) % align, 0);
    for (size_t i = 0; i < n_exp; i++) {
        const kp_gguf_tensor *t = kp_gguf_find_tensor(g, exp[i].name);
        CHECK_MSG(t != NULL, "missing %s", exp[i].name);
        if (!t) continue;
        uint32_t want_type = exp[i].is_weight ? (uint32_t)s->wtype : KP_DTYPE_F32;
        CHECK_MSG(t->type == want_type, "%s: type %s", exp[i].name, kp_dtype_name(t->type));
        CHECK_EQ_INT(t->n_dims, exp[i].ne2 ? 3 : exp[i].ne1 ? 2 : 1);
        CHECK_EQ_INT(t->ne[0], exp[i].ne0);
        CHECK_EQ_INT(t->ne[1], exp[i].ne1 ? exp[i].ne1 : 1);
        CHECK_EQ_INT(t->ne[2], exp[i].ne2 ? exp[i].ne2 : 1);
        int64_t rows = (exp[i].ne1 ? exp[i].ne1 : 1) * (exp[i].ne2 ? exp[i].ne2 : 1);
        CHECK_EQ_INT(t->n_bytes, kp_dtype_row_size(want_type, exp[i].ne0) * (uint64_t)rows);
        CHECK_EQ_INT(t->offset % align, 0);
        CHECK_EQ_INT(((uintptr_t)t->data - (uintptr_t)kp_gguf_tensor_at(g, 0)->data) % align, 0);
    }
    free(exp);
}

/* Weight statistics of an F32 file: every matrix N(0, scale^2) with the
 * documented scale, norms 1 + 0.1 N, biases 0.5 N (pooled per kind). */
static void check_f32_statistics(const kp_gguf *g, const kp_mkmodel_spec *s) {
    stats mat = {0}, norms = {0}, biases = {0}, embd = {0};
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        const float *x = t->data;
        if (strstr(name, "norm")) {
            stats_add(&norms, x, t->n_elements, 1.0, 0.1);
        } else if (strstr(name, ".bias")) {
            stats_add(&biases, x, t->n_elements, 0.0, 0.5);
        } else if (strcmp(name, "token_embd.weight") == 0) {
            double sd = s->tied ? 1.0 / sqrt(s->n_embd) : 1.0;
            /* normalized to unit variance so every matrix pools into one sample */
            float *y = malloc(t->n_elements * sizeof *y);
            for (uint64_t j = 0; y && j < t->n_elements; j++) y[j] = (float)(x[j] / sd);
            if (y) stats_add(&embd, y, t->n_elements, 0.0, 1.0);
            free(y);
        } else {
            double sd = 1.0 / sqrt((double)t->ne[0]); /* fan_in = row length */
            float *y = malloc(t->n_elements * sizeof *y);
            for (uint64_t j = 0; y && j < t->n_elements; j++) y[j] = (float)(x[j] / sd);
            if (y) stats_add(&mat, y, t->n_elements, 0.0, 1.0);
            free(y);
        }
    }
    check_normal(&mat, 1.0, "matrices * sqrt(fan_in)");
    check_normal(&embd, 1.0, "token_embd / its scale");
    check_normal(&norms, 0.1, "norm weights - 1");
    if (strcmp(s->arch, "qwen2") == 0) check_normal(&biases, 0.5, "qwen2 biases");
    else CHECK_EQ_INT(biases.n, 0);
}

/* Relative RMS difference between a tensor of `q` and the same tensor of the F32 file. */
static double rel_rms_error(const kp_gguf *f32, const kp_gguf *q, const char *name) {
    const kp_gguf_tensor *a = kp_gguf_find_tensor(f32, name), *b = kp_gguf_find_tensor(q, name);
    if (!a || !b || a->n_elements != b->n_elements) return INFINITY;
    float *y = tensor_floats(b);
    if (!y) return INFINITY;
    const float *x = a->data;
    double num = 0, den = 0;
    for (uint64_t i = 0; i < a->n_elements; i++) {
        num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        den += (double)x[i] * x[i];
    }
    free(y);
    return sqrt(num / den);
}

/* Every arch x every weight type: structure; F32 statistics; the other types
 * hold the F32 file's weights (same seed) within their quantization error,
 * and are not simply F32 data relabelled (error above a floor). */
static void test_all_archs_and_types(void) {
    /* Windows of a factor ~2 around the expected relative RMS error of an
     * N(0, s^2) row: F16 rounds to 11 significant bits (uniform relative
     * error, rms ~2^-11/sqrt(3) ~ 2.8e-4 at most), BF16 to 8 (~2.3e-3); Q8_0
     * steps of absmax/127 over blocks of 32 (absmax ~2.05 s: rms ~0.0047);
     * Q4_0 steps of absmax/8 (~0.074); Q6_K and Q4_K with their fitted
     * sub-block scales land near 0.018 and 0.07. */
    static const struct { kp_dtype t; double lo, hi; } err_bounds[] = {
        {KP_DTYPE_F16, 1e-4, 4e-4},    {KP_DTYPE_BF16, 8e-4, 3.2e-3}, {KP_DTYPE_Q8_0, 2.5e-3, 0.01},
        {KP_DTYPE_Q4_0, 0.037, 0.15}, {KP_DTYPE_Q4_K, 0.035, 0.14},  {KP_DTYPE_Q6_K, 0.009, 0.036},
        /* Q4_1 steps of range/15 (range ~4.1 s: rms ~0.079), Q5_1 range/31 (~0.038),
         * Q5_0 absmax/16 (~0.043), Q5_K fitted sub-block grids (~0.036) */
        {KP_DTYPE_Q4_1, 0.039, 0.16}, {KP_DTYPE_Q5_1, 0.019, 0.076}, {KP_DTYPE_Q5_0, 0.021, 0.086},
        {KP_DTYPE_Q5_K, 0.018, 0.072},
    };
    static const struct { const char *preset, *tok; } cases[] = {
        {"tiny", STORIES}, {"qwen2-tiny", REF_QWEN2}, {"qwen3-tiny", STORIES}, {"gemma3-tiny", STORIES},
        {"qwen3moe-tiny", STORIES}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kp_mkmodel_spec s = preset(cases[c].preset);
        s.n_layer = 1;
        s.seed = 42 + c;
        if (!strcmp(s.arch, "gemma3")) { /* rows of 256 and more, so the K-quants do not fall back */
            s.n_embd = 256;
            s.n_head = 4;
            s.n_head_kv = 2;
            s.head_dim = 64;
            s.n_ff = 512;
        }
        if (!strcmp(s.arch, "qwen3moe")) { /* the same, for the experts' rows too; 4 experts keep it small */
            s.n_embd = 256;
            s.head_dim = 64;
            s.n_ff_exp = 256;
            s.n_expert = 4;
            s.n_expert_used = 2;
        }
        char f32_path[64];
        if (!write_model(&s, cases[c].tok, f32_path)) continue;
        kp_gguf *f32 = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gguf_open(&f32, f32_path, &err) == KP_OK, "%s", err.msg);
        if (!f32) continue;
        check_structure(f32, &s, cases[c].tok);
        check_f32_statistics(f32, &s);
        for (size_t k = 0; k < sizeof err_bounds / sizeof err_bounds[0]; k++) {
            s.wtype = err_bounds[k].t;
            char path[64];
            if (!write_model(&s, cases[c].tok, path)) continue;
            kp_gguf *g = NULL;
            CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
            if (g) {
                check_structure(g, &s, cases[c].tok);
                for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
                    const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
                    char name[64];
                    snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
                    double e = rel_rms_error(f32, g, name);
                    if (t->type == KP_DTYPE_F32) {
                        CHECK_MSG(e == 0, "%s %s: F32 tensor %s differs (%g)", s.arch,
                                  kp_dtype_name(s.wtype), name, e);
                    } else {
                        CHECK_MSG(e >= err_bounds[k].lo && e <= err_bounds[k].hi,
                                  "%s %s %s: relative error %g not in [%g, %g]", s.arch,
                                  kp_dtype_name(s.wtype), name, e, err_bounds[k].lo,
                                  err_bounds[k].hi);
                    }
                }
                kp_gguf_close(g);
            }
            unlink(path);
        }
        kp_gguf_close(f32);
        unlink(f32_path);
    }
}

/* Norms and biases are vectors, so a normal-sized model holds few of them:
 * a narrow, deep qwen2 gives enough values (~26K norm weights, ~38K biases)
 * to pin their scales to within ~3%. */
static void test_vector_statistics(void) {
    kp_mkmodel_spec s = preset("qwen2-tiny");
    s.n_embd = 32;
    s.n_head = 1;
    s.n_head_kv = 1;
    s.n_ff = 32;
    s.n_layer = 400;
    s.seed = 99;
    char path[64];
    if (write_model(&s, STORIES, path)) {
        kp_gguf *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
        if (g) {
            CHECK_EQ_INT(kp_gguf_n_tensors(g), 2 + 12 * 400);
            check_f32_statistics(g, &s);
            kp_gguf_close(g);
        }
    }
    unlink(path);
}

static bool files_equal(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = harness_read_file(a, &na), *y = harness_read_file(b, &nb);
    bool eq = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

static void test_determinism(void) {
    kp_mkmodel_spec s = preset("tiny");
    s.n_layer = 1;
    s.wtype = KP_DTYPE_Q8_0;
    s.seed = 7;
    char p1[64], p2[64], p3[64];
    bool ok = write_model(&s, STORIES, p1) && write_model(&s, STORIES, p2);
    s.seed = 8;
    ok = write_model(&s, STORIES, p3) && ok;
    if (ok) {
        CHECK_MSG(files_equal(p1, p2), "same seed, different bytes");
        CHECK_MSG(!files_equal(p1, p3), "different seeds, same bytes");
        /* only the data differs: same size, same header */
        size_t n1 = 0, n3 = 0;
        char *a = harness_read_file(p1, &n1), *b = harness_read_file(p3, &n3);
        CHECK(a && b && n1 == n3);
        kp_gguf *g = NULL;
        if (a && b && kp_gguf_open(&g, p1, NULL) == KP_OK) {
            CHECK(memcmp(a, b, kp_gguf_data_offset(g)) == 0);
            kp_gguf_close(g);
        }
        free(a);
        free(b);
    }
    unlink(p1);
    unlink(p2);
    unlink(p3);
}

/* A non-default alignment: general.alignment is written and every offset honours it. */
static void test_alignment(void) {
    kp_mkmodel_spec s = preset("qwen2-tiny");
    s.n_layer = 1;
    s.alignment = 256;
    s.wtype = KP_DTYPE_Q4_0;
    char path[64];
    if (write_model(&s, STORIES, path)) {
        kp_gguf *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
        if (g) {
            CHECK_EQ_INT(get_u32(g, "general.alignment"), 256);
            check_structure(g, &s, STORIES);
            kp_gguf_close(g);
        }
    }
    unlink(path);
}

/* Compares a model generated with `s` (tokenizer from `tok`) with a
 * reference file made by llama.cpp's tools for the same spec: every key of
 * the reference is ours with the same value, ours has exactly the keys in
 * `only_mine` besides (tokenizer.* keys are left out of both sides when
 * skip_tokenizer), and the tensor infos (name, dims, type) are the same;
 * with same_order also in the same order at the same offsets. Returns the
 * generated file's path (caller unlinks) or "" in *path. */
static void compare_to_reference(const kp_mkmodel_spec *s, const char *tok, const char *ref_path,
                                 const char *const *only_mine, size_t n_only_mine,
                                 bool skip_tokenizer, bool same_order, char path[64]) {
    kp_error err = {0};
    kp_gguf *ref = NULL, *g = NULL;
    CHECK_MSG(kp_gguf_open(&ref, harness_path(ref_path), &err) == KP_OK, "%s", err.msg);
    if (!write_model(s, tok, path)) path[0] = 0;
    CHECK_MSG(!path[0] || kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
    if (!ref || !g) goto out;
    check_structure(g, s, tok);
    size_t n_ref = 0, n_mine = 0;
    for (size_t i = 0; i < kp_gguf_n_kv(ref); i++) {
        const kp_gguf_kv *kv = kp_gguf_kv_at(ref, i);
        if (skip_tokenizer && key_has_prefix(kv->key, "tokenizer.")) continue;
        n_ref++;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)kv->key.len, kv->key.data);
        const kp_gguf_kv *mine = kp_gguf_find(g, name);
        CHECK_MSG(mine && value_eq(&mine->value, &kv->value), "%s: reference key %s", ref_path,
                  name);
    }
    for (size_t i = 0; i < kp_gguf_n_kv(g); i++)
        n_mine += !(skip_tokenizer && key_has_prefix(kp_gguf_kv_at(g, i)->key, "tokenizer."));
    CHECK_MSG(n_mine == n_ref + n_only_mine, "%s: %zu keys, reference %zu + %zu", ref_path,
              n_mine, n_ref, n_only_mine);
    for (size_t i = 0; i < n_only_mine; i++)
        CHECK_MSG(kp_gguf_find(g, only_mine[i]) && !kp_gguf_find(ref, only_mine[i]), "%s: key %s",
                  ref_path, only_mine[i]);
    CHECK_EQ_INT(kp_gguf_n_tensors(g), kp_gguf_n_tensors(ref));
    for (size_t i = 0; i < kp_gguf_n_tensors(ref); i++) {
        const kp_gguf_tensor *b = kp_gguf_tensor_at(ref, i);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)b->name.len, b->name.data);
        const kp_gguf_tensor *a = same_order ? kp_gguf_tensor_at(g, i) : kp_gguf_find_tensor(g, name);
        CHECK_MSG(a && a->name.len == b->name.len &&
                      memcmp(a->name.data, b->name.data, a->name.len) == 0 &&
                      a->n_dims == b->n_dims && a->type == b->type &&
                      memcmp(a->ne, b->ne, sizeof a->ne) == 0 &&
                      (!same_order || a->offset == b->offset),
                  "%s: tensor %zu %s", ref_path, i, name);
    }
out:
    kp_gguf_close(g);
    kp_gguf_close(ref);
}

/* The shipped reference models' specs (models/gen/README.md). */
static void test_reference_models(void) {
    kp_mkmodel_spec s;
    memset(&s, 0, sizeof s);
    s.arch = "llama";
    s.n_layer = 4;
    s.n_embd = 256;
    s.n_head = 8;
    s.n_head_kv = 2;
    s.n_ff = 768;
    s.n_ctx = 4096;
    s.rope_base = 10000.0f;
    s.rms_eps = 1e-5f;
    s.tied = false;
    s.wtype = KP_DTYPE_F32;
    s.seed = 1001;
    s.name = "gen-llama-gqa";
    char path[64];

    /* gen-llama-gqa with stories260K's tokenizer: the same keys and tensors.
     * (The tokenizer keys differ by design: the reference's generator added
     * add_bos/add_eos and dropped stories260K's separator and padding ids,
     * while mkmodel copies stories260K's keys verbatim - check_structure
     * checks that.) */
    compare_to_reference(&s, STORIES, REF_GQA, NULL, 0, true, true, path);
    if (path[0]) unlink(path);

    /* With the reference's own tokenizer keys: the whole header is
     * byte-identical to gguf-py's, and the random data is not. */
    compare_to_reference(&s, REF_GQA, REF_GQA, NULL, 0, false, true, path);
    if (path[0]) {
        size_t n1 = 0, n2 = 0;
        char *a = harness_read_file(path, &n1), *b = harness_read_file(harness_path(REF_GQA), &n2);
        kp_gguf *ref = NULL;
        CHECK(kp_gguf_open(&ref, harness_path(REF_GQA), NULL) == KP_OK);
        CHECK_EQ_INT(n1, n2);
        CHECK_MSG(a && b && ref && n1 == n2 && memcmp(a, b, kp_gguf_data_offset(ref)) == 0,
                  "headers differ");
        CHECK(a && b && n1 == n2 && memcmp(a, b, n1) != 0);
        kp_gguf_close(ref);
        free(a);
        free(b);
        unlink(path);
    }

    /* gen-qwen2 (F32, biases, tied) and gen-qwen3 (F16, q/k norms, written by
     * llama-quantize in another tensor order). Their generator did not write
     * rope.dimension_count and vocab_size, which mkmodel always writes. */
    s.arch = "qwen2";
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ctx = 32768;
    s.rope_base = 1e6f;
    s.rms_eps = 1e-6f;
    s.tied = true;
    s.seed = 3003;
    s.name = "gen-qwen2";
    static const char *const qwen2_extra[] = {"qwen2.rope.dimension_count", "qwen2.vocab_size"};
    compare_to_reference(&s, REF_QWEN2, REF_QWEN2, qwen2_extra, 2, false, true, path);
    if (path[0]) unlink(path);

    s.arch = "qwen3";
    s.head_dim = 64;
    s.wtype = KP_DTYPE_F16;
    s.seed = 4004;
    s.name = "gen-qwen3";
    static const char *const qwen3_extra[] = {"qwen3.rope.dimension_count", "qwen3.vocab_size"};
    compare_to_reference(&s, REF_QWEN3, REF_QWEN3, qwen3_extra, 2, false, false, path);
    if (path[0]) unlink(path);
}

static void test_refusals(void) {
    kp_error err = {0};
    char path[64];
    tmp_path(path);
    unlink(path);
    /* types mkmodel does not write: refused, nothing written, the report left empty */
    kp_mkmodel_spec s = preset("tiny");
    const kp_dtype unwritable[] = {KP_DTYPE_Q2_K, KP_DTYPE_Q3_K, KP_DTYPE_Q8_K, KP_DTYPE_Q8_1,
                                   KP_DTYPE_IQ4_NL};
    for (size_t i = 0; i < sizeof unwritable / sizeof unwritable[0]; i++) {
        s.wtype = unwritable[i];
        kp_mkmodel_report rep;
        memset(&rep, 0xAB, sizeof rep); /* garbage in: overwritten, never freed */
        CHECK_EQ_INT(kp_mkmodel_write(&s, harness_path(STORIES), path, &rep, &err), KP_EUNSUPPORTED);
        CHECK_MSG(strstr(err.msg, kp_dtype_name(unwritable[i])) && strstr(err.msg, "Q5_K"), "%s", err.msg);
        CHECK(rep.n_weights == 0 && rep.n_fallback == 0 && rep.fallback == NULL);
        CHECK(!file_exists(path));
        CHECK_EQ_INT(kp_mkmodel_weight_type(unwritable[i], 256), KP_DTYPE_COUNT_);
    }
    s = preset("tiny");
    s.wtype = KP_DTYPE_F32;
    s.arch = "gpt2";
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EUNSUPPORTED);
    s.arch = "llama";
    s.n_head_kv = 3;
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.n_head_kv = 2;
    s.head_dim = 7;
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.head_dim = 0;
    s.alignment = 24;
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.alignment = 0;
    s.n_swa = 16; /* a sliding window is gemma3's */
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.n_swa = 0;
    s.swa_pattern = 3;
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.swa_pattern = 0;
    s.n_expert = 8; /* experts are qwen3moe's */
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.n_expert = 0;
    kp_mkmodel_spec moe = preset("qwen3moe-tiny");
    CHECK_EQ_INT(kp_mkmodel_validate(&moe, 512, &err), KP_OK);
    moe.n_expert_used = 9; /* more experts used than there are */
    CHECK_EQ_INT(kp_mkmodel_validate(&moe, 512, &err), KP_EINVAL);
    CHECK_MSG(strstr(err.msg, "experts used (9)") != NULL, "%s", err.msg);
    moe.n_expert_used = 0;
    CHECK_EQ_INT(kp_mkmodel_validate(&moe, 512, &err), KP_EINVAL);
    moe.n_expert_used = 3;
    moe.n_ff_exp = 0;
    CHECK_EQ_INT(kp_mkmodel_validate(&moe, 512, &err), KP_EINVAL);
    moe.n_ff_exp = 64;
    moe.n_expert = 1025;
    CHECK_EQ_INT(kp_mkmodel_validate(&moe, 512, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 0, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_OK);
    CHECK_EQ_INT(kp_mkmodel_spec_preset("nope", &s, &err), KP_ENOTFOUND);
    CHECK(!file_exists(path));

    /* unwritable outputs fail cleanly */
    s = preset("tiny");
    s.n_layer = 1;
    CHECK_EQ_INT(kp_mkmodel_write(&s, harness_path(STORIES), "/nonexistent-kvpin-dir/m.gguf", NULL, &err),
                 KP_EIO);
    CHECK(strstr(err.msg, "/nonexistent-kvpin-dir/m.gguf") != NULL);
    if (file_exists("/dev/full")) {
        kp_mkmodel_report rep;
        s.n_embd = 80; /* with fallbacks (to F16), which the failed write must not report */
        s.n_head = 2;
        s.n_head_kv = 1;
        s.wtype = KP_DTYPE_Q4_0;
        CHECK_EQ_INT(kp_mkmodel_write(&s, harness_path(STORIES), "/dev/full", &rep, &err), KP_EIO);
        CHECK_MSG(strstr(err.msg, "space") != NULL, "%s", err.msg);
        CHECK(rep.n_weights == 0 && rep.n_fallback == 0 && rep.fallback == NULL);
        s = preset("tiny");
        s.n_layer = 1;
    }
    /* a missing tokenizer file, and one without tokens */
    CHECK_EQ_INT(kp_mkmodel_write(&s, "/nonexistent-kvpin-dir/tok.gguf", path, NULL, &err), KP_EIO);
    CHECK(!file_exists(path));
    char notok[64];
    tmp_path(notok);
    kp_gguf_w *w = NULL;
    if (kp_gguf_w_new(&w, &err) == KP_OK) {
        CHECK(kp_gguf_w_add_str(w, "general.architecture", "llama", &err) == KP_OK);
        CHECK(kp_gguf_w_begin(w, notok, &err) == KP_OK);
        CHECK(kp_gguf_w_finish(w, &err) == KP_OK);
        kp_gguf_w_free(w);
    }
    CHECK_EQ_INT(kp_mkmodel_write(&s, notok, path, NULL, &err), KP_EFORMAT);
    CHECK(strstr(err.msg, "tokenizer.ggml.tokens") != NULL);
    CHECK(!file_exists(path));
    unlink(notok);
}

/* ---- llama-quantize's fallback for row lengths a type cannot encode ---- */

#define LLAMA_QUANTIZE_REF "tests/data/quant_more/llama-quantize.txt"

/* The rule itself, case by case as llama.cpp's tensor_type_fallback
 * (src/llama-quant.cpp) decides it. */
static void test_weight_type_rule(void) {
    static const struct { kp_dtype want, t; int64_t n; } cases[] = {
        {KP_DTYPE_Q4_K, KP_DTYPE_Q4_K, 1536}, {KP_DTYPE_Q5_0, KP_DTYPE_Q4_K, 576},
        {KP_DTYPE_Q5_1, KP_DTYPE_Q5_K, 576},  {KP_DTYPE_Q8_0, KP_DTYPE_Q6_K, 576},
        {KP_DTYPE_F16, KP_DTYPE_Q4_K, 80},    {KP_DTYPE_F16, KP_DTYPE_Q5_K, 80},
        {KP_DTYPE_F16, KP_DTYPE_Q6_K, 100},   {KP_DTYPE_F16, KP_DTYPE_Q8_0, 80},
        {KP_DTYPE_F16, KP_DTYPE_Q4_0, 48},    {KP_DTYPE_F16, KP_DTYPE_Q4_1, 16},
        {KP_DTYPE_F16, KP_DTYPE_Q5_0, 1},     {KP_DTYPE_F16, KP_DTYPE_Q5_1, 33},
        {KP_DTYPE_Q5_0, KP_DTYPE_Q5_0, 96},   {KP_DTYPE_Q8_0, KP_DTYPE_Q8_0, 32},
        {KP_DTYPE_F32, KP_DTYPE_F32, 7},      {KP_DTYPE_F16, KP_DTYPE_F16, 7},
        {KP_DTYPE_BF16, KP_DTYPE_BF16, 7},    {KP_DTYPE_Q6_K, KP_DTYPE_Q6_K, 256},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_MSG(kp_mkmodel_weight_type(cases[i].t, cases[i].n) == cases[i].want, "%s rows of %lld: %s, want %s",
                  kp_dtype_name(cases[i].t), (long long)cases[i].n,
                  kp_dtype_name(kp_mkmodel_weight_type(cases[i].t, cases[i].n)), kp_dtype_name(cases[i].want));
}

/* The specs of the models in llama-quantize.txt (tests/data/quant_more/README.md). */
static bool ref_case_spec(const char *name, kp_mkmodel_spec *s) {
    if (strcmp(name, "smollm2-1l") == 0) {
        *s = preset("smollm2-135m");
        s->n_layer = 1;
        s->seed = 11;
        return true;
    }
    if (strcmp(name, "odd-80") == 0) {
        *s = preset("tiny");
        s->n_layer = 1;
        s->n_embd = 80;
        s->n_head = 2;
        s->n_head_kv = 1;
        s->n_ff = 256;
        s->seed = 12;
        return true;
    }
    return false;
}

static uint64_t fnv1a64(const void *data, uint64_t n) {
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/*
 * One section of llama-quantize.txt: llama.cpp's llama_model_quantize
 * (llama-quantize --pure's parameters, ftype `ftype`) applied to the F32
 * model of `name`. mkmodel with the matching --type must write the same
 * general.file_type and, tensor by tensor, the same type and the same bytes
 * (FNV-1a of the data), and report exactly the tensors that fell back.
 */
static void check_against_llama_quantize(const char *name, int ftype, char **lines, size_t n_lines) {
    kp_mkmodel_spec s;
    CHECK_MSG(ref_case_spec(name, &s), "unknown reference model %s", name);
    if (!ref_case_spec(name, &s)) return;
    s.wtype = KP_DTYPE_COUNT_;
    for (uint32_t t = 0; t < KP_DTYPE_COUNT_; t++)
        if (kp_dtype_get(t) && kp_mkmodel_file_type((kp_dtype)t) == ftype) s.wtype = (kp_dtype)t;
    CHECK_MSG(s.wtype != KP_DTYPE_COUNT_, "ftype %d", ftype);
    if (s.wtype == KP_DTYPE_COUNT_) return;
    char path[64];
    tmp_path(path);
    kp_error err = {0};
    kp_mkmodel_report rep;
    kp_status st = kp_mkmodel_write(&s, harness_path(STORIES), path, &rep, &err);
    CHECK_MSG(st == KP_OK, "%s %s: %s", name, kp_dtype_name(s.wtype), err.msg);
    kp_gguf *g = NULL;
    if (st == KP_OK) CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
    if (!g) {
        unlink(path);
        return;
    }
    int bad = 0, n_ref_fallback = 0;
    size_t n_tensors = 0;
    for (size_t i = 0; i < n_lines; i++) {
        char tname[96], ttype[16], hash[32];
        unsigned long long bytes = 0;
        int ft = -2;
        if (sscanf(lines[i], "general.file_type %d", &ft) == 1) {
            CHECK_MSG((int)get_u32(g, "general.file_type") == ft, "%s ftype %d: general.file_type %u", name,
                      ftype, get_u32(g, "general.file_type"));
            continue;
        }
        if (sscanf(lines[i], "%95s %15s %llu %31s", tname, ttype, &bytes, hash) != 4) {
            CHECK_MSG(0, "bad line in %s: %s", LLAMA_QUANTIZE_REF, lines[i]);
            continue;
        }
        n_tensors++;
        const bool fell_back = strcasecmp(ttype, kp_dtype_name(s.wtype)) != 0 && strcasecmp(ttype, "f32") != 0;
        n_ref_fallback += fell_back;
        const kp_gguf_tensor *t = kp_gguf_find_tensor(g, tname);
        char mine[32] = "";
        if (t) snprintf(mine, sizeof mine, "%016llx", (unsigned long long)fnv1a64(t->data, t->n_bytes));
        const bool ok = t && strcasecmp(kp_dtype_name(t->type), ttype) == 0 && t->n_bytes == bytes &&
                        strcmp(mine, hash) == 0;
        if (!ok && bad++ < 4)
            fprintf(stderr, "%s ftype %d: %s: llama-quantize wrote %s, %llu bytes, %s; mkmodel %s, %llu bytes, %s\n",
                    name, ftype, tname, ttype, bytes, hash, t ? kp_dtype_name(t->type) : "nothing",
                    t ? (unsigned long long)t->n_bytes : 0ull, mine);
        /* the report names exactly these tensors, with these types */
        bool listed = false;
        for (size_t k = 0; k < rep.n_fallback; k++)
            if (strcmp(rep.fallback[k].tensor, tname) == 0)
                listed = strcasecmp(kp_dtype_name(rep.fallback[k].type), ttype) == 0 && t &&
                         rep.fallback[k].row_len == t->ne[0];
        CHECK_MSG(listed == fell_back, "%s %s: %s %s in the report", name, kp_dtype_name(s.wtype), tname,
                  fell_back ? "missing" : "wrongly");
    }
    CHECK_MSG(bad == 0, "%s ftype %d: %d tensors differ from llama-quantize's%s", name, ftype, bad,
              ftype == 0 ? " (the F32 source: mkmodel's weights changed; rerun tests/data/quant_more/make.sh)" : "");
    CHECK_EQ_INT(kp_gguf_n_tensors(g), n_tensors);
    CHECK_EQ_INT(rep.n_fallback, n_ref_fallback);
    CHECK_EQ_INT(rep.n_weights, 7 * s.n_layer + 1 + !s.tied);
    printf("mkmodel: %s as %s: %zu tensors, %d equal to llama-quantize's, %zu fell back\n", name,
           kp_dtype_name(s.wtype), n_tensors, (int)n_tensors - bad, rep.n_fallback);
    kp_mkmodel_report_clear(&rep);
    CHECK(rep.fallback == NULL && rep.n_fallback == 0);
    kp_gguf_close(g);
    unlink(path);
}

static void test_matches_llama_quantize(void) {
    size_t len = 0;
    char *text = harness_read_file(harness_path(LLAMA_QUANTIZE_REF), &len);
    CHECK_MSG(text != NULL, "cannot read %s", LLAMA_QUANTIZE_REF);
    if (!text) return;
    enum { MAX_LINES = 64 };
    char *lines[MAX_LINES];
    size_t n_lines = 0, n_sections = 0;
    char name[64] = "";
    int ftype = -1;
    for (char *line = strtok(text, "\n");; line = strtok(NULL, "\n")) {
        char nm[64];
        int ft;
        const bool header = line && sscanf(line, "model %63s ftype %d", nm, &ft) == 2;
        if (!line || header) {
            if (name[0]) {
                check_against_llama_quantize(name, ftype, lines, n_lines);
                n_sections++;
            }
            if (!line) break;
            snprintf(name, sizeof name, "%s", nm);
            ftype = ft;
            n_lines = 0;
        } else if (n_lines < MAX_LINES) {
            lines[n_lines++] = line;
        }
    }
    CHECK_EQ_INT(n_sections, 10);
    free(text);
}

/* SmolLM2-135M's shape in Q4_K, as `kvpin mkmodel --preset smollm2-135m --type Q4_K`
 * writes it: the 576-wide weights fall back to Q5_0, ffn_down (rows of 1536) stays
 * Q4_K, general.file_type says Q4_K_M, and the report lists the fallbacks. */
static void test_smollm2_q4_k(void) {
    kp_mkmodel_spec s = preset("smollm2-135m");
    CHECK_EQ_INT(s.n_layer, 30);
    CHECK_EQ_INT(s.n_embd, 576);
    CHECK(s.tied);
    s.n_layer = 2; /* enough to see the pattern repeat */
    s.wtype = KP_DTYPE_Q4_K;
    char path[64];
    tmp_path(path);
    kp_error err = {0};
    kp_mkmodel_report rep;
    CHECK_MSG(kp_mkmodel_write(&s, harness_path(STORIES), path, &rep, &err) == KP_OK, "%s", err.msg);
    CHECK_EQ_INT(rep.n_weights, 1 + 7 * 2);
    CHECK_EQ_INT(rep.n_fallback, 1 + 6 * 2);
    for (size_t i = 0; i < rep.n_fallback; i++) {
        CHECK_MSG(rep.fallback[i].type == KP_DTYPE_Q5_0 && rep.fallback[i].row_len == 576 &&
                      !strstr(rep.fallback[i].tensor, "ffn_down"),
                  "%s", rep.fallback[i].tensor);
    }
    CHECK(rep.n_fallback > 0 && strcmp(rep.fallback[0].tensor, "token_embd.weight") == 0);
    kp_gguf *g = NULL;
    CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
    if (g) {
        CHECK_EQ_INT(get_u32(g, "general.file_type"), 15);
        for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
            const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
            const uint32_t want = t->n_dims == 1 ? KP_DTYPE_F32 : t->ne[0] == 576 ? KP_DTYPE_Q5_0 : KP_DTYPE_Q4_K;
            CHECK_MSG(t->type == want, "%.*s: %s", (int)t->name.len, t->name.data, kp_dtype_name(t->type));
        }
        kp_gguf_close(g);
    }
    kp_mkmodel_report_clear(&rep);
    kp_mkmodel_report_clear(NULL);
    unlink(path);
}

/* qwen35 files: llama.cpp's keys (the delta-net sizes, the interval, the
 * IMROPE sections), its tensors (gated q twice as wide, the delta-net
 * tensors in recurrent layers, post_attention_norm as the FFN norm), and
 * under Q8_0 the convolution kept F32 as llama-quantize keeps it; the
 * refusals of shapes llama.cpp could not load. */
static void test_qwen35_files(void) {
    static const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_Q8_0};
    for (size_t ti = 0; ti < 2; ti++) {
        kp_mkmodel_spec s = preset("qwen35-tiny");
        s.wtype = types[ti];
        char path[64];
        if (!write_model(&s, STORIES, path)) continue;
        kp_gguf *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
        if (!g) continue;
        CHECK(str_is(g, "general.architecture", "qwen35"));
        CHECK_EQ_INT(get_u32(g, "qwen35.ssm.conv_kernel"), 4);
        CHECK_EQ_INT(get_u32(g, "qwen35.ssm.state_size"), 16);
        CHECK_EQ_INT(get_u32(g, "qwen35.ssm.group_count"), 2);
        CHECK_EQ_INT(get_u32(g, "qwen35.ssm.time_step_rank"), 4);
        CHECK_EQ_INT(get_u32(g, "qwen35.ssm.inner_size"), 64);
        CHECK_EQ_INT(get_u32(g, "qwen35.full_attention_interval"), 4);
        CHECK_EQ_INT(get_u32(g, "qwen35.rope.dimension_count"), 8);
        const kp_gguf_kv *sec = kp_gguf_find(g, "qwen35.rope.dimension_sections");
        CHECK(sec && sec->value.type == KP_GGUF_TYPE_ARRAY && sec->value.v.arr.elem_type == KP_GGUF_TYPE_INT32 &&
              sec->value.v.arr.n == 4);
        if (sec && sec->value.v.arr.n == 4)
            CHECK(kp_gguf_arr_i64(&sec->value, 0) == 2 && kp_gguf_arr_i64(&sec->value, 1) == 1 &&
                  kp_gguf_arr_i64(&sec->value, 2) == 1 && kp_gguf_arr_i64(&sec->value, 3) == 0);
        bool q8 = types[ti] == KP_DTYPE_Q8_0;
        static const struct { const char *name; bool matrix; int64_t ne0, ne1; } want[] = {
            {"blk.0.attn_qkv.weight", true, 64, 128},   {"blk.0.attn_gate.weight", true, 64, 64},
            {"blk.0.ssm_conv1d.weight", false, 4, 128}, {"blk.0.ssm_dt.bias", false, 4, 1},
            {"blk.0.ssm_a", false, 4, 1},               {"blk.0.ssm_beta.weight", true, 64, 4},
            {"blk.0.ssm_alpha.weight", true, 64, 4},    {"blk.0.ssm_norm.weight", false, 16, 1},
            {"blk.0.ssm_out.weight", true, 64, 64},     {"blk.0.post_attention_norm.weight", false, 64, 1},
            {"blk.3.attn_q.weight", true, 64, 256},     {"blk.3.attn_k.weight", true, 64, 64},
            {"blk.3.attn_q_norm.weight", false, 32, 1}, {"blk.3.attn_output.weight", true, 128, 64},
            {"blk.7.ffn_down.weight", true, 128, 64},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const kp_gguf_tensor *t = kp_gguf_find_tensor(g, want[i].name);
            CHECK_MSG(t != NULL, "%s missing", want[i].name);
            if (!t) continue;
            kp_dtype expect = want[i].matrix && q8 ? KP_DTYPE_Q8_0 : KP_DTYPE_F32;
            CHECK_MSG(t->type == (uint32_t)expect && t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1,
                      "%s: %s [%lld, %lld]", want[i].name, kp_dtype_name(t->type), (long long)t->ne[0],
                      (long long)t->ne[1]);
        }
        for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) { /* the decays are negative */
            const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
            if (t->name.len > 6 && !memcmp(t->name.data + t->name.len - 6, ".ssm_a", 6))
                for (int64_t k = 0; k < t->ne[0]; k++) CHECK(((const float *)t->data)[k] < 0);
        }
        CHECK(kp_gguf_find_tensor(g, "blk.0.attn_q.weight") == NULL);
        CHECK(kp_gguf_find_tensor(g, "blk.3.attn_qkv.weight") == NULL);
        CHECK(kp_gguf_find_tensor(g, "blk.3.ffn_norm.weight") == NULL);
        kp_gguf_close(g);
        unlink(path);
    }
    kp_error err = {0};
    kp_mkmodel_spec s = preset("qwen35-0.8b"); /* Qwen3.5-0.8B's config.json, 8 of its 24 layers */
    CHECK(s.n_layer == 8 && s.n_embd == 1024 && s.n_head == 8 && s.n_head_kv == 2 && s.head_dim == 256);
    CHECK(s.n_rot == 64 && s.ssm_d_state == 128 && s.ssm_n_group == 16 && s.ssm_dt_rank == 16 && s.tied);
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_OK);
    s = preset("qwen35-4b"); /* Qwen3.5-4B's hidden, heads and FFN (its Megatron arguments), 8 of 32 layers */
    CHECK(s.n_layer == 8 && s.n_embd == 2560 && s.n_head == 16 && s.n_head_kv == 4 && s.head_dim == 256 &&
          s.n_ff == 9216 && s.n_rot == 64 && s.ssm_n_group == 16 && s.ssm_dt_rank == 32);
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_OK);
    s = preset("qwen35-tiny");
    s.ssm_dt_rank = 3; /* not a multiple of the 2 q/k heads */
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_EINVAL && strstr(err.msg, "qwen35"));
    s = preset("qwen35-tiny");
    s.full_attn_interval = 9; /* no attention layer in 8 */
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_EINVAL);
    s = preset("tiny");
    s.ssm_d_state = 16; /* delta-net sizes on llama */
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_EINVAL && strstr(err.msg, "qwen35"));
}

/* qwen35moe files: qwen35's keys and layers with llama.cpp's expert keys
 * (expert_shared_feed_forward_length too); in every layer, recurrent or
 * not, the router (F32), the 3-D experts and the shared expert, its gate a
 * 1-D F32 vector; under MXFP4 the experts MXFP4 and every other matrix
 * Q8_0 (none reported as a fallback); the refusals. */
static void test_qwen35moe_files(void) {
    static const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_Q8_0, KP_DTYPE_MXFP4};
    for (size_t ti = 0; ti < 3; ti++) {
        kp_mkmodel_spec s = preset("qwen35moe-tiny");
        s.wtype = types[ti];
        char path[64];
        tmp_path(path);
        kp_error err = {0};
        kp_mkmodel_report rep;
        kp_status st = kp_mkmodel_write(&s, harness_path(STORIES), path, &rep, &err);
        CHECK_MSG(st == KP_OK, "%s", err.msg);
        if (st != KP_OK) continue;
        CHECK_EQ_INT(rep.n_fallback, 0);
        kp_mkmodel_report_clear(&rep);
        kp_gguf *g = NULL;
        CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
        if (!g) continue;
        CHECK(str_is(g, "general.architecture", "qwen35moe"));
        CHECK_EQ_INT(get_u32(g, "qwen35moe.expert_count"), 8);
        CHECK_EQ_INT(get_u32(g, "qwen35moe.expert_used_count"), 3);
        CHECK_EQ_INT(get_u32(g, "qwen35moe.expert_feed_forward_length"), 32);
        CHECK_EQ_INT(get_u32(g, "qwen35moe.expert_shared_feed_forward_length"), 32);
        CHECK_EQ_INT(get_u32(g, "qwen35moe.ssm.time_step_rank"), 4);
        CHECK_EQ_INT(get_u32(g, "qwen35moe.full_attention_interval"), 4);
        CHECK(kp_gguf_find(g, "qwen35moe.rope.dimension_sections") != NULL);
        kp_dtype W = types[ti] == KP_DTYPE_MXFP4 ? KP_DTYPE_Q8_0 : types[ti];
        static const struct { const char *name; int kind; int64_t ne0, ne1, ne2; } want[] = {
            /* kind: 0 F32, 1 a matrix (W), 2 experts (the spec's type) */
            {"blk.0.attn_qkv.weight", 1, 64, 128, 1},          {"blk.0.ffn_gate_inp.weight", 0, 64, 8, 1},
            {"blk.0.ffn_gate_exps.weight", 2, 64, 32, 8},      {"blk.0.ffn_down_exps.weight", 2, 32, 64, 8},
            {"blk.0.ffn_gate_inp_shexp.weight", 0, 64, 1, 1},  {"blk.0.ffn_gate_shexp.weight", 1, 64, 32, 1},
            {"blk.0.ffn_up_shexp.weight", 1, 64, 32, 1},       {"blk.0.ffn_down_shexp.weight", 1, 32, 64, 1},
            {"blk.3.attn_q.weight", 1, 64, 256, 1},            {"blk.3.ffn_up_exps.weight", 2, 64, 32, 8},
            {"blk.7.ffn_down_shexp.weight", 1, 32, 64, 1},     {"output.weight", 1, 64, 512, 1},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const kp_gguf_tensor *t = kp_gguf_find_tensor(g, want[i].name);
            CHECK_MSG(t != NULL, "%s missing", want[i].name);
            if (!t) continue;
            kp_dtype expect = want[i].kind == 0 ? KP_DTYPE_F32 : want[i].kind == 1 ? W : types[ti];
            CHECK_MSG(t->type == (uint32_t)expect && t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1 &&
                          t->ne[2] == want[i].ne2,
                      "%s %s: %s [%lld, %lld, %lld]", kp_dtype_name(types[ti]), want[i].name, kp_dtype_name(t->type),
                      (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2]);
        }
        CHECK(kp_gguf_find_tensor(g, "blk.0.ffn_gate.weight") == NULL);
        CHECK(kp_gguf_find_tensor(g, "blk.3.ffn_gate.weight") == NULL);
        kp_gguf_close(g);
        unlink(path);
    }
    kp_error err = {0};
    kp_mkmodel_spec s = preset("qwen35moe-35b-a3b"); /* Qwen3.5-35B-A3B's shape, 8 of its 40 layers */
    CHECK(s.n_layer == 8 && s.n_embd == 2048 && s.n_head == 16 && s.n_head_kv == 2 && s.head_dim == 256);
    CHECK(s.n_rot == 64 && s.n_expert == 256 && s.n_expert_used == 8 && s.n_ff_exp == 512 && s.n_ff_shexp == 512);
    CHECK(s.ssm_d_state == 128 && s.ssm_n_group == 16 && s.ssm_dt_rank == 32 && !s.tied);
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_OK);
    s = preset("qwen35moe-tiny");
    s.n_expert = 0; /* qwen35moe has experts */
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_EINVAL && strstr(err.msg, "qwen35moe"));
    s = preset("qwen35moe-tiny");
    s.ssm_d_conv = 0; /* and the delta-net */
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_EINVAL && strstr(err.msg, "qwen35moe"));
    s = preset("qwen3moe-tiny");
    s.n_ff_shexp = 64; /* a shared expert is qwen35moe's */
    CHECK(kp_mkmodel_validate(&s, 512, &err) == KP_EINVAL && strstr(err.msg, "shared expert"));
}

/* gpt-oss files: llama.cpp's keys (the window, the experts, YaRN), its
 * tensors (biases, sinks, post_attention_norm as the FFN norm, no
 * ffn_norm), and --type MXFP4 as llama-quantize's MXFP4_MOE writes a file:
 * the experts MXFP4, every other matrix Q8_0, the router and the biases
 * F32, file type 38. */
static void test_gptoss_files(void) {
    static const kp_dtype types[] = {KP_DTYPE_F32, KP_DTYPE_MXFP4};
    for (size_t ti = 0; ti < 2; ti++) {
        kp_mkmodel_spec s = preset("gpt-oss-tiny");
        s.wtype = types[ti];
        char path[64];
        if (!write_model(&s, STORIES, path)) continue;
        kp_gguf *g = NULL;
        kp_error err = {0};
        CHECK_MSG(kp_gguf_open(&g, path, &err) == KP_OK, "%s", err.msg);
        if (!g) continue;
        CHECK(str_is(g, "general.architecture", "gpt-oss"));
        CHECK_EQ_INT(get_u32(g, "gpt-oss.attention.sliding_window"), 16);
        CHECK(kp_gguf_find(g, "gpt-oss.attention.sliding_window_pattern") == NULL); /* llama.cpp's 2 */
        CHECK_EQ_INT(get_u32(g, "gpt-oss.expert_count"), 8);
        CHECK_EQ_INT(get_u32(g, "gpt-oss.expert_used_count"), 4);
        CHECK_EQ_INT(get_u32(g, "gpt-oss.expert_feed_forward_length"), 64);
        CHECK(str_is(g, "gpt-oss.rope.scaling.type", "yarn"));
        CHECK(get_f32(g, "gpt-oss.rope.scaling.factor") == 32.0f);
        CHECK_EQ_INT(get_u32(g, "gpt-oss.rope.scaling.original_context_length"), 4096);
        CHECK_EQ_INT(get_u32(g, "gpt-oss.attention.key_length"), 64);
        CHECK_EQ_INT(get_u32(g, "general.file_type"), types[ti] == KP_DTYPE_MXFP4 ? 38 : 0);
        bool mx = types[ti] == KP_DTYPE_MXFP4;
        static const struct { const char *name; int kind; int64_t ne0, ne1, ne2; } want[] = {
            /* kind: 0 F32 vector or bias, 1 a matrix (Q8_0 under MXFP4), 2 an expert tensor, 3 the router */
            {"blk.1.attn_q.bias", 0, 256, 1, 1},        {"blk.1.attn_k.bias", 0, 128, 1, 1},
            {"blk.1.attn_v.bias", 0, 128, 1, 1},        {"blk.1.attn_output.bias", 0, 64, 1, 1},
            {"blk.1.attn_sinks.weight", 0, 4, 1, 1},    {"blk.1.post_attention_norm.weight", 0, 64, 1, 1},
            {"blk.1.ffn_gate_inp.bias", 0, 8, 1, 1},    {"blk.1.ffn_gate_exps.bias", 0, 64, 8, 1},
            {"blk.1.ffn_up_exps.bias", 0, 64, 8, 1},    {"blk.1.ffn_down_exps.bias", 0, 64, 8, 1},
            {"blk.1.attn_q.weight", 1, 64, 256, 1},     {"blk.1.attn_output.weight", 1, 256, 64, 1},
            {"token_embd.weight", 1, 64, 512, 1},       {"output.weight", 1, 64, 512, 1},
            {"blk.1.ffn_gate_inp.weight", 3, 64, 8, 1}, {"blk.1.ffn_gate_exps.weight", 2, 64, 64, 8},
            {"blk.1.ffn_up_exps.weight", 2, 64, 64, 8}, {"blk.1.ffn_down_exps.weight", 2, 64, 64, 8},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const kp_gguf_tensor *t = kp_gguf_find_tensor(g, want[i].name);
            CHECK_MSG(t != NULL, "%s missing", want[i].name);
            if (!t) continue;
            kp_dtype expect = want[i].kind == 0 || want[i].kind == 3 ? KP_DTYPE_F32
                              : !mx                                 ? KP_DTYPE_F32
                              : want[i].kind == 2                   ? KP_DTYPE_MXFP4
                                                                    : KP_DTYPE_Q8_0;
            CHECK_MSG(t->type == (uint32_t)expect && t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1 &&
                          t->ne[2] == want[i].ne2,
                      "%s: %s [%lld, %lld, %lld]", want[i].name, kp_dtype_name(t->type), (long long)t->ne[0],
                      (long long)t->ne[1], (long long)t->ne[2]);
        }
        CHECK(kp_gguf_find_tensor(g, "blk.1.ffn_norm.weight") == NULL);
        CHECK(kp_gguf_find_tensor(g, "blk.1.attn_q_norm.weight") == NULL);
        kp_gguf_close(g);
        unlink(path);
    }
    kp_error err = {0};
    kp_mkmodel_spec s = preset("gpt-oss-20b"); /* gpt-oss-20b's config.json, 8 of its 24 layers */
    CHECK(s.n_layer == 8 && s.n_embd == 2880 && s.n_head == 64 && s.n_head_kv == 8 && s.head_dim == 64);
    CHECK(s.n_expert == 32 && s.n_expert_used == 4 && s.n_ff_exp == 2880 && s.n_swa == 128 && !s.tied);
    CHECK(s.rope_base == 150000.0f && s.yarn_factor == 32.0f && s.yarn_orig_ctx == 4096 && s.n_ctx == 131072);
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_OK);
    s.n_swa = 0; /* llama.cpp requires gpt-oss's window */
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s = preset("tiny");
    s.wtype = KP_DTYPE_MXFP4; /* MXFP4 is for experts */
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.wtype = KP_DTYPE_F32;
    s.yarn_factor = 32.0f; /* YaRN on any architecture, as real llama and qwen files carry it */
    s.yarn_orig_ctx = 4096;
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_OK);
    s.rope_scale_linear = 2.0f; /* one scaling, not both */
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    CHECK(strstr(err.msg, "not both") != NULL);
    s.rope_scale_linear = 0;
    s.yarn_factor = 0.5f; /* a factor below 1 shrinks the context */
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    s.yarn_factor = 4.0f, s.yarn_orig_ctx = 0;
    CHECK_EQ_INT(kp_mkmodel_validate(&s, 512, &err), KP_EINVAL);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_MXFP4), 38);
}

static void test_presets(void) {
    kp_mkmodel_spec s = preset("qwen3-tiny");
    CHECK_EQ_STR(s.arch, "qwen3");
    CHECK_EQ_INT(s.head_dim, 128);
    CHECK(s.head_dim * s.n_head != s.n_embd);
    s = preset("qwen2-tiny");
    CHECK_EQ_STR(s.arch, "qwen2");
    s = preset("tiny");
    CHECK_EQ_STR(s.arch, "llama");
    CHECK(!s.tied);
    s = preset("gemma3-tiny");
    CHECK_EQ_STR(s.arch, "gemma3");
    CHECK(s.n_layer == 6 && s.n_swa == 16 && s.swa_pattern == 0 && s.tied);
    s = preset("gemma3-1b"); /* Gemma 3 1B's config.json */
    CHECK(s.n_layer == 26 && s.n_embd == 1152 && s.n_head == 4 && s.n_head_kv == 1 && s.head_dim == 256);
    CHECK(s.n_ff == 6912 && s.n_swa == 512 && s.rope_base == 1e6f && s.rms_eps == 1e-6f && s.tied);
    s = preset("qwen3moe-tiny");
    CHECK_EQ_STR(s.arch, "qwen3moe");
    CHECK(s.n_layer == 2 && s.n_expert == 8 && s.n_expert_used == 3 && s.n_ff_exp == 64 && !s.tied);
    s = preset("qwen3moe-30b-a3b"); /* Qwen3-30B-A3B's config.json, 8 of its 48 layers */
    CHECK(s.n_layer == 8 && s.n_embd == 2048 && s.n_head == 32 && s.n_head_kv == 4 && s.head_dim == 128);
    CHECK(s.n_ff == 6144 && s.n_expert == 128 && s.n_expert_used == 8 && s.n_ff_exp == 768);
    CHECK(s.rope_base == 1e6f && s.rms_eps == 1e-6f && !s.tied && s.n_ctx == 40960);
    s = preset("smollm2-135m");
    CHECK(s.n_head == 9 && s.n_head_kv == 3 && s.n_ff == 1536 && s.n_ctx == 8192);
    CHECK(s.rope_base == 100000.0f && s.rms_eps == 1e-5f);
    /* llama_ftype values (llama.h) */
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_Q4_K), 15);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_Q5_K), 17);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_Q4_1), 3);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_Q5_0), 8);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_Q5_1), 9);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_BF16), 32);
    CHECK_EQ_INT(kp_mkmodel_file_type(KP_DTYPE_Q2_K), -1);
}

int main(void) {
    RUN(test_writer_roundtrip);
    RUN(test_writer_reproduces_reference);
    RUN(test_writer_stream);
    RUN(test_writer_errors);
    RUN(test_presets);
    RUN(test_refusals);
    RUN(test_weight_type_rule);
    RUN(test_smollm2_q4_k);
    RUN(test_matches_llama_quantize);
    RUN(test_reference_models);
    RUN(test_determinism);
    RUN(test_alignment);
    RUN(test_vector_statistics);
    RUN(test_all_archs_and_types);
    RUN(test_gptoss_files);
    RUN(test_qwen35_files);
    RUN(test_qwen35moe_files);
    return harness_finish("mkmodel");
}
