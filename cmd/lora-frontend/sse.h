/* lora-frontend: a completions request answered as server-sent events (sse.c). */
#ifndef LORA_FRONTEND_SSE_H
#define LORA_FRONTEND_SSE_H

#include "completions.h"

/* Answers g (from completions_start, with stream set) as a stream of events: the status once
 * the engine has said its first word on every choice (an error status when it refused the
 * request), then an event per change until [DONE]. Takes g: it is freed when the answer is
 * over, its stats published once the stream ran. */
void sse_respond(struct completion *g, struct lora_http_request *req);

#endif
