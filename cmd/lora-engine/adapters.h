/* lora-engine adapters.c: adapter operations on every rank. Calls frontends.c, workers.c,
 * publish.c and registry.c. */
#ifndef LORA_ENGINE_ADAPTERS_H
#define LORA_ENGINE_ADAPTERS_H

#include "engine.h"

/* Loads an adapter on every rank and registers it, waiting for the ranks (start-up). */
int adapters_load(struct engine *e, const char *name, const char *path, char *err, size_t len);
/* Registers an adapter every rank has loaded: scheduler, a slot when one is free, registry. */
int adapters_register(struct engine *e, const char *name, const char *path, char *err, size_t len);
/* 0 unloaded, 1 unloading once its running requests finish, -1 failed (err). */
int adapters_unload(struct engine *e, const char *name, char *err, size_t len);
int adapters_pin(struct engine *e, const char *name, bool pin, char *err, size_t len);
/* Reloads, from disk, registered adapters that requests wait for and no rank caches. */
void adapters_reload_wanted(struct engine *e);

#endif
