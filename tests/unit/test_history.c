/*
 * test_history.c - the dashboard's bounded history (serve/history.h): the
 * rings keep the newest entries, the per-minute buckets add up to what was
 * recorded and drop what is older than the hour, a doctor's markers come
 * back in characters of the decoded snippet, a request is warm by the
 * share of its prompt it reused.
 *
 * Expected values follow from the inputs: each request's numbers are made
 * from its index, so every sum is a closed form.
 */
#include "serve/history.h"

#include <jansson.h>
#include <string.h>

#include "harness.h"

/* Request i: prompt 100 + i, reused i (so request 0 is cold), 4 + i % 3
 * tokens out; the first computed, the first token at 10 + i ms. */
static kp_sreq_update req(uint32_t i) {
    kp_sreq_update u;
    memset(&u, 0, sizeof u);
    u.started = true;
    u.prompt_tokens = 100 + i;
    u.cached_tokens = i;
    u.completion_tokens = 4 + i % 3;
    u.report.prompt_tokens = u.prompt_tokens;
    u.report.reused_tokens = i;
    u.report.computed_tokens = 100;
    u.report.diverged_at_token = i;
    u.report.cold = i == 0;
    u.ttft_ms = 10 + i;
    return u;
}

static json_int_t sum_minutes(json_t *mins, const char *field, const char *cause) {
    json_int_t s = 0;
    size_t i;
    json_t *m;
    json_array_foreach(mins, i, m) {
        json_t *v = cause ? json_object_get(json_object_get(m, "computed"), cause) : json_object_get(m, field);
        s += json_integer_value(v);
    }
    return s;
}

static void test_rings_and_minutes(void) {
    kp_history *h = NULL;
    kp_error err;
    CHECK(kp_history_new(&h, &err) == KP_OK);
    const int64_t t0 = 1796160000; /* a minute boundary */
    const uint32_t n = 40;         /* more than KP_HISTORY_RECENT */
    for (uint32_t i = 0; i < n; i++) {
        kp_sreq_update u = req(i);
        kp_history_add(h, &u, i % 2 ? "agent-7" : NULL, "length", u.ttft_ms + 2.0 * (u.completion_tokens - 1), t0 + i * 10);
    }
    kp_sreq_update never = req(99);
    never.started = false;
    kp_history_add(h, &never, NULL, "cancelled", 1, t0); /* not computed: not recorded */
    int64_t now = t0 + (n - 1) * 10;
    json_t *j = kp_history_json(h, now);
    CHECK(j != NULL);
    json_t *reqs = json_object_get(j, "requests"), *lat = json_object_get(j, "latency"),
           *mins = json_object_get(j, "minutes");
    CHECK_EQ_INT(json_array_size(reqs), KP_HISTORY_RECENT);
    /* newest first: request n-1, then n-2, ... */
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(reqs, 0), "seq")), n);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(reqs, 0), "prompt_tokens")), 100 + n - 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(reqs, KP_HISTORY_RECENT - 1), "seq")),
                 n - KP_HISTORY_RECENT + 1);
    /* tpot: (total - ttft) / (tokens - 1) = 2 ms */
    CHECK(fabs(json_real_value(json_object_get(json_array_get(reqs, 0), "tpot_ms")) - 2.0) < 1e-9);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(reqs, 0), "cause")), "other");
    /* the key as given: request n-1 (odd) had one, n-2 none */
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(reqs, 0), "prompt_cache_key")), "agent-7");
    CHECK(json_is_null(json_object_get(json_array_get(reqs, 1), "prompt_cache_key")));
    CHECK_EQ_INT(json_array_size(lat), n);
    /* request i reused i of 100 + i tokens: under 90% each, so none is warm */
    CHECK(json_is_false(json_object_get(json_array_get(lat, 0), "warm")));
    CHECK(json_is_false(json_object_get(json_array_get(lat, 1), "warm")));
    CHECK_EQ_INT(json_array_size(mins), KP_HISTORY_MINUTES);
    /* 40 requests 10 s apart span 7 minutes; sums are closed forms */
    CHECK_EQ_INT(sum_minutes(mins, "requests", NULL), n);
    CHECK_EQ_INT(sum_minutes(mins, "hits", NULL), 0);
    CHECK_EQ_INT(sum_minutes(mins, "reused", NULL), (json_int_t)n * (n - 1) / 2);
    CHECK_EQ_INT(sum_minutes(mins, NULL, "cold"), 100);
    CHECK_EQ_INT(sum_minutes(mins, NULL, "other"), 100 * (n - 1));
    json_int_t by_other = 0, by_cold = 0;
    size_t mi;
    json_t *mm;
    json_array_foreach(mins, mi, mm) {
        by_other += json_integer_value(json_object_get(json_object_get(mm, "requests_by_cause"), "other"));
        by_cold += json_integer_value(json_object_get(json_object_get(mm, "requests_by_cause"), "cold"));
    }
    CHECK_EQ_INT(by_cold, 1);
    CHECK_EQ_INT(by_other, n - 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(mins, KP_HISTORY_MINUTES - 1), "minute")),
                 now / 60 * 60);
    json_decref(j);
    /* an hour and more later only the newest minutes' buckets remain in the window */
    j = kp_history_json(h, now + 3600);
    CHECK_EQ_INT(sum_minutes(json_object_get(j, "minutes"), "requests", NULL), 0);
    json_decref(j);
    /* a request 60 minutes on takes the first minute's slot: that minute's 6
     * requests (t0 .. t0 + 50) are gone, the other 34 are still in the hour */
    kp_sreq_update u = req(5);
    kp_history_add(h, &u, NULL, "stop", 30, t0 + 3600);
    j = kp_history_json(h, t0 + 3600);
    CHECK_EQ_INT(sum_minutes(json_object_get(j, "minutes"), "requests", NULL), 1 + (n - 6));
    json_decref(j);
    kp_history_free(h);
    kp_history_free(NULL);
}

static void test_doctor_markers(void) {
    kp_history *h = NULL;
    kp_error err;
    CHECK(kp_history_new(&h, &err) == KP_OK);
    kp_sreq_update u = req(3);
    u.has_doctor = true;
    u.doctor.finding.cause = KP_DOCTOR_CAUSE_TIMESTAMP;
    /* escaped snippets: "\n" is two bytes escaped, one character decoded;
     * "é" two bytes, one character */
    strcpy(u.doctor.cached_snippet, "a\\n\xc3\xa9 28 x");
    u.doctor.cached_marker = strlen("a\\n\xc3\xa9 2");
    strcpy(u.doctor.request_snippet, "a\\n\xc3\xa9 29 x");
    u.doctor.request_marker = strlen("a\\n\xc3\xa9 2");
    kp_history_add(h, &u, "", "stop", 20, 1796160000);
    json_t *j = kp_history_json(h, 1796160000);
    json_t *c = json_object_get(json_array_get(json_object_get(j, "requests"), 0), "cache");
    CHECK_EQ_STR(json_string_value(json_object_get(c, "cause")), "timestamp");
    CHECK_EQ_STR(json_string_value(json_object_get(c, "cached_snippet")), "a\n\xc3\xa9 28 x");
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "cached_marker")), 5); /* a \n é space 2 */
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "request_marker")), 5);
    json_t *mins = json_object_get(j, "minutes");
    CHECK_EQ_INT(sum_minutes(mins, NULL, "timestamp"), 100);
    json_decref(j);
    kp_history_free(h);
}

/* Warm is a share of the prompt: 43 of 700 reused is a miss however the
 * doctor names it, 630 of 700 (90%) is warm, 629 is not. */
static void test_warm_by_share(void) {
    kp_history *h = NULL;
    kp_error err;
    CHECK(kp_history_new(&h, &err) == KP_OK);
    const uint32_t reused[] = {43, 630, 629, 699, 0};
    const bool warm[] = {false, true, false, true, false};
    const int64_t t0 = 1796160000;
    for (int i = 0; i < 5; i++) {
        kp_sreq_update u = req(0);
        u.prompt_tokens = u.report.prompt_tokens = 700;
        u.cached_tokens = u.report.reused_tokens = u.report.diverged_at_token = reused[i];
        u.report.computed_tokens = 700 - reused[i];
        u.report.cold = false;
        kp_history_add(h, &u, NULL, "stop", 20, t0 + i);
    }
    json_t *j = kp_history_json(h, t0 + 5);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "warm_percent")), KP_HISTORY_WARM_PERCENT);
    json_t *reqs = json_object_get(j, "requests"), *lat = json_object_get(j, "latency");
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(json_is_true(json_object_get(json_array_get(lat, (size_t)i), "warm")) == warm[i],
                  "%u of 700: latency warm", reused[i]);
        CHECK_MSG(json_is_true(json_object_get(json_array_get(reqs, (size_t)(4 - i)), "warm")) == warm[i],
                  "%u of 700: request warm", reused[i]);
    }
    CHECK_EQ_INT(sum_minutes(json_object_get(j, "minutes"), "hits", NULL), 2);
    CHECK_EQ_INT(sum_minutes(json_object_get(j, "minutes"), "reused", NULL), 43 + 630 + 629 + 699);
    json_decref(j);
    kp_history_free(h);
}

int main(void) {
    RUN(test_rings_and_minutes);
    RUN(test_doctor_markers);
    RUN(test_warm_by_share);
    return harness_finish("history");
}
