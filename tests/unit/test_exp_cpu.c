/* Unit tests for backend/cpu/exp_cpu.h: e^x on eight lanes against double-precision exp, and
 * the sixteen-lane form against the eight-lane one, bit for bit. The 16-lane attention relies on
 * the latter: a softmax row computed on AVX-512 and on AVX2 must agree wherever its scores do.
 * Inputs: a dense sweep of [-90, 90], the edges of the range, the special values, and random bit
 * patterns (every exponent, NaNs with payloads, subnormals).
 */
#include "check.h"
#include "backend/cpu/exp_cpu.h"

#include <float.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define TEST_RANDOM_SEED 0x9e3779b97f4a7c15ULL
#include "tests/common/test_random.h"

#define N_SWEEP  (1 << 20)
#define N_RANDOM (1 << 20)
/* Relative error allowed against double exp where the result is normal, in units of 2^-23
 * (float's unit in the last place at 1): what exp_cpu.h states. */
#define MAX_ULPS 1

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The inputs: n values, a multiple of 16. */
static float *inputs(size_t *n)
{
    static const float special[] = {
        0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
        FLT_TRUE_MIN, -FLT_TRUE_MIN, -87.3f, 88.7f, 1.0f, -1.0f, 0.5f, -0.5f, 0.693147181f,
        -0.693147181f, 88.0f, -87.0f, 100.0f, -100.0f, 1e-30f, -1e-30f,
    };
    size_t n_special = sizeof special / sizeof special[0], m = 0;
    size_t cap = N_SWEEP + N_RANDOM + n_special + 2 * 64 + 16;
    float *x = malloc(cap * sizeof(float));

    for (size_t i = 0; i < N_SWEEP; i++)
        x[m++] = -90.0f + 180.0f * (float)i / N_SWEEP;
    for (size_t i = 0; i < N_RANDOM; i++)
        x[m++] = from_bits((uint32_t)rng_next());
    for (size_t i = 0; i < n_special; i++)
        x[m++] = special[i];
    for (int d = -32; d < 32; d++) { /* the neighbours of each end of the range */
        x[m++] = from_bits(to_bits(-87.3f) + (uint32_t)d);
        x[m++] = from_bits(to_bits(88.7f) + (uint32_t)d);
    }
    while (m % 16)
        x[m++] = 0.0f;
    *n = m;
    return x;
}

static void exp8_all(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(y + i, lora_cpu_exp8(_mm256_loadu_ps(x + i)));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void exp16_all(const float *x,
                                                                             float *y, size_t n)
{
    for (size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(y + i, lora_cpu_exp16(_mm512_loadu_ps(x + i)));
}

/* Eight lanes against double exp: normal results within MAX_ULPS, below -87.3 exactly 0, above
 * the range the saturated value, NaN kept. */
static void test_exp8_accuracy(void)
{
    size_t n, bad = 0;
    float *x = inputs(&n), *y = malloc(n * sizeof(float));
    float top;

    exp8_all(x, y, n);
    {
        float in[8] = {88.7f, 88.7f, 88.7f, 88.7f, 88.7f, 88.7f, 88.7f, 88.7f}, out[8];
        exp8_all(in, out, 8);
        top = out[0];
    }
    CHECK(isfinite(top) && top > 3e38f);
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        bool ok;
        if (isnan(xi))
            ok = isnan(y[i]);
        else if (xi < -87.3f)
            ok = y[i] == 0.0f;
        else if (xi > 88.7f)
            ok = y[i] == top;
        else {
            double want = exp((double)xi);
            ok = fabs((double)y[i] - want) <= MAX_ULPS * 0x1p-23 * want;
        }
        if (!ok && bad++ < 5)
            printf("# exp8(%.9g) = %.9g, exp = %.9g\n", xi, y[i], exp((double)xi));
    }
    CHECK(bad == 0);
    free(x);
    free(y);
}

/* Sixteen lanes against eight: the same bits in every lane, whichever half a value sits in. */
static void test_exp16_matches_exp8(void)
{
    size_t n, bad = 0;
    float *x = inputs(&n), *y8 = malloc(n * sizeof(float)), *y16 = malloc(n * sizeof(float));

    exp8_all(x, y8, n);
    exp16_all(x, y16, n);
    for (size_t i = 0; i < n; i++) {
        if (to_bits(y8[i]) != to_bits(y16[i]) && bad++ < 5)
            printf("# x = %.9g (bits %08x): exp8 %08x, exp16 %08x\n", x[i], to_bits(x[i]),
                   to_bits(y8[i]), to_bits(y16[i]));
    }
    CHECK(bad == 0);
    /* The same values shifted by eight lanes: a value's half of the vector does not matter. */
    exp16_all(x + 8, y16, n - 16);
    for (size_t i = 0; i < n - 16; i++)
        if (to_bits(y8[i + 8]) != to_bits(y16[i]))
            bad++;
    CHECK(bad == 0);
    free(x);
    free(y8);
    free(y16);
}

int main(void)
{
    RUN(test_exp8_accuracy);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        RUN(test_exp16_matches_exp8);
    else
        printf("ok %d - test_exp16_matches_exp8 # SKIP this CPU has no AVX-512\n", ++check_n_run);
    return check_done();
}
