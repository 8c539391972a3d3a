/* synthetic: deterministic random models and LoRA adapters in Hugging Face layouts
 * (see synthetic.h).
 *
 * Every tensor's values are a function of (seed, tensor name) only: the tensor is cut into
 * fixed chunks of GEN_CHUNK elements, and chunk c draws from an RNG seeded with
 * seed ^ fnv1a64(name) ^ c * golden. So values do not depend on the shard count, the tensor
 * order or the number of threads that fill them, and chunks fill in parallel.
 *
 * Scales (x is uniform, so std = amp / sqrt(3)):
 *   projections      std 1/sqrt(fan_in): outputs keep the RMS of their normalised input
 *   embed_tokens     std 1, or 2/sqrt(hidden) when it doubles as the LM head
 *   lm_head          std 2/sqrt(hidden): logits of an RMS-normalised state have std about 2,
 *                    informative without being one-hot, and rarely near-tied (a numpy
 *                    forward pass of generated models measured 1.8 to 2.3)
 *   norm weights     1 + uniform(-0.1, 0.1)
 *   q/k/v biases     std 0.1
 *   lora_A           std 1/sqrt(in); lora_B std 0.5/sqrt(rank), non-zero (unlike PEFT's init)
 *                    so that an adapter visibly changes the outputs
 * The JSON files are written first and the weights last, since they are the slow part.
 */
#include "runtime/synthetic.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/errbuf.h"
#include "base/fs.h"
#include "runtime/sampler.h"

#define GEN_CHUNK     ((int64_t)1 << 16)
#define GOLDEN        0x9e3779b97f4a7c15ull
#define MAX_WIDTH     (1 << 20)
#define MAX_LAYERS    1024
#define MAX_HEADS     4096
#define MAX_HEAD_DIM  4096
#define MAX_VOCAB     (1 << 24)
#define MAX_POSITIONS (1 << 24)
#define MAX_SHARDS    99999 /* five digits in the shard file names */
#define MAX_RANK      4096
#define BOS_ID        256
#define EOS_ID        257
/* PEFT's key for layer, parent module, projection and factor (A or B). */
#define ADAPTER_KEY "base_model.model.model.layers.%d.%s.%s.lora_%c.weight"
#define JSON_FLAGS  (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))

static const char *const model_types[] = {
    [LORA_ARCH_LLAMA] = "llama",
    [LORA_ARCH_MISTRAL] = "mistral",
    [LORA_ARCH_QWEN2] = "qwen2",
};

/* ChatML, which lora-frontend recognises and renders. */
static const char chat_template[] =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/* One tensor to generate: values are center + amp * uniform(-1, 1). */
struct gen_tensor {
    char name[128];
    int n_dims;
    int64_t shape[2];
    double center;
    double amp;
    float *data; /* numel floats while the tensor's shard is being written */
};

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Returns dir/name, malloc'ed, or NULL on out-of-memory. */
static char *path_join(const char *dir, const char *name)
{
    char *p;

    if (asprintf(&p, "%s/%s", dir, name) < 0)
        return NULL;
    return p;
}

/* Writes root to dir/name and drops the reference to root. */
static int write_json(json_t *root, const char *dir, const char *name, char *err, size_t err_len)
{
    char *path = path_join(dir, name);
    int rc = -1;

    if (!root || !path) {
        lora_errf(err, err_len, "%s/%s: out of memory", dir, name);
        goto out;
    }
    errno = 0;
    if (json_dump_file(root, path, JSON_FLAGS) != 0) {
        lora_errf(err, err_len, "%s: unable to write: %s", path,
                  errno ? strerror(errno) : "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(path);
    json_decref(root);
    return rc;
}

/* The double nearest to the shortest decimal that reads back as f, so config.json says
 * 1e-06 rather than 9.99999997e-07 for 1e-6f. */
static json_t *json_float(float f)
{
    char buf[32];

    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f)
            return json_real(strtod(buf, NULL));
    }
    return json_real((double)f);
}

static const char *dtype_torch_name(enum lora_dtype dtype)
{
    switch (dtype) {
    case LORA_DTYPE_F16:
        return "float16";
    case LORA_DTYPE_BF16:
        return "bfloat16";
    default:
        return "float32";
    }
}

static bool is_float_dtype(enum lora_dtype dtype)
{
    return dtype == LORA_DTYPE_F32 || dtype == LORA_DTYPE_F16 || dtype == LORA_DTYPE_BF16;
}

/* ---- tensors ------------------------------------------------------------------------------ */

static int64_t tensor_numel(const struct gen_tensor *t)
{
    int64_t n = 1;

    for (int d = 0; d < t->n_dims; d++)
        n *= t->shape[d];
    return n;
}

/* Appends a tensor [rows, cols] (cols 0: a vector [rows]). The caller sized the array. */
static struct gen_tensor *tensor_add(struct gen_tensor *ts, int *n, int64_t rows, int64_t cols,
                                     double center, double amp, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static struct gen_tensor *tensor_add(struct gen_tensor *ts, int *n, int64_t rows, int64_t cols,
                                     double center, double amp, const char *fmt, ...)
{
    struct gen_tensor *t = &ts[(*n)++];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->n_dims = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->center = center;
    t->amp = amp;
    t->data = NULL;
    return t;
}

/* Half-width of a uniform distribution with standard deviation std. */
static double uniform_amp(double std)
{
    return std * sqrt(3.0);
}

static void tensor_fill(struct gen_tensor *t, uint64_t seed)
{
    uint64_t key = seed ^ fnv1a64(t->name);
    int64_t n = tensor_numel(t);
    int64_t n_chunks = (n + GEN_CHUNK - 1) / GEN_CHUNK;
    float *data = t->data;
    double center = t->center, amp = t->amp;

#pragma omp parallel for schedule(dynamic, 4) if (n_chunks > 1)
    for (int64_t c = 0; c < n_chunks; c++) {
        struct lora_rng rng;
        int64_t end = (c + 1) * GEN_CHUNK < n ? (c + 1) * GEN_CHUNK : n;

        lora_rng_seed(&rng, key ^ ((uint64_t)c * GOLDEN));
        for (int64_t i = c * GEN_CHUNK; i < end; i++)
            data[i] = (float)(center + amp * (2.0 * lora_rng_uniform(&rng) - 1.0));
    }
}

static void tensors_free_data(struct gen_tensor *ts, int n)
{
    for (int i = 0; i < n; i++) {
        free(ts[i].data);
        ts[i].data = NULL;
    }
}

/* Generates ts[0 .. n) and writes them to path as dtype. The data is freed again before
 * returning, on every path. */
static int tensors_write(const char *path, struct gen_tensor *ts, int n, enum lora_dtype dtype,
                         uint64_t seed, char *err, size_t err_len)
{
    struct lora_tensor_out *outs = calloc((size_t)n, sizeof(*outs));
    int rc = -1;

    if (!outs) {
        lora_errf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)tensor_numel(&ts[i]) * sizeof(float);

        ts[i].data = malloc(bytes ? bytes : 1);
        if (!ts[i].data) {
            lora_errf(err, err_len, "%s: out of memory for '%s' (%zu bytes)", path, ts[i].name,
                      bytes);
            goto out;
        }
        tensor_fill(&ts[i], seed);
        outs[i].name = ts[i].name;
        outs[i].dtype = dtype;
        outs[i].n_dims = ts[i].n_dims;
        outs[i].shape[0] = ts[i].shape[0];
        outs[i].shape[1] = ts[i].shape[1];
        outs[i].data = ts[i].data;
    }
    rc = lora_safetensors_write(path, outs, n, err, err_len);
out:
    tensors_free_data(ts, n);
    free(outs);
    return rc;
}

/* ---- model -------------------------------------------------------------------------------- */

void lora_synthetic_model_defaults(struct lora_synthetic_model_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->arch = LORA_ARCH_LLAMA;
    o->hidden_size = 64;
    o->intermediate_size = 128;
    o->n_layers = 2;
    o->n_heads = 4;
    o->n_kv_heads = 2;
    o->head_dim = 0;
    o->vocab_size = 320;
    o->max_position_embeddings = 4096;
    o->rms_norm_eps = 1e-6f;
    o->rope_theta = 10000.0f;
    o->tie_word_embeddings = false;
    o->dtype = LORA_DTYPE_F32;
    o->n_shards = 1;
    o->seed = 1;
}

static int check_range(const char *key, long long v, long long lo, long long hi, char *err,
                       size_t err_len)
{
    if (v >= lo && v <= hi)
        return 0;
    lora_errf(err, err_len, "invalid model options: %s %lld is not in %lld..%lld", key, v, lo, hi);
    return -1;
}

/* The same limits lora_model_config_load applies, so a generated model always loads. */
static int validate_model_opts(const struct lora_synthetic_model_opts *o, char *err, size_t err_len)
{
    int hd, n_tensors;

    if (check_range("arch", o->arch, LORA_ARCH_LLAMA, LORA_ARCH_QWEN2, err, err_len) ||
        check_range("hidden_size", o->hidden_size, 1, MAX_WIDTH, err, err_len) ||
        check_range("intermediate_size", o->intermediate_size, 1, MAX_WIDTH, err, err_len) ||
        check_range("n_layers", o->n_layers, 1, MAX_LAYERS, err, err_len) ||
        check_range("n_heads", o->n_heads, 1, MAX_HEADS, err, err_len) ||
        check_range("n_kv_heads", o->n_kv_heads, 1, o->n_heads, err, err_len) ||
        check_range("head_dim", o->head_dim, 0, MAX_HEAD_DIM, err, err_len) ||
        check_range("vocab_size", o->vocab_size, EOS_ID + 1, MAX_VOCAB, err, err_len) ||
        check_range("max_position_embeddings", o->max_position_embeddings, 1, MAX_POSITIONS, err,
                    err_len) ||
        check_range("n_shards", o->n_shards, 1, MAX_SHARDS, err, err_len))
        return -1;
    if (o->n_heads % o->n_kv_heads != 0) {
        lora_errf(err, err_len,
                  "invalid model options: n_heads %d is not divisible by n_kv_heads %d", o->n_heads,
                  o->n_kv_heads);
        return -1;
    }
    if (o->head_dim == 0 && o->hidden_size % o->n_heads != 0) {
        lora_errf(
            err, err_len,
            "invalid model options: hidden_size %d is not divisible by n_heads %d and head_dim "
            "is 0",
            o->hidden_size, o->n_heads);
        return -1;
    }
    n_tensors =
        2 + o->n_layers * (o->arch == LORA_ARCH_QWEN2 ? 12 : 9) + (o->tie_word_embeddings ? 0 : 1);
    if (o->n_shards > n_tensors) {
        lora_errf(err, err_len, "invalid model options: n_shards %d is more than the %d tensors",
                  o->n_shards, n_tensors);
        return -1;
    }
    hd = o->head_dim ? o->head_dim : o->hidden_size / o->n_heads;
    if (hd % 2 != 0 || (long long)hd * o->n_heads > MAX_WIDTH) {
        lora_errf(err, err_len,
                  "invalid model options: head_dim %d must be even and heads * head_dim "
                  "at most 1048576",
                  hd);
        return -1;
    }
    if (!(o->rms_norm_eps > 0.0f) || !isfinite(o->rms_norm_eps) || !(o->rope_theta > 0.0f) ||
        !isfinite(o->rope_theta)) {
        lora_errf(err, err_len,
                  "invalid model options: rms_norm_eps and rope_theta must be positive");
        return -1;
    }
    if (!is_float_dtype(o->dtype)) {
        lora_errf(err, err_len, "invalid model options: dtype must be F32, F16 or BF16");
        return -1;
    }
    return 0;
}

static json_t *model_config_json(const struct lora_synthetic_model_opts *o)
{
    json_t *root = json_object();
    int rc = 0;

    if (!root)
        return NULL;
    rc |= json_object_set_new(root, "architectures", json_pack("[s]", lora_arch_name(o->arch)));
    rc |= json_object_set_new(root, "model_type", json_string(model_types[o->arch]));
    rc |= json_object_set_new(root, "hidden_size", json_integer(o->hidden_size));
    rc |= json_object_set_new(root, "intermediate_size", json_integer(o->intermediate_size));
    rc |= json_object_set_new(root, "num_hidden_layers", json_integer(o->n_layers));
    rc |= json_object_set_new(root, "num_attention_heads", json_integer(o->n_heads));
    rc |= json_object_set_new(root, "num_key_value_heads", json_integer(o->n_kv_heads));
    if (o->head_dim)
        rc |= json_object_set_new(root, "head_dim", json_integer(o->head_dim));
    rc |= json_object_set_new(root, "vocab_size", json_integer(o->vocab_size));
    rc |= json_object_set_new(root, "max_position_embeddings",
                              json_integer(o->max_position_embeddings));
    rc |= json_object_set_new(root, "rms_norm_eps", json_float(o->rms_norm_eps));
    rc |= json_object_set_new(root, "rope_theta", json_float(o->rope_theta));
    rc |= json_object_set_new(root, "tie_word_embeddings", json_boolean(o->tie_word_embeddings));
    rc |= json_object_set_new(root, "bos_token_id", json_integer(BOS_ID));
    rc |= json_object_set_new(root, "eos_token_id", json_integer(EOS_ID));
    rc |= json_object_set_new(root, "torch_dtype", json_string(dtype_torch_name(o->dtype)));
    rc |= json_object_set_new(root, "hidden_act", json_string("silu"));
    if (rc) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others take the code
 * points from U+0100 up, in byte order. Writes the UTF-8 form (at most 2 bytes + NUL). */
static void byte_token(int byte, char out[3])
{
    int cp = byte, n_before = 0;
    bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;

    if (!printable) {
        for (int b = 0; b < byte; b++)
            if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174))
                n_before++;
        cp = 256 + n_before;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

static json_t *added_token(int id, const char *content)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *byte_level(bool add_prefix_space, bool trim_offsets)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                     add_prefix_space, "trim_offsets", trim_offsets, "use_regex", 1);
}

/* The "model" section: a BPE over the 256 byte tokens with no merges. */
static json_t *bpe_model(void)
{
    json_t *model = json_object(), *vocab = json_object();
    char tok[3];
    int rc = model && vocab ? 0 : -1;

    for (int b = 0; b < 256 && rc == 0; b++) {
        byte_token(b, tok);
        rc = json_object_set_new(vocab, tok, json_integer(b));
    }
    if (rc) {
        json_decref(vocab);
        json_decref(model);
        return NULL;
    }
    rc |= json_object_set_new(model, "type", json_string("BPE"));
    rc |= json_object_set_new(model, "dropout", json_null());
    rc |= json_object_set_new(model, "unk_token", json_null());
    rc |= json_object_set_new(model, "continuing_subword_prefix", json_null());
    rc |= json_object_set_new(model, "end_of_word_suffix", json_null());
    rc |= json_object_set_new(model, "fuse_unk", json_false());
    rc |= json_object_set_new(model, "byte_fallback", json_false());
    rc |= json_object_set_new(model, "vocab", vocab);
    rc |= json_object_set_new(model, "merges", json_array());
    if (rc) {
        json_decref(model);
        return NULL;
    }
    return model;
}

static json_t *tokenizer_json(void)
{
    json_t *root = json_object();
    int rc = 0;

    if (!root)
        return NULL;
    rc |= json_object_set_new(root, "version", json_string("1.0"));
    rc |= json_object_set_new(root, "truncation", json_null());
    rc |= json_object_set_new(root, "padding", json_null());
    rc |= json_object_set_new(
        root, "added_tokens",
        json_pack("[o, o]", added_token(BOS_ID, "<s>"), added_token(EOS_ID, "</s>")));
    rc |= json_object_set_new(root, "normalizer", json_null());
    rc |= json_object_set_new(root, "pre_tokenizer", byte_level(false, true));
    rc |= json_object_set_new(root, "post_processor", byte_level(true, false));
    rc |= json_object_set_new(root, "decoder", byte_level(true, true));
    rc |= json_object_set_new(root, "model", bpe_model());
    if (rc) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int write_model_json(const char *dir, const struct lora_synthetic_model_opts *o, char *err,
                            size_t err_len)
{
    if (write_json(model_config_json(o), dir, "config.json", err, err_len) ||
        write_json(json_pack("{s:i, s:i}", "bos_token_id", BOS_ID, "eos_token_id", EOS_ID), dir,
                   "generation_config.json", err, err_len) ||
        write_json(tokenizer_json(), dir, "tokenizer.json", err, err_len) ||
        write_json(json_pack("{s:s, s:s, s:b, s:i, s:s, s:b, s:s}", "bos_token", "<s>", "eos_token",
                             "</s>", "add_bos_token", 1, "model_max_length",
                             o->max_position_embeddings, "tokenizer_class",
                             "PreTrainedTokenizerFast", "clean_up_tokenization_spaces", 0,
                             "chat_template", chat_template),
                   dir, "tokenizer_config.json", err, err_len))
        return -1;
    return 0;
}

/* Number of tensors model_plan() produces. */
static int model_n_tensors(const struct lora_model_config *c)
{
    return 1 + c->n_layers * (c->qkv_bias ? 12 : 9) + 1 + (c->tie_word_embeddings ? 0 : 1);
}

/* Fills ts (model_n_tensors() entries) with the model's tensors in Hugging Face order. */
static int model_plan(const struct lora_model_config *c, struct gen_tensor *ts)
{
    int64_t h = c->hidden_size, inter = c->intermediate_size, vocab = c->vocab_size;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    double head_std = 2.0 / sqrt((double)h);
    double proj_h = uniform_amp(1.0 / sqrt((double)h)), bias = uniform_amp(0.1);
    int n = 0;

    tensor_add(ts, &n, vocab, h, 0.0, uniform_amp(c->tie_word_embeddings ? head_std : 1.0),
               "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layers; l++) {
        const char *pre = "model.layers";

        tensor_add(ts, &n, h, 0, 1.0, 0.1, "%s.%d.input_layernorm.weight", pre, l);
        tensor_add(ts, &n, q, h, 0.0, proj_h, "%s.%d.self_attn.q_proj.weight", pre, l);
        tensor_add(ts, &n, kv, h, 0.0, proj_h, "%s.%d.self_attn.k_proj.weight", pre, l);
        tensor_add(ts, &n, kv, h, 0.0, proj_h, "%s.%d.self_attn.v_proj.weight", pre, l);
        if (c->qkv_bias) {
            tensor_add(ts, &n, q, 0, 0.0, bias, "%s.%d.self_attn.q_proj.bias", pre, l);
            tensor_add(ts, &n, kv, 0, 0.0, bias, "%s.%d.self_attn.k_proj.bias", pre, l);
            tensor_add(ts, &n, kv, 0, 0.0, bias, "%s.%d.self_attn.v_proj.bias", pre, l);
        }
        tensor_add(ts, &n, h, q, 0.0, uniform_amp(1.0 / sqrt((double)q)),
                   "%s.%d.self_attn.o_proj.weight", pre, l);
        tensor_add(ts, &n, h, 0, 1.0, 0.1, "%s.%d.post_attention_layernorm.weight", pre, l);
        tensor_add(ts, &n, inter, h, 0.0, proj_h, "%s.%d.mlp.gate_proj.weight", pre, l);
        tensor_add(ts, &n, inter, h, 0.0, proj_h, "%s.%d.mlp.up_proj.weight", pre, l);
        tensor_add(ts, &n, h, inter, 0.0, uniform_amp(1.0 / sqrt((double)inter)),
                   "%s.%d.mlp.down_proj.weight", pre, l);
    }
    tensor_add(ts, &n, h, 0, 1.0, 0.1, "model.norm.weight");
    if (!c->tie_word_embeddings)
        tensor_add(ts, &n, vocab, h, 0.0, uniform_amp(head_std), "lm_head.weight");
    return n;
}

/* Splits n tensors in order into n_shards runs of roughly equal bytes, none empty
 * (n_shards <= n): a tensor goes to the shard its middle byte falls in, clamped so that no shard
 * is skipped and enough tensors remain for the shards after it. */
static void assign_shards(const struct gen_tensor *ts, int n, int n_shards, size_t elem_bytes,
                          int *shard)
{
    double total = 0.0, before = 0.0;
    int prev = -1;

    for (int i = 0; i < n; i++)
        total += (double)tensor_numel(&ts[i]) * (double)elem_bytes;
    for (int i = 0; i < n; i++) {
        double bytes = (double)tensor_numel(&ts[i]) * (double)elem_bytes;
        double mid = before + bytes / 2.0;
        int s = total > 0.0 ? (int)(mid * n_shards / total) : 0;
        int lo = prev > n_shards - n + i ? prev : n_shards - n + i;

        if (s < lo)
            s = lo;
        if (s > prev + 1)
            s = prev + 1;
        shard[i] = s;
        prev = s;
        before += bytes;
    }
}

static char *shard_name(int k, int n_shards)
{
    char *name;

    if (n_shards == 1)
        return strdup("model.safetensors");
    if (asprintf(&name, "model-%05d-of-%05d.safetensors", k + 1, n_shards) < 0)
        return NULL;
    return name;
}

static json_t *index_json(const struct gen_tensor *ts, int n, const int *shard, int n_shards,
                          size_t elem_bytes)
{
    json_t *map = json_object();
    json_int_t total = 0;

    if (!map)
        return NULL;
    for (int i = 0; i < n; i++) {
        char *name = shard_name(shard[i], n_shards);

        if (!name || json_object_set_new(map, ts[i].name, json_string(name)) != 0) {
            free(name);
            json_decref(map);
            return NULL;
        }
        free(name);
        total += (json_int_t)tensor_numel(&ts[i]) * (json_int_t)elem_bytes;
    }
    return json_pack("{s:{s:I}, s:o}", "metadata", "total_size", total, "weight_map", map);
}

/* Removes a file of the other layout left by an earlier run, so that a loader never finds both
 * model.safetensors and an index. */
static int remove_stale(const char *dir, const char *name, char *err, size_t err_len)
{
    char *path = path_join(dir, name);
    int rc = 0;

    if (!path) {
        lora_errf(err, err_len, "%s/%s: out of memory", dir, name);
        return -1;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        lora_errf(err, err_len, "%s: unable to remove: %s", path, strerror(errno));
        rc = -1;
    }
    free(path);
    return rc;
}

static int write_model_weights(const char *dir, const struct lora_model_config *cfg,
                               const struct lora_synthetic_model_opts *o, char *err, size_t err_len)
{
    int n_max = model_n_tensors(cfg);
    struct gen_tensor *ts = calloc((size_t)n_max, sizeof(*ts));
    int *shard = calloc((size_t)n_max, sizeof(*shard));
    size_t elem_bytes = lora_dtype_size(o->dtype);
    int n, first = 0, rc = -1;

    if (!ts || !shard) {
        lora_errf(err, err_len, "%s: out of memory", dir);
        goto out;
    }
    n = model_plan(cfg, ts);
    if (o->n_shards > n) {
        lora_errf(err, err_len, "invalid model options: n_shards %d is more than the %d tensors",
                  o->n_shards, n);
        goto out;
    }
    assign_shards(ts, n, o->n_shards, elem_bytes, shard);
    for (int k = 0; k < o->n_shards; k++) {
        char *name = shard_name(k, o->n_shards);
        char *path = name ? path_join(dir, name) : NULL;
        int count = 0;
        int wrc;

        while (first + count < n && shard[first + count] == k)
            count++;
        if (!path) {
            free(name);
            lora_errf(err, err_len, "%s: out of memory", dir);
            goto out;
        }
        wrc = tensors_write(path, ts + first, count, o->dtype, o->seed, err, err_len);
        free(path);
        free(name);
        if (wrc)
            goto out;
        first += count;
    }
    if (o->n_shards == 1)
        rc = remove_stale(dir, "model.safetensors.index.json", err, err_len);
    else if (write_json(index_json(ts, n, shard, o->n_shards, elem_bytes), dir,
                        "model.safetensors.index.json", err, err_len) == 0)
        rc = remove_stale(dir, "model.safetensors", err, err_len);
out:
    free(shard);
    free(ts);
    return rc;
}

/* Loads model_dir/config.json into cfg. */
static int load_model_config(const char *model_dir, struct lora_model_config *cfg, char *err,
                             size_t err_len)
{
    char *path = path_join(model_dir, "config.json");
    int rc;

    if (!path) {
        lora_errf(err, err_len, "%s: out of memory", model_dir);
        return -1;
    }
    rc = lora_model_config_load(path, cfg, err, err_len);
    free(path);
    return rc;
}

int lora_synthetic_model_write(const char *dir, const struct lora_synthetic_model_opts *o, char *err,
                         size_t err_len)
{
    struct lora_model_config cfg;

    /* The shapes come from reading back the config just written: the loader's view of the
     * model is the one the weights must match. */
    if (validate_model_opts(o, err, err_len) || lora_fs_mkdir_p(dir, err, err_len) ||
        write_model_json(dir, o, err, err_len) || load_model_config(dir, &cfg, err, err_len))
        return -1;
    return write_model_weights(dir, &cfg, o, err, err_len);
}

/* ---- adapter ------------------------------------------------------------------------------ */

void lora_synthetic_adapter_defaults(struct lora_synthetic_adapter_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->rank = 8;
    o->alpha = 16.0f;
    o->use_rslora = false;
    o->target_mask = (1u << LORA_PROJ_COUNT) - 1;
    o->dtype = LORA_DTYPE_F32;
    o->seed = 1;
}

static int validate_adapter_opts(const struct lora_synthetic_adapter_opts *o, char *err, size_t err_len)
{
    if (o->rank < 1 || o->rank > MAX_RANK) {
        lora_errf(err, err_len, "invalid adapter options: rank %d is not in 1..%d", o->rank,
                  MAX_RANK);
        return -1;
    }
    if (o->target_mask == 0 || (o->target_mask >> LORA_PROJ_COUNT) != 0) {
        lora_errf(err, err_len,
                  "invalid adapter options: target_mask 0x%x must name at least one of the %d "
                  "projections and nothing else",
                  o->target_mask, LORA_PROJ_COUNT);
        return -1;
    }
    if (!(o->alpha > 0.0f) || !isfinite(o->alpha)) {
        lora_errf(err, err_len, "invalid adapter options: alpha must be a positive number");
        return -1;
    }
    if (!is_float_dtype(o->dtype)) {
        lora_errf(err, err_len, "invalid adapter options: dtype must be F32, F16 or BF16");
        return -1;
    }
    return 0;
}

static json_t *adapter_config_json(const char *model_dir, const struct lora_synthetic_adapter_opts *o)
{
    json_t *targets = json_array();
    json_t *alpha;

    if (!targets)
        return NULL;
    for (int p = 0; p < LORA_PROJ_COUNT; p++) {
        if (!(o->target_mask & (1u << p)))
            continue;
        if (json_array_append_new(targets, json_string(lora_proj_name((enum lora_proj)p)))) {
            json_decref(targets);
            return NULL;
        }
    }
    /* PEFT writes an integral alpha as an integer. */
    if (o->alpha == floorf(o->alpha) && o->alpha < 1e9f)
        alpha = json_integer((json_int_t)o->alpha);
    else
        alpha = json_float(o->alpha);
    return json_pack("{s:s, s:s, s:i, s:o, s:o, s:b, s:s, s:s, s:f, s:b, s:b}", "peft_type", "LORA",
                     "task_type", "CAUSAL_LM", "r", o->rank, "lora_alpha", alpha, "target_modules",
                     targets, "use_rslora", o->use_rslora, "base_model_name_or_path", model_dir,
                     "bias", "none", "lora_dropout", 0.0, "fan_in_fan_out", 0, "inference_mode", 1);
}

int lora_synthetic_adapter_write(const char *dir, const char *model_dir,
                           const struct lora_synthetic_adapter_opts *o, char *err, size_t err_len)
{
    struct lora_model_config cfg;
    struct gen_tensor *ts = NULL;
    char *path = NULL;
    int n = 0, rc = -1;

    if (validate_adapter_opts(o, err, err_len) ||
        load_model_config(model_dir, &cfg, err, err_len) || lora_fs_mkdir_p(dir, err, err_len) ||
        write_json(adapter_config_json(model_dir, o), dir, "adapter_config.json", err, err_len))
        return -1;

    ts = calloc((size_t)cfg.n_layers * 2 * LORA_PROJ_COUNT, sizeof(*ts));
    path = path_join(dir, "adapter_model.safetensors");
    if (!ts || !path) {
        lora_errf(err, err_len, "%s: out of memory", dir);
        goto out;
    }
    for (int l = 0; l < cfg.n_layers; l++) {
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            enum lora_proj pr = (enum lora_proj)p;
            int n_in = lora_proj_in(&cfg, pr), n_out = lora_proj_out(&cfg, pr);

            if (!(o->target_mask & (1u << p)))
                continue;
            tensor_add(ts, &n, o->rank, n_in, 0.0, uniform_amp(1.0 / sqrt((double)n_in)),
                       ADAPTER_KEY, l, lora_proj_parent(pr), lora_proj_name(pr), 'A');
            tensor_add(ts, &n, n_out, o->rank, 0.0, uniform_amp(0.5 / sqrt((double)o->rank)),
                       ADAPTER_KEY, l, lora_proj_parent(pr), lora_proj_name(pr), 'B');
        }
    }
    rc = tensors_write(path, ts, n, o->dtype, o->seed, err, err_len);
out:
    free(path);
    free(ts);
    return rc;
}
