/* msg_frontend: the messages between the engine and its frontends, and the control socket (see
 * msg.h): request, abort, output, control, control_reply, registry (also published) and the
 * frontends' request_stats. */
#include "wire/msg_codec.h"

#include <inttypes.h>
#include <limits.h>
#include <string.h>

static const char *const control_names[] = {"residency", "config", "health", "load",
                                            "unload",    "pin",    "unpin",  "stats"};

/* ---- request, abort, output ----------------------------------------------------------------- */

int lora_msg_encode_request(struct lora_buf *b, const struct lora_msg_request *m,
                            struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 1;
    bool has_allowed = m->n_allowed_token_ids > 0;

    lora_msg_enc_begin(&e, b, LORA_MSG_REQUEST,
                       11 + HAS(m->lora) + m->has_seed + has_allowed + (m->prompt_top_n > 0));
    if (m->n_allowed_token_ids < 0 || m->n_allowed_token_ids > LORA_MSG_MAX_ALLOWED ||
        m->prompt_top_n < 0 || m->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
        lora_msg_enc_invalid(&e);
    lora_msg_kv_str(&e, "request_id", m->request_id);
    lora_msg_kv_ostr(&e, "lora", m->lora);
    lora_msg_kv_u64(&e, "n_prompt", m->n_prompt);
    lora_msg_kv_int(&e, "max_tokens", m->max_tokens);
    lora_msg_kv_int(&e, "min_tokens", m->min_tokens);
    lora_msg_kv_f32(&e, "temperature", m->temperature);
    lora_msg_kv_f32(&e, "top_p", m->top_p);
    lora_msg_kv_int(&e, "top_k", m->top_k);
    if (m->has_seed)
        lora_msg_kv_u64(&e, "seed", m->seed);
    if (m->logprobs < 0 || m->logprobs > LORA_MSG_MAX_TOP)
        lora_msg_enc_invalid(&e);
    lora_msg_kv_int(&e, "logprobs", m->logprobs);
    lora_msg_kv_bool(&e, "prompt_logprobs", m->prompt_logprobs);
    lora_msg_kv_bool(&e, "ignore_eos", m->ignore_eos);
    lora_msg_kv_i32s(&e, "stop_token_ids", m->stop_token_ids, m->n_stop_token_ids);
    if (has_allowed)
        lora_msg_kv_i32s(&e, "allowed_token_ids", m->allowed_token_ids, m->n_allowed_token_ids);
    if (m->prompt_top_n > 0)
        lora_msg_kv_int(&e, "prompt_top_n", m->prompt_top_n);
    lora_msg_bin_frame(&e, bins, 0, m->prompt, m->n_prompt);
    return lora_msg_enc_end(&e);
}

static int request_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_request *o = p;
    const msgpack_object *seed;
    const msgpack_object_array *stop;
    uint64_t n_prompt;

    bool present;

    o->n_allowed_token_ids = 0;
    o->allowed_token_ids = NULL;
    o->prompt_top_n = 0;
    if (lora_msg_get_str(d, m, "request_id", &o->request_id) < 0 ||
        lora_msg_opt_str(d, m, "lora", &o->lora) < 0 ||
        lora_msg_get_u64(d, m, "n_prompt", &n_prompt) < 0 ||
        lora_msg_get_int(d, m, "max_tokens", 0, INT_MAX, &o->max_tokens) < 0 ||
        lora_msg_get_int(d, m, "min_tokens", 0, INT_MAX, &o->min_tokens) < 0 ||
        lora_msg_get_f32(d, m, "temperature", &o->temperature) < 0 ||
        lora_msg_get_f32(d, m, "top_p", &o->top_p) < 0 ||
        lora_msg_get_int(d, m, "top_k", INT_MIN, INT_MAX, &o->top_k) < 0 ||
        lora_msg_find(d, m, "seed", &seed) < 0 ||
        (seed && lora_msg_as_u64(d, "seed", seed, &o->seed) < 0) ||
        lora_msg_get_int(d, m, "logprobs", 0, LORA_MSG_MAX_TOP, &o->logprobs) < 0 ||
        lora_msg_get_bool(d, m, "prompt_logprobs", &o->prompt_logprobs) < 0 ||
        lora_msg_get_bool(d, m, "ignore_eos", &o->ignore_eos) < 0 ||
        lora_msg_get_array(d, m, "stop_token_ids", MAX_LIST, &stop) < 0 ||
        lora_msg_i32_list(d, "stop_token_ids", stop, &o->stop_token_ids) < 0 ||
        lora_msg_frame_i32(d, 0, "n_prompt", n_prompt, &o->prompt) < 0 ||
        lora_msg_opt_int(d, m, "prompt_top_n", 0, LORA_MSG_MAX_PROMPT_TOP, &o->prompt_top_n,
                         &present) < 0 ||
        lora_msg_opt_i32_list(d, m, "allowed_token_ids", LORA_MSG_MAX_ALLOWED,
                              &o->allowed_token_ids, &o->n_allowed_token_ids) < 0)
        return -1;
    o->has_seed = seed != NULL;
    o->n_stop_token_ids = (int)stop->size;
    o->n_prompt = (size_t)n_prompt;
    return 0;
}
DEFINE_DECODER(request, LORA_MSG_REQUEST)

int lora_msg_encode_abort(struct lora_buf *b, const struct lora_msg_abort *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_ABORT, 1);
    lora_msg_kv_str(&e, "request_id", m->request_id);
    return lora_msg_enc_end(&e);
}

static int abort_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_abort *o = p;
    return lora_msg_get_str(d, m, "request_id", &o->request_id);
}
DEFINE_DECODER(abort, LORA_MSG_ABORT)

static const char *const output_time_keys[4] = {"queued_time", "scheduled_time", "first_token_time",
                                                "finished_time"};

int lora_msg_encode_output(struct lora_buf *b, const struct lora_msg_output *m,
                           struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_top = m->top_n > 0, has_plp = m->n_prompt_logprobs > 0;
    bool has_ranks = has_plp && m->prompt_ranks;
    bool has_ptop = has_plp && m->prompt_top_n > 0;
    long n_top = 0;

    if (n_bins)
        *n_bins = 0;
    const double times[4] = {m->queued_time, m->scheduled_time, m->first_token_time,
                             m->finished_time};
    size_t n_times = 0;
    for (int i = 0; i < 4; i++)
        n_times += times[i] != 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_OUTPUT,
                       5 + 3 * has_top + has_plp + has_ranks + 3 * has_ptop +
                           HAS(m->finish_reason) + HAS(m->error) + HAS(m->error_code) + n_times);
    if (m->n_tokens < 0 || m->top_n < 0 || m->top_n > LORA_MSG_MAX_TOP)
        lora_msg_enc_invalid(&e);
    else
        n_top = (long)m->n_tokens * m->top_n;
    lora_msg_kv_str(&e, "request_id", m->request_id);
    lora_msg_kv_i32s(&e, "tokens", m->tokens, m->n_tokens);
    lora_msg_kv_f32s(&e, "logprobs", m->logprobs, m->n_tokens);
    if (has_top) {
        lora_msg_kv_int(&e, "top_n", m->top_n);
        lora_msg_kv_i32s(&e, "top_ids", m->top_ids, n_top);
        lora_msg_kv_f32s(&e, "top_logprobs", m->top_logprobs, n_top);
    }
    if (has_plp)
        lora_msg_kv_f32s(&e, "prompt_logprobs", m->prompt_logprobs, m->n_prompt_logprobs);
    if (has_ranks)
        lora_msg_kv_i32s(&e, "prompt_ranks", m->prompt_ranks, m->n_prompt_logprobs);
    if (m->prompt_top_n < 0 || m->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
        lora_msg_enc_invalid(&e);
    if (has_ptop) {
        long n = (long)m->n_prompt_logprobs * m->prompt_top_n;
        lora_msg_kv_int(&e, "prompt_top_n", m->prompt_top_n);
        lora_msg_kv_i32s(&e, "prompt_top_ids", m->prompt_top_ids, n);
        lora_msg_kv_f32s(&e, "prompt_top_logprobs", m->prompt_top_logprobs, n);
    }
    lora_msg_kv_bool(&e, "finished", m->finished);
    lora_msg_kv_ostr(&e, "finish_reason", m->finish_reason);
    lora_msg_kv_int(&e, "num_prompt_tokens", m->num_prompt_tokens);
    lora_msg_kv_ostr(&e, "error", m->error);
    lora_msg_kv_ostr(&e, "error_code", m->error_code);
    for (int i = 0; i < 4; i++)
        if (times[i] != 0)
            lora_msg_kv_f64(&e, output_time_keys[i], times[i]);
    return lora_msg_enc_end(&e);
}

/* top_ids and top_logprobs: n_tokens * top_n values each, required when that is not 0. */
static int output_top(struct lora_msg_dec *d, const msgpack_object_map *m,
                      struct lora_msg_output *o)
{
    static const char *const keys[2] = {"top_ids", "top_logprobs"};
    uint64_t want = (uint64_t)o->n_tokens * (uint64_t)o->top_n;

    for (int k = 0; k < 2; k++) {
        const msgpack_object *v;
        const msgpack_object_array *a;
        if (lora_msg_find(d, m, keys[k], &v) < 0)
            return -1;
        if (!v) {
            if (want)
                return FAIL(d, keys[k], -1, "missing (top_n is %d)", o->top_n);
            continue;
        }
        if (lora_msg_as_array(d, keys[k], v, LORA_MSG_MAX_BODY, &a) < 0)
            return -1;
        if (a->size != want)
            return FAIL(d, keys[k], -1, "%" PRIu32 " values, n_tokens * top_n is %" PRIu64, a->size,
                        want);
        if (k == 0 ? lora_msg_i32_list(d, keys[k], a, &o->top_ids)
                   : lora_msg_f32_list(d, keys[k], a, &o->top_logprobs))
            return -1;
    }
    return 0;
}

static int output_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_output *o = p;
    const msgpack_object_array *toks, *lps, *plps;
    const msgpack_object *v;
    bool present;

    if (lora_msg_get_str(d, m, "request_id", &o->request_id) < 0 ||
        lora_msg_get_array(d, m, "tokens", LORA_MSG_MAX_BODY, &toks) < 0 ||
        lora_msg_get_array(d, m, "logprobs", LORA_MSG_MAX_BODY, &lps) < 0)
        return -1;
    if (lps->size != toks->size)
        return FAIL(d, "logprobs", -1, "%" PRIu32 " values, but tokens has %" PRIu32, lps->size,
                    toks->size);
    if (lora_msg_i32_list(d, "tokens", toks, &o->tokens) < 0 ||
        lora_msg_f32_list(d, "logprobs", lps, &o->logprobs) < 0)
        return -1;
    o->n_tokens = (int)toks->size;
    if (lora_msg_opt_int(d, m, "top_n", 0, LORA_MSG_MAX_TOP, &o->top_n, &present) < 0 ||
        output_top(d, m, o) < 0 || lora_msg_find(d, m, "prompt_logprobs", &v) < 0)
        return -1;
    if (v) {
        if (lora_msg_as_array(d, "prompt_logprobs", v, LORA_MSG_MAX_BODY, &plps) < 0 ||
            lora_msg_f32_list(d, "prompt_logprobs", plps, &o->prompt_logprobs) < 0)
            return -1;
        o->n_prompt_logprobs = (int)plps->size;
    }
    if (!v) {
        const msgpack_object *ranks;
        if (lora_msg_find(d, m, "prompt_ranks", &ranks) < 0)
            return -1;
        if (ranks)
            return FAIL(d, "prompt_logprobs", -1, "missing (prompt_ranks needs it)");
    }
    if (lora_msg_prompt_ranks(d, m, (uint32_t)o->n_prompt_logprobs, &o->prompt_ranks) < 0 ||
        lora_msg_prompt_top(d, m, (uint32_t)o->n_prompt_logprobs, &o->prompt_top_n,
                            &o->prompt_top_ids, &o->prompt_top_logprobs) < 0)
        return -1;
    if (lora_msg_get_bool(d, m, "finished", &o->finished) < 0 ||
        lora_msg_opt_str(d, m, "finish_reason", &o->finish_reason) < 0 ||
        lora_msg_get_int(d, m, "num_prompt_tokens", 0, INT_MAX, &o->num_prompt_tokens) < 0 ||
        lora_msg_opt_str(d, m, "error", &o->error) < 0 ||
        lora_msg_opt_str(d, m, "error_code", &o->error_code) < 0)
        return -1;
    double *times[4] = {&o->queued_time, &o->scheduled_time, &o->first_token_time,
                        &o->finished_time};
    for (int i = 0; i < 4; i++)
        if (lora_msg_opt_f64(d, m, output_time_keys[i], times[i]) < 0)
            return -1;
    return 0;
}
DEFINE_DECODER(output, LORA_MSG_OUTPUT)

/* ---- request_stats --------------------------------------------------------------------------- */

static const char *const stats_time_keys[4] = {"first_token_time", "queued_time", "scheduled_time",
                                               "engine_first_token_time"};

int lora_msg_encode_request_stats(struct lora_buf *b, const struct lora_msg_request_stats *m,
                                  struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    const double opt[7] = {m->first_token_time,        m->queued_time,          m->scheduled_time,
                           m->engine_first_token_time, m->engine_finished_time, m->submit_seconds,
                           m->output_seconds};
    size_t n_opt = 0;

    if (n_bins)
        *n_bins = 0;
    for (int i = 0; i < 7; i++)
        n_opt += opt[i] != 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_REQUEST_STATS, 8 + HAS(m->lora) + n_opt);
    lora_msg_kv_int(&e, "engine", m->engine);
    lora_msg_kv_str(&e, "request_id", m->request_id);
    lora_msg_kv_ostr(&e, "lora", m->lora);
    lora_msg_kv_str(&e, "finish_reason", m->finish_reason);
    lora_msg_kv_f64(&e, "arrival_time", m->arrival_time);
    lora_msg_kv_f64(&e, "finished_time", m->finished_time);
    for (int i = 0; i < 4; i++)
        if (opt[i] != 0)
            lora_msg_kv_f64(&e, stats_time_keys[i], opt[i]);
    if (opt[4] != 0)
        lora_msg_kv_f64(&e, "engine_finished_time", opt[4]);
    lora_msg_kv_int(&e, "num_prompt_tokens", m->num_prompt_tokens);
    lora_msg_kv_int(&e, "num_generation_tokens", m->num_generation_tokens);
    lora_msg_kv_int(&e, "max_tokens", m->max_tokens);
    if (opt[5] != 0)
        lora_msg_kv_f64(&e, "submit_seconds", opt[5]);
    if (opt[6] != 0)
        lora_msg_kv_f64(&e, "output_seconds", opt[6]);
    return lora_msg_enc_end(&e);
}

static int request_stats_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_request_stats *o = p;
    double *opt[4] = {&o->first_token_time, &o->queued_time, &o->scheduled_time,
                      &o->engine_first_token_time};

    if (lora_msg_get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        lora_msg_get_str(d, m, "request_id", &o->request_id) < 0 ||
        lora_msg_opt_str(d, m, "lora", &o->lora) < 0 ||
        lora_msg_get_str(d, m, "finish_reason", &o->finish_reason) < 0 ||
        lora_msg_get_f64(d, m, "arrival_time", &o->arrival_time) < 0 ||
        lora_msg_get_f64(d, m, "finished_time", &o->finished_time) < 0 ||
        lora_msg_opt_f64(d, m, "engine_finished_time", &o->engine_finished_time) < 0 ||
        lora_msg_get_int(d, m, "num_prompt_tokens", 0, INT_MAX, &o->num_prompt_tokens) < 0 ||
        lora_msg_get_int(d, m, "num_generation_tokens", 0, INT_MAX, &o->num_generation_tokens) <
            0 ||
        lora_msg_get_int(d, m, "max_tokens", -1, INT_MAX, &o->max_tokens) < 0 ||
        lora_msg_opt_f64(d, m, "submit_seconds", &o->submit_seconds) < 0 ||
        lora_msg_opt_f64(d, m, "output_seconds", &o->output_seconds) < 0)
        return -1;
    for (int i = 0; i < 4; i++)
        if (lora_msg_opt_f64(d, m, stats_time_keys[i], opt[i]) < 0)
            return -1;
    return 0;
}
DEFINE_DECODER(request_stats, LORA_MSG_REQUEST_STATS)

/* ---- control, control_reply, registry ------------------------------------------------------- */

/* Which control ops name an adapter, and which also need its path. */
static bool control_needs_name(enum lora_control_op op)
{
    return op == LORA_CTL_LOAD || op == LORA_CTL_UNLOAD || op == LORA_CTL_PIN ||
           op == LORA_CTL_UNPIN;
}

int lora_msg_encode_control(struct lora_buf *b, const struct lora_msg_control *m,
                            struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_CONTROL, 2 + HAS(m->name) + HAS(m->path));
    if ((control_needs_name(m->op) && !m->name.s) || (m->op == LORA_CTL_LOAD && !m->path.s))
        lora_msg_enc_invalid(&e);
    lora_msg_kv_u64(&e, "id", m->id);
    lora_msg_kv_enum(&e, "op", control_names, N_NAMES(control_names), (int)m->op);
    lora_msg_kv_ostr(&e, "name", m->name);
    lora_msg_kv_ostr(&e, "path", m->path);
    return lora_msg_enc_end(&e);
}

static int control_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_control *o = p;
    int op;

    if (lora_msg_get_u64(d, m, "id", &o->id) < 0 ||
        lora_msg_get_enum(d, m, "op", control_names, N_NAMES(control_names), &op) < 0 ||
        lora_msg_opt_str(d, m, "name", &o->name) < 0 ||
        lora_msg_opt_str(d, m, "path", &o->path) < 0)
        return -1;
    o->op = (enum lora_control_op)op;
    if (control_needs_name(o->op) && !o->name.s)
        return FAIL(d, "name", -1, "missing (op %s needs it)", control_names[op]);
    if (o->op == LORA_CTL_LOAD && !o->path.s)
        return FAIL(d, "path", -1, "missing (op load needs it)");
    return 0;
}
DEFINE_DECODER(control, LORA_MSG_CONTROL)

/* Is data[0..len) exactly one msgpack map or array? */
static bool is_container(const void *data, size_t len)
{
    const char *why;
    size_t where;

    return lora_msg_scan_body(data, len, &why, &where) == 0 &&
           lora_msg_scan_is_container(*(const unsigned char *)data);
}

int lora_msg_encode_control_reply(struct lora_buf *b, const struct lora_msg_control_reply *m,
                                  struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_data = m->data != NULL;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_CONTROL_REPLY, 2 + HAS(m->error) + has_data);
    lora_msg_kv_u64(&e, "id", m->id);
    lora_msg_kv_bool(&e, "ok", m->ok);
    lora_msg_kv_ostr(&e, "error", m->error);
    if (has_data) {
        lora_msg_enc_key(&e, "data");
        if (!is_container(m->data, m->data_len))
            lora_msg_enc_invalid(&e);
        if (!e.error)
            lora_msg_enc_put(&e, lora_buf_add(b, m->data, m->data_len));
    }
    return lora_msg_enc_end(&e);
}

static int control_reply_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_control_reply *o = p;
    const msgpack_object *v;

    if (lora_msg_get_u64(d, m, "id", &o->id) < 0 || lora_msg_get_bool(d, m, "ok", &o->ok) < 0 ||
        lora_msg_opt_str(d, m, "error", &o->error) < 0 || lora_msg_find(d, m, "data", &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (v->type != MSGPACK_OBJECT_MAP && v->type != MSGPACK_OBJECT_ARRAY)
        return FAIL(d, "data", -1, "expected a map or an array");
    const unsigned char *raw;
    size_t raw_len;
    int n;
    lora_msg_scan_find_key(d->body, d->len, "data", &raw, &raw_len, &n);
    if (n != 1)
        return FAIL(d, "data", -1, "not found in the body");
    void *copy = lora_msg_arena_alloc(d->arena, raw_len, 1);
    if (!copy)
        return lora_msg_dec_no_memory(d, "data");
    memcpy(copy, raw, raw_len);
    o->data = copy;
    o->data_len = raw_len;
    return 0;
}
DEFINE_DECODER(control_reply, LORA_MSG_CONTROL_REPLY)

int lora_msg_encode_registry(struct lora_buf *b, const struct lora_msg_registry *m,
                             struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_REGISTRY, 2);
    lora_msg_kv_int(&e, "engine", m->engine);
    lora_msg_kv_array(&e, "adapters", m->n_adapters, m->adapters, LORA_MSG_MAX_ADAPTERS);
    for (int i = 0; i < m->n_adapters && !e.error; i++) {
        lora_msg_enc_map(&e, 3);
        lora_msg_kv_str(&e, "name", m->adapters[i].name);
        lora_msg_kv_str(&e, "path", m->adapters[i].path);
        lora_msg_kv_u64(&e, "id", m->adapters[i].id);
    }
    return lora_msg_enc_end(&e);
}

static int registry_entry_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_registry_entry *r = p;
    if (lora_msg_get_str(d, m, "name", &r->name) < 0 ||
        lora_msg_get_str(d, m, "path", &r->path) < 0 || lora_msg_get_u64(d, m, "id", &r->id) < 0)
        return -1;
    return 0;
}

static int registry_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_registry *o = p;
    const msgpack_object_array *a;
    void *elems;

    if (lora_msg_get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        lora_msg_get_array(d, m, "adapters", LORA_MSG_MAX_ADAPTERS, &a) < 0)
        return -1;
    if (lora_msg_map_array(d, "adapters", a, sizeof(*o->adapters), registry_entry_fields, &elems) <
        0)
        return -1;
    o->adapters = elems;
    o->n_adapters = (int)a->size;
    return 0;
}
DEFINE_DECODER(registry, LORA_MSG_REGISTRY)
