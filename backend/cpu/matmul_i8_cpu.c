/* matmul_i8_cpu: the I8 matmul's panels: y = alpha · x · wᵀ (+ y) with w quantized in groups of
 * LORA_I8_GROUP along the input (backend.h's I8 layout), batch-invariant.
 *
 * Each row of x is quantized the same way, group by group (scale = max |x| / 127, q = x / scale
 * rounded to nearest even), once per call into the backend's staging memory (lora_cpu_matmul
 * spreads the rows over threads, then the panels), so a row's bytes never depend on the batch.
 * Within a group the products q_x · q_w are summed exactly in int32 lanes; each group's lanes are
 * converted to float32, scaled by the weights' scale then the activations' and added into float32
 * lanes in group order, and the lanes are summed in a fixed tree at the end: every output element
 * has one order of operations whatever m and the thread count.
 *
 * With AVX512_VNNI (vpdpbusd: unsigned bytes times signed bytes), the weights' sign bit is flipped
 * on load (q_w + 128, unsigned) and each lane starts at -128 · (the sum of its four x bytes),
 * staged with x, which cancels the offset exactly. Elsewhere (AVX2) bytes are widened to int16 and
 * multiplied pairwise with vpmaddwd: |q| <= 127, so a pair's sum never saturates.
 */
#include "backend/cpu/kernels_cpu.h"
#include "backend/cpu/widen_cpu.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TVNNI         __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

#if LORA_I8_GROUP % 64 != 0
#error "the int8 kernels take groups of a multiple of 64 values"
#endif
/* The next tile's rows at the same column (matmul_cpu.c says why; int8 rows are short enough). */
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define G       LORA_I8_GROUP
#define CPG     (G / 64) /* 64-byte chunks per group (VNNI) */
#define CPG16   (G / 16) /* 16-value chunks per group (AVX2) */
#define MR_VNNI 4
#define NR_VNNI 4
#define MR_AVX2 2
#define NR_AVX2 4

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

static float scale_at(const char *scales, size_t i)
{
    float s;

    memcpy(&s, scales + i * sizeof(float), sizeof(s));
    return s;
}

/* ---- AVX512_VNNI ---- */

/* A staged row (64-byte aligned, this many bytes): kp = k rounded up to 64 bytes of q (zeros
 * after k), then per group the 16 int32 lanes' starting values (-128 · their x bytes), then the
 * groups' scales. */
static size_t vnni_row_bytes(int k)
{
    size_t ng = (size_t)lora_i8_groups(k);
    return round_up((size_t)k, 64) + ng * 64 + round_up(ng * sizeof(float), 64);
}

TVNNI static void vnni_stage_row(const float *x, int k, char *row)
{
    size_t kp = round_up((size_t)k, 64);
    int ng = (int)lora_i8_groups(k);
    signed char *q = (signed char *)row;
    __m512i *start = (__m512i *)(row + kp);
    float *scales = (float *)(row + kp + (size_t)ng * 64);

    memset(q + k, 0, kp - (size_t)k);
    for (int g = 0; g < ng; g++) {
        int c0 = g * G, c1 = c0 + G < k ? c0 + G : k;
        __m512 mx = _mm512_setzero_ps();
        for (int c = c0; c < c1; c += 16) {
            __mmask16 mask = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, x + c)));
        }
        /* The float operations of lora_quantize_i8 and lora_ref_quantize_row. */
        float scale = _mm512_reduce_max_ps(mx) / 127.0f;
        __m512 sv = _mm512_set1_ps(scale > 0 ? scale : 1.0f); /* a zero group stays zero */
        for (int c = c0; c < c1; c += 16) {
            __mmask16 mask = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
            __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(mask, x + c), sv));
            v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)),
                                 _mm512_set1_epi32(-127));
            _mm512_mask_cvtepi32_storeu_epi8(q + c, mask, v);
        }
        scales[g] = scale;
        __m512i s = _mm512_setzero_si512();
        for (int ch = g * CPG; ch < g * CPG + CPG && (size_t)ch * 64 < kp; ch++)
            s = _mm512_dpbusd_epi32(s, _mm512_set1_epi8((char)0x80),
                                    _mm512_load_si512(q + (size_t)ch * 64));
        _mm512_store_si512(start + g, _mm512_sub_epi32(_mm512_setzero_si512(), s));
    }
}

/* One group of an mr x nr tile: nch chunks from chunk ch0, the last one masked when tail. */
TVNNI ALWAYS_INLINE void vnni_group(__m512 f[MR_VNNI][NR_VNNI], const char *xs, size_t x_stride,
                                    size_t kp, int ng, const signed char *w, int k,
                                    const char *w_scales, int g, int nch, bool tail,
                                    __mmask64 tail_mask, int mr, int nr)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i wv[NR_VNNI][CPG];
    __m512 bw[NR_VNNI];
    int ch0 = g * CPG;

#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) {
#pragma GCC unroll 4
        for (int c = 0; c < CPG; c++) {
            const signed char *p = w + (size_t)j * k + (size_t)(ch0 + c) * 64;
            __m512i v = c >= nch               ? _mm512_setzero_si512()
                        : tail && c == nch - 1 ? _mm512_maskz_loadu_epi8(tail_mask, p)
                                               : _mm512_loadu_si512(p);
            PREFETCH(p + (size_t)nr * k);
            wv[j][c] = _mm512_xor_si512(v, flip);
        }
        bw[j] = _mm512_set1_ps(scale_at(w_scales, (size_t)j * ng + g));
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const char *xr = xs + (size_t)i * x_stride;
        __m512i start = _mm512_load_si512(xr + kp + (size_t)g * 64);
        __m512 bx = _mm512_set1_ps(scale_at(xr + kp + (size_t)ng * 64, (size_t)g));
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            __m512i a = start;
#pragma GCC unroll 4
            for (int c = 0; c < CPG; c++) {
                if (c >= nch)
                    break;
                a = _mm512_dpbusd_epi32(a, wv[j][c],
                                        _mm512_load_si512(xr + (size_t)(ch0 + c) * 64));
            }
            f[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), bw[j]), bx, f[i][j]);
        }
    }
}

TVNNI ALWAYS_INLINE void vnni_tile(float *y, int ldy, const char *xs, size_t x_stride,
                                   const signed char *w, int k, const char *w_scales, int mr,
                                   int nr, float alpha, bool acc)
{
    __m512 f[MR_VNNI][NR_VNNI];
    size_t kp = round_up((size_t)k, 64);
    int ng = (int)lora_i8_groups(k), n_full = k / G;
    __mmask64 tail_mask = (__mmask64)((1ull << (k % 64)) - 1);

#pragma GCC unroll 4
    for (int i = 0; i < MR_VNNI; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR_VNNI; j++)
            f[i][j] = _mm512_setzero_ps();
    for (int g = 0; g < n_full; g++)
        vnni_group(f, xs, x_stride, kp, ng, w, k, w_scales, g, CPG, false, tail_mask, mr, nr);
    if (n_full < ng)
        vnni_group(f, xs, x_stride, kp, ng, w, k, w_scales, n_full,
                   (int)((k - n_full * G + 63) / 64), k % 64 != 0, tail_mask, mr, nr);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * _mm512_reduce_add_ps(f[i][j]);
            y[(size_t)i * ldy + j] = acc ? y[(size_t)i * ldy + j] + v : v;
        }
    }
}

#define VNNI_ROWS(mr)                                                                              \
    do {                                                                                           \
        int j = n0;                                                                                \
        for (; j + NR_VNNI <= n1; j += NR_VNNI)                                                    \
            vnni_tile(yi + j, ldy, xi, stride, w + (size_t)j * k, k,                               \
                      w_scales + (size_t)j * ng * sizeof(float), mr, NR_VNNI, alpha, acc);         \
        for (; j < n1; j++)                                                                        \
            vnni_tile(yi + j, ldy, xi, stride, w + (size_t)j * k, k,                               \
                      w_scales + (size_t)j * ng * sizeof(float), mr, 1, alpha, acc);               \
    } while (0)

TVNNI static void vnni_panel(float *y, int ldy, const char *xs, const signed char *w,
                             const char *w_scales, int m, int k, int n0, int n1, float alpha,
                             bool acc)
{
    size_t stride = vnni_row_bytes(k);
    int ng = (int)lora_i8_groups(k);

    for (int i = 0; i < m;) {
        int mr = m - i >= MR_VNNI ? MR_VNNI : m - i;
        float *yi = y + (size_t)i * ldy;
        const char *xi = xs + (size_t)i * stride;
        switch (mr) {
        case 4:
            VNNI_ROWS(4);
            break;
        case 3:
            VNNI_ROWS(3);
            break;
        case 2:
            VNNI_ROWS(2);
            break;
        default:
            VNNI_ROWS(1);
            break;
        }
        i += mr;
    }
}

/* ---- AVX2 ---- */

/* A staged row: kp = k rounded up to 16 int16 values of q (zeros after k), then the groups'
 * scales; 64-byte aligned. */
static size_t avx2_row_bytes(int k)
{
    return round_up(
        round_up((size_t)k, 16) * sizeof(int16_t) + (size_t)lora_i8_groups(k) * sizeof(float), 64);
}

static void avx2_stage_row(const float *x, int k, char *row)
{
    size_t kp = round_up((size_t)k, 16);
    int16_t *q = (int16_t *)row;
    float *scales = (float *)(row + kp * sizeof(int16_t));

    for (size_t c = (size_t)k; c < kp; c++)
        q[c] = 0;
    for (int g = 0; g * G < k; g++) {
        int c0 = g * G, c1 = c0 + G < k ? c0 + G : k, c;
        __m256 mx = _mm256_setzero_ps();
        const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (c = c0; c + 8 <= c1; c += 8)
            mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + c), abs_mask));
        float lanes[8], max = 0;
        _mm256_storeu_ps(lanes, mx);
        for (int l = 0; l < 8; l++)
            max = lanes[l] > max ? lanes[l] : max;
        for (int t = c; t < c1; t++) {
            float a = x[t] < 0 ? -x[t] : x[t];
            max = a > max ? a : max;
        }
        /* The float operations of lora_quantize_i8 and lora_ref_quantize_row. */
        float scale = max / 127.0f, div = scale > 0 ? scale : 1.0f;
        __m256 sv = _mm256_set1_ps(div);
        for (c = c0; c + 8 <= c1; c += 8) {
            __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + c), sv));
            v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)),
                                 _mm256_set1_epi32(-127));
            _mm_storeu_si128((__m128i *)(q + c), _mm_packs_epi32(_mm256_castsi256_si128(v),
                                                                 _mm256_extracti128_si256(v, 1)));
        }
        for (; c < c1; c++) {
            int v = _mm_cvtss_si32(_mm_set_ss(x[c] / div)); /* to nearest even, as above */
            q[c] = (int16_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        scales[g] = scale;
    }
}

/* 16 weights from p widened to int16; the last chunk of a row through a zeroed copy. */
ALWAYS_INLINE __m256i avx2_w16(const signed char *p, int rem)
{
    if (rem >= 16)
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    signed char buf[16] = {0};
    memcpy(buf, p, (size_t)rem);
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)buf));
}

/* One group of an mr x nr tile: nch chunks of 16 from value c0. */
ALWAYS_INLINE void avx2_group(__m256 f[MR_AVX2][NR_AVX2], const char *xs, size_t x_stride,
                              size_t kp, int ng, const signed char *w, int k, const char *w_scales,
                              int g, int nch, int mr, int nr)
{
    int c0 = g * G;

#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) {
        __m256i wv[CPG16];
        const signed char *wr = w + (size_t)j * k;
#pragma GCC unroll 8
        for (int c = 0; c < CPG16; c++)
            wv[c] =
                c < nch ? avx2_w16(wr + c0 + 16 * c, k - (c0 + 16 * c)) : _mm256_setzero_si256();
        __m256 bw = _mm256_set1_ps(scale_at(w_scales, (size_t)j * ng + g));
#pragma GCC unroll 2
        for (int i = 0; i < mr; i++) {
            const char *xr = xs + (size_t)i * x_stride;
            const int16_t *q = (const int16_t *)xr + c0;
            __m256i a = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)q), wv[0]);
#pragma GCC unroll 8
            for (int c = 1; c < CPG16; c++)
                if (c < nch)
                    a = _mm256_add_epi32(
                        a, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(q + 16 * c)),
                                             wv[c]));
            __m256 bx = _mm256_set1_ps(scale_at(xr + kp * sizeof(int16_t), (size_t)g));
            f[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), bw), bx, f[i][j]);
        }
    }
}

ALWAYS_INLINE void avx2_tile(float *y, int ldy, const char *xs, size_t x_stride,
                             const signed char *w, int k, const char *w_scales, int mr, int nr,
                             float alpha, bool acc)
{
    __m256 f[MR_AVX2][NR_AVX2];
    size_t kp = round_up((size_t)k, 16);
    int ng = (int)lora_i8_groups(k), n_full = k / G;

#pragma GCC unroll 2
    for (int i = 0; i < MR_AVX2; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR_AVX2; j++)
            f[i][j] = _mm256_setzero_ps();
    for (int g = 0; g < n_full; g++)
        avx2_group(f, xs, x_stride, kp, ng, w, k, w_scales, g, CPG16, mr, nr);
    if (n_full < ng)
        avx2_group(f, xs, x_stride, kp, ng, w, k, w_scales, n_full, (k - n_full * G + 15) / 16, mr,
                   nr);
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            float v = alpha * lora_cpu_hsum8(f[i][j]);
            y[(size_t)i * ldy + j] = acc ? y[(size_t)i * ldy + j] + v : v;
        }
    }
}

#define AVX2_ROWS(mr)                                                                              \
    do {                                                                                           \
        int j = n0;                                                                                \
        for (; j + NR_AVX2 <= n1; j += NR_AVX2)                                                    \
            avx2_tile(yi + j, ldy, xi, stride, w + (size_t)j * k, k,                               \
                      w_scales + (size_t)j * ng * sizeof(float), mr, NR_AVX2, alpha, acc);         \
        for (; j < n1; j++)                                                                        \
            avx2_tile(yi + j, ldy, xi, stride, w + (size_t)j * k, k,                               \
                      w_scales + (size_t)j * ng * sizeof(float), mr, 1, alpha, acc);               \
    } while (0)

static void avx2_panel(float *y, int ldy, const char *xs, const signed char *w,
                       const char *w_scales, int m, int k, int n0, int n1, float alpha, bool acc)
{
    size_t stride = avx2_row_bytes(k);
    int ng = (int)lora_i8_groups(k);

    for (int i = 0; i < m;) {
        int mr = m - i >= MR_AVX2 ? MR_AVX2 : 1;
        float *yi = y + (size_t)i * ldy;
        const char *xi = xs + (size_t)i * stride;
        if (mr == MR_AVX2)
            AVX2_ROWS(MR_AVX2);
        else
            AVX2_ROWS(1);
        i += mr;
    }
}

/* ---- the path ---- */

size_t lora_cpu_i8_row_bytes(const struct lora_cpu_isa *isa, int k)
{
    return isa->vnni ? vnni_row_bytes(k) : avx2_row_bytes(k);
}

void lora_cpu_i8_stage_row(const struct lora_cpu_isa *isa, const float *x, int k, char *row)
{
    if (isa->vnni)
        vnni_stage_row(x, k, row);
    else
        avx2_stage_row(x, k, row);
}

void lora_cpu_i8_panel(const struct lora_cpu_isa *isa, float *y, int ldy, const char *xs,
                       const signed char *w, const char *w_scales, int m, int k, int n0, int n1,
                       float alpha, bool acc)
{
    if (isa->vnni)
        vnni_panel(y, ldy, xs, w, w_scales, m, k, n0, n1, alpha, acc);
    else
        avx2_panel(y, ldy, xs, w, w_scales, m, k, n0, n1, alpha, acc);
}
