/* bench_model: the runtime on the CPU backend, on a model with the shape of a 0.5B Llama
 * (Qwen2-0.5B's dimensions), in every precision it serves, against the machine's bounds: decode
 * against the read bandwidth over the bytes of weights a token reads, prefill against the cores'
 * FMA peak, the cost of several LoRA adapters in one batch against its byte floor. Every figure is
 * measured in this run: the precisions are loaded together and timed in interleaved rounds (the
 * order rotating), so the machine's noise hits each alike; medians are printed.
 *
 *   build/main/tests/bench/bench_model [--model DIR] [--quick] [--only SECTION]
 *                                      [--precisions LIST] [--rounds N]
 *
 * SECTION is one of decode, batch, adapters, prefill, context, matmul (default: all of them).
 * LIST is comma-separated from float32, bfloat16, bfloat16-fast, float16, int8 (default float32,
 * bfloat16, bfloat16-fast, int8). Without --model it generates the model (bfloat16, tied
 * embeddings) and eight rank-16 adapters over all seven projections into a temporary directory,
 * and removes them afterwards; with --model the adapters are generated for that model. The
 * context section decodes after a prompt of 4,064 tokens with the KV cache in float32 and in
 * bfloat16: each of its runs prefills that prompt first, so it takes minutes.
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
#include "runtime/precision.h"
#include "runtime/synthetic.h"
#include "tests/common/bench_machine.h"
#include "tests/common/median.h"

#define N_ADAPTERS 8
#define MAX_VARIANTS 5

#define REPEATS 3
/* New tokens of a single-sequence decode run: enough that a run outlasts the probes around it. */
#define DECODE_TOKENS 32
/* The longest prompt: the context section's, which decodes DECODE_TOKENS more up to the
 * generated model's 4096 positions. */
#define MAX_PROMPT (4096 - DECODE_TOKENS)

static int fail(const char *what, const char *err)
{
    fprintf(stderr, "bench: fatal: %s: %s\n", what, err);
    return 111;
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
    double ours = median(t_ours, REPEATS), blas = median(t_blas, REPEATS);
    printf("  matmul m=%-4d n=%-6d k=%-5d ours %8.3f ms  openblas %8.3f ms  ours/openblas %.2f\n",
           m, n, k, ours * 1e3, blas * 1e3, ours / blas);
    be->ops->buffer_free(be, wb);
    free(x);
    free(w);
    free(y);
}

/* One precision: its model and adapters, loaded once. */
struct variant {
    const char *name;
    struct lora_precision prec;
    struct lora_model *m;
    struct lora_adapter *ad[N_ADAPTERS];
    enum lora_dtype kv, lora;
    double load_seconds;
    double rss_gb; /* the process's resident memory gained by loading and one decode */
};

struct bench {
    struct lora_backend *be;
    struct variant v[MAX_VARIANTS];
    int n_variants;
    int rounds;
    int prompt[MAX_PROMPT];
    int n_prompt;
    int max_tokens;
};

/* Resident memory of this process in GB (VmRSS). */
static double rss_gb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;

    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %lf kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb / 1e6;
}

/* The cores' float32 FMA peak in FLOP/s, at the backend's vector width. */
static double fma_peak(void)
{
    bool wide = __builtin_cpu_supports("avx512f") && !getenv("LORA_NO_AVX512");
    return 1e9 * (wide ? fma_peak_512(20000000) : fma_peak_256(20000000));
}

/* Runs batch requests of n_prompt tokens and max_tokens new ones on variant v, adapters
 * round-robin over n_adapters (0: base model). Returns the run's statistics. */
static struct lora_generate_stats run(struct bench *b, struct variant *v, int batch,
                                      int n_adapters, int n_prompt, int max_tokens)
{
    struct lora_generate_request *reqs = calloc((size_t)batch, sizeof(*reqs));
    struct lora_generate_opts o = {.max_batched_tokens = 4096, .block_size = 16,
                                   .kv_dtype = v->kv, .lora_dtype = v->lora};
    struct lora_generate_stats st;
    char err[512];

    b->be->fast_matmul = v->prec.fast_matmul;
    for (int i = 0; i < batch; i++) {
        reqs[i].prompt = b->prompt;
        reqs[i].n_prompt = n_prompt;
        reqs[i].max_tokens = max_tokens;
        reqs[i].adapter_slot = n_adapters ? i % n_adapters : -1;
        reqs[i].ignore_eos = true;
        reqs[i].seed = (uint64_t)i;
    }
    if (lora_generate_run(v->m, (const struct lora_adapter *const *)v->ad, n_adapters, reqs,
                          batch, &o, &st, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench: fatal: %s: %s\n", v->name, err);
        exit(111);
    }
    for (int i = 0; i < batch; i++)
        lora_generate_request_release(&reqs[i]);
    free(reqs);
    return st;
}

/* Decode tokens per second of every variant at batch size batch (adapters: n_adapters),
 * medians of interleaved rounds into tps[variant]. With a probe buffer (read_probe_alloc's,
 * PROBE_BYTES) each run sits between two read-bandwidth probes of its own: a run's bound is the
 * mean of its two probes' bandwidths over the weight bytes per token, bound[variant] the median
 * of those bounds and pct[variant] the median of each run's tokens/s against its own bound.
 * This machine's bandwidth moves by tens of percent within a minute, so a bound measured once,
 * away from the runs, says more about the moment it was taken than about the kernels; a run of
 * the 7B shape lasts seconds, and one probe before it would miss a move during it. */
#define PROBE_BYTES ((size_t)512 << 20)

/* Round r of decode_rounds: every variant once, in an order rotated by r, into column r of t
 * (tokens/s), bd (bound) and p (percent of it). */
static void decode_round(struct bench *b, int r, int batch, int n_adapters, const float *probe,
                         double t[][16], double bd[][16], double p[][16])
{
    for (int k = 0; k < b->n_variants; k++) {
        int i = (k + r) % b->n_variants;
        double before = probe ? read_bandwidth_of(probe, PROBE_BYTES, 4) : 0;
        struct lora_generate_stats st =
            run(b, &b->v[i], batch, n_adapters, b->n_prompt, b->max_tokens);
        double after = probe ? read_bandwidth_of(probe, PROBE_BYTES, 4) : 0;
        t[i][r] = st.n_decode_tokens / st.decode_seconds;
        bd[i][r] = probe ? (before + after) / 2 / b->v[i].m->weight_bytes : 1;
        p[i][r] = 100 * t[i][r] / bd[i][r];
    }
}

static void decode_rounds(struct bench *b, int batch, int n_adapters, const float *probe,
                          double *tps, double *bound, double *pct)
{
    double t[MAX_VARIANTS][16], bd[MAX_VARIANTS][16], p[MAX_VARIANTS][16];

    for (int r = 0; r < b->rounds; r++)
        decode_round(b, r, batch, n_adapters, probe, t, bd, p);
    for (int i = 0; i < b->n_variants; i++) {
        double *of[] = {t[i], bd[i], p[i]}, *to[] = {tps, bound, pct};
        for (int j = 0; j < 3; j++) {
            double m = median(of[j], b->rounds);
            if (to[j])
                to[j][i] = m;
        }
    }
}

static int load_variant(struct bench *b, struct variant *v, const char *model_dir,
                        const char *adapter_root, char *err, size_t err_len)
{
    double rss0 = rss_gb(), t = lora_clock_mono();

    v->m = lora_model_load(b->be, model_dir, 0, 1, &v->prec, err, err_len);
    if (!v->m)
        return -1;
    v->load_seconds = lora_clock_mono() - t;
    if (lora_precision_kv(&v->prec, b->be, &v->kv, err, err_len) < 0 ||
        lora_precision_lora(&v->prec, b->be, v->m->base_dtype, &v->lora, err, err_len) < 0)
        return -1;
    for (int i = 0; i < N_ADAPTERS; i++) {
        char adir[300];
        snprintf(adir, sizeof(adir), "%s/adapter-%d", adapter_root, i);
        v->ad[i] = lora_adapter_load(adir, v->m, 64, err, err_len);
        if (!v->ad[i])
            return -1;
    }
    run(b, v, 1, 0, b->n_prompt, 2); /* touches every weight once */
    v->rss_gb = rss_gb() - rss0;
    return 0;
}

static void parse_variant(struct variant *v, const char *name)
{
    const char *dtype = name, *mode = NULL, *quant = NULL;
    char err[256];

    if (strcmp(name, "bfloat16-fast") == 0) {
        dtype = "bfloat16";
        mode = "fast";
    } else if (strcmp(name, "int8") == 0) {
        dtype = NULL;
        quant = "int8";
    }
    lora_precision_defaults(&v->prec);
    v->name = name;
    if (lora_precision_parse(&v->prec, dtype, quant, NULL, NULL, mode, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_model: --precisions: %s\n", err);
        exit(100);
    }
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *only = NULL;
    char precisions[256] = "float32,bfloat16,bfloat16-fast,int8";
    bool quick = false;
    char tmp[] = "/tmp/lora-bench-XXXXXX", err[1024], path[256];
    struct bench b = {.n_prompt = 16, .max_tokens = 16, .rounds = 4};

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model_dir = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--precisions") == 0 && i + 1 < argc)
            snprintf(precisions, sizeof(precisions), "%s", argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                 atoi(argv[i + 1]) <= 16)
            b.rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_model [--model DIR] [--quick] [--only SECTION] "
                            "[--precisions LIST] [--rounds N]\n");
            return 100;
        }
    }
    for (char *s = strtok(precisions, ","); s && b.n_variants < MAX_VARIANTS; s = strtok(NULL, ","))
        parse_variant(&b.v[b.n_variants++], s);
    if (quick)
        b.rounds = 1;
    if (!mkdtemp(tmp))
        return fail("mkdtemp", "unable to create a temporary directory");
    struct lora_synthetic_model_opts mo;
    lora_synthetic_model_defaults(&mo);
    mo.dtype = LORA_DTYPE_BF16;
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
    for (int i = 0; i < N_ADAPTERS; i++) {
        char adir[300];
        struct lora_synthetic_adapter_opts ao;
        lora_synthetic_adapter_defaults(&ao);
        ao.rank = 16;
        ao.seed = 100 + (uint64_t)i;
        snprintf(adir, sizeof(adir), "%s/adapter-%d", tmp, i);
        if (lora_synthetic_adapter_write(adir, model_dir, &ao, err, sizeof(err)) < 0)
            return fail("generating an adapter", err);
    }
    for (int i = 0; i < b.n_prompt; i++)
        b.prompt[i] = 1 + i * 7;
    for (int i = b.n_prompt; i < MAX_PROMPT; i++)
        b.prompt[i] = 1 + (i * 37) % 250;
    b.be = lora_backend_open("cpu", err, sizeof(err));
    if (!b.be)
        return fail("opening the cpu backend", err);
    printf("backend: %s\n", b.be->description);

    for (int i = 0; i < b.n_variants; i++)
        if (load_variant(&b, &b.v[i], model_dir, tmp, err, sizeof(err)) < 0)
            return fail(b.v[i].name, err);
    const struct lora_model_config *c = &b.v[0].m->cfg;
    printf("model: hidden %d, layers %d, heads %d/%d, intermediate %d, vocab %d, %s embeddings; "
           "threads %d; %d rounds, order rotated\n",
           c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads, c->intermediate_size,
           c->vocab_size, c->tie_word_embeddings ? "tied" : "untied", omp_get_max_threads(),
           b.rounds);
    printf("\n%-14s %11s %9s %12s %12s %9s\n", "precision", "weights", "load", "resident",
           "adapter", "KV cache");
    for (int i = 0; i < b.n_variants; i++) {
        struct variant *v = &b.v[i];
        printf("%-14s %8.3f GB %7.2f s %9.3f GB %9.1f MB %9s\n", v->name, v->m->weight_bytes / 1e9,
               v->load_seconds, v->rss_gb,
               v->ad[0]->bytes / 1e6 * lora_dtype_size(v->lora) / sizeof(float),
               lora_precision_name(v->kv));
    }

#define SECTION(name) (!only || strcmp(only, name) == 0)
    double tps[MAX_VARIANTS];
    if (SECTION("decode")) {
        float *probe = read_probe_alloc(PROBE_BYTES);
        double bound[MAX_VARIANTS], pct[MAX_VARIANTS];
        b.max_tokens = DECODE_TOKENS;
        decode_rounds(&b, 1, 0, probe, tps, bound, pct);
        b.max_tokens = 16;
        free(probe);
        printf(
            "\nsingle-sequence decode, %d new tokens (bound = read bandwidth / weight bytes per "
            "token, from the mean of a probe just before and one just after each run; medians of "
            "the bounds and of each run's share of its own):\n",
            DECODE_TOKENS);
        for (int i = 0; i < b.n_variants; i++)
            printf("  %-14s %7.2f tokens/s  bound %7.2f (%.2f GB/s)  %3.0f%% of it  %.2fx %s\n",
                   b.v[i].name, tps[i], bound[i], bound[i] * b.v[i].m->weight_bytes / 1e9, pct[i],
                   tps[i] / tps[0], b.v[0].name);
    }
    if (SECTION("batch")) {
        int batches[] = {8, 32, 64};
        printf("\nbatched decode (prompt %d, %d new tokens each, base model), tokens/s:\n",
               b.n_prompt, b.max_tokens);
        printf("  %-14s", "batch");
        for (int k = 0; k < 3; k++)
            printf(" %9d", batches[k]);
        printf("\n");
        double all[3][MAX_VARIANTS];
        for (int k = 0; k < 3; k++)
            decode_rounds(&b, batches[k], 0, NULL, all[k], NULL, NULL);
        for (int i = 0; i < b.n_variants; i++) {
            printf("  %-14s", b.v[i].name);
            for (int k = 0; k < 3; k++)
                printf(" %9.1f", all[k][i]);
            printf("\n");
        }
    }
    if (SECTION("adapters")) {
        /* Time per token at batch 32 with N distinct adapters against N = 1; the floor is what
         * the extra adapters' bytes cost if a step were bound by reading its bytes. */
        int counts[] = {1, 2, 4, 8};
        double per[4][MAX_VARIANTS], t[4][MAX_VARIANTS][16], bd[MAX_VARIANTS][16],
            p[MAX_VARIANTS][16];
        b.max_tokens = 24;
        /* Each round runs every N, in an order rotated by the round, so that the machine's
         * drift over the section falls on every N alike (N after N, it fell on the ratios). */
        for (int r = 0; r < b.rounds; r++)
            for (int j = 0; j < 4; j++)
                decode_round(&b, r, 32, counts[(j + r) % 4], NULL, t[(j + r) % 4], bd, p);
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < b.n_variants; i++)
                per[k][i] = 1 / median(t[k][i], b.rounds);
        b.max_tokens = 16;
        printf("\nbatch 32, N distinct rank-16 adapters (all seven projections), round-robin: "
               "time per token against N = 1, and its byte floor (N-1) x adapter bytes / bytes "
               "per step:\n");
        for (int i = 0; i < b.n_variants; i++) {
            struct variant *v = &b.v[i];
            double ad = v->ad[0]->bytes * (double)lora_dtype_size(v->lora) / sizeof(float);
            printf("  %-14s", v->name);
            for (int k = 1; k < 4; k++) {
                double floor = (counts[k] - 1) * ad / (v->m->weight_bytes + ad);
                double over = per[k][i] / per[0][i] - 1;
                printf("  N=%d %+5.1f%% (floor %+4.1f%%, %.2fx)", counts[k], 100 * over,
                       100 * floor, (1 + over) / (1 + floor));
            }
            printf("\n");
        }
    }
    if (SECTION("prefill")) {
        int n = quick ? 32 : 256;
        double peak = fma_peak(), t[MAX_VARIANTS][16];
        for (int r = 0; r < b.rounds; r++)
            for (int k = 0; k < b.n_variants; k++) {
                int i = (k + r) % b.n_variants;
                struct lora_generate_stats st = run(&b, &b.v[i], 1, 0, n, 1);
                t[i][r] = st.n_step_tokens_prefill / st.prefill_seconds;
            }
        /* 2 flops per weight per token in the projections, plus the attention's q·k and p·v,
         * plus the LM head once per prompt: prefill computes the logits of the last position
         * only (the embedding lookup reads one row). */
        int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
        double params = (double)c->n_layers * ((double)c->hidden_size * (2.0 * q + 2.0 * kv) +
                                               3.0 * c->hidden_size * c->intermediate_size) +
                        (double)c->vocab_size * c->hidden_size / n;
        double attn = 2.0 * c->n_layers * q * (n + 1.0) / 2 * 2;
        /* Each precision against the peak of the instruction its matmuls run on, where the
         * backend names it: the bf16 dot (fast), VNNI (int8); else the float32 FMA. */
        const char *paths = b.be->description;
        double dot_peak = strstr(paths, "BF16 dot") ? 1e9 * dot_bf16_peak(20000000) : 0;
        double i8_peak = strstr(paths, "VNNI int8") ? 1e9 * dot_i8_peak(20000000) : 0;
        printf("\nprefill of a %d-token prompt (%.2f GFLOP per token; peaks on %d threads: float32 "
               "FMA %.1f GFLOP/s",
               n, (2 * params + attn) / 1e9, omp_get_max_threads(), peak / 1e9);
        if (dot_peak > 0)
            printf(", bf16 dot %.1f GFLOP/s", dot_peak / 1e9);
        if (i8_peak > 0)
            printf(", VNNI %.1f GOP/s", i8_peak / 1e9);
        printf("):\n");
        for (int i = 0; i < b.n_variants; i++) {
            double tok = median(t[i], b.rounds), rate = tok * (2 * params + attn);
            enum bench_peak on = bench_peak_of(paths, strcmp(b.v[i].name, "bfloat16-fast") == 0,
                                               strcmp(b.v[i].name, "int8") == 0);
            double bound = (double[]){peak, dot_peak, i8_peak, 0}[on];
            const char *of = (const char *[]){"FMA", "bf16 dot", "VNNI", ""}[on];
            if (bound > 0)
                printf("  %-14s %8.1f tokens/s  %6.1f GFLOP/s  %3.0f%% of the %s peak\n",
                       b.v[i].name, tok, rate / 1e9, 100 * rate / bound, of);
            else
                printf("  %-14s %8.1f tokens/s  %6.1f GFLOP/s\n", b.v[i].name, tok, rate / 1e9);
        }
    }
    if (SECTION("context")) {
        /* The KV cache's dtype where it weighs: a long context, whose keys and values every
         * decoded token reads in each layer next to the weights. */
        int n = quick ? 64 : MAX_PROMPT, kv_row = 2 * c->n_layers * c->n_kv_heads * c->head_dim;
        enum lora_dtype kvs[] = {LORA_DTYPE_F32, LORA_DTYPE_BF16};
        double t[MAX_VARIANTS][2][16];
        b.max_tokens = DECODE_TOKENS;
        for (int r = 0; r < b.rounds; r++)
            for (int k = 0; k < 2 * b.n_variants; k++) {
                int i = (k / 2 + r) % b.n_variants, d = (k + r) % 2;
                enum lora_dtype own = b.v[i].kv;
                b.v[i].kv = kvs[d];
                struct lora_generate_stats st = run(&b, &b.v[i], 1, 0, n, b.max_tokens);
                b.v[i].kv = own;
                t[i][d][r] = st.n_decode_tokens / st.decode_seconds;
            }
        b.max_tokens = 16;
        printf("\nsingle-sequence decode after a %d-token prompt, %d new tokens, KV cache float32 "
               "against bfloat16 (keys and values read per token: %.1f MB and %.1f MB):\n",
               n, DECODE_TOKENS, (double)kv_row * n * 4 / 1e6, (double)kv_row * n * 2 / 1e6);
        for (int i = 0; i < b.n_variants; i++) {
            double f32 = median(t[i][0], b.rounds), bf16 = median(t[i][1], b.rounds);
            printf("  %-14s KV float32 %7.2f tokens/s  KV bfloat16 %7.2f tokens/s  %.3fx  (weights "
                   "%.3f GB a token)\n",
                   b.v[i].name, f32, bf16, bf16 / f32, b.v[i].m->weight_bytes / 1e9);
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

    for (int i = 0; i < b.n_variants; i++) {
        for (int k = 0; k < N_ADAPTERS; k++)
            lora_adapter_destroy(&b.v[i].ad[k]);
        lora_model_destroy(&b.v[i].m);
    }
    lora_backend_close(&b.be);
    lora_fs_remove_tree(tmp);
    return 0;
}
