/* kernels_cpu: the CPU backend's element-wise kernels, embedding and KV writes (see
 * kernels_cpu.h). Work is split across OpenMP threads; matmuls live in matmul_cpu.c and
 * matmul_i8_cpu.c, attention in attention_cpu.c. A 16-bit cache or table is widened to float32 as
 * it is read (exactly), and a cache is written rounded to nearest even: the arithmetic is float32's
 * whatever the dtype. */
#include "backend/cpu/kernels_cpu.h"
#include "backend/cpu/exp_cpu.h"
#include "backend/cpu/widen_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define ROPE_MAX_PAIRS 2048 /* model configs are refused past a head_dim of 4096 */

void lora_cpu_add_bias(float *y, const float *bias, int m, int n)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            y[(size_t)i * n + j] += bias[j];
}

void lora_cpu_embed(float *out, const void *table, enum lora_dtype dtype, const int *ids, int m,
                    int dim)
{
    size_t row = (size_t)dim * lora_dtype_size(dtype);

    for (int i = 0; i < m; i++)
        lora_dtype_to_f32(dtype, (const char *)table + (size_t)ids[i] * row, out + (size_t)i * dim,
                          (size_t)dim);
}

/* The sum of squares of x (n) in double: eight lanes (j mod 8) summed in a fixed tree, then the
 * tail in order, so that a row's value depends on its own values alone. */
static double sum_squares(const float *x, int n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int j = 0;

    for (; j + 8 <= n; j += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + j)),
                hi = _mm256_cvtps_pd(_mm_loadu_ps(x + j + 4));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; j < n; j++)
        ss += (double)x[j] * x[j];
    return ss;
}

void lora_cpu_rmsnorm(float *out, const float *x, const float *w, int m, int dim, float eps)
{
#pragma omp parallel for if (m > 4)
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        float inv = (float)(1.0 / sqrt(sum_squares(xi, dim) / dim + eps));
        __m256 iv = _mm256_set1_ps(inv);
        int j = 0;
        for (; j + 8 <= dim; j += 8)
            _mm256_storeu_ps(oi + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xi + j), iv),
                                                   _mm256_loadu_ps(w + j)));
        for (; j < dim; j++)
            oi[j] = xi[j] * inv * w[j];
    }
}

void lora_cpu_rope(float *x, const int *pos, int m, int n_heads, int head_dim, float theta)
{
    int half = head_dim / 2;
    double freq[ROPE_MAX_PAIRS];

    for (int j = 0; j < half; j++)
        freq[j] = pow((double)theta, -2.0 * j / head_dim);
#pragma omp parallel for if (m > 4)
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < half; j++) {
            /* Angles in double: positions reach tens of thousands. */
            double sn, cs;
            sincos(pos[i] * freq[j], &sn, &cs);
            float c = (float)cs, s = (float)sn;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (size_t)i * n_heads * head_dim + (size_t)h * head_dim;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
}

/* Eight values of gate = silu(gate) * up. */
ALWAYS_INLINE void silu_mul8(float *gate, const float *up)
{
    __m256 g = _mm256_loadu_ps(gate);
    __m256 e = lora_cpu_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(gate, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                         _mm256_loadu_ps(up)));
}

/* Sixteen values of silu_mul8's, lane for lane (exp16 is exp8 on sixteen lanes). */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) void
silu_mul16(float *gate, const float *up)
{
    __m512 g = _mm512_loadu_ps(gate);
    __m512 e = lora_cpu_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(gate, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                         _mm512_loadu_ps(up)));
}

/* n16 vectors of sixteen values. Not inlined: the OpenMP region that calls it has no AVX-512
 * target of its own (clang refuses 512-bit vectors in an outlined region without it). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
silu_mul16_run(float *gate, const float *up, size_t n16)
{
    for (size_t b = 0; b < n16; b++)
        silu_mul16(gate + 16 * b, up + 16 * b);
}

#define SILU_CHUNK16 256 /* vectors of sixteen per work item of a long SiLU */

void lora_cpu_silu_mul(float *gate, const float *up, size_t n, bool avx512)
{
    size_t done = 0;

    if (avx512) {
        size_t n16 = n / 16, chunks = (n16 + SILU_CHUNK16 - 1) / SILU_CHUNK16;
#pragma omp parallel for if (n16 > 1024)
        for (size_t c = 0; c < chunks; c++) {
            size_t b = c * SILU_CHUNK16;
            silu_mul16_run(gate + 16 * b, up + 16 * b,
                           n16 - b < SILU_CHUNK16 ? n16 - b : SILU_CHUNK16);
        }
        done = 16 * n16;
    }
    size_t n8 = (n - done) / 8;
    float *g8 = gate + done;
    const float *u8 = up + done;
#pragma omp parallel for if (n8 > 2048)
    for (size_t b = 0; b < n8; b++)
        silu_mul8(g8 + 8 * b, u8 + 8 * b);
    done += 8 * n8;
    if (n > done) { /* through a padded vector: the same arithmetic as every other value */
        float g[8] = {0}, u[8] = {0};
        memcpy(g, gate + done, (n - done) * sizeof(float));
        memcpy(u, up + done, (n - done) * sizeof(float));
        silu_mul8(g, u);
        memcpy(gate + done, g, (n - done) * sizeof(float));
    }
}

void lora_cpu_add(float *y, const float *x, size_t n)
{
    size_t n8 = n / 8;

#pragma omp parallel for if (n8 > 8192)
    for (size_t b = 0; b < n8; b++)
        _mm256_storeu_ps(y + 8 * b,
                         _mm256_add_ps(_mm256_loadu_ps(y + 8 * b), _mm256_loadu_ps(x + 8 * b)));
    for (size_t i = 8 * n8; i < n; i++)
        y[i] += x[i];
}

/* dst (n, of dtype) = src rounded to nearest even. The bf16 rounding is integer arithmetic, as
 * lora_f32_to_bf16's (the hardware's conversion flushes subnormals); f16 is F16C's, which rounds
 * to nearest even and keeps subnormals. */
static void store_row(void *dst, enum lora_dtype dtype, const float *src, int n)
{
    uint16_t *d = dst;
    int c = 0;

    if (dtype == LORA_DTYPE_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    if (dtype == LORA_DTYPE_F16) {
        for (; c + 8 <= n; c += 8)
            _mm_storeu_si128((__m128i *)(d + c),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT));
        for (; c < n; c++)
            d[c] = lora_f32_to_f16(src[c]);
        return;
    }
    for (; c < n; c++)
        d[c] = lora_f32_to_bf16(src[c]);
}

void lora_cpu_kv_write(void *k_cache, void *v_cache, enum lora_dtype dtype, const float *k,
                       const float *v, const int *slot, int m, int kv_dim)
{
    size_t row = (size_t)kv_dim * lora_dtype_size(dtype);

    for (int i = 0; i < m; i++) {
        store_row((char *)k_cache + (size_t)slot[i] * row, dtype, k + (size_t)i * kv_dim, kv_dim);
        store_row((char *)v_cache + (size_t)slot[i] * row, dtype, v + (size_t)i * kv_dim, kv_dim);
    }
}

int lora_cpu_n_threads(void)
{
    return omp_get_max_threads();
}
