/* lora-inspect: one request on the engine's control socket (man/lora-engine.1, CONTROL).
 *
 * A DEALER connects to the engine's ROUTER and sends ["LORA1", control {id, op}]. DEALER queues
 * only to completed connections (ZMQ_IMMEDIATE, lib/wire/sock.h), so the send is retried until the
 * connection is up; then the reply with our id is awaited. One deadline, timeout_ms after the
 * start, bounds both. While waiting, a heartbeat goes out after every
 * LORA_HEARTBEAT_INTERVAL_MS without sending, as every peer must (docs/design.md, "Wire protocol");
 * heartbeats and replies with another id are skipped. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "inspect.h"
#include "wire/sock.h"

#define CONNECT_RETRY_MS 10 /* between tries to send while the connection is not up */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *op_name(enum lora_control_op op)
{
    switch (op) {
    case LORA_CTL_RESIDENCY:
        return "residency";
    case LORA_CTL_CONFIG:
        return "config";
    case LORA_CTL_HEALTH:
        return "health";
    case LORA_CTL_STATS:
        return "stats";
    default:
        return "control";
    }
}

void why_silent(const char *endpoint, char *buf, size_t len)
{
    struct stat st;

    buf[0] = 0;
    if (strncmp(endpoint, "ipc://", 6) != 0 || endpoint[6] == '@')
        return;
    if (stat(endpoint + 6, &st) < 0)
        snprintf(buf, len, " ('%s': %s)", endpoint + 6, strerror(errno));
    else if (!S_ISSOCK(st.st_mode))
        snprintf(buf, len, " ('%s' is not a socket)", endpoint + 6);
}

/* Sends body, retrying while the connection is not up, until deadline_ms. 0 / -1. */
static int send_until(struct lora_sock *s, const struct lora_buf *body, uint64_t deadline_ms)
{
    for (;;) {
        if (lora_sock_send(s, NULL, 0, NULL, body->data, body->len, NULL, 0, ZMQ_DONTWAIT) == 0)
            return 0;
        if (errno != EAGAIN && errno != EINTR)
            return -1;
        uint64_t now = lora_clock_mono_ms();
        if (now >= deadline_ms) {
            errno = ETIMEDOUT;
            return -1;
        }
        uint64_t left = deadline_ms - now;
        sleep_ms(left < CONNECT_RETRY_MS ? (int)left : CONNECT_RETRY_MS);
    }
}

/* Takes the reply's fields into out (owned copies). 0, or -1 with err. */
static int take_reply(const struct lora_msg_control_reply *m, struct ctl_reply *out, char *err,
                      size_t err_len)
{
    char why[512];

    out->ok = m->ok;
    if (m->error.s)
        out->error = must(strndup(m->error.s, m->error.len));
    if (!m->data)
        return 0;
    out->data = must(malloc(m->data_len));
    memcpy(out->data, m->data, m->data_len);
    out->data_len = m->data_len;
    struct lora_buf text = {0};
    if (lora_msg_to_json(m->data, m->data_len, &text, why, sizeof(why)) < 0) {
        snprintf(err, err_len, "unable to read the engine's reply: data: %s", why);
        lora_buf_release(&text);
        return -1;
    }
    json_error_t jerr;
    out->json = json_loadb(text.data, text.len, JSON_DECODE_ANY, &jerr);
    lora_buf_release(&text);
    if (!out->json || !json_is_object(out->json)) {
        snprintf(err, err_len, "unable to read the engine's reply: data: not a map");
        return -1;
    }
    return 0;
}

/* Waits for the reply with id until deadline_ms. 1 taken, 0 timed out, -1 error in err. */
static int await_reply(struct lora_sock *s, uint64_t id, uint64_t deadline_ms,
                       struct lora_msg_arena *arena, struct ctl_reply *out, char *err,
                       size_t err_len)
{
    struct lora_peer_liveness live;
    struct lora_buf hb = {0};
    int rc = 0;

    lora_liveness_init(&live, lora_clock_mono_ms());
    if (lora_msg_encode_empty(&hb, LORA_MSG_HEARTBEAT) < 0)
        return -1;
    for (;;) {
        uint64_t now = lora_clock_mono_ms();
        if (now >= deadline_ms)
            break;
        if (lora_liveness_should_send(&live, now) &&
            lora_sock_send(s, NULL, 0, NULL, hb.data, hb.len, NULL, 0, ZMQ_DONTWAIT) == 0)
            lora_liveness_sent(&live, now);
        int wait = lora_liveness_timeout_ms(&live, now);
        if ((uint64_t)wait > deadline_ms - now)
            wait = (int)(deadline_ms - now);
        struct lora_msg_frames f;
        int got = lora_sock_recv(s, &f, wait, err, err_len);
        if (got < 0) {
            rc = -1;
            break;
        }
        if (got == 0)
            continue;
        lora_liveness_heard(&live, lora_clock_mono_ms());
        struct lora_msg_control_reply m;
        char why[512];
        lora_msg_arena_reset(arena);
        if (lora_msg_peek_type(f.body, f.body_len, NULL, 0) != LORA_MSG_CONTROL_REPLY) {
            lora_msg_frames_release(&f);
            continue;
        }
        if (lora_msg_decode_control_reply(f.body, f.body_len, NULL, 0, arena, &m, why,
                                          sizeof(why)) < 0) {
            snprintf(err, err_len, "unable to read the engine's reply: %s", why);
            lora_msg_frames_release(&f);
            rc = -1;
            break;
        }
        if (m.id != id) {
            lora_msg_frames_release(&f);
            continue;
        }
        rc = take_reply(&m, out, err, err_len) < 0 ? -1 : 1;
        lora_msg_frames_release(&f);
        break;
    }
    lora_buf_release(&hb);
    return rc;
}

int ctl_request(const char *endpoint, enum lora_control_op op, long timeout_ms,
                struct ctl_reply *out, char *err, size_t err_len)
{
    uint64_t deadline = lora_clock_mono_ms() + (uint64_t)timeout_ms;
    struct lora_msg_control req = {.id = 1, .op = op};
    struct lora_buf body = {0};
    struct lora_msg_arena *arena = NULL;
    struct lora_sock *s = NULL;
    char why[256];
    int rc = -1;

    memset(out, 0, sizeof(*out));
    void *zctx = zmq_ctx_new();
    if (!zctx) {
        snprintf(err, err_len, "unable to create a ZeroMQ context: %s", zmq_strerror(errno));
        return -1;
    }
    s = lora_sock_new(zctx, ZMQ_DEALER, endpoint, false, NULL, err, err_len);
    if (!s)
        goto out;
    arena = lora_msg_arena_new();
    if (!arena || lora_msg_encode_control(&body, &req, NULL, NULL) < 0) {
        snprintf(err, err_len, "unable to encode the %s request: %s", op_name(op), strerror(errno));
        goto out;
    }
    if (send_until(s, &body, deadline) < 0) {
        if (errno == ETIMEDOUT) {
            why_silent(endpoint, why, sizeof(why));
            snprintf(err, err_len, "unable to reach the engine at '%s' within %ld ms%s", endpoint,
                     timeout_ms, why);
        } else {
            snprintf(err, err_len, "unable to send to '%s': %s", endpoint, zmq_strerror(errno));
        }
        goto out;
    }
    int got = await_reply(s, req.id, deadline, arena, out, err, err_len);
    if (got == 0)
        snprintf(err, err_len, "unable to get the %s reply from '%s' within %ld ms", op_name(op),
                 endpoint, timeout_ms);
    rc = got == 1 ? 0 : -1;
    if (rc < 0)
        ctl_reply_release(out);
out:
    lora_buf_release(&body);
    lora_msg_arena_destroy(&arena);
    lora_sock_destroy(&s);
    zmq_ctx_term(zctx);
    return rc;
}

void ctl_reply_release(struct ctl_reply *r)
{
    free(r->error);
    free(r->data);
    json_decref(r->json);
    memset(r, 0, sizeof(*r));
}
