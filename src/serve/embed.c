/*
 * embed.c - POST /v1/embeddings (and /embeddings): OpenAI's embeddings
 * API over the loaded model (embed.h), as llama-server's --embeddings
 * computes them for a generative model.
 *
 * Owns nothing between requests. An embedding request runs outside the
 * scheduler, on the connection's thread: a KV pool sized to its longest
 * input, a forward pass (model/forward.h, the model's weights as mapped:
 * they are shared read-only with the engine) and a thread pool of its own,
 * all made for the request and freed after it; one request at a time (a
 * mutex), so embeddings never take more than one request's memory and
 * threads. Each input is tokenized as a prompt (BOS when the vocabulary
 * wants one, control-token texts as text), run through every layer in
 * chunks of EMBD_CHUNK positions, and its final-norm hidden states pooled:
 *
 *   mean   the average over every position (llama.cpp's
 *          LLAMA_POOLING_TYPE_MEAN; the BOS included)
 *   last   the last position's (LLAMA_POOLING_TYPE_LAST)
 *
 * then scaled to unit L2 norm, as llama-server's OpenAI endpoint returns
 * them. The request:
 *
 *   input            a string, an array of strings, an array of token ids,
 *                    or an array of arrays of token ids (at most
 *                    EMBD_MAX_INPUTS inputs, each 1..the context tokens)
 *   model            must be this server's model when given
 *   encoding_format  "float" (default) or "base64" (little-endian float32)
 *   dimensions       refused unless it is the model's width
 *   pooling          kvpin's: "mean" (default, or --pooling) or "last"
 *   user             accepted
 *
 * The answer: {"object": "list", "data": [{"object": "embedding", "index",
 * "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}.
 */
#include "serve/embed.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "kv/kvpool.h"
#include "model/forward.h"
#include "serve/server.h"
#include "tok/tok.h"

#define EMBD_CHUNK 256
#define EMBD_MAX_INPUTS 256

static pthread_mutex_t embd_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    int32_t *ids;
    size_t n;
} input;

static void inputs_free(input *in, size_t n) {
    for (size_t i = 0; i < n; i++) free(in[i].ids);
    free(in);
}

/* The request's inputs as token ids; false with *msg (a 400) on a bad one. */
static bool read_inputs(kp_server *s, const json_t *v, input **out, size_t *n_out, char *msg, size_t msg_size) {
    *out = NULL;
    *n_out = 0;
    bool list = json_is_array(v) && json_array_size(v) > 0 &&
                (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0)));
    size_t n = list ? json_array_size(v) : 1;
    if (!json_is_string(v) && !(json_is_array(v) && json_array_size(v) > 0))
        return snprintf(msg, msg_size, "input must be a string, an array of strings or of token ids"), false;
    if (n > EMBD_MAX_INPUTS) return snprintf(msg, msg_size, "input has %zu items; at most %d", n, EMBD_MAX_INPUTS), false;
    input *in = calloc(n, sizeof *in);
    if (!in) return snprintf(msg, msg_size, "out of memory"), false;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = list ? json_array_get(v, i) : v;
        kp_error err = {0};
        if (json_is_string(x)) {
            if (kp_tok_encode(s->v, json_string_value(x), json_string_length(x), true, false, &in[i].ids, &in[i].n,
                              &err) != KP_OK) {
                snprintf(msg, msg_size, "input[%zu]: %.200s", i, err.msg);
                goto bad;
            }
        } else if (json_is_array(x) && json_array_size(x) > 0) {
            in[i].n = json_array_size(x);
            in[i].ids = malloc(in[i].n * sizeof *in[i].ids);
            if (!in[i].ids) {
                snprintf(msg, msg_size, "out of memory");
                goto bad;
            }
            for (size_t k = 0; k < in[i].n; k++) {
                const json_t *t = json_array_get(x, k);
                json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
                if (id < 0 || id >= kp_tok_n_vocab(s->v)) {
                    snprintf(msg, msg_size, "input[%zu][%zu] is not a token id of this model (0..%d)", i, k,
                             kp_tok_n_vocab(s->v) - 1);
                    goto bad;
                }
                in[i].ids[k] = (int32_t)id;
            }
        } else {
            snprintf(msg, msg_size, "input[%zu] must be a string or a non-empty array of token ids", i);
            goto bad;
        }
        if (in[i].n == 0) {
            snprintf(msg, msg_size, "input[%zu] is empty and the model has no BOS token to start from", i);
            goto bad;
        }
        if (in[i].n > s->ctx) {
            snprintf(msg, msg_size, "input[%zu] has %zu tokens, more than the context of %u", i, in[i].n, s->ctx);
            goto bad;
        }
    }
    *out = in;
    *n_out = n;
    return true;
bad:
    inputs_free(in, n);
    return false;
}

/* One input's pooled, normalized embedding into out[n_embd]. */
static kp_status embed_one(kp_forward *fw, kp_kvpool *kv, const input *in, bool last, float *hid, float *out,
                           uint32_t E, kp_error *err) {
    kp_kvseq seq = {0};
    kp_kvseq *seqs[1] = {&seq};
    int32_t pos[EMBD_CHUNK], sq[EMBD_CHUNK];
    uint8_t want[EMBD_CHUNK];
    memset(out, 0, E * sizeof *out);
    kp_status st = KP_OK;
    for (size_t at = 0; st == KP_OK && at < in->n; at += EMBD_CHUNK) {
        int m = (int)(in->n - at < EMBD_CHUNK ? in->n - at : EMBD_CHUNK);
        int n_want = 0;
        for (int t = 0; t < m; t++) {
            pos[t] = (int32_t)(at + (size_t)t);
            sq[t] = 0;
            want[t] = last ? at + (size_t)t == in->n - 1 : 1;
            n_want += want[t];
        }
        kp_batch b = {m, in->ids + at, pos, sq, want, seqs, 1};
        st = kp_forward_hidden(fw, &b, hid, err);
        for (int k = 0; st == KP_OK && k < n_want; k++)
            for (uint32_t j = 0; j < E; j++) out[j] += hid[(size_t)k * E + j];
    }
    kp_kvseq_release(&seq, kv);
    if (st != KP_OK) return st;
    double norm = 0;
    float scale = last ? 1.0f : 1.0f / (float)in->n;
    for (uint32_t j = 0; j < E; j++) out[j] *= scale, norm += (double)out[j] * out[j];
    norm = sqrt(norm);
    if (norm > 0)
        for (uint32_t j = 0; j < E; j++) out[j] = (float)(out[j] / norm);
    return KP_OK;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The floats as base64 of their little-endian bytes. */
static json_t *base64_floats(const float *x, uint32_t n) {
    size_t bytes = (size_t)n * 4, olen = (bytes + 2) / 3 * 4;
    char *o = malloc(olen + 1);
    if (!o) return NULL;
    const unsigned char *p = (const unsigned char *)x; /* x86-64 and aarch64 Linux: little-endian */
    size_t k = 0;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < bytes ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < bytes ? p[i + 2] : 0);
        o[k++] = B64[v >> 18 & 63];
        o[k++] = B64[v >> 12 & 63];
        o[k++] = i + 1 < bytes ? B64[v >> 6 & 63] : '=';
        o[k++] = i + 2 < bytes ? B64[v & 63] : '=';
    }
    json_t *j = json_stringn(o, k);
    free(o);
    return j;
}

KP_HANDLER(kp_embeddings) {
    (void)id;
    json_error_t je;
    json_t *body = json_loadb(cn->body.data, cn->body.len, 0, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        return kp_http_fail(s, c, 400, "invalid_request_error", NULL, NULL, "the body is not a JSON object: %s",
                            je.text);
    }
    char msg[320] = "";
    const char *param = NULL;
    const json_t *model = json_object_get(body, "model"), *fmt = json_object_get(body, "encoding_format");
    const json_t *dims = json_object_get(body, "dimensions"), *pool = json_object_get(body, "pooling");
    uint32_t E = s->m->hp.n_embd;
    bool last = s->cfg.pooling_last;
    if (model && !json_is_null(model) && (!json_is_string(model) || strcmp(json_string_value(model), s->cfg.model_name)))
        param = "model", snprintf(msg, sizeof msg, "this server has the model \"%s\"", s->cfg.model_name);
    else if (fmt && !json_is_null(fmt) &&
             !(json_is_string(fmt) && (!strcmp(json_string_value(fmt), "float") || !strcmp(json_string_value(fmt), "base64"))))
        param = "encoding_format", snprintf(msg, sizeof msg, "encoding_format must be \"float\" or \"base64\"");
    else if (dims && !json_is_null(dims) && !(json_is_integer(dims) && json_integer_value(dims) == (json_int_t)E))
        param = "dimensions", snprintf(msg, sizeof msg, "this model's embeddings have %u dimensions", E);
    else if (pool && !json_is_null(pool) &&
             !(json_is_string(pool) && (!strcmp(json_string_value(pool), "mean") || !strcmp(json_string_value(pool), "last"))))
        param = "pooling", snprintf(msg, sizeof msg, "pooling must be \"mean\" or \"last\"");
    if (json_is_string(pool)) last = !strcmp(json_string_value(pool), "last");
    bool b64 = json_is_string(fmt) && !strcmp(json_string_value(fmt), "base64");
    input *in = NULL;
    size_t n_in = 0;
    if (!param && !read_inputs(s, json_object_get(body, "input"), &in, &n_in, msg, sizeof msg)) param = "input";
    json_decref(body);
    if (param) return kp_http_fail(s, c, 400, "invalid_request_error", NULL, param, "%s", msg);
    size_t longest = 0, total = 0;
    for (size_t i = 0; i < n_in; i++) longest = in[i].n > longest ? in[i].n : longest, total += in[i].n;
    /* the request's own pool, pass and threads: one request at a time */
    pthread_mutex_lock(&embd_mu);
    kp_error err = {0};
    const kp_hparams *hp = &s->m->hp;
    uint32_t block = 16;
    kp_kvpool_config kc = {hp->n_kv_layer, hp->n_head_kv, hp->head_dim, KP_DTYPE_F32, block, 0, KP_DTYPE_F32, NULL, 0, 0};
    kp_kvpool *kv = NULL;
    kp_forward *fw = NULL;
    kp_threads *th = NULL;
    float *hid = malloc((size_t)EMBD_CHUNK * E * sizeof *hid), *vec = malloc((size_t)n_in * E * sizeof *vec);
    kp_status st = hid && vec ? KP_OK : kp_fail(&err, KP_ENOMEM, "out of memory");
    if (st == KP_OK) { /* the budget: the longest input's blocks, F32 rows of K and V */
        uint64_t block_bytes = (uint64_t)hp->n_kv_layer * hp->n_head_kv * block * 2 * kp_dtype_row_size(KP_DTYPE_F32, hp->head_dim);
        kc.budget_bytes = block_bytes * ((longest + block - 1) / block + 1);
        st = kp_kvpool_new(&kv, &kc, &err);
    }
    if (st == KP_OK) st = kp_threads_new(&th, s->cfg.embd_threads ? (int)s->cfg.embd_threads : 2, &err);
    if (st == KP_OK) st = kp_forward_new(&fw, s->m, kv, th, NULL, &err);
    for (size_t i = 0; st == KP_OK && i < n_in; i++) st = embed_one(fw, kv, &in[i], last, hid, vec + i * E, E, &err);
    kp_forward_free(fw);
    kp_threads_free(th);
    kp_kvpool_free(kv);
    pthread_mutex_unlock(&embd_mu);
    free(hid);
    json_t *data = st == KP_OK ? json_array() : NULL;
    for (size_t i = 0; data && i < n_in; i++) {
        json_t *e;
        if (b64) {
            e = base64_floats(vec + i * E, E);
        } else {
            e = json_array();
            for (uint32_t j = 0; e && j < E; j++) json_array_append_new(e, json_real(vec[i * E + j]));
        }
        json_array_append_new(data, json_pack("{s:s, s:I, s:o}", "object", "embedding", "index", (json_int_t)i,
                                              "embedding", e ? e : json_null()));
    }
    free(vec);
    inputs_free(in, n_in);
    if (st != KP_OK) {
        if (st == KP_ENOMEM || st == KP_EFULL)
            return kp_http_fail(s, c, 500, "server_error", NULL, NULL, "embeddings: %s", err.msg);
        return kp_http_fail(s, c, 400, "invalid_request_error", NULL, "input", "embeddings: %s", err.msg);
    }
    json_t *j = json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model",
                          s->cfg.model_name, "usage", "prompt_tokens", (json_int_t)total, "total_tokens",
                          (json_int_t)total);
    return kp_http_json(s, c, 200, j);
}
