/* allreduce_shm: sums float buffers across the ranks of one host through POSIX shared memory.
 *
 * The tensor-parallel ranks of one engine are separate lora-worker processes on one host
 * (docs/design.md, "Programs"). After the attention output projection and the MLP down projection
 * each rank holds a partial sum; lora_allreduce_sum() replaces it, on every rank, with the sum over
 * all ranks. It is the CPU backend's collective: the runtime reaches it through backend/backend.h's
 * table (collective_open, allreduce_sum, collective_close), never by name.
 *
 * Segment: one POSIX shared-memory object per group, mode 0600, named by the caller ("/name",
 * unique per group: e.g. the engine's pid, index and a group generation). Layout: a header (magic,
 * version, world_size, max_floats, the barrier's atomic counters, each on its own cache line),
 * then 2 * world_size slices of max_floats floats (two banks, see below). It costs
 * 8 * world_size * max_floats bytes of /dev/shm, reserved with posix_fallocate at creation so that
 * a full /dev/shm fails lora_allreduce_open() with ENOSPC instead of a SIGBUS in a step.
 *
 * Creation: every rank calls lora_allreduce_open() with the same name and limits, in any order.
 * Whoever comes first creates the object (O_CREAT | O_EXCL), sizes and initialises it, and
 * publishes the magic last; the others open it and wait, at most timeout_ms, for the magic. A
 * segment whose world_size or max_floats differ from the caller's, that another user owns or
 * others can access, or that this rank has already joined is refused with a message.
 *
 * Who removes the name: the last rank to join removes it at once (the memory lives on until every
 * rank has closed), so a formed group leaves nothing in /dev/shm even when its workers are killed.
 * A group that never formed (a rank died before opening) leaves its name behind: rank 0 calls
 * lora_allreduce_unlink() at shutdown, which is harmless when the name is already gone.
 *
 * Sum: each rank copies its buffer into its slice of the current bank, meets the others at a
 * barrier, then adds all slices in rank order (slice 0 + slice 1 + ...) into its buffer. The order
 * per element is the same on every rank, so every rank gets bit-identical results. The two banks
 * alternate from call to call: a rank writing bank b in call k + 2 has passed the barrier of call
 * k + 1, which every rank reached only after reading bank b in call k, so one barrier per call
 * suffices.
 *
 * Barrier: a central counter with a generation number in the header (C11 atomics). A waiter
 * spins with pause for about 20 us, then yields until about 200 us, then sleeps on the generation
 * word with futex (slices of at most 20 ms), woken by the last rank to arrive; a slow peer costs
 * the waiters almost no CPU. It never waits forever: after timeout_ms without progress (no rank
 * arriving, no release) the call fails with ETIMEDOUT and marks the group broken, so that every
 * later call on any rank fails at once with ENOTRECOVERABLE. A dead peer therefore costs at most
 * timeout_ms; the caller turns the failure into an error for the step.
 *
 * Invariants the caller must keep: every rank makes the same sequence of calls with the same n
 * (a mismatch is detected after the barrier and fails the call on every rank with EPROTO, and
 * breaks the group); one thread per rank calls at a time; the first call comes once every rank is
 * up (the engine steps only after every worker is ready), or timeout_ms must cover the start-up
 * skew. A restarted rank cannot rejoin a group: it needs a fresh segment under a new name, i.e.
 * the engine re-creates the whole group.
 */
#ifndef LORA_ALLREDUCE_SHM_H
#define LORA_ALLREDUCE_SHM_H

#include <stddef.h>

/* The largest group: the joined ranks are a 64-bit mask. */
#define LORA_ALLREDUCE_MAX_WORLD 64

struct lora_allreduce;

/* Opens (creating it when first) the segment name ("/x", no other '/') as rank of world_size
 * ranks, for sums of at most max_floats floats. timeout_ms (>= 1) bounds the wait for another
 * rank's creation here and every barrier wait in lora_allreduce_sum(). Returns the caller's handle,
 * or NULL with errno and a message in err (EINVAL bad argument or mismatched segment, EEXIST rank
 * already joined, EPERM segment of another user or open to others, ETIMEDOUT segment never
 * initialised, ENOSPC no room in /dev/shm, ...). */
struct lora_allreduce *lora_allreduce_open(const char *name, int rank, int world_size,
                                           size_t max_floats, int timeout_ms, char *err,
                                           size_t err_len);

/* Unmaps the segment and frees *ar, then nulls it; NULL or *NULL is a no-op. Other ranks are not
 * told: one still calling lora_allreduce_sum() times out. */
void lora_allreduce_close(struct lora_allreduce **ar);

/* Removes the name (see the header comment for who calls it). Returns 0 when it is gone, also when
 * it was not there, or -1 with errno. */
int lora_allreduce_unlink(const char *name);

/* Replaces buf (n floats) with the sum over all ranks of their buf, in place, on every rank.
 * ctx is the struct lora_allreduce. Returns 0, or -1 with errno: EINVAL (n > max_floats, NULL
 * ctx or buf), ETIMEDOUT (no progress at the barrier for timeout_ms; the group is now broken),
 * ENOTRECOVERABLE (the group broke earlier, on this rank or another), EPROTO (ranks disagree on
 * n; the group is now broken). After a failure buf is unspecified. n == 0 returns 0 at once. */
int lora_allreduce_sum(float *buf, size_t n, void *ctx);

#endif
