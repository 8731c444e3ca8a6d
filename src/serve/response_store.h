/*
 * response_store.h - the responses the Responses API keeps (floor 7).
 *
 * Stored responses (the Responses API's `store`, the default) are kept in
 * memory for GET and DELETE /v1/responses/{id} and previous_response_id:
 * the response object and the chat conversation it ended (its input and
 * its answer), bounded by count and bytes, least recently used dropped
 * first. Thread-safe (one mutex, held to copy).
 */
#ifndef KP_RESPONSE_STORE_H
#define KP_RESPONSE_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kp_rstore kp_rstore;

/* At most max_count responses and max_bytes bytes of them (their JSON
 * texts). KP_ENOMEM. kp_rstore_free(NULL) is a no-op. */
kp_status kp_rstore_new(kp_rstore **out, uint32_t max_count, size_t max_bytes, kp_error *err);
void kp_rstore_free(kp_rstore *s);

/* Keeps response (the object, borrowed: serialized) and conv (the chat
 * conversation, borrowed) under id, dropping the least recently used ones
 * past the bounds. false when it cannot be kept (out of memory, or alone
 * larger than max_bytes). */
bool kp_rstore_put(kp_rstore *s, const char *id, const json_t *response, const json_t *conv);

/* The stored response and/or conversation of id as new references (either
 * out may be NULL); a hit makes it the most recently used. false: none. */
bool kp_rstore_get(kp_rstore *s, const char *id, json_t **response, json_t **conv);

/* Removes id; false when there is none. */
bool kp_rstore_delete(kp_rstore *s, const char *id);

/* How many responses are kept and their bytes. */
void kp_rstore_stats(kp_rstore *s, uint32_t *count, size_t *bytes, uint32_t *max_count, size_t *max_bytes);

#endif
