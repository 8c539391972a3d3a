/* lora-inspect stats, config and health: one control reply as one record (man/lora-engine.1,
 * CONTROL, says what each holds). The record is {"version", "kind"} followed by the keys of the
 * reply's data map in the engine's order (data keys named "version" or "kind" would be dropped:
 * those two belong to the record). A table shows one "key value" line per key, TSV a header
 * of the keys and one row; neither repeats version and kind. --msgpack writes the data map as
 * the engine sent it.
 *
 * health exits 0 when the engine is healthy and 1 when not, with the reason on standard error
 * and in the record; the engine answers an unhealthy health request with ok false, its error
 * the reason, and the data map still there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

static const struct cmd_info stats_info = {
    "stats",
    "[--run-dir DIR | --control-endpoint EP] [OPTIONS]",
    "The engine's requests running and waiting, key/value blocks free and in all, and\n"
    "preemptions since start, as one record.",
};

static const struct cmd_info config_info = {
    "config",
    "[--run-dir DIR | --control-endpoint EP] [OPTIONS]",
    "The engine's model directory and limits (slots, CPU cache, ranks, blocks, lengths) and the\n"
    "default sampling parameters of its generation config, as one record.",
};

static const struct cmd_info health_info = {
    "health",
    "[--run-dir DIR | --control-endpoint EP] [OPTIONS]",
    "Whether the engine is healthy, as one record; exit 0 when healthy, 1 when not (the reason\n"
    "on standard error), 111 when the engine does not answer within --timeout-ms.",
};

static bool is_reserved(const char *key)
{
    return strcmp(key, "version") == 0 || strcmp(key, "kind") == 0;
}

/* {"version", "kind"} and the keys of data (a JSON object, or NULL). */
static json_t *make_record(const char *kind, json_t *data)
{
    json_t *rec = out_new_record(kind);
    const char *key;
    json_t *v;

    json_object_foreach (data, key, v) {
        if (!is_reserved(key))
            json_object_set(rec, key, v);
    }
    return rec;
}

static void emit_table(struct out *o, json_t *rec)
{
    const char *key;
    json_t *v;

    json_object_foreach (rec, key, v) {
        if (is_reserved(key))
            continue;
        char *cell = must(out_cell(v));
        const char *cells[2] = {key, cell};
        out_record(o, NULL, cells);
        free(cell);
    }
}

static void emit_tsv(json_t *rec, struct out *tsv_out, enum out_format format)
{
    size_t n = json_object_size(rec), k = 0;
    const char **cols = must(calloc(n + 1, sizeof(*cols)));
    char **cells = must(calloc(n + 1, sizeof(*cells)));
    const char *key;
    json_t *v;

    json_object_foreach (rec, key, v) {
        if (is_reserved(key))
            continue;
        cols[k] = key;
        cells[k++] = must(out_cell(v));
    }
    out_init(tsv_out, format, cols, (int)k, false, NULL);
    out_record(tsv_out, rec, (const char *const *)cells);
    out_end(tsv_out);
    for (size_t i = 0; i < k; i++)
        free(cells[i]);
    free(cells);
    free(cols);
}

/* Writes rec (and the raw data for --msgpack) in format. Returns the exit status given rc. */
static int emit(const struct common_opts *c, json_t *rec, const struct ctl_reply *reply, int rc)
{
    static const char *const kv_columns[] = {"key", "value"};
    struct out o;

    switch (c->format) {
    case OUT_TSV:
        emit_tsv(rec, &o, c->format);
        return out_status(&o, rc);
    case OUT_TABLE:
        out_init(&o, c->format, kv_columns, 2, false, NULL);
        emit_table(&o, rec);
        break;
    case OUT_JSON:
        out_init(&o, c->format, NULL, 0, false, NULL);
        out_record(&o, rec, NULL);
        break;
    case OUT_MSGPACK:
        out_init(&o, c->format, NULL, 0, false, NULL);
        if (reply->data)
            out_raw(&o, reply->data, reply->data_len);
        break;
    }
    out_end(&o);
    return out_status(&o, rc);
}

/* Parses the options, asks op, and hands the reply to the command. Returns -2 to go on with
 * *reply and *c filled, or the exit status. */
static int ask(const struct cmd_info *ci, enum lora_control_op op, int argc, char **argv,
               struct common_opts *c, struct ctl_reply *reply, const char **endpoint)
{
    static char epbuf[4200];
    char err[1024];

    args_init(c);
    const struct lora_cli_opt options[] = {
        OPT_RUN_DIR(c),    OPT_CONTROL_ENDPOINT(c),
        OPT_TIMEOUT_MS(c), OPT_FORMATS(c),
        OPT_HELP(c),       {0},
    };
    int p = args_parse(ci, options, argc, argv, c);
    if (p != 0)
        return p > 0 ? 0 : EXIT_USAGE;
    *endpoint = args_endpoint(ci, c, c->control_endpoint, "control-endpoint", "control.sock", epbuf,
                              sizeof(epbuf));
    if (!*endpoint)
        return EXIT_USAGE;
    if (ctl_request(*endpoint, op, c->timeout_ms, reply, err, sizeof(err)) < 0) {
        die_msg("%s", err);
        return EXIT_SYSTEM;
    }
    return -2;
}

static int plain(const struct cmd_info *ci, enum lora_control_op op, int argc, char **argv)
{
    struct common_opts c;
    struct ctl_reply reply;
    const char *ep;

    int rc = ask(ci, op, argc, argv, &c, &reply, &ep);
    if (rc != -2)
        return rc;
    if (!reply.ok || !reply.json) {
        die_msg("unable to get %s from '%s': %s", ci->name, ep,
                reply.error ? reply.error : "the reply has no data");
        ctl_reply_release(&reply);
        return EXIT_SYSTEM;
    }
    json_t *rec = make_record(ci->name, reply.json);
    rc = emit(&c, rec, &reply, 0);
    json_decref(rec);
    ctl_reply_release(&reply);
    return rc;
}

int cmd_stats(int argc, char **argv)
{
    return plain(&stats_info, LORA_CTL_STATS, argc, argv);
}

int cmd_config(int argc, char **argv)
{
    return plain(&config_info, LORA_CTL_CONFIG, argc, argv);
}

int cmd_health(int argc, char **argv)
{
    struct common_opts c;
    struct ctl_reply reply;
    const char *ep;

    int rc = ask(&health_info, LORA_CTL_HEALTH, argc, argv, &c, &reply, &ep);
    if (rc != -2)
        return rc;
    json_t *rec = make_record("health", reply.json);
    json_t *h = json_object_get(rec, "healthy");
    bool healthy = json_is_boolean(h) ? json_is_true(h) : reply.ok;
    const char *reason = json_string_value(json_object_get(rec, "reason"));
    if (!reason || !*reason)
        reason = reply.error ? reply.error : healthy ? "" : "no reason given";
    json_object_set_new(rec, "healthy", json_boolean(healthy));
    json_object_set_new(rec, "reason", json_string(reason));
    if (!healthy)
        fprintf(stderr, "lora-inspect: the engine at '%s' is unhealthy: %s\n", ep, reason);
    rc = emit(&c, rec, &reply, healthy ? 0 : EXIT_NO);
    json_decref(rec);
    ctl_reply_release(&reply);
    return rc;
}
