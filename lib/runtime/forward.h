/* forward: one step of the transformer over a batch that mixes prefill and decode sequences,
 * each with its own LoRA adapter slot or none.
 *
 * The caller owns the KV cache blocks and block tables; the step writes this step's keys and
 * values into them. Multi-LoRA is applied unmerged: every base matmul runs over the whole batch,
 * the step orders sequences by adapter slot so that each adapter's rows are contiguous, and each
 * adapter's A and B are read once per projection (kernels.h, lora_k_lora_sgmv).
 *
 * All buffers are allocated by lora_forward_new() from the limits; a step allocates nothing.
 * A step whose input breaks a limit or names a bad token, slot or block is refused with an error
 * and leaves the cache untouched.
 */
#ifndef LORA_FORWARD_H
#define LORA_FORWARD_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/adapter.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

struct lora_forward_limits {
    int max_tokens;     /* tokens per step, all sequences together */
    int max_seqs;       /* sequences per step */
    int max_logit_rows; /* rows of logits per step */
    int max_ctx;        /* longest sequence (positions) */
    int max_loras;      /* adapter slots */
    int max_rank;       /* highest LoRA rank a slot may hold */
};

/* One sequence's part of a step. */
struct lora_seq_step {
    const int *tokens;      /* (n_tokens): a prefill chunk, or the one token of a decode */
    int n_tokens;
    int pos;                /* position of tokens[0] = tokens already in the cache */
    const int *block_table; /* covers positions [0, pos + n_tokens) */
    int adapter_slot;       /* -1: base model */
    bool all_logits;        /* logits for every token (prompt log-probabilities), else last */
};

/* Sums buf (n floats) across tensor-parallel ranks, in place. */
typedef int (*lora_allreduce_fn)(float *buf, size_t n, void *ctx);

struct lora_forward;

struct lora_forward *lora_forward_new(const struct lora_model *m, struct lora_kv_cache *kv,
                                      const struct lora_forward_limits *lim, char *err,
                                      size_t err_len);
void lora_forward_destroy(struct lora_forward **f);

/* Puts adapter a (borrowed; NULL empties the slot) into slot. Its rank must fit max_rank and it
 * must have been loaded for the same model shard. Returns 0 or -1 with err. */
int lora_forward_set_slot(struct lora_forward *f, int slot, const struct lora_adapter *a,
                          char *err, size_t err_len);

void lora_forward_set_allreduce(struct lora_forward *f, lora_allreduce_fn fn, void *ctx);

/* Runs one step. On success *logits points to the step's logits (rows, vocab) and
 * first_row[i] is the row of sequence i's first logit row (its last token's row when
 * !all_logits). Returns 0, or -1 with err. */
int lora_forward_step(struct lora_forward *f, const struct lora_seq_step *seqs, int n_seqs,
                      const float **logits, int *first_row, char *err, size_t err_len);

#endif
