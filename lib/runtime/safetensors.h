/* safetensors: read and write the Hugging Face safetensors format.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., optional
 * "__metadata__": {string: string}}), then the data section; offsets are relative to its start.
 *
 * Reading mmaps the file read-only and validates everything before returning: header length
 * within the file and at most LORA_SAFETENSORS_MAX_HEADER bytes, valid JSON object, every entry
 * with a known dtype, a shape of at most LORA_SAFETENSORS_MAX_DIMS non-negative dims, offsets in
 * order, inside the data section, and end - begin equal to numel * dtype size, no two tensors
 * overlapping. Every error names the file and, where there is one, the tensor; a parse error
 * gives the byte position and never quotes the file's bytes. The file is opened without
 * blocking and must be a regular file (a FIFO or a device in its place fails at once).
 * Tensor data pointers stay valid until lora_safetensors_close(). Little-endian hosts only.
 */
#ifndef LORA_SAFETENSORS_H
#define LORA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#define LORA_SAFETENSORS_MAX_HEADER (100u << 20)
#define LORA_SAFETENSORS_MAX_DIMS 8

/* The element types are backend/backend.h's enum lora_dtype, with their size, name and
 * conversion helpers: the header's "dtype" parses into it. Only F32, F16 and BF16 convert to
 * float; the others are listed so that a file holding them still opens (a model never uses
 * them). */

struct lora_tensor_info {
    char *name;
    enum lora_dtype dtype;
    int n_dims;
    int64_t shape[LORA_SAFETENSORS_MAX_DIMS];
    int64_t numel;
    const void *data; /* into the mapping; may be unaligned for its type */
    size_t bytes;
};

struct lora_safetensors {
    char *path;
    void *map;
    size_t map_bytes;
    struct lora_tensor_info *tensors; /* in header order */
    int n_tensors;
};

/* Opens and validates path. Returns NULL and writes "path: reason" (with the tensor name where
 * one is at fault) into err on failure. */
struct lora_safetensors *lora_safetensors_open(const char *path, char *err, size_t err_len);

/* The same from fd, open for reading (closed here either way); path names the file in errors.
 * It must be a regular file. */
struct lora_safetensors *lora_safetensors_open_fd(int fd, const char *path, char *err,
                                                  size_t err_len);

/* Unmaps and frees *st, then sets *st to NULL. Accepts NULL and *st == NULL. */
void lora_safetensors_close(struct lora_safetensors **st);

/* Drops this process's mapping of t's bytes (whole pages around them; the page cache keeps the
 * file): for a tensor copied into a buffer of its own, so that its source no longer counts as
 * resident. A later read maps the pages again. */
void lora_safetensors_release(const struct lora_safetensors *st,
                              const struct lora_tensor_info *t);

/* Returns the tensor called name, or NULL. Borrowed. */
const struct lora_tensor_info *lora_safetensors_find(const struct lora_safetensors *st,
                                                     const char *name);

/* Writes t's shape as "[d0, d1, ...]" into buf (truncated to len). Returns buf. */
char *lora_tensor_shape_str(const struct lora_tensor_info *t, char *buf, size_t len);

/* One tensor to write: data is always float; it is converted to dtype on write. */
struct lora_tensor_out {
    const char *name;
    enum lora_dtype dtype; /* F32, F16 or BF16 */
    int n_dims;
    int64_t shape[LORA_SAFETENSORS_MAX_DIMS];
    const float *data; /* numel floats, row-major */
};

/* Writes n tensors to path in the given order, header padded with spaces to a multiple of 8
 * bytes, with "__metadata__": {"format": "pt"}. Writes to a temporary name and renames, so a
 * reader never sees a half-written file. Returns 0, or -1 with a message in err. */
int lora_safetensors_write(const char *path, const struct lora_tensor_out *tensors, int n,
                           char *err, size_t err_len);

#endif
