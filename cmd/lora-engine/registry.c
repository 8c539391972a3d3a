/* lora-engine: the adapter table (the one source of truth, docs/design.md, "Residency") and the
 * registry file that keeps it across restarts: lookups, new entries, the cached flag that follows
 * the ranks' gathered states, and the file written after every change. Calls no other file of the
 * engine (only the scheduler, for an adapter's state). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

bool registry_is_removing(struct engine *e, const struct eng_adapter *ad)
{
    struct lora_scheduler_adapter_info info;
    return lora_scheduler_adapter_info(e->sched, ad->id, &info) == 0 && info.removing;
}

struct eng_adapter *registry_lookup(struct engine *e, const char *name)
{
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++)
        if (e->adapters[i].used && strcmp(e->adapters[i].name, name) == 0)
            return &e->adapters[i];
    return NULL;
}

struct eng_adapter *registry_find(struct engine *e, const char *name)
{
    struct eng_adapter *ad = registry_lookup(e, name);

    /* An adapter being unloaded is gone for new requests from the moment of the call. */
    return ad && !registry_is_removing(e, ad) ? ad : NULL;
}

int registry_check_new(struct engine *e, const char *name, const char *path, char *err, size_t len)
{
    bool room = false;

    if (!*name || strlen(name) > ENGINE_NAME_MAX || strlen(path) >= sizeof(e->adapters[0].path)) {
        snprintf(err, len, "an adapter needs a name of 1 to %d bytes and a path", ENGINE_NAME_MAX);
        return -1;
    }
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        if (e->adapters[i].used && strcmp(e->adapters[i].name, name) == 0) {
            snprintf(err, len, "adapter '%s' is already loaded", name);
            return -1;
        }
        room = room || !e->adapters[i].used;
    }
    if (!room) {
        snprintf(err, len, "the registry is full (%d adapters)", ENGINE_MAX_ADAPTERS);
        return -1;
    }
    return 0;
}

struct eng_adapter *registry_add(struct engine *e, const char *name, const char *path)
{
    struct eng_adapter *ad = NULL;

    for (int i = 0; i < ENGINE_MAX_ADAPTERS && !ad; i++)
        if (!e->adapters[i].used)
            ad = &e->adapters[i];
    if (!ad)
        return NULL;
    memset(ad, 0, sizeof(*ad));
    ad->used = true;
    ad->id = (int)(ad - e->adapters) + 1;
    ad->seq = ++e->next_seq;
    snprintf(ad->name, sizeof(ad->name), "%s", name);
    snprintf(ad->path, sizeof(ad->path), "%s", path);
    return ad;
}

static bool in_list(const struct lora_str *v, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (v[i].s && strcmp(v[i].s, name) == 0)
            return true;
    return false;
}

void registry_sync_cached(struct engine *e, const struct lora_msg_residency_reply *st)
{
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        struct eng_adapter *ad = &e->adapters[i];
        if (!ad->used)
            continue;
        bool cached = true;
        for (int r = 0; r < e->world; r++)
            cached &= in_list(st[r].state.cpu, st[r].state.n_cpu, ad->name);
        if (ad->cached && !cached)
            lora_scheduler_adapter_loading(e->sched, ad->id);
        ad->cached = cached;
    }
}

static int by_seq(const void *a, const void *b)
{
    const struct eng_adapter *x = *(const struct eng_adapter *const *)a,
                             *y = *(const struct eng_adapter *const *)b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void registry_save(struct engine *e)
{
    static struct eng_adapter *order[ENGINE_MAX_ADAPTERS];
    struct lora_registry r = {0};
    char err[4400];
    int n = 0;

    if (!e->registry_path || !e->registry_live)
        return;
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++)
        if (e->adapters[i].used && !registry_is_removing(e, &e->adapters[i]))
            order[n++] = &e->adapters[i];
    qsort(order, (size_t)n, sizeof(order[0]), by_seq);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = lora_registry_file_add(&r, order[i]->name, order[i]->path, order[i]->pinned);
    for (int i = 0; i < e->startup_seen.n_startup && rc == 0; i++)
        rc = lora_registry_file_add_startup(&r, e->startup_seen.startup[i]);
    if (rc < 0)
        snprintf(err, sizeof(err), "%s: out of memory", e->registry_path);
    if (rc < 0 || lora_registry_file_write(e->registry_path, &r, err, sizeof(err)) < 0)
        fprintf(stderr, "lora-engine: error: unable to save the adapter registry: %s\n", err);
    lora_registry_file_release(&r);
}
