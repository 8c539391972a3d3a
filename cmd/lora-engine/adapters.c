/* lora-engine: adapter operations on every rank (docs/design.md, "Residency"): load and register,
 * activate into a slot, unload (at once, or once its running requests are done), pin and unpin, and
 * the reload of an adapter that requests wait for and no rank caches any more. Each change is
 * followed by a gather of the ranks' notifications, the registry broadcast and the registry file.
 *
 * Calls: frontends.c (the requests an unload fails), workers.c, publish.c, registry.c. */
#include <stdio.h>
#include <string.h>

#include "adapters.h"
#include "frontends.h"
#include "publish.h"
#include "registry.h"
#include "workers.h"

void adapters_reload_wanted(struct engine *e)
{
    char err[512];

    for (int i = 0; i < ENGINE_MAX_ADAPTERS && e->healthy; i++) {
        struct eng_adapter *ad = &e->adapters[i];
        struct lora_scheduler_adapter_info info;
        if (!ad->used || ad->cached || lora_scheduler_adapter_info(e->sched, ad->id, &info) < 0 ||
            info.removing || info.n_waiting == 0)
            continue;
        /* A rank that still holds it refuses the add; removing first makes every rank equal. */
        workers_adapter_op(e, LORA_OP_REMOVE, ad->name, NULL, -1, err, sizeof(err));
        if (workers_adapter_op(e, LORA_OP_ADD, ad->name, ad->path, -1, err, sizeof(err)) < 0) {
            /* It cannot come back: unregister it, which fails the requests waiting for it. */
            char name[ENGINE_NAME_MAX + 1], why[256];
            fprintf(stderr, "lora-engine: warning: reloading adapter '%s': %s\n", ad->name, err);
            snprintf(name, sizeof(name), "%s", ad->name);
            adapters_unload(e, name, why, sizeof(why));
            continue;
        }
        workers_gather_notifications(e);
        if (ad->cached)
            lora_scheduler_adapter_ready(e->sched, ad->id);
    }
}

/* Brings adapter ad into a slot as the scheduler chooses (pin, then unpin unless pinned). */
static int activate(struct engine *e, struct eng_adapter *ad, bool keep_pinned, char *err,
                    size_t len)
{
    struct lora_scheduler_activation act = {0};

    if (lora_scheduler_adapter_pin(e->sched, ad->id, &act) < 0) {
        snprintf(err, len, "no slot can be freed for adapter '%s' (all are pinned or in use)",
                 ad->name);
        return -1;
    }
    int rc = 0;
    if (act.adapter_id == ad->id && act.slot >= 0)
        rc = workers_adapter_op(e, LORA_OP_ACTIVATE, ad->name, NULL, act.slot, err, len);
    if (!keep_pinned)
        lora_scheduler_adapter_unpin(e->sched, ad->id);
    return rc;
}

int adapters_register(struct engine *e, const char *name, const char *path, char *err, size_t len)
{
    if (registry_check_new(e, name, path, err, len) < 0)
        return -1;
    struct eng_adapter *ad = registry_add(e, name, path);
    lora_scheduler_adapter_ready(e->sched, ad->id);
    char why[512];
    if (activate(e, ad, false, why, sizeof(why)) < 0)
        fprintf(stderr, "lora-engine: note: adapter '%s' stays in the CPU cache: %s\n", name, why);
    workers_gather_notifications(e);
    publish_registry(e, true);
    registry_save(e);
    return 0;
}

int adapters_load(struct engine *e, const char *name, const char *path, char *err, size_t len)
{
    if (registry_check_new(e, name, path, err, len) < 0)
        return -1;
    if (workers_adapter_op(e, LORA_OP_ADD, name, path, -1, err, len) < 0) {
        char ignore[256];
        /* Ranks that did load it must not keep it. */
        workers_adapter_op(e, LORA_OP_REMOVE, name, NULL, -1, ignore, sizeof(ignore));
        workers_gather_notifications(e);
        return -1;
    }
    return adapters_register(e, name, path, err, len);
}

int adapters_unload(struct engine *e, const char *name, char *err, size_t len)
{
    struct eng_adapter *ad = registry_find(e, name);
    uint64_t failed[256];
    bool in_use = false;
    char why[256];

    if (!ad) {
        snprintf(err, len, "adapter '%s' not found", name);
        return -1;
    }
    int n = lora_scheduler_adapter_remove(e->sched, ad->id, failed, 256, &in_use, why, sizeof(why));
    for (int i = 0; i < n; i++) {
        struct eng_request *r = &e->reqs[failed[i] % (uint64_t)e->max_requests];
        if (!r->used || r->id != failed[i])
            continue;
        r->error_code = "not_found";
        frontends_send_output(e, r, 0, NULL, NULL, NULL, 0, true, "error",
                              "the adapter was unloaded");
        publish_event(e, r, LORA_EVENT_FINISHED, "error");
        frontends_release_request(e, r);
    }
    if (!in_use) {
        if (workers_adapter_op(e, LORA_OP_REMOVE, ad->name, NULL, -1, err, len) < 0)
            return -1;
        ad->used = false;
    } else if (!ad->unloading) {
        /* A plan releases it once its running requests are done: the loop runs one then even
         * when no request is left (step_has_work), so the unload never waits for traffic. */
        ad->unloading = true;
        e->n_unloading++;
    }
    /* Otherwise a later plan lists it as unloaded once its running requests finish; it is
     * gone for new requests, and from the file, now. */
    workers_gather_notifications(e);
    publish_registry(e, true);
    registry_save(e);
    return in_use ? 1 : 0;
}

int adapters_pin(struct engine *e, const char *name, bool pin, char *err, size_t len)
{
    struct eng_adapter *ad = registry_find(e, name);

    if (!ad) {
        snprintf(err, len, "adapter '%s' not found", name);
        return -1;
    }
    int rc;
    if (pin) {
        rc = activate(e, ad, true, err, len);
        if (rc == 0)
            rc = workers_adapter_op(e, LORA_OP_PIN, name, NULL, -1, err, len);
    } else {
        lora_scheduler_adapter_unpin(e->sched, ad->id);
        rc = workers_adapter_op(e, LORA_OP_UNPIN, name, NULL, -1, err, len);
    }
    ad->pinned = pin && rc == 0;
    workers_gather_notifications(e);
    registry_save(e);
    return rc;
}
