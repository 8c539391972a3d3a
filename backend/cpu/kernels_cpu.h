/* kernels_cpu: the CPU backend's kernels on plain float32 arrays, row-major, shapes as
 * (rows, cols) in the comments.
 *
 * Private to backend/cpu: backend_cpu.c resolves the tensors of backend/backend.h's operations
 * to addresses and calls these; nothing else does (docs/design.md, "Backend"). No kernel
 * allocates: scratch space is passed in. Threads: every kernel splits its work with OpenMP.
 */
#ifndef LORA_KERNELS_CPU_H
#define LORA_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

/* y (m, n) = alpha · x (m, k) · w (n, k)ᵀ, or y += that when accumulate. w is a Hugging Face
 * [out, in] weight. Batch-invariant: row i of y depends only on row i of x, bit for bit, whatever
 * m is, so a request's results do not depend on what else is in its step. */
void lora_cpu_matmul(float *y, const float *x, const float *w, int m, int n, int k, float alpha,
                     bool accumulate);

/* y (m, n) += bias (n) broadcast over rows. */
void lora_cpu_add_bias(float *y, const float *bias, int m, int n);

/* out (m, dim) = table[ids[i]] rows. ids are validated by the caller. */
void lora_cpu_embed(float *out, const float *table, const int *ids, int m, int dim);

/* out (m, dim) = x / sqrt(mean(x²) + eps) * w. out may equal x. */
void lora_cpu_rmsnorm(float *out, const float *x, const float *w, int m, int dim, float eps);

/* Rotary embedding, rotate-half convention, in place on x (m, n_heads * head_dim): row i is at
 * position pos[i]; pair (j, j + head_dim/2) rotates by pos * theta^(-2j/head_dim). */
void lora_cpu_rope(float *x, const int *pos, int m, int n_heads, int head_dim, float theta);

/* gate (n) = silu(gate) * up: the SwiGLU activation. */
void lora_cpu_silu_mul(float *gate, const float *up, size_t n);

/* y (n) += x (n). */
void lora_cpu_add(float *y, const float *x, size_t n);

/* Paged KV cache of one layer: (n_blocks * block_size, kv_dim) for keys and for values; a
 * position p of a sequence lives in slot block_table[p / block_size] * block_size + p % block_size.
 * Writes rows k, v (m, kv_dim) into slots slot[i]. */
void lora_cpu_kv_write(float *k_cache, float *v_cache, const float *k, const float *v,
                       const int *slot, int m, int kv_dim);

/* out (rows, n_heads * head_dim) = softmax(q · kᵀ / sqrt(head_dim)) · v over the paged cache,
 * grouped-query: query head h reads KV head h / (n_heads / n_kv_heads). scratch holds
 * n_threads * max_ctx floats, max_ctx >= the longest context in the batch. */
void lora_cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                        const struct lora_attn_seq *seqs, int n_seqs, int n_heads,
                        int n_kv_heads, int head_dim, int block_size, float *scratch,
                        int max_ctx);

/* Number of threads lora_cpu_attention may use (sizes its scratch). */
int lora_cpu_n_threads(void);

/* For each segment (its a and b_t float32 tensors in host memory): t (n_rows, rank) = x · aᵀ
 * (shrink), y += scale · t · b (expand), with the segments spread over the threads.
 * Batch-invariant like lora_cpu_matmul. tmp is (rows of x, max_rank): a segment's t sits at its
 * own rows. */
void lora_cpu_lora_sgmv(float *y, const float *x, const struct lora_sgmv_seg *segs, int n_segs,
                        int in, int out, float *tmp, int max_rank);

#endif
