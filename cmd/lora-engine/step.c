/* lora-engine: one scheduled step (docs/design.md, "Wire protocol", "Backend", "Residency"): the
 * reload of adapters that requests wait for, the plan's adapter activations and unloads on every
 * rank (answering an unload that waited for its running requests), the step itself, the outputs to
 * the frontends, lifecycle events, per-step stats, and the notification gather when a rank rang the
 * doorbell.
 *
 * Calls: adapters.c, frontends.c (outputs), workers.c, publish.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adapters.h"
#include "frontends.h"
#include "publish.h"
#include "step.h"
#include "workers.h"

bool step_has_work(const struct engine *e)
{
    /* An adapter being unloaded needs a plan to release it once its requests are done. */
    return e->healthy &&
           (lora_scheduler_n_running(e->sched) + lora_scheduler_n_waiting(e->sched) > 0 ||
            e->n_unloading > 0);
}

static struct eng_request *request_of(struct engine *e, uint64_t id)
{
    struct eng_request *r = &e->reqs[id % (uint64_t)e->max_requests];
    return r->used && r->id == id ? r : NULL;
}

/* Asks the ranks whether the copies of the adapters still arriving are done, and lets the
 * scheduler run the requests of those that are. */
static void poll_arrivals(struct engine *e)
{
    char err[512];
    bool arrived = false;

    for (int i = 0; i < ENGINE_MAX_ADAPTERS && e->healthy; i++) {
        const struct eng_adapter *ad = &e->adapters[i];
        struct lora_scheduler_adapter_info info;
        bool pending = true;
        if (!ad->used || lora_scheduler_adapter_info(e->sched, ad->id, &info) < 0 || !info.arriving)
            continue;
        if (workers_activate_async(e, ad->name, info.slot, &pending, err, sizeof(err)) < 0) {
            char why[700];
            snprintf(why, sizeof(why), "activating adapter '%s': %s", ad->name, err);
            workers_mark_dead(e, why);
            return;
        }
        if (!pending) {
            lora_scheduler_adapter_arrived(e->sched, ad->id);
            arrived = true;
        }
    }
    if (arrived)
        workers_gather_notifications(e);
}

/* Performs the plan's activations and unloads on the workers. */
static int apply_adapters(struct engine *e)
{
    char err[512];
    bool changed = false;

    for (int i = 0; i < e->plan.n_activations; i++) {
        const struct lora_scheduler_activation *a = &e->plan.activations[i];
        const struct eng_adapter *ad = &e->adapters[a->adapter_id - 1];
        bool pending = false;
        int rc = e->async_activate
                     ? workers_activate_async(e, ad->name, a->slot, &pending, err, sizeof(err))
                     : workers_adapter_op(e, LORA_OP_ACTIVATE, ad->name, NULL, a->slot, err,
                                          sizeof(err));
        if (rc == 0 && e->async_activate && !pending)
            lora_scheduler_adapter_arrived(e->sched, ad->id);
        if (rc < 0) {
            char why[700];
            snprintf(why, sizeof(why), "activating adapter '%s': %s", ad->name, err);
            workers_mark_dead(e, why);
            return -1;
        }
        changed = true;
    }
    for (int i = 0; i < e->plan.n_unloaded; i++) {
        struct eng_adapter *ad = &e->adapters[e->plan.unloaded[i] - 1];
        int rc = workers_adapter_op(e, LORA_OP_REMOVE, ad->name, NULL, -1, err, sizeof(err));
        if (rc < 0)
            fprintf(stderr, "lora-engine: warning: unloading '%s': %s\n", ad->name, err);
        if (ad->unload_reply_due)
            publish_control_reply(e, ad->unload_rid, ad->unload_rid_len, ad->unload_ctl_id,
                                  rc < 0 ? err : NULL, NULL, 0);
        ad->used = false;
        ad->unload_reply_due = false;
        if (ad->unloading)
            e->n_unloading--;
        ad->unloading = false;
        changed = true;
    }
    /* A plan lists at most max_loras releases; the scheduler forgets the others all the same. */
    bool released = e->plan.n_unloaded > 0;
    for (int i = 0; i < ENGINE_MAX_ADAPTERS && e->n_unloading > 0; i++) {
        struct eng_adapter *ad = &e->adapters[i];
        struct lora_scheduler_adapter_info info;
        if (!ad->unloading || lora_scheduler_adapter_info(e->sched, ad->id, &info) == 0)
            continue;
        int rc = workers_adapter_op(e, LORA_OP_REMOVE, ad->name, NULL, -1, err, sizeof(err));
        if (ad->unload_reply_due)
            publish_control_reply(e, ad->unload_rid, ad->unload_rid_len, ad->unload_ctl_id,
                                  rc < 0 ? err : NULL, NULL, 0);
        ad->used = ad->unload_reply_due = ad->unloading = false;
        e->n_unloading--;
        changed = released = true;
    }
    if (released)
        publish_registry(e, true);
    return changed ? workers_gather_notifications(e) : 0;
}

static void publish_plan_events(struct engine *e)
{
    for (int i = 0; i < e->plan.n_events; i++) {
        const struct lora_scheduler_event *ev = &e->plan.events[i];
        struct eng_request *r = request_of(e, ev->request_id);
        if (!r)
            continue;
        if (ev->kind == LORA_SCHEDULER_EV_PREEMPTED)
            e->num_preemptions++;
        publish_event(e, r,
                      ev->kind == LORA_SCHEDULER_EV_PREEMPTED ? LORA_EVENT_PREEMPTED
                                                              : LORA_EVENT_SCHEDULED,
                      NULL);
    }
}

/* Sends the step of the plan to every rank. */
static int send_step(struct engine *e)
{
    size_t tok_at = 0, blk_at = 0;

    for (int i = 0; i < e->plan.n_seqs; i++) {
        const struct lora_scheduler_seq *sq = &e->plan.seqs[i];
        const struct eng_request *r = request_of(e, sq->request_id);
        int end = sq->pos + sq->n_tokens;
        memcpy(e->step_tokens + tok_at, r->tokens + sq->pos, sizeof(int32_t) * sq->n_tokens);
        for (int b = 0; b < sq->n_table_blocks; b++)
            e->step_tables[blk_at + b] = sq->block_table[b];
        e->step_seqs[i] = (struct lora_msg_step_seq){
            .seq_id = sq->request_id,
            .n_tokens = sq->n_tokens,
            .pos = sq->pos,
            .n_blocks = sq->n_table_blocks,
            .slot = sq->adapter_slot,
            .all_logits = r->prompt_logprobs && sq->pos < r->n_prompt,
            .prompt_top_n = r->prompt_logprobs && sq->pos < r->n_prompt ? r->prompt_top_n : 0,
            .sample = sq->samples,
            .temperature = r->temperature,
            .top_p = r->top_p,
            .top_k = r->top_k,
            .seed = r->seed,
            .n_generated = r->n_generated,
            .top_n = r->logprobs,
            .next_token = end < r->n_prompt ? r->tokens[end] : -1,
        };
        if (sq->samples && r->n_generated < r->min_tokens) {
            e->step_seqs[i].n_banned = r->n_banned;
            e->step_seqs[i].banned = r->banned;
        }
        if (sq->samples && r->n_allowed > 0) {
            e->step_seqs[i].n_allowed = r->n_allowed;
            e->step_seqs[i].allowed = r->allowed;
        }
        tok_at += (size_t)sq->n_tokens;
        blk_at += (size_t)sq->n_table_blocks;
    }
    struct lora_msg_step m = {
        .step_id = ++e->next_step,
        .n_seqs = e->plan.n_seqs,
        .seqs = e->step_seqs,
        .tokens = e->step_tokens,
        .n_tokens_total = tok_at,
        .block_tables = e->step_tables,
        .n_block_entries = blk_at,
    };
    return workers_step(e, &m);
}

/* Applies the output rank's results to the requests; fills e->results. */
static int absorb(struct engine *e, const struct lora_msg_step_reply *rep)
{
    if (rep->n_outs != e->plan.n_seqs)
        return -1;
    for (int i = 0; i < e->plan.n_seqs; i++) {
        const struct lora_scheduler_seq *sq = &e->plan.seqs[i];
        const struct lora_msg_step_out *o = &rep->outs[i];
        struct eng_request *r = request_of(e, sq->request_id);
        e->results[i] = (struct lora_scheduler_result){false, false};
        if (!r || o->seq_id != sq->request_id)
            continue;
        for (int t = 0; t < o->n_prompt_logprobs && sq->pos + t + 1 < r->n_prompt; t++) {
            r->prompt_lps[sq->pos + t + 1] = o->prompt_logprobs[t];
            if (o->prompt_ranks)
                r->prompt_ranks[sq->pos + t + 1] = o->prompt_ranks[t];
            if (o->prompt_top_n == r->prompt_top_n && r->prompt_top_n > 0) {
                size_t k = (size_t)r->prompt_top_n, at = (size_t)(sq->pos + t + 1) * k;
                memcpy(r->prompt_top_ids + at, o->prompt_top_ids + (size_t)t * k,
                       sizeof(int32_t) * k);
                memcpy(r->prompt_top_lps + at, o->prompt_top_logprobs + (size_t)t * k,
                       sizeof(float) * k);
            }
        }
        if (o->token < 0)
            continue;
        r->tokens[r->n_prompt + r->n_generated] = o->token;
        if (r->n_generated++ == 0)
            r->first_token_at = lora_clock_unix();
        const char *reason = lora_emit_finish(&r->rules, r->n_generated, o->token);
        frontends_send_output(e, r, 1, &o->logprob, o->top_ids, o->top_logprobs, o->n_top,
                              reason != NULL, reason, NULL);
        e->results[i] = (struct lora_scheduler_result){true, reason != NULL};
        if (reason)
            publish_event(e, r, LORA_EVENT_FINISHED, reason);
    }
    return 0;
}

int step_run(struct engine *e)
{
    char err[512];

    adapters_reload_wanted(e);
    if (e->async_activate)
        poll_arrivals(e);
    double t0 = lora_clock_unix();
    if (lora_scheduler_schedule(e->sched, t0, &e->plan) < 0) {
        fprintf(stderr, "lora-engine: warning: the scheduler refused a step\n");
        return -1;
    }
    publish_plan_events(e);
    e->plan_empty = e->plan.n_seqs == 0;
    if (apply_adapters(e) < 0)
        return -1;
    bool doorbell = false;
    double model_seconds = 0;
    if (e->plan.n_seqs > 0) {
        struct lora_msg_frames replies[ENGINE_MAX_WORLD];
        if (send_step(e) < 0 ||
            workers_gather(e, LORA_MSG_STEP_REPLY, replies, 600000, err, sizeof(err)) < 0) {
            workers_mark_dead(e, *err ? err : "unable to send a step");
            return -1;
        }
        for (int r = e->world - 1; r >= 0; r--) {
            struct lora_msg_step_reply rep;
            char derr[256];
            lora_msg_arena_reset(e->step_arena);
            int rc = lora_msg_decode_step_reply(replies[r].body, replies[r].body_len, NULL, 0,
                                                e->step_arena, &rep, derr, sizeof(derr));
            if (rc < 0 || !rep.ok) {
                snprintf(err, sizeof(err), "rank %d failed a step: %s", r,
                         rc < 0 ? derr : (rep.error.s ? rep.error.s : "?"));
                workers_release(e, replies);
                workers_mark_dead(e, err);
                return -1;
            }
            doorbell |= rep.doorbell;
            model_seconds = rep.step_seconds > model_seconds ? rep.step_seconds : model_seconds;
            if (r == 0 && absorb(e, &rep) < 0) {
                workers_release(e, replies);
                workers_mark_dead(e, "the output rank's reply does not match the step");
                return -1;
            }
        }
        workers_release(e, replies);
    }
    if (lora_scheduler_update(e->sched, &e->plan, e->results, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-engine: warning: %s\n", err);
        return -1;
    }
    for (int i = 0; i < e->plan.n_seqs; i++)
        if (e->results[i].finished)
            frontends_release_request(e, request_of(e, e->plan.seqs[i].request_id));
    publish_step_stats(e, lora_clock_unix() - t0, model_seconds);
    if (doorbell)
        workers_gather_notifications(e);
    return 0;
}
