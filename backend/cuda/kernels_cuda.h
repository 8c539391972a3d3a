/* kernels_cuda: the CUDA backend's kernels and their launches, on plain device arrays, shapes as
 * (rows, cols), row-major.
 *
 * Private to backend/cuda: backend_cuda.cu resolves tensors to device addresses, copies the small
 * index tables (ids, positions, slots, attention and segment tables) into device memory, and calls
 * these; every launch is queued on the stream it is given and returns at once (errors of the
 * launch itself are left for cudaGetLastError). No kernel allocates; where a kernel needs room it
 * is passed in.
 *
 * Batch invariance (backend.h): every kernel here computes each output row from its own inputs in
 * an order that does not depend on the number of rows, the other rows or the grid, so a row's bits
 * are the same alone or in any batch. (The matmul itself is cuBLAS's, which is not: see
 * backend_cuda.cu.)
 */
#ifndef LORA_KERNELS_CUDA_H
#define LORA_KERNELS_CUDA_H

#include "backend/cuda/compat.h"

extern "C" {
#include "backend/backend.h"
}

/* Attention splits a row's context into parts of this many positions, each computed by its own
 * block and merged after (split-KV, as flash-decoding): fixed, so a row's result depends only on
 * its context length. */
#define LORA_CUDA_ATTN_SPLIT 512

/* A segment of lora_sgmv as the kernels read it: a is (rank, in), b (rank, out), row-major. */
struct lora_cuda_sgmv_seg {
    int row, n_rows, rank;
    float scale;
    const void *a;
    const void *b;
};

/* At most rows_per_item rows of one segment: the unit of both kernels. */
struct lora_cuda_sgmv_item {
    int seg, row0, n_rows, pad;
};

/* One sequence of attention: its block table at tables[table]. */
struct lora_cuda_attn_seq {
    int row, n_rows, pos, table;
};

/* One query row r of sequence seq, over part split of its context; part is its slot in the
 * partial results, or -1 when the context has one part (the row is written at once). */
struct lora_cuda_attn_item {
    int seq, r, split, part;
};

/* A row whose n_parts partial results, from slot part0 on, are merged into out. */
struct lora_cuda_attn_merge {
    int row, part0, n_parts, pad;
};

/* Bytes of one partial result of attention: every head's max, sum and head_dim accumulators. */
size_t lora_cuda_attn_part_bytes(int n_heads, int head_dim);

/* Heads of a group one attention block takes (they share its K/V tile), for head_dim; 0 when
 * head_dim is too large for the kernel's shared memory. */
int lora_cuda_attn_heads_per_block(int group, int head_dim);

/* out (m, cols) = rows ids[i] of table (F32, BF16 or F16). ids in device memory. */
void lora_cuda_embed(cudaStream_t s, float *out, const void *table, enum lora_dtype dtype,
                     int64_t cols, const int *ids, int m);

/* out (m, dim) = x / sqrt(mean(x²) + eps) * w; out may equal x. */
void lora_cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w, int m, int dim,
                       float eps);

/* Rotate-half RoPE in place on x (m, n_heads * head_dim), row i at position pos[i] (device). */
void lora_cuda_rope(cudaStream_t s, float *x, const int *pos, int m, int n_heads, int head_dim,
                    float theta);

/* gate (n) = silu(gate) * up. */
void lora_cuda_silu_mul(cudaStream_t s, float *gate, const float *up, size_t n);

/* y (n) += x (n). */
void lora_cuda_add(cudaStream_t s, float *y, const float *x, size_t n);

/* y (m, n) += bias (n). */
void lora_cuda_add_bias(cudaStream_t s, float *y, const float *bias, int m, int n);

/* Rows k, v (m, kv_dim) into rows slot[i] (device) of the caches of dtype (F32, BF16, F16),
 * rounded to nearest even. */
void lora_cuda_kv_write(cudaStream_t s, void *k_cache, void *v_cache, enum lora_dtype dtype,
                        const float *k, const float *v, const int *slot, int m, int kv_dim);

/* Attention of n_items (row, part) items over paged caches of dtype (device tables), then the
 * merge of the n_merges rows whose context has several parts; partials holds the parts. hg is
 * lora_cuda_attn_heads_per_block's. */
void lora_cuda_attention(cudaStream_t s, float *out, const float *q, const void *k_cache,
                         const void *v_cache, enum lora_dtype dtype,
                         const struct lora_cuda_attn_seq *seqs,
                         const struct lora_cuda_attn_item *items, int n_items,
                         const struct lora_cuda_attn_merge *merges, int n_merges, const int *tables,
                         float *partials, int n_heads, int n_kv_heads, int head_dim, int block_size,
                         int hg);

/* Rows of a segment per item for segments of rank up to max_rank (the expand keeps that many
 * rows of t in shared memory). */
int lora_cuda_sgmv_rows_per_item(int max_rank);

/* For each item: t (rows, max_rank) = x · aᵀ (shrink), then y += scale · t · b (expand). The
 * segments' a are of dtype a_dtype and b of b_dtype; max_rank is t's row stride, launch_rank the
 * largest rank of these segments, rows_per_item lora_cuda_sgmv_rows_per_item(launch_rank) or
 * less, the most rows of an item. */
void lora_cuda_sgmv(cudaStream_t s, float *y, const float *x, float *t,
                    const struct lora_cuda_sgmv_seg *segs, const struct lora_cuda_sgmv_item *items,
                    int n_items, enum lora_dtype a_dtype, enum lora_dtype b_dtype, int in, int out,
                    int max_rank, int launch_rank, int rows_per_item);

/* x (m, k) float into pieces 16-bit pieces of dtype (BF16 or F16) whose sum is each row: dst is
 * (pieces * m, k), piece p's row i at row p * m + i. F16 rows whose largest magnitude reaches
 * 2^14 are scaled by a power of two first, its exponent in row_exp[i] (0 otherwise; row_exp may
 * be NULL for BF16). */
void lora_cuda_split(cudaStream_t s, void *dst, int *row_exp, const float *x, int m, int k,
                     int pieces, enum lora_dtype dtype);

/* y (m, n) = alpha · 2^row_exp[i] · (sum of the pieces parts (pieces * m, n)), or y += that. */
void lora_cuda_combine(cudaStream_t s, float *y, const float *parts, const int *row_exp, int m,
                       int n, int pieces, float alpha, bool accumulate);

#endif
