/* lora-inspect events: what the engine publishes (man/lora-engine.1, PUBLISHED TOPICS), one
 * record per message.
 *
 * A SUB socket connects to the publish socket. The engine publishes its whole state (topics
 * config, registry, residency of every rank and, when idle, stats) right after ready and every
 * --publish-interval-ms, so a late subscriber is complete after one interval.
 *
 * Without --follow the command prints what arrives until it has seen a full state publication
 * (one message of each state topic: config, registry, stats, and the residency of every rank
 * that config counts, in any order, since a subscriber may join in the middle of one
 * publication and complete in the next) and exits 0; when --timeout-ms passes first it exits
 * 111, after printing what came.
 *
 * With --follow it runs until SIGINT or SIGTERM (exit 0). --timeout-ms bounds only the wait for
 * the first message (an endpoint nobody publishes on is a failure, exit 111). After that,
 * silence is reported, not fatal: when nothing arrives for 3 publication intervals a warning
 * goes to standard error, once, and a note when messages come again; an engine that restarts
 * on the same endpoint is followed on. An idle engine still publishes config every interval,
 * so the silence check always listens to "config", whatever --topic says.
 *
 * --topic narrows what is printed (exactly those topics; ZeroMQ's prefix match is not enough,
 * "re" would match "registry", "residency" and "request"), while config, and without --follow
 * registry, residency and stats, are still received for the checks above. --msgpack writes each
 * message's map exactly as received, concatenated, and nothing else; binary frames (no published
 * type has any) are not written. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "inspect.h"
#include "wire/sock.h"

#define SILENT_INTERVALS 3 /* publication intervals of silence before a warning */
#define MAX_POLL_MS      1000

static const struct cmd_info info = {
    "events",
    "[--run-dir DIR | --publish-endpoint EP] [--follow] [--topic T]... [OPTIONS]",
    "Prints what the engine publishes, one record per message: until a full state publication\n"
    "has been seen, or with --follow until SIGINT or SIGTERM.",
};

static const char *const known_topics[] = {"config", "registry",      "residency", "stats",
                                           "event",  "notifications", "request"};
#define N_TOPICS (sizeof(known_topics) / sizeof(known_topics[0]))

static const char *const columns[] = {"time", "topic", "type", "summary"};
static const int widths[] = {24, 13, 15};

struct events {
    struct out *o;
    const char *endpoint;
    bool follow;
    const struct lora_cli_opt_list *topics; /* printed; all when empty */
    struct lora_msg_arena *arena;
    bool config_seen, registry_seen, stats_seen;
    int world; /* ranks, from config; 0 until then */
    bool rank_seen[INSPECT_MAX_RANKS];
    uint64_t n_received, n_malformed;
};

static bool is_known(const char *topic)
{
    for (size_t i = 0; i < N_TOPICS; i++)
        if (strcmp(topic, known_topics[i]) == 0)
            return true;
    return false;
}

static bool is_printed(const struct events *ev, const char *topic)
{
    if (ev->topics->n == 0)
        return true;
    for (int i = 0; i < ev->topics->n; i++)
        if (strcmp(topic, ev->topics->items[i]) == 0)
            return true;
    return false;
}

static bool is_complete(const struct events *ev)
{
    if (!ev->config_seen || !ev->registry_seen || !ev->stats_seen || ev->world <= 0)
        return false;
    for (int r = 0; r < ev->world; r++)
        if (!ev->rank_seen[r])
            return false;
    return true;
}

/* Notes what the message says about the state publication. */
static void track(struct events *ev, const struct lora_msg_frames *f)
{
    int type = lora_msg_peek_type(f->body, f->body_len, NULL, 0);
    char err[256];

    lora_msg_arena_reset(ev->arena);
    if (strcmp(f->topic, "config") == 0 && type == LORA_MSG_READY) {
        struct lora_msg_ready m;
        if (lora_msg_decode_ready(f->body, f->body_len, NULL, 0, ev->arena, &m, err, sizeof(err)) ==
            0) {
            ev->config_seen = true;
            ev->world =
                m.limits.world_size < INSPECT_MAX_RANKS ? m.limits.world_size : INSPECT_MAX_RANKS;
        }
    } else if (strcmp(f->topic, "residency") == 0 && type == LORA_MSG_RESIDENCY_REPLY) {
        struct lora_msg_residency_reply m;
        if (lora_msg_decode_residency_reply(f->body, f->body_len, NULL, 0, ev->arena, &m, err,
                                            sizeof(err)) == 0 &&
            m.rank >= 0 && m.rank < INSPECT_MAX_RANKS)
            ev->rank_seen[m.rank] = true;
    } else if (strcmp(f->topic, "registry") == 0 && type == LORA_MSG_REGISTRY) {
        ev->registry_seen = true;
    } else if (strcmp(f->topic, "stats") == 0 && type == LORA_MSG_STATS) {
        ev->stats_seen = true;
    }
}

/* "2026-05-01T12:34:56.789Z" for a Unix time. */
static void iso_time(double t, char *buf, size_t len)
{
    time_t secs = (time_t)t;
    struct tm tm;
    int ms = (int)((t - (double)secs) * 1000);

    gmtime_r(&secs, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03dZ", ms < 0 ? 0 : ms > 999 ? 999 : ms);
}

/* Says, the first time and then every LORA_SOCK_LOG_EVERY times, that a message was dropped. */
static void dropped(struct events *ev, const char *topic, const char *why)
{
    if (ev->n_malformed++ % LORA_SOCK_LOG_EVERY == 0)
        fprintf(stderr,
                "lora-inspect: warning: dropping a message on topic '%s' (%llu so far): %s\n",
                topic, (unsigned long long)ev->n_malformed, why);
}

static void print(struct events *ev, const struct lora_msg_frames *f)
{
    struct lora_buf text = {0};
    char err[512], when[40];

    if (ev->o->format == OUT_MSGPACK) {
        out_raw(ev->o, f->body, f->body_len);
        return;
    }
    json_t *m = NULL;
    if (lora_msg_to_json(f->body, f->body_len, &text, err, sizeof(err)) == 0)
        m = json_loadb(text.data, text.len, JSON_DECODE_ANY, NULL);
    lora_buf_release(&text);
    if (!m || !json_is_object(m)) {
        dropped(ev, f->topic, m ? "not a msgpack map" : err);
        json_decref(m);
        return;
    }
    double now = lora_clock_unix();
    const char *type = type_of(m);
    json_t *rec = out_new_record("message");
    json_t *topic = json_string(f->topic); /* NULL when not UTF-8 */
    json_object_set_new(rec, "time", json_real(now));
    json_object_set_new(rec, "topic", topic ? topic : json_string("\xef\xbf\xbd"));
    json_object_set_new(rec, "type", type ? json_string(type) : json_null());
    json_object_set(rec, "message", m);
    iso_time(now, when, sizeof(when));
    char *summary = summary_of(m);
    const char *cells[4] = {when, f->topic, type ? type : "-", summary};
    out_record(ev->o, rec, cells);
    free(summary);
    json_decref(rec);
    json_decref(m);
}

/* Takes every queued message. Returns how many, or -1 with err. */
static int drain(struct events *ev, struct lora_sock *sub, char *err, size_t err_len)
{
    struct lora_msg_frames f;
    int n = 0, got;

    while ((got = lora_sock_recv(sub, &f, 0, err, err_len)) == 1) {
        n++;
        ev->n_received++;
        track(ev, &f);
        if (is_printed(ev, f.topic))
            print(ev, &f);
        lora_msg_frames_release(&f);
        if (!ev->follow && is_complete(ev))
            break;
    }
    return got < 0 ? -1 : n;
}

static int subscribe(struct lora_sock *sub, const struct events *ev)
{
    if (ev->topics->n == 0)
        return 0; /* a new SUB socket takes every topic */
    for (int i = 0; i < ev->topics->n; i++)
        if (lora_sock_subscribe(sub, ev->topics->items[i]) < 0)
            return -1;
    /* What the silence check (config) and the end of a full state publication need. */
    static const char *const state_topics[] = {"config", "registry", "residency", "stats"};
    for (int i = 0; i < (ev->follow ? 1 : 4); i++)
        if (lora_sock_subscribe(sub, state_topics[i]) < 0)
            return -1;
    return lora_sock_unsubscribe(sub, "");
}

/* The failure when --timeout-ms passed first. */
static void report_timeout(const struct events *ev, long timeout_ms)
{
    char why[512];
    int seen = 0;

    if (ev->n_received == 0) {
        why_silent(ev->endpoint, why, sizeof(why));
        die_msg("unable to hear from the engine at '%s' within %ld ms%s", ev->endpoint, timeout_ms,
                why);
        return;
    }
    for (int r = 0; r < ev->world; r++)
        seen += ev->rank_seen[r];
    die_msg("unable to see a full state publication from '%s' within %ld ms (config %s, "
            "registry %s, stats %s, residency of %d of %d ranks)",
            ev->endpoint, timeout_ms, ev->config_seen ? "seen" : "not seen",
            ev->registry_seen ? "seen" : "not seen", ev->stats_seen ? "seen" : "not seen", seen,
            ev->world);
}

/* The receive loop. Returns the exit status. */
static int run(struct events *ev, struct lora_sock *sub, int sig_fd, long timeout_ms,
               long interval_ms)
{
    uint64_t start = lora_clock_mono_ms(), last_heard = 0;
    uint64_t silent_ms = (uint64_t)interval_ms * SILENT_INTERVALS;
    bool warned = false;
    char err[512];

    for (;;) {
        uint64_t now = lora_clock_mono_ms();
        int64_t wait;
        if (!ev->follow || ev->n_received == 0) {
            wait = (int64_t)(start + (uint64_t)timeout_ms) - (int64_t)now;
            if (wait <= 0) {
                report_timeout(ev, timeout_ms);
                return EXIT_SYSTEM;
            }
        } else {
            wait = warned ? MAX_POLL_MS : (int64_t)(last_heard + silent_ms) - (int64_t)now;
        }
        wait = wait < 0 ? 0 : wait > MAX_POLL_MS ? MAX_POLL_MS : wait;
        bool readable[2] = {false, false};
        if (lora_sock_poll(&sub, 1, sig_fd, (int)wait, readable) < 0) {
            die_msg("unable to poll '%s': %s", ev->endpoint, strerror(errno));
            return EXIT_SYSTEM;
        }
        if (readable[1] && lora_signal_pipe_drain(sig_fd) > 0)
            return 0;
        int n = readable[0] ? drain(ev, sub, err, sizeof(err)) : 0;
        if (n < 0) {
            die_msg("unable to receive: %s", err);
            return EXIT_SYSTEM;
        }
        now = lora_clock_mono_ms();
        if (n > 0) {
            if (warned)
                fprintf(stderr, "lora-inspect: note: messages from '%s' again after %llu ms\n",
                        ev->endpoint, (unsigned long long)(now - last_heard));
            warned = false;
            last_heard = now;
        }
        if (out_flush(ev->o) < 0)
            return 0; /* the reader went away: out_status() tells */
        if (!ev->follow && is_complete(ev))
            return 0;
        if (ev->follow && ev->n_received > 0 && !warned && now - last_heard >= silent_ms) {
            fprintf(stderr,
                    "lora-inspect: warning: no message from '%s' for %llu ms (%d "
                    "publication intervals); still waiting\n",
                    ev->endpoint, (unsigned long long)(now - last_heard), SILENT_INTERVALS);
            warned = true;
        }
    }
}

int cmd_events(int argc, char **argv)
{
    struct common_opts c;
    struct lora_cli_opt_list topics = {0};
    long interval_ms = 1000;
    bool follow = false;
    args_init(&c);
    const struct lora_cli_opt options[] = {
        OPT_RUN_DIR(&c),
        OPT_PUBLISH_ENDPOINT(&c),
        {"follow", LORA_OPT_FLAG, &follow, NULL, "run until SIGINT or SIGTERM"},
        {"topic", LORA_OPT_LIST, &topics, "T",
         "print only topic T (repeatable): config, registry, residency, stats, event, "
         "notifications, request"},
        {"publish-interval-ms", LORA_OPT_INT, &interval_ms, "MS",
         "the engine's --publish-interval-ms, for the silence warning (1000)", 10, 600000},
        OPT_TIMEOUT_MS(&c),
        OPT_FORMATS(&c),
        OPT_HELP(&c),
        {0},
    };
    char epbuf[4200], err[1024];
    static const int sigs[] = {SIGINT, SIGTERM};
    struct events ev = {.follow = false};
    struct out o;

    int p = args_parse(&info, options, argc, argv, &c);
    if (p != 0)
        return p > 0 ? 0 : EXIT_USAGE;
    for (int i = 0; i < topics.n; i++) {
        if (!is_known(topics.items[i])) {
            die_msg("events: --topic '%s' must be one of config, registry, residency, stats, "
                    "event, notifications or request",
                    topics.items[i]);
            return EXIT_USAGE;
        }
    }
    const char *ep = args_endpoint(&info, &c, c.publish_endpoint, "publish-endpoint",
                                   "publish.sock", epbuf, sizeof(epbuf));
    if (!ep)
        return EXIT_USAGE;
    ev.endpoint = ep;
    ev.follow = follow;
    ev.topics = &topics;
    out_init(&o, c.format, columns, 4, true, widths);
    ev.o = &o;

    int rc = EXIT_SYSTEM;
    int sig_fd = lora_signal_pipe_open(sigs, 2);
    void *zctx = zmq_ctx_new();
    struct lora_sock *sub = NULL;
    ev.arena = lora_msg_arena_new();
    if (sig_fd < 0 || !zctx || !ev.arena) {
        die_msg("unable to set up: %s", strerror(errno));
        goto out;
    }
    sub = lora_sock_new(zctx, ZMQ_SUB, ep, false, NULL, err, sizeof(err));
    if (!sub) {
        die_msg("%s", err);
        goto out;
    }
    if (subscribe(sub, &ev) < 0) {
        die_msg("unable to subscribe on '%s': %s", ep, zmq_strerror(errno));
        goto out;
    }
    rc = run(&ev, sub, sig_fd, c.timeout_ms, interval_ms);
out:
    out_end(&o);
    lora_sock_destroy(&sub);
    if (zctx)
        zmq_ctx_term(zctx);
    lora_msg_arena_destroy(&ev.arena);
    if (sig_fd >= 0)
        lora_signal_pipe_close(sig_fd);
    return out_status(&o, rc);
}
