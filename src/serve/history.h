/*
 * history.h - what the cache dashboard draws over time: the last requests,
 * the latency points and the per-minute cache traffic by cause (floor 7).
 *
 * The HTTP server records every finished generation here (one call, from
 * whichever thread answered it); GET /v1/cache/events reads it. Nothing
 * here touches the engine or the scheduler: the numbers come from the
 * request's last kp_sreq_update, so keeping the history costs the engine
 * nothing.
 *
 * Bounded: the last KP_HISTORY_RECENT requests whole (numbers and cache
 * report), the last KP_HISTORY_POINTS latency points, and KP_HISTORY_MINUTES
 * one-minute buckets of wall-clock time. Older entries are overwritten.
 */
#ifndef KP_HISTORY_H
#define KP_HISTORY_H

#include <jansson.h>
#include <stdint.h>

#include "base/status.h"
#include "serve/scheduler.h"

#define KP_HISTORY_RECENT 24
#define KP_HISTORY_POINTS 512
#define KP_HISTORY_MINUTES 60
/* A request is warm (a hit in the dashboard's counts) when at least this
 * share of its prompt tokens was reused: one that reused 43 of 700 tokens
 * is not. */
#define KP_HISTORY_WARM_PERCENT 90

typedef struct kp_history kp_history;

/* An empty history in *out. KP_ENOMEM. */
kp_status kp_history_new(kp_history **out, kp_error *err);

/* NULL is a no-op. */
void kp_history_free(kp_history *h);

/* Records one finished generation. u: the scheduler's last update of it
 * (only its numbers, report and doctor report are read; nothing is kept
 * of its pointers); key: its prompt_cache_key (copied, cut to
 * KP_CACHEKEYS_KEY_MAX bytes; NULL or "": none); finish: how it ended (a
 * static word, may be NULL);
 * total_ms: from its arrival to now; now: wall-clock seconds (time()).
 * A request whose prompt was never computed (!u->started) is not recorded.
 * Thread-safe: a short mutex; h NULL is a no-op. */
void kp_history_add(kp_history *h, const kp_sreq_update *u, const char *key, const char *finish, double total_ms,
                    int64_t now);

/* The history as JSON (a new reference; NULL when out of memory):
 *
 *   {"requests": [newest first: {"seq", "time", "prompt_cache_key" (null: none),
 *       "prompt_tokens", "reused_tokens", "computed_tokens", "completion_tokens",
 *       "ttft_ms", "tpot_ms", "finish", "warm", "cause", "cache": {kvpin_cache
 *       of the response, plus "cached_marker" and "request_marker": the
 *       divergence inside each snippet, in characters}}],
 *    "latency": [oldest first: {"prompt_tokens", "reused_tokens", "ttft_ms",
 *       "warm", "depth", "tpot_ms"}],
 *    "minutes": [the last KP_HISTORY_MINUTES minutes up to now, oldest first:
 *       {"minute" (unix time of its start), "requests", "hits", "reused",
 *        "computed": {cause: tokens computed, for the causes that have any},
 *        "requests_by_cause": {cause: requests, for the causes that have any}}],
 *    "causes": [the cause names, in the order the chart stacks them],
 *    "warm_percent": KP_HISTORY_WARM_PERCENT}
 *
 * A request is warm ("warm", latency "warm", a minute's "hits") when it
 * reused at least KP_HISTORY_WARM_PERCENT% of its prompt tokens: reusing
 * something (a shared template opening, 43 of 700 tokens) does not make it
 * warm. depth is the mean number of cached positions during the decode
 * (prompt_tokens + completion_tokens / 2); tpot_ms is null for a request
 * that generated fewer than two tokens. */
json_t *kp_history_json(kp_history *h, int64_t now);

#endif
