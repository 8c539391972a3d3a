/* notify_ring: a worker's bounded buffer of notifications; see notify_ring.h. */
#include "wire/notify_ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct lora_notify_ring {
    int capacity;
    int head; /* index of the oldest item */
    int count;
    uint64_t next_seq;
    uint64_t dropped;
    struct lora_notify_item *items; /* (capacity) */
};

const char *lora_notify_kind_name(int kind)
{
    switch (kind) {
    case LORA_NOTIFY_LORA_LOAD:
        return "lora_load";
    default:
        return NULL;
    }
}

void lora_notify_item_release(struct lora_notify_item *it)
{
    if (!it)
        return;
    free(it->data);
    memset(it, 0, sizeof(*it));
}

struct lora_notify_ring *lora_notify_ring_new(int capacity)
{
    if (capacity < 0)
        return NULL;
    struct lora_notify_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->capacity = capacity ? capacity : LORA_NOTIFY_RING_CAPACITY;
    r->next_seq = 1;
    r->items = calloc((size_t)r->capacity, sizeof(*r->items));
    if (!r->items) {
        free(r);
        return NULL;
    }
    return r;
}

void lora_notify_ring_destroy(struct lora_notify_ring **rp)
{
    struct lora_notify_ring *r = rp ? *rp : NULL;

    if (!r)
        return;
    for (int k = 0; k < r->count; k++)
        lora_notify_item_release(&r->items[(r->head + k) % r->capacity]);
    free(r->items);
    free(r);
    *rp = NULL;
}

uint64_t lora_notify_ring_next_seq(const struct lora_notify_ring *r)
{
    return r->next_seq;
}

/* Removes the oldest item from the ring without freeing its data. */
static struct lora_notify_item pop_oldest(struct lora_notify_ring *r)
{
    struct lora_notify_item it = r->items[r->head];

    memset(&r->items[r->head], 0, sizeof(it));
    r->head = (r->head + 1) % r->capacity;
    r->count--;
    return it;
}

int lora_notify_ring_push(struct lora_notify_ring *r, int kind, const void *data, size_t len,
                          uint64_t *seq)
{
    if (!data || len == 0 || len > LORA_NOTIFY_ITEM_MAX_BYTES) {
        errno = EINVAL;
        return -1;
    }
    void *copy = malloc(len);
    if (!copy) {
        errno = ENOMEM;
        return -1;
    }
    memcpy(copy, data, len);
    if (r->count == r->capacity) {
        struct lora_notify_item old = pop_oldest(r);

        lora_notify_item_release(&old);
        r->dropped++;
    }
    r->items[(r->head + r->count) % r->capacity] = (struct lora_notify_item){
        .seq = r->next_seq,
        .kind = kind,
        .data = copy,
        .len = len,
    };
    r->count++;
    if (seq)
        *seq = r->next_seq;
    r->next_seq++;
    return 0;
}

int lora_notify_ring_drain(struct lora_notify_ring *r,
                           int (*fn)(void *ctx, const struct lora_notify_item *it), void *ctx)
{
    int n = 0;

    while (r->count > 0 && fn(ctx, &r->items[r->head]) == 0) {
        struct lora_notify_item it = pop_oldest(r);

        lora_notify_item_release(&it);
        n++;
    }
    return n;
}

int lora_notify_ring_take(struct lora_notify_ring *r, struct lora_notify_item *out, int max_items)
{
    int n = 0;

    while (r->count > 0 && n < max_items)
        out[n++] = pop_oldest(r);
    return n;
}

bool lora_notify_ring_is_empty(const struct lora_notify_ring *r)
{
    return r->count == 0;
}

int lora_notify_ring_count(const struct lora_notify_ring *r)
{
    return r->count;
}

int lora_notify_ring_capacity(const struct lora_notify_ring *r)
{
    return r->capacity;
}

uint64_t lora_notify_ring_dropped(const struct lora_notify_ring *r)
{
    return r->dropped;
}
