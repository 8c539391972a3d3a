/* fuzz_model_config: a model's config.json parsed and validated, the projection shapes read
 * from a config that passes. */
#include "fuzz.h"
#include "runtime/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct lora_model_config cfg;
    char err[512];
    const char *path = fuzz_write("config.json", data, size);

    if (lora_model_config_load(path, &cfg, err, sizeof(err)) < 0)
        return 0;
    for (int p = 0; p < LORA_PROJ_COUNT; p++) {
        lora_proj_in(&cfg, (enum lora_proj)p);
        lora_proj_out(&cfg, (enum lora_proj)p);
    }
    return 0;
}
