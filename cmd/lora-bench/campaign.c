/* lora-bench campaign: the cost study's protocol from a JSON configuration; see bench.h and
 * lora-bench(1), which documents the configuration's keys.
 *
 * The plan is fixed before anything runs: the cells are every configuration at every
 * concurrency, once per round (a round per repetition), each round's order rotated by
 * round * cells / rounds so that no configuration always runs first or last; idle
 * measurements sit before the first cell, before the middle one and after the last. The
 * directory keeps the plan and the effective configuration (campaign.json), one file per cell
 * (cells/cell-NNN.json) and one per idle measurement (idle-NAME.json). A cell whose file
 * exists is kept and never run again, so an interrupted campaign goes on where it stopped;
 * a directory whose plan differs is refused.
 *
 * Each cell: scrape /metrics, read the stack's CPU times and the energy counters, run the
 * requests (lora-bench serve's run, quiet), read CPU and energy again, then scrape until the
 * server's token counter has moved by what the client counted (or stopped moving). The
 * cell's window is the run's start and end; every request must lie inside it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/cli.h"
#include "base/clock.h"
#include "base/errbuf.h"
#include "base/exit_codes.h"
#include "base/fs.h"
#include "base/json_file.h"
#include "bench.h"

#define SCRAPE_MAX_BYTES (64u << 20)
#define SETTLE_S         5.0 /* the longest wait for the server's counters after a cell */

static const char *const METRICS[] = {"time_per_token", "cpu_per_token", "energy_per_token", NULL};

/* ---- configuration ---------------------------------------------------------------------- */

static bool one_of(const char *s, const char *const *list)
{
    for (; s && *list; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

static int check_keys(const json_t *o, const char *const *allowed, const char *where, char *err,
                      size_t err_len)
{
    const char *k;
    json_t *v;
    json_object_foreach ((json_t *)o, k, v) {
        if (!one_of(k, allowed)) {
            lora_errf(err, err_len, "%s: unknown key '%s'", where, k);
            return -1;
        }
    }
    return 0;
}

/* An integer key of o (def when absent) within [lo, hi]; -1 with err on a wrong one. */
static int get_int(json_t *o, const char *key, long long def, long long lo, long long hi,
                   const char *where, char *err, size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        json_object_set_new(o, key, json_integer(def));
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        lora_errf(err, err_len, "%s.%s: must be an integer from %lld to %lld", where, key, lo, hi);
        return -1;
    }
    return 0;
}

static int get_num(json_t *o, const char *key, double def, double lo, double hi, const char *where,
                   char *err, size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        json_object_set_new(o, key, json_real(def));
        return 0;
    }
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi) {
        lora_errf(err, err_len, "%s.%s: must be a number from %g to %g", where, key, lo, hi);
        return -1;
    }
    json_object_set_new(o, key, json_real(json_number_value(v)));
    return 0;
}

static int get_str(json_t *o, const char *key, const char *def, const char *where, char *err,
                   size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        json_object_set_new(o, key, def ? json_string(def) : json_null());
        return 0;
    }
    if (!json_is_string(v) || !*json_string_value(v)) {
        lora_errf(err, err_len, "%s.%s: must be a non-empty string", where, key);
        return -1;
    }
    return 0;
}

static const json_t *find_configuration(const json_t *cfg, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach (json_object_get(cfg, "configurations"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "name")), name) == 0)
            return c;
    }
    return NULL;
}

static int check_configurations(json_t *cfg, char *err, size_t err_len)
{
    static const char *const keys[] = {"name",     "adapters",    "traffic",
                                       "distinct", "description", NULL};
    json_t *list = json_object_get(cfg, "configurations");
    size_t i;
    json_t *c;
    char where[128];

    if (!json_is_array(list) || !json_array_size(list)) {
        lora_errf(err, err_len, "configurations: must be a non-empty array");
        return -1;
    }
    json_array_foreach (list, i, c) {
        snprintf(where, sizeof(where), "configurations[%zu]", i);
        if (!json_is_object(c)) {
            lora_errf(err, err_len, "%s: must be an object", where);
            return -1;
        }
        if (check_keys(c, keys, where, err, err_len) < 0 ||
            get_str(c, "name", NULL, where, err, err_len) < 0)
            return -1;
        const char *name = json_string_value(json_object_get(c, "name"));
        if (!name) {
            lora_errf(err, err_len, "%s.name: missing", where);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(name, json_string_value(json_object_get(json_array_get(list, j), "name"))) ==
                0) {
                lora_errf(err, err_len, "%s.name: '%s' is also configurations[%zu]'s", where, name,
                          j);
                return -1;
            }
        json_t *ad = json_object_get(c, "adapters");
        if (!json_is_array(ad) || json_array_size(ad) > LORA_OPT_LIST_MAX) {
            lora_errf(err, err_len, "%s.adapters: must be an array of at most %d names", where,
                      LORA_OPT_LIST_MAX);
            return -1;
        }
        /* Distinct names, and how often the most frequent one comes. */
        size_t n = json_array_size(ad), distinct = 0, top = 0;
        for (size_t a = 0; a < n; a++) {
            const char *s = json_string_value(json_array_get(ad, a));
            if (!s || !*s) {
                lora_errf(err, err_len, "%s.adapters[%zu]: must be a non-empty string", where, a);
                return -1;
            }
            size_t seen = 0, count = 0;
            for (size_t b = 0; b < n; b++) {
                const char *t = json_string_value(json_array_get(ad, b));
                if (t && strcmp(s, t) == 0) {
                    count++;
                    if (b < a)
                        seen++;
                }
            }
            if (!seen)
                distinct++;
            if (count > top)
                top = count;
        }
        bool skewed = n && top * distinct != n;
        if (get_int(c, "distinct", (long long)distinct, 0, 1 << 20, where, err, err_len) < 0 ||
            get_str(c, "traffic", skewed ? "skewed" : "uniform", where, err, err_len) < 0)
            return -1;
        static const char *const traffic[] = {"uniform", "skewed", NULL};
        if (!one_of(json_string_value(json_object_get(c, "traffic")), traffic)) {
            lora_errf(err, err_len, "%s.traffic: must be uniform or skewed", where);
            return -1;
        }
        json_object_set_new(c, "top_share", json_real(n ? (double)top / (double)n : 1.0));
    }
    return 0;
}

static int check_comparison(json_t *o, const char *where, bool need_rule, const json_t *cfg,
                            char *err, size_t err_len)
{
    char w[160];
    const char *m = json_string_value(json_object_get(o, "metric"));
    if (!need_rule && !json_object_get(o, "metric") && !json_object_get(o, "configuration") &&
        !json_object_get(o, "baseline"))
        return 0; /* a published figure printed alone */
    if (!one_of(m, METRICS)) {
        lora_errf(err, err_len,
                  "%s.metric: must be time_per_token, cpu_per_token or "
                  "energy_per_token",
                  where);
        return -1;
    }
    static const char *const sides[] = {"configuration", "baseline"};
    for (int k = 0; k < 2; k++) {
        const char *name = json_string_value(json_object_get(o, sides[k]));
        if (!name && !need_rule)
            continue;
        if (!name || !find_configuration(cfg, name)) {
            lora_errf(err, err_len, "%s.%s: must name one of the configurations", where, sides[k]);
            return -1;
        }
    }
    if (need_rule) {
        static const char *const tests[] = {"margin_below", "margin_above", "abs_margin_above",
                                            NULL};
        if (!one_of(json_string_value(json_object_get(o, "falsified_if")), tests)) {
            lora_errf(err, err_len,
                      "%s.falsified_if: must be margin_below, margin_above or abs_margin_above",
                      where);
            return -1;
        }
        snprintf(w, sizeof(w), "%s", where);
        if (!json_is_number(json_object_get(o, "threshold"))) {
            lora_errf(err, err_len, "%s.threshold: must be a number (a fraction: 0.05 is 5%%)", w);
            return -1;
        }
        json_t *c = json_object_get(o, "concurrency");
        if (c) {
            bool found = false;
            size_t i;
            json_t *x;
            json_array_foreach (json_object_get(cfg, "concurrencies"), i, x) {
                found |= json_integer_value(x) == json_integer_value(c);
            }
            if (!json_is_integer(c) || !found) {
                lora_errf(err, err_len, "%s.concurrency: must be one of the concurrencies", w);
                return -1;
            }
        }
    }
    return 0;
}

static int check_rules(json_t *cfg, char *err, size_t err_len)
{
    static const char *const rule_keys[] = {"statement",   "metric",       "configuration",
                                            "baseline",    "falsified_if", "threshold",
                                            "concurrency", "description",  NULL};
    static const char *const pub_keys[] = {"what",     "value",  "metric",      "configuration",
                                           "baseline", "source", "description", NULL};
    json_t *rules = json_object_get(cfg, "rules"), *pub = json_object_get(cfg, "published");
    const char *k;
    json_t *r;
    char where[160];

    if (!rules)
        json_object_set_new(cfg, "rules", rules = json_object());
    if (!json_is_object(rules)) {
        lora_errf(err, err_len, "rules: must be an object of named rules (H1, H2, ...)");
        return -1;
    }
    json_object_foreach (rules, k, r) {
        snprintf(where, sizeof(where), "rules.%s", k);
        if (!json_is_object(r)) {
            lora_errf(err, err_len, "%s: must be an object", where);
            return -1;
        }
        if (check_keys(r, rule_keys, where, err, err_len) < 0 ||
            get_str(r, "statement", k, where, err, err_len) < 0 ||
            check_comparison(r, where, true, cfg, err, err_len) < 0)
            return -1;
    }
    if (!pub)
        json_object_set_new(cfg, "published", pub = json_array());
    if (!json_is_array(pub)) {
        lora_errf(err, err_len, "published: must be an array");
        return -1;
    }
    size_t i;
    json_array_foreach (pub, i, r) {
        snprintf(where, sizeof(where), "published[%zu]", i);
        if (!json_is_object(r)) {
            lora_errf(err, err_len, "%s: must be an object", where);
            return -1;
        }
        if (check_keys(r, pub_keys, where, err, err_len) < 0 ||
            get_str(r, "what", NULL, where, err, err_len) < 0 ||
            get_str(r, "source", "", where, err, err_len) < 0 ||
            check_comparison(r, where, false, cfg, err, err_len) < 0)
            return -1;
        if (!json_string_value(json_object_get(r, "what")) ||
            !json_is_number(json_object_get(r, "value"))) {
            lora_errf(err, err_len, "%s: needs what (a string) and value (a fraction)", where);
            return -1;
        }
    }
    return 0;
}

/* The "quick" object holds only keys that --quick may change (checked with or without it). */
static int check_quick(const json_t *q, char *err, size_t err_len)
{
    static const char *const keys[] = {"repetitions",
                                       "num_prompts",
                                       "num_prompts_per_concurrency",
                                       "input_tokens",
                                       "output_tokens",
                                       "idle_seconds",
                                       "concurrencies",
                                       "warmup_prompts",
                                       "description",
                                       NULL};
    if (q && !json_is_object(q)) {
        lora_errf(err, err_len, "quick: must be an object");
        return -1;
    }
    return q ? check_keys(q, keys, "quick", err, err_len) : 0;
}

/* --quick: one repetition of small cells, a minute or two; the config's "quick" object
 * overrides these defaults. */
static int apply_quick(json_t *cfg, char *err, size_t err_len)
{
    json_t *q = json_object_get(cfg, "quick");
    json_t *in = json_object_get(cfg, "input_tokens"), *out = json_object_get(cfg, "output_tokens");
    json_t *idle = json_object_get(cfg, "idle_seconds");

    if (check_quick(q, err, err_len) < 0)
        return -1;
    json_object_set_new(cfg, "repetitions", json_integer(1));
    if (json_is_integer(in) && json_integer_value(in) > 16)
        json_object_set_new(cfg, "input_tokens", json_integer(16));
    if (json_is_integer(out) && json_integer_value(out) > 16)
        json_object_set_new(cfg, "output_tokens", json_integer(16));
    if (!idle || (json_is_number(idle) && json_number_value(idle) > 1))
        json_object_set_new(cfg, "idle_seconds", json_real(1));
    json_object_del(cfg, "num_prompts");
    json_object_set_new(cfg, "num_prompts_per_concurrency", json_integer(2));
    json_object_set_new(cfg, "warmup_prompts", json_integer(0));
    if (q &&
        (json_object_get(q, "num_prompts") || json_object_get(q, "num_prompts_per_concurrency")))
        json_object_del(cfg, "num_prompts_per_concurrency");
    const char *k;
    json_t *v;
    json_object_foreach (q, k, v) {
        if (strcmp(k, "description") != 0)
            json_object_set(cfg, k, v);
    }
    return 0;
}

json_t *campaign_config_load(const char *path, bool quick, char *err, size_t err_len)
{
    static const char *const keys[] = {"version",
                                       "study",
                                       "description",
                                       "base_url",
                                       "metrics_url",
                                       "model",
                                       "configurations",
                                       "concurrencies",
                                       "repetitions",
                                       "num_prompts",
                                       "num_prompts_per_concurrency",
                                       "input_tokens",
                                       "output_tokens",
                                       "range_ratio",
                                       "vocab_size",
                                       "request_rate",
                                       "ignore_eos",
                                       "seed",
                                       "request_timeout",
                                       "idle_seconds",
                                       "warmup_prompts",
                                       "processes",
                                       "energy",
                                       "rules",
                                       "published",
                                       "quick",
                                       NULL};
    char e2[1024];
    json_t *cfg = lora_json_file_load(path, e2, sizeof(e2));

    if (!cfg) {
        lora_errf(err, err_len, "%s", e2);
        return NULL;
    }
    if (!json_is_object(cfg)) {
        lora_errf(err, err_len, "%s: the configuration must be a JSON object", path);
        goto bad;
    }
    json_t *copy = json_deep_copy(cfg);
    json_decref(cfg);
    cfg = copy;
    if (check_keys(cfg, keys, "the configuration", e2, sizeof(e2)) < 0)
        goto bad_e2;
    json_t *v = json_object_get(cfg, "version");
    if (v && json_integer_value(v) != 1) {
        snprintf(e2, sizeof(e2), "version: this program reads version 1");
        goto bad_e2;
    }
    json_object_set_new(cfg, "version", json_integer(1));
    if (check_quick(json_object_get(cfg, "quick"), e2, sizeof(e2)) < 0 ||
        (quick && apply_quick(cfg, e2, sizeof(e2)) < 0))
        goto bad_e2;
    const char *w = "the configuration";
    if (get_str(cfg, "study", "lora-bench campaign", w, e2, sizeof(e2)) < 0 ||
        get_str(cfg, "base_url", "http://127.0.0.1:8000", w, e2, sizeof(e2)) < 0 ||
        get_str(cfg, "metrics_url", NULL, w, e2, sizeof(e2)) < 0 ||
        get_str(cfg, "model", NULL, w, e2, sizeof(e2)) < 0 ||
        get_int(cfg, "repetitions", 1, 1, 1000, w, e2, sizeof(e2)) < 0 ||
        get_int(cfg, "input_tokens", 128, 1, 1 << 24, w, e2, sizeof(e2)) < 0 ||
        get_int(cfg, "output_tokens", 128, 1, 1 << 24, w, e2, sizeof(e2)) < 0 ||
        get_num(cfg, "range_ratio", 0, 0, 0.999999, w, e2, sizeof(e2)) < 0 ||
        get_int(cfg, "vocab_size", 256, 1, 1 << 30, w, e2, sizeof(e2)) < 0 ||
        get_int(cfg, "seed", 0, 0, (long long)1 << 53, w, e2, sizeof(e2)) < 0 ||
        get_num(cfg, "request_timeout", 600, 0, 1e9, w, e2, sizeof(e2)) < 0 ||
        get_num(cfg, "idle_seconds", 10, 0, 86400, w, e2, sizeof(e2)) < 0 ||
        get_int(cfg, "warmup_prompts", 0, 0, 1 << 20, w, e2, sizeof(e2)) < 0)
        goto bad_e2;
    const char *base = json_string_value(json_object_get(cfg, "base_url"));
    if (strncmp(base, "http://", 7) != 0 && strncmp(base, "https://", 8) != 0) {
        snprintf(e2, sizeof(e2), "base_url: must start with http:// or https://");
        goto bad_e2;
    }
    json_t *np = json_object_get(cfg, "num_prompts"),
           *npc = json_object_get(cfg, "num_prompts_per_concurrency");
    if (np && npc) {
        snprintf(e2, sizeof(e2), "give num_prompts or num_prompts_per_concurrency, not both");
        goto bad_e2;
    }
    if (npc) {
        if (get_int(cfg, "num_prompts_per_concurrency", 1, 1, 1 << 20, w, e2, sizeof(e2)) < 0)
            goto bad_e2;
    } else if (get_int(cfg, "num_prompts", 100, 1, 1 << 24, w, e2, sizeof(e2)) < 0) {
        goto bad_e2;
    }
    json_t *rr = json_object_get(cfg, "request_rate");
    if (!rr) {
        json_object_set_new(cfg, "request_rate", json_string("inf"));
    } else if (!(json_is_string(rr) && strcmp(json_string_value(rr), "inf") == 0) &&
               !(json_is_number(rr) && json_number_value(rr) > 0)) {
        snprintf(e2, sizeof(e2), "request_rate: must be a positive number or \"inf\"");
        goto bad_e2;
    }
    json_t *ie = json_object_get(cfg, "ignore_eos");
    if (!ie)
        json_object_set_new(cfg, "ignore_eos", json_true());
    else if (!json_is_boolean(ie)) {
        snprintf(e2, sizeof(e2), "ignore_eos: must be true or false");
        goto bad_e2;
    }
    json_t *cs = json_object_get(cfg, "concurrencies");
    if (!json_is_array(cs) || !json_array_size(cs)) {
        snprintf(e2, sizeof(e2), "concurrencies: must be a non-empty array of integers");
        goto bad_e2;
    }
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        if (!json_is_integer(c) || json_integer_value(c) < 1 || json_integer_value(c) > 100000) {
            snprintf(e2, sizeof(e2), "concurrencies[%zu]: must be an integer from 1 to 100000", i);
            goto bad_e2;
        }
    }
    if (check_configurations(cfg, e2, sizeof(e2)) < 0)
        goto bad_e2;
    json_t *pr = json_object_get(cfg, "processes");
    if (!pr)
        json_object_set_new(cfg, "processes", pr = json_object());
    static const char *const pkeys[] = {"run_dir", "pids", "description", NULL};
    if (!json_is_object(pr) || check_keys(pr, pkeys, "processes", e2, sizeof(e2)) < 0 ||
        get_str(pr, "run_dir", NULL, "processes", e2, sizeof(e2)) < 0) {
        if (!json_is_object(pr))
            snprintf(e2, sizeof(e2), "processes: must be an object (run_dir, pids)");
        goto bad_e2;
    }
    json_t *pids = json_object_get(pr, "pids");
    if (pids) {
        bool ok = json_is_array(pids) && json_array_size(pids) <= 64;
        for (size_t i = 0; ok && i < json_array_size(pids); i++)
            ok = json_integer_value(json_array_get(pids, i)) > 0;
        if (!ok) {
            snprintf(e2, sizeof(e2), "processes.pids: must be an array of at most 64 pids");
            goto bad_e2;
        }
    }
    json_t *en = json_object_get(cfg, "energy");
    if (!en)
        json_object_set_new(cfg, "energy", en = json_object());
    static const char *const ekeys[] = {"nvml", "powercap_dir", "description", NULL};
    if (!json_is_object(en) || check_keys(en, ekeys, "energy", e2, sizeof(e2)) < 0 ||
        get_str(en, "powercap_dir", "/sys/class/powercap", "energy", e2, sizeof(e2)) < 0) {
        if (!json_is_object(en))
            snprintf(e2, sizeof(e2), "energy: must be an object (nvml, powercap_dir)");
        goto bad_e2;
    }
    if (!json_object_get(en, "nvml"))
        json_object_set_new(en, "nvml", json_true());
    else if (!json_is_boolean(json_object_get(en, "nvml"))) {
        snprintf(e2, sizeof(e2), "energy.nvml: must be true or false");
        goto bad_e2;
    }
    if (check_rules(cfg, e2, sizeof(e2)) < 0)
        goto bad_e2;
    json_object_del(cfg, "quick");
    json_object_set_new(cfg, "quick_applied", json_boolean(quick));
    return cfg;
bad_e2:
    lora_errf(err, err_len, "%s: %s", path, e2);
bad:
    json_decref(cfg);
    return NULL;
}

/* ---- the plan --------------------------------------------------------------------------- */

static json_t *make_plan(const json_t *cfg)
{
    json_t *confs = json_object_get(cfg, "configurations"),
           *cs = json_object_get(cfg, "concurrencies");
    size_t nc = json_array_size(confs), nk = json_array_size(cs), m = nc * nk;
    long rounds = (long)json_integer_value(json_object_get(cfg, "repetitions"));
    json_t *cells = json_array();
    long k = 0;

    for (long r = 0; r < rounds; r++) {
        size_t offset = (size_t)r * m / (size_t)rounds;
        for (size_t p = 0; p < m; p++) {
            size_t j = (offset + p) % m;
            const json_t *conf = json_array_get(confs, j / nk);
            json_array_append_new(
                cells, json_pack("{s:I, s:I, s:I, s:I, s:O, s:O}", "cell", (json_int_t)k++, "round",
                                 (json_int_t)r, "position", (json_int_t)p, "repetition",
                                 (json_int_t)r, "configuration", json_object_get(conf, "name"),
                                 "concurrency", json_array_get(cs, j % nk)));
        }
    }
    json_t *idle = json_array();
    if (json_real_value(json_object_get(cfg, "idle_seconds")) > 0) {
        json_array_append_new(idle, json_pack("{s:s, s:I}", "name", "start", "before_cell", 0));
        json_array_append_new(
            idle, json_pack("{s:s, s:I}", "name", "middle", "before_cell", (json_int_t)(k / 2)));
        json_array_append_new(idle,
                              json_pack("{s:s, s:I}", "name", "end", "before_cell", (json_int_t)k));
    }
    return json_pack("{s:o, s:o}", "cells", cells, "idle", idle);
}

/* ---- running ---------------------------------------------------------------------------- */

struct campaign {
    json_t *cfg, *plan;
    const char *dir;
    const char *base_url, *metrics_url;
    char base_model[1024];
    struct procs_spec procs;
    struct energy *energy;
    /* the progress line */
    bool tty;
    double t0;
    long n_cells, to_run, ran;
    char what[256];
};

static void progress(struct campaign *c, long req_done, long req_n)
{
    if (!c->tty)
        return;
    double now = lora_clock_mono(), el = now - c->t0;
    char left[64] = "estimating";
    /* Cells of this run so far, the current one in part, predict the rest. */
    double done = (double)c->ran + (req_n ? (double)req_done / (double)req_n : 0);
    if (done > 0.05) {
        double rest = el / done * ((double)c->to_run - done);
        snprintf(left, sizeof(left), "about %ldm%02lds left", (long)rest / 60, (long)rest % 60);
    }
    fprintf(stderr, "\rlora-bench: %s; %ldm%02lds elapsed, %s\033[K", c->what, (long)el / 60,
            (long)el % 60, left);
}

static void on_request_done(void *ctx, long done, long n)
{
    progress(ctx, done, n);
}

static char *fetch_metrics(const struct campaign *c, char *err, size_t err_len)
{
    struct lora_buf b = {0};
    long st = client_get(c->metrics_url, NULL, 30, SCRAPE_MAX_BYTES, &b, err, err_len);
    if (st != 200) {
        if (st >= 0)
            lora_errf(err, err_len, "%s answered HTTP %ld", c->metrics_url, st);
        lora_buf_release(&b);
        return NULL;
    }
    if (lora_buf_add(&b, "", 0) < 0) {
        lora_buf_release(&b);
        lora_errf(err, err_len, "out of memory");
        return NULL;
    }
    return b.data;
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* Per adapter: {name: {generation_tokens, prompt_tokens}} moved between two scrapes. */
static json_t *adapter_deltas(const char *before, const char *after)
{
    static const char *const fam[2] = {"lora_adapter_generation_tokens_total",
                                       "lora_adapter_prompt_tokens_total"};
    static const char *const key[2] = {"generation_tokens", "prompt_tokens"};
    json_t *out = json_object();
    for (int f = 0; f < 2; f++) {
        json_t *b = scrape_by_label(before, fam[f], "adapter_name");
        json_t *a = scrape_by_label(after, fam[f], "adapter_name");
        const char *name;
        json_t *v;
        json_object_foreach (a, name, v) {
            double d = json_real_value(v) - json_real_value(json_object_get(b, name));
            if (d == 0)
                continue;
            json_t *e = json_object_get(out, name);
            if (!e)
                json_object_set_new(out, name, e = json_object());
            json_object_set_new(e, key[f], json_real(d));
        }
        json_decref(a);
        json_decref(b);
    }
    return out;
}

/* What the server's counters say about a cell, scraping again until the generation counter
 * moved by client_tokens or stopped moving. */
static json_t *server_side(const struct campaign *c, const char *before, long client_tokens)
{
    char err[1024];
    json_t *s = json_object();
    double t0 = lora_clock_mono(), prev = -1;
    char *after = NULL;

    if (!before) {
        json_object_set_new(s, "scrape_error", json_string("no scrape before the cell"));
        return s;
    }
    double gen0 = scrape_sum(before, "vllm:generation_tokens_total", NULL, NULL, NULL);
    for (;;) {
        free(after);
        after = fetch_metrics(c, err, sizeof(err));
        if (!after) {
            json_object_set_new(s, "scrape_error", json_string(err));
            return s;
        }
        double moved = scrape_sum(after, "vllm:generation_tokens_total", NULL, NULL, NULL) - gen0;
        double waited = lora_clock_mono() - t0;
        if (moved == (double)client_tokens || waited > SETTLE_S || (moved == prev && waited > 1.5))
            break;
        prev = moved;
        usleep(100000);
    }
    bool fb, fa, sb, sa;
    json_object_set_new(s, "scrape_error", json_null());
    json_object_set_new(s, "settle_s", json_real(lora_clock_mono() - t0));
    double gen = scrape_sum(after, "vllm:generation_tokens_total", NULL, NULL, &fa) -
                 scrape_sum(before, "vllm:generation_tokens_total", NULL, NULL, &fb);
    double prm = scrape_sum(after, "vllm:prompt_tokens_total", NULL, NULL, NULL) -
                 scrape_sum(before, "vllm:prompt_tokens_total", NULL, NULL, NULL);
    json_object_set_new(s, "generation_tokens", fa && fb ? json_real(gen) : json_null());
    json_object_set_new(s, "prompt_tokens", fa && fb ? json_real(prm) : json_null());
    json_object_set_new(s, "tokens_match", json_boolean(fa && fb && gen == (double)client_tokens));
    double sum = scrape_sum(after, "lora_step_adapters_sum", NULL, NULL, &sa) -
                 scrape_sum(before, "lora_step_adapters_sum", NULL, NULL, &sb);
    double cnt = scrape_sum(after, "lora_step_adapters_count", NULL, NULL, NULL) -
                 scrape_sum(before, "lora_step_adapters_count", NULL, NULL, NULL);
    if (sa && sb && cnt > 0) {
        json_object_set_new(s, "mean_step_adapters", json_real(sum / cnt));
        json_object_set_new(s, "steps", json_real(cnt));
    } else {
        /* A gauge of the same name, where a server exposes one: its two readings' mean. */
        bool g1, g2;
        double a = scrape_sum(after, "lora_step_adapters", NULL, NULL, &g1);
        double b = scrape_sum(before, "lora_step_adapters", NULL, NULL, &g2);
        json_object_set_new(s, "mean_step_adapters",
                            g1 && g2 ? json_real((a + b) / 2) : json_null());
        json_object_set_new(s, "steps", json_null());
    }
    json_object_set_new(s, "adapters", adapter_deltas(before, after));
    free(after);
    return s;
}

static json_t *measure_idle(struct campaign *c, const char *name)
{
    char err[1024];
    double secs = num(c->cfg, "idle_seconds");
    json_t *p0 = procs_snapshot(&c->procs, err, sizeof(err));
    json_t *e0 = energy_snapshot(c->energy);
    double u0 = lora_clock_unix(), m0 = lora_clock_mono();
    snprintf(c->what, sizeof(c->what), "idle measurement (%s), %.0f s", name, secs);
    progress(c, 0, 0);
    while (lora_clock_mono() - m0 < secs)
        usleep(50000);
    double m1 = lora_clock_mono();
    json_t *e1 = energy_snapshot(c->energy);
    json_t *p1 = procs_snapshot(&c->procs, err, sizeof(err));
    double j = e0 && e1 ? energy_delta(e0, e1) : -1;
    json_t *r = json_pack("{s:i, s:s, s:f, s:{s:f, s:f}}", "version", 1, "name", name, "seconds",
                          m1 - m0, "window", "start", u0, "end", u0 + (m1 - m0));
    json_object_set_new(r, "energy", energy_describe(c->energy));
    json_object_set_new(json_object_get(r, "energy"), "joules",
                        j >= 0 ? json_real(j) : json_null());
    json_object_set_new(r, "watts", j >= 0 ? json_real(j / (m1 - m0)) : json_null());
    json_object_set_new(r, "cpu", p0 && p1 ? procs_delta(p0, p1) : json_null());
    json_decref(p0);
    json_decref(p1);
    json_decref(e0);
    json_decref(e1);
    return r;
}

static const char *model_of(const struct campaign *c)
{
    const char *m = json_string_value(json_object_get(c->cfg, "model"));
    return m ? m : c->base_model;
}

static json_t *run_cell(struct campaign *c, const json_t *cell)
{
    const char *name = json_string_value(json_object_get(cell, "configuration"));
    const json_t *conf = find_configuration(c->cfg, name);
    json_t *ad = json_object_get(conf, "adapters");
    long conc = (long)json_integer_value(json_object_get(cell, "concurrency"));
    long rep = (long)json_integer_value(json_object_get(cell, "repetition"));
    json_t *npc = json_object_get(c->cfg, "num_prompts_per_concurrency");
    long n = npc ? (long)json_integer_value(npc) * conc
                 : (long)json_integer_value(json_object_get(c->cfg, "num_prompts"));
    const char *names[LORA_OPT_LIST_MAX];
    char err[2048], api_url[2048];
    json_t *rr = json_object_get(c->cfg, "request_rate");

    for (size_t i = 0; i < json_array_size(ad); i++)
        names[i] = json_string_value(json_array_get(ad, i));
    snprintf(api_url, sizeof(api_url), "%s/v1/completions", c->base_url);
    struct serve_options so = {
        .base_url = c->base_url,
        .model = model_of(c),
        .lora_modules = names,
        .n_lora_modules = (int)json_array_size(ad),
        .data = {.num_prompts = n,
                 .input_len = (long)json_integer_value(json_object_get(c->cfg, "input_tokens")),
                 .output_len = (long)json_integer_value(json_object_get(c->cfg, "output_tokens")),
                 .vocab_size = (long)json_integer_value(json_object_get(c->cfg, "vocab_size")),
                 .range_ratio = num(c->cfg, "range_ratio"),
                 /* The same prompts for every configuration of a repetition. */
                 .seed =
                     (uint64_t)json_integer_value(json_object_get(c->cfg, "seed")) + (uint64_t)rep},
        .client = {.api_url = api_url,
                   .api_key = getenv("OPENAI_API_KEY"),
                   .request_rate = json_is_string(rr) ? INFINITY : json_number_value(rr),
                   .burstiness = 1.0,
                   .max_concurrency = conc,
                   .ignore_eos = json_is_true(json_object_get(c->cfg, "ignore_eos")),
                   .timeout_s = num(c->cfg, "request_timeout"),
                   .seed = (uint64_t)json_integer_value(json_object_get(c->cfg, "seed")) +
                           (uint64_t)rep,
                   .on_done = on_request_done,
                   .on_done_ctx = c},
        .metrics = {true, true, true, true},
        .percentiles = {50, 90, 99},
        .n_percentiles = 3,
        .quiet = true,
    };
    json_t *out = json_deep_copy(cell);
    json_object_set_new(out, "version", json_integer(1));
    json_object_set(out, "adapters", ad);
    json_object_set(out, "distinct", json_object_get(conf, "distinct"));
    json_object_set(out, "traffic", json_object_get(conf, "traffic"));
    json_object_set_new(out, "num_prompts", json_integer(n));
    json_object_set_new(out, "model", json_string(model_of(c)));

    char *before = fetch_metrics(c, err, sizeof(err));
    json_t *scrape_err = before ? NULL : json_string(err);
    json_t *p0 = procs_snapshot(&c->procs, err, sizeof(err));
    json_t *e0 = energy_snapshot(c->energy);
    double m0 = lora_clock_mono(), u0 = lora_clock_unix();
    char serve_err[2048] = "";
    json_t *res = serve_run(&so, serve_err, sizeof(serve_err));
    double m1 = lora_clock_mono(), u1 = u0 + (m1 - m0);
    json_t *e1 = energy_snapshot(c->energy);
    json_t *p1 = procs_snapshot(&c->procs, err, sizeof(err));

    json_object_set_new(out, "window", json_pack("{s:f, s:f}", "start", u0, "end", u1));
    long tokens = res ? (long)json_integer_value(json_object_get(res, "total_output_tokens")) : 0;
    json_object_set_new(out, "tokens", json_integer(tokens));
    if (!res) {
        json_object_set_new(out, "status", json_string("error"));
        json_object_set_new(out, "error", json_string(serve_err));
    }
    /* Containment: every request's start and end within the window. */
    json_t *outside = json_array();
    json_t *st = json_object_get(res, "start_times"), *en = json_object_get(res, "end_times");
    for (size_t i = 0; i < json_array_size(st); i++) {
        double a = json_real_value(json_array_get(st, i)),
               b = json_real_value(json_array_get(en, i));
        if (a < u0 || b > u1 || b < a)
            json_array_append_new(outside, json_integer((json_int_t)i));
    }
    bool contained = res && json_array_size(outside) == 0;
    json_object_set_new(out, "contained", json_boolean(contained));
    json_object_set_new(out, "outside", outside);
    /* The failures, by message. */
    json_t *errors = json_object();
    json_t *e;
    size_t i;
    json_array_foreach (json_object_get(res, "errors"), i, e) {
        const char *m = json_string_value(e);
        if (m && *m)
            json_object_set_new(errors, m,
                                json_integer(json_integer_value(json_object_get(errors, m)) + 1));
    }
    json_object_set_new(out, "errors", errors);
    if (res) {
        long failed = (long)json_integer_value(json_object_get(res, "failed"));
        json_object_set_new(out, "status",
                            json_string(!contained ? "not contained"
                                        : failed   ? "failed requests"
                                                   : "ok"));
        json_object_set_new(out, "error", json_null());
    }

    json_t *server = server_side(c, before, tokens);
    if (scrape_err)
        json_object_set_new(server, "scrape_error", scrape_err);
    json_object_set_new(out, "server", server);

    json_t *cpu = p0 && p1 ? procs_delta(p0, p1) : json_pack("{s:s}", "error", err);
    json_object_set_new(cpu, "client_s", json_real(res ? num(res, "client_cpu_s") : 0));
    json_object_set_new(out, "cpu", cpu);
    double j = e0 && e1 ? energy_delta(e0, e1) : -1;
    json_t *energy = energy_describe(c->energy);
    json_object_set_new(energy, "joules", j >= 0 ? json_real(j) : json_null());
    json_object_set_new(energy, "seconds", json_real(m1 - m0));
    json_object_set_new(out, "energy", energy);

    double dur = res ? num(res, "duration") : 0;
    json_t *cost = json_object();
    json_object_set_new(cost, "time_per_token",
                        tokens ? json_real(dur / (double)tokens) : json_null());
    json_object_set_new(cost, "cpu_per_token",
                        tokens && json_is_number(json_object_get(cpu, "total_s"))
                            ? json_real(num(cpu, "total_s") / (double)tokens)
                            : json_null());
    json_object_set_new(cost, "energy_per_token_gross",
                        tokens && j >= 0 ? json_real(j / (double)tokens) : json_null());
    json_object_set_new(out, "cost", cost);
    json_object_set_new(out, "result", res ? res : json_null());
    free(before);
    json_decref(p0);
    json_decref(p1);
    json_decref(e0);
    json_decref(e1);
    return out;
}

/* ---- the subcommand --------------------------------------------------------------------- */

#define CAMPAIGN_USAGE_TEXT                                                                        \
    "usage: lora-bench campaign CONFIG --output-dir DIR [--quick] [OPTIONS]\n"                     \
    "       lora-bench campaign CONFIG --dry-run [--quick]"

struct campaign_args {
    const char *dir, *base_url, *metrics_url, *run_dir, *pids;
    bool quick, dry, help, version;
};

#define CAMPAIGN_N_OPTS 10

static void campaign_table(struct campaign_args *a, struct lora_cli_opt *t)
{
    const struct lora_cli_opt opts[CAMPAIGN_N_OPTS] = {
        {"output-dir", LORA_OPT_STRING, &a->dir, "DIR",
         "the campaign's directory: its plan, a file per cell, the idle measurements"},
        {"quick", LORA_OPT_FLAG, &a->quick, NULL,
         "one repetition of small cells (the configuration's \"quick\" overrides)"},
        {"dry-run", LORA_OPT_FLAG, &a->dry, NULL, "print the plan and run nothing"},
        {"base-url", LORA_OPT_STRING, &a->base_url, "URL", "the server, over the configuration's"},
        {"metrics-url", LORA_OPT_STRING, &a->metrics_url, "URL",
         "where to scrape (default BASE_URL/metrics)"},
        {"run-dir", LORA_OPT_STRING, &a->run_dir, "DIR",
         "the stack's processes are those of lora-stack's RUN_DIR/pids"},
        {"pids", LORA_OPT_STRING, &a->pids, "LIST", "the stack's processes are these pids"},
        {"help", LORA_OPT_FLAG, &a->help, NULL, "show this help"},
        {"version", LORA_OPT_FLAG, &a->version, NULL, "show the version"},
        {0},
    };
    memcpy(t, opts, sizeof(opts));
}

void campaign_usage(FILE *f)
{
    struct campaign_args a = {0};
    struct lora_cli_opt opts[CAMPAIGN_N_OPTS];
    campaign_table(&a, opts);
    fprintf(f, "%s\n\n", CAMPAIGN_USAGE_TEXT);
    lora_cli_usage(f, opts);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The server's first model, for configurations without adapters: 0, -1 when the server
 * cannot be reached, -2 when it answers without a model. */
static int resolve_model(struct campaign *c, char *err, size_t err_len)
{
    struct lora_buf b = {0};
    char url[2048];
    json_error_t je;

    snprintf(url, sizeof(url), "%s/v1/models", c->base_url);
    long st = client_get(url, getenv("OPENAI_API_KEY"), 30, 16 << 20, &b, err, err_len);
    if (st < 0) {
        lora_buf_release(&b);
        return -1;
    }
    json_t *j = b.len ? json_loadb(b.data, b.len, 0, &je) : NULL;
    const char *id =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (st == 200 && id)
        snprintf(c->base_model, sizeof(c->base_model), "%s", id);
    else
        lora_errf(err, err_len, "%s answered HTTP %ld without a model; set \"model\"", url, st);
    json_decref(j);
    lora_buf_release(&b);
    return st == 200 && id ? 0 : -2;
}

int campaign_main(int argc, char **argv)
{
    struct campaign_args a = {0};
    struct lora_cli_opt opts[CAMPAIGN_N_OPTS];
    char err[4096], path[4096];
    struct campaign c = {0};
    int rc = EXIT_SYSTEM;

    campaign_table(&a, opts);
    const char *dir, *base_url, *metrics_url, *run_dir, *pids;
    bool quick, dry;
    const char *config = argc > 1 && strncmp(argv[1], "-", 1) != 0 ? argv[1] : NULL;
    if (lora_cli_parse(opts, "LORA_BENCH", argc, argv, config ? 2 : 1, err, sizeof(err)) < 0)
        goto usage;
    if (a.help) {
        campaign_usage(stdout);
        return 0;
    }
    dir = a.dir, base_url = a.base_url, metrics_url = a.metrics_url, run_dir = a.run_dir;
    pids = a.pids, quick = a.quick, dry = a.dry;
    if (a.version) {
        puts("lora-bench " LORA_VERSION);
        return 0;
    }
    if (!config) {
        snprintf(err, sizeof(err), "give the configuration file: lora-bench campaign CONFIG");
        goto usage;
    }
    if (!dir && !dry) {
        snprintf(err, sizeof(err), "give --output-dir DIR (or --dry-run)");
        goto usage;
    }
    c.cfg = campaign_config_load(config, quick, err, sizeof(err));
    if (!c.cfg)
        goto usage;
    if (base_url)
        json_object_set_new(c.cfg, "base_url", json_string(base_url));
    if (metrics_url)
        json_object_set_new(c.cfg, "metrics_url", json_string(metrics_url));
    if (run_dir)
        json_object_set_new(json_object_get(c.cfg, "processes"), "run_dir", json_string(run_dir));
    if (pids) {
        int ids[64];
        int n = lora_cli_parse_ints(pids, ids, 64);
        if (n <= 0) {
            snprintf(err, sizeof(err), "--pids must be a comma-separated list of pids");
            goto usage;
        }
        json_t *list = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(list, json_integer(ids[i]));
        json_object_set_new(json_object_get(c.cfg, "processes"), "pids", list);
    }
    /* base_url without its trailing slashes; metrics_url defaults to BASE/metrics. */
    char base[1024], murl[2048];
    const char *b0 = json_string_value(json_object_get(c.cfg, "base_url"));
    size_t bl = strlen(b0);
    while (bl && b0[bl - 1] == '/')
        bl--;
    snprintf(base, sizeof(base), "%.*s", (int)bl, b0);
    json_object_set_new(c.cfg, "base_url", json_string(base));
    if (!json_string_value(json_object_get(c.cfg, "metrics_url"))) {
        snprintf(murl, sizeof(murl), "%s/metrics", base);
        json_object_set_new(c.cfg, "metrics_url", json_string(murl));
    }
    c.base_url = json_string_value(json_object_get(c.cfg, "base_url"));
    c.metrics_url = json_string_value(json_object_get(c.cfg, "metrics_url"));
    c.plan = make_plan(c.cfg);
    json_t *cells = json_object_get(c.plan, "cells"), *idle = json_object_get(c.plan, "idle");
    c.n_cells = (long)json_array_size(cells);

    if (dry) {
        size_t i;
        json_t *cell;
        printf("%ld cells, %zu idle measurements of %g s\n", c.n_cells, json_array_size(idle),
               num(c.cfg, "idle_seconds"));
        json_array_foreach (cells, i, cell) {
            printf("cell %3zu  round %lld  %-24s concurrency %lld\n", i,
                   (long long)json_integer_value(json_object_get(cell, "round")),
                   json_string_value(json_object_get(cell, "configuration")),
                   (long long)json_integer_value(json_object_get(cell, "concurrency")));
        }
        json_decref(c.cfg);
        json_decref(c.plan);
        return 0;
    }

    json_t *pr = json_object_get(c.cfg, "processes");
    c.procs.run_dir = json_string_value(json_object_get(pr, "run_dir"));
    for (size_t i = 0; i < json_array_size(json_object_get(pr, "pids")); i++)
        c.procs.pids[c.procs.n_pids++] =
            (long)json_integer_value(json_array_get(json_object_get(pr, "pids"), i));
    json_t *en = json_object_get(c.cfg, "energy");
    c.energy = energy_open(json_is_true(json_object_get(en, "nvml")),
                           json_string_value(json_object_get(en, "powercap_dir")));

    /* The directory: new, or one holding this very plan. */
    c.dir = dir;
    snprintf(path, sizeof(path), "%s/cells", dir);
    if (lora_fs_mkdir_p(path, err, sizeof(err)) < 0)
        goto fail;
    snprintf(path, sizeof(path), "%s/campaign.json", dir);
    json_t *doc = json_pack("{s:i, s:s, s:O, s:O}", "version", 1, "program",
                            "lora-bench " LORA_VERSION, "config", c.cfg, "plan", c.plan);
    if (exists(path)) {
        char e2[1024];
        json_t *old = lora_json_file_load(path, e2, sizeof(e2));
        bool same = old && json_equal(json_object_get(old, "config"), c.cfg) &&
                    json_equal(json_object_get(old, "plan"), c.plan);
        json_decref(old);
        if (!same) {
            json_decref(doc);
            snprintf(err, sizeof(err),
                     "%s holds another campaign (its campaign.json has another configuration "
                     "or plan); give a new --output-dir",
                     dir);
            rc = EXIT_USAGE;
            goto fail;
        }
    } else {
        char host[256] = "";
        gethostname(host, sizeof(host) - 1);
        json_object_set_new(doc, "started", json_real(lora_clock_unix()));
        json_object_set_new(doc, "host", json_string(host));
        json_object_set_new(doc, "cpus", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
        json_object_set_new(doc, "energy", energy_describe(c.energy));
        if (files_write_json(path, doc, err, sizeof(err)) < 0) {
            json_decref(doc);
            goto fail;
        }
    }
    json_decref(doc);

    /* The server must answer before anything is measured. */
    int mr = resolve_model(&c, err, sizeof(err));
    if (mr == -1) {
        fprintf(stderr, "lora-bench: fatal: unable to reach the server: %s\n", err);
        energy_close(&c.energy);
        json_decref(c.cfg);
        json_decref(c.plan);
        return EXIT_SYSTEM;
    }
    if (mr == -2 && !json_string_value(json_object_get(c.cfg, "model"))) {
        rc = EXIT_BAD_INPUT;
        goto fail;
    }
    {
        char e2[1024];
        char *m = fetch_metrics(&c, e2, sizeof(e2));
        if (!m)
            fprintf(stderr, "lora-bench: warning: %s: the cells will have no server counters\n",
                    e2);
        free(m);
    }
    for (size_t i = 0; i < json_array_size(cells); i++) {
        snprintf(path, sizeof(path), "%s/cells/cell-%03zu.json", dir, i);
        c.to_run += !exists(path);
    }
    c.tty = isatty(2);
    c.t0 = lora_clock_mono();
    long warm = (long)json_integer_value(json_object_get(c.cfg, "warmup_prompts"));
    if (warm && c.to_run) {
        /* Warm-up: not a cell, not measured. */
        snprintf(path, sizeof(path), "%s/v1/completions", c.base_url);
        struct serve_options so = {
            .base_url = c.base_url,
            .model = model_of(&c),
            .quiet = true,
            .data = {.num_prompts = warm, .input_len = 8, .output_len = 8, .vocab_size = 256},
            .client = {.api_url = path,
                       .api_key = getenv("OPENAI_API_KEY"),
                       .request_rate = INFINITY,
                       .burstiness = 1,
                       .max_concurrency = 4,
                       .timeout_s = num(c.cfg, "request_timeout")},
        };
        snprintf(c.what, sizeof(c.what), "warm-up, %ld requests", warm);
        progress(&c, 0, 0);
        json_decref(serve_run(&so, err, sizeof(err)));
    }

    long kept = 0, bad = 0, mismatched = 0;
    size_t next_idle = 0;
    for (long k = 0; k <= c.n_cells; k++) {
        while (next_idle < json_array_size(idle) &&
               json_integer_value(
                   json_object_get(json_array_get(idle, next_idle), "before_cell")) == k) {
            const char *iname =
                json_string_value(json_object_get(json_array_get(idle, next_idle), "name"));
            snprintf(path, sizeof(path), "%s/idle-%s.json", dir, iname);
            next_idle++;
            if (exists(path))
                continue;
            json_t *m = measure_idle(&c, iname);
            int w = files_write_json(path, m, err, sizeof(err));
            json_decref(m);
            if (w < 0)
                goto fail;
        }
        if (k == c.n_cells)
            break;
        const json_t *cell = json_array_get(cells, (size_t)k);
        snprintf(path, sizeof(path), "%s/cells/cell-%03ld.json", dir, k);
        if (exists(path))
            continue; /* kept: never run again */
        snprintf(c.what, sizeof(c.what), "cell %ld of %ld (%s, concurrency %lld, round %lld)",
                 k + 1, c.n_cells, json_string_value(json_object_get(cell, "configuration")),
                 (long long)json_integer_value(json_object_get(cell, "concurrency")),
                 (long long)json_integer_value(json_object_get(cell, "round")) + 1);
        progress(&c, 0, 0);
        json_t *r = run_cell(&c, cell);
        int w = files_write_json(path, r, err, sizeof(err));
        const char *status = json_string_value(json_object_get(r, "status"));
        bool ok = strcmp(status, "ok") == 0;
        bad += !ok;
        mismatched += !json_is_true(json_object_get(json_object_get(r, "server"), "tokens_match"));
        kept++;
        c.ran++;
        if (c.tty)
            fputs("\r\033[K", stderr);
        json_t *cost = json_object_get(r, "cost");
        printf("cell %ld/%ld %s concurrency %lld round %lld: %lld tokens, %.3f ms/token, %s\n",
               k + 1, c.n_cells, json_string_value(json_object_get(cell, "configuration")),
               (long long)json_integer_value(json_object_get(cell, "concurrency")),
               (long long)json_integer_value(json_object_get(cell, "round")) + 1,
               (long long)json_integer_value(json_object_get(r, "tokens")),
               json_number_value(json_object_get(cost, "time_per_token")) * 1000, status);
        fflush(stdout);
        json_decref(r);
        if (w < 0)
            goto fail;
    }
    if (c.tty)
        fputs("\r\033[K", stderr);
    printf("campaign: %ld cells in %s (%ld run now, %ld kept from before); %ld with failed "
           "requests or outside their window; %ld whose server counters did not match the "
           "client's tokens\nnext: lora-bench report %s\n",
           c.n_cells, dir, kept, c.n_cells - kept, bad, mismatched, dir);
    rc = bad ? EXIT_NO : 0;
    energy_close(&c.energy);
    json_decref(c.cfg);
    json_decref(c.plan);
    return rc;
usage:
    fprintf(stderr, "lora-bench: fatal: %s\n", err);
    json_decref(c.cfg);
    return EXIT_USAGE;
fail:
    if (c.tty)
        fputs("\r\033[K", stderr);
    fprintf(stderr, "lora-bench: fatal: %s\n", err);
    energy_close(&c.energy);
    json_decref(c.cfg);
    json_decref(c.plan);
    return rc;
}
