/*
 * scheduler_impl.h - the scheduler's own types, internal to its files
 * (floor 7).
 *
 * Not a contract: scheduler.h is the scheduler's only public interface, and
 * nothing outside the scheduler's files includes this header. It holds the
 * structures those files share: a request (struct kp_sreq), what the
 * choices of one kp_sched_submit_n share (sgroup), a cache operation
 * (sched_op) and the scheduler itself (struct kp_sched), with comments
 * saying who may touch which fields: set at submit and then the engine
 * thread's, under the request's `mu`, under the scheduler's `mu` or
 * `snap_mu`. scheduler.c's top comment has the locks and a request's life.
 *
 * The scheduler's files: scheduler.c (requests, the queue, the cache
 * operations' entry points), scheduler_thread.c (the engine thread) and
 * scheduler_crews.c (in-flight prefixes). Calls between them go one way
 * (make check refuses a circle), as the functions at the end of this
 * header say: scheduler_thread.c -> scheduler_crews.c -> scheduler.c, and
 * scheduler_thread.c -> scheduler.c.
 */
#ifndef KP_SCHEDULER_IMPL_H
#define KP_SCHEDULER_IMPL_H

#include "serve/scheduler.h"

#include "base/buf.h"

#include <pthread.h>
#include <stdatomic.h>

struct kp_sreq {
    /* set at submit, then owned by the engine thread */
    int32_t *all;
    kp_gen *gen;  /* prompt + generated tokens, sampler, text, limits */
    kp_grammar *grammar; /* a reference, until the engine thread constrains gen with it */
    uint32_t n_prompt, n_fill, fed;
    bool admitted;       /* admitted once: the report and usage are those of that prefill */
    double t_kv;         /* when it began waiting at the queue's head for KV blocks; 0: not */
    char *text; /* the prompt text, for the report; NULL: none */
    kp_doctor_hints hints; /* the chat layer's, for the report */
    size_t text_len;
    uint32_t *msg_starts;  /* the prompt's message starts (kp_eng_begin_msgs); NULL: none */
    uint32_t n_msg_starts;
    bool no_slots;         /* the last KV rule it met found too few window slots */
    kp_eng_seq seq;
    float *logits;
    double t_submit, t_admit, t_last;
    kp_sreq *next;       /* the queue, then the list of requests that ended this iteration */
    kp_finish why;       /* how it ended, told to the owner once the snapshot is out */
    kp_status why_status;
    kp_error why_err;
    /* shared */
    atomic_bool cancel;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* output, under mu */
    kp_buf out;
    uint32_t new_tokens, completion_tokens;
    bool started, started_seen, finish_seen;
    kp_finish finish;
    kp_status status;
    kp_error err;
    kp_eng_report report;
    kp_doctor_report doctor;
    bool has_doctor;
    double queue_ms, ttft_ms;
    uint32_t preemptions;
    kp_buf lp;           /* kp_token_logprobs records not yet waited for */
    /* n choices (kp_sched_submit_n) */
    uint64_t group;      /* the choices' common id; 0: a request alone */
    bool follower;       /* a choice > 0: admitted with the first, forks from its prefill */
    kp_sreq *lead;       /* engine thread: running, waiting for lead's prefill to fork from it */
    uint32_t n_wait;     /* engine thread: followers waiting on this one's prefill */
    struct sgroup *grp;  /* wakes kp_sreq_wait_any; NULL alone */
    /* in-flight prefixes (engine thread): parked in the running table until
     * `crew` (a running sequence whose prompt shares crew_n > what the
     * index holds) has computed crew_n positions, then forks them */
    kp_sreq *crew;
    uint32_t crew_n;
    uint32_t n_crew;         /* requests parked on this one */
    uint32_t crew_chunk;     /* this step's prefill tokens, given before anyone else's */
    bool no_crew;            /* a fork from its crew failed: admitted the ordinary way from now on */
    kp_eng_report crew_rep;  /* kp_eng_probe at parking: what the index held then */
    /* the first prefill's progress, under mu (progress: the owner asked, kp_sreq_progress) */
    atomic_bool progress;
    bool prog_admitted, prog_new;
    uint32_t prog_done;
    double prog_ms;
};

/* What the choices of one kp_sched_submit_n share: a tick counter under a
 * mutex that every change of any of them advances (kp_sreq_wait_any
 * sleeps on it). Freed by the last choice. */
typedef struct sgroup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t ticks;
    atomic_int refs;
} sgroup;

#define SCHED_WARM 8   /* grammars whose matchers (and mask caches) the engine thread keeps */
#define SCHED_SPARES 4 /* finished matchers kept per such grammar for reuse */

typedef enum { OP_PROBE, OP_PIN, OP_UNPIN, OP_PATH } op_kind;

/* A cache operation: on the caller's stack, queued under mu, served by the
 * engine thread, which sets done (under mu) last and never touches it
 * after that. */
typedef struct sched_op {
    op_kind kind;
    const int32_t *tokens;
    uint32_t n;
    const char *text;
    size_t text_len;
    int64_t ttl, now;
    uint64_t id;            /* unpin: in; pin: out */
    kp_eng_report *rep;     /* probe */
    kp_doctor_report *doc;
    bool has_doc;
    kp_eng_stats *after;    /* pin, may be NULL */
    int32_t *path;          /* node path: out[0..path_max), tokens = the first-token chain */
    uint32_t path_max, path_start, path_end;
    kp_status st;
    kp_error err;
    bool done;
    struct sched_op *next;
} sched_op;

struct kp_sched {
    kp_engine *e;
    const kp_tok_vocab *v;
    kp_sched_config cfg;
    uint32_t n_vocab, max_pos;
    pthread_t thread;
    bool started_thread;
    pthread_mutex_t mu;      /* queue, operations, counters, stats */
    pthread_mutex_t snap_mu; /* snap */
    pthread_cond_t work;     /* the engine thread waits for requests or operations */
    pthread_cond_t op_done;  /* callers wait for their operation */
    bool stop;
    kp_sreq *qhead, *qtail;
    sched_op *ops, *ops_tail;
    uint32_t n_queued, n_running;
    uint32_t n_taking; /* taken off the queue by the engine thread, not yet running (under mu) */
    kp_sreq **running;    /* [parallel], engine thread */
    kp_eng_item *items;   /* [parallel] */
    kp_sreq **item_req;
    kp_sreq *ended;       /* requests that ended this iteration, engine thread */
    kp_sreq **full;       /* [parallel]: step items that found no KV block, engine thread */
    uint32_t kv_positions; /* the budget's blocks x block size */
    uint64_t next_group;   /* ids of kp_sched_submit_n groups, under mu */
    uint64_t kv_budget, kv_per_token;
    kp_cachereport *crep;        /* engine thread */
    kp_sched_stats st;    /* under mu */
    kp_sched_cache snap;  /* under snap_mu */
    bool dirty;           /* the engine changed since the last snapshot (engine thread) */
    double last_expire, last_publish;
    /* constrained decoding, engine thread: the vocabulary's index (built on
     * the first constrained request) and a matcher at the start of each of
     * the last SCHED_WARM grammars (a reference each), whose clones share
     * its warm mask cache */
    kp_gvocab *gv;
    struct {
        kp_grammar *g;
        kp_gmatch *m;
        uint64_t used;
        kp_gmatch *spare[SCHED_SPARES]; /* finished requests' matchers, reset: their transition memo is warm too */
        int n_spare;
    } warm[SCHED_WARM];
    uint64_t warm_clock;
};

/* ---- defined in scheduler.c ------------------------------------------- */

/* Seconds on the monotonic clock. */
double kp_sched_now(void);

/* Drops one of r's two references (owner, scheduler); the last frees it. */
void kp_sched_unref(kp_sreq *r);

/* Puts r at the queue's front (a preempted request, or a parked one whose
 * crew left). Engine thread. */
void kp_sched_requeue(kp_sched *s, kp_sreq *r);

/* ---- defined in scheduler_crews.c (engine thread) ------------------------ */

/* The running sequence queued r (the queue's head) parks on, and the
 * positions it will fork (*cap); NULL: r is admitted the ordinary way. */
kp_sreq *kp_sched_crew_find(kp_sched *s, kp_sreq *r, uint32_t *cap, kp_eng_report *rep);

/* r, with requests parked on it, leaves the running table: they fork what
 * r computed for them, or go back to the queue's front. */
void kp_sched_crew_leave(kp_sched *s, kp_sreq *r);

/* Before a step: parked requests whose rows are computed fork them; the
 * sequences others park on take the step's prefill budget first. */
void kp_sched_crew_ready(kp_sched *s, uint32_t *budget);

#endif
