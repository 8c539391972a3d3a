/* lora-inspect: git-style dispatch to one command per job. The connection options may also come
 * before the command (`lora-inspect --run-dir DIR residency`, as docs/design.md, "Supervisor"
 * writes it): they are moved behind it, where the command's own table parses them. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

static const struct lora_cli_command commands[] = {
    {"residency", cmd_residency, "one record per adapter per rank: level, slot, pinned, activity"},
    {"events", cmd_events, "print what the engine publishes (--follow: until stopped)"},
    {"stats", cmd_stats, "the engine's request counts, key/value blocks and preemptions"},
    {"config", cmd_config, "the engine's model and limits"},
    {"health", cmd_health, "exit 0 when the engine is healthy, 1 when not"},
    {"decode", cmd_decode, "concatenated msgpack maps on standard input to records"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

/* The options that may come before the command; each takes a value. */
static const char *const leading[] = {"run-dir", "control-endpoint", "publish-endpoint",
                                      "timeout-ms"};

static void usage(FILE *out)
{
    lora_cli_commands_usage(out, "lora-inspect", "lora-inspect [--run-dir DIR] COMMAND [OPTIONS]",
                            commands, N_COMMANDS);
}

/* How many arguments the leading option at argv[i] takes up (1 or 2), or 0 when it is not one. */
static int leading_width(int argc, char **argv, int i)
{
    const char *a = argv[i];

    if (strncmp(a, "--", 2) != 0)
        return 0;
    a += 2;
    for (size_t k = 0; k < sizeof(leading) / sizeof(leading[0]); k++) {
        size_t n = strlen(leading[k]);
        if (strncmp(a, leading[k], n) != 0)
            continue;
        if (a[n] == '=')
            return 1;
        if (a[n] == 0)
            return i + 1 < argc ? 2 : 0;
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* A reader that goes away shows up as EPIPE on a write, which ends the output quietly. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("lora-inspect %s\n", LORA_VERSION);
        return 0;
    }
    int first = 1;
    for (int w; first < argc && (w = leading_width(argc, argv, first)) > 0;)
        first += w;
    if (first >= argc || strncmp(argv[first], "-", 1) == 0) {
        if (first < argc)
            die_msg("option '%s' must follow the command", argv[first]);
        else
            die_msg("no command given");
        usage(stderr);
        return EXIT_USAGE;
    }
    const struct lora_cli_command *cmd = lora_cli_command_find(commands, N_COMMANDS, argv[first]);
    if (cmd) {
        /* argv becomes: COMMAND, the leading options, the rest. */
        char **args = must(calloc((size_t)argc + 1, sizeof(*args)));
        int n = 0;
        args[n++] = argv[first];
        for (int k = 1; k < first; k++)
            args[n++] = argv[k];
        for (int k = first + 1; k < argc; k++)
            args[n++] = argv[k];
        int rc = cmd->fn(n, args);
        free(args);
        return rc;
    }
    die_msg("unknown command '%s'", argv[first]);
    usage(stderr);
    return EXIT_USAGE;
}
