/*
 * threadpool.c - the worker pool (see threadpool.h).
 *
 * One 64-bit atomic word describes the current run, so a task can only be
 * claimed by a thread that sees the run it belongs to:
 *
 *   bits 63..48  generation (incremented for every run)
 *   bits 47..24  n_tasks of that run
 *   bits 23..0   next task to hand out
 *
 * A thread claims tasks t..t+k-1 by a compare-and-swap that moves `next`
 * from t to t + k while the generation is unchanged (k shrinks as the run
 * drains, see work()); only then does it read fn/ctx
 * (written by the caller before it published the generation, so they are
 * that run's). The caller publishes a run, claims tasks like everyone else,
 * and waits only until `done` reaches n_tasks: never for an idle or
 * descheduled worker to check in. On a busy machine a worker that does not
 * get a core simply claims nothing and the caller does the tasks; one
 * descheduled while it holds a claim delays the run by that claim only,
 * a share that shrinks as the run drains.
 *
 * (A worker stalled for exactly 65536 runs could mistake a new state for
 * its old one; the generation would have to wrap while it never ran.)
 *
 * Idle workers spin a while (decode posts hundreds of runs per token), then
 * sleep on a condition variable; `sleepers` tells the caller to broadcast.
 */
#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 100000
#define CLAIM_SPLIT 4 /* a claim takes 1/(CLAIM_SPLIT x threads) of the tasks left */
#define MAX_TASKS ((1 << 24) - 1)
#define GEN(s) ((uint32_t)((s) >> 48))
#define NTASKS(s) ((int)(((s) >> 24) & 0xFFFFFF))
#define NEXT(s) ((int)((s) & 0xFFFFFF))

struct kp_threads {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    _Atomic uint64_t state;
    _Alignas(64) atomic_int done; /* its own cache line: claims and completions do not collide */
    _Alignas(64) atomic_int sleepers;
    atomic_bool stop;
    kp_task_fn fn;
    void *ctx;
};

typedef struct {
    kp_threads *pool;
    int index;
} worker_arg;

/* Claims and runs tasks of generation `gen` until none is left. A claim
 * takes a run of tasks, 1/(CLAIM_SPLIT x threads) of those left (guided
 * self-scheduling), so a decode step's ~10,000 small matmul tasks cost tens
 * of atomic operations on the shared word rather than one each, and each
 * thread reads a contiguous stretch of weight rows. When none is left it
 * adds the count it ran to `done` once (an atomic add per claim cost a
 * contended cache line transfer each time). */
static void work(kp_threads *p, uint32_t gen, int thread) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    int ran = 0;
    for (;;) {
        if (GEN(s) != gen || NEXT(s) >= NTASKS(s)) break;
        int next = NEXT(s), k = (NTASKS(s) - next) / (CLAIM_SPLIT * p->n_threads);
        if (k < 1) k = 1;
        if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + (uint64_t)k, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            for (int t = next; t < next + k; t++) p->fn(p->ctx, t, thread);
            ran += k;
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
    }
    if (ran) atomic_fetch_add_explicit(&p->done, ran, memory_order_release);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    kp_threads *p = wa->pool;
    int index = wa->index;
    free(wa);
    uint32_t seen = 0; /* generation 0 is "no run yet" */
    for (;;) {
        int spins = 0;
        uint32_t g;
        while ((g = GEN(atomic_load_explicit(&p->state, memory_order_acquire))) == seen) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            if (++spins < SPIN_ITERS) {
                if (spins % 1024 == 0) sched_yield();
                else CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (GEN(atomic_load(&p->state)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        work(p, g, index);
    }
}

int kp_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

kp_status kp_threads_new(kp_threads **out, int n_threads, kp_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return kp_fail(err, KP_EINVAL, "thread count %d out of range 1..1024", n_threads);
    size_t size = (sizeof(kp_threads) + 63) / 64 * 64; /* over-aligned members: aligned_alloc */
    kp_threads *p = aligned_alloc(64, size);
    if (p) memset(p, 0, size);
    if (!p) return kp_fail(err, KP_ENOMEM, "out of memory creating a thread pool");
    p->n_threads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            kp_threads_free(p);
            return kp_fail(err, KP_ENOMEM, "out of memory creating a thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = p;
            wa->index = i;
        }
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            kp_threads_free(p); /* joins the p->n_threads - 1 started ones */
            return kp_fail(err, KP_ENOMEM, "cannot start worker thread %d", i);
        }
        p->n_threads = i + 1;
    }
    *out = p;
    return KP_OK;
}

void kp_threads_free(kp_threads *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p);
}

int kp_threads_size(const kp_threads *p) { return p->n_threads; }

void kp_threads_run(kp_threads *p, kp_task_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint64_t old = atomic_load_explicit(&p->state, memory_order_relaxed);
    uint32_t gen = (GEN(old) + 1) & 0xFFFF;
    if (gen == 0) gen = 1; /* 0 means "no run yet" to a fresh worker */
    int n = n_tasks < MAX_TASKS ? n_tasks : MAX_TASKS;
    atomic_store(&p->state, (uint64_t)gen << 48 | (uint64_t)n << 24); /* seq_cst: pairs with sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, gen, 0);
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; spins++) {
        if (spins < 2000) CPU_RELAX();
        else sched_yield();
    }
    for (int t = n; t < n_tasks; t++) fn(ctx, t, 0); /* beyond MAX_TASKS: run here */
}
