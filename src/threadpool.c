/*
 * threadpool.c - the worker pool (see threadpool.h).
 *
 * State machine, guarded by `generation`:
 *
 *   caller: set fn/ctx/n_tasks, next_task = 0, pending = n_workers,
 *           generation++ (seq_cst), broadcast if anyone sleeps,
 *           work on tasks itself, then wait until pending == 0.
 *   worker: wait until generation changes (spin, then sleep on cond),
 *           take tasks until next_task >= n_tasks, pending-- (release).
 *
 * `stop` makes workers exit at their next wake-up.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 200000

struct kp_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint generation;
    atomic_int next_task;
    atomic_int pending;
    atomic_int sleepers;
    atomic_bool stop;
    kp_task_fn fn;
    void *ctx;
    int n_tasks;
};

typedef struct {
    kp_pool *pool;
    int index;
} worker_arg;

static void drain(kp_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    kp_pool *p = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned seen = 0; /* the generation at creation: a run posted before this thread started is still seen */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                if (spins % 1024 == 0) sched_yield();
                else CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen &&
                   !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
            if (atomic_load(&p->stop)) return NULL;
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        drain(p, index);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

int kp_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

kp_status kp_pool_new(kp_pool **out, int n_threads, kp_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return kp_fail(err, KP_EINVAL, "thread count %d out of range 1..1024", n_threads);
    kp_pool *p = calloc(1, sizeof *p);
    if (!p) return kp_fail(err, KP_ENOMEM, "out of memory creating a thread pool");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            kp_pool_free(p);
            return kp_fail(err, KP_ENOMEM, "out of memory creating a thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* only the started ones are joined */
            kp_pool_free(p);
            return kp_fail(err, KP_ENOMEM, "cannot start worker thread %d", i);
        }
        wa->pool = p;
        wa->index = i;
    }
    *out = p;
    return KP_OK;
}

void kp_pool_free(kp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p);
}

int kp_pool_size(const kp_pool *p) { return p->n_threads; }

void kp_pool_run(kp_pool *p, kp_task_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: pairs with sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    drain(p, 0);
    /* a descheduled worker (busy machine) must get the core: yield after a while */
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < 2000) CPU_RELAX();
        else sched_yield();
    }
}
