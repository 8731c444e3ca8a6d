/*
 * llama.h - llama-server's native API, as a dialect of answer.h (floor 7;
 * included by routes.c only).
 *
 *   POST /completion   kp_llama_completion   llama-server's completion object
 *                                             or its stream (llama.c)
 *   GET  /props        kp_llama_props        the server's defaults, slots,
 *                                             chat template and tokens
 *   GET  /slots        kp_llama_slots        one object per sequence slot
 *
 * (/completions stays OpenAI's, as kvpin has always served it.)
 */
#ifndef KP_LLAMA_H
#define KP_LLAMA_H

#include "serve/http.h"

KP_HANDLER(kp_llama_completion);
KP_HANDLER(kp_llama_props);
KP_HANDLER(kp_llama_slots);

#endif
