/* Unit tests for lib/metrics/metrics_state: message bodies built here with msgpack-c, key by key as
 * lib/wire/msg.h and man/lora-stack-protocol.7 define them (tests/ref/metrics_stream.py builds
 * the same shapes in Python), applied one at a time, and the model checked against the rules of
 * metrics_state.h and man/lora-stack-metrics.7: residency derived from every rank, readiness,
 * lost engines, restarts, the two meanings of vllm:lora_requests_info, cardinality, health,
 * malformed bodies refused without a trace, and a fuzz test of random and mutated bodies after
 * each of which the model's invariants are recomputed from scratch.
 */
#include "check.h"
#include "metrics/metrics_state.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static uint64_t rng_state = 0x853c49e6748fea9bu;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- bodies ---------------------------------------------------------------------------------
 * One body at a time in a shared buffer. With wrong_key >= 0, the value of the wrong_key-th key
 * written (counting from 0, "type" included) is replaced by a value of a random other type: the
 * fuzz test's "wrong types for keys". */

static msgpack_sbuffer sb;
static msgpack_packer pk;
static int key_no, wrong_key = -1;

static void p_str(const char *s)
{
    msgpack_pack_str_with_body(&pk, s, strlen(s));
}

/* Writes key; true when its value must be written as given, false when a wrong one was. */
static bool key(const char *k)
{
    p_str(k);
    if (key_no++ != wrong_key)
        return true;
    switch (rng() % 8) {
    case 0:
        msgpack_pack_nil(&pk);
        break;
    case 1:
        p_str("wrong");
        break;
    case 2:
        msgpack_pack_int64(&pk, -1 - (int64_t)(rng() % 1000));
        break;
    case 3:
        msgpack_pack_double(&pk, (double)(rng() % 1000) / 7);
        break;
    case 4:
        msgpack_pack_array(&pk, 1);
        msgpack_pack_int64(&pk, 1);
        break;
    case 5:
        msgpack_pack_map(&pk, 0);
        break;
    case 6:
        msgpack_pack_true(&pk);
        break;
    default:
        msgpack_pack_uint64(&pk, UINT64_MAX - rng() % 3);
        break;
    }
    return false;
}

static void k_int(const char *k, int64_t v)
{
    if (key(k))
        msgpack_pack_int64(&pk, v);
}

static void k_u64(const char *k, uint64_t v)
{
    if (key(k))
        msgpack_pack_uint64(&pk, v);
}

static void k_dbl(const char *k, double v)
{
    if (key(k))
        msgpack_pack_double(&pk, v);
}

static void k_str(const char *k, const char *v)
{
    if (key(k))
        p_str(v);
}

/* Splits "a,b,c" ("" is none) into at most max names in buf; returns the count. */
static int split(const char *csv, char names[][64], int max)
{
    int n = 0;
    for (const char *p = csv; *p && n < max;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l > 63)
            l = 63;
        memcpy(names[n], p, l);
        names[n++][l] = 0;
        p += l + (c ? 1 : 0);
        if (c && !c[1] && n < max) /* a trailing comma: one empty name */
            names[n++][0] = 0;
    }
    return n;
}

static void k_names(const char *k, const char *csv)
{
    char names[64][64];
    int n = split(csv, names, 64);
    if (!key(k))
        return;
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++)
        p_str(names[i]);
}

static void begin(const char *type, int n_keys)
{
    msgpack_sbuffer_clear(&sb);
    key_no = 0;
    msgpack_pack_map(&pk, (size_t)n_keys + 1);
    k_str("type", type);
}

struct limits {
    int max_loras, max_cpu_loras, world_size, max_model_len;
};

static const struct limits L2 = {2, 4, 2, 4096}; /* two ranks */
static const struct limits L1 = {2, 4, 1, 4096}; /* one rank */

/* ready; start_time written when has_start. */
static void b_ready_ex(int engine, const char *model, struct limits l, bool has_start,
                       double start_time)
{
    begin("ready", 4 + has_start);
    k_int("version", 1);
    k_int("engine_index", engine);
    k_str("model", model);
    if (key("limits")) {
        msgpack_pack_map(&pk, 10);
        k_int("max_loras", l.max_loras);
        k_int("max_cpu_loras", l.max_cpu_loras);
        k_int("max_lora_rank", 16);
        k_int("block_size", 16);
        k_int("num_kv_blocks", 512);
        k_int("world_size", l.world_size);
        k_int("max_model_len", l.max_model_len);
        k_int("max_num_batched_tokens", 512);
        k_int("max_num_seqs", 64);
        k_int("vocab_size", 259);
    }
    if (has_start)
        k_dbl("start_time", start_time);
}

static void b_ready(int engine, const char *model, struct limits l)
{
    b_ready_ex(engine, model, l, false, 0);
}

static void b_registry(int engine, const char *csv)
{
    char names[64][64], path[80];
    int n = split(csv, names, 64);

    begin("registry", 2);
    k_int("engine", engine);
    if (!key("adapters"))
        return;
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_map(&pk, 3);
        k_str("name", names[i]);
        snprintf(path, sizeof(path), "/adapters/%s", names[i]);
        k_str("path", path);
        k_u64("id", (uint64_t)i + 1);
    }
}

static void k_state(const char *slots, const char *cpu, const char *pinned)
{
    if (!key("state"))
        return;
    msgpack_pack_map(&pk, 3);
    k_names("slots", slots);
    k_names("cpu", cpu);
    k_names("pinned", pinned);
}

/* residency_reply; engine < 0: without the key, as a worker answers. */
static void b_residency(int engine, int rank, const char *slots, const char *cpu,
                        const char *pinned)
{
    begin("residency_reply", 2 + (engine >= 0));
    if (engine >= 0)
        k_int("engine", engine);
    k_int("rank", rank);
    k_state(slots, cpu, pinned);
}

/* notifications of one item (seq) or none (seq 0), with timings "transition:name:seconds,...". */
static void b_notifications(int engine, int rank, uint64_t dropped, uint64_t seq, const char *slots,
                            const char *cpu, const char *pinned, const char *timings)
{
    char t[16][64];
    int n = split(timings, t, 16);

    begin("notifications", 3 + (engine >= 0));
    if (engine >= 0)
        k_int("engine", engine);
    k_int("rank", rank);
    k_u64("dropped", dropped);
    if (!key("items"))
        return;
    msgpack_pack_array(&pk, seq ? 1 : 0);
    if (!seq)
        return;
    msgpack_pack_map(&pk, 5);
    k_str("kind", "lora_load");
    k_u64("seq", seq);
    k_dbl("time", 1767225600.5);
    k_state(slots, cpu, pinned);
    if (!key("timings"))
        return;
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        char tr[64] = "", name[64] = "";
        double sec = 0;
        sscanf(t[i], "%63[^:]:%63[^:]:%lf", tr, name, &sec);
        msgpack_pack_map(&pk, 3);
        k_str("name", name);
        k_str("transition", tr);
        k_dbl("seconds", sec);
    }
}

/* stats with per-adapter counts "name:running:waiting,...". */
static void b_stats_ex(int engine, int running, int waiting, uint64_t preemptions, int step_tokens,
                       int step_adapters, const char *counts)
{
    char c[64][64];
    int n = split(counts, c, 64);

    begin("stats", 11);
    k_int("engine", engine);
    k_dbl("time", 1767225610.0);
    k_int("running", running);
    k_int("waiting", waiting);
    k_dbl("kv_usage", 0.25);
    k_u64("num_preemptions", preemptions);
    k_int("step_adapters", step_adapters);
    k_int("step_tokens", step_tokens);
    k_dbl("step_seconds", 0.01);
    k_dbl("model_seconds", 0.008);
    if (!key("adapters"))
        return;
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        char name[64] = "";
        int r = 0, w = 0;
        sscanf(c[i], "%63[^:]:%d:%d", name, &r, &w);
        msgpack_pack_map(&pk, 3);
        k_str("name", name);
        k_int("running", r);
        k_int("waiting", w);
    }
}

static void b_stats(int engine, const char *counts)
{
    b_stats_ex(engine, 2, 4, 0, 0, 0, counts);
}

/* event; lora and reason NULL: absent. */
static void b_event(int engine, const char *event, const char *lora, const char *reason,
                    int n_prompt, int n_gen)
{
    begin("event", 6 + (lora != NULL) + (reason != NULL));
    k_int("engine", engine);
    k_str("request_id", "req-1");
    k_str("event", event);
    k_dbl("time", 1767225601.0);
    if (lora)
        k_str("lora", lora);
    if (reason)
        k_str("finish_reason", reason);
    k_int("num_prompt_tokens", n_prompt);
    k_int("num_generation_tokens", n_gen);
}

/* request_stats with every time set, t0 the arrival. */
static void b_request_stats(int engine, const char *lora, double t0, int n_gen, int max_tokens)
{
    begin("request_stats", 13 + (lora != NULL));
    k_int("engine", engine);
    k_str("request_id", "req-1-0");
    if (lora)
        k_str("lora", lora);
    k_str("finish_reason", "stop");
    k_dbl("arrival_time", t0);
    k_dbl("first_token_time", t0 + 0.125);
    k_dbl("finished_time", t0 + 0.625);
    k_dbl("queued_time", t0 + 0.001);
    k_dbl("scheduled_time", t0 + 0.01);
    k_dbl("engine_first_token_time", t0 + 0.1);
    k_dbl("engine_finished_time", t0 + 0.5);
    k_int("num_prompt_tokens", 5);
    k_int("num_generation_tokens", n_gen);
    k_int("max_tokens", max_tokens);
}

static void b_empty(const char *type)
{
    begin(type, 0);
}

static char last_err[512];

/* Applies the body in the buffer. */
static int put(struct lora_metrics_state *s, int source, uint64_t now_ms)
{
    last_err[0] = 0;
    return lora_metrics_state_apply(s, source, sb.data, sb.size, now_ms, last_err, sizeof(last_err));
}

#define PUT_OK(s, src, now)                                                                        \
    do {                                                                                           \
        int rc_ = put((s), (src), (now));                                                          \
        if (rc_ != 1) {                                                                            \
            printf("# %s:%d: apply returned %d: %s\n", __FILE__, __LINE__, rc_, last_err);         \
            check_cur_failed = 1;                                                                  \
        }                                                                                          \
    } while (0)

static struct lora_metrics_state *new_state(uint64_t timeout_ms, bool inflight)
{
    struct lora_metrics_state_options o = {.inflight = inflight, .engine_timeout_ms = timeout_ms};
    struct lora_metrics_state *s = lora_metrics_state_new(&o);
    if (!s) {
        printf("# lora_metrics_state_new failed\n");
        exit(1);
    }
    return s;
}

static const struct lora_metrics_state_adapter *find(const struct lora_metrics_state_engine *e, const char *name)
{
    for (int i = 0; e && i < e->n_adapters; i++)
        if (strcmp(e->adapters[i]->name, name) == 0)
            return e->adapters[i];
    return NULL;
}

/* Level, pinned and disagreement of an adapter, "-" when the engine does not track it. */
static const char *view(const struct lora_metrics_state_engine *e, const char *name)
{
    static char buf[64];
    static const char *const lv[] = {"none", "cpu", "gpu"};
    const struct lora_metrics_state_adapter *a = find(e, name);
    if (!a)
        return "-";
    snprintf(buf, sizeof(buf), "%s%s%s", lv[a->level], a->pinned ? " pinned" : "",
             a->disagrees ? " disagrees" : "");
    return buf;
}

#define CHECK_VIEW(e, name, want)                                                                  \
    do {                                                                                           \
        const char *v_ = view((e), (name));                                                        \
        if (strcmp(v_, (want)) != 0) {                                                             \
            printf("# %s:%d: %s is '%s', want '%s'\n", __FILE__, __LINE__, (name), v_, (want));    \
            check_cur_failed = 1;                                                                  \
        }                                                                                          \
    } while (0)

/* An engine with its whole state: config, registry, both ranks, stats. */
static void bring_up(struct lora_metrics_state *s, int src, int engine, uint64_t now)
{
    b_ready(engine, "tiny-llama", L2);
    PUT_OK(s, src, now);
    b_registry(engine, "sql,chat");
    PUT_OK(s, src, now);
    b_residency(engine, 0, "sql", "sql,chat", "");
    PUT_OK(s, src, now);
    b_residency(engine, 1, "sql", "sql,chat", "");
    PUT_OK(s, src, now);
    b_stats(engine, "sql:1:0");
    PUT_OK(s, src, now);
}

/* Every field of the model, as text: two equal snapshots mean no state change. Sources are left
 * out (their message counts change on every body). */
static char *snapshot(const struct lora_metrics_state *s)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    if (!f)
        exit(1);
    fprintf(f, "refused %" PRIu64 " engines %d\n", s->n_refused, s->n_engines);
    for (int i = 0; i < s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = s->engines[i];
        fprintf(f, "engine %d src %d from %d epoch %" PRIu64 " heard %" PRIu64 "\n", e->index,
                e->source, e->from_engine, e->epoch, e->last_heard_ms);
        fprintf(f, " config %d %s %a %d %d %d %d %d %d %d\n", e->has_config,
                e->model ? e->model : "(null)", e->start_time, e->max_loras, e->max_cpu_loras,
                e->max_lora_rank, e->block_size, e->num_kv_blocks, e->world_size, e->max_model_len);
        fprintf(f, " registry %d ranks %" PRIx64 " stats %d %d %d %a %" PRIu64 "\n",
                e->has_registry, e->rank_known, e->has_stats, e->running, e->waiting, e->kv_usage,
                e->num_preemptions);
        for (int r = 0; r < LORA_METRICS_STATE_MAX_WORLD; r++)
            if (e->has_dropped[r] || e->last_seq[r])
                fprintf(f, " rank %d dropped %" PRIu64 " seq %" PRIu64 "\n", r, e->dropped[r],
                        e->last_seq[r]);
        fprintf(f, " derived %d %d %d\n", e->n_gpu, e->n_cpu, e->n_disagree);
        fprintf(f, " counters");
        for (int k = 0; k < LORA_REASON_COUNT; k++)
            fprintf(f, " %" PRIu64, e->success[k]);
        fprintf(f, " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                e->prompt_tokens, e->generation_tokens, e->loads[0], e->loads[1], e->evictions[0],
                e->evictions[1]);
        for (int h = 0; h < LORA_H_COUNT; h++) {
            const struct lora_exposition_histogram *hi = &e->hist[h];
            fprintf(f, " hist %d %d %" PRIu64 " %a:", h, hi->n_bounds, hi->count, hi->sum);
            for (int b = 0; hi->buckets && b <= hi->n_bounds; b++)
                fprintf(f, " %" PRIu64, hi->buckets[b]);
            fprintf(f, "\n");
        }
        for (int k = 0; k < e->n_adapters; k++) {
            const struct lora_metrics_state_adapter *a = e->adapters[k];
            fprintf(f,
                    " adapter %s reg %d pin %" PRIx64 " level %d %d %d req %d %d acc %d %" PRIu64
                    " %" PRIu64 " ranks",
                    a->name, a->registered, a->rank_pinned, a->level, a->pinned, a->disagrees,
                    a->running, a->waiting, a->accounted, a->prompt_tokens, a->generation_tokens);
            for (int r = 0; r < LORA_METRICS_STATE_MAX_WORLD; r++)
                if (a->rank_level[r])
                    fprintf(f, " %d:%d", r, a->rank_level[r]);
            fprintf(f, "\n");
        }
    }
    fclose(f);
    return text;
}

/* ---- residency ------------------------------------------------------------------------------ */

static void test_residency_levels(void)
{
    struct lora_metrics_state *s = new_state(0, false);
    const struct lora_metrics_state_engine *e;

    b_ready(0, "m", L2);
    PUT_OK(s, -1, 1000);
    b_registry(0, "a,b,c,d,e,s");
    PUT_OK(s, -1, 1000);
    /* A free slot is an empty string. s sits in a slot of rank 0 without being listed in its
     * cache: a slot is in the cache too, so rank 0 holds it at gpu. */
    b_residency(0, 0, "a,,b,s", "a,b,c,d", "a,b");
    PUT_OK(s, -1, 1000);
    e = lora_metrics_state_engine(s, 0);
    CHECK(e != NULL);
    /* Rank 1 not heard yet: nothing is held by every rank. */
    CHECK_VIEW(e, "a", "none disagrees");
    CHECK(e->n_gpu == 0 && e->n_cpu == 0);
    b_residency(0, 1, "a", "a,b,c,s", "a");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "a", "gpu pinned");     /* gpu on both, both pin it */
    CHECK_VIEW(e, "b", "cpu disagrees");  /* gpu on rank 0, cpu on rank 1; one pin */
    CHECK_VIEW(e, "c", "cpu");            /* cpu on both */
    CHECK_VIEW(e, "d", "none disagrees"); /* held by rank 0 only */
    CHECK_VIEW(e, "e", "none");           /* registered, held nowhere */
    CHECK_VIEW(e, "s", "cpu disagrees");  /* gpu on rank 0, cpu on rank 1 */
    CHECK(find(e, "") == NULL);           /* the free slot is no adapter */
    CHECK(e->n_gpu == 1 && e->n_cpu == 4 && e->n_disagree == 3);
    /* The state that completes residency is no load. */
    CHECK(e->loads[0] == 0 && e->loads[1] == 0);

    /* b into a slot of rank 1, pinned there too: a load at gpu. */
    b_residency(0, 1, "a,b", "a,b,c,s", "a,b");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "b", "gpu pinned");
    CHECK(e->n_gpu == 2 && e->n_cpu == 4 && e->n_disagree == 2);
    CHECK(e->loads[0] == 0 && e->loads[1] == 1);

    /* a leaves rank 0's slot but stays in its cache: an eviction at gpu. */
    b_residency(0, 0, "b,s", "a,b,c,d", "a,b");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "a", "cpu pinned disagrees");
    CHECK(e->evictions[1] == 1 && e->evictions[0] == 0);
    /* c leaves rank 1's cache: an eviction at cpu. */
    b_residency(0, 1, "a,b", "a,b,s", "a,b");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "c", "none disagrees");
    CHECK(e->evictions[0] == 1 && e->evictions[1] == 1);
    CHECK(e->n_gpu == 1 && e->n_cpu == 3 && e->n_disagree == 4);

    /* u, not registered, comes into both caches (a load) and leaves one (no eviction: only
     * registered adapters are evicted). */
    b_residency(0, 0, "b,s", "a,b,c,d,u", "a,b");
    PUT_OK(s, -1, 1000);
    b_residency(0, 1, "a,b", "a,b,s,u", "a,b");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "u", "cpu");
    CHECK(e->loads[0] == 1);
    b_residency(0, 1, "a,b", "a,b,s", "a,b");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "u", "none disagrees");
    CHECK(e->evictions[0] == 1 && e->evictions[1] == 1);

    /* b removed on rank 0 (a notification with a remove timing): an unload, no eviction. */
    b_notifications(0, 0, 0, 1, "s", "a,c,d,u", "a", "remove:b:0.001");
    PUT_OK(s, -1, 1000);
    CHECK_VIEW(e, "b", "none disagrees");
    CHECK(e->evictions[0] == 1 && e->evictions[1] == 1);
    CHECK(e->epoch == 0);

    /* The same states in another order (ranks reversed, registry last) give the same levels. */
    b_residency(1, 1, "a", "a,b,c,s", "a");
    PUT_OK(s, -1, 1000);
    b_residency(1, 0, "a,,b,s", "a,b,c,d", "a,b");
    PUT_OK(s, -1, 1000);
    b_ready(1, "m", L2);
    PUT_OK(s, -1, 1000);
    b_registry(1, "a,b,c,d,e,s");
    PUT_OK(s, -1, 1000);
    const struct lora_metrics_state_engine *e1 = lora_metrics_state_engine(s, 1);
    CHECK_VIEW(e1, "a", "gpu pinned");
    CHECK_VIEW(e1, "b", "cpu disagrees");
    CHECK_VIEW(e1, "c", "cpu");
    CHECK_VIEW(e1, "d", "none disagrees");
    CHECK_VIEW(e1, "s", "cpu disagrees");
    CHECK(e1 && e1->n_gpu == 1 && e1->n_cpu == 4 && e1->n_disagree == 3);

    /* One rank: its word is the level. */
    b_ready(2, "m", L1);
    PUT_OK(s, -1, 1000);
    b_residency(2, 0, "x", "x,y", "y");
    PUT_OK(s, -1, 1000);
    const struct lora_metrics_state_engine *e2 = lora_metrics_state_engine(s, 2);
    CHECK_VIEW(e2, "x", "gpu");
    CHECK_VIEW(e2, "y", "cpu pinned");
    CHECK(e2 && e2->n_gpu == 1 && e2->n_cpu == 2 && e2->n_disagree == 0);
    lora_metrics_state_destroy(&s);
    CHECK(s == NULL);
}

/* ---- readiness and lost engines ------------------------------------------------------------- */

static void test_readiness(void)
{
    struct lora_metrics_state *s = new_state(0, false);
    const struct lora_metrics_state_engine *e;

    CHECK(lora_metrics_state_engine(s, 0) == NULL);
    /* Pieces in a scrambled order; ready only with the last one. */
    b_registry(0, "sql");
    PUT_OK(s, -1, 1000);
    e = lora_metrics_state_engine(s, 0);
    CHECK(e && !lora_metrics_state_engine_is_ready(e) && !lora_metrics_state_engine_shows_gauges(s, e, 1000));
    CHECK(lora_metrics_state_model_name(s, e) == NULL);
    b_stats(0, "");
    PUT_OK(s, -1, 1000);
    CHECK(!lora_metrics_state_engine_is_ready(e));
    b_residency(0, 1, "", "sql", "");
    PUT_OK(s, -1, 1000);
    CHECK(!lora_metrics_state_engine_is_ready(e));
    b_ready(0, "tiny-llama", L2);
    PUT_OK(s, -1, 1000);
    CHECK(!lora_metrics_state_engine_is_ready(e)); /* rank 0 missing */
    CHECK(lora_metrics_state_model_name(s, e) && strcmp(lora_metrics_state_model_name(s, e), "tiny-llama") == 0);
    /* A rank outside the world does not stand in for rank 0. */
    b_residency(0, 5, "", "sql", "");
    PUT_OK(s, -1, 1000);
    CHECK(!lora_metrics_state_engine_is_ready(e));
    /* A notification carries a rank's state as well as a residency_reply. */
    b_notifications(0, 0, 0, 1, "sql", "sql", "", "load:sql:0.02");
    PUT_OK(s, -1, 1000);
    CHECK(lora_metrics_state_engine_is_ready(e));
    CHECK(lora_metrics_state_engine_shows_gauges(s, e, 1000));
    CHECK(lora_metrics_state_engine_shows_gauges(s, e, UINT64_MAX)); /* timeout 0: never lost */
    CHECK(!lora_metrics_state_engine_is_lost(s, e, UINT64_MAX));
    CHECK(e->hist[LORA_H_LOAD_SECONDS].count == 1);
    lora_metrics_state_destroy(&s);

    /* --model-name names every engine, before its config too. */
    struct lora_metrics_state_options o = {.model_name = "served"};
    s = lora_metrics_state_new(&o);
    CHECK(s != NULL);
    b_stats(3, "");
    PUT_OK(s, -1, 1);
    e = lora_metrics_state_engine(s, 3);
    CHECK(e && lora_metrics_state_model_name(s, e) && strcmp(lora_metrics_state_model_name(s, e), "served") == 0);
    lora_metrics_state_destroy(&s);
    lora_metrics_state_destroy(&s); /* a NULL pointer: nothing */
}

static void test_lost_and_recovery(void)
{
    struct lora_metrics_state *s = new_state(1000, false);
    int src = lora_metrics_state_add_source(s, "tcp://127.0.0.1:5557", LORA_SOURCE_ENGINE);
    const struct lora_metrics_state_engine *e;
    char h[512];

    CHECK(src == 0);
    bring_up(s, src, 0, 10000);
    b_event(0, "FINISHED", "sql", "stop", 5, 7);
    PUT_OK(s, src, 10000);
    e = lora_metrics_state_engine(s, 0);
    CHECK(e && lora_metrics_state_engine_shows_gauges(s, e, 11000)); /* silent for exactly the timeout */
    CHECK(!lora_metrics_state_engine_is_lost(s, e, 11000));
    CHECK(lora_metrics_state_health(s, 11000, h, sizeof(h)) && strcmp(h, "ok\n") == 0);
    CHECK(lora_metrics_state_engine_is_lost(s, e, 11001));
    CHECK(!lora_metrics_state_engine_shows_gauges(s, e, 11001));
    CHECK(lora_metrics_state_engine_is_ready(e)); /* its state is still all there, but stale */
    CHECK(!lora_metrics_state_health(s, 12500, h, sizeof(h)));
    CHECK_CONTAINS(h, "tcp://127.0.0.1:5557: silent for 2.5 s\n");
    CHECK_CONTAINS(h, "engine 0: silent for 2.5 s\n");
    /* A frontend's request_stats is not the engine speaking. */
    b_request_stats(0, "sql", 1767225600.0, 3, 16);
    PUT_OK(s, -1, 13000);
    CHECK(lora_metrics_state_engine_is_lost(s, e, 13000));

    /* The engine speaks again: it must send its whole state before its gauges return; its
     * config and counters stay. */
    b_stats(0, "sql:1:0");
    PUT_OK(s, src, 20000);
    CHECK(!lora_metrics_state_engine_is_lost(s, e, 20000));
    CHECK(!lora_metrics_state_engine_is_ready(e) && !lora_metrics_state_engine_shows_gauges(s, e, 20000));
    CHECK(e->has_config && e->has_stats && !e->has_registry && e->rank_known == 0);
    CHECK(e->success[LORA_REASON_STOP] == 1 && e->epoch == 0);
    CHECK(!lora_metrics_state_health(s, 20000, h, sizeof(h)));
    CHECK_CONTAINS(h, "engine 0: waiting for its state: registry rank-0 rank-1\n");
    b_registry(0, "sql,chat");
    PUT_OK(s, src, 20000);
    b_residency(0, 0, "sql", "sql", "");
    PUT_OK(s, src, 20000);
    CHECK(!lora_metrics_state_engine_is_ready(e));
    b_residency(0, 1, "sql", "sql", "");
    PUT_OK(s, src, 20000);
    CHECK(lora_metrics_state_engine_shows_gauges(s, e, 20500));
    CHECK(lora_metrics_state_health(s, 20500, h, sizeof(h)));
    CHECK(e->success[LORA_REASON_STOP] == 1 && e->epoch == 0);
    lora_metrics_state_destroy(&s);
}

/* ---- restarts ------------------------------------------------------------------------------- */

static void test_restarts(void)
{
    struct lora_metrics_state *s = new_state(1000, false);
    int a = lora_metrics_state_add_source(s, "ipc://a", LORA_SOURCE_ENGINE);
    int b = lora_metrics_state_add_source(s, "ipc://b", LORA_SOURCE_ENGINE);
    int fe = lora_metrics_state_add_source(s, "ipc://fe", LORA_SOURCE_FRONTEND);
    const struct lora_metrics_state_engine *e0, *e1, *e5;

    bring_up(s, a, 0, 5000);
    bring_up(s, b, 1, 5000);
    for (int i = 0; i < 2; i++) {
        b_event(0, "FINISHED", "sql", "stop", 5, 7);
        PUT_OK(s, a, 5000);
        b_event(1, "FINISHED", "sql", "length", 3, 4);
        PUT_OK(s, b, 5000);
    }
    b_request_stats(5, NULL, 1767225600.0, 2, 16); /* engine 5: heard from a frontend only */
    PUT_OK(s, fe, 5000);
    e0 = lora_metrics_state_engine(s, 0);
    e1 = lora_metrics_state_engine(s, 1);
    e5 = lora_metrics_state_engine(s, 5);
    CHECK(e0 && e1 && e5 && e0->success[LORA_REASON_STOP] == 2 && e0->prompt_tokens == 10);
    CHECK(find(e0, "sql") && find(e0, "sql")->generation_tokens == 14);

    /* The connection to a broke: engine 0 starts a new epoch, engine 1 does not. */
    lora_metrics_state_source_lost(s, a, 5100);
    CHECK(e0->epoch == 1 && e0->success[LORA_REASON_STOP] == 0 && e0->prompt_tokens == 0);
    CHECK(!e0->has_config && !lora_metrics_state_engine_is_ready(e0) && e0->n_adapters == 0);
    CHECK(e0->hist[LORA_H_PROMPT_TOKENS].buckets == NULL); /* sized by the next config */
    CHECK(e0->source == a);
    /* Just restarted is not silent: health asks for its state, not for a sign of life. */
    CHECK(!lora_metrics_state_engine_is_lost(s, e0, 5100));
    char h[512];
    CHECK(!lora_metrics_state_health(s, 5100, h, sizeof(h)));
    CHECK_CONTAINS(h, "engine 0: waiting for its state: config registry rank-0 stats\n");
    CHECK(e1->epoch == 0 && e1->success[LORA_REASON_LENGTH] == 2);
    lora_metrics_state_source_lost(s, fe, 5100); /* engine 5 was never heard from itself */
    CHECK(e5->epoch == 0 && e5->hist[LORA_H_E2E].count == 1);
    lora_metrics_state_source_lost(s, 99, 5100); /* no such source: nothing */

    /* Config: the same ready changes nothing, another model or limit is a restart. */
    b_ready(1, "tiny-llama", L2);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 0 && e1->has_registry && e1->success[LORA_REASON_LENGTH] == 2);
    b_ready(1, "other-model", L2);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 1 && e1->success[LORA_REASON_LENGTH] == 0 && !e1->has_registry);
    CHECK(strcmp(e1->model, "other-model") == 0 && e1->has_config);
    struct limits l = L2;
    l.max_loras = 3;
    b_ready(1, "other-model", l);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 2 && e1->max_loras == 3);
    l.max_model_len = 100;
    b_ready(1, "other-model", l);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 3 && e1->hist[LORA_H_PROMPT_TOKENS].n_bounds == 7); /* 1 .. 50 */
    /* start_time: absent reads as 0; a new one is a restarted engine. */
    b_ready_ex(1, "other-model", l, true, 0);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 3);
    b_ready_ex(1, "other-model", l, true, 1767225000.5);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 4 && e1->start_time == 1767225000.5);
    b_ready_ex(1, "other-model", l, true, 1767225000.5);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == 4);
    /* A start_time that is no number at all is as good as absent, and so is NaN: neither may
     * restart the engine on every ready. */
    b_ready_ex(1, "other-model", l, true, NAN);
    PUT_OK(s, b, 5200);
    uint64_t ep = e1->epoch;
    b_ready_ex(1, "other-model", l, true, NAN);
    PUT_OK(s, b, 5200);
    CHECK(e1->epoch == ep);

    /* num_preemptions going back. */
    bring_up(s, a, 0, 6000);
    b_stats_ex(0, 1, 0, 5, 0, 0, "");
    PUT_OK(s, a, 6000);
    b_stats_ex(0, 1, 0, 5, 0, 0, "");
    PUT_OK(s, a, 6000);
    b_event(0, "FINISHED", "sql", "stop", 5, 7);
    PUT_OK(s, a, 6000);
    CHECK(e0->epoch == 1 && e0->success[LORA_REASON_STOP] == 1);
    b_stats_ex(0, 1, 0, 3, 0, 0, "");
    PUT_OK(s, a, 6000);
    CHECK(e0->epoch == 2 && e0->success[LORA_REASON_STOP] == 0);
    CHECK(e0->has_stats && e0->num_preemptions == 3);
    CHECK(!lora_metrics_state_engine_is_lost(s, e0, 6000));

    /* A rank's dropped count going back. */
    b_notifications(1, 0, 4, 0, "", "", "", "");
    PUT_OK(s, b, 6000);
    b_notifications(1, 0, 4, 0, "", "", "", "");
    PUT_OK(s, b, 6000);
    b_notifications(1, 1, 9, 0, "", "", "", ""); /* another rank's count is its own */
    PUT_OK(s, b, 6000);
    ep = e1->epoch;
    b_notifications(1, 0, 2, 0, "", "", "", "");
    PUT_OK(s, b, 6000);
    CHECK(e1->epoch == ep + 1);
    CHECK(e1->dropped[0] == 2 && !e1->has_dropped[1]);

    /* A rank's notification sequence number going back. */
    b_notifications(1, 1, 0, 10, "", "x", "", "");
    PUT_OK(s, b, 6000);
    b_notifications(1, 1, 0, 11, "", "x", "", "");
    PUT_OK(s, b, 6000);
    CHECK(e1->epoch == ep + 1 && e1->last_seq[1] == 11);
    b_notifications(1, 1, 0, 5, "", "x", "", "");
    PUT_OK(s, b, 6000);
    CHECK(e1->epoch == ep + 2 && e1->last_seq[1] == 5);
    CHECK(!lora_metrics_state_engine_is_lost(s, e1, 6000));
    lora_metrics_state_destroy(&s);
}

/* ---- vllm:lora_requests_info ---------------------------------------------------------------- */

/* registry: chat code idle slot1 sql. Both ranks hold sql and chat in slots, code in the cache;
 * ghost sits in both ranks' slots unregistered; slot1 in a slot of rank 0 only; odd in rank 0's
 * cache only. Requests: sql 2 running 1 waiting, code 3 waiting, ghost 1 waiting, slot1 1
 * waiting, new (unregistered, held nowhere) 1 running 2 waiting, chat none. */
static void lora_sets_engine(struct lora_metrics_state *s)
{
    b_ready(0, "m", L2);
    PUT_OK(s, -1, 1);
    b_registry(0, "sql,chat,code,idle,slot1");
    PUT_OK(s, -1, 1);
    b_residency(0, 0, "sql,chat,ghost,slot1", "sql,chat,code,odd,ghost,slot1", "chat");
    PUT_OK(s, -1, 1);
    b_residency(0, 1, "sql,chat,ghost", "sql,chat,code,ghost,slot1", "chat");
    PUT_OK(s, -1, 1);
    b_stats(0, "sql:2:1,code:0:3,ghost:0:1,slot1:0:1,new:1:2,chat:0:0");
    PUT_OK(s, -1, 1);
}

static void check_sets(struct lora_metrics_state *s, const char *want_running, const char *want_waiting)
{
    char *running = NULL, *waiting = NULL;
    const struct lora_metrics_state_engine *e = lora_metrics_state_engine(s, 0);

    CHECK(e && lora_metrics_state_lora_sets(s, e, &running, &waiting) == 0);
    if (!running || !waiting || strcmp(running, want_running) || strcmp(waiting, want_waiting)) {
        printf("# running '%s' waiting '%s', want '%s' and '%s'\n", running, waiting, want_running,
               want_waiting);
        check_cur_failed = 1;
    }
    free(running);
    free(waiting);
}

static void test_lora_sets(void)
{
    /* The man page: by default running are the registered adapters in a compute slot on every
     * rank, waiting the adapters with queued requests that are not so resident. */
    struct lora_metrics_state *s = new_state(0, false);
    lora_sets_engine(s);
    const struct lora_metrics_state_engine *e = lora_metrics_state_engine(s, 0);
    check_sets(s, "chat,sql", "code,ghost,new,slot1");
    CHECK(lora_metrics_state_adapter_is_ready(find(e, "sql")));
    CHECK(!lora_metrics_state_adapter_is_ready(find(e, "ghost"))); /* resident, not registered */
    CHECK(!lora_metrics_state_adapter_is_ready(find(e, "slot1"))); /* registered, one rank's slot */
    CHECK(!lora_metrics_state_adapter_is_ready(find(e, "code")));  /* in the caches only */
    CHECK_VIEW(e, "chat", "gpu pinned");
    CHECK_VIEW(e, "slot1", "cpu disagrees");
    CHECK_VIEW(e, "odd", "none disagrees");
    /* sql leaves a slot: no longer running, and waiting since it has a queued request. */
    b_residency(0, 1, "chat,ghost", "sql,chat,code,ghost,slot1", "chat");
    PUT_OK(s, -1, 1);
    check_sets(s, "chat", "code,ghost,new,slot1,sql");
    lora_metrics_state_destroy(&s);

    /* --lora-info=inflight: the adapters with a request in the batch, and in the queue. */
    s = new_state(0, true);
    lora_sets_engine(s);
    check_sets(s, "new,sql", "code,ghost,new,slot1,sql");
    b_stats(0, "");
    PUT_OK(s, -1, 1);
    check_sets(s, "", "");
    lora_metrics_state_destroy(&s);

    /* Nothing known: two empty strings. */
    s = new_state(0, false);
    b_ready(0, "m", L1);
    PUT_OK(s, -1, 1);
    check_sets(s, "", "");
    lora_metrics_state_destroy(&s);
}

/* ---- cardinality ---------------------------------------------------------------------------- */

static void test_cardinality(void)
{
    struct lora_metrics_state *s = new_state(0, false);
    const struct lora_metrics_state_engine *e;

    b_ready(0, "m", L1);
    PUT_OK(s, -1, 1);
    b_registry(0, "r");
    PUT_OK(s, -1, 1);
    b_residency(0, 0, "", "h", "");
    PUT_OK(s, -1, 1);
    b_stats(0, "q:0:1");
    PUT_OK(s, -1, 1);
    e = lora_metrics_state_engine(s, 0);
    CHECK(e->n_adapters == 3 && find(e, "r") && find(e, "h") && find(e, "q"));
    b_event(0, "FINISHED", "q", "stop", 5, 2);
    PUT_OK(s, -1, 1);
    CHECK(find(e, "q")->prompt_tokens == 5 && find(e, "q")->accounted);
    /* An event or request_stats of an adapter nothing else names adds none. */
    b_event(0, "FINISHED", "zzz", "stop", 5, 2);
    PUT_OK(s, -1, 1);
    b_request_stats(0, "yyy", 1767225600.0, 3, 16);
    PUT_OK(s, -1, 1);
    CHECK(e->n_adapters == 3 && !find(e, "zzz") && !find(e, "yyy"));
    CHECK(e->prompt_tokens == 10); /* the engine's own counter has both */

    /* q's requests are over: forgotten, with its counters. */
    b_stats(0, "");
    PUT_OK(s, -1, 1);
    CHECK(e->n_adapters == 2 && !find(e, "q"));
    b_stats(0, "q:1:0");
    PUT_OK(s, -1, 1);
    CHECK(find(e, "q") && find(e, "q")->prompt_tokens == 0 && !find(e, "q")->accounted);
    /* unregistered and held nowhere: gone; held but not registered: kept. */
    b_registry(0, "");
    PUT_OK(s, -1, 1);
    CHECK(!find(e, "r") && find(e, "h") && find(e, "q"));
    b_residency(0, 0, "", "", "");
    PUT_OK(s, -1, 1);
    CHECK(!find(e, "h"));
    /* pinned counts as held */
    b_residency(0, 0, "", "", "p");
    PUT_OK(s, -1, 1);
    CHECK(find(e, "p") != NULL);

    /* A burst of names in one stats, then none: bounded by what is named now. */
    char counts[64 * 12];
    size_t at = 0;
    for (int i = 0; i < 60; i++)
        at += (size_t)snprintf(counts + at, sizeof(counts) - at, "%sa%d:0:1", i ? "," : "", i);
    b_stats(0, counts);
    PUT_OK(s, -1, 1);
    CHECK(e->n_adapters == 61);
    for (int i = 1; i < e->n_adapters; i++)
        CHECK(strcmp(e->adapters[i - 1]->name, e->adapters[i]->name) < 0);
    b_stats(0, "");
    PUT_OK(s, -1, 1);
    CHECK(e->n_adapters == 1 && find(e, "p"));
    lora_metrics_state_destroy(&s);
}

/* ---- counters and histograms ---------------------------------------------------------------- */

static void test_counters(void)
{
    struct lora_metrics_state *s = new_state(0, false);
    const struct lora_metrics_state_engine *e;

    bring_up(s, -1, 0, 1);
    e = lora_metrics_state_engine(s, 0);
    /* max_model_len 4096: 1, 2, 5, ... 2000 (vLLM's build_1_2_5_buckets). */
    const struct lora_exposition_histogram *pt = &e->hist[LORA_H_PROMPT_TOKENS];
    CHECK(pt->n_bounds == 11 && pt->bounds[0] == 1 && pt->bounds[10] == 2000);
    CHECK(e->hist[LORA_H_TTFT].n_bounds == 22 && e->hist[LORA_H_TTFT].bounds[21] == 2560.0);

    static const char *const reasons[] = {"stop", "length", "abort", "error", "stop"};
    for (int i = 0; i < COUNT(reasons); i++) {
        b_event(0, "FINISHED", "sql", reasons[i], 5, 7);
        PUT_OK(s, -1, 1);
    }
    b_event(0, "FINISHED", "chat", "abort", 9, 0); /* no token: its prompt is not counted */
    PUT_OK(s, -1, 1);
    uint64_t refused = s->n_refused;
    b_event(0, "FINISHED", "sql", "weird", 1, 1); /* an unknown reason is counted nowhere */
    PUT_OK(s, -1, 1);
    CHECK(s->n_refused == refused + 1);
    b_event(0, "QUEUED", "sql", NULL, 5, 0);
    PUT_OK(s, -1, 1);
    CHECK(e->success[LORA_REASON_STOP] == 2 && e->success[LORA_REASON_LENGTH] == 1);
    CHECK(e->success[LORA_REASON_ABORT] == 2 && e->success[LORA_REASON_ERROR] == 1);
    CHECK(e->prompt_tokens == 26 && e->generation_tokens == 36);
    CHECK(find(e, "sql")->prompt_tokens == 26 && find(e, "chat")->prompt_tokens == 0);
    CHECK(pt->count == 7 && pt->buckets[2] == 5); /* 5 tokens: bucket le=5 */

    /* request_stats: the latency histograms; ITL observes the mean interval n-1 times. */
    b_request_stats(0, "sql", 1767225600.0, 5, 16);
    PUT_OK(s, -1, 1);
    CHECK(e->hist[LORA_H_TTFT].count == 1 && e->hist[LORA_H_E2E].count == 1);
    CHECK(e->hist[LORA_H_ITL].count == 4);
    CHECK_NEAR(e->hist[LORA_H_ITL].sum, 0.5, 1e-6);
    CHECK_NEAR(e->hist[LORA_H_TTFT].sum, 0.125, 1e-6);
    CHECK(e->hist[LORA_H_MAX_TOKENS].count == 1);
    b_request_stats(0, "sql", 1767225600.0, 1, -1); /* max_tokens left to the context */
    PUT_OK(s, -1, 1);
    CHECK(e->hist[LORA_H_MAX_TOKENS].count == 1 && e->hist[LORA_H_ITL].count == 4);

    /* stats: the step histograms, only for a step that computed tokens. */
    b_stats_ex(0, 1, 0, 0, 40, 2, "");
    PUT_OK(s, -1, 1);
    b_stats_ex(0, 1, 0, 0, 0, 0, "");
    PUT_OK(s, -1, 1);
    CHECK(e->hist[LORA_H_ITERATION_TOKENS].count == 1 && e->hist[LORA_H_STEP_ADAPTERS].count == 1);
    lora_metrics_state_destroy(&s);
}

/* ready with startup_loads "rank:seq:transition:name:seconds,...". */
static void b_ready_loads(int engine, struct limits l, const char *loads)
{
    char t[16][64];
    int n = split(loads, t, 16);

    begin("ready", 5);
    k_int("version", 1);
    k_int("engine_index", engine);
    k_str("model", "tiny-llama");
    if (key("limits")) {
        msgpack_pack_map(&pk, 10);
        k_int("max_loras", l.max_loras);
        k_int("max_cpu_loras", l.max_cpu_loras);
        k_int("max_lora_rank", 16);
        k_int("block_size", 16);
        k_int("num_kv_blocks", 512);
        k_int("world_size", l.world_size);
        k_int("max_model_len", l.max_model_len);
        k_int("max_num_batched_tokens", 512);
        k_int("max_num_seqs", 64);
        k_int("vocab_size", 259);
    }
    if (!key("startup_loads"))
        return;
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        int rank = 0;
        unsigned long long seq = 0;
        char tr[64] = "", name[64] = "";
        double sec = 0;
        sscanf(t[i], "%d:%llu:%63[^:]:%63[^:]:%lf", &rank, &seq, tr, name, &sec);
        msgpack_pack_map(&pk, 5);
        k_int("rank", rank);
        k_u64("seq", seq);
        k_str("name", name);
        k_str("transition", tr);
        k_dbl("seconds", sec);
    }
}

/* sql loaded and activated on both ranks, chat loaded on rank 0 only. */
static const char *const STARTUP = "0:1:load:sql:0.5,1:1:load:sql:0.25,0:2:activate:sql:0.001,"
                                   "1:2:activate:sql:0.002,0:3:load:chat:0.2";

static void test_startup_loads(void)
{
    /* A subscriber that joins after ready: every start-up load counts, once. */
    struct lora_metrics_state *s = new_state(0, false);
    b_ready_loads(0, L2, STARTUP);
    PUT_OK(s, -1, 1);
    const struct lora_metrics_state_engine *e = lora_metrics_state_engine(s, 0);
    CHECK(e && e->hist[LORA_H_LOAD_SECONDS].count == 3);
    CHECK(e && e->hist[LORA_H_ACTIVATE_SECONDS].count == 2);
    CHECK_NEAR(e ? e->hist[LORA_H_LOAD_SECONDS].sum : 0, 0.95, 1e-9);
    /* Engine-wide: only what every rank did (chat is on rank 0 alone). */
    CHECK(e && e->loads[0] == 1 && e->loads[1] == 1);
    b_ready_loads(0, L2, STARTUP); /* published again at every interval */
    PUT_OK(s, -1, 2);
    CHECK(e->hist[LORA_H_LOAD_SECONDS].count == 3 && e->loads[0] == 1);
    lora_metrics_state_destroy(&s);

    /* A subscriber that saw part of start-up live: rank 0 from its first notification on,
     * rank 1 from its second. What it saw is not counted again. */
    s = new_state(0, false);
    b_notifications(0, 0, 0, 1, "", "sql", "", "load:sql:0.5");
    PUT_OK(s, -1, 1);
    b_notifications(0, 0, 0, 2, "sql", "sql", "", "activate:sql:0.001");
    PUT_OK(s, -1, 1);
    b_notifications(0, 1, 0, 2, "sql", "sql", "", "activate:sql:0.002");
    PUT_OK(s, -1, 1);
    b_notifications(0, 0, 0, 3, "sql", "sql,chat", "", "load:chat:0.2");
    PUT_OK(s, -1, 1);
    b_ready_loads(0, L2, STARTUP);
    PUT_OK(s, -1, 2);
    e = lora_metrics_state_engine(s, 0);
    CHECK(e && e->hist[LORA_H_LOAD_SECONDS].count == 3); /* two live, rank 1's seq 1 */
    CHECK(e && e->hist[LORA_H_ACTIVATE_SECONDS].count == 2);
    CHECK_NEAR(e ? e->hist[LORA_H_LOAD_SECONDS].sum : 0, 0.95, 1e-9);
    CHECK(e && e->loads[0] == 1 && e->loads[1] == 1);
    lora_metrics_state_destroy(&s);

    /* A restart under a live subscriber: the new engine's numbers only. */
    s = new_state(0, false);
    b_ready_loads(0, L1, "0:1:load:sql:0.5");
    PUT_OK(s, -1, 1);
    b_notifications(0, 0, 0, 5, "", "sql", "", "");
    PUT_OK(s, -1, 1);
    b_notifications(0, 0, 0, 1, "", "code", "", "load:code:0.125"); /* seq went back */
    PUT_OK(s, -1, 2);
    b_ready_loads(0, L1, "0:1:load:code:0.125");
    PUT_OK(s, -1, 3);
    e = lora_metrics_state_engine(s, 0);
    CHECK(e && e->epoch == 1 && e->hist[LORA_H_LOAD_SECONDS].count == 1);
    CHECK(e && e->loads[0] == 1);
    lora_metrics_state_destroy(&s);
}

/* ---- health --------------------------------------------------------------------------------- */

static void test_health(void)
{
    struct lora_metrics_state *s = new_state(5000, false);
    char h[512];

    CHECK(lora_metrics_state_health(s, 1, h, sizeof(h)) && strcmp(h, "ok\n") == 0);
    int e_src = lora_metrics_state_add_source(s, "ipc:///run/e0", LORA_SOURCE_ENGINE);
    int f_src = lora_metrics_state_add_source(s, "ipc:///run/f0", LORA_SOURCE_FRONTEND);
    int in = lora_metrics_state_add_source(s, "stdin", LORA_SOURCE_STDIN);
    CHECK(e_src == 0 && f_src == 1 && in == 2);
    CHECK(!lora_metrics_state_health(s, 1000, h, sizeof(h)));
    CHECK(strcmp(h, "ipc:///run/e0: nothing heard yet\n") == 0); /* frontends are optional */
    /* Heard, but the engine's state is incomplete. */
    b_ready(0, "m", L2);
    PUT_OK(s, e_src, 1000);
    CHECK(!lora_metrics_state_health(s, 1000, h, sizeof(h)));
    CHECK(strcmp(h, "engine 0: waiting for its state: registry rank-0 rank-1 stats\n") == 0);
    bring_up(s, e_src, 0, 1000);
    CHECK(lora_metrics_state_health(s, 6000, h, sizeof(h)) && strcmp(h, "ok\n") == 0);
    CHECK(!lora_metrics_state_health(s, 6001, h, sizeof(h)));
    CHECK(strcmp(h, "ipc:///run/e0: silent for 5.0 s\nengine 0: silent for 5.0 s\n") == 0);
    /* A small buffer truncates, always terminated. */
    char small[12];
    memset(small, 'x', sizeof(small));
    CHECK(!lora_metrics_state_health(s, 6001, small, sizeof(small)));
    CHECK(strlen(small) == sizeof(small) - 1 && strncmp(small, "ipc:///run/", 11) == 0);
    CHECK(!lora_metrics_state_health(s, 6001, NULL, 0));
    /* The end of standard input is unhealthy: nothing more will come. */
    lora_metrics_state_source_ended(s, in, "end of input");
    CHECK(!lora_metrics_state_health(s, 2000, h, sizeof(h)));
    CHECK(strcmp(h, "stdin: end of input\n") == 0);
    lora_metrics_state_source_ended(s, in, NULL);
    CHECK(!lora_metrics_state_health(s, 2000, h, sizeof(h)) && strcmp(h, "stdin: ended\n") == 0);
    lora_metrics_state_destroy(&s);
}

/* ---- malformed bodies ----------------------------------------------------------------------- */

static void raw(const void *bytes, size_t n)
{
    msgpack_sbuffer_clear(&sb);
    msgpack_sbuffer_write(&sb, bytes, n);
}

static void test_malformed(void)
{
    struct lora_metrics_state *s = new_state(1000, false);
    int src = lora_metrics_state_add_source(s, "ipc://e", LORA_SOURCE_ENGINE);
    struct {
        const char *what;
        const char *want; /* in the message */
    } cases[] = {
        {"reserved byte", "message: body: reserved byte 0xc1"},
        {"empty", "message: body: empty"},
        {"array", "message: body: not a map"},
        {"no type", "message: type: missing"},
        {"type int", "message: type: expected a string"},
        {"unknown type", "message: type: unknown type 'nope'"},
        {"truncated stats", "truncated"},
        {"trailing bytes", "trailing bytes"},
        {"ready without limits", "ready: limits: missing"},
        {"ready world 0 new engine", "ready: limits: world_size 0 is outside [1, 64]"},
        {"ready world 65", "ready: limits: world_size 65 is outside [1, 64]"},
        {"residency rank 64", "residency_reply: rank 64 is outside [0, 64)"},
        {"residency rank 64 new engine", "residency_reply: rank 64 is outside [0, 64)"},
        {"notifications rank 64", "notifications: rank 64 is outside [0, 64)"},
        {"stats running string", "stats: running: expected an integer"},
        {"stats running negative", "stats: running: -1 is out of range"},
        {"stats adapter not a map", "stats: adapters[0]"},
        {"registry adapters int", "registry: adapters: expected an array"},
        {"registry name with NUL", "NUL"},
        {"registry engine twice", "registry: engine: duplicate key"},
        {"engine index too big", "stats: engine index 2000000 is outside [0, 1000000]"},
        {"event bogus", "event: event: unknown value 'BOGUS'"},
        {"request_stats no finished_time", "request_stats: finished_time: missing"},
        {"notifications seq string", "notifications: items[0].seq: expected an integer"},
    };

    bring_up(s, src, 0, 1000);
    b_event(0, "FINISHED", "sql", "stop", 5, 7);
    PUT_OK(s, src, 1000);
    char *first = snapshot(s);
    for (int i = 0; i < COUNT(cases); i++) {
        const char *w = cases[i].what;
        if (!strcmp(w, "reserved byte")) {
            raw("\xc1", 1);
        } else if (!strcmp(w, "empty")) {
            raw("", 0);
        } else if (!strcmp(w, "array")) {
            raw("\x91\x01", 2);
        } else if (!strcmp(w, "no type")) {
            begin("x", 0);
            msgpack_sbuffer_clear(&sb);
            msgpack_pack_map(&pk, 1);
            k_int("engine", 0);
        } else if (!strcmp(w, "type int")) {
            msgpack_sbuffer_clear(&sb);
            msgpack_pack_map(&pk, 1);
            p_str("type");
            msgpack_pack_int64(&pk, 7);
        } else if (!strcmp(w, "unknown type")) {
            b_empty("nope");
        } else if (!strcmp(w, "truncated stats")) {
            b_stats(0, "sql:1:0");
            sb.size /= 2;
        } else if (!strcmp(w, "trailing bytes")) {
            b_stats(0, "sql:1:0");
            msgpack_pack_nil(&pk);
        } else if (!strcmp(w, "ready without limits")) {
            begin("ready", 3);
            k_int("version", 1);
            k_int("engine_index", 0);
            k_str("model", "m");
        } else if (!strcmp(w, "ready world 0 new engine")) {
            struct limits l = L2;
            l.world_size = 0;
            b_ready(7, "m", l);
        } else if (!strcmp(w, "ready world 65")) {
            struct limits l = L2;
            l.world_size = 65;
            b_ready(0, "m", l);
        } else if (!strcmp(w, "residency rank 64")) {
            b_residency(0, 64, "sql", "sql", "");
        } else if (!strcmp(w, "residency rank 64 new engine")) {
            b_residency(9, 64, "sql", "sql", "");
        } else if (!strcmp(w, "notifications rank 64")) {
            b_notifications(0, 64, 0, 1, "sql", "sql", "", "");
        } else if (!strcmp(w, "stats running string")) {
            begin("stats", 11);
            k_int("engine", 0);
            k_dbl("time", 1);
            k_str("running", "2");
            k_int("waiting", 0);
            k_dbl("kv_usage", 0);
            k_u64("num_preemptions", 0);
            k_int("step_adapters", 0);
            k_int("step_tokens", 0);
            k_dbl("step_seconds", 0);
            k_dbl("model_seconds", 0);
            k_names("adapters", "");
        } else if (!strcmp(w, "stats running negative")) {
            b_stats_ex(0, -1, 0, 0, 0, 0, "");
        } else if (!strcmp(w, "stats adapter not a map")) {
            b_stats(0, "");
            sb.size = 0;
            begin("stats", 11);
            k_int("engine", 0);
            k_dbl("time", 1);
            k_int("running", 2);
            k_int("waiting", 0);
            k_dbl("kv_usage", 0);
            k_u64("num_preemptions", 0);
            k_int("step_adapters", 0);
            k_int("step_tokens", 0);
            k_dbl("step_seconds", 0);
            k_dbl("model_seconds", 0);
            k_names("adapters", "sql");
        } else if (!strcmp(w, "registry adapters int")) {
            begin("registry", 2);
            k_int("engine", 0);
            k_int("adapters", 3);
        } else if (!strcmp(w, "registry name with NUL")) {
            begin("registry", 2);
            k_int("engine", 0);
            p_str("adapters");
            msgpack_pack_array(&pk, 1);
            msgpack_pack_map(&pk, 3);
            p_str("name");
            msgpack_pack_str_with_body(&pk, "a\0b", 3);
            k_str("path", "/a");
            k_u64("id", 1);
        } else if (!strcmp(w, "registry engine twice")) {
            begin("registry", 3);
            k_int("engine", 0);
            k_int("engine", 1);
            k_names("adapters", "");
        } else if (!strcmp(w, "engine index too big")) {
            b_stats(2000000, "");
        } else if (!strcmp(w, "event bogus")) {
            b_event(0, "BOGUS", NULL, NULL, 1, 1);
        } else if (!strcmp(w, "request_stats no finished_time")) {
            begin("request_stats", 8);
            k_int("engine", 0);
            k_str("request_id", "r");
            k_str("finish_reason", "stop");
            k_dbl("arrival_time", 1);
            k_int("num_prompt_tokens", 1);
            k_int("num_generation_tokens", 1);
            k_int("max_tokens", 1);
            k_dbl("queued_time", 1);
        } else if (!strcmp(w, "notifications seq string")) {
            begin("notifications", 4);
            k_int("engine", 0);
            k_int("rank", 0);
            k_u64("dropped", 0);
            p_str("items");
            msgpack_pack_array(&pk, 1);
            msgpack_pack_map(&pk, 5);
            k_str("kind", "lora_load");
            k_str("seq", "1");
            k_dbl("time", 1);
            k_state("", "", "");
            k_names("timings", "");
        }
        uint64_t n_bad = s->sources[src].n_malformed;
        char *before = snapshot(s);
        /* later than the last message: a refused body must not count as a sign of life */
        int rc = put(s, src, 1500 + (uint64_t)i);
        char *after = snapshot(s);
        if (rc != -1 || !strstr(last_err, cases[i].want) || strcmp(before, after) != 0) {
            printf("# %s: rc %d, message '%s', want '%s'; state %s\n", w, rc, last_err,
                   cases[i].want, strcmp(before, after) ? "changed" : "unchanged");
            if (strcmp(before, after))
                printf("# before:\n%s# after:\n%s", before, after);
            check_cur_failed = 1;
        }
        CHECK(s->sources[src].n_malformed == n_bad + 1);
        free(before);
        free(after);
    }
    CHECK(lora_metrics_state_engine(s, 7) == NULL && lora_metrics_state_engine(s, 9) == NULL);
    CHECK(lora_metrics_state_engine_shows_gauges(s, lora_metrics_state_engine(s, 0), 2000));
    CHECK(!lora_metrics_state_engine_shows_gauges(s, lora_metrics_state_engine(s, 0), 2001));

    /* Types of no interest here, and a worker's own messages (no engine): 0, nothing changes. */
    b_empty("heartbeat");
    CHECK(put(s, src, 1000) == 0);
    b_empty("shutdown");
    CHECK(put(s, src, 1000) == 0);
    b_notifications(-1, 0, 0, 1, "sql", "sql", "", "load:sql:0.5");
    CHECK(put(s, src, 1000) == 0);
    b_residency(-1, 1, "", "", "");
    CHECK(put(s, src, 1000) == 0);
    char *after = snapshot(s);
    CHECK(strcmp(first, after) == 0);
    free(after);
    free(first);
    /* no error buffer at all */
    raw("\xc1", 1);
    CHECK(lora_metrics_state_apply(s, src, sb.data, sb.size, 1000, NULL, 0) == -1);
    lora_metrics_state_destroy(&s);
}

/* ---- fuzz ----------------------------------------------------------------------------------- */

static const char *const pool[] = {"sql", "chat", "code", "idle", "odd", "x", "y", "zz"};

/* "a,b" from pool, each name with probability 1/3. */
static void random_csv(char *out, size_t size)
{
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < COUNT(pool); i++)
        if (rng() % 3 == 0)
            at += (size_t)snprintf(out + at, size - at, "%s%s", at ? "," : "", pool[i]);
}

/* A valid body of a random type, about a random engine 0..2 (world 1..3, ranks 0..3). */
static void random_body(void)
{
    char a[128], b[128], c[128], t[256];
    int engine = (int)(rng() % 3), rank = (int)(rng() % 4);

    if (rng() % 50 == 0) /* past the bound of ranks, or a new engine index */
        rank = 62 + (int)(rng() % 4);
    if (rng() % 50 == 0)
        engine = 3 + (int)(rng() % 3);

    random_csv(a, sizeof(a));
    random_csv(b, sizeof(b));
    random_csv(c, sizeof(c));
    switch (rng() % 9) {
    case 0: {
        struct limits l = {2, 4, 1 + (int)(rng() % 3), rng() % 4 ? 4096 : (int)(rng() % 100)};
        if (rng() % 20 == 0)
            l.world_size = rng() % 2 ? 0 : 64 + (int)(rng() % 2);
        if (rng() % 4)
            b_ready(engine, rng() % 8 ? "m" : "m2", l);
        else
            b_ready_ex(engine, "m", l, true, (double)(rng() % 3));
        break;
    }
    case 1:
        b_registry(engine, a);
        break;
    case 2:
    case 3:
        b_residency(rng() % 10 ? engine : -1, rank, a, b, c);
        break;
    case 4: {
        size_t at = 0;
        static const char *const tr[] = {"load", "activate", "evict", "remove"};
        t[0] = 0;
        for (int i = 0; i < (int)(rng() % 3); i++)
            at +=
                (size_t)snprintf(t + at, sizeof(t) - at, "%s%s:%s:%g", at ? "," : "", tr[rng() % 4],
                                 pool[rng() % COUNT(pool)], (double)(rng() % 100) / 50);
        b_notifications(rng() % 10 ? engine : -1, rank, rng() % 4, rng() % 12, a, b, c, t);
        break;
    }
    case 5: {
        size_t at = 0;
        t[0] = 0;
        for (int i = 0; i < COUNT(pool); i++)
            if (rng() % 3 == 0)
                at += (size_t)snprintf(t + at, sizeof(t) - at, "%s%s:%d:%d", at ? "," : "", pool[i],
                                       (int)(rng() % 3), (int)(rng() % 3));
        b_stats_ex(engine, (int)(rng() % 5), (int)(rng() % 5), rng() % 4, (int)(rng() % 50),
                   (int)(rng() % 4), t);
        break;
    }
    case 6: {
        static const char *const ev[] = {"QUEUED", "SCHEDULED", "PREEMPTED", "FINISHED"};
        static const char *const why[] = {"stop", "length", "abort", "error", "other"};
        b_event(engine, ev[rng() % 4], rng() % 4 ? pool[rng() % COUNT(pool)] : NULL,
                rng() % 4 ? why[rng() % 5] : NULL, (int)(rng() % 3000), (int)(rng() % 100));
        break;
    }
    case 7:
        b_request_stats(engine, rng() % 2 ? pool[rng() % COUNT(pool)] : NULL,
                        1767225600.0 + (double)(rng() % 100), (int)(rng() % 20),
                        (int)(rng() % 5000) - 1);
        break;
    default:
        b_empty(rng() % 2 ? "heartbeat" : "take_notifications");
        break;
    }
}

/* Truncation, flipped bytes, inserted and deleted bytes. */
static void mutate(void)
{
    int n_ops = 1 + (int)(rng() % 3);
    for (int k = 0; k < n_ops && sb.size; k++) {
        size_t at = rng() % sb.size;
        switch (rng() % 5) {
        case 0:
            sb.size = at;
            break;
        case 1:
            sb.data[at] ^= (char)(1u << (rng() % 8));
            break;
        case 2:
            sb.data[at] = (char)rng();
            break;
        case 3: {
            char byte = (char)rng();
            msgpack_sbuffer_write(&sb, &byte, 1); /* room for one more */
            memmove(sb.data + at + 1, sb.data + at, sb.size - 1 - at);
            sb.data[at] = byte;
            break;
        }
        default:
            memmove(sb.data + at, sb.data + at + 1, sb.size - at - 1);
            sb.size--;
            break;
        }
    }
}

static int n_violations;

#define INV(cond)                                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (n_violations++ < 5)                                                                \
                printf("# invariant broken (engine %d): %s\n", e->index, #cond);                   \
        }                                                                                          \
    } while (0)

/* The model's invariants, recomputed from the ranks' levels. */
static void check_invariants(struct lora_metrics_state *s, uint64_t now)
{
    if (s->n_engines < 0 || s->n_engines > LORA_METRICS_STATE_MAX_ENGINES) {
        n_violations++;
        return;
    }
    for (int i = 0; i < s->n_engines; i++) {
        const struct lora_metrics_state_engine *e = s->engines[i];
        INV(i == 0 || s->engines[i - 1]->index < e->index);
        INV(e->index >= 0 && e->index <= 1000000);
        int world = e->has_config ? e->world_size : 0;
        INV(!e->has_config || (world >= 1 && world <= LORA_METRICS_STATE_MAX_WORLD && e->model &&
                               e->hist[LORA_H_PROMPT_TOKENS].buckets));
        uint64_t mask = world >= 64 ? ~0ull : (1ull << world) - 1;
        int n_gpu = 0, n_cpu = 0, n_dis = 0;
        INV(e->n_adapters >= 0 && e->n_adapters <= LORA_METRICS_STATE_MAX_ADAPTERS);
        for (int k = 0; k < e->n_adapters; k++) {
            const struct lora_metrics_state_adapter *a = e->adapters[k];
            INV(a->name && a->name[0]);
            INV(k == 0 || strcmp(e->adapters[k - 1]->name, a->name) < 0);
            INV(a->running >= 0 && a->waiting >= 0);
            bool held = a->rank_pinned != 0;
            for (int r = 0; r < LORA_METRICS_STATE_MAX_WORLD; r++) {
                INV(a->rank_level[r] <= LORA_LEVEL_GPU);
                held |= a->rank_level[r] != LORA_LEVEL_NONE;
            }
            /* an adapter is tracked only while something refers to it */
            INV(a->registered || a->running || a->waiting || held);
            if (!world)
                continue;
            int lo = LORA_LEVEL_GPU, hi = LORA_LEVEL_NONE;
            for (int r = 0; r < world; r++) {
                lo = a->rank_level[r] < lo ? a->rank_level[r] : lo;
                hi = a->rank_level[r] > hi ? a->rank_level[r] : hi;
            }
            INV((int)a->level == lo);
            INV(a->disagrees == (lo != hi));
            INV(a->pinned == ((a->rank_pinned & mask) == mask));
            n_gpu += a->level == LORA_LEVEL_GPU;
            n_cpu += a->level != LORA_LEVEL_NONE;
            n_dis += a->disagrees;
        }
        INV(e->n_gpu == n_gpu && e->n_cpu == n_cpu && e->n_disagree == n_dis);
        for (int h = 0; h < LORA_H_COUNT; h++) {
            const struct lora_exposition_histogram *hi = &e->hist[h];
            uint64_t total = 0;
            for (int b = 0; hi->buckets && b <= hi->n_bounds; b++)
                total += hi->buckets[b];
            INV(total == hi->count);
        }
        /* the two sets agree with their definitions */
        char *running = NULL, *waiting = NULL;
        INV(lora_metrics_state_lora_sets(s, e, &running, &waiting) == 0);
        if (running && waiting) {
            int n_run = 0, n_wait = 0;
            for (int k = 0; k < e->n_adapters; k++) {
                const struct lora_metrics_state_adapter *a = e->adapters[k];
                bool run =
                    s->o.inflight ? a->running > 0 : a->registered && a->level == LORA_LEVEL_GPU;
                bool wait = a->waiting > 0 && (s->o.inflight || !run);
                n_run += run;
                n_wait += wait;
            }
            int c_run = *running != 0, c_wait = *waiting != 0;
            for (const char *p = running; *p; p++)
                c_run += *p == ',';
            for (const char *p = waiting; *p; p++)
                c_wait += *p == ',';
            INV(c_run == n_run && c_wait == n_wait);
        }
        free(running);
        free(waiting);
        (void)lora_metrics_state_engine_shows_gauges(s, e, now);
    }
}

static void test_fuzz(void)
{
    struct lora_metrics_state *s = new_state(2000, false);
    int src[3];
    uint64_t now = 1000, epochs[6] = {0};
    int n_refused_ok = 0, n_applied = 0, n_ignored = 0, n_changed_on_error = 0;
    char h[256];

    src[0] = lora_metrics_state_add_source(s, "ipc://e0", LORA_SOURCE_ENGINE);
    src[1] = lora_metrics_state_add_source(s, "ipc://e1", LORA_SOURCE_ENGINE);
    src[2] = lora_metrics_state_add_source(s, "stdin", LORA_SOURCE_STDIN);
    n_violations = 0;
    for (int iter = 0; iter < 8000; iter++) {
        int kind = (int)(rng() % 10);
        if (kind == 0) {
            /* (a) random bytes, some of them after a map header and a real type */
            size_t n = rng() % 48;
            msgpack_sbuffer_clear(&sb);
            if (rng() % 2) {
                msgpack_pack_map(&pk, 1 + rng() % 4);
                p_str("type");
                p_str(rng() % 2 ? "stats" : "notifications");
            }
            for (size_t i = 0; i < n; i++) {
                char byte = (char)rng();
                msgpack_sbuffer_write(&sb, &byte, 1);
            }
        } else {
            /* (b) a valid body, then maybe a wrong type for one key, or raw mutations */
            wrong_key = kind == 1 ? (int)(rng() % 24) : -1;
            random_body();
            wrong_key = -1;
            if (kind == 2 || kind == 3)
                mutate();
        }
        char *before = snapshot(s);
        int source = src[rng() % 3];
        int rc = put(s, source, now);
        char *after = snapshot(s);
        if (rc == -1) {
            n_refused_ok += last_err[0] != 0;
            if (!last_err[0] && n_violations++ < 5)
                printf("# refused without a message\n");
            /* refused: nothing changed (n_refused may count a bound) */
            if (strcmp(strchr(before, '\n'), strchr(after, '\n')) != 0 && n_changed_on_error++ < 3)
                printf("# iteration %d: '%s' changed the state:\n# before:\n%s# after:\n%s", iter,
                       last_err, before, after);
        } else if (rc == 0) {
            n_ignored++;
            if (strcmp(before, after) != 0 && n_changed_on_error++ < 3)
                printf("# iteration %d: an ignored body changed the state\n", iter);
        } else if (rc == 1) {
            n_applied++;
        } else {
            n_violations++;
        }
        free(before);
        free(after);
        check_invariants(s, now);
        for (int i = 0; i < 6; i++) {
            const struct lora_metrics_state_engine *e = lora_metrics_state_engine(s, i);
            if (e && e->epoch < epochs[i])
                n_violations++;
            if (e)
                epochs[i] = e->epoch;
        }
        if (rng() % 200 == 0)
            lora_metrics_state_source_lost(s, src[rng() % 3], now);
        (void)lora_metrics_state_health(s, now, h, 1 + rng() % sizeof(h));
        if (rng() % 500 == 0)
            s->o.inflight = !s->o.inflight;
        now += rng() % 700;
    }
    printf("# 8000 bodies: %d applied, %d ignored, %d refused with a message\n", n_applied,
           n_ignored, n_refused_ok);
    CHECK(n_violations == 0);
    CHECK(n_changed_on_error == 0);
    /* every path was taken often enough to mean something */
    CHECK(n_applied > 2000 && n_refused_ok > 1500 && n_ignored > 100);
    lora_metrics_state_destroy(&s);
}

int main(void)
{
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    RUN(test_residency_levels);
    RUN(test_readiness);
    RUN(test_lost_and_recovery);
    RUN(test_restarts);
    RUN(test_lora_sets);
    RUN(test_cardinality);
    RUN(test_startup_loads);
    RUN(test_counters);
    RUN(test_health);
    RUN(test_malformed);
    RUN(test_fuzz);
    msgpack_sbuffer_destroy(&sb);
    return check_done();
}
