/*
 * embed.h - OpenAI's embeddings API over the loaded model (floor 7;
 * included by routes.c only): embed.c's head comment has the request, the
 * pooling and the answer.
 *
 *   POST /v1/embeddings, /embeddings   kp_embeddings
 */
#ifndef KP_EMBED_H
#define KP_EMBED_H

#include "serve/http.h"

KP_HANDLER(kp_embeddings);

#endif
