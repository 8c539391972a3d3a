/* block_manager: the engine's accounting of KV cache blocks, by id only.
 *
 * The workers hold the storage (kv_cache.h); the engine decides which block ids each sequence
 * uses, and this module is where it does so. A pool of n_blocks ids, each holding block_size
 * consecutive positions of one sequence. A sequence addresses its blocks through a block table:
 * position p lives in block ids[p / block_size] at offset p % block_size, the layout
 * lora_seq_step.block_table expects (forward.h).
 *
 * Ownership: the manager owns the pool; the caller owns each block table and the ids array behind
 * it (fixed capacity, given at lora_block_table_init). A table only grows, by
 * lora_block_manager_ensure(), until lora_block_manager_free_table() gives every block back.
 *
 * Invariants a caller can rely on (lora_block_manager_check() verifies them):
 *   - n_free + blocks held == n_blocks;
 *   - a block is held by at most one table, at most once;
 *   - ensure() either allocates everything missing or nothing (atomic on failure).
 * Allocation order is deterministic: the lowest free ids first from a fresh pool, then the most
 * recently freed first (a stack). Nothing allocates after lora_block_manager_new().
 */
#ifndef LORA_BLOCK_MANAGER_H
#define LORA_BLOCK_MANAGER_H

/* One sequence's blocks. ids is the caller's storage of cap entries; ids[0..n) are held. */
struct lora_block_table {
    int *ids; /* (cap) block ids, in position order */
    int n;    /* blocks held */
    int cap;  /* capacity of ids */
};

/* Makes t an empty table over the caller's ids[cap]. */
void lora_block_table_init(struct lora_block_table *t, int *ids, int cap);

struct lora_block_manager;

/* A pool of n_blocks blocks of block_size positions (both >= 1). Returns NULL with errno EINVAL
 * for bad sizes, ENOMEM when out of memory. */
struct lora_block_manager *lora_block_manager_new(int n_blocks, int block_size);
void lora_block_manager_destroy(struct lora_block_manager **bm);

int lora_block_manager_n_blocks(const struct lora_block_manager *bm);
int lora_block_manager_block_size(const struct lora_block_manager *bm);
int lora_block_manager_n_free(const struct lora_block_manager *bm);

/* Blocks needed to hold n_tokens positions: ceil(n_tokens / block_size); 0 for n_tokens <= 0. */
int lora_block_manager_blocks_for(const struct lora_block_manager *bm, int n_tokens);

/* Grows t so that it covers positions [0, n_tokens_total), allocating only the missing blocks
 * (a table that already covers them is left as it is; a table never shrinks here). Returns 0, or
 * -1 with nothing allocated and errno ENOSPC when the pool has too few free blocks, E2BIG when
 * the table's capacity is too small. */
int lora_block_manager_ensure(struct lora_block_manager *bm, struct lora_block_table *t,
                              int n_tokens_total);

/* Returns every block of t to the pool and empties t. */
void lora_block_manager_free_table(struct lora_block_manager *bm, struct lora_block_table *t);

/* Debug helper: returns 0 when the pool is consistent (every id held or free, none free twice,
 * n_free + held == n_blocks), -1 otherwise. When tables is not NULL, tables[0..n_tables) must be
 * every table that holds blocks: each held block must appear in exactly one of them, once, and
 * none of them may name a free or out-of-range id. Callers assert on it; it never aborts itself,
 * so tests can also check that it catches corruption. O(n_blocks + total table length). */
int lora_block_manager_check(const struct lora_block_manager *bm,
                             const struct lora_block_table *const *tables, int n_tables);

#endif
