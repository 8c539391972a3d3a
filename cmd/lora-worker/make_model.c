/* lora-worker make-model / make-adapter / demo-model: write deterministic random models and PEFT
 * adapters in the Hugging Face layout (lib/runtime/synthetic.h), for tests, benchmarks and demos. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli.h"
#include "runtime/demo_model.h"
#include "runtime/synthetic.h"
#include "worker.h"

static int parse_dtype(const char *s, enum lora_dtype *dt)
{
    if (strcmp(s, "f32") == 0)
        *dt = LORA_DTYPE_F32;
    else if (strcmp(s, "bf16") == 0)
        *dt = LORA_DTYPE_BF16;
    else if (strcmp(s, "f16") == 0)
        *dt = LORA_DTYPE_F16;
    else
        return -1;
    return 0;
}

static int parse_arch(const char *s, enum lora_arch *arch)
{
    static const char *short_names[] = {"llama", "mistral", "qwen2"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(s, short_names[i]) == 0 || strcmp(s, lora_arch_name(i)) == 0) {
            *arch = i;
            return 0;
        }
    }
    return -1;
}

int cmd_make_model(int argc, char **argv)
{
    const char *out = NULL, *arch = "llama", *dtype = "f32";
    long hidden = 64, layers = 2, heads = 4, kv_heads = 2, inter = 128, vocab = 320, head_dim = 0;
    long shards = 1, seed = 1, max_pos = 4096;
    double theta = 10000;
    bool tied = false, help = false;
    const struct lora_cli_opt options[] = {
        {"out", LORA_OPT_STRING, &out, "DIR", "directory to write (created)"},
        {"arch", LORA_OPT_STRING, &arch, "NAME", "llama, mistral or qwen2 (default llama)"},
        {"hidden", LORA_OPT_INT, &hidden, "N", "hidden size (default 64)", 2, 1 << 16},
        {"layers", LORA_OPT_INT, &layers, "N", "layers (default 2)", 1, 1024},
        {"heads", LORA_OPT_INT, &heads, "N", "attention heads (default 4)", 1, 1024},
        {"kv-heads", LORA_OPT_INT, &kv_heads, "N", "key/value heads (default 2)", 1, 1024},
        {"intermediate", LORA_OPT_INT, &inter, "N", "MLP width (default 128)", 1, 1 << 18},
        {"vocab", LORA_OPT_INT, &vocab, "N", "vocabulary (default 320, at least 258)", 258,
         1 << 22},
        {"head-dim", LORA_OPT_INT, &head_dim, "N", "head size (default hidden/heads)", 0, 4096},
        {"max-position-embeddings", LORA_OPT_INT, &max_pos, "N", "context length (default 4096)",
         1, 1 << 22},
        {"rope-theta", LORA_OPT_FLOAT, &theta, "X", "rotary base (default 10000)", 1, 1e9},
        {"tied", LORA_OPT_FLAG, &tied, NULL, "tie the LM head to the embedding"},
        {"dtype", LORA_OPT_STRING, &dtype, "T", "f32, bf16 or f16 on disk (default f32)"},
        {"shards", LORA_OPT_INT, &shards, "N", "number of safetensors files (default 1)", 1, 999},
        {"seed", LORA_OPT_INT, &seed, "S", "random seed (default 1)", 0, 9e15},
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {0},
    };
    char err[1024] = "";
    struct lora_synthetic_model_opts mo;

    lora_synthetic_model_defaults(&mo);
    if (lora_cli_parse(options, "LORA_WORKER", argc, argv, 1, err, sizeof(err)) < 0)
        ;
    else if (!help && !out)
        snprintf(err, sizeof(err), "make-model needs --out DIR");
    else if (parse_arch(arch, &mo.arch) < 0)
        snprintf(err, sizeof(err), "--arch '%s' must be llama, mistral or qwen2", arch);
    else if (parse_dtype(dtype, &mo.dtype) < 0)
        snprintf(err, sizeof(err), "--dtype '%s' must be f32, bf16 or f16", dtype);
    if (*err) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-worker make-model --out DIR [OPTIONS]\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    mo.hidden_size = (int)hidden;
    mo.n_layers = (int)layers;
    mo.n_heads = (int)heads;
    mo.n_kv_heads = (int)kv_heads;
    mo.intermediate_size = (int)inter;
    mo.vocab_size = (int)vocab;
    mo.head_dim = (int)head_dim;
    mo.max_position_embeddings = (int)max_pos;
    mo.rope_theta = (float)theta;
    mo.tie_word_embeddings = tied;
    mo.n_shards = (int)shards;
    mo.seed = (uint64_t)seed;
    if (lora_synthetic_model_write(out, &mo, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_BAD_INPUT;
    }
    return 0;
}

static int parse_targets(const char *s, unsigned *mask)
{
    char *buf = strdup(s), *save;
    int rc = buf ? 0 : -1;

    *mask = 0;
    for (char *tok = buf ? strtok_r(buf, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
        int p = lora_proj_from_name(tok);
        if (p < 0)
            rc = -1;
        else
            *mask |= 1u << p;
    }
    free(buf);
    return rc == 0 && *mask ? 0 : -1;
}

int cmd_make_adapter(int argc, char **argv)
{
    const char *out = NULL, *model = NULL, *targets = "q,k,v,o,gate,up,down", *dtype = "f32";
    long rank = 8, seed = 1;
    double alpha = -1;
    bool rslora = false, help = false;
    const struct lora_cli_opt options[] = {
        {"model", LORA_OPT_STRING, &model, "DIR", "base model directory"},
        {"out", LORA_OPT_STRING, &out, "DIR", "directory to write (created)"},
        {"rank", LORA_OPT_INT, &rank, "R", "LoRA rank (default 8)", 1, 4096},
        {"alpha", LORA_OPT_FLOAT, &alpha, "A", "lora_alpha (default 2 * rank)", 0, 1e6},
        {"rslora", LORA_OPT_FLAG, &rslora, NULL, "scale by alpha/sqrt(r) instead of alpha/r"},
        {"targets", LORA_OPT_STRING, &targets, "LIST", "projections, e.g. q,v,down (default all)"},
        {"dtype", LORA_OPT_STRING, &dtype, "T", "f32, bf16 or f16 on disk (default f32)"},
        {"seed", LORA_OPT_INT, &seed, "S", "random seed (default 1)", 0, 9e15},
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {0},
    };
    char err[1024] = "";
    struct lora_synthetic_adapter_opts ao;

    lora_synthetic_adapter_defaults(&ao);
    if (lora_cli_parse(options, "LORA_WORKER", argc, argv, 1, err, sizeof(err)) < 0)
        ;
    else if (!help && (!out || !model))
        snprintf(err, sizeof(err), "make-adapter needs --model DIR and --out DIR");
    else if (parse_targets(targets, &ao.target_mask) < 0)
        snprintf(err, sizeof(err), "--targets '%.200s' must list q, k, v, o, gate, up, down",
                 targets);
    else if (parse_dtype(dtype, &ao.dtype) < 0)
        snprintf(err, sizeof(err), "--dtype '%s' must be f32, bf16 or f16", dtype);
    if (*err) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-worker make-adapter --model DIR --out DIR [OPTIONS]\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    ao.rank = (int)rank;
    ao.alpha = alpha < 0 ? 2.0f * (float)rank : (float)alpha;
    ao.use_rslora = rslora;
    ao.seed = (uint64_t)seed;
    if (lora_synthetic_adapter_write(out, model, &ao, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_BAD_INPUT;
    }
    return 0;
}

int cmd_demo_model(int argc, char **argv)
{
    bool help = false;
    const struct lora_cli_opt options[] = {
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {0},
    };
    char err[1024] = "", dir[4096];

    if (lora_cli_parse(options, "LORA_WORKER", argc, argv, 1, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-worker demo-model\n\nWrites the demo model and its adapters once (see "
             "LORA_DEMO_DIR) and prints its directory.\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    if (lora_demo_model_ensure(dir, sizeof(dir), err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-worker: fatal: %s\n", err);
        return EXIT_SYSTEM;
    }
    puts(dir);
    return 0;
}
