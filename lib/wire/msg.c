/* msg: the msgpack codec of the message catalogue (see msg.h, DESIGN.md section 4).
 *
 * Encoding packs straight into the caller's buffer through a msgpack_packer write callback; on
 * any failure the buffer is put back to its length before the call, so a message is appended
 * whole or not at all.
 *
 * Decoding goes in three passes over untrusted bytes:
 *   1. scan: our own walk over the raw msgpack, which checks that the body is exactly one
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
#include "wire/msg.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "msg.c hands out int32 arrays as little-endian binary frames: little-endian hosts only"
#endif

#define MAX_DEPTH        24                    /* msgpack nesting; msgpack-c itself stops at 32 */
#define ARENA_CHUNK      (64 << 10)            /* bytes of an ordinary arena chunk */
#define ZONE_CHUNK       8192                  /* msgpack_zone chunk size */
#define MAX_PATH         160                   /* bytes of a nested key path in an error */
#define MAX_LIST         LORA_MSG_MAX_ADAPTERS /* notifications, timings, stop token ids */

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

/* Enum values travel as these strings; tables only grow at the end, like the enums. */
static const char *const role_names[] = {"worker", "frontend", "inspect"};
static const char *const op_names[] = {"add", "activate", "remove", "pin", "unpin"};
static const char *const transition_names[] = {"load", "activate", "evict", "remove"};
static const char *const event_names[] = {"QUEUED", "SCHEDULED", "PREEMPTED", "FINISHED"};
static const char *const control_names[] = {"residency", "config", "health", "load",
                                            "unload",    "pin",    "unpin",  "stats"};

#define N_NAMES(t) ((int)(sizeof(t) / sizeof((t)[0])))

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

/* ---- buffer --------------------------------------------------------------------------------- */

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

/* n elements of size bytes, aligned for any type; NULL when out of memory or n * size == 0. */
static void *arena_alloc(struct lora_msg_arena *a, size_t n, size_t size)
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

/* ---- pass 1: structural scan of raw msgpack ---------------------------------------------------
 */

/* The header of one msgpack value: hdr bytes of header, then payload bytes of data (str, bin,
 * ext) or children values (array: n, map: 2n). */
struct mp_head {
    size_t hdr;
    uint64_t payload;
    uint64_t children;
};

static uint64_t be_read(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Reads the header at p. Returns 0, or -1 for a reserved byte or a header cut short. */
static int mp_head(const unsigned char *p, const unsigned char *end, struct mp_head *h)
{
    /* 0xc0..0xdf: header bytes of the fixed-size forms (nil, booleans, numbers; fixext counts
     * its type byte and data in), and bytes of the length field of the sized forms (bin, ext,
     * str, array, map); 0xc1 is neither. */
    static const unsigned char fixed[0x20] = {
        [0x00] = 1, [0x02] = 1, [0x03] = 1, [0x0a] = 5, [0x0b] = 9,  [0x0c] = 2,
        [0x0d] = 3, [0x0e] = 5, [0x0f] = 9, [0x10] = 2, [0x11] = 3,  [0x12] = 5,
        [0x13] = 9, [0x14] = 3, [0x15] = 4, [0x16] = 6, [0x17] = 10, [0x18] = 18,
    };
    static const unsigned char sized[0x20] = {
        [0x04] = 1, [0x05] = 2, [0x06] = 4, [0x07] = 1, [0x08] = 2, [0x09] = 4, [0x19] = 1,
        [0x1a] = 2, [0x1b] = 4, [0x1c] = 2, [0x1d] = 4, [0x1e] = 2, [0x1f] = 4,
    };
    size_t avail = (size_t)(end - p);
    unsigned b;

    if (avail < 1)
        return -1;
    b = p[0];
    h->hdr = 1;
    h->payload = 0;
    h->children = 0;
    if (b <= 0x7f || b >= 0xe0) /* fixint */
        return 0;
    if (b <= 0x8f) {
        h->children = 2u * (b & 0x0f);
        return 0;
    }
    if (b <= 0x9f) {
        h->children = b & 0x0f;
        return 0;
    }
    if (b <= 0xbf) {
        h->payload = b & 0x1f;
        return 0;
    }
    if (fixed[b - 0xc0]) {
        h->hdr = fixed[b - 0xc0];
        return avail < h->hdr ? -1 : 0;
    }
    int nlen = sized[b - 0xc0];
    if (!nlen)
        return -1;                     /* 0xc1 */
    bool ext = b >= 0xc7 && b <= 0xc9; /* a type byte after the length */
    h->hdr = 1 + (size_t)nlen + ext;
    if (avail < h->hdr)
        return -1;
    uint64_t n = be_read(p + 1, nlen);
    if (b == 0xdc || b == 0xdd)
        h->children = n;
    else if (b == 0xde || b == 0xdf)
        h->children = 2 * n;
    else
        h->payload = n;
    return 0;
}

/* Walks one value at *pp, advancing past it. Returns 0, or -1 with a reason in *why and *pp at
 * the value that is wrong. */
static int scan_value(const unsigned char **pp, const unsigned char *end, int depth,
                      const char **why)
{
    const unsigned char *p = *pp;
    struct mp_head h;

    if (mp_head(p, end, &h) < 0) {
        *why = p < end && *p == 0xc1 ? "reserved byte 0xc1" : "truncated";
        return -1;
    }
    p += h.hdr;
    if (h.payload > (uint64_t)(end - p)) {
        *why = "truncated";
        return -1;
    }
    p += h.payload;
    if (h.children) {
        /* every value takes at least one byte: a count above the bytes left is a lie */
        if (h.children > (uint64_t)(end - p)) {
            *why = "truncated";
            return -1;
        }
        if (depth >= MAX_DEPTH) {
            *why = "nested too deeply";
            return -1;
        }
        for (uint64_t i = 0; i < h.children; i++) {
            if (scan_value(&p, end, depth + 1, why) < 0) {
                *pp = p;
                return -1;
            }
        }
    }
    *pp = p;
    return 0;
}

#define WHOLE_BODY SIZE_MAX /* a scan error about the body as a whole, not a byte of it */

/* Checks that body[0..len) is exactly one well-formed value. *where: the failing offset. */
static int scan_body(const void *body, size_t len, const char **why, size_t *where)
{
    const unsigned char *p = body, *start = body, *end = p + len;

    *where = WHOLE_BODY;
    if (len > LORA_MSG_MAX_BODY) {
        *why = "larger than LORA_MSG_MAX_BODY";
        return -1;
    }
    if (len == 0 || !body) {
        *why = "empty";
        return -1;
    }
    if (scan_value(&p, end, 0, why) < 0) {
        *where = (size_t)(p - start);
        return -1;
    }
    if (p != end) {
        *why = "trailing bytes after the map";
        *where = (size_t)(p - start);
        return -1;
    }
    return 0;
}

enum lora_msg_scan_result lora_msg_scan(struct lora_msg_scan *st, const void *data, size_t avail,
                                        size_t *len)
{
    const unsigned char *p = data;
    struct mp_head h;

    if (!st->started) {
        st->started = true;
        st->pos = 0;
        st->pending = 1;
    }
    while (st->pending > 0) {
        if (st->pos >= avail)
            return LORA_MSG_SCAN_MORE;
        if (mp_head(p + st->pos, p + avail, &h) < 0) {
            if (p[st->pos] != 0xc1)
                return LORA_MSG_SCAN_MORE; /* the header is cut short */
            *len = st->pos;
            return LORA_MSG_SCAN_MALFORMED;
        }
        /* Every value takes at least one byte: owing more than the bytes left is too large. */
        uint64_t room = LORA_MSG_MAX_BODY - (uint64_t)st->pos;
        if (h.hdr > room || h.payload > room - h.hdr ||
            h.children + (st->pending - 1) > room - h.hdr - h.payload) {
            *len = st->pos;
            return LORA_MSG_SCAN_TOO_LARGE;
        }
        if (h.hdr + h.payload > avail - st->pos)
            return LORA_MSG_SCAN_MORE;
        st->pos += h.hdr + (size_t)h.payload;
        st->pending += h.children - 1;
    }
    *len = st->pos;
    return LORA_MSG_SCAN_DONE;
}

/* "WHAT: body: WHY (byte N of LEN)" into err. */
static void body_error(char *err, size_t err_len, const char *what, const char *why, size_t where,
                       size_t len)
{
    if (where == WHOLE_BODY)
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

    if (scan_body(body, len, &why, &where) < 0) {
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

static bool is_map_byte(unsigned char b)
{
    return (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
}

static bool is_str_byte(unsigned char b)
{
    return (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb);
}

/* Finds key in the top-level map of a body that passed scan_body, without unpacking: *n_found
 * is how often it occurs, *val and *val_len the raw bytes of its first value. */
static void top_value(const void *body, size_t len, const char *key, const unsigned char **val,
                      size_t *val_len, int *n_found)
{
    const unsigned char *p = body, *end = p + len;
    struct mp_head h;
    const char *why;
    size_t klen = strlen(key);

    *val = NULL;
    *val_len = 0;
    *n_found = 0;
    if (mp_head(p, end, &h) < 0 || !is_map_byte(*p))
        return;
    p += h.hdr;
    for (uint64_t i = 0; i < h.children / 2; i++) {
        const unsigned char *k = p, *v;
        struct mp_head kh;
        if (mp_head(k, end, &kh) < 0 || scan_value(&p, end, 0, &why) < 0)
            return;
        v = p;
        if (scan_value(&p, end, 0, &why) < 0)
            return;
        if (is_str_byte(*k) && kh.payload == klen && memcmp(k + kh.hdr, key, klen) == 0) {
            if (++*n_found == 1) {
                *val = v;
                *val_len = (size_t)(p - v);
            }
        }
    }
}

/* Reads "type" straight from the bytes: no allocation, so a router can afford it per message. */
int lora_msg_peek_type(const void *body, size_t len, char *err, size_t err_len)
{
    const unsigned char *v;
    const char *why;
    size_t where, vlen;
    struct mp_head h;
    int n, t;

    if (!err)
        err_len = 0;
    if (scan_body(body, len, &why, &where) < 0) {
        body_error(err, err_len, "message", why, where, len);
        return -1;
    }
    if (!is_map_byte(*(const unsigned char *)body)) {
        snprintf(err, err_len, "message: body: not a map");
        return -1;
    }
    top_value(body, len, "type", &v, &vlen, &n);
    if (n == 0) {
        snprintf(err, err_len, "message: type: missing");
        return -1;
    }
    if (n > 1) {
        snprintf(err, err_len, "message: type: duplicate key");
        return -1;
    }
    if (!is_str_byte(*v) || mp_head(v, v + vlen, &h) < 0) {
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

struct dec {
    const char *type; /* for errors */
    struct lora_msg_arena *arena;
    const unsigned char *body;
    size_t len;
    const struct lora_msg_bin *bins;
    int n_bins;
    char *err;
    size_t err_len;
    char path[MAX_PATH]; /* "seqs[2]" while inside an element, "" at the top */
    size_t path_len;
};

/* Formats "TYPE: PATH.KEY[IDX]: what" into the caller's buffer. idx < 0: none. */
__attribute__((format(printf, 4, 5))) static void failf(struct dec *d, const char *key, long idx,
                                                        const char *fmt, ...)
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

/* failf as an expression worth -1, so that the compiler sees every error path return -1. */
#define FAIL(...) (failf(__VA_ARGS__), -1)

/* Enters element idx of array key for error paths; returns the mark to leave with. */
static size_t path_push(struct dec *d, const char *key, long idx)
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

static void path_pop(struct dec *d, size_t mark)
{
    d->path_len = mark;
    d->path[mark] = '\0';
}

static int no_memory(struct dec *d, const char *key)
{
    return FAIL(d, key, -1, "out of memory");
}

/* *v = the value of key, NULL when absent; -1 for a key given twice. */
static int find(struct dec *d, const msgpack_object_map *m, const char *key,
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

static int need(struct dec *d, const msgpack_object_map *m, const char *key,
                const msgpack_object **v)
{
    if (find(d, m, key, v) < 0)
        return -1;
    if (!*v)
        return FAIL(d, key, -1, "missing");
    return 0;
}

static int as_i64(struct dec *d, const char *key, long idx, const msgpack_object *v, int64_t lo,
                  int64_t hi, int64_t *out)
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

static int as_f64(struct dec *d, const char *key, long idx, const msgpack_object *v, double *out)
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
static int as_f32(struct dec *d, const char *key, long idx, const msgpack_object *v, float *out)
{
    double x;

    if (as_f64(d, key, idx, v, &x) < 0)
        return -1;
    if (x > FLT_MAX || x < -FLT_MAX) {
        if (x <= DBL_MAX && x >= -DBL_MAX)
            return FAIL(d, key, idx, "%g is out of range for a float", x);
    }
    *out = (float)x;
    return 0;
}

/* A string: at most LORA_MSG_MAX_STR bytes, no NUL; copied NUL-terminated into the arena. */
static int as_str(struct dec *d, const char *key, long idx, const msgpack_object *v,
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
    char *s = arena_alloc(d->arena, (size_t)n + 1, 1);
    if (!s)
        return no_memory(d, key);
    if (n)
        memcpy(s, v->via.str.ptr, n);
    s[n] = '\0';
    out->s = s;
    out->len = n;
    return 0;
}

static int as_array(struct dec *d, const char *key, const msgpack_object *v, uint64_t max,
                    const msgpack_object_array **out)
{
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return FAIL(d, key, -1, "expected an array");
    if (v->via.array.size > max)
        return FAIL(d, key, -1, "%" PRIu32 " elements, the limit is %" PRIu64, v->via.array.size,
                    max);
    *out = &v->via.array;
    return 0;
}

static int as_map(struct dec *d, const char *key, long idx, const msgpack_object *v,
                  const msgpack_object_map **out)
{
    if (v->type != MSGPACK_OBJECT_MAP)
        return FAIL(d, key, idx, "expected a map");
    *out = &v->via.map;
    return 0;
}

/* Keyed getters: get_* for required keys, opt_* leave the default when the key is absent. */

static int get_i64(struct dec *d, const msgpack_object_map *m, const char *key, int64_t lo,
                   int64_t hi, int64_t *out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_i64(d, key, -1, v, lo, hi, out);
}

static int get_int(struct dec *d, const msgpack_object_map *m, const char *key, int lo, int hi,
                   int *out)
{
    int64_t x;
    if (get_i64(d, m, key, lo, hi, &x) < 0)
        return -1;
    *out = (int)x;
    return 0;
}

static int opt_int(struct dec *d, const msgpack_object_map *m, const char *key, int lo, int hi,
                   int *out, bool *present)
{
    const msgpack_object *v;
    int64_t x;

    *present = false;
    if (find(d, m, key, &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (as_i64(d, key, -1, v, lo, hi, &x) < 0)
        return -1;
    *out = (int)x;
    *present = true;
    return 0;
}

static int as_u64(struct dec *d, const char *key, const msgpack_object *v, uint64_t *out)
{
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = v->via.u64;
        return 0;
    }
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return FAIL(d, key, -1, "%" PRId64 " is negative", v->via.i64);
    return FAIL(d, key, -1, "expected an integer");
}

static int get_u64(struct dec *d, const msgpack_object_map *m, const char *key, uint64_t *out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_u64(d, key, v, out);
}

static int get_bool(struct dec *d, const msgpack_object_map *m, const char *key, bool *out)
{
    const msgpack_object *v;

    if (need(d, m, key, &v) < 0)
        return -1;
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return FAIL(d, key, -1, "expected a boolean");
    *out = v->via.boolean;
    return 0;
}

static int get_f64(struct dec *d, const msgpack_object_map *m, const char *key, double *out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_f64(d, key, -1, v, out);
}

/* An optional float: *out is left as it is when the key is absent. */
static int opt_f64(struct dec *d, const msgpack_object_map *m, const char *key, double *out)
{
    const msgpack_object *v;

    if (find(d, m, key, &v) < 0)
        return -1;
    return v ? as_f64(d, key, -1, v, out) : 0;
}

static int get_f32(struct dec *d, const msgpack_object_map *m, const char *key, float *out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_f32(d, key, -1, v, out);
}

static int get_str(struct dec *d, const msgpack_object_map *m, const char *key,
                   struct lora_str *out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_str(d, key, -1, v, out);
}

/* An optional string: absent leaves out->s = NULL. */
static int opt_str(struct dec *d, const msgpack_object_map *m, const char *key,
                   struct lora_str *out)
{
    const msgpack_object *v;

    out->s = NULL;
    out->len = 0;
    if (find(d, m, key, &v) < 0)
        return -1;
    return v ? as_str(d, key, -1, v, out) : 0;
}

static int get_enum(struct dec *d, const msgpack_object_map *m, const char *key,
                    const char *const *names, int n_names, int *out)
{
    const msgpack_object *v;

    if (need(d, m, key, &v) < 0)
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

static int get_array(struct dec *d, const msgpack_object_map *m, const char *key, uint64_t max,
                     const msgpack_object_array **out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_array(d, key, v, max, out);
}

static int get_map(struct dec *d, const msgpack_object_map *m, const char *key,
                   const msgpack_object_map **out)
{
    const msgpack_object *v;
    return need(d, m, key, &v) < 0 ? -1 : as_map(d, key, -1, v, out);
}

/* Typed arrays into the arena: *out = NULL for an empty array. */

static int i32_list(struct dec *d, const char *key, const msgpack_object_array *a,
                    const int32_t **out);

/* An optional list of int32 of at most max entries: *out and *n are set only when it is there. */
static int opt_i32_list(struct dec *d, const msgpack_object_map *m, const char *key,
                        uint32_t max, const int32_t **out, int *n)
{
    const msgpack_object *v;
    const msgpack_object_array *a;

    if (find(d, m, key, &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (as_array(d, key, v, max, &a) < 0 || i32_list(d, key, a, out) < 0)
        return -1;
    *n = (int)a->size;
    return 0;
}

static int i32_list(struct dec *d, const char *key, const msgpack_object_array *a,
                    const int32_t **out)
{
    int32_t *v = NULL;

    if (a->size) {
        v = arena_alloc(d->arena, a->size, sizeof(*v));
        if (!v)
            return no_memory(d, key);
    }
    for (uint32_t i = 0; i < a->size; i++) {
        int64_t x;
        if (as_i64(d, key, (long)i, &a->ptr[i], INT32_MIN, INT32_MAX, &x) < 0)
            return -1;
        v[i] = (int32_t)x;
    }
    *out = v;
    return 0;
}

static int f32_list(struct dec *d, const char *key, const msgpack_object_array *a,
                    const float **out)
{
    float *v = NULL;

    if (a->size) {
        v = arena_alloc(d->arena, a->size, sizeof(*v));
        if (!v)
            return no_memory(d, key);
    }
    for (uint32_t i = 0; i < a->size; i++) {
        if (as_f32(d, key, (long)i, &a->ptr[i], &v[i]) < 0)
            return -1;
    }
    *out = v;
    return 0;
}

static int str_list(struct dec *d, const char *key, const msgpack_object_array *a,
                    struct lora_str **out)
{
    struct lora_str *v = NULL;

    if (a->size) {
        v = arena_alloc(d->arena, a->size, sizeof(*v));
        if (!v)
            return no_memory(d, key);
    }
    for (uint32_t i = 0; i < a->size; i++) {
        if (as_str(d, key, (long)i, &a->ptr[i], &v[i]) < 0)
            return -1;
    }
    *out = v;
    return 0;
}

/* Copies binary frame i, which must hold exactly n little-endian int32 values, into the arena.
 * A frame that is not there counts as empty. */
static int frame_i32(struct dec *d, int i, const char *count_key, uint64_t n, const int32_t **out)
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
        int32_t *v = arena_alloc(d->arena, (size_t)n, sizeof(*v));
        if (!v)
            return no_memory(d, count_key);
        memcpy(v, data, (size_t)n * sizeof(*v));
        *out = v;
    }
    return 0;
}

typedef int (*fields_fn)(struct dec *d, const msgpack_object_map *m, void *out);

/* The common frame of every decoder: unpack, check "type", run the fields, clear the zone. */
static int decode_msg(enum lora_msg_type t, const void *body, size_t len,
                      const struct lora_msg_bin *bins, int n_bins, struct lora_msg_arena *arena,
                      void *out, size_t out_size, fields_fn fields, char *err, size_t err_len)
{
    struct dec d = {
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
    if (need(&d, &root.via.map, "type", &v) < 0)
        goto out;
    if (v->type != MSGPACK_OBJECT_STR) {
        failf(&d, "type", -1, "expected a string");
        goto out;
    }
    if (v->via.str.size != strlen(d.type) || memcmp(v->via.str.ptr, d.type, v->via.str.size)) {
        int shown = v->via.str.size > 64 ? 64 : (int)v->via.str.size;
        failf(&d, "type", -1, "got '%.*s'", shown, v->via.str.ptr);
        goto out;
    }
    rc = fields(&d, &root.via.map, out);
out:
    msgpack_zone_clear(arena->zone);
    if (rc < 0)
        memset(out, 0, out_size);
    return rc;
}

#define DEFINE_DECODER(name, TYPE)                                                                 \
    int lora_msg_decode_##name(const void *body, size_t len, const struct lora_msg_bin *bins,      \
                               int n_bins, struct lora_msg_arena *arena,                           \
                               struct lora_msg_##name *out, char *err, size_t err_len)             \
    {                                                                                              \
        return decode_msg(TYPE, body, len, bins, n_bins, arena, out, sizeof(*out), name##_fields,  \
                          err, err_len);                                                           \
    }

/* ---- encoding helpers ----------------------------------------------------------------------- */

struct enc {
    msgpack_packer pk;
    struct lora_buf *b;
    size_t start; /* b->len before the message, restored on failure */
    int error;    /* 0, ENOMEM or EINVAL */
};

static void enc_begin(struct enc *e, struct lora_buf *b, enum lora_msg_type t, size_t n_keys)
{
    e->b = b;
    e->start = b->len;
    e->error = 0;
    msgpack_packer_init(&e->pk, b, lora_buf_write);
    if (msgpack_pack_map(&e->pk, n_keys + 1) || msgpack_pack_str_with_body(&e->pk, "type", 4) ||
        msgpack_pack_str_with_body(&e->pk, type_names[t], strlen(type_names[t])))
        e->error = ENOMEM;
}

static int enc_end(struct enc *e)
{
    if (!e->error)
        return 0;
    e->b->len = e->start;
    errno = e->error;
    return -1;
}

static void put(struct enc *e, int rc)
{
    if (rc && !e->error)
        e->error = ENOMEM;
}

static void invalid(struct enc *e)
{
    if (!e->error)
        e->error = EINVAL;
}

static void key(struct enc *e, const char *k)
{
    if (!e->error)
        put(e, msgpack_pack_str_with_body(&e->pk, k, strlen(k)));
}

static void map_(struct enc *e, size_t n)
{
    if (!e->error)
        put(e, msgpack_pack_map(&e->pk, n));
}

static void kv_int(struct enc *e, const char *k, int64_t v)
{
    key(e, k);
    if (!e->error)
        put(e, msgpack_pack_int64(&e->pk, v));
}

static void kv_u64(struct enc *e, const char *k, uint64_t v)
{
    key(e, k);
    if (!e->error)
        put(e, msgpack_pack_uint64(&e->pk, v));
}

static void kv_bool(struct enc *e, const char *k, bool v)
{
    key(e, k);
    if (!e->error)
        put(e, v ? msgpack_pack_true(&e->pk) : msgpack_pack_false(&e->pk));
}

static void kv_f32(struct enc *e, const char *k, float v)
{
    key(e, k);
    if (!e->error)
        put(e, msgpack_pack_float(&e->pk, v));
}

static void kv_f64(struct enc *e, const char *k, double v)
{
    key(e, k);
    if (!e->error)
        put(e, msgpack_pack_double(&e->pk, v));
}

static bool str_ok(struct lora_str s)
{
    return s.s && s.len <= LORA_MSG_MAX_STR && !memchr(s.s, '\0', s.len);
}

static void str_(struct enc *e, struct lora_str s)
{
    if (!str_ok(s))
        invalid(e);
    if (!e->error)
        put(e, msgpack_pack_str_with_body(&e->pk, s.s, s.len));
}

static void kv_str(struct enc *e, const char *k, struct lora_str s)
{
    key(e, k);
    str_(e, s);
}

/* An optional string: the caller counted it in the map size when s.s != NULL. */
static void kv_ostr(struct enc *e, const char *k, struct lora_str s)
{
    if (s.s)
        kv_str(e, k, s);
}

static void kv_enum(struct enc *e, const char *k, const char *const *names, int n_names, int v)
{
    key(e, k);
    if (v < 0 || v >= n_names)
        invalid(e);
    if (!e->error)
        put(e, msgpack_pack_str_with_body(&e->pk, names[v], strlen(names[v])));
}

/* Starts array k of n elements; flags a negative count, a missing pointer or n > max. */
static void kv_array(struct enc *e, const char *k, long n, const void *ptr, long max)
{
    key(e, k);
    if (n < 0 || n > max || (n > 0 && !ptr))
        invalid(e);
    if (!e->error)
        put(e, msgpack_pack_array(&e->pk, (size_t)n));
}

static void kv_i32s(struct enc *e, const char *k, const int32_t *v, long n)
{
    kv_array(e, k, n, v, LONG_MAX);
    for (long i = 0; i < n && !e->error; i++)
        put(e, msgpack_pack_int32(&e->pk, v[i]));
}

static void kv_f32s(struct enc *e, const char *k, const float *v, long n)
{
    kv_array(e, k, n, v, LONG_MAX);
    for (long i = 0; i < n && !e->error; i++)
        put(e, msgpack_pack_float(&e->pk, v[i]));
}

static void kv_strs(struct enc *e, const char *k, const struct lora_str *v, int n)
{
    kv_array(e, k, n, v, LORA_MSG_MAX_ADAPTERS);
    for (int i = 0; i < n && !e->error; i++)
        str_(e, v[i]);
}

/* A binary frame of n int32 values, returned through bins[i]. */
static void bin_frame(struct enc *e, struct lora_msg_bin *bins, int i, const int32_t *v, size_t n)
{
    if (n > SIZE_MAX / sizeof(*v) || (n && !v))
        invalid(e);
    if (bins) {
        bins[i].data = v;
        bins[i].len = n * sizeof(*v);
    }
}

int lora_msg_encode_empty(struct lora_buf *b, enum lora_msg_type t)
{
    struct enc e;

    if (t != LORA_MSG_HEARTBEAT && t != LORA_MSG_TAKE_NOTIFICATIONS && t != LORA_MSG_RESIDENCY &&
        t != LORA_MSG_SHUTDOWN) {
        errno = EINVAL;
        return -1;
    }
    enc_begin(&e, b, t, 0);
    return enc_end(&e);
}

#define HAS(str) ((size_t)((str).s != NULL))

/* ---- hello, ready, setup, setup_done -------------------------------------------------------- */

int lora_msg_encode_hello(struct lora_buf *b, const struct lora_msg_hello *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    bool has_rank = m->rank >= 0, has_ws = m->world_size > 0;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_HELLO, 3 + has_rank + has_ws + HAS(m->name));
    kv_int(&e, "version", m->version);
    kv_enum(&e, "role", role_names, N_NAMES(role_names), (int)m->role);
    if (has_rank)
        kv_int(&e, "rank", m->rank);
    if (has_ws)
        kv_int(&e, "world_size", m->world_size);
    kv_int(&e, "pid", m->pid);
    kv_ostr(&e, "name", m->name);
    return enc_end(&e);
}

static int hello_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_hello *o = p;
    int role;
    bool present;

    o->rank = -1;
    o->world_size = 0;
    if (get_int(d, m, "version", 0, INT_MAX, &o->version) < 0 ||
        get_enum(d, m, "role", role_names, N_NAMES(role_names), &role) < 0 ||
        opt_int(d, m, "rank", 0, INT_MAX, &o->rank, &present) < 0 ||
        opt_int(d, m, "world_size", 0, INT_MAX, &o->world_size, &present) < 0 ||
        get_i64(d, m, "pid", 0, INT64_MAX, &o->pid) < 0 || opt_str(d, m, "name", &o->name) < 0)
        return -1;
    o->role = (enum lora_role)role;
    return 0;
}
DEFINE_DECODER(hello, LORA_MSG_HELLO)

#define N_LIMITS 10

static void kv_limits(struct enc *e, const struct lora_msg_limits *l)
{
    key(e, "limits");
    map_(e, N_LIMITS);
    kv_int(e, "max_loras", l->max_loras);
    kv_int(e, "max_cpu_loras", l->max_cpu_loras);
    kv_int(e, "max_lora_rank", l->max_lora_rank);
    kv_int(e, "block_size", l->block_size);
    kv_int(e, "num_kv_blocks", l->num_kv_blocks);
    kv_int(e, "world_size", l->world_size);
    kv_int(e, "max_model_len", l->max_model_len);
    kv_int(e, "max_num_batched_tokens", l->max_num_batched_tokens);
    kv_int(e, "max_num_seqs", l->max_num_seqs);
    kv_int(e, "vocab_size", l->vocab_size);
}

static int limits_fields(struct dec *d, const msgpack_object_map *top, struct lora_msg_limits *l)
{
    const msgpack_object_map *m;

    if (get_map(d, top, "limits", &m) < 0)
        return -1;
    size_t mark = path_push(d, "limits", -1);
    int rc = -1;
    if (get_int(d, m, "max_loras", 0, INT_MAX, &l->max_loras) < 0 ||
        get_int(d, m, "max_cpu_loras", 0, INT_MAX, &l->max_cpu_loras) < 0 ||
        get_int(d, m, "max_lora_rank", 0, INT_MAX, &l->max_lora_rank) < 0 ||
        get_int(d, m, "block_size", 0, INT_MAX, &l->block_size) < 0 ||
        get_int(d, m, "num_kv_blocks", 0, INT_MAX, &l->num_kv_blocks) < 0 ||
        get_int(d, m, "world_size", 0, INT_MAX, &l->world_size) < 0 ||
        get_int(d, m, "max_model_len", 0, INT_MAX, &l->max_model_len) < 0 ||
        get_int(d, m, "max_num_batched_tokens", 0, INT_MAX, &l->max_num_batched_tokens) < 0 ||
        get_int(d, m, "max_num_seqs", 0, INT_MAX, &l->max_num_seqs) < 0 ||
        get_int(d, m, "vocab_size", 0, INT_MAX, &l->vocab_size) < 0)
        goto out;
    rc = 0;
out:
    path_pop(d, mark);
    return rc;
}

/* Below, with the other list decoders. */
typedef int (*elem_fields_fn)(struct dec *d, const msgpack_object_map *m, void *out);
static int map_array(struct dec *d, const char *key, const msgpack_object_array *a, size_t size,
                     elem_fields_fn fields, void **items);

int lora_msg_encode_ready(struct lora_buf *b, const struct lora_msg_ready *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_READY, 4 + (m->n_startup_loads > 0));
    kv_int(&e, "version", m->version);
    kv_int(&e, "engine_index", m->engine_index);
    kv_str(&e, "model", m->model);
    kv_limits(&e, &m->limits);
    if (m->n_startup_loads > 0) {
        kv_array(&e, "startup_loads", m->n_startup_loads, m->startup_loads, MAX_LIST);
        for (int i = 0; i < m->n_startup_loads && !e.error; i++) {
            const struct lora_msg_startup_load *l = &m->startup_loads[i];
            map_(&e, 5);
            kv_int(&e, "rank", l->rank);
            kv_u64(&e, "seq", l->seq);
            kv_str(&e, "name", l->name);
            kv_enum(&e, "transition", transition_names, N_NAMES(transition_names),
                    l->transition);
            kv_f64(&e, "seconds", l->seconds);
        }
    }
    return enc_end(&e);
}

static int startup_load_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_startup_load *l = p;

    if (get_int(d, m, "rank", 0, INT_MAX, &l->rank) < 0 || get_u64(d, m, "seq", &l->seq) < 0 ||
        get_str(d, m, "name", &l->name) < 0 ||
        get_enum(d, m, "transition", transition_names, N_NAMES(transition_names),
                 &l->transition) < 0 ||
        get_f64(d, m, "seconds", &l->seconds) < 0)
        return -1;
    return 0;
}

static int ready_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_ready *o = p;
    const msgpack_object *v;

    if (get_int(d, m, "version", 0, INT_MAX, &o->version) < 0 ||
        get_int(d, m, "engine_index", 0, INT_MAX, &o->engine_index) < 0 ||
        get_str(d, m, "model", &o->model) < 0 || limits_fields(d, m, &o->limits) < 0 ||
        find(d, m, "startup_loads", &v) < 0)
        return -1;
    o->n_startup_loads = 0;
    o->startup_loads = NULL;
    if (v) {
        const msgpack_object_array *a;
        void *elems;
        if (as_array(d, "startup_loads", v, MAX_LIST, &a) < 0 ||
            map_array(d, "startup_loads", a, sizeof(*o->startup_loads), startup_load_fields,
                      &elems) < 0)
            return -1;
        o->startup_loads = elems;
        o->n_startup_loads = (int)a->size;
    }
    return 0;
}
DEFINE_DECODER(ready, LORA_MSG_READY)

int lora_msg_encode_setup(struct lora_buf *b, const struct lora_msg_setup *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_SETUP, 3 + HAS(m->shm));
    kv_str(&e, "model", m->model);
    kv_int(&e, "rank", m->rank);
    kv_limits(&e, &m->limits);
    kv_ostr(&e, "shm", m->shm);
    return enc_end(&e);
}

static int setup_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_setup *o = p;

    if (get_str(d, m, "model", &o->model) < 0 || get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        limits_fields(d, m, &o->limits) < 0 || opt_str(d, m, "shm", &o->shm) < 0)
        return -1;
    return 0;
}
DEFINE_DECODER(setup, LORA_MSG_SETUP)

int lora_msg_encode_setup_done(struct lora_buf *b, const struct lora_msg_setup_done *m,
                               struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_SETUP_DONE, 3 + HAS(m->error));
    kv_bool(&e, "ok", m->ok);
    kv_ostr(&e, "error", m->error);
    kv_int(&e, "rank", m->rank);
    kv_u64(&e, "weight_bytes", m->weight_bytes);
    return enc_end(&e);
}

static int setup_done_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_setup_done *o = p;

    if (get_bool(d, m, "ok", &o->ok) < 0 || opt_str(d, m, "error", &o->error) < 0 ||
        get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        get_u64(d, m, "weight_bytes", &o->weight_bytes) < 0)
        return -1;
    return 0;
}
DEFINE_DECODER(setup_done, LORA_MSG_SETUP_DONE)

/* ---- step, step_reply ----------------------------------------------------------------------- */

#define N_STEP_SEQ_KEYS 14

int lora_msg_encode_step(struct lora_buf *b, const struct lora_msg_step *m,
                         struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    uint64_t sum_tokens = 0, sum_blocks = 0;

    if (n_bins)
        *n_bins = 2;
    enc_begin(&e, b, LORA_MSG_STEP, 4);
    kv_u64(&e, "step_id", m->step_id);
    kv_array(&e, "seqs", m->n_seqs, m->seqs, LORA_MSG_MAX_SEQS);
    for (int i = 0; i < m->n_seqs && !e.error; i++) {
        const struct lora_msg_step_seq *s = &m->seqs[i];
        if (s->n_tokens < 0 || s->n_blocks < 0)
            invalid(&e);
        sum_tokens += (uint64_t)s->n_tokens;
        sum_blocks += (uint64_t)s->n_blocks;
        if (s->n_banned < 0 || s->n_banned > LORA_MSG_MAX_BANNED || s->n_allowed < 0 ||
            s->n_allowed > LORA_MSG_MAX_ALLOWED)
            invalid(&e);
        if (s->prompt_top_n < 0 || s->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
            invalid(&e);
        map_(&e, N_STEP_SEQ_KEYS + (s->n_banned > 0) + (s->n_allowed > 0) +
                     (s->prompt_top_n > 0));
        kv_u64(&e, "seq_id", s->seq_id);
        kv_int(&e, "n_tokens", s->n_tokens);
        kv_int(&e, "pos", s->pos);
        kv_int(&e, "n_blocks", s->n_blocks);
        kv_int(&e, "slot", s->slot);
        kv_bool(&e, "all_logits", s->all_logits);
        kv_bool(&e, "sample", s->sample);
        kv_f32(&e, "temperature", s->temperature);
        kv_f32(&e, "top_p", s->top_p);
        kv_int(&e, "top_k", s->top_k);
        kv_u64(&e, "seed", s->seed);
        kv_int(&e, "n_generated", s->n_generated);
        kv_int(&e, "top_n", s->top_n);
        kv_int(&e, "next_token", s->next_token);
        if (s->n_banned > 0)
            kv_i32s(&e, "banned", s->banned, s->n_banned);
        if (s->n_allowed > 0)
            kv_i32s(&e, "allowed", s->allowed, s->n_allowed);
        if (s->prompt_top_n > 0)
            kv_int(&e, "prompt_top_n", s->prompt_top_n);
    }
    if (sum_tokens != m->n_tokens_total || sum_blocks != m->n_block_entries)
        invalid(&e);
    kv_u64(&e, "n_tokens_total", m->n_tokens_total);
    kv_u64(&e, "n_block_entries", m->n_block_entries);
    bin_frame(&e, bins, 0, m->tokens, m->n_tokens_total);
    bin_frame(&e, bins, 1, m->block_tables, m->n_block_entries);
    return enc_end(&e);
}

/* Fields of one element of an array of maps: out is the element to fill. */
typedef int (*elem_fields_fn)(struct dec *d, const msgpack_object_map *m, void *out);

/* Decodes array a, the value of key, whose elements are maps, into a new arena array of
 * a->size elements of size bytes, each filled by fields; errors name key[i]. */
static int map_array(struct dec *d, const char *key, const msgpack_object_array *a, size_t size,
                     elem_fields_fn fields, void **items)
{
    char *v = NULL;

    if (a->size && !(v = arena_alloc(d->arena, a->size, size)))
        return no_memory(d, key);
    for (uint32_t i = 0; i < a->size; i++) {
        const msgpack_object_map *em;
        if (as_map(d, key, i, &a->ptr[i], &em) < 0)
            return -1;
        size_t mark = path_push(d, key, i);
        int rc = fields(d, em, v + (size_t)i * size);
        path_pop(d, mark);
        if (rc < 0)
            return -1;
    }
    *items = v;
    return 0;
}

static int step_seq_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step_seq *s = p;

    s->n_banned = 0; /* arena memory is not zeroed */
    s->banned = NULL;
    s->n_allowed = 0;
    s->allowed = NULL;
    s->prompt_top_n = 0;
    if (get_u64(d, m, "seq_id", &s->seq_id) < 0 ||
        get_int(d, m, "n_tokens", 0, INT_MAX, &s->n_tokens) < 0 ||
        get_int(d, m, "pos", 0, INT_MAX, &s->pos) < 0 ||
        get_int(d, m, "n_blocks", 0, INT_MAX, &s->n_blocks) < 0 ||
        get_int(d, m, "slot", -1, INT_MAX, &s->slot) < 0 ||
        get_bool(d, m, "all_logits", &s->all_logits) < 0 ||
        get_bool(d, m, "sample", &s->sample) < 0 ||
        get_f32(d, m, "temperature", &s->temperature) < 0 ||
        get_f32(d, m, "top_p", &s->top_p) < 0 ||
        get_int(d, m, "top_k", INT_MIN, INT_MAX, &s->top_k) < 0 ||
        get_u64(d, m, "seed", &s->seed) < 0 ||
        get_int(d, m, "n_generated", 0, INT_MAX, &s->n_generated) < 0 ||
        get_int(d, m, "top_n", 0, LORA_MSG_MAX_TOP, &s->top_n) < 0 ||
        get_int(d, m, "next_token", -1, INT32_MAX, &s->next_token) < 0)
        return -1;
    if (opt_i32_list(d, m, "banned", LORA_MSG_MAX_BANNED, &s->banned, &s->n_banned) < 0 ||
        opt_i32_list(d, m, "allowed", LORA_MSG_MAX_ALLOWED, &s->allowed, &s->n_allowed) < 0)
        return -1;
    bool present;
    return opt_int(d, m, "prompt_top_n", 0, LORA_MSG_MAX_PROMPT_TOP, &s->prompt_top_n, &present);
}

static int step_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step *o = p;
    const msgpack_object_array *a;
    void *elems;
    struct lora_msg_step_seq *seqs = NULL;
    uint64_t n_tokens, n_blocks, sum_tokens = 0, sum_blocks = 0;

    if (get_u64(d, m, "step_id", &o->step_id) < 0 ||
        get_array(d, m, "seqs", LORA_MSG_MAX_SEQS, &a) < 0 ||
        get_u64(d, m, "n_tokens_total", &n_tokens) < 0 ||
        get_u64(d, m, "n_block_entries", &n_blocks) < 0)
        return -1;
    if (map_array(d, "seqs", a, sizeof(*seqs), step_seq_fields, &elems) < 0)
        return -1;
    seqs = elems;
    for (uint32_t i = 0; i < a->size; i++) {
        sum_tokens += (uint64_t)seqs[i].n_tokens;
        sum_blocks += (uint64_t)seqs[i].n_blocks;
    }
    if (sum_tokens != n_tokens)
        return FAIL(d, "n_tokens_total", -1,
                    "%" PRIu64 ", but the seqs' n_tokens add up to %" PRIu64, n_tokens, sum_tokens);
    if (sum_blocks != n_blocks)
        return FAIL(d, "n_block_entries", -1,
                    "%" PRIu64 ", but the seqs' n_blocks add up to %" PRIu64, n_blocks, sum_blocks);
    if (frame_i32(d, 0, "n_tokens_total", n_tokens, &o->tokens) < 0 ||
        frame_i32(d, 1, "n_block_entries", n_blocks, &o->block_tables) < 0)
        return -1;
    o->n_seqs = (int)a->size;
    o->seqs = seqs;
    o->n_tokens_total = (size_t)n_tokens;
    o->n_block_entries = (size_t)n_blocks;
    return 0;
}
DEFINE_DECODER(step, LORA_MSG_STEP)

int lora_msg_encode_step_reply(struct lora_buf *b, const struct lora_msg_step_reply *m,
                               struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_STEP_REPLY, 6 + HAS(m->error));
    kv_u64(&e, "step_id", m->step_id);
    kv_int(&e, "rank", m->rank);
    kv_bool(&e, "ok", m->ok);
    kv_ostr(&e, "error", m->error);
    kv_bool(&e, "doorbell", m->doorbell);
    kv_f64(&e, "step_seconds", m->step_seconds);
    kv_array(&e, "outs", m->n_outs, m->outs, LORA_MSG_MAX_SEQS);
    for (int i = 0; i < m->n_outs && !e.error; i++) {
        const struct lora_msg_step_out *s = &m->outs[i];
        bool has_ranks = s->prompt_ranks && s->n_prompt_logprobs > 0;
        bool has_ptop = s->prompt_top_n > 0;
        if (s->prompt_top_n < 0 || s->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
            invalid(&e);
        map_(&e, 6 + has_ranks + 3 * has_ptop);
        kv_u64(&e, "seq_id", s->seq_id);
        kv_int(&e, "token", s->token);
        kv_f32(&e, "logprob", s->logprob);
        if (s->n_top > LORA_MSG_MAX_TOP)
            invalid(&e);
        kv_i32s(&e, "top_ids", s->top_ids, s->n_top);
        kv_f32s(&e, "top_logprobs", s->top_logprobs, s->n_top);
        kv_f32s(&e, "prompt_logprobs", s->prompt_logprobs, s->n_prompt_logprobs);
        if (has_ranks)
            kv_i32s(&e, "prompt_ranks", s->prompt_ranks, s->n_prompt_logprobs);
        if (has_ptop) {
            long n = (long)s->n_prompt_logprobs * s->prompt_top_n;
            kv_int(&e, "prompt_top_n", s->prompt_top_n);
            kv_i32s(&e, "prompt_top_ids", s->prompt_top_ids, n);
            kv_f32s(&e, "prompt_top_logprobs", s->prompt_top_logprobs, n);
        }
    }
    return enc_end(&e);
}

/* The optional "prompt_ranks" beside "prompt_logprobs": as many values, or absent (NULL). */
static int prompt_ranks(struct dec *d, const msgpack_object_map *m, uint32_t n,
                        const int32_t **out)
{
    const msgpack_object *v;
    const msgpack_object_array *a;

    *out = NULL; /* arena memory is not zeroed */
    if (find(d, m, "prompt_ranks", &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (as_array(d, "prompt_ranks", v, LORA_MSG_MAX_BODY, &a) < 0)
        return -1;
    if (a->size != n)
        return FAIL(d, "prompt_ranks", -1, "%" PRIu32 " values, but prompt_logprobs has %" PRIu32,
                    a->size, n);
    return i32_list(d, "prompt_ranks", a, out);
}

/* The optional "prompt_top_n" with "prompt_top_ids" and "prompt_top_logprobs", n positions of
 * top_n values each; all absent (0, NULL) or all present. */
static int prompt_top(struct dec *d, const msgpack_object_map *m, uint32_t n, int *top_n,
                      const int32_t **ids, const float **lps)
{
    static const char *const keys[2] = {"prompt_top_ids", "prompt_top_logprobs"};
    bool present;

    *top_n = 0; /* arena memory is not zeroed */
    *ids = NULL;
    *lps = NULL;
    if (opt_int(d, m, "prompt_top_n", 0, LORA_MSG_MAX_PROMPT_TOP, top_n, &present) < 0)
        return -1;
    uint64_t want = (uint64_t)n * (uint64_t)*top_n;
    for (int k = 0; k < 2; k++) {
        const msgpack_object *v;
        const msgpack_object_array *a;
        if (find(d, m, keys[k], &v) < 0)
            return -1;
        if (!v) {
            if (*top_n)
                return FAIL(d, keys[k], -1, "missing (prompt_top_n is %d)", *top_n);
            continue;
        }
        if (!present)
            return FAIL(d, "prompt_top_n", -1, "missing (%s is given)", keys[k]);
        if (as_array(d, keys[k], v, LORA_MSG_MAX_BODY, &a) < 0)
            return -1;
        if (a->size != want)
            return FAIL(d, keys[k], -1,
                        "%" PRIu32 " values, prompt positions * prompt_top_n is %" PRIu64,
                        a->size, want);
        if (k == 0 ? i32_list(d, keys[k], a, ids) : f32_list(d, keys[k], a, lps))
            return -1;
    }
    return 0;
}

static int step_out_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step_out *s = p;
    const msgpack_object_array *ids, *lps, *plps;

    if (get_u64(d, m, "seq_id", &s->seq_id) < 0 ||
        get_int(d, m, "token", -1, INT_MAX, &s->token) < 0 ||
        get_f32(d, m, "logprob", &s->logprob) < 0 ||
        get_array(d, m, "top_ids", LORA_MSG_MAX_TOP, &ids) < 0 ||
        get_array(d, m, "top_logprobs", LORA_MSG_MAX_TOP, &lps) < 0 ||
        get_array(d, m, "prompt_logprobs", LORA_MSG_MAX_BODY, &plps) < 0)
        return -1;
    if (lps->size != ids->size)
        return FAIL(d, "top_logprobs", -1, "%" PRIu32 " values, but top_ids has %" PRIu32,
                    lps->size, ids->size);
    if (i32_list(d, "top_ids", ids, &s->top_ids) < 0 ||
        f32_list(d, "top_logprobs", lps, &s->top_logprobs) < 0 ||
        f32_list(d, "prompt_logprobs", plps, &s->prompt_logprobs) < 0)
        return -1;
    s->n_top = (int)ids->size;
    s->n_prompt_logprobs = (int)plps->size;
    if (prompt_ranks(d, m, plps->size, &s->prompt_ranks) < 0)
        return -1;
    return prompt_top(d, m, plps->size, &s->prompt_top_n, &s->prompt_top_ids,
                      &s->prompt_top_logprobs);
}

static int step_reply_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_step_reply *o = p;
    const msgpack_object_array *a;
    void *elems;

    if (get_u64(d, m, "step_id", &o->step_id) < 0 ||
        get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 || get_bool(d, m, "ok", &o->ok) < 0 ||
        opt_str(d, m, "error", &o->error) < 0 || get_bool(d, m, "doorbell", &o->doorbell) < 0 ||
        get_f64(d, m, "step_seconds", &o->step_seconds) < 0 ||
        get_array(d, m, "outs", LORA_MSG_MAX_SEQS, &a) < 0)
        return -1;
    if (map_array(d, "outs", a, sizeof(*o->outs), step_out_fields, &elems) < 0)
        return -1;
    o->outs = elems;
    o->n_outs = (int)a->size;
    return 0;
}
DEFINE_DECODER(step_reply, LORA_MSG_STEP_REPLY)

/* ---- adapter_op, adapter_op_reply ----------------------------------------------------------- */

int lora_msg_encode_adapter_op(struct lora_buf *b, const struct lora_msg_adapter_op *m,
                               struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    bool has_slot = m->slot >= 0;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_ADAPTER_OP, 3 + HAS(m->path) + has_slot);
    if ((m->op == LORA_OP_ADD && !m->path.s) || (m->op == LORA_OP_ACTIVATE && !has_slot))
        invalid(&e);
    kv_u64(&e, "op_id", m->op_id);
    kv_enum(&e, "op", op_names, N_NAMES(op_names), (int)m->op);
    kv_str(&e, "name", m->name);
    kv_ostr(&e, "path", m->path);
    if (has_slot)
        kv_int(&e, "slot", m->slot);
    return enc_end(&e);
}

static int adapter_op_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_adapter_op *o = p;
    int op;
    bool has_slot;

    o->slot = -1;
    if (get_u64(d, m, "op_id", &o->op_id) < 0 ||
        get_enum(d, m, "op", op_names, N_NAMES(op_names), &op) < 0 ||
        get_str(d, m, "name", &o->name) < 0 || opt_str(d, m, "path", &o->path) < 0 ||
        opt_int(d, m, "slot", 0, INT_MAX, &o->slot, &has_slot) < 0)
        return -1;
    o->op = (enum lora_adapter_op)op;
    if (o->op == LORA_OP_ADD && !o->path.s)
        return FAIL(d, "path", -1, "missing (op add needs it)");
    if (o->op == LORA_OP_ACTIVATE && !has_slot)
        return FAIL(d, "slot", -1, "missing (op activate needs it)");
    return 0;
}
DEFINE_DECODER(adapter_op, LORA_MSG_ADAPTER_OP)

int lora_msg_encode_adapter_op_reply(struct lora_buf *b,
                                     const struct lora_msg_adapter_op_reply *m,
                                     struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_ADAPTER_OP_REPLY, 4 + HAS(m->error));
    kv_u64(&e, "op_id", m->op_id);
    kv_int(&e, "rank", m->rank);
    kv_bool(&e, "ok", m->ok);
    kv_ostr(&e, "error", m->error);
    kv_f64(&e, "seconds", m->seconds);
    return enc_end(&e);
}

static int adapter_op_reply_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_adapter_op_reply *o = p;

    if (get_u64(d, m, "op_id", &o->op_id) < 0 || get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        get_bool(d, m, "ok", &o->ok) < 0 || opt_str(d, m, "error", &o->error) < 0 ||
        get_f64(d, m, "seconds", &o->seconds) < 0)
        return -1;
    return 0;
}
DEFINE_DECODER(adapter_op_reply, LORA_MSG_ADAPTER_OP_REPLY)

/* ---- notifications, residency_reply -------------------------------------------------------- */

static void kv_state(struct enc *e, const struct lora_msg_state *s)
{
    key(e, "state");
    map_(e, 3);
    kv_strs(e, "slots", s->slots, s->n_slots);
    kv_strs(e, "cpu", s->cpu, s->n_cpu);
    kv_strs(e, "pinned", s->pinned, s->n_pinned);
}

static int state_list(struct dec *d, const msgpack_object_map *m, const char *key, int *n,
                      struct lora_str **out)
{
    const msgpack_object_array *a;

    if (get_array(d, m, key, LORA_MSG_MAX_ADAPTERS, &a) < 0 || str_list(d, key, a, out) < 0)
        return -1;
    *n = (int)a->size;
    return 0;
}

static int state_fields(struct dec *d, const msgpack_object_map *top, struct lora_msg_state *s)
{
    const msgpack_object_map *m;

    if (get_map(d, top, "state", &m) < 0)
        return -1;
    size_t mark = path_push(d, "state", -1);
    int rc = -1;
    if (state_list(d, m, "slots", &s->n_slots, &s->slots) < 0 ||
        state_list(d, m, "cpu", &s->n_cpu, &s->cpu) < 0 ||
        state_list(d, m, "pinned", &s->n_pinned, &s->pinned) < 0)
        goto out;
    rc = 0;
out:
    path_pop(d, mark);
    return rc;
}

int lora_msg_encode_notifications(struct lora_buf *b, const struct lora_msg_notifications *m,
                                  struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    bool has_engine = m->engine >= 0;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_NOTIFICATIONS, 3 + has_engine);
    if (has_engine)
        kv_int(&e, "engine", m->engine);
    kv_int(&e, "rank", m->rank);
    kv_u64(&e, "dropped", m->dropped);
    kv_array(&e, "items", m->n_items, m->items, MAX_LIST);
    for (int i = 0; i < m->n_items && !e.error; i++) {
        const struct lora_msg_notification *n = &m->items[i];
        map_(&e, 5);
        kv_str(&e, "kind", n->kind);
        kv_u64(&e, "seq", n->seq);
        kv_f64(&e, "time", n->time);
        kv_state(&e, &n->state);
        kv_array(&e, "timings", n->n_timings, n->timings, MAX_LIST);
        for (int j = 0; j < n->n_timings && !e.error; j++) {
            const struct lora_msg_timing *t = &n->timings[j];
            map_(&e, 3);
            kv_str(&e, "name", t->name);
            kv_enum(&e, "transition", transition_names, N_NAMES(transition_names),
                    (int)t->transition);
            kv_f64(&e, "seconds", t->seconds);
        }
    }
    return enc_end(&e);
}

static int timing_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_timing *t = p;
    int tr;

    if (get_str(d, m, "name", &t->name) < 0 ||
        get_enum(d, m, "transition", transition_names, N_NAMES(transition_names), &tr) < 0 ||
        get_f64(d, m, "seconds", &t->seconds) < 0)
        return -1;
    t->transition = (enum lora_transition)tr;
    return 0;
}

static int notification_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_notification *n = p;
    const msgpack_object_array *a;
    void *elems;

    if (get_str(d, m, "kind", &n->kind) < 0 || get_u64(d, m, "seq", &n->seq) < 0 ||
        get_f64(d, m, "time", &n->time) < 0 || state_fields(d, m, &n->state) < 0 ||
        get_array(d, m, "timings", MAX_LIST, &a) < 0)
        return -1;
    if (map_array(d, "timings", a, sizeof(*n->timings), timing_fields, &elems) < 0)
        return -1;
    n->timings = elems;
    n->n_timings = (int)a->size;
    return 0;
}

static int notifications_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_notifications *o = p;
    const msgpack_object_array *a;
    void *elems;
    bool present;

    o->engine = -1;
    if (opt_int(d, m, "engine", 0, INT_MAX, &o->engine, &present) < 0 ||
        get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 ||
        get_u64(d, m, "dropped", &o->dropped) < 0 || get_array(d, m, "items", MAX_LIST, &a) < 0)
        return -1;
    if (map_array(d, "items", a, sizeof(*o->items), notification_fields, &elems) < 0)
        return -1;
    o->items = elems;
    o->n_items = (int)a->size;
    return 0;
}
DEFINE_DECODER(notifications, LORA_MSG_NOTIFICATIONS)

int lora_msg_encode_residency_reply(struct lora_buf *b,
                                    const struct lora_msg_residency_reply *m,
                                    struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_RESIDENCY_REPLY, 2 + (m->engine >= 0));
    if (m->engine >= 0)
        kv_int(&e, "engine", m->engine);
    kv_int(&e, "rank", m->rank);
    kv_state(&e, &m->state);
    return enc_end(&e);
}

static int residency_reply_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_residency_reply *o = p;
    bool present;

    o->engine = -1;
    if (opt_int(d, m, "engine", 0, INT_MAX, &o->engine, &present) < 0 ||
        get_int(d, m, "rank", 0, INT_MAX, &o->rank) < 0 || state_fields(d, m, &o->state) < 0)
        return -1;
    return 0;
}
DEFINE_DECODER(residency_reply, LORA_MSG_RESIDENCY_REPLY)

/* ---- request, abort, output ----------------------------------------------------------------- */

int lora_msg_encode_request(struct lora_buf *b, const struct lora_msg_request *m,
                            struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 1;
    bool has_allowed = m->n_allowed_token_ids > 0;

    enc_begin(&e, b, LORA_MSG_REQUEST,
              11 + HAS(m->lora) + m->has_seed + has_allowed + (m->prompt_top_n > 0));
    if (m->n_allowed_token_ids < 0 || m->n_allowed_token_ids > LORA_MSG_MAX_ALLOWED ||
        m->prompt_top_n < 0 || m->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
        invalid(&e);
    kv_str(&e, "request_id", m->request_id);
    kv_ostr(&e, "lora", m->lora);
    kv_u64(&e, "n_prompt", m->n_prompt);
    kv_int(&e, "max_tokens", m->max_tokens);
    kv_int(&e, "min_tokens", m->min_tokens);
    kv_f32(&e, "temperature", m->temperature);
    kv_f32(&e, "top_p", m->top_p);
    kv_int(&e, "top_k", m->top_k);
    if (m->has_seed)
        kv_u64(&e, "seed", m->seed);
    if (m->logprobs < 0 || m->logprobs > LORA_MSG_MAX_TOP)
        invalid(&e);
    kv_int(&e, "logprobs", m->logprobs);
    kv_bool(&e, "prompt_logprobs", m->prompt_logprobs);
    kv_bool(&e, "ignore_eos", m->ignore_eos);
    kv_i32s(&e, "stop_token_ids", m->stop_token_ids, m->n_stop_token_ids);
    if (has_allowed)
        kv_i32s(&e, "allowed_token_ids", m->allowed_token_ids, m->n_allowed_token_ids);
    if (m->prompt_top_n > 0)
        kv_int(&e, "prompt_top_n", m->prompt_top_n);
    bin_frame(&e, bins, 0, m->prompt, m->n_prompt);
    return enc_end(&e);
}

static int request_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_request *o = p;
    const msgpack_object *seed;
    const msgpack_object_array *stop;
    uint64_t n_prompt;

    bool present;

    o->n_allowed_token_ids = 0;
    o->allowed_token_ids = NULL;
    o->prompt_top_n = 0;
    if (get_str(d, m, "request_id", &o->request_id) < 0 || opt_str(d, m, "lora", &o->lora) < 0 ||
        get_u64(d, m, "n_prompt", &n_prompt) < 0 ||
        get_int(d, m, "max_tokens", 0, INT_MAX, &o->max_tokens) < 0 ||
        get_int(d, m, "min_tokens", 0, INT_MAX, &o->min_tokens) < 0 ||
        get_f32(d, m, "temperature", &o->temperature) < 0 ||
        get_f32(d, m, "top_p", &o->top_p) < 0 ||
        get_int(d, m, "top_k", INT_MIN, INT_MAX, &o->top_k) < 0 || find(d, m, "seed", &seed) < 0 ||
        (seed && as_u64(d, "seed", seed, &o->seed) < 0) ||
        get_int(d, m, "logprobs", 0, LORA_MSG_MAX_TOP, &o->logprobs) < 0 ||
        get_bool(d, m, "prompt_logprobs", &o->prompt_logprobs) < 0 ||
        get_bool(d, m, "ignore_eos", &o->ignore_eos) < 0 ||
        get_array(d, m, "stop_token_ids", MAX_LIST, &stop) < 0 ||
        i32_list(d, "stop_token_ids", stop, &o->stop_token_ids) < 0 ||
        frame_i32(d, 0, "n_prompt", n_prompt, &o->prompt) < 0 ||
        opt_int(d, m, "prompt_top_n", 0, LORA_MSG_MAX_PROMPT_TOP, &o->prompt_top_n, &present) < 0 ||
        opt_i32_list(d, m, "allowed_token_ids", LORA_MSG_MAX_ALLOWED, &o->allowed_token_ids,
                     &o->n_allowed_token_ids) < 0)
        return -1;
    o->has_seed = seed != NULL;
    o->n_stop_token_ids = (int)stop->size;
    o->n_prompt = (size_t)n_prompt;
    return 0;
}
DEFINE_DECODER(request, LORA_MSG_REQUEST)

int lora_msg_encode_abort(struct lora_buf *b, const struct lora_msg_abort *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_ABORT, 1);
    kv_str(&e, "request_id", m->request_id);
    return enc_end(&e);
}

static int abort_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_abort *o = p;
    return get_str(d, m, "request_id", &o->request_id);
}
DEFINE_DECODER(abort, LORA_MSG_ABORT)

static const char *const output_time_keys[4] = {"queued_time", "scheduled_time",
                                                "first_token_time", "finished_time"};

int lora_msg_encode_output(struct lora_buf *b, const struct lora_msg_output *m,
                           struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    bool has_top = m->top_n > 0, has_plp = m->n_prompt_logprobs > 0;
    bool has_ranks = has_plp && m->prompt_ranks;
    bool has_ptop = has_plp && m->prompt_top_n > 0;
    long n_top = 0;

    if (n_bins)
        *n_bins = 0;
    const double times[4] = {m->queued_time, m->scheduled_time, m->first_token_time,
                             m->finished_time};
    size_t n_times = 0;
    for (int i = 0; i < 4; i++)
        n_times += times[i] != 0;
    enc_begin(&e, b, LORA_MSG_OUTPUT,
              5 + 3 * has_top + has_plp + has_ranks + 3 * has_ptop + HAS(m->finish_reason) +
                  HAS(m->error) +
                  HAS(m->error_code) + n_times);
    if (m->n_tokens < 0 || m->top_n < 0 || m->top_n > LORA_MSG_MAX_TOP)
        invalid(&e);
    else
        n_top = (long)m->n_tokens * m->top_n;
    kv_str(&e, "request_id", m->request_id);
    kv_i32s(&e, "tokens", m->tokens, m->n_tokens);
    kv_f32s(&e, "logprobs", m->logprobs, m->n_tokens);
    if (has_top) {
        kv_int(&e, "top_n", m->top_n);
        kv_i32s(&e, "top_ids", m->top_ids, n_top);
        kv_f32s(&e, "top_logprobs", m->top_logprobs, n_top);
    }
    if (has_plp)
        kv_f32s(&e, "prompt_logprobs", m->prompt_logprobs, m->n_prompt_logprobs);
    if (has_ranks)
        kv_i32s(&e, "prompt_ranks", m->prompt_ranks, m->n_prompt_logprobs);
    if (m->prompt_top_n < 0 || m->prompt_top_n > LORA_MSG_MAX_PROMPT_TOP)
        invalid(&e);
    if (has_ptop) {
        long n = (long)m->n_prompt_logprobs * m->prompt_top_n;
        kv_int(&e, "prompt_top_n", m->prompt_top_n);
        kv_i32s(&e, "prompt_top_ids", m->prompt_top_ids, n);
        kv_f32s(&e, "prompt_top_logprobs", m->prompt_top_logprobs, n);
    }
    kv_bool(&e, "finished", m->finished);
    kv_ostr(&e, "finish_reason", m->finish_reason);
    kv_int(&e, "num_prompt_tokens", m->num_prompt_tokens);
    kv_ostr(&e, "error", m->error);
    kv_ostr(&e, "error_code", m->error_code);
    for (int i = 0; i < 4; i++)
        if (times[i] != 0)
            kv_f64(&e, output_time_keys[i], times[i]);
    return enc_end(&e);
}

/* top_ids and top_logprobs: n_tokens * top_n values each, required when that is not 0. */
static int output_top(struct dec *d, const msgpack_object_map *m, struct lora_msg_output *o)
{
    static const char *const keys[2] = {"top_ids", "top_logprobs"};
    uint64_t want = (uint64_t)o->n_tokens * (uint64_t)o->top_n;

    for (int k = 0; k < 2; k++) {
        const msgpack_object *v;
        const msgpack_object_array *a;
        if (find(d, m, keys[k], &v) < 0)
            return -1;
        if (!v) {
            if (want)
                return FAIL(d, keys[k], -1, "missing (top_n is %d)", o->top_n);
            continue;
        }
        if (as_array(d, keys[k], v, LORA_MSG_MAX_BODY, &a) < 0)
            return -1;
        if (a->size != want)
            return FAIL(d, keys[k], -1, "%" PRIu32 " values, n_tokens * top_n is %" PRIu64, a->size,
                        want);
        if (k == 0 ? i32_list(d, keys[k], a, &o->top_ids)
                   : f32_list(d, keys[k], a, &o->top_logprobs))
            return -1;
    }
    return 0;
}

static int output_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_output *o = p;
    const msgpack_object_array *toks, *lps, *plps;
    const msgpack_object *v;
    bool present;

    if (get_str(d, m, "request_id", &o->request_id) < 0 ||
        get_array(d, m, "tokens", LORA_MSG_MAX_BODY, &toks) < 0 ||
        get_array(d, m, "logprobs", LORA_MSG_MAX_BODY, &lps) < 0)
        return -1;
    if (lps->size != toks->size)
        return FAIL(d, "logprobs", -1, "%" PRIu32 " values, but tokens has %" PRIu32, lps->size,
                    toks->size);
    if (i32_list(d, "tokens", toks, &o->tokens) < 0 ||
        f32_list(d, "logprobs", lps, &o->logprobs) < 0)
        return -1;
    o->n_tokens = (int)toks->size;
    if (opt_int(d, m, "top_n", 0, LORA_MSG_MAX_TOP, &o->top_n, &present) < 0 ||
        output_top(d, m, o) < 0 || find(d, m, "prompt_logprobs", &v) < 0)
        return -1;
    if (v) {
        if (as_array(d, "prompt_logprobs", v, LORA_MSG_MAX_BODY, &plps) < 0 ||
            f32_list(d, "prompt_logprobs", plps, &o->prompt_logprobs) < 0)
            return -1;
        o->n_prompt_logprobs = (int)plps->size;
    }
    if (!v) {
        const msgpack_object *ranks;
        if (find(d, m, "prompt_ranks", &ranks) < 0)
            return -1;
        if (ranks)
            return FAIL(d, "prompt_logprobs", -1, "missing (prompt_ranks needs it)");
    }
    if (prompt_ranks(d, m, (uint32_t)o->n_prompt_logprobs, &o->prompt_ranks) < 0 ||
        prompt_top(d, m, (uint32_t)o->n_prompt_logprobs, &o->prompt_top_n, &o->prompt_top_ids,
                   &o->prompt_top_logprobs) < 0)
        return -1;
    if (get_bool(d, m, "finished", &o->finished) < 0 ||
        opt_str(d, m, "finish_reason", &o->finish_reason) < 0 ||
        get_int(d, m, "num_prompt_tokens", 0, INT_MAX, &o->num_prompt_tokens) < 0 ||
        opt_str(d, m, "error", &o->error) < 0 || opt_str(d, m, "error_code", &o->error_code) < 0)
        return -1;
    double *times[4] = {&o->queued_time, &o->scheduled_time, &o->first_token_time,
                        &o->finished_time};
    for (int i = 0; i < 4; i++)
        if (opt_f64(d, m, output_time_keys[i], times[i]) < 0)
            return -1;
    return 0;
}
DEFINE_DECODER(output, LORA_MSG_OUTPUT)

/* ---- event, stats --------------------------------------------------------------------------- */

int lora_msg_encode_event(struct lora_buf *b, const struct lora_msg_event *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_EVENT, 6 + HAS(m->lora) + HAS(m->finish_reason));
    kv_int(&e, "engine", m->engine);
    kv_str(&e, "request_id", m->request_id);
    kv_enum(&e, "event", event_names, N_NAMES(event_names), (int)m->event);
    kv_f64(&e, "time", m->time);
    kv_ostr(&e, "lora", m->lora);
    kv_ostr(&e, "finish_reason", m->finish_reason);
    kv_int(&e, "num_prompt_tokens", m->num_prompt_tokens);
    kv_int(&e, "num_generation_tokens", m->num_generation_tokens);
    return enc_end(&e);
}

static int event_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_event *o = p;
    int ev;

    if (get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        get_str(d, m, "request_id", &o->request_id) < 0 ||
        get_enum(d, m, "event", event_names, N_NAMES(event_names), &ev) < 0 ||
        get_f64(d, m, "time", &o->time) < 0 || opt_str(d, m, "lora", &o->lora) < 0 ||
        opt_str(d, m, "finish_reason", &o->finish_reason) < 0 ||
        get_int(d, m, "num_prompt_tokens", 0, INT_MAX, &o->num_prompt_tokens) < 0 ||
        get_int(d, m, "num_generation_tokens", 0, INT_MAX, &o->num_generation_tokens) < 0)
        return -1;
    o->event = (enum lora_event_kind)ev;
    return 0;
}
DEFINE_DECODER(event, LORA_MSG_EVENT)

static const char *const stats_time_keys[4] = {"first_token_time", "queued_time",
                                               "scheduled_time", "engine_first_token_time"};

int lora_msg_encode_request_stats(struct lora_buf *b, const struct lora_msg_request_stats *m,
                                  struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    const double opt[7] = {m->first_token_time,        m->queued_time,
                           m->scheduled_time,          m->engine_first_token_time,
                           m->engine_finished_time,    m->submit_seconds,
                           m->output_seconds};
    size_t n_opt = 0;

    if (n_bins)
        *n_bins = 0;
    for (int i = 0; i < 7; i++)
        n_opt += opt[i] != 0;
    enc_begin(&e, b, LORA_MSG_REQUEST_STATS, 8 + HAS(m->lora) + n_opt);
    kv_int(&e, "engine", m->engine);
    kv_str(&e, "request_id", m->request_id);
    kv_ostr(&e, "lora", m->lora);
    kv_str(&e, "finish_reason", m->finish_reason);
    kv_f64(&e, "arrival_time", m->arrival_time);
    kv_f64(&e, "finished_time", m->finished_time);
    for (int i = 0; i < 4; i++)
        if (opt[i] != 0)
            kv_f64(&e, stats_time_keys[i], opt[i]);
    if (opt[4] != 0)
        kv_f64(&e, "engine_finished_time", opt[4]);
    kv_int(&e, "num_prompt_tokens", m->num_prompt_tokens);
    kv_int(&e, "num_generation_tokens", m->num_generation_tokens);
    kv_int(&e, "max_tokens", m->max_tokens);
    if (opt[5] != 0)
        kv_f64(&e, "submit_seconds", opt[5]);
    if (opt[6] != 0)
        kv_f64(&e, "output_seconds", opt[6]);
    return enc_end(&e);
}

static int request_stats_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_request_stats *o = p;
    double *opt[4] = {&o->first_token_time, &o->queued_time, &o->scheduled_time,
                      &o->engine_first_token_time};

    if (get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        get_str(d, m, "request_id", &o->request_id) < 0 || opt_str(d, m, "lora", &o->lora) < 0 ||
        get_str(d, m, "finish_reason", &o->finish_reason) < 0 ||
        get_f64(d, m, "arrival_time", &o->arrival_time) < 0 ||
        get_f64(d, m, "finished_time", &o->finished_time) < 0 ||
        opt_f64(d, m, "engine_finished_time", &o->engine_finished_time) < 0 ||
        get_int(d, m, "num_prompt_tokens", 0, INT_MAX, &o->num_prompt_tokens) < 0 ||
        get_int(d, m, "num_generation_tokens", 0, INT_MAX, &o->num_generation_tokens) < 0 ||
        get_int(d, m, "max_tokens", -1, INT_MAX, &o->max_tokens) < 0 ||
        opt_f64(d, m, "submit_seconds", &o->submit_seconds) < 0 ||
        opt_f64(d, m, "output_seconds", &o->output_seconds) < 0)
        return -1;
    for (int i = 0; i < 4; i++)
        if (opt_f64(d, m, stats_time_keys[i], opt[i]) < 0)
            return -1;
    return 0;
}
DEFINE_DECODER(request_stats, LORA_MSG_REQUEST_STATS)

int lora_msg_encode_stats(struct lora_buf *b, const struct lora_msg_stats *m,
                          struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_STATS, 11);
    kv_int(&e, "engine", m->engine);
    kv_f64(&e, "time", m->time);
    kv_int(&e, "running", m->running);
    kv_int(&e, "waiting", m->waiting);
    kv_f64(&e, "kv_usage", m->kv_usage);
    kv_u64(&e, "num_preemptions", m->num_preemptions);
    kv_int(&e, "step_adapters", m->step_adapters);
    kv_int(&e, "step_tokens", m->step_tokens);
    kv_f64(&e, "step_seconds", m->step_seconds);
    kv_f64(&e, "model_seconds", m->model_seconds);
    kv_array(&e, "adapters", m->n_adapters, m->adapters, LORA_MSG_MAX_ADAPTERS);
    for (int i = 0; i < m->n_adapters && !e.error; i++) {
        map_(&e, 3);
        kv_str(&e, "name", m->adapters[i].name);
        kv_int(&e, "running", m->adapters[i].running);
        kv_int(&e, "waiting", m->adapters[i].waiting);
    }
    return enc_end(&e);
}

static int adapter_count_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_adapter_count *c = p;
    if (get_str(d, m, "name", &c->name) < 0 ||
        get_int(d, m, "running", 0, INT_MAX, &c->running) < 0 ||
        get_int(d, m, "waiting", 0, INT_MAX, &c->waiting) < 0)
        return -1;
    return 0;
}

static int stats_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_stats *o = p;
    const msgpack_object_array *a;
    void *elems;

    if (get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        get_f64(d, m, "time", &o->time) < 0 ||
        get_int(d, m, "running", 0, INT_MAX, &o->running) < 0 ||
        get_int(d, m, "waiting", 0, INT_MAX, &o->waiting) < 0 ||
        get_f64(d, m, "kv_usage", &o->kv_usage) < 0 ||
        get_u64(d, m, "num_preemptions", &o->num_preemptions) < 0 ||
        get_int(d, m, "step_adapters", 0, INT_MAX, &o->step_adapters) < 0 ||
        get_int(d, m, "step_tokens", 0, INT_MAX, &o->step_tokens) < 0 ||
        get_f64(d, m, "step_seconds", &o->step_seconds) < 0 ||
        opt_f64(d, m, "model_seconds", &o->model_seconds) < 0 ||
        get_array(d, m, "adapters", LORA_MSG_MAX_ADAPTERS, &a) < 0)
        return -1;
    if (map_array(d, "adapters", a, sizeof(*o->adapters), adapter_count_fields, &elems) < 0)
        return -1;
    o->adapters = elems;
    o->n_adapters = (int)a->size;
    return 0;
}
DEFINE_DECODER(stats, LORA_MSG_STATS)

/* ---- control, control_reply, registry ------------------------------------------------------- */

/* Which control ops name an adapter, and which also need its path. */
static bool control_needs_name(enum lora_control_op op)
{
    return op == LORA_CTL_LOAD || op == LORA_CTL_UNLOAD || op == LORA_CTL_PIN ||
           op == LORA_CTL_UNPIN;
}

int lora_msg_encode_control(struct lora_buf *b, const struct lora_msg_control *m,
                            struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_CONTROL, 2 + HAS(m->name) + HAS(m->path));
    if ((control_needs_name(m->op) && !m->name.s) || (m->op == LORA_CTL_LOAD && !m->path.s))
        invalid(&e);
    kv_u64(&e, "id", m->id);
    kv_enum(&e, "op", control_names, N_NAMES(control_names), (int)m->op);
    kv_ostr(&e, "name", m->name);
    kv_ostr(&e, "path", m->path);
    return enc_end(&e);
}

static int control_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_control *o = p;
    int op;

    if (get_u64(d, m, "id", &o->id) < 0 ||
        get_enum(d, m, "op", control_names, N_NAMES(control_names), &op) < 0 ||
        opt_str(d, m, "name", &o->name) < 0 || opt_str(d, m, "path", &o->path) < 0)
        return -1;
    o->op = (enum lora_control_op)op;
    if (control_needs_name(o->op) && !o->name.s)
        return FAIL(d, "name", -1, "missing (op %s needs it)", control_names[op]);
    if (o->op == LORA_CTL_LOAD && !o->path.s)
        return FAIL(d, "path", -1, "missing (op load needs it)");
    return 0;
}
DEFINE_DECODER(control, LORA_MSG_CONTROL)

/* Is data[0..len) exactly one msgpack map or array? */
static bool is_container(const void *data, size_t len)
{
    const char *why;
    size_t where;
    const unsigned char *p = data;

    if (scan_body(data, len, &why, &where) < 0)
        return false;
    return (*p >= 0x80 && *p <= 0x9f) || (*p >= 0xdc && *p <= 0xdf);
}

int lora_msg_encode_control_reply(struct lora_buf *b, const struct lora_msg_control_reply *m,
                                  struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;
    bool has_data = m->data != NULL;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_CONTROL_REPLY, 2 + HAS(m->error) + has_data);
    kv_u64(&e, "id", m->id);
    kv_bool(&e, "ok", m->ok);
    kv_ostr(&e, "error", m->error);
    if (has_data) {
        key(&e, "data");
        if (!is_container(m->data, m->data_len))
            invalid(&e);
        if (!e.error)
            put(&e, lora_buf_add(b, m->data, m->data_len));
    }
    return enc_end(&e);
}

static int control_reply_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_control_reply *o = p;
    const msgpack_object *v;

    if (get_u64(d, m, "id", &o->id) < 0 || get_bool(d, m, "ok", &o->ok) < 0 ||
        opt_str(d, m, "error", &o->error) < 0 || find(d, m, "data", &v) < 0)
        return -1;
    if (!v)
        return 0;
    if (v->type != MSGPACK_OBJECT_MAP && v->type != MSGPACK_OBJECT_ARRAY)
        return FAIL(d, "data", -1, "expected a map or an array");
    const unsigned char *raw;
    size_t raw_len;
    int n;
    top_value(d->body, d->len, "data", &raw, &raw_len, &n);
    if (n != 1)
        return FAIL(d, "data", -1, "not found in the body");
    void *copy = arena_alloc(d->arena, raw_len, 1);
    if (!copy)
        return no_memory(d, "data");
    memcpy(copy, raw, raw_len);
    o->data = copy;
    o->data_len = raw_len;
    return 0;
}
DEFINE_DECODER(control_reply, LORA_MSG_CONTROL_REPLY)

int lora_msg_encode_registry(struct lora_buf *b, const struct lora_msg_registry *m,
                             struct lora_msg_bin *bins, int *n_bins)
{
    struct enc e;

    if (n_bins)
        *n_bins = 0;
    enc_begin(&e, b, LORA_MSG_REGISTRY, 2);
    kv_int(&e, "engine", m->engine);
    kv_array(&e, "adapters", m->n_adapters, m->adapters, LORA_MSG_MAX_ADAPTERS);
    for (int i = 0; i < m->n_adapters && !e.error; i++) {
        map_(&e, 3);
        kv_str(&e, "name", m->adapters[i].name);
        kv_str(&e, "path", m->adapters[i].path);
        kv_u64(&e, "id", m->adapters[i].id);
    }
    return enc_end(&e);
}

static int registry_entry_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_registry_entry *r = p;
    if (get_str(d, m, "name", &r->name) < 0 || get_str(d, m, "path", &r->path) < 0 ||
        get_u64(d, m, "id", &r->id) < 0)
        return -1;
    return 0;
}

static int registry_fields(struct dec *d, const msgpack_object_map *m, void *p)
{
    struct lora_msg_registry *o = p;
    const msgpack_object_array *a;
    void *elems;

    if (get_int(d, m, "engine", 0, INT_MAX, &o->engine) < 0 ||
        get_array(d, m, "adapters", LORA_MSG_MAX_ADAPTERS, &a) < 0)
        return -1;
    if (map_array(d, "adapters", a, sizeof(*o->adapters), registry_entry_fields, &elems) < 0)
        return -1;
    o->adapters = elems;
    o->n_adapters = (int)a->size;
    return 0;
}
DEFINE_DECODER(registry, LORA_MSG_REGISTRY)
