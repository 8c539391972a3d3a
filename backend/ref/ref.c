/* ref: the double-precision twins of the backend operations, in plain loops, one per operation
 * of backend/backend.h; ref.h says why they exist and how tests use them (docs/design.md,
 * "Backend"). Kept deliberately naive: no threads, no tiling, weights read element by element
 * in their dtype, sums in double. */
#include "backend/ref/ref.h"

#include <math.h>
#include <string.h>

double lora_ref_at(const struct lora_ref_w *w, int64_t r, int64_t c)
{
    const char *p = w->data;
    size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
    uint16_t h;
    float f;

    switch (w->dtype) {
    case LORA_DTYPE_F32:
        memcpy(&f, p + 4 * i, sizeof(f));
        return f;
    case LORA_DTYPE_BF16:
    case LORA_DTYPE_F16:
        memcpy(&h, p + 2 * i, sizeof(h));
        lora_dtype_to_f32(w->dtype, &h, &f, 1);
        return f;
    case LORA_DTYPE_I8:
        memcpy(&f, p + (size_t)w->rows * (size_t)w->cols + (size_t)r * sizeof(float), sizeof(f));
        return (double)((const signed char *)p)[i] * f;
    default:
        return NAN;
    }
}

void lora_ref_matmul(double *dot, double *absdot, const float *x, const struct lora_ref_w *w, int m)
{
    int n = (int)w->rows, k = (int)w->cols;

    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0, a = 0;
            for (int d = 0; d < k; d++) {
                double p = (double)x[(size_t)i * k + d] * lora_ref_at(w, j, d);
                s += p;
                a += fabs(p);
            }
            dot[(size_t)i * n + j] = s;
            if (absdot)
                absdot[(size_t)i * n + j] = a;
        }
    }
}

void lora_ref_add_bias(double *out, const float *y, const struct lora_ref_w *bias, int m)
{
    int n = (int)bias->cols;

    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            out[(size_t)i * n + j] = (double)y[(size_t)i * n + j] + lora_ref_at(bias, 0, j);
}

void lora_ref_embed(double *out, const struct lora_ref_w *table, const int *ids, int m)
{
    int dim = (int)table->cols;

    for (int i = 0; i < m; i++)
        for (int j = 0; j < dim; j++)
            out[(size_t)i * dim + j] = lora_ref_at(table, ids[i], j);
}

void lora_ref_rmsnorm(double *out, const float *x, const struct lora_ref_w *w, int m, double eps)
{
    int dim = (int)w->cols;

    for (int i = 0; i < m; i++) {
        double ss = 0;
        for (int j = 0; j < dim; j++)
            ss += (double)x[(size_t)i * dim + j] * x[(size_t)i * dim + j];
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int j = 0; j < dim; j++)
            out[(size_t)i * dim + j] = x[(size_t)i * dim + j] * inv * lora_ref_at(w, 0, j);
    }
}

void lora_ref_rope(double *out, const float *x, const int *pos, int m, int n_heads, int head_dim,
                   double theta)
{
    int half = head_dim / 2, dim = n_heads * head_dim;

    for (int i = 0; i < m; i++) {
        for (int h = 0; h < n_heads; h++) {
            const float *v = x + (size_t)i * dim + (size_t)h * head_dim;
            double *o = out + (size_t)i * dim + (size_t)h * head_dim;
            for (int j = 0; j < half; j++) {
                double angle = pos[i] * pow(theta, -2.0 * j / head_dim);
                o[j] = v[j] * cos(angle) - v[j + half] * sin(angle);
                o[j + half] = v[j + half] * cos(angle) + v[j] * sin(angle);
            }
            if (head_dim % 2) /* an odd head's last element has no pair */
                o[head_dim - 1] = v[head_dim - 1];
        }
    }
}

void lora_ref_silu_mul(double *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0 + exp(-(double)gate[i])) * up[i];
}

void lora_ref_add(double *out, const float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (double)y[i] + x[i];
}

void lora_ref_attend(double *out, const float *q, const float *kc, const float *vc, int p,
                     int kv_off, int kv_dim, int head_dim, double *scores)
{
    double max = -INFINITY, sum = 0;

    for (int t = 0; t <= p; t++) {
        double dot = 0;
        for (int d = 0; d < head_dim; d++)
            dot += (double)q[d] * kc[(size_t)t * kv_dim + kv_off + d];
        scores[t] = dot / sqrt((double)head_dim);
        if (scores[t] > max)
            max = scores[t];
    }
    for (int t = 0; t <= p; t++) {
        scores[t] = exp(scores[t] - max);
        sum += scores[t];
    }
    for (int d = 0; d < head_dim; d++) {
        double acc = 0;
        for (int t = 0; t <= p; t++)
            acc += scores[t] / sum * vc[(size_t)t * kv_dim + kv_off + d];
        out[d] = acc;
    }
}

void lora_ref_lora_row(double *want, double *mag, const float *x, const float *y0,
                       const struct lora_ref_w *a, const struct lora_ref_w *b_t, int rank,
                       double scale)
{
    int in = (int)a->cols, out = (int)b_t->cols;

    for (int o = 0; o < out; o++) {
        want[o] = y0[o];
        if (mag)
            mag[o] = fabs(y0[o]);
    }
    for (int q = 0; q < rank; q++) {
        double t = 0, t_mag = 0;
        for (int i = 0; i < in; i++) {
            double p = (double)x[i] * lora_ref_at(a, q, i);
            t += p;
            t_mag += fabs(p);
        }
        for (int o = 0; o < out; o++) {
            double b = lora_ref_at(b_t, q, o);
            want[o] += scale * t * b;
            if (mag)
                mag[o] += fabs(scale) * t_mag * fabs(b);
        }
    }
}

void lora_ref_allreduce(double *out, const float *const *bufs, int n_ranks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = 0;
        for (int r = 0; r < n_ranks; r++)
            out[i] += bufs[r][i];
    }
}
