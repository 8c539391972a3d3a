/* lora-inspect decode: concatenated msgpack maps on standard input (as events --msgpack writes
 * them, or a capture) to records, one per map, as they arrive: a live stream is decoded while
 * it flows.
 *
 * lora_msg_scan (lib/wire/msg_scan.c) finds where each map ends without allocating for what a
 * header declares; the input buffer holds at most one message (LORA_MSG_MAX_BODY bytes) plus
 * one read. Each complete map goes through lora_msg_to_json. The first malformed map, one larger than LORA_MSG_MAX_BODY,
 * or a final map cut short ends the command with exit 1 and a message naming the message's
 * number and byte offset in the input, after every record before it has been written.
 * --msgpack writes the maps back as they were read: a validating filter. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inspect.h"

#define READ_BYTES (64u << 10)

static const struct cmd_info info = {
    "decode",
    "[OPTIONS] < MESSAGES",
    "Reads concatenated msgpack maps (lora-inspect events --msgpack, a capture) from standard\n"
    "input and writes one record per map; exit 1 at the first malformed or truncated map.",
};

static const char *const columns[] = {"offset", "type", "summary"};
static const int widths[] = {10, 16};

struct decoder {
    struct out *o;
    unsigned char *buf;
    size_t len, cap; /* bytes in buf, and its size */
    uint64_t base;   /* offset in the input of buf[0] */
    uint64_t n_msgs; /* messages written */
    char why[1024];  /* what ended the decoding, printed after the records are out */
};

/* Writes the record of the complete map msg[0..len) at input offset off. 0, or -1 with err. */
static int emit(struct decoder *d, const unsigned char *msg, size_t len, uint64_t off, char *err,
                size_t err_len)
{
    struct lora_buf text = {0};
    char why[512];

    if (lora_msg_to_json(msg, len, &text, why, sizeof(why)) < 0) {
        snprintf(err, err_len, "%s", why);
        lora_buf_release(&text);
        return -1;
    }
    d->n_msgs++;
    if (d->o->format == OUT_MSGPACK) {
        out_raw(d->o, msg, len);
        lora_buf_release(&text);
        return 0;
    }
    /* A map, as scan_map() checked, so only memory can fail here. */
    json_t *m = must(json_loadb(text.data, text.len, 0, NULL));
    lora_buf_release(&text);
    const char *type = type_of(m);
    json_t *rec = out_new_record("message");
    json_object_set_new(rec, "offset", json_integer((json_int_t)off));
    json_object_set_new(rec, "type", type ? json_string(type) : json_null());
    json_object_set(rec, "message", m);
    char offset[32], *summary = summary_of(m);
    snprintf(offset, sizeof(offset), "%llu", (unsigned long long)off);
    const char *cells[3] = {offset, type ? type : "-", summary};
    out_record(d->o, rec, cells);
    free(summary);
    json_decref(rec);
    json_decref(m);
    return 0;
}

/* Reads more input behind what buf holds. Returns the bytes read, 0 at end of input, -1. */
static ssize_t fill(struct decoder *d)
{
    if (d->cap - d->len < READ_BYTES) {
        d->cap = d->len + READ_BYTES;
        d->buf = must(realloc(d->buf, d->cap));
    }
    for (;;) {
        ssize_t n = read(STDIN_FILENO, d->buf + d->len, READ_BYTES);
        if (n >= 0 || errno != EINTR)
            return n;
    }
}

/* lora_msg_scan for a value that must be a map: LORA_MSG_SCAN_MALFORMED with *len 0 when its
 * first byte starts anything else. */
static enum lora_msg_scan_result scan_map(struct lora_msg_scan *st, const unsigned char *data,
                                          size_t avail, size_t *len)
{
    if (st->pos == 0 && avail > 0 && !lora_msg_scan_is_map(data[0])) { /* at the first byte */
        *len = 0;
        return LORA_MSG_SCAN_MALFORMED;
    }
    return lora_msg_scan(st, data, avail, len);
}

/* Decodes standard input to the end. Returns the exit status. */
static int run(struct decoder *d)
{
    struct lora_msg_scan st = {0};
    size_t start = 0, mlen;
    char err[640];

    for (;;) {
        enum lora_msg_scan_result r = scan_map(&st, d->buf + start, d->len - start, &mlen);
        uint64_t off = d->base + start, n = d->n_msgs + 1;
        switch (r) {
        case LORA_MSG_SCAN_DONE:
            if (emit(d, d->buf + start, mlen, off, err, sizeof(err)) < 0) {
                snprintf(d->why, sizeof(d->why),
                         "unable to decode standard input: message %llu at byte %llu: %s",
                         (unsigned long long)n, (unsigned long long)off, err);
                return EXIT_NO;
            }
            start += mlen;
            st = (struct lora_msg_scan){0};
            continue;
        case LORA_MSG_SCAN_MALFORMED:
            if (mlen == 0)
                snprintf(d->why, sizeof(d->why),
                         "unable to decode standard input: message %llu at byte %llu: not a "
                         "msgpack map (it starts with byte 0x%02x)",
                         (unsigned long long)n, (unsigned long long)off, d->buf[start]);
            else
                snprintf(d->why, sizeof(d->why),
                         "unable to decode standard input: message %llu at byte %llu: byte 0x%02x "
                         "at byte %llu is not msgpack",
                         (unsigned long long)n, (unsigned long long)off, d->buf[start + mlen],
                         (unsigned long long)(off + mlen));
            return EXIT_NO;
        case LORA_MSG_SCAN_TOO_LARGE:
            snprintf(d->why, sizeof(d->why),
                     "unable to decode standard input: message %llu at byte %llu: larger than "
                     "%u bytes (LORA_MSG_MAX_BODY)",
                     (unsigned long long)n, (unsigned long long)off, LORA_MSG_MAX_BODY);
            return EXIT_NO;
        case LORA_MSG_SCAN_MORE:
            break;
        }
        /* Keep only the message in progress, then wait for more with the output flushed. */
        memmove(d->buf, d->buf + start, d->len - start);
        d->base += start;
        d->len -= start;
        start = 0;
        if (out_flush(d->o) < 0)
            return 0; /* out_status() tells */
        ssize_t got = fill(d);
        if (got < 0) {
            snprintf(d->why, sizeof(d->why), "unable to read standard input: %s", strerror(errno));
            return EXIT_SYSTEM;
        }
        if (got == 0) {
            if (d->len == 0)
                return 0;
            snprintf(d->why, sizeof(d->why),
                     "unable to decode standard input: message %llu at byte %llu: truncated: "
                     "the input ends after %zu of its bytes",
                     (unsigned long long)(d->n_msgs + 1), (unsigned long long)d->base, d->len);
            return EXIT_NO;
        }
        d->len += (size_t)got;
    }
}

int cmd_decode(int argc, char **argv)
{
    struct common_opts c;
    args_init(&c);
    const struct lora_cli_opt options[] = {OPT_FORMATS(&c), OPT_HELP(&c), {0}};
    struct decoder d = {0};
    struct out o;

    int p = args_parse(&info, options, argc, argv, &c);
    if (p != 0)
        return p > 0 ? 0 : EXIT_USAGE;
    out_init(&o, c.format, columns, 3, true, widths);
    d.o = &o;
    int rc = run(&d);
    out_end(&o);
    if (d.why[0])
        die_msg("%s", d.why);
    free(d.buf);
    return out_status(&o, rc);
}
