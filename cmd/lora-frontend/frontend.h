/* The state of lora-frontend, shared by its files: main.c (options, start-up, the loop),
 * link.c (the engine connection: one thread owns every ZeroMQ socket; HTTP threads hand it
 * messages and wait on condition variables), seq.c (what the engine sent for one request),
 * routes.c (HTTP dispatch, authentication, models, tokenize, health, version), completions.c
 * (completions and chat: validation, choices, stop strings, whole responses), sse.c (the same
 * streamed as server-sent events), adapters.c (runtime load and unload under --lora-root),
 * reply.c (JSON responses and OpenAI-style errors), stats.c (per-request stats), metrics.c
 * (GET /metrics: the exposition of lora-metrics, from the engine's publish socket and this
 * frontend's own requests). */
#ifndef LORA_FRONTEND_H
#define LORA_FRONTEND_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h"
#include "text/chat_template.h"
#include "runtime/generation_config.h"
#include "base/cli.h"
#include "metrics/exposition.h"
#include "http/http.h"
#include "metrics/metrics_state.h"
#include "wire/msg.h"
#include "text/tokenizer.h"

#include "base/exit_codes.h"

#define FE_ID_MAX     96   /* bytes of an engine request id */
#define FE_NAME_MAX   255  /* adapter and model names */
#define FE_MAX_N      128  /* choices per request (n), times prompts */
#define FE_MAX_STOP   16   /* stop strings */
#define FE_STOP_BYTES 1024 /* bytes of one stop string */
#define FE_MAX_LOGPROBS 20 /* top log-probabilities per token */
#define FE_PROMPT_TEXT_FACTOR 4 /* see prompt_max_bytes in main.c */

/* A prompt's log-probabilities as the engine sent them: n positions, [0] NaN (nothing predicts
 * the first token). */
struct fe_prompt_lps {
    float *lps;       /* (n) */
    int32_t *ranks;   /* (n) or NULL; [0] is 0 */
    int n;
    int top_n;        /* the top tokens of each position, or 0 */
    int32_t *top_ids; /* (n * top_n) */
    float *top_lps;   /* (n * top_n) */
};

/* One engine request (one choice). The link thread appends to it under link->mu; the HTTP
 * thread that made it reads it under the same lock. */
struct fe_seq {
    char id[FE_ID_MAX];
    pthread_cond_t *cond; /* the waiting HTTP thread's, signalled on every change */
    struct fe_seq *next; /* hash chain */
    int32_t *tokens;     /* (n) generated tokens */
    float *lps;          /* (n) their log-probabilities */
    int32_t *top_ids;    /* (n * top_n) */
    float *top_lps;      /* (n * top_n) */
    int top_n;
    size_t n, cap;
    struct fe_prompt_lps prompt;
    bool finished;
    char finish_reason[16];
    char error[512];
    char error_code[16];
    int num_prompt_tokens;
    double queued, scheduled, first_token, finished_at; /* engine times, 0 when unknown */
    double first_seen; /* our wall time of the first token */
    double last_recv;  /* our wall time of the latest output */
    double sent_at;    /* our wall time of the request sent to the engine, 0 before */
};

/* An engine silent this long is lost to /metrics (its gauges go), as lora-metrics' default. */
#define FE_METRICS_ENGINE_TIMEOUT_MS 5000

struct fe_pending;

/* The model behind GET /metrics (metrics.c). Locks: mu (held by a render, or by the link
 * thread applying messages) before queue_mu (held only to link or unlink the queue). */
struct fe_metrics {
    pthread_mutex_t mu;
    struct lora_metrics_state *state; /* under mu */
    struct lora_exposition w;        /* under mu; kept across scrapes: its buffers keep their size */
    int engine_src, self_src;  /* the state's sources: the engine's publish socket, us */
    uint64_t n_malformed;      /* under mu: messages refused, for the warning's rate limit */
    long test_render_delay_ms; /* LORA_FRONTEND_TEST_RENDER_DELAY_MS, for the tests: 0 */
    /* Messages that found mu taken, in order; under queue_mu. */
    pthread_mutex_t queue_mu;
    struct fe_pending *head, *tail;
    int n_pending;
    uint64_t queued_ms;  /* when the oldest of them was queued */
    uint64_t n_deferred; /* messages queued so far */
    uint64_t max_lag_ms; /* the longest any of them waited */
    /* The link thread's alone. */
    uint64_t n_blocked;      /* times it waited for mu (a full queue) */
    uint64_t max_blocked_us; /* the longest of those waits */
};

struct fe_registry_entry {
    char name[FE_NAME_MAX + 1];
    char path[4096];
};

/* The engine connection. Fields under mu unless noted. */
struct fe_link {
    pthread_mutex_t mu;
    void *zctx;
    struct lora_sock *front, *ctl, *pub; /* link thread only */
    struct lora_sock *sub;  /* the engine's publish socket, for /metrics; link thread only */
    struct fe_metrics *metrics; /* set before the link runs; fed by the link thread */
    int wake_fd;                         /* eventfd: HTTP threads -> link thread */
    struct fe_out *out_head, *out_tail;  /* messages to send */
    struct fe_seq *table[1024];          /* in-flight requests by id */
    int n_inflight;
    struct fe_ctl_wait *ctl_waits;
    uint64_t next_ctl_id;
    bool connected; /* ready received and the engine alive */
    struct lora_msg_limits limits;
    int engine_index;
    char model[4096];
    struct fe_registry_entry *registry;
    int n_registry;
    uint64_t registry_version; /* bumped on every registry message */
    pthread_cond_t registry_cond;
};

struct frontend {
    /* Options. */
    const char *served_name; /* the base model's name in the API */
    const char *model_dir;
    const char *api_key; /* NULL: no key */
    const char *lora_root; /* realpath of --lora-root, or NULL */
    bool lora_allow_symlinks; /* links under lora_root that stay under it are accepted */
    bool runtime_lora;
    int max_pending; /* engine requests in flight before 503 */
    const char *version;
    /* Defaults for fields a request leaves out (--generation-config). */
    struct lora_generation_config gen;
    /* Start-up adapters' base_model_name (JSON form of --lora-modules), for /v1/models. */
    struct {
        char name[FE_NAME_MAX + 1];
        char base[FE_NAME_MAX + 1];
    } module_base[64];
    int n_module_base;
    struct lora_tokenizer *tok; /* NULL: token-id prompts only */
    struct lora_chat_template chat;
    bool has_chat;
    char chat_error[1024]; /* why there is no chat template */
    char bos[64], eos[64];
    int32_t eos_id; /* the tokenizer's EOS, added to the stop ids; -1 when none */
    size_t prompt_max_bytes; /* longer prompt text is refused before tokenizing */
    struct fe_link link;
    struct fe_metrics metrics;
    uint64_t id_prefix; /* random, per process: request ids are unique across frontends */
    _Atomic uint64_t next_id; /* request ids taken by many HTTP threads */
    double start_time;
};

/* link.c */
/* engine_publish_ep may be NULL (then /metrics has only this frontend's requests). */
int link_init(struct fe_link *l, void *zctx, const char *frontend_ep, const char *control_ep,
              const char *publish_ep, const char *engine_publish_ep, struct fe_metrics *metrics,
              char *err, size_t err_len);
void link_release(struct fe_link *l);
/* Runs the link until a signal arrives on sig_fd; returns the signal. */
int link_run(struct fe_link *l, int sig_fd);
/* Waits until the engine answered hello, at most timeout_ms. */
/* A copy of the engine's limits, taken under the link's lock: an engine restart rewrites them
 * while HTTP threads read. */
struct lora_msg_limits fe_link_limits(const struct fe_link *l);

/* Copies the engine's model directory into buf (len bytes) under the link's lock. */
void fe_link_model(const struct fe_link *l, char *buf, size_t len);

bool link_wait_ready(struct fe_link *l, int timeout_ms);
/* Registers seq and queues the request for the engine (m->request_id must be seq->id).
 * Returns 0, or -1 with err when the engine is not connected or too much is in flight. */
int link_submit(struct fe_link *l, struct fe_seq *seq, const struct lora_msg_request *m,
                int max_pending, char *err, size_t err_len);
/* Forgets seq (aborting it in the engine when it has not finished) and frees it. */
void link_forget(struct fe_link *l, struct fe_seq **seq);
/* Waits on cond under l->mu (held by the caller) for a change, at most timeout_ms. */
void link_wait_locked(struct fe_link *l, pthread_cond_t *cond, int timeout_ms);
/* One control command; blocks for the reply up to timeout_ms. Returns 0 ok, -1 failed with
 * the engine's message (or a timeout) in err. data (msgpack, caller frees) may be NULL. */
int link_control(struct fe_link *l, enum lora_control_op op, const char *name, const char *path,
                 int timeout_ms, char **data, size_t *data_len, char *err, size_t err_len);
/* Queues one message for the publish socket under topic (copied); a request_stats message
 * (topic "request") also goes into /metrics. */
void link_publish(struct fe_link *l, const char *topic, const void *body, size_t len);
/* Whether the registry names the adapter (under mu). */
bool link_registry_has_locked(struct fe_link *l, const char *name);
/* Waits until the registry has (or has not) name, at most timeout_ms. */
bool link_registry_wait(struct fe_link *l, const char *name, bool present, int timeout_ms);

/* seq.c */
struct fe_seq *seq_new(const char *id);
void seq_free(struct fe_seq *s);
/* Grows the token arrays of a sequence (or of a copy of one) to hold need tokens: ids and lps,
 * and top_ids and top_lps (top_n per token) when top_n > 0; doubling from 64. Returns 0, or -1
 * (out of memory) with *cap as it was and the arrays that grew kept. */
int seq_grow_tokens(int32_t **ids, float **lps, int32_t **top_ids, float **top_lps, size_t *cap,
                    size_t need, int top_n);
/* Copies a prompt's log-probabilities (n of them, ranks NULL when there are none, top_n per
 * position) into dst once, when dst has none and n > 0: what memory does not allow is left out
 * (no ranks, no top tokens, or nothing at all). */
void seq_copy_prompt_lps(struct fe_prompt_lps *dst, int n, const float *lps, const int32_t *ranks,
                         int top_n, const int32_t *top_ids, const float *top_lps);
void seq_free_prompt_lps(struct fe_prompt_lps *p);

/* metrics.c */
int metrics_init(struct fe_metrics *fm, bool inflight, char *err, size_t err_len);
void metrics_release(struct fe_metrics *fm);
/* The model_name label of every family (borrowed; must outlive fm). */
void metrics_set_model_name(struct fe_metrics *fm, const char *name);
/* Link thread: applies one message body of source (body NULL: the source disconnected), at
 * once when the lock is free, else queued in order. */
void metrics_feed(struct fe_metrics *fm, int source, const void *body, size_t len);
/* Link thread: applies the queue if the lock is free; whether some still wait. */
bool metrics_flush(struct fe_metrics *fm);
/* Link thread, at the end: when any message waited, one note on stderr of how many and how
 * long, and how often the link waited for the lock. */
void metrics_report(struct fe_metrics *fm);
/* Whether the engine's whole state has arrived and it is not lost. */
bool metrics_engine_ready(struct fe_metrics *fm, int engine_index);
/* GET /metrics. */
void metrics_serve(struct fe_metrics *fm, struct lora_http_request *req);

/* routes.c */
void routes_handle(void *ctx, struct lora_http_request *req);

/* completions.c and sse.c: see completions.h and sse.h. */

/* adapters.c */
void adapters_load(struct frontend *fe, struct lora_http_request *req, json_t *body);
void adapters_unload(struct frontend *fe, struct lora_http_request *req, json_t *body);
/* Loads the --lora-modules adapters the engine does not hold yet. */
int adapters_load_modules(struct frontend *fe, const struct lora_cli_opt_list *mods, char *err,
                          size_t err_len);

/* reply.c */
/* An OpenAI-style error: {"error":{"message","type","param","code"}}. */
void reply_error(struct lora_http_request *req, unsigned status, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Sends j (stolen) as the JSON body. */
void reply_json(struct lora_http_request *req, unsigned status, json_t *j);
/* The HTTP status for an engine error_code. */
unsigned reply_status_of(const char *error_code);
/* The OpenAI error type of an HTTP status ("NotFoundError" for 404). */
const char *reply_type_of(unsigned status);
/* Whether text of len bytes may be tokenized; else err says why, naming the limit. */
bool fe_prompt_fits(const struct frontend *fe, size_t len, char *err, size_t err_len);

/* stats.c: publishes one request_stats message (man/lora-stack-protocol.7) for an engine request. */
struct fe_stats {
    const char *request_id;
    const char *lora; /* NULL: the base model */
    const char *finish_reason;
    double arrival, first_token, finished;                             /* our clock */
    double queued, scheduled, engine_first_token, engine_finished; /* the engine's */
    int prompt_tokens, generation_tokens, max_tokens;
    double submit_seconds, output_seconds; /* our overhead, 0 when unknown */
};
void stats_publish(struct frontend *fe, const struct fe_stats *s);


#endif
