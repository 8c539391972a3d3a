/* kernels_cpu: the CPU backend's kernels on plain arrays, row-major, shapes as (rows, cols) in
 * the comments. Activations are float32; weights, caches and adapter weights come in the dtype
 * each kernel says (the tensors' compute dtypes of backend/backend.h).
 *
 * Private to backend/cpu: backend_cpu.c resolves the tensors of backend/backend.h's operations
 * to addresses and calls these; nothing else does (docs/design.md, "Backend"). No kernel
 * allocates: the matmuls that convert their activations (fast BF16, I8) do it in the backend's
 * staging memory (struct lora_cpu), allocated when it opens. Threads: every kernel splits its
 * work with OpenMP.
 */
#ifndef LORA_KERNELS_CPU_H
#define LORA_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* The instruction paths of one CPU backend, chosen when it opens (lora_cpu_isa_detect) and used
 * for every call, so its results are reproducible on the machine. */
struct lora_cpu_isa {
    bool avx512; /* AVX-512 F, BW, VL: 16-lane tiles; else AVX2 + FMA + F16C, 8 lanes */
    bool bf16;   /* with avx512: AVX512_BF16's vdpbf16ps for the fast BF16 matmul (not on Intel) */
    bool vnni;   /* with avx512: AVX512_VNNI's vpdpbusd for the I8 matmul */
    bool amx;    /* with AVX512_BF16: AMX-BF16 tiles for fast BF16 where n, k % 32 == 0 */
    /* with avx512: at one row of x, every row of 16-bit weights is read alone, the panel as one
     * stream fetched ahead into L2 (T1), as Intel's cores read them fastest; without it, only rows
     * shorter than LORA_CPU_STREAM_ROW_BYTES are, fetched into L1 (T0), and longer ones go four
     * side by side (docs/design.md, "Streaming the weights on Intel's cores") */
    bool stream_l2;
};

/* The paths this machine has, less those the environment turns off for tests and comparisons:
 * LORA_NO_AVX512 (AVX2 for everything), LORA_NO_AVX512_BF16, LORA_NO_AVX512_VNNI, LORA_NO_AMX.
 */
struct lora_cpu_isa lora_cpu_isa_detect(void);

/* Bytes of the staging memory of a backend: the matmuls that convert x (fast BF16, I8) convert
 * each row once per call into it, as many rows at a time as fit (k <= 65536 on every path; the
 * matmul aborts beyond, naming the limit). */
#define LORA_CPU_STAGE_BYTES ((size_t)8 << 20)

/* At one row of x, the 16-bit and int8 tiles read rows of w shorter than this one at a time, the
 * panel then one stream fetched this far ahead; longer rows go four side by side, fetching the
 * next tile's rows, except 16-bit ones under stream_l2 (docs/design.md, "Streaming the
 * weights"). */
#define LORA_CPU_STREAM_ROW_BYTES 4096

/* A thread's share of a matmul at one row of x (matmul_cpu.c): steps of rows of w, front and
 * back (front | back << 32), taken atomically; a cache line of its own. */
struct lora_cpu_run {
    uint64_t ends;
    char pad[56];
};

/* One CPU backend's state (be->ctx). */
struct lora_cpu {
    struct lora_cpu_isa isa;
    int n_threads; /* threads a kernel uses at most: omp_get_max_threads() when opened */
    char *stage;   /* LORA_CPU_STAGE_BYTES, 64-byte aligned */
    struct lora_cpu_run *runs; /* n_threads */
};

/* One weight of a matmul: w (n, k) and its output y (m, n). */
struct lora_cpu_part {
    float *y;
    const void *w;
    int n;
};

/* For each part: y (m, n) = alpha · x (m, k) · w (n, k)ᵀ, or y += that when accumulate. w is a
 * Hugging Face [out, in] weight of dtype F32, BF16, F16 or I8 (backend.h's layout, its scales
 * after the n * k values). fast: BF16 rounds x to bf16 (backend.h, matmul). Several parts share
 * one staging of x and one thread team, their rows split among the threads as one weight's.
 * Batch-invariant: row i of y depends only on row i of x and w, bit for bit, whatever m, the
 * number of threads and the other parts are, so a request's results do not depend on what else
 * is in its step. */
void lora_cpu_matmul(const struct lora_cpu *cpu, const struct lora_cpu_part *parts, int n_parts,
                     const float *x, enum lora_dtype dtype, int m, int k, float alpha,
                     bool accumulate, bool fast);

/* The I8 path (matmul_i8_cpu.c, called by lora_cpu_matmul). A row of x (k) quantized into its
 * staged form at row, lora_cpu_i8_row_bytes(k) bytes (a multiple of 64, at a 64-byte aligned
 * address); then columns [n0, n1) of y (m rows, stride ldy) = alpha · the m staged rows at xs
 * (one after the other) · rows [n0, n1) of w (n, k)ᵀ (+ y), w_scales its scales. */
size_t lora_cpu_i8_row_bytes(int k);
void lora_cpu_i8_stage_row(const float *x, int k, char *row);
void lora_cpu_i8_panel(const struct lora_cpu_isa *isa, float *y, int ldy, const char *xs,
                       const signed char *w, const char *w_scales, int m, int k, int n0, int n1,
                       float alpha, bool acc);

/* The AMX path (matmul_amx_cpu.c, called by lora_cpu_matmul for fast BF16 with n and k
 * multiples of 32). available: the CPU has AMX-BF16 and the kernel gave this process the tile
 * state. The staging of m rows takes 2 k bytes per row, m rounded up to 16; stage_row writes row
 * i, stage_padding zeros in the rows from m up to a multiple of 16 (each may run beside the
 * stage_row of the same block). panel: columns [n0, n1) of y (m rows, stride ldy), n0 and n1
 * multiples of 32, = alpha · staged x · rows [n0, n1) of wᵀ (+ y). */
bool lora_cpu_amx_available(void);
void lora_cpu_amx_stage_row(const float *x, int k, int i, char *stage);
void lora_cpu_amx_stage_padding(int m, int k, char *stage);
void lora_cpu_amx_panel(float *y, int ldy, const char *stage, const uint16_t *w, int m, int k,
                        int n0, int n1, float alpha, bool acc);

/* y (m, n) += bias (n) broadcast over rows. */
void lora_cpu_add_bias(float *y, const float *bias, int m, int n);

/* out (m, dim) = table[ids[i]] rows, table of dtype F32, BF16 or F16 (widened exactly). ids are
 * validated by the caller. */
void lora_cpu_embed(float *out, const void *table, enum lora_dtype dtype, const int *ids, int m,
                    int dim);

/* out (m, dim) = x / sqrt(mean(x²) + eps) * w. out may equal x. */
void lora_cpu_rmsnorm(float *out, const float *x, const float *w, int m, int dim, float eps);

/* Rotary embedding, rotate-half convention, in place on x (m, n_heads * head_dim): row i is at
 * position pos[i]; pair (j, j + head_dim/2) rotates by pos * theta^(-2j/head_dim). */
void lora_cpu_rope(float *x, const int *pos, int m, int n_heads, int head_dim, float theta);

/* gate (n) = silu(gate) * up: the SwiGLU activation; avx512 (the backend's isa): sixteen lanes,
 * the same bits. */
void lora_cpu_silu_mul(float *gate, const float *up, size_t n, bool avx512);

/* y (n) += x (n). */
void lora_cpu_add(float *y, const float *x, size_t n);

/* Paged KV cache of one layer: (n_blocks * block_size, kv_dim) for keys and for values, of
 * dtype F32, BF16 or F16; a position p of a sequence lives in slot
 * block_table[p / block_size] * block_size + p % block_size. Writes rows k, v (m, kv_dim) into
 * slots slot[i], rounded to the cache's dtype to nearest even. */
void lora_cpu_kv_write(void *k_cache, void *v_cache, enum lora_dtype dtype, const float *k,
                       const float *v, const int *slot, int m, int kv_dim);

/* out (rows, n_heads * head_dim) = softmax(q · kᵀ / sqrt(head_dim)) · v over the paged cache
 * (dtype F32, BF16 or F16, widened to float32), grouped-query: query head h reads KV head
 * h / (n_heads / n_kv_heads). scratch holds n_threads * LORA_CPU_ATTN_HEADS * max_ctx floats,
 * max_ctx >= the longest context in the batch. A pass takes the query heads of one KV head,
 * in 16-lane vectors where avx512 (the backend's isa) and heads of 64 or 128 values, else in 8
 * lanes. Batch-invariant: a row's output depends on its own query and context only. */
#define LORA_CPU_ATTN_HEADS 8 /* query heads of one pass at most: the scores each keeps */
void lora_cpu_attention(float *out, const float *q, const void *k_cache, const void *v_cache,
                        enum lora_dtype dtype, const struct lora_attn_seq *seqs, int n_seqs,
                        int n_heads, int n_kv_heads, int head_dim, int block_size, float *scratch,
                        int max_ctx, bool avx512);

/* Number of threads lora_cpu_attention may use (sizes its scratch). */
int lora_cpu_n_threads(void);

/* For each segment (its a and b_t tensors in host memory, F32, BF16 or F16, widened to float32
 * as they are read): t (n_rows, rank) = x · aᵀ (shrink), y += scale · t · b (expand), with the
 * segments spread over the threads; each adapter's weights are read once per call.
 * Batch-invariant like lora_cpu_matmul. tmp is (rows of x, max_rank): a segment's t sits at its
 * own rows. */
void lora_cpu_lora_sgmv(const struct lora_cpu *cpu, float *y, const float *x,
                        const struct lora_sgmv_seg *segs, int n_segs, int in, int out, float *tmp,
                        int max_rank);

#endif
