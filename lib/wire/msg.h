/* protocol: the message catalogue of lora-stack and its msgpack codec.
 *
 * Every message is [routing id, ROUTER side only] ["LORA1"] [one msgpack map] [raw binary frames],
 * PUB messages with a topic frame first (lib/wire/sock.h handles the frames). The map has "type" (a
 * string, below) and the fields of that type. Bulk arrays (token ids, block tables) travel as raw
 * little-endian int32 binary frames that the map describes, so a step costs no per-token msgpack.
 *
 * Decoders ignore unknown keys (adding a field never breaks an older peer), reject a missing or
 * mistyped required key, bound every length before using it and never assert on input: a bad
 * message yields -1 and a message naming the type and the key. Decoded strings and arrays point
 * into the decoder's arena (struct lora_msg_arena) and live until lora_msg_arena_reset().
 * Encoders append to a caller-owned growable buffer (struct lora_buf). Types only grow at the
 * end; field meanings never change. man/lora-stack-protocol.7 is this catalogue for people.
 *
 *  type                 from -> to                 fields (? = optional)           bin frames
 *  hello                worker|frontend|inspect    version role rank? world_size?  -
 *                       -> engine                  pid name?
 *  ready                engine -> peer, and PUB    version engine_index model      -
 *                       "config" periodically
 *                                                  max_loras max_cpu_loras
 *                                                  max_lora_rank block_size
 *                                                  num_kv_blocks world_size
 *                                                  max_model_len vocab_size
 *                                                  startup_loads?
 *                                                  (num_kv_blocks: the smallest
 *                                                  kv_blocks of the ranks)
 *  heartbeat            any -> any                 -                               -
 *  setup                engine -> worker           model rank limits (as ready;    -
 *                                                  num_kv_blocks: the cap, 0 none)
 *                                                  shm? kv_cache_bytes?
 *                                                  kv_cache_fraction?
 *                                                  gpu_memory_utilization?
 *  setup_done           worker -> engine           ok error? rank weight_bytes     -
 *                                                  kv_blocks? memory_total?
 *                                                  memory_free? async_activate?
 *  step                 engine -> worker           step_id seqs[]                  tokens,
 *                                                                                  block_tables
 *  step_reply           worker -> engine           step_id rank ok error? doorbell -
 *                                                  outs[]
 *  adapter_op           engine -> worker           op_id op name path? slot?       -
 *                                                  async?
 *  adapter_op_reply     worker -> engine           op_id rank ok error? seconds    -
 *                                                  pending?
 *  take_notifications   engine -> worker           -                               -
 *  notifications        worker -> engine,          engine? rank dropped items[]    -
 *                       engine -> frontend, PUB
 *  residency            engine -> worker           -                               -
 *  residency_reply      worker -> engine,          engine? rank state              -
 *                       engine -> PUB "residency"
 *  request              frontend -> engine         request_id lora? sampling       prompt
 *  abort                frontend -> engine         request_id                      -
 *  output               engine -> frontend         request_id tokens[] logprobs[]  -
 *                                                  top[]? finished finish_reason?
 *                                                  num_prompt_tokens error?
 *                                                  error_code? queued_time?
 *                                                  scheduled_time?
 *                                                  first_token_time?
 *                                                  finished_time?
 *  event                engine -> PUB "event"      engine request_id event time    -
 *                                                  lora? finish_reason?
 *  stats                engine -> PUB "stats"      engine time running waiting     -
 *                                                  kv_usage num_preemptions
 *                                                  step_adapters step_tokens
 *                                                  step_seconds model_seconds?
 *                                                  adapters[]
 *  control              inspect|frontend -> engine id op name? path?            -
 *  control_reply        engine -> asker            id ok error? data?              -
 *  registry             engine -> frontend, PUB    engine adapters[]               -
 *  shutdown             engine -> worker           -                               -
 *  request_stats        frontend -> PUB "request"  engine request_id lora?         -
 *                                                  finish_reason arrival_time
 *                                                  first_token_time? finished_time
 *                                                  queued_time? scheduled_time?
 *                                                  engine_first_token_time?
 *                                                  engine_finished_time?
 *                                                  num_prompt_tokens
 *                                                  num_generation_tokens max_tokens
 *                                                  submit_seconds? output_seconds?
 */
#ifndef LORA_PROTOCOL_H
#define LORA_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

#define LORA_PROTOCOL_VERSION 1
#define LORA_PROTOCOL_MAGIC   "LORA1"

/* Bounds on what a decoder accepts, checked before anything is used. */
#define LORA_MSG_MAX_BODY     (16u << 20) /* bytes of one msgpack map */
#define LORA_MSG_MAX_STR      4096        /* bytes of one string (names, paths, errors) */
#define LORA_MSG_MAX_SEQS     4096        /* sequences in one step */
#define LORA_MSG_MAX_ADAPTERS 65536       /* adapters in one list */
#define LORA_MSG_MAX_TOP      1024        /* top log-probabilities per token */
#define LORA_MSG_MAX_BANNED   64          /* banned tokens of one sequence in a step */
#define LORA_MSG_MAX_ALLOWED  1024        /* allowed tokens of one request (allowed_token_ids) */
#define LORA_MSG_MAX_PROMPT_TOP 20        /* top log-probabilities per prompt position */

/* Values only grow at the end. */
enum lora_msg_type {
    LORA_MSG_HELLO,
    LORA_MSG_READY,
    LORA_MSG_HEARTBEAT,
    LORA_MSG_SETUP,
    LORA_MSG_SETUP_DONE,
    LORA_MSG_STEP,
    LORA_MSG_STEP_REPLY,
    LORA_MSG_ADAPTER_OP,
    LORA_MSG_ADAPTER_OP_REPLY,
    LORA_MSG_TAKE_NOTIFICATIONS,
    LORA_MSG_NOTIFICATIONS,
    LORA_MSG_RESIDENCY,
    LORA_MSG_RESIDENCY_REPLY,
    LORA_MSG_REQUEST,
    LORA_MSG_ABORT,
    LORA_MSG_OUTPUT,
    LORA_MSG_EVENT,
    LORA_MSG_STATS,
    LORA_MSG_CONTROL,
    LORA_MSG_CONTROL_REPLY,
    LORA_MSG_REGISTRY,
    LORA_MSG_SHUTDOWN,
    LORA_MSG_REQUEST_STATS,
    LORA_MSG_TYPE_COUNT,
};

/* "hello", "ready", ...; lora_msg_type_from_name returns -1 for an unknown name. */
const char *lora_msg_type_name(enum lora_msg_type t);
int lora_msg_type_from_name(const char *name, size_t len);

/* Decoded strings and arrays live here until the next reset. */
struct lora_msg_arena;
struct lora_msg_arena *lora_msg_arena_new(void);
void lora_msg_arena_reset(struct lora_msg_arena *a);
void lora_msg_arena_destroy(struct lora_msg_arena **a);

/* A raw binary frame: little-endian int32 values unless a field says otherwise. */
struct lora_msg_bin {
    const void *data;
    size_t len;
};

/* A borrowed string: not NUL-terminated on the wire; decoders NUL-terminate in the arena. */
struct lora_str {
    const char *s; /* NULL when absent */
    size_t len;
};

/* Reads "type" from a body. Returns the type, or -1 with err (not a map, no "type", unknown). */
int lora_msg_peek_type(const void *body, size_t len, char *err, size_t err_len);

/* Where one msgpack value ends in a byte stream that arrives piece by piece (lora-metrics
 * --stdin, lora-inspect decode; lib/wire/msg_scan.c, the codec's one reader of msgpack headers).
 * Allocates nothing and reads each byte once: it walks headers, skips payloads and
 * counts the values still owed. A container that declares more elements than the bytes left
 * under LORA_MSG_MAX_BODY could hold is LORA_MSG_SCAN_TOO_LARGE as soon as its header is read,
 * so the caller never buffers, and msgpack-c never reserves, more than that for one value. */
enum lora_msg_scan_result {
    LORA_MSG_SCAN_DONE,      /* the value is complete: *len bytes */
    LORA_MSG_SCAN_MORE,      /* the bytes end inside the value: call again with more */
    LORA_MSG_SCAN_MALFORMED, /* the reserved byte 0xc1 at offset *len */
    LORA_MSG_SCAN_TOO_LARGE, /* the value would exceed LORA_MSG_MAX_BODY bytes */
};

/* Resumable state of the scan of one value; zero it before the first call. */
struct lora_msg_scan {
    size_t pos;       /* bytes of the value accepted so far */
    uint64_t pending; /* values still to read; 0 before the first call */
    bool started;
};

/* Scans the value that starts at data[0], of which data[0..avail) is at hand. On
 * LORA_MSG_SCAN_MORE the state records how far it got, and the next call (with the same start
 * and more bytes) goes on from there. */
enum lora_msg_scan_result lora_msg_scan(struct lora_msg_scan *st, const void *data, size_t avail,
                                        size_t *len);

/* Whether b, the first byte of a value, starts a map (every message is one). */
bool lora_msg_scan_is_map(unsigned char b);

/* ---- messages ---------------------------------------------------------------------------- */

enum lora_role {
    LORA_ROLE_WORKER,
    LORA_ROLE_FRONTEND,
    LORA_ROLE_INSPECT,
};

struct lora_msg_hello {
    int version;
    enum lora_role role;
    int rank;       /* workers only, else -1 */
    int world_size; /* workers only, else 0 */
    int64_t pid;
    struct lora_str name;
};

/* The engine's limits, in ready and in setup. */
struct lora_msg_limits {
    int max_loras;
    int max_cpu_loras;
    int max_lora_rank;
    int block_size;
    int num_kv_blocks;
    int world_size;
    int max_model_len;
    int max_num_batched_tokens;
    int max_num_seqs;
    int vocab_size;
};

struct lora_msg_timing; /* below */

/* One load timing a rank reported before the engine was ready, with the rank and the
 * notification it came in: a subscriber that joined later counts it from here, one that saw
 * that notification live does not count it twice. */
struct lora_msg_startup_load {
    int rank;
    uint64_t seq;
    struct lora_str name;
    int transition; /* enum lora_transition: load or activate */
    double seconds;
};

struct lora_msg_ready {
    int version;
    int engine_index;
    struct lora_str model;
    struct lora_msg_limits limits;
    /* Optional "startup_loads": the engine's start-up load and activate timings. */
    int n_startup_loads;
    const struct lora_msg_startup_load *startup_loads;
};

/* The KV cache is sized by each rank, which alone knows its memory: setup carries the budget,
 * and setup_done the blocks the rank allocated and its device's memory; the engine uses the
 * smallest count of all ranks. The budget is one of: gpu_memory_utilization, vLLM's share of the
 * device's total memory the rank may use for everything it holds (a GPU rank only: the KV cache
 * gets what the weights, adapter slots and activations leave of it); kv_cache_fraction of the
 * memory available to the rank; kv_cache_bytes bytes. limits.num_kv_blocks caps the blocks (0: no
 * cap). Without a budget (all 0, absent on the wire) limits.num_kv_blocks is the count itself. */
struct lora_msg_setup {
    struct lora_str model; /* model directory */
    int rank;
    struct lora_msg_limits limits;
    struct lora_str shm;       /* shared-memory name of the all-reduce, when world_size > 1 */
    uint64_t kv_cache_bytes;   /* KV cache bytes of the rank, or 0 */
    double kv_cache_fraction;  /* of the memory available to the rank, in [0, 1]; 0: none */
    double gpu_memory_utilization; /* of the device's total memory, in [0, 1]; 0: none */
};

struct lora_msg_setup_done {
    bool ok;
    struct lora_str error;
    int rank;
    uint64_t weight_bytes;
    int kv_blocks; /* the KV blocks the rank allocated (ok only); 0 and absent: not said */
    uint64_t memory_total; /* bytes of the rank's device (host memory on the CPU); 0: not said */
    uint64_t memory_free;  /* of which free once the rank is set up */
    bool async_activate;   /* an adapter's copy into a slot runs alongside steps (adapter_op) */
};

/* One sequence of a step: its tokens are the next n_tokens values of the tokens frame, its
 * block table the next n_blocks values of the block_tables frame. The sender sets n_blocks =
 * ceil((pos + n_tokens) / block_size); the block size is not in the message, so the decoder
 * checks only that the n_tokens add up to n_tokens_total and the n_blocks to n_block_entries. */
struct lora_msg_step_seq {
    uint64_t seq_id;
    int n_tokens;
    int pos;
    int n_blocks;    /* block-table entries of this sequence */
    int slot;        /* -1: base model */
    bool all_logits; /* prompt log-probabilities wanted */
    bool sample;     /* prefill complete after this step: sample a token */
    float temperature;
    float top_p;
    int top_k;
    uint64_t seed;
    int n_generated; /* tokens generated so far: with seed, picks the random draw */
    int top_n;       /* log-probabilities of the top_n tokens */
    int next_token;  /* with all_logits: the prompt token after this chunk, or -1 */
    /* Tokens that must not be sampled this step (min_tokens not reached: EOS and the stop
     * ids, as vLLM masks them); log-probabilities stay those of the raw distribution. */
    int n_banned;
    const int32_t *banned; /* arena, at most LORA_MSG_MAX_BANNED */
    /* When n_allowed > 0, only these tokens may be sampled (allowed_token_ids); the banned
     * ones are taken out of them. Log-probabilities stay those of the raw distribution, as
     * vLLM reports them. Absent on the wire when empty. */
    int n_allowed;
    const int32_t *allowed; /* arena, at most LORA_MSG_MAX_ALLOWED */
    /* With all_logits: the top prompt_top_n tokens of each prompt position too (vLLM's
     * prompt_logprobs above 0); 0 and absent on the wire: none. */
    int prompt_top_n;
};

struct lora_msg_step {
    uint64_t step_id;
    int n_seqs;
    struct lora_msg_step_seq *seqs; /* arena */
    const int32_t *tokens;          /* from frame 0, n_tokens_total values */
    size_t n_tokens_total;
    const int32_t *block_tables; /* from frame 1 */
    size_t n_block_entries;
};

/* A sequence's result on the output rank: the sampled token (when sample was set) and, with
 * all_logits, the log-probabilities of the prompt tokens this step predicted. */
struct lora_msg_step_out {
    uint64_t seq_id;
    int token; /* -1 when nothing was sampled */
    float logprob;
    int n_top;
    const int32_t *top_ids;    /* arena, n_top */
    const float *top_logprobs; /* arena, n_top */
    int n_prompt_logprobs;
    const float *prompt_logprobs; /* arena */
    /* The vocabulary rank of each prompt token (1: the most likely), as vLLM reports it: NULL
     * or n_prompt_logprobs values; absent on the wire from an older worker. */
    const int32_t *prompt_ranks; /* arena */
    /* With the step's prompt_top_n: n_prompt_logprobs * prompt_top_n ids and log-probabilities,
     * each position's most likely first; absent when prompt_top_n is 0. */
    int prompt_top_n;
    const int32_t *prompt_top_ids;    /* arena */
    const float *prompt_top_logprobs; /* arena */
};

struct lora_msg_step_reply {
    uint64_t step_id;
    int rank;
    bool ok;
    struct lora_str error;
    bool doorbell; /* the worker has notifications buffered */
    double step_seconds;
    int n_outs;
    struct lora_msg_step_out *outs; /* arena; empty on ranks other than the output rank */
};

enum lora_adapter_op {
    LORA_OP_ADD,      /* load from path into the CPU cache */
    LORA_OP_ACTIVATE, /* into slot */
    LORA_OP_REMOVE,   /* from slot and cache */
    LORA_OP_PIN,
    LORA_OP_UNPIN,
};

struct lora_msg_adapter_op {
    uint64_t op_id;
    enum lora_adapter_op op;
    struct lora_str name;
    struct lora_str path; /* ADD */
    int slot;             /* ACTIVATE */
    bool async; /* ACTIVATE: answer once the copy into the slot has begun, not once it is done */
};

struct lora_msg_adapter_op_reply {
    uint64_t op_id;
    int rank;
    bool ok;
    struct lora_str error;
    double seconds;
    bool pending; /* ACTIVATE: the adapter's copy into its slot goes on */
};

/* A rank's loaded state: adapters in slots (slot i holds slots[i], empty string = free), in the
 * CPU cache, and pinned. */
struct lora_msg_state {
    int n_slots;
    struct lora_str *slots;
    int n_cpu;
    struct lora_str *cpu;
    int n_pinned;
    struct lora_str *pinned;
};

enum lora_transition {
    LORA_TRANSITION_LOAD,     /* disk -> CPU cache */
    LORA_TRANSITION_ACTIVATE, /* CPU cache -> slot */
    LORA_TRANSITION_EVICT,    /* slot -> CPU cache, or out of the cache */
    LORA_TRANSITION_REMOVE,   /* unloaded */
};

struct lora_msg_timing {
    struct lora_str name;
    enum lora_transition transition;
    double seconds;
};

/* One notification; kind "lora_load" is the only kind so far. */
struct lora_msg_notification {
    struct lora_str kind;
    uint64_t seq; /* per-rank sequence number */
    double time;  /* Unix time with fractions */
    struct lora_msg_state state;
    int n_timings;
    struct lora_msg_timing *timings;
};

struct lora_msg_notifications {
    int engine; /* -1 when sent by a worker */
    int rank;
    uint64_t dropped; /* total dropped by the rank's buffer since it started */
    int n_items;
    struct lora_msg_notification *items;
};

/* A rank's state, as a worker answers residency, and as the engine publishes every rank's last
 * gathered state on topic "residency" (with engine set; -1 when absent). */
struct lora_msg_residency_reply {
    int engine;
    int rank;
    struct lora_msg_state state;
};

struct lora_msg_request {
    struct lora_str request_id;
    struct lora_str lora;  /* absent: base model */
    const int32_t *prompt; /* frame 0 */
    size_t n_prompt;
    int max_tokens;
    int min_tokens;
    float temperature;
    float top_p;
    int top_k;
    bool has_seed;
    uint64_t seed;
    int logprobs; /* top-N per generated token, 0 = none */
    bool prompt_logprobs;
    bool ignore_eos;
    int n_stop_token_ids;
    const int32_t *stop_token_ids; /* arena */
    /* Only these tokens may be sampled; 0: any. Absent on the wire when empty, so an older
     * engine sees the request it knew. */
    int n_allowed_token_ids;
    const int32_t *allowed_token_ids; /* arena, at most LORA_MSG_MAX_ALLOWED */
    /* With prompt_logprobs: the top prompt_top_n tokens of each prompt position too; 0 (absent
     * on the wire): only the prompt tokens' own. */
    int prompt_top_n;
};

struct lora_msg_abort {
    struct lora_str request_id;
};

struct lora_msg_output {
    struct lora_str request_id;
    int n_tokens; /* new tokens since the previous output */
    const int32_t *tokens;
    const float *logprobs;
    int top_n; /* per token: top_n ids and log-probabilities, or 0 */
    const int32_t *top_ids;
    const float *top_logprobs;
    int n_prompt_logprobs;
    const float *prompt_logprobs; /* first output only; [0] is NAN */
    const int32_t *prompt_ranks;  /* NULL, or n_prompt_logprobs ranks ([0] is 0: none) */
    int prompt_top_n;             /* per prompt position: ids and log-probabilities, or 0 */
    const int32_t *prompt_top_ids;    /* n_prompt_logprobs * prompt_top_n; [0..top_n) unused */
    const float *prompt_top_logprobs;
    bool finished;
    struct lora_str finish_reason; /* "stop", "length", "abort", "error" */
    int num_prompt_tokens;
    struct lora_str error;
    /* With error: why, for the frontend's status code: "not_found" (unknown adapter),
     * "invalid" (the request breaks a limit), "unavailable" (unhealthy, full, shutting down). */
    struct lora_str error_code;
    /* The final output of a request that was queued: the engine's times (Unix, with fractions)
     * of its lifecycle events; 0 when it never got there (absent on the wire). */
    double queued_time, scheduled_time, first_token_time, finished_time;
};

enum lora_event_kind {
    LORA_EVENT_QUEUED,
    LORA_EVENT_SCHEDULED,
    LORA_EVENT_PREEMPTED,
    LORA_EVENT_FINISHED,
};

struct lora_msg_event {
    int engine;
    struct lora_str request_id;
    enum lora_event_kind event;
    double time; /* engine clock, Unix time with fractions */
    struct lora_str lora;
    struct lora_str finish_reason;
    int num_prompt_tokens;
    int num_generation_tokens;
};

struct lora_msg_adapter_count {
    struct lora_str name;
    int running;
    int waiting;
};

struct lora_msg_stats {
    int engine;
    double time;
    int running;
    int waiting;
    double kv_usage;          /* 0..1 */
    uint64_t num_preemptions; /* total */
    int step_adapters;        /* distinct adapters in the last step */
    int step_tokens;
    double step_seconds;      /* the engine's wall time for the step, protocol included */
    double model_seconds;     /* the slowest rank's own time for it (optional, 0 if absent) */
    int n_adapters;
    struct lora_msg_adapter_count *adapters;
};

enum lora_control_op {
    LORA_CTL_RESIDENCY,
    LORA_CTL_CONFIG,
    LORA_CTL_HEALTH,
    LORA_CTL_LOAD,
    LORA_CTL_UNLOAD,
    LORA_CTL_PIN,
    LORA_CTL_UNPIN,
    LORA_CTL_STATS,
};

struct lora_msg_control {
    uint64_t id;
    enum lora_control_op op;
    struct lora_str name;
    struct lora_str path;
};

/* data is an opaque msgpack value (the reply's payload: a map or array), copied verbatim. */
struct lora_msg_control_reply {
    uint64_t id;
    bool ok;
    struct lora_str error;
    const void *data; /* msgpack bytes, arena; NULL when absent */
    size_t data_len;
};

struct lora_msg_registry_entry {
    struct lora_str name;
    struct lora_str path;
    uint64_t id;
};

struct lora_msg_registry {
    int engine;
    int n_adapters;
    struct lora_msg_registry_entry *adapters;
};

/* One finished request as a frontend saw it, for the exporter. arrival_time, first_token_time
 * and finished_time are the frontend's clock (the request received, its first token received
 * from the engine, its response over); the four others are the engine's lifecycle times from
 * the final output. Optional times are 0 when absent (never reached). */
struct lora_msg_request_stats {
    int engine;
    struct lora_str request_id;
    struct lora_str lora;
    struct lora_str finish_reason; /* "stop", "length", "abort", "error" */
    double arrival_time, first_token_time, finished_time;
    double queued_time, scheduled_time, engine_first_token_time, engine_finished_time;
    int num_prompt_tokens;
    int num_generation_tokens;
    int max_tokens; /* as asked, -1 when the client left it to the context length */
    /* The frontend's own overhead (0 when not measured): from the request received to its
     * message sent to the engine, and the mean time from an output received from the engine
     * to its bytes handed to the HTTP server. */
    double submit_seconds, output_seconds;
};

/* Room for any decoded message, for code that picks the decoder at run time (tests, fuzzing). */
union lora_msg_any {
    struct lora_msg_hello hello;
    struct lora_msg_ready ready;
    struct lora_msg_setup setup;
    struct lora_msg_setup_done setup_done;
    struct lora_msg_step step;
    struct lora_msg_step_reply step_reply;
    struct lora_msg_adapter_op adapter_op;
    struct lora_msg_adapter_op_reply adapter_op_reply;
    struct lora_msg_notifications notifications;
    struct lora_msg_residency_reply residency_reply;
    struct lora_msg_request request;
    struct lora_msg_abort abort;
    struct lora_msg_output output;
    struct lora_msg_event event;
    struct lora_msg_stats stats;
    struct lora_msg_control control;
    struct lora_msg_control_reply control_reply;
    struct lora_msg_registry registry;
    struct lora_msg_request_stats request_stats;
};

/* ---- codec -------------------------------------------------------------------------------
 * lora_msg_encode_<type>(buf, msg, ...) appends one msgpack map to buf (after reset by the
 * caller) and returns 0, or -1 with errno ENOMEM, or EINVAL when msg breaks a rule its decoder
 * checks (a string over LORA_MSG_MAX_STR or with a NUL, a required string absent, a count
 * negative or over its bound, an enum out of range, step counts that do not add up); buf is
 * then as it was. Messages with binary frames return the frames to send through bins
 * (pointing into msg's own arrays).
 * lora_msg_decode_<type>(body, len, bins, n_bins, arena, out, err, err_len) returns 0 or -1
 * with "TYPE: KEY: what is wrong" in err. Heartbeat, take_notifications, residency and
 * shutdown have no fields: lora_msg_encode_empty(buf, type). */

int lora_msg_encode_empty(struct lora_buf *b, enum lora_msg_type t);

#define LORA_MSG_CODEC(name)                                                                       \
    int lora_msg_encode_##name(struct lora_buf *b, const struct lora_msg_##name *m,            \
                               struct lora_msg_bin *bins, int *n_bins);                            \
    int lora_msg_decode_##name(const void *body, size_t len, const struct lora_msg_bin *bins,      \
                               int n_bins, struct lora_msg_arena *arena,                           \
                               struct lora_msg_##name *out, char *err, size_t err_len);

LORA_MSG_CODEC(hello)
LORA_MSG_CODEC(ready)
LORA_MSG_CODEC(setup)
LORA_MSG_CODEC(setup_done)
LORA_MSG_CODEC(step)
LORA_MSG_CODEC(step_reply)
LORA_MSG_CODEC(adapter_op)
LORA_MSG_CODEC(adapter_op_reply)
LORA_MSG_CODEC(notifications)
LORA_MSG_CODEC(residency_reply)
LORA_MSG_CODEC(request)
LORA_MSG_CODEC(abort)
LORA_MSG_CODEC(output)
LORA_MSG_CODEC(event)
LORA_MSG_CODEC(stats)
LORA_MSG_CODEC(control)
LORA_MSG_CODEC(control_reply)
LORA_MSG_CODEC(registry)
LORA_MSG_CODEC(request_stats)

#undef LORA_MSG_CODEC

/* Writes the body as one JSON object (msgpack maps to JSON, bin as base64 strings): for
 * lora-inspect decode and for logs. Returns 0 or -1 with err. */
int lora_msg_to_json(const void *body, size_t len, struct lora_buf *out, char *err,
                     size_t err_len);

#endif
