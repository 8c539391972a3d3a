/* lora-bench report: markdown tables and gnuplot figures from a campaign's directory; see
 * bench.h and lora-bench(1).
 *
 * Costs are per generated token (the client's count, completed requests only): time (the
 * cell's duration / tokens), the stack's CPU time (its processes', from /proc) and energy net
 * of idle (the cell's joules less the mean idle power times the cell's duration), each
 * averaged over the repetitions of a configuration at a concurrency, with its band:
 * (max - min) / mean over those repetitions. Only cells whose status is "ok" enter a cost;
 * the others are listed. A margin is mean / baseline's mean - 1; a rule of the configuration
 * judges it against its threshold, and says when the margin is nearer the threshold than the
 * larger of the two bands.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/cli.h"
#include "base/errbuf.h"
#include "base/exit_codes.h"
#include "base/json_file.h"
#include "bench.h"

#define REPORT_USAGE_TEXT "usage: lora-bench report DIR [--output FILE]"
#define MAX_VALUES        1024

enum metric { TIME, CPU, ENERGY, N_METRICS };
static const char *const METRIC_KEYS[N_METRICS] = {"time_per_token", "cpu_per_token",
                                                   "energy_per_token"};
static const char *const METRIC_TITLES[N_METRICS] = {"time", "stack CPU", "energy net of idle"};

struct report {
    const char *dir;
    json_t *campaign, *cfg, *plan;
    json_t **cells; /* by plan index; NULL when missing */
    long n_cells;
    long unreadable; /* cell files that are there but do not parse */
    json_t *idle[3];
    double idle_watts; /* NAN when not measured */
    bool energy;
    struct lora_buf md;
};

struct summary {
    double mean, band, min, max;
    int n;
};

static void md(struct report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void md(struct report *r, const char *fmt, ...)
{
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    lora_buf_add_str(&r->md, buf);
}

static double num(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static bool cell_ok(const json_t *c)
{
    const char *s = json_string_value(json_object_get(c, "status"));
    return s && strcmp(s, "ok") == 0 && json_integer_value(json_object_get(c, "tokens")) > 0;
}

/* One cell's cost in a metric (seconds or joules per token), NAN when not known. */
static double cell_cost(const struct report *r, const json_t *c, enum metric m)
{
    const json_t *cost = json_object_get(c, "cost");
    double tokens = (double)json_integer_value(json_object_get(c, "tokens"));
    if (m == TIME)
        return num(cost, "time_per_token");
    if (m == CPU)
        return num(cost, "cpu_per_token");
    const json_t *e = json_object_get(c, "energy");
    double j = num(e, "joules"), s = num(e, "seconds");
    if (!isfinite(j) || !isfinite(r->idle_watts) || !(tokens > 0))
        return NAN;
    return (j - r->idle_watts * s) / tokens;
}

static struct summary summarize(const double *v, int n)
{
    struct summary s = {.mean = NAN, .band = NAN, .min = NAN, .max = NAN};
    int k = 0;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        if (!k || v[i] < s.min)
            s.min = v[i];
        if (!k || v[i] > s.max)
            s.max = v[i];
        sum += v[i];
        k++;
    }
    s.n = k;
    if (k) {
        s.mean = sum / k;
        s.band = s.mean != 0 ? (s.max - s.min) / fabs(s.mean) : NAN;
    }
    return s;
}

/* The values of fn over the ok cells of configuration conf at concurrency conc. */
static int group(const struct report *r, const char *conf, long conc, double *out,
                 double (*fn)(const struct report *, const json_t *, int), int arg)
{
    int n = 0;
    for (long k = 0; k < r->n_cells && n < MAX_VALUES; k++) {
        const json_t *c = r->cells[k];
        if (!c || !cell_ok(c) ||
            strcmp(json_string_value(json_object_get(c, "configuration")), conf) != 0 ||
            json_integer_value(json_object_get(c, "concurrency")) != conc)
            continue;
        out[n++] = fn(r, c, arg);
    }
    return n;
}

static double fn_cost(const struct report *r, const json_t *c, int m)
{
    return cell_cost(r, c, (enum metric)m);
}

static struct summary cost_of(const struct report *r, const char *conf, long conc, enum metric m)
{
    double v[MAX_VALUES];
    int n = group(r, conf, conc, v, fn_cost, m);
    return summarize(v, n);
}

static const char *fmt_pct(double v, char *buf, size_t len)
{
    if (!isfinite(v))
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, "%+.1f%%", v * 100);
    return buf;
}

static const char *fmt_band(double v, char *buf, size_t len)
{
    if (!isfinite(v))
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, "%.1f%%", v * 100);
    return buf;
}

/* A cost in its unit: ms per token for time and CPU, J per token for energy. */
static const char *fmt_cost(double v, enum metric m, char *buf, size_t len)
{
    if (!isfinite(v))
        snprintf(buf, len, m == ENERGY ? "not measured" : "n/a");
    else if (m == ENERGY)
        snprintf(buf, len, "%.4g", v);
    else
        snprintf(buf, len, "%.3f", v * 1000);
    return buf;
}

/* The margin of conf against base at conc in metric m: mean / base mean - 1, and the larger
 * band of the two. */
static double margin(const struct report *r, const char *conf, const char *base, long conc,
                     enum metric m, double *band_a, double *band_b)
{
    struct summary a = cost_of(r, conf, conc, m), b = cost_of(r, base, conc, m);
    *band_a = a.band;
    *band_b = b.band;
    if (!a.n || !b.n || !(b.mean != 0))
        return NAN;
    return a.mean / b.mean - 1;
}

static enum metric metric_of(const char *key)
{
    for (int m = 0; m < N_METRICS; m++)
        if (key && strcmp(key, METRIC_KEYS[m]) == 0)
            return (enum metric)m;
    return TIME;
}

/* ---- loading ---------------------------------------------------------------------------- */

static int load(struct report *r, char *err, size_t err_len)
{
    char path[4096], e2[1024];

    snprintf(path, sizeof(path), "%s/campaign.json", r->dir);
    r->campaign = lora_json_file_load(path, e2, sizeof(e2));
    if (!r->campaign) {
        lora_errf(err, err_len, "%s is not a campaign directory: %s", r->dir, e2);
        return -1;
    }
    r->cfg = json_object_get(r->campaign, "config");
    r->plan = json_object_get(r->campaign, "plan");
    json_t *cells = json_object_get(r->plan, "cells");
    if (!json_is_object(r->cfg) || !json_is_array(cells) ||
        !json_is_array(json_object_get(r->cfg, "configurations"))) {
        lora_errf(err, err_len, "%s: no configuration or plan in it", path);
        return -1;
    }
    r->n_cells = (long)json_array_size(cells);
    r->cells = calloc((size_t)r->n_cells + 1, sizeof(json_t *));
    if (!r->cells) {
        lora_errf(err, err_len, "out of memory");
        return -1;
    }
    for (long k = 0; k < r->n_cells; k++) {
        snprintf(path, sizeof(path), "%s/cells/cell-%03ld.json", r->dir, k);
        /* Our own files: a generated text may hold U+0000, which lora_json_file refuses. */
        json_error_t je;
        struct stat st;
        if (stat(path, &st) < 0)
            continue;
        r->cells[k] = json_load_file(path, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(r->cells[k])) {
            json_decref(r->cells[k]);
            r->cells[k] = NULL;
            r->unreadable++;
            fprintf(stderr, "lora-bench: warning: %s: unreadable, left out: %s\n", path,
                    lora_json_error_what(&je));
        }
    }
    static const char *const idle[3] = {"start", "middle", "end"};
    double w = 0;
    int nw = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/idle-%s.json", r->dir, idle[i]);
        r->idle[i] = lora_json_file_load(path, e2, sizeof(e2));
        double x = num(r->idle[i], "watts");
        if (isfinite(x)) {
            w += x;
            nw++;
        }
    }
    r->idle_watts = nw ? w / nw : NAN;
    r->energy = json_is_true(json_object_get(json_object_get(r->campaign, "energy"), "measured"));
    return 0;
}

/* ---- sections --------------------------------------------------------------------------- */

static void section_head(struct report *r)
{
    json_t *e = json_object_get(r->campaign, "energy");
    md(r, "# %s\n\n", json_string_value(json_object_get(r->cfg, "study")));
    md(r,
       "lora-bench report of `%s`: %ld cells planned (%zu configurations x %zu concurrencies "
       "x %lld repetitions%s), requests to %s, %lld prompt and %lld output tokens each, "
       "ignore_eos %s. Host %s, %lld CPUs.\n\n",
       r->dir, r->n_cells, json_array_size(json_object_get(r->cfg, "configurations")),
       json_array_size(json_object_get(r->cfg, "concurrencies")),
       (long long)json_integer_value(json_object_get(r->cfg, "repetitions")),
       json_is_true(json_object_get(r->cfg, "quick_applied")) ? ", --quick" : "",
       json_string_value(json_object_get(r->cfg, "base_url")),
       (long long)json_integer_value(json_object_get(r->cfg, "input_tokens")),
       (long long)json_integer_value(json_object_get(r->cfg, "output_tokens")),
       json_is_true(json_object_get(r->cfg, "ignore_eos")) ? "on" : "off",
       json_string_value(json_object_get(r->campaign, "host"))
           ? json_string_value(json_object_get(r->campaign, "host"))
           : "?",
       (long long)json_integer_value(json_object_get(r->campaign, "cpus")));
    if (r->energy) {
        md(r, "Energy from:");
        size_t i;
        json_t *s;
        json_array_foreach (json_object_get(e, "sources"), i, s) {
            md(r, " `%s`", json_string_value(s));
        }
        md(r, "; net of idle at %.2f W (the mean of the idle measurements).\n\n", r->idle_watts);
    } else {
        md(r, "Energy: %s.\n\n",
           json_string_value(json_object_get(e, "note"))
               ? json_string_value(json_object_get(e, "note"))
               : "not measured");
    }
}

static void section_cells(struct report *r)
{
    long found = 0, ok = 0, failed = 0, outside = 0, error = 0, match = 0, counted = 0;
    for (long k = 0; k < r->n_cells; k++) {
        const json_t *c = r->cells[k];
        if (!c)
            continue;
        found++;
        const char *s = json_string_value(json_object_get(c, "status"));
        s = s ? s : "error";
        ok += strcmp(s, "ok") == 0;
        failed += strcmp(s, "failed requests") == 0;
        outside += strcmp(s, "not contained") == 0;
        error += strcmp(s, "error") == 0;
        const json_t *srv = json_object_get(c, "server");
        if (json_is_number(json_object_get(srv, "generation_tokens"))) {
            counted++;
            match += json_is_true(json_object_get(srv, "tokens_match"));
        }
    }
    md(r, "## Cells\n\n");
    md(r, "| planned | kept | ok | failed requests | outside their window | error | server "
          "counter = client tokens |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    md(r, "| %ld | %ld | %ld | %ld | %ld | %ld | %ld of %ld |\n\n", r->n_cells, found, ok, failed,
       outside, error, match, counted);
    md(r, "Every cell is kept as it ran (never run again). Only ok cells enter the costs below; "
          "a cell's window holds every one of its requests (start and end), checked per cell. "
          "Tokens are the client's count of completed requests' output tokens; the server's "
          "`vllm:generation_tokens_total` moved by the same number in the cells counted in the "
          "last column.\n\n");
    if (r->unreadable)
        md(r, "%ld cell files do not parse and are left out.\n\n", r->unreadable);
    if (found + r->unreadable < r->n_cells)
        md(r, "%ld cells have no file yet: the campaign has not finished.\n\n",
           r->n_cells - found - r->unreadable);
    if (ok < found) {
        md(r, "| cell | configuration | concurrency | status | first error |\n"
              "| --- | --- | --- | --- | --- |\n");
        for (long k = 0; k < r->n_cells; k++) {
            const json_t *c = r->cells[k];
            if (!c || cell_ok(c))
                continue;
            const char *first = json_string_value(json_object_get(c, "error"));
            const char *key;
            json_t *v;
            json_object_foreach (json_object_get(c, "errors"), key, v) {
                if (!first)
                    first = key;
            }
            md(r, "| %ld | %s | %lld | %s | %s |\n", k,
               json_string_value(json_object_get(c, "configuration")),
               (long long)json_integer_value(json_object_get(c, "concurrency")),
               json_string_value(json_object_get(c, "status"))
                   ? json_string_value(json_object_get(c, "status"))
                   : "error",
               first ? first : "");
        }
        md(r, "\n");
    }
}

static void section_idle(struct report *r)
{
    static const char *const names[3] = {"start", "middle", "end"};
    md(r, "## Idle\n\n| measurement | seconds | power (W) | stack CPU (s per s) |\n"
          "| --- | --- | --- | --- |\n");
    for (int i = 0; i < 3; i++) {
        const json_t *x = r->idle[i];
        char w[64];
        if (!x) {
            md(r, "| %s | not measured | | |\n", names[i]);
            continue;
        }
        double s = num(x, "seconds"), watts = num(x, "watts");
        double cpu = num(json_object_get(x, "cpu"), "total_s");
        snprintf(w, sizeof(w), isfinite(watts) ? "%.2f" : "not measured", watts);
        md(r, "| %s | %.1f | %s | %.4f |\n", names[i], s, w, cpu / s);
    }
    md(r, "\n");
}

static double fn_steps(const struct report *r, const json_t *c, int unused)
{
    return num(json_object_get(c, "server"), "mean_step_adapters");
}

/* The programs seen in the ok cells' CPU times, in the order first seen. */
static const char *program_names[16];
static int n_programs;

/* Program p's CPU seconds per token in cell c; p < 0: the client's. */
static double fn_program(const struct report *r, const json_t *c, int p)
{
    double tokens = (double)json_integer_value(json_object_get(c, "tokens"));
    const json_t *cpu = json_object_get(c, "cpu");
    if (p < 0)
        return num(cpu, "client_s") / tokens;
    json_t *v = json_object_get(json_object_get(cpu, "programs"), program_names[p]);
    return json_is_number(v) ? json_number_value(v) / tokens : 0;
}

static void section_costs(struct report *r)
{
    json_t *confs = json_object_get(r->cfg, "configurations");
    json_t *cs = json_object_get(r->cfg, "concurrencies");
    size_t i, j;
    json_t *conf, *cc;
    char b[6][64];

    md(r, "## Cost per generated token\n\n");
    md(r,
       "Mean over the ok cells (n) of each configuration at each concurrency; band = (max - "
       "min) / mean over those cells. Time and stack CPU in ms per token, energy in J per "
       "token; adapters per step is the mean of `lora_step_adapters` over the cell's steps.\n\n");
    md(r, "| configuration | N | traffic | concurrency | n | time | band | stack CPU | band | "
          "energy | band | adapters per step |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    json_array_foreach (confs, i, conf) {
        const char *name = json_string_value(json_object_get(conf, "name"));
        json_array_foreach (cs, j, cc) {
            long c = (long)json_integer_value(cc);
            struct summary s[N_METRICS];
            for (int m = 0; m < N_METRICS; m++)
                s[m] = cost_of(r, name, c, (enum metric)m);
            double v[MAX_VALUES];
            int n = group(r, name, c, v, fn_steps, 0);
            struct summary st = summarize(v, n);
            char steps[32];
            snprintf(steps, sizeof(steps), isfinite(st.mean) ? "%.2f" : "n/a", st.mean);
            md(r, "| %s | %lld | %s | %ld | %d | %s | %s | %s | %s | %s | %s | %s |\n", name,
               (long long)json_integer_value(json_object_get(conf, "distinct")),
               json_string_value(json_object_get(conf, "traffic")), c, s[TIME].n,
               fmt_cost(s[TIME].mean, TIME, b[0], 64), fmt_band(s[TIME].band, b[1], 64),
               fmt_cost(s[CPU].mean, CPU, b[2], 64), fmt_band(s[CPU].band, b[3], 64),
               fmt_cost(s[ENERGY].mean, ENERGY, b[4], 64),
               r->energy ? fmt_band(s[ENERGY].band, b[5], 64) : "", steps);
        }
    }
    md(r, "\n");

    /* CPU per program: the programs seen in any ok cell. */
    n_programs = 0;
    for (long k = 0; k < r->n_cells; k++) {
        const char *p;
        json_t *v;
        if (!r->cells[k] || !cell_ok(r->cells[k]))
            continue;
        json_object_foreach (json_object_get(json_object_get(r->cells[k], "cpu"), "programs"), p,
                             v) {
            int q = 0;
            while (q < n_programs && strcmp(program_names[q], p) != 0)
                q++;
            if (q == n_programs && n_programs < 16)
                program_names[n_programs++] = p;
        }
    }
    md(r, "## Stack CPU per program\n\nCPU time of each program of the stack (utime + stime from "
          "/proc), ms per generated token, mean over the ok cells; lora-bench's own CPU time "
          "(getrusage) beside it.\n\n| configuration | concurrency |");
    for (int p = 0; p < n_programs; p++)
        md(r, " %s |", program_names[p]);
    md(r, " lora-bench (client) |\n| --- | --- |");
    for (int p = 0; p <= n_programs; p++)
        md(r, " --- |");
    md(r, "\n");
    json_array_foreach (confs, i, conf) {
        const char *name = json_string_value(json_object_get(conf, "name"));
        json_array_foreach (cs, j, cc) {
            long c = (long)json_integer_value(cc);
            md(r, "| %s | %ld |", name, c);
            for (int p = 0; p <= n_programs; p++) {
                double v[MAX_VALUES];
                int n = group(r, name, c, v, fn_program, p == n_programs ? -1 : p);
                struct summary s = summarize(v, n);
                md(r, " %s |", fmt_cost(s.mean, CPU, b[0], 64));
            }
            md(r, "\n");
        }
    }
    md(r, "\n");
}

/* The uniform configuration with one adapter: the N=1 of the margins. */
static const char *one_adapter(const struct report *r)
{
    size_t i;
    json_t *c;
    json_array_foreach (json_object_get(r->cfg, "configurations"), i, c) {
        if (json_integer_value(json_object_get(c, "distinct")) == 1 &&
            strcmp(json_string_value(json_object_get(c, "traffic")), "uniform") == 0)
            return json_string_value(json_object_get(c, "name"));
    }
    return NULL;
}

static void margin_cells(struct report *r, const char *conf, const char *base, long c)
{
    char b[3][64];
    for (int m = 0; m < N_METRICS; m++) {
        double ba, bb, x = margin(r, conf, base, c, (enum metric)m, &ba, &bb);
        if (m == ENERGY && !r->energy) {
            md(r, " not measured | |");
            continue;
        }
        md(r, " %s | %s / %s |", fmt_pct(x, b[0], 64), fmt_band(ba, b[1], 64),
           fmt_band(bb, b[2], 64));
    }
    md(r, "\n");
}

static void section_margins(struct report *r)
{
    const char *base = one_adapter(r);
    size_t i, j;
    json_t *conf, *cc;

    md(r, "## N distinct adapters against N=1\n\n");
    if (!base) {
        md(r, "No uniform configuration with one adapter: no margins.\n\n");
        return;
    }
    md(r,
       "Margin = mean cost / mean cost of `%s` - 1, for each uniform configuration; the "
       "bands are the configuration's and N=1's.\n\n",
       base);
    md(r, "| concurrency | configuration | N | time | bands | stack CPU | bands | energy | bands "
          "|\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    json_array_foreach (json_object_get(r->cfg, "concurrencies"), j, cc) {
        long c = (long)json_integer_value(cc);
        json_array_foreach (json_object_get(r->cfg, "configurations"), i, conf) {
            const char *name = json_string_value(json_object_get(conf, "name"));
            if (strcmp(name, base) == 0 ||
                strcmp(json_string_value(json_object_get(conf, "traffic")), "uniform") != 0)
                continue;
            md(r, "| %ld | %s | %lld |", c, name,
               (long long)json_integer_value(json_object_get(conf, "distinct")));
            margin_cells(r, name, base, c);
        }
    }
    md(r, "\n");
}

/* The uniform configuration with as many distinct adapters as skewed configuration s. */
static const char *uniform_twin(const struct report *r, const json_t *s)
{
    size_t i;
    json_t *c;
    json_array_foreach (json_object_get(r->cfg, "configurations"), i, c) {
        if (json_integer_value(json_object_get(c, "distinct")) ==
                json_integer_value(json_object_get(s, "distinct")) &&
            strcmp(json_string_value(json_object_get(c, "traffic")), "uniform") == 0)
            return json_string_value(json_object_get(c, "name"));
    }
    return NULL;
}

static void section_skew(struct report *r)
{
    size_t i, j;
    json_t *conf, *cc;
    bool any = false;

    md(r, "## Skew\n\nd = mean cost of the skewed configuration / mean cost of the uniform one "
          "with as many distinct adapters - 1; the bands are the skewed and the uniform "
          "configuration's.\n\n");
    md(r, "| concurrency | skewed | uniform | N | top share | d time | bands | d stack CPU | "
          "bands | d energy | bands |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    json_array_foreach (json_object_get(r->cfg, "concurrencies"), j, cc) {
        long c = (long)json_integer_value(cc);
        json_array_foreach (json_object_get(r->cfg, "configurations"), i, conf) {
            if (strcmp(json_string_value(json_object_get(conf, "traffic")), "skewed") != 0)
                continue;
            const char *u = uniform_twin(r, conf);
            if (!u)
                continue;
            any = true;
            md(r, "| %ld | %s | %s | %lld | %.0f%% |", c,
               json_string_value(json_object_get(conf, "name")), u,
               (long long)json_integer_value(json_object_get(conf, "distinct")),
               num(conf, "top_share") * 100);
            margin_cells(r, json_string_value(json_object_get(conf, "name")), u, c);
        }
    }
    if (!any)
        md(r, "| | no skewed configuration with a uniform one of the same N | | | | | | | | | |\n");
    md(r, "\n");
}

static void section_rules(struct report *r)
{
    const char *key;
    json_t *rule;
    char b[4][64];

    md(r, "## Hypotheses\n\nEach rule as the configuration fixed it before the run: the margin "
          "of its configuration against its baseline, and whether that falsifies it. \"by less "
          "than the band\" marks a margin nearer the threshold than the larger band of the "
          "two.\n\n");
    md(r, "| rule | statement | concurrency | metric | margin | band | falsified if | verdict |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    json_object_foreach (json_object_get(r->cfg, "rules"), key, rule) {
        const char *conf = json_string_value(json_object_get(rule, "configuration"));
        const char *base = json_string_value(json_object_get(rule, "baseline"));
        const char *test = json_string_value(json_object_get(rule, "falsified_if"));
        double t = num(rule, "threshold");
        enum metric m = metric_of(json_string_value(json_object_get(rule, "metric")));
        json_t *only = json_object_get(rule, "concurrency");
        size_t j;
        json_t *cc;
        json_array_foreach (json_object_get(r->cfg, "concurrencies"), j, cc) {
            long c = (long)json_integer_value(cc);
            if (only && json_integer_value(only) != c)
                continue;
            double ba, bb, x = margin(r, conf, base, c, m, &ba, &bb);
            double band = isfinite(ba) && isfinite(bb) ? fmax(ba, bb) : NAN;
            char verdict[160], cond[96];
            bool below = strcmp(test, "margin_below") == 0,
                 absu = strcmp(test, "abs_margin_above") == 0;
            snprintf(cond, sizeof(cond), "%s(%s vs %s) %s %s", absu ? "abs margin" : "margin", conf,
                     base, below ? "<" : ">", fmt_pct(t, b[0], 64));
            if (!isfinite(x)) {
                snprintf(verdict, sizeof(verdict), "not judged: %s",
                         m == ENERGY && !r->energy ? "energy not measured" : "no ok cells");
            } else {
                double v = absu ? fabs(x) : x;
                bool falsified = below ? v < t : v > t;
                bool close = isfinite(band) && fabs(v - t) < band;
                snprintf(verdict, sizeof(verdict), "**%s**%s",
                         falsified ? "falsified" : "not falsified",
                         close ? " (by less than the band)" : "");
            }
            md(r, "| %s | %s | %ld | %s | %s | %s | %s | %s |\n", key,
               json_string_value(json_object_get(rule, "statement")), c, METRIC_KEYS[m],
               fmt_pct(x, b[1], 64), fmt_band(band, b[2], 64), cond, verdict);
        }
    }
    md(r, "\n");
}

static void section_published(struct report *r)
{
    size_t i;
    json_t *p;
    char b[2][64];

    md(r, "## Published figures beside the measured ones\n\n| figure | published | source | "
          "measured here |\n| --- | --- | --- | --- |\n");
    json_array_foreach (json_object_get(r->cfg, "published"), i, p) {
        const char *conf = json_string_value(json_object_get(p, "configuration"));
        const char *base = json_string_value(json_object_get(p, "baseline"));
        enum metric m = metric_of(json_string_value(json_object_get(p, "metric")));
        md(r, "| %s | %s | %s |", json_string_value(json_object_get(p, "what")),
           fmt_pct(num(p, "value"), b[0], 64), json_string_value(json_object_get(p, "source")));
        if (!conf || !base) {
            md(r, " (no comparison given) |\n");
            continue;
        }
        size_t j;
        json_t *cc;
        bool first = true;
        json_array_foreach (json_object_get(r->cfg, "concurrencies"), j, cc) {
            double ba, bb, x = margin(r, conf, base, (long)json_integer_value(cc), m, &ba, &bb);
            md(r, "%s %s at concurrency %lld", first ? "" : ",", fmt_pct(x, b[1], 64),
               (long long)json_integer_value(cc));
            first = false;
        }
        md(r, " |\n");
    }
    md(r, "\n");
}

static double fn_latency(const struct report *r, const json_t *c, int which)
{
    static const char *const keys[8] = {"median_ttft_ms", "p99_ttft_ms",   "median_tpot_ms",
                                        "p99_tpot_ms",    "median_itl_ms", "p99_itl_ms",
                                        "median_e2el_ms", "p99_e2el_ms"};
    return num(json_object_get(c, "result"), keys[which]);
}

static void section_latency(struct report *r)
{
    size_t i, j;
    json_t *conf, *cc;
    char b[64];

    md(r, "## Latency percentiles\n\nms, the mean over the ok cells of each cell's median (p50) "
          "and p99.\n\n| configuration | concurrency | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 "
          "| ITL p50 | ITL p99 | E2EL p50 | E2EL p99 |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    json_array_foreach (json_object_get(r->cfg, "configurations"), i, conf) {
        const char *name = json_string_value(json_object_get(conf, "name"));
        json_array_foreach (json_object_get(r->cfg, "concurrencies"), j, cc) {
            long c = (long)json_integer_value(cc);
            md(r, "| %s | %ld |", name, c);
            for (int w = 0; w < 8; w++) {
                double v[MAX_VALUES];
                int n = group(r, name, c, v, fn_latency, w);
                struct summary s = summarize(v, n);
                snprintf(b, sizeof(b), isfinite(s.mean) ? "%.2f" : "n/a", s.mean);
                md(r, " %s |", b);
            }
            md(r, "\n");
        }
    }
    md(r, "\n");
}

/* ---- plots ------------------------------------------------------------------------------ */

/* Runs gnuplot in dir with script on its standard input. 0, or -1 with err. */
static int run_gnuplot(const char *dir, const char *script, char *err, size_t err_len)
{
    int fd[2];
    if (pipe(fd) < 0) {
        lora_errf(err, err_len, "unable to run gnuplot: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        lora_errf(err, err_len, "unable to run gnuplot: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        dup2(fd[0], 0);
        close(fd[0]);
        close(fd[1]);
        if (chdir(dir) < 0)
            _exit(126);
        execlp("gnuplot", "gnuplot", (char *)NULL);
        _exit(127);
    }
    close(fd[0]);
    signal(SIGPIPE, SIG_IGN);
    size_t len = strlen(script), off = 0;
    while (off < len) {
        ssize_t w = write(fd[1], script + off, len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(fd[1]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        lora_errf(err, err_len, "gnuplot %s",
                  WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "is not installed (gnuplot-nox)"
                                                          : "failed (see its messages above)");
        return -1;
    }
    return 0;
}

static int cmp_n(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Writes plot-METRIC.dat (one block per concurrency and traffic: N, mean, min, max) and draws
 * cost-METRIC.png. 0, or -1 with err; *drawn says whether a figure was made. */
static int plot(struct report *r, enum metric m, const char *png, const char *terminal, bool *drawn,
                char *err, size_t err_len)
{
    static const char *const traffic[2] = {"uniform", "skewed"};
    static const char *const units[N_METRICS] = {"ms per generated token",
                                                 "stack CPU ms per generated token",
                                                 "J per generated token, net of idle"};
    char path[4096], name[64];
    struct lora_buf script = {0};
    int block = 0;
    double scale = m == ENERGY ? 1 : 1000;

    *drawn = false;
    snprintf(name, sizeof(name), "plot-%s.dat", png);
    snprintf(path, sizeof(path), "%s/%s", r->dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        lora_errf_path(err, err_len, path, "unable to write: %s", strerror(errno));
        return -1;
    }
    lora_buf_add_str(&script, "");
    char line[1024];
    snprintf(line, sizeof(line),
             "set terminal %s size 960,600\nset output 'cost-%s.png'\n"
             "set title 'Cost per generated token against distinct adapters: %s'\n"
             "set xlabel 'distinct adapters (N)'\nset ylabel '%s'\nset key outside right\n"
             "set grid\nset xtics 1\n%sset offsets 0.3, 0.3, 0, 0\nplot ",
             terminal, png, METRIC_TITLES[m], units[m],
             /* net of idle, energy may be below 0 */
             m == ENERGY ? "" : "set yrange [0:*]\n");
    lora_buf_add_str(&script, line);
    size_t j;
    json_t *cc;
    json_array_foreach (json_object_get(r->cfg, "concurrencies"), j, cc) {
        long c = (long)json_integer_value(cc);
        for (int t = 0; t < 2; t++) {
            double rows[256][4];
            int n = 0;
            size_t i;
            json_t *conf;
            json_array_foreach (json_object_get(r->cfg, "configurations"), i, conf) {
                if (strcmp(json_string_value(json_object_get(conf, "traffic")), traffic[t]) != 0 ||
                    n == 256)
                    continue;
                struct summary s =
                    cost_of(r, json_string_value(json_object_get(conf, "name")), c, m);
                if (!s.n)
                    continue;
                rows[n][0] = (double)json_integer_value(json_object_get(conf, "distinct"));
                rows[n][1] = s.mean * scale;
                rows[n][2] = s.min * scale;
                rows[n][3] = s.max * scale;
                n++;
            }
            if (!n)
                continue;
            qsort(rows, (size_t)n, sizeof(rows[0]), cmp_n);
            fprintf(f, "# concurrency %ld, %s traffic: N mean min max\n", c, traffic[t]);
            for (int k = 0; k < n; k++)
                fprintf(f, "%g %.9g %.9g %.9g\n", rows[k][0], rows[k][1], rows[k][2], rows[k][3]);
            fprintf(f, "\n\n");
            snprintf(line, sizeof(line),
                     "%s'%s' index %d using 1:2:3:4 with yerrorlines pt %d title '%s, "
                     "concurrency %ld'",
                     block ? ", " : "", name, block, t ? 6 : 7, traffic[t], c);
            lora_buf_add_str(&script, line);
            block++;
        }
    }
    lora_buf_add_str(&script, "\n");
    if (fclose(f) != 0) {
        lora_errf_path(err, err_len, path, "unable to write: %s", strerror(errno));
        lora_buf_release(&script);
        return -1;
    }
    int rc = 0;
    if (block) {
        rc = run_gnuplot(r->dir, script.data, err, err_len);
        *drawn = rc == 0;
    }
    lora_buf_release(&script);
    return rc;
}

static int section_plots(struct report *r, char *err, size_t err_len)
{
    static const char *const files[N_METRICS] = {"time", "cpu", "energy"};
    /* pngcairo where gnuplot has it, else the libgd png terminal. */
    const char *term =
        run_gnuplot(r->dir, "set terminal pngcairo\n", err, err_len) == 0 ? "pngcairo" : "png";
    int rc = 0;
    md(r, "## Figures\n\n");
    for (int m = 0; m < N_METRICS; m++) {
        bool drawn = false;
        if (m == ENERGY && !r->energy) {
            md(r, "Energy: not measured, no figure.\n\n");
            continue;
        }
        if (plot(r, (enum metric)m, files[m], term, &drawn, err, err_len) < 0) {
            md(r, "cost-%s.png: not drawn: %s.\n\n", files[m], err);
            rc = -1;
            continue;
        }
        if (drawn)
            md(r, "![%s per generated token against N](cost-%s.png)\n\n", METRIC_TITLES[m],
               files[m]);
        else
            md(r, "cost-%s.png: no ok cells to draw.\n\n", files[m]);
    }
    return rc;
}

/* ---- the subcommand --------------------------------------------------------------------- */

struct report_args {
    const char *output;
    bool help, version;
};

#define REPORT_N_OPTS 4

static void report_table(struct report_args *a, struct lora_cli_opt *t)
{
    const struct lora_cli_opt opts[REPORT_N_OPTS] = {
        {"output", LORA_OPT_STRING, &a->output, "FILE",
         "the markdown's file (default DIR/report.md); it goes to stdout too"},
        {"help", LORA_OPT_FLAG, &a->help, NULL, "show this help"},
        {"version", LORA_OPT_FLAG, &a->version, NULL, "show the version"},
        {0},
    };
    memcpy(t, opts, sizeof(opts));
}

void report_usage(FILE *f)
{
    struct report_args a = {0};
    struct lora_cli_opt opts[REPORT_N_OPTS];
    report_table(&a, opts);
    fprintf(f, "%s\n\n", REPORT_USAGE_TEXT);
    lora_cli_usage(f, opts);
}

int report_main(int argc, char **argv)
{
    struct report_args a = {0};
    struct lora_cli_opt opts[REPORT_N_OPTS];
    struct report r = {0};
    char err[4096], path[4096];
    int rc = 0;

    report_table(&a, opts);
    r.dir = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL;
    if (lora_cli_parse(opts, "LORA_BENCH", argc, argv, r.dir ? 2 : 1, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-bench: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    if (a.help) {
        report_usage(stdout);
        return 0;
    }
    if (a.version) {
        puts("lora-bench " LORA_VERSION);
        return 0;
    }
    if (!r.dir) {
        fprintf(stderr,
                "lora-bench: fatal: give the campaign's directory: lora-bench report DIR\n");
        return EXIT_USAGE;
    }
    if (load(&r, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-bench: fatal: %s\n", err);
        rc = EXIT_BAD_INPUT;
        goto out;
    }
    section_head(&r);
    section_cells(&r);
    section_idle(&r);
    section_costs(&r);
    section_margins(&r);
    section_skew(&r);
    section_rules(&r);
    section_published(&r);
    section_latency(&r);
    if (section_plots(&r, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-bench: %s\n", err);
        rc = EXIT_SYSTEM;
    }
    if (r.md.failed) {
        fprintf(stderr, "lora-bench: fatal: out of memory\n");
        rc = EXIT_SYSTEM;
        goto out;
    }
    fwrite(r.md.data, 1, r.md.len, stdout);
    if (a.output)
        snprintf(path, sizeof(path), "%s", a.output);
    else
        snprintf(path, sizeof(path), "%s/report.md", r.dir);
    FILE *f = fopen(path, "w");
    if (!f || fwrite(r.md.data, 1, r.md.len, f) != r.md.len || fclose(f) != 0) {
        fprintf(stderr, "lora-bench: fatal: %s: unable to write: %s\n", path, strerror(errno));
        rc = EXIT_SYSTEM;
    }
out:
    for (long k = 0; r.cells && k < r.n_cells; k++)
        json_decref(r.cells[k]);
    free(r.cells);
    for (int i = 0; i < 3; i++)
        json_decref(r.idle[i]);
    json_decref(r.campaign);
    lora_buf_release(&r.md);
    return rc;
}
