/* lora-engine workers.c: the worker group. Calls publish.c, registry.c and lograte.c. */
#ifndef LORA_ENGINE_WORKERS_H
#define LORA_ENGINE_WORKERS_H

#include "engine.h"

/* Start-up: waits for every rank's hello, sends setup and waits for setup_done from all.
 * Returns 0, 1 when a signal asked to stop meanwhile, 2 when a rank refused the model, or -1
 * with err. */
int workers_wait_setup(struct engine *e, char *err, size_t err_len);
/* Worker traffic outside of an exchange (the loop): heartbeats both ways, liveness, replies to
 * asynchronous operations, and hellos (a repeat, a second worker for a rank that is taken, or a
 * new process for a dead rank, set up in its place when the engine can re-admit it). */
void workers_poll(struct engine *e);
/* Declares the engine unhealthy (a rank is dead or unreachable): logs why and sets fail_due,
 * for the loop to fail every request and load in flight. */
void workers_mark_dead(struct engine *e, const char *why);

/* Sends the step m to every rank; a rank that cannot be reached is marked dead. */
int workers_step(struct engine *e, const struct lora_msg_step *m);
/* Receives one reply of type from every rank into replies[rank] (frames released with
 * workers_release). Other traffic is handled; a dead rank, a replaced one or the timeout fails
 * it with err (the caller decides whether that kills the engine). */
int workers_gather(struct engine *e, enum lora_msg_type type, struct lora_msg_frames *replies,
                   int timeout_ms, char *err, size_t err_len);
void workers_release(struct engine *e, struct lora_msg_frames *replies);
/* One adapter operation on every rank, waited for; a rank that does not answer is marked dead.
 * 0, or -1 with err (the first rank's error). */
int workers_adapter_op(struct engine *e, enum lora_adapter_op op, const char *name,
                       const char *path, int slot, char *err, size_t err_len);
/* An asynchronous activate of name into slot on every rank (engine->async_activate): the ranks
 * answer once their copies have begun; *pending: some rank's copy goes on. Sent again for the
 * same slot, it asks whether the copies are done. 0, or -1 with err. */
int workers_activate_async(struct engine *e, const char *name, int slot, bool *pending, char *err,
                           size_t err_len);
/* Gathers every rank's notifications: publishes the news, keeps each rank's state, follows
 * which adapters every rank caches. 0, or -1 (the rank that failed is marked dead). */
int workers_gather_notifications(struct engine *e);
/* Every rank's last gathered state, decoded into arena. */
int workers_rank_states(struct engine *e, struct lora_msg_arena *arena,
                        struct lora_msg_residency_reply *out);

/* An adapter operation sent to every rank and not waited for: its op_id, or 0 with err. */
uint64_t workers_op_start(struct engine *e, enum lora_adapter_op op, const char *name,
                          const char *path, char *err, size_t err_len);
/* 1 when every rank has answered op_id (then forgotten; err: the first error, "" for none), 0
 * while some have not. */
int workers_op_result(struct engine *e, uint64_t op_id, char *err, size_t err_len);
void workers_op_forget(struct engine *e, uint64_t op_id);

/* Tells every rank to stop (teardown). */
void workers_stop(struct engine *e);

#endif
