/* lora-worker device: opens the compute device that --device names and prints one line about
 * it: the backend, and its memory (total and available now).
 *
 * Owns the one way to ask "can a worker compute here?" without starting one (docs/design.md,
 * "Backend"): a device this build or this machine cannot compute on fails as serve and generate
 * would, with the same line and status 100, so that a supervisor (lora-stack up) can check
 * --device before it starts any worker. The precision flags are checked the same way: a value
 * serve would refuse, or a KV-cache or adapter dtype this device cannot compute with, fails here.
 */
#include <stdio.h>

#include "backend/backend.h"
#include "base/cli.h"
#include "runtime/precision.h"
#include "worker.h"

int cmd_device(int argc, char **argv)
{
    const char *device = "cpu";
    bool help = false;
    struct precision_flags pf = {0};
    const struct lora_cli_opt options[] = {
        {"device", LORA_OPT_STRING, &device, "DEVICE",
         "compute device: cpu, cuda or cuda:N (default cpu)"},
        PRECISION_OPTIONS(pf),
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {0},
    };
    char err[512] = "";

    struct lora_precision prec;
    lora_precision_defaults(&prec);
    if (lora_cli_parse(options, "LORA_WORKER", argc, argv, 1, err, sizeof(err)) < 0 ||
        lora_precision_parse(&prec, pf.dtype, pf.quantization, pf.lora_dtype, pf.kv_cache_dtype,
                             pf.matmul_precision, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-worker device [--device DEVICE] [PRECISION OPTIONS]\n");
        lora_cli_usage(stdout, options);
        return fflush(stdout) == 0 ? 0 : EXIT_SYSTEM;
    }
    struct lora_backend *be = lora_backend_open(device, err, sizeof(err));
    if (!be) {
        fprintf(stderr, "lora-worker: fatal: --device %s: %s\n", device, err);
        return EXIT_USAGE;
    }
    enum lora_dtype kv, lora;
    if (lora_precision_kv(&prec, be, &kv, err, sizeof(err)) < 0 ||
        (!prec.lora_auto &&
         lora_precision_lora(&prec, be, LORA_DTYPE_F32, &lora, err, sizeof(err)) < 0) ||
        (!prec.weights_auto && !be->ops->supports(be, LORA_KERNEL_MATMUL, prec.weights) &&
         snprintf(err, sizeof(err), "--dtype %s: the %s backend cannot compute with it",
                  lora_precision_name(prec.weights), be->kind)) ||
        (prec.int8 && !be->ops->supports(be, LORA_KERNEL_MATMUL, LORA_DTYPE_I8) &&
         snprintf(err, sizeof(err), "--quantization int8: the %s backend cannot compute with it",
                  be->kind))) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        lora_backend_close(&be);
        return EXIT_USAGE;
    }
    size_t total = 0, avail = 0;
    if (be->ops->memory(be, &total, &avail) == 0)
        printf("%s: %.1f GB of memory, %.1f GB available\n", be->description, total / 1e9,
               avail / 1e9);
    else
        printf("%s\n", be->description);
    lora_backend_close(&be);
    return fflush(stdout) == 0 ? 0 : EXIT_SYSTEM;
}
