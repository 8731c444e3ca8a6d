/*
 * gguf_write.h - a small streaming GGUF v3 writer.
 *
 * The counterpart of gguf.h, for tools and tests that make model files
 * (mkmodel.c, reader tests, fuzz seeds). Metadata and tensor descriptions are
 * collected in memory first; kp_gguf_w_begin then writes the header, and the
 * tensor data is streamed after it in the order the tensors were declared, so
 * a model of any size is written with a few rows of memory.
 *
 *   kp_gguf_w *w; kp_error err;
 *   kp_gguf_w_new(&w, &err);
 *   kp_gguf_w_add_str(w, "general.architecture", "llama", &err);
 *   kp_gguf_w_add_u32(w, "llama.block_count", 2, &err);
 *   int64_t ne[2] = {256, 512};
 *   kp_gguf_w_add_tensor(w, "token_embd.weight", KP_DTYPE_F32, 2, ne, &err);
 *   kp_gguf_w_begin(w, "out.gguf", &err);           // header + tensor infos
 *   for (...) kp_gguf_w_write_data(w, row, row_bytes, &err);
 *   kp_gguf_w_finish(w, &err);                        // checks, flushes, closes
 *   kp_gguf_w_free(w);
 *
 * Every function returns KP_OK or an error (with a message in *err). An
 * error from an add function leaves the writer as it was; after an
 * error from begin/write_data/finish the writer is failed, every later call
 * returns KP_EINVAL, and kp_gguf_w_free removes the partial output file (when it
 * is a regular file the writer created from a path). Output is a pure
 * function of the calls made: no timestamps, no uninitialised bytes, so the
 * same calls give byte-identical files.
 *
 * Alignment: 32 bytes unless the metadata contains "general.alignment"
 * (added with any add function; it must be a UINT32 power of two), exactly as
 * readers interpret it. Tensor data offsets are tightly packed: each tensor
 * starts at the previous one's end rounded up to the alignment, and padding
 * (zero bytes) follows every tensor, the last one included, as llama.cpp's
 * writers do.
 */
#ifndef KP_GGUF_WRITE_H
#define KP_GGUF_WRITE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf/gguf.h"
#include "base/status.h"

/* GGML_MAX_NAME in ggml: tensor names must be shorter than this. */
#define KP_GGUF_W_MAX_TENSOR_NAME 64

typedef struct kp_gguf_w kp_gguf_w;

/* Creates an empty writer (no metadata, no tensors, alignment 32).
 * *out is owned by the caller; free with kp_gguf_w_free. KP_ENOMEM on failure. */
kp_status kp_gguf_w_new(kp_gguf_w **out, kp_error *err);

/* Frees the writer. If kp_gguf_w_begin opened a file from a path and
 * kp_gguf_w_finish did not complete successfully, the file is closed and, when
 * it is a regular file, removed. A stream given to kp_gguf_w_begin_stream is
 * never closed. NULL is a no-op. */
void kp_gguf_w_free(kp_gguf_w *w);

/* ---- metadata (only before kp_gguf_w_begin) ----
 * Keys are NUL-terminated, non-empty, at most 65535 bytes, and unique within
 * the file (a duplicate is KP_EINVAL). Values are copied; nothing the caller
 * passes is retained. Floats are written as IEEE binary32/64. */
kp_status kp_gguf_w_add_u8(kp_gguf_w *w, const char *key, uint8_t v, kp_error *err);
kp_status kp_gguf_w_add_i8(kp_gguf_w *w, const char *key, int8_t v, kp_error *err);
kp_status kp_gguf_w_add_u16(kp_gguf_w *w, const char *key, uint16_t v, kp_error *err);
kp_status kp_gguf_w_add_i16(kp_gguf_w *w, const char *key, int16_t v, kp_error *err);
kp_status kp_gguf_w_add_u32(kp_gguf_w *w, const char *key, uint32_t v, kp_error *err);
kp_status kp_gguf_w_add_i32(kp_gguf_w *w, const char *key, int32_t v, kp_error *err);
kp_status kp_gguf_w_add_u64(kp_gguf_w *w, const char *key, uint64_t v, kp_error *err);
kp_status kp_gguf_w_add_i64(kp_gguf_w *w, const char *key, int64_t v, kp_error *err);
kp_status kp_gguf_w_add_f32(kp_gguf_w *w, const char *key, float v, kp_error *err);
kp_status kp_gguf_w_add_f64(kp_gguf_w *w, const char *key, double v, kp_error *err);
kp_status kp_gguf_w_add_bool(kp_gguf_w *w, const char *key, bool v, kp_error *err);
/* A NUL-terminated string value. */
kp_status kp_gguf_w_add_str(kp_gguf_w *w, const char *key, const char *s, kp_error *err);
/* A string value of `len` arbitrary bytes (may contain NULs). */
kp_status kp_gguf_w_add_strn(kp_gguf_w *w, const char *key, const char *s, uint64_t len,
                          kp_error *err);

/* An array of n fixed-size elements. `elems` points to n values of the C
 * type matching elem_type (uint8_t for UINT8, int32_t for INT32, float for
 * FLOAT32, bool for BOOL, double for FLOAT64, ...), in host byte order; they
 * are written little-endian. elem_type STRING or ARRAY is KP_EINVAL (use the
 * functions below). elems may be NULL when n is 0. */
kp_status kp_gguf_w_add_arr(kp_gguf_w *w, const char *key, kp_gguf_type elem_type, const void *elems,
                         uint64_t n, kp_error *err);

/* An array of n NUL-terminated strings. */
kp_status kp_gguf_w_add_arr_str(kp_gguf_w *w, const char *key, const char *const *strs, uint64_t n,
                             kp_error *err);

/* Any value decoded by the reader (gguf.h), written back verbatim: the same
 * type, the same width, the same bytes (fixed-size arrays are copied raw,
 * arrays of strings and nested arrays element by element). The value is
 * only read during the call. */
kp_status kp_gguf_w_add_value(kp_gguf_w *w, const char *key, const kp_gguf_value *v, kp_error *err);

/* Copies one key/value pair from a reader (key need not be NUL-terminated). */
kp_status kp_gguf_w_copy_kv(kp_gguf_w *w, const kp_gguf_kv *kv, kp_error *err);

/* ---- tensors (only before kp_gguf_w_begin) ----
 * Declares a tensor: name shorter than KP_GGUF_W_MAX_TENSOR_NAME bytes and
 * unique, 1 <= n_dims <= KP_GGUF_MAX_DIMS, ne[0..n_dims-1] >= 1 in ggml order
 * (ne[0] is the row length), `type` a kp_dtype id known to dtype.h. ne[0]
 * must be a multiple of the type's block size (KP_EINVAL with a message
 * naming the tensor, the type and the block size otherwise). Its data must
 * later be written with kp_gguf_w_write_data, in declaration order. */
kp_status kp_gguf_w_add_tensor(kp_gguf_w *w, const char *name, uint32_t type, uint32_t n_dims,
                            const int64_t *ne, kp_error *err);

/* Number of tensors declared so far, and the data size in bytes of tensor i
 * (0 when i is out of range). */
size_t kp_gguf_w_n_tensors(const kp_gguf_w *w);
uint64_t kp_gguf_w_tensor_bytes(const kp_gguf_w *w, size_t i);

/* ---- output ---- */

/* Creates (or truncates) the file `path` and writes the header, the metadata,
 * the tensor infos and the padding up to the data section. KP_EIO naming the
 * path and the system error when the file cannot be created or written. */
kp_status kp_gguf_w_begin(kp_gguf_w *w, const char *path, kp_error *err);

/* Same, onto an open stream (borrowed: the writer flushes it in
 * kp_gguf_w_finish but never closes it). `name` is used in messages. */
kp_status kp_gguf_w_begin_stream(kp_gguf_w *w, FILE *stream, const char *name, kp_error *err);

/* File offset of the data section (valid after kp_gguf_w_begin). */
uint64_t kp_gguf_w_data_offset(const kp_gguf_w *w);

/* Appends n bytes of tensor data. The bytes go to the current tensor (the
 * first declared tensor whose data is not complete); a chunk may not run
 * past that tensor's end (KP_EINVAL). When a tensor's data is complete the
 * padding after it is written. KP_EIO on a write error (disk full...). */
kp_status kp_gguf_w_write_data(kp_gguf_w *w, const void *data, size_t n, kp_error *err);

/* Checks that every tensor's data was written (KP_EINVAL otherwise), flushes
 * and, for a path, closes the file (KP_EIO when that fails). After KP_OK the
 * file is complete and kp_gguf_w_free keeps it. */
kp_status kp_gguf_w_finish(kp_gguf_w *w, kp_error *err);

#endif
