/* fixture: shared helpers of the C unit tests; see fixture.h. */
#include "fixture.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"

#define ERR_BYTES 1024
#define N_BUFS    8 /* rotating static buffers per path helper */

char fx_tmp_dir[FX_TMP_DIR_BYTES];

static int *cur_failed;

static void mark_failed(void)
{
    if (cur_failed)
        *cur_failed = 1;
}

int fx_init(const char *tmp_template, int *failed)
{
    cur_failed = failed;
    if (snprintf(fx_tmp_dir, sizeof(fx_tmp_dir), "%s", tmp_template) >= (int)sizeof(fx_tmp_dir)) {
        fprintf(stderr, "fx_init: template too long: %s\n", tmp_template);
        return -1;
    }
    if (!mkdtemp(fx_tmp_dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

void fx_cleanup(void)
{
    lora_fs_remove_tree(fx_tmp_dir);
}

struct lora_backend *fx_backend(void)
{
    static struct lora_backend *be;
    char err[256];

    if (!be && !(be = lora_backend_open("cpu", err, sizeof(err)))) {
        printf("Bail out! %s\n", err);
        exit(1);
    }
    return be;
}

const char *fx_tmp_path(const char *fmt, ...)
{
    static char bufs[N_BUFS][FX_PATH_BYTES];
    static int next;
    char *buf = bufs[next++ % N_BUFS];
    va_list ap;
    int n = snprintf(buf, FX_PATH_BYTES, "%s/", fx_tmp_dir);

    va_start(ap, fmt);
    vsnprintf(buf + n, FX_PATH_BYTES - (size_t)n, fmt, ap);
    va_end(ap);
    return buf;
}

const char *fx_join(const char *dir, const char *name)
{
    static char bufs[N_BUFS][FX_PATH_BYTES];
    static int next;
    char *buf = bufs[next++ % N_BUFS];

    snprintf(buf, FX_PATH_BYTES, "%s/%s", dir, name);
    return buf;
}

const char *fx_gen_model(const char *name, const struct lora_synthetic_model_opts *o)
{
    const char *dir = fx_tmp_path("%s", name);
    char err[ERR_BYTES] = "";

    lora_fs_remove_tree(dir);
    if (lora_synthetic_model_write(dir, o, err, sizeof(err)) != 0) {
        printf("# gen_model %s: %s\n", name, err);
        mark_failed();
    }
    return dir;
}

int fx_json_file_set(const char *path, const char *key, json_t *value)
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

int fx_json_file_del(const char *path, const char *key)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_PRESERVE_ORDER, &jerr);
    int rc = -1;

    if (root && json_object_del(root, key) == 0)
        rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc;
}

int fx_write_text(const char *path, const char *text)
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

long fx_n_differ(const float *a, const float *b, long n)
{
    long bad = 0;

    for (long i = 0; i < n; i++)
        bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return bad;
}

/* ---- tensor sets -------------------------------------------------------------------------- */

int64_t fx_tensor_numel(const struct lora_tensor_out *t)
{
    int64_t n = 1;

    for (int d = 0; d < t->n_dims; d++)
        n *= t->shape[d];
    return n;
}

void fx_tset_free(struct fx_tset *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        free(s->data[i]);
    }
    s->n = 0;
}

void fx_tset_add(struct fx_tset *s, const char *name, int n_dims, int64_t d0, int64_t d1,
                 float fill)
{
    struct lora_tensor_out *t;
    int64_t n;
    int i;

    if (s->n >= FX_MAX_TENSORS) {
        printf("# tset_add: more than %d tensors\n", FX_MAX_TENSORS);
        mark_failed();
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
    n = fx_tensor_numel(t);
    s->data[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t k = 0; k < n; k++)
        s->data[i][k] = fill;
    t->data = s->data[i];
}

int fx_tset_read(struct fx_tset *s, const char *path)
{
    char err[ERR_BYTES];
    struct lora_safetensors *st = lora_safetensors_open(path, err, sizeof(err));

    memset(s, 0, sizeof(*s));
    if (!st || st->n_tensors > FX_MAX_TENSORS) {
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

int fx_tset_find(const struct fx_tset *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0)
            return i;
    return -1;
}

int fx_tset_drop(struct fx_tset *s, const char *name)
{
    int i = fx_tset_find(s, name);

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

int fx_tset_reshape(struct fx_tset *s, const char *name, int n_dims, int64_t d0, int64_t d1)
{
    if (fx_tset_drop(s, name) < 0)
        return -1;
    fx_tset_add(s, name, n_dims, d0, d1, 0.25f);
    return 0;
}

int fx_tset_write(const struct fx_tset *s, const char *path)
{
    char err[ERR_BYTES];

    if (lora_safetensors_write(path, s->t, s->n, err, sizeof(err)) != 0) {
        printf("# tset_write: %s\n", err);
        return -1;
    }
    return 0;
}
