/* lora-metrics: the sources, on the main thread. Each --engine and --frontend endpoint is a SUB
 * socket subscribed to every topic, with a ZeroMQ socket monitor whose DISCONNECTED event tells
 * that the publisher went away (an engine that restarts breaks the connection: its counters
 * start again). --stdin is a stream of concatenated msgpack bodies, framed here with
 * lora_msg_scan (no allocation, a container's count bounded by the bytes a body may have): a
 * body that frames but does not decode is logged and skipped; bytes that do
 * not frame (or a body over LORA_MSG_MAX_BODY) end the stream, since nothing after them can be
 * trusted to start a message. Every message is applied to the state under the mutex as soon as
 * it is read, so it is visible to the next scrape.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "wire/msg.h"

#define DRAIN_MAX 256 /* messages taken from one socket before the others get a turn */

static void warn_malformed(struct metrics_source *s, const char *name, const char *err)
{
    if (s->n_logged++ % LORA_SOCK_LOG_EVERY == 0)
        fprintf(stderr, "lora-metrics: warning: '%s': dropped a message (%llu so far): %s\n",
                name, (unsigned long long)s->n_logged, err);
}

static void apply(struct metrics *m, struct metrics_source *s, int id, const char *name,
                  const void *body, size_t len)
{
    char err[512];

    pthread_mutex_lock(&m->mu);
    int rc = lora_metrics_state_apply(m->state, id, body, len, lora_clock_mono_ms(), err, sizeof(err));
    pthread_mutex_unlock(&m->mu);
    if (rc < 0)
        warn_malformed(s, name, err);
}

int sources_open(struct metrics *m, char *err, size_t err_len)
{
    if (m->use_stdin) {
        m->stdin_id = lora_metrics_state_add_source(m->state, "stdin", LORA_SOURCE_STDIN);
        if (m->stdin_id < 0 || fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK) < 0) {
            snprintf(err, err_len, "unable to read standard input: %s", strerror(errno));
            return -1;
        }
    }
    for (int i = 0; i < m->n_src; i++) {
        struct metrics_source *s = &m->src[i];
        s->id = lora_metrics_state_add_source(m->state, s->endpoint, s->kind);
        if (s->id < 0) {
            snprintf(err, err_len, "too many sources");
            return -1;
        }
        s->sock = lora_sock_new(m->zctx, ZMQ_SUB, s->endpoint, false, NULL, err, err_len);
        if (!s->sock || lora_sock_watch_disconnects(s->sock, m->zctx, err, err_len) < 0)
            return -1;
    }
    return 0;
}

void sources_close(struct metrics *m)
{
    for (int i = 0; i < m->n_src; i++)
        lora_sock_destroy(&m->src[i].sock);
}

/* The source's connection broke: its engine restarted or went away. */
static void monitor_event(struct metrics *m, struct metrics_source *s)
{
    if (!lora_sock_disconnected(s->sock))
        return;
    pthread_mutex_lock(&m->mu);
    lora_metrics_state_source_lost(m->state, s->id, lora_clock_mono_ms());
    pthread_mutex_unlock(&m->mu);
    fprintf(stderr, "lora-metrics: note: '%s' disconnected; its engines start a new epoch\n",
            s->endpoint);
}

static void drain(struct metrics *m, struct metrics_source *s)
{
    struct lora_msg_frames f;
    char err[256];

    for (int n = 0; n < DRAIN_MAX; n++) {
        int rc = lora_sock_recv(s->sock, &f, 0, err, sizeof(err));
        if (rc <= 0) {
            if (rc < 0)
                fprintf(stderr, "lora-metrics: warning: %s\n", err);
            return;
        }
        apply(m, s, s->id, s->endpoint, f.body, f.body_len);
        lora_msg_frames_release(&f);
    }
}

/* ---- standard input ------------------------------------------------------------------------ */

struct stream {
    char *buf;
    size_t len, cap;
    uint64_t base;            /* stream offset of buf[0] */
    struct lora_msg_scan scan; /* of the message that starts at buf[0] */
    bool done;
    struct metrics_source log; /* the rate limit of its warnings */
};

static void stream_end(struct metrics *m, struct stream *st, const char *why)
{
    st->done = true;
    pthread_mutex_lock(&m->mu);
    lora_metrics_state_source_ended(m->state, m->stdin_id, why);
    pthread_mutex_unlock(&m->mu);
    if (strcmp(why, "end of input") != 0)
        fprintf(stderr, "lora-metrics: error: stdin: %s; the rest is ignored\n", why);
}

/* Applies every complete body in the buffer and keeps the incomplete tail. The framing is
 * lora_msg_scan, not msgpack_unpack_next: msgpack-c reserves memory for a container's elements
 * from its header before they arrive, and would parse a partial message again on every read. */
static void stream_parse(struct metrics *m, struct stream *st, bool eof)
{
    size_t off = 0, n;
    char why[128];

    while (off < st->len && !st->done) {
        enum lora_msg_scan_result rc = lora_msg_scan(&st->scan, st->buf + off, st->len - off, &n);
        if (rc == LORA_MSG_SCAN_MORE)
            break;
        if (rc == LORA_MSG_SCAN_DONE) {
            st->scan = (struct lora_msg_scan){0};
            apply(m, &st->log, m->stdin_id, "stdin", st->buf + off, n);
            off += n;
            continue;
        }
        snprintf(why, sizeof(why), "byte %llu: %s", (unsigned long long)(st->base + off),
                 rc == LORA_MSG_SCAN_TOO_LARGE ? "a message longer than the limit of 16 MiB"
                                               : "not a msgpack value");
        stream_end(m, st, why);
    }
    memmove(st->buf, st->buf + off, st->len - off);
    st->len -= off;
    st->base += off;
    if (eof && !st->done) {
        if (st->len) {
            snprintf(why, sizeof(why), "byte %llu: the input ends inside a message",
                     (unsigned long long)st->base);
            stream_end(m, st, why);
        } else {
            stream_end(m, st, "end of input");
        }
    }
}

static void stream_read(struct metrics *m, struct stream *st)
{
    if (st->cap - st->len < 65536) {
        size_t cap = st->cap ? 2 * st->cap : 1 << 20;
        char *p = realloc(st->buf, cap);
        if (!p) {
            stream_end(m, st, "out of memory");
            return;
        }
        st->buf = p;
        st->cap = cap;
    }
    ssize_t n = read(0, st->buf + st->len, st->cap - st->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n < 0) {
        char why[128];
        snprintf(why, sizeof(why), "read: %s", strerror(errno));
        stream_end(m, st, why);
        return;
    }
    st->len += (size_t)n;
    stream_parse(m, st, n == 0);
}

/* ---- readiness ----------------------------------------------------------------------------- */

/* Whether an engine heard on engine source id has its whole state (under mu). */
static bool source_complete(const struct lora_metrics_state *s, int id)
{
    for (int i = 0; i < s->n_engines; i++)
        if (s->engines[i]->source == id && lora_metrics_state_engine_is_ready(s->engines[i]))
            return true;
    return false;
}

/* Prints the ready line once every engine source is complete, so that the first scrape after
 * it is already true (an engine publishes its whole state at most one interval after a
 * subscriber connects); after the wait, prints it anyway and names what is missing. */
static bool announce_ready(struct metrics *m, uint64_t started_ms)
{
    bool late = lora_clock_mono_ms() - started_ms >= m->ready_wait_ms;
    int missing = 0;

    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n_src; i++) {
        const struct metrics_source *s = &m->src[i];
        if (s->kind != LORA_SOURCE_ENGINE || source_complete(m->state, s->id))
            continue;
        missing++;
        if (late)
            fprintf(stderr, "lora-metrics: note: nothing complete from '%s' yet\n", s->endpoint);
    }
    pthread_mutex_unlock(&m->mu);
    if (missing && !late)
        return false;
    fprintf(stderr, "%s\n", m->ready_line);
    return true;
}

/* ---- the loop ------------------------------------------------------------------------------ */

int sources_run(struct metrics *m)
{
    zmq_pollitem_t items[2 + 2 * METRICS_MAX_SOURCES];
    struct stream st = {0};
    uint64_t started_ms = lora_clock_mono_ms();
    bool ready = false;
    int rc = 0;

    st.done = !m->use_stdin;
    for (;;) {
        if (!ready)
            ready = announce_ready(m, started_ms);
        int n = 0;
        items[n++] = (zmq_pollitem_t){NULL, m->sig_fd, ZMQ_POLLIN, 0};
        int stdin_at = -1;
        if (!st.done) {
            stdin_at = n;
            items[n++] = (zmq_pollitem_t){NULL, 0, ZMQ_POLLIN, 0};
        }
        int first = n;
        for (int i = 0; i < m->n_src; i++) {
            items[n++] = (zmq_pollitem_t){m->src[i].sock->zsock, 0, ZMQ_POLLIN, 0};
            items[n++] = (zmq_pollitem_t){m->src[i].sock->monitor, 0, ZMQ_POLLIN, 0};
        }
        /* Bounded, never infinite: only the ready line is ever due on a timer. */
        if (zmq_poll(items, n, ready ? 1000 : 20) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            fprintf(stderr, "lora-metrics: fatal: poll: %s\n", zmq_strerror(zmq_errno()));
            rc = -1;
            break;
        }
        if ((items[0].revents & ZMQ_POLLIN) && lora_signal_pipe_drain(m->sig_fd) > 0)
            break;
        if (stdin_at >= 0 && (items[stdin_at].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            stream_read(m, &st);
        for (int i = 0; i < m->n_src; i++) {
            /* What the old connection delivered belongs to the old epoch: drain it first. */
            if (items[first + 2 * i].revents & ZMQ_POLLIN)
                drain(m, &m->src[i]);
            if (items[first + 2 * i + 1].revents & ZMQ_POLLIN)
                monitor_event(m, &m->src[i]);
        }
    }
    free(st.buf);
    return rc;
}
