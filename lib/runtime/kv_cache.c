/* kv_cache: paged key/value storage and its block pool; see kv_cache.h. */
#include "runtime/kv_cache.h"

#include <stdlib.h>

size_t lora_kv_cache_block_bytes(int n_layers, int kv_dim, int block_size)
{
    return 2 * sizeof(float) * (size_t)n_layers * (size_t)block_size * (size_t)kv_dim;
}

struct lora_kv_cache *lora_kv_cache_new(int n_layers, int kv_dim, int block_size, int n_blocks)
{
    if (n_layers < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1)
        return NULL;
    struct lora_kv_cache *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return NULL;
    size_t per_layer = (size_t)n_blocks * block_size * kv_dim;
    kv->n_layers = n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->kv_dim = kv_dim;
    /* Zeroed so that a bug reading an unwritten slot gives stable numbers, not garbage. */
    kv->k = calloc(per_layer * n_layers, sizeof(float));
    kv->v = calloc(per_layer * n_layers, sizeof(float));
    kv->free_blocks = malloc(sizeof(int) * (size_t)n_blocks);
    if (!kv->k || !kv->v || !kv->free_blocks) {
        lora_kv_cache_destroy(&kv);
        return NULL;
    }
    /* Lowest ids on top of the stack, so allocation order is 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++)
        kv->free_blocks[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return kv;
}

void lora_kv_cache_destroy(struct lora_kv_cache **kvp)
{
    struct lora_kv_cache *kv = kvp ? *kvp : NULL;
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    free(kv->free_blocks);
    free(kv);
    *kvp = NULL;
}

int lora_kv_cache_alloc(struct lora_kv_cache *kv)
{
    return kv->n_free > 0 ? kv->free_blocks[--kv->n_free] : -1;
}

void lora_kv_cache_free(struct lora_kv_cache *kv, int block)
{
    kv->free_blocks[kv->n_free++] = block;
}

float *lora_kv_cache_k(const struct lora_kv_cache *kv, int layer)
{
    return kv->k + (size_t)layer * kv->n_blocks * kv->block_size * kv->kv_dim;
}

float *lora_kv_cache_v(const struct lora_kv_cache *kv, int layer)
{
    return kv->v + (size_t)layer * kv->n_blocks * kv->block_size * kv->kv_dim;
}
