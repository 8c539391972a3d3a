/* forward: one step of the transformer over a batch that mixes prefill and decode sequences,
 * each with its own LoRA adapter slot or none, computed through the model's backend.
 *
 * Owns (docs/design.md, "Backend"): the activations and scratch of a step, and the adapter slots.
 * Both are backend buffers allocated once by lora_forward_new() from the limits, so a step
 * allocates nothing. The slots are max_loras regions, each with room for every targetable
 * projection's A and B of every layer at max_rank, an adapter packed at the start of its slot at
 * its own rank; putting an adapter into a slot copies (uploads) its weights there, so the
 * compute side never points into an adapter the caller may free (lib/runtime/adapter_cache
 * decides which adapter sits where; this file holds the copies).
 * Borrowed: the model (weights) and the KV cache, which must live on the model's backend.
 *
 * The caller owns the KV cache's blocks and block tables; the step writes this step's keys and
 * values into them. Multi-LoRA is applied unmerged: every base matmul runs over the whole batch,
 * the step orders sequences by adapter slot so that each adapter's rows are contiguous, and each
 * adapter's A and B are read once per projection (backend.h, lora_sgmv).
 *
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
    enum lora_dtype slot_dtype; /* of the adapter slots (F32, the zero value, or BF16, F16) */
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

struct lora_forward;

struct lora_forward *lora_forward_new(const struct lora_model *m, struct lora_kv_cache *kv,
                                      const struct lora_forward_limits *lim, char *err,
                                      size_t err_len);
void lora_forward_destroy(struct lora_forward **f);

/* Computes on kv (borrowed, of the same shape and backend) from now on, in place of the cache it
 * was made with; its activations are sized by the limits alone, so a worker can make them before
 * it knows how many KV blocks its memory holds. Returns 0, or -1 with err. */
int lora_forward_set_kv(struct lora_forward *f, struct lora_kv_cache *kv, char *err,
                        size_t err_len);

/* One throwaway step of a few tokens at position 0 of the KV cache's first blocks, as a server
 * warms up before its first request: the weights' pages are mapped, the threads started and the
 * code paths run, so the first request's step does not pay for them. Call it before any sequence
 * holds a block (its KV entries are written over before anything reads them) and before
 * lora_forward_set_collective (each rank warms alone). Returns 0, or -1 with err. */
int lora_forward_warm(struct lora_forward *f, char *err, size_t err_len);

/* Copies adapter a's weights into slot (NULL empties it); a is not referenced afterwards. Its
 * rank must fit max_rank and it must have been loaded for the same model shard. On a backend with
 * asynchronous uploads the copy (one, of the adapter's bytes only) runs on alongside the steps
 * that follow, from a page-locked image of the slot, after those already issued: the slot is
 * ready once lora_forward_slot_ready says so, and a step that uses it earlier waits for it.
 * Elsewhere it is ready on return. Returns 0, or -1 with err and the slot empty. */
int lora_forward_set_slot(struct lora_forward *f, int slot, const struct lora_adapter *a,
                          char *err, size_t err_len);

/* Whether slot's copy is complete (an empty slot is ready); never blocks. */
bool lora_forward_slot_ready(struct lora_forward *f, int slot);

/* Returns once slot's copy is complete. */
void lora_forward_slot_wait(struct lora_forward *f, int slot);

/* Whether set_slot's copies go on after it returns (the backend uploads asynchronously). */
bool lora_forward_copies_async(const struct lora_forward *f);

/* Sums the partial outputs of o and down across the tensor-parallel ranks of c (a collective
 * of the model's backend, borrowed) after each; NULL: one rank, no sum. */
void lora_forward_set_collective(struct lora_forward *f, struct lora_collective *c);

/* Bytes of backend memory the forward pass holds: activations and scratch, and adapter slots. */
size_t lora_forward_bytes(const struct lora_forward *f, size_t *slot_bytes);

/* Runs one step. On success *logits points to the step's logits (rows, vocab) in host memory,
 * valid until the next step, and first_row[i] is the row of sequence i's first logit row (its
 * last token's row when !all_logits). Returns 0, or -1 with err. */
int lora_forward_step(struct lora_forward *f, const struct lora_seq_step *seqs, int n_seqs,
                      const float **logits, int *first_row, char *err, size_t err_len);

#endif
