/* Unit tests for the CPU backend (backend/cpu, through backend/backend.h's table) and
 * lib/runtime/kv_cache: every kernel against the double-precision twins of backend/ref (never
 * against another kernel), matmul batch invariance bit for bit across batch sizes, row positions
 * and thread counts in every weight dtype and mode, kv_write + attention over a shuffled paged
 * cache with grouped-query heads, the multi-LoRA SGMV, and the cache's storage.
 * tests/backend/test_backend.c runs the same twins over every backend; this file holds what is the
 * CPU's own: thread counts, NaN guards, in-place calls, exact sums.
 */
#include "check.h"
#include "backend/backend.h"
#include "backend/ref/ref.h"
#include "fixture.h"
#include "runtime/kv_cache.h"

#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Relative tolerance against the double references: an error bound of the form
 * REL_TOL * (1 + magnitude of the terms summed). */
#define REL_TOL 1e-5

/* ---- helpers ---- */

#define TEST_RANDOM_SEED 0x243f6a8885a308d3ULL
#include "tests/common/test_random.h"

/* Uniform in [0, n). */
static int rng_int(int n)
{
    return (int)(rng_next() % (uint64_t)n);
}

static void fill_random(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_uniform();
}

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

static bool all_nan(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isnan(x[i]))
            return false;
    return true;
}

static void shuffle_ints(int *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = rng_int(i + 1), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- the backend ---- */

static struct lora_backend *be;
static const struct lora_backend_ops *k_;

#define MAX_WRAPS 64
static struct lora_buffer *wraps[MAX_WRAPS];
static int n_wraps;

/* A float32 (rows, cols) tensor over host memory p, in place (freed by release_tensors). */
static struct lora_tensor tensor_of(const float *p, int64_t rows, int64_t cols)
{
    char err[256];
    struct lora_buffer *b = n_wraps < MAX_WRAPS
                                ? k_->buffer_wrap(be, (void *)p, (size_t)(rows * cols) * 4, err,
                                                  sizeof(err))
                                : NULL;

    if (!b) {
        printf("Bail out! unable to wrap a tensor\n");
        exit(1);
    }
    wraps[n_wraps++] = b;
    return (struct lora_tensor){b, 0, LORA_DTYPE_F32, rows, cols};
}

static void release_tensors(void)
{
    while (n_wraps > 0)
        k_->buffer_free(be, wraps[--n_wraps]);
}

/* The same weight for backend/ref. */
static struct lora_ref_w ref_of(const float *p, int64_t rows, int64_t cols)
{
    return (struct lora_ref_w){LORA_DTYPE_F32, p, rows, cols};
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

/* ---- matmul ---- */

#define MM_GUARD 16 /* floats after y that must stay untouched */

static void test_matmul(void)
{
    static const int ks[] = {1, 7, 8, 9, 64, 100, 896};
    static const int ns[] = {1, 3, 4, 5, 128, 300};
    static const int ms[] = {1, 2, 3, 5, 17, 64};
    const int max_k = 896, max_n = 300, max_m = 64;
    float *x = new_floats((size_t)max_m * max_k);  /* (m, k) */
    float *w = new_floats((size_t)max_n * max_k);  /* (n, k) */
    float *y0 = new_floats((size_t)max_m * max_n); /* (m, n) */
    float *y = new_floats((size_t)max_m * max_n + MM_GUARD);
    double *dot = new_doubles((size_t)max_m * max_n), *absdot = new_doubles((size_t)max_m * max_n);
    double *want = new_doubles((size_t)max_m * max_n), *mag = new_doubles((size_t)max_m * max_n);

    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
            for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
                int k = ks[ki], n = ns[ni], m = ms[mi];
                size_t mn = (size_t)m * n;
                fill_random(x, (size_t)m * k, 1.0f);
                fill_random(w, (size_t)n * k, 1.0f);
                fill_random(y0, mn, 2.0f);
                struct lora_ref_w rw = ref_of(w, n, k);
                struct lora_tensor tw = tensor_of(w, n, k);
                lora_ref_matmul(dot, absdot, x, &rw, m);
                /* Modes: plain; accumulate with alpha; overwrite with alpha (y starts as NaN,
                 * so a kernel that read y without accumulate would show). */
                for (int mode = 0; mode < 3; mode++) {
                    bool acc = mode == 1;
                    float alpha = mode == 0 ? 1.0f : mode == 1 ? -0.75f : 3.5f;
                    if (acc)
                        memcpy(y, y0, mn * sizeof(float));
                    else
                        fill_nan(y, mn);
                    fill_nan(y + mn, MM_GUARD);
                    k_->matmul(be, y, x, &tw, m, alpha, acc);
                    for (size_t i = 0; i < mn; i++) {
                        want[i] = alpha * dot[i] + (acc ? y0[i] : 0.0);
                        mag[i] = fabs(alpha) * absdot[i] + (acc ? fabs(y0[i]) : 0.0);
                    }
                    long bad = first_far(y, want, mag, mn, REL_TOL);
                    if (bad >= 0) {
                        printf("# matmul m=%d n=%d k=%d alpha=%g acc=%d: element (%ld, %ld)\n", m,
                               n, k, (double)alpha, acc, bad / n, bad % n);
                        CHECK_NEAR(y[bad], want[bad], REL_TOL * (1.0 + mag[bad]));
                    }
                    CHECK(all_nan(y + mn, MM_GUARD));
                }
                release_tensors();
            }
        }
    }
    free(x);
    free(w);
    free(y0);
    free(y);
    free(dot);
    free(absdot);
    free(want);
    free(mag);
}

/* Batch invariance. Every row of a fixed x (BI_ROWS, k) computed alone (m = 1, one thread) is the
 * reference; a batch of m rows takes rows off, off + 1, ... (mod BI_ROWS) of x, so across batch
 * sizes each row lands at many positions (first, last, alone in a tile of one when m is odd), and
 * every row of the result must be the same bits as alone. */
#define BI_ROWS  70
#define BI_ALPHA -0.5f /* alpha of the accumulating batches */

struct bi_case {
    int k, n;
    float *x;         /* (BI_ROWS, k) */
    float *w;         /* (n, k) */
    float *y_init;    /* (BI_ROWS, n): where accumulating rows start */
    float *alone;     /* (BI_ROWS, n): x · wᵀ row by row */
    float *alone_acc; /* (BI_ROWS, n): y_init + BI_ALPHA · x · wᵀ row by row */
    float *xb, *yb;   /* (BI_ROWS, k), (BI_ROWS, n): the batch */
    struct lora_tensor tw; /* w */
};

/* Runs the batch of m rows starting at row off; returns how many rows differ from alone. */
static int bi_mismatches(struct bi_case *c, int m, int off, bool acc)
{
    size_t k = (size_t)c->k, n = (size_t)c->n;
    int n_bad = 0;

    for (int i = 0; i < m; i++) {
        int r = (i + off) % BI_ROWS;
        memcpy(c->xb + i * k, c->x + r * k, k * sizeof(float));
        memcpy(c->yb + i * n, c->y_init + r * n, n * sizeof(float));
    }
    k_->matmul(be, c->yb, c->xb, &c->tw, m, acc ? BI_ALPHA : 1.0f, acc);
    for (int i = 0; i < m; i++) {
        int r = (i + off) % BI_ROWS;
        const float *want = (acc ? c->alone_acc : c->alone) + r * n;
        if (memcmp(c->yb + i * n, want, n * sizeof(float)) != 0) {
            if (n_bad == 0)
                printf("# %s k=%d n=%d threads=%d m=%d acc=%d: batch row %d (x row %d) differs\n",
                       lora_dtype_name(c->tw.dtype), c->k, c->n, omp_get_max_threads(), m, acc, i,
                       r);
            n_bad++;
        }
    }
    return n_bad;
}

/* The weight dtypes and modes of the matmul (backend.h): each is batch-invariant alone. */
static const struct {
    enum lora_dtype dtype;
    bool fast;
} bi_modes[] = {{LORA_DTYPE_F32, false},
                {LORA_DTYPE_BF16, false},
                {LORA_DTYPE_BF16, true},
                {LORA_DTYPE_F16, false},
                {LORA_DTYPE_I8, false}};

/* w (n, k) in dtype, in a buffer of its own (freed by release_tensors). */
static struct lora_tensor typed_tensor_of(const float *w, int64_t n, int64_t k,
                                          enum lora_dtype dtype, void **host)
{
    size_t bytes = lora_tensor_bytes(dtype, n, k);
    char err[256];

    *host = xmalloc(bytes);
    if (dtype == LORA_DTYPE_I8)
        lora_quantize_i8(LORA_DTYPE_F32, w, n, k, *host);
    else if (dtype == LORA_DTYPE_F32)
        memcpy(*host, w, bytes);
    else
        for (size_t i = 0; i < (size_t)(n * k); i++)
            ((uint16_t *)*host)[i] =
                dtype == LORA_DTYPE_BF16 ? lora_f32_to_bf16(w[i]) : lora_f32_to_f16(w[i]);
    struct lora_buffer *b =
        n_wraps < MAX_WRAPS ? k_->buffer_wrap(be, *host, bytes, err, sizeof(err)) : NULL;
    if (!b) {
        printf("Bail out! unable to wrap a tensor\n");
        exit(1);
    }
    wraps[n_wraps++] = b;
    return (struct lora_tensor){b, 0, dtype, n, k};
}

/* With 2 threads the rows of w are split between threads (for k = 896: two panels), which must
 * not change a bit either; only some sizes, as a thread team is slow on a loaded machine. Every
 * dtype and mode of the matmul. k = 4500 makes rows longer than LORA_CPU_STREAM_ROW_BYTES in
 * every dtype, which one row of x reads four at a time, the shorter ones one at a time. */
static void test_matmul_batch_invariance(void)
{
    static const int shapes[][2] = {{64, 300}, {896, 128}, {100, 7}, {4500, 37}}; /* {k, n} */
    static const int ms_2_threads[] = {2, 3, 7, 16, 17, 33, 64, 69, 70};
    int saved_threads = omp_get_max_threads();

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]) * 5; si++) {
        struct bi_case c = {.k = shapes[si / 5][0], .n = shapes[si / 5][1]};
        size_t k = (size_t)c.k, n = (size_t)c.n;
        int n_bad = 0;
        void *host = NULL;

        c.x = new_floats(BI_ROWS * k);
        c.w = new_floats(n * k);
        c.y_init = new_floats(BI_ROWS * n);
        c.alone = new_floats(BI_ROWS * n);
        c.alone_acc = new_floats(BI_ROWS * n);
        c.xb = new_floats(BI_ROWS * k);
        c.yb = new_floats(BI_ROWS * n);
        fill_random(c.x, BI_ROWS * k, 1.0f);
        fill_random(c.w, n * k, 1.0f);
        fill_random(c.y_init, BI_ROWS * n, 1.0f);
        c.tw = typed_tensor_of(c.w, c.n, c.k, bi_modes[si % 5].dtype, &host);
        be->fast_matmul = bi_modes[si % 5].fast;

        omp_set_num_threads(1);
        memcpy(c.alone_acc, c.y_init, BI_ROWS * n * sizeof(float));
        for (size_t r = 0; r < BI_ROWS; r++) {
            k_->matmul(be, c.alone + r * n, c.x + r * k, &c.tw, 1, 1.0f, false);
            k_->matmul(be, c.alone_acc + r * n, c.x + r * k, &c.tw, 1, BI_ALPHA, true);
        }
        for (int m = 2; m <= BI_ROWS; m++)
            n_bad += bi_mismatches(&c, m, (m * 29) % BI_ROWS, m % 3 == 0);

        omp_set_num_threads(2);
        for (size_t r = 0; r < BI_ROWS; r += 23) {
            k_->matmul(be, c.yb, c.x + r * k, &c.tw, 1, 1.0f, false);
            n_bad += memcmp(c.yb, c.alone + r * n, n * sizeof(float)) != 0;
        }
        for (size_t mi = 0; mi < sizeof(ms_2_threads) / sizeof(ms_2_threads[0]); mi++) {
            int m = ms_2_threads[mi];
            n_bad += bi_mismatches(&c, m, (m * 13) % BI_ROWS, mi % 2 == 1);
        }
        if (n_bad)
            printf("# %s%s: %d rows differ\n", lora_dtype_name(bi_modes[si % 5].dtype),
                   bi_modes[si % 5].fast ? " fast" : "", n_bad);
        CHECK(n_bad == 0);

        be->fast_matmul = false;
        release_tensors();
        free(host);
        free(c.x);
        free(c.w);
        free(c.y_init);
        free(c.alone);
        free(c.alone_acc);
        free(c.xb);
        free(c.yb);
    }
    omp_set_num_threads(saved_threads);
}

/* At one row of x the threads take the rows of w in steps, each from its own run and then from
 * the others' (matmul_cpu.c): more threads than cores, so that some are descheduled and others
 * take their steps, must still take every step exactly once. y accumulates into NaN-free rows: a
 * step skipped leaves them unchanged, a step taken twice adds twice. A small call runs on one
 * thread, which then takes every other thread's run. */
static void test_matmul_one_row_steps(void)
{
    static const int shapes[][2] = {{256, 4001}, {896, 1203}, {64, 300}}; /* {k, n} */
    enum { MAX_T = 6 };
    int saved_threads = omp_get_max_threads();
    char err[256];

    omp_set_num_threads(MAX_T);
    struct lora_backend *own = lora_backend_open("cpu", err, sizeof(err));
    CHECK(own != NULL);
    for (size_t si = 0; own && si < sizeof(shapes) / sizeof(shapes[0]) * 5; si++) {
        int k = shapes[si / 5][0], n = shapes[si / 5][1], bad = 0;
        float *x = new_floats((size_t)k), *w = new_floats((size_t)n * k);
        float *y0 = new_floats((size_t)n), *want = new_floats((size_t)n),
              *y = new_floats((size_t)n);
        void *host = NULL;
        struct lora_backend *saved = be;

        fill_random(x, (size_t)k, 1.0f);
        fill_random(w, (size_t)n * k, 1.0f);
        fill_random(y0, (size_t)n, 1.0f);
        be = own;
        struct lora_tensor tw = typed_tensor_of(w, n, k, bi_modes[si % 5].dtype, &host);
        own->fast_matmul = bi_modes[si % 5].fast;
        omp_set_num_threads(1);
        memcpy(want, y0, (size_t)n * sizeof(float));
        own->ops->matmul(own, want, x, &tw, 1, BI_ALPHA, true);
        for (int t = 2; t <= MAX_T; t++)
            for (int rep = 0; rep < 8; rep++) {
                omp_set_num_threads(t);
                memcpy(y, y0, (size_t)n * sizeof(float));
                own->ops->matmul(own, y, x, &tw, 1, BI_ALPHA, true);
                bad += memcmp(y, want, (size_t)n * sizeof(float)) != 0;
            }
        if (bad)
            printf("# %s%s k=%d n=%d: %d of %d calls differ from one thread's\n",
                   lora_dtype_name(bi_modes[si % 5].dtype), bi_modes[si % 5].fast ? " fast" : "", k,
                   n, bad, 8 * (MAX_T - 1));
        CHECK(bad == 0);
        release_tensors();
        be = saved;
        free(host);
        free(x);
        free(w);
        free(y0);
        free(want);
        free(y);
    }
    lora_backend_close(&own);
    omp_set_num_threads(saved_threads);
}

/* matmul_shared: each weight's rows bit for bit what matmul gives it alone, in every dtype and
 * mode, at one row and several; the last weight is of another dtype (it goes alone). */
static void test_matmul_shared(void)
{
    static const int ns[] = {300, 128, 7, 40};
    static const int ms[] = {1, 2, 5, 17};
    enum { N_W = 4, MAX_M = 17 };

    CHECK(k_->matmul_shared != NULL);
    for (size_t si = 0; k_->matmul_shared && si < 2 * 5; si++) {
        int k = si / 5 ? 896 : 64, bad = 0;
        enum lora_dtype dt = bi_modes[si % 5].dtype;
        float *x = new_floats((size_t)MAX_M * k), *w[N_W], *want[N_W], *got[N_W];
        void *host[N_W];
        struct lora_tensor tw[N_W];

        fill_random(x, (size_t)MAX_M * k, 1.0f);
        for (int i = 0; i < N_W; i++) {
            enum lora_dtype wdt = i < N_W - 1            ? dt
                                  : dt == LORA_DTYPE_F32 ? LORA_DTYPE_BF16
                                                         : LORA_DTYPE_F32;
            w[i] = new_floats((size_t)ns[i] * k);
            fill_random(w[i], (size_t)ns[i] * k, 1.0f);
            tw[i] = typed_tensor_of(w[i], ns[i], k, wdt, &host[i]);
            want[i] = new_floats((size_t)MAX_M * ns[i]);
            got[i] = new_floats((size_t)MAX_M * ns[i]);
        }
        be->fast_matmul = bi_modes[si % 5].fast;
        for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
            int m = ms[mi];
            for (int i = 0; i < N_W; i++) {
                k_->matmul(be, want[i], x, &tw[i], m, 1.0f, false);
                fill_nan(got[i], (size_t)m * ns[i]);
            }
            k_->matmul_shared(be, N_W, got, x,
                              (const struct lora_tensor *const[]){&tw[0], &tw[1], &tw[2], &tw[3]},
                              m);
            for (int i = 0; i < N_W; i++)
                bad += memcmp(got[i], want[i], (size_t)m * ns[i] * sizeof(float)) != 0;
        }
        if (bad)
            printf("# %s%s k=%d: %d outputs differ from matmul's\n", lora_dtype_name(dt),
                   bi_modes[si % 5].fast ? " fast" : "", k, bad);
        CHECK(bad == 0);
        be->fast_matmul = false;
        release_tensors();
        free(x);
        for (int i = 0; i < N_W; i++) {
            free(host[i]);
            free(w[i]);
            free(want[i]);
            free(got[i]);
        }
    }
}

/* A weight whose last byte is the last of a page, the next page unreadable: a kernel whose vector
 * loads run past a tensor's end (int8's AVX2 tiles, at several rows of x, read whole 32-byte
 * loads past a short last half of a row, except in the tile that holds the weight's last row)
 * faults here. The shapes leave few bytes after the last row: int8 scales of 4 to 20 bytes, or
 * a row of 900 or 4500 values in the other dtypes. Each product must equal the same weight's in
 * ordinary memory, bit for bit. */
static void test_matmul_reads_stay_in_tensor(void)
{
    static const int shapes[][2] = {{64, 1}, {64, 5}, {100, 1}, {900, 1}, {4500, 1}}; /* {k, n} */
    static const int ms[] = {1, 2, 3, 4, 5, 9};
    enum { MAX_M = 9 };
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]) * 5; si++) {
        int k = shapes[si / 5][0], n = shapes[si / 5][1], bad = 0;
        enum lora_dtype dt = bi_modes[si % 5].dtype;
        size_t bytes = lora_tensor_bytes(dt, n, k), span = (bytes + page - 1) / page * page;
        float *x = new_floats((size_t)MAX_M * k), *w = new_floats((size_t)n * k);
        float *want = new_floats((size_t)MAX_M * n), *got = new_floats((size_t)MAX_M * n);
        void *host;
        char err[256];

        fill_random(x, (size_t)MAX_M * k, 1.0f);
        fill_random(w, (size_t)n * k, 1.0f);
        struct lora_tensor plain = typed_tensor_of(w, n, k, dt, &host);
        char *map =
            mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED || mprotect(map + span, page, PROT_NONE) != 0) {
            printf("Bail out! unable to map a guarded page\n");
            exit(1);
        }
        memcpy(map + span - bytes, host, bytes);
        struct lora_buffer *b = k_->buffer_wrap(be, map + span - bytes, bytes, err, sizeof(err));
        CHECK(b != NULL);
        struct lora_tensor guarded = {b, 0, dt, n, k};
        be->fast_matmul = bi_modes[si % 5].fast;
        for (size_t mi = 0; b && mi < sizeof(ms) / sizeof(ms[0]); mi++) {
            int m = ms[mi];
            k_->matmul(be, want, x, &plain, m, 1.0f, false);
            k_->matmul(be, got, x, &guarded, m, 1.0f, false);
            bad += memcmp(got, want, (size_t)m * n * sizeof(float)) != 0;
        }
        if (bad)
            printf("# %s%s k=%d n=%d: %d products differ\n", lora_dtype_name(dt),
                   bi_modes[si % 5].fast ? " fast" : "", k, n, bad);
        CHECK(bad == 0);
        be->fast_matmul = false;
        if (b)
            k_->buffer_free(be, b);
        munmap(map, span + page);
        release_tensors();
        free(host);
        free(x);
        free(w);
        free(want);
        free(got);
    }
}

/* ---- element-wise kernels ---- */

static void test_rmsnorm(void)
{
    static const int dims[] = {1, 7, 64, 896};
    static const int ms[] = {1, 6}; /* 6 takes the threaded path */
    const float eps = 1e-6f;

    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
            int dim = dims[di], m = ms[mi];
            size_t total = (size_t)m * dim;
            float *x = new_floats(total), *x_copy = new_floats(total);
            float *out = new_floats(total), *w = new_floats((size_t)dim);
            double *want = new_doubles(total);

            fill_random(x, total, 3.0f);
            fill_random(w, (size_t)dim, 2.0f);
            if (m > 1) /* an all-zero row: eps keeps it finite, the output is zero */
                memset(x + (size_t)(m - 1) * dim, 0, (size_t)dim * sizeof(float));
            memcpy(x_copy, x, total * sizeof(float));
            struct lora_ref_w rw = ref_of(w, 1, dim);
            struct lora_tensor tw = tensor_of(w, 1, dim);
            lora_ref_rmsnorm(want, x, &rw, m, eps);

            fill_nan(out, total);
            k_->rmsnorm(be, out, x, &tw, m, eps);
            long bad = first_far(out, want, NULL, total, REL_TOL);
            if (bad >= 0) {
                printf("# rmsnorm out of place m=%d dim=%d element %ld\n", m, dim, bad);
                CHECK_NEAR(out[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
            }
            CHECK(memcmp(x, x_copy, total * sizeof(float)) == 0);

            k_->rmsnorm(be, x, x, &tw, m, eps);
            bad = first_far(x, want, NULL, total, REL_TOL);
            if (bad >= 0) {
                printf("# rmsnorm in place m=%d dim=%d element %ld\n", m, dim, bad);
                CHECK_NEAR(x[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
            }
            release_tensors();
            free(x);
            free(x_copy);
            free(out);
            free(w);
            free(want);
        }
    }
}

static void test_rope(void)
{
    static const int configs[][2] = {{1, 2}, {1, 64}, {4, 16}, {3, 128}}; /* {n_heads, head_dim} */
    static const float thetas[] = {10000.0f, 1000000.0f};
    static const int pos[] = {0, 1, 2, 17, 1000, 10000, 32767};
    const int m = sizeof(pos) / sizeof(pos[0]); /* more than 4: the threaded path */

    for (size_t ci = 0; ci < sizeof(configs) / sizeof(configs[0]); ci++) {
        for (size_t ti = 0; ti < sizeof(thetas) / sizeof(thetas[0]); ti++) {
            int n_heads = configs[ci][0], head_dim = configs[ci][1];
            int dim = n_heads * head_dim;
            size_t total = (size_t)m * dim;
            double theta = thetas[ti];
            float *x = new_floats(total), *x0 = new_floats(total);
            double *want = new_doubles(total);

            fill_random(x0, total, 2.0f);
            memcpy(x, x0, total * sizeof(float));
            lora_ref_rope(want, x0, pos, m, n_heads, head_dim, theta);

            k_->rope(be, x, pos, m, n_heads, head_dim, thetas[ti]);
            long bad = first_far(x, want, NULL, total, REL_TOL);
            if (bad >= 0) {
                printf("# rope heads=%d head_dim=%d theta=%g: row %ld (pos %d) column %ld\n",
                       n_heads, head_dim, theta, bad / dim, pos[bad / dim], bad % dim);
                CHECK_NEAR(x[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
            }
            /* Position 0 is the identity, exactly. */
            CHECK(memcmp(x, x0, (size_t)dim * sizeof(float)) == 0);
            free(x);
            free(x0);
            free(want);
        }
    }
}

static void test_silu_mul(void)
{
    static const size_t sizes[] = {1, 5, 20000}; /* 20000 takes the threaded path */
    static const float extremes[] = {0.0f, -100.0f, 100.0f, -88.5f, 88.5f, -20.0f, 20.0f, 1e-30f};

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *gate = new_floats(n), *up = new_floats(n), *up_copy = new_floats(n);
        double *want = new_doubles(n);

        fill_random(gate, n, 12.0f);
        fill_random(up, n, 3.0f);
        for (size_t i = 0; i < n && i < sizeof(extremes) / sizeof(extremes[0]); i++)
            gate[i] = extremes[i];
        memcpy(up_copy, up, n * sizeof(float));
        lora_ref_silu_mul(want, gate, up, n);

        k_->silu_mul(be, gate, up, n);
        long bad = first_far(gate, want, NULL, n, REL_TOL);
        if (bad >= 0) {
            printf("# silu_mul n=%zu element %ld\n", n, bad);
            CHECK_NEAR(gate[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
        }
        CHECK(memcmp(up, up_copy, n * sizeof(float)) == 0);
        free(gate);
        free(up);
        free(up_copy);
        free(want);
    }
}

/* Sums of two rng_uniform values are exact in double, so the float sum must match bit for bit. */
static void test_add(void)
{
    const size_t n = 1003;
    float *y = new_floats(n), *y0 = new_floats(n), *x = new_floats(n);
    int n_bad = 0;

    fill_random(y0, n, 1.0f);
    fill_random(x, n, 1.0f);
    memcpy(y, y0, n * sizeof(float));
    k_->add(be, y, x, n);
    for (size_t i = 0; i < n; i++)
        n_bad += y[i] != (float)((double)y0[i] + x[i]);
    CHECK(n_bad == 0);
    free(y);
    free(y0);
    free(x);
}

static void test_add_bias(void)
{
    const int m = 5, n = 33;
    float *y = new_floats((size_t)m * n), *y0 = new_floats((size_t)m * n);
    float *bias = new_floats((size_t)n);
    int n_bad = 0;

    fill_random(y0, (size_t)m * n, 1.0f);
    fill_random(bias, (size_t)n, 1.0f);
    memcpy(y, y0, (size_t)m * n * sizeof(float));
    struct lora_tensor tb = tensor_of(bias, 1, n);
    k_->add_bias(be, y, &tb, m);
    release_tensors();
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            n_bad += y[(size_t)i * n + j] != (float)((double)y0[(size_t)i * n + j] + bias[j]);
    CHECK(n_bad == 0);
    free(y);
    free(y0);
    free(bias);
}

static void test_embed(void)
{
    static const int ids[] = {3, 0, 9, 3, 7, 9};
    const int m = sizeof(ids) / sizeof(ids[0]), dim = 13, vocab = 10;
    float *table = new_floats((size_t)vocab * dim);
    float *out = new_floats((size_t)m * dim + MM_GUARD);

    fill_random(table, (size_t)vocab * dim, 1.0f);
    fill_nan(out, (size_t)m * dim + MM_GUARD);
    struct lora_tensor tt = tensor_of(table, vocab, dim);
    k_->embed(be, out, &tt, ids, m);
    release_tensors();
    for (int i = 0; i < m; i++)
        CHECK(memcmp(out + (size_t)i * dim, table + (size_t)ids[i] * dim,
                     (size_t)dim * sizeof(float)) == 0);
    CHECK(all_nan(out + (size_t)m * dim, MM_GUARD));
    free(table);
    free(out);
}

/* ---- kv_write + attention over a paged cache ---- */

#define ATT_HEADS    4
#define ATT_HEAD_DIM 16
#define ATT_LAYERS   2
#define ATT_LAYER    1 /* the layer written and read; the other must stay untouched */

/* One sequence of the batch: this step's rows are positions [pos, pos + n_rows). */
struct att_spec {
    int pos;
    int n_rows;
};

static const struct att_spec att_specs[] = {
    {0, 9},   /* prefill from the start */
    {7, 5},   /* a prefill chunk starting inside a block */
    {20, 1},  /* decode */
    {0, 1},   /* decode of a one-token prompt: context 1 */
    {16, 16}, /* a chunk starting on a block boundary */
    {33, 1},  /* decode, the longest context */
};
#define ATT_N_SEQS ((int)(sizeof(att_specs) / sizeof(att_specs[0])))
/* Where each sequence's rows sit in the batch: not in sequence order. */
static const int att_batch_order[ATT_N_SEQS] = {2, 0, 5, 1, 4, 3};

/* Slot of position p of a sequence with block table bt. */
static int att_slot(const int *bt, int p, int block_size)
{
    return bt[p / block_size] * block_size + p % block_size;
}

/* Everything one attention case needs; see run_attention_case. */
struct att_case {
    int block_size, n_kv_heads, kv_dim, q_dim, n_rows, max_ctx;
    int first_row[ATT_N_SEQS]; /* batch row of each sequence's first row */
    int *tables[ATT_N_SEQS];   /* block table of each sequence */
    float *kseq[ATT_N_SEQS];   /* (ctx, kv_dim) contiguous keys of each sequence */
    float *vseq[ATT_N_SEQS];   /* (ctx, kv_dim) contiguous values */
    struct lora_kv_cache *kv;
};

/* Writes positions [0, pos) of every sequence ("earlier steps", one call each), then this step's
 * rows of all sequences in one batched call, as the engine does. */
static void att_write_cache(struct att_case *c)
{
    struct lora_tensor kc = lora_kv_cache_k(c->kv, ATT_LAYER), vc = lora_kv_cache_v(c->kv, ATT_LAYER);
    int *slots = xmalloc(sizeof(int) * (size_t)(c->max_ctx + c->n_rows));
    float *k_new = new_floats((size_t)c->n_rows * c->kv_dim);
    float *v_new = new_floats((size_t)c->n_rows * c->kv_dim);

    for (int s = 0; s < ATT_N_SEQS; s++) {
        for (int p = 0; p < att_specs[s].pos; p++)
            slots[p] = att_slot(c->tables[s], p, c->block_size);
        k_->kv_write(be, &kc, &vc, c->kseq[s], c->vseq[s], slots, att_specs[s].pos);
    }
    for (int s = 0; s < ATT_N_SEQS; s++) {
        for (int r = 0; r < att_specs[s].n_rows; r++) {
            int p = att_specs[s].pos + r, row = c->first_row[s] + r;
            slots[row] = att_slot(c->tables[s], p, c->block_size);
            memcpy(k_new + (size_t)row * c->kv_dim, c->kseq[s] + (size_t)p * c->kv_dim,
                   (size_t)c->kv_dim * sizeof(float));
            memcpy(v_new + (size_t)row * c->kv_dim, c->vseq[s] + (size_t)p * c->kv_dim,
                   (size_t)c->kv_dim * sizeof(float));
        }
    }
    k_->kv_write(be, &kc, &vc, k_new, v_new, slots, c->n_rows);
    free(slots);
    free(k_new);
    free(v_new);
}

/* Every position of every sequence sits in its slot, bit for bit; every other slot and the
 * other layer still hold the NaN they started with. */
static void att_check_cache(const struct att_case *c)
{
    const struct lora_kv_cache *kv = c->kv;
    size_t n_slots = (size_t)kv->n_blocks * kv->block_size, row_bytes = kv->kv_dim * sizeof(float);
    struct lora_tensor kt = lora_kv_cache_k(kv, ATT_LAYER), vt = lora_kv_cache_v(kv, ATT_LAYER);
    const float *kc = lora_tensor_host(&kt), *vc = lora_tensor_host(&vt);
    bool *used = calloc(n_slots, sizeof(bool));
    int n_wrong = 0, n_dirty = 0;

    if (!used) {
        printf("Bail out! out of memory\n");
        exit(1);
    }
    for (int s = 0; s < ATT_N_SEQS; s++) {
        for (int p = 0; p < att_specs[s].pos + att_specs[s].n_rows; p++) {
            int slot = att_slot(c->tables[s], p, c->block_size);
            used[slot] = true;
            n_wrong += memcmp(kc + (size_t)slot * kv->kv_dim, c->kseq[s] + (size_t)p * kv->kv_dim,
                              row_bytes) != 0;
            n_wrong += memcmp(vc + (size_t)slot * kv->kv_dim, c->vseq[s] + (size_t)p * kv->kv_dim,
                              row_bytes) != 0;
        }
    }
    for (size_t slot = 0; slot < n_slots; slot++) {
        if (used[slot])
            continue;
        n_dirty += !all_nan(kc + slot * kv->kv_dim, (size_t)kv->kv_dim);
        n_dirty += !all_nan(vc + slot * kv->kv_dim, (size_t)kv->kv_dim);
    }
    for (int layer = 0; layer < ATT_LAYERS; layer++) {
        if (layer == ATT_LAYER)
            continue;
        struct lora_tensor lk = lora_kv_cache_k(kv, layer), lv = lora_kv_cache_v(kv, layer);
        n_dirty += !all_nan(lora_tensor_host(&lk), n_slots * kv->kv_dim);
        n_dirty += !all_nan(lora_tensor_host(&lv), n_slots * kv->kv_dim);
    }
    if (n_wrong || n_dirty)
        printf("# kv_write block_size=%d: %d rows wrong, %d foreign slots written\n", c->block_size,
               n_wrong, n_dirty);
    CHECK(n_wrong == 0);
    CHECK(n_dirty == 0);
    free(used);
}

/* Attention of the whole batch against the naive reference over the contiguous K, V. */
static void att_check_attention(const struct att_case *c)
{
    struct lora_attn_seq seqs[ATT_N_SEQS];
    size_t n_out = (size_t)c->n_rows * c->q_dim;
    float *q = new_floats(n_out), *out = new_floats(n_out);
    void *scratch = xmalloc(k_->scratch_bytes(be, LORA_KERNEL_ATTENTION, c->n_rows, c->max_ctx, 0));
    struct lora_tensor kc = lora_kv_cache_k(c->kv, ATT_LAYER), vc = lora_kv_cache_v(c->kv, ATT_LAYER);
    double *want = new_doubles(n_out), *scores = new_doubles((size_t)c->max_ctx);
    int group = ATT_HEADS / c->n_kv_heads;

    for (int s = 0; s < ATT_N_SEQS; s++)
        seqs[s] = (struct lora_attn_seq){.row = c->first_row[s],
                                         .n_rows = att_specs[s].n_rows,
                                         .pos = att_specs[s].pos,
                                         .block_table = c->tables[s]};
    fill_random(q, n_out, 2.0f); /* scores of a few units: a softmax that is not flat */
    fill_nan(out, n_out);
    k_->attention(be, out, q, &kc, &vc, seqs, ATT_N_SEQS, ATT_HEADS, c->n_kv_heads, ATT_HEAD_DIM,
                  c->block_size, scratch, c->max_ctx);
    for (int s = 0; s < ATT_N_SEQS; s++) {
        for (int r = 0; r < att_specs[s].n_rows; r++) {
            size_t row = (size_t)(c->first_row[s] + r);
            for (int h = 0; h < ATT_HEADS; h++) {
                size_t off = row * c->q_dim + (size_t)h * ATT_HEAD_DIM;
                lora_ref_attend(want + off, q + off, c->kseq[s], c->vseq[s], att_specs[s].pos + r,
                                (h / group) * ATT_HEAD_DIM, c->kv_dim, ATT_HEAD_DIM, scores);
            }
        }
    }
    long bad = first_far(out, want, NULL, n_out, REL_TOL);
    if (bad >= 0) {
        printf("# attention block_size=%d kv_heads=%d: row %ld column %ld\n", c->block_size,
               c->n_kv_heads, bad / c->q_dim, bad % c->q_dim);
        CHECK_NEAR(out[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
    }
    free(q);
    free(out);
    free(scratch);
    free(want);
    free(scores);
}

static void run_attention_case(int block_size, int n_kv_heads)
{
    struct att_case c = {.block_size = block_size, .n_kv_heads = n_kv_heads};
    int n_blocks = 3; /* spare blocks no sequence owns: a wrong slot reads their NaN */
    int row = 0;

    c.kv_dim = n_kv_heads * ATT_HEAD_DIM;
    c.q_dim = ATT_HEADS * ATT_HEAD_DIM;
    for (int i = 0; i < ATT_N_SEQS; i++) {
        int s = att_batch_order[i], ctx = att_specs[s].pos + att_specs[s].n_rows;
        c.first_row[s] = row;
        row += att_specs[s].n_rows;
        n_blocks += (ctx + block_size - 1) / block_size;
        if (ctx > c.max_ctx)
            c.max_ctx = ctx;
    }
    c.n_rows = row;
    c.kv = lora_kv_cache_new(be, LORA_DTYPE_F32, ATT_LAYERS, c.kv_dim, block_size, n_blocks);
    CHECK(c.kv != NULL);
    if (!c.kv)
        return;
    size_t per_layer = (size_t)n_blocks * block_size * c.kv_dim;
    struct lora_tensor k0 = lora_kv_cache_k(c.kv, 0), v0 = lora_kv_cache_v(c.kv, 0);
    fill_nan(lora_tensor_host(&k0), per_layer * ATT_LAYERS);
    fill_nan(lora_tensor_host(&v0), per_layer * ATT_LAYERS);

    /* Take every block, shuffle, and deal them out: block tables are not contiguous. */
    int *ids = xmalloc(sizeof(int) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++)
        ids[i] = i;
    shuffle_ints(ids, n_blocks);
    int next = 0;
    for (int s = 0; s < ATT_N_SEQS; s++) {
        int ctx = att_specs[s].pos + att_specs[s].n_rows, nb = (ctx + block_size - 1) / block_size;
        c.tables[s] = xmalloc(sizeof(int) * (size_t)nb);
        memcpy(c.tables[s], ids + next, sizeof(int) * (size_t)nb);
        next += nb;
        c.kseq[s] = new_floats((size_t)ctx * c.kv_dim);
        c.vseq[s] = new_floats((size_t)ctx * c.kv_dim);
        fill_random(c.kseq[s], (size_t)ctx * c.kv_dim, 1.0f);
        fill_random(c.vseq[s], (size_t)ctx * c.kv_dim, 1.0f);
    }

    att_write_cache(&c);
    att_check_cache(&c);
    att_check_attention(&c);

    for (int s = 0; s < ATT_N_SEQS; s++) {
        free(c.tables[s]);
        free(c.kseq[s]);
        free(c.vseq[s]);
    }
    free(ids);
    lora_kv_cache_destroy(&c.kv);
}

static void test_kv_write_attention(void)
{
    static const int block_sizes[] = {1, 4, 16};
    static const int kv_heads[] = {4, 2, 1};

    for (size_t bi = 0; bi < sizeof(block_sizes) / sizeof(block_sizes[0]); bi++)
        for (size_t hi = 0; hi < sizeof(kv_heads) / sizeof(kv_heads[0]); hi++)
            run_attention_case(block_sizes[bi], kv_heads[hi]);
}

/* ---- multi-LoRA SGMV ---- */

static void test_lora_sgmv(void)
{
    enum { IN = 37, OUT = 29, ROWS = 16, N_SEGS = 5 };
    /* {row, n_rows, rank}, not in row order; rows 3, 4, 9, 13 belong to no segment. */
    static const int layout[N_SEGS][3] = {
        {5, 4, 16}, {0, 3, 4}, {10, 1, 1}, {14, 2, 4}, {11, 2, 1},
    };
    static const float scales[N_SEGS] = {0.5f, 2.0f, -1.25f, 0.125f, 3.0f};
    struct lora_sgmv_seg segs[N_SEGS];
    float *as[N_SEGS], *bs[N_SEGS];
    float *x = new_floats((size_t)ROWS * IN), *x_copy = new_floats((size_t)ROWS * IN);
    float *y = new_floats((size_t)ROWS * OUT), *y0 = new_floats((size_t)ROWS * OUT);
    double want[OUT], mag[OUT];
    bool in_seg[ROWS] = {false};

    fill_random(x, (size_t)ROWS * IN, 1.0f);
    fill_random(y0, (size_t)ROWS * OUT, 1.0f);
    memcpy(x_copy, x, (size_t)ROWS * IN * sizeof(float));
    memcpy(y, y0, (size_t)ROWS * OUT * sizeof(float));
    for (int s = 0; s < N_SEGS; s++) {
        int rank = layout[s][2];
        float *a = new_floats((size_t)rank * IN), *b = new_floats((size_t)rank * OUT);
        fill_random(a, (size_t)rank * IN, 1.0f);
        fill_random(b, (size_t)rank * OUT, 1.0f); /* B transposed: (rank, out) */
        as[s] = a;
        bs[s] = b;
        segs[s] = (struct lora_sgmv_seg){.row = layout[s][0],
                                         .n_rows = layout[s][1],
                                         .rank = rank,
                                         .scale = scales[s],
                                         .a = tensor_of(a, rank, IN),
                                         .b_t = tensor_of(b, rank, OUT)};
        for (int r = 0; r < layout[s][1]; r++)
            in_seg[layout[s][0] + r] = true;
    }
    /* Exactly the documented size: rows x max rank. */
    CHECK(k_->scratch_bytes(be, LORA_KERNEL_LORA_SGMV, ROWS, 0, 16) == ROWS * 16 * sizeof(float));
    float *tmp = new_floats((size_t)ROWS * 16);

    k_->lora_sgmv(be, y, x, segs, N_SEGS, IN, OUT, tmp, 16);

    for (int s = 0; s < N_SEGS; s++) {
        const struct lora_sgmv_seg *g = &segs[s];
        struct lora_ref_w ra = ref_of(as[s], g->rank, IN), rb = ref_of(bs[s], g->rank, OUT);
        for (int r = 0; r < g->n_rows; r++) {
            const float *xr = x + (size_t)(g->row + r) * IN;
            const float *y0r = y0 + (size_t)(g->row + r) * OUT;
            lora_ref_lora_row(want, mag, xr, y0r, &ra, &rb, g->rank, g->scale);
            const float *yr = y + (size_t)(g->row + r) * OUT;
            long bad = first_far(yr, want, mag, OUT, REL_TOL);
            if (bad >= 0) {
                printf("# sgmv segment %d (rank %d) row %d column %ld\n", s, g->rank, g->row + r,
                       bad);
                CHECK_NEAR(yr[bad], want[bad], REL_TOL * (1.0 + mag[bad]));
            }
        }
    }
    for (int r = 0; r < ROWS; r++)
        if (!in_seg[r])
            CHECK(memcmp(y + (size_t)r * OUT, y0 + (size_t)r * OUT, OUT * sizeof(float)) == 0);
    CHECK(memcmp(x, x_copy, (size_t)ROWS * IN * sizeof(float)) == 0);

    release_tensors();
    for (int s = 0; s < N_SEGS; s++) {
        free(as[s]);
        free(bs[s]);
    }
    free(x);
    free(x_copy);
    free(y);
    free(y0);
    free(tmp);
}

/* ---- kv_cache storage ---- */

static void test_kv_cache_storage(void)
{
    enum { N = 6, LAYERS = 2, KV_DIM = 8, BLOCK = 4 };
    struct lora_kv_cache *kv = lora_kv_cache_new(be, LORA_DTYPE_F32, LAYERS, KV_DIM, BLOCK, N);

    CHECK(kv != NULL);
    if (!kv)
        return;
    CHECK(kv->dtype == LORA_DTYPE_F32 && kv->be == be);
    CHECK(kv->n_layers == LAYERS && kv->n_blocks == N && kv->block_size == BLOCK &&
          kv->kv_dim == KV_DIM);
    CHECK(lora_kv_cache_block_bytes(LORA_DTYPE_F32, LAYERS, KV_DIM, BLOCK) ==
          2 * sizeof(float) * LAYERS * KV_DIM * BLOCK);
    /* Layer l of keys (values) is rows [0, N * BLOCK) of KV_DIM floats, after layer l - 1. */
    struct lora_tensor k0 = lora_kv_cache_k(kv, 0), k1 = lora_kv_cache_k(kv, 1);
    struct lora_tensor v0 = lora_kv_cache_v(kv, 0), v1 = lora_kv_cache_v(kv, 1);
    CHECK(k0.rows == N * BLOCK && k0.cols == KV_DIM && k0.dtype == LORA_DTYPE_F32);
    CHECK((const float *)lora_tensor_host(&k1) - (const float *)lora_tensor_host(&k0) ==
          N * BLOCK * KV_DIM);
    CHECK((const float *)lora_tensor_host(&v1) - (const float *)lora_tensor_host(&v0) ==
          N * BLOCK * KV_DIM);
    CHECK(k0.buf != v0.buf && k0.buf == k1.buf && v0.buf == v1.buf);
    CHECK(k0.buf->bytes >= (size_t)LAYERS * N * BLOCK * KV_DIM * sizeof(float));
    /* Zero-filled: an unwritten slot reads stable numbers. */
    const float *kh = lora_tensor_host(&k0), *vh = lora_tensor_host(&v0);
    int n_nonzero = 0;
    for (size_t i = 0; i < (size_t)LAYERS * N * BLOCK * KV_DIM; i++)
        n_nonzero += kh[i] != 0.0f || vh[i] != 0.0f;
    CHECK(n_nonzero == 0);

    lora_kv_cache_destroy(&kv);
    CHECK(kv == NULL);
    lora_kv_cache_destroy(&kv); /* destroying NULL is a no-op */
    lora_kv_cache_destroy(NULL);

    CHECK(lora_kv_cache_new(be, LORA_DTYPE_F32, 0, KV_DIM, BLOCK, N) == NULL);
    CHECK(lora_kv_cache_new(be, LORA_DTYPE_F32, LAYERS, 0, BLOCK, N) == NULL);
    CHECK(lora_kv_cache_new(be, LORA_DTYPE_F32, LAYERS, KV_DIM, 0, N) == NULL);
    CHECK(lora_kv_cache_new(be, LORA_DTYPE_F32, LAYERS, KV_DIM, BLOCK, 0) == NULL);
    CHECK(lora_kv_cache_new(be, LORA_DTYPE_F32, -1, KV_DIM, BLOCK, N) == NULL);
    CHECK(lora_kv_cache_new(NULL, LORA_DTYPE_F32, LAYERS, KV_DIM, BLOCK, N) == NULL);
}

int main(void)
{
    be = fx_backend();
    k_ = be->ops;
    RUN(test_matmul);
    RUN(test_matmul_batch_invariance);
    RUN(test_matmul_one_row_steps);
    RUN(test_matmul_shared);
    RUN(test_matmul_reads_stay_in_tensor);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_silu_mul);
    RUN(test_add);
    RUN(test_add_bias);
    RUN(test_embed);
    RUN(test_kv_write_attention);
    RUN(test_lora_sgmv);
    RUN(test_kv_cache_storage);
    return check_done();
}
