/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader (src/gguf.c).
 *
 * What it owns: nothing but one input at a time. Each input is parsed with
 * kp_gguf_open_memory() straight from libFuzzer's buffer, which is a heap copy
 * of exactly `size` bytes, so AddressSanitizer flags any read one byte past
 * the end of the file.
 *
 * What it checks, beyond "no sanitizer report":
 *
 *   failure  -> status is KP_EFORMAT, KP_EUNSUPPORTED (version) or
 *               KP_ENOMEM, *out is NULL, and the message is non-empty and
 *               names the input ("fuzz.gguf");
 *   success  -> every KV is walked: scalars read, strings touched at their
 *               first and last byte, arrays recursed into (nesting <= 8),
 *               every fixed-size element read with kp_gguf_arr_i64 and
 *               kp_gguf_arr_f64, every string element touched;
 *            -> every typed lookup (u32, i32, u64, f32, bool, str, arr) is
 *               called on every key and on a few well-known keys, and a
 *               KP_OK answer must agree with the stored value;
 *            -> every tensor: 1..4 dims, n_elements = product of ne,
 *               n_bytes = row size x rows, offset a multiple of the
 *               alignment, data inside [data_offset, size), first and last
 *               byte read; lookup by name returns it; sorted by offset,
 *               no tensor's bytes overlap the next one's;
 *            -> alignment is a power of two and data_offset <= size.
 * A violated property calls __builtin_trap(), which libFuzzer reports as a
 * crash and saves as crash-<sha1>.
 *
 * Build and run: see fuzz/README.md (`make fuzz`, FUZZ_SECONDS=...).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/dtype.h"
#include "gguf/gguf.h"

#define FUZZ_NAME "fuzz.gguf"

/* Keeps reads from being optimised away; a sink, not library state. */
static volatile uint64_t fuzz_sink;

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

static void touch_str(kp_gguf_str s) {
    REQUIRE(s.data != NULL || s.len == 0);
    if (s.len) fuzz_sink += (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1];
}

static void walk_value(const kp_gguf_value *v, int depth) {
    REQUIRE(depth <= 8);
    switch (v->type) {
    case KP_GGUF_TYPE_UINT8: case KP_GGUF_TYPE_UINT16: case KP_GGUF_TYPE_UINT32: case KP_GGUF_TYPE_UINT64:
        fuzz_sink += v->v.u64;
        break;
    case KP_GGUF_TYPE_INT8: case KP_GGUF_TYPE_INT16: case KP_GGUF_TYPE_INT32: case KP_GGUF_TYPE_INT64:
        fuzz_sink += (uint64_t)v->v.i64;
        break;
    case KP_GGUF_TYPE_FLOAT32: case KP_GGUF_TYPE_FLOAT64:
        fuzz_sink += v->v.f64 == v->v.f64;
        break;
    case KP_GGUF_TYPE_BOOL:
        fuzz_sink += v->v.b;
        break;
    case KP_GGUF_TYPE_STRING:
        touch_str(v->v.str);
        break;
    case KP_GGUF_TYPE_ARRAY: {
        kp_gguf_type et = v->v.arr.elem_type;
        REQUIRE((unsigned)et < KP_GGUF_TYPE_COUNT_);
        if (kp_gguf_type_size(et)) {
            REQUIRE(v->v.arr.raw != NULL);
            for (uint64_t i = 0; i < v->v.arr.n; i++) {
                fuzz_sink += (uint64_t)kp_gguf_arr_i64(v, i);
                double d = kp_gguf_arr_f64(v, i);
                fuzz_sink += d == d;
            }
        } else if (et == KP_GGUF_TYPE_STRING) {
            REQUIRE(v->v.arr.strs != NULL || v->v.arr.n == 0);
            for (uint64_t i = 0; i < v->v.arr.n; i++) touch_str(v->v.arr.strs[i]);
        } else {
            REQUIRE(v->v.arr.items != NULL || v->v.arr.n == 0);
            for (uint64_t i = 0; i < v->v.arr.n; i++) {
                REQUIRE(v->v.arr.items[i].type == KP_GGUF_TYPE_ARRAY);
                walk_value(&v->v.arr.items[i], depth + 1);
            }
        }
        break;
    }
    default:
        __builtin_trap();
    }
}

static bool is_uint(kp_gguf_type t) {
    return t == KP_GGUF_TYPE_UINT8 || t == KP_GGUF_TYPE_UINT16 || t == KP_GGUF_TYPE_UINT32 ||
           t == KP_GGUF_TYPE_UINT64;
}
static bool is_sint(kp_gguf_type t) {
    return t == KP_GGUF_TYPE_INT8 || t == KP_GGUF_TYPE_INT16 || t == KP_GGUF_TYPE_INT32 ||
           t == KP_GGUF_TYPE_INT64;
}

/* Calls every typed getter on `key`; a KP_OK answer must match the stored value. */
static void check_getters(const kp_gguf *g, const char *key) {
    kp_error err;
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    bool b;
    kp_gguf_str s;
    const kp_gguf_value *arr;

    memset(&err, 0, sizeof err);
    if (kp_gguf_get_u32(g, key, 7, &u32, &err) == KP_OK) {
        if (!kv) REQUIRE(u32 == 7);
        else if (is_uint(kv->value.type)) REQUIRE(u32 == kv->value.v.u64);
        else REQUIRE(is_sint(kv->value.type) && (int64_t)u32 == kv->value.v.i64);
    } else {
        REQUIRE(kv && err.msg[0] && strstr(err.msg, FUZZ_NAME));
    }
    if (kp_gguf_get_i32(g, key, -7, &i32, &err) == KP_OK) {
        if (!kv) REQUIRE(i32 == -7);
        else if (is_uint(kv->value.type)) REQUIRE((uint64_t)i32 == kv->value.v.u64);
        else REQUIRE(is_sint(kv->value.type) && i32 == kv->value.v.i64);
    } else {
        REQUIRE(kv);
    }
    if (kp_gguf_get_u64(g, key, 7, &u64, &err) == KP_OK) {
        if (!kv) REQUIRE(u64 == 7);
        else if (is_uint(kv->value.type)) REQUIRE(u64 == kv->value.v.u64);
        else REQUIRE(is_sint(kv->value.type) && kv->value.v.i64 >= 0);
    } else {
        REQUIRE(kv);
    }
    if (kp_gguf_get_f32(g, key, 0.5f, &f32, &err) == KP_OK) {
        REQUIRE(!kv || kv->value.type == KP_GGUF_TYPE_FLOAT32 || kv->value.type == KP_GGUF_TYPE_FLOAT64);
        fuzz_sink += f32 == f32;
    } else {
        REQUIRE(kv);
    }
    if (kp_gguf_get_bool(g, key, true, &b, &err) == KP_OK) {
        REQUIRE(!kv || kv->value.type == KP_GGUF_TYPE_BOOL);
        fuzz_sink += b;
    } else {
        REQUIRE(kv);
    }
    if (kp_gguf_get_str(g, key, &s, &err) == KP_OK) {
        REQUIRE(kv ? kv->value.type == KP_GGUF_TYPE_STRING : s.data == NULL && s.len == 0);
        if (kv) touch_str(s);
    } else {
        REQUIRE(kv);
    }
    for (int et = 0; et < KP_GGUF_TYPE_COUNT_; et++) {
        if (kp_gguf_get_arr(g, key, (kp_gguf_type)et, &arr, &err) == KP_OK) {
            REQUIRE(kv ? arr == &kv->value && arr->v.arr.elem_type == (kp_gguf_type)et : arr == NULL);
        } else {
            REQUIRE(kv && arr == NULL);
        }
    }
}

static void check_tensor(const kp_gguf *g, const uint8_t *base, size_t size, const kp_gguf_tensor *t) {
    const kp_dtype_info *ti = kp_dtype_get(t->type);
    uint64_t n_el = 1;
    REQUIRE(ti != NULL);
    REQUIRE(t->n_dims >= 1 && t->n_dims <= KP_GGUF_MAX_DIMS);
    for (int d = 0; d < KP_GGUF_MAX_DIMS; d++) {
        REQUIRE(t->ne[d] >= 1);
        if ((uint32_t)d >= t->n_dims) REQUIRE(t->ne[d] == 1);
        n_el *= (uint64_t)t->ne[d];
    }
    REQUIRE(n_el == t->n_elements);
    REQUIRE(t->ne[0] % ti->block_size == 0);
    REQUIRE(t->n_bytes == t->n_elements / ti->block_size * ti->type_size);
    REQUIRE(t->offset % kp_gguf_alignment(g) == 0);
    const uint8_t *p = t->data;
    REQUIRE(p == base + kp_gguf_data_offset(g) + t->offset);
    REQUIRE(t->n_bytes <= size && (size_t)(p - base) <= size - t->n_bytes);
    fuzz_sink += p[0] + p[t->n_bytes - 1];
}

static int range_cmp(const void *a, const void *b) {
    uint64_t x = ((const uint64_t *)a)[0], y = ((const uint64_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* Tensors' byte ranges [offset, offset + n_bytes) must not overlap. */
static void check_disjoint(const kp_gguf *g) {
    size_t n = kp_gguf_n_tensors(g);
    if (n < 2) return;
    uint64_t(*ranges)[2] = malloc(n * sizeof *ranges);
    if (!ranges) return;
    for (size_t i = 0; i < n; i++) {
        ranges[i][0] = kp_gguf_tensor_at(g, i)->offset;
        ranges[i][1] = kp_gguf_tensor_at(g, i)->n_bytes;
    }
    qsort(ranges, n, sizeof *ranges, range_cmp);
    for (size_t i = 1; i < n; i++) REQUIRE(ranges[i][0] >= ranges[i - 1][0] + ranges[i - 1][1]);
    free(ranges);
}

/* Copies a key or name into a C string; false if it holds a NUL or is too long. */
static bool as_cstr(kp_gguf_str s, char *buf, size_t cap) {
    if (s.len >= cap || (s.len && memchr(s.data, 0, s.len))) return false;
    if (s.len) memcpy(buf, s.data, s.len);
    buf[s.len] = 0;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const common_keys[] = {
        "general.alignment", "general.architecture", "general.name", "llama.block_count",
        "llama.context_length", "llama.embedding_length", "llama.attention.head_count",
        "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base",
        "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.add_bos_token", "absent.key",
    };
    kp_gguf *g = (kp_gguf *)&fuzz_sink; /* must be overwritten with NULL on failure */
    kp_error err;
    char name[256];

    memset(&err, 0, sizeof err);
    kp_status st = kp_gguf_open_memory(&g, data, size, FUZZ_NAME, &err);
    if (st != KP_OK) {
        REQUIRE(g == NULL);
        REQUIRE(st == KP_EFORMAT || st == KP_EUNSUPPORTED || st == KP_ENOMEM);
        REQUIRE(err.code == st && err.msg[0] != 0 && strstr(err.msg, FUZZ_NAME) != NULL);
        return 0;
    }
    REQUIRE(g != NULL);
    uint32_t a = kp_gguf_alignment(g);
    REQUIRE(a != 0 && (a & (a - 1)) == 0);
    REQUIRE(kp_gguf_data_offset(g) <= size);
    REQUIRE(kp_gguf_file_size(g) == size);
    REQUIRE(kp_gguf_version(g) == 2 || kp_gguf_version(g) == 3);

    for (size_t i = 0; i < kp_gguf_n_kv(g); i++) {
        const kp_gguf_kv *kv = kp_gguf_kv_at(g, i);
        REQUIRE(kv != NULL);
        touch_str(kv->key);
        walk_value(&kv->value, 0);
        if (as_cstr(kv->key, name, sizeof name)) {
            REQUIRE(kp_gguf_find(g, name) == kv);
            check_getters(g, name);
        }
    }
    REQUIRE(kp_gguf_kv_at(g, kp_gguf_n_kv(g)) == NULL);
    for (size_t i = 0; i < sizeof common_keys / sizeof common_keys[0]; i++)
        check_getters(g, common_keys[i]);

    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        REQUIRE(t != NULL);
        touch_str(t->name);
        check_tensor(g, data, size, t);
        if (as_cstr(t->name, name, sizeof name)) REQUIRE(kp_gguf_find_tensor(g, name) == t);
    }
    REQUIRE(kp_gguf_tensor_at(g, kp_gguf_n_tensors(g)) == NULL);
    check_disjoint(g);
    kp_gguf_close(g);
    return 0;
}
