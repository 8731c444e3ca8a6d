/*
 * test_origin.c - what a web page may ask of kvpin (serve/origin.h).
 *
 * The expected answers are the rules of origin.h, which are those of the
 * DNS-rebinding defences of llama.cpp's server and Ollama: a Host naming
 * an IP literal or a loopback name passes, a domain of the attacker's does
 * not (the rebinding case); a POST body a page may send without a CORS
 * preflight (text/plain, forms, multipart: the Fetch standard's
 * "CORS-safelisted request-header" content types) is not JSON; CORS only
 * for the origins named.
 */
#include <stdbool.h>
#include <string.h>

#include "harness.h"
#include "serve/origin.h"

static void test_hosts(void) {
    const char *none[1] = {NULL};
    struct {
        const char *host;
        bool ok;
    } cases[] = {
        {NULL, true},                     /* HTTP/1.0 */
        {"127.0.0.1", true},
        {"127.0.0.1:8080", true},
        {"10.1.2.3:80", true},            /* any IP literal: a rebinding needs a name */
        {"[::1]:8080", true},
        {"[::1]", true},
        {"localhost", true},
        {"LOCALHOST:8080", true},
        {"localhost.:8080", true},        /* the trailing dot of a fully qualified name */
        {"app.localhost:3000", true},
        {"attacker.example", false},
        {"attacker.example:8080", false},
        {"localhost.attacker.example", false},
        {"127.0.0.1.nip.io", false},
        {"", false},
        {":8080", false},
        {"[::1", false},
        {"::1", false},                   /* an IPv6 address without brackets is no Host */
        {"[not-an-ip]:80", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK_MSG(kp_origin_host_allowed(cases[i].host, "127.0.0.1", "buildbox", none, 0) == cases[i].ok,
                  "Host %s", cases[i].host ? cases[i].host : "(none)");
    /* the --host name and the machine's name */
    CHECK(kp_origin_host_allowed("kvpin.lan:8080", "kvpin.lan", "buildbox", none, 0));
    CHECK(kp_origin_host_allowed("BuildBox", "127.0.0.1", "buildbox", none, 0));
    CHECK(!kp_origin_host_allowed("buildbox", "127.0.0.1", "", none, 0));
    /* --allowed-hosts */
    const char *allow[] = {"api.example.com", ".corp.example"};
    CHECK(kp_origin_host_allowed("API.example.com:443", NULL, NULL, allow, 2));
    CHECK(kp_origin_host_allowed("corp.example", NULL, NULL, allow, 2));
    CHECK(kp_origin_host_allowed("gpu1.corp.example", NULL, NULL, allow, 2));
    CHECK(!kp_origin_host_allowed("example.com", NULL, NULL, allow, 2));
    CHECK(!kp_origin_host_allowed("evilcorp.example", NULL, NULL, allow, 2));
    const char *any[] = {"*"};
    CHECK(kp_origin_host_allowed("anything.example", NULL, NULL, any, 1));
}

static void test_json_type(void) {
    CHECK(kp_origin_is_json("application/json"));
    CHECK(kp_origin_is_json("Application/JSON; charset=utf-8"));
    CHECK(kp_origin_is_json(" application/json ;charset=UTF-8"));
    CHECK(!kp_origin_is_json(NULL));
    CHECK(!kp_origin_is_json(""));
    CHECK(!kp_origin_is_json("text/plain"));
    CHECK(!kp_origin_is_json("text/plain; a=application/json"));
    CHECK(!kp_origin_is_json("application/x-www-form-urlencoded"));
    CHECK(!kp_origin_is_json("multipart/form-data; boundary=x"));
    CHECK(!kp_origin_is_json("application/jsonp"));
    CHECK(!kp_origin_is_json("application/json-patch+json"));
}

static void test_cors(void) {
    const char *one[] = {"https://app.example"};
    CHECK(kp_origin_cors(NULL, one, 1) == NULL);
    CHECK(kp_origin_cors("https://evil.example", one, 1) == NULL);
    CHECK(kp_origin_cors("https://app.example", NULL, 0) == NULL);
    const char *o = kp_origin_cors("https://app.example", one, 1);
    CHECK(o && !strcmp(o, "https://app.example"));
    CHECK(kp_origin_cors("https://app.example.evil", one, 1) == NULL);
    const char *any[] = {"*"};
    o = kp_origin_cors("https://whatever.example", any, 1);
    CHECK(o && !strcmp(o, "*"));
}

int main(void) {
    RUN(test_hosts);
    RUN(test_json_type);
    RUN(test_cors);
    return harness_finish("origin");
}
