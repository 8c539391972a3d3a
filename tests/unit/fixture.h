/* fixture: the temporary directory, files and tensor sets that the C unit tests build their
 * cases from (generated models, edited JSON configs, safetensors files read, edited and written
 * back).
 *
 * A test program calls fx_init() before its first test and fx_cleanup() after its last. Helpers
 * that cannot build a fixture print a "# ..." diagnostic and mark the current test failed
 * through the flag given to fx_init (check.h's check_cur_failed is private to each program).
 * A returned path lives in one of eight static buffers that its helper reuses in turn
 * (fx_gen_model's are fx_tmp_path's).
 */
#ifndef LORA_TEST_FIXTURE_H
#define LORA_TEST_FIXTURE_H

#include <stdint.h>

#include <jansson.h>

#include "backend/backend.h"
#include "runtime/safetensors.h"
#include "runtime/synthetic.h"

#define FX_TMP_DIR_BYTES 64 /* room for "/tmp/<name>.XXXXXX" */
#define FX_PATH_BYTES    512
#define FX_MAX_TENSORS   128

/* The program's temporary directory, created by fx_init. */
extern char fx_tmp_dir[FX_TMP_DIR_BYTES];

/* Creates fx_tmp_dir from tmp_template (a mkdtemp template ending in XXXXXX) and records
 * failed as the flag to set when a helper fails. Returns 0, or -1 after perror. */
int fx_init(const char *tmp_template, int *failed);

/* Removes fx_tmp_dir and everything under it. */
void fx_cleanup(void);

/* The CPU backend the program's models, caches and forward passes live on, opened on first use
 * and kept until the process exits. */
struct lora_backend *fx_backend(void);

/* fx_tmp_dir/<formatted name>. */
const char *fx_tmp_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* dir/name. */
const char *fx_join(const char *dir, const char *name);

/* Writes a fresh model under fx_tmp_dir/name (removing what was there) and returns its path;
 * on failure the test is marked failed and the path is returned all the same. */
const char *fx_gen_model(const char *name, const struct lora_synthetic_model_opts *o);

/* Sets key of the JSON object in path to value (stolen). Returns 0 or -1. */
int fx_json_file_set(const char *path, const char *key, json_t *value);

/* Removes key from the JSON object in path. Returns 0 or -1. */
int fx_json_file_del(const char *path, const char *key);

/* Writes text to path, replacing it. Returns 0 or -1. */
int fx_write_text(const char *path, const char *text);

/* Number of the n floats at a and b that differ (bitwise-equal values are expected). */
long fx_n_differ(const float *a, const float *b, long n);

/* ---- tensor sets: a safetensors file read into floats, edited and written back ----------- */

/* t[i] describes tensor i as F32; its name and data are names[i] and data[i], owned here. */
struct fx_tset {
    struct lora_tensor_out t[FX_MAX_TENSORS];
    char *names[FX_MAX_TENSORS];
    float *data[FX_MAX_TENSORS];
    int n;
};

/* Number of elements of t (the product of its shape). */
int64_t fx_tensor_numel(const struct lora_tensor_out *t);

/* Frees every tensor of s and leaves it empty. */
void fx_tset_free(struct fx_tset *s);

/* Appends a tensor of shape (d0) or (d0, d1) filled with fill; past FX_MAX_TENSORS the test
 * is marked failed instead. */
void fx_tset_add(struct fx_tset *s, const char *name, int n_dims, int64_t d0, int64_t d1,
                 float fill);

/* Reads every tensor of path as float32 into s (which need not be initialised). Returns 0 or
 * -1 (with a diagnostic). */
int fx_tset_read(struct fx_tset *s, const char *path);

/* Index of tensor name in s, or -1. */
int fx_tset_find(const struct fx_tset *s, const char *name);

/* Removes tensor name; returns 0 or -1 when there is none. */
int fx_tset_drop(struct fx_tset *s, const char *name);

/* Gives tensor name the shape (d0) or (d0, d1), with new data. Returns 0 or -1 when there is
 * no such tensor. */
int fx_tset_reshape(struct fx_tset *s, const char *name, int n_dims, int64_t d0, int64_t d1);

/* Writes s to path through lora_safetensors_write. Returns 0 or -1 (with a diagnostic). */
int fx_tset_write(const struct fx_tset *s, const char *path);

#endif
