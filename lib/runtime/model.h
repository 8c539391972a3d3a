/* model: a Hugging Face Llama-family checkpoint loaded for compute, whole or as one
 * tensor-parallel shard.
 *
 * Reads config.json, then model.safetensors or the shards named by model.safetensors.index.json,
 * all mmapped. Every tensor the architecture needs must be present with its exact shape and a
 * float dtype; a missing tensor, wrong shape or unusable dtype is an error naming the file and
 * the tensor. Float32 tensors that need no slicing are used in place from the mapping; others are
 * converted (bfloat16, float16) or sliced into buffers the model owns.
 *
 * Tensor-parallel shard r of w: query heads, KV heads and the MLP's intermediate dimension are
 * split evenly (q/k/v/gate/up by output rows, o/down by input columns); embeddings, norms and
 * the LM head are replicated. The rank's partial outputs of o and down are summed across ranks
 * by the forward pass's all-reduce.
 */
#ifndef LORA_MODEL_H
#define LORA_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/model_config.h"
#include "runtime/safetensors.h"

struct lora_layer {
    const float *attn_norm; /* (hidden) */
    const float *wq;        /* (q_dim, hidden), q_dim = local heads * head_dim */
    const float *wk;        /* (kv_dim, hidden) */
    const float *wv;        /* (kv_dim, hidden) */
    const float *bq;        /* (q_dim) or NULL */
    const float *bk;        /* (kv_dim) or NULL */
    const float *bv;        /* (kv_dim) or NULL */
    const float *wo;        /* (hidden, q_dim) */
    const float *mlp_norm;  /* (hidden) */
    const float *w_gate;    /* (inter, hidden), inter = local intermediate size */
    const float *w_up;      /* (inter, hidden) */
    const float *w_down;    /* (hidden, inter) */
};

struct lora_model {
    struct lora_model_config cfg;
    int tp_rank;
    int tp_size;
    int n_heads;    /* local: cfg.n_heads / tp_size */
    int n_kv_heads; /* local */
    int inter;      /* local intermediate size */
    const float *embed;      /* (vocab, hidden) */
    const float *final_norm; /* (hidden) */
    const float *lm_head;    /* (vocab, hidden); the embedding when tied */
    struct lora_layer *layers; /* n_layers */
    struct lora_safetensors **files;
    int n_files;
    float **owned; /* converted or sliced tensors */
    int n_owned;
    size_t weight_bytes; /* float32 bytes of this shard's weights, read once per step */
};

/* Loads the model in dir as shard tp_rank of tp_size. Returns NULL with "file: reason" in err. */
struct lora_model *lora_model_load(const char *dir, int tp_rank, int tp_size, char *err,
                                   size_t err_len);

void lora_model_destroy(struct lora_model **m);

/* Local width of projection p on this shard (see lora_proj_in/out for the whole model). */
int lora_model_proj_in(const struct lora_model *m, enum lora_proj p);
int lora_model_proj_out(const struct lora_model *m, enum lora_proj p);

/* Whether projection p is split by output rows (q, k, v, gate, up) rather than by input
 * columns (o, down). */
bool lora_proj_is_column_parallel(enum lora_proj p);

#endif
