/* Unit tests for lib/wire/sock: framing round trips over inproc and ipc (ROUTER/DEALER both ways, with
 * and without binary frames, PUB/SUB with a topic), receive timeouts, malformed messages dropped
 * and counted while good traffic goes on, ROUTER_MANDATORY, ipc socket file mode and stale-file
 * handling, bind errors, argument checks, liveness arithmetic and the signal self-pipe.
 */
#include "check.h"
#include "wire/sock.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* {"type": "hello"} in msgpack; opaque to lib/wire/sock, but realistic. */
static const unsigned char HELLO[] = {0x81, 0xa4, 't', 'y', 'p', 'e',
                                      0xa5, 'h',  'e', 'l', 'l', 'o'};

#define WAIT_MS 1000 /* generous: only a broken implementation waits this long */

/* ---- helpers ---- */

static bool frame_is(const void *data, size_t len, const void *want, size_t want_len)
{
    return len == want_len && (len == 0 || memcmp(data, want, len) == 0);
}

static bool body_is(const struct lora_msg_frames *f, const void *want, size_t want_len)
{
    return frame_is(f->body, f->body_len, want, want_len);
}

/* A temporary directory for ipc sockets; remove_tmpdir() deletes it and what it holds. */
static bool make_tmpdir(char *dir, size_t dir_len)
{
    snprintf(dir, dir_len, "/tmp/lora-test-sock-XXXXXX");
    return mkdtemp(dir) != NULL;
}

static void remove_tmpdir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512];

    if (!d)
        return;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* A raw libzmq socket, for sending what lora_sock_send() never would. */
static void *raw_socket(void *ctx, int type, const char *endpoint, bool bind, const char *id)
{
    void *z = zmq_socket(ctx, type);
    int zero = 0, one = 1;

    if (!z)
        return NULL;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
    if (type == ZMQ_ROUTER)
        zmq_setsockopt(z, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    if (id)
        zmq_setsockopt(z, ZMQ_ROUTING_ID, id, strlen(id));
    if ((bind ? zmq_bind(z, endpoint) : zmq_connect(z, endpoint)) < 0) {
        zmq_close(z);
        return NULL;
    }
    return z;
}

static int raw_send(void *z, const struct lora_frame *frames, int n)
{
    for (int i = 0; i < n; i++) {
        const void *data = frames[i].len ? frames[i].data : "";

        if (zmq_send(z, data, frames[i].len, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    }
    return 0;
}

/* ---- ROUTER / DEALER ---- */

static void round_trip(const char *endpoint)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *router =
        lora_sock_new(ctx, ZMQ_ROUTER, endpoint, true, NULL, err, sizeof(err));
    struct lora_sock *a =
        lora_sock_new(ctx, ZMQ_DEALER, endpoint, false, "rank0", err, sizeof(err));
    struct lora_sock *b = lora_sock_new(ctx, ZMQ_DEALER, endpoint, false, NULL, err, sizeof(err));
    struct lora_msg_frames f = {0};
    float floats[1024];
    int32_t ids[7] = {1, -2, 3, 151935, 0, 7, 42};
    struct lora_frame bins[3] = {{floats, sizeof(floats)}, {NULL, 0}, {ids, sizeof(ids)}};
    static const char reply_a[] = "\x81\xa4type\xa5ready";
    static const char reply_b[] = "\x81\xa4type\xa6output";
    unsigned char b_rid[LORA_SOCK_MAX_RID];
    size_t b_rid_len = 0;

    for (int i = 0; i < 1024; i++)
        floats[i] = (float)i * 0.5f - 3.0f;
    CHECK(router && a && b);
    if (!router || !a || !b) {
        printf("# %s\n", err);
        goto out;
    }

    /* dealer a (identity "rank0") -> router, body only */
    CHECK(lora_sock_send(a, NULL, 0, NULL, HELLO, sizeof(HELLO), NULL, 0, 0) == 0);
    CHECK(lora_sock_recv(router, &f, WAIT_MS, err, sizeof(err)) == 1);
    CHECK(frame_is(f.rid, f.rid_len, "rank0", 5));
    CHECK(body_is(&f, HELLO, sizeof(HELLO)));
    CHECK(f.n_bins == 0);
    lora_msg_frames_release(&f);

    /* dealer b (generated identity) -> router, with three binary frames, one empty */
    CHECK(lora_sock_send(b, NULL, 0, NULL, HELLO, sizeof(HELLO), bins, 3, 0) == 0);
    CHECK(lora_sock_recv(router, &f, WAIT_MS, err, sizeof(err)) == 1);
    CHECK(f.rid_len > 0 && !frame_is(f.rid, f.rid_len, "rank0", 5));
    memcpy(b_rid, f.rid, f.rid_len);
    b_rid_len = f.rid_len;
    CHECK(body_is(&f, HELLO, sizeof(HELLO)));
    CHECK(f.n_bins == 3);
    if (f.n_bins == 3) {
        CHECK(frame_is(f.bins[0].data, f.bins[0].len, floats, sizeof(floats)));
        CHECK(f.bins[1].len == 0);
        CHECK(frame_is(f.bins[2].data, f.bins[2].len, ids, sizeof(ids)));
    }
    lora_msg_frames_release(&f);
    lora_msg_frames_release(&f); /* idempotent */

    /* router -> each dealer by routing id; each gets its own message only */
    CHECK(lora_sock_send(router, "rank0", 5, NULL, reply_a, sizeof(reply_a) - 1, &bins[2], 1, 0) ==
          0);
    CHECK(lora_sock_send(router, b_rid, b_rid_len, NULL, reply_b, sizeof(reply_b) - 1, NULL, 0,
                         ZMQ_DONTWAIT) == 0);
    CHECK(lora_sock_recv(a, &f, WAIT_MS, err, sizeof(err)) == 1);
    CHECK(f.rid_len == 0 && f.topic_len == 0);
    CHECK(body_is(&f, reply_a, sizeof(reply_a) - 1));
    CHECK(f.n_bins == 1 && frame_is(f.bins[0].data, f.bins[0].len, ids, sizeof(ids)));
    lora_msg_frames_release(&f);
    CHECK(lora_sock_recv(b, &f, WAIT_MS, err, sizeof(err)) == 1);
    CHECK(body_is(&f, reply_b, sizeof(reply_b) - 1) && f.n_bins == 0);
    lora_msg_frames_release(&f);
    CHECK(lora_sock_recv(a, &f, 20, err, sizeof(err)) == 0);
    CHECK(lora_sock_recv(b, &f, 0, err, sizeof(err)) == 0);
    CHECK(router->n_malformed == 0 && a->n_malformed == 0 && b->n_malformed == 0);

out:
    lora_sock_destroy(&b);
    lora_sock_destroy(&a);
    lora_sock_destroy(&router);
    CHECK(router == NULL && a == NULL && b == NULL);
    zmq_ctx_term(ctx);
}

static void test_router_dealer_inproc(void)
{
    round_trip("inproc://test-round-trip");
}

static void test_router_dealer_ipc(void)
{
    char dir[64], endpoint[128];

    CHECK(make_tmpdir(dir, sizeof(dir)));
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/engine.sock", dir);
    round_trip(endpoint);
    remove_tmpdir(dir);
}

/* ---- PUB / SUB ---- */

static void pub_sub(const char *endpoint)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *pub = lora_sock_new(ctx, ZMQ_PUB, endpoint, true, NULL, err, sizeof(err));
    struct lora_sock *sub = lora_sock_new(ctx, ZMQ_SUB, endpoint, false, NULL, err, sizeof(err));
    struct lora_msg_frames f = {0};
    int32_t ids[3] = {5, 6, 7};
    struct lora_frame bin = {ids, sizeof(ids)};
    uint64_t start = lora_clock_mono_ms();
    int got = 0, wrong_topic = 0;

    CHECK(pub && sub);
    if (!pub || !sub) {
        printf("# %s\n", err);
        goto out;
    }
    CHECK(lora_sock_subscribe(sub, "stats") == 0);
    CHECK(lora_sock_unsubscribe(sub, "") == 0);

    /* The slow joiner: PUB drops until the subscription arrives, so publish until received. */
    while (!got && lora_clock_mono_ms() - start < 2000) {
        CHECK(lora_sock_send(pub, NULL, 0, "events", HELLO, 1, NULL, 0, ZMQ_DONTWAIT) == 0);
        CHECK(lora_sock_send(pub, NULL, 0, "stats", HELLO, sizeof(HELLO), &bin, 1, ZMQ_DONTWAIT) ==
              0);
        while (lora_sock_recv(sub, &f, 10, err, sizeof(err)) == 1) {
            if (strcmp(f.topic, "stats") == 0 && f.topic_len == 5) {
                got++;
                CHECK(body_is(&f, HELLO, sizeof(HELLO)));
                CHECK(f.n_bins == 1 && frame_is(f.bins[0].data, f.bins[0].len, ids, sizeof(ids)));
                CHECK(f.rid_len == 0);
            } else {
                wrong_topic++;
            }
            lora_msg_frames_release(&f);
        }
    }
    CHECK(got > 0);
    CHECK(wrong_topic == 0);
    CHECK(sub->n_malformed == 0);

out:
    lora_sock_destroy(&sub);
    lora_sock_destroy(&pub);
    zmq_ctx_term(ctx);
}

static void test_pub_sub_inproc(void)
{
    pub_sub("inproc://test-pub-sub");
}

static void test_pub_sub_ipc(void)
{
    char dir[64], endpoint[128];

    CHECK(make_tmpdir(dir, sizeof(dir)));
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/pub.sock", dir);
    pub_sub(endpoint);
    remove_tmpdir(dir);
}

/* ---- timeouts ---- */

static void test_recv_timeout(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *router =
        lora_sock_new(ctx, ZMQ_ROUTER, "inproc://test-timeout", true, NULL, err, sizeof(err));
    struct lora_sock *dealer =
        lora_sock_new(ctx, ZMQ_DEALER, "inproc://test-timeout", false, NULL, err, sizeof(err));
    struct lora_msg_frames f = {0};
    uint64_t t0, elapsed;

    CHECK(router && dealer);
    if (!router || !dealer)
        goto out;
    t0 = lora_clock_mono_ms();
    CHECK(lora_sock_recv(dealer, &f, 150, err, sizeof(err)) == 0);
    elapsed = lora_clock_mono_ms() - t0;
    CHECK(elapsed >= 100 && elapsed < 1500);
    CHECK(f.body == NULL && f.n_bins == 0);

    t0 = lora_clock_mono_ms();
    CHECK(lora_sock_recv(router, &f, 0, err, sizeof(err)) == 0);
    CHECK(lora_clock_mono_ms() - t0 < 500);

    /* no infinite waits */
    errno = 0;
    CHECK(lora_sock_recv(router, &f, -1, err, sizeof(err)) == -1 && errno == EINVAL);

out:
    lora_sock_destroy(&dealer);
    lora_sock_destroy(&router);
    zmq_ctx_term(ctx);
}

/* ---- malformed messages ---- */

static void test_malformed_dropped(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *router =
        lora_sock_new(ctx, ZMQ_ROUTER, "inproc://test-bad", true, NULL, err, sizeof(err));
    void *raw = raw_socket(ctx, ZMQ_DEALER, "inproc://test-bad", false, "raw");
    struct lora_msg_frames f = {0};
    struct lora_frame frames[20];
    const struct lora_frame v1 = {"LORA1", 5}, body = {HELLO, sizeof(HELLO)};
    static const struct {
        const char *name;
        int n_frames; /* frames[0..2) from the case, the rest one-byte fillers */
        struct lora_frame first, second;
        enum lora_sock_malformed why;
    } cases[] = {
        {"no version frame", 1, {HELLO, sizeof(HELLO)}, {NULL, 0}, LORA_SOCK_NO_VERSION},
        {"wrong version", 2, {"LORA9", 5}, {HELLO, sizeof(HELLO)}, LORA_SOCK_BAD_VERSION},
        {"empty body", 2, {"LORA1", 5}, {"", 0}, LORA_SOCK_NO_BODY},
        {"version only", 1, {"LORA1", 5}, {NULL, 0}, LORA_SOCK_NO_BODY},
        {"one empty frame", 1, {"", 0}, {NULL, 0}, LORA_SOCK_NO_VERSION},
        {"20 frames", 20, {"LORA1", 5}, {HELLO, sizeof(HELLO)}, LORA_SOCK_TOO_MANY_FRAMES},
        {"version after body", 2, {HELLO, sizeof(HELLO)}, {"LORA1", 5}, LORA_SOCK_NO_VERSION},
    };
    int n_cases = (int)(sizeof(cases) / sizeof(cases[0]));
    uint64_t want_by_reason[LORA_SOCK_N_MALFORMED] = {0}, base;
    int got = 0;
    bool readable[1];

    CHECK(router && raw);
    if (!router || !raw)
        goto out;
    for (int i = 0; i < 20; i++)
        frames[i] = (struct lora_frame){"x", 1};

    for (int i = 0; i < n_cases; i++) {
        unsigned char good[3] = {0x81, 0xa1, (unsigned char)('a' + i)};
        struct lora_frame valid[3] = {v1, {good, sizeof(good)}, {&i, sizeof(i)}};

        frames[0] = cases[i].first;
        frames[1] = cases[i].second;
        CHECK(raw_send(raw, frames, cases[i].n_frames) == 0);
        CHECK(raw_send(raw, valid, 3) == 0);
        CHECK(lora_sock_recv(router, &f, WAIT_MS, err, sizeof(err)) == 1);
        CHECK(frame_is(f.rid, f.rid_len, "raw", 3));
        CHECK(body_is(&f, good, sizeof(good)));
        CHECK(f.n_bins == 1 && frame_is(f.bins[0].data, f.bins[0].len, &i, sizeof(i)));
        lora_msg_frames_release(&f);
        want_by_reason[cases[i].why]++;
        if (router->n_malformed != (uint64_t)i + 1)
            printf("# case '%s' not counted\n", cases[i].name);
        CHECK(router->n_malformed == (uint64_t)i + 1);
    }
    for (int r = 0; r < LORA_SOCK_N_MALFORMED; r++)
        CHECK(router->n_malformed_by_reason[r] == want_by_reason[r]);

    /* A good message queued behind bad ones is taken even with timeout 0. */
    CHECK(raw_send(raw, frames, 1) == 0);
    CHECK(raw_send(raw, &v1, 1) == 0);
    CHECK(raw_send(raw, &body, 1) == 0);
    frames[0] = v1;
    frames[1] = body;
    CHECK(raw_send(raw, frames, 2) == 0);
    CHECK(lora_sock_poll(&router, 1, -1, WAIT_MS, readable) == 1 && readable[0]);
    CHECK(lora_sock_recv(router, &f, 0, err, sizeof(err)) == 1);
    CHECK(body_is(&f, HELLO, sizeof(HELLO)) && f.n_bins == 0);
    lora_msg_frames_release(&f);
    CHECK(router->n_malformed == (uint64_t)n_cases + 3);
    CHECK(lora_sock_recv(router, &f, 0, err, sizeof(err)) == 0);

    /* A flood of garbage does not hold a zero-timeout recv: it returns 0 after a bounded number
     * of drops, and the good message behind the flood comes out on a later call. */
    base = router->n_malformed;
    for (int i = 0; i < 1500; i++)
        CHECK(raw_send(raw, &body, 1) == 0);
    CHECK(raw_send(raw, frames, 2) == 0);
    CHECK(lora_sock_poll(&router, 1, -1, WAIT_MS, readable) == 1);
    CHECK(lora_sock_recv(router, &f, 0, err, sizeof(err)) == 0);
    CHECK(router->n_malformed > base && router->n_malformed < base + 1500);
    for (int i = 0; i < 100 && got == 0; i++)
        got = lora_sock_recv(router, &f, 0, err, sizeof(err));
    CHECK(got == 1 && body_is(&f, HELLO, sizeof(HELLO)));
    lora_msg_frames_release(&f);
    CHECK(router->n_malformed == base + 1500);

out:
    if (raw)
        zmq_close(raw);
    lora_sock_destroy(&router);
    zmq_ctx_term(ctx);
}

/* A DEALER drops malformed messages from its ROUTER too. */
static void test_malformed_on_dealer(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    void *raw = raw_socket(ctx, ZMQ_ROUTER, "inproc://test-bad-dealer", true, NULL);
    struct lora_sock *dealer =
        lora_sock_new(ctx, ZMQ_DEALER, "inproc://test-bad-dealer", false, "d", err, sizeof(err));
    struct lora_msg_frames f = {0};
    struct lora_frame bad[2] = {{"d", 1}, {"LORA1", 5}};
    struct lora_frame good[3] = {{"d", 1}, {"LORA1", 5}, {HELLO, sizeof(HELLO)}};

    CHECK(raw && dealer);
    if (!raw || !dealer)
        goto out;
    CHECK(raw_send(raw, bad, 2) == 0);
    CHECK(raw_send(raw, good, 3) == 0);
    CHECK(lora_sock_recv(dealer, &f, WAIT_MS, err, sizeof(err)) == 1);
    CHECK(body_is(&f, HELLO, sizeof(HELLO)));
    CHECK(dealer->n_malformed == 1 && dealer->n_malformed_by_reason[LORA_SOCK_NO_BODY] == 1);
    lora_msg_frames_release(&f);

out:
    lora_sock_destroy(&dealer);
    if (raw)
        zmq_close(raw);
    zmq_ctx_term(ctx);
}

/* ---- ROUTER_MANDATORY ---- */

static void test_router_mandatory(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *router =
        lora_sock_new(ctx, ZMQ_ROUTER, "inproc://test-mandatory", true, NULL, err, sizeof(err));

    CHECK(router != NULL);
    if (!router)
        goto out;
    errno = 0;
    CHECK(lora_sock_send(router, "nobody", 6, NULL, HELLO, sizeof(HELLO), NULL, 0, 0) == -1);
    CHECK(errno == EHOSTUNREACH);
    errno = 0;
    CHECK(lora_sock_send(router, "nobody", 6, NULL, HELLO, sizeof(HELLO), NULL, 0, ZMQ_DONTWAIT) ==
          -1);
    CHECK(errno == EHOSTUNREACH);

out:
    lora_sock_destroy(&router);
    zmq_ctx_term(ctx);
}

/* ---- ipc endpoints ---- */

static void test_ipc_mode_and_stale(void)
{
    void *ctx = zmq_ctx_new();
    char err[512] = "", dir[64], path[128], endpoint[160];
    struct lora_sock *router = NULL, *second = NULL, *stale = NULL, *file = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    FILE *fp;
    int fd;

    CHECK(make_tmpdir(dir, sizeof(dir)));

    /* bound socket file is 0600 */
    snprintf(path, sizeof(path), "%s/engine.sock", dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
    router = lora_sock_new(ctx, ZMQ_ROUTER, endpoint, true, NULL, err, sizeof(err));
    CHECK(router != NULL);
    CHECK(stat(path, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600);

    /* a second bind must not steal the endpoint from a live listener */
    second = lora_sock_new(ctx, ZMQ_ROUTER, endpoint, true, NULL, err, sizeof(err));
    CHECK(second == NULL);
    CHECK_CONTAINS(err, endpoint);
    CHECK_CONTAINS(err, "live process");
    CHECK(stat(path, &st) == 0 && S_ISSOCK(st.st_mode));

    /* a stale socket file (bound, then its process went away) is replaced */
    snprintf(path, sizeof(path), "%s/stale.sock", dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
    CHECK(strlen(path) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    close(fd);
    stale = lora_sock_new(ctx, ZMQ_ROUTER, endpoint, true, NULL, err, sizeof(err));
    if (!stale)
        printf("# %s\n", err);
    CHECK(stale != NULL);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);

    /* a regular file is never deleted to make room */
    snprintf(path, sizeof(path), "%s/notes.txt", dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
    fp = fopen(path, "w");
    CHECK(fp != NULL);
    if (fp)
        fclose(fp);
    file = lora_sock_new(ctx, ZMQ_ROUTER, endpoint, true, NULL, err, sizeof(err));
    CHECK(file == NULL);
    CHECK_CONTAINS(err, endpoint);
    CHECK_CONTAINS(err, "not a socket");
    CHECK(stat(path, &st) == 0 && S_ISREG(st.st_mode));

    lora_sock_destroy(&file);
    lora_sock_destroy(&stale);
    lora_sock_destroy(&second);
    lora_sock_destroy(&router);
    zmq_ctx_term(ctx);
    remove_tmpdir(dir);
}

static void test_bind_errors(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *s;

    s = lora_sock_new(ctx, ZMQ_ROUTER, "ipc:///nonexistent-lora-dir/x.sock", true, NULL, err,
                      sizeof(err));
    CHECK(s == NULL);
    CHECK_CONTAINS(err, "unable to bind 'ipc:///nonexistent-lora-dir/x.sock': ");

    s = lora_sock_new(ctx, ZMQ_PUB, "tcp://127.0.0.1:notaport", true, NULL, err, sizeof(err));
    CHECK(s == NULL);
    CHECK_CONTAINS(err, "unable to bind 'tcp://127.0.0.1:notaport': ");

    s = lora_sock_new(ctx, ZMQ_DEALER, "bogus://x", false, NULL, err, sizeof(err));
    CHECK(s == NULL);
    CHECK_CONTAINS(err, "unable to connect to 'bogus://x': ");

    s = lora_sock_new(ctx, ZMQ_REQ, "inproc://req", true, NULL, err, sizeof(err));
    CHECK(s == NULL);
    CHECK_CONTAINS(err, "unsupported socket type");

    lora_sock_destroy(&s);
    lora_sock_destroy(NULL);
    zmq_ctx_term(ctx);
}

/* ---- argument checks: we never send a malformed message ---- */

static void test_send_rejects_bad_args(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *router =
        lora_sock_new(ctx, ZMQ_ROUTER, "inproc://test-args", true, NULL, err, sizeof(err));
    struct lora_sock *dealer =
        lora_sock_new(ctx, ZMQ_DEALER, "inproc://test-args", false, "w", err, sizeof(err));
    struct lora_sock *pub =
        lora_sock_new(ctx, ZMQ_PUB, "inproc://test-args-pub", true, NULL, err, sizeof(err));
    struct lora_msg_frames f = {0};
    struct lora_frame bins[LORA_SOCK_MAX_BINS + 1];

    CHECK(router && dealer && pub);
    if (!router || !dealer || !pub)
        goto out;
    for (int i = 0; i <= LORA_SOCK_MAX_BINS; i++)
        bins[i] = (struct lora_frame){"b", 1};

    errno = 0;
    CHECK(lora_sock_send(dealer, "w", 1, NULL, HELLO, sizeof(HELLO), NULL, 0, 0) == -1 &&
          errno == EINVAL);
    CHECK(lora_sock_send(router, NULL, 0, NULL, HELLO, sizeof(HELLO), NULL, 0, 0) == -1);
    CHECK(lora_sock_send(dealer, NULL, 0, NULL, HELLO, 0, NULL, 0, 0) == -1);
    CHECK(lora_sock_send(dealer, NULL, 0, NULL, NULL, 4, NULL, 0, 0) == -1);
    CHECK(lora_sock_send(dealer, NULL, 0, NULL, HELLO, sizeof(HELLO), bins, LORA_SOCK_MAX_BINS + 1,
                         0) == -1);
    CHECK(lora_sock_send(dealer, NULL, 0, NULL, HELLO, sizeof(HELLO), NULL, 0, ZMQ_SNDMORE) == -1);
    CHECK(lora_sock_send(dealer, NULL, 0, "topic", HELLO, sizeof(HELLO), NULL, 0, 0) == -1);
    CHECK(lora_sock_send(pub, NULL, 0, NULL, HELLO, sizeof(HELLO), NULL, 0, 0) == -1);
    CHECK(lora_sock_subscribe(router, "x") == -1);
    CHECK(lora_sock_recv(pub, &f, 0, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "inproc://test-args-pub");

    /* exactly LORA_SOCK_MAX_BINS is fine, and nothing rejected above reached the router */
    CHECK(lora_sock_send(dealer, NULL, 0, NULL, HELLO, sizeof(HELLO), bins, LORA_SOCK_MAX_BINS,
                         0) == 0);
    CHECK(lora_sock_recv(router, &f, WAIT_MS, err, sizeof(err)) == 1);
    CHECK(f.n_bins == LORA_SOCK_MAX_BINS);
    lora_msg_frames_release(&f);
    CHECK(lora_sock_recv(router, &f, 0, err, sizeof(err)) == 0);
    CHECK(router->n_malformed == 0);

out:
    lora_sock_destroy(&pub);
    lora_sock_destroy(&dealer);
    lora_sock_destroy(&router);
    zmq_ctx_term(ctx);
}

/* ---- liveness ---- */

static void test_liveness(void)
{
    struct lora_peer_liveness l;
    uint64_t a, b;

    lora_liveness_init(&l, 1000);
    CHECK(l.interval_ms == 500 && l.liveness == 6);
    CHECK(LORA_HEARTBEAT_DEAD_MS == 3000);
    CHECK(!lora_liveness_is_dead(&l, 1000));
    CHECK(!lora_liveness_should_send(&l, 1000));
    CHECK(lora_liveness_timeout_ms(&l, 1000) == 500);
    CHECK(!lora_liveness_should_send(&l, 1499));
    CHECK(lora_liveness_should_send(&l, 1500));
    CHECK(lora_liveness_timeout_ms(&l, 1600) == 0);

    lora_liveness_sent(&l, 1500);
    CHECK(!lora_liveness_should_send(&l, 1999));
    CHECK(lora_liveness_should_send(&l, 2000));

    /* silent for 3 s: dead */
    CHECK(!lora_liveness_is_dead(&l, 3999));
    CHECK(lora_liveness_is_dead(&l, 4000));

    /* any traffic counts; the deadline moves */
    lora_liveness_heard(&l, 3500);
    CHECK(!lora_liveness_is_dead(&l, 6499));
    CHECK(lora_liveness_is_dead(&l, 6500));
    lora_liveness_sent(&l, 6000);
    CHECK(lora_liveness_timeout_ms(&l, 6000) == 500);
    CHECK(lora_liveness_timeout_ms(&l, 6200) == 300);
    CHECK(lora_liveness_timeout_ms(&l, 7000) == 0);

    /* out-of-order times never move a mark back nor count as silence */
    lora_liveness_heard(&l, 100);
    CHECK(l.last_heard_ms == 3500);
    CHECK(!lora_liveness_is_dead(&l, 10));
    CHECK(!lora_liveness_should_send(&l, 10));

    /* tuned */
    l.interval_ms = 100;
    l.liveness = 3;
    CHECK(!lora_liveness_is_dead(&l, 3799));
    CHECK(lora_liveness_is_dead(&l, 3800));

    a = lora_clock_mono_ms();
    b = lora_clock_mono_ms();
    CHECK(a > 0 && b >= a);
}

/* ---- signals and poll ---- */

static void test_signal_pipe(void)
{
    void *ctx = zmq_ctx_new();
    char err[256] = "";
    struct lora_sock *dealer =
        lora_sock_new(ctx, ZMQ_DEALER, "inproc://test-signal", false, NULL, err, sizeof(err));
    int signals[2] = {SIGUSR1, SIGALRM};
    struct itimerval timer = {.it_value = {.tv_usec = 50 * 1000}};
    bool readable[2] = {true, false};
    uint64_t t0;
    int fd = lora_signal_pipe_open(signals, 2);

    CHECK(dealer != NULL);
    CHECK(fd >= 0);
    if (fd < 0 || !dealer)
        goto out;
    errno = 0;
    CHECK(lora_signal_pipe_open(signals, 2) == -1 && errno == EBUSY);
    CHECK(lora_signal_pipe_drain(fd) == 0);
    CHECK(lora_sock_poll(&dealer, 1, fd, 0, readable) == 0 && !readable[0] && !readable[1]);

    raise(SIGUSR1);
    CHECK(lora_sock_poll(&dealer, 1, fd, WAIT_MS, readable) == 1);
    CHECK(!readable[0] && readable[1]);
    CHECK(lora_signal_pipe_drain(fd) == SIGUSR1);
    CHECK(lora_signal_pipe_drain(fd) == 0);

    /* a signal arriving during the wait interrupts it and shows up on the pipe at once */
    CHECK(setitimer(ITIMER_REAL, &timer, NULL) == 0);
    t0 = lora_clock_mono_ms();
    CHECK(lora_sock_poll(&dealer, 1, fd, WAIT_MS, readable) == 1);
    CHECK(lora_clock_mono_ms() - t0 < WAIT_MS - 100);
    CHECK(!readable[0] && readable[1]);
    CHECK(lora_signal_pipe_drain(fd) == SIGALRM);

    /* no infinite poll */
    errno = 0;
    CHECK(lora_sock_poll(&dealer, 1, fd, -1, readable) == -1 && errno == EINVAL);

out:
    lora_signal_pipe_close(fd);
    lora_sock_destroy(&dealer);
    zmq_ctx_term(ctx);
}

int main(void)
{
    RUN(test_router_dealer_inproc);
    RUN(test_router_dealer_ipc);
    RUN(test_pub_sub_inproc);
    RUN(test_pub_sub_ipc);
    RUN(test_recv_timeout);
    RUN(test_malformed_dropped);
    RUN(test_malformed_on_dealer);
    RUN(test_router_mandatory);
    RUN(test_ipc_mode_and_stale);
    RUN(test_bind_errors);
    RUN(test_send_rejects_bad_args);
    RUN(test_liveness);
    RUN(test_signal_pipe);
    return check_done();
}
