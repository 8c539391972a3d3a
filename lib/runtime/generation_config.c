/* generation_config: a model's default sampling parameters; see generation_config.h. */
#include "runtime/generation_config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/errbuf.h"
#include "base/json_file.h"

/* A numeric key: 0 absent (or null, or equal to skip), 1 read into *out, -1 error. */
static int number(json_t *root, const char *path, const char *key, double lo, double hi,
                  double skip, double *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v)) {
        lora_errf(err, err_len, "%s: '%s' must be a number", path, key);
        return -1;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        lora_errf(err, err_len, "%s: '%s' must be between %g and %g, not %g", path, key, lo, hi,
                  x);
        return -1;
    }
    if (x == skip)
        return 0;
    *out = x;
    return 1;
}

static int integer(json_t *root, const char *path, const char *key, long long lo, long long hi,
                   long long skip, int *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v)) {
        lora_errf(err, err_len, "%s: '%s' must be an integer", path, key);
        return -1;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        lora_errf(err, err_len, "%s: '%s' must be between %lld and %lld, not %lld", path, key,
                  lo, hi, x);
        return -1;
    }
    if (x == skip)
        return 0;
    *out = (int)x;
    return 1;
}

static int read_defaults(json_t *root, const char *path, struct lora_generation_config *g,
                         char *err, size_t err_len)
{
    double x = 0;
    int rc;

    /* Defaults we cannot honour: refused, never dropped. */
    if ((rc = number(root, path, "repetition_penalty", 1e-9, 1e9, 1.0, &x, err, err_len)) < 0)
        return -1;
    if (rc) {
        lora_errf(err, err_len,
                  "%s: 'repetition_penalty' is %g, and this server samples without a repetition "
                  "penalty; use --generation-config vllm to ignore the file's defaults",
                  path, x);
        return -1;
    }
    if ((rc = number(root, path, "min_p", 0, 1, 0, &x, err, err_len)) < 0)
        return -1;
    if (rc) {
        lora_errf(err, err_len,
                  "%s: 'min_p' is %g, and this server does not implement min_p; use "
                  "--generation-config vllm to ignore the file's defaults",
                  path, x);
        return -1;
    }
    if ((rc = number(root, path, "temperature", 0, 100, 1.0, &x, err, err_len)) < 0)
        return -1;
    if (rc) {
        g->has_temperature = true;
        g->temperature = x;
    }
    if ((rc = number(root, path, "top_p", 1e-9, 1, 1.0, &x, err, err_len)) < 0)
        return -1;
    if (rc) {
        g->has_top_p = true;
        g->top_p = x;
    }
    /* 50 is the Hugging Face default top_k: a file that says 50 says nothing. */
    if ((rc = integer(root, path, "top_k", -1, 1 << 30, 50, &g->top_k, err, err_len)) < 0)
        return -1;
    g->has_top_k = rc == 1;
    if ((rc = integer(root, path, "max_new_tokens", 1, 1 << 30, -1, &g->max_tokens, err,
                      err_len)) < 0)
        return -1;
    g->has_max_tokens = rc == 1;
    return 0;
}

int lora_generation_config_load(const char *source, const char *model_dir,
                                struct lora_generation_config *out, char *err, size_t err_len)
{
    char path[sizeof(out->source)];
    bool auto_mode = !source || strcmp(source, "auto") == 0;

    memset(out, 0, sizeof(*out));
    if (source && strcmp(source, "vllm") == 0) {
        snprintf(out->source, sizeof(out->source), "vllm");
        return 0;
    }
    const char *dir = auto_mode ? model_dir : source;
    if (!dir || !*dir) {
        lora_errf(err, err_len, "no model directory for the generation config");
        return -1;
    }
    if (!auto_mode) {
        struct stat st;
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
            lora_errf(err, err_len, "%s: not a directory (give auto, vllm or a directory "
                                    "holding generation_config.json)", dir);
            return -1;
        }
    }
    if ((size_t)snprintf(path, sizeof(path), "%s/generation_config.json", dir) >= sizeof(path)) {
        lora_errf(err, err_len, "%s: path too long", dir);
        return -1;
    }
    json_t *root =
        lora_json_file_load_bounded(path, LORA_GENERATION_CONFIG_MAX_BYTES, err, err_len);
    if (!root) {
        if (auto_mode && errno == ENOENT) { /* a model without the file: no defaults */
            snprintf(out->source, sizeof(out->source), "none");
            return 0;
        }
        return -1;
    }
    int rc = read_defaults(root, path, out, err, err_len);
    json_decref(root);
    if (rc < 0) {
        memset(out, 0, sizeof(*out));
        return -1;
    }
    snprintf(out->source, sizeof(out->source), "%s", path);
    return 0;
}

bool lora_generation_config_is_source(const char *s)
{
    struct stat st;
    return s && (strcmp(s, "auto") == 0 || strcmp(s, "vllm") == 0 ||
                 (stat(s, &st) == 0 && S_ISDIR(st.st_mode)));
}

bool lora_generation_config_any(const struct lora_generation_config *g)
{
    return g->has_temperature || g->has_top_p || g->has_top_k || g->has_max_tokens;
}
