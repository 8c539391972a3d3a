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

#endif
