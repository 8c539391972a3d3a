/* Unit tests for lib/sched/block_manager: tables grow by whole blocks and only by what is missing,
 * failures allocate nothing, freed blocks come back, the check catches corrupted accounting, and
 * a long random run agrees at every operation with a reference model kept by the test (which
 * block each table holds, counted independently).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "sched/block_manager.h"

#define CAP 64

#define TEST_RANDOM_SEED 0x9e3779b97f4a7c15ULL
#include "tests/common/test_random.h"

static int rnd_below(int n)
{
    return (int)(rng_next() % (uint64_t)n);
}

static void test_fresh_pool(void)
{
    struct lora_block_manager *bm = lora_block_manager_new(10, 4);
    int ids[CAP];
    struct lora_block_table t;

    CHECK(bm != NULL);
    CHECK(lora_block_manager_n_blocks(bm) == 10);
    CHECK(lora_block_manager_block_size(bm) == 4);
    CHECK(lora_block_manager_n_free(bm) == 10);
    CHECK(lora_block_manager_blocks_for(bm, 0) == 0);
    CHECK(lora_block_manager_blocks_for(bm, 1) == 1);
    CHECK(lora_block_manager_blocks_for(bm, 4) == 1);
    CHECK(lora_block_manager_blocks_for(bm, 5) == 2);
    CHECK(lora_block_manager_blocks_for(bm, 40) == 10);
    lora_block_table_init(&t, ids, CAP);
    CHECK(lora_block_manager_ensure(bm, &t, 9) == 0);
    CHECK(t.n == 3);
    /* A fresh pool hands out the lowest ids first. */
    CHECK(t.ids[0] == 0 && t.ids[1] == 1 && t.ids[2] == 2);
    CHECK(lora_block_manager_n_free(bm) == 7);
    const struct lora_block_table *all[] = {&t};
    CHECK(lora_block_manager_check(bm, all, 1) == 0);
    lora_block_manager_free_table(bm, &t);
    CHECK(t.n == 0);
    CHECK(lora_block_manager_n_free(bm) == 10);
    CHECK(lora_block_manager_check(bm, all, 1) == 0);
    lora_block_manager_destroy(&bm);
    CHECK(bm == NULL);
    lora_block_manager_destroy(&bm); /* NULL is fine */
}

static void test_ensure_grows_only_what_is_missing(void)
{
    struct lora_block_manager *bm = lora_block_manager_new(8, 4);
    int ids[CAP];
    struct lora_block_table t;

    lora_block_table_init(&t, ids, CAP);
    CHECK(lora_block_manager_ensure(bm, &t, 1) == 0);
    CHECK(t.n == 1);
    int first = t.ids[0];
    CHECK(lora_block_manager_ensure(bm, &t, 4) == 0); /* still one block */
    CHECK(t.n == 1 && lora_block_manager_n_free(bm) == 7);
    CHECK(lora_block_manager_ensure(bm, &t, 5) == 0);
    CHECK(t.n == 2 && t.ids[0] == first);
    CHECK(lora_block_manager_ensure(bm, &t, 2) == 0); /* never shrinks */
    CHECK(t.n == 2);
    CHECK(lora_block_manager_ensure(bm, &t, 0) == 0);
    CHECK(t.n == 2 && lora_block_manager_n_free(bm) == 6);
    CHECK(lora_block_manager_ensure(bm, &t, 17) == 0); /* 2 -> 5 in one call */
    CHECK(t.n == 5 && t.ids[0] == first);
    CHECK(lora_block_manager_n_free(bm) == 3);
    lora_block_manager_free_table(bm, &t);
    CHECK(lora_block_manager_n_free(bm) == 8);
    lora_block_manager_destroy(&bm);
}

static void test_failure_allocates_nothing(void)
{
    struct lora_block_manager *bm = lora_block_manager_new(4, 2);
    int ids_a[CAP], ids_b[CAP], ids_c[2];
    struct lora_block_table a, b, c;

    lora_block_table_init(&a, ids_a, CAP);
    lora_block_table_init(&b, ids_b, CAP);
    lora_block_table_init(&c, ids_c, 2);
    CHECK(lora_block_manager_ensure(bm, &a, 6) == 0); /* 3 of 4 blocks */
    CHECK(lora_block_manager_ensure(bm, &b, 1) == 0);
    CHECK(lora_block_manager_n_free(bm) == 0);
    errno = 0;
    CHECK(lora_block_manager_ensure(bm, &b, 3) == -1); /* needs a second block: none */
    CHECK(errno == ENOSPC);
    CHECK(b.n == 1 && lora_block_manager_n_free(bm) == 0);
    lora_block_manager_free_table(bm, &a);
    /* 3 free, b wants 4 more (10 positions = 5 blocks): all or nothing. */
    errno = 0;
    CHECK(lora_block_manager_ensure(bm, &b, 10) == -1);
    CHECK(errno == ENOSPC);
    CHECK(b.n == 1 && lora_block_manager_n_free(bm) == 3);
    /* Capacity: c holds 2 ids, 5 positions need 3 blocks. */
    errno = 0;
    CHECK(lora_block_manager_ensure(bm, &c, 5) == -1);
    CHECK(errno == E2BIG);
    CHECK(c.n == 0 && lora_block_manager_n_free(bm) == 3);
    CHECK(lora_block_manager_ensure(bm, &c, 4) == 0);
    const struct lora_block_table *all[] = {&a, &b, &c};
    CHECK(lora_block_manager_check(bm, all, 3) == 0);
    lora_block_manager_free_table(bm, &b);
    lora_block_manager_free_table(bm, &c);
    CHECK(lora_block_manager_n_free(bm) == 4);
    lora_block_manager_destroy(&bm);
}

static void test_freed_blocks_are_reused(void)
{
    struct lora_block_manager *bm = lora_block_manager_new(6, 1);
    int ids_a[CAP], ids_b[CAP];
    struct lora_block_table a, b;

    lora_block_table_init(&a, ids_a, CAP);
    lora_block_table_init(&b, ids_b, CAP);
    CHECK(lora_block_manager_ensure(bm, &a, 3) == 0); /* 0 1 2 */
    CHECK(lora_block_manager_ensure(bm, &b, 3) == 0); /* 3 4 5 */
    lora_block_manager_free_table(bm, &a);
    CHECK(lora_block_manager_ensure(bm, &a, 3) == 0);
    /* The same three ids, in their old order (last freed first out). */
    CHECK(a.ids[0] == 0 && a.ids[1] == 1 && a.ids[2] == 2);
    lora_block_manager_free_table(bm, &a);
    lora_block_manager_free_table(bm, &b);
    CHECK(lora_block_manager_n_free(bm) == 6);
    const struct lora_block_table *all[] = {&a, &b};
    CHECK(lora_block_manager_check(bm, all, 2) == 0);
    lora_block_manager_destroy(&bm);
}

static void test_check_catches_corruption(void)
{
    struct lora_block_manager *bm = lora_block_manager_new(8, 4);
    int ids_a[CAP], ids_b[CAP];
    struct lora_block_table a, b;

    lora_block_table_init(&a, ids_a, CAP);
    lora_block_table_init(&b, ids_b, CAP);
    CHECK(lora_block_manager_ensure(bm, &a, 8) == 0);
    CHECK(lora_block_manager_ensure(bm, &b, 4) == 0);
    const struct lora_block_table *both[] = {&a, &b}, *only_a[] = {&a};
    CHECK(lora_block_manager_check(bm, both, 2) == 0);
    CHECK(lora_block_manager_check(bm, NULL, 0) == 0);
    /* A holder missing from the list: held blocks nobody names. */
    CHECK(lora_block_manager_check(bm, only_a, 1) == -1);
    /* The same block in two tables. */
    int saved = b.ids[0];
    b.ids[0] = a.ids[1];
    CHECK(lora_block_manager_check(bm, both, 2) == -1);
    /* A table naming a free block. */
    b.ids[0] = 7;
    CHECK(lora_block_manager_check(bm, both, 2) == -1);
    /* An id out of range. */
    b.ids[0] = 99;
    CHECK(lora_block_manager_check(bm, both, 2) == -1);
    /* The check restores its scratch marks: once repaired, all is well again. */
    b.ids[0] = saved;
    CHECK(lora_block_manager_check(bm, both, 2) == 0);
    /* The same block twice in one table (and the other block of b unnamed). */
    int twice[] = {a.ids[0], a.ids[1], a.ids[0]};
    struct lora_block_table bad = {twice, 3, 3};
    const struct lora_block_table *with_bad[] = {&bad, &b};
    CHECK(lora_block_manager_check(bm, with_bad, 2) == -1);
    CHECK(lora_block_manager_check(bm, both, 2) == 0);
    lora_block_manager_free_table(bm, &a);
    lora_block_manager_free_table(bm, &b);
    CHECK(lora_block_manager_check(bm, both, 2) == 0);
    lora_block_manager_destroy(&bm);
}

static void test_bad_sizes(void)
{
    errno = 0;
    CHECK(lora_block_manager_new(0, 16) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(lora_block_manager_new(16, 0) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(lora_block_manager_new(-3, 16) == NULL && errno == EINVAL);
}

#define RT_TABLES 12
#define RT_BLOCKS 40
#define RT_BS     3
#define RT_CAP    20

/* Random ensure/free against a reference: the test's own count of positions per table and of
 * blocks held; every held id in exactly one table, checked through an owner array. */
static void test_random_against_reference(void)
{
    struct lora_block_manager *bm = lora_block_manager_new(RT_BLOCKS, RT_BS);
    int ids[RT_TABLES][RT_CAP], tokens[RT_TABLES] = {0}, owner[RT_BLOCKS];
    struct lora_block_table t[RT_TABLES];
    const struct lora_block_table *all[RT_TABLES];
    int bad = 0, n_fail = 0;

    for (int i = 0; i < RT_TABLES; i++) {
        lora_block_table_init(&t[i], ids[i], RT_CAP);
        all[i] = &t[i];
    }
    for (int op = 0; op < 20000 && !bad; op++) {
        int i = rnd_below(RT_TABLES);
        int held = 0;

        for (int k = 0; k < RT_TABLES; k++)
            held += (tokens[k] + RT_BS - 1) / RT_BS;
        if (rnd_below(5) == 0) {
            lora_block_manager_free_table(bm, &t[i]);
            tokens[i] = 0;
        } else {
            int want = tokens[i] + 1 + rnd_below(8);
            int need = (want + RT_BS - 1) / RT_BS - (tokens[i] + RT_BS - 1) / RT_BS;
            bool fits = need <= RT_BLOCKS - held && (want + RT_BS - 1) / RT_BS <= RT_CAP;
            int rc = lora_block_manager_ensure(bm, &t[i], want);

            bad |= (rc == 0) != fits;
            if (rc == 0)
                tokens[i] = want;
            else
                n_fail++;
        }
        held = 0;
        for (int b = 0; b < RT_BLOCKS; b++)
            owner[b] = -1;
        for (int k = 0; k < RT_TABLES; k++) {
            bad |= t[k].n != (tokens[k] + RT_BS - 1) / RT_BS;
            for (int j = 0; j < t[k].n; j++) {
                bad |= t[k].ids[j] < 0 || t[k].ids[j] >= RT_BLOCKS;
                if (t[k].ids[j] >= 0 && t[k].ids[j] < RT_BLOCKS) {
                    bad |= owner[t[k].ids[j]] != -1;
                    owner[t[k].ids[j]] = k;
                }
            }
            held += t[k].n;
        }
        bad |= lora_block_manager_n_free(bm) != RT_BLOCKS - held;
        bad |= lora_block_manager_check(bm, all, RT_TABLES) != 0;
    }
    CHECK(!bad);
    CHECK(n_fail > 0); /* the pool did run dry, so the failure path was exercised */
    for (int i = 0; i < RT_TABLES; i++)
        lora_block_manager_free_table(bm, &t[i]);
    CHECK(lora_block_manager_n_free(bm) == RT_BLOCKS);
    CHECK(lora_block_manager_check(bm, all, RT_TABLES) == 0);
    lora_block_manager_destroy(&bm);
}

int main(void)
{
    RUN(test_fresh_pool);
    RUN(test_ensure_grows_only_what_is_missing);
    RUN(test_failure_allocates_nothing);
    RUN(test_freed_blocks_are_reused);
    RUN(test_check_catches_corruption);
    RUN(test_bad_sizes);
    RUN(test_random_against_reference);
    return check_done();
}
