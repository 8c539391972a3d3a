/* lora-frontend: the engine connection (docs/design.md, "Programs", "Wire protocol", "Residency").
 *
 * One thread (the link thread, in link_run) owns every ZeroMQ socket: a DEALER to the
 * engine's frontend socket (hello, requests, aborts; outputs, the registry, heartbeats), a
 * DEALER to its control socket (load, unload, residency), our PUB socket (per-request stats)
 * and a SUB socket to the engine's publish socket with its connection monitor (for /metrics,
 * fed through metrics.c together with our own per-request stats). HTTP threads never touch a
 * socket: they queue encoded messages (fe_out) and wake the link through an eventfd, and wait
 * on their own condition variable for outputs. Everything shared is under l->mu.
 *
 * Liveness: heartbeats every 500 ms to the engine; an engine silent for 3 s is gone: every
 * request in flight fails with "unavailable" and the link says hello again every second until
 * a new engine answers ready.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "base/errbuf.h"
#include "frontend.h"
#include "wire/sock.h"

#define HELLO_EVERY_MS 1000
#define TABLE_SIZE     1024

enum out_dest { OUT_ENGINE, OUT_CONTROL, OUT_PUBLISH };

struct fe_out {
    struct fe_out *next;
    enum out_dest dest;
    char request_id[FE_ID_MAX]; /* a request: its sending time goes to its seq */
    char topic[32];
    char *body;
    size_t len;
    char *bin; /* one raw frame (a request's prompt), or NULL */
    size_t bin_len;
};

struct fe_ctl_wait {
    struct fe_ctl_wait *next;
    uint64_t id;
    pthread_cond_t cond;
    bool done, ok;
    char error[1024];
    char *data;
    size_t data_len;
};

static unsigned hash_id(const char *s)
{
    unsigned h = 2166136261u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 16777619u;
    return h % TABLE_SIZE;
}

static struct fe_seq *find_locked(struct fe_link *l, const char *id)
{
    for (struct fe_seq *s = l->table[hash_id(id)]; s; s = s->next)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

static void unlink_locked(struct fe_link *l, struct fe_seq *seq)
{
    for (struct fe_seq **p = &l->table[hash_id(seq->id)]; *p; p = &(*p)->next) {
        if (*p == seq) {
            *p = seq->next;
            l->n_inflight--;
            return;
        }
    }
}

static void wake(struct fe_link *l)
{
    uint64_t one = 1;
    if (write(l->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        fprintf(stderr, "lora-frontend: warning: unable to wake the engine link: %s\n",
                strerror(errno));
}

/* Queues a message (takes body and bin). Under mu. */
static void enqueue_locked(struct fe_link *l, struct fe_out *o)
{
    o->next = NULL;
    if (l->out_tail)
        l->out_tail->next = o;
    else
        l->out_head = o;
    l->out_tail = o;
}

static int enqueue(struct fe_link *l, enum out_dest dest, const char *topic,
                   const struct lora_buf *body, const void *bin, size_t bin_len)
{
    struct fe_out *o = calloc(1, sizeof(*o));
    if (!o)
        return -1;
    o->dest = dest;
    if (topic)
        snprintf(o->topic, sizeof(o->topic), "%s", topic);
    o->body = malloc(body->len);
    o->bin = bin ? malloc(bin_len ? bin_len : 1) : NULL;
    if (!o->body || (bin && !o->bin)) {
        free(o->body);
        free(o->bin);
        free(o);
        return -1;
    }
    memcpy(o->body, body->data, body->len);
    o->len = body->len;
    if (bin) {
        memcpy(o->bin, bin, bin_len);
        o->bin_len = bin_len;
    }
    pthread_mutex_lock(&l->mu);
    enqueue_locked(l, o);
    pthread_mutex_unlock(&l->mu);
    wake(l);
    return 0;
}

/* The SUB socket to the engine's publish socket and a monitor of its disconnections: an
 * engine that restarts breaks the connection, and its counters start again, as in lora-metrics. */
static int open_sub(struct fe_link *l, const char *ep, char *err, size_t err_len)
{
    l->sub = lora_sock_new(l->zctx, ZMQ_SUB, ep, false, NULL, err, err_len);
    return l->sub ? lora_sock_watch_disconnects(l->sub, l->zctx, err, err_len) : -1;
}

int link_init(struct fe_link *l, void *zctx, const char *frontend_ep, const char *control_ep,
              const char *publish_ep, const char *engine_publish_ep, struct fe_metrics *metrics,
              char *err, size_t err_len)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->registry_cond, NULL);
    l->zctx = zctx;
    l->next_ctl_id = 1;
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0) {
        lora_errf(err, err_len, "unable to create an eventfd: %s", strerror(errno));
        return -1;
    }
    l->front = lora_sock_new(zctx, ZMQ_DEALER, frontend_ep, false, NULL, err, err_len);
    if (!l->front)
        return -1;
    l->ctl = lora_sock_new(zctx, ZMQ_DEALER, control_ep, false, NULL, err, err_len);
    if (!l->ctl)
        return -1;
    if (publish_ep) {
        l->pub = lora_sock_new(zctx, ZMQ_PUB, publish_ep, true, NULL, err, err_len);
        if (!l->pub)
            return -1;
    }
    l->metrics = metrics;
    if (metrics && engine_publish_ep && open_sub(l, engine_publish_ep, err, err_len) < 0)
        return -1;
    return 0;
}

void link_release(struct fe_link *l)
{
    lora_sock_destroy(&l->front);
    lora_sock_destroy(&l->ctl);
    lora_sock_destroy(&l->pub);
    lora_sock_destroy(&l->sub);
    if (l->wake_fd >= 0)
        close(l->wake_fd);
    l->wake_fd = -1;
    for (struct fe_out *o = l->out_head, *n; o; o = n) {
        n = o->next;
        free(o->body);
        free(o->bin);
        free(o);
    }
    l->out_head = l->out_tail = NULL;
    free(l->registry);
    l->registry = NULL;
}

/* ---- the HTTP threads' side ----------------------------------------------------------- */

int link_submit(struct fe_link *l, struct fe_seq *seq, const struct lora_msg_request *m,
                int max_pending, char *err, size_t err_len)
{
    struct lora_buf b = {0};
    struct lora_msg_bin bins[1];
    int n_bins = 0;

    if (lora_msg_encode_request(&b, m, bins, &n_bins) < 0) {
        lora_errf(err, err_len, "unable to encode the request: %s", strerror(errno));
        lora_buf_release(&b);
        return -1;
    }
    struct fe_out *o = calloc(1, sizeof(*o));
    char *bin = malloc(bins[0].len ? bins[0].len : 1);
    if (!o || !bin) {
        free(o);
        free(bin);
        lora_buf_release(&b);
        lora_errf(err, err_len, "out of memory");
        return -1;
    }
    memcpy(bin, bins[0].data, bins[0].len);
    *o = (struct fe_out){
        .dest = OUT_ENGINE, .body = b.data, .len = b.len, .bin = bin, .bin_len = bins[0].len};
    snprintf(o->request_id, sizeof(o->request_id), "%s", seq->id);
    pthread_mutex_lock(&l->mu);
    int rc = 0;
    if (!l->connected) {
        lora_errf(err, err_len, "the engine is not reachable");
        rc = -1;
    } else if (l->n_inflight >= max_pending) {
        lora_errf(err, err_len, "the server is overloaded: %d requests in flight", l->n_inflight);
        rc = -1;
    } else {
        unsigned h = hash_id(seq->id);
        seq->next = l->table[h];
        l->table[h] = seq;
        l->n_inflight++;
        enqueue_locked(l, o);
    }
    pthread_mutex_unlock(&l->mu);
    if (rc < 0) {
        free(o->body);
        free(o->bin);
        free(o);
        return -1;
    }
    wake(l);
    return 0;
}

void link_forget(struct fe_link *l, struct fe_seq **seqp)
{
    struct fe_seq *seq = *seqp;
    if (!seq)
        return;
    pthread_mutex_lock(&l->mu);
    bool registered = find_locked(l, seq->id) == seq;
    if (registered)
        unlink_locked(l, seq);
    bool abort_it = registered && !seq->finished;
    pthread_mutex_unlock(&l->mu);
    if (abort_it) {
        struct lora_msg_abort a = {.request_id = {seq->id, strlen(seq->id)}};
        struct lora_buf b = {0};
        if (lora_msg_encode_abort(&b, &a, NULL, NULL) == 0)
            enqueue(l, OUT_ENGINE, NULL, &b, NULL, 0);
        lora_buf_release(&b);
    }
    seq_free(seq);
    *seqp = NULL;
}

/* An absolute CLOCK_REALTIME time ms from now, for pthread_cond_timedwait. */
static struct timespec after_ms(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void link_wait_locked(struct fe_link *l, pthread_cond_t *cond, int timeout_ms)
{
    struct timespec ts = after_ms(timeout_ms);
    pthread_cond_timedwait(cond, &l->mu, &ts);
}

int link_control(struct fe_link *l, enum lora_control_op op, const char *name, const char *path,
                 int timeout_ms, char **data, size_t *data_len, char *err, size_t err_len)
{
    struct fe_ctl_wait w = {0};
    struct lora_buf b = {0};

    if (data)
        *data = NULL;
    pthread_cond_init(&w.cond, NULL);
    pthread_mutex_lock(&l->mu);
    w.id = l->next_ctl_id++;
    w.next = l->ctl_waits;
    l->ctl_waits = &w;
    pthread_mutex_unlock(&l->mu);

    struct lora_msg_control m = {.id = w.id, .op = op};
    if (name)
        m.name = (struct lora_str){name, strlen(name)};
    if (path)
        m.path = (struct lora_str){path, strlen(path)};
    int rc = lora_msg_encode_control(&b, &m, NULL, NULL);
    if (rc == 0)
        rc = enqueue(l, OUT_CONTROL, NULL, &b, NULL, 0);
    lora_buf_release(&b);

    pthread_mutex_lock(&l->mu);
    uint64_t deadline = lora_clock_mono_ms() + (uint64_t)timeout_ms;
    while (rc == 0 && !w.done && lora_clock_mono_ms() < deadline) {
        struct timespec ts = after_ms(100);
        pthread_cond_timedwait(&w.cond, &l->mu, &ts);
    }
    for (struct fe_ctl_wait **p = &l->ctl_waits; *p; p = &(*p)->next) {
        if (*p == &w) {
            *p = w.next;
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
    pthread_cond_destroy(&w.cond);
    if (rc < 0) {
        lora_errf(err, err_len, "unable to send a control command: %s", strerror(errno));
        return -1;
    }
    if (!w.done) {
        lora_errf(err, err_len, "the engine did not answer within %d ms", timeout_ms);
        return -1;
    }
    if (!w.ok) {
        lora_errf(err, err_len, "%s", w.error);
        free(w.data);
        return -1;
    }
    if (data) {
        *data = w.data;
        *data_len = w.data_len;
    } else {
        free(w.data);
    }
    return 0;
}

void link_publish(struct fe_link *l, const char *topic, const void *body, size_t len)
{
    if (!l->pub && !l->metrics)
        return;
    struct lora_buf b = {(char *)body, len, len};
    enqueue(l, OUT_PUBLISH, topic, &b, NULL, 0);
}

bool link_wait_ready(struct fe_link *l, int timeout_ms)
{
    uint64_t deadline = lora_clock_mono_ms() + (uint64_t)timeout_ms;
    pthread_mutex_lock(&l->mu);
    while (!l->connected && lora_clock_mono_ms() < deadline) {
        struct timespec ts = after_ms(50);
        pthread_cond_timedwait(&l->registry_cond, &l->mu, &ts);
    }
    bool ok = l->connected;
    pthread_mutex_unlock(&l->mu);
    return ok;
}

bool link_registry_has_locked(struct fe_link *l, const char *name)
{
    for (int i = 0; i < l->n_registry; i++)
        if (strcmp(l->registry[i].name, name) == 0)
            return true;
    return false;
}

bool link_registry_wait(struct fe_link *l, const char *name, bool present, int timeout_ms)
{
    uint64_t deadline = lora_clock_mono_ms() + (uint64_t)timeout_ms;
    pthread_mutex_lock(&l->mu);
    while (link_registry_has_locked(l, name) != present && lora_clock_mono_ms() < deadline) {
        struct timespec ts = after_ms(50);
        pthread_cond_timedwait(&l->registry_cond, &l->mu, &ts);
    }
    bool ok = link_registry_has_locked(l, name) == present;
    pthread_mutex_unlock(&l->mu);
    return ok;
}

/* ---- the link thread ------------------------------------------------------------------- */

struct link_loop {
    struct fe_link *l;
    struct lora_msg_arena *arena;
    struct lora_buf out;
    struct lora_peer_liveness engine; /* the frontend connection's peer */
    uint64_t last_hello_ms;
    uint64_t ctl_last_sent_ms;
};

static int send_body(struct lora_sock *s, const struct lora_buf *b)
{
    return lora_sock_send(s, NULL, 0, NULL, b->data, b->len, NULL, 0, ZMQ_DONTWAIT);
}

static void send_hello(struct link_loop *lp)
{
    struct lora_msg_hello h = {
        .version = LORA_PROTOCOL_VERSION,
        .role = LORA_ROLE_FRONTEND,
        .rank = -1,
        .pid = (int64_t)getpid(),
        .name = {"lora-frontend", strlen("lora-frontend")},
    };
    lora_buf_reset(&lp->out);
    if (lora_msg_encode_hello(&lp->out, &h, NULL, NULL) == 0 &&
        send_body(lp->l->front, &lp->out) == 0)
        lora_liveness_sent(&lp->engine, lora_clock_mono_ms());
}

/* Ends every request in flight with an error (the engine is gone). Under mu. */
static void fail_all_locked(struct fe_link *l, const char *why)
{
    for (int i = 0; i < TABLE_SIZE; i++) {
        for (struct fe_seq *s = l->table[i]; s; s = s->next) {
            if (s->finished)
                continue;
            s->finished = true;
            snprintf(s->finish_reason, sizeof(s->finish_reason), "error");
            snprintf(s->error, sizeof(s->error), "%s", why);
            snprintf(s->error_code, sizeof(s->error_code), "unavailable");
            if (s->cond)
                pthread_cond_broadcast(s->cond);
        }
    }
}

static void flush_out(struct link_loop *lp)
{
    struct fe_link *l = lp->l;
    uint64_t v;

    while (read(l->wake_fd, &v, sizeof(v)) > 0)
        ;
    pthread_mutex_lock(&l->mu);
    struct fe_out *o = l->out_head;
    l->out_head = l->out_tail = NULL;
    pthread_mutex_unlock(&l->mu);
    while (o) {
        struct fe_out *next = o->next;
        struct lora_frame bin = {o->bin, o->bin_len};
        int n_bins = o->bin ? 1 : 0;
        int rc = 0;
        if (o->dest == OUT_ENGINE) {
            rc = lora_sock_send(l->front, NULL, 0, NULL, o->body, o->len, &bin, n_bins,
                                ZMQ_DONTWAIT);
            if (rc == 0)
                lora_liveness_sent(&lp->engine, lora_clock_mono_ms());
            if (rc == 0 && o->request_id[0]) {
                pthread_mutex_lock(&l->mu);
                struct fe_seq *s = find_locked(l, o->request_id);
                if (s)
                    s->sent_at = lora_clock_unix();
                pthread_mutex_unlock(&l->mu);
            }
        } else if (o->dest == OUT_CONTROL) {
            rc = lora_sock_send(l->ctl, NULL, 0, NULL, o->body, o->len, NULL, 0, ZMQ_DONTWAIT);
            lp->ctl_last_sent_ms = lora_clock_mono_ms();
        } else {
            if (l->pub)
                lora_sock_send(l->pub, NULL, 0, o->topic, o->body, o->len, NULL, 0, ZMQ_DONTWAIT);
            if (l->metrics && strcmp(o->topic, "request") == 0)
                metrics_feed(l->metrics, l->metrics->self_src, o->body, o->len);
        }
        if (rc < 0)
            fprintf(stderr, "lora-frontend: warning: unable to send to the engine: %s\n",
                    strerror(errno));
        free(o->body);
        free(o->bin);
        free(o);
        o = next;
    }
}

static void append_output_locked(struct fe_seq *s, const struct lora_msg_output *m)
{
    s->last_recv = lora_clock_unix();
    size_t need = s->n + (size_t)m->n_tokens;
    if (m->n_tokens > 0 && seq_grow_tokens(&s->tokens, &s->lps, &s->top_ids, &s->top_lps, &s->cap,
                                           need, m->top_n) < 0) {
        s->finished = true;
        snprintf(s->finish_reason, sizeof(s->finish_reason), "error");
        snprintf(s->error, sizeof(s->error), "out of memory");
        snprintf(s->error_code, sizeof(s->error_code), "unavailable");
        return;
    }
    if (m->n_tokens > 0) {
        if (s->n == 0)
            s->first_seen = lora_clock_unix();
        memcpy(s->tokens + s->n, m->tokens, sizeof(int32_t) * (size_t)m->n_tokens);
        memcpy(s->lps + s->n, m->logprobs, sizeof(float) * (size_t)m->n_tokens);
        if (m->top_n) {
            s->top_n = m->top_n;
            memcpy(s->top_ids + s->n * (size_t)m->top_n, m->top_ids,
                   sizeof(int32_t) * (size_t)m->n_tokens * (size_t)m->top_n);
            memcpy(s->top_lps + s->n * (size_t)m->top_n, m->top_logprobs,
                   sizeof(float) * (size_t)m->n_tokens * (size_t)m->top_n);
        }
        s->n = need;
    }
    seq_copy_prompt_lps(&s->prompt, m->n_prompt_logprobs, m->prompt_logprobs, m->prompt_ranks,
                        m->prompt_top_n, m->prompt_top_ids, m->prompt_top_logprobs);
    s->num_prompt_tokens = m->num_prompt_tokens;
    if (m->finished) {
        s->finished = true;
        snprintf(s->finish_reason, sizeof(s->finish_reason), "%s",
                 m->finish_reason.s ? m->finish_reason.s : "stop");
        if (m->error.s)
            snprintf(s->error, sizeof(s->error), "%s", m->error.s);
        if (m->error_code.s)
            snprintf(s->error_code, sizeof(s->error_code), "%s", m->error_code.s);
        s->queued = m->queued_time;
        s->scheduled = m->scheduled_time;
        s->first_token = m->first_token_time;
        s->finished_at = m->finished_time;
    }
}

static void on_registry(struct link_loop *lp, const struct lora_msg_frames *f)
{
    struct fe_link *l = lp->l;
    struct lora_msg_registry m;
    char err[256];

    if (lora_msg_decode_registry(f->body, f->body_len, NULL, 0, lp->arena, &m, err, sizeof(err)) <
        0) {
        fprintf(stderr, "lora-frontend: warning: dropping a registry message: %s\n", err);
        return;
    }
    struct fe_registry_entry *list = calloc((size_t)m.n_adapters + 1, sizeof(*list));
    if (!list)
        return;
    for (int i = 0; i < m.n_adapters; i++) {
        snprintf(list[i].name, sizeof(list[i].name), "%s", m.adapters[i].name.s);
        snprintf(list[i].path, sizeof(list[i].path), "%s",
                 m.adapters[i].path.s ? m.adapters[i].path.s : "");
    }
    pthread_mutex_lock(&l->mu);
    free(l->registry);
    l->registry = list;
    l->n_registry = m.n_adapters;
    l->registry_version++;
    pthread_cond_broadcast(&l->registry_cond);
    pthread_mutex_unlock(&l->mu);
}

static void on_engine_message(struct link_loop *lp, const struct lora_msg_frames *f)
{
    struct fe_link *l = lp->l;
    char err[256];
    int type = lora_msg_peek_type(f->body, f->body_len, err, sizeof(err));

    lora_msg_arena_reset(lp->arena);
    lora_liveness_heard(&lp->engine, lora_clock_mono_ms());
    if (type == LORA_MSG_READY) {
        struct lora_msg_ready m;
        if (lora_msg_decode_ready(f->body, f->body_len, NULL, 0, lp->arena, &m, err, sizeof(err)) <
            0) {
            fprintf(stderr, "lora-frontend: warning: dropping a ready message: %s\n", err);
            return;
        }
        pthread_mutex_lock(&l->mu);
        bool was = l->connected;
        l->connected = true;
        l->limits = m.limits;
        l->engine_index = m.engine_index;
        snprintf(l->model, sizeof(l->model), "%s", m.model.s);
        pthread_cond_broadcast(&l->registry_cond);
        pthread_mutex_unlock(&l->mu);
        if (!was)
            fprintf(stderr, "lora-frontend: engine %d ready (model '%s')\n", m.engine_index,
                    m.model.s);
    } else if (type == LORA_MSG_OUTPUT) {
        struct lora_msg_output m;
        struct lora_msg_bin bins[LORA_SOCK_MAX_BINS];
        for (int i = 0; i < f->n_bins; i++)
            bins[i] = (struct lora_msg_bin){f->bins[i].data, f->bins[i].len};
        if (lora_msg_decode_output(f->body, f->body_len, bins, f->n_bins, lp->arena, &m, err,
                                   sizeof(err)) < 0) {
            fprintf(stderr, "lora-frontend: warning: dropping an output: %s\n", err);
            return;
        }
        pthread_mutex_lock(&l->mu);
        struct fe_seq *s = find_locked(l, m.request_id.s);
        if (s && !s->finished) {
            append_output_locked(s, &m);
            if (s->cond)
                pthread_cond_broadcast(s->cond);
        }
        pthread_mutex_unlock(&l->mu);
    } else if (type == LORA_MSG_REGISTRY) {
        on_registry(lp, f);
    }
    /* heartbeat and notifications: liveness only */
}

static void on_control_reply(struct link_loop *lp, const struct lora_msg_frames *f)
{
    struct fe_link *l = lp->l;
    struct lora_msg_control_reply m;
    char err[256];

    lora_msg_arena_reset(lp->arena);
    int type = lora_msg_peek_type(f->body, f->body_len, err, sizeof(err));
    if (type != LORA_MSG_CONTROL_REPLY)
        return;
    if (lora_msg_decode_control_reply(f->body, f->body_len, NULL, 0, lp->arena, &m, err,
                                      sizeof(err)) < 0) {
        fprintf(stderr, "lora-frontend: warning: dropping a control reply: %s\n", err);
        return;
    }
    pthread_mutex_lock(&l->mu);
    for (struct fe_ctl_wait *w = l->ctl_waits; w; w = w->next) {
        if (w->id != m.id)
            continue;
        w->done = true;
        w->ok = m.ok;
        snprintf(w->error, sizeof(w->error), "%s", m.error.s ? m.error.s : "failed");
        if (m.data && m.data_len) {
            w->data = malloc(m.data_len);
            if (w->data) {
                memcpy(w->data, m.data, m.data_len);
                w->data_len = m.data_len;
            }
        }
        pthread_cond_broadcast(&w->cond);
        break;
    }
    pthread_mutex_unlock(&l->mu);
}

static void drain(struct link_loop *lp, struct lora_sock *s, bool engine)
{
    struct lora_msg_frames f;
    char err[256];

    for (int i = 0; i < 256; i++) {
        int rc = lora_sock_recv(s, &f, 0, err, sizeof(err));
        if (rc <= 0)
            return;
        if (engine)
            on_engine_message(lp, &f);
        else
            on_control_reply(lp, &f);
        lora_msg_frames_release(&f);
    }
}

/* The engine's publish socket: every message goes to /metrics. */
static void drain_sub(struct fe_link *l)
{
    struct lora_msg_frames f;
    char err[256];

    for (int i = 0; i < 256; i++) {
        int rc = lora_sock_recv(l->sub, &f, 0, err, sizeof(err));
        if (rc <= 0)
            return;
        metrics_feed(l->metrics, l->metrics->engine_src, f.body, f.body_len);
        lora_msg_frames_release(&f);
    }
}

/* The connection to the engine's publish socket broke: the engine restarted or went away. */
static void sub_monitor_event(struct fe_link *l)
{
    if (lora_sock_disconnected(l->sub))
        metrics_feed(l->metrics, l->metrics->engine_src, NULL, 0);
}

static void keep_alive(struct link_loop *lp)
{
    struct fe_link *l = lp->l;
    uint64_t now = lora_clock_mono_ms();

    pthread_mutex_lock(&l->mu);
    bool connected = l->connected;
    bool ctl_waiting = l->ctl_waits != NULL;
    if (connected && lora_liveness_is_dead(&lp->engine, now)) {
        l->connected = false;
        connected = false;
        fail_all_locked(l, "the engine is not reachable");
        fprintf(stderr, "lora-frontend: warning: the engine is silent for %d ms: gone\n",
                LORA_HEARTBEAT_DEAD_MS);
    }
    pthread_mutex_unlock(&l->mu);
    if (!connected) {
        if (now - lp->last_hello_ms >= HELLO_EVERY_MS) {
            lp->last_hello_ms = now;
            lora_liveness_init(&lp->engine, now);
            send_hello(lp);
        }
        return;
    }
    lora_buf_reset(&lp->out);
    if (lora_liveness_should_send(&lp->engine, now) &&
        lora_msg_encode_empty(&lp->out, LORA_MSG_HEARTBEAT) == 0 &&
        send_body(l->front, &lp->out) == 0)
        lora_liveness_sent(&lp->engine, now);
    /* The control socket's peer hears from us while we wait for a reply. */
    if (ctl_waiting && now - lp->ctl_last_sent_ms >= LORA_HEARTBEAT_INTERVAL_MS) {
        lora_buf_reset(&lp->out);
        if (lora_msg_encode_empty(&lp->out, LORA_MSG_HEARTBEAT) == 0)
            send_body(l->ctl, &lp->out);
        lp->ctl_last_sent_ms = now;
    }
}

int link_run(struct fe_link *l, int sig_fd)
{
    struct link_loop lp = {.l = l, .arena = lora_msg_arena_new()};
    int sig = 0;

    if (!lp.arena)
        return -1;
    lora_liveness_init(&lp.engine, lora_clock_mono_ms());
    send_hello(&lp);
    lp.last_hello_ms = lora_clock_mono_ms();
    while (!sig) {
        zmq_pollitem_t items[6] = {
            {l->front->zsock, 0, ZMQ_POLLIN, 0},
            {l->ctl->zsock, 0, ZMQ_POLLIN, 0},
            {NULL, l->wake_fd, ZMQ_POLLIN, 0},
            {NULL, sig_fd, ZMQ_POLLIN, 0},
            {l->sub ? l->sub->zsock : NULL, 0, ZMQ_POLLIN, 0},
            {l->sub ? l->sub->monitor : NULL, 0, ZMQ_POLLIN, 0},
        };
        /* Messages that waited for a render are retried every millisecond. */
        bool waiting = l->metrics && metrics_flush(l->metrics);
        int rc = zmq_poll(items, l->sub ? 6 : 4, waiting ? 1 : 100);
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "lora-frontend: fatal: unable to poll: %s\n", zmq_strerror(errno));
            sig = -1;
            break;
        }
        if (items[3].revents & ZMQ_POLLIN)
            sig = lora_signal_pipe_drain(sig_fd);
        if (items[2].revents & ZMQ_POLLIN)
            flush_out(&lp);
        if (items[0].revents & ZMQ_POLLIN)
            drain(&lp, l->front, true);
        if (items[1].revents & ZMQ_POLLIN)
            drain(&lp, l->ctl, false);
        if (l->sub && (items[4].revents & ZMQ_POLLIN))
            drain_sub(l);
        if (l->sub && (items[5].revents & ZMQ_POLLIN))
            sub_monitor_event(l);
        keep_alive(&lp);
    }
    if (l->metrics)
        metrics_report(l->metrics);
    pthread_mutex_lock(&l->mu);
    l->connected = false;
    fail_all_locked(l, "the frontend is shutting down");
    pthread_mutex_unlock(&l->mu);
    lora_buf_release(&lp.out);
    lora_msg_arena_destroy(&lp.arena);
    return sig;
}

struct lora_msg_limits fe_link_limits(const struct fe_link *l)
{
    /* The lock is not part of the value: a reader may take it. */
    pthread_mutex_t *mu = (pthread_mutex_t *)&l->mu;
    pthread_mutex_lock(mu);
    struct lora_msg_limits v = l->limits;
    pthread_mutex_unlock(mu);
    return v;
}

void fe_link_model(const struct fe_link *l, char *buf, size_t len)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&l->mu;
    pthread_mutex_lock(mu);
    snprintf(buf, len, "%s", l->model);
    pthread_mutex_unlock(mu);
}
