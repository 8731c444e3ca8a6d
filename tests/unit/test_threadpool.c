/*
 * test_threadpool.c - every task of every run executes exactly once, with
 * the right context, whatever the thread count and however runs follow one
 * another (back to back, after workers fell asleep, right after creation);
 * bad thread counts are refused.
 */
#include <stdatomic.h>
#include <unistd.h>

#include "harness.h"
#include "base/threadpool.h"

typedef struct {
    atomic_int *hits;
    int run;
    atomic_int wrong_run;
    int n_threads;
    atomic_int bad_thread;
} ctx_t;

static void task(void *vctx, int t, int thread) {
    ctx_t *c = vctx;
    atomic_fetch_add(&c->hits[t], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
}

static void runs_with(int n_threads) {
    kp_threads *p;
    kp_error err = {0};
    CHECK(kp_threads_new(&p, n_threads, &err) == KP_OK);
    if (!p) return;
    CHECK_EQ_INT(kp_threads_size(p), n_threads);
    enum { MAXT = 3000 };
    static atomic_int hits[MAXT];
    int bad = 0;
    for (int run = 0; run < 2000; run++) {
        int n = run % 7 == 0 ? MAXT : 1 + run % 50;
        for (int i = 0; i < n; i++) atomic_store(&hits[i], 0);
        ctx_t c = {hits, run, 0, n_threads, 0};
        kp_threads_run(p, task, &c, n);
        for (int i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
        bad += atomic_load(&c.bad_thread);
        if (run == 1000) usleep(300000); /* let workers go to sleep, then wake them */
    }
    CHECK_MSG(bad == 0, "%d tasks not run exactly once with %d threads", bad, n_threads);
    kp_threads_run(p, task, NULL, 0); /* no tasks: no call */
    kp_threads_free(p);
}

static void test_counts(void) {
    for (int t = 1; t <= 4; t++) runs_with(t);
}

static void test_bad(void) {
    kp_threads *p;
    kp_error err = {0};
    CHECK(kp_threads_new(&p, 0, &err) == KP_EINVAL && p == NULL);
    CHECK(kp_threads_new(&p, 5000, &err) == KP_EINVAL);
    kp_threads_free(NULL);
    CHECK(kp_cpu_count() >= 1);
}

int main(void) {
    RUN(test_counts);
    RUN(test_bad);
    return harness_finish("threadpool");
}
