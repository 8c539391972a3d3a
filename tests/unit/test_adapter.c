/* Unit tests for lib/runtime/adapter: generated PEFT adapters (lib/runtime/synthetic) load with the
 * rank, scale, targets and values of their files, read back independently through
 * lora_safetensors_open; tensor-parallel shards hold this rank's rows of B (q, k, v, gate, up) or
 * columns of A (o, down); and every malformed adapter (rank, targets, keys, shapes, unsupported
 * PEFT options, broken files) fails with one message naming the file and the key. Fixtures live in
 * a mkdtemp directory removed at the end.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <limits.h>

#include <jansson.h>

#include "check.h"
#include "runtime/adapter.h"
#include "fixture.h"
#include "base/fs.h"
#include "runtime/model.h"
#include "runtime/synthetic.h"

#define ERR_BYTES 1024

/* ---- fixtures ----------------------------------------------------------------------------- */

#define KEY(layer, parent, proj, ab)                                                               \
    "base_model.model.model.layers." #layer "." parent "." proj ".lora_" ab ".weight"

#define BIT(p) (1u << (p))

static const char *model_dir, *model4_dir; /* 2 and 4 layers, otherwise the defaults */
static struct lora_model *full, *shard[2]; /* model_dir as 1 shard, and as 2 */

/* Writes a fresh adapter under fx_tmp_dir/name for the model in mdir and returns its path. */
static const char *gen_adapter(const char *name, const char *mdir,
                               const struct lora_synthetic_adapter_opts *o)
{
    const char *dir = fx_tmp_path("%s", name);
    char err[ERR_BYTES] = "";

    lora_fs_remove_tree(dir);
    if (lora_synthetic_adapter_write(dir, mdir, o, err, sizeof(err)) != 0) {
        printf("# gen_adapter %s: %s\n", name, err);
        check_cur_failed = 1;
    }
    return dir;
}

/* The default adapter (rank 8, alpha 16, all seven projections) of the 2-layer model. */
static const char *gen_default_adapter(const char *name)
{
    struct lora_synthetic_adapter_opts o;

    lora_synthetic_adapter_defaults(&o);
    return gen_adapter(name, model_dir, &o);
}

/* Applies f to dir/adapter_model.safetensors read as a tensor set, and writes it back. */
static int edit_weights(const char *dir, int (*f)(struct fx_tset *s))
{
    const char *path = fx_join(dir, "adapter_model.safetensors");
    struct fx_tset s;
    int rc;

    if (fx_tset_read(&s, path) < 0)
        return -1;
    rc = f(&s) == 0 && fx_tset_write(&s, path) == 0 ? 0 : -1;
    fx_tset_free(&s);
    return rc;
}

static char err_buf[ERR_BYTES];

/* Loads dir for m expecting failure; returns the message (one line). */
static const char *load_err(const char *dir, const struct lora_model *m, int max_rank)
{
    struct lora_adapter *a;

    memset(err_buf, 0, sizeof(err_buf));
    a = lora_adapter_load(dir, m, max_rank, err_buf, sizeof(err_buf));
    CHECK(a == NULL);
    lora_adapter_destroy(&a);
    CHECK(err_buf[0] != '\0');
    CHECK(strchr(err_buf, '\n') == NULL);
    if (getenv("LORA_TEST_VERBOSE"))
        printf("# error: %s\n", err_buf);
    return err_buf;
}

static struct lora_adapter *load_ok(const char *dir, const struct lora_model *m, int max_rank)
{
    char err[ERR_BYTES] = "";
    struct lora_adapter *a = lora_adapter_load(dir, m, max_rank, err, sizeof(err));

    if (!a) {
        printf("# load %s: %s\n", dir, err);
        check_cur_failed = 1;
    }
    return a;
}

/* Compares the whole tensor name of st, converted to float, with got: -1 when either is
 * missing or the sizes differ. */
static long differ_from_file(const struct lora_safetensors *st, const char *name, const float *got,
                             long n)
{
    const struct lora_tensor_info *t = st ? lora_safetensors_find(st, name) : NULL;
    float *want;
    long bad;

    if (!t || !got || t->numel != n)
        return -1;
    want = malloc((size_t)n * sizeof(float));
    lora_dtype_to_f32(t->dtype, t->data, want, (size_t)n);
    bad = fx_n_differ(want, got, n);
    free(want);
    return bad;
}

/* Like differ_from_file for a (rows, cols) tensor of st that got holds transposed, as
 * (cols, rows): how the adapter keeps B. */
static long differ_from_file_t(const struct lora_safetensors *st, const char *name,
                               const float *got, long rows, long cols)
{
    float *t = got ? malloc((size_t)(rows * cols) * sizeof(float)) : NULL;
    long bad;

    if (!t)
        return -1;
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++)
            t[r * cols + c] = got[c * rows + r];
    bad = differ_from_file(st, name, t, rows * cols);
    free(t);
    return bad;
}

/* PEFT key of layer l, projection p, factor 'A' or 'B'. */
static const char *key_of(int l, int p, char ab)
{
    static char buf[4][160];
    static int next;
    char *k = buf[next++ % 4];

    snprintf(k, sizeof(buf[0]), "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
             lora_proj_parent((enum lora_proj)p), lora_proj_name((enum lora_proj)p), ab);
    return k;
}

static void test_fixtures_written(void)
{
    static char m2[FX_PATH_BYTES], m4[FX_PATH_BYTES];
    struct lora_synthetic_model_opts o;
    char err[ERR_BYTES] = "";

    lora_synthetic_model_defaults(&o);
    snprintf(m2, sizeof(m2), "%s", fx_gen_model("model", &o));
    o.n_layers = 4;
    snprintf(m4, sizeof(m4), "%s", fx_gen_model("model4", &o));
    model_dir = m2;
    model4_dir = m4;
    full = lora_model_load(fx_backend(), model_dir, 0, 1, NULL, err, sizeof(err));
    for (int r = 0; r < 2; r++)
        shard[r] =
            full ? lora_model_load(fx_backend(), model_dir, r, 2, NULL, err, sizeof(err)) : NULL;
    if (!full || !shard[0] || !shard[1]) {
        printf("# model: %s\n", err);
        check_cur_failed = 1;
    }
}

/* ---- tests: good adapters ----------------------------------------------------------------- */

static void test_good_adapter_loads(void)
{
    struct lora_synthetic_adapter_opts o;
    const unsigned mask = BIT(LORA_PROJ_Q) | BIT(LORA_PROJ_V) | BIT(LORA_PROJ_DOWN);
    struct lora_safetensors *st;
    struct lora_adapter *a;
    char err[ERR_BYTES];
    const char *dir;
    size_t file_floats = 0;

    lora_synthetic_adapter_defaults(&o);
    o.target_mask = mask;
    dir = gen_adapter("qvd", model_dir, &o);
    a = load_ok(dir, full, 64);
    if (!a)
        return;
    CHECK(a->rank == 8);
    CHECK_NEAR(a->alpha, 16.0, 0.0);
    CHECK_NEAR(a->scale, 2.0, 1e-7);
    CHECK(!a->use_rslora);
    CHECK(a->target_mask == mask);
    CHECK(a->n_layers == 2);
    st = lora_safetensors_open(fx_join(dir, "adapter_model.safetensors"), err, sizeof(err));
    CHECK(st != NULL);
    for (int i = 0; st && i < st->n_tensors; i++)
        file_floats += (size_t)st->tensors[i].numel;
    CHECK(a->bytes == file_floats * sizeof(float));
    for (int l = 0; l < 2; l++) {
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            const float *pa = a->a[l * LORA_PROJ_COUNT + p], *pb = a->b[l * LORA_PROJ_COUNT + p];
            long in = lora_proj_in(&full->cfg, (enum lora_proj)p);
            long out = lora_proj_out(&full->cfg, (enum lora_proj)p);

            if (!(mask & BIT(p))) {
                CHECK(pa == NULL && pb == NULL);
                continue;
            }
            if (differ_from_file(st, key_of(l, p, 'A'), pa, 8 * in) != 0 ||
                differ_from_file_t(st, key_of(l, p, 'B'), pb, out, 8) != 0) {
                printf("# layer %d %s differs from the file\n", l,
                       lora_proj_name((enum lora_proj)p));
                check_cur_failed = 1;
            }
        }
    }
    lora_safetensors_close(&st);
    lora_adapter_destroy(&a);
    CHECK(a == NULL);
    /* max_rank equal to the rank is fine. */
    a = load_ok(dir, full, 8);
    lora_adapter_destroy(&a);
}

static void test_scales(void)
{
    struct lora_synthetic_adapter_opts o;
    struct lora_adapter *a;

    lora_synthetic_adapter_defaults(&o);
    o.use_rslora = true;
    a = load_ok(gen_adapter("rslora", model_dir, &o), full, 64);
    if (a) {
        CHECK(a->use_rslora);
        CHECK_NEAR(a->scale, 16.0 / sqrt(8.0), 1e-6);
    }
    lora_adapter_destroy(&a);
    o.use_rslora = false;
    o.rank = 4;
    o.alpha = 6.5f;
    a = load_ok(gen_adapter("alpha", model_dir, &o), full, 64);
    if (a) {
        CHECK(a->rank == 4);
        CHECK_NEAR(a->scale, 6.5 / 4.0, 1e-7);
    }
    lora_adapter_destroy(&a);
    /* lora_alpha absent: PEFT's default of 8. */
    CHECK(fx_json_file_del(fx_tmp_path("alpha/adapter_config.json"), "lora_alpha") == 0);
    a = load_ok(fx_tmp_path("alpha"), full, 64);
    if (a)
        CHECK_NEAR(a->scale, 8.0 / 4.0, 1e-7);
    lora_adapter_destroy(&a);
}

static void test_all_linear(void)
{
    const char *dir = gen_default_adapter("all_linear");
    struct lora_adapter *a;

    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "target_modules",
                           json_string("all-linear")) == 0);
    a = load_ok(dir, full, 64);
    if (a) {
        CHECK(a->target_mask == (1u << LORA_PROJ_COUNT) - 1);
        for (int i = 0; i < 2 * LORA_PROJ_COUNT; i++)
            CHECK(a->a[i] != NULL && a->b[i] != NULL);
    }
    lora_adapter_destroy(&a);
}

static void test_bf16_adapter(void)
{
    struct lora_synthetic_adapter_opts o;
    struct lora_safetensors *st;
    struct lora_adapter *a;
    char err[ERR_BYTES];
    const char *dir;

    lora_synthetic_adapter_defaults(&o);
    o.dtype = LORA_DTYPE_BF16;
    dir = gen_adapter("bf16", model_dir, &o);
    a = load_ok(dir, full, 64);
    st = lora_safetensors_open(fx_join(dir, "adapter_model.safetensors"), err, sizeof(err));
    if (!a || !st)
        goto out;
    CHECK(st->tensors[0].dtype == LORA_DTYPE_BF16);
    CHECK(differ_from_file(st, KEY(1, "mlp", "gate_proj", "A"),
                           a->a[1 * LORA_PROJ_COUNT + LORA_PROJ_GATE], 8 * 64) == 0);
    CHECK(differ_from_file_t(st, KEY(0, "self_attn", "o_proj", "B"),
                             a->b[0 * LORA_PROJ_COUNT + LORA_PROJ_O], 64, 8) == 0);
out:
    lora_safetensors_close(&st);
    lora_adapter_destroy(&a);
}

/* Columns [c0, c0 + nc) of a (rows, cols) tensor against a shard's (rows, nc) part. */
static long differ_cols(const float *whole, const float *part, long rows, long cols, long c0,
                        long nc)
{
    long bad = 0;

    for (long r = 0; r < rows; r++)
        bad += fx_n_differ(whole + r * cols + c0, part + r * nc, nc);
    return bad;
}

static void test_tp2_shards(void)
{
    const char *dir = gen_default_adapter("all");
    struct lora_adapter *whole = load_ok(dir, full, 64);
    const long rank = 8;

    for (int r = 0; whole && r < 2; r++) {
        struct lora_adapter *a = load_ok(dir, shard[r], 64);
        size_t floats = 0;

        if (!a)
            continue;
        CHECK(a->rank == 8 && a->target_mask == whole->target_mask);
        for (int l = 0; l < 2; l++) {
            for (int p = 0; p < LORA_PROJ_COUNT; p++) {
                int i = l * LORA_PROJ_COUNT + p;
                long in = lora_proj_in(&full->cfg, (enum lora_proj)p);
                long out = lora_proj_out(&full->cfg, (enum lora_proj)p);
                long bad;

                if (p == LORA_PROJ_O || p == LORA_PROJ_DOWN) {
                    /* Row-parallel: A keeps this rank's input columns; B is whole. B is
                     * held transposed, (rank, out). */
                    bad = differ_cols(whole->a[i], a->a[i], rank, in, r * in / 2, in / 2) +
                          fx_n_differ(whole->b[i], a->b[i], out * rank);
                    floats += (size_t)(rank * in / 2 + out * rank);
                } else {
                    /* Column-parallel: A is whole; B keeps this rank's output rows, which
                     * are columns of the transposed (rank, out) B. */
                    bad = fx_n_differ(whole->a[i], a->a[i], rank * in) +
                          differ_cols(whole->b[i], a->b[i], rank, out, r * out / 2, out / 2);
                    floats += (size_t)(rank * in + out / 2 * rank);
                }
                if (bad) {
                    printf("# rank %d layer %d %s: %ld values differ\n", r, l,
                           lora_proj_name((enum lora_proj)p), bad);
                    check_cur_failed = 1;
                }
            }
        }
        CHECK(a->bytes == floats * sizeof(float));
        lora_adapter_destroy(&a);
    }
    /* The split spelled out for rank 1, layer 0, against the file: q's B rows 32..63 (held as
     * B^T), q's A whole, o's A columns 32..63, o's B whole. */
    struct lora_adapter *a1 = whole ? load_ok(dir, shard[1], 64) : NULL;
    char err[ERR_BYTES];
    struct lora_safetensors *st =
        lora_safetensors_open(fx_join(dir, "adapter_model.safetensors"), err, sizeof(err));
    const struct lora_tensor_info *qb =
        st ? lora_safetensors_find(st, KEY(0, "self_attn", "q_proj", "B")) : NULL;
    if (a1 && qb) {
        const float *file_qb = qb->data; /* F32, and aligned: the writer pads the header */
        long bad = 0;

        for (long j = 0; j < 32; j++)
            for (long k = 0; k < rank; k++)
                bad += a1->b[LORA_PROJ_Q][k * 32 + j] != file_qb[(32 + j) * rank + k];
        CHECK(bad == 0);
        CHECK(differ_from_file(st, KEY(0, "self_attn", "q_proj", "A"), a1->a[LORA_PROJ_Q],
                               rank * 64) == 0);
        CHECK(differ_from_file_t(st, KEY(0, "self_attn", "o_proj", "B"), a1->b[LORA_PROJ_O], 64,
                                 rank) == 0);
        CHECK(a1->a[LORA_PROJ_O][3 * 32 + 5] == whole->a[LORA_PROJ_O][3 * 64 + 32 + 5]);
    }
    CHECK(a1 && qb);
    lora_safetensors_close(&st);
    lora_adapter_destroy(&a1);
    lora_adapter_destroy(&whole);
}

static void test_layers_to_transform(void)
{
    struct lora_synthetic_adapter_opts o;
    struct lora_adapter *a;
    const char *dir;

    lora_synthetic_adapter_defaults(&o);
    o.target_mask = BIT(LORA_PROJ_Q) | BIT(LORA_PROJ_V);
    dir = gen_adapter("ltt", model_dir, &o);
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "layers_to_transform",
                           json_pack("[i]", 0)) == 0);
    /* Keys for layer 1 too: an error. */
    const char *e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, "base_model.model.model.layers.1.");
    CHECK_CONTAINS(e, "outside layers_to_transform");
    /* Keys for layer 0 only: loads, with nothing for layer 1. */
    const char *path = fx_join(dir, "adapter_model.safetensors");
    struct fx_tset s;
    if (fx_tset_read(&s, path) < 0)
        return;
    CHECK(fx_tset_drop(&s, KEY(1, "self_attn", "q_proj", "A")) == 0);
    CHECK(fx_tset_drop(&s, KEY(1, "self_attn", "q_proj", "B")) == 0);
    CHECK(fx_tset_drop(&s, KEY(1, "self_attn", "v_proj", "A")) == 0);
    CHECK(fx_tset_drop(&s, KEY(1, "self_attn", "v_proj", "B")) == 0);
    CHECK(fx_tset_write(&s, path) == 0);
    fx_tset_free(&s);
    a = load_ok(dir, full, 64);
    if (a) {
        CHECK(a->a[LORA_PROJ_Q] != NULL && a->b[LORA_PROJ_V] != NULL);
        for (int p = 0; p < LORA_PROJ_COUNT; p++)
            CHECK(a->a[LORA_PROJ_COUNT + p] == NULL && a->b[LORA_PROJ_COUNT + p] == NULL);
    }
    lora_adapter_destroy(&a);
    /* A bare integer is a list of one. */
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "layers_to_transform",
                           json_integer(0)) == 0);
    a = load_ok(dir, full, 64);
    lora_adapter_destroy(&a);
    /* A layer the model lacks. */
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "layers_to_transform",
                           json_pack("[i, i]", 0, 2)) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "layers_to_transform");
    /* Layer 0 listed but its keys gone: the missing key is named. */
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "layers_to_transform",
                           json_pack("[i, i]", 0, 1)) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "missing key '" KEY(1, "self_attn", "q_proj", "A") "'");
}

/* ---- tests: malformed adapter_config.json ------------------------------------------------- */

/* A fresh default adapter whose config has key set to value (stolen). */
static const char *with_config(const char *name, const char *key, json_t *value)
{
    const char *dir = gen_default_adapter(name);

    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), key, value) == 0);
    return dir;
}

static void test_rank_above_max(void)
{
    const char *dir = gen_default_adapter("rank_max");
    const char *e = load_err(dir, full, 4);

    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "rank 8 exceeds the maximum LoRA rank 4");
}

static void test_bad_r(void)
{
    const char *dir = gen_default_adapter("r_missing");
    const char *e;

    CHECK(fx_json_file_del(fx_join(dir, "adapter_config.json"), "r") == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "'r' must be a positive integer");
    json_t *bad[] = {json_string("8"), json_integer(0), json_integer(-8), json_real(8.5),
                     json_null()};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dir = with_config("r_bad", "r", bad[i]);
        e = load_err(dir, full, 64);
        CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
        CHECK_CONTAINS(e, "'r' must be a positive integer");
    }
}

static void test_bad_alpha_and_rslora(void)
{
    const char *dir = with_config("alpha_str", "lora_alpha", json_string("16"));
    const char *e = load_err(dir, full, 64);

    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "'lora_alpha' must be a number");
    dir = with_config("rslora_str", "use_rslora", json_string("true"));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "'use_rslora' must be true or false");
}

static void test_unknown_target_module(void)
{
    const char *dir =
        with_config("tm_unknown", "target_modules", json_pack("[s, s]", "q_proj", "embed_tokens"));
    const char *e = load_err(dir, full, 64);

    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "target_modules[1] 'embed_tokens' is not a supported module");
    dir = with_config("tm_number", "target_modules", json_pack("[s, i]", "q_proj", 3));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "target_modules[1]");
}

static void test_target_modules_regex(void)
{
    const char *dir =
        with_config("tm_regex", "target_modules", json_string(".*\\.(q_proj|v_proj)"));
    const char *e = load_err(dir, full, 64);

    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "target_modules as a string must be \"all-linear\"");
    CHECK(!strstr(e, "q_proj|v_proj")); /* the file's text is not quoted */
    dir = with_config("tm_empty", "target_modules", json_array());
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "'target_modules' must be a non-empty list");
    dir = gen_default_adapter("tm_missing");
    CHECK(fx_json_file_del(fx_join(dir, "adapter_config.json"), "target_modules") == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "'target_modules' must be a non-empty list");
}

static void test_unsupported_options(void)
{
    const char *dir = with_config("fifo", "fan_in_fan_out", json_true());
    const char *e = load_err(dir, full, 64);

    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "fan_in_fan_out is not supported");
    dir = with_config("bias_all", "bias", json_string("all"));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "bias must be \"none\"");
    dir = with_config("bias_lora", "bias", json_string("lora_only"));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "bias must be \"none\"");
    dir = with_config("peft_type", "peft_type", json_string("PREFIX_TUNING"));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "peft_type must be \"LORA\"");
    dir = with_config("rank_pattern", "rank_pattern", json_pack("{s:i}", "q_proj", 4));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "'rank_pattern' is not supported");
    dir = with_config("to_save", "modules_to_save", json_pack("[s]", "lm_head"));
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "'modules_to_save' is not supported");
    /* Their harmless forms load. */
    dir = with_config("harmless", "rank_pattern", json_object());
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "modules_to_save", json_null()) ==
          0);
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "fan_in_fan_out", json_false()) ==
          0);
    struct lora_adapter *a = load_ok(dir, full, 64);
    lora_adapter_destroy(&a);
}

static void test_bad_config_file(void)
{
    const char *dir = gen_default_adapter("bad_json");
    const char *e;

    CHECK(fx_write_text(fx_join(dir, "adapter_config.json"), "{\"r\": 8, \"lora_alpha\": ") == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK(fx_write_text(fx_join(dir, "adapter_config.json"), "[8, 16]") == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "top level must be a JSON object");
    CHECK(unlink(fx_join(dir, "adapter_config.json")) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_config.json"));
    CHECK_CONTAINS(e, "No such file");
    /* A missing file has no line number to give. */
    CHECK(strstr(e, "line -1") == NULL);
}

/* ---- tests: malformed adapter_model.safetensors ------------------------------------------- */

static void test_missing_weights_file(void)
{
    const char *dir = gen_default_adapter("no_weights");
    const char *e;

    CHECK(unlink(fx_join(dir, "adapter_model.safetensors")) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, "No such file");
}

static void test_key_for_missing_layer(void)
{
    struct lora_synthetic_adapter_opts o;
    const char *dir, *e;

    lora_synthetic_adapter_defaults(&o);
    dir = gen_adapter("four_layers", model4_dir, &o);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, "key 'base_model.model.model.layers.");
    CHECK(strstr(e, "layers.2.") || strstr(e, "layers.3."));
    CHECK(strstr(e, "is for layer 2 ") || strstr(e, "is for layer 3 "));
    CHECK_CONTAINS(e, "the model has 2");
}

static int drop_down_b(struct fx_tset *s)
{
    return fx_tset_drop(s, KEY(1, "mlp", "down_proj", "B"));
}

static int drop_k_a(struct fx_tset *s)
{
    return fx_tset_drop(s, KEY(0, "self_attn", "k_proj", "A"));
}

static void test_missing_factor(void)
{
    const char *dir = gen_default_adapter("no_b");
    const char *e;

    CHECK(edit_weights(dir, drop_down_b) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, "missing key '" KEY(1, "mlp", "down_proj", "B") "'");
    dir = gen_default_adapter("no_a");
    CHECK(edit_weights(dir, drop_k_a) == 0);
    e = load_err(dir, shard[1], 64);
    CHECK_CONTAINS(e, "missing key '" KEY(0, "self_attn", "k_proj", "A") "'");
}

static int wide_q_a(struct fx_tset *s)
{
    return fx_tset_reshape(s, KEY(0, "self_attn", "q_proj", "A"), 2, 8, 65);
}

static int narrow_o_b(struct fx_tset *s)
{
    return fx_tset_reshape(s, KEY(1, "self_attn", "o_proj", "B"), 2, 64, 7);
}

static int flat_up_a(struct fx_tset *s)
{
    return fx_tset_reshape(s, KEY(0, "mlp", "up_proj", "A"), 1, 8 * 64, 0);
}

static int swapped_v_a(struct fx_tset *s)
{
    return fx_tset_reshape(s, KEY(0, "self_attn", "v_proj", "A"), 2, 64, 8);
}

static void test_wrong_shape(void)
{
    const char *dir = gen_default_adapter("shape_a");
    const char *e;

    CHECK(edit_weights(dir, wide_q_a) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, "key '" KEY(0, "self_attn", "q_proj", "A") "' has shape [8, 65], expected "
                                                                 "[8, 64]");
    /* The full shape is checked on a shard too. */
    e = load_err(dir, shard[1], 64);
    CHECK_CONTAINS(e, "has shape [8, 65], expected [8, 64]");
    dir = gen_default_adapter("shape_b");
    CHECK(edit_weights(dir, narrow_o_b) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "key '" KEY(1, "self_attn", "o_proj", "B") "' has shape [64, 7], expected "
                                                                 "[64, 8]");
    dir = gen_default_adapter("shape_t");
    CHECK(edit_weights(dir, swapped_v_a) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, "key '" KEY(0, "self_attn", "v_proj", "A") "' has shape [64, 8], expected "
                                                                 "[8, 64]");
}

/* A 1-D tensor where a matrix belongs: the message must show its real shape. */
static void test_wrong_rank_shape_message(void)
{
    const char *dir = gen_default_adapter("shape_flat");
    const char *e;

    CHECK(edit_weights(dir, flat_up_a) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, "key '" KEY(0, "mlp", "up_proj", "A") "' has shape [512], expected "
                                                            "[8, 64]");
}

static int add_embedding_key(struct fx_tset *s)
{
    fx_tset_add(s, "base_model.model.model.embed_tokens.lora_embedding_A", 2, 8, 320, 0.5f);
    return 0;
}

static int add_layer_embedding_key(struct fx_tset *s)
{
    fx_tset_add(s, "base_model.model.model.layers.0.self_attn.q_proj.lora_embedding_A", 2, 8, 64,
                0.5f);
    return 0;
}

static int add_magnitude_key(struct fx_tset *s)
{
    fx_tset_add(s, "base_model.model.model.layers.1.mlp.down_proj.lora_magnitude_vector", 1, 64, 0,
                1.0f);
    return 0;
}

static void test_unexpected_key(void)
{
    int (*edits[])(struct fx_tset *) = {add_embedding_key, add_layer_embedding_key,
                                        add_magnitude_key};
    const char *names[] = {"base_model.model.model.embed_tokens.lora_embedding_A",
                           "base_model.model.model.layers.0.self_attn.q_proj.lora_embedding_A",
                           "base_model.model.model.layers.1.mlp.down_proj.lora_magnitude_vector"};

    for (int i = 0; i < 3; i++) {
        const char *dir = gen_default_adapter("unexpected");
        char want[200];
        const char *e;

        CHECK(edit_weights(dir, edits[i]) == 0);
        e = load_err(dir, full, 64);
        snprintf(want, sizeof(want), "unexpected key '%s'", names[i]);
        CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
        CHECK_CONTAINS(e, want);
    }
}

static void test_key_not_targeted(void)
{
    struct lora_synthetic_adapter_opts o;
    const char *dir, *e;

    lora_synthetic_adapter_defaults(&o);
    o.target_mask = BIT(LORA_PROJ_Q) | BIT(LORA_PROJ_V) | BIT(LORA_PROJ_DOWN);
    dir = gen_adapter("untargeted", model_dir, &o);
    CHECK(fx_json_file_set(fx_join(dir, "adapter_config.json"), "target_modules",
                           json_pack("[s, s]", "q_proj", "v_proj")) == 0);
    e = load_err(dir, full, 64);
    CHECK_CONTAINS(e, fx_join(dir, "adapter_model.safetensors"));
    CHECK_CONTAINS(e, ".mlp.down_proj.lora_");
    CHECK_CONTAINS(e, "targets down_proj, which target_modules lacks");
}

/* "layers.01" is not PEFT's spelling of layer 1; with both present, one of the two weights would
 * be dropped without a word. */
static int add_alias_key(struct fx_tset *s)
{
    int i = fx_tset_find(s, KEY(1, "self_attn", "q_proj", "A"));

    if (i < 0)
        return -1;
    fx_tset_add(s, "base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight", 2, 8, 64,
                9.0f);
    return 0;
}

static void test_non_canonical_layer_key(void)
{
    const char *dir = gen_default_adapter("alias");
    struct lora_adapter *a;

    CHECK(edit_weights(dir, add_alias_key) == 0);
    memset(err_buf, 0, sizeof(err_buf));
    a = lora_adapter_load(dir, full, 64, err_buf, sizeof(err_buf));
    CHECK(a == NULL);
    if (a)
        printf("# loaded: layer 1 q_proj lora_A[0] = %g (9 is the alias's value)\n",
               (double)a->a[LORA_PROJ_COUNT + LORA_PROJ_Q][0]);
    lora_adapter_destroy(&a);
    if (err_buf[0]) {
        CHECK_CONTAINS(err_buf, fx_join(dir, "adapter_model.safetensors"));
        CHECK_CONTAINS(err_buf, "layers.01.self_attn.q_proj.lora_A.weight");
    }
}

/* A caller without an error buffer still gets NULL, never a crash. */
static void test_no_error_buffer(void)
{
    CHECK(lora_adapter_load(fx_tmp_path("no_such_dir"), full, 64, NULL, 0) == NULL);
    CHECK(lora_adapter_load(fx_tmp_path("rank_max"), full, 4, NULL, 0) == NULL);
    CHECK(lora_adapter_load(fx_tmp_path("shape_a"), full, 64, NULL, 0) == NULL);
    CHECK(lora_adapter_load(fx_tmp_path("no_b"), full, 64, NULL, 0) == NULL);
}

/* Loading and destroying again and again; the sanitizer build checks nothing leaks. */
static void test_reload(void)
{
    for (int i = 0; i < 6; i++) {
        struct lora_adapter *a = load_ok(fx_tmp_path(i % 2 ? "all" : "bf16"), shard[i % 2], 64);

        CHECK(a != NULL);
        lora_adapter_destroy(&a);
        CHECK(a == NULL);
    }
    lora_adapter_destroy(NULL);
}

/* Loads root/rel beneath root (opened once), links allowed or not; returns the adapter or NULL
 * with the message in err_buf. */
static struct lora_adapter *load_under(const char *root, const char *rel, bool links)
{
    char dir[PATH_MAX + 64];
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct lora_adapter_root r = {.fd = fd, .path = root, .allow_symlinks = links};

    snprintf(dir, sizeof(dir), "%s/%s", root, rel);
    memset(err_buf, 0, sizeof(err_buf));
    struct lora_adapter *a = lora_adapter_load_under(&r, dir, full, 64, err_buf, sizeof(err_buf));
    if (!a && getenv("LORA_TEST_VERBOSE"))
        printf("# error: %s\n", err_buf);
    close(fd);
    return a;
}

/* Beneath a root, a link is refused unless allowed, and then only when it stays beneath the
 * root; the same adapter loads the same weights through a link as without one. */
static void test_load_under_root(void)
{
    char root[PATH_MAX], outside[PATH_MAX], p[PATH_MAX + 64], t[PATH_MAX + 64];
    struct lora_adapter *a;

    snprintf(root, sizeof(root), "%s", fx_tmp_path("root"));
    lora_fs_remove_tree(root);
    CHECK(lora_fs_mkdir_p(root, NULL, 0) == 0);
    gen_default_adapter("root/plain");
    snprintf(outside, sizeof(outside), "%s", gen_default_adapter("outside"));
    gen_default_adapter("root/file-link");
    snprintf(p, sizeof(p), "%s/root/file-link/adapter_model.safetensors", fx_tmp_dir);
    snprintf(t, sizeof(t), "../plain/adapter_model.safetensors");
    CHECK(unlink(p) == 0 && symlink(t, p) == 0);
    snprintf(p, sizeof(p), "%s/dir-link", root);
    CHECK(symlink("plain", p) == 0);
    snprintf(p, sizeof(p), "%s/out-link", root);
    CHECK(symlink(outside, p) == 0);
    gen_default_adapter("root/out-file");
    snprintf(p, sizeof(p), "%s/root/out-file/adapter_config.json", fx_tmp_dir);
    CHECK(unlink(p) == 0 && symlink(fx_join(outside, "adapter_config.json"), p) == 0);

    a = load_under(root, "plain", false);
    CHECK(a != NULL);
    lora_adapter_destroy(&a);
    CHECK(!load_under(root, "file-link", false));
    CHECK_CONTAINS(err_buf, "adapter_model.safetensors");
    CHECK_CONTAINS(err_buf, "symbolic link");
    CHECK(!load_under(root, "dir-link", false));
    CHECK_CONTAINS(err_buf, "symbolic link");
    CHECK(!load_under(root, "out-link", false));
    CHECK(!load_under(root, "../outside", false));
    CHECK(!load_under(root, "plain/..", false));
    /* Links allowed: those that stay beneath the root load, the others are refused. */
    a = load_under(root, "file-link", true);
    CHECK(a != NULL);
    lora_adapter_destroy(&a);
    a = load_under(root, "dir-link", true);
    CHECK(a != NULL);
    lora_adapter_destroy(&a);
    CHECK(!load_under(root, "out-link", true));
    CHECK_CONTAINS(err_buf, "outside the adapter root");
    CHECK(!load_under(root, "out-file", true));
    CHECK_CONTAINS(err_buf, "outside the adapter root");
    /* A path that is not under the root at all. */
    struct lora_adapter_root r = {.fd = -1, .path = root};
    CHECK(!lora_adapter_load_under(&r, outside, full, 64, err_buf, sizeof(err_buf)));
    CHECK_CONTAINS(err_buf, "not under the adapter root");
}

int main(void)
{
    if (fx_init("/tmp/test_adapter.XXXXXX", &check_cur_failed) < 0)
        return 1;
    RUN(test_fixtures_written);
    if (full && shard[0] && shard[1]) {
        RUN(test_good_adapter_loads);
        RUN(test_scales);
        RUN(test_all_linear);
        RUN(test_bf16_adapter);
        RUN(test_tp2_shards);
        RUN(test_layers_to_transform);
        RUN(test_rank_above_max);
        RUN(test_bad_r);
        RUN(test_bad_alpha_and_rslora);
        RUN(test_unknown_target_module);
        RUN(test_target_modules_regex);
        RUN(test_unsupported_options);
        RUN(test_bad_config_file);
        RUN(test_missing_weights_file);
        RUN(test_key_for_missing_layer);
        RUN(test_missing_factor);
        RUN(test_wrong_shape);
        RUN(test_wrong_rank_shape_message);
        RUN(test_unexpected_key);
        RUN(test_key_not_targeted);
        RUN(test_non_canonical_layer_key);
        RUN(test_no_error_buffer);
        RUN(test_reload);
        RUN(test_load_under_root);
    }
    lora_model_destroy(&full);
    lora_model_destroy(&shard[0]);
    lora_model_destroy(&shard[1]);
    fx_cleanup();
    return check_done();
}
