/* liveness: see liveness.h. */
#include "wire/liveness.h"

#include <limits.h>

/* Time from since to now, 0 if now is earlier (times from different sources). */
static uint64_t elapsed_ms(uint64_t since, uint64_t now)
{
    return now > since ? now - since : 0;
}

static uint64_t dead_after_ms(const struct lora_peer_liveness *l)
{
    return (uint64_t)l->interval_ms * l->liveness;
}

void lora_liveness_init(struct lora_peer_liveness *l, uint64_t now_ms)
{
    l->interval_ms = LORA_HEARTBEAT_INTERVAL_MS;
    l->liveness = LORA_HEARTBEAT_LIVENESS;
    l->last_heard_ms = now_ms;
    l->last_sent_ms = now_ms;
}

void lora_liveness_heard(struct lora_peer_liveness *l, uint64_t now_ms)
{
    if (now_ms > l->last_heard_ms)
        l->last_heard_ms = now_ms;
}

void lora_liveness_sent(struct lora_peer_liveness *l, uint64_t now_ms)
{
    if (now_ms > l->last_sent_ms)
        l->last_sent_ms = now_ms;
}

bool lora_liveness_is_dead(const struct lora_peer_liveness *l, uint64_t now_ms)
{
    return elapsed_ms(l->last_heard_ms, now_ms) >= dead_after_ms(l);
}

bool lora_liveness_should_send(const struct lora_peer_liveness *l, uint64_t now_ms)
{
    return elapsed_ms(l->last_sent_ms, now_ms) >= l->interval_ms;
}

int lora_liveness_timeout_ms(const struct lora_peer_liveness *l, uint64_t now_ms)
{
    uint64_t sent = elapsed_ms(l->last_sent_ms, now_ms);
    uint64_t heard = elapsed_ms(l->last_heard_ms, now_ms);
    uint64_t send_in = sent < l->interval_ms ? l->interval_ms - sent : 0;
    uint64_t dead_in = heard < dead_after_ms(l) ? dead_after_ms(l) - heard : 0;
    uint64_t next = send_in < dead_in ? send_in : dead_in;

    return next > INT_MAX ? INT_MAX : (int)next;
}
