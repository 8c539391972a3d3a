/* sampler: turns one row of logits into a token, and reports log-probabilities.
 *
 * Sampling order, as vLLM applies it: temperature, then top-k, then top-p, then a draw from the
 * renormalised distribution. temperature == 0 is greedy (ties go to the lowest token id).
 * top_k <= 0 or >= vocab means no top-k; top_p >= 1 means no top-p. A request's random stream is
 * its own (struct lora_rng seeded from the request's seed), so a seeded request gives the same
 * tokens whatever else is in the batch.
 *
 * Log-probabilities are those of the model's raw distribution (log_softmax of the unmodified
 * logits), as vLLM reports them by default, independent of temperature, top-k and top-p.
 *
 * No allocation after lora_sampler_new(): the scratch is sized for the vocabulary once.
 */
#ifndef LORA_SAMPLER_H
#define LORA_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

struct lora_rng {
    uint64_t state[4]; /* xoshiro256** */
};

/* Seeds rng deterministically from seed (splitmix64 expansion). */
void lora_rng_seed(struct lora_rng *rng, uint64_t seed);

/* Seeds rng for draw number draw of a request seeded with seed: the k-th token of a request
 * depends only on (seed, k), not on earlier draws, so a preempted and recomputed request, or one
 * run by another process, samples the same tokens. */
void lora_rng_seed_draw(struct lora_rng *rng, uint64_t seed, uint64_t draw);
uint64_t lora_rng_next(struct lora_rng *rng);
/* Uniform in [0, 1) with 53 random bits (24 are enough for float, we use double). */
double lora_rng_uniform(struct lora_rng *rng);

struct lora_sampling_params {
    float temperature; /* 0 = greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off; must be in (0, 1] */
};

struct lora_sampler; /* scratch for one vocabulary size */

/* Returns NULL on out-of-memory. */
struct lora_sampler *lora_sampler_new(int vocab_size);
void lora_sampler_destroy(struct lora_sampler **s);

/* Picks a token from logits[vocab_size] (not modified). Uses rng only when temperature > 0. */
int lora_sampler_sample(struct lora_sampler *s, const float *logits,
                        const struct lora_sampling_params *p, struct lora_rng *rng);

/* Log-probability of token under log_softmax(logits), computed in double. When top_n > 0, also
 * fills top_ids[top_n] and top_logprobs[top_n] with the top_n most likely tokens in order of
 * descending log-probability (ties: lower id first). top_n is clamped to vocab_size. */
float lora_sampler_logprobs(struct lora_sampler *s, const float *logits, int token, int top_n,
                            int *top_ids, float *top_logprobs);

#endif
