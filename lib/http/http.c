/* http: see http.h. One struct lora_http_request per request, made on libmicrohttpd's first
 * call for it and freed when libmicrohttpd says the request is over. */
#include "base/clock.h"
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/errbuf.h"

#define MAX_HEADERS 8
#define DISCARD_MAX (64u << 20) /* bytes of an oversized body read past the limit, then cut */
#define WATCH_MS    200         /* how often the deadline watchdog looks */
#define TRIM_BYTES  (1u << 20)  /* a body this large gives its memory back to the system after */

/* One open connection, for the request deadline. Under srv->mu. */
struct conn {
    struct conn *prev, *next;
    int fd;
    uint64_t since_ms; /* the connection's start or its previous response's end */
    bool armed;        /* reading a request: the deadline runs */
    bool cut;          /* the watchdog shut it down */
};

struct lora_http_server {
    struct MHD_Daemon *d;
    struct lora_http_options o;
    lora_http_handler fn;
    void *ctx;
    char log_prefix[64];
    bool started;        /* before, libmicrohttpd's messages are kept for the start-up error */
    char start_msg[256]; /* the first of them */
    pthread_mutex_t mu;  /* the fields below */
    pthread_cond_t wake;
    struct conn *conns;
    size_t body_bytes; /* bytes of bodies held, every connection together */
    bool stopping;
    pthread_t watchdog;
    bool has_watchdog;
};

struct lora_http_request {
    struct lora_http_server *srv;
    struct MHD_Connection *conn;
    const char *method, *url;
    char *body; /* NUL-terminated, len bytes */
    size_t len, cap;
    size_t seen;      /* body bytes received, kept or not */
    size_t charged;   /* bytes of srv->body_bytes this request holds */
    bool too_large;
    bool over_budget; /* the server holds too many body bytes: 503 */
    struct conn *c;   /* NULL when the connection could not be tracked */
    bool responded; /* a response was queued */
    struct MHD_Response *resp;
    unsigned status;
    char *hdr_name[MAX_HEADERS], *hdr_value[MAX_HEADERS];
    int n_hdrs;
};

struct stream {
    lora_http_stream_read read;
    lora_http_stream_done done;
    void *ctx;
    struct lora_http_request *req; /* valid until the request completes */
    bool ended;
};

static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    struct lora_http_server *s = cls;
    char msg[512];

    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    if (!__atomic_load_n(&s->started, __ATOMIC_ACQUIRE)) {
        if (!s->start_msg[0])
            snprintf(s->start_msg, sizeof(s->start_msg), "%s", msg);
        return;
    }
    fprintf(stderr, "%s: warning: http: %s\n", s->log_prefix, msg);
}

static enum MHD_Result queue(struct lora_http_request *r, unsigned status,
                             struct MHD_Response *resp)
{
    for (int i = 0; i < r->n_hdrs; i++)
        MHD_add_response_header(resp, r->hdr_name[i], r->hdr_value[i]);
    enum MHD_Result rc = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    r->responded = true;
    return rc;
}

/* Answers at once without the handler: errors of this module (413, 500). */
static enum MHD_Result queue_simple(struct lora_http_request *r, unsigned status,
                                    const char *json)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(json), (void *)json, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (status == MHD_HTTP_CONTENT_TOO_LARGE || status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(resp, "Connection", "close");
    return queue(r, status, resp);
}

static const char body_too_large[] =
    "{\"error\":{\"message\":\"the request body is larger than the server accepts\","
    "\"type\":\"BadRequestError\",\"param\":null,\"code\":413}}\n";
static const char no_response[] =
    "{\"error\":{\"message\":\"the server produced no response\","
    "\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n";

static const char too_many_bodies[] =
    "{\"error\":{\"message\":\"the server holds too many request bodies at once; retry "
    "later\",\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503}}\n";

static bool append(struct lora_http_request *r, const char *data, size_t n)
{
    size_t max = r->srv->o.max_body_bytes;
    if (r->len + n > max)
        return false;
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1)
            cap *= 2;
        if (cap > max + 1)
            cap = max + 1;
        char *b = realloc(r->body, cap);
        if (!b)
            return false;
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = 0;
    return true;
}

/* Takes n more bytes of the body budget for r; false when the server holds too much. */
static bool charge(struct lora_http_request *r, size_t n)
{
    struct lora_http_server *s = r->srv;
    bool ok = true;

    if (!s->o.max_body_memory)
        return true;
    pthread_mutex_lock(&s->mu);
    if (s->body_bytes + n > s->o.max_body_memory)
        ok = false;
    else {
        s->body_bytes += n;
        r->charged += n;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* The request is in (or given up): the deadline stops until the response ends. */
static void disarm(struct lora_http_request *r)
{
    if (!r->c)
        return;
    pthread_mutex_lock(&r->srv->mu);
    r->c->armed = false;
    pthread_mutex_unlock(&r->srv->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct lora_http_server *s = cls;
    struct lora_http_request *r = *con_cls;

    if (!r) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return MHD_NO;
        r->srv = s;
        r->conn = conn;
        r->method = method;
        r->url = url;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r->c = ci ? ci->socket_context : NULL;
        *con_cls = r;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > s->o.max_body_bytes) {
                r->too_large = true;
                disarm(r);
                return queue_simple(r, MHD_HTTP_CONTENT_TOO_LARGE, body_too_large);
            }
            if (!charge(r, (size_t)n)) {
                r->over_budget = true;
                disarm(r);
                return queue_simple(r, MHD_HTTP_SERVICE_UNAVAILABLE, too_many_bodies);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* libmicrohttpd takes a response only once the body is in, so the rest of a body
         * found too large on the way is read and dropped, up to a bound past which the
         * connection is cut. */
        r->seen += *upload_data_size;
        if (!r->too_large && !r->over_budget && r->len + *upload_data_size > r->charged &&
            !charge(r, r->len + *upload_data_size - r->charged))
            r->over_budget = true;
        if (!r->too_large && !r->over_budget && !append(r, upload_data, *upload_data_size))
            r->too_large = true;
        *upload_data_size = 0;
        return (r->too_large || r->over_budget) && r->seen > s->o.max_body_bytes + DISCARD_MAX
                   ? MHD_NO
                   : MHD_YES;
    }
    if (r->responded)
        return MHD_YES;
    disarm(r);
    if (r->too_large)
        return queue_simple(r, MHD_HTTP_CONTENT_TOO_LARGE, body_too_large);
    if (r->over_budget)
        return queue_simple(r, MHD_HTTP_SERVICE_UNAVAILABLE, too_many_bodies);
    if (!r->body && !append(r, "", 0))
        return MHD_NO;
    s->fn(s->ctx, r);
    if (!r->resp)
        return queue_simple(r, MHD_HTTP_INTERNAL_SERVER_ERROR, no_response);
    struct MHD_Response *resp = r->resp;
    r->resp = NULL;
    return queue(r, r->status, resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct lora_http_server *s = cls;
    struct lora_http_request *r = *con_cls;

    if (!r)
        return;
    if (r->resp)
        MHD_destroy_response(r->resp);
    for (int i = 0; i < r->n_hdrs; i++) {
        free(r->hdr_name[i]);
        free(r->hdr_value[i]);
    }
    free(r->body);
    pthread_mutex_lock(&s->mu);
    s->body_bytes -= r->charged;
    if (r->c) { /* a kept-alive connection has the deadline again for its next request */
        r->c->since_ms = lora_clock_mono_ms();
        r->c->armed = true;
    }
    pthread_mutex_unlock(&s->mu);
    /* Each connection thread allocates from its own malloc arena; a large body's pages would
     * otherwise stay with the process after the request. */
    if (r->cap >= TRIM_BYTES)
        malloc_trim(0);
    free(r);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct lora_http_server *s = cls;
    struct conn *c = *socket_context;

    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *i =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = i ? calloc(1, sizeof(*c)) : NULL;
        if (!c)
            return; /* untracked: only the idle timeout applies to it */
        c->fd = i->connect_fd;
        c->since_ms = lora_clock_mono_ms();
        c->armed = true;
        pthread_mutex_lock(&s->mu);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->mu);
        *socket_context = c;
        return;
    }
    if (!c)
        return;
    pthread_mutex_lock(&s->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&s->mu);
    free(c);
    *socket_context = NULL;
}

/* Shuts down the connections that have not delivered a whole request (headers and body) within
 * the deadline: the connection's thread then sees the end of its input and closes it. The
 * socket stays open until then, so the descriptor cannot have been reused. One summary line
 * every 10 s at most, however many are cut. */
static void *watchdog(void *p)
{
    struct lora_http_server *s = p;
    uint64_t limit_ms = (uint64_t)s->o.request_timeout_s * 1000, logged_ms = 0, n_cut = 0;

    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->wake, &s->mu, &ts);
        uint64_t now = lora_clock_mono_ms();
        for (struct conn *c = s->conns; c; c = c->next) {
            if (!c->armed || c->cut || c->since_ms > now || now - c->since_ms < limit_ms)
                continue;
            shutdown(c->fd, SHUT_RDWR);
            c->cut = true;
            n_cut++;
        }
        if (n_cut && now - logged_ms >= 10000) {
            fprintf(stderr, "%s: warning: http: closed %llu connections that sent no whole "
                            "request within %u s\n",
                    s->log_prefix, (unsigned long long)n_cut, s->o.request_timeout_s);
            n_cut = 0;
            logged_ms = now;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

struct lora_http_server *lora_http_start(const struct lora_http_options *o, lora_http_handler fn,
                                         void *ctx, char *err, size_t err_len)
{
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)o->port)};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    const struct sockaddr *addr = (const struct sockaddr *)&a4;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;

    if (o->port < 0 || o->port > 65535) {
        lora_errf(err, err_len, "unable to listen on port %d: not a port", o->port);
        return NULL;
    }
    if (inet_pton(AF_INET, o->host, &a4.sin_addr) != 1) {
        if (inet_pton(AF_INET6, o->host, &a6.sin6_addr) != 1) {
            lora_errf(err, err_len, "unable to listen on '%s': not a numeric IP address",
                      o->host);
            return NULL;
        }
        addr = (const struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    }
    struct lora_http_server *s = calloc(1, sizeof(*s));
    if (!s) {
        lora_errf(err, err_len, "out of memory");
        return NULL;
    }
    s->o = *o;
    s->fn = fn;
    s->ctx = ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    snprintf(s->log_prefix, sizeof(s->log_prefix), "%s", o->log_prefix ? o->log_prefix : "http");
    errno = 0;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, log_mhd, s, MHD_OPTION_SOCK_ADDR, addr,
                            MHD_OPTION_CONNECTION_LIMIT, o->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_ip,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END);
    if (!s->d) {
        lora_errf(err, err_len, "unable to listen on %s:%d: %s", o->host, o->port,
                  errno ? strerror(errno) : s->start_msg[0] ? s->start_msg
                                                            : "libmicrohttpd refused to start");
        goto fail;
    }
    if (o->request_timeout_s) {
        if (pthread_create(&s->watchdog, NULL, watchdog, s) != 0) {
            lora_errf(err, err_len, "unable to start the request deadline thread");
            MHD_stop_daemon(s->d);
            goto fail;
        }
        s->has_watchdog = true;
    }
    __atomic_store_n(&s->started, true, __ATOMIC_RELEASE);
    return s;
fail:
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return NULL;
}

void lora_http_stop(struct lora_http_server **s)
{
    if (!s || !*s)
        return;
    if ((*s)->has_watchdog) {
        pthread_mutex_lock(&(*s)->mu);
        (*s)->stopping = true;
        pthread_cond_signal(&(*s)->wake);
        pthread_mutex_unlock(&(*s)->mu);
        pthread_join((*s)->watchdog, NULL);
    }
    MHD_stop_daemon((*s)->d);
    pthread_cond_destroy(&(*s)->wake);
    pthread_mutex_destroy(&(*s)->mu);
    free(*s);
    *s = NULL;
}

int lora_http_port(const struct lora_http_server *s)
{
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    return i ? i->port : -1;
}

const char *lora_http_method(const struct lora_http_request *r)
{
    return r->method;
}

const char *lora_http_path(const struct lora_http_request *r)
{
    return r->url;
}

const char *lora_http_header(const struct lora_http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *lora_http_query(const struct lora_http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *lora_http_body(const struct lora_http_request *r, size_t *len)
{
    if (len)
        *len = r->len;
    return r->body ? r->body : "";
}

bool lora_http_client_gone(const struct lora_http_request *r)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!i)
        return true;
    struct pollfd p = {.fd = i->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) < 0)
        return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

int lora_http_add_header(struct lora_http_request *r, const char *name, const char *value)
{
    if (r->n_hdrs == MAX_HEADERS) {
        errno = ENOSPC;
        return -1;
    }
    char *n = strdup(name), *v = strdup(value);
    if (!n || !v) {
        free(n);
        free(v);
        errno = ENOMEM;
        return -1;
    }
    r->hdr_name[r->n_hdrs] = n;
    r->hdr_value[r->n_hdrs++] = v;
    return 0;
}

static int set_response(struct lora_http_request *r, unsigned status, const char *content_type,
                        struct MHD_Response *resp)
{
    if (!resp) {
        errno = ENOMEM;
        return -1;
    }
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    r->resp = resp;
    r->status = status;
    return 0;
}

int lora_http_respond(struct lora_http_request *r, unsigned status, const char *content_type,
                      const void *body, size_t len)
{
    if (r->resp) {
        errno = EALREADY;
        return -1;
    }
    return set_response(r, status, content_type,
                        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY));
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;

    if (st->ended)
        return MHD_CONTENT_READER_END_OF_STREAM;
    ssize_t n = st->read(st->ctx, st->req, buf, max);
    if (n == LORA_HTTP_STREAM_END) {
        st->ended = true;
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    return n > 0 ? n : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    st->done(st->ctx, st->ended);
    free(st);
}

int lora_http_respond_stream(struct lora_http_request *r, unsigned status,
                             const char *content_type, lora_http_stream_read read,
                             lora_http_stream_done done, void *ctx)
{
    if (r->resp) {
        errno = EALREADY;
        return -1;
    }
    struct stream *st = calloc(1, sizeof(*st));
    if (!st) {
        errno = ENOMEM;
        return -1;
    }
    *st = (struct stream){read, done, ctx, r, false};
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!resp) {
        free(st);
        errno = ENOMEM;
        return -1;
    }
    return set_response(r, status, content_type, resp);
}
