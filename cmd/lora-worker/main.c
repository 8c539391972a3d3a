/* lora-worker: one tensor-parallel rank of lora-stack. Subcommands run the model without the
 * other processes (generate), write generated models and adapters (make-model,
 * make-adapter) and say what a compute device is (device). */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "base/cli.h"
#include "worker.h"

static const struct lora_cli_command commands[] = {
    {"serve", cmd_serve, "serve as one tensor-parallel rank of an engine"},
    {"generate", cmd_generate, "run prompts through the model in shared batched steps"},
    {"make-model", cmd_make_model, "write a deterministic random model in Hugging Face layout"},
    {"make-adapter", cmd_make_adapter, "write a deterministic random PEFT LoRA adapter"},
    {"demo-model", cmd_demo_model, "write the demo model once and print its directory"},
    {"device", cmd_device, "open the compute device (--device) and describe it"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
    lora_cli_commands_usage(out, "lora-worker", "lora-worker COMMAND [OPTIONS]", commands,
                            N_COMMANDS);
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
    const struct lora_cli_command *cmd = lora_cli_command_find(commands, N_COMMANDS, argv[1]);
    if (cmd)
        return cmd->fn(argc - 1, argv + 1);
    fprintf(stderr, "lora-worker: fatal: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
