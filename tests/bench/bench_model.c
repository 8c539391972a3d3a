/* bench_model: decode throughput of the runtime on the CPU backend on a model with the shape of a
 * 0.5B Llama (Qwen2-0.5B's dimensions), against the machine's memory bandwidth, and the cost of
 * serving several LoRA adapters at once. Every figure is measured in this run, side by side.
 *
 *   build/main/tests/bench/bench_model [--model DIR] [--quick] [--only SECTION]
 *
 * SECTION is one of decode, batch, adapters, matmul (default: all of them).
 * Without --model it generates the model (float32, tied embeddings) and eight rank-16 adapters
 * over all seven projections into a temporary directory, and removes them afterwards.
 * --quick uses a small model, to check that the benchmark runs.
 */
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "backend/backend.h"
#include "base/fs.h"
#include "runtime/adapter.h"
#include "runtime/generate.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"
#include "tests/common/bench_memory.h"

#define N_ADAPTERS 8
#define REPEATS    3
#define AD_REPEATS 5

static int fail(const char *what, const char *err)
{
    fprintf(stderr, "bench: fatal: %s: %s\n", what, err);
    return 111;
}

struct bench {
    struct lora_backend *be;
    struct lora_model *m;
    struct lora_adapter *ad[N_ADAPTERS];
    int prompt[64];
    int n_prompt;
    int max_tokens;
};

/* Decodes batch requests, adapters assigned round-robin over n_adapters (0: base model).
 * Returns seconds per decode step. */
static double run_decode(struct bench *b, int batch, int n_adapters, double *tok_per_s)
{
    struct lora_generate_request *reqs = calloc((size_t)batch, sizeof(*reqs));
    struct lora_generate_opts o = {.max_batched_tokens = 4096, .block_size = 16};
    struct lora_generate_stats st;
    char err[512];

    for (int i = 0; i < batch; i++) {
        reqs[i].prompt = b->prompt;
        reqs[i].n_prompt = b->n_prompt;
        reqs[i].max_tokens = b->max_tokens;
        reqs[i].adapter_slot = n_adapters ? i % n_adapters : -1;
        reqs[i].ignore_eos = true;
        reqs[i].seed = (uint64_t)i;
    }
    if (lora_generate_run(b->m, (const struct lora_adapter *const *)b->ad, n_adapters, reqs, batch,
                          &o, &st, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench: fatal: %s\n", err);
        exit(111);
    }
    for (int i = 0; i < batch; i++)
        lora_generate_request_release(&reqs[i]);
    free(reqs);
    *tok_per_s = st.n_decode_tokens / st.decode_seconds;
    return st.decode_seconds / st.n_decode_steps;
}

/* Our batch-invariant matmul (the backend's) against OpenBLAS's sgemm on one projection shape. */
static void matmul_compare(struct lora_backend *be, int m, int n, int k)
{
    float *x = calloc((size_t)m * k, sizeof(float)), *w = calloc((size_t)n * k, sizeof(float));
    float *y = calloc((size_t)m * n, sizeof(float));
    double t_ours[REPEATS], t_blas[REPEATS];

    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < (size_t)m * k; i++)
        x[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    char err[256];
    struct lora_buffer *wb =
        be->ops->buffer_wrap(be, w, (size_t)n * k * sizeof(float), err, sizeof(err));
    if (!wb) {
        fprintf(stderr, "bench: fatal: %s\n", err);
        exit(111);
    }
    struct lora_tensor wt = {wb, 0, LORA_DTYPE_F32, n, k};
    int reps = (int)(2e9 / ((double)m * n * k + 1e6)) + 1;
    for (int r = 0; r < REPEATS; r++) {
        double t = lora_clock_mono();
        for (int i = 0; i < reps; i++)
            be->ops->matmul(be, y, x, &wt, m, 1.0f, false);
        t_ours[r] = (lora_clock_mono() - t) / reps;
        t = lora_clock_mono();
        for (int i = 0; i < reps; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y,
                        n);
        t_blas[r] = (lora_clock_mono() - t) / reps;
    }
    qsort(t_ours, REPEATS, sizeof(double), cmp_double);
    qsort(t_blas, REPEATS, sizeof(double), cmp_double);
    printf("  matmul m=%-4d n=%-6d k=%-5d ours %8.3f ms  openblas %8.3f ms  ours/openblas %.2f\n",
           m, n, k, t_ours[1] * 1e3, t_blas[1] * 1e3, t_ours[1] / t_blas[1]);
    be->ops->buffer_free(be, wb);
    free(x);
    free(w);
    free(y);
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *only = NULL;
    bool quick = false;
    char tmp[] = "/tmp/lora-bench-XXXXXX", err[1024], path[256];
    struct bench b = {.n_prompt = 16, .max_tokens = 16};

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model_dir = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_model [--model DIR] [--quick] [--only SECTION]\n");
            return 100;
        }
    }
    if (!mkdtemp(tmp))
        return fail("mkdtemp", "unable to create a temporary directory");
    struct lora_synthetic_model_opts mo;
    lora_synthetic_model_defaults(&mo);
    if (!quick) {
        /* Qwen2-0.5B's shape, without the q/k/v biases' negligible bytes. */
        mo.hidden_size = 896;
        mo.n_layers = 24;
        mo.n_heads = 14;
        mo.n_kv_heads = 2;
        mo.intermediate_size = 4864;
        mo.vocab_size = 151936;
        mo.tie_word_embeddings = true;
    }
    if (!model_dir) {
        snprintf(path, sizeof(path), "%s/model", tmp);
        double t = lora_clock_mono();
        if (lora_synthetic_model_write(path, &mo, err, sizeof(err)) < 0)
            return fail("generating the model", err);
        printf("generated the model in %.1f s\n", lora_clock_mono() - t);
        model_dir = path;
    }
    b.be = lora_backend_open("cpu", err, sizeof(err));
    if (!b.be)
        return fail("opening the cpu backend", err);
    b.m = lora_model_load(b.be, model_dir, 0, 1, err, sizeof(err));
    if (!b.m)
        return fail("loading the model", err);
    for (int i = 0; i < N_ADAPTERS; i++) {
        char adir[300];
        struct lora_synthetic_adapter_opts ao;
        lora_synthetic_adapter_defaults(&ao);
        ao.rank = 16;
        ao.seed = 100 + (uint64_t)i;
        snprintf(adir, sizeof(adir), "%s/adapter-%d", tmp, i);
        if (lora_synthetic_adapter_write(adir, model_dir, &ao, err, sizeof(err)) < 0)
            return fail("generating an adapter", err);
        b.ad[i] = lora_adapter_load(adir, b.m, 64, err, sizeof(err));
        if (!b.ad[i])
            return fail("loading an adapter", err);
    }
    for (int i = 0; i < b.n_prompt; i++)
        b.prompt[i] = 1 + i * 7;

    const struct lora_model_config *c = &b.m->cfg;
    printf("model: hidden %d, layers %d, heads %d/%d, intermediate %d, vocab %d, %.2f GB of "
           "float32 weights read per step\n",
           c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads, c->intermediate_size,
           c->vocab_size, b.m->weight_bytes / 1e9);
    printf("threads: %d; adapter: rank 16 on all seven projections, %.1f MB each\n",
           omp_get_max_threads(), b.ad[0]->bytes / 1e6);

#define SECTION(name) (!only || strcmp(only, name) == 0)
    double tps, best = 0;
    if (SECTION("decode")) {
        double bw = copy_bandwidth((size_t)1 << 30);
        double rbw = read_bandwidth((size_t)1 << 30);
        double bound = bw / b.m->weight_bytes, rbound = rbw / b.m->weight_bytes;
        printf("\nmemory bandwidth: streaming copy %.2f GB/s (read + write), streaming read "
               "%.2f GB/s\n",
               bw / 1e9, rbw / 1e9);
        printf("decode bound (bandwidth / weight bytes per token): %.2f tokens/s by copy, %.2f "
               "by read\n",
               bound, rbound);

        run_decode(&b, 1, 0, &tps); /* warm the page cache and the threads */
        for (int r = 0; r < REPEATS; r++) {
            run_decode(&b, 1, 0, &tps);
            best = tps > best ? tps : best;
        }
        printf("single-sequence decode: %.2f tokens/s = %.0f%% of the copy bound, %.0f%% of "
               "the read bound\n",
               best, 100 * best / bound, 100 * best / rbound);
    }
    if (SECTION("batch")) {
        printf("\nbatched decode (prompt %d, %d new tokens each, base model):\n", b.n_prompt,
               b.max_tokens);
        int batches[] = {1, 8, 32, 64};
        for (int i = 0; i < 4; i++) {
            double step = run_decode(&b, batches[i], 0, &tps);
            printf("  batch %3d: %8.2f tokens/s, %7.1f ms per step\n", batches[i], tps, step * 1e3);
        }
    }
    if (SECTION("adapters")) {
        /* Interleaved repeats in a rotating order: the machine's noise and any drift hit
         * every configuration alike. N=0 is the base model, for scale. */
        int counts[] = {0, 1, 2, 4, 8};
        double per_tok[5][AD_REPEATS];
        b.max_tokens = 24;
        for (int r = 0; r < AD_REPEATS; r++) {
            for (int k = 0; k < 5; k++) {
                int i = (k + r) % 5;
                per_tok[i][r] = run_decode(&b, 32, counts[i], &tps) / 32;
            }
        }
        printf("\nbatch 32, time per token with N distinct rank-16 adapters, round-robin "
               "(median of %d):\n",
               AD_REPEATS);
        for (int i = 0; i < 5; i++)
            qsort(per_tok[i], AD_REPEATS, sizeof(double), cmp_double);
        for (int i = 0; i < 5; i++) {
            double t = per_tok[i][AD_REPEATS / 2], t1 = per_tok[1][AD_REPEATS / 2];
            printf("  %s N=%d: %7.3f ms/token, %+.1f%% against N=1\n", i ? "LoRA," : "base,",
                   counts[i], t * 1e3, 100 * (t / t1 - 1));
        }
    }
    if (SECTION("matmul")) {
        printf("\nmatmul kernel against OpenBLAS sgemm (not batch-invariant), median of %d:\n",
               REPEATS);
        matmul_compare(b.be, 1, c->intermediate_size, c->hidden_size);
        matmul_compare(b.be, 32, c->intermediate_size, c->hidden_size);
        matmul_compare(b.be, 64, c->intermediate_size, c->hidden_size);
        matmul_compare(b.be, 256, c->intermediate_size, c->hidden_size);
    }

    for (int i = 0; i < N_ADAPTERS; i++)
        lora_adapter_destroy(&b.ad[i]);
    lora_model_destroy(&b.m);
    lora_backend_close(&b.be);
    lora_fs_remove_tree(tmp);
    return 0;
}
