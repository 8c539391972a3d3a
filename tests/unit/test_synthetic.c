/* Unit tests for lib/runtime/synthetic: the files of a generated model and adapter, read back through
 * the real loaders (model_config, safetensors) and jansson; determinism; sharding; dtypes;
 * the tokenizer's byte mapping against GPT-2's published table; option validation.
 * The first two tests write the models ("default/nested", "qwen2") that later tests read.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "fixture.h"
#include "runtime/synthetic.h"

/* fx_tmp_dir/name in a static buffer of its own per slot (two live paths at most). */
static const char *tmp_path(int slot, const char *name)
{
    static char buf[4][512];

    snprintf(buf[slot], sizeof(buf[slot]), "%s/%s", fx_tmp_dir, name);
    return buf[slot];
}

/* Returns the file's bytes (malloc'ed) and its size, or NULL. */
static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static bool same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    unsigned char *da = read_all(a, &la), *db = read_all(b, &lb);
    bool same = da && db && la == lb && memcmp(da, db, la) == 0;

    free(da);
    free(db);
    return same;
}

static bool file_exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

static int gen(const char *name, const struct lora_synthetic_model_opts *o)
{
    char err[512] = "";
    int rc = lora_synthetic_model_write(tmp_path(0, name), o, err, sizeof(err));

    if (rc)
        printf("# gen %s: %s\n", name, err);
    return rc;
}

/* Checks that st holds tensor name with the given shape (cols 0: a vector). */
static void check_tensor(const struct lora_safetensors *st, const char *name, int64_t rows,
                         int64_t cols, enum lora_dtype dtype)
{
    const struct lora_tensor_info *t = lora_safetensors_find(st, name);

    if (!t) {
        printf("# missing tensor %s\n", name);
        CHECK(t != NULL);
        return;
    }
    CHECK(t->dtype == dtype);
    CHECK(t->n_dims == (cols ? 2 : 1));
    CHECK(t->shape[0] == rows);
    if (cols)
        CHECK(t->shape[1] == cols);
}

/* Checks every tensor of the model described by o, and that there are no others. */
static void check_model_tensors(const struct lora_safetensors *st,
                                const struct lora_synthetic_model_opts *o)
{
    int64_t h = o->hidden_size, inter = o->intermediate_size, v = o->vocab_size;
    int64_t hd = o->head_dim ? o->head_dim : h / o->n_heads;
    int64_t q = o->n_heads * hd, kv = o->n_kv_heads * hd;
    bool bias = o->arch == LORA_ARCH_QWEN2;
    int expect = 2 + o->n_layers * (bias ? 12 : 9) + (o->tie_word_embeddings ? 0 : 1);
    char name[128];

    CHECK(st->n_tensors == expect);
    check_tensor(st, "model.embed_tokens.weight", v, h, o->dtype);
    check_tensor(st, "model.norm.weight", h, 0, o->dtype);
    if (o->tie_word_embeddings)
        CHECK(lora_safetensors_find(st, "lm_head.weight") == NULL);
    else
        check_tensor(st, "lm_head.weight", v, h, o->dtype);
    for (int l = 0; l < o->n_layers; l++) {
#define T(suffix, r, c)                                                                            \
    do {                                                                                           \
        snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                             \
        check_tensor(st, name, r, c, o->dtype);                                                    \
    } while (0)
        T("input_layernorm.weight", h, 0);
        T("self_attn.q_proj.weight", q, h);
        T("self_attn.k_proj.weight", kv, h);
        T("self_attn.v_proj.weight", kv, h);
        T("self_attn.o_proj.weight", h, q);
        T("post_attention_layernorm.weight", h, 0);
        T("mlp.gate_proj.weight", inter, h);
        T("mlp.up_proj.weight", inter, h);
        T("mlp.down_proj.weight", h, inter);
        if (bias) {
            T("self_attn.q_proj.bias", q, 0);
            T("self_attn.k_proj.bias", kv, 0);
            T("self_attn.v_proj.bias", kv, 0);
        } else {
            snprintf(name, sizeof(name), "model.layers.%d.self_attn.q_proj.bias", l);
            CHECK(lora_safetensors_find(st, name) == NULL);
        }
#undef T
    }
}

static struct lora_safetensors *open_st(const char *path)
{
    char err[512] = "";
    struct lora_safetensors *st = lora_safetensors_open(path, err, sizeof(err));

    if (!st)
        printf("# %s\n", err);
    return st;
}

static void test_default_model(void)
{
    struct lora_synthetic_model_opts o;
    struct lora_model_config c;
    struct lora_safetensors *st;
    char err[512] = "";

    lora_synthetic_model_defaults(&o);
    CHECK(gen("default/nested", &o) == 0);
    CHECK(lora_model_config_load(tmp_path(0, "default/nested/config.json"), &c, err, sizeof(err)) ==
          0);
    CHECK(c.arch == LORA_ARCH_LLAMA);
    CHECK(c.hidden_size == 64 && c.intermediate_size == 128 && c.n_layers == 2);
    CHECK(c.n_heads == 4 && c.n_kv_heads == 2 && c.head_dim == 16);
    CHECK(c.vocab_size == 320 && c.max_position_embeddings == 4096);
    CHECK(c.rms_norm_eps == 1e-6f && c.rope_theta == 10000.0f);
    CHECK(!c.tie_word_embeddings && !c.qkv_bias);
    CHECK(c.bos_token_id == 256 && c.n_eos == 1 && c.eos_token_ids[0] == 257);
    CHECK(file_exists(tmp_path(0, "default/nested/generation_config.json")));
    CHECK(file_exists(tmp_path(0, "default/nested/tokenizer_config.json")));
    CHECK(!file_exists(tmp_path(0, "default/nested/model.safetensors.index.json")));

    st = open_st(tmp_path(0, "default/nested/model.safetensors"));
    CHECK(st != NULL);
    if (!st)
        return;
    check_model_tensors(st, &o);

    /* Distributions: projections std 1/sqrt(fan_in), norms within 1 +- 0.1. */
    {
        const struct lora_tensor_info *t =
            lora_safetensors_find(st, "model.layers.0.mlp.up_proj.weight");
        const struct lora_tensor_info *n = lora_safetensors_find(st, "model.norm.weight");
        double sum = 0.0, sq = 0.0;
        float x;

        for (int64_t i = 0; t && i < t->numel; i++) {
            memcpy(&x, (const char *)t->data + i * 4, 4);
            sum += x;
            sq += (double)x * x;
        }
        if (t) {
            CHECK_NEAR(sum / (double)t->numel, 0.0, 0.01);
            CHECK_NEAR(sqrt(sq / (double)t->numel), 1.0 / sqrt(64.0), 0.005);
        }
        for (int64_t i = 0; n && i < n->numel; i++) {
            memcpy(&x, (const char *)n->data + i * 4, 4);
            CHECK(x >= 0.9f && x <= 1.1f);
        }
    }
    lora_safetensors_close(&st);
}

static void test_qwen2_tied_model(void)
{
    struct lora_synthetic_model_opts o;
    struct lora_model_config c;
    struct lora_safetensors *st;
    char err[512] = "";

    lora_synthetic_model_defaults(&o);
    o.arch = LORA_ARCH_QWEN2;
    o.tie_word_embeddings = true;
    o.head_dim = 32; /* != hidden / heads */
    o.n_kv_heads = 1;
    o.dtype = LORA_DTYPE_F16;
    CHECK(gen("qwen2", &o) == 0);
    CHECK(lora_model_config_load(tmp_path(0, "qwen2/config.json"), &c, err, sizeof(err)) == 0);
    CHECK(c.arch == LORA_ARCH_QWEN2 && c.qkv_bias && c.tie_word_embeddings);
    CHECK(c.head_dim == 32 && c.n_kv_heads == 1);
    st = open_st(tmp_path(0, "qwen2/model.safetensors"));
    CHECK(st != NULL);
    if (st)
        check_model_tensors(st, &o);
    lora_safetensors_close(&st);
}

static void test_config_json_text(void)
{
    json_t *root = json_load_file(tmp_path(0, "default/nested/config.json"), 0, NULL);
    json_t *qroot = json_load_file(tmp_path(0, "qwen2/config.json"), 0, NULL);

    CHECK(root != NULL && qroot != NULL);
    if (!root || !qroot)
        goto out;
    CHECK(strcmp(json_string_value(json_object_get(root, "model_type")), "llama") == 0);
    CHECK(strcmp(json_string_value(json_object_get(root, "torch_dtype")), "float32") == 0);
    CHECK(strcmp(json_string_value(json_object_get(root, "hidden_act")), "silu") == 0);
    CHECK(json_object_get(root, "head_dim") == NULL);
    CHECK(json_real_value(json_object_get(root, "rms_norm_eps")) == 1e-6);
    CHECK(strcmp(json_string_value(json_object_get(qroot, "model_type")), "qwen2") == 0);
    CHECK(strcmp(json_string_value(json_object_get(qroot, "torch_dtype")), "float16") == 0);
    CHECK(json_integer_value(json_object_get(qroot, "head_dim")) == 32);
    CHECK(json_is_true(json_object_get(qroot, "tie_word_embeddings")));
out:
    json_decref(root);
    json_decref(qroot);
}

static void test_determinism(void)
{
    struct lora_synthetic_model_opts o;

    lora_synthetic_model_defaults(&o);
    o.seed = 7;
    CHECK(gen("seed7a", &o) == 0);
    CHECK(gen("seed7b", &o) == 0);
    o.seed = 8;
    CHECK(gen("seed8", &o) == 0);
    CHECK(same_file(tmp_path(0, "seed7a/model.safetensors"),
                    tmp_path(1, "seed7b/model.safetensors")));
    CHECK(same_file(tmp_path(0, "seed7a/tokenizer.json"), tmp_path(1, "seed7b/tokenizer.json")));
    CHECK(!same_file(tmp_path(0, "seed7a/model.safetensors"),
                     tmp_path(1, "seed8/model.safetensors")));
}

static void test_sharded(void)
{
    struct lora_synthetic_model_opts o;
    struct lora_safetensors *whole, *shard[3] = {NULL, NULL, NULL};
    json_t *index = NULL, *map;
    const char *key;
    json_t *file;
    int64_t total = 0;
    char name[64];

    lora_synthetic_model_defaults(&o);
    o.n_layers = 3;
    CHECK(gen("whole", &o) == 0);
    o.n_shards = 3;
    CHECK(gen("sharded", &o) == 0);
    CHECK(!file_exists(tmp_path(0, "sharded/model.safetensors")));
    whole = open_st(tmp_path(0, "whole/model.safetensors"));
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof(name), "sharded/model-%05d-of-00003.safetensors", k + 1);
        shard[k] = open_st(tmp_path(0, name));
        CHECK(shard[k] != NULL);
        /* Roughly equal: no shard is empty. */
        CHECK(shard[k] && shard[k]->n_tensors > 0);
    }
    index = json_load_file(tmp_path(0, "sharded/model.safetensors.index.json"), 0, NULL);
    CHECK(index != NULL && whole != NULL);
    if (!index || !whole || !shard[0] || !shard[1] || !shard[2])
        goto out;
    map = json_object_get(index, "weight_map");
    CHECK(json_object_size(map) == (size_t)whole->n_tensors);
    CHECK(shard[0]->n_tensors + shard[1]->n_tensors + shard[2]->n_tensors == whole->n_tensors);
    json_object_foreach (map, key, file) {
        const struct lora_tensor_info *w = lora_safetensors_find(whole, key), *s = NULL;
        int k = -1;

        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof(name), "model-%05d-of-00003.safetensors", i + 1);
            if (strcmp(json_string_value(file), name) == 0)
                k = i;
        }
        CHECK(k >= 0);
        if (k >= 0)
            s = lora_safetensors_find(shard[k], key);
        CHECK(w != NULL && s != NULL);
        if (!w || !s)
            continue;
        CHECK(w->bytes == s->bytes && memcmp(w->data, s->data, w->bytes) == 0);
        total += (int64_t)s->bytes;
    }
    CHECK(json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")) ==
          total);
    CHECK(total > 0);

    /* Rewriting the sharded directory as one file drops the stale index. */
    o.n_shards = 1;
    CHECK(gen("sharded", &o) == 0);
    CHECK(!file_exists(tmp_path(0, "sharded/model.safetensors.index.json")));
    CHECK(same_file(tmp_path(0, "sharded/model.safetensors"),
                    tmp_path(1, "whole/model.safetensors")));
out:
    json_decref(index);
    lora_safetensors_close(&whole);
    for (int k = 0; k < 3; k++)
        lora_safetensors_close(&shard[k]);
}

static void test_bf16_rounds_f32(void)
{
    struct lora_synthetic_model_opts o;
    struct lora_safetensors *f32, *bf16;
    int mismatches = 0;

    lora_synthetic_model_defaults(&o);
    CHECK(gen("f32", &o) == 0);
    o.dtype = LORA_DTYPE_BF16;
    CHECK(gen("bf16", &o) == 0);
    f32 = open_st(tmp_path(0, "f32/model.safetensors"));
    bf16 = open_st(tmp_path(0, "bf16/model.safetensors"));
    CHECK(f32 && bf16);
    if (!f32 || !bf16)
        goto out;
    CHECK(f32->n_tensors == bf16->n_tensors);
    for (int i = 0; i < f32->n_tensors; i++) {
        const struct lora_tensor_info *a = &f32->tensors[i];
        const struct lora_tensor_info *b = lora_safetensors_find(bf16, a->name);

        CHECK(b && b->dtype == LORA_DTYPE_BF16 && b->numel == a->numel);
        for (int64_t j = 0; b && j < a->numel; j++) {
            float x;
            uint16_t y;

            memcpy(&x, (const char *)a->data + j * 4, 4);
            memcpy(&y, (const char *)b->data + j * 2, 2);
            mismatches += lora_f32_to_bf16(x) != y;
        }
    }
    CHECK(mismatches == 0);
out:
    lora_safetensors_close(&f32);
    lora_safetensors_close(&bf16);
}

static void test_tokenizer(void)
{
    /* GPT-2's bytes_to_unicode (checked against the Python original) for a few bytes: the first
     * and last of each printable and remapped run. */
    static const struct {
        const char *tok;
        int id;
    } known[] = {
        {"\xc4\xa0", 32},  {"!", 33},       {"A", 65},         {"~", 126},        {"\xc4\xa1", 127},
        {"\xc5\x83", 173}, {"\xc4\x80", 0}, {"\xc3\xbf", 255}, {"\xc2\xa1", 161}, {"\xc5\x82", 160},
    };
    json_t *tok = json_load_file(tmp_path(0, "default/nested/tokenizer.json"), 0, NULL);
    json_t *tcfg = json_load_file(tmp_path(1, "default/nested/tokenizer_config.json"), 0, NULL);
    json_t *vocab, *added;
    const char *key;
    json_t *val;
    int seen[256] = {0};

    CHECK(tok != NULL && tcfg != NULL);
    if (!tok || !tcfg)
        goto out;
    vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    added = json_object_get(tok, "added_tokens");
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(tok, "model"), "type")),
                 "BPE") == 0);
    CHECK(json_object_size(vocab) == 256);
    json_object_foreach (vocab, key, val) {
        json_int_t id = json_integer_value(val);

        CHECK(id >= 0 && id < 256);
        if (id >= 0 && id < 256)
            seen[id]++;
    }
    for (int b = 0; b < 256; b++)
        CHECK(seen[b] == 1);
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        CHECK(json_integer_value(json_object_get(vocab, known[i].tok)) == known[i].id);
    CHECK(json_array_size(added) == 2);
    CHECK(json_integer_value(json_object_get(json_array_get(added, 0), "id")) == 256);
    CHECK(strcmp(json_string_value(json_object_get(json_array_get(added, 0), "content")), "<s>") ==
          0);
    CHECK(json_integer_value(json_object_get(json_array_get(added, 1), "id")) == 257);
    CHECK(strcmp(json_string_value(json_object_get(json_array_get(added, 1), "content")), "</s>") ==
          0);
    CHECK(json_is_true(json_object_get(json_array_get(added, 1), "special")));
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(tok, "pre_tokenizer"), "type")),
                 "ByteLevel") == 0);
    CHECK(json_array_size(json_object_get(json_object_get(tok, "model"), "merges")) == 0);
    CHECK(strcmp(json_string_value(json_object_get(tcfg, "eos_token")), "</s>") == 0);
    CHECK(json_integer_value(json_object_get(tcfg, "model_max_length")) == 4096);
    CHECK(json_is_string(json_object_get(tcfg, "chat_template")));
out:
    json_decref(tok);
    json_decref(tcfg);
}

static void test_adapter(void)
{
    struct lora_synthetic_adapter_opts a;
    struct lora_safetensors *st;
    json_t *acfg, *targets;
    char err[512] = "", name[128];
    const struct lora_tensor_info *b;
    static const struct {
        const char *parent, *proj;
        int64_t in, out;
    } expect[] = {{"self_attn", "q_proj", 64, 64},
                  {"self_attn", "v_proj", 64, 32},
                  {"mlp", "down_proj", 128, 64}};

    lora_synthetic_adapter_defaults(&a);
    a.rank = 4;
    a.alpha = 8.0f;
    a.use_rslora = true;
    a.target_mask = (1u << LORA_PROJ_Q) | (1u << LORA_PROJ_V) | (1u << LORA_PROJ_DOWN);
    CHECK(lora_synthetic_adapter_write(tmp_path(0, "adapters/one"), tmp_path(1, "default/nested"), &a,
                                 err, sizeof(err)) == 0);
    if (err[0])
        printf("# %s\n", err);
    acfg = json_load_file(tmp_path(0, "adapters/one/adapter_config.json"), 0, NULL);
    CHECK(acfg != NULL);
    if (acfg) {
        targets = json_object_get(acfg, "target_modules");
        CHECK(strcmp(json_string_value(json_object_get(acfg, "peft_type")), "LORA") == 0);
        CHECK(json_integer_value(json_object_get(acfg, "r")) == 4);
        CHECK_NEAR(json_number_value(json_object_get(acfg, "lora_alpha")), 8.0, 0.0);
        CHECK(json_is_true(json_object_get(acfg, "use_rslora")));
        CHECK(json_array_size(targets) == 3);
        CHECK(strcmp(json_string_value(json_array_get(targets, 0)), "q_proj") == 0);
        CHECK(strcmp(json_string_value(json_array_get(targets, 1)), "v_proj") == 0);
        CHECK(strcmp(json_string_value(json_array_get(targets, 2)), "down_proj") == 0);
        CHECK(strcmp(json_string_value(json_object_get(acfg, "base_model_name_or_path")),
                     tmp_path(1, "default/nested")) == 0);
        json_decref(acfg);
    }

    st = open_st(tmp_path(0, "adapters/one/adapter_model.safetensors"));
    CHECK(st != NULL);
    if (!st)
        return;
    CHECK(st->n_tensors == 2 * 3 * 2);
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof(name), "base_model.model.model.layers.%d.%s.%s.lora_A.weight", l,
                     expect[i].parent, expect[i].proj);
            check_tensor(st, name, 4, expect[i].in, LORA_DTYPE_F32);
            snprintf(name, sizeof(name), "base_model.model.model.layers.%d.%s.%s.lora_B.weight", l,
                     expect[i].parent, expect[i].proj);
            check_tensor(st, name, expect[i].out, 4, LORA_DTYPE_F32);
        }
    }
    /* lora_B is non-zero, unlike PEFT's initialisation. */
    b = lora_safetensors_find(st, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    if (b) {
        float x;
        int nonzero = 0;

        for (int64_t j = 0; j < b->numel; j++) {
            memcpy(&x, (const char *)b->data + j * 4, 4);
            nonzero += x != 0.0f;
        }
        CHECK(nonzero == b->numel);
    }
    lora_safetensors_close(&st);
}

static void test_bad_model_options(void)
{
    struct lora_synthetic_model_opts o;
    char err[512];
    static const char *const phrases[] = {
        "vocab_size 100", "n_kv_heads 3", "dtype",  "n_shards 0",
        "n_shards 1000",  "head_dim 15",  "arch 9", "hidden_size 0",
    };

    for (size_t i = 0; i < sizeof(phrases) / sizeof(phrases[0]); i++) {
        lora_synthetic_model_defaults(&o);
        switch (i) {
        case 0:
            o.vocab_size = 100;
            break;
        case 1:
            o.n_kv_heads = 3;
            break;
        case 2:
            o.dtype = LORA_DTYPE_I32;
            break;
        case 3:
            o.n_shards = 0;
            break;
        case 4:
            o.n_shards = 1000; /* more than the 21 tensors */
            break;
        case 5:
            o.hidden_size = 60;
            break;
        case 6:
            o.arch = (enum lora_arch)9;
            break;
        default:
            o.hidden_size = 0;
            break;
        }
        err[0] = '\0';
        CHECK(lora_synthetic_model_write(tmp_path(0, "bad"), &o, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, phrases[i]);
    }
    CHECK(!file_exists(tmp_path(0, "bad")));

    /* A path below a regular file cannot be created. */
    lora_synthetic_model_defaults(&o);
    err[0] = '\0';
    CHECK(lora_synthetic_model_write(tmp_path(0, "default/nested/config.json/sub"), &o, err,
                               sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unable to create directory");
}

static void test_bad_adapter_options(void)
{
    struct lora_synthetic_adapter_opts a;
    char err[512];
    const char *model = tmp_path(1, "default/nested");
    static const char *const phrases[] = {"rank 0",           "rank 5000", "target_mask 0x0",
                                          "target_mask 0x81", "dtype",     "alpha"};

    for (size_t i = 0; i < sizeof(phrases) / sizeof(phrases[0]); i++) {
        lora_synthetic_adapter_defaults(&a);
        switch (i) {
        case 0:
            a.rank = 0;
            break;
        case 1:
            a.rank = 5000;
            break;
        case 2:
            a.target_mask = 0;
            break;
        case 3:
            a.target_mask = 0x81;
            break;
        case 4:
            a.dtype = LORA_DTYPE_I8;
            break;
        default:
            a.alpha = -1.0f;
            break;
        }
        err[0] = '\0';
        CHECK(lora_synthetic_adapter_write(tmp_path(0, "badadapter"), model, &a, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, phrases[i]);
    }
    lora_synthetic_adapter_defaults(&a);
    err[0] = '\0';
    CHECK(lora_synthetic_adapter_write(tmp_path(0, "badadapter"), tmp_path(1, "no-such-model"), &a, err,
                                 sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no-such-model/config.json: ");
    CHECK(!file_exists(tmp_path(0, "badadapter")));
}

int main(void)
{
    if (fx_init("/tmp/test_model_gen.XXXXXX", &check_cur_failed) < 0)
        return 1;
    RUN(test_default_model);
    RUN(test_qwen2_tied_model);
    RUN(test_config_json_text);
    RUN(test_determinism);
    RUN(test_sharded);
    RUN(test_bf16_rounds_f32);
    RUN(test_tokenizer);
    RUN(test_adapter);
    RUN(test_bad_model_options);
    RUN(test_bad_adapter_options);
    fx_cleanup();
    return check_done();
}
