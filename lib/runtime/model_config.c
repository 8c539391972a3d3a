/* model_config: parse and validate a Hugging Face config.json (see model_config.h).
 *
 * Every failure writes "path: reason" into the caller's buffer; nothing is logged. The bounds
 * below are far above any real Llama-family model and low enough that every width product the
 * engine computes (heads * head_dim, vocab * hidden) fits its integer types.
 */
#include "runtime/model_config.h"

#include "base/errbuf.h"
#include "base/json_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#define MAX_WIDTH             (1 << 20) /* hidden, intermediate, heads * head_dim */
#define MAX_LAYERS            1024
#define MAX_HEADS             4096
#define MAX_HEAD_DIM          4096
#define MAX_VOCAB             (1 << 24)
#define MAX_POSITIONS         (1 << 24)
#define DEFAULT_RMS_NORM_EPS  1e-6f
#define DEFAULT_ROPE_THETA    10000.0f
#define DEFAULT_MAX_POSITIONS 4096

static const char *const arch_names[] = {
    [LORA_ARCH_LLAMA] = "LlamaForCausalLM",
    [LORA_ARCH_MISTRAL] = "MistralForCausalLM",
    [LORA_ARCH_QWEN2] = "Qwen2ForCausalLM",
};
#define N_ARCHS ((int)(sizeof(arch_names) / sizeof(arch_names[0])))

static const char *const proj_names[LORA_PROJ_COUNT] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};

const char *lora_arch_name(enum lora_arch arch)
{
    if ((int)arch < 0 || (int)arch >= N_ARCHS)
        return NULL;
    return arch_names[arch];
}

int lora_arch_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < N_ARCHS; i++)
        if (strcmp(name, arch_names[i]) == 0)
            return i;
    return -1;
}

/* Returns NULL for a value outside the enum. */
const char *lora_proj_name(enum lora_proj p)
{
    if ((int)p < 0 || p >= LORA_PROJ_COUNT)
        return NULL;
    return proj_names[p];
}

const char *lora_proj_parent(enum lora_proj p)
{
    if ((int)p < 0 || p >= LORA_PROJ_COUNT)
        return NULL;
    return p <= LORA_PROJ_O ? "self_attn" : "mlp";
}

int lora_proj_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < LORA_PROJ_COUNT; i++) {
        size_t stem = strlen(proj_names[i]) - strlen("_proj");

        if (strcmp(name, proj_names[i]) == 0)
            return i;
        if (strlen(name) == stem && strncmp(name, proj_names[i], stem) == 0)
            return i;
    }
    return -1;
}

/* Widths follow the Hugging Face [out, in] weight layout; 0 for a value outside the enum, so a
 * caller that multiplies widths never sees a negative size. */
int lora_proj_in(const struct lora_model_config *cfg, enum lora_proj p)
{
    switch (p) {
    case LORA_PROJ_Q:
    case LORA_PROJ_K:
    case LORA_PROJ_V:
    case LORA_PROJ_GATE:
    case LORA_PROJ_UP:
        return cfg->hidden_size;
    case LORA_PROJ_O:
        return cfg->n_heads * cfg->head_dim;
    case LORA_PROJ_DOWN:
        return cfg->intermediate_size;
    default:
        return 0;
    }
}

int lora_proj_out(const struct lora_model_config *cfg, enum lora_proj p)
{
    switch (p) {
    case LORA_PROJ_Q:
        return cfg->n_heads * cfg->head_dim;
    case LORA_PROJ_K:
    case LORA_PROJ_V:
        return cfg->n_kv_heads * cfg->head_dim;
    case LORA_PROJ_O:
    case LORA_PROJ_DOWN:
        return cfg->hidden_size;
    case LORA_PROJ_GATE:
    case LORA_PROJ_UP:
        return cfg->intermediate_size;
    default:
        return 0;
    }
}

/* A key set to null counts as absent: transformers writes null for unset optional values. */
static json_t *get_present(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);

    return json_is_null(v) ? NULL : v;
}

/* Reads a positive integer key no larger than max. When the key is absent, a required key is an
 * error and an optional one leaves *out as it is (the caller's default). */
static int get_pos_int(const char *path, json_t *root, const char *key, bool required, int max,
                       int *out, char *err, size_t err_len)
{
    json_t *v = get_present(root, key);
    json_int_t x;

    if (!v) {
        if (!required)
            return 0;
        lora_errf_path(err, err_len, path, "'%s' is missing", key);
        return -1;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0) {
        lora_errf_path(err, err_len, path, "'%s' must be a positive integer", key);
        return -1;
    }
    x = json_integer_value(v);
    if (x > max) {
        lora_errf_path(err, err_len, path, "'%s' is %lld, more than the supported %d", key,
                       (long long)x, max);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Reads an optional positive, finite number that fits a float; absent leaves *out alone. */
static int get_pos_float(const char *path, json_t *root, const char *key, float *out, char *err,
                         size_t err_len)
{
    json_t *v = get_present(root, key);
    double x;

    if (!v)
        return 0;
    x = json_is_number(v) ? json_number_value(v) : -1.0;
    if (!(x > 0.0) || !isfinite((float)x) || (float)x == 0.0f) {
        lora_errf_path(err, err_len, path, "'%s' must be a positive number", key);
        return -1;
    }
    *out = (float)x;
    return 0;
}

/* Reads a token id in [0, vocab_size). */
static int get_token_id(const char *path, const char *key, json_t *v, int vocab_size, int *out,
                        char *err, size_t err_len)
{
    json_int_t x;

    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        lora_errf_path(err, err_len, path, "'%s' must be a non-negative integer or a list of them",
                       key);
        return -1;
    }
    x = json_integer_value(v);
    if (x >= vocab_size) {
        lora_errf_path(err, err_len, path, "'%s' %lld is not below vocab_size %d", key,
                       (long long)x, vocab_size);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_arch(const char *path, json_t *root, struct lora_model_config *cfg, char *err,
                      size_t err_len)
{
    json_t *archs = json_object_get(root, "architectures");
    const char *name;
    int arch;

    if (!json_is_array(archs) || json_array_size(archs) == 0 ||
        !json_is_string(json_array_get(archs, 0))) {
        lora_errf_path(err, err_len, path, "'architectures' must be a non-empty list of strings");
        return -1;
    }
    name = json_string_value(json_array_get(archs, 0));
    arch = lora_arch_from_name(name);
    if (arch < 0) {
        lora_errf_path(
            err, err_len, path,
            "unknown architecture '%s' (supported: LlamaForCausalLM, MistralForCausalLM, "
            "Qwen2ForCausalLM)",
            name);
        return -1;
    }
    cfg->arch = (enum lora_arch)arch;
    cfg->qkv_bias = cfg->arch == LORA_ARCH_QWEN2;
    return 0;
}

static int parse_dims(const char *path, json_t *root, struct lora_model_config *cfg, char *err,
                      size_t err_len)
{
    if (get_pos_int(path, root, "hidden_size", true, MAX_WIDTH, &cfg->hidden_size, err, err_len) ||
        get_pos_int(path, root, "intermediate_size", true, MAX_WIDTH, &cfg->intermediate_size, err,
                    err_len) ||
        get_pos_int(path, root, "num_hidden_layers", true, MAX_LAYERS, &cfg->n_layers, err,
                    err_len) ||
        get_pos_int(path, root, "num_attention_heads", true, MAX_HEADS, &cfg->n_heads, err,
                    err_len) ||
        get_pos_int(path, root, "vocab_size", true, MAX_VOCAB, &cfg->vocab_size, err, err_len))
        return -1;

    cfg->n_kv_heads = cfg->n_heads;
    cfg->head_dim = 0;
    if (get_pos_int(path, root, "num_key_value_heads", false, MAX_HEADS, &cfg->n_kv_heads, err,
                    err_len) ||
        get_pos_int(path, root, "head_dim", false, MAX_HEAD_DIM, &cfg->head_dim, err, err_len))
        return -1;

    if (cfg->n_heads % cfg->n_kv_heads != 0) {
        lora_errf_path(err, err_len, path,
                       "num_attention_heads %d is not divisible by num_key_value_heads %d",
                       cfg->n_heads, cfg->n_kv_heads);
        return -1;
    }
    if (cfg->head_dim == 0) {
        if (cfg->hidden_size % cfg->n_heads != 0) {
            lora_errf_path(
                err, err_len, path,
                "hidden_size %d is not divisible by num_attention_heads %d and head_dim is "
                "not set",
                cfg->hidden_size, cfg->n_heads);
            return -1;
        }
        cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    }
    /* RoPE rotates pairs of dimensions. */
    if (cfg->head_dim % 2 != 0) {
        lora_errf_path(err, err_len, path, "head_dim %d must be even", cfg->head_dim);
        return -1;
    }
    if ((long long)cfg->n_heads * cfg->head_dim > MAX_WIDTH) {
        lora_errf_path(err, err_len, path,
                       "num_attention_heads * head_dim is more than the supported %d", MAX_WIDTH);
        return -1;
    }
    return 0;
}

static int parse_eos(const char *path, json_t *root, struct lora_model_config *cfg, char *err,
                     size_t err_len)
{
    json_t *v = get_present(root, "eos_token_id");
    size_t i;
    json_t *item;

    cfg->n_eos = 0;
    if (!v)
        return 0;
    if (!json_is_array(v)) {
        if (get_token_id(path, "eos_token_id", v, cfg->vocab_size, &cfg->eos_token_ids[0], err,
                         err_len))
            return -1;
        cfg->n_eos = 1;
        return 0;
    }
    if (json_array_size(v) > LORA_MAX_EOS) {
        lora_errf_path(err, err_len, path,
                       "'eos_token_id' lists %zu ids, more than the supported %d",
                       json_array_size(v), LORA_MAX_EOS);
        return -1;
    }
    json_array_foreach (v, i, item) {
        if (get_token_id(path, "eos_token_id", item, cfg->vocab_size,
                         &cfg->eos_token_ids[cfg->n_eos], err, err_len))
            return -1;
        cfg->n_eos++;
    }
    return 0;
}

static int parse_rest(const char *path, json_t *root, struct lora_model_config *cfg, char *err,
                      size_t err_len)
{
    json_t *v;

    cfg->rms_norm_eps = DEFAULT_RMS_NORM_EPS;
    cfg->rope_theta = DEFAULT_ROPE_THETA;
    cfg->max_position_embeddings = DEFAULT_MAX_POSITIONS;
    if (get_pos_float(path, root, "rms_norm_eps", &cfg->rms_norm_eps, err, err_len) ||
        get_pos_float(path, root, "rope_theta", &cfg->rope_theta, err, err_len) ||
        get_pos_int(path, root, "max_position_embeddings", false, MAX_POSITIONS,
                    &cfg->max_position_embeddings, err, err_len))
        return -1;

    /* The engine implements plain RoPE only; a scaled model would load and then produce
     * wrong outputs past the original context, so refuse it. */
    if (get_present(root, "rope_scaling")) {
        lora_errf_path(err, err_len, path, "rope_scaling is not supported");
        return -1;
    }

    cfg->tie_word_embeddings = false;
    v = get_present(root, "tie_word_embeddings");
    if (v) {
        if (!json_is_boolean(v)) {
            lora_errf_path(err, err_len, path, "'tie_word_embeddings' must be true or false");
            return -1;
        }
        cfg->tie_word_embeddings = json_is_true(v);
    }

    cfg->bos_token_id = -1;
    v = get_present(root, "bos_token_id");
    if (v &&
        get_token_id(path, "bos_token_id", v, cfg->vocab_size, &cfg->bos_token_id, err, err_len))
        return -1;
    return parse_eos(path, root, cfg, err, err_len);
}

int lora_model_config_load(const char *path, struct lora_model_config *cfg, char *err,
                           size_t err_len)
{
    struct lora_model_config c;
    int rc = -1;

    memset(&c, 0, sizeof(c));
    json_t *root = lora_json_file_load(path, err, err_len);
    if (!root)
        return -1;
    if (parse_arch(path, root, &c, err, err_len) || parse_dims(path, root, &c, err, err_len) ||
        parse_rest(path, root, &c, err, err_len))
        goto out;
    *cfg = c;
    rc = 0;
out:
    json_decref(root);
    return rc;
}
