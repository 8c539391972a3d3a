/* lora-inspect: one line that says what a protocol message holds, for the SUMMARY column of
 * events and decode. It reads the message as JSON (lora_msg_to_json) and never fails: a field
 * that is missing or of another type shows as "-". The wording may change between releases;
 * programs read --json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

const char *type_of(const json_t *msg)
{
    return json_string_value(json_object_get(msg, "type"));
}

/* A growable line. */
struct line {
    char *s;
    size_t len, cap;
};

static void add(struct line *l, const char *text)
{
    size_t n = strlen(text);

    if (l->len + n + 1 > l->cap) {
        l->cap = (l->len + n + 1) * 2;
        l->s = must(realloc(l->s, l->cap));
    }
    memcpy(l->s + l->len, text, n + 1);
    l->len += n;
}

/* Appends " LABEL VALUE" (or "LABEL VALUE" at the start) for field key of msg. */
static void field(struct line *l, const json_t *msg, const char *label, const char *key)
{
    char *cell = must(out_cell(json_object_get(msg, key)));

    if (l->len)
        add(l, " ");
    if (*label) {
        add(l, label);
        add(l, " ");
    }
    add(l, cell);
    free(cell);
}

/* Appends " LABEL a,b,c" for an array of strings (empty entries as "-": a free slot). */
static void names(struct line *l, const json_t *list, const char *label)
{
    size_t i;
    json_t *v;

    add(l, l->len ? " " : "");
    add(l, label);
    add(l, " [");
    json_array_foreach (list, i, v) {
        const char *s = json_string_value(v);
        if (i)
            add(l, ",");
        add(l, s && *s ? s : "-");
    }
    add(l, "]");
}

static void state(struct line *l, const json_t *st)
{
    names(l, json_object_get(st, "slots"), "slots");
    names(l, json_object_get(st, "cpu"), "cpu");
    names(l, json_object_get(st, "pinned"), "pinned");
}

static void stats(struct line *l, const json_t *m)
{
    char kv[64];
    json_t *u = json_object_get(m, "kv_usage");

    field(l, m, "running", "running");
    field(l, m, "waiting", "waiting");
    snprintf(kv, sizeof(kv), " kv %.3f", json_is_number(u) ? json_number_value(u) : 0.0);
    add(l, kv);
    field(l, m, "step_adapters", "step_adapters");
    field(l, m, "step_tokens", "step_tokens");
}

static void notifications(struct line *l, const json_t *m)
{
    json_t *items = json_object_get(m, "items");
    char n[32];

    field(l, m, "rank", "rank");
    snprintf(n, sizeof(n), " items %zu", json_array_size(items));
    add(l, n);
    field(l, m, "dropped", "dropped");
    json_t *last = json_array_get(items, json_array_size(items) - 1);
    if (last)
        state(l, json_object_get(last, "state"));
}

static void registry(struct line *l, const json_t *m)
{
    json_t *ads = json_object_get(m, "adapters"), *a;
    size_t i;

    field(l, m, "engine", "engine");
    add(l, " adapters [");
    json_array_foreach (ads, i, a) {
        const char *s = json_string_value(json_object_get(a, "name"));
        if (i)
            add(l, ",");
        add(l, s ? s : "-");
    }
    add(l, "]");
}

char *summary_of(const json_t *msg)
{
    const char *t = type_of(msg);
    struct line l = {0};

    add(&l, "");
    if (!t)
        return l.s;
    if (strcmp(t, "ready") == 0) {
        json_t *lim = json_object_get(msg, "limits");
        field(&l, msg, "engine", "engine_index");
        field(&l, msg, "model", "model");
        field(&l, lim, "world_size", "world_size");
        field(&l, lim, "max_loras", "max_loras");
        field(&l, lim, "max_cpu_loras", "max_cpu_loras");
    } else if (strcmp(t, "residency_reply") == 0) {
        field(&l, msg, "rank", "rank");
        state(&l, json_object_get(msg, "state"));
    } else if (strcmp(t, "stats") == 0) {
        stats(&l, msg);
    } else if (strcmp(t, "event") == 0) {
        field(&l, msg, "", "event");
        field(&l, msg, "request", "request_id");
        field(&l, msg, "lora", "lora");
        if (json_object_get(msg, "finish_reason"))
            field(&l, msg, "reason", "finish_reason");
    } else if (strcmp(t, "notifications") == 0) {
        notifications(&l, msg);
    } else if (strcmp(t, "registry") == 0) {
        registry(&l, msg);
    } else if (strcmp(t, "request_stats") == 0) {
        field(&l, msg, "request", "request_id");
        field(&l, msg, "lora", "lora");
        field(&l, msg, "reason", "finish_reason");
        field(&l, msg, "prompt", "num_prompt_tokens");
        field(&l, msg, "generated", "num_generation_tokens");
    } else if (strcmp(t, "control_reply") == 0) {
        field(&l, msg, "id", "id");
        field(&l, msg, "ok", "ok");
        if (json_object_get(msg, "error"))
            field(&l, msg, "error", "error");
    }
    return l.s;
}
