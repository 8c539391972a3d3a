/* lora-engine: every message the engine sends, encoded and sent here and nowhere else: on the
 * publish socket (events, stats, the registry, notifications, and the periodic whole truth), to
 * the frontends (ready, outputs, the registry, notifications, heartbeats), to the control
 * socket's askers (replies) and to the workers (setup, steps, adapter operations, the empty
 * messages). One encode buffer, owned here and reached only through these functions: each
 * encodes and sends before it returns. A send to a peer counts for its heartbeat schedule.
 *
 * The periodic publication (docs/design.md, "Metrics", "Inspection"): PUB drops what a subscriber
 * missed, and an idle engine publishes no steps, so every --publish-interval-ms, right after ready
 * and whenever the engine turns idle, the loop publishes the whole truth again: its limits (ready,
 * topic "config"), the registry (topic "registry"), every rank's last gathered state
 * (residency_reply, topic "residency") and the request counts (a stats message with step_tokens 0:
 * no step ran). A subscriber that joins late, or an exporter that restarts, is complete after one
 * interval.
 *
 * Calls: registry.c (whether an adapter is being unloaded). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "publish.h"
#include "registry.h"

static struct lora_buf out;

void publish_release(void)
{
    lora_buf_release(&out);
}

void publish_limits(const struct engine *e, struct lora_msg_limits *l)
{
    *l = (struct lora_msg_limits){
        .max_loras = e->max_loras,
        .max_cpu_loras = e->max_cpu_loras,
        .max_lora_rank = e->max_lora_rank,
        .block_size = e->block_size,
        .num_kv_blocks = e->num_kv_blocks,
        .world_size = e->world,
        .max_model_len = e->max_model_len,
        .max_num_batched_tokens = e->max_num_batched_tokens,
        .max_num_seqs = e->max_num_seqs,
        .vocab_size = e->vocab_size,
    };
}

/* ---- the publish socket ------------------------------------------------------------------- */

static void pub_out(struct engine *e, const char *topic)
{
    lora_sock_send(e->pub, NULL, 0, topic, out.data, out.len, NULL, 0, ZMQ_DONTWAIT);
}

/* Sends out to frontend fe. */
static void frontend_out(struct engine *e, int fe)
{
    struct eng_peer *p = &e->frontends[fe];
    if (lora_sock_send(e->front, p->rid, p->rid_len, NULL, out.data, out.len, NULL, 0,
                       ZMQ_DONTWAIT) == 0)
        lora_liveness_sent(&p->live, lora_clock_mono_ms());
}

static void every_frontend_out(struct engine *e)
{
    for (int i = 0; i < ENGINE_MAX_FRONTENDS; i++)
        if (e->frontends[i].present)
            frontend_out(e, i);
}

void publish_event(struct engine *e, struct eng_request *r, enum lora_event_kind kind,
                   const char *reason)
{
    const struct eng_adapter *ad = r->adapter_id ? &e->adapters[r->adapter_id - 1] : NULL;
    double now = lora_clock_unix();
    if (kind == LORA_EVENT_SCHEDULED && r->scheduled_at == 0)
        r->scheduled_at = now;
    struct lora_msg_event ev = {
        .engine = e->engine_index,
        .request_id = {r->request_id, strlen(r->request_id)},
        .event = kind,
        .time = now,
        .num_prompt_tokens = r->n_prompt,
        .num_generation_tokens = r->n_generated,
    };
    if (ad)
        ev.lora = (struct lora_str){ad->name, strlen(ad->name)};
    if (reason)
        ev.finish_reason = (struct lora_str){reason, strlen(reason)};
    lora_buf_reset(&out);
    if (lora_msg_encode_event(&out, &ev, NULL, NULL) == 0)
        pub_out(e, "event");
}

void publish_step_stats(struct engine *e, double step_seconds, double model_seconds)
{
    static struct lora_msg_adapter_count counts[ENGINE_MAX_ADAPTERS];
    int n = 0;

    for (int i = 0; i < e->plan.n_adapters && n < ENGINE_MAX_ADAPTERS; i++) {
        const struct lora_scheduler_adapter_count *c = &e->plan.adapters[i];
        const struct eng_adapter *ad = &e->adapters[c->adapter_id - 1];
        if (c->adapter_id < 1 || !ad->used)
            continue;
        counts[n++] = (struct lora_msg_adapter_count){
            {ad->name, strlen(ad->name)}, c->n_running, c->n_waiting};
    }
    struct lora_msg_stats s = {
        .engine = e->engine_index,
        .time = lora_clock_unix(),
        .running = e->plan.n_running,
        .waiting = e->plan.n_waiting,
        .kv_usage = e->plan.kv_usage,
        .num_preemptions = e->num_preemptions,
        .step_adapters = e->plan.n_step_adapters,
        .step_tokens = e->plan.n_step_tokens,
        .step_seconds = step_seconds,
        .model_seconds = model_seconds,
        .n_adapters = n,
        .adapters = counts,
    };
    lora_buf_reset(&out);
    if (lora_msg_encode_stats(&out, &s, NULL, NULL) == 0)
        pub_out(e, "stats");
}

/* The request counts of an idle engine: a stats message with no step. */
static void idle_stats(struct engine *e)
{
    static struct lora_msg_adapter_count counts[ENGINE_MAX_ADAPTERS];
    int n = 0;

    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        const struct eng_adapter *ad = &e->adapters[i];
        struct lora_scheduler_adapter_info info;
        if (!ad->used || lora_scheduler_adapter_info(e->sched, ad->id, &info) < 0 ||
            (info.n_running == 0 && info.n_waiting == 0))
            continue;
        counts[n++] = (struct lora_msg_adapter_count){
            {ad->name, strlen(ad->name)}, info.n_running, info.n_waiting};
    }
    int free_blocks = lora_scheduler_n_free_blocks(e->sched);
    struct lora_msg_stats s = {
        .engine = e->engine_index,
        .time = lora_clock_unix(),
        .running = lora_scheduler_n_running(e->sched),
        .waiting = lora_scheduler_n_waiting(e->sched),
        .kv_usage = e->num_kv_blocks ? 1.0 - (double)free_blocks / e->num_kv_blocks : 0,
        .num_preemptions = e->num_preemptions,
        .n_adapters = n,
        .adapters = counts,
    };
    lora_buf_reset(&out);
    if (lora_msg_encode_stats(&out, &s, NULL, NULL) == 0)
        pub_out(e, "stats");
}

void publish_registry(struct engine *e, bool to_frontends)
{
    struct lora_msg_registry_entry *list = calloc(ENGINE_MAX_ADAPTERS, sizeof(*list));
    int n = 0;

    if (!list)
        return;
    for (int i = 0; i < ENGINE_MAX_ADAPTERS; i++) {
        const struct eng_adapter *ad = &e->adapters[i];
        if (ad->used && !registry_is_removing(e, ad))
            list[n++] = (struct lora_msg_registry_entry){
                {ad->name, strlen(ad->name)}, {ad->path, strlen(ad->path)}, (uint64_t)ad->id};
    }
    struct lora_msg_registry m = {.engine = e->engine_index, .n_adapters = n, .adapters = list};
    lora_buf_reset(&out);
    if (lora_msg_encode_registry(&out, &m, NULL, NULL) == 0) {
        pub_out(e, "registry");
        if (to_frontends)
            every_frontend_out(e);
    }
    free(list);
}

void publish_notifications(struct engine *e, const struct lora_msg_notifications *m)
{
    lora_buf_reset(&out);
    if (lora_msg_encode_notifications(&out, m, NULL, NULL) == 0) {
        pub_out(e, "notifications");
        every_frontend_out(e);
    }
}

/* Encodes this engine's ready message (version, index, model, limits, start-up loads). */
static int encode_ready(struct engine *e)
{
    struct lora_msg_ready m = {
        .version = LORA_PROTOCOL_VERSION,
        .engine_index = e->engine_index,
        .model = {e->model, strlen(e->model)},
        .n_startup_loads = e->n_startup_loads,
        .startup_loads = e->startup_loads,
    };
    publish_limits(e, &m.limits);
    lora_buf_reset(&out);
    return lora_msg_encode_ready(&out, &m, NULL, NULL);
}

void publish_state(struct engine *e, bool idle)
{
    if (encode_ready(e) == 0)
        pub_out(e, "config");
    publish_registry(e, false);
    for (int r = 0; r < e->world; r++)
        if (e->rank_state[r])
            lora_sock_send(e->pub, NULL, 0, "residency", e->rank_state[r], e->rank_state_len[r],
                           NULL, 0, ZMQ_DONTWAIT);
    if (idle)
        idle_stats(e);
}

/* ---- the frontends' socket ---------------------------------------------------------------- */

void publish_ready(struct engine *e, int fe)
{
    if (encode_ready(e) == 0)
        frontend_out(e, fe);
}

int publish_output(struct engine *e, int fe, const struct lora_msg_output *o)
{
    lora_buf_reset(&out);
    if (lora_msg_encode_output(&out, o, NULL, NULL) < 0)
        return -1;
    if (e->frontends[fe].present)
        frontend_out(e, fe);
    return 0;
}

void publish_frontend_heartbeats(struct engine *e)
{
    uint64_t now = lora_clock_mono_ms();

    for (int i = 0; i < ENGINE_MAX_FRONTENDS; i++) {
        struct eng_peer *p = &e->frontends[i];
        if (p->present && lora_liveness_should_send(&p->live, now)) {
            lora_buf_reset(&out);
            if (lora_msg_encode_empty(&out, LORA_MSG_HEARTBEAT) == 0)
                frontend_out(e, i);
        }
    }
}

/* ---- the control socket ------------------------------------------------------------------- */

void publish_control_reply(struct engine *e, const void *rid, size_t rid_len, uint64_t id,
                           const char *err, const void *data, size_t data_len)
{
    struct lora_msg_control_reply r = {.id = id, .ok = err == NULL};
    if (err)
        r.error = (struct lora_str){err, strlen(err)};
    if (data_len) {
        r.data = data;
        r.data_len = data_len;
    }
    lora_buf_reset(&out);
    if (lora_msg_encode_control_reply(&out, &r, NULL, NULL) == 0)
        lora_sock_send(e->ctl, rid, rid_len, NULL, out.data, out.len, NULL, 0, ZMQ_DONTWAIT);
}

/* ---- the workers' socket ------------------------------------------------------------------ */

/* Sends out (and bins) to rank r; counts for its heartbeat schedule. */
static int worker_out(struct engine *e, int r, const struct lora_frame *frames, int n_frames)
{
    struct eng_peer *w = &e->workers[r];
    int rc = lora_sock_send(e->work, w->rid, w->rid_len, NULL, out.data, out.len, frames, n_frames,
                            ZMQ_DONTWAIT);
    if (rc == 0)
        lora_liveness_sent(&w->live, lora_clock_mono_ms());
    return rc;
}

/* Sends out (and bins) to every rank; stops at the first that cannot be reached. */
static int every_worker_out(struct engine *e, const struct lora_msg_bin *bins, int n_bins,
                            int *failed)
{
    struct lora_frame frames[LORA_SOCK_MAX_BINS];

    for (int i = 0; i < n_bins; i++)
        frames[i] = (struct lora_frame){bins[i].data, bins[i].len};
    for (int r = 0; r < e->world; r++) {
        if (worker_out(e, r, frames, n_bins) < 0) {
            *failed = r;
            return -1;
        }
    }
    return 0;
}

int publish_worker_empty(struct engine *e, int r, enum lora_msg_type t)
{
    lora_buf_reset(&out);
    if (lora_msg_encode_empty(&out, t) < 0)
        return -1;
    return worker_out(e, r, NULL, 0);
}

int publish_setup(struct engine *e, int r, const struct lora_msg_setup *s)
{
    lora_buf_reset(&out);
    if (lora_msg_encode_setup(&out, s, NULL, NULL) < 0)
        return -1;
    return worker_out(e, r, NULL, 0);
}

void publish_setup_refusal(struct engine *e, const struct lora_msg_frames *f, int rank,
                           const char *why)
{
    struct lora_msg_setup_done d = {.ok = false, .error = {why, strlen(why)}, .rank = rank};

    lora_buf_reset(&out);
    if (lora_msg_encode_setup_done(&out, &d, NULL, NULL) == 0)
        lora_sock_send(e->work, f->rid, f->rid_len, NULL, out.data, out.len, NULL, 0, ZMQ_DONTWAIT);
}

int publish_workers_empty(struct engine *e, enum lora_msg_type t, int *failed)
{
    *failed = -1;
    lora_buf_reset(&out);
    if (lora_msg_encode_empty(&out, t) < 0)
        return -1;
    return every_worker_out(e, NULL, 0, failed);
}

int publish_adapter_op(struct engine *e, const struct lora_msg_adapter_op *m, int *failed)
{
    *failed = -1;
    lora_buf_reset(&out);
    if (lora_msg_encode_adapter_op(&out, m, NULL, NULL) < 0)
        return -1;
    return every_worker_out(e, NULL, 0, failed);
}

int publish_step(struct engine *e, const struct lora_msg_step *m, int *failed)
{
    struct lora_msg_bin bins[2];
    int n_bins = 0;

    *failed = -1;
    lora_buf_reset(&out);
    if (lora_msg_encode_step(&out, m, bins, &n_bins) < 0)
        return -1;
    return every_worker_out(e, bins, n_bins, failed);
}
