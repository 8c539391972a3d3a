/* block_manager: KV block ids for the engine; see block_manager.h.
 *
 * A free stack of ids plus one mark per block (held or free). The marks make double frees and
 * double holds detectable, and let the check run in linear time without allocating.
 */
#include "sched/block_manager.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { MARK_FREE = 0, MARK_HELD = 1, MARK_SEEN = 2 };

struct lora_block_manager {
    int n_blocks;
    int block_size; /* positions per block */
    int *free_ids;  /* (n_blocks) stack of free ids; top at n_free - 1 */
    int n_free;
    unsigned char *mark; /* (n_blocks) MARK_FREE or MARK_HELD; MARK_SEEN only inside check */
};

void lora_block_table_init(struct lora_block_table *t, int *ids, int cap)
{
    t->ids = ids;
    t->n = 0;
    t->cap = cap;
}

struct lora_block_manager *lora_block_manager_new(int n_blocks, int block_size)
{
    if (n_blocks < 1 || block_size < 1) {
        errno = EINVAL;
        return NULL;
    }
    struct lora_block_manager *bm = calloc(1, sizeof(*bm));
    if (!bm)
        return NULL;
    bm->n_blocks = n_blocks;
    bm->block_size = block_size;
    bm->free_ids = malloc(sizeof(*bm->free_ids) * (size_t)n_blocks);
    bm->mark = calloc((size_t)n_blocks, 1);
    if (!bm->free_ids || !bm->mark) {
        lora_block_manager_destroy(&bm);
        errno = ENOMEM;
        return NULL;
    }
    /* Lowest ids on top of the stack: a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++)
        bm->free_ids[i] = n_blocks - 1 - i;
    bm->n_free = n_blocks;
    return bm;
}

void lora_block_manager_destroy(struct lora_block_manager **bmp)
{
    struct lora_block_manager *bm = bmp ? *bmp : NULL;

    if (!bm)
        return;
    free(bm->free_ids);
    free(bm->mark);
    free(bm);
    *bmp = NULL;
}

int lora_block_manager_n_blocks(const struct lora_block_manager *bm)
{
    return bm->n_blocks;
}

int lora_block_manager_block_size(const struct lora_block_manager *bm)
{
    return bm->block_size;
}

int lora_block_manager_n_free(const struct lora_block_manager *bm)
{
    return bm->n_free;
}

int lora_block_manager_blocks_for(const struct lora_block_manager *bm, int n_tokens)
{
    if (n_tokens <= 0)
        return 0;
    return (int)(((long long)n_tokens + bm->block_size - 1) / bm->block_size);
}

int lora_block_manager_ensure(struct lora_block_manager *bm, struct lora_block_table *t,
                              int n_tokens_total)
{
    int want = lora_block_manager_blocks_for(bm, n_tokens_total);

    if (want <= t->n)
        return 0;
    if (want > t->cap) {
        errno = E2BIG;
        return -1;
    }
    if (want - t->n > bm->n_free) {
        errno = ENOSPC;
        return -1;
    }
    while (t->n < want) {
        int id = bm->free_ids[--bm->n_free];

        assert(bm->mark[id] == MARK_FREE);
        bm->mark[id] = MARK_HELD;
        t->ids[t->n++] = id;
    }
    return 0;
}

void lora_block_manager_free_table(struct lora_block_manager *bm, struct lora_block_table *t)
{
    /* Last block first, so that the stack hands a sequence's blocks back in their old order. */
    while (t->n > 0) {
        int id = t->ids[--t->n];

        assert(id >= 0 && id < bm->n_blocks && bm->mark[id] == MARK_HELD);
        assert(bm->n_free < bm->n_blocks);
        bm->mark[id] = MARK_FREE;
        bm->free_ids[bm->n_free++] = id;
    }
}

/* Pool alone: free ids distinct and marked free, held = n_blocks - n_free. */
static int check_pool(struct lora_block_manager *bm)
{
    int n_held = 0, bad = 0;

    if (bm->n_free < 0 || bm->n_free > bm->n_blocks)
        return -1;
    for (int i = 0; i < bm->n_blocks; i++)
        n_held += bm->mark[i] == MARK_HELD;
    if (n_held + bm->n_free != bm->n_blocks)
        return -1;
    /* Marking each free id SEEN catches a duplicate on the stack or a held id on it. */
    for (int i = 0; i < bm->n_free; i++) {
        int id = bm->free_ids[i];

        if (id < 0 || id >= bm->n_blocks || bm->mark[id] != MARK_FREE) {
            bad = 1;
            continue;
        }
        bm->mark[id] = MARK_SEEN;
    }
    for (int i = 0; i < bm->n_free; i++) {
        int id = bm->free_ids[i];

        if (id >= 0 && id < bm->n_blocks && bm->mark[id] == MARK_SEEN)
            bm->mark[id] = MARK_FREE;
    }
    return bad ? -1 : 0;
}

/* Tables: each held id named exactly once across them, and nothing else named. */
static int check_tables(struct lora_block_manager *bm, const struct lora_block_table *const *tables,
                        int n_tables)
{
    long long n_named = 0;
    int bad = 0;

    for (int t = 0; t < n_tables; t++) {
        const struct lora_block_table *tab = tables[t];

        if (tab->n < 0 || tab->n > tab->cap)
            return -1;
        for (int i = 0; i < tab->n; i++) {
            int id = tab->ids[i];

            n_named++;
            if (id < 0 || id >= bm->n_blocks || bm->mark[id] != MARK_HELD) {
                bad = 1;
                continue;
            }
            bm->mark[id] = MARK_SEEN;
        }
    }
    for (int t = 0; t < n_tables; t++) {
        for (int i = 0; i < tables[t]->n; i++) {
            int id = tables[t]->ids[i];

            if (id >= 0 && id < bm->n_blocks && bm->mark[id] == MARK_SEEN)
                bm->mark[id] = MARK_HELD;
        }
    }
    if (n_named != bm->n_blocks - bm->n_free)
        bad = 1;
    return bad ? -1 : 0;
}

int lora_block_manager_check(const struct lora_block_manager *cbm,
                             const struct lora_block_table *const *tables, int n_tables)
{
    /* The marks are borrowed as scratch and restored before returning: logically const. */
    struct lora_block_manager *bm = (struct lora_block_manager *)cbm;

    if (check_pool(bm) != 0)
        return -1;
    if (tables && check_tables(bm, tables, n_tables) != 0)
        return -1;
    return 0;
}
