/* generate: runs a set of requests to completion in shared forward steps, without the serving
 * processes. For the `lora-worker generate` command, the tests and the benchmarks.
 *
 * Every request is admitted at once and keeps its KV blocks to the end: the cache is sized for
 * all of them and request i holds a contiguous range of blocks, after those of requests before
 * it, so no block allocator is needed. The model's backend computes every step. Each step spends a token budget: decodes first, one token each, then prefill
 * chunks in request order (chunked prefill), so a step mixes prefill and decode sequences.
 * Requests choose an adapter slot (or -1) and their own sampling parameters and seed.
 */
#ifndef LORA_GENERATE_H
#define LORA_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/adapter.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

struct lora_generate_request {
    /* Input, owned by the caller. */
    const int *prompt;
    int n_prompt;
    int max_tokens;
    int adapter_slot; /* index into the adapters given to lora_generate_run, or -1 */
    struct lora_sampling_params sampling;
    uint64_t seed;
    int top_n;            /* log-probabilities of the top_n tokens per step (at most vocab) */
    bool ignore_eos;
    bool prompt_logprobs; /* log p(prompt[i] | prompt[:i]) */

    /* Output, allocated by lora_generate_run, freed by lora_generate_request_release. */
    int *tokens;           /* (n_tokens) */
    int n_tokens;
    float *token_logprobs; /* (n_tokens) */
    int *top_ids;          /* (n_tokens, top_n) */
    float *top_logprobs;   /* (n_tokens, top_n) */
    float *prompt_lps;     /* (n_prompt); [0] is NAN */
    bool stopped_on_eos;   /* finish reason "stop"; otherwise "length" */
};

struct lora_generate_opts {
    int max_batched_tokens; /* token budget per step */
    int block_size;         /* KV cache block size */
    enum lora_dtype kv_dtype;   /* of the KV cache (F32, the zero value, BF16 or F16) */
    enum lora_dtype lora_dtype; /* of the adapter slots */
};

struct lora_generate_stats {
    int n_steps;
    int n_decode_steps;     /* steps without any prefill token */
    long n_decode_tokens;   /* tokens produced in those steps */
    double decode_seconds;  /* time in those steps */
    long n_step_tokens_prefill; /* tokens of the steps with a prefill (decodes among them too) */
    double prefill_seconds;     /* time in those steps */
    double total_seconds;
};

/* Runs reqs[0..n) with the adapters (slot i = adapters[i]). Returns 0, or -1 with err. */
int lora_generate_run(const struct lora_model *m, const struct lora_adapter *const *adapters,
                      int n_adapters, struct lora_generate_request *reqs, int n,
                      const struct lora_generate_opts *o, struct lora_generate_stats *stats,
                      char *err, size_t err_len);

void lora_generate_request_release(struct lora_generate_request *r);

#endif
