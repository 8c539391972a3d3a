/* demo_model: writes and finds the embedded demo model; see demo_model.h. */
#include "runtime/demo_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "runtime/synthetic.h"

#define DEMO_NAME "demo-v2"

static int demo_dir(char *dir, size_t len, char *err, size_t err_len)
{
    const char *env = getenv("LORA_DEMO_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");

    if (env && *env)
        snprintf(dir, len, "%s", env);
    else if (xdg && *xdg)
        snprintf(dir, len, "%s/lora-stack/" DEMO_NAME, xdg);
    else if (home && *home)
        snprintf(dir, len, "%s/.cache/lora-stack/" DEMO_NAME, home);
    else {
        snprintf(err, err_len, "demo model: set LORA_DEMO_DIR, XDG_CACHE_HOME or HOME");
        return -1;
    }
    return 0;
}

static int write_demo(const char *dir, char *err, size_t err_len)
{
    struct lora_synthetic_model_opts mo;
    lora_synthetic_model_defaults(&mo);
    mo.hidden_size = 256;
    mo.intermediate_size = 512;
    mo.n_layers = 4;
    mo.n_heads = 8;
    mo.n_kv_heads = 4;
    mo.vocab_size = 512;
    mo.max_position_embeddings = 2048;
    mo.seed = 2026;
    if (lora_synthetic_model_write(dir, &mo, err, err_len) < 0)
        return -1;

    static const struct {
        const char *name;
        int rank;
        unsigned mask;
    } adapters[] = {
        {"demo-sql", 8, 0x7f},
        {"demo-chat", 16, 0x7f},
        {"demo-code", 8, (1u << LORA_PROJ_Q) | (1u << LORA_PROJ_V)},
    };
    for (size_t i = 0; i < sizeof(adapters) / sizeof(adapters[0]); i++) {
        struct lora_synthetic_adapter_opts ao;
        char path[4400];
        lora_synthetic_adapter_defaults(&ao);
        ao.rank = adapters[i].rank;
        ao.alpha = 2.0f * adapters[i].rank;
        ao.target_mask = adapters[i].mask;
        ao.seed = 100 + i;
        snprintf(path, sizeof(path), "%s/adapters/%s", dir, adapters[i].name);
        if (lora_synthetic_adapter_write(path, dir, &ao, err, err_len) < 0)
            return -1;
    }
    return 0;
}

int lora_demo_model_ensure(char *dir, size_t dir_len, char *err, size_t err_len)
{
    char probe[4200], tmp[4200];
    struct stat st;

    if (demo_dir(dir, dir_len, err, err_len) < 0)
        return -1;
    snprintf(probe, sizeof(probe), "%s/config.json", dir);
    if (stat(probe, &st) == 0)
        return 0;
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", dir, (long)getpid());
    if (write_demo(tmp, err, err_len) < 0) {
        lora_fs_remove_tree(tmp);
        return -1;
    }
    if (rename(tmp, dir) < 0) {
        int e = errno;
        lora_fs_remove_tree(tmp);
        /* Another process finished first: use its copy. */
        if (stat(probe, &st) == 0)
            return 0;
        snprintf(err, err_len, "%s: unable to rename into place: %s", dir, strerror(e));
        return -1;
    }
    return 0;
}
