/* lora-inspect: records on standard output, in the four formats.
 *
 * JSON: one compact object per line. TSV: a header line of the column names, then one line per
 * record; in values a backslash, tab, newline and carriage return become \\, \t, \n and \r and
 * other control bytes \xHH, so every record is one line of n_cols fields. Table: the same
 * escaping, columns two spaces apart; a buffered table is aligned to its widest cell (in
 * characters, counting UTF-8 sequences as one), a stream table (events, decode) pads to fixed
 * widths so that every row can be printed when it arrives. Msgpack: bytes as they are.
 *
 * Write errors are remembered (the first errno) and end further writes; EPIPE, the reader
 * having gone away, is not an error for the exit status (out_status). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

void out_init(struct out *o, enum out_format format, const char *const *cols, int n_cols,
              bool stream, const int *widths)
{
    memset(o, 0, sizeof(*o));
    o->format = format;
    o->cols = cols;
    o->n_cols = n_cols;
    o->stream = stream;
    o->widths = widths;
}

static void put(struct out *o, const void *p, size_t n)
{
    if (o->err || n == 0)
        return;
    if (fwrite(p, 1, n, stdout) != n)
        o->err = errno ? errno : EIO;
}

static void puts_(struct out *o, const char *s)
{
    put(o, s, strlen(s));
}

static void pad(struct out *o, size_t n)
{
    static const char spaces[] = "                                ";
    while (n > 0) {
        size_t k = n < sizeof(spaces) - 1 ? n : sizeof(spaces) - 1;
        put(o, spaces, k);
        n -= k;
    }
}

/* s with backslash, tab, newline, carriage return and other control bytes escaped; owned. */
static char *escape(const char *s)
{
    size_t n = strlen(s);
    char *e = must(malloc(4 * n + 1)), *q = e;

    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '\\':
            *q++ = '\\';
            *q++ = '\\';
            break;
        case '\t':
            *q++ = '\\';
            *q++ = 't';
            break;
        case '\n':
            *q++ = '\\';
            *q++ = 'n';
            break;
        case '\r':
            *q++ = '\\';
            *q++ = 'r';
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                q += sprintf(q, "\\x%02x", *p);
            else
                *q++ = (char)*p;
        }
    }
    *q = 0;
    return e;
}

/* Characters of s on a terminal: UTF-8 continuation bytes take no room. */
static size_t width_of(const char *s)
{
    size_t w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        w += (*p & 0xc0) != 0x80;
    return w;
}

static void put_row(struct out *o, char *const *cells, const size_t *widths)
{
    for (int i = 0; i < o->n_cols; i++) {
        if (i > 0)
            put(o, o->format == OUT_TSV ? "\t" : "  ", o->format == OUT_TSV ? 1 : 2);
        puts_(o, cells[i]);
        if (widths && i + 1 < o->n_cols) {
            size_t w = width_of(cells[i]);
            pad(o, w < widths[i] ? widths[i] - w : 0);
        }
    }
    put(o, "\n", 1);
}

/* The header row: the column names, escaped, in capitals on a table. Owned strings in cells. */
static void header_cells(const struct out *o, char **cells)
{
    for (int i = 0; i < o->n_cols; i++) {
        cells[i] = escape(o->cols[i]);
        for (char *p = cells[i]; o->format == OUT_TABLE && *p; p++)
            if (*p >= 'a' && *p <= 'z')
                *p = (char)(*p - 'a' + 'A');
    }
}

static void free_cells(char **cells, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(cells[i]);
}

/* The fixed widths of a stream table, NULL for TSV; the caller frees them. */
static size_t *fixed_widths(const struct out *o)
{
    if (o->format != OUT_TABLE || !o->widths)
        return NULL;
    size_t *widths = must(calloc((size_t)o->n_cols, sizeof(*widths)));
    for (int i = 0; i + 1 < o->n_cols; i++)
        widths[i] = (size_t)o->widths[i];
    return widths;
}

/* Stream tables and TSV: the header line, once, even when no row follows. */
static void put_header(struct out *o, const size_t *widths)
{
    char **row = must(calloc((size_t)o->n_cols, sizeof(*row)));
    size_t *own = widths ? NULL : fixed_widths(o);

    header_cells(o, row);
    put_row(o, row, widths ? widths : own);
    free_cells(row, (size_t)o->n_cols);
    free(row);
    free(own);
    o->header_done = true;
}

/* Stream tables and TSV: the row goes out at once, after the header the first time. */
static void put_now(struct out *o, const char *const *cells)
{
    char **row = must(calloc((size_t)o->n_cols, sizeof(*row)));
    size_t *widths = fixed_widths(o);

    if (!o->header_done)
        put_header(o, widths);
    for (int i = 0; i < o->n_cols; i++)
        row[i] = escape(cells[i] ? cells[i] : "");
    put_row(o, row, widths);
    free_cells(row, (size_t)o->n_cols);
    free(row);
    free(widths);
}

void out_record(struct out *o, json_t *rec, const char *const *cells)
{
    if (o->format == OUT_JSON) {
        char *text = must(json_dumps(rec, JSON_COMPACT));
        puts_(o, text);
        put(o, "\n", 1);
        free(text);
    } else if (o->format == OUT_TSV || (o->format == OUT_TABLE && o->stream)) {
        put_now(o, cells);
    } else if (o->format == OUT_TABLE) {
        if (o->n_cells + (size_t)o->n_cols > o->cap_cells) {
            o->cap_cells = o->cap_cells ? 2 * o->cap_cells : (size_t)o->n_cols * 16;
            o->cells = must(realloc(o->cells, o->cap_cells * sizeof(*o->cells)));
        }
        for (int i = 0; i < o->n_cols; i++)
            o->cells[o->n_cells++] = escape(cells[i] ? cells[i] : "");
    }
}

void out_raw(struct out *o, const void *data, size_t len)
{
    put(o, data, len);
}

void out_footer(struct out *o, const char *line)
{
    if (o->format != OUT_TABLE)
        return;
    if (o->stream) {
        puts_(o, line);
        put(o, "\n", 1);
        return;
    }
    size_t n = strlen(line);
    char *d = must(realloc(o->footer.data, o->footer.len + n + 2));
    o->footer.data = d;
    memcpy(d + o->footer.len, line, n);
    o->footer.len += n;
    d[o->footer.len++] = '\n';
}

int out_flush(struct out *o)
{
    if (!o->err && fflush(stdout) != 0)
        o->err = errno ? errno : EIO;
    if (o->err) {
        errno = o->err;
        return -1;
    }
    return 0;
}

/* A buffered table: header and rows aligned to the widest cell of each column. */
static void put_table(struct out *o)
{
    size_t n_rows = o->n_cells / (size_t)o->n_cols;
    size_t *widths = must(calloc((size_t)o->n_cols, sizeof(*widths)));
    char **head = must(calloc((size_t)o->n_cols, sizeof(*head)));

    header_cells(o, head);
    for (int i = 0; i < o->n_cols; i++)
        widths[i] = width_of(head[i]);
    for (size_t r = 0; r < n_rows; r++)
        for (int i = 0; i < o->n_cols; i++) {
            size_t w = width_of(o->cells[r * (size_t)o->n_cols + (size_t)i]);
            widths[i] = w > widths[i] ? w : widths[i];
        }
    put_row(o, head, widths);
    for (size_t r = 0; r < n_rows; r++)
        put_row(o, o->cells + r * (size_t)o->n_cols, widths);
    free_cells(head, (size_t)o->n_cols);
    free(head);
    free(widths);
}

int out_end(struct out *o)
{
    if (o->format == OUT_TABLE && !o->stream && o->n_cols > 0)
        put_table(o);
    else if ((o->format == OUT_TSV || o->format == OUT_TABLE) && !o->header_done && o->n_cols > 0)
        put_header(o, NULL);
    if (o->format == OUT_TABLE && o->footer.len)
        put(o, o->footer.data, o->footer.len);
    free_cells(o->cells, o->n_cells);
    free(o->cells);
    free(o->footer.data);
    o->cells = NULL;
    o->n_cells = o->cap_cells = 0;
    o->footer = (struct lora_buf){0};
    return out_flush(o);
}

int out_status(const struct out *o, int rc)
{
    if (!o->err || o->err == EPIPE)
        return rc;
    die_msg("unable to write to standard output: %s", strerror(o->err));
    return EXIT_SYSTEM;
}

char *out_cell(const json_t *v)
{
    if (!v || json_is_null(v))
        return strdup("-");
    if (json_is_string(v))
        return strdup(json_string_value(v));
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

json_t *out_new_record(const char *kind)
{
    json_t *r = must(json_object());

    json_object_set_new(r, "version", json_integer(INSPECT_RECORD_VERSION));
    json_object_set_new(r, "kind", json_string(kind));
    return r;
}
