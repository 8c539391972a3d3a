/* synthetic: writes deterministic tiny random models and PEFT LoRA adapters in exactly the
 * Hugging Face layouts the loaders read. Used by the tests, by the benchmarks (with the shape of a
 * real model) and as the embedded demo model.
 *
 * A model directory gets: config.json, model.safetensors (or n_shards files
 * model-0000i-of-0000N.safetensors plus model.safetensors.index.json), tokenizer.json (a byte-level
 * BPE: 256 byte tokens in GPT-2's byte-to-unicode mapping, then the special tokens <s> and </s>),
 * tokenizer_config.json and generation_config.json. Weights depend only on the options and seed.
 * An adapter directory gets adapter_config.json and adapter_model.safetensors with PEFT keys.
 */
#ifndef LORA_MODEL_GEN_H
#define LORA_MODEL_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/model_config.h"
#include "runtime/safetensors.h"

struct lora_synthetic_model_opts {
    enum lora_arch arch;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim; /* 0: hidden_size / n_heads, and head_dim is not written to config.json */
    int vocab_size; /* >= 258 so the byte tokens and <s>, </s> fit */
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    bool tie_word_embeddings;
    enum lora_dtype dtype; /* F32, F16 or BF16 on disk */
    int n_shards;          /* 1: model.safetensors */
    uint64_t seed;
};

/* Fills o with the tiny default: Llama, hidden 64, intermediate 128, 2 layers, 4 heads,
 * 2 KV heads, vocab 320, f32, untied, 1 shard, seed 1. */
void lora_synthetic_model_defaults(struct lora_synthetic_model_opts *o);

/* Creates dir (and parents) if needed and writes the model. Returns 0 or -1 with err. */
int lora_synthetic_model_write(const char *dir, const struct lora_synthetic_model_opts *o, char *err,
                         size_t err_len);

struct lora_synthetic_adapter_opts {
    int rank;
    float alpha;
    bool use_rslora;
    unsigned target_mask; /* bit (1u << enum lora_proj) per targeted projection */
    enum lora_dtype dtype;
    uint64_t seed;
};

/* Fills o with: rank 8, alpha 16, no rsLoRA, all seven projections, F32, seed 1. */
void lora_synthetic_adapter_defaults(struct lora_synthetic_adapter_opts *o);

/* Writes a PEFT adapter for the model in model_dir (its config.json gives the shapes). */
int lora_synthetic_adapter_write(const char *dir, const char *model_dir,
                           const struct lora_synthetic_adapter_opts *o, char *err, size_t err_len);

#endif
