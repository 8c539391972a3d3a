/* kernels_cpu: the CPU backend's element-wise kernels, embedding, KV writes and attention (see
 * kernels_cpu.h). Work is split across OpenMP threads; matmuls live in matmul_cpu.c. */
#include "backend/cpu/kernels_cpu.h"

#include <math.h>
#include <omp.h>
#include <string.h>

void lora_cpu_add_bias(float *y, const float *bias, int m, int n)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            y[(size_t)i * n + j] += bias[j];
}

void lora_cpu_embed(float *out, const float *table, const int *ids, int m, int dim)
{
    for (int i = 0; i < m; i++)
        memcpy(out + (size_t)i * dim, table + (size_t)ids[i] * dim, sizeof(float) * dim);
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

void lora_cpu_silu_mul(float *gate, const float *up, size_t n)
{
#pragma omp parallel for if (n > 16384)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void lora_cpu_add(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

void lora_cpu_kv_write(float *k_cache, float *v_cache, const float *k, const float *v,
                     const int *slot, int m, int kv_dim)
{
    for (int i = 0; i < m; i++) {
        memcpy(k_cache + (size_t)slot[i] * kv_dim, k + (size_t)i * kv_dim, sizeof(float) * kv_dim);
        memcpy(v_cache + (size_t)slot[i] * kv_dim, v + (size_t)i * kv_dim, sizeof(float) * kv_dim);
    }
}

int lora_cpu_n_threads(void)
{
    return omp_get_max_threads();
}

/* One query row of one head against positions [0, n_ctx) of its sequence. */
static void attend_one(float *out, const float *q, const float *k_cache, const float *v_cache,
                       const int *block_table, int n_ctx, int kv_off, int kv_dim, int head_dim,
                       int block_size, float *scores)
{
    float scale = 1.0f / sqrtf((float)head_dim);
    float max = -INFINITY;

    for (int p = 0; p < n_ctx; p++) {
        size_t slot = (size_t)block_table[p / block_size] * block_size + p % block_size;
        const float *k = k_cache + slot * kv_dim + kv_off;
        float dot = 0;
        for (int d = 0; d < head_dim; d++)
            dot += q[d] * k[d];
        scores[p] = dot * scale;
        if (scores[p] > max)
            max = scores[p];
    }
    float sum = 0;
    for (int p = 0; p < n_ctx; p++) {
        scores[p] = expf(scores[p] - max);
        sum += scores[p];
    }
    memset(out, 0, sizeof(float) * head_dim);
    for (int p = 0; p < n_ctx; p++) {
        size_t slot = (size_t)block_table[p / block_size] * block_size + p % block_size;
        const float *v = v_cache + slot * kv_dim + kv_off;
        float w = scores[p] / sum;
        for (int d = 0; d < head_dim; d++)
            out[d] += w * v[d];
    }
}

void lora_cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                      const struct lora_attn_seq *seqs, int n_seqs, int n_heads,
                      int n_kv_heads, int head_dim, int block_size, float *scratch, int max_ctx)
{
    int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    int group = n_heads / n_kv_heads;

    /* Work items are (sequence, head) pairs; a prefill's rows share their head's cache reads. */
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int s = 0; s < n_seqs; s++) {
        for (int h = 0; h < n_heads; h++) {
            const struct lora_attn_seq *sq = &seqs[s];
            float *scores = scratch + (size_t)omp_get_thread_num() * max_ctx;
            for (int r = 0; r < sq->n_rows; r++) {
                size_t off = (size_t)(sq->row + r) * q_dim + (size_t)h * head_dim;
                attend_one(out + off, q + off, k_cache, v_cache, sq->block_table, sq->pos + r + 1,
                           (h / group) * head_dim, kv_dim, head_dim, block_size, scores);
            }
        }
    }
}
