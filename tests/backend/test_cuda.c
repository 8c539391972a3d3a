/* test_cuda: the CUDA backend (backend/cuda) against the double-precision twins of backend/ref,
 * operation by operation, and the whole forward pass of lib/runtime against the CPU backend.
 *
 * It is built twice. build/<dir>/tests/backend/test_cuda links the real backend (CUDA builds) and
 * runs on a GPU; without one, every test is a counted skip naming why ("# SKIP no CUDA device:
 * ..."). test_cuda_emu links the same backend sources compiled over backend/cuda/emu, a CPU
 * emulation of CUDA and cuBLAS, and runs everything but the NCCL all-reduce on any machine.
 *
 * What is checked, and within what:
 *   - matmul: F32, BF16 and F16 weights, exact and fast modes, m from 1 to 70, odd n and k, plain
 *     and accumulating with alpha, rows past the work buffer (several chunks), F16 rows beyond
 *     F16's range: within 1e-5 (1 + mag) of the twin (mag: the sum of |terms|); fast mode against
 *     the twin of the activations rounded as the backend rounds them. Batch invariance of cuBLAS
 *     is a tolerance (the same bound, row alone against row in the batch), its bit differences
 *     reported. I8 is refused by supports(), and a matmul given one fails the next download.
 *   - embed, add_bias, add, kv_write: exact; rmsnorm, rope, silu_mul: 1e-5 (1 + |want|).
 *   - attention: F32, BF16, F16 caches; block sizes 1, 3, 5, 16; grouped-query groups of 1 to 16
 *     (beyond the 8 heads a block takes); head_dim 6 to 256; prefill chunks, decodes, contexts
 *     across the 512-position parts (1100 positions: three parts merged); a work buffer so small
 *     that the partial results take several launches: 1e-5 (1 + |want|). Batch invariance bit for
 *     bit: each sequence alone gives the batch's bits.
 *   - lora_sgmv: F32, BF16, F16 slots, ranks 1 to 64 mixed in one call, segments of 1 to 40 rows
 *     (several items), rows outside every segment untouched, x untouched: 1e-5 (1 + mag); each
 *     segment alone gives the batch's bits.
 *   - upload_async, upload_done and pinned memory: the copy waits for earlier work, lands whole.
 *   - the forward pass of a synthetic model (float32 and bfloat16 weights, float32 and bfloat16
 *     KV cache and slots, block size 5, four adapters of ranks 1, 4, 16 and 64 and the base model
 *     in one batch, chunked prefill mixed with decodes): every logit within 2e-3 (1 + |cpu|) of
 *     the CPU backend's, step after step; a sequence's logits alone and in the batch within the
 *     same bound.
 *   - allreduce (needs two devices: NCCL wants one per rank): a second rank in a child process,
 *     both sums equal to the twin's bits.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/ref/ref.h"
#include "base/fs.h"
#include "runtime/adapter.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"
#include "tests/unit/check.h"

#define TEST_RANDOM_SEED 0x6a09e667f3bcc908ULL
#include "tests/common/test_random.h"

#define REL_TOL        1e-5
#define FORWARD_TOL    2e-3
#define FORWARD_KV_TOL 0.25

static struct lora_backend *be;
static const struct lora_backend_ops *k_;
static enum lora_dtype dt; /* the dtype of the case that runs */

static void fill_random(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_uniform();
}

static void bail(const char *what, const char *err)
{
    printf("Bail out! %s: %s\n", what, err);
    exit(1);
}

/* Index of the first got[i] farther than rel * (1 + scale) from want[i] (scale: mag[i], or
 * |want[i]| when mag is NULL; NaN is always far), or -1. */
static long first_far(const float *got, const double *want, const double *mag, size_t n, double rel)
{
    for (size_t i = 0; i < n; i++) {
        double scale = mag ? mag[i] : fabs(want[i]);
        if (!(fabs((double)got[i] - want[i]) <= rel * (1.0 + scale)))
            return (long)i;
    }
    return -1;
}

static void check_far(const char *what, const float *got, const double *want, const double *mag,
                      size_t n)
{
    long bad = first_far(got, want, mag, n, REL_TOL);

    if (bad >= 0) {
        printf("# %s: element %ld\n", what, bad);
        CHECK_NEAR(got[bad], want[bad], REL_TOL * (1.0 + (mag ? mag[bad] : fabs(want[bad]))));
    }
}

static long n_differ(const float *a, const float *b, size_t n)
{
    long d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* ---- weights and activations in the backend's memory ---- */

/* Encodes src (rows, cols) into dtype at dst (F32, BF16, F16; I8 with a scale per row). */
static void encode(enum lora_dtype dtype, const float *src, int64_t rows, int64_t cols, void *dst)
{
    size_t n = (size_t)(rows * cols);
    char *d = dst;

    if (dtype == LORA_DTYPE_BF16 || dtype == LORA_DTYPE_F16) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h =
                dtype == LORA_DTYPE_BF16 ? lora_f32_to_bf16(src[i]) : lora_f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
    } else if (dtype == LORA_DTYPE_I8) {
        lora_quantize_i8(LORA_DTYPE_F32, src, rows, cols, dst);
    } else {
        memcpy(dst, src, n * sizeof(float));
    }
}

struct weight {
    void *host;
    struct lora_ref_w ref;
    struct lora_buffer *buf;
    struct lora_tensor t;
};

static struct weight weight_new(const float *src, int64_t rows, int64_t cols)
{
    struct weight w = {0};
    size_t bytes = lora_tensor_bytes(dt, rows, cols);
    char err[256];

    w.host = xmalloc(bytes);
    encode(dt, src, rows, cols, w.host);
    w.ref = (struct lora_ref_w){dt, w.host, rows, cols};
    w.buf = k_->buffer_alloc(be, bytes, err, sizeof(err));
    if (!w.buf || k_->upload(be, w.buf, 0, w.host, bytes, err, sizeof(err)) < 0)
        bail("weight", err);
    w.t = (struct lora_tensor){w.buf, 0, dt, rows, cols};
    return w;
}

static struct weight weight_random(int64_t rows, int64_t cols, float scale)
{
    float *src = new_floats((size_t)(rows * cols));

    fill_random(src, (size_t)(rows * cols), scale);
    struct weight w = weight_new(src, rows, cols);
    free(src);
    return w;
}

static void weight_free(struct weight *w)
{
    k_->buffer_free(be, w->buf);
    free(w->host);
    memset(w, 0, sizeof(*w));
}

struct arena {
    struct lora_buffer *buf;
    size_t used;
};

static struct arena arena_new(size_t bytes)
{
    char err[256];
    struct arena a = {k_->buffer_alloc(be, bytes + 4096, err, sizeof(err)), 0};

    if (!a.buf)
        bail("arena", err);
    return a;
}

static float *dev(struct arena *a, size_t n)
{
    size_t off = (a->used + 63) / 64 * 64;

    a->used = off + (n ? n : 1) * sizeof(float);
    if (a->used > a->buf->bytes)
        bail("arena", "too small");
    return (float *)((char *)a->buf->base + off);
}

static size_t off_of(const struct arena *a, const void *p)
{
    return (size_t)((const char *)p - (const char *)a->buf->base);
}

static void put(struct arena *a, float *d, const float *h, size_t n)
{
    char err[256];

    if (k_->upload(be, a->buf, off_of(a, d), h, n * sizeof(float), err, sizeof(err)) < 0)
        bail("upload", err);
}

static void get(const struct arena *a, float *h, const float *d, size_t n)
{
    char err[256];

    if (k_->download(be, h, a->buf, off_of(a, d), n * sizeof(float), err, sizeof(err)) < 0)
        bail("download", err);
}

static void arena_free(struct arena *a)
{
    k_->buffer_free(be, a->buf);
}

/* ---- matmul ---- */

/* x (m, k) as the backend rounds it for a 16-bit weight in fast mode: F16 rows reaching 2^14
 * scaled below it by a power of two, rounded, scaled back. */
static void round_fast(float *x, int m, int k, enum lora_dtype d)
{
    for (int i = 0; i < m; i++) {
        float *r = x + (size_t)i * k, mx = 0;
        int e = 0;
        for (int c = 0; c < k; c++)
            mx = fmaxf(mx, fabsf(r[c]));
        if (d == LORA_DTYPE_F16 && mx >= 16384.0f) {
            frexpf(mx, &e);
            e -= 14;
        }
        for (int c = 0; c < k; c++) {
            float v = ldexpf(r[c], -e), back;
            uint16_t h = d == LORA_DTYPE_BF16 ? lora_f32_to_bf16(v) : lora_f32_to_f16(v);
            lora_dtype_to_f32(d, &h, &back, 1);
            r[c] = ldexpf(back, e);
        }
    }
}

static void matmul_case(int m, int n, int k, float x_scale, bool fast)
{
    size_t mn = (size_t)m * n;
    struct weight w = weight_random(n, k, 1.0f);
    float *x = new_floats((size_t)m * k), *xr = new_floats((size_t)m * k);
    float *y0 = new_floats(mn), *y = new_floats(mn), *alone = new_floats(n);
    double *dot = new_doubles(mn), *absdot = new_doubles(mn);
    double *want = new_doubles(mn), *mag = new_doubles(mn);
    struct arena a = arena_new(((size_t)m * k + 2 * mn + n) * sizeof(float) + 256);
    float *dx = dev(&a, (size_t)m * k), *dy = dev(&a, mn), *d1 = dev(&a, n);
    char what[128];

    fill_random(x, (size_t)m * k, x_scale);
    fill_random(y0, mn, 2.0f);
    memcpy(xr, x, (size_t)m * k * sizeof(float));
    if (fast && dt != LORA_DTYPE_F32)
        round_fast(xr, m, k, dt);
    put(&a, dx, x, (size_t)m * k);
    lora_ref_matmul(dot, absdot, xr, &w.ref, m);
    be->fast_matmul = fast;
    for (int mode = 0; mode < 2; mode++) { /* plain; accumulate with alpha */
        bool acc = mode == 1;
        float alpha = acc ? -0.75f : 1.0f;
        put(&a, dy, y0, mn);
        k_->matmul(be, dy, dx, &w.t, m, alpha, acc);
        get(&a, y, dy, mn);
        for (size_t i = 0; i < mn; i++) {
            want[i] = alpha * dot[i] + (acc ? y0[i] : 0.0);
            mag[i] = fabs(alpha) * absdot[i] + (acc ? fabs(y0[i]) : 0.0);
        }
        snprintf(what, sizeof(what), "%s m=%d n=%d k=%d x*%g acc=%d fast=%d", lora_dtype_name(dt),
                 m, n, k, (double)x_scale, acc, fast);
        check_far(what, y, want, mag, mn);
    }
    /* Batch invariance, to cuBLAS's rounding: each row alone against the batch's. */
    put(&a, dy, y0, mn);
    k_->matmul(be, dy, dx, &w.t, m, 1.0f, false);
    get(&a, y, dy, mn);
    long bits = 0;
    for (int r = 0; r < m; r++) {
        k_->matmul(be, d1, dx + (size_t)r * k, &w.t, 1, 1.0f, false);
        get(&a, alone, d1, n);
        bits += n_differ(alone, y + (size_t)r * n, n) > 0;
        for (int j = 0; j < n; j++) {
            want[j] = y[(size_t)r * n + j];
            mag[j] = absdot[(size_t)r * n + j];
        }
        snprintf(what, sizeof(what), "%s m=%d n=%d k=%d: row %d alone", lora_dtype_name(dt), m, n,
                 k, r);
        check_far(what, alone, want, mag, n);
    }
    if (bits)
        printf("# %s m=%d n=%d k=%d fast=%d: %ld of %d rows alone differ in bits (within "
               "tolerance)\n",
               lora_dtype_name(dt), m, n, k, fast, bits, m);
    be->fast_matmul = false;
    arena_free(&a);
    weight_free(&w);
    free(x);
    free(xr);
    free(y0);
    free(y);
    free(alone);
    free(dot);
    free(absdot);
    free(want);
    free(mag);
}

static const int matmul_shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {2, 4, 8},
                                       {5, 33, 9},    {17, 129, 100}, {64, 300, 257},
                                       {70, 64, 897}, {1, 257, 1537}}; /* m n k */

static void matmul_all(bool fast)
{
    for (size_t i = 0; i < sizeof(matmul_shapes) / sizeof(matmul_shapes[0]); i++)
        matmul_case(matmul_shapes[i][0], matmul_shapes[i][1], matmul_shapes[i][2], 1.0f, fast);
    /* Activations beyond F16's range in one row (the row scale), moderate in the others. */
    matmul_case(4, 37, 65, 1e5f, fast);
}

static void test_matmul_f32(void)
{
    dt = LORA_DTYPE_F32;
    matmul_all(false);
}

static void test_matmul_bf16_exact(void)
{
    dt = LORA_DTYPE_BF16;
    matmul_all(false);
}

static void test_matmul_bf16_fast(void)
{
    dt = LORA_DTYPE_BF16;
    matmul_all(true);
}

static void test_matmul_f16_exact(void)
{
    dt = LORA_DTYPE_F16;
    matmul_all(false);
}

static void test_matmul_f16_fast(void)
{
    dt = LORA_DTYPE_F16;
    matmul_all(true);
}

/* What supports() answers, exactly as backend_cuda.cu states it. */
static void test_supports(void)
{
    static const enum lora_kernel sixteen[] = {LORA_KERNEL_MATMUL, LORA_KERNEL_EMBED,
                                               LORA_KERNEL_KV_WRITE, LORA_KERNEL_ATTENTION,
                                               LORA_KERNEL_LORA_SGMV};
    static const enum lora_kernel f32_only[] = {LORA_KERNEL_ADD_BIAS, LORA_KERNEL_RMSNORM,
                                                LORA_KERNEL_ROPE, LORA_KERNEL_SILU_MUL,
                                                LORA_KERNEL_ADD};

    for (size_t i = 0; i < sizeof(sixteen) / sizeof(sixteen[0]); i++) {
        CHECK(k_->supports(be, sixteen[i], LORA_DTYPE_F32));
        CHECK(k_->supports(be, sixteen[i], LORA_DTYPE_BF16));
        CHECK(k_->supports(be, sixteen[i], LORA_DTYPE_F16));
        CHECK(!k_->supports(be, sixteen[i], LORA_DTYPE_I8));
    }
    for (size_t i = 0; i < sizeof(f32_only) / sizeof(f32_only[0]); i++) {
        CHECK(k_->supports(be, f32_only[i], LORA_DTYPE_F32));
        CHECK(!k_->supports(be, f32_only[i], LORA_DTYPE_BF16));
        CHECK(!k_->supports(be, f32_only[i], LORA_DTYPE_I8));
    }
    CHECK(!k_->supports(be, LORA_KERNEL_ALLREDUCE, LORA_DTYPE_BF16));
    CHECK(k_->buffer_wrap == NULL);
    CHECK(k_->upload_async && k_->upload_done && k_->host_alloc_pinned && k_->host_free_pinned);
    CHECK(k_->scratch_bytes(be, LORA_KERNEL_LORA_SGMV, 10, 0, 16) == 10 * 16 * sizeof(float));
    CHECK(strncmp(be->description, "cuda:0 (", 8) == 0);
    size_t total = 0, avail = 0;
    CHECK(k_->memory(be, &total, &avail) == 0 && total > 0 && avail <= total);
}

/* ---- the element-wise operations ---- */

static void test_add_bias(void)
{
    static const int shapes[][2] = {{1, 1}, {5, 33}, {7, 257}};

    dt = LORA_DTYPE_F32;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int m = shapes[si][0], n = shapes[si][1];
        size_t mn = (size_t)m * n;
        struct weight b = weight_random(1, n, 1.0f);
        float *y0 = new_floats(mn), *y = new_floats(mn);
        double *want = new_doubles(mn);
        struct arena a = arena_new(mn * sizeof(float));
        float *dy = dev(&a, mn);
        int n_bad = 0;

        fill_random(y0, mn, 1.0f);
        put(&a, dy, y0, mn);
        k_->add_bias(be, dy, &b.t, m);
        get(&a, y, dy, mn);
        lora_ref_add_bias(want, y0, &b.ref, m);
        for (size_t i = 0; i < mn; i++)
            n_bad += y[i] != (float)want[i];
        CHECK(n_bad == 0);
        arena_free(&a);
        weight_free(&b);
        free(y0);
        free(y);
        free(want);
    }
}

static void test_embed(void)
{
    static const enum lora_dtype dts[] = {LORA_DTYPE_F32, LORA_DTYPE_BF16, LORA_DTYPE_F16};
    static const int shapes[][2] = {{10, 13}, {3, 1}, {40, 257}}; /* vocab, dim */
    enum { M = 7 };

    for (size_t di = 0; di < 3; di++) {
        dt = dts[di];
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            int vocab = shapes[si][0], dim = shapes[si][1], ids[M];
            for (int i = 0; i < M; i++)
                ids[i] = (int)(rng_next() % (uint64_t)vocab);
            ids[M - 1] = ids[0];
            struct weight t = weight_random(vocab, dim, 1.0f);
            float *out = new_floats((size_t)M * dim);
            double *want = new_doubles((size_t)M * dim);
            struct arena a = arena_new((size_t)M * dim * sizeof(float));
            float *d = dev(&a, (size_t)M * dim);
            int n_bad = 0;

            k_->embed(be, d, &t.t, ids, M);
            get(&a, out, d, (size_t)M * dim);
            lora_ref_embed(want, &t.ref, ids, M);
            for (size_t i = 0; i < (size_t)M * dim; i++)
                n_bad += out[i] != (float)want[i];
            if (n_bad)
                printf("# embed %s %dx%d: %d wrong\n", lora_dtype_name(dt), vocab, dim, n_bad);
            CHECK(n_bad == 0);
            arena_free(&a);
            weight_free(&t);
            free(out);
            free(want);
        }
    }
}

static void test_rmsnorm(void)
{
    static const int dims[] = {1, 7, 64, 897, 4096};
    static const int ms[] = {1, 6};
    const float eps = 1e-6f;

    dt = LORA_DTYPE_F32;
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        for (size_t mi = 0; mi < 2; mi++) {
            int dim = dims[di], m = ms[mi];
            size_t total = (size_t)m * dim;
            struct weight w = weight_random(1, dim, 2.0f);
            float *x = new_floats(total), *out = new_floats(total);
            double *want = new_doubles(total);
            struct arena a = arena_new(2 * total * sizeof(float) + 128);
            float *dx = dev(&a, total), *dout = dev(&a, total);
            char what[64];

            fill_random(x, total, 3.0f);
            if (m > 1)
                memset(x + (size_t)(m - 1) * dim, 0, (size_t)dim * sizeof(float));
            lora_ref_rmsnorm(want, x, &w.ref, m, eps);
            put(&a, dx, x, total);
            k_->rmsnorm(be, dout, dx, &w.t, m, eps);
            get(&a, out, dout, total);
            snprintf(what, sizeof(what), "rmsnorm m=%d dim=%d", m, dim);
            check_far(what, out, want, NULL, total);
            k_->rmsnorm(be, dx, dx, &w.t, m, eps);
            get(&a, out, dx, total);
            snprintf(what, sizeof(what), "rmsnorm m=%d dim=%d in place", m, dim);
            check_far(what, out, want, NULL, total);
            arena_free(&a);
            weight_free(&w);
            free(x);
            free(out);
            free(want);
        }
    }
}

static void test_rope(void)
{
    static const int configs[][2] = {{1, 2}, {4, 16}, {3, 128}, {2, 6}, {2, 7}};
    static const int pos[] = {0, 1, 2, 17, 1000, 10000, 32767, 131071};
    const int m = sizeof(pos) / sizeof(pos[0]);

    for (size_t ci = 0; ci < sizeof(configs) / sizeof(configs[0]); ci++) {
        int n_heads = configs[ci][0], head_dim = configs[ci][1], dim = n_heads * head_dim;
        size_t total = (size_t)m * dim;
        float *x = new_floats(total), *got = new_floats(total);
        double *want = new_doubles(total);
        struct arena a = arena_new(total * sizeof(float));
        float *d = dev(&a, total);
        char what[64];

        fill_random(x, total, 2.0f);
        for (int ti = 0; ti < 2; ti++) {
            float theta = ti ? 1000000.0f : 10000.0f;
            lora_ref_rope(want, x, pos, m, n_heads, head_dim, theta);
            put(&a, d, x, total);
            k_->rope(be, d, pos, m, n_heads, head_dim, theta);
            get(&a, got, d, total);
            snprintf(what, sizeof(what), "rope heads=%d head_dim=%d theta=%g", n_heads, head_dim,
                     (double)theta);
            check_far(what, got, want, NULL, total);
            CHECK(memcmp(got, x, (size_t)dim * sizeof(float)) == 0); /* position 0 */
        }
        arena_free(&a);
        free(x);
        free(got);
        free(want);
    }
}

static void test_silu_mul_add(void)
{
    static const size_t sizes[] = {1, 5, 20001, 300000};

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *g = new_floats(n), *u = new_floats(n), *got = new_floats(n);
        double *want = new_doubles(n);
        struct arena a = arena_new(2 * n * sizeof(float) + 128);
        float *dg = dev(&a, n), *du = dev(&a, n);
        int n_bad = 0;

        fill_random(g, n, 12.0f);
        fill_random(u, n, 3.0f);
        g[0] = n > 1 ? -100.0f : 0.0f;
        lora_ref_silu_mul(want, g, u, n);
        put(&a, dg, g, n);
        put(&a, du, u, n);
        k_->silu_mul(be, dg, du, n);
        get(&a, got, dg, n);
        check_far("silu_mul", got, want, NULL, n);
        fill_random(g, n, 1.0f);
        put(&a, dg, g, n);
        lora_ref_add(want, g, u, n);
        k_->add(be, dg, du, n);
        get(&a, got, dg, n);
        for (size_t i = 0; i < n; i++)
            n_bad += got[i] != (float)want[i];
        CHECK(n_bad == 0);
        arena_free(&a);
        free(g);
        free(u);
        free(got);
        free(want);
    }
}

/* ---- the KV cache ---- */

static struct lora_tensor cache_new(int rows, int kv_dim)
{
    char err[256];
    struct lora_buffer *b =
        k_->buffer_alloc(be, lora_tensor_bytes(dt, rows, kv_dim), err, sizeof(err));

    if (!b)
        bail("cache", err);
    return (struct lora_tensor){b, 0, dt, rows, kv_dim};
}

/* The whole cache c, downloaded and converted to float. */
static void cache_rows(const struct lora_tensor *c, float *dst)
{
    size_t bytes = lora_tensor_bytes(dt, c->rows, c->cols);
    char err[256], *host = xmalloc(bytes);

    if (k_->download(be, host, c->buf, c->offset, bytes, err, sizeof(err)) < 0)
        bail("download", err);
    for (int64_t r = 0; r < c->rows; r++)
        lora_tensor_row_to_f32(dt, host, c->rows, c->cols, r, dst + r * c->cols);
    free(host);
}

/* Rounds (rows, cols) floats through dt and back. */
static void round_through(float *x, int rows, int cols)
{
    void *tmp = xmalloc(lora_tensor_bytes(dt, rows, cols));

    encode(dt, x, rows, cols, tmp);
    for (int r = 0; r < rows; r++)
        lora_tensor_row_to_f32(dt, tmp, rows, cols, r, x + (size_t)r * cols);
    free(tmp);
}

static const enum lora_dtype cache_dtypes[] = {LORA_DTYPE_F32, LORA_DTYPE_BF16, LORA_DTYPE_F16};

static void test_kv_write(void)
{
    static const int kv_dims[] = {1, 16, 37};
    enum { ROWS = 24, M = 9 };

    for (size_t di = 0; di < 3; di++) {
        dt = cache_dtypes[di];
        for (size_t ki = 0; ki < sizeof(kv_dims) / sizeof(kv_dims[0]); ki++) {
            int kv_dim = kv_dims[ki];
            struct lora_tensor kc = cache_new(ROWS, kv_dim), vc = cache_new(ROWS, kv_dim);
            float *k = new_floats((size_t)M * kv_dim), *v = new_floats((size_t)M * kv_dim);
            float *rows = new_floats((size_t)ROWS * kv_dim);
            struct arena a = arena_new(2 * (size_t)M * kv_dim * sizeof(float) + 128);
            float *dk = dev(&a, (size_t)M * kv_dim), *dv = dev(&a, (size_t)M * kv_dim);
            int slot[M], n_bad = 0, used[ROWS] = {0};

            for (int i = 0; i < M; i++) {
                slot[i] = (i * 7 + 3) % ROWS;
                used[slot[i]] = 1;
            }
            fill_random(k, (size_t)M * kv_dim, 1.0f);
            fill_random(v, (size_t)M * kv_dim, 1.0f);
            /* Not pre-rounded: the cache must round to nearest even, as the CPU's converter. */
            put(&a, dk, k, (size_t)M * kv_dim);
            put(&a, dv, v, (size_t)M * kv_dim);
            k_->kv_write(be, &kc, &vc, dk, dv, slot, M);
            round_through(k, M, kv_dim);
            round_through(v, M, kv_dim);
            cache_rows(&kc, rows);
            for (int i = 0; i < M; i++)
                n_bad += memcmp(rows + (size_t)slot[i] * kv_dim, k + (size_t)i * kv_dim,
                                (size_t)kv_dim * sizeof(float)) != 0;
            for (int r = 0; r < ROWS; r++)
                for (int c = 0; c < kv_dim && !used[r]; c++)
                    n_bad += rows[(size_t)r * kv_dim + c] != 0.0f;
            cache_rows(&vc, rows);
            for (int i = 0; i < M; i++)
                n_bad += memcmp(rows + (size_t)slot[i] * kv_dim, v + (size_t)i * kv_dim,
                                (size_t)kv_dim * sizeof(float)) != 0;
            if (n_bad)
                printf("# kv_write %s kv_dim=%d: %d wrong\n", lora_dtype_name(dt), kv_dim, n_bad);
            CHECK(n_bad == 0);
            arena_free(&a);
            k_->buffer_free(be, kc.buf);
            k_->buffer_free(be, vc.buf);
            free(k);
            free(v);
            free(rows);
        }
    }
}

/* ---- attention ---- */

struct attn_setup {
    int block_size, n_heads, n_kv_heads, head_dim;
    const int (*specs)[2]; /* {pos, n_rows} */
    int n_seqs;
};

static const int short_specs[][2] = {{0, 9}, {7, 5}, {20, 1}, {0, 1}, {16, 16}, {33, 1}};
static const int long_specs[][2] = {{510, 4}, {1023, 2}, {1100, 1}, {3, 2}};
static const int prefill_specs[][2] = {{1000, 40}, {600, 3}};

/* Runs one attention over caches written through kv_write and checks it against the twin; then
 * each sequence alone, which must give the batch's bits. */
static void attention_case(const struct attn_setup *st)
{
    int n_seqs = st->n_seqs, bs = st->block_size, hd = st->head_dim;
    int kv_dim = st->n_kv_heads * hd, q_dim = st->n_heads * hd;
    int group = st->n_heads / st->n_kv_heads;
    int n_rows = 0, max_ctx = 0, n_blocks = 2, first_row[8], first_block[8];
    int *tables[8];
    float *kseq[8], *vseq[8];

    for (int s = 0; s < n_seqs; s++) {
        int ctx = st->specs[s][0] + st->specs[s][1];
        first_row[s] = n_rows;
        first_block[s] = n_blocks;
        n_rows += st->specs[s][1];
        n_blocks += (ctx + bs - 1) / bs;
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
    }
    struct lora_tensor kc = cache_new(n_blocks * bs, kv_dim), vc = cache_new(n_blocks * bs, kv_dim);
    struct lora_attn_seq seqs[8];
    size_t n_out = (size_t)n_rows * q_dim;
    size_t scratch = k_->scratch_bytes(be, LORA_KERNEL_ATTENTION, n_rows, max_ctx, 0);
    struct arena a =
        arena_new((3 * n_out + 2 * (size_t)max_ctx * kv_dim) * sizeof(float) + scratch + 512);
    float *dq = dev(&a, n_out), *dout = dev(&a, n_out), *dalone = dev(&a, n_out);
    float *dk = dev(&a, (size_t)max_ctx * kv_dim), *dv = dev(&a, (size_t)max_ctx * kv_dim);
    void *dscratch = dev(&a, scratch / sizeof(float) + 1);
    float *q = new_floats(n_out), *out = new_floats(n_out), *alone = new_floats(n_out);
    double *want = new_doubles(n_out), *scores = new_doubles((size_t)max_ctx);
    int *slots = xmalloc(sizeof(int) * (size_t)max_ctx);

    for (int s = 0; s < n_seqs; s++) {
        int ctx = st->specs[s][0] + st->specs[s][1], nb = (ctx + bs - 1) / bs;
        tables[s] = xmalloc(sizeof(int) * (size_t)nb);
        for (int b = 0; b < nb; b++) /* reversed, after the blocks of the sequences before */
            tables[s][b] = first_block[s] + nb - 1 - b;
        kseq[s] = new_floats((size_t)ctx * kv_dim);
        vseq[s] = new_floats((size_t)ctx * kv_dim);
        fill_random(kseq[s], (size_t)ctx * kv_dim, 1.0f);
        fill_random(vseq[s], (size_t)ctx * kv_dim, 1.0f);
        round_through(kseq[s], ctx, kv_dim);
        round_through(vseq[s], ctx, kv_dim);
        for (int p = 0; p < ctx; p++)
            slots[p] = tables[s][p / bs] * bs + p % bs;
        put(&a, dk, kseq[s], (size_t)ctx * kv_dim);
        put(&a, dv, vseq[s], (size_t)ctx * kv_dim);
        k_->kv_write(be, &kc, &vc, dk, dv, slots, ctx);
        seqs[s] = (struct lora_attn_seq){first_row[s], st->specs[s][1], st->specs[s][0], tables[s]};
    }
    fill_random(q, n_out, 2.0f);
    put(&a, dq, q, n_out);
    k_->attention(be, dout, dq, &kc, &vc, seqs, n_seqs, st->n_heads, st->n_kv_heads, hd, bs,
                  dscratch, max_ctx);
    get(&a, out, dout, n_out);
    for (int s = 0; s < n_seqs; s++)
        for (int r = 0; r < st->specs[s][1]; r++)
            for (int h = 0; h < st->n_heads; h++) {
                size_t off = (size_t)(first_row[s] + r) * q_dim + (size_t)h * hd;
                lora_ref_attend(want + off, q + off, kseq[s], vseq[s], st->specs[s][0] + r,
                                (h / group) * hd, kv_dim, hd, scores);
            }
    char what[128];
    snprintf(what, sizeof(what), "attention %s block_size=%d heads=%d/%d head_dim=%d",
             lora_dtype_name(dt), bs, st->n_heads, st->n_kv_heads, hd);
    check_far(what, out, want, NULL, n_out);
    /* Each sequence alone, at its own rows: the batch's bits. */
    long bits = 0;
    for (int s = 0; s < n_seqs; s++) {
        k_->attention(be, dalone, dq, &kc, &vc, &seqs[s], 1, st->n_heads, st->n_kv_heads, hd, bs,
                      dscratch, max_ctx);
        get(&a, alone, dalone, n_out);
        size_t o = (size_t)first_row[s] * q_dim, n = (size_t)st->specs[s][1] * q_dim;
        bits += n_differ(alone + o, out + o, n);
    }
    if (bits)
        printf("# %s: %ld values alone differ from the batch's\n", what, bits);
    CHECK(bits == 0);
    for (int s = 0; s < n_seqs; s++) {
        free(tables[s]);
        free(kseq[s]);
        free(vseq[s]);
    }
    arena_free(&a);
    k_->buffer_free(be, kc.buf);
    k_->buffer_free(be, vc.buf);
    free(q);
    free(out);
    free(alone);
    free(want);
    free(scores);
    free(slots);
}

#define SPECS(x) x, (int)(sizeof(x) / sizeof(x[0]))

static void attention_all(void)
{
    const struct attn_setup setups[] = {
        {16, 4, 2, 16, SPECS(short_specs)},  {5, 4, 1, 6, SPECS(short_specs)},
        {1, 3, 3, 8, SPECS(short_specs)},    {7, 14, 2, 64, SPECS(short_specs)},
        {16, 16, 1, 32, SPECS(short_specs)}, {3, 2, 2, 256, SPECS(short_specs)},
        {16, 4, 2, 16, SPECS(long_specs)},
    };
    for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++)
        attention_case(&setups[i]);
}

static void test_attention_f32(void)
{
    dt = LORA_DTYPE_F32;
    attention_all();
}

static void test_attention_bf16(void)
{
    dt = LORA_DTYPE_BF16;
    attention_all();
}

static void test_attention_f16(void)
{
    dt = LORA_DTYPE_F16;
    attention_all();
}

/* ---- multi-LoRA ---- */

static void sgmv_case(int in, int out)
{
    enum { ROWS = 80, N_SEGS = 8, MAX_RANK = 64 };
    /* {row, n_rows, rank}, not in row order; rows 3, 4, 9, 13, 79 belong to no segment. */
    static const int layout[N_SEGS][3] = {
        {5, 4, 16}, {0, 3, 4},    {10, 1, 1},  {14, 2, 64},
        {11, 2, 3}, {16, 17, 33}, {33, 40, 7}, {73, 6, 2},
    };
    static const float scales[N_SEGS] = {0.5f, 2.0f, -1.25f, 0.125f, 3.0f, 1.0f, -0.5f, 0.25f};
    struct lora_sgmv_seg segs[N_SEGS];
    struct weight wa[N_SEGS], wb[N_SEGS];
    size_t nx = (size_t)ROWS * in, ny = (size_t)ROWS * out;
    float *x = new_floats(nx), *y0 = new_floats(ny), *y = new_floats(ny), *x_after = new_floats(nx);
    float *alone = new_floats(ny);
    double *want = new_doubles((size_t)out), *mag = new_doubles((size_t)out);
    size_t scratch = k_->scratch_bytes(be, LORA_KERNEL_LORA_SGMV, ROWS, 0, MAX_RANK);
    struct arena a = arena_new((nx + 2 * ny) * sizeof(float) + scratch + 256);
    float *dx = dev(&a, nx), *dy = dev(&a, ny), *dy1 = dev(&a, ny);
    void *dtmp = dev(&a, scratch / sizeof(float) + 1);
    bool in_seg[ROWS] = {false};
    char what[128];

    fill_random(x, nx, 1.0f);
    fill_random(y0, ny, 1.0f);
    for (int s = 0; s < N_SEGS; s++) {
        wa[s] = weight_random(MAX_RANK, in, 1.0f);
        wb[s] = weight_random(MAX_RANK, out, 1.0f);
        segs[s] = (struct lora_sgmv_seg){layout[s][0], layout[s][1], layout[s][2],
                                         scales[s],    wa[s].t,      wb[s].t};
        for (int r = 0; r < layout[s][1]; r++)
            in_seg[layout[s][0] + r] = true;
    }
    put(&a, dx, x, nx);
    put(&a, dy, y0, ny);
    k_->lora_sgmv(be, dy, dx, segs, N_SEGS, in, out, dtmp, MAX_RANK);
    get(&a, y, dy, ny);
    get(&a, x_after, dx, nx);
    for (int s = 0; s < N_SEGS; s++) {
        for (int r = 0; r < layout[s][1]; r++) {
            size_t row = (size_t)(layout[s][0] + r);
            lora_ref_lora_row(want, mag, x + row * in, y0 + row * out, &wa[s].ref, &wb[s].ref,
                              layout[s][2], scales[s]);
            snprintf(what, sizeof(what), "lora_sgmv %s in=%d out=%d segment %d row %zu",
                     lora_dtype_name(dt), in, out, s, row);
            check_far(what, y + row * out, want, mag, (size_t)out);
        }
    }
    int untouched = 0;
    for (int r = 0; r < ROWS; r++)
        untouched +=
            !in_seg[r] && memcmp(y + (size_t)r * out, y0 + (size_t)r * out, (size_t)out * 4) != 0;
    CHECK(untouched == 0);
    CHECK(memcmp(x, x_after, nx * sizeof(float)) == 0);
    /* Each segment alone: the batch's bits. */
    long bits = 0;
    for (int s = 0; s < N_SEGS; s++) {
        put(&a, dy1, y0, ny);
        k_->lora_sgmv(be, dy1, dx, &segs[s], 1, in, out, dtmp, MAX_RANK);
        get(&a, alone, dy1, ny);
        size_t o = (size_t)layout[s][0] * out;
        bits += n_differ(alone + o, y + o, (size_t)layout[s][1] * out);
    }
    if (bits)
        printf("# lora_sgmv %s in=%d out=%d: %ld values alone differ from the batch's\n",
               lora_dtype_name(dt), in, out, bits);
    CHECK(bits == 0);
    for (int s = 0; s < N_SEGS; s++) {
        weight_free(&wa[s]);
        weight_free(&wb[s]);
    }
    arena_free(&a);
    free(x);
    free(y0);
    free(y);
    free(x_after);
    free(alone);
    free(want);
    free(mag);
}

static void sgmv_all(void)
{
    sgmv_case(37, 29);
    sgmv_case(96, 257);
    sgmv_case(896, 130);
}

static void test_lora_sgmv_f32(void)
{
    dt = LORA_DTYPE_F32;
    sgmv_all();
}

static void test_lora_sgmv_bf16(void)
{
    dt = LORA_DTYPE_BF16;
    sgmv_all();
}

static void test_lora_sgmv_f16(void)
{
    dt = LORA_DTYPE_F16;
    sgmv_all();
}

/* ---- asynchronous uploads ---- */

static void test_upload_async(void)
{
    enum { N = 100003 };
    char err[256];
    float *p = k_->host_alloc_pinned(be, N * sizeof(float), err, sizeof(err));
    float *back = new_floats(N), *ones = new_floats(N);
    struct arena a = arena_new(2 * N * sizeof(float));
    float *d = dev(&a, N), *d2 = dev(&a, N);
    uint64_t t = 0;

    CHECK(p != NULL);
    if (!p) {
        printf("# %s\n", err);
        return;
    }
    for (int i = 0; i < N; i++) {
        p[i] = (float)i;
        ones[i] = 1.0f;
    }
    put(&a, d2, ones, N);
    /* Queued before the upload: d += d2. The copy waits for it, so d ends as the copy. */
    k_->add(be, d, d2, N);
    CHECK(k_->upload_async(be, a.buf, off_of(&a, d), p, N * sizeof(float), &t, err, sizeof(err)) ==
          0);
    CHECK(t != 0);
    int polls = 0;
    while (!k_->upload_done(be, t) && polls < 1000000) {
        polls++;
        usleep(10);
    }
    CHECK(k_->upload_done(be, t));
    get(&a, back, d, N);
    CHECK(memcmp(back, p, N * sizeof(float)) == 0);
    /* Out of bounds: refused, nothing started. */
    CHECK(k_->upload_async(be, a.buf, a.buf->bytes, p, 4, &t, err, sizeof(err)) == -1);
    CHECK(k_->upload_done(be, 0));
    k_->host_free_pinned(be, p);
    arena_free(&a);
    free(back);
    free(ones);
}

/* A matmul handed an I8 weight (a caller's bug) fails the next download, naming it; the backend
 * stays failed. On a backend of its own. */
static void test_error_is_reported(void)
{
    char err[512] = "";
    struct lora_backend *saved = be;
    be = lora_backend_open("cuda", err, sizeof(err));
    CHECK(be != NULL);
    if (!be) {
        be = saved;
        return;
    }
    dt = LORA_DTYPE_I8;
    struct weight w = weight_random(4, 8, 1.0f);
    struct arena a = arena_new(64 * sizeof(float));
    float *dx = dev(&a, 8), *dy = dev(&a, 4), y[4];
    k_->matmul(be, dy, dx, &w.t, 1, 1.0f, false);
    CHECK(k_->download(be, y, a.buf, off_of(&a, dy), sizeof(y), err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "matmul weight: dtype I8 is not supported");
    CHECK(k_->download(be, y, a.buf, off_of(&a, dy), sizeof(y), err, sizeof(err)) == -1);
    arena_free(&a);
    weight_free(&w);
    lora_backend_close(&be);
    be = saved;
}

/* With a work buffer of 16 KiB: attention's partial results and matmul's pieces take several
 * launches each, and give what one launch gives. */
static void test_small_work_buffer(void)
{
    char err[512] = "";
    struct lora_backend *saved = be;

    setenv("LORA_CUDA_WORK_BYTES", "16384", 1);
    be = lora_backend_open("cuda", err, sizeof(err));
    unsetenv("LORA_CUDA_WORK_BYTES");
    CHECK(be != NULL);
    if (!be) {
        printf("# %s\n", err);
        be = saved;
        return;
    }
    const struct attn_setup st = {16, 2, 1, 64, SPECS(prefill_specs)};
    dt = LORA_DTYPE_BF16;
    attention_case(&st);
    dt = LORA_DTYPE_BF16;
    matmul_case(20, 150, 60, 1.0f, false);
    dt = LORA_DTYPE_F16;
    matmul_case(20, 150, 60, 1e5f, true);
    lora_backend_close(&be);
    be = saved;
}

/* ---- the forward pass against the CPU backend ---- */

static char tmp_dir[64];

struct fwd_side {
    struct lora_backend *b;
    struct lora_model *m;
    struct lora_adapter *ad[4];
    struct lora_kv_cache *kv;
    struct lora_forward *f;
};

enum { FWD_BLOCK = 5, FWD_BLOCKS = 64, FWD_RANK = 64 };

static int fwd_open(struct fwd_side *s, struct lora_backend *b, const char *model_dir,
                    enum lora_dtype kv_dtype, enum lora_dtype slot_dtype, char *err, size_t len)
{
    static const int ranks[4] = {1, 4, 16, 64};

    memset(s, 0, sizeof(*s));
    s->b = b;
    s->m = lora_model_load(b, model_dir, 0, 1, NULL, err, len);
    if (!s->m)
        return -1;
    for (int i = 0; i < 4; i++) {
        char dir[128];
        snprintf(dir, sizeof(dir), "%s/adapter-r%d", tmp_dir, ranks[i]);
        s->ad[i] = lora_adapter_load(dir, s->m, FWD_RANK, err, len);
        if (!s->ad[i])
            return -1;
    }
    const struct lora_model_config *c = &s->m->cfg;
    s->kv = lora_kv_cache_new(b, kv_dtype, c->n_layers, s->m->n_kv_heads * c->head_dim, FWD_BLOCK,
                              FWD_BLOCKS);
    if (!s->kv) {
        snprintf(err, len, "kv cache");
        return -1;
    }
    struct lora_forward_limits lim = {64, 8, 72, 200, 4, FWD_RANK, slot_dtype};
    s->f = lora_forward_new(s->m, s->kv, &lim, err, len);
    if (!s->f)
        return -1;
    for (int i = 0; i < 4; i++)
        if (lora_forward_set_slot(s->f, i, s->ad[i], err, len) < 0)
            return -1;
    return 0;
}

static void fwd_close(struct fwd_side *s)
{
    lora_forward_destroy(&s->f);
    lora_kv_cache_destroy(&s->kv);
    for (int i = 0; i < 4; i++)
        lora_adapter_destroy(&s->ad[i]);
    lora_model_destroy(&s->m);
}

enum { N_SEQ = 5, MAX_SEQ_TOKENS = 48, CHUNK = 9 };

/* A sequence of the forward test: its tokens are fixed in advance (the first n_prompt a prompt,
 * prefilled in chunks of CHUNK, the rest fed one per step as decodes), so both backends see the
 * same input whatever they compute. */
struct fwd_seq {
    int slot;
    int n_prompt, n_total, first_step;
    bool all_logits;
    int tokens[MAX_SEQ_TOKENS];
    int n_cached;
    int table[12];
};

static bool seq_active(const struct fwd_seq *s, int step)
{
    return step >= s->first_step && s->n_cached < s->n_total;
}

/* The next part of s: a prompt chunk, or one decode. */
static struct lora_seq_step seq_part(const struct fwd_seq *s)
{
    int left = s->n_prompt - s->n_cached;
    struct lora_seq_step st = {0};

    st.tokens = s->tokens + s->n_cached;
    st.n_tokens = left > 0 ? (left < CHUNK ? left : CHUNK) : 1;
    st.pos = s->n_cached;
    st.block_table = s->table;
    st.adapter_slot = s->slot;
    st.all_logits = s->all_logits && left > 0;
    return st;
}

static double worst_diff(const float *got, const float *want, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        w = d > w || d != d ? d : w;
    }
    return w;
}

/* Steps of N_SEQ sequences (four adapters and the base model, chunked prefill mixed with decodes,
 * one joining late) on the CPU and on the CUDA backend, every logit compared; then the first
 * sequence alone, the same parts, on a fresh cache and forward state of the CUDA backend, against
 * its rows of the batch. */
static void forward_case(const char *model_dir, enum lora_dtype kv_dtype, enum lora_dtype slot)
{
    /* The CPU side computes in the same dtypes where it can, else in float32: the slots hold the
     * same values either way (the adapters are written in bfloat16), a cache does not: the CUDA
     * side rounds keys and values to bfloat16, which moves this random model's logits by up to
     * 8e-2 (as much as between two CUDA runs with a float32 and a bfloat16 cache), and the bound
     * is then FORWARD_KV_TOL, a sanity check; the cache's arithmetic is checked by the attention
     * and kv_write tests. */
    struct lora_backend *probe = lora_backend_open("cpu", NULL, 0);
    enum lora_dtype cpu_kv = kv_dtype, cpu_slot = slot;
    if (probe && (!probe->ops->supports(probe, LORA_KERNEL_KV_WRITE, kv_dtype) ||
                  !probe->ops->supports(probe, LORA_KERNEL_ATTENTION, kv_dtype)))
        cpu_kv = LORA_DTYPE_F32;
    if (probe && !probe->ops->supports(probe, LORA_KERNEL_LORA_SGMV, slot))
        cpu_slot = LORA_DTYPE_F32;
    lora_backend_close(&probe);
    double tol = cpu_kv == kv_dtype ? FORWARD_TOL : FORWARD_KV_TOL;
    static const int slots[N_SEQ] = {0, 2, -1, 3, 1};
    static const int prompts[N_SEQ] = {23, 7, 12, 30, 1};
    static const int first_steps[N_SEQ] = {0, 0, 0, 2, 1};
    char err[512] = "";
    struct fwd_side cpu, gpu, one;
    struct lora_backend *cpu_be = lora_backend_open("cpu", err, sizeof(err));
    struct fwd_seq seqs[N_SEQ];
    float *mine[64];
    int n_mine = 0;

    if (!cpu_be || fwd_open(&cpu, cpu_be, model_dir, cpu_kv, cpu_slot, err, sizeof(err)) < 0 ||
        fwd_open(&gpu, be, model_dir, kv_dtype, slot, err, sizeof(err)) < 0 ||
        fwd_open(&one, be, model_dir, kv_dtype, slot, err, sizeof(err)) < 0) {
        printf("# forward setup: %s\n", err);
        CHECK(0);
        lora_backend_close(&cpu_be);
        return;
    }
    int vocab = cpu.m->cfg.vocab_size;
    for (int s = 0; s < N_SEQ; s++) {
        struct fwd_seq *q = &seqs[s];
        q->slot = slots[s];
        q->n_prompt = prompts[s];
        q->n_total = prompts[s] + 10;
        q->first_step = first_steps[s];
        q->all_logits = q->slot == -1; /* prompt log-probabilities for the base model's */
        q->n_cached = 0;
        for (int t = 0; t < q->n_total; t++)
            q->tokens[t] = (int)(rng_next() % (uint64_t)vocab);
        for (int b = 0; b < 12; b++) /* reversed, interleaved with the other sequences' */
            q->table[b] = (11 - b) * N_SEQ + s;
    }
    double worst = 0;
    for (int step = 0; step < 40; step++) {
        struct lora_seq_step st[N_SEQ];
        int first_cpu[N_SEQ], first_gpu[N_SEQ], n = 0, which[N_SEQ], n_rows = 0;
        for (int s = 0; s < N_SEQ; s++)
            if (seq_active(&seqs[s], step)) {
                which[n] = s;
                st[n++] = seq_part(&seqs[s]);
            }
        if (!n)
            break;
        const float *lc, *lg;
        if (lora_forward_step(cpu.f, st, n, &lc, first_cpu, err, sizeof(err)) < 0 ||
            lora_forward_step(gpu.f, st, n, &lg, first_gpu, err, sizeof(err)) < 0) {
            printf("# step %d: %s\n", step, err);
            CHECK(0);
            break;
        }
        for (int i = 0; i < n; i++)
            n_rows += st[i].all_logits ? st[i].n_tokens : 1;
        double w = worst_diff(lg, lc, (size_t)n_rows * vocab);
        worst = w > worst || w != w ? w : worst;
        CHECK(memcmp(first_cpu, first_gpu, sizeof(int) * (size_t)n) == 0);
        for (int i = 0; i < n; i++) {
            if (which[i] == 0 && n_mine < 64) {
                mine[n_mine] = new_floats((size_t)vocab);
                memcpy(mine[n_mine++], lg + (size_t)first_gpu[i] * vocab,
                       (size_t)vocab * sizeof(float));
            }
            seqs[which[i]].n_cached += st[i].n_tokens;
        }
    }
    double worst_alone = 0;
    long bits = 0;
    struct fwd_seq s0 = seqs[0];
    s0.n_cached = 0;
    for (int i = 0; i < n_mine; i++) {
        struct lora_seq_step st = seq_part(&s0);
        const float *l;
        int first;
        if (lora_forward_step(one.f, &st, 1, &l, &first, err, sizeof(err)) < 0) {
            printf("# alone: %s\n", err);
            CHECK(0);
            break;
        }
        double w = worst_diff(l, mine[i], (size_t)vocab);
        worst_alone = w > worst_alone || w != w ? w : worst_alone;
        bits += n_differ(l, mine[i], (size_t)vocab);
        s0.n_cached += st.n_tokens;
    }
    printf("# forward %s weights, %s cache, %s slots (the cpu's: %s, %s): largest difference from "
           "the cpu %.2e (bound %.0e); alone against the batch %.2e (%ld of %d logits differ in "
           "bits)\n",
           lora_dtype_name(gpu.m->weight_dtype), lora_dtype_name(kv_dtype), lora_dtype_name(slot),
           lora_dtype_name(cpu_kv), lora_dtype_name(cpu_slot), worst, tol, worst_alone, bits,
           n_mine * vocab);
    CHECK(worst <= tol);
    CHECK(worst_alone <= FORWARD_TOL);
    CHECK(n_mine == 13); /* 3 prompt chunks and 10 decodes */
    for (int i = 0; i < n_mine; i++)
        free(mine[i]);
    fwd_close(&cpu);
    fwd_close(&gpu);
    fwd_close(&one);
    lora_backend_close(&cpu_be);
}

static int write_models(char *err, size_t len)
{
    static const int ranks[4] = {1, 4, 16, 64};
    struct lora_synthetic_model_opts o;
    char dir[128];

    lora_synthetic_model_defaults(&o);
    o.hidden_size = 128;
    o.intermediate_size = 256;
    o.n_layers = 2;
    o.n_heads = 8;
    o.n_kv_heads = 2;
    o.vocab_size = 320;
    o.max_position_embeddings = 256;
    o.seed = 7;
    snprintf(dir, sizeof(dir), "%s/f32", tmp_dir);
    if (lora_synthetic_model_write(dir, &o, err, len) < 0)
        return -1;
    o.dtype = LORA_DTYPE_BF16;
    o.tie_word_embeddings = true;
    snprintf(dir, sizeof(dir), "%s/bf16", tmp_dir);
    if (lora_synthetic_model_write(dir, &o, err, len) < 0)
        return -1;
    for (int i = 0; i < 4; i++) {
        struct lora_synthetic_adapter_opts a;
        char adir[128];
        lora_synthetic_adapter_defaults(&a);
        a.dtype = LORA_DTYPE_BF16; /* so that bfloat16 slots hold them exactly */
        a.rank = ranks[i];
        a.alpha = 2.0f * ranks[i];
        a.seed = 100 + (uint64_t)i;
        snprintf(adir, sizeof(adir), "%s/adapter-r%d", tmp_dir, ranks[i]);
        snprintf(dir, sizeof(dir), "%s/f32", tmp_dir);
        if (lora_synthetic_adapter_write(adir, dir, &a, err, len) < 0)
            return -1;
    }
    return 0;
}

static void test_forward(void)
{
    char err[512], dir[128];

    if (write_models(err, sizeof(err)) < 0) {
        printf("# %s\n", err);
        CHECK(0);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/f32", tmp_dir);
    forward_case(dir, LORA_DTYPE_F32, LORA_DTYPE_F32);
    snprintf(dir, sizeof(dir), "%s/bf16", tmp_dir);
    forward_case(dir, LORA_DTYPE_F32, LORA_DTYPE_BF16);
    forward_case(dir, LORA_DTYPE_BF16, LORA_DTYPE_F32);
}

/* Adapter slots filled by asynchronous copies: a slot is ready only once its copy is done (on
 * the emulation, whose first query of a copy always answers "not yet", it is not ready at once),
 * a slot refilled while its last copy may still run gets the new adapter, and a step issued
 * before the copy is done waits for it: its logits are those of a step after a finished copy. */
static void test_slot_copies(void)
{
    char err[512], dir[128];
    struct fwd_side a, b;

    if (write_models(err, sizeof(err)) < 0) {
        printf("# %s\n", err);
        CHECK(0);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/bf16", tmp_dir);
    if (fwd_open(&a, be, dir, LORA_DTYPE_F32, LORA_DTYPE_BF16, err, sizeof(err)) < 0 ||
        fwd_open(&b, be, dir, LORA_DTYPE_F32, LORA_DTYPE_BF16, err, sizeof(err)) < 0) {
        printf("# %s\n", err);
        CHECK(0);
        return;
    }
    CHECK(lora_forward_set_slot(a.f, 3, a.ad[1], err, sizeof(err)) == 0);
    if (strstr(be->description, "emulated"))
        CHECK(!lora_forward_slot_ready(a.f, 3));
    int polls = 0;
    while (!lora_forward_slot_ready(a.f, 3) && polls < 1000000)
        polls++;
    CHECK(lora_forward_slot_ready(a.f, 3));
    /* a: slot 0 refilled twice in a row, then used at once; b: the same adapter, waited for. */
    CHECK(lora_forward_set_slot(a.f, 0, a.ad[2], err, sizeof(err)) == 0);
    CHECK(lora_forward_set_slot(a.f, 0, a.ad[3], err, sizeof(err)) == 0);
    CHECK(lora_forward_set_slot(b.f, 0, b.ad[3], err, sizeof(err)) == 0);
    lora_forward_slot_wait(b.f, 0);
    CHECK(lora_forward_slot_ready(b.f, 0));
    int tokens[7] = {5, 9, 200, 31, 7, 77, 100}, table[2] = {0, 1}, first_a, first_b;
    struct lora_seq_step st = {tokens, 7, 0, table, 0, true};
    const float *la, *lb;
    int vocab = a.m->cfg.vocab_size;
    CHECK(lora_forward_step(a.f, &st, 1, &la, &first_a, err, sizeof(err)) == 0);
    float *copy = malloc(sizeof(float) * 7 * (size_t)vocab);
    memcpy(copy, la, sizeof(float) * 7 * (size_t)vocab);
    CHECK(lora_forward_slot_ready(a.f, 0));
    CHECK(lora_forward_step(b.f, &st, 1, &lb, &first_b, err, sizeof(err)) == 0);
    CHECK(n_differ(copy, lb, 7 * (size_t)vocab) == 0);
    free(copy);
    fwd_close(&a);
    fwd_close(&b);
}

/* ---- the all-reduce: two ranks, two processes, two devices ---- */

static const char *self_path;

/* The second rank: opens its device, sums, writes its result to fd. Exit status 0 on success. */
static int allreduce_child(const char *name, const char *device, int fd)
{
    enum { N = 1001 };
    char err[512];
    float theirs[N], got[N];

    rng_state = 42;
    fill_random(theirs, N, 1.0f);
    be = lora_backend_open(device, err, sizeof(err));
    if (!be)
        return 2;
    k_ = be->ops;
    struct lora_collective *c = k_->collective_open(be, name, 1, 2, N, 10000, err, sizeof(err));
    struct arena a = arena_new(N * sizeof(float));
    float *d = dev(&a, N);
    put(&a, d, theirs, N);
    int ok = c && k_->allreduce_sum(be, c, d, N) == 0;
    char e2[256];
    ok = ok && k_->download(be, got, a.buf, 0, sizeof(got), e2, sizeof(e2)) == 0;
    ok = ok && write(fd, got, sizeof(got)) == (ssize_t)sizeof(got);
    k_->collective_close(be, &c);
    arena_free(&a);
    lora_backend_close(&be);
    return ok ? 0 : 1;
}

static void test_allreduce(void)
{
    enum { N = 1001 };
    char name[64], err[512], fdarg[16];
    float mine[N], theirs[N], got[N], child_got[N];
    double want[N];
    int fds[2];

    uint64_t saved = rng_state;
    rng_state = 42; /* the child draws the same numbers */
    fill_random(theirs, N, 1.0f);
    rng_state = saved;
    fill_random(mine, N, 1.0f);
    const float *bufs[2] = {mine, theirs};
    lora_ref_allreduce(want, bufs, 2, N);
    snprintf(name, sizeof(name), "/lora-test-cuda-%ld", (long)getpid());
    if (pipe(fds) < 0)
        bail("pipe", strerror(errno));
    snprintf(fdarg, sizeof(fdarg), "%d", fds[1]);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* a fresh process: CUDA does not survive fork */
        close(fds[0]);
        execl(self_path, self_path, "--allreduce-child", name, "cuda:1", fdarg, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    struct lora_collective *c = k_->collective_open(be, name, 0, 2, N, 10000, err, sizeof(err));
    CHECK(c != NULL);
    if (!c)
        printf("# collective_open: %s\n", err);
    struct arena a = arena_new(N * sizeof(float));
    float *d = dev(&a, N);
    put(&a, d, mine, N);
    CHECK(c && k_->allreduce_sum(be, c, d, N) == 0);
    get(&a, got, d, N);
    size_t n_read = 0;
    ssize_t r;
    while (n_read < sizeof(child_got) &&
           (r = read(fds[0], (char *)child_got + n_read, sizeof(child_got) - n_read)) > 0)
        n_read += (size_t)r;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(n_read == sizeof(child_got));
    int n_bad = 0;
    for (int i = 0; i < N; i++)
        n_bad += got[i] != (float)want[i];
    CHECK(n_bad == 0);
    CHECK(memcmp(got, child_got, sizeof(got)) == 0);
    k_->collective_close(be, &c);
    CHECK(c == NULL);
    arena_free(&a);
}

/* ---- the list ---- */

struct test {
    const char *name;
    void (*fn)(void);
    bool needs_two_devices;
};

static const struct test tests[] = {
    {"supports", test_supports, false},
    {"matmul F32", test_matmul_f32, false},
    {"matmul BF16 exact", test_matmul_bf16_exact, false},
    {"matmul BF16 fast", test_matmul_bf16_fast, false},
    {"matmul F16 exact", test_matmul_f16_exact, false},
    {"matmul F16 fast", test_matmul_f16_fast, false},
    {"add_bias", test_add_bias, false},
    {"embed F32 BF16 F16", test_embed, false},
    {"rmsnorm", test_rmsnorm, false},
    {"rope", test_rope, false},
    {"silu_mul and add", test_silu_mul_add, false},
    {"kv_write F32 BF16 F16", test_kv_write, false},
    {"attention F32", test_attention_f32, false},
    {"attention BF16", test_attention_bf16, false},
    {"attention F16", test_attention_f16, false},
    {"lora_sgmv F32", test_lora_sgmv_f32, false},
    {"lora_sgmv BF16", test_lora_sgmv_bf16, false},
    {"lora_sgmv F16", test_lora_sgmv_f16, false},
    {"upload_async", test_upload_async, false},
    {"a small work buffer", test_small_work_buffer, false},
    {"an error reaches the next download", test_error_is_reported, false},
    {"forward against the cpu backend", test_forward, false},
    {"adapter slots copied alongside steps", test_slot_copies, false},
    {"allreduce of two ranks", test_allreduce, true},
};

static void report(bool ok, const char *name, const char *skip)
{
    check_n_run++;
    if (!ok)
        check_n_failed++;
    if (skip)
        printf("ok %d - %s # SKIP %s\n", check_n_run, name, skip);
    else
        printf("%s %d - %s\n", ok ? "ok" : "not ok", check_n_run, name);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    char err[512] = "", skip[600];
    int n_devices = 0;

    self_path = argv[0];
    if (argc == 5 && strcmp(argv[1], "--allreduce-child") == 0)
        return allreduce_child(argv[2], argv[3], atoi(argv[4]));
    be = lora_backend_open("cuda", err, sizeof(err));
    if (!be) {
        snprintf(skip, sizeof(skip), "no CUDA device: %s", err);
        for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
            report(true, tests[i].name, skip);
        return check_done();
    }
    k_ = be->ops;
    printf("# %s\n", be->description);
    char builds[256];
    lora_backend_builds(builds, sizeof(builds));
    sscanf(builds, "cpu, cuda: %d", &n_devices);
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/lora-test-cuda.XXXXXX");
    if (!mkdtemp(tmp_dir))
        bail("mkdtemp", strerror(errno));
    /* LORA_TEST_ONLY=substring runs the tests whose name contains it (the others are skipped). */
    const char *only = getenv("LORA_TEST_ONLY");
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        if (only && !strstr(tests[i].name, only)) {
            report(true, tests[i].name, "not selected (LORA_TEST_ONLY)");
            continue;
        }
        if (tests[i].needs_two_devices && n_devices < 2) {
            snprintf(skip, sizeof(skip),
                     "needs two CUDA devices (NCCL takes one per rank), %d here", n_devices);
            report(true, tests[i].name, skip);
            continue;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        check_cur_failed = 0;
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("# %.2f s\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
        report(!check_cur_failed, tests[i].name, NULL);
    }
    lora_backend_close(&be);
    lora_fs_remove_tree(tmp_dir);
    return check_done();
}
