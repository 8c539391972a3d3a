/* adapter: a PEFT LoRA adapter loaded for one model shard.
 *
 * Reads adapter_config.json (peft_type LORA, r, lora_alpha, target_modules as a list of
 * projection names or "all-linear", use_rslora, optional layers_to_transform) and
 * adapter_model.safetensors with PEFT keys
 *   base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight   (r, in)
 *   base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight   (out, r)
 * (mlp.gate_proj etc. for the MLP). Scaling is alpha / r, or alpha / sqrt(r) with rsLoRA.
 * Everything is checked against the base model: a rank above max_rank, an unknown or unsupported
 * module, a key for a layer the model lacks, a missing A or B, a wrong shape or an unsupported
 * option (fan_in_fan_out, bias training, rank_pattern) is an error naming the file and the key.
 * Both files are opened without blocking and must be regular files, so a FIFO, a socket or a
 * device in their place fails at once. A parse error gives the position and never quotes the
 * file's bytes.
 *
 * Weights are copied to float32 buffers the adapter owns, in host memory (the files are closed
 * after loading), cut for the shard like the base weights: for q, k, v, gate and up, B keeps this
 * shard's output rows; for o and down, A keeps this shard's input columns. B is stored
 * transposed. Computing with an adapter copies these into a slot of the backend's memory
 * (lora_forward_set_slot).
 */
#ifndef LORA_ADAPTER_H
#define LORA_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/model.h"

struct lora_adapter {
    int rank;
    float alpha;
    float scale;
    bool use_rslora;
    unsigned target_mask; /* bit (1u << enum lora_proj) per targeted projection */
    int n_layers;
    float **a; /* [layer * LORA_PROJ_COUNT + proj]: (rank, local in), or NULL when not targeted */
    float **b; /* same index: (rank, local out), B transposed so that expand streams its rows */
    size_t bytes; /* float32 bytes held */
};

/* Loads the adapter in dir for model m. Returns NULL with "file: reason" in err. */
struct lora_adapter *lora_adapter_load(const char *dir, const struct lora_model *m, int max_rank,
                                       char *err, size_t err_len);

/* Where a worker may read client-named adapters: the root directory, opened once. */
struct lora_adapter_root {
    int fd;              /* the root, opened with O_DIRECTORY */
    const char *path;    /* its real path: dir must lie strictly under it */
    bool allow_symlinks; /* links that stay beneath the root are followed */
};

/* As lora_adapter_load, for dir under root (NULL: as lora_adapter_load). The directory is
 * opened beneath root->fd and both files relative to it, so nothing outside the root is read
 * whatever is swapped on disk meanwhile; a symbolic link anywhere below the root is refused
 * unless root->allow_symlinks (and then it must resolve beneath the root). */
struct lora_adapter *lora_adapter_load_under(const struct lora_adapter_root *root, const char *dir,
                                             const struct lora_model *m, int max_rank, char *err,
                                             size_t err_len);

void lora_adapter_destroy(struct lora_adapter **a);

#endif
