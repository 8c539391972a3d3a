/* generate: offline batch generation in shared steps with chunked prefill; see generate.h. */
#include "runtime/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "runtime/emit.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"

/* Per-request progress. */
struct gen_seq {
    int *block_table; /* (blocks for prompt + max_tokens) */
    int *all_tokens;  /* (n_prompt + max_tokens): prompt, then generated */
    int n_cached;     /* tokens whose keys and values are in the cache */
    bool done;
};

struct gen_run {
    const struct lora_model *m;
    struct lora_generate_request *reqs;
    int n;
    struct gen_seq *seqs;
    struct lora_kv_cache *kv;
    struct lora_forward *fwd;
    struct lora_sampler *sampler;
    struct lora_seq_step *steps; /* (n) */
    int *step_req;               /* (n) request of each step entry */
    int *first_row;              /* (n) */
    int budget;
};

static int validate(struct gen_run *g, int n_adapters, char *err, size_t err_len)
{
    for (int i = 0; i < g->n; i++) {
        struct lora_generate_request *r = &g->reqs[i];
        if (r->n_prompt < 1 || r->max_tokens < 0 || r->top_n < 0) {
            snprintf(err, err_len, "request %d: the prompt is empty or max_tokens negative", i);
            return -1;
        }
        if (r->top_n > g->m->cfg.vocab_size)
            r->top_n = g->m->cfg.vocab_size; /* every token, once */
        if (r->n_prompt + r->max_tokens > g->m->cfg.max_position_embeddings) {
            snprintf(err, err_len,
                     "request %d: prompt (%d) plus max_tokens (%d) exceeds the context length %d",
                     i, r->n_prompt, r->max_tokens, g->m->cfg.max_position_embeddings);
            return -1;
        }
        if (r->adapter_slot < -1 || r->adapter_slot >= n_adapters) {
            snprintf(err, err_len, "request %d: adapter slot %d does not exist", i,
                     r->adapter_slot);
            return -1;
        }
        for (int t = 0; t < r->n_prompt; t++) {
            if (r->prompt[t] < 0 || r->prompt[t] >= g->m->cfg.vocab_size) {
                snprintf(err, err_len, "request %d: prompt token %d is outside the vocabulary (%d)",
                         i, r->prompt[t], g->m->cfg.vocab_size);
                return -1;
            }
        }
    }
    return 0;
}

/* Allocates the outputs, the KV pool and the step state. */
static int setup(struct gen_run *g, const struct lora_adapter *const *adapters, int n_adapters,
                 const struct lora_generate_opts *o, char *err, size_t err_len)
{
    const struct lora_model_config *c = &g->m->cfg;
    int bs = o->block_size, n_blocks = 0, max_ctx = 1, max_rank = 1, rows = g->n;

    size_t n = (unsigned)g->n;

    g->seqs = calloc(n, sizeof(*g->seqs));
    g->steps = calloc(n, sizeof(*g->steps));
    g->step_req = calloc(n, sizeof(int));
    g->first_row = calloc(n, sizeof(int));
    if (!g->seqs || !g->steps || !g->step_req || !g->first_row)
        goto oom;
    for (int i = 0; i < g->n; i++) {
        struct lora_generate_request *r = &g->reqs[i];
        struct gen_seq *s = &g->seqs[i];
        /* validate() bounds these by the context length, so they are small and positive. */
        size_t ctx = (size_t)r->n_prompt + (size_t)r->max_tokens, nb = (ctx + bs - 1) / bs;
        size_t n_top = (size_t)r->max_tokens * (size_t)(r->top_n > 0 ? r->top_n : 0);
        s->block_table = calloc(nb, sizeof(int));
        s->all_tokens = calloc(ctx, sizeof(int));
        r->tokens = calloc(ctx, sizeof(int));
        r->token_logprobs = calloc(ctx, sizeof(float));
        r->top_ids = calloc(n_top + 1, sizeof(int));
        r->top_logprobs = calloc(n_top + 1, sizeof(float));
        r->prompt_lps = calloc(ctx, sizeof(float));
        if (!s->block_table || !s->all_tokens || !r->tokens || !r->token_logprobs || !r->top_ids ||
            !r->top_logprobs || !r->prompt_lps)
            goto oom;
        memcpy(s->all_tokens, r->prompt, sizeof(int) * (size_t)r->n_prompt);
        for (int p = 0; p < r->n_prompt; p++)
            r->prompt_lps[p] = NAN;
        n_blocks += (int)nb;
        max_ctx = (int)ctx > max_ctx ? (int)ctx : max_ctx;
        if (r->prompt_logprobs)
            rows = g->budget + g->n;
    }
    for (int i = 0; i < n_adapters; i++)
        max_rank = adapters[i]->rank > max_rank ? adapters[i]->rank : max_rank;

    g->kv = lora_kv_cache_new(g->m->be, o->kv_dtype, c->n_layers, g->m->n_kv_heads * c->head_dim,
                              bs, n_blocks);
    if (!g->kv) {
        snprintf(err, err_len, "unable to allocate a %s KV cache of %d blocks",
                 lora_dtype_name(o->kv_dtype), n_blocks);
        return -1;
    }
    /* Every request is known up front: request i holds the contiguous blocks after those of
     * requests 0 .. i-1 (a prefix sum), for the whole run. */
    for (int i = 0, first = 0; i < g->n; i++) {
        int nb = (g->reqs[i].n_prompt + g->reqs[i].max_tokens + bs - 1) / bs;
        for (int b = 0; b < nb; b++)
            g->seqs[i].block_table[b] = first + b;
        first += nb;
    }
    struct lora_forward_limits lim = {
        .max_tokens = g->budget,
        .max_seqs = g->n,
        .max_logit_rows = rows,
        .max_ctx = max_ctx,
        .max_loras = n_adapters,
        .max_rank = max_rank,
        .slot_dtype = o->lora_dtype,
    };
    g->fwd = lora_forward_new(g->m, g->kv, &lim, err, err_len);
    if (!g->fwd || lora_forward_warm(g->fwd, err, err_len) < 0)
        return -1;
    for (int i = 0; i < n_adapters; i++)
        if (lora_forward_set_slot(g->fwd, i, adapters[i], err, err_len) < 0)
            return -1;
    g->sampler = lora_sampler_new(c->vocab_size);
    if (!g->sampler)
        goto oom;
    return 0;
oom:
    snprintf(err, err_len, "out of memory for %d requests", g->n);
    return -1;
}

/* Fills the step: decodes first, then prefill chunks, within the token budget. */
static int schedule(struct gen_run *g, bool *has_prefill)
{
    int n = 0, budget = g->budget;

    *has_prefill = false;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < g->n && budget > 0; i++) {
            struct lora_generate_request *r = &g->reqs[i];
            struct gen_seq *s = &g->seqs[i];
            bool prefill = s->n_cached < r->n_prompt;
            if (s->done || prefill != (pass == 1))
                continue;
            int len = prefill ? r->n_prompt - s->n_cached : 1;
            len = len < budget ? len : budget;
            budget -= len;
            g->steps[n] = (struct lora_seq_step){
                .tokens = s->all_tokens + s->n_cached,
                .n_tokens = len,
                .pos = s->n_cached,
                .block_table = s->block_table,
                .adapter_slot = r->adapter_slot,
                .all_logits = prefill && r->prompt_logprobs,
            };
            g->step_req[n++] = i;
            *has_prefill |= prefill;
        }
    }
    return n;
}

/* Samples the next token of request i from its logits row. */
static void emit(struct gen_run *g, int i, const float *row)
{
    struct lora_generate_request *r = &g->reqs[i];
    struct gen_seq *s = &g->seqs[i];
    const struct lora_model_config *c = &g->m->cfg;
    int k = r->n_tokens;
    struct lora_emit_draw d = {
        .row = row, .sampling = r->sampling, .seed = r->seed, .n_generated = k, .top_n = r->top_n};
    struct lora_emit_rules rules = {.max_tokens = r->max_tokens,
                                    .ignore_eos = r->ignore_eos,
                                    .eos_ids = c->eos_token_ids,
                                    .n_eos = c->n_eos};
    int tok =
        lora_emit_token(g->sampler, c->vocab_size, &d, NULL, &r->token_logprobs[k],
                        r->top_ids + (size_t)k * r->top_n, r->top_logprobs + (size_t)k * r->top_n);

    r->tokens[k] = tok;
    r->n_tokens++;
    s->all_tokens[r->n_prompt + k] = tok;
    const char *why = lora_emit_finish(&rules, r->n_tokens, tok);
    if (why) {
        r->stopped_on_eos = strcmp(why, "stop") == 0;
        s->done = true;
    }
}

/* Consumes one step's logits: prompt log-probabilities, then sampling. */
static void absorb(struct gen_run *g, int n_steps, const float *logits)
{
    int vocab = g->m->cfg.vocab_size;

    for (int e = 0; e < n_steps; e++) {
        int i = g->step_req[e];
        struct lora_generate_request *r = &g->reqs[i];
        struct gen_seq *s = &g->seqs[i];
        const struct lora_seq_step *st = &g->steps[e];
        const float *rows = logits + (size_t)g->first_row[e] * vocab;
        int last = st->all_logits ? st->n_tokens - 1 : 0;

        if (st->all_logits) {
            for (int t = 0; t < st->n_tokens; t++) {
                int p = st->pos + t + 1; /* the token this row predicts */
                if (p < r->n_prompt)
                    r->prompt_lps[p] = lora_sampler_logprobs(g->sampler, rows + (size_t)t * vocab,
                                                             r->prompt[p], 0, NULL, NULL);
            }
        }
        s->n_cached += st->n_tokens;
        if (s->n_cached < r->n_prompt)
            continue;
        if (r->n_tokens < r->max_tokens)
            emit(g, i, rows + (size_t)last * vocab);
        else
            s->done = true; /* max_tokens 0: prompt log-probabilities only */
    }
}

static void teardown(struct gen_run *g)
{
    for (int i = 0; g->seqs && i < g->n; i++) {
        free(g->seqs[i].block_table);
        free(g->seqs[i].all_tokens);
    }
    free(g->seqs);
    free(g->steps);
    free(g->step_req);
    free(g->first_row);
    lora_forward_destroy(&g->fwd);
    lora_kv_cache_destroy(&g->kv);
    lora_sampler_destroy(&g->sampler);
}

int lora_generate_run(const struct lora_model *m, const struct lora_adapter *const *adapters,
                      int n_adapters, struct lora_generate_request *reqs, int n,
                      const struct lora_generate_opts *o, struct lora_generate_stats *stats,
                      char *err, size_t err_len)
{
    struct gen_run g = {.m = m, .reqs = reqs, .n = n, .budget = o->max_batched_tokens};
    int rc = -1;
    double t0 = lora_clock_mono();

    memset(stats, 0, sizeof(*stats));
    if (n < 1 || o->max_batched_tokens < 1 || o->block_size < 1) {
        snprintf(err, err_len, "no requests, or a token budget or block size below 1");
        return -1;
    }
    if (validate(&g, n_adapters, err, err_len) < 0 ||
        setup(&g, adapters, n_adapters, o, err, err_len) < 0)
        goto out;
    for (int i = 0; i < n; i++)
        g.seqs[i].done = reqs[i].max_tokens == 0 && !reqs[i].prompt_logprobs;
    for (;;) {
        bool has_prefill;
        int n_steps = schedule(&g, &has_prefill);
        if (n_steps == 0)
            break;
        const float *logits;
        double ts = lora_clock_mono();
        if (lora_forward_step(g.fwd, g.steps, n_steps, &logits, g.first_row, err, err_len) < 0)
            goto out;
        absorb(&g, n_steps, logits);
        stats->n_steps++;
        if (!has_prefill) {
            stats->n_decode_steps++;
            stats->n_decode_tokens += n_steps;
            stats->decode_seconds += lora_clock_mono() - ts;
        } else {
            for (int i = 0; i < n_steps; i++)
                stats->n_step_tokens_prefill += g.steps[i].n_tokens;
            stats->prefill_seconds += lora_clock_mono() - ts;
        }
    }
    rc = 0;
out:
    stats->total_seconds = lora_clock_mono() - t0;
    teardown(&g);
    return rc;
}

void lora_generate_request_release(struct lora_generate_request *r)
{
    free(r->tokens);
    free(r->token_logprobs);
    free(r->top_ids);
    free(r->top_logprobs);
    free(r->prompt_lps);
    r->tokens = NULL;
    r->token_logprobs = NULL;
    r->top_ids = NULL;
    r->top_logprobs = NULL;
    r->prompt_lps = NULL;
}
