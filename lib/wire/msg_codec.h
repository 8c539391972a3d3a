/* msg_codec: what the files of the codec share, and nothing outside lib/wire includes it (msg.h
 * is the one public header). The codec is split by message family:
 *   msg.c           type names, the arena, the decode and encode primitives below, hello, the
 *                   limits (ready and setup) and the prompt log-probability lists (step_reply
 *                   and output), peek_type, encode_empty;
 *   msg_scan.c      the one reader of msgpack headers: body checks, key lookup, stream framing;
 *   msg_worker.c    engine <-> worker: setup, setup_done, step, step_reply, adapter_op(_reply),
 *                   notifications, residency_reply;
 *   msg_frontend.c  engine <-> frontend and control: request, abort, output, control,
 *                   control_reply, registry, request_stats;
 *   msg_publish.c   the engine's publications: ready, event, stats;
 *   msg_json.c      any body as JSON.
 * Every function here is named lora_msg_*; a family file keeps its own helpers static. */
#ifndef LORA_MSG_CODEC_H
#define LORA_MSG_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "wire/msg.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the codec hands out int32 arrays as little-endian binary frames: little-endian hosts only"
#endif

#define MAX_LIST   LORA_MSG_MAX_ADAPTERS /* notifications, timings, stop token ids */
#define N_NAMES(t) ((int)(sizeof(t) / sizeof((t)[0])))
#define HAS(str)   ((size_t)((str).s != NULL)) /* an optional string, counted in a map's size */

/* Enum values travel as these strings; tables only grow at the end, like the enums. Shared by
 * ready (its start-up loads) and notifications. */
extern const char *const lora_msg_transition_names[4];

/* ---- msg_scan.c: msgpack headers ----------------------------------------------------------- */

#define LORA_MSG_SCAN_MAX_DEPTH  24       /* msgpack nesting; msgpack-c itself stops at 32 */
#define LORA_MSG_SCAN_WHOLE_BODY SIZE_MAX /* a body error about no byte in particular */

/* The header of one msgpack value: hdr bytes of header, then payload bytes of data (str, bin,
 * ext) or children values (array: n, map: 2n). */
struct lora_msg_scan_hdr {
    size_t hdr;
    uint64_t payload;
    uint64_t children;
};

/* Reads the header at p (p < end). Returns 1, 0 when the bytes end inside the header, -1 for
 * the reserved byte 0xc1. */
int lora_msg_scan_header(const unsigned char *p, const unsigned char *end,
                         struct lora_msg_scan_hdr *h);
bool lora_msg_scan_is_str(unsigned char b);
bool lora_msg_scan_is_container(unsigned char b); /* a map or an array */
/* Walks one value at *pp, nested depth deep already, advancing past it. Returns 0, or -1 with
 * a reason in *why and *pp at the value that is wrong. */
int lora_msg_scan_skip(const unsigned char **pp, const unsigned char *end, int depth,
                       const char **why);
/* Checks that body[0..len) is exactly one well-formed value of at most LORA_MSG_MAX_BODY bytes.
 * Returns 0, or -1 with *why and the failing offset *where (LORA_MSG_SCAN_WHOLE_BODY: none). */
int lora_msg_scan_body(const void *body, size_t len, const char **why, size_t *where);
/* Finds key in the top-level map of a body that passed lora_msg_scan_body, without unpacking:
 * *n_found is how often it occurs, *val and *val_len the raw bytes of its first value. */
void lora_msg_scan_find_key(const void *body, size_t len, const char *key,
                            const unsigned char **val, size_t *val_len, int *n_found);

/* ---- msg.c: decoding -------------------------------------------------------------------------
 * Every decoder is lora_msg_decode(type, ...) with the fields function of its type; the
 * getters below look a key up, type it, bound it and copy it into the arena, and on error write
 * "TYPE: PATH.KEY[IDX]: what" and return -1. get_* for required keys, opt_* leave the default
 * when the key is absent. */

#define LORA_MSG_MAX_PATH 160 /* bytes of a nested key path in an error */

struct lora_msg_dec {
    const char *type; /* for errors */
    struct lora_msg_arena *arena;
    const unsigned char *body;
    size_t len;
    const struct lora_msg_bin *bins;
    int n_bins;
    char *err;
    size_t err_len;
    char path[LORA_MSG_MAX_PATH]; /* "seqs[2]" while inside an element, "" at the top */
    size_t path_len;
};

/* n elements of size bytes from the arena, aligned for any type; NULL when out of memory. */
void *lora_msg_arena_alloc(struct lora_msg_arena *a, size_t n, size_t size);

/* Formats "TYPE: PATH.KEY[IDX]: what" into the caller's buffer. idx < 0: none. */
__attribute__((format(printf, 4, 5))) void
lora_msg_dec_fail(struct lora_msg_dec *d, const char *key, long idx, const char *fmt, ...);
/* lora_msg_dec_fail as an expression worth -1, so that the compiler sees every error path
 * return -1. */
#define FAIL(...) (lora_msg_dec_fail(__VA_ARGS__), -1)

/* Enters element idx (or, idx < 0, the map) of key for error paths; returns the mark to leave
 * with. */
size_t lora_msg_dec_path_push(struct lora_msg_dec *d, const char *key, long idx);
void lora_msg_dec_path_pop(struct lora_msg_dec *d, size_t mark);
int lora_msg_dec_no_memory(struct lora_msg_dec *d, const char *key);

/* *v = the value of key, NULL when absent; -1 for a key given twice. need: absent is an error. */
int lora_msg_find(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                  const msgpack_object **v);
int lora_msg_need(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                  const msgpack_object **v);

int lora_msg_as_i64(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    int64_t lo, int64_t hi, int64_t *out);
int lora_msg_as_u64(struct lora_msg_dec *d, const char *key, const msgpack_object *v,
                    uint64_t *out);
int lora_msg_as_f64(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    double *out);
/* A float field: float32, float64 or an integer on the wire; finite values must fit a float. */
int lora_msg_as_f32(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    float *out);
/* A string: at most LORA_MSG_MAX_STR bytes, no NUL; copied NUL-terminated into the arena. */
int lora_msg_as_str(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    struct lora_str *out);
int lora_msg_as_array(struct lora_msg_dec *d, const char *key, const msgpack_object *v,
                      uint64_t max, const msgpack_object_array **out);
int lora_msg_as_map(struct lora_msg_dec *d, const char *key, long idx, const msgpack_object *v,
                    const msgpack_object_map **out);

int lora_msg_get_i64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     int64_t lo, int64_t hi, int64_t *out);
int lora_msg_get_int(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key, int lo,
                     int hi, int *out);
int lora_msg_opt_int(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key, int lo,
                     int hi, int *out, bool *present);
int lora_msg_get_u64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     uint64_t *out);
/* An optional unsigned integer: *out is left as it is when the key is absent. */
int lora_msg_opt_u64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     uint64_t *out);
int lora_msg_get_bool(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                      bool *out);
/* An optional boolean: *out is left as it is when the key is absent. */
int lora_msg_opt_bool(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                      bool *out);
int lora_msg_get_f64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     double *out);
/* An optional float: *out is left as it is when the key is absent. */
int lora_msg_opt_f64(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     double *out);
int lora_msg_get_f32(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     float *out);
int lora_msg_get_str(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     struct lora_str *out);
/* An optional string: absent leaves out->s = NULL. */
int lora_msg_opt_str(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     struct lora_str *out);
int lora_msg_get_enum(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                      const char *const *names, int n_names, int *out);
int lora_msg_get_array(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                       uint64_t max, const msgpack_object_array **out);
int lora_msg_get_map(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                     const msgpack_object_map **out);

/* Typed arrays into the arena: *out = NULL for an empty array. */
int lora_msg_i32_list(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                      const int32_t **out);
int lora_msg_f32_list(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                      const float **out);
int lora_msg_str_list(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                      struct lora_str **out);
/* An optional list of int32 of at most max entries: *out and *n are set only when it is there. */
int lora_msg_opt_i32_list(struct lora_msg_dec *d, const msgpack_object_map *m, const char *key,
                          uint32_t max, const int32_t **out, int *n);
/* Copies binary frame i, which must hold exactly n little-endian int32 values, into the arena.
 * A frame that is not there counts as empty. */
int lora_msg_frame_i32(struct lora_msg_dec *d, int i, const char *count_key, uint64_t n,
                       const int32_t **out);

/* Fields of one element of an array of maps: out is the element to fill. */
typedef int (*lora_msg_elem_fields_fn)(struct lora_msg_dec *d, const msgpack_object_map *m,
                                       void *out);
/* Decodes array a, the value of key, whose elements are maps, into a new arena array of
 * a->size elements of size bytes, each filled by fields; errors name key[i]. */
int lora_msg_map_array(struct lora_msg_dec *d, const char *key, const msgpack_object_array *a,
                       size_t size, lora_msg_elem_fields_fn fields, void **items);

/* "limits" (ready, setup). */
int lora_msg_limits_fields(struct lora_msg_dec *d, const msgpack_object_map *top,
                           struct lora_msg_limits *l);
/* The optional "prompt_ranks" beside "prompt_logprobs" (n values, or absent: NULL), and the
 * optional "prompt_top_n" with "prompt_top_ids" and "prompt_top_logprobs" (n positions of top_n
 * values each; all absent, or all present): step_reply's outs and output. */
int lora_msg_prompt_ranks(struct lora_msg_dec *d, const msgpack_object_map *m, uint32_t n,
                          const int32_t **out);
int lora_msg_prompt_top(struct lora_msg_dec *d, const msgpack_object_map *m, uint32_t n, int *top_n,
                        const int32_t **ids, const float **lps);

/* The common frame of every decoder: unpack, check "type", run the fields, clear the zone. */
typedef int (*lora_msg_fields_fn)(struct lora_msg_dec *d, const msgpack_object_map *m, void *out);
int lora_msg_decode(enum lora_msg_type t, const void *body, size_t len,
                    const struct lora_msg_bin *bins, int n_bins, struct lora_msg_arena *arena,
                    void *out, size_t out_size, lora_msg_fields_fn fields, char *err,
                    size_t err_len);

#define DEFINE_DECODER(name, TYPE)                                                                 \
    int lora_msg_decode_##name(const void *body, size_t len, const struct lora_msg_bin *bins,      \
                               int n_bins, struct lora_msg_arena *arena,                           \
                               struct lora_msg_##name *out, char *err, size_t err_len)             \
    {                                                                                              \
        return lora_msg_decode(TYPE, body, len, bins, n_bins, arena, out, sizeof(*out),            \
                               name##_fields, err, err_len);                                       \
    }

/* ---- msg.c: encoding -------------------------------------------------------------------------
 * An encoder begins with the map's key count, writes every key and value, and ends: the first
 * failure (ENOMEM, or EINVAL for a value its decoder would refuse) sticks, the rest of the calls
 * do nothing, and the end puts the buffer back as it was. */

struct lora_msg_enc {
    msgpack_packer pk;
    struct lora_buf *b;
    size_t start; /* b->len before the message, restored on failure */
    int error;    /* 0, ENOMEM or EINVAL */
};

void lora_msg_enc_begin(struct lora_msg_enc *e, struct lora_buf *b, enum lora_msg_type t,
                        size_t n_keys);
int lora_msg_enc_end(struct lora_msg_enc *e);
void lora_msg_enc_put(struct lora_msg_enc *e, int rc); /* a msgpack_pack_* result */
void lora_msg_enc_invalid(struct lora_msg_enc *e);
void lora_msg_enc_key(struct lora_msg_enc *e, const char *k);
void lora_msg_enc_map(struct lora_msg_enc *e, size_t n);
void lora_msg_enc_str(struct lora_msg_enc *e, struct lora_str s);
void lora_msg_kv_int(struct lora_msg_enc *e, const char *k, int64_t v);
void lora_msg_kv_u64(struct lora_msg_enc *e, const char *k, uint64_t v);
void lora_msg_kv_bool(struct lora_msg_enc *e, const char *k, bool v);
void lora_msg_kv_f32(struct lora_msg_enc *e, const char *k, float v);
void lora_msg_kv_f64(struct lora_msg_enc *e, const char *k, double v);
void lora_msg_kv_str(struct lora_msg_enc *e, const char *k, struct lora_str s);
/* An optional string: the caller counted it in the map size when s.s != NULL. */
void lora_msg_kv_ostr(struct lora_msg_enc *e, const char *k, struct lora_str s);
void lora_msg_kv_enum(struct lora_msg_enc *e, const char *k, const char *const *names, int n_names,
                      int v);
/* Starts array k of n elements; flags a negative count, a missing pointer or n > max. */
void lora_msg_kv_array(struct lora_msg_enc *e, const char *k, long n, const void *ptr, long max);
void lora_msg_kv_i32s(struct lora_msg_enc *e, const char *k, const int32_t *v, long n);
void lora_msg_kv_f32s(struct lora_msg_enc *e, const char *k, const float *v, long n);
void lora_msg_kv_strs(struct lora_msg_enc *e, const char *k, const struct lora_str *v, int n);
/* A binary frame of n int32 values, returned through bins[i]. */
void lora_msg_bin_frame(struct lora_msg_enc *e, struct lora_msg_bin *bins, int i, const int32_t *v,
                        size_t n);
/* "limits" (ready, setup). */
void lora_msg_kv_limits(struct lora_msg_enc *e, const struct lora_msg_limits *l);

#endif
