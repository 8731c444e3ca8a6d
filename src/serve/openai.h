/*
 * openai.h - OpenAI's chat completions and completions, as a dialect of
 * answer.h (floor 7; included by routes.c only).
 *
 *   POST /v1/chat/completions, /chat/completions   kp_openai_chat
 *   POST /v1/completions, /completions             kp_openai_completions
 *
 * The body is the common request itself (oai.h); the answer is OpenAI's
 * chat.completion / text_completion object, or its stream of chunks ending
 * with `data: [DONE]`.
 */
#ifndef KP_OPENAI_H
#define KP_OPENAI_H

#include "serve/http.h"

KP_HANDLER(kp_openai_chat);
KP_HANDLER(kp_openai_completions);

#endif
