/* cli: table-driven option parsing with environment mirrors; see cli.h. */
#include "base/cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct lora_cli_opt *find(const struct lora_cli_opt *opts, const char *name, size_t len)
{
    for (const struct lora_cli_opt *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

static int set_value(const struct lora_cli_opt *o, const char *val, const char *origin, char *err,
                     size_t err_len)
{
    char *end;

    switch (o->kind) {
    case LORA_OPT_FLAG:
        if (!val || strcmp(val, "1") == 0 || strcmp(val, "true") == 0) {
            *(bool *)o->dst = true;
        } else if (strcmp(val, "0") == 0 || strcmp(val, "false") == 0) {
            *(bool *)o->dst = false;
        } else {
            snprintf(err, err_len, "%s --%s takes no value, got '%s'", origin, o->name, val);
            return -1;
        }
        return 0;
    case LORA_OPT_INT: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end || v < o->min || v > o->max) {
            snprintf(err, err_len, "%s --%s must be an integer in [%.0f, %.0f], got '%s'", origin,
                     o->name, o->min, o->max, val);
            return -1;
        }
        *(long *)o->dst = v;
        return 0;
    }
    case LORA_OPT_FLOAT: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v) || v < o->min || v > o->max) {
            snprintf(err, err_len, "%s --%s must be a number in [%g, %g], got '%s'", origin,
                     o->name, o->min, o->max, val);
            return -1;
        }
        *(double *)o->dst = v;
        return 0;
    }
    case LORA_OPT_STRING:
        *(const char **)o->dst = val;
        return 0;
    case LORA_OPT_LIST: {
        struct lora_cli_opt_list *l = o->dst;
        if (l->n >= LORA_OPT_LIST_MAX) {
            snprintf(err, err_len, "%s --%s is given more than %d times", origin, o->name,
                     LORA_OPT_LIST_MAX);
            return -1;
        }
        l->items[l->n++] = val;
        return 0;
    }
    }
    return -1;
}

/* Environment values live as long as the process; a list value is split in a copy that lives
 * as long, held here so that it stays reachable. */
static char *env_copies[LORA_OPT_LIST_MAX];
static int n_env_copies;

static int parse_env(const struct lora_cli_opt *opts, const char *prefix, char *err, size_t err_len)
{
    for (const struct lora_cli_opt *o = opts; o->name; o++) {
        char var[128];
        size_t n = (size_t)snprintf(var, sizeof(var), "%s_", prefix);
        for (const char *p = o->name; *p && n < sizeof(var) - 1; p++)
            var[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        var[n] = 0;
        const char *val = getenv(var);
        if (!val)
            continue;
        if (o->kind != LORA_OPT_LIST) {
            if (set_value(o, val, var, err, err_len) < 0)
                return -1;
            continue;
        }
        if (n_env_copies == LORA_OPT_LIST_MAX) {
            snprintf(err, err_len, "%s: too many list options in the environment", var);
            return -1;
        }
        char *copy = strdup(val); /* kept: the list borrows its pieces */
        if (!copy)
            return -1;
        env_copies[n_env_copies++] = copy;
        for (char *save, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (set_value(o, tok, var, err, err_len) < 0)
                return -1;
    }
    return 0;
}

int lora_cli_parse(const struct lora_cli_opt *opts, const char *env_prefix, int argc, char **argv,
                   int first, char *err, size_t err_len)
{
    if (env_prefix && parse_env(opts, env_prefix, err, err_len) < 0)
        return -1;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 && find(opts, "help", 4))
            a = "--help";
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, err_len, "unexpected argument '%s'", a);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct lora_cli_opt *o = find(opts, name, len);
        if (!o) {
            snprintf(err, err_len, "unknown option '%.*s'", (int)(len + 2), a);
            return -1;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val && o->kind != LORA_OPT_FLAG) {
            if (i + 1 >= argc) {
                snprintf(err, err_len, "option --%s needs a value", o->name);
                return -1;
            }
            val = argv[++i];
        }
        if (set_value(o, val, "option", err, err_len) < 0)
            return -1;
    }
    return 0;
}

void lora_cli_usage(FILE *out, const struct lora_cli_opt *opts)
{
    for (const struct lora_cli_opt *o = opts; o->name; o++) {
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(out, "  %-28s %s\n", left, o->help);
    }
}

int lora_cli_parse_ints(const char *s, int *ids, int max)
{
    int n = 0;
    const char *p = s;

    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffff || n >= max)
            return -1;
        ids[n++] = (int)v;
        p = end;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

void lora_cli_commands_usage(FILE *out, const char *prog, const char *usage_line,
                             const struct lora_cli_command *cmds, size_t n)
{
    int width = 0;

    for (size_t i = 0; i < n; i++)
        if ((int)strlen(cmds[i].name) > width)
            width = (int)strlen(cmds[i].name);
    fprintf(out, "usage: %s\n\ncommands:\n", usage_line);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-*s  %s\n", width, cmds[i].name, cmds[i].help);
    fprintf(out, "\n%s COMMAND --help shows the options of a command.\n", prog);
}

const struct lora_cli_command *lora_cli_command_find(const struct lora_cli_command *cmds,
                                                     size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(cmds[i].name, name) == 0)
            return &cmds[i];
    return NULL;
}
