/*
 * endpoints.h - the plain endpoints of the server (floor 7).
 *
 * The handlers of routes.c's table that are not a generation: each reads
 * its body, asks the scheduler or the vocabulary, and answers one body.
 *
 *   POST /tokenize  /detokenize          kp_ep_tokenize, kp_ep_detokenize
 *   GET  /v1/models[/{id}]                kp_ep_models
 *   GET  /health  /v1/health              kp_ep_health
 *   GET  /metrics (Prometheus text)       kp_ep_metrics
 *   GET  /v1/cache                        kp_ep_cache: the memory bill, top prefixes, keys,
 *                                         breakpoint pins, the response store
 *   POST /v1/cache/probe                  kp_ep_cache_probe: a prompt's cache report, no model run
 *   POST /v1/cache/pin                    kp_ep_cache_pin: compute and pin a prefix (ttl)
 *   DELETE /v1/cache/pin/{id}             kp_ep_cache_unpin
 *   GET  / and /dashboard                 kp_ep_dashboard (404 with --no-dashboard)
 *   GET  /v1/cache/events                 kp_ep_cache_events: what the dashboard draws
 *   GET  /v1/cache/node/{chain}           kp_ep_cache_node: one prefix-tree node in full
 */
#ifndef KP_ENDPOINTS_H
#define KP_ENDPOINTS_H

#include "serve/http.h"

KP_HANDLER(kp_ep_tokenize);
KP_HANDLER(kp_ep_detokenize);
KP_HANDLER(kp_ep_models);
KP_HANDLER(kp_ep_health);
KP_HANDLER(kp_ep_metrics);
KP_HANDLER(kp_ep_cache);
KP_HANDLER(kp_ep_cache_probe);
KP_HANDLER(kp_ep_cache_pin);
KP_HANDLER(kp_ep_cache_unpin);
KP_HANDLER(kp_ep_dashboard);
KP_HANDLER(kp_ep_cache_events);
KP_HANDLER(kp_ep_cache_node);

#endif
