/* The state of `lora-worker serve`, shared by its files: serve.c (the loop and the messages),
 * serve_step.c (running a step) and serve_adapters.c (adapter commands, the loader thread and
 * notifications). One thread owns all of it except the loader's queue. */
#ifndef LORA_WORKER_SERVE_H
#define LORA_WORKER_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "runtime/adapter_cache.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "wire/notify_ring.h"
#include "wire/msg.h"
#include "runtime/sampler.h"
#include "wire/sock.h"

struct loader;

struct worker {
    int rank;
    const char *endpoint;
    void *zctx;
    struct lora_sock *sock;
    int sig_fd;
    struct lora_peer_liveness engine;
    bool engine_seen;  /* liveness counts only after the engine first answered */
    bool send_failing; /* the last send failed (its warning was given) */

    struct lora_backend *be; /* --device, opened before anything else */
    struct lora_precision precision; /* --dtype, --quantization, ... */
    enum lora_dtype kv_dtype;        /* resolved at setup */
    enum lora_dtype lora_dtype;

    /* Made by setup. */
    bool set_up;
    struct lora_msg_limits lim;
    char shm_name[256];
    struct lora_model *model;
    struct lora_kv_cache *kv;
    struct lora_forward *fwd;
    struct lora_adapter_cache *cache;
    struct lora_sampler *sampler;
    struct lora_collective *coll; /* the all-reduce group, with more than one rank */
    struct lora_notify_ring *ring;
    struct lora_adapter_cache_snapshot snap;
    uint64_t clock; /* steps run: the adapters' LRU clock */
    /* Slots whose adapter copy (asynchronous, on a GPU) is not yet seen done, and when each
     * began: their adapters count as in the slot only once it is (worker_poll_copies). */
    bool *copying;   /* (max_loras) */
    double *copy_t0; /* (max_loras) lora_clock_mono() */
    int n_copying;
    const char *lora_root;    /* --lora-root: client adapters are read beneath it */
    bool lora_allow_symlinks; /* links beneath the root are followed */
    long load_timeout_ms;     /* a load still running then is answered as failed */
    struct loader *loader;
    int n_loading; /* ADD commands queued to the loader and not yet answered */

    /* Codec scratch. */
    struct lora_buf out;
    struct lora_buf item; /* one encoded notification */
    struct lora_msg_arena *arena;

    /* Step scratch, sized from the limits at setup. */
    struct lora_seq_step *steps;
    int *first_row;
    int *tokens;
    int *tables;
    struct lora_msg_step_out *outs;
    int32_t *top_ids;
    float *top_lps;
    float *prompt_lps;
    int32_t *prompt_ranks; /* beside prompt_lps: each prompt token's vocabulary rank */
    int32_t *prompt_top_ids; /* (tokens * LORA_MSG_MAX_PROMPT_TOP) prompt positions' top ids */
    float *prompt_top_lps;   /* likewise, their log-probabilities */
    float *masked; /* (vocab) one row of logits with a sequence's banned tokens at -inf */
};

/* Sends the body in w->out (plus bins) to the engine. Returns 0 or -1 (logged). */
int worker_send(struct worker *w, const struct lora_msg_bin *bins, int n_bins);

/* serve_step.c */
int worker_step_alloc(struct worker *w, char *err, size_t err_len);
void worker_step_free(struct worker *w);
int worker_handle_step(struct worker *w, const struct lora_msg_frames *f);

/* serve_adapters.c */
int worker_adapters_start(struct worker *w, char *err, size_t err_len);
/* Returns false when a loader thread is still stuck in a read (then the model must outlive). */
bool worker_adapters_stop(struct worker *w);
int worker_handle_adapter_op(struct worker *w, const struct lora_msg_frames *f);
int worker_finish_loads(struct worker *w);
int worker_handle_take_notifications(struct worker *w);
int worker_handle_residency(struct worker *w);
/* Records the current state (and the timings since the last) as a notification. */
void worker_notify(struct worker *w);
/* The adapter cache's set_slot: fills the slot, and returns 1 while the copy goes on. */
int worker_set_slot(void *ctx, int slot, const struct lora_adapter *a, char *err, size_t err_len);
/* Takes in the copies that are done: their ACTIVATE timings, then one notification when any
 * was. */
void worker_poll_copies(struct worker *w);

#endif
