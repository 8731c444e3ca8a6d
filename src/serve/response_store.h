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

typedef struct kp_response_store kp_response_store;

/* At most max_count responses and max_bytes bytes of them (their JSON
 * texts). KP_ENOMEM. kp_response_store_free(NULL) is a no-op. */
kp_status kp_response_store_new(kp_response_store **out, uint32_t max_count, size_t max_bytes, kp_error *err);
void kp_response_store_free(kp_response_store *s);

/* Keeps response (the object, borrowed: serialized) and conv (the chat
 * conversation, borrowed) under id, dropping the least recently used ones
 * past the bounds. false when it cannot be kept (out of memory, or alone
 * larger than max_bytes). */
bool kp_response_store_put(kp_response_store *s, const char *id, const json_t *response, const json_t *conv);

/* The stored response and/or conversation of id as new references (either
 * out may be NULL); a hit makes it the most recently used. false: none. */
bool kp_response_store_get(kp_response_store *s, const char *id, json_t **response, json_t **conv);

/* Removes id; false when there is none. */
bool kp_response_store_delete(kp_response_store *s, const char *id);

/* How many responses are kept and their bytes. */
void kp_response_store_stats(kp_response_store *s, uint32_t *count, size_t *bytes, uint32_t *max_count, size_t *max_bytes);

#endif
