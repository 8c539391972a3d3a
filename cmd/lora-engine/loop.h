/* lora-engine loop.c: the poll loop. Calls step.c, control.c, loads.c, frontends.c, workers.c,
 * publish.c and lograte.c. */
#ifndef LORA_ENGINE_LOOP_H
#define LORA_ENGINE_LOOP_H

#include "engine.h"

/* Runs until a signal asks to stop: 0, or EXIT_SYSTEM when poll fails. */
int loop_run(struct engine *e);

#endif
