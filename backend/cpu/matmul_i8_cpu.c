/* matmul_i8_cpu: the I8 matmul's panels: y = alpha · x · wᵀ (+ y) with w quantized in groups of
 * LORA_I8_GROUP along the input, interleaved in blocks of LORA_I8_BLOCK groups (backend.h's I8
 * layout), batch-invariant.
 *
 * Each row of x is quantized the same way, group by group (scale = max |x| / 127, q = x / scale
 * rounded to nearest even), and laid out in the weights' order, once per call into the backend's
 * staging memory (lora_cpu_matmul spreads the rows over threads, then the panels), so a row's
 * bytes never depend on the batch. A 64-byte load then holds four values of each of a block's
 * sixteen groups, and each int32 lane sums one group's products exactly; at the end of a block
 * the lanes are converted to float32, scaled by the weights' scales times the activations' (one
 * vector of each per block) and added into float32 lanes, block after block, and the lanes are
 * summed in a fixed tree at the end: every output element has one order of operations whatever m
 * and the thread count.
 *
 * With AVX512_VNNI (vpdpbusd: unsigned bytes times signed bytes), the weights' sign bit is flipped
 * on load (q_w + 128, unsigned) and each lane starts at -128 · (the sum of its group's x bytes),
 * staged with x, which cancels the offset exactly. Elsewhere (AVX2) a block is taken as two
 * halves of eight groups, and vpmaddubsw multiplies |q_w| by q_x carrying q_w's sign (|q| <= 127,
 * so a pair's sum never saturates) before vpmaddwd adds the pairs of each lane.
 *
 * A tile takes several rows of w, so that a chunk of x loaded once serves them all; a single row
 * of x takes rows shorter than LORA_CPU_STREAM_ROW_BYTES one at a time instead: the panel is then
 * read as one stream, fetched that far ahead, and longer rows four side by side, each tile
 * fetching the next one's rows; the AVX2 tiles read every row alone at one row of x, as one
 * stream (docs/design.md, "Streaming the weights", has the measurements).
 * Either way each output has the same operations in the same order, so the tile's shape is free
 * to follow m and k.
 */
#include "backend/cpu/kernels_cpu.h"
#include "backend/cpu/widen_cpu.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TVNNI         __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

#if LORA_I8_GROUP % 4 != 0 || LORA_I8_BLOCK != 16
#error "the int8 kernels take groups of a multiple of 4 values, interleaved 16 to a block"
#endif
/* The next tile's rows at the same column (matmul_cpu.c says why; int8 rows are short enough). */
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define G           LORA_I8_GROUP
#define B           LORA_I8_BLOCK
#define UNITS       (G / 4) /* 4-byte units of a group: 64-byte loads per full block */
#define SCALES_AHEAD 8       /* tiles: the weights' scales fetched this far ahead of their use */
/* 3 x 4 tiles: 12 int32 sums and 12 float sums stay in the 32 registers, where 4 x 4 kept its
 * float sums on the stack; the prefill's int8 matmuls ran 1.15x faster for it (docs/design.md). */
#define MR_VNNI     3
#define NR_VNNI     4
/* 4 x 2 on AVX2: each weight vector serves four rows of x. Against 2 x 2, 1.3-1.8x the int8
 * matmul's rate at 8 and 32 rows with the weights streamed from memory, 1.05-1.1x at 256 in L2
 * (docs/design.md, "The AVX2 tiles"). */
#define MR_AVX2     4
#define NR_AVX2     2

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

static int n_blocks(int k)
{
    return (int)((lora_i8_groups(k) + B - 1) / B);
}

/* Row j's scales of block b, SCALES_AHEAD tiles of nr rows ahead: the scales are a stream of
 * their own, too thin for the prefetcher to follow. */
ALWAYS_INLINE void prefetch_scales(const char *w_scales, int j, int nr, int ng, int b)
{
    PREFETCH(w_scales + ((size_t)(j + SCALES_AHEAD * nr) * ng + (size_t)b * B) * 4);
}

/* ---- the staged rows of x ---- */

/* A staged row (64-byte aligned, this many bytes): the values, lora_i8_row_bytes(k) bytes in the
 * layout's order rounded up to 64 (zeros after); then per block 16 int32, each lane's starting
 * value for vpdpbusd (-128 · its group's sum of q; the AVX2 path does not read them); then per
 * block 16 float32 scales (zeros past the last group). */
static size_t q_bytes(int k)
{
    return round_up((size_t)lora_i8_row_bytes(k), 64);
}

size_t lora_cpu_i8_row_bytes(int k)
{
    return q_bytes(k) + 2 * (size_t)n_blocks(k) * 64;
}

/* Quantizes the n <= G values at x into q (G bytes, zeros after n) with the float operations of
 * lora_quantize_i8 and lora_ref_quantize_row; returns the scale. */
static float quantize_group(const float *x, int n, signed char *q)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    int c;

    for (c = 0; c + 8 <= n; c += 8)
        mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + c), abs_mask));
    float lanes[8], max = 0;
    _mm256_storeu_ps(lanes, mx);
    for (int l = 0; l < 8; l++)
        max = lanes[l] > max ? lanes[l] : max;
    for (int t = c; t < n; t++) {
        float a = x[t] < 0 ? -x[t] : x[t];
        max = a > max ? a : max;
    }
    float scale = max / 127.0f, div = scale > 0 ? scale : 1.0f; /* a zero group stays zero */
    __m256 sv = _mm256_set1_ps(div);
    for (c = 0; c + 8 <= n; c += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + c), sv));
        v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
        __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(q + c), _mm_packs_epi16(h, h));
    }
    for (; c < n; c++) {
        int v = _mm_cvtss_si32(_mm_set_ss(x[c] / div)); /* to nearest even, as above */
        q[c] = (signed char)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    memset(q + n, 0, (size_t)(G - n));
    return scale;
}

void lora_cpu_i8_stage_row(const float *x, int k, char *row)
{
    int ng = (int)lora_i8_groups(k), nbk = n_blocks(k);
    size_t qb = q_bytes(k);
    int32_t *start = (int32_t *)(row + qb);
    float *scales = (float *)(row + qb + (size_t)nbk * 64);

    memset(row + lora_i8_row_bytes(k), 0, qb - (size_t)lora_i8_row_bytes(k));
    memset(start, 0, (size_t)nbk * 128); /* and the scales: the lanes past the last group */
    for (int g = 0; g < ng; g++) {
        signed char q[G];
        int c0 = g * G, sum = 0;
        scales[g] = quantize_group(x + c0, k - c0 < G ? k - c0 : G, q);
        for (int u = 0; u < UNITS; u++) /* four values at a time to where the layout puts them */
            memcpy(row + lora_i8_offset(k, c0 + 4 * u), q + 4 * u, 4);
        for (int c = 0; c < G; c++)
            sum += q[c];
        start[g] = -128 * sum;
    }
}

/* ---- AVX512_VNNI ---- */

/* Block b (nb groups) of an mr x nr tile: the lanes' int32 sums, then their scaled sum into f. */
TVNNI ALWAYS_INLINE void vnni_block(__m512 f[MR_VNNI][NR_VNNI], const char *xs, size_t x_stride,
                                    const signed char *w, size_t w_stride, const char *w_scales,
                                    int ng, size_t qb, int nbk, int b, int nb, int mr, int nr)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __mmask64 bytes = nb == B ? ~0ull : (1ull << (4 * nb)) - 1;
    const __mmask16 lanes = (__mmask16)((1u << nb) - 1);
    __m512i acc[MR_VNNI][NR_VNNI];
    size_t at = (size_t)b * B * G;

#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        __m512i start = _mm512_load_si512(xs + (size_t)i * x_stride + qb + (size_t)b * 64);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            acc[i][j] = start;
    }
    for (int u = 0; u < UNITS; u++, at += (size_t)(4 * nb)) {
        __m512i wv[NR_VNNI];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            const signed char *p = w + (size_t)j * w_stride + at;
            __m512i v = nb == B ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(bytes, p);
            /* one row: ahead in its stream; else the next tile's row, at one row of x
             * into L2, as tile16 does (see the top) */
            if (nr == 1)
                PREFETCH(p + LORA_CPU_STREAM_ROW_BYTES);
            else if (mr == 1)
                _mm_prefetch((const char *)(p + (size_t)nr * w_stride), _MM_HINT_T1);
            else
                PREFETCH(p + (size_t)nr * w_stride);
            wv[j] = _mm512_xor_si512(v, flip);
        }
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const char *p = xs + (size_t)i * x_stride + at;
            __m512i xv = nb == B ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(bytes, p);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xv);
        }
    }
    __m512 sw[NR_VNNI];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) {
        prefetch_scales(w_scales, j, nr, ng, b);
        sw[j] = _mm512_maskz_loadu_ps(lanes, w_scales + ((size_t)j * ng + (size_t)b * B) * 4);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        __m512 sx = _mm512_load_ps(xs + (size_t)i * x_stride + qb + (size_t)(nbk + b) * 64);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            f[i][j] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j]), _mm512_mul_ps(sw[j], sx), f[i][j]);
    }
}

TVNNI ALWAYS_INLINE void vnni_tile(float *y, int ldy, const char *xs, size_t x_stride,
                                   const signed char *w, int k, const char *w_scales, int mr,
                                   int nr, float alpha, bool acc)
{
    __m512 f[MR_VNNI][NR_VNNI];
    int ng = (int)lora_i8_groups(k), nbk = n_blocks(k), full = ng / B;
    size_t w_stride = (size_t)lora_i8_row_bytes(k), qb = q_bytes(k);

#pragma GCC unroll 4
    for (int i = 0; i < MR_VNNI; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR_VNNI; j++)
            f[i][j] = _mm512_setzero_ps();
    for (int b = 0; b < full; b++)
        vnni_block(f, xs, x_stride, w, w_stride, w_scales, ng, qb, nbk, b, B, mr, nr);
    if (full < nbk)
        vnni_block(f, xs, x_stride, w, w_stride, w_scales, ng, qb, nbk, full, ng - full * B, mr,
                   nr);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        float *yi = y + (size_t)i * ldy;
        if (nr == NR_VNNI) { /* the same sums, four at once */
            __m128 v = _mm_mul_ps(_mm_set1_ps(alpha),
                                  lora_cpu_reduce_add4(f[i][0], f[i][1], f[i][2], f[i][3]));
            _mm_storeu_ps(yi, acc ? _mm_add_ps(_mm_loadu_ps(yi), v) : v);
            continue;
        }
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * _mm512_reduce_add_ps(f[i][j]);
            yi[j] = acc ? yi[j] + v : v;
        }
    }
}

/* The tiles of rows [n0, n1) of w for mr rows of x: nr_max rows of w at a time, then the rows
 * left one at a time; tile(mr, nr) computes rows [j, j + nr). */
#define TILES(tile, nr_max, mr)                                                                    \
    do {                                                                                           \
        int j = n0;                                                                                \
        for (; j + (nr_max) <= n1; j += (nr_max))                                                  \
            tile(mr, nr_max);                                                                      \
        for (; j < n1; j++)                                                                        \
            tile(mr, 1);                                                                           \
    } while (0)

#define VNNI_TILE(mr, nr)                                                                          \
    vnni_tile(yi + j, ldy, xi, stride, w + (size_t)j * w_stride, k,                                \
              w_scales + (size_t)j * ng * sizeof(float), mr, nr, alpha, acc)

TVNNI static void vnni_panel(float *y, int ldy, const char *xs, size_t stride, const signed char *w,
                             const char *w_scales, int m, int k, int n0, int n1, float alpha,
                             bool acc)
{
    int ng = (int)lora_i8_groups(k);
    size_t w_stride = (size_t)lora_i8_row_bytes(k);

    for (int i = 0; i < m;) {
        int mr = m - i >= MR_VNNI ? MR_VNNI : m - i;
        float *yi = y + (size_t)i * ldy;
        const char *xi = xs + (size_t)i * stride;
        switch (mr) {
        case 3:
            TILES(VNNI_TILE, NR_VNNI, 3);
            break;
        case 2:
            TILES(VNNI_TILE, NR_VNNI, 2);
            break;
        default: /* short rows one at a time: one stream the prefetcher follows (see the top) */
            if (w_stride >= LORA_CPU_STREAM_ROW_BYTES)
                TILES(VNNI_TILE, NR_VNNI, 1);
            else
                TILES(VNNI_TILE, 1, 1);
            break;
        }
        i += mr;
    }
}

/* ---- AVX2 ---- */

/* Half h (groups 8h.. of nb) of block b of an mr x nr tile, as vnni_block. Unless masked (loads
 * of the half's groups only), a half of fewer than 8 groups is read with whole 32-byte loads all
 * the same, its lanes past the last group holding the next bytes' products, which the scales
 * zero exactly (the weights' are loaded masked, the staged x's are zeros there): the load runs
 * at most 28 bytes past the row, within a staged row of x and, unless the tile holds w's last
 * row, within w. With several rows of x the masked loads cost AVX2 more: k = 896 ends every row
 * in such a half. */
ALWAYS_INLINE void avx2_half(__m256 f[MR_AVX2][NR_AVX2], const char *xs, size_t x_stride,
                             const signed char *w, size_t w_stride, const char *w_scales, int ng,
                             size_t qb, int nbk, int b, int nb, int h, int mr, int nr, bool masked)
{
    const int n = nb - 8 * h < 8 ? nb - 8 * h : 8; /* groups of this half */
    const __m256i lanes =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[MR_AVX2][NR_AVX2];
    size_t at = (size_t)b * B * G + (size_t)(32 * h);

#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            acc[i][j] = _mm256_setzero_si256();
    for (int u = 0; u < UNITS; u++, at += (size_t)(4 * nb)) {
        __m256i wv[NR_AVX2], aw[NR_AVX2];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            const signed char *p = w + (size_t)j * w_stride + at;
            wv[j] = n == 8 || !masked ? _mm256_loadu_si256((const __m256i *)p)
                                      : _mm256_maskload_epi32((const int *)p, lanes);
            /* one row: ahead in its stream, once a line (the second half reads the lines the
             * first did); else the next tile's row at the same column */
            if (nr > 1)
                PREFETCH(p + (size_t)nr * w_stride);
            else if (h == 0)
                PREFETCH(p + LORA_CPU_STREAM_ROW_BYTES);
            aw[j] = _mm256_abs_epi8(wv[j]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const char *p = xs + (size_t)i * x_stride + at;
            __m256i xv = n == 8 || !masked ? _mm256_loadu_si256((const __m256i *)p)
                                           : _mm256_maskload_epi32((const int *)p, lanes);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm256_add_epi32(
                    acc[i][j], _mm256_madd_epi16(
                                   _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(xv, wv[j])), ones));
        }
    }
    __m256 sw[NR_AVX2];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) {
        if (h == 0) /* once a block */
            prefetch_scales(w_scales, j, nr, ng, b);
        sw[j] = _mm256_maskload_ps(
            (const float *)(w_scales + ((size_t)j * ng + (size_t)(b * B + 8 * h)) * 4), lanes);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        __m256 sx = _mm256_load_ps(
            (const float *)(xs + (size_t)i * x_stride + qb + (size_t)(nbk + b) * 64) + 8 * h);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            f[i][j] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][j]), _mm256_mul_ps(sw[j], sx), f[i][j]);
    }
}

ALWAYS_INLINE void avx2_tile(float *y, int ldy, const char *xs, size_t x_stride,
                             const signed char *w, int k, const char *w_scales, int mr, int nr,
                             float alpha, bool acc, bool masked)
{
    __m256 f[MR_AVX2][NR_AVX2];
    int ng = (int)lora_i8_groups(k), nbk = n_blocks(k), full = ng / B, last = ng - full * B;
    size_t w_stride = (size_t)lora_i8_row_bytes(k), qb = q_bytes(k);

#pragma GCC unroll 4
    for (int i = 0; i < MR_AVX2; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR_AVX2; j++)
            f[i][j] = _mm256_setzero_ps();
    for (int b = 0; b < full; b++) {
        avx2_half(f, xs, x_stride, w, w_stride, w_scales, ng, qb, nbk, b, B, 0, mr, nr, masked);
        avx2_half(f, xs, x_stride, w, w_stride, w_scales, ng, qb, nbk, b, B, 1, mr, nr, masked);
    }
    if (last > 0)
        avx2_half(f, xs, x_stride, w, w_stride, w_scales, ng, qb, nbk, full, last, 0, mr, nr,
                  masked);
    if (last > 8)
        avx2_half(f, xs, x_stride, w, w_stride, w_scales, ng, qb, nbk, full, last, 1, mr, nr,
                  masked);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * lora_cpu_hsum8(f[i][j]);
            y[(size_t)i * ldy + j] = acc ? y[(size_t)i * ldy + j] + v : v;
        }
    }
}

/* Rows [j, j + nr) of w as an mr x nr tile, its loads masked at one row of x (where whole loads
 * measured slower: docs/design.md, "The AVX2 tiles") and where the tile holds w's last row. */
#define AVX2_TILE(mr, nr)                                                                          \
    do {                                                                                           \
        const signed char *wj = w + (size_t)j * w_stride;                                          \
        const char *sj = w_scales + (size_t)j * ng * sizeof(float);                                \
        if ((mr) > 1 && j + (nr) < n_w)                                                            \
            avx2_tile(yi + j, ldy, xi, stride, wj, k, sj, mr, nr, alpha, acc, false);              \
        else                                                                                       \
            avx2_tile(yi + j, ldy, xi, stride, wj, k, sj, mr, nr, alpha, acc, true);               \
    } while (0)

static void avx2_panel(float *y, int ldy, const char *xs, size_t stride, const signed char *w,
                       const char *w_scales, int m, int k, int n0, int n1, float alpha, bool acc)
{
    int ng = (int)lora_i8_groups(k);
    size_t w_stride = (size_t)lora_i8_row_bytes(k);
    /* w's rows: its scales follow its last row (backend.h's I8 layout) */
    int n_w = (int)((size_t)(w_scales - (const char *)w) / w_stride);

    for (int i = 0; i < m;) {
        int mr = m - i >= MR_AVX2 ? MR_AVX2 : m - i;
        float *yi = y + (size_t)i * ldy;
        const char *xi = xs + (size_t)i * stride;
        switch (mr) {
        case 4:
            TILES(AVX2_TILE, NR_AVX2, 4);
            break;
        case 3:
            TILES(AVX2_TILE, NR_AVX2, 3);
            break;
        case 2:
            TILES(AVX2_TILE, NR_AVX2, 2);
            break;
        default: /* one row of x: every row of w alone, as one stream (see the top) */
            TILES(AVX2_TILE, 1, 1);
            break;
        }
        i += mr;
    }
}

/* ---- the path ---- */

void lora_cpu_i8_panel(const struct lora_cpu_isa *isa, float *y, int ldy, const char *xs,
                       const signed char *w, const char *w_scales, int m, int k, int n0, int n1,
                       float alpha, bool acc)
{
    size_t stride = lora_cpu_i8_row_bytes(k);

    if (isa->vnni)
        vnni_panel(y, ldy, xs, stride, w, w_scales, m, k, n0, n1, alpha, acc);
    else
        avx2_panel(y, ldy, xs, stride, w, w_scales, m, k, n0, n1, alpha, acc);
}
