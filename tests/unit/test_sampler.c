/*
 * test_sampler.c - the sampling chain against a float64 reference.
 *
 * The reference follows llama.cpp's chain in the order sampler.h states:
 * penalties over the recent tokens, top-k, softmax, top-p (smallest head of
 * the sorted list whose mass reaches p), min-p (probability >= min_p x the
 * best one), then a softmax at the temperature over the survivors. For
 * random logits and many parameter sets, every drawn token must be a
 * survivor, and the frequencies of thousands of draws must match the reference
 * probabilities (within 5 standard errors, plus a little). Greedy must be
 * the argmax (ties to the lowest id) after penalties; the same seed must
 * give the same tokens; bad parameters are refused. kp_sampler_sample_lp
 * must draw the same tokens as kp_sampler_sample and report the log of the
 * reference probabilities (temperature 1 for greedy), its top list sorted
 * and equal to the reference's most likely tokens, masked (-inf) tokens
 * never listed.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/sampler.h"

static uint64_t rs = 0x853c49e6748fea9bull;
static double unit(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

typedef struct {
    int id;
    double l;
} rc;

static int rc_desc(const void *a, const void *b) {
    const rc *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? 1 : -1;
    return x->id - y->id;
}

/* Reference probabilities prob[0..n) (0 for tokens that do not survive). */
static void reference(const kp_sampler_params *p, const float *logits, int n, const int *hist, int n_hist,
                      double *prob) {
    rc *c = malloc(n * sizeof *c);
    for (int i = 0; i < n; i++) c[i] = (rc){i, logits[i]};
    int *cnt = calloc(n, sizeof *cnt);
    for (int i = 0; i < n_hist; i++) cnt[hist[i]]++;
    for (int i = 0; i < n; i++)
        if (cnt[i]) {
            double l = c[i].l;
            l = l <= 0 ? l * p->repeat_penalty : l / p->repeat_penalty;
            c[i].l = (float)(l - (cnt[i] * (double)p->frequency_penalty + p->presence_penalty));
        }
    qsort(c, n, sizeof *c, rc_desc);
    int m = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double sum = 0, *q = malloc(n * sizeof *q);
    for (int i = 0; i < m; i++) sum += exp(c[i].l - c[0].l);
    for (int i = 0; i < m; i++) q[i] = exp(c[i].l - c[0].l) / sum;
    if (p->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < m; i++) {
            cum += q[i];
            if (cum >= p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        int k = 1;
        while (k < m && q[k] >= q[0] * p->min_p) k++;
        m = k;
    }
    memset(prob, 0, n * sizeof *prob);
    sum = 0;
    for (int i = 0; i < m; i++) sum += exp((c[i].l - c[0].l) / p->temp);
    for (int i = 0; i < m; i++) prob[c[i].id] = exp((c[i].l - c[0].l) / p->temp) / sum;
    free(c);
    free(cnt);
    free(q);
}

/* Besides the frequencies: when the reference expects two or more tokens
 * at least 5 times each, the draws must hold two or more tokens (a sampler
 * gone greedy fails), and exactly one when only one token survives. */
static void check_distribution(int n, kp_sampler_params p, bool with_history) {
    kp_error err = {0};
    float *logits = malloc(n * sizeof *logits);
    double *prob = malloc(n * sizeof *prob);
    /* a peaked head and a long flat tail, like a language model's logits */
    for (int i = 0; i < n; i++) logits[i] = (float)(unit() * 4.0 + (unit() < 0.01 ? 6.0 * unit() : 0.0));
    int hist[8] = {0};
    int n_hist = 0;
    kp_sampler *s = NULL;
    CHECK(kp_sampler_new(&s, &p, n, &err) == KP_OK);
    if (with_history) {
        for (int i = 0; i < 8; i++) {
            int best = 0;
            for (int k = 1; k < n; k++)
                if (logits[k] > logits[best] && (i == 0 || unit() < 0.5)) best = k;
            hist[n_hist++] = (i & 1) ? best : (int)(unit() * n);
            kp_sampler_accept(s, hist[n_hist - 1]);
        }
    }
    reference(&p, logits, n, hist, p.repeat_last_n == 0 ? 0 : n_hist, prob);
    const int draws = n > 1000 ? 1500 : 6000;
    int *seen = calloc(n, sizeof *seen);
    int outside = 0;
    /* the sampler's history stays as accepted above: sampling does not accept */
    for (int d = 0; d < draws; d++) {
        int32_t id = kp_sampler_sample(s, logits);
        if (id < 0 || id >= n || prob[id] == 0) {
            outside++;
            continue;
        }
        seen[id]++;
    }
    CHECK_MSG(outside == 0, "n %d top_k %d top_p %g min_p %g temp %g: %d draws outside the survivors", n, p.top_k,
              (double)p.top_p, (double)p.min_p, (double)p.temp, outside);
    /* tokens expected at least 5 times one by one, the rarer ones as one group */
    double worst = 0, f_rare = 0, p_rare = 0;
    int tested = 0;
    for (int i = 0; i < n; i++) {
        double f = (double)seen[i] / draws;
        if (prob[i] * draws < 5) {
            f_rare += f;
            p_rare += prob[i];
            continue;
        }
        tested++;
        double z = fabs(f - prob[i]) / sqrt(prob[i] * (1 - prob[i]) / draws);
        if (z > worst) worst = z;
    }
    if (p_rare * draws >= 5) {
        double z = fabs(f_rare - p_rare) / sqrt(p_rare * (1 - p_rare) / draws);
        if (z > worst) worst = z;
    }
    CHECK_MSG(worst < 5.0, "n %d top_k %d top_p %g min_p %g temp %g: frequencies off by %.1f standard errors", n,
              p.top_k, (double)p.top_p, (double)p.min_p, (double)p.temp, worst);
    int drawn = 0, survivors = 0;
    for (int i = 0; i < n; i++) drawn += seen[i] > 0, survivors += prob[i] > 0;
    if (tested >= 2) CHECK_MSG(drawn >= 2, "n %d top_k %d: one token drawn where %d were expected", n, p.top_k, tested);
    if (survivors == 1) CHECK_EQ_INT(drawn, 1);
    kp_sampler_free(s);
    free(seen);
    free(logits);
    free(prob);
}

static void test_distributions(void) {
    const int ns[2] = {300, 49152};
    const int top_k[3] = {0, 1, 40};
    const float top_p[3] = {1.0f, 0.9f, 0.3f}, min_p[3] = {0.0f, 0.05f, 0.5f}, temp[2] = {1.0f, 0.6f};
    int cases = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                for (int d = 0; d < 3; d++)
                    for (int e = 0; e < 2; e++) {
                        if (ns[a] > 1000 && (b + c + d + e) % 6) continue; /* keep the big vocabulary cheap */
                        kp_sampler_params p = kp_sampler_defaults();
                        p.top_k = top_k[b];
                        p.top_p = top_p[c];
                        p.min_p = min_p[d];
                        p.temp = temp[e];
                        p.seed = (uint64_t)(cases + 1);
                        check_distribution(ns[a], p, false);
                        cases++;
                    }
    /* penalties change the logits before everything else */
    kp_sampler_params p = kp_sampler_defaults();
    p.top_k = 0;
    p.top_p = 0.95f;
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.seed = 99;
    check_distribution(300, p, true);
}

static void test_greedy_and_seed(void) {
    kp_error err = {0};
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    kp_sampler_params p = kp_sampler_defaults();
    p.temp = 0;
    kp_sampler *s = NULL;
    CHECK(kp_sampler_new(&s, &p, 6, &err) == KP_OK);
    CHECK_EQ_INT(kp_sampler_sample(s, l), 1); /* a tie goes to the lowest id */
    kp_sampler_free(s);
    /* a repeat penalty on 1 and 3 makes 4 the greedy choice: 2/1.1 < 1.9 */
    p.repeat_penalty = 1.1f;
    CHECK(kp_sampler_new(&s, &p, 6, &err) == KP_OK);
    kp_sampler_accept(s, 1);
    kp_sampler_accept(s, 3);
    CHECK_EQ_INT(kp_sampler_sample(s, l), 4);
    kp_sampler_free(s);
    /* the same seed, the same tokens; another seed, other tokens */
    float big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (float)unit() * 3;
    int32_t a[64], b[64], c[64];
    for (int run = 0; run < 3; run++) {
        kp_sampler_params q = kp_sampler_defaults();
        q.top_k = 0;
        q.top_p = 1;
        q.min_p = 0;
        q.temp = 1;
        q.seed = run == 2 ? 43 : 42;
        CHECK(kp_sampler_new(&s, &q, 1000, &err) == KP_OK);
        for (int i = 0; i < 64; i++) (run == 0 ? a : run == 1 ? b : c)[i] = kp_sampler_sample(s, big);
        kp_sampler_free(s);
    }
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
}

/* kp_sampler_sample_lp against the reference, for one parameter set. */
/* Besides the log-probabilities: greedy draws one token every time, and a
 * sampled distribution whose most likely token has at most 0.8 of the
 * mass draws two or more in 50 (all alike has odds under 2e-5). */
static void check_logprobs(int n, kp_sampler_params p, bool mask) {
    kp_error err = {0};
    float *logits = malloc(n * sizeof *logits);
    double *prob = malloc(n * sizeof *prob);
    for (int i = 0; i < n; i++) logits[i] = (float)(unit() * 4.0 + (unit() < 0.01 ? 6.0 * unit() : 0.0));
    if (mask) /* every other token masked out, as a constraint would */
        for (int i = 0; i < n; i += 2) logits[i] = -INFINITY;
    kp_sampler_params ref = p;
    if (ref.temp <= 0) ref.temp = 1; /* greedy reports the temperature-1 distribution */
    int hist[4] = {3, 5, 5, 7};
    int n_hist = p.repeat_penalty != 1.0f ? 4 : 0;
    reference(&ref, logits, n, hist, n_hist, prob);
    kp_sampler *a = NULL, *b = NULL;
    CHECK(kp_sampler_new(&a, &p, n, &err) == KP_OK);
    CHECK(kp_sampler_new(&b, &p, n, &err) == KP_OK);
    for (int i = 0; i < n_hist; i++) {
        kp_sampler_accept(a, hist[i]);
        kp_sampler_accept(b, hist[i]);
    }
    /* the reference's most likely tokens, by probability then id */
    rc *order = malloc(n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = (rc){i, prob[i]};
    qsort(order, n, sizeof *order, rc_desc);
    int alive = 0, distinct = 0;
    for (int i = 0; i < n; i++) alive += prob[i] > 0;
    int32_t drawn[50];
    for (int d = 0; d < 50; d++) {
        kp_token_logprobs lp;
        int32_t t1 = kp_sampler_sample(a, logits);
        int32_t t2 = kp_sampler_sample_lp(b, logits, 20, &lp);
        CHECK_EQ_INT(t1, t2);
        bool again = false;
        for (int k = 0; k < d; k++) again |= drawn[k] == t2;
        drawn[d] = t2;
        distinct += !again;
        CHECK_EQ_INT(lp.token, t2);
        CHECK_MSG(prob[t2] > 0 && fabs(lp.logprob - log(prob[t2])) < 1e-4, "temp %g top_k %d: logprob %g, ref %g",
                  (double)p.temp, p.top_k, (double)lp.logprob, log(prob[t2]));
        CHECK_EQ_INT((int)lp.n_top, alive < 20 ? alive : 20);
        bool listed = false;
        for (uint32_t k = 0; k < lp.n_top; k++) {
            CHECK(fabs(lp.top_logprob[k] - log(order[k].l)) < 1e-4);
            if (k > 0) CHECK(lp.top_logprob[k] <= lp.top_logprob[k - 1]);
            CHECK(prob[lp.top_token[k]] > 0);
            listed |= lp.top_token[k] == t2;
        }
        CHECK(lp.logprob <= lp.top_logprob[0] + 1e-6f);
        if (alive <= 20) CHECK(listed);
        if (p.temp <= 0) CHECK_EQ_INT(lp.top_token[0], t2); /* greedy takes the most likely */
    }
    if (p.temp <= 0) CHECK_EQ_INT(distinct, 1);
    else if (order[0].l <= 0.8) CHECK_MSG(distinct >= 2, "temp %g top_k %d: one token in 50 draws", (double)p.temp, p.top_k);
    kp_sampler_free(a);
    kp_sampler_free(b);
    free(order);
    free(logits);
    free(prob);
}

static void test_logprobs(void) {
    const int top_k[3] = {0, 5, 40};
    const float top_p[2] = {1.0f, 0.8f}, temp[3] = {1.0f, 0.5f, 0.0f};
    int cases = 0;
    for (int b = 0; b < 3; b++)
        for (int c = 0; c < 2; c++)
            for (int e = 0; e < 3; e++)
                for (int m = 0; m < 2; m++) {
                    kp_sampler_params p = kp_sampler_defaults();
                    p.top_k = top_k[b];
                    p.top_p = top_p[c];
                    p.min_p = cases % 3 == 0 ? 0.05f : 0.0f;
                    p.temp = temp[e];
                    p.repeat_penalty = cases % 4 == 1 ? 1.3f : 1.0f;
                    p.seed = (uint64_t)(cases + 7);
                    check_logprobs(cases % 2 ? 300 : 4000, p, m == 1);
                    cases++;
                }

}

static void test_bad_params(void) {
    kp_error err = {0};
    kp_sampler *s = NULL;
    kp_sampler_params p = kp_sampler_defaults();
    p.top_p = 1.5f;
    CHECK_EQ_INT(kp_sampler_new(&s, &p, 10, &err), KP_EINVAL);
    p = kp_sampler_defaults();
    p.temp = NAN;
    CHECK_EQ_INT(kp_sampler_check(&p, &err), KP_EINVAL);
    p = kp_sampler_defaults();
    p.repeat_penalty = 0;
    CHECK_EQ_INT(kp_sampler_check(&p, &err), KP_EINVAL);
    p = kp_sampler_defaults();
    CHECK_EQ_INT(kp_sampler_new(&s, &p, 0, &err), KP_EINVAL);
    CHECK(s == NULL);
    kp_sampler_free(NULL);
}

int main(void) {
    RUN(test_greedy_and_seed);
    RUN(test_bad_params);
    RUN(test_distributions);
    RUN(test_logprobs);
    return harness_finish("sampler");
}
