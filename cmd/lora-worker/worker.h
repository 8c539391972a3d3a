/* Subcommands of lora-worker, one file each. Each returns the process exit code:
 * 0 ok, 1 bad input (model, adapter or request), 100 usage, 111 system failure. */
#ifndef LORA_WORKER_CMD_H
#define LORA_WORKER_CMD_H

#include "base/cli.h"
#include "base/exit_codes.h"

/* The precision flags of serve and generate, parsed by runtime/precision. */
struct precision_flags {
    const char *dtype, *quantization, *lora_dtype, *kv_cache_dtype, *matmul_precision;
};

/* clang-format off */
#define PRECISION_OPTIONS(f)                                                                   \
    {"dtype", LORA_OPT_STRING, &(f).dtype, "DTYPE",                                            \
     "weights: auto (as stored), float32, bfloat16 or float16"},                               \
    {"quantization", LORA_OPT_STRING, &(f).quantization, "METHOD",                            \
     "int8: weight-only int8 projections and LM head"},                                        \
    {"lora-dtype", LORA_OPT_STRING, &(f).lora_dtype, "DTYPE",                                  \
     "adapter slots: auto (the model's), float32, bfloat16 or float16"},                       \
    {"kv-cache-dtype", LORA_OPT_STRING, &(f).kv_cache_dtype, "DTYPE",                          \
     "KV cache: auto (float32; bfloat16 on a GPU), float32, bfloat16 or float16"},             \
    {"matmul-precision", LORA_OPT_STRING, &(f).matmul_precision, "MODE",                       \
     "16-bit weights: exact (float32 activations) or fast (bf16 dot products)"}
/* clang-format on */

int cmd_generate(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_make_adapter(int argc, char **argv);
int cmd_demo_model(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_device(int argc, char **argv);

#endif
