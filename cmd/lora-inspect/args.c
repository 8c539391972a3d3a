/* lora-inspect: the options every command shares. lib/base/cli reads the environment and the command
 * line into one table, so a format flag from each would look like two flags given together; the
 * environment is therefore parsed on its own first, and what the command line sets wins. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inspect.h"

void die_msg(const char *fmt, ...)
{
    va_list ap;

    fputs("lora-inspect: fatal: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void *must(void *p)
{
    if (!p) {
        die_msg("out of memory");
        exit(EXIT_SYSTEM);
    }
    return p;
}

void args_init(struct common_opts *c)
{
    memset(c, 0, sizeof(*c));
    c->timeout_ms = INSPECT_TIMEOUT_MS;
}

static void usage(FILE *out, const struct cmd_info *ci, const struct lora_cli_opt *opts)
{
    fprintf(out, "usage: lora-inspect %s %s\n\n%s\n\noptions:\n", ci->name, ci->synopsis,
            ci->about);
    lora_cli_usage(out, opts);
    fprintf(out,
            "\nEvery option has an environment mirror %s_NAME (--timeout-ms: "
            "%s_TIMEOUT_MS).\n",
            INSPECT_ENV_PREFIX, INSPECT_ENV_PREFIX);
}

/* The format chosen by the flags of one source: 0 none, 1 one (in *f), -1 more than one. */
static int chosen(const struct common_opts *c, enum out_format *f, const char **names)
{
    const bool set[] = {c->table, c->json, c->tsv, c->msgpack};
    static const char *const flag[] = {"--table", "--json", "--tsv", "--msgpack"};
    int n = 0;

    for (int i = 0; i < 4; i++) {
        if (!set[i])
            continue;
        if (n < 2)
            names[n] = flag[i];
        n++;
        *f = (enum out_format)i;
    }
    return n > 1 ? -1 : n;
}

/* "--json" -> "LORA_INSPECT_JSON" in buf. */
static const char *env_name(const char *flag, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "%s_", INSPECT_ENV_PREFIX);

    for (const char *p = flag + 2; *p && n + 1 < len; p++)
        buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[n < len ? n : len - 1] = 0;
    return buf;
}

static void clear_formats(struct common_opts *c)
{
    c->table = c->json = c->tsv = c->msgpack = false;
}

int args_parse(const struct cmd_info *ci, const struct lora_cli_opt *opts, int argc, char **argv,
               struct common_opts *c)
{
    struct lora_cli_opt_list saved[8];
    int n_lists = 0;
    const char *names[2];
    enum out_format env_format = OUT_JSON, cli_format = OUT_JSON;
    char err[512];

    /* The environment alone: argc = first, so no argument is read. */
    if (lora_cli_parse(opts, INSPECT_ENV_PREFIX, 1, argv, 1, err, sizeof(err)) < 0)
        goto usage_error;
    int env_n = chosen(c, &env_format, names);
    if (env_n < 0) {
        char a[64], b[64];
        snprintf(err, sizeof(err), "%s and %s are set together: choose one format",
                 env_name(names[0], a, sizeof(a)), env_name(names[1], b, sizeof(b)));
        goto usage_error;
    }
    clear_formats(c);
    for (const struct lora_cli_opt *o = opts; o->name; o++) {
        if (o->kind != LORA_OPT_LIST || n_lists == 8)
            continue;
        struct lora_cli_opt_list *l = o->dst;
        saved[n_lists++] = *l;
        l->n = 0;
    }
    if (lora_cli_parse(opts, NULL, argc, argv, 1, err, sizeof(err)) < 0)
        goto usage_error;
    n_lists = 0;
    for (const struct lora_cli_opt *o = opts; o->name; o++) {
        if (o->kind != LORA_OPT_LIST || n_lists == 8)
            continue;
        struct lora_cli_opt_list *l = o->dst;
        if (l->n == 0)
            *l = saved[n_lists];
        n_lists++;
    }
    int cli_n = chosen(c, &cli_format, names);
    if (cli_n < 0) {
        snprintf(err, sizeof(err), "%s and %s cannot be used together", names[0], names[1]);
        goto usage_error;
    }
    if (c->help) {
        usage(stdout, ci, opts);
        return 1;
    }
    if (cli_n == 1)
        c->format = cli_format;
    else if (env_n == 1)
        c->format = env_format;
    else
        c->format = isatty(STDOUT_FILENO) ? OUT_TABLE : OUT_JSON;
    return 0;

usage_error:
    fprintf(stderr, "lora-inspect: fatal: %s: %s\n", ci->name, err);
    fprintf(stderr, "lora-inspect: note: lora-inspect %s --help lists the options\n", ci->name);
    return -1;
}

/* lora-stack's default run directory, $XDG_RUNTIME_DIR/lora-stack else /tmp/lora-stack-UID,
 * into buf when it exists; NULL when not. */
static const char *default_run_dir(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int n = xdg && *xdg ? snprintf(buf, len, "%s/lora-stack", xdg)
                        : snprintf(buf, len, "/tmp/lora-stack-%u", (unsigned)getuid());

    if (n < 0 || (size_t)n >= len || stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return NULL;
    return buf;
}

const char *args_endpoint(const struct cmd_info *ci, const struct common_opts *c, const char *given,
                          const char *option, const char *sock_name, char *buf, size_t len)
{
    char dflt[4096];
    const char *run_dir = c->run_dir && *c->run_dir ? c->run_dir : NULL;

    if (given && *given)
        return given;
    if (!run_dir)
        run_dir = default_run_dir(dflt, sizeof(dflt));
    if (run_dir) {
        if ((size_t)snprintf(buf, len, "ipc://%s/%s", run_dir, sock_name) >= len) {
            fprintf(stderr, "lora-inspect: fatal: %s: --run-dir '%s' is too long\n", ci->name,
                    run_dir);
            return NULL;
        }
        return buf;
    }
    fprintf(stderr,
            "lora-inspect: fatal: %s: needs --run-dir DIR or --%s EP (no lora-stack run directory "
            "found)\n",
            ci->name, option);
    return NULL;
}
