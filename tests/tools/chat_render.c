/* chat_render: renders chat requests through lib/text/chat_template, one JSON line in, one out.
 *
 * The template comes from a tokenizer_config.json (--config), a Jinja file (--template, with
 * its tokens from --bos / --eos) or a built-in name (--name); --bos / --eos override the
 * tokens of any of them. Each stdin line {"messages": [{"role", "content"}...],
 * "add_generation_prompt": bool} becomes {"prompt": "..."} or {"error": "..."} on stdout;
 * blank lines are skipped. tests/ref/chat_template_compat.js compares the prompts with the
 * Jinja reference renderers.
 *
 * Exit codes: 0 every line was a request (rendered or refused), 1 the template is not
 * recognised or a line is not a request, 100 usage, 111 a file or stdout failed.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/chat_template.h"

#define PROG "chat_render"

enum { EXIT_NO = 1, EXIT_USAGE = 100, EXIT_SYSTEM = 111 };

/* The options, and the usage text they produce. */
static const struct opt {
    const char *name;
    const char *arg;
    const char *help;
} opts[] = {
    {"config", "PATH", "tokenizer_config.json holding chat_template, bos_token, eos_token"},
    {"template", "PATH", "a Jinja chat template file"},
    {"name", "NAME", "a built-in template: chatml qwen2.5 qwen3 llama3 llama3.1 llama2 mistral"},
    {"bos", "TEXT", "the bos_token text (overrides the config's)"},
    {"eos", "TEXT", "the eos_token text (overrides the config's)"},
    {"describe", NULL, "print what was detected as one JSON object and exit"},
    {"canonical", NULL, "print the canonical form of --template's source and exit"},
    {"help", NULL, "this text"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

struct args {
    const char *config, *template_path, *name, *bos, *eos;
    bool describe, canonical;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " (--config PATH | --template PATH | --name NAME) [options]\n"
               "Renders JSON-line chat requests on stdin into {\"prompt\"} or {\"error\"} lines."
               "\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        char left[32];

        snprintf(left, sizeof(left), "--%s%s%s", opts[i].name, opts[i].arg ? " " : "",
                 opts[i].arg ? opts[i].arg : "");
        fprintf(f, "  %-18s %s\n", left, opts[i].help);
    }
    fprintf(f, "\nexit: 0 all lines read, 1 template not recognised or a line not a request, "
               "100 usage, 111 system failure\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, PROG ": usage: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see --help)\n");
    return -1;
}

/* Returns 0, 1 after --help, or -1 after a usage error. */
static int parse_args(int argc, char **argv, struct args *a)
{
    struct option lo[N_OPTS + 1];
    int c;

    for (size_t i = 0; i < N_OPTS; i++)
        lo[i] = (struct option){opts[i].name, opts[i].arg ? required_argument : no_argument, NULL,
                                (int)i + 1};
    memset(&lo[N_OPTS], 0, sizeof(lo[N_OPTS]));
    memset(a, 0, sizeof(*a));
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *v = optarg;

        if (c == 'h')
            c = (int)N_OPTS; /* --help is last */
        if (c == '?' && optopt >= 1 && optopt <= (int)N_OPTS)
            return usage_error("option '--%s' needs an argument", opts[optopt - 1].name);
        if (c < 1 || c > (int)N_OPTS)
            return usage_error("unknown option '%s'", argv[optind - 1]);
        const char *name = opts[c - 1].name;
        if (strcmp(name, "config") == 0)
            a->config = v;
        else if (strcmp(name, "template") == 0)
            a->template_path = v;
        else if (strcmp(name, "name") == 0)
            a->name = v;
        else if (strcmp(name, "bos") == 0)
            a->bos = v;
        else if (strcmp(name, "eos") == 0)
            a->eos = v;
        else if (strcmp(name, "describe") == 0)
            a->describe = true;
        else if (strcmp(name, "canonical") == 0)
            a->canonical = true;
        else
            return 1;
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (!!a->config + !!a->template_path + !!a->name != 1)
        return usage_error("give exactly one of --config, --template and --name");
    if (a->canonical && !a->template_path)
        return usage_error("--canonical needs --template");
    return 0;
}

/* Reads a whole file into a malloc'd string. Returns NULL with errno set. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;

    if (!f)
        return NULL;
    for (;;) {
        if (cap - len < 4096) {
            char *p = realloc(buf, cap = cap ? cap * 2 : 8192);

            if (!p) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = p;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        int e = errno;

        free(buf);
        fclose(f);
        errno = e ? e : EIO;
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* Loads the template the arguments name. Returns 0, or an exit code after a message. */
static int load_template(const struct args *a, struct lora_chat_template *t)
{
    char err[1024];
    int rc;

    if (a->config) {
        rc = lora_chat_template_from_config(a->config, t, err, sizeof(err));
    } else if (a->name) {
        rc = lora_chat_template_by_name(a->name, t, err, sizeof(err));
    } else {
        char *src = read_file(a->template_path);

        if (!src) {
            fprintf(stderr, PROG ": fatal: unable to read '%s': %s\n", a->template_path,
                    strerror(errno));
            return EXIT_SYSTEM;
        }
        rc = lora_chat_template_detect(src, t, err, sizeof(err));
        free(src);
    }
    if (rc == 0)
        rc = lora_chat_template_set_tokens(t, a->bos, a->eos, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, PROG ": fatal: %s\n", err);
        return EXIT_NO;
    }
    return 0;
}

static json_t *describe(const struct lora_chat_template *t)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:b, s:b}", "family",
                          lora_chat_template_family_name(t->family), "name", t->name, "bos_token",
                          t->bos_token, "eos_token", t->eos_token, "emits_bos", t->emits_bos,
                          "emits_eos", t->emits_eos);

    if (!o)
        return NULL;
    if (t->family == LORA_CHAT_CHATML) {
        json_object_set_new(o, "default_system",
                            t->chatml.has_default_system ? json_string(t->chatml.default_system)
                                                         : json_null());
        json_object_set_new(o, "qwen3_think", json_boolean(t->chatml.qwen3_think));
    } else if (t->family == LORA_CHAT_LLAMA3) {
        json_object_set_new(o, "trim_content", json_boolean(t->llama3.trim_content));
        json_object_set_new(o, "gen_prompt_always", json_boolean(t->llama3.gen_prompt_always));
        json_object_set_new(o, "system_block", json_boolean(t->llama3.system_block));
        json_object_set_new(o, "date_prefix", json_string(t->llama3.date_prefix));
        json_object_set_new(o, "date_default", json_string(t->llama3.date_default));
        json_object_set_new(o, "date_format", json_string(t->llama3.date_format));
    } else {
        static const char *const slots[] = {"none", "sys_block", "first_user", "last_user"};

        json_object_set_new(o, "system_slot", json_string(slots[t->inst.system_slot]));
        json_object_set_new(o, "open", json_string(t->inst.open));
        json_object_set_new(o, "close", json_string(t->inst.close));
        json_object_set_new(o, "bos_per_user", json_boolean(t->inst.bos_per_user));
        json_object_set_new(o, "user_strip", json_boolean(t->inst.user_strip));
        json_object_set_new(o, "asst_lead", json_string(t->inst.asst_lead));
        json_object_set_new(o, "asst_strip", json_boolean(t->inst.asst_strip));
        json_object_set_new(o, "asst_mid", json_string(t->inst.asst_mid));
        json_object_set_new(o, "asst_tail", json_string(t->inst.asst_tail));
        json_object_set_new(o, "alternate_error", json_string(t->inst.alternate_error));
        json_object_set_new(o, "role_error", json_string(t->inst.role_error));
    }
    return o;
}

/* Reads role or content of message m: a string, or NULL when absent or null. Returns 0, or -1
 * with reply set to an error. */
static int message_field(json_t *m, const char *key, size_t lineno, size_t i, const char **out,
                         char *reply, size_t reply_len)
{
    json_t *v = json_object_get(m, key);

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v)) {
        snprintf(reply, reply_len, "line %zu: message %zu: '%s' must be a string", lineno, i, key);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

/* Renders one request into a reply object; *bad is set when the line is not a request. */
static json_t *render_line(const struct lora_chat_template *t, const char *line, size_t lineno,
                           bool *bad)
{
    char reply[1024];
    json_error_t jerr;
    json_t *req = json_loads(line, JSON_REJECT_DUPLICATES, &jerr), *msgs, *gen;
    struct lora_chat_message *m = NULL;
    json_t *res = NULL;
    char *prompt;
    size_t len, n;

    *bad = true;
    if (!req) {
        snprintf(reply, sizeof(reply), "line %zu: invalid JSON at column %d: %s", lineno,
                 jerr.column, jerr.text);
        return json_pack("{s:s}", "error", reply);
    }
    msgs = json_object_get(req, "messages");
    gen = json_object_get(req, "add_generation_prompt");
    if (!json_is_array(msgs) || (gen && !json_is_boolean(gen))) {
        snprintf(reply, sizeof(reply),
                 "line %zu: a request needs a 'messages' list and a boolean "
                 "'add_generation_prompt'",
                 lineno);
        goto out_reply;
    }
    n = json_array_size(msgs);
    m = calloc(n ? n : 1, sizeof(*m));
    if (!m) {
        snprintf(reply, sizeof(reply), "line %zu: out of memory", lineno);
        goto out_reply;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *mi = json_array_get(msgs, i);

        if (!json_is_object(mi)) {
            snprintf(reply, sizeof(reply), "line %zu: message %zu is not an object", lineno, i);
            goto out_reply;
        }
        if (message_field(mi, "role", lineno, i, &m[i].role, reply, sizeof(reply)) < 0 ||
            message_field(mi, "content", lineno, i, &m[i].content, reply, sizeof(reply)) < 0)
            goto out_reply;
    }
    *bad = false;
    if (lora_chat_template_render(t, m, n, gen && json_is_true(gen), &prompt, &len, reply,
                                  sizeof(reply)) < 0)
        goto out_reply;
    res = json_pack("{s:s%}", "prompt", prompt, len);
    free(prompt);
    goto out;
out_reply:
    res = json_pack("{s:s}", "error", reply);
out:
    free(m);
    json_decref(req);
    return res;
}

static int print_json(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    int rc = s && puts(s) >= 0 ? 0 : -1;

    free(s);
    json_decref(o);
    return rc;
}

static int print_canonical(const char *path)
{
    char err[256], *src = read_file(path), *out;
    size_t len;

    if (!src) {
        fprintf(stderr, PROG ": fatal: unable to read '%s': %s\n", path, strerror(errno));
        return EXIT_SYSTEM;
    }
    int rc = lora_chat_template_canonical(src, &out, &len, err, sizeof(err));
    free(src);
    if (rc < 0) {
        fprintf(stderr, PROG ": fatal: %s\n", err);
        return EXIT_NO;
    }
    fwrite(out, 1, len, stdout);
    putchar('\n');
    free(out);
    return fflush(stdout) == 0 ? 0 : EXIT_SYSTEM;
}

int main(int argc, char **argv)
{
    struct lora_chat_template t;
    struct args a;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    bool any_bad = false;
    ssize_t n;
    int rc = parse_args(argc, argv, &a);

    if (rc > 0) {
        usage(stdout);
        return 0;
    }
    if (rc < 0)
        return EXIT_USAGE;
    if (a.canonical)
        return print_canonical(a.template_path);
    rc = load_template(&a, &t);
    if (rc)
        return rc;
    if (a.describe)
        return print_json(describe(&t)) == 0 && fflush(stdout) == 0 ? 0 : EXIT_SYSTEM;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        bool bad;

        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        if (print_json(render_line(&t, line, lineno, &bad)) < 0) {
            fprintf(stderr, PROG ": fatal: unable to write stdout: %s\n", strerror(errno));
            free(line);
            return EXIT_SYSTEM;
        }
        any_bad |= bad;
    }
    free(line);
    if (ferror(stdin) || fflush(stdout) != 0) {
        fprintf(stderr, PROG ": fatal: unable to %s: %s\n",
                ferror(stdin) ? "read stdin" : "write stdout", strerror(errno));
        return EXIT_SYSTEM;
    }
    return any_bad ? EXIT_NO : 0;
}
