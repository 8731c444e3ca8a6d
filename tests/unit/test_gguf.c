/*
 * test_gguf.c - tests of the GGUF reader (src/gguf.c).
 *
 * What it owns: a small in-memory GGUF writer (the `gb_*` byte builder
 * below) used to forge valid and corrupt files, and the tests:
 *
 *   valid files     v2 and v3; every value type; arrays of every scalar type,
 *                   of strings, nested arrays (8 levels accepted, 9 refused);
 *                   typed lookups and their defaults; general.alignment;
 *                   zero-tensor files that end right after the metadata;
 *                   tensor views for F32, F16, Q8_0, Q4_K and a 4-d tensor;
 *   real file       stories260K.gguf (tests/data/ or models/): header facts from
 *                   models/SOURCES.md, and a byte-exact re-encoding of its
 *                   whole header from what the reader decoded;
 *   corrupt files   a table of forged files, each with the expected status
 *                   and message, parsed both from memory and from disk; the
 *                   message must name the file;
 *   truncation      every prefix of four valid files fails cleanly;
 *   mutation        every single-bit flip of two valid files plus thousands
 *                   of seeded random multi-byte mutants: KP_OK with sane
 *                   tensor views, or a clean error naming the file;
 *   regressions     every file in tests/data/gguf_regress/ (inputs that once
 *                   crashed a fuzzer build) parses cleanly.
 *
 * Byte buffers handed to the reader are heap blocks of exactly the file's
 * size, so AddressSanitizer reports any read past the end of the "file".
 * Under ASan the program caps single allocations at 64 MiB (see
 * __asan_default_options): a forged count that slipped past the reader's
 * checks would make it abort instead of quietly reserving gigabytes.
 *
 * `test_gguf --write-seeds DIR` writes the fuzzer's seed files (fuzz/seeds-gguf/)
 * from the same builder; see fuzz/README.md.
 *
 * Builder layout reminders (little-endian throughout):
 *
 *   header  "GGUF" | version u32 | n_tensors u64 | n_kv u64       (24 bytes)
 *   kv      key: u64 len + bytes | type u32 | value
 *   array   elem_type u32 | n u64 | n elements
 *   tensor  name: str | n_dims u32 | ne u64 x n_dims | type u32 | offset u64
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gguf/dtype.h"
#include "gguf/gguf.h"
#include "harness.h"

/* Under AddressSanitizer: any single allocation above 64 MiB aborts the test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "max_allocation_size_mb=64"; }

/* ---------------------------------------------------------------- builder */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} gb;

static void gb_put(gb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) {
            fprintf(stderr, "test_gguf: out of memory\n");
            exit(2);
        }
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void gb_free(gb *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

static void gb_u8(gb *b, uint8_t v) { gb_put(b, &v, 1); }
static void gb_u16(gb *b, uint16_t v) {
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    gb_put(b, x, 2);
}
static void gb_u32(gb *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, 4);
}
static void gb_u64(gb *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, 8);
}
static void gb_f32(gb *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    gb_u32(b, u);
}
static void gb_f64(gb *b, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    gb_u64(b, u);
}
static void gb_strn(gb *b, const char *s, size_t n) {
    gb_u64(b, n);
    gb_put(b, s, n);
}
static void gb_str(gb *b, const char *s) { gb_strn(b, s, strlen(s)); }
static void gb_fill(gb *b, size_t n, uint8_t byte) {
    for (size_t i = 0; i < n; i++) gb_u8(b, byte);
}
static void gb_pad(gb *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}
static void gb_set_u32(gb *b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}
static void gb_set_u64(gb *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}

static void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
/* A key and its value type; the caller writes the value. */
static void gb_key(gb *b, const char *key, kp_gguf_type t) {
    gb_str(b, key);
    gb_u32(b, (uint32_t)t);
}
/* A key of type ARRAY and the array header; the caller writes n elements. */
static void gb_arr(gb *b, const char *key, kp_gguf_type elem, uint64_t n) {
    gb_key(b, key, KP_GGUF_TYPE_ARRAY);
    gb_u32(b, (uint32_t)elem);
    gb_u64(b, n);
}
static void gb_kv_u32(gb *b, const char *key, uint32_t v) {
    gb_key(b, key, KP_GGUF_TYPE_UINT32);
    gb_u32(b, v);
}
static void gb_kv_str(gb *b, const char *key, const char *v) {
    gb_key(b, key, KP_GGUF_TYPE_STRING);
    gb_str(b, v);
}
static void gb_tensor(gb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gb_u64(b, ne[d]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
/* `levels` arrays nested in one another; the innermost holds one u8 (7). */
static void gb_nested(gb *b, const char *key, int levels) {
    gb_key(b, key, KP_GGUF_TYPE_ARRAY);
    for (int i = 0; i < levels - 1; i++) {
        gb_u32(b, KP_GGUF_TYPE_ARRAY);
        gb_u64(b, 1);
    }
    gb_u32(b, KP_GGUF_TYPE_UINT8);
    gb_u64(b, 1);
    gb_u8(b, 7);
}

/* A heap copy of exactly the file's bytes (ASan sees any over-read). */
static uint8_t *exact_copy(const uint8_t *p, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    if (!c) exit(2);
    if (n) memcpy(c, p, n);
    return c;
}

/* ------------------------------------------------------------ valid files */

/*
 * The small valid file used for truncation, mutation and seeds (~500 bytes):
 * 9 KVs of assorted types, 3 tensors, and the last tensor's data ends exactly
 * at the end of the file, so every proper prefix is invalid.
 *
 *   tensor  type  ne      offset  bytes
 *   a       F32   [4,2]   0       32
 *   b       F16   [8]     32      16
 *   c       Q8_0  [32]    64      34   (one 34-byte block) -> file ends
 */
static void make_small(gb *b, uint32_t version) {
    static const uint64_t ne_a[] = {4, 2}, ne_b[] = {8}, ne_c[] = {32};
    gb_header(b, version, 3, 9);
    gb_kv_str(b, "general.architecture", "llama");
    gb_kv_u32(b, "llama.block_count", 2);
    gb_key(b, "llama.rope.freq_base", KP_GGUF_TYPE_FLOAT32);
    gb_f32(b, 10000.0f);
    gb_arr(b, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, 3);
    gb_str(b, "<unk>");
    gb_str(b, "a");
    gb_str(b, "bc");
    gb_arr(b, "tokenizer.ggml.scores", KP_GGUF_TYPE_FLOAT32, 3);
    gb_f32(b, 0.0f);
    gb_f32(b, -1.0f);
    gb_f32(b, -2.0f);
    gb_arr(b, "tokenizer.ggml.token_type", KP_GGUF_TYPE_INT32, 3);
    gb_u32(b, 2);
    gb_u32(b, 1);
    gb_u32(b, 1);
    gb_arr(b, "test.nested", KP_GGUF_TYPE_ARRAY, 2);
    gb_u32(b, KP_GGUF_TYPE_UINT8);
    gb_u64(b, 2);
    gb_u8(b, 1);
    gb_u8(b, 2);
    gb_u32(b, KP_GGUF_TYPE_INT16);
    gb_u64(b, 1);
    gb_u16(b, (uint16_t)-3);
    gb_key(b, "tokenizer.ggml.add_bos_token", KP_GGUF_TYPE_BOOL);
    gb_u8(b, 1);
    gb_key(b, "test.f64", KP_GGUF_TYPE_FLOAT64);
    gb_f64(b, 0.25);
    gb_tensor(b, "a", 2, ne_a, KP_DTYPE_F32, 0);
    gb_tensor(b, "b", 1, ne_b, KP_DTYPE_F16, 32);
    gb_tensor(b, "c", 1, ne_c, KP_DTYPE_Q8_0, 64);
    gb_pad(b, 32);
    gb_fill(b, 32, 0xA1);
    gb_fill(b, 16, 0xB2);
    gb_fill(b, 16, 0x00);
    gb_fill(b, 34, 0xC3);
}

/* A zero-tensor file like the llama.cpp vocab files: no padding at the end. */
static void make_vocab_like(gb *b) {
    gb_header(b, 3, 0, 5);
    gb_kv_str(b, "general.architecture", "llama");
    gb_kv_str(b, "tokenizer.ggml.model", "gpt2");
    gb_arr(b, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, 4);
    gb_str(b, "a");
    gb_str(b, "b");
    gb_str(b, "ab");
    gb_str(b, "\xc4\xa0");
    gb_arr(b, "tokenizer.ggml.merges", KP_GGUF_TYPE_STRING, 1);
    gb_str(b, "a b");
    gb_kv_u32(b, "tokenizer.ggml.bos_token_id", 0);
}

/* Every value type, every array element type, nesting, custom alignment 64,
 * and tensors of the main weight types (used by tests and as a seed). */
static void make_all_types(gb *b) {
    static const uint64_t ne_f32[] = {4, 3}, ne_f16[] = {8, 2}, ne_q8[] = {64, 2},
                          ne_q4k[] = {256, 2}, ne_4d[] = {2, 3, 4, 5};
    gb_header(b, 3, 5, 31);
    gb_kv_u32(b, "general.alignment", 64);
    gb_key(b, "t.u8", KP_GGUF_TYPE_UINT8);
    gb_u8(b, 200);
    gb_key(b, "t.i8", KP_GGUF_TYPE_INT8);
    gb_u8(b, (uint8_t)-100);
    gb_key(b, "t.u16", KP_GGUF_TYPE_UINT16);
    gb_u16(b, 60000);
    gb_key(b, "t.i16", KP_GGUF_TYPE_INT16);
    gb_u16(b, (uint16_t)-30000);
    gb_kv_u32(b, "t.u32", 4000000000u);
    gb_key(b, "t.i32", KP_GGUF_TYPE_INT32);
    gb_u32(b, (uint32_t)-2000000000);
    gb_key(b, "t.f32", KP_GGUF_TYPE_FLOAT32);
    gb_f32(b, 0.15625f);
    gb_key(b, "t.bool", KP_GGUF_TYPE_BOOL);
    gb_u8(b, 1);
    gb_key(b, "t.bool0", KP_GGUF_TYPE_BOOL);
    gb_u8(b, 0);
    gb_key(b, "t.str", KP_GGUF_TYPE_STRING);
    gb_strn(b, "h\xc3\xa9l\0lo", 7); /* any bytes, including NUL */
    gb_kv_str(b, "t.empty", "");
    gb_key(b, "t.u64", KP_GGUF_TYPE_UINT64);
    gb_u64(b, 0xFEDCBA9876543210ull);
    gb_key(b, "t.i64", KP_GGUF_TYPE_INT64);
    gb_u64(b, (uint64_t)(INT64_MIN + 1));
    gb_key(b, "t.f64", KP_GGUF_TYPE_FLOAT64);
    gb_f64(b, -1.0 / 3.0);
    /* arrays of every fixed-size element type, 3 elements each: min, 0/1, max */
    gb_arr(b, "a.u8", KP_GGUF_TYPE_UINT8, 3);
    gb_u8(b, 0), gb_u8(b, 1), gb_u8(b, 255);
    gb_arr(b, "a.i8", KP_GGUF_TYPE_INT8, 3);
    gb_u8(b, 0x80), gb_u8(b, 0), gb_u8(b, 127);
    gb_arr(b, "a.u16", KP_GGUF_TYPE_UINT16, 3);
    gb_u16(b, 0), gb_u16(b, 1), gb_u16(b, 65535);
    gb_arr(b, "a.i16", KP_GGUF_TYPE_INT16, 3);
    gb_u16(b, 0x8000), gb_u16(b, 0), gb_u16(b, 32767);
    gb_arr(b, "a.u32", KP_GGUF_TYPE_UINT32, 3);
    gb_u32(b, 0), gb_u32(b, 1), gb_u32(b, UINT32_MAX);
    gb_arr(b, "a.i32", KP_GGUF_TYPE_INT32, 3);
    gb_u32(b, 0x80000000u), gb_u32(b, 0), gb_u32(b, INT32_MAX);
    gb_arr(b, "a.u64", KP_GGUF_TYPE_UINT64, 3);
    gb_u64(b, 0), gb_u64(b, 1), gb_u64(b, 1ull << 53);
    gb_arr(b, "a.i64", KP_GGUF_TYPE_INT64, 3);
    gb_u64(b, (uint64_t)INT64_MIN), gb_u64(b, 0), gb_u64(b, INT64_MAX);
    gb_arr(b, "a.f32", KP_GGUF_TYPE_FLOAT32, 3);
    gb_f32(b, -1.5f), gb_f32(b, 0.0f), gb_f32(b, 3.25f);
    gb_arr(b, "a.f64", KP_GGUF_TYPE_FLOAT64, 3);
    gb_f64(b, -0.125), gb_f64(b, 0.0), gb_f64(b, 1e300);
    gb_arr(b, "a.bool", KP_GGUF_TYPE_BOOL, 3);
    gb_u8(b, 1), gb_u8(b, 0), gb_u8(b, 1);
    gb_arr(b, "a.str", KP_GGUF_TYPE_STRING, 3);
    gb_str(b, "x"), gb_str(b, ""), gb_str(b, "yz");
    gb_arr(b, "a.empty", KP_GGUF_TYPE_UINT32, 0);
    /* [[1, 2], [3]] of i32, and [[["p", "q"]], []] of strings */
    gb_arr(b, "a.nested", KP_GGUF_TYPE_ARRAY, 2);
    gb_u32(b, KP_GGUF_TYPE_INT32), gb_u64(b, 2), gb_u32(b, 1), gb_u32(b, 2);
    gb_u32(b, KP_GGUF_TYPE_INT32), gb_u64(b, 1), gb_u32(b, 3);
    gb_arr(b, "a.nested3", KP_GGUF_TYPE_ARRAY, 2);
    gb_u32(b, KP_GGUF_TYPE_ARRAY), gb_u64(b, 1);
    gb_u32(b, KP_GGUF_TYPE_STRING), gb_u64(b, 2), gb_str(b, "p"), gb_str(b, "q");
    gb_u32(b, KP_GGUF_TYPE_ARRAY), gb_u64(b, 0);
    gb_nested(b, "a.deep8", 8);
    /* tensors at 64-aligned offsets; sizes per ggml: Q8_0 34 B / 32, Q4_K 144 B / 256 */
    gb_tensor(b, "w.f32", 2, ne_f32, KP_DTYPE_F32, 0);      /* 48 B   */
    gb_tensor(b, "w.f16", 2, ne_f16, KP_DTYPE_F16, 64);     /* 32 B   */
    gb_tensor(b, "w.q8_0", 2, ne_q8, KP_DTYPE_Q8_0, 128);   /* 136 B  */
    gb_tensor(b, "w.q4_k", 2, ne_q4k, KP_DTYPE_Q4_K, 320);  /* 288 B  */
    gb_tensor(b, "w.4d", 4, ne_4d, KP_DTYPE_F32, 640);      /* 480 B  */
    gb_pad(b, 64);
    size_t data = b->n;
    gb_fill(b, 48, 0x01);
    gb_fill(b, 64 - 48, 0xEE); /* gap up to offset 64 */
    gb_fill(b, 32, 0x02);
    gb_fill(b, 128 - 96, 0xEE);
    gb_fill(b, 136, 0x03);
    gb_fill(b, 320 - 264, 0xEE);
    gb_fill(b, 288, 0x04);
    gb_fill(b, 640 - 608, 0xEE);
    gb_fill(b, 480, 0x05);
    if (b->n - data != 1120) {
        fprintf(stderr, "make_all_types: layout error\n");
        exit(2);
    }
}

/* --------------------------------------------------------- walking a file */

static volatile uint64_t walk_sink; /* keeps the reads of a walk observable */

static bool str_ok(kp_gguf_str s, uint64_t *sum) {
    if (!s.data && s.len) return false;
    if (s.len) *sum += (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1];
    return true;
}

/* Reads every element of a value; false if its structure is inconsistent. */
static bool walk_value(const kp_gguf_value *v, int depth, uint64_t *sum) {
    if (depth > 8) return false;
    switch (v->type) {
    case KP_GGUF_TYPE_STRING: return str_ok(v->v.str, sum);
    case KP_GGUF_TYPE_ARRAY: {
        kp_gguf_type et = v->v.arr.elem_type;
        if ((unsigned)et >= KP_GGUF_TYPE_COUNT_) return false;
        if (kp_gguf_type_size(et)) {
            if (!v->v.arr.raw) return false;
            for (uint64_t i = 0; i < v->v.arr.n; i++) {
                *sum += (uint64_t)kp_gguf_arr_i64(v, i);
                double d = kp_gguf_arr_f64(v, i);
                *sum += d == d;
            }
            return true;
        }
        if (et == KP_GGUF_TYPE_STRING) {
            if (v->v.arr.n && !v->v.arr.strs) return false;
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                if (!str_ok(v->v.arr.strs[i], sum)) return false;
            return true;
        }
        if (v->v.arr.n && !v->v.arr.items) return false;
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            if (v->v.arr.items[i].type != KP_GGUF_TYPE_ARRAY ||
                !walk_value(&v->v.arr.items[i], depth + 1, sum))
                return false;
        return true;
    }
    default: return (unsigned)v->type < KP_GGUF_TYPE_COUNT_;
    }
}

/* Walks every KV and tensor of a parsed file over the bytes [base, base+size);
 * false if any tensor view is inconsistent or lies outside the bytes. */
static bool walk_file(const kp_gguf *g, const uint8_t *base, size_t size) {
    uint64_t sum = 0;
    uint32_t a = kp_gguf_alignment(g);
    if (a == 0 || (a & (a - 1)) || kp_gguf_data_offset(g) > size) return false;
    for (size_t i = 0; i < kp_gguf_n_kv(g); i++) {
        const kp_gguf_kv *kv = kp_gguf_kv_at(g, i);
        if (!kv || !str_ok(kv->key, &sum) || !walk_value(&kv->value, 0, &sum)) return false;
    }
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        const kp_dtype_info *ti = t ? kp_dtype_get(t->type) : NULL;
        if (!ti || t->n_dims < 1 || t->n_dims > 4 || t->offset % a) return false;
        uint64_t n_el = 1;
        for (int d = 0; d < 4; d++) {
            if (t->ne[d] < 1 || ((uint32_t)d >= t->n_dims && t->ne[d] != 1)) return false;
            n_el *= (uint64_t)t->ne[d];
        }
        if (n_el != t->n_elements || t->n_bytes != n_el / ti->block_size * ti->type_size)
            return false;
        const uint8_t *p = t->data;
        if (p != base + kp_gguf_data_offset(g) + t->offset || t->n_bytes > size ||
            (size_t)(p - base) > size - t->n_bytes)
            return false;
        sum += p[0] + p[t->n_bytes - 1];
    }
    walk_sink += sum;
    return true;
}

/* Parses an exact-size copy of `bytes`; returns the status. On success the
 * file is walked (walk_ok); on failure the message is checked (clean_error). */
typedef struct {
    kp_status st;
    bool walk_ok;     /* success: the file walked cleanly */
    bool clean_error; /* failure: g NULL, err.code == st, message names the file */
    char msg[KP_ERROR_MSG_MAX];
} parse_result;

static parse_result parse_bytes(const uint8_t *bytes, size_t n, const char *name) {
    parse_result r = {0};
    uint8_t *copy = exact_copy(bytes, n);
    kp_gguf *g = (kp_gguf *)copy; /* must be reset to NULL on failure */
    kp_error err = {0};
    r.st = kp_gguf_open_memory(&g, copy, n, name, &err);
    if (r.st == KP_OK) {
        r.walk_ok = g && walk_file(g, copy, n);
        kp_gguf_close(g);
    } else {
        r.clean_error = g == NULL && err.code == r.st && err.msg[0] && strstr(err.msg, name);
        snprintf(r.msg, sizeof r.msg, "%s", err.msg);
    }
    free(copy);
    return r;
}

/* ----------------------------------------------------------- valid tests */

static void test_versions_and_scalars(void) {
    for (uint32_t version = 2; version <= 3; version++) {
        gb b = {0};
        make_all_types(&b);
        gb_set_u32(&b, 4, version);
        uint8_t *copy = exact_copy(b.p, b.n);
        kp_gguf *g;
        kp_error err = {0};
        CHECK_EQ_INT(kp_gguf_open_memory(&g, copy, b.n, "all.gguf", &err), KP_OK);
        if (!g) {
            fprintf(stderr, "  %s\n", err.msg);
            free(copy);
            gb_free(&b);
            continue;
        }
        CHECK_EQ_INT(kp_gguf_version(g), version);
        CHECK_EQ_STR(kp_gguf_path(g), "all.gguf");
        CHECK_EQ_INT(kp_gguf_file_size(g), b.n);
        CHECK_EQ_INT(kp_gguf_n_kv(g), 31);
        CHECK_EQ_INT(kp_gguf_n_tensors(g), 5);
        CHECK(walk_file(g, copy, b.n));

        /* file order is kept */
        CHECK(kp_gguf_str_eq(kp_gguf_kv_at(g, 0)->key, "general.alignment"));
        CHECK(kp_gguf_str_eq(kp_gguf_kv_at(g, 1)->key, "t.u8"));
        CHECK(kp_gguf_str_eq(kp_gguf_kv_at(g, 30)->key, "a.deep8"));
        CHECK(kp_gguf_kv_at(g, 31) == NULL);

        const kp_gguf_kv *kv;
        CHECK((kv = kp_gguf_find(g, "t.u8")) && kv->value.type == KP_GGUF_TYPE_UINT8 &&
              kv->value.v.u64 == 200);
        CHECK((kv = kp_gguf_find(g, "t.i8")) && kv->value.type == KP_GGUF_TYPE_INT8 &&
              kv->value.v.i64 == -100);
        CHECK((kv = kp_gguf_find(g, "t.u16")) && kv->value.type == KP_GGUF_TYPE_UINT16 &&
              kv->value.v.u64 == 60000);
        CHECK((kv = kp_gguf_find(g, "t.i16")) && kv->value.type == KP_GGUF_TYPE_INT16 &&
              kv->value.v.i64 == -30000);
        CHECK((kv = kp_gguf_find(g, "t.u32")) && kv->value.type == KP_GGUF_TYPE_UINT32 &&
              kv->value.v.u64 == 4000000000u);
        CHECK((kv = kp_gguf_find(g, "t.i32")) && kv->value.type == KP_GGUF_TYPE_INT32 &&
              kv->value.v.i64 == -2000000000);
        CHECK((kv = kp_gguf_find(g, "t.f32")) && kv->value.type == KP_GGUF_TYPE_FLOAT32 &&
              kv->value.v.f64 == 0.15625);
        CHECK((kv = kp_gguf_find(g, "t.bool")) && kv->value.type == KP_GGUF_TYPE_BOOL && kv->value.v.b);
        CHECK((kv = kp_gguf_find(g, "t.bool0")) && kv->value.type == KP_GGUF_TYPE_BOOL && !kv->value.v.b);
        CHECK((kv = kp_gguf_find(g, "t.str")) && kv->value.type == KP_GGUF_TYPE_STRING &&
              kv->value.v.str.len == 7 && memcmp(kv->value.v.str.data, "h\xc3\xa9l\0lo", 7) == 0);
        CHECK((kv = kp_gguf_find(g, "t.empty")) && kv->value.type == KP_GGUF_TYPE_STRING &&
              kv->value.v.str.len == 0 && kp_gguf_str_eq(kv->value.v.str, ""));
        CHECK((kv = kp_gguf_find(g, "t.u64")) && kv->value.type == KP_GGUF_TYPE_UINT64 &&
              kv->value.v.u64 == 0xFEDCBA9876543210ull);
        CHECK((kv = kp_gguf_find(g, "t.i64")) && kv->value.type == KP_GGUF_TYPE_INT64 &&
              kv->value.v.i64 == INT64_MIN + 1);
        CHECK((kv = kp_gguf_find(g, "t.f64")) && kv->value.type == KP_GGUF_TYPE_FLOAT64 &&
              kv->value.v.f64 == -1.0 / 3.0);
        CHECK(kp_gguf_find(g, "t.u") == NULL);
        CHECK(kp_gguf_find(g, "t.u88") == NULL);
        CHECK(kp_gguf_find(g, "") == NULL);
        kp_gguf_close(g);
        free(copy);
        gb_free(&b);
    }
    kp_gguf_close(NULL);
}

static void test_arrays(void) {
    gb b = {0};
    make_all_types(&b);
    uint8_t *copy = exact_copy(b.p, b.n);
    kp_gguf *g;
    kp_error err = {0};
    CHECK_EQ_INT(kp_gguf_open_memory(&g, copy, b.n, "all.gguf", &err), KP_OK);
    if (!g) {
        free(copy);
        gb_free(&b);
        return;
    }
    static const struct {
        const char *key;
        kp_gguf_type et;
        int64_t i[3];
        double f[3];
    } want[] = {
        {"a.u8", KP_GGUF_TYPE_UINT8, {0, 1, 255}, {0, 1, 255}},
        {"a.i8", KP_GGUF_TYPE_INT8, {-128, 0, 127}, {-128, 0, 127}},
        {"a.u16", KP_GGUF_TYPE_UINT16, {0, 1, 65535}, {0, 1, 65535}},
        {"a.i16", KP_GGUF_TYPE_INT16, {-32768, 0, 32767}, {-32768, 0, 32767}},
        {"a.u32", KP_GGUF_TYPE_UINT32, {0, 1, 4294967295ll}, {0, 1, 4294967295.0}},
        {"a.i32", KP_GGUF_TYPE_INT32, {INT32_MIN, 0, INT32_MAX}, {INT32_MIN, 0, INT32_MAX}},
        {"a.u64", KP_GGUF_TYPE_UINT64, {0, 1, 1ll << 53}, {0, 1, 9007199254740992.0}},
        {"a.i64", KP_GGUF_TYPE_INT64, {INT64_MIN, 0, INT64_MAX}, {-9223372036854775808.0, 0, 9223372036854775807.0}},
        {"a.f32", KP_GGUF_TYPE_FLOAT32, {-1, 0, 3}, {-1.5, 0, 3.25}},
        {"a.f64", KP_GGUF_TYPE_FLOAT64, {0, 0, INT64_MAX}, {-0.125, 0, 1e300}},
        {"a.bool", KP_GGUF_TYPE_BOOL, {1, 0, 1}, {1, 0, 1}},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const kp_gguf_value *arr = NULL;
        CHECK_EQ_INT(kp_gguf_get_arr(g, want[k].key, want[k].et, &arr, &err), KP_OK);
        CHECK(arr && arr->type == KP_GGUF_TYPE_ARRAY && arr->v.arr.n == 3);
        if (!arr || arr->v.arr.n != 3) continue;
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(kp_gguf_arr_i64(arr, (uint64_t)i) == want[k].i[i], "%s[%d] = %lld", want[k].key,
                      i, (long long)kp_gguf_arr_i64(arr, (uint64_t)i));
            CHECK_MSG(kp_gguf_arr_f64(arr, (uint64_t)i) == want[k].f[i], "%s[%d] = %g", want[k].key,
                      i, kp_gguf_arr_f64(arr, (uint64_t)i));
        }
    }
    const kp_gguf_value *arr = NULL;
    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.empty", KP_GGUF_TYPE_UINT32, &arr, &err), KP_OK);
    CHECK(arr && arr->v.arr.n == 0);

    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.str", KP_GGUF_TYPE_STRING, &arr, &err), KP_OK);
    CHECK(arr && arr->v.arr.n == 3 && kp_gguf_str_eq(arr->v.arr.strs[0], "x") &&
          kp_gguf_str_eq(arr->v.arr.strs[1], "") && kp_gguf_str_eq(arr->v.arr.strs[2], "yz"));

    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.nested", KP_GGUF_TYPE_ARRAY, &arr, &err), KP_OK);
    CHECK(arr && arr->v.arr.n == 2);
    if (arr && arr->v.arr.n == 2) {
        const kp_gguf_value *x = &arr->v.arr.items[0], *y = &arr->v.arr.items[1];
        CHECK(x->type == KP_GGUF_TYPE_ARRAY && x->v.arr.elem_type == KP_GGUF_TYPE_INT32 &&
              x->v.arr.n == 2 && kp_gguf_arr_i64(x, 0) == 1 && kp_gguf_arr_i64(x, 1) == 2);
        CHECK(y->type == KP_GGUF_TYPE_ARRAY && y->v.arr.elem_type == KP_GGUF_TYPE_INT32 &&
              y->v.arr.n == 1 && kp_gguf_arr_i64(y, 0) == 3);
    }
    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.nested3", KP_GGUF_TYPE_ARRAY, &arr, &err), KP_OK);
    CHECK(arr && arr->v.arr.n == 2);
    if (arr && arr->v.arr.n == 2) {
        const kp_gguf_value *x = &arr->v.arr.items[0];
        CHECK(x->v.arr.elem_type == KP_GGUF_TYPE_ARRAY && x->v.arr.n == 1);
        if (x->v.arr.n == 1) {
            const kp_gguf_value *s = &x->v.arr.items[0];
            CHECK(s->v.arr.elem_type == KP_GGUF_TYPE_STRING && s->v.arr.n == 2 &&
                  kp_gguf_str_eq(s->v.arr.strs[0], "p") && kp_gguf_str_eq(s->v.arr.strs[1], "q"));
        }
        CHECK(arr->v.arr.items[1].v.arr.elem_type == KP_GGUF_TYPE_ARRAY &&
              arr->v.arr.items[1].v.arr.n == 0);
    }
    /* 8 levels of nesting are accepted; the innermost holds one u8 = 7 */
    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.deep8", KP_GGUF_TYPE_ARRAY, &arr, &err), KP_OK);
    int levels = 1;
    while (arr && arr->v.arr.elem_type == KP_GGUF_TYPE_ARRAY && arr->v.arr.n == 1) {
        arr = &arr->v.arr.items[0];
        levels++;
    }
    CHECK_EQ_INT(levels, 8);
    CHECK(arr && arr->v.arr.elem_type == KP_GGUF_TYPE_UINT8 && arr->v.arr.n == 1 &&
          kp_gguf_arr_i64(arr, 0) == 7);

    /* wrong element type, or not an array */
    err.msg[0] = 0;
    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.u8", KP_GGUF_TYPE_INT8, &arr, &err), KP_EFORMAT);
    CHECK(arr == NULL && strstr(err.msg, "all.gguf") && strstr(err.msg, "a.u8") &&
          strstr(err.msg, "array of i8"));
    CHECK_EQ_INT(kp_gguf_get_arr(g, "a.str", KP_GGUF_TYPE_ARRAY, &arr, &err), KP_EFORMAT);
    CHECK_EQ_INT(kp_gguf_get_arr(g, "t.u32", KP_GGUF_TYPE_UINT32, &arr, &err), KP_EFORMAT);
    CHECK(arr == NULL && strstr(err.msg, "t.u32"));
    CHECK_EQ_INT(kp_gguf_get_arr(g, "absent", KP_GGUF_TYPE_UINT32, &arr, &err), KP_OK);
    CHECK(arr == NULL);
    kp_gguf_close(g);
    free(copy);
    gb_free(&b);
}

static void test_lookups(void) {
    gb b = {0};
    make_all_types(&b);
    uint8_t *copy = exact_copy(b.p, b.n);
    kp_gguf *g;
    kp_error err = {0};
    CHECK_EQ_INT(kp_gguf_open_memory(&g, copy, b.n, "look.gguf", &err), KP_OK);
    if (!g) {
        free(copy);
        gb_free(&b);
        return;
    }
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    float f32 = 0;
    bool bo = false;
    kp_gguf_str s = {"x", 1};

    /* absent keys give the default */
    CHECK_EQ_INT(kp_gguf_get_u32(g, "nope", 17, &u32, &err), KP_OK);
    CHECK_EQ_INT(u32, 17);
    CHECK_EQ_INT(kp_gguf_get_i32(g, "nope", -17, &i32, &err), KP_OK);
    CHECK_EQ_INT(i32, -17);
    CHECK_EQ_INT(kp_gguf_get_u64(g, "nope", 1ull << 40, &u64, &err), KP_OK);
    CHECK(u64 == 1ull << 40);
    CHECK_EQ_INT(kp_gguf_get_f32(g, "nope", 2.5f, &f32, &err), KP_OK);
    CHECK(f32 == 2.5f);
    CHECK_EQ_INT(kp_gguf_get_bool(g, "nope", true, &bo, &err), KP_OK);
    CHECK(bo);
    CHECK_EQ_INT(kp_gguf_get_str(g, "nope", &s, &err), KP_OK);
    CHECK(s.data == NULL && s.len == 0);

    /* narrower integers widen when they fit */
    CHECK_EQ_INT(kp_gguf_get_u32(g, "t.u8", 0, &u32, &err), KP_OK);
    CHECK_EQ_INT(u32, 200);
    CHECK_EQ_INT(kp_gguf_get_u32(g, "t.u16", 0, &u32, &err), KP_OK);
    CHECK_EQ_INT(u32, 60000);
    CHECK_EQ_INT(kp_gguf_get_u32(g, "t.u32", 0, &u32, &err), KP_OK);
    CHECK(u32 == 4000000000u);
    CHECK_EQ_INT(kp_gguf_get_u32(g, "general.alignment", 0, &u32, &err), KP_OK);
    CHECK_EQ_INT(u32, 64);
    CHECK_EQ_INT(kp_gguf_get_i32(g, "t.i8", 0, &i32, &err), KP_OK);
    CHECK_EQ_INT(i32, -100);
    CHECK_EQ_INT(kp_gguf_get_i32(g, "t.i16", 0, &i32, &err), KP_OK);
    CHECK_EQ_INT(i32, -30000);
    CHECK_EQ_INT(kp_gguf_get_i32(g, "t.i32", 0, &i32, &err), KP_OK);
    CHECK_EQ_INT(i32, -2000000000);
    CHECK_EQ_INT(kp_gguf_get_i32(g, "t.u16", 0, &i32, &err), KP_OK);
    CHECK_EQ_INT(i32, 60000);
    CHECK_EQ_INT(kp_gguf_get_u64(g, "t.u64", 0, &u64, &err), KP_OK);
    CHECK(u64 == 0xFEDCBA9876543210ull);
    CHECK_EQ_INT(kp_gguf_get_u64(g, "t.u8", 0, &u64, &err), KP_OK);
    CHECK_EQ_INT(u64, 200);

    /* values that do not fit, and wrong types: KP_EFORMAT naming file and key;
     * the output keeps its previous value */
    static const struct {
        const char *key, *what;
    } bad_u32[] = {{"t.i8", "out of range"},  {"t.i32", "out of range"},
                   {"t.u64", "out of range"}, {"t.i64", "out of range"},
                   {"t.str", "integer"},      {"t.f32", "integer"},
                   {"t.bool", "integer"},     {"a.u32", "integer"}};
    for (size_t i = 0; i < sizeof bad_u32 / sizeof bad_u32[0]; i++) {
        u32 = 12345;
        err.msg[0] = 0;
        CHECK_EQ_INT(kp_gguf_get_u32(g, bad_u32[i].key, 0, &u32, &err), KP_EFORMAT);
        CHECK_EQ_INT(u32, 12345);
        CHECK_MSG(strstr(err.msg, "look.gguf") && strstr(err.msg, bad_u32[i].key) &&
                      strstr(err.msg, bad_u32[i].what),
                  "%s: %s", bad_u32[i].key, err.msg);
    }
    CHECK_EQ_INT(kp_gguf_get_i32(g, "t.u32", 0, &i32, &err), KP_EFORMAT); /* 4e9 > INT32_MAX */
    CHECK_EQ_INT(kp_gguf_get_i32(g, "t.i64", 0, &i32, &err), KP_EFORMAT);
    CHECK_EQ_INT(kp_gguf_get_u64(g, "t.i8", 0, &u64, &err), KP_EFORMAT);
    CHECK_EQ_INT(kp_gguf_get_u64(g, "t.f64", 0, &u64, &err), KP_EFORMAT);

    /* floats: f32 and f64 both read through get_f32 */
    CHECK_EQ_INT(kp_gguf_get_f32(g, "t.f32", 0, &f32, &err), KP_OK);
    CHECK(f32 == 0.15625f);
    CHECK_EQ_INT(kp_gguf_get_f32(g, "t.f64", 0, &f32, &err), KP_OK);
    CHECK(f32 == (float)(-1.0 / 3.0));
    err.msg[0] = 0;
    CHECK_EQ_INT(kp_gguf_get_f32(g, "t.u32", 0, &f32, &err), KP_EFORMAT);
    CHECK(strstr(err.msg, "look.gguf") && strstr(err.msg, "t.u32") && strstr(err.msg, "float"));

    CHECK_EQ_INT(kp_gguf_get_bool(g, "t.bool", false, &bo, &err), KP_OK);
    CHECK(bo);
    CHECK_EQ_INT(kp_gguf_get_bool(g, "t.bool0", true, &bo, &err), KP_OK);
    CHECK(!bo);
    CHECK_EQ_INT(kp_gguf_get_bool(g, "t.u8", false, &bo, &err), KP_EFORMAT);

    CHECK_EQ_INT(kp_gguf_get_str(g, "t.str", &s, &err), KP_OK);
    CHECK(s.len == 7 && memcmp(s.data, "h\xc3\xa9l\0lo", 7) == 0);
    CHECK_EQ_INT(kp_gguf_get_str(g, "t.u32", &s, &err), KP_EFORMAT);
    CHECK(s.data == NULL && s.len == 0);

    /* a NULL kp_error is allowed */
    CHECK_EQ_INT(kp_gguf_get_u32(g, "t.str", 0, &u32, NULL), KP_EFORMAT);

    CHECK(kp_gguf_find_tensor(g, "w.f32") != NULL);
    CHECK(kp_gguf_find_tensor(g, "w.f3") == NULL);
    CHECK(kp_gguf_find_tensor(g, "nope") == NULL);
    CHECK(kp_gguf_tensor_at(g, 5) == NULL);
    kp_gguf_close(g);
    free(copy);
    gb_free(&b);
}

/* File offset just after a zero-tensor header with one u32 KV and one string
 * KV of `fill` bytes. */
static size_t alignment_file(gb *b, int align_kind, uint32_t align, size_t fill, uint64_t offset) {
    static const uint64_t ne[] = {8};
    gb_header(b, 3, 1, 2);
    if (align_kind == 0) gb_kv_u32(b, "general.alignment", align);
    else if (align_kind == 1) gb_kv_u32(b, "general.alignmenz", align); /* same length */
    else if (align_kind == 2) {
        gb_key(b, "general.alignment", KP_GGUF_TYPE_UINT64);
        gb_u64(b, align);
    } else {
        gb_kv_str(b, "general.alignment", "64");
    }
    char pad[128];
    memset(pad, 'x', sizeof pad);
    gb_key(b, "fill", KP_GGUF_TYPE_STRING);
    gb_strn(b, pad, fill);
    gb_tensor(b, "t", 1, ne, KP_DTYPE_F32, offset);
    return b->n;
}

static void test_alignment(void) {
    /* choose `fill` so the end of the tensor infos rounds differently to 32 and 64 */
    size_t fill = 0;
    for (; fill < 64; fill++) {
        gb probe = {0};
        size_t pos = alignment_file(&probe, 0, 64, fill, 0);
        gb_free(&probe);
        if (pos % 64 != 0 && pos % 64 < 32) break;
    }
    for (int kind = 0; kind < 2; kind++) { /* 0: alignment 64, 1: absent (default 32) */
        gb b = {0};
        size_t pos = alignment_file(&b, kind, 64, fill, 64);
        size_t a = kind == 0 ? 64 : 32;
        size_t data_off = (pos + a - 1) / a * a;
        size_t other = a == 64 ? 32 : 64;
        CHECK(data_off != (pos + other - 1) / other * other); /* the two alignments disagree */
        gb_fill(&b, data_off - b.n, 0);
        gb_fill(&b, 64, 0x55);
        gb_fill(&b, 32, 0x66); /* the tensor: 8 floats at offset 64 */
        uint8_t *copy = exact_copy(b.p, b.n);
        kp_gguf *g;
        kp_error err = {0};
        CHECK_EQ_INT(kp_gguf_open_memory(&g, copy, b.n, "align.gguf", &err), KP_OK);
        if (g) {
            CHECK_EQ_INT(kp_gguf_alignment(g), a);
            CHECK_EQ_INT(kp_gguf_data_offset(g), data_off);
            const kp_gguf_tensor *t = kp_gguf_find_tensor(g, "t");
            CHECK(t && t->data == copy + data_off + 64 && t->n_bytes == 32 &&
                  ((const uint8_t *)t->data)[0] == 0x66 && ((const uint8_t *)t->data)[31] == 0x66);
            CHECK((const uint8_t *)t->data + 32 == copy + b.n);
        } else {
            fprintf(stderr, "  %s\n", err.msg);
        }
        kp_gguf_close(g);
        free(copy);
        gb_free(&b);
    }
    /* bad alignment values and types */
    static const struct {
        int kind;
        uint32_t align;
        const char *msg;
    } bad[] = {{0, 0, "not a power of two"},
               {0, 3, "not a power of two"},
               {0, 96, "not a power of two"},
               {2, 64, "must be a u32"},
               {3, 0, "must be a u32"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gb b = {0};
        alignment_file(&b, bad[i].kind, bad[i].align, fill, 0);
        gb_pad(&b, 64);
        gb_fill(&b, 32, 0);
        parse_result r = parse_bytes(b.p, b.n, "badalign.gguf");
        CHECK_EQ_INT(r.st, KP_EFORMAT);
        CHECK_MSG(r.clean_error && strstr(r.msg, bad[i].msg) &&
                      strstr(r.msg, "general.alignment"),
                  "case %zu: %s", i, r.msg);
        gb_free(&b);
    }
    /* tensor offset 32 is aligned for the default but not for alignment 64 */
    gb b = {0};
    alignment_file(&b, 0, 64, fill, 32);
    gb_pad(&b, 64);
    gb_fill(&b, 64, 0);
    parse_result r = parse_bytes(b.p, b.n, "align64.gguf");
    CHECK_EQ_INT(r.st, KP_EFORMAT);
    CHECK_MSG(r.clean_error && strstr(r.msg, "not a multiple of the alignment 64"), "%s", r.msg);
    gb_free(&b);
}

static void test_zero_tensors_no_padding(void) {
    gb b = {0};
    make_vocab_like(&b);
    CHECK(b.n % 32 != 0); /* the file really ends unpadded */
    uint8_t *copy = exact_copy(b.p, b.n);
    kp_gguf *g;
    kp_error err = {0};
    CHECK_EQ_INT(kp_gguf_open_memory(&g, copy, b.n, "vocab.gguf", &err), KP_OK);
    if (g) {
        CHECK_EQ_INT(kp_gguf_n_tensors(g), 0);
        CHECK_EQ_INT(kp_gguf_n_kv(g), 5);
        CHECK_EQ_INT(kp_gguf_data_offset(g), b.n);
        const kp_gguf_value *toks = NULL;
        CHECK_EQ_INT(kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, &err), KP_OK);
        CHECK(toks && toks->v.arr.n == 4 && kp_gguf_str_eq(toks->v.arr.strs[3], "\xc4\xa0"));
        CHECK(kp_gguf_find_tensor(g, "x") == NULL);
        CHECK(kp_gguf_tensor_at(g, 0) == NULL);
    }
    kp_gguf_close(g);
    free(copy);
    /* trailing bytes after the metadata are tolerated too (padding) */
    gb_pad(&b, 32);
    parse_result r = parse_bytes(b.p, b.n, "vocab-padded.gguf");
    CHECK_EQ_INT(r.st, KP_OK);
    gb_free(&b);
}

static void test_tensor_views(void) {
    gb b = {0};
    make_all_types(&b);
    uint8_t *copy = exact_copy(b.p, b.n);
    kp_gguf *g;
    kp_error err = {0};
    CHECK_EQ_INT(kp_gguf_open_memory(&g, copy, b.n, "tensors.gguf", &err), KP_OK);
    if (!g) {
        free(copy);
        gb_free(&b);
        return;
    }
    /* sizes per ggml's block geometry: F32 4 B, F16 2 B, Q8_0 34 B per 32
     * elements (f16 scale + 32 int8), Q4_K 144 B per 256 (2 f16 + 12 scale
     * bytes + 128 nibble bytes) */
    static const struct {
        const char *name;
        uint32_t type, n_dims;
        int64_t ne[4];
        uint64_t offset, n_el, n_bytes;
        uint8_t fill;
    } want[] = {
        {"w.f32", KP_DTYPE_F32, 2, {4, 3, 1, 1}, 0, 12, 12 * 4, 0x01},
        {"w.f16", KP_DTYPE_F16, 2, {8, 2, 1, 1}, 64, 16, 16 * 2, 0x02},
        {"w.q8_0", KP_DTYPE_Q8_0, 2, {64, 2, 1, 1}, 128, 128, 4 * (2 + 32), 0x03},
        {"w.q4_k", KP_DTYPE_Q4_K, 2, {256, 2, 1, 1}, 320, 512, 2 * (4 + 12 + 128), 0x04},
        {"w.4d", KP_DTYPE_F32, 4, {2, 3, 4, 5}, 640, 120, 120 * 4, 0x05},
    };
    uint64_t data_off = kp_gguf_data_offset(g);
    CHECK_EQ_INT(data_off % 64, 0);
    CHECK_EQ_INT(data_off + 1120, b.n);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kp_gguf_tensor *t = kp_gguf_find_tensor(g, want[i].name);
        CHECK(t != NULL && t == kp_gguf_tensor_at(g, i));
        if (!t) continue;
        CHECK_EQ_INT(t->type, want[i].type);
        CHECK_EQ_INT(t->n_dims, want[i].n_dims);
        for (int d = 0; d < 4; d++) CHECK_EQ_INT(t->ne[d], want[i].ne[d]);
        CHECK_EQ_INT(t->offset, want[i].offset);
        CHECK_EQ_INT(t->n_elements, want[i].n_el);
        CHECK_EQ_INT(t->n_bytes, want[i].n_bytes);
        CHECK(t->data == copy + data_off + want[i].offset);
        const uint8_t *p = t->data;
        CHECK(p[0] == want[i].fill && p[t->n_bytes - 1] == want[i].fill);
        CHECK_EQ_INT(kp_dtype_row_size(t->type, t->ne[0]) * (t->n_elements / (uint64_t)t->ne[0]),
                     t->n_bytes);
    }
    kp_gguf_close(g);
    free(copy);
    gb_free(&b);
}

/* ------------------------------------------------------------- real file */

/* Re-encodes a decoded value (its type word excluded); arrays are cut to max_n. */
static void gb_value(gb *b, const kp_gguf_value *v, uint64_t max_n) {
    switch (v->type) {
    case KP_GGUF_TYPE_UINT8: gb_u8(b, (uint8_t)v->v.u64); break;
    case KP_GGUF_TYPE_INT8: gb_u8(b, (uint8_t)v->v.i64); break;
    case KP_GGUF_TYPE_UINT16: gb_u16(b, (uint16_t)v->v.u64); break;
    case KP_GGUF_TYPE_INT16: gb_u16(b, (uint16_t)v->v.i64); break;
    case KP_GGUF_TYPE_UINT32: gb_u32(b, (uint32_t)v->v.u64); break;
    case KP_GGUF_TYPE_INT32: gb_u32(b, (uint32_t)v->v.i64); break;
    case KP_GGUF_TYPE_UINT64: gb_u64(b, v->v.u64); break;
    case KP_GGUF_TYPE_INT64: gb_u64(b, (uint64_t)v->v.i64); break;
    case KP_GGUF_TYPE_FLOAT32: gb_f32(b, (float)v->v.f64); break;
    case KP_GGUF_TYPE_FLOAT64: gb_f64(b, v->v.f64); break;
    case KP_GGUF_TYPE_BOOL: gb_u8(b, v->v.b); break;
    case KP_GGUF_TYPE_STRING: gb_strn(b, v->v.str.data, v->v.str.len); break;
    case KP_GGUF_TYPE_ARRAY: {
        uint64_t n = v->v.arr.n < max_n ? v->v.arr.n : max_n;
        size_t es = kp_gguf_type_size(v->v.arr.elem_type);
        gb_u32(b, v->v.arr.elem_type);
        gb_u64(b, n);
        if (es) gb_put(b, v->v.arr.raw, n * es);
        for (uint64_t i = 0; !es && i < n; i++) {
            if (v->v.arr.elem_type == KP_GGUF_TYPE_STRING)
                gb_strn(b, v->v.arr.strs[i].data, v->v.arr.strs[i].len);
            else
                gb_value(b, &v->v.arr.items[i], max_n);
        }
        break;
    }
    default: break;
    }
}

/* Re-encodes the header of g: all KVs (arrays cut to max_n) and the first
 * n_tensors (<= 16) tensor infos, padded to the alignment. With shrink, each
 * tensor is cut to at most 4 elements per dim (row length kept for block
 * types), packed at aligned offsets, and followed by its first bytes. */
static void gb_reencode(gb *b, const kp_gguf *g, uint64_t max_n, size_t n_tensors, bool shrink) {
    uint64_t a = kp_gguf_alignment(g), next = 0, offs[16], sizes[16];
    if (shrink && n_tensors > 16) n_tensors = 16;
    gb_header(b, kp_gguf_version(g), n_tensors, kp_gguf_n_kv(g));
    for (size_t i = 0; i < kp_gguf_n_kv(g); i++) {
        const kp_gguf_kv *kv = kp_gguf_kv_at(g, i);
        gb_strn(b, kv->key.data, kv->key.len);
        gb_u32(b, kv->value.type);
        gb_value(b, &kv->value, max_n);
    }
    for (size_t i = 0; i < n_tensors; i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        const kp_dtype_info *ti = kp_dtype_get(t->type);
        uint64_t ne[4], n_el = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            ne[d] = (uint64_t)t->ne[d];
            if (shrink && ne[d] > 4 && (d > 0 || ti->block_size == 1)) ne[d] = 4;
            n_el *= ne[d];
        }
        gb_strn(b, t->name.data, t->name.len);
        gb_u32(b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) gb_u64(b, ne[d]);
        gb_u32(b, t->type);
        if (shrink) {
            offs[i] = next;
            sizes[i] = n_el / ti->block_size * ti->type_size;
            next = (next + sizes[i] + a - 1) / a * a;
        }
        gb_u64(b, shrink ? offs[i] : t->offset);
    }
    gb_pad(b, a);
    if (!shrink) return;
    size_t data = b->n;
    for (size_t i = 0; i < n_tensors; i++) {
        gb_fill(b, data + offs[i] - b->n, 0);
        gb_put(b, kp_gguf_tensor_at(g, i)->data, sizes[i]);
    }
}

/* The real model file: its place in the tree has moved before, so the known
 * locations are tried in order; NULL if none exists. */
static const char *stories_path(void) {
    static const char *const candidates[] = {"tests/data/stories260K.gguf",
                                             "tests/data/models/stories260K.gguf",
                                             "models/stories260K.gguf"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        const char *p = harness_path(candidates[i]);
        if (access(p, R_OK) == 0) return p;
    }
    return NULL;
}

static void test_real_file(void) {
    const char *path = stories_path();
    CHECK_MSG(path != NULL, "stories260K.gguf not found under tests/data or models");
    if (!path) return;
    kp_gguf *g;
    kp_error err = {0};
    kp_status st = kp_gguf_open(&g, path, &err);
    CHECK_MSG(st == KP_OK, "%s", err.msg);
    if (st != KP_OK) return;
    /* header facts from models/SOURCES.md */
    CHECK_EQ_INT(kp_gguf_version(g), 3);
    CHECK_EQ_INT(kp_gguf_n_tensors(g), 48);
    CHECK_EQ_INT(kp_gguf_n_kv(g), 19);
    CHECK_EQ_INT(kp_gguf_data_offset(g), 14176);
    CHECK_EQ_INT(kp_gguf_alignment(g), 32);
    CHECK_EQ_INT(kp_gguf_file_size(g), 1185376);
    CHECK(kp_gguf_find(g, "general.alignment") == NULL);
    uint32_t u = 0;
    CHECK_EQ_INT(kp_gguf_get_u32(g, "llama.block_count", 0, &u, &err), KP_OK);
    CHECK_EQ_INT(u, 5);
    CHECK_EQ_INT(kp_gguf_get_u32(g, "llama.embedding_length", 0, &u, &err), KP_OK);
    CHECK_EQ_INT(u, 64);
    CHECK_EQ_INT(kp_gguf_get_u32(g, "llama.attention.head_count_kv", 0, &u, &err), KP_OK);
    CHECK_EQ_INT(u, 4);
    CHECK_EQ_INT(kp_gguf_get_u32(g, "tokenizer.ggml.seperator_token_id", 0, &u, &err), KP_OK);
    CHECK(u == 4294967295u);
    float eps = 0;
    CHECK_EQ_INT(kp_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", 0, &eps, &err), KP_OK);
    CHECK_NEAR(eps, 1e-5, 1e-12);
    kp_gguf_str s;
    CHECK_EQ_INT(kp_gguf_get_str(g, "general.architecture", &s, &err), KP_OK);
    CHECK(kp_gguf_str_eq(s, "llama"));
    const kp_gguf_value *toks = NULL, *types = NULL;
    CHECK_EQ_INT(kp_gguf_get_arr(g, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, &toks, &err), KP_OK);
    CHECK(toks && toks->v.arr.n == 512);
    if (toks && toks->v.arr.n == 512) {
        CHECK(kp_gguf_str_eq(toks->v.arr.strs[0], "<unk>"));
        CHECK(kp_gguf_str_eq(toks->v.arr.strs[1], "<s>"));
        CHECK(kp_gguf_str_eq(toks->v.arr.strs[2], "</s>"));
        CHECK(kp_gguf_str_eq(toks->v.arr.strs[3], "<0x00>"));
        CHECK(kp_gguf_str_eq(toks->v.arr.strs[258], "<0xFF>"));
    }
    CHECK_EQ_INT(kp_gguf_get_arr(g, "tokenizer.ggml.token_type", KP_GGUF_TYPE_INT32, &types, &err), KP_OK);
    CHECK(types && types->v.arr.n == 512 && kp_gguf_arr_i64(types, 3) == 6 &&
          kp_gguf_arr_i64(types, 258) == 6);

    const kp_gguf_tensor *emb = kp_gguf_find_tensor(g, "token_embd.weight");
    const kp_gguf_tensor *out = kp_gguf_find_tensor(g, "output.weight");
    CHECK(emb && emb->type == KP_DTYPE_F32 && emb->n_dims == 2 && emb->ne[0] == 64 &&
          emb->ne[1] == 512 && emb->n_bytes == 64 * 512 * 4);
    /* llama2.c ties the two: byte-identical data at different offsets */
    CHECK(emb && out && emb->data != out->data && out->n_bytes == emb->n_bytes &&
          memcmp(emb->data, out->data, emb->n_bytes) == 0);
    const kp_gguf_tensor *down = kp_gguf_find_tensor(g, "blk.4.ffn_down.weight");
    CHECK(down && down->ne[0] == 172 && down->ne[1] == 64);
    CHECK(kp_gguf_find_tensor(g, "blk.5.ffn_down.weight") == NULL);

    /* every tensor is F32 and the file has nothing past the last one */
    uint64_t end = 0;
    bool all_f32 = true;
    for (size_t i = 0; i < kp_gguf_n_tensors(g); i++) {
        const kp_gguf_tensor *t = kp_gguf_tensor_at(g, i);
        all_f32 = all_f32 && t->type == KP_DTYPE_F32;
        if (t->offset + t->n_bytes > end) end = t->offset + t->n_bytes;
    }
    CHECK(all_f32);
    CHECK_EQ_INT(kp_gguf_data_offset(g) + end, kp_gguf_file_size(g));

    /* re-encoding what was decoded reproduces the header byte for byte */
    size_t n = 0;
    char *raw = harness_read_file(path, &n);
    CHECK(raw && n == 1185376);
    if (raw && n >= 14176) {
        gb b = {0};
        gb_reencode(&b, g, UINT64_MAX, kp_gguf_n_tensors(g), false);
        CHECK_EQ_INT(b.n, 14176);
        CHECK(b.n == 14176 && memcmp(b.p, raw, b.n) == 0);
        gb_free(&b);
        /* the memory path decodes the same file identically */
        kp_gguf *m;
        CHECK_EQ_INT(kp_gguf_open_memory(&m, raw, n, "mem", &err), KP_OK);
        if (m) {
            CHECK_EQ_INT(kp_gguf_n_kv(m), 19);
            CHECK_EQ_INT(kp_gguf_n_tensors(m), 48);
            CHECK_EQ_INT(kp_gguf_data_offset(m), 14176);
            const kp_gguf_tensor *e2 = kp_gguf_find_tensor(m, "token_embd.weight");
            CHECK(e2 && emb && memcmp(e2->data, emb->data, emb->n_bytes) == 0);
            CHECK(walk_file(m, (const uint8_t *)raw, n));
        }
        kp_gguf_close(m);
    }
    free(raw);
    kp_gguf_close(g);
}

/* The stories260K header cut down to < 4 KB: every KV (arrays cut to 8
 * elements) and its first 3 tensors shrunk to <= 4 per dim, with real data. */
static bool make_stories_cut(gb *b) {
    kp_gguf *g;
    const char *path = stories_path();
    if (!path || kp_gguf_open(&g, path, NULL) != KP_OK) return false;
    gb_reencode(b, g, 8, 3, true);
    kp_gguf_close(g);
    return true;
}

static void test_stories_cut(void) {
    gb b = {0};
    CHECK(make_stories_cut(&b));
    CHECK(b.n < 4096);
    parse_result r = parse_bytes(b.p, b.n, "stories-cut.gguf");
    CHECK_MSG(r.st == KP_OK && r.walk_ok, "%s", r.msg);
    gb_free(&b);
}

/* ------------------------------------------------------- corrupt files */

/* A file with one KV and the given tensor infos; `data` bytes of zeros follow
 * the padding. */
static void tensor_file(gb *b, size_t n, const char *const *names, const uint32_t *n_dims,
                        const uint64_t (*ne)[5], const uint32_t *types, const uint64_t *offsets,
                        size_t data) {
    gb_header(b, 3, n, 1);
    gb_kv_str(b, "general.architecture", "llama");
    for (size_t i = 0; i < n; i++) gb_tensor(b, names[i], n_dims[i], ne[i], types[i], offsets[i]);
    gb_pad(b, 32);
    gb_fill(b, data, 0);
}
/* One tensor: name "t", the given dims, type and offset; `data` bytes follow. */
static void one_tensor(gb *b, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint32_t type,
                       uint64_t offset, size_t data) {
    static const char *const names[] = {"t"};
    const uint64_t ne[1][5] = {{ne0, ne1, 1, 1, 1}};
    tensor_file(b, 1, names, &n_dims, ne, &type, &offset, data);
}

static void c_bad_magic(gb *b) { make_small(b, 3), memcpy(b->p, "GGML", 4); }
static void c_empty(gb *b) { (void)b; }
static void c_three_bytes(gb *b) { gb_put(b, "GGU", 3); }
static void c_magic_only(gb *b) { gb_put(b, "GGUF", 4); }
static void c_version1(gb *b) { make_small(b, 3), gb_set_u32(b, 4, 1); }
static void c_version4(gb *b) { make_small(b, 3), gb_set_u32(b, 4, 4); }
static void c_version_max(gb *b) { make_small(b, 3), gb_set_u32(b, 4, 0xFFFFFFFFu); }
static void c_version_be(gb *b) { make_small(b, 3), gb_set_u32(b, 4, 0x03000000u); }
static void c_key_past_end(gb *b) { gb_header(b, 3, 0, 1), gb_u64(b, 100), gb_put(b, "abcdefghijk", 11); }
static void c_str_past_end(gb *b) {
    gb_header(b, 3, 0, 1), gb_key(b, "k", KP_GGUF_TYPE_STRING), gb_u64(b, 9), gb_put(b, "abcdefgh", 8);
}
static void c_str_huge(gb *b) {
    gb_header(b, 3, 0, 1), gb_key(b, "k", KP_GGUF_TYPE_STRING), gb_u64(b, UINT64_MAX);
    gb_put(b, "abcdefghabcdefgh", 16);
}
static void c_key_huge(gb *b) { gb_header(b, 3, 0, 1), gb_u64(b, 1ull << 63), gb_fill(b, 32, 'k'); }
static void c_arr_past_end(gb *b) {
    gb_header(b, 3, 0, 1), gb_arr(b, "k", KP_GGUF_TYPE_UINT32, 4), gb_u32(b, 1), gb_u32(b, 2), gb_u32(b, 3);
}
static void c_arr_2p62_u64(gb *b) {
    gb_header(b, 3, 0, 1), gb_arr(b, "k", KP_GGUF_TYPE_UINT64, 1ull << 62), gb_fill(b, 64, 0);
}
static void c_arr_huge_str(gb *b) {
    gb_header(b, 3, 0, 1), gb_arr(b, "k", KP_GGUF_TYPE_STRING, UINT64_MAX / 2), gb_fill(b, 64, 0);
}
static void c_arr_huge_nested(gb *b) {
    gb_header(b, 3, 0, 1), gb_arr(b, "k", KP_GGUF_TYPE_ARRAY, 1ull << 60), gb_fill(b, 64, 0);
}
static void c_arr_str_past_end(gb *b) {
    gb_header(b, 3, 0, 1), gb_arr(b, "k", KP_GGUF_TYPE_STRING, 2), gb_str(b, "ok"), gb_u64(b, 5);
    gb_put(b, "abcd", 4);
}
static void c_nested_too_deep(gb *b) { gb_header(b, 3, 0, 1), gb_nested(b, "deep", 9); }
static void c_unknown_type(gb *b) { gb_header(b, 3, 0, 1), gb_key(b, "k", (kp_gguf_type)13), gb_u64(b, 0); }
static void c_unknown_type_big(gb *b) {
    gb_header(b, 3, 0, 1), gb_key(b, "k", (kp_gguf_type)0x80000000u), gb_u64(b, 0);
}
static void c_unknown_elem(gb *b) { gb_header(b, 3, 0, 1), gb_arr(b, "k", (kp_gguf_type)13, 0), gb_u64(b, 0); }
static void c_unknown_nested_elem(gb *b) {
    gb_header(b, 3, 0, 1), gb_arr(b, "k", KP_GGUF_TYPE_ARRAY, 1), gb_u32(b, 99), gb_u64(b, 0);
}
static void c_n_kv_huge(gb *b) { make_small(b, 3), gb_set_u64(b, 16, 1ull << 62); }
static void c_n_kv_max(gb *b) { make_small(b, 3), gb_set_u64(b, 16, UINT64_MAX); }
static void c_n_kv_just_over(gb *b) { /* one more KV than the bytes left could hold */
    make_small(b, 3), gb_set_u64(b, 16, (b->n - 24) / 13 + 1);
}
static void c_n_kv_at_bound(gb *b) { /* 2 = 26 bytes / 13 passes the count check */
    gb_header(b, 3, 0, 2), gb_kv_u32(b, "k", 1), gb_fill(b, 9, 0xFF);
}
static void c_n_tensors_huge(gb *b) { make_small(b, 3), gb_set_u64(b, 8, 1ull << 62); }
static void c_n_tensors_max(gb *b) { make_small(b, 3), gb_set_u64(b, 8, UINT64_MAX); }
static void c_ndims0(gb *b) { one_tensor(b, 0, 4, 1, KP_DTYPE_F32, 0, 32); }
static void c_ndims5(gb *b) { one_tensor(b, 5, 4, 1, KP_DTYPE_F32, 0, 32); }
static void c_dim_zero(gb *b) { one_tensor(b, 2, 4, 0, KP_DTYPE_F32, 0, 32); }
static void c_dim_zero0(gb *b) { one_tensor(b, 1, 0, 1, KP_DTYPE_F32, 0, 32); }
static void c_nel_overflow(gb *b) { one_tensor(b, 2, 1ull << 40, 1ull << 40, KP_DTYPE_F32, 0, 32); }
static void c_dim_over_int64(gb *b) { one_tensor(b, 1, 1ull << 63, 1, KP_DTYPE_I8, 0, 32); }
static void c_nbytes_overflow(gb *b) { one_tensor(b, 2, 1ull << 31, 1ull << 31, KP_DTYPE_F32, 0, 32); }
static void c_type99(gb *b) { one_tensor(b, 1, 32, 1, 99, 0, 64); }
static void c_type4(gb *b) { one_tensor(b, 1, 32, 1, 4, 0, 64); }
static void c_type5(gb *b) { one_tensor(b, 1, 32, 1, 5, 0, 64); }
static void c_type31(gb *b) { one_tensor(b, 1, 32, 1, 31, 0, 64); }
static void c_type40(gb *b) { one_tensor(b, 1, 32, 1, KP_DTYPE_COUNT_, 0, 64); }
static void c_q8_row33(gb *b) { one_tensor(b, 2, 33, 2, KP_DTYPE_Q8_0, 0, 128); }
static void c_q4k_row128(gb *b) { one_tensor(b, 1, 128, 1, KP_DTYPE_Q4_K, 0, 160); }
static void c_unaligned(gb *b) { one_tensor(b, 1, 4, 1, KP_DTYPE_F32, 16, 64); }
static void c_outside(gb *b) { one_tensor(b, 1, 16, 1, KP_DTYPE_F32, 0, 63); }
static void c_outside_offset(gb *b) { one_tensor(b, 1, 4, 1, KP_DTYPE_F32, 64, 64); }
static void c_offset_near_max(gb *b) { one_tensor(b, 1, 8, 1, KP_DTYPE_F32, UINT64_MAX - 31, 64); }
static void c_offset_wraps(gb *b) { /* offset + n_bytes wraps to a small number */
    one_tensor(b, 1, 1ull << 60, 1, KP_DTYPE_I8, (uint64_t)0 - (1ull << 60), 64);
}
static void c_overlap(gb *b) {
    static const char *const names[] = {"x", "y"};
    static const uint32_t nd[] = {1, 1}, ty[] = {KP_DTYPE_F32, KP_DTYPE_F32};
    static const uint64_t ne[2][5] = {{16, 1, 1, 1, 1}, {16, 1, 1, 1, 1}}, off[] = {0, 32};
    tensor_file(b, 2, names, nd, ne, ty, off, 128);
}
static void c_overlap_same(gb *b) {
    static const char *const names[] = {"x", "y"};
    static const uint32_t nd[] = {1, 1}, ty[] = {KP_DTYPE_F32, KP_DTYPE_F16};
    static const uint64_t ne[2][5] = {{8, 1, 1, 1, 1}, {8, 1, 1, 1, 1}}, off[] = {0, 0};
    tensor_file(b, 2, names, nd, ne, ty, off, 64);
}
static void c_dup_tensor(gb *b) {
    static const char *const names[] = {"x", "x"};
    static const uint32_t nd[] = {1, 1}, ty[] = {KP_DTYPE_F32, KP_DTYPE_F32};
    static const uint64_t ne[2][5] = {{8, 1, 1, 1, 1}, {8, 1, 1, 1, 1}}, off[] = {0, 32};
    tensor_file(b, 2, names, nd, ne, ty, off, 64);
}
static void c_dup_key(gb *b) {
    gb_header(b, 3, 0, 3), gb_kv_u32(b, "a", 1), gb_kv_u32(b, "b", 2), gb_kv_str(b, "a", "x");
}
static void c_data_past_eof(gb *b) { /* tensor infos end off-alignment and the file ends there */
    static const uint64_t ne[] = {8};
    gb_header(b, 3, 1, 1), gb_kv_u32(b, "k", 1), gb_tensor(b, "t", 1, ne, KP_DTYPE_F32, 0);
}
static void c_no_data(gb *b) { /* padded, but the data section is empty */
    static const uint64_t ne[] = {8};
    gb_header(b, 3, 1, 1), gb_kv_u32(b, "k", 1), gb_tensor(b, "t", 1, ne, KP_DTYPE_F32, 0);
    gb_pad(b, 32);
}
static void c_small_truncated(gb *b) { make_small(b, 3), b->n -= 1; }

typedef struct {
    const char *name;
    void (*build)(gb *b);
    kp_status want;
    const char *msg;
} corrupt_case;

static const corrupt_case corrupt_cases[] = {
    {"bad-magic", c_bad_magic, KP_EFORMAT, "bad magic 47 47 4d 4c"},
    {"empty", c_empty, KP_EFORMAT, "not a GGUF file"},
    {"three-bytes", c_three_bytes, KP_EFORMAT, "not a GGUF file"},
    {"magic-only", c_magic_only, KP_EFORMAT, "truncated"},
    {"version-1", c_version1, KP_EUNSUPPORTED, "unsupported GGUF version 1 "},
    {"version-4", c_version4, KP_EUNSUPPORTED, "unsupported GGUF version 4 "},
    {"version-ffffffff", c_version_max, KP_EUNSUPPORTED, "unsupported GGUF version 4294967295"},
    {"version-big-endian", c_version_be, KP_EUNSUPPORTED, "unsupported GGUF version 50331648"},
    {"key-past-end", c_key_past_end, KP_EFORMAT, "metadata key at offset 24 has length 100 past the end"},
    {"string-past-end", c_str_past_end, KP_EFORMAT, "has length 9 past the end"},
    {"string-len-max", c_str_huge, KP_EFORMAT, "has length 18446744073709551615 past the end"},
    {"key-len-2^63", c_key_huge, KP_EFORMAT, "past the end"},
    {"array-past-end", c_arr_past_end, KP_EFORMAT, "array of 4 u32 elements does not fit"},
    {"array-2^62-u64", c_arr_2p62_u64, KP_EFORMAT, "array of 4611686018427387904 u64 elements does not fit"},
    {"array-huge-strings", c_arr_huge_str, KP_EFORMAT, "str elements does not fit"},
    {"array-huge-nested", c_arr_huge_nested, KP_EFORMAT, "arr elements does not fit"},
    {"array-string-past-end", c_arr_str_past_end, KP_EFORMAT, "array string"},
    {"nested-too-deep", c_nested_too_deep, KP_EFORMAT, "key 'deep': arrays nested deeper than 8"},
    {"unknown-value-type", c_unknown_type, KP_EFORMAT, "key 'k' has unknown value type 13"},
    {"unknown-value-type-2^31", c_unknown_type_big, KP_EFORMAT, "unknown value type 2147483648"},
    {"unknown-elem-type", c_unknown_elem, KP_EFORMAT, "unknown array element type 13"},
    {"unknown-nested-elem-type", c_unknown_nested_elem, KP_EFORMAT, "unknown array element type 99"},
    {"n_kv-2^62", c_n_kv_huge, KP_EFORMAT, "claims 4611686018427387904 metadata keys"},
    {"n_kv-max", c_n_kv_max, KP_EFORMAT, "more than fit"},
    {"n_kv-just-over", c_n_kv_just_over, KP_EFORMAT, "metadata keys, more than fit"},
    {"n_kv-at-bound", c_n_kv_at_bound, KP_EFORMAT, "metadata key at offset 41 has length 18446744073709551615"},
    {"n_tensors-2^62", c_n_tensors_huge, KP_EFORMAT, "claims 4611686018427387904 tensors"},
    {"n_tensors-max", c_n_tensors_max, KP_EFORMAT, "tensors, more than fit"},
    {"n_dims-0", c_ndims0, KP_EFORMAT, "tensor 't' has 0 dimensions"},
    {"n_dims-5", c_ndims5, KP_EFORMAT, "tensor 't' has 5 dimensions"},
    {"dim-zero", c_dim_zero, KP_EFORMAT, "dimension of zero (dim 1)"},
    {"dim0-zero", c_dim_zero0, KP_EFORMAT, "dimension of zero (dim 0)"},
    {"elements-2^80", c_nel_overflow, KP_EFORMAT, "element count overflows"},
    {"dim-2^63", c_dim_over_int64, KP_EFORMAT, "element count overflows"},
    {"bytes-2^64", c_nbytes_overflow, KP_EFORMAT, "byte size overflows"},
    {"type-99", c_type99, KP_EFORMAT, "unknown type 99"},
    {"type-4-removed", c_type4, KP_EFORMAT, "unknown type 4"},
    {"type-5-removed", c_type5, KP_EFORMAT, "unknown type 5"},
    {"type-31-removed", c_type31, KP_EFORMAT, "unknown type 31"},
    {"type-40", c_type40, KP_EFORMAT, "unknown type 40"},
    {"q8_0-row-33", c_q8_row33, KP_EFORMAT, "row length 33 is not a multiple of the Q8_0 block size 32"},
    {"q4_k-row-128", c_q4k_row128, KP_EFORMAT, "Q4_K block size 256"},
    {"offset-unaligned", c_unaligned, KP_EFORMAT, "offset 16 is not a multiple of the alignment 32"},
    {"data-outside", c_outside, KP_EFORMAT, "lies outside the file"},
    {"offset-outside", c_outside_offset, KP_EFORMAT, "lies outside the file"},
    {"offset-near-2^64", c_offset_near_max, KP_EFORMAT, "lies outside the file"},
    {"offset-plus-size-wraps", c_offset_wraps, KP_EFORMAT, "lies outside the file"},
    {"overlap", c_overlap, KP_EFORMAT, "tensors 'x' and 'y' overlap"},
    {"overlap-same-offset", c_overlap_same, KP_EFORMAT, "overlap"},
    {"duplicate-tensor", c_dup_tensor, KP_EFORMAT, "duplicate tensor name 'x'"},
    {"duplicate-key", c_dup_key, KP_EFORMAT, "duplicate metadata key 'a'"},
    {"data-start-past-eof", c_data_past_eof, KP_EFORMAT, "tensor data section starts at"},
    {"data-section-empty", c_no_data, KP_EFORMAT, "lies outside the file"},
    {"last-byte-missing", c_small_truncated, KP_EFORMAT, "tensor 'c' data"},
};

/* Writes bytes to a new file in dir; returns its path in a static buffer. */
static const char *write_temp(const char *dir, const char *name, const uint8_t *p, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    bool ok = n == 0 || fwrite(p, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    return ok ? path : NULL;
}

static void test_corrupt_table(void) {
    char dir[] = "/tmp/kvpin-test-gguf-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    for (size_t i = 0; i < sizeof corrupt_cases / sizeof corrupt_cases[0]; i++) {
        const corrupt_case *c = &corrupt_cases[i];
        gb b = {0};
        char name[96];
        c->build(&b);
        snprintf(name, sizeof name, "corrupt-%s.gguf", c->name);

        /* from memory */
        parse_result r = parse_bytes(b.p, b.n, name);
        CHECK_MSG(r.st == c->want, "%s: status %s, want %s (%s)", c->name, kp_status_str(r.st),
                  kp_status_str(c->want), r.msg);
        CHECK_MSG(r.clean_error, "%s: message does not name the file: %s", c->name, r.msg);
        CHECK_MSG(strstr(r.msg, c->msg) != NULL, "%s: message \"%s\" lacks \"%s\"", c->name, r.msg,
                  c->msg);

        /* from disk, through the mmap path */
        const char *path = write_temp(dir, name, b.p, b.n);
        CHECK(path != NULL);
        if (path) {
            kp_gguf *g = (kp_gguf *)&b;
            kp_error err = {0};
            kp_status st = kp_gguf_open(&g, path, &err);
            CHECK_MSG(st == c->want, "%s (file): %s", c->name, err.msg);
            CHECK(g == NULL && err.code == st && strstr(err.msg, path));
            /* an empty file is refused before mapping; the rest say the same as from memory */
            if (b.n) CHECK_MSG(strstr(err.msg, c->msg), "%s (file): %s", c->name, err.msg);
            unlink(path);
        }
        gb_free(&b);
    }
    rmdir(dir);
}

static void test_open_errors(void) {
    static const struct {
        const char *path, *msg;
        kp_status want;
    } cases[] = {
        {"tests/data", "not a regular file", KP_EIO},
        {"/dev/null", "not a regular file", KP_EIO},
        {"/nonexistent/kvpin/model.gguf", "cannot open", KP_EIO},
        {"", "cannot open", KP_EIO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = i == 0 ? harness_path(cases[i].path) : cases[i].path;
        kp_gguf *g = (kp_gguf *)&cases[i];
        kp_error err = {0};
        CHECK_EQ_INT(kp_gguf_open(&g, path, &err), cases[i].want);
        CHECK(g == NULL && err.code == cases[i].want);
        CHECK_MSG(strstr(err.msg, cases[i].msg) && strstr(err.msg, path), "%s", err.msg);
    }
    /* a FIFO is refused at once (opening one for reading must not wait for
     * a writer; the alarm turns a hang into a failure) */
    char dir[] = "/tmp/kvpin-test-fifo-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/model.gguf", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    kp_gguf *g = (kp_gguf *)fifo;
    kp_error err = {0};
    alarm(10);
    CHECK_EQ_INT(kp_gguf_open(&g, fifo, &err), KP_EIO);
    alarm(0);
    CHECK(g == NULL && strstr(err.msg, fifo) && strstr(err.msg, "not a regular file"));
    unlink(fifo);
    rmdir(dir);

    /* NULL kp_error is allowed on failure */
    CHECK_EQ_INT(kp_gguf_open(&g, "/nonexistent", NULL), KP_EIO);
    CHECK_EQ_INT(kp_gguf_open_memory(&g, "GGUX", 4, NULL, NULL), KP_EFORMAT);
    CHECK(g == NULL);
    CHECK_EQ_INT(kp_gguf_open_memory(&g, NULL, 64, "null.gguf", &err), KP_EINVAL);
    CHECK(g == NULL && strstr(err.msg, "null.gguf"));
}

/* Forged counts must be refused from the byte budget, before any allocation:
 * quickly, and (under ASan) without tripping the 64 MiB allocation cap. 2^24
 * entries would be a 1-2 GB table: an allocation that would succeed lazily
 * without the cap, so only the cap shows it. */
static void test_forged_counts_fail_fast(void) {
    static const struct {
        size_t at;
        uint64_t n;
    } forged[] = {{8, 1ull << 24},  {8, 1ull << 40},  {8, 1ull << 63},  {8, UINT64_MAX / 24},
                  {16, 1ull << 24}, {16, 1ull << 40}, {16, 1ull << 63}, {16, UINT64_MAX / 48}};
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        gb b = {0};
        make_small(&b, 3);
        gb_set_u64(&b, forged[i].at, forged[i].n);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        parse_result r = parse_bytes(b.p, b.n, "forged.gguf");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK_EQ_INT(r.st, KP_EFORMAT);
        CHECK_MSG(r.clean_error && strstr(r.msg, "more than fit"), "%s", r.msg);
        CHECK_MSG(secs < 0.5, "%.3f s", secs);
        gb_free(&b);
    }
    /* a large, honest-looking array whose elements are missing: no allocation
     * proportional to the claimed count (here it would be 16 x 2^40 bytes) */
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_arr(&b, "tokenizer.ggml.tokens", KP_GGUF_TYPE_STRING, 1ull << 40);
    gb_str(&b, "a");
    parse_result r = parse_bytes(b.p, b.n, "forged-arr.gguf");
    CHECK_EQ_INT(r.st, KP_EFORMAT);
    CHECK(r.clean_error && strstr(r.msg, "does not fit"));
    gb_free(&b);
}

/* ---------------------------------------------- truncation and mutation */

static void check_every_prefix(const gb *b, const char *name) {
    size_t bad = 0;
    for (size_t len = 0; len < b->n; len++) {
        parse_result r = parse_bytes(b->p, len, name);
        if (r.st != KP_EFORMAT || !r.clean_error) {
            if (bad++ < 5)
                fprintf(stderr, "  %s prefix %zu: %s: %s\n", name, len, kp_status_str(r.st), r.msg);
        }
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu prefixes not refused cleanly", name, bad, b->n);
    parse_result full = parse_bytes(b->p, b->n, name);
    CHECK_MSG(full.st == KP_OK && full.walk_ok, "%s: %s", name, full.msg);
}

static void test_truncation(void) {
    gb b = {0};
    make_small(&b, 3);
    check_every_prefix(&b, "small.gguf");
    gb_free(&b);
    make_small(&b, 2);
    check_every_prefix(&b, "small-v2.gguf");
    gb_free(&b);
    make_all_types(&b);
    check_every_prefix(&b, "all.gguf");
    gb_free(&b);
    if (make_stories_cut(&b)) check_every_prefix(&b, "stories-cut.gguf");
    gb_free(&b);
}

typedef struct {
    uint64_t s;
} rng;
static uint64_t rng_next(rng *r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}

typedef struct {
    size_t ok, failed, dirty;
} mutant_stats;

static void try_mutant(const uint8_t *p, size_t n, const char *name, mutant_stats *ms, const char *what,
                       size_t pos) {
    parse_result r = parse_bytes(p, n, name);
    bool fine = r.st == KP_OK ? r.walk_ok : r.clean_error;
    if (r.st == KP_OK) ms->ok++;
    else ms->failed++;
    if (!fine && ms->dirty++ < 5)
        fprintf(stderr, "  %s: %s at %zu: %s: %s\n", name, what, pos, kp_status_str(r.st), r.msg);
}

static void mutate_file(const gb *b, const char *name, uint64_t seed, size_t n_random,
                        mutant_stats *ms) {
    uint8_t *m = malloc(b->n);
    if (!m) exit(2);
    /* every single-bit flip */
    for (size_t pos = 0; pos < b->n; pos++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(m, b->p, b->n);
            m[pos] ^= (uint8_t)(1u << bit);
            try_mutant(m, b->n, name, ms, "bit flip", pos);
        }
    }
    /* seeded random mutants: 1-4 bytes set to boundary or random values, or
     * a boundary u64 written at a random offset */
    static const uint64_t magic64[] = {0, 1, 0x7F, 0xFF, 1ull << 31, 1ull << 32, 1ull << 62,
                                       INT64_MAX, UINT64_MAX, UINT64_MAX - 31};
    rng r = {seed};
    for (size_t k = 0; k < n_random; k++) {
        memcpy(m, b->p, b->n);
        size_t pos = (size_t)(rng_next(&r) % b->n);
        if (rng_next(&r) % 3 == 0 && b->n >= 8) {
            uint64_t v = magic64[rng_next(&r) % (sizeof magic64 / sizeof magic64[0])];
            if (pos > b->n - 8) pos = b->n - 8;
            for (int i = 0; i < 8; i++) m[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
        } else {
            int nb = 1 + (int)(rng_next(&r) % 4);
            for (int i = 0; i < nb; i++) {
                static const uint8_t vals[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, 0x20, 0x09, 0x0D};
                uint64_t x = rng_next(&r);
                size_t at = (size_t)(x % b->n);
                m[at] = x & 0x100 ? vals[(x >> 9) % 8] : (uint8_t)(x >> 24);
            }
        }
        try_mutant(m, b->n, name, ms, "random mutant", pos);
    }
    free(m);
}

static void test_mutations(void) {
    mutant_stats ms = {0};
    gb b = {0};
    make_small(&b, 3);
    mutate_file(&b, "small.gguf", 0x5EED0001u, 3000, &ms);
    gb_free(&b);
    make_all_types(&b);
    mutate_file(&b, "all.gguf", 0x5EED0002u, 3000, &ms);
    gb_free(&b);
    CHECK_MSG(ms.dirty == 0, "%zu mutants not handled cleanly", ms.dirty);
    /* both outcomes occur: flips in tensor data keep the file valid, flips in
     * lengths and types do not */
    CHECK(ms.ok > 1000 && ms.failed > 1000);
    printf("gguf: %zu mutants, %zu parsed, %zu refused\n", ms.ok + ms.failed, ms.ok, ms.failed);
}

/* Every file in tests/data/gguf_regress/ must parse to OK or a clean error. */
static void test_regressions(void) {
    const char *dir = harness_path("tests/data/gguf_regress");
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "%s: %s", dir, strerror(errno));
    if (!d) return;
    size_t n_files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 3 && strcmp(e->d_name + len - 3, ".md") == 0)) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        size_t n = 0;
        char *raw = harness_read_file(path, &n);
        CHECK(raw != NULL);
        if (!raw) continue;
        n_files++;
        parse_result r = parse_bytes((const uint8_t *)raw, n, e->d_name);
        CHECK_MSG(r.st == KP_OK ? r.walk_ok : r.clean_error, "%s: %s", e->d_name, r.msg);
        /* and through the mmap path */
        kp_gguf *g;
        kp_error err = {0};
        kp_status st = kp_gguf_open(&g, path, &err);
        CHECK_MSG(st == r.st || (n == 0 && st == KP_EFORMAT), "%s: %s vs %s", e->d_name,
                  kp_status_str(st), kp_status_str(r.st));
        kp_gguf_close(g);
        free(raw);
    }
    closedir(d);
    printf("gguf: %zu regression files replayed\n", n_files);
}

/* ------------------------------------------------------------------ seeds */

static int write_seeds(const char *dir) {
    static const struct {
        const char *name;
        int kind;
    } seeds[] = {{"small-v3.gguf", 0}, {"small-v2.gguf", 1}, {"vocab-like.gguf", 2},
                 {"all-types.gguf", 3}, {"stories260K-cut.gguf", 4}, {"stories260K-head4k.gguf", 5}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        gb b = {0};
        switch (seeds[i].kind) {
        case 0: make_small(&b, 3); break;
        case 1: make_small(&b, 2); break;
        case 2: make_vocab_like(&b); break;
        case 3: make_all_types(&b); break;
        case 4:
            if (!make_stories_cut(&b)) return fprintf(stderr, "cannot read stories260K\n"), 1;
            break;
        case 5: {
            size_t n = 0;
            const char *path = stories_path();
            char *raw = path ? harness_read_file(path, &n) : NULL;
            if (!raw || n < 4096) return fprintf(stderr, "cannot read stories260K\n"), 1;
            gb_put(&b, raw, 4096);
            free(raw);
            break;
        }
        }
        const char *path = write_temp(dir, seeds[i].name, b.p, b.n);
        if (!path) return fprintf(stderr, "cannot write %s/%s\n", dir, seeds[i].name), 1;
        printf("%s: %zu bytes\n", path, b.n);
        gb_free(&b);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    RUN(test_versions_and_scalars);
    RUN(test_arrays);
    RUN(test_lookups);
    RUN(test_alignment);
    RUN(test_zero_tensors_no_padding);
    RUN(test_tensor_views);
    RUN(test_real_file);
    RUN(test_stories_cut);
    RUN(test_corrupt_table);
    RUN(test_open_errors);
    RUN(test_forged_counts_fail_fast);
    RUN(test_truncation);
    RUN(test_mutations);
    RUN(test_regressions);
    return harness_finish("gguf");
}
