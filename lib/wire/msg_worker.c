/* msg_worker: the messages between the engine and its workers (see msg.h): setup, setup_done,
 * step, step_reply, adapter_op, adapter_op_reply, notifications and residency_reply (which the
 * engine also publishes). */
#include "wire/msg_codec.h"

#include <inttypes.h>
#include <limits.h>
#include <string.h>

static const char *const op_names[] = {"add", "activate", "remove", "pin", "unpin"};

/* ---- setup, setup_done ----------------------------------------------------------------------- */

static bool fraction_ok(double f)
{
    return f >= 0 && f <= 1; /* false for NaN too */
}

int lora_msg_encode_setup(struct lora_buf *b, const struct lora_msg_setup *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_bytes = m->kv_cache_bytes > 0, has_fraction = m->kv_cache_fraction > 0;
    bool has_util = m->gpu_memory_utilization > 0;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_SETUP,
                       3 + HAS(m->shm) + has_bytes + has_fraction + has_util);
    if (!fraction_ok(m->kv_cache_fraction) || !fraction_ok(m->gpu_memory_utilization))
        lora_msg_enc_invalid(&e);
    lora_msg_kv_str(&e, "model", m->model);
    lora_msg_kv_int(&e, "rank", m->rank);
    lora_msg_kv_limits(&e, &m->limits);
    lora_msg_kv_ostr(&e, "shm", m->shm);
    if (has_bytes)
        lora_msg_kv_u64(&e, "kv_cache_bytes", m->kv_cache_bytes);
    if (has_fraction)
        lora_msg_kv_f64(&e, "kv_cache_fraction", m->kv_cache_fraction);
    if (has_util)
        lora_msg_kv_f64(&e, "gpu_memory_utilization", m->gpu_memory_utilization);
    return lora_msg_enc_end(&e);
}

static int setup_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_setup *o = p;

    if (lora_msg_get_str(d, m, "model", &o->model) < 0 ||
        lora_msg_get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        lora_msg_limits_fields(d, m, &o->limits) < 0 ||
        lora_msg_opt_str(d, m, "shm", &o->shm) < 0 ||
        lora_msg_opt_u64(d, m, "kv_cache_bytes", &o->kv_cache_bytes) < 0 ||
        lora_msg_opt_f64(d, m, "kv_cache_fraction", &o->kv_cache_fraction) < 0 ||
        lora_msg_opt_f64(d, m, "gpu_memory_utilization", &o->gpu_memory_utilization) < 0)
        return -1;
    if (!fraction_ok(o->kv_cache_fraction))
        return FAIL(d, "kv_cache_fraction", -1, "%g is out of range [0, 1]", o->kv_cache_fraction);
    if (!fraction_ok(o->gpu_memory_utilization))
        return FAIL(d, "gpu_memory_utilization", -1, "%g is out of range [0, 1]",
                    o->gpu_memory_utilization);
    return 0;
}
DEFINE_DECODER(setup, LORA_MSG_SETUP)

int lora_msg_encode_setup_done(struct lora_buf *b, const struct lora_msg_setup_done *m,
                               struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_blocks = m->kv_blocks > 0, has_memory = m->memory_total > 0;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_SETUP_DONE, 3 + HAS(m->error) + has_blocks + 2 * has_memory + m->async_activate);
    if (m->memory_free > m->memory_total)
        lora_msg_enc_invalid(&e);
    if (m->kv_blocks < 0)
        lora_msg_enc_invalid(&e);
    lora_msg_kv_bool(&e, "ok", m->ok);
    lora_msg_kv_ostr(&e, "error", m->error);
    lora_msg_kv_int(&e, "rank", m->rank);
    lora_msg_kv_u64(&e, "weight_bytes", m->weight_bytes);
    if (has_blocks)
        lora_msg_kv_int(&e, "kv_blocks", m->kv_blocks);
    if (has_memory) {
        lora_msg_kv_u64(&e, "memory_total", m->memory_total);
        lora_msg_kv_u64(&e, "memory_free", m->memory_free);
    }
    if (m->async_activate)
        lora_msg_kv_bool(&e, "async_activate", true);
    return lora_msg_enc_end(&e);
}

static int setup_done_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_setup_done *o = p;
    bool present;

    if (lora_msg_get_bool(d, m, "ok", &o->ok) < 0 ||
        lora_msg_opt_str(d, m, "error", &o->error) < 0 ||
        lora_msg_get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        lora_msg_get_u64(d, m, "weight_bytes", &o->weight_bytes) < 0 ||
        lora_msg_opt_int(d, m, "kv_blocks", 0, INT_MAX, &o->kv_blocks, &present) < 0 ||
        lora_msg_opt_u64(d, m, "memory_total", &o->memory_total) < 0 ||
        lora_msg_opt_u64(d, m, "memory_free", &o->memory_free) < 0 ||
        lora_msg_opt_bool(d, m, "async_activate", &o->async_activate) < 0)
        return -1;
    if (o->memory_total == 0)
        o->memory_free = 0; /* free of an unknown total says nothing */
    if (o->memory_free > o->memory_total)
        return FAIL(d, "memory_free", -1, "%" PRIu64 " bytes is more than memory_total",
                    o->memory_free);
    return 0;
}
DEFINE_DECODER(setup_done, LORA_MSG_SETUP_DONE)

/* ---- step, step_reply ----------------------------------------------------------------------- */

#define N_STEP_SEQ_KEYS 14

int lora_msg_encode_step(struct lora_buf *b, const struct lora_msg_step *m,
                         struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    uint64_t sum_tokens = 0, sum_blocks = 0;

    if (n_bins)
        *n_bins = 2;
    lora_msg_enc_begin(&e, b, LORA_MSG_STEP, 4);
    lora_msg_kv_u64(&e, "step_id", m->step_id);
    lora_msg_kv_array(&e, "seqs", m->n_seqs, m->seqs, LORA_MSG_MAX_SEQS);
    for (int i = 0; i < m->n_seqs && !e.error; i++) {
        const struct lora_msg_step_seq *s = &m->seqs[i];
        if (s->n_tokens < 0 || s->n_blocks < 0)
            lora_msg_enc_invalid(&e);
        sum_tokens += (uint64_t)s->n_tokens;
        sum_blocks += (uint64_t)s->n_blocks;
        if (s->n_banned < 0 || s->n_banned > LORA_MSG_MAX_BANNED || s->n_allowed < 0 ||
            s->n_allowed > LORA_MSG_MAX_ALLOWED)
            lora_msg_enc_invalid(&e);
        if (s->prompt_top_n < 0 || s->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
            lora_msg_enc_invalid(&e);
        lora_msg_enc_map(&e, N_STEP_SEQ_KEYS + (s->n_banned > 0) + (s->n_allowed > 0) +
                                 (s->prompt_top_n > 0));
        lora_msg_kv_u64(&e, "seq_id", s->seq_id);
        lora_msg_kv_int(&e, "n_tokens", s->n_tokens);
        lora_msg_kv_int(&e, "pos", s->pos);
        lora_msg_kv_int(&e, "n_blocks", s->n_blocks);
        lora_msg_kv_int(&e, "slot", s->slot);
        lora_msg_kv_bool(&e, "all_logits", s->all_logits);
        lora_msg_kv_bool(&e, "sample", s->sample);
        lora_msg_kv_f32(&e, "temperature", s->temperature);
        lora_msg_kv_f32(&e, "top_p", s->top_p);
        lora_msg_kv_int(&e, "top_k", s->top_k);
        lora_msg_kv_u64(&e, "seed", s->seed);
        lora_msg_kv_int(&e, "n_generated", s->n_generated);
        lora_msg_kv_int(&e, "top_n", s->top_n);
        lora_msg_kv_int(&e, "next_token", s->next_token);
        if (s->n_banned > 0)
            lora_msg_kv_i32s(&e, "banned", s->banned, s->n_banned);
        if (s->n_allowed > 0)
            lora_msg_kv_i32s(&e, "allowed", s->allowed, s->n_allowed);
        if (s->prompt_top_n > 0)
            lora_msg_kv_int(&e, "prompt_top_n", s->prompt_top_n);
    }
    if (sum_tokens != m->n_tokens_total || sum_blocks != m->n_block_entries)
        lora_msg_enc_invalid(&e);
    lora_msg_kv_u64(&e, "n_tokens_total", m->n_tokens_total);
    lora_msg_kv_u64(&e, "n_block_entries", m->n_block_entries);
    lora_msg_bin_frame(&e, bins, 0, m->tokens, m->n_tokens_total);
    lora_msg_bin_frame(&e, bins, 1, m->block_tables, m->n_block_entries);
    return lora_msg_enc_end(&e);
}

static int step_seq_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step_seq *s = p;

    s->n_banned = 0; /* arena memory is not zeroed */
    s->banned = NULL;
    s->n_allowed = 0;
    s->allowed = NULL;
    s->prompt_top_n = 0;
    if (lora_msg_get_u64(d, m, "seq_id", &s->seq_id) < 0 ||
        lora_msg_get_int(d, m, "n_tokens", 0, INT_MAX, &s->n_tokens) < 0 ||
        lora_msg_get_int(d, m, "pos", 0, INT_MAX, &s->pos) < 0 ||
        lora_msg_get_int(d, m, "n_blocks", 0, INT_MAX, &s->n_blocks) < 0 ||
        lora_msg_get_int(d, m, "slot", -1, INT_MAX, &s->slot) < 0 ||
        lora_msg_get_bool(d, m, "all_logits", &s->all_logits) < 0 ||
        lora_msg_get_bool(d, m, "sample", &s->sample) < 0 ||
        lora_msg_get_f32(d, m, "temperature", &s->temperature) < 0 ||
        lora_msg_get_f32(d, m, "top_p", &s->top_p) < 0 ||
        lora_msg_get_int(d, m, "top_k", INT_MIN, INT_MAX, &s->top_k) < 0 ||
        lora_msg_get_u64(d, m, "seed", &s->seed) < 0 ||
        lora_msg_get_int(d, m, "n_generated", 0, INT_MAX, &s->n_generated) < 0 ||
        lora_msg_get_int(d, m, "top_n", 0, LORA_MSG_MAX_TOP, &s->top_n) < 0 ||
        lora_msg_get_int(d, m, "next_token", -1, INT32_MAX, &s->next_token) < 0)
        return -1;
    if (lora_msg_opt_i32_list(d, m, "banned", LORA_MSG_MAX_BANNED, &s->banned, &s->n_banned) < 0 ||
        lora_msg_opt_i32_list(d, m, "allowed", LORA_MSG_MAX_ALLOWED, &s->allowed, &s->n_allowed) <
            0)
        return -1;
    bool present;
    return lora_msg_opt_int(d, m, "prompt_top_n", 0, LORA_MSG_MAX_PROMPT_TOP, &s->prompt_top_n,
                            &present);
}

static int step_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step *o = p;
    const msgpack_object_array *a;
    void *elems;
    struct lora_msg_step_seq *seqs = NULL;
    uint64_t n_tokens, n_blocks, sum_tokens = 0, sum_blocks = 0;

    if (lora_msg_get_u64(d, m, "step_id", &o->step_id) < 0 ||
        lora_msg_get_array(d, m, "seqs", LORA_MSG_MAX_SEQS, &a) < 0 ||
        lora_msg_get_u64(d, m, "n_tokens_total", &n_tokens) < 0 ||
        lora_msg_get_u64(d, m, "n_block_entries", &n_blocks) < 0)
        return -1;
    if (lora_msg_map_array(d, "seqs", a, sizeof(*seqs), step_seq_fields, &elems) < 0)
        return -1;
    seqs = elems;
    for (uint32_t i = 0; i < a->size; i++) {
        sum_tokens += (uint64_t)seqs[i].n_tokens;
        sum_blocks += (uint64_t)seqs[i].n_blocks;
    }
    if (sum_tokens != n_tokens)
        return FAIL(d, "n_tokens_total", -1,
                    "%" PRIu64 ", but the seqs' n_tokens add up to %" PRIu64, n_tokens, sum_tokens);
    if (sum_blocks != n_blocks)
        return FAIL(d, "n_block_entries", -1,
                    "%" PRIu64 ", but the seqs' n_blocks add up to %" PRIu64, n_blocks, sum_blocks);
    if (lora_msg_frame_i32(d, 0, "n_tokens_total", n_tokens, &o->tokens) < 0 ||
        lora_msg_frame_i32(d, 1, "n_block_entries", n_blocks, &o->block_tables) < 0)
        return -1;
    o->n_seqs = (int)a->size;
    o->seqs = seqs;
    o->n_tokens_total = (size_t)n_tokens;
    o->n_block_entries = (size_t)n_blocks;
    return 0;
}
DEFINE_DECODER(step, LORA_MSG_STEP)

int lora_msg_encode_step_reply(struct lora_buf *b, const struct lora_msg_step_reply *m,
                               struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_STEP_REPLY, 6 + HAS(m->error));
    lora_msg_kv_u64(&e, "step_id", m->step_id);
    lora_msg_kv_int(&e, "rank", m->rank);
    lora_msg_kv_bool(&e, "ok", m->ok);
    lora_msg_kv_ostr(&e, "error", m->error);
    lora_msg_kv_bool(&e, "doorbell", m->doorbell);
    lora_msg_kv_f64(&e, "step_seconds", m->step_seconds);
    lora_msg_kv_array(&e, "outs", m->n_outs, m->outs, LORA_MSG_MAX_SEQS);
    for (int i = 0; i < m->n_outs && !e.error; i++) {
        const struct lora_msg_step_out *s = &m->outs[i];
        bool has_ranks = s->prompt_ranks && s->n_prompt_logprobs > 0;
        bool has_ptop = s->prompt_top_n > 0;
        if (s->prompt_top_n < 0 || s->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
            lora_msg_enc_invalid(&e);
        lora_msg_enc_map(&e, 6 + has_ranks + 3 * has_ptop);
        lora_msg_kv_u64(&e, "seq_id", s->seq_id);
        lora_msg_kv_int(&e, "token", s->token);
        lora_msg_kv_f32(&e, "logprob", s->logprob);
        if (s->n_top > LORA_MSG_MAX_TOP)
            lora_msg_enc_invalid(&e);
        lora_msg_kv_i32s(&e, "top_ids", s->top_ids, s->n_top);
        lora_msg_kv_f32s(&e, "top_logprobs", s->top_logprobs, s->n_top);
        lora_msg_kv_f32s(&e, "prompt_logprobs", s->prompt_logprobs, s->n_prompt_logprobs);
        if (has_ranks)
            lora_msg_kv_i32s(&e, "prompt_ranks", s->prompt_ranks, s->n_prompt_logprobs);
        if (has_ptop) {
            long n = (long)s->n_prompt_logprobs * s->prompt_top_n;
            lora_msg_kv_int(&e, "prompt_top_n", s->prompt_top_n);
            lora_msg_kv_i32s(&e, "prompt_top_ids", s->prompt_top_ids, n);
            lora_msg_kv_f32s(&e, "prompt_top_logprobs", s->prompt_top_logprobs, n);
        }
    }
    return lora_msg_enc_end(&e);
}

static int step_out_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step_out *s = p;
    const msgpack_object_array *ids, *lps, *plps;

    if (lora_msg_get_u64(d, m, "seq_id", &s->seq_id) < 0 ||
        lora_msg_get_int(d, m, "token", -1, INT_MAX, &s->token) < 0 ||
        lora_msg_get_f32(d, m, "logprob", &s->logprob) < 0 ||
        lora_msg_get_array(d, m, "top_ids", LORA_MSG_MAX_TOP, &ids) < 0 ||
        lora_msg_get_array(d, m, "top_logprobs", LORA_MSG_MAX_TOP, &lps) < 0 ||
        lora_msg_get_array(d, m, "prompt_logprobs", LORA_MSG_MAX_BODY, &plps) < 0)
        return -1;
    if (lps->size != ids->size)
        return FAIL(d, "top_logprobs", -1, "%" PRIu32 " values, but top_ids has %" PRIu32,
                    lps->size, ids->size);
    if (lora_msg_i32_list(d, "top_ids", ids, &s->top_ids) < 0 ||
        lora_msg_f32_list(d, "top_logprobs", lps, &s->top_logprobs) < 0 ||
        lora_msg_f32_list(d, "prompt_logprobs", plps, &s->prompt_logprobs) < 0)
        return -1;
    s->n_top = (int)ids->size;
    s->n_prompt_logprobs = (int)plps->size;
    if (lora_msg_prompt_ranks(d, m, plps->size, &s->prompt_ranks) < 0)
        return -1;
    return lora_msg_prompt_top(d, m, plps->size, &s->prompt_top_n, &s->prompt_top_ids,
                               &s->prompt_top_logprobs);
}

static int step_reply_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step_reply *o = p;
    const msgpack_object_array *a;
    void *elems;

    if (lora_msg_get_u64(d, m, "step_id", &o->step_id) < 0 ||
        lora_msg_get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        lora_msg_get_bool(d, m, "ok", &o->ok) < 0 ||
        lora_msg_opt_str(d, m, "error", &o->error) < 0 ||
        lora_msg_get_bool(d, m, "doorbell", &o->doorbell) < 0 ||
        lora_msg_get_f64(d, m, "step_seconds", &o->step_seconds) < 0 ||
        lora_msg_get_array(d, m, "outs", LORA_MSG_MAX_SEQS, &a) < 0)
        return -1;
    if (lora_msg_map_array(d, "outs", a, sizeof(*o->outs), step_out_fields, &elems) < 0)
        return -1;
    o->outs = elems;
    o->n_outs = (int)a->size;
    return 0;
}
DEFINE_DECODER(step_reply, LORA_MSG_STEP_REPLY)

/* ---- adapter_op, adapter_op_reply ----------------------------------------------------------- */

int lora_msg_encode_adapter_op(struct lora_buf *b, const struct lora_msg_adapter_op *m,
                               struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_slot = m->slot >= 0;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_ADAPTER_OP, 3 + HAS(m->path) + has_slot + m->async);
    if ((m->op == LORA_OP_ADD && !m->path.s) || (m->op == LORA_OP_ACTIVATE && !has_slot) ||
        (m->async && m->op != LORA_OP_ACTIVATE))
        lora_msg_enc_invalid(&e);
    lora_msg_kv_u64(&e, "op_id", m->op_id);
    lora_msg_kv_enum(&e, "op", op_names, N_NAMES(op_names), (int)m->op);
    lora_msg_kv_str(&e, "name", m->name);
    lora_msg_kv_ostr(&e, "path", m->path);
    if (has_slot)
        lora_msg_kv_int(&e, "slot", m->slot);
    if (m->async)
        lora_msg_kv_bool(&e, "async", true);
    return lora_msg_enc_end(&e);
}

static int adapter_op_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_adapter_op *o = p;
    int op;
    bool has_slot;

    o->slot = -1;
    if (lora_msg_get_u64(d, m, "op_id", &o->op_id) < 0 ||
        lora_msg_get_enum(d, m, "op", op_names, N_NAMES(op_names), &op) < 0 ||
        lora_msg_get_str(d, m, "name", &o->name) < 0 ||
        lora_msg_opt_str(d, m, "path", &o->path) < 0 ||
        lora_msg_opt_int(d, m, "slot", 0, INT_MAX, &o->slot, &has_slot) < 0 ||
        lora_msg_opt_bool(d, m, "async", &o->async) < 0)
        return -1;
    o->op = (enum lora_adapter_op)op;
    if (o->async && o->op != LORA_OP_ACTIVATE)
        return FAIL(d, "async", -1, "only op activate takes it");
    if (o->op == LORA_OP_ADD && !o->path.s)
        return FAIL(d, "path", -1, "missing (op add needs it)");
    if (o->op == LORA_OP_ACTIVATE && !has_slot)
        return FAIL(d, "slot", -1, "missing (op activate needs it)");
    return 0;
}
DEFINE_DECODER(adapter_op, LORA_MSG_ADAPTER_OP)

int lora_msg_encode_adapter_op_reply(struct lora_buf *b, const struct lora_msg_adapter_op_reply *m,
                                     struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_ADAPTER_OP_REPLY, 4 + HAS(m->error) + m->pending);
    lora_msg_kv_u64(&e, "op_id", m->op_id);
    lora_msg_kv_int(&e, "rank", m->rank);
    lora_msg_kv_bool(&e, "ok", m->ok);
    lora_msg_kv_ostr(&e, "error", m->error);
    lora_msg_kv_f64(&e, "seconds", m->seconds);
    if (m->pending)
        lora_msg_kv_bool(&e, "pending", true);
    return lora_msg_enc_end(&e);
}

static int adapter_op_reply_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_adapter_op_reply *o = p;

    if (lora_msg_get_u64(d, m, "op_id", &o->op_id) < 0 ||
        lora_msg_get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        lora_msg_get_bool(d, m, "ok", &o->ok) < 0 ||
        lora_msg_opt_str(d, m, "error", &o->error) < 0 ||
        lora_msg_get_f64(d, m, "seconds", &o->seconds) < 0 ||
        lora_msg_opt_bool(d, m, "pending", &o->pending) < 0)
        return -1;
    return 0;
}
DEFINE_DECODER(adapter_op_reply, LORA_MSG_ADAPTER_OP_REPLY)

/* ---- notifications, residency_reply -------------------------------------------------------- */

static void kv_state(struct lora_msg_enc *e, const struct lora_msg_state *s)
{
    lora_msg_enc_key(e, "state");
    lora_msg_enc_map(e, 3);
    lora_msg_kv_strs(e, "slots", s->slots, s->n_slots);
    lora_msg_kv_strs(e, "cpu", s->cpu, s->n_cpu);
    lora_msg_kv_strs(e, "pinned", s->pinned, s->n_pinned);
}

static int state_list(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key, int *n,
                      struct lora_str **out)
{
    const msgpack_object_array *a;

    if (lora_msg_get_array(d, m, key, LORA_MSG_MAX_ADAPTERS, &a) < 0 ||
        lora_msg_str_list(d, key, a, out) < 0)
        return -1;
    *n = (int)a->size;
    return 0;
}

static int state_fields(struct lora_msg_dec *d, const msgpack_object_map *top,
                        struct lora_msg_state *s)
{
    const msgpack_object_map *m;

    if (lora_msg_get_map(d, top, "state", &m) < 0)
        return -1;
    size_t mark = lora_msg_dec_path_push(d, "state", -1);
    int rc = -1;
    if (state_list(d, m, "slots", &s->n_slots, &s->slots) < 0 ||
        state_list(d, m, "cpu", &s->n_cpu, &s->cpu) < 0 ||
        state_list(d, m, "pinned", &s->n_pinned, &s->pinned) < 0)
        goto out;
    rc = 0;
out:
    lora_msg_dec_path_pop(d, mark);
    return rc;
}

int lora_msg_encode_notifications(struct lora_buf *b, const struct lora_msg_notifications *m,
                                  struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_engine = m->engine >= 0;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_NOTIFICATIONS, 3 + has_engine);
    if (has_engine)
        lora_msg_kv_int(&e, "engine", m->engine);
    lora_msg_kv_int(&e, "rank", m->rank);
    lora_msg_kv_u64(&e, "dropped", m->dropped);
    lora_msg_kv_array(&e, "items", m->n_items, m->items, MAX_LIST);
    for (int i = 0; i < m->n_items && !e.error; i++) {
        const struct lora_msg_notification *n = &m->items[i];
        lora_msg_enc_map(&e, 5);
        lora_msg_kv_str(&e, "kind", n->kind);
        lora_msg_kv_u64(&e, "seq", n->seq);
        lora_msg_kv_f64(&e, "time", n->time);
        kv_state(&e, &n->state);
        lora_msg_kv_array(&e, "timings", n->n_timings, n->timings, MAX_LIST);
        for (int j = 0; j < n->n_timings && !e.error; j++) {
            const struct lora_msg_timing *t = &n->timings[j];
            lora_msg_enc_map(&e, 3);
            lora_msg_kv_str(&e, "name", t->name);
            lora_msg_kv_enum(&e, "transition", lora_msg_transition_names,
                             N_NAMES(lora_msg_transition_names), (int)t->transition);
            lora_msg_kv_f64(&e, "seconds", t->seconds);
        }
    }
    return lora_msg_enc_end(&e);
}

static int timing_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_timing *t = p;
    int tr;

    if (lora_msg_get_str(d, m, "name", &t->name) < 0 ||
        lora_msg_get_enum(d, m, "transition", lora_msg_transition_names,
                          N_NAMES(lora_msg_transition_names), &tr) < 0 ||
        lora_msg_get_f64(d, m, "seconds", &t->seconds) < 0)
        return -1;
    t->transition = (enum lora_transition)tr;
    return 0;
}

static int notification_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_notification *n = p;
    const msgpack_object_array *a;
    void *elems;

    if (lora_msg_get_str(d, m, "kind", &n->kind) < 0 ||
        lora_msg_get_u64(d, m, "seq", &n->seq) < 0 ||
        lora_msg_get_f64(d, m, "time", &n->time) < 0 || state_fields(d, m, &n->state) < 0 ||
        lora_msg_get_array(d, m, "timings", MAX_LIST, &a) < 0)
        return -1;
    if (lora_msg_map_array(d, "timings", a, sizeof(*n->timings), timing_fields, &elems) < 0)
        return -1;
    n->timings = elems;
    n->n_timings = (int)a->size;
    return 0;
}

static int notifications_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_notifications *o = p;
    const msgpack_object_array *a;
    void *elems;
    bool present;

    o->engine = -1;
    if (lora_msg_opt_int(d, m, "engine", 0, INT_MAX, &o->engine, &present) < 0 ||
        lora_msg_get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        lora_msg_get_u64(d, m, "dropped", &o->dropped) < 0 ||
        lora_msg_get_array(d, m, "items", MAX_LIST, &a) < 0)
        return -1;
    if (lora_msg_map_array(d, "items", a, sizeof(*o->items), notification_fields, &elems) < 0)
        return -1;
    o->items = elems;
    o->n_items = (int)a->size;
    return 0;
}
DEFINE_DECODER(notifications, LORA_MSG_NOTIFICATIONS)

int lora_msg_encode_residency_reply(struct lora_buf *b, const struct lora_msg_residency_reply *m,
                                    struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_RESIDENCY_REPLY, 2 + (m->engine >= 0));
    if (m->engine >= 0)
        lora_msg_kv_int(&e, "engine", m->engine);
    lora_msg_kv_int(&e, "rank", m->rank);
    kv_state(&e, &m->state);
    return lora_msg_enc_end(&e);
}

static int residency_reply_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_residency_reply *o = p;
    bool present;

    o->engine = -1;
    if (lora_msg_opt_int(d, m, "engine", 0, INT_MAX, &o->engine, &present) < 0 ||
        lora_msg_get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        state_fields(d, m, &o->state) < 0)
        return -1;
    return 0;
}
DEFINE_DECODER(residency_reply, LORA_MSG_RESIDENCY_REPLY)
