/* http: a small HTTP/1.1 server on libmicrohttpd for lora-frontend and lora-metrics.
 *
 * Owns one libmicrohttpd daemon that runs a thread per connection (keep-alive, many concurrent
 * connections up to a limit), reads each request's body into memory up to a bound, and calls one
 * handler per request on that connection's thread. A handler may block (it waits for the engine),
 * so handlers of different connections run concurrently and must be thread-safe.
 *
 * Invariants a caller can rely on:
 * - The handler sees a complete body of at most max_body_bytes. A larger one is answered 413
 *   by this module without calling the handler, and the connection is closed: at once when
 *   Content-Length says so, else (chunked) once the body ends; a body still going 64 MiB past
 *   the limit has its connection cut without an answer.
 * - A client that stays silent for timeout_s in the middle of a request is disconnected.
 * - A connection that has not delivered a whole request, headers and body, within
 *   request_timeout_s of its start (or of its previous response's end) is shut down, however
 *   steadily it trickles bytes: the idle timeout alone lets a client that sends one header line
 *   every few seconds hold a connection for ever. The handler's time does not count.
 * - One client address holds at most max_connections_per_ip connections; more are refused at
 *   accept.
 * - Bodies held in memory, every connection together, stay within max_body_memory bytes: a
 *   request that would pass it gets 503 (its body unread when Content-Length announces it).
 * - Every request gets exactly one response: a handler that sets none yields a 500.
 * - Stream readers run on the connection's thread and may block; lora_http_client_gone() tells
 *   them, and blocking handlers, whether the client hung up.
 * - No call writes to stdout; libmicrohttpd's own errors go to stderr prefixed by the program.
 */
#ifndef LORA_HTTP_H
#define LORA_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct lora_http_server;
struct lora_http_request; /* valid during the handler only */

struct lora_http_options {
    const char *host;      /* numeric IPv4 or IPv6 address to bind, e.g. "127.0.0.1" */
    int port;              /* 0: any free port (see lora_http_port) */
    size_t max_body_bytes; /* larger bodies get 413 */
    unsigned max_connections;
    unsigned timeout_s; /* idle time before a connection is closed */
    unsigned request_timeout_s;      /* whole-request deadline; 0: none */
    unsigned max_connections_per_ip; /* 0: no limit */
    size_t max_body_memory;          /* bytes of bodies held at once; 0: no limit */
    const char *log_prefix; /* "lora-frontend" */
};

typedef void (*lora_http_handler)(void *ctx, struct lora_http_request *req);

/* Starts the server. Returns NULL with "unable to listen on HOST:PORT: reason" in err. */
struct lora_http_server *lora_http_start(const struct lora_http_options *o, lora_http_handler fn,
                                         void *ctx, char *err, size_t err_len);
/* Stops accepting, closes every connection (waiting for their threads), frees, nulls *s. */
void lora_http_stop(struct lora_http_server **s);
/* The port actually bound. */
int lora_http_port(const struct lora_http_server *s);

/* The request. Strings are borrowed for the handler's duration. */
const char *lora_http_method(const struct lora_http_request *r);
const char *lora_http_path(const struct lora_http_request *r); /* without the query */
const char *lora_http_header(const struct lora_http_request *r, const char *name); /* or NULL */
const char *lora_http_query(const struct lora_http_request *r, const char *name);  /* or NULL */
const char *lora_http_body(const struct lora_http_request *r, size_t *len); /* NUL-terminated */
/* Whether the client closed its side or the connection broke. Cheap (one poll of the socket). */
bool lora_http_client_gone(const struct lora_http_request *r);

/* Sets the response: status, content type and a body that is copied. Returns 0 or -1 (ENOMEM,
 * or EALREADY when a response was set). */
int lora_http_respond(struct lora_http_request *r, unsigned status, const char *content_type,
                      const void *body, size_t len);
/* Adds a header to the response set next (at most 8; call before lora_http_respond*). */
int lora_http_add_header(struct lora_http_request *r, const char *name, const char *value);

/* A streamed response (chunked transfer encoding): read(ctx, buf, max) is called on the
 * connection's thread whenever the client can take more; it may block and returns the number of
 * bytes written into buf (> 0), LORA_HTTP_STREAM_END at the end, or LORA_HTTP_STREAM_ERROR to
 * cut the connection. done(ctx, completed) is called once when the response is over: completed
 * is false when the client went away or the stream failed before its end. */
#define LORA_HTTP_STREAM_END   (-1)
#define LORA_HTTP_STREAM_ERROR (-2)
typedef ssize_t (*lora_http_stream_read)(void *ctx, const struct lora_http_request *r, char *buf,
                                         size_t max);
typedef void (*lora_http_stream_done)(void *ctx, bool completed);
int lora_http_respond_stream(struct lora_http_request *r, unsigned status,
                             const char *content_type, lora_http_stream_read read,
                             lora_http_stream_done done, void *ctx);

#endif
