/* Unit tests for lib/sched/scheduler, driven by a fake executor.
 *
 * The harness (struct sim) plays the engine: it schedules, checks the plan, "runs" it (every
 * sequence whose computation completes produces one token; a request finishes at its finish_at
 * count, max_tokens unless an early EOS is drawn) and reports back with update(). It keeps its
 * own model of every request, built only from what the plans say (events, sequences,
 * activations), and checks each plan against it: positions continue where the last step left
 * off, sampling happens exactly at the end of prompt ++ generated, block tables keep their
 * prefix and no block is in two sequences, the budget / max_num_seqs / max_loras limits hold,
 * running requests come before admissions, the slot mirror rebuilt from activations matches,
 * and the per-adapter running/waiting counts equal a recount of its own model. The scheduler's
 * own lora_scheduler_check() runs after every step as well.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "sched/scheduler.h"

#define ERR_BYTES     256
#define SIM_MAX_REQS  8192
#define SIM_MAX_SLOTS 8
#define SIM_TABLE_MAX 64
#define SIM_MAX_IDS   16 /* adapter ids 0..15 */

/* The stream of test_no_starvation_within_bound: max_tokens in MIN..MIN + SPREAD - 1. */
#define STARVE_MIN_TOKENS 3
#define STARVE_SPREAD     7

#define TEST_RANDOM_SEED 0x2545f4914f6cdd1dULL
#include "tests/common/test_random.h"

static int rnd_below(int n)
{
    return (int)(rng_next() % (uint64_t)n);
}

/* ---- harness ---- */

enum sim_state { SIM_NONE, SIM_WAITING, SIM_RUNNING, SIM_DONE, SIM_ABORTED, SIM_FAILED };

struct sim_req {
    enum sim_state state;
    int prompt, max_tokens, adapter;
    int finish_at; /* tokens after which the "engine" finishes it (EOS or length) */
    int generated, computed;
    int n_table;
    int table[SIM_TABLE_MAX];
    int n_preempted;
    bool ever_scheduled;
    uint64_t add_step, first_step, done_step, admitted_step;
    uint64_t admit_seq; /* order of admission into the running set */
};

struct sim {
    struct lora_scheduler_config cfg;
    struct lora_scheduler *s;
    struct lora_scheduler_plan plan;
    struct lora_scheduler_result *res;
    struct sim_req *reqs; /* request id = index + 1 */
    int n_reqs;
    int slot[SIM_MAX_SLOTS]; /* adapter in each slot, from the plans */
    int *block_stamp;        /* (n_blocks) last step a block was seen in a plan */
    uint64_t step, admit_counter;
    double now;
    int n_fail;
    bool forget_length; /* never report finished: the scheduler must end requests at max_tokens */
    /* Totals over the run. */
    int n_preemptions, n_activations, n_evictions, max_step_adapters, n_done;
};

#define SIM_CHECK(sim, cond)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if ((sim)->n_fail++ < 8)                                                               \
                printf("# %s:%d: step %llu: check failed: %s\n", __FILE__, __LINE__,               \
                       (unsigned long long)(sim)->step, #cond);                                    \
            check_cur_failed = 1;                                                                  \
        }                                                                                          \
    } while (0)

static void sim_config(struct lora_scheduler_config *c)
{
    lora_scheduler_config_default(c);
    c->max_num_seqs = 8;
    c->max_num_batched_tokens = 64;
    c->max_loras = 2;
    c->block_size = 4;
    c->n_blocks = 128;
    c->max_model_len = 128;
    c->max_requests = 256;
    c->max_adapters = 8;
    c->starvation_steps = 8;
}

static void sim_init(struct sim *sim, const struct lora_scheduler_config *c)
{
    char err[ERR_BYTES] = "";

    memset(sim, 0, sizeof(*sim));
    sim->cfg = *c;
    sim->s = lora_scheduler_new(c, err, sizeof(err));
    if (!sim->s)
        printf("# lora_scheduler_new: %s\n", err);
    CHECK(sim->s != NULL);
    CHECK(lora_scheduler_plan_init(sim->s, &sim->plan) == 0);
    sim->res = calloc((size_t)c->max_num_seqs, sizeof(*sim->res));
    sim->reqs = calloc(SIM_MAX_REQS, sizeof(*sim->reqs));
    sim->block_stamp = calloc((size_t)c->n_blocks, sizeof(*sim->block_stamp));
    CHECK(c->max_loras <= SIM_MAX_SLOTS);
}

static void sim_free(struct sim *sim)
{
    lora_scheduler_plan_release(&sim->plan);
    lora_scheduler_destroy(&sim->s);
    free(sim->res);
    free(sim->reqs);
    free(sim->block_stamp);
}

static struct sim_req *sim_req(struct sim *sim, uint64_t id)
{
    if (id < 1 || id > (uint64_t)sim->n_reqs)
        return NULL;
    return &sim->reqs[id - 1];
}

/* Adds a request; returns its id, or 0 when add() refused it (err says why). */
static uint64_t sim_add_eos(struct sim *sim, int prompt, int max_tokens, int adapter, int finish_at,
                            char *err)
{
    struct lora_scheduler_request q = {
        .id = (uint64_t)sim->n_reqs + 1,
        .n_prompt_tokens = prompt,
        .max_tokens = max_tokens,
        .adapter_id = adapter,
        .arrival_s = sim->now,
    };
    char local[ERR_BYTES];

    if (sim->n_reqs >= SIM_MAX_REQS)
        return 0;
    if (lora_scheduler_add(sim->s, &q, err ? err : local, ERR_BYTES) != 0)
        return 0;
    struct sim_req *r = &sim->reqs[sim->n_reqs++];
    *r = (struct sim_req){.state = SIM_WAITING,
                          .prompt = prompt,
                          .max_tokens = max_tokens,
                          .adapter = adapter,
                          .finish_at = finish_at,
                          .add_step = sim->step};
    return q.id;
}

static uint64_t sim_add(struct sim *sim, int prompt, int max_tokens, int adapter)
{
    return sim_add_eos(sim, prompt, max_tokens, adapter, max_tokens, NULL);
}

static void sim_abort(struct sim *sim, uint64_t id)
{
    struct sim_req *r = sim_req(sim, id);

    SIM_CHECK(sim, lora_scheduler_abort(sim->s, id) == 0);
    r->state = SIM_ABORTED;
    r->n_table = 0;
    SIM_CHECK(sim, lora_scheduler_abort(sim->s, id) == -1 && errno == ENOENT);
}

static void sim_clear_slot_of(struct sim *sim, int adapter)
{
    for (int k = 0; k < sim->cfg.max_loras; k++)
        if (sim->slot[k] == adapter)
            sim->slot[k] = 0;
}

static void sim_apply_activation(struct sim *sim, const struct lora_scheduler_activation *a)
{
    if (a->slot < 0)
        return;
    SIM_CHECK(sim, a->slot < sim->cfg.max_loras);
    SIM_CHECK(sim, sim->slot[a->slot] == a->evicted_id);
    for (int k = 0; k < sim->cfg.max_loras; k++)
        SIM_CHECK(sim, sim->slot[k] != a->adapter_id);
    sim->slot[a->slot] = a->adapter_id;
    sim->n_activations++;
    sim->n_evictions += a->evicted_id != 0;
}

/* Lifecycle events into the model. */
static void sim_apply_events(struct sim *sim)
{
    const struct lora_scheduler_plan *p = &sim->plan;
    int n_pre = 0;

    for (int i = 0; i < p->n_events; i++) {
        const struct lora_scheduler_event *e = &p->events[i];
        struct sim_req *r = sim_req(sim, e->request_id);

        SIM_CHECK(sim, r != NULL);
        if (!r)
            continue;
        switch (e->kind) {
        case LORA_SCHEDULER_EV_SCHEDULED:
            SIM_CHECK(sim, r->state == SIM_WAITING && !r->ever_scheduled);
            CHECK_NEAR(e->queued_s, sim->now - (double)r->add_step, 1e-9);
            r->ever_scheduled = true;
            r->first_step = sim->step;
            r->state = SIM_RUNNING;
            r->admitted_step = sim->step;
            r->admit_seq = ++sim->admit_counter;
            SIM_CHECK(sim, p->n_preempted == 0); /* no admissions in a step that preempts */
            break;
        case LORA_SCHEDULER_EV_RESUMED:
            SIM_CHECK(sim, r->state == SIM_WAITING && r->n_preempted > 0);
            r->state = SIM_RUNNING;
            r->admitted_step = sim->step;
            r->admit_seq = ++sim->admit_counter;
            SIM_CHECK(sim, p->n_preempted == 0);
            break;
        case LORA_SCHEDULER_EV_PREEMPTED:
            SIM_CHECK(sim, r->state == SIM_RUNNING);
            SIM_CHECK(sim, n_pre < p->n_preempted && p->preempted[n_pre] == e->request_id);
            n_pre++;
            r->state = SIM_WAITING;
            r->computed = 0;
            r->n_table = 0;
            r->n_preempted++;
            sim->n_preemptions++;
            break;
        default:
            SIM_CHECK(sim, 0);
        }
    }
    SIM_CHECK(sim, n_pre == p->n_preempted);
    /* Victims are the most recently admitted: newer than every request still running. */
    for (int i = 0; i < p->n_preempted; i++) {
        const struct sim_req *v = sim_req(sim, p->preempted[i]);

        for (int j = 0; v && j < sim->n_reqs; j++)
            if (sim->reqs[j].state == SIM_RUNNING)
                SIM_CHECK(sim, sim->reqs[j].admit_seq < v->admit_seq);
    }
}

static void sim_check_seq(struct sim *sim, const struct lora_scheduler_seq *q, bool *admitted_seen)
{
    struct sim_req *r = sim_req(sim, q->request_id);
    int bs = sim->cfg.block_size;

    SIM_CHECK(sim, r && r->state == SIM_RUNNING);
    if (!r || r->state != SIM_RUNNING)
        return;
    /* Running requests first, then this step's admissions. */
    bool admitted_now = r->admitted_step == sim->step;
    SIM_CHECK(sim, admitted_now || !*admitted_seen);
    *admitted_seen |= admitted_now;
    SIM_CHECK(sim, q->pos == r->computed);
    SIM_CHECK(sim, q->n_tokens >= 1 && q->pos + q->n_tokens <= r->prompt + r->generated);
    SIM_CHECK(sim, q->samples == (q->pos + q->n_tokens == r->prompt + r->generated));
    SIM_CHECK(sim, q->n_table_blocks == (q->pos + q->n_tokens + bs - 1) / bs);
    SIM_CHECK(sim, q->n_table_blocks <= SIM_TABLE_MAX);
    SIM_CHECK(sim, q->adapter_id == r->adapter);
    if (r->adapter == 0)
        SIM_CHECK(sim, q->adapter_slot == -1);
    else
        SIM_CHECK(sim, q->adapter_slot >= 0 && q->adapter_slot < sim->cfg.max_loras &&
                           sim->slot[q->adapter_slot] == r->adapter);
    for (int j = 0; j < q->n_table_blocks && j < SIM_TABLE_MAX; j++) {
        int b = q->block_table[j];

        SIM_CHECK(sim, b >= 0 && b < sim->cfg.n_blocks);
        if (b < 0 || b >= sim->cfg.n_blocks)
            continue;
        SIM_CHECK(sim, sim->block_stamp[b] != (int)sim->step); /* one sequence per block */
        sim->block_stamp[b] = (int)sim->step;
        if (j < r->n_table)
            SIM_CHECK(sim, r->table[j] == b); /* blocks never move under a sequence */
        r->table[j] = b;
    }
    r->n_table = q->n_table_blocks;
}

/* Per-adapter and total counts against a recount of the model. */
static void sim_check_counts(struct sim *sim)
{
    const struct lora_scheduler_plan *p = &sim->plan;
    int run[SIM_MAX_IDS] = {0}, wait[SIM_MAX_IDS] = {0}, held = 0;

    for (int i = 0; i < sim->n_reqs; i++) {
        const struct sim_req *r = &sim->reqs[i];

        if (r->state == SIM_RUNNING) {
            run[r->adapter]++;
            held += r->n_table;
        } else if (r->state == SIM_WAITING) {
            wait[r->adapter]++;
        }
    }
    int tot_run = run[0], tot_wait = wait[0];
    SIM_CHECK(sim, p->n_base_running == run[0] && p->n_base_waiting == wait[0]);
    for (int i = 0; i < p->n_adapters; i++) {
        const struct lora_scheduler_adapter_count *a = &p->adapters[i];

        SIM_CHECK(sim, a->adapter_id > 0 && a->adapter_id < SIM_MAX_IDS);
        if (a->adapter_id <= 0 || a->adapter_id >= SIM_MAX_IDS)
            continue;
        SIM_CHECK(sim, a->n_running == run[a->adapter_id] && a->n_waiting == wait[a->adapter_id]);
        tot_run += a->n_running;
        tot_wait += a->n_waiting;
    }
    /* Every adapter with requests is listed: the totals add up. */
    SIM_CHECK(sim, p->n_running == tot_run && p->n_waiting == tot_wait);
    SIM_CHECK(sim, lora_scheduler_n_running(sim->s) == p->n_running);
    SIM_CHECK(sim, lora_scheduler_n_waiting(sim->s) == p->n_waiting);
    SIM_CHECK(sim, p->n_running <= sim->cfg.max_num_seqs);
    SIM_CHECK(sim, held == sim->cfg.n_blocks - p->n_free_blocks);
    SIM_CHECK(sim, p->n_free_blocks == lora_scheduler_n_free_blocks(sim->s));
    CHECK_NEAR(p->kv_usage, (double)held / sim->cfg.n_blocks, 1e-12);
}

static void sim_check_plan(struct sim *sim)
{
    const struct lora_scheduler_plan *p = &sim->plan;
    int ids[SIM_MAX_IDS] = {0}, distinct = 0, tokens = 0;
    bool admitted_seen = false;
    char err[ERR_BYTES] = "";

    SIM_CHECK(sim, p->step == sim->step);
    for (int i = 0; i < p->n_unloaded; i++)
        sim_clear_slot_of(sim, p->unloaded[i]);
    for (int i = 0; i < p->n_activations; i++)
        sim_apply_activation(sim, &p->activations[i]);
    for (int k = 0; k < sim->cfg.max_loras; k++)
        SIM_CHECK(sim, lora_scheduler_slot_adapter(sim->s, k) == sim->slot[k]);
    sim_apply_events(sim);
    SIM_CHECK(sim, p->n_seqs <= sim->cfg.max_num_seqs);
    for (int i = 0; i < p->n_seqs; i++) {
        const struct lora_scheduler_seq *q = &p->seqs[i];

        sim_check_seq(sim, q, &admitted_seen);
        tokens += q->n_tokens;
        if (q->adapter_id > 0 && q->adapter_id < SIM_MAX_IDS && !ids[q->adapter_id]++)
            distinct++;
    }
    SIM_CHECK(sim, tokens == p->n_step_tokens && tokens <= sim->cfg.max_num_batched_tokens);
    SIM_CHECK(sim, distinct == p->n_step_adapters && distinct <= sim->cfg.max_loras);
    if (distinct > sim->max_step_adapters)
        sim->max_step_adapters = distinct;
    sim_check_counts(sim);
    if (lora_scheduler_check(sim->s, err, sizeof(err)) != 0) {
        printf("# step %llu: lora_scheduler_check: %s\n", (unsigned long long)sim->step, err);
        check_cur_failed = 1;
    }
}

/* The fake executor: one token per completed sequence, finish at finish_at. */
static void sim_execute(struct sim *sim)
{
    const struct lora_scheduler_plan *p = &sim->plan;
    char err[ERR_BYTES] = "";

    for (int i = 0; i < p->n_seqs; i++) {
        const struct lora_scheduler_seq *q = &p->seqs[i];
        struct sim_req *r = sim_req(sim, q->request_id);

        sim->res[i] = (struct lora_scheduler_result){false, false};
        if (!r || r->state != SIM_RUNNING)
            continue; /* aborted in flight */
        r->computed = q->pos + q->n_tokens;
        if (q->samples) {
            r->generated++;
            sim->res[i].produced = true;
            sim->res[i].finished = !sim->forget_length && r->generated >= r->finish_at;
        }
    }
    if (lora_scheduler_update(sim->s, p, sim->res, err, sizeof(err)) != 0) {
        printf("# step %llu: update: %s\n", (unsigned long long)sim->step, err);
        check_cur_failed = 1;
    }
    for (int i = 0; i < p->n_seqs; i++) {
        struct sim_req *r = sim_req(sim, p->seqs[i].request_id);
        struct lora_scheduler_request_info info;
        bool by_length = sim->forget_length && r && r->generated >= r->max_tokens;

        if (!r || r->state != SIM_RUNNING || !(sim->res[i].finished || by_length))
            continue;
        r->state = SIM_DONE;
        r->done_step = sim->step;
        r->n_table = 0;
        sim->n_done++;
        SIM_CHECK(sim, r->generated == (by_length ? r->max_tokens : r->finish_at));
        SIM_CHECK(sim, lora_scheduler_request_info(sim->s, p->seqs[i].request_id, &info) == -1);
    }
}

/* One step: schedule at time = step number, check, execute. */
static void sim_schedule(struct sim *sim)
{
    sim->step++;
    sim->now = (double)sim->step;
    SIM_CHECK(sim, lora_scheduler_schedule(sim->s, sim->now, &sim->plan) == 0);
    sim_check_plan(sim);
}

static void sim_step(struct sim *sim)
{
    sim_schedule(sim);
    sim_execute(sim);
}

static bool sim_busy(const struct sim *sim)
{
    return lora_scheduler_n_running(sim->s) + lora_scheduler_n_waiting(sim->s) > 0;
}

/* Steps until nothing is left; returns the steps taken, or -1 when max_steps ran out. */
static int sim_drain(struct sim *sim, int max_steps)
{
    for (int n = 0; n < max_steps; n++) {
        if (!sim_busy(sim))
            return n;
        sim_step(sim);
    }
    return sim_busy(sim) ? -1 : max_steps;
}

static int sim_find_seq(const struct sim *sim, uint64_t id)
{
    for (int i = 0; i < sim->plan.n_seqs; i++)
        if (sim->plan.seqs[i].request_id == id)
            return i;
    return -1;
}

static void sim_ready(struct sim *sim, int first, int last)
{
    for (int id = first; id <= last; id++)
        CHECK(lora_scheduler_adapter_ready(sim->s, id) == 0);
}

/* ---- admission, budget, chunking ---- */

static void test_fcfs_and_budget(void)
{
    struct lora_scheduler_config c;
    struct sim sim;

    sim_config(&c);
    c.max_num_batched_tokens = 16;
    sim_init(&sim, &c);
    for (int i = 0; i < 4; i++)
        CHECK(sim_add(&sim, 6, 3, 0) == (uint64_t)i + 1);

    sim_schedule(&sim);
    const struct lora_scheduler_plan *p = &sim.plan;
    CHECK(p->n_seqs == 3 && p->n_step_tokens == 16);
    CHECK(p->seqs[0].request_id == 1 && p->seqs[0].n_tokens == 6 && p->seqs[0].samples);
    CHECK(p->seqs[1].request_id == 2 && p->seqs[1].n_tokens == 6 && p->seqs[1].samples);
    /* The third gets what is left of the budget: a chunk, no sample yet. */
    CHECK(p->seqs[2].request_id == 3 && p->seqs[2].n_tokens == 4 && !p->seqs[2].samples);
    CHECK(p->n_events == 3);
    for (int i = 0; i < 3 && i < p->n_events; i++)
        CHECK(p->events[i].kind == LORA_SCHEDULER_EV_SCHEDULED &&
              p->events[i].request_id == (uint64_t)i + 1);
    CHECK(p->n_running == 3 && p->n_waiting == 1);
    sim_execute(&sim);

    sim_schedule(&sim);
    CHECK(p->n_seqs == 4 && p->n_step_tokens == 1 + 1 + 2 + 6);
    CHECK(p->seqs[0].request_id == 1 && p->seqs[0].n_tokens == 1 && p->seqs[0].pos == 6);
    CHECK(p->seqs[1].request_id == 2 && p->seqs[1].n_tokens == 1 && p->seqs[1].pos == 6);
    CHECK(p->seqs[2].request_id == 3 && p->seqs[2].n_tokens == 2 && p->seqs[2].pos == 4 &&
          p->seqs[2].samples);
    CHECK(p->seqs[3].request_id == 4 && p->seqs[3].n_tokens == 6 && p->seqs[3].pos == 0);
    sim_execute(&sim);

    CHECK(sim_drain(&sim, 100) >= 0);
    for (int i = 0; i < 4; i++) {
        CHECK(sim.reqs[i].state == SIM_DONE && sim.reqs[i].generated == 3);
        if (i > 0) /* FCFS: never served before an older request */
            CHECK(sim.reqs[i].first_step >= sim.reqs[i - 1].first_step);
    }
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_chunked_prefill_beside_decodes(void)
{
    struct lora_scheduler_config c;
    struct sim sim;

    sim_config(&c);
    c.max_num_batched_tokens = 8;
    sim_init(&sim, &c);
    for (int i = 0; i < 3; i++)
        sim_add(&sim, 2, 20, 0);
    sim_step(&sim); /* three prefills, 6 tokens */
    CHECK(sim.plan.n_step_tokens == 6);
    sim_step(&sim); /* three decodes */
    CHECK(sim.plan.n_step_tokens == 3);

    uint64_t long_id = sim_add(&sim, 30, 2, 0);
    for (int k = 0; k < 6; k++) {
        sim_schedule(&sim);
        const struct lora_scheduler_plan *p = &sim.plan;
        CHECK(p->n_seqs == 4);
        for (int i = 0; i < 3 && i < p->n_seqs; i++)
            CHECK(p->seqs[i].n_tokens == 1 && p->seqs[i].samples); /* decodes go on */
        if (p->n_seqs == 4) {
            CHECK(p->seqs[3].request_id == long_id);
            CHECK(p->seqs[3].n_tokens == 5 && p->seqs[3].pos == 5 * k);
            CHECK(p->seqs[3].samples == (k == 5)); /* samples only once the prompt is in */
        }
        sim_execute(&sim);
    }
    CHECK(sim_req(&sim, long_id)->generated == 1);
    CHECK(sim_drain(&sim, 100) >= 0);
    CHECK(sim.n_done == 4);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_max_num_seqs(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    int max_running = 0;

    sim_config(&c);
    c.max_num_seqs = 2;
    sim_init(&sim, &c);
    for (int i = 0; i < 5; i++)
        sim_add(&sim, 3, 4, 0);
    sim_schedule(&sim);
    CHECK(sim.plan.n_running == 2 && sim.plan.n_waiting == 3 && sim.plan.n_seqs == 2);
    sim_execute(&sim);
    while (sim_busy(&sim) && sim.step < 100) {
        sim_step(&sim);
        if (sim.plan.n_running > max_running)
            max_running = sim.plan.n_running;
    }
    CHECK(max_running == 2);
    CHECK(sim.n_done == 5);
    for (int i = 1; i < 5; i++)
        CHECK(sim.reqs[i].first_step >= sim.reqs[i - 1].first_step);
    sim_free(&sim);
}

static void test_decode_first(void)
{
    struct lora_scheduler_config c;
    struct sim sim;

    sim_config(&c);
    c.max_num_batched_tokens = 4;
    c.max_num_seqs = 4;
    sim_init(&sim, &c);
    for (int i = 0; i < 3; i++)
        sim_add(&sim, 1, 10, 0);
    sim_step(&sim);
    uint64_t late = sim_add(&sim, 10, 2, 0);
    for (int k = 0; k < 3; k++) {
        sim_schedule(&sim);
        const struct lora_scheduler_plan *p = &sim.plan;
        CHECK(p->n_seqs == 4);
        /* Running requests in admission order, each its decode token; the newcomer gets the
         * one token of budget left. */
        for (int i = 0; i < 3 && i < p->n_seqs; i++)
            CHECK(p->seqs[i].request_id == (uint64_t)i + 1 && p->seqs[i].n_tokens == 1);
        if (p->n_seqs == 4)
            CHECK(p->seqs[3].request_id == late && p->seqs[3].n_tokens == 1 && p->seqs[3].pos == k);
        sim_execute(&sim);
    }
    CHECK(sim_drain(&sim, 100) >= 0);
    CHECK(sim.n_done == 4);
    sim_free(&sim);
}

/* ---- preemption, aborts, block accounting ---- */

static void test_preemption_recomputes_and_finishes(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_request_info info;
    uint64_t victim = 0, resumed_step = 0, newcomer = 0;

    sim_config(&c);
    c.n_blocks = 8; /* 32 positions for three requests that each grow to 15 */
    c.max_model_len = 32;
    c.max_num_seqs = 3;
    sim_init(&sim, &c);
    for (int i = 0; i < 3; i++)
        sim_add(&sim, 8, 8, 0);
    uint64_t queued = sim_add(&sim, 1, 1, 0); /* waits for a seat from the start */
    while (sim_busy(&sim) && sim.step < 200) {
        sim_schedule(&sim);
        for (int i = 0; i < sim.plan.n_preempted; i++) {
            uint64_t id = sim.plan.preempted[i];
            struct sim_req *r = sim_req(&sim, id);

            /* Recomputation: nothing computed, no blocks, generated tokens kept. */
            CHECK(lora_scheduler_request_info(sim.s, id, &info) == 0);
            CHECK(info.state == LORA_SCHEDULER_WAITING && info.n_computed == 0 &&
                  info.n_blocks == 0 && info.n_generated == r->generated &&
                  info.n_preemptions == r->n_preempted);
            if (!victim) {
                victim = id;
                newcomer = sim_add(&sim, 1, 1, 0); /* queued behind the victim */
            }
        }
        for (int i = 0; i < sim.plan.n_events; i++) {
            const struct lora_scheduler_event *e = &sim.plan.events[i];

            if (e->kind == LORA_SCHEDULER_EV_RESUMED && e->request_id == victim && !resumed_step) {
                int q = sim_find_seq(&sim, victim);
                resumed_step = sim.step;
                /* Readmitted from position 0 over prompt + generated. */
                CHECK(q >= 0 && sim.plan.seqs[q].pos == 0);
                CHECK(q >= 0 && sim.plan.seqs[q].n_tokens == sim_req(&sim, victim)->prompt +
                                                                 sim_req(&sim, victim)->generated);
            }
        }
        sim_execute(&sim);
    }
    CHECK(!sim_busy(&sim));
    CHECK(sim.n_preemptions > 0 && victim != 0 && resumed_step != 0);
    /* The victim went to the front: requests queued before or after its preemption did not
     * start before it resumed. */
    CHECK(sim_req(&sim, queued)->first_step >= resumed_step);
    CHECK(newcomer && sim_req(&sim, newcomer)->first_step >= resumed_step);
    for (int i = 0; i < 3; i++)
        CHECK(sim.reqs[i].state == SIM_DONE && sim.reqs[i].generated == 8);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_abort_any_state(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_request_info info;
    char err[ERR_BYTES];

    sim_config(&c);
    c.max_num_batched_tokens = 16;
    sim_init(&sim, &c);
    uint64_t a = sim_add(&sim, 10, 5, 0), b = sim_add(&sim, 5, 5, 0), w = sim_add(&sim, 30, 5, 0);
    sim_step(&sim); /* a: 10, b: 5, w: 1 token */

    /* Waiting and running: blocks back at once. */
    uint64_t queued = sim_add(&sim, 3, 3, 0);
    sim_abort(&sim, queued);
    int free_before = lora_scheduler_n_free_blocks(sim.s);
    CHECK(lora_scheduler_request_info(sim.s, b, &info) == 0 && info.n_blocks == 2);
    sim_abort(&sim, b);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == free_before + 2);
    CHECK(lora_scheduler_request_info(sim.s, b, &info) == -1 && errno == ENOENT);

    /* In flight: schedule() refuses until update(), update() skips the aborted sequence, and
     * the next plan does not have it. */
    sim_schedule(&sim);
    CHECK(sim_find_seq(&sim, a) >= 0 && sim_find_seq(&sim, w) >= 0);
    errno = 0;
    CHECK(lora_scheduler_schedule(sim.s, sim.now, &sim.plan) == -1 && errno == EBUSY);
    /* The failed call left the plan alone. */
    CHECK(sim_find_seq(&sim, a) >= 0 && sim.plan.step == sim.step);
    sim_abort(&sim, w);
    sim_execute(&sim);
    sim_step(&sim);
    CHECK(sim_find_seq(&sim, w) < 0 && sim_find_seq(&sim, a) >= 0);
    CHECK(sim_drain(&sim, 100) >= 0);
    CHECK(sim_req(&sim, a)->state == SIM_DONE);
    CHECK(lora_scheduler_abort(sim.s, 12345) == -1 && errno == ENOENT);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    CHECK(lora_scheduler_check(sim.s, err, sizeof(err)) == 0);
    sim_free(&sim);
}

static void test_no_leak_with_aborts_and_preemption(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    int n_aborted = 0;

    sim_config(&c);
    c.block_size = 4;
    c.n_blocks = 16;
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = 32;
    c.max_model_len = 48;
    sim_init(&sim, &c);
    for (int i = 0; i < 40; i++)
        sim_add(&sim, 1 + rnd_below(20), 1 + rnd_below(20), 0);
    while (sim_busy(&sim) && sim.step < 2000) {
        if (sim.step % 7 == 3) { /* abort someone waiting or running */
            uint64_t id = 1 + (uint64_t)rnd_below(sim.n_reqs);
            struct sim_req *r = sim_req(&sim, id);

            if (r->state == SIM_WAITING || r->state == SIM_RUNNING) {
                sim_abort(&sim, id);
                n_aborted++;
            }
        }
        sim_schedule(&sim);
        if (sim.step % 11 == 5 && sim.plan.n_seqs > 0) { /* abort one in flight */
            sim_abort(&sim, sim.plan.seqs[rnd_below(sim.plan.n_seqs)].request_id);
            n_aborted++;
        }
        sim_execute(&sim);
    }
    CHECK(!sim_busy(&sim));
    CHECK(sim.n_preemptions > 0 && n_aborted > 0);
    CHECK(sim.n_done + n_aborted == 40);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_update_validates(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_request_info info;
    struct lora_scheduler_result res[2];
    char err[ERR_BYTES] = "";

    sim_config(&c);
    c.max_num_batched_tokens = 8;
    sim_init(&sim, &c);
    uint64_t a = sim_add(&sim, 4, 3, 0), b = sim_add(&sim, 10, 3, 0);
    sim_schedule(&sim); /* a: 4 (complete), b: 4 of 10 */
    CHECK(sim.plan.n_seqs == 2);
    /* A token for b's incomplete chunk. */
    res[0] = (struct lora_scheduler_result){true, false};
    res[1] = (struct lora_scheduler_result){true, false};
    CHECK(lora_scheduler_update(sim.s, &sim.plan, res, err, sizeof(err)) == -1);
    CHECK(errno == EINVAL);
    CHECK_CONTAINS(err, "prefill");
    /* No token and no finish for a's complete sequence. */
    res[0] = (struct lora_scheduler_result){false, false};
    res[1] = (struct lora_scheduler_result){false, false};
    CHECK(lora_scheduler_update(sim.s, &sim.plan, res, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no token");
    /* Nothing changed by the refused updates. */
    CHECK(lora_scheduler_request_info(sim.s, a, &info) == 0 && info.n_computed == 0 &&
          info.n_generated == 0);
    sim_execute(&sim);
    CHECK(lora_scheduler_request_info(sim.s, b, &info) == 0 && info.n_computed == 4);

    /* Length is the scheduler's fact too: an engine that never says finished still sees both
     * requests leave at max_tokens. */
    sim.forget_length = true;
    CHECK(sim_drain(&sim, 50) >= 0);
    CHECK(sim_req(&sim, a)->state == SIM_DONE && sim_req(&sim, a)->generated == 3);
    CHECK(sim_req(&sim, b)->state == SIM_DONE && sim_req(&sim, b)->generated == 3);

    /* A complete sequence that finishes without a token (the engine's stop) is fine too. */
    uint64_t d = sim_add(&sim, 3, 5, 0);
    sim_schedule(&sim);
    CHECK(sim.plan.n_seqs == 1 && sim.plan.seqs[0].request_id == d && sim.plan.seqs[0].samples);
    res[0] = (struct lora_scheduler_result){false, true};
    CHECK(lora_scheduler_update(sim.s, &sim.plan, res, err, sizeof(err)) == 0);
    CHECK(lora_scheduler_request_info(sim.s, d, &info) == -1);
    sim_req(&sim, d)->state = SIM_DONE;
    CHECK(!sim_busy(&sim));
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_rejects_at_add(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    char err[ERR_BYTES] = "";

    sim_config(&c);
    c.block_size = 4;
    c.n_blocks = 4;
    c.max_model_len = 32;
    c.max_requests = 8;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 1);

    errno = 0;
    CHECK(sim_add_eos(&sim, 30, 5, 0, 5, err) == 0 && errno == E2BIG);
    CHECK_CONTAINS(err, "max_model_len");
    errno = 0;
    CHECK(sim_add_eos(&sim, 10, 10, 0, 10, err) == 0 && errno == E2BIG); /* 5 blocks of 4 */
    CHECK_CONTAINS(err, "KV blocks");
    errno = 0;
    CHECK(sim_add_eos(&sim, 0, 5, 0, 5, err) == 0 && errno == EINVAL);
    errno = 0;
    CHECK(sim_add_eos(&sim, 4, 0, 0, 1, err) == 0 && errno == EINVAL);
    errno = 0;
    CHECK(sim_add_eos(&sim, 4, 4, 9, 4, err) == 0 && errno == ENOENT);
    CHECK_CONTAINS(err, "adapter 9 is not registered");

    struct lora_scheduler_request dup = {.id = 1, .n_prompt_tokens = 2, .max_tokens = 2};
    CHECK(sim_add(&sim, 2, 2, 1) == 1);
    errno = 0;
    CHECK(lora_scheduler_add(sim.s, &dup, err, sizeof(err)) == -1 && errno == EEXIST);
    CHECK_CONTAINS(err, "in use");
    for (int i = 1; i < c.max_requests; i++)
        CHECK(sim_add(&sim, 1, 1, 0) != 0);
    errno = 0;
    CHECK(sim_add_eos(&sim, 1, 1, 0, 1, err) == 0 && errno == ENOSPC);
    /* Nothing refused wedges the queue: everything accepted runs to the end. */
    CHECK(sim_drain(&sim, 200) >= 0);
    CHECK(sim.n_done == c.max_requests);
    /* A plan not sized by lora_scheduler_plan_init() is refused. */
    struct lora_scheduler_plan unsized;
    memset(&unsized, 0, sizeof(unsized));
    errno = 0;
    CHECK(lora_scheduler_schedule(sim.s, 0.0, &unsized) == -1 && errno == EINVAL);
    sim_free(&sim);

    /* Bad configurations. */
    sim_config(&c);
    c.max_num_batched_tokens = c.max_num_seqs - 1;
    errno = 0;
    CHECK(lora_scheduler_new(&c, err, sizeof(err)) == NULL && errno == EINVAL);
    CHECK_CONTAINS(err, "max_num_batched_tokens");
    sim_config(&c);
    c.n_blocks = 0;
    CHECK(lora_scheduler_new(&c, err, sizeof(err)) == NULL);
    CHECK_CONTAINS(err, "n_blocks");
    sim_config(&c);
    c.max_requests = c.max_num_seqs - 1;
    CHECK(lora_scheduler_new(&c, err, sizeof(err)) == NULL);
    CHECK_CONTAINS(err, "max_requests");

    /* max_loras 0: base model only. */
    sim_config(&c);
    c.max_loras = 0;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 1);
    errno = 0;
    CHECK(sim_add_eos(&sim, 2, 2, 1, 2, err) == 0 && errno == EINVAL);
    CHECK_CONTAINS(err, "max_loras");
    CHECK(sim_add(&sim, 2, 2, 0) != 0);
    CHECK(sim_drain(&sim, 20) >= 0 && sim.n_done == 1);
    sim_free(&sim);
}

/* ---- adapters ---- */

static void test_max_loras_per_step(void)
{
    struct lora_scheduler_config c;
    struct sim sim;

    sim_config(&c);
    c.max_loras = 2;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 3);
    for (int i = 0; i < 30; i++)
        CHECK(sim_add(&sim, 1 + i % 7, 3 + i % 5, i % 4) != 0);
    CHECK(sim_drain(&sim, 500) >= 0);
    /* The harness checked every plan; the limit was reached and adapters were swapped. */
    CHECK(sim.max_step_adapters == 2);
    CHECK(sim.n_evictions > 0);
    CHECK(sim.n_done == 30);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

/* A request for adapter 3 joins a queue kept long by a steady stream for adapters 1 and 2, of
 * staggered lengths so that some request of each is always running and both slots stay busy.
 * Returns the steps from the first step it was skipped for want of a slot to its admission, or
 * -1 when it was not admitted in max_steps. */
static int starvation_run(int starvation_steps, int max_steps, bool *all_done)
{
    struct lora_scheduler_config c;
    struct lora_scheduler_request_info info;
    struct sim sim;
    uint64_t a = 0, first_skip = 0;
    int delay = -1, n = 0;

    sim_config(&c);
    c.max_loras = 2;
    c.max_num_seqs = 8;
    c.n_blocks = 512;
    c.max_requests = 512;
    c.starvation_steps = starvation_steps;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 3);
    for (int i = 0; i < 20; i++, n++) /* the long queue */
        sim_add(&sim, 4, STARVE_MIN_TOKENS + n % STARVE_SPREAD, 1 + n % 2);
    for (int k = 0; k < max_steps && (!a || sim_req(&sim, a)->state == SIM_WAITING); k++) {
        for (int i = 0; i < 2; i++, n++) /* the stream */
            sim_add(&sim, 4, STARVE_MIN_TOKENS + n % STARVE_SPREAD, 1 + n % 2);
        if (k == 5)
            a = sim_add(&sim, 4, 6, 3);
        sim_step(&sim);
        if (a && !first_skip && lora_scheduler_request_info(sim.s, a, &info) == 0)
            first_skip = info.slot_wait_since;
    }
    if (a && sim_req(&sim, a)->state != SIM_WAITING) {
        uint64_t ahead_done = 0; /* step when the last request queued before a was admitted */

        for (uint64_t id = 1; id < a; id++)
            if (sim_req(&sim, id)->first_step > ahead_done)
                ahead_done = sim_req(&sim, id)->first_step;
        /* It is first skipped only once everything ahead of it got in: it is at the head. */
        CHECK(first_skip >= ahead_done);
        delay = (int)(sim_req(&sim, a)->first_step - first_skip);
    }
    *all_done = sim_drain(&sim, 3000) >= 0 && (!a || sim_req(&sim, a)->state == SIM_DONE);
    CHECK(sim.max_step_adapters <= 2);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
    return delay;
}

static void test_no_starvation_within_bound(void)
{
    bool done = false;
    /* The documented bound: admitted by step f + starvation_steps + W, f its first skip, W the
     * steps of the longest running request: a prefill step and max_tokens - 1 decode steps, and
     * the step after it leaves (the budget covers every running request each step). */
    int w = STARVE_MIN_TOKENS + STARVE_SPREAD - 1 + 1;
    int delay = starvation_run(8, 400, &done);

    printf("# starvation_steps 8: admitted %d steps after its first skip (bound %d)\n", delay,
           8 + w);
    CHECK(delay >= 0 && delay <= 8 + w);
    CHECK(done);
    delay = starvation_run(0, 400, &done); /* a barrier at the first skip */
    printf("# starvation_steps 0: admitted %d steps after its first skip (bound %d)\n", delay, w);
    CHECK(delay >= 0 && delay <= w);
    CHECK(done);
    /* Without the barrier (a huge starvation_steps) the same request waits for as long as the
     * stream lasts: the mechanism is what bounds it. */
    delay = starvation_run(1000000, 300, &done);
    CHECK(delay == -1);
    CHECK(done); /* once the stream stops, it still finishes */
}

static void test_lru_eviction(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_adapter_info info;
    struct lora_scheduler_request_info rinfo;

    sim_config(&c);
    c.max_loras = 3;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 6);
    for (int ad = 1; ad <= 3; ad++) { /* activated in the order 1, 2, 3 */
        sim_add(&sim, 2, 2, ad);
        CHECK(sim_drain(&sim, 20) >= 0);
    }
    /* Then used in the order 2, 1, 3: recency of use, not of activation, is what counts. */
    for (int k = 0; k < 3; k++) {
        sim_add(&sim, 2, 2, (int[]){2, 1, 3}[k]);
        CHECK(sim_drain(&sim, 20) >= 0);
        CHECK(sim.plan.n_activations == 0);
    }
    CHECK(lora_scheduler_adapter_info(sim.s, 1, &info) == 0 && info.slot == 0);
    uint64_t used1 = info.last_used_step;
    CHECK(lora_scheduler_adapter_info(sim.s, 2, &info) == 0 && info.last_used_step < used1);
    CHECK(lora_scheduler_adapter_info(sim.s, 3, &info) == 0 && info.last_used_step > used1);

    /* Adapter 4 evicts 2, the least recently used. */
    sim_add(&sim, 2, 50, 4);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 1);
    CHECK(sim.plan.activations[0].adapter_id == 4 && sim.plan.activations[0].evicted_id == 2 &&
          sim.plan.activations[0].slot == 1);
    /* A long request on 1 keeps it in use: 5 evicts 3 although 3 was used after 1. */
    uint64_t long1 = sim_add(&sim, 2, 50, 1);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 0);
    sim_add(&sim, 2, 50, 5);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 1 && sim.plan.activations[0].evicted_id == 3);
    /* 6 finds every slot in use: it waits, a base request behind it does not. */
    uint64_t six = sim_add(&sim, 2, 2, 6), base = sim_add(&sim, 2, 2, 0);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 0);
    CHECK(lora_scheduler_request_info(sim.s, six, &rinfo) == 0 &&
          rinfo.state == LORA_SCHEDULER_WAITING && rinfo.slot_wait_since == sim.step);
    CHECK(sim_req(&sim, base)->state == SIM_RUNNING);
    /* Once 1's only request leaves, 1 is the one to go. */
    sim_abort(&sim, long1);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 1);
    CHECK(sim.plan.activations[0].adapter_id == 6 && sim.plan.activations[0].evicted_id == 1 &&
          sim.plan.activations[0].slot == 0);
    CHECK(sim_drain(&sim, 200) >= 0);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_pinned_never_evicted(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_activation act;
    struct lora_scheduler_request_info rinfo;

    sim_config(&c);
    c.max_loras = 2;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 4);
    /* Pinning an adapter that has no slot activates it. */
    CHECK(lora_scheduler_adapter_pin(sim.s, 1, &act) == 0);
    CHECK(act.adapter_id == 1 && act.slot == 0 && act.evicted_id == 0);
    sim_apply_activation(&sim, &act);
    /* Adapter 2 is busy with a long request; 3 finds no slot and starts a starvation streak. */
    uint64_t long2 = sim_add(&sim, 2, 60, 2);
    sim_step(&sim);
    uint64_t x = sim_add(&sim, 2, 3, 3);
    sim_step(&sim);
    CHECK(lora_scheduler_request_info(sim.s, x, &rinfo) == 0 && rinfo.slot_wait_since == sim.step);
    /* Pinning 2, already in its slot, needs no activation; now every slot is pinned. */
    CHECK(lora_scheduler_adapter_pin(sim.s, 2, &act) == 0 && act.slot == -1);
    errno = 0;
    CHECK(lora_scheduler_adapter_pin(sim.s, 3, &act) == -1 && errno == EBUSY);
    sim_abort(&sim, long2); /* 2 is unused now, but pinned */
    for (int k = 0; k < 30; k++) {
        if (k % 3 == 0) { /* others keep coming, and keep being served */
            sim_add(&sim, 2, 3, 1);
            sim_add(&sim, 2, 3, 2);
            sim_add(&sim, 2, 3, 0);
        }
        sim_step(&sim);
        CHECK(sim.plan.n_activations == 0);
        CHECK(sim.slot[0] == 1 && sim.slot[1] == 2);
    }
    /* Skips while every slot is pinned do not count toward starvation: the streak ended, no
     * barrier formed, and the others were served. */
    CHECK(lora_scheduler_request_info(sim.s, x, &rinfo) == 0 &&
          rinfo.state == LORA_SCHEDULER_WAITING && rinfo.slot_wait_since == 0);
    CHECK(sim.n_done >= 27);
    CHECK(lora_scheduler_adapter_unpin(sim.s, 2) == 0);
    CHECK(sim_drain(&sim, 100) >= 0);
    CHECK(sim_req(&sim, x)->state == SIM_DONE);
    CHECK(sim.slot[0] == 1 && sim.slot[1] == 3); /* 2 went, pinned 1 stayed */
    /* Unpinned, 1 is evictable like any other. */
    CHECK(lora_scheduler_adapter_unpin(sim.s, 1) == 0);
    sim_add(&sim, 2, 2, 4);
    CHECK(sim_drain(&sim, 20) >= 0);
    CHECK(sim.slot[0] == 4 && sim.slot[1] == 3);
    sim_free(&sim);
}

static void test_loading_adapter_waits(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_activation act;

    sim_config(&c);
    sim_init(&sim, &c);
    CHECK(lora_scheduler_adapter_loading(sim.s, 7) == 0);
    uint64_t r7 = sim_add(&sim, 3, 3, 7), base = sim_add(&sim, 3, 3, 0);
    CHECK(r7 != 0);
    errno = 0;
    CHECK(lora_scheduler_adapter_pin(sim.s, 7, &act) == -1 && errno == EAGAIN);
    for (int k = 0; k < 10; k++) {
        sim_step(&sim);
        CHECK(sim.plan.n_activations == 0);
    }
    CHECK(sim_req(&sim, r7)->state == SIM_WAITING && sim_req(&sim, base)->state == SIM_DONE);
    CHECK(lora_scheduler_adapter_ready(sim.s, 7) == 0);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 1 && sim.plan.activations[0].adapter_id == 7);
    CHECK(sim_req(&sim, r7)->state == SIM_RUNNING);
    CHECK(sim_drain(&sim, 20) >= 0 && sim_req(&sim, r7)->state == SIM_DONE);
    sim_free(&sim);
}

/* async_activation: the request whose adapter a plan activates waits until the copy arrived;
 * meanwhile its slot is not taken from it, and the rest of the queue goes on. */
static void test_async_activation(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_adapter_info info;

    sim_config(&c);
    c.max_loras = 1;
    c.async_activation = true;
    sim_init(&sim, &c);
    sim_ready(&sim, 5, 6);
    uint64_t r5 = sim_add(&sim, 3, 3, 5), r6 = sim_add(&sim, 3, 3, 6),
             base = sim_add(&sim, 3, 3, 0);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 1 && sim.plan.activations[0].adapter_id == 5);
    CHECK(lora_scheduler_adapter_info(sim.s, 5, &info) == 0 && info.arriving && info.slot == 0);
    CHECK(sim_req(&sim, r5)->state == SIM_WAITING && sim_req(&sim, r6)->state == SIM_WAITING);
    CHECK(sim_req(&sim, base)->state == SIM_RUNNING);
    for (int k = 0; k < 5; k++) {
        sim_step(&sim);
        CHECK(sim.plan.n_activations == 0); /* 6 cannot take the arriving adapter's slot */
    }
    CHECK(sim_req(&sim, r5)->state == SIM_WAITING && sim_req(&sim, base)->state == SIM_DONE);
    CHECK(lora_scheduler_adapter_arrived(sim.s, 5) == 0);
    CHECK(lora_scheduler_adapter_arrived(sim.s, 9) == -1 && errno == ENOENT);
    sim_step(&sim);
    CHECK(sim.plan.n_activations == 0 && sim_req(&sim, r5)->state == SIM_RUNNING);
    CHECK(lora_scheduler_adapter_info(sim.s, 5, &info) == 0 && !info.arriving);
    /* Once r5 is done, 6 evicts 5 and arrives in turn. */
    bool six = false;
    for (int k = 0; k < 12 && !six; k++) {
        sim_step(&sim);
        six = sim.plan.n_activations == 1;
    }
    CHECK(six && sim.plan.activations[0].adapter_id == 6 &&
          sim.plan.activations[0].evicted_id == 5);
    CHECK(sim_req(&sim, r5)->state == SIM_DONE && sim_req(&sim, r6)->state == SIM_WAITING);
    CHECK(lora_scheduler_adapter_arrived(sim.s, 6) == 0);
    CHECK(sim_drain(&sim, 10) >= 0 && sim_req(&sim, r6)->state == SIM_DONE);
    sim_free(&sim);
}

static void test_remove_adapter(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_adapter_info info;
    uint64_t failed[8];
    bool in_use = false;
    char err[ERR_BYTES] = "";

    sim_config(&c);
    c.max_loras = 2;
    sim_init(&sim, &c);
    sim_ready(&sim, 5, 6);
    uint64_t run = sim_add(&sim, 2, 10, 5);
    sim_step(&sim);
    uint64_t w1 = sim_add(&sim, 2, 2, 5), w2 = sim_add(&sim, 2, 2, 5), w3 = sim_add(&sim, 2, 2, 6);

    errno = 0;
    CHECK(lora_scheduler_adapter_remove(sim.s, 5, failed, 1, &in_use, err, sizeof(err)) == -1);
    CHECK(errno == ENOSPC && lora_scheduler_n_waiting(sim.s) == 3);
    int n = lora_scheduler_adapter_remove(sim.s, 5, failed, 8, &in_use, err, sizeof(err));
    CHECK(n == 2 && failed[0] == w1 && failed[1] == w2 && in_use);
    CHECK_CONTAINS(err, "removed");
    sim_req(&sim, w1)->state = SIM_FAILED;
    sim_req(&sim, w2)->state = SIM_FAILED;
    CHECK(lora_scheduler_adapter_info(sim.s, 5, &info) == 0 && info.removing && info.slot >= 0);
    /* From the call on: no new requests, no re-registration while it drains. */
    errno = 0;
    CHECK(sim_add_eos(&sim, 2, 2, 5, 2, err) == 0 && errno == ENOENT);
    CHECK(lora_scheduler_adapter_ready(sim.s, 5) == -1 && errno == EBUSY);
    CHECK(lora_scheduler_adapter_remove(sim.s, 5, failed, 8, &in_use, err, sizeof(err)) == -1);

    /* Its running request finishes; the plan after that unloads it and frees its slot. */
    bool unloaded = false;
    while (sim_busy(&sim) && sim.step < 50) {
        sim_step(&sim);
        for (int i = 0; i < sim.plan.n_unloaded; i++) {
            CHECK(sim.plan.unloaded[i] == 5);
            CHECK(sim_req(&sim, run)->state == SIM_DONE);
            unloaded = true;
        }
    }
    if (!unloaded) { /* it finished in the last step: the next plan says so */
        sim_step(&sim);
        unloaded = sim.plan.n_unloaded == 1 && sim.plan.unloaded[0] == 5;
    }
    CHECK(unloaded);
    CHECK(sim_req(&sim, run)->state == SIM_DONE && sim_req(&sim, run)->generated == 10);
    CHECK(sim_req(&sim, w3)->state == SIM_DONE);
    CHECK(lora_scheduler_adapter_info(sim.s, 5, &info) == -1 && errno == ENOENT);

    /* Not in use: gone at once. A waiting request of it fails. */
    uint64_t w4 = sim_add(&sim, 2, 2, 6);
    n = lora_scheduler_adapter_remove(sim.s, 6, failed, 8, &in_use, err, sizeof(err));
    CHECK(n == 1 && failed[0] == w4 && !in_use);
    sim_req(&sim, w4)->state = SIM_FAILED;
    sim_clear_slot_of(&sim, 6);
    CHECK(lora_scheduler_adapter_info(sim.s, 6, &info) == -1);
    errno = 0;
    CHECK(lora_scheduler_adapter_remove(sim.s, 99, failed, 8, &in_use, err, sizeof(err)) == -1);
    CHECK(errno == ENOENT);
    /* Registered again, it serves again. */
    sim_ready(&sim, 5, 5);
    CHECK(sim_add(&sim, 2, 2, 5) != 0);
    CHECK(sim_drain(&sim, 20) >= 0);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

/* Mixed adapters (one loading for a while, one pinned), with the harness recounting
 * per-adapter running/waiting every step; adapter_info agrees with the plan too. */
static void test_adapter_counts_match_recount(void)
{
    struct lora_scheduler_config c;
    struct sim sim;
    struct lora_scheduler_activation act;
    struct lora_scheduler_adapter_info info;

    sim_config(&c);
    c.max_loras = 3;
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = 24;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 4);
    CHECK(lora_scheduler_adapter_loading(sim.s, 5) == 0);
    CHECK(lora_scheduler_adapter_pin(sim.s, 1, &act) == 0);
    sim_apply_activation(&sim, &act);
    for (int k = 0; k < 300; k++) {
        for (int j = rnd_below(3); j > 0; j--)
            sim_add(&sim, 1 + rnd_below(12), 1 + rnd_below(8), rnd_below(6));
        if (k == 100)
            CHECK(lora_scheduler_adapter_ready(sim.s, 5) == 0);
        sim_schedule(&sim);
        for (int i = 0; i < sim.plan.n_adapters; i++) {
            const struct lora_scheduler_adapter_count *a = &sim.plan.adapters[i];

            CHECK(lora_scheduler_adapter_info(sim.s, a->adapter_id, &info) == 0);
            CHECK(info.n_running == a->n_running && info.n_waiting == a->n_waiting);
        }
        CHECK(sim.plan.n_adapters == 5);
        sim_execute(&sim);
    }
    CHECK(sim_drain(&sim, 1000) >= 0);
    CHECK(sim.slot[0] == 1);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

/* ---- randomized stress ---- */

static void stress_live_ids(struct sim *sim, uint64_t *ids, int *n)
{
    *n = 0;
    for (int i = 0; i < sim->n_reqs; i++)
        if (sim->reqs[i].state == SIM_WAITING || sim->reqs[i].state == SIM_RUNNING)
            ids[(*n)++] = (uint64_t)i + 1;
}

/* One random residency event, as the engine would relay it. */
static void stress_adapter_event(struct sim *sim, int *n_failed)
{
    int id = 1 + rnd_below(7);
    struct lora_scheduler_activation act;
    uint64_t failed[64];
    bool in_use;
    char err[ERR_BYTES];

    switch (rnd_below(6)) {
    case 0:
    case 1:
        lora_scheduler_adapter_ready(sim->s, id);
        break;
    case 2:
        lora_scheduler_adapter_loading(sim->s, id);
        break;
    case 3:
        if (lora_scheduler_adapter_pin(sim->s, id, &act) == 0)
            sim_apply_activation(sim, &act);
        break;
    case 4:
        lora_scheduler_adapter_unpin(sim->s, id);
        break;
    default: {
        int n = lora_scheduler_adapter_remove(sim->s, id, failed, 64, &in_use, err, sizeof(err));

        for (int i = 0; i < n; i++) {
            struct sim_req *r = sim_req(sim, failed[i]);
            SIM_CHECK(sim, r && r->state == SIM_WAITING && r->adapter == id);
            if (r)
                r->state = SIM_FAILED;
        }
        if (n >= 0 && !in_use)
            sim_clear_slot_of(sim, id);
        *n_failed += n > 0 ? n : 0;
    }
    }
}

/* With async_activation, each adapter still arriving arrives with probability 1/2. */
static void stress_arrivals(struct sim *sim, bool all)
{
    struct lora_scheduler_adapter_info info;

    for (int id = 1; id <= 7; id++)
        if (lora_scheduler_adapter_info(sim->s, id, &info) == 0 && info.arriving &&
            (all || rnd_below(2)))
            lora_scheduler_adapter_arrived(sim->s, id);
}

static void stress(bool async)
{
    struct lora_scheduler_config c;
    struct sim sim;
    static uint64_t live[SIM_MAX_REQS];
    int n_live, n_aborted = 0, n_failed = 0, n_refused = 0;
    char err[ERR_BYTES] = "";

    rng_state = 20240611;
    sim_config(&c);
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = 32;
    c.max_loras = 3;
    c.block_size = 4;
    c.n_blocks = 40;
    c.max_model_len = 64;
    c.max_requests = 24;
    c.max_adapters = 8;
    c.starvation_steps = 4;
    c.async_activation = async;
    sim_init(&sim, &c);
    sim_ready(&sim, 1, 5);
    CHECK(lora_scheduler_adapter_loading(sim.s, 6) == 0);
    for (int k = 0; k < 2000 && sim.n_fail == 0; k++) {
        /* Bursts and lulls: the pool and the request table fill up, then drain. */
        int arrivals = k % 400 < 200 ? rnd_below(4) : rnd_below(5) == 0;

        for (int j = arrivals; j > 0; j--) {
            int max_tokens = 1 + rnd_below(20);
            int finish_at = rnd_below(10) < 3 ? 1 + rnd_below(max_tokens) : max_tokens;

            if (!sim_add_eos(&sim, 1 + rnd_below(40), max_tokens, rnd_below(8), finish_at, NULL))
                n_refused++; /* full, or adapter not registered */
        }
        if (rnd_below(100) < 5) {
            stress_live_ids(&sim, live, &n_live);
            if (n_live) {
                sim_abort(&sim, live[rnd_below(n_live)]);
                n_aborted++;
            }
        }
        if (rnd_below(100) < 4)
            stress_adapter_event(&sim, &n_failed);
        if (lora_scheduler_check(sim.s, err, sizeof(err)) != 0) {
            printf("# step %llu: between steps: %s\n", (unsigned long long)sim.step, err);
            check_cur_failed = 1;
        }
        sim_schedule(&sim);
        if (rnd_below(100) < 3 && sim.plan.n_seqs > 0) {
            sim_abort(&sim, sim.plan.seqs[rnd_below(sim.plan.n_seqs)].request_id);
            n_aborted++;
        }
        sim_execute(&sim);
        if (async)
            stress_arrivals(&sim, false);
    }
    /* Wind down: every adapter ready, nothing pinned, no arrivals. */
    for (int id = 1; id <= 7; id++) {
        lora_scheduler_adapter_ready(sim.s, id);
        lora_scheduler_adapter_unpin(sim.s, id);
    }
    for (int k = 0; k < 5000 && sim_busy(&sim); k++) {
        sim_step(&sim);
        stress_arrivals(&sim, true);
    }
    CHECK(!sim_busy(&sim));
    printf(
        "# %s: %d requests: %d done, %d aborted, %d failed by removal, %d refused; %d preemptions, "
        "%d activations, %d evictions, at most %d adapters in a step\n",
        async ? "async activation" : "activation in the step", sim.n_reqs, sim.n_done, n_aborted,
        n_failed, n_refused, sim.n_preemptions, sim.n_activations, sim.n_evictions,
        sim.max_step_adapters);
    CHECK(sim.n_done + n_aborted + n_failed == sim.n_reqs);
    for (int i = 0; i < sim.n_reqs; i++)
        CHECK(sim.reqs[i].state == SIM_DONE || sim.reqs[i].state == SIM_ABORTED ||
              sim.reqs[i].state == SIM_FAILED);
    /* Every path was exercised. */
    CHECK(sim.n_preemptions > 0 && sim.n_evictions > 0 && n_failed > 0 && n_refused > 0);
    CHECK(sim.max_step_adapters <= c.max_loras);
    CHECK(lora_scheduler_n_free_blocks(sim.s) == c.n_blocks);
    sim_free(&sim);
}

static void test_randomized_stress(void)
{
    stress(false);
}

static void test_randomized_stress_async(void)
{
    stress(true);
}

int main(void)
{
    RUN(test_fcfs_and_budget);
    RUN(test_chunked_prefill_beside_decodes);
    RUN(test_max_num_seqs);
    RUN(test_decode_first);
    RUN(test_preemption_recomputes_and_finishes);
    RUN(test_abort_any_state);
    RUN(test_no_leak_with_aborts_and_preemption);
    RUN(test_update_validates);
    RUN(test_rejects_at_add);
    RUN(test_max_loras_per_step);
    RUN(test_no_starvation_within_bound);
    RUN(test_lru_eviction);
    RUN(test_pinned_never_evicted);
    RUN(test_loading_adapter_waits);
    RUN(test_async_activation);
    RUN(test_remove_adapter);
    RUN(test_adapter_counts_match_recount);
    RUN(test_randomized_stress);
    RUN(test_randomized_stress_async);
    return check_done();
}
