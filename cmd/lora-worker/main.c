/* lora-worker: one tensor-parallel rank of lora-stack. Subcommands run the model without the
 * other processes (generate) and write generated models and adapters (make-model,
 * make-adapter). */
#include <stdio.h>
#include <string.h>

#include "base/cli.h"
#include "worker.h"

#ifdef LORA_CUDA
#include "backend/cuda/cuda_device.h"
#endif


static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"serve", cmd_serve, "serve as one tensor-parallel rank of an engine"},
    {"generate", cmd_generate, "run prompts through the model in shared batched steps"},
    {"make-model", cmd_make_model, "write a deterministic random model in Hugging Face layout"},
    {"make-adapter", cmd_make_adapter, "write a deterministic random PEFT LoRA adapter"},
    {"demo-model", cmd_demo_model, "write the demo model once and print its directory"},
};

static void usage(FILE *out)
{
    fputs("usage: lora-worker COMMAND [OPTIONS]\n\ncommands:\n", out);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].help);
    fputs("\nlora-worker COMMAND --help shows the options of a command.\n", out);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("lora-worker %s (backends: cpu", LORA_VERSION);
#ifdef LORA_CUDA
        char err[256];
        int n = lora_cuda_device_count(err, sizeof(err));
        if (n < 0)
            printf(", %s", err);
        else
            printf(", cuda: %d device%s", n, n == 1 ? "" : "s");
#endif
        puts(")");
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lora-worker: fatal: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
