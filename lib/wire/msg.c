/* msg: the msgpack codec of the message catalogue (see msg.h, docs/design.md, "Wire protocol"):
 * type names, the arena, the primitives every message family uses (msg_codec.h), and the messages
 * all peers share (hello, the empty ones). The families are in msg_worker.c, msg_frontend.c and
 * msg_publish.c; msgpack headers are read in msg_scan.c alone.
 *
 * Encoding packs straight into the caller's buffer through a msgpack_packer write callback; on
 * any failure the buffer is put back to its length before the call, so a message is appended
 * whole or not at all.
 *
 * Decoding goes in three passes over untrusted bytes:
 *   1. scan (msg_scan.c): a walk over the raw msgpack, which checks that the body is exactly one
 *      complete value, that no container declares more elements than there are bytes left and
 *      that nesting stays shallow. msgpack-c allocates a container's elements as soon as it reads
 *      the header, so this pass is what bounds its memory: at most one msgpack_object (24 bytes)
 *      per body byte, and the body is at most LORA_MSG_MAX_BODY bytes;
 *   2. msgpack_unpack into the arena's msgpack_zone (cleared after every decode, so the tree's
 *      memory is reused);
 *   3. the typed walk: every key looked up, typed, range-checked, every array bounded before the
 *      arena allocation that holds it; strings and arrays are copied into the arena, so the
 *      decoded struct does not point into the body or the frames.
 * Errors read "TYPE: KEY: what is wrong", with KEY a path for nested fields
 * ("step: seqs[2].n_tokens: expected an integer").
 */
#include "wire/msg_codec.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_CHUNK (64 << 10) /* bytes of an ordinary arena chunk */
#define ZONE_CHUNK  8192       /* msgpack_zone chunk size */

/* ---- names ---------------------------------------------------------------------------------- */

static const char *const type_names[LORA_MSG_TYPE_COUNT] = {
    [LORA_MSG_HELLO] = "hello",
    [LORA_MSG_READY] = "ready",
    [LORA_MSG_HEARTBEAT] = "heartbeat",
    [LORA_MSG_SETUP] = "setup",
    [LORA_MSG_SETUP_DONE] = "setup_done",
    [LORA_MSG_STEP] = "step",
    [LORA_MSG_STEP_REPLY] = "step_reply",
    [LORA_MSG_ADAPTER_OP] = "adapter_op",
    [LORA_MSG_ADAPTER_OP_REPLY] = "adapter_op_reply",
    [LORA_MSG_TAKE_NOTIFICATIONS] = "take_notifications",
    [LORA_MSG_NOTIFICATIONS] = "notifications",
    [LORA_MSG_RESIDENCY] = "residency",
    [LORA_MSG_RESIDENCY_REPLY] = "residency_reply",
    [LORA_MSG_REQUEST] = "request",
    [LORA_MSG_ABORT] = "abort",
    [LORA_MSG_OUTPUT] = "output",
    [LORA_MSG_EVENT] = "event",
    [LORA_MSG_STATS] = "stats",
    [LORA_MSG_CONTROL] = "control",
    [LORA_MSG_CONTROL_REPLY] = "control_reply",
    [LORA_MSG_REGISTRY] = "registry",
    [LORA_MSG_SHUTDOWN] = "shutdown",
    [LORA_MSG_REQUEST_STATS] = "request_stats",
};

/* Enum values travel as these strings; tables only grow at the end, like the enums. The
 * families keep their own (op, event, control). */
static const char *const role_names[] = {"worker", "frontend", "inspect"};
const char *const lora_msg_transition_names[4] = {"load", "activate", "evict", "remove"};

const char *lora_msg_type_name(enum lora_msg_type t)
{
    if ((int)t < 0 || t >= LORA_MSG_TYPE_COUNT)
        return "unknown";
    return type_names[t];
}

static int name_lookup(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++) {
        if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0)
            return i;
    }
    return -1;
}

int lora_msg_type_from_name(const char *name, size_t len)
{
    if (!name)
        return -1;
    return name_lookup(type_names, LORA_MSG_TYPE_COUNT, name, len);
}

/* ---- arena ---------------------------------------------------------------------------------- */

struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    max_align_t data[]; /* cap bytes */
};

struct lora_msg_arena {
    struct arena_chunk *head;  /* where allocations go; newest first */
    struct arena_chunk *first; /* kept by reset */
    msgpack_zone *zone;        /* msgpack_unpack's object tree, cleared after each decode */
};

static struct arena_chunk *chunk_new(size_t cap)
{
    if (cap > SIZE_MAX - sizeof(struct arena_chunk))
        return NULL;
    struct arena_chunk *c = malloc(sizeof(*c) + cap);
    if (!c)
        return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    return c;
}

struct lora_msg_arena *lora_msg_arena_new(void)
{
    struct lora_msg_arena *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->first = a->head = chunk_new(ARENA_CHUNK);
    a->zone = msgpack_zone_new(ZONE_CHUNK);
    if (!a->first || !a->zone) {
        lora_msg_arena_destroy(&a);
        return NULL;
    }
    return a;
}

void lora_msg_arena_reset(struct lora_msg_arena *a)
{
    while (a->head != a->first) {
        struct arena_chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
    a->first->used = 0;
}

void lora_msg_arena_destroy(struct lora_msg_arena **ap)
{
    struct lora_msg_arena *a = *ap;
    if (!a)
        return;
    while (a->head) {
        struct arena_chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
    if (a->zone)
        msgpack_zone_free(a->zone);
    free(a);
    *ap = NULL;
}

/* NULL too when n * size == 0. */
void *lora_msg_arena_alloc(struct lora_msg_arena *a, size_t n, size_t size)
{
    const size_t align = sizeof(max_align_t);

    if (n == 0 || size == 0 || n > SIZE_MAX / size)
        return NULL;
    size_t bytes = n * size;
    if (bytes > SIZE_MAX - align)
        return NULL;
    bytes = (bytes + align - 1) / align * align;
    struct arena_chunk *c = a->head;
    if (bytes > c->cap - c->used) {
        c = chunk_new(bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK);
        if (!c)
            return NULL;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += bytes;
    return p;
}

/* ---- pass 1 and 2: the body checked and unpacked; its type without unpacking ------------- */

/* "WHAT: body: WHY (byte N of LEN)" into err. */
static void body_error(char *err, size_t err_len, const char *what, const char *why, size_t where,
                       size_t len)
{
    if (where == LORA_MSG_SCAN_WHOLE_BODY)
        snprintf(err, err_len, "%s: body: %s (%zu bytes)", what, why, len);
    else
        snprintf(err, err_len, "%s: body: %s at byte %zu of %zu", what, why, where, len);
}

/* Scans and unpacks into zone. Returns 0, or -1 with err. */
static int unpack_body(const void *body, size_t len, msgpack_zone *zone, msgpack_object *root,
                       const char *what, char *err, size_t err_len)
{
    const char *why;
    size_t where, off = 0;

    if (lora_msg_scan_body(body, len, &why, &where) < 0) {
        body_error(err, err_len, what, why, where, len);
        return -1;
    }
    switch (msgpack_unpack(body, len, &off, zone, root)) {
    case MSGPACK_UNPACK_SUCCESS:
        return 0;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        snprintf(err, err_len, "%s: body: out of memory", what);
        return -1;
    default:
        snprintf(err, err_len, "%s: body: invalid msgpack", what);
        return -1;
    }
}

/* Reads "type" straight from the bytes: no allocation, so a router can afford it per message. */
int lora_msg_peek_type(const void *body, size_t len, char *err, size_t err_len)
{
    const unsigned char *v;
    const char *why;
    size_t where, vlen;
    struct lora_msg_scan_hdr h;
    int n, t;

    if (!err)
        err_len = 0;
    if (lora_msg_scan_body(body, len, &why, &where) < 0) {
        body_error(err, err_len, "message", why, where, len);
        return -1;
    }
    if (!lora_msg_scan_is_map(*(const unsigned char *)body)) {
        snprintf(err, err_len, "message: body: not a map");
        return -1;
    }
    lora_msg_scan_find_key(body, len, "type", &v, &vlen, &n);
    if (n == 0) {
        snprintf(err, err_len, "message: type: missing");
        return -1;
    }
    if (n > 1) {
        snprintf(err, err_len, "message: type: duplicate key");
        return -1;
    }
    if (!lora_msg_scan_is_str(*v) || lora_msg_scan_header(v, v + vlen, &h) <= 0) {
        snprintf(err, err_len, "message: type: expected a string");
        return -1;
    }
    t = lora_msg_type_from_name((const char *)v + h.hdr, (size_t)h.payload);
    if (t < 0) {
        int shown = h.payload > 64 ? 64 : (int)h.payload;
        snprintf(err, err_len, "message: type: unknown type '%.*s'", shown,
                 (const char *)v + h.hdr);
    }
    return t;
}

/* ---- pass 3: typed decoding ----------------------------------------------------------------- */

void lora_msg_dec_fail(struct lora_msg_dec *d, const char *key, long idx, const char *fmt, ...)
{
    char what[256], at[32] = "";
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (idx >= 0)
        snprintf(at, sizeof(at), "[%ld]", idx);
    if (d->err && d->err_len)
        snprintf(d->err, d->err_len, "%s: %s%s%s%s: %s", d->type, d->path, d->path_len ? "." : "",
                 key, at, what);
}

/* Enters element idx of array key for error paths; returns the mark to leave with. */
size_t lora_msg_dec_path_push(struct lora_msg_dec *d, const char *key, long idx)
{
    size_t mark = d->path_len;
    int n;

    if (idx >= 0)
        n = snprintf(d->path + mark, sizeof(d->path) - mark, "%s%s[%ld]", mark ? "." : "", key,
                     idx);
    else
        n = snprintf(d->path + mark, sizeof(d->path) - mark, "%s%s", mark ? "." : "", key);
    if (n > 0)
        d->path_len = mark + (size_t)n < sizeof(d->path) ? mark + (size_t)n : sizeof(d->path) - 1;
    return mark;
}

void lora_msg_dec_path_pop(struct lora_msg_dec *d, size_t mark)
{
    d->path_len = mark;
    d->path[mark] = '\0';
}

int lora_msg_dec_no_memory(struct lora_msg_dec *d, const char *key)
{
    return FAIL(d, key, -1, "out of memory");
}

/* *v = the value of key, NULL when absent; -1 for a key given twice. */
int lora_msg_find(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                  const msgpack_object **v)
{
    size_t klen = strlen(key);

    *v = NULL;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR || k->via.str.size != klen ||
            memcmp(k->via.str.ptr, key, klen) != 0)
            continue;
        if (*v)
            return FAIL(d, key, -1, "duplicate key");
        *v = &m->ptr[i].val;
    }
    return 0;
}

int lora_msg_need(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                  const msgpack_object **v)
{
    if (lora_msg_find(d, m, key, v) < 0)
        return -1;
    if (!*v)
        return FAIL(d, key, -1, "missing");
    return 0;
}

int lora_msg_as_i64(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    int64_t lo, int64_t hi, int64_t *out)
{
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (v->via.u64 > (uint64_t)hi)
            return FAIL(d, key, idx, "%" PRIu64 " is out of range [%" PRId64 ", %" PRId64 "]",
                        v->via.u64, lo, hi);
        *out = (int64_t)v->via.u64;
        return 0;
    }
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (v->via.i64 < lo || v->via.i64 > hi)
            return FAIL(d, key, idx, "%" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                        v->via.i64, lo, hi);
        *out = v->via.i64;
        return 0;
    }
    return FAIL(d, key, idx, "expected an integer");
}

int lora_msg_as_f64(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    double *out)
{
    switch (v->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *out = v->via.f64;
        return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *out = (double)v->via.u64;
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = (double)v->via.i64;
        return 0;
    default:
        return FAIL(d, key, idx, "expected a number");
    }
}

/* A float field: float32, float64 or an integer on the wire; finite values must fit a float. */
int lora_msg_as_f32(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    float *out)
{
    double x;

    if (lora_msg_as_f64(d, key, idx, v, &x) < 0)
        return -1;
    if (x > FLT_MAX || x < -FLT_MAX) {
        if (x <= DBL_MAX && x >= -DBL_MAX)
            return FAIL(d, key, idx, "%g is out of range for a float", x);
    }
    *out = (float)x;
    return 0;
}

/* A string: at most LORA_MSG_MAX_STR bytes, no NUL; copied NUL-terminated into the arena. */
int lora_msg_as_str(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    struct lora_str *out)
{
    if (v->type != MSGPACK_OBJECT_STR)
        return FAIL(d, key, idx, "expected a string");
    uint32_t n = v->via.str.size;
    if (n > LORA_MSG_MAX_STR)
        return FAIL(d, key, idx, "string of %" PRIu32 " bytes, the limit is %d", n,
                    LORA_MSG_MAX_STR);
    if (n && memchr(v->via.str.ptr, '\0', n))
        return FAIL(d, key, idx, "string contains a NUL byte");
    char *s = lora_msg_arena_alloc(d->arena, (size_t)n + 1, 1);
    if (!s)
        return lora_msg_dec_no_memory(d, key);
    if (n)
        memcpy(s, v->via.str.ptr, n);
    s[n] = '\0';
    out->s = s;
    out->len = n;
    return 0;
}

int lora_msg_as_array(struct lora_msg_dec *d, const char *key, const msgpack_object *v,
                      uint64_t max, const msgpack_object_array **out)
{
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return FAIL(d, key, -1, "expected an array");
    if (v->via.array.size > max)
        return FAIL(d, key, -1, "%" PRIu32 " elements, the limit is %" PRIu64, v->via.array.size,
                    max);
    *out = &v->via.array;
    return 0;
}

int lora_msg_as_map(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    const msgpack_object_map **out)
{
    if (v->type != MSGPACK_OBJECT_MAP)
        return FAIL(d, key, idx, "expected a map");
    *out = &v->via.map;
    return 0;
}

/* Keyed getters: get_* for required keys, opt_* leave the default when the key is absent. */

int lora_msg_get_i64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     int64_t lo, int64_t hi, int64_t *out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_i64(d, key, -1, v, lo, hi, out);
}

int lora_msg_get_int(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key, int lo,
                     int hi, int *out)
{
    int64_t x;
    if (lora_msg_get_i64(d, m, key, lo, hi, &x) < 0)
        return -1;
    *out = (int)x;
    return 0;
}

int lora_msg_opt_int(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key, int lo,
                     int hi, int *out, bool *present)
{
    const msgpack_object *v;
    int64_t x;

    *present = false;
    if (lora_msg_find(d, m, key, &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (lora_msg_as_i64(d, key, -1, v, lo, hi, &x) < 0)
        return -1;
    *out = (int)x;
    *present = true;
    return 0;
}

int lora_msg_as_u64(struct lora_msg_dec *d, const char *key, const msgpack_object *v, uint64_t *out)
{
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = v->via.u64;
        return 0;
    }
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return FAIL(d, key, -1, "%" PRId64 " is negative", v->via.i64);
    return FAIL(d, key, -1, "expected an integer");
}

int lora_msg_get_u64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     uint64_t *out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_u64(d, key, v, out);
}

int lora_msg_opt_u64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     uint64_t *out)
{
    const msgpack_object *v;

    if (lora_msg_find(d, m, key, &v) < 0)
        return -1;
    return v ? lora_msg_as_u64(d, key, v, out) : 0;
}

static int as_bool(struct lora_msg_dec *d, const char *key, const msgpack_object *v, bool *out)
{
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return FAIL(d, key, -1, "expected a boolean");
    *out = v->via.boolean;
    return 0;
}

int lora_msg_get_bool(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                      bool *out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : as_bool(d, key, v, out);
}

int lora_msg_opt_bool(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                      bool *out)
{
    const msgpack_object *v;

    if (lora_msg_find(d, m, key, &v) < 0)
        return -1;
    return v ? as_bool(d, key, v, out) : 0;
}

int lora_msg_get_f64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     double *out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_f64(d, key, -1, v, out);
}

/* An optional float: *out is left as it is when the key is absent. */
int lora_msg_opt_f64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     double *out)
{
    const msgpack_object *v;

    if (lora_msg_find(d, m, key, &v) < 0)
        return -1;
    return v ? lora_msg_as_f64(d, key, -1, v, out) : 0;
}

int lora_msg_get_f32(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     float *out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_f32(d, key, -1, v, out);
}

int lora_msg_get_str(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     struct lora_str *out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_str(d, key, -1, v, out);
}

/* An optional string: absent leaves out->s = NULL. */
int lora_msg_opt_str(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     struct lora_str *out)
{
    const msgpack_object *v;

    out->s = NULL;
    out->len = 0;
    if (lora_msg_find(d, m, key, &v) < 0)
        return -1;
    return v ? lora_msg_as_str(d, key, -1, v, out) : 0;
}

int lora_msg_get_enum(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                      const char *const *names, int n_names, int *out)
{
    const msgpack_object *v;

    if (lora_msg_need(d, m, key, &v) < 0)
        return -1;
    if (v->type != MSGPACK_OBJECT_STR)
        return FAIL(d, key, -1, "expected a string");
    int i = name_lookup(names, n_names, v->via.str.ptr, v->via.str.size);
    if (i < 0) {
        int shown = v->via.str.size > 64 ? 64 : (int)v->via.str.size;
        return FAIL(d, key, -1, "unknown value '%.*s'", shown, v->via.str.ptr);
    }
    *out = i;
    return 0;
}

int lora_msg_get_array(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                       uint64_t max, const msgpack_object_array **out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_array(d, key, v, max, out);
}

int lora_msg_get_map(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     const msgpack_object_map **out)
{
    const msgpack_object *v;
    return lora_msg_need(d, m, key, &v) < 0 ? -1 : lora_msg_as_map(d, key, -1, v, out);
}

/* Typed arrays into the arena: *out = NULL for an empty array. */

/* An optional list of int32 of at most max entries: *out and *n are set only when it is there. */
int lora_msg_opt_i32_list(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                          uint32_t max, const int32_t **out, int *n)
{
    const msgpack_object *v;
    const msgpack_object_array *a;

    if (lora_msg_find(d, m, key, &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (lora_msg_as_array(d, key, v, max, &a) < 0 || lora_msg_i32_list(d, key, a, out) < 0)
        return -1;
    *n = (int)a->size;
    return 0;
}

int lora_msg_i32_list(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                      const int32_t **out)
{
    int32_t *v = NULL;

    if (a->size) {
        v = lora_msg_arena_alloc(d->arena, a->size, sizeof(*v));
        if (!v)
            return lora_msg_dec_no_memory(d, key);
    }
    for (uint32_t i = 0; i < a->size; i++) {
        int64_t x;
        if (lora_msg_as_i64(d, key, (long)i, &a->ptr[i], INT32_MIN, INT32_MAX, &x) < 0)
            return -1;
        v[i] = (int32_t)x;
    }
    *out = v;
    return 0;
}

int lora_msg_f32_list(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                      const float **out)
{
    float *v = NULL;

    if (a->size) {
        v = lora_msg_arena_alloc(d->arena, a->size, sizeof(*v));
        if (!v)
            return lora_msg_dec_no_memory(d, key);
    }
    for (uint32_t i = 0; i < a->size; i++) {
        if (lora_msg_as_f32(d, key, (long)i, &a->ptr[i], &v[i]) < 0)
            return -1;
    }
    *out = v;
    return 0;
}

int lora_msg_str_list(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                      struct lora_str **out)
{
    struct lora_str *v = NULL;

    if (a->size) {
        v = lora_msg_arena_alloc(d->arena, a->size, sizeof(*v));
        if (!v)
            return lora_msg_dec_no_memory(d, key);
    }
    for (uint32_t i = 0; i < a->size; i++) {
        if (lora_msg_as_str(d, key, (long)i, &a->ptr[i], &v[i]) < 0)
            return -1;
    }
    *out = v;
    return 0;
}

/* Copies binary frame i, which must hold exactly n little-endian int32 values, into the arena.
 * A frame that is not there counts as empty. */
int lora_msg_frame_i32(struct lora_msg_dec *d, int i, const char *count_key, uint64_t n,
                       const int32_t **out)
{
    size_t have = 0;
    const void *data = NULL;

    if (d->bins && i < d->n_bins) {
        have = d->bins[i].len;
        data = d->bins[i].data;
    }
    if (have && !data)
        return FAIL(d, count_key, -1, "frame %d has no data", i);
    if (have % 4 || have / 4 != n) {
        if (!d->bins || i >= d->n_bins)
            return FAIL(d, count_key, -1, "%" PRIu64 " values, but frame %d is missing", n, i);
        return FAIL(d, count_key, -1, "%" PRIu64 " values, but frame %d holds %zu bytes", n, i,
                    have);
    }
    *out = NULL;
    if (n) {
        int32_t *v = lora_msg_arena_alloc(d->arena, (size_t)n, sizeof(*v));
        if (!v)
            return lora_msg_dec_no_memory(d, count_key);
        memcpy(v, data, (size_t)n * sizeof(*v));
        *out = v;
    }
    return 0;
}

/* The common frame of every decoder: unpack, check "type", run the fields, clear the zone. */
int lora_msg_decode(enum lora_msg_type t, const void *body, size_t len,
                    const struct lora_msg_bin *bins, int n_bins, struct lora_msg_arena *arena,
                    void *out, size_t out_size, lora_msg_fields_fn fields, char *err,
                    size_t err_len)
{
    struct lora_msg_dec d = {
        .type = type_names[t],
        .arena = arena,
        .body = body,
        .len = len,
        .bins = bins,
        .n_bins = n_bins,
        .err = err,
        .err_len = err_len,
    };
    msgpack_object root;
    const msgpack_object *v;
    int rc = -1;

    if (!err)
        d.err_len = err_len = 0;
    memset(out, 0, out_size);
    if (!arena) {
        snprintf(err, err_len, "%s: no arena", d.type);
        return -1;
    }
    if (unpack_body(body, len, arena->zone, &root, d.type, err, err_len) < 0)
        goto out;
    if (root.type != MSGPACK_OBJECT_MAP) {
        snprintf(err, err_len, "%s: body: not a map", d.type);
        goto out;
    }
    if (lora_msg_need(&d, &root.via.map, "type", &v) < 0)
        goto out;
    if (v->type != MSGPACK_OBJECT_STR) {
        lora_msg_dec_fail(&d, "type", -1, "expected a string");
        goto out;
    }
    if (v->via.str.size != strlen(d.type) || memcmp(v->via.str.ptr, d.type, v->via.str.size)) {
        int shown = v->via.str.size > 64 ? 64 : (int)v->via.str.size;
        lora_msg_dec_fail(&d, "type", -1, "got '%.*s'", shown, v->via.str.ptr);
        goto out;
    }
    rc = fields(&d, &root.via.map, out);
out:
    msgpack_zone_clear(arena->zone);
    if (rc < 0)
        memset(out, 0, out_size);
    return rc;
}

/* Decodes array a, the value of key, whose elements are maps, into a new arena array of
 * a->size elements of size bytes, each filled by fields; errors name key[i]. */
int lora_msg_map_array(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                       size_t size, lora_msg_elem_fields_fn fields, void **items)
{
    char *v = NULL;

    if (a->size && !(v = lora_msg_arena_alloc(d->arena, a->size, size)))
        return lora_msg_dec_no_memory(d, key);
    for (uint32_t i = 0; i < a->size; i++) {
        const msgpack_object_map *em;
        if (lora_msg_as_map(d, key, i, &a->ptr[i], &em) < 0)
            return -1;
        size_t mark = lora_msg_dec_path_push(d, key, i);
        int rc = fields(d, em, v + (size_t)i * size);
        lora_msg_dec_path_pop(d, mark);
        if (rc < 0)
            return -1;
    }
    *items = v;
    return 0;
}

/* The optional "prompt_ranks" beside "prompt_logprobs": as many values, or absent (NULL). */
int lora_msg_prompt_ranks(struct lora_msg_dec *d, const msgpack_object_map *m, uint32_t n,
                          const int32_t **out)
{
    const msgpack_object *v;
    const msgpack_object_array *a;

    *out = NULL; /* arena memory is not zeroed */
    if (lora_msg_find(d, m, "prompt_ranks", &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (lora_msg_as_array(d, "prompt_ranks", v, LORA_MSG_MAX_BODY, &a) < 0)
        return -1;
    if (a->size != n)
        return FAIL(d, "prompt_ranks", -1, "%" PRIu32 " values, but prompt_logprobs has %" PRIu32,
                    a->size, n);
    return lora_msg_i32_list(d, "prompt_ranks", a, out);
}

/* The optional "prompt_top_n" with "prompt_top_ids" and "prompt_top_logprobs", n positions of
 * top_n values each; all absent (0, NULL) or all present. */
int lora_msg_prompt_top(struct lora_msg_dec *d, const msgpack_object_map *m, uint32_t n, int *top_n,
                        const int32_t **ids, const float **lps)
{
    static const char *const keys[2] = {"prompt_top_ids", "prompt_top_logprobs"};
    bool present;

    *top_n = 0; /* arena memory is not zeroed */
    *ids = NULL;
    *lps = NULL;
    if (lora_msg_opt_int(d, m, "prompt_top_n", 0, LORA_MSG_MAX_PROMPT_TOP, top_n, &present) < 0)
        return -1;
    uint64_t want = (uint64_t)n * (uint64_t)*top_n;
    for (int k = 0; k < 2; k++) {
        const msgpack_object *v;
        const msgpack_object_array *a;
        if (lora_msg_find(d, m, keys[k], &v) < 0)
            return -1;
        if (!v) {
            if (*top_n)
                return FAIL(d, keys[k], -1, "missing (prompt_top_n is %d)", *top_n);
            continue;
        }
        if (!present)
            return FAIL(d, "prompt_top_n", -1, "missing (%s is given)", keys[k]);
        if (lora_msg_as_array(d, keys[k], v, LORA_MSG_MAX_BODY, &a) < 0)
            return -1;
        if (a->size != want)
            return FAIL(d, keys[k], -1,
                        "%" PRIu32 " values, prompt positions * prompt_top_n is %" PRIu64, a->size,
                        want);
        if (k == 0 ? lora_msg_i32_list(d, keys[k], a, ids) : lora_msg_f32_list(d, keys[k], a, lps))
            return -1;
    }
    return 0;
}

/* ---- encoding helpers ----------------------------------------------------------------------- */

void lora_msg_enc_begin(struct lora_msg_enc *e, struct lora_buf *b, enum lora_msg_type t,
                        size_t n_keys)
{
    e->b = b;
    e->start = b->len;
    e->error = 0;
    msgpack_packer_init(&e->pk, b, lora_buf_write);
    if (msgpack_pack_map(&e->pk, n_keys + 1) || msgpack_pack_str_with_body(&e->pk, "type", 4) ||
        msgpack_pack_str_with_body(&e->pk, type_names[t], strlen(type_names[t])))
        e->error = ENOMEM;
}

int lora_msg_enc_end(struct lora_msg_enc *e)
{
    if (!e->error)
        return 0;
    e->b->len = e->start;
    errno = e->error;
    return -1;
}

void lora_msg_enc_put(struct lora_msg_enc *e, int rc)
{
    if (rc && !e->error)
        e->error = ENOMEM;
}

void lora_msg_enc_invalid(struct lora_msg_enc *e)
{
    if (!e->error)
        e->error = EINVAL;
}

void lora_msg_enc_key(struct lora_msg_enc *e, const char *k)
{
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_str_with_body(&e->pk, k, strlen(k)));
}

void lora_msg_enc_map(struct lora_msg_enc *e, size_t n)
{
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_map(&e->pk, n));
}

void lora_msg_kv_int(struct lora_msg_enc *e, const char *k, int64_t v)
{
    lora_msg_enc_key(e, k);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_int64(&e->pk, v));
}

void lora_msg_kv_u64(struct lora_msg_enc *e, const char *k, uint64_t v)
{
    lora_msg_enc_key(e, k);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_uint64(&e->pk, v));
}

void lora_msg_kv_bool(struct lora_msg_enc *e, const char *k, bool v)
{
    lora_msg_enc_key(e, k);
    if (!e->error)
        lora_msg_enc_put(e, v ? msgpack_pack_true(&e->pk) : msgpack_pack_false(&e->pk));
}

void lora_msg_kv_f32(struct lora_msg_enc *e, const char *k, float v)
{
    lora_msg_enc_key(e, k);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_float(&e->pk, v));
}

void lora_msg_kv_f64(struct lora_msg_enc *e, const char *k, double v)
{
    lora_msg_enc_key(e, k);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_double(&e->pk, v));
}

static bool str_ok(struct lora_str s)
{
    return s.s && s.len <= LORA_MSG_MAX_STR && !memchr(s.s, '\0', s.len);
}

void lora_msg_enc_str(struct lora_msg_enc *e, struct lora_str s)
{
    if (!str_ok(s))
        lora_msg_enc_invalid(e);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_str_with_body(&e->pk, s.s, s.len));
}

void lora_msg_kv_str(struct lora_msg_enc *e, const char *k, struct lora_str s)
{
    lora_msg_enc_key(e, k);
    lora_msg_enc_str(e, s);
}

/* An optional string: the caller counted it in the map size when s.s != NULL. */
void lora_msg_kv_ostr(struct lora_msg_enc *e, const char *k, struct lora_str s)
{
    if (s.s)
        lora_msg_kv_str(e, k, s);
}

void lora_msg_kv_enum(struct lora_msg_enc *e, const char *k, const char *const *names, int n_names,
                      int v)
{
    lora_msg_enc_key(e, k);
    if (v < 0 || v >= n_names)
        lora_msg_enc_invalid(e);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_str_with_body(&e->pk, names[v], strlen(names[v])));
}

/* Starts array k of n elements; flags a negative count, a missing pointer or n > max. */
void lora_msg_kv_array(struct lora_msg_enc *e, const char *k, long n, const void *ptr, long max)
{
    lora_msg_enc_key(e, k);
    if (n < 0 || n > max || (n > 0 && !ptr))
        lora_msg_enc_invalid(e);
    if (!e->error)
        lora_msg_enc_put(e, msgpack_pack_array(&e->pk, (size_t)n));
}

void lora_msg_kv_i32s(struct lora_msg_enc *e, const char *k, const int32_t *v, long n)
{
    lora_msg_kv_array(e, k, n, v, LONG_MAX);
    for (long i = 0; i < n && !e->error; i++)
        lora_msg_enc_put(e, msgpack_pack_int32(&e->pk, v[i]));
}

void lora_msg_kv_f32s(struct lora_msg_enc *e, const char *k, const float *v, long n)
{
    lora_msg_kv_array(e, k, n, v, LONG_MAX);
    for (long i = 0; i < n && !e->error; i++)
        lora_msg_enc_put(e, msgpack_pack_float(&e->pk, v[i]));
}

void lora_msg_kv_strs(struct lora_msg_enc *e, const char *k, const struct lora_str *v, int n)
{
    lora_msg_kv_array(e, k, n, v, LORA_MSG_MAX_ADAPTERS);
    for (int i = 0; i < n && !e->error; i++)
        lora_msg_enc_str(e, v[i]);
}

/* A binary frame of n int32 values, returned through bins[i]. */
void lora_msg_bin_frame(struct lora_msg_enc *e, struct lora_msg_bin *bins, int i, const int32_t *v,
                        size_t n)
{
    if (n > SIZE_MAX / sizeof(*v) || (n && !v))
        lora_msg_enc_invalid(e);
    if (bins) {
        bins[i].data = v;
        bins[i].len = n * sizeof(*v);
    }
}

int lora_msg_encode_empty(struct lora_buf *b, enum lora_msg_type t)
{
    struct lora_msg_enc e;

    if (t != LORA_MSG_HEARTBEAT && t != LORA_MSG_TAKE_NOTIFICATIONS && t != LORA_MSG_RESIDENCY &&
        t != LORA_MSG_SHUTDOWN) {
        errno = EINVAL;
        return -1;
    }
    lora_msg_enc_begin(&e, b, t, 0);
    return lora_msg_enc_end(&e);
}

/* ---- hello, ready, setup, setup_done -------------------------------------------------------- */

int lora_msg_encode_hello(struct lora_buf *b, const struct lora_msg_hello *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct lora_msg_enc e;
    bool has_rank = m->rank >= 0, has_ws = m->world_size > 0;

    if (n_bins)
        *n_bins = 0;
    lora_msg_enc_begin(&e, b, LORA_MSG_HELLO, 3 + has_rank + has_ws + HAS(m->name));
    lora_msg_kv_int(&e, "version", m->version);
    lora_msg_kv_enum(&e, "role", role_names, N_NAMES(role_names), (int)m->role);
    if (has_rank)
        lora_msg_kv_int(&e, "rank", m->rank);
    if (has_ws)
        lora_msg_kv_int(&e, "world_size", m->world_size);
    lora_msg_kv_int(&e, "pid", m->pid);
    lora_msg_kv_ostr(&e, "name", m->name);
    return lora_msg_enc_end(&e);
}

static int hello_fields(struct lora_msg_dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_hello *o = p;
    int role;
    bool present;

    o->rank = -1;
    o->world_size = 0;
    if (lora_msg_get_int(d, m, "version", 0, INT_MAX, &o->version) < 0 ||
        lora_msg_get_enum(d, m, "role", role_names, N_NAMES(role_names), &role) < 0 ||
        lora_msg_opt_int(d, m, "rank", 0, INT_MAX, &o->rank, &present) < 0 ||
        lora_msg_opt_int(d, m, "world_size", 0, INT_MAX, &o->world_size, &present) < 0 ||
        lora_msg_get_i64(d, m, "pid", 0, INT64_MAX, &o->pid) < 0 ||
        lora_msg_opt_str(d, m, "name", &o->name) < 0)
        return -1;
    o->role = (enum lora_role)role;
    return 0;
}
DEFINE_DECODER(hello, LORA_MSG_HELLO)

#define N_LIMITS 10

void lora_msg_kv_limits(struct lora_msg_enc *e, const struct lora_msg_limits *l)
{
    lora_msg_enc_key(e, "limits");
    lora_msg_enc_map(e, N_LIMITS);
    lora_msg_kv_int(e, "max_loras", l->max_loras);
    lora_msg_kv_int(e, "max_cpu_loras", l->max_cpu_loras);
    lora_msg_kv_int(e, "max_lora_rank", l->max_lora_rank);
    lora_msg_kv_int(e, "block_size", l->block_size);
    lora_msg_kv_int(e, "num_kv_blocks", l->num_kv_blocks);
    lora_msg_kv_int(e, "world_size", l->world_size);
    lora_msg_kv_int(e, "max_model_len", l->max_model_len);
    lora_msg_kv_int(e, "max_num_batched_tokens", l->max_num_batched_tokens);
    lora_msg_kv_int(e, "max_num_seqs", l->max_num_seqs);
    lora_msg_kv_int(e, "vocab_size", l->vocab_size);
}

int lora_msg_limits_fields(struct lora_msg_dec *d, const msgpack_object_map *top,
                           struct lora_msg_limits *l)
{
    const msgpack_object_map *m;

    if (lora_msg_get_map(d, top, "limits", &m) < 0)
        return -1;
    size_t mark = lora_msg_dec_path_push(d, "limits", -1);
    int rc = -1;
    if (lora_msg_get_int(d, m, "max_loras", 0, INT_MAX, &l->max_loras) < 0 ||
        lora_msg_get_int(d, m, "max_cpu_loras", 0, INT_MAX, &l->max_cpu_loras) < 0 ||
        lora_msg_get_int(d, m, "max_lora_rank", 0, INT_MAX, &l->max_lora_rank) < 0 ||
        lora_msg_get_int(d, m, "block_size", 0, INT_MAX, &l->block_size) < 0 ||
        lora_msg_get_int(d, m, "num_kv_blocks", 0, INT_MAX, &l->num_kv_blocks) < 0 ||
        lora_msg_get_int(d, m, "world_size", 0, INT_MAX, &l->world_size) < 0 ||
        lora_msg_get_int(d, m, "max_model_len", 0, INT_MAX, &l->max_model_len) < 0 ||
        lora_msg_get_int(d, m, "max_num_batched_tokens", 0, INT_MAX, &l->max_num_batched_tokens) <
            0 ||
        lora_msg_get_int(d, m, "max_num_seqs", 0, INT_MAX, &l->max_num_seqs) < 0 ||
        lora_msg_get_int(d, m, "vocab_size", 0, INT_MAX, &l->vocab_size) < 0)
        goto out;
    rc = 0;
out:
    lora_msg_dec_path_pop(d, mark);
    return rc;
}
