/* lora-engine step.c: one scheduled step. Calls adapters.c, frontends.c, workers.c and
 * publish.c. */
#ifndef LORA_ENGINE_STEP_H
#define LORA_ENGINE_STEP_H

#include "engine.h"

/* Requests to run, or an adapter waiting for a plan to release it, on a healthy engine. */
bool step_has_work(const struct engine *e);
/* Plans and runs one step. 0, or -1 (a dead rank is marked: workers_mark_dead). */
int step_run(struct engine *e);

#endif
