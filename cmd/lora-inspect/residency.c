/* lora-inspect residency: where every adapter sits on every rank, from the engine's residency
 * reply (man/lora-engine.1, CONTROL).
 *
 * The reply holds each rank's last gathered state (its slots, CPU cache and pinned set) and the
 * engine's registry with the scheduler's view of each adapter (running and waiting requests,
 * last used step). The records cross the two: every adapter that is registered or that any
 * rank holds gets exactly one record per rank, in registry order, then the held adapters the
 * registry lacks, in the order the ranks list them. A rank's level for an adapter is "gpu"
 * when one of its slots holds it, "cpu" when only its CPU cache does, and otherwise
 * "registered" (the engine knows it, this rank holds nothing) or "none" (not even registered:
 * only seen when another rank still holds an adapter the engine dropped). agree is true when
 * every rank has the same level. Then one "rank" record per rank and one "engine" record.
 * --msgpack writes the reply's data map as the engine sent it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

static const struct cmd_info info = {
    "residency",
    "[--run-dir DIR | --control-endpoint EP] [OPTIONS]",
    "One record per adapter per rank: its level (gpu, cpu or registered), slot, pin, whether\n"
    "every rank agrees, and its requests; then each rank's counts and the engine's summary.",
};

static const char *const columns[] = {"engine", "rank",  "adapter",        "level",   "slot",
                                      "pinned", "agree", "last_used_step", "running", "waiting"};
#define N_COLUMNS ((int)(sizeof(columns) / sizeof(columns[0])))

enum level { LEVEL_NONE, LEVEL_REGISTERED, LEVEL_CPU, LEVEL_GPU };
static const char *const level_names[] = {"none", "registered", "cpu", "gpu"};

/* One rank of the reply, its lists borrowed from the reply's JSON. */
struct rank_view {
    json_int_t rank;
    json_t *slots, *cpu, *pinned;
    json_int_t dropped;
};

struct view {
    json_int_t engine, disagreement;
    int n_ranks;
    struct rank_view *ranks;
    json_t *adapters;   /* the registry, an array of maps */
    const char **names; /* every adapter: registry order, then held but unregistered */
    int n_names;
};

static bool in_list(const json_t *list, const char *name, int *index)
{
    size_t i;
    json_t *v;

    json_array_foreach (list, i, v) {
        if (json_is_string(v) && strcmp(json_string_value(v), name) == 0) {
            if (index)
                *index = (int)i;
            return true;
        }
    }
    return false;
}

/* The array at key of obj (of strings only when strings is set), or NULL with err naming
 * where. */
static json_t *get_array(json_t *obj, const char *key, bool strings, const char *where, char *err,
                         size_t len)
{
    json_t *v = json_object_get(obj, key);

    if (json_is_array(v)) {
        size_t i;
        json_t *s;
        json_array_foreach (v, i, s) {
            if (strings && !json_is_string(s)) {
                snprintf(err, len, "%s%s[%zu]: expected a string", where, key, i);
                return NULL;
            }
        }
        return v;
    }
    snprintf(err, len, "%s%s: expected an array", where, key);
    return NULL;
}

static json_int_t get_int(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

static void add_name(struct view *v, const char *name)
{
    if (!*name)
        return; /* an empty string is a free slot, never an adapter */
    for (int i = 0; i < v->n_names; i++)
        if (strcmp(v->names[i], name) == 0)
            return;
    v->names = must(realloc(v->names, (size_t)(v->n_names + 1) * sizeof(*v->names)));
    v->names[v->n_names++] = name;
}

/* Reads the reply's data into v. 0, or -1 with err. */
static int read_view(json_t *data, struct view *v, char *err, size_t len)
{
    json_t *ranks = get_array(data, "ranks", false, "", err, len);
    size_t i;
    json_t *r, *a;

    memset(v, 0, sizeof(*v));
    if (!ranks || !(v->adapters = get_array(data, "adapters", false, "", err, len)))
        return -1;
    if (json_array_size(ranks) > INSPECT_MAX_RANKS) {
        snprintf(err, len, "ranks: more than %d", INSPECT_MAX_RANKS);
        return -1;
    }
    v->engine = get_int(data, "engine");
    v->disagreement = get_int(data, "disagreement");
    v->n_ranks = (int)json_array_size(ranks);
    v->ranks = must(calloc((size_t)v->n_ranks + 1, sizeof(*v->ranks)));
    json_array_foreach (ranks, i, r) {
        struct rank_view *rv = &v->ranks[i];
        char where[32];
        snprintf(where, sizeof(where), "ranks[%zu].", i);
        if (!json_is_object(r)) {
            snprintf(err, len, "ranks[%zu]: expected a map", i);
            return -1;
        }
        rv->rank = json_is_integer(json_object_get(r, "rank")) ? get_int(r, "rank") : (json_int_t)i;
        rv->dropped = get_int(r, "dropped");
        if (!(rv->slots = get_array(r, "slots", true, where, err, len)) ||
            !(rv->cpu = get_array(r, "cpu", true, where, err, len)) ||
            !(rv->pinned = get_array(r, "pinned", true, where, err, len)))
            return -1;
    }
    json_array_foreach (v->adapters, i, a) {
        json_t *name = json_object_get(a, "name");
        if (!json_is_object(a) || !json_is_string(name)) {
            snprintf(err, len, "adapters[%zu]: expected a map with a name", i);
            return -1;
        }
        add_name(v, json_string_value(name));
    }
    for (int k = 0; k < v->n_ranks; k++) {
        json_t *lists[2] = {v->ranks[k].slots, v->ranks[k].cpu};
        for (int l = 0; l < 2; l++)
            json_array_foreach (lists[l], i, a) {
                add_name(v, json_string_value(a));
            }
    }
    return 0;
}

static json_t *registry_entry(const struct view *v, const char *name)
{
    size_t i;
    json_t *a;

    json_array_foreach (v->adapters, i, a) {
        if (strcmp(json_string_value(json_object_get(a, "name")), name) == 0)
            return a;
    }
    return NULL;
}

static enum level level_on(const struct rank_view *rv, const char *name, bool registered, int *slot)
{
    *slot = -1;
    if (in_list(rv->slots, name, slot))
        return LEVEL_GPU;
    if (in_list(rv->cpu, name, NULL))
        return LEVEL_CPU;
    return registered ? LEVEL_REGISTERED : LEVEL_NONE;
}

static void emit_adapter(struct out *o, const struct view *v, const char *name)
{
    json_t *reg = registry_entry(v, name);
    enum level levels[INSPECT_MAX_RANKS];
    int slots[INSPECT_MAX_RANKS];
    bool agree = true;

    for (int r = 0; r < v->n_ranks; r++) {
        levels[r] = level_on(&v->ranks[r], name, reg != NULL, &slots[r]);
        agree &= levels[r] == levels[0];
    }
    for (int r = 0; r < v->n_ranks; r++) {
        const struct rank_view *rv = &v->ranks[r];
        bool pinned = in_list(rv->pinned, name, NULL);
        json_t *rec = out_new_record("adapter");
        json_object_set_new(rec, "engine", json_integer(v->engine));
        json_object_set_new(rec, "rank", json_integer(rv->rank));
        json_object_set_new(rec, "adapter", json_string(name));
        json_object_set_new(rec, "level", json_string(level_names[levels[r]]));
        json_object_set_new(rec, "slot", json_integer(slots[r]));
        json_object_set_new(rec, "pinned", json_boolean(pinned));
        json_object_set_new(rec, "agree", json_boolean(agree));
        json_object_set_new(rec, "last_used_step", json_integer(get_int(reg, "last_used_step")));
        json_object_set_new(rec, "running", json_integer(get_int(reg, "running")));
        json_object_set_new(rec, "waiting", json_integer(get_int(reg, "waiting")));
        json_object_set_new(rec, "registered", json_boolean(reg != NULL));
        json_t *path = json_object_get(reg, "path");
        json_object_set_new(rec, "path", json_is_string(path) ? json_copy(path) : json_null());

        char *cells[N_COLUMNS];
        for (int c = 0; c < N_COLUMNS; c++)
            cells[c] = must(out_cell(json_object_get(rec, columns[c])));
        out_record(o, rec, (const char *const *)cells);
        for (int c = 0; c < N_COLUMNS; c++)
            free(cells[c]);
        json_decref(rec);
    }
}

static int used_slots(const json_t *slots)
{
    size_t i;
    json_t *s;
    int n = 0;

    json_array_foreach (slots, i, s) {
        n += *json_string_value(s) != 0;
    }
    return n;
}

/* The rank and engine records (JSON) or the lines under the table. */
static void emit_summary(struct out *o, const struct view *v)
{
    char line[512];

    for (int r = 0; r < v->n_ranks; r++) {
        const struct rank_view *rv = &v->ranks[r];
        json_t *rec = out_new_record("rank");
        json_object_set_new(rec, "engine", json_integer(v->engine));
        json_object_set_new(rec, "rank", json_integer(rv->rank));
        json_object_set_new(rec, "slots", json_integer((json_int_t)json_array_size(rv->slots)));
        json_object_set_new(rec, "slots_used", json_integer(used_slots(rv->slots)));
        json_object_set_new(rec, "cpu", json_integer((json_int_t)json_array_size(rv->cpu)));
        json_object_set_new(rec, "pinned", json_integer((json_int_t)json_array_size(rv->pinned)));
        json_object_set_new(rec, "dropped", json_integer(rv->dropped));
        if (o->format == OUT_JSON)
            out_record(o, rec, NULL);
        json_decref(rec);
    }
    json_t *rec = out_new_record("engine");
    json_object_set_new(rec, "engine", json_integer(v->engine));
    json_object_set_new(rec, "world_size", json_integer(v->n_ranks));
    json_object_set_new(rec, "registered", json_integer((json_int_t)json_array_size(v->adapters)));
    json_object_set_new(rec, "disagreement", json_integer(v->disagreement));
    if (o->format == OUT_JSON)
        out_record(o, rec, NULL);
    json_decref(rec);

    snprintf(line, sizeof(line),
             "engine %lld: %d rank%s, %zu adapter%s registered, %lld in "
             "disagreement between ranks",
             (long long)v->engine, v->n_ranks, v->n_ranks == 1 ? "" : "s",
             json_array_size(v->adapters), json_array_size(v->adapters) == 1 ? "" : "s",
             (long long)v->disagreement);
    out_footer(o, line);
    for (int r = 0; r < v->n_ranks; r++) {
        const struct rank_view *rv = &v->ranks[r];
        snprintf(line, sizeof(line),
                 "rank %lld: %d of %zu slots used, %zu in the CPU cache, %zu pinned, %lld "
                 "notifications dropped",
                 (long long)rv->rank, used_slots(rv->slots), json_array_size(rv->slots),
                 json_array_size(rv->cpu), json_array_size(rv->pinned), (long long)rv->dropped);
        out_footer(o, line);
    }
}

int cmd_residency(int argc, char **argv)
{
    struct common_opts c;
    args_init(&c);
    const struct lora_cli_opt options[] = {
        OPT_RUN_DIR(&c),    OPT_CONTROL_ENDPOINT(&c),
        OPT_TIMEOUT_MS(&c), OPT_FORMATS(&c),
        OPT_HELP(&c),       {0},
    };
    char epbuf[4200], err[1024];
    struct ctl_reply reply;
    struct view v = {0};
    struct out o;

    int p = args_parse(&info, options, argc, argv, &c);
    if (p != 0)
        return p > 0 ? 0 : EXIT_USAGE;
    const char *ep = args_endpoint(&info, &c, c.control_endpoint, "control-endpoint",
                                   "control.sock", epbuf, sizeof(epbuf));
    if (!ep)
        return EXIT_USAGE;
    if (ctl_request(ep, LORA_CTL_RESIDENCY, c.timeout_ms, &reply, err, sizeof(err)) < 0) {
        die_msg("%s", err);
        return EXIT_SYSTEM;
    }
    int rc = 0;
    if (!reply.ok || !reply.json) {
        die_msg("unable to get residency from '%s': %s", ep,
                reply.error ? reply.error : "the reply has no data");
        rc = EXIT_SYSTEM;
        goto out;
    }
    if (read_view(reply.json, &v, err, sizeof(err)) < 0) {
        die_msg("unable to read the residency reply from '%s': %s", ep, err);
        rc = EXIT_SYSTEM;
        goto out;
    }
    out_init(&o, c.format, columns, N_COLUMNS, false, NULL);
    if (c.format == OUT_MSGPACK) {
        out_raw(&o, reply.data, reply.data_len);
    } else {
        for (int i = 0; i < v.n_names; i++)
            emit_adapter(&o, &v, v.names[i]);
        emit_summary(&o, &v);
    }
    out_end(&o);
    rc = out_status(&o, 0);
out:
    free(v.ranks);
    free(v.names);
    ctl_reply_release(&reply);
    return rc;
}
