/* kernels_cuda: the CUDA backend's kernels (see kernels_cuda.h). Each is written to be plainly
 * right first: one block per row (or per row and head), sums in a fixed order, float32
 * accumulation. What bounds each one's speed is said above it. */
#include "backend/cuda/kernels_cuda.h"

#include <math.h>

namespace
{

/* ---- reductions in a fixed order ---- */

/* The sum over the warp; every lane gets the same bits (the butterfly adds the same two numbers
 * on both sides of each exchange). */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The sum over a block of a multiple of 32 threads, warps added in order; every thread gets it.
 * red holds 32 floats. */
__device__ float block_sum(float v, float *red)
{
    int warp = threadIdx.x / LORA_WARP, lane = threadIdx.x % LORA_WARP;
    int n_warps = blockDim.x / LORA_WARP;

    v = warp_sum(v);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float s = red[0];
    for (int w = 1; w < n_warps; w++)
        s += red[w];
    __syncthreads(); /* red may be used again */
    return s;
}

__device__ float block_max(float v, float *red)
{
    int warp = threadIdx.x / LORA_WARP, lane = threadIdx.x % LORA_WARP;
    int n_warps = blockDim.x / LORA_WARP;

    v = warp_max(v);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float s = red[0];
    for (int w = 1; w < n_warps; w++)
        s = fmaxf(s, red[w]);
    __syncthreads();
    return s;
}

unsigned grid_for(size_t n, unsigned threads)
{
    size_t blocks = (n + threads - 1) / threads;
    return blocks < 1 ? 1 : blocks > 65535 ? 65535 : (unsigned)blocks;
}

#ifdef LORA_CUDA_EMU
#define DEV(p) lora_emu_check_device((p), __func__)
#else
#define DEV(p) ((void)0)
#endif

/* ---- embedding: a gather, bound by the rows' bytes ---- */

template <class E>
__global__ void embed_kernel(float *out, const typename E::storage *table, int64_t cols,
                             const int *ids)
{
    const typename E::storage *src = table + (size_t)ids[blockIdx.x] * (size_t)cols;
    float *dst = out + (size_t)blockIdx.x * (size_t)cols;

    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        dst[c] = E::to_f32(src[c]);
}

/* ---- RMSNorm: one block per row, two passes over it; bound by memory ---- */

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *orow = out + (size_t)blockIdx.x * dim;
    float ss = 0;

    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        ss = fmaf(xr[c], xr[c], ss);
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    /* In place is safe: each thread writes only the columns it alone read, after the sum. */
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        orow[c] = xr[c] * inv * w[c];
}

/* ---- RoPE: one block per row; the angle in double (positions reach 10^5, where a float angle
 * is off by 1e-2), which makes FP64 throughput the bound on the GPUs that have little (L4, A10) */

__global__ void rope_kernel(float *x, const int *pos, int n_heads, int head_dim, float theta)
{
    int half = head_dim / 2;
    float *row = x + (size_t)blockIdx.x * n_heads * head_dim;
    double p = (double)pos[blockIdx.x];

    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        double angle = p * pow((double)theta, -2.0 * j / head_dim);
        float c = (float)cos(angle), s = (float)sin(angle);
        for (int h = 0; h < n_heads; h++) {
            float *v = row + (size_t)h * head_dim;
            float a = v[j], b = v[j + half];
            v[j] = a * c - b * s;
            v[j + half] = b * c + a * s;
        }
    }
}

/* ---- element-wise: bound by memory ---- */

__global__ void silu_mul_kernel(float *gate, const float *up, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void add_bias_kernel(float *y, const float *bias, size_t total, int n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % (size_t)n];
}

/* ---- KV write: a scatter of rows, bound by memory ---- */

template <class E>
__global__ void kv_write_kernel(typename E::storage *kc, typename E::storage *vc, const float *k,
                                const float *v, const int *slot, int kv_dim)
{
    size_t dst = (size_t)slot[blockIdx.x] * kv_dim, src = (size_t)blockIdx.x * kv_dim;

    for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) {
        kc[dst + c] = E::from_f32(k[src + c]);
        vc[dst + c] = E::from_f32(v[src + c]);
    }
}

/* ---- attention ----
 *
 * One block per (query row, part of its context, KV head, group of up to 8 query heads of that KV
 * head): the heads of a group share every tile of keys the block loads, and every value it reads.
 * Positions go by tiles of 32, one per lane: a warp scores a tile for one head (a dot product per
 * lane over the tile's keys in shared memory), then updates that head's running max and sum
 * (online softmax); then every thread adds the tile's weighted values into its (head, dim)
 * accumulators. A context longer than LORA_CUDA_ATTN_SPLIT is cut into parts computed by
 * separate blocks and merged by merge_kernel in part order.
 *
 * Bounds: decoding reads each row's keys and values once per group of heads, so it is bound by
 * memory bandwidth for long contexts and by the latency of the tile loop for short ones. Prefill
 * rows each read their whole context again (from L2 mostly): O(rows x context x kv_dim) bytes,
 * the kernel's limit on long prompts; a tiled kernel sharing key tiles across query rows (flash
 * attention) is the next step. */

#define ATTN_THREADS 128
#define ATTN_TILE    32
#define ATTN_HG_MAX  8 /* heads per block; two per warp */
#define ATTN_SMEM    (48 * 1024)

/* Shared memory of a block: q and the accumulators (hg x head_dim each), the key tile (padded
 * against bank conflicts), the tile's weights, each head's correction, max and sum, the slots. */
size_t attn_smem(int hg, int head_dim)
{
    return sizeof(float) * ((size_t)2 * hg * head_dim + (size_t)ATTN_TILE * (head_dim + 1) +
                            (size_t)hg * ATTN_TILE + 3 * (size_t)hg) +
           sizeof(int) * ATTN_TILE;
}

struct attn_args {
    float *out;
    const float *q;
    const void *k_cache, *v_cache;
    const lora_cuda_attn_seq *seqs;
    const lora_cuda_attn_item *items;
    const int *tables;
    float *partials;
    int n_heads, n_kv_heads, head_dim, block_size, group, hg, n_chunks;
    float scale;
};

template <class E> __global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(attn_args a)
{
    typedef typename E::storage T;
    const lora_cuda_attn_item it = a.items[blockIdx.x];
    const lora_cuda_attn_seq sq = a.seqs[it.seq];
    const int hd = a.head_dim, kv_dim = a.n_kv_heads * hd, q_dim = a.n_heads * hd;
    const int kvh = (int)blockIdx.y / a.n_chunks, chunk = (int)blockIdx.y % a.n_chunks;
    const int head0 = kvh * a.group + chunk * a.hg;
    const int nh = min(a.hg, a.group - chunk * a.hg);
    const int row = sq.row + it.r, n_ctx = sq.pos + it.r + 1;
    const int p0 = it.split * LORA_CUDA_ATTN_SPLIT, p1 = min(n_ctx, p0 + LORA_CUDA_ATTN_SPLIT);
    const int *table = a.tables + sq.table;
    const T *kc = (const T *)a.k_cache + (size_t)kvh * hd;
    const T *vc = (const T *)a.v_cache + (size_t)kvh * hd;
    const int tid = threadIdx.x, lane = tid % LORA_WARP, warp = tid / LORA_WARP;
    const int n_warps = ATTN_THREADS / LORA_WARP;

    float *q_s = (float *)LORA_DYN_SMEM();           /* (hg, hd) */
    float *acc_s = q_s + (size_t)a.hg * hd;          /* (hg, hd) */
    float *k_s = acc_s + (size_t)a.hg * hd;          /* (TILE, hd + 1) */
    float *p_s = k_s + (size_t)ATTN_TILE * (hd + 1); /* (hg, TILE) */
    float *c_s = p_s + (size_t)a.hg * ATTN_TILE;     /* (hg) correction of this tile */
    float *m_s = c_s + a.hg;                         /* (hg) final max */
    float *l_s = m_s + a.hg;                         /* (hg) final sum */
    int *slot_s = (int *)(l_s + a.hg);               /* (TILE) */

    for (int i = tid; i < nh * hd; i += ATTN_THREADS) {
        q_s[i] = a.q[(size_t)row * q_dim + (size_t)head0 * hd + i];
        acc_s[i] = 0.0f;
    }
    /* Each head is scored by one warp, always the same: its max and sum live in that warp's
     * registers, the same in every lane. */
    float m_r[ATTN_HG_MAX / (ATTN_THREADS / LORA_WARP)],
        l_r[ATTN_HG_MAX / (ATTN_THREADS / LORA_WARP)];
    for (int i = 0; i < ATTN_HG_MAX / n_warps; i++) {
        m_r[i] = -INFINITY;
        l_r[i] = 0.0f;
    }

    for (int t0 = p0; t0 < p1; t0 += ATTN_TILE) {
        const int nt = min(ATTN_TILE, p1 - t0);
        __syncthreads(); /* the previous tile is consumed (and q_s written, the first time) */
        if (tid < nt) {
            int p = t0 + tid;
            slot_s[tid] = table[p / a.block_size] * a.block_size + p % a.block_size;
        }
        __syncthreads();
        for (int i = tid; i < ATTN_TILE * hd; i += ATTN_THREADS) {
            int j = i / hd, d = i % hd;
            k_s[j * (hd + 1) + d] = j < nt ? E::to_f32(kc[(size_t)slot_s[j] * kv_dim + d]) : 0.0f;
        }
        __syncthreads();
        for (int hi = 0; hi < ATTN_HG_MAX / n_warps; hi++) {
            int h = warp + hi * n_warps;
            if (h >= nh)
                break; /* the same h in every lane: the warp leaves together */
            float s = -INFINITY;
            if (lane < nt) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot = fmaf(q_s[h * hd + d], k_s[lane * (hd + 1) + d], dot);
                s = dot * a.scale;
            }
            float m_new = fmaxf(m_r[hi], warp_max(s)); /* finite: the tile has a position */
            float e = lane < nt ? expf(s - m_new) : 0.0f;
            float corr = expf(m_r[hi] - m_new); /* 0 on the first tile */
            l_r[hi] = l_r[hi] * corr + warp_sum(e);
            m_r[hi] = m_new;
            p_s[h * ATTN_TILE + lane] = e;
            if (lane == 0)
                c_s[h] = corr;
        }
        __syncthreads();
        for (int i = tid; i < nh * hd; i += ATTN_THREADS) {
            int h = i / hd, d = i % hd;
            float acc = acc_s[i] * c_s[h];
            for (int j = 0; j < nt; j++)
                acc = fmaf(p_s[h * ATTN_TILE + j], E::to_f32(vc[(size_t)slot_s[j] * kv_dim + d]),
                           acc);
            acc_s[i] = acc;
        }
    }
    for (int hi = 0; hi < ATTN_HG_MAX / n_warps; hi++) {
        int h = warp + hi * n_warps;
        if (h < nh && lane == 0) {
            m_s[h] = m_r[hi];
            l_s[h] = l_r[hi];
        }
    }
    __syncthreads();
    for (int i = tid; i < nh * hd; i += ATTN_THREADS) {
        int h = i / hd, d = i % hd;
        if (it.part < 0) {
            a.out[(size_t)row * q_dim + (size_t)(head0 + h) * hd + d] = acc_s[i] / l_s[h];
        } else {
            float *pp = a.partials + ((size_t)it.part * a.n_heads + head0 + h) * (hd + 2);
            if (d == 0) {
                pp[0] = m_s[h];
                pp[1] = l_s[h];
            }
            pp[2 + d] = acc_s[i];
        }
    }
}

/* One block per (row, head): the parts merged in order. */
__global__ void merge_kernel(float *out, const float *partials, const lora_cuda_attn_merge *merges,
                             int n_heads, int head_dim)
{
    const lora_cuda_attn_merge mg = merges[blockIdx.x];
    const int h = blockIdx.y, hd = head_dim;
    const size_t stride = (size_t)n_heads * (hd + 2);
    const float *base = partials + ((size_t)mg.part0 * n_heads + h) * (hd + 2);
    float mx = -INFINITY, sum = 0.0f;

    for (int s = 0; s < mg.n_parts; s++)
        mx = fmaxf(mx, base[s * stride]);
    for (int s = 0; s < mg.n_parts; s++)
        sum += base[s * stride + 1] * expf(base[s * stride] - mx);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < mg.n_parts; s++)
            acc = fmaf(base[s * stride + 2 + d], expf(base[s * stride] - mx), acc);
        out[(size_t)mg.row * n_heads * hd + (size_t)h * hd + d] = acc / sum;
    }
}

/* ---- multi-LoRA: shrink and expand over segments (Punica's SGMV layout) ----
 *
 * An item is up to rows_per_item rows of one segment. Shrink: one warp per (item, r < rank), four
 * to a block: the lanes split the hidden dimension (lane l takes k = l, l + 32, ...), each keeps
 * one sum per row, and the warp adds the 32 sums in a fixed butterfly; so A's row r is read once
 * per item, from memory once per step for a decoding segment. Expand: one block per (item, 256
 * output columns): the item's rows of t in shared memory, each thread one column, accumulating
 * over the rank in order, then y += scale · that. Ranks differ per segment and nothing is padded:
 * a warp for r >= its segment's rank does nothing. Both are bound by reading A and B (and by
 * launch latency for small batches). */

#define SGMV_ROWS_MAX  8
#define SHRINK_WARPS   4 /* ranks per shrink block */
#define EXPAND_THREADS 256

template <class E>
__global__ void __launch_bounds__(SHRINK_WARPS *LORA_WARP)
    shrink_kernel(float *t, const float *x, const lora_cuda_sgmv_seg *segs,
                  const lora_cuda_sgmv_item *items, int in, int max_rank)
{
    const lora_cuda_sgmv_item it = items[blockIdx.x];
    const lora_cuda_sgmv_seg sg = segs[it.seg];
    const int lane = threadIdx.x % LORA_WARP;
    const int r = blockIdx.y * SHRINK_WARPS + threadIdx.x / LORA_WARP;

    if (r >= sg.rank)
        return; /* the whole warp: no barrier follows, only this warp's shuffles */
    const typename E::storage *a = (const typename E::storage *)sg.a + (size_t)r * in;
    const float *xr = x + (size_t)it.row0 * in;
    float acc[SGMV_ROWS_MAX];
    for (int i = 0; i < SGMV_ROWS_MAX; i++)
        acc[i] = 0.0f;
    for (int k = lane; k < in; k += LORA_WARP) {
        float av = E::to_f32(a[k]);
        for (int i = 0; i < SGMV_ROWS_MAX; i++)
            if (i < it.n_rows)
                acc[i] = fmaf(xr[(size_t)i * in + k], av, acc[i]);
    }
    for (int i = 0; i < SGMV_ROWS_MAX; i++) {
        if (i >= it.n_rows)
            break; /* the same for the whole warp */
        float s = warp_sum(acc[i]);
        if (lane == 0)
            t[(size_t)(it.row0 + i) * max_rank + r] = s;
    }
}

template <class E>
__global__ void __launch_bounds__(EXPAND_THREADS)
    expand_kernel(float *y, const float *t, const lora_cuda_sgmv_seg *segs,
                  const lora_cuda_sgmv_item *items, int out, int max_rank)
{
    const lora_cuda_sgmv_item it = items[blockIdx.x];
    const lora_cuda_sgmv_seg sg = segs[it.seg];
    const int rank = sg.rank;
    float *t_s = (float *)LORA_DYN_SMEM(); /* (n_rows, rank) */

    for (int i = threadIdx.x; i < it.n_rows * rank; i += EXPAND_THREADS)
        t_s[i] = t[(size_t)(it.row0 + i / rank) * max_rank + i % rank];
    __syncthreads();
    const int o = blockIdx.y * EXPAND_THREADS + threadIdx.x;
    if (o >= out)
        return; /* after the only barrier */
    const typename E::storage *b = (const typename E::storage *)sg.b;
    float acc[SGMV_ROWS_MAX];
    for (int i = 0; i < SGMV_ROWS_MAX; i++)
        acc[i] = 0.0f;
    for (int q = 0; q < rank; q++) {
        float bv = E::to_f32(b[(size_t)q * out + o]);
        for (int i = 0; i < SGMV_ROWS_MAX; i++)
            if (i < it.n_rows)
                acc[i] = fmaf(t_s[i * rank + q], bv, acc[i]);
    }
    for (int i = 0; i < SGMV_ROWS_MAX; i++) { /* a fixed bound: acc stays in registers */
        if (i < it.n_rows) {
            float *yp = y + (size_t)(it.row0 + i) * out + o;
            *yp = fmaf(sg.scale, acc[i], *yp);
        }
    }
}

/* ---- matmul's helpers: activations to 16-bit pieces and the pieces' products summed; both
 * bound by memory ---- */

template <class E>
__global__ void split_kernel(typename E::storage *dst, int *row_exp, const float *x, int m, int k,
                             int pieces, int scaled)
{
    __shared__ float red[32];
    const int i = blockIdx.x;
    const float *xr = x + (size_t)i * k;
    int e = 0;

    if (scaled) { /* F16: a row reaching 2^14 is scaled below it, so no piece overflows */
        float mx = 0.0f;
        for (int c = threadIdx.x; c < k; c += blockDim.x)
            mx = fmaxf(mx, fabsf(xr[c]));
        mx = block_max(mx, red);
        if (mx >= 16384.0f && mx <= 3.4e38f) {
            int ex;
            frexpf(mx, &ex); /* mx < 2^ex */
            e = ex - 14;
        }
        if (threadIdx.x == 0)
            row_exp[i] = e;
    }
    for (int c = threadIdx.x; c < k; c += blockDim.x) {
        float v = ldexpf(xr[c], -e);
        for (int p = 0; p < pieces; p++) {
            typename E::storage h = E::from_f32(v);
            dst[((size_t)p * m + i) * k + c] = h;
            v -= E::to_f32(h); /* exact: the remainder of a rounding */
        }
    }
}

__global__ void combine_kernel(float *y, const float *parts, const int *row_exp, int m, int n,
                               int pieces, float alpha, int accumulate)
{
    const size_t total = (size_t)m * n;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = parts[i];
        for (int p = 1; p < pieces; p++)
            s += parts[(size_t)p * total + i];
        if (row_exp)
            s = ldexpf(s, row_exp[i / n]);
        float v = alpha * s;
        y[i] = accumulate ? y[i] + v : v;
    }
}

} /* namespace */

/* ---- launches ---- */

size_t lora_cuda_attn_part_bytes(int n_heads, int head_dim)
{
    return sizeof(float) * (size_t)n_heads * (size_t)(head_dim + 2);
}

int lora_cuda_attn_heads_per_block(int group, int head_dim)
{
    int hg = group < ATTN_HG_MAX ? group : ATTN_HG_MAX;

    while (hg > 1 && attn_smem(hg, head_dim) > ATTN_SMEM)
        hg--;
    return attn_smem(hg, head_dim) <= ATTN_SMEM ? hg : 0;
}

void lora_cuda_embed(cudaStream_t s, float *out, const void *table, enum lora_dtype dtype,
                     int64_t cols, const int *ids, int m)
{
    DEV(out);
    DEV(table);
    DEV(ids);
    if (dtype == LORA_DTYPE_F32)
        LORA_LAUNCH(embed_kernel<lora_f32_t>, m, 256, 0, s, out, (const float *)table, cols, ids);
    else if (dtype == LORA_DTYPE_BF16)
        LORA_LAUNCH(embed_kernel<lora_bf16_t>, m, 256, 0, s, out, (const uint16_t *)table, cols,
                    ids);
    else
        LORA_LAUNCH(embed_kernel<lora_f16_t>, m, 256, 0, s, out, (const uint16_t *)table, cols,
                    ids);
}

void lora_cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w, int m, int dim,
                       float eps)
{
    DEV(out);
    DEV(x);
    DEV(w);
    LORA_LAUNCH(rmsnorm_kernel, m, 256, 0, s, out, x, w, dim, eps);
}

void lora_cuda_rope(cudaStream_t s, float *x, const int *pos, int m, int n_heads, int head_dim,
                    float theta)
{
    DEV(x);
    DEV(pos);
    if (head_dim / 2 < 1)
        return;
    LORA_LAUNCH(rope_kernel, m, 64, 0, s, x, pos, n_heads, head_dim, theta);
}

void lora_cuda_silu_mul(cudaStream_t s, float *gate, const float *up, size_t n)
{
    DEV(gate);
    DEV(up);
    LORA_LAUNCH(silu_mul_kernel, grid_for(n, 256), 256, 0, s, gate, up, n);
}

void lora_cuda_add(cudaStream_t s, float *y, const float *x, size_t n)
{
    DEV(y);
    DEV(x);
    LORA_LAUNCH(add_kernel, grid_for(n, 256), 256, 0, s, y, x, n);
}

void lora_cuda_add_bias(cudaStream_t s, float *y, const float *bias, int m, int n)
{
    size_t total = (size_t)m * n;

    DEV(y);
    DEV(bias);
    LORA_LAUNCH(add_bias_kernel, grid_for(total, 256), 256, 0, s, y, bias, total, n);
}

void lora_cuda_kv_write(cudaStream_t s, void *k_cache, void *v_cache, enum lora_dtype dtype,
                        const float *k, const float *v, const int *slot, int m, int kv_dim)
{
    DEV(k_cache);
    DEV(v_cache);
    DEV(k);
    DEV(v);
    DEV(slot);
    if (dtype == LORA_DTYPE_F32)
        LORA_LAUNCH(kv_write_kernel<lora_f32_t>, m, 128, 0, s, (float *)k_cache, (float *)v_cache,
                    k, v, slot, kv_dim);
    else if (dtype == LORA_DTYPE_BF16)
        LORA_LAUNCH(kv_write_kernel<lora_bf16_t>, m, 128, 0, s, (uint16_t *)k_cache,
                    (uint16_t *)v_cache, k, v, slot, kv_dim);
    else
        LORA_LAUNCH(kv_write_kernel<lora_f16_t>, m, 128, 0, s, (uint16_t *)k_cache,
                    (uint16_t *)v_cache, k, v, slot, kv_dim);
}

void lora_cuda_attention(cudaStream_t s, float *out, const float *q, const void *k_cache,
                         const void *v_cache, enum lora_dtype dtype,
                         const struct lora_cuda_attn_seq *seqs,
                         const struct lora_cuda_attn_item *items, int n_items,
                         const struct lora_cuda_attn_merge *merges, int n_merges, const int *tables,
                         float *partials, int n_heads, int n_kv_heads, int head_dim, int block_size,
                         int hg)
{
    attn_args a;
    a.out = out;
    a.q = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.seqs = seqs;
    a.items = items;
    a.tables = tables;
    a.partials = partials;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.block_size = block_size;
    a.group = n_heads / n_kv_heads;
    a.hg = hg;
    a.n_chunks = (a.group + hg - 1) / hg;
    a.scale = 1.0f / sqrtf((float)head_dim);
    DEV(out);
    DEV(q);
    DEV(k_cache);
    DEV(v_cache);
    DEV(seqs);
    DEV(items);
    DEV(tables);
    DEV(partials);
    dim3 grid((unsigned)n_items, (unsigned)(n_kv_heads * a.n_chunks));
    size_t smem = attn_smem(hg, head_dim);
    if (n_items > 0) {
        if (dtype == LORA_DTYPE_F32)
            LORA_LAUNCH(attention_kernel<lora_f32_t>, grid, ATTN_THREADS, smem, s, a);
        else if (dtype == LORA_DTYPE_BF16)
            LORA_LAUNCH(attention_kernel<lora_bf16_t>, grid, ATTN_THREADS, smem, s, a);
        else
            LORA_LAUNCH(attention_kernel<lora_f16_t>, grid, ATTN_THREADS, smem, s, a);
    }
    if (n_merges > 0) {
        DEV(merges);
        LORA_LAUNCH(merge_kernel, dim3((unsigned)n_merges, (unsigned)n_heads), 64, 0, s, out,
                    (const float *)partials, merges, n_heads, head_dim);
    }
}

int lora_cuda_sgmv_rows_per_item(int max_rank)
{
    /* The expand's t rows within 48 KiB of shared memory. */
    int rows = (int)(ATTN_SMEM / (sizeof(float) * (size_t)(max_rank > 0 ? max_rank : 1)));
    return rows < 1 ? 0 : rows > SGMV_ROWS_MAX ? SGMV_ROWS_MAX : rows;
}

template <class A>
static void shrink_as(cudaStream_t s, dim3 grid, float *t, const float *x,
                      const lora_cuda_sgmv_seg *segs, const lora_cuda_sgmv_item *items, int in,
                      int max_rank)
{
    LORA_LAUNCH(shrink_kernel<A>, grid, SHRINK_WARPS * LORA_WARP, 0, s, t, x, segs, items, in,
                max_rank);
}

template <class B>
static void expand_as(cudaStream_t s, dim3 grid, size_t smem, float *y, const float *t,
                      const lora_cuda_sgmv_seg *segs, const lora_cuda_sgmv_item *items, int out,
                      int max_rank)
{
    LORA_LAUNCH(expand_kernel<B>, grid, EXPAND_THREADS, smem, s, y, t, segs, items, out, max_rank);
}

void lora_cuda_sgmv(cudaStream_t s, float *y, const float *x, float *t,
                    const struct lora_cuda_sgmv_seg *segs, const struct lora_cuda_sgmv_item *items,
                    int n_items, enum lora_dtype a_dtype, enum lora_dtype b_dtype, int in, int out,
                    int max_rank, int launch_rank, int rows_per_item)
{
    DEV(y);
    DEV(x);
    DEV(t);
    DEV(segs);
    DEV(items);
    if (n_items < 1 || launch_rank < 1)
        return;
    dim3 g_shrink((unsigned)n_items, (unsigned)((launch_rank + SHRINK_WARPS - 1) / SHRINK_WARPS));
    if (a_dtype == LORA_DTYPE_F32)
        shrink_as<lora_f32_t>(s, g_shrink, t, x, segs, items, in, max_rank);
    else if (a_dtype == LORA_DTYPE_BF16)
        shrink_as<lora_bf16_t>(s, g_shrink, t, x, segs, items, in, max_rank);
    else
        shrink_as<lora_f16_t>(s, g_shrink, t, x, segs, items, in, max_rank);
    dim3 g_expand((unsigned)n_items, (unsigned)((out + EXPAND_THREADS - 1) / EXPAND_THREADS));
    size_t smem = sizeof(float) * (size_t)rows_per_item * launch_rank;
    if (b_dtype == LORA_DTYPE_F32)
        expand_as<lora_f32_t>(s, g_expand, smem, y, t, segs, items, out, max_rank);
    else if (b_dtype == LORA_DTYPE_BF16)
        expand_as<lora_bf16_t>(s, g_expand, smem, y, t, segs, items, out, max_rank);
    else
        expand_as<lora_f16_t>(s, g_expand, smem, y, t, segs, items, out, max_rank);
}

void lora_cuda_split(cudaStream_t s, void *dst, int *row_exp, const float *x, int m, int k,
                     int pieces, enum lora_dtype dtype)
{
    DEV(dst);
    DEV(row_exp);
    DEV(x);
    if (dtype == LORA_DTYPE_BF16)
        LORA_LAUNCH(split_kernel<lora_bf16_t>, m, 256, 0, s, (uint16_t *)dst, row_exp, x, m, k,
                    pieces, 0);
    else
        LORA_LAUNCH(split_kernel<lora_f16_t>, m, 256, 0, s, (uint16_t *)dst, row_exp, x, m, k,
                    pieces, 1);
}

void lora_cuda_combine(cudaStream_t s, float *y, const float *parts, const int *row_exp, int m,
                       int n, int pieces, float alpha, bool accumulate)
{
    size_t total = (size_t)m * n;

    DEV(y);
    DEV(parts);
    DEV(row_exp);
    LORA_LAUNCH(combine_kernel, grid_for(total, 256), 256, 0, s, y, parts, row_exp, m, n, pieces,
                alpha, accumulate ? 1 : 0);
}
