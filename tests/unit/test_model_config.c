/* Unit tests for lib/runtime/model_config: valid Llama, Mistral and Qwen2 configs with their defaults,
 * every malformed case named in the header's contract, and the projection helpers.
 * Expected values are the ones written into each test's JSON by hand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "runtime/model_config.h"

static char cfg_path[FX_PATH_BYTES];

/* Writes text to fx_tmp_dir/config.json and loads it; returns the loader's result. */
static int load_text(const char *text, struct lora_model_config *cfg, char *err, size_t err_len)
{
    if (fx_write_text(cfg_path, text) < 0)
        return -2;
    err[0] = '\0';
    return lora_model_config_load(cfg_path, cfg, err, err_len);
}

static void test_llama_full(void)
{
    struct lora_model_config c;
    char err[256];
    int rc = load_text("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096,"
                       " \"intermediate_size\": 11008, \"num_hidden_layers\": 32,"
                       " \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
                       " \"vocab_size\": 32000, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
                       " \"max_position_embeddings\": 8192, \"tie_word_embeddings\": false,"
                       " \"bos_token_id\": 1, \"eos_token_id\": 2, \"rope_scaling\": null,"
                       " \"torch_dtype\": \"bfloat16\"}",
                       &c, err, sizeof(err));

    CHECK(rc == 0);
    if (rc)
        printf("# %s\n", err);
    CHECK(c.arch == LORA_ARCH_LLAMA);
    CHECK(c.hidden_size == 4096);
    CHECK(c.intermediate_size == 11008);
    CHECK(c.n_layers == 32);
    CHECK(c.n_heads == 32);
    CHECK(c.n_kv_heads == 8);
    CHECK(c.head_dim == 128);
    CHECK(c.vocab_size == 32000);
    CHECK(c.max_position_embeddings == 8192);
    CHECK_NEAR(c.rms_norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(c.rope_theta, 500000.0, 1e-3);
    CHECK(!c.tie_word_embeddings);
    CHECK(!c.qkv_bias);
    CHECK(c.bos_token_id == 1);
    CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 2);
}

static void test_defaults(void)
{
    struct lora_model_config c;
    char err[256];
    int rc = load_text("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                       " \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
                       " \"num_attention_heads\": 4, \"vocab_size\": 320}",
                       &c, err, sizeof(err));

    CHECK(rc == 0);
    CHECK(c.n_kv_heads == 4);
    CHECK(c.head_dim == 16);
    CHECK_NEAR(c.rms_norm_eps, 1e-6, 1e-13);
    CHECK_NEAR(c.rope_theta, 10000.0, 0.0);
    CHECK(c.max_position_embeddings == 4096);
    CHECK(!c.tie_word_embeddings);
    CHECK(c.bos_token_id == -1);
    CHECK(c.n_eos == 0);
}

static void test_qwen2(void)
{
    struct lora_model_config c;
    char err[256];
    int rc = load_text("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 896,"
                       " \"intermediate_size\": 4864, \"num_hidden_layers\": 24,"
                       " \"num_attention_heads\": 14, \"num_key_value_heads\": 2,"
                       " \"vocab_size\": 151936, \"tie_word_embeddings\": true,"
                       " \"rope_theta\": 1000000.0, \"max_position_embeddings\": 32768,"
                       " \"bos_token_id\": 151643, \"eos_token_id\": [151645, 151643],"
                       " \"use_sliding_window\": false, \"head_dim\": null}",
                       &c, err, sizeof(err));

    CHECK(rc == 0);
    if (rc)
        printf("# %s\n", err);
    CHECK(c.arch == LORA_ARCH_QWEN2);
    CHECK(c.qkv_bias);
    CHECK(c.tie_word_embeddings);
    CHECK(c.head_dim == 64);
    CHECK(c.n_kv_heads == 2);
    CHECK(c.n_eos == 2);
    CHECK(c.eos_token_ids[0] == 151645 && c.eos_token_ids[1] == 151643);
    CHECK(c.bos_token_id == 151643);
}

static void test_mistral_head_dim(void)
{
    struct lora_model_config c;
    char err[256];
    int rc = load_text("{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 5120,"
                       " \"intermediate_size\": 14336, \"num_hidden_layers\": 40,"
                       " \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
                       " \"head_dim\": 128, \"vocab_size\": 131072, \"eos_token_id\": []}",
                       &c, err, sizeof(err));

    CHECK(rc == 0);
    CHECK(c.arch == LORA_ARCH_MISTRAL);
    CHECK(!c.qkv_bias);
    /* head_dim need not be hidden / heads (5120 / 32 = 160). */
    CHECK(c.head_dim == 128);
    CHECK(c.n_eos == 0);
    CHECK(lora_proj_in(&c, LORA_PROJ_O) == 4096);
    CHECK(lora_proj_out(&c, LORA_PROJ_Q) == 4096);
    CHECK(lora_proj_out(&c, LORA_PROJ_K) == 1024);
}

/* A minimal valid config with one piece replaced: "%s" stands for the varying part. */
#define BASE_PREFIX "{\"architectures\": [\"LlamaForCausalLM\"], \"intermediate_size\": 128, "
#define BASE_DIMS   "\"num_hidden_layers\": 2, \"vocab_size\": 320, "

static void test_errors(void)
{
    static const struct {
        const char *json;
        const char *phrase;
    } cases[] = {
        {"{\"architectures\": [\"GPT2LMHeadModel\"], \"hidden_size\": 64}",
         "unknown architecture 'GPT2LMHeadModel' (supported: LlamaForCausalLM"},
        {"{\"architectures\": [], \"hidden_size\": 64}", "'architectures'"},
        {"{\"hidden_size\": 64}", "'architectures'"},
        {BASE_PREFIX BASE_DIMS "\"num_attention_heads\": 4}", "'hidden_size' is missing"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": \"64\", \"num_attention_heads\": 4}",
         "'hidden_size' must be a positive integer"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64.0, \"num_attention_heads\": 4}",
         "'hidden_size' must be a positive integer"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 0, \"num_attention_heads\": 4}",
         "'hidden_size' must be a positive integer"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 2097152, \"num_attention_heads\": 4}",
         "'hidden_size' is 2097152"},
        {BASE_PREFIX "\"num_hidden_layers\": 5000, \"vocab_size\": 320, \"hidden_size\": 64, "
                     "\"num_attention_heads\": 4}",
         "'num_hidden_layers'"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"num_key_value_heads\": 3}",
         "not divisible by num_key_value_heads 3"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 60, \"num_attention_heads\": 4}",
         "head_dim 15 must be even"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"head_dim\": 7}",
         "head_dim 7 must be even"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 66, \"num_attention_heads\": 4}",
         "hidden_size 66 is not divisible by num_attention_heads 4"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
         "rope_scaling is not supported"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"rms_norm_eps\": \"1e-6\"}",
         "'rms_norm_eps' must be a positive number"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"rope_theta\": -1}",
         "'rope_theta' must be a positive number"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"tie_word_embeddings\": 1}",
         "'tie_word_embeddings' must be true or false"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"eos_token_id\": [1, \"2\"]}",
         "'eos_token_id' must be"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}",
         "'eos_token_id' lists 9 ids"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"bos_token_id\": 320}",
         "'bos_token_id' 320 is not below vocab_size 320"},
        {BASE_PREFIX BASE_DIMS "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"hidden_size\": 64}",
         "invalid JSON"},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,", "invalid JSON"},
        {"[1, 2]", "top level must be a JSON object"},
    };
    struct lora_model_config c;
    char err[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = load_text(cases[i].json, &c, err, sizeof(err));

        CHECK(rc == -1);
        CHECK_CONTAINS(err, "config.json: ");
        CHECK_CONTAINS(err, cases[i].phrase);
    }
}

static void test_missing_file(void)
{
    struct lora_model_config c;
    char err[256] = "";

    CHECK(lora_model_config_load("/nonexistent/dir/config.json", &c, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "/nonexistent/dir/config.json: ");
    CHECK_CONTAINS(err, "No such file");
}

/* A FIFO, a directory or a device in place of config.json is refused at once: reading a FIFO
 * with no writer would block for good. */
static void test_special_files(void)
{
    struct lora_model_config c;
    char err[512] = "", fifo[600];

    snprintf(fifo, sizeof(fifo), "%s/fifo.json", fx_tmp_dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    const char *paths[] = {fifo, fx_tmp_dir, "/dev/zero"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        err[0] = 0;
        CHECK(lora_model_config_load(paths[i], &c, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, paths[i]);
        CHECK_CONTAINS(err, "not a regular file");
    }
    unlink(fifo);
}

static void test_small_err_buffer(void)
{
    struct lora_model_config c;
    char err[8];

    CHECK(load_text("{}", &c, err, sizeof(err)) == -1);
    CHECK(strlen(err) < sizeof(err));
    CHECK(lora_model_config_load("/nonexistent", &c, NULL, 0) == -1);
}

static void test_arch_names(void)
{
    CHECK(strcmp(lora_arch_name(LORA_ARCH_LLAMA), "LlamaForCausalLM") == 0);
    CHECK(strcmp(lora_arch_name(LORA_ARCH_MISTRAL), "MistralForCausalLM") == 0);
    CHECK(strcmp(lora_arch_name(LORA_ARCH_QWEN2), "Qwen2ForCausalLM") == 0);
    CHECK(lora_arch_name((enum lora_arch)7) == NULL);
    CHECK(lora_arch_from_name("Qwen2ForCausalLM") == LORA_ARCH_QWEN2);
    CHECK(lora_arch_from_name("MistralForCausalLM") == LORA_ARCH_MISTRAL);
    CHECK(lora_arch_from_name("llama") == -1);
    CHECK(lora_arch_from_name(NULL) == -1);
}

static void test_proj_helpers(void)
{
    static const char *const names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
    static const char *const shorts[] = {"q", "k", "v", "o", "gate", "up", "down"};
    struct lora_model_config c;

    memset(&c, 0, sizeof(c));
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.n_heads = 14;
    c.n_kv_heads = 2;
    c.head_dim = 80; /* heads * head_dim = 1120 != hidden, to tell the two apart */

    for (int p = 0; p < LORA_PROJ_COUNT; p++) {
        CHECK(strcmp(lora_proj_name((enum lora_proj)p), names[p]) == 0);
        CHECK(lora_proj_from_name(names[p]) == p);
        CHECK(lora_proj_from_name(shorts[p]) == p);
        CHECK(strcmp(lora_proj_parent((enum lora_proj)p), p <= LORA_PROJ_O ? "self_attn" : "mlp") ==
              0);
    }
    CHECK(lora_proj_from_name("qproj") == -1);
    CHECK(lora_proj_from_name("") == -1);
    CHECK(lora_proj_from_name("_proj") == -1);
    CHECK(lora_proj_from_name("gate_up_proj") == -1);
    CHECK(lora_proj_from_name(NULL) == -1);
    CHECK(lora_proj_name(LORA_PROJ_COUNT) == NULL);

    CHECK(lora_proj_in(&c, LORA_PROJ_Q) == 896 && lora_proj_out(&c, LORA_PROJ_Q) == 1120);
    CHECK(lora_proj_in(&c, LORA_PROJ_K) == 896 && lora_proj_out(&c, LORA_PROJ_K) == 160);
    CHECK(lora_proj_in(&c, LORA_PROJ_V) == 896 && lora_proj_out(&c, LORA_PROJ_V) == 160);
    CHECK(lora_proj_in(&c, LORA_PROJ_O) == 1120 && lora_proj_out(&c, LORA_PROJ_O) == 896);
    CHECK(lora_proj_in(&c, LORA_PROJ_GATE) == 896 && lora_proj_out(&c, LORA_PROJ_GATE) == 4864);
    CHECK(lora_proj_in(&c, LORA_PROJ_UP) == 896 && lora_proj_out(&c, LORA_PROJ_UP) == 4864);
    CHECK(lora_proj_in(&c, LORA_PROJ_DOWN) == 4864 && lora_proj_out(&c, LORA_PROJ_DOWN) == 896);
    CHECK(lora_proj_in(&c, LORA_PROJ_COUNT) == 0 && lora_proj_out(&c, LORA_PROJ_COUNT) == 0);
}

int main(void)
{
    if (fx_init("/tmp/test_model_config.XXXXXX", &check_cur_failed) < 0)
        return 1;
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", fx_tmp_dir);

    RUN(test_llama_full);
    RUN(test_defaults);
    RUN(test_qwen2);
    RUN(test_mistral_head_dim);
    RUN(test_errors);
    RUN(test_missing_file);
    RUN(test_special_files);
    RUN(test_small_err_buffer);
    RUN(test_arch_names);
    RUN(test_proj_helpers);

    fx_cleanup();
    return check_done();
}
