/* lora-bench: the subcommands' options, wiring and exit codes (lib/base/exit_codes.h):
 * 0 done; 1 requests failed (serve), cells with failed requests (campaign) or an unreadable
 * campaign directory (report); 100 usage or a malformed configuration; 111 the server could
 * not be reached, or a file could not be written. */
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli.h"
#include "base/exit_codes.h"
#include "bench.h"

#define SERVE_USAGE                                                                                \
    "usage: lora-bench serve [--base-url URL] [--model NAME] [--dataset-name random] [OPTIONS]"

/* Options whose values may follow one flag, as vLLM's nargs="+" (--lora-modules a b c):
 * rewritten into one flag per value for lib/base/cli. Returns the new argv (the caller's to
 * free; its strings are borrowed) and its count in *n. */
static char **expand_lists(int argc, char **argv, int first, int *n)
{
    static char flag[] = "--lora-modules";
    char **out = calloc((size_t)argc * 2 + 1, sizeof(char *));
    int k = 0;

    if (!out)
        return NULL;
    for (int i = 0; i < first; i++)
        out[k++] = argv[i];
    for (int i = first; i < argc; i++) {
        out[k++] = argv[i];
        if (strcmp(argv[i], "--lora-modules") != 0)
            continue;
        if (i + 1 < argc)
            out[k++] = argv[++i];
        while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            out[k++] = flag;
            out[k++] = argv[++i];
        }
    }
    *n = k;
    return out;
}

static int parse_rate(const char *s, double *rate, char *err, size_t err_len)
{
    char *end;
    if (strcasecmp(s, "inf") == 0 || strcasecmp(s, "infinity") == 0) {
        *rate = INFINITY;
        return 0;
    }
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || !isfinite(v)) {
        snprintf(err, err_len, "--request-rate must be a positive number or inf, not '%s'", s);
        return -1;
    }
    *rate = v;
    return 0;
}

static int parse_metrics(const char *s, bool metrics[4], char *err, size_t err_len)
{
    static const char *const names[4] = {"ttft", "tpot", "itl", "e2el"};
    char copy[256], *save;

    snprintf(copy, sizeof(copy), "%s", s);
    memset(metrics, 0, 4 * sizeof(bool));
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int m = 0;
        while (m < 4 && strcmp(t, names[m]) != 0)
            m++;
        if (m == 4) {
            snprintf(err, err_len, "--percentile-metrics: '%s' is not one of ttft, tpot, itl, e2el",
                     t);
            return -1;
        }
        metrics[m] = true;
    }
    return 0;
}

static int parse_percentiles(const char *s, double *p, int *n, char *err, size_t err_len)
{
    char copy[512], *save;

    snprintf(copy, sizeof(copy), "%s", s);
    *n = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(t, &end);
        if (end == t || *end || !(v >= 0 && v <= 100) || *n == SERVE_MAX_PERCENTILES) {
            snprintf(err, err_len,
                     "--metric-percentiles: '%s' is not a percentile from 0 to 100 (at most %d)", t,
                     SERVE_MAX_PERCENTILES);
            return -1;
        }
        p[(*n)++] = v;
    }
    if (!*n) {
        snprintf(err, err_len, "--metric-percentiles is empty");
        return -1;
    }
    return 0;
}

/* vLLM's default name: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json, MODEL its last part. */
static void default_result_name(const json_t *r, const char *label, char *out, size_t len)
{
    const char *model = json_string_value(json_object_get(r, "model_id"));
    const char *base = model && strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    json_t *rate = json_object_get(r, "request_rate"),
           *conc = json_object_get(r, "max_concurrency");
    char rs[64], cs[64];

    if (json_is_string(rate))
        snprintf(rs, sizeof(rs), "inf");
    else
        snprintf(rs, sizeof(rs), "%.1f", json_real_value(rate));
    cs[0] = 0;
    if (json_is_integer(conc))
        snprintf(cs, sizeof(cs), "-concurrency%lld", (long long)json_integer_value(conc));
    snprintf(out, len, "%s-%sqps%s-%s-%s.json", label ? label : "openai", rs, cs,
             base && *base ? base : "model", json_string_value(json_object_get(r, "date")));
}

static void serve_usage(FILE *f, const struct lora_cli_opt *opts)
{
    fprintf(f, "%s\n\n", SERVE_USAGE);
    lora_cli_usage(f, opts);
}

/* The option table of serve, with its destinations. */
struct serve_args {
    const char *base_url, *host, *endpoint, *model, *dataset, *rate, *result_dir, *result_file;
    const char *label, *pmetrics, *ppercentiles;
    long port, num_prompts, in_len, out_len, prefix_len, vocab, max_conc, seed;
    double range, burst, timeout;
    bool ignore_eos, save, disable_tqdm, help, version;
    struct lora_cli_opt_list lora;
};

static void serve_table(struct serve_args *a, struct lora_cli_opt *t)
{
    const struct lora_cli_opt opts[] = {
        {"base-url", LORA_OPT_STRING, &a->base_url, "URL", "the server (default http://HOST:PORT)"},
        {"host", LORA_OPT_STRING, &a->host, "HOST", "the server's host (default 127.0.0.1)"},
        {"port", LORA_OPT_INT, &a->port, "N", "the server's port (default 8000)", 1, 65535},
        {"endpoint", LORA_OPT_STRING, &a->endpoint, "PATH",
         "the API path (default and only /v1/completions)"},
        {"model", LORA_OPT_STRING, &a->model, "NAME",
         "the model of requests without an adapter (default the first of /v1/models)"},
        {"dataset-name", LORA_OPT_STRING, &a->dataset, "NAME",
         "the dataset: random (the only one)"},
        {"num-prompts", LORA_OPT_INT, &a->num_prompts, "N", "requests to send (default 1000)", 1,
         10000000},
        {"random-input-len", LORA_OPT_INT, &a->in_len, "N", "prompt tokens (default 1024)", 0,
         10000000},
        {"random-output-len", LORA_OPT_INT, &a->out_len, "N",
         "max_tokens of each request (default 128)", 1, 10000000},
        {"random-range-ratio", LORA_OPT_FLOAT, &a->range, "R",
         "lengths drawn from [L(1-R), L(1+R)] (default 0)", 0, 0.999999},
        {"random-prefix-len", LORA_OPT_INT, &a->prefix_len, "N",
         "a random prefix shared by every prompt (default 0)", 0, 10000000},
        {"random-vocab-size", LORA_OPT_INT, &a->vocab, "N",
         "prompt ids are drawn from 0 to N-1 (default 256)", 1, 100000000},
        {"request-rate", LORA_OPT_STRING, &a->rate, "RATE",
         "requests per second, Poisson arrivals, or inf (default inf: all at once)"},
        {"burstiness", LORA_OPT_FLOAT, &a->burst, "B",
         "gamma shape of the intervals (default 1: Poisson)", 1e-6, 1e9},
        {"max-concurrency", LORA_OPT_INT, &a->max_conc, "N",
         "requests in flight at most (default no limit)", 1, 1000000},
        {"ignore-eos", LORA_OPT_FLAG, &a->ignore_eos, NULL, "send ignore_eos: true"},
        {"lora-modules", LORA_OPT_LIST, &a->lora, "NAME...",
         "models of the requests, round-robin over the list as given (repeats count)"},
        {"seed", LORA_OPT_INT, &a->seed, "N", "the dataset's and the arrivals' seed (default 0)", 0,
         9e18},
        {"request-timeout", LORA_OPT_FLOAT, &a->timeout, "S",
         "give up on a request after S seconds (default 21600; 0: never)", 0, 1e9},
        {"percentile-metrics", LORA_OPT_STRING, &a->pmetrics, "LIST",
         "metrics to print with percentiles (default ttft,tpot,itl,e2el)"},
        {"metric-percentiles", LORA_OPT_STRING, &a->ppercentiles, "LIST",
         "percentiles of them (default 99)"},
        {"save-result", LORA_OPT_FLAG, &a->save, NULL, "write the result as JSON"},
        {"result-dir", LORA_OPT_STRING, &a->result_dir, "DIR",
         "where the result goes (default the current directory)"},
        {"result-filename", LORA_OPT_STRING, &a->result_file, "FILE",
         "its name (default LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json)"},
        {"label", LORA_OPT_STRING, &a->label, "LABEL", "the result name's prefix (default openai)"},
        {"disable-tqdm", LORA_OPT_FLAG, &a->disable_tqdm, NULL, "no progress line on a terminal"},
        {"help", LORA_OPT_FLAG, &a->help, NULL, "show this help"},
        {"version", LORA_OPT_FLAG, &a->version, NULL, "show the version"},
        {0},
    };
    memcpy(t, opts, sizeof(opts));
}

#define SERVE_N_OPTS 29

static int cmd_serve(int argc, char **argv)
{
    struct serve_args a = {
        .host = "127.0.0.1",
        .endpoint = "/v1/completions",
        .dataset = "random",
        .rate = "inf",
        .pmetrics = "ttft,tpot,itl,e2el",
        .ppercentiles = "99",
        .port = 8000,
        .num_prompts = 1000,
        .in_len = 1024,
        .out_len = 128,
        .vocab = 256,
        .burst = 1.0,
        .timeout = 21600,
    };
    struct lora_cli_opt opts[SERVE_N_OPTS];
    struct serve_options so = {0};
    char err[2048], base[1024], path[4096];
    int n_args = 0, rc = EXIT_SYSTEM;
    char **args = expand_lists(argc, argv, 1, &n_args);

    serve_table(&a, opts);
    if (!args) {
        fprintf(stderr, "lora-bench: fatal: out of memory\n");
        return EXIT_SYSTEM;
    }
    if (lora_cli_parse(opts, "LORA_BENCH", n_args, args, 1, err, sizeof(err)) < 0)
        goto usage;
    if (a.help) {
        serve_usage(stdout, opts);
        free(args);
        return 0;
    }
    if (a.version) {
        puts("lora-bench " LORA_VERSION);
        free(args);
        return 0;
    }
    if (strcmp(a.dataset, "random") != 0) {
        snprintf(err, sizeof(err),
                 "--dataset-name %s: only the random dataset is supported (the others need "
                 "dataset files and a tokenizer, which lora-bench does not read)",
                 a.dataset);
        goto usage;
    }
    if (strcmp(a.endpoint, "/v1/completions") != 0) {
        snprintf(err, sizeof(err), "--endpoint %s: only /v1/completions is supported", a.endpoint);
        goto usage;
    }
    if (parse_rate(a.rate, &so.client.request_rate, err, sizeof(err)) < 0 ||
        parse_metrics(a.pmetrics, so.metrics, err, sizeof(err)) < 0 ||
        parse_percentiles(a.ppercentiles, so.percentiles, &so.n_percentiles, err, sizeof(err)) < 0)
        goto usage;
    for (int i = 0; i < a.lora.n; i++)
        if (!*a.lora.items[i]) {
            snprintf(err, sizeof(err), "--lora-modules: an empty name");
            goto usage;
        }
    if (a.base_url) {
        size_t l = strlen(a.base_url);
        while (l && a.base_url[l - 1] == '/')
            l--;
        snprintf(base, sizeof(base), "%.*s", (int)l, a.base_url);
    } else {
        snprintf(base, sizeof(base), "http://%s:%ld", a.host, a.port);
    }
    if (strncmp(base, "http://", 7) != 0 && strncmp(base, "https://", 8) != 0) {
        snprintf(err, sizeof(err), "--base-url '%s' must start with http:// or https://", base);
        goto usage;
    }
    snprintf(path, sizeof(path), "%s%s", base, a.endpoint);
    so.base_url = base;
    so.model = a.model;
    so.lora_modules = a.lora.items;
    so.n_lora_modules = a.lora.n;
    so.data = (struct dataset_options){
        .num_prompts = a.num_prompts,
        .input_len = a.in_len,
        .output_len = a.out_len,
        .prefix_len = a.prefix_len,
        .vocab_size = a.vocab,
        .range_ratio = a.range,
        .seed = (uint64_t)a.seed,
    };
    so.client.api_url = path;
    so.client.api_key = getenv("OPENAI_API_KEY");
    so.client.burstiness = a.burst;
    so.client.max_concurrency = a.max_conc;
    so.client.ignore_eos = a.ignore_eos;
    so.client.timeout_s = a.timeout;
    so.client.seed = (uint64_t)a.seed;
    so.no_progress = a.disable_tqdm;

    json_t *r = serve_run(&so, err, sizeof(err));
    if (!r) {
        fprintf(stderr, "lora-bench: fatal: %s\n", err);
        free(args);
        return strncmp(err, "unable to reach", 15) == 0 ? EXIT_SYSTEM : EXIT_BAD_INPUT;
    }
    if (a.label)
        json_object_set_new(r, "label", json_string(a.label));
    int sev = serve_result_severity(r);
    rc = sev == 0 ? 0 : sev == 1 ? EXIT_NO : EXIT_SYSTEM;
    if (sev == 2)
        fprintf(stderr, "lora-bench: no request reached %s\n", base);
    if (a.save || a.result_file) {
        char name[1024];
        if (a.result_file)
            snprintf(name, sizeof(name), "%s", a.result_file);
        else
            default_result_name(r, a.label, name, sizeof(name));
        if (a.result_dir && name[0] != '/')
            snprintf(path, sizeof(path), "%s/%s", a.result_dir, name);
        else
            snprintf(path, sizeof(path), "%s", name);
        if (files_write_json(path, r, err, sizeof(err)) < 0) {
            fprintf(stderr, "lora-bench: fatal: %s\n", err);
            rc = EXIT_SYSTEM;
        } else {
            printf("Result saved to %s\n", path);
        }
    }
    json_decref(r);
    free(args);
    return rc;
usage:
    fprintf(stderr, "lora-bench: fatal: %s\n", err);
    free(args);
    return EXIT_USAGE;
}

static void top_usage(FILE *f)
{
    fputs("usage: lora-bench serve [OPTIONS]           a load run, as vllm bench serve\n"
          "       lora-bench campaign CONFIG [OPTIONS]  the cost study's protocol\n"
          "       lora-bench report DIR [OPTIONS]       tables and plots of a campaign\n"
          "       lora-bench --help | --version\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        top_usage(stderr);
        fprintf(stderr, "lora-bench: fatal: give a subcommand: serve, campaign or report\n");
        return EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "--version") == 0) {
        puts("lora-bench " LORA_VERSION);
        return 0;
    }
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0) {
        struct serve_args a = {0};
        struct lora_cli_opt opts[SERVE_N_OPTS];
        serve_table(&a, opts);
        top_usage(stdout);
        printf("\n");
        serve_usage(stdout, opts);
        printf("\n");
        campaign_usage(stdout);
        printf("\n");
        report_usage(stdout);
        return 0;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "lora-bench: fatal: unable to initialise libcurl\n");
        return EXIT_SYSTEM;
    }
    int rc;
    if (strcmp(sub, "serve") == 0) {
        rc = cmd_serve(argc - 1, argv + 1);
    } else if (strcmp(sub, "campaign") == 0) {
        rc = campaign_main(argc - 1, argv + 1);
    } else if (strcmp(sub, "report") == 0) {
        rc = report_main(argc - 1, argv + 1);
    } else {
        top_usage(stderr);
        fprintf(stderr, "lora-bench: fatal: unknown subcommand '%s'\n", sub);
        rc = EXIT_USAGE;
    }
    curl_global_cleanup();
    return rc;
}
