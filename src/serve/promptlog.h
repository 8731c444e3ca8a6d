/*
 * promptlog.h - the prompts a server computed, one JSON line each
 * (`kvpin serve --log-prompts FILE`; floor 7).
 *
 * Each generation request appends, once its prompt is tokenized:
 *
 *   {"time": 1764903000, "api": "chat", "key": "agent-7", "prompt_tokens": 812,
 *    "prompt": "<|im_start|>system\n..."}
 *
 * (api: "chat", "completions", "messages", "responses", "completion" for
 * llama-server's; key: the prompt_cache_key, when there is one; prompt:
 * the rendered text the model read, before tokenization.) That is the
 * format `kvpin doctor FILE` reads, so a server's log explains its own
 * misses offline. The file holds what clients sent: keep it as private as
 * the conversations.
 *
 * Lines are written whole under a mutex (appends from any thread) and
 * flushed; a failed write is counted, never fatal.
 */
#ifndef KP_PROMPTLOG_H
#define KP_PROMPTLOG_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kp_promptlog kp_promptlog;

/* Opens path for appending (created 0600 when absent). KP_EIO naming the
 * path and the reason, KP_ENOMEM. */
kp_status kp_promptlog_open(kp_promptlog **out, const char *path, kp_error *err);
void kp_promptlog_close(kp_promptlog *l); /* NULL is a no-op */

/* Appends one line (key may be NULL). */
void kp_promptlog_write(kp_promptlog *l, const char *api, const char *key, const char *prompt, size_t len,
                        uint32_t prompt_tokens);

/* Lines written, and writes that failed. */
void kp_promptlog_counts(kp_promptlog *l, uint64_t *lines, uint64_t *failed);

#endif
