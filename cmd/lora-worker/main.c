/* lora-worker: one tensor-parallel rank of lora-stack. Subcommands run the model without the
 * other processes (generate), write generated models and adapters (make-model,
 * make-adapter) and say what a compute device is (device). */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "base/cli.h"
#include "worker.h"

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
    {"device", cmd_device, "open the compute device (--device) and describe it"},
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
        char builds[512];
        lora_backend_builds(builds, sizeof(builds));
        printf("lora-worker %s (backends: %s)\n", LORA_VERSION, builds);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lora-worker: fatal: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
