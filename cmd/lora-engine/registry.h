/* lora-engine registry.c: the adapter table and the registry file. Calls no other file of the
 * engine. */
#ifndef LORA_ENGINE_REGISTRY_H
#define LORA_ENGINE_REGISTRY_H

#include "engine.h"

/* The registered adapter NAME that new requests may use (not being unloaded), or NULL. */
struct eng_adapter *registry_find(struct engine *e, const char *name);
/* The registered adapter NAME, also while it is being unloaded, or NULL. */
struct eng_adapter *registry_lookup(struct engine *e, const char *name);
/* Whether the adapter is being unloaded (gone for new requests, still on the ranks). */
bool registry_is_removing(struct engine *e, const struct eng_adapter *ad);
/* Whether NAME and PATH can be registered: a valid name not taken, room left. */
int registry_check_new(struct engine *e, const char *name, const char *path, char *err, size_t len);
/* Takes a free entry for NAME and PATH (registry_check_new said yes): its id and order. */
struct eng_adapter *registry_add(struct engine *e, const char *name, const char *path);
/* Writes the registry file, when there is one and start-up is done; a failure is logged. */
void registry_save(struct engine *e);
/* Follows every rank's gathered state (st[0..world)): an adapter a rank dropped from its CPU
 * cache waits for a reload. */
void registry_sync_cached(struct engine *e, const struct lora_msg_residency_reply *st);

#endif
