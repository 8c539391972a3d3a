/* forward: one batched transformer step with unmerged multi-LoRA, through the model's backend;
 * see forward.h. */
#include "runtime/forward.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN 64 /* bytes: every region of a buffer starts on a cache line */

struct slot {
    bool used;
    int rank;
    float scale;
    uint64_t ticket; /* the slot's asynchronous copy, until it is seen complete; 0: none */
};

struct lora_forward {
    const struct lora_model *m;
    struct lora_backend *be;
    const struct lora_backend_ops *k;
    struct lora_kv_cache *kv;
    struct lora_forward_limits lim;
    struct lora_collective *coll; /* borrowed; NULL with one rank */

    /* Activations and scratch: regions of one backend buffer, one row per token of the step,
     * in slot order. */
    struct lora_buffer *act;
    float *x;     /* (max_tokens, hidden) residual stream */
    float *xb;    /* (max_tokens, hidden) normed input */
    float *out;   /* (max_tokens, hidden) projection output before the residual add */
    float *q;     /* (max_tokens, q_dim) */
    float *kk;    /* (max_tokens, kv_dim) keys */
    float *v;     /* (max_tokens, kv_dim) */
    float *att;   /* (max_tokens, q_dim) */
    float *gate;  /* (max_tokens, inter) */
    float *up;    /* (max_tokens, inter) */
    void *lora_tmp;    /* the shrink's scratch */
    void *att_scratch; /* attention's scratch */
    float *xf;     /* (max_logit_rows, hidden) rows that need logits */
    float *logits; /* (max_logit_rows, vocab) */
    size_t x_off;      /* x's offset in act, for gathering rows of it */
    size_t logits_off; /* logits' offset in act */
    float *logits_host; /* the logits as host memory: in act, or a copy (logits_copy) */
    bool logits_copy;

    /* Adapter slots: slot s holds its adapter's A (rank, in) and B transposed (rank, out) of
     * each targeted projection of each layer, packed from s * slot_bytes on in that order, each
     * matrix 64-byte aligned; slot_bytes has room for every projection at max_rank. mat_off
     * says where each one is, so that one copy moves an adapter's bytes and no more. */
    struct lora_buffer *slot_buf;
    size_t slot_bytes;
    size_t *mat_off;    /* (max_loras, n_layers * LORA_PROJ_COUNT, 2) A's and B's offsets */
    void *slot_staging; /* host memory: one A or B converted to the slots' dtype on its way */
    void **pinned;      /* (max_loras) page-locked images of the slots, on a backend with
                           asynchronous uploads; NULL: copies are synchronous */
    struct slot *slots;      /* (max_loras) */
    unsigned char *present;  /* (max_loras, n_layers * LORA_PROJ_COUNT): the slot's adapter
                                targets that projection of that layer */

    /* Step bookkeeping, host memory. */
    int *ids;       /* (max_tokens) */
    int *pos;       /* (max_tokens) */
    int *kv_slot;   /* (max_tokens) */
    int *order;     /* (max_seqs) sequence indices sorted by adapter slot */
    int *seq_row;   /* (max_seqs) first token row of each sequence, in slot order */
    int *logit_src; /* (max_logit_rows) token row feeding each logit row */
    struct lora_attn_seq *attn; /* (max_seqs) */
    struct lora_sgmv_seg *segs; /* (max_loras) */
    int *group_slot; /* (max_loras) slot of each contiguous group of rows */
    int *group_row;  /* (max_loras + 1) first row of each group, then the end */
    int n_groups;
};

static size_t aligned(size_t bytes)
{
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

/* Reserves bytes at *end (aligned) and returns their offset. */
static size_t carve(size_t *end, size_t bytes)
{
    size_t off = (*end + ALIGN - 1) / ALIGN * ALIGN;
    *end = off + bytes;
    return off;
}

/* Lays out activations and scratch in one buffer, and the slots in another. */
static int alloc_buffers(struct lora_forward *f, char *err, size_t err_len)
{
    const struct lora_model *m = f->m;
    const struct lora_model_config *c = &m->cfg;
    const struct lora_forward_limits *lim = &f->lim;
    struct lora_backend *be = f->be;
    size_t T = (size_t)lim->max_tokens, R = (size_t)lim->max_logit_rows, F = sizeof(float);
    size_t hidden = (size_t)c->hidden_size, q_dim = (size_t)m->n_heads * c->head_dim;
    size_t kv_dim = (size_t)f->kv->kv_dim, inter = (size_t)m->inter, end = 0;
    size_t off[13];

    off[0] = f->x_off = carve(&end, T * hidden * F);
    off[1] = carve(&end, T * hidden * F);
    off[2] = carve(&end, T * hidden * F);
    off[3] = carve(&end, T * q_dim * F);
    off[4] = carve(&end, T * kv_dim * F);
    off[5] = carve(&end, T * kv_dim * F);
    off[6] = carve(&end, T * q_dim * F);
    off[7] = carve(&end, T * inter * F);
    off[8] = carve(&end, T * inter * F);
    off[9] = carve(&end, f->k->scratch_bytes(be, LORA_KERNEL_LORA_SGMV, lim->max_tokens, 0,
                                             lim->max_rank));
    off[10] = carve(&end, f->k->scratch_bytes(be, LORA_KERNEL_ATTENTION, lim->max_tokens,
                                              lim->max_ctx, 0));
    off[11] = carve(&end, R * hidden * F);
    off[12] = f->logits_off = carve(&end, R * (size_t)c->vocab_size * F);
    f->act = f->k->buffer_alloc(be, end, err, err_len);
    if (!f->act)
        return -1;
    char *base = f->act->base;
    f->x = (float *)(base + off[0]);
    f->xb = (float *)(base + off[1]);
    f->out = (float *)(base + off[2]);
    f->q = (float *)(base + off[3]);
    f->kk = (float *)(base + off[4]);
    f->v = (float *)(base + off[5]);
    f->att = (float *)(base + off[6]);
    f->gate = (float *)(base + off[7]);
    f->up = (float *)(base + off[8]);
    f->lora_tmp = base + off[9];
    f->att_scratch = base + off[10];
    f->xf = (float *)(base + off[11]);
    f->logits = (float *)(base + off[12]);
    f->logits_copy = !f->act->host;
    f->logits_host = f->logits_copy ? malloc(R * (size_t)c->vocab_size * F + F) : f->logits;
    if (!f->logits_host) {
        snprintf(err, err_len, "forward: out of memory for %zu logit rows", R);
        return -1;
    }

    /* Every targetable projection of every layer, at max_rank, in the slots' dtype. */
    size_t r = (size_t)lim->max_rank, es = lora_dtype_size(lim->slot_dtype), widest = 0;
    f->slot_bytes = 0;
    for (int p = 0; p < LORA_PROJ_COUNT; p++) {
        size_t in = (size_t)lora_model_proj_in(m, p), out = (size_t)lora_model_proj_out(m, p);
        f->slot_bytes += (aligned(r * in * es) + aligned(r * out * es)) * (size_t)c->n_layers;
        widest = in > widest ? in : widest;
        widest = out > widest ? out : widest;
    }
    f->slot_staging = malloc(r * widest * es + 1);
    if (!f->slot_staging) {
        snprintf(err, err_len, "forward: out of memory");
        return -1;
    }
    f->slot_buf = f->k->buffer_alloc(be, f->slot_bytes * (size_t)lim->max_loras, err, err_len);
    if (!f->slot_buf)
        return -1;
    if (!f->k->upload_async || !f->k->host_alloc_pinned)
        return 0;
    f->pinned = calloc((size_t)lim->max_loras + 1, sizeof(void *));
    if (!f->pinned) {
        snprintf(err, err_len, "forward: out of memory");
        return -1;
    }
    for (int s = 0; s < lim->max_loras; s++)
        if (!(f->pinned[s] = f->k->host_alloc_pinned(be, f->slot_bytes, err, err_len)))
            return -1;
    return 0;
}

/* Whether kv fits model m's shard and lives on its backend; -1 with err when not. */
static int check_kv(const struct lora_model *m, const struct lora_kv_cache *kv, char *err,
                    size_t err_len)
{
    if (kv->n_layers != m->cfg.n_layers || kv->kv_dim != m->n_kv_heads * m->cfg.head_dim) {
        snprintf(err, err_len, "forward: KV cache shape does not match the model shard");
        return -1;
    }
    if (kv->be != m->be) {
        snprintf(err, err_len, "forward: the KV cache is not on the model's backend");
        return -1;
    }
    return 0;
}

struct lora_forward *lora_forward_new(const struct lora_model *m, struct lora_kv_cache *kv,
                                      const struct lora_forward_limits *lim, char *err,
                                      size_t err_len)
{
    const struct lora_model_config *c = &m->cfg;
    if (lim->max_tokens < 1 || lim->max_seqs < 1 || lim->max_logit_rows < 1 ||
        lim->max_ctx < 1 || lim->max_loras < 0 || lim->max_rank < 1) {
        snprintf(err, err_len, "forward: invalid limits");
        return NULL;
    }
    if (check_kv(m, kv, err, err_len) < 0)
        return NULL;
    if (!m->be->ops->supports(m->be, LORA_KERNEL_LORA_SGMV, lim->slot_dtype)) {
        snprintf(err, err_len, "forward: the %s backend cannot compute LoRA in %s", m->be->kind,
                 lora_dtype_name(lim->slot_dtype));
        return NULL;
    }
    struct lora_forward *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, err_len, "forward: out of memory");
        return NULL;
    }
    size_t T = (size_t)lim->max_tokens, R = (size_t)lim->max_logit_rows;
    size_t n_lp = (size_t)c->n_layers * LORA_PROJ_COUNT;

    f->m = m;
    f->be = m->be;
    f->k = m->be->ops;
    f->kv = kv;
    f->lim = *lim;
    if (alloc_buffers(f, err, err_len) < 0) {
        lora_forward_destroy(&f);
        return NULL;
    }
    f->ids = calloc(T, sizeof(int));
    f->pos = calloc(T, sizeof(int));
    f->kv_slot = calloc(T, sizeof(int));
    f->order = calloc((size_t)lim->max_seqs, sizeof(int));
    f->seq_row = calloc((size_t)lim->max_seqs, sizeof(int));
    f->logit_src = calloc(R, sizeof(int));
    f->attn = calloc((size_t)lim->max_seqs, sizeof(*f->attn));
    f->segs = calloc((size_t)lim->max_loras + 1, sizeof(*f->segs));
    f->slots = calloc((size_t)lim->max_loras + 1, sizeof(*f->slots));
    f->present = calloc(((size_t)lim->max_loras + 1) * n_lp, 1);
    f->mat_off = calloc(((size_t)lim->max_loras + 1) * n_lp * 2, sizeof(size_t));
    f->group_slot = calloc((size_t)lim->max_loras + 2, sizeof(int));
    f->group_row = calloc((size_t)lim->max_loras + 3, sizeof(int));
    if (!f->ids || !f->pos || !f->kv_slot || !f->order || !f->seq_row || !f->logit_src ||
        !f->attn || !f->segs || !f->slots || !f->present || !f->mat_off || !f->group_slot ||
        !f->group_row) {
        snprintf(err, err_len, "forward: out of memory for %d tokens and %d logit rows",
                 lim->max_tokens, lim->max_logit_rows);
        lora_forward_destroy(&f);
    }
    return f;
}

int lora_forward_set_kv(struct lora_forward *f, struct lora_kv_cache *kv, char *err, size_t err_len)
{
    if (check_kv(f->m, kv, err, err_len) < 0)
        return -1;
    f->kv = kv;
    return 0;
}

void lora_forward_destroy(struct lora_forward **fp)
{
    struct lora_forward *f = fp ? *fp : NULL;
    if (!f)
        return;
    /* Freeing the pinned images waits for the copies still reading them. */
    for (int s = 0; f->pinned && s < f->lim.max_loras; s++)
        f->k->host_free_pinned(f->be, f->pinned[s]);
    free(f->pinned);
    f->k->buffer_free(f->be, f->act);
    f->k->buffer_free(f->be, f->slot_buf);
    if (f->logits_copy)
        free(f->logits_host);
    free(f->slot_staging);
    free(f->ids);
    free(f->pos);
    free(f->kv_slot);
    free(f->order);
    free(f->seq_row);
    free(f->logit_src);
    free(f->attn);
    free(f->segs);
    free(f->slots);
    free(f->present);
    free(f->mat_off);
    free(f->group_slot);
    free(f->group_row);
    free(f);
    *fp = NULL;
}

size_t lora_forward_bytes(const struct lora_forward *f, size_t *slot_bytes)
{
    if (slot_bytes)
        *slot_bytes = f->slot_buf->bytes;
    return f->act->bytes + f->slot_buf->bytes;
}

/* Where slot s keeps A (or B, transposed) of projection p of layer l: an offset in slot_buf. */
static size_t slot_off(const struct lora_forward *f, int s, int l, enum lora_proj p, bool b)
{
    size_t n_lp = (size_t)f->m->cfg.n_layers * LORA_PROJ_COUNT;
    return f->mat_off[((size_t)s * n_lp + (size_t)(l * LORA_PROJ_COUNT + p)) * 2 + b];
}

/* Converts n float32 elements of an adapter matrix to the slots' dtype at dst (host memory). */
static void put_image(const struct lora_forward *f, void *dst, const float *src, size_t n)
{
    if (f->lim.slot_dtype == LORA_DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
    else
        lora_dtype_convert(LORA_DTYPE_F32, src, f->lim.slot_dtype, dst, n);
}

/* Uploads n float32 elements of an adapter matrix to offset off of the slots, converted to their
 * dtype, and returns once they are there. */
static int put_slot_matrix(struct lora_forward *f, size_t off, const float *src, size_t n,
                           char *err, size_t err_len)
{
    const void *data = src;

    if (f->lim.slot_dtype != LORA_DTYPE_F32) {
        put_image(f, f->slot_staging, src, n);
        data = f->slot_staging;
    }
    return f->k->upload(f->be, f->slot_buf, off, data, n * lora_dtype_size(f->lim.slot_dtype), err,
                        err_len);
}

/* Waits for slot's copy, if one is running (an asynchronous copy takes milliseconds). */
static void wait_copy(struct lora_forward *f, int slot)
{
    struct slot *sl = &f->slots[slot];

    while (sl->ticket && !f->k->upload_done(f->be, sl->ticket))
        sched_yield();
    sl->ticket = 0;
}

int lora_forward_set_slot(struct lora_forward *f, int slot, const struct lora_adapter *a,
                          char *err, size_t err_len)
{
    if (slot < 0 || slot >= f->lim.max_loras) {
        snprintf(err, err_len, "slot %d is out of range (max_loras %d)", slot, f->lim.max_loras);
        return -1;
    }
    if (a && a->rank > f->lim.max_rank) {
        snprintf(err, err_len, "adapter rank %d exceeds max_rank %d", a->rank, f->lim.max_rank);
        return -1;
    }
    if (a && a->n_layers != f->m->cfg.n_layers) {
        snprintf(err, err_len, "adapter has %d layers, the model %d", a->n_layers,
                 f->m->cfg.n_layers);
        return -1;
    }
    int n_lp = f->m->cfg.n_layers * LORA_PROJ_COUNT;
    unsigned char *present = f->present + (size_t)slot * n_lp;
    size_t *mat_off = f->mat_off + (size_t)slot * n_lp * 2;
    /* The slot's image may still be read by its last copy. */
    wait_copy(f, slot);
    f->slots[slot] = (struct slot){0};
    memset(present, 0, (size_t)n_lp);
    if (!a)
        return 0;
    size_t es = lora_dtype_size(f->lim.slot_dtype), r = (size_t)a->rank;
    size_t base = (size_t)slot * f->slot_bytes;
    size_t at = 0;
    for (int i = 0; i < n_lp; i++) {
        if (!a->a[i])
            continue;
        enum lora_proj p = i % LORA_PROJ_COUNT;
        size_t n_a = r * lora_model_proj_in(f->m, p), n_b = r * lora_model_proj_out(f->m, p);
        mat_off[2 * i] = base + at;
        mat_off[2 * i + 1] = base + at + aligned(n_a * es);
        if (f->pinned) {
            put_image(f, (char *)f->pinned[slot] + at, a->a[i], n_a);
            put_image(f, (char *)f->pinned[slot] + at + aligned(n_a * es), a->b[i], n_b);
        } else if (put_slot_matrix(f, mat_off[2 * i], a->a[i], n_a, err, err_len) < 0 ||
                   put_slot_matrix(f, mat_off[2 * i + 1], a->b[i], n_b, err, err_len) < 0) {
            memset(present, 0, (size_t)n_lp);
            return -1;
        }
        at += aligned(n_a * es) + aligned(n_b * es);
        present[i] = 1;
    }
    uint64_t ticket = 0;
    if (f->pinned && f->k->upload_async(f->be, f->slot_buf, base, f->pinned[slot], at, &ticket,
                                        err, err_len) < 0) {
        memset(present, 0, (size_t)n_lp);
        return -1;
    }
    f->slots[slot] = (struct slot){.used = true, .rank = a->rank, .scale = a->scale,
                                   .ticket = ticket};
    return 0;
}

bool lora_forward_slot_ready(struct lora_forward *f, int slot)
{
    if (slot < 0 || slot >= f->lim.max_loras)
        return false;
    struct slot *sl = &f->slots[slot];
    if (sl->ticket && f->k->upload_done(f->be, sl->ticket))
        sl->ticket = 0;
    return sl->ticket == 0;
}

bool lora_forward_copies_async(const struct lora_forward *f)
{
    return f->pinned != NULL;
}

void lora_forward_slot_wait(struct lora_forward *f, int slot)
{
    if (slot >= 0 && slot < f->lim.max_loras)
        wait_copy(f, slot);
}

void lora_forward_set_collective(struct lora_forward *f, struct lora_collective *c)
{
    f->coll = c;
}

/* Checks the step against the limits, the vocabulary, the slots and the block pool. */
static int validate(const struct lora_forward *f, const struct lora_seq_step *seqs, int n_seqs,
                    char *err, size_t err_len)
{
    int n_tokens = 0, n_rows = 0, bs = f->kv->block_size;

    if (n_seqs < 1 || n_seqs > f->lim.max_seqs) {
        snprintf(err, err_len, "step has %d sequences (limit %d)", n_seqs, f->lim.max_seqs);
        return -1;
    }
    for (int i = 0; i < n_seqs; i++) {
        const struct lora_seq_step *s = &seqs[i];
        if (s->n_tokens < 1 || s->pos < 0 || s->pos + s->n_tokens > f->lim.max_ctx) {
            snprintf(err, err_len, "sequence %d: %d tokens at position %d exceed context %d", i,
                     s->n_tokens, s->pos, f->lim.max_ctx);
            return -1;
        }
        int sl = s->adapter_slot;
        if (sl < -1 || sl >= f->lim.max_loras || (sl >= 0 && !f->slots[sl].used)) {
            snprintf(err, err_len, "sequence %d: adapter slot %d is empty or out of range", i, sl);
            return -1;
        }
        for (int t = 0; t < s->n_tokens; t++) {
            if (s->tokens[t] < 0 || s->tokens[t] >= f->m->cfg.vocab_size) {
                snprintf(err, err_len, "sequence %d: token %d is outside the vocabulary (%d)", i,
                         s->tokens[t], f->m->cfg.vocab_size);
                return -1;
            }
        }
        for (int b = 0; b < (s->pos + s->n_tokens + bs - 1) / bs; b++) {
            if (s->block_table[b] < 0 || s->block_table[b] >= f->kv->n_blocks) {
                snprintf(err, err_len, "sequence %d: block %d is out of range", i,
                         s->block_table[b]);
                return -1;
            }
        }
        n_tokens += s->n_tokens;
        n_rows += s->all_logits ? s->n_tokens : 1;
    }
    if (n_tokens > f->lim.max_tokens || n_rows > f->lim.max_logit_rows) {
        snprintf(err, err_len, "step has %d tokens and %d logit rows (limits %d and %d)",
                 n_tokens, n_rows, f->lim.max_tokens, f->lim.max_logit_rows);
        return -1;
    }
    return 0;
}

/* Orders sequences by adapter slot (stable, base model first) and lays out the step's rows. */
static int plan(struct lora_forward *f, const struct lora_seq_step *seqs, int n_seqs,
                int *first_row)
{
    int n = 0, row = 0, n_logit_rows = 0, bs = f->kv->block_size;

    for (int sl = -1; sl < f->lim.max_loras; sl++) {
        int group_start = row;
        for (int i = 0; i < n_seqs; i++) {
            const struct lora_seq_step *s = &seqs[i];
            if (s->adapter_slot != sl)
                continue;
            f->order[n] = i;
            f->attn[n] = (struct lora_attn_seq){row, s->n_tokens, s->pos, s->block_table};
            first_row[i] = n_logit_rows;
            for (int t = 0; t < s->n_tokens; t++) {
                int p = s->pos + t;
                f->ids[row + t] = s->tokens[t];
                f->pos[row + t] = p;
                f->kv_slot[row + t] = s->block_table[p / bs] * bs + p % bs;
                if (s->all_logits || t == s->n_tokens - 1)
                    f->logit_src[n_logit_rows++] = row + t;
            }
            row += s->n_tokens;
            n++;
        }
        if (sl >= 0 && row > group_start) {
            f->group_slot[f->n_groups] = sl;
            f->group_row[f->n_groups++] = group_start;
        }
    }
    f->group_row[f->n_groups] = row;
    return n_logit_rows;
}

/* y (rows, out) += the LoRA deltas of projection p of layer l for every adapter group. */
static void apply_lora(struct lora_forward *f, float *y, const float *x, int l, enum lora_proj p)
{
    int n_segs = 0, n_lp = f->m->cfg.n_layers * LORA_PROJ_COUNT, i = l * LORA_PROJ_COUNT + p;
    int in = lora_model_proj_in(f->m, p), out = lora_model_proj_out(f->m, p);

    for (int g = 0; g < f->n_groups; g++) {
        int s = f->group_slot[g];
        if (!f->present[(size_t)s * n_lp + i])
            continue;
        f->segs[n_segs++] = (struct lora_sgmv_seg){
            .row = f->group_row[g],
            .n_rows = f->group_row[g + 1] - f->group_row[g],
            .rank = f->slots[s].rank,
            .scale = f->slots[s].scale,
            .a = {f->slot_buf, slot_off(f, s, l, p, false), f->lim.slot_dtype, f->slots[s].rank,
                  in},
            .b_t = {f->slot_buf, slot_off(f, s, l, p, true), f->lim.slot_dtype, f->slots[s].rank,
                    out},
        };
    }
    if (n_segs)
        f->k->lora_sgmv(f->be, y, x, f->segs, n_segs, in, out, f->lora_tmp, f->lim.max_rank);
}

/* y (T, out) = x · wᵀ + LoRA deltas. */
static void project(struct lora_forward *f, float *y, const float *x, const struct lora_tensor *w,
                    int T, int l, enum lora_proj p)
{
    f->k->matmul(f->be, y, x, w, T, 1.0f, false);
    apply_lora(f, y, x, l, p);
}

/* ys[i] = x · ws[i]ᵀ + LoRA deltas for projections of one input (q, k and v; gate and up): one
 * call where the backend shares x among them, bit for bit project()'s results. */
static void project_shared(struct lora_forward *f, int n, float *const *ys, const float *x,
                           const struct lora_tensor *const *ws, const enum lora_proj *ps, int T,
                           int l)
{
    if (!f->k->matmul_shared) {
        for (int i = 0; i < n; i++)
            project(f, ys[i], x, ws[i], T, l, ps[i]);
        return;
    }
    f->k->matmul_shared(f->be, n, ys, x, ws, T);
    for (int i = 0; i < n; i++)
        apply_lora(f, ys[i], x, l, ps[i]);
}

static int reduce(struct lora_forward *f, float *buf, size_t n)
{
    if (!f->coll)
        return 0;
    return f->k->allreduce_sum(f->be, f->coll, buf, n);
}

static int run_layer(struct lora_forward *f, int l, int T, int n_seqs)
{
    const struct lora_model *m = f->m;
    const struct lora_model_config *c = &m->cfg;
    const struct lora_layer *w = &m->layers[l];
    const struct lora_backend_ops *k = f->k;
    struct lora_backend *be = f->be;
    int hidden = c->hidden_size, hd = c->head_dim;
    struct lora_tensor kc = lora_kv_cache_k(f->kv, l), vc = lora_kv_cache_v(f->kv, l);

    k->rmsnorm(be, f->xb, f->x, &w->attn_norm, T, c->rms_norm_eps);
    project_shared(f, 3, (float *const[]){f->q, f->kk, f->v}, f->xb,
                   (const struct lora_tensor *const[]){&w->wq, &w->wk, &w->wv},
                   (const enum lora_proj[]){LORA_PROJ_Q, LORA_PROJ_K, LORA_PROJ_V}, T, l);
    if (w->bq.buf) {
        k->add_bias(be, f->q, &w->bq, T);
        k->add_bias(be, f->kk, &w->bk, T);
        k->add_bias(be, f->v, &w->bv, T);
    }
    k->rope(be, f->q, f->pos, T, m->n_heads, hd, c->rope_theta);
    k->rope(be, f->kk, f->pos, T, m->n_kv_heads, hd, c->rope_theta);
    k->kv_write(be, &kc, &vc, f->kk, f->v, f->kv_slot, T);
    k->attention(be, f->att, f->q, &kc, &vc, f->attn, n_seqs, m->n_heads, m->n_kv_heads, hd,
                 f->kv->block_size, f->att_scratch, f->lim.max_ctx);
    project(f, f->out, f->att, &w->wo, T, l, LORA_PROJ_O);
    if (reduce(f, f->out, (size_t)T * hidden) < 0)
        return -1;
    k->add(be, f->x, f->out, (size_t)T * hidden);

    k->rmsnorm(be, f->xb, f->x, &w->mlp_norm, T, c->rms_norm_eps);
    project_shared(f, 2, (float *const[]){f->gate, f->up}, f->xb,
                   (const struct lora_tensor *const[]){&w->w_gate, &w->w_up},
                   (const enum lora_proj[]){LORA_PROJ_GATE, LORA_PROJ_UP}, T, l);
    k->silu_mul(be, f->gate, f->up, (size_t)T * m->inter);
    project(f, f->out, f->gate, &w->w_down, T, l, LORA_PROJ_DOWN);
    if (reduce(f, f->out, (size_t)T * hidden) < 0)
        return -1;
    k->add(be, f->x, f->out, (size_t)T * hidden);
    return 0;
}

int lora_forward_warm(struct lora_forward *f, char *err, size_t err_len)
{
    enum { WARM_TOKENS = 8 };
    int tokens[WARM_TOKENS] = {0}, blocks[WARM_TOKENS];
    int n = f->lim.max_tokens < WARM_TOKENS ? f->lim.max_tokens : WARM_TOKENS;
    const float *logits;
    int first_row;

    n = n < f->lim.max_ctx ? n : f->lim.max_ctx;
    int nb = (n + f->kv->block_size - 1) / f->kv->block_size;
    if (nb > f->kv->n_blocks)
        return 0; /* a cache this small has nothing to warm */
    for (int b = 0; b < nb; b++)
        blocks[b] = b;
    struct lora_seq_step s = {tokens, n, 0, blocks, -1, false};
    return lora_forward_step(f, &s, 1, &logits, &first_row, err, err_len);
}

int lora_forward_step(struct lora_forward *f, const struct lora_seq_step *seqs, int n_seqs,
                      const float **logits, int *first_row, char *err, size_t err_len)
{
    const struct lora_model_config *c = &f->m->cfg;
    const struct lora_backend_ops *k = f->k;
    int hidden = c->hidden_size;

    if (validate(f, seqs, n_seqs, err, err_len) < 0)
        return -1;
    /* A caller that runs a step before its adapter's copy is done gets it late, not wrong. */
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].adapter_slot >= 0)
            wait_copy(f, seqs[i].adapter_slot);
    f->n_groups = 0;
    int n_rows = plan(f, seqs, n_seqs, first_row);
    int T = f->group_row[f->n_groups];

    k->embed(f->be, f->x, &f->m->embed, f->ids, T);
    for (int l = 0; l < c->n_layers; l++) {
        if (run_layer(f, l, T, n_seqs) < 0) {
            snprintf(err, err_len, "tensor-parallel all-reduce failed in layer %d", l);
            return -1;
        }
    }
    /* The rows that need logits, gathered from the residual stream as from a table. */
    struct lora_tensor x_rows = {f->act, f->x_off, LORA_DTYPE_F32, T, hidden};
    k->embed(f->be, f->xf, &x_rows, f->logit_src, n_rows);
    k->rmsnorm(f->be, f->xf, f->xf, &f->m->final_norm, n_rows, c->rms_norm_eps);
    k->matmul(f->be, f->logits, f->xf, &f->m->lm_head, n_rows, 1.0f, false);
    if (f->logits_copy &&
        k->download(f->be, f->logits_host, f->act, f->logits_off,
                    (size_t)n_rows * c->vocab_size * sizeof(float), err, err_len) < 0)
        return -1;
    *logits = f->logits_host;
    return 0;
}
