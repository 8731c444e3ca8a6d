/*
 * gguf_write.c - the streaming GGUF v3 writer (API and contract in gguf_write.h).
 *
 * What it owns: the serialized metadata section (built as keys are added),
 * the list of declared tensors, and, once begun, the output stream. It does
 * not own tensor data: callers stream it through kp_gguf_w_write_data.
 *
 * File layout produced (all integers little-endian):
 *
 *   offset          size        meaning
 *   0               4           magic "GGUF"
 *   4               4   u32     version = 3
 *   8               8   u64     n_tensors
 *   16              8   u64     n_kv
 *   24              ...         n_kv x { key: u64 len + bytes, u32 type, value }
 *   ...             ...         n_tensors x { name: u64 len + bytes, u32 n_dims,
 *                               u64 ne[n_dims], u32 type, u64 offset }
 *   ...             0..A-1      zero padding up to a multiple of A (alignment)
 *   data_offset     ...         tensor 0 data, zero padding to a multiple of A,
 *                               tensor 1 data, padding, ... (last one padded too)
 *
 *   value encodings:  UINT8/INT8/BOOL 1 byte, (U)INT16 2, (U)INT32/FLOAT32 4,
 *                     (U)INT64/FLOAT64 8, STRING u64 len + bytes,
 *                     ARRAY u32 elem_type + u64 n + n elements (strings as
 *                     above; nested arrays as elem_type + n + elements).
 *
 * Tensor offsets are relative to data_offset and assigned in declaration
 * order at kp_gguf_w_begin: offset[0] = 0, offset[i+1] = align_up(offset[i] +
 * bytes[i], A). This is the packing llama.cpp's loader checks for.
 *
 * States and invariants:
 *
 *   COLLECT --begin--> DATA --finish--> DONE
 *      |                 |
 *      +-- add_* errors leave the writer unchanged (the metadata buffer is
 *          rolled back to its length before the call);
 *          any error in begin / write_data / finish --> FAILED (terminal).
 *
 *   In DATA: tensors[0..cur) are complete and padded; tensors[cur] has
 *   cur_written < bytes of it; `pos` is the number of bytes written so far.
 */
#include "gguf/gguf_write.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "gguf/dtype.h"

#define GGUF_W_VERSION 3u
#define GGUF_W_MAX_KEY 65535u
#define GGUF_W_MAX_NESTING 16
#define GGUF_W_IO_BUFFER (1u << 20)

typedef struct {
    size_t off, len; /* the key's bytes inside `keys` */
} wkey;

typedef struct {
    char name[KP_GGUF_W_MAX_TENSOR_NAME];
    uint32_t n_dims;
    int64_t ne[KP_GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t n_bytes;
    uint64_t offset; /* relative to the data section; set by begin */
} wtensor;

typedef enum { W_COLLECT, W_DATA, W_DONE, W_FAILED } wstate;

struct kp_gguf_w {
    wstate state;
    uint32_t alignment;

    kp_buf kv;        /* serialized key/value pairs, in order of addition */
    uint64_t n_kv;
    kp_buf keys;      /* raw bytes of every key, for the duplicate check */
    wkey *key_index;
    size_t n_keys, cap_keys;

    wtensor *tensors;
    size_t n_tensors, cap_tensors;

    FILE *f;
    bool own_file;    /* opened from a path by begin: closed by finish/free */
    bool is_regular;  /* the path is a regular file: removed if unfinished */
    char *path;       /* owned copy of the path or stream name, for messages */
    char *io_buffer;  /* setvbuf buffer of an owned file */
    uint64_t data_offset;
    size_t cur;
    uint64_t cur_written;
    uint64_t pos;
};

/* ---- little-endian encoding into a kp_buf ---- */

static bool put_le(kp_buf *b, uint64_t v, unsigned width) {
    uint8_t bytes[8];
    for (unsigned i = 0; i < width; i++) bytes[i] = (uint8_t)(v >> (8 * i));
    return kp_buf_put(b, bytes, width);
}

static bool put_str(kp_buf *b, const char *s, uint64_t len) {
    if (len > SIZE_MAX) return false;
    return put_le(b, len, 8) && kp_buf_put(b, s, (size_t)len);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint64_t f64_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* ---- lifetime ---- */

kp_status kp_gguf_w_new(kp_gguf_w **out, kp_error *err) {
    *out = NULL;
    kp_gguf_w *w = calloc(1, sizeof *w);
    if (!w) return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory creating a writer");
    w->state = W_COLLECT;
    w->alignment = KP_GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return KP_OK;
}

void kp_gguf_w_free(kp_gguf_w *w) {
    if (!w) return;
    if (w->f && w->own_file) fclose(w->f);
    if (w->own_file && w->state != W_DONE && w->is_regular && w->path) unlink(w->path);
    free(w->io_buffer);
    free(w->path);
    kp_buf_free(&w->kv);
    kp_buf_free(&w->keys);
    free(w->key_index);
    free(w->tensors);
    free(w);
}

/* ---- metadata ---- */

/* Checks state and key; on success the caller may append to w->kv. */
static kp_status key_check(kp_gguf_w *w, const char *key, size_t len, kp_error *err) {
    if (w->state != W_COLLECT)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: metadata key '%.*s' added after writing began",
                       (int)(len > 200 ? 200 : len), key);
    if (len == 0) return kp_fail(err, KP_EINVAL, "kp_gguf_w: empty metadata key");
    if (len > GGUF_W_MAX_KEY)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: metadata key of %zu bytes (at most %u)", len,
                       GGUF_W_MAX_KEY);
    for (size_t i = 0; i < w->n_keys; i++) {
        const wkey *k = &w->key_index[i];
        if (k->len == len && memcmp(w->keys.data + k->off, key, len) == 0)
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: duplicate metadata key '%.*s'",
                           (int)(len > 200 ? 200 : len), key);
    }
    return KP_OK;
}

/* Records the key after its value was serialized; rolls back on failure. */
static kp_status key_commit(kp_gguf_w *w, const char *key, size_t len, size_t kv_len_before,
                            kp_error *err) {
    size_t off = w->keys.len;
    if (!kp_grow((void **)&w->key_index, &w->cap_keys, w->n_keys + 1, sizeof *w->key_index) ||
        !kp_buf_put(&w->keys, key, len)) {
        kp_buf_truncate(&w->keys, off);
        kp_buf_truncate(&w->kv, kv_len_before);
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%.*s'",
                       (int)(len > 200 ? 200 : len), key);
    }
    w->key_index[w->n_keys++] = (wkey){off, len};
    w->n_kv++;
    return KP_OK;
}

static bool is_fixed_type(kp_gguf_type t) {
    return t < KP_GGUF_TYPE_COUNT_ && t != KP_GGUF_TYPE_STRING && t != KP_GGUF_TYPE_ARRAY;
}

/* Width in bytes of a fixed-size GGUF type, 0 for the others. */
static unsigned fixed_width(kp_gguf_type t) { return (unsigned)kp_gguf_type_size(t); }

/* The special key: general.alignment sets the data alignment. */
static kp_status alignment_check(kp_gguf_w *w, const char *key, size_t len, kp_gguf_type type,
                                 uint64_t value, kp_error *err) {
    static const char name[] = "general.alignment";
    if (len != sizeof name - 1 || memcmp(key, name, len) != 0) return KP_OK;
    if (type != KP_GGUF_TYPE_UINT32)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: general.alignment must be a UINT32, not %s",
                       kp_gguf_type_name(type));
    if (value == 0 || (value & (value - 1)) != 0)
        return kp_fail(err, KP_EINVAL,
                       "kp_gguf_w: general.alignment %llu is not a power of two",
                       (unsigned long long)value);
    w->alignment = (uint32_t)value;
    return KP_OK;
}

/* Adds a fixed-size scalar given as its zero-extended bit pattern. */
static kp_status add_scalar(kp_gguf_w *w, const char *key, kp_gguf_type type, uint64_t bits,
                            kp_error *err) {
    size_t len = strlen(key);
    kp_status st = key_check(w, key, len, err);
    if (st != KP_OK) return st;
    size_t before = w->kv.len;
    if (!put_str(&w->kv, key, len) || !put_le(&w->kv, (uint32_t)type, 4) ||
        !put_le(&w->kv, bits, fixed_width(type))) {
        kp_buf_truncate(&w->kv, before);
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%s'", key);
    }
    uint32_t old_alignment = w->alignment;
    st = alignment_check(w, key, len, type, bits, err);
    if (st == KP_OK) st = key_commit(w, key, len, before, err);
    if (st != KP_OK) {
        kp_buf_truncate(&w->kv, before);
        w->alignment = old_alignment;
    }
    return st;
}

kp_status kp_gguf_w_add_u8(kp_gguf_w *w, const char *key, uint8_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_UINT8, v, err);
}
kp_status kp_gguf_w_add_i8(kp_gguf_w *w, const char *key, int8_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_INT8, (uint8_t)v, err);
}
kp_status kp_gguf_w_add_u16(kp_gguf_w *w, const char *key, uint16_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_UINT16, v, err);
}
kp_status kp_gguf_w_add_i16(kp_gguf_w *w, const char *key, int16_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_INT16, (uint16_t)v, err);
}
kp_status kp_gguf_w_add_u32(kp_gguf_w *w, const char *key, uint32_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_UINT32, v, err);
}
kp_status kp_gguf_w_add_i32(kp_gguf_w *w, const char *key, int32_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_INT32, (uint32_t)v, err);
}
kp_status kp_gguf_w_add_u64(kp_gguf_w *w, const char *key, uint64_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_UINT64, v, err);
}
kp_status kp_gguf_w_add_i64(kp_gguf_w *w, const char *key, int64_t v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_INT64, (uint64_t)v, err);
}
kp_status kp_gguf_w_add_f32(kp_gguf_w *w, const char *key, float v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_FLOAT32, f32_bits(v), err);
}
kp_status kp_gguf_w_add_f64(kp_gguf_w *w, const char *key, double v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_FLOAT64, f64_bits(v), err);
}
kp_status kp_gguf_w_add_bool(kp_gguf_w *w, const char *key, bool v, kp_error *err) {
    return add_scalar(w, key, KP_GGUF_TYPE_BOOL, v ? 1 : 0, err);
}

kp_status kp_gguf_w_add_strn(kp_gguf_w *w, const char *key, const char *s, uint64_t len,
                          kp_error *err) {
    size_t klen = strlen(key);
    kp_status st = key_check(w, key, klen, err);
    if (st != KP_OK) return st;
    if (!s && len > 0) return kp_fail(err, KP_EINVAL, "kp_gguf_w: NULL string for key '%s'", key);
    size_t before = w->kv.len;
    if (!put_str(&w->kv, key, klen) || !put_le(&w->kv, KP_GGUF_TYPE_STRING, 4) ||
        !put_str(&w->kv, s, len)) {
        kp_buf_truncate(&w->kv, before);
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%s'", key);
    }
    return key_commit(w, key, klen, before, err);
}

kp_status kp_gguf_w_add_str(kp_gguf_w *w, const char *key, const char *s, kp_error *err) {
    if (!s) return kp_fail(err, KP_EINVAL, "kp_gguf_w: NULL string for key '%s'", key);
    return kp_gguf_w_add_strn(w, key, s, strlen(s), err);
}

/* Appends n host-order elements of a fixed-size type, little-endian. */
static bool put_host_elems(kp_buf *b, kp_gguf_type t, const void *elems, uint64_t n) {
    unsigned width = fixed_width(t);
    if (n > SIZE_MAX / 8) return false;
    if (!kp_buf_reserve(b, (size_t)n * width)) return false;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t bits = 0;
        switch (t) {
        case KP_GGUF_TYPE_UINT8: bits = ((const uint8_t *)elems)[i]; break;
        case KP_GGUF_TYPE_INT8: bits = (uint8_t)((const int8_t *)elems)[i]; break;
        case KP_GGUF_TYPE_BOOL: bits = ((const bool *)elems)[i] ? 1 : 0; break;
        case KP_GGUF_TYPE_UINT16: bits = ((const uint16_t *)elems)[i]; break;
        case KP_GGUF_TYPE_INT16: bits = (uint16_t)((const int16_t *)elems)[i]; break;
        case KP_GGUF_TYPE_UINT32: bits = ((const uint32_t *)elems)[i]; break;
        case KP_GGUF_TYPE_INT32: bits = (uint32_t)((const int32_t *)elems)[i]; break;
        case KP_GGUF_TYPE_FLOAT32: bits = f32_bits(((const float *)elems)[i]); break;
        case KP_GGUF_TYPE_UINT64: bits = ((const uint64_t *)elems)[i]; break;
        case KP_GGUF_TYPE_INT64: bits = (uint64_t)((const int64_t *)elems)[i]; break;
        case KP_GGUF_TYPE_FLOAT64: bits = f64_bits(((const double *)elems)[i]); break;
        default: return false;
        }
        put_le(b, bits, width); /* cannot fail: reserved above */
    }
    return true;
}

kp_status kp_gguf_w_add_arr(kp_gguf_w *w, const char *key, kp_gguf_type elem_type, const void *elems,
                         uint64_t n, kp_error *err) {
    size_t klen = strlen(key);
    kp_status st = key_check(w, key, klen, err);
    if (st != KP_OK) return st;
    if (!is_fixed_type(elem_type))
        return kp_fail(err, KP_EINVAL,
                       "kp_gguf_w: key '%s': kp_gguf_w_add_arr takes fixed-size elements, not %s", key,
                       kp_gguf_type_name(elem_type));
    if (!elems && n > 0) return kp_fail(err, KP_EINVAL, "kp_gguf_w: NULL array for key '%s'", key);
    size_t before = w->kv.len;
    if (!put_str(&w->kv, key, klen) || !put_le(&w->kv, KP_GGUF_TYPE_ARRAY, 4) ||
        !put_le(&w->kv, (uint32_t)elem_type, 4) || !put_le(&w->kv, n, 8) ||
        !put_host_elems(&w->kv, elem_type, elems, n)) {
        kp_buf_truncate(&w->kv, before);
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%s'", key);
    }
    return key_commit(w, key, klen, before, err);
}

kp_status kp_gguf_w_add_arr_str(kp_gguf_w *w, const char *key, const char *const *strs, uint64_t n,
                             kp_error *err) {
    size_t klen = strlen(key);
    kp_status st = key_check(w, key, klen, err);
    if (st != KP_OK) return st;
    for (uint64_t i = 0; i < n; i++)
        if (!strs || !strs[i])
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': string %llu is NULL", key,
                           (unsigned long long)i);
    size_t before = w->kv.len;
    bool ok = put_str(&w->kv, key, klen) && put_le(&w->kv, KP_GGUF_TYPE_ARRAY, 4) &&
              put_le(&w->kv, KP_GGUF_TYPE_STRING, 4) && put_le(&w->kv, n, 8);
    for (uint64_t i = 0; ok && i < n; i++) ok = put_str(&w->kv, strs[i], strlen(strs[i]));
    if (!ok) {
        kp_buf_truncate(&w->kv, before);
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%s'", key);
    }
    return key_commit(w, key, klen, before, err);
}

/* Serializes the body of an ARRAY value (elem_type, n, elements). */
static kp_status put_array_body(kp_buf *b, const kp_gguf_value *v, int depth, const char *key,
                                kp_error *err) {
    if (depth > GGUF_W_MAX_NESTING)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': arrays nested deeper than %d", key,
                       GGUF_W_MAX_NESTING);
    kp_gguf_type et = v->v.arr.elem_type;
    uint64_t n = v->v.arr.n;
    if (!put_le(b, (uint32_t)et, 4) || !put_le(b, n, 8)) goto oom;
    if (is_fixed_type(et)) {
        unsigned width = fixed_width(et);
        if (n > 0 && !v->v.arr.raw)
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': array without elements", key);
        if (n > SIZE_MAX / width) goto oom;
        if (!kp_buf_put(b, v->v.arr.raw, (size_t)n * width)) goto oom;
    } else if (et == KP_GGUF_TYPE_STRING) {
        if (n > 0 && !v->v.arr.strs)
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': array without strings", key);
        for (uint64_t i = 0; i < n; i++) {
            const kp_gguf_str *s = &v->v.arr.strs[i];
            if (s->len > 0 && !s->data)
                return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': string %llu has no data", key,
                               (unsigned long long)i);
            if (!put_str(b, s->data, s->len)) goto oom;
        }
    } else if (et == KP_GGUF_TYPE_ARRAY) {
        if (n > 0 && !v->v.arr.items)
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': array without items", key);
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.items[i].type != KP_GGUF_TYPE_ARRAY)
                return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': nested item %llu is not an array",
                               key, (unsigned long long)i);
            kp_status st = put_array_body(b, &v->v.arr.items[i], depth + 1, key, err);
            if (st != KP_OK) return st;
        }
    } else {
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': bad array element type %u", key,
                       (unsigned)et);
    }
    return KP_OK;
oom:
    return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%s'", key);
}

/* Bit pattern of a decoded fixed-size scalar, at its own width. */
static uint64_t scalar_bits(const kp_gguf_value *v) {
    switch (v->type) {
    case KP_GGUF_TYPE_UINT8: case KP_GGUF_TYPE_UINT16: case KP_GGUF_TYPE_UINT32: case KP_GGUF_TYPE_UINT64:
        return v->v.u64;
    case KP_GGUF_TYPE_INT8: case KP_GGUF_TYPE_INT16: case KP_GGUF_TYPE_INT32: case KP_GGUF_TYPE_INT64:
        return (uint64_t)v->v.i64; /* truncated to the width by put_le */
    case KP_GGUF_TYPE_FLOAT32: return f32_bits((float)v->v.f64); /* exact: it was a float */
    case KP_GGUF_TYPE_FLOAT64: return f64_bits(v->v.f64);
    case KP_GGUF_TYPE_BOOL: return v->v.b ? 1 : 0;
    default: return 0;
    }
}

static kp_status add_value_n(kp_gguf_w *w, const char *key, size_t klen, const kp_gguf_value *v,
                             kp_error *err) {
    /* messages below print the key with %s: give them a bounded NUL-terminated copy */
    char kname[256];
    size_t shown = klen < sizeof kname - 1 ? klen : sizeof kname - 1;
    memcpy(kname, key, shown);
    kname[shown] = 0;

    kp_status st = key_check(w, key, klen, err);
    if (st != KP_OK) return st;
    if (!v || v->type >= KP_GGUF_TYPE_COUNT_)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': bad value", kname);
    size_t before = w->kv.len;
    if (!put_str(&w->kv, key, klen) || !put_le(&w->kv, (uint32_t)v->type, 4)) goto oom;
    uint32_t old_alignment = w->alignment;
    if (is_fixed_type(v->type)) {
        uint64_t bits = scalar_bits(v);
        if (!put_le(&w->kv, bits, fixed_width(v->type))) goto oom;
        st = alignment_check(w, key, klen, v->type, v->type == KP_GGUF_TYPE_UINT32 ? bits : 0, err);
    } else if (v->type == KP_GGUF_TYPE_STRING) {
        if (v->v.str.len > 0 && !v->v.str.data) {
            kp_buf_truncate(&w->kv, before);
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: key '%s': string has no data", kname);
        }
        if (!put_str(&w->kv, v->v.str.data, v->v.str.len)) goto oom;
        st = alignment_check(w, key, klen, v->type, 0, err);
    } else {
        st = put_array_body(&w->kv, v, 0, kname, err);
        if (st == KP_OK) st = alignment_check(w, key, klen, v->type, 0, err);
    }
    if (st == KP_OK) st = key_commit(w, key, klen, before, err);
    if (st != KP_OK) {
        kp_buf_truncate(&w->kv, before);
        w->alignment = old_alignment;
    }
    return st;
oom:
    kp_buf_truncate(&w->kv, before);
    return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding metadata key '%s'", kname);
}

kp_status kp_gguf_w_add_value(kp_gguf_w *w, const char *key, const kp_gguf_value *v, kp_error *err) {
    return add_value_n(w, key, strlen(key), v, err);
}

kp_status kp_gguf_w_copy_kv(kp_gguf_w *w, const kp_gguf_kv *kv, kp_error *err) {
    if (!kv || (!kv->key.data && kv->key.len > 0))
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: bad key/value pair");
    if (kv->key.len > GGUF_W_MAX_KEY)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: metadata key of %llu bytes (at most %u)",
                       (unsigned long long)kv->key.len, GGUF_W_MAX_KEY);
    return add_value_n(w, kv->key.data, (size_t)kv->key.len, &kv->value, err);
}

/* ---- tensors ---- */

kp_status kp_gguf_w_add_tensor(kp_gguf_w *w, const char *name, uint32_t type, uint32_t n_dims,
                            const int64_t *ne, kp_error *err) {
    if (w->state != W_COLLECT)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: tensor '%s' added after writing began", name);
    size_t len = strlen(name);
    if (len == 0) return kp_fail(err, KP_EINVAL, "kp_gguf_w: empty tensor name");
    if (len >= KP_GGUF_W_MAX_TENSOR_NAME)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: tensor name '%.80s' is %zu bytes (at most %d)",
                       name, len, KP_GGUF_W_MAX_TENSOR_NAME - 1);
    const kp_dtype_info *ti = kp_dtype_get(type);
    if (!ti) return kp_fail(err, KP_EINVAL, "kp_gguf_w: tensor '%s': unknown type %u", name, type);
    if (n_dims < 1 || n_dims > KP_GGUF_MAX_DIMS)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: tensor '%s': %u dimensions (1 to %d)", name,
                       n_dims, KP_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] < 1)
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: tensor '%s': ne[%u] = %lld (must be >= 1)",
                           name, d, (long long)ne[d]);
    if (ne[0] % ti->block_size != 0)
        return kp_fail(err, KP_EINVAL,
                       "kp_gguf_w: tensor '%s': row length %lld is not a multiple of %s's block "
                       "size %u",
                       name, (long long)ne[0], ti->name, ti->block_size);
    uint64_t bytes = (uint64_t)(ne[0] / ti->block_size) * ti->type_size;
    for (uint32_t d = 1; d < n_dims; d++) {
        if ((uint64_t)ne[d] > (UINT64_MAX >> 1) / bytes)
            return kp_fail(err, KP_ERANGE, "kp_gguf_w: tensor '%s': size overflows", name);
        bytes *= (uint64_t)ne[d];
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return kp_fail(err, KP_EINVAL, "kp_gguf_w: duplicate tensor name '%s'", name);
    if (!kp_grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof *w->tensors))
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory adding tensor '%s'", name);
    wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, len + 1);
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < KP_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->n_bytes = bytes;
    return KP_OK;
}

size_t kp_gguf_w_n_tensors(const kp_gguf_w *w) { return w->n_tensors; }

uint64_t kp_gguf_w_tensor_bytes(const kp_gguf_w *w, size_t i) {
    return i < w->n_tensors ? w->tensors[i].n_bytes : 0;
}

uint64_t kp_gguf_w_data_offset(const kp_gguf_w *w) { return w->data_offset; }

/* ---- output ---- */

static kp_status io_fail(kp_gguf_w *w, int errnum, const char *what, kp_error *err) {
    char buf[128];
    const char *msg = errnum ? strerror_r(errnum, buf, sizeof buf) : "write error";
    w->state = W_FAILED;
    return kp_fail(err, KP_EIO, "kp_gguf_w: %s '%s' failed: %s", what, w->path ? w->path : "?",
                   msg);
}

static kp_status emit(kp_gguf_w *w, const void *data, size_t n, kp_error *err) {
    if (n == 0) return KP_OK;
    errno = 0;
    if (fwrite(data, 1, n, w->f) != n) return io_fail(w, errno, "writing", err);
    w->pos += n;
    return KP_OK;
}

static kp_status emit_zeros(kp_gguf_w *w, size_t n, kp_error *err) {
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        kp_status st = emit(w, zeros, k, err);
        if (st != KP_OK) return st;
        n -= k;
    }
    return KP_OK;
}

/* Builds the header and tensor infos into one buffer and writes it. */
static kp_status write_header(kp_gguf_w *w, kp_error *err) {
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        uint64_t end = off + w->tensors[i].n_bytes;
        if (end < off || end > UINT64_MAX - w->alignment) {
            w->state = W_FAILED;
            return kp_fail(err, KP_ERANGE, "kp_gguf_w: '%s': data section overflows", w->path);
        }
        off = align_up(end, w->alignment);
    }
    kp_buf h = {0};
    bool ok = kp_buf_put(&h, "GGUF", 4) && put_le(&h, GGUF_W_VERSION, 4) &&
              put_le(&h, w->n_tensors, 8) && put_le(&h, w->n_kv, 8) &&
              kp_buf_put(&h, w->kv.data, w->kv.len);
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        ok = put_str(&h, t->name, strlen(t->name)) && put_le(&h, t->n_dims, 4);
        for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = put_le(&h, (uint64_t)t->ne[d], 8);
        ok = ok && put_le(&h, t->type, 4) && put_le(&h, t->offset, 8);
    }
    if (ok) ok = kp_buf_fill(&h, 0, (size_t)(align_up(h.len, w->alignment) - h.len));
    if (!ok) {
        kp_buf_free(&h);
        w->state = W_FAILED;
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory building the header of '%s'",
                       w->path);
    }
    w->data_offset = h.len;
    kp_status st = emit(w, h.data, h.len, err);
    kp_buf_free(&h);
    return st;
}

static kp_status begin_common(kp_gguf_w *w, const char *name, kp_error *err) {
    w->path = strdup(name ? name : "(stream)");
    if (!w->path) {
        w->state = W_FAILED;
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory");
    }
    w->state = W_DATA;
    w->cur = 0;
    w->cur_written = 0;
    w->pos = 0;
    return write_header(w, err);
}

kp_status kp_gguf_w_begin(kp_gguf_w *w, const char *path, kp_error *err) {
    if (w->state != W_COLLECT)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: begin called twice or after an error");
    w->io_buffer = malloc(GGUF_W_IO_BUFFER);
    if (!w->io_buffer) {
        w->state = W_FAILED;
        return kp_fail(err, KP_ENOMEM, "kp_gguf_w: out of memory");
    }
    errno = 0;
    w->f = fopen(path, "wb");
    if (!w->f) {
        char buf[128];
        int e = errno;
        w->state = W_FAILED;
        return kp_fail(err, KP_EIO, "kp_gguf_w: cannot create '%s': %s", path,
                       e ? strerror_r(e, buf, sizeof buf) : "unknown error");
    }
    w->own_file = true;
    struct stat sb;
    w->is_regular = fstat(fileno(w->f), &sb) == 0 && S_ISREG(sb.st_mode);
    setvbuf(w->f, w->io_buffer, _IOFBF, GGUF_W_IO_BUFFER);
    return begin_common(w, path, err);
}

kp_status kp_gguf_w_begin_stream(kp_gguf_w *w, FILE *stream, const char *name, kp_error *err) {
    if (w->state != W_COLLECT)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: begin called twice or after an error");
    if (!stream) return kp_fail(err, KP_EINVAL, "kp_gguf_w: NULL stream");
    w->f = stream;
    w->own_file = false;
    return begin_common(w, name, err);
}

kp_status kp_gguf_w_write_data(kp_gguf_w *w, const void *data, size_t n, kp_error *err) {
    if (w->state != W_DATA)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: tensor data written %s",
                       w->state == W_COLLECT ? "before kp_gguf_w_begin" : "after finish or an error");
    if (n == 0) return KP_OK;
    if (w->cur >= w->n_tensors) {
        w->state = W_FAILED;
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: '%s': %zu bytes of data past the last tensor",
                       w->path, n);
    }
    const wtensor *t = &w->tensors[w->cur];
    uint64_t left = t->n_bytes - w->cur_written;
    if (n > left) {
        w->state = W_FAILED;
        return kp_fail(err, KP_EINVAL,
                       "kp_gguf_w: '%s': a write of %zu bytes runs past the end of tensor '%s' "
                       "(%llu bytes left)",
                       w->path, n, t->name, (unsigned long long)left);
    }
    kp_status st = emit(w, data, n, err);
    if (st != KP_OK) return st;
    w->cur_written += n;
    if (w->cur_written == t->n_bytes) {
        st = emit_zeros(w, (size_t)(align_up(t->n_bytes, w->alignment) - t->n_bytes), err);
        if (st != KP_OK) return st;
        assert(w->pos == w->data_offset + align_up(t->offset + t->n_bytes, w->alignment));
        w->cur++;
        w->cur_written = 0;
    }
    return KP_OK;
}

kp_status kp_gguf_w_finish(kp_gguf_w *w, kp_error *err) {
    if (w->state != W_DATA)
        return kp_fail(err, KP_EINVAL, "kp_gguf_w: finish %s",
                       w->state == W_COLLECT ? "before kp_gguf_w_begin" : "after finish or an error");
    if (w->cur < w->n_tensors) {
        w->state = W_FAILED;
        return kp_fail(err, KP_EINVAL,
                       "kp_gguf_w: '%s': tensor '%s' has %llu of %llu data bytes at finish",
                       w->path, w->tensors[w->cur].name, (unsigned long long)w->cur_written,
                       (unsigned long long)w->tensors[w->cur].n_bytes);
    }
    errno = 0;
    if (fflush(w->f) != 0 || ferror(w->f)) return io_fail(w, errno, "writing", err);
    if (w->own_file) {
        FILE *f = w->f;
        w->f = NULL;
        errno = 0;
        if (fclose(f) != 0) return io_fail(w, errno, "closing", err);
    }
    w->state = W_DONE;
    return KP_OK;
}
