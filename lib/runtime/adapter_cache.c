/* adapter_cache: one worker rank's adapters: the CPU cache and the compute slots; see
 * adapter_cache.h.
 *
 * Entries live in a fixed array of max_cpu_loras allocated once (adapter == NULL marks a free
 * one, all other fields zero and slot -1), so an entry pointer stays valid while the entry
 * exists and no operation allocates. slot_entry maps each slot to an entry index. Every
 * operation checks everything that can fail before it changes anything; the only step that can
 * fail midway is the caller's set_slot, which is undone on failure.
 */
#include "base/clock.h"
#include "runtime/adapter_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct timing {
    char name[LORA_ADAPTER_NAME_MAX + 1];
    enum lora_transition transition;
    double seconds;
};

struct lora_adapter_cache {
    int max_loras;
    int max_cpu_loras;
    int n_cached;
    struct lora_adapter_cache_entry *entries; /* (max_cpu_loras) */
    int *slot_entry;                          /* (max_loras): entry index, -1 when free */
    lora_adapter_cache_set_slot_fn set_slot;
    void *set_slot_ctx;
    lora_adapter_cache_in_use_fn in_use;
    void *in_use_ctx;
    struct timing *timings; /* ring of LORA_ADAPTER_CACHE_MAX_TIMINGS, oldest at t_head */
    int t_head;
    int n_timings;
    uint64_t timings_dropped;         /* since creation */
    uint64_t timings_dropped_pending; /* since the last snapshot that took timings */
};

static const char empty_name[] = "";

static void set_err(char *err, size_t err_len, const char *msg)
{
    if (err && err_len)
        snprintf(err, err_len, "%s", msg);
}

static void clear_entry(struct lora_adapter_cache_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->slot = -1;
}

/* Index of the entry called name, or -1. */
static int find_index(const struct lora_adapter_cache *c, const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < c->max_cpu_loras; i++) {
        if (c->entries[i].adapter && strcmp(c->entries[i].name, name) == 0)
            return i;
    }
    return -1;
}

/* Like find_index, with "adapter 'X' is not loaded" in err when there is none. */
static int find_or_err(const struct lora_adapter_cache *c, const char *name, char *err,
                       size_t err_len)
{
    int i = find_index(c, name);

    if (i < 0 && err && err_len)
        snprintf(err, err_len, "adapter '%s' is not loaded", name ? name : "(null)");
    return i;
}

static int check_slot(const struct lora_adapter_cache *c, int slot, char *err, size_t err_len)
{
    if (slot >= 0 && slot < c->max_loras)
        return 0;
    if (err && err_len)
        snprintf(err, err_len, "slot %d is out of range (max_loras %d)", slot, c->max_loras);
    return -1;
}

static void record(struct lora_adapter_cache *c, const char *name, enum lora_transition tr,
                   double seconds)
{
    if (c->n_timings == LORA_ADAPTER_CACHE_MAX_TIMINGS) {
        c->t_head = (c->t_head + 1) % LORA_ADAPTER_CACHE_MAX_TIMINGS;
        c->n_timings--;
        c->timings_dropped++;
        c->timings_dropped_pending++;
    }
    struct timing *t = &c->timings[(c->t_head + c->n_timings) % LORA_ADAPTER_CACHE_MAX_TIMINGS];
    size_t len = strlen(name);

    memcpy(t->name, name, len + 1); /* names are validated to fit on insert */
    t->transition = tr;
    t->seconds = seconds;
    c->n_timings++;
}

/* Calls set_slot and returns what it does; err gets "adapter 'X' into slot N: reason" (or
 * "slot N: ..." for NULL). */
static int call_set_slot(struct lora_adapter_cache *c, int slot,
                         const struct lora_adapter_cache_entry *e, char *err, size_t err_len)
{
    char why[256] = "";

    if (!c->set_slot)
        return 0;
    int rc = c->set_slot(c->set_slot_ctx, slot, e ? e->adapter : NULL, why, sizeof(why));
    if (rc >= 0)
        return rc;
    if (!why[0])
        snprintf(why, sizeof(why), "refused");
    if (err && err_len && e)
        snprintf(err, err_len, "unable to put adapter '%s' into slot %d: %s", e->name, slot, why);
    else if (err && err_len)
        snprintf(err, err_len, "unable to empty slot %d: %s", slot, why);
    return -1;
}

/* Destroys entry i's adapter, frees the entry and returns the destroy's wall time. */
static double drop_entry(struct lora_adapter_cache *c, int i)
{
    double t0 = lora_clock_mono();

    lora_adapter_destroy(&c->entries[i].adapter);
    double seconds = lora_clock_mono() - t0;
    clear_entry(&c->entries[i]);
    c->n_cached--;
    return seconds;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

struct lora_adapter_cache *lora_adapter_cache_new(int max_loras, int max_cpu_loras,
                                                  lora_adapter_cache_set_slot_fn set_slot,
                                                  void *set_slot_ctx, char *err, size_t err_len)
{
    if (max_loras < 1 || max_cpu_loras < max_loras) {
        if (err && err_len)
            snprintf(err, err_len,
                     "bad adapter cache limits: max_loras %d, max_cpu_loras %d (need 1 <= "
                     "max_loras <= max_cpu_loras)",
                     max_loras, max_cpu_loras);
        return NULL;
    }
    struct lora_adapter_cache *c = calloc(1, sizeof(*c));
    if (!c)
        goto oom;
    c->max_loras = max_loras;
    c->max_cpu_loras = max_cpu_loras;
    c->set_slot = set_slot;
    c->set_slot_ctx = set_slot_ctx;
    c->entries = calloc((size_t)max_cpu_loras, sizeof(*c->entries));
    c->slot_entry = malloc(sizeof(*c->slot_entry) * (size_t)max_loras);
    c->timings = calloc(LORA_ADAPTER_CACHE_MAX_TIMINGS, sizeof(*c->timings));
    if (!c->entries || !c->slot_entry || !c->timings)
        goto oom;
    for (int i = 0; i < max_cpu_loras; i++)
        clear_entry(&c->entries[i]);
    for (int s = 0; s < max_loras; s++)
        c->slot_entry[s] = -1;
    return c;
oom:
    lora_adapter_cache_destroy(&c);
    set_err(err, err_len, "adapter cache: out of memory");
    return NULL;
}

void lora_adapter_cache_destroy(struct lora_adapter_cache **cp)
{
    struct lora_adapter_cache *c = cp ? *cp : NULL;

    if (!c)
        return;
    for (int i = 0; c->entries && i < c->max_cpu_loras; i++)
        lora_adapter_destroy(&c->entries[i].adapter);
    free(c->entries);
    free(c->slot_entry);
    free(c->timings);
    free(c);
    *cp = NULL;
}

void lora_adapter_cache_set_in_use(struct lora_adapter_cache *c, lora_adapter_cache_in_use_fn fn,
                                   void *ctx)
{
    c->in_use = fn;
    c->in_use_ctx = ctx;
}

/* ---- operations ----------------------------------------------------------------------------- */

/* The least recently used entry that is neither pinned nor in a slot, or -1. */
static int lru_cpu_only(const struct lora_adapter_cache *c)
{
    int best = -1;

    for (int i = 0; i < c->max_cpu_loras; i++) {
        const struct lora_adapter_cache_entry *e = &c->entries[i];

        if (!e->adapter || e->pinned || e->slot >= 0)
            continue;
        if (best < 0 || e->last_used < c->entries[best].last_used)
            best = i;
    }
    return best;
}

int lora_adapter_cache_insert(struct lora_adapter_cache *c, const char *name,
                              struct lora_adapter **a, double load_seconds, uint64_t now, char *err,
                              size_t err_len)
{
    if (!a || !*a) {
        set_err(err, err_len, "no adapter to insert");
        return -1;
    }
    if (!name || !name[0]) {
        set_err(err, err_len, "adapter name is empty");
        return -1;
    }
    size_t len = strnlen(name, LORA_ADAPTER_NAME_MAX + 1);
    if (len > LORA_ADAPTER_NAME_MAX) {
        if (err && err_len)
            snprintf(err, err_len, "adapter name '%.64s...' is longer than %d bytes", name,
                     LORA_ADAPTER_NAME_MAX);
        return -1;
    }
    if (find_index(c, name) >= 0) {
        if (err && err_len)
            snprintf(err, err_len, "adapter '%s' is already loaded", name);
        return -1;
    }
    if (c->n_cached == c->max_cpu_loras) {
        int victim = lru_cpu_only(c);

        if (victim < 0) {
            if (err && err_len)
                snprintf(err, err_len,
                         "CPU adapter cache is full (%d adapters, all pinned or in slots)",
                         c->n_cached);
            return -1;
        }
        char victim_name[LORA_ADAPTER_NAME_MAX + 1];

        memcpy(victim_name, c->entries[victim].name, sizeof(victim_name));
        double seconds = drop_entry(c, victim);
        record(c, victim_name, LORA_TRANSITION_EVICT, seconds);
    }
    int i = 0;
    while (c->entries[i].adapter)
        i++; /* n_cached < max_cpu_loras, so a free entry exists */
    struct lora_adapter_cache_entry *e = &c->entries[i];

    memcpy(e->name, name, len + 1);
    e->adapter = *a;
    e->pinned = false;
    e->slot = -1;
    e->last_used = now;
    e->load_seconds = load_seconds;
    *a = NULL;
    c->n_cached++;
    record(c, name, LORA_TRANSITION_LOAD, load_seconds);
    return 0;
}

/* activate for entry index i. */
static int activate_index(struct lora_adapter_cache *c, int i, int slot, uint64_t now, char *err,
                          size_t err_len)
{
    struct lora_adapter_cache_entry *e = &c->entries[i];
    int old_slot = e->slot;

    if (old_slot == slot) {
        e->last_used = now;
        return 0;
    }
    int prev = c->slot_entry[slot];
    struct lora_adapter_cache_entry *p = prev >= 0 ? &c->entries[prev] : NULL;

    if (p && p->pinned) {
        if (err && err_len)
            snprintf(err, err_len, "slot %d holds pinned adapter '%s'; unpin it first", slot,
                     p->name);
        return -1;
    }
    double t0 = lora_clock_mono();
    int copying = call_set_slot(c, slot, e, err, err_len);

    if (copying < 0)
        return -1;
    double seconds = lora_clock_mono() - t0;

    if (old_slot >= 0 && call_set_slot(c, old_slot, NULL, err, err_len) < 0) {
        /* Undo: slot gets its previous occupant back; nothing better is possible if that
         * fails too, and the error already says what went wrong. */
        char ignored[8];

        call_set_slot(c, slot, p, ignored, sizeof(ignored));
        return -1;
    }
    if (p) {
        p->slot = -1;
        record(c, p->name, LORA_TRANSITION_EVICT, 0.0);
    }
    if (old_slot >= 0)
        c->slot_entry[old_slot] = -1;
    c->slot_entry[slot] = i;
    e->slot = slot;
    e->last_used = now;
    if (!copying)
        record(c, e->name, LORA_TRANSITION_ACTIVATE, seconds);
    return 0;
}

int lora_adapter_cache_record_activate(struct lora_adapter_cache *c, const char *name,
                                       double seconds, char *err, size_t err_len)
{
    if (find_or_err(c, name, err, err_len) < 0)
        return -1;
    record(c, name, LORA_TRANSITION_ACTIVATE, seconds);
    return 0;
}

int lora_adapter_cache_activate(struct lora_adapter_cache *c, const char *name, int slot,
                                uint64_t now, char *err, size_t err_len)
{
    int i = find_or_err(c, name, err, err_len);

    if (i < 0 || check_slot(c, slot, err, err_len) < 0)
        return -1;
    return activate_index(c, i, slot, now, err, err_len);
}

/* The slot activate_lru would give entry i, or -1 with err. */
static int choose_slot(const struct lora_adapter_cache *c, int i, char *err, size_t err_len)
{
    if (c->entries[i].slot >= 0)
        return c->entries[i].slot;
    for (int s = 0; s < c->max_loras; s++) {
        if (c->slot_entry[s] < 0)
            return s;
    }
    int best = -1;
    for (int s = 0; s < c->max_loras; s++) {
        const struct lora_adapter_cache_entry *o = &c->entries[c->slot_entry[s]];

        if (o->pinned || (c->in_use && c->in_use(c->in_use_ctx, o->name)))
            continue;
        if (best < 0 || o->last_used < c->entries[c->slot_entry[best]].last_used)
            best = s;
    }
    if (best < 0 && err && err_len)
        snprintf(err, err_len,
                 "no slot for adapter '%s': all %d slots hold pinned or in-use "
                 "adapters",
                 c->entries[i].name, c->max_loras);
    return best;
}

int lora_adapter_cache_activate_lru(struct lora_adapter_cache *c, const char *name, uint64_t now,
                                    int *slot, char *err, size_t err_len)
{
    int i = find_or_err(c, name, err, err_len);

    if (i < 0)
        return -1;
    int s = choose_slot(c, i, err, err_len);
    if (s < 0 || activate_index(c, i, s, now, err, err_len) < 0)
        return -1;
    if (slot)
        *slot = s;
    return 0;
}

int lora_adapter_cache_remove(struct lora_adapter_cache *c, const char *name, char *err,
                              size_t err_len)
{
    int i = find_or_err(c, name, err, err_len);

    if (i < 0)
        return -1;
    int slot = c->entries[i].slot;
    if (slot >= 0) {
        if (call_set_slot(c, slot, NULL, err, err_len) < 0)
            return -1;
        c->slot_entry[slot] = -1;
    }
    char removed[LORA_ADAPTER_NAME_MAX + 1];

    memcpy(removed, c->entries[i].name, sizeof(removed));
    double seconds = drop_entry(c, i);
    record(c, removed, LORA_TRANSITION_REMOVE, seconds);
    return 0;
}

int lora_adapter_cache_pin(struct lora_adapter_cache *c, const char *name, uint64_t now, char *err,
                           size_t err_len)
{
    int i = find_or_err(c, name, err, err_len);

    if (i < 0)
        return -1;
    if (c->entries[i].slot < 0) {
        int s = choose_slot(c, i, err, err_len);

        if (s < 0 || activate_index(c, i, s, now, err, err_len) < 0)
            return -1;
    }
    c->entries[i].pinned = true;
    return 0;
}

int lora_adapter_cache_unpin(struct lora_adapter_cache *c, const char *name, char *err,
                             size_t err_len)
{
    int i = find_or_err(c, name, err, err_len);

    if (i < 0)
        return -1;
    c->entries[i].pinned = false;
    return 0;
}

int lora_adapter_cache_touch(struct lora_adapter_cache *c, const char *name, uint64_t now,
                             char *err, size_t err_len)
{
    int i = find_or_err(c, name, err, err_len);

    if (i < 0)
        return -1;
    c->entries[i].last_used = now;
    return 0;
}

/* ---- queries -------------------------------------------------------------------------------- */

const struct lora_adapter_cache_entry *lora_adapter_cache_find(const struct lora_adapter_cache *c,
                                                               const char *name)
{
    int i = find_index(c, name);

    return i >= 0 ? &c->entries[i] : NULL;
}

const struct lora_adapter_cache_entry *
lora_adapter_cache_slot_entry(const struct lora_adapter_cache *c, int slot)
{
    if (slot < 0 || slot >= c->max_loras || c->slot_entry[slot] < 0)
        return NULL;
    return &c->entries[c->slot_entry[slot]];
}

const struct lora_adapter *lora_adapter_cache_slot_adapter(const struct lora_adapter_cache *c,
                                                           int slot)
{
    const struct lora_adapter_cache_entry *e = lora_adapter_cache_slot_entry(c, slot);

    return e ? e->adapter : NULL;
}

int lora_adapter_cache_max_loras(const struct lora_adapter_cache *c)
{
    return c->max_loras;
}

int lora_adapter_cache_max_cpu_loras(const struct lora_adapter_cache *c)
{
    return c->max_cpu_loras;
}

int lora_adapter_cache_n_cached(const struct lora_adapter_cache *c)
{
    return c->n_cached;
}

int lora_adapter_cache_n_timings(const struct lora_adapter_cache *c)
{
    return c->n_timings;
}

uint64_t lora_adapter_cache_timings_dropped(const struct lora_adapter_cache *c)
{
    return c->timings_dropped;
}

/* ---- snapshot ------------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(((const struct lora_str *)a)->s, ((const struct lora_str *)b)->s);
}

/* Grows s's storage to n_strs strings, n_timings timings and name_bytes bytes of names. */
static int snapshot_reserve(struct lora_adapter_cache_snapshot *s, int n_strs, int n_timings,
                            size_t name_bytes)
{
    if (n_strs > s->strs_cap) {
        void *p = realloc(s->strs, sizeof(*s->strs) * (size_t)n_strs);

        if (!p)
            return -1;
        s->strs = p;
        s->strs_cap = n_strs;
    }
    if (n_timings > s->timings_cap) {
        void *p = realloc(s->timings, sizeof(*s->timings) * (size_t)n_timings);

        if (!p)
            return -1;
        s->timings = p;
        s->timings_cap = n_timings;
    }
    if (name_bytes > s->names_cap) {
        void *p = realloc(s->names, name_bytes);

        if (!p)
            return -1;
        s->names = p;
        s->names_cap = name_bytes;
    }
    return 0;
}

/* Copies name into s->names at *off and returns it as a lora_str. */
static struct lora_str put_name(struct lora_adapter_cache_snapshot *s, size_t *off,
                                const char *name)
{
    size_t len = strlen(name);
    char *dst = s->names + *off;

    memcpy(dst, name, len + 1);
    *off += len + 1;
    return (struct lora_str){.s = dst, .len = len};
}

int lora_adapter_cache_snapshot(struct lora_adapter_cache *c, struct lora_adapter_cache_snapshot *s,
                                bool take_timings, char *err, size_t err_len)
{
    int n_pinned = 0;
    int n_timings = take_timings ? c->n_timings : 0;
    size_t bytes = 1;

    memset(&s->state, 0, sizeof(s->state));
    s->n_timings = 0;
    s->timings_dropped = 0;
    for (int i = 0; i < c->max_cpu_loras; i++) {
        const struct lora_adapter_cache_entry *e = &c->entries[i];

        if (!e->adapter)
            continue;
        size_t len = strlen(e->name) + 1;
        bytes += len * (e->slot >= 0 ? 2 : 1) + (e->pinned ? len : 0);
        n_pinned += e->pinned;
    }
    for (int k = 0; k < n_timings; k++) {
        int t = (c->t_head + k) % LORA_ADAPTER_CACHE_MAX_TIMINGS;

        bytes += strlen(c->timings[t].name) + 1;
    }
    if (snapshot_reserve(s, c->max_loras + c->n_cached + n_pinned, n_timings, bytes) < 0) {
        set_err(err, err_len, "adapter cache snapshot: out of memory");
        return -1;
    }
    size_t off = 0;
    struct lora_str *slots = s->strs;
    struct lora_str *cpu = slots + c->max_loras;
    struct lora_str *pinned = cpu + c->n_cached;
    int n_cpu = 0;

    n_pinned = 0;
    for (int sl = 0; sl < c->max_loras; sl++) {
        int i = c->slot_entry[sl];

        slots[sl] = i >= 0 ? put_name(s, &off, c->entries[i].name)
                           : (struct lora_str){.s = empty_name, .len = 0};
    }
    for (int i = 0; i < c->max_cpu_loras; i++) {
        const struct lora_adapter_cache_entry *e = &c->entries[i];

        if (!e->adapter)
            continue;
        cpu[n_cpu++] = put_name(s, &off, e->name);
        if (e->pinned)
            pinned[n_pinned++] = put_name(s, &off, e->name);
    }
    qsort(cpu, (size_t)n_cpu, sizeof(*cpu), cmp_str);
    qsort(pinned, (size_t)n_pinned, sizeof(*pinned), cmp_str);
    s->state = (struct lora_msg_state){
        .n_slots = c->max_loras,
        .slots = slots,
        .n_cpu = n_cpu,
        .cpu = cpu,
        .n_pinned = n_pinned,
        .pinned = pinned,
    };
    if (!take_timings)
        return 0;
    for (int k = 0; k < n_timings; k++) {
        const struct timing *t = &c->timings[(c->t_head + k) % LORA_ADAPTER_CACHE_MAX_TIMINGS];

        s->timings[k] = (struct lora_msg_timing){
            .name = put_name(s, &off, t->name),
            .transition = t->transition,
            .seconds = t->seconds,
        };
    }
    s->n_timings = n_timings;
    s->timings_dropped = c->timings_dropped_pending;
    c->t_head = 0;
    c->n_timings = 0;
    c->timings_dropped_pending = 0;
    return 0;
}

void lora_adapter_cache_snapshot_release(struct lora_adapter_cache_snapshot *s)
{
    if (!s)
        return;
    free(s->strs);
    free(s->timings);
    free(s->names);
    memset(s, 0, sizeof(*s));
}

/* ---- invariants ----------------------------------------------------------------------------- */

#define VIOLATION(...)                                                                             \
    do {                                                                                           \
        if (err && err_len)                                                                        \
            snprintf(err, err_len, __VA_ARGS__);                                                   \
        return -1;                                                                                 \
    } while (0)

static int check_entry(const struct lora_adapter_cache *c, int i, char *err, size_t err_len)
{
    const struct lora_adapter_cache_entry *e = &c->entries[i];

    if (!e->adapter) {
        if (e->slot != -1 || e->pinned || e->name[0])
            VIOLATION("free entry %d is not clear (slot %d, pinned %d)", i, e->slot, e->pinned);
        return 0;
    }
    if (!memchr(e->name, '\0', sizeof(e->name)) || !e->name[0])
        VIOLATION("entry %d has an empty or unterminated name", i);
    for (int j = 0; j < i; j++) {
        if (c->entries[j].adapter && strcmp(c->entries[j].name, e->name) == 0)
            VIOLATION("adapter '%s' is cached twice (entries %d and %d)", e->name, j, i);
    }
    if (e->slot < -1 || e->slot >= c->max_loras)
        VIOLATION("adapter '%s' has slot %d (max_loras %d)", e->name, e->slot, c->max_loras);
    if (e->slot >= 0 && c->slot_entry[e->slot] != i)
        VIOLATION("adapter '%s' says slot %d, which holds entry %d", e->name, e->slot,
                  c->slot_entry[e->slot]);
    if (e->pinned && e->slot < 0)
        VIOLATION("pinned adapter '%s' is not in a slot", e->name);
    return 0;
}

int lora_adapter_cache_check(const struct lora_adapter_cache *c, char *err, size_t err_len)
{
    int n = 0;

    if (c->max_loras < 1 || c->max_cpu_loras < c->max_loras)
        VIOLATION("bad limits: max_loras %d, max_cpu_loras %d", c->max_loras, c->max_cpu_loras);
    for (int i = 0; i < c->max_cpu_loras; i++) {
        if (check_entry(c, i, err, err_len) < 0)
            return -1;
        n += c->entries[i].adapter != NULL;
    }
    if (n != c->n_cached)
        VIOLATION("n_cached is %d, but %d entries are cached", c->n_cached, n);
    for (int s = 0; s < c->max_loras; s++) {
        int i = c->slot_entry[s];

        if (i < -1 || i >= c->max_cpu_loras)
            VIOLATION("slot %d holds entry %d (max_cpu_loras %d)", s, i, c->max_cpu_loras);
        if (i >= 0 && !c->entries[i].adapter)
            VIOLATION("slot %d holds free entry %d", s, i);
        if (i >= 0 && c->entries[i].slot != s)
            VIOLATION("slot %d holds adapter '%s', which says slot %d", s, c->entries[i].name,
                      c->entries[i].slot);
    }
    if (c->n_timings < 0 || c->n_timings > LORA_ADAPTER_CACHE_MAX_TIMINGS)
        VIOLATION("%d timings pending (at most %d)", c->n_timings, LORA_ADAPTER_CACHE_MAX_TIMINGS);
    return 0;
}
