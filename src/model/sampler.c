/*
 * sampler.c - the sampling chain (see sampler.h).
 *
 * Working set: a candidates array of (id, logit) for the whole vocabulary,
 * owned by the sampler and reused every call; the history ring of the last
 * accepted tokens; a xoshiro256** generator seeded through splitmix64.
 */
#include "model/sampler.h"

#include "base/buf.h"
#include "base/rng.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t id;
    float logit;
    float p;
} cand;

struct kp_sampler {
    kp_sampler_params p;
    int32_t n_vocab;
    cand *c;
    int32_t *hist;       /* ring of accepted tokens */
    int32_t hist_cap, hist_len, hist_head;
    uint32_t *counts;    /* scratch: occurrences in the window */
    kp_rng rng;
};

kp_sampler_params kp_sampler_defaults(void) {
    kp_sampler_params p = {0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 0.0f, 0.0f, 0};
    return p;
}

kp_status kp_sampler_check(const kp_sampler_params *p, kp_error *err) {
    if (!isfinite(p->temp)) return kp_fail(err, KP_EINVAL, "temperature must be a finite number");
    if (!(p->top_p >= 0 && p->top_p <= 1)) return kp_fail(err, KP_EINVAL, "top_p must be in [0, 1]");
    if (!(p->min_p >= 0 && p->min_p <= 1)) return kp_fail(err, KP_EINVAL, "min_p must be in [0, 1]");
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
        return kp_fail(err, KP_EINVAL, "repeat penalty must be positive");
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return kp_fail(err, KP_EINVAL, "presence and frequency penalties must be finite");
    if (p->repeat_last_n < -1) return kp_fail(err, KP_EINVAL, "repeat_last_n must be >= -1");
    return KP_OK;
}

kp_status kp_sampler_new(kp_sampler **out, const kp_sampler_params *p, int32_t n_vocab,
                         kp_error *err) {
    *out = NULL;
    kp_status st = kp_sampler_check(p, err);
    if (st != KP_OK) return st;
    if (n_vocab <= 0) return kp_fail(err, KP_EINVAL, "empty vocabulary");
    kp_sampler *s = calloc(1, sizeof *s);
    if (!s) return kp_fail(err, KP_ENOMEM, "out of memory creating a sampler");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof(cand));
    s->counts = calloc((size_t)n_vocab, sizeof(uint32_t));
    s->hist_cap = p->repeat_last_n > 0 ? p->repeat_last_n : 4096;
    s->hist = malloc((size_t)s->hist_cap * sizeof(int32_t));
    if (!s->c || !s->counts || !s->hist) {
        kp_sampler_free(s);
        return kp_fail(err, KP_ENOMEM, "out of memory creating a sampler");
    }
    kp_rng_seed(&s->rng, p->seed);
    *out = s;
    return KP_OK;
}

void kp_sampler_free(kp_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->counts);
    free(s->hist);
    free(s);
}

void kp_sampler_accept(kp_sampler *s, int32_t token) {
    if (s->p.repeat_last_n == -1 && s->hist_len == s->hist_cap && s->hist_cap <= INT32_MAX / 2) {
        /* ring is linear while it only grows: head stays 0 (a failed grow
         * leaves it full: the oldest token makes room) */
        size_t cap = (size_t)s->hist_cap;
        if (kp_grow((void **)&s->hist, &cap, cap * 2, sizeof *s->hist)) s->hist_cap = (int32_t)cap;
    }
    s->hist[(s->hist_head + s->hist_len) % s->hist_cap] = token;
    if (s->hist_len < s->hist_cap) s->hist_len++;
    else s->hist_head = (s->hist_head + 1) % s->hist_cap;
}

int32_t kp_argmax(const float *logits, int32_t n) {
    /* the best value kept in a register: comparing against logits[best]
     * made every step wait for a load that depended on the last one */
    int32_t best = 0;
    float bv = logits[0];
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > bv) bv = logits[i], best = i;
    return best;
}

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* "a ranks below b": the min-heap order (worst candidate at the root). */
static bool worse(const cand *a, const cand *b) { return cand_desc(a, b) > 0; }

static void sift_down(cand *h, int32_t m, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && worse(&h[l], &h[w])) w = l;
        if (r < m && worse(&h[r], &h[w])) w = r;
        if (w == i) return;
        cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* Moves the m best candidates (by cand_desc) into c[0..m), unordered. */
static void select_top(cand *c, int32_t n, int32_t m) {
    for (int32_t i = m / 2 - 1; i >= 0; i--) sift_down(c, m, i);
    for (int32_t i = m; i < n; i++) {
        if (worse(&c[0], &c[i])) {
            c[0] = c[i];
            sift_down(c, m, 0);
        }
    }
}

static bool penalties_on(const kp_sampler_params *p) {
    return p->repeat_last_n != 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0);
}

/* The candidates: every id with its logit, penalties applied. */
static void fill_candidates(kp_sampler *s, const float *logits, bool pen) {
    const kp_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < n; i++) s->c[i] = (cand){i, logits[i], 0};
    if (!pen) return;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[(s->hist_head + i) % s->hist_cap];
        if (t >= 0 && t < n) s->counts[t]++;
    }
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[(s->hist_head + i) % s->hist_cap];
        if (t < 0 || t >= n || s->counts[t] == 0) continue;
        float *l = &s->c[t].logit;
        *l = *l <= 0 ? *l * p->repeat_penalty : *l / p->repeat_penalty;
        *l -= (float)s->counts[t] * p->frequency_penalty + p->presence_penalty;
        s->counts[t] = 0; /* once per distinct token */
    }
}

/* Where top-p and min-p cut the sorted candidates c[0..m) whose
 * probabilities are exp(logit - mx) / sum (stored in .p): the new m. */
static int32_t cut(const kp_sampler_params *p, cand *c, int32_t m, float mx, double sum) {
    for (int32_t i = 0; i < m; i++) c[i].p = (float)(expf(c[i].logit - mx) / sum);
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < m; i++) {
            cum += c[i].p;
            if (cum >= p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        float lim = c[0].p * p->min_p;
        int32_t k = 1;
        while (k < m && c[k].p >= lim) k++;
        m = k;
    }
    return m;
}

/* Temperature on the survivors c[0..m) (mx: their largest logit), then one
 * draw from them. */
static int32_t draw(kp_sampler *s, int32_t m, float mx) {
    double sum = 0;
    for (int32_t i = 0; i < m; i++) sum += s->c[i].p = expf((s->c[i].logit - mx) / s->p.temp);
    double r = kp_rng_unit(&s->rng) * sum, acc = 0;
    for (int32_t i = 0; i < m; i++) {
        acc += s->c[i].p;
        if (r < acc) return s->c[i].id;
    }
    return s->c[m - 1].id;
}

/* The truncation samplers on the candidates (penalties applied, s->c
 * filled): top-k, then top-p and min-p on the temperature-1 softmax. Leaves
 * the m survivors in s->c[0..m) (sorted best first, except when nothing
 * truncates: then every candidate survives in id order) and their largest
 * logit in *mx. */
static int32_t keep_survivors(kp_sampler *s, const float *logits, bool pen, float *mx_out) {
    const kp_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;
    int32_t m = n;
    float mx;
    if (p->top_k > 0 && p->top_k < n) {
        m = p->top_k;
        select_top(s->c, n, m); /* the m best first, O(n log m) */
        qsort(s->c, (size_t)m, sizeof(cand), cand_desc);
        mx = s->c[0].logit;
        double sum = 0; /* softmax over the kept candidates */
        for (int32_t i = 0; i < m; i++) sum += expf(s->c[i].logit - mx);
        m = cut(p, s->c, m, mx, sum);
    } else {
        /* no top-k: the softmax is over every candidate */
        mx = s->c[0].logit;
        for (int32_t i = 1; i < n; i++)
            if (s->c[i].logit > mx) mx = s->c[i].logit;
        if (p->top_p >= 1.0f && p->min_p <= 0) {
            /* everything survives: draw over the ids in any fixed order, no sort */
            *mx_out = mx;
            return n;
        }
        double sum = 0;
        for (int32_t i = 0; i < n; i++) sum += expf(s->c[i].logit - mx);
        /* top-p / min-p keep a head of the sorted list: sort the smallest
         * head (64, 256, ...) inside which the cut falls, not all n */
        for (int32_t h = 64;; h *= 4) {
            if (h >= n) {
                qsort(s->c, (size_t)n, sizeof(cand), cand_desc);
                m = cut(p, s->c, n, mx, sum);
                break;
            }
            select_top(s->c, n, h);
            qsort(s->c, (size_t)h, sizeof(cand), cand_desc);
            m = cut(p, s->c, h, mx, sum);
            /* inside the head unless the cut kept all of it and the head's last
             * candidate could still be followed by more survivors */
            bool inside = m < h;
            if (inside) break;
            fill_candidates(s, logits, pen); /* select_top dropped the rest */
        }
    }
    *mx_out = mx;
    return m;
}

/* The chain; *m_out the survivors left in s->c[0..m) with their largest
 * logit *mx_out (0 for the greedy paths, which fill nothing or all). */
static int32_t sample(kp_sampler *s, const float *logits, int32_t *m_out, float *mx_out) {
    const kp_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;
    bool pen = penalties_on(p) && s->hist_len > 0;
    *m_out = 0;
    if (!pen && p->temp <= 0) return kp_argmax(logits, n);
    fill_candidates(s, logits, pen);
    if (p->temp <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (s->c[i].logit > s->c[best].logit) best = i;
        return best;
    }
    float mx;
    int32_t m = keep_survivors(s, logits, pen, &mx);
    *m_out = m;
    *mx_out = mx;
    return draw(s, m, mx);
}

int32_t kp_sampler_sample(kp_sampler *s, const float *logits) {
    int32_t m;
    float mx;
    return sample(s, logits, &m, &mx);
}

/* log p of the survivors c[0..m) at temperature t: (logit - mx) / t - log sum. */
static double log_sum(const cand *c, int32_t m, float mx, float t) {
    double sum = 0;
    for (int32_t i = 0; i < m; i++) sum += exp(((double)c[i].logit - mx) / t);
    return log(sum);
}

int32_t kp_sampler_sample_lp(kp_sampler *s, const float *logits, int32_t n_top, kp_token_logprobs *lp) {
    int32_t m;
    float mx;
    int32_t tok = sample(s, logits, &m, &mx);
    float t = s->p.temp;
    if (t <= 0) { /* greedy: the distribution of temperature 1 after the same truncation */
        t = 1.0f;
        bool pen = penalties_on(&s->p) && s->hist_len > 0;
        fill_candidates(s, logits, pen);
        m = keep_survivors(s, logits, pen, &mx);
    }
    double ls = log_sum(s->c, m, mx, t);
    lp->token = tok;
    lp->logprob = -INFINITY;
    for (int32_t i = 0; i < m; i++)
        if (s->c[i].id == tok) {
            lp->logprob = (float)(((double)s->c[i].logit - mx) / t - ls);
            break;
        }
    if (n_top > KP_LOGPROBS_MAX) n_top = KP_LOGPROBS_MAX;
    if (n_top > m) n_top = m;
    lp->n_top = 0;
    if (n_top <= 0) return tok;
    select_top(s->c, m, n_top);
    qsort(s->c, (size_t)n_top, sizeof(cand), cand_desc);
    for (int32_t i = 0; i < n_top; i++) {
        double l = ((double)s->c[i].logit - mx) / t - ls;
        if (!isfinite(l)) break; /* probability 0 (a masked token): not listed */
        lp->top_token[i] = s->c[i].id;
        lp->top_logprob[i] = (float)l;
        lp->n_top = (uint32_t)i + 1;
    }
    return tok;
}
