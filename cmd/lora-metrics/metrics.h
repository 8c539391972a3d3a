/* lora-metrics: the Prometheus exporter of lora-stack (docs/design.md, "Metrics";
 * man/lora-metrics.1).
 *
 * Threads: the main thread owns the sources (SUB sockets, their connection monitors, standard
 * input and the signal pipe) and is the one writer of the state; libmicrohttpd's connection
 * threads render /metrics and /health from it. Every access to m->state holds m->mu; nothing
 * else is shared.
 */
#ifndef LORA_METRICS_H
#define LORA_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics/exposition.h"
#include "http/http.h"
#include "metrics/metrics_render.h"
#include "metrics/metrics_state.h"
#include "wire/sock.h"

#include "base/exit_codes.h"

#define METRICS_MAX_SOURCES 64

/* One endpoint subscribed to; its socket watches its connection's breaks. */
struct metrics_source {
    const char *endpoint; /* borrowed from argv or the environment, or m->run_dir_ep */
    enum lora_metrics_state_source_kind kind;
    int id; /* the state's source id */
    struct lora_sock *sock;
    uint64_t n_logged; /* malformed messages logged, for the rate limit */
};

struct metrics {
    pthread_mutex_t mu;
    struct lora_metrics_state *state; /* under mu */
    void *zctx;
    int sig_fd;
    struct metrics_source src[METRICS_MAX_SOURCES];
    int n_src;
    bool use_stdin;
    int stdin_id;
    char run_dir_ep[4200];
    char ready_line[160];   /* printed once every engine source has delivered its whole state */
    uint64_t ready_wait_ms; /* or once this long has passed without it */
};

/* sources.c: opens every source (SUB sockets connect at once; ZeroMQ retries until the peer
 * binds). 0, or -1 with err. */
int sources_open(struct metrics *m, char *err, size_t err_len);
/* Receives until a signal arrives; 0, or -1 on a system failure (logged). Prints
 * m->ready_line as soon as a scrape shows every --engine source's engine in full (at once
 * without such sources), or after m->ready_wait_ms with a note naming those still missing. */
int sources_run(struct metrics *m);
void sources_close(struct metrics *m);

/* serve.c: the HTTP handler: GET /metrics, GET /health, GET /. ctx is the struct metrics. */
void serve_handle(void *ctx, struct lora_http_request *r);

#endif
