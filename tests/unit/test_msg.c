/* Unit tests for lib/wire/msg: a round trip of every message type (all fields set, optional
 * fields absent), and every decoder against truncation, wrong types, missing keys, lying
 * lengths, frame mismatches, unknown keys and a few thousand random mutations.
 *
 * The same binary serves tests/e2e/wire.bats, which checks interoperability with python3-msgpack:
 *   test_msg --emit DIR    writes the sample messages: TYPE.msgpack (+ TYPE.bin0, TYPE.bin1
 *                               for frames) with every field set, TYPE.min.msgpack with the
 *                               optional fields absent (types that have them);
 *   test_msg --check DIR   decodes every *.msgpack in DIR (frames from NAME.bin0, NAME.bin1)
 *                               and prints one JSON line each: {"file","ok","type","json","fields"}
 *                               or {"file","ok":false,"error"}; exit 0 when all decoded, 1 if not.
 * "fields" is the decoded struct with the wire names as keys, every field present (absent
 * optional ones at their defaults, strings null), frames as lists, floats that are not finite as
 * "nan"/"inf"/"-inf", unsigned integers above INT64_MAX as decimal strings.
 */
#include "check.h"
#include "wire/msg.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>
#include <msgpack.h>

/* ---- the spec's enum spellings, written out independently of lib/wire/msg.h ---- */

static const char *const role_s[] = {"worker", "frontend", "inspect"};
static const char *const op_s[] = {"add", "activate", "remove", "pin", "unpin"};
static const char *const transition_s[] = {"load", "activate", "evict", "remove"};
static const char *const event_s[] = {"QUEUED", "SCHEDULED", "PREEMPTED", "FINISHED"};
static const char *const control_s[] = {"residency", "config", "health", "load",
                                        "unload",    "pin",    "unpin",  "stats"};
static const char *const type_s[LORA_MSG_TYPE_COUNT] = {
    "hello",
    "ready",
    "heartbeat",
    "setup",
    "setup_done",
    "step",
    "step_reply",
    "adapter_op",
    "adapter_op_reply",
    "take_notifications",
    "notifications",
    "residency",
    "residency_reply",
    "request",
    "abort",
    "output",
    "event",
    "stats",
    "control",
    "control_reply",
    "registry",
    "shutdown",
    "request_stats",
};

#define STR(lit) ((struct lora_str){lit, sizeof(lit) - 1})
#define NONE     ((struct lora_str){NULL, 0})
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- samples: keep in step with tests/ref/wire_compat.py ---- */

static const struct lora_msg_limits limits = {
    .max_loras = 4,
    .max_cpu_loras = 8,
    .max_lora_rank = 64,
    .block_size = 16,
    .num_kv_blocks = 2048,
    .world_size = 2,
    .max_model_len = 4096,
    .max_num_batched_tokens = 8192,
    .max_num_seqs = 256,
    .vocab_size = 32000,
};

static const struct lora_msg_hello hello_full = {.version = 1,
                                                 .role = LORA_ROLE_WORKER,
                                                 .rank = 3,
                                                 .world_size = 4,
                                                 .pid = 4242,
                                                 .name = STR("worker-3 \xc3\xa9")};
static const struct lora_msg_hello hello_min = {
    .version = 1, .role = LORA_ROLE_FRONTEND, .rank = -1, .world_size = 0, .pid = 77};

static const struct lora_msg_ready ready_full = {
    .version = 1, .engine_index = 2, .model = STR("/models/llama"), .limits = limits};

static const struct lora_msg_setup setup_full = {.model = STR("/models/llama"),
                                                 .rank = 1,
                                                 .limits = limits,
                                                 .shm = STR("/lora-shm-1"),
                                                 .kv_cache_bytes = 268435456,
                                                 .kv_cache_fraction = 0.5,
                                                 .gpu_memory_utilization = 0.9};
static const struct lora_msg_setup setup_min = {
    .model = STR("/models/llama"), .rank = 0, .limits = limits};

static const struct lora_msg_setup_done setup_done_full = {.ok = false,
                                                           .error = STR("out of memory"),
                                                           .rank = 1,
                                                           .weight_bytes = 123456789012u,
                                                           .kv_blocks = 4096,
                                                           .memory_total = 85899345920u,
                                                           .memory_free = 1073741824u,
                                                           .async_activate = true};
static const struct lora_msg_setup_done setup_done_min = {.ok = true, .rank = 0};

static const int32_t step_banned[] = {257, 2};
static const int32_t step_allowed[] = {3, 17, 255};
static const struct lora_msg_step_seq step_seqs[] = {
    {.seq_id = 11,
     .n_tokens = 3,
     .pos = 0,
     .n_blocks = 1,
     .slot = 2,
     .all_logits = true,
     .sample = true,
     .temperature = 0.7f,
     .top_p = 0.9f,
     .top_k = 40,
     .seed = 9007199254740993u,
     .n_generated = 0,
     .top_n = 2,
     .next_token = 5,
     .n_banned = 2,
     .banned = step_banned,
     .n_allowed = 3,
     .allowed = step_allowed,
     .prompt_top_n = 2},
    {.seq_id = 12,
     .n_tokens = 1,
     .pos = 20,
     .n_blocks = 2,
     .slot = -1,
     .all_logits = false,
     .sample = true,
     .temperature = 0.0f,
     .top_p = 1.0f,
     .top_k = -1,
     .seed = 0,
     .n_generated = 5,
     .top_n = 0,
     .next_token = -1},
};
static const int32_t step_tokens[] = {1, 2, 3, 99};
static const int32_t step_blocks[] = {7, 8, 9};
static const struct lora_msg_step step_full = {.step_id = UINT64_MAX,
                                               .n_seqs = 2,
                                               .seqs = (struct lora_msg_step_seq *)step_seqs,
                                               .tokens = step_tokens,
                                               .n_tokens_total = 4,
                                               .block_tables = step_blocks,
                                               .n_block_entries = 3};
static const struct lora_msg_step step_min = {.step_id = 1};

static const int32_t out0_top_ids[] = {42, 7};
static const float out0_top_lps[] = {-0.25f, -1.5f};
static const float out0_prompt_lps[] = {NAN, -2.0f, -0.5f};
static const int32_t out0_prompt_ranks[] = {0, 12, 1};
static const int32_t out0_prompt_top_ids[] = {0, 0, 9, 4, 5, 6};
static const float out0_prompt_top_lps[] = {0, 0, -0.5f, -1.0f, -0.5f, -2.5f};
static const struct lora_msg_step_out step_outs[] = {
    {.seq_id = 11,
     .token = 42,
     .logprob = -0.25f,
     .n_top = 2,
     .top_ids = out0_top_ids,
     .top_logprobs = out0_top_lps,
     .n_prompt_logprobs = 3,
     .prompt_logprobs = out0_prompt_lps,
     .prompt_ranks = out0_prompt_ranks,
     .prompt_top_n = 2,
     .prompt_top_ids = out0_prompt_top_ids,
     .prompt_top_logprobs = out0_prompt_top_lps},
    {.seq_id = 12, .token = -1, .logprob = 0.0f},
};
static const struct lora_msg_step_reply step_reply_full = {
    .step_id = 5,
    .rank = 0,
    .ok = false,
    .error = STR("cuda: out of memory"),
    .doorbell = true,
    .step_seconds = 0.0125,
    .n_outs = 2,
    .outs = (struct lora_msg_step_out *)step_outs};
static const struct lora_msg_step_reply step_reply_min = {
    .step_id = 6, .rank = 1, .ok = true, .doorbell = false, .step_seconds = 0.5};

static const struct lora_msg_adapter_op adapter_op_full = {
    .op_id = 100, .op = LORA_OP_ADD, .name = STR("sql"), .path = STR("/adapters/sql"), .slot = 1};
static const struct lora_msg_adapter_op adapter_op_min = {
    .op_id = 101, .op = LORA_OP_REMOVE, .name = STR("sql"), .slot = -1};

static const struct lora_msg_adapter_op_reply adapter_op_reply_full = {
    .op_id = 100, .rank = 1, .ok = false, .error = STR("no such file"), .seconds = 0.25,
    .pending = true};
static const struct lora_msg_adapter_op_reply adapter_op_reply_min = {
    .op_id = 101, .rank = 0, .ok = true, .seconds = 0.0};

static const struct lora_str state_slots[] = {STR("sql"), STR("")};
static const struct lora_str state_cpu[] = {STR("sql"), STR("chat")};
static const struct lora_str state_pinned[] = {STR("chat")};
#define FULL_STATE                                                                                 \
    {                                                                                              \
        .n_slots = 2, .slots = (struct lora_str *)state_slots, .n_cpu = 2,                         \
        .cpu = (struct lora_str *)state_cpu, .n_pinned = 1,                                        \
        .pinned = (struct lora_str *)state_pinned                                                  \
    }
static const struct lora_msg_timing timings[] = {
    {.name = STR("sql"), .transition = LORA_TRANSITION_LOAD, .seconds = 0.5},
    {.name = STR("chat"), .transition = LORA_TRANSITION_EVICT, .seconds = 0.001},
};
static const struct lora_msg_notification items[] = {
    {.kind = STR("lora_load"),
     .seq = 17,
     .time = 1700000000.25,
     .state = FULL_STATE,
     .n_timings = 2,
     .timings = (struct lora_msg_timing *)timings},
};
static const struct lora_msg_notifications notifications_full = {
    .engine = 0,
    .rank = 1,
    .dropped = 3,
    .n_items = 1,
    .items = (struct lora_msg_notification *)items};
static const struct lora_msg_notifications notifications_min = {.engine = -1, .rank = 0};

static const struct lora_msg_residency_reply residency_reply_full = {
    .engine = 2, .rank = 1, .state = FULL_STATE};
static const struct lora_msg_residency_reply residency_reply_min = {.engine = -1, .rank = 0};

static const int32_t request_prompt[] = {1, 15043, 3186, 2};
static const int32_t request_stop[] = {2, 32000};
static const int32_t request_allowed[] = {7, 8, 31999};
static const struct lora_msg_request request_full = {.request_id = STR("req-1"),
                                                     .lora = STR("sql"),
                                                     .prompt = request_prompt,
                                                     .n_prompt = 4,
                                                     .max_tokens = 16,
                                                     .min_tokens = 2,
                                                     .temperature = 0.8f,
                                                     .top_p = 0.95f,
                                                     .top_k = 50,
                                                     .has_seed = true,
                                                     .seed = UINT64_MAX,
                                                     .logprobs = 5,
                                                     .prompt_logprobs = true,
                                                     .ignore_eos = true,
                                                     .n_stop_token_ids = 2,
                                                     .stop_token_ids = request_stop,
                                                     .n_allowed_token_ids = 3,
                                                     .allowed_token_ids = request_allowed,
                                                     .prompt_top_n = 5};
static const int32_t request_min_prompt[] = {5};
static const struct lora_msg_request request_min = {.request_id = STR("r"),
                                                    .prompt = request_min_prompt,
                                                    .n_prompt = 1,
                                                    .max_tokens = 1,
                                                    .temperature = 0.0f,
                                                    .top_p = 1.0f};

static const struct lora_msg_abort abort_full = {.request_id = STR("req-1")};

static const int32_t output_tokens[] = {42, 7};
static const float output_lps[] = {-0.5f, -1.25f};
static const int32_t output_top_ids[] = {42, 9, 7, 3};
static const float output_top_lps[] = {-0.5f, -2.0f, -1.25f, -3.0f};
static const float output_prompt_lps[] = {NAN, -1.0f, -2.0f};
static const int32_t output_prompt_ranks[] = {0, 4, 1};
static const int32_t output_prompt_top_ids[] = {0, 3, 8};
static const float output_prompt_top_lps[] = {0, -0.75f, -2.0f};
static const struct lora_msg_output output_full = {.request_id = STR("req-1"),
                                                   .n_tokens = 2,
                                                   .tokens = output_tokens,
                                                   .logprobs = output_lps,
                                                   .top_n = 2,
                                                   .top_ids = output_top_ids,
                                                   .top_logprobs = output_top_lps,
                                                   .n_prompt_logprobs = 3,
                                                   .prompt_logprobs = output_prompt_lps,
                                                   .prompt_ranks = output_prompt_ranks,
                                                   .prompt_top_n = 1,
                                                   .prompt_top_ids = output_prompt_top_ids,
                                                   .prompt_top_logprobs = output_prompt_top_lps,
                                                   .finished = true,
                                                   .finish_reason = STR("length"),
                                                   .num_prompt_tokens = 4,
                                                   .error = STR("boom"),
                                                   .error_code = STR("invalid"),
                                                   .queued_time = 1700000000.25,
                                                   .scheduled_time = 1700000000.5,
                                                   .first_token_time = 1700000000.75,
                                                   .finished_time = 1700000001.125};
static const int32_t output_min_tokens[] = {5};
static const float output_min_lps[] = {-0.125f};
static const struct lora_msg_output output_min = {.request_id = STR("req-2"),
                                                  .n_tokens = 1,
                                                  .tokens = output_min_tokens,
                                                  .logprobs = output_min_lps,
                                                  .finished = false,
                                                  .num_prompt_tokens = 3};

static const struct lora_msg_event event_full = {.engine = 1,
                                                 .request_id = STR("req-1"),
                                                 .event = LORA_EVENT_FINISHED,
                                                 .time = 1700000001.5,
                                                 .lora = STR("sql"),
                                                 .finish_reason = STR("stop"),
                                                 .num_prompt_tokens = 4,
                                                 .num_generation_tokens = 16};
static const struct lora_msg_event event_min = {.engine = 0,
                                                .request_id = STR("req-2"),
                                                .event = LORA_EVENT_QUEUED,
                                                .time = 1700000000.0,
                                                .num_prompt_tokens = 3};

static const struct lora_msg_adapter_count stats_adapters[] = {
    {.name = STR("sql"), .running = 2, .waiting = 1},
    {.name = STR("chat"), .running = 1, .waiting = 1},
};
static const struct lora_msg_stats stats_full = {
    .engine = 1,
    .time = 1700000002.75,
    .running = 3,
    .waiting = 2,
    .kv_usage = 0.4375,
    .num_preemptions = 7,
    .step_adapters = 2,
    .step_tokens = 96,
    .step_seconds = 0.03125,
    .model_seconds = 0.015625,
    .n_adapters = 2,
    .adapters = (struct lora_msg_adapter_count *)stats_adapters};
static const struct lora_msg_stats stats_min = {.engine = 0};

static const struct lora_msg_control control_full = {
    .id = 9, .op = LORA_CTL_LOAD, .name = STR("sql"), .path = STR("/adapters/sql")};
static const struct lora_msg_control control_min = {.id = 10, .op = LORA_CTL_HEALTH};

/* {"adapters": ["sql"], "n": 1} */
static const char reply_data[] = "\x82\xa8"
                                 "adapters\x91\xa3"
                                 "sql\xa1n\x01";
static const struct lora_msg_control_reply control_reply_full = {.id = 9,
                                                                 .ok = false,
                                                                 .error = STR("busy"),
                                                                 .data = reply_data,
                                                                 .data_len =
                                                                     sizeof(reply_data) - 1};
static const struct lora_msg_control_reply control_reply_min = {.id = 10, .ok = true};

static const struct lora_msg_registry_entry registry_entries[] = {
    {.name = STR("sql"), .path = STR("/adapters/sql"), .id = 1},
    {.name = STR("chat"), .path = STR("/adapters/chat"), .id = 2},
};
static const struct lora_msg_registry registry_full = {
    .engine = 0, .n_adapters = 2, .adapters = (struct lora_msg_registry_entry *)registry_entries};
static const struct lora_msg_registry registry_min = {.engine = 3};

static const struct lora_msg_request_stats request_stats_full = {
    .engine = 2,
    .request_id = STR("cmpl-1-0"),
    .lora = STR("sql"),
    .finish_reason = STR("length"),
    .arrival_time = 1700000000.0,
    .first_token_time = 1700000000.5,
    .finished_time = 1700000002.0,
    .queued_time = 1700000000.125,
    .scheduled_time = 1700000000.25,
    .engine_first_token_time = 1700000000.375,
    .engine_finished_time = 1700000001.875,
    .num_prompt_tokens = 7,
    .num_generation_tokens = 16,
    .max_tokens = 16,
    .submit_seconds = 0.0009765625,
    .output_seconds = 0.00048828125};
static const struct lora_msg_request_stats request_stats_min = {
    .engine = 0,
    .request_id = STR("cmpl-2-0"),
    .finish_reason = STR("error"),
    .arrival_time = 1700000003.0,
    .finished_time = 1700000003.5,
    .num_prompt_tokens = 1,
    .max_tokens = -1};

/* ---- dumps: a decoded struct as JSON, keyed by wire names ---- */

static json_t *j_u64(uint64_t v)
{
    char s[24];

    if (v <= INT64_MAX)
        return json_integer((json_int_t)v);
    snprintf(s, sizeof(s), "%" PRIu64, v);
    return json_string(s);
}

static json_t *j_real(double x)
{
    if (isnan(x))
        return json_string("nan");
    if (isinf(x))
        return json_string(x > 0 ? "inf" : "-inf");
    return json_real(x);
}

static json_t *j_str(struct lora_str s)
{
    return s.s ? json_stringn_nocheck(s.s, s.len) : json_null();
}

static json_t *j_i32s(const int32_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *j_f32s(const float *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, j_real(v[i]));
    return a;
}

static json_t *j_strs(const struct lora_str *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, j_str(v[i]));
    return a;
}

static json_t *j_enum(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? json_string(names[v]) : json_integer(v);
}

static void set(json_t *o, const char *k, json_t *v)
{
    json_object_set_new(o, k, v);
}

static json_t *dump_limits(const struct lora_msg_limits *l)
{
    json_t *o = json_object();
    set(o, "max_loras", json_integer(l->max_loras));
    set(o, "max_cpu_loras", json_integer(l->max_cpu_loras));
    set(o, "max_lora_rank", json_integer(l->max_lora_rank));
    set(o, "block_size", json_integer(l->block_size));
    set(o, "num_kv_blocks", json_integer(l->num_kv_blocks));
    set(o, "world_size", json_integer(l->world_size));
    set(o, "max_model_len", json_integer(l->max_model_len));
    set(o, "max_num_batched_tokens", json_integer(l->max_num_batched_tokens));
    set(o, "max_num_seqs", json_integer(l->max_num_seqs));
    set(o, "vocab_size", json_integer(l->vocab_size));
    return o;
}

static json_t *dump_state(const struct lora_msg_state *s)
{
    json_t *o = json_object();
    set(o, "slots", j_strs(s->slots, s->n_slots));
    set(o, "cpu", j_strs(s->cpu, s->n_cpu));
    set(o, "pinned", j_strs(s->pinned, s->n_pinned));
    return o;
}

static json_t *dump_hello(const void *p)
{
    const struct lora_msg_hello *m = p;
    json_t *o = json_object();
    set(o, "version", json_integer(m->version));
    set(o, "role", j_enum(role_s, COUNT(role_s), (int)m->role));
    set(o, "rank", json_integer(m->rank));
    set(o, "world_size", json_integer(m->world_size));
    set(o, "pid", json_integer(m->pid));
    set(o, "name", j_str(m->name));
    return o;
}

static json_t *dump_ready(const void *p)
{
    const struct lora_msg_ready *m = p;
    json_t *o = json_object();
    set(o, "version", json_integer(m->version));
    set(o, "engine_index", json_integer(m->engine_index));
    set(o, "model", j_str(m->model));
    set(o, "limits", dump_limits(&m->limits));
    return o;
}

static json_t *dump_setup(const void *p)
{
    const struct lora_msg_setup *m = p;
    json_t *o = json_object();
    set(o, "model", j_str(m->model));
    set(o, "rank", json_integer(m->rank));
    set(o, "limits", dump_limits(&m->limits));
    set(o, "shm", j_str(m->shm));
    set(o, "kv_cache_bytes", j_u64(m->kv_cache_bytes));
    set(o, "kv_cache_fraction", json_real(m->kv_cache_fraction));
    set(o, "gpu_memory_utilization", json_real(m->gpu_memory_utilization));
    return o;
}

static json_t *dump_setup_done(const void *p)
{
    const struct lora_msg_setup_done *m = p;
    json_t *o = json_object();
    set(o, "ok", json_boolean(m->ok));
    set(o, "error", j_str(m->error));
    set(o, "rank", json_integer(m->rank));
    set(o, "weight_bytes", j_u64(m->weight_bytes));
    set(o, "kv_blocks", json_integer(m->kv_blocks));
    set(o, "memory_total", j_u64(m->memory_total));
    set(o, "memory_free", j_u64(m->memory_free));
    set(o, "async_activate", json_boolean(m->async_activate));
    return o;
}

static json_t *dump_step(const void *p)
{
    const struct lora_msg_step *m = p;
    json_t *o = json_object(), *seqs = json_array();
    set(o, "step_id", j_u64(m->step_id));
    for (int i = 0; i < m->n_seqs; i++) {
        const struct lora_msg_step_seq *s = &m->seqs[i];
        json_t *q = json_object();
        set(q, "seq_id", j_u64(s->seq_id));
        set(q, "n_tokens", json_integer(s->n_tokens));
        set(q, "pos", json_integer(s->pos));
        set(q, "n_blocks", json_integer(s->n_blocks));
        set(q, "slot", json_integer(s->slot));
        set(q, "all_logits", json_boolean(s->all_logits));
        set(q, "sample", json_boolean(s->sample));
        set(q, "temperature", j_real(s->temperature));
        set(q, "top_p", j_real(s->top_p));
        set(q, "top_k", json_integer(s->top_k));
        set(q, "seed", j_u64(s->seed));
        set(q, "n_generated", json_integer(s->n_generated));
        set(q, "top_n", json_integer(s->top_n));
        set(q, "next_token", json_integer(s->next_token));
        if (s->n_banned) /* optional: absent when empty */
            set(q, "banned", j_i32s(s->banned, (size_t)s->n_banned));
        if (s->n_allowed) /* likewise */
            set(q, "allowed", j_i32s(s->allowed, (size_t)s->n_allowed));
        if (s->prompt_top_n)
            set(q, "prompt_top_n", json_integer(s->prompt_top_n));
        json_array_append_new(seqs, q);
    }
    set(o, "seqs", seqs);
    set(o, "n_tokens_total", j_u64(m->n_tokens_total));
    set(o, "n_block_entries", j_u64(m->n_block_entries));
    set(o, "tokens", j_i32s(m->tokens, m->n_tokens_total));
    set(o, "block_tables", j_i32s(m->block_tables, m->n_block_entries));
    return o;
}

static json_t *dump_step_reply(const void *p)
{
    const struct lora_msg_step_reply *m = p;
    json_t *o = json_object(), *outs = json_array();
    set(o, "step_id", j_u64(m->step_id));
    set(o, "rank", json_integer(m->rank));
    set(o, "ok", json_boolean(m->ok));
    set(o, "error", j_str(m->error));
    set(o, "doorbell", json_boolean(m->doorbell));
    set(o, "step_seconds", j_real(m->step_seconds));
    for (int i = 0; i < m->n_outs; i++) {
        const struct lora_msg_step_out *s = &m->outs[i];
        json_t *q = json_object();
        set(q, "seq_id", j_u64(s->seq_id));
        set(q, "token", json_integer(s->token));
        set(q, "logprob", j_real(s->logprob));
        set(q, "top_ids", j_i32s(s->top_ids, (size_t)s->n_top));
        set(q, "top_logprobs", j_f32s(s->top_logprobs, (size_t)s->n_top));
        set(q, "prompt_logprobs", j_f32s(s->prompt_logprobs, (size_t)s->n_prompt_logprobs));
        if (s->prompt_ranks)
            set(q, "prompt_ranks", j_i32s(s->prompt_ranks, (size_t)s->n_prompt_logprobs));
        if (s->prompt_top_n) {
            size_t n = (size_t)s->n_prompt_logprobs * (size_t)s->prompt_top_n;
            set(q, "prompt_top_n", json_integer(s->prompt_top_n));
            set(q, "prompt_top_ids", j_i32s(s->prompt_top_ids, n));
            set(q, "prompt_top_logprobs", j_f32s(s->prompt_top_logprobs, n));
        }
        json_array_append_new(outs, q);
    }
    set(o, "outs", outs);
    return o;
}

static json_t *dump_adapter_op(const void *p)
{
    const struct lora_msg_adapter_op *m = p;
    json_t *o = json_object();
    set(o, "op_id", j_u64(m->op_id));
    set(o, "op", j_enum(op_s, COUNT(op_s), (int)m->op));
    set(o, "name", j_str(m->name));
    set(o, "path", j_str(m->path));
    set(o, "slot", json_integer(m->slot));
    set(o, "async", json_boolean(m->async));
    return o;
}

static json_t *dump_adapter_op_reply(const void *p)
{
    const struct lora_msg_adapter_op_reply *m = p;
    json_t *o = json_object();
    set(o, "op_id", j_u64(m->op_id));
    set(o, "rank", json_integer(m->rank));
    set(o, "ok", json_boolean(m->ok));
    set(o, "error", j_str(m->error));
    set(o, "seconds", j_real(m->seconds));
    set(o, "pending", json_boolean(m->pending));
    return o;
}

static json_t *dump_notifications(const void *p)
{
    const struct lora_msg_notifications *m = p;
    json_t *o = json_object(), *its = json_array();
    set(o, "engine", json_integer(m->engine));
    set(o, "rank", json_integer(m->rank));
    set(o, "dropped", j_u64(m->dropped));
    for (int i = 0; i < m->n_items; i++) {
        const struct lora_msg_notification *n = &m->items[i];
        json_t *q = json_object(), *ts = json_array();
        set(q, "kind", j_str(n->kind));
        set(q, "seq", j_u64(n->seq));
        set(q, "time", j_real(n->time));
        set(q, "state", dump_state(&n->state));
        for (int j = 0; j < n->n_timings; j++) {
            json_t *t = json_object();
            set(t, "name", j_str(n->timings[j].name));
            set(t, "transition",
                j_enum(transition_s, COUNT(transition_s), (int)n->timings[j].transition));
            set(t, "seconds", j_real(n->timings[j].seconds));
            json_array_append_new(ts, t);
        }
        set(q, "timings", ts);
        json_array_append_new(its, q);
    }
    set(o, "items", its);
    return o;
}

static json_t *dump_residency_reply(const void *p)
{
    const struct lora_msg_residency_reply *m = p;
    json_t *o = json_object();
    set(o, "engine", json_integer(m->engine));
    set(o, "rank", json_integer(m->rank));
    set(o, "state", dump_state(&m->state));
    return o;
}

static json_t *dump_request(const void *p)
{
    const struct lora_msg_request *m = p;
    json_t *o = json_object();
    set(o, "request_id", j_str(m->request_id));
    set(o, "lora", j_str(m->lora));
    set(o, "n_prompt", j_u64(m->n_prompt));
    set(o, "prompt", j_i32s(m->prompt, m->n_prompt));
    set(o, "max_tokens", json_integer(m->max_tokens));
    set(o, "min_tokens", json_integer(m->min_tokens));
    set(o, "temperature", j_real(m->temperature));
    set(o, "top_p", j_real(m->top_p));
    set(o, "top_k", json_integer(m->top_k));
    set(o, "seed", m->has_seed ? j_u64(m->seed) : json_null());
    set(o, "logprobs", json_integer(m->logprobs));
    set(o, "prompt_logprobs", json_boolean(m->prompt_logprobs));
    set(o, "ignore_eos", json_boolean(m->ignore_eos));
    set(o, "stop_token_ids", j_i32s(m->stop_token_ids, (size_t)m->n_stop_token_ids));
    if (m->n_allowed_token_ids) /* optional: absent when empty */
        set(o, "allowed_token_ids",
            j_i32s(m->allowed_token_ids, (size_t)m->n_allowed_token_ids));
    if (m->prompt_top_n)
        set(o, "prompt_top_n", json_integer(m->prompt_top_n));
    return o;
}

static json_t *dump_abort(const void *p)
{
    const struct lora_msg_abort *m = p;
    json_t *o = json_object();
    set(o, "request_id", j_str(m->request_id));
    return o;
}

static json_t *dump_output(const void *p)
{
    const struct lora_msg_output *m = p;
    size_t n_top = (size_t)m->n_tokens * (size_t)m->top_n;
    json_t *o = json_object();
    set(o, "request_id", j_str(m->request_id));
    set(o, "tokens", j_i32s(m->tokens, (size_t)m->n_tokens));
    set(o, "logprobs", j_f32s(m->logprobs, (size_t)m->n_tokens));
    set(o, "top_n", json_integer(m->top_n));
    set(o, "top_ids", j_i32s(m->top_ids, n_top));
    set(o, "top_logprobs", j_f32s(m->top_logprobs, n_top));
    set(o, "prompt_logprobs", j_f32s(m->prompt_logprobs, (size_t)m->n_prompt_logprobs));
    if (m->prompt_ranks)
        set(o, "prompt_ranks", j_i32s(m->prompt_ranks, (size_t)m->n_prompt_logprobs));
    if (m->prompt_top_n) {
        size_t n = (size_t)m->n_prompt_logprobs * (size_t)m->prompt_top_n;
        set(o, "prompt_top_n", json_integer(m->prompt_top_n));
        set(o, "prompt_top_ids", j_i32s(m->prompt_top_ids, n));
        set(o, "prompt_top_logprobs", j_f32s(m->prompt_top_logprobs, n));
    }
    set(o, "finished", json_boolean(m->finished));
    set(o, "finish_reason", j_str(m->finish_reason));
    set(o, "num_prompt_tokens", json_integer(m->num_prompt_tokens));
    set(o, "error", j_str(m->error));
    set(o, "error_code", j_str(m->error_code));
    set(o, "queued_time", json_real(m->queued_time));
    set(o, "scheduled_time", json_real(m->scheduled_time));
    set(o, "first_token_time", json_real(m->first_token_time));
    set(o, "finished_time", json_real(m->finished_time));
    return o;
}

static json_t *dump_event(const void *p)
{
    const struct lora_msg_event *m = p;
    json_t *o = json_object();
    set(o, "engine", json_integer(m->engine));
    set(o, "request_id", j_str(m->request_id));
    set(o, "event", j_enum(event_s, COUNT(event_s), (int)m->event));
    set(o, "time", j_real(m->time));
    set(o, "lora", j_str(m->lora));
    set(o, "finish_reason", j_str(m->finish_reason));
    set(o, "num_prompt_tokens", json_integer(m->num_prompt_tokens));
    set(o, "num_generation_tokens", json_integer(m->num_generation_tokens));
    return o;
}

static json_t *dump_stats(const void *p)
{
    const struct lora_msg_stats *m = p;
    json_t *o = json_object(), *as = json_array();
    set(o, "engine", json_integer(m->engine));
    set(o, "time", j_real(m->time));
    set(o, "running", json_integer(m->running));
    set(o, "waiting", json_integer(m->waiting));
    set(o, "kv_usage", j_real(m->kv_usage));
    set(o, "num_preemptions", j_u64(m->num_preemptions));
    set(o, "step_adapters", json_integer(m->step_adapters));
    set(o, "step_tokens", json_integer(m->step_tokens));
    set(o, "step_seconds", j_real(m->step_seconds));
    for (int i = 0; i < m->n_adapters; i++) {
        json_t *a = json_object();
        set(a, "name", j_str(m->adapters[i].name));
        set(a, "running", json_integer(m->adapters[i].running));
        set(a, "waiting", json_integer(m->adapters[i].waiting));
        json_array_append_new(as, a);
    }
    set(o, "adapters", as);
    return o;
}

static json_t *dump_control(const void *p)
{
    const struct lora_msg_control *m = p;
    json_t *o = json_object();
    set(o, "id", j_u64(m->id));
    set(o, "op", j_enum(control_s, COUNT(control_s), (int)m->op));
    set(o, "name", j_str(m->name));
    set(o, "path", j_str(m->path));
    return o;
}

/* msgpack bytes as the JSON value lora_msg_to_json makes of them; null when they are none. */
static json_t *json_of_msgpack(const void *data, size_t len)
{
    struct lora_buf b = {0};
    char err[256];
    json_t *v = NULL;

    if (data && lora_msg_to_json(data, len, &b, err, sizeof(err)) == 0)
        v = json_loadb(b.data, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    lora_buf_release(&b);
    return v ? v : json_null();
}

static json_t *dump_control_reply(const void *p)
{
    const struct lora_msg_control_reply *m = p;
    json_t *o = json_object();
    set(o, "id", j_u64(m->id));
    set(o, "ok", json_boolean(m->ok));
    set(o, "error", j_str(m->error));
    set(o, "data", json_of_msgpack(m->data, m->data_len));
    return o;
}

static json_t *dump_registry(const void *p)
{
    const struct lora_msg_registry *m = p;
    json_t *o = json_object(), *as = json_array();
    set(o, "engine", json_integer(m->engine));
    for (int i = 0; i < m->n_adapters; i++) {
        json_t *a = json_object();
        set(a, "name", j_str(m->adapters[i].name));
        set(a, "path", j_str(m->adapters[i].path));
        set(a, "id", j_u64(m->adapters[i].id));
        json_array_append_new(as, a);
    }
    set(o, "adapters", as);
    return o;
}

static json_t *dump_request_stats(const void *p)
{
    const struct lora_msg_request_stats *m = p;
    json_t *o = json_object();
    set(o, "engine", json_integer(m->engine));
    set(o, "request_id", j_str(m->request_id));
    set(o, "lora", j_str(m->lora));
    set(o, "finish_reason", j_str(m->finish_reason));
    set(o, "arrival_time", json_real(m->arrival_time));
    set(o, "first_token_time", json_real(m->first_token_time));
    set(o, "finished_time", json_real(m->finished_time));
    set(o, "queued_time", json_real(m->queued_time));
    set(o, "scheduled_time", json_real(m->scheduled_time));
    set(o, "engine_first_token_time", json_real(m->engine_first_token_time));
    set(o, "engine_finished_time", json_real(m->engine_finished_time));
    set(o, "num_prompt_tokens", json_integer(m->num_prompt_tokens));
    set(o, "num_generation_tokens", json_integer(m->num_generation_tokens));
    set(o, "max_tokens", json_integer(m->max_tokens));
    set(o, "submit_seconds", json_real(m->submit_seconds));
    set(o, "output_seconds", json_real(m->output_seconds));
    return o;
}

/* ---- one table over all types ---- */

typedef int (*enc_fn)(struct lora_buf *b, const void *m, struct lora_msg_bin *bins,
                      int *n_bins);
typedef int (*dec_fn)(const void *body, size_t len, const struct lora_msg_bin *bins, int n_bins,
                      struct lora_msg_arena *a, void *out, char *err, size_t err_len);
typedef json_t *(*dump_fn)(const void *m);

#define WRAP(name)                                                                                 \
    static int enc_##name(struct lora_buf *b, const void *m, struct lora_msg_bin *bins,        \
                          int *n_bins)                                                             \
    {                                                                                              \
        return lora_msg_encode_##name(b, m, bins, n_bins);                                         \
    }                                                                                              \
    static int dec_##name(const void *body, size_t len, const struct lora_msg_bin *bins,           \
                          int n_bins, struct lora_msg_arena *a, void *out, char *err,              \
                          size_t err_len)                                                          \
    {                                                                                              \
        return lora_msg_decode_##name(body, len, bins, n_bins, a, out, err, err_len);              \
    }

WRAP(hello)
WRAP(ready)
WRAP(setup)
WRAP(setup_done)
WRAP(step)
WRAP(step_reply)
WRAP(adapter_op)
WRAP(adapter_op_reply)
WRAP(notifications)
WRAP(residency_reply)
WRAP(request)
WRAP(abort)
WRAP(output)
WRAP(event)
WRAP(stats)
WRAP(control)
WRAP(control_reply)
WRAP(registry)
WRAP(request_stats)

struct codec {
    enc_fn enc; /* NULL: a type without fields */
    dec_fn dec;
    dump_fn dump;
    const void *full, *min;  /* min: optional fields absent, NULL when the type has none */
    const char *optional[8]; /* keys of full whose removal still decodes */
};

#define ROW(name, ...)                                                                             \
    {                                                                                              \
        enc_##name, dec_##name, dump_##name, &name##_full, __VA_ARGS__                             \
    }

static const struct codec codecs[LORA_MSG_TYPE_COUNT] = {
    [LORA_MSG_HELLO] = ROW(hello, &hello_min, {"rank", "world_size", "name"}),
    [LORA_MSG_READY] = ROW(ready, NULL, {NULL}),
    [LORA_MSG_SETUP] =
        ROW(setup, &setup_min,
            {"shm", "kv_cache_bytes", "kv_cache_fraction", "gpu_memory_utilization"}),
    [LORA_MSG_SETUP_DONE] =
        ROW(setup_done, &setup_done_min, {"error", "kv_blocks", "memory_total", "memory_free",
                                 "async_activate"}),
    [LORA_MSG_STEP] = ROW(step, &step_min, {"banned", "allowed", "prompt_top_n"}),
    [LORA_MSG_STEP_REPLY] = ROW(step_reply, &step_reply_min, {"error", "prompt_ranks"}),
    [LORA_MSG_ADAPTER_OP] = ROW(adapter_op, &adapter_op_min, {"slot"}),
    [LORA_MSG_ADAPTER_OP_REPLY] = ROW(adapter_op_reply, &adapter_op_reply_min,
                                      {"error", "pending"}),
    [LORA_MSG_NOTIFICATIONS] = ROW(notifications, &notifications_min, {"engine"}),
    [LORA_MSG_RESIDENCY_REPLY] = ROW(residency_reply, &residency_reply_min, {"engine"}),
    [LORA_MSG_REQUEST] =
        ROW(request, &request_min, {"lora", "seed", "allowed_token_ids", "prompt_top_n"}),
    [LORA_MSG_ABORT] = ROW(abort, NULL, {NULL}),
    [LORA_MSG_OUTPUT] = ROW(output, &output_min,
                            {"prompt_ranks", "finish_reason", "error", "error_code", "queued_time",
                             "scheduled_time", "first_token_time", "finished_time"}),
    [LORA_MSG_EVENT] = ROW(event, &event_min, {"lora", "finish_reason"}),
    [LORA_MSG_STATS] = ROW(stats, &stats_min, {"model_seconds", NULL}),
    [LORA_MSG_CONTROL] = ROW(control, &control_min, {NULL}),
    [LORA_MSG_CONTROL_REPLY] = ROW(control_reply, &control_reply_min, {"error", "data"}),
    [LORA_MSG_REGISTRY] = ROW(registry, &registry_min, {NULL}),
    [LORA_MSG_REQUEST_STATS] =
        ROW(request_stats, &request_stats_min,
            {"lora", "first_token_time", "queued_time", "scheduled_time", "engine_first_token_time",
             "engine_finished_time", "submit_seconds", "output_seconds"}),
};

static bool is_optional(const struct codec *c, const char *key)
{
    for (int i = 0; i < COUNT(c->optional) && c->optional[i]; i++) {
        if (strcmp(c->optional[i], key) == 0)
            return true;
    }
    return false;
}

#define MAX_BINS 4

/* Encodes msg of type t into b (reset first); frames into bins. */
static int encode(enum lora_msg_type t, const void *msg, struct lora_buf *b,
                  struct lora_msg_bin *bins, int *n_bins)
{
    lora_buf_reset(b);
    *n_bins = 0;
    if (!codecs[t].enc)
        return lora_msg_encode_empty(b, t);
    return codecs[t].enc(b, msg, bins, n_bins);
}

/* Decodes a body that should be of type t; types without fields go through peek_type. */
static int decode(enum lora_msg_type t, const void *body, size_t len,
                  const struct lora_msg_bin *bins, int n_bins, struct lora_msg_arena *a,
                  union lora_msg_any *out, char *err, size_t err_len)
{
    if (codecs[t].dec)
        return codecs[t].dec(body, len, bins, n_bins, a, out, err, err_len);
    int got = lora_msg_peek_type(body, len, err, err_len);
    if (got < 0)
        return -1;
    if (got != (int)t) {
        snprintf(err, err_len, "%s: type: got '%s'", type_s[t], type_s[got]);
        return -1;
    }
    return 0;
}

static json_t *dump(enum lora_msg_type t, const void *msg)
{
    return codecs[t].dump ? codecs[t].dump(msg) : json_object();
}

/* Is the decoded msg the same as the original, field by field? Prints both when not. */
static bool same_dump(enum lora_msg_type t, const void *a, const void *b)
{
    json_t *ja = dump(t, a), *jb = dump(t, b);
    bool same = json_equal(ja, jb);

    if (!same) {
        char *sa = json_dumps(ja, JSON_COMPACT), *sb = json_dumps(jb, JSON_COMPACT);
        printf("# %s: sent %s\n#   got %s\n", type_s[t], sa, sb);
        free(sa);
        free(sb);
    }
    json_decref(ja);
    json_decref(jb);
    return same;
}

/* Calls fn for every sample (type, message, variant name). */
typedef void (*sample_fn)(enum lora_msg_type t, const void *msg, const char *variant);

static void for_each_sample(sample_fn fn)
{
    for (int t = 0; t < LORA_MSG_TYPE_COUNT; t++) {
        fn((enum lora_msg_type)t, codecs[t].full, "full");
        if (codecs[t].min)
            fn((enum lora_msg_type)t, codecs[t].min, "min");
    }
}

/* ---- tests ---- */

static void test_type_names(void)
{
    for (int t = 0; t < LORA_MSG_TYPE_COUNT; t++) {
        CHECK(strcmp(lora_msg_type_name((enum lora_msg_type)t), type_s[t]) == 0);
        CHECK(lora_msg_type_from_name(type_s[t], strlen(type_s[t])) == t);
    }
    CHECK(lora_msg_type_from_name("bogus", 5) == -1);
    CHECK(lora_msg_type_from_name("hello", 4) == -1);
    CHECK(lora_msg_type_from_name("hellox", 6) == -1);
    CHECK(lora_msg_type_from_name("", 0) == -1);
    CHECK(lora_msg_type_from_name(NULL, 3) == -1);
    CHECK(strcmp(lora_msg_type_name(LORA_MSG_TYPE_COUNT), "unknown") == 0);
}

static struct lora_msg_arena *arena;
static struct lora_buf buf;

/* A copy of b's bytes as a C string (for CHECK_CONTAINS); the caller frees it. */
static char *buf_string(const struct lora_buf *b)
{
    char *s = malloc(b->len + 1);
    if (b->len)
        memcpy(s, b->data, b->len);
    s[b->len] = '\0';
    return s;
}

static void round_trip_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    union lora_msg_any out;
    char err[256] = "", want[64];
    struct lora_buf js = {0};

    if (encode(t, msg, &buf, bins, &n_bins) != 0) {
        printf("# %s %s: encode failed: %s\n", type_s[t], variant, strerror(errno));
        CHECK(0);
        return;
    }
    CHECK(lora_msg_peek_type(buf.data, buf.len, err, sizeof(err)) == (int)t);
    if (decode(t, buf.data, buf.len, bins, n_bins, arena, &out, err, sizeof(err)) != 0) {
        printf("# %s %s: decode failed: %s\n", type_s[t], variant, err);
        CHECK(0);
        return;
    }
    CHECK(same_dump(t, msg, &out));

    /* the JSON view of the same body names the type */
    snprintf(want, sizeof(want), "\"type\":\"%s\"", type_s[t]);
    CHECK(lora_msg_to_json(buf.data, buf.len, &js, err, sizeof(err)) == 0);
    char *s = buf_string(&js);
    CHECK_CONTAINS(s, want);
    free(s);
    lora_buf_release(&js);
    lora_msg_arena_reset(arena);
}

static void test_round_trip(void)
{
    for_each_sample(round_trip_one);
}

/* Decoded strings are NUL-terminated copies, arrays copies too: the body can go away. */
static void test_decoded_data_is_copied(void)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    struct lora_msg_request r;
    char err[256];

    CHECK(encode(LORA_MSG_REQUEST, &request_full, &buf, bins, &n_bins) == 0);
    CHECK(n_bins == 1);
    char *body = malloc(buf.len);
    int32_t frame[4];
    memcpy(body, buf.data, buf.len);
    memcpy(frame, bins[0].data, sizeof(frame));
    struct lora_msg_bin own = {frame, sizeof(frame)};
    CHECK(lora_msg_decode_request(body, buf.len, &own, 1, arena, &r, err, sizeof(err)) == 0);
    memset(body, 0, buf.len);
    memset(frame, 0, sizeof(frame));
    free(body);
    CHECK(strcmp(r.request_id.s, "req-1") == 0 && r.request_id.len == 5);
    CHECK(strcmp(r.lora.s, "sql") == 0);
    CHECK(r.n_prompt == 4 && r.prompt[1] == 15043 && r.prompt[3] == 2);
    CHECK(r.has_seed && r.seed == UINT64_MAX);
    CHECK(r.n_stop_token_ids == 2 && r.stop_token_ids[1] == 32000);
    CHECK_NEAR(r.temperature, 0.8, 1e-7);
    lora_msg_arena_reset(arena);
}

static void test_empty_types(void)
{
    static const enum lora_msg_type empty[] = {LORA_MSG_HEARTBEAT, LORA_MSG_TAKE_NOTIFICATIONS,
                                               LORA_MSG_RESIDENCY, LORA_MSG_SHUTDOWN};
    char err[128];

    for (int i = 0; i < COUNT(empty); i++) {
        lora_buf_reset(&buf);
        CHECK(lora_msg_encode_empty(&buf, empty[i]) == 0);
        CHECK(lora_msg_peek_type(buf.data, buf.len, err, sizeof(err)) == (int)empty[i]);
    }
    lora_buf_reset(&buf);
    errno = 0;
    CHECK(lora_msg_encode_empty(&buf, LORA_MSG_HELLO) == -1 && errno == EINVAL);
    CHECK(lora_msg_encode_empty(&buf, LORA_MSG_TYPE_COUNT) == -1);
    CHECK(buf.len == 0);
}

/* Every proper prefix of a body is an incomplete value: all must fail, none may overread (each
 * prefix lives in its own allocation of exactly its length). */
static void truncated_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    union lora_msg_any out;
    char err[256];
    struct lora_buf js = {0};

    CHECK(encode(t, msg, &buf, bins, &n_bins) == 0);
    for (size_t len = 0; len < buf.len; len++) {
        char *p = malloc(len ? len : 1);
        memcpy(p, buf.data, len);
        err[0] = '\0';
        if (decode(t, p, len, bins, n_bins, arena, &out, err, sizeof(err)) != -1) {
            printf("# %s %s: prefix of %zu bytes decoded\n", type_s[t], variant, len);
            CHECK(0);
        }
        CHECK(err[0] != '\0');
        CHECK(lora_msg_peek_type(p, len, err, sizeof(err)) == -1);
        CHECK(lora_msg_to_json(p, len, &js, err, sizeof(err)) == -1);
        CHECK(js.len == 0);
        free(p);
    }
    lora_buf_release(&js);
    lora_msg_arena_reset(arena);
}

static void test_truncated(void)
{
    for_each_sample(truncated_one);
}

/* ---- editing encoded bodies: remove, replace or add one key anywhere in the tree ---- */

#define MAX_KPATH 8

struct kstep {
    const char *key; /* NULL: an array index */
    size_t klen;
    long idx;
};

struct kpath {
    int n;
    struct kstep s[MAX_KPATH];
};

enum edit_kind { EDIT_REMOVE, EDIT_REPLACE, EDIT_ADD };

struct edit {
    enum edit_kind kind;
    const msgpack_object *val; /* REPLACE, ADD */
    const char *add_key;       /* ADD: into the map at the path */
};

static bool step_matches(const msgpack_object *k, const struct kstep *st)
{
    return k->type == MSGPACK_OBJECT_STR && st->key && k->via.str.size == st->klen &&
           memcmp(k->via.str.ptr, st->key, st->klen) == 0;
}

static void repack(msgpack_packer *pk, const msgpack_object *o, const struct kpath *p, int level,
                   const struct edit *e)
{
    if (level == p->n) {
        if (e->kind == EDIT_ADD && o->type == MSGPACK_OBJECT_MAP) {
            msgpack_pack_map(pk, o->via.map.size + 1);
            for (uint32_t i = 0; i < o->via.map.size; i++) {
                msgpack_pack_object(pk, o->via.map.ptr[i].key);
                msgpack_pack_object(pk, o->via.map.ptr[i].val);
            }
            msgpack_pack_str_with_body(pk, e->add_key, strlen(e->add_key));
            msgpack_pack_object(pk, *e->val);
        } else {
            msgpack_pack_object(pk, *o);
        }
        return;
    }
    const struct kstep *st = &p->s[level];
    bool here = level == p->n - 1 && e->kind != EDIT_ADD;
    if (o->type == MSGPACK_OBJECT_MAP) {
        uint32_t n = o->via.map.size;
        for (uint32_t i = 0; here && e->kind == EDIT_REMOVE && i < o->via.map.size; i++)
            n -= step_matches(&o->via.map.ptr[i].key, st);
        msgpack_pack_map(pk, n);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (!step_matches(&kv->key, st)) {
                msgpack_pack_object(pk, kv->key);
                msgpack_pack_object(pk, kv->val);
            } else if (here && e->kind == EDIT_REMOVE) {
                continue;
            } else if (here) {
                msgpack_pack_object(pk, kv->key);
                msgpack_pack_object(pk, *e->val);
            } else {
                msgpack_pack_object(pk, kv->key);
                repack(pk, &kv->val, p, level + 1, e);
            }
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (st->key || (long)i != st->idx)
                msgpack_pack_object(pk, o->via.array.ptr[i]);
            else if (here)
                msgpack_pack_object(pk, *e->val);
            else
                repack(pk, &o->via.array.ptr[i], p, level + 1, e);
        }
    } else {
        msgpack_pack_object(pk, *o);
    }
}

static int sbuf_write(void *data, const char *s, size_t n)
{
    struct lora_buf *b = data;
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

/* out = body with the edit applied at path p. */
static void edit_body(const void *body, size_t len, const struct kpath *p, const struct edit *e,
                      struct lora_buf *out)
{
    msgpack_zone zone;
    msgpack_object root;
    msgpack_packer pk;
    size_t off = 0;

    msgpack_zone_init(&zone, 4096);
    lora_buf_reset(out);
    msgpack_packer_init(&pk, out, sbuf_write);
    if (msgpack_unpack(body, len, &off, &zone, &root) == MSGPACK_UNPACK_SUCCESS)
        repack(&pk, &root, p, 0, e);
    msgpack_zone_destroy(&zone);
}

/* "seqs.0.n_tokens" -> path; the keys point into spec, which must outlive the path. */
static struct kpath parse_path(const char *spec)
{
    struct kpath p = {0};
    const char *s = spec;

    while (*s && p.n < MAX_KPATH) {
        size_t n = strcspn(s, ".");
        if (*s >= '0' && *s <= '9')
            p.s[p.n++] = (struct kstep){NULL, 0, strtol(s, NULL, 10)};
        else
            p.s[p.n++] = (struct kstep){s, n, -1};
        s += n;
        if (*s == '.')
            s++;
    }
    return p;
}

struct kpaths {
    struct kpath v[512];
    bool is_map[512]; /* the value at the path is a map */
    int n;
};

/* Every key and array element in the tree, except inside control_reply's opaque data. */
static void collect(const msgpack_object *o, struct kpath *cur, struct kpaths *out)
{
    if (cur->n >= MAX_KPATH)
        return;
    if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR || out->n >= COUNT(out->v))
                continue;
            cur->s[cur->n++] = (struct kstep){k->via.str.ptr, k->via.str.size, -1};
            out->is_map[out->n] = v->type == MSGPACK_OBJECT_MAP;
            out->v[out->n++] = *cur;
            bool opaque = cur->n == 1 && k->via.str.size == 4 && !memcmp(k->via.str.ptr, "data", 4);
            if (!opaque)
                collect(v, cur, out);
            cur->n--;
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size && out->n < COUNT(out->v); i++) {
            const msgpack_object *v = &o->via.array.ptr[i];
            cur->s[cur->n++] = (struct kstep){NULL, 0, (long)i};
            out->is_map[out->n] = v->type == MSGPACK_OBJECT_MAP;
            out->v[out->n++] = *cur;
            collect(v, cur, out);
            cur->n--;
        }
    }
}

/* What an error about path p must mention: "key" or "key[idx]". */
static void path_name(const struct kpath *p, char *s, size_t n)
{
    const struct kstep *last = &p->s[p->n - 1];
    if (last->key)
        snprintf(s, n, "%.*s", (int)last->klen, last->key);
    else if (p->n >= 2 && p->s[p->n - 2].key)
        snprintf(s, n, "%.*s[%ld]", (int)p->s[p->n - 2].klen, p->s[p->n - 2].key, last->idx);
    else
        snprintf(s, n, "[%ld]", last->idx);
}

static msgpack_object mp_int(int64_t v)
{
    msgpack_object o = {.type = v < 0 ? MSGPACK_OBJECT_NEGATIVE_INTEGER
                                      : MSGPACK_OBJECT_POSITIVE_INTEGER};
    o.via.i64 = v;
    return o;
}

static msgpack_object mp_str(const char *s)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)strlen(s);
    return o;
}

static msgpack_object mp_f64(double x)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_FLOAT64};
    o.via.f64 = x;
    return o;
}

/* A value of another type than v: strings and containers become 7, the rest "x". */
static msgpack_object wrong_for(const msgpack_object *v)
{
    switch (v->type) {
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_ARRAY:
    case MSGPACK_OBJECT_MAP:
        return mp_int(7);
    default:
        return mp_str("x");
    }
}

static const msgpack_object *object_at(const msgpack_object *o, const struct kpath *p)
{
    for (int l = 0; o && l < p->n; l++) {
        const struct kstep *st = &p->s[l];
        const msgpack_object *next = NULL;
        if (o->type == MSGPACK_OBJECT_MAP) {
            for (uint32_t i = 0; i < o->via.map.size; i++) {
                if (step_matches(&o->via.map.ptr[i].key, st))
                    next = &o->via.map.ptr[i].val;
            }
        } else if (o->type == MSGPACK_OBJECT_ARRAY && !st->key &&
                   st->idx < (long)o->via.array.size) {
            next = &o->via.array.ptr[st->idx];
        }
        o = next;
    }
    return o;
}

static struct lora_buf edited;

/* For every key and element of a full sample: a wrong type fails naming it; removal fails with
 * "KEY: missing" unless the key is optional, and then the message still decodes. */
static void wrong_and_missing_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    union lora_msg_any out;
    char err[256], name[64], want[96];
    msgpack_zone zone;
    msgpack_object root;
    size_t off = 0;
    static struct kpaths paths;
    struct kpath cur = {0};

    if (strcmp(variant, "full") != 0)
        return;
    CHECK(encode(t, msg, &buf, bins, &n_bins) == 0);
    char *body = malloc(buf.len);
    size_t len = buf.len;
    memcpy(body, buf.data, len);
    msgpack_zone_init(&zone, 4096);
    CHECK(msgpack_unpack(body, len, &off, &zone, &root) == MSGPACK_UNPACK_SUCCESS);
    paths.n = 0;
    collect(&root, &cur, &paths);
    for (int i = 0; i < paths.n; i++) {
        const struct kpath *p = &paths.v[i];
        msgpack_object bad = wrong_for(object_at(&root, p));
        struct edit replace = {EDIT_REPLACE, &bad, NULL}, remove = {EDIT_REMOVE, NULL, NULL};

        path_name(p, name, sizeof(name));
        edit_body(body, len, p, &replace, &edited);
        err[0] = '\0';
        if (decode(t, edited.data, edited.len, bins, n_bins, arena, &out, err, sizeof(err)) == 0) {
            printf("# %s: a wrong type for %s decoded\n", type_s[t], name);
            CHECK(0);
        } else {
            CHECK_CONTAINS(err, name);
        }
        if (!p->s[p->n - 1].key)
            continue;
        edit_body(body, len, p, &remove, &edited);
        int rc = decode(t, edited.data, edited.len, bins, n_bins, arena, &out, err, sizeof(err));
        if (is_optional(&codecs[t], name)) { /* optional keys are named alike at any depth */
            if (rc != 0)
                printf("# %s: without optional %s: %s\n", type_s[t], name, err);
            CHECK(rc == 0);
        } else if (rc == 0) {
            printf("# %s: without %s it decoded\n", type_s[t], name);
            CHECK(0);
        } else if (t == LORA_MSG_OUTPUT && strcmp(name, "top_n") == 0) {
            CHECK_CONTAINS(err, "top_ids");
        } else {
            snprintf(want, sizeof(want), "%s: missing", name);
            CHECK_CONTAINS(err, want);
        }
    }
    msgpack_zone_destroy(&zone);
    free(body);
    lora_msg_arena_reset(arena);
}

static void test_wrong_type_and_missing_key(void)
{
    for_each_sample(wrong_and_missing_one);
}

/* Unknown keys, at the top and in every nested map, change nothing. */
static void unknown_keys_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    union lora_msg_any out;
    char err[256];
    msgpack_zone zone;
    msgpack_object root;
    size_t off = 0;
    static struct kpaths paths;
    struct kpath cur = {0};
    msgpack_object elems[3] = {mp_int(1), mp_f64(2.5), mp_str("x")};
    msgpack_object extra = {.type = MSGPACK_OBJECT_ARRAY};
    extra.via.array.size = 3;
    extra.via.array.ptr = elems;
    struct edit add = {EDIT_ADD, &extra, "zz_unknown_future_key"};

    CHECK(encode(t, msg, &buf, bins, &n_bins) == 0);
    char *body = malloc(buf.len);
    size_t len = buf.len;
    memcpy(body, buf.data, len);
    msgpack_zone_init(&zone, 4096);
    CHECK(msgpack_unpack(body, len, &off, &zone, &root) == MSGPACK_UNPACK_SUCCESS);
    paths.n = 0;
    collect(&root, &cur, &paths);
    for (int i = -1; i < paths.n; i++) {
        if (i >= 0 && (!paths.is_map[i] || (paths.v[i].s[0].key && paths.v[i].s[0].klen == 4 &&
                                            !memcmp(paths.v[i].s[0].key, "data", 4))))
            continue;
        edit_body(body, len, i < 0 ? &cur : &paths.v[i], &add, &edited);
        CHECK(edited.len > len);
        if (decode(t, edited.data, edited.len, bins, n_bins, arena, &out, err, sizeof(err))) {
            printf("# %s %s: with an unknown key: %s\n", type_s[t], variant, err);
            CHECK(0);
            continue;
        }
        CHECK(same_dump(t, msg, &out));
    }
    msgpack_zone_destroy(&zone);
    free(body);
    lora_msg_arena_reset(arena);
}

static void test_unknown_keys_ignored(void)
{
    for_each_sample(unknown_keys_one);
}

/* Decodes sample t with the value at path spec replaced by v; returns the decoder's result. */
static int decode_edited(enum lora_msg_type t, const void *msg, const char *spec, msgpack_object v,
                         enum edit_kind kind, union lora_msg_any *out, char *err, size_t err_len)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    struct kpath p = parse_path(spec);
    struct edit e = {kind, &v, spec};

    if (kind == EDIT_ADD)
        p.n = 0;
    encode(t, msg, &buf, bins, &n_bins);
    edit_body(buf.data, buf.len, &p, &e, &edited);
    err[0] = '\0';
    return decode(t, edited.data, edited.len, bins, n_bins, arena, out, err, err_len);
}

static void test_numbers(void)
{
    union lora_msg_any o;
    char err[256];

    /* floats: float64 and integers accepted where a float32 is usual */
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "temperature", mp_f64(0.5), EDIT_REPLACE,
                        &o, err, sizeof(err)) == 0);
    CHECK(o.request.temperature == 0.5f);
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "top_p", mp_int(1), EDIT_REPLACE, &o, err,
                        sizeof(err)) == 0);
    CHECK(o.request.top_p == 1.0f);
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "temperature", mp_int(-2), EDIT_REPLACE,
                        &o, err, sizeof(err)) == 0);
    CHECK(o.request.temperature == -2.0f);
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "temperature", mp_f64(NAN), EDIT_REPLACE,
                        &o, err, sizeof(err)) == 0);
    CHECK(isnan(o.request.temperature));
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "temperature", mp_f64(1e300), EDIT_REPLACE,
                        &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: temperature: 1e+300 is out of range for a float");
    CHECK(decode_edited(LORA_MSG_STATS, &stats_full, "kv_usage", mp_int(1), EDIT_REPLACE, &o, err,
                        sizeof(err)) == 0);
    CHECK(o.stats.kv_usage == 1.0);
    /* integers: no floats, range of the C type, no negative counts */
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "top_k", mp_f64(1.0), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: top_k: expected an integer");
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "rank", mp_int(2147483648), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "hello: rank: 2147483648 is out of range");
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "rank", mp_int(2147483647), EDIT_REPLACE, &o,
                        err, sizeof(err)) == 0);
    CHECK(o.hello.rank == INT32_MAX);
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "max_tokens", mp_int(-1), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: max_tokens: -1 is out of range");
    CHECK(decode_edited(LORA_MSG_STEP, &step_full, "step_id", mp_int(-1), EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: step_id: -1 is negative");
    CHECK(decode_edited(LORA_MSG_STEP, &step_full, "seqs.1.slot", mp_int(-2), EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: seqs[1].slot: -2 is out of range");
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "logprobs", mp_int(LORA_MSG_MAX_TOP + 1),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: logprobs:");
    CHECK(decode_edited(LORA_MSG_OUTPUT, &output_full, "tokens.1", mp_int(INT64_MIN), EDIT_REPLACE,
                        &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "output: tokens[1]: -9223372036854775808 is out of range");
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "pid", mp_int(INT64_MAX), EDIT_REPLACE, &o,
                        err, sizeof(err)) == 0);
    CHECK(o.hello.pid == INT64_MAX);
    lora_msg_arena_reset(arena);
}

/* An asynchronous activate reads back; async on another op is refused by the decoder too. */
static void test_activate_async(void)
{
    union lora_msg_any o;
    char err[256];
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    struct lora_msg_adapter_op a = adapter_op_full;

    a.op = LORA_OP_ACTIVATE;
    a.async = true;
    lora_buf_reset(&buf);
    CHECK(lora_msg_encode_adapter_op(&buf, &a, bins, &n_bins) == 0);
    CHECK(lora_msg_decode_adapter_op(buf.data, buf.len, NULL, 0, arena, &o.adapter_op, err,
                                     sizeof(err)) == 0);
    CHECK(o.adapter_op.async && o.adapter_op.op == LORA_OP_ACTIVATE && o.adapter_op.slot == 1);
    msgpack_object yes = {.type = MSGPACK_OBJECT_BOOLEAN, .via.boolean = true};
    CHECK(decode_edited(LORA_MSG_ADAPTER_OP, &adapter_op_full, "async", yes, EDIT_ADD, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter_op: async: only op activate takes it");
    lora_msg_arena_reset(arena);
}

/* The KV budget of setup and the blocks of setup_done: optional, bounded, absent when 0. */
static void test_kv_budget(void)
{
    union lora_msg_any o;
    char err[256];
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;

    CHECK(decode_edited(LORA_MSG_SETUP, &setup_full, "kv_cache_fraction", mp_int(1), EDIT_REPLACE,
                        &o, err, sizeof(err)) == 0);
    CHECK(o.setup.kv_cache_fraction == 1.0 && o.setup.kv_cache_bytes == 268435456);
    CHECK(decode_edited(LORA_MSG_SETUP, &setup_full, "kv_cache_fraction", mp_f64(1.5),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "setup: kv_cache_fraction: 1.5 is out of range [0, 1]");
    CHECK(decode_edited(LORA_MSG_SETUP, &setup_full, "kv_cache_fraction", mp_f64(NAN),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "setup: kv_cache_fraction:");
    CHECK(decode_edited(LORA_MSG_SETUP, &setup_full, "gpu_memory_utilization", mp_f64(1.01),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "setup: gpu_memory_utilization: 1.01 is out of range [0, 1]");
    CHECK(decode_edited(LORA_MSG_SETUP, &setup_full, "gpu_memory_utilization", mp_int(1),
                        EDIT_REPLACE, &o, err, sizeof(err)) == 0);
    CHECK(o.setup.gpu_memory_utilization == 1.0);
    CHECK(decode_edited(LORA_MSG_SETUP_DONE, &setup_done_full, "memory_free", mp_int(85899345921),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "setup_done: memory_free: 85899345921 bytes is more than memory_total");
    CHECK(decode_edited(LORA_MSG_SETUP, &setup_full, "kv_cache_bytes", mp_int(-1), EDIT_REPLACE,
                        &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "setup: kv_cache_bytes: -1 is negative");
    CHECK(decode_edited(LORA_MSG_SETUP_DONE, &setup_done_full, "kv_blocks", mp_int(-1),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "setup_done: kv_blocks: -1 is out of range");
    /* An engine without a budget: the cap is the count, the budget reads as 0. */
    lora_buf_reset(&buf);
    CHECK(lora_msg_encode_setup(&buf, &setup_min, bins, &n_bins) == 0);
    CHECK(lora_msg_decode_setup(buf.data, buf.len, NULL, 0, arena, &o.setup, err, sizeof(err)) ==
          0);
    CHECK(o.setup.kv_cache_bytes == 0 && o.setup.kv_cache_fraction == 0 &&
          o.setup.limits.num_kv_blocks == 2048);
    /* 0 blocks (a refusal) is absent on the wire, and reads back as 0. */
    struct lora_buf text = {0};
    lora_buf_reset(&buf);
    CHECK(lora_msg_encode_setup_done(&buf, &setup_done_min, bins, &n_bins) == 0);
    CHECK(lora_msg_to_json(buf.data, buf.len, &text, err, sizeof(err)) == 0);
    CHECK(lora_buf_add(&text, "", 1) == 0 && !strstr(text.data, "kv_blocks"));
    CHECK(lora_msg_decode_setup_done(buf.data, buf.len, NULL, 0, arena, &o.setup_done, err,
                                     sizeof(err)) == 0);
    CHECK(o.setup_done.kv_blocks == 0);
    struct lora_msg_setup_done d = setup_done_min;
    d.kv_blocks = 7;
    lora_buf_reset(&buf);
    CHECK(lora_msg_encode_setup_done(&buf, &d, bins, &n_bins) == 0);
    CHECK(lora_msg_decode_setup_done(buf.data, buf.len, NULL, 0, arena, &o.setup_done, err,
                                     sizeof(err)) == 0);
    CHECK(o.setup_done.kv_blocks == 7);
    /* The encoders refuse what the decoders would. */
    size_t before = buf.len;
    struct lora_msg_setup s = setup_full;
    s.kv_cache_fraction = 2;
    errno = 0;
    CHECK(lora_msg_encode_setup(&buf, &s, bins, &n_bins) == -1 && errno == EINVAL);
    s.kv_cache_fraction = NAN;
    CHECK(lora_msg_encode_setup(&buf, &s, bins, &n_bins) == -1 && errno == EINVAL);
    d.kv_blocks = -1;
    CHECK(lora_msg_encode_setup_done(&buf, &d, bins, &n_bins) == -1 && errno == EINVAL);
    CHECK(buf.len == before);
    lora_buf_release(&text);
    lora_msg_arena_reset(arena);
}

static void test_strings_and_enums(void)
{
    union lora_msg_any o;
    char err[256];
    static char long_name[LORA_MSG_MAX_STR + 2];
    msgpack_object nul = mp_str("ab");

    memset(long_name, 'a', LORA_MSG_MAX_STR + 1);
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "name", mp_str(long_name), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "hello: name: string of 4097 bytes, the limit is 4096");
    long_name[LORA_MSG_MAX_STR] = '\0';
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "name", mp_str(long_name), EDIT_REPLACE, &o,
                        err, sizeof(err)) == 0);
    CHECK(o.hello.name.len == LORA_MSG_MAX_STR && o.hello.name.s[LORA_MSG_MAX_STR] == '\0');
    nul.via.str.ptr = "a\0b";
    nul.via.str.size = 3;
    CHECK(decode_edited(LORA_MSG_REGISTRY, &registry_full, "adapters.1.path", nul, EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "registry: adapters[1].path: string contains a NUL byte");
    CHECK(decode_edited(LORA_MSG_NOTIFICATIONS, &notifications_full, "items.0.state.pinned.0",
                        mp_int(3), EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "notifications: items[0].state.pinned[0]: expected a string");
    /* enums travel as strings and unknown values are rejected */
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "role", mp_str("robot"), EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "hello: role: unknown value 'robot'");
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "role", mp_int(0), EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "hello: role: expected a string");
    CHECK(decode_edited(LORA_MSG_NOTIFICATIONS, &notifications_full, "items.0.timings.1.transition",
                        mp_str("activate"), EDIT_REPLACE, &o, err, sizeof(err)) == 0);
    CHECK(o.notifications.items[0].timings[1].transition == LORA_TRANSITION_ACTIVATE);
    CHECK(decode_edited(LORA_MSG_EVENT, &event_full, "event", mp_str("PREEMPTED"), EDIT_REPLACE, &o,
                        err, sizeof(err)) == 0);
    CHECK(o.event.event == LORA_EVENT_PREEMPTED);
    CHECK(decode_edited(LORA_MSG_EVENT, &event_full, "event", mp_str("finished"), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK(decode_edited(LORA_MSG_CONTROL, &control_full, "op", mp_str("stats"), EDIT_REPLACE, &o,
                        err, sizeof(err)) == 0);
    CHECK(o.control.op == LORA_CTL_STATS);
    /* ops that need a name, a path or a slot */
    CHECK(decode_edited(LORA_MSG_CONTROL, &control_min, "op", mp_str("unload"), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "control: name: missing (op unload needs it)");
    CHECK(decode_edited(LORA_MSG_ADAPTER_OP, &adapter_op_min, "op", mp_str("activate"),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter_op: slot: missing (op activate needs it)");
    /* a decoder given another type's message */
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "type", mp_str("ready"), EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "hello: type: got 'ready'");
    /* a key given twice */
    CHECK(decode_edited(LORA_MSG_HELLO, &hello_full, "rank", mp_int(1), EDIT_ADD, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "hello: rank: duplicate key");
    /* control_reply data must be a map or an array; its bytes come back verbatim */
    CHECK(decode_edited(LORA_MSG_CONTROL_REPLY, &control_reply_full, "data", mp_str("x"),
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "control_reply: data: expected a map or an array");
    CHECK(decode_edited(LORA_MSG_CONTROL_REPLY, &control_reply_full, "ok", mp_int(1), EDIT_REPLACE,
                        &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "control_reply: ok: expected a boolean");
    CHECK(decode_edited(LORA_MSG_CONTROL_REPLY, &control_reply_full, "zz", mp_int(1), EDIT_ADD, &o,
                        err, sizeof(err)) == 0);
    CHECK(o.control_reply.data_len == sizeof(reply_data) - 1 &&
          memcmp(o.control_reply.data, reply_data, sizeof(reply_data) - 1) == 0);
    lora_msg_arena_reset(arena);
}

/* Array lengths against each other and against the bounds. */
static void test_array_bounds(void)
{
    union lora_msg_any o;
    char err[256];
    msgpack_object one[1] = {mp_int(1)};
    msgpack_object arr = {.type = MSGPACK_OBJECT_ARRAY};

    arr.via.array.size = 1;
    arr.via.array.ptr = one;
    CHECK(decode_edited(LORA_MSG_OUTPUT, &output_full, "logprobs", arr, EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "output: logprobs: 1 values, but tokens has 2");
    CHECK(decode_edited(LORA_MSG_OUTPUT, &output_full, "top_ids", arr, EDIT_REPLACE, &o, err,
                        sizeof(err)) == -1);
    CHECK_CONTAINS(err, "output: top_ids: 1 values, n_tokens * top_n is 4");
    CHECK(decode_edited(LORA_MSG_STEP_REPLY, &step_reply_full, "outs.0.top_logprobs", arr,
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step_reply: outs[0].top_logprobs: 1 values, but top_ids has 2");
    CHECK(decode_edited(LORA_MSG_STEP_REPLY, &step_reply_full, "outs.0.prompt_ranks", arr,
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step_reply: outs[0].prompt_ranks: 1 values, but prompt_logprobs has 3");
    CHECK(decode_edited(LORA_MSG_OUTPUT, &output_full, "prompt_ranks", arr, EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "output: prompt_ranks: 1 values, but prompt_logprobs has 3");
    CHECK(decode_edited(LORA_MSG_OUTPUT, &output_full, "prompt_top_ids", arr, EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "output: prompt_top_ids: 1 values, prompt positions * prompt_top_n is 3");
    CHECK(decode_edited(LORA_MSG_STEP_REPLY, &step_reply_full, "outs.0.prompt_top_logprobs", arr,
                        EDIT_REPLACE, &o, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "outs[0].prompt_top_logprobs: 1 values, prompt positions * prompt_top_n");

    /* one element over each bound: well-formed arrays of nil */
    static const struct {
        enum lora_msg_type t;
        const void *msg;
        const char *key;
        uint32_t n;
        const char *want;
    } over[] = {
        {LORA_MSG_STEP, &step_full, "seqs", LORA_MSG_MAX_SEQS + 1,
         "step: seqs: 4097 elements, the limit is 4096"},
        {LORA_MSG_STEP_REPLY, &step_reply_full, "outs", LORA_MSG_MAX_SEQS + 1,
         "step_reply: outs: 4097 elements"},
        {LORA_MSG_STATS, &stats_full, "adapters", LORA_MSG_MAX_ADAPTERS + 1,
         "stats: adapters: 65537 elements, the limit is 65536"},
        {LORA_MSG_REGISTRY, &registry_full, "adapters", LORA_MSG_MAX_ADAPTERS + 1,
         "registry: adapters: 65537 elements"},
        {LORA_MSG_RESIDENCY_REPLY, &residency_reply_full, "state.cpu", LORA_MSG_MAX_ADAPTERS + 1,
         "residency_reply: state.cpu: 65537 elements"},
        {LORA_MSG_NOTIFICATIONS, &notifications_full, "items", LORA_MSG_MAX_ADAPTERS + 1,
         "notifications: items: 65537 elements"},
        {LORA_MSG_STEP_REPLY, &step_reply_full, "outs.0.top_ids", LORA_MSG_MAX_TOP + 1,
         "step_reply: outs[0].top_ids: 1025 elements, the limit is 1024"},
        {LORA_MSG_STEP, &step_full, "seqs.0.allowed", LORA_MSG_MAX_ALLOWED + 1,
         "step: seqs[0].allowed: 1025 elements, the limit is 1024"},
        {LORA_MSG_REQUEST, &request_full, "allowed_token_ids", LORA_MSG_MAX_ALLOWED + 1,
         "request: allowed_token_ids: 1025 elements, the limit is 1024"},
    };
    msgpack_object *nils = calloc(LORA_MSG_MAX_ADAPTERS + 1, sizeof(*nils));
    for (int i = 0; i < COUNT(over); i++) {
        arr.via.array.size = over[i].n;
        arr.via.array.ptr = nils;
        CHECK(decode_edited(over[i].t, over[i].msg, over[i].key, arr, EDIT_REPLACE, &o, err,
                            sizeof(err)) == -1);
        CHECK_CONTAINS(err, over[i].want);
    }
    free(nils);
    lora_msg_arena_reset(arena);
}

/* Bytes written by hand: containers and strings that declare far more than the body holds. */
static void test_lying_lengths(void)
{
    static const unsigned char huge_array[] = {0x83, 0xa4, 't',  'y',  'p',  'e', 0xa4, 's',  't',
                                               'e',  'p',  0xa7, 's',  't',  'e', 'p',  '_',  'i',
                                               'd',  0x01, 0xa4, 's',  'e',  'q', 's',  0xdd, 0x80,
                                               0x00, 0x00, 0x00, 0xc0, 0xc0, 0xc0};
    static const unsigned char huge_map[] = {0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa4, 't', 'y',
                                             'p',  'e',  0xa5, 'h',  'e',  'l',  'l', 'o'};
    static const unsigned char huge_str[] = {0x81, 0xa4, 't',  'y',  'p', 'e', 0xdb,
                                             0x80, 0x00, 0x00, 0x00, 'h', 'i'};
    static const unsigned char huge_bin[] = {0x82, 0xa4, 't',  'y',  'p',  'e',  0xa5,
                                             'a',  'b',  'o',  'r',  't',  0xa1, 'x',
                                             0xc6, 0xff, 0xff, 0xff, 0xff, 0x00};
    static const unsigned char huge_ext[] = {0x81, 0xa1, 'x',  0xc9, 0x7f,
                                             0xff, 0xff, 0xff, 0x01, 0x00};
    static const unsigned char reserved[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xc1};
    static const unsigned char trailing[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xa5, 's',
                                             'h',  'u',  't', 'd', 'o', 'w', 'n',  0xc0};
    static const struct {
        const unsigned char *p;
        size_t len;
        const char *want;
    } cases[] = {
        {huge_array, sizeof(huge_array), "truncated"},
        {huge_map, sizeof(huge_map), "truncated"},
        {huge_str, sizeof(huge_str), "truncated"},
        {huge_bin, sizeof(huge_bin), "truncated"},
        {huge_ext, sizeof(huge_ext), "truncated"},
        {reserved, sizeof(reserved), "reserved byte 0xc1"},
        {trailing, sizeof(trailing), "trailing bytes"},
    };
    union lora_msg_any o;
    char err[256];
    struct lora_buf js = {0};
    clock_t start = clock();

    for (int i = 0; i < COUNT(cases); i++) {
        for (int t = 0; t < LORA_MSG_TYPE_COUNT; t++) {
            CHECK(decode((enum lora_msg_type)t, cases[i].p, cases[i].len, NULL, 0, arena, &o, err,
                         sizeof(err)) == -1);
            CHECK_CONTAINS(err, cases[i].want);
        }
        CHECK(lora_msg_peek_type(cases[i].p, cases[i].len, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, cases[i].want);
        CHECK(lora_msg_to_json(cases[i].p, cases[i].len, &js, err, sizeof(err)) == -1);
    }
    /* nesting: 100000 one-element arrays */
    size_t deep_len = 100001;
    unsigned char *deep = malloc(deep_len);
    memset(deep, 0x91, deep_len - 1);
    deep[deep_len - 1] = 0xc0;
    CHECK(lora_msg_peek_type(deep, deep_len, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "nested too deeply");
    CHECK(lora_msg_decode_hello(deep, deep_len, NULL, 0, arena, &o.hello, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "nested too deeply");
    CHECK(lora_msg_to_json(deep, deep_len, &js, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "nested too deeply");
    free(deep);
    /* a body over the limit is refused before it is read */
    size_t big_len = LORA_MSG_MAX_BODY + 1;
    unsigned char *big = calloc(1, big_len);
    CHECK(lora_msg_decode_abort(big, big_len, NULL, 0, arena, &o.abort, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "abort: body: larger than LORA_MSG_MAX_BODY");
    CHECK(lora_msg_peek_type(big, big_len, err, sizeof(err)) == -1);
    CHECK(lora_msg_to_json(big, big_len, &js, err, sizeof(err)) == -1);
    free(big);
    /* not a map, empty, no type, type not a string, unknown type */
    static const unsigned char array[] = {0x91, 0x01}, no_type[] = {0x81, 0xa1, 'x', 0x01},
                               int_type[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0x05},
                               bogus[] = {0x81, 0xa4, 't', 'y', 'p', 'e',
                                          0xa5, 'b',  'o', 'g', 'u', 's'},
                               dup[] = {0x82, 0xa4, 't', 'y', 'p',  'e', 0xa5, 'a',
                                        'b',  'o',  'r', 't', 0xa4, 't', 'y',  'p',
                                        'e',  0xa5, 'a', 'b', 'o',  'r', 't'};
    CHECK(lora_msg_peek_type(array, sizeof(array), err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: body: not a map");
    CHECK(lora_msg_decode_abort(array, sizeof(array), NULL, 0, arena, &o.abort, err, sizeof(err)) ==
          -1);
    CHECK_CONTAINS(err, "abort: body: not a map");
    CHECK(lora_msg_peek_type(array, 0, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: body: empty (0 bytes)");
    /* A fault at a known byte names it: the map's second string is cut after 2 of 5 bytes. */
    CHECK(lora_msg_peek_type(dup, 9, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: body: truncated at byte ");
    CHECK_CONTAINS(err, " of 9");
    CHECK(lora_msg_peek_type(no_type, sizeof(no_type), err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: type: missing");
    CHECK(lora_msg_peek_type(int_type, sizeof(int_type), err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: type: expected a string");
    CHECK(lora_msg_peek_type(bogus, sizeof(bogus), err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: type: unknown type 'bogus'");
    CHECK(lora_msg_peek_type(dup, sizeof(dup), err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "message: type: duplicate key");
    CHECK(lora_msg_decode_abort(dup, sizeof(dup), NULL, 0, arena, &o.abort, err, sizeof(err)) ==
          -1);
    CHECK_CONTAINS(err, "abort: type: duplicate key");
    CHECK(lora_msg_peek_type(bogus, sizeof(bogus), NULL, 0) == -1);
    CHECK(js.len == 0);
    lora_buf_release(&js);
    CHECK((double)(clock() - start) / CLOCKS_PER_SEC < 1.0);
    lora_msg_arena_reset(arena);
}

/* The binary frames of step and request: counts in the map against the frame sizes. */
static void test_frames(void)
{
    struct lora_msg_bin bins[MAX_BINS], b2[MAX_BINS];
    int n_bins;
    struct lora_msg_step s;
    struct lora_msg_request r;
    char err[256];
    union lora_msg_any o;

    CHECK(encode(LORA_MSG_STEP, &step_full, &buf, bins, &n_bins) == 0);
    CHECK(n_bins == 2 && bins[0].data == step_tokens && bins[0].len == 16);
    CHECK(bins[1].data == step_blocks && bins[1].len == 12);
    CHECK(lora_msg_decode_step(buf.data, buf.len, bins, 0, arena, &s, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: n_tokens_total: 4 values, but frame 0 is missing");
    CHECK(lora_msg_decode_step(buf.data, buf.len, bins, 1, arena, &s, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: n_block_entries: 3 values, but frame 1 is missing");
    memcpy(b2, bins, sizeof(bins));
    b2[0].len = 12;
    CHECK(lora_msg_decode_step(buf.data, buf.len, b2, 2, arena, &s, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: n_tokens_total: 4 values, but frame 0 holds 12 bytes");
    b2[0].len = 15;
    CHECK(lora_msg_decode_step(buf.data, buf.len, b2, 2, arena, &s, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "frame 0 holds 15 bytes");
    memcpy(b2, bins, sizeof(bins));
    b2[1].len = 16;
    CHECK(lora_msg_decode_step(buf.data, buf.len, b2, 2, arena, &s, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: n_block_entries: 3 values, but frame 1 holds 16 bytes");
    memcpy(b2, bins, sizeof(bins));
    b2[0].data = NULL;
    CHECK(lora_msg_decode_step(buf.data, buf.len, b2, 2, arena, &s, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "frame 0 has no data");
    /* frames need no alignment; extra frames are ignored */
    char *unaligned = malloc(1 + sizeof(step_tokens));
    memcpy(unaligned + 1, step_tokens, sizeof(step_tokens));
    memcpy(b2, bins, sizeof(bins));
    b2[0].data = unaligned + 1;
    b2[2] = (struct lora_msg_bin){"zz", 2};
    CHECK(lora_msg_decode_step(buf.data, buf.len, b2, 3, arena, &s, err, sizeof(err)) == 0);
    CHECK(s.n_tokens_total == 4 && s.tokens[3] == 99 && s.block_tables[2] == 9);
    CHECK(s.n_seqs == 2 && s.seqs[1].n_blocks == 2 && s.seqs[0].seed == 9007199254740993u);
    free(unaligned);
    /* the counts in the map against the seqs */
    CHECK(decode_edited(LORA_MSG_STEP, &step_full, "n_tokens_total", mp_int(5), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: n_tokens_total: 5, but the seqs' n_tokens add up to 4");
    CHECK(decode_edited(LORA_MSG_STEP, &step_full, "seqs.1.n_blocks", mp_int(1), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "step: n_block_entries: 3, but the seqs' n_blocks add up to 2");
    /* an empty step needs no frames */
    CHECK(encode(LORA_MSG_STEP, &step_min, &buf, bins, &n_bins) == 0);
    CHECK(lora_msg_decode_step(buf.data, buf.len, NULL, 0, arena, &s, err, sizeof(err)) == 0);
    CHECK(s.n_seqs == 0 && s.tokens == NULL && s.n_block_entries == 0);

    CHECK(encode(LORA_MSG_REQUEST, &request_full, &buf, bins, &n_bins) == 0);
    CHECK(n_bins == 1 && bins[0].len == 16);
    CHECK(lora_msg_decode_request(buf.data, buf.len, NULL, 0, arena, &r, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: n_prompt: 4 values, but frame 0 is missing");
    b2[0] = (struct lora_msg_bin){request_prompt, 20};
    CHECK(lora_msg_decode_request(buf.data, buf.len, b2, 1, arena, &r, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: n_prompt: 4 values, but frame 0 holds 20 bytes");
    CHECK(decode_edited(LORA_MSG_REQUEST, &request_full, "n_prompt", mp_int(3), EDIT_REPLACE, &o,
                        err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "request: n_prompt: 3 values, but frame 0 holds 16 bytes");
    lora_msg_arena_reset(arena);
}

/* Encoders refuse what a decoder would refuse, and leave the buffer as it was. */
static void test_encoder_checks(void)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    char with_nul[] = "a\0b";
    static char long_str[LORA_MSG_MAX_STR + 1];

    lora_buf_reset(&buf);
    CHECK(lora_msg_encode_empty(&buf, LORA_MSG_HEARTBEAT) == 0);
    size_t before = buf.len;

    struct lora_msg_hello h = hello_full;
    h.name = (struct lora_str){with_nul, 3};
    errno = 0;
    CHECK(lora_msg_encode_hello(&buf, &h, bins, &n_bins) == -1 && errno == EINVAL);
    memset(long_str, 'x', sizeof(long_str));
    h.name = (struct lora_str){long_str, sizeof(long_str)};
    CHECK(lora_msg_encode_hello(&buf, &h, bins, &n_bins) == -1 && errno == EINVAL);
    h = hello_full;
    h.role = (enum lora_role)7;
    CHECK(lora_msg_encode_hello(&buf, &h, bins, &n_bins) == -1 && errno == EINVAL);

    struct lora_msg_step s = step_full;
    s.n_tokens_total = 5;
    CHECK(lora_msg_encode_step(&buf, &s, bins, &n_bins) == -1 && errno == EINVAL);
    s = step_full;
    s.n_seqs = -1;
    CHECK(lora_msg_encode_step(&buf, &s, bins, &n_bins) == -1 && errno == EINVAL);
    s = step_full;
    s.n_seqs = LORA_MSG_MAX_SEQS + 1;
    CHECK(lora_msg_encode_step(&buf, &s, bins, &n_bins) == -1 && errno == EINVAL);

    struct lora_msg_adapter_op a = adapter_op_full;
    a.path = NONE;
    CHECK(lora_msg_encode_adapter_op(&buf, &a, bins, &n_bins) == -1 && errno == EINVAL);
    /* async belongs to activate alone. */
    a = adapter_op_full;
    a.async = true;
    CHECK(lora_msg_encode_adapter_op(&buf, &a, bins, &n_bins) == -1 && errno == EINVAL);
    struct lora_msg_ready r = ready_full;
    r.model = NONE;
    CHECK(lora_msg_encode_ready(&buf, &r, bins, &n_bins) == -1 && errno == EINVAL);
    struct lora_msg_output out = output_full;
    out.tokens = NULL;
    CHECK(lora_msg_encode_output(&buf, &out, bins, &n_bins) == -1 && errno == EINVAL);
    struct lora_msg_control_reply cr = control_reply_full;
    cr.data = "\xa1x";
    cr.data_len = 2;
    CHECK(lora_msg_encode_control_reply(&buf, &cr, bins, &n_bins) == -1 && errno == EINVAL);
    cr.data = reply_data;
    cr.data_len = sizeof(reply_data) - 2;
    CHECK(lora_msg_encode_control_reply(&buf, &cr, bins, &n_bins) == -1 && errno == EINVAL);
    struct lora_msg_control c = control_full;
    c.op = LORA_CTL_PIN;
    c.name = NONE;
    CHECK(lora_msg_encode_control(&buf, &c, bins, &n_bins) == -1 && errno == EINVAL);

    CHECK(buf.len == before);
    CHECK(lora_msg_peek_type(buf.data, buf.len, NULL, 0) == LORA_MSG_HEARTBEAT);
    /* two messages appended one after the other are two bodies */
    CHECK(lora_msg_encode_abort(&buf, &abort_full, bins, &n_bins) == 0);
    CHECK(lora_msg_peek_type(buf.data + before, buf.len - before, NULL, 0) == LORA_MSG_ABORT);
}

static void test_json(void)
{
    /* {"type":"x","f32":1.5,"nan":NaN,"inf":-inf (f32),"bin":b"hello","u64":2^64-1,
     *  "neg":-5,"min":INT64_MIN,7:"seven",true:nil,"bad":"\xff\xfeok","ext":ext(1,"ab"),
     *  "arr":[1,[2,{}]],"nul":"a\0b","e":"\xc3\xa9"} */
    msgpack_packer pk;
    struct lora_buf in = {0}, js = {0};
    char err[256];

    msgpack_packer_init(&pk, &in, sbuf_write);
    msgpack_pack_map(&pk, 15);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_str_with_body(&pk, "f32", 3);
    msgpack_pack_float(&pk, 1.5f);
    msgpack_pack_str_with_body(&pk, "nan", 3);
    msgpack_pack_double(&pk, NAN);
    msgpack_pack_str_with_body(&pk, "inf", 3);
    msgpack_pack_float(&pk, -INFINITY);
    msgpack_pack_str_with_body(&pk, "bin", 3);
    msgpack_pack_bin_with_body(&pk, "hello", 5);
    msgpack_pack_str_with_body(&pk, "u64", 3);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    msgpack_pack_str_with_body(&pk, "neg", 3);
    msgpack_pack_int64(&pk, -5);
    msgpack_pack_str_with_body(&pk, "min", 3);
    msgpack_pack_int64(&pk, INT64_MIN);
    msgpack_pack_int(&pk, 7);
    msgpack_pack_str_with_body(&pk, "seven", 5);
    msgpack_pack_true(&pk);
    msgpack_pack_nil(&pk);
    msgpack_pack_str_with_body(&pk, "bad", 3);
    msgpack_pack_str_with_body(&pk, "\xff\xfeok", 4);
    msgpack_pack_str_with_body(&pk, "ext", 3);
    msgpack_pack_ext_with_body(&pk, "ab", 2, 1);
    msgpack_pack_str_with_body(&pk, "arr", 3);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 2);
    msgpack_pack_map(&pk, 0);
    msgpack_pack_str_with_body(&pk, "nul", 3);
    msgpack_pack_str_with_body(&pk, "a\0b", 3);
    msgpack_pack_str_with_body(&pk, "e", 1);
    msgpack_pack_str_with_body(&pk, "\xc3\xa9", 2);

    CHECK(lora_msg_to_json(in.data, in.len, &js, err, sizeof(err)) == 0);
    char *s = buf_string(&js);
    CHECK(strcmp(s, "{\"type\":\"x\",\"f32\":1.5,\"nan\":null,\"inf\":null,\"bin\":\"aGVsbG8=\","
                    "\"u64\":1.8446744073709552e19,\"neg\":-5,\"min\":-9223372036854775808,"
                    "\"7\":\"seven\",\"true\":null,\"bad\":\"\xef\xbf\xbd\xef\xbf\xbdok\","
                    "\"ext\":null,\"arr\":[1,[2,{}]],\"nul\":\"a\\u0000b\","
                    "\"e\":\"\xc3\xa9\"}") == 0);
    if (check_cur_failed)
        printf("# %s\n", s);
    free(s);
    /* base64 padding, and any value at the top */
    static const struct {
        const char *mp;
        size_t len;
        const char *json;
    } small[] = {
        {"\xc4\x01"
         "a",
         3, "\"YQ==\""},
        {"\xc4\x02"
         "ab",
         4, "\"YWI=\""},
        {"\xc4\x00", 2, "\"\""},
        {"\x93\x01\xc2\xc0", 4, "[1,false,null]"},
        {"\xd3\xff\xff\xff\xff\xff\xff\xff\xfe", 9, "-2"},
        {"\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00", 9, "0.5"},
        {"\x81\x92\x01\x02\xa1z", 6, "{\"[1,2]\":\"z\"}"},
        {"\x81\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x01", 11, "{\"1.5\":1}"},
        {"\xd4\x01\x02", 3, "null"},
        /* a NUL in a key: jansson would not read \u0000 back in a key (found by fuzz_msg_json) */
        {"\x81\xa3"
         "a\0b\x01",
         6, "{\"a\xef\xbf\xbd" "b\":1}"},
    };
    for (int i = 0; i < COUNT(small); i++) {
        lora_buf_reset(&js);
        CHECK(lora_msg_to_json(small[i].mp, small[i].len, &js, err, sizeof(err)) == 0);
        s = buf_string(&js);
        if (strcmp(s, small[i].json) != 0) {
            printf("# case %d: got %s, want %s\n", i, s, small[i].json);
            CHECK(0);
        }
        json_t *back = json_loads(s, JSON_DECODE_ANY, NULL);
        CHECK(back != NULL);
        json_decref(back);
        free(s);
    }
    lora_buf_release(&in);
    lora_buf_release(&js);
}

/* Maps used as keys of maps: each level's key is the JSON text of the level below, escaped
 * once more, so without a bound on container keys 30 levels (77 bytes) came to gigabytes.
 * One level is kept, a deeper one is refused at once, and the output stays linear. */
static void test_json_container_keys(void)
{
    unsigned char nested[77];
    struct lora_buf js = {0};
    char err[256];
    size_t n = 0;

    /* {{...{"0123456789abcdef": 0}...: 0}: 0}: 30 maps of one entry, each the key of the next */
    for (int i = 0; i < 30; i++)
        nested[n++] = 0x81;
    nested[n++] = 0xb0;
    memcpy(nested + n, "0123456789abcdef", 16);
    n += 16;
    while (n < sizeof(nested))
        nested[n++] = 0x00;
    CHECK(n == 77);
    clock_t start = clock();
    CHECK(lora_msg_to_json(nested, n, &js, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "a map or array as a map key inside a map or array key");
    CHECK((double)(clock() - start) / CLOCKS_PER_SEC < 0.5);
    CHECK(js.len == 0);

    /* one level of container keys is kept, as text */
    static const unsigned char one[] = {0x81, 0x81, 0x01, 0x02, 0x03};
    lora_buf_reset(&js);
    CHECK(lora_msg_to_json(one, sizeof(one), &js, err, sizeof(err)) == 0);
    char *s = buf_string(&js);
    CHECK(strcmp(s, "{\"{\\\"1\\\":2}\":3}") == 0);
    free(s);
    /* an array key holding a map with an array key: refused as well */
    static const unsigned char arr[] = {0x81, 0x91, 0x81, 0x91, 0x01, 0x02, 0x03};
    lora_buf_reset(&js);
    CHECK(lora_msg_to_json(arr, sizeof(arr), &js, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "map key inside");

    /* the widest input the rule allows: a container key full of strings that each need two
     * escapes; the output stays within a small multiple of the input */
    size_t len = 1 + 1 + 2 + 4000 * 2 + 1;
    unsigned char *w = malloc(len);
    n = 0;
    w[n++] = 0x81;
    w[n++] = 0xdc;
    w[n++] = 4000 >> 8;
    w[n++] = 4000 & 0xff;
    for (int i = 0; i < 4000; i++) {
        w[n++] = 0xa1;
        w[n++] = '"';
    }
    w[n++] = 0x00;
    CHECK(n == len);
    lora_buf_reset(&js);
    CHECK(lora_msg_to_json(w, len, &js, err, sizeof(err)) == 0);
    CHECK(js.len < 8 * len);
    free(w);

    /* nesting one past the bound of 32 levels is a clear error; at the bound it decodes */
    unsigned char deep[40];
    for (int levels = 32; levels <= 33; levels++) {
        memset(deep, 0x91, (size_t)levels);
        deep[levels] = 0x00;
        lora_buf_reset(&js);
        int rc = lora_msg_to_json(deep, (size_t)levels + 1, &js, err, sizeof(err));
        CHECK(rc == (levels == 32 ? 0 : -1));
        if (rc < 0)
            CHECK_CONTAINS(err, "nested too deeply (more than 32 levels)");
    }
    lora_buf_release(&js);
}

/* lora_msg_scan: the framing of a byte stream (lora-metrics --stdin). Fed one byte at a time
 * it finds the same end as fed whole; headers that claim more than a message may hold are
 * refused from the header alone, before the bytes they claim exist. */
static void test_scan(void)
{
    struct lora_buf b = {0};
    struct lora_msg_abort m = {.request_id = {"req-1", 5}};
    struct lora_msg_scan st = {0};
    size_t len = 0;

    CHECK(lora_msg_encode_abort(&b, &m, NULL, NULL) == 0);
    CHECK(lora_msg_scan(&st, b.data, b.len, &len) == LORA_MSG_SCAN_DONE);
    CHECK(len == b.len);
    st = (struct lora_msg_scan){0};
    size_t avail = 0;
    enum lora_msg_scan_result r = LORA_MSG_SCAN_MORE;
    while (r == LORA_MSG_SCAN_MORE && avail < b.len)
        r = lora_msg_scan(&st, b.data, ++avail, &len);
    CHECK(r == LORA_MSG_SCAN_DONE);
    CHECK(avail == b.len && len == b.len);
    static const struct {
        const char *p;
        size_t len;
        enum lora_msg_scan_result want;
        size_t at;
    } cases[] = {
        {"\xdd\xff\xff\xff\xff", 5, LORA_MSG_SCAN_TOO_LARGE, 0}, /* array of 2^32-1 */
        {"\xdf\x00\x80\x00\x00", 5, LORA_MSG_SCAN_TOO_LARGE, 0}, /* map of 2^23: 2^24 values */
        {"\xdb\x01\x00\x00\x00", 5, LORA_MSG_SCAN_TOO_LARGE, 0}, /* str of 16 MiB */
        {"\x92\x01\xdd\x00\xff\xff\xff", 7, LORA_MSG_SCAN_TOO_LARGE, 2},
        {"\xdd\x00\x00\x00\x10", 5, LORA_MSG_SCAN_MORE, 0},        /* 16 values to come */
        {"\xdd\x00\x00", 3, LORA_MSG_SCAN_MORE, 0},                  /* header cut short */
        {"\x92\x01\xc1", 3, LORA_MSG_SCAN_MALFORMED, 2},
        {"\x01", 1, LORA_MSG_SCAN_DONE, 1},
    };
    for (int i = 0; i < COUNT(cases); i++) {
        st = (struct lora_msg_scan){0};
        len = SIZE_MAX;
        r = lora_msg_scan(&st, cases[i].p, cases[i].len, &len);
        CHECK(r == cases[i].want);
        if (r != LORA_MSG_SCAN_MORE)
            CHECK(len == cases[i].at);
        if (check_cur_failed)
            printf("# case %d: got %d at %zu\n", i, (int)r, len);
    }
    lora_buf_release(&b);
}

/* A small arena serves big messages through extra chunks; reset keeps working. */
static void test_arena(void)
{
    struct lora_msg_arena *a = lora_msg_arena_new();
    struct lora_msg_stats st = {.engine = 1}, got;
    struct lora_msg_adapter_count *ac = calloc(20000, sizeof(*ac));
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    char err[256], name[16][8];

    for (int i = 0; i < 16; i++) {
        snprintf(name[i], sizeof(name[i]), "a%d", i);
    }
    for (int i = 0; i < 20000; i++)
        ac[i] = (struct lora_msg_adapter_count){{name[i % 16], strlen(name[i % 16])}, i, 1};
    st.n_adapters = 20000;
    st.adapters = ac;
    CHECK(a != NULL);
    lora_buf_reset(&buf);
    CHECK(lora_msg_encode_stats(&buf, &st, bins, &n_bins) == 0);
    for (int round = 0; round < 3; round++) {
        if (lora_msg_decode_stats(buf.data, buf.len, NULL, 0, a, &got, err, sizeof(err)) != 0) {
            printf("# %s\n", err);
            CHECK(0);
            break;
        }
        CHECK(got.n_adapters == 20000 && got.adapters[19999].running == 19999);
        CHECK(strcmp(got.adapters[17].name.s, "a1") == 0);
        lora_msg_arena_reset(a);
    }
    lora_buf_reset(&buf);
    lora_msg_arena_destroy(&a);
    CHECK(a == NULL);
    lora_msg_arena_destroy(&a);
    CHECK(lora_msg_decode_stats("\x80", 1, NULL, 0, NULL, &got, err, sizeof(err)) == -1);
    free(ac);
}

/* ---- random mutation: never crash; what decodes re-encodes to the same message ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

#define MUTATIONS_PER_SAMPLE 150

static int n_mutants, n_mutants_decoded;

static void mutate(struct lora_buf *m)
{
    static const unsigned char interesting[] = {0x00, 0x7f, 0x80, 0xff, 0xc0, 0xc1, 0xc2, 0xca,
                                                0xcb, 0xcf, 0xd3, 0xd9, 0xdb, 0xdc, 0xdd, 0xde,
                                                0xdf, 0xa0, 0x90, 0x8f, 0xe0, 0xc4, 0xc9, 0xd8};
    int n_ops = 1 + (int)(rng() % 3);

    for (int k = 0; k < n_ops && m->len > 0; k++) {
        size_t at = rng() % m->len;
        switch (rng() % 7) {
        case 0:
            m->data[at] = (char)rng();
            break;
        case 1:
            m->data[at] = (char)interesting[rng() % sizeof(interesting)];
            break;
        case 2:
            m->data[at] = (char)(m->data[at] + (rng() % 2 ? 1 : -1));
            break;
        case 3:
            if (m->len < m->cap) {
                memmove(m->data + at + 1, m->data + at, m->len - at);
                m->data[at] = (char)rng();
                m->len++;
            }
            break;
        case 4:
            memmove(m->data + at, m->data + at + 1, m->len - at - 1);
            m->len--;
            break;
        case 5:
            m->len = at;
            break;
        default: {
            size_t from = rng() % m->len, n = 1 + rng() % 8;
            if (from + n <= m->len && at + n <= m->len)
                memmove(m->data + at, m->data + from, n);
            break;
        }
        }
    }
}

static void mutations_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS], bins2[MAX_BINS];
    int n_bins, n_bins2;
    union lora_msg_any out, again;
    char err[256];
    struct lora_buf m = {0}, js = {0}, re = {0};

    CHECK(encode(t, msg, &buf, bins, &n_bins) == 0);
    for (int i = 0; i < MUTATIONS_PER_SAMPLE; i++) {
        free(m.data);
        m.cap = buf.len + 8;
        m.data = malloc(m.cap);
        memcpy(m.data, buf.data, buf.len);
        m.len = buf.len;
        mutate(&m);
        /* a copy of exactly the mutated length, so that an overread is caught */
        char *p = malloc(m.len ? m.len : 1);
        memcpy(p, m.data, m.len);
        n_mutants++;
        lora_msg_peek_type(p, m.len, err, sizeof(err));
        lora_buf_reset(&js);
        lora_msg_to_json(p, m.len, &js, err, sizeof(err));
        if (decode(t, p, m.len, bins, n_bins, arena, &out, err, sizeof(err)) == 0) {
            n_mutants_decoded++;
            int rc = encode(t, &out, &re, bins2, &n_bins2);
            CHECK(rc == 0);
            if (rc == 0 &&
                decode(t, re.data, re.len, bins2, n_bins2, arena, &again, err, sizeof(err)) == 0) {
                CHECK(same_dump(t, &out, &again));
            } else if (rc == 0) {
                printf("# %s %s: a decoded mutant did not re-decode: %s\n", type_s[t], variant,
                       err);
                CHECK(0);
            }
        } else {
            CHECK(err[0] != '\0');
        }
        free(p);
        lora_msg_arena_reset(arena);
    }
    free(m.data);
    lora_buf_release(&js);
    lora_buf_release(&re);
}

/* A random value of a random type: the values a field's range checks are about. */
static msgpack_object random_value(char *text, size_t text_len)
{
    static const int64_t ints[] = {0,
                                   1,
                                   -1,
                                   2,
                                   7,
                                   255,
                                   65536,
                                   INT32_MAX,
                                   (int64_t)INT32_MAX + 1,
                                   INT32_MIN,
                                   (int64_t)INT32_MIN - 1,
                                   INT64_MAX,
                                   INT64_MIN,
                                   LORA_MSG_MAX_TOP,
                                   LORA_MSG_MAX_SEQS + 1};
    static const double reals[] = {0.0, -0.0, 0.5, -1.5, 1e300, -1e300, 3.5e38, NAN, INFINITY};
    msgpack_object o;

    switch (rng() % 4) {
    case 0:
        return mp_int(ints[rng() % COUNT(ints)]);
    case 1:
        return mp_f64(reals[rng() % COUNT(reals)]);
    case 2: {
        static const char *const words[] = {"", "add", "load", "QUEUED", "worker", "hello", "x"};
        snprintf(text, text_len, "%s", words[rng() % COUNT(words)]);
        return mp_str(text);
    }
    default:
        o = (msgpack_object){.type = rng() % 2 ? MSGPACK_OBJECT_NIL : MSGPACK_OBJECT_BOOLEAN};
        o.via.boolean = rng() % 2;
        return o;
    }
}

/* Structure-aware mutation: one value anywhere in the tree replaced or one key removed. */
static void edits_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS], bins2[MAX_BINS];
    int n_bins, n_bins2;
    union lora_msg_any out, again;
    char err[256], text[16];
    msgpack_zone zone;
    msgpack_object root;
    size_t off = 0;
    static struct kpaths paths;
    struct kpath cur = {0};
    struct lora_buf re = {0};

    CHECK(encode(t, msg, &buf, bins, &n_bins) == 0);
    char *body = malloc(buf.len);
    size_t len = buf.len;
    memcpy(body, buf.data, len);
    msgpack_zone_init(&zone, 4096);
    CHECK(msgpack_unpack(body, len, &off, &zone, &root) == MSGPACK_UNPACK_SUCCESS);
    paths.n = 0;
    collect(&root, &cur, &paths);
    for (int i = 0; i < MUTATIONS_PER_SAMPLE && paths.n > 0; i++) {
        msgpack_object v = random_value(text, sizeof(text));
        struct edit e = {rng() % 8 ? EDIT_REPLACE : EDIT_REMOVE, &v, NULL};
        edit_body(body, len, &paths.v[rng() % (uint64_t)paths.n], &e, &edited);
        n_mutants++;
        if (decode(t, edited.data, edited.len, bins, n_bins, arena, &out, err, sizeof(err))) {
            CHECK(err[0] != '\0');
            continue;
        }
        n_mutants_decoded++;
        CHECK(encode(t, &out, &re, bins2, &n_bins2) == 0);
        CHECK(decode(t, re.data, re.len, bins2, n_bins2, arena, &again, err, sizeof(err)) == 0);
        CHECK(same_dump(t, &out, &again));
        lora_msg_arena_reset(arena);
    }
    msgpack_zone_destroy(&zone);
    lora_buf_release(&re);
    free(body);
    lora_msg_arena_reset(arena);
    (void)variant;
}

static void test_random_mutations(void)
{
    n_mutants = n_mutants_decoded = 0;
    for_each_sample(mutations_one);
    for_each_sample(edits_one);
    printf("# %d mutants, %d decoded\n", n_mutants, n_mutants_decoded);
    CHECK(n_mutants > 10000);
}

/* ---- --emit and --check for tests/e2e/wire.bats ---- */

static int write_file(const char *dir, const char *name, const void *p, size_t len)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f || (len && fwrite(p, 1, len, f) != len) || fclose(f) != 0) {
        fprintf(stderr, "test_msg: fatal: unable to write '%s': %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int emit_dir;
static const char *emit_path;

static void emit_one(enum lora_msg_type t, const void *msg, const char *variant)
{
    struct lora_msg_bin bins[MAX_BINS];
    int n_bins;
    char base[64], name[96];

    if (emit_dir < 0)
        return;
    snprintf(base, sizeof(base), "%s%s", type_s[t], strcmp(variant, "min") == 0 ? ".min" : "");
    if (encode(t, msg, &buf, bins, &n_bins) != 0) {
        fprintf(stderr, "test_msg: fatal: unable to encode %s: %s\n", base, strerror(errno));
        emit_dir = -1;
        return;
    }
    snprintf(name, sizeof(name), "%s.msgpack", base);
    if (write_file(emit_path, name, buf.data, buf.len) < 0)
        emit_dir = -1;
    for (int i = 0; i < n_bins && emit_dir == 0; i++) {
        snprintf(name, sizeof(name), "%s.bin%d", base, i);
        if (write_file(emit_path, name, bins[i].data, bins[i].len) < 0)
            emit_dir = -1;
    }
}

static int emit(const char *dir)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
        fprintf(stderr, "test_msg: fatal: unable to create '%s': %s\n", dir, strerror(errno));
        return 111;
    }
    emit_path = dir;
    emit_dir = 0;
    for_each_sample(emit_one);
    return emit_dir < 0 ? 111 : 0;
}

/* Reads a whole file; NULL when it is not there. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    struct lora_buf b = {0};
    char chunk[65536];
    size_t n;

    if (!f)
        return NULL;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        sbuf_write(&b, chunk, n);
    fclose(f);
    *len = b.len;
    return b.data ? b.data : calloc(1, 1);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void print_json_line(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s ? s : "{\"ok\":false,\"error\":\"unable to format\"}");
    free(s);
    json_decref(o);
}

/* Decodes one file; prints its line; returns true when it decoded. */
static bool check_file(const char *dir, const char *name)
{
    char path[4096], err[512];
    size_t len, bin_len[MAX_BINS];
    struct lora_msg_bin bins[MAX_BINS];
    char *bin_data[MAX_BINS] = {0};
    int n_bins = 0;
    union lora_msg_any out;
    json_t *line = json_object();
    bool ok = false;

    set(line, "file", json_string(name));
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *body = read_file(path, &len);
    size_t base_len = strlen(name) - strlen(".msgpack");
    for (; body && n_bins < MAX_BINS; n_bins++) {
        snprintf(path, sizeof(path), "%s/%.*s.bin%d", dir, (int)base_len, name, n_bins);
        bin_data[n_bins] = read_file(path, &bin_len[n_bins]);
        if (!bin_data[n_bins])
            break;
        bins[n_bins] = (struct lora_msg_bin){bin_data[n_bins], bin_len[n_bins]};
    }
    int t = body ? lora_msg_peek_type(body, len, err, sizeof(err)) : -1;
    if (!body)
        snprintf(err, sizeof(err), "unable to read '%s': %s", name, strerror(errno));
    if (t >= 0 && decode((enum lora_msg_type)t, body, len, bins, n_bins, arena, &out, err,
                         sizeof(err)) == 0) {
        struct lora_buf js = {0};
        char jerr[256];
        json_t *j = NULL;
        if (lora_msg_to_json(body, len, &js, jerr, sizeof(jerr)) == 0)
            j = json_loadb(js.data, js.len, JSON_ALLOW_NUL, NULL);
        lora_buf_release(&js);
        set(line, "ok", json_true());
        set(line, "type", json_string(type_s[t]));
        set(line, "json", j ? j : json_null());
        set(line, "fields", dump((enum lora_msg_type)t, &out));
        ok = true;
    } else {
        set(line, "ok", json_false());
        set(line, "error", json_string(err));
    }
    print_json_line(line);
    for (int i = 0; i < n_bins; i++)
        free(bin_data[i]);
    free(body);
    lora_msg_arena_reset(arena);
    return ok;
}

static int check_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (!d) {
        fprintf(stderr, "test_msg: fatal: unable to open '%s': %s\n", dir, strerror(errno));
        return 111;
    }
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 8 || strcmp(e->d_name + l - 8, ".msgpack") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof(*names));
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), name_cmp);
    for (size_t i = 0; i < n; i++) {
        if (!check_file(dir, names[i]))
            rc = 1;
        free(names[i]);
    }
    free(names);
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv)
{
    int rc;

    arena = lora_msg_arena_new();
    if (!arena) {
        fprintf(stderr, "test_msg: fatal: out of memory\n");
        return 111;
    }
    if (argc == 3 && strcmp(argv[1], "--emit") == 0) {
        rc = emit(argv[2]);
    } else if (argc == 3 && strcmp(argv[1], "--check") == 0) {
        rc = check_dir(argv[2]);
    } else if (argc == 1) {
        RUN(test_type_names);
        RUN(test_round_trip);
        RUN(test_decoded_data_is_copied);
        RUN(test_empty_types);
        RUN(test_truncated);
        RUN(test_wrong_type_and_missing_key);
        RUN(test_unknown_keys_ignored);
        RUN(test_numbers);
        RUN(test_kv_budget);
        RUN(test_activate_async);
        RUN(test_strings_and_enums);
        RUN(test_array_bounds);
        RUN(test_lying_lengths);
        RUN(test_frames);
        RUN(test_encoder_checks);
        RUN(test_json);
        RUN(test_json_container_keys);
        RUN(test_scan);
        RUN(test_arena);
        RUN(test_random_mutations);
        rc = check_done();
    } else {
        fprintf(stderr, "usage: test_msg [--emit DIR | --check DIR]\n");
        rc = 100;
    }
    lora_buf_release(&buf);
    lora_buf_release(&edited);
    lora_msg_arena_destroy(&arena);
    return rc;
}
