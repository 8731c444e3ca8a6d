/*
 * threadpool.h - a persistent worker pool with one primitive: parallel for.
 *
 * kp_threads_run(pool, fn, ctx, n_tasks) calls fn(ctx, task, thread) for every
 * task in [0, n_tasks) across the pool's threads (the calling thread is
 * thread 0 and works too) and returns when all are done. Tasks are handed
 * out by an atomic counter in runs of consecutive ids that shrink as the
 * run drains, so uneven tasks balance themselves and a thread works through
 * neighbouring tasks (the matmul's weight rows prefetch across them).
 *
 * The pool is created once per model session, never per token. Between
 * runs, workers spin briefly (decode issues hundreds of runs per token and a
 * sleeping worker costs tens of microseconds to wake) and then sleep on a
 * condition variable, so an idle server uses no CPU.
 *
 * One pool serves one caller at a time (the engine thread).
 */
#ifndef KP_THREADPOOL_H
#define KP_THREADPOOL_H

#include "base/status.h"

typedef struct kp_threads kp_threads;
typedef void (*kp_task_fn)(void *ctx, int task, int thread);

/* n_threads >= 1 (1: no worker threads, everything runs in the caller). */
kp_status kp_threads_new(kp_threads **out, int n_threads, kp_error *err);
void kp_threads_free(kp_threads *p);
int kp_threads_size(const kp_threads *p);
void kp_threads_run(kp_threads *p, kp_task_fn fn, void *ctx, int n_tasks);

/* Number of online CPUs (at least 1). */
int kp_cpu_count(void);

#endif
