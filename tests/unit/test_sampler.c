/* Unit tests for lib/runtime/sampler: greedy, log-probabilities, top-k / top-p filtering, empirical
 * distributions and a cross-check against a brute-force reference (full sort, explicit softmax).
 */
#include "check.h"
#include "runtime/sampler.h"

#include <stdint.h>
#include <stdlib.h>

#define BIG_VOCAB 151936

/* ---- brute-force reference ---- */

static const float *ref_logits; /* comparator context for qsort */

static float ref_clean(float x)
{
    return isnan(x) ? -INFINITY : x;
}

/* Rank order: higher logit first, ties to the lower id. */
static int ref_cmp(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    float va = ref_clean(ref_logits[a]), vb = ref_clean(ref_logits[b]);

    if (va != vb)
        return va > vb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static void ref_sort(int *ids, const float *logits, int n)
{
    for (int i = 0; i < n; i++)
        ids[i] = i;
    ref_logits = logits;
    qsort(ids, (size_t)n, sizeof(*ids), ref_cmp);
}

/* Fills kept[0..m) (rank order) and prob[0..m) (normalised over the kept set) following the
 * documented pipeline: temperature, top-k, renormalise, top-p, renormalise. Returns m. */
static int ref_kept(const float *logits, int n, const struct lora_sampling_params *p, int *kept,
                    double *prob)
{
    int *ids = malloc((size_t)n * sizeof(*ids));
    double *e = malloc((size_t)n * sizeof(*e));
    double z = 0.0, cum = 0.0;
    int m = n;

    ref_sort(ids, logits, n);
    if (p->temperature == 0.0f) {
        kept[0] = ids[0];
        prob[0] = 1.0;
        free(ids);
        free(e);
        return 1;
    }
    /* Plain softmax of l / T over the whole vocabulary. */
    for (int j = 0; j < n; j++)
        z += exp((double)ref_clean(logits[ids[j]]) / p->temperature);
    for (int j = 0; j < n; j++)
        e[j] = exp((double)ref_clean(logits[ids[j]]) / p->temperature) / z;
    if (p->top_k > 0 && p->top_k < n)
        m = p->top_k;
    z = 0.0;
    for (int j = 0; j < m; j++)
        z += e[j];
    for (int j = 0; j < m; j++)
        e[j] /= z;
    if (p->top_p < 1.0f) {
        for (int j = 0; j < m; j++) {
            cum += e[j];
            if (cum >= p->top_p) {
                m = j + 1;
                break;
            }
        }
        z = 0.0;
        for (int j = 0; j < m; j++)
            z += e[j];
        for (int j = 0; j < m; j++)
            e[j] /= z;
    }
    for (int j = 0; j < m; j++) {
        kept[j] = ids[j];
        prob[j] = e[j];
    }
    free(ids);
    free(e);
    return m;
}

static int in_set(int token, const int *set, int n)
{
    for (int j = 0; j < n; j++) {
        if (set[j] == token)
            return 1;
    }
    return 0;
}

/* Test-side random numbers, separate from the sampler's stream. */
static uint64_t test_rand_state = 0x1234567;

static double test_rand(void)
{
    test_rand_state = test_rand_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(test_rand_state >> 11) * 0x1.0p-53;
}

/* ---- tests ---- */

static void test_rng_known_values(void)
{
    struct lora_rng a, b;
    double sum = 0.0;

    /* Expected values from an independent Python model of splitmix64 + xoshiro256**. */
    lora_rng_seed(&a, 0);
    CHECK(a.state[0] == 0xe220a8397b1dcdafULL);
    CHECK(a.state[3] == 0xf88bb8a8724c81ecULL);
    CHECK(lora_rng_next(&a) == 0x99ec5f36cb75f2b4ULL);
    CHECK(lora_rng_next(&a) == 0xbf6e1f784956452aULL);
    CHECK(lora_rng_next(&a) == 0x1a5f849d4933e6e0ULL);
    lora_rng_seed(&b, 0);
    CHECK_NEAR(lora_rng_uniform(&b), 0.6012629994179048, 1e-15);
    for (int i = 0; i < 100000; i++) {
        double u = lora_rng_uniform(&b);

        CHECK(u >= 0.0 && u < 1.0);
        sum += u;
    }
    CHECK_NEAR(sum / 100000, 0.5, 0.005);
}

static void test_new_destroy(void)
{
    struct lora_sampler *s = lora_sampler_new(10);

    CHECK(s != NULL);
    lora_sampler_destroy(&s);
    CHECK(s == NULL);
    lora_sampler_destroy(&s); /* twice is harmless */
    CHECK(lora_sampler_new(0) == NULL);
    CHECK(lora_sampler_new(-3) == NULL);
}

static void test_greedy(void)
{
    const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    const float first_max[] = {3.0f, 3.0f, 1.0f};
    struct lora_sampling_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};
    struct lora_sampler *s = lora_sampler_new(5);
    struct lora_sampler *s3 = lora_sampler_new(3);
    struct lora_rng rng;
    uint64_t before;

    lora_rng_seed(&rng, 7);
    before = rng.state[0];
    CHECK(lora_sampler_sample(s, logits, &p, &rng) == 1);
    CHECK(lora_sampler_sample(s, logits, &p, NULL) == 1);
    CHECK(lora_sampler_sample(s3, first_max, &p, &rng) == 0);
    CHECK(rng.state[0] == before); /* greedy draws nothing */
    lora_sampler_destroy(&s);
    lora_sampler_destroy(&s3);
}

/* -0 and +0 tie, so the lower id wins: greedy, top-k, top-n, and at a top-p boundary. */
static void test_signed_zeros_tie(void)
{
    const float zeros[] = {-1.0f, -0.0f, 0.0f};
    /* two tokens at 0.5 each: top-p 0.5 keeps the lower id alone, with or without top-k */
    const float halves[] = {-0.0f, 0.0f, -20.0f};
    struct lora_sampling_params greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};
    struct lora_sampling_params k1 = {.temperature = 1.0f, .top_k = 1, .top_p = 1.0f};
    struct lora_sampling_params half = {.temperature = 1.0f, .top_k = 0, .top_p = 0.5f};
    struct lora_sampler *s2 = lora_sampler_new(2);
    struct lora_sampler *s3 = lora_sampler_new(3);
    struct lora_rng rng;
    int ids[2];
    float lps[2];

    lora_rng_seed(&rng, 12);
    CHECK(lora_sampler_sample(s3, zeros, &greedy, NULL) == 1);
    CHECK(lora_sampler_sample(s3, zeros, &k1, &rng) == 1);
    lora_sampler_logprobs(s3, zeros, 0, 2, ids, lps);
    CHECK(ids[0] == 1 && ids[1] == 2);
    for (int i = 0; i < 100; i++) {
        half.top_k = 0;
        CHECK(lora_sampler_sample(s2, halves, &half, &rng) == 0);
        half.top_k = 2;
        CHECK(lora_sampler_sample(s3, halves, &half, &rng) == 0);
    }
    lora_sampler_destroy(&s2);
    lora_sampler_destroy(&s3);
}

static void test_logprobs(void)
{
    const float logits[] = {1.0f, -2.0f, 3.5f, 0.25f, 3.0f, -0.5f};
    int ids[6];
    float lps[6];
    int ref[6];
    double z = 0.0;
    struct lora_sampler *s = lora_sampler_new(6);

    for (int i = 0; i < 6; i++)
        z += exp((double)logits[i]);
    for (int tok = 0; tok < 6; tok++) {
        float lp = lora_sampler_logprobs(s, logits, tok, 0, NULL, NULL);

        CHECK_NEAR(lp, (double)logits[tok] - log(z), 1e-6);
    }
    CHECK_NEAR(lora_sampler_logprobs(s, logits, 2, 3, ids, lps), 3.5 - log(z), 1e-6);
    ref_sort(ref, logits, 6);
    for (int j = 0; j < 3; j++) {
        CHECK(ids[j] == ref[j]);
        CHECK_NEAR(lps[j], (double)logits[ref[j]] - log(z), 1e-6);
    }
    CHECK(ids[0] == 2 && ids[1] == 4 && ids[2] == 0);
    lora_sampler_destroy(&s);
}

/* A token's log-probability asked alone (only the normaliser is computed) has the bits of the
 * same token's when alternatives are asked for too (the whole row is), on rows of every length
 * around the vector width, with NaN, -0, -inf and +inf logits among them. */
static void test_logprobs_alone_same_bits(void)
{
    static const float special[] = {NAN, -0.0f, -INFINITY, INFINITY};
    float logits[300], lps[3];
    int ids[3];

    for (int c = 0; c < 120; c++) {
        int n = 1 + c % 40 + (c % 3) * 100;
        struct lora_sampler *s = lora_sampler_new(n);
        for (int i = 0; i < n; i++)
            logits[i] = (float)(test_rand() * 40.0 - 20.0);
        for (int i = 0; c % 4 && i < 1 + c % 5; i++)
            logits[(int)(test_rand() * n) % n] = special[(c + i) % (c % 8 < 6 ? 3 : 4)];
        for (int t = 0; t < n; t++) {
            float alone = lora_sampler_logprobs(s, logits, t, 0, NULL, NULL);
            float with = lora_sampler_logprobs(s, logits, t, 3, ids, lps);
            CHECK(memcmp(&alone, &with, sizeof(float)) == 0);
        }
        lora_sampler_destroy(&s);
    }
}

static void test_logprobs_clamp_and_ties(void)
{
    const float logits[] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f};
    int ids[8];
    float lps[8];
    double z = 0.0;
    struct lora_sampler *s = lora_sampler_new(5);

    for (int i = 0; i < 5; i++)
        z += exp((double)logits[i]);
    for (int j = 0; j < 8; j++) {
        ids[j] = -7;
        lps[j] = 42.0f;
    }
    lora_sampler_logprobs(s, logits, 0, 8, ids, lps);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4 && ids[3] == 0 && ids[4] == 3);
    for (int j = 0; j < 5; j++)
        CHECK_NEAR(lps[j], (double)logits[ids[j]] - log(z), 1e-6);
    for (int j = 5; j < 8; j++)
        CHECK(ids[j] == -7 && lps[j] == 42.0f); /* clamped to the vocabulary */
    CHECK(isnan(lora_sampler_logprobs(s, logits, 5, 0, NULL, NULL)));
    CHECK(isnan(lora_sampler_logprobs(s, logits, -1, 0, NULL, NULL)));
    lora_sampler_destroy(&s);
}

static void test_top_k_one_is_greedy(void)
{
    const float logits[] = {0.1f, 0.7f, 0.3f, 0.7f, -5.0f, 0.69f};
    const float temps[] = {0.01f, 0.5f, 1.0f, 3.0f, 100.0f};
    struct lora_sampler *s = lora_sampler_new(6);
    struct lora_rng rng;

    lora_rng_seed(&rng, 99);
    for (int t = 0; t < 5; t++) {
        struct lora_sampling_params p = {.temperature = temps[t], .top_k = 1, .top_p = 1.0f};

        for (int i = 0; i < 200; i++)
            CHECK(lora_sampler_sample(s, logits, &p, &rng) == 1);
    }
    lora_sampler_destroy(&s);
}

static void test_top_p(void)
{
    const float logits[] = {0.1f, 0.7f, 0.3f, 0.7f, -5.0f, 0.69f};
    /* probabilities 0.5, 0.3, 0.2: top_p 0.75 keeps exactly tokens 2 and 0 */
    const float crafted[] = {(float)log(0.5), (float)log(0.2), (float)log(0.3)};
    const float shuffled[] = {crafted[2], crafted[1], crafted[0]};
    struct lora_sampling_params tiny = {.temperature = 1.0f, .top_k = 0, .top_p = 1e-6f};
    struct lora_sampling_params p75 = {.temperature = 1.0f, .top_k = 0, .top_p = 0.75f};
    struct lora_sampler *s = lora_sampler_new(6);
    struct lora_sampler *s3 = lora_sampler_new(3);
    struct lora_rng rng;
    int seen[3] = {0, 0, 0};

    lora_rng_seed(&rng, 5);
    for (int i = 0; i < 500; i++)
        CHECK(lora_sampler_sample(s, logits, &tiny, &rng) == 1);
    for (int i = 0; i < 2000; i++) {
        int tok = lora_sampler_sample(s3, shuffled, &p75, &rng);

        CHECK(tok == 0 || tok == 2);
        if (tok >= 0 && tok < 3)
            seen[tok]++;
    }
    CHECK(seen[0] > 0 && seen[2] > 0 && seen[1] == 0);
    /* Renormalised: 0.5 / 0.8 for the most likely token. */
    CHECK_NEAR(seen[2] / 2000.0, 0.625, 0.04);
    /* Same through the top-k path, with k covering everything but one token. */
    p75.top_k = 2;
    for (int i = 0; i < 2000; i++) {
        int tok = lora_sampler_sample(s3, shuffled, &p75, &rng);

        CHECK(tok == 0 || tok == 2);
    }
    lora_sampler_destroy(&s);
    lora_sampler_destroy(&s3);
}

/* Equal logits give exact probabilities, so cumulative sums land exactly on top_p: the nucleus is
 * the smallest prefix reaching it (>=), in id order among ties. */
static void test_top_p_exact_boundary(void)
{
    enum { V = 8, N_DRAWS = 4000 };
    const float logits[V] = {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f};
    /* 0.25 of eight tokens at 0.125, or 0.5 of the top-4 at 0.25: exactly the first two */
    const int top_ks[] = {0, 4};
    const float top_ps[] = {0.25f, 0.5f};
    struct lora_sampler *s = lora_sampler_new(V);
    struct lora_rng rng;

    lora_rng_seed(&rng, 3);
    for (int c = 0; c < 2; c++) {
        struct lora_sampling_params p = {
            .temperature = 1.0f, .top_k = top_ks[c], .top_p = top_ps[c]};
        int count[V] = {0}, want = 2;

        for (int i = 0; i < N_DRAWS; i++) {
            int tok = lora_sampler_sample(s, logits, &p, &rng);

            CHECK(tok >= 0 && tok < want);
            if (tok >= 0 && tok < V)
                count[tok]++;
        }
        for (int i = 0; i < want; i++)
            CHECK_NEAR((double)count[i] / N_DRAWS, 1.0 / want, 0.04);
    }
    lora_sampler_destroy(&s);
}

/* The same on larger vocabularies of equal logits, where the quickselect behind top-p alone meets
 * partial sums exactly equal to the target: the nucleus is exactly the first V * top_p ids. */
static void test_top_p_exact_boundary_sweep(void)
{
    const int vocabs[] = {8, 16, 64, 100, 200, 256};
    const float top_ps[] = {0.25f, 0.5f, 0.75f};
    float logits[256];
    struct lora_rng rng;

    for (int i = 0; i < 256; i++)
        logits[i] = -0.5f;
    lora_rng_seed(&rng, 6);
    for (size_t a = 0; a < sizeof(vocabs) / sizeof(vocabs[0]); a++) {
        struct lora_sampler *s = lora_sampler_new(vocabs[a]);

        for (size_t b = 0; b < sizeof(top_ps) / sizeof(top_ps[0]); b++) {
            struct lora_sampling_params p = {.temperature = 1.0f, .top_k = 0, .top_p = top_ps[b]};
            int want = (int)(vocabs[a] * top_ps[b]), bad = 0;

            for (int i = 0; i < 2000; i++) {
                int tok = lora_sampler_sample(s, logits, &p, &rng);

                bad += tok < 0 || tok >= want;
            }
            CHECK(bad == 0);
        }
        lora_sampler_destroy(&s);
    }
}

/* A flat distribution with a large nucleus: nothing inside it may be dropped early. */
static void test_top_p_flat(void)
{
    enum { V = 10, N_DRAWS = 5000 };
    const float logits[V] = {0};
    struct lora_sampling_params p = {.temperature = 1.0f, .top_k = 0, .top_p = 0.75f};
    struct lora_sampler *s = lora_sampler_new(V);
    struct lora_rng rng;
    int count[V] = {0};

    lora_rng_seed(&rng, 4);
    for (int i = 0; i < N_DRAWS; i++) {
        int tok = lora_sampler_sample(s, logits, &p, &rng);

        CHECK(tok >= 0 && tok < 8); /* 0.1 each: the first eight reach 0.75 */
        if (tok >= 0 && tok < V)
            count[tok]++;
    }
    for (int i = 0; i < 8; i++)
        CHECK_NEAR((double)count[i] / N_DRAWS, 0.125, 0.03);
    lora_sampler_destroy(&s);
}

/* Draws n_draws tokens and checks frequencies against expected[5] within tol. */
static void check_frequencies(const float *logits, const struct lora_sampling_params *p,
                              const double *expected, uint64_t seed)
{
    enum { N_DRAWS = 200000 };
    struct lora_sampler *s = lora_sampler_new(5);
    struct lora_rng rng;
    int count[5] = {0};

    lora_rng_seed(&rng, seed);
    for (int i = 0; i < N_DRAWS; i++) {
        int tok = lora_sampler_sample(s, logits, p, &rng);

        CHECK(tok >= 0 && tok < 5);
        if (tok >= 0 && tok < 5)
            count[tok]++;
    }
    for (int i = 0; i < 5; i++)
        CHECK_NEAR((double)count[i] / N_DRAWS, expected[i], 0.01);
    lora_sampler_destroy(&s);
}

static void softmax5(const float *logits, double t, double *out)
{
    double z = 0.0;

    for (int i = 0; i < 5; i++)
        z += exp(logits[i] / t);
    for (int i = 0; i < 5; i++)
        out[i] = exp(logits[i] / t) / z;
}

static void test_empirical_distribution(void)
{
    const float logits[] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    struct lora_sampling_params p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f};
    double expected[5], z;

    softmax5(logits, 1.0, expected);
    check_frequencies(logits, &p, expected, 1);

    p.temperature = 0.5f;
    softmax5(logits, 0.5, expected);
    check_frequencies(logits, &p, expected, 2);

    /* top-3 of (1, 2, 0.5, -1, 1.5) is {1, 4, 0}; renormalise at temperature 1. */
    p.temperature = 1.0f;
    p.top_k = 3;
    softmax5(logits, 1.0, expected);
    z = expected[0] + expected[1] + expected[4];
    expected[0] /= z;
    expected[1] /= z;
    expected[4] /= z;
    expected[2] = expected[3] = 0.0;
    check_frequencies(logits, &p, expected, 3);

    /* top-p alone: probabilities 0.445, 0.270, 0.164, ... for tokens 1, 4, 0, so 0.8 needs the
     * prefix {1, 4, 0}. */
    p.top_k = 0;
    p.top_p = 0.8f;
    softmax5(logits, 1.0, expected);
    CHECK(expected[1] + expected[4] < 0.8 && expected[1] + expected[4] + expected[0] >= 0.8);
    z = expected[0] + expected[1] + expected[4];
    expected[0] /= z;
    expected[1] /= z;
    expected[4] /= z;
    expected[2] = expected[3] = 0.0;
    check_frequencies(logits, &p, expected, 4);
}

static void test_determinism(void)
{
    enum { V = 1000 };
    float *logits = malloc(V * sizeof(*logits));
    struct lora_sampler *s = lora_sampler_new(V);
    struct lora_sampling_params p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f};
    struct lora_rng a, b, c;
    int n_diff = 0;

    for (int i = 0; i < V; i++)
        logits[i] = (float)(test_rand() * 2.0);
    lora_rng_seed(&a, 1234);
    lora_rng_seed(&b, 1234);
    lora_rng_seed(&c, 1235);
    for (int i = 0; i < 100; i++) {
        int ta = lora_sampler_sample(s, logits, &p, &a);
        int tb = lora_sampler_sample(s, logits, &p, &b);
        int tc = lora_sampler_sample(s, logits, &p, &c);

        CHECK(ta == tb);
        n_diff += ta != tc;
    }
    CHECK(n_diff > 50);
    lora_sampler_destroy(&s);
    free(logits);
}

/* Per-draw seeding: a draw depends on (seed, index) only, and neighbouring indices and seeds
 * give unrelated streams. */
static void test_seed_draw(void)
{
    struct lora_rng a, b;
    int same_next = 0, same_seed = 0;

    for (uint64_t k = 0; k < 200; k++) {
        lora_rng_seed_draw(&a, 77, k);
        lora_rng_seed_draw(&b, 77, k);
        CHECK(lora_rng_next(&a) == lora_rng_next(&b));
        lora_rng_seed_draw(&a, 77, k);
        lora_rng_seed_draw(&b, 77, k + 1);
        same_next += lora_rng_next(&a) == lora_rng_next(&b);
        lora_rng_seed_draw(&a, 77, k);
        lora_rng_seed_draw(&b, 78, k);
        same_seed += lora_rng_next(&a) == lora_rng_next(&b);
    }
    CHECK(same_next == 0);
    CHECK(same_seed == 0);
    /* The draw stream is not the plain seeded stream shifted by one. */
    lora_rng_seed(&a, 77);
    lora_rng_seed_draw(&b, 77, 0);
    CHECK(lora_rng_next(&a) != lora_rng_next(&b));
}

static void test_nan_and_inf(void)
{
    const float with_nan[] = {NAN, 1.0f, NAN, 2.0f, -INFINITY};
    const float all_neg_inf[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float all_nan[] = {NAN, NAN, NAN, NAN, NAN};
    const float pos_inf[] = {0.0f, INFINITY, 1.0f, INFINITY, NAN};
    struct lora_sampling_params ps[] = {
        {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f},
        {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f},
        {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f},
        {.temperature = 1.0f, .top_k = 0, .top_p = 0.5f},
        {.temperature = 0.7f, .top_k = 3, .top_p = 0.9f},
        {.temperature = INFINITY, .top_k = 0, .top_p = 1.0f},
        {.temperature = NAN, .top_k = -4, .top_p = NAN},
        {.temperature = 1.0f, .top_k = 0, .top_p = -1.0f},
    };
    struct lora_sampler *s = lora_sampler_new(5);
    struct lora_rng rng;
    int ids[5];
    float lps[5];

    lora_rng_seed(&rng, 11);
    for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
        for (int i = 0; i < 200; i++) {
            int tok = lora_sampler_sample(s, with_nan, &ps[k], &rng);

            CHECK(tok == 1 || tok == 3);
            CHECK(lora_sampler_sample(s, all_neg_inf, &ps[k], &rng) == 0);
            CHECK(lora_sampler_sample(s, all_nan, &ps[k], &rng) == 0);
            CHECK(lora_sampler_sample(s, pos_inf, &ps[k], &rng) == 1);
        }
    }
    CHECK(lora_sampler_sample(NULL, with_nan, &ps[1], &rng) == -1);
    CHECK(lora_sampler_sample(s, NULL, &ps[1], &rng) == -1);
    CHECK(lora_sampler_sample(s, with_nan, NULL, &rng) == -1);
    CHECK(lora_sampler_sample(s, with_nan, &ps[1], NULL) == -1);

    CHECK(lora_sampler_logprobs(s, with_nan, 0, 5, ids, lps) == -INFINITY);
    CHECK(ids[0] == 3 && ids[1] == 1 && ids[2] == 0 && ids[3] == 2 && ids[4] == 4);
    CHECK_NEAR(lps[0], 2.0 - log(exp(1.0) + exp(2.0)), 1e-6);
    CHECK(lora_sampler_logprobs(s, all_nan, 2, 0, NULL, NULL) == -INFINITY);
    CHECK_NEAR(lora_sampler_logprobs(s, pos_inf, 3, 0, NULL, NULL), -log(2.0), 1e-6);
    lora_sampler_destroy(&s);
}

/* n_cases random cases, vocabularies of 1..max_v: every draw must lie in the brute-force kept set,
 * and every kept token worth 5% must show up (odds of a miss in 300 draws: 2e-7). */
static void cross_check(int max_v, int n_cases, int n_draws, uint64_t seed)
{
    float *logits = malloc((size_t)max_v * sizeof(*logits));
    int *kept = malloc((size_t)max_v * sizeof(*kept));
    int *count = malloc((size_t)max_v * sizeof(*count));
    double *prob = malloc((size_t)max_v * sizeof(*prob));
    struct lora_rng rng;

    lora_rng_seed(&rng, seed);
    for (int c = 0; c < n_cases; c++) {
        int v = 1 + (int)(test_rand() * max_v);
        struct lora_sampling_params p;
        struct lora_sampler *s = lora_sampler_new(v);
        int m, bad = 0;

        /* Every third case uses small integers so that ties land on the top-k boundary. */
        for (int i = 0; i < v; i++) {
            if (c % 3 == 0)
                logits[i] = (float)(int)(test_rand() * 5.0) - 2.0f;
            else
                logits[i] = (float)((test_rand() - 0.5) * 8.0);
            count[i] = 0;
        }
        p.temperature = c % 10 == 0 ? 0.0f : (float)(0.1 + test_rand() * 1.9);
        if (c % 7 == 0)
            p.temperature = 20.0f; /* nearly flat: large nuclei */
        p.top_k = (int)(test_rand() * (v + 3)) - 1;
        if (c % 5 == 0)
            p.top_k = 0; /* top-p alone, or no filter at all */
        p.top_p = c % 4 == 0 ? 1.0f : (float)(0.05 + test_rand() * 0.95);
        m = ref_kept(logits, v, &p, kept, prob);
        for (int i = 0; i < n_draws; i++) {
            int tok = lora_sampler_sample(s, logits, &p, &rng);

            if (tok < 0 || tok >= v || !in_set(tok, kept, m))
                bad++;
            else
                count[tok]++;
        }
        if (bad)
            printf("# case %d: v %d T %g k %d p %g: %d draws outside the kept set\n", c, v,
                   (double)p.temperature, p.top_k, (double)p.top_p, bad);
        CHECK(bad == 0);
        for (int j = 0; j < m; j++) {
            if (prob[j] >= 0.05)
                CHECK(count[kept[j]] > 0);
        }
        lora_sampler_destroy(&s);
    }
    free(logits);
    free(kept);
    free(count);
    free(prob);
}

static void test_brute_force_cross_check(void)
{
    cross_check(50, 200, 500, 2024);
}

/* Vocabularies spanning several 64-token blocks and partial last blocks. */
static void test_brute_force_cross_check_blocks(void)
{
    cross_check(2000, 60, 300, 2025);
}

/* Exact frequencies across many blocks, for each path: no filter (block walk in id order),
 * top-p alone (quickselect), top-k then top-p (heap). */
static void test_empirical_many_blocks(void)
{
    enum { V = 300, N_DRAWS = 50000 };
    const struct lora_sampling_params ps[] = {
        {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f},
        {.temperature = 1.0f, .top_k = 0, .top_p = 0.8f},
        {.temperature = 0.7f, .top_k = 200, .top_p = 0.9f},
    };
    float logits[V];
    int kept[V], count[V];
    double prob[V];
    struct lora_sampler *s = lora_sampler_new(V);
    struct lora_rng rng;

    for (int i = 0; i < V; i++)
        logits[i] = (float)((test_rand() - 0.5) * 4.0);
    lora_rng_seed(&rng, 8);
    for (size_t c = 0; c < sizeof(ps) / sizeof(ps[0]); c++) {
        int m = ref_kept(logits, V, &ps[c], kept, prob);
        int inside = 0;

        for (int i = 0; i < V; i++)
            count[i] = 0;
        for (int i = 0; i < N_DRAWS; i++) {
            int tok = lora_sampler_sample(s, logits, &ps[c], &rng);

            if (tok >= 0 && tok < V)
                count[tok]++;
        }
        /* Six standard errors per token: a chance failure is below 1e-6 over all of them, while
         * a token off by one or a lost block moves whole probabilities around. */
        for (int j = 0; j < m; j++) {
            double sd = sqrt(prob[j] * (1.0 - prob[j]) / N_DRAWS);

            CHECK_NEAR((double)count[kept[j]] / N_DRAWS, prob[j], 6.0 * sd + 1e-5);
            inside += count[kept[j]];
        }
        CHECK(inside == N_DRAWS);
    }
    lora_sampler_destroy(&s);
}

/* Greedy and log-probabilities over a larger vocabulary with ties and NaNs, against brute force. */
static void test_greedy_and_logprobs_blocks(void)
{
    enum { V = 1000, TOP_N = 20 };
    float logits[V];
    int ref[V], ids[TOP_N];
    float lps[TOP_N];
    struct lora_sampling_params greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};

    for (int c = 0; c < 30; c++) {
        int v = 1 + (int)(test_rand() * V);
        int n = v < TOP_N ? v : TOP_N;
        struct lora_sampler *s = lora_sampler_new(v);
        double max = -INFINITY, z = 0.0;

        for (int i = 0; i < v; i++) {
            logits[i] = (float)(int)(test_rand() * 40.0) - 20.0f; /* many ties */
            if (test_rand() < 0.05)
                logits[i] = NAN;
        }
        if (c % 3 == 0)
            logits[v - 1] = 25.0f; /* maximum in the last, maybe partial, block */
        ref_sort(ref, logits, v);
        CHECK(lora_sampler_sample(s, logits, &greedy, NULL) == ref[0]);
        for (int i = 0; i < v; i++)
            max = fmax(max, ref_clean(logits[i]));
        for (int i = 0; i < v; i++)
            z += exp((double)ref_clean(logits[i]) - max);
        CHECK_NEAR(lora_sampler_logprobs(s, logits, ref[0], n, ids, lps),
                   (double)logits[ref[0]] - max - log(z), 1e-6);
        for (int j = 0; j < n; j++) {
            CHECK(ids[j] == ref[j]);
            double want = (double)ref_clean(logits[ref[j]]) - max - log(z);

            /* A float result: allow its rounding, about 6e-8 relative, on top; a NaN logit's
             * -inf exactly. */
            if (isinf(want))
                CHECK(lps[j] == want);
            else
                CHECK_NEAR(lps[j], want, 1e-6 + fabs(want) * 0x1.0p-23);
        }
        lora_sampler_destroy(&s);
    }
}

static void test_large_vocab(void)
{
    float *logits = malloc(BIG_VOCAB * sizeof(*logits));
    int *kept = malloc(BIG_VOCAB * sizeof(*kept));
    double *prob = malloc(BIG_VOCAB * sizeof(*prob));
    struct lora_sampler *s = lora_sampler_new(BIG_VOCAB);
    struct lora_sampling_params p = {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f};
    struct lora_sampling_params p_only = {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f};
    struct lora_rng rng;
    int m;

    CHECK(s != NULL);
    for (int i = 0; i < BIG_VOCAB; i++)
        logits[i] = (float)((test_rand() - 0.5) * 30.0);
    lora_rng_seed(&rng, 77);
    m = ref_kept(logits, BIG_VOCAB, &p, kept, prob);
    CHECK(m >= 1 && m <= 50);
    for (int i = 0; i < 50; i++)
        CHECK(in_set(lora_sampler_sample(s, logits, &p, &rng), kept, m));
    m = ref_kept(logits, BIG_VOCAB, &p_only, kept, prob);
    for (int i = 0; i < 20; i++)
        CHECK(in_set(lora_sampler_sample(s, logits, &p_only, &rng), kept, m));
    lora_sampler_destroy(&s);
    free(logits);
    free(kept);
    free(prob);
}

int main(void)
{
    RUN(test_rng_known_values);
    RUN(test_new_destroy);
    RUN(test_greedy);
    RUN(test_signed_zeros_tie);
    RUN(test_logprobs);
    RUN(test_logprobs_alone_same_bits);
    RUN(test_logprobs_clamp_and_ties);
    RUN(test_top_k_one_is_greedy);
    RUN(test_top_p);
    RUN(test_top_p_exact_boundary);
    RUN(test_top_p_exact_boundary_sweep);
    RUN(test_top_p_flat);
    RUN(test_empirical_distribution);
    RUN(test_determinism);
    RUN(test_seed_draw);
    RUN(test_nan_and_inf);
    RUN(test_brute_force_cross_check);
    RUN(test_brute_force_cross_check_blocks);
    RUN(test_empirical_many_blocks);
    RUN(test_greedy_and_logprobs_blocks);
    RUN(test_large_vocab);
    return check_done();
}
