/* kv_cache: paged key/value storage for every layer, and the pool of its blocks.
 *
 * A block holds block_size consecutive positions of one sequence for every layer; a sequence
 * addresses its blocks through a block table (position p lives in block table[p / block_size] at
 * offset p % block_size). Storage per layer is (n_blocks * block_size, kv_dim) for keys and the
 * same for values, allocated once. Blocks are handed out from a free stack; the caller owns the
 * block tables. Invariant: n_free + blocks held by callers == n_blocks.
 */
#ifndef LORA_KV_CACHE_H
#define LORA_KV_CACHE_H

#include <stddef.h>

struct lora_kv_cache {
    int n_layers;
    int n_blocks;
    int block_size;
    int kv_dim; /* local KV heads * head_dim */
    float *k;   /* (n_layers, n_blocks * block_size, kv_dim) */
    float *v;   /* (n_layers, n_blocks * block_size, kv_dim) */
    int *free_blocks; /* stack of free block ids */
    int n_free;
};

/* Returns NULL when the storage cannot be allocated (it may be large: no abort). */
struct lora_kv_cache *lora_kv_cache_new(int n_layers, int kv_dim, int block_size, int n_blocks);
void lora_kv_cache_destroy(struct lora_kv_cache **kv);

/* Bytes of storage for one block across all layers (keys and values). */
size_t lora_kv_cache_block_bytes(int n_layers, int kv_dim, int block_size);

/* Takes a free block; -1 when none is left. */
int lora_kv_cache_alloc(struct lora_kv_cache *kv);
/* Returns block to the pool. The caller must own it. */
void lora_kv_cache_free(struct lora_kv_cache *kv, int block);

/* Keys / values of one layer: (n_blocks * block_size, kv_dim). */
float *lora_kv_cache_k(const struct lora_kv_cache *kv, int layer);
float *lora_kv_cache_v(const struct lora_kv_cache *kv, int layer);

#endif
