/* Unit tests for kernels/cpu and lib/runtime/kv_cache: every kernel against a naive double-precision
 * reference written here in plain loops (never against another kernel), matmul batch invariance
 * bit for bit across batch sizes, row positions and thread counts, kv_write + attention over a
 * shuffled paged cache with grouped-query heads, the multi-LoRA SGMV, and the block pool.
 */
#include "check.h"
#include "backend/cpu/kernels_cpu.h"
#include "runtime/kv_cache.h"

#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Relative tolerance against the double references: an error bound of the form
 * REL_TOL * (1 + magnitude of the terms summed). */
#define REL_TOL 1e-5

/* ---- helpers ---- */

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);

    if (!p) {
        printf("Bail out! unable to allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static float *new_floats(size_t n)
{
    return xmalloc(n * sizeof(float));
}

static double *new_doubles(size_t n)
{
    return xmalloc(n * sizeof(double));
}

static uint64_t rng_state = 0x243f6a8885a308d3ULL;

/* splitmix64: fixed seed, so every run tests the same numbers. */
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), a multiple of 2^-23: the sum of two is exact in double. */
static float rng_uniform(void)
{
    return (float)((int32_t)(rng_next() >> 40) - (1 << 23)) / (float)(1 << 23);
}

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

/* ---- naive references, double precision ---- */

/* dot (m, n) = x (m, k) · w (n, k)ᵀ and absdot (m, n) = Σ|x w|, the scale of its rounding error. */
static void ref_matmul(double *dot, double *absdot, const float *x, const float *w, int m, int n,
                       int k)
{
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0, a = 0;
            for (int d = 0; d < k; d++) {
                double p = (double)x[(size_t)i * k + d] * w[(size_t)j * k + d];
                s += p;
                a += fabs(p);
            }
            dot[(size_t)i * n + j] = s;
            absdot[(size_t)i * n + j] = a;
        }
    }
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
                ref_matmul(dot, absdot, x, w, m, n, k);
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
                    lora_k_matmul(y, x, w, m, n, k, alpha, acc);
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
    lora_k_matmul(c->yb, c->xb, c->w, m, c->n, c->k, acc ? BI_ALPHA : 1.0f, acc);
    for (int i = 0; i < m; i++) {
        int r = (i + off) % BI_ROWS;
        const float *want = (acc ? c->alone_acc : c->alone) + r * n;
        if (memcmp(c->yb + i * n, want, n * sizeof(float)) != 0) {
            if (n_bad == 0)
                printf("# k=%d n=%d threads=%d m=%d acc=%d: batch row %d (x row %d) differs\n",
                       c->k, c->n, omp_get_max_threads(), m, acc, i, r);
            n_bad++;
        }
    }
    return n_bad;
}

/* With 2 threads the rows of w are split between threads (for k = 896: two panels), which must
 * not change a bit either; only some sizes, as a thread team is slow on a loaded machine. */
static void test_matmul_batch_invariance(void)
{
    static const int shapes[][2] = {{64, 300}, {896, 128}, {100, 7}}; /* {k, n} */
    static const int ms_2_threads[] = {2, 3, 7, 16, 17, 33, 64, 69, 70};
    int saved_threads = omp_get_max_threads();

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        struct bi_case c = {.k = shapes[si][0], .n = shapes[si][1]};
        size_t k = (size_t)c.k, n = (size_t)c.n;
        int n_bad = 0;

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

        omp_set_num_threads(1);
        memcpy(c.alone_acc, c.y_init, BI_ROWS * n * sizeof(float));
        for (size_t r = 0; r < BI_ROWS; r++) {
            lora_k_matmul(c.alone + r * n, c.x + r * k, c.w, 1, c.n, c.k, 1.0f, false);
            lora_k_matmul(c.alone_acc + r * n, c.x + r * k, c.w, 1, c.n, c.k, BI_ALPHA, true);
        }
        for (int m = 2; m <= BI_ROWS; m++)
            n_bad += bi_mismatches(&c, m, (m * 29) % BI_ROWS, m % 3 == 0);

        omp_set_num_threads(2);
        for (size_t r = 0; r < BI_ROWS; r += 23) {
            lora_k_matmul(c.yb, c.x + r * k, c.w, 1, c.n, c.k, 1.0f, false);
            n_bad += memcmp(c.yb, c.alone + r * n, n * sizeof(float)) != 0;
        }
        for (size_t mi = 0; mi < sizeof(ms_2_threads) / sizeof(ms_2_threads[0]); mi++) {
            int m = ms_2_threads[mi];
            n_bad += bi_mismatches(&c, m, (m * 13) % BI_ROWS, mi % 2 == 1);
        }
        CHECK(n_bad == 0);

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
            for (int i = 0; i < m; i++) {
                double ss = 0;
                for (int j = 0; j < dim; j++)
                    ss += (double)x[(size_t)i * dim + j] * x[(size_t)i * dim + j];
                double inv = 1.0 / sqrt(ss / dim + eps);
                for (int j = 0; j < dim; j++)
                    want[(size_t)i * dim + j] = x[(size_t)i * dim + j] * inv * w[j];
            }

            fill_nan(out, total);
            lora_k_rmsnorm(out, x, w, m, dim, eps);
            long bad = first_far(out, want, NULL, total, REL_TOL);
            if (bad >= 0) {
                printf("# rmsnorm out of place m=%d dim=%d element %ld\n", m, dim, bad);
                CHECK_NEAR(out[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
            }
            CHECK(memcmp(x, x_copy, total * sizeof(float)) == 0);

            lora_k_rmsnorm(x, x, w, m, dim, eps);
            bad = first_far(x, want, NULL, total, REL_TOL);
            if (bad >= 0) {
                printf("# rmsnorm in place m=%d dim=%d element %ld\n", m, dim, bad);
                CHECK_NEAR(x[bad], want[bad], REL_TOL * (1.0 + fabs(want[bad])));
            }
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
            int n_heads = configs[ci][0], head_dim = configs[ci][1], half = head_dim / 2;
            int dim = n_heads * head_dim;
            size_t total = (size_t)m * dim;
            double theta = thetas[ti];
            float *x = new_floats(total), *x0 = new_floats(total);
            double *want = new_doubles(total);

            fill_random(x0, total, 2.0f);
            memcpy(x, x0, total * sizeof(float));
            for (int i = 0; i < m; i++) {
                for (int h = 0; h < n_heads; h++) {
                    const float *v = x0 + (size_t)i * dim + (size_t)h * head_dim;
                    double *o = want + (size_t)i * dim + (size_t)h * head_dim;
                    for (int j = 0; j < half; j++) {
                        double angle = pos[i] * pow(theta, -2.0 * j / head_dim);
                        o[j] = v[j] * cos(angle) - v[j + half] * sin(angle);
                        o[j + half] = v[j + half] * cos(angle) + v[j] * sin(angle);
                    }
                }
            }

            lora_k_rope(x, pos, m, n_heads, head_dim, thetas[ti]);
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
        for (size_t i = 0; i < n; i++)
            want[i] = gate[i] / (1.0 + exp(-(double)gate[i])) * up[i];

        lora_k_silu_mul(gate, up, n);
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
    lora_k_add(y, x, n);
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
    lora_k_add_bias(y, bias, m, n);
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
    lora_k_embed(out, table, ids, m, dim);
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

/* Naive causal attention of one query row at position p over contiguous K, V (ctx, kv_dim). */
static void ref_attend(double *out, const float *q, const float *kc, const float *vc, int p,
                       int kv_off, int kv_dim, double *scores)
{
    double max = -INFINITY, sum = 0;

    for (int t = 0; t <= p; t++) {
        double dot = 0;
        for (int d = 0; d < ATT_HEAD_DIM; d++)
            dot += (double)q[d] * kc[(size_t)t * kv_dim + kv_off + d];
        scores[t] = dot / sqrt((double)ATT_HEAD_DIM);
        if (scores[t] > max)
            max = scores[t];
    }
    for (int t = 0; t <= p; t++) {
        scores[t] = exp(scores[t] - max);
        sum += scores[t];
    }
    for (int d = 0; d < ATT_HEAD_DIM; d++) {
        double acc = 0;
        for (int t = 0; t <= p; t++)
            acc += scores[t] / sum * vc[(size_t)t * kv_dim + kv_off + d];
        out[d] = acc;
    }
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
    float *kc = lora_kv_cache_k(c->kv, ATT_LAYER), *vc = lora_kv_cache_v(c->kv, ATT_LAYER);
    int *slots = xmalloc(sizeof(int) * (size_t)(c->max_ctx + c->n_rows));
    float *k_new = new_floats((size_t)c->n_rows * c->kv_dim);
    float *v_new = new_floats((size_t)c->n_rows * c->kv_dim);

    for (int s = 0; s < ATT_N_SEQS; s++) {
        for (int p = 0; p < att_specs[s].pos; p++)
            slots[p] = att_slot(c->tables[s], p, c->block_size);
        lora_k_kv_write(kc, vc, c->kseq[s], c->vseq[s], slots, att_specs[s].pos, c->kv_dim);
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
    lora_k_kv_write(kc, vc, k_new, v_new, slots, c->n_rows, c->kv_dim);
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
    const float *kc = lora_kv_cache_k(kv, ATT_LAYER), *vc = lora_kv_cache_v(kv, ATT_LAYER);
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
        n_dirty += !all_nan(lora_kv_cache_k(kv, layer), n_slots * kv->kv_dim);
        n_dirty += !all_nan(lora_kv_cache_v(kv, layer), n_slots * kv->kv_dim);
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
    struct lora_k_attn_seq seqs[ATT_N_SEQS];
    size_t n_out = (size_t)c->n_rows * c->q_dim;
    float *q = new_floats(n_out), *out = new_floats(n_out);
    float *scratch = new_floats((size_t)lora_k_n_threads() * c->max_ctx);
    double *want = new_doubles(n_out), *scores = new_doubles((size_t)c->max_ctx);
    int group = ATT_HEADS / c->n_kv_heads;

    for (int s = 0; s < ATT_N_SEQS; s++)
        seqs[s] = (struct lora_k_attn_seq){.row = c->first_row[s],
                                           .n_rows = att_specs[s].n_rows,
                                           .pos = att_specs[s].pos,
                                           .block_table = c->tables[s]};
    fill_random(q, n_out, 2.0f); /* scores of a few units: a softmax that is not flat */
    fill_nan(out, n_out);
    lora_k_attention(out, q, lora_kv_cache_k(c->kv, ATT_LAYER), lora_kv_cache_v(c->kv, ATT_LAYER),
                     seqs, ATT_N_SEQS, ATT_HEADS, c->n_kv_heads, ATT_HEAD_DIM, c->block_size,
                     scratch, c->max_ctx);
    for (int s = 0; s < ATT_N_SEQS; s++) {
        for (int r = 0; r < att_specs[s].n_rows; r++) {
            size_t row = (size_t)(c->first_row[s] + r);
            for (int h = 0; h < ATT_HEADS; h++) {
                size_t off = row * c->q_dim + (size_t)h * ATT_HEAD_DIM;
                ref_attend(want + off, q + off, c->kseq[s], c->vseq[s], att_specs[s].pos + r,
                           (h / group) * ATT_HEAD_DIM, c->kv_dim, scores);
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
    c.kv = lora_kv_cache_new(ATT_LAYERS, c.kv_dim, block_size, n_blocks);
    CHECK(c.kv != NULL);
    if (!c.kv)
        return;
    size_t per_layer = (size_t)n_blocks * block_size * c.kv_dim;
    fill_nan(lora_kv_cache_k(c.kv, 0), per_layer * ATT_LAYERS);
    fill_nan(lora_kv_cache_v(c.kv, 0), per_layer * ATT_LAYERS);

    /* Take every block, shuffle, and deal them out: block tables are not contiguous. */
    int *ids = xmalloc(sizeof(int) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++)
        ids[i] = lora_kv_cache_alloc(c.kv);
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
    struct lora_k_lora_seg segs[N_SEGS];
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
        segs[s] = (struct lora_k_lora_seg){.row = layout[s][0],
                                           .n_rows = layout[s][1],
                                           .rank = rank,
                                           .scale = scales[s],
                                           .a = a,
                                           .b_t = b};
        for (int r = 0; r < layout[s][1]; r++)
            in_seg[layout[s][0] + r] = true;
    }
    float *tmp = new_floats((size_t)ROWS * 16); /* exactly the documented size: rows x max rank */

    lora_k_lora_sgmv(y, x, segs, N_SEGS, IN, OUT, tmp, 16);

    for (int s = 0; s < N_SEGS; s++) {
        const struct lora_k_lora_seg *g = &segs[s];
        for (int r = 0; r < g->n_rows; r++) {
            const float *xr = x + (size_t)(g->row + r) * IN;
            const float *y0r = y0 + (size_t)(g->row + r) * OUT;
            double t[16], t_mag[16]; /* rank <= 16 */
            for (int q = 0; q < g->rank; q++) {
                t[q] = t_mag[q] = 0;
                for (int i = 0; i < IN; i++) {
                    t[q] += (double)xr[i] * g->a[(size_t)q * IN + i];
                    t_mag[q] += fabs((double)xr[i] * g->a[(size_t)q * IN + i]);
                }
            }
            for (int o = 0; o < OUT; o++) {
                double acc = 0, acc_mag = 0;
                for (int q = 0; q < g->rank; q++) {
                    acc += t[q] * g->b_t[(size_t)q * OUT + o];
                    acc_mag += t_mag[q] * fabs(g->b_t[(size_t)q * OUT + o]);
                }
                want[o] = y0r[o] + g->scale * acc;
                mag[o] = fabs(y0r[o]) + fabs(g->scale) * acc_mag;
            }
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

    for (int s = 0; s < N_SEGS; s++) {
        free((void *)segs[s].a);
        free((void *)segs[s].b_t);
    }
    free(x);
    free(x_copy);
    free(y);
    free(y0);
    free(tmp);
}

/* ---- kv_cache block pool ---- */

static void test_kv_cache_pool(void)
{
    enum { N = 6, LAYERS = 2, KV_DIM = 8, BLOCK = 4 };
    struct lora_kv_cache *kv = lora_kv_cache_new(LAYERS, KV_DIM, BLOCK, N);
    bool seen[N] = {false};
    int ids[N];

    CHECK(kv != NULL);
    if (!kv)
        return;
    CHECK(kv->n_free == N);
    CHECK(lora_kv_cache_block_bytes(LAYERS, KV_DIM, BLOCK) ==
          2 * sizeof(float) * LAYERS * KV_DIM * BLOCK);
    CHECK(lora_kv_cache_k(kv, 1) - lora_kv_cache_k(kv, 0) == N * BLOCK * KV_DIM);
    CHECK(lora_kv_cache_v(kv, 1) - lora_kv_cache_v(kv, 0) == N * BLOCK * KV_DIM);
    int n_nonzero = 0;
    for (size_t i = 0; i < (size_t)LAYERS * N * BLOCK * KV_DIM; i++)
        n_nonzero += kv->k[i] != 0.0f || kv->v[i] != 0.0f;
    CHECK(n_nonzero == 0);

    /* Distinct ids covering 0..N-1, then -1 (twice: exhaustion is not a state change). */
    for (int i = 0; i < N; i++) {
        ids[i] = lora_kv_cache_alloc(kv);
        CHECK(ids[i] >= 0 && ids[i] < N);
        if (ids[i] >= 0 && ids[i] < N) {
            CHECK(!seen[ids[i]]);
            seen[ids[i]] = true;
        }
        CHECK(kv->n_free == N - 1 - i);
    }
    CHECK(lora_kv_cache_alloc(kv) == -1);
    CHECK(lora_kv_cache_alloc(kv) == -1);
    CHECK(kv->n_free == 0);

    /* A freed block is the one handed out next. */
    lora_kv_cache_free(kv, ids[3]);
    CHECK(kv->n_free == 1);
    CHECK(lora_kv_cache_alloc(kv) == ids[3]);
    CHECK(kv->n_free == 0);

    /* Two freed: both come back, in some order, then none. */
    lora_kv_cache_free(kv, ids[1]);
    lora_kv_cache_free(kv, ids[4]);
    CHECK(kv->n_free == 2);
    int a = lora_kv_cache_alloc(kv), b = lora_kv_cache_alloc(kv);
    CHECK((a == ids[1] && b == ids[4]) || (a == ids[4] && b == ids[1]));
    CHECK(lora_kv_cache_alloc(kv) == -1);

    /* All freed: the whole pool again, distinct. */
    for (int i = 0; i < N; i++) {
        lora_kv_cache_free(kv, ids[i]);
        CHECK(kv->n_free == i + 1);
    }
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < N; i++) {
        int id = lora_kv_cache_alloc(kv);
        CHECK(id >= 0 && id < N);
        if (id >= 0 && id < N) {
            CHECK(!seen[id]);
            seen[id] = true;
        }
    }
    CHECK(lora_kv_cache_alloc(kv) == -1);

    lora_kv_cache_destroy(&kv);
    CHECK(kv == NULL);
    lora_kv_cache_destroy(&kv); /* destroying NULL is a no-op */
    lora_kv_cache_destroy(NULL);

    CHECK(lora_kv_cache_new(0, KV_DIM, BLOCK, N) == NULL);
    CHECK(lora_kv_cache_new(LAYERS, 0, BLOCK, N) == NULL);
    CHECK(lora_kv_cache_new(LAYERS, KV_DIM, 0, N) == NULL);
    CHECK(lora_kv_cache_new(LAYERS, KV_DIM, BLOCK, 0) == NULL);
    CHECK(lora_kv_cache_new(-1, KV_DIM, BLOCK, N) == NULL);
}

int main(void)
{
    RUN(test_matmul);
    RUN(test_matmul_batch_invariance);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_silu_mul);
    RUN(test_add);
    RUN(test_add_bias);
    RUN(test_embed);
    RUN(test_kv_write_attention);
    RUN(test_lora_sgmv);
    RUN(test_kv_cache_pool);
    return check_done();
}
