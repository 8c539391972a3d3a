/* lora-engine loads.c: runtime adapter loads that finish while the engine steps. Calls
 * adapters.c, workers.c, publish.c and registry.c. */
#ifndef LORA_ENGINE_LOADS_H
#define LORA_ENGINE_LOADS_H

#include "engine.h"

/* Sends ADD to every rank; 0: the asker (rid, ctl_id) is answered when it finishes; -1: err. */
int loads_begin(struct engine *e, const char *name, const char *path, const void *rid,
                size_t rid_len, uint64_t ctl_id, char *err, size_t len);
/* Finishes the loads every rank has answered, and those past their deadline (the loop). */
void loads_finish_ready(struct engine *e, uint64_t now_ms);
/* Fails every load in flight with why (a rank died): the asker is answered, nothing is sent to
 * the ranks. */
void loads_fail_all(struct engine *e, const char *why);

#endif
