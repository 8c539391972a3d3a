/* lora-bench: a load generator and cost-study driver for OpenAI-compatible servers
 * (docs/design.md, "Programs").
 *
 * Three subcommands share these modules:
 *   serve     one run of `vllm bench serve`'s semantics (dataset.c, client.c, stats.c, serve.c)
 *   campaign  the cost study's protocol from a JSON file: cells of serve runs, each measured
 *             by scraping /metrics (scrape.c), reading the stack's CPU time from /proc
 *             (procs.c) and energy where the machine exposes it (energy.c); campaign.c
 *   report    tables and plots from a campaign's directory (report.c)
 *
 * Ownership: every function that returns json_t * returns a new reference (the caller's);
 * char * results are the caller's to free. Errors go into the caller's (err, err_len) as in
 * lib/; only main.c and the subcommands' entry points print and pick exit codes.
 */
#ifndef LORA_BENCH_H
#define LORA_BENCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/buf.h"

/* ---- dataset.c: the random dataset ------------------------------------------------------ */

/* vLLM's RandomDataset without a tokenizer: each prompt is a token-id array whose length is
 * drawn uniformly from [floor(L(1-r)), ceil(L(1+r))], a fixed random prefix followed by the
 * ids (offset + index + k) mod vocab_size; output lengths are drawn the same way around the
 * asked length (at least 1). Reproducible from the seed (its own generator, so the draws are
 * not numpy's). */
struct dataset_options {
    long num_prompts;
    long input_len, output_len, prefix_len, vocab_size;
    double range_ratio;
    uint64_t seed;
};

struct bench_prompt {
    int *ids; /* (n_ids) */
    int n_ids;
    int max_tokens;
};

/* Fills *out with o->num_prompts prompts (free with dataset_free). 0, or -1 with err. */
int dataset_random(const struct dataset_options *o, struct bench_prompt **out, char *err,
                   size_t err_len);
void dataset_free(struct bench_prompt *p, long n);

/* ---- rng.c ------------------------------------------------------------------------------ */

/* The generator of the whole program: splitmix64, state advanced in place. */
uint64_t rng_next(uint64_t *state);
double rng_uniform(uint64_t *state);                 /* [0, 1) */
long rng_between(uint64_t *state, long lo, long hi); /* [lo, hi] */
double rng_gamma(uint64_t *state, double shape, double scale);

/* ---- client.c: streaming requests over libcurl's multi interface, one thread ------------- */

struct client_options {
    const char *api_url;  /* BASE_URL/v1/completions */
    const char *api_key;  /* Authorization: Bearer, or NULL */
    double request_rate;  /* requests per second; INFINITY: all at once */
    double burstiness;    /* 1: Poisson arrivals; else gamma intervals of this shape */
    long max_concurrency; /* 0: no limit */
    bool ignore_eos;
    double timeout_s; /* per request, 0: none */
    uint64_t seed;    /* the arrival times */
    /* Called after each finished request (may be NULL): done so far, of n. */
    void (*on_done)(void *ctx, long done, long n);
    void *on_done_ctx;
};

/* What happened to one request; times are seconds. */
struct bench_outcome {
    const char *model; /* borrowed from the caller's list */
    bool success;
    char *error;       /* NULL on success */
    int prompt_len;    /* the prompt's length, or the server's prompt_tokens when it said */
    int output_tokens; /* from the usage chunk, else the chunks counted; 0 when failed */
    bool tokens_from_usage;
    int chunks; /* events that carried a choice */
    double ttft, latency, queue;
    double start_unix, end_unix; /* sent; finished (last byte, error or cut) */
    double *itl;                 /* (n_itl) */
    int n_itl, cap_itl;
    struct lora_buf text;
};

/* Runs every prompt against o->api_url, prompt i with model models[i]; fills outs (n of them,
 * zeroed by the caller; release with client_outcomes_free). *usage_refused is set when the
 * server refused stream_options and the run went on without it. 0 when the run took place
 * (requests may have failed: see outs), -1 with err when it could not start. */
int client_run(const struct client_options *o, const struct bench_prompt *prompts,
               const char *const *models, long n, struct bench_outcome *outs, bool *usage_refused,
               char *err, size_t err_len);
void client_outcomes_free(struct bench_outcome *outs, long n);

/* GET url into body (at most max_bytes). Returns the HTTP status, or -1 with err (the
 * server could not be reached, or answered too much). */
long client_get(const char *url, const char *api_key, double timeout_s, size_t max_bytes,
                struct lora_buf *body, char *err, size_t err_len);

/* ---- stats.c ---------------------------------------------------------------------------- */

/* numpy's defaults: the mean, the median, the population standard deviation and the
 * percentile with linear interpolation between the closest ranks; all 0 over no values. */
double stats_mean(const double *v, size_t n);
double stats_std(const double *v, size_t n);
double stats_percentile(const double *v, size_t n, double p); /* sorts a copy */

/* ---- serve.c: one benchmark run --------------------------------------------------------- */

#define SERVE_MAX_PERCENTILES 16

struct serve_options {
    const char *base_url;
    const char *model;               /* NULL: the first of /v1/models */
    const char *const *lora_modules; /* round-robin over the list as given */
    int n_lora_modules;
    struct dataset_options data;
    struct client_options client;
    bool metrics[4]; /* ttft, tpot, itl, e2el: printed with their percentiles */
    double percentiles[SERVE_MAX_PERCENTILES];
    int n_percentiles;
    bool quiet;       /* no summary on stdout */
    bool no_progress; /* no progress line, even on a terminal */
};

/* Runs the benchmark and returns its result object (vLLM's fields and ours), or NULL with
 * err when it could not run at all (no model, no server). */
json_t *serve_run(const struct serve_options *o, char *err, size_t err_len);

/* What a result says went wrong, for an exit status: 0 every request completed, 1 some
 * failed, 2 every one failed without reaching the server. */
int serve_result_severity(const json_t *result);

/* ---- scrape.c: /metrics ----------------------------------------------------------------- */

/* The sum over every sample of family name (exactly that name: name_sum is another family)
 * whose label label has the value value (NULL: every sample). found says whether any matched. */
double scrape_sum(const char *text, const char *name, const char *label, const char *value,
                  bool *found);
/* {label value: sum} over the samples of family name, by the value of label. */
json_t *scrape_by_label(const char *text, const char *name, const char *label);

/* ---- procs.c: the stack's CPU time from /proc ------------------------------------------- */

struct procs_spec {
    const char *run_dir; /* RUN_DIR/pids of lora-stack up */
    long pids[64];       /* given pids */
    int n_pids;
};

/* [{"pid", "program", "cpu_s"}] of the stack's processes now: those of spec, else every
 * process whose name starts with "lora-" (this program excepted). NULL with err. */
json_t *procs_snapshot(const struct procs_spec *spec, char *err, size_t err_len);
/* {"programs": {program: cpu seconds}, "total_s", "processes", "notes"} between two
 * snapshots; a process in after only counts whole, one gone is named in notes. */
json_t *procs_delta(const json_t *before, const json_t *after);

/* ---- energy.c: NVML and RAPL counters --------------------------------------------------- */

struct energy;
/* Opens what can be read: NVML (libnvidia-ml.so.1, loaded at run time) when nvml, and the
 * RAPL package counters under powercap_dir (NULL: /sys/class/powercap). Never fails. */
struct energy *energy_open(bool nvml, const char *powercap_dir);
void energy_close(struct energy **e);
/* Whether anything is measured, and {"sources": [...]} or the reason nothing is. */
bool energy_is_measured(const struct energy *e);
json_t *energy_describe(const struct energy *e);
/* Reads every counter: joules since an arbitrary origin (each counter's wraps handled by
 * energy_delta). Returns a snapshot object, or NULL when nothing is measured. */
json_t *energy_snapshot(struct energy *e);
/* Joules between two snapshots, or -1 when either is missing. */
double energy_delta(const json_t *before, const json_t *after);

/* ---- campaign.c and report.c ------------------------------------------------------------ */

int campaign_main(int argc, char **argv);
int report_main(int argc, char **argv);
void campaign_usage(FILE *f);
void report_usage(FILE *f);

/* Shared by campaign and report: reads and checks a campaign configuration (quick applies
 * its "quick" overrides). Returns the effective configuration, or NULL with err. */
json_t *campaign_config_load(const char *path, bool quick, char *err, size_t err_len);

/* ---- files.c ---------------------------------------------------------------------------- */

/* Writes doc to path atomically (a temporary file, fsync, rename). 0 or -1 with err. */
int files_write_json(const char *path, const json_t *doc, char *err, size_t err_len);

#endif
