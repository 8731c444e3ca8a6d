/*
 * tok_impl.h - internals shared by the tokenizer's files (not a public API).
 *
 *   tok_load.c    builds a kp_tok_vocab from GGUF metadata (tables below)
 *   tok.c         public queries, encode driver, special-token split,
 *                 pieces, detokenize, streaming
 *   tok_merge.c   the two merge loops (SPM by score, BPE by rank) and their
 *                 shared priority queue
 *   tok_pretok.c  pre-tokenizer names, regex lists, PCRE2 word splitting
 *
 * The vocabulary, once loaded, is never written again.
 */
#ifndef KP_TOK_IMPL_H
#define KP_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "base/status.h"
#include "tok/tok.h"

/* ---- pre-tokenizers (tok_pretok.c) ---- */

/* Regex families, one per distinct regex list in llama.cpp. */
typedef enum {
    KP_TOK_PRE_DEFAULT = 0,
    KP_TOK_PRE_LLAMA3,
    KP_TOK_PRE_DEEPSEEK_LLM,
    KP_TOK_PRE_DEEPSEEK3_LLM,
    KP_TOK_PRE_DEEPSEEK_CODER,
    KP_TOK_PRE_FALCON,
    KP_TOK_PRE_STARCODER,
    KP_TOK_PRE_GPT2,
    KP_TOK_PRE_QWEN2,
    KP_TOK_PRE_QWEN35,
    KP_TOK_PRE_PORO,
    KP_TOK_PRE_VIKING,
    KP_TOK_PRE_TEKKEN,
    KP_TOK_PRE_CHAMELEON,
    KP_TOK_PRE_GPT4O,
    KP_TOK_PRE_SEED_CODER,
    KP_TOK_PRE_BAILINGMOE,
    KP_TOK_PRE_UFAKZEKA,
    KP_TOK_PRE_COUNT_
} kp_tok_pre_kind;

/* Flags a pre-tokenizer name sets on the vocabulary, as llama.cpp does. */
enum {
    KP_TOK_PRE_F_IGNORE_MERGES = 1 << 0, /* a word that is a token is used whole */
    KP_TOK_PRE_F_ADD_BOS = 1 << 1,       /* add_bos defaults to true */
    KP_TOK_PRE_F_NO_CLEAN = 1 << 2,      /* no clean-spaces pass when detokenizing */
    KP_TOK_PRE_F_NO_BOS = 1 << 3         /* bos id defaults to none */
};

typedef struct {
    const char *name;    /* the tokenizer.ggml.pre string */
    kp_tok_pre_kind kind;
    unsigned flags;
} kp_tok_pre_info;

/* Looks up a tokenizer.ggml.pre value; NULL when kvpin does not know it. */
const kp_tok_pre_info *kp_tok_pre_find(const char *name, size_t len);

typedef struct kp_tok_pretok kp_tok_pretok;

/* Compiles the regex list of `kind` with PCRE2 (UTF, UCP, JIT when
 * available). KP_EFORMAT if PCRE2 rejects one (a bug), KP_ENOMEM. */
kp_status kp_tok_pretok_new(kp_tok_pretok **out, kp_tok_pre_kind kind, kp_error *err);
void kp_tok_pretok_free(kp_tok_pretok *p);

/* A word: bytes [start, start + len) of the text. */
typedef struct {
    size_t start, len;
} kp_tok_span;

/* Splits text[0..len), which must be valid UTF-8, into words the way
 * llama.cpp's unicode_regex_split does: each regex in turn splits every
 * piece left by the previous one into its matches and the gaps between
 * them. *words is malloc'd (owned by the caller; NULL when *n_words is 0).
 * KP_ERANGE when PCRE2 gives up (match limit), KP_ENOMEM. */
kp_status kp_tok_pretok_split(const kp_tok_pretok *p, const char *text, size_t len, kp_tok_span **words,
                           size_t *n_words, kp_error *err);

/* ---- BPE merge table (tok_merge.c) ---- */

/* Open-addressing map (left id, right id) -> (rank, merged id or -1). */
typedef struct {
    uint64_t *keys;  /* (uint64)left << 32 | right; KP_TOK_MERGE_EMPTY when free */
    int32_t *ranks;
    int32_t *results;
    uint64_t mask;   /* capacity - 1, capacity a power of two */
} kp_tok_merges;

#define KP_TOK_MERGE_EMPTY UINT64_MAX

kp_status kp_tok_merges_init(kp_tok_merges *m, size_t n_merges, kp_error *err);
void kp_tok_merges_free(kp_tok_merges *m);
/* Adds a pair unless already present (the first rank wins, as in llama.cpp). */
void kp_tok_merges_add(kp_tok_merges *m, int32_t left, int32_t right, int32_t rank, int32_t result);
/* Rank of the pair, or -1; *result gets the merged id (-1 if not a token). */
int32_t kp_tok_merges_find(const kp_tok_merges *m, int32_t left, int32_t right, int32_t *result);

/* ---- the vocabulary ---- */

struct kp_tok_vocab {
    kp_tok_model model;
    const char *model_name;     /* static string */
    char *pre_name;             /* resolved pre-tokenizer name (owned) */
    kp_tok_pre_kind pre_kind;
    char *pre_warning;          /* owned, or NULL */
    kp_buf warnings;            /* lines joined by '\n'; data NULL when none */

    int32_t n_vocab;
    char *text_arena;           /* every token text, each NUL-terminated */
    size_t *text_off;           /* [n_vocab] */
    uint32_t *text_len;         /* [n_vocab] */
    float *scores;              /* [n_vocab] */
    uint32_t *attrs;            /* [n_vocab] KP_TOK_ATTR_* */
    uint8_t *eog;               /* [n_vocab] 1 = end of generation */
    uint32_t max_token_len;

    int32_t *slots;             /* hash table text -> id, -1 = empty */
    uint64_t slot_mask;

    int32_t bos, eos, eot, eom, unk, sep, pad, mask, nl;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos, add_sep, add_space_prefix, clean_spaces, ignore_merges;

    /* Tokens the special-token split looks for (CONTROL, USER_DEFINED or
     * UNKNOWN), longest text first, ties by id. */
    int32_t *special;
    size_t n_special;
    size_t n_special_always;    /* how many of them are matched without parse_special */
    /* A byte trie over their texts, used to find which of them occur. */
    struct kp_tok_trie_node *trie;
    size_t n_trie;
    int32_t trie_root[256];     /* node index per first byte, -1 if none */

    /* SPM: the byte token of each byte (<0xXX>, else the 1-char token, else
     * -1). BPE: the token of each byte's GPT-2 code point, or -1. */
    int32_t byte_tok[256];
    /* SPM: no token has "▁" right after something other than a "▁", so the
     * text may be merged word by word (tok_merge.c) */
    bool spm_word_cuts;
    /* BPE, for bytes without a token: the tokens of the single raw bytes of
     * the byte's GPT-2 UTF-8 form (what llama.cpp looks up), -1 if none. */
    int32_t byte_fallback[256][2];
    kp_tok_merges merges;
    kp_tok_pretok *pretok;         /* BPE only */

    char *piece_arena;          /* token_to_piece(special = true) of each id */
    size_t *piece_off;
    uint32_t *piece_len;
};

typedef struct kp_tok_trie_node {
    int32_t first_child;
    int32_t next_sibling;
    int32_t special_index;      /* index into special[], or -1 */
    uint8_t byte;
} kp_tok_trie_node;

/* Hash of a byte string (FNV-1a, 64 bit). Inline, as the lookup below: the
 * loader (tok_load.c) and the tokenizers (tok.c, tok_merge.c) all use them,
 * and none of those files calls the others in a circle. */
static inline uint64_t kp_tok_hash(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

/* Id of the token whose text is s[0..len), or -1 (the vocabulary's hash). */
static inline int32_t kp_tok_lookup(const kp_tok_vocab *v, const char *s, size_t len) {
    if (!v->slots) return -1;
    for (uint64_t i = kp_tok_hash(s, len) & v->slot_mask;; i = (i + 1) & v->slot_mask) {
        int32_t id = v->slots[i];
        if (id < 0) return -1;
        if (v->text_len[id] == len && memcmp(v->text_arena + v->text_off[id], s, len) == 0) return id;
    }
}

/* ---- growable id array ---- */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} kp_tok_ids;

kp_status kp_tok_ids_push(kp_tok_ids *a, int32_t id, kp_error *err);

/* ---- merge loops (tok_merge.c) ---- */

/* Per-call scratch reused across fragments and words. */
typedef struct kp_tok_scratch kp_tok_scratch;
kp_tok_scratch *kp_tok_scratch_new(void);
void kp_tok_scratch_free(kp_tok_scratch *s);

/* SPM: tokenizes text[0..len) (spaces already turned into U+2581) and
 * appends the ids. */
kp_status kp_tok_spm_tokenize(const kp_tok_vocab *v, kp_tok_scratch *s, const char *text, size_t len,
                           kp_tok_ids *out, kp_error *err);

/* BPE: tokenizes one pre-tokenized word given as raw bytes (before the GPT-2
 * byte mapping) and appends the ids. */
kp_status kp_tok_bpe_word(const kp_tok_vocab *v, kp_tok_scratch *s, const uint8_t *word, size_t len,
                       kp_tok_ids *out, kp_error *err);

#endif
