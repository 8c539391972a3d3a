/* Unit tests for lib/runtime/generation_config: the three sources (auto, vllm, a directory), which keys
 * become defaults and which do not (null, the Hugging Face defaults, keys that are not sampling
 * parameters), the defaults refused at load, and the errors, each naming the path and the key.
 * Expected values are the ones written into each test's JSON by hand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "fixture.h"
#include "runtime/generation_config.h"

static char dir[FX_PATH_BYTES], file[FX_PATH_BYTES + 32];

/* Writes text to dir/generation_config.json and loads it from dir under source. */
static int load(const char *source, const char *text, struct lora_generation_config *g,
                char *err, size_t err_len)
{
    if (fx_write_text(file, text) < 0)
        return -2;
    err[0] = '\0';
    return lora_generation_config_load(source, dir, g, err, err_len);
}

static void test_auto_reads_the_sampling_keys(void)
{
    struct lora_generation_config g;
    char err[512];
    int rc = load("auto",
                  "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"do_sample\": true,"
                  " \"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": 20,"
                  " \"max_new_tokens\": 256, \"transformers_version\": \"4.51.0\"}",
                  &g, err, sizeof(err));
    CHECK(rc == 0);
    if (rc)
        printf("# %s\n", err);
    CHECK(g.has_temperature && g.temperature == 0.6);
    CHECK(g.has_top_p && g.top_p == 0.95);
    CHECK(g.has_top_k && g.top_k == 20);
    CHECK(g.has_max_tokens && g.max_tokens == 256);
    CHECK(strcmp(g.source, file) == 0);
    CHECK(lora_generation_config_any(&g));
}

static void test_hugging_face_defaults_are_not_defaults(void)
{
    struct lora_generation_config g;
    char err[512];
    /* vLLM reads the file's difference from GenerationConfig(): these say nothing. */
    int rc = load("auto",
                  "{\"temperature\": 1.0, \"top_p\": 1.0, \"top_k\": 50,"
                  " \"repetition_penalty\": 1.0, \"min_p\": 0, \"max_new_tokens\": null}",
                  &g, err, sizeof(err));
    CHECK(rc == 0);
    CHECK(!lora_generation_config_any(&g));
    rc = load("auto", "{\"temperature\": 0, \"top_k\": -1}", &g, err, sizeof(err));
    CHECK(rc == 0 && g.has_temperature && g.temperature == 0 && g.has_top_k && g.top_k == -1);
}

static void test_vllm_ignores_the_file(void)
{
    struct lora_generation_config g;
    char err[512];
    int rc = load("vllm", "{\"temperature\": 0.2, \"repetition_penalty\": 1.3}", &g, err,
                  sizeof(err));
    CHECK(rc == 0);
    CHECK(!lora_generation_config_any(&g));
    CHECK(strcmp(g.source, "vllm") == 0);
}

static void test_directory_source(void)
{
    struct lora_generation_config g;
    char err[512], other[FX_PATH_BYTES];

    snprintf(other, sizeof(other), "%s", fx_tmp_path("other"));
    CHECK(mkdir(other, 0700) == 0);
    CHECK(fx_write_text(fx_join(other, "generation_config.json"), "{\"top_p\": 0.5}") == 0);
    CHECK(fx_write_text(file, "{\"top_p\": 0.9}") == 0);
    CHECK(lora_generation_config_load(other, dir, &g, err, sizeof(err)) == 0);
    CHECK(g.has_top_p && g.top_p == 0.5 && !g.has_temperature);
    CHECK(lora_generation_config_is_source(other));
    CHECK(lora_generation_config_is_source("auto") && lora_generation_config_is_source("vllm"));
    CHECK(!lora_generation_config_is_source(fx_tmp_path("missing")));
    CHECK(!lora_generation_config_is_source(file)); /* a file, not a directory */
    CHECK(!lora_generation_config_is_source(NULL));
}

static void test_missing_file(void)
{
    struct lora_generation_config g;
    char err[512], empty[FX_PATH_BYTES];

    snprintf(empty, sizeof(empty), "%s", fx_tmp_path("empty"));
    CHECK(mkdir(empty, 0700) == 0);
    /* auto: a model without the file has no defaults. */
    CHECK(lora_generation_config_load("auto", empty, &g, err, sizeof(err)) == 0);
    CHECK(!lora_generation_config_any(&g) && strcmp(g.source, "none") == 0);
    /* A directory named for its file must hold it. */
    CHECK(lora_generation_config_load(empty, dir, &g, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "generation_config.json: unable to open");
    CHECK_CONTAINS(err, empty);
    CHECK(lora_generation_config_load(fx_tmp_path("nowhere"), dir, &g, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "not a directory");
}

static void test_refused_defaults(void)
{
    struct lora_generation_config g;
    char err[512];

    CHECK(load("auto", "{\"temperature\": 0.7, \"repetition_penalty\": 1.05}", &g, err,
               sizeof(err)) == -1);
    CHECK_CONTAINS(err, "'repetition_penalty' is 1.05");
    CHECK_CONTAINS(err, file);
    CHECK(!lora_generation_config_any(&g)); /* nothing half-read is left */
    CHECK(load("auto", "{\"min_p\": 0.05}", &g, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "'min_p' is 0.05");
}

static void test_errors(void)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"temperature\": \"hot\"}", "'temperature' must be a number"},
        {"{\"temperature\": -1}", "'temperature' must be between 0 and 100, not -1"},
        {"{\"top_p\": 0}", "'top_p' must be between"},
        {"{\"top_p\": 1.5}", "'top_p' must be between"},
        {"{\"top_k\": 2.5}", "'top_k' must be an integer"},
        {"{\"top_k\": -2}", "'top_k' must be between -1"},
        {"{\"max_new_tokens\": 0}", "'max_new_tokens' must be between 1"},
        {"{\"repetition_penalty\": 0}", "'repetition_penalty' must be between"},
        {"[1, 2]", "top level must be a JSON object"},
        {"{\"top_k\": 5, \"top_k\": 6}", "invalid JSON"},
        {"{\"top_k\": ", "invalid JSON at line 1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct lora_generation_config g;
        char err[512];
        int rc = load("auto", cases[i].text, &g, err, sizeof(err));
        CHECK(rc == -1);
        CHECK_CONTAINS(err, cases[i].want);
        CHECK_CONTAINS(err, file);
    }
}

static void test_bounds(void)
{
    struct lora_generation_config g;
    char err[512];
    size_t n = LORA_GENERATION_CONFIG_MAX_BYTES + 16;
    char *big = malloc(n + 1);

    CHECK(big != NULL);
    if (!big)
        return;
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    big[n] = 0;
    CHECK(load("auto", big, &g, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "larger than");
    free(big);
    /* Not a regular file: a directory in the file's place. */
    char sub[FX_PATH_BYTES], inner[FX_PATH_BYTES + 32];
    snprintf(sub, sizeof(sub), "%s", fx_tmp_path("dirfile"));
    snprintf(inner, sizeof(inner), "%s/generation_config.json", sub);
    CHECK(mkdir(sub, 0700) == 0 && mkdir(inner, 0700) == 0);
    CHECK(lora_generation_config_load("auto", sub, &g, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "not a regular file");
}

int main(void)
{
    if (fx_init("/tmp/test_generation_config.XXXXXX", &check_cur_failed) < 0)
        return 1;
    snprintf(dir, sizeof(dir), "%s", fx_tmp_dir);
    snprintf(file, sizeof(file), "%s/generation_config.json", dir);

    RUN(test_auto_reads_the_sampling_keys);
    RUN(test_hugging_face_defaults_are_not_defaults);
    RUN(test_vllm_ignores_the_file);
    RUN(test_directory_source);
    RUN(test_missing_file);
    RUN(test_refused_defaults);
    RUN(test_errors);
    RUN(test_bounds);

    fx_cleanup();
    return check_done();
}
