/* adapter_cache: one worker rank's adapters: the CPU cache and the compute slots.
 *
 * The cache owns every adapter it holds (struct lora_adapter, host memory, destroyed on eviction
 * or removal) and knows which of them sit in the max_loras compute slots (docs/design.md,
 * "Residency": gpu ⊂ cpu; an adapter in a slot is also in the cache and counts against
 * max_cpu_loras). The slots themselves, preallocated in the backend's memory, belong to
 * lib/runtime/forward: whenever a slot's content changes the cache calls set_slot (the worker wires
 * it to lora_forward_set_slot, which copies the adapter's weights into the slot), so the compute
 * side never holds a pointer into an adapter the cache may destroy. An ACTIVATE timing is the time
 * of that copy.
 *
 * Invariants a caller can rely on after every call, successful or not (lora_adapter_cache_check
 * verifies them):
 *   - n_cached <= max_cpu_loras; names are unique, non-empty, at most LORA_ADAPTER_NAME_MAX bytes;
 *   - a slot holds at most one entry, an entry at most one slot, and a slotted entry is cached;
 *   - a pinned entry is always in a slot, so insert (which evicts only entries outside the
 *     slots) and activate (which refuses a pinned occupant) never evict it; only remove does;
 *   - an operation that fails changes nothing (the cache, the slots as seen through set_slot,
 *     the timings) and says why in err as one line naming the adapter.
 *
 * Every change of level is recorded as a timing (LOAD on insert, ACTIVATE, EVICT from a slot or
 * from the cache, REMOVE) in a bounded list of LORA_ADAPTER_CACHE_MAX_TIMINGS that drops the
 * oldest and counts the drops; a snapshot takes them. "now" is the caller's clock (a step
 * counter, or nanoseconds): only its order matters, least recently used = smallest last_used,
 * ties going to the lowest slot or the earliest cache position.
 *
 * Not thread-safe; no allocation except in new and in snapshot (which grows its own arrays).
 */
#ifndef LORA_ADAPTER_CACHE_H
#define LORA_ADAPTER_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/adapter.h"
#include "wire/msg.h"

#define LORA_ADAPTER_NAME_MAX          255 /* bytes of a name, without the NUL */
#define LORA_ADAPTER_CACHE_MAX_TIMINGS 256

/* Called with a (borrowed for the call; NULL empties the slot) whenever slot's content changes:
 * the callee copies what it needs. Returns 0; 1 when the copy goes on after the call (the cache
 * then records no ACTIVATE timing: the caller records it with
 * lora_adapter_cache_record_activate once the copy is done); or -1 with a reason in err, and
 * the cache undoes its change. Setting NULL should not fail: when it does, the operation fails
 * and the cache tries to restore what the slots held. */
typedef int (*lora_adapter_cache_set_slot_fn)(void *ctx, int slot, const struct lora_adapter *a,
                                              char *err, size_t err_len);

/* Whether a running request uses adapter name (its slot must not be taken away). */
typedef bool (*lora_adapter_cache_in_use_fn)(void *ctx, const char *name);

struct lora_adapter_cache_entry {
    char name[LORA_ADAPTER_NAME_MAX + 1];
    struct lora_adapter *adapter; /* owned */
    bool pinned;                  /* implies slot >= 0 */
    int slot;                     /* -1: in the CPU cache only */
    uint64_t last_used;           /* caller's clock at insert, activate or touch */
    double load_seconds;          /* as given to insert */
};

struct lora_adapter_cache;

/* A cache with max_loras slots (>= 1) and room for max_cpu_loras adapters (>= max_loras).
 * set_slot may be NULL (no compute side). Returns NULL with err on bad limits or no memory. */
struct lora_adapter_cache *lora_adapter_cache_new(int max_loras, int max_cpu_loras,
                                                  lora_adapter_cache_set_slot_fn set_slot,
                                                  void *set_slot_ctx, char *err, size_t err_len);

/* Destroys every adapter, without calling set_slot: the compute side must be gone or no longer
 * used. Nulls *c. */
void lora_adapter_cache_destroy(struct lora_adapter_cache **c);

/* Makes activate_lru skip occupants for which in_use returns true. NULL: none is skipped. */
void lora_adapter_cache_set_in_use(struct lora_adapter_cache *c, lora_adapter_cache_in_use_fn fn,
                                   void *ctx);

/* Adds adapter *a as name at CPU level, with last_used = now, and records a LOAD timing of
 * load_seconds. On success takes ownership and nulls *a; on failure *a stays the caller's.
 * When the cache is full, first evicts (destroys) the least recently used entry that is neither
 * pinned nor in a slot, recording an EVICT timing; fails when there is none. */
int lora_adapter_cache_insert(struct lora_adapter_cache *c, const char *name,
                              struct lora_adapter **a, double load_seconds, uint64_t now, char *err,
                              size_t err_len);

/* Puts cached adapter name into slot and sets its last_used to now. The slot's previous
 * occupant goes back to CPU level (EVICT timing), unless it is pinned: then it fails. An adapter
 * already in another slot moves (its old slot is emptied). Records an ACTIVATE timing whose
 * seconds are the set_slot call's wall time (none when it says the copy goes on). Already in
 * that slot: only last_used changes. */
int lora_adapter_cache_activate(struct lora_adapter_cache *c, const char *name, int slot,
                                uint64_t now, char *err, size_t err_len);

/* Records an ACTIVATE timing of seconds for cached adapter name (see set_slot's 1). */
int lora_adapter_cache_record_activate(struct lora_adapter_cache *c, const char *name,
                                       double seconds, char *err, size_t err_len);

/* Puts name into a slot of the cache's choosing and returns it in *slot: the one it already
 * occupies, else the lowest free slot, else the slot of the least recently used occupant that
 * is not pinned and not in use. Fails when every slot is pinned or in use. */
int lora_adapter_cache_activate_lru(struct lora_adapter_cache *c, const char *name, uint64_t now,
                                    int *slot, char *err, size_t err_len);

/* Removes name from its slot (set_slot NULL) and from the cache, pinned or not, and destroys
 * the adapter (its memory is freed). Records a REMOVE timing of the destroy's wall time. */
int lora_adapter_cache_remove(struct lora_adapter_cache *c, const char *name, char *err,
                              size_t err_len);

/* Pins name; an adapter outside the slots is first brought into one as by activate_lru (and the
 * pin fails, changing nothing, when that fails). Pinning a pinned adapter is fine. */
int lora_adapter_cache_pin(struct lora_adapter_cache *c, const char *name, uint64_t now, char *err,
                           size_t err_len);

/* Unpins name (it stays where it is). Unpinning an unpinned adapter is fine. */
int lora_adapter_cache_unpin(struct lora_adapter_cache *c, const char *name, char *err,
                             size_t err_len);

/* Sets name's last_used to now (the worker calls it for the adapters of a step). */
int lora_adapter_cache_touch(struct lora_adapter_cache *c, const char *name, uint64_t now,
                             char *err, size_t err_len);

/* The entry of name, or NULL. Borrowed: valid until the entry is evicted or removed. */
const struct lora_adapter_cache_entry *lora_adapter_cache_find(const struct lora_adapter_cache *c,
                                                               const char *name);

/* The entry / adapter in slot, or NULL when the slot is free or out of range. */
const struct lora_adapter_cache_entry *
lora_adapter_cache_slot_entry(const struct lora_adapter_cache *c, int slot);
const struct lora_adapter *lora_adapter_cache_slot_adapter(const struct lora_adapter_cache *c,
                                                           int slot);

int lora_adapter_cache_max_loras(const struct lora_adapter_cache *c);
int lora_adapter_cache_max_cpu_loras(const struct lora_adapter_cache *c);
int lora_adapter_cache_n_cached(const struct lora_adapter_cache *c);

/* Timings recorded and not yet taken by a snapshot; total dropped since creation. */
int lora_adapter_cache_n_timings(const struct lora_adapter_cache *c);
uint64_t lora_adapter_cache_timings_dropped(const struct lora_adapter_cache *c);

/* The full state, shaped as the protocol's lora_msg_state and lora_msg_timing so a caller can
 * point a message at it. Every string is a NUL-terminated copy owned by the snapshot. */
struct lora_adapter_cache_snapshot {
    struct lora_msg_state state; /* slots[i] = name in slot i, "" when free; cpu: every cached
                                    name (slotted included), sorted; pinned: sorted */
    int n_timings;
    struct lora_msg_timing *timings; /* oldest first */
    uint64_t timings_dropped;        /* dropped since the previous snapshot that took timings */
    /* storage, reused from one snapshot to the next */
    struct lora_str *strs;
    int strs_cap;
    int timings_cap;
    char *names;
    size_t names_cap;
};

/* Fills s, which is zeroed before its first use and may be reused. With take_timings the
 * pending timings move into s and are cleared in the cache; without, s has none and the cache
 * keeps them. Returns 0, or -1 (out of memory) with err, the cache unchanged. */
int lora_adapter_cache_snapshot(struct lora_adapter_cache *c, struct lora_adapter_cache_snapshot *s,
                                bool take_timings, char *err, size_t err_len);

/* Frees s's storage and zeroes it. */
void lora_adapter_cache_snapshot_release(struct lora_adapter_cache_snapshot *s);

/* Verifies the invariants above. Returns 0, or -1 with the first violation in err. */
int lora_adapter_cache_check(const struct lora_adapter_cache *c, char *err, size_t err_len);

#endif
