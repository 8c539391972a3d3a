/* precision: the element types a worker computes with, as vLLM's flags name them.
 *
 *   --dtype auto|float32|bfloat16|float16   the base model's weights (vLLM's aliases float and
 *                                           half too); auto keeps each tensor as the checkpoint
 *                                           stores it
 *   --quantization int8                     weight-only int8 of every projection and the LM head
 *   --lora-dtype auto|float32|bfloat16|float16
 *                                           the adapter slots; auto: the base model's dtype
 *   --kv-cache-dtype auto|float32|bfloat16|float16
 *                                           the KV cache; auto: float32 on the CPU, bfloat16
 *                                           on a GPU
 *   --matmul-precision exact|fast           bf16 weights with float32 activations (exact) or
 *                                           activations rounded to bf16 for the CPU's bf16 dot
 *                                           product (fast)
 *
 * Activations, norms, softmax and accumulation are float32 in every case (docs/design.md,
 * "Precision"). A dtype asked for by name that the backend cannot compute with is an error; auto
 * falls back to float32 where the backend lacks the checkpoint's dtype.
 */
#ifndef LORA_PRECISION_H
#define LORA_PRECISION_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

struct lora_precision {
    bool weights_auto;
    enum lora_dtype weights; /* F32, BF16 or F16 when !weights_auto */
    bool int8;
    bool lora_auto;
    enum lora_dtype lora;
    bool kv_auto;
    enum lora_dtype kv;
    bool fast_matmul;
};

/* Every choice auto, exact matmul: the checkpoint as it ships. */
void lora_precision_defaults(struct lora_precision *p);

/* Sets p from the flags' values (NULL: not given, the default). Returns 0, or -1 with err naming
 * the flag and its accepted values. */
int lora_precision_parse(struct lora_precision *p, const char *dtype, const char *quantization,
                         const char *lora_dtype, const char *kv_cache_dtype,
                         const char *matmul_precision, char *err, size_t err_len);

/* The dtype of the KV cache on be: an error (-1 with err) when it was named and be cannot store
 * and attend over it. */
int lora_precision_kv(const struct lora_precision *p, struct lora_backend *be,
                      enum lora_dtype *dtype, char *err, size_t err_len);

/* The dtype of the adapter slots on be for a model whose weights were stored as model_dtype
 * (before any quantization): named, or model_dtype where be computes LoRA with it, else F32. */
int lora_precision_lora(const struct lora_precision *p, struct lora_backend *be,
                        enum lora_dtype model_dtype, enum lora_dtype *dtype, char *err,
                        size_t err_len);

/* vLLM's name of a dtype: "float32", "bfloat16", "float16", "int8". */
const char *lora_precision_name(enum lora_dtype dtype);

#endif
