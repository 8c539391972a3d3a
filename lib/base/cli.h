/* cli: command-line options declared once in a table that also produces the usage text.
 *
 * Accepts "--name VALUE", "--name=VALUE" and bare "--flag". Every option has an environment
 * mirror, PREFIX_NAME (e.g. LORA_WORKER_MAX_TOKENS for --max-tokens under prefix LORA_WORKER),
 * read before the command line so the command line wins. Repeatable options collect every value
 * (from the environment: comma-separated). Numbers are range-checked. Errors name the option.
 */
#ifndef LORA_CLI_H
#define LORA_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum lora_cli_opt_kind {
    LORA_OPT_FLAG,   /* bool */
    LORA_OPT_INT,    /* long, within [min, max] */
    LORA_OPT_FLOAT,  /* double, within [min, max] */
    LORA_OPT_STRING, /* const char * (borrowed from argv or the environment) */
    LORA_OPT_LIST,   /* struct lora_cli_opt_list, repeatable */
};

#define LORA_VERSION "0.1.0" /* of every program */

#define LORA_OPT_LIST_MAX 64

struct lora_cli_opt_list {
    const char *items[LORA_OPT_LIST_MAX];
    int n;
};

struct lora_cli_opt {
    const char *name; /* without the leading dashes */
    enum lora_cli_opt_kind kind;
    void *dst;
    const char *arg;  /* metavariable in the usage text, e.g. "DIR" */
    const char *help;
    double min, max;  /* for INT and FLOAT */
};

/* Parses argv[first..argc) against opts (terminated by a zero entry), after the environment.
 * Positional arguments are not accepted. Returns 0, or -1 with the reason in err. */
int lora_cli_parse(const struct lora_cli_opt *opts, const char *env_prefix, int argc, char **argv,
                   int first, char *err, size_t err_len);

/* Prints one line per option: "  --name ARG   help". */
void lora_cli_usage(FILE *out, const struct lora_cli_opt *opts);

/* One command of a program with subcommands (git style): argv[0] of fn is the command's name. */
struct lora_cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

/* Prints usage_line, the commands (name and help, aligned) and how to get a command's options. */
void lora_cli_commands_usage(FILE *out, const char *prog, const char *usage_line,
                             const struct lora_cli_command *cmds, size_t n);

/* The command called name, or NULL. */
const struct lora_cli_command *lora_cli_command_find(const struct lora_cli_command *cmds,
                                                     size_t n, const char *name);

/* Parses "1,2,3" into ids (at most max). Returns the count, or -1 on a malformed list. */
int lora_cli_parse_ints(const char *s, int *ids, int max);

#endif
