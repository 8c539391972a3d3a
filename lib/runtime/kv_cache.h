/* kv_cache: paged key/value storage for every layer, in a backend's memory.
 *
 * Owns the KV storage and nothing else (docs/design.md, "Backend"): which blocks a sequence holds
 * is its caller's business (lib/sched/block_manager for the engine; offline generate gives each
 * request a contiguous range of blocks, since it knows every request up front). A block holds
 * block_size consecutive positions of one sequence for every layer; a sequence addresses its
 * blocks through a block table (position p lives in block table[p / block_size] at offset
 * p % block_size). Storage per layer is (n_blocks * block_size, kv_dim) for keys and the same for
 * values, two backend buffers allocated once, zero-filled, of the cache's dtype (--kv-cache-dtype,
 * runtime/precision.h): float32, bfloat16 or float16, as the backend takes for both kv_write and
 * attention.
 */
#ifndef LORA_KV_CACHE_H
#define LORA_KV_CACHE_H

#include <stddef.h>

#include "backend/backend.h"

struct lora_kv_cache {
    struct lora_backend *be; /* borrowed */
    enum lora_dtype dtype;
    int n_layers;
    int n_blocks;
    int block_size;
    int kv_dim;            /* local KV heads * head_dim */
    size_t layer_bytes;    /* of one layer's keys (or values) */
    struct lora_buffer *k; /* (n_layers, n_blocks * block_size, kv_dim) */
    struct lora_buffer *v; /* (n_layers, n_blocks * block_size, kv_dim) */
};

/* Returns NULL when the storage cannot be allocated (it may be large: no abort), the shape is
 * invalid, or the backend cannot keep a cache in dtype. */
struct lora_kv_cache *lora_kv_cache_new(struct lora_backend *be, enum lora_dtype dtype,
                                        int n_layers, int kv_dim, int block_size, int n_blocks);
void lora_kv_cache_destroy(struct lora_kv_cache **kv);

/* Bytes of storage for one block across all layers (keys and values) in dtype. */
size_t lora_kv_cache_block_bytes(enum lora_dtype dtype, int n_layers, int kv_dim, int block_size);

/* Keys / values of one layer: a (n_blocks * block_size, kv_dim) tensor in the cache's buffers. */
struct lora_tensor lora_kv_cache_k(const struct lora_kv_cache *kv, int layer);
struct lora_tensor lora_kv_cache_v(const struct lora_kv_cache *kv, int layer);

#endif
