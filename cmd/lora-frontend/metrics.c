/* lora-frontend: GET /metrics on the API port, the whole exposition that lora-metrics serves
 * (routers scrape the inference port, as vLLM serves /metrics there).
 *
 * The model is a struct lora_mstate, fed by the link thread from two sources: the engine's
 * publish socket (a SUB socket the link thread owns, with a monitor for its disconnections)
 * and this frontend's own request_stats, applied directly instead of through a socket. The
 * HTTP thread of a scrape renders it with lib/metrics_render into one writer kept across
 * scrapes, under fm->mu, as lora-metrics does.
 *
 * The request path never waits behind a render: HTTP threads never take fm->mu except to
 * scrape, and the link thread (which delivers every output) only tries it. When a render holds
 * it, messages wait in a queue of the link thread, applied in their order at the next try (the
 * link polls every millisecond while any wait); only a queue of METRICS_MAX_PENDING messages
 * makes it wait for the lock, so what a scrape shows lags by at most one render.
 *
 * Its latency histograms cover this frontend's requests only; with several frontends,
 * lora-metrics subscribed to all of them aggregates them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend.h"
#include "metrics_render.h"
#include "sock.h"

#define METRICS_MAX_PENDING 4096

/* One message (or a disconnection, body NULL) waiting for the lock. */
struct fe_pending {
    struct fe_pending *next;
    int source;
    bool lost; /* the source disconnected; no body */
    size_t len;
    char body[];
};

int metrics_init(struct fe_metrics *fm, bool inflight, char *err, size_t err_len)
{
    struct lora_mstate_options so = {
        .inflight = inflight,
        .engine_timeout_ms = FE_METRICS_ENGINE_TIMEOUT_MS,
    };

    memset(fm, 0, sizeof(*fm));
    pthread_mutex_init(&fm->mu, NULL);
    fm->state = lora_mstate_new(&so);
    if (!fm->state)
        goto fail;
    fm->engine_src = lora_mstate_add_source(fm->state, "engine", LORA_SOURCE_ENGINE);
    fm->self_src = lora_mstate_add_source(fm->state, "this frontend", LORA_SOURCE_FRONTEND);
    if (fm->engine_src < 0 || fm->self_src < 0)
        goto fail;
    return 0;
fail:
    snprintf(err, err_len, "unable to set up /metrics: out of memory");
    lora_mstate_destroy(&fm->state);
    return -1;
}

void metrics_release(struct fe_metrics *fm)
{
    for (struct fe_pending *p = fm->head, *n; p; p = n) {
        n = p->next;
        free(p);
    }
    fm->head = fm->tail = NULL;
    fm->n_pending = 0;
    lora_mstate_destroy(&fm->state);
    lora_expo_release(&fm->w);
}

void metrics_set_model_name(struct fe_metrics *fm, const char *name)
{
    pthread_mutex_lock(&fm->mu);
    fm->state->o.model_name = name;
    pthread_mutex_unlock(&fm->mu);
}

/* Under fm->mu. */
static void apply_locked(struct fe_metrics *fm, int source, const void *body, size_t len)
{
    char err[512];

    if (!body) {
        lora_mstate_source_lost(fm->state, source, lora_now_ms());
        return;
    }
    if (lora_mstate_apply(fm->state, source, body, len, lora_now_ms(), err, sizeof(err)) < 0 &&
        fm->n_malformed++ % LORA_SOCK_LOG_EVERY == 0)
        fprintf(stderr, "lora-frontend: warning: /metrics dropped a message (%llu so far): %s\n",
                (unsigned long long)fm->n_malformed, err);
}

/* Under fm->mu: every queued message, in order. */
static void drain_locked(struct fe_metrics *fm)
{
    struct fe_pending *p = fm->head;

    if (p) {
        uint64_t lag = lora_now_ms() - fm->queued_ms;
        if (lag > fm->max_lag_ms)
            fm->max_lag_ms = lag;
    }
    fm->head = fm->tail = NULL;
    fm->n_pending = 0;
    while (p) {
        struct fe_pending *n = p->next;
        apply_locked(fm, p->source, p->lost ? NULL : p->body, p->len);
        free(p);
        p = n;
    }
}

static void queue(struct fe_metrics *fm, int source, const void *body, size_t len)
{
    struct fe_pending *p = malloc(sizeof(*p) + (body ? len : 0));

    if (!p) {
        /* Out of memory: apply in order, waiting for the lock, rather than lose it. */
        pthread_mutex_lock(&fm->mu);
        drain_locked(fm);
        apply_locked(fm, source, body, len);
        pthread_mutex_unlock(&fm->mu);
        return;
    }
    p->next = NULL;
    p->source = source;
    p->lost = !body;
    p->len = body ? len : 0;
    if (body)
        memcpy(p->body, body, len);
    if (fm->tail) {
        fm->tail->next = p;
    } else {
        fm->head = p;
        fm->queued_ms = lora_now_ms();
    }
    fm->tail = p;
    fm->n_pending++;
    fm->n_deferred++;
}

void metrics_feed(struct fe_metrics *fm, int source, const void *body, size_t len)
{
    if (!fm->head && pthread_mutex_trylock(&fm->mu) == 0) {
        apply_locked(fm, source, body, len);
        pthread_mutex_unlock(&fm->mu);
        return;
    }
    queue(fm, source, body, len);
    if (fm->n_pending >= METRICS_MAX_PENDING) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pthread_mutex_lock(&fm->mu);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        drain_locked(fm);
        pthread_mutex_unlock(&fm->mu);
        uint64_t us = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000u +
                      (uint64_t)((t1.tv_nsec - t0.tv_nsec) / 1000);
        fm->n_blocked++;
        if (us > fm->max_blocked_us)
            fm->max_blocked_us = us;
    }
}

void metrics_report(const struct fe_metrics *fm)
{
    fprintf(stderr,
            "lora-frontend: note: /metrics: %llu messages waited for a render (the longest "
            "%llu ms); the engine link waited for the lock %llu times (the longest %llu us)\n",
            (unsigned long long)fm->n_deferred, (unsigned long long)fm->max_lag_ms,
            (unsigned long long)fm->n_blocked, (unsigned long long)fm->max_blocked_us);
}

bool metrics_flush(struct fe_metrics *fm)
{
    if (fm->head && pthread_mutex_trylock(&fm->mu) == 0) {
        drain_locked(fm);
        pthread_mutex_unlock(&fm->mu);
    }
    return fm->head != NULL;
}

bool metrics_engine_ready(struct fe_metrics *fm, int engine_index)
{
    pthread_mutex_lock(&fm->mu);
    const struct lora_mstate_engine *e = lora_mstate_engine(fm->state, engine_index);
    bool ok = e && lora_mstate_engine_shows_gauges(fm->state, e, lora_now_ms());
    pthread_mutex_unlock(&fm->mu);
    return ok;
}

void metrics_serve(struct fe_metrics *fm, struct lora_http_request *req)
{
    static int logged;
    char err[256];
    size_t len;

    pthread_mutex_lock(&fm->mu);
    lora_expo_reset(&fm->w);
    lora_metrics_render(fm->state, &fm->w, fe_now(), lora_now_ms());
    const char *body = lora_expo_text(&fm->w, &len, err, sizeof(err));
    if (body)
        lora_http_respond(req, 200, LORA_EXPO_CONTENT_TYPE, body, len); /* copies the body */
    pthread_mutex_unlock(&fm->mu);
    if (!body) {
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "lora-frontend: error: unable to render /metrics: %s\n", err);
        reply_error(req, 500, NULL, "unable to render the metrics");
    }
}
