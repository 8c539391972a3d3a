/* lora-engine frontends.c: frontend peers, requests and aborts, outputs. Calls publish.c,
 * registry.c and lograte.c. */
#ifndef LORA_ENGINE_FRONTENDS_H
#define LORA_ENGINE_FRONTENDS_H

#include "engine.h"

/* One message from a frontend: hello (answered with ready and the registry), request, abort. */
void frontends_handle(struct engine *e, const struct lora_msg_frames *f);
/* Forgets frontends silent for 3 s (failing their requests), then sends the heartbeats due. */
void frontends_expire(struct engine *e);
/* The output of r's last n_new tokens to its frontend (finished: the final one). */
int frontends_send_output(struct engine *e, struct eng_request *r, int n_new, const float *lps,
                          const int32_t *top_ids, const float *top_lps, int top_n, bool finished,
                          const char *reason, const char *error);
/* Ends every request in flight with an error output and a FINISHED event (a rank died). */
void frontends_fail_all(struct engine *e, const char *why);
/* Frees r's memory and its entry (NULL: nothing). */
void frontends_release_request(struct engine *e, struct eng_request *r);

#endif
