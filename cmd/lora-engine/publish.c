/* lora-engine: the periodic state publication (DESIGN sections 9 and 10). PUB drops what a
 * subscriber missed, and an idle engine publishes no steps, so every --publish-interval-ms,
 * right after ready and whenever the engine turns idle, it publishes the whole truth again:
 * its limits (ready, topic "config"), the registry (topic "registry"), every rank's last
 * gathered state (residency_reply, topic "residency") and the request counts (a stats message
 * with step_tokens 0: no step ran). A subscriber that joins late, or an exporter that
 * restarts, is complete after one interval. */
#include <string.h>

#include "engine.h"

static void publish_idle_stats(struct engine *e)
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
    lora_buf_reset(&e->out);
    if (lora_msg_encode_stats(&e->out, &s, NULL, NULL) == 0)
        publish_body(e, "stats");
}

void publish_state(struct engine *e, bool idle)
{
    e->last_publish_ms = lora_clock_mono_ms();
    if (encode_ready(e) == 0)
        publish_body(e, "config");
    registry_broadcast_to(e, false);
    for (int r = 0; r < e->world; r++)
        if (e->rank_state[r])
            lora_sock_send(e->pub, NULL, 0, "residency", e->rank_state[r],
                           e->rank_state_len[r], NULL, 0, ZMQ_DONTWAIT);
    if (idle)
        publish_idle_stats(e);
}
