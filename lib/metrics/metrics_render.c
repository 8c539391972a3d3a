/* metrics_render: every family of the exposition, in one fixed order, from the state; see
 * metrics_render.h. */
#include <stdio.h>
#include <stdlib.h>

#include "base/cli.h"
#include "metrics/metrics_render.h"

struct render {
    const struct lora_metrics_state *s;
    struct lora_exposition *w;
    uint64_t now_ms;
    double now_unix;
    char index[16]; /* the engine label of the engine being written */
};

enum when {
    WHEN_MODEL,  /* counters, histograms */
    WHEN_CONFIG, /* config gauges */
    WHEN_READY,  /* state gauges */
};

static bool shows(struct render *r, const struct lora_metrics_state_engine *e, enum when when)
{
    if (!lora_metrics_state_model_name(r->s, e))
        return false;
    if (when == WHEN_MODEL)
        return true;
    if (lora_metrics_state_engine_is_lost(r->s, e, r->now_ms))
        return false;
    return when == WHEN_CONFIG ? e->has_config : lora_metrics_state_engine_is_ready(e);
}

/* labels[0..1] = model_name, engine; returns 2. */
static int base(struct render *r, const struct lora_metrics_state_engine *e,
                struct lora_exposition_label *labels)
{
    snprintf(r->index, sizeof(r->index), "%d", e->index);
    labels[0] = (struct lora_exposition_label){"model_name", lora_metrics_state_model_name(r->s, e)};
    labels[1] = (struct lora_exposition_label){"engine", r->index};
    return 2;
}

typedef double (*engine_value)(const struct lora_metrics_state_engine *e);

static void per_engine(struct render *r, const char *name, enum lora_exposition_type type,
                       const char *help, enum when when, engine_value value)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, name, type, help);
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (shows(r, e, when))
            lora_exposition_sample(r->w, l, base(r, e, l), value(e));
    }
    lora_exposition_family_end(r->w);
}

static void histogram(struct render *r, const char *name, const char *help,
                      enum lora_metrics_state_hist h)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, name, LORA_EXPOSITION_HISTOGRAM, help);
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (shows(r, e, WHEN_MODEL) && e->hist[h].buckets)
            lora_exposition_histogram(r->w, l, base(r, e, l), &e->hist[h]);
    }
    lora_exposition_family_end(r->w);
}

static double v_running(const struct lora_metrics_state_engine *e)
{
    return e->running;
}

static double v_waiting(const struct lora_metrics_state_engine *e)
{
    return e->waiting;
}

static double v_kv(const struct lora_metrics_state_engine *e)
{
    return e->kv_usage;
}

static double v_prompt(const struct lora_metrics_state_engine *e)
{
    return (double)e->prompt_tokens;
}

static double v_generation(const struct lora_metrics_state_engine *e)
{
    return (double)e->generation_tokens;
}

static double v_n_gpu(const struct lora_metrics_state_engine *e)
{
    return e->n_gpu;
}

static double v_n_cpu(const struct lora_metrics_state_engine *e)
{
    return e->n_cpu;
}

static double v_max_loras(const struct lora_metrics_state_engine *e)
{
    return e->max_loras;
}

static double v_disagree(const struct lora_metrics_state_engine *e)
{
    return e->n_disagree;
}

static void cache_config_info(struct render *r)
{
    lora_exposition_family_begin(r->w, "vllm:cache_config_info", LORA_EXPOSITION_GAUGE,
                           "Information of the LLMEngine CacheConfig");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        char idx[16], bs[16], nb[16];
        if (!shows(r, e, WHEN_CONFIG))
            continue;
        snprintf(idx, sizeof(idx), "%d", e->index);
        snprintf(bs, sizeof(bs), "%d", e->block_size);
        snprintf(nb, sizeof(nb), "%d", e->num_kv_blocks);
        struct lora_exposition_label l[3] = {
            {"engine", idx}, {"block_size", bs}, {"num_gpu_blocks", nb}};
        lora_exposition_sample(r->w, l, 3, 1);
    }
    lora_exposition_family_end(r->w);
}

static void preemptions(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, "vllm:num_preemptions_total", LORA_EXPOSITION_COUNTER,
                           "Cumulative number of preemption from the engine.");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (shows(r, e, WHEN_MODEL) && e->has_stats)
            lora_exposition_sample(r->w, l, base(r, e, l), (double)e->num_preemptions);
    }
    lora_exposition_family_end(r->w);
}

static void success(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, "vllm:request_success_total", LORA_EXPOSITION_COUNTER,
                           "Count of successfully processed requests.");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_MODEL))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < LORA_REASON_COUNT; k++) {
            l[n] = (struct lora_exposition_label){"finished_reason", lora_metrics_state_reason_names[k]};
            lora_exposition_sample(r->w, l, n + 1, (double)e->success[k]);
        }
    }
    lora_exposition_family_end(r->w);
}

static void lora_requests_info(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, "vllm:lora_requests_info", LORA_EXPOSITION_GAUGE,
                           "Running stats on lora requests.");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        char *running, *waiting, max[16];
        if (!shows(r, e, WHEN_READY) || lora_metrics_state_lora_sets(r->s, e, &running, &waiting) < 0)
            continue;
        snprintf(max, sizeof(max), "%d", e->max_loras);
        int n = base(r, e, l);
        l[n++] = (struct lora_exposition_label){"max_lora", max};
        l[n++] = (struct lora_exposition_label){"running_lora_adapters", running};
        l[n++] = (struct lora_exposition_label){"waiting_lora_adapters", waiting};
        lora_exposition_sample(r->w, l, n, r->now_unix);
        free(running);
        free(waiting);
    }
    lora_exposition_family_end(r->w);
}

static void adapter_loaded(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, "vllm:lora_adapter_loaded", LORA_EXPOSITION_GAUGE,
                           "Adapters held by every rank of the engine, at their highest level "
                           "(gpu: in a compute slot; cpu: in the CPU cache).");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_READY))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < e->n_adapters; k++) {
            const struct lora_metrics_state_adapter *a = e->adapters[k];
            if (a->level == LORA_LEVEL_NONE)
                continue;
            l[n] = (struct lora_exposition_label){"adapter_name", a->name};
            l[n + 1] =
                (struct lora_exposition_label){"level", a->level == LORA_LEVEL_GPU ? "gpu" : "cpu"};
            l[n + 2] = (struct lora_exposition_label){"pinned", a->pinned ? "true" : "false"};
            lora_exposition_sample(r->w, l, n + 3, 1);
        }
    }
    lora_exposition_family_end(r->w);
}

static void load_seconds(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];
    const char *names[LORA_METRICS_STATE_N_TRANSITIONS] = {"load", "activate"};
    const enum lora_metrics_state_hist hs[LORA_METRICS_STATE_N_TRANSITIONS] = {LORA_H_LOAD_SECONDS,
                                                                 LORA_H_ACTIVATE_SECONDS};

    lora_exposition_family_begin(r->w, "vllm:lora_adapter_load_seconds", LORA_EXPOSITION_HISTOGRAM,
                           "Seconds a rank took to load an adapter from disk into its CPU "
                           "cache (load) or into a compute slot (activate).");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_MODEL))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < LORA_METRICS_STATE_N_TRANSITIONS; k++) {
            l[n] = (struct lora_exposition_label){"transition", names[k]};
            lora_exposition_histogram(r->w, l, n + 1, &e->hist[hs[k]]);
        }
    }
    lora_exposition_family_end(r->w);
}

static void adapter_requests(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, "lora_adapter_requests", LORA_EXPOSITION_GAUGE,
                           "Requests of each adapter in the batch (running) and in the queue "
                           "(waiting); every resident adapter and every adapter with requests.");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_READY))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < e->n_adapters; k++) {
            const struct lora_metrics_state_adapter *a = e->adapters[k];
            if (a->level == LORA_LEVEL_NONE && !a->running && !a->waiting)
                continue;
            l[n] = (struct lora_exposition_label){"adapter_name", a->name};
            l[n + 1] = (struct lora_exposition_label){"state", "running"};
            lora_exposition_sample(r->w, l, n + 2, a->running);
            l[n + 1] = (struct lora_exposition_label){"state", "waiting"};
            lora_exposition_sample(r->w, l, n + 2, a->waiting);
        }
    }
    lora_exposition_family_end(r->w);
}

static void adapter_tokens(struct render *r, const char *name, const char *help, bool prompt)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, name, LORA_EXPOSITION_COUNTER, help);
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_MODEL))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < e->n_adapters; k++) {
            const struct lora_metrics_state_adapter *a = e->adapters[k];
            if (!a->accounted)
                continue;
            l[n] = (struct lora_exposition_label){"adapter_name", a->name};
            lora_exposition_sample(r->w, l, n + 1,
                             (double)(prompt ? a->prompt_tokens : a->generation_tokens));
        }
    }
    lora_exposition_family_end(r->w);
}

static void per_level(struct render *r, const char *name, const char *help, bool loads)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];
    const char *levels[2] = {"cpu", "gpu"};

    lora_exposition_family_begin(r->w, name, LORA_EXPOSITION_COUNTER, help);
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_MODEL))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < 2; k++) {
            l[n] = (struct lora_exposition_label){"level", levels[k]};
            lora_exposition_sample(r->w, l, n + 1, (double)(loads ? e->loads[k] : e->evictions[k]));
        }
    }
    lora_exposition_family_end(r->w);
}

static void dropped(struct render *r)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS];

    lora_exposition_family_begin(r->w, "lora_notifications_dropped_total", LORA_EXPOSITION_COUNTER,
                           "Notifications a rank's buffer dropped since the rank started.");
    for (int i = 0; i < r->s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = r->s->engines[i];
        if (!shows(r, e, WHEN_MODEL))
            continue;
        int n = base(r, e, l);
        for (int k = 0; k < LORA_METRICS_STATE_MAX_WORLD; k++) {
            char rank[16];
            if (!e->has_dropped[k])
                continue;
            snprintf(rank, sizeof(rank), "%d", k);
            l[n] = (struct lora_exposition_label){"rank", rank};
            lora_exposition_sample(r->w, l, n + 1, (double)e->dropped[k]);
        }
    }
    lora_exposition_family_end(r->w);
}

void lora_metrics_render(const struct lora_metrics_state *s, struct lora_exposition *w, double now_unix,
                         uint64_t now_ms)
{
    struct render r = {.s = s, .w = w, .now_ms = now_ms, .now_unix = now_unix};

    per_engine(&r, "vllm:num_requests_running", LORA_EXPOSITION_GAUGE,
               "Number of requests in model execution batches.", WHEN_READY, v_running);
    per_engine(&r, "vllm:num_requests_waiting", LORA_EXPOSITION_GAUGE,
               "Number of requests waiting to be processed.", WHEN_READY, v_waiting);
    per_engine(&r, "vllm:kv_cache_usage_perc", LORA_EXPOSITION_GAUGE,
               "KV-cache usage. 1 means 100 percent usage.", WHEN_READY, v_kv);
    per_engine(&r, "vllm:gpu_cache_usage_perc", LORA_EXPOSITION_GAUGE,
               "GPU KV-cache usage. 1 means 100 percent usage (the older name).", WHEN_READY,
               v_kv);
    cache_config_info(&r);
    preemptions(&r);
    per_engine(&r, "vllm:prompt_tokens_total", LORA_EXPOSITION_COUNTER,
               "Number of prefill tokens processed.", WHEN_MODEL, v_prompt);
    per_engine(&r, "vllm:generation_tokens_total", LORA_EXPOSITION_COUNTER,
               "Number of generation tokens processed.", WHEN_MODEL, v_generation);
    success(&r);
    histogram(&r, "vllm:time_to_first_token_seconds",
              "Histogram of time to first token in seconds.", LORA_H_TTFT);
    histogram(&r, "vllm:inter_token_latency_seconds",
              "Histogram of inter-token latency in seconds.", LORA_H_ITL);
    histogram(&r, "vllm:e2e_request_latency_seconds",
              "Histogram of e2e request latency in seconds.", LORA_H_E2E);
    histogram(&r, "vllm:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", LORA_H_QUEUE);
    histogram(&r, "vllm:request_prefill_time_seconds",
              "Histogram of time spent in PREFILL phase for request.", LORA_H_PREFILL);
    histogram(&r, "vllm:request_decode_time_seconds",
              "Histogram of time spent in DECODE phase for request.", LORA_H_DECODE);
    histogram(&r, "vllm:request_inference_time_seconds",
              "Histogram of time spent in RUNNING phase for request.", LORA_H_INFERENCE);
    histogram(&r, "vllm:request_prompt_tokens", "Number of prefill tokens processed.",
              LORA_H_PROMPT_TOKENS);
    histogram(&r, "vllm:request_generation_tokens", "Number of generation tokens processed.",
              LORA_H_GENERATION_TOKENS);
    histogram(&r, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
              LORA_H_ITERATION_TOKENS);
    histogram(&r, "vllm:request_params_max_tokens",
              "Histogram of the max_tokens request parameter.", LORA_H_MAX_TOKENS);
    lora_requests_info(&r);
    adapter_loaded(&r);
    per_engine(&r, "vllm:num_gpu_loaded_lora_adapters", LORA_EXPOSITION_GAUGE,
               "Adapters in a compute slot on every rank.", WHEN_READY, v_n_gpu);
    per_engine(&r, "vllm:num_cpu_loaded_lora_adapters", LORA_EXPOSITION_GAUGE,
               "Adapters in the CPU cache of every rank (those in slots included).", WHEN_READY,
               v_n_cpu);
    per_engine(&r, "vllm:max_gpu_lora_adapters", LORA_EXPOSITION_GAUGE,
               "Compute slots for adapters (max_loras).", WHEN_CONFIG, v_max_loras);
    load_seconds(&r);
    adapter_requests(&r);
    histogram(&r, "lora_step_adapters", "Distinct adapters in each executed step.",
              LORA_H_STEP_ADAPTERS);
    adapter_tokens(&r, "lora_adapter_prompt_tokens_total",
                   "Prompt tokens of each adapter's finished requests.", true);
    adapter_tokens(&r, "lora_adapter_generation_tokens_total",
                   "Generated tokens of each adapter's finished requests.", false);
    per_level(&r, "lora_adapter_loads_total",
              "Adapters that came to be held at a level by every rank.", true);
    per_level(&r, "lora_adapter_evictions_total",
              "Adapters that stopped being held at a level, unloads not counted.", false);
    per_engine(&r, "lora_residency_disagreement", LORA_EXPOSITION_GAUGE,
               "Adapters whose level differs between the ranks of the engine; 0 when healthy.",
               WHEN_READY, v_disagree);
    dropped(&r);
    lora_exposition_family_begin(w, "lora_build_info", LORA_EXPOSITION_GAUGE, "The exporter's version.");
    lora_exposition_sample(w, (struct lora_exposition_label[]){{"version", LORA_VERSION}}, 1, 1);
    lora_exposition_family_end(w);
}
