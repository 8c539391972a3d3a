/* lora-engine: the worker group (DESIGN sections 2 to 7). Every exchange with the ranks is a
 * broadcast followed by a gather of one reply per rank, bounded by the ranks' liveness and a
 * timeout, so a dead worker fails the exchange instead of hanging the engine. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

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
void workers_heard(struct engine *e, const struct lora_msg_frames *f)
{
    for (int r = 0; r < e->world; r++) {
        const struct eng_peer *w = &e->workers[r];
        bool main = w->rid_len == f->rid_len && memcmp(w->rid, f->rid, f->rid_len) == 0;
        bool beat = f->rid_len == w->rid_len + 3 && memcmp(w->rid, f->rid, w->rid_len) == 0 &&
                    memcmp(f->rid + w->rid_len, "-hb", 3) == 0;
        if (w->present && (main || beat))
            lora_liveness_heard(&e->workers[r].live, lora_now_ms());
    }
}

bool workers_restarted(struct engine *e, const struct lora_msg_frames *f)
{
    struct lora_msg_hello h;
    char err[256];
    int r = rank_of(e, f);

    if (r < 0 || lora_msg_peek_type(f->body, f->body_len, err, sizeof(err)) != LORA_MSG_HELLO)
        return false;
    lora_msg_arena_reset(e->arena);
    if (lora_msg_decode_hello(f->body, f->body_len, NULL, 0, e->arena, &h, err, sizeof(err)) < 0)
        return false;
    return h.pid != e->workers[r].pid;
}

void workers_mark_dead(struct engine *e, const char *why)
{
    if (!e->healthy || e->stopping)
        return;
    e->healthy = false;
    snprintf(e->unhealthy_reason, sizeof(e->unhealthy_reason), "%.200s", why);
    fprintf(stderr, "lora-engine: error: %s; the engine is unhealthy\n", why);
    requests_fail_all(e, why);
}

int workers_broadcast(struct engine *e, const struct lora_msg_bin *bins, int n_bins)
{
    struct lora_frame frames[LORA_SOCK_MAX_BINS];

    for (int i = 0; i < n_bins; i++)
        frames[i] = (struct lora_frame){bins[i].data, bins[i].len};
    for (int r = 0; r < e->world; r++) {
        struct eng_peer *w = &e->workers[r];
        if (lora_sock_send(e->work, w->rid, w->rid_len, NULL, e->out.data, e->out.len, frames,
                           n_bins, ZMQ_DONTWAIT) < 0) {
            char why[128];
            snprintf(why, sizeof(why), "worker rank %d is unreachable: %s", r, strerror(errno));
            workers_mark_dead(e, why);
            return -1;
        }
        lora_liveness_sent(&w->live, lora_now_ms());
    }
    return 0;
}

void workers_release(struct engine *e, struct lora_msg_frames *replies)
{
    for (int r = 0; r < e->world; r++)
        lora_msg_frames_release(&replies[r]);
}

/* Reads the "rank" of a reply without decoding the whole message. */
static int reply_rank(struct engine *e, const struct lora_msg_frames *f)
{
    return rank_of(e, f);
}

int workers_gather(struct engine *e, enum lora_msg_type type, struct lora_msg_frames *replies,
                   int timeout_ms, char *err, size_t err_len)
{
    bool got[ENGINE_MAX_WORLD] = {false};
    int n_got = 0;
    uint64_t deadline = lora_now_ms() + (uint64_t)timeout_ms;

    memset(replies, 0, sizeof(*replies) * (size_t)e->world);
    while (n_got < e->world) {
        uint64_t now = lora_now_ms();
        /* A signal ends the exchange: the loop, or start-up, then stops cleanly. */
        if (e->stopping || lora_signal_pipe_drain(e->sig_fd) > 0) {
            e->stopping = true;
            snprintf(err, err_len, "stopping on a signal");
            goto fail;
        }
        for (int r = 0; r < e->world; r++) {
            if (!got[r] && lora_liveness_is_dead(&e->workers[r].live, now)) {
                snprintf(err, err_len, "worker rank %d is dead (silent for %d ms)", r,
                         LORA_HEARTBEAT_DEAD_MS);
                goto fail;
            }
            /* Keep the ranks we wait for from declaring us dead (the frontends too, below). */
            if (lora_liveness_should_send(&e->workers[r].live, now)) {
                struct lora_msg_buf hb = {0};
                if (lora_msg_encode_empty(&hb, LORA_MSG_HEARTBEAT) == 0)
                    lora_sock_send(e->work, e->workers[r].rid, e->workers[r].rid_len, NULL,
                                   hb.data, hb.len, NULL, 0, ZMQ_DONTWAIT);
                lora_msg_buf_release(&hb);
                lora_liveness_sent(&e->workers[r].live, now);
            }
        }
        frontends_send_heartbeats(e);
        if (now >= deadline) {
            snprintf(err, err_len, "no %s from every worker within %d ms",
                     lora_msg_type_name(type), timeout_ms);
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
        workers_heard(e, &f);
        int r = reply_rank(e, &f);
        int t = lora_msg_peek_type(f.body, f.body_len, rerr, sizeof(rerr));
        if (r < 0 || t != (int)type || got[r]) {
            if (workers_restarted(e, &f)) {
                snprintf(err, err_len, "worker rank %d restarted", r);
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

/* Waits for every rank's hello, sends setup and waits for setup_done from all. Returns 0, 1 when
 * a signal asked to stop meanwhile, 2 when a rank could not load the model, or -1 with err. */
int workers_wait_setup(struct engine *e, char *err, size_t err_len)
{
    uint64_t start = lora_now_ms(), deadline = start + (uint64_t)e->startup_timeout_ms;
    uint64_t next_log = start + WAIT_LOG_MS;
    int n_present = 0;

    while (n_present < e->world) {
        uint64_t now = lora_now_ms();
        if (now >= next_log) {
            log_missing_ranks(e, now - start);
            next_log = now + WAIT_LOG_MS;
        }
        if (lora_signal_pipe_drain(e->sig_fd) > 0) {
            e->stopping = true;
            return 1;
        }
        if (lora_now_ms() >= deadline) {
            snprintf(err, err_len, "only %d of %d workers said hello within %d ms", n_present,
                     e->world, e->startup_timeout_ms);
            return -1;
        }
        struct lora_msg_frames f;
        struct lora_msg_hello h;
        char rerr[256];
        if (lora_sock_recv(e->work, &f, 100, rerr, sizeof(rerr)) != 1)
            continue;
        lora_msg_arena_reset(e->arena);
        if (lora_msg_decode_hello(f.body, f.body_len, NULL, 0, e->arena, &h, rerr,
                                  sizeof(rerr)) == 0 &&
            h.role == LORA_ROLE_WORKER && h.rank >= 0 && h.rank < e->world &&
            !e->workers[h.rank].present) {
            struct eng_peer *w = &e->workers[h.rank];
            memcpy(w->rid, f.rid, f.rid_len);
            w->rid_len = f.rid_len;
            w->present = true;
            w->pid = h.pid;
            lora_liveness_init(&w->live, lora_now_ms());
            n_present++;
        }
        lora_msg_frames_release(&f);
    }
    for (int r = 0; r < e->world; r++) {
        struct lora_msg_setup s = {
            .model = {e->model, strlen(e->model)},
            .rank = r,
            .shm = {e->shm, strlen(e->shm)},
        };
        engine_limits(e, &s.limits);
        lora_msg_buf_reset(&e->out);
        if (lora_msg_encode_setup(&e->out, &s, NULL, NULL) < 0 ||
            lora_sock_send(e->work, e->workers[r].rid, e->workers[r].rid_len, NULL, e->out.data,
                           e->out.len, NULL, 0, ZMQ_DONTWAIT) < 0) {
            snprintf(err, err_len, "unable to send setup to rank %d", r);
            return -1;
        }
    }
    struct lora_msg_frames replies[ENGINE_MAX_WORLD];
    if (workers_gather(e, LORA_MSG_SETUP_DONE, replies, e->startup_timeout_ms, err, err_len) < 0)
        return e->stopping ? 1 : -1;
    int rc = 0;
    for (int r = 0; r < e->world && rc == 0; r++) {
        struct lora_msg_setup_done d;
        char rerr[256];
        lora_msg_arena_reset(e->arena);
        if (lora_msg_decode_setup_done(replies[r].body, replies[r].body_len, NULL, 0, e->arena,
                                       &d, rerr, sizeof(rerr)) < 0) {
            snprintf(err, err_len, "rank %d: %s", r, rerr);
            rc = -1;
        } else if (!d.ok) {
            snprintf(err, err_len, "rank %d: %s", r, d.error.s ? d.error.s : "setup failed");
            rc = 2;
        }
    }
    workers_release(e, replies);
    return rc;
}

int workers_adapter_op(struct engine *e, enum lora_adapter_op op, const char *name,
                       const char *path, int slot, char *err, size_t err_len)
{
    struct lora_msg_adapter_op m = {
        .op_id = ++e->next_op,
        .op = op,
        .name = {name, strlen(name)},
        .slot = slot,
    };
    struct lora_msg_frames replies[ENGINE_MAX_WORLD];

    if (path)
        m.path = (struct lora_str){path, strlen(path)};
    lora_msg_buf_reset(&e->out);
    if (lora_msg_encode_adapter_op(&e->out, &m, NULL, NULL) < 0 ||
        workers_broadcast(e, NULL, 0) < 0) {
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
        lora_msg_arena_reset(e->arena);
        if (lora_msg_decode_adapter_op_reply(replies[r].body, replies[r].body_len, NULL, 0,
                                             e->arena, &rep, rerr, sizeof(rerr)) < 0) {
            snprintf(err, err_len, "rank %d: %s", r, rerr);
            rc = -1;
        } else if (!rep.ok) {
            snprintf(err, err_len, "%s", rep.error.s ? rep.error.s : "refused");
            rc = -1;
        }
    }
    workers_release(e, replies);
    return rc;
}

/* Keeps rank r's state as the bytes of a residency_reply, for residency queries. */
static void store_state(struct engine *e, int r, const struct lora_msg_state *st)
{
    struct lora_msg_residency_reply rr = {.engine = e->engine_index, .rank = r, .state = *st};
    struct lora_msg_buf b = {0};

    if (lora_msg_encode_residency_reply(&b, &rr, NULL, NULL) < 0) {
        lora_msg_buf_release(&b);
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

int engine_rank_states(struct engine *e, struct lora_msg_residency_reply *out)
{
    char err[256];
    for (int r = 0; r < e->world; r++) {
        memset(&out[r], 0, sizeof(out[r]));
        out[r].rank = r;
        if (e->rank_state[r] &&
            lora_msg_decode_residency_reply(e->rank_state[r], e->rank_state_len[r], NULL, 0,
                                            e->arena, &out[r], err, sizeof(err)) < 0)
            return -1;
    }
    return 0;
}

/* Adapters whose level differs between ranks. */
static int count_disagreement(struct engine *e)
{
    struct lora_msg_residency_reply st[ENGINE_MAX_WORLD];
    int n = 0;

    lora_msg_arena_reset(e->arena);
    if (engine_rank_states(e, st) < 0)
        return 0;
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
    char err[512];

    e->last_gather_ms = lora_now_ms();
    lora_msg_buf_reset(&e->out);
    if (lora_msg_encode_empty(&e->out, LORA_MSG_TAKE_NOTIFICATIONS) < 0 ||
        workers_broadcast(e, NULL, 0) < 0)
        return -1;
    if (workers_gather(e, LORA_MSG_NOTIFICATIONS, replies, 10000, err, sizeof(err)) < 0) {
        workers_mark_dead(e, err);
        return -1;
    }
    for (int r = 0; r < e->world; r++) {
        struct lora_msg_notifications m;
        lora_msg_arena_reset(e->arena);
        if (lora_msg_decode_notifications(replies[r].body, replies[r].body_len, NULL, 0, e->arena,
                                          &m, err, sizeof(err)) < 0) {
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
        lora_msg_buf_reset(&e->out);
        if (lora_msg_encode_notifications(&e->out, &m, NULL, NULL) == 0) {
            publish_body(e, "notifications");
            for (int i = 0; i < ENGINE_MAX_FRONTENDS; i++)
                if (e->frontends[i].present)
                    lora_sock_send(e->front, e->frontends[i].rid, e->frontends[i].rid_len, NULL,
                                   e->out.data, e->out.len, NULL, 0, ZMQ_DONTWAIT);
        }
    }
    workers_release(e, replies);
    adapters_sync_cached(e);
    int d = count_disagreement(e);
    if (d != e->disagreement && d > 0)
        fprintf(stderr, "lora-engine: warning: %d adapter%s held at different levels by the ranks\n",
                d, d == 1 ? " is" : "s are");
    e->disagreement = d;
    return 0;
}
