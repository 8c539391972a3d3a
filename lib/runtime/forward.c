/* forward: one batched transformer step with unmerged multi-LoRA; see forward.h. */
#include "runtime/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels_cpu.h"

struct lora_forward {
    const struct lora_model *m;
    struct lora_kv_cache *kv;
    struct lora_forward_limits lim;
    const struct lora_adapter **slots; /* (max_loras), borrowed */
    lora_allreduce_fn allreduce;
    void *allreduce_ctx;

    /* Activations, one row per token of the step, in slot order. */
    float *x;     /* (max_tokens, hidden) residual stream */
    float *xb;    /* (max_tokens, hidden) normed input */
    float *out;   /* (max_tokens, hidden) projection output before the residual add */
    float *q;     /* (max_tokens, q_dim) */
    float *k;     /* (max_tokens, kv_dim) */
    float *v;     /* (max_tokens, kv_dim) */
    float *att;   /* (max_tokens, q_dim) */
    float *gate;  /* (max_tokens, inter) */
    float *up;    /* (max_tokens, inter) */
    float *lora_tmp;  /* (max_tokens, max_rank) */
    float *att_scratch; /* (threads, max_ctx) */
    float *xf;     /* (max_logit_rows, hidden) rows that need logits */
    float *logits; /* (max_logit_rows, vocab) */

    /* Step bookkeeping. */
    int *ids;       /* (max_tokens) */
    int *pos;       /* (max_tokens) */
    int *kv_slot;   /* (max_tokens) */
    int *order;     /* (max_seqs) sequence indices sorted by adapter slot */
    int *seq_row;   /* (max_seqs) first token row of each sequence, in slot order */
    int *logit_src; /* (max_logit_rows) token row feeding each logit row */
    struct lora_k_attn_seq *attn; /* (max_seqs) */
    struct lora_k_lora_seg *segs; /* (max_loras) */
    int *group_slot; /* (max_loras) slot of each contiguous group of rows */
    int *group_row;  /* (max_loras + 1) first row of each group, then the end */
    int n_groups;
};

static void *alloc_floats(size_t n, bool *ok)
{
    void *p = malloc(n * sizeof(float) + sizeof(float));
    if (!p)
        *ok = false;
    return p;
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
    if (kv->n_layers != c->n_layers || kv->kv_dim != m->n_kv_heads * c->head_dim) {
        snprintf(err, err_len, "forward: KV cache shape does not match the model shard");
        return NULL;
    }
    struct lora_forward *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, err_len, "forward: out of memory");
        return NULL;
    }
    size_t T = (size_t)lim->max_tokens, R = (size_t)lim->max_logit_rows;
    size_t q_dim = (size_t)m->n_heads * c->head_dim, kv_dim = (size_t)kv->kv_dim;
    bool ok = true;

    f->m = m;
    f->kv = kv;
    f->lim = *lim;
    f->x = alloc_floats(T * c->hidden_size, &ok);
    f->xb = alloc_floats(T * c->hidden_size, &ok);
    f->out = alloc_floats(T * c->hidden_size, &ok);
    f->q = alloc_floats(T * q_dim, &ok);
    f->k = alloc_floats(T * kv_dim, &ok);
    f->v = alloc_floats(T * kv_dim, &ok);
    f->att = alloc_floats(T * q_dim, &ok);
    f->gate = alloc_floats(T * m->inter, &ok);
    f->up = alloc_floats(T * m->inter, &ok);
    f->lora_tmp = alloc_floats(T * lim->max_rank, &ok);
    f->att_scratch = alloc_floats((size_t)lora_k_n_threads() * lim->max_ctx, &ok);
    f->xf = alloc_floats(R * c->hidden_size, &ok);
    f->logits = alloc_floats(R * c->vocab_size, &ok);
    f->ids = calloc(T, sizeof(int));
    f->pos = calloc(T, sizeof(int));
    f->kv_slot = calloc(T, sizeof(int));
    f->order = calloc((size_t)lim->max_seqs, sizeof(int));
    f->seq_row = calloc((size_t)lim->max_seqs, sizeof(int));
    f->logit_src = calloc(R, sizeof(int));
    f->attn = calloc((size_t)lim->max_seqs, sizeof(*f->attn));
    f->segs = calloc((size_t)lim->max_loras + 1, sizeof(*f->segs));
    f->slots = calloc((size_t)lim->max_loras + 1, sizeof(*f->slots));
    f->group_slot = calloc((size_t)lim->max_loras + 2, sizeof(int));
    f->group_row = calloc((size_t)lim->max_loras + 3, sizeof(int));
    if (!ok || !f->ids || !f->pos || !f->kv_slot || !f->order || !f->seq_row || !f->logit_src ||
        !f->attn || !f->segs || !f->slots || !f->group_slot || !f->group_row) {
        snprintf(err, err_len, "forward: out of memory for %d tokens and %d logit rows",
                 lim->max_tokens, lim->max_logit_rows);
        lora_forward_destroy(&f);
    }
    return f;
}

void lora_forward_destroy(struct lora_forward **fp)
{
    struct lora_forward *f = fp ? *fp : NULL;
    if (!f)
        return;
    float *bufs[] = {f->x,    f->xb,       f->out,         f->q,  f->k,     f->v, f->att,
                     f->gate, f->up, f->lora_tmp, f->att_scratch, f->xf, f->logits};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(f->ids);
    free(f->pos);
    free(f->kv_slot);
    free(f->order);
    free(f->seq_row);
    free(f->logit_src);
    free(f->attn);
    free(f->segs);
    free(f->slots);
    free(f->group_slot);
    free(f->group_row);
    free(f);
    *fp = NULL;
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
    f->slots[slot] = a;
    return 0;
}

void lora_forward_set_allreduce(struct lora_forward *f, lora_allreduce_fn fn, void *ctx)
{
    f->allreduce = fn;
    f->allreduce_ctx = ctx;
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
        if (sl < -1 || sl >= f->lim.max_loras || (sl >= 0 && !f->slots[sl])) {
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
            f->attn[n] = (struct lora_k_attn_seq){row, s->n_tokens, s->pos, s->block_table};
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
    int n_segs = 0;

    for (int g = 0; g < f->n_groups; g++) {
        const struct lora_adapter *a = f->slots[f->group_slot[g]];
        int i = l * LORA_PROJ_COUNT + p;
        if (!a->a[i])
            continue;
        f->segs[n_segs++] = (struct lora_k_lora_seg){
            .row = f->group_row[g],
            .n_rows = f->group_row[g + 1] - f->group_row[g],
            .rank = a->rank,
            .scale = a->scale,
            .a = a->a[i],
            .b_t = a->b[i],
        };
    }
    if (n_segs)
        lora_k_lora_sgmv(y, x, f->segs, n_segs, lora_model_proj_in(f->m, p),
                         lora_model_proj_out(f->m, p), f->lora_tmp, f->lim.max_rank);
}

/* y (T, out) = x · wᵀ + LoRA deltas. */
static void project(struct lora_forward *f, float *y, const float *x, const float *w, int T,
                    int l, enum lora_proj p)
{
    lora_k_matmul(y, x, w, T, lora_model_proj_out(f->m, p), lora_model_proj_in(f->m, p), 1.0f,
                  false);
    apply_lora(f, y, x, l, p);
}

static int reduce(struct lora_forward *f, float *buf, size_t n)
{
    if (!f->allreduce)
        return 0;
    return f->allreduce(buf, n, f->allreduce_ctx);
}

static int run_layer(struct lora_forward *f, int l, int T, int n_seqs)
{
    const struct lora_model *m = f->m;
    const struct lora_model_config *c = &m->cfg;
    const struct lora_layer *w = &m->layers[l];
    int hidden = c->hidden_size, hd = c->head_dim;
    int q_dim = m->n_heads * hd, kv_dim = m->n_kv_heads * hd;

    lora_k_rmsnorm(f->xb, f->x, w->attn_norm, T, hidden, c->rms_norm_eps);
    project(f, f->q, f->xb, w->wq, T, l, LORA_PROJ_Q);
    project(f, f->k, f->xb, w->wk, T, l, LORA_PROJ_K);
    project(f, f->v, f->xb, w->wv, T, l, LORA_PROJ_V);
    if (w->bq) {
        lora_k_add_bias(f->q, w->bq, T, q_dim);
        lora_k_add_bias(f->k, w->bk, T, kv_dim);
        lora_k_add_bias(f->v, w->bv, T, kv_dim);
    }
    lora_k_rope(f->q, f->pos, T, m->n_heads, hd, c->rope_theta);
    lora_k_rope(f->k, f->pos, T, m->n_kv_heads, hd, c->rope_theta);
    lora_k_kv_write(lora_kv_cache_k(f->kv, l), lora_kv_cache_v(f->kv, l), f->k, f->v, f->kv_slot,
                    T, kv_dim);
    lora_k_attention(f->att, f->q, lora_kv_cache_k(f->kv, l), lora_kv_cache_v(f->kv, l), f->attn,
                     n_seqs, m->n_heads, m->n_kv_heads, hd, f->kv->block_size, f->att_scratch,
                     f->lim.max_ctx);
    project(f, f->out, f->att, w->wo, T, l, LORA_PROJ_O);
    if (reduce(f, f->out, (size_t)T * hidden) < 0)
        return -1;
    lora_k_add(f->x, f->out, (size_t)T * hidden);

    lora_k_rmsnorm(f->xb, f->x, w->mlp_norm, T, hidden, c->rms_norm_eps);
    project(f, f->gate, f->xb, w->w_gate, T, l, LORA_PROJ_GATE);
    project(f, f->up, f->xb, w->w_up, T, l, LORA_PROJ_UP);
    lora_k_silu_mul(f->gate, f->up, (size_t)T * m->inter);
    project(f, f->out, f->gate, w->w_down, T, l, LORA_PROJ_DOWN);
    if (reduce(f, f->out, (size_t)T * hidden) < 0)
        return -1;
    lora_k_add(f->x, f->out, (size_t)T * hidden);
    return 0;
}

int lora_forward_step(struct lora_forward *f, const struct lora_seq_step *seqs, int n_seqs,
                      const float **logits, int *first_row, char *err, size_t err_len)
{
    const struct lora_model_config *c = &f->m->cfg;
    int hidden = c->hidden_size;

    if (validate(f, seqs, n_seqs, err, err_len) < 0)
        return -1;
    f->n_groups = 0;
    int n_rows = plan(f, seqs, n_seqs, first_row);
    int T = f->group_row[f->n_groups];

    lora_k_embed(f->x, f->m->embed, f->ids, T, hidden);
    for (int l = 0; l < c->n_layers; l++) {
        if (run_layer(f, l, T, n_seqs) < 0) {
            snprintf(err, err_len, "tensor-parallel all-reduce failed in layer %d", l);
            return -1;
        }
    }
    for (int r = 0; r < n_rows; r++)
        memcpy(f->xf + (size_t)r * hidden, f->x + (size_t)f->logit_src[r] * hidden,
               sizeof(float) * hidden);
    lora_k_rmsnorm(f->xf, f->xf, f->m->final_norm, n_rows, hidden, c->rms_norm_eps);
    lora_k_matmul(f->logits, f->xf, f->m->lm_head, n_rows, c->vocab_size, hidden, 1.0f, false);
    *logits = f->logits;
    return 0;
}
