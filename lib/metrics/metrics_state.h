/* metrics_state: lora-metrics' model of what engines and frontends publish (docs/design.md,
 * "Metrics").
 *
 * Owns, per engine index: its config (the "ready" message), its registry, every rank's last
 * loaded state, its last stats, and the counters and histograms built from its events and from
 * the frontends' request_stats. It takes message bodies (msgpack maps, as lib/wire/msg encodes
 * them) one at a time through lora_metrics_state_apply() and never touches a socket, so the tests
 * drive it directly. It does no locking: lora-metrics holds one mutex around every call.
 *
 * Invariants a caller can rely on:
 * - Residency is derived, never last-write-wins: an adapter's level is the lowest level at which
 *   EVERY rank of the engine holds it (gpu: in a slot, cpu: in the CPU cache, which includes the
 *   slots); it is pinned when every rank pins it; it disagrees when two ranks hold it at
 *   different levels (or one holds it and another does not).
 * - An engine is ready once its config, its registry, every rank's state (a residency_reply or a
 *   notification) and a stats message have arrived; before that, and while it is lost, its
 *   gauges are not to be shown (lora_metrics_state_engine_shows_gauges()).
 * - Cardinality: an engine tracks the adapters it has registered, those any rank holds, and
 *   those with requests in its last stats, at most LORA_METRICS_STATE_MAX_ADAPTERS; an adapter that
 * is none of these any more is forgotten with its counters. Request ids are never stored.
 * - Restarts: an engine's epoch ends (its counters, histograms and state start again from zero)
 *   when the source it was heard on loses its connection (lora_metrics_state_source_lost), when its
 *   config changes (model, a limit, or an optional "start_time" key: a finite number, anything
 *   else reads as absent), when its num_preemptions goes back, or when a rank's dropped count or
 *   notification sequence number goes back. A restart is no silence: it keeps last_heard_ms.
 * - Start-up loads: the first "ready" of an epoch may carry "startup_loads", the load and
 *   activate timings the engine gathered before it was ready. They go into the load-time
 *   histograms unless this epoch saw the notification they came in live (from a rank, every
 *   sequence number from the first one seen on), and into lora_adapter_loads_total (an adapter
 *   every rank loaded, or activated, n times counts n times at that level): residency changes are
 *   never counted before the config has arrived, so neither is counted twice.
 * - Lost engines: an engine silent for longer than engine_timeout_ms (0: never) is lost; its
 *   gauges are not shown, its counters are. The first message after that asks for its whole
 *   state again (registry, every rank, stats) before its gauges return.
 * - External input never reaches an assert: a malformed body (one that does not decode, or that
 *   breaks a bound: a rank outside [0, 64), a world_size outside [1, 64], an engine index outside
 *   [0, 1000000]) is refused with a message and changes nothing but its source's counts.
 */
#ifndef LORA_METRICS_STATE_H
#define LORA_METRICS_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics/exposition.h"

struct lora_msg_arena;

#define LORA_METRICS_STATE_MAX_ENGINES  256
#define LORA_METRICS_STATE_MAX_WORLD    64 /* ranks per engine (one bit each in a uint64_t) */
#define LORA_METRICS_STATE_MAX_ADAPTERS 65536
#define LORA_METRICS_STATE_MAX_SOURCES  80

enum lora_metrics_state_level {
    LORA_LEVEL_NONE,
    LORA_LEVEL_CPU,
    LORA_LEVEL_GPU,
};

/* Finish reasons, the label values of vllm:request_success_total, in this order. */
enum lora_metrics_state_reason {
    LORA_REASON_STOP,
    LORA_REASON_LENGTH,
    LORA_REASON_ABORT,
    LORA_REASON_ERROR,
    LORA_REASON_COUNT,
};
extern const char *const lora_metrics_state_reason_names[LORA_REASON_COUNT];

/* Transitions with a load-time histogram: notification timings "load" and "activate". */
enum lora_metrics_state_transition {
    LORA_METRICS_STATE_LOAD,
    LORA_METRICS_STATE_ACTIVATE,
    LORA_METRICS_STATE_N_TRANSITIONS,
};

/* One adapter of one engine. Read-only to callers. */
struct lora_metrics_state_adapter {
    char *name;
    bool registered;                                  /* in the engine's last registry */
    uint8_t rank_level[LORA_METRICS_STATE_MAX_WORLD]; /* enum lora_metrics_state_level, per rank */
    uint64_t rank_pinned;                             /* bit r: rank r pins it */
    enum lora_metrics_state_level level;              /* held at least here by every rank */
    bool pinned;                                      /* every rank pins it */
    bool disagrees;                                   /* the ranks hold it at different levels */
    int running, waiting;                             /* its requests, from the last stats */
    bool accounted;                            /* a finished request was counted this epoch */
    uint64_t prompt_tokens, generation_tokens; /* of its finished requests, this epoch */
};

/* Histograms of one engine, each with its own buckets (see metrics_state.c). */
enum lora_metrics_state_hist {
    LORA_H_TTFT,
    LORA_H_ITL,
    LORA_H_E2E,
    LORA_H_QUEUE,
    LORA_H_PREFILL,
    LORA_H_DECODE,
    LORA_H_INFERENCE,
    LORA_H_PROMPT_TOKENS,     /* buckets 1, 2, 5, 10, ... up to max_model_len */
    LORA_H_GENERATION_TOKENS, /* the same */
    LORA_H_MAX_TOKENS,        /* the same */
    LORA_H_ITERATION_TOKENS,
    LORA_H_STEP_ADAPTERS,
    LORA_H_LOAD_SECONDS,     /* transition "load" */
    LORA_H_ACTIVATE_SECONDS, /* transition "activate" */
    LORA_H_COUNT,
};

/* One engine. Read-only to callers. */
struct lora_metrics_state_engine {
    int index;
    int source;       /* the source it was last heard on, or -1 */
    bool from_engine; /* heard from the engine itself, not only from frontends */
    uint64_t epoch;   /* restarts seen so far */
    uint64_t last_heard_ms;
    /* config, from "ready" */
    bool has_config;
    char *model;
    double start_time; /* optional "start_time" of ready, 0 when absent */
    int max_loras, max_cpu_loras, max_lora_rank, block_size, num_kv_blocks, world_size;
    int max_model_len;
    /* state */
    bool has_registry;
    uint64_t rank_known; /* bit r: rank r's state has arrived */
    bool has_stats;
    int running, waiting;
    double kv_usage;
    uint64_t num_preemptions;
    bool has_dropped[LORA_METRICS_STATE_MAX_WORLD];
    uint64_t
        dropped[LORA_METRICS_STATE_MAX_WORLD]; /* notifications a rank dropped since it started */
    uint64_t last_seq[LORA_METRICS_STATE_MAX_WORLD]; /* highest notification sequence number seen */
    uint64_t first_seq[LORA_METRICS_STATE_MAX_WORLD]; /* the first one seen this epoch; 0: none */
    /* adapters, sorted by name (strcmp) */
    struct lora_metrics_state_adapter **adapters;
    int n_adapters, cap_adapters;
    int n_gpu, n_cpu, n_disagree; /* derived from the ranks' states */
    /* counters, this epoch */
    uint64_t success[LORA_REASON_COUNT];
    uint64_t prompt_tokens, generation_tokens;
    uint64_t loads[2], evictions[2]; /* [0] level cpu, [1] level gpu */
    struct lora_exposition_histogram hist[LORA_H_COUNT];
    double *size_bounds; /* the 1-2-5 bounds of the token histograms, owned */
};

struct lora_metrics_state_options {
    bool inflight;              /* --lora-info=inflight */
    const char *model_name;     /* overrides the engines' model (borrowed), or NULL */
    uint64_t engine_timeout_ms; /* 0: an engine is never lost */
};

enum lora_metrics_state_source_kind {
    LORA_SOURCE_ENGINE,   /* an engine's publish socket */
    LORA_SOURCE_FRONTEND, /* a frontend's publish socket */
    LORA_SOURCE_STDIN,    /* a stream of bodies: any engine, any frontend */
};

struct lora_metrics_state_source {
    char *name; /* the endpoint, or "stdin" */
    enum lora_metrics_state_source_kind kind;
    uint64_t last_heard_ms; /* 0: never */
    uint64_t n_messages, n_malformed, n_lost;
    bool ended; /* stdin: end of input, or input that cannot be framed */
    char *why;  /* why it ended, or NULL */
};

struct lora_metrics_state {
    struct lora_metrics_state_options o;
    struct lora_metrics_state_engine **engines; /* sorted by index */
    int n_engines;
    struct lora_metrics_state_source sources[LORA_METRICS_STATE_MAX_SOURCES];
    int n_sources;
    uint64_t n_refused;           /* messages dropped for a bound (engines, adapters) */
    struct lora_msg_arena *arena; /* decoded bodies, reset by every lora_metrics_state_apply() */
};

struct lora_metrics_state *lora_metrics_state_new(const struct lora_metrics_state_options *o);
void lora_metrics_state_destroy(struct lora_metrics_state **s);

/* Registers a source (name copied); returns its id, or -1 (full, ENOMEM). */
int lora_metrics_state_add_source(struct lora_metrics_state *s, const char *name,
                                  enum lora_metrics_state_source_kind kind);

/* Applies one message body received on source at now_ms (lora_clock_mono_ms()). Returns 1 when it
 * changed the model, 0 for a type of no interest here (heartbeat, ...), -1 when the body is
 * malformed or breaks a bound, with "TYPE: what" in err. */
int lora_metrics_state_apply(struct lora_metrics_state *s, int source, const void *body, size_t len,
                             uint64_t now_ms, char *err, size_t err_len);

/* The source's connection broke: every engine last heard on it ends its epoch. */
void lora_metrics_state_source_lost(struct lora_metrics_state *s, int source, uint64_t now_ms);

/* The source will say nothing more (why: "end of input", ...; copied). */
void lora_metrics_state_source_ended(struct lora_metrics_state *s, int source, const char *why);

/* The engine with that index, or NULL. */
const struct lora_metrics_state_engine *
lora_metrics_state_engine(const struct lora_metrics_state *s, int index);

/* Whether the engine was silent for longer than the timeout. */
bool lora_metrics_state_engine_is_lost(const struct lora_metrics_state *s,
                                       const struct lora_metrics_state_engine *e, uint64_t now_ms);
/* Whether its whole state has arrived (config, registry, every rank, stats). */
bool lora_metrics_state_engine_is_ready(const struct lora_metrics_state_engine *e);
/* Ready and not lost: its gauges are true now. */
bool lora_metrics_state_engine_shows_gauges(const struct lora_metrics_state *s,
                                            const struct lora_metrics_state_engine *e,
                                            uint64_t now_ms);
/* The model_name label: --model-name, else the config's model; NULL when neither is known. */
const char *lora_metrics_state_model_name(const struct lora_metrics_state *s,
                                          const struct lora_metrics_state_engine *e);

/* The two label values of vllm:lora_requests_info, names sorted and comma-joined (see the
 * man page for the two meanings). *running and *waiting are the caller's to free. 0 or -1. */
int lora_metrics_state_lora_sets(const struct lora_metrics_state *s,
                                 const struct lora_metrics_state_engine *e, char **running,
                                 char **waiting);

/* Whether adapter a belongs in the default running set: registered and in a slot on every rank. */
bool lora_metrics_state_adapter_is_ready(const struct lora_metrics_state_adapter *a);

/* Health: true when every engine source was heard from within the timeout and every engine heard
 * is ready and not lost. Writes "ok" or one line per problem into buf (truncated at size). */
bool lora_metrics_state_health(const struct lora_metrics_state *s, uint64_t now_ms, char *buf,
                               size_t size);

#endif
