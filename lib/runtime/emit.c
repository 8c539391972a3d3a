/* emit: see emit.h. */
#include "runtime/emit.h"

#include <math.h>
#include <string.h>

static bool is_in(const int32_t *ids, int n, int tok)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == tok)
            return true;
    return false;
}

int lora_emit_banned(const struct lora_emit_rules *r, int32_t *out, int cap)
{
    int n = 0;

    for (int i = 0; !r->ignore_eos && i < r->n_eos && n < cap; i++)
        out[n++] = r->eos_ids[i];
    for (int i = 0; i < r->n_stop && n < cap; i++)
        out[n++] = r->stop_ids[i];
    return n;
}

const char *lora_emit_finish(const struct lora_emit_rules *r, int n_generated, int tok)
{
    if (n_generated >= r->min_tokens &&
        ((!r->ignore_eos && is_in(r->eos_ids, r->n_eos, tok)) ||
         is_in(r->stop_ids, r->n_stop, tok)))
        return "stop";
    return n_generated >= r->max_tokens ? "length" : NULL;
}

/* Whether every allowed token is also banned: then the ban gives way. */
static bool all_allowed_banned(const struct lora_emit_draw *d)
{
    for (int a = 0; a < d->n_allowed; a++)
        if (!is_in(d->banned, d->n_banned, d->allowed[a]))
            return false;
    return true;
}

int lora_emit_token(struct lora_sampler *s, int vocab, const struct lora_emit_draw *d,
                    float *masked, float *logprob, int32_t *top_ids, float *top_logprobs)
{
    const float *pick = d->row;
    struct lora_rng rng;

    if (d->n_allowed > 0) {
        for (int t = 0; t < vocab; t++)
            masked[t] = -INFINITY;
        for (int a = 0; a < d->n_allowed; a++)
            if (d->allowed[a] >= 0 && d->allowed[a] < vocab)
                masked[d->allowed[a]] = d->row[d->allowed[a]];
        pick = masked;
    }
    if (d->n_banned > 0 && !(d->n_allowed > 0 && all_allowed_banned(d))) {
        if (pick == d->row)
            memcpy(masked, d->row, sizeof(float) * (size_t)vocab);
        for (int b = 0; b < d->n_banned; b++)
            if (d->banned[b] >= 0 && d->banned[b] < vocab)
                masked[d->banned[b]] = -INFINITY;
        pick = masked;
    }
    lora_rng_seed_draw(&rng, d->seed, (uint64_t)d->n_generated);
    int tok = lora_sampler_sample(s, pick, &d->sampling, &rng);
    *logprob = lora_sampler_logprobs(s, d->row, tok, d->top_n, top_ids, top_logprobs);
    return tok;
}
