/* lora-frontend: runtime adapter load and unload (docs/design.md, "Residency"; docs/security.md),
 * as vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter, with what vLLM does not do: the
 * engine loads the adapter on every rank before the answer, unload removes it from every rank (the
 * engine answers once no running request uses it), and every frontend on the engine sees the
 * change through the engine's registry. Client paths are confined to --lora-root: checked here
 * as a first filter (no "..", no symbolic link unless --lora-allow-symlinks, a directory under
 * the root), and again where it holds, in the workers, which open the files beneath their own
 * --lora-root descriptor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "base/lora_module.h"
#include "base/path_confine.h"

#define LOAD_TIMEOUT_MS   120000 /* reading an adapter from a slow disk on every rank */
#define UNLOAD_TIMEOUT_MS 600000 /* waits for the requests that still run on it */

/* The adapter a load or unload names, once runtime changes are allowed; NULL when the request
 * was answered (refused). */
static const char *name_field(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    json_t *n = json_object_get(body, "lora_name");

    if (!fe->runtime_lora) {
        reply_error(req, 404, NULL,
                    "runtime adapter loading is off: start lora-frontend with "
                    "--enable-runtime-lora (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)");
        return NULL;
    }
    if (!json_is_string(n) || json_string_length(n) == 0 || json_string_length(n) > FE_NAME_MAX) {
        reply_error(req, 400, "lora_name", "'lora_name' must be a string of 1 to %d bytes",
                    FE_NAME_MAX);
        return NULL;
    }
    if (strchr(json_string_value(n), ',')) {
        /* Metrics join adapter names with commas. */
        reply_error(req, 400, "lora_name", "'lora_name' must not contain a comma");
        return NULL;
    }
    return json_string_value(n);
}

/* The status of a failed control command: the engine or the link down is 503, an unknown
 * adapter (unload) 404, anything else about the adapter (corrupt, another base model, rank
 * too high, already loaded) 400. */
static unsigned control_status(const char *err, bool unload)
{
    if (strstr(err, "did not answer") || strstr(err, "not reachable") ||
        strstr(err, "registry is full") || strstr(err, "unhealthy"))
        return 503;
    if (unload && strstr(err, "not found"))
        return 404;
    return 400;
}

/* Loads (path set) or unloads the adapter in the engine and answers as vLLM does. The engine
 * broadcast the registry before it answered the control command: the answer waits until ours
 * follows, so /v1/models right after it agrees. */
static void control(struct frontend *fe, struct lora_http_request *req, const char *name,
                    const char *path)
{
    bool load = path != NULL;
    char err[2048], msg[512];

    if (link_control(&fe->link, load ? LORA_CTL_LOAD : LORA_CTL_UNLOAD, name, path,
                     load ? LOAD_TIMEOUT_MS : UNLOAD_TIMEOUT_MS, NULL, NULL, err,
                     sizeof(err)) < 0) {
        reply_error(req, control_status(err, !load), load ? "lora_path" : "lora_name",
                    "unable to %s adapter '%s': %s", load ? "load" : "unload", name, err);
        return;
    }
    link_registry_wait(&fe->link, name, load, 2000);
    snprintf(msg, sizeof(msg), "Success: LoRA adapter '%s' %s successfully.", name,
             load ? "added" : "removed");
    lora_http_respond(req, 200, "text/plain; charset=utf-8", msg, strlen(msg));
}

void adapters_load(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    char err[2048];
    const char *name = name_field(fe, req, body);

    if (!name)
        return;
    json_t *p = json_object_get(body, "lora_path");
    if (!json_is_string(p) || json_string_length(p) == 0) {
        reply_error(req, 400, "lora_path", "'lora_path' must be a non-empty string");
        return;
    }
    if (strcmp(name, fe->served_name) == 0) {
        reply_error(req, 400, "lora_name", "'%s' is the base model's name", name);
        return;
    }
    if (!fe->lora_root) {
        reply_error(req, 400, "lora_path",
                    "runtime adapter loading needs --lora-root: adapters load only from there");
        return;
    }
    enum lora_path_confine_error why;
    char *real = lora_path_confine(fe->lora_root, json_string_value(p), fe->lora_allow_symlinks,
                                   &why, err, sizeof(err));
    if (!real) {
        reply_error(req, why == LORA_CONFINE_MISSING ? 404 : 400, "lora_path", "%s", err);
        return;
    }
    control(fe, req, name, real);
    free(real);
}

void adapters_unload(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    const char *name = name_field(fe, req, body);

    if (name)
        control(fe, req, name, NULL);
}

int adapters_load_modules(struct frontend *fe, const struct lora_cli_opt_list *mods, char *err,
                          size_t err_len)
{
    for (int i = 0; i < mods->n; i++) {
        struct lora_module mod;
        char why[2048];
        if (lora_module_parse(mods->items[i], &mod, err, err_len) < 0)
            return -1;
        const char *name = mod.name, *path = mod.path, *base = mod.base;
        if (base[0] && fe->n_module_base < 64) {
            snprintf(fe->module_base[fe->n_module_base].name, FE_NAME_MAX + 1, "%s", name);
            snprintf(fe->module_base[fe->n_module_base].base, FE_NAME_MAX + 1, "%s", base);
            fe->n_module_base++;
        }
        pthread_mutex_lock(&fe->link.mu);
        bool known = link_registry_has_locked(&fe->link, name);
        pthread_mutex_unlock(&fe->link.mu);
        if (known)
            continue; /* the engine, or another frontend, has it */
        char *real = realpath(path, NULL);
        if (!real) {
            snprintf(err, err_len, "--lora-modules '%s': unable to resolve '%s'", name, path);
            return -1;
        }
        int rc = link_control(&fe->link, LORA_CTL_LOAD, name, real, LOAD_TIMEOUT_MS, NULL, NULL,
                              why, sizeof(why));
        free(real);
        if (rc < 0 && !strstr(why, "already loaded")) {
            snprintf(err, err_len, "--lora-modules '%s': %s", name, why);
            return -1;
        }
        link_registry_wait(&fe->link, name, true, 2000);
    }
    return 0;
}
