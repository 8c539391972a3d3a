/* ref: the double-precision twins of the backend operations, in plain loops, one per operation
 * of backend/backend.h; ref.h says why they exist and how tests use them (docs/design.md,
 * "Backend"). Kept deliberately naive: no threads, no tiling, weights read element by element
 * in their dtype, sums in double. The twins allocate (a row at a time): they are never on a
 * serving path. */
#include "backend/ref/ref.h"

#include <math.h>
#include <stdlib.h>
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
    case LORA_DTYPE_I8: {
        size_t row_bytes = (size_t)lora_i8_row_bytes(w->cols);
        memcpy(&f,
               p + (size_t)w->rows * row_bytes +
                   ((size_t)r * (size_t)lora_i8_groups(w->cols) + (size_t)c / LORA_I8_GROUP) *
                       sizeof(float),
               sizeof(f));
        return (double)((const signed char *)
                            p)[(size_t)r * row_bytes + (size_t)lora_i8_offset(w->cols, c)] *
               f;
    }
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

void lora_ref_matmul_xbf16(double *dot, double *absdot, const float *x, const struct lora_ref_w *w,
                           int m)
{
    int k = (int)w->cols;

    for (int i = 0; i < m; i++) {
        float *xr = malloc(sizeof(float) * (size_t)(k ? k : 1));
        for (int d = 0; d < k; d++) {
            uint16_t h = lora_f32_to_bf16(x[(size_t)i * k + d]);
            lora_dtype_to_f32(LORA_DTYPE_BF16, &h, &xr[d], 1);
        }
        lora_ref_matmul(dot + (size_t)i * w->rows, absdot ? absdot + (size_t)i * w->rows : NULL, xr,
                        w, 1);
        free(xr);
    }
}

void lora_ref_quantize_row(const float *x, int64_t n, signed char *q, float *scales)
{
    for (int64_t g = 0; g * LORA_I8_GROUP < n; g++) {
        int64_t c0 = g * LORA_I8_GROUP, c1 = c0 + LORA_I8_GROUP < n ? c0 + LORA_I8_GROUP : n;
        float max = 0;
        for (int64_t c = c0; c < c1; c++)
            max = fabsf(x[c]) > max ? fabsf(x[c]) : max;
        scales[g] = max / 127.0f;
        for (int64_t c = c0; c < c1; c++) {
            float r = scales[g] > 0 ? nearbyintf(x[c] / scales[g]) : 0.0f;
            q[c] = (signed char)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
    }
}

void lora_ref_matmul_xi8(double *dot, double *absdot, const float *x, const struct lora_ref_w *w,
                         int m)
{
    int n = (int)w->rows, k = (int)w->cols, n_groups = (int)lora_i8_groups(k);
    size_t row_bytes = (size_t)lora_i8_row_bytes(k);
    const signed char *qw = w->data;
    const char *w_scales = (const char *)w->data + (size_t)n * row_bytes;
    signed char *qx = malloc((size_t)(k ? k : 1));
    float *x_scales = malloc(sizeof(float) * (size_t)(n_groups ? n_groups : 1));

    for (int i = 0; i < m; i++) {
        lora_ref_quantize_row(x + (size_t)i * k, k, qx, x_scales);
        for (int j = 0; j < n; j++) {
            double s = 0, a = 0;
            for (int g = 0; g < n_groups; g++) {
                long long sum = 0, abs_sum = 0; /* exact, as the kernels' int32 sums */
                for (int d = g * LORA_I8_GROUP; d < k && d < (g + 1) * LORA_I8_GROUP; d++) {
                    long long p =
                        (long long)qx[d] * qw[(size_t)j * row_bytes + (size_t)lora_i8_offset(k, d)];
                    sum += p;
                    abs_sum += p < 0 ? -p : p;
                }
                float ws;
                memcpy(&ws, w_scales + ((size_t)j * n_groups + g) * sizeof(float), sizeof(ws));
                s += (double)x_scales[g] * ws * (double)sum;
                a += fabs((double)x_scales[g] * ws) * (double)abs_sum;
            }
            dot[(size_t)i * n + j] = s;
            if (absdot)
                absdot[(size_t)i * n + j] = a;
        }
    }
    free(qx);
    free(x_scales);
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
