/* test_backend: every backend of backend/backend.h that this build has, times every operation
 * of its table, times every compute dtype the backend says it supports for that operation,
 * against the double-precision twins of backend/ref (docs/design.md, "Backend").
 *
 * Why a separate program: tests/unit/test_kernels.c knows the CPU backend (its threads, its
 * exact sums); this one knows only the interface, so a new backend is tested by adding its
 * device name to `devices` below, and a new dtype by its kernels saying yes in supports().
 * Everything goes through the table: inputs are uploaded into the backend's buffers, outputs
 * downloaded, so a device backend runs exactly these checks.
 *
 * Shapes: several per operation, odd sizes among them (1, 5, 7, 33, 37, 257, 897, 65536, a block
 * size of 5, a head of 6). Tolerances: a float32 result must lie within REL_TOL * (1 + mag) of the
 * twin's, where mag is the sum of the magnitudes of the terms the twin summed (its rounding
 * scale); weights are generated in the tensor's dtype and the twin reads the same values, and
 * activations a kernel rounds (the fast BF16 matmul) or quantizes (I8) the twin rounds or
 * quantizes alike, so the dtype adds no error of its own, and the tolerance is the same for all.
 * What quantizing activations costs is bounded apart: the I8 matmul lies within half a step of
 * each group's activation scale times the group's sum of |w| of the product with the dequantized
 * weights. Results the interface promises to be exact (copies, single additions, cache writes
 * rounded to nearest even, the all-reduce of two ranks, batch invariance of the matmul and the
 * SGMV, BF16 and F16 exact as F32 on the widened weights) are compared bit for bit.
 *
 * The CPU backend runs again on each narrower instruction path the machine can take (AVX-512
 * without its bf16 and int8 instructions, AVX2), through the environment switches it reads when
 * it opens.
 *
 * A backend this build or machine lacks (cuda without a CUDA build, a device, or kernels) is
 * reported as one skipped test per operation, with the reason lora_backend_open gave. Output is
 * TAP; tests/run counts it with the unit tests.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/ref/ref.h"
#include "tests/unit/check.h"

#define REL_TOL 1e-5

/* The devices to test, in order: each one's operations are run or skipped. */
static const char *const devices[] = {"cpu", "cuda"};

static const enum lora_dtype compute_dtypes[] = {LORA_DTYPE_F32, LORA_DTYPE_BF16, LORA_DTYPE_F16,
                                                 LORA_DTYPE_I8};

static struct lora_backend *be;
static const struct lora_backend_ops *k_;
static enum lora_dtype dt; /* the dtype of the case that runs */

/* ---- helpers ---- */

#define TEST_RANDOM_SEED 0x452821e638d01377ULL
#include "tests/common/test_random.h"

static void fill_random(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_uniform();
}

/* Index of the first got[i] farther than rel * (1 + mag[i]) from want[i] (NaN is always far),
 * or -1. mag may be NULL for a bound relative to |want|. */
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

/* ---- weights in a dtype ---- */

/* A (rows, cols) weight of dtype dt: its host bytes (for the twin) and its copy in a backend
 * buffer (for the operation). */
struct weight {
    void *host;
    struct lora_ref_w ref;
    struct lora_buffer *buf;
    struct lora_tensor t;
};

/* Encodes src (rows, cols) into dtype at dst: I8 through lora_quantize_i8 (groups of
 * LORA_I8_GROUP, checked against its twin in check_quantize_i8). */
static void encode(enum lora_dtype dtype, const float *src, int64_t rows, int64_t cols, void *dst)
{
    size_t n = (size_t)(rows * cols);
    char *d = dst;

    switch (dtype) {
    case LORA_DTYPE_BF16:
    case LORA_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h =
                dtype == LORA_DTYPE_BF16 ? lora_f32_to_bf16(src[i]) : lora_f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case LORA_DTYPE_I8:
        if (lora_quantize_i8(LORA_DTYPE_F32, src, rows, cols, dst) < 0) {
            printf("Bail out! lora_quantize_i8 refused finite floats\n");
            exit(1);
        }
        break;
    default:
        memcpy(dst, src, n * sizeof(float));
    }
}

static struct weight weight_new(const float *src, int64_t rows, int64_t cols)
{
    struct weight w = {0};
    size_t bytes = lora_tensor_bytes(dt, rows, cols);
    char err[256];

    w.host = xmalloc(bytes);
    encode(dt, src, rows, cols, w.host);
    w.ref = (struct lora_ref_w){dt, w.host, rows, cols};
    w.buf = k_->buffer_alloc(be, bytes, err, sizeof(err));
    if (!w.buf || k_->upload(be, w.buf, 0, w.host, bytes, err, sizeof(err)) < 0) {
        printf("Bail out! %s\n", err);
        exit(1);
    }
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

/* ---- activations in the backend's memory ---- */

/* One buffer of float32 regions, carved in order. */
struct arena {
    struct lora_buffer *buf;
    size_t used;
};

static struct arena arena_new(size_t bytes)
{
    char err[256];
    struct arena a = {k_->buffer_alloc(be, bytes + 4096, err, sizeof(err)), 0};

    if (!a.buf) {
        printf("Bail out! %s\n", err);
        exit(1);
    }
    return a;
}

/* n floats (at least one) of the arena: an address for the operations. */
static float *dev(struct arena *a, size_t n)
{
    size_t off = (a->used + 63) / 64 * 64;

    a->used = off + (n ? n : 1) * sizeof(float);
    if (a->used > a->buf->bytes) {
        printf("Bail out! arena of %zu bytes too small\n", a->buf->bytes);
        exit(1);
    }
    return (float *)((char *)a->buf->base + off);
}

static size_t off_of(const struct arena *a, const void *p)
{
    return (size_t)((const char *)p - (const char *)a->buf->base);
}

static void put(struct arena *a, float *d, const float *h, size_t n)
{
    char err[256];

    if (k_->upload(be, a->buf, off_of(a, d), h, n * sizeof(float), err, sizeof(err)) < 0) {
        printf("Bail out! upload: %s\n", err);
        exit(1);
    }
}

static void get(const struct arena *a, float *h, const float *d, size_t n)
{
    char err[256];

    if (k_->download(be, h, a->buf, off_of(a, d), n * sizeof(float), err, sizeof(err)) < 0) {
        printf("Bail out! download: %s\n", err);
        exit(1);
    }
}

static void arena_free(struct arena *a)
{
    k_->buffer_free(be, a->buf);
}

/* ---- the operations ---- */

/* The matmul modes: be->fast_matmul off and on. */
static const char *const mode_names[2] = {"exact", "fast"};

/* The twin of the matmul of dt in mode fast (backend.h, matmul): dot and its magnitude. */
static void matmul_twin(double *dot, double *absdot, const float *x, const struct lora_ref_w *w,
                        int m, bool fast)
{
    if (w->dtype == LORA_DTYPE_I8)
        lora_ref_matmul_xi8(dot, absdot, x, w, m);
    else if (w->dtype == LORA_DTYPE_BF16 && fast)
        lora_ref_matmul_xbf16(dot, absdot, x, w, m);
    else
        lora_ref_matmul(dot, absdot, x, w, m);
}

/* I8: how far quantizing x may move x · wᵀ from the product with the dequantized weights:
 * half a step of each group's activation scale times the group's sum of |w|. */
static void i8_bound(double *bound, const float *x, const struct lora_ref_w *w, int m)
{
    int n = (int)w->rows, k = (int)w->cols, n_groups = (int)lora_i8_groups(k);
    signed char *q = xmalloc((size_t)k);
    float *scales = new_floats((size_t)n_groups);

    for (int i = 0; i < m; i++) {
        lora_ref_quantize_row(x + (size_t)i * k, k, q, scales);
        for (int j = 0; j < n; j++) {
            double b = 0;
            for (int d = 0; d < k; d++)
                b += 0.5 * scales[d / LORA_I8_GROUP] * fabs(lora_ref_at(w, j, d));
            bound[(size_t)i * n + j] = b;
        }
    }
    free(q);
    free(scales);
}

/* y (m, w->rows) through the backend, x already at dx; y starts as y0 (m rows). */
static void run_matmul(struct arena *a, float *y, float *dy, const float *dx, const float *y0,
                       const struct lora_tensor *w, int m, float alpha, bool acc)
{
    size_t mn = (size_t)m * (size_t)w->rows;

    put(a, dy, y0, mn);
    k_->matmul(be, dy, dx, w, m, alpha, acc);
    get(a, y, dy, mn);
}

/* Shapes: m from 1 to 70, k with every kind of tail (below a vector, between tiles, a partial
 * int8 group, several groups), n not a multiple of the tiles, rows long enough (k = 65536)
 * that a backend which converts x in passes (the CPU's staging) needs several, and long k, with
 * and without a tail, that the CPU's tiles of several rows take in blocks. Each mode of each
 * dtype against its twin within REL_TOL; BF16 and F16 exact bit for bit the F32 matmul of the
 * widened weights; fast the same bits as exact where it changes nothing; I8 within the stated bound
 * of the product with the dequantized weights; and batch invariance: every row alone, and a batch
 * of another size over the same rows, give the batch's bits. */
static void case_matmul(void)
{
    static const int shapes[][3] = {{1, 1, 1},      {3, 5, 7},      {2, 4, 8},      {5, 33, 9},
                                    {17, 129, 100}, {64, 67, 257},  {7, 64, 897},   {70, 37, 130},
                                    {33, 6, 64},    {1, 131, 1000}, {12, 19, 4864}, {40, 3, 65},
                                    {70, 2, 65536}, {1, 96, 64},    {37, 64, 96},   {16, 32, 896},
                                    {9, 13, 2085},  {7, 300, 1536}};

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        size_t mn = (size_t)m * n, mk = (size_t)m * k;
        float *src = new_floats((size_t)n * k), *wide = new_floats((size_t)n * k);
        float *x = new_floats(mk), *y0 = new_floats(mn), *y = new_floats(mn);
        float *batch = new_floats(mn), *other = new_floats(mn), *alone = new_floats(n);
        float *exact = new_floats(mn);
        double *dot = new_doubles(mn), *absdot = new_doubles(mn), *bound = new_doubles(mn);
        double *want = new_doubles(mn), *mag = new_doubles(mn), *deq = new_doubles(mn);
        struct arena a = arena_new((mk + 2 * mn + (size_t)n * k) * sizeof(float) + 512);
        float *dx = dev(&a, mk), *dy = dev(&a, mn), *d1 = dev(&a, n);
        float *dwide = dev(&a, (size_t)n * k);
        char what[128];

        fill_random(src, (size_t)n * k, 1.0f);
        struct weight w = weight_new(src, n, k);
        for (int r = 0; r < n; r++)
            lora_tensor_row_to_f32(dt, w.host, n, k, r, wide + (size_t)r * k);
        fill_random(x, mk, 1.0f);
        if (k > 40) { /* an activation outlier: int8's groups must contain it */
            x[k / 2] *= 30.0f;
            x[mk - 1] = 0.0f;
        }
        fill_random(y0, mn, 2.0f);
        put(&a, dx, x, mk);
        put(&a, dwide, wide, (size_t)n * k);
        struct lora_tensor wide_t = {a.buf, off_of(&a, dwide), LORA_DTYPE_F32, n, k};
        for (int fast = 0; fast < 2; fast++) {
            be->fast_matmul = fast;
            /* Where fast changes nothing its bits are compared with exact's below. */
            bool own_twin = !fast || dt == LORA_DTYPE_BF16;
            if (own_twin)
                matmul_twin(dot, absdot, x, &w.ref, m, fast);
            for (int acc = 0; acc < 2 && own_twin; acc++) { /* plain; accumulate with alpha */
                float alpha = acc ? -0.75f : 1.0f;
                run_matmul(&a, y, dy, dx, y0, &w.t, m, alpha, acc);
                for (size_t i = 0; i < mn; i++) {
                    want[i] = alpha * dot[i] + (acc ? y0[i] : 0.0);
                    mag[i] = fabs(alpha) * absdot[i] + (acc ? fabs(y0[i]) : 0.0);
                }
                snprintf(what, sizeof(what), "%s m=%d n=%d k=%d acc=%d", mode_names[fast], m, n, k,
                         acc);
                check_far(what, y, want, mag, mn);
            }
            run_matmul(&a, batch, dy, dx, y0, &w.t, m, 1.0f, false);
            if (!fast)
                memcpy(exact, batch, mn * sizeof(float));
            else if (dt != LORA_DTYPE_BF16) /* fast changes BF16 alone */
                CHECK(memcmp(exact, batch, mn * sizeof(float)) == 0);
            if (!fast && (dt == LORA_DTYPE_BF16 || dt == LORA_DTYPE_F16)) {
                run_matmul(&a, y, dy, dx, y0, &wide_t, m, 1.0f, false);
                if (memcmp(y, batch, mn * sizeof(float)) != 0)
                    printf("# m=%d n=%d k=%d: exact differs from F32 on the widened weights\n", m,
                           n, k);
                CHECK(memcmp(y, batch, mn * sizeof(float)) == 0);
            }
            if (dt == LORA_DTYPE_I8 && !fast) {
                lora_ref_matmul(deq, NULL, x, &w.ref, m);
                i8_bound(bound, x, &w.ref, m);
                long bad = -1;
                for (size_t i = 0; i < mn && bad < 0; i++)
                    if (!(fabs(batch[i] - deq[i]) <= bound[i] + REL_TOL * (1.0 + absdot[i])))
                        bad = (long)i;
                if (bad >= 0) {
                    printf("# %s: element %ld beyond the quantization bound\n", what, bad);
                    CHECK_NEAR(batch[bad], deq[bad], bound[bad] + REL_TOL * (1.0 + absdot[bad]));
                }
            }
            /* Batch invariance: rows alone (every one of a small batch, every 7th and the last
             * of a large one: each tile position, and fewer calls, as a thread team is slow to
             * start on a loaded machine), and the batch's last rows as a batch of their own
             * (another m, every row at another position), give the batch's bits. */
            int n_bad = 0, off = m / 3;
            for (int r = 0; r < m; r++) {
                if (m > 8 && r % 7 != 0 && r != m - 1)
                    continue;
                k_->matmul(be, d1, dx + (size_t)r * k, &w.t, 1, 1.0f, false);
                get(&a, alone, d1, n);
                n_bad += memcmp(alone, batch + (size_t)r * n, (size_t)n * sizeof(float)) != 0;
            }
            k_->matmul(be, dy, dx + (size_t)off * k, &w.t, m - off, 1.0f, false);
            get(&a, other, dy, (size_t)(m - off) * n);
            n_bad += memcmp(other, batch + (size_t)off * n, (size_t)(m - off) * n * 4) != 0;
            if (n_bad)
                printf("# %s m=%d n=%d k=%d: %d rows differ from the batch\n", mode_names[fast], m,
                       n, k, n_bad);
            CHECK(n_bad == 0);
        }
        be->fast_matmul = false;
        arena_free(&a);
        weight_free(&w);
        free(src);
        free(wide);
        free(x);
        free(y0);
        free(y);
        free(batch);
        free(other);
        free(alone);
        free(exact);
        free(dot);
        free(absdot);
        free(bound);
        free(want);
        free(mag);
        free(deq);
    }
}

static void case_add_bias(void)
{
    static const int shapes[][2] = {{1, 1}, {5, 33}, {7, 257}};

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int m = shapes[si][0], n = shapes[si][1];
        size_t mn = (size_t)m * n;
        struct weight b = weight_random(1, n, 1.0f);
        float *y0 = new_floats(mn), *y = new_floats(mn);
        double *want = new_doubles(mn);
        struct arena a = arena_new(mn * sizeof(float));
        float *dy = dev(&a, mn);

        fill_random(y0, mn, 1.0f);
        put(&a, dy, y0, mn);
        k_->add_bias(be, dy, &b.t, m);
        get(&a, y, dy, mn);
        lora_ref_add_bias(want, y0, &b.ref, m);
        /* One addition per element: exact to float rounding. */
        int n_bad = 0;
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

static void case_embed(void)
{
    static const int shapes[][2] = {{10, 13}, {3, 1}, {40, 257}}; /* vocab, dim */

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int vocab = shapes[si][0], dim = shapes[si][1];
        int ids[7];
        const int m = 7;
        for (int i = 0; i < m; i++)
            ids[i] = (int)(rng_next() % (uint64_t)vocab);
        ids[m - 1] = ids[0]; /* a repeated id */
        struct weight t = weight_random(vocab, dim, 1.0f);
        float *out = new_floats((size_t)m * dim);
        double *want = new_doubles((size_t)m * dim);
        struct arena a = arena_new((size_t)m * dim * sizeof(float));
        float *d = dev(&a, (size_t)m * dim);

        k_->embed(be, d, &t.t, ids, m);
        get(&a, out, d, (size_t)m * dim);
        lora_ref_embed(want, &t.ref, ids, m);
        int n_bad = 0;
        for (size_t i = 0; i < (size_t)m * dim; i++)
            n_bad += out[i] != (float)want[i]; /* a copy: exact */
        CHECK(n_bad == 0);
        arena_free(&a);
        weight_free(&t);
        free(out);
        free(want);
    }
}

static void case_rmsnorm(void)
{
    static const int dims[] = {1, 7, 64, 897};
    static const int ms[] = {1, 6};
    const float eps = 1e-6f;

    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
            int dim = dims[di], m = ms[mi];
            size_t total = (size_t)m * dim;
            struct weight w = weight_random(1, dim, 2.0f);
            float *x = new_floats(total), *out = new_floats(total);
            double *want = new_doubles(total);
            struct arena a = arena_new(2 * total * sizeof(float) + 128);
            float *dx = dev(&a, total), *dout = dev(&a, total);
            char what[64];

            fill_random(x, total, 3.0f);
            if (m > 1) /* an all-zero row: eps keeps it finite */
                memset(x + (size_t)(m - 1) * dim, 0, (size_t)dim * sizeof(float));
            lora_ref_rmsnorm(want, x, &w.ref, m, eps);
            put(&a, dx, x, total);
            k_->rmsnorm(be, dout, dx, &w.t, m, eps);
            get(&a, out, dout, total);
            snprintf(what, sizeof(what), "m=%d dim=%d out of place", m, dim);
            check_far(what, out, want, NULL, total);
            k_->rmsnorm(be, dx, dx, &w.t, m, eps);
            get(&a, out, dx, total);
            snprintf(what, sizeof(what), "m=%d dim=%d in place", m, dim);
            check_far(what, out, want, NULL, total);
            arena_free(&a);
            weight_free(&w);
            free(x);
            free(out);
            free(want);
        }
    }
}

static void case_rope(void)
{
    static const int configs[][2] = {{1, 2}, {4, 16}, {3, 128}, {2, 6}}; /* heads, head_dim */
    static const int pos[] = {0, 1, 2, 17, 1000, 10000, 32767};
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
            snprintf(what, sizeof(what), "heads=%d head_dim=%d theta=%g", n_heads, head_dim,
                     (double)theta);
            check_far(what, got, want, NULL, total);
            /* Position 0 is the identity, exactly. */
            CHECK(memcmp(got, x, (size_t)dim * sizeof(float)) == 0);
        }
        arena_free(&a);
        free(x);
        free(got);
        free(want);
    }
}

static void case_silu_mul(void)
{
    static const size_t sizes[] = {1, 5, 20001};

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *gate = new_floats(n), *up = new_floats(n), *got = new_floats(n);
        double *want = new_doubles(n);
        struct arena a = arena_new(2 * n * sizeof(float) + 128);
        float *dg = dev(&a, n), *du = dev(&a, n);

        fill_random(gate, n, 12.0f);
        fill_random(up, n, 3.0f);
        gate[0] = n > 1 ? -100.0f : 0.0f;
        lora_ref_silu_mul(want, gate, up, n);
        put(&a, dg, gate, n);
        put(&a, du, up, n);
        k_->silu_mul(be, dg, du, n);
        get(&a, got, dg, n);
        check_far("silu_mul", got, want, NULL, n);
        arena_free(&a);
        free(gate);
        free(up);
        free(got);
        free(want);
    }
}

static void case_add(void)
{
    static const size_t sizes[] = {1, 1003};

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *y = new_floats(n), *x = new_floats(n), *got = new_floats(n);
        double *want = new_doubles(n);
        struct arena a = arena_new(2 * n * sizeof(float) + 128);
        float *dy = dev(&a, n), *dx = dev(&a, n);
        int n_bad = 0;

        fill_random(y, n, 1.0f);
        fill_random(x, n, 1.0f);
        lora_ref_add(want, y, x, n);
        put(&a, dy, y, n);
        put(&a, dx, x, n);
        k_->add(be, dy, dx, n);
        get(&a, got, dy, n);
        for (size_t i = 0; i < n; i++)
            n_bad += got[i] != (float)want[i]; /* exact sums of two multiples of 2^-23 */
        CHECK(n_bad == 0);
        arena_free(&a);
        free(y);
        free(x);
        free(got);
        free(want);
    }
}

/* A (rows, kv_dim) cache of dtype dt, zero-filled, in a buffer of its own. */
static struct lora_tensor cache_new(int rows, int kv_dim)
{
    char err[256];
    struct lora_buffer *b =
        k_->buffer_alloc(be, lora_tensor_bytes(dt, rows, kv_dim), err, sizeof(err));

    if (!b) {
        printf("Bail out! %s\n", err);
        exit(1);
    }
    return (struct lora_tensor){b, 0, dt, rows, kv_dim};
}

/* Row r of cache c, downloaded and converted to float. */
static void cache_row(const struct lora_tensor *c, int r, float *dst)
{
    size_t bytes = lora_tensor_bytes(dt, c->rows, c->cols);
    char err[256], *host = xmalloc(bytes);

    if (k_->download(be, host, c->buf, c->offset, bytes, err, sizeof(err)) < 0) {
        printf("Bail out! %s\n", err);
        exit(1);
    }
    lora_tensor_row_to_f32(dt, host, c->rows, c->cols, r, dst);
    free(host);
}

/* Rounds (rows, cols) floats through dtype dt and back: the values a cache of dt holds. */
static void round_through(float *x, int rows, int cols)
{
    void *tmp = xmalloc(lora_tensor_bytes(dt, rows, cols));

    encode(dt, x, rows, cols, tmp);
    for (int r = 0; r < rows; r++)
        lora_tensor_row_to_f32(dt, tmp, rows, cols, r, x + (size_t)r * cols);
    free(tmp);
}

/* Ties (to even, in bf16 and in f16), subnormals of float32 and of f16, an f16 overflow,
 * infinity and NaN. */
static const float kv_specials[] = {1.00390625f, 1.01171875f, 1.00048828125f, 1.00146484375f,
                                    1e-40f,      -3e-6f,      65520.0f,       -INFINITY,
                                    NAN,         -0.0f,       3.0e38f,        -1e-45f};

static void case_kv_write(void)
{
    static const int kv_dims[] = {1, 16, 37};
    enum { ROWS = 24, M = 9 };

    for (size_t di = 0; di < sizeof(kv_dims) / sizeof(kv_dims[0]); di++) {
        int kv_dim = kv_dims[di];
        struct lora_tensor kc = cache_new(ROWS, kv_dim), vc = cache_new(ROWS, kv_dim);
        float *k = new_floats((size_t)M * kv_dim), *v = new_floats((size_t)M * kv_dim);
        float *row = new_floats((size_t)kv_dim);
        struct arena a = arena_new(2 * (size_t)M * kv_dim * sizeof(float) + 128);
        float *dk = dev(&a, (size_t)M * kv_dim), *dv = dev(&a, (size_t)M * kv_dim);
        int slot[M], n_bad = 0, used[ROWS] = {0};

        for (int i = 0; i < M; i++) {
            slot[i] = (i * 7 + 3) % ROWS; /* scattered, distinct */
            used[slot[i]] = 1;
        }
        fill_random(k, (size_t)M * kv_dim, 1.0f);
        fill_random(v, (size_t)M * kv_dim, 1.0f);
        if (kv_dim >= 16) /* what rounding must get right, in a row's first vectors */
            memcpy(k, kv_specials, sizeof(kv_specials));
        put(&a, dk, k, (size_t)M * kv_dim);
        put(&a, dv, v, (size_t)M * kv_dim);
        /* The cache holds each value rounded to its dtype to nearest even, as dtype.c does. */
        round_through(k, M, kv_dim);
        round_through(v, M, kv_dim);
        k_->kv_write(be, &kc, &vc, dk, dv, slot, M);
        for (int i = 0; i < M; i++) {
            cache_row(&kc, slot[i], row);
            n_bad += memcmp(row, k + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float)) != 0;
            cache_row(&vc, slot[i], row);
            n_bad += memcmp(row, v + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float)) != 0;
        }
        for (int r = 0; r < ROWS; r++) { /* every other row stays zero */
            if (used[r])
                continue;
            cache_row(&kc, r, row);
            for (int c = 0; c < kv_dim; c++)
                n_bad += row[c] != 0.0f;
        }
        if (n_bad)
            printf("# kv_dim=%d: %d rows wrong\n", kv_dim, n_bad);
        CHECK(n_bad == 0);
        arena_free(&a);
        k_->buffer_free(be, kc.buf);
        k_->buffer_free(be, vc.buf);
        free(k);
        free(v);
        free(row);
    }
}

/* Attention of sequences (pos, n_rows) over caches written through kv_write, against the twin
 * over the same keys and values, contiguous. */
static void attention_case(int block_size, int n_heads, int n_kv_heads, int head_dim)
{
    /* (context before, rows): prefill chunks and decodes, one long enough that the kernels fetch
     * rows ahead of their loops */
    static const int specs[][2] = {{0, 9}, {7, 5}, {20, 1}, {0, 1}, {16, 16}, {33, 1}, {150, 2}};
    enum { N_SEQS = sizeof(specs) / sizeof(specs[0]) };
    int kv_dim = n_kv_heads * head_dim, q_dim = n_heads * head_dim, group = n_heads / n_kv_heads;
    int n_rows = 0, max_ctx = 0, n_blocks = 0, first_block[N_SEQS], first_row[N_SEQS];
    int *tables[N_SEQS];
    float *kseq[N_SEQS], *vseq[N_SEQS];

    for (int s = 0; s < N_SEQS; s++) {
        int ctx = specs[s][0] + specs[s][1];
        first_row[s] = n_rows;
        first_block[s] = n_blocks;
        n_rows += specs[s][1];
        n_blocks += (ctx + block_size - 1) / block_size;
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
    }
    n_blocks += 2;
    struct lora_tensor kc = cache_new(n_blocks * block_size, kv_dim);
    struct lora_tensor vc = cache_new(n_blocks * block_size, kv_dim);
    struct lora_attn_seq seqs[N_SEQS];
    size_t n_out = (size_t)n_rows * q_dim;
    size_t scratch = k_->scratch_bytes(be, LORA_KERNEL_ATTENTION, n_rows, max_ctx, 0);
    struct arena a =
        arena_new((2 * n_out + 2 * (size_t)max_ctx * kv_dim) * sizeof(float) + scratch + 512);
    float *dq = dev(&a, n_out), *dout = dev(&a, n_out);
    float *dk = dev(&a, (size_t)max_ctx * kv_dim), *dv = dev(&a, (size_t)max_ctx * kv_dim);
    void *dscratch = dev(&a, scratch / sizeof(float) + 1);
    float *q = new_floats(n_out), *out = new_floats(n_out);
    double *want = new_doubles(n_out), *scores = new_doubles((size_t)max_ctx);
    int *slots = xmalloc(sizeof(int) * (size_t)max_ctx);

    for (int s = 0; s < N_SEQS; s++) {
        int ctx = specs[s][0] + specs[s][1], nb = (ctx + block_size - 1) / block_size;
        /* Blocks in reverse order, after those of the sequences before: not contiguous. */
        tables[s] = xmalloc(sizeof(int) * (size_t)nb);
        for (int b = 0; b < nb; b++)
            tables[s][b] = first_block[s] + nb - 1 - b;
        kseq[s] = new_floats((size_t)ctx * kv_dim);
        vseq[s] = new_floats((size_t)ctx * kv_dim);
        fill_random(kseq[s], (size_t)ctx * kv_dim, 1.0f);
        fill_random(vseq[s], (size_t)ctx * kv_dim, 1.0f);
        round_through(kseq[s], ctx, kv_dim);
        round_through(vseq[s], ctx, kv_dim);
        for (int p = 0; p < ctx; p++)
            slots[p] = tables[s][p / block_size] * block_size + p % block_size;
        put(&a, dk, kseq[s], (size_t)ctx * kv_dim);
        put(&a, dv, vseq[s], (size_t)ctx * kv_dim);
        k_->kv_write(be, &kc, &vc, dk, dv, slots, ctx);
        seqs[s] = (struct lora_attn_seq){first_row[s], specs[s][1], specs[s][0], tables[s]};
    }
    fill_random(q, n_out, 2.0f);
    put(&a, dq, q, n_out);
    k_->attention(be, dout, dq, &kc, &vc, seqs, N_SEQS, n_heads, n_kv_heads, head_dim, block_size,
                  dscratch, max_ctx);
    get(&a, out, dout, n_out);
    for (int s = 0; s < N_SEQS; s++) {
        for (int r = 0; r < specs[s][1]; r++) {
            size_t row = (size_t)(first_row[s] + r);
            for (int h = 0; h < n_heads; h++) {
                size_t off = row * q_dim + (size_t)h * head_dim;
                lora_ref_attend(want + off, q + off, kseq[s], vseq[s], specs[s][0] + r,
                                (h / group) * head_dim, kv_dim, head_dim, scores);
            }
        }
    }
    char what[96];
    snprintf(what, sizeof(what), "block_size=%d heads=%d/%d head_dim=%d", block_size, n_heads,
             n_kv_heads, head_dim);
    check_far(what, out, want, NULL, n_out);
    /* Batch invariance: each row alone, as decoding computes it, gives the batch's bits. */
    int n_diff = 0;
    float *alone = new_floats((size_t)q_dim);
    for (int s = 0; s < N_SEQS; s++) {
        for (int r = 0; r < specs[s][1]; r++) {
            size_t off = (size_t)(first_row[s] + r) * q_dim;
            struct lora_attn_seq one = {0, 1, specs[s][0] + r, tables[s]};
            k_->attention(be, dout, dq + off, &kc, &vc, &one, 1, n_heads, n_kv_heads, head_dim,
                          block_size, dscratch, max_ctx);
            get(&a, alone, dout, (size_t)q_dim);
            n_diff += memcmp(alone, out + off, (size_t)q_dim * sizeof(float)) != 0;
        }
    }
    free(alone);
    if (n_diff)
        fprintf(stderr, "# %s: %d rows alone differ from the batch\n", what, n_diff);
    CHECK(n_diff == 0);
    for (int s = 0; s < N_SEQS; s++) {
        free(tables[s]);
        free(kseq[s]);
        free(vseq[s]);
    }
    arena_free(&a);
    k_->buffer_free(be, kc.buf);
    k_->buffer_free(be, vc.buf);
    free(q);
    free(out);
    free(want);
    free(scores);
    free(slots);
}

static void case_attention(void)
{
    attention_case(16, 4, 2, 16);
    attention_case(5, 4, 1, 6);
    attention_case(1, 3, 3, 8);
    /* The heads AVX-512 takes 16 lanes at a time, all the query heads of a KV head (up to 8) in
     * one pass, their sums of v 256 values at a time: 14 over 2 KV heads (the 0.5B model's: 7,
     * summed 4 and 3 at a time), 16 over 1 (passes of 8), 4 over 1 and 3 over 1 of 128 values
     * (summed 2 and 2, 2 and 1), 2 over 2 (1). */
    attention_case(16, 14, 2, 64);
    attention_case(4, 16, 1, 64);
    attention_case(20, 4, 1, 128); /* blocks of 20: a block's second group of positions is 4 */
    attention_case(7, 3, 1, 128);
    attention_case(3, 2, 2, 128);
}

static void sgmv_case(int in, int out)
{
    enum { ROWS = 16, N_SEGS = 5, MAX_RANK = 16 };
    /* {row, n_rows, rank}, not in row order; rows 3, 4, 9, 13 belong to no segment. */
    static const int layout[N_SEGS][3] = {
        {5, 4, 16}, {0, 3, 4}, {10, 1, 1}, {14, 2, 4}, {11, 2, 3},
    };
    static const float scales[N_SEGS] = {0.5f, 2.0f, -1.25f, 0.125f, 3.0f};
    struct lora_sgmv_seg segs[N_SEGS];
    struct weight wa[N_SEGS], wb[N_SEGS];
    size_t nx = (size_t)ROWS * in, ny = (size_t)ROWS * out;
    float *x = new_floats(nx), *y0 = new_floats(ny), *y = new_floats(ny), *x_after = new_floats(nx);
    float *alone = new_floats((size_t)out);
    double *want = new_doubles((size_t)out), *mag = new_doubles((size_t)out);
    size_t scratch = k_->scratch_bytes(be, LORA_KERNEL_LORA_SGMV, ROWS, 0, MAX_RANK);
    struct arena a = arena_new((nx + ny) * sizeof(float) + scratch + 256);
    float *dx = dev(&a, nx), *dy = dev(&a, ny);
    void *dtmp = dev(&a, scratch / sizeof(float) + 1);
    bool in_seg[ROWS] = {false};
    char what[96];

    fill_random(x, nx, 1.0f);
    fill_random(y0, ny, 1.0f);
    for (int s = 0; s < N_SEGS; s++) {
        /* Tensors of MAX_RANK rows, of which the segment uses its rank: as a slot holds them. */
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
            snprintf(what, sizeof(what), "in=%d out=%d segment %d row %zu", in, out, s, row);
            check_far(what, y + row * out, want, mag, (size_t)out);
        }
    }
    for (int r = 0; r < ROWS; r++)
        if (!in_seg[r])
            CHECK(memcmp(y + (size_t)r * out, y0 + (size_t)r * out, (size_t)out * 4) == 0);
    CHECK(memcmp(x, x_after, nx * sizeof(float)) == 0);
    /* Batch invariance: each row as the only row of its segment, the only segment of the call,
     * gives the batch's bits. */
    int n_bad = 0;
    for (int s = 0; s < N_SEGS; s++) {
        for (int r = 0; r < layout[s][1]; r++) {
            struct lora_sgmv_seg one = segs[s];
            one.row = layout[s][0] + r;
            one.n_rows = 1;
            put(&a, dy, y0, ny);
            k_->lora_sgmv(be, dy, dx, &one, 1, in, out, dtmp, MAX_RANK);
            get(&a, alone, dy + (size_t)one.row * out, (size_t)out);
            n_bad += memcmp(alone, y + (size_t)one.row * out, (size_t)out * 4) != 0;
        }
    }
    if (n_bad)
        printf("# in=%d out=%d: %d rows differ alone\n", in, out, n_bad);
    CHECK(n_bad == 0);
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

static void case_lora_sgmv(void)
{
    sgmv_case(37, 29);
    sgmv_case(96, 257);
}

/* Ranks 0 (this process) and 1 (a child) sum their buffers; both must get the twin's sum, the
 * same bits. */
static void case_allreduce(void)
{
    enum { N = 1001 };
    char name[64], err[256];
    float *mine = new_floats(N), *theirs = new_floats(N), *got = new_floats(N);
    float *child_got = new_floats(N);
    double *want = new_doubles(N);
    int fds[2];

    snprintf(name, sizeof(name), "/lora-test-backend-%ld", (long)getpid());
    fill_random(mine, N, 1.0f);
    fill_random(theirs, N, 1.0f);
    const float *bufs[2] = {mine, theirs};
    lora_ref_allreduce(want, bufs, 2, N);
    if (pipe(fds) < 0) {
        printf("Bail out! pipe: %s\n", strerror(errno));
        exit(1);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* rank 1 */
        struct lora_collective *c = k_->collective_open(be, name, 1, 2, N, 5000, err, sizeof(err));
        struct arena a = arena_new(N * sizeof(float));
        float *d = dev(&a, N);
        int ok = c != NULL;
        put(&a, d, theirs, N);
        ok = ok && k_->allreduce_sum(be, c, d, N) == 0;
        get(&a, child_got, d, N);
        ok = ok && write(fds[1], child_got, N * sizeof(float)) == (ssize_t)(N * sizeof(float));
        k_->collective_close(be, &c);
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    struct lora_collective *c = k_->collective_open(be, name, 0, 2, N, 5000, err, sizeof(err));
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
    while (n_read < N * sizeof(float) &&
           (r = read(fds[0], (char *)child_got + n_read, N * sizeof(float) - n_read)) > 0)
        n_read += (size_t)r;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(n_read == N * sizeof(float));
    int n_bad = 0;
    for (int i = 0; i < N; i++)
        n_bad += got[i] != (float)want[i]; /* one addition: exact to float rounding */
    CHECK(n_bad == 0);
    CHECK(memcmp(got, child_got, N * sizeof(float)) == 0);
    k_->collective_close(be, &c);
    CHECK(c == NULL);
    arena_free(&a);
    free(mine);
    free(theirs);
    free(got);
    free(child_got);
    free(want);
}

/* ---- the twins' own input ---- */

/* The twins read every compute dtype as backend.h lays it out: lora_ref_at and
 * lora_tensor_row_to_f32 agree (to float rounding), and each value is its source within the dtype's
 * rounding (F32 exact, BF16 2^-8 and F16 2^-11 relative, I8 half a step of its row's scale). */
static void check_ref_dtypes(void)
{
    enum { ROWS = 3, COLS = 2 * LORA_I8_GROUP + LORA_I8_GROUP / 2 + 5 }; /* the last group short */
    float src[ROWS * COLS], row[COLS];
    int n_bad = 0;

    fill_random(src, ROWS * COLS, 1.0f);
    src[5] = 0.0f;
    for (size_t di = 0; di < sizeof(compute_dtypes) / sizeof(compute_dtypes[0]); di++) {
        enum lora_dtype d = compute_dtypes[di];
        void *host = xmalloc(lora_tensor_bytes(d, ROWS, COLS));
        struct lora_ref_w w = {d, host, ROWS, COLS};

        encode(d, src, ROWS, COLS, host);
        for (int r = 0; r < ROWS; r++) {
            CHECK(lora_tensor_row_to_f32(d, host, ROWS, COLS, r, row) == 0);
            for (int c = 0; c < COLS; c++) {
                int g0 = c / LORA_I8_GROUP * LORA_I8_GROUP;
                float max = 0; /* of the value's I8 group */
                for (int t = g0; t < COLS && t < g0 + LORA_I8_GROUP; t++)
                    max = fmaxf(max, fabsf(src[r * COLS + t]));
                double x = src[r * COLS + c], got = lora_ref_at(&w, r, c);
                double tol = d == LORA_DTYPE_F32    ? 0
                             : d == LORA_DTYPE_BF16 ? 0x1p-8 * fabs(x)
                             : d == LORA_DTYPE_F16  ? 0x1p-11 * fabs(x) + 0x1p-24
                                                    : max / 127.0 * (0.5 + 127 * 0x1p-23);
                /* I8's q * scale is exact in the twin, rounded once in a float row. */
                n_bad += fabs(got - row[c]) > 0x1p-24 * fabs(got) || !(fabs(got - x) <= tol);
            }
        }
        if (n_bad)
            printf("# %s: %d values read wrong\n", lora_dtype_name(d), n_bad);
        free(host);
    }
    CHECK(n_bad == 0);
    CHECK(lora_tensor_bytes(LORA_DTYPE_I8, ROWS, COLS) ==
          ROWS * 3 * LORA_I8_GROUP + ROWS * 3 * sizeof(float));
    CHECK(lora_tensor_bytes(LORA_DTYPE_I8, 2, LORA_I8_GROUP) == 2 * LORA_I8_GROUP + 2 * 4);
    CHECK(lora_tensor_bytes(LORA_DTYPE_I8, 2, 1) == 2 * LORA_I8_GROUP + 2 * 4);
    CHECK(lora_tensor_bytes(LORA_DTYPE_BF16, ROWS, COLS) == ROWS * COLS * 2);
    CHECK(lora_tensor_row_to_f32(LORA_DTYPE_I32, src, ROWS, COLS, 0, row) == -1);
}

/* lora_quantize_i8 from each source dtype: byte for byte its twin's quantization of the
 * (widened) source, each value back within half a step of its group's scale, all-zero groups
 * and rows (scale 0, no NaN), short last groups, a tensor large enough to be split over threads,
 * and the refusals. */
static void check_quantize_i8(void)
{
    /* The layout's order: each row's offsets are a permutation of its bytes, and in a row of 20
     * groups (a block of 16, then one of 4) four bytes of each group follow each other. */
    static const int64_t layout_cols[] = {
        1, 37, LORA_I8_GROUP, 16 * LORA_I8_GROUP, 17 * LORA_I8_GROUP + 5, 40 * LORA_I8_GROUP};
    for (size_t li = 0; li < sizeof(layout_cols) / sizeof(layout_cols[0]); li++) {
        int64_t cols = layout_cols[li], rb = lora_i8_row_bytes(cols);
        char *seen = calloc((size_t)rb, 1);
        int dup = 0;
        for (int64_t c = 0; c < rb; c++) {
            int64_t o = lora_i8_offset(cols, c);
            dup += o < 0 || o >= rb || seen[o]++;
        }
        CHECK(dup == 0);
        free(seen);
    }
    const int64_t g = LORA_I8_GROUP, c20 = 20 * g;
    CHECK(lora_i8_offset(c20, 3) == 3 && lora_i8_offset(c20, 4) == 64);
    CHECK(lora_i8_offset(c20, g) == 4 && lora_i8_offset(c20, 15 * g + 6) == 60 + 64 + 2);
    CHECK(lora_i8_offset(c20, 16 * g) == 16 * g && lora_i8_offset(c20, 16 * g + 4) == 16 * g + 16);
    CHECK(lora_i8_offset(c20, 17 * g + 1) == 16 * g + 5);

    static const int shapes[][2] = {{3, 37}, {4, LORA_I8_GROUP}, {5, 2 * LORA_I8_GROUP + 2}, {2, 1},
                                    {0, 10}, {300, 4000}};
    static const enum lora_dtype srcs[] = {LORA_DTYPE_F32, LORA_DTYPE_BF16, LORA_DTYPE_F16};
    int n_bad = 0;

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int rows = shapes[si][0], cols = shapes[si][1];
        size_t n = (size_t)rows * cols, bytes = lora_tensor_bytes(LORA_DTYPE_I8, rows, cols);
        int n_groups = (int)lora_i8_groups(cols);
        float *x = new_floats(n), *deq = new_floats((size_t)cols);
        float *scales = new_floats((size_t)n_groups);
        signed char *q = xmalloc((size_t)cols);
        uint16_t *half = xmalloc(n * sizeof(uint16_t));
        char *dst = xmalloc(bytes);

        fill_random(x, n, 4.0f);
        if (rows > 1) { /* an all-zero row, and an all-zero group in another */
            memset(x + (size_t)cols, 0, (size_t)cols * sizeof(float));
            for (int c = 0; c < cols && c < LORA_I8_GROUP; c++)
                x[c] = c % 2 ? 0.0f : -0.0f;
        }
        for (size_t di = 0; di < sizeof(srcs) / sizeof(srcs[0]); di++) {
            enum lora_dtype d = srcs[di];
            const void *src = x;
            if (d != LORA_DTYPE_F32) {
                for (size_t i = 0; i < n; i++)
                    half[i] = d == LORA_DTYPE_BF16 ? lora_f32_to_bf16(x[i]) : lora_f32_to_f16(x[i]);
                src = half;
            }
            CHECK(lora_quantize_i8(d, src, rows, cols, dst) == 0);
            size_t row_bytes = (size_t)lora_i8_row_bytes(cols);
            const char *all_scales = dst + (size_t)rows * row_bytes;
            for (int r = 0; r < rows; r++) {
                float *wide = new_floats((size_t)cols);
                if (d == LORA_DTYPE_F32)
                    memcpy(wide, x + (size_t)r * cols, (size_t)cols * sizeof(float));
                else
                    lora_dtype_to_f32(d, half + (size_t)r * cols, wide, (size_t)cols);
                lora_ref_quantize_row(wide, cols, q, scales);
                const signed char *qr = (const signed char *)dst + (size_t)r * row_bytes;
                for (int c = 0; c < cols; c++)
                    n_bad += q[c] != qr[lora_i8_offset(cols, c)];
                for (size_t c = (size_t)cols; c < row_bytes; c++) /* the padding: zeros */
                    n_bad += qr[lora_i8_offset(cols, (int64_t)c)] != 0;
                n_bad += memcmp(scales, all_scales + (size_t)r * n_groups * 4,
                                (size_t)n_groups * 4) != 0;
                lora_tensor_row_to_f32(LORA_DTYPE_I8, dst, rows, cols, r, deq);
                for (int c = 0; c < cols; c++) {
                    /* Half a step, and the float roundings of x / s and q * s (|q| <= 127). */
                    double s = scales[c / LORA_I8_GROUP], tol = s * (0.5 + 127 * 0x1p-23);
                    n_bad += !(fabs((double)deq[c] - wide[c]) <= tol);
                    n_bad += isnan(deq[c]) || (s == 0 && deq[c] != 0.0f);
                }
                free(wide);
            }
        }
        if (rows > 1) {
            float s;
            memcpy(&s, dst + (size_t)rows * (size_t)lora_i8_row_bytes(cols) + (size_t)n_groups * 4,
                   sizeof(s));
            CHECK(s == 0.0f); /* the zero row's first scale */
        }
        if (n_bad)
            printf("# quantize (%d, %d): %d values wrong\n", rows, cols, n_bad);
        free(x);
        free(deq);
        free(scales);
        free(q);
        free(half);
        free(dst);
    }
    CHECK(n_bad == 0);
    float bad_src[4] = {1.0f, NAN, 2.0f, 3.0f};
    char out[LORA_I8_GROUP + 4];
    CHECK(lora_quantize_i8(LORA_DTYPE_F32, bad_src, 1, 4, out) == -1);
    bad_src[1] = INFINITY;
    CHECK(lora_quantize_i8(LORA_DTYPE_F32, bad_src, 1, 4, out) == -1);
    bad_src[1] = 0.5f;
    CHECK(lora_quantize_i8(LORA_DTYPE_F32, bad_src, 1, 4, out) == 0);
    CHECK(lora_quantize_i8(LORA_DTYPE_I32, bad_src, 1, 4, out) == -1);
    CHECK(lora_quantize_i8(LORA_DTYPE_I8, bad_src, 1, 4, out) == -1);
    CHECK(lora_quantize_i8(LORA_DTYPE_F32, bad_src, -1, 4, out) == -1);
}

/* ---- the matrix ---- */

static void (*const cases[LORA_KERNEL_COUNT])(void) = {
    [LORA_KERNEL_MATMUL] = case_matmul,
    [LORA_KERNEL_ADD_BIAS] = case_add_bias,
    [LORA_KERNEL_EMBED] = case_embed,
    [LORA_KERNEL_RMSNORM] = case_rmsnorm,
    [LORA_KERNEL_ROPE] = case_rope,
    [LORA_KERNEL_SILU_MUL] = case_silu_mul,
    [LORA_KERNEL_ADD] = case_add,
    [LORA_KERNEL_KV_WRITE] = case_kv_write,
    [LORA_KERNEL_ATTENTION] = case_attention,
    [LORA_KERNEL_LORA_SGMV] = case_lora_sgmv,
    [LORA_KERNEL_ALLREDUCE] = case_allreduce,
};

/* Operations on activations alone take no tensor: they are run once, as F32. */
static bool takes_tensor(enum lora_kernel op)
{
    return op != LORA_KERNEL_ROPE && op != LORA_KERNEL_SILU_MUL && op != LORA_KERNEL_ADD &&
           op != LORA_KERNEL_ALLREDUCE;
}

static void report(bool ok, const char *name, const char *skip)
{
    check_n_run++;
    if (!ok)
        check_n_failed++;
    if (skip)
        printf("ok %d - %s # skip %s\n", check_n_run, name, skip);
    else
        printf("%s %d - %s\n", ok ? "ok" : "not ok", check_n_run, name);
    fflush(stdout);
}

/* Opens device (with the environment as it is) and runs every operation and dtype on it, the
 * tests named after label. Returns the backend's description in desc. */
static void run_device(const char *device, const char *label, char *desc, size_t desc_len)
{
    char err[512], name[96];

    be = lora_backend_open(device, err, sizeof(err));
    if (!be) {
        for (int op = 0; op < LORA_KERNEL_COUNT; op++) {
            snprintf(name, sizeof(name), "%s %s", label, lora_kernel_name(op));
            report(true, name, err);
        }
        return;
    }
    k_ = be->ops;
    snprintf(desc, desc_len, "%s", be->description);
    printf("# %s: %s\n", label, be->description);
    for (int op = 0; op < LORA_KERNEL_COUNT; op++) {
        char unsupported[96] = "";
        for (size_t di = 0; di < sizeof(compute_dtypes) / sizeof(compute_dtypes[0]); di++) {
            dt = compute_dtypes[di];
            if (!takes_tensor(op) && dt != LORA_DTYPE_F32)
                continue;
            if (!k_->supports(be, op, dt)) {
                size_t len = strlen(unsupported);
                snprintf(unsupported + len, sizeof(unsupported) - len, " %s", lora_dtype_name(dt));
                continue;
            }
            snprintf(name, sizeof(name), "%s %s %s", label, lora_kernel_name(op),
                     lora_dtype_name(dt));
            check_cur_failed = 0;
            cases[op]();
            report(!check_cur_failed, name, NULL);
        }
        if (*unsupported)
            printf("# %s %s: not supported:%s\n", label, lora_kernel_name(op), unsupported);
    }
    lora_backend_close(&be);
}

/* The CPU backend again on each narrower path this machine can take (the environment switches
 * of backend/cpu/kernels_cpu.h): AVX-512 without AMX, without its bf16 dot and int8
 * instructions, then AVX2. A path the machine is already on is not run twice. */
static const struct {
    const char *label;
    const char *env[2];
} cpu_paths[] = {
    {"cpu/no-amx", {"LORA_NO_AMX", NULL}},
    {"cpu/no-bf16-vnni", {"LORA_NO_AVX512_BF16", "LORA_NO_AVX512_VNNI"}},
    {"cpu/avx2", {"LORA_NO_AVX512", NULL}},
};

int main(void)
{
    char desc[160] = "", seen[160] = "";

    check_cur_failed = 0;
    check_ref_dtypes();
    report(!check_cur_failed, "ref twins read F32 BF16 F16 I8", NULL);
    check_cur_failed = 0;
    check_quantize_i8();
    report(!check_cur_failed, "lora_quantize_i8 F32 BF16 F16", NULL);
    for (size_t i = 0; i < sizeof(devices) / sizeof(devices[0]); i++)
        run_device(devices[i], devices[i], i == 0 ? seen : desc, sizeof(desc));
    for (size_t p = 0; p < sizeof(cpu_paths) / sizeof(cpu_paths[0]); p++) {
        for (int e = 0; e < 2; e++)
            if (cpu_paths[p].env[e])
                setenv(cpu_paths[p].env[e], "1", 1);
        char err[256];
        struct lora_backend *probe = lora_backend_open("cpu", err, sizeof(err));
        bool same = probe && strcmp(probe->description, seen) == 0;
        lora_backend_close(&probe);
        if (same)
            printf("# %s: the same paths as before, not run again\n", cpu_paths[p].label);
        else
            run_device("cpu", cpu_paths[p].label, seen, sizeof(seen));
    }
    return check_done();
}
