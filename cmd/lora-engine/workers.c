/* lora-engine: the worker group (docs/design.md, "Programs", "Wire protocol", "Backend",
 * "Residency"). Every exchange with the ranks is a broadcast followed by a gather of one reply per
 * rank, bounded by the ranks' liveness and a timeout, so a dead worker fails the exchange instead
 * of hanging the engine. Also: start-up (hellos, setup), the ranks' liveness outside of exchanges,
 * the notifications gathered from every rank, asynchronous adapter operations whose replies are
 * taken wherever worker traffic is read, and a dead rank: marked here (fail_due, for the loop),
 * replaced here when the engine can re-admit a new process for it (one rank).
 *
 * Calls: publish.c (every send), registry.c (the adapter table), lograte.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lograte.h"
#include "publish.h"
#include "registry.h"
#include "workers.h"

/* While it waits for the ranks' hellos, the engine says which it still waits for this often. */
#define WAIT_LOG_MS 3000

static int rank_of(const struct engine *e, const struct lora_msg_frames *f)
{
    for (int r = 0; r < e->world; r++)
        if (e->workers[r].present && e->workers[r].rid_len == f->rid_len &&
            memcmp(e->workers[r].rid, f->rid, f->rid_len) == 0)
            return r;
    return -1;
}

/* Any traffic from a rank counts, on its main socket or its heartbeat socket ("<id>-hb"). */
static void heard(struct engine *e, const struct lora_msg_frames *f)
{
    for (int r = 0; r < e->world; r++) {
        const struct eng_peer *w = &e->workers[r];
        bool main = w->rid_len == f->rid_len && memcmp(w->rid, f->rid, f->rid_len) == 0;
        bool beat = f->rid_len == w->rid_len + 3 && memcmp(w->rid, f->rid, w->rid_len) == 0 &&
                    memcmp(f->rid + w->rid_len, "-hb", 3) == 0;
        if (w->present && (main || beat))
            lora_liveness_heard(&e->workers[r].live, lora_clock_mono_ms());
    }
}

/* Whether a rank that died can be replaced by a new worker process without restarting the
 * engine: with one rank (several ranks share an all-reduce group a newcomer cannot join). */
static bool can_readmit(const struct engine *e)
{
    return e->world == 1;
}

void workers_mark_dead(struct engine *e, const char *why)
{
    if (!e->healthy || e->stopping)
        return;
    e->healthy = false;
    snprintf(e->unhealthy_reason, sizeof(e->unhealthy_reason), "%.200s", why);
    fprintf(stderr, "lora-engine: error: %s; the engine is unhealthy%s\n", why,
            can_readmit(e) ? " until a new worker takes the rank" : "");
    e->fail_due = true;
    snprintf(e->fail_why, sizeof(e->fail_why), "%s", e->unhealthy_reason);
}

/* Rank r went silent: it is dead, and (when the engine can re-admit) a new process may take it. */
static void rank_lost(struct engine *e, int r, char *why, size_t why_len)
{
    snprintf(why, why_len, "worker rank %d (pid %lld) is dead (silent for %d ms)", r,
             (long long)e->workers[r].pid, LORA_HEARTBEAT_DEAD_MS);
    e->workers[r].lost = true;
}

/* A broadcast that failed: the rank it could not reach (if any) is dead. Returns -1. */
static int broadcast_failed(struct engine *e, int failed)
{
    if (failed >= 0) {
        char why[128];
        snprintf(why, sizeof(why), "worker rank %d is unreachable: %s", failed, strerror(errno));
        workers_mark_dead(e, why);
    }
    return -1;
}

int workers_step(struct engine *e, const struct lora_msg_step *m)
{
    int failed;
    return publish_step(e, m, &failed) < 0 ? broadcast_failed(e, failed) : 0;
}

void workers_release(struct engine *e, struct lora_msg_frames *replies)
{
    for (int r = 0; r < e->world; r++)
        lora_msg_frames_release(&replies[r]);
}

/* ---- asynchronous operations -------------------------------------------------------------- */

static struct eng_op *find_op(struct engine *e, uint64_t op_id)
{
    for (int i = 0; i < ENGINE_MAX_LOADS; i++)
        if (e->ops[i].used && e->ops[i].op_id == op_id)
            return &e->ops[i];
    return NULL;
}

uint64_t workers_op_start(struct engine *e, enum lora_adapter_op op, const char *name,
                          const char *path, char *err, size_t err_len)
{
    struct eng_op *o = NULL;
    int failed;

    for (int i = 0; i < ENGINE_MAX_LOADS && !o; i++)
        if (!e->ops[i].used)
            o = &e->ops[i];
    if (!o) {
        snprintf(err, err_len, "%d adapter loads are running; try again when one has finished",
                 ENGINE_MAX_LOADS);
        return 0;
    }
    memset(o, 0, sizeof(*o));
    o->op_id = ++e->next_op;
    struct lora_msg_adapter_op m = {
        .op_id = o->op_id,
        .op = op,
        .name = {name, strlen(name)},
        .slot = -1,
    };
    if (path)
        m.path = (struct lora_str){path, strlen(path)};
    if (publish_adapter_op(e, &m, &failed) < 0) {
        broadcast_failed(e, failed);
        snprintf(err, err_len, "unable to reach the workers");
        return 0;
    }
    o->used = true;
    return o->op_id;
}

int workers_op_result(struct engine *e, uint64_t op_id, char *err, size_t err_len)
{
    struct eng_op *o = find_op(e, op_id);

    if (o && o->n_replied < e->world)
        return 0;
    snprintf(err, err_len, "%s", o ? o->err : "the operation is unknown");
    if (o)
        o->used = false;
    return 1;
}

void workers_op_forget(struct engine *e, uint64_t op_id)
{
    struct eng_op *o = find_op(e, op_id);
    if (o)
        o->used = false;
}

/* Takes f, a rank's reply to an asynchronous operation; false when it answers none. */
static bool take_op_reply(struct engine *e, const struct lora_msg_frames *f)
{
    struct lora_msg_adapter_op_reply rep;
    char err[256];
    int r = rank_of(e, f);

    if (r < 0 ||
        lora_msg_peek_type(f->body, f->body_len, err, sizeof(err)) != LORA_MSG_ADAPTER_OP_REPLY)
        return false;
    lora_msg_arena_reset(e->ops_arena);
    if (lora_msg_decode_adapter_op_reply(f->body, f->body_len, NULL, 0, e->ops_arena, &rep, err,
                                         sizeof(err)) < 0)
        return false;
    struct eng_op *o = find_op(e, rep.op_id);
    if (!o || o->replied[r])
        return o != NULL;
    o->replied[r] = true;
    o->n_replied++;
    if (!rep.ok && !o->err[0])
        snprintf(o->err, sizeof(o->err), "%.*s", (int)(rep.error.s ? rep.error.len : 7),
                 rep.error.s ? rep.error.s : "refused");
    return true;
}

/* ---- exchanges ---------------------------------------------------------------------------- */

static int hello(struct engine *e, const struct lora_msg_frames *f, bool in_exchange);

int workers_gather(struct engine *e, enum lora_msg_type type, struct lora_msg_frames *replies,
                   int timeout_ms, char *err, size_t err_len)
{
    bool got[ENGINE_MAX_WORLD] = {false};
    int n_got = 0;
    uint64_t deadline = lora_clock_mono_ms() + (uint64_t)timeout_ms;

    memset(replies, 0, sizeof(*replies) * (size_t)e->world);
    while (n_got < e->world) {
        uint64_t now = lora_clock_mono_ms();
        /* A signal ends the exchange: the loop, or start-up, then stops cleanly. */
        if (e->stopping || lora_signal_pipe_drain(e->sig_fd) > 0) {
            e->stopping = true;
            snprintf(err, err_len, "stopping on a signal");
            goto fail;
        }
        for (int r = 0; r < e->world; r++) {
            if (!got[r] && lora_liveness_is_dead(&e->workers[r].live, now)) {
                rank_lost(e, r, err, err_len);
                goto fail;
            }
            /* Keep the ranks we wait for from declaring us dead (the frontends too, below). */
            if (lora_liveness_should_send(&e->workers[r].live, now)) {
                publish_worker_empty(e, r, LORA_MSG_HEARTBEAT);
                lora_liveness_sent(&e->workers[r].live, now);
            }
        }
        publish_frontend_heartbeats(e);
        if (now >= deadline) {
            snprintf(err, err_len, "no %s from every worker within %d ms", lora_msg_type_name(type),
                     timeout_ms);
            goto fail;
        }
        struct lora_msg_frames f;
        char rerr[256];
        int rc = lora_sock_recv(e->work, &f, 50, rerr, sizeof(rerr));
        if (rc < 0) {
            snprintf(err, err_len, "receiving from the workers: %s", rerr);
            goto fail;
        }
        if (rc == 0)
            continue;
        heard(e, &f);
        /* A reply to an asynchronous operation is its own, even while an ADD of ours waits. */
        if (take_op_reply(e, &f)) {
            lora_msg_frames_release(&f);
            continue;
        }
        int r = rank_of(e, &f);
        int t = lora_msg_peek_type(f.body, f.body_len, rerr, sizeof(rerr));
        if (r < 0 || t != (int)type || got[r]) {
            if (t == LORA_MSG_HELLO && hello(e, &f, true) == 1) {
                snprintf(err, err_len, "a new worker process took a rank that was dead");
                lora_msg_frames_release(&f);
                goto fail;
            }
            lora_msg_frames_release(&f);
            continue;
        }
        replies[r] = f;
        got[r] = true;
        n_got++;
    }
    return 0;
fail:
    workers_release(e, replies);
    return -1;
}

/* Sends m to every rank and gathers the replies; *pending: some rank's copy goes on. */
static int adapter_op(struct engine *e, struct lora_msg_adapter_op *m, bool *pending, char *err,
                      size_t err_len)
{
    struct lora_msg_frames replies[ENGINE_MAX_WORLD];
    int failed;

    m->op_id = ++e->next_op;
    *pending = false;
    if (publish_adapter_op(e, m, &failed) < 0) {
        broadcast_failed(e, failed);
        snprintf(err, err_len, "unable to reach the workers");
        return -1;
    }
    if (workers_gather(e, LORA_MSG_ADAPTER_OP_REPLY, replies, 120000, err, err_len) < 0) {
        workers_mark_dead(e, err);
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < e->world && rc == 0; r++) {
        struct lora_msg_adapter_op_reply rep;
        char rerr[256];
        lora_msg_arena_reset(e->workers_arena);
        if (lora_msg_decode_adapter_op_reply(replies[r].body, replies[r].body_len, NULL, 0,
                                             e->workers_arena, &rep, rerr, sizeof(rerr)) < 0) {
            snprintf(err, err_len, "rank %d: %s", r, rerr);
            rc = -1;
        } else if (!rep.ok) {
            snprintf(err, err_len, "%s", rep.error.s ? rep.error.s : "refused");
            rc = -1;
        }
        *pending = *pending || rep.pending;
    }
    workers_release(e, replies);
    return rc;
}

int workers_adapter_op(struct engine *e, enum lora_adapter_op op, const char *name,
                       const char *path, int slot, char *err, size_t err_len)
{
    struct lora_msg_adapter_op m = {.op = op, .name = {name, strlen(name)}, .slot = slot};
    bool pending;

    if (path)
        m.path = (struct lora_str){path, strlen(path)};
    return adapter_op(e, &m, &pending, err, err_len);
}

int workers_activate_async(struct engine *e, const char *name, int slot, bool *pending, char *err,
                           size_t err_len)
{
    struct lora_msg_adapter_op m = {
        .op = LORA_OP_ACTIVATE, .name = {name, strlen(name)}, .slot = slot, .async = true};
    return adapter_op(e, &m, pending, err, err_len);
}

/* ---- start-up ----------------------------------------------------------------------------- */

/* Says on stderr which ranks have not said hello yet. */
static void log_missing_ranks(const struct engine *e, uint64_t waited_ms)
{
    char list[ENGINE_MAX_WORLD * 4] = "";
    size_t n = 0;
    for (int r = 0; r < e->world; r++)
        if (!e->workers[r].present)
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%d", n ? ", " : "", r);
    fprintf(stderr, "lora-engine: waiting for rank%s %s of %d (%llu s of %d s)\n",
            strchr(list, ',') ? "s" : "", list, e->world, (unsigned long long)(waited_ms / 1000),
            e->startup_timeout_ms / 1000);
}

/* Sends rank r its setup: the limits, and the KV budget with a cap on the blocks (0: none). */
static int send_setup(struct engine *e, int r, int cap, char *err, size_t err_len)
{
    struct lora_msg_setup s = {
        .model = {e->model, strlen(e->model)},
        .rank = r,
        .shm = {e->shm, strlen(e->shm)},
        .kv_cache_bytes = e->kv_cache_bytes,
        .kv_cache_fraction = e->kv_cache_fraction,
        .gpu_memory_utilization = e->gpu_memory_utilization,
    };
    publish_limits(e, &s.limits);
    s.limits.num_kv_blocks = cap;
    if (publish_setup(e, r, &s) < 0) {
        snprintf(err, err_len, "unable to send setup to rank %d", r);
        return -1;
    }
    return 0;
}

/* Answers the newcomer f, whose hello h names a rank a live worker holds, with a setup_done
 * that is not ok, and logs it. The live worker keeps the rank. */
static void refuse_hello(struct engine *e, const struct lora_msg_frames *f,
                         const struct lora_msg_hello *h)
{
    const struct eng_peer *w = &e->workers[h->rank];
    char why[256];

    snprintf(why, sizeof(why), "rank %d is taken by a live worker (pid %lld)", h->rank,
             (long long)w->pid);
    publish_setup_refusal(e, f, h->rank, why);
    lograte_warn(&e->log_hello, "refused a second worker for rank %d (pid %lld): %s", h->rank,
                 (long long)h->pid, why);
}

/* Gathers every rank's setup_done: 0, 1 stopped by a signal, 2 a rank refused, -1 failed.
 * blocks[r]: the KV blocks rank r allocated (a worker that does not say holds the cap); *async:
 * every rank copies adapters into slots alongside its steps. */
static int gather_setup_done(struct engine *e, int cap, int *blocks, bool *async, char *err,
                             size_t err_len)
{
    struct lora_msg_frames replies[ENGINE_MAX_WORLD];
    if (workers_gather(e, LORA_MSG_SETUP_DONE, replies, e->startup_timeout_ms, err, err_len) < 0)
        return e->stopping ? 1 : -1;
    int rc = 0;
    *async = true;
    for (int r = 0; r < e->world && rc == 0; r++) {
        struct lora_msg_setup_done d;
        char rerr[256];
        lora_msg_arena_reset(e->workers_arena);
        if (lora_msg_decode_setup_done(replies[r].body, replies[r].body_len, NULL, 0,
                                       e->workers_arena, &d, rerr, sizeof(rerr)) < 0) {
            snprintf(err, err_len, "rank %d: %s", r, rerr);
            rc = -1;
        } else if (!d.ok) {
            snprintf(err, err_len, "rank %d: %s", r, d.error.s ? d.error.s : "setup failed");
            rc = 2;
        } else if ((blocks[r] = d.kv_blocks > 0 ? d.kv_blocks : cap) < 1) {
            snprintf(err, err_len, "rank %d: its setup_done says no KV blocks", r);
            rc = -1;
        } else {
            *async = *async && d.async_activate;
            if (d.memory_total > 0)
                fprintf(stderr,
                        "lora-engine: rank %d: %d KV blocks; %.2f GiB of its device's %.2f GiB "
                        "free after setup%s\n",
                        r, blocks[r], d.memory_free / 1073741824.0, d.memory_total / 1073741824.0,
                        d.async_activate ? "; adapters are copied into slots alongside steps" : "");
        }
    }
    workers_release(e, replies);
    return rc;
}

/* The engine's KV blocks: the smallest count of the ranks, said when they differ. */
static void choose_kv_blocks(struct engine *e, const int *blocks)
{
    char list[ENGINE_MAX_WORLD * 12] = "";
    size_t at = 0;
    bool differ = false;

    e->num_kv_blocks = blocks[0];
    for (int r = 0; r < e->world; r++) {
        differ |= blocks[r] != blocks[0];
        if (blocks[r] < e->num_kv_blocks)
            e->num_kv_blocks = blocks[r];
        at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d", r ? ", " : "", blocks[r]);
    }
    if (differ)
        fprintf(stderr,
                "lora-engine: note: the ranks have room for %s KV blocks; the engine "
                "uses %d, the smallest\n",
                list, e->num_kv_blocks);
}

int workers_wait_setup(struct engine *e, char *err, size_t err_len)
{
    uint64_t start = lora_clock_mono_ms(), deadline = start + (uint64_t)e->startup_timeout_ms;
    uint64_t next_log = start + WAIT_LOG_MS;
    int n_present = 0;

    while (n_present < e->world) {
        uint64_t now = lora_clock_mono_ms();
        if (now >= next_log) {
            log_missing_ranks(e, now - start);
            next_log = now + WAIT_LOG_MS;
        }
        if (lora_signal_pipe_drain(e->sig_fd) > 0) {
            e->stopping = true;
            return 1;
        }
        if (lora_clock_mono_ms() >= deadline) {
            snprintf(err, err_len, "only %d of %d workers said hello within %d ms", n_present,
                     e->world, e->startup_timeout_ms);
            return -1;
        }
        struct lora_msg_frames f;
        struct lora_msg_hello h;
        char rerr[256];
        if (lora_sock_recv(e->work, &f, 100, rerr, sizeof(rerr)) != 1)
            continue;
        lora_msg_arena_reset(e->workers_arena);
        bool worker = lora_msg_decode_hello(f.body, f.body_len, NULL, 0, e->workers_arena, &h, rerr,
                                            sizeof(rerr)) == 0 &&
                      h.role == LORA_ROLE_WORKER && h.rank >= 0 && h.rank < e->world;
        if (worker && e->workers[h.rank].present && e->workers[h.rank].pid != h.pid) {
            refuse_hello(e, &f, &h);
        } else if (worker && !e->workers[h.rank].present) {
            struct eng_peer *w = &e->workers[h.rank];
            memcpy(w->rid, f.rid, f.rid_len);
            w->rid_len = f.rid_len;
            w->present = true;
            w->pid = h.pid;
            lora_liveness_init(&w->live, lora_clock_mono_ms());
            n_present++;
        }
        lora_msg_frames_release(&f);
    }
    int blocks[ENGINE_MAX_WORLD];
    for (int r = 0; r < e->world; r++)
        if (send_setup(e, r, e->kv_blocks_cap, err, err_len) < 0)
            return -1;
    int rc = gather_setup_done(e, e->kv_blocks_cap, blocks, &e->async_activate, err, err_len);
    if (rc == 0)
        choose_kv_blocks(e, blocks);
    return rc;
}

/* ---- notifications and the ranks' states -------------------------------------------------- */

/* Keeps rank r's state as the bytes of a residency_reply, for residency queries. */
static void store_state(struct engine *e, int r, const struct lora_msg_state *st)
{
    struct lora_msg_residency_reply rr = {.engine = e->engine_index, .rank = r, .state = *st};
    struct lora_buf b = {0};

    if (lora_msg_encode_residency_reply(&b, &rr, NULL, NULL) < 0) {
        lora_buf_release(&b);
        return;
    }
    free(e->rank_state[r]);
    e->rank_state[r] = b.data;
    e->rank_state_len[r] = b.len;
}

/* 2 = in a slot, 1 = CPU cache only, 0 = not held. */
static int level_of(const struct lora_msg_state *st, const char *name)
{
    for (int i = 0; i < st->n_slots; i++)
        if (st->slots[i].s && strcmp(st->slots[i].s, name) == 0)
            return 2;
    for (int i = 0; i < st->n_cpu; i++)
        if (st->cpu[i].s && strcmp(st->cpu[i].s, name) == 0)
            return 1;
    return 0;
}

int workers_rank_states(struct engine *e, struct lora_msg_arena *arena,
                        struct lora_msg_residency_reply *out)
{
    char err[256];
    for (int r = 0; r < e->world; r++) {
        memset(&out[r], 0, sizeof(out[r]));
        out[r].rank = r;
        if (e->rank_state[r] &&
            lora_msg_decode_residency_reply(e->rank_state[r], e->rank_state_len[r], NULL, 0, arena,
                                            &out[r], err, sizeof(err)) < 0)
            return -1;
    }
    return 0;
}

/* Adapters whose level differs between ranks. */
static int count_disagreement(struct engine *e, const struct lora_msg_residency_reply *st)
{
    int n = 0;

    for (int r = 0; r < e->world; r++) {
        for (int i = 0; i < st[r].state.n_cpu; i++) {
            const char *name = st[r].state.cpu[i].s;
            int lv = level_of(&st[r].state, name);
            bool seen_before = false, differs = false;
            for (int q = 0; q < r && !seen_before; q++)
                seen_before = level_of(&st[q].state, name) != 0;
            if (seen_before)
                continue; /* counted from the first rank that holds it */
            for (int q = 0; q < e->world; q++)
                differs |= level_of(&st[q].state, name) != lv;
            n += differs;
        }
    }
    return n;
}

/* Keeps rank r's load and activate timings of m while the engine is not ready yet. */
static void keep_startup_loads(struct engine *e, int r, const struct lora_msg_notifications *m)
{
    for (int i = 0; i < m->n_items && !e->ready; i++) {
        const struct lora_msg_notification *it = &m->items[i];
        for (int t = 0; t < it->n_timings; t++) {
            const struct lora_msg_timing *tm = &it->timings[t];
            if (tm->transition != LORA_TRANSITION_LOAD &&
                tm->transition != LORA_TRANSITION_ACTIVATE)
                continue;
            if (e->n_startup_loads >= 2 * ENGINE_MAX_ADAPTERS * ENGINE_MAX_WORLD)
                return;
            struct lora_msg_startup_load *v =
                realloc(e->startup_loads, sizeof(*v) * (size_t)(e->n_startup_loads + 1));
            char *name = strndup(tm->name.s ? tm->name.s : "", tm->name.len);
            if (!v || !name) {
                free(name);
                if (v)
                    e->startup_loads = v;
                return;
            }
            e->startup_loads = v;
            v[e->n_startup_loads++] = (struct lora_msg_startup_load){
                r, it->seq, {name, strlen(name)}, (int)tm->transition, tm->seconds};
        }
    }
}

int workers_gather_notifications(struct engine *e)
{
    struct lora_msg_frames replies[ENGINE_MAX_WORLD];
    struct lora_msg_residency_reply st[ENGINE_MAX_WORLD];
    char err[512];
    int failed;

    e->last_gather_ms = lora_clock_mono_ms();
    if (publish_workers_empty(e, LORA_MSG_TAKE_NOTIFICATIONS, &failed) < 0)
        return broadcast_failed(e, failed);
    if (workers_gather(e, LORA_MSG_NOTIFICATIONS, replies, 10000, err, sizeof(err)) < 0) {
        workers_mark_dead(e, err);
        return -1;
    }
    for (int r = 0; r < e->world; r++) {
        struct lora_msg_notifications m;
        lora_msg_arena_reset(e->workers_arena);
        if (lora_msg_decode_notifications(replies[r].body, replies[r].body_len, NULL, 0,
                                          e->workers_arena, &m, err, sizeof(err)) < 0) {
            fprintf(stderr, "lora-engine: warning: rank %d: %s\n", r, err);
            continue;
        }
        bool news = m.n_items > 0 || m.dropped != e->rank_dropped[r];
        e->rank_dropped[r] = m.dropped;
        if (m.n_items > 0)
            store_state(e, r, &m.items[m.n_items - 1].state);
        keep_startup_loads(e, r, &m);
        if (!news)
            continue;
        m.engine = e->engine_index;
        publish_notifications(e, &m);
    }
    workers_release(e, replies);
    lora_msg_arena_reset(e->workers_arena);
    int d = 0;
    if (workers_rank_states(e, e->workers_arena, st) == 0) {
        registry_sync_cached(e, st);
        d = count_disagreement(e, st);
    }
    if (d != e->disagreement && d > 0)
        fprintf(stderr,
                "lora-engine: warning: %d adapter%s held at different levels by the ranks\n", d,
                d == 1 ? " is" : "s are");
    e->disagreement = d;
    return 0;
}

/* ---- a dead rank and its replacement ------------------------------------------------------ */

/* Whether rank r's process is gone: declared dead, silent too long, or its connection closed
 * (a send to its routing id fails at once: the socket is ROUTER_MANDATORY). */
static bool rank_is_gone(struct engine *e, int r)
{
    struct eng_peer *w = &e->workers[r];

    if (w->lost || lora_liveness_is_dead(&w->live, lora_clock_mono_ms()))
        return true;
    return publish_worker_empty(e, r, LORA_MSG_HEARTBEAT) < 0 && errno == EHOSTUNREACH;
}

/* The names of rank r's last gathered state, copied (the arena is reused by adapter ops). */
struct rank_names {
    char (*cpu)[ENGINE_NAME_MAX + 1];
    int n_cpu;
    char (*slots)[ENGINE_NAME_MAX + 1]; /* "" for an empty slot */
    int n_slots;
    char (*pinned)[ENGINE_NAME_MAX + 1];
    int n_pinned;
};

static int copy_names(char (**dst)[ENGINE_NAME_MAX + 1], int *n, const struct lora_str *v, int nv)
{
    *dst = calloc((size_t)(nv > 0 ? nv : 1), sizeof(**dst));
    if (!*dst)
        return -1;
    for (int i = 0; i < nv; i++) {
        int n_bytes = v[i].len > ENGINE_NAME_MAX ? ENGINE_NAME_MAX : (int)v[i].len;
        snprintf((*dst)[i], sizeof((*dst)[i]), "%.*s", n_bytes, v[i].s ? v[i].s : "");
    }
    *n = nv;
    return 0;
}

static void rank_names_release(struct rank_names *n)
{
    free(n->cpu);
    free(n->slots);
    free(n->pinned);
    memset(n, 0, sizeof(*n));
}

static int rank_names_of(struct engine *e, int r, struct rank_names *out)
{
    struct lora_msg_residency_reply st[ENGINE_MAX_WORLD];

    memset(out, 0, sizeof(*out));
    lora_msg_arena_reset(e->workers_arena);
    if (workers_rank_states(e, e->workers_arena, st) < 0)
        return -1;
    const struct lora_msg_state *s = &st[r].state;
    if (copy_names(&out->cpu, &out->n_cpu, s->cpu, s->n_cpu) < 0 ||
        copy_names(&out->slots, &out->n_slots, s->slots, s->n_slots) < 0 ||
        copy_names(&out->pinned, &out->n_pinned, s->pinned, s->n_pinned) < 0) {
        rank_names_release(out);
        return -1;
    }
    return 0;
}

/* Puts back on the new process of rank r what the rank held when it was last gathered: the
 * adapters of its CPU cache, its slots and its pins, so that the scheduler's view holds again.
 * Returns the number of adapters loaded; list gets their names. */
static int restore_rank(struct engine *e, int r, char *list, size_t list_len)
{
    struct rank_names n;
    char err[512];
    int n_loaded = 0;
    size_t at = 0;

    *list = 0;
    if (rank_names_of(e, r, &n) < 0)
        return 0;
    for (int i = 0; i < n.n_cpu && e->healthy; i++) {
        struct eng_adapter *ad = registry_lookup(e, n.cpu[i]);
        if (!ad)
            continue;
        if (workers_adapter_op(e, LORA_OP_ADD, ad->name, ad->path, -1, err, sizeof(err)) < 0) {
            fprintf(stderr, "lora-engine: warning: rank %d: adapter '%s' is not restored: %s\n", r,
                    ad->name, err);
            continue;
        }
        n_loaded++;
        if (at + strlen(ad->name) + 3 < list_len)
            at += (size_t)snprintf(list + at, list_len - at, "%s%s", at ? ", " : "", ad->name);
    }
    for (int i = 0; i < n.n_slots && e->healthy; i++)
        if (n.slots[i][0] && registry_lookup(e, n.slots[i]) &&
            workers_adapter_op(e, LORA_OP_ACTIVATE, n.slots[i], NULL, i, err, sizeof(err)) < 0)
            fprintf(stderr, "lora-engine: warning: rank %d: slot %d: %s\n", r, i, err);
    for (int i = 0; i < n.n_pinned && e->healthy; i++)
        if (registry_lookup(e, n.pinned[i]) &&
            workers_adapter_op(e, LORA_OP_PIN, n.pinned[i], NULL, -1, err, sizeof(err)) < 0)
            fprintf(stderr, "lora-engine: warning: rank %d: pinning '%s': %s\n", r, n.pinned[i],
                    err);
    rank_names_release(&n);
    return n_loaded;
}

/* Sets up the newcomer in place of rank r's dead process: setup, the rank's adapters, then the
 * engine serves again. The requests in flight were failed when the rank was found dead. */
static void readmit(struct engine *e)
{
    int r = e->newcomer.rank;
    struct eng_peer *w = &e->workers[r];
    int64_t old_pid = w->pid, pid = e->newcomer.pid;
    char err[512], list[1024];
    uint64_t t0 = lora_clock_mono_ms();

    e->newcomer.due = false;
    memcpy(w->rid, e->newcomer.rid, e->newcomer.rid_len);
    w->rid_len = e->newcomer.rid_len;
    w->pid = pid;
    w->lost = false;
    lora_liveness_init(&w->live, lora_clock_mono_ms());
    /* The newcomer must hold as many KV blocks as the engine runs with: no more (the cap) and
     * no fewer. */
    /* Its activations answer as the engine's other ranks' do, or once the copy is done:
     * either way correct, so whether it copies asynchronously changes nothing here. */
    int blocks[ENGINE_MAX_WORLD];
    bool async;
    int rc = send_setup(e, r, e->num_kv_blocks, err, sizeof(err));
    if (rc == 0)
        rc = gather_setup_done(e, e->num_kv_blocks, blocks, &async, err, sizeof(err));
    if (rc != 0) {
        if (!e->stopping)
            fprintf(stderr,
                    "lora-engine: error: the new worker for rank %d (pid %lld) failed "
                    "its setup: %s\n",
                    r, (long long)pid, err);
        w->lost = true;
        return;
    }
    if (blocks[r] != e->num_kv_blocks) {
        fprintf(stderr,
                "lora-engine: error: the new worker for rank %d (pid %lld) has room for "
                "%d KV blocks, not the %d the engine runs with; it is refused and told "
                "to stop\n",
                r, (long long)pid, blocks[r], e->num_kv_blocks);
        publish_worker_empty(e, r, LORA_MSG_SHUTDOWN);
        w->lost = true;
        return;
    }
    /* The adapter ops below run only while the engine is healthy. */
    e->healthy = true;
    int n = restore_rank(e, r, list, sizeof(list));
    if (!e->healthy || workers_gather_notifications(e) < 0) {
        w->lost = true;
        return;
    }
    e->unhealthy_reason[0] = 0;
    fprintf(stderr,
            "lora-engine: rank %d is back: pid %lld took over from pid %lld in %llu ms; "
            "restored %d adapter%s%s%s; serving again\n",
            r, (long long)pid, (long long)old_pid, (unsigned long long)(lora_clock_mono_ms() - t0),
            n, n == 1 ? "" : "s", n ? ": " : "", list);
}

/* A hello outside start-up: a repeat is ignored, a newcomer for a rank held by a live worker is
 * refused (setup_done not ok, and a log line), a newcomer for a dead rank is set up in its place
 * with the registered adapters, by the next workers_poll, when the engine can re-admit it.
 * In_exchange: called while
 * gathering replies, when nothing may be set up; returns 1 when the hello ends the exchange (its
 * rank's process was replaced), else 0. */
static int hello(struct engine *e, const struct lora_msg_frames *f, bool in_exchange)
{
    struct lora_msg_hello h;
    char err[256];

    lora_msg_arena_reset(e->workers_arena);
    if (lora_msg_decode_hello(f->body, f->body_len, NULL, 0, e->workers_arena, &h, err,
                              sizeof(err)) < 0) {
        lograte_warn(&e->log_hello, "dropping a hello on the worker socket: %s", err);
        return 0;
    }
    if (h.role != LORA_ROLE_WORKER || h.rank < 0 || h.rank >= e->world) {
        lograte_warn(&e->log_hello, "dropping a hello for rank %d of %d (pid %lld)", h.rank,
                     e->world, (long long)h.pid);
        return 0;
    }
    struct eng_peer *w = &e->workers[h.rank];
    bool same_peer = w->rid_len == f->rid_len && memcmp(w->rid, f->rid, f->rid_len) == 0;
    if (same_peer && w->pid == h.pid)
        return 0; /* a repeated hello: the worker says it until the engine answers */
    if (!rank_is_gone(e, h.rank)) {
        refuse_hello(e, f, &h);
        return 0;
    }
    if (in_exchange)
        return 1; /* the exchange fails; the newcomer says hello again to the loop */
    if (!can_readmit(e)) {
        char why[160];
        snprintf(why, sizeof(why),
                 "worker rank %d (pid %lld) restarted as pid %lld; an engine "
                 "of %d ranks cannot take it back",
                 h.rank, (long long)w->pid, (long long)h.pid, e->world);
        workers_mark_dead(e, why);
        return 0;
    }
    if (e->healthy) {
        char why[128];
        snprintf(why, sizeof(why), "worker rank %d (pid %lld) was replaced by pid %lld", h.rank,
                 (long long)w->pid, (long long)h.pid);
        workers_mark_dead(e, why);
    }
    /* Set up by the next workers_poll, after the loop has failed what the rank had. */
    e->newcomer.due = true;
    e->newcomer.rank = h.rank;
    e->newcomer.pid = h.pid;
    memcpy(e->newcomer.rid, f->rid, f->rid_len);
    e->newcomer.rid_len = f->rid_len;
    return 0;
}

void workers_poll(struct engine *e)
{
    struct lora_msg_frames f;
    char err[256];

    if (e->newcomer.due)
        readmit(e);

    while (lora_sock_recv(e->work, &f, 0, err, sizeof(err)) == 1) {
        heard(e, &f);
        if (!take_op_reply(e, &f) &&
            lora_msg_peek_type(f.body, f.body_len, err, sizeof(err)) == LORA_MSG_HELLO)
            hello(e, &f, false);
        lora_msg_frames_release(&f);
    }
    uint64_t now = lora_clock_mono_ms();
    for (int r = 0; r < e->world && e->healthy; r++) {
        struct eng_peer *w = &e->workers[r];
        if (w->lost)
            continue;
        if (lora_liveness_is_dead(&w->live, now)) {
            char why[128];
            snprintf(why, sizeof(why), "worker rank %d (pid %lld) is dead (silent for %d ms)", r,
                     (long long)w->pid, LORA_HEARTBEAT_DEAD_MS);
            w->lost = true;
            workers_mark_dead(e, why);
        } else if (lora_liveness_should_send(&w->live, now)) {
            publish_worker_empty(e, r, LORA_MSG_HEARTBEAT);
        }
    }
}

void workers_stop(struct engine *e)
{
    if (!e->work || !e->healthy)
        return;
    for (int r = 0; r < e->world; r++)
        if (e->workers[r].present && publish_worker_empty(e, r, LORA_MSG_SHUTDOWN) < 0)
            fprintf(stderr, "lora-engine: warning: unable to tell rank %d to stop: %s\n", r,
                    strerror(errno));
    /* Give the shutdowns a bounded moment to leave before the socket closes: with LINGER
     * alone, a message queued just before the close was seen lost now and then. */
    int linger_ms = 500;
    zmq_setsockopt(e->work->zsock, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
    usleep(100 * 1000);
}
