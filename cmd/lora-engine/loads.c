/* lora-engine: runtime adapter loads that finish while the engine goes on stepping.
 *
 * A load asked for on the control socket sends ADD to every rank and returns to the loop; the
 * ranks read the adapter on their loader threads while steps go on, and their replies are taken
 * wherever worker traffic is read (the loop, or a step's gather). The loop finishes a load once
 * every rank has answered: registered and answered on success, removed from every rank and
 * answered with the first error otherwise. A load that outlives LOAD_DEADLINE_MS, or whose rank
 * dies, fails the same way. Start-up and re-admission loads stay synchronous (nothing is
 * served then). */
#include "engine.h"

#include <stdio.h>
#include <string.h>

#define LOAD_DEADLINE_MS 120000 /* above the worker's own per-load deadline (60 s) */

static struct eng_load *find_op(struct engine *e, uint64_t op_id)
{
    for (int i = 0; i < ENGINE_MAX_LOADS; i++)
        if (e->loads[i].used && e->loads[i].op_id == op_id)
            return &e->loads[i];
    return NULL;
}

bool loads_pending(const struct engine *e, const char *name)
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

    if (adapters_check_new(e, name, path, err, len) < 0)
        return -1;
    for (int i = 0; i < ENGINE_MAX_LOADS && !l; i++)
        if (!e->loads[i].used)
            l = &e->loads[i];
    if (!l) {
        snprintf(err, len, "%d adapter loads are running; try again when one has finished",
                 ENGINE_MAX_LOADS);
        return -1;
    }
    memset(l, 0, sizeof(*l));
    l->op_id = ++e->next_op;
    struct lora_msg_adapter_op m = {
        .op_id = l->op_id,
        .op = LORA_OP_ADD,
        .name = {name, strlen(name)},
        .path = {path, strlen(path)},
        .slot = -1,
    };
    lora_buf_reset(&e->out);
    if (lora_msg_encode_adapter_op(&e->out, &m, NULL, NULL) < 0 ||
        workers_broadcast(e, NULL, 0) < 0) {
        snprintf(err, len, "unable to reach the workers");
        return -1;
    }
    l->used = true;
    snprintf(l->name, sizeof(l->name), "%s", name);
    snprintf(l->path, sizeof(l->path), "%s", path);
    l->deadline_ms = lora_clock_mono_ms() + LOAD_DEADLINE_MS;
    l->ctl_id = ctl_id;
    memcpy(l->rid, rid, rid_len);
    l->rid_len = rid_len;
    return 0;
}

bool loads_take_reply(struct engine *e, int r, const struct lora_msg_frames *f)
{
    struct lora_msg_adapter_op_reply rep;
    char err[256];

    if (!e->load_arena && !(e->load_arena = lora_msg_arena_new()))
        return false;
    lora_msg_arena_reset(e->load_arena);
    if (lora_msg_decode_adapter_op_reply(f->body, f->body_len, NULL, 0, e->load_arena, &rep, err,
                                         sizeof(err)) < 0)
        return false;
    struct eng_load *l = find_op(e, rep.op_id);
    if (!l || r < 0 || r >= e->world || l->replied[r])
        return l != NULL;
    l->replied[r] = true;
    l->n_replied++;
    if (!rep.ok && !l->err[0])
        snprintf(l->err, sizeof(l->err), "%.*s", (int)(rep.error.s ? rep.error.len : 7),
                 rep.error.s ? rep.error.s : "refused");
    return true;
}

/* Ends load l with why (NULL: success): answers the asker, removes it from every rank on
 * failure. */
static void finish(struct engine *e, struct eng_load *l, const char *why)
{
    char err[1024] = "";

    l->used = false; /* no longer in flight: registering checks that no load holds the name */
    if (why) {
        snprintf(err, sizeof(err), "%s", why);
    } else if (adapters_register(e, l->name, l->path, err, sizeof(err)) == 0) {
        control_reply_send(e, l->rid, l->rid_len, l->ctl_id, NULL, NULL, 0);
        return;
    }
    if (e->healthy && !e->stopping) {
        char ignore[256];
        /* Ranks that did load it must not keep it. */
        workers_adapter_op(e, LORA_OP_REMOVE, l->name, NULL, -1, ignore, sizeof(ignore));
        workers_gather_notifications(e);
    }
    control_reply_send(e, l->rid, l->rid_len, l->ctl_id, err, NULL, 0);
}

void loads_finish_ready(struct engine *e, uint64_t now_ms)
{
    for (int i = 0; i < ENGINE_MAX_LOADS; i++) {
        struct eng_load *l = &e->loads[i];
        if (!l->used)
            continue;
        if (l->n_replied == e->world) {
            finish(e, l, l->err[0] ? l->err : NULL);
        } else if (now_ms >= l->deadline_ms) {
            char why[128];
            snprintf(why, sizeof(why), "the workers did not finish loading within %d ms",
                     LOAD_DEADLINE_MS);
            finish(e, l, why);
        }
    }
}

void loads_fail_all(struct engine *e, const char *why)
{
    for (int i = 0; i < ENGINE_MAX_LOADS; i++)
        if (e->loads[i].used)
            finish(e, &e->loads[i], why);
}
