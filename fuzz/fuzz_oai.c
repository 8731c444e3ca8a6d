/*
 * fuzz_oai.c - libFuzzer target for the OpenAI request parser and the chat
 * layer: a request body as a client sends it, then every chat template.
 *
 * Input layout:  byte 0  bit 0: /v1/chat/completions (else /v1/completions)
 *                        bits 1-4: which chat family (modulo the count)
 *                rest    the body (any bytes; the corpus holds real request
 *                        bodies, fuzz/corpus-oai/, which libFuzzer mutates)
 *
 * Per input: kp_oai_parse; for a parsed chat request, the family's built-in
 * template (chat_tmpl.h) renders its messages and tools (with and without the generation
 * prompt); then kp_chat_parse_tool_calls and kp_chat_tool_holdback on the
 * body's bytes as if a model had written them. Properties beyond "no
 * sanitizer report": a refusal gives HTTP 400 with a message; a parsed
 * request satisfies what the parser promises (max_tokens set, at most
 * KP_OAI_MAX_STOPS stops, sampler parameters accepted by kp_sampler_check);
 * a rendering is NUL-terminated text of the returned length; the holdback
 * offset of growing prefixes of the text never decreases and never passes
 * the content length the parser returns for the whole text (chat.h's
 * guarantee).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "serve/chat.h"
#include "serve/chat_tmpl.h"
#include "serve/oai.h"

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) __builtin_trap();                                                    \
    } while (0)

/* The family's built-in template, compiled once per process (reachable
 * until exit). */
static const kp_chat_tmpl *builtin(kp_chat_family fam) {
    static kp_chat_tmpl *compiled[KP_CHAT_FAMILY_COUNT];
    kp_error err = {0};
    if (!compiled[fam]) REQUIRE(kp_chat_tmpl_builtin(fam, "<s>", "</s>", &compiled[fam], &err) == KP_OK);
    return compiled[fam];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    kp_chat_family fam = (kp_chat_family)(1 + (data[0] >> 1) % (KP_CHAT_FAMILY_COUNT - 1));
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    kp_oai_request q;
    kp_oai_error e;
    memset(&e, 0, sizeof e);
    if (!kp_oai_parse(body, len, chat, &q, &e)) {
        REQUIRE(e.http >= 400 && e.http < 600 && e.message[0]);
    } else {
        kp_error err = {0};
        REQUIRE(q.n_stops >= 0 && q.n_stops <= KP_OAI_MAX_STOPS);
        REQUIRE(kp_sampler_check(&q.sp, &err) == KP_OK);
        if (chat && q.messages) {
            for (int gen = 0; gen < 2; gen++) {
                kp_chat_opts o = {gen == 1, false};
                char *out = NULL;
                size_t n = 0;
                if (kp_chat_tmpl_render(builtin(fam), q.messages, q.tools, &o, NULL, &out, &n, NULL, NULL, &err) ==
                    KP_OK) {
                    REQUIRE(out != NULL && out[n] == 0);
                    free(out);
                } else {
                    REQUIRE(out == NULL && err.msg[0]);
                }
            }
        }
        kp_oai_request_free(&q);
    }
    json_t *calls = NULL;
    size_t content_len = 0;
    kp_error err = {0};
    if (kp_chat_parse_tool_calls(fam, body, len, 7, &calls, &content_len, &err) == KP_OK) {
        REQUIRE(content_len <= len);
        REQUIRE(calls == NULL || json_is_array(calls));
        /* the offset for growing prefixes of the text never decreases and
         * never passes the final content length */
        size_t prev = 0;
        for (int k = 1; k <= 8; k++) {
            size_t pl = len * (size_t)k / 8;
            size_t hold = kp_chat_tool_holdback(fam, body, pl);
            REQUIRE(hold <= pl && hold >= prev && hold <= content_len);
            prev = hold;
        }
        json_decref(calls);
    }
    return 0;
}
