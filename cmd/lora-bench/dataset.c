/* lora-bench: the random dataset (vLLM's RandomDataset, token ids without a tokenizer); see
 * bench.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/errbuf.h"
#include "bench.h"

void dataset_free(struct bench_prompt *p, long n)
{
    if (!p)
        return;
    for (long i = 0; i < n; i++)
        free(p[i].ids);
    free(p);
}

int dataset_random(const struct dataset_options *o, struct bench_prompt **out, char *err,
                   size_t err_len)
{
    uint64_t st = o->seed;
    double r = o->range_ratio;

    *out = NULL;
    if (!(r >= 0.0 && r < 1.0)) {
        lora_errf(err, err_len, "--random-range-ratio must be in [0, 1), not %g", r);
        return -1;
    }
    long in_lo = (long)floor((double)o->input_len * (1 - r));
    long in_hi = (long)ceil((double)o->input_len * (1 + r));
    long out_lo = (long)floor((double)o->output_len * (1 - r));
    long out_hi = (long)ceil((double)o->output_len * (1 + r));
    if (out_lo < 1)
        out_lo = 1;
    if (out_hi < 1)
        out_hi = 1;
    if (o->prefix_len + in_lo < 1) {
        lora_errf(err, err_len,
                  "--random-input-len is too small: with --random-range-ratio %g the shortest "
                  "prompt would have %ld tokens",
                  r, o->prefix_len + in_lo);
        return -1;
    }
    if (o->vocab_size < 1) {
        lora_errf(err, err_len, "--random-vocab-size must be at least 1");
        return -1;
    }
    struct bench_prompt *p = calloc((size_t)o->num_prompts, sizeof(*p));
    long *offsets = calloc((size_t)o->num_prompts, sizeof(*offsets));
    int *prefix = calloc((size_t)o->prefix_len + 1, sizeof(*prefix));
    if (!p || !offsets || !prefix)
        goto oom;
    /* The order of the draws follows vLLM's: input lengths, output lengths, offsets, then the
     * prefix. */
    for (long i = 0; i < o->num_prompts; i++)
        p[i].n_ids = (int)(o->prefix_len + rng_between(&st, in_lo, in_hi));
    for (long i = 0; i < o->num_prompts; i++)
        p[i].max_tokens = (int)rng_between(&st, out_lo, out_hi);
    for (long i = 0; i < o->num_prompts; i++)
        offsets[i] = rng_between(&st, 0, o->vocab_size - 1);
    for (long k = 0; k < o->prefix_len; k++)
        prefix[k] = (int)rng_between(&st, 0, o->vocab_size - 1);
    for (long i = 0; i < o->num_prompts; i++) {
        p[i].ids = malloc((size_t)p[i].n_ids * sizeof(int));
        if (!p[i].ids)
            goto oom;
        for (long k = 0; k < o->prefix_len; k++)
            p[i].ids[k] = prefix[k];
        for (long k = o->prefix_len; k < p[i].n_ids; k++)
            p[i].ids[k] = (int)((offsets[i] + i + (k - o->prefix_len)) % o->vocab_size);
    }
    free(offsets);
    free(prefix);
    *out = p;
    return 0;
oom:
    dataset_free(p, o->num_prompts);
    free(offsets);
    free(prefix);
    lora_errf(err, err_len, "out of memory for %ld prompts", o->num_prompts);
    return -1;
}
