/* matmul_cpu: y = alpha · x · wᵀ (+ y), batch-invariant.
 *
 * Why not OpenBLAS here: its sgemm picks different micro-kernels by matrix shape (for example
 * M <= 4 against M >= 5 at some sizes), so one row's result changes with the number of rows in the
 * batch, and a request's log-probabilities would depend on who it shares a step with. This kernel
 * computes every output element in one fixed order, whatever m and whatever thread computes it:
 * the vector lanes accumulate k = lane, lane + width, ... with fused multiply-adds (the tail
 * through masked loads, which add exact zeros), then the lanes are summed in a fixed tree.
 * Register tiles reuse every load; threads split the rows of w, so each weight is streamed from
 * memory once per call, which is what bounds decoding. Where the CPU has AVX-512 every call uses
 * 16 lanes and 4 x 4 tiles, else AVX2 with 8 lanes and 2 x 4 tiles: one path per machine, so
 * results are reproducible on it (not across the two).
 */
#include "backend/cpu/kernels_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define MR 2 /* rows of x per tile */
#define NR 4 /* rows of w per tile */

static inline __attribute__((always_inline)) float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One tile of mr x nr outputs (mr <= MR, nr <= NR known at each call site). */
static inline __attribute__((always_inline)) void tile(float *y, int ldy, const float *x,
                                                       const float *w, int k, __m256i tail_mask,
                                                       int mr, int nr, float alpha, bool acc)
{
    __m256 a[MR][NR];
    int kk = 0;

#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++)
            a[i][j] = _mm256_setzero_ps();
    for (; kk + 8 <= k; kk += 8) {
        __m256 wv[NR], xv[MR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            wv[j] = _mm256_loadu_ps(w + (size_t)j * k + kk);
#pragma GCC unroll 2
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm256_loadu_ps(x + (size_t)i * k + kk);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm256_fmadd_ps(xv[i], wv[j], a[i][j]);
        }
    }
    if (kk < k) {
        __m256 wv[NR], xv[MR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            wv[j] = _mm256_maskload_ps(w + (size_t)j * k + kk, tail_mask);
#pragma GCC unroll 2
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm256_maskload_ps(x + (size_t)i * k + kk, tail_mask);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm256_fmadd_ps(xv[i], wv[j], a[i][j]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * hsum(a[i][j]);
            y[(size_t)i * ldy + j] = acc ? y[(size_t)i * ldy + j] + v : v;
        }
    }
}

/* Rows [n0, n1) of w against every row of x. */
static void panel(float *y, int ldy, const float *x, const float *w, int m, int k, int n0, int n1,
                  __m256i tail_mask, float alpha, bool acc)
{
    for (int i = 0; i < m; i += MR) {
        const float *xi = x + (size_t)i * k;
        float *yi = y + (size_t)i * ldy;
        int j = n0;
        if (m - i >= MR) {
            for (; j + NR <= n1; j += NR)
                tile(yi + j, ldy, xi, w + (size_t)j * k, k, tail_mask, MR, NR, alpha, acc);
            for (; j < n1; j++)
                tile(yi + j, ldy, xi, w + (size_t)j * k, k, tail_mask, MR, 1, alpha, acc);
        } else {
            for (; j + NR <= n1; j += NR)
                tile(yi + j, ldy, xi, w + (size_t)j * k, k, tail_mask, 1, NR, alpha, acc);
            for (; j < n1; j++)
                tile(yi + j, ldy, xi, w + (size_t)j * k, k, tail_mask, 1, 1, alpha, acc);
        }
    }
}

static __m256i tail_mask_of(int k)
{
    int rem = k % 8;
    return _mm256_setr_epi32(rem > 0 ? -1 : 0, rem > 1 ? -1 : 0, rem > 2 ? -1 : 0,
                             rem > 3 ? -1 : 0, rem > 4 ? -1 : 0, rem > 5 ? -1 : 0,
                             rem > 6 ? -1 : 0, 0);
}

#define MR16 4 /* rows of x per AVX-512 tile */

__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
tile16(float *y, int ldy, const float *x, const float *w, int k, __mmask16 tail, int mr, int nr,
       float alpha, bool acc)
{
    __m512 a[MR16][NR];
    int kk = 0;

#pragma GCC unroll 4
    for (int i = 0; i < MR16; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++)
            a[i][j] = _mm512_setzero_ps();
    for (; kk + 16 <= k; kk += 16) {
        __m512 wv[NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            wv[j] = _mm512_loadu_ps(w + (size_t)j * k + kk);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)i * k + kk);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm512_fmadd_ps(xv, wv[j], a[i][j]);
        }
    }
    if (kk < k) {
        __m512 wv[NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            wv[j] = _mm512_maskz_loadu_ps(tail, w + (size_t)j * k + kk);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, x + (size_t)i * k + kk);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm512_fmadd_ps(xv, wv[j], a[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * _mm512_reduce_add_ps(a[i][j]);
            y[(size_t)i * ldy + j] = acc ? y[(size_t)i * ldy + j] + v : v;
        }
    }
}

/* The rows of w in [n0, n1) against rows of x in groups of mr (a constant at each call). */
#define PANEL16_ROWS(mr)                                                                         \
    do {                                                                                         \
        int j = n0;                                                                              \
        for (; j + NR <= n1; j += NR)                                                            \
            tile16(yi + j, ldy, xi, w + (size_t)j * k, k, tail, mr, NR, alpha, acc);               \
        for (; j < n1; j++)                                                                      \
            tile16(yi + j, ldy, xi, w + (size_t)j * k, k, tail, mr, 1, alpha, acc);                \
    } while (0)

__attribute__((target("avx512f"))) static void panel16(float *y, int ldy, const float *x,
                                                       const float *w, int m, int k, int n0,
                                                       int n1, float alpha, bool acc)
{
    __mmask16 tail = (__mmask16)((1u << (k % 16)) - 1);

    for (int i = 0; i < m;) {
        const float *xi = x + (size_t)i * k;
        float *yi = y + (size_t)i * ldy;
        switch (m - i >= MR16 ? MR16 : m - i) {
        case 4:
            PANEL16_ROWS(4);
            i += 4;
            break;
        case 3:
            PANEL16_ROWS(3);
            i += 3;
            break;
        case 2:
            PANEL16_ROWS(2);
            i += 2;
            break;
        default:
            PANEL16_ROWS(1);
            i += 1;
            break;
        }
    }
}

static bool has_avx512(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = __builtin_cpu_supports("avx512f") && !getenv("LORA_NO_AVX512");
    return cached;
}

/* y (m rows, stride ldy), columns [n0, n1) = alpha · x (m, k) · rows [n0, n1) of wᵀ (+ y). */
static void run_panel(float *y, int ldy, const float *x, const float *w, int m, int k, int n0,
                      int n1, float alpha, bool acc)
{
    if (has_avx512())
        panel16(y, ldy, x, w, m, k, n0, n1, alpha, acc);
    else
        panel(y, ldy, x, w, m, k, n0, n1, tail_mask_of(k), alpha, acc);
}


void lora_cpu_matmul(float *y, const float *x, const float *w, int m, int n, int k, float alpha,
                   bool accumulate)
{
    /* Panels of w small enough to stay in L2 while every row of x passes over them, and enough
     * of them to keep every thread busy. */
    int rows = (int)((256 * 1024) / ((size_t)k * sizeof(float) + 1));
    int share = (n + 4 * omp_get_max_threads() - 1) / (4 * omp_get_max_threads());
    rows = share < rows ? share : rows;
    rows = rows < NR ? NR : rows + (NR - rows % NR) % NR;
    int n_panels = (n + rows - 1) / rows;
    long work = (long)m * n * k;

#pragma omp parallel for schedule(dynamic, 1) if (work > 32768 && n_panels > 1)
    for (int p = 0; p < n_panels; p++) {
        int n0 = p * rows, n1 = n0 + rows < n ? n0 + rows : n;
        run_panel(y, n, x, w, m, k, n0, n1, alpha, accumulate);
    }
}

/* y row (out) += scale · (t row (rank) · b_t (rank, out)) over columns [c0, c1): each output
 * accumulates over the rank in order, then is added once, the same way on every path. */
static void expand_row(float *y, const float *t, const float *b_t, int rank, int out, int c0,
                       int c1, float scale)
{
    __m256 sv = _mm256_set1_ps(scale);
    int c = c0;

    for (; c + 32 <= c1; c += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int r = 0; r < rank; r++) {
            __m256 tv = _mm256_set1_ps(t[r]);
            const float *b = b_t + (size_t)r * out + c;
            a0 = _mm256_fmadd_ps(tv, _mm256_loadu_ps(b), a0);
            a1 = _mm256_fmadd_ps(tv, _mm256_loadu_ps(b + 8), a1);
            a2 = _mm256_fmadd_ps(tv, _mm256_loadu_ps(b + 16), a2);
            a3 = _mm256_fmadd_ps(tv, _mm256_loadu_ps(b + 24), a3);
        }
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(sv, a0, _mm256_loadu_ps(y + c)));
        _mm256_storeu_ps(y + c + 8, _mm256_fmadd_ps(sv, a1, _mm256_loadu_ps(y + c + 8)));
        _mm256_storeu_ps(y + c + 16, _mm256_fmadd_ps(sv, a2, _mm256_loadu_ps(y + c + 16)));
        _mm256_storeu_ps(y + c + 24, _mm256_fmadd_ps(sv, a3, _mm256_loadu_ps(y + c + 24)));
    }
    for (; c < c1; c++) {
        float a = 0;
        for (int r = 0; r < rank; r++)
            a = fmaf(t[r], b_t[(size_t)r * out + c], a);
        y[c] = fmaf(scale, a, y[c]);
    }
}

/* Work items per segment: shrink splits a segment's rank (NR rows of A each, so A is read once),
 * expand its output columns. */
#define SGMV_SPLIT 8

void lora_cpu_lora_sgmv(float *y, const float *x, const struct lora_sgmv_seg *segs, int n_segs,
                      int in, int out, float *tmp, int max_rank)
{
    int n_items = n_segs * SGMV_SPLIT;

#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; it++) {
            const struct lora_sgmv_seg *g = &segs[it / SGMV_SPLIT];
            int part = it % SGMV_SPLIT, quads = (g->rank + NR - 1) / NR;
            int j0 = NR * (quads * part / SGMV_SPLIT), j1 = NR * (quads * (part + 1) / SGMV_SPLIT);
            j1 = j1 < g->rank ? j1 : g->rank;
            if (j0 < j1)
                run_panel(tmp + (size_t)g->row * max_rank, max_rank, x + (size_t)g->row * in,
                          lora_tensor_addr(&g->a), g->n_rows, in, j0, j1, 1.0f, false);
        }
        /* The implicit barrier above: every t row is ready. */
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; it++) {
            const struct lora_sgmv_seg *g = &segs[it / SGMV_SPLIT];
            int part = it % SGMV_SPLIT, chunks = (out + 31) / 32;
            int c0 = 32 * (chunks * part / SGMV_SPLIT);
            int c1 = 32 * (chunks * (part + 1) / SGMV_SPLIT);
            c1 = c1 < out ? c1 : out;
            for (int i = g->row; i < g->row + g->n_rows && c0 < c1; i++)
                expand_row(y + (size_t)i * out, tmp + (size_t)i * max_rank,
                           lora_tensor_addr(&g->b_t), g->rank, out, c0, c1, g->scale);
        }
    }
}
