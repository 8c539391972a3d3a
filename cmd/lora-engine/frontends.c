/* lora-engine: frontends (docs/design.md, "Programs", "Wire protocol", "Residency"): hello
 * (answered with ready and the registry), requests checked and queued in the scheduler, aborts,
 * outputs routed back to the frontend that sent the request, frontends that went silent, and
 * requests failed when a rank dies.
 *
 * Calls: publish.c (every send), registry.c (an adapter by name), lograte.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontends.h"
#include "lograte.h"
#include "publish.h"
#include "registry.h"

static int frontend_of(struct engine *e, const struct lora_msg_frames *f, bool add)
{
    int free_at = -1;
    for (int i = 0; i < ENGINE_MAX_FRONTENDS; i++) {
        struct eng_peer *p = &e->frontends[i];
        if (p->present && p->rid_len == f->rid_len && memcmp(p->rid, f->rid, f->rid_len) == 0)
            return i;
        if (!p->present && free_at < 0)
            free_at = i;
    }
    if (!add || free_at < 0)
        return -1;
    struct eng_peer *p = &e->frontends[free_at];
    memcpy(p->rid, f->rid, f->rid_len);
    p->rid_len = f->rid_len;
    p->present = true;
    lora_liveness_init(&p->live, lora_clock_mono_ms());
    return free_at;
}

int frontends_send_output(struct engine *e, struct eng_request *r, int n_new, const float *lps,
                          const int32_t *top_ids, const float *top_lps, int top_n, bool finished,
                          const char *reason, const char *error)
{
    struct lora_msg_output o = {
        .request_id = {r->request_id, strlen(r->request_id)},
        .n_tokens = n_new,
        .tokens = r->tokens + r->n_prompt + r->n_generated - n_new,
        .logprobs = lps,
        .top_n = top_n,
        .top_ids = top_ids,
        .top_logprobs = top_lps,
        .finished = finished,
        .num_prompt_tokens = r->n_prompt,
    };
    if (!r->sent_first && r->prompt_logprobs) {
        o.n_prompt_logprobs = r->n_prompt;
        o.prompt_logprobs = r->prompt_lps;
        o.prompt_ranks = r->prompt_ranks;
        o.prompt_top_n = r->prompt_top_n;
        o.prompt_top_ids = r->prompt_top_ids;
        o.prompt_top_logprobs = r->prompt_top_lps;
    }
    if (reason)
        o.finish_reason = (struct lora_str){reason, strlen(reason)};
    if (error) {
        o.error = (struct lora_str){error, strlen(error)};
        if (r->error_code)
            o.error_code = (struct lora_str){r->error_code, strlen(r->error_code)};
    }
    if (finished && r->arrival > 0) {
        o.queued_time = r->arrival;
        o.scheduled_time = r->scheduled_at;
        o.first_token_time = r->first_token_at;
        o.finished_time = lora_clock_unix();
    }
    r->sent_first = true;
    return publish_output(e, r->frontend, &o);
}

void frontends_release_request(struct engine *e, struct eng_request *r)
{
    if (!r)
        return;
    free(r->tokens);
    free(r->prompt_lps);
    free(r->prompt_ranks);
    free(r->prompt_top_ids);
    free(r->prompt_top_lps);
    free(r->allowed);
    memset(r, 0, sizeof(*r));
}

/* Ends a request that never ran to completion with an error output and a FINISHED event. */
static void fail_request(struct engine *e, struct eng_request *r, const char *reason,
                         const char *why)
{
    r->error_code = "unavailable";
    frontends_send_output(e, r, 0, NULL, NULL, NULL, 0, true, reason, why);
    publish_event(e, r, LORA_EVENT_FINISHED, reason);
    lora_scheduler_abort(e->sched, r->id);
    frontends_release_request(e, r);
}

void frontends_fail_all(struct engine *e, const char *why)
{
    for (int i = 0; i < e->max_requests; i++)
        if (e->reqs[i].used)
            fail_request(e, &e->reqs[i], "error", why);
}

/* Answers a request that was refused before it was queued; code is the output's error_code. */
static void refuse(struct engine *e, int fe, const struct lora_msg_request *m, const char *code,
                   const char *why)
{
    struct eng_request tmp = {.frontend = fe, .error_code = code};
    snprintf(tmp.request_id, sizeof(tmp.request_id), "%s", m->request_id.s);
    frontends_send_output(e, &tmp, 0, NULL, NULL, NULL, 0, true, "error", why);
}

static struct eng_request *alloc_request(struct engine *e)
{
    for (int tries = 0; tries < e->max_requests; tries++) {
        uint64_t id = ++e->next_id;
        struct eng_request *r = &e->reqs[id % (uint64_t)e->max_requests];
        if (!r->used) {
            r->used = true;
            r->id = id;
            return r;
        }
    }
    return NULL;
}

static void handle_request(struct engine *e, int fe, const struct lora_msg_frames *f)
{
    struct lora_msg_request m;
    struct lora_msg_bin bins[LORA_SOCK_MAX_BINS];
    char err[512];

    for (int i = 0; i < f->n_bins; i++)
        bins[i] = (struct lora_msg_bin){f->bins[i].data, f->bins[i].len};
    lora_msg_arena_reset(e->frontends_arena);
    if (lora_msg_decode_request(f->body, f->body_len, bins, f->n_bins, e->frontends_arena, &m, err,
                                sizeof(err)) < 0) {
        lograte_warn(&e->log_front, "dropping a request: %s", err);
        return;
    }
    int adapter_id = 0;
    if (!e->healthy) {
        snprintf(err, sizeof(err), "the engine is unhealthy: %s", e->unhealthy_reason);
        return refuse(e, fe, &m, "unavailable", err);
    }
    if (m.lora.s) {
        const struct eng_adapter *ad = registry_find(e, m.lora.s);
        if (!ad) {
            snprintf(err, sizeof(err), "adapter '%s' not found", m.lora.s);
            return refuse(e, fe, &m, "not_found", err);
        }
        adapter_id = ad->id;
    }
    for (size_t i = 0; i < m.n_prompt; i++) {
        if (m.prompt[i] < 0 || m.prompt[i] >= e->vocab_size) {
            snprintf(err, sizeof(err), "prompt token %d is outside the vocabulary (%d)",
                     m.prompt[i], e->vocab_size);
            return refuse(e, fe, &m, "invalid", err);
        }
    }
    for (int i = 0; i < m.n_allowed_token_ids; i++) {
        if (m.allowed_token_ids[i] < 0 || m.allowed_token_ids[i] >= e->vocab_size) {
            snprintf(err, sizeof(err), "allowed token %d is outside the vocabulary (%d)",
                     m.allowed_token_ids[i], e->vocab_size);
            return refuse(e, fe, &m, "invalid", err);
        }
    }
    if (m.n_prompt < 1 || m.max_tokens < 1 || m.n_stop_token_ids > 16 ||
        (int)m.n_prompt + m.max_tokens > e->max_model_len) {
        snprintf(err, sizeof(err),
                 "the prompt (%zu tokens) plus max_tokens (%d) must fit the context (%d)",
                 m.n_prompt, m.max_tokens, e->max_model_len);
        return refuse(e, fe, &m, "invalid", err);
    }
    struct eng_request *r = alloc_request(e);
    if (!r)
        return refuse(e, fe, &m, "unavailable", "the engine is full");
    snprintf(r->request_id, sizeof(r->request_id), "%s", m.request_id.s);
    r->frontend = fe;
    r->adapter_id = adapter_id;
    r->n_prompt = (int)m.n_prompt;
    r->max_tokens = m.max_tokens;
    r->min_tokens = m.min_tokens;
    r->temperature = m.temperature;
    r->top_p = m.top_p > 0 ? m.top_p : 1.0f;
    r->top_k = m.top_k;
    r->seed = m.has_seed ? m.seed : e->seed + r->id;
    r->logprobs = m.logprobs;
    r->prompt_logprobs = m.prompt_logprobs;
    r->ignore_eos = m.ignore_eos;
    r->n_stop = m.n_stop_token_ids;
    if (r->n_stop)
        memcpy(r->stop_ids, m.stop_token_ids, sizeof(int32_t) * (size_t)r->n_stop);
    r->rules = (struct lora_emit_rules){
        .max_tokens = r->max_tokens,
        .min_tokens = r->min_tokens,
        .ignore_eos = r->ignore_eos,
        .eos_ids = e->eos_ids,
        .n_eos = e->n_eos,
        .stop_ids = r->stop_ids,
        .n_stop = r->n_stop,
    };
    r->n_banned =
        lora_emit_banned(&r->rules, r->banned, (int)(sizeof(r->banned) / sizeof(r->banned[0])));
    r->arrival = lora_clock_unix();
    r->tokens = malloc(sizeof(int32_t) * (m.n_prompt + (size_t)m.max_tokens));
    r->prompt_lps = malloc(sizeof(float) * m.n_prompt);
    r->prompt_ranks = calloc(m.n_prompt, sizeof(int32_t));
    r->prompt_top_n = m.prompt_logprobs ? m.prompt_top_n : 0;
    if (r->prompt_top_n > 0) {
        r->prompt_top_ids = calloc(m.n_prompt * (size_t)r->prompt_top_n, sizeof(int32_t));
        r->prompt_top_lps = calloc(m.n_prompt * (size_t)r->prompt_top_n, sizeof(float));
    }
    if (m.n_allowed_token_ids > 0) {
        r->allowed = malloc(sizeof(int32_t) * (size_t)m.n_allowed_token_ids);
        if (r->allowed) {
            memcpy(r->allowed, m.allowed_token_ids,
                   sizeof(int32_t) * (size_t)m.n_allowed_token_ids);
            r->n_allowed = m.n_allowed_token_ids;
        }
    }
    if (!r->tokens || !r->prompt_lps || !r->prompt_ranks ||
        (r->prompt_top_n > 0 && (!r->prompt_top_ids || !r->prompt_top_lps)) ||
        (m.n_allowed_token_ids > 0 && !r->allowed)) {
        frontends_release_request(e, r);
        return refuse(e, fe, &m, "unavailable", "out of memory");
    }
    memcpy(r->tokens, m.prompt, sizeof(int32_t) * m.n_prompt);
    for (size_t i = 0; i < m.n_prompt; i++)
        r->prompt_lps[i] = NAN;
    struct lora_scheduler_request sr = {r->id, r->n_prompt, r->max_tokens, adapter_id, r->arrival};
    if (lora_scheduler_add(e->sched, &sr, err, sizeof(err)) < 0) {
        frontends_release_request(e, r);
        return refuse(e, fe, &m, "invalid", err);
    }
    publish_event(e, r, LORA_EVENT_QUEUED, NULL);
}

static void handle_abort(struct engine *e, int fe, const struct lora_msg_frames *f)
{
    struct lora_msg_abort m;
    char err[256];

    lora_msg_arena_reset(e->frontends_arena);
    if (lora_msg_decode_abort(f->body, f->body_len, NULL, 0, e->frontends_arena, &m, err,
                              sizeof(err)) < 0)
        return;
    for (int i = 0; i < e->max_requests; i++) {
        struct eng_request *r = &e->reqs[i];
        if (r->used && r->frontend == fe && strcmp(r->request_id, m.request_id.s) == 0)
            fail_request(e, r, "abort", NULL);
    }
}

void frontends_handle(struct engine *e, const struct lora_msg_frames *f)
{
    char err[256];
    int type = lora_msg_peek_type(f->body, f->body_len, err, sizeof(err));
    int fe = frontend_of(e, f, type == LORA_MSG_HELLO);

    if (fe < 0)
        return; /* unknown peer: it must say hello first */
    lora_liveness_heard(&e->frontends[fe].live, lora_clock_mono_ms());
    switch (type) {
    case LORA_MSG_HELLO:
        publish_ready(e, fe);
        publish_registry(e, true);
        break;
    case LORA_MSG_REQUEST:
        handle_request(e, fe, f);
        break;
    case LORA_MSG_ABORT:
        handle_abort(e, fe, f);
        break;
    default:
        break;
    }
}

void frontends_expire(struct engine *e)
{
    uint64_t now = lora_clock_mono_ms();

    for (int i = 0; i < ENGINE_MAX_FRONTENDS; i++) {
        struct eng_peer *p = &e->frontends[i];
        if (!p->present)
            continue;
        if (lora_liveness_is_dead(&p->live, now)) {
            /* Its requests have nobody to go to. */
            for (int k = 0; k < e->max_requests; k++)
                if (e->reqs[k].used && e->reqs[k].frontend == i)
                    fail_request(e, &e->reqs[k], "abort", "the frontend is gone");
            p->present = false;
        }
    }
    publish_frontend_heartbeats(e);
}
