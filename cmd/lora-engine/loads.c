/* lora-engine: runtime adapter loads that finish while the engine goes on stepping.
 *
 * A load asked for on the control socket starts ADD on every rank as an asynchronous operation
 * (workers.c) and returns to the loop; the ranks read the adapter on their loader threads while
 * steps go on, and their replies are taken wherever worker traffic is read (the loop, or a step's
 * gather). The loop finishes a load once every rank has answered: registered and answered on
 * success, removed from every rank and answered with the first error otherwise. A load that
 * outlives LOAD_DEADLINE_MS fails the same way; one whose rank dies is failed by the loop.
 * Start-up and re-admission loads stay synchronous (nothing is served then).
 *
 * Calls: adapters.c (registering), workers.c, publish.c (the answers), registry.c. */
#include <stdio.h>
#include <string.h>

#include "adapters.h"
#include "loads.h"
#include "publish.h"
#include "registry.h"
#include "workers.h"

#define LOAD_DEADLINE_MS 120000 /* above the worker's own per-load deadline (60 s) */

static bool pending(const struct engine *e, const char *name)
{
    for (int i = 0; i < ENGINE_MAX_LOADS; i++)
        if (e->loads[i].used && strcmp(e->loads[i].name, name) == 0)
            return true;
    return false;
}

int loads_begin(struct engine *e, const char *name, const char *path, const void *rid,
                size_t rid_len, uint64_t ctl_id, char *err, size_t len)
{
    struct eng_load *l = NULL;

    if (registry_check_new(e, name, path, err, len) < 0)
        return -1;
    if (pending(e, name)) {
        snprintf(err, len, "adapter '%s' is being loaded", name);
        return -1;
    }
    for (int i = 0; i < ENGINE_MAX_LOADS && !l; i++)
        if (!e->loads[i].used)
            l = &e->loads[i];
    if (!l) {
        snprintf(err, len, "%d adapter loads are running; try again when one has finished",
                 ENGINE_MAX_LOADS);
        return -1;
    }
    memset(l, 0, sizeof(*l));
    l->op_id = workers_op_start(e, LORA_OP_ADD, name, path, err, len);
    if (!l->op_id)
        return -1;
    l->used = true;
    snprintf(l->name, sizeof(l->name), "%s", name);
    snprintf(l->path, sizeof(l->path), "%s", path);
    l->deadline_ms = lora_clock_mono_ms() + LOAD_DEADLINE_MS;
    l->ctl_id = ctl_id;
    memcpy(l->rid, rid, rid_len);
    l->rid_len = rid_len;
    return 0;
}

/* Ends load l with why (NULL: success): answers the asker; on failure removes the adapter from
 * every rank unless the ranks are gone (remove false). */
static void finish(struct engine *e, struct eng_load *l, const char *why, bool remove)
{
    char err[1024] = "";

    l->used = false; /* no longer in flight: registering checks that no load holds the name */
    if (why) {
        snprintf(err, sizeof(err), "%s", why);
    } else if (adapters_register(e, l->name, l->path, err, sizeof(err)) == 0) {
        publish_control_reply(e, l->rid, l->rid_len, l->ctl_id, NULL, NULL, 0);
        return;
    }
    if (remove && e->healthy && !e->stopping) {
        char ignore[256];
        /* Ranks that did load it must not keep it. */
        workers_adapter_op(e, LORA_OP_REMOVE, l->name, NULL, -1, ignore, sizeof(ignore));
        workers_gather_notifications(e);
    }
    publish_control_reply(e, l->rid, l->rid_len, l->ctl_id, err, NULL, 0);
}

void loads_finish_ready(struct engine *e, uint64_t now_ms)
{
    char err[512];

    for (int i = 0; i < ENGINE_MAX_LOADS; i++) {
        struct eng_load *l = &e->loads[i];
        if (!l->used)
            continue;
        if (workers_op_result(e, l->op_id, err, sizeof(err))) {
            finish(e, l, err[0] ? err : NULL, true);
        } else if (now_ms >= l->deadline_ms) {
            char why[128];
            workers_op_forget(e, l->op_id);
            snprintf(why, sizeof(why), "the workers did not finish loading within %d ms",
                     LOAD_DEADLINE_MS);
            finish(e, l, why, true);
        }
    }
}

void loads_fail_all(struct engine *e, const char *why)
{
    for (int i = 0; i < ENGINE_MAX_LOADS; i++) {
        if (!e->loads[i].used)
            continue;
        workers_op_forget(e, e->loads[i].op_id);
        finish(e, &e->loads[i], why, false);
    }
}
