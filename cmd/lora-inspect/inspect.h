/* lora-inspect: residency dumps, live event streams, stats, config, health and msgpack decoding,
 * for people and pipes (docs/design.md, "Inspection"). One file per job: main.c dispatches the
 * commands, args.c parses the options they share, output.c writes records in the four formats,
 * control.c asks the engine's control socket, summary.c condenses a protocol message into one
 * line, and residency.c, record.c, events.c and decode.c are the commands (decode finds where
 * each message ends with lib/wire's lora_msg_scan).
 *
 * Every command returns the process exit status: 0 ok, 1 no (an unhealthy engine, malformed
 * input to decode), 100 usage, 111 system failure (the engine cannot be reached in time, a
 * write to standard output fails). Messages go to standard error as
 * "lora-inspect: fatal: unable to X: reason"; standard output carries records only.
 *
 * Every JSON record is one line holding "version" (INSPECT_RECORD_VERSION) and "kind"; the
 * schema of each kind is in man/lora-inspect.1, OUTPUT, and only grows (new keys, new kinds).
 */
#ifndef LORA_INSPECT_H
#define LORA_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/cli.h"
#include "wire/msg.h"

#include "base/exit_codes.h"

#define INSPECT_RECORD_VERSION 1
#define INSPECT_ENV_PREFIX     "LORA_INSPECT"
#define INSPECT_TIMEOUT_MS     5000 /* default of --timeout-ms */
#define INSPECT_MAX_RANKS      1024 /* ranks a residency reply or a config may declare */

/* ---- args.c: the options commands share ------------------------------------------------ */

enum out_format {
    OUT_TABLE,   /* aligned columns, for people: the default on a terminal */
    OUT_JSON,    /* JSON lines: the default elsewhere */
    OUT_TSV,     /* header line, then tab-separated rows, tabs and newlines escaped */
    OUT_MSGPACK, /* the msgpack maps as received, concatenated */
};

/* What a command's option table may point at. Not every command uses every field. */
struct common_opts {
    bool table, json, tsv, msgpack, help;
    const char *run_dir;
    const char *control_endpoint;
    const char *publish_endpoint;
    long timeout_ms;
    enum out_format format; /* resolved by args_parse() */
};

/* One command: its name, the words after "lora-inspect NAME" in its usage line, a sentence. */
struct cmd_info {
    const char *name;
    const char *synopsis;
    const char *about;
};

/* Entries of an option table, in the order the usage text lists them. */
#define OPT_RUN_DIR(c)                                                                             \
    {                                                                                              \
        "run-dir", LORA_OPT_STRING, &(c)->run_dir, "DIR",                                          \
            "the engine's run directory (control.sock, publish.sock)"                              \
    }
#define OPT_CONTROL_ENDPOINT(c)                                                                    \
    {                                                                                              \
        "control-endpoint", LORA_OPT_STRING, &(c)->control_endpoint, "EP",                         \
            "the engine's control socket (instead of DIR/control.sock)"                            \
    }
#define OPT_PUBLISH_ENDPOINT(c)                                                                    \
    {                                                                                              \
        "publish-endpoint", LORA_OPT_STRING, &(c)->publish_endpoint, "EP",                         \
            "the engine's publish socket (instead of DIR/publish.sock)"                            \
    }
#define OPT_TIMEOUT_MS(c)                                                                          \
    {                                                                                              \
        "timeout-ms", LORA_OPT_INT, &(c)->timeout_ms, "MS",                                        \
            "give up on the engine after this long (5000)", 1, 86400000                            \
    }
#define OPT_FORMATS(c)                                                                             \
    {"table", LORA_OPT_FLAG, &(c)->table, NULL, "aligned columns (the default on a terminal)"},    \
        {"json", LORA_OPT_FLAG, &(c)->json, NULL, "JSON lines (the default elsewhere)"},           \
        {"tsv", LORA_OPT_FLAG, &(c)->tsv, NULL, "tab-separated values with a header line"},        \
    {                                                                                              \
        "msgpack", LORA_OPT_FLAG, &(c)->msgpack, NULL, "the msgpack maps as received"              \
    }
#define OPT_HELP(c)                                                                                \
    {                                                                                              \
        "help", LORA_OPT_FLAG, &(c)->help, NULL, "show this help"                                  \
    }

/* Sets the defaults a command starts from (timeout INSPECT_TIMEOUT_MS). */
void args_init(struct common_opts *c);

/* Parses argv[1..argc) of command ci against opts (terminated by a zero entry), the environment
 * (LORA_INSPECT_<NAME>) first. The command line wins: a format flag given there replaces the
 * environment's, and a repeatable option given there replaces the environment's values.
 * Resolves c->format (two format flags from one source are a usage error).
 * Returns 0 to go on, 1 when --help was printed (exit 0), or -1 after printing a usage error
 * (exit EXIT_USAGE). */
int args_parse(const struct cmd_info *ci, const struct lora_cli_opt *opts, int argc, char **argv,
               struct common_opts *c);

/* The endpoint to connect to: given when set, else ipc://RUN_DIR/SOCK_NAME in buf, RUN_DIR being
 * --run-dir or, when that is not given either, lora-stack's default run directory if it exists.
 * Returns NULL after printing a usage error when there is none of these. */
const char *args_endpoint(const struct cmd_info *ci, const struct common_opts *c, const char *given,
                          const char *option, const char *sock_name, char *buf, size_t len);

/* Prints "lora-inspect: fatal: FMT" to standard error. */
void die_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- output.c: records in four formats on standard output ------------------------------ */

struct out {
    enum out_format format;
    bool stream;             /* write and flush every record at once (events, decode) */
    int n_cols;              /* columns of table and TSV rows */
    const char *const *cols; /* their names: TSV header as given, table header in capitals */
    const int *widths;       /* stream tables: the width of each column but the last */
    char **cells;            /* buffered table: n_rows * n_cols escaped strings, owned */
    size_t n_cells, cap_cells;
    struct lora_buf footer; /* table lines printed after the rows */
    bool header_done;
    int err; /* errno of the first failed write, 0 while none failed */
};

/* Prepares o for records of format; cols, n_cols and widths (may be NULL) are borrowed and
 * must outlive o. */
void out_init(struct out *o, enum out_format format, const char *const *cols, int n_cols,
              bool stream, const int *widths);

/* Writes one record: rec as a JSON line in OUT_JSON, cells (n_cols strings) as a row in
 * OUT_TABLE and OUT_TSV; nothing in OUT_MSGPACK. rec and cells are borrowed. */
void out_record(struct out *o, json_t *rec, const char *const *cells);

/* Writes bytes as they are (OUT_MSGPACK). */
void out_raw(struct out *o, const void *data, size_t len);

/* A line printed under the table (OUT_TABLE only; ignored in the other formats). */
void out_footer(struct out *o, const char *line);

/* Flushes standard output. Returns 0, or -1 with errno of the first failed write. */
int out_flush(struct out *o);

/* Prints a buffered table and its footer, flushes, frees what o holds. Returns as out_flush. */
int out_end(struct out *o);

/* The exit status after output failed or not: rc when everything was written or when the reader
 * went away (EPIPE: `| head -1` is not an error), else EXIT_SYSTEM after a message. */
int out_status(const struct out *o, int rc);

/* A JSON value as a table or TSV cell: strings as they are, null as "-", the rest as compact
 * JSON. Returns a string the caller frees, NULL when out of memory. */
char *out_cell(const json_t *v);

/* A new JSON record {"version": INSPECT_RECORD_VERSION, "kind": kind}; aborts on OOM. */
json_t *out_new_record(const char *kind);

/* Aborts with a message when p is NULL: for small bookkeeping allocations. */
void *must(void *p);

/* ---- control.c: one request on the engine's control socket ----------------------------- */

struct ctl_reply {
    bool ok;
    char *error; /* the reply's error, owned; NULL when absent */
    void *data;  /* the reply's data, msgpack bytes exactly as received, owned; NULL */
    size_t data_len;
    json_t *json; /* data as JSON (lora_msg_to_json), owned; NULL when absent */
};

/* Sends control op to the engine at endpoint and waits for the control_reply with its id, for
 * at most timeout_ms in all, sending heartbeats every LORA_HEARTBEAT_INTERVAL_MS while it
 * waits. Returns 0 with *out filled (ok or not: the engine answered), or -1 with "unable to ..."
 * in err (not reached in time, a malformed reply). */
int ctl_request(const char *endpoint, enum lora_control_op op, long timeout_ms,
                struct ctl_reply *out, char *err, size_t err_len);

void ctl_reply_release(struct ctl_reply *r);

/* Why nobody answers at endpoint, when an ipc:// socket file says so: " ('PATH': No such file
 * or directory)" in buf, else "". */
void why_silent(const char *endpoint, char *buf, size_t len);

/* ---- summary.c ------------------------------------------------------------------------- */

/* A short line saying what message msg (a decoded protocol map, as JSON) holds, such as
 * "running 1 waiting 0 kv 0.03 step adapters 1 tokens 7". Returns a string the caller frees. */
char *summary_of(const json_t *msg);

/* The message's "type" when it is a string, else NULL (borrowed from msg). */
const char *type_of(const json_t *msg);

/* ---- the commands ---------------------------------------------------------------------- */

int cmd_residency(int argc, char **argv);
int cmd_events(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_health(int argc, char **argv);
int cmd_decode(int argc, char **argv);

#endif
