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

void lora_cpu_rmsnorm(float *out, const float *x, const float *w, int m, int dim, float eps)
{
#pragma omp parallel for if (m > 4)
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++)
            ss += (double)xi[j] * xi[j];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++)
            oi[j] = xi[j] * inv * w[j];
    }
}

void lora_cpu_rope(float *x, const int *pos, int m, int n_heads, int head_dim, float theta)
{
    int half = head_dim / 2;

#pragma omp parallel for if (m > 4)
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < half; j++) {
            /* Angles in double: positions reach tens of thousands. */
            double freq = pow((double)theta, -2.0 * j / head_dim);
            double angle = pos[i] * freq;
            float c = (float)cos(angle), s = (float)sin(angle);
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

void lora_cpu_silu_mul(float *gate, const float *up, size_t n)
{
    size_t n8 = n / 8;

#pragma omp parallel for if (n > 16384)
    for (size_t b = 0; b < n8; b++)
        silu_mul8(gate + 8 * b, up + 8 * b);
    if (n % 8) { /* through a padded vector: the same arithmetic as every other value */
        float g[8] = {0}, u[8] = {0};
        memcpy(g, gate + 8 * n8, (n % 8) * sizeof(float));
        memcpy(u, up + 8 * n8, (n % 8) * sizeof(float));
        silu_mul8(g, u);
        memcpy(gate + 8 * n8, g, (n % 8) * sizeof(float));
    }
}

void lora_cpu_add(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
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
