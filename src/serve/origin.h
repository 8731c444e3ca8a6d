/*
 * origin.h - what a web page may ask of kvpin (floor 7): the Host a
 * request names, the Content-Type of its body, and the cross-origin
 * (CORS) answers.
 *
 * A browser lets any page send requests to 127.0.0.1, and after a DNS
 * rebinding (attacker.example resolving to 127.0.0.1) also read the
 * answers: a victim's prompts from /v1/cache/node/..., their responses.
 * Three rules, as llama.cpp's server and Ollama learned them:
 *
 *   Host     a rebinding needs a name: a request must name an IP literal,
 *            localhost (or NAME.localhost), the name kvpin listens on,
 *            the machine's own host name, or a name --allowed-hosts adds
 *            ("*" every one; ".example.com" the domain and its
 *            subdomains); otherwise 421. A request without Host (HTTP/1.0)
 *            passes.
 *   Content-Type  a page may POST text/plain, a form or multipart without
 *            asking first; JSON endpoints take only application/json (any
 *            parameters), otherwise 415.
 *   CORS     no Access-Control-* header unless --cors-origin names the
 *            request's Origin ("*" every one); then the answer allows it
 *            and an OPTIONS preflight gets 204 with the methods and
 *            headers the APIs use.
 *
 * Every function is pure (the caller passes the lists and names).
 */
#ifndef KP_ORIGIN_H
#define KP_ORIGIN_H

#include <stdbool.h>
#include <stddef.h>

/* Whether a request whose Host header is host (NULL: none) may be
 * answered: see the top of this file. bind_host: the address or name
 * kvpin listens on (may be NULL); hostname: the machine's (may be NULL
 * or ""); allowed: the --allowed-hosts entries. */
bool kp_origin_host_allowed(const char *host, const char *bind_host, const char *hostname,
                            const char *const *allowed, size_t n_allowed);

/* Whether a Content-Type header value (NULL: none) names JSON:
 * "application/json", any case, optionally followed by parameters. */
bool kp_origin_is_json(const char *content_type);

/* The Access-Control-Allow-Origin value for a request from origin (NULL:
 * none), or NULL when --cors-origin (origins) does not name it. */
const char *kp_origin_cors(const char *origin, const char *const *origins, size_t n_origins);

/* What a preflight answer allows. */
#define KP_ORIGIN_ALLOW_METHODS "GET, POST, DELETE, OPTIONS"
#define KP_ORIGIN_ALLOW_HEADERS                                                                            \
    "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, x-request-id, "             \
    "openai-organization, openai-project, x-stainless-arch, x-stainless-lang, x-stainless-os, "             \
    "x-stainless-package-version, x-stainless-retry-count, x-stainless-runtime, "                          \
    "x-stainless-runtime-version, x-stainless-timeout, anthropic-dangerous-direct-browser-access"

#endif
