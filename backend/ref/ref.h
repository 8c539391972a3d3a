/* ref: the double-precision twins of every operation of backend/backend.h, in plain loops.
 *
 * Owns the meaning of each operation (docs/design.md, "Backend"): what a backend must compute,
 * written once, as simply as possible, in double precision, with no threads, no tiling and no
 * tensors in device memory. Every backend is tested against these twins (tests/backend and
 * tests/unit/test_kernels.c), never against another backend, so a fast kernel and its reference
 * can never share a mistake. Weights are read in any compute dtype (F32, BF16, F16, I8 with its
 * group scales); the matmul has a twin for each way a kernel may round its activations (to bf16,
 * quantized to int8). Compiled into the
 * library so that tests and tools can reach it; nothing on a serving path calls it.
 *
 * Where a twin returns a magnitude (mag, absdot) it is the sum of the absolute values of the
 * terms summed, the scale of a float32 kernel's rounding error: a kernel is right when
 * |got - want| <= tol * (1 + mag).
 */
#ifndef LORA_REF_H
#define LORA_REF_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* A (rows, cols) weight of a compute dtype in host memory. */
struct lora_ref_w {
    enum lora_dtype dtype;
    const void *data;
    int64_t rows, cols;
};

/* Element (r, c) of w as double (I8: q times its row's scale). */
double lora_ref_at(const struct lora_ref_w *w, int64_t r, int64_t c);

/* dot (m, w->rows) = x (m, w->cols) · wᵀ; absdot = Σ |x w| per element (may be NULL). */
void lora_ref_matmul(double *dot, double *absdot, const float *x, const struct lora_ref_w *w,
                     int m);

/* The fast BF16 matmul's twin: lora_ref_matmul of x rounded to bf16 (to nearest even). */
void lora_ref_matmul_xbf16(double *dot, double *absdot, const float *x, const struct lora_ref_w *w,
                           int m);

/* Quantizes x (n) as the I8 layout and the int8 matmul do (backend.h, LORA_I8_GROUP): per group
 * scales[g] = max |x| / 127 in float, q = round-half-even(x / scale) in float, 0 for a zero
 * group. q holds n values, scales lora_i8_groups(n). */
void lora_ref_quantize_row(const float *x, int64_t n, signed char *q, float *scales);

/* The I8 matmul's twin, w of dtype I8: each row of x quantized by lora_ref_quantize_row, the
 * group sums of q_x * q_w exact, scaled by both groups' scales in double. absdot is the sum of
 * the magnitudes of the scaled group terms (may be NULL). */
void lora_ref_matmul_xi8(double *dot, double *absdot, const float *x, const struct lora_ref_w *w,
                         int m);

/* out (m, bias->cols) = y + bias broadcast over rows. */
void lora_ref_add_bias(double *out, const float *y, const struct lora_ref_w *bias, int m);

/* out (m, table->cols) = rows ids[i] of table. */
void lora_ref_embed(double *out, const struct lora_ref_w *table, const int *ids, int m);

/* out (m, w->cols) = x / sqrt(mean(x²) + eps) * w. */
void lora_ref_rmsnorm(double *out, const float *x, const struct lora_ref_w *w, int m, double eps);

/* out (m, n_heads * head_dim) = x rotated, rotate-half convention: row i at position pos[i],
 * pair (j, j + head_dim/2) by pos * theta^(-2j/head_dim). */
void lora_ref_rope(double *out, const float *x, const int *pos, int m, int n_heads, int head_dim,
                   double theta);

/* out (n) = silu(gate) * up. */
void lora_ref_silu_mul(double *out, const float *gate, const float *up, size_t n);

/* out (n) = y + x. */
void lora_ref_add(double *out, const float *y, const float *x, size_t n);

/* Causal attention of one query row q (head_dim) at position p over contiguous keys and values
 * kc, vc (p + 1 rows of kv_dim, this head's columns from kv_off): out (head_dim). scores holds
 * p + 1 doubles. */
void lora_ref_attend(double *out, const float *q, const float *kc, const float *vc, int p,
                     int kv_off, int kv_dim, int head_dim, double *scores);

/* One row of the multi-LoRA delta: want (out) = y0 + scale · (x · aᵀ) · b_t over the first rank
 * rows of a (rank, in) and b_t (rank, out); mag its magnitude (may be NULL). */
void lora_ref_lora_row(double *want, double *mag, const float *x, const float *y0,
                       const struct lora_ref_w *a, const struct lora_ref_w *b_t, int rank,
                       double scale);

/* out (n) = the sum of bufs[0..n_ranks)[i] in rank order, in double. */
void lora_ref_allreduce(double *out, const float *const *bufs, int n_ranks, size_t n);

#endif
