/*
 * fuzz_agent.c - libFuzzer target for the agent APIs' translations: a
 * Messages API body (anthropic.h) or a Responses API body (responses.h)
 * as a client sends it, then the chat-completions body it becomes through
 * the OpenAI parser and every chat template.
 *
 * Input layout:  byte 0  bit 0: a Responses body (else Messages)
 *                        bit 1: count_tokens (Messages) / strict
 *                        bits 2-5: which chat family (modulo the count)
 *                rest    the body (any bytes; fuzz/seeds-agent/ holds real
 *                        request bodies, which libFuzzer mutates)
 *
 * Properties beyond "no sanitizer report": a refusal is a 4xx or 5xx with
 * a message and leaves the request empty; a translated body is a JSON
 * object with messages, at most KP_ANTH_MAX_BREAKS breakpoints each with
 * messages and a TTL of 300 or 3600 s; the chat parser either takes the
 * translated body or refuses it with a message; a rendering of the
 * translated messages (and of every breakpoint's) by the family's built-in
 * template is NUL-terminated text
 * of the returned length; a stored conversation after a made-up answer is
 * one message longer.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/anthropic.h"
#include "serve/chat.h"
#include "serve/chat_tmpl.h"
#include "serve/oai.h"
#include "serve/responses.h"

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

static void render(kp_chat_family fam, const json_t *messages, const json_t *tools) {
    kp_chat_opts o = {true, false};
    char *out = NULL;
    size_t n = 0;
    kp_error err = {0};
    if (kp_chat_tmpl_render(builtin(fam), messages, tools, &o, NULL, &out, &n, NULL, NULL, &err) == KP_OK) {
        REQUIRE(out != NULL && out[n] == 0);
        free(out);
    } else {
        REQUIRE(out == NULL && err.msg[0]);
    }
}

/* The translated body through the chat parser, and its rendering. */
static void chat_body(kp_chat_family fam, const json_t *chat) {
    REQUIRE(json_is_object(chat) && json_is_array(json_object_get(chat, "messages")));
    char *text = json_dumps(chat, JSON_COMPACT);
    if (!text) return;
    kp_oai_request q;
    kp_oai_error e;
    memset(&e, 0, sizeof e);
    if (kp_oai_parse(text, strlen(text), true, &q, &e)) {
        render(fam, q.messages, q.tools);
        kp_oai_request_free(&q);
    } else {
        REQUIRE(e.http >= 400 && e.http < 600 && e.message[0]);
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool responses = data[0] & 1, flag = data[0] & 2;
    kp_chat_family fam = (kp_chat_family)(1 + (data[0] >> 2) % (KP_CHAT_FAMILY_COUNT - 1));
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    kp_oai_error e;
    memset(&e, 0, sizeof e);
    if (!responses) {
        kp_anth_request r;
        if (!kp_anth_translate(body, len, flag, false, &r, &e)) {
            REQUIRE(e.http >= 400 && e.http < 600 && e.message[0]);
            REQUIRE(r.chat == NULL && r.n_br == 0);
            const char *type;
            int st = kp_anth_error_status(e.http, &type);
            REQUIRE(st >= 400 && type != NULL);
            return 0;
        }
        REQUIRE(r.n_br >= 0 && r.n_br <= KP_ANTH_MAX_BREAKS);
        for (int i = 0; i < r.n_br; i++) {
            REQUIRE(json_is_array(r.br[i].messages));
            REQUIRE(r.br[i].ttl_s == 300 || r.br[i].ttl_s == 3600);
            render(fam, r.br[i].messages, r.br[i].tools);
        }
        chat_body(fam, r.chat);
        kp_anth_request_free(&r);
        return 0;
    }
    kp_resp_request r;
    if (!kp_resp_translate(body, len, NULL, flag, &r, &e)) {
        REQUIRE(e.http >= 400 && e.http < 600 && e.message[0]);
        REQUIRE(r.chat == NULL && r.root == NULL);
        return 0;
    }
    chat_body(fam, r.chat);
    json_t *after = kp_resp_conv_after(&r, "ok", 2, NULL);
    REQUIRE(json_array_size(after) == json_array_size(r.conv) + 1);
    json_decref(after);
    kp_resp_request_free(&r);
    return 0;
}
