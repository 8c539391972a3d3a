/* lora-engine publish.c: every encoding and every send on the engine's sockets. Calls only
 * registry.c (and the library). */
#ifndef LORA_ENGINE_PUBLISH_H
#define LORA_ENGINE_PUBLISH_H

#include "engine.h"

/* The limits the engine announces (ready) and imposes (setup). */
void publish_limits(const struct engine *e, struct lora_msg_limits *l);
/* Frees the encode buffer (at exit). */
void publish_release(void);

/* ---- the publish socket (PUB) ---- */
/* A lifecycle event of r; records its time in r (the first SCHEDULED). */
void publish_event(struct engine *e, struct eng_request *r, enum lora_event_kind kind,
                   const char *reason);
/* The stats of the step of e->plan. */
void publish_step_stats(struct engine *e, double step_seconds, double model_seconds);
/* The registry on the publish socket, and to every frontend when to_frontends. */
void publish_registry(struct engine *e, bool to_frontends);
/* A rank's notifications, on the publish socket and to every frontend. */
void publish_notifications(struct engine *e, const struct lora_msg_notifications *m);
/* The whole truth again (docs/design.md, "Metrics", "Inspection"): limits, registry, every rank's
 * state and, when idle, the request counts. */
void publish_state(struct engine *e, bool idle);

/* ---- the frontends' socket ---- */
void publish_ready(struct engine *e, int fe);
int publish_output(struct engine *e, int fe, const struct lora_msg_output *o);
/* The heartbeats due to frontends (safe while a step is in flight and frontends are not read). */
void publish_frontend_heartbeats(struct engine *e);

/* ---- the control socket ---- */
/* A control reply to the asker rid: err NULL for ok, data an optional msgpack map. */
void publish_control_reply(struct engine *e, const void *rid, size_t rid_len, uint64_t id,
                           const char *err, const void *data, size_t data_len);

/* ---- the workers' socket ----
 * To one rank: 0, or -1 with errno (EHOSTUNREACH: its connection is gone). To every rank: 0, or
 * -1 with *failed the rank that could not be reached (errno), or -1 when nothing was sent. */
int publish_worker_empty(struct engine *e, int r, enum lora_msg_type t);
int publish_setup(struct engine *e, int r, const struct lora_msg_setup *s);
/* Answers a newcomer (frames f) that asked for a rank a live worker holds. */
void publish_setup_refusal(struct engine *e, const struct lora_msg_frames *f, int rank,
                           const char *why);
int publish_workers_empty(struct engine *e, enum lora_msg_type t, int *failed);
int publish_adapter_op(struct engine *e, const struct lora_msg_adapter_op *m, int *failed);
int publish_step(struct engine *e, const struct lora_msg_step *m, int *failed);

#endif
