/* The state of lora-engine, and nothing else: no file's functions are declared here. Each file has
 * one job and a header of its own, and calls flow one way, from each level to the levels below
 * it, never up and never across (a file includes only its own header and those below it;
 * tests/layout/check_calls checks every call and include):
 *
 *   0 main.c       options, start-up (setup of the ranks, the start-up adapters), teardown
 *   1 loop.c       the poll loop: reads every socket, runs a step when there is work, publishes
 *   2 step.c       one scheduled step
 *   2 control.c    the control socket's commands
 *   3 loads.c      runtime adapter loads that finish while the engine steps
 *   4 adapters.c   adapter operations on every rank: load, register, unload, pin, reload
 *   5 frontends.c  frontend peers, requests and aborts, outputs
 *   5 workers.c    the worker group: hellos and setup, exchanges (broadcast and gather),
 *                  liveness, notifications, asynchronous operations, a dead rank and its
 *                  replacement
 *   6 publish.c    every encoding and send on the sockets (PUB, and the three ROUTERs)
 *   7 registry.c   the adapter table and the registry file
 *   7 lograte.c    rate-limited warnings
 *
 * What a lower file must report upward it leaves in this state, for the higher file to act on
 * in its own next call: a dead rank sets fail_due (loop.c fails every request and load in
 * flight), an asynchronous operation's replies wait in workers' op table (loads.c asks), a new
 * process for a dead rank waits in newcomer (the next workers_poll sets it up). Fields below are
 * grouped by the file that owns them. */
#ifndef LORA_ENGINE_H
#define LORA_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h"
#include "base/exit_codes.h"
#include "runtime/emit.h"
#include "runtime/generation_config.h"
#include "sched/registry_file.h"
#include "sched/scheduler.h"
#include "wire/msg.h"
#include "wire/sock.h"

#define ENGINE_MAX_WORLD     16
#define ENGINE_MAX_FRONTENDS 64
#define ENGINE_MAX_ADAPTERS  1024
#define ENGINE_NAME_MAX      255
#define ENGINE_MAX_LOADS     16 /* runtime adapter loads in flight at once */

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
#define LOGRATE_BURST     5
#define LOGRATE_WINDOW_MS 10000

struct eng_lograte {
    const char *what; /* for the summary: "malformed control messages" */
    uint64_t window_start_ms;
    int n_logged;    /* in the current window */
    uint64_t n_held; /* not logged in the current window */
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
    struct lora_emit_rules rules; /* when it ends: max/min_tokens, EOS, stop_ids (runtime/emit) */
    int32_t banned[24]; /* EOS (unless ignore_eos) and stop ids: masked before min_tokens */
    int n_banned;
    int32_t *allowed; /* allowed_token_ids, (n_allowed); NULL: any token */
    int n_allowed;
    double arrival;          /* QUEUED, Unix time */
    double scheduled_at;     /* the first SCHEDULED, 0 before */
    double first_token_at;   /* 0 before the first token */
    const char *error_code;  /* with an error output: "not_found", "invalid" or "unavailable" */
    float *prompt_lps;       /* (n_prompt), filled as prefill chunks run */
    int32_t *prompt_ranks;   /* (n_prompt), beside prompt_lps; [0] is 0 */
    int prompt_top_n;        /* the top tokens of each prompt position wanted, or 0 */
    int32_t *prompt_top_ids; /* (n_prompt * prompt_top_n), row 0 unused */
    float *prompt_top_lps;
    bool sent_first;
};

/* A runtime adapter load in flight (loads.c): its ADD runs on every rank as an asynchronous
 * operation of workers.c (op_id); the asker is answered once every rank has replied. */
struct eng_load {
    bool used;
    uint64_t op_id;
    char name[ENGINE_NAME_MAX + 1];
    char path[4096];
    uint64_t deadline_ms;
    uint64_t ctl_id;
    unsigned char rid[LORA_SOCK_MAX_RID];
    size_t rid_len;
};

/* An adapter operation sent to every rank whose replies are taken wherever worker traffic is read
 * (workers.c): the file that started it asks for the result in its own next call. */
struct eng_op {
    bool used;
    uint64_t op_id;
    bool replied[ENGINE_MAX_WORLD];
    int n_replied;
    char err[512]; /* the first rank's error */
};

struct engine {
    /* Options (main.c). */
    const char *model;
    struct lora_generation_config gen; /* reported in the config reply */
    int engine_index;
    int world;
    int max_loras, max_cpu_loras, max_lora_rank;
    int block_size;
    /* The KV budget of each rank (--kv-cache-bytes, or --kv-cache-fraction or
     * --gpu-memory-utilization when above 0) and the
     * cap on its blocks (--num-kv-blocks, 0: none); num_kv_blocks is the smallest count the ranks
     * reported in setup_done (workers.c), the size of the scheduler's block manager. */
    uint64_t kv_cache_bytes;
    double kv_cache_fraction;
    double gpu_memory_utilization;
    bool async_activate; /* every rank copies adapters into slots alongside its steps */
    int kv_blocks_cap;
    int num_kv_blocks;
    int max_num_batched_tokens, max_num_seqs, max_model_len;
    int max_requests;
    int idle_ms;
    uint64_t seed; /* vLLM's --seed: unseeded requests draw from seed + their engine id */
    int startup_timeout_ms;
    int publish_interval_ms;
    int vocab_size;
    int32_t eos_ids[8];
    int n_eos;

    /* The sockets (main.c opens them; publish.c sends on them, the others read). */
    void *zctx;
    struct lora_sock *front, *work, *ctl, *pub;
    int sig_fd;
    char shm[64];

    /* Health (workers.c). A rank found dead sets fail_due and fail_why: loop.c then fails every
     * request and load in flight, in its own next call. */
    bool healthy;
    bool stopping; /* a signal asked to stop: exchanges end, nothing more is started */
    char unhealthy_reason[256];
    bool fail_due;
    char fail_why[256];

    /* workers.c: the ranks, their last gathered state (msgpack bytes of a residency_reply) and
     * whether they agree, the asynchronous operations in flight. */
    struct eng_peer workers[ENGINE_MAX_WORLD];
    char *rank_state[ENGINE_MAX_WORLD];
    size_t rank_state_len[ENGINE_MAX_WORLD];
    int disagreement; /* adapters whose level differs between ranks */
    uint64_t rank_dropped[ENGINE_MAX_WORLD];
    uint64_t last_gather_ms;
    uint64_t next_op;
    struct eng_op ops[ENGINE_MAX_LOADS];
    struct lora_msg_arena *workers_arena, *ops_arena;
    /* A new process for a dead rank, set up in its place by the next workers_poll, once the loop
     * has failed what the rank had in flight. */
    struct {
        bool due;
        int rank;
        int64_t pid;
        unsigned char rid[LORA_SOCK_MAX_RID];
        size_t rid_len;
    } newcomer;
    /* The load and activate timings gathered before ready (names owned here), carried in every
     * "ready" so that a subscriber that joins later still counts the start-up loads. */
    struct lora_msg_startup_load *startup_loads;
    int n_startup_loads;
    bool ready;

    /* frontends.c: the peers and the requests. */
    struct eng_peer frontends[ENGINE_MAX_FRONTENDS];
    struct eng_request *reqs;
    uint64_t next_id;
    struct lora_msg_arena *frontends_arena;

    /* registry.c and adapters.c: the adapter table (the one source of truth, docs/design.md,
     * "Residency"). */
    struct eng_adapter adapters[ENGINE_MAX_ADAPTERS];
    uint64_t next_seq;
    int n_unloading; /* adapters waiting for a plan to release them: a step is due */
    /* The registry file (NULL: none), written after every change once start-up is done; the
     * start-up adapter names it has taken in (only its startup list is used). */
    const char *registry_path;
    bool registry_live;
    struct lora_registry startup_seen;

    /* loads.c */
    struct eng_load loads[ENGINE_MAX_LOADS];

    /* control.c */
    struct lora_msg_arena *control_arena;

    /* step.c: the scheduler, the plan and its results, the step's scratch. */
    struct lora_scheduler *sched;
    struct lora_scheduler_plan plan;
    struct lora_scheduler_result *results;
    uint64_t next_step;
    uint64_t num_preemptions;
    struct lora_msg_arena *step_arena;
    struct lora_msg_step_seq *step_seqs;
    int32_t *step_tokens;
    int32_t *step_tables;

    /* loop.c: publication times. */
    uint64_t last_publish_ms;
    bool was_busy; /* a step ran since the last idle publication */
    bool plan_empty; /* the last step planned nothing: what it waits for (a load, a copy) comes
                        by itself, so the loop polls every millisecond rather than spin */

    /* Repeated warnings (lograte.c): malformed control messages, malformed requests, refused
     * hellos. */
    struct eng_lograte log_ctl, log_front, log_hello;
};

#endif
