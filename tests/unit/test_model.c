/* Unit tests for lib/runtime/model: generated checkpoints (lib/runtime/synthetic) load with the
 * dimensions of their config.json and the values of their safetensors files, read back
 * independently through lora_safetensors_open; tensor-parallel shards hold exactly their rows or
 * columns of the full model; and every malformed checkpoint (truncated file, lying header, missing
 * or misshapen tensor, integer dtype, bad config, broken shard index, impossible split) fails with
 * one message naming the file and the tensor. Fixtures live in a mkdtemp directory removed at the
 * end.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "fixture.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"

#define ERR_BYTES 1024

/* ---- files -------------------------------------------------------------------------------- */

static long file_size(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static const char *gen_default_model(const char *name)
{
    struct lora_synthetic_model_opts o;

    lora_synthetic_model_defaults(&o);
    return fx_gen_model(name, &o);
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
static int write_raw(const struct fx_tset *s, const char *path, enum lie lie, const char *victim,
                     bool unaligned)
{
    json_t *hdr = json_object();
    size_t data_bytes = 0, at;
    int64_t begin[FX_MAX_TENSORS], end[FX_MAX_TENSORS];
    int rc = -1;

    for (int i = 0; i < s->n; i++) {
        bool is_victim = victim && strcmp(s->names[i], victim) == 0;
        size_t esize = is_victim && lie == LIE_I64 ? 8 : 4;

        begin[i] = (int64_t)data_bytes;
        data_bytes += (size_t)fx_tensor_numel(&s->t[i]) * esize;
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
            memcpy(buf + at + begin[i], s->data[i],
                   (size_t)fx_tensor_numel(&s->t[i]) * sizeof(float));
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

/* A weight's data: the CPU backend keeps every tensor in host memory. */
#define H(t) ((const float *)lora_tensor_host(&(t)))

/* ---- loading ------------------------------------------------------------------------------ */

static char err_buf[ERR_BYTES];

/* Loads dir as shard rank of size, expecting failure; returns the message (one line). */
static const char *load_err(const char *dir, int rank, int size)
{
    struct lora_model *m;

    memset(err_buf, 0, sizeof(err_buf));
    m = lora_model_load(fx_backend(), dir, rank, size, NULL, err_buf, sizeof(err_buf));
    CHECK(m == NULL);
    lora_model_destroy(&m);
    CHECK(err_buf[0] != '\0');
    CHECK(strchr(err_buf, '\n') == NULL);
    if (getenv("LORA_TEST_VERBOSE"))
        printf("# error: %s\n", err_buf);
    return err_buf;
}

/* Loads dir as shard rank of size with the flags' precision (NULL: every choice auto). */
static struct lora_model *load_as(const char *dir, int rank, int size, const char *dtype,
                                  const char *quantization)
{
    char err[ERR_BYTES] = "";
    struct lora_precision p;
    lora_precision_defaults(&p);
    CHECK(lora_precision_parse(&p, dtype, quantization, NULL, NULL, NULL, err, sizeof(err)) == 0);
    struct lora_model *m = lora_model_load(fx_backend(), dir, rank, size, &p, err, sizeof(err));

    if (!m) {
        printf("# load %s (%d of %d): %s\n", dir, rank, size, err);
        check_cur_failed = 1;
    }
    return m;
}

static struct lora_model *load_ok(const char *dir, int rank, int size)
{
    return load_as(dir, rank, size, "float32", NULL);
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
    bad = fx_n_differ(want, got, (long)t->numel);
    free(want);
    return bad;
}

/* ---- tests: good models ------------------------------------------------------------------- */

static const char *base_dir, *bf16_dir, *tied_dir, *sharded_dir, *qwen_dir;

static void test_fixtures_written(void)
{
    static char base[FX_PATH_BYTES], bf16[FX_PATH_BYTES], tied[FX_PATH_BYTES],
        sharded[FX_PATH_BYTES], qwen[FX_PATH_BYTES];
    struct lora_synthetic_model_opts o;

    snprintf(base, sizeof(base), "%s", gen_default_model("base"));
    lora_synthetic_model_defaults(&o);
    o.dtype = LORA_DTYPE_BF16;
    snprintf(bf16, sizeof(bf16), "%s", fx_gen_model("bf16", &o));
    lora_synthetic_model_defaults(&o);
    o.tie_word_embeddings = true;
    snprintf(tied, sizeof(tied), "%s", fx_gen_model("tied", &o));
    lora_synthetic_model_defaults(&o);
    o.n_shards = 3;
    snprintf(sharded, sizeof(sharded), "%s", fx_gen_model("sharded", &o));
    lora_synthetic_model_defaults(&o);
    o.arch = LORA_ARCH_QWEN2;
    snprintf(qwen, sizeof(qwen), "%s", fx_gen_model("qwen2", &o));
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
    CHECK(H(m->lm_head) != H(m->embed));
    for (int p = 0; p < LORA_PROJ_COUNT; p++) {
        CHECK(lora_model_proj_in(m, (enum lora_proj)p) == lora_proj_in(&m->cfg, (enum lora_proj)p));
        CHECK(lora_model_proj_out(m, (enum lora_proj)p) ==
              lora_proj_out(&m->cfg, (enum lora_proj)p));
    }

    st = lora_safetensors_open(fx_tmp_path("base/model.safetensors"), err, sizeof(err));
    CHECK(st != NULL);
    if (!st)
        goto out;
    for (int i = 0; i < st->n_tensors; i++)
        file_floats += (size_t)st->tensors[i].numel;
    /* The whole model in float32: every tensor of the file, once. */
    CHECK(m->weight_bytes == file_floats * sizeof(float));
    CHECK(differ_from_file(st, "model.embed_tokens.weight", H(m->embed)) == 0);
    CHECK(differ_from_file(st, "model.norm.weight", H(m->final_norm)) == 0);
    CHECK(differ_from_file(st, "lm_head.weight", H(m->lm_head)) == 0);
    for (int l = 0; l < 2; l++) {
        const struct lora_layer *y = &m->layers[l];
        struct {
            const char *suffix;
            const float *got;
        } want[] = {
            {"input_layernorm.weight", H(y->attn_norm)},
            {"post_attention_layernorm.weight", H(y->mlp_norm)},
            {"self_attn.q_proj.weight", H(y->wq)},
            {"self_attn.k_proj.weight", H(y->wk)},
            {"self_attn.v_proj.weight", H(y->wv)},
            {"self_attn.o_proj.weight", H(y->wo)},
            {"mlp.gate_proj.weight", H(y->w_gate)},
            {"mlp.up_proj.weight", H(y->w_up)},
            {"mlp.down_proj.weight", H(y->w_down)},
        };
        char name[128];

        CHECK(H(y->bq) == NULL && H(y->bk) == NULL && H(y->bv) == NULL);
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
    return fx_n_differ(full + r0 * cols, shard, nr * cols);
}

static long differ_cols(const float *full, const float *shard, long rows, long cols, long c0,
                        long nc)
{
    long bad = 0;

    for (long r = 0; r < rows; r++)
        bad += fx_n_differ(full + r * cols + c0, shard + r * nc, nc);
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
        CHECK(fx_n_differ(H(full->embed), H(m->embed), 320 * 64) == 0);
        CHECK(fx_n_differ(H(full->lm_head), H(m->lm_head), 320 * 64) == 0);
        CHECK(fx_n_differ(H(full->final_norm), H(m->final_norm), 64) == 0);
        for (int l = 0; l < 2; l++) {
            const struct lora_layer *f = &full->layers[l], *y = &m->layers[l];

            CHECK(fx_n_differ(H(f->attn_norm), H(y->attn_norm), hidden) == 0);
            CHECK(fx_n_differ(H(f->mlp_norm), H(y->mlp_norm), hidden) == 0);
            CHECK(differ_rows(H(f->wq), H(y->wq), hidden, r * q_dim, q_dim) == 0);
            CHECK(differ_rows(H(f->wk), H(y->wk), hidden, r * kv_dim, kv_dim) == 0);
            CHECK(differ_rows(H(f->wv), H(y->wv), hidden, r * kv_dim, kv_dim) == 0);
            CHECK(differ_cols(H(f->wo), H(y->wo), hidden, 2 * q_dim, r * q_dim, q_dim) == 0);
            CHECK(differ_rows(H(f->w_gate), H(y->w_gate), hidden, r * inter, inter) == 0);
            CHECK(differ_rows(H(f->w_up), H(y->w_up), hidden, r * inter, inter) == 0);
            CHECK(differ_cols(H(f->w_down), H(y->w_down), hidden, 2 * inter, r * inter, inter) ==
                  0);
        }
    }
    /* The brief's own statement of the split, spelled out for rank 1 of layer 0. */
    CHECK(memcmp(H(sh[1]->layers[0].wq), H(full->layers[0].wq) + q_dim * hidden,
                 (size_t)(q_dim * hidden) * sizeof(float)) == 0);
    CHECK(H(sh[1]->layers[0].wo)[5 * q_dim + 7] ==
          H(full->layers[0].wo)[5 * 2 * q_dim + q_dim + 7]);
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
    st = lora_safetensors_open(fx_tmp_path("qwen2/model.safetensors"), err, sizeof(err));
    CHECK(differ_from_file(st, "model.layers.1.self_attn.q_proj.bias", H(full->layers[1].bq)) == 0);
    CHECK(differ_from_file(st, "model.layers.1.self_attn.v_proj.bias", H(full->layers[1].bv)) == 0);
    lora_safetensors_close(&st);
    for (int l = 0; l < 2; l++) {
        CHECK(fx_n_differ(H(full->layers[l].bq) + 32, H(r1->layers[l].bq), 32) == 0);
        CHECK(fx_n_differ(H(full->layers[l].bk) + 16, H(r1->layers[l].bk), 16) == 0);
        CHECK(fx_n_differ(H(full->layers[l].bv) + 16, H(r1->layers[l].bv), 16) == 0);
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
    st = lora_safetensors_open(fx_tmp_path("bf16/model.safetensors"), err, sizeof(err));
    CHECK(st && lora_safetensors_find(st, "model.layers.0.self_attn.q_proj.weight")->dtype ==
                    LORA_DTYPE_BF16);
    CHECK(differ_from_file(st, "model.embed_tokens.weight", H(m->embed)) == 0);
    CHECK(differ_from_file(st, "model.layers.1.mlp.down_proj.weight", H(m->layers[1].w_down)) == 0);
    CHECK(differ_from_file(st, "model.layers.0.self_attn.o_proj.weight", H(m->layers[0].wo)) == 0);
    lora_safetensors_close(&st);
    /* Same seed, so each value is the f32 model's value rounded to bfloat16. */
    for (long i = 0; i < 64 * 64; i++) {
        uint16_t h = lora_f32_to_bf16(H(f32->layers[0].wq)[i]);
        float want;

        lora_dtype_to_f32(LORA_DTYPE_BF16, &h, &want, 1);
        bad += want != H(m->layers[0].wq)[i];
    }
    CHECK(bad == 0);
    CHECK(m->weight_bytes == f32->weight_bytes);
out:
    lora_model_destroy(&m);
    lora_model_destroy(&f32);
}

/* Whether t is used in place: a view of m's file mapping, not a buffer of its own. */
static bool in_place(const struct lora_model *m, const struct lora_tensor *t)
{
    for (int i = 0; i < m->n_files; i++) {
        const char *map = m->files[i]->map, *at = lora_tensor_host(t);
        if (t->buf->wrapped && at >= map && at < map + m->files[i]->map_bytes)
            return true;
    }
    return false;
}

static void test_bf16_kept_in_place(void)
{
    struct lora_model *m = load_as(bf16_dir, 0, 1, NULL, NULL), *f32 = load_ok(bf16_dir, 0, 1);
    struct lora_model *r1 = load_as(bf16_dir, 1, 2, "auto", NULL);

    if (!m || !f32 || !r1)
        goto out;
    CHECK(m->weight_dtype == LORA_DTYPE_BF16 && m->base_dtype == LORA_DTYPE_BF16);
    /* One rank takes every projection whole: each one is a view of the file, the column-split
     * ones (o_proj, down_proj) too. */
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct lora_layer *y = &m->layers[l];
        const struct lora_tensor *ws[] = {&y->wq, &y->wk, &y->wv, &y->wo,
                                          &y->w_gate, &y->w_up, &y->w_down};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            CHECK(ws[i]->dtype == LORA_DTYPE_BF16 && in_place(m, ws[i]));
    }
    CHECK(m->embed.dtype == LORA_DTYPE_BF16 && in_place(m, &m->embed));
    CHECK(m->lm_head.dtype == LORA_DTYPE_BF16 && in_place(m, &m->lm_head));
    /* Norms are read in float32 by every kernel: converted, a buffer of their own. */
    CHECK(m->layers[0].attn_norm.dtype == LORA_DTYPE_F32 && !in_place(m, &m->layers[0].attn_norm));
    /* Half the bytes of the float32 copy, less the norms (float32 in both). */
    size_t norms = (size_t)(2 * m->cfg.n_layers + 1) * m->cfg.hidden_size * sizeof(float);
    CHECK((m->weight_bytes - norms) * 2 == f32->weight_bytes - norms);
    /* A shard: row slices are views of the file; column slices are copied once. */
    CHECK(r1->layers[0].wq.dtype == LORA_DTYPE_BF16 && in_place(r1, &r1->layers[0].wq));
    CHECK(r1->layers[0].wo.dtype == LORA_DTYPE_BF16 && !in_place(r1, &r1->layers[0].wo));
    float row[128];
    int64_t cols = r1->layers[0].wo.cols;
    CHECK(cols <= 128);
    /* Row 3 of rank 1's o_proj is columns [cols, 2 cols) of row 3 of the whole one. */
    lora_tensor_row_to_f32(LORA_DTYPE_BF16, lora_tensor_host(&r1->layers[0].wo),
                           r1->layers[0].wo.rows, cols, 3, row);
    CHECK(fx_n_differ(row, H(f32->layers[0].wo) + 3 * f32->layers[0].wo.cols + cols, cols) == 0);
out:
    lora_model_destroy(&m);
    lora_model_destroy(&f32);
    lora_model_destroy(&r1);
}

static void test_int8_quantized(void)
{
    struct lora_model *q = load_as(base_dir, 0, 1, NULL, "int8"), *f = load_ok(base_dir, 0, 1);
    struct lora_model *q1 = load_as(base_dir, 1, 2, "bfloat16", "int8");

    if (!q || !f || !q1)
        goto out;
    CHECK(q->weight_dtype == LORA_DTYPE_I8 && q->base_dtype == LORA_DTYPE_F32);
    CHECK(q1->weight_dtype == LORA_DTYPE_I8 && q1->base_dtype == LORA_DTYPE_BF16);
    CHECK(q->lm_head.dtype == LORA_DTYPE_I8 && q->layers[1].w_down.dtype == LORA_DTYPE_I8);
    CHECK(q->layers[0].mlp_norm.dtype == LORA_DTYPE_F32);
    /* Every dequantized weight within half a step of its float32 value: a step is the largest
     * magnitude of the weights sharing its scale over 127, at most the row's. */
    const struct lora_tensor *t = &q->layers[1].w_gate;
    float *row = malloc((size_t)t->cols * sizeof(float));
    long bad = 0;
    for (int64_t r = 0; r < t->rows; r++) {
        const float *want = H(f->layers[1].w_gate) + r * t->cols;
        float amax = 0; /* of the row: a bound on its groups' */
        for (int64_t k = 0; k < t->cols; k++)
            amax = fabsf(want[k]) > amax ? fabsf(want[k]) : amax;
        lora_tensor_row_to_f32(LORA_DTYPE_I8, lora_tensor_host(t), t->rows, t->cols, r, row);
        for (int64_t k = 0; k < t->cols; k++)
            bad += fabsf(row[k] - want[k]) > amax / 127 / 2 * 1.0001f;
    }
    free(row);
    CHECK(bad == 0);
    /* Each projection's bytes: one per weight (whole groups of LORA_I8_GROUP) and a float32
     * scale per group. */
    CHECK(lora_tensor_bytes(LORA_DTYPE_I8, t->rows, t->cols) ==
          (size_t)t->rows * ((t->cols + LORA_I8_GROUP - 1) / LORA_I8_GROUP) *
              (LORA_I8_GROUP + sizeof(float)));
    /* An untied embedding is only looked up: it stays in the base dtype. */
    CHECK(q->embed.dtype == LORA_DTYPE_F32 && q1->embed.dtype == LORA_DTYPE_BF16);
    /* A tied one is the LM head: quantized once, looked up and multiplied as int8. */
    struct lora_model *tied = load_as(tied_dir, 0, 1, NULL, "int8");
    CHECK(tied && tied->lm_head.dtype == LORA_DTYPE_I8 &&
          lora_tensor_host(&tied->lm_head) == lora_tensor_host(&tied->embed));
    lora_model_destroy(&tied);
out:
    lora_model_destroy(&q);
    lora_model_destroy(&f);
    lora_model_destroy(&q1);
}

static void test_tied_model(void)
{
    struct lora_model *m = load_ok(tied_dir, 0, 1), *r1 = load_ok(tied_dir, 1, 2);

    if (m) {
        CHECK(m->cfg.tie_word_embeddings);
        CHECK(H(m->lm_head) == H(m->embed));
    }
    if (r1)
        CHECK(H(r1->lm_head) == H(r1->embed));
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
    CHECK(fx_n_differ(H(ref->embed), H(m->embed), 320 * 64) == 0);
    CHECK(fx_n_differ(H(ref->lm_head), H(m->lm_head), 320 * 64) == 0);
    CHECK(fx_n_differ(H(ref->layers[1].w_down), H(m->layers[1].w_down), 64 * 128) == 0);
    CHECK(fx_n_differ(H(ref->layers[0].wq), H(m->layers[0].wq), 64 * 64) == 0);
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
    struct fx_tset s;
    struct lora_model *m = NULL, *ref = load_ok(base_dir, 1, 2);

    if (fx_tset_read(&s, fx_join(dir, "model.safetensors")) < 0)
        goto out;
    CHECK(write_raw(&s, fx_join(dir, "model.safetensors"), LIE_NONE, NULL, true) == 0);
    fx_tset_free(&s);
    m = load_ok(dir, 1, 2);
    if (!m || !ref)
        goto out;
    /* Copies are float-aligned; the mapping's data is not. */
    CHECK((uintptr_t)H(m->embed) % sizeof(float) == 0);
    CHECK((uintptr_t)H(m->layers[0].wq) % sizeof(float) == 0);
    CHECK((uintptr_t)H(m->layers[1].mlp_norm) % sizeof(float) == 0);
    CHECK(fx_n_differ(H(ref->embed), H(m->embed), 320 * 64) == 0);
    CHECK(fx_n_differ(H(ref->layers[1].wq), H(m->layers[1].wq), 32 * 64) == 0);
    CHECK(fx_n_differ(H(ref->layers[1].w_down), H(m->layers[1].w_down), 64 * 64) == 0);
    CHECK(fx_n_differ(H(ref->layers[0].attn_norm), H(m->layers[0].attn_norm), 64) == 0);
out:
    lora_model_destroy(&m);
    lora_model_destroy(&ref);
}

/* ---- tests: malformed checkpoints --------------------------------------------------------- */

static void test_truncated_file(void)
{
    const char *dir = gen_default_model("truncated");
    const char *path = fx_join(dir, "model.safetensors");
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

/* A FIFO in place of the weights or of config.json fails at once (opened for reading, a FIFO
 * would block until a writer came), naming the file and what it is. */
static void test_fifo_in_model_dir(void)
{
    const char *dir = gen_default_model("fifo");
    const char *path = fx_join(dir, "model.safetensors");
    const char *e;

    CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, path);
    CHECK_CONTAINS(e, "not a regular file (a FIFO)");
    path = fx_join(dir, "config.json");
    CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, path);
    CHECK_CONTAINS(e, "not a regular file");
}

/* Rewrites dir/model.safetensors by hand with one lie about victim. */
static int rewrite_raw(const char *dir, enum lie lie, const char *victim)
{
    struct fx_tset s;
    int rc;

    if (fx_tset_read(&s, fx_join(dir, "model.safetensors")) < 0)
        return -1;
    rc = write_raw(&s, fx_join(dir, "model.safetensors"), lie, victim, false);
    fx_tset_free(&s);
    return rc;
}

static void test_header_offsets_past_data(void)
{
    const char *dir = gen_default_model("past_end");
    const char *e;

    CHECK(rewrite_raw(dir, LIE_PAST_END, "model.layers.0.self_attn.k_proj.weight") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "'model.layers.0.self_attn.k_proj.weight'");
    CHECK_CONTAINS(e, "past the data section");
}

static void test_header_size_mismatch(void)
{
    const char *dir = gen_default_model("size_mismatch");
    const char *e;

    CHECK(rewrite_raw(dir, LIE_SIZE, "model.layers.1.mlp.gate_proj.weight") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors"));
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
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "'model.layers.0.self_attn.v_proj.weight'");
    CHECK_CONTAINS(e, "dtype I64");
}

static void test_missing_tensor(void)
{
    const char *dir = gen_default_model("missing");
    struct fx_tset s;
    const char *e;

    if (fx_tset_read(&s, fx_join(dir, "model.safetensors")) < 0)
        return;
    CHECK(fx_tset_drop(&s, "model.layers.1.mlp.up_proj.weight") == 0);
    CHECK(fx_tset_write(&s, fx_join(dir, "model.safetensors")) == 0);
    fx_tset_free(&s);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
    e = load_err(dir, 1, 2);
    CHECK_CONTAINS(e, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
}

/* Every tensor of the Qwen2 model (the superset: it has q/k/v biases) is required. */
static void test_every_tensor_required(void)
{
    struct lora_synthetic_model_opts o;
    struct fx_tset full;
    const char *dir;

    lora_synthetic_model_defaults(&o);
    o.arch = LORA_ARCH_QWEN2;
    dir = fx_gen_model("each_missing", &o);
    if (fx_tset_read(&full, fx_join(dir, "model.safetensors")) < 0)
        return;
    CHECK(full.n == 1 + 2 * 12 + 1 + 1);
    for (int i = 0; i < full.n; i++) {
        struct fx_tset s;
        char want[256];
        const char *e;

        if (fx_tset_read(&s, fx_join(qwen_dir, "model.safetensors")) < 0)
            break;
        fx_tset_drop(&s, full.names[i]);
        CHECK(fx_tset_write(&s, fx_join(dir, "model.safetensors")) == 0);
        fx_tset_free(&s);
        e = load_err(dir, 0, 1);
        snprintf(want, sizeof(want), "missing tensor '%s'", full.names[i]);
        CHECK_CONTAINS(e, want);
        CHECK_CONTAINS(e, fx_join(dir, "model.safetensors"));
    }
    fx_tset_free(&full);
}

/* Gives one tensor of a fresh default model the shape (d0) or (d0, d1) and loads it. */
static const char *load_reshaped(const char *name, const char *tensor, int n_dims, int64_t d0,
                                 int64_t d1, int rank, int size)
{
    const char *dir = gen_default_model(name);
    struct fx_tset s;

    if (fx_tset_read(&s, fx_join(dir, "model.safetensors")) < 0)
        return "";
    CHECK(fx_tset_reshape(&s, tensor, n_dims, d0, d1) == 0);
    CHECK(fx_tset_write(&s, fx_join(dir, "model.safetensors")) == 0);
    fx_tset_free(&s);
    return load_err(dir, rank, size);
}

static void test_wrong_shape(void)
{
    const char *e;

    e = load_reshaped("shape_q", "model.layers.0.self_attn.q_proj.weight", 2, 65, 64, 0, 1);
    CHECK_CONTAINS(e, fx_tmp_path("shape_q/model.safetensors"));
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

    CHECK(fx_json_file_set(fx_join(dir, "config.json"), "architectures",
                           json_pack("[s]", "GPT2LMHeadModel")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "config.json"));
    CHECK_CONTAINS(e, "unknown architecture 'GPT2LMHeadModel'");
}

static void test_missing_config(void)
{
    const char *dir = gen_default_model("no_config");
    const char *e;

    CHECK(unlink(fx_join(dir, "config.json")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "config.json"));
    CHECK_CONTAINS(e, "No such file");
    e = load_err(fx_tmp_path("no_such_dir"), 0, 1);
    CHECK_CONTAINS(e, fx_tmp_path("no_such_dir/config.json"));
}

static void test_missing_weights_file(void)
{
    const char *dir = gen_default_model("no_weights");
    const char *e;

    CHECK(unlink(fx_join(dir, "model.safetensors")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors"));
    CHECK_CONTAINS(e, "No such file");
}

static const char *gen_sharded(const char *name)
{
    struct lora_synthetic_model_opts o;

    lora_synthetic_model_defaults(&o);
    o.n_shards = 2;
    return fx_gen_model(name, &o);
}

static void test_index_names_missing_shard(void)
{
    const char *dir = gen_sharded("lost_shard");
    const char *e;

    CHECK(unlink(fx_join(dir, "model-00002-of-00002.safetensors")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model-00002-of-00002.safetensors"));
    CHECK_CONTAINS(e, "No such file");
}

/* Adds name -> file to the index's weight_map. */
static int index_map(const char *dir, const char *name, const char *file)
{
    const char *path = fx_join(dir, "model.safetensors.index.json");
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
    CHECK_CONTAINS(e, fx_join(dir, "model-00001-of-00002.safetensors"));
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
    const char *ipath = fx_join(dir, "model.safetensors.index.json");
    json_error_t jerr;
    json_t *root = json_load_file(ipath, JSON_PRESERVE_ORDER, &jerr);
    const char *shard =
        json_string_value(json_object_get(json_object_get(root, "weight_map"), name));
    struct fx_tset s;
    const char *e;

    CHECK(shard != NULL);
    if (!shard || fx_tset_read(&s, fx_join(dir, shard)) < 0) {
        json_decref(root);
        return;
    }
    CHECK(fx_tset_drop(&s, name) == 0);
    CHECK(fx_tset_write(&s, fx_join(dir, shard)) == 0);
    fx_tset_free(&s);
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

    CHECK(fx_write_text(fx_join(dir, "model.safetensors.index.json"), "{\"weight_map\": {") == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors.index.json"));
}

static void test_index_weight_map_not_object(void)
{
    const char *dir = gen_sharded("index_map");
    const char *e;

    CHECK(fx_json_file_set(fx_join(dir, "model.safetensors.index.json"), "weight_map",
                           json_string("model-00001-of-00002.safetensors")) == 0);
    e = load_err(dir, 0, 1);
    CHECK_CONTAINS(e, fx_join(dir, "model.safetensors.index.json"));
    CHECK_CONTAINS(e, "'weight_map'");
}

static void test_split_not_divisible(void)
{
    struct lora_synthetic_model_opts o;
    const char *e, *dir;

    e = load_err(base_dir, 0, 3);
    CHECK_CONTAINS(e, base_dir);
    CHECK_CONTAINS(e, "num_attention_heads (4) is not divisible by tensor-parallel size 3");
    e = load_err(base_dir, 3, 4);
    CHECK_CONTAINS(e, "num_key_value_heads (2) is not divisible by tensor-parallel size 4");
    lora_synthetic_model_defaults(&o);
    o.intermediate_size = 129;
    dir = fx_gen_model("inter129", &o);
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
    CHECK(lora_model_load(fx_backend(), fx_tmp_path("no_such_dir"), 0, 1, NULL, NULL, 0) == NULL);
    CHECK(lora_model_load(fx_backend(), base_dir, 2, 2, NULL, NULL, 0) == NULL);
    CHECK(lora_model_load(fx_backend(), fx_tmp_path("truncated"), 0, 1, NULL, NULL, 0) == NULL);
    CHECK(lora_model_load(fx_backend(), fx_tmp_path("missing"), 0, 1, NULL, NULL, 0) == NULL);
    /* A one-byte buffer holds the empty string. */
    char one[1] = {'x'};
    CHECK(lora_model_load(fx_backend(), fx_tmp_path("shape_q"), 0, 1, NULL, one, sizeof(one)) ==
          NULL);
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
    if (fx_init("/tmp/test_model.XXXXXX", &check_cur_failed) < 0)
        return 1;
    RUN(test_fixtures_written);
    RUN(test_good_model_loads);
    RUN(test_tp2_shards);
    RUN(test_qwen2_bias_shards);
    RUN(test_bf16_model_loads);
    RUN(test_bf16_kept_in_place);
    RUN(test_int8_quantized);
    RUN(test_tied_model);
    RUN(test_sharded_model_loads);
    RUN(test_unaligned_f32_loads);
    RUN(test_truncated_file);
    RUN(test_fifo_in_model_dir);
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
    fx_cleanup();
    return check_done();
}
