/* bench_machine: the machine's bounds as the benchmarks of tests/bench measure them, one
 * definition for all of them (bench_model, bench_kernels): a streaming copy and a streaming read
 * over buffers far larger than the caches, threaded like the kernels (OpenMP), best of five; and
 * the cores' float32 FMA peak. Static functions: include it once per program. */
#ifndef LORA_BENCH_MACHINE_H
#define LORA_BENCH_MACHINE_H

#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* STREAM-style copy over buffers far larger than the caches: bytes read plus bytes written
 * per second, best of five. */
static inline double copy_bandwidth(size_t bytes)
{
    size_t n = bytes / sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    double best = 0;

    if (!a || !b) {
        fprintf(stderr, "bench: out of memory\n");
        exit(111);
    }
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = 0;
    }
    for (int r = 0; r < 5; r++) {
        double t = lora_clock_mono();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            b[i] = a[i];
        double bw = 2.0 * bytes / (lora_clock_mono() - t);
        best = bw > best ? bw : best;
    }
    volatile float sink = b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return best;
}

/* Streaming read: bytes read per second, best of five. Decoding mostly reads weights, so this
 * is the bound that matters; eight independent vector sums keep the loads, not the adds, the
 * limit. */
static inline double read_bandwidth(size_t bytes)
{
    size_t n = bytes / sizeof(float) / 64 * 64;
    float *a = malloc(bytes);
    double best = 0;
    float total = 0;

    if (!a) {
        fprintf(stderr, "bench: out of memory\n");
        exit(111);
    }
#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i & 7);
    for (int r = 0; r < 5; r++) {
        double t = lora_clock_mono();
        float sum = 0;
#pragma omp parallel reduction(+ : sum)
        {
            __m256 acc[8];
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_setzero_ps();
#pragma omp for schedule(static)
            for (size_t i = 0; i < n; i += 64)
                for (int j = 0; j < 8; j++)
                    acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(a + i + 8 * j));
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 8; l++)
                    sum += acc[j][l];
        }
        double bw = (double)n * sizeof(float) / (lora_clock_mono() - t);
        best = bw > best ? bw : best;
        total += sum;
    }
    volatile float sink = total;
    (void)sink;
    free(a);
    return best;
}

/* The float32 FMA peak of all threads, with the backend's vector width: independent chains of
 * fused multiply-adds on registers, GFLOP/s (2 per lane per FMA). */
__attribute__((target("avx512f"))) static inline double fma_peak_512(long iters)
{
    double flops = 0, t = lora_clock_mono();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        __m512 a[12], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
        for (int j = 0; j < 12; j++)
            a[j] = _mm512_set1_ps((float)j);
        for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++)
                a[j] = _mm512_fmadd_ps(a[j], b, c);
        for (int j = 0; j < 12; j++)
            sink += _mm512_reduce_add_ps(a[j]);
    }
    flops = 2.0 * 16 * 12 * (double)iters * omp_get_max_threads();
    volatile float keep = sink;
    (void)keep;
    return flops / (lora_clock_mono() - t) / 1e9;
}

static inline double fma_peak_256(long iters)
{
    double flops = 0, t = lora_clock_mono();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        __m256 a[12], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
        for (int j = 0; j < 12; j++)
            a[j] = _mm256_set1_ps((float)j);
        for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++)
                a[j] = _mm256_fmadd_ps(a[j], b, c);
        float lanes[8];
        for (int j = 0; j < 12; j++) {
            _mm256_storeu_ps(lanes, a[j]);
            sink += lanes[0];
        }
    }
    flops = 2.0 * 8 * 12 * (double)iters * omp_get_max_threads();
    volatile float keep = sink;
    (void)keep;
    return flops / (lora_clock_mono() - t) / 1e9;
}

#endif
