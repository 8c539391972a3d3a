/* Unit tests for lib/model: generated checkpoints (lib/model_gen) load with the dimensions of
 * their config.json and the values of their safetensors files, read back independently through
 * lora_safetensors_open; tensor-parallel shards hold exactly their rows or columns of the full
 * model; and every malformed checkpoint (truncated file, lying header, missing or misshapen
 * tensor, integer dtype, bad config, broken shard index, impossible split) fails with one message
 * naming the file and the tensor. Fixtures live in a mkdtemp directory removed at the end.
 */
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "model.h"
#include "model_gen.h"

#define ERR_BYTES   1024
#define PATH_BYTES  512
#define MAX_TENSORS 128

static char tmp_dir[] = "/tmp/test_model.XXXXXX";

/* ---- files -------------------------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

/* rm -r path; a missing path is fine. */
static void remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* tmp_dir/<formatted name> in one of eight rotating static buffers. */
static const char *tmp_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static const char *tmp_path(const char *fmt, ...)
{
    static char bufs[8][PATH_BYTES];
    static int next;
    char *buf = bufs[next++ % 8];
    va_list ap;
    int n = snprintf(buf, PATH_BYTES, "%s/", tmp_dir);

    va_start(ap, fmt);
    vsnprintf(buf + n, PATH_BYTES - (size_t)n, fmt, ap);
    va_end(ap);
    return buf;
}

/* dir/name in one of eight rotating static buffers. */
static const char *join(const char *dir, const char *name)
{
    static char bufs[8][PATH_BYTES];
    static int next;
    char *buf = bufs[next++ % 8];

    snprintf(buf, PATH_BYTES, "%s/%s", dir, name);
    return buf;
}

static long file_size(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Writes a fresh model under tmp_dir/name (removing what was there) and returns its path. */
static const char *gen_model(const char *name, const struct lora_gen_model_opts *o)
{
    const char *dir = tmp_path("%s", name);
    char err[ERR_BYTES] = "";

    remove_tree(dir);
    if (lora_gen_model_write(dir, o, err, sizeof(err)) != 0) {
        printf("# gen_model %s: %s\n", name, err);
        check_cur_failed = 1;
    }
    return dir;
}

static const char *gen_default_model(const char *name)
{
    struct lora_gen_model_opts o;

    lora_gen_model_defaults(&o);
    return gen_model(name, &o);
}

/* Sets key of the JSON object in path to value (stolen). Returns 0 or -1. */
static int json_file_set(const char *path, const char *key, json_t *value)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_PRESERVE_ORDER, &jerr);
    int rc = -1;

    if (root && json_object_set_new(root, key, value) == 0)
        rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    else
        json_decref(value);
    json_decref(root);
    return rc;
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    int rc = 0;

    if (!f)
        return -1;
    if (fputs(text, f) == EOF)
        rc = -1;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

/* ---- tensor sets: a safetensors file read into floats, edited and written back ----------- */

struct tset {
    struct lora_tensor_out t[MAX_TENSORS];
    char *names[MAX_TENSORS];
    float *data[MAX_TENSORS];
    int n;
};

static int64_t out_numel(const struct lora_tensor_out *t)
{
    int64_t n = 1;

    for (int d = 0; d < t->n_dims; d++)
        n *= t->shape[d];
    return n;
}

static void tset_free(struct tset *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        free(s->data[i]);
    }
    s->n = 0;
}

/* Appends a tensor of shape (d0) or (d0, d1) filled with fill. */
static void tset_add(struct tset *s, const char *name, int n_dims, int64_t d0, int64_t d1,
                     float fill)
{
    struct lora_tensor_out *t;
    int64_t n;
    int i;

    if (s->n >= MAX_TENSORS) {
        printf("# tset_add: more than %d tensors\n", MAX_TENSORS);
        check_cur_failed = 1;
        return;
    }
    i = s->n++;
    t = &s->t[i];
    s->names[i] = strdup(name);
    t->name = s->names[i];
    t->dtype = LORA_DTYPE_F32;
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = d1;
    n = out_numel(t);
    s->data[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t k = 0; k < n; k++)
        s->data[i][k] = fill;
    t->data = s->data[i];
}

/* Reads every tensor of path as float32. Returns 0 or -1 (with a diagnostic). */
static int tset_read(struct tset *s, const char *path)
{
    char err[ERR_BYTES];
    struct lora_safetensors *st = lora_safetensors_open(path, err, sizeof(err));

    memset(s, 0, sizeof(*s));
    if (!st || st->n_tensors > MAX_TENSORS) {
        printf("# tset_read: %s\n", st ? "too many tensors" : err);
        lora_safetensors_close(&st);
        return -1;
    }
    for (int i = 0; i < st->n_tensors; i++) {
        const struct lora_tensor_info *ti = &st->tensors[i];
        struct lora_tensor_out *t = &s->t[s->n];

        s->names[s->n] = strdup(ti->name);
        s->data[s->n] = malloc((size_t)(ti->numel ? ti->numel : 1) * sizeof(float));
        t->name = s->names[s->n];
        t->dtype = LORA_DTYPE_F32;
        t->n_dims = ti->n_dims;
        memcpy(t->shape, ti->shape, sizeof(t->shape));
        t->data = s->data[s->n];
        s->n++;
        lora_dtype_to_f32(ti->dtype, ti->data, s->data[s->n - 1], (size_t)ti->numel);
    }
    lora_safetensors_close(&st);
    return 0;
}

static int tset_find(const struct tset *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0)
            return i;
    return -1;
}

/* Removes tensor name; returns 0 or -1 when there is none. */
static int tset_drop(struct tset *s, const char *name)
{
    int i = tset_find(s, name);

    if (i < 0)
        return -1;
    free(s->names[i]);
    free(s->data[i]);
    for (int k = i; k + 1 < s->n; k++) {
        s->t[k] = s->t[k + 1];
        s->names[k] = s->names[k + 1];
        s->data[k] = s->data[k + 1];
    }
    s->n--;
    return 0;
}

/* Gives tensor name the shape (d0) or (d0, d1), with new data. */
static int tset_reshape(struct tset *s, const char *name, int n_dims, int64_t d0, int64_t d1)
{
    if (tset_drop(s, name) < 0)
        return -1;
    tset_add(s, name, n_dims, d0, d1, 0.25f);
    return 0;
}

static int tset_write(const struct tset *s, const char *path)
{
    char err[ERR_BYTES];

    if (lora_safetensors_write(path, s->t, s->n, err, sizeof(err)) != 0) {
        printf("# tset_write: %s\n", err);
        return -1;
    }
    return 0;
}

/* How write_raw() lies about one tensor (the victim). */
enum lie {
    LIE_NONE,
    LIE_I64,      /* dtype I64 with 8 zero bytes per element */
    LIE_PAST_END, /* data_offsets end 4096 bytes past the data section */
    LIE_SIZE,     /* data_offsets hold 4 bytes fewer than the shape needs */
};

/* Writes s by hand (F32, header order as s), with one lie about victim. With unaligned, the
 * header is padded so that the data section starts at an odd file offset. */
static int write_raw(const struct tset *s, const char *path, enum lie lie, const char *victim,
                     bool unaligned)
{
    json_t *hdr = json_object();
    size_t data_bytes = 0, at;
    int64_t begin[MAX_TENSORS], end[MAX_TENSORS];
    int rc = -1;

    for (int i = 0; i < s->n; i++) {
        bool is_victim = victim && strcmp(s->names[i], victim) == 0;
        size_t esize = is_victim && lie == LIE_I64 ? 8 : 4;

        begin[i] = (int64_t)data_bytes;
        data_bytes += (size_t)out_numel(&s->t[i]) * esize;
        end[i] = (int64_t)data_bytes;
        if (is_victim && lie == LIE_SIZE)
            end[i] -= 4;
    }
    for (int i = 0; i < s->n; i++) {
        bool is_victim = victim && strcmp(s->names[i], victim) == 0;
        json_t *shape = json_array();

        for (int d = 0; d < s->t[i].n_dims; d++)
            json_array_append_new(shape, json_integer(s->t[i].shape[d]));
        if (is_victim && lie == LIE_PAST_END)
            end[i] = (int64_t)data_bytes + 4096;
        json_object_set_new(hdr, s->names[i],
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                      is_victim && lie == LIE_I64 ? "I64" : "F32", "shape", shape,
                                      "data_offsets", (json_int_t)begin[i], (json_int_t)end[i]));
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t hlen = strlen(text);
    size_t padded = unaligned ? (hlen / 8 + 1) * 8 + 1 : (hlen + 7) / 8 * 8;
    unsigned char *buf = calloc(1, 8 + padded + data_bytes);

    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    memset(buf + 8, ' ', padded);
    memcpy(buf + 8, text, hlen);
    at = 8 + padded;
    for (int i = 0; i < s->n; i++) {
        bool is_victim = victim && strcmp(s->names[i], victim) == 0;

        if (!(is_victim && lie == LIE_I64))
            memcpy(buf + at + begin[i], s->data[i], (size_t)out_numel(&s->t[i]) * sizeof(float));
    }
    FILE *f = fopen(path, "wb");
    if (f && fwrite(buf, 1, 8 + padded + data_bytes, f) == 8 + padded + data_bytes)
        rc = 0;
    if (f && fclose(f) != 0)
        rc = -1;
    free(buf);
    free(text);
    json_decref(hdr);
    return rc;
}

/* ---- loading ------------------------------------------------------------------------------ */

static char err_buf[ERR_BYTES];

/* Loads dir as shard rank of size, expecting failure; returns the message (one line). */
static const char *load_err(const char *dir, int rank, int size)
{
    struct lora_model *m;

    memset(err_buf, 0, sizeof(err_buf));
    m = lora_model_load(dir, rank, size, err_buf, sizeof(err_buf));
    CHECK(m == NULL);
    lora_model_destroy(&m);
    CHECK(err_buf[0] != '\0');
    CHECK(strchr(err_buf, '\n') == NULL);
    if (getenv("LORA_TEST_VERBOSE"))
        printf("# error: %s\n", err_buf);
    return err_buf;
}

static struct lora_model *load_ok(const char *dir, int rank, int size)
{
    char err[ERR_BYTES] = "";
    struct lora_model *m = lora_model_load(dir, rank, size, err, sizeof(err));

    if (!m) {
        printf("# load %s (%d of %d): %s\n", dir, rank, size, err);
        check_cur_failed = 1;
    }
    return m;
}

/* Number of the n floats at a and b that differ (bitwise-equal values are expected). */
static long n_differ(const float *a, const float *b, long n)
{
    long bad = 0;

    for (long i = 0; i < n; i++)
        bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return bad;
}

/* Compares tensor name of the file st (converted to float) with got, all of it. */
static long differ_from_file(const struct lora_safetensors *st, const char *name, const float *got)
{
    const struct lora_tensor_info *t = lora_safetensors_find(st, name);
    float *want;
    long bad;

    if (!t || !got)
        return -1;
    want = malloc((size_t)t->numel * sizeof(float));
    lora_dtype_to_f32(t->dtype, t->data, want, (size_t)t->numel);
    bad = n_differ(want, got, (long)t->numel);
    free(want);
    return bad;
}

/* ---- tests: good models ------------------------------------------------------------------- */

static const char *base_dir, *bf16_dir, *tied_dir, *sharded_dir, *qwen_dir;

static void test_fixtures_written(void)
{
    static char base[PATH_BYTES], bf16[PATH_BYTES], tied[PATH_BYTES], sharded[PATH_BYTES],
        qwen[PATH_BYTES];
    struct lora_gen_model_opts o;

    snprintf(base, sizeof(base), "%s", gen_default_model("base"));
    lora_gen_model_defaults(&o);
    o.dtype = LORA_DTYPE_BF16;
    snprintf(bf16, sizeof(bf16), "%s", gen_model("bf16", &o));
    lora_gen_model_defaults(&o);
    o.tie_word_embeddings = true;
    snprintf(tied, sizeof(tied), "%s", gen_model("tied", &o));
    lora_gen_model_defaults(&o);
    o.n_shards = 3;
    snprintf(sharded, sizeof(sharded), "%s", gen_model("sharded", &o));
    lora_gen_model_defaults(&o);
    o.arch = LORA_ARCH_QWEN2;
    snprintf(qwen, sizeof(qwen), "%s", gen_model("qwen2", &o));
    base_dir = base;
    bf16_dir = bf16;
    tied_dir = tied;
    sharded_dir = sharded;
    qwen_dir = qwen;
}

static void test_good_model_loads(void)
{
    struct lora_model *m = load_ok(base_dir, 0, 1);
    struct lora_safetensors *st;
    char err[ERR_BYTES];
    size_t file_floats = 0;

    if (!m)
        return;
    CHECK(m->cfg.arch == LORA_ARCH_LLAMA);
    CHECK(m->cfg.hidden_size == 64);
    CHECK(m->cfg.intermediate_size == 128);
    CHECK(m->cfg.n_layers == 2);
    CHECK(m->cfg.n_heads == 4 && m->cfg.n_kv_heads == 2 && m->cfg.head_dim == 16);
    CHECK(m->cfg.vocab_size == 320);
    CHECK(m->tp_rank == 0 && m->tp_size == 1);
    CHECK(m->n_heads == 4 && m->n_kv_heads == 2 && m->inter == 128);
    CHECK(m->lm_head != m->embed);
    for (int p = 0; p < LORA_PROJ_COUNT; p++) {
        CHECK(lora_model_proj_in(m, (enum lora_proj)p) == lora_proj_in(&m->cfg, (enum lora_proj)p));
        CHECK(lora_model_proj_out(m, (enum lora_proj)p) ==
              lora_proj_out(&m->cfg, (enum lora_proj)p));
    }

    st = lora_safetensors_open(tmp_path("base/model.safetensors"), err, sizeof(err));
    CHECK(st != NULL);
    if (!st)
        goto out;
    for (int i = 0; i < st->n_tensors; i++)
        file_floats += (size_t)st->tensors[i].numel;
    /* The whole model in float32: every tensor of the file, once. */
    CHECK(m->weight_bytes == file_floats * sizeof(float));
    CHECK(differ_from_file(st, "model.embed_tokens.weight", m->embed) == 0);
    CHECK(differ_from_file(st, "model.norm.weight", m->final_norm) == 0);
    CHECK(differ_from_file(st, "lm_head.weight", m->lm_head) == 0);
    for (int l = 0; l < 2; l++) {
        const struct lora_layer *y = &m->layers[l];
        struct {
            const char *suffix;
            const float *got;
        } want[] = {
            {"input_layernorm.weight", y->attn_norm},
            {"post_attention_layernorm.weight", y->mlp_norm},
            {"self_attn.q_proj.weight", y->wq},
            {"self_attn.k_proj.weight", y->wk},
            {"self_attn.v_proj.weight", y->wv},
            {"self_attn.o_proj.weight", y->wo},
            {"mlp.gate_proj.weight", y->w_gate},
            {"mlp.up_proj.weight", y->w_up},
            {"mlp.down_proj.weight", y->w_down},
        };
        char name[128];

        CHECK(y->bq == NULL && y->bk == NULL && y->bv == NULL);
        for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++) {
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, want[k].suffix);
            if (differ_from_file(st, name, want[k].got) != 0) {
                printf("# %s differs from the file\n", name);
                check_cur_failed = 1;
            }
        }
    }
out:
    lora_safetensors_close(&st);
    lora_model_destroy(&m);
    CHECK(m == NULL);
}

/* Rank r's shard of a 2-D (rows, cols) tensor: rows [r0, r0 + nr) or columns [c0, c0 + nc). */
static long differ_rows(const float *full, const float *shard, long cols, long r0, long nr)
{
    return n_differ(full + r0 * cols, shard, nr * cols);
}

static long differ_cols(const float *full, const float *shard, long rows, long cols, long c0,
                        long nc)
{
    long bad = 0;

    for (long r = 0; r < rows; r++)
        bad += n_differ(full + r * cols + c0, shard + r * nc, nc);
    return bad;
}

static void test_tp2_shards(void)
{
    struct lora_model *full = load_ok(base_dir, 0, 1);
    struct lora_model *sh[2] = {load_ok(base_dir, 0, 2), load_ok(base_dir, 1, 2)};
    const long hidden = 64, q_dim = 32, kv_dim = 16, inter = 64; /* local widths */

    if (!full || !sh[0] || !sh[1])
        goto out;
    for (int r = 0; r < 2; r++) {
        const struct lora_model *m = sh[r];
        size_t want_floats;

        CHECK(m->tp_rank == r && m->tp_size == 2);
        CHECK(m->n_heads == 2 && m->n_kv_heads == 1 && m->inter == 64);
        CHECK(m->cfg.n_heads == 4 && m->cfg.intermediate_size == 128);
        CHECK(lora_model_proj_out(m, LORA_PROJ_Q) == 32 &&
              lora_model_proj_in(m, LORA_PROJ_Q) == 64);
        CHECK(lora_model_proj_out(m, LORA_PROJ_K) == 16);
        CHECK(lora_model_proj_in(m, LORA_PROJ_O) == 32 &&
              lora_model_proj_out(m, LORA_PROJ_O) == 64);
        CHECK(lora_model_proj_out(m, LORA_PROJ_UP) == 64);
        CHECK(lora_model_proj_in(m, LORA_PROJ_DOWN) == 64);
        /* Replicated: embedding, norms, LM head. Per layer: 2 norms, q, k, v, o, gate, up, down
         * at their local sizes. */
        want_floats = (size_t)(2 * 320 * 64 + 64) +
                      2 * (size_t)(2 * hidden + q_dim * hidden + 2 * kv_dim * hidden +
                                   hidden * q_dim + 3 * inter * hidden);
        CHECK(m->weight_bytes == want_floats * sizeof(float));
        CHECK(n_differ(full->embed, m->embed, 320 * 64) == 0);
        CHECK(n_differ(full->lm_head, m->lm_head, 320 * 64) == 0);
        CHECK(n_differ(full->final_norm, m->final_norm, 64) == 0);
        for (int l = 0; l < 2; l++) {
            const struct lora_layer *f = &full->layers[l], *y = &m->layers[l];

            CHECK(n_differ(f->attn_norm, y->attn_norm, hidden) == 0);
            CHECK(n_differ(f->mlp_norm, y->mlp_norm, hidden) == 0);
            CHECK(differ_rows(f->wq, y->wq, hidden, r * q_dim, q_dim) == 0);
            CHECK(differ_rows(f->wk, y->wk, hidden, r * kv_dim, kv_dim) == 0);
            CHECK(differ_rows(f->wv, y->wv, hidden, r * kv_dim, kv_dim) == 0);
            CHECK(differ_cols(f->wo, y->wo, hidden, 2 * q_dim, r * q_dim, q_dim) == 0);
            CHECK(differ_rows(f->w_gate, y->w_gate, hidden, r * inter, inter) == 0);
            CHECK(differ_rows(f->w_up, y->w_up, hidden, r * inter, inter) == 0);
            CHECK(differ_cols(f->w_down, y->w_down, hidden, 2 * inter, r * inter, inter) == 0);
        }
    }
    /* The brief's own statement of the split, spelled out for rank 1 of layer 0. */
    CHECK(memcmp(sh[1]->layers[0].wq, full->layers[0].wq + q_dim * hidden,
                 (size_t)(q_dim * hidden) * sizeof(float)) == 0);
    CHECK(sh[1]->layers[0].wo[5 * q_dim + 7] == full->layers[0].wo[5 * 2 * q_dim + q_dim + 7]);
out:
    lora_model_destroy(&full);
    lora_model_destroy(&sh[0]);
    lora_model_destroy(&sh[1]);
}

static void test_qwen2_bias_shards(void)
{
    struct lora_model *full = load_ok(qwen_dir, 0, 1), *r1 = load_ok(qwen_dir, 1, 2);
    struct lora_safetensors *st;
    char err[ERR_BYTES];

    if (!full || !r1)
        goto out;
    CHECK(full->cfg.qkv_bias);
    st = lora_safetensors_open(tmp_path("qwen2/model.safetensors"), err, sizeof(err));
    CHECK(differ_from_file(st, "model.layers.1.self_attn.q_proj.bias", full->layers[1].bq) == 0);
    CHECK(differ_from_file(st, "model.layers.1.self_attn.v_proj.bias", full->layers[1].bv) == 0);
    lora_safetensors_close(&st);
    for (int l = 0; l < 2; l++) {
        CHECK(n_differ(full->layers[l].bq + 32, r1->layers[l].bq, 32) == 0);
        CHECK(n_differ(full->layers[l].bk + 16, r1->layers[l].bk, 16) == 0);
        CHECK(n_differ(full->layers[l].bv + 16, r1->layers[l].bv, 16) == 0);
    }
out:
    lora_model_destroy(&full);
    lora_model_destroy(&r1);
}

static void test_bf16_model_loads(void)
{
    struct lora_model *m = load_ok(bf16_dir, 0, 1), *f32 = load_ok(base_dir, 0, 1);
    struct lora_safetensors *st;
    char err[ERR_BYTES];
    long bad = 0;

    if (!m || !f32)
        goto out;
    st = lora_safetensors_open(tmp_path("bf16/model.safetensors"), err, sizeof(err));
    CHECK(st && lora_safetensors_find(st, "model.layers.0.self_attn.q_proj.weight")->dtype ==
                    LORA_DTYPE_BF16);
    CHECK(differ_from_file(st, "model.embed_tokens.weight", m->embed) == 0);
    CHECK(differ_from_file(st, "model.layers.1.mlp.down_proj.weight", m->layers[1].w_down) == 0);
    CHECK(differ_from_file(st, "model.layers.0.self_attn.o_proj.weight", m->layers[0].wo) == 0);
    lora_safetensors_close(&st);
    /* Same seed, so each value is the f32 model's value rounded to bfloat16. */
    for (long i = 0; i < 64 * 64; i++) {
        uint16_t h = lora_f32_to_bf16(f32->layers[0].wq[i]);
        float want;

        lora_dtype_to_f32(LORA_DTYPE_BF16, &h, &want, 1);
        bad += want != m->layers[0].wq[i];
    }
    CHECK(bad == 0);
    CHECK(m->weight_bytes == f32->weight_bytes);
out:
    lora_model_destroy(&m);
    lora_model_destroy(&f32);
}

static void test_tied_model(void)
{
    struct lora_model *m = load_ok(tied_dir, 0, 1), *r1 = load_ok(tied_dir, 1, 2);

    if (m) {
        CHECK(m->cfg.tie_word_embeddings);
        CHECK(m->lm_head == m->embed);
    }
    if (r1)
        CHECK(r1->lm_head == r1->embed);
    lora_model_destroy(&m);
    lora_model_destroy(&r1);
}

static void test_sharded_model_loads(void)
{
    struct lora_model *m = load_ok(sharded_dir, 0, 1), *ref = load_ok(base_dir, 0, 1);

    if (!m || !ref)
        goto out;
    CHECK(m->n_files == 3);
    /* Values depend only on seed and tensor name, so the shards hold the base model. */
    CHECK(n_differ(ref->embed, m->embed, 320 * 64) == 0);
    CHECK(n_differ(ref->lm_head, m->lm_head, 320 * 64) == 0);
    CHECK(n_differ(ref->layers[1].w_down, m->layers[1].w_down, 64 * 128) == 0);
    CHECK(n_differ(ref->layers[0].wq, m->layers[0].wq, 64 * 64) == 0);
    CHECK(m->weight_bytes == ref->weight_bytes);
out:
    lora_model_destroy(&m);
    lora_model_destroy(&ref);
}

/* A hand-written file with its data at an odd offset: f32 tensors can no longer be used in place
 * and must be copied, with the same values. Also checks write_raw() itself. */
static void test_unaligned_f32_loads(void)
{
    const char *dir = gen_default_model("unaligned");
    struct tset s;
    struct lora_model *m = NULL, *ref = load_ok(base_dir, 1, 2);

    if (tset_read(&s, join(dir, "model.safetensors")) < 0)
        goto out;
    CHECK(write_raw(&s, join(dir, "model.safetensors"), LIE_NONE, NULL, true) == 0);
    tset_free(&s);
    m = load_ok(dir, 1, 2);
    if (!m || !ref)
        goto out;
    /* Copies are float-aligned; the mapping's data is not. */
    CHECK((uintptr_t)m->embed % sizeof(float) == 0);
    CHECK((uintptr_t)m->layers[0].wq % sizeof(float) == 0);
    CHECK((uintptr_t)m->layers[1].mlp_norm % sizeof(float) == 0);
    CHECK(n_differ(ref->embed, m->embed, 320 * 64) == 0);
    CHECK(n_differ(ref->layers[1].wq, m->layers[1].wq, 32 * 64) == 0);
    CHECK(n_differ(ref->layers[1].w_down, m->layers[1].w_down, 64 * 64) == 0);
    CHECK(n_differ(ref->layers[0].attn_norm, m->layers[0].attn_norm, 64) == 0);
out:
    lora_model_destroy(&m);
    lora_model_destroy(&ref);
}

/* ---- tests: malformed checkpoints --------------------------------------------------------- */

static void test_truncated_file(void)
{
    const char *dir = gen_default_model("truncated");
    const char *path = join(dir, "model.safetensors");
    long size = file_size(path);
    const char *e;

    CHECK(size > 1000);
    /* Cut into lm_head.weight, the last tensor's data. */
    CHECK(truncate(path, size - 100) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, path);
    CHECK_CONTAINS(e, "'lm_head.weight'");
    CHECK_CONTAINS(e, "truncated");
    /* Cut into the header. */
    CHECK(truncate(path, 100) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, path);
    /* Shorter than the header length itself. */
    CHECK(truncate(path, 4) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, path);
    CHECK_CONTAINS(e, "4 bytes");
    /* Empty. */
    CHECK(truncate(path, 0) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, path);
}

/* Rewrites dir/model.safetensors by hand with one lie about victim. */
static int rewrite_raw(const char *dir, enum lie lie, const char *victim)
{
    struct tset s;
    int rc;

    if (tset_read(&s, join(dir, "model.safetensors")) < 0)
        return -1;
    rc = write_raw(&s, join(dir, "model.safetensors"), lie, victim, false);
    tset_free(&s);
    return rc;
}

static void test_header_offsets_past_data(void)
{
    const char *dir = gen_default_model("past_end");
    const char *e;

    CHECK(rewrite_raw(dir, LIE_PAST_END, "model.layers.0.self_attn.k_proj.weight") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "'model.layers.0.self_attn.k_proj.weight'");
    CHECK_CONTAINS(e, "past the data section");
}

static void test_header_size_mismatch(void)
{
    const char *dir = gen_default_model("size_mismatch");
    const char *e;

    CHECK(rewrite_raw(dir, LIE_SIZE, "model.layers.1.mlp.gate_proj.weight") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "'model.layers.1.mlp.gate_proj.weight'");
    CHECK_CONTAINS(e, "size mismatch");
    CHECK_CONTAINS(e, "[128, 64]");
}

static void test_i64_tensor(void)
{
    const char *dir = gen_default_model("i64");
    const char *e;

    CHECK(rewrite_raw(dir, LIE_I64, "model.layers.0.self_attn.v_proj.weight") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "'model.layers.0.self_attn.v_proj.weight'");
    CHECK_CONTAINS(e, "dtype I64");
}

static void test_missing_tensor(void)
{
    const char *dir = gen_default_model("missing");
    struct tset s;
    const char *e;

    if (tset_read(&s, join(dir, "model.safetensors")) < 0)
        return;
    CHECK(tset_drop(&s, "model.layers.1.mlp.up_proj.weight") == 0);
    CHECK(tset_write(&s, join(dir, "model.safetensors")) == 0);
    tset_free(&s);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
    e = load_err(dir, 1, 2);
    CHECK_CONTAINS(e, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
}

/* Every tensor of the Qwen2 model (the superset: it has q/k/v biases) is required. */
static void test_every_tensor_required(void)
{
    struct lora_gen_model_opts o;
    struct tset full;
    const char *dir;

    lora_gen_model_defaults(&o);
    o.arch = LORA_ARCH_QWEN2;
    dir = gen_model("each_missing", &o);
    if (tset_read(&full, join(dir, "model.safetensors")) < 0)
        return;
    CHECK(full.n == 1 + 2 * 12 + 1 + 1);
    for (int i = 0; i < full.n; i++) {
        struct tset s;
        char want[256];
        const char *e;

        if (tset_read(&s, join(qwen_dir, "model.safetensors")) < 0)
            break;
        tset_drop(&s, full.names[i]);
        CHECK(tset_write(&s, join(dir, "model.safetensors")) == 0);
        tset_free(&s);
        e = load_err(dir, 0, 1);
        snprintf(want, sizeof(want), "missing tensor '%s'", full.names[i]);
        CHECK_CONTAINS(e, want);
        CHECK_CONTAINS(e, join(dir, "model.safetensors"));
    }
    tset_free(&full);
}

/* Gives one tensor of a fresh default model the shape (d0) or (d0, d1) and loads it. */
static const char *load_reshaped(const char *name, const char *tensor, int n_dims, int64_t d0,
                                 int64_t d1, int rank, int size)
{
    const char *dir = gen_default_model(name);
    struct tset s;

    if (tset_read(&s, join(dir, "model.safetensors")) < 0)
        return "";
    CHECK(tset_reshape(&s, tensor, n_dims, d0, d1) == 0);
    CHECK(tset_write(&s, join(dir, "model.safetensors")) == 0);
    tset_free(&s);
    return load_err(dir, rank, size);
}

static void test_wrong_shape(void)
{
    const char *e;

    e = load_reshaped("shape_q", "model.layers.0.self_attn.q_proj.weight", 2, 65, 64, 0, 1);
    CHECK_CONTAINS(e, tmp_path("shape_q/model.safetensors"));
    CHECK_CONTAINS(e, "'model.layers.0.self_attn.q_proj.weight' has shape [65, 64], expected "
                      "[64, 64]");
    /* The full shape is checked, not only this shard's part of it. */
    e = load_reshaped("shape_q2", "model.layers.0.self_attn.q_proj.weight", 2, 65, 64, 1, 2);
    CHECK_CONTAINS(e, "has shape [65, 64], expected [64, 64]");
    e = load_reshaped("shape_down", "model.layers.1.mlp.down_proj.weight", 2, 64, 127, 0, 1);
    CHECK_CONTAINS(e, "'model.layers.1.mlp.down_proj.weight' has shape [64, 127], expected "
                      "[64, 128]");
    e = load_reshaped("shape_norm", "model.norm.weight", 1, 63, 0, 0, 1);
    CHECK_CONTAINS(e, "'model.norm.weight' has shape [63], expected [64]");
    /* The right element count as a vector is still the wrong shape. */
    e = load_reshaped("shape_flat", "model.embed_tokens.weight", 1, 320 * 64, 0, 0, 1);
    CHECK_CONTAINS(e, "'model.embed_tokens.weight' has shape [20480], expected [320, 64]");
    /* A transposed projection. */
    e = load_reshaped("shape_t", "model.layers.0.self_attn.k_proj.weight", 2, 64, 32, 0, 1);
    CHECK_CONTAINS(e, "'model.layers.0.self_attn.k_proj.weight' has shape [64, 32], expected "
                      "[32, 64]");
}

static void test_unknown_architecture(void)
{
    const char *dir = gen_default_model("arch");
    const char *e;

    CHECK(json_file_set(join(dir, "config.json"), "architectures",
                        json_pack("[s]", "GPT2LMHeadModel")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "config.json"));
    CHECK_CONTAINS(e, "unknown architecture 'GPT2LMHeadModel'");
}

static void test_missing_config(void)
{
    const char *dir = gen_default_model("no_config");
    const char *e;

    CHECK(unlink(join(dir, "config.json")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "config.json"));
    CHECK_CONTAINS(e, "No such file");
    e = load_err(tmp_path("no_such_dir"), 0, 1);
    CHECK_CONTAINS(e, tmp_path("no_such_dir/config.json"));
}

static void test_missing_weights_file(void)
{
    const char *dir = gen_default_model("no_weights");
    const char *e;

    CHECK(unlink(join(dir, "model.safetensors")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "No such file");
}

static const char *gen_sharded(const char *name)
{
    struct lora_gen_model_opts o;

    lora_gen_model_defaults(&o);
    o.n_shards = 2;
    return gen_model(name, &o);
}

static void test_index_names_missing_shard(void)
{
    const char *dir = gen_sharded("lost_shard");
    const char *e;

    CHECK(unlink(join(dir, "model-00002-of-00002.safetensors")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model-00002-of-00002.safetensors"));
    CHECK_CONTAINS(e, "No such file");
}

/* Adds name -> file to the index's weight_map. */
static int index_map(const char *dir, const char *name, const char *file)
{
    const char *path = join(dir, "model.safetensors.index.json");
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_PRESERVE_ORDER, &jerr);
    int rc = -1;

    if (root &&
        json_object_set_new(json_object_get(root, "weight_map"), name, json_string(file)) == 0)
        rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc;
}

static void test_index_names_absent_tensor(void)
{
    const char *dir = gen_sharded("absent_tensor");
    const char *e;

    CHECK(index_map(dir, "model.layers.0.self_attn.rotary_emb.inv_freq",
                    "model-00001-of-00002.safetensors") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model-00001-of-00002.safetensors"));
    CHECK_CONTAINS(e, "missing tensor 'model.layers.0.self_attn.rotary_emb.inv_freq'");
    CHECK_CONTAINS(e, "model.safetensors.index.json");
}

/* The index lists a file name that would leave the model directory. */
static void test_index_names_bad_file(void)
{
    const char *dir = gen_sharded("bad_file_name");
    const char *e;

    CHECK(index_map(dir, "model.norm.weight", "../base/model.safetensors") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, "model.safetensors.index.json");
    CHECK_CONTAINS(e, "'model.norm.weight'");
    CHECK_CONTAINS(e, "invalid file name");
}

/* A tensor missing from both the shards and the index: named, with where it was looked for. */
static void test_sharded_missing_tensor(void)
{
    const char *dir = gen_sharded("sharded_missing");
    const char *name = "model.layers.1.self_attn.o_proj.weight";
    const char *ipath = join(dir, "model.safetensors.index.json");
    json_error_t jerr;
    json_t *root = json_load_file(ipath, JSON_PRESERVE_ORDER, &jerr);
    const char *shard =
        json_string_value(json_object_get(json_object_get(root, "weight_map"), name));
    struct tset s;
    const char *e;

    CHECK(shard != NULL);
    if (!shard || tset_read(&s, join(dir, shard)) < 0) {
        json_decref(root);
        return;
    }
    CHECK(tset_drop(&s, name) == 0);
    CHECK(tset_write(&s, join(dir, shard)) == 0);
    tset_free(&s);
    json_object_del(json_object_get(root, "weight_map"), name);
    CHECK(json_dump_file(root, ipath, JSON_INDENT(2)) == 0);
    json_decref(root);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, dir);
    CHECK_CONTAINS(e, "missing tensor 'model.layers.1.self_attn.o_proj.weight'");
}

/* An index that is not valid JSON must be reported as such, not skipped in favour of a
 * model.safetensors that does not exist. */
static void test_index_invalid_json(void)
{
    const char *dir = gen_sharded("index_json");
    const char *e;

    CHECK(write_text(join(dir, "model.safetensors.index.json"), "{\"weight_map\": {") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors.index.json"));
}

static void test_index_weight_map_not_object(void)
{
    const char *dir = gen_sharded("index_map");
    const char *e;

    CHECK(json_file_set(join(dir, "model.safetensors.index.json"), "weight_map",
                        json_string("model-00001-of-00002.safetensors")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, join(dir, "model.safetensors.index.json"));
    CHECK_CONTAINS(e, "'weight_map'");
}

static void test_split_not_divisible(void)
{
    struct lora_gen_model_opts o;
    const char *e, *dir;

    e = load_err(base_dir, 0, 3);
    CHECK_CONTAINS(e, base_dir);
    CHECK_CONTAINS(e, "num_attention_heads (4) is not divisible by tensor-parallel size 3");
    e = load_err(base_dir, 3, 4);
    CHECK_CONTAINS(e, "num_key_value_heads (2) is not divisible by tensor-parallel size 4");
    lora_gen_model_defaults(&o);
    o.intermediate_size = 129;
    dir = gen_model("inter129", &o);
    e = load_err(dir, 1, 2);
    CHECK_CONTAINS(e, dir);
    CHECK_CONTAINS(e, "intermediate_size (129) is not divisible by tensor-parallel size 2");
}

static void test_invalid_tp_rank(void)
{
    const int bad[][2] = {{2, 2}, {-1, 2}, {0, 0}, {0, -1}, {5, 4}};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[64];
        const char *e = load_err(base_dir, bad[i][0], bad[i][1]);

        snprintf(want, sizeof(want), "invalid tensor-parallel rank %d of %d", bad[i][0], bad[i][1]);
        CHECK_CONTAINS(e, base_dir);
        CHECK_CONTAINS(e, want);
    }
}

/* A caller without an error buffer still gets NULL, never a crash. */
static void test_no_error_buffer(void)
{
    CHECK(lora_model_load(tmp_path("no_such_dir"), 0, 1, NULL, 0) == NULL);
    CHECK(lora_model_load(base_dir, 2, 2, NULL, 0) == NULL);
    CHECK(lora_model_load(tmp_path("truncated"), 0, 1, NULL, 0) == NULL);
    CHECK(lora_model_load(tmp_path("missing"), 0, 1, NULL, 0) == NULL);
    /* A one-byte buffer holds the empty string. */
    char one[1] = {'x'};
    CHECK(lora_model_load(tmp_path("shape_q"), 0, 1, one, sizeof(one)) == NULL);
    CHECK(one[0] == '\0');
}

/* Loading and destroying again and again; the sanitizer build checks nothing leaks. */
static void test_reload(void)
{
    for (int i = 0; i < 8; i++) {
        struct lora_model *m = load_ok(i % 2 ? bf16_dir : sharded_dir, i % 2, 2);

        CHECK(m != NULL);
        lora_model_destroy(&m);
        CHECK(m == NULL);
    }
    lora_model_destroy(NULL);
}

int main(void)
{
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_fixtures_written);
    RUN(test_good_model_loads);
    RUN(test_tp2_shards);
    RUN(test_qwen2_bias_shards);
    RUN(test_bf16_model_loads);
    RUN(test_tied_model);
    RUN(test_sharded_model_loads);
    RUN(test_unaligned_f32_loads);
    RUN(test_truncated_file);
    RUN(test_header_offsets_past_data);
    RUN(test_header_size_mismatch);
    RUN(test_i64_tensor);
    RUN(test_missing_tensor);
    RUN(test_every_tensor_required);
    RUN(test_wrong_shape);
    RUN(test_unknown_architecture);
    RUN(test_missing_config);
    RUN(test_missing_weights_file);
    RUN(test_index_names_missing_shard);
    RUN(test_index_names_absent_tensor);
    RUN(test_index_names_bad_file);
    RUN(test_sharded_missing_tensor);
    RUN(test_index_invalid_json);
    RUN(test_index_weight_map_not_object);
    RUN(test_split_not_divisible);
    RUN(test_invalid_tp_rank);
    RUN(test_no_error_buffer);
    RUN(test_reload);
    remove_tree(tmp_dir);
    return check_done();
}
