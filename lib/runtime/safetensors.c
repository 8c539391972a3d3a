/* safetensors: read and write the Hugging Face safetensors format (see safetensors.h).
 *
 * Reading validates the whole header before handing out a single pointer, so a caller never
 * sees a tensor whose bytes lie outside the mapping. Writing streams the data through a small
 * conversion buffer, so writing a large model never holds a second copy of it in memory.
 */
#include "runtime/safetensors.h"

#include "base/errbuf.h"
#include "base/fs.h"
#include "base/json_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#define METADATA_KEY      "__metadata__"
#define LEN_BYTES         8          /* the little-endian header length in front of the JSON */
#define WRITE_CHUNK_ELEMS (64 << 10) /* elements converted per step on write */
#define WRITE_STDIO_BYTES (1u << 20) /* stdio buffer for the output file */
#define SHAPE_STR_BYTES   200        /* "[d0, d1, ...]" for LORA_SAFETENSORS_MAX_DIMS int64 dims */

/* ---- errors ---- */

/* Formats shape as "[d0, d1, ...]" into buf (SHAPE_STR_BYTES). */
static const char *shape_str(char *buf, const int64_t *shape, int n_dims)
{
    size_t len = 0;

    buf[len++] = '[';
    for (int i = 0; i < n_dims && len < SHAPE_STR_BYTES; i++) {
        int w = snprintf(buf + len, SHAPE_STR_BYTES - len, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    if (len + 2 <= SHAPE_STR_BYTES) {
        buf[len++] = ']';
        buf[len] = '\0';
    } else {
        buf[SHAPE_STR_BYTES - 1] = '\0';
    }
    return buf;
}

/* ---- reading ---- */

void lora_safetensors_close(struct lora_safetensors **st)
{
    struct lora_safetensors *s;

    if (!st || !*st)
        return;
    s = *st;
    for (int i = 0; i < s->n_tensors; i++)
        free(s->tensors[i].name);
    free(s->tensors);
    if (s->map)
        munmap(s->map, s->map_bytes);
    free(s->path);
    free(s);
    *st = NULL;
}

const struct lora_tensor_info *lora_safetensors_find(const struct lora_safetensors *st,
                                                     const char *name)
{
    if (!st || !name)
        return NULL;
    for (int i = 0; i < st->n_tensors; i++) {
        if (strcmp(st->tensors[i].name, name) == 0)
            return &st->tensors[i];
    }
    return NULL;
}

/* What parsing one header needs to know and where its errors go. */
struct parse_ctx {
    const char *path;
    const unsigned char *data; /* start of the data section */
    size_t data_bytes;
    char *err;
    size_t err_len;
};

/* Fills t->n_dims, t->shape and t->numel from the "shape" array. */
static int parse_shape(const struct parse_ctx *c, const char *name, const json_t *shape,
                       struct lora_tensor_info *t)
{
    char sbuf[SHAPE_STR_BYTES];
    size_t n;

    if (!shape) {
        lora_errf_path(c->err, c->err_len, c->path, "tensor '%s': missing \"shape\"", name);
        return -1;
    }
    if (!json_is_array(shape)) {
        lora_errf_path(c->err, c->err_len, c->path, "tensor '%s': \"shape\" is not an array", name);
        return -1;
    }
    n = json_array_size(shape);
    if (n > LORA_SAFETENSORS_MAX_DIMS) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': shape has %zu dims, more than the limit of %d", name, n,
                       LORA_SAFETENSORS_MAX_DIMS);
        return -1;
    }
    t->n_dims = (int)n;
    t->numel = 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d)) {
            lora_errf_path(c->err, c->err_len, c->path,
                           "tensor '%s': shape dim %zu is not an integer", name, i);
            return -1;
        }
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] < 0) {
            lora_errf_path(c->err, c->err_len, c->path,
                           "tensor '%s': shape dim %zu is negative (%" PRId64 ")", name, i,
                           t->shape[i]);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (__builtin_mul_overflow(t->numel, t->shape[i], &t->numel)) {
            lora_errf_path(c->err, c->err_len, c->path,
                           "tensor '%s': shape %s overflows the element count", name,
                           shape_str(sbuf, t->shape, t->n_dims));
            return -1;
        }
    }
    return 0;
}

/* Reads "data_offsets" as two non-negative integers with begin <= end. */
static int parse_offsets(const struct parse_ctx *c, const char *name, const json_t *offs,
                         int64_t *begin, int64_t *end)
{
    const json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);

    if (!offs) {
        lora_errf_path(c->err, c->err_len, c->path, "tensor '%s': missing \"data_offsets\"", name);
        return -1;
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(b) ||
        !json_is_integer(e)) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': \"data_offsets\" is not an array of two integers", name);
        return -1;
    }
    *begin = json_integer_value(b);
    *end = json_integer_value(e);
    if (*begin < 0 || *end < 0) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] are negative", name,
                       *begin, *end);
        return -1;
    }
    if (*begin > *end) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] begin after they end",
                       name, *begin, *end);
        return -1;
    }
    return 0;
}

/* Validates one header entry and fills t (except its name) from it. */
static int parse_entry(const struct parse_ctx *c, const char *name, const json_t *entry,
                       struct lora_tensor_info *t)
{
    char sbuf[SHAPE_STR_BYTES];
    const json_t *dtype;
    int64_t begin, end, need;

    if (!json_is_object(entry)) {
        lora_errf_path(c->err, c->err_len, c->path, "tensor '%s': entry is not an object", name);
        return -1;
    }
    dtype = json_object_get(entry, "dtype");
    if (!dtype) {
        lora_errf_path(c->err, c->err_len, c->path, "tensor '%s': missing \"dtype\"", name);
        return -1;
    }
    if (!json_is_string(dtype)) {
        lora_errf_path(c->err, c->err_len, c->path, "tensor '%s': \"dtype\" is not a string", name);
        return -1;
    }
    if (lora_dtype_parse(json_string_value(dtype), &t->dtype) < 0) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': unknown dtype (not F32, F16, BF16, F64, I64, I32, I16, I8, "
                       "U8 or BOOL)",
                       name);
        return -1;
    }
    if (parse_shape(c, name, json_object_get(entry, "shape"), t) < 0)
        return -1;
    if (parse_offsets(c, name, json_object_get(entry, "data_offsets"), &begin, &end) < 0)
        return -1;
    if ((uint64_t)end > c->data_bytes) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': truncated file: data_offsets [%" PRId64 ", %" PRId64
                       "] end past the data section of %zu bytes",
                       name, begin, end, c->data_bytes);
        return -1;
    }
    if (__builtin_mul_overflow(t->numel, (int64_t)lora_dtype_size(t->dtype), &need)) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': shape %s of %s overflows the byte count", name,
                       shape_str(sbuf, t->shape, t->n_dims), lora_dtype_name(t->dtype));
        return -1;
    }
    if (end - begin != need) {
        lora_errf_path(c->err, c->err_len, c->path,
                       "tensor '%s': size mismatch: data_offsets [%" PRId64 ", %" PRId64
                       "] hold %" PRId64 " bytes but shape %s of %s needs %" PRId64,
                       name, begin, end, end - begin, shape_str(sbuf, t->shape, t->n_dims),
                       lora_dtype_name(t->dtype), need);
        return -1;
    }
    t->data = c->data + begin;
    t->bytes = (size_t)(end - begin);
    return 0;
}

/* Orders tensors by where their data begins, then by size. */
static int cmp_by_data(const void *a, const void *b)
{
    const struct lora_tensor_info *x = *(const struct lora_tensor_info *const *)a;
    const struct lora_tensor_info *y = *(const struct lora_tensor_info *const *)b;
    const unsigned char *px = x->data, *py = y->data;

    if (px != py)
        return px < py ? -1 : 1;
    return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

/* Fails when two non-empty tensors share a byte; empty tensors hold no bytes to share. */
static int check_overlap(const struct parse_ctx *c, const struct lora_safetensors *st)
{
    const struct lora_tensor_info **order;
    const struct lora_tensor_info *prev = NULL;
    size_t prev_end = 0;
    int ret = 0;

    if (st->n_tensors < 2)
        return 0;
    order = malloc((size_t)st->n_tensors * sizeof(*order));
    if (!order) {
        lora_errf_path(c->err, c->err_len, c->path, "out of memory");
        return -1;
    }
    for (int i = 0; i < st->n_tensors; i++)
        order[i] = &st->tensors[i];
    qsort(order, (size_t)st->n_tensors, sizeof(*order), cmp_by_data);
    for (int i = 0; i < st->n_tensors; i++) {
        const struct lora_tensor_info *t = order[i];
        size_t begin = (size_t)((const unsigned char *)t->data - c->data);

        if (!t->bytes)
            continue;
        if (prev && begin < prev_end) {
            size_t prev_begin = (size_t)((const unsigned char *)prev->data - c->data);
            lora_errf_path(c->err, c->err_len, c->path,
                           "tensor '%s': data_offsets [%zu, %zu] overlap tensor '%s' [%zu, %zu]",
                           t->name, begin, begin + t->bytes, prev->name, prev_begin, prev_end);
            ret = -1;
            break;
        }
        if (!prev || begin + t->bytes > prev_end) {
            prev = t;
            prev_end = begin + t->bytes;
        }
    }
    free(order);
    return ret;
}

/* Checks "__metadata__": an object of string values. */
static int check_metadata(const struct parse_ctx *c, json_t *meta)
{
    const char *key;
    json_t *value;

    if (!json_is_object(meta)) {
        lora_errf_path(c->err, c->err_len, c->path, "\"" METADATA_KEY "\" is not an object");
        return -1;
    }
    json_object_foreach (meta, key, value) {
        if (!json_is_string(value)) {
            lora_errf_path(c->err, c->err_len, c->path,
                           "\"" METADATA_KEY "\" value '%s' is not a string", key);
            return -1;
        }
    }
    return 0;
}

/* Fills st->tensors from the parsed header root. */
static int parse_header(const struct parse_ctx *c, json_t *root, struct lora_safetensors *st)
{
    const char *key;
    json_t *value;
    json_t *meta;
    size_t n;

    if (!json_is_object(root)) {
        lora_errf_path(c->err, c->err_len, c->path, "header is not a JSON object");
        return -1;
    }
    n = json_object_size(root);
    meta = json_object_get(root, METADATA_KEY);
    if (meta) {
        if (check_metadata(c, meta) < 0)
            return -1;
        n--;
    }
    if (n > INT32_MAX) { /* the header size limit makes this impossible; n_tensors is an int */
        lora_errf_path(c->err, c->err_len, c->path, "too many tensors (%zu)", n);
        return -1;
    }
    if (n) {
        st->tensors = calloc(n, sizeof(*st->tensors));
        if (!st->tensors) {
            lora_errf_path(c->err, c->err_len, c->path, "out of memory");
            return -1;
        }
    }
    json_object_foreach (root, key, value) {
        struct lora_tensor_info *t;

        if (strcmp(key, METADATA_KEY) == 0)
            continue;
        t = &st->tensors[st->n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            lora_errf_path(c->err, c->err_len, c->path, "out of memory");
            return -1;
        }
        st->n_tensors++; /* counted now so that close() frees the name on failure */
        if (parse_entry(c, key, value, t) < 0)
            return -1;
    }
    return check_overlap(c, st);
}

/* Maps fd (a regular file; closed here either way) read-only into st->map / st->map_bytes. */
static int map_fd(int fd, const char *path, struct lora_safetensors *st, char *err, size_t err_len)
{
    struct stat sb;
    void *map;

    if (lora_fs_check_regular(fd, path, &sb, err, err_len) < 0)
        goto out_close;
    if (sb.st_size < LEN_BYTES) {
        lora_errf_path(err, err_len, path,
                       "file is %lld bytes, shorter than the %d-byte header length",
                       (long long)sb.st_size, LEN_BYTES);
        goto out_close;
    }
    /* off_t fits size_t on the 64-bit hosts we build for */
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        lora_errf_path(err, err_len, path, "unable to mmap: %s", strerror(errno));
        goto out_close;
    }
    close(fd);
    /* Pages read in by faults here come in 2 MiB folios, mapped 2 MiB at a time, in whatever
     * order the loader touches the tensors (docs/design.md, "Mapped pages"). Best effort. */
    (void)madvise(map, (size_t)sb.st_size, MADV_HUGEPAGE);
    st->map = map;
    st->map_bytes = (size_t)sb.st_size;
    return 0;

out_close:
    close(fd);
    return -1;
}

void lora_safetensors_release(const struct lora_safetensors *st, const struct lora_tensor_info *t)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), base = (uintptr_t)st->map;
    uintptr_t lo = (uintptr_t)t->data / page * page;
    uintptr_t hi = ((uintptr_t)t->data + t->bytes + page - 1) / page * page;

    hi = hi < base + st->map_bytes ? hi : base + st->map_bytes;
    if (lo >= base && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* best effort */
}

struct lora_safetensors *lora_safetensors_open(const char *path, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!path) {
        lora_errf_path(err, err_len, path, "no path given");
        return NULL;
    }
    /* Without blocking: a FIFO in the file's place must fail at once, not hang the reader. */
    int fd = lora_fs_open_regular(AT_FDCWD, path, path, true, NULL, err, err_len);
    if (fd < 0)
        return NULL;
    return lora_safetensors_open_fd(fd, path, err, err_len);
}

struct lora_safetensors *lora_safetensors_open_fd(int fd, const char *path, char *err,
                                                  size_t err_len)
{
    struct lora_safetensors *st = NULL;
    const unsigned char *base;
    json_t *root = NULL;
    json_error_t jerr;
    uint64_t header_len = 0;
    struct parse_ctx c;

    if (err && err_len)
        err[0] = '\0';
    st = calloc(1, sizeof(*st));
    if (!st || !(st->path = strdup(path))) {
        lora_errf_path(err, err_len, path, "out of memory");
        close(fd);
        goto out_fail;
    }
    if (map_fd(fd, path, st, err, err_len) < 0)
        goto out_fail;
    base = st->map;
    for (int i = LEN_BYTES - 1; i >= 0; i--)
        header_len = header_len << 8 | base[i];
    if (header_len == 0) {
        lora_errf_path(err, err_len, path, "header length is 0");
        goto out_fail;
    }
    if (header_len > LORA_SAFETENSORS_MAX_HEADER) {
        /* The value is not shown: it is the file's first 8 bytes, whatever the file is. */
        lora_errf_path(err, err_len, path,
                       "not a safetensors file: the header length (bytes 0 to 7) exceeds the "
                       "limit of %u bytes",
                       LORA_SAFETENSORS_MAX_HEADER);
        goto out_fail;
    }
    if (header_len > st->map_bytes - LEN_BYTES) {
        lora_errf_path(err, err_len, path,
                       "truncated or not a safetensors file: the header length (bytes 0 to 7) "
                       "runs past the end of the file (%zu bytes)",
                       st->map_bytes);
        goto out_fail;
    }
    /* duplicate names would silently hide a tensor; NUL in a name is rejected by default;
     * any JSON value decodes so that a non-object gets the clearer message below */
    root = json_loadb((const char *)base + LEN_BYTES, (size_t)header_len,
                      JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        /* Where, and what kind of error; never jansson's text, which quotes the file. */
        lora_errf_path(err, err_len, path, "invalid JSON header at byte %lld: %s",
                       (long long)LEN_BYTES + jerr.position, lora_json_error_what(&jerr));
        goto out_fail;
    }
    c.path = path;
    c.data = base + LEN_BYTES + header_len;
    c.data_bytes = st->map_bytes - LEN_BYTES - (size_t)header_len;
    c.err = err;
    c.err_len = err_len;
    if (parse_header(&c, root, st) < 0)
        goto out_fail;
    json_decref(root);
    return st;

out_fail:
    json_decref(root);
    lora_safetensors_close(&st);
    return NULL;
}

/* ---- writing ---- */

/* Returns the element count of t, or -1 (with err) when its dtype or shape is invalid. */
static int64_t out_numel(const char *path, const struct lora_tensor_out *t, char *err,
                         size_t err_len)
{
    int64_t numel = 1;

    if (t->dtype != LORA_DTYPE_F32 && t->dtype != LORA_DTYPE_F16 && t->dtype != LORA_DTYPE_BF16) {
        lora_errf_path(err, err_len, path,
                       "tensor '%s': cannot write dtype %s (only F32, F16, BF16)", t->name,
                       lora_dtype_name(t->dtype));
        return -1;
    }
    if (t->n_dims < 0 || t->n_dims > LORA_SAFETENSORS_MAX_DIMS) {
        lora_errf_path(err, err_len, path, "tensor '%s': %d dims, outside 0..%d", t->name,
                       t->n_dims, LORA_SAFETENSORS_MAX_DIMS);
        return -1;
    }
    for (int i = 0; i < t->n_dims; i++) {
        if (t->shape[i] < 0) {
            lora_errf_path(err, err_len, path,
                           "tensor '%s': shape dim %d is negative (%" PRId64 ")", t->name, i,
                           t->shape[i]);
            return -1;
        }
        if (__builtin_mul_overflow(numel, t->shape[i], &numel)) {
            lora_errf_path(err, err_len, path, "tensor '%s': shape overflows the element count",
                           t->name);
            return -1;
        }
    }
    if (numel && !t->data) {
        lora_errf_path(err, err_len, path, "tensor '%s': no data", t->name);
        return -1;
    }
    return numel;
}

/* Adds one tensor entry at data_offsets [*offset, *offset + bytes] and advances *offset. */
static int header_add(const char *path, json_t *root, const struct lora_tensor_out *t,
                      int64_t *offset, char *err, size_t err_len)
{
    json_t *shape, *entry;
    int64_t numel, bytes, end;

    numel = out_numel(path, t, err, err_len);
    if (numel < 0)
        return -1;
    if (strcmp(t->name, METADATA_KEY) == 0 || json_object_get(root, t->name)) {
        lora_errf_path(err, err_len, path, "tensor '%s': name is reserved or used twice", t->name);
        return -1;
    }
    if (__builtin_mul_overflow(numel, (int64_t)lora_dtype_size(t->dtype), &bytes) ||
        __builtin_add_overflow(*offset, bytes, &end)) {
        lora_errf_path(err, err_len, path, "tensor '%s': data size overflows", t->name);
        return -1;
    }
    shape = json_array();
    for (int i = 0; shape && i < t->n_dims; i++) {
        if (json_array_append_new(shape, json_integer(t->shape[i])) < 0) {
            json_decref(shape);
            shape = NULL;
        }
    }
    /* "o" steals shape, also on failure; a NULL shape makes the pack fail */
    entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", lora_dtype_name(t->dtype), "shape", shape,
                      "data_offsets", (json_int_t)*offset, (json_int_t)end);
    if (!entry || json_object_set_new(root, t->name, entry) < 0) {
        lora_errf_path(
            err, err_len, path,
            "tensor '%s': unable to add to the header (name not UTF-8, or out of memory)", t->name);
        return -1;
    }
    *offset = end;
    return 0;
}

/* Returns the compact header JSON (the caller's), or NULL with err. */
static char *header_build(const char *path, const struct lora_tensor_out *tensors, int n, char *err,
                          size_t err_len)
{
    json_t *root;
    char *text = NULL;
    int64_t offset = 0;

    root = json_pack("{s:{s:s}}", METADATA_KEY, "format", "pt");
    if (!root) {
        lora_errf_path(err, err_len, path, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!tensors[i].name) {
            lora_errf_path(err, err_len, path, "tensor %d has no name", i);
            goto out;
        }
        if (header_add(path, root, &tensors[i], &offset, err, err_len) < 0)
            goto out;
    }
    text = json_dumps(root, JSON_COMPACT);
    if (!text)
        lora_errf_path(err, err_len, path, "out of memory");
out:
    json_decref(root);
    return text;
}

/* Writes len bytes; returns 0 or -1 with errno set. */
static int put(FILE *f, const void *p, size_t len)
{
    errno = 0;
    if (len && fwrite(p, 1, len, f) != len) {
        if (!errno)
            errno = EIO;
        return -1;
    }
    return 0;
}

/* Writes t's numel elements converted to its dtype, through chunk (WRITE_CHUNK_ELEMS). */
static int put_tensor(FILE *f, const struct lora_tensor_out *t, uint16_t *chunk)
{
    size_t numel = 1;

    for (int i = 0; i < t->n_dims; i++)
        numel *= (size_t)t->shape[i]; /* checked for overflow when the header was built */
    if (t->dtype == LORA_DTYPE_F32)   /* little-endian host: floats go out as they are */
        return put(f, t->data, numel * sizeof(float));
    for (size_t done = 0; done < numel;) {
        size_t n = numel - done < WRITE_CHUNK_ELEMS ? numel - done : WRITE_CHUNK_ELEMS;
        for (size_t i = 0; i < n; i++) {
            float v = t->data[done + i];
            chunk[i] = t->dtype == LORA_DTYPE_BF16 ? lora_f32_to_bf16(v) : lora_f32_to_f16(v);
        }
        if (put(f, chunk, n * sizeof(*chunk)) < 0)
            return -1;
        done += n;
    }
    return 0;
}

/* Writes the length, padded header and data of the file to f. */
static int put_file(FILE *f, const char *header, const struct lora_tensor_out *tensors, int n,
                    uint16_t *chunk)
{
    static const char spaces[] = "       "; /* pad is at most 7 */
    size_t len = strlen(header);
    size_t pad = (8 - len % 8) % 8;
    uint64_t header_len = len + pad;
    unsigned char le[LEN_BYTES];

    for (int i = 0; i < LEN_BYTES; i++)
        le[i] = (unsigned char)(header_len >> (8 * i));
    if (put(f, le, sizeof(le)) < 0 || put(f, header, len) < 0 || put(f, spaces, pad) < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if (put_tensor(f, &tensors[i], chunk) < 0)
            return -1;
    }
    return 0;
}

/* A large file just written sits in the page cache in the small pages of its writes, and a
 * reader that maps it in place gets 4 KiB mappings, whose TLB misses slowed decoding a 15 GB bf16
 * model 9-fold (docs/design.md, "Mapped pages"). Written back and dropped from the cache, it is
 * read again into large folios that the kernel maps 2 MiB at a time. Best effort: small files
 * are left alone. */
static void drop_from_page_cache(int fd)
{
    struct stat sb;

    if (fstat(fd, &sb) == 0 && sb.st_size >= ((off_t)256 << 20) && fdatasync(fd) == 0)
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

int lora_safetensors_write(const char *path, const struct lora_tensor_out *tensors, int n,
                           char *err, size_t err_len)
{
    char *header = NULL, *tmp = NULL, *vbuf = NULL;
    uint16_t *chunk = NULL;
    FILE *f = NULL;
    int ret = -1;

    if (err && err_len)
        err[0] = '\0';
    if (!path || n < 0 || (n > 0 && !tensors)) {
        lora_errf_path(err, err_len, path, "invalid arguments");
        return -1;
    }
    header = header_build(path, tensors, n, err, err_len);
    if (!header)
        return -1;
    tmp = malloc(strlen(path) + sizeof(".tmp"));
    chunk = malloc(WRITE_CHUNK_ELEMS * sizeof(*chunk));
    if (!tmp || !chunk) {
        lora_errf_path(err, err_len, path, "out of memory");
        goto out_free;
    }
    strcpy(tmp, path);
    strcat(tmp, ".tmp");
    f = fopen(tmp, "wb");
    if (!f) {
        lora_errf_path(err, err_len, path, "unable to create '%s': %s", tmp, strerror(errno));
        goto out_free;
    }
    /* a big buffer only speeds things up; without one stdio's default still works */
    vbuf = malloc(WRITE_STDIO_BYTES);
    if (vbuf)
        setvbuf(f, vbuf, _IOFBF, WRITE_STDIO_BYTES);
    if (put_file(f, header, tensors, n, chunk) < 0 || fflush(f) != 0) {
        lora_errf_path(err, err_len, path, "unable to write: %s", strerror(errno));
        goto out_unlink;
    }
    drop_from_page_cache(fileno(f));
    errno = 0;
    if (fclose(f) != 0) {
        f = NULL;
        lora_errf_path(err, err_len, path, "unable to write: %s", strerror(errno ? errno : EIO));
        goto out_unlink;
    }
    f = NULL;
    if (rename(tmp, path) < 0) {
        lora_errf_path(err, err_len, path, "unable to rename '%s': %s", tmp, strerror(errno));
        goto out_unlink;
    }
    ret = 0;
    goto out_free;

out_unlink:
    if (f)
        fclose(f);
    f = NULL;
    unlink(tmp);
out_free:
    free(vbuf);
    free(chunk);
    free(tmp);
    free(header);
    return ret;
}

char *lora_tensor_shape_str(const struct lora_tensor_info *t, char *buf, size_t len)
{
    size_t at = 0;

    if (len == 0)
        return buf;
    buf[0] = 0;
    for (int i = -1; i <= t->n_dims && at < len; i++) {
        int n;
        if (i < 0)
            n = snprintf(buf + at, len - at, "[");
        else if (i == t->n_dims)
            n = snprintf(buf + at, len - at, "]");
        else
            n = snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        at += n > 0 ? (size_t)n : 0;
    }
    return buf;
}
