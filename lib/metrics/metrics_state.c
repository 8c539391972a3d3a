/* metrics_state: the exporter's model of engines and frontends; see metrics_state.h.
 *
 * Data flow: lora_metrics_state_apply() peeks the body's type, decodes it (lib/wire/msg) into a
 * per-call arena, finds the engine by index, checks the restart rules, then updates: ready ->
 * config; registry -> registered flags; residency_reply and notifications -> one rank's levels,
 * then derive() recomputes every adapter's engine-wide level and counts loads and evictions;
 * stats -> gauges and per-adapter counts; event FINISHED -> counters; request_stats -> latency
 * histograms. Adapters that nothing refers to any more are forgotten (collect()).
 */
#include "metrics/metrics_state.h"

#include <errno.h>
#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/msg.h"

const char *const lora_metrics_state_reason_names[LORA_REASON_COUNT] = {"stop", "length", "abort",
                                                                 "error"};

/* vLLM's buckets (vllm/v1/metrics/loggers.py, PrometheusStatLogger), and ours for the families
 * vLLM does not have. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double latency_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                        5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double iteration_bounds[] = {1,   8,    16,   32,   64,   128,  256,
                                          512, 1024, 2048, 4096, 8192, 16384};
static const double step_adapter_bounds[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48,
                                             64, 128};
static const double load_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05,   0.1,   0.25,   0.5,   1.0,  2.5,
                                     5.0,    10.0,  30.0,   60.0,  120.0};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void say(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;

    if (!err || !len)
        return;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* ---- engines ------------------------------------------------------------------------------- */

/* vLLM's build_1_2_5_buckets(max_value): 1, 2, 5, 10, 20, 50, ... while <= max_value. */
static int size_bounds(int max_value, double **out)
{
    double *b = malloc(sizeof(*b) * 64);
    int n = 0;

    if (!b)
        return -1;
    for (double p = 1; n < 61; p *= 10) {
        const double m[3] = {1, 2, 5};
        int k = 0;
        for (; k < 3 && m[k] * p <= max_value; k++)
            b[n++] = m[k] * p;
        if (k < 3)
            break;
    }
    *out = b;
    return n;
}

static int engine_init(struct lora_metrics_state_engine *e, int index)
{
    static const struct {
        const double *b;
        int n;
    } fixed[LORA_H_COUNT] = {
        [LORA_H_TTFT] = {ttft_bounds, N_OF(ttft_bounds)},
        [LORA_H_ITL] = {itl_bounds, N_OF(itl_bounds)},
        [LORA_H_E2E] = {latency_bounds, N_OF(latency_bounds)},
        [LORA_H_QUEUE] = {latency_bounds, N_OF(latency_bounds)},
        [LORA_H_PREFILL] = {latency_bounds, N_OF(latency_bounds)},
        [LORA_H_DECODE] = {latency_bounds, N_OF(latency_bounds)},
        [LORA_H_INFERENCE] = {latency_bounds, N_OF(latency_bounds)},
        [LORA_H_ITERATION_TOKENS] = {iteration_bounds, N_OF(iteration_bounds)},
        [LORA_H_STEP_ADAPTERS] = {step_adapter_bounds, N_OF(step_adapter_bounds)},
        [LORA_H_LOAD_SECONDS] = {load_bounds, N_OF(load_bounds)},
        [LORA_H_ACTIVATE_SECONDS] = {load_bounds, N_OF(load_bounds)},
    };
    memset(e, 0, sizeof(*e));
    e->index = index;
    e->source = -1;
    for (int h = 0; h < LORA_H_COUNT; h++)
        if (fixed[h].b && lora_exposition_histogram_init(&e->hist[h], fixed[h].b, fixed[h].n) < 0)
            return -1;
    return 0;
}

static void adapter_free(struct lora_metrics_state_adapter *a)
{
    if (a)
        free(a->name);
    free(a);
}

static void engine_release(struct lora_metrics_state_engine *e)
{
    for (int i = 0; i < e->n_adapters; i++)
        adapter_free(e->adapters[i]);
    free(e->adapters);
    for (int h = 0; h < LORA_H_COUNT; h++)
        lora_exposition_histogram_release(&e->hist[h]);
    free(e->size_bounds);
    free(e->model);
}

/* A new epoch: everything but the index, the source, when it was last heard and the count of
 * epochs starts again (a restart is no silence: the engine is not lost for it). */
static int engine_restart(struct lora_metrics_state_engine *e)
{
    int index = e->index, source = e->source;
    uint64_t epoch = e->epoch + 1, last_heard_ms = e->last_heard_ms;
    bool from_engine = e->from_engine;

    engine_release(e);
    int rc = engine_init(e, index);
    e->source = source;
    e->epoch = epoch;
    e->from_engine = from_engine;
    e->last_heard_ms = last_heard_ms;
    return rc;
}

static struct lora_metrics_state_engine *engine_get(struct lora_metrics_state *s, int index, bool add)
{
    int lo = 0, hi = s->n_engines;

    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->engines[mid]->index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < s->n_engines && s->engines[lo]->index == index)
        return s->engines[lo];
    if (!add || s->n_engines == LORA_METRICS_STATE_MAX_ENGINES)
        return NULL;
    struct lora_metrics_state_engine *e = malloc(sizeof(*e));
    if (!e || engine_init(e, index) < 0) {
        if (e)
            engine_release(e);
        free(e);
        return NULL;
    }
    memmove(&s->engines[lo + 1], &s->engines[lo], sizeof(*s->engines) * (size_t)(s->n_engines - lo));
    s->engines[lo] = e;
    s->n_engines++;
    return e;
}

const struct lora_metrics_state_engine *lora_metrics_state_engine(const struct lora_metrics_state *s, int index)
{
    return engine_get((struct lora_metrics_state *)s, index, false);
}

/* ---- adapters ------------------------------------------------------------------------------ */

static int adapter_pos(const struct lora_metrics_state_engine *e, const char *name, bool *found)
{
    int lo = 0, hi = e->n_adapters;

    while (lo < hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(e->adapters[mid]->name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static struct lora_metrics_state_adapter *adapter_find(struct lora_metrics_state_engine *e, const char *name)
{
    bool found;
    int at = adapter_pos(e, name, &found);
    return found ? e->adapters[at] : NULL;
}

/* The adapter called name (NUL-terminated, non-empty), added when new; NULL at the bound. */
static struct lora_metrics_state_adapter *adapter_get(struct lora_metrics_state *s,
                                               struct lora_metrics_state_engine *e, const char *name)
{
    bool found;
    int at = adapter_pos(e, name, &found);

    if (found)
        return e->adapters[at];
    if (e->n_adapters == LORA_METRICS_STATE_MAX_ADAPTERS) {
        s->n_refused++;
        return NULL;
    }
    if (e->n_adapters == e->cap_adapters) {
        int cap = e->cap_adapters ? 2 * e->cap_adapters : 64;
        void *p = realloc(e->adapters, sizeof(*e->adapters) * (size_t)cap);
        if (!p)
            return NULL;
        e->adapters = p;
        e->cap_adapters = cap;
    }
    struct lora_metrics_state_adapter *a = calloc(1, sizeof(*a));
    if (!a || !(a->name = strdup(name))) {
        free(a);
        return NULL;
    }
    memmove(&e->adapters[at + 1], &e->adapters[at],
            sizeof(*e->adapters) * (size_t)(e->n_adapters - at));
    e->adapters[at] = a;
    e->n_adapters++;
    return a;
}

static bool held_anywhere(const struct lora_metrics_state_adapter *a)
{
    for (int r = 0; r < LORA_METRICS_STATE_MAX_WORLD; r++)
        if (a->rank_level[r] != LORA_LEVEL_NONE)
            return true;
    return a->rank_pinned != 0;
}

/* Forgets the adapters nothing refers to: not registered, held by no rank, no requests. */
static void collect(struct lora_metrics_state_engine *e)
{
    int kept = 0;

    for (int i = 0; i < e->n_adapters; i++) {
        struct lora_metrics_state_adapter *a = e->adapters[i];
        if (a->registered || a->running || a->waiting || held_anywhere(a))
            e->adapters[kept++] = a;
        else
            adapter_free(a);
    }
    e->n_adapters = kept;
}

static int world_of(const struct lora_metrics_state_engine *e)
{
    return e->has_config ? e->world_size : 0;
}

static uint64_t rank_mask(int world)
{
    return world >= 64 ? ~0ull : (1ull << world) - 1;
}

static bool residency_complete(const struct lora_metrics_state_engine *e)
{
    uint64_t m = rank_mask(world_of(e));
    return e->has_config && (e->rank_known & m) == m;
}

static bool in_strs(const struct lora_str *v, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (v[i].s && strcmp(v[i].s, name) == 0)
            return true;
    return false;
}

/* Recomputes every adapter's engine-wide level, pinning and agreement from the ranks' states.
 * With count, a level that changed is a load or an eviction (an adapter in removed, the names
 * a rank reported removing, or no longer registered, was unloaded: neither). */
static void derive(struct lora_metrics_state_engine *e, bool count, const struct lora_str *removed,
                   int n_removed)
{
    int world = world_of(e);
    uint64_t mask = rank_mask(world);

    e->n_gpu = e->n_cpu = e->n_disagree = 0;
    for (int i = 0; i < e->n_adapters && world > 0; i++) {
        struct lora_metrics_state_adapter *a = e->adapters[i];
        int lo = LORA_LEVEL_GPU, hi = LORA_LEVEL_NONE;
        for (int r = 0; r < world; r++) {
            lo = a->rank_level[r] < lo ? a->rank_level[r] : lo;
            hi = a->rank_level[r] > hi ? a->rank_level[r] : hi;
        }
        enum lora_metrics_state_level old = a->level;
        a->level = (enum lora_metrics_state_level)lo;
        a->pinned = (a->rank_pinned & mask) == mask;
        a->disagrees = lo != hi;
        e->n_gpu += a->level == LORA_LEVEL_GPU;
        e->n_cpu += a->level >= LORA_LEVEL_CPU;
        e->n_disagree += a->disagrees;
        if (!count || a->level == old)
            continue;
        if (a->level > old) {
            e->loads[0] += old < LORA_LEVEL_CPU;
            e->loads[1] += a->level == LORA_LEVEL_GPU;
        } else if (a->registered && !in_strs(removed, n_removed, a->name)) {
            e->evictions[1] += old == LORA_LEVEL_GPU;
            e->evictions[0] += a->level == LORA_LEVEL_NONE;
        }
    }
}

/* Rank rank's loaded state is st. */
static void apply_state(struct lora_metrics_state *s, struct lora_metrics_state_engine *e, int rank,
                        const struct lora_msg_state *st, const struct lora_str *removed,
                        int n_removed)
{
    uint64_t bit = 1ull << rank;
    const struct {
        const struct lora_str *v;
        int n;
        int level;
    } lists[2] = {{st->cpu, st->n_cpu, LORA_LEVEL_CPU}, {st->slots, st->n_slots, LORA_LEVEL_GPU}};

    for (int i = 0; i < e->n_adapters; i++) {
        e->adapters[i]->rank_level[rank] = LORA_LEVEL_NONE;
        e->adapters[i]->rank_pinned &= ~bit;
    }
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < lists[l].n; i++) {
            const char *name = lists[l].v[i].s;
            struct lora_metrics_state_adapter *a = name && *name ? adapter_get(s, e, name) : NULL;
            if (a && a->rank_level[rank] < lists[l].level)
                a->rank_level[rank] = (uint8_t)lists[l].level;
        }
    }
    for (int i = 0; i < st->n_pinned; i++) {
        const char *name = st->pinned[i].s;
        struct lora_metrics_state_adapter *a = name && *name ? adapter_get(s, e, name) : NULL;
        if (a)
            a->rank_pinned |= bit;
    }
    bool was_complete = residency_complete(e);
    e->rank_known |= bit;
    derive(e, was_complete && residency_complete(e), removed, n_removed);
    collect(e);
}

/* ---- messages ------------------------------------------------------------------------------ */

/* The number under key in the top-level map of body, if there is one. */
static bool peek_number(const void *body, size_t len, const char *key, double *out)
{
    msgpack_unpacked u;
    size_t off = 0;
    bool found = false;

    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, body, len, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &u.data.via.map;
        for (uint32_t i = 0; i < m->size && !found; i++) {
            const msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR || k->via.str.size != strlen(key) ||
                memcmp(k->via.str.ptr, key, k->via.str.size) != 0)
                continue;
            if (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32)
                *out = v->via.f64, found = true;
            else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                *out = (double)v->via.u64, found = true;
        }
    }
    msgpack_unpacked_destroy(&u);
    return found;
}

static bool config_differs(const struct lora_metrics_state_engine *e, const struct lora_msg_ready *m,
                           double start_time)
{
    const struct lora_msg_limits *l = &m->limits;
    return strcmp(e->model ? e->model : "", m->model.s ? m->model.s : "") != 0 ||
           e->max_loras != l->max_loras || e->max_cpu_loras != l->max_cpu_loras ||
           e->max_lora_rank != l->max_lora_rank || e->block_size != l->block_size ||
           e->num_kv_blocks != l->num_kv_blocks || e->world_size != l->world_size ||
           e->max_model_len != l->max_model_len || e->start_time != start_time;
}

static int str_cmp(struct lora_str a, struct lora_str b)
{
    int c = memcmp(a.s, b.s, a.len < b.len ? a.len : b.len);
    return c ? c : (a.len > b.len) - (a.len < b.len);
}

static int by_transition_name_rank(const void *pa, const void *pb)
{
    const struct lora_msg_startup_load *a = *(const struct lora_msg_startup_load *const *)pa,
                                       *b = *(const struct lora_msg_startup_load *const *)pb;
    if (a->transition != b->transition)
        return a->transition < b->transition ? -1 : 1;
    int c = str_cmp(a->name, b->name);
    if (c)
        return c;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* The start-up loads of ready (see the header): the timings not seen live into the histograms;
 * per transition and adapter, the fewest times any rank of the engine did it into the loads. */
static int apply_startup_loads(struct lora_metrics_state_engine *e, const struct lora_msg_ready *m)
{
    int world = m->limits.world_size, n = 0;
    const struct lora_msg_startup_load **v = calloc((size_t)m->n_startup_loads + 1, sizeof(*v));

    if (!v)
        return -1;
    for (int i = 0; i < m->n_startup_loads; i++) {
        const struct lora_msg_startup_load *l = &m->startup_loads[i];
        if (l->rank >= world || l->rank >= LORA_METRICS_STATE_MAX_WORLD || !l->name.s ||
            (l->transition != LORA_TRANSITION_LOAD && l->transition != LORA_TRANSITION_ACTIVATE))
            continue;
        v[n++] = l;
        uint64_t first = e->first_seq[l->rank];
        if (first == 0 || l->seq < first)
            lora_exposition_histogram_observe(&e->hist[l->transition == LORA_TRANSITION_LOAD
                                                     ? LORA_H_LOAD_SECONDS
                                                     : LORA_H_ACTIVATE_SECONDS],
                                        l->seconds, 1);
    }
    qsort(v, (size_t)n, sizeof(*v), by_transition_name_rank);
    for (int i = 0; i < n;) {
        /* One run of one transition and name: count per rank, the least over all ranks. */
        int j = i, count[LORA_METRICS_STATE_MAX_WORLD] = {0};
        while (j < n && v[j]->transition == v[i]->transition &&
               str_cmp(v[j]->name, v[i]->name) == 0)
            count[v[j++]->rank]++;
        int least = count[0];
        for (int r = 1; r < world && r < LORA_METRICS_STATE_MAX_WORLD; r++)
            least = count[r] < least ? count[r] : least;
        e->loads[v[i]->transition == LORA_TRANSITION_LOAD ? 0 : 1] += (uint64_t)least;
        i = j;
    }
    free(v);
    return 0;
}

static int apply_ready(struct lora_metrics_state *s, struct lora_metrics_state_engine *e,
                       const struct lora_msg_ready *m, double start_time)
{
    const struct lora_msg_limits *l = &m->limits;

    if (e->has_config && config_differs(e, m, start_time) && engine_restart(e) < 0)
        return -1;
    if (e->has_config)
        return 0;
    char *model = strdup(m->model.s ? m->model.s : "");
    double *bounds = NULL;
    int n = size_bounds(l->max_model_len, &bounds);
    if (!model || n < 0) {
        free(model);
        free(bounds);
        return -1;
    }
    e->model = model;
    e->size_bounds = bounds;
    e->start_time = start_time;
    e->max_loras = l->max_loras;
    e->max_cpu_loras = l->max_cpu_loras;
    e->max_lora_rank = l->max_lora_rank;
    e->block_size = l->block_size;
    e->num_kv_blocks = l->num_kv_blocks;
    e->world_size = l->world_size;
    e->max_model_len = l->max_model_len;
    const int sized[] = {LORA_H_PROMPT_TOKENS, LORA_H_GENERATION_TOKENS, LORA_H_MAX_TOKENS};
    for (int i = 0; i < 3; i++)
        if (lora_exposition_histogram_init(&e->hist[sized[i]], bounds, n) < 0)
            return -1;
    if (apply_startup_loads(e, m) < 0)
        return -1;
    e->has_config = true;
    derive(e, false, NULL, 0);
    collect(e);
    (void)s;
    return 0;
}

static void apply_registry(struct lora_metrics_state *s, struct lora_metrics_state_engine *e,
                           const struct lora_msg_registry *m)
{
    for (int i = 0; i < e->n_adapters; i++)
        e->adapters[i]->registered = false;
    for (int i = 0; i < m->n_adapters; i++) {
        const char *name = m->adapters[i].name.s;
        struct lora_metrics_state_adapter *a = name && *name ? adapter_get(s, e, name) : NULL;
        if (a)
            a->registered = true;
    }
    e->has_registry = true;
    collect(e);
}

static int apply_stats(struct lora_metrics_state *s, struct lora_metrics_state_engine *e,
                       const struct lora_msg_stats *m)
{
    if (e->has_stats && m->num_preemptions < e->num_preemptions && engine_restart(e) < 0)
        return -1;
    e->has_stats = true;
    e->running = m->running;
    e->waiting = m->waiting;
    e->kv_usage = m->kv_usage;
    e->num_preemptions = m->num_preemptions;
    for (int i = 0; i < e->n_adapters; i++)
        e->adapters[i]->running = e->adapters[i]->waiting = 0;
    for (int i = 0; i < m->n_adapters; i++) {
        const struct lora_msg_adapter_count *c = &m->adapters[i];
        struct lora_metrics_state_adapter *a = c->name.s && *c->name.s ? adapter_get(s, e, c->name.s)
                                                                : NULL;
        if (!a)
            continue;
        a->running = c->running > 0 ? c->running : 0;
        a->waiting = c->waiting > 0 ? c->waiting : 0;
    }
    if (m->step_tokens > 0) {
        lora_exposition_histogram_observe(&e->hist[LORA_H_ITERATION_TOKENS], m->step_tokens, 1);
        lora_exposition_histogram_observe(&e->hist[LORA_H_STEP_ADAPTERS], m->step_adapters, 1);
    }
    collect(e);
    return 0;
}

static int reason_of(const struct lora_str *r)
{
    for (int i = 0; r->s && i < LORA_REASON_COUNT; i++)
        if (strcmp(r->s, lora_metrics_state_reason_names[i]) == 0)
            return i;
    return -1;
}

static void apply_event(struct lora_metrics_state *s, struct lora_metrics_state_engine *e,
                        const struct lora_msg_event *m)
{
    if (m->event != LORA_EVENT_FINISHED)
        return;
    int reason = reason_of(&m->finish_reason);
    uint64_t np = m->num_prompt_tokens > 0 ? (uint64_t)m->num_prompt_tokens : 0;
    uint64_t ng = m->num_generation_tokens > 0 ? (uint64_t)m->num_generation_tokens : 0;
    if (reason >= 0)
        e->success[reason]++;
    else
        s->n_refused++;
    lora_exposition_histogram_observe(&e->hist[LORA_H_PROMPT_TOKENS], (double)np, 1);
    lora_exposition_histogram_observe(&e->hist[LORA_H_GENERATION_TOKENS], (double)ng, 1);
    /* A request that produced no token may never have had its prompt computed. */
    if (ng == 0)
        return;
    e->prompt_tokens += np;
    e->generation_tokens += ng;
    struct lora_metrics_state_adapter *a = m->lora.s && *m->lora.s ? adapter_find(e, m->lora.s) : NULL;
    if (a) {
        a->accounted = true;
        a->prompt_tokens += np;
        a->generation_tokens += ng;
    }
}

static int apply_notifications(struct lora_metrics_state *s, struct lora_metrics_state_engine *e,
                               const struct lora_msg_notifications *m)
{
    int r = m->rank;
    bool went_back = (e->has_dropped[r] && m->dropped < e->dropped[r]) ||
                     (m->n_items > 0 && e->last_seq[r] > 0 && m->items[0].seq <= e->last_seq[r]);
    if (went_back && engine_restart(e) < 0)
        return -1;
    e->has_dropped[r] = true;
    e->dropped[r] = m->dropped;
    if (m->n_items == 0)
        return 0;
    if (e->first_seq[r] == 0)
        e->first_seq[r] = m->items[0].seq ? m->items[0].seq : 1;
    int n_removed = 0;
    for (int i = 0; i < m->n_items; i++)
        n_removed += m->items[i].n_timings;
    struct lora_str *removed = calloc((size_t)n_removed + 1, sizeof(*removed));
    if (!removed)
        return -1;
    n_removed = 0;
    for (int i = 0; i < m->n_items; i++) {
        const struct lora_msg_notification *it = &m->items[i];
        e->last_seq[r] = it->seq > e->last_seq[r] ? it->seq : e->last_seq[r];
        for (int t = 0; t < it->n_timings; t++) {
            const struct lora_msg_timing *tm = &it->timings[t];
            if (tm->transition == LORA_TRANSITION_LOAD)
                lora_exposition_histogram_observe(&e->hist[LORA_H_LOAD_SECONDS], tm->seconds, 1);
            else if (tm->transition == LORA_TRANSITION_ACTIVATE)
                lora_exposition_histogram_observe(&e->hist[LORA_H_ACTIVATE_SECONDS], tm->seconds, 1);
            else if (tm->transition == LORA_TRANSITION_REMOVE)
                removed[n_removed++] = tm->name;
        }
    }
    apply_state(s, e, r, &m->items[m->n_items - 1].state, removed, n_removed);
    free(removed);
    return 0;
}

static void observe_span(struct lora_exposition_histogram *h, double from, double to, uint64_t weight)
{
    if (from > 0 && to > 0)
        lora_exposition_histogram_observe(h, to >= from ? to - from : 0, weight);
}

static void apply_request_stats(struct lora_metrics_state_engine *e,
                                const struct lora_msg_request_stats *m)
{
    struct lora_exposition_histogram *h = e->hist;
    int n = m->num_generation_tokens;

    observe_span(&h[LORA_H_TTFT], m->arrival_time, m->first_token_time, 1);
    observe_span(&h[LORA_H_E2E], m->arrival_time, m->finished_time, 1);
    /* Inter-token latency, approximated per request: its mean, once per interval. */
    if (n >= 2 && m->first_token_time > 0 && m->finished_time >= m->first_token_time)
        lora_exposition_histogram_observe(&h[LORA_H_ITL],
                                    (m->finished_time - m->first_token_time) / (n - 1),
                                    (uint64_t)(n - 1));
    observe_span(&h[LORA_H_QUEUE], m->queued_time, m->scheduled_time, 1);
    observe_span(&h[LORA_H_PREFILL], m->scheduled_time, m->engine_first_token_time, 1);
    observe_span(&h[LORA_H_DECODE], m->engine_first_token_time, m->engine_finished_time, 1);
    observe_span(&h[LORA_H_INFERENCE], m->scheduled_time, m->engine_finished_time, 1);
    if (m->max_tokens > 0)
        lora_exposition_histogram_observe(&h[LORA_H_MAX_TOKENS], m->max_tokens, 1);
}

/* Decoded message of any type we use. */
union any_msg {
    struct lora_msg_ready ready;
    struct lora_msg_registry registry;
    struct lora_msg_stats stats;
    struct lora_msg_event event;
    struct lora_msg_notifications notifications;
    struct lora_msg_residency_reply residency;
    struct lora_msg_request_stats request_stats;
};

static int decode(int type, const void *body, size_t len, struct lora_msg_arena *arena,
                  union any_msg *m, int *engine, char *err, size_t err_len)
{
    int rc = -1;

    switch (type) {
    case LORA_MSG_READY:
        rc = lora_msg_decode_ready(body, len, NULL, 0, arena, &m->ready, err, err_len);
        *engine = m->ready.engine_index;
        break;
    case LORA_MSG_REGISTRY:
        rc = lora_msg_decode_registry(body, len, NULL, 0, arena, &m->registry, err, err_len);
        *engine = m->registry.engine;
        break;
    case LORA_MSG_STATS:
        rc = lora_msg_decode_stats(body, len, NULL, 0, arena, &m->stats, err, err_len);
        *engine = m->stats.engine;
        break;
    case LORA_MSG_EVENT:
        rc = lora_msg_decode_event(body, len, NULL, 0, arena, &m->event, err, err_len);
        *engine = m->event.engine;
        break;
    case LORA_MSG_NOTIFICATIONS:
        rc = lora_msg_decode_notifications(body, len, NULL, 0, arena, &m->notifications, err,
                                           err_len);
        *engine = m->notifications.engine;
        break;
    case LORA_MSG_RESIDENCY_REPLY:
        rc = lora_msg_decode_residency_reply(body, len, NULL, 0, arena, &m->residency, err,
                                             err_len);
        *engine = m->residency.engine;
        break;
    case LORA_MSG_REQUEST_STATS:
        rc = lora_msg_decode_request_stats(body, len, NULL, 0, arena, &m->request_stats, err,
                                           err_len);
        *engine = m->request_stats.engine;
        break;
    default:
        return 0;
    }
    return rc < 0 ? -1 : 1;
}

/* A message from the engine itself: it is alive; after it was lost, its state is stale. */
static void heard(struct lora_metrics_state *s, struct lora_metrics_state_engine *e, int source, uint64_t now)
{
    if (e->from_engine && lora_metrics_state_engine_is_lost(s, e, now)) {
        e->has_registry = false;
        e->has_stats = false;
        e->rank_known = 0;
    }
    e->from_engine = true;
    e->last_heard_ms = now;
    e->source = source;
}

/* The bounds of this model that a decoded body for engine may still break: checked before the
 * body touches an engine, so that a refused body changes nothing (not even when it was last
 * heard). 0, or -1 with err. */
static int check_bounds(int type, const union any_msg *m, int engine, char *err, size_t err_len)
{
    int rank = 0;

    if (type == LORA_MSG_READY) {
        int world = m->ready.limits.world_size;
        if (world < 1 || world > LORA_METRICS_STATE_MAX_WORLD) {
            say(err, err_len, "ready: limits: world_size %d is outside [1, %d]", world,
                LORA_METRICS_STATE_MAX_WORLD);
            return -1;
        }
    }
    if (type == LORA_MSG_NOTIFICATIONS)
        rank = m->notifications.rank;
    else if (type == LORA_MSG_RESIDENCY_REPLY)
        rank = m->residency.rank;
    if (rank < 0 || rank >= LORA_METRICS_STATE_MAX_WORLD) {
        say(err, err_len, "%s: rank %d is outside [0, %d)", lora_msg_type_name(type), rank,
            LORA_METRICS_STATE_MAX_WORLD);
        return -1;
    }
    if (engine < 0 || engine > 1000000) {
        say(err, err_len, "%s: engine index %d is outside [0, 1000000]", lora_msg_type_name(type),
            engine);
        return -1;
    }
    return 0;
}

static int apply_decoded(struct lora_metrics_state *s, struct lora_metrics_state_engine *e, int type,
                         const union any_msg *m, double start_time)
{
    switch (type) {
    case LORA_MSG_READY:
        return apply_ready(s, e, &m->ready, start_time);
    case LORA_MSG_REGISTRY:
        apply_registry(s, e, &m->registry);
        return 0;
    case LORA_MSG_STATS:
        return apply_stats(s, e, &m->stats);
    case LORA_MSG_EVENT:
        apply_event(s, e, &m->event);
        return 0;
    case LORA_MSG_NOTIFICATIONS:
        return apply_notifications(s, e, &m->notifications);
    case LORA_MSG_RESIDENCY_REPLY:
        apply_state(s, e, m->residency.rank, &m->residency.state, NULL, 0);
        return 0;
    case LORA_MSG_REQUEST_STATS:
        apply_request_stats(e, &m->request_stats);
        return 0;
    }
    return 0;
}

int lora_metrics_state_apply(struct lora_metrics_state *s, int source, const void *body, size_t len,
                      uint64_t now_ms, char *err, size_t err_len)
{
    char why[512] = "";
    struct lora_metrics_state_source *src = source >= 0 && source < s->n_sources ? &s->sources[source]
                                                                           : NULL;
    if (src) {
        src->last_heard_ms = now_ms ? now_ms : 1;
        src->n_messages++;
    }
    int type = lora_msg_peek_type(body, len, why, sizeof(why));
    if (type < 0)
        goto malformed;
    union any_msg m;
    int engine = -1;
    lora_msg_arena_reset(s->arena);
    int rc = decode(type, body, len, s->arena, &m, &engine, why, sizeof(why));
    if (rc < 0)
        goto malformed;
    /* Types of no interest; a worker's notifications (engine -1) and residency replies. */
    if (rc == 0 ||
        (engine < 0 && (type == LORA_MSG_NOTIFICATIONS || type == LORA_MSG_RESIDENCY_REPLY)))
        return 0;
    double start_time = 0;
    /* NaN never equals itself: as a start time it would restart the engine on every ready. */
    if (type == LORA_MSG_READY && peek_number(body, len, "start_time", &start_time) &&
        !isfinite(start_time))
        start_time = 0;
    struct lora_metrics_state_engine *e = NULL;
    if (check_bounds(type, &m, engine, why, sizeof(why)) < 0)
        goto malformed;
    if (!(e = engine_get(s, engine, true))) {
        s->n_refused++;
        snprintf(why, sizeof(why), "%s: engine %d: more than %d engines, or out of memory",
                 lora_msg_type_name(type), engine, LORA_METRICS_STATE_MAX_ENGINES);
    } else {
        if (type != LORA_MSG_REQUEST_STATS)
            heard(s, e, source, now_ms);
        if (apply_decoded(s, e, type, &m, start_time) < 0)
            snprintf(why, sizeof(why), "%s: out of memory", lora_msg_type_name(type));
    }
    if (*why)
        goto malformed;
    return 1;
malformed:
    if (src)
        src->n_malformed++;
    say(err, err_len, "%s", why);
    return -1;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

struct lora_metrics_state *lora_metrics_state_new(const struct lora_metrics_state_options *o)
{
    struct lora_metrics_state *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    s->engines = calloc(LORA_METRICS_STATE_MAX_ENGINES, sizeof(*s->engines));
    s->arena = lora_msg_arena_new();
    if (!s->engines || !s->arena) {
        lora_msg_arena_destroy(&s->arena);
        free(s->engines);
        free(s);
        return NULL;
    }
    if (o)
        s->o = *o;
    return s;
}

void lora_metrics_state_destroy(struct lora_metrics_state **sp)
{
    struct lora_metrics_state *s = sp ? *sp : NULL;

    if (!s)
        return;
    for (int i = 0; i < s->n_engines; i++) {
        engine_release(s->engines[i]);
        free(s->engines[i]);
    }
    for (int i = 0; i < s->n_sources; i++) {
        free(s->sources[i].name);
        free(s->sources[i].why);
    }
    lora_msg_arena_destroy(&s->arena);
    free(s->engines);
    free(s);
    *sp = NULL;
}

int lora_metrics_state_add_source(struct lora_metrics_state *s, const char *name,
                           enum lora_metrics_state_source_kind kind)
{
    if (s->n_sources == LORA_METRICS_STATE_MAX_SOURCES) {
        errno = ENOSPC;
        return -1;
    }
    struct lora_metrics_state_source *src = &s->sources[s->n_sources];
    memset(src, 0, sizeof(*src));
    if (!(src->name = strdup(name)))
        return -1;
    src->kind = kind;
    return s->n_sources++;
}

void lora_metrics_state_source_lost(struct lora_metrics_state *s, int source, uint64_t now_ms)
{
    if (source < 0 || source >= s->n_sources)
        return;
    s->sources[source].n_lost++;
    for (int i = 0; i < s->n_engines; i++)
        if (s->engines[i]->source == source && s->engines[i]->from_engine)
            engine_restart(s->engines[i]);
    (void)now_ms;
}

void lora_metrics_state_source_ended(struct lora_metrics_state *s, int source, const char *why)
{
    if (source < 0 || source >= s->n_sources)
        return;
    s->sources[source].ended = true;
    free(s->sources[source].why);
    s->sources[source].why = strdup(why ? why : "ended");
}

/* ---- queries ------------------------------------------------------------------------------- */

bool lora_metrics_state_engine_is_lost(const struct lora_metrics_state *s, const struct lora_metrics_state_engine *e,
                                uint64_t now_ms)
{
    return s->o.engine_timeout_ms && e->from_engine &&
           now_ms > e->last_heard_ms + s->o.engine_timeout_ms;
}

bool lora_metrics_state_engine_is_ready(const struct lora_metrics_state_engine *e)
{
    return residency_complete(e) && e->has_registry && e->has_stats;
}

bool lora_metrics_state_engine_shows_gauges(const struct lora_metrics_state *s,
                                     const struct lora_metrics_state_engine *e, uint64_t now_ms)
{
    return lora_metrics_state_engine_is_ready(e) && !lora_metrics_state_engine_is_lost(s, e, now_ms);
}

const char *lora_metrics_state_model_name(const struct lora_metrics_state *s,
                                   const struct lora_metrics_state_engine *e)
{
    if (s->o.model_name)
        return s->o.model_name;
    return e->has_config ? e->model : NULL;
}

bool lora_metrics_state_adapter_is_ready(const struct lora_metrics_state_adapter *a)
{
    return a->registered && a->level == LORA_LEVEL_GPU;
}

/* Appends ",name" (or "name" first) to *buf; 0 or -1. */
static int join(char **buf, size_t *len, size_t *cap, const char *name)
{
    size_t n = strlen(name) + 2;
    if (*len + n > *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        while (c < *len + n)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p)
            return -1;
        *buf = p;
        *cap = c;
    }
    *len += (size_t)sprintf(*buf + *len, "%s%s", *len ? "," : "", name);
    return 0;
}

int lora_metrics_state_lora_sets(const struct lora_metrics_state *s, const struct lora_metrics_state_engine *e,
                          char **running, char **waiting)
{
    char *rb = NULL, *wb = NULL;
    size_t rl = 0, rc = 0, wl = 0, wc = 0;
    int fail = 0;

    for (int i = 0; i < e->n_adapters && !fail; i++) {
        const struct lora_metrics_state_adapter *a = e->adapters[i];
        bool run, wait;
        if (s->o.inflight) {
            run = a->running > 0;
            wait = a->waiting > 0;
        } else {
            run = lora_metrics_state_adapter_is_ready(a);
            wait = a->waiting > 0 && !run;
        }
        if (run)
            fail |= join(&rb, &rl, &rc, a->name);
        if (wait)
            fail |= join(&wb, &wl, &wc, a->name);
    }
    if (!fail && !rb)
        fail = !(rb = strdup(""));
    if (!fail && !wb)
        fail = !(wb = strdup(""));
    if (fail) {
        free(rb);
        free(wb);
        return -1;
    }
    *running = rb;
    *waiting = wb;
    return 0;
}

/* Appends one line to buf (size bytes, *at used), truncating. */
static void line(char *buf, size_t size, size_t *at, const char *fmt, ...)
{
    va_list ap;

    if (*at + 1 >= size)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, size - *at, fmt, ap);
    va_end(ap);
    *at = n < 0 ? *at : *at + (size_t)n < size ? *at + (size_t)n : size - 1;
}

static void missing_state(const struct lora_metrics_state_engine *e, char *buf, size_t size, size_t *at)
{
    line(buf, size, at, "engine %d: waiting for its state:", e->index);
    if (!e->has_config)
        line(buf, size, at, " config");
    if (!e->has_registry)
        line(buf, size, at, " registry");
    for (int r = 0; r < (e->has_config ? e->world_size : 1); r++)
        if (!(e->rank_known & (1ull << r)))
            line(buf, size, at, " rank-%d", r);
    if (!e->has_stats)
        line(buf, size, at, " stats");
    line(buf, size, at, "\n");
}

bool lora_metrics_state_health(const struct lora_metrics_state *s, uint64_t now_ms, char *buf, size_t size)
{
    size_t at = 0;
    bool ok = true;
    uint64_t t = s->o.engine_timeout_ms;

    if (size)
        buf[0] = 0;
    for (int i = 0; i < s->n_sources; i++) {
        const struct lora_metrics_state_source *src = &s->sources[i];
        if (src->kind == LORA_SOURCE_STDIN && src->ended) {
            ok = false;
            line(buf, size, &at, "stdin: %s\n", src->why ? src->why : "ended");
        }
        if (src->kind != LORA_SOURCE_ENGINE)
            continue;
        if (!src->last_heard_ms) {
            ok = false;
            line(buf, size, &at, "%s: nothing heard yet\n", src->name);
        } else if (t && now_ms > src->last_heard_ms + t) {
            ok = false;
            line(buf, size, &at, "%s: silent for %.1f s\n", src->name,
                 (double)(now_ms - src->last_heard_ms) / 1000);
        }
    }
    for (int i = 0; i < s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = s->engines[i];
        if (!e->from_engine)
            continue;
        if (lora_metrics_state_engine_is_lost(s, e, now_ms)) {
            ok = false;
            line(buf, size, &at, "engine %d: silent for %.1f s\n", e->index,
                 (double)(now_ms - e->last_heard_ms) / 1000);
        } else if (!lora_metrics_state_engine_is_ready(e)) {
            ok = false;
            missing_state(e, buf, size, &at);
        }
    }
    if (ok)
        line(buf, size, &at, "ok\n");
    return ok;
}
