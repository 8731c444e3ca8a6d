/*
 * kvpin.h - the kvpin library: CPU LLM inference whose KV cache is the
 * product. A long, stable prompt prefix is computed once and reused
 * exactly by every later generation that shares it, and when it is not
 * reused the cache report says where and why.
 *
 * This is the only public header. It includes libc headers alone, compiles
 * as C11 and as C++ (extern "C"), and every name it declares starts with
 * kp_ (KP_ for macros and enum values), so libkvpin links beside other
 * inference libraries. Link with `pkg-config --cflags --libs kvpin`
 * (`--static` for libkvpin.a).
 *
 * Two opaque handles, each made by x_new/x_open and freed by x_free
 * (x_free(NULL) is a no-op):
 *
 *   kp_lm        a model file opened: its weights (mapped, used in place,
 *                never copied) and its tokenizer. Read-only once open: any
 *                number of sessions and threads may share one.
 *   kp_session   an engine over one kp_lm: the KV pool (a byte budget), the
 *                prefix cache that keeps the K/V of every finished
 *                generation (prompt and answer) for the next one, a thread
 *                pool for the forward pass, and the history the cache
 *                reports compare against. One thread at a time uses a
 *                session; two sessions never share K/V.
 *
 *   kp_lm_open -> kp_session_new -> kp_generate_text / kp_generate ...
 *              -> kp_session_free -> kp_lm_free
 *
 * A generation (kp_generate, kp_generate_text): the prompt's longest
 * cached prefix is reused token for token, the rest is computed, then
 * tokens are sampled one at a time until max_tokens, an end-of-generation
 * token, a stop string, the context end or the caller's callback ends it;
 * the text is streamed to the callback as whole UTF-8 characters (a stop
 * string never shows). Afterwards the prompt and the answer are cached, and
 * the output holds the generated ids, the whole text and the cache report:
 * the tokens reused and computed, and where (token, byte) and why (cold,
 * hit, evicted, timestamp, counter, identifier, reordered_json, whitespace,
 * inserted_at_front, other, retokenized, template_rewrites_history,
 * new_prefix, window_evicted, recurrent_state) the
 * prompt left the cache. Greedy outputs with
 * and without the prefix cache are the same: a reused K/V row is the row
 * the same tokens at the same positions produce again.
 *
 * Errors are values: every fallible function returns a kp_rc (KP_RC_OK on
 * success) and, when given a kp_err (NULL is allowed), fills it with a
 * one-line message naming what failed (a file, a token id, a limit). The
 * library never prints, never exits, never aborts on bad input. Memory the
 * library returns to the caller (kp_tokenize, kp_detokenize) is freed with
 * kp_mem_free; pointers in a kp_output stay owned by the session.
 *
 * Example (two turns of an agent; the second reuses the first's K/V):
 *
 *   kp_err err;
 *   kp_lm *lm = NULL;
 *   kp_session *s = NULL;
 *   if (kp_lm_open(&lm, "stories260K.gguf", &err) != KP_RC_OK ||
 *       kp_session_new(&s, lm, NULL, &err) != KP_RC_OK) {
 *       fprintf(stderr, "%s\n", err.msg); ...
 *   }
 *   kp_request rq = kp_request_defaults();
 *   rq.sampling.temp = 0;                         // greedy
 *   rq.max_tokens = 32;
 *   kp_output out;
 *   kp_generate_text(s, "Once upon a time", 16, &rq, &out, &err);
 *   ... prompt 2 = prompt 1 + out.text + the next user words ...
 *   kp_generate_text(s, prompt2, strlen(prompt2), &rq, &out, &err);
 *   printf("%u of %u prompt tokens reused (%s)\n", out.cache.reused_tokens,
 *          out.cache.prompt_tokens, out.cache.cause_name);
 *   kp_session_free(s);
 *   kp_lm_free(lm);
 *
 * examples/agent_turns.c is this example whole.
 */
#ifndef KVPIN_H
#define KVPIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define KP_API __attribute__((visibility("default")))
#else
#define KP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version; kp_version() returns the same string. The shared
 * library's SONAME carries the major number (libkvpin.so.0). */
#define KP_VERSION_MAJOR 0
#define KP_VERSION_MINOR 9
#define KP_VERSION_PATCH 0
#define KP_VERSION "0.9.0"

/* ---- errors ----------------------------------------------------------- */

/* What a fallible function returns. */
typedef enum {
    KP_RC_OK = 0,
    KP_RC_NOMEM,       /* allocation failed */
    KP_RC_IO,          /* a file could not be opened, read or mapped */
    KP_RC_FORMAT,      /* a malformed model file */
    KP_RC_UNSUPPORTED, /* well-formed, but something kvpin does not implement
                          (an architecture, a tokenizer, a weight type) */
    KP_RC_INVAL,       /* a bad argument (NULL, a token id outside the vocabulary,
                          a sampling parameter out of range) */
    KP_RC_NOTFOUND,    /* a looked-up thing does not exist (a pin, an uncached prefix) */
    KP_RC_RANGE,       /* a value beyond its limit (a prompt longer than the context) */
    KP_RC_FULL         /* a bounded resource is full (the KV budget cannot hold the
                          sequence, the pinned-bytes cap) */
} kp_rc;

#define KP_ERR_MSG_MAX 512

/* A failed call's code and one-line message (NUL-terminated), written only
 * when the call fails. */
typedef struct {
    kp_rc code;
    char msg[KP_ERR_MSG_MAX];
} kp_err;

/* A short constant name for rc ("ok", "out of memory", "i/o error", "bad
 * format", ...); "unknown status" for a value outside the enum. Static
 * storage: never freed. */
KP_API const char *kp_rc_name(kp_rc rc);

/* The version of the library linked in (KP_VERSION of the build), static
 * storage. Compare with KP_VERSION to see header and library agree. */
KP_API const char *kp_version(void);

/* Frees memory the library handed to the caller (the ids of kp_tokenize,
 * the text of kp_detokenize). NULL is a no-op. */
KP_API void kp_mem_free(void *p);

/* ---- model files ------------------------------------------------------ */

typedef struct kp_lm kp_lm;

/* Opens a GGUF model file: maps it, checks every tensor the architecture
 * needs (llama, qwen2, qwen3), and builds its tokenizer (SentencePiece or
 * byte-level BPE, as llama.cpp does). path is borrowed for the call. On
 * success *out is the caller's, to free with kp_lm_free; on failure *out is
 * NULL and err says why, naming the file: KP_RC_IO (cannot open or map),
 * KP_RC_FORMAT (not GGUF, a missing or mis-shaped tensor or tokenizer
 * key), KP_RC_UNSUPPORTED (architecture, tokenizer or weight type),
 * KP_RC_INVAL (NULL arguments), KP_RC_NOMEM. */
KP_API kp_rc kp_lm_open(kp_lm **out, const char *path, kp_err *err);

/* Unmaps and frees the model. Every session made over it must be freed
 * first. NULL is a no-op. */
KP_API void kp_lm_free(kp_lm *lm);

/* What kp_lm_describe tells about a model. */
typedef struct {
    const char *arch;      /* "llama", "qwen2", "qwen3" (owned by the kp_lm) */
    const char *tokenizer; /* "llama" (SentencePiece) or "gpt2" (byte-level BPE) */
    uint32_t n_vocab;
    uint32_t n_ctx_train;  /* the training context the file declares */
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    int32_t bos, eos;      /* special ids, -1 when the vocabulary has none */
    bool add_bos;          /* kp_tokenize(add_special) prepends bos */
    uint64_t weight_bytes; /* bytes of the tensors in the file */
} kp_lm_info;

/* Fills *out (strings borrowed from lm, valid until kp_lm_free). */
KP_API void kp_lm_describe(const kp_lm *lm, kp_lm_info *out);

/* Whether id ends generation (EOS, EOT and the like); false outside the
 * vocabulary. */
KP_API bool kp_lm_is_eog(const kp_lm *lm, int32_t id);

/* ---- tokens ----------------------------------------------------------- */

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp
 * does) exactly as llama.cpp does. add_special: add BOS (and EOS) as the
 * model asks (kp_lm_info.add_bos). parse_special: also read control-token
 * texts ("<|im_start|>") as those tokens. On success *ids is an array of
 * *n_ids ids the caller frees with kp_mem_free (NULL when *n_ids is 0).
 * KP_RC_INVAL (NULL arguments), KP_RC_RANGE (text over 512 MiB),
 * KP_RC_NOMEM. */
KP_API kp_rc kp_tokenize(const kp_lm *lm, const char *text, size_t len, bool add_special, bool parse_special,
                         int32_t **ids, size_t *n_ids, kp_err *err);

/* The prompt a generation starts from, as kp_generate_text and `kvpin run`
 * tokenize it: text[0..len) tokenized as kp_tokenize does, and when that
 * gives no id at all (an empty text, and BOS not added: add_special false
 * or a model that adds none) BOS alone, so there is always a token to
 * generate from. On success *ids holds *n_ids >= 1 ids the caller frees
 * with kp_mem_free. KP_RC_INVAL (NULL arguments; an empty prompt and a
 * model without a BOS token), KP_RC_RANGE (text over 512 MiB), KP_RC_NOMEM. */
KP_API kp_rc kp_tokenize_prompt(const kp_lm *lm, const char *text, size_t len, bool add_special,
                                bool parse_special, int32_t **ids, size_t *n_ids, kp_err *err);

/* The text of ids[0..n_ids) as one string, the way `kvpin detokenize`
 * prints it (llama.cpp's llama_detokenize: SentencePiece's leading space is
 * dropped unless the ids start with BOS). special: control tokens render as
 * their text ("</s>"), else as nothing. On success *text is NUL-terminated,
 * *len its length (may be NULL); the caller frees it with kp_mem_free.
 * KP_RC_INVAL (an id outside the vocabulary, NULL arguments), KP_RC_NOMEM. */
KP_API kp_rc kp_detokenize(const kp_lm *lm, const int32_t *ids, size_t n_ids, bool special, char **text,
                           size_t *len, kp_err *err);

/* ---- sessions: the engine and its prefix cache ------------------------ */

typedef struct kp_session kp_session;

/* Element type of the cached K and V rows. */
typedef enum {
    KP_KV_F16 = 0, /* half the memory; the default */
    KP_KV_F32 = 1,
    KP_KV_Q8_0 = 2, /* ggml's q8_0 blocks: 32 values in 34 bytes; needs head_dim % 32 == 0 */
    KP_KV_Q4_0 = 3  /* ggml's q4_0 blocks: 32 values in 18 bytes; needs head_dim % 32 == 0 */
} kp_kv_type;

/* How a session is made. All zeros (or NULL) are the defaults. */
typedef struct {
    uint32_t n_ctx;        /* positions one sequence may hold (prompt + answer);
                              0: min(training context, 4096) */
    kp_kv_type kv_type;    /* K and V rows: KP_KV_F16 (0), KP_KV_F32, KP_KV_Q8_0, KP_KV_Q4_0 */
    uint64_t kv_budget;    /* bytes of the KV pool; the prefix cache lives in what
                              the running sequence leaves free, evicting the least
                              recently used prefixes when it runs out; 0: room for
                              2 x (n_ctx + kv_block) positions, at most half of RAM */
    uint32_t kv_block;     /* positions per KV block; 0: 16 */
    int n_threads;         /* threads of the forward pass; <= 0: every core */
    bool no_prefix_cache;  /* true: nothing is cached, every prompt is computed whole */
    bool kv_type_v_set;    /* true: V rows are kv_type_v (K stays kv_type) */
    kp_kv_type kv_type_v;
    bool no_repack;        /* true: the kernels read every weight where the model file
                              maps it; false (default): where the CPU's kernels have a
                              layout of their own for a weight type (F16, BF16, Q8_0,
                              Q4_0, Q4_K, Q6_K with AVX-512 VNNI), the session keeps a
                              repacked copy of those matrices (as many bytes again;
                              faster decode, the same results bit for bit) */
    uint64_t window_budget;/* a model with sliding-window layers (gemma3, gpt-oss):
                              bytes of kv_budget for those layers' K/V, which cached
                              prefixes then keep only near their ends, so a prompt
                              that diverges elsewhere resumes at the latest position
                              whose window is held (cause window_evicted); 0: every
                              cached position keeps it (docs/window-budget.md) */
    uint32_t state_every;  /* a model with recurrent layers (qwen35): a sequence's
                              state is snapshotted into the prefix cache every this
                              many positions (and at prompt ends, sequence ends and
                              pins), so reuse resumes at most this far before where a
                              prompt diverged; 0: 256 (docs/state-checkpoints.md) */
} kp_session_params;

/* Makes a session over lm (borrowed: it must outlive the session). p NULL:
 * the defaults. On success *out is the caller's (kp_session_free); on
 * failure NULL. KP_RC_INVAL (NULL lm, a budget smaller than one block, a
 * kv_type outside the enum, Q8_0/Q4_0 with a head_dim that is not a
 * multiple of 32), KP_RC_RANGE (n_ctx over 2^24, kv_block over
 * 4096, n_threads over 1024), KP_RC_NOMEM. A budget smaller than n_ctx
 * positions is allowed: a sequence that outgrows it fails with KP_RC_FULL. */
KP_API kp_rc kp_session_new(kp_session **out, const kp_lm *lm, const kp_session_params *p, kp_err *err);

/* Frees the KV pool, the prefix cache and the threads. NULL is a no-op. */
KP_API void kp_session_free(kp_session *s);

/* The session's context: positions one sequence may hold. */
KP_API uint32_t kp_session_n_ctx(const kp_session *s);

/* ---- generation ------------------------------------------------------- */

/* The sampling chain, in llama.cpp's order: repetition, presence and
 * frequency penalties over the last repeat_last_n tokens, top-k, top-p,
 * min-p, temperature, then a draw from a generator seeded by seed. The
 * same seed and prompt give the same tokens on every machine. */
typedef struct {
    float temp;              /* <= 0: greedy (argmax, ties to the lowest id) */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* in [0, 1]; 1: off */
    float min_p;             /* in [0, 1]; 0: off */
    float repeat_penalty;    /* > 0; 1: off */
    int32_t repeat_last_n;   /* the penalties' window; 0: off, -1: every token */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    uint64_t seed;
} kp_sampling;

/* `kvpin run`'s defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * repeat_penalty 1, repeat_last_n 64, presence and frequency 0, seed 0. */
KP_API kp_sampling kp_sampling_defaults(void);

/* Receives generated text as it is released: whole UTF-8 characters, never
 * a part of a stop string. text[0..len) is borrowed for the call (not
 * NUL-terminated). Return 0 to go on; anything else ends the generation
 * after this token (kp_output.end KP_END_CANCELLED). */
typedef int (*kp_text_fn)(void *user, const char *text, size_t len);

#define KP_MAX_STOPS 16

/* One generation's parameters. Start from kp_request_defaults(). */
typedef struct {
    kp_sampling sampling;
    uint32_t max_tokens;      /* tokens to generate at most (0: none; the prompt
                                 is still computed and cached) */
    const char *const *stops; /* n_stops non-empty strings, at most KP_MAX_STOPS,
                                 borrowed for the call: the text ends before the
                                 first one completed */
    size_t n_stops;
    bool ignore_eos;          /* end-of-generation tokens are ordinary tokens */
    bool special;             /* kp_generate_text parses control-token texts in the
                                 prompt; the output renders control tokens as text */
    bool no_bos;              /* kp_generate_text adds no BOS (nor EOS) */
    kp_text_fn on_text;       /* NULL: the text is only collected in kp_output.text */
    void *user;               /* passed to on_text */
} kp_request;

/* sampling kp_sampling_defaults(), max_tokens 128, no stops, the rest off
 * (`kvpin run`'s defaults but its random seed). */
KP_API kp_request kp_request_defaults(void);

/* How a generation ended. */
typedef enum {
    KP_END_LENGTH = 1,    /* max_tokens, or the context end */
    KP_END_STOP = 2,      /* an end-of-generation token or a stop string */
    KP_END_CANCELLED = 3, /* the callback asked to stop */
    KP_END_ERROR = 4      /* a step failed (the call returned an error) */
} kp_end;

/* Why a prompt did not reuse more of the cache (kvpin doctor's causes). */
typedef enum {
    KP_CAUSE_HIT = 0,          /* "hit": the prompt starts with what was cached */
    KP_CAUSE_COLD,             /* "cold": nothing cached shares its start */
    KP_CAUSE_EVICTED,          /* "evicted": a matching prefix was cached, then evicted */
    KP_CAUSE_TIMESTAMP,        /* "timestamp": a date or time changed */
    KP_CAUSE_COUNTER,          /* "counter": a number changed */
    KP_CAUSE_IDENTIFIER,       /* "identifier": a UUID, hex id or request id changed */
    KP_CAUSE_REORDERED_JSON,   /* "reordered_json": the same JSON keys in another order */
    KP_CAUSE_WHITESPACE,       /* "whitespace": equal but for whitespace */
    KP_CAUSE_INSERTED_AT_FRONT,/* "inserted_at_front": text inserted before cached text */
    KP_CAUSE_OTHER,            /* "other": any other edit */
    KP_CAUSE_RETOKENIZED,      /* "retokenized": the same text split into other tokens */
    KP_CAUSE_TEMPLATE_REWRITES_HISTORY,/* "template_rewrites_history": the chat template
                                          renders an earlier turn otherwise */
    KP_CAUSE_NEW_PREFIX,       /* "new_prefix": only a short start (the template's
                                  opening) is shared: a different conversation */
    KP_CAUSE_WINDOW_EVICTED,   /* "window_evicted": the tokens matched further, but
                                  the sliding-window layers' K/V before that point
                                  was dropped (a window budget): reuse resumed at
                                  the latest position whose window was held */
    KP_CAUSE_RECURRENT_STATE,  /* "recurrent_state": the model has recurrent layers
                                  (qwen35) whose state cannot be cut back to a shared
                                  prefix: nothing is reused (no longer reported: the
                                  prefix cache keeps state snapshots) */
    KP_CAUSE_STATE_CHECKPOINT  /* "state_checkpoint": the tokens matched further, but
                                  the model's recurrent state (qwen35) was snapshotted
                                  last before that point: reuse resumed at the latest
                                  snapshot, the rest was computed again
                                  (state_recomputed_tokens) */
} kp_cause;

#define KP_REPORT_DETAIL_MAX 320
#define KP_REPORT_SNIPPET_MAX 256
#define KP_REPORT_ADVICE_MAX 512

/* Where a prompt left the prefix cache and why: what `kvpin run
 * --prompt-cache` prints per turn and the server's kvpin_cache object. The
 * cached text compared against is the earlier sequence (prompt + answer) of
 * this session sharing the longest token prefix with the prompt. */
typedef struct {
    uint32_t prompt_tokens;
    uint32_t reused_tokens;     /* K/V rows taken from the cache */
    uint32_t computed_tokens;   /* prompt_tokens - reused_tokens */
    uint32_t diverged_at_token; /* the first prompt token the cache did not hold
                                   (prompt_tokens when it held them all; a full hit
                                   still computes the last one for its logits) */
    size_t diverged_at_byte;    /* where the prompt's text differs from the cached
                                   text (in the text given to kp_generate_text,
                                   else in the detokenized prompt) */
    size_t line;                /* 1-based line of diverged_at_byte */
    kp_cause cause;
    const char *cause_name;     /* "hit", "cold", ... (static storage) */
    uint32_t evictions;         /* cached prefixes evicted to make room for this prompt */
    double percent_recomputed;  /* the share of the prompt past the divergence:
                                   100 x (prompt - diverged_at_token) / prompt tokens */
    char detail[KP_REPORT_DETAIL_MAX];         /* "timestamp: '09:14' -> '10:02' on line 1" */
    char cached_snippet[KP_REPORT_SNIPPET_MAX];  /* ~40 characters of each text around */
    char request_snippet[KP_REPORT_SNIPPET_MAX]; /* the divergence, control bytes escaped */
    char advice[KP_REPORT_ADVICE_MAX];         /* one sentence for a person ("" on a hit) */
    uint32_t state_recomputed_tokens; /* a model with recurrent layers (qwen35): cached
                                   positions computed again because the state was
                                   snapshotted last before where the prompt matched
                                   (reuse resumed at reused_tokens, the snapshot; cause
                                   state_checkpoint); 0 otherwise */
} kp_cache_report;

/* What a generation produced. The pointers are owned by the session and
 * stay valid until its next generation, kp_session_clear or
 * kp_session_free. */
typedef struct {
    const int32_t *tokens; /* the generated ids (an end-of-generation id included) */
    size_t n_tokens;
    const char *text;      /* the generated text, NUL-terminated: every byte
                              on_text received (also without on_text) */
    size_t text_len;
    kp_end end;
    const char *end_cause; /* "length", "context full", "end of generation token",
                              "stop string", "stopped" (static storage) */
    kp_cache_report cache; /* how the prompt used the prefix cache */
} kp_output;

/* Generates from prompt[0..n_prompt) (ids of the session's model, 1 to
 * kp_session_n_ctx of them) on session s with req
 * (NULL: kp_request_defaults()): reuses the prompt's longest cached prefix,
 * computes the rest, samples up to req->max_tokens tokens streaming their
 * text to req->on_text, then caches prompt + answer (every generated token
 * but an ending end-of-generation one). out (may be NULL) receives the ids,
 * text, end and cache report. The prompt may fill the context; generation
 * then ends at the context end (KP_END_LENGTH). Errors: KP_RC_INVAL (NULL
 * s, empty prompt, an id outside the vocabulary, bad sampling parameters,
 * too many or empty stop strings), KP_RC_RANGE (n_prompt > n_ctx), KP_RC_FULL
 * (the budget cannot hold the sequence even with every unpinned prefix
 * evicted), KP_RC_NOMEM. On an error after the prompt was computed, what
 * was computed is cached and *out holds what was generated (end
 * KP_END_ERROR). */
KP_API kp_rc kp_generate(kp_session *s, const int32_t *prompt, size_t n_prompt, const kp_request *req,
                         kp_output *out, kp_err *err);

/* kp_generate of text[0..len) tokenized by kp_tokenize_prompt, as `kvpin
 * run -p` does: BOS added unless req->no_bos, control-token texts parsed
 * with req->special, an empty prompt becomes BOS alone. The cache report's
 * byte offsets and snippets refer to this text. Errors as kp_generate and
 * kp_tokenize_prompt. */
KP_API kp_rc kp_generate_text(kp_session *s, const char *text, size_t len, const kp_request *req,
                              kp_output *out, kp_err *err);

/* The cache report prompt[0..n_prompt) would get now, without computing or
 * caching anything (no LRU touch); its texts are the detokenized ids.
 * KP_RC_INVAL (NULL arguments, n_prompt 0 or over 2^32, an id outside the
 * vocabulary). */
KP_API kp_rc kp_session_probe(kp_session *s, const int32_t *prompt, size_t n_prompt, kp_cache_report *out,
                              kp_err *err);

/* ---- the cache: memory bill, pins, clearing --------------------------- */

/* The memory bill of the KV pool and the prefix cache, in whole KV blocks
 * (a block several prefixes share counts once). */
typedef struct {
    bool prefix_cache;        /* the session caches prefixes */
    kp_kv_type kv_type;       /* K rows (V rows: kv_type_v) */
    uint32_t block_tokens;    /* positions per block */
    uint64_t bytes_per_token; /* 2 x layers x kv-heads x head_dim x element size
                                 (Q8_0: 34/32 bytes, Q4_0: 18/32; K and V each
                                 their own when they differ) */
    uint64_t budget_bytes;    /* the pool */
    uint64_t used_bytes;      /* blocks the cache or a sequence holds */
    uint64_t cached_bytes;    /* blocks the prefix cache holds */
    uint64_t pinned_bytes;    /* blocks on pinned prefixes */
    uint64_t pinned_cap_bytes;/* the most pins may hold (half the budget) */
    uint64_t cached_tokens;   /* distinct cached positions */
    uint32_t n_pins;
    uint64_t n_evictions;     /* prefixes evicted since the cache was made or cleared */
    kp_kv_type kv_type_v;     /* V rows */
} kp_memory;

/* Fills *out. O(blocks + cached prefixes): not for every token. */
KP_API void kp_session_memory(kp_session *s, kp_memory *out);

/* Computes prefix[0..n) into the cache when it is not all cached yet, then
 * pins it: it is never evicted until kp_session_unpin(*pin_id), or until
 * ttl_seconds have passed (0: no expiry; expired pins are dropped at the
 * start of the session's next call). *pin_id (> 0) names the pin.
 * KP_RC_UNSUPPORTED without a prefix cache, KP_RC_FULL over the pinned-bytes
 * cap, KP_RC_INVAL (n 0, a bad id, ttl < 0), KP_RC_RANGE (n > n_ctx),
 * KP_RC_NOMEM. */
KP_API kp_rc kp_session_pin(kp_session *s, const int32_t *prefix, size_t n, int64_t ttl_seconds,
                            uint64_t *pin_id, kp_err *err);

/* Removes a pin (its prefix stays cached, evictable again). KP_RC_NOTFOUND
 * when there is no such pin (never made, removed, expired, cleared). */
KP_API kp_rc kp_session_unpin(kp_session *s, uint64_t pin_id, kp_err *err);

/* Forgets every cached prefix, pins included, and the report history;
 * every block of the pool is free afterwards. KP_RC_NOMEM (the session then
 * has no cache: every prompt is computed whole). */
KP_API kp_rc kp_session_clear(kp_session *s, kp_err *err);

#ifdef __cplusplus
}
#endif

#endif
