/* scheduler: continuous batching with adapter slots; the policy is in scheduler.h.
 *
 * Layout: requests live in a fixed pool (index = request slot), found by id through an
 * open-addressing index (linear probing, backward-shift deletion). A request is on exactly one of
 * two intrusive doubly linked lists, the waiting queue or the running set (admission order, the
 * newest at the tail, which is where preemption takes its victims). Each request slot owns a
 * fixed row of block-table storage, so plans can point into it. Adapters are a small fixed
 * table; requests refer to their adapter by its index there, which stays valid because an entry
 * is only dropped once no request uses it. Per-adapter running/waiting counts are kept up to date
 * at every list move, so a plan reports them in O(adapters).
 */
#include "sched/scheduler.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/block_manager.h"
#include "base/errbuf.h"

/* Capacities above these are configuration mistakes, and keep every count in an int. */
#define MAX_REQUESTS_LIMIT (1 << 22)
#define MAX_ADAPTERS_LIMIT (1 << 16)
#define MAX_LORAS_LIMIT    1024

struct request {
    uint64_t id;
    bool used;
    bool ever_scheduled;
    enum lora_scheduler_state state;
    int ad; /* adapter entry index, -1: base model */
    int n_prompt;
    int max_tokens;
    int n_generated;
    int n_computed;  /* positions in the KV cache */
    int n_scheduled; /* tokens of the plan in flight, 0 when none */
    int n_preemptions;
    uint64_t slot_wait_since; /* step of the first skip for want of a slot in the current
                                 streak, 0: none (see the starvation bound in scheduler.h) */
    double arrival_s;
    int prev, next; /* links on its list, -1 at the ends */
    struct lora_block_table table;
};

struct list {
    int head, tail, n;
};

struct adapter {
    int id; /* 0: entry unused */
    bool ready;
    bool arriving; /* in its slot, the copy still going on (async_activation) */
    bool pinned;
    bool removing;
    int slot; /* -1: none */
    uint64_t last_used_step;
    uint64_t mark_step; /* last step counted in a plan's distinct adapters */
    int n_running;
    int n_waiting;
};

struct lora_scheduler {
    struct lora_scheduler_config cfg;
    struct lora_block_manager *bm;
    int max_table_blocks; /* blocks one request can hold */

    struct request *reqs; /* (max_requests) */
    int *table_ids;       /* (max_requests, max_table_blocks) block-table storage */
    int *free_reqs;       /* (max_requests) stack of unused request slots */
    int n_free_reqs;
    int *index; /* (index_mask + 1) request slot or -1, keyed by id */
    size_t index_mask;

    struct list waiting, running;
    int n_base_running, n_base_waiting;
    int n_inflight; /* requests with n_scheduled > 0 */
    uint64_t step;

    struct adapter *adapters; /* (max_adapters) */
    int *slot_ad;             /* (max_loras) adapter entry index in each slot, -1: empty */

    /* Scratch for lora_scheduler_check(), allocated once. */
    const struct lora_block_table **chk_tables; /* (max_requests) */
    int *chk_counts;                            /* (2 * max_adapters) */
};

static int fail(int e, char *err, size_t err_len, const char *msg)
{
    lora_errf(err, err_len, "%s", msg);
    errno = e;
    return -1;
}

/* ---- configuration, creation ---- */

void lora_scheduler_config_default(struct lora_scheduler_config *c)
{
    c->max_num_seqs = 256;
    c->max_num_batched_tokens = 2048;
    c->max_loras = 4;
    c->block_size = 16;
    c->n_blocks = 1024;
    c->max_model_len = 4096;
    c->max_requests = 1024;
    c->max_adapters = 64;
    c->starvation_steps = 8;
    c->async_activation = false;
}

static const char *config_problem(const struct lora_scheduler_config *c)
{
    if (c->max_num_seqs < 1)
        return "max_num_seqs must be at least 1";
    if (c->max_num_batched_tokens < c->max_num_seqs)
        return "max_num_batched_tokens must be at least max_num_seqs";
    if (c->max_loras < 0 || c->max_loras > MAX_LORAS_LIMIT)
        return "max_loras must be in 0..1024";
    if (c->block_size < 1)
        return "block_size must be at least 1";
    if (c->n_blocks < 1)
        return "n_blocks must be at least 1";
    if (c->max_model_len < 2)
        return "max_model_len must be at least 2";
    if (c->max_requests < c->max_num_seqs || c->max_requests > MAX_REQUESTS_LIMIT)
        return "max_requests must be in max_num_seqs..4194304";
    if (c->max_adapters < 0 || c->max_adapters > MAX_ADAPTERS_LIMIT)
        return "max_adapters must be in 0..65536";
    if (c->starvation_steps < 0)
        return "starvation_steps must not be negative";
    return NULL;
}

struct lora_scheduler *lora_scheduler_new(const struct lora_scheduler_config *c, char *err,
                                          size_t err_len)
{
    const char *problem = config_problem(c);

    if (problem) {
        lora_errf(err, err_len, "scheduler: bad config: %s", problem);
        errno = EINVAL;
        return NULL;
    }
    struct lora_scheduler *s = calloc(1, sizeof(*s));
    if (!s)
        goto out_nomem;
    s->cfg = *c;
    s->bm = lora_block_manager_new(c->n_blocks, c->block_size);
    if (!s->bm)
        goto out_nomem;
    s->max_table_blocks = lora_block_manager_blocks_for(s->bm, c->max_model_len);
    if (s->max_table_blocks > c->n_blocks)
        s->max_table_blocks = c->n_blocks;

    size_t n_req = (size_t)c->max_requests, n_index = 2;
    while (n_index < 2 * n_req)
        n_index *= 2;
    s->index_mask = n_index - 1;
    s->reqs = calloc(n_req, sizeof(*s->reqs));
    s->table_ids = malloc(n_req * (size_t)s->max_table_blocks * sizeof(*s->table_ids));
    s->free_reqs = malloc(n_req * sizeof(*s->free_reqs));
    s->index = malloc(n_index * sizeof(*s->index));
    s->adapters = calloc((size_t)c->max_adapters + 1, sizeof(*s->adapters));
    s->slot_ad = malloc(((size_t)c->max_loras + 1) * sizeof(*s->slot_ad));
    s->chk_tables = malloc(n_req * sizeof(*s->chk_tables));
    s->chk_counts = malloc((2 * (size_t)c->max_adapters + 1) * sizeof(*s->chk_counts));
    if (!s->reqs || !s->table_ids || !s->free_reqs || !s->index || !s->adapters || !s->slot_ad ||
        !s->chk_tables || !s->chk_counts)
        goto out_nomem;

    for (size_t i = 0; i < n_index; i++)
        s->index[i] = -1;
    /* Lowest request slot on top of the stack. */
    for (int i = 0; i < c->max_requests; i++)
        s->free_reqs[i] = c->max_requests - 1 - i;
    s->n_free_reqs = c->max_requests;
    for (int i = 0; i < c->max_adapters; i++)
        s->adapters[i].slot = -1;
    for (int k = 0; k < c->max_loras; k++)
        s->slot_ad[k] = -1;
    s->waiting = (struct list){-1, -1, 0};
    s->running = (struct list){-1, -1, 0};
    return s;

out_nomem:
    lora_scheduler_destroy(&s);
    lora_errf(err, err_len, "scheduler: out of memory");
    errno = ENOMEM;
    return NULL;
}

void lora_scheduler_destroy(struct lora_scheduler **sp)
{
    struct lora_scheduler *s = sp ? *sp : NULL;

    if (!s)
        return;
    lora_block_manager_destroy(&s->bm);
    free(s->reqs);
    free(s->table_ids);
    free(s->free_reqs);
    free(s->index);
    free(s->adapters);
    free(s->slot_ad);
    free(s->chk_tables);
    free(s->chk_counts);
    free(s);
    *sp = NULL;
}

const struct lora_scheduler_config *lora_scheduler_config(const struct lora_scheduler *s)
{
    return &s->cfg;
}

int lora_scheduler_plan_init(const struct lora_scheduler *s, struct lora_scheduler_plan *p)
{
    const struct lora_scheduler_config *c = &s->cfg;

    memset(p, 0, sizeof(*p));
    /* + 1: calloc(0) may return NULL, which must not read as out of memory. */
    p->seqs = calloc((size_t)c->max_num_seqs + 1, sizeof(*p->seqs));
    p->activations = calloc((size_t)c->max_loras + 1, sizeof(*p->activations));
    p->unloaded = calloc((size_t)c->max_loras + 1, sizeof(*p->unloaded));
    p->preempted = calloc((size_t)c->max_num_seqs + 1, sizeof(*p->preempted));
    p->events = calloc(2 * (size_t)c->max_num_seqs + 1, sizeof(*p->events));
    p->adapters = calloc((size_t)c->max_adapters + 1, sizeof(*p->adapters));
    if (!p->seqs || !p->activations || !p->unloaded || !p->preempted || !p->events ||
        !p->adapters) {
        lora_scheduler_plan_release(p);
        errno = ENOMEM;
        return -1;
    }
    p->cap_seqs = c->max_num_seqs;
    p->cap_loras = c->max_loras;
    p->cap_adapters = c->max_adapters;
    return 0;
}

void lora_scheduler_plan_release(struct lora_scheduler_plan *p)
{
    free(p->seqs);
    free(p->activations);
    free(p->unloaded);
    free(p->preempted);
    free(p->events);
    free(p->adapters);
    memset(p, 0, sizeof(*p));
}

/* ---- id index ---- */

static size_t id_home(const struct lora_scheduler *s, uint64_t id)
{
    /* splitmix64's finaliser: sequential ids spread over the table. */
    id ^= id >> 30;
    id *= 0xbf58476d1ce4e5b9ULL;
    id ^= id >> 27;
    id *= 0x94d049bb133111ebULL;
    id ^= id >> 31;
    return (size_t)id & s->index_mask;
}

/* Position of id in the index, or of the empty cell where it would go. */
static size_t index_find(const struct lora_scheduler *s, uint64_t id)
{
    size_t i = id_home(s, id);

    while (s->index[i] >= 0 && s->reqs[s->index[i]].id != id)
        i = (i + 1) & s->index_mask;
    return i;
}

static struct request *lookup(const struct lora_scheduler *s, uint64_t id)
{
    int r = s->index[index_find(s, id)];

    return r >= 0 ? &s->reqs[r] : NULL;
}

static void index_remove(struct lora_scheduler *s, uint64_t id)
{
    size_t hole = index_find(s, id), j = hole;

    /* Backward shift: move later entries of the probe run into the hole when their home
     * position does not lie cyclically in (hole, j]. */
    for (;;) {
        j = (j + 1) & s->index_mask;
        if (s->index[j] < 0)
            break;
        size_t home = id_home(s, s->reqs[s->index[j]].id);
        size_t d_home = (j - home) & s->index_mask, d_hole = (j - hole) & s->index_mask;
        if (d_home >= d_hole) {
            s->index[hole] = s->index[j];
            hole = j;
        }
    }
    s->index[hole] = -1;
}

/* ---- lists and counts ---- */

static int req_index(const struct lora_scheduler *s, const struct request *r)
{
    return (int)(r - s->reqs);
}

static void list_push_back(struct lora_scheduler *s, struct list *l, struct request *r)
{
    int i = req_index(s, r);

    r->prev = l->tail;
    r->next = -1;
    if (l->tail >= 0)
        s->reqs[l->tail].next = i;
    else
        l->head = i;
    l->tail = i;
    l->n++;
}

static void list_push_front(struct lora_scheduler *s, struct list *l, struct request *r)
{
    int i = req_index(s, r);

    r->prev = -1;
    r->next = l->head;
    if (l->head >= 0)
        s->reqs[l->head].prev = i;
    else
        l->tail = i;
    l->head = i;
    l->n++;
}

static void list_remove(struct lora_scheduler *s, struct list *l, struct request *r)
{
    if (r->prev >= 0)
        s->reqs[r->prev].next = r->next;
    else
        l->head = r->next;
    if (r->next >= 0)
        s->reqs[r->next].prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = -1;
    l->n--;
}

/* The counter of r's adapter (or the base model) for the waiting or the running state. */
static int *state_count(struct lora_scheduler *s, const struct request *r,
                        enum lora_scheduler_state st)
{
    if (r->ad < 0)
        return st == LORA_SCHEDULER_RUNNING ? &s->n_base_running : &s->n_base_waiting;
    struct adapter *a = &s->adapters[r->ad];
    return st == LORA_SCHEDULER_RUNNING ? &a->n_running : &a->n_waiting;
}

static void enter(struct lora_scheduler *s, struct request *r, enum lora_scheduler_state st,
                  bool front)
{
    struct list *l = st == LORA_SCHEDULER_RUNNING ? &s->running : &s->waiting;

    r->state = st;
    if (front)
        list_push_front(s, l, r);
    else
        list_push_back(s, l, r);
    (*state_count(s, r, st))++;
}

static void leave(struct lora_scheduler *s, struct request *r)
{
    list_remove(s, r->state == LORA_SCHEDULER_RUNNING ? &s->running : &s->waiting, r);
    (*state_count(s, r, r->state))--;
    if (r->n_scheduled > 0) {
        r->n_scheduled = 0;
        s->n_inflight--;
    }
}

/* Takes r out of the scheduler entirely: list, blocks, index, pool. */
static void drop_request(struct lora_scheduler *s, struct request *r)
{
    leave(s, r);
    lora_block_manager_free_table(s->bm, &r->table);
    index_remove(s, r->id);
    r->used = false;
    s->free_reqs[s->n_free_reqs++] = req_index(s, r);
}

/* Tokens the request consists of now: the prompt and what it generated. */
static int seq_len(const struct request *r)
{
    return r->n_prompt + r->n_generated;
}

/* ---- adapters ---- */

static int find_adapter(const struct lora_scheduler *s, int id)
{
    for (int i = 0; i < s->cfg.max_adapters; i++)
        if (s->adapters[i].id == id)
            return i;
    return -1;
}

/* The entry of registered adapter id, or NULL with errno ENOENT. */
static struct adapter *known_adapter(const struct lora_scheduler *s, int id)
{
    int ad = id > 0 ? find_adapter(s, id) : -1;

    if (ad < 0)
        errno = ENOENT;
    return ad < 0 ? NULL : &s->adapters[ad];
}

static bool is_evictable(const struct adapter *a)
{
    return !a->pinned && !a->removing && !a->arriving && a->n_running == 0;
}

/* A slot for a new adapter: the lowest free one, else the one of the least recently used
 * evictable adapter (ties: lowest slot). -1 when none. */
static int find_slot(const struct lora_scheduler *s)
{
    int best = -1;

    for (int k = 0; k < s->cfg.max_loras; k++) {
        if (s->slot_ad[k] < 0)
            return k;
        const struct adapter *a = &s->adapters[s->slot_ad[k]];
        if (!is_evictable(a))
            continue;
        if (best < 0 || a->last_used_step < s->adapters[s->slot_ad[best]].last_used_step)
            best = k;
    }
    return best;
}

static bool all_slots_pinned(const struct lora_scheduler *s)
{
    for (int k = 0; k < s->cfg.max_loras; k++)
        if (s->slot_ad[k] < 0 || !s->adapters[s->slot_ad[k]].pinned)
            return false;
    return true;
}

static void clear_slot(struct lora_scheduler *s, int slot)
{
    if (s->slot_ad[slot] >= 0)
        s->adapters[s->slot_ad[slot]].slot = -1;
    s->slot_ad[slot] = -1;
}

/* Puts adapter entry ad into slot, evicting its holder, and describes that in act. */
static void activate(struct lora_scheduler *s, int ad, int slot,
                     struct lora_scheduler_activation *act)
{
    int old = s->slot_ad[slot];

    act->adapter_id = s->adapters[ad].id;
    act->slot = slot;
    act->evicted_id = old >= 0 ? s->adapters[old].id : 0;
    clear_slot(s, slot);
    s->slot_ad[slot] = ad;
    s->adapters[ad].slot = slot;
    s->adapters[ad].last_used_step = s->step;
}

static void drop_adapter(struct lora_scheduler *s, int ad)
{
    if (s->adapters[ad].slot >= 0)
        clear_slot(s, s->adapters[ad].slot);
    memset(&s->adapters[ad], 0, sizeof(s->adapters[ad]));
    s->adapters[ad].slot = -1;
}

/* Finds or registers adapter id for loading/ready; -1 with errno. */
static int register_adapter(struct lora_scheduler *s, int id)
{
    if (id <= 0) {
        errno = EINVAL;
        return -1;
    }
    int ad = find_adapter(s, id);
    if (ad >= 0) {
        if (s->adapters[ad].removing) {
            errno = EBUSY;
            return -1;
        }
        return ad;
    }
    ad = find_adapter(s, 0);
    if (ad < 0) {
        errno = ENOSPC;
        return -1;
    }
    memset(&s->adapters[ad], 0, sizeof(s->adapters[ad]));
    s->adapters[ad].id = id;
    s->adapters[ad].slot = -1;
    return ad;
}

int lora_scheduler_adapter_loading(struct lora_scheduler *s, int id)
{
    int ad = register_adapter(s, id);

    if (ad < 0)
        return -1;
    s->adapters[ad].ready = false;
    return 0;
}

int lora_scheduler_adapter_ready(struct lora_scheduler *s, int id)
{
    int ad = register_adapter(s, id);

    if (ad < 0)
        return -1;
    s->adapters[ad].ready = true;
    return 0;
}

int lora_scheduler_adapter_remove(struct lora_scheduler *s, int id, uint64_t *failed, int cap,
                                  bool *in_use, char *err, size_t err_len)
{
    int ad = id > 0 ? find_adapter(s, id) : -1;

    if (ad < 0 || s->adapters[ad].removing) {
        lora_errf(err, err_len, "adapter %d is not registered", id);
        errno = ENOENT;
        return -1;
    }
    struct adapter *a = &s->adapters[ad];
    if (a->n_waiting > cap) {
        lora_errf(err, err_len, "adapter %d: %d waiting requests do not fit in %d", id,
                  a->n_waiting, cap);
        errno = ENOSPC;
        return -1;
    }
    int n = 0;
    for (int i = s->waiting.head; i >= 0;) {
        struct request *r = &s->reqs[i];

        i = r->next;
        if (r->ad != ad)
            continue;
        failed[n++] = r->id;
        drop_request(s, r);
    }
    lora_errf(err, err_len, "adapter %d was removed while the request waited", id);
    a->pinned = false;
    if (a->n_running > 0) {
        a->removing = true;
        *in_use = true;
    } else {
        drop_adapter(s, ad);
        *in_use = false;
    }
    return n;
}

int lora_scheduler_adapter_pin(struct lora_scheduler *s, int id,
                               struct lora_scheduler_activation *act)
{
    int ad = id > 0 ? find_adapter(s, id) : -1;

    if (ad < 0 || s->adapters[ad].removing) {
        errno = ENOENT;
        return -1;
    }
    struct adapter *a = &s->adapters[ad];
    if (a->slot >= 0) {
        a->pinned = true;
        *act = (struct lora_scheduler_activation){id, -1, 0};
        return 0;
    }
    if (!a->ready) {
        errno = EAGAIN;
        return -1;
    }
    int slot = find_slot(s);
    if (slot < 0) {
        errno = EBUSY;
        return -1;
    }
    activate(s, ad, slot, act);
    a->pinned = true;
    return 0;
}

int lora_scheduler_adapter_arrived(struct lora_scheduler *s, int id)
{
    struct adapter *a = known_adapter(s, id);

    if (a)
        a->arriving = false;
    return a ? 0 : -1;
}

int lora_scheduler_adapter_unpin(struct lora_scheduler *s, int id)
{
    struct adapter *a = known_adapter(s, id);

    if (a)
        a->pinned = false;
    return a ? 0 : -1;
}

int lora_scheduler_slot_adapter(const struct lora_scheduler *s, int slot)
{
    if (slot < 0 || slot >= s->cfg.max_loras || s->slot_ad[slot] < 0)
        return 0;
    return s->adapters[s->slot_ad[slot]].id;
}

/* ---- requests ---- */

int lora_scheduler_add(struct lora_scheduler *s, const struct lora_scheduler_request *q, char *err,
                       size_t err_len)
{
    const struct lora_scheduler_config *c = &s->cfg;
    long long total = (long long)q->n_prompt_tokens + q->max_tokens;
    int ad = -1;

    if (q->n_prompt_tokens < 1 || q->max_tokens < 1 || q->adapter_id < 0) {
        lora_errf(err, err_len, "request %llu: bad prompt length %d or max_tokens %d",
                  (unsigned long long)q->id, q->n_prompt_tokens, q->max_tokens);
        errno = EINVAL;
        return -1;
    }
    if (total > c->max_model_len) {
        lora_errf(err, err_len,
                  "request %llu: prompt (%d tokens) + max_tokens (%d) exceeds max_model_len %d",
                  (unsigned long long)q->id, q->n_prompt_tokens, q->max_tokens, c->max_model_len);
        errno = E2BIG;
        return -1;
    }
    if (lora_block_manager_blocks_for(s->bm, (int)total) > c->n_blocks) {
        lora_errf(err, err_len, "request %llu: %lld tokens need more than the %d KV blocks",
                  (unsigned long long)q->id, total, c->n_blocks);
        errno = E2BIG;
        return -1;
    }
    if (q->adapter_id > 0) {
        ad = find_adapter(s, q->adapter_id);
        if (ad < 0 || s->adapters[ad].removing) {
            lora_errf(err, err_len, "request %llu: adapter %d is not registered",
                      (unsigned long long)q->id, q->adapter_id);
            errno = ENOENT;
            return -1;
        }
        if (c->max_loras == 0)
            return fail(EINVAL, err, err_len, "adapters are disabled (max_loras is 0)");
    }
    if (lookup(s, q->id)) {
        lora_errf(err, err_len, "request %llu: id already in use", (unsigned long long)q->id);
        errno = EEXIST;
        return -1;
    }
    if (s->n_free_reqs == 0) {
        lora_errf(err, err_len, "request %llu: %d requests already in the scheduler",
                  (unsigned long long)q->id, c->max_requests);
        errno = ENOSPC;
        return -1;
    }

    int i = s->free_reqs[--s->n_free_reqs];
    struct request *r = &s->reqs[i];
    memset(r, 0, sizeof(*r));
    r->id = q->id;
    r->used = true;
    r->ad = ad;
    r->n_prompt = q->n_prompt_tokens;
    r->max_tokens = q->max_tokens;
    r->arrival_s = q->arrival_s;
    lora_block_table_init(&r->table, s->table_ids + (size_t)i * s->max_table_blocks,
                          s->max_table_blocks);
    s->index[index_find(s, q->id)] = i;
    enter(s, r, LORA_SCHEDULER_WAITING, false);
    return 0;
}

int lora_scheduler_abort(struct lora_scheduler *s, uint64_t id)
{
    struct request *r = lookup(s, id);

    if (!r) {
        errno = ENOENT;
        return -1;
    }
    drop_request(s, r);
    return 0;
}

/* ---- schedule ---- */

static void plan_event(const struct lora_scheduler *s, struct lora_scheduler_plan *p,
                       const struct request *r, enum lora_scheduler_event_kind kind,
                       double queued_s)
{
    /* At most max_num_seqs admissions, or max_num_seqs preemptions (never both in one step). */
    assert(p->n_events < 2 * s->cfg.max_num_seqs);
    p->events[p->n_events++] = (struct lora_scheduler_event){r->id, kind, queued_s};
}

/* Appends r to the step with n tokens; its blocks already cover them. */
static void plan_seq(struct lora_scheduler *s, struct lora_scheduler_plan *p, struct request *r,
                     int n)
{
    assert(p->n_seqs < s->cfg.max_num_seqs); /* the running set is bounded by it */
    struct lora_scheduler_seq *q = &p->seqs[p->n_seqs++];

    q->request_id = r->id;
    q->n_tokens = n;
    q->pos = r->n_computed;
    q->block_table = r->table.ids;
    q->n_table_blocks = r->table.n;
    q->adapter_id = r->ad >= 0 ? s->adapters[r->ad].id : 0;
    q->adapter_slot = r->ad >= 0 ? s->adapters[r->ad].slot : -1;
    q->samples = r->n_computed + n == seq_len(r);
    r->n_scheduled = n;
    s->n_inflight++;
    p->n_step_tokens += n;
}

/* Recomputation preemption: r goes back to the front of the queue with nothing computed. */
static void preempt(struct lora_scheduler *s, struct lora_scheduler_plan *p, struct request *r)
{
    leave(s, r);
    lora_block_manager_free_table(s->bm, &r->table);
    r->n_computed = 0;
    r->n_preemptions++;
    r->slot_wait_since = 0;
    enter(s, r, LORA_SCHEDULER_WAITING, true);
    assert(p->n_preempted < s->cfg.max_num_seqs);
    p->preempted[p->n_preempted++] = r->id;
    plan_event(s, p, r, LORA_SCHEDULER_EV_PREEMPTED, 0.0);
}

/* Removed adapters nobody uses any more give their slots back. */
static void release_removed(struct lora_scheduler *s, struct lora_scheduler_plan *p)
{
    for (int i = 0; i < s->cfg.max_adapters; i++) {
        struct adapter *a = &s->adapters[i];

        if (a->id == 0 || !a->removing || a->n_running > 0 || a->n_waiting > 0)
            continue;
        if (p->n_unloaded < s->cfg.max_loras)
            p->unloaded[p->n_unloaded++] = a->id;
        drop_adapter(s, i);
    }
}

static void schedule_running(struct lora_scheduler *s, struct lora_scheduler_plan *p, int *budget)
{
    int i = s->running.head;

    while (i >= 0 && *budget > 0) {
        struct request *r = &s->reqs[i];
        int need = seq_len(r) - r->n_computed;
        int n = need < *budget ? need : *budget;
        bool preempted_self = false;

        while (lora_block_manager_ensure(s->bm, &r->table, r->n_computed + n) != 0) {
            struct request *victim = &s->reqs[s->running.tail];

            preempted_self = victim == r;
            preempt(s, p, victim);
            if (preempted_self)
                break;
        }
        if (preempted_self)
            break; /* r was the newest: nothing after it */
        plan_seq(s, p, r, n);
        *budget -= n;
        i = r->next; /* read after preemptions: they may have taken r's successor */
    }
}

enum admit {
    ADMITTED,
    SKIP_LOADING, /* adapter weights not ready, or not yet copied into their slot */
    SKIP_PINNED,  /* every slot pinned: only an unpin helps */
    SKIP_NO_SLOT, /* slots busy with running requests: finishing ones free them */
    STOP_BLOCKS,  /* KV blocks exhausted */
};

static enum admit try_admit(struct lora_scheduler *s, struct lora_scheduler_plan *p,
                            struct request *r, int *budget, double now)
{
    int slot = -1;
    struct adapter *a = r->ad >= 0 ? &s->adapters[r->ad] : NULL;

    if (a && a->arriving)
        return SKIP_LOADING;
    if (a && a->slot < 0) {
        if (!a->ready)
            return SKIP_LOADING;
        slot = find_slot(s);
        if (slot < 0)
            return all_slots_pinned(s) ? SKIP_PINNED : SKIP_NO_SLOT;
        if (s->cfg.async_activation) {
            /* The copy runs alongside this step; r waits for it. An arriving adapter is not
             * evictable, so each activation takes a slot of its own: at most max_loras. */
            assert(p->n_activations < s->cfg.max_loras);
            activate(s, r->ad, slot, &p->activations[p->n_activations++]);
            a->arriving = true;
            return SKIP_LOADING;
        }
    }
    int need = seq_len(r) - r->n_computed;
    int n = need < *budget ? need : *budget;
    if (lora_block_manager_ensure(s->bm, &r->table, r->n_computed + n) != 0)
        return STOP_BLOCKS;
    if (slot >= 0) {
        /* Each activation's adapter gains a running request, so its slot cannot be taken
         * again this step: at most max_loras activations. */
        assert(p->n_activations < s->cfg.max_loras);
        activate(s, r->ad, slot, &p->activations[p->n_activations++]);
    }
    leave(s, r);
    enter(s, r, LORA_SCHEDULER_RUNNING, false);
    r->slot_wait_since = 0;
    if (r->ever_scheduled)
        plan_event(s, p, r, LORA_SCHEDULER_EV_RESUMED, 0.0);
    else
        plan_event(s, p, r, LORA_SCHEDULER_EV_SCHEDULED, now - r->arrival_s);
    r->ever_scheduled = true;
    plan_seq(s, p, r, n);
    *budget -= n;
    return ADMITTED;
}

static void schedule_waiting(struct lora_scheduler *s, struct lora_scheduler_plan *p, int *budget,
                             double now)
{
    int i = s->waiting.head;

    while (i >= 0 && *budget > 0 && s->running.n < s->cfg.max_num_seqs) {
        struct request *r = &s->reqs[i];
        enum admit v;

        i = r->next;
        v = try_admit(s, p, r, budget, now);
        if (v == STOP_BLOCKS)
            break;
        if (v == SKIP_LOADING || v == SKIP_PINNED) {
            r->slot_wait_since = 0; /* waiting cannot help: no barrier */
        } else if (v == SKIP_NO_SLOT) {
            if (!r->slot_wait_since)
                r->slot_wait_since = s->step;
            if (s->step - r->slot_wait_since >= (uint64_t)s->cfg.starvation_steps)
                break; /* a barrier: nobody queued after it goes first */
        }
    }
}

/* Stats, per-adapter counts, LRU stamps and distinct adapters of the step. */
static void finish_plan(struct lora_scheduler *s, struct lora_scheduler_plan *p)
{
    for (int i = 0; i < p->n_seqs; i++) {
        struct request *r = lookup(s, p->seqs[i].request_id);

        if (r->ad < 0)
            continue;
        struct adapter *a = &s->adapters[r->ad];
        a->last_used_step = s->step;
        if (a->mark_step != s->step) {
            a->mark_step = s->step;
            p->n_step_adapters++;
        }
    }
    for (int i = 0; i < s->cfg.max_adapters; i++) {
        const struct adapter *a = &s->adapters[i];

        if (a->id != 0)
            p->adapters[p->n_adapters++] =
                (struct lora_scheduler_adapter_count){a->id, a->n_running, a->n_waiting};
    }
    p->n_running = s->running.n;
    p->n_waiting = s->waiting.n;
    p->n_base_running = s->n_base_running;
    p->n_base_waiting = s->n_base_waiting;
    p->n_free_blocks = lora_block_manager_n_free(s->bm);
    p->kv_usage = (double)(s->cfg.n_blocks - p->n_free_blocks) / s->cfg.n_blocks;
}

int lora_scheduler_schedule(struct lora_scheduler *s, double now, struct lora_scheduler_plan *p)
{
    int budget = s->cfg.max_num_batched_tokens;

    if (p->cap_seqs < s->cfg.max_num_seqs || p->cap_loras < s->cfg.max_loras ||
        p->cap_adapters < s->cfg.max_adapters) {
        errno = EINVAL; /* not sized by lora_scheduler_plan_init() for this scheduler */
        return -1;
    }
    if (s->n_inflight > 0) {
        errno = EBUSY;
        return -1;
    }
    s->step++;
    p->step = s->step;
    p->now = now;
    p->n_seqs = p->n_activations = p->n_unloaded = p->n_preempted = p->n_events = 0;
    p->n_adapters = p->n_step_tokens = p->n_step_adapters = 0;

    release_removed(s, p);
    schedule_running(s, p, &budget);
    /* Preemption means memory is short: admitting now would only preempt again (vLLM V1). */
    if (p->n_preempted == 0)
        schedule_waiting(s, p, &budget, now);
    finish_plan(s, p);
    return 0;
}

/* ---- update ---- */

/* r if it is still the request that p's sequence q was planned for (not aborted since). */
static struct request *live_request(const struct lora_scheduler *s,
                                    const struct lora_scheduler_seq *q)
{
    struct request *r = lookup(s, q->request_id);

    if (!r || r->state != LORA_SCHEDULER_RUNNING || r->n_scheduled != q->n_tokens ||
        r->n_computed != q->pos)
        return NULL;
    return r;
}

int lora_scheduler_update(struct lora_scheduler *s, const struct lora_scheduler_plan *p,
                          const struct lora_scheduler_result *res, char *err, size_t err_len)
{
    for (int i = 0; i < p->n_seqs; i++) {
        const struct request *r = live_request(s, &p->seqs[i]);

        if (!r)
            continue;
        bool complete = r->n_computed + r->n_scheduled == seq_len(r);
        if (res[i].produced && !complete) {
            lora_errf(err, err_len, "request %llu: token reported before its prefill completed",
                      (unsigned long long)r->id);
            errno = EINVAL;
            return -1;
        }
        if (complete && !res[i].produced && !res[i].finished) {
            lora_errf(err, err_len, "request %llu: completed sequence produced no token",
                      (unsigned long long)r->id);
            errno = EINVAL;
            return -1;
        }
    }
    for (int i = 0; i < p->n_seqs; i++) {
        struct request *r = live_request(s, &p->seqs[i]);

        if (!r)
            continue;
        r->n_computed += r->n_scheduled;
        r->n_scheduled = 0;
        s->n_inflight--;
        if (res[i].produced)
            r->n_generated++;
        if (res[i].finished || r->n_generated >= r->max_tokens)
            drop_request(s, r);
    }
    return 0;
}

/* ---- queries ---- */

int lora_scheduler_adapter_info(const struct lora_scheduler *s, int id,
                                struct lora_scheduler_adapter_info *info)
{
    const struct adapter *a = known_adapter(s, id);

    if (!a)
        return -1;
    *info = (struct lora_scheduler_adapter_info){
        .ready = a->ready,
        .arriving = a->arriving,
        .pinned = a->pinned,
        .removing = a->removing,
        .slot = a->slot,
        .last_used_step = a->last_used_step,
        .n_running = a->n_running,
        .n_waiting = a->n_waiting,
    };
    return 0;
}

int lora_scheduler_request_info(const struct lora_scheduler *s, uint64_t id,
                                struct lora_scheduler_request_info *info)
{
    const struct request *r = lookup(s, id);

    if (!r) {
        errno = ENOENT;
        return -1;
    }
    *info = (struct lora_scheduler_request_info){
        .state = r->state,
        .adapter_id = r->ad >= 0 ? s->adapters[r->ad].id : 0,
        .n_prompt_tokens = r->n_prompt,
        .max_tokens = r->max_tokens,
        .n_generated = r->n_generated,
        .n_computed = r->n_computed,
        .n_blocks = r->table.n,
        .n_preemptions = r->n_preemptions,
        .slot_wait_since = r->slot_wait_since,
    };
    return 0;
}

int lora_scheduler_n_running(const struct lora_scheduler *s)
{
    return s->running.n;
}

int lora_scheduler_n_waiting(const struct lora_scheduler *s)
{
    return s->waiting.n;
}

int lora_scheduler_n_free_blocks(const struct lora_scheduler *s)
{
    return lora_block_manager_n_free(s->bm);
}

/* ---- invariants ---- */

/* Walks one list: links, states, per-request facts; adds to the per-adapter counts. */
static int check_list(const struct lora_scheduler *s, const struct list *l,
                      enum lora_scheduler_state st, int *n_inflight, int *n_tables, char *err,
                      size_t err_len)
{
    int n = 0, prev = -1;
    int *counts = s->chk_counts + (st == LORA_SCHEDULER_RUNNING ? s->cfg.max_adapters : 0);
    int n_base = 0;

    for (int i = l->head; i >= 0; prev = i, i = s->reqs[i].next) {
        const struct request *r = &s->reqs[i];
        int want_blocks = lora_block_manager_blocks_for(s->bm, r->n_computed + r->n_scheduled);

        if (++n > l->n || !r->used || r->state != st || r->prev != prev)
            return fail(EINVAL, err, err_len, "queue links or states broken");
        if (r->n_generated < 0 || r->n_generated >= r->max_tokens ||
            r->n_computed + r->n_scheduled > seq_len(r))
            return fail(EINVAL, err, err_len, "request token counts out of range");
        if (r->table.n != want_blocks)
            return fail(EINVAL, err, err_len, "block table does not match computed tokens");
        if (st == LORA_SCHEDULER_WAITING && (r->n_computed || r->n_scheduled))
            return fail(EINVAL, err, err_len, "waiting request holds computation");
        if (st == LORA_SCHEDULER_RUNNING && !r->n_scheduled && r->n_computed >= seq_len(r))
            return fail(EINVAL, err, err_len, "running request has nothing to compute");
        if (st == LORA_SCHEDULER_RUNNING && r->ad >= 0 && s->adapters[r->ad].slot < 0)
            return fail(EINVAL, err, err_len, "running request's adapter holds no slot");
        if (r->ad >= 0 && (r->ad >= s->cfg.max_adapters || s->adapters[r->ad].id == 0))
            return fail(EINVAL, err, err_len, "request refers to a dropped adapter");
        if (lookup(s, r->id) != r)
            return fail(EINVAL, err, err_len, "request missing from the id index");
        if (r->ad >= 0)
            counts[r->ad]++;
        else
            n_base++;
        *n_inflight += r->n_scheduled > 0;
        if (*n_tables >= s->cfg.max_requests)
            return fail(EINVAL, err, err_len, "more queued requests than the pool holds");
        s->chk_tables[(*n_tables)++] = &r->table;
    }
    if (n != l->n || l->tail != prev)
        return fail(EINVAL, err, err_len, "queue count or tail broken");
    if (n_base != (st == LORA_SCHEDULER_RUNNING ? s->n_base_running : s->n_base_waiting))
        return fail(EINVAL, err, err_len, "base model request count wrong");
    return 0;
}

static int check_adapters(const struct lora_scheduler *s, char *err, size_t err_len)
{
    const int *waiting = s->chk_counts, *running = s->chk_counts + s->cfg.max_adapters;

    for (int i = 0; i < s->cfg.max_adapters; i++) {
        const struct adapter *a = &s->adapters[i];

        if (a->n_running != running[i] || a->n_waiting != waiting[i])
            return fail(EINVAL, err, err_len, "per-adapter request counts wrong");
        if (a->id == 0 && (a->slot >= 0 || a->pinned || a->removing))
            return fail(EINVAL, err, err_len, "unused adapter entry holds state");
        if (a->slot >= 0 && (a->slot >= s->cfg.max_loras || s->slot_ad[a->slot] != i))
            return fail(EINVAL, err, err_len, "adapter and slot disagree");
        if ((a->pinned || a->removing || a->arriving) && a->slot < 0)
            return fail(EINVAL, err, err_len, "pinned, removed or arriving adapter holds no slot");
        if (a->arriving && a->n_running > 0)
            return fail(EINVAL, err, err_len, "a request runs on an adapter still arriving");
        for (int j = i + 1; a->id != 0 && j < s->cfg.max_adapters; j++)
            if (s->adapters[j].id == a->id)
                return fail(EINVAL, err, err_len, "adapter registered twice");
    }
    for (int k = 0; k < s->cfg.max_loras; k++) {
        int ad = s->slot_ad[k];

        if (ad >= 0 && (ad >= s->cfg.max_adapters || s->adapters[ad].slot != k))
            return fail(EINVAL, err, err_len, "slot and adapter disagree");
    }
    return 0;
}

int lora_scheduler_check(const struct lora_scheduler *s, char *err, size_t err_len)
{
    int n_inflight = 0, n_used = 0, n_tables = 0;

    memset(s->chk_counts, 0, 2 * (size_t)s->cfg.max_adapters * sizeof(*s->chk_counts));
    if (s->running.n > s->cfg.max_num_seqs)
        return fail(EINVAL, err, err_len, "running set over max_num_seqs");
    if (s->waiting.n + s->running.n + s->n_free_reqs != s->cfg.max_requests)
        return fail(EINVAL, err, err_len, "request pool count wrong");
    for (int i = 0; i < s->cfg.max_requests; i++)
        n_used += s->reqs[i].used;
    if (n_used != s->waiting.n + s->running.n)
        return fail(EINVAL, err, err_len, "requests on no queue");
    if (check_list(s, &s->waiting, LORA_SCHEDULER_WAITING, &n_inflight, &n_tables, err, err_len) ||
        check_list(s, &s->running, LORA_SCHEDULER_RUNNING, &n_inflight, &n_tables, err, err_len))
        return -1;
    if (n_inflight != s->n_inflight)
        return fail(EINVAL, err, err_len, "in-flight count wrong");
    if (check_adapters(s, err, err_len))
        return -1;
    if (lora_block_manager_check(s->bm, s->chk_tables, n_tables) != 0)
        return fail(EINVAL, err, err_len, "KV block accounting broken");
    return 0;
}
