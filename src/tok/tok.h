/*
 * tok.h - kvpin's tokenizer: text <-> token ids, exactly as llama.cpp does it.
 *
 * A kp_tok_vocab is built once from a model's GGUF metadata and is read-only
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
 *   kp_tok_vocab *v; kp_error err;
 *   if (kp_tok_vocab_load(&v, g, &err) != KP_OK) { puts(err.msg); ... }
 *   int32_t *ids; size_t n;
 *   kp_tok_encode(v, "Hello", 5, true, false, &ids, &n, &err);   // [BOS, ...]
 *   ... free(ids);
 *   kp_tok_stream *s; kp_tok_stream_new(&s, v, false, &err);
 *   for each generated id: kp_tok_stream_push(s, id, &bytes, &nbytes, &err); write(bytes)
 *   kp_tok_stream_flush(s, &bytes, &nbytes); kp_tok_stream_free(s);
 *   kp_tok_vocab_free(v);
 */
#ifndef KP_TOK_H
#define KP_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "base/status.h"

typedef struct kp_tok_vocab kp_tok_vocab;

typedef enum {
    KP_TOK_MODEL_SPM = 1, /* tokenizer.ggml.model = "llama" */
    KP_TOK_MODEL_BPE = 2  /* tokenizer.ggml.model = "gpt2" */
} kp_tok_model;

/* Token attributes (a bit set; the same bits as llama.cpp's llama_token_attr).
 * They come from `tokenizer.ggml.token_type` (NORMAL when the array is
 * absent) and are adjusted at load the way llama.cpp adjusts them (e.g.
 * end-of-generation tokens such as <|im_end|> become CONTROL). */
enum {
    KP_TOK_ATTR_UNDEFINED = 0,
    KP_TOK_ATTR_UNKNOWN = 1 << 0,
    KP_TOK_ATTR_UNUSED = 1 << 1,
    KP_TOK_ATTR_NORMAL = 1 << 2,
    KP_TOK_ATTR_CONTROL = 1 << 3,
    KP_TOK_ATTR_USER_DEFINED = 1 << 4,
    KP_TOK_ATTR_BYTE = 1 << 5,
    KP_TOK_ATTR_NORMALIZED = 1 << 6,
    KP_TOK_ATTR_LSTRIP = 1 << 7,
    KP_TOK_ATTR_RSTRIP = 1 << 8,
    KP_TOK_ATTR_SINGLE_WORD = 1 << 9
};

/* Longest text kp_tok_encode accepts (bytes); longer input is KP_ERANGE. */
#define KP_TOK_MAX_TEXT ((size_t)512 << 20)

/* ---- loading ---- */

/* Builds a vocabulary from the tokenizer.* metadata of g. Everything needed
 * is COPIED: g may be closed right after this returns. On success *out is
 * owned by the caller (free with kp_tok_vocab_free). Errors:
 *   KP_EUNSUPPORTED  tokenizer model other than "llama"/"gpt2", message
 *                    "unsupported tokenizer model 'bert'";
 *   KP_EFORMAT       missing/mistyped tokens array, scores or token types
 *                    shorter than the tokens, duplicate tokens, BPE merges
 *                    missing or naming unknown tokens, a bos/eos/eot/eom/unk
 *                    id outside the vocabulary, add_bos/add_eos set without
 *                    the matching id, a pre-tokenizer regex PCRE2 rejects;
 *   KP_ENOMEM.
 * An unknown `tokenizer.ggml.pre` is not an error: the default pre-tokenizer
 * is used and kp_tok_pre_warning() says so. */
kp_status kp_tok_vocab_load(kp_tok_vocab **out, const kp_gguf *g, kp_error *err);

void kp_tok_vocab_free(kp_tok_vocab *v); /* NULL is a no-op */

/* ---- properties (all O(1)) ---- */

int32_t kp_tok_n_vocab(const kp_tok_vocab *v);
kp_tok_model kp_tok_model_kind(const kp_tok_vocab *v);
const char *kp_tok_model_name(const kp_tok_vocab *v); /* "llama" or "gpt2" */
/* The pre-tokenizer in use: the file's tokenizer.ggml.pre when kvpin knows
 * it, else "default" (also for SPM vocabularies, which have none). */
const char *kp_tok_pre_name(const kp_tok_vocab *v);
/* NULL, or a sentence explaining that the file's pre-tokenizer is unknown
 * (or missing, for BPE) and the default regexes are used instead. */
const char *kp_tok_pre_warning(const kp_tok_vocab *v);
/* NULL, or every load-time warning (the pre-tokenizer one included), one
 * per line: ignored out-of-range optional ids, and the like. */
const char *kp_tok_warnings(const kp_tok_vocab *v);

/* Special ids, -1 when the vocabulary has none. */
int32_t kp_tok_bos(const kp_tok_vocab *v);
int32_t kp_tok_eos(const kp_tok_vocab *v);
int32_t kp_tok_eot(const kp_tok_vocab *v);
int32_t kp_tok_unk(const kp_tok_vocab *v);
int32_t kp_tok_pad(const kp_tok_vocab *v);
int32_t kp_tok_nl(const kp_tok_vocab *v); /* the token of "\n" (llama.cpp's linefeed id) */

/* Whether kp_tok_encode(add_special = true) prepends BOS / appends EOS:
 * tokenizer.ggml.add_bos_token / add_eos_token when present, else
 * llama.cpp's defaults (SPM: BOS yes, EOS no; BPE: BOS only for the
 * llama3-family pre-tokenizers, EOS no). */
bool kp_tok_add_bos(const kp_tok_vocab *v);
bool kp_tok_add_eos(const kp_tok_vocab *v);
bool kp_tok_add_space_prefix(const kp_tok_vocab *v);

/* Per-token queries. An id outside [0, n_vocab) gives false / 0 / NULL. */
bool kp_tok_is_eog(const kp_tok_vocab *v, int32_t id);     /* end of generation */
bool kp_tok_is_control(const kp_tok_vocab *v, int32_t id);
uint32_t kp_tok_attr(const kp_tok_vocab *v, int32_t id);   /* KP_TOK_ATTR_* bits */
float kp_tok_score(const kp_tok_vocab *v, int32_t id);
/* The raw vocabulary string (NUL-terminated, owned by v; *len excludes the
 * NUL and may be NULL). */
const char *kp_tok_text(const kp_tok_vocab *v, int32_t id, size_t *len);
/* The id whose raw string is exactly text[0..len), or -1. */
int32_t kp_tok_find(const kp_tok_vocab *v, const char *text, size_t len);

/* ---- text -> ids ---- */

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp
 * does: SPM falls back to byte tokens, BPE reads each bad byte as U+FFFD).
 * add_special: add BOS/EOS as kp_tok_add_bos/kp_tok_add_eos say. parse_special:
 * also recognise control-token texts (e.g. "<|im_start|>") as those tokens.
 * On success *ids is a malloc'd array of *n_ids ids owned by the caller
 * (NULL when *n_ids is 0). Errors: KP_EINVAL (NULL arguments), KP_ERANGE
 * (len > KP_TOK_MAX_TEXT, or a regex hitting PCRE2's match limit), KP_ENOMEM. */
kp_status kp_tok_encode(const kp_tok_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **ids, size_t *n_ids, kp_error *err);

/* A byte range [start, start + len) of a text. */
typedef struct {
    size_t start, len;
} kp_tok_range;

/* kp_tok_encode with parse_special, except inside the byte ranges
 * plain[0..n_plain) (sorted by start, not overlapping): a control or
 * unknown token's text that overlaps one of them is not a token there, as
 * with parse_special false (user-defined tokens are parsed everywhere, as
 * kp_tok_encode always parses them). For a rendered chat template: its
 * markup may produce control tokens (<|im_start|>, </s>), the client's
 * text (the plain ranges) may not, so "a </s> b" in a message stays text.
 * With no ranges this is kp_tok_encode(..., parse_special = true, ...); a
 * range over the whole text gives parse_special = false. Errors as
 * kp_tok_encode; KP_EINVAL for ranges out of order or past the text. */
kp_status kp_tok_encode_plain(const kp_tok_vocab *v, const char *text, size_t len, bool add_special,
                              const kp_tok_range *plain, size_t n_plain, int32_t **ids, size_t *n_ids,
                              kp_error *err);

/* ---- ids -> text ---- */

/* The bytes of one token (llama_token_to_piece with lstrip = 0): SPM pieces
 * have U+2581 turned back into spaces, byte tokens give their byte, BPE
 * pieces are mapped back from GPT-2's byte code points. Control and unknown
 * tokens give nothing unless `special`. *len receives the piece length; the
 * bytes (no NUL) are copied into buf when cap >= *len, else KP_ERANGE and
 * nothing is copied. Id out of range: KP_EINVAL. */
kp_status kp_tok_piece(const kp_tok_vocab *v, int32_t id, bool special, char *buf, size_t cap,
                    size_t *len, kp_error *err);

/* The same piece without copying: a pointer into v (valid until
 * kp_tok_vocab_free, not NUL-terminated) and its length, or NULL for an id out
 * of range. */
const char *kp_tok_piece_view(const kp_tok_vocab *v, int32_t id, bool special, size_t *len);

/* Detokenizes a whole sequence like llama_detokenize: the pieces are
 * concatenated; when the vocabulary adds a space prefix (SPM) one leading
 * space of the first piece is removed, unless the sequence starts with BOS;
 * remove_special drops a leading BOS / trailing EOS the vocabulary would
 * add; unparse_special renders control tokens' text; BPE vocabularies whose
 * pre-tokenizer asks for it get llama.cpp's "clean spaces" pass
 * (" ." -> ".", " 's" -> "'s", ...). On success *text is malloc'd (NUL-
 * terminated, owned by the caller) and *len its length. KP_EINVAL for an id
 * out of range. */
kp_status kp_tok_detokenize(const kp_tok_vocab *v, const int32_t *ids, size_t n_ids, bool remove_special,
                         bool unparse_special, char **text, size_t *len, kp_error *err);

/* kp_tok_detokenize without the clean-spaces pass: the pieces exactly as
 * they tokenize (for a byte-level BPE vocabulary, the text that was
 * tokenized), so that two sequences with equal first tokens have equal
 * first bytes whatever the vocabulary does to spaces when it shows text.
 * end (may be NULL, else n_ids entries) gets the length of the text of
 * ids[0..i] for each i: a token's byte span in the text (a BOS or EOS that
 * remove_special drops ends where the text before it ends). */
kp_status kp_tok_detokenize_raw(const kp_tok_vocab *v, const int32_t *ids, size_t n_ids, bool remove_special,
                                bool unparse_special, char **text, size_t *len, size_t *end, kp_error *err);

/* ---- streaming detokenization ---- */

/* Turns a stream of ids into a stream of valid UTF-8 bytes: a character
 * split across tokens (byte tokens, partial BPE pieces) is held back until
 * it is complete; every invalid byte sequence is replaced by U+FFFD (one
 * per maximal invalid subpart, the W3C rule); an incomplete character left
 * at the end is replaced by U+FFFD on flush. Concatenating everything push
 * and flush return is valid UTF-8 and, for valid input, equals the
 * concatenated pieces. */
typedef struct kp_tok_stream kp_tok_stream;

/* v is borrowed and must outlive the stream. special: render control tokens. */
kp_status kp_tok_stream_new(kp_tok_stream **out, const kp_tok_vocab *v, bool special, kp_error *err);
void kp_tok_stream_free(kp_tok_stream *s); /* NULL is a no-op */

/* Feeds one id. *bytes / *n_bytes receive the newly complete output (maybe
 * none); the pointer is into the stream's own buffer and stays valid until
 * the next push/flush/reset/free. KP_EINVAL for an id out of range (the
 * stream is unchanged), KP_ENOMEM. */
kp_status kp_tok_stream_push(kp_tok_stream *s, int32_t id, const char **bytes, size_t *n_bytes,
                          kp_error *err);

/* Ends the stream: returns the replacement for any held-back incomplete
 * character (or nothing) and resets the stream for reuse. */
void kp_tok_stream_flush(kp_tok_stream *s, const char **bytes, size_t *n_bytes);

/* Drops any held-back bytes without output. */
void kp_tok_stream_reset(kp_tok_stream *s);

#endif
