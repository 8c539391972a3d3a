/* lora-engine control.c: the control socket's commands. Calls loads.c, adapters.c, workers.c,
 * publish.c, registry.c and lograte.c. */
#ifndef LORA_ENGINE_CONTROL_H
#define LORA_ENGINE_CONTROL_H

#include "engine.h"

/* One message on the control socket: answered now, or (load, an unload that waits for running
 * requests) once the work is done, by loads.c or step.c. */
void control_handle(struct engine *e, const struct lora_msg_frames *f);

#endif
