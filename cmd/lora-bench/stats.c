/* lora-bench: summary statistics with numpy's definitions (what `vllm bench serve` reports);
 * see bench.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

double stats_mean(const double *v, size_t n)
{
    double s = 0;

    if (!n)
        return 0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    return s / (double)n;
}

double stats_std(const double *v, size_t n)
{
    double m = stats_mean(v, n), s = 0;

    if (!n)
        return 0;
    for (size_t i = 0; i < n; i++)
        s += (v[i] - m) * (v[i] - m);
    return sqrt(s / (double)n);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double stats_percentile(const double *v, size_t n, double p)
{
    if (!n)
        return 0;
    double *s = malloc(n * sizeof(double));
    if (!s)
        return NAN;
    memcpy(s, v, n * sizeof(double));
    qsort(s, n, sizeof(double), cmp_double);
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank), hi = (size_t)ceil(rank);
    if (hi >= n)
        hi = n - 1;
    double r = s[lo] + (s[hi] - s[lo]) * (rank - (double)lo);
    free(s);
    return r;
}
