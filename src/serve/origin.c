/*
 * origin.c - what a web page may ask of kvpin (origin.h).
 *
 * The Host value is split into name and port ("[v6]:port", "name:port",
 * "name"); the name is compared without case and without a trailing dot.
 */
#include "serve/origin.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The name part of a Host value into out (lowercase, no port, no brackets,
 * no trailing dot); *literal: it is an IP literal. false when malformed. */
static bool host_name(const char *host, char *out, size_t cap, bool *literal) {
    *literal = false;
    size_t n = strlen(host);
    if (n == 0 || n >= cap) return false;
    if (host[0] == '[') { /* an IPv6 literal, maybe with a port */
        const char *end = strchr(host, ']');
        if (!end || (end[1] && end[1] != ':')) return false;
        size_t k = (size_t)(end - host - 1);
        memcpy(out, host + 1, k);
        out[k] = 0;
        unsigned char buf[16];
        *literal = inet_pton(AF_INET6, out, buf) == 1;
        return *literal;
    }
    const char *colon = strchr(host, ':');
    if (colon && strchr(colon + 1, ':')) return false; /* a bare IPv6 address is not a Host */
    size_t k = colon ? (size_t)(colon - host) : n;
    for (size_t i = 0; i < k; i++) out[i] = (char)(host[i] >= 'A' && host[i] <= 'Z' ? host[i] + 32 : host[i]);
    while (k > 0 && out[k - 1] == '.') k--;
    out[k] = 0;
    if (k == 0) return false;
    unsigned char buf[4];
    *literal = inet_pton(AF_INET, out, buf) == 1;
    return true;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcasecmp(s + a - b, suffix);
}

bool kp_origin_host_allowed(const char *host, const char *bind_host, const char *hostname,
                            const char *const *allowed, size_t n_allowed) {
    if (!host) return true; /* HTTP/1.0 */
    char name[256];
    bool literal;
    if (!host_name(host, name, sizeof name, &literal)) return false;
    if (literal) return true; /* a rebinding needs a name */
    if (!strcmp(name, "localhost") || ends_with(name, ".localhost")) return true;
    if (bind_host && *bind_host && !strcasecmp(name, bind_host)) return true;
    if (hostname && *hostname && !strcasecmp(name, hostname)) return true;
    for (size_t i = 0; i < n_allowed; i++) {
        const char *a = allowed[i];
        if (!strcmp(a, "*") || !strcasecmp(name, a)) return true;
        if (a[0] == '.' && (ends_with(name, a) || !strcasecmp(name, a + 1))) return true;
    }
    return false;
}

bool kp_origin_is_json(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ' || *ct == '\t') ct++;
    static const char json[] = "application/json";
    size_t n = sizeof json - 1;
    if (strncasecmp(ct, json, n)) return false;
    const char *rest = ct + n;
    while (*rest == ' ' || *rest == '\t') rest++;
    return *rest == 0 || *rest == ';';
}

const char *kp_origin_cors(const char *origin, const char *const *origins, size_t n_origins) {
    if (!origin || !*origin) return NULL;
    for (size_t i = 0; i < n_origins; i++) {
        if (!strcmp(origins[i], "*")) return "*";
        if (!strcasecmp(origins[i], origin)) return origins[i];
    }
    return NULL;
}
