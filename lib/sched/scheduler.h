/* scheduler: continuous batching over a paged KV cache, with LoRA adapter residency decisions.
 *
 * Pure logic, for the engine core: no sockets, no threads, no model, no clock (the caller passes
 * the time). Each step the engine calls lora_scheduler_schedule(), runs the plan on the workers
 * (after performing the plan's adapter activations), then reports what happened with
 * lora_scheduler_update(). Deterministic: the same calls give the same plans.
 *
 * What it owns
 *   - Every request in the system, waiting or running, up to config max_requests; its KV block
 *     table (ids only, through block_manager.h) and its token counts. Token ids stay with the
 *     engine: a sequence's tokens are its prompt followed by what it has generated, and a plan
 *     says which range of them to compute.
 *   - A mirror of adapter residency, which the engine keeps in step with the workers (who hold
 *     the truth): which adapter sits in which of the max_loras slots, which are pinned, which are
 *     ready to activate (in the workers' CPU cache) or still loading, and when each was last used
 *     (LRU by step). Adapter ids: 0 is the base model, > 0 an adapter the engine registered.
 *   Capacities are fixed by lora_scheduler_new(); after it, nothing allocates (plans included:
 *   lora_scheduler_plan_init() sizes a caller-owned plan once).
 *
 * Request life: add() puts a request at the back of the waiting queue (QUEUED). schedule() admits
 * it into the running set (SCHEDULED); its prompt may be computed in chunks over several steps.
 * Once its prompt is computed the model samples one token per step (decode). Preemption puts it
 * back at the front of the waiting queue with nothing computed (PREEMPTED, recomputation): on
 * readmission (RESUMED) its prompt plus the tokens generated so far are recomputed and generation
 * continues where it stopped. It leaves when update() says it finished, when abort() is called,
 * or when its adapter is removed while it waits.
 *
 * Policy of schedule(), in order (vLLM V1's scheduler, plus adapter slots):
 *   1. Running requests, oldest admission first. Each gets what it still needs: 1 token when
 *      decoding, else the rest of its prompt (or recomputation), cut to the token budget left
 *      (chunked prefill); a running request not reached because the budget ran out waits for the
 *      next step and keeps its blocks. When a request cannot get the blocks for its tokens, the
 *      most recently admitted running request is preempted (all its blocks freed), and again,
 *      until the blocks are found or the request itself is the one preempted.
 *   2. Waiting requests in queue order (FCFS, preempted ones at the front), only if nothing was
 *      preempted this step, while the running set is under max_num_seqs and budget is left. Each
 *      gets its first chunk: min(tokens to compute, budget left). The scan stops at the first
 *      request whose chunk does not get its blocks (no overtaking for memory). A request whose
 *      adapter is not in a slot needs one: a free slot, else the slot of the least recently used
 *      adapter that is not pinned, not being removed and used by no running request (ties: the
 *      lowest slot); that activation (and eviction) is listed in the plan. A request that gets no
 *      slot, or whose adapter is still loading, is skipped and the scan goes on, so requests for
 *      resident adapters are not blocked behind it. With async_activation the activation's copy
 *      runs alongside the step: the request is skipped as if loading, its adapter "arriving"
 *      (holding its slot, not evictable) until lora_scheduler_adapter_arrived().
 *   Since every running request's adapter holds a slot and a slot is never taken from an adapter
 *   that a running request uses, a step never has more than max_loras distinct adapters.
 *
 * Starvation bound: a waiting request that finds no slot although some slot is not pinned starts
 * a streak at that step f (a skip because its adapter is loading, or because every slot is
 * pinned, ends the streak: waiting cannot help then; admission ends it too). From step
 * f + starvation_steps on, while the streak lasts, the request is a barrier: the scan admits
 * nobody queued after it until it is admitted itself. This holds for any waiting request, not
 * only the oldest, so one queued behind a request whose adapter is loading is protected too. So
 * later requests overtake it in at most starvation_steps steps (f .. f + starvation_steps - 1).
 * From then on only requests queued ahead of it (FCFS; preempted requests go back ahead of it) join
 * the running set, which otherwise drains: each step computes min(budget, work left) of its tokens
 * and its oldest request is never preempted. A request at the head of the queue is therefore
 * admitted by step f + starvation_steps + W, where W is the number of steps the running set of step
 * f + starvation_steps - 1 takes to leave it a slot, blocks, a seat and budget: at most the steps
 * of its longest request (prompt chunks + max_tokens) when the budget covers every running
 * request each step; at most the tokens the running set has left (<= max_num_seqs *
 * max_model_len) in any case, plus any recomputation that preemption forces.
 *
 * Errors: functions return 0 or -1 (NULL for constructors) with errno, and a message in the
 * caller's err buffer where one is taken. Invalid calls never corrupt state.
 */
#ifndef LORA_SCHEDULER_H
#define LORA_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lora_scheduler_config {
    int max_num_seqs;           /* sequences in the running set (and so in a step) */
    int max_num_batched_tokens; /* token budget per step, >= max_num_seqs */
    int max_loras;              /* adapter slots; 0: base model only */
    int block_size;             /* positions per KV block */
    int n_blocks;               /* KV blocks in the pool */
    int max_model_len;          /* prompt + max_tokens of one request, at most */
    int max_requests;           /* requests in the system, waiting + running, >= max_num_seqs */
    int max_adapters;           /* adapters the mirror tracks (registered with it) */
    int starvation_steps;       /* steps of waiting for a slot before a request is a barrier */
    bool async_activation;      /* activations copy alongside steps: the requests of an adapter
                                   activated in a plan are admitted only once the caller says it
                                   arrived (lora_scheduler_adapter_arrived) */
};

/* Fills c with the defaults: 256 seqs, 2048 tokens, 4 loras, blocks of 16, 1024 blocks, 4096
 * positions, 1024 requests, 64 adapters, starvation after 8 steps. */
void lora_scheduler_config_default(struct lora_scheduler_config *c);

struct lora_scheduler_request {
    uint64_t id;         /* unique among the requests in the system */
    int n_prompt_tokens; /* >= 1 */
    int max_tokens;      /* tokens to generate at most, >= 1 */
    int adapter_id;      /* 0: base model; else registered with adapter_loading/ready */
    double arrival_s;    /* caller's clock; only reported back (queue time) */
};

/* One sequence of a step: compute tokens [pos, pos + n_tokens) of prompt ++ generated. */
struct lora_scheduler_seq {
    uint64_t request_id;
    int n_tokens;           /* a prefill chunk, or 1 for a decode */
    int pos;                /* position of the first token = tokens already computed */
    const int *block_table; /* (n_table_blocks) covers positions [0, pos + n_tokens); scheduler
                               storage, valid until the next schedule() */
    int n_table_blocks;
    int adapter_id;   /* 0: base */
    int adapter_slot; /* -1: base */
    bool samples;     /* the step completes the sequence: the model samples a token after it */
};

/* Before the step: put adapter_id into slot, evicting evicted_id (0: the slot was empty). */
struct lora_scheduler_activation {
    int adapter_id;
    int slot;
    int evicted_id;
};

enum lora_scheduler_event_kind {
    LORA_SCHEDULER_EV_SCHEDULED = 0, /* first admission (QUEUED -> SCHEDULED) */
    LORA_SCHEDULER_EV_PREEMPTED = 1, /* back to the waiting queue, computation dropped */
    LORA_SCHEDULER_EV_RESUMED = 2,   /* admitted again after a preemption */
};

struct lora_scheduler_event {
    uint64_t request_id;
    enum lora_scheduler_event_kind kind;
    double queued_s; /* SCHEDULED: time since arrival; else 0 */
};

/* Per-adapter activity: running = requests in the running set, waiting = in the waiting queue. */
struct lora_scheduler_adapter_count {
    int adapter_id;
    int n_running;
    int n_waiting;
};

/* One step's plan. Arrays are sized by lora_scheduler_plan_init() (capacity in brackets) and
 * owned by the plan; schedule() overwrites everything. */
struct lora_scheduler_plan {
    uint64_t step; /* 1 for the first schedule() */
    double now;
    struct lora_scheduler_seq *seqs; /* [max_num_seqs] running requests first, then admissions */
    int n_seqs;
    struct lora_scheduler_activation *activations; /* [max_loras] to perform before the step */
    int n_activations;
    int *unloaded; /* [max_loras] removed adapters that no request uses any more: their slots
                      are free, the workers may drop them now */
    int n_unloaded;
    uint64_t *preempted; /* [max_num_seqs] */
    int n_preempted;
    struct lora_scheduler_event *events; /* [2 * max_num_seqs] in the order they happened */
    int n_events;
    struct lora_scheduler_adapter_count *adapters; /* [max_adapters] every tracked adapter */
    int n_adapters;
    /* Stats, after this schedule(). */
    int n_running;      /* running set, scheduled this step or not */
    int n_waiting;      /* waiting queue */
    int n_base_running; /* of which on the base model */
    int n_base_waiting;
    int n_step_tokens;   /* tokens in the step */
    int n_step_adapters; /* distinct adapters in the step, base not counted */
    int n_free_blocks;
    double kv_usage; /* held blocks / n_blocks, 0..1 */
    /* Capacities, set by lora_scheduler_plan_init(). */
    int cap_seqs, cap_loras, cap_adapters;
};

/* What the model did with one scheduled sequence. */
struct lora_scheduler_result {
    bool produced; /* a token was sampled (only when the sequence's seq.samples was set) */
    bool finished; /* EOS, length or stop, as the engine decided: the request leaves */
};

enum lora_scheduler_state {
    LORA_SCHEDULER_WAITING = 0,
    LORA_SCHEDULER_RUNNING = 1,
};

struct lora_scheduler_request_info {
    enum lora_scheduler_state state;
    int adapter_id;
    int n_prompt_tokens;
    int max_tokens;
    int n_generated; /* tokens sampled so far (kept across preemptions) */
    int n_computed;  /* tokens in the KV cache */
    int n_blocks;    /* blocks held */
    int n_preemptions;
    uint64_t slot_wait_since; /* step its current streak of skips for want of a slot began,
                                 0: none (the starvation bound above) */
};

struct lora_scheduler_adapter_info {
    bool ready;              /* may be activated (in the CPU cache) */
    bool arriving;           /* activated, its copy into the slot not yet said done */
    bool pinned;             /* never evicted; always in a slot */
    bool removing;           /* removed, kept while requests still use it */
    int slot;                /* -1: not in a slot */
    uint64_t last_used_step; /* 0: never */
    int n_running;
    int n_waiting;
};

struct lora_scheduler;

/* Validates c and allocates everything. NULL with errno and a message in err on bad config
 * (EINVAL) or out of memory (ENOMEM). */
struct lora_scheduler *lora_scheduler_new(const struct lora_scheduler_config *c, char *err,
                                          size_t err_len);
void lora_scheduler_destroy(struct lora_scheduler **s);
const struct lora_scheduler_config *lora_scheduler_config(const struct lora_scheduler *s);

/* Sizes a plan for s (caller-owned struct, arrays owned by the plan). -1 with ENOMEM. */
int lora_scheduler_plan_init(const struct lora_scheduler *s, struct lora_scheduler_plan *p);
void lora_scheduler_plan_release(struct lora_scheduler_plan *p);

/* ---- requests ---- */

/* Queues r at the back. Fails with a message and nothing changed: EINVAL (bad counts), E2BIG
 * (prompt + max_tokens over max_model_len, or more blocks than the whole pool), ENOENT (adapter
 * not registered, or being removed), EEXIST (id in use), ENOSPC (max_requests in the system). */
int lora_scheduler_add(struct lora_scheduler *s, const struct lora_scheduler_request *r, char *err,
                       size_t err_len);

/* Drops request id whatever its state; its blocks are freed at once, it is in no later plan and
 * update() ignores it. -1 with ENOENT when unknown. */
int lora_scheduler_abort(struct lora_scheduler *s, uint64_t id);

/* Plans the next step into p (see the policy above) at time now. -1 with EBUSY when the previous
 * plan has not been given to update() yet (its requests would be computed twice), EINVAL when p
 * was not sized for s; p is left as it was. */
int lora_scheduler_schedule(struct lora_scheduler *s, double now, struct lora_scheduler_plan *p);

/* Applies the outcome of the step planned in p: res[i] is for p->seqs[i]. Sequences of requests
 * aborted since schedule() are ignored. A request whose generated count reaches max_tokens is
 * finished even if res says otherwise (the length limit is the scheduler's fact too); a finished
 * request's blocks are freed. Validates first and changes nothing on error: EINVAL with a
 * message when a token is reported for a sequence that was not complete, or a complete sequence
 * that neither produced nor finished. */
int lora_scheduler_update(struct lora_scheduler *s, const struct lora_scheduler_plan *p,
                          const struct lora_scheduler_result *res, char *err, size_t err_len);

/* ---- adapter residency mirror ---- */

/* Registers id (> 0) as known but not ready: its weights are loading, requests for it wait.
 * Also for an adapter the workers dropped from their CPU cache: a slot it holds is kept. -1 with
 * EINVAL (bad id), ENOSPC (max_adapters tracked), EBUSY (being removed). */
int lora_scheduler_adapter_loading(struct lora_scheduler *s, int id);

/* Marks id ready to activate (registering it if new). Same errors as adapter_loading(). */
int lora_scheduler_adapter_ready(struct lora_scheduler *s, int id);

/* Unregisters id: add() refuses it from now on, and its waiting requests are failed: their ids
 * are written to failed[0..ret) (the reason goes to err) and they leave the scheduler. Running
 * requests keep it until they finish; *in_use says so, and a later plan lists it in unloaded once
 * no request uses it. With !*in_use it is gone at once, slot freed. Returns the number of failed
 * requests, or -1 with ENOENT (unknown), ENOSPC (more than cap would fail; nothing changed). */
int lora_scheduler_adapter_remove(struct lora_scheduler *s, int id, uint64_t *failed, int cap,
                                  bool *in_use, char *err, size_t err_len);

/* Pins id: it is put into a slot now if it has none (*act says where; act->slot = -1 when it was
 * already in one) and never evicted until unpinned. -1 with ENOENT (unknown or being removed),
 * EAGAIN (not ready), EBUSY (no slot can be freed: all pinned or in use). */
int lora_scheduler_adapter_pin(struct lora_scheduler *s, int id,
                               struct lora_scheduler_activation *act);
/* With async_activation: the copy of id into its slot is done, its requests may run. -1 with
 * ENOENT when unknown. */
int lora_scheduler_adapter_arrived(struct lora_scheduler *s, int id);

/* Unpins id; it stays in its slot, subject to LRU eviction. -1 with ENOENT when unknown. */
int lora_scheduler_adapter_unpin(struct lora_scheduler *s, int id);

/* Adapter in slot (0: empty). */
int lora_scheduler_slot_adapter(const struct lora_scheduler *s, int slot);

/* ---- queries ---- */

/* Fill info; -1 with ENOENT when the adapter or request is not (or no longer) known. */
int lora_scheduler_adapter_info(const struct lora_scheduler *s, int id,
                                struct lora_scheduler_adapter_info *info);
int lora_scheduler_request_info(const struct lora_scheduler *s, uint64_t id,
                                struct lora_scheduler_request_info *info);
int lora_scheduler_n_running(const struct lora_scheduler *s);
int lora_scheduler_n_waiting(const struct lora_scheduler *s);
int lora_scheduler_n_free_blocks(const struct lora_scheduler *s);

/* Debug helper: verifies every invariant (block accounting against the request tables, queue
 * links and counts, per-adapter counts, slot mirror, running adapters resident, id index).
 * Returns 0, or -1 with the first broken invariant in err. O(requests + blocks + adapters^2). */
int lora_scheduler_check(const struct lora_scheduler *s, char *err, size_t err_len);

#endif
