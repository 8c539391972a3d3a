/* lora-frontend: GET /metrics on the API port, the whole exposition that lora-metrics serves
 * (routers scrape the inference port, as vLLM serves /metrics there).
 *
 * The model is a struct lora_metrics_state, fed by the link thread from two sources: the engine's
 * publish socket (a SUB socket the link thread owns, with a monitor for its disconnections)
 * and this frontend's own request_stats, applied directly instead of through a socket. The
 * HTTP thread of a scrape renders it with lib/metrics/metrics_render into one writer kept across
 * scrapes, under fm->mu, as lora-metrics does.
 *
 * The request path never waits behind a render: HTTP threads never take fm->mu except to
 * scrape, and the link thread (which delivers every output) only tries it. When a render holds
 * it, the link appends the message to a queue under fm->queue_mu, a lock held only to link or
 * unlink a list, never during a render. Whoever holds fm->mu next applies the queue first, in
 * order: a scrape before it renders, or the link at its next try (every millisecond while
 * anything waits). So a scrape shows every message the link received before the scrape began,
 * as lora-metrics' would. Only a queue of METRICS_MAX_PENDING messages makes the link wait for
 * fm->mu (at most one render); the link counts those waits and says at its end how many
 * messages waited and for how long.
 *
 * Its latency histograms cover this frontend's requests only; with several frontends,
 * lora-metrics subscribed to all of them aggregates them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend.h"
#include "metrics/metrics_render.h"
#include "wire/sock.h"

#define METRICS_MAX_PENDING 4096

/* One message (or a disconnection) waiting for fm->mu. */
struct fe_pending {
    struct fe_pending *next;
    int source;
    bool lost; /* the source disconnected; no body */
    size_t len;
    char body[];
};

int metrics_init(struct fe_metrics *fm, bool inflight, char *err, size_t err_len)
{
    struct lora_metrics_state_options so = {
        .inflight = inflight,
        .engine_timeout_ms = FE_METRICS_ENGINE_TIMEOUT_MS,
    };

    memset(fm, 0, sizeof(*fm));
    pthread_mutex_init(&fm->mu, NULL);
    pthread_mutex_init(&fm->queue_mu, NULL);
    /* Test hook: every render holds the lock this much longer (at most 10 s), so that a test
     * can show that requests do not wait behind renders and that what waited arrives. */
    const char *delay = getenv("LORA_FRONTEND_TEST_RENDER_DELAY_MS");
    fm->test_render_delay_ms = delay ? strtol(delay, NULL, 10) : 0;
    if (fm->test_render_delay_ms < 0 || fm->test_render_delay_ms > 10000)
        fm->test_render_delay_ms = 0;
    fm->state = lora_metrics_state_new(&so);
    if (!fm->state)
        goto fail;
    fm->engine_src = lora_metrics_state_add_source(fm->state, "engine", LORA_SOURCE_ENGINE);
    fm->self_src = lora_metrics_state_add_source(fm->state, "this frontend", LORA_SOURCE_FRONTEND);
    if (fm->engine_src < 0 || fm->self_src < 0)
        goto fail;
    return 0;
fail:
    snprintf(err, err_len, "unable to set up /metrics: out of memory");
    lora_metrics_state_destroy(&fm->state);
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
    lora_metrics_state_destroy(&fm->state);
    lora_exposition_release(&fm->w);
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
        lora_metrics_state_source_lost(fm->state, source, lora_clock_mono_ms());
        return;
    }
    if (lora_metrics_state_apply(fm->state, source, body, len, lora_clock_mono_ms(), err, sizeof(err)) < 0 &&
        fm->n_malformed++ % LORA_SOCK_LOG_EVERY == 0)
        fprintf(stderr, "lora-frontend: warning: /metrics dropped a message (%llu so far): %s\n",
                (unsigned long long)fm->n_malformed, err);
}

/* Under fm->mu: every queued message, in order. */
static void drain_locked(struct fe_metrics *fm)
{
    pthread_mutex_lock(&fm->queue_mu);
    struct fe_pending *p = fm->head;
    if (p) {
        uint64_t lag = lora_clock_mono_ms() - fm->queued_ms;
        if (lag > fm->max_lag_ms)
            fm->max_lag_ms = lag;
    }
    fm->head = fm->tail = NULL;
    fm->n_pending = 0;
    pthread_mutex_unlock(&fm->queue_mu);
    while (p) {
        struct fe_pending *n = p->next;
        apply_locked(fm, p->source, p->lost ? NULL : p->body, p->len);
        free(p);
        p = n;
    }
}

/* Appends a copy to the queue; returns how many wait now, or -1 out of memory. */
static int queue(struct fe_metrics *fm, int source, const void *body, size_t len)
{
    struct fe_pending *p = malloc(sizeof(*p) + (body ? len : 0));

    if (!p)
        return -1;
    p->next = NULL;
    p->source = source;
    p->lost = !body;
    p->len = body ? len : 0;
    if (body)
        memcpy(p->body, body, len);
    pthread_mutex_lock(&fm->queue_mu);
    if (fm->tail) {
        fm->tail->next = p;
    } else {
        fm->head = p;
        fm->queued_ms = lora_clock_mono_ms();
    }
    fm->tail = p;
    int n = ++fm->n_pending;
    fm->n_deferred++;
    pthread_mutex_unlock(&fm->queue_mu);
    return n;
}

void metrics_feed(struct fe_metrics *fm, int source, const void *body, size_t len)
{
    if (pthread_mutex_trylock(&fm->mu) == 0) {
        drain_locked(fm);
        apply_locked(fm, source, body, len);
        pthread_mutex_unlock(&fm->mu);
        return;
    }
    int n = queue(fm, source, body, len);
    if (n >= 0 && n < METRICS_MAX_PENDING)
        return;
    /* A full queue, or no memory for one more: wait for the render rather than lose it. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&fm->mu);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    drain_locked(fm);
    if (n < 0)
        apply_locked(fm, source, body, len);
    pthread_mutex_unlock(&fm->mu);
    uint64_t us = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000u +
                  (uint64_t)((t1.tv_nsec - t0.tv_nsec) / 1000);
    fm->n_blocked++;
    if (us > fm->max_blocked_us)
        fm->max_blocked_us = us;
}

static bool pending(struct fe_metrics *fm)
{
    pthread_mutex_lock(&fm->queue_mu);
    bool any = fm->head != NULL;
    pthread_mutex_unlock(&fm->queue_mu);
    return any;
}

bool metrics_flush(struct fe_metrics *fm)
{
    if (!pending(fm))
        return false;
    if (pthread_mutex_trylock(&fm->mu) == 0) {
        drain_locked(fm);
        pthread_mutex_unlock(&fm->mu);
    }
    return pending(fm);
}

void metrics_report(struct fe_metrics *fm)
{
    pthread_mutex_lock(&fm->queue_mu);
    uint64_t n = fm->n_deferred, lag = fm->max_lag_ms;
    pthread_mutex_unlock(&fm->queue_mu);
    if (!n && !fm->n_blocked)
        return;
    fprintf(stderr,
            "lora-frontend: note: /metrics: %llu messages waited for a render (the longest "
            "%llu ms); the engine link waited for the lock %llu times (the longest %llu us)\n",
            (unsigned long long)n, (unsigned long long)lag, (unsigned long long)fm->n_blocked,
            (unsigned long long)fm->max_blocked_us);
}

bool metrics_engine_ready(struct fe_metrics *fm, int engine_index)
{
    pthread_mutex_lock(&fm->mu);
    const struct lora_metrics_state_engine *e = lora_metrics_state_engine(fm->state, engine_index);
    bool ok = e && lora_metrics_state_engine_shows_gauges(fm->state, e, lora_clock_mono_ms());
    pthread_mutex_unlock(&fm->mu);
    return ok;
}

void metrics_serve(struct fe_metrics *fm, struct lora_http_request *req)
{
    static int logged;
    char err[256];
    size_t len;

    pthread_mutex_lock(&fm->mu);
    drain_locked(fm); /* what the link received before this scrape */
    lora_exposition_reset(&fm->w);
    lora_metrics_render(fm->state, &fm->w, lora_clock_unix(), lora_clock_mono_ms());
    const char *body = lora_exposition_text(&fm->w, &len, err, sizeof(err));
    if (body)
        lora_http_respond(req, 200, LORA_EXPOSITION_CONTENT_TYPE, body, len); /* copies the body */
    if (fm->test_render_delay_ms > 0)
        nanosleep(&(struct timespec){fm->test_render_delay_ms / 1000,
                                     fm->test_render_delay_ms % 1000 * 1000000L},
                  NULL);
    pthread_mutex_unlock(&fm->mu);
    if (!body) {
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "lora-frontend: error: unable to render /metrics: %s\n", err);
        reply_error(req, 500, NULL, "unable to render the metrics");
    }
}
