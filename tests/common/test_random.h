/* test_random: the allocation and the fixed-seed random numbers the kernel and backend tests
 * share. Define TEST_RANDOM_SEED before including it: each test keeps its own sequence. */
#ifndef LORA_TEST_RANDOM_H
#define LORA_TEST_RANDOM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);

    if (!p) {
        printf("Bail out! unable to allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static inline float *new_floats(size_t n)
{
    return xmalloc(n * sizeof(float));
}

static inline double *new_doubles(size_t n)
{
    return xmalloc(n * sizeof(double));
}

static uint64_t rng_state = TEST_RANDOM_SEED;

/* splitmix64: fixed seed, so every run tests the same numbers. */
static inline uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), a multiple of 2^-23: the sum of two is exact in double. */
static inline float rng_uniform(void)
{
    return (float)((int32_t)(rng_next() >> 40) - (1 << 23)) / (float)(1 << 23);
}

#endif
