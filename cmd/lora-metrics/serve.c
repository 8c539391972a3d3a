/* lora-metrics: the HTTP answers. GET /metrics renders the state under the mutex into one
 * writer kept across scrapes (its buffers stay at their largest size instead of growing from
 * nothing and faulting in fresh pages on every scrape) and hands the response a copy before
 * unlocking; GET /health answers 200 "ok" or 503 with one line per problem; GET / names the
 * two. Other paths get 404, other methods 405. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "metrics.h"

static void text(struct lora_http_request *r, unsigned status, const char *body)
{
    lora_http_respond(r, status, "text/plain; charset=utf-8", body, strlen(body));
}

static void metrics(struct metrics *m, struct lora_http_request *r)
{
    static int logged;
    static struct lora_exposition w; /* under m->mu; zeroed is as after lora_exposition_init */
    char err[256];
    size_t len;

    pthread_mutex_lock(&m->mu);
    lora_exposition_reset(&w);
    lora_metrics_render(m->state, &w, lora_clock_unix(), lora_clock_mono_ms());
    const char *body = lora_exposition_text(&w, &len, err, sizeof(err));
    if (body)
        lora_http_respond(r, 200, LORA_EXPOSITION_CONTENT_TYPE, body, len); /* copies the body */
    pthread_mutex_unlock(&m->mu);
    if (!body) {
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "lora-metrics: error: unable to render /metrics: %s\n", err);
        text(r, 500, "unable to render the metrics\n");
    }
}

static void health(struct metrics *m, struct lora_http_request *r)
{
    char buf[8192];

    pthread_mutex_lock(&m->mu);
    bool ok = lora_metrics_state_health(m->state, lora_clock_mono_ms(), buf, sizeof(buf));
    pthread_mutex_unlock(&m->mu);
    text(r, ok ? 200 : 503, buf);
}

void serve_handle(void *ctx, struct lora_http_request *r)
{
    struct metrics *m = ctx;
    const char *method = lora_http_method(r), *path = lora_http_path(r);

    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        lora_http_add_header(r, "Allow", "GET, HEAD");
        text(r, 405, "only GET and HEAD\n");
    } else if (strcmp(path, "/metrics") == 0) {
        metrics(m, r);
    } else if (strcmp(path, "/health") == 0) {
        health(m, r);
    } else if (strcmp(path, "/") == 0) {
        text(r, 200, "lora-metrics: /metrics (Prometheus text format 0.0.4), /health\n");
    } else {
        text(r, 404, "not found: try /metrics or /health\n");
    }
}
