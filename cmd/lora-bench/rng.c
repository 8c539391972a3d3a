/* lora-bench: the program's one random generator (splitmix64) and the draws built on it; see
 * bench.h. */
#include <math.h>
#include <stdint.h>

#include "bench.h"

uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_uniform(uint64_t *state)
{
    return (double)(rng_next(state) >> 11) * 0x1.0p-53;
}

long rng_between(uint64_t *state, long lo, long hi)
{
    if (hi <= lo)
        return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    uint64_t limit = UINT64_MAX - UINT64_MAX % span; /* no modulo bias */
    uint64_t r;
    do {
        r = rng_next(state);
    } while (r >= limit);
    return lo + (long)(r % span);
}

static double rng_normal(uint64_t *state)
{
    double u1 = rng_uniform(state), u2 = rng_uniform(state);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Marsaglia and Tsang's method; shapes below 1 through gamma(shape + 1) * U^(1/shape). */
double rng_gamma(uint64_t *state, double shape, double scale)
{
    if (shape < 1.0) {
        double u = rng_uniform(state);
        return rng_gamma(state, shape + 1.0, scale) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(state), v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = rng_uniform(state);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v * scale;
    }
}
