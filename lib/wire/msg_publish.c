/* msg_publish: what the engine publishes (see msg.h): ready (also its answer to a hello, and
 * topic "config"), event and stats. */
#include "wire/msg_codec.h"

#include <inttypes.h>
#include <limits.h>
#include <string.h>

static const char *const event_names[] = {"QUEUED", "SCHEDULED", "PREEMPTED", "FINISHED"};

/* ---- ready ----------------------------------------------------------------------------------- */

int lora_msg_encode_ready(struct lora_buf *b, const struct lora_msg_ready *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_READY, 4 + (m->n_startup_loads > 0));
    lora_msg_kv_int(&e, "version", m->version);
    lora_msg_kv_int(&e, "engine_index", m->engine_index);
    lora_msg_kv_str(&e, "model", m->model);
    lora_msg_kv_limits(&e, &m->limits);
    if (m->n_startup_loads > 0) {
        lora_msg_kv_array(&e, "startup_loads", m->n_startup_loads, m->startup_loads, MAX_LIST);
        for (int i = 0; i < m->n_startup_loads && !e.error; i++) {
            const struct lora_msg_startup_load *l = &m->startup_loads[i];
            lora_msg_enc_map(&e, 5);
            lora_msg_kv_int(&e, "rank", l->rank);
            lora_msg_kv_u64(&e, "seq", l->seq);
            lora_msg_kv_str(&e, "name", l->name);
            lora_msg_kv_enum(&e, "transition", lora_msg_transition_names,
                             N_NAMES(lora_msg_transition_names), l->transition);
            lora_msg_kv_f64(&e, "seconds", l->seconds);
        }
    }
    return lora_msg_enc_end(&e);
}

static int startup_load_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_startup_load *l = p;

    if (lora_msg_get_int(d, m, "rank", 0, INT_MAX, &l->rank) < 0 ||
        lora_msg_get_u64(d, m, "seq", &l->seq) < 0 ||
        lora_msg_get_str(d, m, "name", &l->name) < 0 ||
        lora_msg_get_enum(d, m, "transition", lora_msg_transition_names,
                          N_NAMES(lora_msg_transition_names), &l->transition) < 0 ||
        lora_msg_get_f64(d, m, "seconds", &l->seconds) < 0)
        return -1;
    return 0;
}

static int ready_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_ready *o = p;
    const msgpack_object *v;

    if (lora_msg_get_int(d, m, "version", 0, INT_MAX, &o->version) < 0 ||
        lora_msg_get_int(d, m, "engine_index", 0, INT_MAX, &o->engine_index) < 0 ||
        lora_msg_get_str(d, m, "model", &o->model) < 0 ||
        lora_msg_limits_fields(d, m, &o->limits) < 0 ||
        lora_msg_find(d, m, "startup_loads", &v) < 0)
        return -1;
    o->n_startup_loads = 0;
    o->startup_loads = NULL;
    if (v) {
        const msgpack_object_array *a;
        void *elems;
        if (lora_msg_as_array(d, "startup_loads", v, MAX_LIST, &a) < 0 ||
            lora_msg_map_array(d, "startup_loads", a, sizeof(*o->startup_loads),
                               startup_load_fields, &elems) < 0)
            return -1;
        o->startup_loads = elems;
        o->n_startup_loads = (int)a->size;
    }
    return 0;
}
DEFINE_DECODER(ready, LORA_MSG_READY)

/* ---- event, stats --------------------------------------------------------------------------- */

int lora_msg_encode_event(struct lora_buf *b, const struct lora_msg_event *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_EVENT, 6 + HAS(m->lora) + HAS(m->finish_reason));
    lora_msg_kv_int(&e, "engine", m->engine);
    lora_msg_kv_str(&e, "request_id", m->request_id);
    lora_msg_kv_enum(&e, "event", event_names, N_NAMES(event_names), (int)m->event);
    lora_msg_kv_f64(&e, "time", m->time);
    lora_msg_kv_ostr(&e, "lora", m->lora);
    lora_msg_kv_ostr(&e, "finish_reason", m->finish_reason);
    lora_msg_kv_int(&e, "num_prompt_tokens", m->num_prompt_tokens);
    lora_msg_kv_int(&e, "num_generation_tokens", m->num_generation_tokens);
    return lora_msg_enc_end(&e);
}

static int event_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_event *o = p;
    int ev;

    if (lora_msg_get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        lora_msg_get_str(d, m, "request_id", &o->request_id) < 0 ||
        lora_msg_get_enum(d, m, "event", event_names, N_NAMES(event_names), &ev) < 0 ||
        lora_msg_get_f64(d, m, "time", &o->time) < 0 ||
        lora_msg_opt_str(d, m, "lora", &o->lora) < 0 ||
        lora_msg_opt_str(d, m, "finish_reason", &o->finish_reason) < 0 ||
        lora_msg_get_int(d, m, "num_prompt_tokens", 0, INT_MAX, &o->num_prompt_tokens) < 0 ||
        lora_msg_get_int(d, m, "num_generation_tokens", 0, INT_MAX, &o->num_generation_tokens) < 0)
        return -1;
    o->event = (enum lora_event_kind)ev;
    return 0;
}
DEFINE_DECODER(event, LORA_MSG_EVENT)

int lora_msg_encode_stats(struct lora_buf *b, const struct lora_msg_stats *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_STATS, 11);
    lora_msg_kv_int(&e, "engine", m->engine);
    lora_msg_kv_f64(&e, "time", m->time);
    lora_msg_kv_int(&e, "running", m->running);
    lora_msg_kv_int(&e, "waiting", m->waiting);
    lora_msg_kv_f64(&e, "kv_usage", m->kv_usage);
    lora_msg_kv_u64(&e, "num_preemptions", m->num_preemptions);
    lora_msg_kv_int(&e, "step_adapters", m->step_adapters);
    lora_msg_kv_int(&e, "step_tokens", m->step_tokens);
    lora_msg_kv_f64(&e, "step_seconds", m->step_seconds);
    lora_msg_kv_f64(&e, "model_seconds", m->model_seconds);
    lora_msg_kv_array(&e, "adapters", m->n_adapters, m->adapters, LORA_MSG_MAX_ADAPTERS);
    for (int i = 0; i < m->n_adapters && !e.error; i++) {
        lora_msg_enc_map(&e, 3);
        lora_msg_kv_str(&e, "name", m->adapters[i].name);
        lora_msg_kv_int(&e, "running", m->adapters[i].running);
        lora_msg_kv_int(&e, "waiting", m->adapters[i].waiting);
    }
    return lora_msg_enc_end(&e);
}

static int adapter_count_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_adapter_count *c = p;
    if (lora_msg_get_str(d, m, "name", &c->name) < 0 ||
        lora_msg_get_int(d, m, "running", 0, INT_MAX, &c->running) < 0 ||
        lora_msg_get_int(d, m, "waiting", 0, INT_MAX, &c->waiting) < 0)
        return -1;
    return 0;
}

static int stats_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_stats *o = p;
    const msgpack_object_array *a;
    void *elems;

    if (lora_msg_get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        lora_msg_get_f64(d, m, "time", &o->time) < 0 ||
        lora_msg_get_int(d, m, "running", 0, INT_MAX, &o->running) < 0 ||
        lora_msg_get_int(d, m, "waiting", 0, INT_MAX, &o->waiting) < 0 ||
        lora_msg_get_f64(d, m, "kv_usage", &o->kv_usage) < 0 ||
        lora_msg_get_u64(d, m, "num_preemptions", &o->num_preemptions) < 0 ||
        lora_msg_get_int(d, m, "step_adapters", 0, INT_MAX, &o->step_adapters) < 0 ||
        lora_msg_get_int(d, m, "step_tokens", 0, INT_MAX, &o->step_tokens) < 0 ||
        lora_msg_get_f64(d, m, "step_seconds", &o->step_seconds) < 0 ||
        lora_msg_opt_f64(d, m, "model_seconds", &o->model_seconds) < 0 ||
        lora_msg_get_array(d, m, "adapters", LORA_MSG_MAX_ADAPTERS, &a) < 0)
        return -1;
    if (lora_msg_map_array(d, "adapters", a, sizeof(*o->adapters), adapter_count_fields, &elems) <
        0)
        return -1;
    o->adapters = elems;
    o->n_adapters = (int)a->size;
    return 0;
}
DEFINE_DECODER(stats, LORA_MSG_STATS)
