/* lora-engine: the adapter registry (the one source of truth, DESIGN section 6) and the control
 * socket (residency, config, health, stats, load, unload, pin, unpin) for lora-inspect and the
 * frontends. Replies carry their data as a msgpack map. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

bool adapters_is_removing(struct engine *e, const struct eng_adapter *ad)
{
    struct lora_scheduler_adapter_info info;
    return lora_scheduler_adapter_info(e->sched, ad->id, &info) == 0 && info.removing;
}

struct eng_adapter *adapters_find(struct engine *e, const char *name)
{
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        struct eng_adapter *ad = &e->adapters[i];
        if (!ad->used || strcmp(ad->name, name) != 0)
            continue;
        /* An adapter being unloaded is gone for new requests from the moment of the call. */
        return adapters_is_removing(e, ad) ? NULL : ad;
    }
    return NULL;
}

static bool in_list(const struct lora_str *v, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (v[i].s && strcmp(v[i].s, name) == 0)
            return true;
    return false;
}

void adapters_sync_cached(struct engine *e)
{
    struct lora_msg_residency_reply st[ENGINE_MAX_WORLD];

    lora_msg_arena_reset(e->arena);
    if (engine_rank_states(e, st) < 0)
        return;
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

void adapters_reload_wanted(struct engine *e)
{
    char err[512];

    for (int i = 0; i < ENGINE_MAX_ADAPTERS && e->healthy; i++) {
        struct eng_adapter *ad = &e->adapters[i];
        struct lora_scheduler_adapter_info info;
        if (!ad->used || ad->cached ||
            lora_scheduler_adapter_info(e->sched, ad->id, &info) < 0 || info.removing ||
            info.n_waiting == 0)
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

int adapters_check_new(struct engine *e, const char *name, const char *path, char *err,
                       size_t len)
{
    bool room = false;

    if (!*name || strlen(name) > ENGINE_NAME_MAX || strlen(path) >= sizeof(e->adapters[0].path)) {
        snprintf(err, len, "an adapter needs a name of 1 to %d bytes and a path",
                 ENGINE_NAME_MAX);
        return -1;
    }
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        if (e->adapters[i].used && strcmp(e->adapters[i].name, name) == 0) {
            snprintf(err, len, "adapter '%s' is already loaded", name);
            return -1;
        }
        room = room || !e->adapters[i].used;
    }
    if (loads_pending(e, name)) {
        snprintf(err, len, "adapter '%s' is being loaded", name);
        return -1;
    }
    if (!room) {
        snprintf(err, len, "the registry is full (%d adapters)", ENGINE_MAX_ADAPTERS);
        return -1;
    }
    return 0;
}

int adapters_register(struct engine *e, const char *name, const char *path, char *err,
                      size_t len)
{
    struct eng_adapter *ad = NULL;

    if (adapters_check_new(e, name, path, err, len) < 0)
        return -1;
    for (int i = 0; i < ENGINE_MAX_ADAPTERS && !ad; i++)
        if (!e->adapters[i].used)
            ad = &e->adapters[i];
    memset(ad, 0, sizeof(*ad));
    ad->used = true;
    ad->id = (int)(ad - e->adapters) + 1;
    ad->seq = ++e->next_seq;
    snprintf(ad->name, sizeof(ad->name), "%s", name);
    snprintf(ad->path, sizeof(ad->path), "%s", path);
    lora_scheduler_adapter_ready(e->sched, ad->id);
    char why[512];
    if (activate(e, ad, false, why, sizeof(why)) < 0)
        fprintf(stderr, "lora-engine: note: adapter '%s' stays in the CPU cache: %s\n", name, why);
    workers_gather_notifications(e);
    registry_broadcast(e);
    registry_save(e);
    return 0;
}

int adapters_load(struct engine *e, const char *name, const char *path, char *err, size_t len)
{
    if (adapters_check_new(e, name, path, err, len) < 0)
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
    struct eng_adapter *ad = adapters_find(e, name);
    uint64_t failed[256];
    bool in_use = false;
    char why[256];

    if (!ad) {
        snprintf(err, len, "adapter '%s' not found", name);
        return -1;
    }
    int n = lora_scheduler_adapter_remove(e->sched, ad->id, failed, 256, &in_use, why,
                                          sizeof(why));
    for (int i = 0; i < n; i++) {
        struct eng_request *r = &e->reqs[failed[i] % (uint64_t)e->max_requests];
        if (!r->used || r->id != failed[i])
            continue;
        r->error_code = "not_found";
        frontends_send_output(e, r, 0, NULL, NULL, NULL, 0, true, "error",
                              "the adapter was unloaded");
        publish_event(e, r, LORA_EVENT_FINISHED, "error");
        request_release(e, r);
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
    registry_broadcast(e);
    registry_save(e);
    return in_use ? 1 : 0;
}

int adapters_pin(struct engine *e, const char *name, bool pin, char *err, size_t len)
{
    struct eng_adapter *ad = adapters_find(e, name);

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
        if (e->adapters[i].used && !adapters_is_removing(e, &e->adapters[i]))
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

    lora_msg_arena_reset(e->arena);
    if (engine_rank_states(e, st) < 0)
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

int control_handle(struct engine *e, const struct lora_msg_frames *f)
{
    struct lora_msg_control m;
    char err[1024] = "";
    int rc = 0;
    struct lora_buf data = {0};
    msgpack_packer pk;

    /* Peers keep their connection alive with heartbeats (the frontends do): not an error. */
    if (lora_msg_peek_type(f->body, f->body_len, err, sizeof(err)) == LORA_MSG_HEARTBEAT)
        return 0;
    lora_msg_arena_reset(e->arena);
    if (lora_msg_decode_control(f->body, f->body_len, NULL, 0, e->arena, &m, err, sizeof(err)) <
        0) {
        lograte_warn(&e->log_ctl, "dropping a control message: %s", err);
        return 0;
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
            return 0;
        }
        break;
    case LORA_CTL_UNLOAD:
        rc = adapters_unload(e, name, err, sizeof(err));
        if (rc == 1) {
            /* Answered when the plan that removes it has run (step.c). */
            struct eng_adapter *ad = NULL;
            for (int i = 0; i < ENGINE_MAX_ADAPTERS && !ad; i++)
                if (e->adapters[i].used && strcmp(e->adapters[i].name, name) == 0)
                    ad = &e->adapters[i];
            if (ad) {
                ad->unload_reply_due = true;
                ad->unload_ctl_id = m.id;
                memcpy(ad->unload_rid, f->rid, f->rid_len);
                ad->unload_rid_len = f->rid_len;
                lora_buf_release(&data);
                return 0;
            }
            rc = 0;
        }
        break;
    case LORA_CTL_PIN:
    case LORA_CTL_UNPIN:
        rc = adapters_pin(e, name, m.op == LORA_CTL_PIN, err, sizeof(err));
        break;
    }
    control_reply_send(e, f->rid, f->rid_len, m.id, rc ? err : NULL, data.data, data.len);
    lora_buf_release(&data);
    return 0;
}

void control_reply_send(struct engine *e, const void *rid, size_t rid_len, uint64_t id,
                        const char *err, const void *data, size_t data_len)
{
    struct lora_msg_control_reply r = {.id = id, .ok = err == NULL};
    if (err)
        r.error = (struct lora_str){err, strlen(err)};
    if (data_len) {
        r.data = data;
        r.data_len = data_len;
    }
    lora_buf_reset(&e->out);
    if (lora_msg_encode_control_reply(&e->out, &r, NULL, NULL) == 0)
        lora_sock_send(e->ctl, rid, rid_len, NULL, e->out.data, e->out.len, NULL, 0,
                       ZMQ_DONTWAIT);
}
