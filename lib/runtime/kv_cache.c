/* kv_cache: paged key/value storage in a backend's buffers; see kv_cache.h. */
#include "runtime/kv_cache.h"

#include <stdlib.h>

size_t lora_kv_cache_block_bytes(enum lora_dtype dtype, int n_layers, int kv_dim, int block_size)
{
    return 2 * lora_dtype_size(dtype) * (size_t)n_layers * (size_t)block_size * (size_t)kv_dim;
}

struct lora_kv_cache *lora_kv_cache_new(struct lora_backend *be, enum lora_dtype dtype,
                                        int n_layers, int kv_dim, int block_size, int n_blocks)
{
    char err[256];

    if (!be || n_layers < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1 ||
        !be->ops->supports(be, LORA_KERNEL_KV_WRITE, dtype) ||
        !be->ops->supports(be, LORA_KERNEL_ATTENTION, dtype))
        return NULL;
    struct lora_kv_cache *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return NULL;
    kv->be = be;
    kv->dtype = dtype;
    kv->n_layers = n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->kv_dim = kv_dim;
    kv->layer_bytes = lora_tensor_bytes(kv->dtype, (int64_t)n_blocks * block_size, kv_dim);
    /* Zeroed (every buffer is) so that a bug reading an unwritten slot gives stable numbers, not
     * garbage. */
    kv->k = be->ops->buffer_alloc(be, kv->layer_bytes * (size_t)n_layers, err, sizeof(err));
    kv->v = kv->k ? be->ops->buffer_alloc(be, kv->layer_bytes * (size_t)n_layers, err, sizeof(err))
                  : NULL;
    if (!kv->k || !kv->v) {
        lora_kv_cache_destroy(&kv);
        return NULL;
    }
    return kv;
}

void lora_kv_cache_destroy(struct lora_kv_cache **kvp)
{
    struct lora_kv_cache *kv = kvp ? *kvp : NULL;
    if (!kv)
        return;
    kv->be->ops->buffer_free(kv->be, kv->k);
    kv->be->ops->buffer_free(kv->be, kv->v);
    free(kv);
    *kvp = NULL;
}

static struct lora_tensor layer_of(const struct lora_kv_cache *kv, struct lora_buffer *buf,
                                   int layer)
{
    return (struct lora_tensor){.buf = buf,
                                .offset = (size_t)layer * kv->layer_bytes,
                                .dtype = kv->dtype,
                                .rows = (int64_t)kv->n_blocks * kv->block_size,
                                .cols = kv->kv_dim};
}

struct lora_tensor lora_kv_cache_k(const struct lora_kv_cache *kv, int layer)
{
    return layer_of(kv, kv->k, layer);
}

struct lora_tensor lora_kv_cache_v(const struct lora_kv_cache *kv, int layer)
{
    return layer_of(kv, kv->v, layer);
}
