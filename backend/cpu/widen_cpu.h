/* widen_cpu: the small helpers the CPU kernels share (kernels_cpu.c, attention_cpu.c,
 * matmul_cpu.c, matmul_i8_cpu.c): F32, BF16 and F16 elements widened exactly to float, 8 or 16
 * at a time, and the one fixed order in which 8 lanes are summed. Include only from files built
 * with the backend's AVX2 flags (the 16-lane helper carries its own target). */
#ifndef LORA_WIDEN_CPU_H
#define LORA_WIDEN_CPU_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"

/* Element i of a (F32, BF16 or F16) as float. */
static inline __attribute__((always_inline)) float lora_cpu_widen(const void *a, size_t i,
                                                                  enum lora_dtype dt)
{
    if (dt == LORA_DTYPE_F32)
        return ((const float *)a)[i];
    uint16_t h = ((const uint16_t *)a)[i];
    if (dt == LORA_DTYPE_F16)
        return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* 8 elements from element i of a, widened to float. */
static inline __attribute__((always_inline)) __m256 lora_cpu_widen8(const void *a, size_t i,
                                                                    enum lora_dtype dt)
{
    if (dt == LORA_DTYPE_F32)
        return _mm256_loadu_ps((const float *)a + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)a + i));
    if (dt == LORA_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 16 elements from element i of a, widened to float (AVX-512 callers only). */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) __m512
lora_cpu_widen16(const void *a, size_t i, enum lora_dtype dt)
{
    if (dt == LORA_DTYPE_F32)
        return _mm512_loadu_ps((const float *)a + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)a + i));
    if (dt == LORA_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The sum of v's 8 lanes: halves, then pairs, then the last two. */
static inline __attribute__((always_inline)) float lora_cpu_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The sums of four vectors' lanes, one per lane of the result: the pairs of lanes
 * _mm512_reduce_add_ps adds, in its order (l + 8, then l + 4, l + 2, l + 1), for the four at
 * once, so a row's bits are the same in a tile of four rows of w and in a tile of one. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) __m128
lora_cpu_reduce_add4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    /* Halves: lanes 0-7 of s01 are a0's l + (l + 8), lanes 8-15 a1's. */
    __m512 s01 =
        _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee));
    __m512 s23 =
        _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
    /* Quarters: 128-bit lane c of u holds vector c's l + (l + 4). */
    __m512 u =
        _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4e)); /* l + (l + 2) */
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0xb1)); /* l + (l + 1) */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

#endif
