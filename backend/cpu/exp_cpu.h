/* exp_cpu: e^x on eight float lanes (AVX2 + FMA) or sixteen (AVX-512), for the kernels' SiLU and
 * softmax.
 *
 * libm's expf is scalar: called once per value it was 12% of a 256-token prefill's time (SiLU
 * over every MLP activation) and the softmax of attention added more. This is the usual range
 * reduction, x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two so that n ln2 is exact enough),
 * e^r by its Taylor polynomial to degree 7 (remainder below 6e-9 relative), and 2^n put into the
 * exponent bits. Relative error: within 2^-23 of double exp over [-87.3, 88.7] (checked on two
 * million inputs by tests/unit/test_exp_cpu.c); below -87.3 the result is 0,
 * above 88.7 it saturates at e^88.7; NaN stays NaN. The same lanes give the same bits wherever
 * a value sits in a vector, so callers that pass their tails through a padded vector keep every
 * element's result independent of its neighbours.
 */
#ifndef LORA_BACKEND_CPU_EXP_CPU_H
#define LORA_BACKEND_CPU_EXP_CPU_H

#include <immintrin.h>

static inline __attribute__((always_inline)) __m256 lora_cpu_exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.7f);
    /* max/min return their second operand when either is NaN: NaN passes through. */
    __m256 c = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), c);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n for n in [-126, 128): the biased exponent; n = 128 splits into two factors. */
    __m256i e = _mm256_cvtps_epi32(n);
    __m256i half = _mm256_srai_epi32(e, 1);
    __m256 s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half), _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    /* Below the range: 0 (NaN compares unordered and is kept). */
    return _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_NLT_UQ));
}

/* lora_cpu_exp8 on sixteen lanes, operation for operation: each lane's bits are exp8's. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) __m512
lora_cpu_exp16(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.3f), hi = _mm512_set1_ps(88.7f);
    __m512 c = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), c);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_cvtps_epi32(n);
    __m512i half = _mm512_srai_epi32(e, 1);
    __m512 s1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
    __m512 s2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(e, half), _mm512_set1_epi32(127)), 23));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y);
}

#endif
