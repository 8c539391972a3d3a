/* Unit tests for lib/wire/notify_ring: order and sequence numbers preserved, the oldest dropped at
 * capacity with an exact drop count (a small ring and the default 1024), draining through a
 * callback (whole, and stopped midway), taking into an array, is_empty, and refused pushes that
 * change nothing. Item memory is checked under ASan: every copy is freed once.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "wire/notify_ring.h"

/* Pushes the payload "item-<k>" tagged kind k % 3. */
static int push_k(struct lora_notify_ring *r, int k, uint64_t *seq)
{
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "item-%d", k);

    return lora_notify_ring_push(r, k % 3, buf, (size_t)n, seq);
}

/* Whether it is push_k's item k with sequence number seq. */
static bool is_item(const struct lora_notify_item *it, int k, uint64_t seq)
{
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "item-%d", k);

    if (it->seq == seq && it->kind == k % 3 && it->len == (size_t)n &&
        memcmp(it->data, buf, (size_t)n) == 0)
        return true;
    printf("# item seq %llu kind %d len %zu, expected item-%d seq %llu\n",
           (unsigned long long)it->seq, it->kind, it->len, k, (unsigned long long)seq);
    return false;
}

static void test_order(void)
{
    struct lora_notify_ring *r = lora_notify_ring_new(16);
    struct lora_notify_item out[16];

    CHECK(r != NULL);
    CHECK(lora_notify_ring_is_empty(r) && lora_notify_ring_count(r) == 0);
    CHECK(lora_notify_ring_next_seq(r) == 1);
    for (int k = 0; k < 10; k++) {
        uint64_t next = lora_notify_ring_next_seq(r), seq = 0;

        CHECK(push_k(r, k, &seq) == 0);
        CHECK(seq == next && seq == (uint64_t)k + 1);
    }
    CHECK(!lora_notify_ring_is_empty(r) && lora_notify_ring_count(r) == 10);
    CHECK(lora_notify_ring_dropped(r) == 0);
    int n = lora_notify_ring_take(r, out, 16);
    CHECK(n == 10);
    for (int k = 0; k < n; k++) {
        CHECK(is_item(&out[k], k, (uint64_t)k + 1));
        lora_notify_item_release(&out[k]);
        CHECK(out[k].data == NULL && out[k].len == 0);
    }
    CHECK(lora_notify_ring_is_empty(r));
    CHECK(lora_notify_ring_take(r, out, 16) == 0);
    /* Sequence numbers are never reused. */
    uint64_t seq = 0;
    CHECK(push_k(r, 99, &seq) == 0 && seq == 11);
    lora_notify_ring_destroy(&r);
    CHECK(r == NULL);
    lora_notify_ring_destroy(NULL);
}

static void test_drop_oldest(void)
{
    struct lora_notify_ring *r = lora_notify_ring_new(4);
    struct lora_notify_item out[4];

    for (int k = 0; k < 10; k++)
        CHECK(push_k(r, k, NULL) == 0);
    CHECK(lora_notify_ring_count(r) == 4);
    CHECK(lora_notify_ring_dropped(r) == 6);
    CHECK(lora_notify_ring_take(r, out, 4) == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(is_item(&out[i], 6 + i, (uint64_t)7 + i));
        lora_notify_item_release(&out[i]);
    }
    /* The count is the total since creation: draining does not reset it. */
    for (int k = 10; k < 15; k++)
        CHECK(push_k(r, k, NULL) == 0);
    CHECK(lora_notify_ring_dropped(r) == 7);
    CHECK(lora_notify_ring_count(r) == 4);
    lora_notify_ring_destroy(&r); /* frees the four still held */
}

static void test_default_capacity(void)
{
    struct lora_notify_ring *r = lora_notify_ring_new(0);
    const int pushes = 1500;
    int bad = 0;

    CHECK(lora_notify_ring_capacity(r) == LORA_NOTIFY_RING_CAPACITY);
    CHECK(LORA_NOTIFY_RING_CAPACITY == 1024);
    for (int k = 0; k < pushes; k++)
        bad += push_k(r, k, NULL) != 0;
    CHECK(bad == 0);
    CHECK(lora_notify_ring_count(r) == 1024);
    CHECK(lora_notify_ring_dropped(r) == (uint64_t)(pushes - 1024));

    struct lora_notify_item *out = calloc(1024, sizeof(*out));
    int n = lora_notify_ring_take(r, out, 1024);
    CHECK(n == 1024);
    for (int i = 0; i < n; i++) {
        int k = pushes - 1024 + i;

        bad += !is_item(&out[i], k, (uint64_t)k + 1);
        lora_notify_item_release(&out[i]);
    }
    CHECK(bad == 0);
    free(out);
    lora_notify_ring_destroy(&r);
    CHECK(lora_notify_ring_new(-1) == NULL);
}

struct collect {
    int n;
    int stop_at; /* refuse the item at this index; -1: accept all */
    int k0;      /* payload number of the first item expected */
    uint64_t seq0;
    int bad;
};

static int collect_fn(void *ctx, const struct lora_notify_item *it)
{
    struct collect *c = ctx;

    if (c->n == c->stop_at)
        return -1;
    c->bad += !is_item(it, c->k0 + c->n, c->seq0 + (uint64_t)c->n);
    c->n++;
    return 0;
}

static void test_drain(void)
{
    struct lora_notify_ring *r = lora_notify_ring_new(8);
    struct collect col = {.stop_at = 3, .k0 = 0, .seq0 = 1};

    for (int k = 0; k < 6; k++)
        CHECK(push_k(r, k, NULL) == 0);
    CHECK(lora_notify_ring_drain(r, collect_fn, &col) == 3); /* stopped at the fourth */
    CHECK(col.n == 3 && col.bad == 0);
    CHECK(lora_notify_ring_count(r) == 3 && !lora_notify_ring_is_empty(r));

    col = (struct collect){.stop_at = -1, .k0 = 3, .seq0 = 4};
    CHECK(lora_notify_ring_drain(r, collect_fn, &col) == 3);
    CHECK(col.n == 3 && col.bad == 0);
    CHECK(lora_notify_ring_is_empty(r) && lora_notify_ring_count(r) == 0);
    CHECK(lora_notify_ring_drain(r, collect_fn, &col) == 0 && col.n == 3);

    /* Wrapped around the end of the storage: still oldest first. */
    for (int k = 0; k < 13; k++)
        CHECK(push_k(r, k, NULL) == 0);
    col = (struct collect){.stop_at = -1, .k0 = 5, .seq0 = 12};
    CHECK(lora_notify_ring_drain(r, collect_fn, &col) == 8);
    CHECK(col.bad == 0 && lora_notify_ring_is_empty(r));
    CHECK(lora_notify_ring_dropped(r) == 5);
    lora_notify_ring_destroy(&r);
}

static void test_take_partial(void)
{
    struct lora_notify_ring *r = lora_notify_ring_new(8);
    struct lora_notify_item out[3];

    for (int k = 0; k < 5; k++)
        CHECK(push_k(r, k, NULL) == 0);
    CHECK(lora_notify_ring_take(r, out, 3) == 3);
    for (int i = 0; i < 3; i++) {
        CHECK(is_item(&out[i], i, (uint64_t)i + 1));
        lora_notify_item_release(&out[i]);
    }
    CHECK(lora_notify_ring_count(r) == 2);
    CHECK(lora_notify_ring_take(r, out, 0) == 0);
    CHECK(lora_notify_ring_take(r, out, 3) == 2);
    CHECK(is_item(&out[0], 3, 4) && is_item(&out[1], 4, 5));
    lora_notify_item_release(&out[0]);
    lora_notify_item_release(&out[1]);
    lora_notify_item_release(NULL);
    CHECK(lora_notify_ring_is_empty(r));
    lora_notify_ring_destroy(&r);
}

static void test_bad_push(void)
{
    struct lora_notify_ring *r = lora_notify_ring_new(2);
    char byte = 'x';

    CHECK(push_k(r, 0, NULL) == 0 && push_k(r, 1, NULL) == 0);
    errno = 0;
    CHECK(lora_notify_ring_push(r, 0, &byte, 0, NULL) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(lora_notify_ring_push(r, 0, NULL, 4, NULL) == -1 && errno == EINVAL);
    errno = 0; /* refused on its length before anything is read */
    CHECK(lora_notify_ring_push(r, 0, &byte, LORA_NOTIFY_ITEM_MAX_BYTES + 1, NULL) == -1 &&
          errno == EINVAL);
    /* Nothing changed: no drop, no sequence number used. */
    CHECK(lora_notify_ring_count(r) == 2 && lora_notify_ring_dropped(r) == 0);
    CHECK(lora_notify_ring_next_seq(r) == 3);

    struct lora_notify_item out[2];
    CHECK(lora_notify_ring_take(r, out, 2) == 2);
    CHECK(is_item(&out[0], 0, 1) && is_item(&out[1], 1, 2));
    lora_notify_item_release(&out[0]);
    lora_notify_item_release(&out[1]);
    lora_notify_ring_destroy(&r);
}

static void test_kind_name(void)
{
    CHECK(strcmp(lora_notify_kind_name(LORA_NOTIFY_LORA_LOAD), "lora_load") == 0);
    CHECK(lora_notify_kind_name(-1) == NULL && lora_notify_kind_name(1) == NULL);
}

int main(void)
{
    RUN(test_order);
    RUN(test_drop_oldest);
    RUN(test_default_capacity);
    RUN(test_drain);
    RUN(test_take_partial);
    RUN(test_bad_push);
    RUN(test_kind_name);
    return check_done();
}
