/* lora-worker serve: adapter commands, the loader threads that read adapters from disk off the
 * step path, and the notification channel. The loop collects finished loads every turn (and
 * polls briefly while any is pending); a load past its deadline (--load-timeout-ms) is answered
 * as failed at once, whatever its thread is stuck in. An adapter whose path lies under
 * --lora-root is read beneath the root descriptor opened at setup (lib/base/path_confine.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/path_confine.h"
#include "serve.h"

/* One ADD command: queued by the loop, loaded by a loader thread, finished by the loop. A load
 * that outlives its deadline is answered by the loop as failed and left to its thread, which
 * frees it whenever the read returns (a hung file system may never return it). */
enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct load_job {
    uint64_t op_id;
    char name[LORA_ADAPTER_NAME_MAX + 1];
    char path[4096];
    struct lora_adapter *adapter; /* NULL when loading failed */
    char err[512];
    double seconds;
    uint64_t deadline_ms; /* lora_clock_mono_ms() clock */
    enum job_state state;
    bool abandoned; /* answered at its deadline; its thread frees it */
    struct load_job *next;
};

#define LOADER_THREADS     2 /* loads read at once */
#define LOADER_MAX_THREADS 8 /* with those stuck past their deadline */
#define LOADER_STOP_MS     2000

struct loader {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a job queued, or stop */
    pthread_cond_t exited; /* a thread left */
    struct load_job *jobs; /* every job not yet answered, oldest first */
    int n_threads, n_idle, n_stuck;
    bool stop, orphaned;
    const struct lora_model *model;
    int max_rank;
    struct lora_adapter_root root; /* fd -1: no --lora-root */
    const char *root_given;        /* --lora-root as given */
};

static void loader_free(struct loader *ld)
{
    while (ld->jobs) {
        struct load_job *j = ld->jobs;
        ld->jobs = j->next;
        lora_adapter_destroy(&j->adapter);
        free(j);
    }
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
    pthread_cond_destroy(&ld->exited);
    if (ld->root.fd >= 0)
        close(ld->root.fd);
    free((char *)ld->root.path);
    free(ld);
}

/* Test hook: LORA_WORKER_TEST_STUCK_LOAD=NAME makes loading NAME hang as on a file system that
 * stopped answering, so that the tests can show the deadline. */
static void maybe_stuck(const struct load_job *j)
{
    const char *name = getenv("LORA_WORKER_TEST_STUCK_LOAD");
    if (name && strcmp(name, j->name) == 0)
        sleep(3600);
}

/* Loads j: beneath the root when its path lies under --lora-root, else as the operator gave it. */
static struct lora_adapter *load(struct loader *ld, struct load_job *j)
{
    if (ld->root.fd < 0)
        return lora_adapter_load(j->path, ld->model, ld->max_rank, j->err, sizeof(j->err));
    const char *rel = lora_path_confine_relative(ld->root.path, j->path);
    if (!rel)
        rel = lora_path_confine_relative(ld->root_given, j->path);
    if (!rel) /* not a client's path: the frontends confine theirs to the root */
        return lora_adapter_load(j->path, ld->model, ld->max_rank, j->err, sizeof(j->err));
    char dir[4096 + 8];
    snprintf(dir, sizeof(dir), "%s/%s", ld->root.path, rel);
    return lora_adapter_load_under(&ld->root, dir, ld->model, ld->max_rank, j->err, sizeof(j->err));
}

static void *loader_main(void *arg)
{
    struct loader *ld = arg;

    pthread_mutex_lock(&ld->mu);
    for (;;) {
        struct load_job *j = NULL;
        ld->n_idle++;
        while (!ld->stop) {
            for (j = ld->jobs; j && j->state != JOB_QUEUED; j = j->next)
                ;
            if (j)
                break;
            pthread_cond_wait(&ld->cv, &ld->mu);
        }
        ld->n_idle--;
        if (ld->stop)
            break;
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&ld->mu);

        double t0 = lora_clock_mono();
        maybe_stuck(j);
        j->adapter = load(ld, j);
        j->seconds = lora_clock_mono() - t0;

        pthread_mutex_lock(&ld->mu);
        if (!j->abandoned) {
            j->state = JOB_DONE;
            continue;
        }
        /* The loop answered it and started another thread: this one leaves. */
        lora_adapter_destroy(&j->adapter);
        free(j);
        ld->n_stuck--;
        break;
    }
    ld->n_threads--;
    bool last = ld->n_threads == 0;
    bool orphaned = ld->orphaned;
    pthread_cond_broadcast(&ld->exited);
    pthread_mutex_unlock(&ld->mu);
    if (last && orphaned)
        loader_free(ld);
    return NULL;
}

/* Starts one more loader thread when none is idle and fewer than LOADER_THREADS work. With mu
 * held. */
static void spawn_locked(struct loader *ld)
{
    pthread_t t;
    pthread_attr_t attr;

    if (ld->n_idle > 0 || ld->n_threads - ld->n_stuck >= LOADER_THREADS ||
        ld->n_threads >= LOADER_MAX_THREADS)
        return;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, loader_main, ld) == 0)
        ld->n_threads++;
    pthread_attr_destroy(&attr);
}

int worker_adapters_start(struct worker *w, char *err, size_t err_len)
{
    struct loader *ld = calloc(1, sizeof(*ld));

    if (!ld) {
        snprintf(err, err_len, "unable to start the adapter loader: out of memory");
        return -1;
    }
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv, NULL);
    pthread_cond_init(&ld->exited, NULL);
    ld->model = w->model;
    ld->max_rank = w->lim.max_lora_rank;
    ld->root.fd = -1;
    if (w->lora_root) {
        ld->root.fd = open(w->lora_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ld->root.path = realpath(w->lora_root, NULL);
        ld->root.allow_symlinks = w->lora_allow_symlinks;
        ld->root_given = w->lora_root;
        if (ld->root.fd < 0 || !ld->root.path) {
            snprintf(err, err_len, "--lora-root '%s': unable to open: %s", w->lora_root,
                     strerror(errno));
            loader_free(ld);
            return -1;
        }
    }
    pthread_mutex_lock(&ld->mu);
    spawn_locked(ld);
    bool started = ld->n_threads > 0;
    pthread_mutex_unlock(&ld->mu);
    if (!started) {
        snprintf(err, err_len, "unable to start the adapter loader thread");
        loader_free(ld);
        return -1;
    }
    w->loader = ld;
    return 0;
}

bool worker_adapters_stop(struct worker *w)
{
    struct loader *ld = w->loader;
    if (!ld)
        return true;
    w->loader = NULL;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    pthread_cond_broadcast(&ld->cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += LOADER_STOP_MS / 1000;
    while (ld->n_threads > 0 && pthread_cond_timedwait(&ld->exited, &ld->mu, &until) != ETIMEDOUT)
        ;
    if (ld->n_threads > 0) {
        /* A thread is stuck in a read: the last one to leave frees the loader. */
        ld->orphaned = true;
        pthread_mutex_unlock(&ld->mu);
        return false;
    }
    pthread_mutex_unlock(&ld->mu);
    loader_free(ld);
    return true;
}

/* pending: an asynchronous activate's copy goes on. */
static int reply_op(struct worker *w, uint64_t op_id, const char *err, double seconds, bool pending)
{
    struct lora_msg_adapter_op_reply r = {
        .op_id = op_id, .rank = w->rank, .ok = err == NULL, .seconds = seconds, .pending = pending};
    if (err)
        r.error = (struct lora_str){err, strlen(err)};
    lora_buf_reset(&w->out);
    if (lora_msg_encode_adapter_op_reply(&w->out, &r, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}

int worker_set_slot(void *ctx, int slot, const struct lora_adapter *a, char *err, size_t err_len)
{
    struct worker *w = ctx;
    double t0 = lora_clock_mono();

    if (w->copying[slot]) {
        w->copying[slot] = false;
        w->n_copying--;
    }
    if (lora_forward_set_slot(w->fwd, slot, a, err, err_len) < 0)
        return -1;
    if (!a || lora_forward_slot_ready(w->fwd, slot))
        return 0;
    w->copying[slot] = true;
    w->copy_t0[slot] = t0;
    w->n_copying++;
    return 1;
}

void worker_poll_copies(struct worker *w)
{
    bool any = false;

    for (int s = 0; s < w->lim.max_loras && w->n_copying > 0; s++) {
        if (!w->copying[s] || !lora_forward_slot_ready(w->fwd, s))
            continue;
        w->copying[s] = false;
        w->n_copying--;
        const struct lora_adapter_cache_entry *e = lora_adapter_cache_slot_entry(w->cache, s);
        if (e)
            lora_adapter_cache_record_activate(w->cache, e->name, lora_clock_mono() - w->copy_t0[s],
                                               NULL, 0);
        any = true;
    }
    if (any)
        worker_notify(w);
}

/* The cache's state as the worker tells it: a slot whose copy goes on is not filled yet. */
static int take_state(struct worker *w, bool take_timings, char *err, size_t err_len)
{
    if (lora_adapter_cache_snapshot(w->cache, &w->snap, take_timings, err, err_len) < 0)
        return -1;
    for (int s = 0; s < w->snap.state.n_slots && w->n_copying > 0; s++)
        if (w->copying[s])
            w->snap.state.slots[s] = (struct lora_str){"", 0};
    return 0;
}

void worker_notify(struct worker *w)
{
    char err[256];
    struct timespec ts;

    if (take_state(w, true, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: warning: rank %d: %s\n", w->rank, err);
        return;
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    struct lora_msg_notification item = {
        .kind = {"lora_load", 9},
        .seq = lora_notify_ring_next_seq(w->ring),
        .time = (double)ts.tv_sec + ts.tv_nsec * 1e-9,
        .state = w->snap.state,
        .n_timings = w->snap.n_timings,
        .timings = w->snap.timings,
    };
    struct lora_msg_notifications one = {
        .engine = -1, .rank = w->rank, .dropped = 0, .n_items = 1, .items = &item};
    lora_buf_reset(&w->item);
    if (lora_msg_encode_notifications(&w->item, &one, NULL, NULL) < 0 ||
        lora_notify_ring_push(w->ring, LORA_NOTIFY_LORA_LOAD, w->item.data, w->item.len, NULL) < 0)
        fprintf(stderr, "lora-worker: warning: rank %d: a notification was lost: %s\n", w->rank,
                strerror(errno));
}

int worker_finish_loads(struct worker *w)
{
    struct loader *ld = w->loader;
    struct load_job *answer = NULL, **tail = &answer;
    uint64_t now = lora_clock_mono_ms();
    char err[512];

    /* Takes out, under the lock, every job finished or past its deadline. */
    pthread_mutex_lock(&ld->mu);
    for (struct load_job **p = &ld->jobs; *p;) {
        struct load_job *j = *p;
        if (j->state != JOB_DONE && now < j->deadline_ms) {
            p = &j->next;
            continue;
        }
        *p = j->next;
        j->next = NULL;
        if (j->state == JOB_RUNNING) {
            /* Its thread still reads: answer now, let the thread free it, and start another
             * thread so that later loads do not queue behind it. */
            j->abandoned = true;
            ld->n_stuck++;
            fprintf(stderr,
                    "lora-worker: warning: rank %d: loading adapter '%s' from '%s' did not finish "
                    "within %ld ms\n",
                    w->rank, j->name, j->path, w->load_timeout_ms);
            struct load_job *copy = calloc(1, sizeof(*copy));
            if (copy) {
                copy->op_id = j->op_id;
                copy->state = JOB_QUEUED; /* marks "timed out" below */
                snprintf(copy->name, sizeof(copy->name), "%s", j->name);
                snprintf(copy->path, sizeof(copy->path), "%s", j->path);
                *tail = copy;
                tail = &copy->next;
            }
            spawn_locked(ld);
            continue;
        }
        *tail = j;
        tail = &j->next;
    }
    pthread_mutex_unlock(&ld->mu);

    int rc = 0;
    while (answer) {
        struct load_job *j = answer;
        answer = j->next;
        const char *fail = j->adapter ? NULL : j->err;
        if (j->state != JOB_DONE) {
            snprintf(j->err, sizeof(j->err),
                     "%.300s: loading did not finish within %ld ms (a slow or hung file system?)",
                     j->path, w->load_timeout_ms);
            fail = j->err;
        }
        if (j->adapter && lora_adapter_cache_insert(w->cache, j->name, &j->adapter, j->seconds,
                                                    w->clock, err, sizeof(err)) < 0)
            fail = err;
        if (!fail)
            worker_notify(w);
        rc |= reply_op(w, j->op_id, fail, j->seconds, false);
        w->n_loading--;
        lora_adapter_destroy(&j->adapter);
        free(j);
    }
    return rc;
}

/* Test hook: LORA_WORKER_TEST_IGNORE_ADD=NAME makes this rank acknowledge adding NAME without
 * loading it, so that the tests can show a disagreement between ranks being reported. */
static bool ignore_add(const struct lora_msg_adapter_op *op)
{
    const char *name = getenv("LORA_WORKER_TEST_IGNORE_ADD");
    return name && op->name.s && strcmp(name, op->name.s) == 0;
}

static int queue_load(struct worker *w, const struct lora_msg_adapter_op *op)
{
    struct loader *ld = w->loader;
    struct load_job *j = calloc(1, sizeof(*j));

    if (!j)
        return reply_op(w, op->op_id, "out of memory", 0, false);
    if (!op->path.s || op->name.len > LORA_ADAPTER_NAME_MAX || op->path.len >= sizeof(j->path)) {
        free(j);
        return reply_op(w, op->op_id, "add needs a name and a path", 0, false);
    }
    j->op_id = op->op_id;
    memcpy(j->name, op->name.s, op->name.len);
    memcpy(j->path, op->path.s, op->path.len);
    j->deadline_ms = lora_clock_mono_ms() + (uint64_t)w->load_timeout_ms;
    j->state = JOB_QUEUED;
    pthread_mutex_lock(&ld->mu);
    struct load_job **p = &ld->jobs;
    while (*p)
        p = &(*p)->next;
    *p = j;
    spawn_locked(ld);
    pthread_cond_signal(&ld->cv);
    pthread_mutex_unlock(&ld->mu);
    w->n_loading++;
    return 0;
}

int worker_handle_adapter_op(struct worker *w, const struct lora_msg_frames *f)
{
    struct lora_msg_adapter_op op;
    char err[512];
    int rc;

    lora_msg_arena_reset(w->arena);
    if (lora_msg_decode_adapter_op(f->body, f->body_len, NULL, 0, w->arena, &op, err, sizeof(err)) <
        0) {
        fprintf(stderr, "lora-worker: warning: rank %d: dropping an adapter command: %s\n", w->rank,
                err);
        return 0;
    }
    if (!w->set_up)
        return reply_op(w, op.op_id, "adapter command before setup", 0, false);
    const char *name = op.name.s ? op.name.s : "";
    switch (op.op) {
    case LORA_OP_ADD:
        return ignore_add(&op) ? reply_op(w, op.op_id, NULL, 0, false) : queue_load(w, &op);
    case LORA_OP_ACTIVATE: {
        /* Sent again for the same slot, an asynchronous activate only asks whether the copy is
         * done (worker_poll_copies says when it is). */
        const struct lora_adapter_cache_entry *was =
            lora_adapter_cache_slot_entry(w->cache, op.slot);
        bool again = was && strcmp(was->name, name) == 0;
        rc = lora_adapter_cache_activate(w->cache, name, op.slot, w->clock, err, sizeof(err));
        if (rc == 0 && op.async) {
            worker_poll_copies(w);
            if (!again)
                worker_notify(w);
            return reply_op(w, op.op_id, NULL, 0, w->copying[op.slot]);
        }
        break;
    }
    case LORA_OP_REMOVE:
        /* Idempotent: a rank that does not hold it is already where the engine wants it, and
         * refusing would leave the ranks that did remove it out of step with the registry. */
        if (!lora_adapter_cache_find(w->cache, name))
            return reply_op(w, op.op_id, NULL, 0, false);
        rc = lora_adapter_cache_remove(w->cache, name, err, sizeof(err));
        break;
    case LORA_OP_PIN:
        rc = lora_adapter_cache_pin(w->cache, name, w->clock, err, sizeof(err));
        break;
    case LORA_OP_UNPIN:
        rc = lora_adapter_cache_unpin(w->cache, name, err, sizeof(err));
        break;
    default:
        snprintf(err, sizeof(err), "unknown adapter command");
        rc = -1;
    }
    /* Any other command answers once the copy it started (activate, pin) is done. */
    const struct lora_adapter_cache_entry *e = lora_adapter_cache_find(w->cache, name);
    if (e && e->slot >= 0 && w->copying[e->slot]) {
        lora_forward_slot_wait(w->fwd, e->slot);
        worker_poll_copies(w);
    }
    if (rc == 0)
        worker_notify(w);
    return reply_op(w, op.op_id, rc == 0 ? NULL : err, 0, false);
}

/* Collects the items of every buffered notification into one message. */
struct gather {
    struct worker *w;
    struct lora_msg_notification *items;
    int n, cap;
};

static int gather_one(void *ctx, const struct lora_notify_item *it)
{
    struct gather *g = ctx;
    struct lora_msg_notifications one;
    char err[256];

    if (lora_msg_decode_notifications(it->data, it->len, NULL, 0, g->w->arena, &one, err,
                                      sizeof(err)) < 0 ||
        one.n_items != 1)
        return 0; /* our own encoding: cannot happen; drop it rather than wedge the ring */
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        struct lora_msg_notification *p = realloc(g->items, sizeof(*p) * (size_t)cap);
        if (!p)
            return 1; /* keep the rest for the next take */
        g->items = p;
        g->cap = cap;
    }
    g->items[g->n++] = one.items[0];
    return 0;
}

int worker_handle_take_notifications(struct worker *w)
{
    struct gather g = {.w = w};

    lora_msg_arena_reset(w->arena);
    if (w->ring)
        lora_notify_ring_drain(w->ring, gather_one, &g);
    struct lora_msg_notifications m = {
        .engine = -1,
        .rank = w->rank,
        .dropped = w->ring ? lora_notify_ring_dropped(w->ring) : 0,
        .n_items = g.n,
        .items = g.items,
    };
    lora_buf_reset(&w->out);
    int rc = lora_msg_encode_notifications(&w->out, &m, NULL, NULL);
    free(g.items);
    return rc < 0 ? -1 : worker_send(w, NULL, 0);
}

int worker_handle_residency(struct worker *w)
{
    char err[256];
    struct lora_msg_residency_reply r = {.engine = -1, .rank = w->rank};

    if (w->set_up) {
        if (take_state(w, false, err, sizeof(err)) < 0)
            return -1;
        r.state = w->snap.state;
    }
    lora_buf_reset(&w->out);
    if (lora_msg_encode_residency_reply(&w->out, &r, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}
