/* bench_cuda: the runtime on the CUDA backend, against the device's own bound measured in the
 * same run: decode tokens per second at batch 1, 8 and 64 on bfloat16 models of the 0.5B shape
 * (Qwen2-0.5B's dimensions) and the 7B shape (Qwen2-7B's), with the matmul's exact and fast
 * modes; the cost of N distinct rank-16 adapters in a batch of 64; and the shrink and expand
 * kernels' achieved bandwidth. The bound is the device's streaming bandwidth (y += x over
 * 768 MB): decode at batch 1 cannot beat bandwidth / weight bytes per token.
 *
 *   bench_cuda [--shapes LIST] [--cache DIR] [--rounds N] [--quick]
 *
 * LIST is comma-separated from 0.5b and 7b (default 0.5b; the 7B model takes 15 GB of disk and a
 * minute or two to generate). Models and adapters are generated into DIR (default
 * $LORA_BENCH_CACHE or /tmp/lora-bench-cache) once and reused. --quick uses a tiny model, to
 * check that the benchmark runs. Medians of N rounds (default 3). Without a CUDA device it says
 * why and exits 0, so `make bench` runs it on every machine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "runtime/adapter.h"
#include "runtime/generate.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"
#include "tests/common/median.h"

#define N_ADAPTERS 8
#define MAX_ROUNDS 9

static struct lora_backend *be;
static int rounds = 3;

static int fail(const char *what, const char *err)
{
    fprintf(stderr, "bench_cuda: fatal: %s: %s\n", what, err);
    return 111;
}

/* Waits for the device: a download of one float from buf. */
static void sync_on(struct lora_buffer *buf)
{
    float f;
    char err[256];

    if (be->ops->download(be, &f, buf, 0, sizeof(f), err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_cuda: fatal: %s\n", err);
        exit(111);
    }
}

static struct lora_buffer *alloc(size_t bytes)
{
    char err[256];
    struct lora_buffer *b = be->ops->buffer_alloc(be, bytes, err, sizeof(err));

    if (!b) {
        fprintf(stderr, "bench_cuda: fatal: %s\n", err);
        exit(111);
    }
    return b;
}

/* The device's streaming bandwidth: y += x over n floats each (12 bytes moved per element), best
 * of five. */
static double device_bandwidth(size_t n)
{
    struct lora_buffer *b = alloc(2 * n * sizeof(float));
    float *x = b->base, *y = (float *)b->base + n;
    double best = 0;

    be->ops->add(be, y, x, n); /* warm */
    sync_on(b);
    for (int r = 0; r < 5; r++) {
        double t = lora_clock_mono();
        be->ops->add(be, y, x, n);
        sync_on(b);
        double bw = 12.0 * n / (lora_clock_mono() - t);
        best = bw > best ? bw : best;
    }
    be->ops->buffer_free(be, b);
    return best;
}

/* lora_sgmv of n_ad adapters of rank over rows rows (in, out), bfloat16: microseconds per call
 * and the adapters' bytes per call. */
static double sgmv_time(int rows, int n_ad, int rank, int in, int out, double *bytes)
{
    size_t a_bytes = (size_t)rank * in * 2, b_bytes = (size_t)rank * out * 2;
    struct lora_buffer *w = alloc((size_t)n_ad * (a_bytes + b_bytes));
    size_t tmp = be->ops->scratch_bytes(be, LORA_KERNEL_LORA_SGMV, rows, 0, rank);
    struct lora_buffer *act = alloc(((size_t)rows * (in + out)) * sizeof(float) + tmp + 256);
    struct lora_sgmv_seg *segs = calloc((size_t)n_ad, sizeof(*segs));
    float *x = act->base, *y = x + (size_t)rows * in;
    void *t = y + (size_t)rows * out;
    int per = rows / n_ad;
    double v[MAX_ROUNDS];

    for (int s = 0; s < n_ad; s++) {
        size_t off = (size_t)s * (a_bytes + b_bytes);
        segs[s] = (struct lora_sgmv_seg){s * per,
                                         per,
                                         rank,
                                         0.5f,
                                         {w, off, LORA_DTYPE_BF16, rank, in},
                                         {w, off + a_bytes, LORA_DTYPE_BF16, rank, out}};
    }
    int reps = 200;
    be->ops->lora_sgmv(be, y, x, segs, n_ad, in, out, t, rank);
    sync_on(act);
    for (int r = 0; r < rounds; r++) {
        double t0 = lora_clock_mono();
        for (int i = 0; i < reps; i++)
            be->ops->lora_sgmv(be, y, x, segs, n_ad, in, out, t, rank);
        sync_on(act);
        v[r] = (lora_clock_mono() - t0) / reps * 1e6;
    }
    *bytes = (double)n_ad * (a_bytes + b_bytes);
    free(segs);
    be->ops->buffer_free(be, act);
    be->ops->buffer_free(be, w);
    return median(v, rounds);
}

struct shape {
    const char *name;
    struct lora_model *m;
    struct lora_adapter *ad[N_ADAPTERS];
};

static int prompt[64];

/* Decode tokens per second of batch requests (16-token prompts, 32 new tokens, adapters
 * round-robin over n_adapters, 0: the base model), median of the rounds. */
static double decode_tps(struct shape *sh, int batch, int n_adapters, bool fast)
{
    struct lora_generate_request *reqs = calloc((size_t)batch, sizeof(*reqs));
    struct lora_generate_opts o = {.max_batched_tokens = 4096,
                                   .block_size = 16,
                                   .kv_dtype = LORA_DTYPE_BF16,
                                   .lora_dtype = LORA_DTYPE_BF16};
    char err[512];
    double v[MAX_ROUNDS];

    be->fast_matmul = fast;
    for (int r = 0; r < rounds; r++) {
        struct lora_generate_stats st;
        for (int i = 0; i < batch; i++) {
            reqs[i] = (struct lora_generate_request){0};
            reqs[i].prompt = prompt;
            reqs[i].n_prompt = 16;
            reqs[i].max_tokens = 32;
            reqs[i].adapter_slot = n_adapters ? i % n_adapters : -1;
            reqs[i].ignore_eos = true;
            reqs[i].seed = (uint64_t)i;
        }
        if (lora_generate_run(sh->m, (const struct lora_adapter *const *)sh->ad, n_adapters, reqs,
                              batch, &o, &st, err, sizeof(err)) < 0) {
            fprintf(stderr, "bench_cuda: fatal: %s: %s\n", sh->name, err);
            exit(111);
        }
        for (int i = 0; i < batch; i++)
            lora_generate_request_release(&reqs[i]);
        v[r] = st.n_decode_tokens / st.decode_seconds;
    }
    be->fast_matmul = false;
    free(reqs);
    return median(v, rounds);
}

/* The model of shape name in cache/name, generated unless a complete one is there. */
static int prepare(const char *cache, const char *name, char *dir, size_t len, char *err,
                   size_t err_len)
{
    struct lora_synthetic_model_opts o;
    struct stat st;
    char done[600];

    lora_synthetic_model_defaults(&o);
    o.dtype = LORA_DTYPE_BF16;
    o.arch = LORA_ARCH_QWEN2;
    o.max_position_embeddings = 4096;
    if (strcmp(name, "0.5b") == 0) {
        o.hidden_size = 896;
        o.n_layers = 24;
        o.n_heads = 14;
        o.n_kv_heads = 2;
        o.intermediate_size = 4864;
        o.vocab_size = 151936;
        o.tie_word_embeddings = true;
    } else if (strcmp(name, "7b") == 0) {
        o.hidden_size = 3584;
        o.n_layers = 28;
        o.n_heads = 28;
        o.n_kv_heads = 4;
        o.intermediate_size = 18944;
        o.vocab_size = 152064;
    } else if (strcmp(name, "quick") != 0) {
        snprintf(err, err_len, "unknown shape '%s' (0.5b, 7b)", name);
        return -1;
    }
    snprintf(dir, len, "%s/%s", cache, name);
    snprintf(done, sizeof(done), "%s/.complete", dir);
    if (stat(done, &st) == 0)
        return 0;
    double t = lora_clock_mono();
    if (lora_synthetic_model_write(dir, &o, err, err_len) < 0)
        return -1;
    for (int i = 0; i < N_ADAPTERS; i++) {
        struct lora_synthetic_adapter_opts a;
        char adir[700];
        lora_synthetic_adapter_defaults(&a);
        a.rank = 16;
        a.dtype = LORA_DTYPE_BF16;
        a.seed = 100 + (uint64_t)i;
        snprintf(adir, sizeof(adir), "%s/adapter-%d", dir, i);
        if (lora_synthetic_adapter_write(adir, dir, &a, err, err_len) < 0)
            return -1;
    }
    FILE *f = fopen(done, "w");
    if (f)
        fclose(f);
    printf("generated %s in %s in %.1f s\n", name, dir, lora_clock_mono() - t);
    return 0;
}

static int run_shape(const char *cache, const char *name, double bw)
{
    char dir[512], err[1024];
    struct shape sh = {name, NULL, {NULL}};

    if (prepare(cache, name, dir, sizeof(dir), err, sizeof(err)) < 0)
        return fail(name, err);
    double t = lora_clock_mono();
    sh.m = lora_model_load(be, dir, 0, 1, NULL, err, sizeof(err));
    if (!sh.m)
        return fail(name, err);
    for (int i = 0; i < N_ADAPTERS; i++) {
        char adir[700];
        snprintf(adir, sizeof(adir), "%s/adapter-%d", dir, i);
        sh.ad[i] = lora_adapter_load(adir, sh.m, 16, err, sizeof(err));
        if (!sh.ad[i])
            return fail(adir, err);
    }
    const struct lora_model_config *c = &sh.m->cfg;
    printf("\n%s: hidden %d, layers %d, heads %d/%d, intermediate %d, vocab %d; %.2f GB of %s "
           "weights, loaded in %.1f s\n",
           name, c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads, c->intermediate_size,
           c->vocab_size, sh.m->weight_bytes / 1e9, lora_dtype_name(sh.m->weight_dtype),
           lora_clock_mono() - t);
    decode_tps(&sh, 1, 0, false); /* warm: cuBLAS's first calls, the caches */
    static const int batches[] = {1, 8, 64};
    double bound = bw / sh.m->weight_bytes;
    printf("  decode tokens/s (16-token prompts, 32 new tokens, bf16 KV cache), bound at batch 1 "
           "= bandwidth / weight bytes = %.0f:\n",
           bound);
    printf("    %-8s %10s %10s %10s\n", "matmul", "batch 1", "batch 8", "batch 64");
    for (int fast = 0; fast < 2; fast++) {
        double tps[3];
        for (int k = 0; k < 3; k++)
            tps[k] = decode_tps(&sh, batches[k], 0, fast);
        printf("    %-8s %10.1f %10.1f %10.1f   (batch 1: %.0f%% of the bound)\n",
               fast ? "fast" : "exact", tps[0], tps[1], tps[2], 100 * tps[0] / bound);
    }
    double base = decode_tps(&sh, 64, 0, false);
    printf("  batch 64, N distinct rank-16 adapters (all seven projections), round-robin, exact: "
           "tokens/s and cost against the base model (%.1f):\n   ",
           base);
    static const int counts[] = {1, 2, 4, 8};
    for (int k = 0; k < 4; k++) {
        double tps = decode_tps(&sh, 64, counts[k], false);
        printf("  N=%d %.1f (%+.1f%%)", counts[k], tps, 100 * (base / tps - 1));
    }
    printf("\n");
    for (int i = 0; i < N_ADAPTERS; i++)
        lora_adapter_destroy(&sh.ad[i]);
    lora_model_destroy(&sh.m);
    return 0;
}

int main(int argc, char **argv)
{
    char shapes[128] = "0.5b", err[512];
    const char *cache = getenv("LORA_BENCH_CACHE");
    bool quick = false;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shapes") == 0 && i + 1 < argc)
            snprintf(shapes, sizeof(shapes), "%s", argv[++i]);
        else if (strcmp(argv[i], "--cache") == 0 && i + 1 < argc)
            cache = argv[++i];
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                 atoi(argv[i + 1]) <= MAX_ROUNDS)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else {
            fprintf(stderr, "usage: bench_cuda [--shapes 0.5b,7b] [--cache DIR] [--rounds N] "
                            "[--quick]\n");
            return 100;
        }
    }
    if (!cache || !*cache)
        cache = "/tmp/lora-bench-cache";
    be = lora_backend_open("cuda", err, sizeof(err));
    if (!be) {
        printf("bench_cuda: skipped: no CUDA device: %s\n", err);
        return 0;
    }
    if (quick) {
        snprintf(shapes, sizeof(shapes), "quick");
        rounds = 1;
    }
    for (int i = 0; i < 64; i++)
        prompt[i] = 1 + (i * 37) % 250;
    printf("backend: %s\n", be->description);
    double bw = device_bandwidth(quick ? (1 << 16) : (size_t)64 << 20);
    printf("device streaming bandwidth (y += x over %s): %.0f GB/s\n", quick ? "768 KB" : "768 MB",
           bw / 1e9);

    /* Shrink and expand alone: decode-like (64 rows, 8 adapters) and larger (256 rows, 32
     * adapters of rank 64), bytes of the adapters read per call. */
    static const int cases[][5] = {{64, 8, 16, 896, 4864},
                                   {64, 8, 16, 4864, 896},
                                   {64, 8, 16, 3584, 18944},
                                   {256, 32, 64, 4096, 4096}};
    printf("lora_sgmv (shrink + expand, bf16 slots), adapters' bytes per call / time:\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const int *c = cases[i];
        double bytes,
            us = sgmv_time(c[0], c[1], c[2], quick ? 64 : c[3], quick ? 64 : c[4], &bytes);
        printf("  rows %3d, %2d adapters of rank %2d, %5d -> %5d: %7.1f us, %6.1f GB/s (%4.1f%% of "
               "the bandwidth)\n",
               c[0], c[1], c[2], quick ? 64 : c[3], quick ? 64 : c[4], us, bytes / us / 1e3,
               100 * bytes / (us * 1e-6) / bw);
    }
    for (char *s = strtok(shapes, ","); s; s = strtok(NULL, ",")) {
        int rc = run_shape(cache, s, bw);
        if (rc)
            return rc;
    }
    lora_backend_close(&be);
    return 0;
}
