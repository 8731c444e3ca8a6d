/*
 * test_alloc_fail.c - every allocation of the load path and of a request's
 * path fails once, in turn, and kvpin answers each failure with an error,
 * never a crash, a hang or a leak.
 *
 * The binary is linked with -Wl,--wrap for malloc, calloc, realloc, free,
 * aligned_alloc and strdup (Makefile), so every call that kvpin's own
 * objects make goes through the wrappers below; jansson's allocations are
 * routed through them with json_set_alloc_funcs. The wrappers count
 * allocations and make the Nth one return NULL; they also keep the set of
 * blocks they handed out and that are not yet freed, so a leak after a
 * failure is seen at once (not only by LeakSanitizer at exit).
 *
 *   path     what runs                                       model
 *   load     kp_model_load + kp_tok_vocab_load + free         bundled (SPM) and
 *                                                            a byte-level BPE one
 *   request  engine new; a chat request parsed (oai),        bundled
 *            rendered (the built-in chatml template,
 *            compiled outside the sweep), tokenized, prefilled, 4 tokens
 *            sampled and decoded with stop strings (sampler,
 *            textout), indexed; a second request that reuses
 *            the first's prefix; the usage and cache JSON
 *            written; engine free
 *
 * For each path: a clean run counts its allocations K; then for N = 1..K
 * the Nth fails. Each run must return (its status may be an error, with a
 * message) and leave no block behind. Not covered: allocations inside
 * libc functions other than strdup, and inside PCRE2 (its own allocator)
 * and libmicrohttpd.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/sampler.h"
#include "serve/chat_tmpl.h"
#include "serve/oai.h"
#include "tok/textout.h"
#include "tok/tok.h"

#include "harness.h"

/* ---- the allocator hooks (the test binary's own state) ----------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__real_aligned_alloc(size_t align, size_t n);

#define LIVE_CAP (1u << 20) /* open addressing, power of two */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t n_allocs;   /* allocations asked for since arm() */
static uint64_t fail_at;    /* 0: none fails; else the fail_at-th does */
static bool failed;         /* the armed failure happened */
static bool tracking;
static void **live;         /* blocks handed out while tracking */
static size_t n_live;

static size_t slot_of(void *p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull) & (LIVE_CAP - 1); }

static void live_add(void *p) {
    size_t i = slot_of(p);
    while (live[i] && live[i] != (void *)1) i = (i + 1) & (LIVE_CAP - 1);
    live[i] = p;
    n_live++;
}

/* Removes p; false when p was not handed out while tracking. */
static bool live_del(void *p) {
    for (size_t i = slot_of(p);; i = (i + 1) & (LIVE_CAP - 1)) {
        if (!live[i]) return false;
        if (live[i] == p) {
            live[i] = (void *)1; /* tombstone */
            n_live--;
            return true;
        }
    }
}

/* Counts one allocation; true when this one must fail. */
static bool count(void) {
    if (!tracking) return false;
    n_allocs++;
    if (fail_at && n_allocs == fail_at) {
        failed = true;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n) {
    pthread_mutex_lock(&mu);
    void *p = count() ? NULL : __real_malloc(n);
    if (p && tracking) live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}

void *__wrap_calloc(size_t n, size_t size) {
    pthread_mutex_lock(&mu);
    void *p = count() ? NULL : __real_calloc(n, size);
    if (p && tracking) live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}

void *__wrap_aligned_alloc(size_t align, size_t n) {
    pthread_mutex_lock(&mu);
    void *p = count() ? NULL : __real_aligned_alloc(align, n);
    if (p && tracking) live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}

void *__wrap_realloc(void *old, size_t n) {
    pthread_mutex_lock(&mu);
    void *p = NULL;
    if (!count()) {
        bool was = old && tracking && live_del(old);
        p = __real_realloc(old, n);
        if (p && (was || (tracking && !old))) live_add(p);
        else if (!p && was) live_add(old); /* realloc failed: old stays */
    }
    pthread_mutex_unlock(&mu);
    return p;
}

void __wrap_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&mu);
    if (tracking) live_del(p);
    __real_free(p);
    pthread_mutex_unlock(&mu);
}

char *__wrap_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = __wrap_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Starts counting (and failing the fail_at-th allocation: 0 none). */
static void arm(uint64_t at) {
    pthread_mutex_lock(&mu);
    memset(live, 0, LIVE_CAP * sizeof *live);
    n_live = 0;
    n_allocs = 0;
    fail_at = at;
    failed = false;
    tracking = true;
    pthread_mutex_unlock(&mu);
}

/* Stops counting; returns the blocks still live. */
static size_t disarm(uint64_t *allocs) {
    pthread_mutex_lock(&mu);
    tracking = false;
    *allocs = n_allocs;
    size_t left = n_live;
    pthread_mutex_unlock(&mu);
    return left;
}

/* ---- the paths ---------------------------------------------------------- */

typedef struct {
    const char *model_path;
    const kp_model *m;      /* request path: loaded outside */
    const kp_tok_vocab *v;
    kp_threads *pool;
    const kp_chat_tmpl *chat; /* request path: compiled outside */
} fixture;

/* Loads and frees a model and its tokenizer. */
static kp_status path_load(const fixture *fx, kp_error *err) {
    kp_model *m = NULL;
    kp_tok_vocab *v = NULL;
    kp_status st = kp_model_load(&m, fx->model_path, err);
    if (st == KP_OK) st = kp_tok_vocab_load(&v, m->file, err);
    kp_tok_vocab_free(v);
    kp_model_free(m);
    return st;
}

static int32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

/* One chat request through parse, render, tokenize, prefill, decode and
 * finish; *text receives nothing (the generated text is dropped). */
static kp_status one_request(const fixture *fx, kp_engine *e, const char *body, float *logits, kp_error *err) {
    kp_oai_request q;
    kp_oai_error oe;
    if (!kp_oai_parse(body, strlen(body), true, &q, &oe)) {
        snprintf(err->msg, sizeof err->msg, "%s", oe.message);
        return oe.http >= 500 ? KP_ENOMEM : KP_EINVAL;
    }
    char *rendered = NULL;
    size_t rlen = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    kp_sampler *smp = NULL;
    kp_textout *to = NULL;
    kp_eng_seq s = {0};
    json_t *usage = NULL, *cache = NULL;
    char *dump = NULL;
    int32_t all[512];
    kp_chat_opts co = {true, false};
    kp_status st = kp_chat_tmpl_render(fx->chat, q.messages, q.tools, &co, NULL, &rendered, &rlen, NULL, NULL, err);
    if (st == KP_OK) st = kp_tok_encode(fx->v, rendered, rlen, true, true, &ids, &n, err);
    if (st == KP_OK && n > 400) st = KP_ERANGE;
    if (st == KP_OK) st = kp_sampler_new(&smp, &q.sp, (int32_t)fx->m->hp.n_vocab, err);
    if (st == KP_OK) st = kp_textout_new(&to, fx->v, q.stops, q.n_stops, false, false, err);
    kp_eng_report rep;
    if (st == KP_OK) st = kp_eng_prefill(e, ids, (uint32_t)n, &s, logits, &rep, err);
    uint32_t n_all = 0;
    if (st == KP_OK) {
        memcpy(all, ids, n * sizeof *ids);
        n_all = (uint32_t)n;
        for (int k = 0; k < 4 && st == KP_OK; k++) {
            int32_t t = q.sp.temp == 0 ? argmax(logits, fx->m->hp.n_vocab) : kp_sampler_sample(smp, logits);
            kp_sampler_accept(smp, t);
            all[n_all++] = t;
            const char *txt;
            size_t tn;
            bool hit;
            if ((st = kp_textout_push(to, t, &txt, &tn, &hit, err)) != KP_OK || hit) break;
            st = kp_eng_decode(e, &s, t, logits, err);
        }
    }
    if (kp_eng_seq_len(&s) > 0) {
        kp_error e2;
        kp_status fs = kp_eng_finish(e, &s, all, n_all, NULL, &e2);
        if (st == KP_OK) st = fs, *err = e2;
    } else {
        kp_eng_seq_abort(e, &s);
    }
    if (st == KP_OK) {
        usage = kp_oai_usage_json(rep.prompt_tokens, rep.reused_tokens, 4);
        cache = kp_oai_cache_json(&rep, NULL);
        if (!usage || !cache || json_object_set(usage, "kvpin_cache", cache) != 0 ||
            !(dump = json_dumps(usage, JSON_COMPACT)))
            st = kp_fail(err, KP_ENOMEM, "out of memory for the response");
    }
    free(dump);
    json_decref(usage);
    json_decref(cache);
    kp_textout_free(to);
    kp_sampler_free(smp);
    free(ids);
    free(rendered);
    kp_oai_request_free(&q);
    return st;
}

static const char *BODY1 = "{\"messages\":[{\"role\":\"system\",\"content\":\"You tell short stories.\"},"
                           "{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"temperature\":0,"
                           "\"stop\":[\"zz\"]}";
static const char *BODY2 = "{\"messages\":[{\"role\":\"system\",\"content\":\"You tell short stories.\"},"
                           "{\"role\":\"user\",\"content\":\"Once upon a time there was\"}],"
                           "\"temperature\":0.8,\"seed\":3}";

static kp_status path_request(const fixture *fx, kp_error *err) {
    kp_engine *e = NULL;
    kp_eng_config ec = {KP_DTYPE_F16, 16, 0, 512, false, NULL, KP_DTYPE_F16, false, 0, 0};
    float *logits = malloc(fx->m->hp.n_vocab * sizeof *logits);
    kp_status st = logits ? kp_eng_new(&e, fx->m, fx->pool, NULL, &ec, err)
                          : kp_fail(err, KP_ENOMEM, "out of memory for logits");
    if (st == KP_OK) st = one_request(fx, e, BODY1, logits, err);
    if (st == KP_OK) st = one_request(fx, e, BODY2, logits, err);
    kp_eng_free(e);
    free(logits);
    return st;
}

typedef kp_status (*path_fn)(const fixture *, kp_error *);

/* Runs path with no failure, then with each allocation failing in turn. */
static void sweep(const char *name, path_fn path, const fixture *fx, uint64_t max_runs) {
    kp_error err = {0};
    uint64_t k;
    arm(0);
    kp_status st = path(fx, &err);
    size_t left = disarm(&k);
    CHECK_MSG(st == KP_OK, "%s: the clean run failed: %s", name, err.msg);
    CHECK_MSG(left == 0, "%s: the clean run leaves %zu blocks", name, left);
    /* every N up to max_runs; above that an even stride (the last included) */
    uint64_t stride = k <= max_runs ? 1 : (k + max_runs - 1) / max_runs;
    uint64_t runs = 0, failures = 0, bad = 0;
    for (uint64_t n = 1; n <= k; n += (n < 200 ? 1 : stride)) {
        memset(&err, 0, sizeof err);
        arm(n);
        st = path(fx, &err);
        uint64_t seen;
        left = disarm(&seen);
        runs++;
        if (st != KP_OK) failures++;
        if (left != 0 || (st != KP_OK && !err.msg[0])) {
            if (bad++ < 5)
                fprintf(stderr, "  %s: allocation %llu of %llu failing: status %d, %zu blocks left, \"%s\"\n",
                        name, (unsigned long long)n, (unsigned long long)k, (int)st, left, err.msg);
        }
    }
    CHECK_MSG(bad == 0, "%s: %llu of %llu runs leaked or failed without a message", name, (unsigned long long)bad,
              (unsigned long long)runs);
    printf("  %s: %llu allocations; %llu runs with one failing, %llu of them reported an error\n", name,
           (unsigned long long)k, (unsigned long long)runs, (unsigned long long)failures);
}

static void *json_malloc(size_t n) { return __wrap_malloc(n); }
static void json_free(void *p) { __wrap_free(p); }

int main(void) {
    live = __real_calloc(LIVE_CAP, sizeof *live);
    if (!live) return 1;
    json_set_alloc_funcs(json_malloc, json_free);
    fixture fx = {"models/stories260K.gguf", NULL, NULL, NULL, NULL};
    sweep("load stories260K (SentencePiece)", path_load, &fx, 4000);
    fixture bpe = {"tests/data/models/gen-qwen2-q8_0.gguf", NULL, NULL, NULL, NULL};
    sweep("load gen-qwen2 (byte-level BPE)", path_load, &bpe, 3000);

    kp_model *m = NULL;
    kp_tok_vocab *v = NULL;
    kp_threads *pool = NULL;
    kp_chat_tmpl *chat = NULL;
    kp_error err = {0};
    CHECK(kp_chat_tmpl_builtin(KP_CHAT_CHATML, "<s>", "</s>", &chat, &err) == KP_OK);
    CHECK(kp_model_load(&m, fx.model_path, &err) == KP_OK);
    CHECK(m && kp_tok_vocab_load(&v, m->file, &err) == KP_OK);
    CHECK(kp_threads_new(&pool, 2, &err) == KP_OK);
    if (m && v && pool && chat) {
        fixture rq = {fx.model_path, m, v, pool, chat};
        sweep("request (chat, two turns, prefix reuse)", path_request, &rq, 4000);
    }
    kp_threads_free(pool);
    kp_chat_tmpl_free(chat);
    kp_tok_vocab_free(v);
    kp_model_free(m);
    __real_free(live);
    return harness_finish("alloc_fail");
}
