/*
 * promptlog.c - the prompt log (promptlog.h): a FILE opened for appending,
 * a mutex, and two counters. A line is built with jansson (the prompt is
 * escaped as JSON, any bytes allowed) outside the lock, written and
 * flushed inside it.
 */
#include "serve/promptlog.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kp_promptlog {
    pthread_mutex_t mu;
    FILE *f;
    uint64_t lines, failed;
};

kp_status kp_promptlog_open(kp_promptlog **out, const char *path, kp_error *err) {
    *out = NULL;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return kp_fail(err, KP_EIO, "--log-prompts %s: %s", path, strerror(errno));
    kp_promptlog *l = calloc(1, sizeof *l);
    FILE *f = l ? fdopen(fd, "a") : NULL;
    if (!f || pthread_mutex_init(&l->mu, NULL)) {
        if (f) fclose(f);
        else close(fd);
        free(l);
        return kp_fail(err, KP_ENOMEM, "out of memory");
    }
    l->f = f;
    *out = l;
    return KP_OK;
}

void kp_promptlog_close(kp_promptlog *l) {
    if (!l) return;
    fclose(l->f);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

void kp_promptlog_write(kp_promptlog *l, const char *api, const char *key, const char *prompt, size_t len,
                        uint32_t prompt_tokens) {
    if (!l) return;
    json_t *j = json_pack("{s:I, s:s, s:I, s:s%}", "time", (json_int_t)time(NULL), "api", api, "prompt_tokens",
                          (json_int_t)prompt_tokens, "prompt", prompt ? prompt : "", prompt ? len : 0);
    if (j && key && *key) json_object_set_new(j, "key", json_string(key));
    char *line = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    pthread_mutex_lock(&l->mu);
    bool ok = line && fputs(line, l->f) >= 0 && fputc('\n', l->f) != EOF && fflush(l->f) == 0;
    if (ok) l->lines++;
    else l->failed++;
    pthread_mutex_unlock(&l->mu);
    free(line);
}

void kp_promptlog_counts(kp_promptlog *l, uint64_t *lines, uint64_t *failed) {
    pthread_mutex_lock(&l->mu);
    *lines = l->lines;
    *failed = l->failed;
    pthread_mutex_unlock(&l->mu);
}
