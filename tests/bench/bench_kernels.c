/* bench_kernels: the CPU backend's matmul in each weight dtype against the machine's bounds,
 * measured side by side in one run.
 *
 *   build/main/tests/bench/bench_kernels [--quick] [--rounds N]
 *
 * Decoding reads every weight once per step, so at m = 1, 8 and 32 rows the figure is the weight
 * bandwidth achieved (the tensor's bytes over the time of one call) next to the machine's
 * streaming read bandwidth; at m = 256 the kernels are bound by arithmetic, so the figure is
 * GFLOP/s (2 m n k over the time) next to a float32 FMA peak measured here with the backend's
 * vector width. Dtypes: F32, BF16 exact, BF16 fast (x rounded to bf16), F16 and I8 (groups of
 * LORA_I8_GROUP); shapes (rows, cols of w): a Qwen2-0.5B MLP's down (896 x 4864) and gate/up
 * (4864 x 896) projections and its LM head (151936 x 896). Each figure is the median over
 * interleaved rounds, each round running every configuration once in a rotated order, so that
 * the machine's noise hits them alike: compare ratios within one run. Last, int8's accuracy: the
 * relative error of a matmul with x and w quantized in groups of 32, 64, 128 or per output
 * channel, on uniform and on realistic inputs (outliers among the weights and the activations),
 * beside the backend's own I8 matmul, the numbers behind LORA_I8_GROUP (backend/backend.h).
 * --quick: small shapes and two rounds, to check that the benchmark runs.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "tests/common/bench_machine.h"
#include "tests/common/median.h"

#define MAX_ROUNDS 15

struct mode {
    const char *name;
    enum lora_dtype dtype;
    bool fast;
};

static const struct mode modes[] = {
    {"f32", LORA_DTYPE_F32, false},       {"bf16", LORA_DTYPE_BF16, false},
    {"bf16 fast", LORA_DTYPE_BF16, true}, {"f16", LORA_DTYPE_F16, false},
    {"int8", LORA_DTYPE_I8, false},
};
#define N_MODES ((int)(sizeof(modes) / sizeof(modes[0])))

static const int decode_ms[] = {1, 8, 32};
#define N_DECODE_MS 3
#define COMPUTE_M   256

static struct lora_backend *be;

static void die(const char *what, const char *err)
{
    fprintf(stderr, "bench: fatal: %s: %s\n", what, err);
    exit(111);
}

/* Copies of a weight that the calls cycle through: at least this many bytes of each dtype, so
 * that no weight is still in the caches from the call before, as in a forward pass of many
 * layers (the machine's last-level cache may hold tens of megabytes). */
#define ROTATION_BYTES ((size_t)256 << 20)
#define MAX_COPIES     64

/* One weight (n, k) in every mode's dtype, in copies, in the backend's buffers. */
struct shape {
    int n, k;
    int n_copies[N_MODES], next[N_MODES];
    struct lora_buffer *buf[N_MODES];
    struct lora_tensor t[N_MODES];
};

static void shape_init(struct shape *s, int n, int k)
{
    size_t count = (size_t)n * k;
    float *w = malloc(count * sizeof(float));
    char err[256];

    if (!w)
        die("weights", "out of memory");
    /* Weights of a trained model's scale, with the odd outlier. */
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)count;
#pragma omp parallel for
    for (size_t i = 0; i < count; i++) {
        uint64_t z = r + i * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
        z ^= z >> 29;
        float u = (float)((int64_t)(z >> 40) - (1 << 23)) / (float)(1 << 23);
        w[i] = (z & 0x3ff) == 0 ? 0.5f * u : 0.05f * u;
    }
    s->n = n;
    s->k = k;
    for (int d = 0; d < N_MODES; d++) {
        enum lora_dtype dt = modes[d].dtype;
        if (d > 0 && modes[d - 1].dtype == dt) { /* the fast mode shares its dtype's tensors */
            s->buf[d] = NULL;
            s->t[d] = s->t[d - 1];
            s->n_copies[d] = s->n_copies[d - 1];
            s->next[d] = 0;
            continue;
        }
        size_t bytes = lora_tensor_bytes(dt, n, k), stride = (bytes + 63) / 64 * 64;
        size_t copies = ROTATION_BYTES / stride + 1;
        copies = copies > MAX_COPIES ? MAX_COPIES : copies;
        s->n_copies[d] = (int)copies;
        s->next[d] = 0;
        s->buf[d] = be->ops->buffer_alloc(be, stride * copies, err, sizeof(err));
        if (!s->buf[d])
            die("a weight buffer", err);
        void *p = s->buf[d]->base;
        if (dt == LORA_DTYPE_I8) {
            if (lora_quantize_i8(LORA_DTYPE_F32, w, n, k, p) < 0)
                die("quantizing", "lora_quantize_i8 failed");
        } else if (dt == LORA_DTYPE_F32) {
            memcpy(p, w, bytes);
        } else {
            uint16_t *h = p;
#pragma omp parallel for
            for (size_t i = 0; i < count; i++)
                h[i] = dt == LORA_DTYPE_BF16 ? lora_f32_to_bf16(w[i]) : lora_f32_to_f16(w[i]);
        }
        for (size_t c = 1; c < copies; c++)
            memcpy((char *)p + c * stride, p, bytes);
        s->t[d] = (struct lora_tensor){s->buf[d], 0, dt, n, k};
    }
    free(w);
}

static void shape_release(struct shape *s)
{
    for (int d = 0; d < N_MODES; d++)
        be->ops->buffer_free(be, s->buf[d]);
}

/* Seconds per call of mode d on shape s at m rows: reps calls, each on the next copy, timed
 * together. */
static double time_call(struct shape *s, int d, int m, float *y, const float *x, int reps)
{
    struct lora_tensor t = s->t[d];
    size_t stride = (lora_tensor_bytes(t.dtype, t.rows, t.cols) + 63) / 64 * 64;

    be->fast_matmul = modes[d].fast;
    double t0 = lora_clock_mono();
    for (int i = 0; i < reps; i++) {
        t.offset = (size_t)s->next[d] * stride;
        s->next[d] = (s->next[d] + 1) % s->n_copies[d];
        be->ops->matmul(be, y, x, &t, m, 1.0f, false);
    }
    return (lora_clock_mono() - t0) / reps;
}

/* ---- int8 accuracy ---- */

static uint64_t acc_rng = 12345;

static double uniform01(void)
{
    uint64_t z = (acc_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((double)((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(void)
{
    return sqrt(-2 * log(uniform01())) * cos(6.283185307179586 * uniform01());
}

/* v (k) quantized symmetrically in groups of g (k: one scale per row). */
static void quantize_groups(const float *v, int k, int g, signed char *q, float *scales)
{
    for (int g0 = 0, gi = 0; g0 < k; g0 += g, gi++) {
        int g1 = g0 + g < k ? g0 + g : k;
        float max = 0;
        for (int c = g0; c < g1; c++)
            max = fabsf(v[c]) > max ? fabsf(v[c]) : max;
        scales[gi] = max / 127.0f;
        for (int c = g0; c < g1; c++)
            q[c] = scales[gi] > 0 ? (signed char)lrintf(v[c] / scales[gi]) : 0;
    }
}

/* The relative error |y - y_ref|_2 / |y_ref|_2 of x · wᵀ with both quantized in groups of g
 * (k: per output channel and per row), y_ref the float32 inputs' product in double, for four
 * kinds of inputs, next to the backend's own I8 matmul (LORA_I8_GROUP). */
static void i8_accuracy(bool quick)
{
    int n = quick ? 32 : 256, k = quick ? 640 : 4864, m = quick ? 4 : 16;
    const int groups[] = {0, 32, 64, 128}; /* 0: per channel */
    float *w = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
    float *y = malloc(sizeof(float) * (size_t)m * n), *sw = malloc(sizeof(float) * (size_t)n * k);
    float *sx = malloc(sizeof(float) * (size_t)m * k);
    signed char *qw = malloc((size_t)n * k), *qx = malloc((size_t)m * k);
    double *ref = malloc(sizeof(double) * (size_t)m * n);
    char *i8 = malloc(lora_tensor_bytes(LORA_DTYPE_I8, n, k)), err[256];

    if (!w || !x || !y || !sw || !sx || !qw || !qx || !ref || !i8)
        die("accuracy", "out of memory");
    printf(
        "\nint8 relative matmul error, x and w quantized alike (k = %d, %d x %d outputs; kernel: "
        "the backend's, groups of %d):\n",
        k, m, n, LORA_I8_GROUP);
    printf("  %-44s %11s %11s %11s %11s %11s\n", "inputs", "per channel", "group 32", "group 64",
           "group 128", "kernel");
    for (int kind = 0; kind < 4; kind++) {
        bool w_outliers = kind >= 2, x_outliers = kind % 2;
        for (size_t i = 0; i < (size_t)n * k; i++) {
            if (!w_outliers)
                w[i] = (float)(2 * uniform01() - 1);
            else
                w[i] = (float)(0.02 * normal() * (uniform01() < 0.001 ? 20 : 1));
        }
        for (size_t i = 0; i < (size_t)m * k; i++)
            x[i] = (float)normal();
        if (x_outliers) /* LLM activations: a few channels far larger than the rest */
            for (int j = 0; j < 8; j++) {
                int c = (int)(uniform01() * k);
                for (int i = 0; i < m; i++)
                    x[(size_t)i * k + c] *= 30;
            }
        double ref2 = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double d = 0;
                for (int c = 0; c < k; c++)
                    d += (double)x[(size_t)i * k + c] * w[(size_t)j * k + c];
                ref[(size_t)i * n + j] = d;
                ref2 += d * d;
            }
        printf("  %-44s",
               (const char *[]){"w uniform, x normal", "w uniform, x normal + 8 channels x30",
                                "w normal + 0.1% x20, x normal",
                                "w normal + 0.1% x20, x + 8 channels x30"}[kind]);
        for (int gi = 0; gi < 4; gi++) {
            int g = groups[gi] ? groups[gi] : k, ng = (k + g - 1) / g;
            for (int j = 0; j < n; j++)
                quantize_groups(w + (size_t)j * k, k, g, qw + (size_t)j * k, sw + (size_t)j * ng);
            for (int i = 0; i < m; i++)
                quantize_groups(x + (size_t)i * k, k, g, qx + (size_t)i * k, sx + (size_t)i * ng);
            double e2 = 0;
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double got = 0;
                    for (int gg = 0; gg < ng; gg++) {
                        long sum = 0;
                        for (int c = gg * g; c < k && c < (gg + 1) * g; c++)
                            sum += qx[(size_t)i * k + c] * qw[(size_t)j * k + c];
                        got += (double)sum * sx[(size_t)i * ng + gg] * sw[(size_t)j * ng + gg];
                    }
                    double d = got - ref[(size_t)i * n + j];
                    e2 += d * d;
                }
            printf(" %10.2f%%", 100 * sqrt(e2 / ref2));
        }
        struct lora_buffer *b =
            be->ops->buffer_wrap(be, i8, lora_tensor_bytes(LORA_DTYPE_I8, n, k), err, sizeof(err));
        if (!b || lora_quantize_i8(LORA_DTYPE_F32, w, n, k, i8) < 0)
            die("accuracy", "unable to quantize");
        struct lora_tensor t = {b, 0, LORA_DTYPE_I8, n, k};
        be->ops->matmul(be, y, x, &t, m, 1.0f, false);
        be->ops->buffer_free(be, b);
        double e2 = 0;
        for (size_t i = 0; i < (size_t)m * n; i++)
            e2 += (y[i] - ref[i]) * (y[i] - ref[i]);
        printf(" %10.2f%%\n", 100 * sqrt(e2 / ref2));
    }
    free(w);
    free(x);
    free(y);
    free(sw);
    free(sx);
    free(qw);
    free(qx);
    free(ref);
    free(i8);
}

int main(int argc, char **argv)
{
    bool quick = false;
    int rounds = 5;
    char err[256];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_kernels [--quick] [--rounds N]\n");
            return 100;
        }
    }
    if (quick)
        rounds = 2;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_kernels: --rounds takes 1 to %d\n", MAX_ROUNDS);
        return 100;
    }
    be = lora_backend_open("cpu", err, sizeof(err));
    if (!be)
        die("opening the cpu backend", err);
    bool wide = strstr(be->description, "AVX-512") != NULL;
    static const int full[][2] = {{896, 4864}, {4864, 896}, {151936, 896}};
    static const int small[][2] = {{64, 256}, {256, 64}, {1000, 64}};
    const int(*dims)[2] = quick ? small : full;
    enum { N_SHAPES = 3 };
    struct shape shapes[N_SHAPES];
    int max_k = 0, max_n = 0;
    for (int s = 0; s < N_SHAPES; s++) {
        shape_init(&shapes[s], dims[s][0], dims[s][1]);
        max_k = dims[s][1] > max_k ? dims[s][1] : max_k;
        max_n = dims[s][0] > max_n ? dims[s][0] : max_n;
    }
    float *x = malloc((size_t)COMPUTE_M * max_k * sizeof(float));
    float *y = malloc((size_t)COMPUTE_M * max_n * sizeof(float));
    if (!x || !y)
        die("activations", "out of memory");
    for (size_t i = 0; i < (size_t)COMPUTE_M * max_k; i++)
        x[i] = (float)sin(0.37 * (double)i) * (i % 97 == 0 ? 20.0f : 1.0f);

    /* The configurations: (shape, m, mode), m = 256 only on the projections (the LM head's
     * prefill computes the last row alone). */
    enum { MAX_CFG = N_SHAPES * (N_DECODE_MS + 1) * N_MODES };
    struct cfg {
        int s, m, d, reps;
        double t[MAX_ROUNDS];
    } cfg[MAX_CFG];
    int n_cfg = 0;
    for (int s = 0; s < N_SHAPES; s++)
        for (int mi = 0; mi <= N_DECODE_MS; mi++)
            for (int d = 0; d < N_MODES; d++) {
                int m = mi < N_DECODE_MS ? decode_ms[mi] : COMPUTE_M;
                if (m == COMPUTE_M && s == 2 && !quick)
                    continue;
                cfg[n_cfg++] = (struct cfg){.s = s, .m = m, .d = d};
            }
    /* Calibration: enough calls for about 50 ms each (a warm-up too). */
    for (int c = 0; c < n_cfg; c++) {
        double t = time_call(&shapes[cfg[c].s], cfg[c].d, cfg[c].m, y, x, 1);
        int reps = (int)(0.05 / (t > 1e-6 ? t : 1e-6));
        cfg[c].reps = reps < 1 ? 1 : reps > 10000 ? 10000 : reps;
    }
    /* Fast bf16 and int8 against the peak of the instruction their tiles run on (none measured:
     * no percentage). */
    enum bench_peak fast_on = bench_peak_of(be->description, true, false);
    bool bf16_dot = fast_on == BENCH_PEAK_BF16_DOT;
    bool i8_dot = bench_peak_of(be->description, false, true) == BENCH_PEAK_VNNI;
    double rbw[MAX_ROUNDS], peak[MAX_ROUNDS], bpeak[MAX_ROUNDS], ipeak[MAX_ROUNDS];
    size_t bw_bytes = quick ? (size_t)64 << 20 : (size_t)1 << 30;
    long peak_iters = quick ? 1000000 : 20000000;
    for (int r = 0; r < rounds; r++) {
        rbw[r] = read_bandwidth(bw_bytes);
        peak[r] = wide ? fma_peak_512(peak_iters) : fma_peak_256(peak_iters);
        bpeak[r] = bf16_dot ? dot_bf16_peak(peak_iters) : 0;
        ipeak[r] = i8_dot ? dot_i8_peak(peak_iters) : 0;
        for (int i = 0; i < n_cfg; i++) {
            struct cfg *c = &cfg[(i + r * 7) % n_cfg];
            c->t[r] = time_call(&shapes[c->s], c->d, c->m, y, x, c->reps);
        }
    }
    double read_bw = median(rbw, rounds), fma_peak = median(peak, rounds);
    double bf16_peak = median(bpeak, rounds), i8_peak = median(ipeak, rounds);

    printf("%s; medians of %d interleaved rounds\n", be->description, rounds);
    printf("streaming read bandwidth %.2f GB/s; float32 FMA peak (%s) %.1f GFLOP/s", read_bw / 1e9,
           wide ? "16 lanes" : "8 lanes", fma_peak);
    if (bf16_dot)
        printf("; bf16 dot %.1f GFLOP/s", bf16_peak);
    if (i8_dot)
        printf("; VNNI %.1f GOP/s", i8_peak);
    printf("\n");
    printf("\nweight bandwidth, GB/s (%% of the read bandwidth); int8 counts its scales:\n");
    printf("  %-15s %3s", "w (rows x cols)", "m");
    for (int d = 0; d < N_MODES; d++)
        printf(" %16s", modes[d].name);
    printf("\n");
    for (int c = 0; c < n_cfg; c += N_MODES) {
        const struct shape *s = &shapes[cfg[c].s];
        char dim[32];
        snprintf(dim, sizeof(dim), "%d x %d", s->n, s->k);
        if (cfg[c].m == COMPUTE_M)
            continue;
        printf("  %-15s %3d", dim, cfg[c].m);
        for (int d = 0; d < N_MODES; d++) {
            double t = median(cfg[c + d].t, rounds);
            double gbs = (double)lora_tensor_bytes(modes[d].dtype, s->n, s->k) / t;
            printf("   %6.2f (%3.0f%%)", gbs / 1e9, 100 * gbs / read_bw);
        }
        printf("\n");
    }
    printf("\nm = %d: GFLOP/s (%% of the peak of the instruction: the float32 FMA; %s; %s):\n",
           COMPUTE_M,
           (const char *[]){"bf16 fast, the FMA", "bf16 fast, the bf16 dot", "",
                            "bf16 fast, none"}[fast_on],
           i8_dot ? "int8, VNNI" : "int8, none");
    for (int c = 0; c < n_cfg; c += N_MODES) {
        const struct shape *s = &shapes[cfg[c].s];
        char dim[32];
        if (cfg[c].m != COMPUTE_M)
            continue;
        snprintf(dim, sizeof(dim), "%d x %d", s->n, s->k);
        printf("  %-15s %3d", dim, cfg[c].m);
        for (int d = 0; d < N_MODES; d++) {
            double t = median(cfg[c + d].t, rounds);
            double gf = 2.0 * COMPUTE_M * s->n * s->k / t / 1e9;
            enum bench_peak on =
                bench_peak_of(be->description, modes[d].fast, modes[d].dtype == LORA_DTYPE_I8);
            double of = (double[]){fma_peak, bf16_peak, i8_peak, 0}[on];
            if (of > 0)
                printf("   %6.1f (%3.0f%%)", gf, 100 * gf / of);
            else
                printf("   %6.1f (   -)", gf);
        }
        printf("\n");
    }
    i8_accuracy(quick);
    for (int s = 0; s < N_SHAPES; s++)
        shape_release(&shapes[s]);
    free(x);
    free(y);
    lora_backend_close(&be);
    return 0;
}
