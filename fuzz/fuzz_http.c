/*
 * fuzz_http.c - libFuzzer target for the HTTP server: the bytes of a
 * request (head and body) sent over a loopback socket to a real kvpin
 * server running in this process (src/serve/: http.c, routes.c and everything below
 * it: libmicrohttpd's parser, kvpin's framing checks, routing, the OpenAI
 * parser, chat templates, tokenizer, scheduler, engine).
 *
 * LLVMFuzzerInitialize starts the server once on 127.0.0.1 and a free port
 * with the bundled model (models/stories260K.gguf; run from the repository
 * root), a context of 256 positions (a generation is short), a small KV
 * budget, 2 sequences, a queue of 4, --timeout 2 and --request-timeout 2.
 * Each input: connect, send the bytes, shut the sending side down, read
 * the answer until the server closes (or 10 s pass). Properties beyond
 * "no sanitizer report" (the server runs in this process, so ASan and
 * UBSan watch its threads too):
 *   - the server ends every connection within 10 s (no hang);
 *   - an answer, when there is one, starts with "HTTP/1." and a 3-digit
 *     status; a 5xx other than 501, 503 and 505 (an HTTP version the
 *     parser refuses) is a defect (the server's failure, not the client's);
 *   - every 32 inputs, GET /health still answers 200.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/threadpool.h"
#include "engine/engine.h"
#include "model/model.h"
#include "serve/chat_tmpl.h"
#include "serve/scheduler.h"
#include "serve/server.h"
#include "tok/tok.h"

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

/* The server under test, made once before the first input: the fuzzer's
 * fixture, not library state. */
static kp_model *model;
static kp_tok_vocab *vocab;
static kp_threads *pool;
static kp_engine *engine;
static kp_sched *sched;
static kp_server *server;
static uint16_t port;
static unsigned long n_inputs;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    kp_error err = {0};
    signal(SIGPIPE, SIG_IGN);
    if (kp_model_load(&model, "models/stories260K.gguf", &err) != KP_OK ||
        kp_tok_vocab_load(&vocab, model->file, &err) != KP_OK || kp_threads_new(&pool, 1, &err) != KP_OK) {
        fprintf(stderr, "fuzz_http: %s (run from the repository root)\n", err.msg);
        abort();
    }
    /* room for 4 whole contexts: 2 running sequences and what the cache keeps */
    kp_eng_config ec = {KP_DTYPE_F16, 16, 4 * 256 * kp_model_kv_bytes_per_token(&model->hp, KP_DTYPE_F16), 256, false,
                        NULL, KP_DTYPE_F16, false, 0, 0};
    kp_sched_config sc = {2, 4, 64};
    kp_server_config cfg = {0};
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.model_name = "stories260K.gguf";
    cfg.max_body = 64 * 1024;
    cfg.timeout_s = 2;
    cfg.request_timeout_s = 2;
    cfg.quiet = true;
    static kp_chat_tmpl *chat; /* the built-in chatml template, for the whole run */
    if (kp_chat_tmpl_builtin(KP_CHAT_CHATML, "<s>", "</s>", &chat, &err) != KP_OK) {
        fprintf(stderr, "fuzz_http: %s\n", err.msg);
        abort();
    }
    cfg.chat_jinja = chat;
    if (kp_eng_new(&engine, model, pool, NULL, &ec, &err) != KP_OK ||
        kp_sched_new(&sched, engine, vocab, &sc, &err) != KP_OK ||
        kp_server_new(&server, &cfg, sched, vocab, model, &err) != KP_OK) {
        fprintf(stderr, "fuzz_http: %s\n", err.msg);
        abort();
    }
    port = kp_server_port(server);
    return 0;
}

/* Sends data, half-closes, reads the answer into buf (up to cap bytes,
 * the rest drained). Returns the bytes kept, or -1 when the server did not
 * end the connection in time. */
static long exchange(const uint8_t *data, size_t size, char *buf, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return 0; /* refused (a connection limit): not a defect */
    }
    for (size_t off = 0; off < size;) {
        ssize_t k = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server closed early: it may have answered already */
        off += (size_t)k;
    }
    shutdown(fd, SHUT_WR);
    size_t got = 0;
    double deadline = now_s() + 10;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0) {
            close(fd);
            return -1;
        }
        if (poll(&p, 1, left) <= 0) continue;
        char tmp[4096];
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k <= 0) break; /* closed (or reset) */
        size_t keep = got + (size_t)k <= cap ? (size_t)k : cap - got;
        memcpy(buf + got, tmp, keep);
        got += keep;
    }
    close(fd);
    return (long)got;
}

static int status_of(const char *b, long n) {
    if (n < 12 || memcmp(b, "HTTP/1.", 7) != 0) return -1;
    if (b[8] != ' ' || b[9] < '1' || b[9] > '5' || b[10] < '0' || b[10] > '9' || b[11] < '0' || b[11] > '9')
        return -1;
    return (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char buf[1 << 16];
    long n = exchange(data, size, buf, sizeof buf);
    REQUIRE(n >= 0); /* the server hung */
    if (n > 0) {
        int st = status_of(buf, n);
        REQUIRE(st >= 100);
        REQUIRE(st < 500 || st == 501 || st == 503 || st == 505);
    }
    if (++n_inputs % 32 == 0) {
        static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        n = exchange((const uint8_t *)health, sizeof health - 1, buf, sizeof buf);
        REQUIRE(n > 0 && status_of(buf, n) == 200);
    }
    return 0;
}
