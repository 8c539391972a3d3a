/* fuzz_adapter: a PEFT adapter directory (adapter_config.json and adapter_model.safetensors)
 * loaded for the generated tiny model, as a worker loads one.
 *
 * Input: two bytes (big-endian) give the length of adapter_config.json, which follows; the
 * rest is adapter_model.safetensors. */
#include "fuzz.h"
#include "runtime/adapter.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static struct lora_model *model;
static char adapter_dir[512];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct lora_synthetic_model_opts o;
    char err[512], path[512];

    lora_synthetic_model_defaults(&o);
    snprintf(path, sizeof(path), "%s/model", fuzz_dir());
    if (lora_synthetic_model_write(path, &o, err, sizeof(err)) < 0 ||
        !(model = lora_model_load(lora_backend_open("cpu", err, sizeof(err)), path, 0, 1, NULL, err,
                                  sizeof(err)))) {
        fprintf(stderr, "fuzz_adapter: %s\n", err);
        abort();
    }
    snprintf(adapter_dir, sizeof(adapter_dir), "%s/adapter", fuzz_dir());
    if (mkdir(adapter_dir, 0700) < 0) {
        perror("fuzz_adapter: mkdir");
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];

    if (size < 2)
        return 0;
    size_t cfg_len = (size_t)data[0] << 8 | data[1];
    data += 2;
    size -= 2;
    if (cfg_len > size)
        cfg_len = size;
    fuzz_write("adapter/adapter_config.json", data, cfg_len);
    fuzz_write("adapter/adapter_model.safetensors", data + cfg_len, size - cfg_len);
    struct lora_adapter *a = lora_adapter_load(adapter_dir, model, 64, err, sizeof(err));
    lora_adapter_destroy(&a);
    return 0;
}
