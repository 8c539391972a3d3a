/* chat_template: the public entry points of the chat template module (chat_template.h):
 * detection, the built-in templates, tokenizer_config.json, rendering and the canonical form for
 * diagnostics. The work is done by chat_canon.c, chat_detect.c and chat_render.c
 * (chat_template_impl.h).
 */
#include "chat_template_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/errbuf.h"

/* A template file beside tokenizer_config.json is read whole; real ones are a few KiB. */
#define MAX_TEMPLATE_BYTES (1 << 20)

/* ---- detection --------------------------------------------------------------------------- */

static void template_init(struct lora_chat_template *t)
{
    memset(t, 0, sizeof(*t));
    t->inst.open = t->inst.close = "";
    t->inst.asst_lead = t->inst.asst_mid = t->inst.asst_tail = "";
}

int lora_chat_template_detect(const char *jinja_source, struct lora_chat_template *out, char *err,
                              size_t err_len)
{
    struct lora_chat_template t;

    template_init(&t);
    if (chat_detect_template(jinja_source, &t, err, err_len) < 0)
        return -1;
    *out = t;
    return 0;
}

/* ---- built-in templates ----------------------------------------------------------------- */

static const char MISTRAL_ALTERNATE[] = "After the optional system message, conversation roles "
                                        "must alternate user/assistant/user/assistant/...";
static const char MISTRAL_ROLES[] = "Only user and assistant roles are supported, with the "
                                    "exception of an initial optional system message!";

static void set_chatml(struct lora_chat_template *t, const char *name, const char *system,
                       bool think)
{
    t->family = LORA_CHAT_CHATML;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->chatml.has_default_system = system != NULL;
    snprintf(t->chatml.default_system, sizeof(t->chatml.default_system), "%s",
             system ? system : "");
    t->chatml.qwen3_think = think;
    snprintf(t->eos_token, sizeof(t->eos_token), "<|im_end|>");
}

static void set_llama3(struct lora_chat_template *t, const char *name, bool dated)
{
    t->family = LORA_CHAT_LLAMA3;
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->bos_token, sizeof(t->bos_token), "<|begin_of_text|>");
    snprintf(t->eos_token, sizeof(t->eos_token), "<|eot_id|>");
    t->emits_bos = true;
    t->llama3.trim_content = true;
    t->llama3.system_block = dated;
    if (dated) {
        snprintf(t->llama3.date_prefix, sizeof(t->llama3.date_prefix),
                 "Cutting Knowledge Date: December 2023\nToday Date: ");
        snprintf(t->llama3.date_default, sizeof(t->llama3.date_default), "26 Jul 2024");
    }
}

static void set_inst(struct lora_chat_template *t, const char *name, enum lora_chat_system_slot s)
{
    t->family = s == LORA_CHAT_SYSTEM_SYS_BLOCK ? LORA_CHAT_LLAMA2 : LORA_CHAT_MISTRAL;
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->bos_token, sizeof(t->bos_token), "<s>");
    snprintf(t->eos_token, sizeof(t->eos_token), "</s>");
    t->emits_bos = t->emits_eos = true;
    t->inst.system_slot = s;
    t->inst.alternate = true;
    t->inst.asst_lead = " ";
    if (s == LORA_CHAT_SYSTEM_SYS_BLOCK) {
        t->inst.bos_per_user = t->inst.user_strip = t->inst.asst_strip = true;
        t->inst.open = "[INST] ";
        t->inst.close = " [/INST]";
        t->inst.asst_mid = " ";
        snprintf(t->inst.alternate_error, sizeof(t->inst.alternate_error),
                 "Conversation roles must alternate user/assistant/user/assistant/...");
        return;
    }
    t->inst.open = s == LORA_CHAT_SYSTEM_FIRST_USER ? " [INST] " : "[INST] ";
    t->inst.close = s == LORA_CHAT_SYSTEM_FIRST_USER ? " [/INST]" : "[/INST]";
    t->inst.asst_strip = s == LORA_CHAT_SYSTEM_LAST_USER;
    snprintf(t->inst.alternate_error, sizeof(t->inst.alternate_error), "%s", MISTRAL_ALTERNATE);
    snprintf(t->inst.role_error, sizeof(t->inst.role_error), "%s", MISTRAL_ROLES);
}

int lora_chat_template_by_name(const char *name, struct lora_chat_template *out, char *err,
                               size_t err_len)
{
    struct lora_chat_template t;

    template_init(&t);
    if (!name)
        name = "(null)";
    if (strcmp(name, "chatml") == 0)
        set_chatml(&t, "chatml", NULL, false);
    else if (strcmp(name, "qwen2.5") == 0)
        set_chatml(&t, "qwen2.5", CHAT_QWEN25_SYSTEM, false);
    else if (strcmp(name, "qwen3") == 0)
        set_chatml(&t, "qwen3", NULL, true);
    else if (strcmp(name, "llama3") == 0)
        set_llama3(&t, "llama3", false);
    else if (strcmp(name, "llama3.1") == 0)
        set_llama3(&t, "llama3.1", true);
    else if (strcmp(name, "llama2") == 0)
        set_inst(&t, "llama2", LORA_CHAT_SYSTEM_SYS_BLOCK);
    else if (strcmp(name, "mistral") == 0 || strcmp(name, "mistral-v3") == 0)
        set_inst(&t, "mistral-v3", LORA_CHAT_SYSTEM_LAST_USER);
    else if (strcmp(name, "mistral-v1") == 0)
        set_inst(&t, "mistral-v1", LORA_CHAT_SYSTEM_FIRST_USER);
    else {
        lora_errf(err, err_len,
                  "unknown chat template '%.64s' (known: chatml, qwen2.5, qwen3, llama3, "
                  "llama3.1, llama2, mistral, mistral-v1, mistral-v3)",
                  name);
        return -1;
    }
    *out = t;
    return 0;
}

int lora_chat_template_set_tokens(struct lora_chat_template *t, const char *bos, const char *eos,
                                  char *err, size_t err_len)
{
    if ((bos && strlen(bos) >= sizeof(t->bos_token)) ||
        (eos && strlen(eos) >= sizeof(t->eos_token))) {
        lora_errf(err, err_len, "a bos_token or eos_token longer than %zu bytes",
                  sizeof(t->bos_token) - 1);
        return -1;
    }
    if (bos)
        strcpy(t->bos_token, bos);
    if (eos)
        strcpy(t->eos_token, eos);
    return 0;
}

/* ---- tokenizer_config.json ------------------------------------------------------------- */

/* Loads the config as lora_json_file_load does, but with integers past 64 bits read as reals:
 * transformers writes model_max_length as int(1e30) into many tokenizer_config.json files. */
static json_t *load_config(const char *path, char *err, size_t err_len)
{
    json_error_t jerr;
    json_t *root;
    FILE *f = fopen(path, "rb");

    if (!f) {
        int e = errno;

        lora_errf_path(err, err_len, path, "unable to open: %s", strerror(e));
        errno = e;
        return NULL;
    }
    root = json_loadf(f, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
    fclose(f);
    if (!root) {
        lora_errf_path(err, err_len, path, "invalid JSON at line %d column %d: %s", jerr.line,
                       jerr.column, jerr.text);
        errno = EINVAL;
        return NULL;
    }
    if (!json_is_object(root)) {
        lora_errf_path(err, err_len, path, "top level must be a JSON object");
        json_decref(root);
        errno = EINVAL;
        return NULL;
    }
    return root;
}

/* A token as a string, an {"content": "..."} object (AddedToken), null or absent (NULL).
 * Returns 0, or -1 for any other shape. */
static int config_token(json_t *root, const char *key, const char **out)
{
    json_t *v = json_object_get(root, key);

    *out = NULL;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return -1;
    *out = json_string_value(v);
    return 0;
}

/* Reads chat_template.jinja beside path into *out (malloc'd). Returns 0, -1 with errno
 * ENOENT when there is none, or -1 with err set. */
static int read_sibling_template(const char *path, char **out, char *err, size_t err_len)
{
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    char *file = malloc(dir_len + sizeof("chat_template.jinja"));
    struct lora_buf b = {0};
    char chunk[4096];
    size_t n;
    FILE *f;

    *out = NULL;
    if (!file) {
        lora_errf_path(err, err_len, path, "out of memory");
        return -1;
    }
    memcpy(file, path, dir_len);
    strcpy(file + dir_len, "chat_template.jinja");
    f = fopen(file, "rb");
    if (!f) {
        int e = errno;

        if (e != ENOENT)
            lora_errf_path(err, err_len, file, "unable to open: %s", strerror(e));
        free(file);
        errno = e;
        return -1;
    }
    lora_buf_add_str(&b, "");
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0 && b.len <= MAX_TEMPLATE_BYTES)
        lora_buf_add(&b, chunk, n);
    if (ferror(f) || b.failed || b.len > MAX_TEMPLATE_BYTES || memchr(b.data, '\0', b.len)) {
        lora_errf_path(err, err_len, file, "unable to read: %s",
                       ferror(f)                    ? strerror(errno)
                       : b.failed                   ? "out of memory"
                       : b.len > MAX_TEMPLATE_BYTES ? "larger than 1 MiB"
                                                    : "contains a NUL byte");
        fclose(f);
        free(file);
        lora_buf_release(&b);
        errno = EINVAL;
        return -1;
    }
    fclose(f);
    free(file);
    *out = b.data;
    return 0;
}

/* The template source of root: its chat_template string, or the "default" entry of a list. */
static int config_template(json_t *root, const char *path, const char **src, char **owned,
                           char *err, size_t err_len)
{
    json_t *ct = json_object_get(root, "chat_template"), *v;
    char names[128] = "";
    size_t i;

    *src = NULL;
    *owned = NULL;
    if (json_is_string(ct)) {
        *src = json_string_value(ct);
        return 0;
    }
    if (!ct || json_is_null(ct)) {
        if (read_sibling_template(path, owned, err, err_len) == 0) {
            *src = *owned;
            return 0;
        }
        if (errno == ENOENT)
            lora_errf_path(err, err_len, path,
                           "no chat_template (and no chat_template.jinja beside it); " CHAT_HINT);
        return -1;
    }
    if (!json_is_array(ct)) {
        lora_errf_path(err, err_len, path,
                       "'chat_template' must be a string or a list of {name, template}");
        return -1;
    }
    json_array_foreach (ct, i, v) {
        json_t *name = json_object_get(v, "name"), *tmpl = json_object_get(v, "template");

        if (!json_is_string(name) || !json_is_string(tmpl)) {
            lora_errf_path(err, err_len, path,
                           "'chat_template' entry %zu is not a {name, template} pair of strings",
                           i);
            return -1;
        }
        if (strcmp(json_string_value(name), "default") == 0) {
            *src = json_string_value(tmpl);
            return 0;
        }
        size_t used = strlen(names);
        snprintf(names + used, sizeof(names) - used, "%s'%s'", used ? ", " : "",
                 json_string_value(name));
    }
    lora_errf_path(err, err_len, path,
                   "'chat_template' lists %s but none named 'default'; " CHAT_HINT,
                   names[0] ? names : "no templates");
    return -1;
}

int lora_chat_template_from_config(const char *tokenizer_config_json_path,
                                   struct lora_chat_template *out, char *err, size_t err_len)
{
    const char *path = tokenizer_config_json_path, *src, *bos, *eos, *bad = NULL;
    struct lora_chat_template t;
    char *owned = NULL;
    char why[768];
    int rc = -1;
    json_t *root;

    root = load_config(path, err, err_len);
    if (!root)
        return -1;
    if (config_template(root, path, &src, &owned, err, err_len) < 0)
        goto out;
    if (config_token(root, "bos_token", &bos) < 0)
        bad = "bos_token";
    else if (config_token(root, "eos_token", &eos) < 0)
        bad = "eos_token";
    if (bad) {
        lora_errf_path(err, err_len, path,
                       "'%s' must be a string or an object with a string 'content'", bad);
        goto out;
    }
    if (lora_chat_template_detect(src, &t, why, sizeof(why)) < 0 ||
        lora_chat_template_set_tokens(&t, bos, eos, why, sizeof(why)) < 0) {
        lora_errf_path(err, err_len, path, "%s", why);
        goto out;
    }
    if ((t.emits_bos && !bos) || (t.emits_eos && !eos)) {
        lora_errf_path(err, err_len, path,
                       "the %s chat template emits %s, which the file does "
                       "not define",
                       t.name, t.emits_bos && !bos ? "bos_token" : "eos_token");
        goto out;
    }
    *out = t;
    rc = 0;
out:
    free(owned);
    json_decref(root);
    return rc;
}

const char *lora_chat_template_family_name(enum lora_chat_family family)
{
    switch (family) {
    case LORA_CHAT_CHATML:
        return "chatml";
    case LORA_CHAT_LLAMA3:
        return "llama3";
    case LORA_CHAT_LLAMA2:
        return "llama2";
    case LORA_CHAT_MISTRAL:
        return "mistral";
    }
    return NULL;
}

/* ---- the canonical form, rendering ------------------------------------------------------ */

int lora_chat_template_canonical(const char *jinja_source, char **out, size_t *out_len, char *err,
                                 size_t err_len)
{
    struct lora_buf b = {0};
    const char *what;
    size_t at;

    *out = NULL;
    *out_len = 0;
    if (!jinja_source) {
        lora_errf(err, err_len, "no template");
        return -1;
    }
    lora_buf_add_str(&b, "");
    if (b.failed || chat_canon_append(jinja_source, false, &b, &what, &at) < 0) {
        if (b.failed || !what)
            lora_errf(err, err_len, "out of memory canonicalising a template");
        else
            lora_errf(err, err_len, "the template does not parse: %s at byte %zu", what, at);
        lora_buf_release(&b);
        return -1;
    }
    *out = b.data;
    *out_len = b.len;
    return 0;
}

int lora_chat_template_render(const struct lora_chat_template *t,
                              const struct lora_chat_message *msgs, size_t n,
                              bool add_generation_prompt, char **out, size_t *out_len, char *err,
                              size_t err_len)
{
    return chat_render_messages(t, msgs, n, add_generation_prompt, out, out_len, err, err_len);
}
