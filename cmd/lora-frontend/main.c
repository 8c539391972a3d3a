/* lora-frontend: the OpenAI-compatible HTTP API of lora-stack (docs/design.md, "Programs", "HTTP
 * API"; docs/security.md).
 *
 * Connects to one engine (its frontend and control sockets), learns the model, the limits and
 * the adapter registry from it, loads the model's tokenizer and chat template, loads the
 * --lora-modules adapters the engine does not hold yet, then serves HTTP. A thread of its own
 * runs the engine link (link.c); HTTP connections run on their own threads. Readiness is one
 * line on stderr, "lora-frontend: ready: http://HOST:PORT", printed once /metrics has the
 * engine's whole state (or after FE_METRICS_ENGINE_TIMEOUT_MS without it, with a note). Exit
 * codes: 0 on SIGTERM/SIGINT, 1 bad model files or --lora-modules, 100 usage, 111 system
 * failure (no engine, port taken).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/cli.h"
#include "frontend.h"
#include "params.h"
#include "base/run_dir.h"
#include "wire/sock.h"

struct setup_args {
    struct frontend *fe;
    int sig_fd;
    int rc;
};

static void *link_thread(void *p)
{
    struct setup_args *a = p;
    a->rc = link_run(&a->fe->link, a->sig_fd);
    return NULL;
}

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
            v = 0;
        close(fd);
    }
    return v ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(lora_clock_unix() * 1e6);
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The most bytes of prompt text worth tokenizing: max_model_len tokens of FE_PROMPT_TEXT_FACTOR
 * times the longest vocabulary string each. No token stands for more text than its vocabulary
 * string spells (byte-level and Metaspace spellings are longer than the bytes they stand for,
 * byte-fallback tokens six times longer), and the factor covers normalizers that compose
 * characters (NFC and NFKC shrink text by at most 3 to 1), so a longer text cannot fit the
 * context and is refused before the tokenizer spends memory and time on it. Only text that a
 * normalizer deletes (Strip, Replace with nothing), that an added token's lstrip/rstrip
 * swallows, or a run of unknown characters fused into one unknown token (fuse_unk) escapes the
 * argument: such a prompt is refused though it might fit. */
static size_t prompt_max_bytes(const struct frontend *fe)
{
    size_t longest = 1, n = fe->tok ? lora_tokenizer_vocab_size(fe->tok) : 0;

    for (size_t id = 0; id < n; id++) {
        const char *s = lora_tokenizer_token_str(fe->tok, (int32_t)id);
        size_t len = s ? strlen(s) : 0;
        if (len > longest)
            longest = len;
    }
    return (size_t)fe_link_limits(&fe->link).max_model_len * longest * FE_PROMPT_TEXT_FACTOR;
}

/* The tokenizer and chat template of the model directory. A model without tokenizer.json
 * serves token-id prompts; one without a usable chat template serves completions only. */
static int load_model_files(struct frontend *fe, const char *chat_name, char *err, size_t len)
{
    char path[PATH_MAX];

    snprintf(path, sizeof(path), "%s/tokenizer.json", fe->model_dir);
    if (file_exists(path)) {
        fe->tok = lora_tokenizer_load(path, err, len);
        if (!fe->tok)
            return -1;
    } else {
        fprintf(stderr,
                "lora-frontend: note: '%s' has no tokenizer.json: prompts must be "
                "token ids\n",
                fe->model_dir);
    }
    char why[1024];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", fe->model_dir);
    if (chat_name)
        fe->has_chat = lora_chat_template_by_name(chat_name, &fe->chat, why, sizeof(why)) == 0;
    else
        fe->has_chat = lora_chat_template_from_config(path, &fe->chat, why, sizeof(why)) == 0;
    if (chat_name && !fe->has_chat) {
        snprintf(err, len, "--chat-template: %s", why);
        return -1;
    }
    if (!fe->has_chat) {
        snprintf(fe->chat_error, sizeof(fe->chat_error), "%s", why);
        fprintf(stderr, "lora-frontend: note: chat completions are off: %s\n", why);
    }
    fe->eos_id = -1;
    if (fe->tok && fe->has_chat && fe->chat.eos_token[0])
        fe->eos_id = lora_tokenizer_token_id(fe->tok, fe->chat.eos_token);
    fe->prompt_max_bytes = prompt_max_bytes(fe);
    return 0;
}

/* Until /metrics shows the engine's whole state, so that the first scrape after the ready line
 * is already true (an engine publishes it all at least once an interval), at most
 * FE_METRICS_ENGINE_TIMEOUT_MS. */
static void wait_metrics(struct frontend *fe, const char *ep)
{
    uint64_t deadline = lora_clock_mono_ms() + FE_METRICS_ENGINE_TIMEOUT_MS;
    int index;

    pthread_mutex_lock(&fe->link.mu);
    index = fe->link.engine_index;
    pthread_mutex_unlock(&fe->link.mu);
    while (!metrics_engine_ready(&fe->metrics, index)) {
        if (lora_clock_mono_ms() >= deadline) {
            fprintf(stderr,
                    "lora-frontend: note: nothing complete from '%s' yet: /metrics "
                    "shows the engine's gauges once it is\n",
                    ep);
            return;
        }
        usleep(10000);
    }
}

int main(int argc, char **argv)
{
    static struct frontend fe;
    const char *run_dir = NULL, *engine_ep = NULL, *control_ep = NULL, *publish_ep = NULL;
    const char *engine_pub_ep = NULL, *lora_info = "resident";
    const char *host = "127.0.0.1", *chat_name = NULL, *lora_root = NULL, *gen_source = "auto";
    struct lora_cli_opt_list mods = {0};
    long port = 8000, max_body = 16L << 20, max_conn = 1024, timeout_s = 60, wait_ms = 60000;
    long max_pending = 4096, request_timeout_s = 30, per_ip = 256, body_memory = 32L << 20;
    bool help = false, version = false, runtime = false;
    const struct lora_cli_opt options[] = {
        {"run-dir", LORA_OPT_STRING, &run_dir, "DIR", "the engine's ipc sockets are in DIR"},
        {"engine-endpoint", LORA_OPT_STRING, &engine_ep, "EP",
         "the engine's frontend socket (default ipc://DIR/frontend.sock)"},
        {"control-endpoint", LORA_OPT_STRING, &control_ep, "EP",
         "the engine's control socket (default ipc://DIR/control.sock)"},
        {"publish-endpoint", LORA_OPT_STRING, &publish_ep, "EP",
         "publish per-request stats here (default ipc://DIR/frontend-PORT.sock with --run-dir)"},
        {"engine-publish-endpoint", LORA_OPT_STRING, &engine_pub_ep, "EP",
         "the engine's publish socket, for /metrics (default ipc://DIR/publish.sock)"},
        {"lora-info", LORA_OPT_STRING, &lora_info, "MODE",
         "vllm:lora_requests_info on /metrics: resident (default) or inflight"},
        {"host", LORA_OPT_STRING, &host, "ADDR", "HTTP address (default 127.0.0.1)"},
        {"port", LORA_OPT_INT, &port, "N", "HTTP port (default 8000; 0: any free port)", 0, 65535},
        {"model", LORA_OPT_STRING, &fe.model_dir, "DIR",
         "tokenizer and chat template from DIR (default the engine's model)"},
        {"served-model-name", LORA_OPT_STRING, &fe.served_name, "NAME",
         "the base model's name in the API and the model_name label of /metrics (default the "
         "model directory)"},
        {"api-key", LORA_OPT_STRING, &fe.api_key, "KEY",
         "require 'Authorization: Bearer KEY' on /v1 paths (default $VLLM_API_KEY)"},
        {"lora-modules", LORA_OPT_LIST, &mods, "NAME=PATH",
         "load at start-up unless the engine has it; also {\"name\",\"path\","
         "\"base_model_name\"} (repeatable)"},
        {"enable-runtime-lora", LORA_OPT_FLAG, &runtime, NULL,
         "allow /v1/load_lora_adapter and /v1/unload_lora_adapter"},
        {"lora-root", LORA_OPT_STRING, &lora_root, "DIR",
         "runtime loads only from directories under DIR"},
        {"lora-allow-symlinks", LORA_OPT_FLAG, &fe.lora_allow_symlinks, NULL,
         "accept symbolic links under --lora-root that stay under it (default refused)"},
        {"chat-template", LORA_OPT_STRING, &chat_name, "NAME",
         "chatml, qwen2.5, qwen3, llama3, llama3.1, llama2, mistral or mistral-v1, instead of "
         "the model's"},
        {"generation-config", LORA_OPT_STRING, &gen_source, "SRC",
         "defaults for fields a request leaves out: auto (the model's generation_config.json), "
         "vllm (none) or a directory holding generation_config.json (default auto)"},
        {"max-body-bytes", LORA_OPT_INT, &max_body, "N", "larger bodies get 413 (16 MiB)", 1024,
         1L << 30},
        {"max-connections", LORA_OPT_INT, &max_conn, "N", "concurrent connections (1024)", 1,
         65536},
        {"http-timeout", LORA_OPT_INT, &timeout_s, "S", "close idle connections (60 s)", 1, 86400},
        {"request-timeout", LORA_OPT_INT, &request_timeout_s, "S",
         "close a connection that sends no whole request (headers and body) within S seconds "
         "(30; 0: no deadline)",
         0, 86400},
        {"max-connections-per-ip", LORA_OPT_INT, &per_ip, "N",
         "concurrent connections from one client address (256; 0: no limit)", 0, 65536},
        {"max-body-memory", LORA_OPT_INT, &body_memory, "N",
         "bytes of request bodies held at once, all connections together, before 503 (32 MiB; "
         "0: no limit)",
         0, 1L << 40},
        {"max-pending", LORA_OPT_INT, &max_pending, "N",
         "engine requests in flight before 503 (4096)", 1, 1 << 20},
        {"engine-timeout-ms", LORA_OPT_INT, &wait_ms, "MS",
         "wait this long for the engine at start-up (60000)", 100, 1e8},
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {"version", LORA_OPT_FLAG, &version, NULL, "show the version"},
        {0},
    };
    char err[2048] = "", engine_model[4096];

    int parsed = lora_cli_parse(options, "LORA_FRONTEND", argc, argv, 1, err, sizeof(err));
    if (parsed == 0 && body_memory > 0 && body_memory < max_body) {
        snprintf(err, sizeof(err),
                 "--max-body-memory %ld is below --max-body-bytes %ld: no "
                 "body of the largest size could be taken",
                 body_memory, max_body);
        parsed = -1;
    }
    if (parsed < 0 || (!help && !version && !run_dir && (!engine_ep || !control_ep))) {
        fprintf(stderr, "lora-frontend: fatal: %s\n",
                *err ? err : "give --run-dir DIR, or --engine-endpoint and --control-endpoint");
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-frontend (--run-dir DIR | --engine-endpoint EP --control-endpoint EP)"
             " [OPTIONS]\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    if (version) {
        puts("lora-frontend " LORA_VERSION);
        return 0;
    }
    if (!lora_generation_config_is_source(gen_source)) {
        fprintf(stderr,
                "lora-frontend: fatal: --generation-config '%s' must be auto, vllm or a "
                "directory\n",
                gen_source);
        return EXIT_USAGE;
    }
    if (strcmp(lora_info, "resident") != 0 && strcmp(lora_info, "inflight") != 0) {
        fprintf(stderr, "lora-frontend: fatal: %s must be resident or inflight, not '%s'\n",
                lora_info == getenv("LORA_FRONTEND_LORA_INFO") ? "LORA_FRONTEND_LORA_INFO"
                                                               : "--lora-info",
                lora_info);
        return EXIT_USAGE;
    }
    if (engine_pub_ep && !*engine_pub_ep) {
        fprintf(stderr, "lora-frontend: fatal: --engine-publish-endpoint is empty\n");
        return EXIT_USAGE;
    }
    /* As vLLM: the option, else VLLM_API_KEY; an empty key is no key. */
    if (!fe.api_key || !*fe.api_key)
        fe.api_key = getenv("VLLM_API_KEY");
    if (fe.api_key && !*fe.api_key)
        fe.api_key = NULL;
    const char *allow = getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
    if (allow && (strcasecmp(allow, "true") == 0 || strcmp(allow, "1") == 0))
        runtime = true;
    char *root_real = NULL;
    if (lora_root) {
        root_real = realpath(lora_root, NULL);
        struct stat st;
        if (!root_real || stat(root_real, &st) < 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "lora-frontend: fatal: --lora-root '%s' is not a directory\n",
                    lora_root);
            return EXIT_USAGE;
        }
    }
    if (run_dir && lora_run_dir_check(run_dir, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-frontend: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    char ep_front[PATH_MAX + 32], ep_ctl[PATH_MAX + 32], ep_pub[PATH_MAX + 32];
    char ep_engine_pub[PATH_MAX + 32];
    if (!engine_ep) {
        snprintf(ep_front, sizeof(ep_front), "ipc://%s/frontend.sock", run_dir);
        engine_ep = ep_front;
    }
    if (!control_ep) {
        snprintf(ep_ctl, sizeof(ep_ctl), "ipc://%s/control.sock", run_dir);
        control_ep = ep_ctl;
    }
    if (!engine_pub_ep && run_dir) {
        snprintf(ep_engine_pub, sizeof(ep_engine_pub), "ipc://%s/publish.sock", run_dir);
        engine_pub_ep = ep_engine_pub;
    }
    if (!publish_ep && run_dir && port != 0) {
        snprintf(ep_pub, sizeof(ep_pub), "ipc://%s/frontend-%ld.sock", run_dir, port);
        publish_ep = ep_pub;
    }
    fe.lora_root = root_real;
    fe.runtime_lora = runtime;
    fe.max_pending = (int)max_pending;
    fe.version = LORA_VERSION;
    fe.id_prefix = random_u64();
    fe.start_time = lora_clock_unix();
    signal(SIGPIPE, SIG_IGN);
    int sigs[2] = {SIGINT, SIGTERM};
    int sig_fd = lora_signal_pipe_open(sigs, 2);
    void *zctx = zmq_ctx_new();
    if (sig_fd < 0 || !zctx) {
        fprintf(stderr, "lora-frontend: fatal: unable to start: %s\n", strerror(errno));
        return EXIT_SYSTEM;
    }
    int rc = EXIT_SYSTEM;
    struct lora_http_server *http = NULL;
    struct setup_args la = {&fe, sig_fd, 0};
    pthread_t th;
    if (metrics_init(&fe.metrics, strcmp(lora_info, "inflight") == 0, err, sizeof(err)) < 0 ||
        link_init(&fe.link, zctx, engine_ep, control_ep, publish_ep, engine_pub_ep, &fe.metrics,
                  err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-frontend: fatal: %s\n", err);
        goto out;
    }
    if (pthread_create(&th, NULL, link_thread, &la) != 0) {
        fprintf(stderr, "lora-frontend: fatal: unable to start the engine link\n");
        goto out;
    }
    if (!link_wait_ready(&fe.link, (int)wait_ms)) {
        fprintf(stderr, "lora-frontend: fatal: the engine at '%s' did not answer within %ld ms\n",
                engine_ep, wait_ms);
        goto stop;
    }
    if (!fe.model_dir) {
        fe_link_model(&fe.link, engine_model, sizeof(engine_model));
        fe.model_dir = engine_model;
    }
    if (!fe.served_name)
        fe.served_name = fe.model_dir;
    if (lora_generation_config_load(gen_source, fe.model_dir, &fe.gen, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-frontend: fatal: --generation-config: %s\n", err);
        rc = 1;
        goto stop;
    }
    params_note_defaults(&fe);
    metrics_set_model_name(&fe.metrics, fe.served_name); /* vLLM's model_name is this name */
    if (load_model_files(&fe, chat_name, err, sizeof(err)) < 0 ||
        adapters_load_modules(&fe, &mods, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-frontend: fatal: %s\n", err);
        rc = 1;
        goto stop;
    }
    struct lora_http_options ho = {
        .host = host,
        .port = (int)port,
        .max_body_bytes = (size_t)max_body,
        .max_connections = (unsigned)max_conn,
        .timeout_s = (unsigned)timeout_s,
        .request_timeout_s = (unsigned)request_timeout_s,
        .max_connections_per_ip = (unsigned)per_ip,
        .max_body_memory = (size_t)body_memory,
        .log_prefix = "lora-frontend",
    };
    http = lora_http_start(&ho, routes_handle, &fe, err, sizeof(err));
    if (!http) {
        fprintf(stderr, "lora-frontend: fatal: %s\n", err);
        goto stop;
    }
    if (engine_pub_ep)
        wait_metrics(&fe, engine_pub_ep);
    fprintf(stderr, "lora-frontend: ready: http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "", host,
            strchr(host, ':') ? "]" : "", lora_http_port(http));
    pthread_join(th, NULL);
    rc = la.rc < 0 ? EXIT_SYSTEM : 0;
    lora_http_stop(&http);
    goto out;
stop:
    kill(getpid(), SIGTERM); /* ends the link thread through the signal pipe */
    pthread_join(th, NULL);
out:
    lora_http_stop(&http);
    link_release(&fe.link);
    metrics_release(&fe.metrics);
    lora_tokenizer_destroy(&fe.tok);
    zmq_ctx_term(zctx);
    lora_signal_pipe_close(sig_fd);
    free(root_real);
    return rc;
}
