/* lora-worker serve: running one step (docs/design.md, "Wire protocol", "Backend"). Every rank runs
 * the forward pass (the all-reduce joins them); rank 0, the output rank, samples and reports
 * log-probabilities. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "runtime/emit.h"
#include "serve.h"

int worker_step_alloc(struct worker *w, char *err, size_t err_len)
{
    const struct lora_msg_limits *l = &w->lim;
    size_t seqs = (size_t)l->max_num_seqs, toks = (size_t)l->max_num_batched_tokens;
    size_t blocks = (size_t)l->num_kv_blocks + seqs; /* tables of all sequences of a step */
    size_t top = seqs * LORA_MSG_MAX_TOP;

    w->steps = calloc(seqs, sizeof(*w->steps));
    w->first_row = calloc(seqs, sizeof(int));
    w->tokens = calloc(toks, sizeof(int));
    w->tables = calloc(blocks, sizeof(int));
    w->outs = calloc(seqs, sizeof(*w->outs));
    w->top_ids = calloc(top, sizeof(int32_t));
    w->top_lps = calloc(top, sizeof(float));
    w->prompt_lps = calloc(toks, sizeof(float));
    w->prompt_ranks = calloc(toks, sizeof(int32_t));
    w->prompt_top_ids = calloc(toks * LORA_MSG_MAX_PROMPT_TOP, sizeof(int32_t));
    w->prompt_top_lps = calloc(toks * LORA_MSG_MAX_PROMPT_TOP, sizeof(float));
    w->masked = calloc((size_t)w->model->cfg.vocab_size, sizeof(float));
    if (!w->steps || !w->first_row || !w->tokens || !w->tables || !w->outs || !w->top_ids ||
        !w->top_lps || !w->prompt_lps || !w->prompt_ranks || !w->prompt_top_ids ||
        !w->prompt_top_lps || !w->masked) {
        snprintf(err, err_len, "out of memory for step buffers");
        return -1;
    }
    return 0;
}

void worker_step_free(struct worker *w)
{
    free(w->steps);
    free(w->first_row);
    free(w->tokens);
    free(w->tables);
    free(w->outs);
    free(w->top_ids);
    free(w->top_lps);
    free(w->prompt_lps);
    free(w->prompt_ranks);
    free(w->prompt_top_ids);
    free(w->prompt_top_lps);
    free(w->masked);
}

/* Checks the step against this worker's limits and copies its frames into aligned buffers. */
static int prepare(struct worker *w, const struct lora_msg_step *m, char *err, size_t err_len)
{
    const struct lora_msg_limits *l = &w->lim;
    size_t tok_at = 0, blk_at = 0;

    if (m->n_seqs < 1 || m->n_seqs > l->max_num_seqs ||
        m->n_tokens_total > (size_t)l->max_num_batched_tokens ||
        m->n_block_entries > (size_t)l->num_kv_blocks + (size_t)l->max_num_seqs) {
        snprintf(err, err_len, "step %llu is beyond the limits (%d sequences, %zu tokens)",
                 (unsigned long long)m->step_id, m->n_seqs, m->n_tokens_total);
        return -1;
    }
    memcpy(w->tokens, m->tokens, m->n_tokens_total * sizeof(int32_t));
    memcpy(w->tables, m->block_tables, m->n_block_entries * sizeof(int32_t));
    for (int i = 0; i < m->n_seqs; i++) {
        const struct lora_msg_step_seq *q = &m->seqs[i];
        int need = (q->pos + q->n_tokens + l->block_size - 1) / l->block_size;
        if (q->n_blocks < need || q->top_n < 0 || q->top_n > LORA_MSG_MAX_TOP ||
            q->prompt_top_n < 0 || q->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP) {
            snprintf(err, err_len, "step %llu: sequence %llu has %d blocks for %d positions",
                     (unsigned long long)m->step_id, (unsigned long long)q->seq_id, q->n_blocks,
                     q->pos + q->n_tokens);
            return -1;
        }
        w->steps[i] = (struct lora_seq_step){
            .tokens = w->tokens + tok_at,
            .n_tokens = q->n_tokens,
            .pos = q->pos,
            .block_table = w->tables + blk_at,
            .adapter_slot = q->slot,
            .all_logits = q->all_logits,
        };
        tok_at += (size_t)q->n_tokens;
        blk_at += (size_t)q->n_blocks;
    }
    return 0;
}

/* The rank of token in a row of logits as vLLM counts it: the number of tokens at least as
 * likely, itself included (1: the most likely). */
static int32_t vocab_rank(const float *row, int vocab, int token)
{
    int32_t n = 0;
    for (int t = 0; t < vocab; t++)
        n += row[t] >= row[token];
    return n;
}

/* Output rank: the sampled token, its log-probability, the top-N and prompt log-probabilities of
 * sequence i. Arrays go to the scratch at the given offsets. */
static void emit(struct worker *w, const struct lora_msg_step *m, int i, const float *logits,
                 size_t *top_at, size_t *plp_at, size_t *ptop_at)
{
    const struct lora_msg_step_seq *q = &m->seqs[i];
    const struct lora_seq_step *st = &w->steps[i];
    struct lora_msg_step_out *o = &w->outs[i];
    int vocab = w->model->cfg.vocab_size;
    const float *rows = logits + (size_t)w->first_row[i] * vocab;

    *o = (struct lora_msg_step_out){.seq_id = q->seq_id, .token = -1};
    if (q->all_logits) {
        /* Row t predicts the token after it: the chunk's own next token, or next_token. */
        int ptop = q->prompt_top_n < vocab ? q->prompt_top_n : vocab;
        o->prompt_logprobs = w->prompt_lps + *plp_at;
        o->prompt_ranks = w->prompt_ranks + *plp_at;
        o->prompt_top_n = ptop;
        o->prompt_top_ids = w->prompt_top_ids + *ptop_at;
        o->prompt_top_logprobs = w->prompt_top_lps + *ptop_at;
        for (int t = 0; t < st->n_tokens; t++) {
            int next = t + 1 < st->n_tokens ? st->tokens[t + 1] : q->next_token;
            if (next < 0 || next >= vocab)
                break;
            const float *row = rows + (size_t)t * vocab;
            w->prompt_ranks[*plp_at] = vocab_rank(row, vocab, next);
            w->prompt_lps[(*plp_at)++] =
                lora_sampler_logprobs(w->sampler, row, next, ptop, w->prompt_top_ids + *ptop_at,
                                      w->prompt_top_lps + *ptop_at);
            *ptop_at += (size_t)ptop;
            o->n_prompt_logprobs++;
        }
    }
    if (!q->sample)
        return;
    const float *last = rows + (size_t)(q->all_logits ? st->n_tokens - 1 : 0) * vocab;
    int top_n = q->top_n < vocab ? q->top_n : vocab;
    struct lora_emit_draw d = {
        .row = last,
        .sampling = {q->temperature, q->top_k, q->top_p},
        .seed = q->seed,
        .n_generated = q->n_generated,
        .allowed = q->allowed,
        .n_allowed = q->n_allowed,
        .banned = q->banned,
        .n_banned = q->n_banned,
        .top_n = top_n,
    };

    o->token = lora_emit_token(w->sampler, vocab, &d, w->masked, &o->logprob, w->top_ids + *top_at,
                               w->top_lps + *top_at);
    o->top_ids = w->top_ids + *top_at;
    o->top_logprobs = w->top_lps + *top_at;
    o->n_top = top_n;
    *top_at += (size_t)top_n;
}

static int reply_error(struct worker *w, uint64_t step_id, const char *err)
{
    struct lora_msg_step_reply r = {.step_id = step_id, .rank = w->rank, .ok = false};
    r.error = (struct lora_str){err, strlen(err)};
    lora_buf_reset(&w->out);
    if (lora_msg_encode_step_reply(&w->out, &r, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}

/* Test hook: LORA_WORKER_TEST_STEP_DELAY_MS=MS makes every step take MS longer, so that the tests
 * can hold requests running and queued while they look at what the engine reports. */
static void test_step_delay(void)
{
    static long delay_ms = -1;

    if (delay_ms < 0) {
        const char *v = getenv("LORA_WORKER_TEST_STEP_DELAY_MS");
        delay_ms = v ? strtol(v, NULL, 10) : 0;
        if (delay_ms < 0 || delay_ms > 10000)
            delay_ms = 0;
    }
    if (delay_ms > 0)
        nanosleep(&(struct timespec){delay_ms / 1000, delay_ms % 1000 * 1000000L}, NULL);
}

int worker_handle_step(struct worker *w, const struct lora_msg_frames *f)
{
    struct lora_msg_step m;
    struct lora_msg_bin bins[LORA_SOCK_MAX_BINS];
    char err[512];
    const float *logits;
    double t0 = lora_clock_mono();

    for (int i = 0; i < f->n_bins; i++)
        bins[i] = (struct lora_msg_bin){f->bins[i].data, f->bins[i].len};
    lora_msg_arena_reset(w->arena);
    if (lora_msg_decode_step(f->body, f->body_len, bins, f->n_bins, w->arena, &m, err,
                             sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: warning: rank %d: dropping a step: %s\n", w->rank, err);
        return reply_error(w, 0, err);
    }
    if (!w->set_up) {
        snprintf(err, sizeof(err), "step before setup");
        return reply_error(w, m.step_id, err);
    }
    if (prepare(w, &m, err, sizeof(err)) < 0 ||
        lora_forward_step(w->fwd, w->steps, m.n_seqs, &logits, w->first_row, err, sizeof(err)) < 0)
        return reply_error(w, m.step_id, err);
    test_step_delay();

    w->clock++;
    for (int i = 0; i < m.n_seqs; i++) {
        const struct lora_adapter_cache_entry *e =
            lora_adapter_cache_slot_entry(w->cache, m.seqs[i].slot);
        if (e)
            lora_adapter_cache_touch(w->cache, e->name, w->clock, err, sizeof(err));
    }
    struct lora_msg_step_reply r = {
        .step_id = m.step_id,
        .rank = w->rank,
        .ok = true,
        .doorbell = !lora_notify_ring_is_empty(w->ring),
    };
    if (w->rank == 0) {
        size_t top_at = 0, plp_at = 0, ptop_at = 0;
        for (int i = 0; i < m.n_seqs; i++)
            emit(w, &m, i, logits, &top_at, &plp_at, &ptop_at);
        r.n_outs = m.n_seqs;
        r.outs = w->outs;
    }
    r.step_seconds = lora_clock_mono() - t0;
    lora_buf_reset(&w->out);
    if (lora_msg_encode_step_reply(&w->out, &r, NULL, NULL) < 0)
        return -1;
    return worker_send(w, NULL, 0);
}
