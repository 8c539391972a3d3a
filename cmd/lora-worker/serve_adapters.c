/* lora-worker serve: adapter commands (DESIGN section 6), the loader thread that reads adapters
 * from disk off the step path, and the notification channel (section 7). The loop collects
 * finished loads every turn (and polls briefly while any is pending). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

/* One ADD command: queued by the loop, loaded by the thread, finished by the loop. */
struct load_job {
    uint64_t op_id;
    char name[LORA_ADAPTER_NAME_MAX + 1];
    char path[4096];
    struct lora_adapter *adapter; /* NULL when loading failed */
    char err[512];
    double seconds;
    struct load_job *next;
};

struct loader {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct load_job *todo, *todo_tail, *done;
    bool stop;
    const struct lora_model *model;
    int max_rank;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *loader_main(void *arg)
{
    struct loader *ld = arg;

    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->todo && !ld->stop)
            pthread_cond_wait(&ld->cv, &ld->mu);
        if (ld->stop)
            break;
        struct load_job *j = ld->todo;
        ld->todo = j->next;
        if (!ld->todo)
            ld->todo_tail = NULL;
        pthread_mutex_unlock(&ld->mu);

        double t0 = now_s();
        j->adapter = lora_adapter_load(j->path, ld->model, ld->max_rank, j->err, sizeof(j->err));
        j->seconds = now_s() - t0;

        pthread_mutex_lock(&ld->mu);
        j->next = ld->done;
        ld->done = j;
    }
    pthread_mutex_unlock(&ld->mu);
    return NULL;
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
    ld->model = w->model;
    ld->max_rank = w->lim.max_lora_rank;
    if (pthread_create(&ld->thread, NULL, loader_main, ld) != 0) {
        snprintf(err, err_len, "unable to start the adapter loader thread");
        free(ld);
        return -1;
    }
    w->loader = ld;
    return 0;
}

static void free_jobs(struct load_job *j)
{
    while (j) {
        struct load_job *next = j->next;
        lora_adapter_destroy(&j->adapter);
        free(j);
        j = next;
    }
}

void worker_adapters_stop(struct worker *w)
{
    struct loader *ld = w->loader;
    if (!ld)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    pthread_cond_signal(&ld->cv);
    pthread_mutex_unlock(&ld->mu);
    pthread_join(ld->thread, NULL);
    free_jobs(ld->todo);
    free_jobs(ld->done);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
    free(ld);
    w->loader = NULL;
}

static int reply_op(struct worker *w, uint64_t op_id, const char *err, double seconds)
{
    struct lora_msg_adapter_op_reply r = {
        .op_id = op_id, .rank = w->rank, .ok = err == NULL, .seconds = seconds};
    if (err)
        r.error = (struct lora_str){err, strlen(err)};
    lora_msg_buf_reset(&w->out);
    if (lora_msg_encode_adapter_op_reply(&w->out, &r, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}

void worker_notify(struct worker *w)
{
    char err[256];
    struct timespec ts;

    if (lora_adapter_cache_snapshot(w->cache, &w->snap, true, err, sizeof(err)) < 0) {
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
    lora_msg_buf_reset(&w->item);
    if (lora_msg_encode_notifications(&w->item, &one, NULL, NULL) < 0 ||
        lora_notify_ring_push(w->ring, LORA_NOTIFY_LORA_LOAD, w->item.data, w->item.len, NULL) <
            0)
        fprintf(stderr, "lora-worker: warning: rank %d: a notification was lost: %s\n", w->rank,
                strerror(errno));
}

int worker_finish_loads(struct worker *w)
{
    struct loader *ld = w->loader;
    char err[512];

    pthread_mutex_lock(&ld->mu);
    struct load_job *done = ld->done;
    ld->done = NULL;
    pthread_mutex_unlock(&ld->mu);

    int rc = 0;
    while (done) {
        struct load_job *j = done;
        done = j->next;
        const char *fail = j->adapter ? NULL : j->err;
        if (j->adapter && lora_adapter_cache_insert(w->cache, j->name, &j->adapter, j->seconds,
                                                    w->clock, err, sizeof(err)) < 0)
            fail = err;
        if (!fail)
            worker_notify(w);
        rc |= reply_op(w, j->op_id, fail, j->seconds);
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
        return reply_op(w, op->op_id, "out of memory", 0);
    if (!op->path.s || op->name.len > LORA_ADAPTER_NAME_MAX || op->path.len >= sizeof(j->path)) {
        free(j);
        return reply_op(w, op->op_id, "add needs a name and a path", 0);
    }
    j->op_id = op->op_id;
    memcpy(j->name, op->name.s, op->name.len);
    memcpy(j->path, op->path.s, op->path.len);
    pthread_mutex_lock(&ld->mu);
    if (ld->todo_tail)
        ld->todo_tail->next = j;
    else
        ld->todo = j;
    ld->todo_tail = j;
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
    if (lora_msg_decode_adapter_op(f->body, f->body_len, NULL, 0, w->arena, &op, err,
                                   sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: warning: rank %d: dropping an adapter command: %s\n",
                w->rank, err);
        return 0;
    }
    if (!w->set_up)
        return reply_op(w, op.op_id, "adapter command before setup", 0);
    const char *name = op.name.s ? op.name.s : "";
    switch (op.op) {
    case LORA_OP_ADD:
        return ignore_add(&op) ? reply_op(w, op.op_id, NULL, 0) : queue_load(w, &op);
    case LORA_OP_ACTIVATE:
        rc = lora_adapter_cache_activate(w->cache, name, op.slot, w->clock, err, sizeof(err));
        break;
    case LORA_OP_REMOVE:
        /* Idempotent: a rank that does not hold it is already where the engine wants it, and
         * refusing would leave the ranks that did remove it out of step with the registry. */
        if (!lora_adapter_cache_find(w->cache, name))
            return reply_op(w, op.op_id, NULL, 0);
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
    if (rc == 0)
        worker_notify(w);
    return reply_op(w, op.op_id, rc == 0 ? NULL : err, 0);
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
    lora_msg_buf_reset(&w->out);
    int rc = lora_msg_encode_notifications(&w->out, &m, NULL, NULL);
    free(g.items);
    return rc < 0 ? -1 : worker_send(w, NULL, 0);
}

int worker_handle_residency(struct worker *w)
{
    char err[256];
    struct lora_msg_residency_reply r = {.engine = -1, .rank = w->rank};

    if (w->set_up) {
        if (lora_adapter_cache_snapshot(w->cache, &w->snap, false, err, sizeof(err)) < 0)
            return -1;
        r.state = w->snap.state;
    }
    lora_msg_buf_reset(&w->out);
    if (lora_msg_encode_residency_reply(&w->out, &r, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}
