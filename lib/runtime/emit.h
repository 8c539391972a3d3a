/* emit: the one routine that turns a row of logits into the next token, and the one set of stop
 * rules; offline generation (generate.c) and serving (the worker's rank 0 draws, the engine
 * decides when a sequence ends) both use it, so a request ends the same way in either
 * (docs/design.md, "A request, file by file").
 *
 * Drawing: allowed_token_ids, when given, leave every other token out (as vLLM's mask sets it to
 * -inf); while min_tokens is not reached the banned tokens (EOS unless ignore_eos, and the stop
 * ids) cannot be drawn, unless every allowed token is banned, where the allowed set, the
 * request's hard constraint, wins. The log-probabilities reported are always the model's, before
 * any mask. The draw is seeded by (seed, number of tokens generated before it), so it does not
 * depend on what else is in the step.
 */
#ifndef LORA_EMIT_H
#define LORA_EMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/sampler.h"

/* When a sequence ends. */
struct lora_emit_rules {
    int max_tokens;
    int min_tokens; /* EOS and stop ids neither end it nor may be drawn before this */
    bool ignore_eos;
    const int32_t *eos_ids; /* the model's */
    int n_eos;
    const int32_t *stop_ids; /* the request's stop_token_ids */
    int n_stop;
};

/* The tokens that may not be drawn before min_tokens: at most cap are written to out. Returns
 * how many. */
int lora_emit_banned(const struct lora_emit_rules *r, int32_t *out, int cap);

/* After the n_generated-th token tok (counting it): "stop" (EOS or a stop id, once min_tokens
 * is reached), "length" (max_tokens reached), or NULL: go on. */
const char *lora_emit_finish(const struct lora_emit_rules *r, int n_generated, int tok);

/* One draw. */
struct lora_emit_draw {
    const float *row; /* (vocab) logits */
    struct lora_sampling_params sampling;
    uint64_t seed;
    int n_generated;        /* tokens generated before this one */
    const int32_t *allowed; /* NULL: every token */
    int n_allowed;
    const int32_t *banned; /* lora_emit_banned's, while min_tokens is not reached */
    int n_banned;
    int top_n; /* log-probabilities of the top_n tokens (<= vocab) */
};

/* Draws the token, writes its log-probability and the top_n ids and log-probabilities.
 * masked is scratch of vocab floats (NULL will do when there is nothing to mask). */
int lora_emit_token(struct lora_sampler *s, int vocab, const struct lora_emit_draw *d,
                    float *masked, float *logprob, int32_t *top_ids, float *top_logprobs);

#endif
