/* lora-frontend: per-request stats on the publish socket (topic "request"), for lora-metrics:
 * the frontend's own times (arrival, first token, end) beside the engine's lifecycle times. */
#include <string.h>

#include "frontend.h"

void stats_publish(struct frontend *fe, const struct fe_stats *s)
{
    struct lora_msg_request_stats m = {
        .engine = fe->link.engine_index,
        .request_id = {s->request_id, strlen(s->request_id)},
        .finish_reason = {s->finish_reason, strlen(s->finish_reason)},
        .arrival_time = s->arrival,
        .first_token_time = s->first_token,
        .finished_time = s->finished,
        .queued_time = s->queued,
        .scheduled_time = s->scheduled,
        .engine_first_token_time = s->engine_first_token,
        .engine_finished_time = s->engine_finished,
        .num_prompt_tokens = s->prompt_tokens,
        .num_generation_tokens = s->generation_tokens,
        .max_tokens = s->max_tokens,
        .submit_seconds = s->submit_seconds,
        .output_seconds = s->output_seconds,
    };
    struct lora_buf b = {0};

    if (s->lora)
        m.lora = (struct lora_str){s->lora, strlen(s->lora)};
    if (lora_msg_encode_request_stats(&b, &m, NULL, NULL) == 0)
        link_publish(&fe->link, "request", b.data, b.len);
    lora_buf_release(&b);
}
