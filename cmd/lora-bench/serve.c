/* lora-bench serve: one run with `vllm bench serve`'s semantics, its summary and its result
 * file; see bench.h and lora-bench(1).
 *
 * The result object has vLLM's keys (duration, completed, failed, total_input_tokens,
 * total_output_tokens, the throughputs, mean_/median_/std_/pNN_ of ttft_ms, tpot_ms, itl_ms and
 * e2el_ms, and the per-request arrays input_lens, output_lens, ttfts, itls, latencies,
 * start_times, generated_texts, errors), with these differences: start_times and end_times are
 * Unix times; request_rate is the string "inf" when unlimited (JSON has no infinity); and ours
 * are added: models (each request's model), output_tokens_from, client_cpu_s and
 * client_cpu_ms_per_request (this process's own CPU time, getrusage).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/cli.h"
#include "base/clock.h"
#include "base/errbuf.h"
#include "base/exit_codes.h"
#include "bench.h"

static const char *const METRIC_NAMES[4] = {"ttft", "tpot", "itl", "e2el"};
static const char *const METRIC_LABELS[4] = {"TTFT", "TPOT", "ITL", "E2EL"};
static const char *const METRIC_HEADERS[4] = {"Time to First Token",
                                              "Time per Output Token (excl. 1st token)",
                                              "Inter-token Latency", "End-to-end Latency"};

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* The first model of BASE/v1/models, into model. 0, or -1 with err. */
static int first_model(const char *base, const char *key, char *model, size_t len, char *err,
                       size_t err_len)
{
    struct lora_buf body = {0};
    char url[2048], gerr[1024];
    json_error_t je;
    int rc = -1;

    snprintf(url, sizeof(url), "%s/v1/models", base);
    long status = client_get(url, key, 30, 16 << 20, &body, gerr, sizeof(gerr));
    if (status < 0) {
        lora_errf(err, err_len, "unable to reach the server: %s", gerr);
        goto out;
    }
    if (status != 200) {
        lora_errf(err, err_len, "%s answered HTTP %ld; give --model", url, status);
        goto out;
    }
    json_t *j = json_loadb(body.data ? body.data : "", body.len, 0, &je);
    const char *id =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (id) {
        snprintf(model, len, "%s", id);
        rc = 0;
    } else {
        lora_errf(err, err_len, "%s lists no model; give --model", url);
    }
    json_decref(j);
out:
    lora_buf_release(&body);
    return rc;
}

static void set_real(json_t *o, const char *key, double v)
{
    json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

static json_t *reals(const double *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, isfinite(v[i]) ? json_real(v[i]) : json_null());
    return a;
}

/* "99" for 99, "99.9" for 99.9: vLLM's p_word. */
static void percentile_word(double p, char *out, size_t len)
{
    if (p == floor(p))
        snprintf(out, len, "%.0f", p);
    else
        snprintf(out, len, "%g", p);
}

struct series {
    double *v; /* seconds */
    size_t n;
};

static void print_row(const char *label, double v, bool integer)
{
    char l[64];
    snprintf(l, sizeof(l), "%s", label);
    if (integer)
        printf("%-40s %-10.0f\n", l, v);
    else
        printf("%-40s %-10.2f\n", l, v);
}

static void print_rule(const char *title, char c)
{
    int n = 50, t = title ? (int)strlen(title) : 0, left = (n - t) / 2, right = n - t - left;
    for (int i = 0; i < left; i++)
        putchar(c);
    if (title)
        fputs(title, stdout);
    for (int i = 0; i < right; i++)
        putchar(c);
    putchar('\n');
}

static int cmp_event(const void *a, const void *b)
{
    const double *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Peak concurrency of the successful requests (a sweep over [start, end)) and the most chunks
 * received within one second of the run, as vLLM reports them. */
static void peaks(const struct bench_outcome *outs, long n, double *peak_tps, long *peak_conc)
{
    double t0 = INFINITY, t1 = -INFINITY;
    *peak_tps = 0;
    *peak_conc = 0;
    for (long i = 0; i < n; i++)
        if (outs[i].success) {
            if (outs[i].start_unix < t0)
                t0 = outs[i].start_unix;
            if (outs[i].start_unix + outs[i].latency > t1)
                t1 = outs[i].start_unix + outs[i].latency;
        }
    if (!isfinite(t0))
        return;
    long secs = (long)ceil(t1 - t0) + 1;
    double *tps = calloc((size_t)secs, sizeof(double));
    if (tps) {
        for (long i = 0; i < n; i++) {
            if (!outs[i].success)
                continue;
            double t = outs[i].start_unix + outs[i].ttft;
            for (int k = -1; k < outs[i].n_itl; k++) {
                if (k >= 0)
                    t += outs[i].itl[k];
                long b = (long)(t - t0);
                if (b >= 0 && b < secs)
                    tps[b] += 1;
            }
        }
        for (long b = 0; b < secs; b++)
            if (tps[b] > *peak_tps)
                *peak_tps = tps[b];
        free(tps);
    }
    /* The sweep over [start, end): an end before a start at the same time. */
    double(*ev)[2] = malloc((size_t)n * 2 * sizeof(*ev));
    long k = 0, now = 0;
    if (!ev)
        return;
    for (long i = 0; i < n; i++) {
        if (!outs[i].success)
            continue;
        ev[k][0] = outs[i].start_unix;
        ev[k++][1] = 1;
        ev[k][0] = outs[i].start_unix + outs[i].latency;
        ev[k++][1] = -1;
    }
    qsort(ev, (size_t)k, sizeof(*ev), cmp_event);
    for (long i = 0; i < k; i++) {
        now += (long)ev[i][1];
        if (now > *peak_conc)
            *peak_conc = now;
    }
    free(ev);
}

static const char *date_string(char *out, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(out, len, "%Y%m%d-%H%M%S", &tm);
    return out;
}

struct progress {
    bool on;
};

static void serve_progress(void *ctx, long done, long n)
{
    struct progress *p = ctx;
    if (p->on)
        fprintf(stderr, "\rlora-bench: %ld of %ld requests done", done, n);
}

json_t *serve_run(const struct serve_options *o, char *err, size_t err_len)
{
    char model[1024], api_url[2048], date[32];
    long n = o->data.num_prompts;
    struct bench_prompt *prompts = NULL;
    struct bench_outcome *outs = NULL;
    const char **models = NULL;
    json_t *r = NULL;
    bool usage_refused = false;

    if (o->model) {
        snprintf(model, sizeof(model), "%s", o->model);
    } else if (first_model(o->base_url, o->client.api_key, model, sizeof(model), err, err_len) <
               0) {
        return NULL;
    }
    if (dataset_random(&o->data, &prompts, err, err_len) < 0)
        return NULL;
    outs = calloc((size_t)n, sizeof(*outs));
    models = calloc((size_t)n, sizeof(*models));
    if (!outs || !models) {
        lora_errf(err, err_len, "out of memory for %ld requests", n);
        goto out;
    }
    for (long i = 0; i < n; i++)
        models[i] = o->n_lora_modules ? o->lora_modules[i % o->n_lora_modules] : model;
    snprintf(api_url, sizeof(api_url), "%s", o->client.api_url);

    if (!o->quiet) {
        if (isinf(o->client.request_rate))
            printf("Traffic request rate: inf\n");
        else
            printf("Traffic request rate: %g\n", o->client.request_rate);
        printf("Burstiness factor: %g (%s)\n", o->client.burstiness,
               o->client.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
        if (o->client.max_concurrency)
            printf("Maximum request concurrency: %ld\n", o->client.max_concurrency);
        else
            printf("Maximum request concurrency: None\n");
        fflush(stdout);
    }
    struct progress prog = {.on = !o->quiet && !o->no_progress && !o->client.on_done && isatty(2)};
    struct client_options co = o->client;
    if (!co.on_done) {
        co.on_done = serve_progress;
        co.on_done_ctx = &prog;
    }
    double cpu0 = cpu_seconds(), t0 = lora_clock_mono();
    if (client_run(&co, prompts, models, n, outs, &usage_refused, err, err_len) < 0)
        goto out;
    double duration = lora_clock_mono() - t0, cpu = cpu_seconds() - cpu0;
    if (prog.on)
        fputs("\r\033[K", stderr);

    /* The series of the successful requests, in seconds. */
    long completed = 0, total_in = 0, total_out = 0, n_itl = 0, n_usage = 0;
    for (long i = 0; i < n; i++)
        if (outs[i].success) {
            completed++;
            total_in += outs[i].prompt_len;
            total_out += outs[i].output_tokens;
            n_itl += outs[i].n_itl;
            n_usage += outs[i].tokens_from_usage;
        }
    struct series s[4];
    for (int m = 0; m < 4; m++) {
        s[m].v = malloc((size_t)(m == 2 ? n_itl : n) * sizeof(double) + 1);
        s[m].n = 0;
        if (!s[m].v) {
            lora_errf(err, err_len, "out of memory");
            goto out;
        }
    }
    for (long i = 0; i < n; i++) {
        const struct bench_outcome *q = &outs[i];
        if (!q->success)
            continue;
        s[0].v[s[0].n++] = q->ttft;
        if (q->output_tokens > 1)
            s[1].v[s[1].n++] = (q->latency - q->ttft) / (q->output_tokens - 1);
        for (int k = 0; k < q->n_itl; k++)
            s[2].v[s[2].n++] = q->itl[k];
        s[3].v[s[3].n++] = q->latency;
    }

    r = json_object();
    json_object_set_new(r, "version", json_integer(1));
    json_object_set_new(r, "date", json_string(date_string(date, sizeof(date))));
    json_object_set_new(r, "endpoint_type", json_string("openai"));
    json_object_set_new(r, "backend", json_string("openai"));
    json_object_set_new(r, "label", json_null());
    json_object_set_new(r, "base_url", json_string(o->base_url));
    json_object_set_new(r, "model_id", json_string(model));
    json_object_set_new(r, "tokenizer_id", json_null());
    json_object_set_new(r, "num_prompts", json_integer(n));
    if (isinf(o->client.request_rate))
        json_object_set_new(r, "request_rate", json_string("inf"));
    else
        json_object_set_new(r, "request_rate", json_real(o->client.request_rate));
    set_real(r, "burstiness", o->client.burstiness);
    json_object_set_new(r, "max_concurrency",
                        o->client.max_concurrency ? json_integer(o->client.max_concurrency)
                                                  : json_null());
    json_object_set_new(r, "dataset_name", json_string("random"));
    json_object_set_new(r, "random_input_len", json_integer(o->data.input_len));
    json_object_set_new(r, "random_output_len", json_integer(o->data.output_len));
    set_real(r, "random_range_ratio", o->data.range_ratio);
    json_object_set_new(r, "random_prefix_len", json_integer(o->data.prefix_len));
    json_object_set_new(r, "random_vocab_size", json_integer(o->data.vocab_size));
    json_object_set_new(r, "seed", json_integer((json_int_t)o->data.seed));
    json_object_set_new(r, "ignore_eos", json_boolean(o->client.ignore_eos));
    json_t *lm = json_array();
    for (int k = 0; k < o->n_lora_modules; k++)
        json_array_append_new(lm, json_string(o->lora_modules[k]));
    json_object_set_new(r, "lora_modules", lm);
    json_object_set_new(r, "lora_assignment", json_string("round-robin"));

    set_real(r, "duration", duration);
    json_object_set_new(r, "completed", json_integer(completed));
    json_object_set_new(r, "failed", json_integer(n - completed));
    json_object_set_new(r, "total_input_tokens", json_integer(total_in));
    json_object_set_new(r, "total_output_tokens", json_integer(total_out));
    set_real(r, "request_throughput", (double)completed / duration);
    json_object_set_new(r, "request_goodput", json_null());
    set_real(r, "output_throughput", (double)total_out / duration);
    set_real(r, "total_token_throughput", (double)(total_in + total_out) / duration);
    const char *from = !completed             ? "none"
                       : n_usage == completed ? "usage"
                       : n_usage == 0         ? "chunks"
                                              : "usage and chunks";
    json_object_set_new(r, "output_tokens_from", json_string(from));
    json_object_set_new(r, "stream_options_refused", json_boolean(usage_refused));
    set_real(r, "client_cpu_s", cpu);
    set_real(r, "client_cpu_ms_per_request", cpu * 1000.0 / (double)n);

    double peak_tps;
    long peak_conc;
    peaks(outs, n, &peak_tps, &peak_conc);
    set_real(r, "max_output_tokens_per_s", peak_tps);
    json_object_set_new(r, "max_concurrent_requests", json_integer(peak_conc));

    for (int m = 0; m < 4; m++) {
        char key[64], w[32];
        snprintf(key, sizeof(key), "mean_%s_ms", METRIC_NAMES[m]);
        set_real(r, key, stats_mean(s[m].v, s[m].n) * 1000);
        snprintf(key, sizeof(key), "median_%s_ms", METRIC_NAMES[m]);
        set_real(r, key, stats_percentile(s[m].v, s[m].n, 50) * 1000);
        snprintf(key, sizeof(key), "std_%s_ms", METRIC_NAMES[m]);
        set_real(r, key, stats_std(s[m].v, s[m].n) * 1000);
        snprintf(key, sizeof(key), "p99_%s_ms", METRIC_NAMES[m]);
        set_real(r, key, stats_percentile(s[m].v, s[m].n, 99) * 1000);
        if (!o->metrics[m])
            continue;
        for (int k = 0; k < o->n_percentiles; k++) {
            percentile_word(o->percentiles[k], w, sizeof(w));
            snprintf(key, sizeof(key), "p%s_%s_ms", w, METRIC_NAMES[m]);
            set_real(r, key, stats_percentile(s[m].v, s[m].n, o->percentiles[k]) * 1000);
        }
    }

    json_t *input_lens = json_array(), *output_lens = json_array(), *ttfts = json_array(),
           *itls = json_array(), *lat = json_array(), *starts = json_array(), *ends = json_array(),
           *queues = json_array(), *texts = json_array(), *errors = json_array(),
           *ms = json_array();
    for (long i = 0; i < n; i++) {
        const struct bench_outcome *q = &outs[i];
        json_array_append_new(input_lens, json_integer(q->prompt_len));
        json_array_append_new(output_lens, json_integer(q->output_tokens));
        json_array_append_new(ttfts, json_real(q->ttft));
        json_array_append_new(itls, reals(q->itl, (size_t)q->n_itl));
        json_array_append_new(lat, json_real(q->latency));
        json_array_append_new(starts, json_real(q->start_unix));
        json_array_append_new(ends, json_real(q->end_unix));
        json_array_append_new(queues, json_real(q->queue));
        json_array_append_new(texts, json_stringn(q->text.data ? q->text.data : "", q->text.len));
        json_array_append_new(errors, json_string(q->error ? q->error : ""));
        json_array_append_new(ms, json_string(q->model));
    }
    json_object_set_new(r, "input_lens", input_lens);
    json_object_set_new(r, "output_lens", output_lens);
    json_object_set_new(r, "ttfts", ttfts);
    json_object_set_new(r, "itls", itls);
    json_object_set_new(r, "latencies", lat);
    json_object_set_new(r, "start_times", starts);
    json_object_set_new(r, "end_times", ends);
    json_object_set_new(r, "queue_times", queues);
    json_object_set_new(r, "generated_texts", texts);
    json_object_set_new(r, "errors", errors);
    json_object_set_new(r, "models", ms);

    if (!o->quiet) {
        print_rule(" Serving Benchmark Result ", '=');
        print_row("Successful requests:", (double)completed, true);
        print_row("Failed requests:", (double)(n - completed), true);
        if (o->client.max_concurrency)
            print_row("Maximum request concurrency:", (double)o->client.max_concurrency, true);
        if (!isinf(o->client.request_rate))
            print_row("Request rate configured (RPS):", o->client.request_rate, false);
        print_row("Benchmark duration (s):", duration, false);
        print_row("Total input tokens:", (double)total_in, true);
        print_row("Total generated tokens:", (double)total_out, true);
        print_row("Request throughput (req/s):", (double)completed / duration, false);
        print_row("Output token throughput (tok/s):", (double)total_out / duration, false);
        print_row("Peak output token throughput (tok/s):", peak_tps, false);
        print_row("Peak concurrent requests:", (double)peak_conc, false);
        print_row("Total token throughput (tok/s):", (double)(total_in + total_out) / duration,
                  false);
        printf("%-40s %s\n", "Output tokens counted from:", from);
        print_row("Client CPU time per request (ms):", cpu * 1000.0 / (double)n, false);
        for (int m = 0; m < 4; m++) {
            char label[64], w[32];
            if (!o->metrics[m])
                continue;
            print_rule(METRIC_HEADERS[m], '-');
            snprintf(label, sizeof(label), "Mean %s (ms):", METRIC_LABELS[m]);
            print_row(label, stats_mean(s[m].v, s[m].n) * 1000, false);
            snprintf(label, sizeof(label), "Median %s (ms):", METRIC_LABELS[m]);
            print_row(label, stats_percentile(s[m].v, s[m].n, 50) * 1000, false);
            for (int k = 0; k < o->n_percentiles; k++) {
                percentile_word(o->percentiles[k], w, sizeof(w));
                snprintf(label, sizeof(label), "P%s %s (ms):", w, METRIC_LABELS[m]);
                print_row(label, stats_percentile(s[m].v, s[m].n, o->percentiles[k]) * 1000, false);
            }
        }
        print_rule(NULL, '=');
        if (completed < n) {
            long shown = 0;
            for (long i = 0; i < n && shown < 10; i++)
                if (!outs[i].success)
                    fprintf(stderr, "lora-bench: request %ld failed: %s\n", i, outs[i].error),
                        shown++;
            if (n - completed > shown)
                fprintf(stderr, "lora-bench: ... and %ld more failed requests\n",
                        n - completed - shown);
        }
        fflush(stdout);
    }
    for (int m = 0; m < 4; m++)
        free(s[m].v);
out:
    dataset_free(prompts, n);
    client_outcomes_free(outs, n);
    free(models);
    return r;
}

int serve_result_severity(const json_t *result)
{
    json_t *errors = json_object_get(result, "errors");
    size_t i, unreachable = 0;
    json_t *e;

    if (json_integer_value(json_object_get(result, "failed")) == 0)
        return 0;
    json_array_foreach (errors, i, e) {
        if (strncmp(json_string_value(e) ? json_string_value(e) : "", "unable to connect", 17) == 0)
            unreachable++;
    }
    return unreachable == json_array_size(errors) ? 2 : 1;
}
