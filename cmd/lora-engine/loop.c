/* lora-engine: the loop (docs/design.md, "Programs", "Wire protocol", "Backend", "Residency"). Each
 * turn: frontend requests and aborts, control commands, worker traffic (heartbeats, hellos, replies
 * to loads in flight), frontends gone silent, loads every rank has answered, the rate-limited
 * warnings; then one scheduled step while there is work, else the notifications of every rank every
 * --idle-notify-ms; then the whole state published every --publish-interval-ms and whenever the
 * engine turns idle. After each phase it fails what a dead rank left in flight (workers_mark_dead
 * sets fail_due): every request and every load, before anything else runs.
 *
 * Calls: step.c, control.c, loads.c, frontends.c, workers.c, publish.c, lograte.c. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "control.h"
#include "frontends.h"
#include "loads.h"
#include "lograte.h"
#include "loop.h"
#include "publish.h"
#include "step.h"
#include "workers.h"

/* Fails every request and load in flight when a rank died since the last call. */
static void settle(struct engine *e)
{
    char why[sizeof(e->fail_why)];

    if (!e->fail_due)
        return;
    e->fail_due = false;
    snprintf(why, sizeof(why), "%s", e->fail_why);
    frontends_fail_all(e, why);
    loads_fail_all(e, why);
}

int loop_run(struct engine *e)
{
    for (;;) {
        bool readable[4] = {false};
        struct lora_sock *socks[3] = {e->front, e->ctl, e->work};
        int timeout = e->newcomer.due ? 0 : !step_has_work(e) ? 50 : e->plan_empty ? 1 : 0;
        if (lora_sock_poll(socks, 3, e->sig_fd, timeout, readable) < 0 && errno != EINTR) {
            fprintf(stderr, "lora-engine: fatal: poll: %s\n", strerror(errno));
            return EXIT_SYSTEM;
        }
        if (e->stopping || (readable[3] && lora_signal_pipe_drain(e->sig_fd) > 0))
            return 0;
        struct lora_msg_frames f;
        char err[256];
        while (lora_sock_recv(e->front, &f, 0, err, sizeof(err)) == 1) {
            frontends_handle(e, &f);
            lora_msg_frames_release(&f);
        }
        while (lora_sock_recv(e->ctl, &f, 0, err, sizeof(err)) == 1) {
            control_handle(e, &f);
            lora_msg_frames_release(&f);
            settle(e);
        }
        workers_poll(e);
        settle(e);
        frontends_expire(e);
        uint64_t now = lora_clock_mono_ms();
        loads_finish_ready(e, now);
        settle(e);
        lograte_flush(&e->log_ctl, now);
        lograte_flush(&e->log_front, now);
        lograte_flush(&e->log_hello, now);
        if (step_has_work(e)) {
            step_run(e);
            e->was_busy = true;
        } else if (e->healthy && lora_clock_mono_ms() - e->last_gather_ms >= (uint64_t)e->idle_ms) {
            workers_gather_notifications(e);
        }
        settle(e);
        bool idle = !step_has_work(e);
        if ((idle && e->was_busy) ||
            lora_clock_mono_ms() - e->last_publish_ms >= (uint64_t)e->publish_interval_ms) {
            e->last_publish_ms = lora_clock_mono_ms();
            publish_state(e, idle);
            e->was_busy = e->was_busy && !idle;
        }
        if (e->stopping)
            return 0;
    }
}
