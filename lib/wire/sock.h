/* sock: ZeroMQ sockets with the project's framing and liveness.
 *
 * Owns one libzmq socket per struct lora_sock (ROUTER, DEALER, PUB or SUB; REQ/REP are not used),
 * its options, and the wire framing of docs/design.md, "Wire protocol":
 *
 *     [routing id, ROUTER side only] ["LORA1"] [body: one msgpack map] [raw binary frames...]
 *     PUB/SUB:                 [topic] ["LORA1"] [body] [raw binary frames...]
 *
 * The body is opaque bytes here (lib/wire/msg decodes it). A socket belongs to one thread.
 *
 * Invariants a caller can rely on:
 * - lora_sock_recv() never returns a message that is malformed at the framing level (version frame
 *   missing or not "LORA1", body missing or empty, more than LORA_SOCK_MAX_BINS binary frames,
 *   routing id or topic missing, empty or too long). Such a message is drained completely, counted
 *   in n_malformed (and per reason), logged to stderr on the first occurrence of each reason and
 *   every 1000th after, and recv goes on waiting for the next message within the same timeout.
 *   Other traffic on the socket is not affected.
 * - lora_sock_send() never produces a malformed message: it rejects bad arguments with EINVAL.
 * - No call waits forever: recv and poll take a timeout_ms >= 0 (-1 is rejected with EINVAL) and a
 *   blocking send gives up after LORA_SOCK_SEND_TIMEOUT_MS.
 * - lib/ never exits; errors are 0 / -1 (or NULL) with errno or a caller's error buffer.
 *
 * Socket options, set before bind/connect so that they hold from the first connection:
 * - ZMQ_LINGER 0 on every socket: a dead peer must never block shutdown (zmq_close or
 *   zmq_ctx_term). Messages still queued at close are lost by design; every exchange in the
 *   protocol is either retried, answered by a reply the sender waits for with a timeout, or a
 *   best-effort publication.
 * - ZMQ_ROUTER_MANDATORY 1 on ROUTER: sending to an unknown or departed routing id fails with
 *   EHOSTUNREACH instead of being dropped silently, so the engine learns at once that a worker or
 *   frontend is gone. ZMQ_ROUTER_HANDOVER 0 on ROUTER (said explicitly): a connection that
 *   announces a routing id already in use is refused, and the live peer keeps it. Handing an id
 *   over to a newcomer tore down the live connection under libzmq's feet (an assertion in its
 *   stream engine was seen) and let any peer silently replace another, so peers that set an
 *   identity make it unique (lora-worker puts its pid in it) and the engine decides by hello
 *   who a peer is.
 * - High-water marks, in messages, per peer: LORA_SOCK_HWM (1000) send and receive on ROUTER and
 *   DEALER: control, step and frontend traffic is request/response paced, so 1000 in flight is far
 *   above normal and reaching it means the peer is stuck (sends then fail with EAGAIN rather than
 *   growing memory). LORA_SOCK_PUB_HWM (10000) on PUB and SUB: stats and events come in bursts;
 *   when a subscriber is slower than that, PUB drops its messages (by design of PUB) and never
 *   blocks the engine.
 * - ZMQ_MAXMSGSIZE LORA_SOCK_MAX_MSG_BYTES (256 MiB) per frame on every socket: a hostile or broken
 *   peer that announces a larger frame is disconnected before we allocate for it (tcp/ipc only;
 *   inproc peers are in our own process).
 * - ZMQ_IMMEDIATE 1 on DEALER: messages are queued only to completed connections, so a send while
 *   the engine is down fails (EAGAIN with ZMQ_DONTWAIT, after LORA_SOCK_SEND_TIMEOUT_MS otherwise)
 *   instead of piling up for a peer that may never come.
 * - ZMQ_SNDTIMEO LORA_SOCK_SEND_TIMEOUT_MS (1000) on every socket: a blocking send waits at most
 *   that long for room, then fails with EAGAIN. Event loops should pass ZMQ_DONTWAIT.
 * - ZMQ_HEARTBEAT_IVL / ZMQ_HEARTBEAT_TIMEOUT (LORA_HEARTBEAT_INTERVAL_MS / LORA_HEARTBEAT_DEAD_MS)
 *   on every socket: ZMTP-level pings close a half-open tcp or ipc connection, so ROUTER and PUB
 *   stop queueing for it. This is connection hygiene only; peer liveness is the application-level
 *   heartbeat below.
 * - SUB sockets start subscribed to every topic (""); see lora_sock_subscribe().
 *
 * ipc:// endpoints, when binding: libzmq unlinks whatever file sits at the path before it binds,
 * which would silently steal the endpoint from a live process or delete a regular file. So before
 * binding we look at the path: nothing there is fine; a socket file that refuses connections is a
 * stale leftover and is removed; a socket with a live listener, or any other kind of file, makes
 * the bind fail. The check and the bind are not atomic: the supervisor gives each stack a fresh run
 * directory of mode 0700 and this is a second line of defence. After binding, the socket file is
 * chmod 0600 (there is a short window with the umask's mode, covered by the 0700 directory).
 * libzmq removes the socket file when the socket is closed. Abstract names (ipc://@name) skip both
 * steps.
 *
 * Liveness (docs/design.md, "Wire protocol"): every connection carries heartbeats. A side sends a
 * "heartbeat" message (lib/wire/msg) to a peer when it has sent that peer nothing for
 * LORA_HEARTBEAT_INTERVAL_MS (500 ms); any message received from a peer counts as a heartbeat; a
 * peer silent for LORA_HEARTBEAT_LIVENESS (6) intervals, LORA_HEARTBEAT_DEAD_MS = 3 s, is dead.
 * struct lora_peer_liveness (liveness.h) does the arithmetic for one peer.
 *
 * Signals: the read end of lib/base/signal_pipe.h's pipe goes into lora_sock_poll(), so the main
 * loop wakes, drains it and exits cleanly.
 */
#ifndef LORA_SOCK_H
#define LORA_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"
#include "base/signal_pipe.h"
#include "wire/liveness.h"
#include <zmq.h>

#define LORA_SOCK_VERSION         "LORA1"       /* the protocol version frame */
#define LORA_SOCK_MAX_BINS        8             /* raw binary frames after the body */
#define LORA_SOCK_MAX_RID         255           /* bytes in a routing id (ZeroMQ's own limit) */
#define LORA_SOCK_MAX_TOPIC       255           /* bytes in a PUB/SUB topic */
#define LORA_SOCK_MAX_MSG_BYTES   (256LL << 20) /* ZMQ_MAXMSGSIZE, per frame */
#define LORA_SOCK_HWM             1000          /* messages, ROUTER and DEALER */
#define LORA_SOCK_PUB_HWM         10000         /* messages, PUB and SUB */
#define LORA_SOCK_SEND_TIMEOUT_MS 1000          /* ZMQ_SNDTIMEO for blocking sends */
#define LORA_SOCK_POLL_MAX        16            /* sockets in one lora_sock_poll() */
#define LORA_SOCK_LOG_EVERY       1000          /* malformed warnings: the first, then every Nth */

/* Why a received message was dropped. Values only grow at the end. */
enum lora_sock_malformed {
    LORA_SOCK_BAD_RID,         /* ROUTER: routing id empty, or nothing after it */
    LORA_SOCK_BAD_TOPIC,       /* SUB: topic longer than LORA_SOCK_MAX_TOPIC, or nothing after */
    LORA_SOCK_NO_VERSION,      /* the frame where "LORA1" belongs is missing or not a version */
    LORA_SOCK_BAD_VERSION,     /* a "LORA<n>" version frame other than "LORA1" */
    LORA_SOCK_NO_BODY,         /* the body frame is missing or empty */
    LORA_SOCK_TOO_MANY_FRAMES, /* more than LORA_SOCK_MAX_BINS binary frames */
    LORA_SOCK_N_MALFORMED
};

/* One frame: borrowed bytes. */
struct lora_frame {
    const void *data;
    size_t len;
};

/* A socket. Fields are read-only to callers. */
struct lora_sock {
    void *zsock;          /* the libzmq socket, owned */
    int type;             /* ZMQ_ROUTER, ZMQ_DEALER, ZMQ_PUB or ZMQ_SUB */
    char *endpoint;       /* as given to lora_sock_new(), owned */
    void *monitor;        /* ZMQ_PAIR of lora_sock_watch_disconnects(), owned; NULL when not */
    uint64_t n_malformed; /* messages dropped, all reasons */
    uint64_t n_malformed_by_reason[LORA_SOCK_N_MALFORMED]; /* the same, per reason */
};

/* One received message. body and bins point into zmq messages owned by this struct and stay
 * valid until lora_msg_frames_release(). */
struct lora_msg_frames {
    unsigned char rid[LORA_SOCK_MAX_RID]; /* ROUTER: the sender's routing id */
    size_t rid_len;                       /* 0 on other sockets */
    char topic[LORA_SOCK_MAX_TOPIC + 1];  /* SUB: the topic, NUL-terminated ("" elsewhere) */
    size_t topic_len;
    const void *body; /* the msgpack map, body_len > 0 */
    size_t body_len;
    struct lora_frame bins[LORA_SOCK_MAX_BINS];
    int n_bins;
    /* private: storage for body (parts_[0]) and bins (parts_[1 + i]) */
    zmq_msg_t parts_[1 + LORA_SOCK_MAX_BINS];
    int n_parts_;
};

/* Creates a socket of zmq_type (ZMQ_ROUTER, ZMQ_DEALER, ZMQ_PUB or ZMQ_SUB) in zctx, sets the
 * options above, then binds to or connects to endpoint. identity_or_NULL sets ZMQ_ROUTING_ID (1 to
 * LORA_SOCK_MAX_RID bytes, NUL-terminated, not starting with a zero byte: libzmq reserves those),
 * which is what a ROUTER peer sees as our routing id. Returns NULL with "unable to bind 'ENDPOINT':
 * reason" (or "unable to connect to", or what else failed) in err. */
struct lora_sock *lora_sock_new(void *zctx, int zmq_type, const char *endpoint, bool bind,
                                const char *identity_or_NULL, char *err, size_t err_len);

/* Closes (*s)'s socket, dropping queued messages (LINGER 0), frees it and sets *s to NULL.
 * Accepts NULL and *s == NULL. */
void lora_sock_destroy(struct lora_sock **s);

/* Watches s's connection: s->monitor (poll it for ZMQ_POLLIN) then carries libzmq's monitor
 * events, of which lora_sock_disconnected() reads one. A subscriber uses it to learn that its
 * publisher went away (a restarted peer's counters start again). 0, or -1 with err. */
int lora_sock_watch_disconnects(struct lora_sock *s, void *zctx, char *err, size_t err_len);
/* Reads one pending monitor event (never blocks); whether it was a disconnection. */
bool lora_sock_disconnected(struct lora_sock *s);

/* SUB only: adds (or removes) a topic prefix. A new SUB socket is subscribed to "" (every topic);
 * to narrow it, subscribe to the topics wanted, then unsubscribe "". 0 / -1 with errno. */
int lora_sock_subscribe(struct lora_sock *s, const char *topic);
int lora_sock_unsubscribe(struct lora_sock *s, const char *topic);

/* Sends one message: on ROUTER the routing id (rid, rid_len: required, 1..LORA_SOCK_MAX_RID bytes),
 * on PUB the topic (required, at most LORA_SOCK_MAX_TOPIC bytes), then "LORA1", the body
 * (body_len > 0) and n_bins (0..LORA_SOCK_MAX_BINS) binary frames (bins may be empty frames).
 * All bytes are copied; the caller keeps its buffers. flags: 0 or ZMQ_DONTWAIT.
 * Returns 0, or -1 with errno: EINVAL (bad arguments or socket type, nothing sent), EAGAIN (no
 * room: high-water mark or, on DEALER, no connected peer; immediately with ZMQ_DONTWAIT, else
 * after LORA_SOCK_SEND_TIMEOUT_MS), EHOSTUNREACH (ROUTER: no peer with that routing id), EINTR,
 * ETERM. Only the first frame can fail for lack of room, so a failed send leaves nothing partial
 * queued; a failure after it (ETERM) leaves the socket fit only for lora_sock_destroy(). PUB never
 * fails for a slow subscriber: it drops for that subscriber. */
int lora_sock_send(struct lora_sock *s, const void *rid, size_t rid_len, const char *topic,
                   const void *body, size_t body_len, const struct lora_frame *bins, int n_bins,
                   int flags);

/* Receives one well-formed message into *out, waiting at most timeout_ms (>= 0; 0 only takes a
 * message that is already queued). Malformed messages are dropped and counted (see above) and the
 * wait goes on. Returns 1 when a message arrived (release *out afterwards), 0 on timeout or when a
 * signal interrupted the wait (the caller's loop checks its self-pipe and deadline), -1 on error
 * with err set ("recv on 'ENDPOINT': reason"; EINVAL for a PUB socket or timeout_ms < 0, ETERM
 * when the context is terminated). On 0 and -1 *out holds nothing. *out is overwritten without
 * being released: release a previous message first. */
int lora_sock_recv(struct lora_sock *s, struct lora_msg_frames *out, int timeout_ms, char *err,
                   size_t err_len);

/* Closes the zmq messages held by *f. Idempotent; safe on a zeroed struct. */
void lora_msg_frames_release(struct lora_msg_frames *f);

/* Polls n sockets (at most LORA_SOCK_POLL_MAX) for input, plus the file descriptor sig_fd when it
 * is >= 0 (the signal self-pipe), for at most timeout_ms. timeout_ms must be >= 0: there is no
 * infinite poll (-1 fails with EINVAL); loops poll with the time until their next deadline, such
 * as lora_liveness_timeout_ms(). readable_out[i] (n entries, plus one at [n] for sig_fd when it
 * is >= 0) tells which are ready. Returns the number ready, 0 on timeout, -1 with errno. A signal
 * that interrupts the wait is not an error: the poll is retried at once without waiting, so the
 * self-pipe shows up readable. */
int lora_sock_poll(struct lora_sock **socks, int n, int sig_fd, int timeout_ms, bool *readable_out);

#endif
