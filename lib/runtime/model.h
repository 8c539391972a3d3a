/* model: a Hugging Face Llama-family checkpoint loaded for compute, whole or as one
 * tensor-parallel shard, into a backend's memory.
 *
 * Reads config.json, then model.safetensors or the shards named by model.safetensors.index.json,
 * all mmapped. Every tensor the architecture needs must be present with its exact shape and a
 * float dtype; a missing tensor, wrong shape or unusable dtype is an error naming the file and
 * the tensor.
 *
 * Owns the weights (docs/design.md, "Backend"): each is a struct lora_tensor in a buffer of the
 * model's backend, in the dtype precision asks for (runtime/precision.h): with --dtype auto a
 * projection, the embedding and the LM head keep the checkpoint's dtype; a named --dtype converts
 * them; --quantization int8 quantizes every matmul weight (projections and the LM head, tied or
 * not) at load. Norms and biases are float32 (tiny, and read in float32 by every kernel). A dtype
 * the backend does not take for every operation that reads the tensor (MATMUL for a
 * projection, EMBED and MATMUL for a tied embedding) is refused when it was named and replaced by
 * float32 under auto. A kept tensor that needs no slicing is used in place from the mapping where
 * the backend can wrap host memory (the CPU: zero-copy, so a bf16 checkpoint costs its file's
 * size); every other one, converted, quantized or sliced, goes into a buffer of its own, uploaded.
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

#include "backend/backend.h"
#include "runtime/model_config.h"
#include "runtime/precision.h"
#include "runtime/safetensors.h"

/* Every weight is a tensor of the model's backend; a vector is one row. */
struct lora_layer {
    struct lora_tensor attn_norm; /* (1, hidden) */
    struct lora_tensor wq;        /* (q_dim, hidden), q_dim = local heads * head_dim */
    struct lora_tensor wk;        /* (kv_dim, hidden) */
    struct lora_tensor wv;        /* (kv_dim, hidden) */
    struct lora_tensor bq;        /* (1, q_dim); .buf NULL without biases */
    struct lora_tensor bk;        /* (1, kv_dim) */
    struct lora_tensor bv;        /* (1, kv_dim) */
    struct lora_tensor wo;        /* (hidden, q_dim) */
    struct lora_tensor mlp_norm;  /* (1, hidden) */
    struct lora_tensor w_gate;    /* (inter, hidden), inter = local intermediate size */
    struct lora_tensor w_up;      /* (inter, hidden) */
    struct lora_tensor w_down;    /* (hidden, inter) */
};

struct lora_model {
    struct lora_model_config cfg;
    struct lora_backend *be; /* borrowed: outlives the model */
    int tp_rank;
    int tp_size;
    int n_heads;    /* local: cfg.n_heads / tp_size */
    int n_kv_heads; /* local */
    int inter;      /* local intermediate size */
    struct lora_tensor embed;      /* (vocab, hidden) */
    struct lora_tensor final_norm; /* (1, hidden) */
    struct lora_tensor lm_head;    /* (vocab, hidden); the embedding when tied */
    struct lora_layer *layers;     /* n_layers */
    struct lora_safetensors **files;
    int n_files;
    struct lora_buffer **buffers; /* the mappings wrapped, then each converted or sliced tensor */
    int n_buffers;
    size_t weight_bytes; /* bytes of this shard's weights in the backend, read once per step */
    enum lora_dtype weight_dtype; /* of the projections as computed with (I8: quantized) */
    enum lora_dtype base_dtype;   /* of the projections before any quantization: the
                                     checkpoint's under --dtype auto, else the one named */
};

/* Loads the model in dir as shard tp_rank of tp_size into be's memory, in the dtypes of
 * precision (NULL: every choice auto). Returns NULL with "file: reason" in err. */
struct lora_model *lora_model_load(struct lora_backend *be, const char *dir, int tp_rank,
                                   int tp_size, const struct lora_precision *precision, char *err,
                                   size_t err_len);

void lora_model_destroy(struct lora_model **m);

/* Local width of projection p on this shard (see lora_proj_in/out for the whole model). */
int lora_model_proj_in(const struct lora_model *m, enum lora_proj p);
int lora_model_proj_out(const struct lora_model *m, enum lora_proj p);

/* Whether projection p is split by output rows (q, k, v, gate, up) rather than by input
 * columns (o, down). */
bool lora_proj_is_column_parallel(enum lora_proj p);

#endif
