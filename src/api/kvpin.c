/*
 * kvpin.c - the public library interface (include/kvpin.h, floor 7): a thin
 * facade of opaque handles over the engine (engine/engine.h), the
 * generation loop (engine/gen.h), the cache reports (engine/cachereport.h,
 * cache/doctor.h), the tokenizer (tok/tok.h) and the model (model/model.h).
 * These are the only functions libkvpin.so exports (every other object is
 * compiled with -fvisibility=hidden; KP_API marks these).
 *
 * Owns:
 *   kp_lm       the kp_model (its GGUF mapping) and the kp_tok_vocab built
 *               from it; read-only after kp_lm_open. kvpin's own commands
 *               take both out (api/lm_parts.h) to drive the engine.
 *   kp_session  a thread pool, a kp_engine over the borrowed kp_lm (KV pool
 *               + prefix index), a kp_cachereport (the finished sequences cache
 *               reports compare against), and the last generation's output:
 *
 *                 out_tok[0..n_out)   generated ids (copied from the kp_gen)
 *                 text (a kp_buf)     released text, NUL-terminated
 *
 *               both grown on demand and reused by the next generation.
 *
 * A prompt given as text is tokenized by kp_tokenize_prompt, the one place
 * of the rule that an empty prompt starts from BOS (kp_generate_text and
 * the command line use it).
 *
 * A generation is kp_eng_generate over a kp_gen with decode_last (so the
 * sequence holds the whole answer), then kp_cachereport_finish indexes prompt +
 * answer and, with a prefix cache, remembers them in the history; the cache
 * report is made in the on_prefill hook, before this sequence joins the
 * history it is compared with (as the server's scheduler does at
 * admission). A callback asking to stop ends the kp_gen from the on_step
 * hook (kp_gen_stop, CANCELLED): the loop decodes that step's token and
 * ends at the next step.
 *
 * The public enums mirror internal ones value for value; the
 * _Static_asserts below and the exhaustive switches (-Wswitch with
 * -Werror) stop the build when the two drift apart. Pin expiry uses the
 * monotonic clock in seconds; expired pins are dropped at the start of
 * every session call that reads or changes the cache. No file-level
 * mutable state.
 */
#include "kvpin.h"
#include "api/lm_parts.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/status.h"
#include "base/threadpool.h"
#include "engine/cachereport.h"
#include "cache/doctor.h"
#include "engine/engine.h"
#include "engine/gen.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "model/sampler.h"
#include "tok/textout.h"
#include "tok/tok.h"

/* ---- the public enums and limits agree with the internal ones ---------- */

_Static_assert(KP_RC_OK == (int)KP_OK && KP_RC_NOMEM == (int)KP_ENOMEM && KP_RC_IO == (int)KP_EIO &&
                   KP_RC_FORMAT == (int)KP_EFORMAT && KP_RC_UNSUPPORTED == (int)KP_EUNSUPPORTED &&
                   KP_RC_INVAL == (int)KP_EINVAL && KP_RC_NOTFOUND == (int)KP_ENOTFOUND &&
                   KP_RC_RANGE == (int)KP_ERANGE && KP_RC_FULL == (int)KP_EFULL,
               "kp_rc (kvpin.h) and kp_status (base/status.h) differ");
_Static_assert(KP_ERR_MSG_MAX == KP_ERROR_MSG_MAX, "kp_err and kp_error messages differ in size");
_Static_assert(KP_END_LENGTH == (int)KP_FINISH_LENGTH && KP_END_STOP == (int)KP_FINISH_STOP &&
                   KP_END_CANCELLED == (int)KP_FINISH_CANCELLED && KP_END_ERROR == (int)KP_FINISH_ERROR,
               "kp_end (kvpin.h) and kp_finish (engine/gen.h) differ");
_Static_assert(KP_CAUSE_HIT == (int)KP_DOCTOR_CAUSE_HIT && KP_CAUSE_COLD == (int)KP_DOCTOR_CAUSE_COLD &&
                   KP_CAUSE_EVICTED == (int)KP_DOCTOR_CAUSE_EVICTED &&
                   KP_CAUSE_TIMESTAMP == (int)KP_DOCTOR_CAUSE_TIMESTAMP &&
                   KP_CAUSE_COUNTER == (int)KP_DOCTOR_CAUSE_COUNTER &&
                   KP_CAUSE_IDENTIFIER == (int)KP_DOCTOR_CAUSE_IDENTIFIER &&
                   KP_CAUSE_REORDERED_JSON == (int)KP_DOCTOR_CAUSE_REORDERED_JSON &&
                   KP_CAUSE_WHITESPACE == (int)KP_DOCTOR_CAUSE_WHITESPACE &&
                   KP_CAUSE_INSERTED_AT_FRONT == (int)KP_DOCTOR_CAUSE_INSERTED_AT_FRONT &&
                   KP_CAUSE_OTHER == (int)KP_DOCTOR_CAUSE_OTHER &&
                   KP_CAUSE_RETOKENIZED == (int)KP_DOCTOR_CAUSE_RETOKENIZED &&
                   KP_CAUSE_TEMPLATE_REWRITES_HISTORY == (int)KP_DOCTOR_CAUSE_TEMPLATE_REWRITES_HISTORY &&
                   KP_CAUSE_NEW_PREFIX == (int)KP_DOCTOR_CAUSE_NEW_PREFIX &&
                   KP_CAUSE_WINDOW_EVICTED == (int)KP_DOCTOR_CAUSE_WINDOW_EVICTED &&
                   KP_CAUSE_RECURRENT_STATE == (int)KP_DOCTOR_CAUSE_RECURRENT_STATE &&
                   KP_CAUSE_STATE_CHECKPOINT == (int)KP_DOCTOR_CAUSE_STATE_CHECKPOINT &&
                   KP_CAUSE_STATE_CHECKPOINT + 1 == (int)KP_DOCTOR_CAUSE_COUNT,
               "kp_cause (kvpin.h) and kp_doctor_cause (cache/doctor.h) differ");
_Static_assert(KP_MAX_STOPS == KP_TEXTOUT_MAX_STOPS, "stop-string limits differ");
_Static_assert(KP_REPORT_DETAIL_MAX == KP_DOCTOR_DETAIL_MAX && KP_REPORT_SNIPPET_MAX == KP_DOCTOR_SNIPPET_MAX,
               "cache report buffers differ from doctor's");
/* kp_sampling is copied field by field: a field added to either side must
 * be added to the other (and to sampling_in). */
_Static_assert(sizeof(kp_sampling) == sizeof(kp_sampler_params) &&
                   offsetof(kp_sampling, seed) == offsetof(kp_sampler_params, seed),
               "kp_sampling (kvpin.h) and kp_sampler_params (model/sampler.h) differ");

/* Every internal status has its public value (-Wswitch names a new one). */
static kp_rc rc_of(kp_status st) {
    switch (st) {
    case KP_OK: return KP_RC_OK;
    case KP_ENOMEM: return KP_RC_NOMEM;
    case KP_EIO: return KP_RC_IO;
    case KP_EFORMAT: return KP_RC_FORMAT;
    case KP_EUNSUPPORTED: return KP_RC_UNSUPPORTED;
    case KP_EINVAL: return KP_RC_INVAL;
    case KP_ENOTFOUND: return KP_RC_NOTFOUND;
    case KP_ERANGE: return KP_RC_RANGE;
    case KP_EFULL: return KP_RC_FULL;
    }
    return KP_RC_INVAL;
}

static kp_end end_of(kp_finish f) {
    switch (f) {
    case KP_FINISH_LENGTH: return KP_END_LENGTH;
    case KP_FINISH_STOP: return KP_END_STOP;
    case KP_FINISH_CANCELLED: return KP_END_CANCELLED;
    case KP_FINISH_NONE:
    case KP_FINISH_ERROR: return KP_END_ERROR;
    }
    return KP_END_ERROR;
}

/* Copies an internal error out; returns its public code. */
static kp_rc put(kp_err *out, kp_status st, const kp_error *in) {
    kp_rc rc = rc_of(st);
    if (out && rc != KP_RC_OK) {
        out->code = rc;
        snprintf(out->msg, sizeof out->msg, "%s", in && in->msg[0] ? in->msg : kp_status_str(st));
    }
    return rc;
}

static kp_rc fail(kp_err *err, kp_rc rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static kp_rc fail(kp_err *err, kp_rc rc, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = rc;
    }
    return rc;
}

/* ---- library ------------------------------------------------------------ */

const char *kp_rc_name(kp_rc rc) { return kp_status_str((kp_status)rc); }

const char *kp_version(void) { return KP_VERSION; }

void kp_mem_free(void *p) { free(p); }

/* ---- model files -------------------------------------------------------- */

struct kp_lm {
    kp_model *m;
    kp_tok_vocab *v;
};

const kp_model *kp_lm_model(const kp_lm *lm) { return lm->m; }

const kp_tok_vocab *kp_lm_vocab(const kp_lm *lm) { return lm->v; }

kp_rc kp_lm_open(kp_lm **out, const char *path, kp_err *err) {
    if (!out) return fail(err, KP_RC_INVAL, "kp_lm_open: no place for the model (out is NULL)");
    *out = NULL;
    if (!path) return fail(err, KP_RC_INVAL, "kp_lm_open: no path");
    kp_lm *lm = calloc(1, sizeof *lm);
    if (!lm) return fail(err, KP_RC_NOMEM, "out of memory opening %s", path);
    kp_error ie = {0};
    kp_status st = kp_model_load(&lm->m, path, &ie);
    if (st == KP_OK && (st = kp_tok_vocab_load(&lm->v, lm->m->file, &ie)) != KP_OK) {
        char msg[KP_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ie.msg);
        if (strncmp(msg, path, strlen(path)) != 0) /* name the file */
            snprintf(ie.msg, sizeof ie.msg, "%.200s: tokenizer: %.280s", path, msg);
    }
    if (st != KP_OK) {
        kp_lm_free(lm);
        return put(err, st, &ie);
    }
    *out = lm;
    return KP_RC_OK;
}

void kp_lm_free(kp_lm *lm) {
    if (!lm) return;
    kp_tok_vocab_free(lm->v);
    kp_model_free(lm->m);
    free(lm);
}

void kp_lm_describe(const kp_lm *lm, kp_lm_info *out) {
    memset(out, 0, sizeof *out);
    if (!lm) return;
    const kp_hparams *hp = &lm->m->hp;
    out->arch = kp_arch_name(hp->arch);
    out->tokenizer = kp_tok_model_name(lm->v);
    out->n_vocab = hp->n_vocab;
    out->n_ctx_train = hp->n_ctx_train;
    out->n_layer = hp->n_layer;
    out->n_embd = hp->n_embd;
    out->n_head = hp->n_head;
    out->n_head_kv = hp->n_head_kv;
    out->head_dim = hp->head_dim;
    out->bos = kp_tok_bos(lm->v);
    out->eos = kp_tok_eos(lm->v);
    out->add_bos = kp_tok_add_bos(lm->v);
    out->weight_bytes = lm->m->weight_bytes;
}

bool kp_lm_is_eog(const kp_lm *lm, int32_t id) { return lm && kp_tok_is_eog(lm->v, id); }

/* ---- tokens ------------------------------------------------------------- */

kp_rc kp_tokenize(const kp_lm *lm, const char *text, size_t len, bool add_special, bool parse_special,
                  int32_t **ids, size_t *n_ids, kp_err *err) {
    if (!lm || !ids || !n_ids || (!text && len))
        return fail(err, KP_RC_INVAL, "kp_tokenize: NULL model, text or output");
    kp_error ie = {0};
    kp_status st = kp_tok_encode(lm->v, text ? text : "", len, add_special, parse_special, ids, n_ids, &ie);
    return put(err, st, &ie);
}

kp_rc kp_tokenize_prompt(const kp_lm *lm, const char *text, size_t len, bool add_special, bool parse_special,
                         int32_t **ids, size_t *n_ids, kp_err *err) {
    if (!lm || !ids || !n_ids || (!text && len))
        return fail(err, KP_RC_INVAL, "kp_tokenize_prompt: NULL model, text or output");
    kp_rc rc = kp_tokenize(lm, text, len, add_special, parse_special, ids, n_ids, err);
    if (rc != KP_RC_OK || *n_ids > 0) return rc;
    /* an empty prompt without BOS: a generation starts from BOS anyway */
    int32_t bos = kp_tok_bos(lm->v);
    free(*ids);
    *ids = NULL;
    if (bos < 0) return fail(err, KP_RC_INVAL, "the prompt is empty and the model has no BOS token");
    *ids = malloc(sizeof **ids);
    if (!*ids) return fail(err, KP_RC_NOMEM, "out of memory for the prompt");
    (*ids)[0] = bos;
    *n_ids = 1;
    return KP_RC_OK;
}

kp_rc kp_detokenize(const kp_lm *lm, const int32_t *ids, size_t n_ids, bool special, char **text, size_t *len,
                    kp_err *err) {
    if (!lm || !text || (!ids && n_ids)) return fail(err, KP_RC_INVAL, "kp_detokenize: NULL model, ids or output");
    size_t l = 0;
    kp_error ie = {0};
    if (n_ids == 0) { /* nothing to render: an empty string */
        if (len) *len = 0;
        *text = calloc(1, 1);
        return *text ? KP_RC_OK : fail(err, KP_RC_NOMEM, "out of memory for a text");
    }
    kp_status st = kp_tok_detokenize(lm->v, ids, n_ids, false, special, text, &l, &ie);
    if (len) *len = st == KP_OK ? l : 0;
    return put(err, st, &ie);
}

/* ---- sessions ----------------------------------------------------------- */

struct kp_session {
    const kp_lm *lm;
    kp_threads *pool;
    kp_engine *e;
    kp_cachereport *crep;
    uint32_t n_ctx;
    bool prefix_cache;
    int32_t *out_tok; /* the last generation's ids */
    size_t out_cap;
    kp_buf text;      /* ... and text (NUL-terminated) */
};

/* Seconds of the monotonic clock: the pins' clock. */
static int64_t now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec;
}

static void expire(kp_session *s) { kp_eng_expire(s->e, now_s()); }

/* kp_kv_type <-> kp_dtype (the value is in the enum, checked by the caller). */
static kp_dtype kv_dtype(kp_kv_type t) {
    return t == KP_KV_F32 ? KP_DTYPE_F32 : t == KP_KV_Q8_0 ? KP_DTYPE_Q8_0 : t == KP_KV_Q4_0 ? KP_DTYPE_Q4_0 : KP_DTYPE_F16;
}

static kp_kv_type kv_api_type(kp_dtype t) {
    return t == KP_DTYPE_F32 ? KP_KV_F32 : t == KP_DTYPE_Q8_0 ? KP_KV_Q8_0 : t == KP_DTYPE_Q4_0 ? KP_KV_Q4_0 : KP_KV_F16;
}

kp_rc kp_session_new(kp_session **out, const kp_lm *lm, const kp_session_params *p, kp_err *err) {
    if (!out) return fail(err, KP_RC_INVAL, "kp_session_new: out is NULL");
    *out = NULL;
    if (!lm) return fail(err, KP_RC_INVAL, "kp_session_new: no model");
    static const kp_session_params defaults = {0};
    if (!p) p = &defaults;
    if (p->kv_type < KP_KV_F16 || p->kv_type > KP_KV_Q4_0)
        return fail(err, KP_RC_INVAL, "kv_type %d is not a kp_kv_type (KP_KV_F16, F32, Q8_0 or Q4_0)",
                    (int)p->kv_type);
    if (p->kv_type_v_set && (p->kv_type_v < KP_KV_F16 || p->kv_type_v > KP_KV_Q4_0))
        return fail(err, KP_RC_INVAL, "kv_type_v %d is not a kp_kv_type (KP_KV_F16, F32, Q8_0 or Q4_0)",
                    (int)p->kv_type_v);
    if (p->n_ctx > (1u << 24)) return fail(err, KP_RC_RANGE, "n_ctx %u is over 2^24", p->n_ctx);
    if (p->kv_block > 4096) return fail(err, KP_RC_RANGE, "kv_block %u is over 4096", p->kv_block);
    if (p->n_threads > 1024) return fail(err, KP_RC_RANGE, "n_threads %d is over 1024", p->n_threads);
    const kp_hparams *hp = &lm->m->hp;
    kp_dtype kv = kv_dtype(p->kv_type), kvv = p->kv_type_v_set ? kv_dtype(p->kv_type_v) : kv;
    uint32_t block = p->kv_block ? p->kv_block : 16;
    uint32_t n_ctx = p->n_ctx ? p->n_ctx : hp->n_ctx_train && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    uint64_t budget = p->kv_budget;
    if (!budget) { /* as `kvpin run --prompt-cache`: the context plus as much again, at most half of RAM */
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        uint64_t half = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 2 : 0;
        budget = 2 * ((uint64_t)n_ctx + block) * kp_model_kv_bytes_per_token_kv(hp, kv, kvv);
        if (!p->no_prefix_cache) /* a recurrent model's state snapshots, as many again (engine.h) */
            budget += 2 * kp_eng_state_room(lm->m, kv, kvv, block, n_ctx, p->state_every);
        if (half && budget > half) budget = half;
    }
    kp_session *s = calloc(1, sizeof *s);
    if (!s) return fail(err, KP_RC_NOMEM, "out of memory for a session");
    s->lm = lm;
    s->n_ctx = n_ctx;
    s->prefix_cache = !p->no_prefix_cache;
    kp_error ie = {0};
    kp_eng_config ec = {kv, block, budget, n_ctx, p->no_prefix_cache, NULL, kvv, p->no_repack, p->window_budget, p->state_every};
    kp_status st = kp_threads_new(&s->pool, p->n_threads > 0 ? p->n_threads : kp_cpu_count(), &ie);
    if (st == KP_OK) st = kp_eng_new(&s->e, lm->m, s->pool, kp_kernels_best(), &ec, &ie);
    if (st == KP_OK) st = kp_cachereport_new(&s->crep, lm->v, 256, 4u << 20, &ie);
    if (st != KP_OK) {
        kp_session_free(s);
        return put(err, st, &ie);
    }
    *out = s;
    return KP_RC_OK;
}

void kp_session_free(kp_session *s) {
    if (!s) return;
    kp_cachereport_free(s->crep);
    kp_eng_free(s->e);
    kp_threads_free(s->pool);
    free(s->out_tok);
    kp_buf_free(&s->text);
    free(s);
}

uint32_t kp_session_n_ctx(const kp_session *s) { return s ? s->n_ctx : 0; }

/* ---- generation --------------------------------------------------------- */

kp_sampling kp_sampling_defaults(void) {
    kp_sampler_params d = kp_sampler_defaults();
    kp_sampling o = {d.temp,           d.top_k,          d.top_p,
                     d.min_p,          d.repeat_penalty, d.repeat_last_n,
                     d.presence_penalty, d.frequency_penalty, d.seed};
    return o;
}

static kp_sampler_params sampling_in(const kp_sampling *p) {
    kp_sampler_params o = {p->temp,           p->top_k,          p->top_p,
                           p->min_p,          p->repeat_penalty, p->repeat_last_n,
                           p->presence_penalty, p->frequency_penalty, p->seed};
    return o;
}

kp_request kp_request_defaults(void) {
    kp_request r;
    memset(&r, 0, sizeof r);
    r.sampling = kp_sampling_defaults();
    r.max_tokens = 128;
    return r;
}

/* The public report from the engine's counts and doctor's explanation (d
 * NULL when there is none: the cause then follows from the counts). */
static void fill_report(kp_cache_report *o, const kp_eng_report *r, const kp_doctor_report *d) {
    memset(o, 0, sizeof *o);
    o->prompt_tokens = r->prompt_tokens;
    o->reused_tokens = r->reused_tokens;
    o->computed_tokens = r->computed_tokens;
    o->diverged_at_token = r->diverged_at_token;
    o->evictions = r->evictions;
    o->state_recomputed_tokens = r->state_recomputed_tokens;
    o->percent_recomputed =
        r->prompt_tokens ? 100.0 * (r->prompt_tokens - r->diverged_at_token) / r->prompt_tokens : 0;
    kp_doctor_cause c = r->cold                                    ? KP_DOCTOR_CAUSE_COLD
                        : r->evicted                               ? KP_DOCTOR_CAUSE_EVICTED
                        : r->diverged_at_token >= r->prompt_tokens ? KP_DOCTOR_CAUSE_HIT
                                                                   : KP_DOCTOR_CAUSE_OTHER;
    if (d) {
        c = d->finding.cause;
        o->diverged_at_byte = d->div.byte;
        o->line = d->finding.line;
        o->percent_recomputed = d->div.percent_recomputed;
        snprintf(o->detail, sizeof o->detail, "%s", d->finding.detail);
        snprintf(o->cached_snippet, sizeof o->cached_snippet, "%s", d->cached_snippet);
        snprintf(o->request_snippet, sizeof o->request_snippet, "%s", d->request_snippet);
    }
    o->cause = (kp_cause)c;
    o->cause_name = kp_doctor_cause_name(c);
    if (c != KP_DOCTOR_CAUSE_HIT)
        kp_doctor_advice(c, o->detail[0] ? o->detail : NULL, o->line, o->percent_recomputed, NULL, o->advice,
                         sizeof o->advice);
}

/* The report of tokens[0..n) (text: the prompt's own text, or NULL). */
static void explain(kp_session *s, const int32_t *tokens, uint32_t n, const char *text, size_t text_len,
                    const kp_eng_report *r, kp_cache_report *out) {
    kp_doctor_report d;
    kp_error ie;
    bool has = kp_cachereport_explain(s->crep, tokens, n, text, text_len, r, KP_DOCTOR_ESCAPE_HUMAN, &d, &ie) == KP_OK;
    fill_report(out, r, has ? &d : NULL);
}

/* What the hooks of kp_eng_generate need. */
typedef struct {
    kp_session *s;
    kp_gen *g;
    const kp_request *req;
    const char *text; /* the prompt's text or NULL */
    size_t text_len;
    kp_cache_report *report;
    bool reported, cancelled, nomem;
} gen_ctx;

static void on_prefill(void *vc, const kp_eng_report *r) {
    gen_ctx *c = vc;
    explain(c->s, kp_gen_tokens(c->g), kp_gen_n_prompt(c->g), c->text, c->text_len, r, c->report);
    c->reported = true;
}

static void on_step(void *vc, const kp_gen_out *o) {
    gen_ctx *c = vc;
    if (!o->len || c->cancelled || c->nomem) return;
    kp_gen_out ended;
    if (!kp_buf_put(&c->s->text, o->text, o->len)) {
        c->nomem = true;
        kp_gen_stop(c->g, KP_FINISH_ERROR, &ended);
        return;
    }
    if (c->req->on_text && c->req->on_text(c->req->user, o->text, o->len) != 0) {
        c->cancelled = true;
        kp_gen_stop(c->g, KP_FINISH_CANCELLED, &ended);
    }
}

/* Runs one generation of tokens[0..n) (text: their text, for the report). */
static kp_rc generate(kp_session *s, const int32_t *tokens, size_t n, const char *text, size_t text_len,
                      const kp_request *req, kp_output *out, kp_err *err) {
    kp_output dummy;
    if (!out) out = &dummy;
    memset(out, 0, sizeof *out);
    out->end = KP_END_ERROR;
    out->end_cause = "error";
    out->text = "";
    kp_request defaults = kp_request_defaults();
    if (!req) req = &defaults;
    if (!tokens || n == 0) return fail(err, KP_RC_INVAL, "the prompt is empty");
    if (n > s->n_ctx)
        return fail(err, KP_RC_RANGE, "the prompt has %zu tokens, more than the context of %u", n, s->n_ctx);
    if (req->n_stops > KP_MAX_STOPS)
        return fail(err, KP_RC_INVAL, "%zu stop strings, at most %d", req->n_stops, KP_MAX_STOPS);
    if (req->n_stops && !req->stops) return fail(err, KP_RC_INVAL, "n_stops is %zu but stops is NULL", req->n_stops);
    expire(s);
    kp_buf_clear(&s->text);
    if (!kp_buf_put(&s->text, "", 0)) return fail(err, KP_RC_NOMEM, "out of memory for the generated text");
    out->text = s->text.data;
    kp_error ie = {0};
    kp_gen *g = NULL;
    kp_gen_params gp = {sampling_in(&req->sampling), req->max_tokens, s->n_ctx, (int32_t)s->lm->m->hp.n_vocab,
                        req->ignore_eos, req->stops,
                        (int)req->n_stops, req->special};
    kp_status st = kp_gen_new(&g, s->lm->v, tokens, (uint32_t)n, &gp, &ie);
    if (st != KP_OK) return put(err, st, &ie);
    gen_ctx c = {s, g, req, text, text_len, &out->cache, false, false, false};
    kp_eng_report r;
    kp_eng_seq seq = {0};
    /* decode_last: the sequence holds the whole answer, for the cache */
    kp_eng_gen_opts go = {&c, on_prefill, on_step, NULL, 0, true};
    st = kp_eng_generate(s->e, &seq, g, &go, &r, &ie);
    if (!c.reported) explain(s, tokens, (uint32_t)n, text, text_len, &r, &out->cache); /* the prefill failed */
    /* cache what was computed: the tokens fed, prompt then answer (best effort) */
    kp_error e2;
    kp_cachereport_finish(s->prefix_cache ? s->crep : NULL, s->e, &seq, kp_gen_tokens(g), kp_gen_n_tokens(g), NULL, &e2);
    uint32_t n_gen = kp_gen_n_generated(g);
    if (!kp_grow((void **)&s->out_tok, &s->out_cap, n_gen, sizeof *s->out_tok)) {
        kp_gen_free(g);
        return fail(err, KP_RC_NOMEM, "out of memory for the generated ids");
    }
    if (n_gen) memcpy(s->out_tok, kp_gen_tokens(g) + kp_gen_n_prompt(g), (size_t)n_gen * sizeof *s->out_tok);
    out->tokens = s->out_tok;
    out->n_tokens = n_gen;
    out->text = s->text.data;
    out->text_len = s->text.len;
    kp_finish f = kp_gen_finish(g);
    out->end = st == KP_OK ? end_of(f) : KP_END_ERROR;
    out->end_cause = st == KP_OK && f != KP_FINISH_ERROR ? kp_gen_cause_name(kp_gen_cause_of(g)) : "error";
    kp_gen_free(g);
    if (st != KP_OK) return put(err, st, &ie);
    if (c.nomem) return fail(err, KP_RC_NOMEM, "out of memory for the generated text");
    return KP_RC_OK;
}

kp_rc kp_generate(kp_session *s, const int32_t *prompt, size_t n_prompt, const kp_request *req, kp_output *out,
                  kp_err *err) {
    if (!s) {
        if (out) memset(out, 0, sizeof *out);
        return fail(err, KP_RC_INVAL, "kp_generate: no session");
    }
    return generate(s, prompt, n_prompt, NULL, 0, req, out, err);
}

kp_rc kp_generate_text(kp_session *s, const char *text, size_t len, const kp_request *req, kp_output *out,
                       kp_err *err) {
    if (out) memset(out, 0, sizeof *out);
    if (!s || (!text && len)) return fail(err, KP_RC_INVAL, "kp_generate_text: no session or no text");
    if (!text) text = "";
    bool no_bos = req && req->no_bos, special = req && req->special;
    int32_t *ids = NULL;
    size_t n = 0;
    kp_rc rc = kp_tokenize_prompt(s->lm, text, len, !no_bos, special, &ids, &n, err);
    if (rc != KP_RC_OK) return rc;
    rc = generate(s, ids, n, text, len, req, out, err);
    free(ids);
    return rc;
}

kp_rc kp_session_probe(kp_session *s, const int32_t *prompt, size_t n_prompt, kp_cache_report *out, kp_err *err) {
    if (!s || !prompt || !n_prompt || !out)
        return fail(err, KP_RC_INVAL, "kp_session_probe: NULL argument or empty prompt");
    if (n_prompt > UINT32_MAX) return fail(err, KP_RC_INVAL, "a prompt of %zu tokens", n_prompt);
    int32_t n_vocab = kp_tok_n_vocab(s->lm->v);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return fail(err, KP_RC_INVAL, "token %zu is %d, not an id of the vocabulary (0..%d)", i, prompt[i],
                        n_vocab - 1);
    expire(s);
    kp_eng_report r;
    kp_eng_probe(s->e, prompt, (uint32_t)n_prompt, &r);
    explain(s, prompt, (uint32_t)n_prompt, NULL, 0, &r, out);
    return KP_RC_OK;
}

/* ---- the cache ------------------------------------------------------------ */

void kp_session_memory(kp_session *s, kp_memory *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    expire(s);
    kp_eng_stats st;
    kp_eng_get_stats(s->e, &st);
    out->prefix_cache = st.prefix_cache;
    out->kv_type = kv_api_type(st.kv_type);
    out->kv_type_v = kv_api_type(st.kv_type_v);
    out->block_tokens = st.block_size;
    out->bytes_per_token = st.bytes_per_token;
    out->budget_bytes = st.budget_bytes;
    out->used_bytes = st.used_bytes;
    out->cached_bytes = st.index_bytes;
    out->pinned_bytes = st.pinned_bytes;
    out->pinned_cap_bytes = st.pinned_cap_bytes;
    out->cached_tokens = st.cached_tokens;
    out->n_pins = st.n_pins;
    out->n_evictions = st.n_evictions;
}

kp_rc kp_session_pin(kp_session *s, const int32_t *prefix, size_t n, int64_t ttl_seconds, uint64_t *pin_id,
                     kp_err *err) {
    if (pin_id) *pin_id = 0;
    if (!s || !pin_id || (!prefix && n)) return fail(err, KP_RC_INVAL, "kp_session_pin: NULL argument");
    if (!s->prefix_cache) return fail(err, KP_RC_UNSUPPORTED, "the session has no prefix cache: nothing can be pinned");
    if (n == 0) return fail(err, KP_RC_INVAL, "an empty prefix cannot be pinned");
    if (ttl_seconds < 0) return fail(err, KP_RC_INVAL, "a negative ttl (%lld s)", (long long)ttl_seconds);
    if (n > s->n_ctx)
        return fail(err, KP_RC_RANGE, "the prefix has %zu tokens, more than the context of %u", n, s->n_ctx);
    expire(s);
    kp_error ie = {0};
    kp_eng_report r;
    kp_eng_probe(s->e, prefix, (uint32_t)n, &r);
    if (r.diverged_at_token < n) { /* compute what is not cached yet, and cache it */
        kp_eng_seq seq = {0};
        kp_status st = kp_eng_prefill(s->e, prefix, (uint32_t)n, &seq, NULL, &r, &ie);
        if (st == KP_OK) st = kp_eng_finish(s->e, &seq, prefix, (uint32_t)n, NULL, &ie);
        if (st != KP_OK) return put(err, st, &ie);
        kp_cachereport_add(s->crep, prefix, (uint32_t)n, &ie);
    }
    return put(err, kp_eng_pin(s->e, prefix, (uint32_t)n, ttl_seconds, now_s(), pin_id, &ie), &ie);
}

kp_rc kp_session_unpin(kp_session *s, uint64_t pin_id, kp_err *err) {
    if (!s) return fail(err, KP_RC_INVAL, "kp_session_unpin: no session");
    expire(s);
    kp_error ie = {0};
    return put(err, kp_eng_unpin(s->e, pin_id, &ie), &ie);
}

kp_rc kp_session_clear(kp_session *s, kp_err *err) {
    if (!s) return fail(err, KP_RC_INVAL, "kp_session_clear: no session");
    kp_cachereport_clear(s->crep);
    kp_error ie = {0};
    kp_status st = kp_eng_clear(s->e, &ie);
    if (st != KP_OK) s->prefix_cache = false;
    return put(err, st, &ie);
}
