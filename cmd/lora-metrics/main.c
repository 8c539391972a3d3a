/* lora-metrics: options, wiring and exit codes (0 after SIGTERM or SIGINT, 100 usage, 111 a
 * system failure such as an address in use). Subscribes to engines' and frontends' publish
 * sockets, or reads message bodies from standard input, and serves /metrics and /health. */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli.h"
#include "metrics.h"
#include "base/run_dir.h"

#define DEFAULT_ENGINE_TIMEOUT_MS 5000 /* also the longest wait for the ready line when 0 */

/* Where a string option's value came from, for its error: the variable when the value is the
 * environment's own (lib/base/cli keeps getenv()'s pointer), else the option. */
static const char *origin(const char *value, const char *option, const char *var)
{
    return value && value == getenv(var) ? var : option;
}

/* "HOST:PORT", HOST a numeric IPv4 address or [IPv6]. host gets the address. 0 or -1. */
static int parse_listen(const char *s, char *host, size_t host_len, int *port, char *err,
                        size_t err_len)
{
    const char *colon = strrchr(s, ':');
    const char *h = s, *h_end = colon;
    unsigned char addr[16];

    if (colon && s[0] == '[') {
        h = s + 1;
        h_end = colon > s && colon[-1] == ']' ? colon - 1 : NULL;
    }
    char *end;
    long p = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || !h_end || h_end <= h || (size_t)(h_end - h) >= host_len || !colon[1] || *end ||
        p < 0 || p > 65535) {
        snprintf(err, err_len, "%s '%s': give HOST:PORT (port 0 to 65535, IPv6 as [ADDR])",
                 origin(s, "--listen", "LORA_METRICS_LISTEN"), s);
        return -1;
    }
    memcpy(host, h, (size_t)(h_end - h));
    host[h_end - h] = 0;
    if (inet_pton(strchr(host, ':') ? AF_INET6 : AF_INET, host, addr) != 1) {
        snprintf(err, err_len, "%s '%s': '%s' is not a numeric IP address",
                 origin(s, "--listen", "LORA_METRICS_LISTEN"), s, host);
        return -1;
    }
    *port = (int)p;
    return 0;
}

static bool already(const struct metrics *m, const char *ep)
{
    for (int i = 0; i < m->n_src; i++)
        if (strcmp(m->src[i].endpoint, ep) == 0)
            return true;
    return false;
}

static int add_sources(struct metrics *m, const struct lora_cli_opt_list *l,
                       enum lora_metrics_state_source_kind kind, char *err, size_t err_len)
{
    for (int i = 0; i < l->n; i++) {
        if (!*l->items[i]) {
            snprintf(err, err_len, "an empty endpoint");
            return -1;
        }
        if (already(m, l->items[i]))
            continue; /* twice the same publisher would count everything twice */
        if (m->n_src == METRICS_MAX_SOURCES) {
            snprintf(err, err_len, "more than %d endpoints", METRICS_MAX_SOURCES);
            return -1;
        }
        m->src[m->n_src++] = (struct metrics_source){.endpoint = l->items[i], .kind = kind};
    }
    return 0;
}

int main(int argc, char **argv)
{
    static struct metrics m;
    struct lora_cli_opt_list engines = {0}, frontends = {0};
    const char *run_dir = NULL, *listen = "127.0.0.1:9100", *lora_info = "resident";
    const char *model_name = NULL, *served_name = NULL;
    long timeout_ms = DEFAULT_ENGINE_TIMEOUT_MS;
    bool help = false, version = false, use_stdin = false;
    const struct lora_cli_opt options[] = {
        {"engine", LORA_OPT_LIST, &engines, "EP",
         "subscribe to an engine's publish socket (repeatable)"},
        {"frontend", LORA_OPT_LIST, &frontends, "EP",
         "subscribe to a frontend's publish socket (repeatable)"},
        {"run-dir", LORA_OPT_STRING, &run_dir, "DIR",
         "the same as --engine ipc://DIR/publish.sock"},
        {"stdin", LORA_OPT_FLAG, &use_stdin, NULL,
         "read concatenated msgpack bodies from standard input instead"},
        {"listen", LORA_OPT_STRING, &listen, "ADDR",
         "serve HTTP on HOST:PORT (default 127.0.0.1:9100; port 0: any free port)"},
        {"engine-timeout-ms", LORA_OPT_INT, &timeout_ms, "MS",
         "an engine silent this long is lost (default 5000; 0: never)", 0, 1e9},
        {"lora-info", LORA_OPT_STRING, &lora_info, "MODE",
         "vllm:lora_requests_info: resident (default) or inflight"},
        {"model-name", LORA_OPT_STRING, &model_name, "NAME",
         "the model_name label (default the engine's model)"},
        {"served-model-name", LORA_OPT_STRING, &served_name, "NAME",
         "the same as --model-name, under the frontend's name for it"},
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {"version", LORA_OPT_FLAG, &version, NULL, "show the version"},
        {0},
    };
    char err[4400] = "", host[64];
    int port = 0;

    if (lora_cli_parse(options, "LORA_METRICS", argc, argv, 1, err, sizeof(err)) < 0)
        goto usage;
    if (help) {
        puts("usage: lora-metrics (--engine EP... [--frontend EP...] | --run-dir DIR | --stdin)"
             " [OPTIONS]\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    if (version) {
        puts("lora-metrics " LORA_VERSION);
        return 0;
    }
    if (strcmp(lora_info, "resident") != 0 && strcmp(lora_info, "inflight") != 0) {
        snprintf(err, sizeof(err), "%s must be resident or inflight, not '%s'",
                 origin(lora_info, "--lora-info", "LORA_METRICS_LORA_INFO"), lora_info);
        goto usage;
    }
    if (model_name && !*model_name) {
        snprintf(err, sizeof(err), "%s is empty",
                 origin(model_name, "--model-name", "LORA_METRICS_MODEL_NAME"));
        goto usage;
    }
    if (served_name && !*served_name) {
        snprintf(err, sizeof(err), "%s is empty",
                 origin(served_name, "--served-model-name", "LORA_METRICS_SERVED_MODEL_NAME"));
        goto usage;
    }
    if (model_name && served_name && strcmp(model_name, served_name) != 0) {
        snprintf(err, sizeof(err), "--model-name '%s' and --served-model-name '%s' differ",
                 model_name, served_name);
        goto usage;
    }
    if (!model_name)
        model_name = served_name;
    if (parse_listen(listen, host, sizeof(host), &port, err, sizeof(err)) < 0)
        goto usage;
    if (use_stdin && (engines.n || frontends.n || run_dir)) {
        snprintf(err, sizeof(err),
                 "--stdin cannot be combined with --engine, --frontend or --run-dir");
        goto usage;
    }
    if (run_dir && lora_run_dir_check(run_dir, err, sizeof(err)) < 0)
        goto usage;
    struct lora_cli_opt_list from_run_dir = {.items = {m.run_dir_ep}, .n = run_dir ? 1 : 0};
    if (run_dir)
        snprintf(m.run_dir_ep, sizeof(m.run_dir_ep), "ipc://%s/publish.sock", run_dir);
    if (add_sources(&m, &from_run_dir, LORA_SOURCE_ENGINE, err, sizeof(err)) < 0 ||
        add_sources(&m, &engines, LORA_SOURCE_ENGINE, err, sizeof(err)) < 0 ||
        add_sources(&m, &frontends, LORA_SOURCE_FRONTEND, err, sizeof(err)) < 0)
        goto usage;
    if (!use_stdin && !m.n_src) {
        snprintf(err, sizeof(err), "give --engine EP, --frontend EP, --run-dir DIR or --stdin");
        goto usage;
    }

    struct lora_metrics_state_options so = {
        .inflight = strcmp(lora_info, "inflight") == 0,
        .model_name = model_name,
        .engine_timeout_ms = (uint64_t)timeout_ms,
    };
    struct lora_http_options ho = {
        .host = host,
        .port = port,
        .max_body_bytes = 4096,
        .max_connections = 256,
        .timeout_s = 30,
        .log_prefix = "lora-metrics",
    };
    const int sigs[] = {SIGTERM, SIGINT};
    struct lora_http_server *http = NULL;
    int rc = EXIT_SYSTEM;

    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&m.mu, NULL);
    m.use_stdin = use_stdin;
    m.sig_fd = lora_signal_pipe_open(sigs, 2);
    m.state = lora_metrics_state_new(&so);
    m.zctx = zmq_ctx_new();
    if (m.sig_fd < 0 || !m.state || !m.zctx) {
        fprintf(stderr, "lora-metrics: fatal: unable to start: %s\n", strerror(errno));
        goto out;
    }
    if (sources_open(&m, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-metrics: fatal: %s\n", err);
        goto out;
    }
    http = lora_http_start(&ho, serve_handle, &m, err, sizeof(err));
    if (!http) {
        fprintf(stderr, "lora-metrics: fatal: %s\n", err);
        goto out;
    }
    snprintf(m.ready_line, sizeof(m.ready_line), "lora-metrics: ready: http://%s%s%s:%d",
             strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
             lora_http_port(http));
    m.ready_wait_ms = (uint64_t)(timeout_ms ? timeout_ms : DEFAULT_ENGINE_TIMEOUT_MS);
    rc = sources_run(&m) < 0 ? EXIT_SYSTEM : 0;
out:
    lora_http_stop(&http);
    sources_close(&m);
    if (m.zctx)
        zmq_ctx_term(m.zctx);
    lora_metrics_state_destroy(&m.state);
    if (m.sig_fd >= 0)
        lora_signal_pipe_close(m.sig_fd);
    return rc;
usage:
    fprintf(stderr, "lora-metrics: fatal: %s\n", err);
    return EXIT_USAGE;
}
