/* backend: opening a device by name, and the names of the operations (see backend.h).
 *
 * Owns the one place that maps a --device string to a backend (docs/design.md, "Backend"): "cpu"
 * is backend/cpu; "cuda" and "cuda:N" are backend/cuda in a build with nvcc (CUDA=1, or auto
 * where nvcc is found), refused with the build as the reason otherwise. A device the machine lacks
 * (no driver, no GPU, a GPU too old) fails the open with one clause saying so, so a worker never
 * starts on a device it cannot compute on.
 */
#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#ifdef LORA_CUDA
#include "backend/cuda/cuda_device.h"
#endif

static const char *const kernel_names[LORA_KERNEL_COUNT] = {
    [LORA_KERNEL_MATMUL] = "matmul",
    [LORA_KERNEL_ADD_BIAS] = "add_bias",
    [LORA_KERNEL_EMBED] = "embed",
    [LORA_KERNEL_RMSNORM] = "rmsnorm",
    [LORA_KERNEL_ROPE] = "rope",
    [LORA_KERNEL_SILU_MUL] = "silu_mul",
    [LORA_KERNEL_ADD] = "add",
    [LORA_KERNEL_KV_WRITE] = "kv_write",
    [LORA_KERNEL_ATTENTION] = "attention",
    [LORA_KERNEL_LORA_SGMV] = "lora_sgmv",
    [LORA_KERNEL_ALLREDUCE] = "allreduce",
};

const char *lora_kernel_name(enum lora_kernel op)
{
    return (int)op >= 0 && op < LORA_KERNEL_COUNT ? kernel_names[op] : "?";
}

/* "cuda" is device 0; "cuda:N" device N (digits only, at most 4). Returns -1 when s is neither. */
static int cuda_index(const char *s)
{
    if (strcmp(s, "cuda") == 0)
        return 0;
    if (strncmp(s, "cuda:", 5) != 0 || !s[5] || strlen(s + 5) > 4)
        return -1;
    for (const char *p = s + 5; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    return atoi(s + 5);
}

struct lora_backend *lora_backend_open(const char *device, char *err, size_t err_len)
{
    if (!device || strcmp(device, "cpu") == 0)
        return lora_cpu_backend_new(err, err_len);
    int index = cuda_index(device);
    if (index < 0) {
        snprintf(err, err_len, "unknown device '%s' (cpu, cuda or cuda:N)", device);
        return NULL;
    }
#ifdef LORA_CUDA
    return lora_cuda_backend_new(index, err, err_len);
#else
    snprintf(err, err_len, "this build has no CUDA backend (built with CUDA=0)");
    return NULL;
#endif
}

void lora_backend_close(struct lora_backend **bep)
{
    struct lora_backend *be = bep ? *bep : NULL;

    if (!be)
        return;
    be->ops->close(be);
    free(be);
    *bep = NULL;
}

void lora_backend_builds(char *buf, size_t len)
{
    /* The CPU's paths as this machine gets them: "cpu (AVX-512, BF16 dot, VNNI int8, 2 threads)". */
    char cpu[200] = "cpu", err[128];
    struct lora_backend *be = lora_cpu_backend_new(err, sizeof(err));
    if (be) {
        snprintf(cpu, sizeof(cpu), "%s", be->description);
        lora_backend_close(&be);
    }
#ifdef LORA_CUDA
    char why[256];
    int n = lora_cuda_device_count(why, sizeof(why));
    if (n < 0)
        snprintf(buf, len, "%s, cuda: %s", cpu, why);
    else
        snprintf(buf, len, "%s, cuda: %d device%s", cpu, n, n == 1 ? "" : "s");
#else
    snprintf(buf, len, "%s", cpu);
#endif
}
