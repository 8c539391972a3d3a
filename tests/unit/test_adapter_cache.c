/* Unit tests for lib/runtime/adapter_cache: the docs/design.md, "Residency" example (max_loras 2,
 * max_cpu_loras 3, pinning), LRU eviction from the cache and from the slots, the in_use callback,
 * every error with its message and with nothing changed (set_slot failures injected through a
 * fake), removal that really frees (run under ASan), snapshots and their timings, 5000 random
 * operations with the invariant check and an independent LRU oracle after each, and real generated
 * adapters wired to lora_forward_set_slot, whose slots hold copies.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/adapter.h"
#include "runtime/adapter_cache.h"
#include "fixture.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"

#define ERR_BYTES 512
#define MAX_SLOTS 8

/* ---- fakes ---------------------------------------------------------------------------------- */

/* The compute side as set_slot leaves it, with a call log and failure injection. */
struct fake_slots {
    const struct lora_adapter *slot[MAX_SLOTS];
    int n_calls;
    int n_null_calls;
    int last_slot;
    int fail_in; /* > 0: the fail_in-th call from now fails; 0: none fails */
    bool copying; /* an adapter's copy goes on after the call (set_slot returns 1) */
};

static int fake_set_slot(void *ctx, int slot, const struct lora_adapter *a, char *err,
                         size_t err_len)
{
    struct fake_slots *f = ctx;

    if (f->fail_in > 0 && --f->fail_in == 0) {
        snprintf(err, err_len, "injected failure");
        return -1;
    }
    f->n_calls++;
    f->n_null_calls += a == NULL;
    f->last_slot = slot;
    f->slot[slot] = a;
    return a && f->copying ? 1 : 0;
}

/* A destroyable adapter with one small weight buffer, so a leak shows under ASan. */
static struct lora_adapter *fake_adapter(void)
{
    struct lora_adapter *a = calloc(1, sizeof(*a));

    a->rank = 4;
    a->n_layers = 2;
    a->a = calloc((size_t)a->n_layers * LORA_PROJ_COUNT, sizeof(*a->a));
    a->b = calloc((size_t)a->n_layers * LORA_PROJ_COUNT, sizeof(*a->b));
    a->a[0] = calloc(16, sizeof(float));
    a->bytes = 16 * sizeof(float);
    return a;
}

static struct lora_adapter_cache *new_cache(int max_loras, int max_cpu, struct fake_slots *f)
{
    char err[ERR_BYTES] = "";
    struct lora_adapter_cache *c =
        lora_adapter_cache_new(max_loras, max_cpu, fake_set_slot, f, err, sizeof(err));

    if (!c)
        printf("# new_cache: %s\n", err);
    memset(f, 0, sizeof(*f));
    return c;
}

/* Inserts a fresh fake adapter as name; on failure destroys it and leaves the reason in err. */
static int ins(struct lora_adapter_cache *c, const char *name, uint64_t now, char *err)
{
    struct lora_adapter *a = fake_adapter();
    int rc = lora_adapter_cache_insert(c, name, &a, 0.25, now, err, ERR_BYTES);

    if (rc == 0 && a != NULL)
        rc = -2; /* ownership not taken */
    if (rc != 0 && a == NULL)
        rc = -3; /* ownership taken on failure */
    lora_adapter_destroy(&a);
    return rc;
}

/* Inserts name and brings it into a slot, which it returns (-1 on failure). */
static int ins_act(struct lora_adapter_cache *c, const char *name, uint64_t now)
{
    char err[ERR_BYTES] = "";
    int slot = -1;

    if (ins(c, name, now, err) != 0 ||
        lora_adapter_cache_activate_lru(c, name, now, &slot, err, sizeof(err)) != 0) {
        printf("# ins_act %s: %s\n", name, err);
        return -1;
    }
    return slot;
}

static const char *slot_name(const struct lora_adapter_cache *c, int slot)
{
    const struct lora_adapter_cache_entry *e = lora_adapter_cache_slot_entry(c, slot);

    return e ? e->name : "";
}

static bool invariants_hold(const struct lora_adapter_cache *c)
{
    char err[ERR_BYTES] = "";

    if (lora_adapter_cache_check(c, err, sizeof(err)) == 0)
        return true;
    printf("# invariant: %s\n", err);
    return false;
}

/* Whether the fake compute side holds what the cache says each slot holds. */
static bool mirror_matches(const struct lora_adapter_cache *c, const struct fake_slots *f)
{
    for (int s = 0; s < lora_adapter_cache_max_loras(c); s++) {
        if (f->slot[s] != lora_adapter_cache_slot_adapter(c, s)) {
            printf("# slot %d: compute side and cache disagree\n", s);
            return false;
        }
    }
    return true;
}

/* The state as one line: slots, then every cached entry with level, pin and last_used, sorted
 * by name, then the number of pending timings. Equal lines = nothing changed. */
static void fingerprint(const struct lora_adapter_cache *c, char *out, size_t len)
{
    static const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"};
    size_t off = 0;

    for (int s = 0; s < lora_adapter_cache_max_loras(c); s++)
        off += (size_t)snprintf(out + off, len - off, "[%s]", slot_name(c, s));
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        const struct lora_adapter_cache_entry *e = lora_adapter_cache_find(c, names[k]);

        if (e)
            off += (size_t)snprintf(out + off, len - off, " %s:%d:%d:%llu:%p", e->name, e->slot,
                                    e->pinned, (unsigned long long)e->last_used,
                                    (const void *)e->adapter);
    }
    snprintf(out + off, len - off, " t%d n%d", lora_adapter_cache_n_timings(c),
             lora_adapter_cache_n_cached(c));
}

/* Whether the snapshot's list l equals the n names given (NULL-terminated varargs are avoided:
 * want is an array). */
static bool strs_equal(const struct lora_str *l, int n, const char *const *want, int n_want)
{
    if (n != n_want) {
        printf("# %d names, expected %d\n", n, n_want);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (strlen(want[i]) != l[i].len || strcmp(l[i].s, want[i]) != 0) {
            printf("# name %d is '%s', expected '%s'\n", i, l[i].s, want[i]);
            return false;
        }
    }
    return true;
}

/* Index of the first timing (from) with name and transition, or -1. */
static int find_timing(const struct lora_adapter_cache_snapshot *s, int from, const char *name,
                       enum lora_transition tr)
{
    for (int i = from; i < s->n_timings; i++) {
        if (s->timings[i].transition == tr && strcmp(s->timings[i].name.s, name) == 0)
            return i;
    }
    return -1;
}

/* ---- a worked residency example
 * --------------------------------------------------------------------- */

static void test_design_example(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 3, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "";
    uint64_t now = 0;

    CHECK(c != NULL);
    if (!c)
        return;
    CHECK(ins_act(c, "1", ++now) == 0);
    CHECK(ins_act(c, "2", ++now) == 1);
    CHECK(ins_act(c, "3", ++now) == 0); /* 1 is the least recently used occupant */
    CHECK(strcmp(slot_name(c, 0), "3") == 0);
    CHECK(strcmp(slot_name(c, 1), "2") == 0);
    CHECK(lora_adapter_cache_find(c, "1") && lora_adapter_cache_find(c, "1")->slot == -1);
    CHECK(lora_adapter_cache_n_cached(c) == 3);
    CHECK(mirror_matches(c, &f));

    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    static const char *const slots1[] = {"3", "2"}, *const cpu[] = {"1", "2", "3"};
    CHECK(strs_equal(s.state.slots, s.state.n_slots, slots1, 2));
    CHECK(strs_equal(s.state.cpu, s.state.n_cpu, cpu, 3));
    CHECK(s.state.n_pinned == 0);
    int ev = find_timing(&s, 0, "1", LORA_TRANSITION_EVICT);
    CHECK(ev >= 0 && find_timing(&s, ev, "3", LORA_TRANSITION_ACTIVATE) > ev);

    /* Pinning 1 brings it back into the slot of the LRU of 2 and 3 (2), which goes to CPU. */
    CHECK(lora_adapter_cache_pin(c, "1", ++now, err, sizeof(err)) == 0);
    CHECK(strcmp(slot_name(c, 1), "1") == 0);
    CHECK(lora_adapter_cache_find(c, "2") && lora_adapter_cache_find(c, "2")->slot == -1);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    static const char *const slots2[] = {"3", "1"}, *const pinned[] = {"1"};
    CHECK(strs_equal(s.state.slots, s.state.n_slots, slots2, 2));
    CHECK(strs_equal(s.state.cpu, s.state.n_cpu, cpu, 3));
    CHECK(strs_equal(s.state.pinned, s.state.n_pinned, pinned, 1));
    CHECK(find_timing(&s, 0, "2", LORA_TRANSITION_EVICT) >= 0);

    /* No later insert or activate_lru ever evicts 1, however old it gets. */
    const struct lora_adapter *one = lora_adapter_cache_find(c, "1")->adapter;
    for (int k = 4; k < 40; k++) {
        char name[16];

        snprintf(name, sizeof(name), "%d", k);
        CHECK(ins_act(c, name, ++now) == 0);
        CHECK(strcmp(slot_name(c, 1), "1") == 0);
        CHECK(lora_adapter_cache_slot_adapter(c, 1) == one);
        CHECK(lora_adapter_cache_n_cached(c) == 3);
        CHECK(invariants_hold(c));
    }
    CHECK(f.slot[1] == one);
    CHECK(mirror_matches(c, &f));
    lora_adapter_cache_snapshot_release(&s);
    lora_adapter_cache_destroy(&c);
    CHECK(c == NULL);
}

/* ---- removal -------------------------------------------------------------------------------- */

static void test_remove_frees(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 3, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "";

    CHECK(ins_act(c, "a", 1) == 0);
    CHECK(ins(c, "b", 2, err) == 0);
    CHECK(lora_adapter_cache_pin(c, "a", 3, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);

    int calls = f.n_calls;
    CHECK(lora_adapter_cache_remove(c, "a", err, sizeof(err)) == 0); /* pinned: still removed */
    CHECK(f.n_calls == calls + 1 && f.n_null_calls == 1 && f.last_slot == 0);
    CHECK(f.slot[0] == NULL);
    CHECK(lora_adapter_cache_find(c, "a") == NULL);
    CHECK(lora_adapter_cache_slot_adapter(c, 0) == NULL);
    CHECK(lora_adapter_cache_n_cached(c) == 1);

    /* A CPU-only adapter leaves without a set_slot call. */
    calls = f.n_calls;
    CHECK(lora_adapter_cache_remove(c, "b", err, sizeof(err)) == 0);
    CHECK(f.n_calls == calls);
    CHECK(lora_adapter_cache_n_cached(c) == 0);

    CHECK(lora_adapter_cache_remove(c, "a", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter 'a' is not loaded");

    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 2);
    CHECK(find_timing(&s, 0, "a", LORA_TRANSITION_REMOVE) == 0);
    CHECK(find_timing(&s, 0, "b", LORA_TRANSITION_REMOVE) == 1);
    CHECK(s.state.n_cpu == 0 && s.state.n_pinned == 0);
    CHECK(s.state.n_slots == 2 && s.state.slots[0].len == 0 && s.state.slots[1].s[0] == '\0');

    /* The name can be loaded again. */
    CHECK(ins_act(c, "a", 4) == 0);
    CHECK(invariants_hold(c) && mirror_matches(c, &f));
    lora_adapter_cache_snapshot_release(&s);
    lora_adapter_cache_destroy(&c);
}

/* ---- insert --------------------------------------------------------------------------------- */

static void test_insert_evicts_lru(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(1, 3, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "";

    CHECK(ins(c, "a", 1, err) == 0);
    CHECK(ins(c, "b", 2, err) == 0);
    CHECK(ins(c, "c", 3, err) == 0);
    CHECK(lora_adapter_cache_touch(c, "a", 4, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 3 && find_timing(&s, 0, "c", LORA_TRANSITION_LOAD) == 2);
    CHECK_NEAR(s.timings[0].seconds, 0.25, 0);

    CHECK(ins(c, "d", 5, err) == 0); /* b is the least recently used */
    CHECK(lora_adapter_cache_find(c, "b") == NULL);
    CHECK(lora_adapter_cache_find(c, "a") && lora_adapter_cache_find(c, "c"));
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 2);
    CHECK(find_timing(&s, 0, "b", LORA_TRANSITION_EVICT) == 0);
    CHECK(find_timing(&s, 0, "d", LORA_TRANSITION_LOAD) == 1);

    /* c, the oldest, sits in the slot: a goes instead. */
    CHECK(lora_adapter_cache_activate(c, "c", 0, 3, err, sizeof(err)) == 0);
    CHECK(ins(c, "e", 6, err) == 0);
    CHECK(lora_adapter_cache_find(c, "a") == NULL);
    CHECK(lora_adapter_cache_find(c, "c") && lora_adapter_cache_find(c, "c")->slot == 0);
    CHECK(invariants_hold(c) && mirror_matches(c, &f));
    lora_adapter_cache_snapshot_release(&s);
    lora_adapter_cache_destroy(&c);
}

static void test_insert_errors(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 2, &f);
    struct lora_adapter *a = fake_adapter();
    char err[ERR_BYTES] = "", before[1024], after[1024];
    char long_name[LORA_ADAPTER_NAME_MAX + 2];

    CHECK(ins_act(c, "a", 1) == 0);
    CHECK(ins_act(c, "b", 2) == 1);
    CHECK(lora_adapter_cache_pin(c, "b", 3, err, sizeof(err)) == 0);
    fingerprint(c, before, sizeof(before));

    CHECK(lora_adapter_cache_insert(c, "c", &a, 0, 4, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "CPU adapter cache is full (2 adapters, all pinned or in slots)");
    CHECK(a != NULL);
    CHECK(lora_adapter_cache_insert(c, "a", &a, 0, 4, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter 'a' is already loaded");
    CHECK(a != NULL);
    CHECK(lora_adapter_cache_insert(c, "", &a, 0, 4, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter name is empty");
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    CHECK(lora_adapter_cache_insert(c, long_name, &a, 0, 4, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "is longer than 255 bytes");
    CHECK(a != NULL);
    struct lora_adapter *none = NULL;
    CHECK(lora_adapter_cache_insert(c, "z", &none, 0, 4, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no adapter to insert");
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0);

    /* A name of exactly LORA_ADAPTER_NAME_MAX bytes fits, once a is out of the cache. */
    CHECK(lora_adapter_cache_remove(c, "a", err, sizeof(err)) == 0);
    long_name[LORA_ADAPTER_NAME_MAX] = '\0';
    CHECK(lora_adapter_cache_insert(c, long_name, &a, 0, 5, err, sizeof(err)) == 0);
    CHECK(a == NULL);
    CHECK(lora_adapter_cache_find(c, long_name) != NULL);
    CHECK(invariants_hold(c));
    lora_adapter_destroy(&a);
    lora_adapter_cache_destroy(&c);

    CHECK(lora_adapter_cache_new(0, 3, NULL, NULL, err, sizeof(err)) == NULL);
    CHECK_CONTAINS(err, "bad adapter cache limits");
    CHECK(lora_adapter_cache_new(3, 2, NULL, NULL, err, sizeof(err)) == NULL);
    CHECK_CONTAINS(err, "max_cpu_loras 2");
    lora_adapter_cache_destroy(NULL);
}

/* ---- activate ------------------------------------------------------------------------------- */

static void test_activate_pinned_occupant(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 3, &f);
    char err[ERR_BYTES] = "", before[1024], after[1024];

    CHECK(ins_act(c, "a", 1) == 0);
    CHECK(ins(c, "b", 2, err) == 0);
    CHECK(lora_adapter_cache_pin(c, "a", 3, err, sizeof(err)) == 0);
    fingerprint(c, before, sizeof(before));
    int calls = f.n_calls;
    CHECK(lora_adapter_cache_activate(c, "b", 0, 4, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "slot 0 holds pinned adapter 'a'");
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0);
    CHECK(f.n_calls == calls);

    /* A pinned adapter may itself be activated: it moves, its old slot empties. */
    const struct lora_adapter *a = lora_adapter_cache_find(c, "a")->adapter;
    CHECK(lora_adapter_cache_activate(c, "a", 1, 5, err, sizeof(err)) == 0);
    CHECK(f.slot[1] == a && f.slot[0] == NULL);
    CHECK(lora_adapter_cache_find(c, "a")->pinned);
    CHECK(lora_adapter_cache_activate(c, "b", 0, 6, err, sizeof(err)) == 0);
    CHECK(strcmp(slot_name(c, 0), "b") == 0 && strcmp(slot_name(c, 1), "a") == 0);
    CHECK(invariants_hold(c) && mirror_matches(c, &f));
    lora_adapter_cache_destroy(&c);
}

static void test_activate_moves_and_replaces(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 3, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "";

    CHECK(ins_act(c, "a", 1) == 0);
    CHECK(ins_act(c, "b", 2) == 1);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);

    /* a into b's slot: b back to CPU, slot 0 empty. */
    CHECK(lora_adapter_cache_activate(c, "a", 1, 3, err, sizeof(err)) == 0);
    CHECK(strcmp(slot_name(c, 0), "") == 0 && strcmp(slot_name(c, 1), "a") == 0);
    CHECK(lora_adapter_cache_find(c, "b")->slot == -1);
    CHECK(lora_adapter_cache_find(c, "a")->last_used == 3);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 2);
    CHECK(find_timing(&s, 0, "b", LORA_TRANSITION_EVICT) == 0);
    CHECK(find_timing(&s, 0, "a", LORA_TRANSITION_ACTIVATE) == 1);
    CHECK(s.timings[1].seconds >= 0 && s.timings[1].seconds < 1);
    CHECK(mirror_matches(c, &f));

    /* Same slot again: only last_used changes; no set_slot call, no timing. */
    int calls = f.n_calls;
    CHECK(lora_adapter_cache_activate(c, "a", 1, 7, err, sizeof(err)) == 0);
    CHECK(f.n_calls == calls && lora_adapter_cache_n_timings(c) == 0);
    CHECK(lora_adapter_cache_find(c, "a")->last_used == 7);
    int slot = -1;
    CHECK(lora_adapter_cache_activate_lru(c, "a", 8, &slot, err, sizeof(err)) == 0);
    CHECK(slot == 1 && f.n_calls == calls);

    CHECK(lora_adapter_cache_activate(c, "a", 2, 9, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "slot 2 is out of range (max_loras 2)");
    CHECK(lora_adapter_cache_activate(c, "a", -1, 9, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "slot -1 is out of range");
    CHECK(lora_adapter_cache_activate(c, "zz", 0, 9, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter 'zz' is not loaded");
    CHECK(lora_adapter_cache_activate_lru(c, "zz", 9, &slot, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter 'zz' is not loaded");
    CHECK(lora_adapter_cache_touch(c, "zz", 9, err, sizeof(err)) == -1);
    CHECK(lora_adapter_cache_pin(c, "zz", 9, err, sizeof(err)) == -1);
    CHECK(lora_adapter_cache_unpin(c, "zz", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter 'zz' is not loaded");
    CHECK(lora_adapter_cache_slot_adapter(c, 5) == NULL);
    CHECK(lora_adapter_cache_slot_entry(c, -1) == NULL);
    CHECK(invariants_hold(c));
    lora_adapter_cache_snapshot_release(&s);
    lora_adapter_cache_destroy(&c);
}

/* ---- in_use and pins ------------------------------------------------------------------------ */

struct busy {
    const char *names[4];
    int n;
};

static bool busy_in_use(void *ctx, const char *name)
{
    const struct busy *b = ctx;

    for (int i = 0; i < b->n; i++) {
        if (strcmp(b->names[i], name) == 0)
            return true;
    }
    return false;
}

static void test_in_use(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 4, &f);
    struct busy busy = {{"a"}, 1};
    char err[ERR_BYTES] = "", before[1024], after[1024];
    int slot = -1;

    lora_adapter_cache_set_in_use(c, busy_in_use, &busy);
    CHECK(ins_act(c, "a", 1) == 0);
    CHECK(ins_act(c, "b", 2) == 1);
    CHECK(ins(c, "c", 3, err) == 0);
    CHECK(ins(c, "d", 4, err) == 0);
    CHECK(lora_adapter_cache_activate_lru(c, "c", 5, &slot, err, sizeof(err)) == 0);
    CHECK(slot == 1); /* a is older but busy */
    CHECK(lora_adapter_cache_find(c, "b")->slot == -1);

    busy.names[1] = "c";
    busy.n = 2;
    fingerprint(c, before, sizeof(before));
    CHECK(lora_adapter_cache_activate_lru(c, "d", 6, &slot, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no slot for adapter 'd': all 2 slots hold pinned or in-use adapters");
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0);

    /* Not busy but pinned is the same; explicit activate does not ask in_use. */
    busy.n = 0;
    CHECK(lora_adapter_cache_pin(c, "a", 7, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_pin(c, "c", 8, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_activate_lru(c, "d", 9, &slot, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no slot for adapter 'd'");
    CHECK(lora_adapter_cache_unpin(c, "c", err, sizeof(err)) == 0);
    busy.names[0] = "c";
    busy.n = 1;
    CHECK(lora_adapter_cache_activate(c, "d", 1, 10, err, sizeof(err)) == 0);
    lora_adapter_cache_set_in_use(c, NULL, NULL);
    CHECK(invariants_hold(c) && mirror_matches(c, &f));
    lora_adapter_cache_destroy(&c);
}

static void test_pin_unpin(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(1, 3, &f);
    char err[ERR_BYTES] = "", before[1024], after[1024];
    int slot = -1;

    CHECK(ins(c, "a", 1, err) == 0);
    CHECK(ins_act(c, "b", 2) == 0);
    CHECK(lora_adapter_cache_pin(c, "a", 3, err, sizeof(err)) == 0); /* takes b's slot */
    CHECK(lora_adapter_cache_find(c, "a")->slot == 0 && lora_adapter_cache_find(c, "a")->pinned);
    CHECK(lora_adapter_cache_pin(c, "a", 4, err, sizeof(err)) == 0); /* again: fine */

    fingerprint(c, before, sizeof(before));
    CHECK(lora_adapter_cache_pin(c, "b", 5, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no slot for adapter 'b'");
    CHECK(!lora_adapter_cache_find(c, "b")->pinned);
    CHECK(lora_adapter_cache_activate_lru(c, "b", 5, &slot, err, sizeof(err)) == -1);
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0);

    CHECK(lora_adapter_cache_unpin(c, "a", err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_unpin(c, "a", err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_find(c, "a")->slot == 0); /* unpin keeps it where it is */
    CHECK(lora_adapter_cache_activate_lru(c, "b", 6, &slot, err, sizeof(err)) == 0);
    CHECK(slot == 0 && lora_adapter_cache_find(c, "a")->slot == -1);
    CHECK(invariants_hold(c) && mirror_matches(c, &f));
    lora_adapter_cache_destroy(&c);
}

/* ---- snapshots and timings ------------------------------------------------------------------ */

static void test_snapshot_order(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(3, 5, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "";

    CHECK(ins(c, "zeta", 1, err) == 0);
    CHECK(ins(c, "alpha", 2, err) == 0);
    CHECK(ins(c, "mid", 3, err) == 0);
    CHECK(ins(c, "beta", 4, err) == 0);
    CHECK(lora_adapter_cache_activate(c, "mid", 2, 5, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_pin(c, "zeta", 6, err, sizeof(err)) == 0); /* lowest free: 0 */
    CHECK(lora_adapter_cache_pin(c, "beta", 7, err, sizeof(err)) == 0); /* then 1 */

    /* Without taking timings: the state, and the cache keeps its timings. */
    int pending = lora_adapter_cache_n_timings(c);
    CHECK(pending == 7);
    CHECK(lora_adapter_cache_snapshot(c, &s, false, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 0 && lora_adapter_cache_n_timings(c) == pending);
    static const char *const slots[] = {"zeta", "beta", "mid"};
    static const char *const cpu[] = {"alpha", "beta", "mid", "zeta"};
    static const char *const pinned[] = {"beta", "zeta"};
    CHECK(strs_equal(s.state.slots, s.state.n_slots, slots, 3));
    CHECK(strs_equal(s.state.cpu, s.state.n_cpu, cpu, 4));
    CHECK(strs_equal(s.state.pinned, s.state.n_pinned, pinned, 2));

    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 7 && s.timings_dropped == 0);
    static const char *const names[] = {"zeta", "alpha", "mid", "beta", "mid", "zeta", "beta"};
    for (int i = 0; i < 7 && s.n_timings == 7; i++) {
        CHECK(strcmp(s.timings[i].name.s, names[i]) == 0);
        CHECK(s.timings[i].name.len == strlen(names[i]));
        CHECK(s.timings[i].transition == (i < 4 ? LORA_TRANSITION_LOAD : LORA_TRANSITION_ACTIVATE));
    }
    CHECK(lora_adapter_cache_n_timings(c) == 0);

    /* Cleared: the next snapshot has none; a free slot is the empty string. */
    CHECK(lora_adapter_cache_remove(c, "beta", err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 1 && find_timing(&s, 0, "beta", LORA_TRANSITION_REMOVE) == 0);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 0);
    static const char *const slots2[] = {"zeta", "", "mid"};
    static const char *const pinned2[] = {"zeta"};
    CHECK(strs_equal(s.state.slots, s.state.n_slots, slots2, 3));
    CHECK(strs_equal(s.state.pinned, s.state.n_pinned, pinned2, 1));
    CHECK(s.state.n_cpu == 3);

    /* The snapshot is a copy: it outlives the cache. */
    lora_adapter_cache_destroy(&c);
    CHECK(strcmp(s.state.slots[0].s, "zeta") == 0 && strcmp(s.state.cpu[0].s, "alpha") == 0);
    lora_adapter_cache_snapshot_release(&s);
    CHECK(s.strs == NULL && s.state.n_slots == 0);
    lora_adapter_cache_snapshot_release(&s);
}

static void test_timings_bounded(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(1, 1, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "", name[16];
    const int rounds = 300; /* 600 timings: LOAD and REMOVE per round */

    for (int k = 0; k < rounds; k++) {
        snprintf(name, sizeof(name), "n%d", k);
        CHECK(ins(c, name, (uint64_t)k, err) == 0);
        CHECK(lora_adapter_cache_remove(c, name, err, sizeof(err)) == 0);
    }
    CHECK(lora_adapter_cache_n_timings(c) == LORA_ADAPTER_CACHE_MAX_TIMINGS);
    CHECK(lora_adapter_cache_timings_dropped(c) == 2 * rounds - LORA_ADAPTER_CACHE_MAX_TIMINGS);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == LORA_ADAPTER_CACHE_MAX_TIMINGS);
    CHECK(s.timings_dropped == 2 * rounds - LORA_ADAPTER_CACHE_MAX_TIMINGS);

    /* The kept ones are the newest, oldest first: timing j of the 600 is round j / 2. */
    int first = 2 * rounds - LORA_ADAPTER_CACHE_MAX_TIMINGS, bad = 0;
    for (int i = 0; i < s.n_timings; i++) {
        int j = first + i;

        snprintf(name, sizeof(name), "n%d", j / 2);
        bad += strcmp(s.timings[i].name.s, name) != 0 ||
               s.timings[i].transition != (j % 2 ? LORA_TRANSITION_REMOVE : LORA_TRANSITION_LOAD);
    }
    CHECK(bad == 0);

    /* Drops since the last snapshot start again from zero; the total keeps counting. */
    CHECK(ins(c, "x", 1000, err) == 0);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 1 && s.timings_dropped == 0);
    CHECK(lora_adapter_cache_timings_dropped(c) == 2 * rounds - LORA_ADAPTER_CACHE_MAX_TIMINGS);
    lora_adapter_cache_snapshot_release(&s);
    lora_adapter_cache_destroy(&c);
}

/* A copy that goes on after set_slot: no ACTIVATE timing until the caller records one. */
static void test_copy_goes_on(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 2, &f);
    struct lora_adapter_cache_snapshot s = {0};
    char err[ERR_BYTES] = "";

    CHECK(ins(c, "a", 1, err) == 0);
    f.copying = true;
    CHECK(lora_adapter_cache_activate(c, "a", 1, 2, err, sizeof(err)) == 0);
    CHECK(f.slot[1] != NULL && lora_adapter_cache_find(c, "a")->slot == 1);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 1 && s.timings[0].transition == LORA_TRANSITION_LOAD);
    CHECK(lora_adapter_cache_record_activate(c, "a", 0.25, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_record_activate(c, "b", 0.25, err, sizeof(err)) == -1);
    CHECK(strstr(err, "adapter 'b' is not loaded") != NULL);
    CHECK(lora_adapter_cache_snapshot(c, &s, true, err, sizeof(err)) == 0);
    CHECK(s.n_timings == 1 && s.timings[0].transition == LORA_TRANSITION_ACTIVATE &&
          s.timings[0].seconds == 0.25 && strcmp(s.timings[0].name.s, "a") == 0);
    lora_adapter_cache_snapshot_release(&s);
    lora_adapter_cache_destroy(&c);
}

/* ---- set_slot failures ---------------------------------------------------------------------- */

static void test_set_slot_failure(void)
{
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(2, 3, &f);
    char err[ERR_BYTES] = "", before[1024], after[1024];
    int slot = -1;

    CHECK(ins_act(c, "a", 1) == 0);
    CHECK(ins_act(c, "b", 2) == 1);
    CHECK(ins(c, "c", 3, err) == 0);

    /* The new occupant is refused. */
    fingerprint(c, before, sizeof(before));
    f.fail_in = 1;
    CHECK(lora_adapter_cache_activate_lru(c, "c", 4, &slot, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unable to put adapter 'c' into slot 0: injected failure");
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0 && mirror_matches(c, &f));

    /* A move whose emptying of the old slot fails is undone. */
    f.fail_in = 2;
    CHECK(lora_adapter_cache_activate(c, "a", 1, 5, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unable to empty slot 0: injected failure");
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0 && mirror_matches(c, &f));

    /* A pin that cannot bring the adapter into a slot does not pin. */
    f.fail_in = 1;
    CHECK(lora_adapter_cache_pin(c, "c", 6, err, sizeof(err)) == -1);
    CHECK(!lora_adapter_cache_find(c, "c")->pinned);

    /* A removal whose slot cannot be emptied keeps the adapter. */
    f.fail_in = 1;
    CHECK(lora_adapter_cache_remove(c, "b", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unable to empty slot 1");
    fingerprint(c, after, sizeof(after));
    CHECK(strcmp(before, after) == 0 && mirror_matches(c, &f));
    CHECK(invariants_hold(c));

    /* Without a set_slot, slots change all the same. */
    struct lora_adapter_cache *n = lora_adapter_cache_new(1, 2, NULL, NULL, err, sizeof(err));
    CHECK(ins_act(n, "a", 1) == 0 && ins_act(n, "b", 2) == 0);
    CHECK(strcmp(slot_name(n, 0), "b") == 0 && invariants_hold(n));
    lora_adapter_cache_destroy(&n);
    lora_adapter_cache_destroy(&c);
}

/* ---- random operations ---------------------------------------------------------------------- */

#define R_NAMES 10

static uint64_t rng_state;

static uint32_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* The least recently used cached entry outside the slots and unpinned, by the test's own scan
 * over names (ties to the earliest name), or NULL. Ties cannot happen: every now is distinct. */
static const char *oracle_lru_cpu(const struct lora_adapter_cache *c, const char *const *names)
{
    const struct lora_adapter_cache_entry *best = NULL;

    for (int i = 0; i < R_NAMES; i++) {
        const struct lora_adapter_cache_entry *e = lora_adapter_cache_find(c, names[i]);

        if (e && e->slot < 0 && !e->pinned && (!best || e->last_used < best->last_used))
            best = e;
    }
    return best ? best->name : NULL;
}

struct r_stats {
    int ok[8], failed[8];
};

/* One random operation; returns its kind (0..7) and sets *rc. */
static int random_op(struct lora_adapter_cache *c, struct fake_slots *f, struct busy *busy,
                     const char *const *names, uint64_t now, bool *pinned_model, int *rc)
{
    char err[ERR_BYTES] = "";
    const char *name = names[rng() % R_NAMES];
    int kind = (int)(rng() % 8), slot = -1;
    const struct lora_adapter_cache_entry *e = lora_adapter_cache_find(c, name);

    busy->n = (int)(rng() % 3);
    for (int i = 0; i < busy->n; i++)
        busy->names[i] = names[rng() % R_NAMES];
    f->fail_in = rng() % 25 == 0 ? 1 + (int)(rng() % 2) : 0;

    switch (kind) {
    case 0:
    case 1: { /* insert, twice as often */
        const char *expect_evicted =
            lora_adapter_cache_n_cached(c) == lora_adapter_cache_max_cpu_loras(c)
                ? oracle_lru_cpu(c, names)
                : NULL;
        char evicted[LORA_ADAPTER_NAME_MAX + 1] = "";

        if (expect_evicted)
            snprintf(evicted, sizeof(evicted), "%s", expect_evicted);
        *rc = ins(c, name, now, err);
        if (*rc == 0 && evicted[0])
            CHECK(lora_adapter_cache_find(c, evicted) == NULL);
        if (*rc != 0 && !e && lora_adapter_cache_n_cached(c) == lora_adapter_cache_max_cpu_loras(c))
            CHECK(!evicted[0]);
        break;
    }
    case 2:
        *rc = lora_adapter_cache_activate(c, name, (int)(rng() % 3), now, err, sizeof(err));
        break;
    case 3:
        *rc = lora_adapter_cache_activate_lru(c, name, now, &slot, err, sizeof(err));
        if (*rc == 0)
            CHECK(strcmp(slot_name(c, slot), name) == 0);
        break;
    case 4:
        *rc = lora_adapter_cache_remove(c, name, err, sizeof(err));
        if (*rc == 0)
            pinned_model[name[0] - 'a'] = false;
        break;
    case 5:
        *rc = lora_adapter_cache_pin(c, name, now, err, sizeof(err));
        if (*rc == 0)
            pinned_model[name[0] - 'a'] = true;
        break;
    case 6:
        *rc = rng() % 4 ? lora_adapter_cache_touch(c, name, now, err, sizeof(err))
                        : lora_adapter_cache_unpin(c, name, err, sizeof(err));
        if (*rc == 0 && !lora_adapter_cache_find(c, name)->pinned)
            pinned_model[name[0] - 'a'] = false;
        break;
    default: {
        struct lora_adapter_cache_snapshot s = {0};

        *rc = lora_adapter_cache_snapshot(c, &s, rng() % 2, err, sizeof(err));
        CHECK(s.state.n_cpu == lora_adapter_cache_n_cached(c));
        for (int i = 1; i < s.state.n_cpu; i++)
            CHECK(strcmp(s.state.cpu[i - 1].s, s.state.cpu[i].s) < 0);
        lora_adapter_cache_snapshot_release(&s);
        break;
    }
    }
    f->fail_in = 0;
    if (*rc != 0 && !err[0]) {
        printf("# operation kind %d on '%s' failed without a message\n", kind, name);
        check_cur_failed = 1;
    }
    return kind;
}

static void test_random_ops(void)
{
    static const char *const names[R_NAMES] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
    struct fake_slots f;
    struct lora_adapter_cache *c = new_cache(3, 5, &f);
    struct busy busy = {{0}, 0};
    struct r_stats st = {{0}, {0}};
    bool pinned_model[R_NAMES] = {false};
    char before[1024], after[1024];
    int bad_invariant = 0, bad_mirror = 0, bad_unchanged = 0, bad_pinned = 0;

    rng_state = 20240607;
    lora_adapter_cache_set_in_use(c, busy_in_use, &busy);
    for (uint64_t now = 1; now <= 5000; now++) {
        int rc = 0;

        fingerprint(c, before, sizeof(before));
        int kind = random_op(c, &f, &busy, names, now, pinned_model, &rc);

        if (rc == 0) {
            st.ok[kind]++;
        } else {
            st.failed[kind]++;
            fingerprint(c, after, sizeof(after));
            bad_unchanged += strcmp(before, after) != 0;
        }
        bad_invariant += !invariants_hold(c);
        bad_mirror += !mirror_matches(c, &f);
        for (int i = 0; i < R_NAMES; i++) {
            const struct lora_adapter_cache_entry *e = lora_adapter_cache_find(c, names[i]);

            if (pinned_model[i])
                bad_pinned += !e || !e->pinned || e->slot < 0;
            else
                bad_pinned += e && e->pinned;
        }
        if (bad_invariant + bad_mirror + bad_unchanged + bad_pinned > 0) {
            printf("# op %llu kind %d rc %d: %s\n", (unsigned long long)now, kind, rc, before);
            break;
        }
    }
    CHECK(bad_invariant == 0 && bad_mirror == 0 && bad_unchanged == 0 && bad_pinned == 0);
    /* Every operation both succeeded and failed at some point (a snapshot never fails). */
    for (int k = 0; k < 7; k++) {
        if (st.ok[k] < 20 || st.failed[k] < 5)
            printf("# op kind %d: %d ok, %d failed\n", k, st.ok[k], st.failed[k]);
        CHECK(st.ok[k] >= 20 && st.failed[k] >= 5);
    }
    CHECK(st.ok[7] > 0 && st.failed[7] == 0);
    lora_adapter_cache_destroy(&c);
}

/* ---- real adapters and the forward's slots -------------------------------------------------- */

static int forward_set_slot(void *ctx, int slot, const struct lora_adapter *a, char *err,
                            size_t err_len)
{
    return lora_forward_set_slot(ctx, slot, a, err, err_len);
}

static struct lora_adapter *load_adapter(const char *name, const char *model_dir, int rank,
                                         const struct lora_model *m)
{
    struct lora_synthetic_adapter_opts o;
    char err[ERR_BYTES] = "";
    const char *dir = fx_tmp_path("%s", name);

    lora_synthetic_adapter_defaults(&o);
    o.rank = rank;
    o.seed = (uint64_t)rank * 131 + (uint64_t)name[0];
    if (lora_synthetic_adapter_write(dir, model_dir, &o, err, sizeof(err)) != 0) {
        printf("# gen adapter %s: %s\n", name, err);
        return NULL;
    }
    struct lora_adapter *a = lora_adapter_load(dir, m, 64, err, sizeof(err));
    if (!a)
        printf("# load adapter %s: %s\n", name, err);
    return a;
}

static void test_real_adapters(void)
{
    struct lora_synthetic_model_opts mo;
    char err[ERR_BYTES] = "";

    lora_synthetic_model_defaults(&mo);
    const char *model_dir = fx_gen_model("model", &mo);
    struct lora_model *m = lora_model_load(fx_backend(), model_dir, 0, 1, NULL, err, sizeof(err));
    CHECK(m != NULL);
    if (!m) {
        printf("# %s\n", err);
        return;
    }
    const struct lora_model_config *cfg = &m->cfg;
    struct lora_kv_cache *kv = lora_kv_cache_new(fx_backend(), LORA_DTYPE_F32, cfg->n_layers,
                                                 m->n_kv_heads * cfg->head_dim, 16, 8);
    struct lora_forward_limits lim = {.max_tokens = 32,
                                      .max_seqs = 4,
                                      .max_logit_rows = 32,
                                      .max_ctx = 64,
                                      .max_loras = 2,
                                      .max_rank = 8};
    struct lora_forward *fwd = kv ? lora_forward_new(m, kv, &lim, err, sizeof(err)) : NULL;
    CHECK(fwd != NULL);
    struct lora_adapter_cache *c =
        fwd ? lora_adapter_cache_new(2, 3, forward_set_slot, fwd, err, sizeof(err)) : NULL;
    CHECK(c != NULL);
    if (!c)
        goto out;

    static const char *const names[] = {"sql", "chat", "code"};
    for (int i = 0; i < 3; i++) {
        struct lora_adapter *a = load_adapter(names[i], model_dir, 8, m);
        int slot = -1;

        CHECK(a != NULL);
        CHECK(lora_adapter_cache_insert(c, names[i], &a, 0.01, (uint64_t)i + 1, err, sizeof(err)) ==
              0);
        CHECK(lora_adapter_cache_activate_lru(c, names[i], (uint64_t)i + 1, &slot, err,
                                              sizeof(err)) == 0);
        lora_adapter_destroy(&a);
    }
    CHECK(strcmp(slot_name(c, 0), "code") == 0 && strcmp(slot_name(c, 1), "chat") == 0);
    CHECK(lora_adapter_cache_pin(c, "sql", 4, err, sizeof(err)) == 0);
    CHECK(strcmp(slot_name(c, 1), "sql") == 0);

    /* The forward refuses a rank above its max_rank: the cache keeps its state and says why. */
    struct lora_adapter *big = load_adapter("big", model_dir, 16, m);
    CHECK(lora_adapter_cache_remove(c, "chat", err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_insert(c, "big", &big, 0.01, 5, err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_activate_lru(c, "big", 6, NULL, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unable to put adapter 'big' into slot 0: adapter rank 16 exceeds "
                        "max_rank 8");
    CHECK(strcmp(slot_name(c, 0), "code") == 0);

    CHECK(lora_adapter_cache_remove(c, "sql", err, sizeof(err)) == 0);
    CHECK(lora_adapter_cache_slot_adapter(c, 1) == NULL);
    CHECK(invariants_hold(c));
    lora_adapter_destroy(&big);
    lora_adapter_cache_destroy(&c);
out:
    lora_forward_destroy(&fwd);
    lora_kv_cache_destroy(&kv);
    lora_model_destroy(&m);
}

/* A slot holds a copy: the step's logits with an adapter are the same bits after the adapter is
 * destroyed (ASan would also see a read of freed memory), differ from the base model's, and an
 * emptied slot is refused. */
static void test_slots_hold_copies(void)
{
    struct lora_synthetic_model_opts mo;
    char err[ERR_BYTES] = "";

    lora_synthetic_model_defaults(&mo);
    const char *model_dir = fx_gen_model("copies", &mo);
    struct lora_model *m = lora_model_load(fx_backend(), model_dir, 0, 1, NULL, err, sizeof(err));
    CHECK(m != NULL);
    if (!m) {
        printf("# %s\n", err);
        return;
    }
    const struct lora_model_config *cfg = &m->cfg;
    int vocab = cfg->vocab_size;
    struct lora_kv_cache *kv = lora_kv_cache_new(fx_backend(), LORA_DTYPE_F32, cfg->n_layers,
                                                 m->n_kv_heads * cfg->head_dim, 16, 2);
    struct lora_forward_limits lim = {.max_tokens = 8,
                                      .max_seqs = 1,
                                      .max_logit_rows = 8,
                                      .max_ctx = 32,
                                      .max_loras = 2,
                                      .max_rank = 8};
    struct lora_forward *fwd = kv ? lora_forward_new(m, kv, &lim, err, sizeof(err)) : NULL;
    struct lora_adapter *a = load_adapter("copied", model_dir, 8, m);
    float *with = calloc((size_t)vocab, sizeof(float)),
          *base = calloc((size_t)vocab, sizeof(float));
    static const int tokens[] = {1, 2, 3}, table[] = {0};
    struct lora_seq_step st = {tokens, 3, 0, table, 1, false};
    const float *logits;
    int first_row;

    CHECK(fwd != NULL && a != NULL && with && base);
    if (!fwd || !a || !with || !base)
        goto out;
    CHECK(lora_forward_set_slot(fwd, 1, a, err, sizeof(err)) == 0);
    CHECK(lora_forward_step(fwd, &st, 1, &logits, &first_row, err, sizeof(err)) == 0);
    memcpy(with, logits, sizeof(float) * (size_t)vocab);
    st.adapter_slot = -1;
    CHECK(lora_forward_step(fwd, &st, 1, &logits, &first_row, err, sizeof(err)) == 0);
    memcpy(base, logits, sizeof(float) * (size_t)vocab);
    CHECK(memcmp(with, base, sizeof(float) * (size_t)vocab) != 0);

    lora_adapter_destroy(&a);
    st.adapter_slot = 1;
    CHECK(lora_forward_step(fwd, &st, 1, &logits, &first_row, err, sizeof(err)) == 0);
    CHECK(memcmp(with, logits, sizeof(float) * (size_t)vocab) == 0);

    CHECK(lora_forward_set_slot(fwd, 1, NULL, err, sizeof(err)) == 0);
    CHECK(lora_forward_step(fwd, &st, 1, &logits, &first_row, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "adapter slot 1 is empty");
    CHECK(lora_forward_set_slot(fwd, 2, NULL, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "slot 2 is out of range");
out:
    lora_adapter_destroy(&a);
    free(with);
    free(base);
    lora_forward_destroy(&fwd);
    lora_kv_cache_destroy(&kv);
    lora_model_destroy(&m);
}

int main(void)
{
    if (fx_init("/tmp/test_adapter_cache.XXXXXX", &check_cur_failed) < 0)
        return 1;
    RUN(test_design_example);
    RUN(test_remove_frees);
    RUN(test_insert_evicts_lru);
    RUN(test_insert_errors);
    RUN(test_activate_pinned_occupant);
    RUN(test_activate_moves_and_replaces);
    RUN(test_in_use);
    RUN(test_pin_unpin);
    RUN(test_snapshot_order);
    RUN(test_timings_bounded);
    RUN(test_copy_goes_on);
    RUN(test_set_slot_failure);
    RUN(test_random_ops);
    RUN(test_real_adapters);
    RUN(test_slots_hold_copies);
    fx_cleanup();
    return check_done();
}
