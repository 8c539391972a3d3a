/* lora-worker generate: runs prompts through the model in shared steps, without the serving
 * processes. One request from --prompt-ids, or one per line of --batch FILE:
 *   {"prompt_ids":[1,2,3],"max_tokens":8,"lora":"NAME"|null}
 * with optional "temperature", "top_p", "top_k", "seed", "logprobs" and "ignore_eos" overriding
 * the command line. With --json, prints one line per request, in input order:
 *   {"version":1,"prompt_logprobs":[null,lp1,...],"tokens":[...],
 *    "top_logprobs":[[[id,lp],...],...],"finish_reason":"stop"|"length"}
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/cli.h"
#include "runtime/adapter.h"
#include "runtime/demo_model.h"
#include "runtime/generate.h"
#include "runtime/model.h"
#include "worker.h"

#define MAX_PROMPT (1 << 20)
#define MAX_REQUESTS 4096

struct gen_opts {
    const char *model;
    const char *device;
    struct lora_cli_opt_list loras;
    const char *prompt_ids;
    const char *batch;
    long max_tokens;
    double temperature;
    double top_p;
    long top_k;
    long seed;
    long logprobs;
    bool ignore_eos;
    bool json;
    bool stats;
    long max_lora_rank;
    long max_batched_tokens;
    long block_size;
    struct precision_flags precision;
    bool help;
};

static struct gen_opts o = {
    .device = "cpu",
    .max_tokens = 16,
    .top_p = 1.0,
    .max_lora_rank = 64,
    .max_batched_tokens = 512,
    .block_size = 16,
};

static const struct lora_cli_opt options[] = {
    {"model", LORA_OPT_STRING, &o.model, "DIR", "Hugging Face model directory (default: the demo)"},
    {"lora", LORA_OPT_LIST, &o.loras, "NAME=DIR", "PEFT adapter to load (repeatable)"},
    {"prompt-ids", LORA_OPT_STRING, &o.prompt_ids, "IDS", "one request: comma-separated ids"},
    {"batch", LORA_OPT_STRING, &o.batch, "FILE", "one JSON request per line, run together"},
    {"max-tokens", LORA_OPT_INT, &o.max_tokens, "K", "tokens to generate (default 16)", 0, 1e6},
    {"temperature", LORA_OPT_FLOAT, &o.temperature, "T", "0 = greedy (default)", 0, 100},
    {"top-p", LORA_OPT_FLOAT, &o.top_p, "P", "nucleus sampling (default 1)", 1e-6, 1},
    {"top-k", LORA_OPT_INT, &o.top_k, "K", "top-k sampling, 0 = off", 0, 1e7},
    {"seed", LORA_OPT_INT, &o.seed, "S", "random seed of every request (default 0)", 0, 9e15},
    {"logprobs", LORA_OPT_INT, &o.logprobs, "N", "report the N most likely tokens per step", 0,
     1000},
    {"ignore-eos", LORA_OPT_FLAG, &o.ignore_eos, NULL, "do not stop at end-of-sequence"},
    {"json", LORA_OPT_FLAG, &o.json, NULL, "print one JSON line per request"},
    {"stats", LORA_OPT_FLAG, &o.stats, NULL, "print the run's step timings as JSON on stderr"},
    {"max-lora-rank", LORA_OPT_INT, &o.max_lora_rank, "R", "highest adapter rank (default 64)", 1,
     4096},
    {"max-num-batched-tokens", LORA_OPT_INT, &o.max_batched_tokens, "N",
     "token budget per step (default 512)", 1, 1 << 20},
    {"block-size", LORA_OPT_INT, &o.block_size, "N", "KV cache block size (default 16)", 1, 4096},
    {"device", LORA_OPT_STRING, &o.device, "DEVICE",
     "compute device: cpu, cuda or cuda:N (default cpu)"},
    PRECISION_OPTIONS(o.precision),
    {"help", LORA_OPT_FLAG, &o.help, NULL, "show this help"},
    {0},
};

struct gen_job {
    struct lora_backend *be;
    struct lora_model *model;
    struct lora_adapter *adapters[LORA_OPT_LIST_MAX];
    char *names[LORA_OPT_LIST_MAX];
    int n_adapters;
    struct lora_generate_request *reqs;
    int **prompts;
    int n_reqs;
};

static void job_release(struct gen_job *j)
{
    for (int i = 0; i < j->n_reqs; i++) {
        lora_generate_request_release(&j->reqs[i]);
        free(j->prompts[i]);
    }
    free(j->reqs);
    free(j->prompts);
    for (int i = 0; i < j->n_adapters; i++) {
        lora_adapter_destroy(&j->adapters[i]);
        free(j->names[i]);
    }
    lora_model_destroy(&j->model);
    lora_backend_close(&j->be);
}

/* Takes the adapter names from --lora NAME=DIR, before anything is read from disk. */
static int parse_lora_names(struct gen_job *j, char *err, size_t err_len)
{
    for (int i = 0; i < o.loras.n; i++) {
        const char *spec = o.loras.items[i], *eq = strchr(spec, '=');
        if (!eq || eq == spec || !eq[1]) {
            snprintf(err, err_len, "--lora '%s' must be NAME=DIR", spec);
            return -1;
        }
        j->names[i] = strndup(spec, (size_t)(eq - spec));
        if (!j->names[i]) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        j->n_adapters++;
    }
    return 0;
}

static int load_adapters(struct gen_job *j, char *err, size_t err_len)
{
    for (int i = 0; i < j->n_adapters; i++) {
        const char *dir = strchr(o.loras.items[i], '=') + 1;
        j->adapters[i] = lora_adapter_load(dir, j->model, (int)o.max_lora_rank, err, err_len);
        if (!j->adapters[i])
            return -1;
    }
    return 0;
}

static int slot_of(const struct gen_job *j, const char *name)
{
    for (int i = 0; i < j->n_adapters; i++)
        if (strcmp(j->names[i], name) == 0)
            return i;
    return -1;
}

static void defaults(struct lora_generate_request *r)
{
    r->max_tokens = (int)o.max_tokens;
    r->adapter_slot = -1;
    r->sampling = (struct lora_sampling_params){(float)o.temperature, (int)o.top_k,
                                                (float)o.top_p};
    r->seed = (uint64_t)o.seed;
    r->top_n = (int)o.logprobs;
    r->ignore_eos = o.ignore_eos;
    r->prompt_logprobs = o.json;
}

/* Reads an optional number field within [lo, hi] (an integer when integral); -1 with err when
 * it is malformed. */
static int opt_number(json_t *obj, const char *key, double lo, double hi, bool integral,
                      double *v, const char *where, char *err, size_t err_len)
{
    json_t *f = json_object_get(obj, key);
    if (!f || json_is_null(f))
        return 0;
    if (!(integral ? json_is_integer(f) : json_is_number(f)) || json_number_value(f) < lo ||
        json_number_value(f) > hi) {
        snprintf(err, err_len, "%s: '%s' must be %s in [%g, %g]", where, key,
                 integral ? "an integer" : "a number", lo, hi);
        return -1;
    }
    *v = json_number_value(f);
    return 0;
}

static int parse_request(struct gen_job *j, json_t *obj, struct lora_generate_request *r, int **prompt,
                         const char *where, char *err, size_t err_len)
{
    json_t *ids = json_object_get(obj, "prompt_ids");
    size_t n = json_array_size(ids);

    if (!json_is_object(obj)) {
        snprintf(err, err_len, "%s: not a JSON object", where);
        return -1;
    }
    if (!json_is_array(ids) || n == 0 || n > MAX_PROMPT) {
        snprintf(err, err_len, "%s: 'prompt_ids' must be a non-empty list of token ids", where);
        return -1;
    }
    *prompt = malloc(n * sizeof(int));
    if (!*prompt) {
        snprintf(err, err_len, "%s: out of memory", where);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 30) {
            snprintf(err, err_len, "%s: prompt_ids[%zu] is not a token id", where, i);
            return -1;
        }
        (*prompt)[i] = (int)json_integer_value(v);
    }
    r->prompt = *prompt;
    r->n_prompt = (int)n;
    json_t *lora = json_object_get(obj, "lora");
    if (json_is_string(lora)) {
        r->adapter_slot = slot_of(j, json_string_value(lora));
        if (r->adapter_slot < 0) {
            snprintf(err, err_len, "%s: adapter '%s' was not given with --lora", where,
                     json_string_value(lora));
            return -1;
        }
    } else if (lora && !json_is_null(lora)) {
        snprintf(err, err_len, "%s: 'lora' must be an adapter name or null", where);
        return -1;
    }
    double mt = r->max_tokens, t = r->sampling.temperature, p = r->sampling.top_p;
    double k = r->sampling.top_k, seed = (double)r->seed, lp = r->top_n;
    if (opt_number(obj, "max_tokens", 0, 1e6, true, &mt, where, err, err_len) < 0 ||
        opt_number(obj, "temperature", 0, 100, false, &t, where, err, err_len) < 0 ||
        opt_number(obj, "top_p", 1e-6, 1, false, &p, where, err, err_len) < 0 ||
        opt_number(obj, "top_k", 0, 1e7, true, &k, where, err, err_len) < 0 ||
        opt_number(obj, "seed", 0, 9e15, true, &seed, where, err, err_len) < 0 ||
        opt_number(obj, "logprobs", 0, 1000, true, &lp, where, err, err_len) < 0)
        return -1;
    r->max_tokens = (int)mt;
    r->sampling = (struct lora_sampling_params){(float)t, (int)k, (float)p};
    r->seed = (uint64_t)seed;
    r->top_n = (int)lp;
    json_t *ie = json_object_get(obj, "ignore_eos");
    if (ie && !json_is_boolean(ie)) {
        snprintf(err, err_len, "%s: 'ignore_eos' must be true or false", where);
        return -1;
    }
    if (ie)
        r->ignore_eos = json_is_true(ie);
    return 0;
}

static int add_request(struct gen_job *j, char *err, size_t err_len)
{
    if (j->n_reqs >= MAX_REQUESTS) {
        snprintf(err, err_len, "more than %d requests", MAX_REQUESTS);
        return -1;
    }
    struct lora_generate_request *reqs = realloc(j->reqs, sizeof(*reqs) * (size_t)(j->n_reqs + 1));
    int **prompts = reqs ? realloc(j->prompts, sizeof(*prompts) * (size_t)(j->n_reqs + 1)) : NULL;
    if (reqs)
        j->reqs = reqs;
    if (!reqs || !prompts) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    j->prompts = prompts;
    memset(&j->reqs[j->n_reqs], 0, sizeof(*reqs));
    j->prompts[j->n_reqs] = NULL;
    defaults(&j->reqs[j->n_reqs]);
    j->n_reqs++;
    return 0;
}

static int read_batch(struct gen_job *j, char *err, size_t err_len)
{
    FILE *f = strcmp(o.batch, "-") == 0 ? stdin : fopen(o.batch, "r");
    char *line = NULL;
    size_t cap = 0;
    int rc = 0, lineno = 0;

    if (!f) {
        snprintf(err, err_len, "unable to open '%s': %m", o.batch);
        return -1;
    }
    while (rc == 0 && getline(&line, &cap, f) >= 0) {
        char where[420];
        json_error_t jerr;
        snprintf(where, sizeof(where), "%.400s:%d", o.batch, ++lineno);
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        json_t *obj = json_loads(line, 0, &jerr);
        if (!obj) {
            snprintf(err, err_len, "%s: invalid JSON: %s", where, jerr.text);
            rc = -1;
        } else if (add_request(j, err, err_len) < 0) {
            rc = -1;
        } else {
            int i = j->n_reqs - 1;
            rc = parse_request(j, obj, &j->reqs[i], &j->prompts[i], where, err, err_len);
        }
        json_decref(obj);
    }
    free(line);
    if (f != stdin)
        fclose(f);
    if (rc == 0 && j->n_reqs == 0) {
        snprintf(err, err_len, "%s: no requests", o.batch);
        rc = -1;
    }
    return rc;
}

static int single_request(struct gen_job *j, char *err, size_t err_len)
{
    if (add_request(j, err, err_len) < 0)
        return -1;
    int *ids = malloc(sizeof(int) * MAX_PROMPT);
    if (!ids) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    j->prompts[0] = ids;
    int n = lora_cli_parse_ints(o.prompt_ids, ids, MAX_PROMPT);
    if (n < 1) {
        snprintf(err, err_len, "--prompt-ids '%s' must be comma-separated token ids", o.prompt_ids);
        return -1;
    }
    j->reqs[0].prompt = ids;
    j->reqs[0].n_prompt = n;
    return 0;
}

static json_t *request_json(const struct lora_generate_request *r)
{
    json_t *pl = json_array(), *toks = json_array(), *tops = json_array();

    for (int i = 0; i < r->n_prompt; i++)
        json_array_append_new(pl, isnan(r->prompt_lps[i]) ? json_null()
                                                          : json_real(r->prompt_lps[i]));
    for (int k = 0; k < r->n_tokens; k++) {
        json_t *top = json_array();
        json_array_append_new(toks, json_integer(r->tokens[k]));
        for (int t = 0; t < r->top_n; t++) {
            size_t at = (size_t)k * r->top_n + t;
            json_array_append_new(top, json_pack("[i,f]", r->top_ids[at],
                                                 (double)r->top_logprobs[at]));
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:i,s:o,s:o,s:o,s:s}", "version", 1, "prompt_logprobs", pl, "tokens", toks,
                     "top_logprobs", tops, "finish_reason", r->stopped_on_eos ? "stop" : "length");
}

/* Returns -1 when standard output could not be written. */
static int print_results(const struct gen_job *j)
{
    for (int i = 0; i < j->n_reqs; i++) {
        const struct lora_generate_request *r = &j->reqs[i];
        if (o.json) {
            json_t *obj = request_json(r);
            json_dumpf(obj, stdout, JSON_COMPACT);
            putchar('\n');
            json_decref(obj);
            continue;
        }
        printf("request %d (%s):", i, r->adapter_slot < 0 ? "base" : j->names[r->adapter_slot]);
        for (int k = 0; k < r->n_tokens; k++)
            printf(" %d", r->tokens[k]);
        printf(" [%s]\n", r->stopped_on_eos ? "stop" : "length");
    }
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : -1;
}

int cmd_generate(int argc, char **argv)
{
    char err[1024] = "", demo[4096];
    struct gen_job j = {0};
    int rc = EXIT_USAGE;

    if (lora_cli_parse(options, "LORA_WORKER", argc, argv, 1, err, sizeof(err)) < 0)
        goto out;
    if (o.help) {
        puts("usage: lora-worker generate [--model DIR] [--lora NAME=DIR]... "
             "(--prompt-ids IDS | --batch FILE) [OPTIONS]\n");
        lora_cli_usage(stdout, options);
        rc = fflush(stdout) == 0 ? 0 : EXIT_SYSTEM;
        goto out;
    }
    if (!o.prompt_ids == !o.batch) {
        snprintf(err, sizeof(err), "give exactly one of --prompt-ids and --batch");
        goto out;
    }
    /* The device, before any file is read: a usage error like the others. */
    char why[256];
    j.be = lora_backend_open(o.device, why, sizeof(why));
    if (!j.be) {
        snprintf(err, sizeof(err), "--device %.64s: %s", o.device, why);
        goto out;
    }
    struct lora_precision prec;
    lora_precision_defaults(&prec);
    if (lora_precision_parse(&prec, o.precision.dtype, o.precision.quantization,
                             o.precision.lora_dtype, o.precision.kv_cache_dtype,
                             o.precision.matmul_precision, err, sizeof(err)) < 0)
        goto out;
    j.be->fast_matmul = prec.fast_matmul;
    if (parse_lora_names(&j, err, sizeof(err)) < 0 ||
        (o.prompt_ids && single_request(&j, err, sizeof(err)) < 0))
        goto out;
    rc = EXIT_BAD_INPUT;
    if (o.batch && read_batch(&j, err, sizeof(err)) < 0)
        goto out;
    if (!o.model) {
        rc = EXIT_SYSTEM;
        if (lora_demo_model_ensure(demo, sizeof(demo), err, sizeof(err)) < 0)
            goto out;
        rc = EXIT_BAD_INPUT;
        o.model = demo;
    }
    struct lora_generate_opts go = {(int)o.max_batched_tokens, (int)o.block_size};
    j.model = lora_model_load(j.be, o.model, 0, 1, &prec, err, sizeof(err));
    if (!j.model || load_adapters(&j, err, sizeof(err)) < 0 ||
        lora_precision_kv(&prec, j.be, &go.kv_dtype, err, sizeof(err)) < 0 ||
        lora_precision_lora(&prec, j.be, j.model->base_dtype, &go.lora_dtype, err, sizeof(err)) < 0)
        goto out;
    struct lora_generate_stats st;
    if (lora_generate_run(j.model, (const struct lora_adapter *const *)j.adapters, j.n_adapters,
                          j.reqs, j.n_reqs, &go, &st, err, sizeof(err)) < 0)
        goto out;
    rc = 0;
    /* The steps' own times, for benchmarks that must leave out loading (one line, last). */
    if (o.stats)
        fprintf(stderr,
                "{\"steps\": %d, \"decode_steps\": %d, \"decode_tokens\": %ld, "
                "\"decode_seconds\": %.6f, \"prefill_step_tokens\": %ld, "
                "\"prefill_seconds\": %.6f, \"total_seconds\": %.6f}\n",
                st.n_steps, st.n_decode_steps, st.n_decode_tokens, st.decode_seconds,
                st.n_step_tokens_prefill, st.prefill_seconds, st.total_seconds);
    if (print_results(&j) < 0) {
        snprintf(err, sizeof(err), "unable to write the output: %s", strerror(errno));
        rc = EXIT_SYSTEM;
    }
out:
    if (rc)
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
    job_release(&j);
    return rc;
}
