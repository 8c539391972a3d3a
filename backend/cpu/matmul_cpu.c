/* matmul_cpu: y = alpha · x · wᵀ (+ y), batch-invariant, for weights of F32, BF16, F16 and I8
 * (the I8 tiles are in matmul_i8_cpu.c), and the multi-LoRA SGMV built on the same tiles.
 *
 * Why not OpenBLAS here: its sgemm picks different micro-kernels by matrix shape (for example
 * M <= 4 against M >= 5 at some sizes), so one row's result changes with the number of rows in the
 * batch, and a request's log-probabilities would depend on who it shares a step with. This kernel
 * computes every output element in one fixed order, whatever m and whatever thread computes it:
 * the vector lanes accumulate k = lane, lane + width, ... with fused multiply-adds (the tail
 * through masked loads, which add exact zeros), then the lanes are summed in a fixed tree.
 * Register tiles reuse every load; threads split the rows of w, so each weight is streamed from
 * memory once per call, which is what bounds decoding. Where the CPU has AVX-512 every call uses
 * 16 lanes and 6 x 4 tiles, else AVX2 with 8 lanes and 4 x 3 tiles: one path per backend, chosen
 * when it opens, so results are reproducible on a machine (not across the two).
 *
 * BF16 and F16 weights are widened to float32 in registers (bf16 by a shift, f16 by vcvtph2ps)
 * and go through the very same FMAs in the same order: the exact mode's result is the F32
 * matmul's on the widened weights, bit for bit. The fast BF16 mode rounds each row of x to bf16
 * once per call into the backend's staging memory (threads split the rows, then the panels; no
 * allocation, and a row's rounding is the same whoever does it), then sums pairs of products with
 * vdpbf16ps into float32 lanes, in the same fixed lane order; a machine without AVX512_BF16 widens
 * the rounded x back to float32 and uses the exact tiles (the same products, summed one at a
 * time). The I8 path stages its quantized rows the same way.
 */
#include "backend/cpu/kernels_cpu.h"
#include "backend/cpu/widen_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define T512          __attribute__((target("avx512f,avx512bw,avx512vl")))
#define T512BF16      __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* The next tile's rows at the same column, fetched while this tile streams its own: a tile's rows
 * end before the hardware prefetcher has learnt them. The 16-bit and I8 tiles do it; float32
 * lost by it (docs/design.md, "Streaming the weights"). */
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

#define NR 4 /* rows of w per AVX-512 tile (lora_cpu_reduce_add4 sums four at once) */

/* AVX2 tiles: MR8 rows of x by NR8 rows of w take 12 sums, 3 rows of w and 1 of x, all 16
 * registers. A single row of x takes NR8_ONE rows of 16-bit weights at a time, NR8_ONE_F32 of
 * float32: the shapes that read fastest at m = 1 (docs/design.md, "The AVX2 tiles"). */
#define MR8         4
#define NR8         3
#define NR8_ONE     2
#define NR8_ONE_F32 4

/* ---- bf16 rounding of activations (the fast mode's staging) ---- */

/* x (k) rounded to bf16 to nearest even, as lora_f32_to_bf16 does (NaN kept quiet), as the
 * top halves of 32-bit lanes. */
ALWAYS_INLINE __m256i round_bf16_8(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    return _mm256_and_si256(_mm256_blendv_epi8(r, q, nan), _mm256_set1_epi32((int)0xffff0000u));
}

/* A row x (k) rounded to bf16 and widened back: k floats at dst. */
static void stage_bf16_as_f32(const float *x, int k, float *dst)
{
    int c = 0;

    for (; c + 8 <= k; c += 8)
        _mm256_storeu_si256((__m256i *)(dst + c), round_bf16_8(_mm256_loadu_ps(x + c)));
    for (; c < k; c++) {
        uint32_t u = (uint32_t)lora_f32_to_bf16(x[c]) << 16;
        memcpy(dst + c, &u, sizeof(u));
    }
}

/* A row x (k) as bf16 bits: kp (k rounded up to 32) values at dst, zeros after k. */
T512 static void stage_bf16_bits(const float *x, int k, int kp, uint16_t *dst)
{
    int c = 0;

    for (; c + 8 <= k; c += 8) {
        __m256i r = _mm256_srli_epi32(round_bf16_8(_mm256_loadu_ps(x + c)), 16);
        _mm_storeu_si128((__m128i *)(dst + c), _mm256_cvtepi32_epi16(r));
    }
    for (; c < k; c++)
        dst[c] = lora_f32_to_bf16(x[c]);
    for (; c < kp; c++)
        dst[c] = 0;
}

/* ---- AVX2: 8 lanes ---- */

/* Element size of a float path's weight. */
static size_t w_size(enum lora_dtype dt)
{
    return dt == LORA_DTYPE_F32 ? 4 : 2;
}

/* The rem (1..7) weights from element i, zeros after. AVX2 has no 16-bit masked load: the 16-bit
 * types go through a zeroed copy, which reads nothing past the row either. */
ALWAYS_INLINE __m256 load8_tail(const void *w, size_t i, int rem, __m256i mask, enum lora_dtype dt)
{
    if (dt == LORA_DTYPE_F32)
        return _mm256_maskload_ps((const float *)w + i, mask);
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)w + i, (size_t)rem * sizeof(uint16_t));
    return lora_cpu_widen8(buf, 0, dt);
}

/* One tile of mr x nr outputs (mr <= MR8, nr <= NR8_ONE_F32 known at each call site). 16-bit
 * weights prefetch the next tile's rows at the pace this tile reads its own: rows of 4 KiB or more
 * each at the column being read, shorter ones as the one run they make in memory. */
ALWAYS_INLINE void tile(float *y, int ldy, const float *x, const void *w, enum lora_dtype dt, int k,
                        __m256i tail_mask, int mr, int nr, float alpha, bool acc)
{
    __m256 a[MR8][NR8_ONE_F32];
    const size_t es = w_size(dt);
    const char *next = (const char *)w + (size_t)nr * k * es;
    const bool long_rows = (size_t)k * es >= 4096;
    int kk = 0;

#pragma GCC unroll 4
    for (int i = 0; i < MR8; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR8_ONE_F32; j++)
            a[i][j] = _mm256_setzero_ps();
    for (; kk + 8 <= k; kk += 8) {
        __m256 wv[NR8_ONE_F32], xv[MR8];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            wv[j] = lora_cpu_widen8(w, (size_t)j * k + kk, dt);
        if (dt != LORA_DTYPE_F32) { /* a constant in each instance */
            if (long_rows)
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++)
                    PREFETCH(next + ((size_t)j * k + kk) * es);
            else
                PREFETCH(next + (size_t)kk * nr * es);
        }
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm256_loadu_ps(x + (size_t)i * k + kk);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm256_fmadd_ps(xv[i], wv[j], a[i][j]);
        }
    }
    if (kk < k) {
        __m256 wv[NR8_ONE_F32], xv[MR8];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            wv[j] = load8_tail(w, (size_t)j * k + kk, k - kk, tail_mask, dt);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm256_maskload_ps(x + (size_t)i * k + kk, tail_mask);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm256_fmadd_ps(xv[i], wv[j], a[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * lora_cpu_hsum8(a[i][j]);
            y[(size_t)i * ldy + j] = acc ? y[(size_t)i * ldy + j] + v : v;
        }
    }
}

static __m256i tail_mask_of(int k)
{
    int rem = k % 8;
    return _mm256_setr_epi32(rem > 0 ? -1 : 0, rem > 1 ? -1 : 0, rem > 2 ? -1 : 0, rem > 3 ? -1 : 0,
                             rem > 4 ? -1 : 0, rem > 5 ? -1 : 0, rem > 6 ? -1 : 0, 0);
}

/* Rows [n0, n1) of w against rows of x in tiles of mr x nr (constants at each call). */
#define PANEL8_ROWS(mr, nr)                                                                        \
    do {                                                                                           \
        int j = n0;                                                                                \
        for (; j + (nr) <= n1; j += (nr))                                                          \
            tile(yi + j, ldy, xi, (const char *)w + (size_t)j * k * es, dt, k, tail_mask, mr, nr,  \
                 alpha, acc);                                                                      \
        for (; j < n1; j++)                                                                        \
            tile(yi + j, ldy, xi, (const char *)w + (size_t)j * k * es, dt, k, tail_mask, mr, 1,   \
                 alpha, acc);                                                                      \
    } while (0)

/* Rows [n0, n1) of w against every row of x. */
ALWAYS_INLINE void panel8_body(float *y, int ldy, const float *x, const void *w, enum lora_dtype dt,
                               int m, int k, int n0, int n1, float alpha, bool acc)
{
    __m256i tail_mask = tail_mask_of(k);
    size_t es = w_size(dt);

    for (int i = 0; i < m;) {
        int mr = m - i >= MR8 ? MR8 : m - i;
        const float *xi = x + (size_t)i * k;
        float *yi = y + (size_t)i * ldy;
        switch (mr) {
        case MR8:
            PANEL8_ROWS(MR8, NR8);
            break;
        case 3:
            PANEL8_ROWS(3, NR8);
            break;
        case 2:
            PANEL8_ROWS(2, NR8);
            break;
        default:
            if (dt == LORA_DTYPE_F32)
                PANEL8_ROWS(1, NR8_ONE_F32);
            else
                PANEL8_ROWS(1, NR8_ONE);
            break;
        }
        i += mr;
    }
}

static void panel8(float *y, int ldy, const float *x, const void *w, enum lora_dtype dt, int m,
                   int k, int n0, int n1, float alpha, bool acc)
{
    switch (dt) {
    case LORA_DTYPE_F32:
        panel8_body(y, ldy, x, w, LORA_DTYPE_F32, m, k, n0, n1, alpha, acc);
        break;
    case LORA_DTYPE_BF16:
        panel8_body(y, ldy, x, w, LORA_DTYPE_BF16, m, k, n0, n1, alpha, acc);
        break;
    default:
        panel8_body(y, ldy, x, w, LORA_DTYPE_F16, m, k, n0, n1, alpha, acc);
        break;
    }
}

/* ---- AVX-512: 16 lanes ---- */

#define MR16 6 /* rows of x per AVX-512 tile: 24 sums, 4 rows of w and 1 of x in 32 registers */

/* k is cut into blocks when a tile's rows of x would not stay in L1 while the panel's rows of w
 * pass under them (6 rows of 4864 bf16 are 58 KiB): KBLOCK_DOT staged bf16 values or
 * KBLOCK_F32 floats, 12 KiB of x (measured against 6 and 24 KiB). The panels of so long a k
 * are at most KBLOCK_MAX_ROWS rows of w (lora_cpu_matmul keeps a panel within 256 KiB), whose
 * carried sums take part[]. One row of x stays in L1 whole: decoding is not blocked (it lost
 * 1-4% by it). */
#define KBLOCK_DOT        1024
#define KBLOCK_F32        512
#define KBLOCK_MAX_ROWS   64
#define KBLOCK_PART_TILES (KBLOCK_MAX_ROWS / NR + NR)

T512 ALWAYS_INLINE __m512 load16_tail(const void *w, size_t i, __mmask16 tail, enum lora_dtype dt)
{
    if (dt == LORA_DTYPE_F32)
        return _mm512_maskz_loadu_ps(tail, (const float *)w + i);
    __m256i h = _mm256_maskz_loadu_epi16(tail, (const uint16_t *)w + i);
    if (dt == LORA_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* y (mr x nr, stride ldy) = alpha · the lane sums of a (+ y). */
T512 ALWAYS_INLINE void store_sums(float *y, int ldy, __m512 a[MR16][NR], int mr, int nr,
                                   float alpha, bool acc)
{
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        float *yi = y + (size_t)i * ldy;
        if (nr == NR) {
            __m128 v = _mm_mul_ps(_mm_set1_ps(alpha),
                                  lora_cpu_reduce_add4(a[i][0], a[i][1], a[i][2], a[i][3]));
            _mm_storeu_ps(yi, acc ? _mm_add_ps(_mm_loadu_ps(yi), v) : v);
            continue;
        }
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            float v = alpha * _mm512_reduce_add_ps(a[i][j]);
            yi[j] = acc ? yi[j] + v : v;
        }
    }
}

/* A tile's lane sums at the start of its k range: those carried in part from the range before,
 * or zeros at k0 = 0 (see tile_dot). */
T512 ALWAYS_INLINE void start_sums(__m512 a[MR16][NR], const __m512 *part, int k0, int mr, int nr)
{
#pragma GCC unroll 8
    for (int i = 0; i < MR16; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++)
            a[i][j] = part && k0 > 0 && i < mr && j < nr ? part[i * NR + j] : _mm512_setzero_ps();
}

/* At the end of a tile's k range: the sums carried into part for the next range when k goes on
 * (k1 < k), else summed into y. */
T512 ALWAYS_INLINE void end_sums(float *y, int ldy, __m512 a[MR16][NR], __m512 *part, int k1, int k,
                                 int mr, int nr, float alpha, bool acc)
{
    if (part && k1 < k) {
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                part[i * NR + j] = a[i][j];
        return;
    }
    store_sums(y, ldy, a, mr, nr, alpha, acc);
}

/* The k block of a panel of w's rows [n0, n1) against m rows of x: kb_max where blocking pays
 * (see KBLOCK_DOT), else all of k. */
static inline int k_block(int m, int k, int n0, int n1, int kb_max)
{
    return m > 1 && k >= 2 * kb_max && n1 - n0 <= KBLOCK_MAX_ROWS ? kb_max : k;
}

/* The k range [k0, k1) of an mr x nr tile, the lane sums carried in part as tile_dot does. */
T512 ALWAYS_INLINE void tile16(float *y, int ldy, const float *x, const void *w, enum lora_dtype dt,
                               int k, int k0, int k1, __mmask16 tail, int mr, int nr, float alpha,
                               bool acc, __m512 *part, bool stream_l2)
{
    __m512 a[MR16][NR];
    int kk = k0;

    start_sums(a, part, k0, mr, nr);
    /* One row of x (decode) on 16-bit weights: two steps at a time, so that each row of w is read
     * in whole lines. A lone row of w fetches its stream LORA_CPU_STREAM_ROW_BYTES ahead (into L2
     * where stream_l2 says so, else L1); four fetch the next tile's line once, into L2 so that it
     * does not push x out of L1 (docs/design.md, "Streaming the weights"). The same products into
     * the same sums in the same order as the loop below. */
    if (dt != LORA_DTYPE_F32 && mr == 1)
        for (; kk + 32 <= k1; kk += 32) {
            __m512 wv[NR], wv2[NR];
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++) {
                const uint16_t *p = (const uint16_t *)w + (size_t)j * k + kk;
                wv[j] = lora_cpu_widen16(p, 0, dt);
                wv2[j] = lora_cpu_widen16(p, 16, dt);
                if (nr == 1 && stream_l2)
                    _mm_prefetch((const char *)p + LORA_CPU_STREAM_ROW_BYTES, _MM_HINT_T1);
                else if (nr == 1)
                    PREFETCH((const char *)p + LORA_CPU_STREAM_ROW_BYTES);
                else
                    _mm_prefetch((const char *)(p + (size_t)nr * k), _MM_HINT_T1);
            }
            __m512 xv = _mm512_loadu_ps(x + kk), xv2 = _mm512_loadu_ps(x + kk + 16);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                a[0][j] = _mm512_fmadd_ps(xv2, wv2[j], _mm512_fmadd_ps(xv, wv[j], a[0][j]));
        }
    for (; kk + 16 <= k1; kk += 16) {
        __m512 wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            wv[j] = lora_cpu_widen16(w, (size_t)j * k + kk, dt);
            if (dt != LORA_DTYPE_F32) /* a constant in each instance */
                PREFETCH((const uint16_t *)w + (size_t)(j + nr) * k + kk);
        }
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)i * k + kk);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm512_fmadd_ps(xv, wv[j], a[i][j]);
        }
    }
    if (kk < k1) {
        __m512 wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            wv[j] = load16_tail(w, (size_t)j * k + kk, tail, dt);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, x + (size_t)i * k + kk);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm512_fmadd_ps(xv, wv[j], a[i][j]);
        }
    }
    end_sums(y, ldy, a, part, k1, k, mr, nr, alpha, acc);
}

/* The rows of w in [n0, n1) against rows of x in groups of mr, nr_max rows of w at a time
 * (constants at each call), k in blocks of kb (the last one up to 2 kb - 1). */
#define PANEL16_ROWS(mr, nr_max)                                                                   \
    do {                                                                                           \
        for (int k0 = 0; k0 < k; k0 += kb) {                                                       \
            int k1 = k - k0 < 2 * kb ? k : k0 + kb, t = 0, j = n0;                                 \
            for (; j + (nr_max) <= n1; j += (nr_max), t++)                                         \
                tile16(yi + j, ldy, xi, (const char *)w + (size_t)j * k * es, dt, k, k0, k1, tail, \
                       mr, nr_max, alpha, acc, part ? part + t * MR16 * NR : NULL, stream_l2);     \
            for (; j < n1; j++, t++)                                                               \
                tile16(yi + j, ldy, xi, (const char *)w + (size_t)j * k * es, dt, k, k0, k1, tail, \
                       mr, 1, alpha, acc, part ? part + t * MR16 * NR : NULL, stream_l2);          \
            k0 = k1 - kb;                                                                          \
        }                                                                                          \
    } while (0)

T512 ALWAYS_INLINE void panel16_body(float *y, int ldy, const float *x, const void *w,
                                     enum lora_dtype dt, int m, int k, int n0, int n1, float alpha,
                                     bool acc, bool stream_l2)
{
    __mmask16 tail = (__mmask16)((1u << (k % 16)) - 1);
    size_t es = w_size(dt);
    int kb = k_block(m, k, n0, n1, KBLOCK_F32);
    __m512 part_mem[KBLOCK_PART_TILES * MR16 * NR], *part = kb < k ? part_mem : NULL;

    for (int i = 0; i < m;) {
        int mr = m - i >= MR16 ? MR16 : m - i;
        const float *xi = x + (size_t)i * k;
        float *yi = y + (size_t)i * ldy;
        switch (mr) {
        case 6:
            PANEL16_ROWS(6, NR);
            break;
        case 5:
            PANEL16_ROWS(5, NR);
            break;
        case 4:
            PANEL16_ROWS(4, NR);
            break;
        case 3:
            PANEL16_ROWS(3, NR);
            break;
        case 2:
            PANEL16_ROWS(2, NR);
            break;
        default:
            /* Single rows only where k is not blocked: part holds the sums of
             * KBLOCK_PART_TILES tiles, not of a panel's rows one by one. */
            if (dt != LORA_DTYPE_F32 && !part &&
                (stream_l2 || (size_t)k * es < LORA_CPU_STREAM_ROW_BYTES))
                PANEL16_ROWS(1, 1);
            else
                PANEL16_ROWS(1, NR);
            break;
        }
        i += mr;
    }
}

T512 static void panel16(float *y, int ldy, const float *x, const void *w, enum lora_dtype dt,
                         int m, int k, int n0, int n1, float alpha, bool acc, bool stream_l2)
{
    switch (dt) {
    case LORA_DTYPE_F32:
        panel16_body(y, ldy, x, w, LORA_DTYPE_F32, m, k, n0, n1, alpha, acc, stream_l2);
        break;
    case LORA_DTYPE_BF16:
        panel16_body(y, ldy, x, w, LORA_DTYPE_BF16, m, k, n0, n1, alpha, acc, stream_l2);
        break;
    default:
        panel16_body(y, ldy, x, w, LORA_DTYPE_F16, m, k, n0, n1, alpha, acc, stream_l2);
        break;
    }
}

/* ---- AVX512_BF16: pairs of bf16 products per float32 lane ---- */

/* The k range [k0, k1) of an mr x nr tile; x is staged bf16 rows of stride kp (zero-filled past
 * k), w bf16 rows of k. With part, the lane sums are carried between ranges in part (mr x NR
 * vectors): loaded unless the range starts at 0, stored unless it ends at k. Each lane adds its
 * products in the same k order either way, so blocking k changes no bit of y. */
T512BF16 ALWAYS_INLINE void tile_dot(float *y, int ldy, const uint16_t *x, int kp,
                                     const uint16_t *w, int k, int k0, int k1, __mmask32 tail,
                                     int mr, int nr, float alpha, bool acc, __m512 *part)
{
    __m512 a[MR16][NR];
    int kk = k0;

    start_sums(a, part, k0, mr, nr);
    for (; kk + 32 <= k1; kk += 32) {
        __m512i wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            wv[j] = _mm512_loadu_si512(w + (size_t)j * k + kk);
            if (mr == 1 && nr == 1) /* one stream (see tile16) */
                PREFETCH((const char *)(w + (size_t)j * k + kk) + LORA_CPU_STREAM_ROW_BYTES);
            else
                PREFETCH(w + (size_t)(j + nr) * k + kk);
        }
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512i xv = _mm512_loadu_si512(x + (size_t)i * kp + kk);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm512_dpbf16_ps(a[i][j], (__m512bh)xv, (__m512bh)wv[j]);
        }
    }
    if (kk < k1) {
        __m512i wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            wv[j] = _mm512_maskz_loadu_epi16(tail, w + (size_t)j * k + kk);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512i xv = _mm512_loadu_si512(x + (size_t)i * kp + kk);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                a[i][j] = _mm512_dpbf16_ps(a[i][j], (__m512bh)xv, (__m512bh)wv[j]);
        }
    }
    end_sums(y, ldy, a, part, k1, k, mr, nr, alpha, acc);
}

/* As PANEL16_ROWS, on the staged bf16 rows. */
#define PANEL_DOT_ROWS(mr, nr_max)                                                                 \
    do {                                                                                           \
        for (int k0 = 0; k0 < k; k0 += kb) {                                                       \
            int k1 = k - k0 < 2 * kb ? k : k0 + kb, t = 0, j = n0;                                 \
            for (; j + (nr_max) <= n1; j += (nr_max), t++)                                         \
                tile_dot(yi + j, ldy, xs, kp, w + (size_t)j * k, k, k0, k1, tail, mr, nr_max,      \
                         alpha, acc, part ? part + t * MR16 * NR : NULL);                          \
            for (; j < n1; j++, t++)                                                               \
                tile_dot(yi + j, ldy, xs, kp, w + (size_t)j * k, k, k0, k1, tail, mr, 1, alpha,    \
                         acc, part ? part + t * MR16 * NR : NULL);                                 \
            k0 = k1 - kb;                                                                          \
        }                                                                                          \
    } while (0)

/* Rows [n0, n1) of w against the m staged rows of x at x_staged (stride kp). */
T512BF16 static void panel_dot(float *y, int ldy, const uint16_t *x_staged, const uint16_t *w,
                               int m, int k, int n0, int n1, float alpha, bool acc)
{
    int kp = (k + 31) / 32 * 32;
    __mmask32 tail = (__mmask32)((1ull << (k % 32)) - 1);
    int kb = k_block(m, k, n0, n1, KBLOCK_DOT);
    __m512 part_mem[KBLOCK_PART_TILES * MR16 * NR], *part = kb < k ? part_mem : NULL;

    for (int i = 0; i < m;) {
        int mr = m - i >= MR16 ? MR16 : m - i;
        float *yi = y + (size_t)i * ldy;
        const uint16_t *xs = x_staged + (size_t)i * kp;
        switch (mr) {
        case 6:
            PANEL_DOT_ROWS(6, NR);
            break;
        case 5:
            PANEL_DOT_ROWS(5, NR);
            break;
        case 4:
            PANEL_DOT_ROWS(4, NR);
            break;
        case 3:
            PANEL_DOT_ROWS(3, NR);
            break;
        case 2:
            PANEL_DOT_ROWS(2, NR);
            break;
        default:
            if (!part && (size_t)k * sizeof(uint16_t) < LORA_CPU_STREAM_ROW_BYTES)
                PANEL_DOT_ROWS(1, 1); /* as in panel16_body */
            else
                PANEL_DOT_ROWS(1, NR);
            break;
        }
        i += mr;
    }
}

/* ---- the paths ---- */

struct lora_cpu_isa lora_cpu_isa_detect(void)
{
    struct lora_cpu_isa isa = {false, false, false, false, false};

    __builtin_cpu_init();
    isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && !getenv("LORA_NO_AVX512");
    bool bf16 =
        isa.avx512 && __builtin_cpu_supports("avx512bf16") && !getenv("LORA_NO_AVX512_BF16");
    /* vdpbf16ps only where it outruns the float tiles: Intel cores run it at half the FLOPs of
     * vfmadd231ps (docs/design.md, "The bf16 dot on Intel"), so there fast BF16 rounds x and
     * takes the float tiles, or AMX where the machine has it. */
    isa.bf16 = bf16 && !__builtin_cpu_is("intel");
    isa.vnni = isa.avx512 && __builtin_cpu_supports("avx512vnni") && !getenv("LORA_NO_AVX512_VNNI");
    isa.amx = bf16 && !getenv("LORA_NO_AMX") && lora_cpu_amx_available();
    isa.stream_l2 = isa.avx512 && __builtin_cpu_is("intel");
    return isa;
}

/* What a panel of a call computes with. */
enum path {
    PATH_FLOAT,   /* F32, F16, BF16 exact: the float tiles */
    PATH_ROUND_X, /* BF16 fast without the dot instruction: x rounded, then the float tiles */
    PATH_DOT,     /* BF16 fast: vdpbf16ps */
    PATH_AMX,     /* BF16 fast, n and k multiples of 32: AMX tiles */
    PATH_I8,
};

/* Bytes of stage one row of x takes on path (the stride of the staged rows); 0 for none. */
static size_t stage_row_bytes(enum path path, int k)
{
    switch (path) {
    case PATH_ROUND_X: /* float rows of stride k, as the float tiles read x */
        return (size_t)k * sizeof(float);
    case PATH_DOT: /* k rounded up to 32 values: a whole number of 64-byte loads */
    case PATH_AMX: /* k values, in blocks of 16 rows */
        return (size_t)(k + 31) / 32 * 32 * sizeof(uint16_t);
    case PATH_I8:
        return lora_cpu_i8_row_bytes(k);
    default:
        return 0;
    }
}

static void stage_row(enum path path, const float *x, int k, char *row)
{
    switch (path) {
    case PATH_ROUND_X:
        stage_bf16_as_f32(x, k, (float *)row);
        break;
    case PATH_DOT:
        stage_bf16_bits(x, k, (k + 31) / 32 * 32, (uint16_t *)row);
        break;
    default:
        lora_cpu_i8_stage_row(x, k, row);
        break;
    }
}

/* y (m rows, stride ldy), columns [n0, n1) = alpha · x (m, k) · rows [n0, n1) of wᵀ (+ y), on
 * the float tiles (x as it is, or its rounded rows on path ROUND_X). */
static void run_panel(const struct lora_cpu_isa *isa, float *y, int ldy, const float *x,
                      const void *w, enum lora_dtype dt, int m, int k, int n0, int n1, float alpha,
                      bool acc)
{
    if (isa->avx512)
        panel16(y, ldy, x, w, dt, m, k, n0, n1, alpha, acc, isa->stream_l2);
    else
        panel8(y, ldy, x, w, dt, m, k, n0, n1, alpha, acc);
}

/* Rows [n0, n1) of w in one call over m rows of x (or of their staged form, xs), y of stride n. */
static void run_panels(const struct lora_cpu *cpu, enum path path, float *y, int n, const float *x,
                       const char *xs, const void *w, enum lora_dtype dtype, int m, int k, int n0,
                       int n1, float alpha, bool acc)
{
    switch (path) {
    case PATH_I8:
        lora_cpu_i8_panel(&cpu->isa, y, n, xs, w,
                          (const char *)w + (size_t)n * (size_t)lora_i8_row_bytes(k), m, k, n0, n1,
                          alpha, acc);
        break;
    case PATH_DOT:
        panel_dot(y, n, (const uint16_t *)xs, w, m, k, n0, n1, alpha, acc);
        break;
    case PATH_AMX:
        lora_cpu_amx_panel(y, n, xs, w, m, k, n0, n1, alpha, acc);
        break;
    case PATH_ROUND_X:
        run_panel(&cpu->isa, y, n, (const float *)xs, w, dtype, m, k, n0, n1, alpha, acc);
        break;
    default:
        run_panel(&cpu->isa, y, n, x, w, dtype, m, k, n0, n1, alpha, acc);
        break;
    }
}

/* Bytes of w in one step of a thread's run at one row of x: small enough that the last steps
 * even out the threads, large enough that taking one costs nothing next to reading it. */
#define RUN_STEP_BYTES (64 * 1024)

/* The next step for thread t of nt at one row of x, or -1 when every step is taken. A thread
 * takes the steps of its own run from the front, one at a time; when its run is empty, it takes
 * the back half of the run with the most steps left as its own (where others may take from it in
 * turn), so the threads even out in a few exchanges and each still reads a run forward. */
static int take_step(struct lora_cpu_run *runs, int nt, int t)
{
    for (;;) {
        uint64_t e = __atomic_load_n(&runs[t].ends, __ATOMIC_RELAXED);
        while ((uint32_t)e < (uint32_t)(e >> 32))
            if (__atomic_compare_exchange_n(&runs[t].ends, &e, e + 1, true, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                return (int)(uint32_t)e;
        int victim = -1;
        uint32_t most = 0;
        for (int r = 0; r < nt; r++) {
            e = __atomic_load_n(&runs[r].ends, __ATOMIC_RELAXED);
            uint32_t left = (uint32_t)(e >> 32) - (uint32_t)e; /* front <= back, always */
            if (left > most) {
                most = left;
                victim = r;
            }
        }
        if (victim < 0)
            return -1;
        e = __atomic_load_n(&runs[victim].ends, __ATOMIC_RELAXED);
        uint32_t front = (uint32_t)e, back = (uint32_t)(e >> 32), half = (back - front + 1) / 2;
        if (front < back && __atomic_compare_exchange_n(&runs[victim].ends, &e,
                                                        front | (uint64_t)(back - half) << 32,
                                                        false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            /* An empty run is never written by others: this thread alone refills its own. */
            __atomic_store_n(&runs[t].ends, (back - half) | (uint64_t)back << 32, __ATOMIC_RELAXED);
    }
}

/* The path of a weight (n, k) of dtype: by the machine and the weight's shape, never by m. */
static enum path path_of(const struct lora_cpu_isa *isa, enum lora_dtype dtype, bool fast, int n,
                         int k)
{
    if (dtype == LORA_DTYPE_I8)
        return PATH_I8;
    if (dtype != LORA_DTYPE_BF16 || !fast)
        return PATH_FLOAT;
    return isa->amx && n % 32 == 0 && k % 32 == 0 ? PATH_AMX : isa->bf16 ? PATH_DOT : PATH_ROUND_X;
}

/* Item i of a call, a step or panel of size rows, with the parts' rows taken one after the
 * other: its part, and its rows [*n0, *n1) there. */
static int locate(const struct lora_cpu_part *parts, int n_parts, int size, int i, int *n0, int *n1)
{
    int p = 0;

    for (; p < n_parts - 1; p++) {
        int items = (parts[p].n + size - 1) / size;
        if (i < items)
            break;
        i -= items;
    }
    *n0 = i * size;
    *n1 = *n0 + size < parts[p].n ? *n0 + size : parts[p].n;
    return p;
}

static int items_of(const struct lora_cpu_part *parts, int n_parts, int size)
{
    int items = 0;

    for (int p = 0; p < n_parts; p++)
        items += (parts[p].n + size - 1) / size;
    return items;
}

void lora_cpu_matmul(const struct lora_cpu *cpu, const struct lora_cpu_part *parts, int n_parts,
                     const float *x, enum lora_dtype dtype, int m, int k, float alpha,
                     bool accumulate, bool fast)
{
    const struct lora_cpu_isa *isa = &cpu->isa;
    enum path path = path_of(isa, dtype, fast, parts[0].n, k);
    int n = 0;

    for (int p = 0; p < n_parts; p++) {
        if (path_of(isa, dtype, fast, parts[p].n, k) != path) {
            /* Weights of different paths stage x differently: one call each. */
            for (int q = 0; q < n_parts; q++)
                lora_cpu_matmul(cpu, &parts[q], 1, x, dtype, m, k, alpha, accumulate, fast);
            return;
        }
        n += parts[p].n;
    }
    size_t row_stage = stage_row_bytes(path, k);
    /* Rows of x per pass: all of them, or as many as the staging memory holds (each pass
     * streams w again; results do not depend on it, as each row is computed alone); AMX stages
     * whole blocks of 16. */
    int chunk = row_stage ? (int)(LORA_CPU_STAGE_BYTES / row_stage) : m;
    if (path == PATH_AMX)
        chunk = chunk / 16 * 16;

    if (chunk < 1) {
        fprintf(stderr,
                "lora: fatal: cpu backend: a %s matmul row of %d inputs exceeds the %zu MiB of "
                "staging\n",
                lora_dtype_name(dtype), k, LORA_CPU_STAGE_BYTES >> 20);
        abort();
    }
    /* Panels of w small enough to stay in L2 while every row of x passes over them, and enough
     * of them to keep every thread busy. */
    size_t w_row =
        dtype == LORA_DTYPE_I8 ? (size_t)lora_i8_row_bytes(k) : (size_t)k * w_size(dtype);
    int rows = (int)((256 * 1024) / (w_row + 1));
    int threads = omp_get_max_threads() < cpu->n_threads ? omp_get_max_threads() : cpu->n_threads;
    int share = (n + 4 * threads - 1) / (4 * threads);
    rows = share < rows ? share : rows;
    /* Panels of whole tiles: AMX takes 32 rows of w, the AVX-512 tiles 4; the AVX2 tiles take 3,
     * or at one row of x 2 or 4, and int8's 2, all of which divide 12. */
    int unit = path == PATH_AMX ? 32 : isa->avx512 ? NR : NR8 * NR8_ONE_F32;
    rows = rows < unit ? unit : rows + (unit - rows % unit) % unit;
    int n_panels = items_of(parts, n_parts, rows);
    int step = (int)(RUN_STEP_BYTES / w_row);
    step = step < unit ? unit : step + (unit - step % unit) % unit;
    int n_steps = items_of(parts, n_parts, step);

    for (int i0 = 0; i0 < m; i0 += chunk) {
        int mc = m - i0 < chunk ? m - i0 : chunk;
        const float *xc = x + (size_t)i0 * k;
        long work = (long)mc * n * k;
        if (mc == 1)
            for (int t = 0; t < threads; t++)
                cpu->runs[t].ends = (uint64_t)(n_steps * t / threads) |
                                    (uint64_t)(n_steps * (t + 1) / threads) << 32;
#pragma omp parallel num_threads(threads) if (work > 32768 && n_panels > 1)
        {
            if (row_stage) {
                /* AMX: one more item zeros the padding of the last block of 16 rows. */
                int items = path == PATH_AMX && mc % 16 ? mc + 1 : mc;
#pragma omp for schedule(static)
                for (int r = 0; r < items; r++) {
                    if (r == mc)
                        lora_cpu_amx_stage_padding(mc, k, cpu->stage);
                    else if (path == PATH_AMX)
                        lora_cpu_amx_stage_row(xc + (size_t)r * k, k, r, cpu->stage);
                    else
                        stage_row(path, xc + (size_t)r * k, k, cpu->stage + (size_t)r * row_stage);
                }
                /* The implicit barrier: every staged row is ready. */
            }
            /* One row of x reads each row of w once: each thread reads its own run of rows
             * as one stream, then helps the slower ones from the back of theirs (docs/design.md,
             * "Streaming the weights"); several rows of x take panels as threads come free.
             * A run whose thread the team lacks is all taken from the back. */
            int it, n0, n1;
            if (mc == 1)
                while ((it = take_step(cpu->runs, threads, omp_get_thread_num())) >= 0) {
                    const struct lora_cpu_part *pt =
                        &parts[locate(parts, n_parts, step, it, &n0, &n1)];
                    run_panels(cpu, path, pt->y + (size_t)i0 * pt->n, pt->n, xc, cpu->stage, pt->w,
                               dtype, mc, k, n0, n1, alpha, accumulate);
                }
            else
#pragma omp for schedule(dynamic, 1)
                for (it = 0; it < n_panels; it++) {
                    const struct lora_cpu_part *pt =
                        &parts[locate(parts, n_parts, rows, it, &n0, &n1)];
                    run_panels(cpu, path, pt->y + (size_t)i0 * pt->n, pt->n, xc, cpu->stage, pt->w,
                               dtype, mc, k, n0, n1, alpha, accumulate);
                }
        }
    }
}

/* ---- the multi-LoRA SGMV ---- */

/* y row (out) += scale · (t row (rank) · b_t (rank, out)) over columns [c0, c1): each output
 * accumulates over the rank in order, then is added once, the same way on every path. */
ALWAYS_INLINE void expand_row_body(float *y, const float *t, const void *b_t, enum lora_dtype dt,
                                   int rank, int out, int c0, int c1, float scale)
{
    __m256 sv = _mm256_set1_ps(scale);
    int c = c0;

    for (; c + 32 <= c1; c += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int r = 0; r < rank; r++) {
            __m256 tv = _mm256_set1_ps(t[r]);
            size_t b = (size_t)r * out + c;
            a0 = _mm256_fmadd_ps(tv, lora_cpu_widen8(b_t, b, dt), a0);
            a1 = _mm256_fmadd_ps(tv, lora_cpu_widen8(b_t, b + 8, dt), a1);
            a2 = _mm256_fmadd_ps(tv, lora_cpu_widen8(b_t, b + 16, dt), a2);
            a3 = _mm256_fmadd_ps(tv, lora_cpu_widen8(b_t, b + 24, dt), a3);
        }
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(sv, a0, _mm256_loadu_ps(y + c)));
        _mm256_storeu_ps(y + c + 8, _mm256_fmadd_ps(sv, a1, _mm256_loadu_ps(y + c + 8)));
        _mm256_storeu_ps(y + c + 16, _mm256_fmadd_ps(sv, a2, _mm256_loadu_ps(y + c + 16)));
        _mm256_storeu_ps(y + c + 24, _mm256_fmadd_ps(sv, a3, _mm256_loadu_ps(y + c + 24)));
    }
    for (; c < c1; c++) {
        float a = 0;
        for (int r = 0; r < rank; r++)
            a = fmaf(t[r], lora_cpu_widen(b_t, (size_t)r * out + c, dt), a);
        y[c] = fmaf(scale, a, y[c]);
    }
}

static void expand_row(float *y, const float *t, const void *b_t, enum lora_dtype dt, int rank,
                       int out, int c0, int c1, float scale)
{
    switch (dt) {
    case LORA_DTYPE_F32:
        expand_row_body(y, t, b_t, LORA_DTYPE_F32, rank, out, c0, c1, scale);
        break;
    case LORA_DTYPE_BF16:
        expand_row_body(y, t, b_t, LORA_DTYPE_BF16, rank, out, c0, c1, scale);
        break;
    default:
        expand_row_body(y, t, b_t, LORA_DTYPE_F16, rank, out, c0, c1, scale);
        break;
    }
}

/* Work items per segment: shrink splits a segment's rank (NR rows of A each, so A is read once),
 * expand its output columns. */
#define SGMV_SPLIT 8

void lora_cpu_lora_sgmv(const struct lora_cpu *cpu, float *y, const float *x,
                        const struct lora_sgmv_seg *segs, int n_segs, int in, int out, float *tmp,
                        int max_rank)
{
    int n_items = n_segs * SGMV_SPLIT;
    int threads = omp_get_max_threads() < cpu->n_threads ? omp_get_max_threads() : cpu->n_threads;

#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; it++) {
            const struct lora_sgmv_seg *g = &segs[it / SGMV_SPLIT];
            int part = it % SGMV_SPLIT, quads = (g->rank + NR - 1) / NR;
            int j0 = NR * (quads * part / SGMV_SPLIT), j1 = NR * (quads * (part + 1) / SGMV_SPLIT);
            j1 = j1 < g->rank ? j1 : g->rank;
            if (j0 < j1)
                run_panel(&cpu->isa, tmp + (size_t)g->row * max_rank, max_rank,
                          x + (size_t)g->row * in, lora_tensor_addr(&g->a), g->a.dtype, g->n_rows,
                          in, j0, j1, 1.0f, false);
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
                           lora_tensor_addr(&g->b_t), g->b_t.dtype, g->rank, out, c0, c1, g->scale);
        }
    }
}
