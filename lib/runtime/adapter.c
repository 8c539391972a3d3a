/* adapter: loads and validates a PEFT LoRA adapter for one model shard; see adapter.h. */
#include "runtime/adapter.h"

#include "base/fs.h"
#include "base/json_file.h"
#include "base/path_confine.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEY_PREFIX "base_model.model.model.layers."

struct adapter_load {
    const char *dir;
    const struct lora_adapter_root *root; /* NULL: dir is the operator's, opened as it is */
    const char *rel;                      /* dir below the root */
    int dir_fd;                           /* dir, opened beneath the root; -1 without one */
    const struct lora_model *m;
    struct lora_adapter *ad;
    bool *layer_on; /* layers the adapter covers */
    const struct lora_tensor_info **ta, **tb; /* found tensors, [layer * COUNT + proj] */
    char cfg_path[4096];
    char st_path[4096];
    char *err;
    size_t err_len;
};

static int parse_targets(struct adapter_load *ld, json_t *tm)
{
    unsigned mask = 0;

    if (json_is_string(tm)) {
        if (strcmp(json_string_value(tm), "all-linear") != 0) {
            snprintf(ld->err, ld->err_len,
                     "%s: target_modules as a string must be \"all-linear\"; else give a list "
                     "of projection names",
                     ld->cfg_path);
            return -1;
        }
        mask = (1u << LORA_PROJ_COUNT) - 1;
    } else if (json_is_array(tm) && json_array_size(tm) > 0) {
        size_t i;
        json_t *v;
        json_array_foreach(tm, i, v) {
            const char *s = json_string_value(v);
            int p = s ? lora_proj_from_name(s) : -1;
            if (p < 0) {
                snprintf(ld->err, ld->err_len,
                         "%s: target_modules[%zu] '%s' is not a supported module (q_proj, k_proj, "
                         "v_proj, o_proj, gate_proj, up_proj, down_proj)",
                         ld->cfg_path, i, s ? s : "(not a string)");
                return -1;
            }
            mask |= 1u << p;
        }
    } else {
        snprintf(ld->err, ld->err_len, "%s: 'target_modules' must be a non-empty list",
                 ld->cfg_path);
        return -1;
    }
    ld->ad->target_mask = mask;
    return 0;
}

static int parse_layers(struct adapter_load *ld, json_t *ltt)
{
    int n = ld->m->cfg.n_layers;

    if (!ltt || json_is_null(ltt)) {
        for (int i = 0; i < n; i++)
            ld->layer_on[i] = true;
        return 0;
    }
    json_t *one = json_is_integer(ltt) ? ltt : NULL;
    size_t count = one ? 1 : json_array_size(ltt);
    if (!one && !json_is_array(ltt))
        count = 0;
    if (count == 0)
        goto bad;
    for (size_t i = 0; i < count; i++) {
        json_t *v = one ? one : json_array_get(ltt, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= n)
            goto bad;
        ld->layer_on[json_integer_value(v)] = true;
    }
    return 0;
bad:
    snprintf(ld->err, ld->err_len,
             "%s: 'layers_to_transform' must be a layer index or a list of them below %d",
             ld->cfg_path, n);
    return -1;
}

/* Rejects options that would change the math in ways this runtime does not implement. */
static int check_unsupported(struct adapter_load *ld, json_t *cfg)
{
    json_t *v;

    v = json_object_get(cfg, "peft_type");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0))
        goto bad_type;
    v = json_object_get(cfg, "use_dora");
    if (json_is_true(v)) {
        snprintf(ld->err, ld->err_len, "%s: DoRA (use_dora) is not supported", ld->cfg_path);
        return -1;
    }
    v = json_object_get(cfg, "fan_in_fan_out");
    if (json_is_true(v)) {
        snprintf(ld->err, ld->err_len, "%s: fan_in_fan_out is not supported", ld->cfg_path);
        return -1;
    }
    v = json_object_get(cfg, "bias");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none"))) {
        snprintf(ld->err, ld->err_len, "%s: bias must be \"none\"", ld->cfg_path);
        return -1;
    }
    const char *per_module[] = {"rank_pattern", "alpha_pattern", "modules_to_save"};
    for (size_t i = 0; i < sizeof(per_module) / sizeof(per_module[0]); i++) {
        v = json_object_get(cfg, per_module[i]);
        bool set = json_object_size(v) + json_array_size(v) > 0 ||
                   (json_is_string(v) && *json_string_value(v));
        if (set) {
            snprintf(ld->err, ld->err_len, "%s: '%s' is not supported", ld->cfg_path,
                     per_module[i]);
            return -1;
        }
    }
    return 0;
bad_type:
    snprintf(ld->err, ld->err_len, "%s: peft_type must be \"LORA\"", ld->cfg_path);
    return -1;
}

/* Opens one file of the adapter to read, as a regular file, without blocking. Under a root it
 * is opened relative to the directory opened beneath the root, never following a link (with
 * links allowed, beneath the root again, so a link inside may lead anywhere under it). */
static int open_member(struct adapter_load *ld, const char *file, const char *label)
{
    if (!ld->root)
        return lora_fs_open_regular(AT_FDCWD, label, label, true, NULL, ld->err, ld->err_len);
    if (!ld->root->allow_symlinks)
        return lora_fs_open_regular(ld->dir_fd, file, label, false, NULL, ld->err, ld->err_len);
    char rel[4096];
    enum lora_path_confine_error why;
    snprintf(rel, sizeof(rel), "%s/%s", ld->rel, file);
    int fd = lora_path_confine_open(ld->root->fd, ld->root->path, rel, 0, true, &why, ld->err,
                               ld->err_len);
    if (fd >= 0 && lora_fs_check_regular(fd, label, NULL, ld->err, ld->err_len) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int load_config(struct adapter_load *ld, int max_rank)
{
    struct lora_adapter *ad = ld->ad;
    int fd = open_member(ld, "adapter_config.json", ld->cfg_path);
    if (fd < 0)
        return -1;
    json_t *cfg = lora_json_file_load_fd(fd, ld->cfg_path, LORA_JSON_FILE_MAX_BYTES, ld->err,
                                         ld->err_len);
    int rc = -1;

    if (!cfg)
        return -1;
    if (check_unsupported(ld, cfg) < 0)
        goto out;
    json_t *r = json_object_get(cfg, "r");
    if (!json_is_integer(r) || json_integer_value(r) < 1) {
        snprintf(ld->err, ld->err_len, "%s: 'r' must be a positive integer", ld->cfg_path);
        goto out;
    }
    if (json_integer_value(r) > max_rank) {
        snprintf(ld->err, ld->err_len, "%s: rank %lld exceeds the maximum LoRA rank %d",
                 ld->cfg_path, (long long)json_integer_value(r), max_rank);
        goto out;
    }
    ad->rank = (int)json_integer_value(r);
    json_t *alpha = json_object_get(cfg, "lora_alpha");
    if (alpha && !json_is_number(alpha)) {
        snprintf(ld->err, ld->err_len, "%s: 'lora_alpha' must be a number", ld->cfg_path);
        goto out;
    }
    ad->alpha = alpha ? (float)json_number_value(alpha) : 8.0f; /* PEFT's default */
    json_t *rs = json_object_get(cfg, "use_rslora");
    if (rs && !json_is_boolean(rs)) {
        snprintf(ld->err, ld->err_len, "%s: 'use_rslora' must be true or false", ld->cfg_path);
        goto out;
    }
    ad->use_rslora = json_is_true(rs);
    ad->scale = ad->use_rslora ? ad->alpha / sqrtf((float)ad->rank) : ad->alpha / ad->rank;
    if (parse_targets(ld, json_object_get(cfg, "target_modules")) < 0 ||
        parse_layers(ld, json_object_get(cfg, "layers_to_transform")) < 0)
        goto out;
    rc = 0;
out:
    json_decref(cfg);
    return rc;
}

/* Files one key of the safetensors file under its layer and projection. */
static int classify_key(struct adapter_load *ld, const struct lora_tensor_info *t)
{
    const char *name = t->name;
    int n_layers = ld->m->cfg.n_layers;

    if (strncmp(name, KEY_PREFIX, strlen(KEY_PREFIX)) != 0)
        goto unexpected;
    /* The layer number in canonical form only ("7", not "07" or "+7"): two spellings of one
     * layer would let a second tensor silently replace the first. */
    const char *p = name + strlen(KEY_PREFIX), *end = p;
    long layer = 0;
    while (*end >= '0' && *end <= '9' && layer < 1000000)
        layer = layer * 10 + (*end++ - '0');
    if (end == p || *end != '.' || (*p == '0' && end - p > 1))
        goto unexpected;
    for (int proj = 0; proj < LORA_PROJ_COUNT; proj++) {
        char want_a[64], want_b[64];
        snprintf(want_a, sizeof(want_a), ".%s.%s.lora_A.weight", lora_proj_parent(proj),
                 lora_proj_name(proj));
        snprintf(want_b, sizeof(want_b), ".%s.%s.lora_B.weight", lora_proj_parent(proj),
                 lora_proj_name(proj));
        bool is_a = strcmp(end, want_a) == 0, is_b = strcmp(end, want_b) == 0;
        if (!is_a && !is_b)
            continue;
        if (layer >= n_layers) {
            snprintf(ld->err, ld->err_len, "%s: key '%s' is for layer %ld but the model has %d",
                     ld->st_path, name, layer, n_layers);
            return -1;
        }
        if (!(ld->ad->target_mask & (1u << proj))) {
            snprintf(ld->err, ld->err_len, "%s: key '%s' targets %s, which target_modules lacks",
                     ld->st_path, name, lora_proj_name(proj));
            return -1;
        }
        const struct lora_tensor_info **slot = is_a ? ld->ta : ld->tb;
        slot[layer * LORA_PROJ_COUNT + proj] = t;
        return 0;
    }
unexpected:
    snprintf(ld->err, ld->err_len, "%s: unexpected key '%s' (not a LoRA A or B weight)",
             ld->st_path, name);
    return -1;
}

/* Checks t's shape is (rows, cols) and copies rows [r0, r0 + nr) and columns [c0, c0 + nc),
 * as (nr, nc), or as (nc, nr) when transpose. */
static float *take(struct adapter_load *ld, const struct lora_tensor_info *t, int64_t rows,
                   int64_t cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc, bool transpose)
{
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[160];
        snprintf(ld->err, ld->err_len, "%s: key '%s' has shape %s, expected [%lld, %lld]",
                 ld->st_path, t->name, lora_tensor_shape_str(t, got, sizeof(got)),
                 (long long)rows, (long long)cols);
        return NULL;
    }
    if (t->dtype != LORA_DTYPE_F32 && t->dtype != LORA_DTYPE_F16 && t->dtype != LORA_DTYPE_BF16) {
        snprintf(ld->err, ld->err_len, "%s: key '%s' has dtype %s, expected F32, F16 or BF16",
                 ld->st_path, t->name, lora_dtype_name(t->dtype));
        return NULL;
    }
    float *out = malloc((size_t)(nr * nc) * sizeof(float));
    if (!out) {
        snprintf(ld->err, ld->err_len, "%s: key '%s': out of memory", ld->st_path, t->name);
        return NULL;
    }
    size_t esize = lora_dtype_size(t->dtype);
    for (int64_t r = 0; r < nr; r++) {
        const char *src = (const char *)t->data + (size_t)((r0 + r) * cols + c0) * esize;
        if (!transpose) {
            lora_dtype_to_f32(t->dtype, src, out + r * nc, (size_t)nc);
            continue;
        }
        for (int64_t c = 0; c < nc; c++)
            lora_dtype_to_f32(t->dtype, src + (size_t)c * esize, out + c * nr + r, 1);
    }
    ld->ad->bytes += (size_t)(nr * nc) * sizeof(float);
    return out;
}

static int take_weights(struct adapter_load *ld)
{
    const struct lora_model *m = ld->m;
    struct lora_adapter *ad = ld->ad;
    int rank = ad->rank;

    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            int i = l * LORA_PROJ_COUNT + p;
            bool want = ld->layer_on[l] && (ad->target_mask & (1u << p));
            if (!want && !ld->ta[i] && !ld->tb[i])
                continue;
            if (!want) {
                snprintf(ld->err, ld->err_len, "%s: key '%s' is for a layer outside "
                         "layers_to_transform", ld->st_path, (ld->ta[i] ? ld->ta[i] : ld->tb[i])->name);
                return -1;
            }
            if (!ld->ta[i] || !ld->tb[i]) {
                snprintf(ld->err, ld->err_len, "%s: missing key '" KEY_PREFIX "%d.%s.%s.lora_%s.weight'",
                         ld->st_path, l, lora_proj_parent(p), lora_proj_name(p),
                         ld->ta[i] ? "B" : "A");
                return -1;
            }
            int64_t in = lora_proj_in(&m->cfg, p), out = lora_proj_out(&m->cfg, p);
            int64_t in_l = lora_model_proj_in(m, p), out_l = lora_model_proj_out(m, p);
            int64_t a_c0 = lora_proj_is_column_parallel(p) ? 0 : m->tp_rank * in_l;
            int64_t b_r0 = lora_proj_is_column_parallel(p) ? m->tp_rank * out_l : 0;
            ad->a[i] = take(ld, ld->ta[i], rank, in, 0, rank, a_c0, in_l, false);
            if (!ad->a[i])
                return -1;
            ad->b[i] = take(ld, ld->tb[i], out, rank, b_r0, out_l, 0, rank, true);
            if (!ad->b[i])
                return -1;
        }
    }
    return 0;
}

struct lora_adapter *lora_adapter_load(const char *dir, const struct lora_model *m, int max_rank,
                                       char *err, size_t err_len)
{
    return lora_adapter_load_under(NULL, dir, m, max_rank, err, err_len);
}

struct lora_adapter *lora_adapter_load_under(const struct lora_adapter_root *root,
                                             const char *dir, const struct lora_model *m,
                                             int max_rank, char *err, size_t err_len)
{
    int n = m->cfg.n_layers * LORA_PROJ_COUNT;
    struct lora_adapter *ad = calloc(1, sizeof(*ad));
    struct adapter_load ld = {
        .dir = dir, .root = root, .dir_fd = -1, .m = m, .ad = ad, .err = err, .err_len = err_len};
    struct lora_safetensors *st = NULL;
    enum lora_path_confine_error why;

    if (root) {
        ld.rel = lora_path_confine_relative(root->path, dir);
        if (!ld.rel) {
            snprintf(err, err_len, "%s: not under the adapter root '%s'", dir, root->path);
            goto fail;
        }
        ld.dir_fd = lora_path_confine_open(root->fd, root->path, ld.rel, O_DIRECTORY,
                                      root->allow_symlinks, &why, err, err_len);
        if (ld.dir_fd < 0)
            goto fail;
    }

    ld.layer_on = calloc((size_t)m->cfg.n_layers, sizeof(*ld.layer_on));
    ld.ta = calloc((size_t)n, sizeof(*ld.ta));
    ld.tb = calloc((size_t)n, sizeof(*ld.tb));
    if (ad) {
        ad->n_layers = m->cfg.n_layers;
        ad->a = calloc((size_t)n, sizeof(*ad->a));
        ad->b = calloc((size_t)n, sizeof(*ad->b));
    }
    if (!ad || !ad->a || !ad->b || !ld.layer_on || !ld.ta || !ld.tb) {
        snprintf(err, err_len, "%s: out of memory", dir);
        goto fail;
    }
    snprintf(ld.cfg_path, sizeof(ld.cfg_path), "%s/adapter_config.json", dir);
    snprintf(ld.st_path, sizeof(ld.st_path), "%s/adapter_model.safetensors", dir);
    if (load_config(&ld, max_rank) < 0)
        goto fail;
    int fd = open_member(&ld, "adapter_model.safetensors", ld.st_path);
    if (fd < 0)
        goto fail;
    st = lora_safetensors_open_fd(fd, ld.st_path, err, err_len);
    if (!st)
        goto fail;
    for (int i = 0; i < st->n_tensors; i++)
        if (classify_key(&ld, &st->tensors[i]) < 0)
            goto fail;
    if (take_weights(&ld) < 0)
        goto fail;
    goto out;
fail:
    lora_adapter_destroy(&ad);
out:
    if (ld.dir_fd >= 0)
        close(ld.dir_fd);
    lora_safetensors_close(&st);
    free(ld.layer_on);
    free(ld.ta);
    free(ld.tb);
    return ad;
}

void lora_adapter_destroy(struct lora_adapter **ap)
{
    struct lora_adapter *ad = ap ? *ap : NULL;
    if (!ad)
        return;
    int n = ad->n_layers * LORA_PROJ_COUNT;
    for (int i = 0; ad->a && i < n; i++)
        free(ad->a[i]);
    for (int i = 0; ad->b && i < n; i++)
        free(ad->b[i]);
    free(ad->a);
    free(ad->b);
    free(ad);
    *ap = NULL;
}
