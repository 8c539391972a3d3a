/* precision: vLLM's dtype flags to the element types of a worker; see precision.h. */
#include "runtime/precision.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    enum lora_dtype dtype;
} float_names[] = {
    {"float32", LORA_DTYPE_F32},  {"float", LORA_DTYPE_F32},   {"bfloat16", LORA_DTYPE_BF16},
    {"float16", LORA_DTYPE_F16},  {"half", LORA_DTYPE_F16},
};

void lora_precision_defaults(struct lora_precision *p)
{
    *p = (struct lora_precision){.weights_auto = true, .lora_auto = true, .kv_auto = true};
}

/* "auto" or a float dtype's name into (*is_auto, *dtype); NULL keeps the default. */
static int parse_float(const char *flag, const char *value, bool *is_auto, enum lora_dtype *dtype,
                       char *err, size_t err_len)
{
    if (!value)
        return 0;
    if (strcmp(value, "auto") == 0) {
        *is_auto = true;
        return 0;
    }
    for (size_t i = 0; i < sizeof(float_names) / sizeof(float_names[0]); i++)
        if (strcmp(value, float_names[i].name) == 0) {
            *is_auto = false;
            *dtype = float_names[i].dtype;
            return 0;
        }
    snprintf(err, err_len, "--%s '%s' must be auto, float32, bfloat16 or float16", flag, value);
    return -1;
}

int lora_precision_parse(struct lora_precision *p, const char *dtype, const char *quantization,
                         const char *lora_dtype, const char *kv_cache_dtype,
                         const char *matmul_precision, char *err, size_t err_len)
{
    if (parse_float("dtype", dtype, &p->weights_auto, &p->weights, err, err_len) < 0 ||
        parse_float("lora-dtype", lora_dtype, &p->lora_auto, &p->lora, err, err_len) < 0)
        return -1;
    if (kv_cache_dtype && strncmp(kv_cache_dtype, "fp8", 3) == 0) {
        snprintf(err, err_len, "--kv-cache-dtype '%s': fp8 caches are not supported; use auto, "
                 "float32, bfloat16 or float16", kv_cache_dtype);
        return -1;
    }
    if (parse_float("kv-cache-dtype", kv_cache_dtype, &p->kv_auto, &p->kv, err, err_len) < 0)
        return -1;
    if (quantization) {
        if (strcmp(quantization, "int8") != 0) {
            snprintf(err, err_len, "--quantization '%s' is not supported; the one method is int8 "
                     "(weight-only)", quantization);
            return -1;
        }
        p->int8 = true;
    }
    if (matmul_precision) {
        if (strcmp(matmul_precision, "exact") != 0 && strcmp(matmul_precision, "fast") != 0) {
            snprintf(err, err_len, "--matmul-precision '%s' must be exact or fast",
                     matmul_precision);
            return -1;
        }
        p->fast_matmul = strcmp(matmul_precision, "fast") == 0;
    }
    return 0;
}

static bool takes(struct lora_backend *be, enum lora_kernel a, enum lora_kernel b,
                  enum lora_dtype dtype)
{
    return be->ops->supports(be, a, dtype) && be->ops->supports(be, b, dtype);
}

int lora_precision_kv(const struct lora_precision *p, struct lora_backend *be,
                      enum lora_dtype *dtype, char *err, size_t err_len)
{
    /* auto: float32 on the CPU (docs/design.md, "The defaults, and why"), bfloat16 on a GPU,
     * where the cache is most of the memory and attention reads it every step. */
    *dtype = p->kv_auto ? (strcmp(be->kind, "cpu") == 0 ? LORA_DTYPE_F32 : LORA_DTYPE_BF16) : p->kv;
    if (p->kv_auto && !takes(be, LORA_KERNEL_KV_WRITE, LORA_KERNEL_ATTENTION, *dtype))
        *dtype = LORA_DTYPE_F32;
    if (takes(be, LORA_KERNEL_KV_WRITE, LORA_KERNEL_ATTENTION, *dtype))
        return 0;
    snprintf(err, err_len, "--kv-cache-dtype %s: the %s backend cannot keep its KV cache in it",
             lora_precision_name(*dtype), be->kind);
    return -1;
}

int lora_precision_lora(const struct lora_precision *p, struct lora_backend *be,
                        enum lora_dtype model_dtype, enum lora_dtype *dtype, char *err,
                        size_t err_len)
{
    if (p->lora_auto) {
        bool ok = be->ops->supports(be, LORA_KERNEL_LORA_SGMV, model_dtype);
        *dtype = ok ? model_dtype : LORA_DTYPE_F32;
        return 0;
    }
    *dtype = p->lora;
    if (be->ops->supports(be, LORA_KERNEL_LORA_SGMV, *dtype))
        return 0;
    snprintf(err, err_len, "--lora-dtype %s: the %s backend cannot compute LoRA in it",
             lora_precision_name(*dtype), be->kind);
    return -1;
}

const char *lora_precision_name(enum lora_dtype dtype)
{
    switch (dtype) {
    case LORA_DTYPE_F32:
        return "float32";
    case LORA_DTYPE_BF16:
        return "bfloat16";
    case LORA_DTYPE_F16:
        return "float16";
    case LORA_DTYPE_I8:
        return "int8";
    default:
        return lora_dtype_name(dtype);
    }
}
