/*
 * gguf.c - the GGUF reader (see gguf.h for the API).
 *
 * Owns: the file mapping (or borrows a caller's buffer), the decoded KV list,
 * the tensor table, and two sorted indexes used for O(log n) lookup and for
 * duplicate detection. Every string and array payload is a view into the
 * mapping; only arrays of strings and nested arrays get a decoded list.
 *
 * File layout (all little-endian; versions 2 and 3 share it):
 *
 *   offset  size        field
 *   0       4           magic "GGUF"
 *   4       4           version (u32): 2 or 3 (1 used u32 lengths: refused)
 *   8       8           n_tensors (u64)
 *   16      8           n_kv (u64)
 *   24      ...         n_kv x { key: str, value_type: u32, value }
 *           ...         n_tensors x { name: str, n_dims: u32, ne: n_dims x u64,
 *                                     type: u32, offset: u64 }
 *           pad         zero bytes up to a multiple of general.alignment (default 32)
 *   data    ...         tensor data; tensor i at data + offset_i
 *
 *   str   = { len: u64, bytes: len }           (no terminator)
 *   value = scalar of its type's size | str | array
 *   array = { elem_type: u32, n: u64, n x elem } (elements may themselves be arrays)
 *
 * Hardening invariants, checked before anything is trusted:
 *   - every read is bounds-checked against the remaining bytes (no pointer
 *     arithmetic past the end, lengths compared by subtraction, not addition);
 *   - counts are bounded by the bytes that remain before anything is
 *     allocated (each KV needs >= 13 bytes, each tensor info >= 24, each string
 *     >= 8), so a forged count cannot make us allocate gigabytes;
 *   - nested arrays are limited to GGUF_MAX_DEPTH levels;
 *   - element counts, byte sizes and offsets are checked for overflow;
 *   - tensors must have 1..4 dims, none zero, a known type, a row length that
 *     is a multiple of the type's block, an aligned offset, data inside the
 *     file, and must not overlap one another;
 *   - keys and tensor names are unique; general.alignment is a u32 power of two.
 * A file with zero tensors may end right after its metadata (no padding).
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/dtype.h"

#define GGUF_MAX_DEPTH 8

struct kp_gguf {
    char *name;            /* path or caller-supplied name, for messages */
    const uint8_t *base;   /* mapping or borrowed buffer */
    size_t size;
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    size_t n_kv;
    kp_gguf_kv *kvs;
    kp_gguf_kv **kv_sorted;   /* by key bytes */
    size_t n_tensors;
    kp_gguf_tensor *tensors;
    kp_gguf_tensor **tensor_sorted; /* by name bytes */
};

/* A bounds-checked cursor over the file bytes. */
typedef struct {
    const uint8_t *p;
    size_t size;
    size_t pos;
    const char *name;
    kp_error *err;
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }

static kp_status cur_take(cursor *c, size_t n, const uint8_t **out, const char *what) {
    if (n > cur_left(c))
        return kp_fail(c->err, KP_EFORMAT,
                       "%s: truncated file: %s needs %zu bytes at offset %zu, only %zu left",
                       c->name, what, n, c->pos, cur_left(c));
    *out = c->p + c->pos;
    c->pos += n;
    return KP_OK;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}
static uint32_t le32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static kp_status cur_u32(cursor *c, uint32_t *v, const char *what) {
    const uint8_t *b = NULL;
    kp_status st = cur_take(c, 4, &b, what);
    if (st == KP_OK) *v = le32(b);
    return st;
}

static kp_status cur_u64(cursor *c, uint64_t *v, const char *what) {
    const uint8_t *b = NULL;
    kp_status st = cur_take(c, 8, &b, what);
    if (st == KP_OK) *v = le64(b);
    return st;
}

static kp_status cur_str(cursor *c, kp_gguf_str *s, const char *what) {
    uint64_t len;
    size_t at = c->pos;
    kp_status st = cur_u64(c, &len, what);
    if (st != KP_OK) return st;
    if (len > cur_left(c))
        return kp_fail(c->err, KP_EFORMAT,
                       "%s: %s at offset %zu has length %llu past the end of the file (%zu bytes left)",
                       c->name, what, at, (unsigned long long)len, cur_left(c));
    const uint8_t *b = NULL;
    cur_take(c, (size_t)len, &b, what);
    s->data = (const char *)b;
    s->len = len;
    return KP_OK;
}

size_t kp_gguf_type_size(kp_gguf_type t) {
    switch (t) {
    case KP_GGUF_TYPE_UINT8: case KP_GGUF_TYPE_INT8: case KP_GGUF_TYPE_BOOL: return 1;
    case KP_GGUF_TYPE_UINT16: case KP_GGUF_TYPE_INT16: return 2;
    case KP_GGUF_TYPE_UINT32: case KP_GGUF_TYPE_INT32: case KP_GGUF_TYPE_FLOAT32: return 4;
    case KP_GGUF_TYPE_UINT64: case KP_GGUF_TYPE_INT64: case KP_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *kp_gguf_type_name(kp_gguf_type t) {
    static const char *const names[KP_GGUF_TYPE_COUNT_] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < KP_GGUF_TYPE_COUNT_ ? names[t] : "?";
}

/* Decodes one scalar of fixed-size type t from b into v. */
static void decode_scalar(kp_gguf_type t, const uint8_t *b, kp_gguf_value *v) {
    v->type = t;
    switch (t) {
    case KP_GGUF_TYPE_UINT8: v->v.u64 = b[0]; break;
    case KP_GGUF_TYPE_INT8: v->v.i64 = (int8_t)b[0]; break;
    case KP_GGUF_TYPE_UINT16: v->v.u64 = (uint16_t)(b[0] | b[1] << 8); break;
    case KP_GGUF_TYPE_INT16: v->v.i64 = (int16_t)(uint16_t)(b[0] | b[1] << 8); break;
    case KP_GGUF_TYPE_UINT32: v->v.u64 = le32(b); break;
    case KP_GGUF_TYPE_INT32: v->v.i64 = (int32_t)le32(b); break;
    case KP_GGUF_TYPE_UINT64: v->v.u64 = le64(b); break;
    case KP_GGUF_TYPE_INT64: v->v.i64 = (int64_t)le64(b); break;
    case KP_GGUF_TYPE_BOOL: v->v.b = b[0] != 0; break;
    case KP_GGUF_TYPE_FLOAT32: {
        uint32_t u = le32(b);
        float f;
        memcpy(&f, &u, 4);
        v->v.f64 = f;
        break;
    }
    case KP_GGUF_TYPE_FLOAT64: {
        uint64_t u = le64(b);
        memcpy(&v->v.f64, &u, 8);
        break;
    }
    default: break;
    }
}

static void value_free(kp_gguf_value *v) {
    if (v->type != KP_GGUF_TYPE_ARRAY) return;
    free(v->v.arr.strs);
    if (v->v.arr.items) {
        for (uint64_t i = 0; i < v->v.arr.n; i++) value_free(&v->v.arr.items[i]);
        free(v->v.arr.items);
    }
    v->v.arr.strs = NULL;
    v->v.arr.items = NULL;
}

static kp_status read_value(cursor *c, kp_gguf_type t, kp_gguf_value *v, int depth, const char *key);

static kp_status read_array(cursor *c, kp_gguf_value *v, int depth, const char *key) {
    uint32_t et;
    uint64_t n;
    kp_status st;
    v->type = KP_GGUF_TYPE_ARRAY;
    memset(&v->v.arr, 0, sizeof v->v.arr);
    if ((st = cur_u32(c, &et, "array element type")) != KP_OK) return st;
    if ((st = cur_u64(c, &n, "array length")) != KP_OK) return st;
    if (et >= KP_GGUF_TYPE_COUNT_)
        return kp_fail(c->err, KP_EFORMAT, "%s: key '%s': unknown array element type %u", c->name,
                       key, et);
    if (depth >= GGUF_MAX_DEPTH)
        return kp_fail(c->err, KP_EFORMAT, "%s: key '%s': arrays nested deeper than %d levels",
                       c->name, key, GGUF_MAX_DEPTH);
    v->v.arr.elem_type = (kp_gguf_type)et;
    size_t es = kp_gguf_type_size((kp_gguf_type)et);
    /* smallest encoded element: fixed size, 8 (string length), 12 (array header) */
    size_t min_elem = es ? es : (et == KP_GGUF_TYPE_STRING ? 8 : 12);
    if (n > cur_left(c) / min_elem)
        return kp_fail(c->err, KP_EFORMAT,
                       "%s: key '%s': array of %llu %s elements does not fit in the %zu bytes left",
                       c->name, key, (unsigned long long)n, kp_gguf_type_name((kp_gguf_type)et),
                       cur_left(c));
    v->v.arr.n = n;
    if (es) {
        const uint8_t *b = NULL;
        cur_take(c, (size_t)n * es, &b, "array data");
        v->v.arr.raw = b;
        return KP_OK;
    }
    if (et == KP_GGUF_TYPE_STRING) {
        v->v.arr.strs = n ? malloc((size_t)n * sizeof(kp_gguf_str)) : NULL;
        if (n && !v->v.arr.strs)
            return kp_fail(c->err, KP_ENOMEM, "%s: out of memory for array '%s'", c->name, key);
        for (uint64_t i = 0; i < n; i++)
            if ((st = cur_str(c, &v->v.arr.strs[i], "array string")) != KP_OK) return st;
        return KP_OK;
    }
    /* nested arrays */
    v->v.arr.items = n ? calloc((size_t)n, sizeof(kp_gguf_value)) : NULL;
    if (n && !v->v.arr.items)
        return kp_fail(c->err, KP_ENOMEM, "%s: out of memory for array '%s'", c->name, key);
    for (uint64_t i = 0; i < n; i++) {
        v->v.arr.items[i].type = KP_GGUF_TYPE_ARRAY;
        if ((st = read_array(c, &v->v.arr.items[i], depth + 1, key)) != KP_OK) return st;
    }
    return KP_OK;
}

static kp_status read_value(cursor *c, kp_gguf_type t, kp_gguf_value *v, int depth, const char *key) {
    v->type = t;
    if (t == KP_GGUF_TYPE_STRING) return cur_str(c, &v->v.str, "string value");
    if (t == KP_GGUF_TYPE_ARRAY) return read_array(c, v, depth, key);
    size_t es = kp_gguf_type_size(t);
    if (!es)
        return kp_fail(c->err, KP_EFORMAT, "%s: key '%s': unknown value type %u", c->name, key,
                       (unsigned)t);
    const uint8_t *b = NULL;
    kp_status st = cur_take(c, es, &b, "scalar value");
    if (st == KP_OK) decode_scalar(t, b, v);
    return st;
}

/* Copies a kp_gguf_str into a printable, NUL-terminated, truncated buffer for messages. */
static const char *printable(kp_gguf_str s, char *buf, size_t cap) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.data[i];
        buf[i] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    buf[n] = 0;
    return buf;
}

static int str_cmp(kp_gguf_str a, kp_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int r = n ? memcmp(a.data, b.data, n) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

static int kv_ptr_cmp(const void *a, const void *b) {
    return str_cmp((*(kp_gguf_kv *const *)a)->key, (*(kp_gguf_kv *const *)b)->key);
}
static int tensor_ptr_cmp(const void *a, const void *b) {
    return str_cmp((*(kp_gguf_tensor *const *)a)->name, (*(kp_gguf_tensor *const *)b)->name);
}
static int tensor_off_cmp(const void *a, const void *b) {
    uint64_t x = (*(kp_gguf_tensor *const *)a)->offset, y = (*(kp_gguf_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

bool kp_gguf_str_eq(kp_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

static kp_status parse_kvs(kp_gguf *g, cursor *c, uint64_t n_kv) {
    kp_status st;
    char kbuf[96];
    /* each KV needs at least 8 (key len) + 4 (type) + 1 (smallest value) bytes */
    if (n_kv > cur_left(c) / 13)
        return kp_fail(c->err, KP_EFORMAT, "%s: header claims %llu metadata keys, more than fit in the file",
                       g->name, (unsigned long long)n_kv);
    g->kvs = n_kv ? calloc((size_t)n_kv, sizeof(kp_gguf_kv)) : NULL;
    g->kv_sorted = n_kv ? malloc((size_t)n_kv * sizeof(kp_gguf_kv *)) : NULL;
    if (n_kv && (!g->kvs || !g->kv_sorted))
        return kp_fail(c->err, KP_ENOMEM, "%s: out of memory for %llu keys", g->name,
                       (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        kp_gguf_kv *kv = &g->kvs[i];
        uint32_t t;
        g->n_kv = (size_t)i + 1; /* so value_free sees what was decoded */
        if ((st = cur_str(c, &kv->key, "metadata key")) != KP_OK) return st;
        printable(kv->key, kbuf, sizeof kbuf);
        if ((st = cur_u32(c, &t, "metadata value type")) != KP_OK) return st;
        if (t >= KP_GGUF_TYPE_COUNT_)
            return kp_fail(c->err, KP_EFORMAT, "%s: key '%s' has unknown value type %u", g->name,
                           kbuf, t);
        if ((st = read_value(c, (kp_gguf_type)t, &kv->value, 0, kbuf)) != KP_OK) return st;
        g->kv_sorted[i] = kv;
    }
    if (n_kv) qsort(g->kv_sorted, (size_t)n_kv, sizeof(kp_gguf_kv *), kv_ptr_cmp);
    for (uint64_t i = 1; i < n_kv; i++)
        if (str_cmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key) == 0)
            return kp_fail(c->err, KP_EFORMAT, "%s: duplicate metadata key '%s'", g->name,
                           printable(g->kv_sorted[i]->key, kbuf, sizeof kbuf));
    return KP_OK;
}

static kp_status parse_alignment(kp_gguf *g, kp_error *err) {
    g->alignment = KP_GGUF_DEFAULT_ALIGNMENT;
    const kp_gguf_kv *kv = kp_gguf_find(g, "general.alignment");
    if (!kv) return KP_OK;
    if (kv->value.type != KP_GGUF_TYPE_UINT32)
        return kp_fail(err, KP_EFORMAT, "%s: general.alignment must be a u32, found %s", g->name,
                       kp_gguf_type_name(kv->value.type));
    uint64_t a = kv->value.v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return kp_fail(err, KP_EFORMAT, "%s: general.alignment %llu is not a power of two",
                       g->name, (unsigned long long)a);
    g->alignment = (uint32_t)a;
    return KP_OK;
}

static kp_status parse_tensor_info(kp_gguf *g, cursor *c, kp_gguf_tensor *t) {
    kp_status st;
    char nbuf[96];
    if ((st = cur_str(c, &t->name, "tensor name")) != KP_OK) return st;
    printable(t->name, nbuf, sizeof nbuf);
    if ((st = cur_u32(c, &t->n_dims, "tensor n_dims")) != KP_OK) return st;
    if (t->n_dims == 0 || t->n_dims > KP_GGUF_MAX_DIMS)
        return kp_fail(c->err, KP_EFORMAT, "%s: tensor '%s' has %u dimensions (1..%d allowed)",
                       g->name, nbuf, t->n_dims, KP_GGUF_MAX_DIMS);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < KP_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((st = cur_u64(c, &ne, "tensor dimension")) != KP_OK) return st;
        if (ne == 0)
            return kp_fail(c->err, KP_EFORMAT, "%s: tensor '%s' has a dimension of zero (dim %u)",
                           g->name, nbuf, d);
        if (ne > (uint64_t)INT64_MAX || n_el > (uint64_t)INT64_MAX / ne)
            return kp_fail(c->err, KP_EFORMAT, "%s: tensor '%s': element count overflows",
                           g->name, nbuf);
        n_el *= ne;
        t->ne[d] = (int64_t)ne;
    }
    if ((st = cur_u32(c, &t->type, "tensor type")) != KP_OK) return st;
    const kp_dtype_info *ti = kp_dtype_get(t->type);
    if (!ti)
        return kp_fail(c->err, KP_EFORMAT, "%s: tensor '%s' has unknown type %u", g->name, nbuf,
                       t->type);
    if (t->ne[0] % ti->block_size != 0)
        return kp_fail(c->err, KP_EFORMAT,
                       "%s: tensor '%s' row length %lld is not a multiple of the %s block size %u",
                       g->name, nbuf, (long long)t->ne[0], ti->name, ti->block_size);
    if ((st = cur_u64(c, &t->offset, "tensor offset")) != KP_OK) return st;
    t->n_elements = n_el;
    uint64_t blocks = n_el / ti->block_size;
    if (blocks > UINT64_MAX / ti->type_size)
        return kp_fail(c->err, KP_EFORMAT, "%s: tensor '%s': byte size overflows", g->name, nbuf);
    t->n_bytes = blocks * ti->type_size;
    return KP_OK;
}

static kp_status parse_tensors(kp_gguf *g, cursor *c, uint64_t n_tensors) {
    kp_status st;
    char nbuf[96];
    /* each tensor info needs at least 8 + 4 + 8 + 4 + 8 bytes */
    if (n_tensors > cur_left(c) / 32)
        return kp_fail(c->err, KP_EFORMAT, "%s: header claims %llu tensors, more than fit in the file",
                       g->name, (unsigned long long)n_tensors);
    g->tensors = n_tensors ? calloc((size_t)n_tensors, sizeof(kp_gguf_tensor)) : NULL;
    g->tensor_sorted = n_tensors ? malloc((size_t)n_tensors * sizeof(kp_gguf_tensor *)) : NULL;
    if (n_tensors && (!g->tensors || !g->tensor_sorted))
        return kp_fail(c->err, KP_ENOMEM, "%s: out of memory for %llu tensors", g->name,
                       (unsigned long long)n_tensors);
    g->n_tensors = (size_t)n_tensors;
    for (size_t i = 0; i < g->n_tensors; i++) {
        if ((st = parse_tensor_info(g, c, &g->tensors[i])) != KP_OK) return st;
        g->tensor_sorted[i] = &g->tensors[i];
    }
    if (g->n_tensors == 0) {
        g->data_offset = c->pos;
        return KP_OK;
    }
    uint64_t pos = c->pos, a = g->alignment;
    g->data_offset = (pos + a - 1) / a * a;
    if (g->data_offset > g->size)
        return kp_fail(c->err, KP_EFORMAT, "%s: truncated file: tensor data section starts at %llu past the end (%zu bytes)",
                       g->name, (unsigned long long)g->data_offset, g->size);
    uint64_t data_size = g->size - g->data_offset;
    for (size_t i = 0; i < g->n_tensors; i++) {
        kp_gguf_tensor *t = &g->tensors[i];
        printable(t->name, nbuf, sizeof nbuf);
        if (t->offset % a != 0)
            return kp_fail(c->err, KP_EFORMAT, "%s: tensor '%s' offset %llu is not a multiple of the alignment %u",
                           g->name, nbuf, (unsigned long long)t->offset, g->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset)
            return kp_fail(c->err, KP_EFORMAT,
                           "%s: tensor '%s' data (offset %llu, %llu bytes) lies outside the file (data section %llu bytes)",
                           g->name, nbuf, (unsigned long long)t->offset,
                           (unsigned long long)t->n_bytes, (unsigned long long)data_size);
        t->data = g->base + g->data_offset + t->offset;
    }
    qsort(g->tensor_sorted, g->n_tensors, sizeof(kp_gguf_tensor *), tensor_ptr_cmp);
    for (size_t i = 1; i < g->n_tensors; i++)
        if (str_cmp(g->tensor_sorted[i - 1]->name, g->tensor_sorted[i]->name) == 0)
            return kp_fail(c->err, KP_EFORMAT, "%s: duplicate tensor name '%s'", g->name,
                           printable(g->tensor_sorted[i]->name, nbuf, sizeof nbuf));
    /* overlap check on a temporary offset-sorted view */
    kp_gguf_tensor **by_off = malloc(g->n_tensors * sizeof(kp_gguf_tensor *));
    if (!by_off) return kp_fail(c->err, KP_ENOMEM, "%s: out of memory", g->name);
    for (size_t i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
    qsort(by_off, g->n_tensors, sizeof(kp_gguf_tensor *), tensor_off_cmp);
    st = KP_OK;
    for (size_t i = 1; i < g->n_tensors; i++) {
        const kp_gguf_tensor *p = by_off[i - 1], *t = by_off[i];
        if (t->offset < p->offset + p->n_bytes) {
            char pbuf[96];
            st = kp_fail(c->err, KP_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                         g->name, printable(p->name, pbuf, sizeof pbuf),
                         printable(t->name, nbuf, sizeof nbuf));
            break;
        }
    }
    free(by_off);
    return st;
}

static kp_status parse(kp_gguf *g, kp_error *err) {
    cursor c = {g->base, g->size, 0, g->name, err};
    const uint8_t *magic;
    uint64_t n_tensors, n_kv;
    kp_status st;
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        if (g->size < 4) return kp_fail(err, KP_EFORMAT, "%s: not a GGUF file (only %zu bytes)", g->name, g->size);
        return kp_fail(err, KP_EFORMAT, "%s: not a GGUF file (bad magic %02x %02x %02x %02x)",
                       g->name, g->base[0], g->base[1], g->base[2], g->base[3]);
    }
    cur_take(&c, 4, &magic, "magic");
    if ((st = cur_u32(&c, &g->version, "version")) != KP_OK) return st;
    if (g->version != 2 && g->version != 3)
        return kp_fail(err, KP_EUNSUPPORTED, "%s: unsupported GGUF version %u (2 and 3 are supported)",
                       g->name, g->version);
    if ((st = cur_u64(&c, &n_tensors, "tensor count")) != KP_OK) return st;
    if ((st = cur_u64(&c, &n_kv, "metadata count")) != KP_OK) return st;
    if ((st = parse_kvs(g, &c, n_kv)) != KP_OK) return st;
    if ((st = parse_alignment(g, err)) != KP_OK) return st;
    return parse_tensors(g, &c, n_tensors);
}

static kp_status gguf_new(kp_gguf **out, const char *name, kp_error *err) {
    kp_gguf *g = calloc(1, sizeof *g);
    if (g) g->name = strdup(name ? name : "(memory)");
    if (!g || !g->name) {
        free(g);
        return kp_fail(err, KP_ENOMEM, "out of memory opening %s", name ? name : "(memory)");
    }
    *out = g;
    return KP_OK;
}

kp_status kp_gguf_open_memory(kp_gguf **out, const void *data, size_t size, const char *name,
                           kp_error *err) {
    kp_gguf *g;
    *out = NULL;
    kp_status st = gguf_new(&g, name, err);
    if (st != KP_OK) return st;
    g->base = data;
    g->size = size;
    if (!data && size) {
        kp_gguf_close(g);
        return kp_fail(err, KP_EINVAL, "%s: NULL buffer", name ? name : "(memory)");
    }
    if ((st = parse(g, err)) != KP_OK) {
        kp_gguf_close(g);
        return st;
    }
    *out = g;
    return KP_OK;
}

kp_status kp_gguf_open(kp_gguf **out, const char *path, kp_error *err) {
    kp_gguf *g;
    struct stat sb;
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
     * below as not a regular file. The flag does not affect regular files. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return kp_fail(err, KP_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kp_fail(err, KP_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kp_fail(err, KP_EIO, "%s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return kp_fail(err, KP_EFORMAT, "%s: not a GGUF file (empty)", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return kp_fail(err, KP_EIO, "%s: cannot mmap: %s", path, strerror(e));
    kp_status st = gguf_new(&g, path, err);
    if (st != KP_OK) {
        munmap(map, (size_t)sb.st_size);
        return st;
    }
    g->base = map;
    g->size = (size_t)sb.st_size;
    g->mapped = true;
    if ((st = parse(g, err)) != KP_OK) {
        kp_gguf_close(g);
        return st;
    }
    *out = g;
    return KP_OK;
}

void kp_gguf_close(kp_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) value_free(&g->kvs[i].value);
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->tensor_sorted);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->name);
    free(g);
}

uint32_t kp_gguf_version(const kp_gguf *g) { return g->version; }
const char *kp_gguf_path(const kp_gguf *g) { return g->name; }
uint64_t kp_gguf_file_size(const kp_gguf *g) { return g->size; }
uint32_t kp_gguf_alignment(const kp_gguf *g) { return g->alignment; }
uint64_t kp_gguf_data_offset(const kp_gguf *g) { return g->data_offset; }
size_t kp_gguf_n_kv(const kp_gguf *g) { return g->n_kv; }
const kp_gguf_kv *kp_gguf_kv_at(const kp_gguf *g, size_t i) { return i < g->n_kv ? &g->kvs[i] : NULL; }
size_t kp_gguf_n_tensors(const kp_gguf *g) { return g->n_tensors; }
const kp_gguf_tensor *kp_gguf_tensor_at(const kp_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kp_gguf_kv *kp_gguf_find(const kp_gguf *g, const char *key) {
    kp_gguf_str k = {key, strlen(key)};
    size_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(g->kv_sorted[mid]->key, k);
        if (r == 0) return g->kv_sorted[mid];
        if (r < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const kp_gguf_tensor *kp_gguf_find_tensor(const kp_gguf *g, const char *name) {
    kp_gguf_str k = {name, strlen(name)};
    size_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(g->tensor_sorted[mid]->name, k);
        if (r == 0) return g->tensor_sorted[mid];
        if (r < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

static bool is_unsigned(kp_gguf_type t) {
    return t == KP_GGUF_TYPE_UINT8 || t == KP_GGUF_TYPE_UINT16 || t == KP_GGUF_TYPE_UINT32 ||
           t == KP_GGUF_TYPE_UINT64;
}
static bool is_signed(kp_gguf_type t) {
    return t == KP_GGUF_TYPE_INT8 || t == KP_GGUF_TYPE_INT16 || t == KP_GGUF_TYPE_INT32 ||
           t == KP_GGUF_TYPE_INT64;
}

/* Reads an integer key as a value in [min, max]; the widened value lands in *out. */
static kp_status get_int(const kp_gguf *g, const char *key, int64_t min, uint64_t max, bool *found,
                         uint64_t *as_u, int64_t *as_i, kp_error *err) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    *found = kv != NULL;
    if (!kv) return KP_OK;
    kp_gguf_type t = kv->value.type;
    if (is_unsigned(t)) {
        if (kv->value.v.u64 > max) goto range;
        *as_u = kv->value.v.u64;
        *as_i = (int64_t)kv->value.v.u64;
        return KP_OK;
    }
    if (is_signed(t)) {
        int64_t v = kv->value.v.i64;
        if (v < min || (v >= 0 && (uint64_t)v > max)) goto range;
        *as_i = v;
        *as_u = (uint64_t)v;
        return KP_OK;
    }
    return kp_fail(err, KP_EFORMAT, "%s: key '%s' should be an integer, found %s", g->name, key,
                   kp_gguf_type_name(t));
range:
    return kp_fail(err, KP_EFORMAT, "%s: key '%s' value is out of range", g->name, key);
}

kp_status kp_gguf_get_u32(const kp_gguf *g, const char *key, uint32_t def, uint32_t *out, kp_error *err) {
    bool found;
    uint64_t u = 0;
    int64_t i = 0;
    kp_status st = get_int(g, key, 0, UINT32_MAX, &found, &u, &i, err);
    if (st == KP_OK) *out = found ? (uint32_t)u : def;
    return st;
}

kp_status kp_gguf_get_i32(const kp_gguf *g, const char *key, int32_t def, int32_t *out, kp_error *err) {
    bool found;
    uint64_t u = 0;
    int64_t i = 0;
    kp_status st = get_int(g, key, INT32_MIN, INT32_MAX, &found, &u, &i, err);
    if (st == KP_OK) *out = found ? (int32_t)i : def;
    return st;
}

kp_status kp_gguf_get_u64(const kp_gguf *g, const char *key, uint64_t def, uint64_t *out, kp_error *err) {
    bool found;
    uint64_t u = 0;
    int64_t i = 0;
    kp_status st = get_int(g, key, 0, UINT64_MAX, &found, &u, &i, err);
    if (st == KP_OK) *out = found ? u : def;
    return st;
}

kp_status kp_gguf_get_f32(const kp_gguf *g, const char *key, float def, float *out, kp_error *err) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    if (!kv) {
        *out = def;
        return KP_OK;
    }
    if (kv->value.type != KP_GGUF_TYPE_FLOAT32 && kv->value.type != KP_GGUF_TYPE_FLOAT64)
        return kp_fail(err, KP_EFORMAT, "%s: key '%s' should be a float, found %s", g->name, key,
                       kp_gguf_type_name(kv->value.type));
    *out = (float)kv->value.v.f64;
    return KP_OK;
}

kp_status kp_gguf_get_bool(const kp_gguf *g, const char *key, bool def, bool *out, kp_error *err) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    if (!kv) {
        *out = def;
        return KP_OK;
    }
    if (kv->value.type != KP_GGUF_TYPE_BOOL)
        return kp_fail(err, KP_EFORMAT, "%s: key '%s' should be a bool, found %s", g->name, key,
                       kp_gguf_type_name(kv->value.type));
    *out = kv->value.v.b;
    return KP_OK;
}

kp_status kp_gguf_get_str(const kp_gguf *g, const char *key, kp_gguf_str *out, kp_error *err) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    out->data = NULL;
    out->len = 0;
    if (!kv) return KP_OK;
    if (kv->value.type != KP_GGUF_TYPE_STRING)
        return kp_fail(err, KP_EFORMAT, "%s: key '%s' should be a string, found %s", g->name, key,
                       kp_gguf_type_name(kv->value.type));
    *out = kv->value.v.str;
    return KP_OK;
}

kp_status kp_gguf_get_arr(const kp_gguf *g, const char *key, kp_gguf_type elem_type, const kp_gguf_value **out,
                       kp_error *err) {
    const kp_gguf_kv *kv = kp_gguf_find(g, key);
    *out = NULL;
    if (!kv) return KP_OK;
    if (kv->value.type != KP_GGUF_TYPE_ARRAY || kv->value.v.arr.elem_type != elem_type)
        return kp_fail(err, KP_EFORMAT, "%s: key '%s' should be an array of %s, found %s%s%s",
                       g->name, key, kp_gguf_type_name(elem_type), kp_gguf_type_name(kv->value.type),
                       kv->value.type == KP_GGUF_TYPE_ARRAY ? " of " : "",
                       kv->value.type == KP_GGUF_TYPE_ARRAY ? kp_gguf_type_name(kv->value.v.arr.elem_type) : "");
    *out = &kv->value;
    return KP_OK;
}

/* A float as int64 without undefined behaviour: truncates toward zero, a
 * value outside the int64 range saturates, NaN gives 0 (file bytes decide
 * these values, and a plain cast of 1e30 or NaN is undefined in C). */
static int64_t f64_to_i64(double d) {
    if (d != d) return 0;
    if (d >= 9223372036854775808.0) return INT64_MAX;
    if (d < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)d;
}

int64_t kp_gguf_arr_i64(const kp_gguf_value *arr, uint64_t i) {
    kp_gguf_value v;
    size_t es = kp_gguf_type_size(arr->v.arr.elem_type);
    decode_scalar(arr->v.arr.elem_type, arr->v.arr.raw + i * es, &v);
    switch (v.type) {
    case KP_GGUF_TYPE_FLOAT32: case KP_GGUF_TYPE_FLOAT64: return f64_to_i64(v.v.f64);
    case KP_GGUF_TYPE_BOOL: return v.v.b;
    default: return is_unsigned(v.type) ? (int64_t)v.v.u64 : v.v.i64;
    }
}

double kp_gguf_arr_f64(const kp_gguf_value *arr, uint64_t i) {
    kp_gguf_value v;
    size_t es = kp_gguf_type_size(arr->v.arr.elem_type);
    decode_scalar(arr->v.arr.elem_type, arr->v.arr.raw + i * es, &v);
    switch (v.type) {
    case KP_GGUF_TYPE_FLOAT32: case KP_GGUF_TYPE_FLOAT64: return v.v.f64;
    case KP_GGUF_TYPE_BOOL: return v.v.b;
    default: return is_unsigned(v.type) ? (double)v.v.u64 : (double)v.v.i64;
    }
}
