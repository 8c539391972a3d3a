/* lora-worker serve: one tensor-parallel rank under an engine (docs/design.md, "Programs", "Wire
 * protocol", "Backend", "Residency").
 *
 * Connects a DEALER (identity "worker-RANK-PID": unique, so that no connection can take over
 * another's routing id) to the engine's worker socket and says hello until the engine answers;
 * the engine's setup names the model, this rank's shard and the limits; then the loop serves
 * step, adapter_op, take_notifications, residency, heartbeat and shutdown. An engine that
 * already has this rank answers the hello with a setup_done that is not ok: the worker then
 * says why and exits 1.
 * Heartbeats: the worker sends one after 500 ms without sending; an engine silent for 3 s is
 * gone, and the worker exits (111) rather than run on for nobody. A second thread with its own
 * socket (identity "worker-RANK-PID-hb") sends a heartbeat every 500 ms whatever the loop is doing,
 * so a long step does not look like a dead worker to the engine. SIGTERM and SIGINT exit
 * cleanly (0). Adapter loads run on a loader thread, so steps go on while an adapter is read.
 * The compute device (--device) is opened before the first hello, so a worker that cannot
 * compute exits at once (100) with the reason; setup says on stderr what it holds where. The KV
 * cache is made by make_kv_cache from a block count alone, so that it can be remade with a
 * figure the engine learns later.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/cli.h"
#include "serve.h"
#include "worker.h"

#define LOAD_POLL_MS 2 /* poll period while an adapter is loading */
#define COPY_POLL_MS 1 /* and while an adapter is copied into a slot */

struct beat {
    void *zctx;
    const char *endpoint;
    char identity[64];
    pthread_t thread;
    atomic_bool stop;
};

static void *beat_main(void *arg)
{
    struct beat *b = arg;
    char err[256];
    struct lora_buf hb = {0};
    struct lora_sock *s =
        lora_sock_new(b->zctx, ZMQ_DEALER, b->endpoint, false, b->identity, err, sizeof(err));

    if (!s || lora_msg_encode_empty(&hb, LORA_MSG_HEARTBEAT) < 0) {
        fprintf(stderr, "lora-worker: warning: no heartbeat thread: %s\n", s ? "no memory" : err);
        goto out;
    }
    while (!atomic_load(&b->stop)) {
        lora_sock_send(s, NULL, 0, NULL, hb.data, hb.len, NULL, 0, ZMQ_DONTWAIT);
        struct timespec ts = {0, LORA_HEARTBEAT_INTERVAL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
out:
    lora_buf_release(&hb);
    lora_sock_destroy(&s);
    return NULL;
}

int worker_send(struct worker *w, const struct lora_msg_bin *bins, int n_bins)
{
    struct lora_frame frames[LORA_SOCK_MAX_BINS];

    for (int i = 0; i < n_bins; i++)
        frames[i] = (struct lora_frame){bins[i].data, bins[i].len};
    int rc = lora_sock_send(w->sock, NULL, 0, NULL, w->out.data, w->out.len, frames, n_bins,
                            ZMQ_DONTWAIT);
    /* Counted as sent either way, so that a failing peer is retried at the heartbeat pace,
     * and said once per run of failures. */
    lora_liveness_sent(&w->engine, lora_clock_mono_ms());
    if (rc < 0 && !w->send_failing)
        fprintf(stderr, "lora-worker: warning: rank %d: unable to send to the engine: %s\n",
                w->rank, strerror(errno));
    w->send_failing = rc < 0;
    return rc;
}

static int send_hello(struct worker *w)
{
    struct lora_msg_hello h = {
        .version = LORA_PROTOCOL_VERSION,
        .role = LORA_ROLE_WORKER,
        .rank = w->rank,
        .world_size = 0,
        .pid = getpid(),
    };
    lora_buf_reset(&w->out);
    if (lora_msg_encode_hello(&w->out, &h, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}

static int send_empty(struct worker *w, enum lora_msg_type t)
{
    lora_buf_reset(&w->out);
    if (lora_msg_encode_empty(&w->out, t) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}

/* Bytes of one KV block of this rank. */
static size_t kv_block_bytes(const struct worker *w)
{
    const struct lora_model_config *c = &w->model->cfg;
    return lora_kv_cache_block_bytes(w->kv_dtype, c->n_layers, w->model->n_kv_heads * c->head_dim,
                                     w->lim.block_size);
}

/* n blocks of a budget, at most the setup's cap; -1 with err when not even one fits. */
static int kv_blocks_of(const struct lora_msg_setup *s, double budget, size_t block_bytes,
                        char *err, size_t err_len)
{
    double n = budget / (double)block_bytes;

    if (s->limits.num_kv_blocks > 0 && n > s->limits.num_kv_blocks)
        n = s->limits.num_kv_blocks;
    if (n < 1) {
        snprintf(err, err_len, "the KV cache budget of %.0f bytes holds no block of %zu bytes",
                 budget, block_bytes);
        return -1;
    }
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* The KV blocks this rank gives the engine under a budget of bytes or of a fraction of the
 * memory the backend says is available (shared by the ranks of the host on the CPU), at most the
 * setup's cap; without a budget, the cap itself. Returns the count, or -1 with err. */
static int kv_blocks_fit(const struct worker *w, const struct lora_msg_setup *s, char *err,
                         size_t err_len)
{
    const struct lora_msg_limits *l = &s->limits;
    double budget = (double)s->kv_cache_bytes;

    if (s->kv_cache_bytes == 0 && s->kv_cache_fraction <= 0) {
        if (l->num_kv_blocks < 1)
            snprintf(err, err_len, "setup for rank %d gives no KV cache budget", s->rank);
        return l->num_kv_blocks < 1 ? -1 : l->num_kv_blocks;
    }
    if (s->kv_cache_fraction > 0) {
        size_t total, avail;
        if (w->be->ops->memory(w->be, &total, &avail) < 0) {
            snprintf(err, err_len, "unable to read the memory of %s", w->be->device);
            return -1;
        }
        budget = (double)avail * s->kv_cache_fraction /
                 (strcmp(w->be->kind, "cpu") == 0 ? l->world_size : 1);
    }
    return kv_blocks_of(s, budget, kv_block_bytes(w), err, err_len);
}

/* --gpu-memory-utilization, before setup allocates anything: the device's total bytes, and the
 * free ones as they were before the backend took its own (which count as the rank's), after
 * checking, as vLLM does, that the share asked for is free. */
static int device_share_check(struct worker *w, const struct lora_msg_setup *s, size_t *total,
                              size_t *free0, char *err, size_t err_len)
{
    double util = s->gpu_memory_utilization;

    if (strcmp(w->be->kind, "cpu") == 0) {
        snprintf(err, err_len,
                 "--gpu-memory-utilization sizes a GPU's KV cache and rank %d computes on the "
                 "CPU: give --kv-cache-bytes or --kv-cache-fraction instead",
                 w->rank);
        return -1;
    }
    if (w->be->ops->memory(w->be, total, free0) < 0) {
        snprintf(err, err_len, "unable to read the memory of %s", w->be->device);
        return -1;
    }
    *free0 += w->be->held_bytes;
    if ((double)*free0 < util * (double)*total) {
        snprintf(err, err_len,
                 "%s has %.2f GiB free of %.2f GiB, less than --gpu-memory-utilization %g asks "
                 "for (%.2f GiB): lower it or free the device",
                 w->be->device, *free0 / 1073741824.0, *total / 1073741824.0, util,
                 util * (double)*total / 1073741824.0);
        return -1;
    }
    return 0;
}

/* --gpu-memory-utilization, once everything but the KV cache is allocated (with one block of it
 * in place): the blocks that the device's share holds beside what this rank took since free0.
 * Returns the count, or -1 with err. */
static int kv_blocks_of_share(const struct worker *w, const struct lora_msg_setup *s, size_t total,
                              size_t free0, char *err, size_t err_len)
{
    size_t t, free1;

    if (w->be->ops->memory(w->be, &t, &free1) < 0) {
        snprintf(err, err_len, "unable to read the memory of %s", w->be->device);
        return -1;
    }
    size_t block_bytes = kv_block_bytes(w);
    double used = free1 < free0 ? (double)(free0 - free1) : 0;
    double budget = s->gpu_memory_utilization * (double)total - used + (double)block_bytes;
    if (budget < (double)block_bytes) {
        snprintf(err, err_len,
                 "--gpu-memory-utilization %g of %s leaves no room for the KV cache: the weights, "
                 "adapter slots and activations take %.2f GiB of that %.2f GiB share",
                 s->gpu_memory_utilization, w->be->device, used / 1073741824.0,
                 s->gpu_memory_utilization * (double)total / 1073741824.0);
        return -1;
    }
    return kv_blocks_of(s, budget, block_bytes, err, err_len);
}

/* The KV cache of n_blocks blocks, replacing any there was: a forward pass made on the old one
 * must be given the new one (lora_forward_set_kv). */
static int make_kv_cache(struct worker *w, int n_blocks, char *err, size_t err_len)
{
    const struct lora_model_config *c = &w->model->cfg;

    lora_kv_cache_destroy(&w->kv);
    w->kv = lora_kv_cache_new(w->be, w->kv_dtype, c->n_layers, w->model->n_kv_heads * c->head_dim,
                              w->lim.block_size, n_blocks);
    if (!w->kv) {
        snprintf(err, err_len, "unable to allocate %d KV blocks on %s", n_blocks, w->be->device);
        return -1;
    }
    return 0;
}

/* Loads this rank's shard and makes every buffer the limits call for. */
static int setup(struct worker *w, const struct lora_msg_setup *s, char *err, size_t err_len)
{
    const struct lora_msg_limits *l = &s->limits;

    if (s->rank != w->rank || l->world_size < 1 || l->max_loras < 1 ||
        l->max_cpu_loras < l->max_loras || l->block_size < 1 || l->num_kv_blocks < 0 ||
        l->max_num_batched_tokens < 1 || l->max_num_seqs < 1 || l->max_model_len < 1 ||
        l->max_lora_rank < 1) {
        snprintf(err, err_len, "setup for rank %d has invalid limits", s->rank);
        return -1;
    }
    w->lim = *l;
    size_t mem_total = 0, mem_free0 = 0;
    if (s->gpu_memory_utilization > 0 &&
        device_share_check(w, s, &mem_total, &mem_free0, err, err_len) < 0)
        return -1;
    w->model = lora_model_load(w->be, s->model.s, w->rank, l->world_size, &w->precision, err,
                               err_len);
    if (!w->model ||
        lora_precision_kv(&w->precision, w->be, &w->kv_dtype, err, err_len) < 0 ||
        lora_precision_lora(&w->precision, w->be, w->model->base_dtype, &w->lora_dtype, err,
                            err_len) < 0)
        return -1;
    const struct lora_model_config *c = &w->model->cfg;
    w->lim.vocab_size = c->vocab_size;
    struct lora_forward_limits fl = {
        .max_tokens = l->max_num_batched_tokens,
        .max_seqs = l->max_num_seqs,
        .max_logit_rows = l->max_num_batched_tokens + l->max_num_seqs,
        .max_ctx = l->max_model_len,
        .max_loras = l->max_loras,
        .max_rank = l->max_lora_rank,
        .slot_dtype = w->lora_dtype,
    };
    if (s->gpu_memory_utilization > 0) {
        /* The forward pass's buffers are made first, on a one-block cache, to measure them. */
        if (make_kv_cache(w, 1, err, err_len) < 0 ||
            !(w->fwd = lora_forward_new(w->model, w->kv, &fl, err, err_len)))
            return -1;
        w->lim.num_kv_blocks = kv_blocks_of_share(w, s, mem_total, mem_free0, err, err_len);
    } else {
        w->lim.num_kv_blocks = kv_blocks_fit(w, s, err, err_len);
    }
    if (w->lim.num_kv_blocks < 1 || make_kv_cache(w, w->lim.num_kv_blocks, err, err_len) < 0)
        return -1;
    if (w->fwd ? lora_forward_set_kv(w->fwd, w->kv, err, err_len) < 0
               : !(w->fwd = lora_forward_new(w->model, w->kv, &fl, err, err_len)))
        return -1;
    if (lora_forward_warm(w->fwd, err, err_len) < 0)
        return -1;
    if (l->world_size > 1) {
        if (!s->shm.s) {
            snprintf(err, err_len, "setup for %d ranks names no shared memory", l->world_size);
            return -1;
        }
        w->coll = w->be->ops->collective_open(w->be, s->shm.s, w->rank, l->world_size,
                                              (size_t)l->max_num_batched_tokens * c->hidden_size,
                                              30000, err, err_len);
        if (!w->coll)
            return -1;
        lora_forward_set_collective(w->fwd, w->coll);
    }
    w->copying = calloc((size_t)l->max_loras, sizeof(bool));
    w->copy_t0 = calloc((size_t)l->max_loras, sizeof(double));
    w->cache =
        lora_adapter_cache_new(l->max_loras, l->max_cpu_loras, worker_set_slot, w, err, err_len);
    w->sampler = lora_sampler_new(c->vocab_size);
    w->ring = lora_notify_ring_new(0);
    if (!w->cache || !w->sampler || !w->ring || !w->copying || !w->copy_t0) {
        if (!*err)
            snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (worker_step_alloc(w, err, err_len) < 0 || worker_adapters_start(w, err, err_len) < 0)
        return -1;
    size_t slot_bytes, fwd_bytes = lora_forward_bytes(w->fwd, &slot_bytes);
    fprintf(stderr,
            "lora-worker: rank %d: set up on %s: %.1f MB of %s weights, %.1f MB of %s KV cache, "
            "%.1f MB of activations and %d %s adapter slots (%.1f MB); the backend's own %.1f "
            "MB\n",
            w->rank, w->be->description, w->model->weight_bytes / 1e6,
            lora_precision_name(w->model->weight_dtype),
            2.0 * (double)w->kv->layer_bytes * c->n_layers / 1e6, lora_precision_name(w->kv_dtype),
            (fwd_bytes - slot_bytes) / 1e6, l->max_loras, lora_precision_name(w->lora_dtype),
            slot_bytes / 1e6, w->be->held_bytes / 1e6);
    w->set_up = true;
    worker_notify(w); /* the first state: nothing loaded */
    return 0;
}

static int handle_setup(struct worker *w, const struct lora_msg_frames *f)
{
    struct lora_msg_setup s;
    char err[1024] = "";

    lora_msg_arena_reset(w->arena);
    int rc = lora_msg_decode_setup(f->body, f->body_len, NULL, 0, w->arena, &s, err, sizeof(err));
    if (rc == 0 && w->set_up) {
        snprintf(err, sizeof(err), "setup received twice");
        rc = -1;
    }
    if (rc == 0)
        rc = setup(w, &s, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "lora-worker: warning: rank %d on %s: setup failed: %s\n", w->rank,
                w->be->device, err);
    struct lora_msg_setup_done d = {
        .ok = rc == 0,
        .rank = w->rank,
        .weight_bytes = w->model ? w->model->weight_bytes : 0,
        .kv_blocks = rc == 0 ? w->lim.num_kv_blocks : 0,
        .async_activate = rc == 0 && lora_forward_copies_async(w->fwd),
    };
    size_t total, avail;
    if (rc == 0 && w->be->ops->memory(w->be, &total, &avail) == 0) {
        d.memory_total = total;
        d.memory_free = avail < total ? avail : total;
    }
    if (rc < 0)
        d.error = (struct lora_str){err, strlen(err)};
    lora_buf_reset(&w->out);
    if (lora_msg_encode_setup_done(&w->out, &d, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}

/* The engine refused this worker's hello (its rank is taken): says why. */
static void report_refusal(struct worker *w, const struct lora_msg_frames *f)
{
    struct lora_msg_setup_done d = {0};
    char err[256] = "no reason given";

    lora_msg_arena_reset(w->arena);
    if (lora_msg_decode_setup_done(f->body, f->body_len, NULL, 0, w->arena, &d, err, sizeof(err)) ==
            0 &&
        d.error.s)
        snprintf(err, sizeof(err), "%s", d.error.s);
    fprintf(stderr, "lora-worker: fatal: rank %d: the engine refused this worker: %s\n", w->rank,
            err);
}

/* Returns 1 to stop (shutdown), 2 when the engine refused us, 0 to go on. */
static int dispatch(struct worker *w, const struct lora_msg_frames *f)
{
    char err[256];
    int type = lora_msg_peek_type(f->body, f->body_len, err, sizeof(err));

    switch (type) {
    case LORA_MSG_SETUP:
        handle_setup(w, f);
        break;
    case LORA_MSG_STEP:
        worker_handle_step(w, f);
        break;
    case LORA_MSG_ADAPTER_OP:
        worker_handle_adapter_op(w, f);
        break;
    case LORA_MSG_TAKE_NOTIFICATIONS:
        worker_handle_take_notifications(w);
        break;
    case LORA_MSG_RESIDENCY:
        worker_handle_residency(w);
        break;
    case LORA_MSG_SHUTDOWN:
        return 1;
    case LORA_MSG_SETUP_DONE:
        if (w->set_up)
            break; /* a refusal is for a newcomer only */
        report_refusal(w, f);
        return 2;
    case LORA_MSG_HEARTBEAT:
    case LORA_MSG_READY:
        break;
    default:
        fprintf(stderr, "lora-worker: warning: rank %d: ignoring a message: %s\n", w->rank,
                type < 0 ? err : lora_msg_type_name(type));
    }
    return 0;
}

static void teardown(struct worker *w)
{
    bool loaders_gone = worker_adapters_stop(w);
    worker_step_free(w);
    lora_adapter_cache_destroy(&w->cache);
    lora_adapter_cache_snapshot_release(&w->snap);
    free(w->copying);
    free(w->copy_t0);
    lora_forward_destroy(&w->fwd);
    lora_kv_cache_destroy(&w->kv);
    if (w->be)
        w->be->ops->collective_close(w->be, &w->coll);
    /* Else a stuck loader thread may still read the model's shapes: both stay. */
    if (loaders_gone) {
        lora_model_destroy(&w->model);
        lora_backend_close(&w->be);
    }
    lora_sampler_destroy(&w->sampler);
    lora_notify_ring_destroy(&w->ring);
    lora_buf_release(&w->out);
    lora_buf_release(&w->item);
    lora_msg_arena_destroy(&w->arena);
    lora_sock_destroy(&w->sock);
    if (w->zctx)
        zmq_ctx_term(w->zctx);
    if (w->sig_fd >= 0)
        lora_signal_pipe_close(w->sig_fd);
}

/* The loop: messages, finished loads, heartbeats, the engine's liveness, signals. */
static int run(struct worker *w)
{
    for (;;) {
        uint64_t now = lora_clock_mono_ms();
        if (w->engine_seen && lora_liveness_is_dead(&w->engine, now)) {
            fprintf(stderr, "lora-worker: fatal: rank %d: the engine is gone (silent for %d ms)\n",
                    w->rank, LORA_HEARTBEAT_DEAD_MS);
            return EXIT_SYSTEM;
        }
        /* A failed send is logged; the engine's liveness decides what happens next. */
        if (lora_liveness_should_send(&w->engine, now))
            w->engine_seen ? send_empty(w, LORA_MSG_HEARTBEAT) : send_hello(w);
        bool readable[2] = {false, false};
        struct lora_sock *socks[1] = {w->sock};
        /* Until the engine answers, only the next hello is due (no death deadline). */
        int timeout =
            w->engine_seen ? lora_liveness_timeout_ms(&w->engine, now) : LORA_HEARTBEAT_INTERVAL_MS;
        /* poll watches the socket and the signals; while loads run, it wakes often enough to
         * answer a finished load within LOAD_POLL_MS. */
        if (w->n_loading > 0 && timeout > LOAD_POLL_MS)
            timeout = LOAD_POLL_MS;
        if (w->n_copying > 0 && timeout > COPY_POLL_MS)
            timeout = COPY_POLL_MS;
        if (lora_sock_poll(socks, 1, w->sig_fd, timeout, readable) < 0 && errno != EINTR) {
            fprintf(stderr, "lora-worker: fatal: poll: %s\n", strerror(errno));
            return EXIT_SYSTEM;
        }
        if (readable[1] && lora_signal_pipe_drain(w->sig_fd) > 0)
            return 0;
        if (w->n_loading > 0)
            worker_finish_loads(w);
        if (w->n_copying > 0)
            worker_poll_copies(w);
        struct lora_msg_frames f;
        char err[256];
        while (lora_sock_recv(w->sock, &f, 0, err, sizeof(err)) == 1) {
            w->engine_seen = true;
            lora_liveness_heard(&w->engine, lora_clock_mono_ms());
            int stop = dispatch(w, &f);
            lora_msg_frames_release(&f);
            if (stop)
                return stop == 2 ? 1 : 0;
        }
    }
}

int cmd_serve(int argc, char **argv)
{
    const char *endpoint = NULL, *device = "cpu";
    long rank = 0;
    struct worker w = {.sig_fd = -1};
    long load_timeout = 60000; /* below the engine's 120 s wait for an adapter command */
    struct precision_flags pf = {0};
    bool help = false;
    const struct lora_cli_opt options[] = {
        {"engine", LORA_OPT_STRING, &endpoint, "ENDPOINT", "the engine's worker socket"},
        {"rank", LORA_OPT_INT, &rank, "N", "tensor-parallel rank (default 0)", 0, 63},
        {"device", LORA_OPT_STRING, &device, "DEVICE",
         "compute device: cpu, cuda or cuda:N "
         "(default cpu)"},
        {"lora-root", LORA_OPT_STRING, &w.lora_root, "DIR",
         "read adapters under DIR beneath it, following no link"},
        {"lora-allow-symlinks", LORA_OPT_FLAG, &w.lora_allow_symlinks, NULL,
         "follow links under --lora-root that stay under it"},
        {"load-timeout-ms", LORA_OPT_INT, &load_timeout, "MS",
         "an adapter load still running after MS fails (default 60000)", 100, 3600000},
        PRECISION_OPTIONS(pf),
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {0},
    };
    char err[1024] = "", identity[48];
    int rc = EXIT_SYSTEM;

    if (lora_cli_parse(options, "LORA_WORKER", argc, argv, 1, err, sizeof(err)) < 0 ||
        (!help && !endpoint)) {
        fprintf(stderr, "lora-worker: fatal: %s\n", *err ? err : "serve needs --engine ENDPOINT");
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-worker serve --engine ENDPOINT [--rank N] [--device DEVICE] "
             "[--lora-root DIR]\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    lora_precision_defaults(&w.precision);
    if (lora_precision_parse(&w.precision, pf.dtype, pf.quantization, pf.lora_dtype,
                             pf.kv_cache_dtype, pf.matmul_precision, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    w.rank = (int)rank;
    w.endpoint = endpoint;
    w.load_timeout_ms = load_timeout;
    struct stat root_st;
    if (w.lora_root && (stat(w.lora_root, &root_st) < 0 || !S_ISDIR(root_st.st_mode))) {
        fprintf(stderr, "lora-worker: fatal: --lora-root '%s' is not a directory\n", w.lora_root);
        return EXIT_USAGE;
    }
    /* The device first: a worker that cannot compute never says hello. */
    w.be = lora_backend_open(device, err, sizeof(err));
    if (!w.be) {
        fprintf(stderr, "lora-worker: fatal: --device %s: %s\n", device, err);
        return EXIT_USAGE;
    }
    w.be->fast_matmul = w.precision.fast_matmul;
    snprintf(identity, sizeof(identity), "worker-%d-%ld", w.rank, (long)getpid());
    const int sigs[] = {SIGTERM, SIGINT};
    w.sig_fd = lora_signal_pipe_open(sigs, 2);
    w.zctx = zmq_ctx_new();
    w.arena = lora_msg_arena_new();
    if (w.sig_fd < 0 || !w.zctx || !w.arena) {
        fprintf(stderr, "lora-worker: fatal: unable to start: %s\n", strerror(errno));
        goto out;
    }
    w.sock = lora_sock_new(w.zctx, ZMQ_DEALER, endpoint, false, identity, err, sizeof(err));
    if (!w.sock) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        goto out;
    }
    lora_liveness_init(&w.engine, lora_clock_mono_ms());
    struct beat beat = {.zctx = w.zctx, .endpoint = endpoint};
    snprintf(beat.identity, sizeof(beat.identity), "%s-hb", identity);
    bool beating = pthread_create(&beat.thread, NULL, beat_main, &beat) == 0;
    /* Say hello at once, not after the first interval. */
    send_hello(&w);
    rc = run(&w);
    if (beating) {
        atomic_store(&beat.stop, true);
        pthread_join(beat.thread, NULL);
    }
out:
    teardown(&w);
    return rc;
}
