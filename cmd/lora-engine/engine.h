/* The state of lora-engine, shared by its files: main.c (options, start-up, the loop),
 * workers.c (the worker group: setup, broadcast and gather, notifications), step.c (one
 * scheduled step: activations, the step, outputs, events and stats), frontends.c (requests,
 * aborts, outputs), control.c (the control socket: residency, config, health, adapters),
 * lograte.c (repeated log lines counted and summarised). */
#ifndef LORA_ENGINE_H
#define LORA_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h"
#include "runtime/generation_config.h"
#include "wire/msg.h"
#include "sched/registry_file.h"
#include "sched/scheduler.h"
#include "wire/sock.h"

#include "base/exit_codes.h"

#define ENGINE_MAX_WORLD 16
#define ENGINE_MAX_FRONTENDS 64
#define ENGINE_MAX_ADAPTERS 1024
#define ENGINE_NAME_MAX 255
#define ENGINE_MAX_LOADS 16 /* runtime adapter loads in flight at once */

struct eng_peer {
    unsigned char rid[LORA_SOCK_MAX_RID];
    size_t rid_len;
    bool present;
    int64_t pid; /* workers: from their hello, to tell a repeated hello from a restart */
    struct lora_peer_liveness live;
    bool lost; /* workers: declared dead; a new process for the rank may take its place */
};

/* A log line that may repeat without bound (malformed input from a peer): at most
 * LOGRATE_BURST lines per LOGRATE_WINDOW_MS, then one line that says how many more there were. */
#define LOGRATE_BURST 5
#define LOGRATE_WINDOW_MS 10000

struct eng_lograte {
    const char *what; /* for the summary: "malformed control messages" */
    uint64_t window_start_ms;
    int n_logged;      /* in the current window */
    uint64_t n_held;   /* not logged in the current window */
};

struct eng_adapter {
    bool used;
    int id; /* index + 1: 0 is the base model */
    char name[ENGINE_NAME_MAX + 1];
    char path[4096];
    uint64_t seq; /* registration order, for the registry file */
    bool pinned;
    bool cached; /* every rank holds it in its CPU cache (from the last gathered states) */
    /* An unload that waits for running requests: the asker's control reply is sent once the
     * adapter is gone from every rank. */
    bool unload_reply_due;
    bool unloading; /* removed, still on the ranks until a plan releases it (n_unloading) */
    uint64_t unload_ctl_id;
    unsigned char unload_rid[LORA_SOCK_MAX_RID];
    size_t unload_rid_len;
};

struct eng_request {
    bool used;
    uint64_t id;
    char request_id[ENGINE_NAME_MAX + 1];
    int frontend; /* index into frontends */
    int adapter_id;
    int32_t *tokens; /* prompt then generated, (n_prompt + max_tokens) */
    int n_prompt;
    int n_generated;
    int max_tokens;
    int min_tokens;
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    int logprobs;
    bool prompt_logprobs;
    bool ignore_eos;
    int32_t stop_ids[16];
    int n_stop;
    int32_t banned[24]; /* EOS (unless ignore_eos) and stop ids: masked before min_tokens */
    int n_banned;
    int32_t *allowed; /* allowed_token_ids, (n_allowed); NULL: any token */
    int n_allowed;
    double arrival;        /* QUEUED, Unix time */
    double scheduled_at;   /* the first SCHEDULED, 0 before */
    double first_token_at; /* 0 before the first token */
    const char *error_code; /* with an error output: "not_found", "invalid" or "unavailable" */
    float *prompt_lps; /* (n_prompt), filled as prefill chunks run */
    int32_t *prompt_ranks; /* (n_prompt), beside prompt_lps; [0] is 0 */
    int prompt_top_n;      /* the top tokens of each prompt position wanted, or 0 */
    int32_t *prompt_top_ids; /* (n_prompt * prompt_top_n), row 0 unused */
    float *prompt_top_lps;
    bool sent_first;
};

/* A runtime adapter load in flight (loads.c): sent to every rank, answered to the asker once every
 * rank has replied. */
struct eng_load {
    bool used;
    uint64_t op_id;
    char name[ENGINE_NAME_MAX + 1];
    char path[4096];
    bool replied[ENGINE_MAX_WORLD];
    int n_replied;
    char err[512]; /* the first rank's error */
    uint64_t deadline_ms;
    uint64_t ctl_id;
    unsigned char rid[LORA_SOCK_MAX_RID];
    size_t rid_len;
};

struct engine {
    /* Options. */
    const char *model;
    struct lora_generation_config gen; /* reported in the config reply */
    int engine_index;
    int world;
    int max_loras, max_cpu_loras, max_lora_rank;
    int block_size, num_kv_blocks;
    int max_num_batched_tokens, max_num_seqs, max_model_len;
    int idle_ms;
    uint64_t seed; /* vLLM's --seed: unseeded requests draw from seed + their engine id */
    int startup_timeout_ms;
    int vocab_size;
    int eos_ids[8];
    int n_eos;

    void *zctx;
    struct lora_sock *front, *work, *ctl, *pub;
    int sig_fd;
    char shm[64];

    struct eng_peer workers[ENGINE_MAX_WORLD];
    struct eng_peer frontends[ENGINE_MAX_FRONTENDS];
    bool healthy;
    bool stopping; /* a signal asked to stop: exchanges end, nothing more is started */
    int n_unloading; /* adapters waiting for a plan to release them: a step is due */
    /* Repeated warnings: malformed control messages, malformed requests, refused hellos. */
    struct eng_lograte log_ctl, log_front, log_hello;
    char unhealthy_reason[256];

    struct eng_adapter adapters[ENGINE_MAX_ADAPTERS];
    struct eng_load loads[ENGINE_MAX_LOADS];
    struct lora_msg_arena *load_arena; /* decodes the ranks' replies to loads in flight */
    uint64_t next_seq;
    /* The registry file (NULL: none), written after every change once start-up is done; the
     * start-up adapter names it has taken in (only its startup list is used). */
    const char *registry_path;
    bool registry_live;
    struct lora_registry startup_seen;
    /* The load and activate timings gathered before ready (names owned here), carried in every
     * "ready" so that a subscriber that joins later still counts the start-up loads. */
    struct lora_msg_startup_load *startup_loads;
    int n_startup_loads;
    bool ready;
    struct lora_scheduler *sched;
    struct lora_scheduler_plan plan;
    struct lora_scheduler_result *results;
    struct eng_request *reqs;
    int max_requests;
    uint64_t next_id;
    uint64_t next_op;
    uint64_t next_step;
    uint64_t num_preemptions;

    /* The last gathered state of every rank, as msgpack bytes of lora_msg_state, and whether
     * the ranks agree. */
    char *rank_state[ENGINE_MAX_WORLD];
    size_t rank_state_len[ENGINE_MAX_WORLD];
    int disagreement; /* adapters whose level differs between ranks */
    uint64_t rank_dropped[ENGINE_MAX_WORLD];
    uint64_t last_gather_ms;
    int publish_interval_ms;
    uint64_t last_publish_ms;
    bool was_busy; /* a step ran since the last idle publication */

    struct lora_buf out;
    struct lora_msg_arena *arena;
    /* Step scratch. */
    struct lora_msg_step_seq *step_seqs;
    int32_t *step_tokens;
    int32_t *step_tables;
};

/* The limits the engine announces (ready) and imposes (setup). */
void engine_limits(const struct engine *e, struct lora_msg_limits *l);

/* workers.c */
/* 0 set up, 1 stopped by a signal, 2 a rank refused the model, -1 failed (err). */
int workers_wait_setup(struct engine *e, char *err, size_t err_len);
int workers_broadcast(struct engine *e, const struct lora_msg_bin *bins, int n_bins);
/* Receives one reply of type from every rank into replies[rank] (frames the caller releases).
 * Other traffic is handled; a dead rank or the timeout fails it. */
int workers_gather(struct engine *e, enum lora_msg_type type, struct lora_msg_frames *replies,
                   int timeout_ms, char *err, size_t err_len);
void workers_release(struct engine *e, struct lora_msg_frames *replies);
int workers_adapter_op(struct engine *e, enum lora_adapter_op op, const char *name,
                       const char *path, int slot, char *err, size_t err_len);
int workers_gather_notifications(struct engine *e);
void workers_mark_dead(struct engine *e, const char *why);
/* Whether a rank that died can be replaced by a new worker process without restarting the
 * engine: with one rank (several ranks share an all-reduce group a newcomer cannot join). */
bool workers_can_readmit(const struct engine *e);
/* A hello outside start-up: a repeat is ignored, a newcomer for a rank held by a live worker is
 * refused (setup_done not ok, and a log line), a newcomer for a dead rank is set up in its place
 * with the registered adapters when the engine can re-admit it. In_exchange: called while
 * gathering replies, when nothing may be set up; returns 1 when the hello ends the exchange (its
 * rank's process was replaced), else 0. */
int workers_hello(struct engine *e, const struct lora_msg_frames *f, bool in_exchange);
void workers_heard(struct engine *e, const struct lora_msg_frames *f);
/* Every rank's last gathered state, decoded into e->arena. */
int engine_rank_states(struct engine *e, struct lora_msg_residency_reply *out);

/* Takes a rank's reply to a load in flight (loads.c); false when it is not one. */
bool workers_take_load_reply(struct engine *e, const struct lora_msg_frames *f);

/* adapters (control.c) */
/* Loads an adapter on every rank and registers it, waiting for the ranks (start-up). */
int adapters_load(struct engine *e, const char *name, const char *path, char *err, size_t len);
/* Whether NAME and PATH can be registered: a valid name not taken or being loaded, room left. */
int adapters_check_new(struct engine *e, const char *name, const char *path, char *err,
                       size_t len);
/* Registers an adapter every rank has loaded: scheduler, a slot when one is free, registry. */
int adapters_register(struct engine *e, const char *name, const char *path, char *err,
                      size_t len);
/* 0 unloaded, 1 unloading once its running requests finish, -1 failed (err). */
int adapters_unload(struct engine *e, const char *name, char *err, size_t len);
/* Whether the adapter is being unloaded (gone for new requests, still on the ranks). */
bool adapters_is_removing(struct engine *e, const struct eng_adapter *ad);
/* Sends a control reply to the asker rid. */
void control_reply_send(struct engine *e, const void *rid, size_t rid_len, uint64_t id,
                        const char *err, const void *data, size_t data_len);
int adapters_pin(struct engine *e, const char *name, bool pin, char *err, size_t len);
struct eng_adapter *adapters_find(struct engine *e, const char *name);
/* Writes the registry file, when there is one and start-up is done; a failure is logged. */
void registry_save(struct engine *e);
/* Follows the gathered states: an adapter a rank dropped from its CPU cache waits for a reload. */
void adapters_sync_cached(struct engine *e);
/* Reloads, from disk, registered adapters that requests wait for and no rank caches. */
void adapters_reload_wanted(struct engine *e);
int control_handle(struct engine *e, const struct lora_msg_frames *f);

/* loads.c: runtime loads that finish while the engine steps. */
/* Sends ADD to every rank; 0: the asker (rid, ctl_id) is answered when it finishes; -1: err. */
int loads_begin(struct engine *e, const char *name, const char *path, const void *rid,
                size_t rid_len, uint64_t ctl_id, char *err, size_t len);
bool loads_pending(const struct engine *e, const char *name);
/* Records rank r's reply to a load in flight; false when f answers none. */
bool loads_take_reply(struct engine *e, int r, const struct lora_msg_frames *f);
/* Finishes the loads every rank has answered, and those past their deadline (the loop). */
void loads_finish_ready(struct engine *e, uint64_t now_ms);
/* Fails every load in flight with why (a rank died, the engine stops). */
void loads_fail_all(struct engine *e, const char *why);

/* frontends.c */
int frontends_handle(struct engine *e, const struct lora_msg_frames *f);
/* Forgets frontends silent for 3 s (aborting their requests), then sends heartbeats. */
void frontends_heartbeat(struct engine *e);
/* Only sends the heartbeats due: safe while a step is in flight and frontends are not read. */
void frontends_send_heartbeats(struct engine *e);
int frontends_send_output(struct engine *e, struct eng_request *r, int n_new, const float *lps,
                          const int32_t *top_ids, const float *top_lps, int top_n,
                          bool finished, const char *reason, const char *error);
void requests_fail_all(struct engine *e, const char *why);
void request_release(struct engine *e, struct eng_request *r);
/* Publishes a lifecycle event and records its time in r (the first SCHEDULED). */
void publish_event(struct engine *e, struct eng_request *r, enum lora_event_kind kind,
                   const char *reason);
void publish_body(struct engine *e, const char *topic);
/* Encodes this engine's ready message (version, index, model, limits) into e->out. */
int encode_ready(struct engine *e);
void registry_broadcast(struct engine *e);
/* The registry on the publish socket, and to every frontend when to_frontends. */
void registry_broadcast_to(struct engine *e, bool to_frontends);
/* publish.c: limits, registry, every rank's state and, when idle, the request counts. */
void publish_state(struct engine *e, bool idle);

/* lograte.c: fmt is a whole line without "lora-engine: warning: " and the newline. */
void lograte_warn(struct eng_lograte *lr, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Says how many lines the window held back, once it is over (call it from the loop). */
void lograte_flush(struct eng_lograte *lr, uint64_t now_ms);

/* step.c */
bool step_has_work(const struct engine *e);
int step_run(struct engine *e);

#endif
