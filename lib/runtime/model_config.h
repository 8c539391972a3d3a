/* model_config: the hyper-parameters of a Hugging Face Llama-family model (config.json).
 *
 * Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v carry a bias).
 * head_dim defaults to hidden_size / num_attention_heads; num_key_value_heads defaults to
 * num_attention_heads; eos_token_id may be one id or a list. Every value is range-checked:
 * a model that loads has consistent dimensions (heads divisible by KV heads, head_dim even).
 */
#ifndef LORA_MODEL_CONFIG_H
#define LORA_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

enum lora_arch {
    LORA_ARCH_LLAMA,
    LORA_ARCH_MISTRAL,
    LORA_ARCH_QWEN2,
};

/* The seven projections a LoRA adapter may target, in the order of one layer's data flow. */
enum lora_proj {
    LORA_PROJ_Q,
    LORA_PROJ_K,
    LORA_PROJ_V,
    LORA_PROJ_O,
    LORA_PROJ_GATE,
    LORA_PROJ_UP,
    LORA_PROJ_DOWN,
    LORA_PROJ_COUNT,
};

#define LORA_MAX_EOS 8

struct lora_model_config {
    enum lora_arch arch;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    bool tie_word_embeddings;
    bool qkv_bias; /* Qwen2 */
    int bos_token_id; /* -1 when absent */
    int eos_token_ids[LORA_MAX_EOS];
    int n_eos;
};

/* Parses and validates a config.json. Returns 0, or -1 with "path: reason" in err. */
int lora_model_config_load(const char *path, struct lora_model_config *cfg, char *err,
                           size_t err_len);

/* "LlamaForCausalLM" etc.; lora_arch_from_name returns -1 for an unknown name. */
const char *lora_arch_name(enum lora_arch arch);
int lora_arch_from_name(const char *name);

/* "q_proj" ... "down_proj", and the PEFT module parent: "self_attn" or "mlp". */
const char *lora_proj_name(enum lora_proj p);
const char *lora_proj_parent(enum lora_proj p);
/* Returns the projection called name ("q_proj" or "q"), or -1. */
int lora_proj_from_name(const char *name);

/* Input and output width of projection p: the weight is [out, in] as Hugging Face stores it. */
int lora_proj_in(const struct lora_model_config *cfg, enum lora_proj p);
int lora_proj_out(const struct lora_model_config *cfg, enum lora_proj p);

#endif
