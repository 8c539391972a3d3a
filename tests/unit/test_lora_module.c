/* lora_module: both spellings of --lora-modules, and every malformed value refused by name. */
#include <string.h>

#include "check.h"
#include "base/lora_module.h"

static void test_name_equals_path(void)
{
    struct lora_module m;
    char err[512];
    CHECK(lora_module_parse("sql=/a/b=c", &m, err, sizeof(err)) == 0);
    CHECK(strcmp(m.name, "sql") == 0 && strcmp(m.path, "/a/b=c") == 0 && m.base[0] == 0);
}

static void test_vllm_json(void)
{
    struct lora_module m;
    char err[512];
    CHECK(lora_module_parse("{\"name\": \"law\", \"path\": \"/m/law\", \"base_model_name\": "
                            "\"meta/llama\", \"other\": 1}",
                            &m, err, sizeof(err)) == 0);
    CHECK(strcmp(m.name, "law") == 0 && strcmp(m.path, "/m/law") == 0);
    CHECK(strcmp(m.base, "meta/llama") == 0);
    CHECK(lora_module_parse("{\"name\":\"x\",\"path\":\"p\",\"base_model_name\":null}", &m, err,
                            sizeof(err)) == 0);
    CHECK(m.base[0] == 0);
}

static void test_malformed(void)
{
    static const char *const bad[] = {
        "noequals",
        "=path",
        "name=",
        "{\"name\":\"x\"}",
        "{\"path\":\"p\"}",
        "{\"name\":\"\",\"path\":\"p\"}",
        "{\"name\":\"x\",\"path\":\"\"}",
        "{\"name\":3,\"path\":\"p\"}",
        "{\"name\":\"x\",\"path\":\"p\",\"base_model_name\":1}",
        "{\"name\":\"x\",\"path\":\"p\"",
        "{\"name\":\"x\",\"name\":\"y\",\"path\":\"p\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct lora_module m;
        char err[512] = "";
        CHECK(lora_module_parse(bad[i], &m, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, bad[i]);
        CHECK_CONTAINS(err, "must be NAME=PATH");
    }
    char longname[300];
    memset(longname, 'n', 256);
    strcpy(longname + 256, "=/p");
    struct lora_module m;
    char err[512];
    CHECK(lora_module_parse(longname, &m, err, sizeof(err)) == -1);
}

int main(void)
{
    RUN(test_name_equals_path);
    RUN(test_vllm_json);
    RUN(test_malformed);
    return check_done();
}
