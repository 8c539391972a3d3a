/* backend_cuda: the CUDA backend: backend/backend.h's table over one NVIDIA GPU (docs/design.md,
 * "Backend").
 *
 * Owns what makes a GPU a device for the runtime: buffers are cudaMalloc'd device memory,
 * zero-filled, allocated only when the caller sets up (never in a step); upload and download are
 * copies on the compute stream that return once complete; memory() is cudaMemGetInfo. The state,
 * the staging of index tables and the error rule are described in backend_cuda_impl.h.
 *
 * What each operation takes (supports()):
 *   matmul       F32 (cuBLAS SGEMM, TF32 off), BF16 and F16 (cuBLAS GEMM on tensor cores, float32
 *                accumulation and output); I8 is refused: int8 weights stay on the CPU backend.
 *   embed        F32, BF16, F16 tables.
 *   kv_write, attention   F32, BF16, F16 caches.
 *   lora_sgmv    F32, BF16, F16 adapter slots.
 *   rmsnorm, add_bias     F32 weights; rope, silu_mul, add: F32 activations.
 *   allreduce    F32 through NCCL, where the machine has two devices or more (one per rank).
 *
 * Matmul with 16-bit weights: tensor cores take both operands in the weight's type. Exact mode
 * (fast_matmul false, the default) writes the float32 activations as a sum of pieces in that type
 * (three for BF16, 8 bits each: all 24 of float32; two for F16, 11 bits each), multiplies all
 * pieces in one GEMM (the weights are read once) and adds the pieces' products, so the result is
 * that of float32 activations to float32 rounding, at two or three times the tensor work. Fast mode
 * rounds the activations once. F16 rows reaching 2^14 are scaled by a power of two first so no
 * piece overflows. Pieces and products live in the backend's work buffer, a matmul of many rows
 * running in chunks that fit it.
 *
 * Batch invariance: every kernel of kernels_cuda.cu computes a row independently of the batch;
 * cuBLAS does not promise it (its kernel and split depend on the shapes), so rows of a matmul
 * agree with the same rows alone only to float32 rounding.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/backend_cuda_impl.h"
#include "backend/cuda/cuda_device.h"

#define WORK_BYTES    ((size_t)64 << 20) /* matmul chunks, attention partials */
#define BLAS_WS_BYTES ((size_t)32 << 20) /* cuBLAS's workspace (its advice for Hopper) */
#define ALIGN         256

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

struct cuda_be *lora_cuda_be(struct lora_backend *be)
{
    return (struct cuda_be *)be->ctx;
}

void lora_cuda_fail(struct cuda_be *cb, const char *what, const char *reason)
{
    if (cb->failed)
        return;
    cb->failed = true;
    snprintf(cb->error, sizeof(cb->error), "cuda:%d: %s: %s", cb->device, what, reason);
}

/* Keeps rc's failure (a CUDA call's); returns whether it succeeded. */
static bool ok(struct cuda_be *cb, cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess)
        lora_cuda_fail(cb, what, cudaGetErrorString(rc));
    return rc == cudaSuccess;
}

/* After a launch: keeps its failure. */
static void launched(struct cuda_be *cb, const char *what)
{
    ok(cb, cudaGetLastError(), what);
}

/* Makes cb's device current for this thread; false after a failure (the operation is skipped). */
static bool enter(struct cuda_be *cb)
{
    if (cb->failed)
        return false;
    return ok(cb, cudaSetDevice(cb->device), "cudaSetDevice");
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int lora_cuda_wait(struct cuda_be *cb, char *err, size_t err_len)
{
    cudaError_t rc;
    int timeout_ms = lora_cuda_colls_timeout_ms(cb);

    if (!timeout_ms) {
        rc = cudaStreamSynchronize(cb->stream);
    } else {
        /* A peer that died leaves a collective waiting forever: poll, bounded. */
        double deadline = now_ms() + timeout_ms;
        int spins = 0;
        while ((rc = cudaStreamQuery(cb->stream)) == cudaErrorNotReady) {
            if (lora_cuda_colls_broken(cb, false) || now_ms() > deadline) {
                lora_cuda_colls_broken(cb, true);
                char why[96];
                snprintf(why, sizeof(why),
                         "not done after %d ms, or a rank failed: the tensor-parallel group is "
                         "aborted",
                         timeout_ms);
                lora_cuda_fail(cb, "step", why);
                break;
            }
            if (++spins > 1000)
                usleep(100);
        }
    }
    if (rc != cudaSuccess && rc != cudaErrorNotReady)
        ok(cb, rc, "the compute stream");
    if (cb->failed) {
        snprintf(err, err_len, "%s", cb->error);
        return -1;
    }
    return 0;
}

/* ---- staging of index tables ---- */

/* Copies bytes of host into region r's device memory, unless it holds them already; returns the
 * device address (NULL after a failure). bytes <= the region's capacity. */
static void *stage(struct cuda_be *cb, int r, const void *host, size_t bytes)
{
    struct cuda_region *g = &cb->reg[r];

    if (g->valid && g->len == bytes && memcmp(g->shadow, host, bytes) == 0)
        return g->dev;
    memcpy(g->shadow, host, bytes);
    g->len = bytes;
    /* From pageable memory: staged by the driver before the call returns, so the shadow may
     * change at once; the device region is read by the launches queued after this copy. */
    g->valid = ok(cb, cudaMemcpyAsync(g->dev, g->shadow, bytes, cudaMemcpyHostToDevice, cb->stream),
                  "staging an index table");
    return g->valid ? g->dev : NULL;
}

/* ---- memory ---- */

static struct lora_buffer *cuda_buffer_alloc(struct lora_backend *be, size_t bytes, char *err,
                                             size_t err_len)
{
    struct cuda_be *cb = lora_cuda_be(be);
    void *p = NULL;

    if (!enter(cb)) {
        snprintf(err, err_len, "%s", cb->error);
        return NULL;
    }
    cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky */
        snprintf(err, err_len, "cuda:%d: unable to allocate %zu bytes: %s", cb->device, bytes,
                 cudaGetErrorString(rc));
        return NULL;
    }
    /* On the compute stream, which does not wait for the legacy default stream. */
    if (!ok(cb, cudaMemsetAsync(p, 0, bytes, cb->stream), "zeroing a buffer") ||
        lora_cuda_wait(cb, err, err_len) < 0) {
        cudaFree(p);
        snprintf(err, err_len, "%s", cb->error);
        return NULL;
    }
    struct lora_buffer *b = (struct lora_buffer *)calloc(1, sizeof(*b));
    if (!b) {
        cudaFree(p);
        snprintf(err, err_len, "cuda: out of memory");
        return NULL;
    }
    b->be = be;
    b->base = p;
    b->bytes = bytes;
    return b;
}

static void cuda_buffer_free(struct lora_backend *be, struct lora_buffer *b)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (!b)
        return;
    cudaSetDevice(cb->device);
    /* Nothing queued may still use it. */
    cudaStreamSynchronize(cb->stream);
    cudaStreamSynchronize(cb->copy_stream);
    cudaFree(b->base);
    free(b);
}

static int in_bounds(struct cuda_be *cb, const struct lora_buffer *b, size_t offset, size_t bytes,
                     char *err, size_t err_len)
{
    if (offset <= b->bytes && bytes <= b->bytes - offset)
        return 0;
    snprintf(err, err_len, "cuda:%d: %zu bytes at %zu lie outside a buffer of %zu", cb->device,
             bytes, offset, b->bytes);
    return -1;
}

static int cuda_upload(struct lora_backend *be, struct lora_buffer *dst, size_t offset,
                       const void *src, size_t bytes, char *err, size_t err_len)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (in_bounds(cb, dst, offset, bytes, err, err_len) < 0)
        return -1;
    if (enter(cb) && bytes)
        ok(cb,
           cudaMemcpyAsync((char *)dst->base + offset, src, bytes, cudaMemcpyHostToDevice,
                           cb->stream),
           "upload");
    return lora_cuda_wait(cb, err, err_len);
}

static int cuda_download(struct lora_backend *be, void *dst, const struct lora_buffer *src,
                         size_t offset, size_t bytes, char *err, size_t err_len)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (in_bounds(cb, src, offset, bytes, err, err_len) < 0)
        return -1;
    if (enter(cb) && bytes)
        ok(cb,
           cudaMemcpyAsync(dst, (const char *)src->base + offset, bytes, cudaMemcpyDeviceToHost,
                           cb->stream),
           "download");
    return lora_cuda_wait(cb, err, err_len);
}

static int cuda_memory(struct lora_backend *be, size_t *total, size_t *available)
{
    struct cuda_be *cb = lora_cuda_be(be);
    size_t f = 0, t = 0;

    if (cudaSetDevice(cb->device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess)
        return -1;
    *total = t;
    *available = f;
    return 0;
}

static void *cuda_host_alloc_pinned(struct lora_backend *be, size_t bytes, char *err,
                                    size_t err_len)
{
    struct cuda_be *cb = lora_cuda_be(be);
    void *p = NULL;

    cudaSetDevice(cb->device);
    cudaError_t rc = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, err_len, "cuda:%d: unable to allocate %zu bytes of pinned memory: %s",
                 cb->device, bytes, cudaGetErrorString(rc));
        return NULL;
    }
    return p;
}

static void cuda_host_free_pinned(struct lora_backend *be, void *p)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (!p)
        return;
    cudaSetDevice(cb->device);
    cudaStreamSynchronize(cb->copy_stream);
    cudaFreeHost(p);
}

static int cuda_upload_async(struct lora_backend *be, struct lora_buffer *dst, size_t offset,
                             const void *src, size_t bytes, uint64_t *ticket, char *err,
                             size_t err_len)
{
    struct cuda_be *cb = lora_cuda_be(be);

    *ticket = 0;
    if (in_bounds(cb, dst, offset, bytes, err, err_len) < 0)
        return -1;
    if (!enter(cb)) {
        snprintf(err, err_len, "%s", cb->error);
        return -1;
    }
    uint64_t t = cb->next_ticket++;
    cudaEvent_t ev = cb->tickets[t % CUDA_TICKETS];
    /* The event of ticket t - CUDA_TICKETS is reused: that copy must be over. */
    if (t > CUDA_TICKETS)
        ok(cb, cudaEventSynchronize(ev), "waiting for an old upload");
    /* The copy waits for the work queued so far (which may read the region it overwrites). */
    ok(cb, cudaEventRecord(cb->fence, cb->stream), "upload_async") &&
        ok(cb, cudaStreamWaitEvent(cb->copy_stream, cb->fence, 0), "upload_async") &&
        (!bytes || ok(cb,
                      cudaMemcpyAsync((char *)dst->base + offset, src, bytes,
                                      cudaMemcpyHostToDevice, cb->copy_stream),
                      "upload_async")) &&
        ok(cb, cudaEventRecord(ev, cb->copy_stream), "upload_async");
    if (cb->failed) {
        snprintf(err, err_len, "%s", cb->error);
        return -1;
    }
    *ticket = t;
    return 0;
}

static bool cuda_upload_done(struct lora_backend *be, uint64_t ticket)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (ticket == 0 || ticket >= cb->next_ticket || cb->failed)
        return true;
    if (ticket + CUDA_TICKETS < cb->next_ticket) /* its event was waited for and reused */
        return true;
    cudaSetDevice(cb->device);
    cudaError_t rc = cudaEventQuery(cb->tickets[ticket % CUDA_TICKETS]);
    if (rc == cudaErrorNotReady)
        return false;
    ok(cb, rc, "upload_async");
    return true;
}

/* ---- what the operations take ---- */

static bool is_16bit(enum lora_dtype d)
{
    return d == LORA_DTYPE_BF16 || d == LORA_DTYPE_F16;
}

static bool cuda_supports(struct lora_backend *be, enum lora_kernel op, enum lora_dtype dtype)
{
    struct cuda_be *cb = lora_cuda_be(be);
    bool f32 = dtype == LORA_DTYPE_F32;

    switch (op) {
    case LORA_KERNEL_MATMUL:
    case LORA_KERNEL_EMBED:
    case LORA_KERNEL_KV_WRITE:
    case LORA_KERNEL_ATTENTION:
    case LORA_KERNEL_LORA_SGMV:
        return f32 || is_16bit(dtype);
    case LORA_KERNEL_ADD_BIAS:
    case LORA_KERNEL_RMSNORM:
    case LORA_KERNEL_ROPE:
    case LORA_KERNEL_SILU_MUL:
    case LORA_KERNEL_ADD:
        return f32;
    case LORA_KERNEL_ALLREDUCE: /* NCCL: one device per rank */
        return f32 && cb->n_devices >= 2;
    default:
        return false;
    }
}

static size_t cuda_scratch_bytes(struct lora_backend *be, enum lora_kernel op, int max_rows,
                                 int max_ctx, int max_rank)
{
    /* The shrink's t, one row per row of the step; attention's partial results and matmul's
     * pieces are in the backend's own work buffer. */
    if (op == LORA_KERNEL_LORA_SGMV)
        return (size_t)max_rows * (size_t)max_rank * sizeof(float);
    return 0;
}

/* Whether tensor t has a dtype op takes here; keeps the failure otherwise. */
static bool takes(struct cuda_be *cb, const struct lora_tensor *t, bool f32_only, const char *what)
{
    if (t->dtype == LORA_DTYPE_F32 || (!f32_only && is_16bit(t->dtype)))
        return true;
    char why[96];
    snprintf(why, sizeof(why), "dtype %s is not supported", lora_dtype_name(t->dtype));
    lora_cuda_fail(cb, what, why);
    return false;
}

/* ---- compute ---- */

static cudaDataType cuda_type(enum lora_dtype d)
{
    return d == LORA_DTYPE_BF16 ? CUDA_R_16BF : d == LORA_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* C (n, m) column-major = y (m, n) row-major: alpha · w (n, k) · x (m, k)ᵀ + beta · C. */
static void gemm(struct cuda_be *cb, float *y, const void *x, const void *w, enum lora_dtype dtype,
                 int m, int n, int k, float alpha, float beta)
{
    cublasStatus_t st = cb->blas->gemm_ex(
        cb->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, cuda_type(dtype), k, x,
        cuda_type(dtype), k, &beta, y, CUDA_R_32F, n,
        dtype == LORA_DTYPE_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        lora_cuda_fail(cb, "matmul (cublasGemmEx)", cb->blas->status_string(st));
}

static void cuda_matmul(struct lora_backend *be, float *y, const float *x,
                        const struct lora_tensor *w, int m, float alpha, bool accumulate)
{
    struct cuda_be *cb = lora_cuda_be(be);
    int n = (int)w->rows, k = (int)w->cols;
    const void *wd = lora_tensor_addr(w);

    if (m < 1 || n < 1 || !enter(cb) || !takes(cb, w, false, "matmul weight"))
        return;
    if (k < 1) { /* an empty sum */
        if (!accumulate)
            ok(cb, cudaMemsetAsync(y, 0, (size_t)m * n * sizeof(float), cb->stream), "matmul");
        return;
    }
    if (w->dtype == LORA_DTYPE_F32) {
        gemm(cb, y, x, wd, w->dtype, m, n, k, alpha, accumulate ? 1.0f : 0.0f);
        return;
    }
    bool bf16 = w->dtype == LORA_DTYPE_BF16, fast = be->fast_matmul;
    int pieces = fast ? 1 : bf16 ? 3 : 2;
    bool direct = bf16 && fast; /* one piece, no row scale: cuBLAS writes y itself */
    size_t per_row = (size_t)pieces * k * 2 + sizeof(int) + (direct ? 0 : (size_t)pieces * n * 4);
    size_t fit = (cb->work_bytes - 3 * ALIGN) / per_row;
    if (fit < 1) {
        lora_cuda_fail(cb, "matmul", "a row does not fit the work buffer");
        return;
    }
    int chunk = fit < (size_t)m ? (int)fit : m;
    for (int r0 = 0; r0 < m && !cb->failed; r0 += chunk) {
        int rows = m - r0 < chunk ? m - r0 : chunk;
        char *conv = (char *)cb->work;
        int *exps = (int *)(conv + align_up((size_t)pieces * rows * k * 2));
        float *parts = (float *)((char *)exps + align_up((size_t)rows * sizeof(int)));
        lora_cuda_split(cb->stream, conv, bf16 ? NULL : exps, x + (size_t)r0 * k, rows, k, pieces,
                        w->dtype);
        launched(cb, "matmul (split)");
        if (direct) {
            gemm(cb, y + (size_t)r0 * n, conv, wd, w->dtype, rows, n, k, alpha,
                 accumulate ? 1.0f : 0.0f);
        } else {
            gemm(cb, parts, conv, wd, w->dtype, pieces * rows, n, k, 1.0f, 0.0f);
            lora_cuda_combine(cb->stream, y + (size_t)r0 * n, parts, bf16 ? NULL : exps, rows, n,
                              pieces, alpha, accumulate);
            launched(cb, "matmul (combine)");
        }
    }
}

static void cuda_add_bias(struct lora_backend *be, float *y, const struct lora_tensor *bias, int m)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (m < 1 || bias->cols < 1 || !enter(cb) || !takes(cb, bias, true, "bias"))
        return;
    lora_cuda_add_bias(cb->stream, y, (const float *)lora_tensor_addr(bias), m, (int)bias->cols);
    launched(cb, "add_bias");
}

static void cuda_embed(struct lora_backend *be, float *out, const struct lora_tensor *table,
                       const int *ids, int m)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (m < 1 || table->cols < 1 || !enter(cb) || !takes(cb, table, false, "embedding"))
        return;
    for (int r0 = 0; r0 < m && !cb->failed; r0 += ROWS_CAP) {
        int rows = m - r0 < ROWS_CAP ? m - r0 : ROWS_CAP;
        const int *d_ids = (const int *)stage(cb, REG_IDS, ids + r0, (size_t)rows * sizeof(int));
        if (!d_ids)
            return;
        lora_cuda_embed(cb->stream, out + (size_t)r0 * table->cols, lora_tensor_addr(table),
                        table->dtype, table->cols, d_ids, rows);
        launched(cb, "embed");
    }
}

static void cuda_rmsnorm(struct lora_backend *be, float *out, const float *x,
                         const struct lora_tensor *w, int m, float eps)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (m < 1 || w->cols < 1 || !enter(cb) || !takes(cb, w, true, "norm weight"))
        return;
    lora_cuda_rmsnorm(cb->stream, out, x, (const float *)lora_tensor_addr(w), m, (int)w->cols, eps);
    launched(cb, "rmsnorm");
}

static void cuda_rope(struct lora_backend *be, float *x, const int *pos, int m, int n_heads,
                      int head_dim, float theta)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (m < 1 || n_heads < 1 || head_dim < 2 || !enter(cb))
        return;
    for (int r0 = 0; r0 < m && !cb->failed; r0 += ROWS_CAP) {
        int rows = m - r0 < ROWS_CAP ? m - r0 : ROWS_CAP;
        const int *d_pos = (const int *)stage(cb, REG_POS, pos + r0, (size_t)rows * sizeof(int));
        if (!d_pos)
            return;
        lora_cuda_rope(cb->stream, x + (size_t)r0 * n_heads * head_dim, d_pos, rows, n_heads,
                       head_dim, theta);
        launched(cb, "rope");
    }
}

static void cuda_silu_mul(struct lora_backend *be, float *gate, const float *up, size_t n)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (!n || !enter(cb))
        return;
    lora_cuda_silu_mul(cb->stream, gate, up, n);
    launched(cb, "silu_mul");
}

static void cuda_add(struct lora_backend *be, float *y, const float *x, size_t n)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (!n || !enter(cb))
        return;
    lora_cuda_add(cb->stream, y, x, n);
    launched(cb, "add");
}

static bool same_cache_dtypes(struct cuda_be *cb, const struct lora_tensor *k,
                              const struct lora_tensor *v, const char *what)
{
    if (!takes(cb, k, false, what) || !takes(cb, v, false, what))
        return false;
    if (k->dtype != v->dtype || k->cols != v->cols) {
        lora_cuda_fail(cb, what, "the key and value caches differ in dtype or width");
        return false;
    }
    return true;
}

static void cuda_kv_write(struct lora_backend *be, const struct lora_tensor *k_cache,
                          const struct lora_tensor *v_cache, const float *k, const float *v,
                          const int *slot, int m)
{
    struct cuda_be *cb = lora_cuda_be(be);
    int kv_dim = (int)k_cache->cols;

    if (m < 1 || kv_dim < 1 || !enter(cb) || !same_cache_dtypes(cb, k_cache, v_cache, "kv_write"))
        return;
    for (int r0 = 0; r0 < m && !cb->failed; r0 += ROWS_CAP) {
        int rows = m - r0 < ROWS_CAP ? m - r0 : ROWS_CAP;
        const int *d_slot = (const int *)stage(cb, REG_SLOT, slot + r0, (size_t)rows * sizeof(int));
        if (!d_slot)
            return;
        lora_cuda_kv_write(cb->stream, lora_tensor_addr(k_cache), lora_tensor_addr(v_cache),
                           k_cache->dtype, k + (size_t)r0 * kv_dim, v + (size_t)r0 * kv_dim, d_slot,
                           rows, kv_dim);
        launched(cb, "kv_write");
    }
}

/* ---- attention: the tables of one launch, assembled on the host ---- */

struct attn_build {
    int n_seqs, n_tables, n_items, n_merges, n_parts, max_parts;
};

/* Copies the tables into the attention region and launches; empties b. */
static void attn_flush(struct cuda_be *cb, struct attn_build *b, float *out, const float *q,
                       const struct lora_tensor *kc, const struct lora_tensor *vc, int n_heads,
                       int n_kv_heads, int head_dim, int block_size, int hg)
{
    if (!b->n_items || cb->failed) {
        *b = (struct attn_build){0, 0, 0, 0, 0, b->max_parts};
        return;
    }
    size_t o_tables = align_up((size_t)b->n_seqs * sizeof(*cb->a_seqs));
    size_t o_items = o_tables + align_up((size_t)b->n_tables * sizeof(int));
    size_t o_merges = o_items + align_up((size_t)b->n_items * sizeof(*cb->a_items));
    size_t total = o_merges + (size_t)b->n_merges * sizeof(*cb->a_merges);
    memcpy(cb->pack, cb->a_seqs, (size_t)b->n_seqs * sizeof(*cb->a_seqs));
    memcpy(cb->pack + o_tables, cb->a_tables, (size_t)b->n_tables * sizeof(int));
    memcpy(cb->pack + o_items, cb->a_items, (size_t)b->n_items * sizeof(*cb->a_items));
    memcpy(cb->pack + o_merges, cb->a_merges, (size_t)b->n_merges * sizeof(*cb->a_merges));
    char *d = (char *)stage(cb, REG_ATTN, cb->pack, total);
    if (d) {
        lora_cuda_attention(
            cb->stream, out, q, lora_tensor_addr(kc), lora_tensor_addr(vc), kc->dtype,
            (const lora_cuda_attn_seq *)d, (const lora_cuda_attn_item *)(d + o_items), b->n_items,
            (const lora_cuda_attn_merge *)(d + o_merges), b->n_merges, (const int *)(d + o_tables),
            (float *)cb->work, n_heads, n_kv_heads, head_dim, block_size, hg);
        launched(cb, "attention");
    }
    *b = (struct attn_build){0, 0, 0, 0, 0, b->max_parts};
}

static void cuda_attention(struct lora_backend *be, float *out, const float *q,
                           const struct lora_tensor *k_cache, const struct lora_tensor *v_cache,
                           const struct lora_attn_seq *seqs, int n_seqs, int n_heads,
                           int n_kv_heads, int head_dim, int block_size, void *scratch, int max_ctx)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (n_seqs < 1 || !enter(cb) || !same_cache_dtypes(cb, k_cache, v_cache, "attention"))
        return;
    if (n_kv_heads < 1 || head_dim < 1 || block_size < 1 || n_heads % n_kv_heads ||
        k_cache->cols != (int64_t)n_kv_heads * head_dim) {
        lora_cuda_fail(cb, "attention", "the heads do not match the cache");
        return;
    }
    int hg = lora_cuda_attn_heads_per_block(n_heads / n_kv_heads, head_dim);
    if (!hg) {
        char why[64];
        snprintf(why, sizeof(why), "head_dim %d is too large for the kernel", head_dim);
        lora_cuda_fail(cb, "attention", why);
        return;
    }
    struct attn_build b = {
        0, 0, 0, 0, 0, (int)(cb->work_bytes / lora_cuda_attn_part_bytes(n_heads, head_dim))};
    for (int s = 0; s < n_seqs && !cb->failed; s++) {
        const struct lora_attn_seq *sq = &seqs[s];
        int n_blocks = (sq->pos + sq->n_rows + block_size - 1) / block_size;
        bool added = false;
        for (int r = 0; r < sq->n_rows && !cb->failed; r++) {
            int ctx = sq->pos + r + 1;
            int n_split = (ctx + LORA_CUDA_ATTN_SPLIT - 1) / LORA_CUDA_ATTN_SPLIT;
            int parts = n_split > 1 ? n_split : 0;
            for (int pass = 0; pass < 2; pass++) {
                bool fits = b.n_items + n_split <= ATTN_ITEMS_CAP &&
                            b.n_merges + (parts > 0) <= ATTN_MERGES_CAP &&
                            b.n_parts + parts <= b.max_parts &&
                            (added || (b.n_seqs < ATTN_SEQS_CAP &&
                                       b.n_tables + n_blocks <= ATTN_TABLES_CAP));
                if (fits)
                    break;
                if (pass == 1 || !b.n_items) {
                    lora_cuda_fail(cb, "attention", "a sequence's tables exceed the staging room");
                    return;
                }
                attn_flush(cb, &b, out, q, k_cache, v_cache, n_heads, n_kv_heads, head_dim,
                           block_size, hg);
                added = false;
            }
            if (!added) {
                cb->a_seqs[b.n_seqs] = {sq->row, sq->n_rows, sq->pos, b.n_tables};
                memcpy(cb->a_tables + b.n_tables, sq->block_table, (size_t)n_blocks * sizeof(int));
                b.n_seqs++;
                b.n_tables += n_blocks;
                added = true;
            }
            for (int sp = 0; sp < n_split; sp++)
                cb->a_items[b.n_items++] = {b.n_seqs - 1, r, sp, parts ? b.n_parts + sp : -1};
            if (parts) {
                cb->a_merges[b.n_merges++] = {sq->row + r, b.n_parts, parts, 0};
                b.n_parts += parts;
            }
        }
    }
    attn_flush(cb, &b, out, q, k_cache, v_cache, n_heads, n_kv_heads, head_dim, block_size, hg);
}

/* ---- multi-LoRA ---- */

struct sgmv_build {
    int n_segs, n_items, max_rank;
    enum lora_dtype a_dtype, b_dtype;
};

static void sgmv_flush(struct cuda_be *cb, struct sgmv_build *b, float *y, const float *x, float *t,
                       int in, int out, int max_rank, int rows_per_item)
{
    if (b->n_items && !cb->failed) {
        size_t o_items = align_up((size_t)b->n_segs * sizeof(*cb->s_segs));
        size_t total = o_items + (size_t)b->n_items * sizeof(*cb->s_items);
        memcpy(cb->pack, cb->s_segs, (size_t)b->n_segs * sizeof(*cb->s_segs));
        memcpy(cb->pack + o_items, cb->s_items, (size_t)b->n_items * sizeof(*cb->s_items));
        char *d = (char *)stage(cb, REG_SGMV, cb->pack, total);
        if (d) {
            lora_cuda_sgmv(cb->stream, y, x, t, (const lora_cuda_sgmv_seg *)d,
                           (const lora_cuda_sgmv_item *)(d + o_items), b->n_items, b->a_dtype,
                           b->b_dtype, in, out, max_rank, b->max_rank, rows_per_item);
            launched(cb, "lora_sgmv");
        }
    }
    b->n_segs = b->n_items = b->max_rank = 0;
}

static void cuda_lora_sgmv(struct lora_backend *be, float *y, const float *x,
                           const struct lora_sgmv_seg *segs, int n_segs, int in, int out, void *tmp,
                           int max_rank)
{
    struct cuda_be *cb = lora_cuda_be(be);
    int rpi = lora_cuda_sgmv_rows_per_item(max_rank);

    if (n_segs < 1 || in < 1 || out < 1 || !enter(cb))
        return;
    if (rpi < 1) {
        lora_cuda_fail(cb, "lora_sgmv", "max_rank is too large for the kernel");
        return;
    }
    struct sgmv_build b = {0, 0, 0, LORA_DTYPE_F32, LORA_DTYPE_F32};
    for (int s = 0; s < n_segs && !cb->failed; s++) {
        const struct lora_sgmv_seg *g = &segs[s];
        if (g->n_rows < 1 || g->rank < 1)
            continue;
        if (!takes(cb, &g->a, false, "LoRA A") || !takes(cb, &g->b_t, false, "LoRA B"))
            return;
        if (g->rank > max_rank || g->a.cols != in || g->b_t.cols != out || g->a.rows < g->rank ||
            g->b_t.rows < g->rank) {
            lora_cuda_fail(cb, "lora_sgmv", "a segment's rank or shapes do not match");
            return;
        }
        int n_items = (g->n_rows + rpi - 1) / rpi;
        if ((b.n_segs && (g->a.dtype != b.a_dtype || g->b_t.dtype != b.b_dtype)) ||
            b.n_segs == SGMV_SEGS_CAP || b.n_items + n_items > SGMV_ITEMS_CAP)
            sgmv_flush(cb, &b, y, x, (float *)tmp, in, out, max_rank, rpi);
        if (n_items > SGMV_ITEMS_CAP) {
            lora_cuda_fail(cb, "lora_sgmv", "a segment exceeds the staging room");
            return;
        }
        b.a_dtype = g->a.dtype;
        b.b_dtype = g->b_t.dtype;
        cb->s_segs[b.n_segs] = {g->row,
                                g->n_rows,
                                g->rank,
                                g->scale,
                                lora_tensor_addr(&g->a),
                                lora_tensor_addr(&g->b_t)};
        for (int r0 = 0; r0 < g->n_rows; r0 += rpi)
            cb->s_items[b.n_items++] = {b.n_segs, g->row + r0,
                                        g->n_rows - r0 < rpi ? g->n_rows - r0 : rpi, 0};
        b.n_segs++;
        b.max_rank = g->rank > b.max_rank ? g->rank : b.max_rank;
    }
    sgmv_flush(cb, &b, y, x, (float *)tmp, in, out, max_rank, rpi);
}

/* ---- open and close ---- */

static void cuda_close(struct lora_backend *be)
{
    struct cuda_be *cb = lora_cuda_be(be);

    if (!cb)
        return;
    cudaSetDevice(cb->device);
    while (cb->n_colls > 0) {
        struct lora_collective *c = (struct lora_collective *)cb->colls[0];
        lora_cuda_collective_close(be, &c);
    }
    if (cb->stream)
        cudaStreamSynchronize(cb->stream);
    if (cb->copy_stream)
        cudaStreamSynchronize(cb->copy_stream);
    if (cb->handle)
        cb->blas->destroy(cb->handle);
    for (int i = 0; i < N_REGIONS; i++) {
        cudaFree(cb->reg[i].dev);
        free(cb->reg[i].shadow);
    }
    cudaFree(cb->work);
    cudaFree(cb->blas_ws);
    for (int i = 0; i < CUDA_TICKETS; i++)
        if (cb->tickets[i])
            cudaEventDestroy(cb->tickets[i]);
    if (cb->fence)
        cudaEventDestroy(cb->fence);
    if (cb->stream)
        cudaStreamDestroy(cb->stream);
    if (cb->copy_stream)
        cudaStreamDestroy(cb->copy_stream);
    free(cb->pack);
    free(cb->a_seqs);
    free(cb->a_tables);
    free(cb->a_items);
    free(cb->a_merges);
    free(cb->s_segs);
    free(cb->s_items);
    free(cb);
    be->ctx = NULL;
}

static const struct lora_backend_ops cuda_ops = {
    .buffer_alloc = cuda_buffer_alloc,
    /* device memory only: the loader uploads every weight */
    .buffer_wrap = NULL,
    .buffer_free = cuda_buffer_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .memory = cuda_memory,
    .supports = cuda_supports,
    .scratch_bytes = cuda_scratch_bytes,
    .matmul = cuda_matmul,
    .add_bias = cuda_add_bias,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .silu_mul = cuda_silu_mul,
    .add = cuda_add,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .lora_sgmv = cuda_lora_sgmv,
    .collective_open = lora_cuda_collective_open,
    .allreduce_sum = lora_cuda_allreduce_sum,
    .collective_close = lora_cuda_collective_close,
    .close = cuda_close,
    .host_alloc_pinned = cuda_host_alloc_pinned,
    .host_free_pinned = cuda_host_free_pinned,
    .upload_async = cuda_upload_async,
    .upload_done = cuda_upload_done,
};

/* Allocates cb's device and host state. Returns 0, or -1 with err. */
static int setup(struct cuda_be *cb, char *err, size_t err_len)
{
    static const size_t region_bytes[N_REGIONS] = {
        /* REG_IDS, REG_POS, REG_SLOT */
        ROWS_CAP * sizeof(int),
        ROWS_CAP * sizeof(int),
        ROWS_CAP * sizeof(int),
        /* REG_ATTN */
        ATTN_SEQS_CAP * sizeof(lora_cuda_attn_seq) + ATTN_TABLES_CAP * sizeof(int) +
            ATTN_ITEMS_CAP * sizeof(lora_cuda_attn_item) +
            ATTN_MERGES_CAP * sizeof(lora_cuda_attn_merge) + 4 * ALIGN,
        /* REG_SGMV */
        SGMV_SEGS_CAP * sizeof(lora_cuda_sgmv_seg) + SGMV_ITEMS_CAP * sizeof(lora_cuda_sgmv_item) +
            2 * ALIGN,
    };
    const char *what = "creating streams";
    cudaError_t rc = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaEventCreateWithFlags(&cb->fence, cudaEventDisableTiming);
    for (int i = 0; i < CUDA_TICKETS && rc == cudaSuccess; i++)
        rc = cudaEventCreateWithFlags(&cb->tickets[i], cudaEventDisableTiming);
    size_t pack = 0;
    for (int i = 0; i < N_REGIONS && rc == cudaSuccess; i++) {
        what = "allocating the staging regions";
        cb->reg[i].cap = region_bytes[i];
        pack = region_bytes[i] > pack ? region_bytes[i] : pack;
        rc = cudaMalloc(&cb->reg[i].dev, region_bytes[i]);
        cb->reg[i].shadow = (char *)malloc(region_bytes[i]);
        if (rc == cudaSuccess && !cb->reg[i].shadow)
            rc = cudaErrorMemoryAllocation;
    }
    if (rc == cudaSuccess) {
        /* LORA_CUDA_WORK_BYTES: a smaller buffer (at least 16 KiB), for the tests of chunking. */
        const char *env = getenv("LORA_CUDA_WORK_BYTES");
        long long want = env ? atoll(env) : 0;
        what = "allocating the work buffer";
        cb->work_bytes = want >= 16384 ? (size_t)want : WORK_BYTES;
        rc = cudaMalloc(&cb->work, cb->work_bytes);
    }
    if (rc == cudaSuccess)
        rc = cudaMalloc(&cb->blas_ws, BLAS_WS_BYTES);
    if (rc != cudaSuccess) {
        snprintf(err, err_len, "cuda:%d: %s: %s", cb->device, what, cudaGetErrorString(rc));
        return -1;
    }
    cb->pack = (char *)malloc(pack);
    cb->a_seqs = (lora_cuda_attn_seq *)malloc(ATTN_SEQS_CAP * sizeof(*cb->a_seqs));
    cb->a_tables = (int *)malloc(ATTN_TABLES_CAP * sizeof(int));
    cb->a_items = (lora_cuda_attn_item *)malloc(ATTN_ITEMS_CAP * sizeof(*cb->a_items));
    cb->a_merges = (lora_cuda_attn_merge *)malloc(ATTN_MERGES_CAP * sizeof(*cb->a_merges));
    cb->s_segs = (lora_cuda_sgmv_seg *)malloc(SGMV_SEGS_CAP * sizeof(*cb->s_segs));
    cb->s_items = (lora_cuda_sgmv_item *)malloc(SGMV_ITEMS_CAP * sizeof(*cb->s_items));
    if (!cb->pack || !cb->a_seqs || !cb->a_tables || !cb->a_items || !cb->a_merges || !cb->s_segs ||
        !cb->s_items) {
        snprintf(err, err_len, "cuda: out of memory");
        return -1;
    }
    cb->blas = lora_cuda_cublas(err, err_len);
    if (!cb->blas)
        return -1;
    cublasStatus_t st = cb->blas->create(&cb->handle);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cb->blas->set_stream(cb->handle, cb->stream);
    if (st == CUBLAS_STATUS_SUCCESS) /* its own, so that cuBLAS allocates nothing in a step */
        st = cb->blas->set_workspace(cb->handle, cb->blas_ws, BLAS_WS_BYTES);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (cb->handle)
            cb->blas->destroy(cb->handle);
        cb->handle = NULL;
        snprintf(err, err_len, "cuda:%d: cuBLAS: %s", cb->device, cb->blas->status_string(st));
        return -1;
    }
    return 0;
}

extern "C" struct lora_backend *lora_cuda_backend_new(int index, char *err, size_t err_len)
{
    char why[256];
    int n = lora_cuda_device_count(why, sizeof(why));

    if (n < 0) {
        snprintf(err, err_len, "%s", why);
        return NULL;
    }
    if (index >= n) {
        snprintf(err, err_len, "device %d does not exist (%d CUDA device%s)", index, n,
                 n == 1 ? "" : "s");
        return NULL;
    }
    cudaDeviceProp prop;
    cudaError_t rc = cudaSetDevice(index);
    if (rc == cudaSuccess)
        rc = cudaGetDeviceProperties(&prop, index);
    if (rc == cudaSuccess)
        rc = cudaFree(0); /* creates the context now, so its failure is reported here */
    if (rc != cudaSuccess) {
        snprintf(err, err_len, "device %d: %s", index, cudaGetErrorString(rc));
        return NULL;
    }
    if (prop.major < 8) {
        snprintf(err, err_len,
                 "device %d (%s) has compute capability %d.%d; this build runs on 8.0 (A100) and "
                 "newer",
                 index, prop.name, prop.major, prop.minor);
        return NULL;
    }
    struct lora_backend *be = (struct lora_backend *)calloc(1, sizeof(*be));
    struct cuda_be *cb = (struct cuda_be *)calloc(1, sizeof(*cb));
    if (!be || !cb) {
        free(be);
        free(cb);
        snprintf(err, err_len, "cuda: out of memory");
        return NULL;
    }
    cb->device = index;
    cb->n_devices = n;
    cb->next_ticket = 1;
    be->ops = &cuda_ops;
    be->kind = "cuda";
    be->ctx = cb;
    snprintf(be->device, sizeof(be->device), "cuda:%d", index);
    snprintf(be->description, sizeof(be->description), "cuda:%d (%.100s, sm_%d%d, %.1f GB)", index,
             prop.name, prop.major, prop.minor, prop.totalGlobalMem / 1e9);
    size_t free0 = 0, free1 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    if (setup(cb, err, err_len) < 0) {
        cuda_close(be);
        free(be);
        return NULL;
    }
    if (cudaMemGetInfo(&free1, &total) == cudaSuccess && free1 < free0)
        be->held_bytes = free0 - free1;
    return be;
}
