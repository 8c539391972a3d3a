/* bench_memory: the machine's memory bandwidth as the benchmarks of tests/bench measure it, one
 * definition for all of them (bench_model, bench_kernels): a streaming copy and a streaming read
 * over buffers far larger than the caches, threaded like the kernels (OpenMP), best of five.
 * Static functions: include it once per program. */
#ifndef LORA_BENCH_MEMORY_H
#define LORA_BENCH_MEMORY_H

#include <immintrin.h>
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

#endif
