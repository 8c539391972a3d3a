/* sock: ZeroMQ sockets with the project's framing and liveness. See sock.h for the contract. */
#include "wire/sock.h"

#include "base/errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Messages one recv call may drop once its timeout has run out (it still takes a good message
 * queued behind a bad one), before it returns 0 and lets the caller's loop run: a flood of
 * garbage must not hold the loop inside recv. */
#define LATE_BUDGET 64

#define VERSION_LEN (sizeof(LORA_SOCK_VERSION) - 1)

static const char *const malformed_text[LORA_SOCK_N_MALFORMED] = {
    [LORA_SOCK_BAD_RID] = "routing id empty or not followed by a message",
    [LORA_SOCK_BAD_TOPIC] = "topic too long or not followed by a message",
    [LORA_SOCK_NO_VERSION] = "missing version frame",
    [LORA_SOCK_BAD_VERSION] = "unsupported protocol version",
    [LORA_SOCK_NO_BODY] = "missing or empty body",
    [LORA_SOCK_TOO_MANY_FRAMES] = "too many frames",
};

/* ---- options ---- */

static int set_opt(struct lora_sock *s, int opt, const char *opt_name, const void *val,
                   size_t val_len, char *err, size_t err_len)
{
    if (zmq_setsockopt(s->zsock, opt, val, val_len) == 0)
        return 0;
    lora_errf(err, err_len, "unable to set %s on '%s': %s", opt_name, s->endpoint,
              zmq_strerror(errno));
    return -1;
}

static int set_int(struct lora_sock *s, int opt, const char *opt_name, int val, char *err,
                   size_t err_len)
{
    return set_opt(s, opt, opt_name, &val, sizeof(val), err, err_len);
}

/* The options of sock.h, set before bind/connect. */
static int set_options(struct lora_sock *s, const char *identity, char *err, size_t err_len)
{
    int64_t max_msg = LORA_SOCK_MAX_MSG_BYTES;
    int hwm = (s->type == ZMQ_PUB || s->type == ZMQ_SUB) ? LORA_SOCK_PUB_HWM : LORA_SOCK_HWM;

    if (set_int(s, ZMQ_LINGER, "ZMQ_LINGER", 0, err, err_len) < 0 ||
        set_int(s, ZMQ_SNDHWM, "ZMQ_SNDHWM", hwm, err, err_len) < 0 ||
        set_int(s, ZMQ_RCVHWM, "ZMQ_RCVHWM", hwm, err, err_len) < 0 ||
        set_int(s, ZMQ_SNDTIMEO, "ZMQ_SNDTIMEO", LORA_SOCK_SEND_TIMEOUT_MS, err, err_len) < 0 ||
        set_opt(s, ZMQ_MAXMSGSIZE, "ZMQ_MAXMSGSIZE", &max_msg, sizeof(max_msg), err, err_len) < 0 ||
        set_int(s, ZMQ_HEARTBEAT_IVL, "ZMQ_HEARTBEAT_IVL", LORA_HEARTBEAT_INTERVAL_MS, err,
                err_len) < 0 ||
        set_int(s, ZMQ_HEARTBEAT_TIMEOUT, "ZMQ_HEARTBEAT_TIMEOUT", LORA_HEARTBEAT_DEAD_MS, err,
                err_len) < 0)
        return -1;
    if (identity &&
        set_opt(s, ZMQ_ROUTING_ID, "ZMQ_ROUTING_ID", identity, strlen(identity), err, err_len) < 0)
        return -1;

    switch (s->type) {
    case ZMQ_ROUTER:
        if (set_int(s, ZMQ_ROUTER_MANDATORY, "ZMQ_ROUTER_MANDATORY", 1, err, err_len) < 0 ||
            set_int(s, ZMQ_ROUTER_HANDOVER, "ZMQ_ROUTER_HANDOVER", 0, err, err_len) < 0)
            return -1;
        break;
    case ZMQ_DEALER:
        if (set_int(s, ZMQ_IMMEDIATE, "ZMQ_IMMEDIATE", 1, err, err_len) < 0)
            return -1;
        break;
    case ZMQ_SUB:
        if (set_opt(s, ZMQ_SUBSCRIBE, "ZMQ_SUBSCRIBE", "", 0, err, err_len) < 0)
            return -1;
        break;
    }
    return 0;
}

/* ---- ipc endpoints ---- */

/* The file system path of an ipc:// endpoint, or NULL for other transports, the wildcard and
 * abstract names (ipc://@name), which have no file to look after. */
static const char *ipc_path(const char *endpoint)
{
    const char *path;

    if (strncmp(endpoint, "ipc://", 6) != 0)
        return NULL;
    path = endpoint + 6;
    if (!*path || *path == '@' || strcmp(path, "*") == 0)
        return NULL;
    return path;
}

/* Makes sure binding to path takes nothing from anyone: nothing there is fine, a socket file
 * nobody listens on is stale and removed; a live listener or any other file is an error. */
static int ipc_claim_path(const char *endpoint, const char *path, char *err, size_t err_len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    int fd, rc, saved;

    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        lora_errf(err, err_len, "unable to bind '%s': %s", endpoint, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        lora_errf(err, err_len, "unable to bind '%s': the path exists and is not a socket",
                  endpoint);
        errno = EEXIST;
        return -1;
    }
    if (strlen(path) >= sizeof(sa.sun_path))
        return 0; /* libzmq reports the name as too long */
    memcpy(sa.sun_path, path, strlen(path) + 1);

    /* Non-blocking, so a listener with a full backlog answers EAGAIN instead of stalling us. */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        lora_errf(err, err_len, "unable to bind '%s': %s", endpoint, strerror(errno));
        return -1;
    }
    rc = connect(fd, (const struct sockaddr *)&sa, sizeof(sa));
    saved = errno;
    close(fd);
    if (rc == 0 || saved == EAGAIN) {
        lora_errf(err, err_len, "unable to bind '%s': a live process is listening there", endpoint);
        errno = EADDRINUSE;
        return -1;
    }
    if (saved != ECONNREFUSED) {
        lora_errf(err, err_len, "unable to bind '%s': %s", endpoint, strerror(saved));
        errno = saved;
        return -1;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
        lora_errf(err, err_len, "unable to bind '%s': unable to remove stale socket: %s", endpoint,
                  strerror(errno));
        return -1;
    }
    return 0;
}

/* chmod 0600 the file of the ipc endpoint just bound (ZMQ_LAST_ENDPOINT resolves a wildcard). */
static int ipc_restrict(struct lora_sock *s, char *err, size_t err_len)
{
    char bound[1024];
    size_t bound_len = sizeof(bound);
    const char *path;

    if (zmq_getsockopt(s->zsock, ZMQ_LAST_ENDPOINT, bound, &bound_len) < 0) {
        lora_errf(err, err_len, "unable to bind '%s': %s", s->endpoint, zmq_strerror(errno));
        return -1;
    }
    bound[sizeof(bound) - 1] = '\0';
    path = ipc_path(bound);
    if (path && chmod(path, 0600) < 0) {
        lora_errf(err, err_len, "unable to bind '%s': chmod 0600: %s", s->endpoint,
                  strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- lifecycle ---- */

static bool is_supported_type(int zmq_type)
{
    return zmq_type == ZMQ_ROUTER || zmq_type == ZMQ_DEALER || zmq_type == ZMQ_PUB ||
           zmq_type == ZMQ_SUB;
}

static int attach(struct lora_sock *s, bool bind, char *err, size_t err_len)
{
    const char *path = ipc_path(s->endpoint);

    if (!bind) {
        if (zmq_connect(s->zsock, s->endpoint) == 0)
            return 0;
        lora_errf(err, err_len, "unable to connect to '%s': %s", s->endpoint, zmq_strerror(errno));
        return -1;
    }
    if (path && ipc_claim_path(s->endpoint, path, err, err_len) < 0)
        return -1;
    if (zmq_bind(s->zsock, s->endpoint) < 0) {
        lora_errf(err, err_len, "unable to bind '%s': %s", s->endpoint, zmq_strerror(errno));
        return -1;
    }
    if (strncmp(s->endpoint, "ipc://", 6) == 0)
        return ipc_restrict(s, err, err_len);
    return 0;
}

struct lora_sock *lora_sock_new(void *zctx, int zmq_type, const char *endpoint, bool bind,
                                const char *identity_or_NULL, char *err, size_t err_len)
{
    struct lora_sock *s;
    size_t id_len = identity_or_NULL ? strlen(identity_or_NULL) : 0;

    if (!zctx || !endpoint || !*endpoint) {
        lora_errf(err, err_len, "unable to create socket: no context or endpoint");
        errno = EINVAL;
        return NULL;
    }
    if (!is_supported_type(zmq_type)) {
        lora_errf(err, err_len, "unable to create socket for '%s': unsupported socket type %d",
                  endpoint, zmq_type);
        errno = EINVAL;
        return NULL;
    }
    if (identity_or_NULL && (id_len == 0 || id_len > LORA_SOCK_MAX_RID)) {
        lora_errf(err, err_len, "unable to create socket for '%s': identity must be 1 to %d bytes",
                  endpoint, LORA_SOCK_MAX_RID);
        errno = EINVAL;
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (!s || !(s->endpoint = strdup(endpoint))) {
        lora_errf(err, err_len, "unable to create socket for '%s': out of memory", endpoint);
        free(s);
        errno = ENOMEM;
        return NULL;
    }
    s->type = zmq_type;
    s->zsock = zmq_socket(zctx, zmq_type);
    if (!s->zsock) {
        lora_errf(err, err_len, "unable to create socket for '%s': %s", endpoint,
                  zmq_strerror(errno));
        goto out_free;
    }
    if (set_options(s, identity_or_NULL, err, err_len) < 0 || attach(s, bind, err, err_len) < 0)
        goto out_free;
    return s;

out_free:
    lora_sock_destroy(&s);
    return NULL;
}

void lora_sock_destroy(struct lora_sock **s)
{
    int saved = errno;

    if (!s || !*s)
        return;
    if ((*s)->monitor) {
        zmq_socket_monitor((*s)->zsock, NULL, 0);
        zmq_close((*s)->monitor);
    }
    if ((*s)->zsock)
        zmq_close((*s)->zsock); /* LINGER 0 was set at creation: returns at once */
    free((*s)->endpoint);
    free(*s);
    *s = NULL;
    errno = saved;
}

int lora_sock_watch_disconnects(struct lora_sock *s, void *zctx, char *err, size_t err_len)
{
    char addr[64];
    int linger = 0;

    snprintf(addr, sizeof(addr), "inproc://lora-sock-monitor-%p", (void *)s);
    if (zmq_socket_monitor(s->zsock, addr, ZMQ_EVENT_DISCONNECTED) < 0 ||
        !(s->monitor = zmq_socket(zctx, ZMQ_PAIR)) ||
        zmq_setsockopt(s->monitor, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_connect(s->monitor, addr) < 0) {
        snprintf(err, err_len, "unable to watch the connection to '%s': %s", s->endpoint,
                 zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

/* A monitor event is two frames: [uint16 event, uint32 value] and the endpoint. */
bool lora_sock_disconnected(struct lora_sock *s)
{
    zmq_msg_t f;
    uint16_t event = 0;
    int more = 1;

    for (int part = 0; more; part++) {
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, s->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            return false;
        }
        if (part == 0 && zmq_msg_size(&f) >= 2)
            memcpy(&event, zmq_msg_data(&f), 2);
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
    }
    return event == ZMQ_EVENT_DISCONNECTED;
}

static int set_subscription(struct lora_sock *s, int opt, const char *topic)
{
    if (!s || s->type != ZMQ_SUB || !topic || strlen(topic) > LORA_SOCK_MAX_TOPIC) {
        errno = EINVAL;
        return -1;
    }
    return zmq_setsockopt(s->zsock, opt, topic, strlen(topic));
}

int lora_sock_subscribe(struct lora_sock *s, const char *topic)
{
    return set_subscription(s, ZMQ_SUBSCRIBE, topic);
}

int lora_sock_unsubscribe(struct lora_sock *s, const char *topic)
{
    return set_subscription(s, ZMQ_UNSUBSCRIBE, topic);
}

/* ---- send ---- */

static bool send_args_ok(const struct lora_sock *s, const void *rid, size_t rid_len,
                         const char *topic, const void *body, size_t body_len,
                         const struct lora_frame *bins, int n_bins, int flags)
{
    if (!s || s->type == ZMQ_SUB || (flags & ~ZMQ_DONTWAIT) || !body || body_len == 0)
        return false;
    if (n_bins < 0 || n_bins > LORA_SOCK_MAX_BINS || (n_bins > 0 && !bins))
        return false;
    for (int i = 0; i < n_bins; i++)
        if (!bins[i].data && bins[i].len)
            return false;
    if (s->type == ZMQ_ROUTER) {
        if (!rid || rid_len == 0 || rid_len > LORA_SOCK_MAX_RID)
            return false;
    } else if (rid || rid_len) {
        return false;
    }
    if (s->type == ZMQ_PUB)
        return topic && strlen(topic) <= LORA_SOCK_MAX_TOPIC;
    return topic == NULL;
}

static int send_frame(struct lora_sock *s, const void *data, size_t len, int flags)
{
    return zmq_send(s->zsock, len ? data : "", len, flags) < 0 ? -1 : 0;
}

int lora_sock_send(struct lora_sock *s, const void *rid, size_t rid_len, const char *topic,
                   const void *body, size_t body_len, const struct lora_frame *bins, int n_bins,
                   int flags)
{
    int more = flags | ZMQ_SNDMORE;

    if (!send_args_ok(s, rid, rid_len, topic, body, body_len, bins, n_bins, flags)) {
        errno = EINVAL;
        return -1;
    }
    /* Only the first frame waits for room or a peer: once it is accepted, the rest of the
     * message is accepted too (libzmq checks the high-water mark per message). */
    if (s->type == ZMQ_ROUTER && send_frame(s, rid, rid_len, more) < 0)
        return -1;
    if (s->type == ZMQ_PUB && send_frame(s, topic, strlen(topic), more) < 0)
        return -1;
    if (send_frame(s, LORA_SOCK_VERSION, VERSION_LEN, more) < 0)
        return -1;
    if (send_frame(s, body, body_len, n_bins ? more : flags) < 0)
        return -1;
    for (int i = 0; i < n_bins; i++)
        if (send_frame(s, bins[i].data, bins[i].len, i + 1 < n_bins ? more : flags) < 0)
            return -1;
    return 0;
}

/* ---- receive ---- */

enum read_result { READ_NONE, READ_OK, READ_MALFORMED, READ_ERROR };

/* Resets *f to hold nothing. */
static void frames_clear(struct lora_msg_frames *f)
{
    f->rid_len = 0;
    f->topic[0] = '\0';
    f->topic_len = 0;
    f->body = NULL;
    f->body_len = 0;
    f->n_bins = 0;
    f->n_parts_ = 0;
}

void lora_msg_frames_release(struct lora_msg_frames *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_parts_ && i < 1 + LORA_SOCK_MAX_BINS; i++)
        zmq_msg_close(&f->parts_[i]);
    frames_clear(f);
}

/* Receives one part without waiting; on failure m is closed and errno kept. */
static int recv_part(struct lora_sock *s, zmq_msg_t *m)
{
    int saved;

    zmq_msg_init(m);
    if (zmq_msg_recv(m, s->zsock, ZMQ_DONTWAIT) >= 0)
        return 0;
    saved = errno;
    zmq_msg_close(m);
    errno = saved;
    return -1;
}

/* Throws away the rest of a message whose last part read had the more flag `more`. Multipart
 * messages arrive whole, so this never waits. */
static enum read_result drain(struct lora_sock *s, bool more)
{
    zmq_msg_t part;

    while (more) {
        if (recv_part(s, &part) < 0)
            return READ_ERROR;
        more = zmq_msg_more(&part);
        zmq_msg_close(&part);
    }
    return READ_MALFORMED;
}

/* Reads the ROUTER routing id or the SUB topic into out. Returns false when it is malformed. */
static bool take_prefix(const struct lora_sock *s, zmq_msg_t *part, struct lora_msg_frames *out,
                        enum lora_sock_malformed *why)
{
    size_t len = zmq_msg_size(part);

    if (s->type == ZMQ_ROUTER) {
        *why = LORA_SOCK_BAD_RID;
        if (len == 0 || len > LORA_SOCK_MAX_RID)
            return false;
        memcpy(out->rid, zmq_msg_data(part), len);
        out->rid_len = len;
    } else {
        *why = LORA_SOCK_BAD_TOPIC;
        if (len > LORA_SOCK_MAX_TOPIC)
            return false;
        memcpy(out->topic, zmq_msg_data(part), len);
        out->topic[len] = '\0';
        out->topic_len = len;
    }
    return true;
}

/* Classifies the frame where the version belongs: 0 when it is "LORA1". */
static int check_version(zmq_msg_t *part, enum lora_sock_malformed *why)
{
    size_t len = zmq_msg_size(part);
    const char *data = zmq_msg_data(part);

    if (len == VERSION_LEN && memcmp(data, LORA_SOCK_VERSION, VERSION_LEN) == 0)
        return 0;
    /* "LORA" and a short suffix is a peer speaking another version; anything else is not ours. */
    if (len > 4 && len <= 8 && memcmp(data, "LORA", 4) == 0)
        *why = LORA_SOCK_BAD_VERSION;
    else
        *why = LORA_SOCK_NO_VERSION;
    return -1;
}

/* Reads one queued message into out (which holds nothing on entry). READ_NONE when nothing was
 * queued after all; READ_MALFORMED with *why set and the message drained; READ_ERROR with errno. */
static enum read_result read_message(struct lora_sock *s, struct lora_msg_frames *out,
                                     enum lora_sock_malformed *why)
{
    zmq_msg_t part, *m;
    bool more, ok;

    if (recv_part(s, &part) < 0)
        return errno == EAGAIN ? READ_NONE : READ_ERROR;

    if (s->type == ZMQ_ROUTER || s->type == ZMQ_SUB) {
        ok = take_prefix(s, &part, out, why);
        more = zmq_msg_more(&part);
        zmq_msg_close(&part);
        if (!ok || !more)
            return drain(s, more);
        if (recv_part(s, &part) < 0)
            return READ_ERROR;
    }

    ok = check_version(&part, why) == 0;
    more = zmq_msg_more(&part);
    zmq_msg_close(&part);
    if (!ok)
        return drain(s, more);
    if (!more) {
        *why = LORA_SOCK_NO_BODY;
        return READ_MALFORMED;
    }

    m = &out->parts_[0];
    if (recv_part(s, m) < 0)
        return READ_ERROR;
    out->n_parts_ = 1;
    more = zmq_msg_more(m);
    if (zmq_msg_size(m) == 0) {
        *why = LORA_SOCK_NO_BODY;
        return drain(s, more);
    }
    out->body = zmq_msg_data(m);
    out->body_len = zmq_msg_size(m);

    while (more) {
        if (out->n_bins == LORA_SOCK_MAX_BINS) {
            *why = LORA_SOCK_TOO_MANY_FRAMES;
            return drain(s, more);
        }
        m = &out->parts_[out->n_parts_];
        if (recv_part(s, m) < 0)
            return READ_ERROR;
        out->n_parts_++;
        out->bins[out->n_bins].data = zmq_msg_data(m);
        out->bins[out->n_bins].len = zmq_msg_size(m);
        out->n_bins++;
        more = zmq_msg_more(m);
    }
    return READ_OK;
}

/* The one malformed: path. Counts, and logs the first of each reason and every Nth after. */
static void count_malformed(struct lora_sock *s, enum lora_sock_malformed why)
{
    uint64_t n = ++s->n_malformed_by_reason[why];

    s->n_malformed++;
    if (n == 1 || n % LORA_SOCK_LOG_EVERY == 0)
        fprintf(stderr, "%s: warning: dropped malformed message on '%s': %s (%" PRIu64 " so far)\n",
                program_invocation_short_name, s->endpoint, malformed_text[why], n);
}

int lora_sock_recv(struct lora_sock *s, struct lora_msg_frames *out, int timeout_ms, char *err,
                   size_t err_len)
{
    uint64_t deadline;
    int n_late = 0;

    if (out)
        frames_clear(out);
    if (!out || !s || s->type == ZMQ_PUB || timeout_ms < 0) {
        lora_errf(err, err_len, "recv on '%s': invalid arguments", s ? s->endpoint : "(null)");
        errno = EINVAL;
        return -1;
    }
    deadline = lora_clock_mono_ms() + (uint64_t)timeout_ms;

    for (;;) {
        zmq_pollitem_t item = {.socket = s->zsock, .events = ZMQ_POLLIN};
        uint64_t now = lora_clock_mono_ms();
        long wait_ms = now < deadline ? (long)(deadline - now) : 0;
        enum lora_sock_malformed why = LORA_SOCK_NO_VERSION;
        enum read_result r;
        int rc, saved;

        rc = zmq_poll(&item, 1, wait_ms);
        if (rc < 0 && errno == EINTR)
            return 0;
        if (rc < 0) {
            lora_errf(err, err_len, "recv on '%s': %s", s->endpoint, zmq_strerror(errno));
            return -1;
        }
        if (rc == 0)
            return 0;

        r = read_message(s, out, &why);
        if (r == READ_OK)
            return 1;
        saved = errno;
        lora_msg_frames_release(out);
        if (r == READ_ERROR) {
            lora_errf(err, err_len, "recv on '%s': %s", s->endpoint, zmq_strerror(saved));
            errno = saved;
            return -1;
        }
        if (r == READ_MALFORMED)
            count_malformed(s, why);
        if (wait_ms == 0 && ++n_late > LATE_BUDGET)
            return 0;
    }
}

/* ---- poll ---- */

int lora_sock_poll(struct lora_sock **socks, int n, int sig_fd, int timeout_ms, bool *readable_out)
{
    zmq_pollitem_t items[LORA_SOCK_POLL_MAX + 1];
    int n_items = n, rc;

    if (n < 0 || n > LORA_SOCK_POLL_MAX || timeout_ms < 0 || (n > 0 && !socks) ||
        (!readable_out && (n > 0 || sig_fd >= 0))) {
        errno = EINVAL;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (!socks[i]) {
            errno = EINVAL;
            return -1;
        }
        items[i] = (zmq_pollitem_t){.socket = socks[i]->zsock, .events = ZMQ_POLLIN};
    }
    if (sig_fd >= 0)
        items[n_items++] = (zmq_pollitem_t){.fd = sig_fd, .events = ZMQ_POLLIN};

    rc = zmq_poll(items, n_items, timeout_ms);
    /* A signal cut the wait short: its byte is in the self-pipe, so look again without waiting. */
    for (int tries = 0; rc < 0 && errno == EINTR && tries < 3; tries++)
        rc = zmq_poll(items, n_items, 0);
    if (rc < 0 && errno == EINTR)
        rc = 0;
    if (rc < 0)
        return -1;
    for (int i = 0; i < n_items; i++)
        readable_out[i] = rc > 0 && (items[i].revents & ZMQ_POLLIN);
    return rc;
}
