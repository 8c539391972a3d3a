/* backend_cpu: the CPU backend: backend/backend.h's table over the kernels of kernels_cpu.c,
 * matmul_cpu.c and matmul_i8_cpu.c, host memory, and the shared-memory all-reduce of
 * allreduce_shm.c as its tensor-parallel collective.
 *
 * Owns what makes the CPU a device (docs/design.md, "Backend"): buffers are host memory
 * (zero-filled with calloc, or mmapped weights wrapped in place, so a checkpoint of a dtype the
 * kernels take is never copied), upload and download are memcpy, and memory is the machine's
 * (MemAvailable). It also owns the instruction paths (chosen once, when it opens, and named in
 * be->description) and the per-thread staging memory of the matmuls that convert their
 * activations, allocated here so that no operation allocates. Why one file: the kernels stay free
 * of tensors and tables, and this file is the only place that knows both.
 */
#include "backend/cpu/backend_cpu.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/allreduce_shm.h"
#include "backend/cpu/kernels_cpu.h"

static bool cpu_supports(struct lora_backend *be, enum lora_kernel op, enum lora_dtype dtype);

/* The data of tensor t, which supports(op) must accept: passing another dtype is a bug. */
static void *data_for(struct lora_backend *be, enum lora_kernel op, const struct lora_tensor *t,
                      const char *what)
{
    if (!cpu_supports(be, op, t->dtype)) {
        fprintf(stderr, "lora: fatal: cpu backend: %s of dtype %s is not supported\n", what,
                lora_dtype_name(t->dtype));
        abort();
    }
    return lora_tensor_addr(t);
}

/* Keys and values of one cache share a dtype: the kernels take one. */
static void same_dtype(const struct lora_tensor *k_cache, const struct lora_tensor *v_cache)
{
    if (k_cache->dtype != v_cache->dtype) {
        fprintf(stderr, "lora: fatal: cpu backend: a key cache of %s with a value cache of %s\n",
                lora_dtype_name(k_cache->dtype), lora_dtype_name(v_cache->dtype));
        abort();
    }
}

static const struct lora_cpu *cpu_of(struct lora_backend *be)
{
    return be->ctx;
}

/* ---- memory ---- */

static struct lora_buffer *new_buffer(struct lora_backend *be, void *base, size_t bytes,
                                      bool wrapped, char *err, size_t err_len)
{
    struct lora_buffer *b = calloc(1, sizeof(*b));

    if (!b) {
        snprintf(err, err_len, "cpu: out of memory");
        return NULL;
    }
    *b = (struct lora_buffer){
        .be = be, .base = base, .bytes = bytes, .host = true, .wrapped = wrapped};
    return b;
}

/* Buffers of 2 MiB and more: anonymous memory aligned to 2 MiB and marked for transparent huge
 * pages. calloc's 4 KiB pages cost a TLB miss every 4 KiB of a weight streamed once per step, and
 * the kernel here backs anonymous memory with huge pages only where asked (docs/design.md, "Mapped
 * pages"). Zero-filled like calloc; the mapped length goes in b->ctx for the unmap. */
#define HUGE_PAGE ((size_t)2 << 20)

static void *map_huge(size_t bytes, size_t *mapped)
{
    size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    char *p =
        mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    if (a > p)
        munmap(p, (size_t)(a - p));
    munmap(a + len, (size_t)(p + HUGE_PAGE - a)); /* a < p + HUGE_PAGE: never empty */
    /* The whole 2 MiB pages only: the tail stays in 4 KiB pages, so a buffer costs no more
     * memory than its bytes. Best effort: 4 KiB pages still work. */
    (void)madvise(a, bytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
    *mapped = len;
    return a;
}

static struct lora_buffer *cpu_buffer_alloc(struct lora_backend *be, size_t bytes, char *err,
                                            size_t err_len)
{
    size_t mapped = 0;
    /* One byte more: a zero-byte buffer still has an address of its own. */
    void *p = bytes >= HUGE_PAGE ? map_huge(bytes, &mapped) : calloc(1, bytes + 1);

    if (!p) {
        snprintf(err, err_len, "cpu: unable to allocate %zu bytes", bytes);
        return NULL;
    }
    struct lora_buffer *b = new_buffer(be, p, bytes, false, err, err_len);
    if (!b) {
        if (mapped)
            munmap(p, mapped);
        else
            free(p);
        return NULL;
    }
    b->ctx = (void *)(uintptr_t)mapped;
    return b;
}

static struct lora_buffer *cpu_buffer_wrap(struct lora_backend *be, void *host, size_t bytes,
                                           char *err, size_t err_len)
{
    return new_buffer(be, host, bytes, true, err, err_len);
}

static void cpu_buffer_free(struct lora_backend *be, struct lora_buffer *b)
{
    if (!b)
        return;
    size_t mapped = (size_t)(uintptr_t)b->ctx;

    if (mapped)
        munmap(b->base, mapped);
    else if (!b->wrapped)
        free(b->base);
    free(b);
}

static int in_bounds(const struct lora_buffer *b, size_t offset, size_t bytes, char *err,
                     size_t err_len)
{
    if (offset <= b->bytes && bytes <= b->bytes - offset)
        return 0;
    snprintf(err, err_len, "cpu: %zu bytes at %zu lie outside a buffer of %zu", bytes, offset,
             b->bytes);
    return -1;
}

static int cpu_upload(struct lora_backend *be, struct lora_buffer *dst, size_t offset,
                      const void *src, size_t bytes, char *err, size_t err_len)
{
    if (in_bounds(dst, offset, bytes, err, err_len) < 0)
        return -1;
    if (bytes)
        memcpy((char *)dst->base + offset, src, bytes);
    return 0;
}

static int cpu_download(struct lora_backend *be, void *dst, const struct lora_buffer *src,
                        size_t offset, size_t bytes, char *err, size_t err_len)
{
    if (in_bounds(src, offset, bytes, err, err_len) < 0)
        return -1;
    if (bytes)
        memcpy(dst, (const char *)src->base + offset, bytes);
    return 0;
}

/* MemTotal and MemAvailable of /proc/meminfo, else what sysconf says. */
static int cpu_memory(struct lora_backend *be, size_t *total, size_t *available)
{
    unsigned long long t = 0, a = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");

    while (f && fgets(line, sizeof(line), f)) {
        sscanf(line, "MemTotal: %llu kB", &t);
        sscanf(line, "MemAvailable: %llu kB", &a);
    }
    if (f)
        fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    *total = t ? (size_t)t * 1024 : (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)page;
    *available = a ? (size_t)a * 1024 : (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)page;
    return *total ? 0 : -1;
}

static bool cpu_supports(struct lora_backend *be, enum lora_kernel op, enum lora_dtype dtype)
{
    bool half = dtype == LORA_DTYPE_BF16 || dtype == LORA_DTYPE_F16;

    if ((int)op < 0 || op >= LORA_KERNEL_COUNT)
        return false;
    if (dtype == LORA_DTYPE_F32)
        return true;
    switch (op) {
    case LORA_KERNEL_MATMUL:
    case LORA_KERNEL_EMBED:
        return half || dtype == LORA_DTYPE_I8;
    case LORA_KERNEL_LORA_SGMV:
    case LORA_KERNEL_KV_WRITE:
    case LORA_KERNEL_ATTENTION:
        return half;
    default: /* norms and biases are tiny: the loader converts them to F32 */
        return false;
    }
}

static size_t cpu_scratch_bytes(struct lora_backend *be, enum lora_kernel op, int max_rows,
                                int max_ctx, int max_rank)
{
    /* The matmul needs none of the caller's: its staging is the backend's (struct lora_cpu),
     * since the operation takes no scratch. */
    switch (op) {
    case LORA_KERNEL_ATTENTION: /* rows of scores per thread, one per head of a pass */
        return (size_t)lora_cpu_n_threads() * LORA_CPU_ATTN_HEADS * (size_t)max_ctx * sizeof(float);
    case LORA_KERNEL_LORA_SGMV: /* the shrink's t, one row per row of the step */
        return (size_t)max_rows * (size_t)max_rank * sizeof(float);
    default:
        return 0;
    }
}

/* ---- compute ---- */

static void cpu_matmul(struct lora_backend *be, float *y, const float *x,
                       const struct lora_tensor *w, int m, float alpha, bool accumulate)
{
    struct lora_cpu_part part = {y, data_for(be, LORA_KERNEL_MATMUL, w, "matmul weight"),
                                 (int)w->rows};

    lora_cpu_matmul(cpu_of(be), &part, 1, x, w->dtype, m, (int)w->cols, alpha, accumulate,
                    be->fast_matmul);
}

static void cpu_matmul_shared(struct lora_backend *be, int n_w, float *const *ys, const float *x,
                              const struct lora_tensor *const *ws, int m)
{
    struct lora_cpu_part parts[LORA_MATMUL_SHARED_MAX];
    int n = 0;

    for (int i = 0; i < n_w; i++) {
        /* A weight of another dtype than the first goes alone, as do those past the most a
         * call takes. */
        if (ws[i]->dtype != ws[0]->dtype || n == LORA_MATMUL_SHARED_MAX) {
            cpu_matmul(be, ys[i], x, ws[i], m, 1.0f, false);
            continue;
        }
        parts[n++] = (struct lora_cpu_part){
            ys[i], data_for(be, LORA_KERNEL_MATMUL, ws[i], "matmul weight"), (int)ws[i]->rows};
    }
    lora_cpu_matmul(cpu_of(be), parts, n, x, ws[0]->dtype, m, (int)ws[0]->cols, 1.0f, false,
                    be->fast_matmul);
}

static void cpu_add_bias(struct lora_backend *be, float *y, const struct lora_tensor *bias, int m)
{
    lora_cpu_add_bias(y, data_for(be, LORA_KERNEL_ADD_BIAS, bias, "bias"), m, (int)bias->cols);
}

static void cpu_embed(struct lora_backend *be, float *out, const struct lora_tensor *table,
                      const int *ids, int m)
{
    const void *data = data_for(be, LORA_KERNEL_EMBED, table, "embedding");

    if (table->dtype != LORA_DTYPE_I8) {
        lora_cpu_embed(out, data, table->dtype, ids, m, (int)table->cols);
        return;
    }
    /* A tied LM head quantized to int8 is the embedding too: a lookup dequantizes its row. */
    for (int i = 0; i < m; i++)
        lora_tensor_row_to_f32(LORA_DTYPE_I8, data, table->rows, table->cols, ids[i],
                               out + (size_t)i * table->cols);
}

static void cpu_rmsnorm(struct lora_backend *be, float *out, const float *x,
                        const struct lora_tensor *w, int m, float eps)
{
    lora_cpu_rmsnorm(out, x, data_for(be, LORA_KERNEL_RMSNORM, w, "norm weight"), m, (int)w->cols,
                     eps);
}

static void cpu_rope(struct lora_backend *be, float *x, const int *pos, int m, int n_heads,
                     int head_dim, float theta)
{
    lora_cpu_rope(x, pos, m, n_heads, head_dim, theta);
}

static void cpu_silu_mul(struct lora_backend *be, float *gate, const float *up, size_t n)
{
    lora_cpu_silu_mul(gate, up, n, cpu_of(be)->isa.avx512);
}

static void cpu_add(struct lora_backend *be, float *y, const float *x, size_t n)
{
    lora_cpu_add(y, x, n);
}

static void cpu_kv_write(struct lora_backend *be, const struct lora_tensor *k_cache,
                         const struct lora_tensor *v_cache, const float *k, const float *v,
                         const int *slot, int m)
{
    same_dtype(k_cache, v_cache);
    lora_cpu_kv_write(data_for(be, LORA_KERNEL_KV_WRITE, k_cache, "key cache"),
                      data_for(be, LORA_KERNEL_KV_WRITE, v_cache, "value cache"), k_cache->dtype, k,
                      v, slot, m, (int)k_cache->cols);
}

static void cpu_attention(struct lora_backend *be, float *out, const float *q,
                          const struct lora_tensor *k_cache, const struct lora_tensor *v_cache,
                          const struct lora_attn_seq *seqs, int n_seqs, int n_heads, int n_kv_heads,
                          int head_dim, int block_size, void *scratch, int max_ctx)
{
    same_dtype(k_cache, v_cache);
    lora_cpu_attention(out, q, data_for(be, LORA_KERNEL_ATTENTION, k_cache, "key cache"),
                       data_for(be, LORA_KERNEL_ATTENTION, v_cache, "value cache"), k_cache->dtype,
                       seqs, n_seqs, n_heads, n_kv_heads, head_dim, block_size, scratch, max_ctx,
                       cpu_of(be)->isa.avx512);
}

static void cpu_lora_sgmv(struct lora_backend *be, float *y, const float *x,
                          const struct lora_sgmv_seg *segs, int n_segs, int in, int out, void *tmp,
                          int max_rank)
{
    for (int s = 0; s < n_segs; s++) {
        data_for(be, LORA_KERNEL_LORA_SGMV, &segs[s].a, "LoRA A");
        data_for(be, LORA_KERNEL_LORA_SGMV, &segs[s].b_t, "LoRA B");
    }
    lora_cpu_lora_sgmv(cpu_of(be), y, x, segs, n_segs, in, out, tmp, max_rank);
}

/* ---- the collective: allreduce_shm ---- */

static struct lora_collective *cpu_collective_open(struct lora_backend *be, const char *name,
                                                   int rank, int world_size, size_t max_floats,
                                                   int timeout_ms, char *err, size_t err_len)
{
    return (struct lora_collective *)lora_allreduce_open(name, rank, world_size, max_floats,
                                                         timeout_ms, err, err_len);
}

static int cpu_allreduce_sum(struct lora_backend *be, struct lora_collective *c, float *buf,
                             size_t n)
{
    return lora_allreduce_sum(buf, n, c);
}

static void cpu_collective_close(struct lora_backend *be, struct lora_collective **c)
{
    lora_allreduce_close((struct lora_allreduce **)c);
}

static void cpu_free(struct lora_cpu *cpu)
{
    if (cpu) {
        free(cpu->stage);
        free(cpu->runs);
    }
    free(cpu);
}

static void cpu_close(struct lora_backend *be)
{
    cpu_free(be->ctx);
    be->ctx = NULL;
}

static const struct lora_backend_ops cpu_ops = {
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_wrap = cpu_buffer_wrap,
    .buffer_free = cpu_buffer_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .memory = cpu_memory,
    .supports = cpu_supports,
    .scratch_bytes = cpu_scratch_bytes,
    .matmul = cpu_matmul,
    .matmul_shared = cpu_matmul_shared,
    .add_bias = cpu_add_bias,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .lora_sgmv = cpu_lora_sgmv,
    .collective_open = cpu_collective_open,
    .allreduce_sum = cpu_allreduce_sum,
    .collective_close = cpu_collective_close,
    .close = cpu_close,
};

struct lora_backend *lora_cpu_backend_new(char *err, size_t err_len)
{
    struct lora_backend *be = calloc(1, sizeof(*be));
    struct lora_cpu *cpu = calloc(1, sizeof(*cpu));

    if (cpu) {
        cpu->isa = lora_cpu_isa_detect();
        cpu->n_threads = omp_get_max_threads();
        cpu->stage = aligned_alloc(64, (size_t)cpu->n_threads * LORA_CPU_STAGE_BYTES);
        cpu->runs = aligned_alloc(64, (size_t)cpu->n_threads * sizeof(*cpu->runs));
    }
    if (!be || !cpu || !cpu->stage || !cpu->runs) {
        snprintf(err, err_len, "cpu: out of memory");
        cpu_free(cpu);
        free(be);
        return NULL;
    }
    be->ops = &cpu_ops;
    be->kind = "cpu";
    be->ctx = cpu;
    snprintf(be->device, sizeof(be->device), "cpu");
    /* The paths, one per backend (matmul_cpu.c, matmul_i8_cpu.c): without AVX-512, AVX2 for
     * every dtype; with it, the bf16 dot and int8 instructions where the machine has them. */
    const struct lora_cpu_isa *isa = &cpu->isa;
    snprintf(be->description, sizeof(be->description), "cpu (%s%s%s%s, %d thread%s)",
             isa->avx512 ? "AVX-512" : "AVX2", isa->bf16 ? ", BF16 dot" : "",
             isa->amx ? ", AMX bf16" : "", isa->vnni ? ", VNNI int8" : "", cpu->n_threads,
             cpu->n_threads == 1 ? "" : "s");
    return be;
}
