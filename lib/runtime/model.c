/* model: loads a Hugging Face checkpoint (whole or one tensor-parallel shard); see model.h. */
#include "runtime/model.h"

#include "base/json_file.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a tensor is cut for this shard. */
enum slice {
    SLICE_NONE,
    SLICE_ROWS, /* rows [start, start + count) of a 2-D tensor, or elements of a 1-D one */
    SLICE_COLS, /* columns [start, start + count) of a 2-D tensor */
};

struct loader {
    struct lora_model *m;
    struct lora_precision p;
    const char *dir;
    char *err;
    size_t err_len;
};

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) {
        fputs("lora: fatal: out of memory\n", stderr);
        abort();
    }
    return p;
}

static const struct lora_tensor_info *find_tensor(const struct lora_model *m, const char *name,
                                                  const struct lora_safetensors **file)
{
    for (int i = 0; i < m->n_files; i++) {
        const struct lora_tensor_info *t = lora_safetensors_find(m->files[i], name);
        if (t) {
            *file = m->files[i];
            return t;
        }
    }
    return NULL;
}

static int file_index(const struct lora_model *m, const struct lora_safetensors *f)
{
    int i = 0;
    while (m->files[i] != f)
        i++;
    return i;
}

/* The kernels that read a weight: its dtype is kept only when the backend takes it in all. */
#define READ_BY(op) (1u << (op))
#define BY_MATMUL   READ_BY(LORA_KERNEL_MATMUL)
#define BY_NORM     READ_BY(LORA_KERNEL_RMSNORM)
#define BY_BIAS     READ_BY(LORA_KERNEL_ADD_BIAS)
#define BY_EMBED    READ_BY(LORA_KERNEL_EMBED)

static bool backend_takes(struct lora_backend *be, unsigned read_by, enum lora_dtype dtype)
{
    for (int op = 0; op < LORA_KERNEL_COUNT; op++)
        if ((read_by & READ_BY(op)) && !be->ops->supports(be, (enum lora_kernel)op, dtype))
            return false;
    return true;
}

/* The dtype weight name (stored as `stored`, read by the kernels of read_by) is kept in: the one
 * asked for (--dtype, --quantization int8 for a matmul weight) where the backend takes it, else
 * float32 when the choice was auto. Returns 0, or -1 with err when a named dtype is refused. */
static int choose_dtype(struct loader *ld, const char *path, const char *name, unsigned read_by,
                        enum lora_dtype stored, enum lora_dtype *dtype)
{
    struct lora_backend *be = ld->m->be;
    const struct lora_precision *p = &ld->p;
    bool weight = read_by & (BY_MATMUL | BY_EMBED), named = false;

    *dtype = stored;
    if (weight && !p->weights_auto) {
        *dtype = p->weights;
        named = true;
    }
    if ((read_by & BY_MATMUL) && p->int8) {
        *dtype = LORA_DTYPE_I8;
        named = true;
    }
    if (backend_takes(be, read_by, *dtype))
        return 0;
    if (named && !(read_by & ~BY_MATMUL)) {
        snprintf(ld->err, ld->err_len, "%s: tensor '%s': the %s backend cannot compute with %s",
                 path, name, be->kind, lora_precision_name(*dtype));
        return -1;
    }
    /* A norm or bias, a tied embedding the lookup cannot read quantized, or auto: float32
     * where the backend lacks the dtype (the tied table then stays in the base dtype). */
    enum lora_dtype base = p->weights_auto ? stored : p->weights;
    *dtype = weight && backend_takes(be, read_by, base) ? base : LORA_DTYPE_F32;
    if (backend_takes(be, read_by, *dtype))
        return 0;
    snprintf(ld->err, ld->err_len, "%s: tensor '%s': the %s backend computes with neither %s "
             "nor F32 there", path, name, be->kind, lora_dtype_name(stored));
    return -1;
}

/* Sets *out to tensor name, whose full shape must be (d0) or (d0, d1), cut as kind says, for the
 * kernels of read_by: in place in its file's mapping, or converted, quantized or sliced into a
 * buffer of its own. Returns 0, or -1 with an error naming file and tensor. */
static int fetch(struct loader *ld, struct lora_tensor *out, unsigned read_by, const char *name,
                 int n_dims, int64_t d0, int64_t d1, enum slice kind, int64_t start,
                 int64_t count)
{
    struct lora_model *m = ld->m;
    struct lora_backend *be = m->be;
    const struct lora_safetensors *f = NULL;
    const struct lora_tensor_info *t = find_tensor(m, name, &f);

    if (!t) {
        if (m->n_files == 1)
            snprintf(ld->err, ld->err_len, "%s: missing tensor '%s'", m->files[0]->path, name);
        else
            snprintf(ld->err, ld->err_len,
                     "%s/model.safetensors.index.json: missing tensor '%s' in any shard", ld->dir,
                     name);
        return -1;
    }
    bool shape_ok = t->n_dims == n_dims && t->shape[0] == d0 && (n_dims == 1 || t->shape[1] == d1);
    if (!shape_ok) {
        char got[160];
        lora_tensor_shape_str(t, got, sizeof(got));
        if (n_dims == 1)
            snprintf(ld->err, ld->err_len, "%s: tensor '%s' has shape %s, expected [%lld]",
                     f->path, name, got, (long long)d0);
        else
            snprintf(ld->err, ld->err_len, "%s: tensor '%s' has shape %s, expected [%lld, %lld]",
                     f->path, name, got, (long long)d0, (long long)d1);
        return -1;
    }
    if (t->dtype != LORA_DTYPE_F32 && t->dtype != LORA_DTYPE_F16 && t->dtype != LORA_DTYPE_BF16) {
        snprintf(ld->err, ld->err_len, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16",
                 f->path, name, lora_dtype_name(t->dtype));
        return -1;
    }
    enum lora_dtype dtype;
    if (choose_dtype(ld, f->path, name, read_by, t->dtype, &dtype) < 0)
        return -1;
    if (read_by & BY_MATMUL) {
        m->weight_dtype = dtype;
        m->base_dtype = ld->p.weights_auto ? t->dtype : ld->p.weights;
    }

    int64_t rows = n_dims == 1 ? 1 : d0, cols = n_dims == 1 ? d0 : d1;
    if (n_dims == 1 && kind == SLICE_ROWS) {
        kind = SLICE_COLS; /* a 1-D slice is a column range of one row */
    }
    if (kind != SLICE_NONE && start == 0 && count == (kind == SLICE_ROWS ? rows : cols))
        kind = SLICE_NONE; /* one rank's whole tensor: in place like any other */
    int64_t out_rows = kind == SLICE_ROWS ? count : rows;
    int64_t out_cols = kind == SLICE_COLS ? count : cols;
    size_t esize = lora_dtype_size(t->dtype);
    const char *src = t->data;
    size_t bytes = lora_tensor_bytes(dtype, out_rows, out_cols);

    *out = (struct lora_tensor){.dtype = dtype, .rows = out_rows, .cols = out_cols};
    m->weight_bytes += bytes;
    /* In place: the file's mapping, wrapped (its buffer is m->buffers[file index]). */
    struct lora_buffer *wrap = m->buffers[file_index(m, f)];
    bool aligned = ((uintptr_t)src % esize) == 0;
    if (wrap && dtype == t->dtype && aligned && kind != SLICE_COLS) {
        out->buf = wrap;
        out->offset = (size_t)(src - (const char *)f->map) +
                      (kind == SLICE_ROWS ? (size_t)(start * cols) * esize : 0);
        return 0;
    }

    struct lora_buffer *buf = be->ops->buffer_alloc(be, bytes, ld->err, ld->err_len);
    if (!buf)
        return -1;
    m->buffers[m->n_buffers++] = buf;
    out->buf = buf;
    /* The shard's part in the stored dtype: in the mapping, or gathered column by column. */
    size_t n = (size_t)(out_rows * out_cols);
    char *gathered = NULL;
    if (kind == SLICE_COLS) {
        gathered = malloc(n * esize + 1);
        if (gathered)
            for (int64_t r = 0; r < rows; r++)
                memcpy(gathered + (size_t)(r * out_cols) * esize,
                       src + (size_t)(r * cols + start) * esize, (size_t)out_cols * esize);
        src = gathered;
    } else if (kind == SLICE_ROWS) {
        src += (size_t)(start * cols) * esize;
    }
    char *dst = buf->host ? buf->base : malloc(bytes + 1);
    if (!src || !dst) {
        snprintf(ld->err, ld->err_len, "%s: tensor '%s': out of memory", f->path, name);
        free(gathered);
        if (dst != buf->base)
            free(dst);
        return -1;
    }
    int rc = 0;
    if (dtype == LORA_DTYPE_I8 && lora_quantize_i8(t->dtype, src, out_rows, out_cols, dst) < 0) {
        snprintf(ld->err, ld->err_len, "%s: tensor '%s' holds a value that is not finite: it "
                 "cannot be quantized", f->path, name);
        rc = -1;
    } else if (dtype != LORA_DTYPE_I8) {
        lora_dtype_convert(t->dtype, src, dtype, dst, n);
    }
    free(gathered);
    if (!buf->host) {
        if (rc == 0)
            rc = be->ops->upload(be, buf, 0, dst, bytes, ld->err, ld->err_len);
        free(dst);
    }
    lora_safetensors_release(f, t); /* the copy is the weight now */
    return rc;
}

/* Opens model.safetensors, or every file named by model.safetensors.index.json. */
static int open_files(struct loader *ld)
{
    struct lora_model *m = ld->m;
    char path[4096];

    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", ld->dir);
    json_t *index = lora_json_file_load(path, ld->err, ld->err_len);
    if (!index && errno != ENOENT)
        return -1;
    if (!index) {
        snprintf(path, sizeof(path), "%s/model.safetensors", ld->dir);
        m->files = xcalloc(1, sizeof(*m->files));
        m->files[0] = lora_safetensors_open(path, ld->err, ld->err_len);
        if (!m->files[0])
            return -1;
        m->n_files = 1;
        return 0;
    }

    int rc = -1;
    json_t *map = json_object_get(index, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        snprintf(ld->err, ld->err_len, "%s: 'weight_map' must be a non-empty object", path);
        goto out;
    }
    m->files = xcalloc(json_object_size(map), sizeof(*m->files));
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        const char *fname = json_string_value(file);
        if (!fname || !*fname || strchr(fname, '/') || strstr(fname, "..")) {
            snprintf(ld->err, ld->err_len, "%s: tensor '%s' maps to an invalid file name", path,
                     name);
            goto out;
        }
        bool seen = false;
        char fpath[4096];
        snprintf(fpath, sizeof(fpath), "%s/%s", ld->dir, fname);
        for (int i = 0; i < m->n_files && !seen; i++)
            seen = strcmp(m->files[i]->path, fpath) == 0;
        if (seen)
            continue;
        m->files[m->n_files] = lora_safetensors_open(fpath, ld->err, ld->err_len);
        if (!m->files[m->n_files])
            goto out;
        m->n_files++;
    }
    /* Every tensor must be where the index says. */
    json_object_foreach(map, name, file) {
        const struct lora_safetensors *f = NULL;
        char fpath[4096];
        snprintf(fpath, sizeof(fpath), "%s/%s", ld->dir, json_string_value(file));
        if (!find_tensor(m, name, &f) || strcmp(f->path, fpath) != 0) {
            snprintf(ld->err, ld->err_len, "%s/%s: missing tensor '%s' listed in %s", ld->dir,
                     json_string_value(file), name, path);
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(index);
    return rc;
}

static int check_split(struct loader *ld, const char *what, int n, int tp_size)
{
    if (n % tp_size == 0)
        return 0;
    snprintf(ld->err, ld->err_len, "%s: %s (%d) is not divisible by tensor-parallel size %d",
             ld->dir, what, n, tp_size);
    return -1;
}

static int load_layer(struct loader *ld, int i)
{
    struct lora_model *m = ld->m;
    const struct lora_model_config *c = &m->cfg;
    struct lora_layer *l = &m->layers[i];
    int r = m->tp_rank, hd = c->head_dim, hidden = c->hidden_size;
    int q_all = c->n_heads * hd, kv_all = c->n_kv_heads * hd;
    int q_dim = m->n_heads * hd, kv_dim = m->n_kv_heads * hd;
    char name[256];

#define NAME(suffix) (snprintf(name, sizeof(name), "model.layers.%d.%s", i, suffix), name)
    /* In file order of the checks: the first failure is the one reported. */
    if (fetch(ld, &l->attn_norm, BY_NORM, NAME("input_layernorm.weight"), 1, hidden, 0,
              SLICE_NONE, 0, 0) < 0 ||
        fetch(ld, &l->mlp_norm, BY_NORM, NAME("post_attention_layernorm.weight"), 1, hidden, 0,
              SLICE_NONE, 0, 0) < 0 ||
        fetch(ld, &l->wq, BY_MATMUL, NAME("self_attn.q_proj.weight"), 2, q_all, hidden,
              SLICE_ROWS, (int64_t)r * q_dim, q_dim) < 0 ||
        fetch(ld, &l->wk, BY_MATMUL, NAME("self_attn.k_proj.weight"), 2, kv_all, hidden,
              SLICE_ROWS, (int64_t)r * kv_dim, kv_dim) < 0 ||
        fetch(ld, &l->wv, BY_MATMUL, NAME("self_attn.v_proj.weight"), 2, kv_all, hidden,
              SLICE_ROWS, (int64_t)r * kv_dim, kv_dim) < 0 ||
        fetch(ld, &l->wo, BY_MATMUL, NAME("self_attn.o_proj.weight"), 2, hidden, q_all,
              SLICE_COLS, (int64_t)r * q_dim, q_dim) < 0)
        return -1;
    if (c->qkv_bias &&
        (fetch(ld, &l->bq, BY_BIAS, NAME("self_attn.q_proj.bias"), 1, q_all, 0, SLICE_ROWS,
               (int64_t)r * q_dim, q_dim) < 0 ||
         fetch(ld, &l->bk, BY_BIAS, NAME("self_attn.k_proj.bias"), 1, kv_all, 0, SLICE_ROWS,
               (int64_t)r * kv_dim, kv_dim) < 0 ||
         fetch(ld, &l->bv, BY_BIAS, NAME("self_attn.v_proj.bias"), 1, kv_all, 0, SLICE_ROWS,
               (int64_t)r * kv_dim, kv_dim) < 0))
        return -1;
    int inter_all = c->intermediate_size, inter = m->inter;
    if (fetch(ld, &l->w_gate, BY_MATMUL, NAME("mlp.gate_proj.weight"), 2, inter_all, hidden,
              SLICE_ROWS, (int64_t)r * inter, inter) < 0 ||
        fetch(ld, &l->w_up, BY_MATMUL, NAME("mlp.up_proj.weight"), 2, inter_all, hidden,
              SLICE_ROWS, (int64_t)r * inter, inter) < 0 ||
        fetch(ld, &l->w_down, BY_MATMUL, NAME("mlp.down_proj.weight"), 2, hidden, inter_all,
              SLICE_COLS, (int64_t)r * inter, inter) < 0)
        return -1;
#undef NAME
    return 0;
}

struct lora_model *lora_model_load(struct lora_backend *be, const char *dir, int tp_rank,
                                   int tp_size, const struct lora_precision *precision, char *err,
                                   size_t err_len)
{
    struct lora_model *m = xcalloc(1, sizeof(*m));
    struct loader ld = {.m = m, .dir = dir, .err = err, .err_len = err_len};

    if (precision)
        ld.p = *precision;
    else
        lora_precision_defaults(&ld.p);
    char path[4096];

    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (lora_model_config_load(path, &m->cfg, err, err_len) < 0)
        goto fail;
    const struct lora_model_config *c = &m->cfg;
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
        snprintf(err, err_len, "%s: invalid tensor-parallel rank %d of %d", dir, tp_rank, tp_size);
        goto fail;
    }
    if (check_split(&ld, "num_attention_heads", c->n_heads, tp_size) < 0 ||
        check_split(&ld, "num_key_value_heads", c->n_kv_heads, tp_size) < 0 ||
        check_split(&ld, "intermediate_size", c->intermediate_size, tp_size) < 0)
        goto fail;
    m->be = be;
    m->tp_rank = tp_rank;
    m->tp_size = tp_size;
    m->n_heads = c->n_heads / tp_size;
    m->n_kv_heads = c->n_kv_heads / tp_size;
    m->inter = c->intermediate_size / tp_size;
    if (open_files(&ld) < 0)
        goto fail;

    /* The mappings, each wrapped where the backend can use host memory in place, then at most
     * 12 tensors per layer plus embedding, norm and head. */
    m->buffers = xcalloc((size_t)m->n_files + (size_t)c->n_layers * 12 + 3, sizeof(*m->buffers));
    for (int i = 0; i < m->n_files; i++, m->n_buffers++) {
        if (!be->ops->buffer_wrap)
            continue;
        m->buffers[i] = be->ops->buffer_wrap(be, m->files[i]->map, m->files[i]->map_bytes, err,
                                             err_len);
        if (!m->buffers[i])
            goto fail;
    }
    m->layers = xcalloc((size_t)c->n_layers, sizeof(*m->layers));
    /* A tied embedding is the LM head too: both kernels must take its dtype. */
    unsigned embed_by = BY_EMBED | (c->tie_word_embeddings ? BY_MATMUL : 0);
    if (fetch(&ld, &m->embed, embed_by, "model.embed_tokens.weight", 2, c->vocab_size,
              c->hidden_size, SLICE_NONE, 0, 0) < 0 ||
        fetch(&ld, &m->final_norm, BY_NORM, "model.norm.weight", 1, c->hidden_size, 0,
              SLICE_NONE, 0, 0) < 0)
        goto fail;
    if (c->tie_word_embeddings)
        m->lm_head = m->embed;
    else if (fetch(&ld, &m->lm_head, BY_MATMUL, "lm_head.weight", 2, c->vocab_size,
                   c->hidden_size, SLICE_NONE, 0, 0) < 0)
        goto fail;
    for (int i = 0; i < c->n_layers; i++)
        if (load_layer(&ld, i) < 0)
            goto fail;
    return m;
fail:
    lora_model_destroy(&m);
    return NULL;
}

void lora_model_destroy(struct lora_model **mp)
{
    struct lora_model *m = mp ? *mp : NULL;
    if (!m)
        return;
    /* The buffers first: some wrap the mappings. */
    for (int i = 0; m->buffers && i < m->n_buffers; i++)
        m->be->ops->buffer_free(m->be, m->buffers[i]);
    free(m->buffers);
    for (int i = 0; i < m->n_files; i++)
        lora_safetensors_close(&m->files[i]);
    free(m->files);
    free(m->layers);
    free(m);
    *mp = NULL;
}

bool lora_proj_is_column_parallel(enum lora_proj p)
{
    return p != LORA_PROJ_O && p != LORA_PROJ_DOWN;
}

int lora_model_proj_in(const struct lora_model *m, enum lora_proj p)
{
    int in = lora_proj_in(&m->cfg, p);
    return lora_proj_is_column_parallel(p) ? in : in / m->tp_size;
}

int lora_model_proj_out(const struct lora_model *m, enum lora_proj p)
{
    int out = lora_proj_out(&m->cfg, p);
    return lora_proj_is_column_parallel(p) ? out / m->tp_size : out;
}
