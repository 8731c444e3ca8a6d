/*
 * gguf.h - a hardened, read-only GGUF reader (versions 2 and 3).
 *
 * The file is mmap'd once; metadata strings and tensor data are views into
 * that mapping (never copied) and stay valid until kp_gguf_close(). Nothing in
 * a file, however malformed, makes the reader crash or read out of bounds:
 * every problem is reported as KP_EFORMAT / KP_EUNSUPPORTED with a message
 * that names the file and the problem.
 *
 * Typical use:
 *
 *   kp_gguf *g; kp_error err;
 *   if (kp_gguf_open(&g, "model.gguf", &err) != KP_OK) { puts(err.msg); ... }
 *   uint32_t n_layer;
 *   kp_gguf_get_u32(g, "llama.block_count", 0, &n_layer, &err);
 *   const kp_gguf_tensor *t = kp_gguf_find_tensor(g, "token_embd.weight");
 *   ... t->data, t->ne[0], t->type ...
 *   kp_gguf_close(g);
 */
#ifndef KP_GGUF_H
#define KP_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define KP_GGUF_MAX_DIMS 4
#define KP_GGUF_DEFAULT_ALIGNMENT 32

typedef enum {
    KP_GGUF_TYPE_UINT8 = 0,
    KP_GGUF_TYPE_INT8 = 1,
    KP_GGUF_TYPE_UINT16 = 2,
    KP_GGUF_TYPE_INT16 = 3,
    KP_GGUF_TYPE_UINT32 = 4,
    KP_GGUF_TYPE_INT32 = 5,
    KP_GGUF_TYPE_FLOAT32 = 6,
    KP_GGUF_TYPE_BOOL = 7,
    KP_GGUF_TYPE_STRING = 8,
    KP_GGUF_TYPE_ARRAY = 9,
    KP_GGUF_TYPE_UINT64 = 10,
    KP_GGUF_TYPE_INT64 = 11,
    KP_GGUF_TYPE_FLOAT64 = 12,
    KP_GGUF_TYPE_COUNT_
} kp_gguf_type;

/* A string inside the mapping: NOT NUL-terminated, may contain any bytes. */
typedef struct {
    const char *data;
    uint64_t len;
} kp_gguf_str;

/* A metadata value. Scalars are decoded; arrays keep a view of their raw
 * little-endian elements (fixed-size element types) or a decoded list
 * (strings, nested arrays). */
typedef struct kp_gguf_value {
    kp_gguf_type type;
    union {
        uint64_t u64;   /* UINT8..UINT64 (zero-extended) */
        int64_t i64;    /* INT8..INT64 (sign-extended) */
        double f64;     /* FLOAT32, FLOAT64 */
        bool b;         /* BOOL */
        kp_gguf_str str;   /* STRING */
        struct {
            kp_gguf_type elem_type;
            uint64_t n;
            const uint8_t *raw;        /* fixed-size elements, n * size, unaligned */
            kp_gguf_str *strs;            /* elem_type STRING: n strings */
            struct kp_gguf_value *items;  /* elem_type ARRAY: n nested arrays */
        } arr;
    } v;
} kp_gguf_value;

typedef struct {
    kp_gguf_str key;
    kp_gguf_value value;
} kp_gguf_kv;

typedef struct {
    kp_gguf_str name;
    uint32_t n_dims;
    int64_t ne[KP_GGUF_MAX_DIMS]; /* ggml order: ne[0] is the row length; unused dims are 1 */
    uint32_t type;             /* a kp_dtype id (dtype.h) */
    uint64_t offset;           /* relative to the data section */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data;          /* inside the mapping */
} kp_gguf_tensor;

typedef struct kp_gguf kp_gguf;

/* Maps and parses `path`. On success *out owns the mapping; free with kp_gguf_close. */
kp_status kp_gguf_open(kp_gguf **out, const char *path, kp_error *err);

/* Parses a caller-owned buffer (borrowed: it must outlive the gguf). `name`
 * is used in messages. Used by the fuzzer and tests. */
kp_status kp_gguf_open_memory(kp_gguf **out, const void *data, size_t size, const char *name,
                           kp_error *err);

void kp_gguf_close(kp_gguf *g); /* NULL is a no-op */

uint32_t kp_gguf_version(const kp_gguf *g);
const char *kp_gguf_path(const kp_gguf *g);
uint64_t kp_gguf_file_size(const kp_gguf *g);
uint32_t kp_gguf_alignment(const kp_gguf *g);
uint64_t kp_gguf_data_offset(const kp_gguf *g); /* file offset of the tensor data section */

size_t kp_gguf_n_kv(const kp_gguf *g);
const kp_gguf_kv *kp_gguf_kv_at(const kp_gguf *g, size_t i); /* file order */
const kp_gguf_kv *kp_gguf_find(const kp_gguf *g, const char *key); /* NULL if absent */

size_t kp_gguf_n_tensors(const kp_gguf *g);
const kp_gguf_tensor *kp_gguf_tensor_at(const kp_gguf *g, size_t i); /* file order */
const kp_gguf_tensor *kp_gguf_find_tensor(const kp_gguf *g, const char *name);

/* Typed lookups. Absent key: *out = def and KP_OK. Present with a type that
 * cannot represent the value exactly (a string for u32, a negative int for
 * u32, a u64 over UINT32_MAX...): KP_EFORMAT naming the key. Any integer
 * type is accepted where it fits; floats accept FLOAT32/FLOAT64. */
kp_status kp_gguf_get_u32(const kp_gguf *g, const char *key, uint32_t def, uint32_t *out, kp_error *err);
kp_status kp_gguf_get_i32(const kp_gguf *g, const char *key, int32_t def, int32_t *out, kp_error *err);
kp_status kp_gguf_get_u64(const kp_gguf *g, const char *key, uint64_t def, uint64_t *out, kp_error *err);
kp_status kp_gguf_get_f32(const kp_gguf *g, const char *key, float def, float *out, kp_error *err);
kp_status kp_gguf_get_bool(const kp_gguf *g, const char *key, bool def, bool *out, kp_error *err);
/* Absent: out->data = NULL, out->len = 0 and KP_OK. */
kp_status kp_gguf_get_str(const kp_gguf *g, const char *key, kp_gguf_str *out, kp_error *err);
/* An array whose elements have type `elem_type`; absent: *out = NULL, KP_OK. */
kp_status kp_gguf_get_arr(const kp_gguf *g, const char *key, kp_gguf_type elem_type, const kp_gguf_value **out,
                       kp_error *err);

/* Element i of a fixed-size-element array, widened (caller checks i < n).
 * kp_gguf_arr_i64 of a float element truncates toward zero, saturates outside
 * the int64 range and gives 0 for NaN. */
int64_t kp_gguf_arr_i64(const kp_gguf_value *arr, uint64_t i);
double kp_gguf_arr_f64(const kp_gguf_value *arr, uint64_t i);

/* Compares a kp_gguf_str to a C string. */
bool kp_gguf_str_eq(kp_gguf_str s, const char *c);

const char *kp_gguf_type_name(kp_gguf_type t);
size_t kp_gguf_type_size(kp_gguf_type t); /* 0 for STRING and ARRAY */

#endif
