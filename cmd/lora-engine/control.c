/* lora-engine: the control socket (residency, config, health, stats, load, unload, pin, unpin)
 * for lora-inspect and the frontends. Replies carry their data as a msgpack map, encoded here
 * into a buffer of this file's own; the reply itself is sent by publish.c. A load is answered by
 * loads.c once every rank has loaded the adapter, an unload that waits for running requests by
 * step.c once the plan that releases it has run.
 *
 * Calls: loads.c, adapters.c, workers.c (the ranks' states), publish.c, registry.c, lograte.c. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters.h"
#include "control.h"
#include "loads.h"
#include "lograte.h"
#include "publish.h"
#include "registry.h"
#include "workers.h"

/* ---- reply data ------------------------------------------------------------------------ */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_strs(msgpack_packer *pk, const struct lora_str *v, int n)
{
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < n; i++)
        pack_str(pk, v[i].s ? v[i].s : "");
}

static void pack_residency(struct engine *e, msgpack_packer *pk)
{
    struct lora_msg_residency_reply st[ENGINE_MAX_WORLD];

    lora_msg_arena_reset(e->control_arena);
    if (workers_rank_states(e, e->control_arena, st) < 0)
        memset(st, 0, sizeof(st));
    msgpack_pack_map(pk, 4);
    pack_str(pk, "engine");
    msgpack_pack_int(pk, e->engine_index);
    pack_str(pk, "disagreement");
    msgpack_pack_int(pk, e->disagreement);
    pack_str(pk, "ranks");
    msgpack_pack_array(pk, (size_t)e->world);
    for (int r = 0; r < e->world; r++) {
        msgpack_pack_map(pk, 5);
        pack_str(pk, "rank");
        msgpack_pack_int(pk, r);
        pack_str(pk, "slots");
        pack_strs(pk, st[r].state.slots, st[r].state.n_slots);
        pack_str(pk, "cpu");
        pack_strs(pk, st[r].state.cpu, st[r].state.n_cpu);
        pack_str(pk, "pinned");
        pack_strs(pk, st[r].state.pinned, st[r].state.n_pinned);
        pack_str(pk, "dropped");
        msgpack_pack_uint64(pk, e->rank_dropped[r]);
    }
    pack_str(pk, "adapters");
    int n = 0;
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++)
        n += e->adapters[i].used;
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        const struct eng_adapter *ad = &e->adapters[i];
        struct lora_scheduler_adapter_info info = {0};
        if (!ad->used)
            continue;
        lora_scheduler_adapter_info(e->sched, ad->id, &info);
        msgpack_pack_map(pk, 7);
        pack_str(pk, "name");
        pack_str(pk, ad->name);
        pack_str(pk, "path");
        pack_str(pk, ad->path);
        pack_str(pk, "pinned");
        if (info.pinned)
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
        pack_str(pk, "slot");
        msgpack_pack_int(pk, info.slot);
        pack_str(pk, "last_used_step");
        msgpack_pack_uint64(pk, info.last_used_step);
        pack_str(pk, "running");
        msgpack_pack_int(pk, info.n_running);
        pack_str(pk, "waiting");
        msgpack_pack_int(pk, info.n_waiting);
    }
}

static void pack_config(struct engine *e, msgpack_packer *pk)
{
    const struct {
        const char *k;
        int v;
    } ints[] = {
        {"engine_index", e->engine_index},
        {"world_size", e->world},
        {"max_loras", e->max_loras},
        {"max_cpu_loras", e->max_cpu_loras},
        {"max_lora_rank", e->max_lora_rank},
        {"block_size", e->block_size},
        {"num_kv_blocks", e->num_kv_blocks},
        {"max_num_batched_tokens", e->max_num_batched_tokens},
        {"max_num_seqs", e->max_num_seqs},
        {"max_model_len", e->max_model_len},
        {"vocab_size", e->vocab_size},
        {"idle_notify_ms", e->idle_ms},
    };
    size_t n = sizeof(ints) / sizeof(ints[0]);
    const struct lora_generation_config *g = &e->gen;
    msgpack_pack_map(pk, n + 7);
    pack_str(pk, "model");
    pack_str(pk, e->model);
    pack_str(pk, "seed");
    msgpack_pack_uint64(pk, e->seed);
    for (size_t i = 0; i < n; i++) {
        pack_str(pk, ints[i].k);
        msgpack_pack_int(pk, ints[i].v);
    }
    /* The defaults a request that leaves the field out gets (nil: the server's own, that is
     * temperature 1, top_p 1, top_k off, max_tokens up to the context). */
    pack_str(pk, "generation_config");
    pack_str(pk, g->source);
    pack_str(pk, "default_temperature");
    if (g->has_temperature)
        msgpack_pack_double(pk, g->temperature);
    else
        msgpack_pack_nil(pk);
    pack_str(pk, "default_top_p");
    if (g->has_top_p)
        msgpack_pack_double(pk, g->top_p);
    else
        msgpack_pack_nil(pk);
    pack_str(pk, "default_top_k");
    if (g->has_top_k)
        msgpack_pack_int(pk, g->top_k);
    else
        msgpack_pack_nil(pk);
    pack_str(pk, "default_max_tokens");
    if (g->has_max_tokens)
        msgpack_pack_int(pk, g->max_tokens);
    else
        msgpack_pack_nil(pk);
}

/* Test hook: while the file LORA_ENGINE_TEST_UNHEALTHY_FILE names exists, health answers
 * unhealthy (and nothing else changes), so that the tests can show what the supervisor does
 * with an engine that says it is unhealthy while every process runs. */
static const char *test_unhealthy(void)
{
    const char *path = getenv("LORA_ENGINE_TEST_UNHEALTHY_FILE");
    return path && *path && access(path, F_OK) == 0 ? "LORA_ENGINE_TEST_UNHEALTHY_FILE exists"
                                                    : NULL;
}

/* Whether the engine is healthy; *why is the reason when it is not. */
static bool healthy(struct engine *e, const char **why)
{
    *why = e->healthy ? test_unhealthy() : e->unhealthy_reason;
    return !*why;
}

static void pack_health(struct engine *e, msgpack_packer *pk)
{
    const char *why;
    bool ok = healthy(e, &why);

    msgpack_pack_map(pk, 3);
    pack_str(pk, "healthy");
    if (ok)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    pack_str(pk, "reason");
    pack_str(pk, ok ? "" : why);
    pack_str(pk, "workers");
    msgpack_pack_int(pk, e->world);
}

static void pack_stats(struct engine *e, msgpack_packer *pk)
{
    msgpack_pack_map(pk, 5);
    pack_str(pk, "running");
    msgpack_pack_int(pk, lora_scheduler_n_running(e->sched));
    pack_str(pk, "waiting");
    msgpack_pack_int(pk, lora_scheduler_n_waiting(e->sched));
    pack_str(pk, "free_blocks");
    msgpack_pack_int(pk, lora_scheduler_n_free_blocks(e->sched));
    pack_str(pk, "num_kv_blocks");
    msgpack_pack_int(pk, e->num_kv_blocks);
    pack_str(pk, "num_preemptions");
    msgpack_pack_uint64(pk, e->num_preemptions);
}

void control_handle(struct engine *e, const struct lora_msg_frames *f)
{
    struct lora_msg_control m;
    char err[1024] = "";
    int rc = 0;
    struct lora_buf data = {0};
    msgpack_packer pk;

    /* Peers keep their connection alive with heartbeats (the frontends do): not an error. */
    if (lora_msg_peek_type(f->body, f->body_len, err, sizeof(err)) == LORA_MSG_HEARTBEAT)
        return;
    lora_msg_arena_reset(e->control_arena);
    if (lora_msg_decode_control(f->body, f->body_len, NULL, 0, e->control_arena, &m, err,
                                sizeof(err)) < 0) {
        lograte_warn(&e->log_ctl, "dropping a control message: %s", err);
        return;
    }
    /* The arena is reused below: keep the strings. */
    char name[ENGINE_NAME_MAX + 1] = "", path[4096] = "";
    if (m.name.s)
        snprintf(name, sizeof(name), "%s", m.name.s);
    if (m.path.s)
        snprintf(path, sizeof(path), "%s", m.path.s);
    msgpack_packer_init(&pk, &data, lora_buf_write);
    switch (m.op) {
    case LORA_CTL_RESIDENCY:
        pack_residency(e, &pk);
        break;
    case LORA_CTL_CONFIG:
        pack_config(e, &pk);
        break;
    case LORA_CTL_HEALTH: {
        const char *why;
        pack_health(e, &pk);
        rc = healthy(e, &why) ? 0 : -1;
        if (rc)
            snprintf(err, sizeof(err), "%s", why);
        break;
    }
    case LORA_CTL_STATS:
        pack_stats(e, &pk);
        break;
    case LORA_CTL_LOAD:
        if (!m.path.s) {
            snprintf(err, sizeof(err), "load needs a name and a path");
            rc = -1;
        } else if ((rc = loads_begin(e, name, path, f->rid, f->rid_len, m.id, err,
                                     sizeof(err))) == 0) {
            /* Answered when every rank has loaded it (loads.c). */
            lora_buf_release(&data);
            return;
        }
        break;
    case LORA_CTL_UNLOAD:
        rc = adapters_unload(e, name, err, sizeof(err));
        if (rc == 1) {
            /* Answered when the plan that removes it has run (step.c). */
            struct eng_adapter *ad = registry_lookup(e, name);
            if (ad) {
                ad->unload_reply_due = true;
                ad->unload_ctl_id = m.id;
                memcpy(ad->unload_rid, f->rid, f->rid_len);
                ad->unload_rid_len = f->rid_len;
                lora_buf_release(&data);
                return;
            }
            rc = 0;
        }
        break;
    case LORA_CTL_PIN:
    case LORA_CTL_UNPIN:
        rc = adapters_pin(e, name, m.op == LORA_CTL_PIN, err, sizeof(err));
        break;
    }
    publish_control_reply(e, f->rid, f->rid_len, m.id, rc ? err : NULL, data.data, data.len);
    lora_buf_release(&data);
}
