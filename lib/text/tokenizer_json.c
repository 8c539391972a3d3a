/* tokenizer_json: reading the fields of a tokenizer.json so that every error names the file and
 * the JSON path of what is wrong ("tokenizer.json: model.merges[3]: ..."); see
 * tokenizer_impl.h. */
#include "text/tokenizer_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"

static size_t path_append(struct tk_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends to the path, truncating (a message with a cut path still names the file). */
static size_t path_append(struct tk_ctx *c, const char *fmt, ...)
{
    size_t saved = c->path_len;
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(c->path + c->path_len, sizeof(c->path) - c->path_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        c->path_len += (size_t)n;
    if (c->path_len >= sizeof(c->path))
        c->path_len = sizeof(c->path) - 1;
    return saved;
}

size_t tk_path_key(struct tk_ctx *c, const char *key)
{
    return path_append(c, c->path_len ? ".%s" : "%s", key);
}

size_t tk_path_index(struct tk_ctx *c, size_t i)
{
    return path_append(c, "[%zu]", i);
}

void tk_path_pop(struct tk_ctx *c, size_t saved)
{
    c->path_len = saved;
    c->path[saved] = '\0';
}

__attribute__((format(printf, 2, 0))) static void vfail(struct tk_ctx *c, const char *fmt,
                                                        va_list ap)
{
    char msg[512];

    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (c->path_len)
        lora_errf_path(c->err, c->err_len, c->file, "%s: %s", c->path, msg);
    else
        lora_errf_path(c->err, c->err_len, c->file, "%s", msg);
}

int tk_fail(struct tk_ctx *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfail(c, fmt, ap);
    va_end(ap);
    return -1;
}

int tk_fail_key(struct tk_ctx *c, const char *key, const char *fmt, ...)
{
    size_t saved = tk_path_key(c, key);
    va_list ap;

    va_start(ap, fmt);
    vfail(c, fmt, ap);
    va_end(ap);
    tk_path_pop(c, saved);
    return -1;
}

int tk_check_object(struct tk_ctx *c, const json_t *v, const char *const *known)
{
    const char *key;
    json_t *val;

    if (!json_is_object(v))
        return tk_fail(c, "must be an object");
    json_object_foreach ((json_t *)v, key, val) {
        const char *const *k = known;

        while (*k && strcmp(*k, key) != 0)
            k++;
        if (!*k)
            return tk_fail_key(c, key, "unsupported key '%s'", key);
    }
    return 0;
}

const char *tk_get_type(struct tk_ctx *c, const json_t *v)
{
    json_t *t = json_object_get(v, "type");

    if (!json_is_object(v)) {
        tk_fail(c, "must be an object");
        return NULL;
    }
    if (!json_is_string(t)) {
        tk_fail_key(c, "type", t ? "must be a string" : "is missing");
        return NULL;
    }
    return json_string_value(t);
}

int tk_get_bool(struct tk_ctx *c, const json_t *obj, const char *key, bool def, bool *out)
{
    json_t *v = json_object_get(obj, key);

    *out = def;
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return tk_fail_key(c, key, "must be true or false");
    *out = json_is_true(v);
    return 0;
}

int tk_get_int(struct tk_ctx *c, const json_t *obj, const char *key, long long lo, long long hi,
               long long def, long long *out)
{
    json_t *v = json_object_get(obj, key);

    *out = def;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return tk_fail_key(c, key, "must be an integer in [%lld, %lld]", lo, hi);
    *out = json_integer_value(v);
    return 0;
}

int tk_get_str(struct tk_ctx *c, const json_t *obj, const char *key, bool required,
               const char **out, size_t *len)
{
    json_t *v = json_object_get(obj, key);

    *out = NULL;
    *len = 0;
    if (!v || json_is_null(v)) {
        if (required)
            return tk_fail_key(c, key, "is missing");
        return 0;
    }
    if (!json_is_string(v))
        return tk_fail_key(c, key, "must be a string");
    *out = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

int tk_get_char(struct tk_ctx *c, const json_t *obj, const char *key, uint32_t def, uint32_t *cp)
{
    const char *s;
    size_t n;

    *cp = def;
    if (tk_get_str(c, obj, key, false, &s, &n) < 0)
        return -1;
    if (!s)
        return 0;
    if (n == 0 || tk_utf8_check(s, n) != n || (size_t)tk_utf8_get(s, cp) != n)
        return tk_fail_key(c, key, "must be exactly one character");
    return 0;
}

char *tk_strdup(struct tk_ctx *c, const char *s, size_t n)
{
    char *p = malloc(n + 1);

    if (!p) {
        tk_fail(c, "out of memory");
        return NULL;
    }
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

int tk_parse_sequence(struct tk_ctx *c, const json_t *v, const char *key,
                      int (*each)(struct tk_ctx *c, const json_t *item, void *arg), void *arg)
{
    const char *const keys[] = {"type", key, NULL};
    json_t *arr = json_object_get(v, key), *item;
    size_t i;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_is_array(arr))
        return tk_fail_key(c, key, arr ? "must be an array" : "is missing");
    size_t saved = tk_path_key(c, key);
    json_array_foreach (arr, i, item) {
        size_t at = tk_path_index(c, i);

        if (each(c, item, arg) < 0)
            return -1;
        tk_path_pop(c, at);
    }
    tk_path_pop(c, saved);
    return 0;
}

struct flat {
    const char *key;
    tk_leaf_fn leaf;
    void *arg;
};

static int flat_element(struct tk_ctx *c, const json_t *item, void *arg)
{
    struct flat *f = arg;
    const char *type = tk_get_type(c, item);

    if (!type)
        return -1;
    if (strcmp(type, "Sequence") == 0)
        return tk_parse_sequence(c, item, f->key, flat_element, f);
    return f->leaf(c, item, type, f->arg);
}

int tk_parse_flat(struct tk_ctx *c, const json_t *v, const char *key, tk_leaf_fn leaf, void *arg)
{
    struct flat f = {key, leaf, arg};

    return flat_element(c, v, &f);
}

void *tk_array_append(struct tk_ctx *c, void *v, size_t *n, size_t size)
{
    char *p = realloc(v, (*n + 1) * size);

    if (!p) {
        tk_fail(c, "out of memory");
        return NULL;
    }
    memset(p + *n * size, 0, size);
    (*n)++;
    return p;
}
