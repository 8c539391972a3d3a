/* backend: the compute interface of lora-stack: element types, tensors in a backend's memory,
 * and the one table of operations through which lib/runtime reaches a device (docs/design.md,
 * "Backend").
 *
 * What it owns and why. The runtime decides what to compute and where each piece of data lives
 * (weights in lib/runtime/model, the KV cache in kv_cache, activations, scratch and adapter
 * slots in forward); a backend decides how: backend/cpu today, a CUDA backend next. Nothing above
 * backend/ calls a kernel by name: every operation goes through struct lora_backend_ops, so no
 * two backends ever share a symbol (the CPU's functions are static or lora_cpu_*), and a program
 * picks its device at run time with lora_backend_open("cpu" | "cuda" | "cuda:N").
 *
 * Element types (enum lora_dtype). The values are those of the safetensors format, which parses
 * into this enum. A backend computes with four of them: F32, BF16, F16 and I8. I8 names two
 * things: on disk, a plain int8 tensor (no model uses one); in a backend's memory, the weight-only
 * symmetric quantization that lora_quantize_i8 writes and the int8 matmul reads (layout below,
 * at LORA_I8_GROUP).
 *
 * Memory. A buffer (struct lora_buffer) is one allocation of one backend, zero-filled, or host
 * memory it wraps without copying (the CPU backend wraps mmapped float32 weights). Its base is the
 * address the operations use: host memory on the CPU, device memory elsewhere; `host` says
 * whether the caller may also read and write it directly. upload and download copy between host
 * memory and a buffer. A tensor (struct lora_tensor) is (rows, cols), row-major, of one dtype, at
 * an offset in a buffer.
 *
 * Operations. Weights (and the KV cache, and adapter weights) are passed as tensors, so a backend
 * sees their dtype; activations are float32 addresses inside the backend's buffers (base +
 * offset, carved by the caller); the small per-step index arrays (token ids, positions, KV
 * slots, the attention and LoRA segment tables) are host memory, which a device backend copies
 * in. supports(op, dtype) says which dtypes an operation takes for its tensor argument; the caller
 * asks before it keeps a tensor in a dtype and converts otherwise (the model loader: to float32).
 * Passing an unsupported dtype is a bug; the CPU backend aborts naming it. Operations allocate
 * nothing: scratch is the caller's, sized by scratch_bytes. The shapes and the arithmetic of each
 * operation are those of backend/ref, the double-precision twins every backend is tested against
 * (tests/backend/test_backend.c).
 *
 * Threads: one thread calls into a backend at a time; the backend may use many inside a call.
 */
#ifndef LORA_BACKEND_H
#define LORA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- element types ---------------------------------------------------------------------- */

/* The safetensors dtypes, in their order; values only grow at the end. */
enum lora_dtype {
    LORA_DTYPE_F32,
    LORA_DTYPE_F16,
    LORA_DTYPE_BF16,
    LORA_DTYPE_F64,
    LORA_DTYPE_I64,
    LORA_DTYPE_I32,
    LORA_DTYPE_I16,
    LORA_DTYPE_I8,
    LORA_DTYPE_U8,
    LORA_DTYPE_BOOL,
};

/* Element size in bytes (I8: 1, its row scales not counted); 0 for a value outside the enum. */
size_t lora_dtype_size(enum lora_dtype dtype);

/* "F32", "F16", "BF16", ... as safetensors writes them; "?" outside the enum. */
const char *lora_dtype_name(enum lora_dtype dtype);

/* Sets *dtype from a name of lora_dtype_name. Returns 0, or -1 for an unknown name. */
int lora_dtype_parse(const char *name, enum lora_dtype *dtype);

/* Whether a backend may compute with dtype: F32, BF16, F16 or I8. */
bool lora_dtype_is_compute(enum lora_dtype dtype);

/* Converts n elements of src (F32, F16 or BF16, possibly unaligned) to float. Returns -1 for any
 * other dtype. BF16 converts exactly; F16 handles subnormals, infinities and NaN. */
int lora_dtype_to_f32(enum lora_dtype dtype, const void *src, float *dst, size_t n);

/* Converts n elements of src (F32, F16 or BF16, possibly unaligned) to dst in F32, F16 or BF16,
 * rounding to nearest even. Returns -1 for any other dtype. */
int lora_dtype_convert(enum lora_dtype from, const void *src, enum lora_dtype to, void *dst,
                       size_t n);

/* Float to BF16 or F16 with round-to-nearest-even. */
uint16_t lora_f32_to_bf16(float f);
uint16_t lora_f32_to_f16(float f);

/* I8 in a backend's memory: each row of cols is cut along the input into groups of
 * LORA_I8_GROUP values (the last one padded with zeros when cols is not a multiple), each group
 * with one float32 scale s = max |x| / 127 of its values, and x = q * s with q = round(x / s) in
 * [-127, 127] (an all-zero group: s = 0, q = 0). A row's values take lora_i8_row_bytes(cols)
 * bytes: its groups in blocks of LORA_I8_BLOCK, and inside a block the groups interleaved four
 * bytes at a time (lora_i8_offset): the first four values of each group of the block, then the
 * next four of each, and so on (a last block of fewer groups interleaves those). One 64-byte load
 * thus holds four values of sixteen groups, so a 16-lane int32 dot product sums each group in its
 * own lane, and a block's groups are scaled with one vector operation instead of one per group.
 * Bytes: the rows' values row-major, then the rows * lora_i8_groups(cols) scales row-major
 * (float32, at byte rows * lora_i8_row_bytes(cols), read with memcpy). The int8 matmul quantizes
 * each row of activations the same way, group by group, and sums q_x * q_w exactly in int32
 * within a group, scales in float32.
 *
 * Why groups of 64 along the input rather than one scale per output channel: the relative matmul
 * error |y - y_ref|_2 / |y_ref|_2 (k = 4864, 16 x 256 outputs, activations quantized alike; the
 * last section of tests/bench/bench_kernels, whose "kernel" column is this backend's own) is
 *                                        per channel  group 32  group 64  group 128
 *   w uniform, x normal                      0.98%      0.66%     0.70%     0.74%
 *   w uniform, x with 8 channels x30 (as
 *     LLM activations have)                  7.72%      1.09%     1.45%     1.94%
 *   w normal + 0.1% outliers x20              6.24%      0.98%     1.24%     1.61%
 *   both                                    11.01%      1.39%     1.92%     2.68%
 * for 1.0625 bytes per weight (1.125 for groups of 32, 1.031 for 128), which decoding streams.
 * Groups of 32 measured against 64 on the test models (tests/e2e/precision.bats' four; 2-vCPU AMD
 * EPYC): greedy agreement with the float64 reference 95.3-99.5% -> 96.4-99.5%, mean KL
 * 0.53-1.16e-3 instead of 0.66-1.53e-3, but single-sequence decode of the 0.5B shape 51.7-55.1
 * tokens/s instead of 64.0-65.8 (three alternating runs): 64 it is. The kernels take any
 * multiple of 4. */
#define LORA_I8_GROUP 64
#define LORA_I8_BLOCK 16

/* Scale groups of an I8 row of cols values. */
static inline int64_t lora_i8_groups(int64_t cols)
{
    return (cols + LORA_I8_GROUP - 1) / LORA_I8_GROUP;
}

/* Bytes of the values of an I8 row of cols values: whole groups. */
static inline int64_t lora_i8_row_bytes(int64_t cols)
{
    return lora_i8_groups(cols) * LORA_I8_GROUP;
}

/* Where value c of an I8 row of cols values lies among the row's bytes. */
static inline int64_t lora_i8_offset(int64_t cols, int64_t c)
{
    int64_t g = c / LORA_I8_GROUP, b0 = g / LORA_I8_BLOCK * LORA_I8_BLOCK;
    int64_t nb = lora_i8_groups(cols) - b0, p = c % LORA_I8_GROUP;

    nb = nb < LORA_I8_BLOCK ? nb : LORA_I8_BLOCK;
    return b0 * LORA_I8_GROUP + p / 4 * 4 * nb + (g - b0) * 4 + p % 4;
}

/* Bytes of a (rows, cols) tensor of dtype in a backend's memory: rows * cols elements (I8:
 * rows * lora_i8_row_bytes(cols)), plus rows * lora_i8_groups(cols) float32 scales for I8. */
size_t lora_tensor_bytes(enum lora_dtype dtype, int64_t rows, int64_t cols);

/* Converts row `row` of a (rows, cols) compute-dtype tensor at data (host memory) to float:
 * the I8 scales applied. Returns -1 for a dtype that is not a compute dtype. */
int lora_tensor_row_to_f32(enum lora_dtype dtype, const void *data, int64_t rows, int64_t cols,
                           int64_t row, float *dst);

/* Quantizes a (rows, cols) tensor src of src_dtype (F32, BF16 or F16, host memory, possibly
 * unaligned) into dst, lora_tensor_bytes(I8, rows, cols) bytes of host memory, in the I8 layout
 * above (any cols: the last group of a row is padded with zeros), rounding half to even; rows are
 * spread over threads. Returns 0, or -1 for another src_dtype, a negative shape, or a value that is
 * not finite (dst then holds garbage). */
int lora_quantize_i8(enum lora_dtype src_dtype, const void *src, int64_t rows, int64_t cols,
                     void *dst);

/* ---- memory and tensors ----------------------------------------------------------------- */

struct lora_backend;

struct lora_buffer {
    struct lora_backend *be; /* the backend it belongs to */
    void *base;              /* where the operations find it */
    size_t bytes;
    bool host;    /* base is host memory the caller may also read and write */
    bool wrapped; /* host memory the backend borrowed (buffer_wrap): never freed by it */
    void *ctx;    /* the backend's own */
};

struct lora_tensor {
    struct lora_buffer *buf; /* NULL: no tensor (a bias the model does not have) */
    size_t offset;           /* bytes from buf->base */
    enum lora_dtype dtype;
    int64_t rows, cols; /* row-major; a vector is one row */
};

/* The tensor's address as the operations see it. */
static inline void *lora_tensor_addr(const struct lora_tensor *t)
{
    return (char *)t->buf->base + t->offset;
}

/* The tensor's data as host memory, or NULL when it has none or lives on a device. */
static inline void *lora_tensor_host(const struct lora_tensor *t)
{
    return t->buf && t->buf->host ? (char *)t->buf->base + t->offset : NULL;
}

/* ---- the operations ----------------------------------------------------------------------- */

/* Each operation of the table, for supports() and scratch_bytes(). */
enum lora_kernel {
    LORA_KERNEL_MATMUL,
    LORA_KERNEL_ADD_BIAS,
    LORA_KERNEL_EMBED,
    LORA_KERNEL_RMSNORM,
    LORA_KERNEL_ROPE,
    LORA_KERNEL_SILU_MUL,
    LORA_KERNEL_ADD,
    LORA_KERNEL_KV_WRITE,
    LORA_KERNEL_ATTENTION,
    LORA_KERNEL_LORA_SGMV,
    LORA_KERNEL_ALLREDUCE,
    LORA_KERNEL_COUNT,
};

/* "matmul", "add_bias", ... */
const char *lora_kernel_name(enum lora_kernel op);

/* One sequence's part of a batch for attention: query rows [row, row + n_rows) of the batch sit
 * at positions [pos, pos + n_rows); keys and values of positions [0, pos + n_rows) are in the
 * cache (this step's already written). Position p lives in cache row block_table[p / block_size]
 * * block_size + p % block_size. Attention is causal. */
struct lora_attn_seq {
    int row;
    int n_rows;
    int pos;
    const int *block_table;
};

/* One adapter's rows of the batch for the multi-LoRA shrink/expand (Punica's SGMV layout):
 * rows [row, row + n_rows) of x and y use a (rank, in) and b_t (rank, out), scaled by scale.
 * a and b_t are tensors of at least rank rows; the first rank are used. */
struct lora_sgmv_seg {
    int row;
    int n_rows;
    int rank;
    float scale;
    struct lora_tensor a;   /* (rank, in) */
    struct lora_tensor b_t; /* (rank, out): B transposed */
};

/* A tensor-parallel group of ranks (the backend's own). */
struct lora_collective;

/* The most weights one matmul_shared call takes. */
#define LORA_MATMUL_SHARED_MAX 4

struct lora_backend_ops {
    /* -- memory -- */

    /* A zero-filled buffer of bytes (0 allowed), or NULL with err. */
    struct lora_buffer *(*buffer_alloc)(struct lora_backend *be, size_t bytes, char *err,
                                        size_t err_len);
    /* Host memory [host, host + bytes) used in place, which must outlive the buffer; NULL when
     * the backend cannot (the member itself is NULL on a backend that never can). */
    struct lora_buffer *(*buffer_wrap)(struct lora_backend *be, void *host, size_t bytes, char *err,
                                       size_t err_len);
    /* Frees buf (not the memory it wraps); NULL is a no-op. */
    void (*buffer_free)(struct lora_backend *be, struct lora_buffer *buf);
    /* Copies bytes from host memory into buf at offset, or from buf at offset into host memory.
     * Returns 0, or -1 with err (outside the buffer, a device error). */
    int (*upload)(struct lora_backend *be, struct lora_buffer *dst, size_t offset, const void *src,
                  size_t bytes, char *err, size_t err_len);
    int (*download)(struct lora_backend *be, void *dst, const struct lora_buffer *src,
                    size_t offset, size_t bytes, char *err, size_t err_len);
    /* The device memory: total and available now, in bytes. Returns 0 or -1. */
    int (*memory)(struct lora_backend *be, size_t *total, size_t *available);

    /* Whether op takes its tensor argument in dtype (the weight of matmul, add_bias, embed and
     * rmsnorm; the cache of kv_write and attention; the adapter weights of lora_sgmv; F32 for
     * the operations on activations alone: rope, silu_mul, add, allreduce). */
    bool (*supports)(struct lora_backend *be, enum lora_kernel op, enum lora_dtype dtype);

    /* Bytes of scratch op needs for at most max_rows rows of a step, contexts of at most
     * max_ctx positions and adapters of rank at most max_rank (0 for an op that needs none). */
    size_t (*scratch_bytes)(struct lora_backend *be, enum lora_kernel op, int max_rows, int max_ctx,
                            int max_rank);

    /* -- compute; shapes as (rows, cols) -- */

    /* y (m, w->rows) = alpha · x (m, w->cols) · wᵀ, or y += that when accumulate. w is a Hugging
     * Face [out, in] weight. Batch-invariant: row i of y depends only on row i of x, bit for bit,
     * whatever m is, so a request's results do not depend on what else is in its step.
     * By w's dtype, with be->fast_matmul read at each call:
     *   F32, F16: x in float32; fast changes nothing (no CPU has an fp16 dot product to use).
     *   BF16 exact (fast false): bit for bit the F32 matmul of w widened to float32.
     *   BF16 fast: x rounded to bf16 (to nearest even) first, products summed in float32 (on the
     *     CPU, vdpbf16ps where the machine has AVX512_BF16, which reads bf16 subnormals as 0).
     *   I8: x quantized per row and group as w is (LORA_I8_GROUP), whatever fast says. */
    void (*matmul)(struct lora_backend *be, float *y, const float *x, const struct lora_tensor *w,
                   int m, float alpha, bool accumulate);
    /* Optional (NULL: matmul once per weight). ys[i] (m, ws[i]->rows) = x (m, cols) · ws[i]ᵀ for
     * n_w weights of the same cols (q, k and v; gate and up), each bit for bit what matmul
     * (alpha 1, no accumulate) gives it alone: x is read and converted once for up to
     * LORA_MATMUL_SHARED_MAX weights of one dtype, and their rows are shared among the threads as
     * one weight's. */
    void (*matmul_shared)(struct lora_backend *be, int n_w, float *const *ys, const float *x,
                          const struct lora_tensor *const *ws, int m);
    /* y (m, bias->cols) += bias broadcast over rows. */
    void (*add_bias)(struct lora_backend *be, float *y, const struct lora_tensor *bias, int m);
    /* out (m, table->cols) = rows ids[i] of table. ids are validated by the caller. */
    void (*embed)(struct lora_backend *be, float *out, const struct lora_tensor *table,
                  const int *ids, int m);
    /* out (m, w->cols) = x / sqrt(mean(x²) + eps) * w. out may equal x. */
    void (*rmsnorm)(struct lora_backend *be, float *out, const float *x,
                    const struct lora_tensor *w, int m, float eps);
    /* Rotary embedding, rotate-half convention, in place on x (m, n_heads * head_dim): row i is at
     * position pos[i]; pair (j, j + head_dim/2) rotates by pos * theta^(-2j/head_dim). */
    void (*rope)(struct lora_backend *be, float *x, const int *pos, int m, int n_heads,
                 int head_dim, float theta);
    /* gate (n) = silu(gate) * up: the SwiGLU activation. */
    void (*silu_mul)(struct lora_backend *be, float *gate, const float *up, size_t n);
    /* y (n) += x (n). */
    void (*add)(struct lora_backend *be, float *y, const float *x, size_t n);
    /* Writes rows k, v (m, cache->cols) into rows slot[i] of the caches of one layer. */
    void (*kv_write)(struct lora_backend *be, const struct lora_tensor *k_cache,
                     const struct lora_tensor *v_cache, const float *k, const float *v,
                     const int *slot, int m);
    /* out (rows, n_heads * head_dim) = softmax(q · kᵀ / sqrt(head_dim)) · v over one layer's
     * paged cache, grouped-query: query head h reads KV head h / (n_heads / n_kv_heads).
     * scratch holds scratch_bytes(ATTENTION, rows, max_ctx, 0); max_ctx >= the longest context
     * in the batch. */
    void (*attention)(struct lora_backend *be, float *out, const float *q,
                      const struct lora_tensor *k_cache, const struct lora_tensor *v_cache,
                      const struct lora_attn_seq *seqs, int n_seqs, int n_heads, int n_kv_heads,
                      int head_dim, int block_size, void *scratch, int max_ctx);
    /* For each segment: t (n_rows, rank) = x · aᵀ (shrink), y += scale · t · b (expand).
     * Batch-invariant like matmul. x is (rows, in), y (rows, out); tmp holds
     * scratch_bytes(LORA_SGMV, rows, 0, max_rank). */
    void (*lora_sgmv)(struct lora_backend *be, float *y, const float *x,
                      const struct lora_sgmv_seg *segs, int n_segs, int in, int out, void *tmp,
                      int max_rank);

    /* -- the tensor-parallel collective of the ranks of one host -- */

    /* Joins (creating it when first) the group name ("/x") as rank of world_size, for sums of
     * at most max_floats floats; timeout_ms bounds every wait. NULL with err. */
    struct lora_collective *(*collective_open)(struct lora_backend *be, const char *name, int rank,
                                               int world_size, size_t max_floats, int timeout_ms,
                                               char *err, size_t err_len);
    /* Replaces buf (n floats, in the backend's memory) with its sum over the group's ranks, the
     * same bits on every rank. Returns 0, or -1 with errno (the group is then broken). */
    int (*allreduce_sum)(struct lora_backend *be, struct lora_collective *c, float *buf, size_t n);
    /* Leaves the group and frees *c, nulling it; NULL or *NULL is a no-op. */
    void (*collective_close)(struct lora_backend *be, struct lora_collective **c);

    /* Frees the backend's own state (lora_backend_close calls it). */
    void (*close)(struct lora_backend *be);

    /* -- optional: uploads that overlap compute (NULL on a backend without them: the CPU, whose
     * upload is a memcpy). So that the runtime can copy an adapter into a free slot while steps
     * run: it allocates pinned staging once, starts the copy, and uses the slot in the first
     * step issued after upload_done says yes. -- */

    /* Page-locked host memory of bytes (0 allowed), for upload_async's src: a copy from it runs
     * without the host, alongside compute. NULL with err. Freed by host_free_pinned (NULL: no-op),
     * which waits for copies still reading it. */
    void *(*host_alloc_pinned)(struct lora_backend *be, size_t bytes, char *err, size_t err_len);
    void (*host_free_pinned)(struct lora_backend *be, void *p);
    /* Starts copying bytes from host memory src into dst at offset and returns at once with
     * *ticket (never 0). The copy begins only once every operation called before it has finished
     * (so it may overwrite what an earlier step read) and runs alongside the operations called
     * after it, which therefore must not read or write [offset, offset + bytes) of dst until
     * upload_done(ticket); nor may src change until then. From memory of host_alloc_pinned it
     * is asynchronous; from other memory the call may return only once src has been read.
     * Returns 0, or -1 with err (outside the buffer, a device error). */
    int (*upload_async)(struct lora_backend *be, struct lora_buffer *dst, size_t offset,
                        const void *src, size_t bytes, uint64_t *ticket, char *err,
                        size_t err_len);
    /* Whether the copy of ticket is complete (then it stays so); never blocks. A copy that
     * failed counts as complete: the failure is reported by the next call that can fail. */
    bool (*upload_done)(struct lora_backend *be, uint64_t ticket);
};

struct lora_backend {
    const struct lora_backend_ops *ops;
    const char *kind;      /* "cpu", "cuda" */
    char device[32];       /* as opened: "cpu", "cuda:0" */
    char description[160]; /* one line for logs and --version, the paths the machine got:
                              "cpu (AVX-512, BF16 dot, VNNI int8, 16 threads)" */
    void *ctx;             /* the backend's own */
    bool fast_matmul;      /* the BF16 matmul's fast mode (see matmul); false when opened */
    size_t held_bytes;     /* device memory the backend took for itself when opened (work
                              buffers, library workspaces), outside every buffer; 0 on the CPU */
};

/* Opens device: "cpu", "cuda" (device 0) or "cuda:N". Returns NULL with one line in err: an
 * unknown device, a CUDA device in a build without CUDA ("this build has no CUDA backend (built
 * with CUDA=0)"), or a CUDA device this machine lacks ("no NVIDIA driver is installed
 * (libcuda.so.1 not found)", "no CUDA-capable device is detected", "device 3 does not exist (2
 * CUDA devices)", a device older than the build's architectures, cuBLAS missing).
 *
 * The CUDA backend (backend/cuda, docs/design.md "Backend") differs from the CPU one in what its
 * supports() answers and in one promise: its matmul is cuBLAS's, batch-invariant only to float32
 * rounding (cuBLAS picks its kernels by shape); its other operations are batch-invariant bit for
 * bit. It honours fast_matmul: exact multiplies 16-bit weights with float32 activations (carried
 * as two or three 16-bit pieces), fast rounds the activations to the weight's dtype once. */
struct lora_backend *lora_backend_open(const char *device, char *err, size_t err_len);

/* Closes *be and nulls it; NULL or *NULL is a no-op. Every buffer must be freed first. */
void lora_backend_close(struct lora_backend **be);

/* The backends this build has, for --version: "cpu" or "cpu, cuda: 2 devices". */
void lora_backend_builds(char *buf, size_t len);

#endif
