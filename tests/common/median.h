/* median: the middle of n timings, as every benchmark of tests/bench reports them (the mean of
 * the two middle ones where n is even, so that 2 rounds do not report their larger). Sorts v.
 * Static functions: include it once per program. */
#ifndef LORA_TESTS_MEDIAN_H
#define LORA_TESTS_MEDIAN_H

#include <stdlib.h>

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
