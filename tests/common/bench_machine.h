/* bench_machine: the machine's bounds as the benchmarks of tests/bench measure them, one
 * definition for all of them (bench_model, bench_kernels): a streaming copy and a streaming read
 * over buffers far larger than the caches, threaded like the kernels (OpenMP), best of five; the
 * cores' float32 FMA peak; and the peaks of the bf16 and int8 dot-product instructions. Static
 * functions: include it once per program. */
#ifndef LORA_BENCH_MACHINE_H
#define LORA_BENCH_MACHINE_H

#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/clock.h"

/* A buffer in 2 MiB pages, as the CPU backend allocates its weights (docs/design.md, "Mapped
 * pages"): measured over 4 KiB pages, the bound would be the page walks', not the memory's. */
#define BENCH_HUGE_PAGE ((size_t)2 << 20)

static inline void *bench_alloc(size_t bytes)
{
    size_t len = (bytes + BENCH_HUGE_PAGE - 1) / BENCH_HUGE_PAGE * BENCH_HUGE_PAGE;
    void *p = aligned_alloc(BENCH_HUGE_PAGE, len);

    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        exit(111);
    }
    (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

/* STREAM-style copy over buffers far larger than the caches: bytes read plus bytes written
 * per second, best of five. */
static inline double copy_bandwidth(size_t bytes)
{
    size_t n = bytes / sizeof(float);
    float *a = bench_alloc(bytes), *b = bench_alloc(bytes);
    double best = 0;

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

/* Streaming read: bytes read per second, best of five rounds of two patterns. Decoding mostly
 * reads weights, so this is the bound that matters. Each thread reads its part as one stream,
 * then as four streams with a software prefetch 4 KiB ahead, as the matmul tiles read four rows:
 * on the development machine the second delivered up to 1.7x the first, so a bound taken from a
 * single stream alone would be one the kernels beat. Eight independent vector sums keep the
 * loads, not the adds, the limit. */
#define BENCH_READ_STREAMS 4

/* A buffer of bytes for read_bandwidth_of, filled (touched once, so no read faults its pages). */
static inline float *read_probe_alloc(size_t bytes)
{
    size_t n = bytes / sizeof(float);
    float *a = bench_alloc(bytes);

#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i & 7);
    return a;
}

/* Bytes read per second from the bytes at a (read_probe_alloc's), best of reads rounds. */
static inline double read_bandwidth_of(const float *a, size_t bytes, int reads)
{
    size_t n = bytes / sizeof(float) / 1024 * 1024;
    double best = 0;
    float total = 0;

    for (int r = 0; r < reads; r++) {
        int streams = r % 2 ? BENCH_READ_STREAMS : 1;
        double t = lora_clock_mono();
        float sum = 0;
#pragma omp parallel reduction(+ : sum)
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t len = n / (size_t)nt / (size_t)streams / 64 * 64;
            const float *base = a + (size_t)id * len * (size_t)streams;
            __m256 acc[8];
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_setzero_ps();
            for (size_t i = 0; i < len; i += 64)
                for (int s = 0; s < streams; s++) {
                    const float *p = base + (size_t)s * len + i;
                    for (int l = 0; streams > 1 && l < 4; l++) /* each line of the 256 bytes */
                        _mm_prefetch((const char *)(p + 1024 + 16 * l), _MM_HINT_T0);
                    for (int j = 0; j < 8; j++)
                        acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(p + 8 * j));
                }
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
    return best;
}

static inline double read_bandwidth(size_t bytes)
{
    float *a = read_probe_alloc(bytes);
    double best = read_bandwidth_of(a, bytes, 10);

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

/* The peak of the fast bf16 matmul's instruction, AVX512_BF16's vdpbf16ps (32 products and their
 * sums into 16 float32 lanes: 64 FLOP), in GFLOP/s over every thread. */
__attribute__((target("avx512f,avx512bf16"))) static inline double dot_bf16_peak(long iters)
{
    double t = lora_clock_mono();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        __m512 a[12];
        __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3380);
        for (int j = 0; j < 12; j++)
            a[j] = _mm512_set1_ps((float)j);
        for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++)
                a[j] = _mm512_dpbf16_ps(a[j], b, c);
        for (int j = 0; j < 12; j++)
            sink += _mm512_reduce_add_ps(a[j]);
    }
    volatile float keep = sink;
    (void)keep;
    return 64.0 * 12 * (double)iters * omp_get_max_threads() / (lora_clock_mono() - t) / 1e9;
}

/* The peak of the int8 matmul's instruction, AVX512_VNNI's vpdpbusd (64 byte products and their
 * sums into 16 int32 lanes: 128 operations), in G operations/s over every thread. */
__attribute__((target("avx512f,avx512vnni"))) static inline double dot_i8_peak(long iters)
{
    double t = lora_clock_mono();
    int sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        __m512i a[12], b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(1);
        for (int j = 0; j < 12; j++)
            a[j] = _mm512_set1_epi32(j);
        for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++)
                a[j] = _mm512_dpbusd_epi32(a[j], b, c);
        for (int j = 0; j < 12; j++)
            sink += _mm512_reduce_add_epi32(a[j]);
    }
    volatile int keep = sink;
    (void)keep;
    return 128.0 * 12 * (double)iters * omp_get_max_threads() / (lora_clock_mono() - t) / 1e9;
}

/* The instruction a precision's matmul runs on, read from the backend's description: fast bf16
 * on the bf16 dot where it names one (else x rounded on the float32 FMA tiles), int8 on VNNI
 * where it names it, the rest on the float32 FMA; NONE for what no probe here measures (AMX
 * tiles, AVX2's int8 dot). */
enum bench_peak { BENCH_PEAK_FMA, BENCH_PEAK_BF16_DOT, BENCH_PEAK_VNNI, BENCH_PEAK_NONE };

static inline enum bench_peak bench_peak_of(const char *description, bool fast, bool int8)
{
    if (int8)
        return strstr(description, "VNNI int8") ? BENCH_PEAK_VNNI : BENCH_PEAK_NONE;
    if (fast)
        return strstr(description, "AMX")        ? BENCH_PEAK_NONE
               : strstr(description, "BF16 dot") ? BENCH_PEAK_BF16_DOT
                                                 : BENCH_PEAK_FMA;
    return BENCH_PEAK_FMA;
}

#endif
