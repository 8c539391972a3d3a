/* lora_module: one value of --lora-modules; see lora_module.h. */
#include "base/lora_module.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/errbuf.h"

static int parse_json(const char *spec, struct lora_module *m)
{
    json_error_t je;
    json_t *j = json_loads(spec, JSON_REJECT_DUPLICATES, &je);
    json_t *n = json_object_get(j, "name"), *p = json_object_get(j, "path"),
           *b = json_object_get(j, "base_model_name");
    int rc = -1;

    /* base_model_name may be null, as vLLM's dataclass default is. */
    if (b && json_is_null(b))
        b = NULL;
    if (json_is_string(n) && json_is_string(p) && (!b || json_is_string(b)) &&
        json_string_length(n) > 0 && json_string_length(n) <= LORA_MODULE_NAME_MAX &&
        json_string_length(p) > 0 && json_string_length(p) <= LORA_MODULE_PATH_MAX &&
        (!b || json_string_length(b) <= LORA_MODULE_NAME_MAX)) {
        snprintf(m->name, sizeof(m->name), "%s", json_string_value(n));
        snprintf(m->path, sizeof(m->path), "%s", json_string_value(p));
        snprintf(m->base, sizeof(m->base), "%s", b ? json_string_value(b) : "");
        rc = 0;
    }
    json_decref(j);
    return rc;
}

int lora_module_parse(const char *spec, struct lora_module *m, char *err, size_t err_len)
{
    if (spec[0] == '{') {
        if (parse_json(spec, m) == 0)
            return 0;
        lora_errf(err, err_len,
                  "--lora-modules '%s' must be NAME=PATH or {\"name\":...,\"path\":...,"
                  "\"base_model_name\":...}",
                  spec);
        return -1;
    }
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || (size_t)(eq - spec) > LORA_MODULE_NAME_MAX || !eq[1] ||
        strlen(eq + 1) > LORA_MODULE_PATH_MAX) {
        lora_errf(err, err_len, "--lora-modules '%s' must be NAME=PATH", spec);
        return -1;
    }
    snprintf(m->name, sizeof(m->name), "%.*s", (int)(eq - spec), spec);
    snprintf(m->path, sizeof(m->path), "%s", eq + 1);
    m->base[0] = 0;
    return 0;
}
