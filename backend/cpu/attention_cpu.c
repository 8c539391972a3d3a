/* attention_cpu: the CPU backend's attention over the paged KV cache (see kernels_cpu.h). A
 * pass takes one query row and the query heads of one KV head (up to LORA_CPU_ATTN_HEADS), block
 * by block, so that each position's k and v are read from memory once for all of them: in 8
 * lanes, or, where the CPU has AVX-512 and a head has 64 or 128 values, in 16 (docs/design.md,
 * "Attention in 16 lanes" and "Fetching k and v ahead"). A 16-bit cache is widened to float32 as
 * it is read (exactly); every row's output depends on its own query and context only, whatever
 * the batch. */
#include "backend/cpu/exp_cpu.h"
#include "backend/cpu/kernels_cpu.h"
#include "backend/cpu/widen_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* q · k over n elements: 8 lanes summed along the row, the lanes in a fixed tree, then the
 * tail; one order for every row whatever the batch. */
ALWAYS_INLINE float dot_kv(const float *q, const void *k, int n, enum lora_dtype dtype)
{
    __m256 acc = _mm256_setzero_ps();
    int d = 0;

    for (; d + 8 <= n; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), lora_cpu_widen8(k, d, dtype), acc);
    float dot = lora_cpu_hsum8(acc);
    for (; d < n; d++)
        dot += q[d] * lora_cpu_widen(k, d, dtype);
    return dot;
}

/* Where block b of a sequence keeps this head's row of its first position (rows of stride
 * kv_dim elements of es bytes). */
ALWAYS_INLINE const char *block_rows(const void *cache, const int *block_table, int b,
                                     int block_size, int kv_dim, int kv_off, size_t es)
{
    return (const char *)cache + ((size_t)block_table[b] * block_size * kv_dim + kv_off) * es;
}

/* Positions ahead of the loops that fetch a head's rows of k and v: its slice of a cache row is
 * a few lines among the other KV heads', too broken a pattern for the hardware to fetch ahead,
 * and the loops waited on memory (docs/design.md, "Fetching k and v ahead"). */
#define AHEAD_POSITIONS 32

/* Fetches into L1 the head's slice (len bytes at kv_off) of the first n rows of block b. */
ALWAYS_INLINE void prefetch_block(const void *cache, const int *block_table, int b, int n,
                                  int block_size, int kv_dim, int kv_off, size_t es, size_t len)
{
    const char *r = block_rows(cache, block_table, b, block_size, kv_dim, kv_off, es);

    for (int i = 0; i < n; i++, r += (size_t)kv_dim * es)
        for (size_t c = 0; c < len; c += 64)
            _mm_prefetch(r + c, _MM_HINT_T0);
}

/* Block b's rows a blocks ahead of position p0 (none past n_ctx), fetched. */
ALWAYS_INLINE void prefetch_ahead(const void *cache, const int *block_table, int b, int p0, int a,
                                  int n_ctx, int block_size, int kv_dim, int kv_off, size_t es,
                                  size_t len)
{
    int left = n_ctx - (p0 + a * block_size);

    if (left > 0)
        prefetch_block(cache, block_table, b + a, left < block_size ? left : block_size, block_size,
                       kv_dim, kv_off, es, len);
}

/* scores[0, n) replaced by their softmax: the maximum subtracted, exp8 in vectors of 8 (the tail
 * through a padded vector, as lora_cpu_silu_mul's), then divided by their sum taken in order. */
static void softmax(float *scores, int n)
{
    float max = -INFINITY, sum = 0;
    int p8 = 0;

    for (int p = 0; p < n; p++)
        max = scores[p] > max ? scores[p] : max;
    __m256 mv = _mm256_set1_ps(max);
    for (; p8 + 8 <= n; p8 += 8)
        _mm256_storeu_ps(scores + p8,
                         lora_cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + p8), mv)));
    if (p8 < n) {
        float t[8] = {0};
        memcpy(t, scores + p8, (size_t)(n - p8) * sizeof(float));
        _mm256_storeu_ps(t, lora_cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(t), mv)));
        memcpy(scores + p8, t, (size_t)(n - p8) * sizeof(float));
    }
    for (int p = 0; p < n; p++)
        sum += scores[p];
    for (int p = 0; p < n; p++)
        scores[p] /= sum;
}

/* head_dim output values (sums) += the n rows of v at v (row bytes apart) weighted by scores,
 * position by position in order, for each group of 8 (or 1) values. */
ALWAYS_INLINE void add_values8(float *sums, const float *scores, const char *v, size_t row, int n,
                               int head_dim, enum lora_dtype dtype)
{
    int d = 0;

    for (; d + 32 <= head_dim; d += 32) {
        __m256 a0 = _mm256_loadu_ps(sums + d), a1 = _mm256_loadu_ps(sums + d + 8);
        __m256 a2 = _mm256_loadu_ps(sums + d + 16), a3 = _mm256_loadu_ps(sums + d + 24);
        const char *vi = v;
        for (int i = 0; i < n; i++, vi += row) {
            __m256 wv = _mm256_set1_ps(scores[i]);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(wv, lora_cpu_widen8(vi, d, dtype)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(wv, lora_cpu_widen8(vi, d + 8, dtype)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(wv, lora_cpu_widen8(vi, d + 16, dtype)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(wv, lora_cpu_widen8(vi, d + 24, dtype)));
        }
        _mm256_storeu_ps(sums + d, a0);
        _mm256_storeu_ps(sums + d + 8, a1);
        _mm256_storeu_ps(sums + d + 16, a2);
        _mm256_storeu_ps(sums + d + 24, a3);
    }
    for (; d + 8 <= head_dim; d += 8) {
        __m256 a = _mm256_loadu_ps(sums + d);
        const char *vi = v;
        for (int i = 0; i < n; i++, vi += row)
            a = _mm256_add_ps(
                a, _mm256_mul_ps(_mm256_set1_ps(scores[i]), lora_cpu_widen8(vi, d, dtype)));
        _mm256_storeu_ps(sums + d, a);
    }
    for (; d < head_dim; d++) {
        float a = sums[d];
        const char *vi = v;
        for (int i = 0; i < n; i++, vi += row)
            a += scores[i] * lora_cpu_widen(vi, d, dtype);
        sums[d] = a;
    }
}

/* nh consecutive query heads of one KV head (q and out at the first head's values, head_dim
 * apart; head j's scores at scores + j * max_ctx) against positions [0, n_ctx) of their
 * sequence, block by block, so that a block's rows of k and v, read from memory once, serve
 * every head from L1. The scores take four positions at a time (four independent chains of the
 * same order as dot_kv); the weighted sum of v runs over the positions in order for each group
 * of 8 (or 1) output values, carried in out from one block to the next: every value adds the
 * same products in the same order whichever heads share the pass. */
ALWAYS_INLINE void attend_heads8(float *out, const float *q, const void *k_cache,
                                 const void *v_cache, enum lora_dtype dtype, const int *block_table,
                                 int n_ctx, int kv_off, int kv_dim, int head_dim, int nh,
                                 int block_size, float *scores, int max_ctx)
{
    float scale = 1.0f / sqrtf((float)head_dim);
    size_t es = lora_dtype_size(dtype), row = (size_t)kv_dim * es, len = (size_t)head_dim * es;
    int ahead = (AHEAD_POSITIONS + block_size - 1) / block_size;

    for (int p0 = 0, b = 0; p0 < n_ctx; p0 += block_size, b++) {
        const char *k = block_rows(k_cache, block_table, b, block_size, kv_dim, kv_off, es);
        int n = n_ctx - p0 < block_size ? n_ctx - p0 : block_size;
        prefetch_ahead(k_cache, block_table, b, p0, ahead, n_ctx, block_size, kv_dim, kv_off, es,
                       len);
        for (int j = 0; j < nh; j++) {
            const float *qj = q + (size_t)j * head_dim;
            float *sj = scores + (size_t)j * max_ctx + p0;
            int i = 0;
            for (; i + 4 <= n; i += 4) {
                float s0 = dot_kv(qj, k + (size_t)i * row, head_dim, dtype);
                float s1 = dot_kv(qj, k + (size_t)(i + 1) * row, head_dim, dtype);
                float s2 = dot_kv(qj, k + (size_t)(i + 2) * row, head_dim, dtype);
                float s3 = dot_kv(qj, k + (size_t)(i + 3) * row, head_dim, dtype);
                sj[i] = s0 * scale;
                sj[i + 1] = s1 * scale;
                sj[i + 2] = s2 * scale;
                sj[i + 3] = s3 * scale;
            }
            for (; i < n; i++)
                sj[i] = dot_kv(qj, k + (size_t)i * row, head_dim, dtype) * scale;
        }
    }
    for (int j = 0; j < nh; j++)
        softmax(scores + (size_t)j * max_ctx, n_ctx);
    memset(out, 0, (size_t)nh * head_dim * sizeof(float));
    for (int p0 = 0, b = 0; p0 < n_ctx; p0 += block_size, b++) {
        const char *v = block_rows(v_cache, block_table, b, block_size, kv_dim, kv_off, es);
        int n = n_ctx - p0 < block_size ? n_ctx - p0 : block_size;
        prefetch_ahead(v_cache, block_table, b, p0, ahead, n_ctx, block_size, kv_dim, kv_off, es,
                       len);
        for (int j = 0; j < nh; j++)
            add_values8(out + (size_t)j * head_dim, scores + (size_t)j * max_ctx + p0, v, row, n,
                        head_dim, dtype);
    }
}

/* attend_heads8 with dtype a constant in each branch, so each loop reads its type directly. */
static void attend8(float *out, const float *q, const void *k_cache, const void *v_cache,
                    enum lora_dtype dtype, const int *block_table, int n_ctx, int kv_off,
                    int kv_dim, int head_dim, int nh, int block_size, float *scores, int max_ctx)
{
    switch (dtype) {
    case LORA_DTYPE_F32:
        attend_heads8(out, q, k_cache, v_cache, LORA_DTYPE_F32, block_table, n_ctx, kv_off, kv_dim,
                      head_dim, nh, block_size, scores, max_ctx);
        break;
    case LORA_DTYPE_BF16:
        attend_heads8(out, q, k_cache, v_cache, LORA_DTYPE_BF16, block_table, n_ctx, kv_off, kv_dim,
                      head_dim, nh, block_size, scores, max_ctx);
        break;
    default:
        attend_heads8(out, q, k_cache, v_cache, LORA_DTYPE_F16, block_table, n_ctx, kv_off, kv_dim,
                      head_dim, nh, block_size, scores, max_ctx);
        break;
    }
}

/* ---- AVX-512: 16 positions' scores at a time ---- */

#define T512         __attribute__((target("avx512f,avx512bw,avx512vl")))
#define MAX_CHUNKS16 8 /* head_dim <= 128 in 16-lane vectors, q held in registers */

/* Lane i of the result: the sum of v[i]'s 16 lanes, for i < 16, by a tree that depends on i
 * alone (halves of 256, then 128 bits, then pairs, then the last two), never on the other
 * vectors: a score has the same bits whichever positions share its group. Four rounds of two
 * shuffles and an add each fold 16 vectors into one; feeding them in transposed order puts
 * v[i]'s sum in lane i. */
T512 ALWAYS_INLINE __m512 sum_lanes16(const __m512 v[16])
{
    __m512 w[8], u[4], z[2];

#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m512 a = v[((2 * j) % 4) * 4 + (2 * j) / 4],
               b = v[((2 * j + 1) % 4) * 4 + (2 * j + 1) / 4];
        w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0xdd));
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++)
        z[j] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xdd));
}

/* softmax in 16 lanes: the maximum, exp16 (the tail through masked lanes), the sum in 16 lanes
 * summed in a fixed tree, then the tail's values in order, and the division. */
T512 static void softmax16(float *scores, int n)
{
    __m512 mv = _mm512_set1_ps(-INFINITY), sv = _mm512_setzero_ps();
    __mmask16 tail = (__mmask16)((1u << (n % 16)) - 1);
    int p16 = n / 16 * 16;

    for (int p = 0; p < p16; p += 16)
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(scores + p));
    mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_maskz_loadu_ps(tail, scores + p16));
    mv = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    for (int p = 0; p < p16; p += 16) {
        __m512 e = lora_cpu_exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + p), mv));
        _mm512_storeu_ps(scores + p, e);
        sv = _mm512_add_ps(sv, e);
    }
    __m512 e = lora_cpu_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + p16), mv));
    _mm512_mask_storeu_ps(scores + p16, tail, e);
    float sum = _mm512_reduce_add_ps(sv);
    for (int p = p16; p < n; p++)
        sum += scores[p];
    __m512 div = _mm512_set1_ps(sum);
    for (int p = 0; p < p16; p += 16)
        _mm512_storeu_ps(scores + p, _mm512_div_ps(_mm512_loadu_ps(scores + p), div));
    _mm512_mask_storeu_ps(scores + p16, tail,
                          _mm512_div_ps(_mm512_maskz_loadu_ps(tail, scores + p16), div));
}

/* The 16-lane path takes all the query heads of one KV head, up to LORA_CPU_ATTN_HEADS, in one
 * pass, so that each position's k and v are read once for all of them; the sums of v of
 * PASS_VALUES16 / head_dim heads at a time stay in 16 registers while a block's rows of v, in L1,
 * pass under them. */
#define PASS_VALUES16 256

/* sums (g heads of nc vectors each, head_dim apart) += the n rows of v at v (row bytes apart)
 * weighted by each head's scores (max_ctx apart), position by position in order. */
T512 ALWAYS_INLINE void add_values16(float *sums, const float *scores, int max_ctx, const char *v,
                                     size_t row, int n, int g, int nc, enum lora_dtype dtype)
{
    __m512 acc[PASS_VALUES16 / 16];

#pragma GCC unroll 4
    for (int j = 0; j < g; j++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[j * nc + c] = _mm512_loadu_ps(sums + (size_t)(j * nc + c) * 16);
    for (int i = 0; i < n; i++, v += row) {
        __m512 vv[MAX_CHUNKS16];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            vv[c] = lora_cpu_widen16(v, 16 * c, dtype);
#pragma GCC unroll 4
        for (int j = 0; j < g; j++) {
            __m512 sv = _mm512_set1_ps(scores[(size_t)j * max_ctx + i]);
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++)
                acc[j * nc + c] = _mm512_fmadd_ps(sv, vv[c], acc[j * nc + c]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < g; j++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            _mm512_storeu_ps(sums + (size_t)(j * nc + c) * 16, acc[j * nc + c]);
}

/* attend_heads8 in 16 lanes, head_dim 64 or 128. Each head's scores come 16 positions of a block
 * at a time out of one sum_lanes16, each q · k a chain of fused multiply-adds over the head's
 * vectors; its weighted sum of v runs over the positions in order, carried in out from one block
 * to the next. What a head computes depends on its row, context and block size only: neither on
 * the batch nor on the heads that share its pass. */
T512 ALWAYS_INLINE void attend_heads16(float *out, const float *q, const void *k_cache,
                                       const void *v_cache, enum lora_dtype dtype,
                                       const int *block_table, int n_ctx, int kv_off, int kv_dim,
                                       int head_dim, int nh, int block_size, float *scores,
                                       int max_ctx)
{
    const int nc = head_dim / 16, per = PASS_VALUES16 / head_dim;
    const __m512 scale = _mm512_set1_ps(1.0f / sqrtf((float)head_dim));
    size_t es = lora_dtype_size(dtype), row = (size_t)kv_dim * es, len = (size_t)head_dim * es;
    int ahead = (AHEAD_POSITIONS + block_size - 1) / block_size;

    for (int p0 = 0, b = 0; p0 < n_ctx; p0 += block_size, b++) {
        const char *k = block_rows(k_cache, block_table, b, block_size, kv_dim, kv_off, es);
        int n = n_ctx - p0 < block_size ? n_ctx - p0 : block_size;
        prefetch_ahead(k_cache, block_table, b, p0, ahead, n_ctx, block_size, kv_dim, kv_off, es,
                       len);
        for (int i0 = 0; i0 < n; i0 += 16) {
            int g = n - i0 < 16 ? n - i0 : 16;
            for (int j = 0; j < nh; j++) { /* the 16 rows of k stay in L1 across the heads */
                __m512 qv[MAX_CHUNKS16], dots[16];
#pragma GCC unroll 8
                for (int c = 0; c < MAX_CHUNKS16; c++)
                    qv[c] = c < nc ? _mm512_loadu_ps(q + (size_t)j * head_dim + 16 * c)
                                   : _mm512_setzero_ps();
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    dots[i] = _mm512_setzero_ps();
                    if (i < g) {
                        const char *ki = k + (size_t)(i0 + i) * row;
                        dots[i] = _mm512_mul_ps(qv[0], lora_cpu_widen16(ki, 0, dtype));
#pragma GCC unroll 8
                        for (int c = 1; c < MAX_CHUNKS16; c++)
                            if (c < nc)
                                dots[i] = _mm512_fmadd_ps(
                                    qv[c], lora_cpu_widen16(ki, 16 * c, dtype), dots[i]);
                    }
                }
                _mm512_mask_storeu_ps(scores + (size_t)j * max_ctx + p0 + i0,
                                      (__mmask16)((1u << g) - 1),
                                      _mm512_mul_ps(sum_lanes16(dots), scale));
            }
        }
    }
    for (int j = 0; j < nh; j++)
        softmax16(scores + (size_t)j * max_ctx, n_ctx);
    memset(out, 0, (size_t)nh * head_dim * sizeof(float));
    for (int p0 = 0, b = 0; p0 < n_ctx; p0 += block_size, b++) {
        const char *v = block_rows(v_cache, block_table, b, block_size, kv_dim, kv_off, es);
        int n = n_ctx - p0 < block_size ? n_ctx - p0 : block_size;
        prefetch_ahead(v_cache, block_table, b, p0, ahead, n_ctx, block_size, kv_dim, kv_off, es,
                       len);
        for (int j = 0; j < nh; j += per) {
            float *sj = out + (size_t)j * head_dim;
            const float *scj = scores + (size_t)j * max_ctx + p0;
            int g = nh - j < per ? nh - j : per; /* heads whose sums share the registers */
            if (g == per)
                add_values16(sj, scj, max_ctx, v, row, n, per, nc, dtype);
            else if (g == 3 && per > 3)
                add_values16(sj, scj, max_ctx, v, row, n, 3, nc, dtype);
            else if (g == 2)
                add_values16(sj, scj, max_ctx, v, row, n, 2, nc, dtype);
            else
                add_values16(sj, scj, max_ctx, v, row, n, 1, nc, dtype);
        }
    }
}

/* attend_heads16 with the dtype and the head's size (64 or 128 values: the heads of the Qwen2
 * and Llama families) constants in each branch, so that the loops over a head's vectors unroll
 * and the sums stay in registers. */
T512 static void attend16(float *out, const float *q, const void *k_cache, const void *v_cache,
                          enum lora_dtype dtype, const int *block_table, int n_ctx, int kv_off,
                          int kv_dim, int head_dim, int nh, int block_size, float *scores,
                          int max_ctx)
{
#define HEADS16(dt, hd)                                                                            \
    attend_heads16(out, q, k_cache, v_cache, dt, block_table, n_ctx, kv_off, kv_dim, hd, nh,       \
                   block_size, scores, max_ctx)
#define SIZES16(dt)                                                                                \
    do {                                                                                           \
        if (head_dim == 128)                                                                       \
            HEADS16(dt, 128);                                                                      \
        else                                                                                       \
            HEADS16(dt, 64);                                                                       \
    } while (0)
    switch (dtype) {
    case LORA_DTYPE_F32:
        SIZES16(LORA_DTYPE_F32);
        break;
    case LORA_DTYPE_BF16:
        SIZES16(LORA_DTYPE_BF16);
        break;
    default:
        SIZES16(LORA_DTYPE_F16);
        break;
    }
#undef SIZES16
#undef HEADS16
}

/* Rows of a sequence per work item of the 16-lane path: a long prefill spreads over the threads. */
#define ROWS_PER_ITEM 16

void lora_cpu_attention(float *out, const float *q, const void *k_cache, const void *v_cache,
                        enum lora_dtype dtype, const struct lora_attn_seq *seqs, int n_seqs,
                        int n_heads, int n_kv_heads, int head_dim, int block_size, float *scratch,
                        int max_ctx, bool avx512)
{
    int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    int group = n_heads / n_kv_heads;

    /* The path depends on the machine and the head's size, never on the batch. */
    bool wide = avx512 && (head_dim == 64 || head_dim == 128);
    int per_pass = LORA_CPU_ATTN_HEADS, passes = (group + per_pass - 1) / per_pass;
    int max_rows = 0;
    for (int s = 0; s < n_seqs; s++)
        max_rows = seqs[s].n_rows > max_rows ? seqs[s].n_rows : max_rows;
    int chunks = (max_rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM;
    /* Work items: (sequence, KV head, pass over its query heads, chunk of rows). */
#pragma omp parallel for collapse(4) schedule(dynamic, 1)
    for (int s = 0; s < n_seqs; s++)
        for (int kvh = 0; kvh < n_kv_heads; kvh++)
            for (int pass = 0; pass < passes; pass++)
                for (int ch = 0; ch < chunks; ch++) {
                    const struct lora_attn_seq *sq = &seqs[s];
                    int h = kvh * group + pass * per_pass;
                    int nh =
                        group - pass * per_pass < per_pass ? group - pass * per_pass : per_pass;
                    float *scores =
                        scratch + (size_t)omp_get_thread_num() * LORA_CPU_ATTN_HEADS * max_ctx;
                    int r1 = (ch + 1) * ROWS_PER_ITEM;
                    r1 = r1 < sq->n_rows ? r1 : sq->n_rows;
                    for (int r = ch * ROWS_PER_ITEM; r < r1; r++) {
                        size_t off = (size_t)(sq->row + r) * q_dim + (size_t)h * head_dim;
                        (wide ? attend16 : attend8)(out + off, q + off, k_cache, v_cache, dtype,
                                                    sq->block_table, sq->pos + r + 1,
                                                    kvh * head_dim, kv_dim, head_dim, nh,
                                                    block_size, scores, max_ctx);
                    }
                }
}
