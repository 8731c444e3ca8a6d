/*
 * tok.h - kvpin's tokenizer: text <-> token ids, exactly as llama.cpp does it.
 *
 * A tok_vocab is built once from a model's GGUF metadata and is read-only
 * afterwards, so any number of threads may encode and decode with it at the
 * same time (every call keeps its scratch memory to itself).
 *
 * Two tokenizer models are supported, chosen by `tokenizer.ggml.model`:
 *
 *   "llama"  SentencePiece-style (SPM): spaces become U+2581, a leading space
 *            is added (tokenizer.ggml.add_space_prefix, default true), pieces
 *            are merged by score, unknown characters fall back to byte
 *            tokens <0xXX>.
 *   "gpt2"   byte-level BPE: the text is split into words by the regexes of
 *            the pre-tokenizer named by `tokenizer.ggml.pre` (PCRE2), each
 *            word's bytes are mapped to GPT-2's printable code points and
 *            merged by rank from `tokenizer.ggml.merges`.
 *
 * Any other model ("bert", "t5", ...) is refused with KP_EUNSUPPORTED.
 *
 * Special tokens: control tokens (<s>, <|im_end|>, ...) are only recognised
 * in text when the caller asks for parse_special; user-defined tokens are
 * always recognised (as in llama.cpp and HF tokenizers).
 *
 * Typical use:
 *
 *   tok_vocab *v; kp_error err;
 *   if (tok_vocab_load(&v, g, &err) != KP_OK) { puts(err.msg); ... }
 *   int32_t *ids; size_t n;
 *   tok_encode(v, "Hello", 5, true, false, &ids, &n, &err);   // [BOS, ...]
 *   ... free(ids);
 *   tok_stream *s; tok_stream_new(&s, v, false, &err);
 *   for each generated id: tok_stream_push(s, id, &bytes, &nbytes, &err); write(bytes)
 *   tok_stream_flush(s, &bytes, &nbytes); tok_stream_free(s);
 *   tok_vocab_free(v);
 */
#ifndef KP_TOK_H
#define KP_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

typedef struct tok_vocab tok_vocab;

typedef enum {
    TOK_MODEL_SPM = 1, /* tokenizer.ggml.model = "llama" */
    TOK_MODEL_BPE = 2  /* tokenizer.ggml.model = "gpt2" */
} tok_model;

/* Token attributes (a bit set; the same bits as llama.cpp's llama_token_attr).
 * They come from `tokenizer.ggml.token_type` (NORMAL when the array is
 * absent) and are adjusted at load the way llama.cpp adjusts them (e.g.
 * end-of-generation tokens such as <|im_end|> become CONTROL). */
enum {
    TOK_ATTR_UNDEFINED = 0,
    TOK_ATTR_UNKNOWN = 1 << 0,
    TOK_ATTR_UNUSED = 1 << 1,
    TOK_ATTR_NORMAL = 1 << 2,
    TOK_ATTR_CONTROL = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_NORMALIZED = 1 << 6,
    TOK_ATTR_LSTRIP = 1 << 7,
    TOK_ATTR_RSTRIP = 1 << 8,
    TOK_ATTR_SINGLE_WORD = 1 << 9
};

/* Longest text tok_encode accepts (bytes); longer input is KP_ERANGE. */
#define TOK_MAX_TEXT ((size_t)512 << 20)

/* ---- loading ---- */

/* Builds a vocabulary from the tokenizer.* metadata of g. Everything needed
 * is COPIED: g may be closed right after this returns. On success *out is
 * owned by the caller (free with tok_vocab_free). Errors:
 *   KP_EUNSUPPORTED  tokenizer model other than "llama"/"gpt2", message
 *                    "unsupported tokenizer model 'bert'";
 *   KP_EFORMAT       missing/mistyped tokens array, scores or token types
 *                    shorter than the tokens, duplicate tokens, BPE merges
 *                    missing or naming unknown tokens, a bos/eos/eot/eom/unk
 *                    id outside the vocabulary, add_bos/add_eos set without
 *                    the matching id, a pre-tokenizer regex PCRE2 rejects;
 *   KP_ENOMEM.
 * An unknown `tokenizer.ggml.pre` is not an error: the default pre-tokenizer
 * is used and tok_pre_warning() says so. */
kp_status tok_vocab_load(tok_vocab **out, const gguf *g, kp_error *err);

void tok_vocab_free(tok_vocab *v); /* NULL is a no-op */

/* ---- properties (all O(1)) ---- */

int32_t tok_n_vocab(const tok_vocab *v);
tok_model tok_model_kind(const tok_vocab *v);
const char *tok_model_name(const tok_vocab *v); /* "llama" or "gpt2" */
/* The pre-tokenizer in use: the file's tokenizer.ggml.pre when kvpin knows
 * it, else "default" (also for SPM vocabularies, which have none). */
const char *tok_pre_name(const tok_vocab *v);
/* NULL, or a sentence explaining that the file's pre-tokenizer is unknown
 * (or missing, for BPE) and the default regexes are used instead. */
const char *tok_pre_warning(const tok_vocab *v);
/* NULL, or every load-time warning (the pre-tokenizer one included), one
 * per line: ignored out-of-range optional ids, and the like. */
const char *tok_warnings(const tok_vocab *v);

/* Special ids, -1 when the vocabulary has none. */
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_eot(const tok_vocab *v);
int32_t tok_unk(const tok_vocab *v);
int32_t tok_pad(const tok_vocab *v);
int32_t tok_nl(const tok_vocab *v); /* the token of "\n" (llama.cpp's linefeed id) */

/* Whether tok_encode(add_special = true) prepends BOS / appends EOS:
 * tokenizer.ggml.add_bos_token / add_eos_token when present, else
 * llama.cpp's defaults (SPM: BOS yes, EOS no; BPE: BOS only for the
 * llama3-family pre-tokenizers, EOS no). */
bool tok_add_bos(const tok_vocab *v);
bool tok_add_eos(const tok_vocab *v);
bool tok_add_space_prefix(const tok_vocab *v);

/* Per-token queries. An id outside [0, n_vocab) gives false / 0 / NULL. */
bool tok_is_eog(const tok_vocab *v, int32_t id);     /* end of generation */
bool tok_is_control(const tok_vocab *v, int32_t id);
uint32_t tok_attr(const tok_vocab *v, int32_t id);   /* TOK_ATTR_* bits */
float tok_score(const tok_vocab *v, int32_t id);
/* The raw vocabulary string (NUL-terminated, owned by v; *len excludes the
 * NUL and may be NULL). */
const char *tok_text(const tok_vocab *v, int32_t id, size_t *len);
/* The id whose raw string is exactly text[0..len), or -1. */
int32_t tok_find(const tok_vocab *v, const char *text, size_t len);

/* ---- text -> ids ---- */

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp
 * does: SPM falls back to byte tokens, BPE reads each bad byte as U+FFFD).
 * add_special: add BOS/EOS as tok_add_bos/tok_add_eos say. parse_special:
 * also recognise control-token texts (e.g. "<|im_start|>") as those tokens.
 * On success *ids is a malloc'd array of *n_ids ids owned by the caller
 * (NULL when *n_ids is 0). Errors: KP_EINVAL (NULL arguments), KP_ERANGE
 * (len > TOK_MAX_TEXT, or a regex hitting PCRE2's match limit), KP_ENOMEM. */
kp_status tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **ids, size_t *n_ids, kp_error *err);

/* ---- ids -> text ---- */

/* The bytes of one token (llama_token_to_piece with lstrip = 0): SPM pieces
 * have U+2581 turned back into spaces, byte tokens give their byte, BPE
 * pieces are mapped back from GPT-2's byte code points. Control and unknown
 * tokens give nothing unless `special`. *len receives the piece length; the
 * bytes (no NUL) are copied into buf when cap >= *len, else KP_ERANGE and
 * nothing is copied. Id out of range: KP_EINVAL. */
kp_status tok_piece(const tok_vocab *v, int32_t id, bool special, char *buf, size_t cap,
                    size_t *len, kp_error *err);

/* The same piece without copying: a pointer into v (valid until
 * tok_vocab_free, not NUL-terminated) and its length, or NULL for an id out
 * of range. */
const char *tok_piece_view(const tok_vocab *v, int32_t id, bool special, size_t *len);

/* Detokenizes a whole sequence like llama_detokenize: the pieces are
 * concatenated; when the vocabulary adds a space prefix (SPM) one leading
 * space of the first piece is removed, unless the sequence starts with BOS;
 * remove_special drops a leading BOS / trailing EOS the vocabulary would
 * add; unparse_special renders control tokens' text; BPE vocabularies whose
 * pre-tokenizer asks for it get llama.cpp's "clean spaces" pass
 * (" ." -> ".", " 's" -> "'s", ...). On success *text is malloc'd (NUL-
 * terminated, owned by the caller) and *len its length. KP_EINVAL for an id
 * out of range. */
kp_status tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n_ids, bool remove_special,
                         bool unparse_special, char **text, size_t *len, kp_error *err);

/* ---- streaming detokenization ---- */

/* Turns a stream of ids into a stream of valid UTF-8 bytes: a character
 * split across tokens (byte tokens, partial BPE pieces) is held back until
 * it is complete; every invalid byte sequence is replaced by U+FFFD (one
 * per maximal invalid subpart, the W3C rule); an incomplete character left
 * at the end is replaced by U+FFFD on flush. Concatenating everything push
 * and flush return is valid UTF-8 and, for valid input, equals the
 * concatenated pieces. */
typedef struct tok_stream tok_stream;

/* v is borrowed and must outlive the stream. special: render control tokens. */
kp_status tok_stream_new(tok_stream **out, const tok_vocab *v, bool special, kp_error *err);
void tok_stream_free(tok_stream *s); /* NULL is a no-op */

/* Feeds one id. *bytes / *n_bytes receive the newly complete output (maybe
 * none); the pointer is into the stream's own buffer and stays valid until
 * the next push/flush/reset/free. KP_EINVAL for an id out of range (the
 * stream is unchanged), KP_ENOMEM. */
kp_status tok_stream_push(tok_stream *s, int32_t id, const char **bytes, size_t *n_bytes,
                          kp_error *err);

/* Ends the stream: returns the replacement for any held-back incomplete
 * character (or nothing) and resets the stream for reuse. */
void tok_stream_flush(tok_stream *s, const char **bytes, size_t *n_bytes);

/* Drops any held-back bytes without output. */
void tok_stream_reset(tok_stream *s);

#endif
