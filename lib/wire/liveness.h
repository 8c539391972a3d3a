/* liveness: whether a peer is alive, from the traffic heard and sent (docs/design.md, "Wire
 * protocol"). Every connection carries heartbeats: a side sends one when it has sent the peer
 * nothing for LORA_HEARTBEAT_INTERVAL_MS, any message received counts as one, and a peer silent
 * for LORA_HEARTBEAT_LIVENESS intervals is dead. Pure arithmetic on lora_clock_mono_ms() times.
 */
#ifndef LORA_LIVENESS_H
#define LORA_LIVENESS_H

#include <stdbool.h>
#include <stdint.h>

#define LORA_HEARTBEAT_INTERVAL_MS 500 /* send a heartbeat after this long without sending */
#define LORA_HEARTBEAT_LIVENESS    6   /* intervals of silence before a peer is dead */
#define LORA_HEARTBEAT_DEAD_MS     (LORA_HEARTBEAT_INTERVAL_MS * LORA_HEARTBEAT_LIVENESS)

/* Liveness of one peer, on lora_clock_mono_ms() times. */
struct lora_peer_liveness {
    uint32_t interval_ms; /* heartbeat interval, LORA_HEARTBEAT_INTERVAL_MS by default */
    uint32_t liveness;    /* intervals of silence before dead, LORA_HEARTBEAT_LIVENESS */
    uint64_t last_heard_ms;
    uint64_t last_sent_ms;
};

/* Sets the defaults and counts now_ms as both heard and sent: a new peer gets the full grace
 * period, and the first heartbeat goes out one interval later. interval_ms and liveness may be
 * changed after this. */
void lora_liveness_init(struct lora_peer_liveness *l, uint64_t now_ms);

/* Records traffic received from the peer (any message counts). */
void lora_liveness_heard(struct lora_peer_liveness *l, uint64_t now_ms);

/* Records traffic sent to the peer (any message counts, heartbeat or not). */
void lora_liveness_sent(struct lora_peer_liveness *l, uint64_t now_ms);

/* True when nothing was heard for interval_ms * liveness or longer. */
bool lora_liveness_is_dead(const struct lora_peer_liveness *l, uint64_t now_ms);

/* True when nothing was sent for interval_ms or longer: time to send a heartbeat. */
bool lora_liveness_should_send(const struct lora_peer_liveness *l, uint64_t now_ms);

/* Milliseconds until the next thing to do for this peer (a heartbeat is due or it would be dead),
 * 0 when it is already due; a poll timeout for a loop that serves this peer. */
int lora_liveness_timeout_ms(const struct lora_peer_liveness *l, uint64_t now_ms);

#endif
