/* notify_ring: a worker's bounded buffer of notifications (docs/design.md, "Residency").
 *
 * Holds at most `capacity` items (LORA_NOTIFY_RING_CAPACITY by default), oldest first. Each item
 * is an opaque byte string (the encoded notification: the ring knows no codec), a kind tag and a
 * sequence number the ring assigns (1, 2, 3, ... per ring, never reused). Pushing into a full
 * ring drops the oldest item and counts it; the count is the total since creation, as the
 * notifications message reports it.
 *
 * Memory: the item headers are allocated once by new; each push copies its bytes into one
 * malloc'd buffer of exactly len bytes, freed when the item is dropped, drained or destroyed
 * (items vary from a few hundred bytes to many kilobytes, so fixed slots would waste or limit).
 * A push that cannot allocate fails and changes nothing (the oldest item is not dropped).
 * Not thread-safe: the worker's loop owns it.
 */
#ifndef LORA_NOTIFY_RING_H
#define LORA_NOTIFY_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LORA_NOTIFY_RING_CAPACITY  1024
#define LORA_NOTIFY_ITEM_MAX_BYTES (16u << 20) /* one message body, as msg.h bounds it */

/* Kind tags; they only grow at the end. */
enum lora_notify_kind {
    LORA_NOTIFY_LORA_LOAD, /* "lora_load": a rank's loaded adapters and timings */
};

/* "lora_load", or NULL for an unknown kind. */
const char *lora_notify_kind_name(int kind);

struct lora_notify_item {
    uint64_t seq;
    int kind;
    void *data; /* len bytes, owned by whoever holds the item */
    size_t len;
};

/* Frees the item's data and zeroes the item. */
void lora_notify_item_release(struct lora_notify_item *it);

struct lora_notify_ring;

/* A ring of capacity items (0: LORA_NOTIFY_RING_CAPACITY). NULL when capacity < 0 or out of
 * memory. */
struct lora_notify_ring *lora_notify_ring_new(int capacity);

/* Frees every item still held. Nulls *r. */
void lora_notify_ring_destroy(struct lora_notify_ring **r);

/* The sequence number the next push will get (so the caller can encode it into the item). */
uint64_t lora_notify_ring_next_seq(const struct lora_notify_ring *r);

/* Appends a copy of (data, len) tagged kind, dropping the oldest item when full; *seq (may be
 * NULL) gets the item's sequence number. Returns 0, or -1 with errno EINVAL (len 0 or above
 * LORA_NOTIFY_ITEM_MAX_BYTES) or ENOMEM, the ring unchanged. */
int lora_notify_ring_push(struct lora_notify_ring *r, int kind, const void *data, size_t len,
                          uint64_t *seq);

/* Hands each item, oldest first, to fn, which borrows it for the call. An item for which fn
 * returns 0 is removed and freed; at the first nonzero return the drain stops and that item
 * and the later ones stay. Returns the number removed. */
int lora_notify_ring_drain(struct lora_notify_ring *r,
                           int (*fn)(void *ctx, const struct lora_notify_item *it), void *ctx);

/* Moves up to max_items of the oldest items into out (the caller then owns their data and
 * frees it with lora_notify_item_release). Returns the number moved. */
int lora_notify_ring_take(struct lora_notify_ring *r, struct lora_notify_item *out, int max_items);

bool lora_notify_ring_is_empty(const struct lora_notify_ring *r);
int lora_notify_ring_count(const struct lora_notify_ring *r);
int lora_notify_ring_capacity(const struct lora_notify_ring *r);

/* Items dropped because the ring was full, since creation. */
uint64_t lora_notify_ring_dropped(const struct lora_notify_ring *r);

#endif
