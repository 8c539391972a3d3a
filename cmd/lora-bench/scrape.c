/* lora-bench: reading samples out of a Prometheus text exposition (what GET /metrics
 * returns); see bench.h. Comment lines, blank lines and lines that do not parse as a sample
 * are skipped; a label value's escapes (\", \\, \n) are understood when matching. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "bench.h"

struct sample {
    const char *name;
    size_t name_len;
    const char *labels; /* between the braces, or NULL */
    size_t labels_len;
    double value;
};

static bool parse_sample(const char *line, size_t len, struct sample *s)
{
    size_t i = 0;

    while (i < len && (line[i] == ' ' || line[i] == '\t'))
        i++;
    if (i == len || line[i] == '#')
        return false;
    s->name = line + i;
    while (i < len && line[i] != '{' && line[i] != ' ' && line[i] != '\t')
        i++;
    s->name_len = (size_t)(line + i - s->name);
    s->labels = NULL;
    s->labels_len = 0;
    if (i < len && line[i] == '{') {
        size_t start = ++i;
        bool quoted = false;
        for (; i < len; i++) {
            if (quoted && line[i] == '\\') {
                i++;
                continue;
            }
            if (line[i] == '"')
                quoted = !quoted;
            else if (!quoted && line[i] == '}')
                break;
        }
        if (i == len)
            return false;
        s->labels = line + start;
        s->labels_len = i - start;
        i++;
    }
    while (i < len && (line[i] == ' ' || line[i] == '\t'))
        i++;
    if (i == len)
        return false;
    char num[64];
    size_t n = 0;
    while (i < len && line[i] != ' ' && line[i] != '\t' && n < sizeof(num) - 1)
        num[n++] = line[i++];
    num[n] = 0;
    char *end;
    s->value = strtod(num, &end);
    return end != num && *end == 0 && s->name_len > 0;
}

/* The value of label key in s, unescaped into out; false when s has no such label. */
static bool label_value(const struct sample *s, const char *key, struct lora_buf *out)
{
    size_t klen = strlen(key), i = 0;
    const char *p = s->labels;

    lora_buf_reset(out);
    while (p && i < s->labels_len) {
        while (i < s->labels_len && (p[i] == ',' || p[i] == ' '))
            i++;
        size_t ks = i;
        while (i < s->labels_len && p[i] != '=')
            i++;
        size_t kl = i - ks;
        if (i + 1 >= s->labels_len || p[i + 1] != '"')
            return false;
        i += 2;
        bool match = kl == klen && memcmp(p + ks, key, klen) == 0;
        for (; i < s->labels_len && p[i] != '"'; i++) {
            char c = p[i];
            if (c == '\\' && i + 1 < s->labels_len) {
                c = p[++i];
                if (c == 'n')
                    c = '\n';
            }
            if (match)
                lora_buf_add_char(out, c);
        }
        i++;
        if (match) {
            lora_buf_add(out, "", 0); /* a NUL even when empty */
            return true;
        }
    }
    return false;
}

/* Calls fn on every sample of family name. */
static void each_sample(const char *text, const char *name,
                        void (*fn)(const struct sample *s, void *ctx), void *ctx)
{
    size_t nl = strlen(name);
    const char *p = text;

    while (p && *p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        struct sample s;
        if (parse_sample(p, len, &s) && s.name_len == nl && memcmp(s.name, name, nl) == 0)
            fn(&s, ctx);
        p = e ? e + 1 : NULL;
    }
}

struct sum_ctx {
    const char *label, *value;
    double sum;
    bool found;
    struct lora_buf lv;
};

static void add_to_sum(const struct sample *s, void *ctx)
{
    struct sum_ctx *c = ctx;
    if (c->label && (!label_value(s, c->label, &c->lv) || strcmp(c->lv.data, c->value) != 0))
        return;
    if (!isfinite(s->value))
        return;
    c->sum += s->value;
    c->found = true;
}

double scrape_sum(const char *text, const char *name, const char *label, const char *value,
                  bool *found)
{
    struct sum_ctx c = {.label = label, .value = value};
    each_sample(text, name, add_to_sum, &c);
    lora_buf_release(&c.lv);
    if (found)
        *found = c.found;
    return c.sum;
}

struct by_ctx {
    const char *label;
    json_t *out;
    struct lora_buf lv;
};

static void add_by_label(const struct sample *s, void *ctx)
{
    struct by_ctx *c = ctx;
    if (!label_value(s, c->label, &c->lv) || !isfinite(s->value))
        return;
    double prev = json_real_value(json_object_get(c->out, c->lv.data));
    json_object_set_new(c->out, c->lv.data, json_real(prev + s->value));
}

json_t *scrape_by_label(const char *text, const char *name, const char *label)
{
    struct by_ctx c = {.label = label, .out = json_object()};
    each_sample(text, name, add_by_label, &c);
    lora_buf_release(&c.lv);
    return c.out;
}
